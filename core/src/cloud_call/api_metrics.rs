//! Cloud API call metrics with each upstream's own family names, labels and buckets, written
//! once for every provider (issue #30 point 6).
//!
//! Each cloud is described by a [`CloudMetrics`] descriptor (its families: name, type, label
//! names, buckets, help) and a rule saying which families one finished API call feeds
//! ([`CallFamilies`]). A provider's client gets the process-wide [`ApiMetrics`] of its cloud
//! from [`ApiMetrics::of`] and calls [`ApiMetrics::call_finished`] at the one place every
//! request passes (where its deadline, Retry-After handling and reply size cap are). The
//! manager serves every cloud whose metrics were asked for through [`collector`], registered
//! once in its registry by `manager::metrics::register`; [`CLOUDS`] lists every family for the
//! metrics reference, including those that have no sample yet.
//!
//! Names are served exactly as upstream's Prometheus client serves them. OpenMetrics (the
//! format served here) requires a counter's samples to end in `_total`; upstream's counters
//! whose name does not (`cloudprovider_aws_api_request_errors`,
//! `cloudprovider_gce_api_request_errors`, `cloudprovider_azure_api_request_errors`, ...) are
//! therefore served with type `unknown` under their exact name, so upstream's queries and
//! alerts find them.

use std::collections::BTreeMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard};
use std::time::Duration;

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::Histogram;

/// The type of a family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A counter (served as `unknown` when its upstream name does not end in `_total`).
    Counter,
    /// A histogram with [`Family::buckets`].
    Histogram,
}

/// One metric family as upstream serves it.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Family {
    /// The exact sample name (histograms: the base of `_bucket`, `_sum`, `_count`).
    pub name: &'static str,
    /// Upstream's help text.
    pub help: &'static str,
    /// Counter or histogram.
    pub kind: Kind,
    /// The label names, in upstream's order.
    pub labels: &'static [&'static str],
    /// Histogram buckets (upper bounds; `+Inf` is added).
    pub buckets: &'static [f64],
    /// Recorded by the provider itself (the descriptor lists it for the reference only).
    pub external: bool,
}

impl Family {
    const fn counter(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
    ) -> Self {
        Family { name, help, kind: Kind::Counter, labels, buckets: &[], external: false }
    }

    const fn histogram(
        name: &'static str,
        help: &'static str,
        labels: &'static [&'static str],
        buckets: &'static [f64],
    ) -> Self {
        Family { name, help, kind: Kind::Histogram, labels, buckets, external: false }
    }

    const fn external(self) -> Self {
        Family { external: true, ..self }
    }

    /// The type the reference shows: `counter`, `histogram`, or `unknown` (a counter whose
    /// upstream name lacks `_total`).
    pub fn exposed_type(&self) -> &'static str {
        match self.kind {
            Kind::Histogram => "histogram",
            Kind::Counter if self.name.ends_with("_total") => "counter",
            Kind::Counter => "unknown",
        }
    }
}

/// Which families one finished API call feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallFamilies {
    /// The latency histogram.
    pub duration: &'static str,
    /// Whether a failed call is observed in [`Self::duration`] too (upstream's AWS observes
    /// successes only).
    pub duration_on_error: bool,
    /// The counter of every call, if the cloud has one.
    pub total: Option<&'static str>,
    /// The counter of failed calls. When it has one label more than the call's labels (Azure's
    /// `code`), the error code fills it.
    pub errors: &'static str,
}

/// A cloud's API metric families.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CloudMetrics {
    /// The cloud (`aws`, `azure`, `gcp`, `openstack`, `vsphere`, `ibm`).
    pub cloud: &'static str,
    /// The cloud's name in the reference (`AWS`, `Azure`, ...).
    pub title: &'static str,
    /// Where upstream's names come from (shown in the reference).
    pub source: &'static str,
    /// Every family.
    pub families: &'static [Family],
    /// What [`ApiMetrics::call_finished`] records.
    pub call: CallFamilies,
}

/// Prometheus' default buckets (upstream's AWS, GCE and OpenStack API histograms).
pub const DEFAULT_BUCKETS: &[f64] =
    &[0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0];

/// Upstream's AWS families (k8s.io/cloud-provider-aws v1.36, `aws_metrics.go`), and this
/// provider's own request and back-off counters. `request` is upstream's name for the
/// operations it records (`describe_instance`, `create_tags`, ...), else the SDK operation name
/// in snake case (`describe_load_balancers`).
pub const AWS: CloudMetrics = CloudMetrics {
    cloud: "aws",
    title: "AWS",
    source: "k8s.io/cloud-provider-aws v1.36.2, pkg/providers/v1/aws_metrics.go",
    families: &[
        Family::histogram(
            "cloudprovider_aws_api_request_duration_seconds",
            "[ALPHA] Latency of AWS API calls",
            &["request"],
            DEFAULT_BUCKETS,
        ),
        Family::counter(
            "cloudprovider_aws_api_request_errors",
            "[ALPHA] AWS API errors",
            &["request"],
        ),
        Family::counter(
            "cloudprovider_aws_api_response_status_total",
            "[ALPHA] AWS API response status code counts",
            &["service", "operation", "status_code"],
        ),
        Family::counter(
            "cloudprovider_aws_api_throttled_requests_total",
            "[ALPHA] AWS API throttled requests",
            &["operation_name"],
        )
        .external(),
        Family::counter(
            "cloudprovider_aws_api_request_total",
            "AWS API request attempts, by service and operation",
            &["service", "operation"],
        )
        .external(),
        Family::counter(
            "cloudprovider_aws_api_delayed_requests_total",
            "AWS API requests held back by the shared throttling back-off, by service",
            &["service"],
        )
        .external(),
    ],
    call: CallFamilies {
        duration: "cloudprovider_aws_api_request_duration_seconds",
        duration_on_error: false,
        total: None,
        errors: "cloudprovider_aws_api_request_errors",
    },
};

const AZURE_LABELS: &[&str] = &["request", "resource_group", "subscription_id", "source"];

/// Upstream's Azure families (sigs.k8s.io/cloud-provider-azure v1.36, `pkg/metrics`). `request`
/// is `<resource>_<verb>` as upstream's ARM clients named it (`load_balancers_get`,
/// `public_ip_addresses_create_or_update`, `vm_list`, ...); `resource_group` lower case;
/// `source` empty for API calls.
pub const AZURE: CloudMetrics = CloudMetrics {
    cloud: "azure",
    title: "Azure",
    source: "sigs.k8s.io/cloud-provider-azure v1.36.5, pkg/metrics/azure_metrics.go",
    families: &[
        Family::histogram(
            "cloudprovider_azure_api_request_duration_seconds",
            "[ALPHA] Latency of an Azure API call",
            AZURE_LABELS,
            &[0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 15.0, 25.0, 50.0, 120.0, 300.0, 600.0, 1200.0],
        ),
        Family::counter(
            "cloudprovider_azure_api_request_errors",
            "[ALPHA] Number of errors for an Azure API call",
            &["request", "resource_group", "subscription_id", "source", "code"],
        ),
        Family::counter(
            "cloudprovider_azure_api_request_ratelimited_count",
            "[ALPHA] Number of rate limited Azure API calls",
            AZURE_LABELS,
        ),
        Family::counter(
            "cloudprovider_azure_api_request_throttled_count",
            "[ALPHA] Number of throttled Azure API calls",
            AZURE_LABELS,
        ),
        Family::histogram(
            "cloudprovider_azure_op_duration_seconds",
            "[ALPHA] Latency of an Azure service operation",
            AZURE_LABELS,
            &[
                0.1, 0.2, 0.5, 1.0, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 100.0, 200.0,
                300.0, 600.0, 1200.0,
            ],
        ),
        Family::counter(
            "cloudprovider_azure_op_failure_count",
            "[ALPHA] Number of failed Azure service operations",
            AZURE_LABELS,
        ),
    ],
    call: CallFamilies {
        duration: "cloudprovider_azure_api_request_duration_seconds",
        duration_on_error: true,
        total: None,
        errors: "cloudprovider_azure_api_request_errors",
    },
};

/// Upstream's GCE families (the GCE provider's `metrics.go`, k8s.io/legacy-cloud-providers
/// v0.30, which cloud-provider-gcp carries on). `request` is `<resource>_<verb>`
/// (`instances_get`, `forwardingrule_create`, `targetpool_add_instances`, ...); `region` and
/// `zone` are `<n/a>` when the call has none; `version` is the Compute API version (`v1`).
pub const GCE: CloudMetrics = CloudMetrics {
    cloud: "gcp",
    title: "GCP",
    source: "k8s.io/legacy-cloud-providers v0.30.14, gce/metrics.go",
    families: &[
        Family::histogram(
            "cloudprovider_gce_api_request_duration_seconds",
            "[ALPHA] Latency of a GCE API call",
            &["request", "region", "zone", "version"],
            DEFAULT_BUCKETS,
        ),
        Family::counter(
            "cloudprovider_gce_api_request_errors",
            "[ALPHA] Number of errors for an API call",
            &["request", "region", "zone", "version"],
        ),
    ],
    call: CallFamilies {
        duration: "cloudprovider_gce_api_request_duration_seconds",
        duration_on_error: true,
        total: None,
        errors: "cloudprovider_gce_api_request_errors",
    },
};

const RECONCILE_BUCKETS: &[f64] = &[
    0.01, 0.05, 0.1, 0.5, 1.0, 2.5, 5.0, 7.5, 10.0, 12.5, 15.0, 17.5, 20.0, 22.5, 25.0, 27.5, 30.0,
    50.0, 75.0, 100.0, 1000.0,
];

/// Upstream's OpenStack families (k8s.io/cloud-provider-openstack v1.36, `pkg/metrics`).
/// `request` is `<resource>_<verb>` as upstream names it (`server_get`, `server_list`,
/// `loadbalancer_create`, `floating_ip_update`, `port_list`, ...); the reconcile families'
/// `operation` is `loadbalancer_ensure`, `loadbalancer_update`, `loadbalancer_delete`.
pub const OPENSTACK: CloudMetrics = CloudMetrics {
    cloud: "openstack",
    title: "OpenStack",
    source: "k8s.io/cloud-provider-openstack v1.36.0, pkg/metrics",
    families: &[
        Family::histogram(
            "openstack_api_request_duration_seconds",
            "[ALPHA] Latency of an OpenStack API call",
            &["request"],
            DEFAULT_BUCKETS,
        ),
        Family::counter(
            "openstack_api_requests_total",
            "[ALPHA] Total number of OpenStack API calls",
            &["request"],
        ),
        Family::counter(
            "openstack_api_request_errors_total",
            "[ALPHA] Total number of errors for an OpenStack API call",
            &["request"],
        ),
        Family::histogram(
            "cloudprovider_openstack_reconcile_duration_seconds",
            "[ALPHA] Time taken by various parts of OpenStack cloud controller manager reconciliation loops",
            &["operation"],
            RECONCILE_BUCKETS,
        ),
        Family::counter(
            "cloudprovider_openstack_reconcile_total",
            "[ALPHA] Total number of OpenStack cloud controller manager reconciliations",
            &["operation"],
        ),
        Family::counter(
            "cloudprovider_openstack_reconcile_errors_total",
            "[ALPHA] Total number of OpenStack cloud controller manager reconciliation errors",
            &["operation"],
        ),
    ],
    call: CallFamilies {
        duration: "openstack_api_request_duration_seconds",
        duration_on_error: true,
        total: Some("openstack_api_requests_total"),
        errors: "openstack_api_request_errors_total",
    },
};

/// The families [`ApiMetrics::reconcile_finished`] records (OpenStack's).
pub const OPENSTACK_RECONCILE: CallFamilies = CallFamilies {
    duration: "cloudprovider_openstack_reconcile_duration_seconds",
    duration_on_error: true,
    total: Some("cloudprovider_openstack_reconcile_total"),
    errors: "cloudprovider_openstack_reconcile_errors_total",
};

/// Azure's service operations (`op_*`), recorded as upstream does: the latency of every
/// operation, a failure count of the failed ones.
pub const AZURE_OPERATION: CallFamilies = CallFamilies {
    duration: "cloudprovider_azure_op_duration_seconds",
    duration_on_error: true,
    total: None,
    errors: "cloudprovider_azure_op_failure_count",
};

/// Every cloud with API metric families upstream (vSphere's and IBM's upstream providers
/// register none).
pub const CLOUDS: &[&CloudMetrics] = &[&AWS, &AZURE, &GCE, &OPENSTACK];

enum Series {
    Counter(u64),
    Histogram { hist: Histogram, count: u64 },
}

type Samples = BTreeMap<Vec<String>, Series>;

/// The samples of one cloud's families. Process-wide per cloud ([`ApiMetrics::of`]).
pub struct ApiMetrics {
    desc: &'static CloudMetrics,
    samples: Vec<Mutex<Samples>>,
}

impl std::fmt::Debug for ApiMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiMetrics").field("cloud", &self.desc.cloud).finish_non_exhaustive()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

static ACTIVE: LazyLock<Mutex<Vec<Arc<ApiMetrics>>>> = LazyLock::new(Default::default);

impl ApiMetrics {
    /// The process-wide metrics of `desc`'s cloud (created on first use; from then on served
    /// by [`collector`]).
    pub fn of(desc: &'static CloudMetrics) -> Arc<ApiMetrics> {
        let mut active = lock(&ACTIVE);
        if let Some(m) = active.iter().find(|m| m.desc.cloud == desc.cloud) {
            return m.clone();
        }
        let m = Arc::new(ApiMetrics {
            desc,
            samples: desc.families.iter().map(|_| Mutex::new(Samples::new())).collect(),
        });
        active.push(m.clone());
        m
    }

    /// The descriptor.
    pub fn descriptor(&self) -> &'static CloudMetrics {
        self.desc
    }

    fn family(&self, name: &str) -> Option<(usize, &'static Family)> {
        self.desc.families.iter().enumerate().find(|(_, f)| f.name == name)
    }

    /// Series of `name` with `labels` (one value per label name, in order). A name this cloud
    /// does not have, or a wrong number of values, is logged and dropped: metrics never fail
    /// a call.
    fn with_series(&self, name: &str, labels: &[&str], f: impl FnOnce(&mut Series)) {
        let Some((i, family)) = self.family(name) else {
            tracing::warn!(cloud = self.desc.cloud, family = name, "no such API metric family");
            return;
        };
        if labels.len() != family.labels.len() {
            tracing::warn!(
                cloud = self.desc.cloud,
                family = name,
                given = labels.len(),
                expected = family.labels.len(),
                "API metric recorded with a wrong number of labels"
            );
            return;
        }
        let key: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        let mut samples = lock(&self.samples[i]);
        let series = samples.entry(key).or_insert_with(|| match family.kind {
            Kind::Counter => Series::Counter(0),
            Kind::Histogram => {
                Series::Histogram { hist: Histogram::new(family.buckets.iter().copied()), count: 0 }
            }
        });
        f(series);
    }

    /// Adds one to the counter `name`.
    pub fn inc(&self, name: &str, labels: &[&str]) {
        self.with_series(name, labels, |s| {
            if let Series::Counter(v) = s {
                *v += 1;
            }
        });
    }

    /// Observes `seconds` in the histogram `name`.
    pub fn observe(&self, name: &str, labels: &[&str], seconds: f64) {
        self.with_series(name, labels, |s| {
            if let Series::Histogram { hist, count } = s {
                hist.observe(seconds);
                *count += 1;
            }
        });
    }

    /// Records one finished API call, as the cloud's upstream does ([`CloudMetrics::call`]):
    /// its latency, the call count, and when it failed (`error` set) the error count. `error`
    /// fills the error family's extra label (Azure's `code`) when it has one.
    pub fn call_finished(&self, labels: &[&str], elapsed: Duration, error: Option<&str>) {
        self.finished(&self.desc.call, labels, elapsed, error);
    }

    /// Records one finished reconcile or service operation through `families`
    /// ([`OPENSTACK_RECONCILE`], [`AZURE_OPERATION`]).
    pub fn reconcile_finished(
        &self,
        families: &CallFamilies,
        labels: &[&str],
        elapsed: Duration,
        error: Option<&str>,
    ) {
        self.finished(families, labels, elapsed, error);
    }

    fn finished(
        &self,
        families: &CallFamilies,
        labels: &[&str],
        elapsed: Duration,
        error: Option<&str>,
    ) {
        if error.is_none() || families.duration_on_error {
            self.observe(families.duration, labels, elapsed.as_secs_f64());
        }
        if let Some(total) = families.total {
            self.inc(total, labels);
        }
        if let Some(code) = error {
            let extra = self.family(families.errors).map(|(_, f)| f.labels.len() > labels.len());
            if extra == Some(true) {
                let mut with_code = labels.to_vec();
                with_code.push(code);
                self.inc(families.errors, &with_code);
            } else {
                self.inc(families.errors, labels);
            }
        }
    }

    /// The value of counter `name` with `labels`, or the sample count of histogram `name`
    /// (0 when there is no such series).
    pub fn value(&self, name: &str, labels: &[&str]) -> u64 {
        let Some((i, _)) = self.family(name) else { return 0 };
        let key: Vec<String> = labels.iter().map(|l| l.to_string()).collect();
        match lock(&self.samples[i]).get(&key) {
            Some(Series::Counter(v)) => *v,
            Some(Series::Histogram { count, .. }) => *count,
            None => 0,
        }
    }

    fn encode(&self, encoder: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        for (family, samples) in self.desc.families.iter().zip(&self.samples) {
            if family.external {
                continue;
            }
            let samples = lock(samples);
            let label_set = |values: &Vec<String>| -> Vec<(String, String)> {
                family.labels.iter().map(|l| l.to_string()).zip(values.iter().cloned()).collect()
            };
            match (family.kind, family.name.strip_suffix("_total")) {
                (Kind::Histogram, _) => {
                    let mut m = encoder.encode_descriptor(
                        family.name,
                        family.help,
                        None,
                        MetricType::Histogram,
                    )?;
                    for (values, series) in samples.iter() {
                        if let Series::Histogram { hist, .. } = series {
                            hist.encode(m.encode_family(&label_set(values))?)?;
                        }
                    }
                }
                (Kind::Counter, Some(base)) => {
                    let mut m =
                        encoder.encode_descriptor(base, family.help, None, MetricType::Counter)?;
                    for (values, series) in samples.iter() {
                        if let Series::Counter(v) = series {
                            ConstCounter::new(*v).encode(m.encode_family(&label_set(values))?)?;
                        }
                    }
                }
                (Kind::Counter, None) => {
                    let mut m = encoder.encode_descriptor(
                        family.name,
                        family.help,
                        None,
                        MetricType::Unknown,
                    )?;
                    for (values, series) in samples.iter() {
                        if let Series::Counter(v) = series {
                            ConstGauge::new(*v).encode(m.encode_family(&label_set(values))?)?;
                        }
                    }
                }
            }
        }
        Ok(())
    }
}

/// Serves the families of every cloud whose [`ApiMetrics`] exists in this process (a
/// manager runs one cloud: its families, with or without samples).
#[derive(Debug, Default)]
pub struct ApiMetricsCollector;

impl Collector for ApiMetricsCollector {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let active: Vec<Arc<ApiMetrics>> = lock(&ACTIVE).clone();
        for m in active {
            m.encode(&mut encoder)?;
        }
        Ok(())
    }
}

/// The collector to register once in the manager's registry.
pub fn collector() -> Box<dyn Collector> {
    Box::new(ApiMetricsCollector)
}

/// `<resource>_<verb>` from an operation name in upper camel case or with separators:
/// `DescribeLoadBalancers` → `describe_load_balancers`, `nova:GetServer` → `get_server`.
pub fn snake_case(operation: &str) -> String {
    let op = operation.rsplit(':').next().unwrap_or(operation);
    let mut out = String::with_capacity(op.len() + 4);
    let mut prev_lower = false;
    for c in op.chars() {
        if c.is_ascii_uppercase() {
            if prev_lower {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
            prev_lower = false;
        } else if c == '-' || c == ' ' || c == '.' || c == '/' {
            if !out.ends_with('_') && !out.is_empty() {
                out.push('_');
            }
            prev_lower = false;
        } else {
            out.push(c);
            prev_lower = c.is_ascii_lowercase() || c.is_ascii_digit();
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(m: &ApiMetrics) -> String {
        let mut reg = prometheus_client::registry::Registry::default();
        struct One(Arc<ApiMetrics>);
        impl std::fmt::Debug for One {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("One")
            }
        }
        impl Collector for One {
            fn encode(&self, mut e: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
                self.0.encode(&mut e)
            }
        }
        reg.register_collector(Box::new(One(ApiMetrics::of(m.desc))));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &reg).unwrap_or_default();
        out
    }

    #[test]
    fn families_are_served_under_upstreams_exact_names() {
        let m = ApiMetrics::of(&GCE);
        m.call_finished(&["instances_get", "<n/a>", "z1", "v1"], Duration::from_millis(3), None);
        m.call_finished(
            &["instances_get", "<n/a>", "z1", "v1"],
            Duration::from_millis(40),
            Some("notFound"),
        );
        let t = text(&m);
        assert!(t.contains("# TYPE cloudprovider_gce_api_request_duration_seconds histogram"));
        assert!(t.contains(
            "cloudprovider_gce_api_request_duration_seconds_count{request=\"instances_get\",region=\"<n/a>\",zone=\"z1\",version=\"v1\"} 2"
        ), "{t}");
        // No `_total`: upstream's name, typed unknown.
        assert!(t.contains("# TYPE cloudprovider_gce_api_request_errors unknown"), "{t}");
        assert!(t.contains(
            "\ncloudprovider_gce_api_request_errors{request=\"instances_get\",region=\"<n/a>\",zone=\"z1\",version=\"v1\"} 1\n"
        ), "{t}");
    }

    #[test]
    fn upstream_conventions_per_cloud() {
        // AWS: latency of successes only; errors by request.
        let aws = ApiMetrics::of(&AWS);
        aws.call_finished(&["conv_test"], Duration::from_millis(1), None);
        aws.call_finished(&["conv_test"], Duration::from_millis(1), Some("Boom"));
        assert_eq!(aws.value("cloudprovider_aws_api_request_duration_seconds", &["conv_test"]), 1);
        assert_eq!(aws.value("cloudprovider_aws_api_request_errors", &["conv_test"]), 1);
        // OpenStack: every call counted, `_total` names served as counters.
        let os = ApiMetrics::of(&OPENSTACK);
        os.call_finished(&["conv_test"], Duration::from_millis(1), Some("x"));
        assert_eq!(os.value("openstack_api_requests_total", &["conv_test"]), 1);
        assert_eq!(os.value("openstack_api_request_errors_total", &["conv_test"]), 1);
        assert_eq!(os.value("openstack_api_request_duration_seconds", &["conv_test"]), 1);
        let t = text(&os);
        assert!(t.contains("# TYPE openstack_api_requests counter"), "{t}");
        assert!(t.contains("openstack_api_requests_total{request=\"conv_test\"} 1"), "{t}");
        // Azure: the error code fills `code`.
        let az = ApiMetrics::of(&AZURE);
        az.call_finished(&["vm_get", "rg", "sub", ""], Duration::from_millis(1), Some("429"));
        assert_eq!(
            az.value("cloudprovider_azure_api_request_errors", &["vm_get", "rg", "sub", "", "429"]),
            1
        );
        // A wrong label count is dropped, not a panic.
        az.inc("cloudprovider_azure_api_request_errors", &["only-one"]);
        az.inc("no_such_family", &[]);
    }

    #[test]
    fn empty_families_are_still_described() {
        let t = text(&ApiMetrics::of(&OPENSTACK));
        assert!(t.contains("# TYPE cloudprovider_openstack_reconcile_duration_seconds histogram"));
        assert!(t.contains("# HELP cloudprovider_openstack_reconcile_errors [ALPHA]"), "{t}");
    }

    #[test]
    fn operation_names_become_snake_case() {
        assert_eq!(snake_case("DescribeLoadBalancers"), "describe_load_balancers");
        assert_eq!(snake_case("nova:GetServer"), "get_server");
        assert_eq!(snake_case("CreateTags"), "create_tags");
        assert_eq!(snake_case("describe_instance"), "describe_instance");
    }
}
