//! HTTPS serving: TLS (from files or self-signed, with the `--tls-*` policy), one hardened
//! HTTP/1.1 server shared by the secure port and the webhook port, `/healthz` checks and
//! `/metrics` (spec §7.4).
//!
//! Hardening (issue #11 point 6), per listener ([`Limits`]):
//! - at most `max_connections` connections at once: past it, new connections wait in the
//!   kernel's accept backlog (bounded) until one ends; nothing is allocated for them here;
//! - the TLS handshake and the request head each have a deadline (`tls_handshake_timeout`,
//!   `header_read_timeout`); the head timeout also ends idle keep-alive connections;
//! - every request passes the `gate` (authentication and authorization on the secure port)
//!   with its head only: a rejected request is answered without reading its body (with
//!   `Expect: 100-continue` the client never sends it) and the connection is closed;
//! - an admitted body is read with a size cap (`max_body_bytes`, 413 past it, checked first
//!   against `Content-Length`), a deadline (`body_read_timeout`, 408) and at most
//!   `max_concurrent_bodies` bodies buffered at once, so buffered bodies never exceed
//!   `max_concurrent_bodies * max_body_bytes` per listener.
//!
//! Certificates (issue #13 point 6): the `--tls-cert-file` pair and every
//! `--tls-sni-cert-key` pair are re-read when their files change (checked at most once a
//! second, on a handshake): new connections get the new certificate, established ones keep
//! theirs. A half-written pair (certificate and key that do not match, or unparsable PEM)
//! keeps the previous certificate and is retried. SNI picks the most specific name: an exact
//! name, then the longest wildcard, else the default certificate. The client's certificate
//! chain (when it sent one and it verified against the configured client CAs) is handed to
//! the gate as a [`PeerCertificates`] request extension.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use http::request::Parts;
use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::sign::CertifiedKey;
use tokio::net::TcpListener;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::tls::TlsPolicy;

/// A response body.
pub type Body = Full<Bytes>;

/// Serving errors (fatal at start).
#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    /// A certificate or key file could not be read.
    #[error("{flag}: cannot load {path:?}: {message}")]
    Pem {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
    /// Building the TLS configuration failed.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// Binding the listener failed.
    #[error("failed to listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Resource limits of one listener (see the module documentation).
#[derive(Debug, Clone)]
pub struct Limits {
    /// Connections served at once; more wait in the kernel's accept backlog.
    pub max_connections: usize,
    /// Largest request body read (413 past it).
    pub max_body_bytes: usize,
    /// Bodies buffered at once.
    pub max_concurrent_bodies: usize,
    /// Deadline of the TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// Deadline for a complete request head (also ends idle keep-alive connections).
    pub header_read_timeout: Duration,
    /// Deadline for reading an admitted body.
    pub body_read_timeout: Duration,
}

impl Limits {
    /// The secure port: `/healthz` and `/metrics` take no body; 64 KiB is plenty for any
    /// request a prober or scraper sends.
    pub const SECURE: Limits = Limits {
        max_connections: 256,
        max_body_bytes: 64 << 10,
        max_concurrent_bodies: 8,
        tls_handshake_timeout: Duration::from_secs(10),
        header_read_timeout: Duration::from_secs(10),
        body_read_timeout: Duration::from_secs(30),
    };

    /// The webhook port: an AdmissionReview carries `object` and `oldObject`, each at most
    /// the apiserver's 3 MiB request limit, plus a little envelope: 7 MiB fits the largest
    /// legitimate review.
    pub const WEBHOOK: Limits = Limits {
        max_connections: 256,
        max_body_bytes: 7 << 20,
        max_concurrent_bodies: 4,
        tls_handshake_timeout: Duration::from_secs(10),
        header_read_timeout: Duration::from_secs(10),
        body_read_timeout: Duration::from_secs(30),
    };
}

/// Builds a TLS server config from PEM files, or a self-signed certificate for `localhost` and
/// `127.0.0.1` when no files are given, with `policy`'s versions, cipher suites, curves and SNI
/// certificates. `flags` names the cert and key flags for messages. Certificates from files are
/// reloaded when the files change.
pub fn tls_config(
    cert_file: &str,
    key_file: &str,
    flags: (&'static str, &'static str),
    policy: &TlsPolicy,
) -> Result<Arc<rustls::ServerConfig>, ServingError> {
    tls_config_with_client_auth(cert_file, key_file, flags, policy, None)
}

/// As [`tls_config`], asking clients for a certificate that `client_auth` verifies (clients
/// without one are still served).
pub fn tls_config_with_client_auth(
    cert_file: &str,
    key_file: &str,
    flags: (&'static str, &'static str),
    policy: &TlsPolicy,
    client_auth: Option<Arc<dyn rustls::server::danger::ClientCertVerifier>>,
) -> Result<Arc<rustls::ServerConfig>, ServingError> {
    let provider = policy.provider();
    let default = if cert_file.is_empty() {
        let ck = rcgen::generate_simple_self_signed(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ])
        .map_err(|e| ServingError::Tls(format!("generating a self-signed certificate: {e}")))?;
        let key = PrivateKeyDer::try_from(ck.signing_key.serialize_der())
            .map_err(|e| ServingError::Tls(format!("self-signed key: {e}")))?;
        let certified = CertifiedKey::from_der(vec![ck.cert.der().clone()], key, &provider)
            .map_err(|e| ServingError::Tls(format!("self-signed certificate: {e}")))?;
        CertSource::Static(Arc::new(certified))
    } else {
        CertSource::File(FileCert::load(cert_file, key_file, flags, provider.clone())?)
    };
    let mut sni = Vec::new();
    for entry in &policy.sni {
        let flag = if flags.0.starts_with("--webhook") {
            "--webhook-tls-sni-cert-key"
        } else {
            "--tls-sni-cert-key"
        };
        let cert =
            FileCert::load(&entry.cert_file, &entry.key_file, (flag, flag), provider.clone())?;
        let names = if entry.names.is_empty() {
            let current = cert.current();
            current.cert.first().map(|c| certificate_names(c.as_ref())).unwrap_or_default()
        } else {
            entry.names.clone()
        };
        sni.push((names, cert));
    }
    let builder = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(policy.versions())
        .map_err(|e| ServingError::Tls(e.to_string()))?;
    let builder = match client_auth {
        Some(v) => builder.with_client_cert_verifier(v),
        None => builder.with_no_client_auth(),
    };
    let mut cfg = builder.with_cert_resolver(Arc::new(Resolver { default, sni }));
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// How often a changed certificate file is noticed, at most.
const RELOAD_CHECK: Duration = Duration::from_secs(1);

/// A certificate and key loaded from files and reloaded when they change.
#[derive(Debug)]
struct FileCert {
    cert_file: String,
    key_file: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
    state: Mutex<FileCertState>,
}

#[derive(Debug)]
struct FileCertState {
    cert_pem: Vec<u8>,
    key_pem: Vec<u8>,
    key: Arc<CertifiedKey>,
    checked: std::time::Instant,
}

fn certified_key(
    cert_pem: &[u8],
    key_pem: &[u8],
    provider: &rustls::crypto::CryptoProvider,
) -> Result<CertifiedKey, (bool, String)> {
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(cert_pem)
        .collect::<Result<_, _>>()
        .map_err(|e| (true, e.to_string()))?;
    if certs.is_empty() {
        return Err((true, "no CERTIFICATE block found".into()));
    }
    let key = PrivateKeyDer::from_pem_slice(key_pem).map_err(|e| (false, e.to_string()))?;
    CertifiedKey::from_der(certs, key, provider)
        .map_err(|e| (false, format!("certificate and key do not match: {e}")))
}

impl FileCert {
    fn load(
        cert_file: &str,
        key_file: &str,
        flags: (&'static str, &'static str),
        provider: Arc<rustls::crypto::CryptoProvider>,
    ) -> Result<FileCert, ServingError> {
        let pem_err = |flag, path: &str, e: &dyn std::fmt::Display| ServingError::Pem {
            flag,
            path: path.to_string(),
            message: e.to_string(),
        };
        let cert_pem =
            std::fs::read(Path::new(cert_file)).map_err(|e| pem_err(flags.0, cert_file, &e))?;
        let key_pem =
            std::fs::read(Path::new(key_file)).map_err(|e| pem_err(flags.1, key_file, &e))?;
        let key = certified_key(&cert_pem, &key_pem, &provider).map_err(|(is_cert, m)| {
            if is_cert { pem_err(flags.0, cert_file, &m) } else { pem_err(flags.1, key_file, &m) }
        })?;
        Ok(FileCert {
            cert_file: cert_file.to_string(),
            key_file: key_file.to_string(),
            provider,
            state: Mutex::new(FileCertState {
                cert_pem,
                key_pem,
                key: Arc::new(key),
                checked: std::time::Instant::now(),
            }),
        })
    }

    /// The current certificate, re-read first when the last check is older than
    /// [`RELOAD_CHECK`].
    fn current(&self) -> Arc<CertifiedKey> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if state.checked.elapsed() < RELOAD_CHECK {
            return state.key.clone();
        }
        state.checked = std::time::Instant::now();
        let (Ok(cert_pem), Ok(key_pem)) =
            (std::fs::read(&self.cert_file), std::fs::read(&self.key_file))
        else {
            tracing::warn!(cert = %self.cert_file, "cannot re-read the serving certificate; keeping the current one");
            return state.key.clone();
        };
        if cert_pem == state.cert_pem && key_pem == state.key_pem {
            return state.key.clone();
        }
        match certified_key(&cert_pem, &key_pem, &self.provider) {
            Ok(key) => {
                tracing::info!(cert = %self.cert_file, "serving certificate reloaded");
                state.key = Arc::new(key);
                state.cert_pem = cert_pem;
                state.key_pem = key_pem;
            }
            Err((_, message)) => {
                tracing::warn!(cert = %self.cert_file, %message, "changed serving certificate not usable (yet); keeping the current one");
            }
        }
        state.key.clone()
    }
}

#[derive(Debug)]
enum CertSource {
    Static(Arc<CertifiedKey>),
    File(FileCert),
}

impl CertSource {
    fn current(&self) -> Arc<CertifiedKey> {
        match self {
            CertSource::Static(k) => k.clone(),
            CertSource::File(f) => f.current(),
        }
    }
}

/// Picks the certificate for a handshake (see the module documentation).
#[derive(Debug)]
struct Resolver {
    default: CertSource,
    sni: Vec<(Vec<String>, FileCert)>,
}

impl Resolver {
    fn pick(&self, server_name: Option<&str>) -> Arc<CertifiedKey> {
        let Some(name) = server_name.map(str::to_ascii_lowercase) else {
            return self.default.current();
        };
        // Exact names first; then the longest matching wildcard (one label, as Go).
        let mut best: Option<(usize, &FileCert)> = None;
        for (names, cert) in &self.sni {
            for pattern in names {
                let score = if *pattern == name {
                    usize::MAX
                } else if let Some(suffix) = pattern.strip_prefix("*.") {
                    match name.split_once('.') {
                        Some((_, rest)) if rest == suffix => suffix.len(),
                        _ => continue,
                    }
                } else {
                    continue;
                };
                if best.is_none_or(|(s, _)| score > s) {
                    best = Some((score, cert));
                }
            }
        }
        match best {
            Some((_, cert)) => cert.current(),
            None => self.default.current(),
        }
    }
}

impl rustls::server::ResolvesServerCert for Resolver {
    fn resolve(&self, hello: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.pick(hello.server_name()))
    }
}

/// The DNS names (SANs, else the CommonName) of a DER certificate, lower-cased.
pub fn certificate_names(der: &[u8]) -> Vec<String> {
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::DNSName(d) = n {
                names.push(d.to_ascii_lowercase());
            }
        }
    }
    if names.is_empty() {
        names.extend(
            cert.subject()
                .iter_common_name()
                .filter_map(|cn| cn.as_str().ok())
                .map(str::to_ascii_lowercase),
        );
    }
    names
}

/// The client's verified certificate chain (end entity first), as a request extension.
#[derive(Debug, Clone)]
pub struct PeerCertificates(pub Arc<Vec<CertificateDer<'static>>>);

/// Binds `addr`.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServingError> {
    TcpListener::bind(addr).await.map_err(|source| ServingError::Bind { addr, source })
}

/// Binds `addr` with SO_REUSEADDR and, with `reuse_port` (`--permit-port-sharing`),
/// SO_REUSEPORT.
pub async fn bind_shared(addr: SocketAddr, reuse_port: bool) -> Result<TcpListener, ServingError> {
    let err = |source| ServingError::Bind { addr, source };
    let socket = if addr.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .map_err(err)?;
    socket.set_reuseaddr(true).map_err(err)?;
    if reuse_port {
        socket.set_reuseport(true).map_err(err)?;
    }
    socket.bind(addr).map_err(err)?;
    socket.listen(1024).map_err(err)
}

/// A gate that admits every request (the webhook port: no authentication, as upstream).
pub fn admit_all(
    parts: Parts,
    _peer: SocketAddr,
) -> futures::future::Ready<Result<Parts, Response<Body>>> {
    futures::future::ready(Ok(parts))
}

/// Serves HTTPS on `listener` until `shutdown` fires. Each request's head goes through `gate`
/// first (`Err` is the response, sent without reading the body); admitted requests are read
/// within `limits` and passed to `handler`.
pub async fn serve<G, GF, H, F>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    limits: Limits,
    gate: G,
    handler: H,
    shutdown: CancellationToken,
) where
    G: Fn(Parts, SocketAddr) -> GF + Clone + Send + Sync + 'static,
    GF: Future<Output = Result<Parts, Response<Body>>> + Send + 'static,
    H: Fn(Request<Bytes>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    let connections = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let bodies = Arc::new(Semaphore::new(limits.max_concurrent_bodies.max(1)));
    let limits = Arc::new(limits);
    loop {
        // A slot first: past the limit, connections stay in the kernel's backlog.
        let permit = tokio::select! {
            _ = shutdown.cancelled() => return,
            p = connections.clone().acquire_owned() => match p {
                Ok(p) => p,
                Err(_) => return,
            },
        };
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    // E.g. out of file descriptors: do not spin.
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let gate = gate.clone();
        let handler = handler.clone();
        let shutdown = shutdown.clone();
        let limits = limits.clone();
        let bodies = bodies.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let tls =
                match tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(stream))
                    .await
                {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                };
            let limits_svc = limits.clone();
            let peer_certs = tls.get_ref().1.peer_certificates().map(|chain| {
                PeerCertificates(Arc::new(chain.iter().map(|c| c.clone().into_owned()).collect()))
            });
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let gate = gate.clone();
                let handler = handler.clone();
                let limits = limits_svc.clone();
                let bodies = bodies.clone();
                let peer_certs = peer_certs.clone();
                async move {
                    let (mut parts, body) = req.into_parts();
                    if let Some(certs) = peer_certs {
                        parts.extensions.insert(certs);
                    }
                    let parts = match gate(parts, peer).await {
                        Ok(p) => p,
                        Err(resp) => return Ok::<_, Infallible>(closing(resp)),
                    };
                    let body = match read_body(&parts, body, &limits, &bodies).await {
                        Ok(b) => b,
                        Err(resp) => return Ok(closing(resp)),
                    };
                    Ok(handler(Request::from_parts(parts, body), peer).await)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .timer(TokioTimer::new())
                .header_read_timeout(limits.header_read_timeout)
                .max_buf_size(64 << 10)
                .serve_connection(TokioIo::new(tls), service);
            futures::pin_mut!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
                }
            }
        });
    }
}

/// Reads an admitted body within the limits.
async fn read_body(
    parts: &Parts,
    body: Incoming,
    limits: &Limits,
    bodies: &Semaphore,
) -> Result<Bytes, Response<Body>> {
    let too_large = || {
        text(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body too large (limit {} bytes)\n", limits.max_body_bytes),
        )
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if declared.is_some_and(|n| n > limits.max_body_bytes as u64) {
        return Err(too_large());
    }
    if declared == Some(0) || hyper::body::Body::is_end_stream(&body) {
        return Ok(Bytes::new());
    }
    let _slot = bodies
        .acquire()
        .await
        .map_err(|_| text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n"))?;
    let collect = http_body_util::Limited::new(body, limits.max_body_bytes).collect();
    match tokio::time::timeout(limits.body_read_timeout, collect).await {
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(e)) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(e)) => {
            Err(text(StatusCode::BAD_REQUEST, format!("error reading request body: {e}\n")))
        }
        Err(_) => Err(text(StatusCode::REQUEST_TIMEOUT, "timed out reading the request body\n")),
    }
}

/// Marks a response sent before (or instead of) reading the whole body: the connection is
/// not reused.
fn closing(mut resp: Response<Body>) -> Response<Body> {
    resp.headers_mut().insert(header::CONNECTION, header::HeaderValue::from_static("close"));
    resp
}

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.into())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut()
        .insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    r
}

/// A JSON response.
pub fn json(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    r
}

/// A named health check.
pub type Check = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The `/healthz` checks (leader election, one ping per started controller).
#[derive(Clone, Default)]
pub struct Health {
    checks: Arc<Mutex<Vec<(String, Check)>>>,
}

impl Health {
    /// Adds (or replaces) a check.
    pub fn add(&self, name: &str, check: Check) {
        let mut checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        checks.retain(|(n, _)| n != name);
        checks.push((name.to_string(), check));
    }

    /// Adds a check that always passes.
    pub fn add_ping(&self, name: &str) {
        self.add(name, Arc::new(|| Ok(())));
    }

    /// Names of the registered checks.
    pub fn names(&self) -> Vec<String> {
        self.checks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Whether `path` is a health endpoint: `/healthz`, `/livez`, `/readyz` or one check under
    /// them.
    pub fn serves(path: &str) -> bool {
        Self::endpoint(path).is_some()
    }

    fn endpoint(path: &str) -> Option<(&'static str, Option<&str>)> {
        ["healthz", "livez", "readyz"].into_iter().find_map(|e| {
            let rest = path.strip_prefix('/')?.strip_prefix(e)?;
            if rest.is_empty() {
                Some((e, None))
            } else {
                rest.strip_prefix('/').map(|name| (e, Some(name)))
            }
        })
    }

    /// Answers `/healthz`, `/livez` and `/readyz` (all checks, including `leaderElection`;
    /// `?verbose`, `?exclude=`) or `/<endpoint>/<name>`.
    pub fn respond(&self, path: &str, query: Option<&str>) -> Response<Body> {
        let checks = self.checks.lock().unwrap_or_else(|p| p.into_inner()).clone();
        let Some((endpoint, single)) = Self::endpoint(path) else {
            return text(StatusCode::NOT_FOUND, "404 page not found\n");
        };
        if let Some(name) = single {
            return match checks.iter().find(|(n, _)| n == name) {
                None => text(StatusCode::NOT_FOUND, "404 page not found\n"),
                Some((_, c)) => match c() {
                    Ok(()) => text(StatusCode::OK, "ok"),
                    Err(_) => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal server error: reason withheld\n",
                    ),
                },
            };
        }
        let mut verbose = false;
        let mut exclude = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "verbose" => verbose = true,
                "exclude" => exclude.extend(v.split(',').map(str::to_string)),
                _ => {}
            }
        }
        let mut lines = String::new();
        let mut failed = false;
        for (name, check) in &checks {
            if exclude.contains(name) {
                lines.push_str(&format!("[+]{name} excluded: ok\n"));
                continue;
            }
            match check() {
                Ok(()) => lines.push_str(&format!("[+]{name} ok\n")),
                Err(reason) => {
                    tracing::info!(check = %name, %reason, "healthz check failed");
                    failed = true;
                    lines.push_str(&format!("[-]{name} failed: reason withheld\n"));
                }
            }
        }
        if failed {
            lines.push_str(&format!("{endpoint} check failed\n"));
            return text(StatusCode::INTERNAL_SERVER_ERROR, lines);
        }
        if verbose {
            lines.push_str(&format!("{endpoint} check passed\n"));
            return text(StatusCode::OK, lines);
        }
        text(StatusCode::OK, "ok")
    }
}

/// Encodes the registry as text (OpenMetrics text, which Prometheus scrapes).
pub fn metrics_response(registry: &Mutex<prometheus_client::registry::Registry>) -> Response<Body> {
    let mut out = String::new();
    let reg = registry.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &reg) {
        return text(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics: {e}\n"));
    }
    let mut r = Response::new(Full::new(Bytes::from(out)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(r: Response<Body>) -> (StatusCode, String) {
        let status = r.status();
        let b = r.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(b.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn healthz_formats_like_the_apiserver() {
        let h = Health::default();
        h.add_ping("cloud-node-controller");
        assert_eq!(body(h.respond("/healthz", None)).await, (StatusCode::OK, "ok".into()));
        let (s, b) = body(h.respond("/healthz", Some("verbose"))).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(b, "[+]cloud-node-controller ok\nhealthz check passed\n");
        h.add("leaderElection", Arc::new(|| Err("lease expired".into())));
        let (s, b) = body(h.respond("/healthz", None)).await;
        assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(b.contains("[-]leaderElection failed: reason withheld\n"), "{b}");
        assert!(!b.contains("lease expired"), "reasons are withheld");
        let (s, _) = body(h.respond("/healthz", Some("exclude=leaderElection"))).await;
        assert_eq!(s, StatusCode::OK);
        let (s, _) = body(h.respond("/healthz/cloud-node-controller", None)).await;
        assert_eq!(s, StatusCode::OK);
        let (s, _) = body(h.respond("/healthz/nope", None)).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
        // /readyz and /livez carry the same checks, leader election included.
        let (s, b) = body(h.respond("/readyz", Some("verbose"))).await;
        assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(b.contains("[-]leaderElection failed") && b.ends_with("readyz check failed\n"));
        let (s, b) = body(h.respond("/livez", Some("exclude=leaderElection&verbose"))).await;
        assert_eq!((s, b.ends_with("livez check passed\n")), (StatusCode::OK, true), "{b}");
        let (s, _) = body(h.respond("/readyz/cloud-node-controller", None)).await;
        assert_eq!(s, StatusCode::OK);
        assert!(Health::serves("/livez") && Health::serves("/readyz/leaderElection"));
        assert!(!Health::serves("/readyzz") && !Health::serves("/metrics"));
    }

    #[tokio::test]
    async fn permit_port_sharing_sets_so_reuseport() {
        let first = bind_shared("127.0.0.1:0".parse().unwrap(), true).await.unwrap();
        let addr = first.local_addr().unwrap();
        let second = bind_shared(addr, true).await;
        assert!(second.is_ok(), "two listeners share the port: {:?}", second.err());
        drop(second);
        let exclusive = bind_shared("127.0.0.1:0".parse().unwrap(), false).await.unwrap();
        let err = bind_shared(exclusive.local_addr().unwrap(), false).await.unwrap_err();
        assert!(err.to_string().contains("failed to listen on"), "{err}");
    }

    #[test]
    fn sni_prefers_exact_names_then_the_longest_wildcard() {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let dir = std::env::temp_dir().join(format!("ccm-sni-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let mut sni = Vec::new();
        for (i, names) in [vec!["*.example.com"], vec!["a.example.com"], vec!["*.b.example.com"]]
            .into_iter()
            .enumerate()
        {
            let ck = rcgen::generate_simple_self_signed(vec![format!("cert{i}.test")]).unwrap();
            let (c, k) = (dir.join(format!("{i}.crt")), dir.join(format!("{i}.key")));
            std::fs::write(&c, ck.cert.pem()).unwrap();
            std::fs::write(&k, ck.signing_key.serialize_pem()).unwrap();
            let cert = FileCert::load(
                c.to_str().unwrap(),
                k.to_str().unwrap(),
                ("--tls-sni-cert-key", "--tls-sni-cert-key"),
                provider.clone(),
            )
            .unwrap();
            assert_eq!(
                certificate_names(cert.current().cert[0].as_ref()),
                vec![format!("cert{i}.test")]
            );
            sni.push((names.into_iter().map(String::from).collect(), cert));
        }
        let default = CertSource::Static(sni[0].1.current());
        let r = Resolver { default, sni };
        let which = |name: Option<&str>| {
            let got = r.pick(name);
            certificate_names(got.cert[0].as_ref())
        };
        assert_eq!(which(Some("A.example.com")), vec!["cert1.test"]);
        assert_eq!(which(Some("x.example.com")), vec!["cert0.test"]);
        assert_eq!(which(Some("x.b.example.com")), vec!["cert2.test"]);
        assert_eq!(which(Some("x.y.example.com")), vec!["cert0.test"], "default");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn self_signed_and_bad_files() {
        let policy = TlsPolicy::default();
        assert!(tls_config("", "", ("--tls-cert-file", "--tls-private-key-file"), &policy).is_ok());
        let err = tls_config(
            "/nonexistent/cert.pem",
            "/nonexistent/key.pem",
            ("--tls-cert-file", "--tls-private-key-file"),
            &policy,
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("--tls-cert-file") && err.contains("/nonexistent/cert.pem"), "{err}");
    }
}
