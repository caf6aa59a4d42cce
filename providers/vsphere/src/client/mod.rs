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

pub mod tagging;
pub mod vim25;
pub mod xml;

use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

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
    if e.is_timeout() {
        return false;
    }
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | BrokenPipe
                    | UnexpectedEof
            ) {
                return true;
            }
        }
        // hyper: "connection closed before message completed".
        if err.to_string().contains("connection closed before message completed") {
            return true;
        }
        source = err.source();
    }
    false
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
    deadline.run(operation, attempts).await.map_err(|e| ClientError::Deadline {
        vcenter: endpoint.name.clone(),
        call: call.to_string(),
        deadline: e.deadline,
    })?
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
    if endpoint.insecure {
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
