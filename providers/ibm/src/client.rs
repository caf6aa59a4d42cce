//! A small IBM Cloud REST client: IAM API-key → access token, the VPC API (`/v1`, with the
//! `version` and `generation` query parameters every VPC call carries) and the Resource
//! Manager's resource-group lookup. Only the calls the provider makes are implemented.
//!
//! - **Token**: `POST <iam>/identity/token` with the API-key grant. The token is reused until
//!   80 % of its lifetime has passed (as IBM's SDKs refresh), then fetched again; a VPC `401`
//!   drops it and the call is sent once more with a fresh one. The API key is read from the
//!   `g2Credentials` file each time a token is fetched, so a rotated key is used without a
//!   restart. The key is never logged, never in an error, never in `Debug` output.
//! - **Paging**: list calls send `limit` and follow `next.href`'s `start` until there is none.
//! - **Errors**: IBM's error bodies (`{"errors":[{"code","message"}],"trace"}`, IAM's
//!   `{"errorCode","errorMessage"}`) become [`ClientError::Api`] naming the call, status, code
//!   and message. **Not found** ([`ClientError::is_not_found`]) is only a 404 whose body is
//!   IBM's typed error (`errors[0].code` `not_found` or `<resource>_not_found`): a proxy's or
//!   gateway's HTML page, a JSON body without that code, or an empty 404 is an error like any
//!   other, so nothing is ever taken for gone on their word.
//! - **Reply size**: every reply body is read up to [`MAX_REPLY_BYTES`]; a longer one is a
//!   [`ClientError::TooLarge`] (nothing of it is used).
//! - **Global Tagging**: the user tags attached to a resource's CRN are listed and attached
//!   (`GET /v3/tags?attached_to=`, `POST /v3/tags/attach`); the load balancers record their
//!   owner in them (see [`crate::load_balancer`]).
//! - **Deadlines and retries**: every call runs under a [`Deadline`]; idempotent calls (GET,
//!   PUT, PATCH, DELETE and the token exchange) are retried on 429 and 5xx (honouring
//!   `Retry-After`) and on connection faults with [`RETRY`], inside that deadline. Creates
//!   (`POST`) are retried only on 429: IBM's rate limiter refuses the request before it is
//!   processed, so nothing was created. A 5xx or a dropped connection on a create is not
//!   retried (it may have been carried out; the next sync reads what exists first).

use std::path::{Path, PathBuf};
use std::time::Duration;

use ccm_core::cloud::ProviderError;
use ccm_core::cloud_call::{Classified, Deadline, DeadlineExceeded, Retry, parse_retry_after};
use reqwest::Method;
use serde::de::DeserializeOwned;
use serde_json::Value;
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::config::Config;
use crate::model;

/// The VPC API version date sent with every call (`vpc-go-sdk` v1.0.2's default).
pub const API_VERSION: &str = "2022-03-29";
/// The infrastructure generation (VPC Gen2).
pub const GENERATION: &str = "2";
/// Items per page on list calls (IBM's maximum).
pub const PAGE_LIMIT: u32 = 100;
/// The per-call deadline when nothing else is configured. IBM's VPC load-balancer calls can
/// be slow; upstream raises its SDK timeout to 90 s, we give one call (all retries
/// included) 60 s.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);
/// The retry policy of idempotent calls.
pub const RETRY: Retry =
    Retry { attempts: 5, base: Duration::from_millis(500), max: Duration::from_secs(8) };
/// A token is refreshed once this fraction of its lifetime has passed.
pub const REFRESH_FRACTION: f64 = 0.8;
/// The largest reply body read from any IBM endpoint (4 MiB: a page of 100 load balancers
/// or instances is well under 1 MiB). A longer reply is [`ClientError::TooLarge`].
pub const MAX_REPLY_BYTES: usize = 4 * 1024 * 1024;
/// Tags per page of a Global Tagging list (its maximum is 1000).
pub const TAG_PAGE_LIMIT: u32 = 1000;

/// How calls are bounded.
#[derive(Debug, Clone, Copy)]
pub struct ClientOptions {
    /// One call's deadline, retries and token fetch included.
    pub timeout: Duration,
    /// The retry policy of idempotent calls.
    pub retry: Retry,
}

impl Default for ClientOptions {
    fn default() -> Self {
        ClientOptions { timeout: DEFAULT_TIMEOUT, retry: RETRY }
    }
}

/// Errors of the IBM Cloud client. Messages name the call; none holds the API key or a
/// token.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The HTTP client could not be built.
    #[error("IBM Cloud client setup: {0}")]
    Setup(String),
    /// The API key file cannot be used (names the file, never its contents).
    #[error("IBM Cloud API key ([provider] g2Credentials {path}): {message}")]
    ApiKey {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
    /// The request did not complete (connection refused, reset, TLS).
    #[error("IBM Cloud {call}: request failed: {source}")]
    Transport {
        /// The call.
        call: String,
        /// The transport error (its URL holds no secret: the key travels in the body).
        #[source]
        source: reqwest::Error,
    },
    /// The call (all attempts) did not finish within its deadline.
    #[error("IBM Cloud {call}: no answer within the deadline of {deadline:?}")]
    Deadline {
        /// The call.
        call: String,
        /// The deadline.
        deadline: Duration,
    },
    /// The reply body is longer than [`MAX_REPLY_BYTES`].
    #[error("IBM Cloud {call}: the reply is larger than {limit} bytes; refused")]
    TooLarge {
        /// The call.
        call: String,
        /// The limit.
        limit: usize,
    },
    /// IBM answered with an error.
    #[error("IBM Cloud {call}: HTTP {status} {code}: {message}{}", trace_suffix(.trace))]
    Api {
        /// The call.
        call: String,
        /// The HTTP status.
        status: u16,
        /// IBM's error code (e.g. `not_found`, `load_balancer_update_conflict`); empty when
        /// the body was not one of IBM's error bodies.
        code: String,
        /// Whether the body was the VPC / Global Tagging typed error
        /// (`{"errors":[{"code": ...}]}`), as opposed to IAM's or Resource Manager's shape,
        /// or no IBM error at all (a proxy's page, an empty body).
        typed: bool,
        /// IBM's message.
        message: String,
        /// IBM's trace ID, for support cases.
        trace: String,
        /// The server's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// IAM refused the API key, or the VPC refused a fresh token.
    #[error("IBM Cloud {call}: not authorized: {message}")]
    Unauthorized {
        /// The call.
        call: String,
        /// IBM's message (never the key).
        message: String,
    },
    /// The reply could not be decoded.
    #[error("IBM Cloud {call}: cannot decode the reply: {message}")]
    Decode {
        /// The call.
        call: String,
        /// What was wrong.
        message: String,
    },
}

fn trace_suffix(trace: &str) -> String {
    if trace.is_empty() { String::new() } else { format!(" (trace {trace})") }
}

impl From<DeadlineExceeded> for ClientError {
    fn from(e: DeadlineExceeded) -> Self {
        ClientError::Deadline { call: e.operation.into_owned(), deadline: e.deadline }
    }
}

impl ClientError {
    /// Whether IBM itself said the resource does not exist: a 404 carrying IBM's typed error
    /// body with the code `not_found` or `<resource>_not_found`. A 404 from anything else (an
    /// HTML page, a JSON body without IBM's code, an empty body) is not "not found": it is an
    /// error, and never makes anything count as gone.
    pub fn is_not_found(&self) -> bool {
        match self {
            ClientError::Api { status: 404, typed: true, code, .. } => {
                code == "not_found" || code.ends_with("_not_found")
            }
            _ => false,
        }
    }

    /// Whether IBM answered 409 (e.g. the load balancer is busy).
    pub fn is_conflict(&self) -> bool {
        matches!(self, ClientError::Api { status: 409, .. })
    }

    /// Transient: 429 and 5xx (with the server's `Retry-After`) and connection faults.
    /// Everything else (4xx, a rejected key, decode errors, a passed deadline) is permanent.
    pub fn classify(&self) -> Classified {
        match self {
            ClientError::Api { status, retry_after, .. }
                if *status == 429 || (500..=504).contains(status) =>
            {
                Classified::Transient { retry_after: *retry_after }
            }
            ClientError::Transport { source, .. } if is_connection_fault(source) => {
                Classified::Transient { retry_after: None }
            }
            _ => Classified::Permanent,
        }
    }

    /// [`Self::classify`] for a create (`POST`, not idempotent): only a 429 is transient, as
    /// IBM's rate limiter answers it before the request is processed. A 5xx or a broken
    /// connection may follow a create that was carried out, so it is permanent here.
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

/// A connection that could not be made or broke mid-call (not a timeout).
fn is_connection_fault(e: &reqwest::Error) -> bool {
    !e.is_timeout() && (e.is_connect() || ccm_core::cloud_call::is_broken_connection(e))
}

/// Reads and checks the API key file: trimmed, non-empty, no whitespace inside (upstream
/// rejects such keys too, but logs them; we never do).
pub fn read_api_key(path: &Path) -> Result<String, ClientError> {
    let err = |message: String| ClientError::ApiKey { path: path.to_path_buf(), message };
    let bytes = std::fs::read(path).map_err(|e| err(format!("cannot read the file: {e}")))?;
    let text = String::from_utf8(bytes).map_err(|_| err("the file is not UTF-8".into()))?;
    let key = text.trim();
    if key.is_empty() {
        return Err(err("the file is empty".into()));
    }
    if key.contains(char::is_whitespace) {
        return Err(err("the file holds more than one word; expected one API key".into()));
    }
    Ok(key.to_string())
}

/// A bearer token and when to refresh it.
struct Token {
    value: String,
    refresh_at: Instant,
}

/// IBM's error bodies: VPC `{"errors":[{"code","message"}],"trace"}`, IAM
/// `{"errorCode","errorMessage"}`, Resource Manager `{"message","code"}`.
pub(crate) fn parse_error(
    call: &str,
    status: u16,
    retry_after: Option<Duration>,
    body: &[u8],
) -> ClientError {
    let v: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    let s = |v: &Value| v.as_str().map(str::to_string);
    let first = v.get("errors").and_then(|e| e.get(0));
    let typed_code = first.and_then(|e| e.get("code")).and_then(s).filter(|c| !c.is_empty());
    let typed = typed_code.is_some();
    let code = typed_code
        .or_else(|| v.get("errorCode").and_then(s))
        .or_else(|| v.get("code").and_then(s))
        .unwrap_or_default();
    let message = first
        .and_then(|e| e.get("message"))
        .and_then(s)
        .or_else(|| v.get("errorMessage").and_then(s))
        .or_else(|| v.get("message").and_then(s))
        .unwrap_or_else(|| {
            let text = String::from_utf8_lossy(body);
            if text.trim().is_empty() {
                "(no body)".to_string()
            } else {
                text.chars().take(200).collect()
            }
        });
    let trace = v
        .get("trace")
        .and_then(s)
        .or_else(|| v.get("context").and_then(|c| c.get("requestId")).and_then(s))
        .unwrap_or_default();
    ClientError::Api { call: call.to_string(), status, code, typed, message, trace, retry_after }
}

/// The IBM Cloud client of one provider.
pub struct IbmClient {
    http: reqwest::Client,
    vpc_url: String,
    iam_url: String,
    rm_url: String,
    tagging_url: String,
    key_file: PathBuf,
    account_id: String,
    resource_group_name: String,
    options: ClientOptions,
    token: Mutex<Option<Token>>,
    resource_group_id: Mutex<Option<String>>,
}

impl std::fmt::Debug for IbmClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbmClient")
            .field("vpc_url", &self.vpc_url)
            .field("iam_url", &self.iam_url)
            .field("rm_url", &self.rm_url)
            .field("tagging_url", &self.tagging_url)
            .field("key_file", &self.key_file)
            .finish_non_exhaustive()
    }
}

impl IbmClient {
    /// A client for the config's endpoints. Sends nothing yet.
    pub fn new(config: &Config, options: ClientOptions) -> Result<Self, ClientError> {
        let http = reqwest::Client::builder()
            .connect_timeout(Duration::from_secs(10).min(options.timeout))
            .timeout(options.timeout + Duration::from_secs(5))
            .user_agent(concat!("ccm-rs-ibm/", env!("CARGO_PKG_VERSION")))
            .build()
            .map_err(|e| ClientError::Setup(format!("building the HTTP client: {e}")))?;
        Ok(IbmClient {
            http,
            vpc_url: config.vpc_url.clone(),
            iam_url: config.iam_token_url.clone(),
            rm_url: config.resource_manager_url.clone(),
            tagging_url: config.tagging_url.clone(),
            key_file: config.credentials_file.clone(),
            account_id: config.account_id.clone(),
            resource_group_name: config.resource_group_name.clone(),
            options,
            token: Mutex::new(None),
            resource_group_id: Mutex::new(None),
        })
    }

    /// The options in use.
    pub fn options(&self) -> ClientOptions {
        self.options
    }

    // ---- IAM ---------------------------------------------------------------------------

    /// A valid bearer token: the cached one until its refresh time, else a fresh one.
    async fn token(&self) -> Result<String, ClientError> {
        let mut slot = self.token.lock().await;
        if let Some(t) = slot.as_ref()
            && Instant::now() < t.refresh_at
        {
            return Ok(t.value.clone());
        }
        let fresh = self.fetch_token().await?;
        let value = fresh.value.clone();
        *slot = Some(fresh);
        Ok(value)
    }

    /// Forgets the cached token if it is still `value` (the server refused it).
    async fn drop_token(&self, value: &str) {
        let mut slot = self.token.lock().await;
        if slot.as_ref().is_some_and(|t| t.value == value) {
            *slot = None;
        }
    }

    async fn fetch_token(&self) -> Result<Token, ClientError> {
        const CALL: &str = "iam:GetToken";
        let key = read_api_key(&self.key_file)?;
        let body: String = url::form_urlencoded::Serializer::new(String::new())
            .append_pair("grant_type", "urn:ibm:params:oauth:grant-type:apikey")
            .append_pair("apikey", &key)
            .append_pair("response_type", "cloud_iam")
            .finish();
        drop(key);
        let sent = Instant::now();
        let attempt = || async {
            let resp = self
                .http
                .post(&self.iam_url)
                .header(reqwest::header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .header(reqwest::header::ACCEPT, "application/json")
                .body(body.clone())
                .send()
                .await
                .map_err(|source| ClientError::Transport { call: CALL.into(), source })?;
            read_reply(CALL, resp).await
        };
        let bytes = self
            .options
            .retry
            .attempts_within(self.options.timeout, CALL, ClientError::classify, attempt)
            .await
            .map_err(|e| match e {
                ClientError::Api { status: 400 | 401 | 403, message, .. } => {
                    ClientError::Unauthorized { call: CALL.into(), message }
                }
                other => other,
            })?;
        #[derive(serde::Deserialize)]
        struct Reply {
            access_token: String,
            #[serde(default)]
            expires_in: Option<i64>,
            #[serde(default)]
            expiration: Option<i64>,
        }
        let reply: Reply = serde_json::from_slice(&bytes).map_err(|e| ClientError::Decode {
            call: CALL.into(),
            message: format!(
                "token reply: {}",
                ccm_core::cloud_call::strip_quoted_values(&e.to_string())
            ),
        })?;
        // The lifetime from `expires_in`, else `expiration` (Unix seconds) against our clock.
        let lifetime = match (reply.expires_in, reply.expiration) {
            (Some(secs), _) if secs > 0 => secs as f64,
            (_, Some(exp)) => {
                let now = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs() as i64)
                    .unwrap_or_default();
                (exp - now).max(0) as f64
            }
            _ => 0.0,
        };
        let refresh_at = sent + Duration::from_secs_f64(lifetime * REFRESH_FRACTION);
        tracing::debug!(lifetime_secs = lifetime, "IBM Cloud: IAM token fetched");
        Ok(Token { value: reply.access_token, refresh_at })
    }

    // ---- generic calls -----------------------------------------------------------------

    /// Sends one call (a fresh token each attempt if needed; a 401 drops the token and the
    /// call is sent once more) and returns the reply body of a 2xx.
    async fn send(
        &self,
        call: &str,
        method: Method,
        url: &str,
        query: &[(&str, String)],
        body: Option<&(Value, &'static str)>,
    ) -> Result<Vec<u8>, ClientError> {
        let mut refreshed = false;
        loop {
            let token = self.token().await?;
            let mut req = self
                .http
                .request(method.clone(), url)
                .query(query)
                .bearer_auth(&token)
                .header(reqwest::header::ACCEPT, "application/json");
            if let Some((json, content_type)) = body {
                req = req
                    .header(reqwest::header::CONTENT_TYPE, *content_type)
                    .body(serde_json::to_vec(json).unwrap_or_default());
            }
            let resp = req
                .send()
                .await
                .map_err(|source| ClientError::Transport { call: call.into(), source })?;
            if resp.status().as_u16() == 401 {
                self.drop_token(&token).await;
                if !refreshed {
                    refreshed = true;
                    tracing::debug!(call, "IBM Cloud: token refused, fetching a fresh one");
                    continue;
                }
                let body = read_body(call, resp).await.unwrap_or_default();
                let err = parse_error(call, 401, None, &body);
                let message = match err {
                    ClientError::Api { message, .. } => message,
                    other => other.to_string(),
                };
                return Err(ClientError::Unauthorized { call: call.into(), message });
            }
            return read_reply(call, resp).await;
        }
    }

    /// One VPC call under the deadline; retried when `idempotent`. `None` body: no content.
    async fn vpc_call(
        &self,
        call: &'static str,
        method: Method,
        path: &str,
        extra_query: &[(&str, String)],
        body: Option<(Value, &'static str)>,
    ) -> Result<Vec<u8>, ClientError> {
        let url = format!("{}{path}", self.vpc_url);
        let mut query: Vec<(&str, String)> =
            vec![("version", API_VERSION.into()), ("generation", GENERATION.into())];
        query.extend(extra_query.iter().cloned());
        let classify: fn(&ClientError) -> Classified = if method == Method::POST {
            ClientError::classify_create
        } else {
            ClientError::classify
        };
        let deadline = Deadline::new(self.options.timeout);
        self.options
            .retry
            .run(&deadline, call, classify, || {
                self.send(call, method.clone(), &url, &query, body.as_ref())
            })
            .await
    }

    async fn vpc_json<T: DeserializeOwned>(
        &self,
        call: &'static str,
        method: Method,
        path: &str,
        body: Option<(Value, &'static str)>,
    ) -> Result<T, ClientError> {
        let bytes = self.vpc_call(call, method, path, &[], body).await?;
        decode(call, &bytes)
    }

    /// All items of a paged list: `limit` per page, following `next.href`'s `start`.
    async fn list_all<T: DeserializeOwned>(
        &self,
        call: &'static str,
        path: &str,
        items_key: &str,
        filters: &[(&str, String)],
    ) -> Result<Vec<T>, ClientError> {
        let mut items = Vec::new();
        let mut start: Option<String> = None;
        for _page in 0..10_000 {
            let mut query: Vec<(&str, String)> = filters.to_vec();
            query.push(("limit", PAGE_LIMIT.to_string()));
            if let Some(s) = &start {
                query.push(("start", s.clone()));
            }
            let bytes = self.vpc_call(call, Method::GET, path, &query, None).await?;
            let page: Value = decode(call, &bytes)?;
            let Some(list) = page.get(items_key).and_then(Value::as_array) else {
                return Err(ClientError::Decode {
                    call: call.into(),
                    message: format!("no {items_key:?} array in the reply"),
                });
            };
            for item in list {
                items.push(T::deserialize(item).map_err(|e| ClientError::Decode {
                    call: call.into(),
                    message: format!(
                        "an item of {items_key:?}: {}",
                        ccm_core::cloud_call::strip_quoted_values(&e.to_string())
                    ),
                })?);
            }
            let next = page.get("next").and_then(|n| n.get("href")).and_then(Value::as_str);
            let Some(href) = next else { return Ok(items) };
            let next_start = url::Url::parse(href).ok().and_then(|u| {
                u.query_pairs().find(|(k, _)| k == "start").map(|(_, v)| v.into_owned())
            });
            match next_start {
                Some(s) if Some(&s) != start.as_ref() => start = Some(s),
                _ => {
                    return Err(ClientError::Decode {
                        call: call.into(),
                        message: "next.href has no new start token".into(),
                    });
                }
            }
        }
        Err(ClientError::Decode { call: call.into(), message: "too many pages".into() })
    }

    // ---- instances and subnets ---------------------------------------------------------

    /// `ListInstances` in the VPC named `vpc_name`, optionally only the one named `name`.
    pub async fn list_instances(
        &self,
        vpc_name: &str,
        name: Option<&str>,
    ) -> Result<Vec<model::Instance>, ClientError> {
        let mut filters = vec![("vpc.name", vpc_name.to_string())];
        if let Some(n) = name {
            filters.push(("name", n.to_string()));
        }
        self.list_all("is.instance.list", "/instances", "instances", &filters).await
    }

    /// `GetInstance`; `Ok(None)` only when IBM answers its typed not-found for this ID (see
    /// [`ClientError::is_not_found`]); any other 404 is an error.
    pub async fn get_instance(&self, id: &str) -> Result<Option<model::Instance>, ClientError> {
        let path = format!("/instances/{}", seg(id));
        match self.vpc_json("is.instance.get", Method::GET, &path, None).await {
            Ok(i) => Ok(Some(i)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `ListSubnets` (all of them: the API cannot filter by VPC name).
    pub async fn list_subnets(&self) -> Result<Vec<model::Subnet>, ClientError> {
        self.list_all("is.subnet.list", "/subnets", "subnets", &[]).await
    }

    // ---- load balancers ----------------------------------------------------------------

    /// `ListLoadBalancers`.
    pub async fn list_load_balancers(&self) -> Result<Vec<model::LoadBalancer>, ClientError> {
        self.list_all("is.load-balancer.list", "/load_balancers", "load_balancers", &[]).await
    }

    /// `GetLoadBalancer`; `Ok(None)` on IBM's typed not-found.
    pub async fn get_load_balancer(
        &self,
        id: &str,
    ) -> Result<Option<model::LoadBalancer>, ClientError> {
        let path = format!("/load_balancers/{}", seg(id));
        match self.vpc_json("is.load-balancer.get", Method::GET, &path, None).await {
            Ok(lb) => Ok(Some(lb)),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// `CreateLoadBalancer` with a prototype body.
    pub async fn create_load_balancer(
        &self,
        body: Value,
    ) -> Result<model::LoadBalancer, ClientError> {
        self.vpc_json(
            "is.load-balancer.create",
            Method::POST,
            "/load_balancers",
            Some((body, "application/json")),
        )
        .await
    }

    /// `DeleteLoadBalancer`; IBM's typed not-found counts as done.
    pub async fn delete_load_balancer(&self, id: &str) -> Result<(), ClientError> {
        let path = format!("/load_balancers/{}", seg(id));
        ok_if_gone(self.vpc_call("is.load-balancer.delete", Method::DELETE, &path, &[], None).await)
    }

    /// `ListLoadBalancerListeners`.
    pub async fn list_listeners(&self, lb: &str) -> Result<Vec<model::Listener>, ClientError> {
        let path = format!("/load_balancers/{}/listeners", seg(lb));
        let v: Value =
            self.vpc_json("is.load-balancer.listener.list", Method::GET, &path, None).await?;
        items("is.load-balancer.listener.list", &v, "listeners")
    }

    /// `CreateLoadBalancerListener`.
    pub async fn create_listener(
        &self,
        lb: &str,
        body: Value,
    ) -> Result<model::Listener, ClientError> {
        let path = format!("/load_balancers/{}/listeners", seg(lb));
        self.vpc_json(
            "is.load-balancer.listener.create",
            Method::POST,
            &path,
            Some((body, "application/json")),
        )
        .await
    }

    /// `DeleteLoadBalancerListener`; IBM's typed not-found counts as done.
    pub async fn delete_listener(&self, lb: &str, id: &str) -> Result<(), ClientError> {
        let path = format!("/load_balancers/{}/listeners/{}", seg(lb), seg(id));
        ok_if_gone(
            self.vpc_call("is.load-balancer.listener.delete", Method::DELETE, &path, &[], None)
                .await,
        )
    }

    /// `ListLoadBalancerPools`.
    pub async fn list_pools(&self, lb: &str) -> Result<Vec<model::Pool>, ClientError> {
        let path = format!("/load_balancers/{}/pools", seg(lb));
        let v: Value =
            self.vpc_json("is.load-balancer.pool.list", Method::GET, &path, None).await?;
        items("is.load-balancer.pool.list", &v, "pools")
    }

    /// `CreateLoadBalancerPool`.
    pub async fn create_pool(&self, lb: &str, body: Value) -> Result<model::Pool, ClientError> {
        let path = format!("/load_balancers/{}/pools", seg(lb));
        self.vpc_json(
            "is.load-balancer.pool.create",
            Method::POST,
            &path,
            Some((body, "application/json")),
        )
        .await
    }

    /// `UpdateLoadBalancerPool` (JSON merge patch).
    pub async fn update_pool(
        &self,
        lb: &str,
        id: &str,
        patch: Value,
    ) -> Result<model::Pool, ClientError> {
        let path = format!("/load_balancers/{}/pools/{}", seg(lb), seg(id));
        self.vpc_json(
            "is.load-balancer.pool.update",
            Method::PATCH,
            &path,
            Some((patch, "application/merge-patch+json")),
        )
        .await
    }

    /// `DeleteLoadBalancerPool`; IBM's typed not-found counts as done.
    pub async fn delete_pool(&self, lb: &str, id: &str) -> Result<(), ClientError> {
        let path = format!("/load_balancers/{}/pools/{}", seg(lb), seg(id));
        ok_if_gone(
            self.vpc_call("is.load-balancer.pool.delete", Method::DELETE, &path, &[], None).await,
        )
    }

    /// `ListLoadBalancerPoolMembers`.
    pub async fn list_members(
        &self,
        lb: &str,
        pool: &str,
    ) -> Result<Vec<model::Member>, ClientError> {
        let path = format!("/load_balancers/{}/pools/{}/members", seg(lb), seg(pool));
        let v: Value =
            self.vpc_json("is.load-balancer.pool.member.list", Method::GET, &path, None).await?;
        items("is.load-balancer.pool.member.list", &v, "members")
    }

    /// `CreateLoadBalancerPoolMember`.
    pub async fn create_member(
        &self,
        lb: &str,
        pool: &str,
        body: Value,
    ) -> Result<model::Member, ClientError> {
        let path = format!("/load_balancers/{}/pools/{}/members", seg(lb), seg(pool));
        self.vpc_json(
            "is.load-balancer.pool.member.create",
            Method::POST,
            &path,
            Some((body, "application/json")),
        )
        .await
    }

    /// `DeleteLoadBalancerPoolMember`; IBM's typed not-found counts as done.
    pub async fn delete_member(&self, lb: &str, pool: &str, id: &str) -> Result<(), ClientError> {
        let path = format!("/load_balancers/{}/pools/{}/members/{}", seg(lb), seg(pool), seg(id));
        ok_if_gone(
            self.vpc_call("is.load-balancer.pool.member.delete", Method::DELETE, &path, &[], None)
                .await,
        )
    }

    /// `ReplaceLoadBalancerPoolMembers` (PUT the whole member list).
    pub async fn replace_members(
        &self,
        lb: &str,
        pool: &str,
        members: Value,
    ) -> Result<Vec<model::Member>, ClientError> {
        let path = format!("/load_balancers/{}/pools/{}/members", seg(lb), seg(pool));
        let v: Value = self
            .vpc_json(
                "is.load-balancer.pool.member.replace",
                Method::PUT,
                &path,
                Some((serde_json::json!({ "members": members }), "application/json")),
            )
            .await?;
        items("is.load-balancer.pool.member.replace", &v, "members")
    }

    // ---- global tagging ----------------------------------------------------------------

    /// The user tags attached to the resource `crn` (Global Tagging `ListTags` with
    /// `attached_to`), every page.
    pub async fn list_tags(&self, crn: &str) -> Result<Vec<String>, ClientError> {
        const CALL: &str = "global-tagging:ListTags";
        let url = format!("{}/v3/tags", self.tagging_url);
        let mut names = Vec::new();
        let mut offset: u64 = 0;
        for _page in 0..1000 {
            let query = vec![
                ("attached_to", crn.to_string()),
                ("tag_type", "user".to_string()),
                ("account_id", self.account_id.clone()),
                ("offset", offset.to_string()),
                ("limit", TAG_PAGE_LIMIT.to_string()),
            ];
            let deadline = Deadline::new(self.options.timeout);
            let bytes = self
                .options
                .retry
                .run(&deadline, CALL, ClientError::classify, || {
                    self.send(CALL, Method::GET, &url, &query, None)
                })
                .await?;
            #[derive(serde::Deserialize)]
            struct Item {
                name: String,
            }
            #[derive(serde::Deserialize)]
            struct Page {
                #[serde(default)]
                total_count: u64,
                #[serde(default)]
                items: Vec<Item>,
            }
            let page: Page = decode(CALL, &bytes)?;
            let got = page.items.len() as u64;
            names.extend(page.items.into_iter().map(|i| i.name));
            offset += got;
            if got == 0 || offset >= page.total_count {
                return Ok(names);
            }
        }
        Err(ClientError::Decode { call: CALL.into(), message: "too many pages".into() })
    }

    /// Attaches user tags to the resource `crn` (Global Tagging `AttachTag`). Attaching a tag
    /// that is already attached changes nothing, so the call is retried like a read. A result
    /// marked `is_error` is an error.
    pub async fn attach_tags(&self, crn: &str, tags: &[String]) -> Result<(), ClientError> {
        const CALL: &str = "global-tagging:AttachTag";
        let url = format!("{}/v3/tags/attach", self.tagging_url);
        let query = vec![("tag_type", "user".to_string()), ("account_id", self.account_id.clone())];
        let body = (
            serde_json::json!({"resources": [{"resource_id": crn}], "tag_names": tags}),
            "application/json",
        );
        let deadline = Deadline::new(self.options.timeout);
        let bytes = self
            .options
            .retry
            .run(&deadline, CALL, ClientError::classify, || {
                self.send(CALL, Method::POST, &url, &query, Some(&body))
            })
            .await?;
        let v: Value = decode(CALL, &bytes)?;
        let results = v.get("results").and_then(Value::as_array).ok_or_else(|| {
            ClientError::Decode { call: CALL.into(), message: "no \"results\" array".into() }
        })?;
        let failed = results.is_empty()
            || results.iter().any(|r| r.get("is_error").and_then(Value::as_bool) != Some(false));
        if failed {
            return Err(ClientError::Decode {
                call: CALL.into(),
                message: "the tags were not attached (the result is marked is_error)".into(),
            });
        }
        Ok(())
    }

    // ---- resource manager --------------------------------------------------------------

    /// The ID of the configured resource group (`g2ResourceGroupName`), looked up once with
    /// the Resource Manager's `ListResourceGroups` and cached.
    pub async fn resource_group_id(&self) -> Result<String, ClientError> {
        let mut slot = self.resource_group_id.lock().await;
        if let Some(id) = slot.as_ref() {
            return Ok(id.clone());
        }
        const CALL: &str = "resource-manager:ListResourceGroups";
        let url = format!("{}/v2/resource_groups", self.rm_url);
        let query = vec![
            ("account_id", self.account_id.clone()),
            ("name", self.resource_group_name.clone()),
        ];
        let deadline = Deadline::new(self.options.timeout);
        let bytes = self
            .options
            .retry
            .run(&deadline, CALL, ClientError::classify, || {
                self.send(CALL, Method::GET, &url, &query, None)
            })
            .await?;
        let v: Value = decode(CALL, &bytes)?;
        let groups: Vec<model::ResourceGroup> = items(CALL, &v, "resources")?;
        let matching: Vec<_> =
            groups.into_iter().filter(|g| g.name == self.resource_group_name).collect();
        match matching.as_slice() {
            [one] if !one.id.is_empty() => {
                *slot = Some(one.id.clone());
                Ok(one.id.clone())
            }
            _ => Err(ClientError::Decode {
                call: CALL.into(),
                message: format!(
                    "{} resource groups match [provider] g2ResourceGroupName {:?}; expected one",
                    matching.len(),
                    self.resource_group_name
                ),
            }),
        }
    }
}

/// A URL path segment, percent-encoded.
fn seg(s: &str) -> String {
    url::form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>().replace('+', "%20")
}

fn ok_if_gone(r: Result<Vec<u8>, ClientError>) -> Result<(), ClientError> {
    match r {
        Ok(_) => Ok(()),
        Err(e) if e.is_not_found() => Ok(()),
        Err(e) => Err(e),
    }
}

/// The body of a 2xx reply, or the IBM error it carries.
async fn read_reply(call: &str, resp: reqwest::Response) -> Result<Vec<u8>, ClientError> {
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get(reqwest::header::RETRY_AFTER)
        .and_then(|v| v.to_str().ok())
        .and_then(parse_retry_after);
    let bytes = read_body(call, resp).await?;
    if (200..300).contains(&status) {
        Ok(bytes)
    } else {
        Err(parse_error(call, status, retry_after, &bytes))
    }
}

/// The reply body, at most [`MAX_REPLY_BYTES`]: a longer one (announced or read) is
/// [`ClientError::TooLarge`], and reading stops there.
async fn read_body(call: &str, mut resp: reqwest::Response) -> Result<Vec<u8>, ClientError> {
    let too_large = || ClientError::TooLarge { call: call.into(), limit: MAX_REPLY_BYTES };
    if resp.content_length().is_some_and(|n| n > MAX_REPLY_BYTES as u64) {
        return Err(too_large());
    }
    let mut out = Vec::new();
    while let Some(chunk) =
        resp.chunk().await.map_err(|source| ClientError::Transport { call: call.into(), source })?
    {
        if out.len() + chunk.len() > MAX_REPLY_BYTES {
            return Err(too_large());
        }
        out.extend_from_slice(&chunk);
    }
    Ok(out)
}

fn decode<T: DeserializeOwned>(call: &str, bytes: &[u8]) -> Result<T, ClientError> {
    serde_json::from_slice(bytes).map_err(|e| ClientError::Decode {
        call: call.into(),
        message: ccm_core::cloud_call::strip_quoted_values(&e.to_string()),
    })
}

fn items<T: DeserializeOwned>(call: &str, v: &Value, key: &str) -> Result<Vec<T>, ClientError> {
    let Some(list) = v.get(key) else {
        return Err(ClientError::Decode {
            call: call.into(),
            message: format!("no {key:?} in the reply"),
        });
    };
    Vec::<T>::deserialize(list).map_err(|e| ClientError::Decode {
        call: call.into(),
        message: format!("{key:?}: {}", ccm_core::cloud_call::strip_quoted_values(&e.to_string())),
    })
}

use serde::Deserialize as _;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ibm_error_bodies_are_parsed_and_classified() {
        let body = br#"{"errors":[{"code":"load_balancer_update_conflict","message":"busy","more_info":"x"}],"trace":"t-1"}"#;
        let e = parse_error("is.load-balancer.pool.create", 409, None, body);
        assert!(e.is_conflict());
        assert_eq!(
            e.to_string(),
            "IBM Cloud is.load-balancer.pool.create: HTTP 409 load_balancer_update_conflict: busy (trace t-1)"
        );
        assert_eq!(e.classify(), Classified::Permanent);
        let e = parse_error(
            "x",
            429,
            Some(Duration::from_secs(2)),
            br#"{"errors":[{"code":"too_many_requests","message":"slow down"}]}"#,
        );
        assert_eq!(
            e.classify(),
            Classified::Transient { retry_after: Some(Duration::from_secs(2)) }
        );
        // A throttled create was refused before it was processed: retried like a read.
        assert_eq!(
            e.classify_create(),
            Classified::Transient { retry_after: Some(Duration::from_secs(2)) }
        );
        assert!(matches!(ProviderError::from(e), ProviderError::Throttled(_)));
        let e = parse_error("x", 503, None, b"");
        assert!(matches!(e.classify(), Classified::Transient { .. }));
        // A create answered 5xx may have been carried out: never sent again.
        assert_eq!(e.classify_create(), Classified::Permanent);
        assert!(e.to_string().contains("(no body)"));
        let e = parse_error(
            "iam:GetToken",
            400,
            None,
            br#"{"errorCode":"BXNIM0415E","errorMessage":"Provided API key could not be found"}"#,
        );
        assert!(e.to_string().contains("BXNIM0415E"), "{e}");
        // Not found is IBM's typed error only.
        let vpc =
            br#"{"errors":[{"code":"not_found","message":"Instance not found"}],"trace":"t"}"#;
        assert!(parse_error("x", 404, None, vpc).is_not_found());
        let typed = br#"{"errors":[{"code":"instance_not_found","message":"gone"}]}"#;
        assert!(parse_error("x", 404, None, typed).is_not_found());
        for body in [
            &b"{}"[..],
            b"",
            b"<html><body>404 Not Found: /v1/instances/0717_x</body></html>",
            br#"{"message":"0717_x not found"}"#,
            br#"{"code":"not_found","message":"a Resource Manager shape"}"#,
            br#"{"errors":[{"code":"no_route","message":"x"}]}"#,
            br#"{"errors":[{"message":"no code"}]}"#,
        ] {
            let e = parse_error("x", 404, None, body);
            assert!(!e.is_not_found(), "{}: {e}", String::from_utf8_lossy(body));
        }
        // The typed code at another status is not "not found" either.
        assert!(!parse_error("x", 400, None, vpc).is_not_found());
    }

    #[test]
    fn the_api_key_file_is_checked_without_quoting_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("key");
        std::fs::write(&path, "  secret-key-1\n").unwrap();
        assert_eq!(read_api_key(&path).unwrap(), "secret-key-1");
        std::fs::write(&path, "secret key-2").unwrap();
        let e = read_api_key(&path).unwrap_err().to_string();
        assert!(e.contains("g2Credentials") && !e.contains("secret"), "{e}");
        std::fs::write(&path, "\n").unwrap();
        assert!(read_api_key(&path).unwrap_err().to_string().contains("empty"));
        let e = read_api_key(&dir.path().join("missing")).unwrap_err().to_string();
        assert!(e.contains("cannot read"), "{e}");
    }

    #[test]
    fn decode_errors_do_not_quote_values() {
        assert_eq!(
            ccm_core::cloud_call::strip_quoted_values(
                r#"invalid type: string "abc", expected i64"#
            ),
            "invalid type: string \"…\", expected i64"
        );
        assert_eq!(seg("a b/c"), "a%20b%2Fc");
    }
}
