//! Clients for one vCenter: the vim25 SOAP API ([`vim25`]) and the CIS tagging REST API
//! ([`tagging`]), sharing one HTTP client, one TLS setup and one error type.
//!
//! Only the calls the CCM needs are implemented. Both clients log in lazily with the
//! configured credentials and log in again once when the server says the session is gone
//! (expired, terminated, vCenter restarted), so a long-running manager survives session
//! expiry without a keep-alive loop. Credentials never appear in errors or logs.
//!
//! Transient faults (HTTP 429/503 — vCenter's and its proxy's "busy, retry later", with or
//! without `Retry-After` — and a connection refused or reset mid-call) are retried for the
//! idempotent calls with [`RETRY`], inside the call's deadline; see [`ClientError::classify`].
//! A rejected credential is never retried.
//!
//! Logins of one vCenter (SOAP and REST share it) go through its [`LoginGate`]: after a
//! rejected login the gate asks its [`CredentialRefresh`] (the credentials Secret, read
//! again) for new credentials and retries once if they changed; otherwise it refuses every
//! login of that vCenter for [`LOGIN_THROTTLE`] ([`ClientError::LoginThrottled`]), so a wrong
//! password cannot lock the SSO account. With a `thumbprint` ([`Endpoint::thumbprint`]) a
//! TLS connection is accepted only if the server certificate's SHA-1 thumbprint matches
//! ([`ClientError::ThumbprintMismatch`] otherwise; never a fall-back to no verification).

pub mod tagging;
pub mod vim25;
pub mod xml;

use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_core::cloud_call::{Classified, Deadline, Retry, parse_retry_after};

/// A managed object reference (`<obj type="HostSystem">host-21</obj>`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MoRef {
    /// The managed object type, e.g. `VirtualMachine`, `HostSystem`, `Datacenter`.
    pub kind: String,
    /// The object id, e.g. `vm-62`.
    pub value: String,
}

impl MoRef {
    /// A reference of this type and id.
    pub fn new(kind: impl Into<String>, value: impl Into<String>) -> Self {
        MoRef { kind: kind.into(), value: value.into() }
    }
}

impl fmt::Display for MoRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.kind, self.value)
    }
}

/// A password (or other secret): never printed.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Secret(value.into())
    }

    /// The secret value, for the one place that sends it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How to reach and authenticate to one vCenter.
#[derive(Debug, Clone)]
pub struct Endpoint {
    /// The vCenter's name in the config (used in errors and logs).
    pub name: String,
    /// The server host name or address.
    pub server: String,
    /// The HTTPS port.
    pub port: u16,
    /// User name.
    pub user: String,
    /// Password.
    pub password: Secret,
    /// Skip TLS verification (`insecureFlag`).
    pub insecure: bool,
    /// PEM file with the CA(s) to trust (`caFile`).
    pub ca_file: Option<PathBuf>,
    /// Per-request deadline: a call (connect, send, answer) that has not finished after
    /// this long is abandoned with [`ClientError::Deadline`]; it is logged as stalled at
    /// half of it.
    pub timeout: Duration,
    /// The server certificate's SHA-1 thumbprint (`AA:BB:...`, upper case): when set, a
    /// certificate is accepted only if its thumbprint matches (whatever `insecure` and
    /// `ca_file` say).
    pub thumbprint: Option<String>,
    /// The login gate shared by every client of this vCenter (clones share it): login
    /// throttling after a rejection, credential refresh.
    pub login: LoginGate,
}

impl Endpoint {
    /// `https://server:port` (IPv6 literals bracketed).
    pub fn base_url(&self) -> String {
        if self.server.contains(':') && !self.server.starts_with('[') {
            format!("https://[{}]:{}", self.server, self.port)
        } else {
            format!("https://{}:{}", self.server, self.port)
        }
    }
}

/// A vim25 SOAP fault, by the fault type vCenter names in `detail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FaultKind {
    /// The session is not (or no longer) authenticated: log in again.
    NotAuthenticated,
    /// Wrong user name or password.
    InvalidLogin,
    /// The referenced managed object no longer exists.
    ManagedObjectNotFound,
    /// Any other fault type, by name.
    Other(String),
}

/// A SOAP fault returned by vCenter.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{kind:?}: {message}")]
pub struct SoapFault {
    /// The fault type.
    pub kind: FaultKind,
    /// `faultstring` (may be empty).
    pub message: String,
}

/// Errors of the vCenter clients. Each names the vCenter and the call.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The HTTP client could not be built (bad CA file, TLS setup).
    #[error("vCenter {vcenter}: {message}")]
    Setup {
        /// The vCenter.
        vcenter: String,
        /// What failed.
        message: String,
    },
    /// The request did not complete (connection refused, TLS, timeout).
    #[error("vCenter {vcenter}: {call}: request failed: {source}")]
    Transport {
        /// The vCenter.
        vcenter: String,
        /// The call.
        call: String,
        /// The transport error.
        #[source]
        source: reqwest::Error,
    },
    /// vCenter did not answer within the call's deadline (a stalled call, logged as it
    /// stalled and abandoned at the deadline).
    #[error("vCenter {vcenter}: {call}: no answer within the deadline of {deadline:?}")]
    Deadline {
        /// The vCenter.
        vcenter: String,
        /// The call.
        call: String,
        /// The deadline that passed.
        deadline: Duration,
    },
    /// vCenter answered with an unexpected HTTP status.
    #[error("vCenter {vcenter}: {call}: HTTP {status}: {body}")]
    Http {
        /// The vCenter.
        vcenter: String,
        /// The call.
        call: String,
        /// The status.
        status: u16,
        /// The start of the body.
        body: String,
    },
    /// vCenter (or a proxy in front of it) said it is busy: HTTP 429 or 503, after the
    /// retries ran out.
    #[error("vCenter {vcenter}: {call}: busy (HTTP {status}), retry later")]
    Busy {
        /// The vCenter.
        vcenter: String,
        /// The call.
        call: String,
        /// The status (429 or 503).
        status: u16,
        /// The server's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// vCenter answered with a SOAP fault.
    #[error("vCenter {vcenter}: {call}: fault {fault}")]
    Fault {
        /// The vCenter.
        vcenter: String,
        /// The call.
        call: String,
        /// The fault.
        fault: SoapFault,
    },
    /// The REST session was refused (HTTP 401 after a fresh login) or the login failed.
    #[error("vCenter {vcenter}: {call}: not authorized (check the user name and password)")]
    Unauthorized {
        /// The vCenter.
        vcenter: String,
        /// The call.
        call: String,
    },
    /// A login was refused without trying: an earlier login of this vCenter was rejected
    /// less than [`LoginGate::throttle`] ago (SSO lockout protection).
    #[error(
        "vCenter {vcenter}: {call}: logins are throttled after a rejected login (SSO lockout protection): \
         next attempt in {}s (at most one login per {}s after a rejection); check the user name and password",
        retry_in.as_secs().max(1),
        throttle.as_secs()
    )]
    LoginThrottled {
        /// The vCenter.
        vcenter: String,
        /// The call that needed a login.
        call: String,
        /// How long until the next attempt is allowed.
        retry_in: Duration,
        /// The throttle window.
        throttle: Duration,
    },
    /// The server's certificate does not have the configured thumbprint.
    #[error(
        "vCenter {vcenter}: {call}: TLS certificate thumbprint mismatch: configured thumbprint {expected}, \
         the server presented {actual}; connection refused"
    )]
    ThumbprintMismatch {
        /// The vCenter.
        vcenter: String,
        /// The call.
        call: String,
        /// The configured thumbprint.
        expected: String,
        /// The thumbprint of the certificate the server presented.
        actual: String,
    },
    /// The answer could not be decoded.
    #[error("vCenter {vcenter}: {call}: cannot decode the response: {message}")]
    Decode {
        /// The vCenter.
        vcenter: String,
        /// The call.
        call: String,
        /// What was wrong.
        message: String,
    },
}

impl ClientError {
    /// The SOAP fault, if this is one.
    pub fn fault(&self) -> Option<&SoapFault> {
        match self {
            ClientError::Fault { fault, .. } => Some(fault),
            _ => None,
        }
    }

    /// Whether retrying may help: a busy answer (HTTP 429/503, with its `Retry-After`) or a
    /// connection refused, reset or closed mid-call. Everything else is permanent: faults
    /// (including a rejected login: retrying it could lock the SSO account), other HTTP
    /// statuses, decode errors, a call past its deadline.
    pub fn classify(&self) -> Classified {
        match self {
            ClientError::Busy { retry_after, .. } => {
                Classified::Transient { retry_after: *retry_after }
            }
            ClientError::Transport { source, .. } if is_connection_fault(source) => {
                Classified::Transient { retry_after: None }
            }
            _ => Classified::Permanent,
        }
    }
}

/// A connection that could not be made or broke mid-call (not a timeout, not TLS trust).
fn is_connection_fault(e: &reqwest::Error) -> bool {
    !e.is_timeout() && ccm_core::cloud_call::is_broken_connection(e)
}

/// The retry policy of the idempotent vCenter calls: 5 attempts in all, jittered exponential
/// backoff from 500 ms capped at 8 s, at least the server's `Retry-After`; all attempts and
/// waits inside the endpoint's per-call deadline.
pub const RETRY: Retry =
    Retry { attempts: 5, base: Duration::from_millis(500), max: Duration::from_secs(8) };

/// A busy answer's status (429/503) and `Retry-After`, or `None` for any other status.
pub(crate) fn busy(resp: &reqwest::Response) -> Option<(u16, Option<Duration>)> {
    let status = resp.status().as_u16();
    if status != 429 && status != 503 {
        return None;
    }
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_retry_after);
    Some((status, retry_after))
}

/// How long a TCP/TLS connect may take at most (the per-request deadline still bounds the
/// whole call when it is shorter).
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// Runs one call's HTTP exchange (send and read the answer; `exchange` makes a fresh attempt
/// each time it is called) under the endpoint's per-request deadline: attempts that fail
/// transiently are retried with `retry` (pass [`Retry::NONE`] for a call that is not
/// idempotent), each retry logged at debug level; a warning naming the vCenter and the call
/// once it has stalled for half the deadline, [`ClientError::Deadline`] when the deadline
/// passes (the request is dropped). The deadline bounds all attempts and waits together.
pub(crate) async fn with_deadline<T, F, Fut>(
    endpoint: &Endpoint,
    call: &str,
    retry: Retry,
    exchange: F,
) -> Result<T, ClientError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, ClientError>>,
{
    let deadline = Deadline::new(endpoint.timeout);
    let operation = format!("vCenter {} {call}", endpoint.name);
    let attempts =
        retry.attempts_within(endpoint.timeout, operation.clone(), ClientError::classify, exchange);
    let result = deadline.run(operation, attempts).await.map_err(|e| ClientError::Deadline {
        vcenter: endpoint.name.clone(),
        call: call.to_string(),
        deadline: e.deadline,
    })?;
    result.map_err(|e| match e {
        ClientError::Transport { vcenter, call, source } => match thumbprint_mismatch(&source) {
            Some(m) => ClientError::ThumbprintMismatch {
                vcenter,
                call,
                expected: m.expected.clone(),
                actual: m.actual.clone(),
            },
            None => ClientError::Transport { vcenter, call, source },
        },
        other => other,
    })
}

/// The thumbprint mismatch behind a transport error, if that is what failed.
fn thumbprint_mismatch(e: &reqwest::Error) -> Option<ThumbprintMismatch> {
    find_mismatch(e, 0)
}

/// Depth-first through `source()` and, for an `io::Error` (whose `source()` skips the error
/// it wraps), through the wrapped error as well.
fn find_mismatch(
    err: &(dyn std::error::Error + 'static),
    depth: usize,
) -> Option<ThumbprintMismatch> {
    if depth > 16 {
        return None;
    }
    if let Some(m) = err.downcast_ref::<ThumbprintMismatch>() {
        return Some(m.clone());
    }
    if let Some(rustls::Error::Other(other)) = err.downcast_ref::<rustls::Error>()
        && let Some(m) = other.0.downcast_ref::<ThumbprintMismatch>()
    {
        return Some(m.clone());
    }
    if let Some(inner) = err.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref())
        && let Some(m) = find_mismatch(inner, depth + 1)
    {
        return Some(m);
    }
    find_mismatch(err.source()?, depth + 1)
}

/// Builds the HTTP client for one endpoint: rustls, the configured CA or no verification;
/// connect timeout [`CONNECT_TIMEOUT`] and a per-request timeout a little past the
/// endpoint's deadline (a backstop: [`with_deadline`] gives up first, with a clear error).
pub(crate) fn http_client(endpoint: &Endpoint) -> Result<reqwest::Client, ClientError> {
    let setup = |message: String| ClientError::Setup { vcenter: endpoint.name.clone(), message };
    let mut builder = reqwest::Client::builder()
        .connect_timeout(CONNECT_TIMEOUT)
        .timeout(endpoint.timeout + Duration::from_secs(5))
        .user_agent(concat!("ccm-rs-vsphere/", env!("CARGO_PKG_VERSION")));
    if let Some(thumbprint) = &endpoint.thumbprint {
        // Pinned: only this certificate, whatever insecureFlag/caFile say.
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let verifier = Arc::new(PinnedThumbprint {
            expected: normalize_thumbprint(thumbprint).unwrap_or_else(|| thumbprint.clone()),
            provider: provider.clone(),
        });
        let config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| setup(format!("TLS setup for the pinned thumbprint: {e}")))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_no_client_auth();
        builder = builder.tls_backend_preconfigured(config);
    } else if endpoint.insecure {
        builder = builder.tls_danger_accept_invalid_certs(true);
    } else if let Some(path) = &endpoint.ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| setup(format!("reading caFile {}: {e}", path.display())))?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem).map_err(|e| {
            setup(format!("caFile {} is not a PEM certificate bundle: {e}", path.display()))
        })?;
        if certs.is_empty() {
            return Err(setup(format!("caFile {} contains no certificate", path.display())));
        }
        builder = builder.tls_certs_only(certs);
    }
    builder.build().map_err(|e| setup(format!("building the HTTP client: {e}")))
}

/// The first 300 characters of a body, for error messages.
pub(crate) fn snippet(body: &str) -> String {
    body.chars().take(300).collect()
}

// ---- thumbprint pinning ---------------------------------------------------------------

/// The SHA-1 thumbprint of a DER certificate in upstream's (govmomi's) format: upper-case
/// hex byte pairs joined by `:` (`AA:BB:...`, 59 characters).
pub fn sha1_thumbprint(der: &[u8]) -> String {
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, der);
    digest.as_ref().iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
}

/// A thumbprint in the canonical form (upper case, `:`-separated), or `None` when it is not
/// 20 hex bytes. Accepts lower case and `:`/`-`/no separators.
pub fn normalize_thumbprint(s: &str) -> Option<String> {
    let hex: String = s.trim().chars().filter(|c| !matches!(c, ':' | '-' | ' ')).collect();
    if hex.len() != 40 || !hex.chars().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    let upper = hex.to_ascii_uppercase();
    let pairs: Vec<&str> = (0..20).filter_map(|i| upper.get(i * 2..i * 2 + 2)).collect();
    Some(pairs.join(":"))
}

/// The server presented a certificate with another thumbprint.
#[derive(Debug, Clone, thiserror::Error)]
#[error("certificate thumbprint {actual} does not match the configured {expected}")]
struct ThumbprintMismatch {
    expected: String,
    actual: String,
}

/// Accepts exactly the certificate with the configured SHA-1 thumbprint; the handshake
/// signature is still verified (the server must hold that certificate's key).
#[derive(Debug)]
struct PinnedThumbprint {
    expected: String,
    provider: Arc<rustls::crypto::CryptoProvider>,
}

impl rustls::client::danger::ServerCertVerifier for PinnedThumbprint {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _intermediates: &[rustls::pki_types::CertificateDer<'_>],
        _server_name: &rustls::pki_types::ServerName<'_>,
        _ocsp_response: &[u8],
        _now: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        let actual = sha1_thumbprint(end_entity.as_ref());
        if actual == self.expected {
            Ok(rustls::client::danger::ServerCertVerified::assertion())
        } else {
            Err(rustls::Error::Other(rustls::OtherError(Arc::new(ThumbprintMismatch {
                expected: self.expected.clone(),
                actual,
            }))))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &rustls::pki_types::CertificateDer<'_>,
        dss: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(
            message,
            cert,
            dss,
            &self.provider.signature_verification_algorithms,
        )
    }

    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.provider.signature_verification_algorithms.supported_schemes()
    }
}

// ---- login gate -------------------------------------------------------------------------

/// How long logins of a vCenter are refused after a rejected login. vCenter SSO locks an
/// account after (by default) 5 failed logins within 180 s; one attempt a minute stays well
/// below that.
pub const LOGIN_THROTTLE: Duration = Duration::from_secs(60);

/// A user name and password.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// User name.
    pub user: String,
    /// Password.
    pub password: Secret,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("user", &self.user)
            .field("password", &self.password)
            .finish()
    }
}

/// Where new credentials come from after a rejected login (e.g. the credentials Secret,
/// read again: it may have been rotated).
#[async_trait::async_trait]
pub trait CredentialRefresh: Send + Sync {
    /// The current credentials of this vCenter, `Ok(None)` when the source has none. The
    /// error (no credential values in it) is logged and the login is not retried.
    async fn refresh(&self) -> Result<Option<Credentials>, String>;
}

/// The logins of one vCenter: throttled after a rejection, with a credential refresh. Cheap
/// to clone; clones share the state (the SOAP and the REST client of a vCenter share one).
#[derive(Clone)]
pub struct LoginGate {
    inner: Arc<GateInner>,
}

struct GateInner {
    throttle: Duration,
    refresh: std::sync::Mutex<Option<Arc<dyn CredentialRefresh>>>,
    state: tokio::sync::Mutex<GateState>,
}

#[derive(Default)]
struct GateState {
    /// Credentials that replaced the endpoint's (after a refresh).
    current: Option<Credentials>,
    /// When the last login was rejected (cleared by a successful login).
    rejected_at: Option<Instant>,
}

impl fmt::Debug for LoginGate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LoginGate").field("throttle", &self.inner.throttle).finish_non_exhaustive()
    }
}

impl Default for LoginGate {
    fn default() -> Self {
        LoginGate::new(LOGIN_THROTTLE)
    }
}

/// Whether this error is vCenter rejecting the credentials (not a transport problem).
pub fn is_rejected_login(e: &ClientError) -> bool {
    matches!(e, ClientError::Unauthorized { .. })
        || matches!(e.fault().map(|f| &f.kind), Some(FaultKind::InvalidLogin))
}

impl LoginGate {
    /// A gate refusing logins for `throttle` after a rejection.
    pub fn new(throttle: Duration) -> Self {
        LoginGate {
            inner: Arc::new(GateInner {
                throttle,
                refresh: std::sync::Mutex::new(None),
                state: tokio::sync::Mutex::new(GateState::default()),
            }),
        }
    }

    /// The throttle window.
    pub fn throttle(&self) -> Duration {
        self.inner.throttle
    }

    /// Sets where new credentials come from after a rejection.
    pub fn set_refresh(&self, refresh: Arc<dyn CredentialRefresh>) {
        *self.inner.refresh.lock().unwrap_or_else(|e| e.into_inner()) = Some(refresh);
    }

    async fn refreshed(&self, endpoint: &Endpoint) -> Option<Credentials> {
        let refresh = self.inner.refresh.lock().unwrap_or_else(|e| e.into_inner()).clone()?;
        match refresh.refresh().await {
            Ok(found) => found,
            Err(why) => {
                tracing::warn!(vcenter = %endpoint.name, error = %why, "cannot read the vCenter credentials again");
                None
            }
        }
    }

    /// Starts a login through the gate: refused with [`ClientError::LoginThrottled`]
    /// within the throttle window after a rejection (once it has passed, the credentials
    /// are read again first). Logins of one vCenter are serialized: the returned attempt
    /// holds the gate until it is dropped.
    ///
    /// ```ignore
    /// let mut attempt = gate.begin(&endpoint, "Login").await?;
    /// let mut creds = attempt.credentials().clone();
    /// loop {
    ///     match login_as(&creds).await {
    ///         Ok(session) => { attempt.succeeded(); return Ok(session) }
    ///         Err(e) => creds = attempt.failed(e).await?, // new credentials: try once more
    ///     }
    /// }
    /// ```
    pub async fn begin<'a>(
        &'a self,
        endpoint: &'a Endpoint,
        call: &str,
    ) -> Result<LoginAttempt<'a>, ClientError> {
        let throttle = self.inner.throttle;
        let mut state = self.inner.state.lock().await;
        let mut refreshed = false;
        if let Some(at) = state.rejected_at {
            let since = at.elapsed();
            if since < throttle {
                return Err(ClientError::LoginThrottled {
                    vcenter: endpoint.name.clone(),
                    call: call.to_string(),
                    retry_in: throttle - since,
                    throttle,
                });
            }
            // The window has passed: try the newest credentials.
            if let Some(fresh) = self.refreshed(endpoint).await {
                state.current = Some(fresh);
            }
            refreshed = true;
        }
        let creds = state.current.clone().unwrap_or_else(|| Credentials {
            user: endpoint.user.clone(),
            password: endpoint.password.clone(),
        });
        Ok(LoginAttempt { gate: self, endpoint, state, creds, refreshed })
    }
}

/// One login in progress (see [`LoginGate::begin`]); holds the vCenter's login gate.
pub struct LoginAttempt<'a> {
    gate: &'a LoginGate,
    endpoint: &'a Endpoint,
    state: tokio::sync::MutexGuard<'a, GateState>,
    creds: Credentials,
    refreshed: bool,
}

impl LoginAttempt<'_> {
    /// The credentials to log in with.
    pub fn credentials(&self) -> &Credentials {
        &self.creds
    }

    /// The login succeeded: the throttle is cleared.
    pub fn succeeded(mut self) {
        self.state.rejected_at = None;
    }

    /// The login failed with `error`. A rejection makes the gate read the credentials
    /// again: `Ok` with new credentials to try once more; otherwise the rejection is
    /// recorded (logins are throttled from now on) and `error` returned. Any other error is
    /// returned as is.
    pub async fn failed(&mut self, error: ClientError) -> Result<Credentials, ClientError> {
        if !is_rejected_login(&error) {
            return Err(error);
        }
        if !self.refreshed {
            self.refreshed = true;
            if let Some(fresh) = self.gate.refreshed(self.endpoint).await
                && fresh != self.creds
            {
                tracing::info!(
                    vcenter = %self.endpoint.name,
                    user = %fresh.user,
                    "vCenter login rejected; the credentials changed (Secret rotated?), logging in with the new ones"
                );
                self.state.current = Some(fresh.clone());
                self.creds = fresh.clone();
                return Ok(fresh);
            }
        }
        self.state.rejected_at = Some(Instant::now());
        tracing::warn!(
            vcenter = %self.endpoint.name,
            throttle_secs = self.gate.inner.throttle.as_secs(),
            "vCenter login rejected; logins to this vCenter are throttled (SSO lockout protection)"
        );
        Err(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn thumbprints_are_normalized_to_upstreams_format() {
        let want = "AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01";
        assert_eq!(normalize_thumbprint(want).as_deref(), Some(want));
        assert_eq!(
            normalize_thumbprint("abcdef0123456789abcdef0123456789abcdef01").as_deref(),
            Some(want)
        );
        assert_eq!(normalize_thumbprint("AB:CD"), None);
        assert_eq!(normalize_thumbprint(&want.replace('A', "G")), None);
        // SHA-1 of the empty input, in that format.
        assert_eq!(
            sha1_thumbprint(b""),
            "DA:39:A3:EE:5E:6B:4B:0D:32:55:BF:EF:95:60:18:90:AF:D8:07:09"
        );
    }
}
