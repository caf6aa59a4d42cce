//! The OpenStack client: one Keystone session (osauth) shared by every call, typed Nova and
//! Neutron calls through the `openstack` crate ([`OpenStackClient::run`]) and raw JSON calls
//! to any catalog service ([`OpenStackClient::get`], [`OpenStackClient::list`], …) for what
//! the crate does not cover (Octavia, extra routes, security groups…).
//!
//! - **Session**: [`OpenStackClient::new`] sends nothing. The first call authenticates
//!   against Keystone (`[Global] auth-url`) and keeps the session (token and catalog; the
//!   endpoints are those of `[Global] region` and `os-endpoint-type`). osauth renews a token
//!   shortly before it expires. When a service answers **401** (the token was revoked or
//!   expired early) the session is dropped, a new one is made (a fresh token) and the call is
//!   sent once more; concurrent calls refused with the same token share one re-authentication.
//!   A second 401 is [`ClientError::Unauthorized`].
//! - **Credentials** (`[Global]`): password (`username`, `user-domain-name`/`domain-name`,
//!   project by `tenant-id`/`tenant-name` and `tenant-domain-id|name`/`domain-id|name`),
//!   application credential (`application-credential-id`, or `-name` with `user-id`), a
//!   pre-issued `token`. `ca-file` is added to the trusted roots. What osauth 0.5 cannot do
//!   is refused by [`OpenStackClient::new`] with an error naming the key: trusts
//!   (`trust-id`), password authentication by `user-id` or by a `user-domain-id` other than
//!   `default`, an application credential by name with `username`, `tls-insecure = true`,
//!   client certificates (`cert-file`/`key-file`). Secrets never appear in `Debug`, logs or
//!   errors (osauth's own `Debug` of sessions and identities prints the password: none of
//!   them is ever formatted here).
//! - **Errors**: OpenStack's error bodies (Nova `{"itemNotFound": {"code","message"}}`,
//!   Neutron `{"NeutronError": {"type","message","detail"}}`, Octavia
//!   `{"faultcode","faultstring"}`, Keystone `{"error": {"code","title","message"}}`) become
//!   [`ClientError::Api`] naming the call, the status, OpenStack's code and message.
//!   **Not found** ([`ClientError::is_not_found`]) only when the service called answered 404
//!   with its own typed JSON error: Nova `{"itemNotFound": {"code": 404, "message"}}`,
//!   Neutron `{"NeutronError": {"type": "<Kind>NotFound", …}}`, Octavia
//!   `{"faultcode": "Client", "faultstring": …}`. An HTML or plain-text 404 page (a proxy, a
//!   gateway), a JSON body of another shape, another service's shape, or a 404 osauth
//!   reports from its own calls is an error like any other, never "gone".
//! - **Plain HTTP**: `auth-url` and every catalog endpoint must be `https://`, unless the host
//!   is loopback (a warning) or `[Global] allow-insecure-http = true` (a warning).
//! - **Reply size**: a reply body larger than [`MAX_BODY`] is an error naming the call
//!   (nothing larger is read).
//! - **Deadlines and retries**: every call (authentication, every page, every retry
//!   included) runs under one [`Deadline`] of [`ClientOptions::timeout`]. Idempotent calls
//!   (GET, PUT, DELETE and the typed calls of [`OpenStackClient::run`]) are retried on 429,
//!   500, 502, 503, 504 (honouring `Retry-After`) and on broken connections with
//!   [`ClientOptions::retry`]. Creates (`POST`, [`OpenStackClient::run_create`]) are retried
//!   only on 429: a 5xx or a dropped connection may follow a create that was carried out.
//! - **Nova microversion**: raw Compute calls ask for microversion 2.47 (the server's flavor
//!   is embedded with its `original_name`); a Nova older than that (406) is asked again
//!   without, once, and from then on never with.
//! - **Paging**: [`OpenStackClient::list`] follows `<key>_links` `rel=next` (`marker`) to the
//!   end.
//!
//! No cloud-call metrics: core has no shared helper and the crate does not depend on
//! `prometheus-client` (AWS has its own); see the crate README.

use std::collections::BTreeSet;
use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use ccm_core::cloud::ProviderError;
use ccm_core::cloud_call::api_metrics::{self, ApiMetrics};
use ccm_core::cloud_call::{Classified, Deadline, DeadlineExceeded, Retry, parse_retry_after};
use osauth::common::IdOrName;
use osauth::services::{GenericService, ServiceType, VersionSelector};
use osauth::{InterfaceType, Session};
use serde_json::Value;
use tokio::sync::Mutex;

use crate::config::{Global, Secret};

/// One call's deadline (authentication, pages and retries included) when nothing else is
/// configured: 30 s, as upstream's gophercloud HTTP timeout.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(30);
/// The retry policy of idempotent calls.
pub const RETRY: Retry =
    Retry { attempts: 5, base: Duration::from_millis(500), max: Duration::from_secs(8) };
/// The Nova microversion raw Compute calls ask for (embedded flavor with `original_name`).
pub const COMPUTE_MICROVERSION: &str = "2.47";
/// Longest error message kept from a reply body.
const MAX_MESSAGE: usize = 500;
/// The largest reply body read (8 MiB: a page of 1000 servers with embedded flavors is about
/// 3 MiB); larger is [`ClientError::TooLarge`].
pub const MAX_BODY: usize = 8 << 20;

/// The User-Agent every call sends when no extra value is set: upstream's component name and
/// version, then this implementation (where upstream names gophercloud).
pub const DEFAULT_USER_AGENT: &str = concat!(
    "openstack-cloud-controller-manager/v",
    env!("CARGO_PKG_VERSION"),
    " ccm-rs-openstack/",
    env!("CARGO_PKG_VERSION")
);

/// `DEFAULT_USER_AGENT` with the `--user-agent` values, as upstream composes them: each value
/// is prepended in turn, so the last one given comes first. Empty values are skipped; a value
/// that cannot be an HTTP header (a control character) is an error naming its position.
pub fn user_agent_with(extra: &[String]) -> Result<String, ClientError> {
    let mut parts: Vec<&str> = Vec::with_capacity(extra.len() + 1);
    for (i, value) in extra.iter().enumerate().rev() {
        let value = value.trim();
        if value.is_empty() {
            continue;
        }
        if value.chars().any(|c| c.is_control()) {
            return Err(config_error(
                "--user-agent",
                format!("value #{} holds a control character", i + 1),
            ));
        }
        parts.push(value);
    }
    parts.push(DEFAULT_USER_AGENT);
    Ok(parts.join(" "))
}

/// Upstream's `request` label (`<resource>_<verb>`, e.g. `server_get`, `floating_ip_create`,
/// `loadbalancer_pool_list`) of an operation named `<service>:<Verb><Resource>`. Router
/// extra-route changes are upstream's `router_update`; a batch member update is its
/// `loadbalancer_members_update`.
pub fn metric_request(op: &str) -> String {
    let name = op.rsplit(':').next().unwrap_or(op);
    let verbs = [
        ("BatchUpdate", "update"),
        ("Update", "update"),
        ("Create", "create"),
        ("Delete", "delete"),
        ("Get", "get"),
        ("List", "list"),
        ("Add", "update"),
        ("Remove", "update"),
    ];
    let Some((verb, rest)) =
        verbs.iter().find_map(|(prefix, verb)| name.strip_prefix(prefix).map(|r| (*verb, r)))
    else {
        return api_metrics::snake_case(name);
    };
    let resource = match rest {
        "Server" | "Servers" => "server",
        "Flavor" | "Flavors" => "flavor",
        "FloatingIP" | "FloatingIPs" => "floating_ip",
        "Port" | "Ports" => "port",
        "Router" | "Routers" | "ExtraRoutes" => "router",
        "Subnet" | "Subnets" => "subnet",
        "Network" | "Networks" => "network",
        "Extensions" => "network_extension",
        "SecurityGroup" | "SecurityGroups" => "security_group",
        "SecurityGroupRule" | "SecurityGroupRules" => "security_group_rule",
        "LoadBalancer" | "LoadBalancers" => "loadbalancer",
        "Listener" | "Listeners" => "loadbalancer_listener",
        "Pool" | "Pools" => "loadbalancer_pool",
        "Members" if name.starts_with("BatchUpdate") => "loadbalancer_members",
        "Member" | "Members" => "loadbalancer_member",
        "HealthMonitor" | "HealthMonitors" => "loadbalancer_healthmonitor",
        // Octavia's API version list (upstream's `version_list`).
        "Versions" => "version",
        other => return format!("{}_{verb}", api_metrics::snake_case(other)),
    };
    format!("{resource}_{verb}")
}

/// Records one finished call in upstream's `openstack_api_*` families.
fn record_call<T>(op: &str, started: std::time::Instant, result: &Result<T, ClientError>) {
    let request = metric_request(op);
    let error = result.as_ref().err().map(|_| "error");
    ApiMetrics::of(&api_metrics::OPENSTACK).call_finished(
        &[request.as_str()],
        started.elapsed(),
        error,
    );
}

/// A catalog service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Service {
    /// Nova (catalog type `compute`).
    Compute,
    /// Neutron (catalog type `network`).
    Network,
    /// Octavia (catalog type `load-balancer`, API v2).
    LoadBalancer,
}

impl Service {
    /// The Keystone catalog type.
    pub fn catalog_type(self) -> &'static str {
        match self {
            Service::Compute => "compute",
            Service::Network => "network",
            Service::LoadBalancer => "load-balancer",
        }
    }
}

const LOAD_BALANCER: GenericService =
    GenericService::new("load-balancer", VersionSelector::Major(2));

/// How calls are bounded.
#[derive(Debug, Clone, Copy)]
pub struct ClientOptions {
    /// One call's deadline, authentication, pages and retries included.
    pub timeout: Duration,
    /// The retry policy of idempotent calls.
    pub retry: Retry,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions { timeout: DEFAULT_TIMEOUT, retry: RETRY }
    }
}

/// Errors of the OpenStack client. Messages name the call; none holds a credential.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// `[Global]` cannot be used (names the key; never quotes a secret).
    #[error("OpenStack client: {key}: {message}")]
    Config {
        /// The key, e.g. `[Global] ca-file`.
        key: String,
        /// What is wrong.
        message: String,
    },
    /// Keystone refused the credentials, or a service refused a fresh token.
    #[error("OpenStack {op}: not authorized: {message}")]
    Unauthorized {
        /// The call.
        op: String,
        /// Keystone's or the service's message (never a credential).
        message: String,
    },
    /// The request did not complete (connection refused or reset, TLS).
    #[error("OpenStack {op}: request failed: {message}")]
    Transport {
        /// The call.
        op: String,
        /// What failed.
        message: String,
    },
    /// The call (all attempts) did not finish within its deadline.
    #[error("OpenStack {op}: no answer within the deadline of {deadline:?}")]
    Deadline {
        /// The call.
        op: String,
        /// The deadline.
        deadline: Duration,
    },
    /// The service answered with an error.
    #[error("OpenStack {op}: HTTP {status}{}: {message}", code_suffix(.code))]
    Api {
        /// The call.
        op: String,
        /// The HTTP status.
        status: u16,
        /// OpenStack's error code or type (`itemNotFound`, `PortNotFound`, `Client`…).
        code: String,
        /// OpenStack's message.
        message: String,
        /// The server's `Retry-After`, if any.
        retry_after: Option<Duration>,
        /// The service called answered 404 with its own typed not-found JSON body (see
        /// [`ClientError::is_not_found`]).
        not_found: bool,
    },
    /// The reply body is larger than [`MAX_BODY`].
    #[error("OpenStack {op}: the reply is larger than {limit} bytes: refused")]
    TooLarge {
        /// The call.
        op: String,
        /// The limit.
        limit: usize,
    },
    /// A URL is plain `http://` without `[Global] allow-insecure-http`.
    #[error(
        "OpenStack {op}: the {what} endpoint {url} is plain http:// on a host other than loopback: refused (use https://, or set [Global] allow-insecure-http = true)"
    )]
    InsecureEndpoint {
        /// The call.
        op: String,
        /// Which service's endpoint.
        what: String,
        /// The endpoint (scheme, host, port and path; never a credential).
        url: String,
    },
    /// The catalog has no endpoint for the service (in the region and interface).
    #[error("OpenStack {op}: {message}")]
    Catalog {
        /// The call.
        op: String,
        /// osauth's message.
        message: String,
    },
    /// The reply could not be decoded.
    #[error("OpenStack {op}: cannot decode the reply: {message}")]
    Decode {
        /// The call.
        op: String,
        /// What was wrong.
        message: String,
    },
}

fn code_suffix(code: &str) -> String {
    if code.is_empty() { String::new() } else { format!(" {code}") }
}

impl From<DeadlineExceeded> for ClientError {
    fn from(e: DeadlineExceeded) -> Self {
        ClientError::Deadline { op: e.operation.into_owned(), deadline: e.deadline }
    }
}

impl ClientError {
    /// The HTTP status OpenStack answered, if it answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ClientError::Api { status, .. } => Some(*status),
            ClientError::Unauthorized { .. } => Some(401),
            _ => None,
        }
    }

    /// Whether the service called said the resource does not exist: a 404 with its own typed
    /// JSON error body (Nova `itemNotFound` with `code` 404, Neutron `…NotFound`, Octavia
    /// `faultcode` `Client`). Any other 404 (an HTML or text page, JSON of another shape or
    /// of another service, osauth's own 404s) is not: uncertain is an error, never "gone".
    pub fn is_not_found(&self) -> bool {
        matches!(self, ClientError::Api { not_found: true, .. })
    }

    /// Whether OpenStack answered 409 (e.g. an Octavia load balancer is immutable while
    /// pending).
    pub fn is_conflict(&self) -> bool {
        self.status() == Some(409)
    }

    /// Transient: 429, 500, 502, 503, 504 (with the server's `Retry-After`) and broken
    /// connections. Everything else (4xx, refused credentials, decode errors, a passed
    /// deadline, a missing endpoint) is permanent.
    pub fn classify(&self) -> Classified {
        match self {
            ClientError::Api { status: 429 | 500 | 502 | 503 | 504, retry_after, .. } => {
                Classified::Transient { retry_after: *retry_after }
            }
            ClientError::Transport { .. } => Classified::Transient { retry_after: None },
            _ => Classified::Permanent,
        }
    }

    /// [`Self::classify`] for a create (`POST`, not idempotent): only a 429 is transient
    /// (the rate limiter refused the request before it was processed). A 5xx or a broken
    /// connection may follow a create that was carried out: permanent here.
    pub fn classify_create(&self) -> Classified {
        match self {
            ClientError::Api { status: 429, .. } => self.classify(),
            _ => Classified::Permanent,
        }
    }
}

impl From<ClientError> for ProviderError {
    fn from(e: ClientError) -> Self {
        match &e {
            ClientError::Api { status: 429, .. } => ProviderError::Throttled(e.to_string()),
            _ => ProviderError::with_source(e.to_string(), e),
        }
    }
}

/// Whether `v` (a 404's body from `svc`) is that service's own typed not-found error.
fn typed_not_found(svc: Service, v: &Value) -> bool {
    let Some(obj) = v.as_object() else { return false };
    match svc {
        // {"itemNotFound": {"code": 404, "message": "Instance <id> could not be found."}}
        Service::Compute => {
            obj.len() == 1
                && obj.get("itemNotFound").is_some_and(|e| {
                    e.get("code").and_then(Value::as_u64) == Some(404)
                        && e.get("message").is_some_and(Value::is_string)
                })
        }
        // {"NeutronError": {"type": "PortNotFound", "message": "...", "detail": ""}}
        Service::Network => obj.get("NeutronError").is_some_and(|e| {
            e.get("type")
                .and_then(Value::as_str)
                .is_some_and(|t| t.len() > "NotFound".len() && t.ends_with("NotFound"))
                && e.get("message").is_some_and(Value::is_string)
        }),
        // {"faultcode": "Client", "faultstring": "Load Balancer <id> could not be found.",
        //  "debuginfo": null}
        Service::LoadBalancer => {
            obj.get("faultcode").and_then(Value::as_str) == Some("Client")
                && obj.get("faultstring").is_some_and(Value::is_string)
        }
    }
}

/// OpenStack's error bodies: Nova `{"<kind>": {"code","message"}}`, Neutron
/// `{"NeutronError": {"type","message","detail"}}` (or a bare string), Octavia
/// `{"faultcode","faultstring"}`, Keystone `{"error": {"code","title","message"}}`.
/// `svc`: the service called (`None`: Keystone, never "not found").
pub(crate) fn parse_error(
    op: &str,
    svc: Option<Service>,
    status: u16,
    retry_after: Option<Duration>,
    body: &[u8],
) -> ClientError {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let not_found = status == 404 && svc.is_some_and(|svc| typed_not_found(svc, &v));
    let s = |v: Option<&Value>| v.and_then(Value::as_str).map(str::to_string);
    let (code, message) = if let Some(fault) = v.get("faultstring") {
        // Octavia (and other WSME/pecan services).
        (s(v.get("faultcode")).unwrap_or_default(), s(Some(fault)))
    } else if let Some(ne) = v.get("NeutronError") {
        match ne {
            Value::String(m) => (String::new(), Some(m.clone())),
            _ => {
                let mut message = s(ne.get("message"));
                if let (Some(m), Some(d)) = (&mut message, s(ne.get("detail")))
                    && !d.is_empty()
                {
                    m.push_str(&format!(" ({d})"));
                }
                (s(ne.get("type")).unwrap_or_default(), message)
            }
        }
    } else if let Some(e) = v.get("error").filter(|e| e.is_object()) {
        // Keystone.
        (s(e.get("title")).unwrap_or_default(), s(e.get("message")))
    } else if let Some(m) = v.get("message").filter(|m| m.is_string()) {
        (s(v.get("type")).or_else(|| s(v.get("code"))).unwrap_or_default(), s(Some(m)))
    } else if let Some((kind, inner)) =
        v.as_object().filter(|o| o.len() == 1).and_then(|o| o.iter().next())
    {
        // Nova: {"itemNotFound": {"code": 404, "message": "..."}}.
        (kind.clone(), s(inner.get("message")).or_else(|| s(Some(inner))))
    } else {
        (String::new(), None)
    };
    let message = message.unwrap_or_else(|| {
        let text = String::from_utf8_lossy(body);
        let text = text.split_whitespace().collect::<Vec<_>>().join(" ");
        if text.is_empty() { "(no body)".to_string() } else { text }
    });
    ClientError::Api {
        op: op.to_string(),
        status,
        code,
        message: truncate(message),
        retry_after,
        not_found,
    }
}

fn truncate(mut s: String) -> String {
    if s.len() > MAX_MESSAGE {
        let mut end = MAX_MESSAGE;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
        s.push('…');
    }
    s
}

/// The HTTP status an osauth error carries. osauth 0.5 keeps it private; its derived
/// `Debug` (`Error { kind: …, message: "…", status: Some(404) }`) is the only way to read
/// it. The last `status: ` is the field (the message before it is a quoted string).
pub(crate) fn osauth_status(e: &osauth::Error) -> Option<u16> {
    let debug = format!("{e:?}");
    let at = debug.rfind("status: Some(")? + "status: Some(".len();
    let digits: String = debug[at..].chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// An osauth error (typed calls, authentication, endpoint discovery) as a [`ClientError`].
/// Its message is OpenStack's message (osauth extracts it from the body) or the HTTP
/// client's (a URL, never a credential).
pub(crate) fn from_osauth(op: &str, e: &osauth::Error) -> ClientError {
    use osauth::ErrorKind as K;
    let message = truncate(osauth_message(e));
    let status = osauth_status(e);
    // osauth's own calls (authentication, endpoint discovery): it does not show the body,
    // so a 404 here is never "not found".
    let api = |status: u16| ClientError::Api {
        op: op.to_string(),
        status,
        code: String::new(),
        message: message.clone(),
        retry_after: None,
        not_found: false,
    };
    match (e.kind(), status) {
        (K::AuthenticationFailed, _) => {
            ClientError::Unauthorized { op: op.to_string(), message: message.clone() }
        }
        (_, Some(status)) => api(status),
        (K::AccessDenied, None) => api(403),
        (K::ResourceNotFound, None) => api(404),
        (K::Conflict, None) => api(409),
        (K::IncompatibleApiVersion, None) => api(406),
        (K::EndpointNotFound, None) => ClientError::Catalog { op: op.to_string(), message },
        (K::ProtocolError, None) => ClientError::Transport { op: op.to_string(), message },
        (K::InvalidConfig, None) => ClientError::Config { key: "[Global]".into(), message },
        _ => ClientError::Decode { op: op.to_string(), message },
    }
}

/// osauth's message without its kind prefix (`Display` is `<kind description>: <message>`).
fn osauth_message(e: &osauth::Error) -> String {
    let text = e.to_string();
    let prefix = format!("{}: ", e.kind().description());
    text.strip_prefix(&prefix).map(str::to_string).unwrap_or(text)
}

/// How to authenticate (built from `[Global]` by [`OpenStackClient::new`]).
#[derive(Clone)]
enum Credentials {
    Password { username: String, password: Secret, user_domain: String, scope: Option<Scope> },
    ApplicationCredentialId { id: String, secret: Secret },
    ApplicationCredentialName { name: String, secret: Secret, user_id: String },
    Token { token: Secret, scope: Option<Scope> },
}

#[derive(Clone)]
struct Scope {
    project: IdOrName,
    domain: Option<IdOrName>,
}

impl Credentials {
    fn method(&self) -> &'static str {
        match self {
            Credentials::Password { .. } => "password",
            Credentials::ApplicationCredentialId { .. }
            | Credentials::ApplicationCredentialName { .. } => "application credential",
            Credentials::Token { .. } => "token",
        }
    }
}

/// A live session and its generation (bumped on every re-authentication).
struct Live {
    generation: u64,
    session: Session,
}

/// One raw reply.
struct Reply {
    status: u16,
    retry_after: Option<Duration>,
    body: Vec<u8>,
}

/// The HTTP methods of the raw calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Method {
    Get,
    Post,
    Put,
    Delete,
}

/// The OpenStack client of one provider. Cheap to share (`Arc`); `Debug` shows the auth URL
/// and region only.
pub struct OpenStackClient {
    auth_url: String,
    region: String,
    interface: Option<InterfaceType>,
    credentials: Credentials,
    /// A session without authentication whose HTTP client trusts `ca-file`: every
    /// authenticated session is made on its HTTP client.
    http: Session,
    options: ClientOptions,
    live: Mutex<Option<Arc<Live>>>,
    generation: AtomicU64,
    /// False once Nova refused [`COMPUTE_MICROVERSION`] (406).
    microversion: AtomicBool,
    extensions: Mutex<Option<BTreeSet<String>>>,
    http_policy: HttpPolicy,
    /// The `User-Agent` of every service call ([`Self::set_user_agents`]).
    user_agent: std::sync::RwLock<Arc<str>>,
}

/// Whether plain `http://` endpoints may be used, and whether that was logged already.
#[derive(Debug, Default)]
struct HttpPolicy {
    /// `[Global] allow-insecure-http`.
    allow: bool,
    /// A warning about a plain-HTTP endpoint was logged.
    warned: AtomicBool,
}

/// Whether `host` (as `Url::host_str` gives it) is loopback: `localhost`, 127.0.0.0/8, ::1.
fn loopback_host(host: &str) -> bool {
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    bare.eq_ignore_ascii_case("localhost")
        || bare.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl HttpPolicy {
    /// `Ok` for `https://`; `http://` on loopback or with the opt-in: `Ok` with one warning;
    /// else an error naming the URL (scheme, host, port and path only).
    fn check(
        &self,
        op: &str,
        what: &str,
        scheme: &str,
        host: &str,
        shown: &str,
    ) -> Result<(), ClientError> {
        if scheme != "http" {
            return Ok(());
        }
        if !self.allow && !loopback_host(host) {
            return Err(ClientError::InsecureEndpoint {
                op: op.to_string(),
                what: what.to_string(),
                url: shown.to_string(),
            });
        }
        if !self.warned.swap(true, Ordering::AcqRel) {
            tracing::warn!(
                endpoint = shown,
                "OpenStack: plain http:// endpoint in use: credentials and tokens are not encrypted"
            );
        }
        Ok(())
    }
}

/// `url` without user information, query or fragment (for errors and logs).
fn shown_url(scheme: &str, host: &str, port: Option<u16>, path: &str) -> String {
    match port {
        Some(p) => format!("{scheme}://{host}:{p}{path}"),
        None => format!("{scheme}://{host}{path}"),
    }
}

impl std::fmt::Debug for OpenStackClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenStackClient")
            .field("auth_url", &self.auth_url)
            .field("region", &self.region)
            .field("method", &self.credentials.method())
            .finish_non_exhaustive()
    }
}

fn config_error(key: &str, message: impl Into<String>) -> ClientError {
    ClientError::Config { key: key.to_string(), message: message.into() }
}

fn non_empty(s: &str) -> Option<&str> {
    let s = s.trim();
    (!s.is_empty()).then_some(s)
}

/// The credentials `[Global]` describes, as upstream picks them (gophercloud clientconfig):
/// an application credential when one is named, else a token, else a password.
fn credentials(g: &Global) -> Result<Credentials, ClientError> {
    if non_empty(&g.trust_id).is_some() {
        return Err(config_error(
            "[Global] trust-id",
            "Keystone trusts are not supported by this build (osauth 0.5 cannot scope a token \
             to a trust); use an application credential or a password",
        ));
    }
    let project_domain = non_empty(&g.project_domain_id)
        .map(IdOrName::from_id)
        .or_else(|| non_empty(&g.project_domain_name).map(IdOrName::from_name))
        .or_else(|| non_empty(&g.domain_id).map(IdOrName::from_id))
        .or_else(|| non_empty(&g.domain_name).map(IdOrName::from_name));
    let scope = if let Some(id) = non_empty(&g.project_id) {
        Some(Scope { project: IdOrName::from_id(id), domain: None })
    } else {
        non_empty(&g.project_name).map(|name| Scope {
            project: IdOrName::from_name(name),
            domain: Some(project_domain.unwrap_or_else(|| IdOrName::from_name("Default"))),
        })
    };
    let app_cred = non_empty(&g.application_credential_id).is_some()
        || non_empty(&g.application_credential_name).is_some();
    if app_cred {
        if g.application_credential_secret.is_empty() {
            return Err(config_error(
                "[Global] application-credential-secret",
                "required with an application credential",
            ));
        }
        let secret = g.application_credential_secret.clone();
        if let Some(id) = non_empty(&g.application_credential_id) {
            return Ok(Credentials::ApplicationCredentialId { id: id.into(), secret });
        }
        let name = non_empty(&g.application_credential_name).unwrap_or_default().to_string();
        return match non_empty(&g.user_id) {
            Some(user_id) => {
                Ok(Credentials::ApplicationCredentialName { name, secret, user_id: user_id.into() })
            }
            None => Err(config_error(
                "[Global] application-credential-name",
                "an application credential by name needs user-id with this build (osauth 0.5 \
                 cannot name the user by username); set user-id or application-credential-id",
            )),
        };
    }
    if !g.token.is_empty() {
        return Ok(Credentials::Token { token: g.token.clone(), scope });
    }
    let Some(username) = non_empty(&g.username) else {
        if non_empty(&g.user_id).is_some() {
            return Err(config_error(
                "[Global] user-id",
                "password authentication by user ID is not supported by this build (osauth \
                 0.5 names the user by name); set username and user-domain-name",
            ));
        }
        return Err(config_error(
            "[Global] username",
            "no credentials: set username and password, an application credential, or token",
        ));
    };
    if g.password.is_empty() {
        return Err(config_error("[Global] password", "required with username"));
    }
    let user_domain = match (
        non_empty(&g.user_domain_name),
        non_empty(&g.user_domain_id),
        non_empty(&g.domain_name),
        non_empty(&g.domain_id),
    ) {
        (Some(name), _, _, _) => name.to_string(),
        (None, Some(id), _, _) => domain_name_for_id(id, "[Global] user-domain-id")?,
        (None, None, Some(name), _) => name.to_string(),
        (None, None, None, Some(id)) => domain_name_for_id(id, "[Global] domain-id")?,
        (None, None, None, None) => "Default".to_string(),
    };
    Ok(Credentials::Password {
        username: username.into(),
        password: g.password.clone(),
        user_domain,
        scope,
    })
}

/// osauth 0.5 names the user's domain by name only. Keystone's default domain has ID
/// `default` and name `Default`: that one is translated, any other ID is refused.
fn domain_name_for_id(id: &str, key: &str) -> Result<String, ClientError> {
    if id == "default" {
        Ok("Default".into())
    } else {
        Err(config_error(
            key,
            "a user domain by ID other than \"default\" is not supported by this build (osauth \
             0.5 names the user's domain by name); set user-domain-name",
        ))
    }
}

/// The HTTP client's session: no authentication, `ca-file` trusted. Built without I/O.
fn http_session(ca_file: Option<&Path>) -> Result<Session, ClientError> {
    let key = "[Global] ca-file";
    let mut cfg = serde_json::json!({"auth_type": "none"});
    if let Some(path) = ca_file {
        let pem = std::fs::read(path)
            .map_err(|e| config_error(key, format!("cannot read {}: {e}", path.display())))?;
        if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
            return Err(config_error(key, format!("{} holds no PEM certificate", path.display())));
        }
        cfg["cacert"] = Value::String(path.display().to_string());
    }
    let cfg: osauth::CloudConfig = serde_json::from_value(cfg)
        .map_err(|e| config_error("[Global]", format!("HTTP client settings: {e}")))?;
    // `create_session` with no authentication sends nothing: it only builds the HTTP client
    // (reading and parsing the CA file).
    futures::executor::block_on(cfg.create_session()).map_err(|e| {
        config_error(if ca_file.is_some() { key } else { "[Global]" }, osauth_message(&e))
    })
}

impl OpenStackClient {
    /// A client for `[Global]`. No network I/O: the session is created (authenticated)
    /// lazily on the first call, and again when a call answers 401. Errors name the key
    /// (unsupported credentials, an unreadable `ca-file`, an unknown `os-endpoint-type`).
    pub fn new(global: &Global, options: ClientOptions) -> Result<Self, ClientError> {
        let auth_url = non_empty(&global.auth_url)
            .ok_or_else(|| config_error("[Global] auth-url", "required"))?
            .to_string();
        let parsed = url::Url::parse(&auth_url)
            .map_err(|e| config_error("[Global] auth-url", format!("not a URL: {e}")))?;
        // The URL is logged, in `Debug` and in transport errors: it must hold no credential.
        if !parsed.username().is_empty() || parsed.password().is_some() {
            return Err(config_error(
                "[Global] auth-url",
                "must not carry user information (give the credentials as username and \
                 password, or an application credential)",
            ));
        }
        let credentials = credentials(global)?;
        if global.tls_insecure {
            return Err(config_error(
                "[Global] tls-insecure",
                "skipping TLS verification is not supported by this build; give the CA with \
                 ca-file instead",
            ));
        }
        if global.cert_file.is_some() || global.key_file.is_some() {
            return Err(config_error(
                "[Global] cert-file",
                "TLS client certificates are not supported by this build",
            ));
        }
        let interface = match non_empty(&global.endpoint_type) {
            None => None,
            Some(t) => Some(t.parse::<InterfaceType>().map_err(|_| {
                config_error(
                    "[Global] os-endpoint-type",
                    format!("{t:?} is not one of public, internal, admin"),
                )
            })?),
        };
        let http_policy = HttpPolicy { allow: global.allow_insecure_http, ..Default::default() };
        let host = parsed.host_str().unwrap_or_default();
        let shown = shown_url(parsed.scheme(), host, parsed.port(), parsed.path());
        http_policy.check("new", "Keystone (auth-url)", parsed.scheme(), host, &shown).map_err(
            |_| {
                config_error(
                    "[Global] auth-url",
                    format!(
                        "{shown} is plain http:// on a host other than loopback: credentials \
                         would cross the network unencrypted (use https://, or set \
                         [Global] allow-insecure-http = true)"
                    ),
                )
            },
        )?;
        let http = http_session(global.ca_file.as_deref())?;
        Ok(OpenStackClient {
            auth_url,
            region: global.region.trim().to_string(),
            interface,
            credentials,
            http,
            options,
            live: Mutex::new(None),
            generation: AtomicU64::new(0),
            microversion: AtomicBool::new(true),
            extensions: Mutex::new(None),
            http_policy,
            user_agent: std::sync::RwLock::new(Arc::from(DEFAULT_USER_AGENT)),
        })
    }

    /// Adds upstream's `--user-agent` values to the `User-Agent` of every later call, as
    /// upstream does ([`user_agent_with`]: the last value first, then [`DEFAULT_USER_AGENT`]).
    /// Replaces values set before. Keystone's authentication requests are sent without it.
    pub fn set_user_agents(&self, extra: Vec<String>) -> Result<(), ClientError> {
        let ua = user_agent_with(&extra)?;
        tracing::debug!(user_agent = %ua, "OpenStack: user agent");
        match self.user_agent.write() {
            Ok(mut slot) => *slot = Arc::from(ua),
            Err(poisoned) => *poisoned.into_inner() = Arc::from(ua),
        }
        Ok(())
    }

    /// The `User-Agent` calls send.
    pub fn user_agent(&self) -> Arc<str> {
        match self.user_agent.read() {
            Ok(ua) => ua.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// The options in use.
    pub fn options(&self) -> ClientOptions {
        self.options
    }

    /// The region (`[Global] region`; empty when not set: the catalog's first endpoint).
    pub fn region(&self) -> &str {
        &self.region
    }

    /// The Keystone URL.
    pub fn auth_url(&self) -> &str {
        &self.auth_url
    }

    // ---- session -----------------------------------------------------------------------

    /// The live session, authenticating first when there is none.
    async fn live(&self, op: &str) -> Result<Arc<Live>, ClientError> {
        let mut slot = self.live.lock().await;
        if let Some(live) = slot.as_ref() {
            return Ok(live.clone());
        }
        let session = self.authenticate(op).await?;
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let live = Arc::new(Live { generation, session });
        *slot = Some(live.clone());
        tracing::debug!(
            auth_url = %self.auth_url,
            method = self.credentials.method(),
            generation,
            "OpenStack: authenticated"
        );
        Ok(live)
    }

    /// Drops the session of `generation` (a service refused its token): the next call makes
    /// a new one. A newer session (another call re-authenticated already) is kept.
    async fn forget(&self, generation: u64) {
        let mut slot = self.live.lock().await;
        if slot.as_ref().is_some_and(|l| l.generation == generation) {
            *slot = None;
        }
    }

    /// A new authenticated session (one Keystone token request).
    async fn authenticate(&self, op: &str) -> Result<Session, ClientError> {
        let http = self.http.client().inner().clone();
        let url = self.auth_url.as_str();
        let bad_url = |e: osauth::Error| config_error("[Global] auth-url", osauth_message(&e));
        let made = match &self.credentials {
            Credentials::Password { username, password, user_domain, scope } => {
                let mut id = osauth::identity::Password::new(
                    url,
                    username.as_str(),
                    password.expose(),
                    user_domain.as_str(),
                )
                .map_err(bad_url)?;
                if let Some(s) = scope {
                    id.set_project_scope(s.project.clone(), s.domain.clone());
                }
                Session::new_with_client(http, id).await
            }
            Credentials::ApplicationCredentialId { id, secret } => {
                let id =
                    osauth::identity::ApplicationCredential::new(url, id.as_str(), secret.expose())
                        .map_err(bad_url)?;
                Session::new_with_client(http, id).await
            }
            Credentials::ApplicationCredentialName { name, secret, user_id } => {
                let id = osauth::identity::ApplicationCredential::with_user_id(
                    url,
                    name.as_str(),
                    secret.expose(),
                    user_id.as_str(),
                )
                .map_err(bad_url)?;
                Session::new_with_client(http, id).await
            }
            Credentials::Token { token, scope } => {
                let mut id = osauth::identity::Token::new(url, token.expose()).map_err(bad_url)?;
                if let Some(s) = scope {
                    id.set_project_scope(s.project.clone(), s.domain.clone());
                }
                Session::new_with_client(http, id).await
            }
        };
        let mut session = made.map_err(|e| match from_osauth(op, &e) {
            ClientError::Unauthorized { message, .. } => ClientError::Unauthorized {
                op: op.to_string(),
                message: format!(
                    "Keystone refused the {} credentials: {message}",
                    self.credentials.method()
                ),
            },
            ClientError::Api { status, code, message, retry_after, .. } => ClientError::Api {
                op: op.to_string(),
                status,
                code,
                message: format!("Keystone: {message}"),
                retry_after,
                not_found: false,
            },
            other => other,
        })?;
        if !self.region.is_empty() {
            session.set_region(self.region.clone());
        }
        if let Some(i) = self.interface {
            session.set_endpoint_interface(i);
        }
        Ok(session)
    }

    // ---- typed calls -------------------------------------------------------------------

    /// Typed Nova/Neutron calls through the `openstack` crate: deadline, retry of transient
    /// faults (the call must be idempotent: a read, an update, a delete), one
    /// re-authentication on 401. `f` may be called several times.
    pub async fn run<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T, ClientError>
    where
        F: Fn(openstack::Cloud) -> Fut,
        Fut: Future<Output = Result<T, openstack::Error>>,
    {
        self.run_with(op, ClientError::classify, f).await
    }

    /// [`Self::run`] for a typed create (not idempotent): retried only on 429.
    pub async fn run_create<T, F, Fut>(&self, op: &'static str, f: F) -> Result<T, ClientError>
    where
        F: Fn(openstack::Cloud) -> Fut,
        Fut: Future<Output = Result<T, openstack::Error>>,
    {
        self.run_with(op, ClientError::classify_create, f).await
    }

    async fn run_with<T, F, Fut>(
        &self,
        op: &'static str,
        classify: fn(&ClientError) -> Classified,
        f: F,
    ) -> Result<T, ClientError>
    where
        F: Fn(openstack::Cloud) -> Fut,
        Fut: Future<Output = Result<T, openstack::Error>>,
    {
        let deadline = Deadline::new(self.options.timeout);
        let attempt = || async {
            let mut reauthenticated = false;
            loop {
                let live = self.live(op).await?;
                match f(openstack::Cloud::from(live.session.clone())).await {
                    Ok(out) => return Ok(out),
                    Err(e) => match from_osauth(op, &e) {
                        ClientError::Unauthorized { .. } if !reauthenticated => {
                            reauthenticated = true;
                            tracing::debug!(op, "OpenStack: token refused, re-authenticating");
                            self.forget(live.generation).await;
                        }
                        other => return Err(other),
                    },
                }
            }
        };
        let started = std::time::Instant::now();
        let result = self.options.retry.run(&deadline, op, classify, attempt).await;
        record_call(op, started, &result);
        result
    }

    // ---- raw calls ---------------------------------------------------------------------

    /// Sends one request (authenticating first if needed; a 401 re-authenticates once and
    /// resends) and returns the 2xx reply, or the error it carries.
    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        op: &str,
        svc: Service,
        method: Method,
        path: &[&str],
        query: &[(&str, String)],
        body: Option<&Value>,
        root: bool,
    ) -> Result<Reply, ClientError> {
        let mut reauthenticated = false;
        loop {
            let live = self.live(op).await?;
            let microversion = svc == Service::Compute && self.microversion.load(Ordering::Acquire);
            let user_agent = self.user_agent();
            let call = Call {
                op,
                svc,
                method,
                path,
                query,
                body,
                policy: &self.http_policy,
                user_agent: &user_agent,
                root,
            };
            let sent = match svc {
                Service::Compute => {
                    exec(&live.session, osauth::services::COMPUTE, &call, microversion).await
                }
                Service::Network => {
                    exec(&live.session, osauth::services::NETWORK, &call, false).await
                }
                Service::LoadBalancer => exec(&live.session, LOAD_BALANCER, &call, false).await,
            };
            let reply = match sent {
                Ok(r) => r,
                Err(ExecError::Client(e)) => return Err(e),
                Err(ExecError::OsAuth(e)) => match from_osauth(op, &e) {
                    // A 401 while discovering the endpoint: the token was refused too.
                    ClientError::Unauthorized { .. } if !reauthenticated => {
                        reauthenticated = true;
                        self.forget(live.generation).await;
                        continue;
                    }
                    other => return Err(other),
                },
            };
            match reply.status {
                200..=299 => return Ok(reply),
                401 if !reauthenticated => {
                    reauthenticated = true;
                    tracing::debug!(op, "OpenStack: token refused, re-authenticating");
                    self.forget(live.generation).await;
                }
                401 => {
                    let message = match parse_error(op, Some(svc), 401, None, &reply.body) {
                        ClientError::Api { message, .. } => message,
                        other => other.to_string(),
                    };
                    return Err(ClientError::Unauthorized {
                        op: op.to_string(),
                        message: format!("a fresh token was refused too: {message}"),
                    });
                }
                406 if microversion => {
                    tracing::info!(
                        op,
                        microversion = COMPUTE_MICROVERSION,
                        "OpenStack: Nova refused the microversion; using its default from now on"
                    );
                    self.microversion.store(false, Ordering::Release);
                }
                status => {
                    return Err(parse_error(op, Some(svc), status, reply.retry_after, &reply.body));
                }
            }
        }
    }

    /// One raw call under the deadline, retried as its method allows.
    async fn call(
        &self,
        op: &'static str,
        svc: Service,
        method: Method,
        path: &[&str],
        query: &[(&str, String)],
        body: Option<&Value>,
    ) -> Result<Reply, ClientError> {
        self.call_with(op, svc, method, path, query, body, false).await
    }

    /// `GET` of the service's unversioned root (the catalog URL without its version
    /// segment, e.g. Octavia's API version list), under the deadline, retried as a `GET`.
    pub async fn get_root(&self, op: &'static str, svc: Service) -> Result<Value, ClientError> {
        let reply = self.call_with(op, svc, Method::Get, &[], &[], None, true).await?;
        decode(op, &reply.body)
    }

    #[allow(clippy::too_many_arguments)]
    async fn call_with(
        &self,
        op: &'static str,
        svc: Service,
        method: Method,
        path: &[&str],
        query: &[(&str, String)],
        body: Option<&Value>,
        root: bool,
    ) -> Result<Reply, ClientError> {
        let deadline = Deadline::new(self.options.timeout);
        let classify: fn(&ClientError) -> Classified = if method == Method::Post {
            ClientError::classify_create
        } else {
            ClientError::classify
        };
        let started = std::time::Instant::now();
        let result = self
            .options
            .retry
            .run(&deadline, op, classify, || self.send(op, svc, method, path, query, body, root))
            .await;
        record_call(op, started, &result);
        result
    }

    /// `GET` of a JSON document; `path` are the segments after the service's versioned
    /// root (Nova `…/v2.1`, Neutron `…/v2.0`, Octavia `…/v2`).
    pub async fn get(
        &self,
        op: &'static str,
        svc: Service,
        path: &[&str],
        query: &[(&str, String)],
    ) -> Result<Value, ClientError> {
        let reply = self.call(op, svc, Method::Get, path, query, None).await?;
        decode(op, &reply.body)
    }

    /// All items of a paged list: the `key` array of every page, following the
    /// `<key>_links` `rel=next` link's `marker` until there is none. The whole listing runs
    /// under one deadline.
    pub async fn list(
        &self,
        op: &'static str,
        svc: Service,
        path: &[&str],
        query: &[(&str, String)],
        key: &str,
    ) -> Result<Vec<Value>, ClientError> {
        let deadline = Deadline::new(self.options.timeout);
        let started = std::time::Instant::now();
        let result = deadline.try_run(op, self.list_pages(op, svc, path, query, key)).await;
        record_call(op, started, &result);
        result
    }

    async fn list_pages(
        &self,
        op: &'static str,
        svc: Service,
        path: &[&str],
        query: &[(&str, String)],
        key: &str,
    ) -> Result<Vec<Value>, ClientError> {
        let mut items = Vec::new();
        let mut marker: Option<String> = None;
        let links_key = format!("{key}_links");
        for _page in 0..100_000 {
            let mut q: Vec<(&str, String)> =
                query.iter().filter(|(k, _)| *k != "marker").cloned().collect();
            if let Some(m) = &marker {
                q.push(("marker", m.clone()));
            }
            // Each page is retried on its own; the deadline of `list` bounds them all.
            let reply = self
                .options
                .retry
                .attempts_within(self.options.timeout, op, ClientError::classify, || {
                    self.send(op, svc, Method::Get, path, &q, None, false)
                })
                .await?;
            let mut page: Value = decode(op, &reply.body)?;
            let Some(Value::Array(list)) = page.get_mut(key).map(Value::take) else {
                return Err(ClientError::Decode {
                    op: op.into(),
                    message: format!("no {key:?} array in the reply"),
                });
            };
            items.extend(list);
            let next = page
                .get(&links_key)
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .find(|l| l.get("rel").and_then(Value::as_str) == Some("next"))
                .and_then(|l| l.get("href").and_then(Value::as_str));
            let Some(href) = next else { return Ok(items) };
            let next_marker = url::Url::parse(href).ok().and_then(|u| {
                u.query_pairs().find(|(k, _)| k == "marker").map(|(_, v)| v.into_owned())
            });
            match next_marker {
                Some(m) if Some(&m) != marker.as_ref() => marker = Some(m),
                _ => {
                    return Err(ClientError::Decode {
                        op: op.into(),
                        message: format!("{links_key} next link has no new marker"),
                    });
                }
            }
        }
        Err(ClientError::Decode { op: op.into(), message: "too many pages".into() })
    }

    /// `POST` of a JSON body (a create: retried only on 429); the reply's JSON.
    pub async fn post(
        &self,
        op: &'static str,
        svc: Service,
        path: &[&str],
        body: &Value,
    ) -> Result<Value, ClientError> {
        let reply = self.call(op, svc, Method::Post, path, &[], Some(body)).await?;
        decode_or_null(op, &reply.body)
    }

    /// `PUT` of a JSON body (idempotent: retried); the reply's JSON, `Value::Null` on 204.
    pub async fn put(
        &self,
        op: &'static str,
        svc: Service,
        path: &[&str],
        body: &Value,
    ) -> Result<Value, ClientError> {
        let reply = self.call(op, svc, Method::Put, path, &[], Some(body)).await?;
        decode_or_null(op, &reply.body)
    }

    /// `DELETE`. A 404 is an error like any other ([`ClientError::is_not_found`]).
    pub async fn delete(
        &self,
        op: &'static str,
        svc: Service,
        path: &[&str],
        query: &[(&str, String)],
    ) -> Result<(), ClientError> {
        self.call(op, svc, Method::Delete, path, query, None).await.map(|_| ())
    }

    /// Whether Neutron has the extension `alias` (`GET /extensions`, asked once and cached).
    pub async fn has_extension(&self, alias: &str) -> Result<bool, ClientError> {
        let mut slot = self.extensions.lock().await;
        if slot.is_none() {
            let v =
                self.get("neutron:ListExtensions", Service::Network, &["extensions"], &[]).await?;
            let aliases: BTreeSet<String> = v
                .get("extensions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .filter_map(|e| e.get("alias").and_then(Value::as_str).map(str::to_string))
                .collect();
            *slot = Some(aliases);
        }
        Ok(slot.as_ref().is_some_and(|s| s.contains(alias)))
    }
}

/// One raw request.
struct Call<'a> {
    op: &'a str,
    svc: Service,
    method: Method,
    path: &'a [&'a str],
    query: &'a [(&'a str, String)],
    body: Option<&'a Value>,
    policy: &'a HttpPolicy,
    user_agent: &'a str,
    /// `GET` of the service's unversioned root (the catalog URL without a trailing version
    /// segment), `path` and `query` unused: the API version list.
    root: bool,
}

#[cfg(test)]
#[test]
fn the_unversioned_root_drops_a_version_segment() {
    let root = |u: &str| unversioned_root(&url::Url::parse(u).unwrap()).to_string();
    assert_eq!(root("https://h:9876"), "https://h:9876/");
    assert_eq!(root("https://h:9876/v2"), "https://h:9876/");
    assert_eq!(root("https://h/load-balancer"), "https://h/load-balancer/");
    assert_eq!(root("https://h/load-balancer/v2.0/?x=1"), "https://h/load-balancer/");
    assert_eq!(root("https://h/lb/version2"), "https://h/lb/version2/");
}

/// Whether a URL path segment names an API version (`v2`, `v2.0`, `v3.14`).
fn is_version_segment(s: &str) -> bool {
    s.strip_prefix('v').is_some_and(|rest| {
        !rest.is_empty()
            && rest.split('.').all(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// The unversioned root of a catalog URL: a trailing version segment dropped, query dropped,
/// ending in `/` (gophercloud's `BaseEndpoint` + `/`, as upstream lists API versions).
pub fn unversioned_root(endpoint: &url::Url) -> url::Url {
    let mut url = endpoint.clone();
    let mut segs: Vec<String> = endpoint
        .path_segments()
        .map(|s| s.filter(|x| !x.is_empty()).map(str::to_string).collect())
        .unwrap_or_default();
    if segs.last().is_some_and(|l| is_version_segment(l)) {
        segs.pop();
    }
    let path = if segs.is_empty() { "/".to_string() } else { format!("/{}/", segs.join("/")) };
    url.set_path(&path);
    url.set_query(None);
    url.set_fragment(None);
    url
}

/// What [`exec`] fails with.
enum ExecError {
    OsAuth(osauth::Error),
    Client(ClientError),
}

impl From<osauth::Error> for ExecError {
    fn from(e: osauth::Error) -> Self {
        ExecError::OsAuth(e)
    }
}

/// Sends one raw request on `session` to `svc`: the catalog's endpoint checked for plain HTTP
/// first; the reply body read up to [`MAX_BODY`].
async fn exec<S>(
    session: &Session,
    svc: S,
    call: &Call<'_>,
    microversion: bool,
) -> Result<Reply, ExecError>
where
    S: ServiceType + Send + Clone,
{
    let Call { op, method, path, query, body, .. } = *call;
    // The catalog's URL, before anything (version discovery included) is sent to it.
    let endpoint =
        session.client().get_endpoint(call.svc.catalog_type(), session.endpoint_filters()).await?;
    let host = endpoint.host_str().unwrap_or_default();
    let shown = shown_url(endpoint.scheme(), host, endpoint.port(), endpoint.path());
    call.policy
        .check(op, call.svc.catalog_type(), endpoint.scheme(), host, &shown)
        .map_err(ExecError::Client)?;
    // Both branches send with osauth's client: the same response type.
    let mut resp = if call.root {
        let url = unversioned_root(&endpoint);
        let get = "GET".parse().map_err(|_| {
            ExecError::Client(ClientError::Decode { op: op.into(), message: "GET".into() })
        })?;
        session
            .client()
            .request(get, url)
            .header("accept", "application/json")
            .header("user-agent", call.user_agent)
            .send_unchecked()
            .await?
    } else {
        let mut rb = match method {
            Method::Get => session.get(svc, path),
            Method::Post => session.post(svc, path),
            Method::Put => session.put(svc, path),
            Method::Delete => session.delete(svc, path),
        };
        rb = rb.header("accept", "application/json").header("user-agent", call.user_agent);
        if !query.is_empty() {
            rb = rb.query(query);
        }
        if let Some(b) = body {
            rb = rb.json(b);
        }
        if microversion {
            rb = rb
                .header("openstack-api-version", format!("compute {COMPUTE_MICROVERSION}"))
                .header("x-openstack-nova-api-version", COMPUTE_MICROVERSION);
        }
        rb.send_unchecked().await?
    };
    let status = resp.status().as_u16();
    let retry_after =
        resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(parse_retry_after);
    let too_large =
        || ExecError::Client(ClientError::TooLarge { op: op.to_string(), limit: MAX_BODY });
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let mut bytes = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(osauth::Error::from)? {
        if bytes.len() + chunk.len() > MAX_BODY {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Reply { status, retry_after, body: bytes })
}

fn decode(op: &str, bytes: &[u8]) -> Result<Value, ClientError> {
    serde_json::from_slice(bytes).map_err(|e| ClientError::Decode {
        op: op.into(),
        message: format!(
            "not JSON ({} bytes): line {}, column {}",
            bytes.len(),
            e.line(),
            e.column()
        ),
    })
}

fn decode_or_null(op: &str, bytes: &[u8]) -> Result<Value, ClientError> {
    if bytes.iter().all(u8::is_ascii_whitespace) { Ok(Value::Null) } else { decode(op, bytes) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operations_carry_upstreams_request_names() {
        for (op, request) in [
            ("nova:GetServer", "server_get"),
            ("nova:ListServers", "server_list"),
            ("nova:GetFlavor", "flavor_get"),
            ("neutron:CreateFloatingIP", "floating_ip_create"),
            ("neutron:UpdateFloatingIP", "floating_ip_update"),
            ("neutron:AddExtraRoutes", "router_update"),
            ("neutron:ListExtensions", "network_extension_list"),
            ("neutron:DeleteSecurityGroupRule", "security_group_rule_delete"),
            ("octavia:CreateLoadBalancer", "loadbalancer_create"),
            ("octavia:ListVersions", "version_list"),
            ("octavia:CreateMember", "loadbalancer_member_create"),
            ("octavia:ListPools", "loadbalancer_pool_list"),
            ("octavia:BatchUpdateMembers", "loadbalancer_members_update"),
            ("octavia:ListMembers", "loadbalancer_member_list"),
            ("octavia:GetHealthMonitor", "loadbalancer_healthmonitor_get"),
            ("keystone:Frobnicate", "frobnicate"),
        ] {
            assert_eq!(metric_request(op), request, "{op}");
        }
    }

    #[test]
    fn user_agent_values_are_prepended_as_upstream_does() {
        let v = |xs: &[&str]| xs.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(user_agent_with(&[]).ok().as_deref(), Some(DEFAULT_USER_AGENT));
        assert!(DEFAULT_USER_AGENT.starts_with("openstack-cloud-controller-manager/v"));
        // Upstream prepends each value in turn: the last given comes first.
        assert_eq!(
            user_agent_with(&v(&["a/b", "c/d"])).ok(),
            Some(format!("c/d a/b {DEFAULT_USER_AGENT}"))
        );
        assert_eq!(
            user_agent_with(&v(&["cluster/abc-123", "", "a b"])).ok(),
            Some(format!("a b cluster/abc-123 {DEFAULT_USER_AGENT}"))
        );
        let err = user_agent_with(&v(&["ok", "bad\r\nx-injected: 1"])).err().map(|e| e.to_string());
        assert_eq!(
            err.as_deref(),
            Some("OpenStack client: --user-agent: value #2 holds a control character")
        );
    }

    #[test]
    fn set_user_agents_changes_what_calls_send() {
        let global = Global {
            auth_url: "https://keystone.example:5000/v3".into(),
            username: "u".into(),
            password: Secret("p".into()),
            ..Default::default()
        };
        let client = OpenStackClient::new(&global, ClientOptions::default()).expect("client");
        assert_eq!(&*client.user_agent(), DEFAULT_USER_AGENT);
        client.set_user_agents(vec!["cluster/abc-123".into()]).expect("valid");
        assert_eq!(&*client.user_agent(), format!("cluster/abc-123 {DEFAULT_USER_AGENT}"));
        assert!(client.set_user_agents(vec!["\u{7}".into()]).is_err());
        // A refused value leaves the previous one in place.
        assert_eq!(&*client.user_agent(), format!("cluster/abc-123 {DEFAULT_USER_AGENT}"));
    }

    #[test]
    fn openstack_error_bodies_are_parsed() {
        let e = parse_error(
            "nova:GetServer",
            Some(Service::Compute),
            404,
            None,
            br#"{"itemNotFound": {"code": 404, "message": "Instance x could not be found."}}"#,
        );
        assert!(e.is_not_found());
        assert_eq!(
            e.to_string(),
            "OpenStack nova:GetServer: HTTP 404 itemNotFound: Instance x could not be found."
        );
        let e = parse_error(
            "neutron:UpdateRouter",
            Some(Service::Network),
            400,
            None,
            br#"{"NeutronError": {"type": "InvalidRoutes", "message": "bad nexthop", "detail": ""}}"#,
        );
        assert_eq!(
            e.to_string(),
            "OpenStack neutron:UpdateRouter: HTTP 400 InvalidRoutes: bad nexthop"
        );
        assert_eq!(e.classify(), Classified::Permanent);
        let e = parse_error(
            "octavia:UpdateLoadBalancer",
            Some(Service::LoadBalancer),
            409,
            None,
            br#"{"faultcode": "Client", "faultstring": "Load Balancer x is immutable", "debuginfo": null}"#,
        );
        assert!(e.is_conflict());
        assert!(e.to_string().ends_with("HTTP 409 Client: Load Balancer x is immutable"), "{e}");
        let e = parse_error(
            "keystone",
            None,
            401,
            None,
            br#"{"error": {"code": 401, "title": "Unauthorized", "message": "requires authentication"}}"#,
        );
        assert!(e.to_string().ends_with("HTTP 401 Unauthorized: requires authentication"), "{e}");
        let e = parse_error("x", None, 503, Some(Duration::from_secs(2)), b"<html>\n busy </html>");
        assert_eq!(
            e.classify(),
            Classified::Transient { retry_after: Some(Duration::from_secs(2)) }
        );
        assert_eq!(e.classify_create(), Classified::Permanent);
        assert!(e.to_string().ends_with("HTTP 503: <html> busy </html>"), "{e}");
        let e = parse_error("x", None, 429, None, b"");
        assert!(matches!(e.classify_create(), Classified::Transient { .. }));
        assert!(matches!(ProviderError::from(e), ProviderError::Throttled(_)));
        let e = parse_error("x", None, 500, None, &vec![b'a'; 2000]);
        assert!(e.to_string().len() < 600);
    }

    #[test]
    fn only_the_called_services_typed_404_is_not_found() {
        let nf = |svc: Service, body: &str| parse_error("x", Some(svc), 404, None, body.as_bytes());
        let nova =
            r#"{"itemNotFound": {"code": 404, "message": "Instance s-1 could not be found."}}"#;
        let neutron = r#"{"NeutronError": {"type": "PortNotFound", "message": "Port p-1 could not be found.", "detail": ""}}"#;
        let octavia = r#"{"faultcode": "Client", "faultstring": "Load Balancer l-1 could not be found.", "debuginfo": null}"#;
        assert!(nf(Service::Compute, nova).is_not_found());
        assert!(nf(Service::Network, neutron).is_not_found());
        assert!(nf(Service::LoadBalancer, octavia).is_not_found());
        // Another service's shape: the wrong endpoint answered.
        assert!(!nf(Service::Compute, neutron).is_not_found());
        assert!(!nf(Service::Compute, octavia).is_not_found());
        assert!(!nf(Service::Network, nova).is_not_found());
        assert!(!nf(Service::LoadBalancer, neutron).is_not_found());
        // Pages, other JSON, near misses.
        for body in [
            "<html><body><h1>Not Found</h1><p>/compute/v2.1/servers/s-1 itemNotFound</p></body></html>",
            "404 page not found",
            "",
            r#"{"message": "s-1 not found", "code": 404}"#,
            r#"{"itemNotFound": "Instance s-1 could not be found."}"#,
            r#"{"itemNotFound": {"code": 500, "message": "x"}}"#,
            r#"{"itemNotFound": {"code": 404, "message": "x"}, "other": 1}"#,
            r#"{"error": {"code": 404, "title": "Not Found", "message": "s-1"}}"#,
        ] {
            assert!(!nf(Service::Compute, body).is_not_found(), "{body}");
        }
        assert!(!nf(Service::Network, r#"{"NeutronError": "Port p-1 not found"}"#).is_not_found());
        assert!(
            !nf(Service::Network, r#"{"NeutronError": {"type": "BadRequest", "message": "x"}}"#)
                .is_not_found()
        );
        assert!(
            !nf(Service::LoadBalancer, r#"{"faultcode": "Server", "faultstring": "x"}"#)
                .is_not_found()
        );
        // Not a 404, or Keystone's: never.
        assert!(
            !parse_error("x", Some(Service::Compute), 400, None, nova.as_bytes()).is_not_found()
        );
        assert!(!parse_error("x", None, 404, None, nova.as_bytes()).is_not_found());
    }

    #[test]
    fn osauth_errors_keep_their_status() {
        let e = osauth::Error::new(osauth::ErrorKind::InvalidInput, "status: Some(999) in text")
            .with_status(429u16.try_into().unwrap());
        assert_eq!(osauth_status(&e), Some(429));
        let c = from_osauth("op", &e);
        assert_eq!(c.status(), Some(429));
        assert!(matches!(c.classify(), Classified::Transient { .. }));
        // osauth's 404s come without the body: a 404, never "not found".
        let e = osauth::Error::new(osauth::ErrorKind::ResourceNotFound, "gone");
        assert_eq!(from_osauth("op", &e).status(), Some(404));
        assert!(!from_osauth("op", &e).is_not_found());
        let e = osauth::Error::new(osauth::ErrorKind::ProtocolError, "connection refused");
        assert!(matches!(from_osauth("op", &e).classify(), Classified::Transient { .. }));
        let e = osauth::Error::new(osauth::ErrorKind::AuthenticationFailed, "no");
        assert!(matches!(from_osauth("op", &e), ClientError::Unauthorized { .. }));
    }
}
