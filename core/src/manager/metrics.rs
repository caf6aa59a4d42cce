//! The manager's client-go and component-base metrics, with upstream names and labels so
//! existing dashboards and alerts work (issue #13 point 7, manager side):
//!
//! - `rest_client_requests_total{code,host,method}` and
//!   `rest_client_request_duration_seconds{host,verb}` (client-go's buckets), recorded by
//!   [`RestClientMetricsLayer`] on every API client the manager builds (controllers',
//!   leader election's, the provider's, the delegated-auth clients). `code` is the HTTP
//!   status code, or `<error>` when no response came back.
//! - `leader_election_slowpath_total{name}` (incremented by [`super::leader`]).
//! - `kubernetes_build_info{...}` (constant 1; the version of this manager).
//!
//! The families are process-wide (client-go's are global too) and registered in the
//! manager's registry by [`register`]. Help texts are upstream's without the final period
//! (the encoder adds one).

use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use tower::{Layer, Service};

type Labels = Vec<(String, String)>;

/// client-go's `rest_client_request_duration_seconds` buckets.
const LATENCY_BUCKETS: [f64; 12] =
    [0.005, 0.025, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 15.0, 30.0, 60.0];

struct Families {
    requests: Family<Labels, Counter>,
    duration: Family<Labels, Histogram>,
    slowpath: Family<Labels, Counter>,
    build_info: Family<Labels, Gauge>,
}

static FAMILIES: LazyLock<Families> = LazyLock::new(|| Families {
    requests: Family::default(),
    duration: Family::new_with_constructor(|| Histogram::new(LATENCY_BUCKETS)),
    slowpath: Family::default(),
    build_info: Family::default(),
});

/// Registers the families in the manager's registry and sets the build info.
pub fn register(registry: &mut Registry) {
    let f = &*FAMILIES;
    registry.register(
        "rest_client_requests",
        "[ALPHA] Number of HTTP requests, partitioned by status code, method, and host",
        f.requests.clone(),
    );
    registry.register(
        "rest_client_request_duration_seconds",
        "[ALPHA] Request latency in seconds. Broken down by verb, and host",
        f.duration.clone(),
    );
    registry.register(
        "leader_election_slowpath",
        "[ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name",
        f.slowpath.clone(),
    );
    registry.register(
        "kubernetes_build_info",
        "[ALPHA] A metric with a constant '1' value labeled by major, minor, git version, git commit, git tree state, build date, Go version, and compiler from which Kubernetes was built, and platform on which it is running",
        f.build_info.clone(),
    );
    f.build_info.get_or_create(&build_info_labels()).set(1);
}

/// Counts one slow-path renewal of the lease `name` (client-go: the cached lease could not
/// be updated directly, so it was read again first).
pub fn leader_election_slowpath(name: &str) {
    FAMILIES.slowpath.get_or_create(&vec![("name".to_string(), name.to_string())]).inc();
}

fn build_info_labels() -> Labels {
    let version = env!("CARGO_PKG_VERSION");
    let mut parts = version.split('.');
    let major = parts.next().unwrap_or_default();
    let minor = parts.next().unwrap_or_default();
    let arch = match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    };
    [
        ("build_date", ""),
        ("compiler", "rustc"),
        ("git_commit", option_env!("CCM_GIT_COMMIT").unwrap_or("")),
        ("git_tree_state", ""),
        ("git_version", &format!("v{version}")),
        ("go_version", ""),
        ("major", major),
        ("minor", minor),
        ("platform", &format!("{}/{arch}", std::env::consts::OS)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v.to_string()))
    .collect()
}

/// Records `rest_client_*` for every request of a client to `host` (the apiserver's
/// `host:port`, as client-go's `url.Host`).
#[derive(Debug, Clone)]
pub struct RestClientMetricsLayer {
    host: String,
}

impl RestClientMetricsLayer {
    /// A layer labelling requests with `host`.
    pub fn new(host: impl Into<String>) -> Self {
        RestClientMetricsLayer { host: host.into() }
    }
}

impl<S> Layer<S> for RestClientMetricsLayer {
    type Service = RestClientMetrics<S>;

    fn layer(&self, inner: S) -> RestClientMetrics<S> {
        RestClientMetrics { inner, host: self.host.clone() }
    }
}

/// The recording service.
#[derive(Debug, Clone)]
pub struct RestClientMetrics<S> {
    inner: S,
    host: String,
}

impl<S, B, R> Service<http::Request<B>> for RestClientMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let method = req.method().as_str().to_string();
        let host = self.host.clone();
        let fut = self.inner.call(req);
        Box::pin(async move {
            let start = Instant::now();
            let result = fut.await;
            let code = match &result {
                Ok(resp) => resp.status().as_u16().to_string(),
                Err(_) => "<error>".to_string(),
            };
            FAMILIES
                .duration
                .get_or_create(&vec![
                    ("host".into(), host.clone()),
                    ("verb".into(), method.clone()),
                ])
                .observe(start.elapsed().as_secs_f64());
            FAMILIES
                .requests
                .get_or_create(&vec![
                    ("code".into(), code),
                    ("host".into(), host),
                    ("method".into(), method),
                ])
                .inc();
            result
        })
    }
}
