//! The cloud-node controller: stamps new Nodes with what the cloud knows, then lifts the
//! `node.cloudprovider.kubernetes.io/uninitialized` taint.
//!
//! ```text
//!  Node watch ──▶ reconcile(node) ── tainted? ──no──▶ fill GA labels from beta twins
//!                        │yes
//!                        ▼
//!          Coalescer ──▶ InstancesV2::instance_metadata_batch (one cloud call, many nodes)
//!                        ▼
//!   write queue (one entry per Node, its metadata) ──▶ --concurrent-node-syncs writers:
//!   PATCH nodes/status addresses
//!                        ▼
//!   PUT Node (from the informer's latest copy): providerID (if empty),
//!             instance-type/zone/region labels (GA + beta), additional labels, taint removed
//!                        ▼
//!                   event Synced
//!
//!  every --node-status-update-frequency: addresses of initialised nodes, in batches
//! ```
//!
//! Scale: cloud lookups of all pending nodes are coalesced into batch calls; a looked-up Node
//! goes into the write queue ([`WriteQueue`]), which `--concurrent-node-syncs` writers
//! (upstream's worker count) drain, so 1000 joining nodes cost a handful of cloud calls
//! instead of 1000, and a Node waiting for its write is neither looked up again nor held as
//! a running reconcile (kube-runtime polls every running reconcile on each wake-up: with
//! thousands waiting for a write slot that was quadratic CPU, issue #15). A node whose
//! instance is not found yet, or whose write fails, stays tainted and is retried with
//! per-node exponential backoff; this controller never deletes Nodes.
//!
//! Every cloud call has a deadline (`ControllerConfig::instance_call_timeout`, default 60 s):
//! a lookup that times out fails the nodes it was for, which are retried with their backoff
//! (initialisation) or at the next refresh (addresses). The backoff entry of a Node is
//! dropped when the Node is initialised or deleted, so deleted Nodes leave nothing behind.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::controllers::events::EventRecorder;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::controller::{Action, Config as ControllerRuntimeConfig, Controller};
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::reflector::{ObjectRef, Store};
use kube::{Api, Resource, ResourceExt};
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

use super::backoff::FailureBackoff;
use super::node_util::{self, has_taint};
use super::probe::Probe;
use super::workqueue_metrics::{QueueMetrics, WorkqueueMetrics};
use super::{ControllerContext, StartError, Started};
use crate::batch::Coalescer;
use crate::cloud::{InstanceMetadata, InstancesV2, ProviderError};
use crate::cloud_call::Deadline;
use crate::names::{self, controllers as cnames, reasons};

/// How long concurrent lookups are gathered before one batch call.
const LOOKUP_WINDOW: Duration = Duration::from_millis(100);

/// How many batch lookups run at once. Thousands of Nodes asking at once must not become
/// dozens of concurrent list calls (a provider splits a batch further to its API limits):
/// the cloud answers them all more slowly, and past the SDK's attempt timeout every one of
/// them fails and is retried (measured on moto at 5000 Nodes, issue #15).
const LOOKUP_PARALLEL_BATCHES: usize = 2;
/// How many reconciles run at once: no limit. A reconcile only claims the Node and starts its
/// lookup as a task of its own (coalesced into batch calls), so it ends at once; every Node
/// that needs a lookup asks within the same window. (With reconciles waiting for lookups or
/// writes, a limit made Nodes beyond it trickle in one by one, a cloud call each, and no
/// limit made kube-runtime poll thousands of waiting reconciles on every wake-up, issue #15.)
const RECONCILE_CONCURRENCY: u16 = 0;
/// Per-node retry delays when initialisation fails (upstream: 5 ms doubling to 1000 s).
const RETRY_BASE: Duration = Duration::from_millis(5);
const RETRY_MAX: Duration = Duration::from_secs(1000);
/// Retry delay after a write conflict (the watch cache catches up in moments).
const CONFLICT_RETRY: Duration = Duration::from_millis(100);

/// Why a node could not be initialised (the node keeps its taint and is retried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cloud lookup failed.
    #[error("failed to get instance metadata for node {node}: {source}")]
    Metadata {
        /// The node.
        node: String,
        /// The provider's error.
        source: ProviderError,
    },
    /// The lookup batching task stopped.
    #[error("failed to get instance metadata for node {node}: {source}")]
    Lookup {
        /// The node.
        node: String,
        /// Why.
        source: crate::batch::Closed,
    },
    /// The provider returned no providerID and the node has none.
    #[error("cloud provider does not set node provider ID for node {0}")]
    NoProviderId(String),
    /// The provided-node-ip annotation matches no cloud address.
    #[error("provided node ip for node {node:?} is not valid: {message}")]
    ProvidedNodeIp {
        /// The node.
        node: String,
        /// Why.
        message: String,
    },
    /// A Kubernetes API call failed.
    #[error("updating node {node}: {source}")]
    Kube {
        /// The node.
        node: String,
        /// The API error.
        source: kube::Error,
    },
}

/// Metrics with upstream's names (histograms, seconds; buckets 1, 4, 16, 64, 256, 1024).
#[derive(Clone)]
struct Metrics {
    taint_removal_delay: Histogram,
    initial_sync_delay: Histogram,
}

impl Metrics {
    fn register(ctx: &ControllerContext) -> Self {
        let m = Metrics {
            taint_removal_delay: Histogram::new(exponential_buckets(1.0, 4.0, 6)),
            initial_sync_delay: Histogram::new(exponential_buckets(1.0, 4.0, 6)),
        };
        let mut reg = ctx.metrics.lock().unwrap_or_else(|p| p.into_inner());
        reg.register(
            "node_controller_cloud_provider_taint_removal_delay_seconds",
            "Seconds from node creation until the cloud-provider taint was removed",
            m.taint_removal_delay.clone(),
        );
        reg.register(
            "node_controller_initial_node_sync_delay_seconds",
            "Seconds from node creation until its first successful sync",
            m.initial_sync_delay.clone(),
        );
        m
    }
}

/// Nodes looked up and waiting for their writes, in arrival order; one entry per Node (a
/// newer lookup replaces the metadata of a queued one). A Node stays "pending" from its push
/// until its writer is done with it.
#[derive(Default)]
struct WriteQueue {
    state: std::sync::Mutex<WriteState>,
    ready: tokio::sync::Notify,
}

#[derive(Default)]
struct WriteState {
    looking_up: std::collections::HashSet<String>,
    order: std::collections::VecDeque<String>,
    queued: HashMap<String, InstanceMetadata>,
    writing: std::collections::HashSet<String>,
}

impl WriteQueue {
    fn lock(&self) -> std::sync::MutexGuard<'_, WriteState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Being looked up, queued or being written.
    #[cfg(test)]
    fn pending(&self, name: &str) -> bool {
        let s = self.lock();
        s.looking_up.contains(name) || s.queued.contains_key(name) || s.writing.contains(name)
    }

    /// Marks the Node as being looked up; `false` if it is pending already.
    fn claim(&self, name: &str) -> bool {
        let mut s = self.lock();
        if s.queued.contains_key(name) || s.writing.contains(name) {
            return false;
        }
        s.looking_up.insert(name.to_string())
    }

    /// Its lookup failed: no longer pending.
    fn release(&self, name: &str) {
        self.lock().looking_up.remove(name);
    }

    /// Its lookup answered: queued for its write.
    fn push(&self, name: String, meta: InstanceMetadata) {
        let mut s = self.lock();
        s.looking_up.remove(&name);
        if s.queued.insert(name.clone(), meta).is_none() {
            s.order.push_back(name);
            drop(s);
            self.ready.notify_one();
        }
    }

    /// The next Node to write (waits for one), now "being written".
    async fn pop(&self) -> (String, InstanceMetadata) {
        loop {
            let notified = self.ready.notified();
            {
                let mut s = self.lock();
                while let Some(name) = s.order.pop_front() {
                    if let Some(meta) = s.queued.remove(&name) {
                        s.writing.insert(name.clone());
                        if !s.order.is_empty() {
                            // Wake another writer for the rest.
                            self.ready.notify_one();
                        }
                        return (name, meta);
                    }
                }
            }
            notified.await;
        }
    }

    fn done(&self, name: &str) {
        self.lock().writing.remove(name);
    }
}

struct Ctx {
    nodes: Api<Node>,
    /// Nodes waiting for a batch are the informer's shared copies; a batch copies its own
    /// Nodes only when its turn comes (thousands wait at once when a cluster scales up).
    lookup: Coalescer<Arc<Node>, Result<InstanceMetadata, ProviderError>>,
    writes: WriteQueue,
    /// Reconciles to run again (a failed or conflicting write), after their delay.
    retry: tokio::sync::mpsc::UnboundedSender<ObjectRef<Node>>,
    backoff: FailureBackoff<String>,
    recorder: EventRecorder,
    metrics: Metrics,
    /// `workqueue_*` metrics of upstream's `Nodes` queue (kube-runtime's scheduler here).
    queue: QueueMetrics,
    deadline: Deadline,
}

/// Upstream's name of the cloud-node controller's queue (the `name` label of `workqueue_*`).
const QUEUE_NAME: &str = "Nodes";

/// One reconcile in progress, for the `workqueue_*` metrics; done when dropped (on every
/// return path, and when the reconcile is cancelled).
struct InProgress<'a> {
    queue: &'a QueueMetrics,
    key: String,
}

impl<'a> InProgress<'a> {
    fn start(queue: &'a QueueMetrics, key: &str) -> Self {
        queue.dispatched(key);
        InProgress { queue, key: key.to_string() }
    }
}

impl Drop for InProgress<'_> {
    fn drop(&mut self) {
        self.queue.done(&self.key);
    }
}

/// Tunables of the cloud-node controller. [`start`] uses the defaults.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// Where to publish debug gauges: `backoff_nodes` (Nodes with a retry backoff). For
    /// tests.
    pub probe: Option<Probe>,
}

/// Probe gauge: the names of the Nodes the controller keeps a retry backoff for.
pub const PROBE_BACKOFF_NODES: &str = "backoff_nodes";

/// Starts the cloud-node controller; skipped when the cloud has no InstancesV2.
pub fn start(ctx: &ControllerContext) -> Result<Started, StartError> {
    start_with(ctx, NodeOptions::default())
}

/// Starts the cloud-node controller with explicit tunables.
pub fn start_with(ctx: &ControllerContext, opts: NodeOptions) -> Result<Started, StartError> {
    let Some(instances) = ctx.cloud.instances_v2() else {
        return Ok(Started::Skipped("cloud provider does not support instances".into()));
    };
    let metrics = Metrics::register(ctx);
    let ctx = ctx.clone();
    Ok(Started::Running(Box::pin(run(ctx, instances, metrics, opts))))
}

/// `instance_metadata_batch` under the deadline: on timeout every node gets the error.
async fn metadata_batch(
    instances: &dyn InstancesV2,
    deadline: Deadline,
    nodes: &[Node],
) -> Vec<Result<InstanceMetadata, ProviderError>> {
    match deadline.run("InstanceMetadata", instances.instance_metadata_batch(nodes)).await {
        Ok(results) => results,
        Err(e) => nodes.iter().map(|_| Err(ProviderError::from(e.clone()))).collect(),
    }
}

fn lookup_coalescer(
    instances: Arc<dyn InstancesV2>,
    deadline: Deadline,
) -> Coalescer<Arc<Node>, Result<InstanceMetadata, ProviderError>> {
    let parallel = Arc::new(tokio::sync::Semaphore::new(LOOKUP_PARALLEL_BATCHES));
    Coalescer::new(LOOKUP_WINDOW, instances.max_batch().max(1), move |nodes: Vec<Arc<Node>>| {
        let instances = Arc::clone(&instances);
        let parallel = Arc::clone(&parallel);
        async move {
            // The deadline starts when the batch's turn comes.
            let _turn = parallel.acquire().await;
            let nodes: Vec<Node> = nodes.iter().map(|n| Node::clone(n)).collect();
            metadata_batch(instances.as_ref(), deadline, &nodes).await
        }
    })
}

async fn run(
    ctx: ControllerContext,
    instances: Arc<dyn InstancesV2>,
    metrics: Metrics,
    opts: NodeOptions,
) {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    let deadline = Deadline::new(ctx.config.instance_call_timeout);
    let reporter =
        Reporter { controller: cnames::COMPONENT_CLOUD_NODE.into(), instance: Some(hostname()) };
    let (retry, retries) = tokio::sync::mpsc::unbounded_channel();
    let state = Arc::new(Ctx {
        nodes: nodes.clone(),
        lookup: lookup_coalescer(Arc::clone(&instances), deadline),
        writes: WriteQueue::default(),
        retry,
        backoff: FailureBackoff::new(RETRY_BASE, RETRY_MAX),
        recorder: EventRecorder::new(ctx.events_client(), reporter),
        metrics,
        queue: WorkqueueMetrics::of(&ctx.metrics).queue(QUEUE_NAME),
        deadline,
    });
    if let Some(probe) = &opts.probe {
        let state = Arc::clone(&state);
        probe.register_keys(PROBE_BACKOFF_NODES, move || state.backoff.keys());
    }
    // The shared Node informer: its cache is the controller's store, its changes the
    // triggers (one watch for every controller).
    let informer = super::informer::nodes_for(&ctx, None);
    let Some(store) = informer.synced_reader(&ctx.shutdown).await else { return };
    let retries =
        futures::stream::unfold(
            retries,
            |mut rx| async move { rx.recv().await.map(|obj| (obj, rx)) },
        );
    let controller = Controller::for_shared_stream(informer.subscribe().applied(), store.clone())
        .reconcile_on(retries)
        .with_config(ControllerRuntimeConfig::default().concurrency(RECONCILE_CONCURRENCY));
    let writers = futures::future::join_all(
        (0..ctx.config.concurrent_node_syncs.max(1))
            .map(|_| write_loop(store.clone(), Arc::clone(&state))),
    );
    let shutdown = ctx.shutdown.clone();
    let refresh = refresh_addresses_loop(
        store,
        instances,
        Arc::clone(&state),
        ctx.config.node_status_update_frequency,
        ctx.config.concurrent_node_status_updates.max(ctx.config.concurrent_node_syncs).max(1),
    );
    let main = controller
        .graceful_shutdown_on(shutdown.clone().cancelled_owned())
        .run(reconcile, error_policy, Arc::clone(&state))
        .for_each(|res| {
            match res {
                // A retry came due for a Node that is gone (deletions trigger no reconcile,
                // but a failing Node always has a retry scheduled): forget its backoff.
                Err(kube::runtime::controller::Error::ObjectNotFound(obj)) => {
                    state.backoff.succeeded(&obj.name);
                }
                Err(e) => tracing::debug!(error = %e, "cloud-node controller"),
                Ok(_) => {}
            }
            std::future::ready(())
        });
    tokio::select! {
        _ = main => {}
        _ = refresh => {}
        _ = writers => {}
        _ = shutdown.cancelled() => {}
    }
    tracing::info!("cloud-node controller stopped");
}

fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_else(|_| "cloud-controller-manager".into())
}

fn error_policy(node: Arc<Node>, err: &Error, ctx: Arc<Ctx>) -> Action {
    let name = node.name_any();
    let delay = ctx.backoff.failed(&name);
    ctx.queue.retried();
    tracing::warn!(node = %name, error = %err, retry_in = ?delay, "error syncing node, requeuing");
    Action::requeue(delay)
}

async fn reconcile(node: Arc<Node>, ctx: Arc<Ctx>) -> Result<Action, Error> {
    let name = node.name_any();
    let _in_progress = InProgress::start(&ctx.queue, &name);
    if node.meta().deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if !has_taint(&node, names::TAINT_UNINITIALIZED) {
        reconcile_labels(&node, &ctx).await?;
        ctx.backoff.succeeded(&name);
        return Ok(Action::await_change());
    }
    if !ctx.writes.claim(&name) {
        // Being looked up, or looked up and waiting for its write (which reads the latest
        // copy): never looked up again meanwhile.
        return Ok(Action::await_change());
    }
    tracing::info!(node = %name, "initializing node with cloud provider");
    // The lookup runs as a task of its own, so this reconcile ends at once: kube-runtime
    // polls every running reconcile on each wake-up, and thousands waiting for a batch
    // answer made that quadratic (issue #15). The task queues the Node's write, or schedules
    // a retry with the Node's backoff.
    let task_ctx = Arc::clone(&ctx);
    tokio::spawn(async move {
        match look_up(node, &task_ctx).await {
            Ok(meta) => task_ctx.writes.push(name, meta),
            Err(e) => {
                task_ctx.writes.release(&name);
                let delay = task_ctx.failed(&name, &e);
                task_ctx.retry_after(name, delay);
            }
        }
    });
    Ok(Action::await_change())
}

/// The cloud's answer for a tainted Node, checked: a providerID to write (or one already
/// set), and the provided-node-ip annotation naming one of the instance's addresses.
async fn look_up(node: Arc<Node>, ctx: &Ctx) -> Result<InstanceMetadata, Error> {
    let name = node.name_any();
    let meta = ctx
        .lookup
        .call(Arc::clone(&node))
        .await
        .map_err(|source| Error::Lookup { node: name.clone(), source })?
        .map_err(|source| Error::Metadata { node: name.clone(), source })?;
    if meta.provider_id.is_empty() && node_util::provider_id(&node).is_empty() {
        return Err(Error::NoProviderId(name));
    }
    let provided_ip = node.annotations().get(names::ANNOTATION_PROVIDED_NODE_IP);
    if let Some(Err(message)) =
        provided_ip.map(|ann| node_util::addresses_for_provided_ip(ann, &meta.node_addresses))
    {
        let err = Error::ProvidedNodeIp { node: name, message };
        let note = err.to_string();
        // Boxed: a rare path, and its request future would otherwise make every waiting
        // lookup task kilobytes larger.
        Box::pin(publish(ctx, &node, EventType::Warning, reasons::PROVIDED_NODE_IP_INVALID, note))
            .await;
        return Err(err);
    }
    Ok(meta)
}

impl Ctx {
    /// Records a failure of the Node (logged as upstream's "error syncing node, requeuing")
    /// and returns its backoff delay.
    fn failed(&self, name: &str, err: &Error) -> Duration {
        let delay = self.backoff.failed(&name.to_string());
        tracing::warn!(node = %name, error = %err, retry_in = ?delay, "error syncing node, requeuing");
        delay
    }

    /// Runs the Node's reconcile again after `delay`.
    fn retry_after(&self, name: String, delay: Duration) {
        self.queue.retried();
        let retry = self.retry.clone();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            let _ = retry.send(ObjectRef::new(&name));
        });
    }
}

/// How one Node write ended.
enum Written {
    /// Initialised, or nothing to do (gone, or initialised meanwhile).
    Done,
    /// A write conflict: try again from a fresher copy soon.
    Conflict,
}

/// One of the `--concurrent-node-syncs` writers: takes looked-up Nodes from the write queue
/// and initialises them. A failed write schedules a retry of the Node's reconcile with its
/// backoff (a new lookup: the instance may have changed meanwhile).
async fn write_loop(store: Store<Node>, ctx: Arc<Ctx>) {
    loop {
        let (name, meta) = ctx.writes.pop().await;
        let outcome = match store.get(&ObjectRef::new(&name)) {
            Some(node) => initialise(&ctx, &node, &meta).await,
            None => Ok(Written::Done),
        };
        ctx.writes.done(&name);
        match outcome {
            Ok(Written::Done) => {}
            Ok(Written::Conflict) => {
                tracing::debug!(node = %name, "conflict writing node; retrying from a fresher copy");
                ctx.retry_after(name, CONFLICT_RETRY);
            }
            Err(e) => {
                let delay = ctx.failed(&name, &e);
                ctx.retry_after(name, delay);
            }
        }
    }
}

/// Both writes of a Node, with the cloud's answer in hand and the informer's latest copy:
/// addresses first, so that a node is complete the moment its taint is lifted (upstream
/// writes them right after; anything waiting for initialised nodes could see the kubelet's
/// addresses in between), then one Node update with providerID, labels and the taint gone.
async fn initialise(ctx: &Ctx, node: &Node, meta: &InstanceMetadata) -> Result<Written, Error> {
    let name = node.name_any();
    if node.meta().deletion_timestamp.is_some() || !has_taint(node, names::TAINT_UNINITIALIZED) {
        return Ok(Written::Done);
    }
    let mut updated = node.clone();
    if let Some(addrs) = node_util::updated_addresses(node, &meta.node_addresses)
        && let Some(patched) = patch_addresses(ctx, &name, addrs).await
    {
        // The Node update below must carry the resourceVersion the patch produced.
        updated = patched;
    }
    let spec = updated.spec.get_or_insert_with(Default::default);
    if spec.provider_id.as_deref().unwrap_or_default().is_empty() && !meta.provider_id.is_empty() {
        spec.provider_id = Some(meta.provider_id.clone());
    }
    if let Some(taints) = spec.taints.as_mut() {
        taints.retain(|t| t.key != names::TAINT_UNINITIALIZED);
    }
    let labels = node_util::labels_with_metadata(updated.labels(), meta);
    updated.metadata.labels = Some(labels);
    updated.status = None;

    let replaced = match ctx.nodes.replace(&name, &PostParams::default(), &updated).await {
        Ok(n) => n,
        Err(kube::Error::Api(s)) if s.code == 409 => return Ok(Written::Conflict),
        Err(kube::Error::Api(s)) if s.code == 404 => return Ok(Written::Done),
        Err(source) => return Err(Error::Kube { node: name, source }),
    };
    let since_creation = age(&replaced);
    ctx.metrics.taint_removal_delay.observe(since_creation);
    publish(ctx, node, EventType::Normal, reasons::SYNCED, "Node synced successfully".into()).await;
    ctx.metrics.initial_sync_delay.observe(age(&replaced));
    ctx.backoff.succeeded(&name);
    tracing::info!(node = %name, "node initialized");
    Ok(Written::Done)
}

/// Seconds since the node was created (0 when unknown).
fn age(node: &Node) -> f64 {
    node.metadata
        .creation_timestamp
        .as_ref()
        .map(|Time(t)| {
            let d = jiff::Timestamp::now().duration_since(*t);
            d.as_secs_f64().max(0.0)
        })
        .unwrap_or(0.0)
}

async fn reconcile_labels(node: &Node, ctx: &Ctx) -> Result<(), Error> {
    let missing = node_util::missing_ga_labels(node.labels());
    if missing.is_empty() {
        return Ok(());
    }
    let name = node.name_any();
    let patch = serde_json::json!({"metadata": {"labels": missing}});
    ctx.nodes
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map(|_| ())
        .map_err(|source| Error::Kube { node: name, source })
}

/// Replaces the node's addresses; returns the patched Node (`None` if the patch failed, which
/// is logged: the periodic refresh tries again).
async fn patch_addresses(
    ctx: &Ctx,
    name: &str,
    addrs: Vec<k8s_openapi::api::core::v1::NodeAddress>,
) -> Option<Node> {
    // A merge patch replaces the whole list, which is what upstream's `$patch: replace` does.
    let patch = serde_json::json!({"status": {"addresses": addrs}});
    match ctx.nodes.patch_status(name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(node) => Some(node),
        Err(e) => {
            tracing::warn!(node = %name, error = %e, "error patching node with cloud ip addresses");
            None
        }
    }
}

async fn publish(ctx: &Ctx, node: &Node, type_: EventType, reason: &str, note: String) {
    super::events::publish(&ctx.recorder, node, type_, reason, "InitializeNode", note).await;
}

/// Every `period`, refreshes the addresses of initialised nodes in batch calls (upstream's
/// `UpdateNodeStatus`). Errors skip the node until the next pass; never labels or providerID.
async fn refresh_addresses_loop(
    store: Store<Node>,
    instances: Arc<dyn InstancesV2>,
    ctx: Arc<Ctx>,
    period: Duration,
    parallel_batches: usize,
) {
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        // Backoff entries of Nodes that no longer exist (normally dropped as soon as their
        // retry comes due; this bounds the map even if a retry was lost).
        ctx.backoff.retain(|name| store.get(&ObjectRef::new(name)).is_some());
        // The cache's shared copies; a batch copies its own Nodes only when its turn comes.
        let nodes: Vec<Arc<Node>> = store
            .state()
            .into_iter()
            .filter(|n| {
                !has_taint(n, names::TAINT_UNINITIALIZED) && n.meta().deletion_timestamp.is_none()
            })
            .collect();
        futures::stream::iter(nodes.chunks(instances.max_batch().max(1)))
            .for_each_concurrent(parallel_batches, |shared| {
                let instances = Arc::clone(&instances);
                let ctx = Arc::clone(&ctx);
                async move {
                    let chunk: Vec<Node> = shared.iter().map(|n| Node::clone(n)).collect();
                    let results = metadata_batch(instances.as_ref(), ctx.deadline, &chunk).await;
                    for (node, res) in chunk.iter().zip(results) {
                        let name = node.name_any();
                        match res {
                            Ok(meta) => {
                                if let Some(addrs) = node_util::updated_addresses(node, &meta.node_addresses) {
                                    let _ = patch_addresses(&ctx, &name, addrs).await;
                                }
                            }
                            Err(e) => tracing::warn!(node = %name, error = %e, "refreshing node addresses"),
                        }
                    }
                }
            })
            .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn meta(id: &str) -> InstanceMetadata {
        InstanceMetadata { provider_id: id.into(), ..Default::default() }
    }

    #[tokio::test]
    async fn the_write_queue_keeps_one_entry_per_node_with_its_newest_lookup_in_order() {
        let q = WriteQueue::default();
        assert!(q.claim("a"));
        assert!(!q.claim("a"), "a Node being looked up is not looked up again");
        q.push("a".into(), meta("old"));
        assert!(!q.claim("a"), "nor one waiting for its write");
        q.push("b".into(), meta("b"));
        q.push("a".into(), meta("new"));
        assert!(q.pending("a") && q.pending("b") && !q.pending("c"));
        assert!(q.claim("c"));
        q.release("c");
        assert!(!q.pending("c"), "a failed lookup releases the Node");
        let (name, m) = q.pop().await;
        assert_eq!((name.as_str(), m.provider_id.as_str()), ("a", "new"));
        assert!(q.pending("a"), "a Node being written is still pending");
        q.done("a");
        assert!(!q.pending("a"));
        let (name, _) = q.pop().await;
        assert_eq!(name, "b");
        q.done("b");
        // An empty queue waits for the next push.
        let waiting = tokio::time::timeout(Duration::from_millis(50), q.pop()).await;
        assert!(waiting.is_err());
        q.push("c".into(), meta("c"));
        let (name, _) = tokio::time::timeout(Duration::from_secs(5), q.pop()).await.unwrap();
        assert_eq!(name, "c");
    }
}
