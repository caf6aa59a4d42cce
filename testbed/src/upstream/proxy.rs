//! The stand-in for the hosts upstream's Azure binaries reach beyond ARM: an HTTP proxy on
//! loopback (`HTTPS_PROXY` and `HTTP_PROXY` name it) that
//!
//! - answers `CONNECT` to Microsoft's AAD hosts (msal-go's instance discovery,
//!   `https://login.microsoftonline.com/common/discovery/instance`, for an authority it does
//!   not know) by terminating TLS with a certificate for those names from a CA of its own
//!   (trusted through `SSL_CERT_DIR`) and forwarding each plain request to the Azure emulator:
//!   the one the request's `authorization_endpoint` names when that is a loopback address (the
//!   emulator is its own AAD authority), else the emulator set with
//!   [`StandIn::set_aad_target`];
//! - forwards plain `GET http://169.254.169.254/…` (the instance metadata service, which
//!   upstream's binaries address by that constant) to the node's own IMDS emulator, chosen by
//!   the proxy user in `HTTP_PROXY` (`http://<node>@127.0.0.1:<port>`, Go's transport sends it
//!   as `Proxy-Authorization`), see [`StandIn::node_env`];
//! - refuses anything else with 502 and records it ([`StandIn::unserved`]): offline, a host
//!   upstream reaches that nothing stands in for is a finding, not a hang.
//!
//! One request per connection (`Connection: close` both ways); every socket has a 30 s
//! deadline; targets are loopback only.

use std::collections::BTreeMap;
use std::io::{BufReader, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream, ToSocketAddrs as _};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName};

use super::UpstreamError;

/// Microsoft's AAD hosts the proxy terminates TLS for (public cloud and its aliases).
pub const AAD_HOSTS: [&str; 4] =
    ["login.microsoftonline.com", "login.windows.net", "login.microsoft.com", "sts.windows.net"];

/// The link-local address of the instance metadata service.
pub const IMDS_HOST: &str = "169.254.169.254";

/// Every socket's deadline.
const DEADLINE: Duration = Duration::from_secs(30);
/// The largest request or response head read.
const MAX_HEAD: usize = 64 * 1024;
/// The largest request body forwarded.
const MAX_BODY: usize = 4 * 1024 * 1024;

fn proxy_err(detail: impl std::fmt::Display) -> UpstreamError {
    UpstreamError::Proxy { detail: detail.to_string() }
}

/// A loopback HTTP(S) endpoint requests are forwarded to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// `https` or `http`.
    pub tls: bool,
    /// The host (a loopback address or `localhost`).
    pub host: String,
    /// The port.
    pub port: u16,
}

impl Target {
    /// A target from a URL (`https://127.0.0.1:8443/...`); only loopback hosts.
    pub fn parse(url: &str) -> Result<Target, UpstreamError> {
        let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err(proxy_err(format!("target {url:?} is not an http(s) URL")));
        };
        let authority = rest.split(['/', '?']).next().unwrap_or_default();
        let (host, port) = split_host_port(authority, if tls { 443 } else { 80 })
            .ok_or_else(|| proxy_err(format!("target {url:?} has no valid host and port")))?;
        if !is_loopback(&host) {
            return Err(proxy_err(format!("target {url:?} is not a loopback address")));
        }
        Ok(Target { tls, host, port })
    }

    fn url(&self) -> String {
        format!("{}://{}:{}", if self.tls { "https" } else { "http" }, self.host, self.port)
    }
}

fn split_host_port(authority: &str, default_port: u16) -> Option<(String, u16)> {
    let authority = authority.rsplit_once('@').map_or(authority, |(_, a)| a);
    if let Some(rest) = authority.strip_prefix('[') {
        let (host, after) = rest.split_once(']')?;
        let port = match after.strip_prefix(':') {
            Some(p) => p.parse().ok()?,
            None if after.is_empty() => default_port,
            None => return None,
        };
        return Some((host.to_string(), port));
    }
    match authority.rsplit_once(':') {
        Some((h, p)) => Some((h.to_string(), p.parse().ok()?)),
        None if !authority.is_empty() => Some((authority.to_string(), default_port)),
        None => None,
    }
}

fn is_loopback(host: &str) -> bool {
    host.eq_ignore_ascii_case("localhost")
        || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// What the proxy shares with its connection threads.
struct Shared {
    server: Arc<rustls::ServerConfig>,
    client: Arc<rustls::ClientConfig>,
    /// Proxy user (a node's name) → that node's IMDS emulator.
    imds: Mutex<BTreeMap<String, Target>>,
    /// The Azure emulator AAD requests go to when their authority is not on loopback.
    aad: Mutex<Option<Target>>,
    /// One line per request served: `<what> -> <target> <status>`.
    served: Mutex<Vec<String>>,
    /// One line per request refused (no stand-in).
    unserved: Mutex<Vec<String>>,
    stop: AtomicBool,
}

/// The running stand-in; stops (and removes its CA directory) when dropped.
pub struct StandIn {
    addr: SocketAddr,
    ca_pem: String,
    ca_dir: PathBuf,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for StandIn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StandIn").field("addr", &self.addr).field("ca_dir", &self.ca_dir).finish()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

/// A CA of the stand-in's own and a serving certificate for [`AAD_HOSTS`] it signed: the CA's
/// PEM, the chain and the key.
fn aad_identity()
-> Result<(String, Vec<CertificateDer<'static>>, PrivateKeyDer<'static>), rcgen::Error> {
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name = DistinguishedName::new();
    ca.distinguished_name.push(DnType::CommonName, "ccm-testbed-upstream-stand-in-ca");
    ca.distinguished_name.push(DnType::OrganizationName, "ccm-testbed");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let issuer = CertifiedIssuer::self_signed(ca, KeyPair::generate()?)?;
    let mut leaf = CertificateParams::new(Vec::<String>::new())?;
    leaf.distinguished_name.push(DnType::CommonName, AAD_HOSTS[0]);
    leaf.subject_alt_names = AAD_HOSTS
        .iter()
        .map(|h| Ok(SanType::DnsName((*h).try_into()?)))
        .collect::<Result<_, rcgen::Error>>()?;
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
    let key = KeyPair::generate()?;
    let cert = leaf.signed_by(&key, &issuer)?;
    let key_der = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
    Ok((issuer.pem(), vec![cert.der().clone()], key_der))
}

impl StandIn {
    /// Starts the proxy on a free loopback port; its CA is written to `dir/upstream-stand-in-ca/`
    /// (the directory `SSL_CERT_DIR` names).
    pub fn start(dir: &Path) -> Result<StandIn, UpstreamError> {
        let (ca_pem, chain, key) =
            aad_identity().map_err(|e| proxy_err(format!("generating its CA: {e}")))?;
        let server = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .and_then(|b| b.with_no_client_auth().with_single_cert(chain, key))
            .map_err(|e| proxy_err(format!("its TLS server configuration: {e}")))?;
        let client = loopback_client_config()
            .map_err(|e| proxy_err(format!("its TLS client configuration: {e}")))?;
        let ca_dir = dir.join("upstream-stand-in-ca");
        std::fs::create_dir_all(&ca_dir)
            .and_then(|()| std::fs::write(ca_dir.join("ca.crt"), &ca_pem))
            .map_err(|source| UpstreamError::Io {
                what: "writing the stand-in's CA",
                path: ca_dir.clone(),
                source,
            })?;
        let listener = TcpListener::bind("127.0.0.1:0")
            .map_err(|e| proxy_err(format!("binding a loopback port: {e}")))?;
        let addr = listener.local_addr().map_err(|e| proxy_err(format!("its address: {e}")))?;
        let shared = Arc::new(Shared {
            server: Arc::new(server),
            client: Arc::new(client),
            imds: Mutex::new(BTreeMap::new()),
            aad: Mutex::new(None),
            served: Mutex::new(Vec::new()),
            unserved: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        });
        let s = shared.clone();
        std::thread::Builder::new()
            .name("upstream-stand-in".into())
            .spawn(move || accept_loop(listener, s))
            .map_err(|e| proxy_err(format!("starting its thread: {e}")))?;
        tracing::info!(%addr, "upstream stand-in proxy listening");
        Ok(StandIn { addr, ca_pem, ca_dir, shared })
    }

    /// The proxy's URL (`http://127.0.0.1:<port>`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The stand-in CA's PEM (what a client trusts for the AAD hosts).
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The directory holding the stand-in CA (`SSL_CERT_DIR`).
    pub fn ca_dir(&self) -> &Path {
        &self.ca_dir
    }

    /// Where AAD requests go when their authority is not on loopback (e.g. `cloud:
    /// AzurePublicCloud`, whose authority is login.microsoftonline.com itself).
    pub fn set_aad_target(&self, emulator_url: &str) -> Result<(), UpstreamError> {
        let t = Target::parse(emulator_url)?;
        *lock(&self.shared.aad) = Some(t);
        Ok(())
    }

    /// The environment of one node's process: `HTTP_PROXY` naming `node` as the proxy user,
    /// its IMDS requests forwarded to `imds_url` (the node's IMDS emulator).
    pub fn node_env(
        &self,
        node: &str,
        imds_url: &str,
    ) -> Result<Vec<(String, String)>, UpstreamError> {
        if node.is_empty() || !node.chars().all(|c| c.is_ascii_alphanumeric() || "-._".contains(c))
        {
            return Err(proxy_err(format!(
                "node name {node:?} cannot be a proxy user (letters, digits, '-', '.', '_')"
            )));
        }
        let t = Target::parse(imds_url)?;
        lock(&self.shared.imds).insert(node.to_string(), t);
        let url = format!("http://{node}@{}", self.addr);
        Ok(vec![("HTTP_PROXY".into(), url.clone()), ("http_proxy".into(), url)])
    }

    /// The requests served so far: `<request> -> <target> <status>`.
    pub fn served(&self) -> Vec<String> {
        lock(&self.shared.served).clone()
    }

    /// The requests refused so far because nothing stands in for their host (each names
    /// method, host and path).
    pub fn unserved(&self) -> Vec<String> {
        lock(&self.shared.unserved).clone()
    }
}

impl Drop for StandIn {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        // Wake the accept loop.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        let _ = std::fs::remove_dir_all(&self.ca_dir);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn accept_loop(listener: TcpListener, shared: Arc<Shared>) {
    for conn in listener.incoming() {
        if shared.stop.load(Ordering::SeqCst) {
            return;
        }
        let Ok(tcp) = conn else { continue };
        let s = shared.clone();
        let spawned =
            std::thread::Builder::new().name("upstream-stand-in-conn".into()).spawn(move || {
                if let Err(e) = handle(tcp, &s) {
                    tracing::warn!("upstream stand-in proxy: {e}");
                }
            });
        if let Err(e) = spawned {
            tracing::warn!("upstream stand-in proxy: starting a connection thread: {e}");
        }
    }
}

/// A request head: method, target (as sent), headers in order.
#[derive(Debug, Clone)]
struct Head {
    method: String,
    target: String,
    headers: Vec<(String, String)>,
}

impl Head {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }
}

fn read_head(r: &mut impl std::io::BufRead) -> Result<Option<Head>, String> {
    let mut lines = Vec::new();
    let mut total = 0;
    loop {
        let mut line = String::new();
        let n = r.read_line(&mut line).map_err(|e| format!("reading a request: {e}"))?;
        if n == 0 {
            return if lines.is_empty() { Ok(None) } else { Err("the request ended early".into()) };
        }
        total += n;
        if total > MAX_HEAD {
            return Err(format!("a request head over {MAX_HEAD} bytes"));
        }
        let line = line.trim_end_matches(['\r', '\n']).to_string();
        if line.is_empty() {
            break;
        }
        lines.push(line);
    }
    let mut it = lines.into_iter();
    let first = it.next().unwrap_or_default();
    let mut parts = first.split_whitespace();
    let (Some(method), Some(target)) = (parts.next(), parts.next()) else {
        return Err(format!("a malformed request line {first:?}"));
    };
    let headers = it
        .filter_map(|l| {
            l.split_once(':').map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        })
        .collect();
    Ok(Some(Head { method: method.to_string(), target: target.to_string(), headers }))
}

fn read_body(r: &mut impl Read, head: &Head) -> Result<Vec<u8>, String> {
    if head.header("transfer-encoding").is_some() {
        return Err(format!(
            "{} {}: chunked request bodies are not forwarded",
            head.method, head.target
        ));
    }
    let len: usize = match head.header("content-length") {
        None => 0,
        Some(v) => v.parse().map_err(|_| format!("a bad Content-Length {v:?}"))?,
    };
    if len > MAX_BODY {
        return Err(format!("a request body of {len} bytes (at most {MAX_BODY})"));
    }
    let mut body = vec![0; len];
    r.read_exact(&mut body).map_err(|e| format!("reading a request body: {e}"))?;
    Ok(body)
}

fn simple_response(status: &str, body: &str) -> Vec<u8> {
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

fn handle(tcp: TcpStream, shared: &Shared) -> Result<(), String> {
    tcp.set_read_timeout(Some(DEADLINE)).map_err(|e| e.to_string())?;
    tcp.set_write_timeout(Some(DEADLINE)).map_err(|e| e.to_string())?;
    let mut r = BufReader::new(tcp);
    let Some(head) = read_head(&mut r)? else { return Ok(()) };
    if head.method.eq_ignore_ascii_case("CONNECT") {
        let (host, _) = split_host_port(&head.target, 443).unwrap_or_default();
        if !AAD_HOSTS.iter().any(|h| h.eq_ignore_ascii_case(&host)) {
            let what = format!("CONNECT {}", head.target);
            lock(&shared.unserved).push(what.clone());
            let msg = format!("ccm-testbed upstream stand-in: nothing stands in for {what}\n");
            return r
                .get_mut()
                .write_all(&simple_response("502 Bad Gateway", &msg))
                .map_err(|e| e.to_string());
        }
        if !r.buffer().is_empty() {
            return Err("the client sent data before the CONNECT was answered".into());
        }
        let mut tcp = r.into_inner();
        tcp.write_all(b"HTTP/1.1 200 Connection established\r\n\r\n").map_err(|e| e.to_string())?;
        let conn =
            rustls::ServerConnection::new(shared.server.clone()).map_err(|e| e.to_string())?;
        let mut tls = BufReader::new(rustls::StreamOwned::new(conn, tcp));
        let Some(inner) = read_head(&mut tls)? else { return Ok(()) };
        let body = read_body(&mut tls, &inner)?;
        let what = format!("{} https://{host}{}", inner.method, inner.target);
        let reply = match aad_target(&inner, shared) {
            Some(t) => forward_logged(shared, &t, &inner, &body, &what),
            None => {
                lock(&shared.unserved).push(what.clone());
                simple_response(
                    "502 Bad Gateway",
                    &format!("ccm-testbed upstream stand-in: no Azure emulator for {what}\n"),
                )
            }
        };
        let stream = tls.get_mut();
        stream.write_all(&reply).map_err(|e| e.to_string())?;
        stream.conn.send_close_notify();
        stream.flush().map_err(|e| e.to_string())?;
        return Ok(());
    }
    let body = read_body(&mut r, &head)?;
    let reply = match head.target.strip_prefix("http://") {
        Some(rest) => {
            let authority = rest.split(['/', '?']).next().unwrap_or_default();
            let path = &rest[authority.len()..];
            let path = if path.is_empty() { "/" } else { path };
            let (host, _) = split_host_port(authority, 80).unwrap_or_default();
            let what = format!("{} {}", head.method, head.target);
            let user = proxy_user(&head);
            let target = if host == IMDS_HOST {
                let routes = lock(&shared.imds);
                user.as_deref().and_then(|u| routes.get(u).cloned())
            } else {
                None
            };
            match target {
                Some(t) => {
                    let inner = Head { target: path.to_string(), ..head.clone() };
                    forward_logged(shared, &t, &inner, &body, &what)
                }
                None => {
                    let who = user.map(|u| format!(" (proxy user {u})")).unwrap_or_default();
                    lock(&shared.unserved).push(format!("{what}{who}"));
                    simple_response(
                        "502 Bad Gateway",
                        &format!(
                            "ccm-testbed upstream stand-in: nothing stands in for {what}{who}\n"
                        ),
                    )
                }
            }
        }
        None => simple_response(
            "400 Bad Request",
            "ccm-testbed upstream stand-in: a proxy request names an absolute http URL\n",
        ),
    };
    r.get_mut().write_all(&reply).map_err(|e| e.to_string())
}

/// The user of a `Proxy-Authorization: Basic …` header.
fn proxy_user(head: &Head) -> Option<String> {
    use base64::Engine as _;
    let v = head.header("proxy-authorization")?;
    let b64 = v.strip_prefix("Basic ").or_else(|| v.strip_prefix("basic "))?;
    let raw = base64::engine::general_purpose::STANDARD.decode(b64.trim()).ok()?;
    let text = String::from_utf8(raw).ok()?;
    Some(text.split_once(':').map_or(text.as_str(), |(u, _)| u).to_string())
}

/// The Azure emulator an AAD request goes to: the loopback authority its
/// `authorization_endpoint` names (instance discovery), else the configured one.
fn aad_target(head: &Head, shared: &Shared) -> Option<Target> {
    let query = head.target.split_once('?').map(|(_, q)| q).unwrap_or_default();
    let named = query.split('&').find_map(|kv| {
        let (k, v) = kv.split_once('=')?;
        (k == "authorization_endpoint").then(|| percent_decode(v))
    });
    if let Some(t) = named.and_then(|u| Target::parse(&u).ok()) {
        return Some(t);
    }
    lock(&shared.aad).clone()
}

fn percent_decode(s: &str) -> String {
    let hex = |b: u8| char::from(b).to_digit(16);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let decoded = match (bytes[i], bytes.get(i + 1), bytes.get(i + 2)) {
            (b'%', Some(&h), Some(&l)) => hex(h).zip(hex(l)).map(|(h, l)| (h * 16 + l) as u8),
            _ => None,
        };
        match (decoded, bytes[i]) {
            (Some(b), _) => {
                out.push(b);
                i += 3;
            }
            (None, b'+') => {
                out.push(b' ');
                i += 1;
            }
            (None, b) => {
                out.push(b);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn forward_logged(shared: &Shared, t: &Target, head: &Head, body: &[u8], what: &str) -> Vec<u8> {
    match forward(&shared.client, t, head, body) {
        Ok(reply) => {
            let status = String::from_utf8_lossy(&reply[..reply.len().min(64)])
                .lines()
                .next()
                .and_then(|l| l.split_whitespace().nth(1).map(str::to_string))
                .unwrap_or_default();
            lock(&shared.served).push(format!("{what} -> {} {status}", t.url()));
            reply
        }
        Err(e) => {
            let line = format!("{what} -> {}: {e}", t.url());
            lock(&shared.unserved).push(line.clone());
            simple_response("502 Bad Gateway", &format!("ccm-testbed upstream stand-in: {line}\n"))
        }
    }
}

/// Sends `head` and `body` to `t` (`Connection: close`, the original `Host` kept: the
/// emulators serve every name on one port) and returns the response, its head saying
/// `Connection: close`.
fn forward(
    client: &Arc<rustls::ClientConfig>,
    t: &Target,
    head: &Head,
    body: &[u8],
) -> Result<Vec<u8>, String> {
    let addr = (t.host.as_str(), t.port)
        .to_socket_addrs()
        .map_err(|e| e.to_string())?
        .next()
        .ok_or_else(|| format!("{} resolves to no address", t.host))?;
    let tcp =
        TcpStream::connect_timeout(&addr, DEADLINE).map_err(|e| format!("connecting: {e}"))?;
    tcp.set_read_timeout(Some(DEADLINE)).map_err(|e| e.to_string())?;
    tcp.set_write_timeout(Some(DEADLINE)).map_err(|e| e.to_string())?;
    let mut req = format!("{} {} HTTP/1.1\r\n", head.method, head.target);
    let mut has_host = false;
    for (k, v) in &head.headers {
        let lk = k.to_ascii_lowercase();
        if lk == "host" {
            has_host = true;
        }
        if matches!(
            lk.as_str(),
            "connection"
                | "keep-alive"
                | "proxy-connection"
                | "proxy-authorization"
                | "content-length"
        ) {
            continue;
        }
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    if !has_host {
        req.push_str(&format!("Host: {}:{}\r\n", t.host, t.port));
    }
    if !body.is_empty() || !matches!(head.method.as_str(), "GET" | "HEAD" | "DELETE" | "OPTIONS") {
        req.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    req.push_str("Connection: close\r\n\r\n");
    let mut reply = Vec::new();
    if t.tls {
        let name = match t.host.parse::<IpAddr>() {
            Ok(ip) => ServerName::IpAddress(ip.into()),
            Err(_) => ServerName::try_from(t.host.clone()).map_err(|e| e.to_string())?,
        };
        let conn =
            rustls::ClientConnection::new(client.clone(), name).map_err(|e| e.to_string())?;
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        tls.write_all(req.as_bytes())
            .and_then(|()| tls.write_all(body))
            .map_err(|e| e.to_string())?;
        tls.flush().map_err(|e| e.to_string())?;
        read_all(&mut tls, &mut reply)?;
    } else {
        let mut tcp = tcp;
        tcp.write_all(req.as_bytes())
            .and_then(|()| tcp.write_all(body))
            .map_err(|e| e.to_string())?;
        read_all(&mut tcp, &mut reply)?;
    }
    Ok(close_connection(reply))
}

/// `GET url` on a loopback emulator (its own certificate accepted, as the proxy does): the
/// status and the body. For reading an emulator's admin API (`/__emulator/…`).
pub fn loopback_get(url: &str) -> Result<(u16, String), UpstreamError> {
    let t = Target::parse(url)?;
    let rest = url.split_once("://").map(|(_, r)| r).unwrap_or_default();
    let path = rest.find('/').map_or("/", |i| &rest[i..]);
    let client = loopback_client_config()
        .map_err(|e| proxy_err(format!("its TLS client configuration: {e}")))?;
    let client = Arc::new(client);
    let head = Head {
        method: "GET".into(),
        target: path.to_string(),
        headers: vec![("Host".into(), format!("{}:{}", t.host, t.port))],
    };
    let reply =
        forward(&client, &t, &head, &[]).map_err(|e| proxy_err(format!("GET {url}: {e}")))?;
    let text = String::from_utf8_lossy(&reply).into_owned();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((text.as_str(), ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| proxy_err(format!("GET {url}: no status line in the reply")))?;
    let chunked = head.to_ascii_lowercase().contains("transfer-encoding: chunked");
    Ok((status, if chunked { dechunk(body) } else { body.to_string() }))
}

/// A chunked body's data.
fn dechunk(body: &str) -> String {
    let mut out = String::new();
    let mut rest = body;
    while let Some((size, after)) = rest.split_once("\r\n") {
        let Ok(n) = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16) else {
            break;
        };
        if n == 0 || after.len() < n {
            break;
        }
        out.push_str(&after[..n]);
        rest = after[n..].trim_start_matches("\r\n");
    }
    out
}

/// Reads to the end; a peer that closes without TLS's close_notify after sending a reply
/// still ends the reply.
fn read_all(r: &mut impl Read, out: &mut Vec<u8>) -> Result<(), String> {
    match r.read_to_end(out) {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof && !out.is_empty() => Ok(()),
        Err(e) => Err(format!("reading the reply: {e}")),
    }
}

/// The reply with its `Connection` header replaced by `Connection: close`.
fn close_connection(reply: Vec<u8>) -> Vec<u8> {
    let Some(end) = reply.windows(4).position(|w| w == b"\r\n\r\n") else { return reply };
    let head = String::from_utf8_lossy(&reply[..end]).into_owned();
    let mut out = String::new();
    for (i, line) in head.split("\r\n").enumerate() {
        if i > 0
            && line
                .split_once(':')
                .is_some_and(|(k, _)| k.trim().eq_ignore_ascii_case("connection"))
        {
            continue;
        }
        out.push_str(line);
        out.push_str("\r\n");
    }
    out.push_str("Connection: close\r\n\r\n");
    let mut bytes = out.into_bytes();
    bytes.extend_from_slice(&reply[end + 4..]);
    bytes
}

/// A TLS client configuration for loopback emulators: accepts any server certificate (each
/// emulator has a CA of its own, or a self-signed certificate as vcsim's, which the binaries
/// under test trust; the caller makes no trust decision for them) but still checks the
/// handshake signatures. Only ever for loopback targets: this stand-in's forwarding and
/// [`loopback_get`], and the emulators' fault proxy towards moto or vcsim
/// (`ccm_emulators::tls::upstream_client_config`).
pub fn loopback_client_config() -> Result<rustls::ClientConfig, rustls::Error> {
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(AnyLoopbackCert(provider())))
        .with_no_client_auth())
}

/// [`loopback_client_config`]'s verifier.
#[derive(Debug)]
struct AnyLoopbackCert(Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for AnyLoopbackCert {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.0.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rustls::pki_types::pem::PemObject as _;

    #[test]
    fn targets_are_loopback_urls_only() {
        assert_eq!(
            Target::parse("https://127.0.0.1:8443/tenant/oauth2/v2.0/authorize").unwrap(),
            Target { tls: true, host: "127.0.0.1".into(), port: 8443 }
        );
        assert_eq!(Target::parse("http://localhost").unwrap().port, 80);
        assert_eq!(Target::parse("https://[::1]:9/").unwrap().host, "::1");
        let e = Target::parse("https://login.microsoftonline.com/x").unwrap_err().to_string();
        assert!(e.contains("not a loopback address"), "{e}");
        assert!(Target::parse("ftp://127.0.0.1").is_err());
    }

    #[test]
    fn the_authority_of_instance_discovery_is_read_from_its_query() {
        let head = Head {
            method: "GET".into(),
            target: "/common/discovery/instance?api-version=1.1&authorization_endpoint=https%3A%2F%2F127.0.0.1%3A4443%2Ftenant%2Foauth2%2Fv2.0%2Fauthorize".into(),
            headers: Vec::new(),
        };
        let shared = test_shared();
        assert_eq!(
            aad_target(&head, &shared),
            Some(Target { tls: true, host: "127.0.0.1".into(), port: 4443 })
        );
        let other = Head {
            target:
                "/common/discovery/instance?authorization_endpoint=https%3A%2F%2Fevil.example%2Ft"
                    .into(),
            ..head
        };
        assert_eq!(aad_target(&other, &shared), None, "a non-loopback authority is never a target");
    }

    #[test]
    fn a_reply_always_says_connection_close() {
        let r = close_connection(
            b"HTTP/1.1 200 OK\r\nconnection: keep-alive\r\nContent-Length: 2\r\n\r\nok".to_vec(),
        );
        assert_eq!(
            String::from_utf8(r).unwrap(),
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok"
        );
    }

    #[test]
    fn the_proxy_user_is_read_from_basic_proxy_authorization() {
        use base64::Engine as _;
        let enc = base64::engine::general_purpose::STANDARD.encode("node-a:");
        let head = Head {
            method: "GET".into(),
            target: "http://169.254.169.254/metadata/instance".into(),
            headers: vec![("Proxy-Authorization".into(), format!("Basic {enc}"))],
        };
        assert_eq!(proxy_user(&head).as_deref(), Some("node-a"));
    }

    /// A plain HTTP server on loopback answering every request with its request line and
    /// Host header in the body; the number of requests it may take.
    fn echo_server(n: usize) -> String {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap();
        std::thread::spawn(move || {
            for conn in l.incoming().take(n) {
                let mut r = BufReader::new(conn.unwrap());
                let head = read_head(&mut r).unwrap().unwrap();
                let body = format!(
                    "{} {} host={} metadata={}",
                    head.method,
                    head.target,
                    head.header("host").unwrap_or_default(),
                    head.header("metadata").unwrap_or_default()
                );
                let reply = format!(
                    "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: keep-alive\r\n\r\n{body}",
                    body.len()
                );
                r.get_mut().write_all(reply.as_bytes()).unwrap();
            }
        });
        format!("http://{addr}")
    }

    fn body_of(reply: &[u8]) -> String {
        let text = String::from_utf8_lossy(reply).into_owned();
        text.split_once("\r\n\r\n").map(|(_, b)| b.to_string()).unwrap_or(text)
    }

    #[test]
    fn aad_over_connect_and_a_node_s_imds_reach_their_emulators_and_other_hosts_are_refused() {
        let dir = std::env::temp_dir().join(crate::unique_name("ccm-stand-in"));
        let stand_in = StandIn::start(&dir).unwrap();
        let aad = echo_server(1);
        let imds = echo_server(1);
        stand_in.set_aad_target(&aad).unwrap();
        let env = stand_in.node_env("node-a", &imds).unwrap();
        assert_eq!(env[0].1, format!("http://node-a@{}", stand_in.addr));

        // CONNECT, then TLS trusting only the stand-in's CA, as Go's transport does.
        let mut tcp = TcpStream::connect(stand_in.addr).unwrap();
        tcp.write_all(b"CONNECT login.microsoftonline.com:443 HTTP/1.1\r\nHost: login.microsoftonline.com:443\r\n\r\n").unwrap();
        let mut established = [0u8; 39];
        tcp.read_exact(&mut established).unwrap();
        assert!(
            established.starts_with(b"HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&established)
        );
        let mut roots = rustls::RootCertStore::empty();
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(stand_in.ca_pem().as_bytes()) {
            roots.add(c.unwrap()).unwrap();
        }
        let config = rustls::ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_root_certificates(roots)
            .with_no_client_auth();
        let name = ServerName::try_from("login.microsoftonline.com").unwrap();
        let conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
        let mut tls = rustls::StreamOwned::new(conn, tcp);
        tls.write_all(b"GET /common/discovery/instance?api-version=1.1 HTTP/1.1\r\nHost: login.microsoftonline.com\r\n\r\n").unwrap();
        let mut reply = Vec::new();
        read_all(&mut tls, &mut reply).unwrap();
        let text = String::from_utf8_lossy(&reply).into_owned();
        assert!(text.starts_with("HTTP/1.1 200") && text.contains("Connection: close"), "{text}");
        assert_eq!(
            body_of(&reply),
            "GET /common/discovery/instance?api-version=1.1 host=login.microsoftonline.com metadata="
        );

        // The node's IMDS request, as Go sends it through HTTP_PROXY with a user.
        use base64::Engine as _;
        let auth = base64::engine::general_purpose::STANDARD.encode("node-a:");
        let mut tcp = TcpStream::connect(stand_in.addr).unwrap();
        tcp.write_all(format!("GET http://169.254.169.254/metadata/instance?api-version=2021-02-01 HTTP/1.1\r\nHost: 169.254.169.254\r\nMetadata: true\r\nProxy-Authorization: Basic {auth}\r\n\r\n").as_bytes()).unwrap();
        let mut reply = Vec::new();
        tcp.read_to_end(&mut reply).unwrap();
        assert_eq!(
            body_of(&reply),
            "GET /metadata/instance?api-version=2021-02-01 host=169.254.169.254 metadata=true"
        );

        // Another node (no route), and another host: 502, recorded.
        let mut tcp = TcpStream::connect(stand_in.addr).unwrap();
        tcp.write_all(b"GET http://169.254.169.254/metadata/instance HTTP/1.1\r\nHost: 169.254.169.254\r\n\r\n").unwrap();
        let mut reply = Vec::new();
        tcp.read_to_end(&mut reply).unwrap();
        assert!(String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 502"));
        let mut tcp = TcpStream::connect(stand_in.addr).unwrap();
        tcp.write_all(b"CONNECT management.azure.com:443 HTTP/1.1\r\n\r\n").unwrap();
        let mut reply = Vec::new();
        tcp.read_to_end(&mut reply).unwrap();
        assert!(String::from_utf8_lossy(&reply).starts_with("HTTP/1.1 502"));
        assert_eq!(
            stand_in.unserved(),
            vec![
                "GET http://169.254.169.254/metadata/instance".to_string(),
                "CONNECT management.azure.com:443".to_string()
            ]
        );
        assert_eq!(stand_in.served().len(), 2, "{:?}", stand_in.served());
        drop(stand_in);
        let _ = std::fs::remove_dir_all(&dir);
    }

    fn test_shared() -> Shared {
        let (_, chain, key) = aad_identity().unwrap();
        Shared {
            server: Arc::new(
                rustls::ServerConfig::builder_with_provider(provider())
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_no_client_auth()
                    .with_single_cert(chain, key)
                    .unwrap(),
            ),
            client: Arc::new(loopback_client_config().unwrap()),
            imds: Mutex::new(BTreeMap::new()),
            aad: Mutex::new(None),
            served: Mutex::new(Vec::new()),
            unserved: Mutex::new(Vec::new()),
            stop: AtomicBool::new(false),
        }
    }
}
