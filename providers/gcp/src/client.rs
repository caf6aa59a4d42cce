//! The Compute Engine client: credentials, the SDK's per-service clients, the cluster's scope,
//! Compute errors, deadlines, retries and waiting for `Operation`s.
//!
//! Owns every byte the provider sends to Google:
//! - credentials as upstream chooses them (`gce.conf` `token-url`): the metadata server's
//!   service-account token by default (`google-cloud-auth`'s MDS credentials, which honour
//!   `GCE_METADATA_HOST` as Google's Go libraries do), a `token-url` answering
//!   `{"accessToken","expireTime"}` to a `POST` of `token-body` (upstream's `AltTokenSource`),
//!   or Application Default Credentials for `token-url = nil`;
//! - the `google-cloud-compute-v1` clients ([`Compute`]), built once on first use, pointed at
//!   `api-endpoint` when the config sets one (the SDK's own retries are off: [`GceClient::call`]
//!   and [`GceClient::mutate`] retry, under one deadline per call);
//! - metadata-server reads ([`GceClient::metadata`], `Metadata-Flavor: Google`);
//! - the cluster's [`Scope`] (project, region, managed zones, network), discovered once;
//! - [`GceError`]: Compute's error reply (HTTP status, `errors[0].reason`, message) named by
//!   the operation, never a token.

use std::fmt;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ccm_core::cloud::ProviderError;
use ccm_core::cloud_call::api_metrics::{self, ApiMetrics};
use ccm_core::cloud_call::{Classified, Deadline, DeadlineExceeded, Retry};
use google_cloud_auth::credentials::{
    CacheableResource, Credentials, CredentialsProvider, EntityTag, mds,
};
use google_cloud_compute_v1::client as gc;
use google_cloud_compute_v1::model::Operation;
use google_cloud_compute_v1::model::operation::Status as OpStatus;
use google_cloud_gax::error::CredentialsError;
use http::{Extensions, HeaderMap, HeaderValue};
use serde_json::Value;
use tokio::sync::{Mutex, OnceCell};

use crate::config::{self, Global, StackType};

/// Where Compute is when the config names no `api-endpoint`.
pub const DEFAULT_ENDPOINT: &str = "https://compute.googleapis.com";
/// Compute's resource links (what `selfLink`s and references start with).
pub const LINK_PREFIX: &str = "https://www.googleapis.com/compute/v1/";
/// The metadata server's host when `GCE_METADATA_HOST` is unset.
pub const METADATA_HOST: &str = "metadata.google.internal";
/// The environment variable naming another metadata server host (as Google's libraries).
pub const METADATA_HOST_ENV: &str = "GCE_METADATA_HOST";
/// The largest reply body this client reads itself (`token-url` and metadata-server replies,
/// a few hundred bytes in practice): a larger one is an error, never read to the end.
pub const MAX_REPLY: usize = 4 << 20;

/// Bounds of one cloud call, and how operations are polled.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Each call (all its retries included) and each wait for an operation ends by then.
    pub deadline: Deadline,
    /// Retries of transient faults (throttling, 5xx, broken connections) within a call.
    pub retry: Retry,
    /// How often a running operation is polled (first poll after this, doubling to 4×).
    pub poll_interval: Duration,
    /// How long a mutation's operation may run before the call fails (upstream waits without
    /// a bound; an operation still running after this is an error, retried next sync).
    pub operation_timeout: Duration,
    /// Compute's root URL, overriding the config's `api-endpoint` (tests).
    pub endpoint: Option<String>,
    /// The metadata server's root URL (`http://host:port`), overriding `GCE_METADATA_HOST`
    /// (tests).
    pub metadata_endpoint: Option<String>,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            deadline: Deadline::default(),
            retry: Retry::default(),
            poll_interval: Duration::from_millis(500),
            operation_timeout: Duration::from_secs(300),
            endpoint: None,
            metadata_endpoint: None,
        }
    }
}

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The credentials could not be set up.
    #[error("GCE credentials: {0}")]
    Credentials(String),
    /// An HTTP client could not be built.
    #[error("building the HTTP client: {0}")]
    Http(String),
}

/// A failed Compute (or metadata-server) call.
#[derive(Debug, thiserror::Error)]
pub enum GceError {
    /// Compute answered with an error.
    #[error("{operation}: {status} {reason}: {message}")]
    Api {
        /// Compute's method, e.g. `compute.instances.get`.
        operation: &'static str,
        /// The HTTP status.
        status: u16,
        /// `errors[0].reason` (`notFound`, `alreadyExists`, `conditionNotMet`,
        /// `resourceInUseByAnotherResource`, `rateLimitExceeded`, …), or empty.
        reason: String,
        /// Compute's message.
        message: String,
    },
    /// The mutation was accepted but its `Operation` finished with errors (Compute's code
    /// shown, as the Event a user reads should name it).
    #[error("{operation}: operation {name} failed: {code}: {message}")]
    Operation {
        /// The mutation.
        operation: &'static str,
        /// The operation's name.
        name: String,
        /// The operation's first error code (`RESOURCE_IN_USE_BY_ANOTHER_RESOURCE`, …).
        code: String,
        /// Its errors' messages.
        message: String,
    },
    /// The request did not get an answer (connection refused or reset, TLS, timeout of one
    /// attempt), or the answer did not parse.
    #[error("{operation}: {message}")]
    Transport {
        /// Compute's method.
        operation: &'static str,
        /// What failed (never a header or a body).
        message: String,
    },
    /// No credential could be obtained (metadata server, token URL or ADC).
    #[error("{operation}: no credentials: {message}")]
    Auth {
        /// The call that needed them.
        operation: &'static str,
        /// Why (never the token).
        message: String,
    },
    /// The metadata server did not answer as expected.
    #[error("metadata server {path}: {message}")]
    Metadata {
        /// The path under `/computeMetadata/v1/`.
        path: String,
        /// What failed.
        message: String,
    },
    /// The cluster's scope cannot be worked out (e.g. no project id in the config and no
    /// metadata server).
    #[error("GCE scope: {0}")]
    Scope(String),
    /// The call (with its retries, or the wait for its operation) ran out of time.
    #[error(transparent)]
    Deadline(#[from] DeadlineExceeded),
    /// Not a failure: the mutation was accepted and its operation is still running; it was
    /// not waited for ([`GceClient::mutate_within`]), and the caller resumes once it is done.
    #[error("{operation}: operation {name} still running")]
    Running {
        /// The mutation.
        operation: &'static str,
        /// The operation's name.
        name: String,
        /// The operation, as last read.
        op: Box<Operation>,
    },
}

impl GceError {
    /// [`GceError::Running`] for `op` of mutation `operation`.
    pub fn running(operation: &'static str, op: Operation) -> Self {
        GceError::Running { operation, name: op.name.clone().unwrap_or_default(), op: Box::new(op) }
    }

    fn reason(&self) -> Option<(u16, &str)> {
        match self {
            GceError::Api { status, reason, .. } => Some((*status, reason.as_str())),
            _ => None,
        }
    }

    /// Compute answered 404 with its typed reason `notFound` (from its JSON error body): the
    /// named resource does not exist. Any other 404 (a proxy's or a gateway's page, a wrong
    /// endpoint) is an error like any other, never "gone".
    pub fn is_not_found(&self) -> bool {
        matches!(self.reason(), Some((404, "notFound")))
    }

    /// Compute answered 409 `alreadyExists`.
    pub fn is_already_exists(&self) -> bool {
        matches!(self.reason(), Some((409, _)))
    }

    /// Compute answered 412 `conditionNotMet` (a stale fingerprint).
    pub fn is_precondition(&self) -> bool {
        matches!(self.reason(), Some((412, _)))
    }

    /// The resource is still used by another (`resourceInUseByAnotherResource`, as a reply or
    /// as the operation's error).
    pub fn is_in_use(&self) -> bool {
        match self {
            GceError::Api { reason, .. } => reason == "resourceInUseByAnotherResource",
            GceError::Operation { code, .. } => code == "RESOURCE_IN_USE_BY_ANOTHER_RESOURCE",
            _ => false,
        }
    }

    /// Compute throttled the call: HTTP 429, or reason `rateLimitExceeded` /
    /// `userRateLimitExceeded` (Compute answers them as 403), read from the JSON error body's
    /// `errors[0].reason` (or the SDK's `ErrorInfo`), never from the message text. A 403
    /// `quotaExceeded` is a quota (a resource count), not a throttle: not retried.
    pub fn is_throttled(&self) -> bool {
        matches!(self.reason(), Some((429, _)) | Some((_, "rateLimitExceeded")))
            || matches!(self.reason(), Some((403, "userRateLimitExceeded")))
    }

    fn transient_read(&self) -> bool {
        match self {
            GceError::Api { status, .. } => {
                self.is_throttled() || matches!(status, 500 | 502 | 503 | 504)
            }
            GceError::Transport { .. } => true,
            GceError::Auth { .. } | GceError::Metadata { .. } => false,
            _ => false,
        }
    }
}

impl From<GceError> for ProviderError {
    fn from(e: GceError) -> Self {
        if e.is_throttled() {
            return ProviderError::Throttled(e.to_string());
        }
        ProviderError::with_source(e.to_string(), e)
    }
}

/// Maps the SDK's error to ours: Compute's status, reason and message, or what kept the
/// request from being answered.
fn from_gax(operation: &'static str, e: google_cloud_gax::error::Error) -> GceError {
    if let Some(status) = e.http_status_code() {
        let body: Value =
            e.http_payload().and_then(|p| serde_json::from_slice(p).ok()).unwrap_or(Value::Null);
        let err = &body["error"];
        // The SDK keeps the body only when it is not a Google error; for one, `errors[]`
        // becomes the status's `ErrorInfo` details.
        let reason = err["errors"][0]["reason"]
            .as_str()
            .map(str::to_string)
            .or_else(|| {
                e.status()?.details.iter().find_map(|d| match d {
                    google_cloud_gax::error::rpc::StatusDetails::ErrorInfo(i)
                        if !i.reason.is_empty() =>
                    {
                        Some(i.reason.clone())
                    }
                    _ => None,
                })
            })
            .unwrap_or_default();
        let message = err["message"]
            .as_str()
            .map(str::to_string)
            .or_else(|| e.status().map(|s| s.message.clone()))
            .unwrap_or_else(|| format!("HTTP {status}"));
        return GceError::Api { operation, status, reason, message: clip(&message) };
    }
    if let Some(s) = e.status() {
        // A service error without HTTP metadata: map the gRPC-style code to its HTTP status.
        let status = match s.code as i32 {
            5 => 404,
            6 => 409,
            9 => 412,
            8 => 429,
            7 => 403,
            16 => 401,
            14 => 503,
            _ => 500,
        };
        return GceError::Api {
            operation,
            status,
            reason: String::new(),
            message: clip(&s.message),
        };
    }
    if e.is_authentication() {
        return GceError::Auth { operation, message: clip(&source_chain(&e)) };
    }
    GceError::Transport { operation, message: clip(&source_chain(&e)) }
}

/// An error and its sources, joined (the SDK's errors carry no credentials or bodies in their
/// `Display`).
fn source_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(s) = cur {
        let m = s.to_string();
        if !out.contains(&m) {
            out.push_str(": ");
            out.push_str(&m);
        }
        cur = s.source();
    }
    out
}

/// Keeps an error message to a readable size.
fn clip(s: &str) -> String {
    const MAX: usize = 400;
    if s.len() <= MAX {
        return s.to_string();
    }
    let mut end = MAX;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &s[..end])
}

/// The SDK clients the provider calls, built once.
pub struct Compute {
    /// `compute.instances`.
    pub instances: gc::Instances,
    /// `compute.zones`.
    pub zones: gc::Zones,
    /// `compute.addresses` (regional).
    pub addresses: gc::Addresses,
    /// `compute.forwardingRules` (regional).
    pub forwarding_rules: gc::ForwardingRules,
    /// `compute.targetPools`.
    pub target_pools: gc::TargetPools,
    /// `compute.httpHealthChecks` (legacy, global).
    pub http_health_checks: gc::HttpHealthChecks,
    /// `compute.healthChecks` (global: the internal load balancer's, as upstream's).
    pub health_checks: gc::HealthChecks,
    /// `compute.regionHealthChecks` (the internal load balancer's before they moved to global
    /// ones: found and replaced on the next sync, deleted with their load balancer).
    pub region_health_checks: gc::RegionHealthChecks,
    /// `compute.networks` (reads: the network's mode, for an auto-mode network's subnetwork).
    pub networks: gc::Networks,
    /// `compute.subnetworks` (reads: the auto-mode network's subnetwork of the region).
    pub subnetworks: gc::Subnetworks,
    /// `compute.regionBackendServices`.
    pub region_backend_services: gc::RegionBackendServices,
    /// `compute.instanceGroups` (zonal, unmanaged).
    pub instance_groups: gc::InstanceGroups,
    /// `compute.firewalls`.
    pub firewalls: gc::Firewalls,
    /// `compute.routes`.
    pub routes: gc::Routes,
    zone_operations: gc::ZoneOperations,
    region_operations: gc::RegionOperations,
    global_operations: gc::GlobalOperations,
}

impl fmt::Debug for Compute {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Compute")
    }
}

/// Builds one SDK client on Compute's endpoint with our credentials and the SDK's retries
/// off (ours run around every call).
macro_rules! build {
    ($ty:ty, $what:literal, $endpoint:expr, $credentials:expr) => {
        <$ty>::builder()
            .with_endpoint($endpoint.clone())
            .with_credentials($credentials.clone())
            .with_retry_policy(google_cloud_gax::retry_policy::NeverRetry)
            .build()
            .await
            .map_err(|e| GceError::Transport {
                operation: $what,
                message: format!("building the Compute client: {e}"),
            })?
    };
}

/// The cluster's place in GCE, worked out once from the config and the metadata server.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Scope {
    /// The project of the cluster's instances (`project-id`, else the metadata server's).
    pub project: String,
    /// The project of the network (`network-project-id`, else `project`).
    pub network_project: String,
    /// The region (the local zone without its last `-x`).
    pub region: String,
    /// The zone the manager runs in (`local-zone`, else the metadata server's).
    pub local_zone: String,
    /// The zones whose instances are the cluster's: every zone of the region for `multizone`
    /// or `regional`, else the local zone only.
    pub zones: Vec<String>,
    /// The cluster network's link (`…/projects/<network project>/global/networks/<name>`).
    pub network_url: String,
    /// The subnetwork's link, when `subnetwork-name` names one.
    pub subnetwork_url: Option<String>,
    /// `node-tags` (empty: the load balancer computes them from the instances).
    pub node_tags: Vec<String>,
    /// `node-instance-prefix`.
    pub node_instance_prefix: Option<String>,
    /// `stack-type`.
    pub stack_type: StackType,
}

/// The region of `zone`: the zone without its last `-x` (upstream's `GetGCERegion`).
pub fn region_of_zone(zone: &str) -> &str {
    zone.rsplit_once('-').map_or(zone, |(r, _)| r)
}

/// The last path segment of a link (`…/zones/us-central1-a` → `us-central1-a`).
pub fn last_segment(link: &str) -> &str {
    link.trim_end_matches('/').rsplit('/').next().unwrap_or(link)
}

/// The link to `path` (`projects/…`), as Compute writes references.
pub fn link(path: &str) -> String {
    format!("{LINK_PREFIX}{}", path.trim_start_matches('/'))
}

/// The client: credentials, Compute, the metadata server, the scope.
pub struct GceClient {
    global: Global,
    options: ClientOptions,
    endpoint: String,
    metadata_root: String,
    credentials: Credentials,
    http: reqwest::Client,
    compute: OnceCell<Compute>,
    scope: OnceCell<Arc<Scope>>,
}

impl fmt::Debug for GceClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GceClient")
            .field("endpoint", &self.endpoint)
            .field("metadata", &self.metadata_root)
            .finish_non_exhaustive()
    }
}

/// The metadata server root from `GCE_METADATA_HOST` (or the default host).
pub fn metadata_root_from_env() -> String {
    let host = std::env::var(METADATA_HOST_ENV)
        .ok()
        .filter(|h| !h.trim().is_empty())
        .unwrap_or_else(|| METADATA_HOST.to_string());
    if host.starts_with("http://") || host.starts_with("https://") {
        host.trim_end_matches('/').to_string()
    } else {
        format!("http://{}", host.trim_end_matches('/'))
    }
}

/// Compute's root URL from `api-endpoint`: upstream's value is the Go client's base path
/// (`https://www.googleapis.com/compute/v1/`), the Rust client wants the root (it adds
/// `/compute/v1/…` itself).
pub fn endpoint_root(api_endpoint: &url::Url) -> String {
    let s = api_endpoint.as_str().trim_end_matches('/');
    let s = s.strip_suffix("/compute/v1").unwrap_or(s);
    let s = s.strip_suffix("/compute/beta").unwrap_or(s);
    s.to_string()
}

/// Upstream's label value for a region or zone a call does not have.
pub const UNUSED_LABEL: &str = "<n/a>";

/// Upstream's `request` label (`<resource>_<verb>`: `instances_get`, `forwardingrule_create`,
/// `address_reserve`, `targetpool_add_instances`, ...) of a Compute method
/// (`compute.<collection>.<method>`), and whether upstream labels it with the region.
pub fn metric_request(operation: &str) -> (String, bool) {
    let mut parts = operation.split('.').skip_while(|p| *p == "compute");
    let collection = parts.next().unwrap_or_default();
    let method = parts.next().unwrap_or_default();
    let (resource, regional) = match collection {
        "instances" => ("instances", false),
        "forwardingRules" => ("forwardingrule", true),
        "globalForwardingRules" => ("forwardingrule", false),
        "addresses" => ("address", true),
        "globalAddresses" => ("address", false),
        "targetPools" => ("targetpool", true),
        "firewalls" => ("firewall", false),
        "httpHealthChecks" | "healthChecks" => ("healthcheck", false),
        "regionHealthChecks" => ("healthcheck", true),
        "backendServices" => ("backendservice", false),
        "regionBackendServices" => ("backendservice", true),
        "instanceGroups" => ("instancegroup", false),
        "routes" => ("routes", false),
        "zones" => ("zones", true),
        "zoneOperations" | "regionOperations" | "globalOperations" => ("operations", false),
        other => return (format!("{}_{}", api_metrics::snake_case(other), method), false),
    };
    let verb = match (resource, method) {
        ("address", "insert") => "reserve".to_string(),
        (_, "insert") => "create".to_string(),
        (_, "patch") => "update".to_string(),
        (_, "addInstance") => "add_instances".to_string(),
        (_, "removeInstance") => "remove_instances".to_string(),
        (_, "getHealth") => "get_health".to_string(),
        (_, other) => api_metrics::snake_case(other),
    };
    (format!("{resource}_{verb}"), regional)
}

impl GceClient {
    /// A client for `global` (no request is sent: credentials, clients and the scope are
    /// set up on the first call).
    pub fn new(global: &Global, options: ClientOptions) -> Result<Self, ClientError> {
        let metadata_root =
            options.metadata_endpoint.clone().unwrap_or_else(metadata_root_from_env);
        let endpoint = options
            .endpoint
            .clone()
            .or_else(|| global.api_endpoint.as_ref().map(endpoint_root))
            .unwrap_or_else(|| DEFAULT_ENDPOINT.to_string());
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| ClientError::Http(e.to_string()))?;
        let credentials = match &global.credentials {
            config::Credentials::Metadata => mds::Builder::default()
                .with_endpoint(metadata_root.clone())
                .build()
                .map_err(|e| ClientError::Credentials(e.to_string()))?,
            config::Credentials::ApplicationDefault => {
                google_cloud_auth::credentials::Builder::default()
                    .build()
                    .map_err(|e| ClientError::Credentials(e.to_string()))?
            }
            config::Credentials::TokenUrl { url, body } => Credentials::from(AltToken {
                url: url.clone(),
                body: body.as_ref().map(|b| b.0.clone()).unwrap_or_default(),
                http: http.clone(),
                timeout: options.deadline.timeout,
                cached: Mutex::new(None),
            }),
        };
        Ok(GceClient {
            global: global.clone(),
            options,
            endpoint,
            metadata_root,
            credentials,
            http,
            compute: OnceCell::new(),
            scope: OnceCell::new(),
        })
    }

    /// The options the client was built with.
    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    /// The config's `[global]`.
    pub fn global(&self) -> &Global {
        &self.global
    }

    /// Compute's root URL.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The SDK clients, built on first use.
    pub async fn compute(&self) -> Result<&Compute, GceError> {
        self.compute
            .get_or_try_init(|| async {
                let (e, c) = (&self.endpoint, &self.credentials);
                Ok(Compute {
                    instances: build!(gc::Instances, "instances", e, c),
                    zones: build!(gc::Zones, "zones", e, c),
                    addresses: build!(gc::Addresses, "addresses", e, c),
                    forwarding_rules: build!(gc::ForwardingRules, "forwardingRules", e, c),
                    target_pools: build!(gc::TargetPools, "targetPools", e, c),
                    http_health_checks: build!(gc::HttpHealthChecks, "httpHealthChecks", e, c),
                    health_checks: build!(gc::HealthChecks, "healthChecks", e, c),
                    region_health_checks: build!(
                        gc::RegionHealthChecks,
                        "regionHealthChecks",
                        e,
                        c
                    ),
                    networks: build!(gc::Networks, "networks", e, c),
                    subnetworks: build!(gc::Subnetworks, "subnetworks", e, c),
                    region_backend_services: build!(
                        gc::RegionBackendServices,
                        "regionBackendServices",
                        e,
                        c
                    ),
                    instance_groups: build!(gc::InstanceGroups, "instanceGroups", e, c),
                    firewalls: build!(gc::Firewalls, "firewalls", e, c),
                    routes: build!(gc::Routes, "routes", e, c),
                    zone_operations: build!(gc::ZoneOperations, "zoneOperations", e, c),
                    region_operations: build!(gc::RegionOperations, "regionOperations", e, c),
                    global_operations: build!(gc::GlobalOperations, "globalOperations", e, c),
                })
            })
            .await
    }

    /// Every item of a paged Compute list (`pageToken` until the reply has no
    /// `nextPageToken`): one [`Self::call_in`] per page, so each page has the deadline, the
    /// shared retry and its API metrics; `page(token)` sends the request for one page
    /// (`None`: the first). A token that comes back unchanged is an error (the listing would
    /// never end).
    pub async fn list_all<P, F, Fut>(
        &self,
        operation: &'static str,
        zone: Option<&str>,
        page: F,
    ) -> Result<Vec<P::Item>, GceError>
    where
        P: ListPage,
        F: FnMut(Option<String>) -> Fut,
        Fut: Future<Output = google_cloud_gax::Result<P>>,
    {
        self.list_all_map(operation, zone, page, Some).await
    }

    /// [`Self::list_all`], each page's items passed through `keep` as the page arrives (what
    /// is kept of thousands of instances is all the listing holds, #35); `None` drops one.
    pub async fn list_all_map<P, F, Fut, T>(
        &self,
        operation: &'static str,
        zone: Option<&str>,
        mut page: F,
        mut keep: impl FnMut(P::Item) -> Option<T>,
    ) -> Result<Vec<T>, GceError>
    where
        P: ListPage,
        F: FnMut(Option<String>) -> Fut,
        Fut: Future<Output = google_cloud_gax::Result<P>>,
    {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let (items, next) =
                Box::pin(self.call_in(operation, zone, || page(token.clone()))).await?.into_page();
            out.extend(items.into_iter().filter_map(&mut keep));
            match next.filter(|t| !t.is_empty()) {
                None => return Ok(out),
                Some(t) if token.as_ref() == Some(&t) => {
                    let zone = zone.map(|z| format!("zone {z}: ")).unwrap_or_default();
                    return Err(GceError::Transport {
                        operation,
                        message: format!("{zone}the page token repeats"),
                    });
                }
                Some(t) => token = Some(t),
            }
        }
    }

    /// One read (or any idempotent call) under the deadline, retried on throttling, 5xx
    /// and broken connections. `operation` names Compute's method in errors and logs.
    pub async fn call<T, F, Fut>(&self, operation: &'static str, f: F) -> Result<T, GceError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = google_cloud_gax::Result<T>>,
    {
        self.call_in(operation, None, f).await
    }

    /// [`Self::call`] for a call in `zone` (upstream's `zone` label of the API metrics).
    pub async fn call_in<T, F, Fut>(
        &self,
        operation: &'static str,
        zone: Option<&str>,
        f: F,
    ) -> Result<T, GceError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = google_cloud_gax::Result<T>>,
    {
        let started = std::time::Instant::now();
        let result = self.call_unmetered(operation, f).await;
        self.record_call(operation, zone, started, &result);
        result
    }

    /// Records one finished call in upstream's `cloudprovider_gce_api_*` families.
    fn record_call<T>(
        &self,
        operation: &str,
        zone: Option<&str>,
        started: std::time::Instant,
        result: &Result<T, GceError>,
    ) {
        let (request, regional) = metric_request(operation);
        let region = match (regional, self.scope.get()) {
            (true, Some(scope)) if !scope.region.is_empty() => scope.region.as_str(),
            _ => UNUSED_LABEL,
        };
        let zone = zone.filter(|z| !z.is_empty()).unwrap_or(UNUSED_LABEL);
        let error = result.as_ref().err().map(|_| "error");
        ApiMetrics::of(&api_metrics::GCE).call_finished(
            &[request.as_str(), region, zone, "v1"],
            started.elapsed(),
            error,
        );
    }

    async fn call_unmetered<T, F, Fut>(
        &self,
        operation: &'static str,
        mut f: F,
    ) -> Result<T, GceError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = google_cloud_gax::Result<T>>,
    {
        self.options
            .retry
            .run(&self.options.deadline, operation, classify_read, || {
                let fut = f();
                async move { fut.await.map_err(|e| from_gax(operation, e)) }
            })
            .await
    }

    /// A mutation: sent (retried only when Compute throttled it, as a throttled request was
    /// not applied), then its `Operation` polled until `DONE`. An operation that ends with
    /// errors is [`GceError::Operation`].
    pub async fn mutate<F, Fut>(&self, operation: &'static str, f: F) -> Result<(), GceError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = google_cloud_gax::Result<Operation>>,
    {
        let started = std::time::Instant::now();
        let result = async {
            let op = self.send_mutation(operation, f).await?;
            self.wait(operation, op).await
        }
        .await;
        // As upstream: the call's latency includes waiting for its operation.
        self.record_call(operation, None, started, &result);
        result
    }

    /// A mutation sent as [`Self::mutate`] sends it, its operation polled for at most
    /// `inline` (from the send): `Ok` when it finished in that time, [`GceError::Running`]
    /// (carrying the operation) when it is still running then, [`GceError::Operation`] when
    /// it failed. Compute takes seconds to minutes per operation; a caller that has other
    /// work (the next Service) parks the operation and reads it again later
    /// ([`Self::operation`]).
    pub async fn mutate_within<F, Fut>(
        &self,
        operation: &'static str,
        inline: Duration,
        f: F,
    ) -> Result<(), GceError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = google_cloud_gax::Result<Operation>>,
    {
        let started = std::time::Instant::now();
        let result = async {
            let op = self.send_mutation(operation, f).await?;
            match self.poll(operation, op, started, inline).await? {
                None => Ok(()),
                Some(op) => Err(GceError::running(operation, op)),
            }
        }
        .await;
        // Only a finished call counts: a running one is recorded when it is read to its end.
        if !matches!(result, Err(GceError::Running { .. })) {
            self.record_call(operation, None, started, &result);
        }
        result
    }

    /// How long an operation is waited for at most ([`ClientOptions::operation_timeout`]).
    pub fn operation_timeout(&self) -> Duration {
        self.options.operation_timeout
    }

    /// Records a mutation whose operation [`Self::mutate_within`] left running, once a later
    /// read found it finished: its latency runs from `started` (the send), as a waited one's.
    pub fn record_finished(
        &self,
        operation: &'static str,
        started: std::time::Instant,
        result: &Result<(), GceError>,
    ) {
        self.record_call(operation, None, started, result);
    }

    /// A mutation sent as [`Self::mutate`] sends it (retried only when Compute throttled
    /// it), its `Operation` returned as Compute answered, not waited for: read it again with
    /// [`Self::operation`] and judge it with [`operation_outcome`].
    pub async fn start<F, Fut>(&self, operation: &'static str, f: F) -> Result<Operation, GceError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = google_cloud_gax::Result<Operation>>,
    {
        let started = std::time::Instant::now();
        let result = self.send_mutation(operation, f).await;
        self.record_call(operation, None, started, &result);
        result
    }

    async fn send_mutation<F, Fut>(
        &self,
        operation: &'static str,
        mut f: F,
    ) -> Result<Operation, GceError>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = google_cloud_gax::Result<Operation>>,
    {
        self.options
            .retry
            .run(&self.options.deadline, operation, classify_mutation, || {
                let fut = f();
                async move { fut.await.map_err(|e| from_gax(operation, e)) }
            })
            .await
    }

    /// One read of `op` (from its zone's, region's or the global operations, as it names
    /// them), under the call deadline. An operation without a name is an error.
    pub async fn operation(
        &self,
        operation: &'static str,
        op: &Operation,
    ) -> Result<Operation, GceError> {
        let Some(name) = op.name.as_deref().filter(|n| !n.is_empty()) else {
            return Err(GceError::Transport {
                operation,
                message: "Compute answered with an operation without a name".into(),
            });
        };
        self.get_operation(op, name).await
    }

    /// Polls `op` until it is `DONE` (bounded by [`ClientOptions::operation_timeout`]).
    pub async fn wait(&self, operation: &'static str, op: Operation) -> Result<(), GceError> {
        let deadline = Deadline::new(self.options.operation_timeout);
        deadline
            .try_run(operation, async {
                // No window of its own: it reads until DONE, and the deadline ends it first.
                match self.poll(operation, op, std::time::Instant::now(), Duration::MAX).await? {
                    None => Ok(()),
                    Some(op) => Err(GceError::running(operation, op)),
                }
            })
            .await
    }

    /// Reads `op` again, from the poll interval backing off to four times it, until it is
    /// `DONE` (`Ok(None)`, or [`GceError::Operation`] when it failed) or `window` has passed
    /// since `since` (`Ok(Some(op))`, as last read).
    async fn poll(
        &self,
        operation: &'static str,
        mut op: Operation,
        since: std::time::Instant,
        window: Duration,
    ) -> Result<Option<Operation>, GceError> {
        let name = op.name.clone().unwrap_or_default();
        let mut interval = self.options.poll_interval;
        loop {
            if let Some(outcome) = operation_outcome(operation, &op) {
                return outcome.map(|()| None);
            }
            let left = window.saturating_sub(since.elapsed());
            if left.is_zero() {
                return Ok(Some(op));
            }
            tokio::time::sleep(interval.min(left)).await;
            interval = (interval * 2).min(self.options.poll_interval * 4);
            op = self.get_operation(&op, &name).await?;
        }
    }

    async fn get_operation(&self, op: &Operation, name: &str) -> Result<Operation, GceError> {
        let c = self.compute().await?;
        let project = op
            .self_link
            .as_deref()
            .and_then(|l| l.split("/projects/").nth(1))
            .and_then(|l| l.split('/').next())
            .map(str::to_string);
        let project = match project {
            Some(p) => p,
            None => self.scope().await?.project.clone(),
        };
        if let Some(zone) = op.zone.as_deref().filter(|z| !z.is_empty()) {
            let zone = last_segment(zone).to_string();
            self.call_unmetered("compute.zoneOperations.get", || {
                c.zone_operations
                    .get()
                    .set_project(project.clone())
                    .set_zone(zone.clone())
                    .set_operation(name)
                    .send()
            })
            .await
        } else if let Some(region) = op.region.as_deref().filter(|r| !r.is_empty()) {
            let region = last_segment(region).to_string();
            self.call_unmetered("compute.regionOperations.get", || {
                c.region_operations
                    .get()
                    .set_project(project.clone())
                    .set_region(region.clone())
                    .set_operation(name)
                    .send()
            })
            .await
        } else {
            self.call_unmetered("compute.globalOperations.get", || {
                c.global_operations.get().set_project(project.clone()).set_operation(name).send()
            })
            .await
        }
    }

    /// A metadata-server value (`path` under `/computeMetadata/v1/`), trimmed.
    pub async fn metadata(&self, path: &str) -> Result<String, GceError> {
        metadata_get(&self.http, &self.metadata_root, path, self.options.deadline).await
    }

    /// The cluster's scope: from the config, the metadata server for what it leaves out, and
    /// `zones.list` for the region's zones (multizone/regional). Worked out once.
    pub async fn scope(&self) -> Result<Arc<Scope>, GceError> {
        self.scope.get_or_try_init(|| async { self.discover().await.map(Arc::new) }).await.cloned()
    }

    async fn discover(&self) -> Result<Scope, GceError> {
        let g = &self.global;
        let project = match &g.project_id {
            Some(p) => p.clone(),
            None => self.metadata("project/project-id").await?,
        };
        let network_project = g.network_project_id.clone().unwrap_or_else(|| project.clone());
        let local_zone = match &g.local_zone {
            Some(z) => z.clone(),
            None => last_segment(&self.metadata("instance/zone").await?).to_string(),
        };
        if local_zone.is_empty() {
            return Err(GceError::Scope("the local zone is empty".into()));
        }
        let region = region_of_zone(&local_zone).to_string();
        let network_url = match &g.network_name {
            Some(n) if n.contains("/") => absolute_link(n),
            Some(n) => link(&format!("projects/{network_project}/global/networks/{n}")),
            None => {
                let n = self.metadata("instance/network-interfaces/0/network").await?;
                link(&format!("projects/{network_project}/global/networks/{}", last_segment(&n)))
            }
        };
        let subnetwork_url = g.subnetwork_name.as_ref().map(|s| {
            if s.contains('/') {
                absolute_link(s)
            } else {
                link(&format!("projects/{network_project}/regions/{region}/subnetworks/{s}"))
            }
        });
        let zones = if g.multizone || g.regional {
            self.region_zones(&project, &region).await?
        } else {
            vec![local_zone.clone()]
        };
        let scope = Scope {
            project,
            network_project,
            region,
            local_zone,
            zones,
            network_url,
            subnetwork_url,
            node_tags: g.node_tags.clone(),
            node_instance_prefix: g.node_instance_prefix.clone(),
            stack_type: g.stack_type,
        };
        tracing::info!(
            project = %scope.project,
            region = %scope.region,
            zones = ?scope.zones,
            network = %scope.network_url,
            "GCE scope"
        );
        Ok(scope)
    }

    async fn region_zones(&self, project: &str, region: &str) -> Result<Vec<String>, GceError> {
        let c = self.compute().await?;
        let filter = format!("region eq .*/regions/{region}");
        let mut zones: Vec<String> = self
            .list_all("compute.zones.list", None, |token| {
                c.zones
                    .list()
                    .set_project(project)
                    .set_filter(filter.clone())
                    .set_or_clear_page_token(token)
                    .send()
            })
            .await?
            .into_iter()
            .filter(|z| z.region.as_deref().map(last_segment) == Some(region))
            .filter_map(|z| z.name)
            .collect();
        if zones.is_empty() {
            return Err(GceError::Scope(format!("region {region} has no zones")));
        }
        zones.sort();
        Ok(zones)
    }
}

/// A reference the config gave as a (possibly partial) URL, made absolute.
fn absolute_link(s: &str) -> String {
    if s.starts_with("https://") || s.starts_with("http://") {
        s.to_string()
    } else {
        link(s.trim_start_matches('/'))
    }
}

/// One page of a Compute list reply: its items and the next page's token.
pub trait ListPage {
    /// What the list holds.
    type Item;
    /// The page's items and the token of the next page (`None` or empty: the last page).
    fn into_page(self) -> (Vec<Self::Item>, Option<String>);
}

macro_rules! list_page {
    ($($list:ident => $item:ident),* $(,)?) => {$(
        impl ListPage for google_cloud_compute_v1::model::$list {
            type Item = google_cloud_compute_v1::model::$item;
            fn into_page(self) -> (Vec<Self::Item>, Option<String>) {
                (self.items, self.next_page_token)
            }
        }
    )*};
}

list_page!(
    AddressList => Address,
    ForwardingRuleList => ForwardingRule,
    InstanceGroupList => InstanceGroup,
    InstanceGroupsListInstances => InstanceWithNamedPorts,
    InstanceList => Instance,
    RouteList => Route,
    SubnetworkList => Subnetwork,
    ZoneList => Zone,
);

/// The outcome of `op`, a mutation `operation` started: `None` while it is not `DONE`, then
/// `Ok` or the [`GceError::Operation`] naming its error.
pub fn operation_outcome(operation: &'static str, op: &Operation) -> Option<Result<(), GceError>> {
    (op.status == Some(OpStatus::Done)).then(|| operation_result(operation, op))
}

fn operation_result(operation: &'static str, op: &Operation) -> Result<(), GceError> {
    let Some(err) = op.error.as_ref().filter(|e| !e.errors.is_empty()) else {
        return Ok(());
    };
    let code = err.errors[0].code.clone().unwrap_or_default();
    let message = err
        .errors
        .iter()
        .map(|e| e.message.clone().or_else(|| e.code.clone()).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("; ");
    Err(GceError::Operation {
        operation,
        name: op.name.clone().unwrap_or_default(),
        code,
        message: clip(&message),
    })
}

/// A throttled read is [`Classified::Throttled`] (Compute did not serve it: retried until the
/// call's deadline, not counted against `Retry::attempts`); 5xx and broken connections are
/// transient (counted); everything else is permanent. Compute sends no `Retry-After` with
/// `rateLimitExceeded`, and the SDK error carries none to us: the shared backoff paces it.
fn classify_read(e: &GceError) -> Classified {
    if e.is_throttled() {
        Classified::Throttled { retry_after: None }
    } else if e.transient_read() {
        Classified::Transient { retry_after: None }
    } else {
        Classified::Permanent
    }
}

/// A mutation is retried only when throttled (a throttled request was not applied), until the
/// call's deadline; any other error (a 5xx may follow a change that was made) is permanent.
fn classify_mutation(e: &GceError) -> Classified {
    if e.is_throttled() {
        Classified::Throttled { retry_after: None }
    } else {
        Classified::Permanent
    }
}

/// One metadata-server read with `Metadata-Flavor: Google`, under `deadline`, retried on
/// broken connections and 5xx.
pub async fn metadata_get(
    http: &reqwest::Client,
    root: &str,
    path: &str,
    deadline: Deadline,
) -> Result<String, GceError> {
    let url = format!("{root}/computeMetadata/v1/{}", path.trim_start_matches('/'));
    let err = |message: String| GceError::Metadata { path: path.to_string(), message };
    let transient = |e: &GceError| match e {
        GceError::Metadata { message, .. } if message.starts_with("transient") => {
            Classified::Transient { retry_after: None }
        }
        _ => Classified::Permanent,
    };
    Retry::default()
        .run(&deadline, "metadata.get", transient, || async {
            let resp = http
                .get(&url)
                .header("Metadata-Flavor", "Google")
                .send()
                .await
                .map_err(|e| err(format!("transient: {}", source_chain(&e.without_url()))))?;
            let status = resp.status();
            if status.is_server_error() {
                return Err(err(format!("transient: HTTP {status}")));
            }
            if !status.is_success() {
                return Err(err(format!("HTTP {status}")));
            }
            if resp.headers().get("Metadata-Flavor").map(HeaderValue::as_bytes)
                != Some(b"Google".as_slice())
            {
                return Err(err("the answer lacks `Metadata-Flavor: Google`".into()));
            }
            let body = read_capped(resp).await.map_err(|e| match e {
                ReadError::Broken(m) => err(format!("transient: {m}")),
                ReadError::TooLarge => err(format!("the reply is larger than {MAX_REPLY} bytes")),
            })?;
            let text =
                String::from_utf8(body).map_err(|_| err("the reply is not UTF-8 text".into()))?;
            Ok(text.trim().to_string())
        })
        .await
}

/// Why a reply body could not be read.
enum ReadError {
    /// The connection broke off (worth another attempt).
    Broken(String),
    /// Over [`MAX_REPLY`].
    TooLarge,
}

/// A reply's body, at most [`MAX_REPLY`] bytes (checked against `Content-Length` first, then
/// as it arrives). Errors never hold the URL.
async fn read_capped(mut resp: reqwest::Response) -> Result<Vec<u8>, ReadError> {
    if resp.content_length().is_some_and(|n| n > MAX_REPLY as u64) {
        return Err(ReadError::TooLarge);
    }
    let mut body = Vec::new();
    while let Some(chunk) =
        resp.chunk().await.map_err(|e| ReadError::Broken(source_chain(&e.without_url())))?
    {
        if body.len() + chunk.len() > MAX_REPLY {
            return Err(ReadError::TooLarge);
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// Upstream's `AltTokenSource`: `POST token-url` with `token-body`; the answer is
/// `{"accessToken": "…", "expireTime": "<RFC 3339>"}`. The token is kept until a minute
/// before it expires.
struct AltToken {
    url: url::Url,
    body: String,
    http: reqwest::Client,
    timeout: Duration,
    cached: Mutex<Option<(HeaderMap, SystemTime, EntityTag)>>,
}

impl fmt::Debug for AltToken {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AltToken")
            .field("url", &config::redacted_url(&self.url))
            .finish_non_exhaustive()
    }
}

impl AltToken {
    async fn fetch(&self) -> Result<(HeaderMap, SystemTime), CredentialsError> {
        // Named as `token-url <scheme://host/path?<redacted>>`: never its query string.
        let shown = config::redacted_url(&self.url);
        let fail = |transient, m: String| {
            CredentialsError::from_msg(transient, format!("token-url {shown}: {m}"))
        };
        let resp = tokio::time::timeout(
            self.timeout,
            self.http
                .post(self.url.clone())
                .header("Content-Type", "application/json")
                .body(self.body.clone())
                .send(),
        )
        .await
        .map_err(|_| fail(true, format!("no answer within {:?}", self.timeout)))?
        // reqwest names the URL in its errors: without it (its query may be a signature).
        .map_err(|e| fail(true, source_chain(&e.without_url())))?;
        let status = resp.status();
        if !status.is_success() {
            return Err(fail(status.is_server_error(), format!("answered HTTP {status}")));
        }
        let body = read_capped(resp).await.map_err(|e| match e {
            ReadError::Broken(m) => fail(true, m),
            ReadError::TooLarge => {
                fail(false, format!("the answer is larger than {MAX_REPLY} bytes"))
            }
        })?;
        let v: Value = serde_json::from_slice(&body)
            .map_err(|_| fail(false, "the answer is not JSON".into()))?;
        let token = v["accessToken"]
            .as_str()
            .filter(|t| !t.is_empty())
            .ok_or_else(|| fail(false, "the answer has no accessToken".into()))?;
        let expiry = v["expireTime"]
            .as_str()
            .and_then(|t| t.parse::<jiff::Timestamp>().ok())
            .map(SystemTime::from)
            .unwrap_or_else(|| SystemTime::now() + Duration::from_secs(300));
        let mut value = HeaderValue::from_str(&format!("Bearer {token}"))
            .map_err(|_| fail(false, "the token is not a valid header value".into()))?;
        value.set_sensitive(true);
        let mut headers = HeaderMap::new();
        headers.insert(http::header::AUTHORIZATION, value);
        Ok((headers, expiry))
    }
}

impl CredentialsProvider for AltToken {
    async fn headers(
        &self,
        extensions: Extensions,
    ) -> Result<CacheableResource<HeaderMap>, CredentialsError> {
        let mut cached = self.cached.lock().await;
        let fresh = cached
            .as_ref()
            .is_some_and(|(_, exp, _)| SystemTime::now() + Duration::from_secs(60) < *exp);
        if !fresh {
            let (headers, exp) = self.fetch().await?;
            *cached = Some((headers, exp, EntityTag::new()));
        }
        let Some((headers, _, tag)) = cached.as_ref() else {
            return Err(CredentialsError::from_msg(false, "token-url: no token"));
        };
        if extensions.get::<EntityTag>() == Some(tag) {
            return Ok(CacheableResource::NotModified);
        }
        Ok(CacheableResource::New { entity_tag: tag.clone(), data: headers.clone() })
    }

    async fn universe_domain(&self) -> Option<String> {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compute_methods_carry_upstreams_request_names() {
        for (op, request, regional) in [
            ("compute.instances.get", "instances_get", false),
            ("compute.instances.list", "instances_list", false),
            ("compute.forwardingRules.insert", "forwardingrule_create", true),
            ("compute.addresses.insert", "address_reserve", true),
            ("compute.addresses.delete", "address_delete", true),
            ("compute.targetPools.addInstance", "targetpool_add_instances", true),
            ("compute.targetPools.removeInstance", "targetpool_remove_instances", true),
            ("compute.firewalls.patch", "firewall_update", false),
            ("compute.httpHealthChecks.get", "healthcheck_get", false),
            ("compute.routes.insert", "routes_create", false),
            ("compute.zones.list", "zones_list", true),
        ] {
            assert_eq!(metric_request(op), (request.to_string(), regional), "{op}");
        }
    }

    #[test]
    fn regions_links_and_endpoints() {
        assert_eq!(region_of_zone("us-central1-a"), "us-central1");
        assert_eq!(
            last_segment("https://x/compute/v1/projects/p/zones/europe-west1-b"),
            "europe-west1-b"
        );
        assert_eq!(
            link("projects/p/global/networks/n"),
            format!("{LINK_PREFIX}projects/p/global/networks/n")
        );
        let u = url::Url::parse("https://www.googleapis.com/compute/v1/").unwrap();
        assert_eq!(endpoint_root(&u), "https://www.googleapis.com");
        let u = url::Url::parse("http://127.0.0.1:8080").unwrap();
        assert_eq!(endpoint_root(&u), "http://127.0.0.1:8080");
    }
}
