//! HTTPS serving: TLS (from files or self-signed, with the `--tls-*` policy), one hardened
//! HTTP/1.1 server shared by the secure port and the webhook port, `/healthz` checks and
//! `/metrics` (spec §7.4).
//!
//! Hardening (issue #11 point 6, issue #29 point 4), per listener ([`Limits`]):
//! - connections are accepted as soon as they arrive and counted at once: the accept loop
//!   never waits for capacity, so a probe is never stuck in the kernel's backlog behind idle
//!   connections;
//! - at most `max_connections_per_source` connections per source (an IPv4 address, an IPv6
//!   /64) and `max_connections` in all. Past either cap, room is made by closing the oldest
//!   connection of that source (respectively of any source) that has not completed its TLS
//!   handshake (plain HTTP: not sent a first request), else the oldest one idle between two
//!   requests; a connection whose request is being answered is never closed for a newcomer.
//!   When nothing can be closed, the newcomer is closed instead. Each time the caps bite, a
//!   warning is logged at most once a minute with the counts;
//! - the TLS handshake and the request head each have a deadline (`tls_handshake_timeout`,
//!   `header_read_timeout`); the head timeout also ends idle keep-alive connections;
//! - every request passes the `gate` (authentication and authorization on the secure port)
//!   with its head only: a rejected request is answered without reading its body (with
//!   `Expect: 100-continue` the client never sends it) and the connection is closed;
//! - an admitted body is read with a size cap (`max_body_bytes`, 413 past it, checked first
//!   against `Content-Length`), a deadline (`body_read_timeout`, 408, waiting for a body slot
//!   included) and at most `max_concurrent_bodies` bodies buffered at once, so buffered bodies
//!   never exceed `max_concurrent_bodies * max_body_bytes` per listener.
//!
//! The same server without TLS ([`serve_plain`]) answers the health-only listener
//! (`--healthz-bind-address`).
//!
//! Certificates (issue #13 point 6): the `--tls-cert-file` pair and every
//! `--tls-sni-cert-key` pair are re-read when their files change (checked at most once a
//! second, on a handshake): new connections get the new certificate, established ones keep
//! theirs. A half-written pair (certificate and key that do not match, or unparsable PEM)
//! keeps the previous certificate and is retried. SNI picks the most specific name: an exact
//! name, then the longest wildcard, else the default certificate. The client's certificate
//! chain (when it sent one and it verified against the configured client CAs) is handed to
//! the gate as a [`PeerCertificates`] request extension.

use std::collections::{BTreeMap, HashMap};
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

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
    /// Connections held at once, all sources together.
    pub max_connections: usize,
    /// Connections held at once from one source (an IPv4 address, an IPv6 /64).
    pub max_connections_per_source: usize,
    /// Largest request body read (413 past it).
    pub max_body_bytes: usize,
    /// Bodies buffered at once.
    pub max_concurrent_bodies: usize,
    /// Deadline of the TLS handshake.
    pub tls_handshake_timeout: Duration,
    /// Deadline for a complete request head (also ends idle keep-alive connections).
    pub header_read_timeout: Duration,
    /// Deadline for reading an admitted body (waiting for a body slot included).
    pub body_read_timeout: Duration,
}

impl Limits {
    /// The secure port: `/healthz` and `/metrics` take no body; 64 KiB is plenty for any
    /// request a prober or scraper sends. A prober or scraper holds a few connections (a
    /// client sending 40 requests in parallel still fits): 64 per source, while 4096 in all (a
    /// few MiB) lets one source's flood never crowd out the others. A handshake takes
    /// milliseconds; 3 s is generous.
    pub const SECURE: Limits = Limits {
        max_connections: 4096,
        max_connections_per_source: 64,
        max_body_bytes: 64 << 10,
        max_concurrent_bodies: 8,
        tls_handshake_timeout: Duration::from_secs(3),
        header_read_timeout: Duration::from_secs(10),
        body_read_timeout: Duration::from_secs(30),
    };

    /// The webhook port: an AdmissionReview carries `object` and `oldObject`, each at most
    /// the apiserver's 3 MiB request limit, plus a little envelope: 7 MiB fits the largest
    /// legitimate review. Its one real client, the apiserver, may hold many connections from
    /// one address under load: 256 per source.
    pub const WEBHOOK: Limits = Limits {
        max_connections: 4096,
        max_connections_per_source: 256,
        max_body_bytes: 7 << 20,
        max_concurrent_bodies: 4,
        tls_handshake_timeout: Duration::from_secs(3),
        header_read_timeout: Duration::from_secs(10),
        body_read_timeout: Duration::from_secs(30),
    };

    /// The health-only listener (`--healthz-bind-address`, plain HTTP, meant for the node's
    /// kubelet on loopback): GET only, no bodies, a probe sends its request at once.
    pub const HEALTHZ: Limits = Limits {
        max_connections: 64,
        max_connections_per_source: 64,
        max_body_bytes: 0,
        max_concurrent_bodies: 1,
        tls_handshake_timeout: Duration::from_secs(3),
        header_read_timeout: Duration::from_secs(3),
        body_read_timeout: Duration::from_secs(3),
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

/// What a connection is doing, for eviction (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Accepted; TLS handshake (plain HTTP: first request head) not completed yet.
    Opening,
    /// Between requests (or reading a request body, which the peer controls).
    Idle,
    /// A request is being authorized or answered.
    Busy,
}

#[derive(Debug)]
struct Held {
    source: IpAddr,
    phase: Phase,
    evict: CancellationToken,
}

/// The connections of one listener, oldest first (ids only grow).
#[derive(Debug)]
struct ConnTable {
    max_total: usize,
    max_per_source: usize,
    next_id: u64,
    held: BTreeMap<u64, Held>,
    per_source: HashMap<IpAddr, usize>,
    /// Closed for a newcomer / newcomers closed, since the last warning.
    evicted: u64,
    refused: u64,
    last_warning: Option<Instant>,
}

/// How often, at most, the caps biting is logged.
const CAP_WARNING_EVERY: Duration = Duration::from_secs(60);

/// The per-source key: an IPv4 address (IPv4-mapped IPv6 included) or an IPv6 /64, the
/// smallest block an IPv6 host is usually given.
fn source_key(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(v4) => IpAddr::V4(v4),
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => {
                let s = v6.segments();
                IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
            }
        },
    }
}

impl ConnTable {
    fn new(limits: &Limits) -> Self {
        ConnTable {
            max_total: limits.max_connections.max(1),
            max_per_source: limits.max_connections_per_source.max(1),
            next_id: 0,
            held: BTreeMap::new(),
            per_source: HashMap::new(),
            evicted: 0,
            refused: 0,
            last_warning: None,
        }
    }

    /// Counts a new connection from `source`, making room first when a cap is reached;
    /// `None`: nothing could be closed, the newcomer is refused.
    fn admit(&mut self, source: IpAddr) -> Option<(u64, CancellationToken)> {
        let source = source_key(source);
        let admitted = (self.per_source.get(&source).copied().unwrap_or(0) < self.max_per_source
            || self.evict_one(Some(source)))
            && (self.held.len() < self.max_total || self.evict_one(None));
        if !admitted {
            self.refused += 1;
            return None;
        }
        let id = self.next_id;
        self.next_id += 1;
        let evict = CancellationToken::new();
        self.held.insert(id, Held { source, phase: Phase::Opening, evict: evict.clone() });
        *self.per_source.entry(source).or_insert(0) += 1;
        Some((id, evict))
    }

    /// Closes the oldest opening connection (of `source`, when given), else the oldest idle
    /// one; never a busy one. Whether one was closed.
    fn evict_one(&mut self, source: Option<IpAddr>) -> bool {
        let pick = |phase: Phase| {
            self.held
                .iter()
                .find(|(_, h)| h.phase == phase && source.is_none_or(|s| s == h.source))
                .map(|(id, _)| *id)
        };
        let Some(id) = pick(Phase::Opening).or_else(|| pick(Phase::Idle)) else {
            return false;
        };
        if let Some(h) = self.remove(id) {
            h.evict.cancel();
        }
        self.evicted += 1;
        true
    }

    fn remove(&mut self, id: u64) -> Option<Held> {
        let held = self.held.remove(&id)?;
        if let Some(n) = self.per_source.get_mut(&held.source) {
            *n -= 1;
            if *n == 0 {
                self.per_source.remove(&held.source);
            }
        }
        Some(held)
    }

    fn set_phase(&mut self, id: u64, phase: Phase) {
        if let Some(h) = self.held.get_mut(&id) {
            h.phase = phase;
        }
    }

    /// The counts to warn about, at most once per [`CAP_WARNING_EVERY`].
    fn warning_due(&mut self) -> Option<(u64, u64, usize, usize)> {
        if self.evicted == 0 && self.refused == 0 {
            return None;
        }
        if self.last_warning.is_some_and(|t| t.elapsed() < CAP_WARNING_EVERY) {
            return None;
        }
        self.last_warning = Some(Instant::now());
        let counts = (self.evicted, self.refused, self.held.len(), self.per_source.len());
        (self.evicted, self.refused) = (0, 0);
        Some(counts)
    }
}

/// One connection's entry in the table: phase updates, and removal when dropped.
#[derive(Clone)]
struct ConnHandle {
    table: Arc<Mutex<ConnTable>>,
    id: u64,
}

impl ConnHandle {
    fn set_phase(&self, phase: Phase) {
        self.table.lock().unwrap_or_else(|p| p.into_inner()).set_phase(self.id, phase);
    }
}

/// Removes the connection from the table when its task ends (however it ends).
struct ConnGuard(ConnHandle);

impl Drop for ConnGuard {
    fn drop(&mut self) {
        self.0.table.lock().unwrap_or_else(|p| p.into_inner()).remove(self.0.id);
    }
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
    serve_with(listener, Some(acceptor), limits, gate, handler, shutdown).await
}

/// [`serve`] over plain HTTP (the health-only listener).
pub async fn serve_plain<G, GF, H, F>(
    listener: TcpListener,
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
    serve_with(listener, None, limits, gate, handler, shutdown).await
}

/// Whether an accept error means the process (or system) is out of file descriptors
/// (EMFILE, ENFILE).
fn out_of_descriptors(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(23 | 24))
}

async fn serve_with<G, GF, H, F>(
    listener: TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
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
    let table = Arc::new(Mutex::new(ConnTable::new(&limits)));
    let bodies = Arc::new(Semaphore::new(limits.max_concurrent_bodies.max(1)));
    let limits = Arc::new(limits);
    let local = listener.local_addr().ok();
    loop {
        // Never wait for capacity: accept, count, and make room (or refuse) at once.
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    if out_of_descriptors(&e) {
                        // Free a descriptor held by a connection that is still opening.
                        let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
                        t.evict_one(None);
                    }
                    // Do not spin.
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let admitted = {
            let mut t = table.lock().unwrap_or_else(|p| p.into_inner());
            let admitted = t.admit(peer.ip());
            if let Some((evicted, refused, held, sources)) = t.warning_due() {
                tracing::warn!(
                    listener = ?local,
                    evicted,
                    refused,
                    held,
                    sources,
                    per_source_cap = limits.max_connections_per_source,
                    cap = limits.max_connections,
                    "connection caps reached: closed connections that had not completed a handshake (or were idle) and refused newcomers when nothing could be closed (counts since the last warning)"
                );
            }
            admitted
        };
        let Some((id, evict)) = admitted else {
            tracing::debug!(%peer, "connection refused: caps reached and every connection busy");
            drop(stream);
            continue;
        };
        let conn = ConnHandle { table: table.clone(), id };
        let acceptor = acceptor.clone();
        let gate = gate.clone();
        let handler = handler.clone();
        let shutdown = shutdown.clone();
        let limits = limits.clone();
        let bodies = bodies.clone();
        tokio::spawn(async move {
            let _guard = ConnGuard(conn.clone());
            let Some(acceptor) = acceptor else {
                let io = TokioIo::new(stream);
                let parts = ConnParts { conn, peer, peer_certs: None, limits, bodies };
                let served = serve_connection(io, parts, gate, handler, shutdown.clone());
                tokio::select! {
                    _ = served => {}
                    _ = evict.cancelled() => tracing::debug!(%peer, "connection closed for a newcomer"),
                }
                return;
            };
            let handshake =
                tokio::time::timeout(limits.tls_handshake_timeout, acceptor.accept(stream));
            let tls = tokio::select! {
                r = handshake => match r {
                    Ok(Ok(s)) => s,
                    Ok(Err(e)) => {
                        tracing::debug!(%peer, error = %e, "TLS handshake failed");
                        return;
                    }
                    Err(_) => {
                        tracing::debug!(%peer, "TLS handshake timed out");
                        return;
                    }
                },
                _ = evict.cancelled() => {
                    tracing::debug!(%peer, "connection closed during its TLS handshake for a newcomer");
                    return;
                }
            };
            conn.set_phase(Phase::Idle);
            let peer_certs = tls.get_ref().1.peer_certificates().map(|chain| {
                PeerCertificates(Arc::new(chain.iter().map(|c| c.clone().into_owned()).collect()))
            });
            let parts = ConnParts { conn, peer, peer_certs, limits, bodies };
            let served = serve_connection(TokioIo::new(tls), parts, gate, handler, shutdown);
            tokio::select! {
                _ = served => {}
                _ = evict.cancelled() => tracing::debug!(%peer, "idle connection closed for a newcomer"),
            }
        });
    }
}

/// What a connection's requests need besides the gate and the handler.
struct ConnParts {
    conn: ConnHandle,
    peer: SocketAddr,
    peer_certs: Option<PeerCertificates>,
    limits: Arc<Limits>,
    bodies: Arc<Semaphore>,
}

/// Serves HTTP/1.1 on one connection (after its TLS handshake) until it ends or `shutdown`.
async fn serve_connection<IO, G, GF, H, F>(
    io: IO,
    parts: ConnParts,
    gate: G,
    handler: H,
    shutdown: CancellationToken,
) where
    IO: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    G: Fn(Parts, SocketAddr) -> GF + Clone + Send + Sync + 'static,
    GF: Future<Output = Result<Parts, Response<Body>>> + Send + 'static,
    H: Fn(Request<Bytes>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let ConnParts { conn, peer, peer_certs, limits, bodies } = parts;
    let header_read_timeout = limits.header_read_timeout;
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let gate = gate.clone();
        let handler = handler.clone();
        let limits = limits.clone();
        let bodies = bodies.clone();
        let peer_certs = peer_certs.clone();
        let conn = conn.clone();
        async move {
            // A complete head: the peer is a client (its body, which it controls, is read
            // while evictable).
            conn.set_phase(Phase::Busy);
            let (mut parts, body) = req.into_parts();
            if let Some(certs) = peer_certs {
                parts.extensions.insert(certs);
            }
            let parts = match gate(parts, peer).await {
                Ok(p) => p,
                Err(resp) => {
                    conn.set_phase(Phase::Idle);
                    return Ok::<_, Infallible>(closing(resp));
                }
            };
            conn.set_phase(Phase::Idle);
            let body = match read_body(&parts, body, &limits, &bodies).await {
                Ok(b) => b,
                Err(resp) => return Ok(closing(resp)),
            };
            conn.set_phase(Phase::Busy);
            let resp = handler(Request::from_parts(parts, body), peer).await;
            conn.set_phase(Phase::Idle);
            Ok(resp)
        }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(header_read_timeout)
        .max_buf_size(64 << 10)
        .serve_connection(io, service);
    futures::pin_mut!(conn);
    tokio::select! {
        _ = conn.as_mut() => {}
        _ = shutdown.cancelled() => {
            conn.as_mut().graceful_shutdown();
            let _ = tokio::time::timeout(Duration::from_secs(2), conn).await;
        }
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
    let read = async {
        let _slot = bodies.acquire().await.map_err(|_| None)?;
        http_body_util::Limited::new(body, limits.max_body_bytes).collect().await.map_err(Some)
    };
    match tokio::time::timeout(limits.body_read_timeout, read).await {
        Ok(Ok(b)) => Ok(b.to_bytes()),
        Ok(Err(None)) => Err(text(StatusCode::SERVICE_UNAVAILABLE, "shutting down\n")),
        Ok(Err(Some(e))) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Ok(Err(Some(e))) => {
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

    fn small(total: usize, per_source: usize) -> ConnTable {
        ConnTable::new(&Limits {
            max_connections: total,
            max_connections_per_source: per_source,
            ..Limits::SECURE
        })
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn past_the_per_source_cap_the_sources_oldest_opening_connection_makes_room() {
        let mut t = small(100, 3);
        let a: Vec<_> = (0..3).map(|_| t.admit(ip("10.0.0.1")).unwrap()).collect();
        let b = t.admit(ip("10.0.0.2")).unwrap();
        // a[0] completed its handshake: a[1] is the oldest still opening.
        t.set_phase(a[0].0, Phase::Idle);
        let a3 = t.admit(ip("10.0.0.1")).expect("room is made");
        assert!(a[1].1.is_cancelled() && !a[0].1.is_cancelled() && !a[2].1.is_cancelled());
        assert!(!b.1.is_cancelled(), "another source is never touched by this cap");
        // Only handshaked ones left to choose from: the oldest idle goes, a busy one never.
        t.set_phase(a[2].0, Phase::Busy);
        t.set_phase(a3.0, Phase::Busy);
        t.admit(ip("10.0.0.1")).expect("room is made from an idle connection");
        assert!(a[0].1.is_cancelled(), "the idle one went");
        let last = t.held.keys().last().copied().unwrap();
        t.set_phase(last, Phase::Busy);
        assert!(t.admit(ip("10.0.0.1")).is_none(), "every connection busy: refused");
        assert_eq!(t.per_source.get(&ip("10.0.0.1")), Some(&3));
        assert_eq!(t.held.len(), 4);
        assert_eq!(t.warning_due(), Some((2, 1, 4, 2)));
        assert_eq!(t.warning_due(), None, "at most once a minute");
    }

    #[test]
    fn past_the_global_cap_the_oldest_opening_connection_of_any_source_makes_room() {
        let mut t = small(4, 3);
        let first = t.admit(ip("10.0.0.1")).unwrap();
        t.set_phase(first.0, Phase::Busy);
        let rest: Vec<_> = (2..5).map(|i| t.admit(ip(&format!("10.0.0.{i}"))).unwrap()).collect();
        t.set_phase(rest[0].0, Phase::Idle);
        let new = t.admit(ip("10.0.0.9")).expect("room is made");
        assert!(!first.1.is_cancelled() && !rest[0].1.is_cancelled());
        assert!(rest[1].1.is_cancelled(), "the oldest opening connection went");
        assert_eq!(t.held.len(), 4);
        assert_eq!(t.per_source.get(&ip("10.0.0.3")), None, "its source is forgotten");
        // A connection that ends on its own frees its place.
        t.remove(new.0);
        assert_eq!((t.held.len(), t.per_source.get(&ip("10.0.0.9"))), (3, None));
    }

    #[test]
    fn ipv6_sources_are_counted_per_64_and_mapped_ipv4_as_ipv4() {
        assert_eq!(source_key(ip("2001:db8:1:2:aaaa::1")), ip("2001:db8:1:2::"));
        assert_eq!(source_key(ip("2001:db8:1:2:bbbb::7")), ip("2001:db8:1:2::"));
        assert_eq!(source_key(ip("::ffff:10.1.2.3")), ip("10.1.2.3"));
        let mut t = small(100, 2);
        t.admit(ip("2001:db8::1")).unwrap();
        t.admit(ip("2001:db8::2")).unwrap();
        t.admit(ip("2001:db8::3")).unwrap();
        assert_eq!(t.per_source.get(&ip("2001:db8::")), Some(&2), "one /64, one cap");
    }

    /// `GET /healthz` over plain HTTP from `source`: the status line, or why not.
    async fn probe(port: u16, source: &str) -> Result<String, String> {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let go = async {
            let socket = tokio::net::TcpSocket::new_v4().map_err(|e| e.to_string())?;
            socket.bind(format!("{source}:0").parse().unwrap()).map_err(|e| e.to_string())?;
            let mut s = socket
                .connect(([127, 0, 0, 1], port).into())
                .await
                .map_err(|e| format!("connect: {e}"))?;
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .map_err(|e| format!("write: {e}"))?;
            let mut out = Vec::new();
            s.read_to_end(&mut out).await.map_err(|e| format!("read: {e}"))?;
            let text = String::from_utf8_lossy(&out).to_string();
            Ok(text.lines().next().unwrap_or_default().to_string())
        };
        tokio::time::timeout(Duration::from_secs(20), go)
            .await
            .unwrap_or_else(|_| Err("timed out".into()))
    }

    /// Idle connections far past both caps, from the prober's own source and from others:
    /// the accept loop keeps accepting, the idle ones make room, and every probe is answered.
    #[tokio::test]
    async fn idle_connections_past_the_caps_never_keep_a_probe_out() {
        let listener = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let limits =
            Limits { max_connections: 16, max_connections_per_source: 4, ..Limits::HEALTHZ };
        let health = Health::default();
        let stop = CancellationToken::new();
        let _stop = stop.clone().drop_guard();
        tokio::spawn(serve_plain(
            listener,
            limits,
            admit_all,
            move |req: Request<Bytes>, _| {
                futures::future::ready(health.respond(req.uri().path(), None))
            },
            stop,
        ));
        let mut idle = Vec::new();
        for i in 0..200 {
            let source = format!("127.0.0.{}", 1 + i % 10);
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind(format!("{source}:0").parse().unwrap()).unwrap();
            idle.push(socket.connect(([127, 0, 0, 1], port).into()).await.unwrap());
        }
        // Let the server take them all in (it does at once; this is generous).
        tokio::time::sleep(Duration::from_millis(500)).await;
        for source in ["127.0.0.1", "127.0.0.5", "127.0.0.200"] {
            for _ in 0..3 {
                assert_eq!(probe(port, source).await.as_deref(), Ok("HTTP/1.1 200 OK"), "{source}");
            }
        }
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
