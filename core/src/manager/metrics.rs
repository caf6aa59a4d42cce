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
//! - `process_*` as Go's process collector serves them, read from `/proc/self` when scraped
//!   ([`ProcessCollector`]; nothing on systems without `/proc`).
//! - Each cloud's API call families with upstream's names
//!   ([`crate::cloud_call::api_metrics`]).
//!
//! The families are process-wide (client-go's are global too) and registered in the
//! manager's registry by [`register`]. Help texts are upstream's without the final period
//! (the encoder adds one).

use std::future::Future;
use std::pin::Pin;
use std::sync::LazyLock;
use std::task::{Context, Poll};
use std::time::Instant;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
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

/// The labelled families of [`register`], of the manager (leader election, running controllers),
/// its webhooks and the node IPAM controller, as the reference lists them before any sample exists:
/// (family name as its `# HELP` line gives it, type, label names, help).
pub const DESCRIBED: &[(&str, &str, &[&str], &str)] = &[
    (
        "rest_client_requests",
        "counter",
        &["code", "host", "method"],
        "[ALPHA] Number of HTTP requests, partitioned by status code, method, and host.",
    ),
    (
        "rest_client_request_duration_seconds",
        "histogram",
        &["host", "verb"],
        "[ALPHA] Request latency in seconds. Broken down by verb, and host.",
    ),
    (
        "leader_election_slowpath",
        "counter",
        &["name"],
        "[ALPHA] Total number of slow path exercised in renewing leader leases. 'name' is the string used to identify the lease. Please make sure to group by name.",
    ),
    (
        "leader_election_master_status",
        "gauge",
        &["name"],
        "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
    ),
    (
        "running_managed_controllers",
        "gauge",
        &["manager", "name"],
        "[BETA] Indicates where instances of a controller are currently running.",
    ),
    (
        "cloud_provider_webhook_request",
        "counter",
        &["code", "webhook"],
        "[ALPHA] Number of HTTP requests partitioned by status code.",
    ),
    (
        "cloud_provider_webhook_request_duration_seconds",
        "histogram",
        &["code", "webhook"],
        "[ALPHA] Response latency distribution in seconds for each webhook.",
    ),
    (
        "node_ipam_controller_cidrset_cidrs_allocations",
        "counter",
        &["clusterCIDR"],
        "Counter measuring total number of CIDR allocations.",
    ),
    (
        "node_ipam_controller_cidrset_cidrs_releases",
        "counter",
        &["clusterCIDR"],
        "Counter measuring total number of CIDR releases.",
    ),
    (
        "node_ipam_controller_cidrset_usage_cidrs",
        "gauge",
        &["clusterCIDR"],
        "Gauge measuring percentage of allocated CIDRs.",
    ),
    (
        "node_ipam_controller_cidrset_allocation_tries_per_request",
        "histogram",
        &["clusterCIDR"],
        "Number of endpoints added on each Service sync.",
    ),
];

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
    {
        // Under the lock set_build_info takes: one sample, whichever comes first.
        let set = BUILD_INFO.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        let labels = set.clone().unwrap_or_else(default_build_info_labels);
        f.build_info.get_or_create(&labels).set(1);
    }
    registry.register_collector(Box::new(ProcessCollector));
    registry.register_collector(crate::cloud_call::api_metrics::collector());
}

/// Go's process collector (`process_*`), read from `/proc/self` at every scrape.
#[derive(Debug, Default, Clone, Copy)]
pub struct ProcessCollector;

/// One reading of `/proc/self`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ProcessStats {
    /// User and system CPU seconds.
    pub cpu_seconds: f64,
    /// Open file descriptors.
    pub open_fds: u64,
    /// The soft limit of open files (`-1`: unlimited).
    pub max_fds: f64,
    /// Virtual memory size in bytes.
    pub virtual_memory_bytes: f64,
    /// The soft limit of the address space in bytes (`-1`: unlimited).
    pub virtual_memory_max_bytes: f64,
    /// Resident memory size in bytes.
    pub resident_memory_bytes: f64,
    /// Start time since the Unix epoch, in seconds.
    pub start_time_seconds: f64,
}

/// Clock ticks per second of `/proc/*/stat` (Linux's `USER_HZ`, as Go's procfs assumes).
const USER_HZ: f64 = 100.0;

/// The soft limit of the `/proc/self/limits` row starting with `row` (`-1` for unlimited).
fn soft_limit(limits: &str, row: &str) -> Option<f64> {
    let line = limits.lines().find(|l| l.starts_with(row))?;
    let soft = line[row.len()..].split_whitespace().next()?;
    if soft == "unlimited" { Some(-1.0) } else { soft.parse().ok() }
}

/// `VmSize:`/`VmRSS:` style lines of `/proc/self/status`, in bytes.
fn status_kb(status: &str, key: &str) -> Option<f64> {
    let line = status.lines().find(|l| l.starts_with(key))?;
    let kb: f64 = line[key.len()..].split_whitespace().next()?.parse().ok()?;
    Some(kb * 1024.0)
}

impl ProcessStats {
    /// Reads `/proc/self` (`None` where there is no procfs).
    pub fn read() -> Option<ProcessStats> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        // Fields after the command name (which may hold spaces) in parentheses.
        let rest = stat.rsplit_once(')')?.1;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        // `rest` starts at field 3 (state): utime is field 14, stime 15, starttime 22.
        let field = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
        let cpu_seconds = (field(14)? + field(15)?) / USER_HZ;
        let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
            s.lines().find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())
        })?;
        let start_time_seconds = boot + field(22)? / USER_HZ;
        let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
        let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
        let open_fds =
            std::fs::read_dir("/proc/self/fd").map(|d| d.count() as u64).unwrap_or_default();
        Some(ProcessStats {
            cpu_seconds,
            // As Go's procfs: the descriptor reading the directory is counted too.
            open_fds,
            max_fds: soft_limit(&limits, "Max open files").unwrap_or(-1.0),
            virtual_memory_bytes: status_kb(&status, "VmSize:").unwrap_or_default(),
            virtual_memory_max_bytes: soft_limit(&limits, "Max address space").unwrap_or(-1.0),
            resident_memory_bytes: status_kb(&status, "VmRSS:").unwrap_or_default(),
            start_time_seconds,
        })
    }
}

fn gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    value: f64,
) -> Result<(), std::fmt::Error> {
    let m = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    ConstGauge::new(value).encode(m)
}

impl Collector for ProcessCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let Some(p) = ProcessStats::read() else { return Ok(()) };
        let m = encoder.encode_descriptor(
            "process_cpu_seconds",
            "Total user and system CPU time spent in seconds.",
            None,
            MetricType::Counter,
        )?;
        ConstCounter::new(p.cpu_seconds).encode(m)?;
        let e = &mut encoder;
        gauge(e, "process_open_fds", "Number of open file descriptors.", p.open_fds as f64)?;
        gauge(e, "process_max_fds", "Maximum number of open file descriptors.", p.max_fds)?;
        gauge(
            e,
            "process_virtual_memory_bytes",
            "Virtual memory size in bytes.",
            p.virtual_memory_bytes,
        )?;
        gauge(
            e,
            "process_virtual_memory_max_bytes",
            "Maximum amount of virtual memory available in bytes.",
            p.virtual_memory_max_bytes,
        )?;
        gauge(
            e,
            "process_resident_memory_bytes",
            "Resident memory size in bytes.",
            p.resident_memory_bytes,
        )?;
        gauge(
            e,
            "process_start_time_seconds",
            "Start time of the process since unix epoch in seconds.",
            p.start_time_seconds,
        )
    }
}

/// Counts one slow-path renewal of the lease `name` (client-go: the cached lease could not
/// be updated directly, so it was read again first).
pub fn leader_election_slowpath(name: &str) {
    FAMILIES.slowpath.get_or_create(&vec![("name".to_string(), name.to_string())]).inc();
}

/// What the binary reports as its build (`ccm-cmd` sets it from its build script's facts, the
/// same `--version=raw` prints); `None`: this library's own [`super::flags::VersionInfo`].
static BUILD_INFO: std::sync::Mutex<Option<Labels>> = std::sync::Mutex::new(None);

/// Makes `kubernetes_build_info` report `info`, with `go_version` (upstream's Go toolchain
/// label; a binary puts its Rust compiler's version there). Replaces the sample at once if the
/// family is already registered, so the metric never shows two builds.
pub fn set_build_info(info: &super::flags::VersionInfo, go_version: &str) {
    let labels = build_info_labels_of(info, go_version);
    let mut set = BUILD_INFO.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    *set = Some(labels.clone());
    let family = &FAMILIES.build_info;
    family.clear();
    family.get_or_create(&labels).set(1);
}

/// This library's own facts, the same `--version=raw` prints, so the metric and the flag agree.
fn default_build_info_labels() -> Labels {
    let v = super::flags::VersionInfo::get(&super::flags::VersionFlag::Off);
    build_info_labels_of(&v, "")
}

/// Upstream's labels of `kubernetes_build_info` (component-base's version metric) from a
/// version info, sorted by name as Go's Prometheus client writes them.
fn build_info_labels_of(v: &super::flags::VersionInfo, go_version: &str) -> Labels {
    [
        ("build_date", v.build_date.as_str()),
        ("compiler", v.compiler.as_str()),
        ("git_commit", v.git_commit.as_str()),
        ("git_tree_state", v.git_tree_state.as_str()),
        ("git_version", v.git_version.as_str()),
        ("go_version", go_version),
        ("major", v.major.as_str()),
        ("minor", v.minor.as_str()),
        ("platform", v.platform.as_str()),
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn build_info_agrees_with_version_raw() {
        let info = super::super::flags::VersionInfo::get(&super::super::flags::VersionFlag::Off);
        let labels: std::collections::BTreeMap<_, _> =
            build_info_labels_of(&info, "").into_iter().collect();
        // Before: git_commit fell back to "" and build_date to "" while --version said
        // "unknown" and the epoch.
        assert_eq!(labels["git_commit"], info.git_commit);
        assert!(!labels["git_commit"].is_empty(), "a commit or \"unknown\", as --version");
        assert_eq!(labels["build_date"], info.build_date);
        assert_eq!(labels["git_version"], info.git_version);
        assert_eq!(labels["git_tree_state"], info.git_tree_state);
        assert_eq!(labels["platform"], info.platform);
        assert!(info.raw().contains(&format!("GitCommit:\"{}\"", labels["git_commit"])));
    }

    /// The binary's facts replace the library's on a registered family: one sample, the
    /// binary's commit and compiler version (go_version), in upstream's label set.
    #[test]
    fn set_build_info_replaces_the_sample() {
        let mut registry = Registry::default();
        register(&mut registry);
        let mut info =
            super::super::flags::VersionInfo::get(&super::super::flags::VersionFlag::Off);
        info.git_commit = "0123456789abcdef0123456789abcdef01234567".to_string();
        info.git_tree_state = "clean".to_string();
        set_build_info(&info, "rustc 1.94.1 (e408947bf 2026-03-25)");
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        let samples: Vec<&str> =
            text.lines().filter(|l| l.starts_with("kubernetes_build_info{")).collect();
        assert_eq!(samples.len(), 1, "{samples:?}");
        let want = format!(
            "kubernetes_build_info{{build_date=\"{}\",compiler=\"rustc\",\
             git_commit=\"0123456789abcdef0123456789abcdef01234567\",git_tree_state=\"clean\",\
             git_version=\"{}\",go_version=\"rustc 1.94.1 (e408947bf 2026-03-25)\",\
             major=\"{}\",minor=\"{}\",platform=\"{}\"}} 1",
            info.build_date, info.git_version, info.major, info.minor, info.platform
        );
        assert_eq!(samples[0], want);
    }

    #[test]
    fn process_metrics_are_read_from_proc_self() {
        let p = ProcessStats::read().expect("procfs");
        assert!(p.open_fds >= 3, "{p:?}");
        assert!(p.resident_memory_bytes > 1e6 && p.virtual_memory_bytes >= p.resident_memory_bytes);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or_default();
        // Started in the last hour (a test process), not in the future.
        assert!(p.start_time_seconds <= now + 1.0 && p.start_time_seconds > now - 3600.0, "{p:?}");
        assert!(p.max_fds >= p.open_fds as f64 || p.max_fds == -1.0);

        let mut reg = Registry::default();
        register(&mut reg);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &reg).unwrap();
        for name in [
            "\nprocess_cpu_seconds_total ",
            "\nprocess_open_fds ",
            "\nprocess_max_fds ",
            "\nprocess_virtual_memory_bytes ",
            "\nprocess_virtual_memory_max_bytes ",
            "\nprocess_resident_memory_bytes ",
            "\nprocess_start_time_seconds ",
        ] {
            assert!(text.contains(name), "{name} missing:\n{text}");
        }
        assert!(text.contains("# TYPE process_cpu_seconds counter"), "{text}");
    }

    #[test]
    fn limits_rows_are_parsed() {
        let limits = "Limit                     Soft Limit           Hard Limit           Units\n\
                      Max open files            1024                 524288               files\n\
                      Max address space         unlimited            unlimited            bytes\n";
        assert_eq!(soft_limit(limits, "Max open files"), Some(1024.0));
        assert_eq!(soft_limit(limits, "Max address space"), Some(-1.0));
        assert_eq!(status_kb("VmRSS:\t  2048 kB\n", "VmRSS:"), Some(2048.0 * 1024.0));
    }
}
