//! The OpenStack client: one Keystone v3 token (our own authentication, [`crate::keystone`])
//! shared by every call, and JSON calls to the catalog's services ([`OpenStackClient::get`],
//! [`OpenStackClient::list`], …) on one `reqwest` client (rustls with the process's aws-lc-rs
//! provider, as every other cloud here).
//!
//! - **Token**: [`OpenStackClient::new`] sends nothing. The first call authenticates against
//!   Keystone (`POST <auth-url>/auth/tokens`) and keeps the token and its catalog (the
//!   endpoints are those of `[Global] region` and `os-endpoint-type`). A token is renewed
//!   before it expires (within 2 minutes of `expires_at`, or half the lifetime of a short one).
//!   When a service answers **401** (the token was revoked or expired early) the token is
//!   dropped, a new one is requested and the call is sent once more; concurrent calls refused
//!   with the same token share one re-authentication. A second 401 is
//!   [`ClientError::Unauthorized`].
//! - **Credentials** (`[Global]`, as upstream's gophercloud reads them): password by
//!   `username` (in `user-domain-id|name`, else `domain-id|name`, else `Default`) or by
//!   `user-id`; project by `tenant-id`, or `tenant-name` in `tenant-domain-id|name` (else
//!   `domain-id|name`); no project but `domain-id|name`: a domain-scoped token (as
//!   gophercloud's clientconfig), which the project-scoped services refuse (403: the error
//!   says the token has no project); application credential by ID, or by name with `user-id` or
//!   `username`; a pre-issued `token`; a trust (`trust-id` with `trustee-id`/`trustee-password`,
//!   else `user-id`/`password`: the Magnum layout). Secrets never appear in `Debug`, logs or
//!   errors.
//! - **TLS**: `ca-file` is the set of trusted roots (as upstream, instead of the system's);
//!   `cert-file`/`key-file` a client certificate; `tls-insecure = true` skips verification
//!   (a warning at start).
//! - **Errors**: OpenStack's error bodies (Nova `{"itemNotFound": {"code","message"}}`,
//!   Neutron `{"NeutronError": {"type","message","detail"}}`, Octavia
//!   `{"faultcode","faultstring"}`, Keystone `{"error": {"code","title","message"}}`, Barbican
//!   `{"code","title","description"}`) become
//!   [`ClientError::Api`] naming the call, the status, OpenStack's code and message.
//!   **Not found** ([`ClientError::is_not_found`]) only when the service called answered 404
//!   with its own typed JSON error: Nova `{"itemNotFound": {"code": 404, "message"}}`,
//!   Neutron `{"NeutronError": {"type": "<Kind>NotFound", …}}`, Octavia
//!   `{"faultcode": "Client", "faultstring": …}`, Barbican `{"code": 404, "title",
//!   "description"}`. An HTML or plain-text 404 page (a proxy, a
//!   gateway), a JSON body of another shape, another service's shape, or Keystone's 404 is
//!   an error like any other, never "gone".
//! - **Plain HTTP**: `auth-url` and every catalog endpoint must be `https://`, unless the host
//!   is loopback (a warning) or `[Global] allow-insecure-http = true` (a warning).
//! - **Reply size**: a reply body larger than [`MAX_BODY`] is an error naming the call
//!   (nothing larger is read).
//! - **Deadlines and retries**: every call (authentication, every page, every retry
//!   included) runs under one [`Deadline`] of [`ClientOptions::timeout`]. Idempotent calls
//!   (GET, PUT, DELETE) are retried on 429, 500, 502, 503, 504 (honouring `Retry-After`) and
//!   on broken connections with [`ClientOptions::retry`]. Creates (`POST`) are retried only on
//!   429: a 5xx or a dropped connection may follow a create that was carried out.
//! - **Nova microversion**: raw Compute calls ask for microversion 2.47 (the server's flavor
//!   is embedded with its `original_name`); a Nova older than that (406) is asked again
//!   without, once, and from then on never with.
//! - **Paging**: [`OpenStackClient::list`] follows `<key>_links` `rel=next` (`marker`) to the
//!   end.
//!
//! No cloud-call metrics: core has no shared helper and the crate does not depend on
//! `prometheus-client` (AWS has its own); see the crate README.

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, SystemTime};

use ccm_core::cloud::ProviderError;
use ccm_core::cloud_call::api_metrics::{self, ApiMetrics};
use ccm_core::cloud_call::{Classified, Deadline, DeadlineExceeded, Retry, parse_retry_after};
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::Mutex;

use crate::config::Global;
use crate::keystone::{Auth, Token};

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
    /// Barbican (catalog type `key-manager`, API v1): TLS containers and secrets.
    KeyManager,
}

impl Service {
    /// The Keystone catalog type.
    pub fn catalog_type(self) -> &'static str {
        match self {
            Service::Compute => "compute",
            Service::Network => "network",
            Service::LoadBalancer => "load-balancer",
            Service::KeyManager => "key-manager",
        }
    }

    /// The versioned root of the API on the catalog's `endpoint`, as upstream's gophercloud
    /// builds it: Nova's catalog URL as it is (it names `v2.1`, maybe with the project),
    /// Neutron's and Octavia's with `v2.0` / `v2` added unless the URL ends in a version.
    pub fn versioned_root(self, endpoint: &url::Url) -> url::Url {
        let mut url = endpoint.clone();
        let ends_in_version = endpoint
            .path_segments()
            .and_then(|mut s| s.rfind(|x| !x.is_empty()))
            .is_some_and(is_version_segment);
        let add = match self {
            Service::Compute => None,
            Service::Network => Some("v2.0"),
            Service::LoadBalancer => Some("v2"),
            Service::KeyManager => Some("v1"),
        };
        if let (Some(v), false) = (add, ends_in_version)
            && let Ok(mut segs) = url.path_segments_mut()
        {
            segs.pop_if_empty().push(v);
        }
        url
    }
}

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
    /// The server refused the TLS handshake over the client certificate (mutual TLS): none
    /// was sent and it requires one, or it does not trust the one of `[Global] cert-file`.
    /// Permanent: the same handshake is refused again.
    #[error(
        "OpenStack {op}: {url}: the server refused the TLS handshake (TLS alert {alert}): {hint}"
    )]
    ClientCertificate {
        /// The call.
        op: String,
        /// The endpoint (scheme, host, port and path).
        url: String,
        /// rustls' name of the server's alert (`CertificateRequired`, `UnknownCA`...).
        alert: String,
        /// What to do, naming `[Global] cert-file` and `key-file`.
        hint: String,
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
        /// What is missing, and what the catalog has.
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
    /// of another service, Keystone's) is not: uncertain is an error, never "gone".
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
        // {"code": 404, "title": "Not Found", "description": "Secrets container not found."}
        Service::KeyManager => {
            obj.get("code").and_then(Value::as_u64) == Some(404)
                && obj.get("title").is_some_and(Value::is_string)
                && obj.get("description").is_some_and(Value::is_string)
        }
    }
}

/// OpenStack's error bodies: Nova `{"<kind>": {"code","message"}}`, Neutron
/// `{"NeutronError": {"type","message","detail"}}` (or a bare string), Octavia
/// `{"faultcode","faultstring"}`, Keystone `{"error": {"code","title","message"}}`, Barbican
/// `{"code","title","description"}`.
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
    } else if let Some(d) = v.get("description").filter(|d| d.is_string()) {
        // Barbican: {"code", "title", "description"}.
        (s(v.get("title")).unwrap_or_default(), s(Some(d)))
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

/// A live token and its generation (bumped on every re-authentication).
struct Live {
    generation: u64,
    token: Token,
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
    /// `<auth-url>[/v3]/auth/tokens`.
    tokens_url: url::Url,
    region: String,
    /// `os-endpoint-type`: `public`, `internal` or `admin`.
    interface: String,
    auth: Auth,
    /// The HTTP client of every call (Keystone's included): `ca-file`, client certificate,
    /// `tls-insecure`.
    http: reqwest::Client,
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
            .field("method", &self.auth.method())
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

/// The HTTP client `[Global]` describes: `ca-file` as the trusted roots (upstream's
/// `certutil.NewPool`: only those), `cert-file`/`key-file` as the client certificate,
/// `tls-insecure = true` skipping verification (a warning). Bounded connects. No I/O beyond
/// reading the files.
fn http_client(g: &Global) -> Result<reqwest::Client, ClientError> {
    let mut b = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .pool_idle_timeout(Duration::from_secs(60));
    let read = |key: &str, path: &Path| {
        std::fs::read(path)
            .map_err(|e| config_error(key, format!("cannot read {}: {e}", path.display())))
    };
    if let Some(path) = &g.ca_file {
        let key = "[Global] ca-file";
        let pem = read(key, path)?;
        let certs = reqwest::Certificate::from_pem_bundle(&pem)
            .map_err(|e| config_error(key, format!("{} is not PEM: {e}", path.display())))?;
        if certs.is_empty()
            || !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----")
        {
            return Err(config_error(key, format!("{} holds no PEM certificate", path.display())));
        }
        b = b.tls_certs_only(certs);
    }
    match (&g.cert_file, &g.key_file) {
        (Some(cert), Some(key)) => {
            let mut pem = read("[Global] cert-file", cert)?;
            if !String::from_utf8_lossy(&pem).contains("-----BEGIN CERTIFICATE-----") {
                return Err(config_error(
                    "[Global] cert-file",
                    format!("{} holds no PEM certificate", cert.display()),
                ));
            }
            pem.push(b'\n');
            let key_pem = read("[Global] key-file", key)?;
            let key_text = String::from_utf8_lossy(&key_pem);
            // An encrypted key (PKCS#8 `ENCRYPTED PRIVATE KEY`, or OpenSSL's legacy
            // `Proc-Type: 4,ENCRYPTED` header) cannot be used without its passphrase, which
            // no key of cloud.conf gives (upstream's Go client cannot read one either).
            if key_text.contains("-----BEGIN ENCRYPTED PRIVATE KEY-----")
                || key_text.contains("Proc-Type: 4,ENCRYPTED")
            {
                return Err(config_error(
                    "[Global] key-file",
                    format!(
                        "{} is an encrypted private key: give it unencrypted (PEM; PKCS#8, \
                         PKCS#1 or SEC1), e.g. `openssl pkey -in <key> -out <key>.pem`",
                        key.display()
                    ),
                ));
            }
            if !key_text.contains("PRIVATE KEY-----") {
                return Err(config_error(
                    "[Global] key-file",
                    format!("{} holds no PEM private key", key.display()),
                ));
            }
            pem.extend_from_slice(&key_pem);
            // The error text of a bad key never quotes it (rustls' PEM reader names the
            // section, not its bytes).
            let identity = reqwest::Identity::from_pem(&pem).map_err(|_| {
                config_error(
                    "[Global] cert-file",
                    format!(
                        "{} and {} are not a usable certificate and private key (PEM; PKCS#8, \
                         PKCS#1 or SEC1 key)",
                        cert.display(),
                        key.display()
                    ),
                )
            })?;
            b = b.identity(identity);
        }
        (Some(_), None) => {
            return Err(config_error("[Global] key-file", "required with cert-file"));
        }
        (None, Some(_)) => {
            return Err(config_error("[Global] cert-file", "required with key-file"));
        }
        (None, None) => {}
    }
    if g.tls_insecure {
        tracing::warn!(
            auth_url = %g.auth_url,
            "OpenStack: [Global] tls-insecure = true: TLS certificates are not verified (anyone \
             on the path can read the credentials and tokens); give the CA with ca-file instead"
        );
        b = b.tls_danger_accept_invalid_certs(true);
    }
    b.build().map_err(|e| config_error("[Global]", format!("building the HTTP client: {e}")))
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
        let auth =
            Auth::from_global(global).map_err(|e| config_error(e.key, e.message.to_string()))?;
        let tokens_url = crate::keystone::tokens_url(&parsed)
            .map_err(|m| config_error("[Global] auth-url", m))?;
        let interface = match non_empty(&global.endpoint_type) {
            None => "public".to_string(),
            Some(t) => match t.to_ascii_lowercase().trim_end_matches("url") {
                i @ ("public" | "internal" | "admin") => i.to_string(),
                _ => {
                    return Err(config_error(
                        "[Global] os-endpoint-type",
                        format!("{t:?} is not one of public, internal, admin"),
                    ));
                }
            },
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
        let http = http_client(global)?;
        Ok(OpenStackClient {
            auth_url,
            tokens_url,
            region: global.region.trim().to_string(),
            interface,
            auth,
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

    // ---- token -------------------------------------------------------------------------

    /// The live token, authenticating first when there is none or it is about to expire.
    async fn live(&self, op: &str) -> Result<Arc<Live>, ClientError> {
        let mut slot = self.live.lock().await;
        if let Some(live) = slot.as_ref() {
            if !live.token.needs_renewal(SystemTime::now()) {
                return Ok(live.clone());
            }
            tracing::debug!(op, generation = live.generation, "OpenStack: renewing the token");
        }
        let token = self.authenticate(op).await?;
        let generation = self.generation.fetch_add(1, Ordering::AcqRel) + 1;
        let live = Arc::new(Live { generation, token });
        *slot = Some(live.clone());
        tracing::debug!(
            auth_url = %self.auth_url,
            method = self.auth.method(),
            generation,
            "OpenStack: authenticated"
        );
        Ok(live)
    }

    /// Drops the token of `generation` (a service refused it): the next call requests a new
    /// one. A newer token (another call re-authenticated already) is kept.
    async fn forget(&self, generation: u64) {
        let mut slot = self.live.lock().await;
        if slot.as_ref().is_some_and(|l| l.generation == generation) {
            *slot = None;
        }
    }

    /// A new token (one Keystone token request). Keystone's refusal is
    /// [`ClientError::Unauthorized`] naming the method, never a credential.
    async fn authenticate(&self, op: &str) -> Result<Token, ClientError> {
        let url = &self.tokens_url;
        let host = url.host_str().unwrap_or_default();
        let shown = shown_url(url.scheme(), host, url.port(), url.path());
        self.http_policy.check(op, "Keystone (auth-url)", url.scheme(), host, &shown)?;
        let body = self.auth.request_body();
        let sent = self
            .http
            .post(url.clone())
            .header("accept", "application/json")
            .header("user-agent", DEFAULT_USER_AGENT)
            .json(&body)
            .send()
            .await;
        drop(body);
        let resp = sent.map_err(|e| transport(op, &shown, &e))?;
        let subject =
            resp.headers().get("x-subject-token").and_then(|v| v.to_str().ok()).map(str::to_string);
        let reply = read_reply(op, resp).await?;
        match reply.status {
            200..=299 => {
                let v = decode(op, &reply.body)?;
                crate::keystone::parse_token(subject.as_deref(), &v).map_err(|message| {
                    ClientError::Decode {
                        op: op.to_string(),
                        message: format!("Keystone: {message}"),
                    }
                })
            }
            status => {
                let message = match parse_error(op, None, status, reply.retry_after, &reply.body) {
                    ClientError::Api { code, message, retry_after, .. } if status != 401 => {
                        return Err(ClientError::Api {
                            op: op.to_string(),
                            status,
                            code,
                            message: format!(
                                "Keystone refused the {} credentials: {message}",
                                self.auth.method()
                            ),
                            retry_after,
                            not_found: false,
                        });
                    }
                    ClientError::Api { message, .. } => message,
                    other => other.to_string(),
                };
                Err(ClientError::Unauthorized {
                    op: op.to_string(),
                    message: format!(
                        "Keystone refused the {} credentials: {message}",
                        self.auth.method()
                    ),
                })
            }
        }
    }

    /// The project the current token is scoped to (authenticating first when needed): the
    /// trustor's project for a trust.
    pub async fn project_id(&self) -> Result<Option<String>, ClientError> {
        let op = "keystone:Authenticate";
        let deadline = Deadline::new(self.options.timeout);
        let live = deadline.try_run(op, self.live(op)).await?;
        Ok(live.token.project_id.clone())
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
            let endpoint = live
                .token
                .catalog
                .endpoint(svc.catalog_type(), &self.region, &self.interface)
                .map_err(|message| ClientError::Catalog { op: op.to_string(), message })?;
            let reply = exec(&self.http, &live.token, &endpoint, &call, microversion).await?;
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
                    let e = parse_error(op, Some(svc), status, reply.retry_after, &reply.body);
                    return Err(scope_hint(e, &live.token));
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
    /// under one deadline. Each page is decoded straight into `T`s (never held as JSON
    /// values: a listing of 5000 servers as `Value`s was a third of the manager's heap, #35).
    pub async fn list<T: DeserializeOwned>(
        &self,
        op: &'static str,
        svc: Service,
        path: &[&str],
        query: &[(&str, String)],
        key: &str,
    ) -> Result<Vec<T>, ClientError> {
        let deadline = Deadline::new(self.options.timeout);
        let started = std::time::Instant::now();
        let result = deadline.try_run(op, self.list_pages(op, svc, path, query, key)).await;
        record_call(op, started, &result);
        result
    }

    async fn list_pages<T: DeserializeOwned>(
        &self,
        op: &'static str,
        svc: Service,
        path: &[&str],
        query: &[(&str, String)],
        key: &str,
    ) -> Result<Vec<T>, ClientError> {
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
            let page: Page<T> = decode_page(op, &reply.body, key, &links_key)?;
            let Some(list) = page.items else {
                return Err(ClientError::Decode {
                    op: op.into(),
                    message: format!("no {key:?} array in the reply"),
                });
            };
            items.extend(list);
            let next = page
                .links
                .as_ref()
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

/// A service's 403 to a token scoped to no project (a domain-scoped token: `domain-id` or
/// `domain-name` without `tenant-id`/`tenant-name`) says so: every API this provider calls
/// is project-scoped.
fn scope_hint(e: ClientError, token: &Token) -> ClientError {
    match e {
        ClientError::Api { op, status: 403, code, message, retry_after, not_found }
            if token.project_id.is_none() =>
        {
            let scope = match &token.domain {
                Some(d) => format!("scoped to the domain {d:?}"),
                None => "unscoped".to_string(),
            };
            ClientError::Api {
                op,
                status: 403,
                code,
                message: format!(
                    "{message} (the Keystone token is {scope}, not to a project: set [Global] \
                     tenant-id or tenant-name)"
                ),
                retry_after,
                not_found,
            }
        }
        other => other,
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

/// The TLS alert of a server that refused this client's certificate, or its absence, when
/// `e` was caused by one: rustls' typed error, found in the cause chain (also inside an
/// `io::Error`, whose `source` skips it), never read from the message text.
fn client_certificate_alert(e: &reqwest::Error) -> Option<rustls::AlertDescription> {
    use rustls::AlertDescription as A;
    let mut source: Option<&(dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = source {
        let tls = err.downcast_ref::<rustls::Error>().or_else(|| {
            err.downcast_ref::<std::io::Error>()
                .and_then(std::io::Error::get_ref)
                .and_then(|inner| inner.downcast_ref::<rustls::Error>())
        });
        if let Some(rustls::Error::AlertReceived(alert)) = tls
            && matches!(
                alert,
                A::CertificateRequired
                    | A::BadCertificate
                    | A::UnknownCA
                    | A::CertificateUnknown
                    | A::UnsupportedCertificate
                    | A::CertificateRevoked
                    | A::CertificateExpired
                    | A::AccessDenied
                    | A::HandshakeFailure
            )
        {
            return Some(*alert);
        }
        source = err.source();
    }
    None
}

/// A request that did not complete (connect, TLS, reset), naming the URL (no credential: an
/// `auth-url` with user information is refused) and the cause chain. A handshake the server
/// refused over the client certificate is [`ClientError::ClientCertificate`].
fn transport(op: &str, shown: &str, e: &reqwest::Error) -> ClientError {
    if let Some(alert) = client_certificate_alert(e) {
        let hint = match alert {
            rustls::AlertDescription::CertificateRequired => {
                "it requires a client certificate and none was sent: set [Global] cert-file \
                 and key-file (PEM) to a certificate signed by a CA the server trusts"
            }
            rustls::AlertDescription::HandshakeFailure => {
                "if it requires a client certificate, set [Global] cert-file and key-file (PEM) \
                 to one signed by a CA the server trusts"
            }
            _ => {
                "it did not accept the client certificate of [Global] cert-file (not signed by \
                 a CA it trusts, expired, or not for client authentication), or requires one \
                 and none was set"
            }
        };
        return ClientError::ClientCertificate {
            op: op.to_string(),
            url: shown.to_string(),
            alert: format!("{alert:?}"),
            hint: hint.to_string(),
        };
    }
    let mut message = format!("{shown}: ");
    let mut parts: Vec<String> = Vec::new();
    let mut source: Option<&dyn std::error::Error> = Some(e);
    while let Some(err) = source {
        let text = err.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = err.source();
    }
    message.push_str(&parts.join(": "));
    ClientError::Transport { op: op.to_string(), message: truncate(message) }
}

/// Reads a reply: status, `Retry-After`, and the body up to [`MAX_BODY`].
async fn read_reply(op: &str, mut resp: reqwest::Response) -> Result<Reply, ClientError> {
    let status = resp.status().as_u16();
    let retry_after =
        resp.headers().get("retry-after").and_then(|v| v.to_str().ok()).and_then(parse_retry_after);
    let too_large = || ClientError::TooLarge { op: op.to_string(), limit: MAX_BODY };
    if resp.content_length().is_some_and(|n| n > MAX_BODY as u64) {
        return Err(too_large());
    }
    let shown = {
        let u = resp.url();
        shown_url(u.scheme(), u.host_str().unwrap_or_default(), u.port(), u.path())
    };
    let mut bytes = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(|e| transport(op, &shown, &e))? {
        if bytes.len() + chunk.len() > MAX_BODY {
            return Err(too_large());
        }
        bytes.extend_from_slice(&chunk);
    }
    Ok(Reply { status, retry_after, body: bytes })
}

/// Sends one raw request with `token` to the catalog's `endpoint` of the call's service: the
/// endpoint checked for plain HTTP first; the reply body read up to [`MAX_BODY`].
async fn exec(
    http: &reqwest::Client,
    token: &Token,
    endpoint: &url::Url,
    call: &Call<'_>,
    microversion: bool,
) -> Result<Reply, ClientError> {
    let Call { op, method, path, query, body, .. } = *call;
    let host = endpoint.host_str().unwrap_or_default();
    let shown = shown_url(endpoint.scheme(), host, endpoint.port(), endpoint.path());
    call.policy.check(op, call.svc.catalog_type(), endpoint.scheme(), host, &shown)?;
    let mut url = if call.root {
        unversioned_root(endpoint)
    } else {
        let mut url = call.svc.versioned_root(endpoint);
        url.set_query(None);
        if let Ok(mut segs) = url.path_segments_mut() {
            segs.pop_if_empty().extend(path);
        }
        url
    };
    if !call.root && !query.is_empty() {
        let mut pairs = url.query_pairs_mut();
        for (k, v) in query {
            pairs.append_pair(k, v);
        }
    }
    url.set_fragment(None);
    let shown_call = shown_url(url.scheme(), host, url.port(), url.path());
    let m = match (call.root, method) {
        (true, _) | (false, Method::Get) => reqwest::Method::GET,
        (false, Method::Post) => reqwest::Method::POST,
        (false, Method::Put) => reqwest::Method::PUT,
        (false, Method::Delete) => reqwest::Method::DELETE,
    };
    let mut rb = http
        .request(m, url)
        .header("accept", "application/json")
        .header("user-agent", call.user_agent);
    // Octavia's version list is unauthenticated on a default deployment; the token is sent
    // anyway (gophercloud does).
    rb = rb.header("x-auth-token", token.value.expose());
    if let (false, Some(b)) = (call.root, body) {
        rb = rb.json(b);
    }
    if microversion && !call.root {
        rb = rb
            .header("openstack-api-version", format!("compute {COMPUTE_MICROVERSION}"))
            .header("x-openstack-nova-api-version", COMPUTE_MICROVERSION);
    }
    let resp = rb.send().await.map_err(|e| transport(op, &shown_call, &e))?;
    read_reply(op, resp).await
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

/// One page of a list reply: its `key` array (absent: `None`) and its `<key>_links`.
struct Page<T> {
    items: Option<Vec<T>>,
    links: Option<Value>,
}

/// Decodes a page as [`Page`], skipping every other member unread.
struct PageSeed<'a, T> {
    key: &'a str,
    links_key: &'a str,
    item: std::marker::PhantomData<T>,
}

impl<'de, T: DeserializeOwned> serde::de::DeserializeSeed<'de> for PageSeed<'_, T> {
    type Value = Page<T>;
    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Page<T>, D::Error> {
        d.deserialize_map(self)
    }
}

impl<'de, T: DeserializeOwned> serde::de::Visitor<'de> for PageSeed<'_, T> {
    type Value = Page<T>;
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "an object with a {:?} array", self.key)
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Page<T>, A::Error> {
        let mut page = Page { items: None, links: None };
        while let Some(k) = map.next_key::<String>()? {
            if k == self.key {
                page.items = Some(map.next_value()?);
            } else if k == self.links_key {
                page.links = Some(map.next_value()?);
            } else {
                map.next_value::<serde::de::IgnoredAny>()?;
            }
        }
        Ok(page)
    }
}

fn decode_page<T: DeserializeOwned>(
    op: &str,
    bytes: &[u8],
    key: &str,
    links_key: &str,
) -> Result<Page<T>, ClientError> {
    use serde::de::DeserializeSeed;
    let seed = PageSeed { key, links_key, item: std::marker::PhantomData };
    let mut de = serde_json::Deserializer::from_slice(bytes);
    seed.deserialize(&mut de).and_then(|page| de.end().map(|()| page)).map_err(|e| {
        let message = if e.is_data() {
            format!("a {key:?} page: {}", ccm_core::cloud_call::strip_quoted_values(&e.to_string()))
        } else {
            format!("not JSON ({} bytes): line {}, column {}", bytes.len(), e.line(), e.column())
        };
        ClientError::Decode { op: op.into(), message }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Secret;

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
    fn a_list_page_is_decoded_into_its_items_and_skips_the_rest() {
        #[derive(Debug, serde::Deserialize, PartialEq)]
        struct Item {
            id: String,
        }
        let body = br#"{"servers": [{"id": "a", "huge": {"x": [1, 2, 3]}}, {"id": "b"}],
            "servers_links": [{"rel": "next", "href": "https://n/servers?marker=b"}],
            "other": {"deep": [null, true]}}"#;
        let page: Page<Item> = decode_page("op", body, "servers", "servers_links").unwrap();
        let ids: Vec<&str> = page.items.iter().flatten().map(|i| i.id.as_str()).collect();
        assert_eq!(ids, ["a", "b"]);
        assert!(page.links.is_some_and(|l| l[0]["href"] == "https://n/servers?marker=b"));
        // No array: no items (the caller's error); another key's array is not taken.
        let page: Page<Item> =
            decode_page("op", br#"{"ports": [{"id": "p"}]}"#, "servers", "servers_links").unwrap();
        assert!(page.items.is_none());
        // An item of the wrong shape names the listing, never the value it carried.
        let e = decode_page::<Item>(
            "op",
            br#"{"servers": [{"id": 7}, {"id": "s3cr3t"}]}"#,
            "servers",
            "servers_links",
        )
        .err()
        .map(|e| e.to_string())
        .unwrap_or_default();
        assert!(e.contains("\"servers\" page") && e.contains("invalid type"), "{e}");
        #[derive(Debug, serde::Deserialize)]
        struct Numbered {
            #[allow(dead_code)]
            n: u64,
        }
        let e = decode_page::<Numbered>("op", br#"{"servers": [{"n": "s3cr3t"}]}"#, "servers", "x")
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(!e.contains("s3cr3t") && e.contains("invalid type: string"), "{e}");
        // Not JSON, or JSON with trailing garbage: the size and position only.
        for body in [&b"<html>s3cr3t</html>"[..], br#"{"servers": []} s3cr3t"#] {
            let e = decode_page::<Item>("op", body, "servers", "x").err().map(|e| e.to_string());
            let e = e.unwrap_or_default();
            assert!(e.contains("not JSON") && !e.contains("s3cr3t"), "{e}");
        }
    }
}
