//! The shared HTTP(S) server of every emulator and of the fault proxy: loopback listener
//! (plain HTTP, or HTTPS with a certificate from the testbed's CA), the admin API under
//! `/__emulator/`, fault injection, pause/resume, counters and the request log.
//!
//! A cloud plugs in through the [`Cloud`] trait: it names each call's operation, formats its
//! own error bodies, and serves the calls that pass the faults.
//!
//! ```text
//!  client ──▶ listener ──▶ /__emulator/…  ──▶ admin API (faults, pause, counters, state,
//!                      │                        timing, operation-failures)
//!                      └─▶ anything else ──▶ Cloud::operation ─▶ count ─▶ pause? ─▶ fault?
//!                                              ─▶ Cloud::serve (emulator / proxy upstream),
//!                                                 with the server's OpControls current
//! ```
//!
//! The server's [`OpControls`] (timing profile, armed operation failures) are current while
//! `Cloud::serve` runs, so the cloud's `AsyncOps::start` calls follow them.

use std::collections::VecDeque;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::sync::watch;

use crate::admin::{Counters, PREFIX, PauseMode, RequestRecord};
use crate::asyncop::{OpControls, OperationFailure, TimingReport, TimingSelection};
use crate::faults::{Fault, FaultRule, FaultSet};
use crate::tls::TlsIdentity;

/// Any error inside a body or a connection.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every response the kit sends.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A future serving one call.
pub type ServeFuture = Pin<Box<dyn Future<Output = Result<Response<Body>, Dropped>> + Send>>;

/// A full body from bytes.
pub fn full(b: impl Into<Bytes>) -> Body {
    Full::new(b.into()).map_err(|never| match never {}).boxed_unsync()
}

/// A JSON response.
pub fn json_response(status: StatusCode, v: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

/// A call ends by closing its connection without an answer (a `drop` fault, a released
/// hang, or an unreachable upstream behind the proxy).
#[derive(Debug, thiserror::Error)]
#[error("connection closed without an answer: {0}")]
pub struct Dropped(pub String);

/// Why the kit answers with an error instead of serving the call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// A `status` fault with this HTTP status.
    Status(u16),
    /// A `throttle` fault: the cloud's throttling error (the kit adds `Retry-After`).
    Throttle,
    /// A paused emulator in `fail` mode: the cloud's "service unavailable".
    Unavailable,
}

/// An error answer in the cloud's own shape.
#[derive(Debug, Clone)]
pub struct ErrorReply {
    /// The HTTP status.
    pub status: u16,
    /// The `Content-Type`.
    pub content_type: &'static str,
    /// The body.
    pub body: String,
}

/// One cloud's part of an emulator: everything but the kit's server, faults and counters.
pub trait Cloud: Send + Sync + 'static {
    /// A short name for logs and state, e.g. `proxy aws-query`.
    fn name(&self) -> String;

    /// The cloud's operation name of a call, e.g. `ec2:DescribeInstances`. The request body
    /// is complete (cloud API requests are small).
    fn operation(&self, head: &http::request::Parts, body: &Bytes) -> String;

    /// The cloud's error answer for an injected fault on `op`.
    fn error(&self, head: &http::request::Parts, op: &str, kind: ErrorKind) -> ErrorReply;

    /// Serves a call that passed the faults.
    fn serve(&self, op: String, req: Request<Bytes>) -> ServeFuture;

    /// Forgets the cloud's state (an emulator reloads its world). Called by `reset`.
    fn reset(&self) {}

    /// The cloud's state as JSON (`GET /__emulator/state`, under `"cloud"`).
    fn state(&self) -> serde_json::Value {
        serde_json::Value::Null
    }

    /// The cloud's long-running operations, when it has any: `GET /__emulator/timing` then
    /// reports their `fast` and `realistic` tables (a cloud with async operations returns
    /// `Some(&self.ops)`). Failures and timing selection work without it.
    fn async_ops(&self) -> Option<&crate::asyncop::AsyncOps> {
        None
    }
}

/// How many request-log entries are kept.
const LOG_CAPACITY: usize = 2000;

/// How long a paused-in-hang-mode or a `hang`-faulted call waits at most before its
/// connection is closed (a bound so a forgotten fault cannot keep tasks forever).
const HANG_LIMIT: Duration = Duration::from_secs(3600);

struct Shared {
    cloud: Arc<dyn Cloud>,
    faults: Mutex<FaultSet>,
    counters: Mutex<Counters>,
    log: Mutex<VecDeque<RequestRecord>>,
    /// The pause mode (None: serving).
    pause: watch::Sender<Option<PauseMode>>,
    /// Bumped by `DELETE faults` and `reset`: releases hung calls.
    epoch: watch::Sender<u64>,
    /// Timing profile and armed operation failures of the cloud's long-running operations.
    controls: Arc<OpControls>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Options of [`Server::start`].
#[derive(Debug, Clone)]
pub struct ServerOptions {
    /// Where to listen (default `127.0.0.1:0`: a free loopback port).
    pub listen: SocketAddr,
    /// Serve HTTPS with a fresh certificate from the testbed's CA.
    pub tls: bool,
    /// The timing profile of long-running operations at start and after `reset` (default
    /// `fast`, scale 1; a world file's `timing:` key).
    pub timing: TimingSelection,
}

impl Default for ServerOptions {
    fn default() -> Self {
        ServerOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: false,
            timing: TimingSelection::default(),
        }
    }
}

/// Starting a server failed.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    /// Binding the listener failed.
    #[error("listening on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// Why.
        source: std::io::Error,
    },
    /// Making the TLS identity failed.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The admin client could not be built.
    #[error(transparent)]
    Admin(#[from] crate::admin::AdminError),
    /// The timing selection is invalid.
    #[error("timing: {0}")]
    Timing(String),
}

/// A running emulator server; stopped (listener and every connection) when dropped.
pub struct Server {
    addr: SocketAddr,
    tls: Option<TlsIdentity>,
    shared: Arc<Shared>,
    admin: crate::admin::Admin,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server").field("url", &self.url()).finish_non_exhaustive()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Server {
    /// Starts serving `cloud`. Must be called inside a Tokio runtime.
    pub async fn start(cloud: Arc<dyn Cloud>, opts: ServerOptions) -> Result<Server, ServerError> {
        opts.timing.validate().map_err(ServerError::Timing)?;
        let tls = if opts.tls { Some(TlsIdentity::generate()?) } else { None };
        Self::start_inner(cloud, opts, tls).await
    }

    /// Starts serving `cloud` over HTTPS with `tls` (whatever `opts.tls` says), e.g. an
    /// identity from [`TlsIdentity::generate_requiring_client_certs`]: then every client must
    /// present a certificate of its client CA, and [`Server::admin`] presents one.
    pub async fn start_with_tls(
        cloud: Arc<dyn Cloud>,
        opts: ServerOptions,
        tls: TlsIdentity,
    ) -> Result<Server, ServerError> {
        opts.timing.validate().map_err(ServerError::Timing)?;
        Self::start_inner(cloud, opts, Some(tls)).await
    }

    async fn start_inner(
        cloud: Arc<dyn Cloud>,
        opts: ServerOptions,
        tls: Option<TlsIdentity>,
    ) -> Result<Server, ServerError> {
        let listener = tokio::net::TcpListener::bind(opts.listen)
            .await
            .map_err(|source| ServerError::Bind { addr: opts.listen, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| ServerError::Bind { addr: opts.listen, source })?;
        let shared = Arc::new(Shared {
            cloud,
            faults: Mutex::new(FaultSet::default()),
            counters: Mutex::new(Counters::default()),
            log: Mutex::new(VecDeque::new()),
            pause: watch::channel(None).0,
            epoch: watch::channel(0).0,
            controls: Arc::new(OpControls::new(opts.timing)),
        });
        let acceptor = tls.as_ref().map(|t| tokio_rustls::TlsAcceptor::from(t.server_config()));
        let task = tokio::spawn(accept_loop(listener, acceptor, shared.clone()));
        let base = base_url(addr, tls.is_some());
        let admin = match &tls {
            Some(t) => match t.client_cert("ccm-emulator-admin")? {
                Some((cert, key)) => crate::admin::Admin::with_ca_pem_and_identity(
                    &base,
                    &t.ca_pem,
                    &format!("{cert}\n{key}"),
                )?,
                None => crate::admin::Admin::with_ca_pem(&base, &t.ca_pem)?,
            },
            None => crate::admin::Admin::new(&base)?,
        };
        Ok(Server { addr, tls, shared, admin, task })
    }

    /// `http://127.0.0.1:<port>` or `https://…` (no trailing slash).
    pub fn url(&self) -> String {
        base_url(self.addr, self.tls.is_some())
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// A client of this server's admin API.
    pub fn admin(&self) -> crate::admin::Admin {
        self.admin.clone()
    }

    /// PEM of the CA that signed the HTTPS certificate (None for plain HTTP).
    pub fn ca_pem(&self) -> Option<&str> {
        self.tls.as_ref().map(|t| t.ca_pem.as_str())
    }

    /// The HTTPS identity (None for plain HTTP): e.g. to issue a client certificate
    /// ([`TlsIdentity::client_cert`]) when the server requires one.
    pub fn tls_identity(&self) -> Option<&TlsIdentity> {
        self.tls.as_ref()
    }

    /// A file holding [`Server::ca_pem`], for a provider's `caFile` (None for plain HTTP).
    /// It lives as long as the server.
    pub fn ca_file(&self) -> Option<&Path> {
        self.tls.as_ref().map(|t| t.ca_file())
    }

    /// The counters, read in-process.
    pub fn counters(&self) -> Counters {
        lock(&self.shared.counters).clone()
    }

    /// Installs a fault rule in-process; returns its id.
    pub fn inject(&self, rule: FaultRule) -> Result<u64, String> {
        rule.validate()?;
        Ok(lock(&self.shared.faults).add(rule))
    }

    /// The timing profile and armed operation failures, in-process (the admin API's
    /// `timing` and `operation-failures`).
    pub fn operation_controls(&self) -> &OpControls {
        &self.shared.controls
    }
}

fn base_url(addr: SocketAddr, tls: bool) -> String {
    format!("{}://{addr}", if tls { "https" } else { "http" })
}

async fn accept_loop(
    listener: tokio::net::TcpListener,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    shared: Arc<Shared>,
) {
    // Connection tasks live in the set: aborting this task (drop) aborts them all.
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // EMFILE and friends: back off and keep serving.
                tracing::warn!(error = %e, "emulator accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        while conns.try_join_next().is_some() {}
        let _ = stream.set_nodelay(true);
        let shared = shared.clone();
        let acceptor = acceptor.clone();
        conns.spawn(async move {
            match acceptor {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(tls) => serve_connection(TokioIo::new(tls), shared).await,
                    Err(e) => tracing::debug!(error = %e, "emulator TLS handshake failed"),
                },
                None => serve_connection(TokioIo::new(stream), shared).await,
            }
        });
    }
}

async fn serve_connection<I>(io: I, shared: Arc<Shared>)
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let svc = hyper::service::service_fn(move |req| handle(shared.clone(), req));
    if let Err(e) =
        hyper::server::conn::http1::Builder::new().keep_alive(true).serve_connection(io, svc).await
    {
        tracing::debug!(error = %e, "emulator connection ended");
    }
}

async fn handle(shared: Arc<Shared>, req: Request<Incoming>) -> Result<Response<Body>, Dropped> {
    if req.uri().path().starts_with(PREFIX) {
        return Ok(admin(&shared, req).await);
    }
    let started = Instant::now();
    let (parts, body) = req.into_parts();
    let body = match body.collect().await {
        Ok(b) => b.to_bytes(),
        Err(e) => return Err(Dropped(format!("reading the request body: {e}"))),
    };
    let op = shared.cloud.operation(&parts, &body);
    {
        let mut c = lock(&shared.counters);
        *c.operations.entry(op.clone()).or_default() += 1;
        c.total += 1;
    }
    let result = dispatch(&shared, parts.clone(), body, op.clone()).await;
    let status = result.as_ref().map(|r| r.status().as_u16()).unwrap_or(0);
    let record = RequestRecord {
        operation: op,
        method: parts.method.to_string(),
        path: parts.uri.path().to_string(),
        status,
        ms: started.elapsed().as_millis() as u64,
    };
    let mut log = lock(&shared.log);
    if log.len() >= LOG_CAPACITY {
        log.pop_front();
    }
    log.push_back(record);
    drop(log);
    result
}

fn faulted(shared: &Shared, op: &str) {
    let mut c = lock(&shared.counters);
    c.faulted += 1;
    *c.faulted_operations.entry(op.to_string()).or_default() += 1;
}

fn error_response(
    shared: &Shared,
    parts: &http::request::Parts,
    op: &str,
    kind: ErrorKind,
    body_override: Option<String>,
    retry_after: Option<u64>,
) -> Response<Body> {
    let reply = shared.cloud.error(parts, op, kind);
    let status = StatusCode::from_u16(reply.status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
    let mut r = Response::new(full(body_override.unwrap_or(reply.body)));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(reply.content_type));
    if let Some(secs) = retry_after {
        r.headers_mut().insert(header::RETRY_AFTER, HeaderValue::from(secs));
    }
    r
}

/// Waits while paused in hang mode; returns the pause mode still in force (fail) or None.
async fn wait_out_pause(shared: &Shared) -> Option<PauseMode> {
    let mut rx = shared.pause.subscribe();
    let deadline = tokio::time::Instant::now() + HANG_LIMIT;
    loop {
        let mode = *rx.borrow_and_update();
        match mode {
            Some(PauseMode::Hang) => {
                if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
                    return Some(PauseMode::Hang);
                }
            }
            other => return other,
        }
    }
}

async fn hang(shared: &Shared) -> Dropped {
    let mut rx = shared.epoch.subscribe();
    rx.borrow_and_update();
    let _ = tokio::time::timeout(HANG_LIMIT, rx.changed()).await;
    Dropped("hang released".into())
}

async fn dispatch(
    shared: &Shared,
    parts: http::request::Parts,
    body: Bytes,
    op: String,
) -> Result<Response<Body>, Dropped> {
    match wait_out_pause(shared).await {
        Some(PauseMode::Fail) => {
            faulted(shared, &op);
            return Ok(error_response(shared, &parts, &op, ErrorKind::Unavailable, None, None));
        }
        Some(PauseMode::Hang) => return Err(Dropped("paused too long".into())),
        None => {}
    }
    let picked = lock(&shared.faults).pick(&op);
    if let Some((_, fault)) = picked {
        faulted(shared, &op);
        match fault {
            Fault::Status { status, body } => {
                return Ok(error_response(
                    shared,
                    &parts,
                    &op,
                    ErrorKind::Status(status),
                    body,
                    None,
                ));
            }
            Fault::Page { status, content_type, body } => {
                let mut r = Response::new(full(body));
                *r.status_mut() =
                    StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE);
                if let Some(v) = content_type.and_then(|ct| HeaderValue::from_str(&ct).ok()) {
                    r.headers_mut().insert(header::CONTENT_TYPE, v);
                }
                return Ok(r);
            }
            Fault::Throttle { retry_after_secs } => {
                return Ok(error_response(
                    shared,
                    &parts,
                    &op,
                    ErrorKind::Throttle,
                    None,
                    Some(retry_after_secs),
                ));
            }
            Fault::Latency { ms } => tokio::time::sleep(Duration::from_millis(ms)).await,
            Fault::Hang => return Err(hang(shared).await),
            Fault::Drop => return Err(Dropped("drop fault".into())),
        }
    }
    let controls = shared.controls.clone();
    let req = Request::from_parts(parts, body);
    let fut = OpControls::sync_scope(controls.clone(), || shared.cloud.serve(op, req));
    OpControls::scope(controls, fut).await
}

fn admin_error(status: StatusCode, msg: impl std::fmt::Display) -> Response<Body> {
    json_response(status, &serde_json::json!({ "error": msg.to_string() }))
}

fn ok() -> Response<Body> {
    json_response(StatusCode::OK, &serde_json::json!({}))
}

async fn read_json<T: serde::de::DeserializeOwned>(body: Incoming) -> Result<T, Response<Body>> {
    let bytes = body
        .collect()
        .await
        .map_err(|e| admin_error(StatusCode::BAD_REQUEST, format!("reading the body: {e}")))?
        .to_bytes();
    serde_json::from_slice(&bytes)
        .map_err(|e| admin_error(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

fn reset(shared: &Shared) {
    lock(&shared.faults).clear();
    *lock(&shared.counters) = Counters::default();
    lock(&shared.log).clear();
    shared.pause.send_replace(None);
    shared.epoch.send_modify(|e| *e += 1);
    shared.controls.reset();
    shared.cloud.reset();
}

fn state(shared: &Shared) -> serde_json::Value {
    serde_json::json!({
        "name": shared.cloud.name(),
        "faults": lock(&shared.faults).rules(),
        "counters": *lock(&shared.counters),
        "paused": *shared.pause.borrow(),
        "timing": shared.controls.timing(),
        "operation_failures": shared.controls.state()["operation_failures"],
        "cloud": shared.cloud.state(),
    })
}

async fn admin(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().strip_prefix(PREFIX).unwrap_or_default().trim_end_matches('/');
    let path = path.to_string();
    let method = req.method().clone();
    match (method, path.as_str()) {
        (Method::POST, "faults") => {
            let rule: FaultRule = match read_json(req.into_body()).await {
                Ok(r) => r,
                Err(resp) => return resp,
            };
            if let Err(e) = rule.validate() {
                return admin_error(StatusCode::BAD_REQUEST, e);
            }
            let id = lock(&shared.faults).add(rule);
            json_response(StatusCode::OK, &serde_json::json!({ "id": id }))
        }
        (Method::GET, "faults") => {
            json_response(StatusCode::OK, &serde_json::json!(lock(&shared.faults).rules()))
        }
        (Method::DELETE, "faults") => {
            lock(&shared.faults).clear();
            shared.epoch.send_modify(|e| *e += 1);
            ok()
        }
        (Method::DELETE, p) if p.starts_with("faults/") => {
            match p["faults/".len()..].parse::<u64>() {
                Ok(id) if lock(&shared.faults).remove(id) => ok(),
                Ok(id) => admin_error(StatusCode::NOT_FOUND, format!("no fault rule {id}")),
                Err(_) => admin_error(StatusCode::BAD_REQUEST, format!("bad fault id in {p}")),
            }
        }
        (Method::POST, "pause") => {
            #[derive(serde::Deserialize)]
            struct Pause {
                mode: PauseMode,
            }
            match read_json::<Pause>(req.into_body()).await {
                Ok(p) => {
                    shared.pause.send_replace(Some(p.mode));
                    ok()
                }
                Err(resp) => resp,
            }
        }
        (Method::POST, "resume") => {
            shared.pause.send_replace(None);
            ok()
        }
        (Method::POST, "reset") => {
            reset(shared);
            ok()
        }
        (Method::GET, "counters") => {
            json_response(StatusCode::OK, &serde_json::json!(*lock(&shared.counters)))
        }
        (Method::GET, "requests") => {
            let log: Vec<RequestRecord> = lock(&shared.log).iter().cloned().collect();
            json_response(StatusCode::OK, &serde_json::json!(log))
        }
        (Method::GET, "state") => json_response(StatusCode::OK, &state(shared)),
        (Method::POST, "operation-failures") => {
            let rule: OperationFailure = match read_json(req.into_body()).await {
                Ok(r) => r,
                Err(resp) => return resp,
            };
            match shared.controls.add_failure(rule) {
                Ok(id) => json_response(StatusCode::OK, &serde_json::json!({ "id": id })),
                Err(e) => admin_error(StatusCode::BAD_REQUEST, e),
            }
        }
        (Method::GET, "operation-failures") => {
            json_response(StatusCode::OK, &shared.controls.state()["operation_failures"])
        }
        (Method::DELETE, "operation-failures") => {
            shared.controls.clear_failures();
            ok()
        }
        (Method::GET, "timing") => {
            let sel = shared.controls.timing();
            let ops = shared.cloud.async_ops();
            let report = TimingReport {
                profile: sel.profile,
                scale: sel.scale,
                fast: ops.map(|o| o.fast().into()),
                realistic: ops.and_then(|o| o.realistic()).map(Into::into),
            };
            json_response(StatusCode::OK, &serde_json::json!(report))
        }
        (Method::POST, "timing") => {
            let sel: TimingSelection = match read_json(req.into_body()).await {
                Ok(s) => s,
                Err(resp) => return resp,
            };
            match shared.controls.set_timing(sel) {
                Ok(()) => ok(),
                Err(e) => admin_error(StatusCode::BAD_REQUEST, e),
            }
        }
        (m, p) => admin_error(StatusCode::NOT_FOUND, format!("no admin endpoint {m} {PREFIX}{p}")),
    }
}
