//! The `workqueue_*` metrics of every controller queue, with client-go's names, labels and
//! buckets, so dashboards and alerts written for the Go cloud-controller-manager work
//! unchanged (issue #13 point 7). One [`WorkqueueMetrics`] per registry holds the families;
//! each queue records through its own [`QueueMetrics`] handle, labelled `name=<queue>`.
//!
//! Exposed (all labelled `name`):
//!
//! | series | type | recorded when |
//! |---|---|---|
//! | `workqueue_adds_total` | counter | a key is added that was not already waiting |
//! | `workqueue_depth` | gauge | +1 on such an add, −1 when a worker takes the key |
//! | `workqueue_queue_duration_seconds` | histogram | a worker takes a key: time since its add |
//! | `workqueue_work_duration_seconds` | histogram | a worker is done with a key: time since it took it |
//! | `workqueue_retries_total` | counter | every delayed (re-)add, rate-limited or not |
//! | `workqueue_unfinished_work_seconds` | gauge | at scrape: summed age of the keys being processed |
//! | `workqueue_longest_running_processor_seconds` | gauge | at scrape: age of the oldest key being processed |
//!
//! Queues (upstream's names): `service` and `node` (service controller: Services, node-sync
//! trigger), `cloudCIDRAllocator` (node IPAM, `CloudAllocator`), `Nodes` (cloud-node
//! controller; kube-runtime schedules its reconciles, so only adds, work duration, retries
//! and the in-progress gauges are recorded for it: see [`QueueMetrics::dispatched`]). The
//! lifecycle and route controllers run periodic passes without a queue, as upstream by
//! default (upstream's `Routes` queue exists only behind an alpha feature gate).
//!
//! Histogram buckets are client-go's: 1e-8 s multiplied by 10 up to 10 s. Client-go refreshes
//! the two in-progress gauges every 500 ms; here they are computed when scraped.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Instant;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// The label set of every series: `name=<queue name>`.
type QueueLabel = [(&'static str, String); 1];

/// client-go's workqueue latency buckets: 1e-8 s, ×10, ten buckets (up to 10 s).
fn duration_histogram() -> Histogram {
    Histogram::new(exponential_buckets(1e-8, 10.0, 10))
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// When each waiting key was added and each key in process was taken, for one queue.
#[derive(Debug, Default)]
struct Times {
    added: HashMap<String, Instant>,
    started: HashMap<String, Instant>,
}

/// The in-progress times of every queue, read at scrape time.
#[derive(Debug, Default)]
struct InFlight {
    queues: Mutex<BTreeMap<String, Arc<Mutex<Times>>>>,
}

/// The in-progress figures of one queue at one moment.
struct Busy {
    queue: String,
    /// Summed seconds of the keys being processed.
    unfinished: f64,
    /// Seconds of the oldest key being processed.
    longest: f64,
}

impl InFlight {
    /// The in-progress figures of every queue, now.
    fn snapshot(&self) -> Vec<Busy> {
        let now = Instant::now();
        lock(&self.queues)
            .iter()
            .map(|(name, times)| {
                let times = lock(times);
                let ages = times.started.values().map(|t| now.saturating_duration_since(*t));
                let (unfinished, longest) = ages.fold((0.0, 0.0f64), |(sum, max), age| {
                    let s = age.as_secs_f64();
                    (sum + s, max.max(s))
                });
                Busy { queue: name.clone(), unfinished, longest }
            })
            .collect()
    }
}

/// Encodes one gauge family with one series per queue.
fn encode_gauge(
    encoder: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    values: impl Iterator<Item = (String, f64)>,
) -> Result<(), std::fmt::Error> {
    let mut metric = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (queue, value) in values {
        let labels: QueueLabel = [("name", queue)];
        ConstGauge::new(value).encode(metric.encode_family(&labels)?)?;
    }
    Ok(())
}

impl prometheus_client::collector::Collector for InFlight {
    fn encode(&self, mut encoder: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let busy = self.snapshot();
        encode_gauge(
            &mut encoder,
            "workqueue_unfinished_work_seconds",
            "Seconds of work in progress that work_duration has not observed yet; a steady rise means stuck workers.",
            busy.iter().map(|b| (b.queue.clone(), b.unfinished)),
        )?;
        encode_gauge(
            &mut encoder,
            "workqueue_longest_running_processor_seconds",
            "Seconds the longest running worker of the queue has been processing its key.",
            busy.iter().map(|b| (b.queue.clone(), b.longest)),
        )
    }
}

/// The `workqueue_*` families of one registry. Cheap to clone.
#[derive(Debug, Clone)]
pub(crate) struct WorkqueueMetrics {
    adds: Family<QueueLabel, Counter>,
    depth: Family<QueueLabel, Gauge>,
    queue_duration: Family<QueueLabel, Histogram, fn() -> Histogram>,
    work_duration: Family<QueueLabel, Histogram, fn() -> Histogram>,
    retries: Family<QueueLabel, Counter>,
    in_flight: Arc<InFlight>,
}

/// The registries the families are already registered in: every controller of a process
/// shares one registry, and a family must be registered there exactly once (twice would
/// expose duplicate metric families, which scrapers reject).
static REGISTERED: Mutex<Vec<(Weak<Mutex<Registry>>, WorkqueueMetrics)>> = Mutex::new(Vec::new());

impl WorkqueueMetrics {
    fn new() -> Self {
        WorkqueueMetrics {
            adds: Family::default(),
            depth: Family::default(),
            queue_duration: Family::new_with_constructor(duration_histogram),
            work_duration: Family::new_with_constructor(duration_histogram),
            retries: Family::default(),
            in_flight: Arc::default(),
        }
    }

    /// The families of `registry`, registering them on first use.
    pub(crate) fn of(registry: &Arc<Mutex<Registry>>) -> Self {
        let mut known = lock(&REGISTERED);
        known.retain(|(r, _)| r.strong_count() > 0);
        if let Some((_, m)) = known.iter().find(|(r, _)| r.as_ptr() == Arc::as_ptr(registry)) {
            return m.clone();
        }
        let m = WorkqueueMetrics::new();
        m.register(&mut lock(registry));
        known.push((Arc::downgrade(registry), m.clone()));
        m
    }

    fn register(&self, reg: &mut Registry) {
        // Counters without `_total`: the encoder appends it.
        reg.register(
            "workqueue_adds",
            "Total number of adds handled by the workqueue.",
            self.adds.clone(),
        );
        reg.register("workqueue_depth", "Current depth of the workqueue.", self.depth.clone());
        reg.register(
            "workqueue_queue_duration_seconds",
            "Seconds a key waits in the workqueue before a worker takes it.",
            self.queue_duration.clone(),
        );
        reg.register(
            "workqueue_work_duration_seconds",
            "Seconds a worker spends processing a key taken from the workqueue.",
            self.work_duration.clone(),
        );
        reg.register(
            "workqueue_retries",
            "Total number of retries (delayed re-adds) handled by the workqueue.",
            self.retries.clone(),
        );
        reg.register_collector(Box::new(self.in_flight.clone()));
    }

    /// The handle of the queue called `name`. A new queue of that name (a restarted
    /// controller) starts from depth 0 and nothing in flight.
    pub(crate) fn queue(&self, name: &str) -> QueueMetrics {
        let label: QueueLabel = [("name", name.to_string())];
        let times = Arc::new(Mutex::new(Times::default()));
        lock(&self.in_flight.queues).insert(name.to_string(), times.clone());
        let depth = self.depth.get_or_create(&label).clone();
        depth.set(0);
        QueueMetrics {
            adds: self.adds.get_or_create(&label).clone(),
            depth,
            queue_duration: self.queue_duration.get_or_create(&label).clone(),
            work_duration: self.work_duration.get_or_create(&label).clone(),
            retries: self.retries.get_or_create(&label).clone(),
            times,
        }
    }
}

/// What one queue records. The queue calls these at client-go's points; see the module docs.
#[derive(Debug, Clone)]
pub(crate) struct QueueMetrics {
    adds: Counter,
    depth: Gauge,
    queue_duration: Histogram,
    work_duration: Histogram,
    retries: Counter,
    times: Arc<Mutex<Times>>,
}

impl QueueMetrics {
    /// A handle registered nowhere (for queues whose metrics nobody reads: unit tests).
    #[cfg(test)]
    pub(crate) fn unregistered(name: &str) -> Self {
        WorkqueueMetrics::new().queue(name)
    }

    /// `key` was added and was not already waiting.
    pub(crate) fn added(&self, key: &str) {
        self.adds.inc();
        self.depth.inc();
        lock(&self.times).added.entry(key.to_string()).or_insert_with(Instant::now);
    }

    /// A worker took `key`.
    pub(crate) fn taken(&self, key: &str) {
        self.depth.dec();
        let now = Instant::now();
        let mut times = lock(&self.times);
        if let Some(at) = times.added.remove(key) {
            self.queue_duration.observe(now.saturating_duration_since(at).as_secs_f64());
        }
        times.started.insert(key.to_string(), now);
    }

    /// A worker took `key` from a queue this process cannot see into (kube-runtime's
    /// scheduler, used by the cloud-node controller): counts the add and starts the work
    /// clock; depth and queue duration are not known there and stay unrecorded.
    pub(crate) fn dispatched(&self, key: &str) {
        self.adds.inc();
        lock(&self.times).started.insert(key.to_string(), Instant::now());
    }

    /// A worker is done with `key`.
    pub(crate) fn done(&self, key: &str) {
        if let Some(at) = lock(&self.times).started.remove(key) {
            self.work_duration.observe(at.elapsed().as_secs_f64());
        }
    }

    /// A delayed (re-)add was requested.
    pub(crate) fn retried(&self) {
        self.retries.inc();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn encode(registry: &Arc<Mutex<Registry>>) -> String {
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &lock(registry)).unwrap();
        out
    }

    /// The value of the exposed sample `series` (full name and labels), if present.
    fn sample(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    #[test]
    fn exposes_client_go_names_labels_and_values() {
        let registry = Arc::new(Mutex::new(Registry::default()));
        let q = WorkqueueMetrics::of(&registry).queue("service");
        q.added("ns/a");
        q.added("ns/b");
        q.retried();
        q.taken("ns/a");
        let text = encode(&registry);
        assert_eq!(sample(&text, r#"workqueue_adds_total{name="service"}"#), Some(2.0), "{text}");
        assert_eq!(sample(&text, r#"workqueue_depth{name="service"}"#), Some(1.0));
        assert_eq!(sample(&text, r#"workqueue_retries_total{name="service"}"#), Some(1.0));
        assert_eq!(
            sample(&text, r#"workqueue_queue_duration_seconds_count{name="service"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"workqueue_work_duration_seconds_count{name="service"}"#),
            Some(0.0)
        );
        let busy = sample(&text, r#"workqueue_longest_running_processor_seconds{name="service"}"#);
        assert!(busy.is_some_and(|s| s >= 0.0), "{text}");
        assert!(sample(&text, r#"workqueue_unfinished_work_seconds{name="service"}"#).is_some());
        assert!(text.contains("# TYPE workqueue_adds counter"), "{text}");
        assert!(text.contains("# TYPE workqueue_depth gauge"));
        assert!(text.contains("# TYPE workqueue_work_duration_seconds histogram"));
        assert!(text.contains("# TYPE workqueue_longest_running_processor_seconds gauge"));
        // client-go's buckets: 1e-8 .. 10 s.
        assert!(
            text.contains(r#"workqueue_queue_duration_seconds_bucket{le="1e-8",name="service"}"#)
                || text.contains(
                    r#"workqueue_queue_duration_seconds_bucket{name="service",le="1e-8"}"#
                ),
            "{text}"
        );

        q.done("ns/a");
        let text = encode(&registry);
        assert_eq!(
            sample(&text, r#"workqueue_work_duration_seconds_count{name="service"}"#),
            Some(1.0)
        );
        assert_eq!(
            sample(&text, r#"workqueue_unfinished_work_seconds{name="service"}"#),
            Some(0.0)
        );
        assert_eq!(
            sample(&text, r#"workqueue_longest_running_processor_seconds{name="service"}"#),
            Some(0.0)
        );
    }

    #[test]
    fn one_registration_per_registry_and_separate_series_per_queue() {
        let registry = Arc::new(Mutex::new(Registry::default()));
        let a = WorkqueueMetrics::of(&registry).queue("service");
        let b = WorkqueueMetrics::of(&registry).queue("node");
        a.added("k");
        b.added("k");
        b.added("j");
        let text = encode(&registry);
        assert_eq!(text.matches("# TYPE workqueue_adds counter").count(), 1, "{text}");
        assert_eq!(text.matches("# TYPE workqueue_unfinished_work_seconds gauge").count(), 1);
        assert_eq!(sample(&text, r#"workqueue_adds_total{name="service"}"#), Some(1.0));
        assert_eq!(sample(&text, r#"workqueue_adds_total{name="node"}"#), Some(2.0));

        // A restarted controller's new queue of the same name starts empty.
        let a2 = WorkqueueMetrics::of(&registry).queue("service");
        a2.added("x");
        let text = encode(&registry);
        assert_eq!(sample(&text, r#"workqueue_depth{name="service"}"#), Some(1.0), "{text}");
        assert_eq!(sample(&text, r#"workqueue_adds_total{name="service"}"#), Some(2.0));
    }
}
