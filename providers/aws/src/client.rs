//! AWS client glue: SDK clients for EC2, ELB and ELBv2 built from the cloud config, the API
//! call metrics, and the mapping of SDK errors onto [`ProviderError`].
//!
//! Credentials come from the SDK's default chain (environment, shared profile, web identity,
//! ECS/EKS container credentials, then EC2 instance metadata; the Rust SDK's IMDS client only
//! speaks IMDSv2). With `RoleARN` every call runs as that role through STS `AssumeRole`.
//! `[ServiceOverride "N"]` sections whose `Region` matches the provider's region replace the
//! endpoint of that service and sign requests for its `SigningRegion`.
//!
//! Every request attempt is counted in `cloudprovider_aws_api_request_total{service,operation}`;
//! upstream's families are fed through the shared layer ([`ccm_core::cloud_call::api_metrics`]):
//! every successful call's latency in `cloudprovider_aws_api_request_duration_seconds{request}`,
//! every failed call in `cloudprovider_aws_api_request_errors{request}`, every answer of 400 and
//! above in `cloudprovider_aws_api_response_status_total{service,operation,status_code}`, all
//! through an SDK interceptor, so no call site can forget it. `request` is upstream's name
//! ([`metric_request`]: `describe_instance`, `create_tags`, ...).
//!
//! No call hangs: every client (EC2, ELB, ELBv2, STS for `RoleARN`) carries a
//! [`CallTimeouts`] (connect 5 s, attempt 10 s, operation 30 s as upstream) in its SDK
//! `TimeoutConfig`, and the same interceptor logs a warning naming the operation when a call
//! has been running for half its operation timeout ([`ccm_core::cloud_call::StallWatch`]).
//!
//! Throttling and transient errors are retried inside a call up to [`MAX_ATTEMPTS`] times (the
//! SDK's standard mode: jittered exponential backoff and a retry quota), still within the
//! operation timeout. Upstream keeps the SDK default of 3; at 3, an account throttling half
//! of its calls fails most load-balancer syncs (each ~12 calls in a row) and the Service's
//! backoff doubles towards 5 minutes.
//!
//! Throttling is also remembered across calls, as upstream does: a throttled answer from a
//! service makes every following request to that service (any operation, any caller) wait a
//! delay first ([`ThrottleBackoff`]: 250 ms after the first throttle, doubling per throttle up
//! to 5 s, halved by every answered request, forgotten a minute after the last throttle), so
//! the provider slows down as a whole instead of each call finding out on its own. Throttled
//! requests are counted in upstream's `cloudprovider_aws_api_throttled_requests_total
//! {operation_name}`, delayed ones in `cloudprovider_aws_api_delayed_requests_total{service}`.
//!
//! With `SourceARN`, the STS `AssumeRole` call for `RoleARN` carries upstream's
//! confused-deputy headers `x-amz-source-arn` and `x-amz-source-account` (the ARN's account).

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use aws_config::{BehaviorVersion, Region, SdkConfig};
use aws_credential_types::Credentials;
use aws_credential_types::provider::error::CredentialsError;
use aws_credential_types::provider::{ProvideCredentials, SharedCredentialsProvider, future};
use aws_sdk_ec2::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_smithy_runtime_api::box_error::BoxError;
use aws_smithy_runtime_api::client::http::{
    HttpClient, HttpConnector, HttpConnectorFuture, HttpConnectorSettings, SharedHttpClient,
    SharedHttpConnector,
};
use aws_smithy_runtime_api::client::interceptors::Intercept;
use aws_smithy_runtime_api::client::interceptors::context::{
    BeforeSerializationInterceptorContextRef, BeforeTransmitInterceptorContextRef,
    FinalizerInterceptorContextRef,
};
use aws_smithy_runtime_api::client::orchestrator::{HttpRequest, Metadata};
use aws_smithy_runtime_api::client::retries::classifiers::{
    ClassifyRetry, RetryAction, RetryReason,
};
use aws_smithy_runtime_api::client::runtime_components::RuntimeComponents;
use aws_smithy_types::config_bag::{ConfigBag, Storable, StoreReplace};
use aws_smithy_types::retry::{ErrorKind, RetryConfig};
use aws_smithy_types::timeout::TimeoutConfig;
use ccm_core::cloud::ProviderError;
use ccm_core::cloud_call::{self, StallWatch};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use crate::config::CloudConfig;

/// The clients could not be built.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No region in the config, the environment, the profile or instance metadata.
    #[error(
        "no AWS region: set Region (or Zone) in [Global], AWS_REGION, a profile region, or run on EC2"
    )]
    NoRegion,
}

/// Attempts per AWS call for throttling and other transient errors (standard retry mode).
pub const MAX_ATTEMPTS: u32 = 5;

/// How long one AWS call may take. Every SDK client the provider builds carries these in its
/// `TimeoutConfig`, so a call to an endpoint that accepts and never answers fails with an
/// error naming the operation instead of hanging.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallTimeouts {
    /// Establishing the TCP (and TLS) connection.
    pub connect: Duration,
    /// One attempt (request sent, response read); a timed-out attempt is retried while the
    /// operation timeout allows.
    pub attempt: Duration,
    /// The whole call, retries included: upstream's 30 s.
    pub operation: Duration,
}

impl Default for CallTimeouts {
    /// Connect 5 s, attempt 10 s, operation 30 s (upstream's AWS client deadline). Three
    /// attempts of a stalled endpoint fit in the operation timeout; the SDK's own default is
    /// a connect timeout only.
    fn default() -> Self {
        CallTimeouts {
            connect: Duration::from_secs(5),
            attempt: Duration::from_secs(10),
            operation: cloud_call::DEFAULT_DEADLINE,
        }
    }
}

impl CallTimeouts {
    /// An operation timeout of `operation`, with connect and attempt timeouts a third of it
    /// (tests use this to fail in seconds).
    pub fn with_operation(operation: Duration) -> Self {
        CallTimeouts { connect: operation / 3, attempt: operation / 3, operation }
    }

    /// The SDK timeout config.
    pub fn timeout_config(&self) -> TimeoutConfig {
        TimeoutConfig::builder()
            .connect_timeout(self.connect)
            .operation_attempt_timeout(self.attempt)
            .operation_timeout(self.operation)
            .build()
    }

    /// When a call counts as stalled and is logged: half the operation timeout.
    pub fn stall_after(&self) -> Duration {
        self.operation / 2
    }
}

type Labels = Vec<(String, String)>;

/// Counts of AWS API calls by service and operation. Cheap to clone; register it once.
#[derive(Debug, Clone, Default)]
pub struct ApiMetrics {
    requests: Family<Labels, Counter>,
    throttled: Family<Labels, Counter>,
    delayed: Family<Labels, Counter>,
}

impl ApiMetrics {
    /// Registers the provider's own families (`cloudprovider_aws_api_request_total`,
    /// `..._delayed_requests_total`) and upstream's `..._throttled_requests_total` in
    /// `registry`. Upstream's latency, error and status families are the shared layer's,
    /// served by the manager ([`ccm_core::cloud_call::api_metrics::AWS`]).
    pub fn register(&self, registry: &mut Registry) {
        registry.register(
            "cloudprovider_aws_api_request",
            "AWS API request attempts, by service and operation",
            self.requests.clone(),
        );
        registry.register(
            "cloudprovider_aws_api_throttled_requests",
            "AWS API requests answered with a throttling error, by operation",
            self.throttled.clone(),
        );
        registry.register(
            "cloudprovider_aws_api_delayed_requests",
            "AWS API requests held back by the shared throttling back-off, by service",
            self.delayed.clone(),
        );
    }

    /// Requests of `operation` answered with a throttling error so far.
    pub fn throttled(&self, operation: &str) -> u64 {
        self.throttled.get_or_create(&operation_label(operation)).get()
    }

    /// Requests to `service` held back by the shared throttling back-off so far.
    pub fn delayed(&self, service: &str) -> u64 {
        self.delayed.get_or_create(&service_label(service)).get()
    }

    /// Request attempts made so far for `service` (`ec2`, `elb`, `elbv2`, `sts`) and `operation`
    /// (e.g. `DescribeInstances`).
    pub fn requests(&self, service: &str, operation: &str) -> u64 {
        self.requests.get_or_create(&labels(service, operation)).get()
    }

    /// Failed calls so far of `operation` (e.g. `DescribeInstances`), process-wide, from
    /// upstream's `cloudprovider_aws_api_request_errors{request}`.
    pub fn errors(&self, operation: &str) -> u64 {
        shared()
            .value("cloudprovider_aws_api_request_errors", &[metric_request(operation).as_str()])
    }
}

fn shared() -> std::sync::Arc<ccm_core::cloud_call::api_metrics::ApiMetrics> {
    ccm_core::cloud_call::api_metrics::ApiMetrics::of(&ccm_core::cloud_call::api_metrics::AWS)
}

/// Upstream's `request` label of an SDK operation: upstream's own name for the operations it
/// records (`DescribeInstances` is `describe_instance`), else the operation in snake case
/// (`DescribeLoadBalancers` → `describe_load_balancers`).
pub fn metric_request(operation: &str) -> String {
    match operation {
        "DescribeInstances" => "describe_instance".to_string(),
        other => ccm_core::cloud_call::api_metrics::snake_case(other),
    }
}

/// The SDK's service ID (upstream's `service` label of the status counter) of `service`.
fn service_id(service: &str) -> &'static str {
    match service {
        "ec2" => "EC2",
        "elb" => "Elastic Load Balancing",
        "elbv2" => "Elastic Load Balancing v2",
        "sts" => "STS",
        _ => "unknown",
    }
}

impl ApiMetrics {
    fn status(&self, service: &str, operation: &str, status: u16) {
        shared().inc(
            "cloudprovider_aws_api_response_status_total",
            &[service_id(service), operation, &status.to_string()],
        );
    }
}

fn operation_label(operation: &str) -> Labels {
    vec![("operation_name".to_string(), operation.to_string())]
}

fn service_label(service: &str) -> Labels {
    vec![("service".to_string(), service.to_string())]
}

fn labels(service: &str, operation: &str) -> Labels {
    vec![
        ("service".to_string(), service.to_string()),
        ("operation".to_string(), operation.to_string()),
    ]
}

/// The first delay after a throttle.
pub const THROTTLE_DELAY_MIN: Duration = Duration::from_millis(250);
/// The longest delay (well inside one attempt's timeout).
pub const THROTTLE_DELAY_MAX: Duration = Duration::from_secs(5);
/// A throttle older than this no longer delays anything.
pub const THROTTLE_FORGET_AFTER: Duration = Duration::from_secs(60);

/// The throttling back-off one service's requests share: a throttled answer grows the delay
/// every following request waits before it is sent; an answered request shrinks it.
#[derive(Debug, Default)]
pub struct ThrottleBackoff {
    state: Mutex<BackoffState>,
}

#[derive(Debug, Default)]
struct BackoffState {
    delay: Duration,
    last_throttle: Option<Instant>,
}

impl ThrottleBackoff {
    fn state(&self) -> std::sync::MutexGuard<'_, BackoffState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A request was throttled: the next ones wait longer (doubling, from
    /// [`THROTTLE_DELAY_MIN`] up to [`THROTTLE_DELAY_MAX`]).
    pub fn throttled(&self) {
        let mut s = self.state();
        s.delay = if s.delay.is_zero() {
            THROTTLE_DELAY_MIN
        } else {
            (s.delay * 2).min(THROTTLE_DELAY_MAX)
        };
        s.last_throttle = Some(Instant::now());
    }

    /// A request was answered (not throttled): the delay halves, and ends below the minimum.
    pub fn answered(&self) {
        let mut s = self.state();
        s.delay /= 2;
        if s.delay < THROTTLE_DELAY_MIN {
            s.delay = Duration::ZERO;
        }
    }

    /// How long the next request waits (zero when nothing was throttled lately).
    pub fn delay(&self) -> Duration {
        let mut s = self.state();
        if s.last_throttle.is_some_and(|t| t.elapsed() > THROTTLE_FORGET_AFTER) {
            *s = BackoffState::default();
        }
        s.delay
    }
}

/// The HTTP client of one service: the SDK's own, behind the service's shared throttling
/// back-off (each request waits the current delay before it is sent).
#[derive(Debug, Clone)]
struct BackoffHttpClient {
    inner: SharedHttpClient,
    service: &'static str,
    backoff: Arc<ThrottleBackoff>,
    metrics: ApiMetrics,
}

impl HttpClient for BackoffHttpClient {
    fn http_connector(
        &self,
        settings: &HttpConnectorSettings,
        components: &RuntimeComponents,
    ) -> SharedHttpConnector {
        SharedHttpConnector::new(BackoffConnector {
            inner: self.inner.http_connector(settings, components),
            client: self.clone(),
        })
    }
}

#[derive(Debug)]
struct BackoffConnector {
    inner: SharedHttpConnector,
    client: BackoffHttpClient,
}

impl HttpConnector for BackoffConnector {
    fn call(&self, request: HttpRequest) -> HttpConnectorFuture {
        let delay = self.client.backoff.delay();
        if delay.is_zero() {
            return self.inner.call(request);
        }
        let inner = self.inner.clone();
        let service = self.client.service;
        self.client.metrics.delayed.get_or_create(&service_label(service)).inc();
        tracing::debug!(service, ?delay, "delaying an AWS request after recent throttling");
        HttpConnectorFuture::new(async move {
            tokio::time::sleep(delay).await;
            inner.call(request).await
        })
    }
}

/// The SDK's default HTTPS client (hyper 1, rustls with aws-lc, proxy from the environment),
/// for SDK configs that do not bring their own.
fn default_http_client() -> SharedHttpClient {
    use aws_smithy_http_client::proxy::ProxyConfig;
    use aws_smithy_http_client::tls::{Provider, rustls_provider::CryptoMode};
    use aws_smithy_http_client::{Builder, ConnectorBuilder};
    Builder::new().build_with_connector_fn(|settings, components| {
        let mut conn =
            ConnectorBuilder::default().tls_provider(Provider::Rustls(CryptoMode::AwsLc));
        conn.set_connector_settings(settings.cloned());
        if let Some(components) = components {
            conn.set_sleep_impl(components.sleep_impl());
        }
        conn.set_proxy_config(Some(ProxyConfig::from_env()));
        conn.build()
    })
}

/// When the current call started (kept in the call's config bag).
#[derive(Debug, Clone, Copy)]
struct CallStart(Instant);

impl Storable for CallStart {
    type Storer = StoreReplace<Self>;
}

/// The stall warning of the current call (kept in the call's config bag; dropping it, at the
/// end of the call or when the call is cancelled, ends the watch).
#[derive(Debug)]
struct CallWatch(#[allow(dead_code)] StallWatch);

impl Storable for CallWatch {
    type Storer = StoreReplace<Self>;
}

/// The interceptor that feeds [`ApiMetrics`] for one client and logs stalled calls.
#[derive(Debug, Clone)]
struct CallCounter {
    service: &'static str,
    metrics: ApiMetrics,
    timeouts: CallTimeouts,
    backoff: Arc<ThrottleBackoff>,
}

impl CallCounter {
    fn operation(cfg: &ConfigBag) -> String {
        cfg.load::<Metadata>().map(|m| m.name().to_string()).unwrap_or_else(|| "unknown".into())
    }
}

impl Intercept for CallCounter {
    fn name(&self) -> &'static str {
        "ccm-aws-call-counter"
    }

    fn read_before_execution(
        &self,
        _context: &BeforeSerializationInterceptorContextRef<'_>,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        cfg.interceptor_state().store_put(CallStart(Instant::now()));
        Ok(())
    }

    fn read_before_attempt(
        &self,
        _context: &BeforeTransmitInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let op = Self::operation(cfg);
        self.metrics.requests.get_or_create(&labels(self.service, &op)).inc();
        // One watch per call, from its first attempt (the operation name is known from here;
        // credentials and endpoint are resolved after this, inside the attempt). It ends
        // with the call: at `read_after_execution`, or when the call is dropped (timeout).
        if cfg.load::<CallWatch>().is_none() {
            let watch = StallWatch::start(
                format!("{}:{op}", self.service),
                self.timeouts.stall_after(),
                Some(self.timeouts.operation),
            );
            cfg.interceptor_state().store_put(CallWatch(watch));
        }
        Ok(())
    }

    fn read_after_attempt(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        let ctx = context.inner();
        if let Some(status) = ctx.response().map(|r| r.status().as_u16()).filter(|s| *s >= 400) {
            self.metrics.status(self.service, &Self::operation(cfg), status);
        }
        match ctx.output_or_error() {
            Some(Ok(_)) => self.backoff.answered(),
            Some(Err(_)) => {
                // The SDK's own classifiers know each service's throttling codes.
                let throttled = runtime_components.retry_classifiers().any(|c| {
                    matches!(
                        c.classify_retry(ctx),
                        RetryAction::RetryIndicated(RetryReason::RetryableError {
                            kind: ErrorKind::ThrottlingError,
                            ..
                        })
                    )
                });
                if throttled {
                    let op = Self::operation(cfg);
                    self.metrics.throttled.get_or_create(&operation_label(&op)).inc();
                    self.backoff.throttled();
                    tracing::warn!(
                        service = self.service,
                        operation = %op,
                        delay = ?self.backoff.delay(),
                        "AWS throttled a request; delaying this service's requests"
                    );
                } else if ctx.response().is_some() {
                    // An answer that is not throttling: the service is keeping up.
                    self.backoff.answered();
                }
            }
            None => {}
        }
        Ok(())
    }

    fn read_after_execution(
        &self,
        context: &FinalizerInterceptorContextRef<'_>,
        _runtime_components: &RuntimeComponents,
        cfg: &mut ConfigBag,
    ) -> Result<(), BoxError> {
        cfg.interceptor_state().unset::<CallWatch>();
        let op = Self::operation(cfg);
        let elapsed = cfg.load::<CallStart>().map(|CallStart(s)| s.elapsed()).unwrap_or_default();
        let failed = matches!(context.output_or_error(), Some(Err(_)));
        shared().call_finished(&[metric_request(&op).as_str()], elapsed, failed.then_some("error"));
        Ok(())
    }
}

/// The SDK clients the provider uses, with the region they serve.
#[derive(Debug, Clone)]
pub struct AwsClients {
    /// EC2.
    pub ec2: aws_sdk_ec2::Client,
    /// Classic Elastic Load Balancing.
    pub elb: aws_sdk_elasticloadbalancing::Client,
    /// Elastic Load Balancing v2 (NLB).
    pub elbv2: aws_sdk_elasticloadbalancingv2::Client,
    /// The region.
    pub region: String,
    /// Call counts.
    pub metrics: ApiMetrics,
}

impl AwsClients {
    /// Loads credentials and region from the SDK default chain (the config's region wins),
    /// assumes `RoleARN` if set, and builds the clients.
    pub async fn new(cfg: &CloudConfig, metrics: ApiMetrics) -> Result<Self, ClientError> {
        let mut loader = aws_config::defaults(BehaviorVersion::latest());
        if let Some(region) = cfg.configured_region() {
            loader = loader.region(Region::new(region));
        }
        let sdk = loader.load().await;
        Self::from_sdk_config(cfg, &sdk, metrics).await
    }

    /// Builds the clients from an already loaded SDK config (tests pass static credentials
    /// here), with the default [`CallTimeouts`]. The config's region, if set, overrides the
    /// SDK config's.
    pub async fn from_sdk_config(
        cfg: &CloudConfig,
        sdk: &SdkConfig,
        metrics: ApiMetrics,
    ) -> Result<Self, ClientError> {
        Self::from_sdk_config_with_timeouts(cfg, sdk, metrics, CallTimeouts::default()).await
    }

    /// [`Self::from_sdk_config`] with other timeouts (tests shorten them to fail in seconds).
    pub async fn from_sdk_config_with_timeouts(
        cfg: &CloudConfig,
        sdk: &SdkConfig,
        metrics: ApiMetrics,
        timeouts: CallTimeouts,
    ) -> Result<Self, ClientError> {
        let region = cfg
            .configured_region()
            .or_else(|| sdk.region().map(|r| r.to_string()))
            .ok_or(ClientError::NoRegion)?;
        // On the SDK config, so every client built from it (STS for RoleARN too) has them.
        let mut sdk = sdk
            .to_builder()
            .region(Region::new(region.clone()))
            .timeout_config(timeouts.timeout_config())
            .retry_config(RetryConfig::standard().with_max_attempts(MAX_ATTEMPTS))
            .build();

        if !cfg.global.role_arn.is_empty() {
            let mut sts_sdk = sdk.clone();
            if let Some(o) = cfg.override_for("sts", &region) {
                sts_sdk = sts_sdk
                    .to_builder()
                    .endpoint_url(o.url.clone())
                    .region(Region::new(o.signing_region.clone()))
                    .build();
            }
            let provider = match source_headers(cfg) {
                None => SharedCredentialsProvider::new(
                    aws_config::sts::AssumeRoleProvider::builder(cfg.global.role_arn.clone())
                        .session_name(ROLE_SESSION_NAME)
                        .configure(&sts_sdk)
                        .build()
                        .await,
                ),
                Some(headers) => {
                    let sts =
                        aws_sdk_sts::config::Builder::from(&sts_sdk).interceptor(CallCounter {
                            service: "sts",
                            metrics: metrics.clone(),
                            timeouts,
                            backoff: Arc::default(),
                        });
                    SharedCredentialsProvider::new(AssumeRoleWithSource {
                        sts: aws_sdk_sts::Client::from_conf(sts.build()),
                        role_arn: cfg.global.role_arn.clone(),
                        headers,
                    })
                }
            };
            sdk = sdk.to_builder().credentials_provider(provider).build();
        }

        let http = sdk.http_client().unwrap_or_else(default_http_client);
        let backoffs: HashMap<&'static str, Arc<ThrottleBackoff>> =
            ["ec2", "elb", "elbv2"].into_iter().map(|s| (s, Arc::default())).collect();
        let backoff = |service: &'static str| backoffs.get(service).cloned().unwrap_or_default();
        let counter = |service| CallCounter {
            service,
            metrics: metrics.clone(),
            timeouts,
            backoff: backoff(service),
        };
        let http_client = |service| BackoffHttpClient {
            inner: http.clone(),
            service,
            backoff: backoff(service),
            metrics: metrics.clone(),
        };

        let mut ec2 = aws_sdk_ec2::config::Builder::from(&sdk)
            .interceptor(counter("ec2"))
            .http_client(http_client("ec2"));
        if let Some(o) = cfg.override_for("ec2", &region) {
            ec2 = ec2.endpoint_url(o.url.clone()).region(Region::new(o.signing_region.clone()));
        }
        let mut elb = aws_sdk_elasticloadbalancing::config::Builder::from(&sdk)
            .interceptor(counter("elb"))
            .http_client(http_client("elb"));
        let mut elbv2 = aws_sdk_elasticloadbalancingv2::config::Builder::from(&sdk)
            .interceptor(counter("elbv2"))
            .http_client(http_client("elbv2"));
        // Classic ELB and ELBv2: each its own override (upstream v1.30+'s `Elastic Load
        // Balancing` and `Elastic Load Balancing v2`), else the shared `elasticloadbalancing`.
        if let Some(o) = cfg.override_for("elasticloadbalancing", &region) {
            elb = elb.endpoint_url(o.url.clone()).region(Region::new(o.signing_region.clone()));
        }
        if let Some(o) = cfg.override_for("elasticloadbalancingv2", &region) {
            elbv2 = elbv2.endpoint_url(o.url.clone()).region(Region::new(o.signing_region.clone()));
        }
        Ok(AwsClients {
            ec2: aws_sdk_ec2::Client::from_conf(ec2.build()),
            elb: aws_sdk_elasticloadbalancing::Client::from_conf(elb.build()),
            elbv2: aws_sdk_elasticloadbalancingv2::Client::from_conf(elbv2.build()),
            region,
            metrics,
        })
    }
}

/// The STS session name of `RoleARN` sessions.
const ROLE_SESSION_NAME: &str = "cloud-controller-manager-aws";

/// Upstream's confused-deputy headers for `SourceARN`: `x-amz-source-arn` and
/// `x-amz-source-account`; `None` without `SourceARN`.
fn source_headers(cfg: &CloudConfig) -> Option<Vec<(&'static str, String)>> {
    let arn = cfg.global.source_arn.trim();
    if arn.is_empty() {
        return None;
    }
    let mut headers = vec![("x-amz-source-arn", arn.to_string())];
    if let Some(account) = crate::config::arn_account(arn).filter(|a| !a.is_empty()) {
        headers.push(("x-amz-source-account", account.to_string()));
    }
    Some(headers)
}

/// `RoleARN` credentials from STS `AssumeRole` with the `SourceARN` headers (the SDK's own
/// provider cannot add headers). The clients' identity cache keeps the credentials until
/// shortly before they expire.
#[derive(Debug)]
struct AssumeRoleWithSource {
    sts: aws_sdk_sts::Client,
    role_arn: String,
    headers: Vec<(&'static str, String)>,
}

impl AssumeRoleWithSource {
    async fn assume(&self) -> aws_credential_types::provider::Result {
        let headers = self.headers.clone();
        let resp = self
            .sts
            .assume_role()
            .role_arn(&self.role_arn)
            .role_session_name(ROLE_SESSION_NAME)
            .customize()
            .mutate_request(move |req| {
                for (name, value) in &headers {
                    req.headers_mut().insert(*name, value.clone());
                }
            })
            .send()
            .await
            .map_err(|e| {
                CredentialsError::provider_error(format!(
                    "sts:AssumeRole {}: {}",
                    self.role_arn,
                    DisplayErrorContext(&e)
                ))
            })?;
        let c = resp.credentials().ok_or_else(|| {
            CredentialsError::provider_error(format!(
                "sts:AssumeRole {} returned no credentials",
                self.role_arn
            ))
        })?;
        let expiry = SystemTime::try_from(*c.expiration()).ok();
        Ok(Credentials::new(
            c.access_key_id(),
            c.secret_access_key(),
            Some(c.session_token().to_string()),
            expiry,
            "AssumeRoleWithSourceArn",
        ))
    }
}

impl ProvideCredentials for AssumeRoleWithSource {
    fn provide_credentials<'a>(&'a self) -> future::ProvideCredentials<'a>
    where
        Self: 'a,
    {
        future::ProvideCredentials::new(self.assume())
    }
}

/// Error codes AWS uses for throttling.
const THROTTLE_CODES: &[&str] = &[
    "Throttling",
    "ThrottlingException",
    "RequestLimitExceeded",
    "RequestThrottled",
    "TooManyRequestsException",
    "SlowDown",
];

/// The AWS error code of a failed call, if the service sent one.
pub(crate) fn error_code<E: ProvideErrorMetadata, R>(err: &SdkError<E, R>) -> Option<&str> {
    err.code()
}

/// Maps a failed SDK call onto a [`ProviderError`]: throttling becomes
/// [`ProviderError::Throttled`], anything else [`ProviderError::Other`] with `what` as context.
pub(crate) fn api_error<E, R>(what: impl fmt::Display, err: SdkError<E, R>) -> ProviderError
where
    E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
    R: fmt::Debug + Send + Sync + 'static,
{
    let code = err.code().map(str::to_string);
    if let Some(code) = code.as_deref().filter(|c| THROTTLE_CODES.contains(c)) {
        return ProviderError::Throttled(format!("{what}: {code}"));
    }
    let message = format!("{what}: {}", DisplayErrorContext(&err));
    ProviderError::with_source(message, err)
}

/// The clients, built on first use: loading the SDK config may ask instance metadata for the
/// region, which is async, while the provider is constructed synchronously at startup.
#[derive(Debug)]
pub struct LazyClients {
    cfg: CloudConfig,
    metrics: ApiMetrics,
    cell: tokio::sync::OnceCell<AwsClients>,
}

impl LazyClients {
    /// Clients from the SDK default chain and `cfg`, built when first needed.
    pub fn new(cfg: CloudConfig, metrics: ApiMetrics) -> Self {
        LazyClients { cfg, metrics, cell: tokio::sync::OnceCell::new() }
    }

    /// Clients that are already built.
    pub fn ready(clients: AwsClients) -> Self {
        LazyClients {
            cfg: CloudConfig::default(),
            metrics: clients.metrics.clone(),
            cell: tokio::sync::OnceCell::new_with(Some(clients)),
        }
    }

    /// The call counters.
    pub fn metrics(&self) -> &ApiMetrics {
        &self.metrics
    }

    /// The clients (built now if this is the first call; loading the SDK config, which may
    /// ask instance metadata, is bounded by the default operation timeout).
    pub async fn get(&self) -> Result<&AwsClients, ProviderError> {
        if let Some(clients) = self.cell.get() {
            return Ok(clients);
        }
        // Boxed: the SDK's loading future is large, and every call site awaits `get`.
        let init = Box::pin(async {
            let deadline = cloud_call::Deadline::new(CallTimeouts::default().operation);
            deadline
                .run("loading the AWS SDK config", AwsClients::new(&self.cfg, self.metrics.clone()))
                .await?
                .map_err(|e| ProviderError::with_source("building the AWS clients", e))
        });
        self.cell.get_or_try_init(|| init).await
    }
}

/// Shared handle type used by the capability implementations.
pub(crate) type Clients = Arc<LazyClients>;
