//! `auth-provider-gcp`: the kubelet image credential provider for Google's registries, as
//! upstream's `cmd/auth-provider-gcp` and `pkg/gcpcredential`.
//!
//! `auth-provider-gcp get-credentials [--authFlow=gcr|dockercfg|dockercfg-url]` reads one
//! `CredentialProviderRequest` on stdin and writes the response on stdout (exit 0), or one line
//! on stderr (exit 1). The flows, all through the metadata server (`GCE_METADATA_HOST`, else
//! `metadata.google.internal`, header `Metadata-Flavor: Google`):
//!
//! - `gcr` (the default, as upstream): the default service account's access token
//!   (`instance/service-accounts/default/token`) as `{username: "_token", password: <token>}`
//!   for [`REGISTRY_PATTERNS`] and the image's own registry when it is one of Google's
//!   ([`google_registry`]; never another host, look-alikes included). The account's scopes
//!   (`…/default/scopes`) must include a storage scope (`devstorage.*`) or `cloud-platform`,
//!   upstream's registry check.
//! - `dockercfg`: the instance attribute `google-dockercfg`, a `.dockercfg` JSON.
//! - `dockercfg-url`: the instance attribute `google-dockercfg-url`, an http(s) URL answering a
//!   `.dockercfg` JSON (fetched without the metadata header).
//!
//! The kubelet caches the answer as upstream tells it: `KUBE_SIDECAR_CACHE_DURATION` (a Go
//! duration, default 0 = not cached) and `KUBE_SIDECAR_CACHE_TYPE` (`image` (default),
//! `registry`, `global`).
//!
//! Changed from upstream (each in the crate README): a failure is exit 1 with a message
//! (upstream answers an empty `auth` and exit 0, so the kubelet pulls anonymously without a
//! word; it does that on exit 1 too, and logs the message); the scope check refuses a token
//! Google's registries would refuse (upstream's plugin never runs that check); the response
//! carries the request's apiVersion (upstream always writes `v1`, which the kubelet rejects
//! when configured with `v1beta1`); a cache duration longer than the token's lifetime is cut
//! to it; `{"auths": {…}}` (config.json) is read as well as the legacy `.dockercfg` map; the
//! metadata host honours `GCE_METADATA_HOST`; every request is bounded (10 s, as upstream's
//! client) and the whole answer by [`PLUGIN_DEADLINE`], where upstream's scope check retried
//! without end.
//!
//! Workload Identity image pulls (issue #32), as upstream's `gcr` flow: with
//! `--identity-provider=URL --project-id=P`, a request whose Service Account is annotated
//! `iam.gke.io/enable-wi-image-pull: "true"` trades the Pod's Service Account token (the
//! kubelet sends it with `tokenAttributes`) at Google's Security Token Service
//! ([`STS_ENDPOINT`], `POST` JSON: `grant_type` token-exchange, `subject_token_type` jwt,
//! `requested_token_type` access_token, scope `cloud-platform`, audience
//! `identitynamespace:<P>.svc.id.goog:<URL>`) for a federated access token, answered as
//! `_token` for Google's registries. Opted in without a token, or a failed exchange: an error,
//! never a fall-back to the node's account (upstream's fail-fast). Other requests use the node's
//! account. The exchange is bounded by [`STS_TIMEOUT`] (upstream's 30 s) within the whole
//! answer's deadline; the Service Account token and the access token are never logged.
//! `AUTH_PROVIDER_GCP_STS_ENDPOINT` points it elsewhere (a private endpoint, tests): https,
//! or http on a loopback host only.
//!
//! Tokens and passwords never reach stderr: errors name the metadata path, the attribute or
//! the URL's scheme and host, never a body or a full URL (a signed URL is a credential).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use base64::Engine as _;
use ccm_core::cloud_call::{Classified, Deadline, DeadlineExceeded, Retry};
use ccm_core::credential::{
    self, AuthConfig, CacheKeyType, CredentialProviderRequest, CredentialProviderResponse,
};
use ccm_core::manager::duration;

use crate::client::{METADATA_HOST, METADATA_HOST_ENV};

/// The bound on one answer, every retry included: below the kubelet's one-minute exec
/// timeout.
pub const PLUGIN_DEADLINE: Duration = Duration::from_secs(45);

/// The bound on one HTTP request (upstream's `metadataHTTPClientTimeout`).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);

/// The registries the `gcr` flow's token is for (upstream's `containerRegistryUrls`; host
/// parts may be globs, as in `matchImages`).
pub const REGISTRY_PATTERNS: [&str; 4] =
    ["container.cloud.google.com", "gcr.io", "*.gcr.io", "*.pkg.dev"];

/// The registry username that means "the password is an OAuth access token".
pub const TOKEN_USERNAME: &str = "_token";

/// A scope starting with this grants storage access (`devstorage.read_only`,
/// `devstorage.read_write`, `devstorage.full_control`).
pub const STORAGE_SCOPE_PREFIX: &str = "https://www.googleapis.com/auth/devstorage";

/// A scope starting with this implies storage access.
pub const CLOUD_PLATFORM_SCOPE_PREFIX: &str = "https://www.googleapis.com/auth/cloud-platform";

/// The instance attribute of the `dockercfg` flow.
pub const DOCKERCFG_ATTRIBUTE: &str = "google-dockercfg";

/// The instance attribute of the `dockercfg-url` flow.
pub const DOCKERCFG_URL_ATTRIBUTE: &str = "google-dockercfg-url";

/// How long the kubelet may cache an answer (a Go duration; upstream's variable).
pub const CACHE_DURATION_ENV: &str = "KUBE_SIDECAR_CACHE_DURATION";

/// How the kubelet keys its cache: `image`, `registry` or `global` (upstream's variable).
pub const CACHE_TYPE_ENV: &str = "KUBE_SIDECAR_CACHE_TYPE";

/// Google's Security Token Service token exchange (upstream's `googleSTSEndpoint`).
pub const STS_ENDPOINT: &str = "https://sts.googleapis.com/v1/token";

/// The environment variable overriding [`STS_ENDPOINT`] (not upstream's: private endpoints and
/// tests; https, or http on a loopback host).
pub const STS_ENDPOINT_ENV: &str = "AUTH_PROVIDER_GCP_STS_ENDPOINT";

/// The bound on the STS exchange (upstream's `stsHTTPClientTimeout`).
pub const STS_TIMEOUT: Duration = Duration::from_secs(30);

/// The Service Account annotation opting a Pod's pulls into Workload Identity.
pub const WORKLOAD_IDENTITY_ANNOTATION: &str = "iam.gke.io/enable-wi-image-pull";

/// The largest reply read (upstream's `maxReadLength`).
pub const MAX_REPLY: usize = 10 << 20;

const USAGE: &str = "usage: auth-provider-gcp get-credentials [--authFlow=gcr|dockercfg|dockercfg-url] \
                     [--identity-provider=URL --project-id=PROJECT] < CredentialProviderRequest";

/// Where the credentials come from (`--authFlow`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFlow {
    /// `gcr`: the default service account's token.
    Gcr,
    /// `dockercfg`: the `google-dockercfg` instance attribute.
    DockerCfg,
    /// `dockercfg-url`: the URL in the `google-dockercfg-url` instance attribute.
    DockerCfgUrl,
}

impl AuthFlow {
    /// The flag's value.
    pub fn as_str(self) -> &'static str {
        match self {
            AuthFlow::Gcr => "gcr",
            AuthFlow::DockerCfg => "dockercfg",
            AuthFlow::DockerCfgUrl => "dockercfg-url",
        }
    }

    /// The flow a `--authFlow` value names.
    pub fn parse(value: &str) -> Result<AuthFlow, AuthError> {
        [AuthFlow::Gcr, AuthFlow::DockerCfg, AuthFlow::DockerCfgUrl]
            .into_iter()
            .find(|f| f.as_str() == value)
            .ok_or_else(|| {
                AuthError::Usage(format!(
                    "invalid value {value:?} for --authFlow (must be one of \"gcr\", \
                     \"dockercfg\", or \"dockercfg-url\")"
                ))
            })
    }
}

/// Why no credentials could be given. Messages never hold a token, a password, a reply body
/// or a full URL.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// A bad command line.
    #[error("{0}")]
    Usage(String),
    /// A bad environment variable.
    #[error("{name}: {message}")]
    Env {
        /// The variable.
        name: &'static str,
        /// Why.
        message: String,
    },
    /// The metadata server (or the dockercfg URL) could not be read.
    #[error("reading {what}: {message}")]
    Read {
        /// `metadata server instance/…`, or the URL's scheme and host.
        what: String,
        /// Why (the HTTP status or the transport error).
        message: String,
        /// Worth another attempt (5xx, 429, a broken connection, a timeout).
        transient: bool,
    },
    /// The metadata server has no such value (404).
    #[error("{0}")]
    NotSet(String),
    /// The default service account's scopes do not let it read Google's registries.
    #[error(
        "the instance's default service account has no storage scope (one starting with \
         {STORAGE_SCOPE_PREFIX} or {CLOUD_PLATFORM_SCOPE_PREFIX}; it has: {scopes}): Google's \
         registries would refuse its token"
    )]
    NoStorageScope {
        /// The scopes it has, comma-separated.
        scopes: String,
    },
    /// A reply that does not mean what it should (never quoted).
    #[error("{0}")]
    Reply(String),
    /// A Workload Identity pull that cannot be done (the message says why, never a token).
    #[error(
        "Workload Identity image pull (the Pod's Service Account is annotated \
         {WORKLOAD_IDENTITY_ANNOTATION}): {0}"
    )]
    WorkloadIdentity(String),
    /// The answer took longer than [`PLUGIN_DEADLINE`].
    #[error(transparent)]
    Deadline(#[from] DeadlineExceeded),
}

/// What the command line and the environment ask for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Options {
    /// `--authFlow`.
    pub flow: AuthFlow,
    /// `--identity-provider` (Workload Identity).
    pub identity_provider: Option<String>,
    /// `--project-id` (Workload Identity).
    pub project_id: Option<String>,
    /// Google's STS token endpoint ([`STS_ENDPOINT`], or [`STS_ENDPOINT_ENV`]).
    pub sts_endpoint: String,
    /// The metadata server's root URL (`http://host[:port]`).
    pub metadata_root: String,
    /// The bound on one HTTP request.
    pub request_timeout: Duration,
    /// The bound on the whole answer.
    pub deadline: Duration,
    /// Retries of transient faults within the deadline.
    pub retry: Retry,
    /// How long the kubelet may cache the answer.
    pub cache_duration: Duration,
    /// How the kubelet keys its cache.
    pub cache_key_type: CacheKeyType,
}

impl Options {
    /// The options for the arguments after the program name and the environment `env`.
    /// `Ok(None)`: `--help` was asked for.
    pub fn from_args(
        args: &[String],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Options>, AuthError> {
        let Some(flags) = parse_args(args)? else { return Ok(None) };
        if flags.identity_provider.is_some() && flags.project_id.is_none() {
            return Err(AuthError::Usage(
                "--project-id is required when --identity-provider is set".into(),
            ));
        }
        let cache_duration = match env(CACHE_DURATION_ENV).filter(|v| !v.is_empty()) {
            None => Duration::ZERO,
            Some(v) => duration::parse(&v).map_err(|e| AuthError::Env {
                name: CACHE_DURATION_ENV,
                message: format!("not a duration (e.g. 1m, 30s): {}", e.reason),
            })?,
        };
        let cache_key_type = match env(CACHE_TYPE_ENV).as_deref() {
            None | Some("") | Some("image") => CacheKeyType::Image,
            Some("registry") => CacheKeyType::Registry,
            Some("global") => CacheKeyType::Global,
            Some(_) => {
                return Err(AuthError::Env {
                    name: CACHE_TYPE_ENV,
                    message: "must be image, registry or global".into(),
                });
            }
        };
        let sts_endpoint = match env(STS_ENDPOINT_ENV).filter(|v| !v.trim().is_empty()) {
            None => STS_ENDPOINT.to_string(),
            Some(v) => sts_endpoint(v.trim())?,
        };
        Ok(Some(Options {
            flow: flags.flow,
            identity_provider: flags.identity_provider,
            project_id: flags.project_id,
            sts_endpoint,
            metadata_root: metadata_root(env(METADATA_HOST_ENV).as_deref()),
            request_timeout: REQUEST_TIMEOUT,
            deadline: PLUGIN_DEADLINE,
            retry: Retry::default(),
            cache_duration,
            cache_key_type,
        }))
    }
}

/// An STS endpoint from [`STS_ENDPOINT_ENV`]: https, or http on a loopback host (the Pod's
/// Service Account token is sent there). The value is never quoted back.
fn sts_endpoint(v: &str) -> Result<String, AuthError> {
    let bad = |why: &str| AuthError::Env { name: STS_ENDPOINT_ENV, message: why.to_string() };
    let url = reqwest::Url::parse(v).map_err(|_| bad("not a URL"))?;
    if !url.username().is_empty() || url.password().is_some() {
        return Err(bad("must not carry user information"));
    }
    let loopback = match url.host() {
        Some(url::Host::Domain(d)) => d == "localhost",
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    };
    match url.scheme() {
        "https" => Ok(url.to_string()),
        "http" if loopback => Ok(url.to_string()),
        _ => Err(bad("must be an https URL (http only on a loopback host)")),
    }
}

/// The metadata server's root URL for a `GCE_METADATA_HOST` value (`host[:port]`, or a URL).
pub fn metadata_root(host: Option<&str>) -> String {
    let host = host.map(str::trim).filter(|h| !h.is_empty()).unwrap_or(METADATA_HOST);
    let host = host.trim_end_matches('/');
    if host.starts_with("http://") || host.starts_with("https://") {
        host.to_string()
    } else {
        format!("http://{host}")
    }
}

#[derive(Debug, Default)]
struct Flags {
    flow: Option<AuthFlow>,
    identity_provider: Option<String>,
    project_id: Option<String>,
}

struct ParsedFlags {
    flow: AuthFlow,
    identity_provider: Option<String>,
    project_id: Option<String>,
}

/// klog's flags, which upstream's command accepts (the kubelet's config often passes
/// `--v=N`): taking a value, and boolean.
const KLOG_VALUE_FLAGS: [&str; 7] = [
    "v",
    "vmodule",
    "stderrthreshold",
    "log_dir",
    "log_file",
    "log_file_max_size",
    "log_backtrace_at",
];
const KLOG_BOOL_FLAGS: [&str; 7] = [
    "logtostderr",
    "alsologtostderr",
    "skip_headers",
    "skip_log_headers",
    "add_dir_header",
    "one_output",
    "legacy_stderr_threshold_behavior",
];

/// The command line as cobra/pflag read it: `--flag=value`, `--flag value`, `-a value`,
/// `-a=value`, `-avalue`; flags anywhere; one positional, `get-credentials`.
fn parse_args(args: &[String]) -> Result<Option<ParsedFlags>, AuthError> {
    let usage = |m: String| AuthError::Usage(format!("{m}; {USAGE}"));
    let mut flags = Flags::default();
    let mut command = None;
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        if arg == "-h" || arg == "--help" {
            return Ok(None);
        }
        if arg == "--" {
            if let Some(extra) = it.next() {
                command.get_or_insert(extra.clone());
            }
            continue;
        }
        let (name, inline) = if let Some(long) = arg.strip_prefix("--") {
            match long.split_once('=') {
                Some((n, v)) => (n.to_string(), Some(v.to_string())),
                None => (long.to_string(), None),
            }
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            let mut chars = short.chars();
            let letter = chars.next().map(String::from).unwrap_or_default();
            let rest = chars.as_str();
            let value = rest.strip_prefix('=').unwrap_or(rest);
            (letter, (!rest.is_empty()).then(|| value.to_string()))
        } else {
            if command.is_some() {
                return Err(usage(format!("unexpected argument {arg:?}")));
            }
            command = Some(arg.clone());
            continue;
        };
        let mut value = |name: &str| -> Result<String, AuthError> {
            match &inline {
                Some(v) => Ok(v.clone()),
                None => {
                    it.next().cloned().ok_or_else(|| usage(format!("flag --{name} needs a value")))
                }
            }
        };
        match name.as_str() {
            "authFlow" | "a" => flags.flow = Some(AuthFlow::parse(&value("authFlow")?)?),
            "identity-provider" => {
                flags.identity_provider =
                    Some(value("identity-provider")?).filter(|v| !v.is_empty())
            }
            "project-id" => flags.project_id = Some(value("project-id")?).filter(|v| !v.is_empty()),
            n if KLOG_VALUE_FLAGS.contains(&n) => {
                value(n)?;
            }
            n if KLOG_BOOL_FLAGS.contains(&n) => {
                if let Some(v) = &inline
                    && ccm_core::gcfg::parse_bool(v).is_none()
                {
                    return Err(usage(format!("flag --{n} takes true or false")));
                }
            }
            _ => {
                return Err(usage(format!(
                    "unknown flag {:?}",
                    arg.split('=').next().unwrap_or(arg)
                )));
            }
        }
    }
    match command.as_deref() {
        Some("get-credentials") => Ok(Some(ParsedFlags {
            flow: flags.flow.unwrap_or(AuthFlow::Gcr),
            identity_provider: flags.identity_provider,
            project_id: flags.project_id,
        })),
        Some(other) => Err(usage(format!("unknown command {other:?}"))),
        None => Err(usage("no command".into())),
    }
}

/// The plugin's HTTP client and options.
#[derive(Debug, Clone)]
pub struct Provider {
    options: Options,
    http: reqwest::Client,
}

impl Provider {
    /// A provider for `options`.
    pub fn new(options: Options) -> Result<Provider, AuthError> {
        let http = reqwest::Client::builder()
            .timeout(options.request_timeout)
            .connect_timeout(options.request_timeout)
            .user_agent("auth-provider-gcp (ccm-rs) image pull")
            .build()
            .map_err(|e| AuthError::Usage(format!("cannot build the HTTP client: {e}")))?;
        Ok(Provider { options, http })
    }

    /// The options.
    pub fn options(&self) -> &Options {
        &self.options
    }

    /// The answer to `req`, within the deadline.
    pub async fn provide(
        &self,
        req: &CredentialProviderRequest,
    ) -> Result<CredentialProviderResponse, AuthError> {
        let deadline = Deadline::new(self.options.deadline);
        let operation = format!("auth-provider-gcp {}", self.options.flow.as_str());
        deadline.run(operation, self.provide_now(req)).await?
    }

    async fn provide_now(
        &self,
        req: &CredentialProviderRequest,
    ) -> Result<CredentialProviderResponse, AuthError> {
        let mut cache = self.options.cache_duration;
        let auth = match self.options.flow {
            AuthFlow::Gcr => {
                let opted_in = req
                    .service_account_annotations
                    .as_ref()
                    .and_then(|a| a.get(WORKLOAD_IDENTITY_ANNOTATION))
                    .is_some_and(|v| v == "true");
                if let (Some(idp), true) = (self.options.identity_provider.as_deref(), opted_in) {
                    let ksa = req.service_account_token.as_deref().unwrap_or_default();
                    if ksa.is_empty() {
                        return Err(AuthError::WorkloadIdentity(
                            "the kubelet sent no Service Account token (its credential provider \
                             config needs tokenAttributes); not falling back to the node's account"
                                .into(),
                        ));
                    }
                    let (token, lifetime) = self.sts_exchange(idp, ksa).await?;
                    if let Some(lifetime) = lifetime {
                        cache = cache.min(lifetime);
                    }
                    let auth = registry_auth(&req.image, &token);
                    return Ok(req.respond(self.options.cache_key_type, Some(cache), auth));
                }
                self.check_scopes().await?;
                let (token, lifetime) = self.token().await?;
                if let Some(lifetime) = lifetime {
                    cache = cache.min(lifetime);
                }
                registry_auth(&req.image, &token)
            }
            AuthFlow::DockerCfg => {
                let body = self.metadata_attribute(DOCKERCFG_ATTRIBUTE).await?;
                parse_dockercfg(&body).map_err(|m| {
                    AuthError::Reply(format!("instance attribute {DOCKERCFG_ATTRIBUTE}: {m}"))
                })?
            }
            AuthFlow::DockerCfgUrl => {
                let body = self.metadata_attribute(DOCKERCFG_URL_ATTRIBUTE).await?;
                let text = String::from_utf8(body).map_err(|_| {
                    AuthError::Reply(format!(
                        "instance attribute {DOCKERCFG_URL_ATTRIBUTE} is not UTF-8 text"
                    ))
                })?;
                let url = dockercfg_url(text.trim())?;
                let origin = origin_of(&url);
                let body = self.get(&origin, url, false).await?;
                parse_dockercfg(&body).map_err(|m| {
                    AuthError::Reply(format!(
                        "the dockercfg at {origin} (instance attribute \
                         {DOCKERCFG_URL_ATTRIBUTE}): {m}"
                    ))
                })?
            }
        };
        Ok(req.respond(self.options.cache_key_type, Some(cache), auth))
    }

    /// Upstream's registry check: the default service account's scopes allow storage reads.
    async fn check_scopes(&self) -> Result<(), AuthError> {
        let path = "instance/service-accounts/default/scopes";
        let body = match self.metadata(path).await {
            Err(AuthError::NotSet(_)) => {
                return Err(AuthError::NotSet(
                    "the instance has no default service account (metadata server: \
                     instance/service-accounts/default/scopes not found)"
                        .into(),
                ));
            }
            other => other?,
        };
        let text = String::from_utf8_lossy(&body);
        let scopes: Vec<&str> = text.lines().map(str::trim).filter(|s| !s.is_empty()).collect();
        if scopes.iter().any(|s| {
            s.starts_with(STORAGE_SCOPE_PREFIX) || s.starts_with(CLOUD_PLATFORM_SCOPE_PREFIX)
        }) {
            Ok(())
        } else {
            let scopes = if scopes.is_empty() { "none".into() } else { scopes.join(", ") };
            Err(AuthError::NoStorageScope { scopes })
        }
    }

    /// The default service account's access token and how long it lives.
    async fn token(&self) -> Result<(String, Option<Duration>), AuthError> {
        #[derive(serde::Deserialize)]
        struct Token {
            #[serde(default)]
            access_token: String,
            #[serde(default)]
            expires_in: Option<u64>,
        }
        let path = "instance/service-accounts/default/token";
        let body = self.metadata(path).await?;
        // Never quote the reply: it is a token.
        let token: Token = serde_json::from_slice(&body).map_err(|e| {
            AuthError::Reply(format!(
                "metadata server {path}: not a token reply (JSON error at line {} column {})",
                e.line(),
                e.column()
            ))
        })?;
        if token.access_token.is_empty() {
            return Err(AuthError::Reply(format!(
                "metadata server {path}: the reply has no access_token"
            )));
        }
        Ok((token.access_token, token.expires_in.map(Duration::from_secs)))
    }

    /// Upstream's `exchangeKSATokenForFederated`: the Service Account token `ksa` for a
    /// federated access token at STS, within [`STS_TIMEOUT`]; not retried (a token exchange
    /// is not known to be idempotent). Errors carry STS's OAuth error code, never a token.
    async fn sts_exchange(
        &self,
        identity_provider: &str,
        ksa: &str,
    ) -> Result<(String, Option<Duration>), AuthError> {
        #[derive(serde::Deserialize)]
        struct Answer {
            #[serde(default)]
            access_token: String,
            #[serde(default)]
            expires_in: Option<u64>,
        }
        #[derive(serde::Deserialize)]
        struct OauthError {
            #[serde(default)]
            error: String,
        }
        let wi = AuthError::WorkloadIdentity;
        let Some(project) = self.options.project_id.as_deref() else {
            return Err(wi("--project-id is not set".into()));
        };
        let body = serde_json::json!({
            "audience": format!("identitynamespace:{project}.svc.id.goog:{identity_provider}"),
            "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
            "requested_token_type": "urn:ietf:params:oauth:token-type:access_token",
            "scope": "https://www.googleapis.com/auth/cloud-platform",
            "subject_token": ksa,
            "subject_token_type": "urn:ietf:params:oauth:token-type:jwt",
        });
        let send = self
            .http
            .post(&self.options.sts_endpoint)
            .timeout(STS_TIMEOUT)
            .header("Content-Type", "application/json")
            .body(body.to_string())
            .send();
        let mut resp = send
            .await
            .map_err(|e| wi(format!("the STS token exchange failed: {}", transport_error(&e))))?;
        let status = resp.status();
        let mut reply = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| wi(format!("the STS reply broke off: {}", transport_error(&e))))?
        {
            if reply.len() + chunk.len() > MAX_REPLY {
                return Err(wi(format!("the STS reply is larger than {MAX_REPLY} bytes")));
            }
            reply.extend_from_slice(&chunk);
        }
        if !status.is_success() {
            let code = serde_json::from_slice::<OauthError>(&reply)
                .ok()
                .map(|e| e.error)
                .filter(|c| {
                    !c.is_empty() && c.len() < 64 && c.bytes().all(|b| b.is_ascii_graphic())
                })
                .unwrap_or_else(|| "no OAuth error code".into());
            return Err(wi(format!(
                "the STS token exchange was refused: HTTP {status} ({code}); not falling back to the node's account"
            )));
        }
        // Never quote the reply: it holds a token.
        let answer: Answer = serde_json::from_slice(&reply)
            .map_err(|_| wi("the STS reply is not a token answer".into()))?;
        if answer.access_token.is_empty() {
            return Err(wi("the STS reply has no access_token".into()));
        }
        Ok((answer.access_token, answer.expires_in.map(Duration::from_secs)))
    }

    async fn metadata_attribute(&self, name: &'static str) -> Result<Vec<u8>, AuthError> {
        match self.metadata(&format!("instance/attributes/{name}")).await {
            Err(AuthError::NotSet(_)) => {
                Err(AuthError::NotSet(format!("the instance attribute {name} is not set")))
            }
            other => other,
        }
    }

    async fn metadata(&self, path: &str) -> Result<Vec<u8>, AuthError> {
        let url = format!("{}/computeMetadata/v1/{path}", self.options.metadata_root);
        let url = reqwest::Url::parse(&url).map_err(|e| {
            AuthError::Usage(format!("{METADATA_HOST_ENV} does not make a URL: {e}"))
        })?;
        self.get(&format!("metadata server {path}"), url, true).await
    }

    /// One GET, retried on transient faults within the deadline. `what` names it in errors.
    async fn get(
        &self,
        what: &str,
        url: reqwest::Url,
        metadata: bool,
    ) -> Result<Vec<u8>, AuthError> {
        let classify = |e: &AuthError| match e {
            AuthError::Read { transient: true, .. } => Classified::Transient { retry_after: None },
            _ => Classified::Permanent,
        };
        let attempts = self.options.retry.attempts_within(
            self.options.deadline,
            what.to_string(),
            classify,
            || self.get_once(what, url.clone(), metadata),
        );
        attempts.await
    }

    async fn get_once(
        &self,
        what: &str,
        url: reqwest::Url,
        metadata: bool,
    ) -> Result<Vec<u8>, AuthError> {
        let read = |message: String, transient: bool| AuthError::Read {
            what: what.to_string(),
            message,
            transient,
        };
        let mut request = self.http.get(url);
        if metadata {
            request = request.header("Metadata-Flavor", "Google");
        }
        // Transport errors may hold the URL: only their kind is shown.
        let mut resp = request.send().await.map_err(|e| read(transport_error(&e), true))?;
        let status = resp.status();
        if status == reqwest::StatusCode::NOT_FOUND && metadata {
            return Err(AuthError::NotSet(format!("{what}: not found")));
        }
        if !status.is_success() {
            let transient = status.is_server_error() || status.as_u16() == 429;
            return Err(read(format!("HTTP {status}"), transient));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp.chunk().await.map_err(|e| read(transport_error(&e), true))? {
            if body.len() + chunk.len() > MAX_REPLY {
                return Err(read(format!("the reply is larger than {MAX_REPLY} bytes"), false));
            }
            body.extend_from_slice(&chunk);
        }
        Ok(body)
    }
}

/// What went wrong with a request, without its URL.
fn transport_error(e: &reqwest::Error) -> String {
    let kind = if e.is_timeout() {
        "timed out"
    } else if e.is_connect() {
        "cannot connect"
    } else if e.is_redirect() {
        "too many redirects"
    } else if e.is_body() || e.is_decode() {
        "the reply broke off"
    } else {
        "request failed"
    };
    let mut source = std::error::Error::source(e);
    let mut detail = None;
    // The innermost cause (an I/O error kind, a TLS error) names no URL.
    while let Some(s) = source {
        detail = Some(s.to_string());
        source = s.source();
    }
    match detail {
        Some(d) if !d.contains("://") => format!("{kind}: {d}"),
        _ => kind.to_string(),
    }
}

/// The URL of the `dockercfg-url` flow: http(s) only, as upstream.
fn dockercfg_url(text: &str) -> Result<reqwest::Url, AuthError> {
    let bad =
        |m: &str| AuthError::Reply(format!("instance attribute {DOCKERCFG_URL_ATTRIBUTE}: {m}"));
    if text.is_empty() {
        return Err(bad("empty"));
    }
    let url = reqwest::Url::parse(text).map_err(|e| bad(&format!("not a URL ({e})")))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(bad(&format!(
            "unsupported URL scheme {:?} (http and https only, as upstream)",
            url.scheme()
        )));
    }
    Ok(url)
}

/// `scheme://host[:port]`: how a URL is named in errors (its path, query and user
/// information may be credentials).
fn origin_of(url: &reqwest::Url) -> String {
    match (url.host_str(), url.port()) {
        (Some(h), Some(p)) => format!("{}://{h}:{p}", url.scheme()),
        (Some(h), None) => format!("{}://{h}", url.scheme()),
        _ => format!("{}://", url.scheme()),
    }
}

/// The `gcr` flow's answer: `_token` / the token for upstream's registries, and for the
/// image's own registry only when that is one of Google's (see [`google_registry`]): the
/// node's token is never handed to another host, whatever pattern made the kubelet ask.
fn registry_auth(image: &str, token: &str) -> BTreeMap<String, AuthConfig> {
    let entry = AuthConfig { username: TOKEN_USERNAME.into(), password: token.to_string() };
    let mut auth: BTreeMap<String, AuthConfig> =
        REGISTRY_PATTERNS.iter().map(|r| (r.to_string(), entry.clone())).collect();
    if let Some(registry) = google_registry(image) {
        auth.insert(registry.to_string(), entry);
    }
    auth
}

/// The image's registry host when it is one of Google's: `gcr.io`, `<name>.gcr.io`,
/// `<name>.pkg.dev` (Artifact Registry) or `container.cloud.google.com`, written as a plain
/// lower-case host name (no port, no user information). `None` for any other image: Docker
/// Hub names without a host (`library/nginx`), other hosts, and look-alikes such as
/// `gcr.io.example.com/…` or `example.com/gcr.io/…`.
pub fn google_registry(image: &str) -> Option<&str> {
    let image = image.strip_prefix("https://").unwrap_or(image);
    let (host, _) = image.split_once('/')?;
    let plain = !host.is_empty()
        && host
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && host.split('.').all(|label| !label.is_empty() && !label.starts_with('-'));
    if !plain {
        return None;
    }
    let sub_of = |domain: &str| {
        host.strip_suffix(domain)
            .and_then(|rest| rest.strip_suffix('.'))
            .is_some_and(|name| !name.is_empty() && !name.contains('.'))
    };
    (host == "gcr.io"
        || host == "container.cloud.google.com"
        || sub_of("gcr.io")
        || sub_of("pkg.dev"))
    .then_some(host)
}

/// A `.dockercfg` (`{"<registry>": {"username", "password", "email", "auth"}}`, `auth` being
/// base64 of `user:password` and winning over the two), or a `config.json`
/// (`{"auths": {…}}`). Messages name the registry and the field, never a value.
fn parse_dockercfg(body: &[u8]) -> Result<BTreeMap<String, AuthConfig>, String> {
    let value: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        format!("not a .dockercfg (JSON error at line {} column {})", e.line(), e.column())
    })?;
    let serde_json::Value::Object(mut map) = value else {
        return Err("not a .dockercfg (a JSON object of registries)".into());
    };
    if map.len() == 1
        && let Some(serde_json::Value::Object(auths)) = map.get("auths")
    {
        map = auths.clone();
    }
    let mut out = BTreeMap::new();
    for (registry, entry) in map {
        let serde_json::Value::Object(entry) = entry else {
            return Err(format!("the entry for {registry:?} is not a JSON object"));
        };
        let field = |name: &str| -> Result<String, String> {
            match entry.get(name) {
                None | Some(serde_json::Value::Null) => Ok(String::new()),
                Some(serde_json::Value::String(s)) => Ok(s.clone()),
                Some(_) => Err(format!("{name} of the entry for {registry:?} is not a string")),
            }
        };
        let (mut username, mut password) = (field("username")?, field("password")?);
        field("email")?;
        let auth = field("auth")?;
        if !auth.is_empty() {
            (username, password) = decode_auth(&auth).ok_or_else(|| {
                format!("auth of the entry for {registry:?} is not base64 of user:password")
            })?;
        }
        out.insert(registry, AuthConfig { username, password });
    }
    Ok(out)
}

/// `base64(user:password)`, padded or not (as upstream).
fn decode_auth(field: &str) -> Option<(String, String)> {
    let field = field.trim();
    let decoded = if field.ends_with('=') {
        base64::engine::general_purpose::STANDARD.decode(field)
    } else {
        base64::engine::general_purpose::STANDARD_NO_PAD.decode(field)
    }
    .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some((user.to_string(), password.to_string()))
}

/// The whole command: `args` after the program name, `env` for the environment. Exit 0 with
/// the response on `stdout`, or 1 with one line on `stderr`.
pub fn run(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> ExitCode {
    let fail = |stderr: &mut dyn Write, e: &dyn std::fmt::Display| {
        let _ = writeln!(stderr, "auth-provider-gcp: {e}");
        ExitCode::FAILURE
    };
    let options = match Options::from_args(args, env) {
        Ok(Some(o)) => o,
        Ok(None) => {
            let _ = writeln!(stdout, "{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(stderr, &e),
    };
    let provider = match Provider::new(options) {
        Ok(p) => p,
        Err(e) => return fail(stderr, &e),
    };
    credential::run_async_with("auth-provider-gcp", stdin, stdout, stderr, |req| async move {
        provider.provide(&req).await.map_err(Into::into)
    })
}

/// The binary's `main`.
pub fn main() -> ExitCode {
    credential::plugin_main(run)
}

/// The fuzz target's entry for the replies the plugin parses (`.dockercfg`, the token reply,
/// the command line).
#[cfg(feature = "fuzzing")]
pub fn fuzz_replies(data: &[u8]) {
    let _ = parse_dockercfg(data);
    if let Ok(text) = std::str::from_utf8(data) {
        let args: Vec<String> = text.split('\n').map(str::to_string).collect();
        let _ = Options::from_args(&args, &|_| None);
        let _ = dockercfg_url(text);
        let _ = decode_auth(text);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    fn opts(s: &str) -> Result<Option<Options>, AuthError> {
        Options::from_args(&args(s), &|_| None)
    }

    #[test]
    fn the_command_line_reads_as_cobra_does() {
        for (line, flow) in [
            ("get-credentials", AuthFlow::Gcr),
            ("get-credentials --authFlow=dockercfg", AuthFlow::DockerCfg),
            ("get-credentials --authFlow dockercfg-url", AuthFlow::DockerCfgUrl),
            ("--authFlow=gcr get-credentials", AuthFlow::Gcr),
            ("get-credentials -a dockercfg", AuthFlow::DockerCfg),
            ("get-credentials -a=dockercfg", AuthFlow::DockerCfg),
            ("get-credentials -adockercfg", AuthFlow::DockerCfg),
            ("get-credentials --v=3 --logtostderr -v 2 --stderrthreshold INFO", AuthFlow::Gcr),
        ] {
            let o = opts(line).unwrap().unwrap();
            assert_eq!(o.flow, flow, "{line}");
        }
        assert!(opts("get-credentials --help").unwrap().is_none());
    }

    #[test]
    fn bad_command_lines_are_named() {
        for (line, named) in [
            ("", "no command"),
            ("get-credential", "unknown command"),
            ("get-credentials --authFlow=ecr", "invalid value \"ecr\" for --authFlow"),
            ("get-credentials --authFlow", "--authFlow needs a value"),
            ("get-credentials --authflow=gcr", "unknown flag \"--authflow\""),
            ("get-credentials extra", "unexpected argument"),
            ("get-credentials --logtostderr=maybe", "true or false"),
            ("get-credentials --identity-provider=https://idp", "--project-id is required"),
        ] {
            let e = opts(line).unwrap_err().to_string();
            assert!(e.contains(named), "{line:?}: {e}");
        }
    }

    #[test]
    fn the_environment_sets_the_cache_and_the_metadata_host() {
        let env = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| pairs.iter().find(|(n, _)| *n == k).map(|(_, v)| v.to_string())
        };
        let o = Options::from_args(&args("get-credentials"), &env(&[])).unwrap().unwrap();
        assert_eq!(o.cache_duration, Duration::ZERO);
        assert_eq!(o.cache_key_type, CacheKeyType::Image);
        assert_eq!(o.metadata_root, "http://metadata.google.internal");
        let o = Options::from_args(
            &args("get-credentials"),
            &env(&[
                (CACHE_DURATION_ENV, "1m30s"),
                (CACHE_TYPE_ENV, "registry"),
                (METADATA_HOST_ENV, "127.0.0.1:8080"),
            ]),
        )
        .unwrap()
        .unwrap();
        assert_eq!(o.cache_duration, Duration::from_secs(90));
        assert_eq!(o.cache_key_type, CacheKeyType::Registry);
        assert_eq!(o.metadata_root, "http://127.0.0.1:8080");
        for (name, value) in [(CACHE_DURATION_ENV, "soon"), (CACHE_TYPE_ENV, "Image")] {
            let pairs: &'static [(&'static str, &'static str)] =
                Box::leak(vec![(name, value)].into_boxed_slice());
            let e = Options::from_args(&args("get-credentials"), &env(pairs)).unwrap_err();
            assert!(e.to_string().starts_with(name), "{e}");
        }
    }

    #[test]
    fn dockercfg_entries_and_auth_fields() {
        let auth = parse_dockercfg(
            br#"{"https://index.docker.io/v1/": {"auth": "dXNlcjpwYTpzcw==", "email": "e@x"},
                 "registry.example.com": {"username": "u", "password": "p"},
                 "unpadded.example.com": {"auth": "dXNlcjpwYTpzcw"}}"#,
        )
        .unwrap();
        assert_eq!(auth["https://index.docker.io/v1/"].username, "user");
        assert_eq!(auth["https://index.docker.io/v1/"].password, "pa:ss");
        assert_eq!(auth["registry.example.com"].password, "p");
        assert_eq!(auth["unpadded.example.com"].password, "pa:ss");
        // config.json's wrapper.
        let auth =
            parse_dockercfg(br#"{"auths": {"r.io": {"username": "u", "password": "p"}}}"#).unwrap();
        assert_eq!(auth.keys().collect::<Vec<_>>(), ["r.io"]);
        assert!(parse_dockercfg(b"{}").unwrap().is_empty());
    }

    #[test]
    fn bad_dockercfgs_are_named_without_their_secrets() {
        for (body, named) in [
            (r#"{"r.io": {"password": "Zq7secret""#, "JSON error at line 1"),
            (r#"["Zq7secret"]"#, "JSON object"),
            (r#"{"r.io": "Zq7secret"}"#, "entry for \"r.io\" is not a JSON object"),
            (r#"{"r.io": {"password": 7}}"#, "password of the entry for \"r.io\""),
            (r#"{"r.io": {"auth": "Zq7secret!"}}"#, "auth of the entry"),
            (r#"{"r.io": {"auth": "WnE3c2VjcmV0"}}"#, "auth of the entry"),
        ] {
            let e = parse_dockercfg(body.as_bytes()).unwrap_err();
            assert!(e.contains(named), "{body}: {e}");
            assert!(!e.contains("Zq7"), "{e}");
        }
    }

    #[test]
    fn the_gcr_answer_covers_upstreams_registries_and_the_images() {
        let auth = registry_auth("europe-docker.pkg.dev/p/r/app:1", "ya29.t");
        let mut keys: Vec<&str> = auth.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            [
                "*.gcr.io",
                "*.pkg.dev",
                "container.cloud.google.com",
                "europe-docker.pkg.dev",
                "gcr.io"
            ]
        );
        assert!(auth.values().all(|a| a.username == "_token" && a.password == "ya29.t"));
        assert_eq!(registry_auth("busybox", "t").len(), 4);
        for image in [
            "gcr.io/p/a",
            "eu.gcr.io/p/a",
            "us-docker.pkg.dev/p/r/a",
            "container.cloud.google.com/a",
        ] {
            assert!(
                REGISTRY_PATTERNS.iter().any(|p| credential::image_matches(p, image)),
                "{image}"
            );
        }
    }

    /// Issue #29 (LOW): the node's token is answered for Google's registries only; an image on
    /// any other host (a look-alike included) adds no entry, so the kubelet sends the token to
    /// no host but Google's.
    #[test]
    fn the_token_is_never_answered_for_a_registry_that_is_not_googles() {
        for image in [
            "gcr.io.example.com/p/app",
            "example.com/gcr.io/p/app",
            "evil.com/p/app:1",
            "evil.pkg.dev.example.com/p/app",
            "pkg.dev/p/app",
            "a.b.gcr.io/p/app",
            "gcr.io:443/p/app",
            "user@gcr.io/p/app",
            "GCR.IO.example.com/p/app",
            "library/nginx",
            "nginx",
            "localhost:5000/app",
        ] {
            let auth = registry_auth(image, "ya29.t");
            let mut keys: Vec<&str> = auth.keys().map(String::as_str).collect();
            keys.sort_unstable();
            assert_eq!(
                keys,
                ["*.gcr.io", "*.pkg.dev", "container.cloud.google.com", "gcr.io"],
                "{image}"
            );
            assert!(
                !auth.keys().any(|k| credential::image_matches(k, image)),
                "{image}: the kubelet would send the token there"
            );
            assert_eq!(google_registry(image), None, "{image}");
        }
        for (image, host) in [
            ("gcr.io/p/a", "gcr.io"),
            ("eu.gcr.io/p/a", "eu.gcr.io"),
            ("us-docker.pkg.dev/p/r/a", "us-docker.pkg.dev"),
            ("container.cloud.google.com/a", "container.cloud.google.com"),
        ] {
            assert_eq!(google_registry(image), Some(host), "{image}");
        }
    }

    #[test]
    fn urls_are_named_by_their_origin_only() {
        let u = dockercfg_url("https://user:Zq7@storage.example.com:8443/b/o?sig=Zq7").unwrap();
        assert_eq!(origin_of(&u), "https://storage.example.com:8443");
        for bad in ["gs://bucket/cfg", "", "not a url"] {
            let e = dockercfg_url(bad).unwrap_err().to_string();
            assert!(e.contains(DOCKERCFG_URL_ATTRIBUTE), "{e}");
        }
    }
}
