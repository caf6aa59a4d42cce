//! The ARM client: a small typed client over `azure_core`'s HTTP pipeline (bearer tokens from
//! [`auth`]), with the project's deadlines and retries, ARM's long-running operations
//! (`Azure-AsyncOperation` polled to `Succeeded`), `nextLink` paging, `If-Match` ETags and
//! ARM error bodies (`{"error":{"code","message"}}`). Models are in [`models`].
//!
//! Why our own client: the `azure_mgmt_*` crates pin the legacy `azure_core` 0.21 line and
//! their maintainer declared them unsupported (Azure/azure-sdk-for-rust#1718); this provider
//! calls about twenty ARM operations, so a typed client for those is small.
//!
//! Every call has a deadline ([`ClientOptions::deadline`]); reads and deletes are retried on
//! throttling (429, honouring `Retry-After`), 5xx and broken connections; a `PUT` is retried
//! only when ARM did not apply it (429, 409 `AnotherOperationInProgress`). Errors name the
//! operation, the resource and ARM's code and message — never a token or a secret.

pub mod auth;
pub mod certificate;
pub mod models;
pub mod names;
pub mod views;

use std::sync::Arc;
use std::time::Duration;

use azure_core::credentials::TokenCredential;
use azure_core::http::headers::{HeaderName, Headers};
use azure_core::http::policies::Policy;
use azure_core::http::policies::auth::BearerTokenAuthorizationPolicy;
use azure_core::http::{
    AsyncRawResponse, ClientOptions as CoreOptions, Context, HttpClient, Method, Pipeline,
    PipelineSendOptions, RawResponse, Request, RetryOptions, StatusCode, Transport, Url,
};
use ccm_core::cloud::ProviderError;
use ccm_core::cloud_call::api_metrics::{self, ApiMetrics};
use ccm_core::cloud_call::{Classified, Deadline, DeadlineExceeded, Retry};
use futures::StreamExt;
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::config::Config;

/// ARM API versions the client speaks.
pub mod api_version {
    /// `Microsoft.Network` (load balancers, public IPs, NSGs, route tables, NICs, subnets).
    pub const NETWORK: &str = "2024-05-01";
    /// `Microsoft.Compute` (VMs, scale sets, scale-set VMs).
    pub const COMPUTE: &str = "2024-07-01";
}

/// Where IMDS answers on every Azure VM.
pub const DEFAULT_IMDS_ENDPOINT: &str = "http://169.254.169.254";

/// Environment variable overriding the IMDS address (tests, node-local proxies).
pub const IMDS_ENDPOINT_ENV: &str = "CCM_AZURE_IMDS_ENDPOINT";

/// Environment variable (`true`) allowing plain `http://` for the configurable endpoints
/// (ARM, AAD, an ACR registry or its token realm): refused without it. IMDS is plain HTTP
/// on every Azure VM and is not affected.
pub const ALLOW_HTTP_ENV: &str = "CCM_AZURE_ALLOW_HTTP";

/// The largest ARM or AAD reply read (a listing page of 1000 NICs is about 3 MiB).
pub const MAX_ARM_REPLY: usize = 8 << 20;

/// The largest IMDS reply read.
pub const MAX_IMDS_REPLY: usize = 1 << 20;

/// How calls are bounded and where they go.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Each call (all its retries included) ends by then.
    pub deadline: Deadline,
    /// Retries of transient faults within a call.
    pub retry: Retry,
    /// How often a running operation is polled (first poll after this, doubling to 4×;
    /// ARM's `Retry-After` on the operation wins when longer).
    pub poll_interval: Duration,
    /// How long a long-running operation may run before the call fails (an error; the next
    /// sync looks again).
    pub operation_timeout: Duration,
    /// The AAD authority host (`https://login.microsoftonline.com` for the public cloud);
    /// overrides the cloud's (also from `AZURE_AUTHORITY_HOST`).
    pub authority_host: Option<String>,
    /// The IMDS base URL (default [`DEFAULT_IMDS_ENDPOINT`]; also from
    /// [`IMDS_ENDPOINT_ENV`]).
    pub imds_endpoint: Option<String>,
    /// Extra CA certificates (PEM) to trust besides the system's (a private cloud's CA; also
    /// from `SSL_CERT_FILE`).
    pub ca_pem: Option<Vec<u8>>,
    /// Allow plain `http://` ARM and AAD endpoints (default: refused; also from
    /// [`ALLOW_HTTP_ENV`]).
    pub allow_http: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions {
            deadline: Deadline::default(),
            retry: Retry::default(),
            poll_interval: Duration::from_secs(2),
            operation_timeout: Duration::from_secs(300),
            authority_host: None,
            imds_endpoint: None,
            ca_pem: None,
            allow_http: false,
        }
    }
}

impl ClientOptions {
    /// The defaults with the environment's overrides: `AZURE_AUTHORITY_HOST`,
    /// [`IMDS_ENDPOINT_ENV`], and `SSL_CERT_FILE` (a PEM bundle of extra CAs).
    pub fn from_env() -> Result<ClientOptions, ClientError> {
        let var = |k: &str| std::env::var(k).ok().filter(|v| !v.trim().is_empty());
        let ca_pem = match var("SSL_CERT_FILE") {
            Some(path) => Some(std::fs::read(&path).map_err(|e| ClientError::Setup {
                message: format!("reading SSL_CERT_FILE {path}: {e}"),
            })?),
            None => None,
        };
        Ok(ClientOptions {
            authority_host: var("AZURE_AUTHORITY_HOST"),
            imds_endpoint: var(IMDS_ENDPOINT_ENV),
            ca_pem,
            allow_http: allow_http(var(ALLOW_HTTP_ENV).as_deref()),
            ..ClientOptions::default()
        })
    }
}

/// Whether the value of [`ALLOW_HTTP_ENV`] opts in (`true` or `1`).
pub fn allow_http(value: Option<&str>) -> bool {
    value.is_some_and(|v| v.trim().eq_ignore_ascii_case("true") || v.trim() == "1")
}

/// Refuses a plain `http://` endpoint unless `allow_http` (a bearer token or a secret would
/// cross the network in clear text); anything but `https://` or `http://` is refused too.
pub fn check_scheme(url: &str, allow_http: bool) -> Result<(), String> {
    let parsed = Url::parse(url).map_err(|_| "not a URL".to_string())?;
    match parsed.scheme() {
        "https" => Ok(()),
        "http" if allow_http => Ok(()),
        "http" => Err(format!(
            "plain http:// is refused (tokens would cross the network unencrypted); use https://, or set {ALLOW_HTTP_ENV}=true for a test endpoint"
        )),
        other => Err(format!("scheme {other:?} is not https")),
    }
}

/// Reads a reply body of at most `max` bytes (a larger one is an error saying so).
pub async fn read_capped(reply: reqwest::Response, max: usize) -> Result<Vec<u8>, String> {
    if reply.content_length().is_some_and(|n| n > max as u64) {
        return Err(too_large(max));
    }
    let mut reply = reply;
    let mut out = Vec::new();
    while let Some(chunk) =
        reply.chunk().await.map_err(|e| format!("reading the reply: {}", e.without_url()))?
    {
        out.extend_from_slice(&chunk);
        if out.len() > max {
            return Err(too_large(max));
        }
    }
    Ok(out)
}

fn too_large(max: usize) -> String {
    if max >= 1 << 20 {
        format!("the reply is larger than {} MiB: not read", max >> 20)
    } else {
        format!("the reply is larger than {max} bytes: not read")
    }
}

/// The transport of ARM and AAD calls (the pipeline's and `azure_identity`'s): `reqwest`,
/// with every reply body capped at `max` bytes.
#[derive(Debug)]
pub(crate) struct CappedTransport {
    http: reqwest::Client,
    max: usize,
}

impl CappedTransport {
    /// `http` with replies capped at `max` bytes, as an `azure_core` transport.
    pub(crate) fn transport(http: &reqwest::Client, max: usize) -> Transport {
        Transport::new(Arc::new(CappedTransport { http: http.clone(), max }))
    }
}

#[async_trait::async_trait]
impl HttpClient for CappedTransport {
    async fn execute_request(&self, request: &Request) -> azure_core::Result<AsyncRawResponse> {
        let reply = HttpClient::execute_request(&self.http, request).await?;
        let max = self.max;
        let error = move || {
            azure_core::Error::with_message(
                azure_core::error::ErrorKind::DataConversion,
                too_large(max),
            )
        };
        let declared = reply
            .headers()
            .get_optional_str(&HeaderName::from_static("content-length"))
            .and_then(|v| v.trim().parse::<u64>().ok());
        if declared.is_some_and(|n| n > max as u64) {
            return Err(error());
        }
        let (status, headers, body) = reply.deconstruct();
        let mut seen = 0usize;
        let capped = body.map(move |chunk| {
            let chunk = chunk?;
            seen = seen.saturating_add(chunk.len());
            if seen > max { Err(error()) } else { Ok(chunk) }
        });
        Ok(AsyncRawResponse::new(status, headers, Box::pin(capped)))
    }
}

/// Why the client could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The config lacks what the client needs, or names an unknown cloud.
    #[error("azure cloud config: {key}: {message}")]
    Config {
        /// The key.
        key: &'static str,
        /// Why.
        message: String,
    },
    /// TLS, HTTP client or credential setup failed.
    #[error("azure client setup: {message}")]
    Setup {
        /// What failed.
        message: String,
    },
}

/// The endpoints of an Azure cloud.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CloudEndpoints {
    /// ARM, e.g. `https://management.azure.com`.
    pub resource_manager: String,
    /// AAD, e.g. `https://login.microsoftonline.com`.
    pub authority_host: String,
    /// The token scope for ARM.
    pub arm_scope: String,
    /// ACR's registry suffixes' AAD scope.
    pub acr_scope: String,
}

impl CloudEndpoints {
    /// The endpoints for `config.cloud` (or `resourceManagerEndpoint`), with the options'
    /// authority-host override.
    pub fn resolve(
        config: &Config,
        options: &ClientOptions,
    ) -> Result<CloudEndpoints, ClientError> {
        let cloud = config.cloud.as_deref().unwrap_or("AzurePublicCloud");
        let (rm, aad) = match cloud.to_ascii_lowercase().as_str() {
            "azurepubliccloud" | "azurecloud" | "" => {
                ("https://management.azure.com", "https://login.microsoftonline.com")
            }
            "azurechinacloud" => {
                ("https://management.chinacloudapi.cn", "https://login.chinacloudapi.cn")
            }
            "azureusgovernmentcloud" | "azureusgovernment" => {
                ("https://management.usgovcloudapi.net", "https://login.microsoftonline.us")
            }
            _ if config.resource_manager_endpoint.is_some() => ("", ""),
            _ => {
                return Err(ClientError::Config {
                    key: "cloud",
                    message: format!(
                        "unknown cloud {cloud:?} (AzurePublicCloud, AzureChinaCloud, AzureUSGovernmentCloud, or set resourceManagerEndpoint)"
                    ),
                });
            }
        };
        let resource_manager = config
            .resource_manager_endpoint
            .clone()
            .unwrap_or_else(|| rm.to_string())
            .trim_end_matches('/')
            .to_string();
        check_scheme(&resource_manager, options.allow_http)
            .map_err(|message| ClientError::Config { key: "resourceManagerEndpoint", message })?;
        let authority_host = options
            .authority_host
            .clone()
            .or_else(|| (!aad.is_empty()).then(|| aad.to_string()))
            .or_else(|| config.resource_manager_endpoint.clone())
            .unwrap_or_default()
            .trim_end_matches('/')
            .to_string();
        if !authority_host.is_empty() {
            check_scheme(&authority_host, options.allow_http)
                .map_err(|message| ClientError::Config { key: "AZURE_AUTHORITY_HOST", message })?;
        }
        let arm_scope = if config.resource_manager_endpoint.is_some() {
            format!("{resource_manager}/.default")
        } else {
            match cloud.to_ascii_lowercase().as_str() {
                "azurechinacloud" => "https://management.chinacloudapi.cn/.default".into(),
                "azureusgovernmentcloud" | "azureusgovernment" => {
                    "https://management.usgovcloudapi.net/.default".into()
                }
                _ => "https://management.azure.com/.default".into(),
            }
        };
        Ok(CloudEndpoints {
            resource_manager,
            authority_host,
            arm_scope,
            acr_scope: "https://containerregistry.azure.net/.default".into(),
        })
    }
}

/// An ARM call failed.
#[derive(Debug, thiserror::Error)]
pub enum ArmError {
    /// ARM answered with an error status.
    #[error("{operation} {resource}: HTTP {status} {code}: {message}")]
    Status {
        /// The operation, e.g. `network.load_balancers.get`.
        operation: &'static str,
        /// The resource's ARM ID (or collection path).
        resource: String,
        /// The HTTP status.
        status: u16,
        /// ARM's `error.code`.
        code: String,
        /// ARM's `error.message` (cut to 300 characters).
        message: String,
        /// ARM's `Retry-After`.
        retry_after: Option<Duration>,
    },
    /// A long-running operation ended `Failed` or `Canceled`.
    #[error("{operation} {resource}: operation {status}: {code}: {message}")]
    Operation {
        /// The operation.
        operation: &'static str,
        /// The resource.
        resource: String,
        /// `Failed` or `Canceled`.
        status: String,
        /// ARM's `error.code`.
        code: String,
        /// ARM's `error.message`.
        message: String,
    },
    /// No answer (connection, TLS, credential).
    #[error("{operation} {resource}: {message}")]
    Transport {
        /// The operation.
        operation: &'static str,
        /// The resource.
        resource: String,
        /// What failed (never a token).
        message: String,
        /// Whether the connection broke or could not be made (worth retrying).
        broken: bool,
    },
    /// The reply did not parse as the resource.
    #[error("{operation} {resource}: unexpected reply: {message}")]
    Decode {
        /// The operation.
        operation: &'static str,
        /// The resource.
        resource: String,
        /// The parse error.
        message: String,
    },
    /// The client refused to send the call: its path names a resource in a way ARM's
    /// rules do not allow (a name with `/`, `?`, `#`, `%`, a `..` segment, another
    /// subscription). Never sent, never retried.
    #[error("{operation}: refused: {message}")]
    InvalidPath {
        /// The operation.
        operation: &'static str,
        /// What is wrong (never the whole path).
        message: String,
    },
    /// The call's deadline passed.
    #[error(transparent)]
    Deadline(#[from] DeadlineExceeded),
}

impl ArmError {
    /// The HTTP status, when ARM answered.
    pub fn status(&self) -> Option<u16> {
        match self {
            ArmError::Status { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// ARM's error code (`ResourceNotFound`, `PreconditionFailed`, …), when it gave one.
    pub fn code(&self) -> Option<&str> {
        match self {
            ArmError::Status { code, .. } | ArmError::Operation { code, .. } => Some(code),
            _ => None,
        }
    }

    /// ARM's 404 for the resource itself (code `ResourceNotFound` or `NotFound`): not one
    /// for its resource group, subscription or parent, nor a proxy's bare 404.
    pub fn is_not_found(&self) -> bool {
        self.status() == Some(404) && matches!(self.code(), Some("ResourceNotFound" | "NotFound"))
    }

    /// A 412: the `If-Match` ETag is stale.
    pub fn is_precondition_failed(&self) -> bool {
        self.status() == Some(412)
    }

    /// A 409 (e.g. `AnotherOperationInProgress`).
    pub fn is_conflict(&self) -> bool {
        self.status() == Some(409)
    }

    /// A 429.
    pub fn is_throttled(&self) -> bool {
        self.status() == Some(429)
    }

    fn retry_after(&self) -> Option<Duration> {
        match self {
            ArmError::Status { retry_after, .. } => *retry_after,
            _ => None,
        }
    }
}

impl From<ArmError> for ProviderError {
    fn from(e: ArmError) -> Self {
        if e.is_throttled() {
            return ProviderError::Throttled(e.to_string());
        }
        if let ArmError::InvalidPath { operation, message } = &e {
            return ProviderError::Invalid {
                what: format!("ARM resource path ({operation})"),
                message: message.clone(),
            };
        }
        ProviderError::with_source(e.to_string(), e)
    }
}

/// Reads and deletes: throttling, 5xx, broken connections.
fn classify_read(e: &ArmError) -> Classified {
    match e {
        ArmError::Status { status, .. } if *status == 429 || *status >= 500 => {
            Classified::Transient { retry_after: e.retry_after() }
        }
        ArmError::Status { status: 409, code, .. } if code == "AnotherOperationInProgress" => {
            Classified::Transient { retry_after: e.retry_after() }
        }
        ArmError::Transport { broken: true, .. } => Classified::Transient { retry_after: None },
        _ => Classified::Permanent,
    }
}

/// `PUT`: only what ARM did not apply.
fn classify_write(e: &ArmError) -> Classified {
    match e {
        ArmError::Status { status: 429, .. } => {
            Classified::Transient { retry_after: e.retry_after() }
        }
        ArmError::Status { status: 409, code, .. } if code == "AnotherOperationInProgress" => {
            Classified::Transient { retry_after: e.retry_after() }
        }
        ArmError::Transport { broken: true, .. } => Classified::Transient { retry_after: None },
        _ => Classified::Permanent,
    }
}

const ASYNC_OPERATION: HeaderName = HeaderName::from_static("azure-asyncoperation");
const LOCATION: HeaderName = HeaderName::from_static("location");
const RETRY_AFTER: HeaderName = HeaderName::from_static("retry-after");
const IF_MATCH: HeaderName = HeaderName::from_static("if-match");
const CONTENT_TYPE: HeaderName = HeaderName::from_static("content-type");
const AUXILIARY: HeaderName = HeaderName::from_static(AUXILIARY_HEADER);

/// The header carrying the auxiliary tenants' tokens (ARM's cross-tenant linked
/// authorization), as upstream's ARM clients send it.
pub const AUXILIARY_HEADER: &str = "x-ms-authorization-auxiliary";

/// Adds `x-ms-authorization-auxiliary: Bearer <token>` (a token of the network tenant) to
/// every request, as upstream's clients do when `networkResourceTenantID` is another tenant.
#[derive(Debug)]
struct AuxiliaryTokenPolicy {
    credential: Arc<dyn TokenCredential>,
    scope: String,
}

#[async_trait::async_trait]
impl Policy for AuxiliaryTokenPolicy {
    // The trait's signature elides `Context`'s lifetime.
    #[allow(elided_lifetimes_in_paths)]
    async fn send(
        &self,
        ctx: &Context,
        request: &mut Request,
        next: &[Arc<dyn Policy>],
    ) -> azure_core::http::policies::PolicyResult {
        let token = self.credential.get_token(&[self.scope.as_str()], None).await?;
        request.insert_header(AUXILIARY, format!("Bearer {}", token.token.secret()));
        next[0].send(ctx, request, &next[1..]).await
    }
}

/// The ARM client. Calls go to `subscriptionId`, except the network resources (load
/// balancers, public IPs, security groups, virtual networks, route tables; not NICs nor
/// private link services, as upstream) when `networkResourceSubscriptionID` names another
/// subscription: those go there, with the network tenant's credential when
/// `networkResourceTenantID` names another tenant.
pub struct ArmClient {
    pipeline: Pipeline,
    network_pipeline: Pipeline,
    http: reqwest::Client,
    credential: Arc<dyn TokenCredential>,
    endpoints: CloudEndpoints,
    subscription: String,
    network_subscription: String,
    options: ClientOptions,
    imds: String,
    cache: ReadCache,
}

/// How long ARM reads are reused across syncs, by upstream's keys (`0`: not cached).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct CacheTtls {
    /// VM listings of a resource group (`vmCacheTTLInSeconds`, upstream's default 60 s).
    pub vm: Duration,
    /// Public IP listings of a resource group (`publicIPCacheTTLInSeconds`, 120 s); with
    /// the key set explicitly, GETs of one public IP too.
    pub public_ip_list: Duration,
    /// GETs of one public IP (only when `publicIPCacheTTLInSeconds` is set).
    pub public_ip: Duration,
    /// GETs of one load balancer (only when `loadBalancerCacheTTLInSeconds` is set).
    pub load_balancer: Duration,
    /// GETs of one security group (only when `nsgCacheTTLInSeconds` is set).
    pub security_group: Duration,
    /// A load balancer read that no write of it follows (the node sync's
    /// `UpdateLoadBalancer`: whether it holds the Service, and its pools' members):
    /// `loadBalancerCacheTTLInSeconds`, else upstream's default 120 s. Our writes of the load
    /// balancer, and of NICs and scale sets (they change its pools' `backendIPConfigurations`),
    /// drop it; a read before a write of the load balancer still asks ARM (`load_balancer`).
    pub load_balancer_view: Duration,
    /// The route table read to list routes (upstream's route table cache, default 120 s);
    /// our writes of it drop it, and what applies a change (a deletion too) reads it afresh.
    pub route_table: Duration,
}

impl CacheTtls {
    /// The TTLs `config` sets: listings of VMs and public IPs cached by default (upstream's
    /// 60 s and 120 s); GETs of one load balancer, public IP or security group only when
    /// the key is given (ours reads them before every write by default, so a change made
    /// outside the cluster is repaired at the next sync); `disableAPICallCache`: none.
    pub fn of(config: &Config) -> CacheTtls {
        if config.disable_api_call_cache {
            return CacheTtls::default();
        }
        let secs = |v: Option<u64>| Duration::from_secs(v.unwrap_or(0));
        CacheTtls {
            vm: secs(config.vm_cache_ttl_in_seconds.or(Some(60))),
            public_ip_list: secs(config.public_ip_cache_ttl_in_seconds.or(Some(120))),
            public_ip: secs(config.public_ip_cache_ttl_in_seconds),
            load_balancer: secs(config.load_balancer_cache_ttl_in_seconds),
            security_group: secs(config.nsg_cache_ttl_in_seconds),
            load_balancer_view: secs(
                config.load_balancer_cache_ttl_in_seconds.or(Some(UPSTREAM_DEFAULT_TTL_SECS)),
            ),
            route_table: secs(
                config.route_table_cache_ttl_in_seconds.or(Some(UPSTREAM_DEFAULT_TTL_SECS)),
            ),
        }
    }

    /// How long a GET reply of `path` is kept: the longest any reader may accept it for
    /// (readers that write from it ask with [`CacheTtls::of_get`]).
    fn keep_get(&self, path: &str) -> Duration {
        match arm_type_of(path).as_deref() {
            Some("microsoft.network/loadbalancers") => {
                self.load_balancer.max(self.load_balancer_view)
            }
            Some("microsoft.network/routetables") => self.route_table,
            _ => self.of_get(path),
        }
    }

    /// The TTL of a GET of `path` (one resource), by its type.
    fn of_get(&self, path: &str) -> Duration {
        match arm_type_of(path).as_deref() {
            Some("microsoft.network/loadbalancers") => self.load_balancer,
            Some("microsoft.network/publicipaddresses") => self.public_ip,
            Some("microsoft.network/networksecuritygroups") => self.security_group,
            _ => Duration::ZERO,
        }
    }

    /// The TTL of a listing of `path` (a resource group's collection), by its type.
    fn of_list(&self, path: &str) -> Duration {
        match arm_type_of(path).as_deref() {
            Some("microsoft.compute/virtualmachines") => self.vm,
            Some("microsoft.network/publicipaddresses") => self.public_ip_list,
            _ => Duration::ZERO,
        }
    }
}

/// Upstream's default TTL of its load balancer, security group, route table and public IP
/// caches (seconds).
const UPSTREAM_DEFAULT_TTL_SECS: u64 = 120;

/// `namespace/type` (lower case) of an ARM path: the two segments after its first
/// `providers`, when a resource group's collection or one of its resources (not a child).
fn arm_type_of(path: &str) -> Option<String> {
    let lower = path.to_ascii_lowercase();
    let segments: Vec<&str> = lower.trim_matches('/').split('/').collect();
    let at = segments.iter().position(|s| *s == "providers")?;
    let rest = &segments[at + 1..];
    (rest.len() == 2 || rest.len() == 3).then(|| format!("{}/{}", rest[0], rest[1]))
}

/// `namespace/type` (lower case) of the resource an ARM path writes: the two segments after
/// its first `providers`, whatever follows (a child resource's write changes its parent).
fn written_type_of(path: &str) -> Option<String> {
    let lower = path.to_ascii_lowercase();
    let segments: Vec<&str> = lower.trim_matches('/').split('/').collect();
    let at = segments.iter().position(|s| *s == "providers")?;
    let rest = segments.get(at + 1..at + 3)?;
    Some(format!("{}/{}", rest[0], rest[1]))
}

/// Reads kept across syncs ([`CacheTtls`]): lower-case path → when read, the reply, and
/// for listings whether it was read with `$expand=instanceView` (it then also answers a
/// plain listing). Every write through this client drops the entries of the written
/// resource's type; a listing read fresh ([`ArmClient::list_fresh`]) replaces its entry.
/// A reply is kept only when no write of ours began or ended while it was read (it may
/// predate that write).
#[derive(Debug, Default)]
struct ReadCache {
    ttls: CacheTtls,
    entries: std::sync::Mutex<std::collections::HashMap<String, CacheEntry>>,
    hits: std::sync::atomic::AtomicU64,
    /// Counts invalidations (each write of ours: before and after it).
    generation: std::sync::atomic::AtomicU64,
}

#[derive(Debug, Clone)]
struct CacheEntry {
    at: std::time::Instant,
    body: Arc<Vec<u8>>,
    expanded: bool,
    /// ARM said the resource does not exist (kept for [`ArmClient::get_opt_within`] only).
    absent: bool,
}

impl ReadCache {
    /// A reply younger than `ttl` (none for a resource ARM said is absent).
    fn lookup(&self, key: &str, ttl: Duration, need_expanded: bool) -> Option<Arc<Vec<u8>>> {
        match self.lookup_entry(key, ttl, need_expanded)? {
            (_, true) => None,
            (body, false) => Some(body),
        }
    }

    /// A reply younger than `ttl`, and whether it says the resource is absent.
    fn lookup_entry(
        &self,
        key: &str,
        ttl: Duration,
        need_expanded: bool,
    ) -> Option<(Arc<Vec<u8>>, bool)> {
        if ttl.is_zero() {
            return None;
        }
        let entries = self.entries.lock().ok()?;
        let e = entries.get(&key.to_ascii_lowercase())?;
        if e.at.elapsed() >= ttl || (need_expanded && !e.expanded) {
            return None;
        }
        self.hits.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Some((e.body.clone(), e.absent))
    }

    /// The invalidation count now: what a read records before asking ARM.
    fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Keeps a reply read since invalidation count `since`, unless a write of ours came
    /// between (then the reply may be older than the write).
    fn store(&self, key: &str, ttl: Duration, body: Vec<u8>, expanded: bool, since: u64) {
        self.keep(key, ttl, body, expanded, false, since);
    }

    /// Keeps that ARM said `key` does not exist, as [`ReadCache::store`] keeps a reply.
    fn store_absent(&self, key: &str, ttl: Duration, since: u64) {
        self.keep(key, ttl, Vec::new(), false, true, since);
    }

    fn keep(
        &self,
        key: &str,
        ttl: Duration,
        body: Vec<u8>,
        expanded: bool,
        absent: bool,
        since: u64,
    ) {
        if ttl.is_zero() {
            return;
        }
        if let Ok(mut entries) = self.entries.lock() {
            if self.generation() != since {
                return;
            }
            let at = std::time::Instant::now();
            let entry = CacheEntry { at, body: Arc::new(body), expanded, absent };
            entries.insert(key.to_ascii_lowercase(), entry);
        }
    }

    /// Drops every entry of the type of `path` (a write to it, to a child of it, or its
    /// listing's); a write to a NIC or a scale set (or one of its VMs) also drops the load
    /// balancers (their pools' `backendIPConfigurations` follow the NICs).
    fn invalidate_type_of(&self, path: &str) {
        let Some(ty) = written_type_of(path) else { return };
        let member = ty == "microsoft.network/networkinterfaces"
            || ty == "microsoft.compute/virtualmachinescalesets";
        if let Ok(mut entries) = self.entries.lock() {
            self.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            entries.retain(|k, _| {
                let t = arm_type_of(k);
                let t = t.as_deref();
                t != Some(ty.as_str()) && !(member && t == Some("microsoft.network/loadbalancers"))
            });
        }
    }
}

/// Whether a listing's query is one the cache keeps: none, or `$expand=instanceView` only.
/// One page of an ARM listing.
#[derive(serde::Deserialize)]
#[serde(rename_all = "camelCase")]
struct Page<T> {
    // Required: a 2xx reply without `value` (a proxy's, or a resource instead of a
    // collection) is not an empty listing, and an empty listing says "gone".
    value: Vec<T>,
    next_link: Option<String>,
}

fn cacheable_query(query: &[(&str, &str)]) -> Option<bool> {
    match query {
        [] => Some(false),
        [(k, v)] if k.eq_ignore_ascii_case("$expand") && v.eq_ignore_ascii_case("instanceView") => {
            Some(true)
        }
        _ => None,
    }
}

impl std::fmt::Debug for ArmClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ArmClient")
            .field("resource_manager", &self.endpoints.resource_manager)
            .field("subscription", &self.subscription)
            .field("network_subscription", &self.network_subscription)
            .finish_non_exhaustive()
    }
}

/// An HTTP client trusting the system's roots and `ca_pem`'s certificates, with bounded
/// connects. Shared by ARM, AAD, IMDS and ACR calls.
pub fn http_client(ca_pem: Option<&[u8]>) -> Result<reqwest::Client, ClientError> {
    let mut builder = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .user_agent(concat!("ccm-rs-azure/", env!("CARGO_PKG_VERSION")));
    if let Some(pem) = ca_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| ClientError::Setup {
            message: format!("the CA bundle is not PEM: {e}"),
        })?;
        if certs.is_empty() {
            return Err(ClientError::Setup { message: "the CA bundle has no certificate".into() });
        }
        builder = builder.tls_certs_merge(certs);
    }
    builder
        .build()
        .map_err(|e| ClientError::Setup { message: format!("building the HTTP client: {e}") })
}

/// Whether `arm_type` (`Microsoft.Network/loadBalancers`, …) lives in the network
/// subscription: every `Microsoft.Network` type but NICs and private link services.
pub fn is_network_type(arm_type: &str) -> bool {
    let mut parts = arm_type.split('/');
    let namespace = parts.next().unwrap_or_default();
    let ty = parts.next().unwrap_or_default();
    namespace.eq_ignore_ascii_case("Microsoft.Network")
        && !ty.eq_ignore_ascii_case("networkInterfaces")
        && !ty.eq_ignore_ascii_case("privateLinkServices")
}

/// The subscription and resource group an ARM ID or collection path names (either may be
/// missing).
fn id_scope(id: &str) -> (Option<&str>, Option<&str>) {
    let mut subscription = None;
    let mut group = None;
    let mut parts = id.trim_start_matches('/').split('/');
    while let Some(p) = parts.next() {
        if p.eq_ignore_ascii_case("subscriptions") {
            subscription = parts.next().filter(|s| !s.is_empty());
        } else if p.eq_ignore_ascii_case("resourceGroups") {
            group = parts.next().filter(|s| !s.is_empty());
            break;
        }
    }
    (subscription, group)
}

/// Upstream's `request` label (`<resource>_<verb>` as its ARM clients named them:
/// `load_balancers_get`, `public_ip_addresses_create_or_update`, `vm_list`, `vmss_get`,
/// `vmssvm_update`, `interfaces_get`, `security_groups_get`, `route_tables_get`,
/// `subnets_get`) of an operation named `<provider>.<collection>.<method>`.
pub fn metric_request(operation: &str) -> String {
    let mut parts = operation.splitn(3, '.');
    let (_, collection, method) = match (parts.next(), parts.next(), parts.next()) {
        (Some(p), Some(c), Some(m)) => (p, c, m),
        _ => return api_metrics::snake_case(operation),
    };
    let resource = match collection {
        "virtual_machines" => "vm",
        "virtual_machine_scale_sets" => "vmss",
        "virtual_machine_scale_set_vms" => "vmssvm",
        "network_interfaces" => "interfaces",
        "network_security_groups" => "security_groups",
        other => other,
    };
    let method = match method {
        "list_virtual_machine_scale_set_network_interfaces" => "list_vmss_ni",
        other => other,
    };
    format!("{resource}_{method}")
}

impl ArmClient {
    /// A client for `config`'s subscription. Sends nothing: credentials are asked on the
    /// first call.
    pub fn new(config: &Config, options: ClientOptions) -> Result<ArmClient, ClientError> {
        let subscription = config
            .subscription_id
            .clone()
            .filter(|s| !s.trim().is_empty())
            .ok_or(ClientError::Config { key: "subscriptionId", message: "required".into() })?;
        let endpoints = CloudEndpoints::resolve(config, &options)?;
        let http = http_client(options.ca_pem.as_deref())?;
        let imds = options
            .imds_endpoint
            .clone()
            .unwrap_or_else(|| DEFAULT_IMDS_ENDPOINT.to_string())
            .trim_end_matches('/')
            .to_string();
        let network_subscription =
            config.network_subscription_id().unwrap_or(&subscription).trim().to_string();
        let credential = auth::token_credential(config, &endpoints, &http, &imds)?;
        // Another network tenant: the same identity's token from that tenant, for the
        // network subscription's calls and as every call's auxiliary token (upstream).
        let network_credential = match config.network_tenant_id() {
            Some(tenant) => Some(auth::network_credential(config, tenant, &endpoints, &http)?),
            None => None,
        };
        let pipeline_for = |primary: Arc<dyn TokenCredential>| {
            let mut policies: Vec<Arc<dyn Policy>> = vec![Arc::new(
                BearerTokenAuthorizationPolicy::new(primary, [endpoints.arm_scope.clone()]),
            )];
            if let Some(aux) = &network_credential {
                policies.push(Arc::new(AuxiliaryTokenPolicy {
                    credential: aux.clone(),
                    scope: endpoints.arm_scope.clone(),
                }));
            }
            let core = CoreOptions {
                retry: RetryOptions::none(),
                transport: Some(CappedTransport::transport(&http, MAX_ARM_REPLY)),
                ..CoreOptions::default()
            };
            Pipeline::new(
                Some("ccm-provider-azure"),
                Some(env!("CARGO_PKG_VERSION")),
                core,
                policies,
                Vec::new(),
                None,
            )
        };
        let pipeline = pipeline_for(credential.clone());
        let network_pipeline =
            pipeline_for(network_credential.clone().unwrap_or_else(|| credential.clone()));
        if !network_subscription.eq_ignore_ascii_case(&subscription) {
            tracing::info!(
                subscription = %subscription,
                network_subscription = %network_subscription,
                network_tenant = config.network_tenant_id().unwrap_or("(the same)"),
                "Azure network resources are in another subscription"
            );
        }
        Ok(ArmClient {
            pipeline,
            network_pipeline,
            http,
            credential,
            endpoints,
            subscription,
            network_subscription,
            options,
            imds,
            cache: ReadCache { ttls: CacheTtls::of(config), ..ReadCache::default() },
        })
    }

    /// The read cache's TTLs.
    pub fn cache_ttls(&self) -> CacheTtls {
        self.cache.ttls
    }

    /// Reads answered from the cache so far.
    pub fn cache_hits(&self) -> u64 {
        self.cache.hits.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The subscription of `arm_type`'s resources: the network subscription for
    /// `Microsoft.Network` types except NICs and private link services (upstream reads and
    /// writes those with its compute clients), else `subscriptionId`.
    pub fn subscription_for(&self, arm_type: &str) -> &str {
        if is_network_type(arm_type) { &self.network_subscription } else { &self.subscription }
    }

    /// The subscription of the network resources (`networkResourceSubscriptionID`, else
    /// `subscriptionId`).
    pub fn network_subscription_id(&self) -> &str {
        &self.network_subscription
    }

    /// The subscription of the cluster's compute resources (`subscriptionId`).
    pub fn subscription_id(&self) -> &str {
        &self.subscription
    }

    /// The cloud's endpoints.
    pub fn endpoints(&self) -> &CloudEndpoints {
        &self.endpoints
    }

    /// The options.
    pub fn options(&self) -> &ClientOptions {
        &self.options
    }

    /// The IMDS base URL.
    pub fn imds_endpoint(&self) -> &str {
        &self.imds
    }

    /// The HTTP client (trusts the configured CA).
    pub fn http(&self) -> &reqwest::Client {
        &self.http
    }

    /// The credential (AAD tokens for any scope).
    pub fn credential(&self) -> Arc<dyn TokenCredential> {
        self.credential.clone()
    }

    /// `/subscriptions/<sub>/resourceGroups/<rg>/providers/<arm_type>/<name>`, each part one
    /// path segment (`arm_type` two or more): a resource group breaking ARM's rules, or a
    /// part with `/`, `?`, `#`, `%`, a backslash or a `.`/`..` segment, is refused (names from
    /// annotations and the config were checked against their type's rules before).
    pub fn resource_id(
        &self,
        resource_group: &str,
        arm_type: &str,
        name: &str,
    ) -> Result<String, ArmError> {
        let collection = self.collection_id(resource_group, arm_type)?;
        names::check_segment(name).map_err(|m| invalid_path("arm.resource_id", m))?;
        Ok(format!("{collection}/{name}"))
    }

    /// `/subscriptions/<sub>/resourceGroups/<rg>/providers/<arm_type>`: a resource group's
    /// collection of `arm_type` (checked as [`ArmClient::resource_id`]).
    pub fn collection_id(&self, resource_group: &str, arm_type: &str) -> Result<String, ArmError> {
        names::check(names::NameKind::ResourceGroup, resource_group)
            .map_err(|m| invalid_path("arm.resource_id", m))?;
        for part in arm_type.split('/') {
            names::check_segment(part).map_err(|m| invalid_path("arm.resource_id", m))?;
        }
        Ok(format!(
            "/subscriptions/{}/resourceGroups/{resource_group}/providers/{arm_type}",
            self.subscription_for(arm_type)
        ))
    }

    /// The segments of an ARM path the client sends: `/subscriptions/<its subscription or
    /// its network subscription>/…`,
    /// every segment non-empty, not `.` or `..`, without `/`, a backslash, `?`, `#`, `%` or control
    /// characters. The one check every request path goes through ([`ArmClient::url`]).
    pub fn path_segments<'a>(&self, path: &'a str) -> Result<Vec<&'a str>, String> {
        let rest = path.strip_prefix('/').ok_or("not an ARM path: no leading '/'")?;
        let segments: Vec<&str> = rest.split('/').collect();
        for (i, s) in segments.iter().enumerate() {
            names::check_segment(s).map_err(|m| format!("segment {}: {m}", i + 1))?;
        }
        let ours = segments.first().is_some_and(|s| s.eq_ignore_ascii_case("subscriptions"))
            && segments.get(1).is_some_and(|s| {
                s.eq_ignore_ascii_case(&self.subscription)
                    || s.eq_ignore_ascii_case(&self.network_subscription)
            });
        if !ours {
            return Err("not a path under this client's subscription".into());
        }
        Ok(segments)
    }

    /// A URL ARM handed back (`nextLink`, `Azure-AsyncOperation`, `Location`) is followed
    /// with the bearer token only on ARM's own scheme, host and port.
    fn same_origin(
        &self,
        operation: &'static str,
        resource: &str,
        url: &Url,
    ) -> Result<(), ArmError> {
        let arm = Url::parse(&self.endpoints.resource_manager)
            .map_err(|e| bad_url(operation, resource, e.to_string()))?;
        if url.scheme() == arm.scheme()
            && url.host_str() == arm.host_str()
            && url.port_or_known_default() == arm.port_or_known_default()
        {
            return Ok(());
        }
        Err(ArmError::Decode {
            operation,
            resource: resource.to_string(),
            message: format!(
                "ARM pointed at {}://{}, not at its own endpoint: not followed",
                url.scheme(),
                url.host_str().unwrap_or_default()
            ),
        })
    }

    /// The URL of an ARM path: ARM's endpoint, the path's segments each percent-encoded
    /// (after [`ArmClient::path_segments`]), then `api-version` and `query`. The only place
    /// request URLs are built from paths: no caller's text reaches the query or the
    /// fragment, and no segment walks up.
    pub fn url(
        &self,
        path: &str,
        api_version: &str,
        query: &[(&str, &str)],
    ) -> Result<Url, String> {
        let segments = self.path_segments(path)?;
        let mut url =
            Url::parse(&self.endpoints.resource_manager).map_err(|e| format!("endpoint: {e}"))?;
        url.set_query(None);
        url.set_fragment(None);
        {
            let mut p =
                url.path_segments_mut().map_err(|_| "the ARM endpoint is not a base URL")?;
            p.pop_if_empty();
            p.extend(segments);
        }
        {
            let mut q = url.query_pairs_mut();
            q.append_pair("api-version", api_version);
            for (k, v) in query {
                q.append_pair(k, v);
            }
        }
        Ok(url)
    }

    /// One HTTP exchange: (status, headers, body). Error statuses become [`ArmError::Status`].
    async fn send(
        &self,
        operation: &'static str,
        resource: &str,
        method: Method,
        url: Url,
        body: Option<&[u8]>,
        if_match: Option<&str>,
    ) -> Result<(u16, Headers, Vec<u8>), ArmError> {
        let mut request = Request::new(url, method);
        if let Some(tag) = if_match {
            request.insert_header(IF_MATCH, tag.to_string());
        }
        if let Some(b) = body {
            request.insert_header(CONTENT_TYPE, "application/json");
            request.set_body(b.to_vec());
        }
        let options = PipelineSendOptions { skip_checks: true, ..Default::default() };
        let started = std::time::Instant::now();
        let sent = self
            .pipeline_of(request.url())
            .send(&Context::new(), &mut request, Some(options))
            .await;
        self.record_call(operation, resource, started, sent.as_ref().map(|r| r.status().into()));
        let response: RawResponse = sent.map_err(|e| ArmError::Transport {
            operation,
            resource: resource.to_string(),
            broken: is_broken(&e),
            message: transport_message(&e),
        })?;
        let status = u16::from(response.status());
        let (_, headers, body) = response.deconstruct();
        let body: Vec<u8> = body.to_vec();
        if status >= 400 {
            return Err(status_error(operation, resource, status, &headers, &body));
        }
        Ok((status, headers, body))
    }

    /// The pipeline for a URL: the network one for the network subscription's paths (when it
    /// is another subscription), else the compute one.
    fn pipeline_of(&self, url: &Url) -> &Pipeline {
        let mut segments = url.path_segments().into_iter().flatten();
        let network = segments.next().is_some_and(|s| s.eq_ignore_ascii_case("subscriptions"))
            && segments.next().is_some_and(|s| {
                s.eq_ignore_ascii_case(&self.network_subscription)
                    && !s.eq_ignore_ascii_case(&self.subscription)
            });
        if network { &self.network_pipeline } else { &self.pipeline }
    }

    /// Records one HTTP exchange in upstream's `cloudprovider_azure_api_request_*` families:
    /// its latency, an error (`code`: the HTTP status, empty without a reply) for a status of
    /// 400 and above or no reply, and a throttled call for 429.
    fn record_call(
        &self,
        operation: &str,
        resource: &str,
        started: std::time::Instant,
        status: Result<u16, &azure_core::Error>,
    ) {
        let request = metric_request(operation);
        let (subscription, group) = id_scope(resource);
        let subscription = subscription.unwrap_or(&self.subscription);
        let group = group.map(str::to_ascii_lowercase).unwrap_or_default();
        let labels = [request.as_str(), group.as_str(), subscription, ""];
        let code = match status {
            Ok(s) if s < 400 => None,
            Ok(s) => Some(s.to_string()),
            Err(_) => Some(String::new()),
        };
        let metrics = ApiMetrics::of(&api_metrics::AZURE);
        metrics.call_finished(&labels, started.elapsed(), code.as_deref());
        if matches!(status, Ok(429)) {
            metrics.inc("cloudprovider_azure_api_request_throttled_count", &labels);
        }
    }

    fn decode<T: DeserializeOwned>(
        operation: &'static str,
        resource: &str,
        body: &[u8],
    ) -> Result<T, ArmError> {
        serde_json::from_slice(body).map_err(|e| ArmError::Decode {
            operation,
            resource: resource.to_string(),
            message: e.to_string(),
        })
    }

    /// GET a resource.
    pub async fn get<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        id: &str,
        api_version: &str,
        query: &[(&str, &str)],
    ) -> Result<T, ArmError> {
        let url = self.url(id, api_version, query).map_err(|m| invalid_path(operation, m))?;
        let ttl = if query.is_empty() { self.cache.ttls.of_get(id) } else { Duration::ZERO };
        if let Some(body) = self.cache.lookup(id, ttl, false) {
            return Self::decode(operation, id, &body);
        }
        let since = self.cache.generation();
        let body = self
            .options
            .retry
            .run(&self.options.deadline, operation, classify_read, || {
                let url = url.clone();
                async move {
                    let (_, _, body) =
                        self.send(operation, id, Method::Get, url, None, None).await?;
                    Ok(body)
                }
            })
            .await?;
        let value = Self::decode(operation, id, &body)?;
        let keep = if query.is_empty() { self.cache.ttls.keep_get(id) } else { Duration::ZERO };
        self.cache.store(id, keep, body, false, since);
        Ok(value)
    }

    /// GET a resource for a reader that writes nothing from it, answered from the read cache
    /// while ARM's last reply there (any GET of it, our writes dropping it) is younger than
    /// `max_age` ([`CacheTtls::load_balancer_view`], [`CacheTtls::route_table`]; zero: ARM
    /// is asked); `None` only when ARM says the resource itself does not exist — an answer
    /// kept as long, as upstream's caches keep it (until our write of that type).
    pub async fn get_opt_within<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        id: &str,
        api_version: &str,
        max_age: Duration,
    ) -> Result<Option<T>, ArmError> {
        match self.cache.lookup_entry(id, max_age, false) {
            Some((_, true)) => return Ok(None),
            Some((body, false)) => return Self::decode(operation, id, &body).map(Some),
            None => {}
        }
        let since = self.cache.generation();
        let got = self.get_opt(operation, id, api_version, &[]).await?;
        if got.is_none() {
            self.cache.store_absent(id, max_age, since);
        }
        Ok(got)
    }

    /// GET a resource; `None` only when ARM says the resource itself does not exist.
    pub async fn get_opt<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        id: &str,
        api_version: &str,
        query: &[(&str, &str)],
    ) -> Result<Option<T>, ArmError> {
        match self.get(operation, id, api_version, query).await {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Lists a collection, following every `nextLink` (each page under its own deadline).
    /// VM and public IP listings of a resource group are answered from the read cache while
    /// fresh ([`CacheTtls`]); [`ArmClient::list_fresh`] always asks ARM.
    pub async fn list<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        collection: &str,
        api_version: &str,
        query: &[(&str, &str)],
    ) -> Result<Vec<T>, ArmError> {
        let ttl = self.cache.ttls.of_list(collection);
        if let Some(expanded) = cacheable_query(query)
            && let Some(body) = self.cache.lookup(collection, ttl, expanded)
        {
            let pages: Vec<Page<T>> = Self::decode(operation, collection, &body)?;
            return Ok(pages.into_iter().flat_map(|p| p.value).collect());
        }
        self.list_fresh(operation, collection, api_version, query).await
    }

    /// [`ArmClient::list`] from ARM whatever the cache holds (what decides that a node's VM
    /// is gone is never older than the pass); the reply refreshes the cache. Each page is
    /// decoded straight into `T`s, and the cache keeps the pages' bodies as they came (a
    /// listing of 5000 VMs held as JSON values, then serialised again for the cache, was
    /// the better part of the manager's heap, #35).
    pub async fn list_fresh<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        collection: &str,
        api_version: &str,
        query: &[(&str, &str)],
    ) -> Result<Vec<T>, ArmError> {
        let since = self.cache.generation();
        let ttl = self.cache.ttls.of_list(collection);
        let keep = cacheable_query(query).filter(|_| !ttl.is_zero());
        let mut bodies = keep.map(|_| Vec::new());
        let items =
            self.list_pages(operation, collection, api_version, query, bodies.as_mut()).await?;
        if let (Some(expanded), Some(mut bodies)) = (keep, bodies) {
            // The pages as one JSON array of page objects (what `list` decodes).
            if bodies.is_empty() {
                bodies.push(b'[');
            }
            bodies.push(b']');
            self.cache.store(collection, ttl, bodies, expanded, since);
        }
        Ok(items)
    }

    /// Every page of a listing.
    /// `bodies`: where each page's body is appended as it came, as the elements of a JSON
    /// array (`[` before the first, `,` between; the caller closes it).
    async fn list_pages<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        collection: &str,
        api_version: &str,
        query: &[(&str, &str)],
        mut bodies: Option<&mut Vec<u8>>,
    ) -> Result<Vec<T>, ArmError> {
        let mut out = Vec::new();
        let mut next =
            Some(self.url(collection, api_version, query).map_err(|m| invalid_path(operation, m))?);
        let mut pages = 0u32;
        while let Some(url) = next.take() {
            pages += 1;
            if pages > 10_000 {
                return Err(ArmError::Decode {
                    operation,
                    resource: collection.to_string(),
                    message: "more than 10000 pages: nextLink loops".into(),
                });
            }
            let (page, body): (Page<T>, Vec<u8>) = self
                .options
                .retry
                .run(&self.options.deadline, operation, classify_read, || {
                    let url = url.clone();
                    async move {
                        let (_, _, body) =
                            self.send(operation, collection, Method::Get, url, None, None).await?;
                        Ok((Self::decode(operation, collection, &body)?, body))
                    }
                })
                .await?;
            if let Some(all) = bodies.as_deref_mut() {
                all.push(if all.is_empty() { b'[' } else { b',' });
                all.extend_from_slice(&body);
            }
            out.extend(page.value);
            if let Some(link) = page.next_link.filter(|l| !l.is_empty()) {
                let url =
                    Url::parse(&link).map_err(|e| bad_url(operation, collection, e.to_string()))?;
                self.same_origin(operation, collection, &url)?;
                next = Some(url);
            }
        }
        Ok(out)
    }

    /// Create-or-replace: PUT (retried only when not applied), wait for the operation, and
    /// return the resource as ARM shows it afterwards.
    pub async fn put<T: Serialize + DeserializeOwned>(
        &self,
        operation: &'static str,
        id: &str,
        api_version: &str,
        body: &T,
        if_match: Option<&str>,
    ) -> Result<T, ArmError> {
        // Our own write: the cached reads of this type are stale (before, and after: a read
        // cached meanwhile may predate it), whatever the outcome (a 412 says the cache was
        // stale already).
        self.cache.invalidate_type_of(id);
        let written = self.put_once(operation, id, api_version, body, if_match).await;
        self.cache.invalidate_type_of(id);
        written
    }

    async fn put_once<T: Serialize + DeserializeOwned>(
        &self,
        operation: &'static str,
        id: &str,
        api_version: &str,
        body: &T,
        if_match: Option<&str>,
    ) -> Result<T, ArmError> {
        let url = self.url(id, api_version, &[]).map_err(|m| invalid_path(operation, m))?;
        let bytes = serde_json::to_vec(body).map_err(|e| ArmError::Decode {
            operation,
            resource: id.to_string(),
            message: format!("encoding the request: {e}"),
        })?;
        let (status, headers, reply) =
            self.options
                .retry
                .run(&self.options.deadline, operation, classify_write, || {
                    let url = url.clone();
                    let bytes = &bytes;
                    async move {
                        self.send(operation, id, Method::Put, url, Some(bytes), if_match).await
                    }
                })
                .await?;
        if let Some(op_url) = headers.get_optional_str(&ASYNC_OPERATION) {
            self.wait(operation, id, op_url, retry_after(&headers)).await?;
            return self.get(operation, id, api_version, &[]).await;
        }
        let value: T = Self::decode(operation, id, &reply)?;
        if status == 201 || provisioning_pending(&reply) {
            // No operation to poll: read the resource until its provisioning state settles.
            return self.wait_provisioned(operation, id, &url, retry_after(&headers)).await;
        }
        Ok(value)
    }

    /// GETs the resource at `url` until its `provisioningState` is no longer in progress
    /// (bounded as every operation): `Succeeded` (or none) returns it, `Failed`/`Canceled`
    /// is [`ArmError::Operation`].
    async fn wait_provisioned<T: DeserializeOwned>(
        &self,
        operation: &'static str,
        id: &str,
        url: &Url,
        first_wait: Option<Duration>,
    ) -> Result<T, ArmError> {
        let mut last = Vec::new();
        self.poll(operation, id, url.as_str(), first_wait, |_, body| {
            let state = serde_json::from_slice::<serde_json::Value>(body)
                .ok()
                .and_then(|v| v["properties"]["provisioningState"].as_str().map(str::to_string));
            match state.as_deref().map(str::to_ascii_lowercase).as_deref() {
                None | Some("succeeded") => {
                    last = body.to_vec();
                    Ok(true)
                }
                Some("failed" | "canceled" | "cancelled") => Err(ArmError::Operation {
                    operation,
                    resource: id.to_string(),
                    status: state.unwrap_or_default(),
                    code: String::new(),
                    message: "the resource's provisioning state after the PUT".into(),
                }),
                Some(_) => Ok(false),
            }
        })
        .await?;
        Self::decode(operation, id, &last)
    }

    /// DELETE a resource and wait until it is gone; `Ok` when it was already gone.
    pub async fn delete(
        &self,
        operation: &'static str,
        id: &str,
        api_version: &str,
    ) -> Result<(), ArmError> {
        self.cache.invalidate_type_of(id);
        let deleted = self.delete_once(operation, id, api_version).await;
        self.cache.invalidate_type_of(id);
        deleted
    }

    async fn delete_once(
        &self,
        operation: &'static str,
        id: &str,
        api_version: &str,
    ) -> Result<(), ArmError> {
        let url = self.url(id, api_version, &[]).map_err(|m| invalid_path(operation, m))?;
        let sent = self
            .options
            .retry
            .run(&self.options.deadline, operation, classify_read, || {
                let url = url.clone();
                async move { self.send(operation, id, Method::Delete, url, None, None).await }
            })
            .await;
        let (status, headers, _) = match sent {
            Ok(r) => r,
            Err(e) if e.is_not_found() => return Ok(()),
            Err(e) => return Err(e),
        };
        if status != 202 {
            return Ok(());
        }
        if let Some(op_url) = headers.get_optional_str(&ASYNC_OPERATION) {
            return self.wait(operation, id, op_url, retry_after(&headers)).await;
        }
        if let Some(location) = headers.get_optional_str(&LOCATION) {
            return self.wait_location(operation, id, location, retry_after(&headers)).await;
        }
        Ok(())
    }

    /// Polls an `Azure-AsyncOperation` URL until `Succeeded` (bounded by
    /// [`ClientOptions::operation_timeout`]); `Failed`/`Canceled` is [`ArmError::Operation`].
    async fn wait(
        &self,
        operation: &'static str,
        resource: &str,
        op_url: &str,
        first_wait: Option<Duration>,
    ) -> Result<(), ArmError> {
        #[derive(serde::Deserialize)]
        struct OpStatus {
            #[serde(default)]
            status: String,
            #[serde(default)]
            error: Option<ErrorBody>,
        }
        self.poll(operation, resource, op_url, first_wait, |_, body| {
            let st: OpStatus = Self::decode(operation, resource, body)?;
            match st.status.to_ascii_lowercase().as_str() {
                "succeeded" => Ok(true),
                "failed" | "canceled" | "cancelled" => {
                    let err = st.error.unwrap_or_default();
                    Err(ArmError::Operation {
                        operation,
                        resource: resource.to_string(),
                        status: st.status,
                        code: err.code,
                        message: cut(&err.message),
                    })
                }
                _ => Ok(false),
            }
        })
        .await
    }

    /// Polls a `Location` URL until it answers 200/204 (202: still running).
    async fn wait_location(
        &self,
        operation: &'static str,
        resource: &str,
        location: &str,
        first_wait: Option<Duration>,
    ) -> Result<(), ArmError> {
        self.poll(operation, resource, location, first_wait, |status, _| Ok(status != 202)).await
    }

    /// GETs `url` (each poll retried as a read) until `done` says the operation ended: the
    /// first poll after `first_wait` (at least [`ClientOptions::poll_interval`]), then
    /// doubling up to 4× the interval, or ARM's `Retry-After` when it gives one; the whole
    /// wait bounded by [`ClientOptions::operation_timeout`].
    async fn poll(
        &self,
        operation: &'static str,
        resource: &str,
        url: &str,
        first_wait: Option<Duration>,
        mut done: impl FnMut(u16, &[u8]) -> Result<bool, ArmError>,
    ) -> Result<(), ArmError> {
        let url = Url::parse(url).map_err(|e| bad_url(operation, resource, e.to_string()))?;
        self.same_origin(operation, resource, &url)?;
        let base = self.options.poll_interval;
        Deadline::new(self.options.operation_timeout)
            .try_run(operation, async {
                let mut interval = first_wait.unwrap_or(base).max(base);
                loop {
                    tokio::time::sleep(interval).await;
                    let (status, headers, body) = self
                        .options
                        .retry
                        .run(&self.options.deadline, operation, classify_read, || {
                            let url = url.clone();
                            async move {
                                self.send(operation, resource, Method::Get, url, None, None).await
                            }
                        })
                        .await?;
                    if done(status, &body)? {
                        return Ok(());
                    }
                    let doubled = (interval * 2).min(base * 4);
                    interval = retry_after(&headers).map_or(doubled, |r| r.max(base));
                }
            })
            .await
    }
}

#[derive(Debug, Default, serde::Deserialize)]
struct ErrorBody {
    #[serde(default)]
    code: String,
    #[serde(default)]
    message: String,
}

fn cut(s: &str) -> String {
    s.chars().take(300).collect()
}

fn invalid_path(operation: &'static str, message: String) -> ArmError {
    ArmError::InvalidPath { operation, message }
}

fn bad_url(operation: &'static str, resource: &str, message: String) -> ArmError {
    ArmError::Decode {
        operation,
        resource: resource.to_string(),
        message: format!("bad URL: {message}"),
    }
}

fn retry_after(headers: &Headers) -> Option<Duration> {
    headers.get_optional_str(&RETRY_AFTER).and_then(ccm_core::cloud_call::parse_retry_after)
}

/// Whether a PUT's reply says the resource is still being provisioned.
fn provisioning_pending(body: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(body)
        .ok()
        .and_then(|v| v["properties"]["provisioningState"].as_str().map(str::to_ascii_lowercase))
        .is_some_and(|s| !matches!(s.as_str(), "succeeded" | "failed" | "canceled"))
}

fn status_error(
    operation: &'static str,
    resource: &str,
    status: u16,
    headers: &Headers,
    body: &[u8],
) -> ArmError {
    #[derive(serde::Deserialize)]
    struct Envelope {
        error: ErrorBody,
    }
    let (code, message) = match serde_json::from_slice::<Envelope>(body) {
        Ok(e) => (e.error.code, cut(&e.error.message)),
        // Not ARM's error body (a proxy's page, which may echo request headers): its size
        // only, never its text.
        Err(_) => (
            StatusCode::from(status).canonical_reason().to_string(),
            format!("not an ARM error body ({} bytes)", body.len()),
        ),
    };
    ArmError::Status {
        operation,
        resource: resource.to_string(),
        status,
        code,
        message,
        retry_after: retry_after(headers),
    }
}

/// `azure_core` errors carry the request's URL at most; their `Display` names the kind and
/// cause. Credential errors are the credential's own messages (they never include secrets).
fn transport_message(e: &azure_core::Error) -> String {
    cut(&e.to_string())
}

fn is_broken(e: &azure_core::Error) -> bool {
    // Core walks the source chain itself.
    ccm_core::cloud_call::is_broken_connection(e)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_carry_upstreams_labels() {
        assert_eq!(metric_request("network.load_balancers.get"), "load_balancers_get");
        assert_eq!(
            metric_request("network.public_ip_addresses.create_or_update"),
            "public_ip_addresses_create_or_update"
        );
        assert_eq!(metric_request("compute.virtual_machine_scale_set_vms.update"), "vmssvm_update");
        assert_eq!(metric_request("compute.virtual_machines.list"), "vm_list");
        assert_eq!(
            id_scope("/subscriptions/s-1/resourceGroups/My-RG/providers/Microsoft.Network/x"),
            (Some("s-1"), Some("My-RG"))
        );
        assert_eq!(
            id_scope("/subscriptions/s-1/providers/Microsoft.Network/x"),
            (Some("s-1"), None)
        );
    }

    /// `routeTableCacheTTLInSeconds` sets how long a route listing reuses the table read
    /// (upstream's 120 s when absent, 0: every listing reads), and `disableAPICallCache`
    /// turns it off with the other caches.
    #[test]
    fn the_route_table_cache_follows_its_key() {
        let ttl = |text: &str| CacheTtls::of(&Config::parse(text).unwrap()).route_table;
        let base = r#""cloud": "AzurePublicCloud", "tenantId": "t", "subscriptionId": "s", "aadClientId": "c", "aadClientSecret": "x", "resourceGroup": "rg", "location": "eastus""#;
        assert_eq!(ttl(&format!("{{{base}}}")), Duration::from_secs(120));
        assert_eq!(
            ttl(&format!(r#"{{{base}, "routeTableCacheTTLInSeconds": 30}}"#)),
            Duration::from_secs(30)
        );
        assert_eq!(
            ttl(&format!(r#"{{{base}, "routeTableCacheTTLInSeconds": 0}}"#)),
            Duration::ZERO
        );
        assert_eq!(
            ttl(&format!(
                r#"{{{base}, "routeTableCacheTTLInSeconds": 30, "disableAPICallCache": true}}"#
            )),
            Duration::ZERO
        );
        assert!(
            Config::parse(&format!(r#"{{{base}, "routeTableCacheTTLInSeconds": "soon"}}"#))
                .unwrap_err()
                .to_string()
                .contains("routeTableCacheTTLInSeconds")
        );
    }

    const SUB: &str = "8ecadfc9-0000-0000-0000-00000000abcd";

    fn client(endpoint: &str, allow_http: bool) -> Result<ArmClient, ClientError> {
        let config = Config {
            cloud: Some("AzureStackCloud".into()),
            resource_manager_endpoint: Some(endpoint.into()),
            tenant_id: Some("t".into()),
            subscription_id: Some(SUB.into()),
            aad_client_id: Some("c".into()),
            aad_client_secret: Some("s".into()),
            ..Config::default()
        };
        ArmClient::new(&config, ClientOptions { allow_http, ..ClientOptions::default() })
    }

    fn arm() -> ArmClient {
        client("https://arm.example", false).unwrap()
    }

    #[test]
    fn urls_are_built_segment_by_segment_under_the_subscription() {
        let c = arm();
        let id = c.resource_id("rg", "Microsoft.Network/publicIPAddresses", "pip").unwrap();
        let url = c.url(&id, "2024-05-01", &[("$expand", "x y")]).unwrap();
        assert_eq!(
            url.as_str(),
            format!(
                "https://arm.example/subscriptions/{SUB}/resourceGroups/rg/providers/Microsoft.Network/publicIPAddresses/pip?api-version=2024-05-01&%24expand=x+y"
            )
        );
        // Parentheses (legal in resource group names) go as they are; other characters
        // are percent-encoded within their segment.
        let id = c.resource_id("MC_rg_(x)", "Microsoft.Compute/virtualMachines", "vm").unwrap();
        assert!(c.url(&id, "v", &[]).unwrap().path().contains("/MC_rg_(x)/"));
        let id = c.resource_id("grün", "Microsoft.Compute/virtualMachines", "vm").unwrap();
        assert!(c.url(&id, "v", &[]).unwrap().path().contains("/gr%C3%BCn/"));
    }

    #[test]
    fn no_name_reaches_another_path_query_or_fragment() {
        let c = arm();
        let ty = "Microsoft.Network/publicIPAddresses";
        // What MED 5 spliced: each refused when the ID is built…
        for (rg, name) in [
            ("rg", "../networkSecurityGroups/k8s-nsg"),
            ("rg", "pip?api-version=2019-02-01"),
            ("rg", "pip#"),
            ("rg", "a/b"),
            ("rg", ".."),
            ("rg", "%2e%2e"),
            ("rg/providers/Microsoft.Network/networkSecurityGroups/k8s-nsg?api-version=1&x=", "p"),
            ("..", "p"),
            ("rg#", "p"),
            ("", "p"),
            ("rg", ""),
        ] {
            assert!(
                matches!(c.resource_id(rg, ty, name), Err(ArmError::InvalidPath { .. })),
                "{rg:?} {name:?}"
            );
        }
        // …and by the one URL builder, whatever a caller splices itself.
        let base = format!("/subscriptions/{SUB}/resourceGroups/rg/providers/{ty}");
        for path in [
            format!("{base}/../networkSecurityGroups/k8s-nsg"),
            format!("{base}/./p"),
            format!("{base}/p?api-version=2019-02-01"),
            format!("{base}/p#x"),
            format!("{base}/p%2F..%2Fx"),
            format!("{base}//p"),
            format!("{base}/p\\..\\x"),
            format!("{base}/p\n"),
            "/subscriptions/00000000-0000-0000-0000-000000000000/resourceGroups/rg".to_string(),
            format!("/subscriptions/{SUB}/../other/resourceGroups/rg"),
            "https://evil.example/subscriptions/x".to_string(),
            "subscriptions/x".to_string(),
        ] {
            assert!(c.url(&path, "v", &[]).is_err(), "{path:?}");
        }
        // The api-version is always the client's own.
        let url = c.url(&format!("{base}/p"), "2024-05-01", &[("api-version", "x")]).unwrap();
        assert_eq!(url.query_pairs().find(|(k, _)| k == "api-version").unwrap().1, "2024-05-01");
        // A refused path is an invalid-input error for the controllers, not a cloud fault.
        let e = c.resource_id("rg", ty, "a/b").unwrap_err();
        assert!(matches!(ProviderError::from(e), ProviderError::Invalid { .. }));
    }

    #[test]
    fn plain_http_endpoints_need_the_opt_in() {
        let e = client("http://arm.example", false).unwrap_err().to_string();
        assert!(e.contains("resourceManagerEndpoint") && e.contains("http://"), "{e}");
        assert!(e.contains(ALLOW_HTTP_ENV), "{e}");
        let config = Config {
            cloud: Some("AzureStackCloud".into()),
            resource_manager_endpoint: Some("http://arm.example".into()),
            ..Config::default()
        };
        let opted_in = ClientOptions { allow_http: true, ..ClientOptions::default() };
        assert!(CloudEndpoints::resolve(&config, &opted_in).is_ok());
        let login = ClientOptions {
            authority_host: Some("http://login.example".into()),
            ..ClientOptions::default()
        };
        let e = CloudEndpoints::resolve(&Config::default(), &login).unwrap_err().to_string();
        assert!(e.contains("AZURE_AUTHORITY_HOST"), "{e}");
        assert!(client("ftp://arm.example", true).is_err());
        assert!(allow_http(Some("true")) && allow_http(Some("1")) && !allow_http(Some("yes")));
        assert!(!allow_http(None));
        assert!(check_scheme("https://login.example", false).is_ok());
        assert!(check_scheme("http://login.example", false).is_err());
    }
}
