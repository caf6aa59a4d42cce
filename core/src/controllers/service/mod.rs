//! The service (load balancer) controller: owns the cloud load balancers of `type:
//! LoadBalancer` Services without `spec.loadBalancerClass`, their
//! `service.kubernetes.io/load-balancer-cleanup` finalizer, `status.loadBalancer`, and the
//! backend node set of every load balancer.
//!
//! ```text
//!  Service watch ─(needs_update / needs_cleanup)─▶ queue ─▶ workers ─▶ sync_service
//!  Node watch ─(add, delete, exclusion or providerID change)─▶ node-sync trigger
//!        node-sync: one pass over every cached LB Service, at most `node_sync_workers`
//!        UpdateLoadBalancer calls in flight, only for Services whose backend set changed
//! ```
//!
//! Upstream decisions (spec §4), kept unless said otherwise:
//! - Status and finalizer go through the `status` subresource (strategic merge patch), so the
//!   controller only needs `services/status` patch. The finalizer is added before the first
//!   cloud call and removed only after the load balancer is confirmed gone.
//! - No periodic re-ensure: unchanged Services (resyncs, our own status patches) are not
//!   synced again; node-set changes go through `UpdateLoadBalancer`.
//! - Backends are upstream's stable node set: not deleting, not excluded by label, not
//!   tainted `ToBeDeletedByClusterAutoscaler`. Readiness is ignored, so flapping nodes cause
//!   no cloud calls. An unparsable exclusion label excludes the node (upstream today).
//! - Retries: per-Service backoff 5 s doubling to 300 s; [`ProviderError::RetryAfter`] is a
//!   fixed delay that does not grow the backoff. A node-sync failure re-queues the Service
//!   for a full ensure.
//! - **FIX**: upstream records a [`ProviderError::RetryAfter`] (its `RetryError`: a load
//!   balancer still being created, a resource still in use) like any failure, as a Warning
//!   `SyncLoadBalancerFailed` (`DeleteLoadBalancerFailed`, `UpdateLoadBalancerFailed`), every
//!   few seconds while the cloud is busy. Here it is a Normal
//!   [`reasons::LOAD_BALANCER_PENDING`] event naming what is pending and when the retry comes.
//!   And a node-sync update answered with `RetryAfter` re-queues the Service after that delay,
//!   not at once (upstream re-adds it at once, and its ensure meets the same pending state).
//! - `DeletedLoadBalancer` is sent even when no load balancer existed (kept).
//! - **FIX**: upstream's node sync fans out over `--concurrent-service-syncs` workers
//!   (default 1), so 200 load balancers are updated one after another. Here the node sync
//!   uses at least [`DEFAULT_NODE_SYNC_WORKERS`] in parallel.
//! - **FIX**: upstream's node sync also updates a Service that has no last-synced node set
//!   yet, i.e. one whose first ensure is still running; that races with the ensure (and on
//!   failure queues a second retry chain). Here such Services are left to their own sync,
//!   which reads the current nodes anyway.
//! - **FIX**: upstream can run a Service's sync (`EnsureLoadBalancer`) and its node-sync
//!   `UpdateLoadBalancer` at the same time. Here both hold a per-Service lock, so a provider
//!   never sees two concurrent calls for one load balancer. The node sync never waits for
//!   that lock: a Service whose sync is in flight is re-queued instead (its next ensure
//!   reads the current nodes), so one slow or hung load balancer never holds back the
//!   backend updates of the others.
//! - Every cloud call has a deadline (`ControllerConfig::load_balancer_call_timeout`,
//!   default 5 min); a timed-out call is a sync error like any other (event, backoff).
//! - **FIX**: upstream has no Service delete handler, so a Service that vanished without the
//!   finalizer (e.g. created before the finalizer existed) is only cleaned up if it happened
//!   to be queued. Here a delete of a cached Service queues its key, and the cached copy is
//!   used to delete the load balancer.
//!
//! Nodes come from the manager's shared Node informer ([`crate::controllers::informer`]); the
//! keyed work queue lives here and is shared with the node-IPAM controller.
//!
//! Both queues record client-go's `workqueue_*` metrics under upstream's names: `service`
//! (Service keys) and `node` (the node-sync trigger, a single key).

mod predicates;
mod queue;

use crate::controllers::informer::{self, Change, Informer};
pub(crate) use queue::WorkQueue;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::controllers::events::EventRecorder;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::watcher;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use serde_json::json;

use super::workqueue_metrics::WorkqueueMetrics;
use super::{ControllerContext, StartError, Started};
use crate::cloud::{LoadBalancer, ProviderError};
use crate::cloud_call::Deadline;
use crate::names::{self, controllers as cnames, reasons};
use predicates::{NodeSet, is_backend, needs_cleanup, needs_update, wants_load_balancer};

/// Upstream's names of the Service queue and the node-sync queue (the `name` label of the
/// `workqueue_*` metrics).
const SERVICE_QUEUE: &str = "service";
const NODE_QUEUE: &str = "node";

/// Least number of parallel `UpdateLoadBalancer` calls during a node sync.
pub const DEFAULT_NODE_SYNC_WORKERS: usize = 16;

/// Tunables of the service controller. [`start`] uses the defaults; tests shorten the
/// backoff and scope the watches.
#[derive(Debug, Clone)]
pub struct ServiceOptions {
    /// First retry delay of a failing Service (upstream 5 s).
    pub min_retry_delay: Duration,
    /// Retry delay cap (upstream 300 s).
    pub max_retry_delay: Duration,
    /// Parallel `UpdateLoadBalancer` calls in a node sync (0: the default).
    pub node_sync_workers: usize,
    /// Watch Services only in this namespace (`None`: all namespaces).
    pub namespace: Option<String>,
    /// Consider only Nodes matching this label selector (`None`: all Nodes).
    pub node_selector: Option<String>,
}

impl Default for ServiceOptions {
    fn default() -> Self {
        ServiceOptions {
            min_retry_delay: Duration::from_secs(5),
            max_retry_delay: Duration::from_secs(300),
            node_sync_workers: 0,
            namespace: None,
            node_selector: None,
        }
    }
}

/// Starts the service controller with upstream's settings.
pub fn start(ctx: &ControllerContext) -> Result<Started, StartError> {
    start_with(ctx, ServiceOptions::default())
}

/// Starts the service controller with explicit tunables.
pub fn start_with(ctx: &ControllerContext, opts: ServiceOptions) -> Result<Started, StartError> {
    let Some(lb) = ctx.cloud.load_balancer() else {
        return Ok(Started::Skipped(
            "the cloud provider does not support external load balancers".into(),
        ));
    };
    let metrics = Metrics::register(&mut ctx.metrics.lock().unwrap_or_else(|p| p.into_inner()));
    let ctx = ctx.clone();
    Ok(Started::Running(Box::pin(run(ctx, lb, opts, metrics))))
}

/// Metrics of subsystem `service_controller` (spec §4.7).
#[derive(Clone)]
struct Metrics {
    loadbalancer_sync: Counter,
    nodesync_error: Counter,
    nodesync_latency: Histogram,
    update_host_latency: Histogram,
}

impl Metrics {
    fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = Metrics {
            loadbalancer_sync: Counter::default(),
            nodesync_error: Counter::default(),
            nodesync_latency: Histogram::new(exponential_buckets(1.0, 2.0, 15)),
            update_host_latency: Histogram::new(exponential_buckets(1.0, 2.0, 15)),
        };
        let r = registry.sub_registry_with_prefix("service_controller");
        r.register(
            "loadbalancer_sync",
            "A metric counting the amount of times any load balancer has been configured, as an effect of service/node changes on the cluster",
            m.loadbalancer_sync.clone(),
        );
        r.register(
            "nodesync_error",
            "A metric counting the amount of times any load balancer has been configured and errored, as an effect of node changes on the cluster",
            m.nodesync_error.clone(),
        );
        r.register(
            "nodesync_latency_seconds",
            "A metric measuring the latency for nodesync which updates loadbalancer hosts on cluster node updates.",
            m.nodesync_latency.clone(),
        );
        r.register(
            "update_loadbalancer_host_latency_seconds",
            "A metric measuring the latency for updating each load balancer hosts.",
            m.update_host_latency.clone(),
        );
        m
    }
}

/// Why a Service sync failed. Messages follow upstream's.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("failed to check if load balancer exists before cleanup: {0}")]
    GetLoadBalancer(#[source] ProviderError),
    #[error("failed to delete load balancer: {0}")]
    DeleteLoadBalancer(#[source] ProviderError),
    #[error("failed to ensure load balancer: {0}")]
    EnsureLoadBalancer(#[source] ProviderError),
    #[error("failed to add load balancer cleanup finalizer: {0}")]
    AddFinalizer(#[source] kube::Error),
    #[error("failed to remove load balancer cleanup finalizer: {0}")]
    RemoveFinalizer(#[source] kube::Error),
    #[error("failed to update load balancer status: {0}")]
    UpdateStatus(#[source] kube::Error),
    #[error("error updating load balancer with new hosts: {0}")]
    UpdateHosts(#[source] ProviderError),
}

impl SyncError {
    /// The fixed retry delay the cloud asked for, if any.
    fn retry_after(&self) -> Option<Duration> {
        self.pending().map(|(_, delay)| delay)
    }

    /// What the cloud said is pending, and the delay it asked for, when it asked for a
    /// fixed-delay retry ([`ProviderError::RetryAfter`]).
    fn pending(&self) -> Option<(&str, Duration)> {
        match self {
            SyncError::GetLoadBalancer(e)
            | SyncError::DeleteLoadBalancer(e)
            | SyncError::EnsureLoadBalancer(e)
            | SyncError::UpdateHosts(e) => pending(e),
            _ => None,
        }
    }
}

/// What is pending and the delay asked for, if `e` is a [`ProviderError::RetryAfter`].
fn pending(e: &ProviderError) -> Option<(&str, Duration)> {
    match e {
        ProviderError::RetryAfter { message, delay } => Some((message.as_str(), *delay)),
        _ => None,
    }
}

/// The Event a failed load-balancer call raises: a Normal [`reasons::LOAD_BALANCER_PENDING`]
/// when the provider asked for a retry after a delay (a pending cloud operation is not a
/// failure), else a Warning with `failed` and the error.
fn failure_event(
    pending: Option<(&str, Duration)>,
    failed: &'static str,
    error: impl FnOnce() -> String,
) -> (EventType, &'static str, String) {
    match pending {
        Some((message, delay)) => (
            EventType::Normal,
            reasons::LOAD_BALANCER_PENDING,
            format!("Load balancer pending, retrying in {delay:?}: {message}"),
        ),
        None => (EventType::Warning, failed, error()),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Ensure,
    Delete,
}

struct Controller {
    client: kube::Client,
    lb: Arc<dyn LoadBalancer>,
    cluster_name: String,
    recorder: EventRecorder,
    services: Arc<Informer<Service>>,
    nodes: Arc<Informer<Node>>,
    /// Last Service seen by a sync (upstream's service cache): used to delete the load
    /// balancer of a vanished Service and as the set of Services the node sync visits.
    cache: Mutex<HashMap<String, Arc<Service>>>,
    /// Backend set last sent to the cloud, per Service key.
    last_synced: Mutex<HashMap<String, NodeSet>>,
    /// One lock per Service key, so a Service's sync and its node-sync update never call
    /// the cloud at the same time.
    key_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    queue: Arc<WorkQueue>,
    /// The node-sync trigger: a queue holding at most the one key [`NODE_QUEUE`], so triggers
    /// during a pass collapse into one more pass (upstream's `node` queue).
    node_sync: Arc<WorkQueue>,
    metrics: Metrics,
    node_sync_workers: usize,
    /// Deadline of every load balancer call.
    deadline: Deadline,
}

async fn run(
    ctx: ControllerContext,
    lb: Arc<dyn LoadBalancer>,
    opts: ServiceOptions,
    metrics: Metrics,
) {
    let shutdown = ctx.shutdown.clone();
    let svc_api: Api<Service> = match &opts.namespace {
        Some(ns) => Api::namespaced(ctx.client.clone(), ns),
        None => Api::all(ctx.client.clone()),
    };
    let services = informer::spawn(
        svc_api,
        watcher::Config::default().any_semantic(),
        informer::prune_meta,
        shutdown.clone(),
    );
    let mut svc_changes = services.subscribe();
    let nodes = informer::nodes_for(&ctx, opts.node_selector.as_deref());
    let mut node_changes = nodes.subscribe();
    let workers = ctx.config.concurrent_service_syncs.max(1);
    let node_sync_workers = match opts.node_sync_workers {
        0 => workers.max(DEFAULT_NODE_SYNC_WORKERS),
        n => n,
    };
    let c = Arc::new(Controller {
        client: ctx.client.clone(),
        lb,
        cluster_name: ctx.config.cluster_name.clone(),
        recorder: EventRecorder::new(
            ctx.events_client(),
            Reporter::from(cnames::COMPONENT_SERVICE),
        ),
        services,
        nodes,
        cache: Mutex::new(HashMap::new()),
        last_synced: Mutex::new(HashMap::new()),
        key_locks: Mutex::new(HashMap::new()),
        queue: WorkQueue::new(
            opts.min_retry_delay,
            opts.max_retry_delay,
            shutdown.clone(),
            WorkqueueMetrics::of(&ctx.metrics).queue(SERVICE_QUEUE),
        ),
        node_sync: WorkQueue::new(
            opts.min_retry_delay,
            opts.max_retry_delay,
            shutdown.clone(),
            WorkqueueMetrics::of(&ctx.metrics).queue(NODE_QUEUE),
        ),
        metrics,
        node_sync_workers,
        deadline: Deadline::new(ctx.config.load_balancer_call_timeout),
    });

    // Service event handlers (spec §4.2).
    let this = c.clone();
    tokio::spawn(async move {
        while let Some(change) = svc_changes.recv().await {
            match change {
                Change::Added(new) => {
                    if wants_load_balancer(&new) || needs_cleanup(&new) {
                        this.queue.add(&informer::key_of(new.as_ref()));
                    }
                }
                Change::Updated { old, new } => {
                    if needs_update(&old, &new) || needs_cleanup(&new) {
                        this.queue.add(&informer::key_of(new.as_ref()));
                    }
                }
                Change::Deleted(old) => {
                    let key = informer::key_of(old.as_ref());
                    if this.lock_cache().contains_key(&key) {
                        this.queue.add(&key);
                    }
                }
                Change::Synced => {}
            }
        }
    });
    // Node event handlers (spec §4.6).
    let this = c.clone();
    tokio::spawn(async move {
        while let Some(change) = node_changes.recv().await {
            let trigger = match change {
                Change::Added(_) | Change::Deleted(_) => true,
                Change::Updated { old, new } => predicates::should_sync_updated_node(&old, &new),
                Change::Synced => false,
            };
            if trigger {
                this.node_sync.add(NODE_QUEUE);
            }
        }
    });

    tokio::select! {
        _ = shutdown.cancelled() => return,
        _ = async { c.services.wait_synced().await; c.nodes.wait_synced().await } => {}
    }
    tracing::info!(workers, node_sync_workers, "service controller started");

    let mut tasks = Vec::new();
    for _ in 0..workers {
        let this = c.clone();
        tasks.push(tokio::spawn(async move {
            while let Some(key) = this.queue.get().await {
                this.process(&key).await;
                this.queue.done(&key);
            }
        }));
    }
    let this = c.clone();
    tasks.push(tokio::spawn(async move {
        while let Some(key) = this.node_sync.get().await {
            this.sync_nodes().await;
            this.node_sync.done(&key);
        }
    }));
    shutdown.cancelled().await;
    for t in tasks {
        let _ = t.await;
    }
}

fn ingress_of(status: Option<&LoadBalancerStatus>) -> &[LoadBalancerIngress] {
    status.and_then(|s| s.ingress.as_deref()).unwrap_or_default()
}

impl Controller {
    fn lock_cache(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Service>>> {
        self.cache.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The backends a Service's ensure uses, recorded as its last-synced node set in the
    /// same critical section: a node sync that finds no record for a Service whose sync is in
    /// flight knows that sync has not read the nodes yet and will see the new ones.
    fn read_backends_for(&self, key: &str) -> Vec<Node> {
        let mut last = self.last_synced.lock().unwrap_or_else(|p| p.into_inner());
        let nodes = self.backends();
        last.insert(key.to_string(), predicates::node_set(&nodes));
        nodes
    }

    async fn event(
        &self,
        svc: &Service,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) {
        crate::controllers::events::publish(&self.recorder, svc, type_, reason, action, note).await;
    }

    fn api(&self, svc: &Service) -> Api<Service> {
        Api::namespaced(self.client.clone(), svc.metadata.namespace.as_deref().unwrap_or("default"))
    }

    /// Current backends, sorted by name.
    fn backends(&self) -> Vec<Node> {
        let mut nodes: Vec<Node> =
            self.nodes.list().iter().filter(|n| is_backend(n)).map(|n| (**n).clone()).collect();
        nodes.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        nodes
    }

    async fn process(self: &Arc<Self>, key: &str) {
        match self.sync_service(key).await {
            Ok(()) => self.queue.forget(key),
            Err(e) => match e.retry_after() {
                Some(delay) => {
                    tracing::info!(service = key, ?delay, error = %e, "service pending in the cloud (retrying after the delay the cloud asked for)");
                    self.queue.add_after(key, delay);
                }
                None => {
                    let delay = self.queue.add_rate_limited(key);
                    tracing::warn!(service = key, ?delay, error = %e, "error processing service (retrying with exponential backoff)");
                }
            },
        }
    }

    /// `GetLoadBalancer`, under the deadline.
    async fn get_lb(&self, svc: &Service) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        let get = self.lb.get_load_balancer(&self.cluster_name, svc);
        self.deadline.try_run("GetLoadBalancer", get).await
    }

    /// `EnsureLoadBalancerDeleted`, under the deadline.
    async fn delete_lb(&self, svc: &Service) -> Result<(), ProviderError> {
        let delete = self.lb.ensure_load_balancer_deleted(&self.cluster_name, svc);
        self.deadline.try_run("EnsureLoadBalancerDeleted", delete).await
    }

    fn key_lock(&self, key: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.key_locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(key.to_string()).or_default().clone()
    }

    async fn sync_service(&self, key: &str) -> Result<(), SyncError> {
        let start = Instant::now();
        let lock = self.key_lock(key);
        let guard = lock.lock().await;
        let res = match self.services.get(key) {
            None => self.process_service_deletion(key).await,
            Some(svc) => self.process_create_or_update(key, svc).await,
        };
        drop(guard);
        if res.is_ok() && !self.lock_cache().contains_key(key) {
            self.key_locks.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        }
        tracing::debug!(service = key, elapsed = ?start.elapsed(), ok = res.is_ok(), "synced service");
        res
    }

    async fn process_service_deletion(&self, key: &str) -> Result<(), SyncError> {
        let Some(cached) = self.lock_cache().get(key).cloned() else {
            return Ok(());
        };
        self.process_load_balancer_delete(key, &cached).await
    }

    /// Deletes the load balancer of a Service that is gone (or was replaced under the same
    /// name), from its cached copy.
    async fn process_load_balancer_delete(
        &self,
        key: &str,
        svc: &Service,
    ) -> Result<(), SyncError> {
        if wants_load_balancer(svc) {
            self.event(
                svc,
                EventType::Normal,
                reasons::DELETING_LOAD_BALANCER,
                "DeleteLoadBalancer",
                "Deleting load balancer".into(),
            )
            .await;
            if let Err(e) = self.delete_lb(svc).await {
                let (type_, reason, note) =
                    failure_event(pending(&e), reasons::DELETE_LOAD_BALANCER_FAILED, || {
                        format!("Error deleting load balancer: {e}")
                    });
                self.event(svc, type_, reason, "DeleteLoadBalancer", note).await;
                return Err(SyncError::DeleteLoadBalancer(e));
            }
            self.event(
                svc,
                EventType::Normal,
                reasons::DELETED_LOAD_BALANCER,
                "DeleteLoadBalancer",
                "Deleted load balancer".into(),
            )
            .await;
        }
        self.lock_cache().remove(key);
        self.last_synced.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        Ok(())
    }

    async fn process_create_or_update(
        &self,
        key: &str,
        svc: Arc<Service>,
    ) -> Result<(), SyncError> {
        let cached = self.lock_cache().get(key).cloned();
        if let Some(cached) = cached
            && cached.metadata.uid != svc.metadata.uid
        {
            self.process_load_balancer_delete(key, &cached).await?;
        }
        self.lock_cache().insert(key.to_string(), svc.clone());
        match self.sync_load_balancer_if_needed(key, &svc).await {
            Err(e) => {
                let (type_, reason, note) =
                    failure_event(e.pending(), reasons::SYNC_LOAD_BALANCER_FAILED, || {
                        format!("Error syncing load balancer: {e}")
                    });
                self.event(&svc, type_, reason, "SyncLoadBalancer", note).await;
                Err(e)
            }
            Ok(Op::Delete) => {
                self.lock_cache().remove(key);
                self.last_synced.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
                Ok(())
            }
            Ok(Op::Ensure) => Ok(()),
        }
    }

    async fn sync_load_balancer_if_needed(
        &self,
        key: &str,
        svc: &Service,
    ) -> Result<Op, SyncError> {
        let previous = svc.status.as_ref().and_then(|s| s.load_balancer.clone());
        let (op, new_status) = if !wants_load_balancer(svc) || needs_cleanup(svc) {
            let exists = self.get_lb(svc).await.map_err(SyncError::GetLoadBalancer)?.is_some();
            if exists {
                self.event(
                    svc,
                    EventType::Normal,
                    reasons::DELETING_LOAD_BALANCER,
                    "DeleteLoadBalancer",
                    "Deleting load balancer".into(),
                )
                .await;
                match self.delete_lb(svc).await {
                    Ok(()) | Err(ProviderError::ImplementedElsewhere) => {}
                    Err(e) => return Err(SyncError::DeleteLoadBalancer(e)),
                }
            }
            if predicates::has_finalizer(svc) {
                self.patch_finalizer(svc, false).await.map_err(SyncError::RemoveFinalizer)?;
            }
            self.event(
                svc,
                EventType::Normal,
                reasons::DELETED_LOAD_BALANCER,
                "DeleteLoadBalancer",
                "Deleted load balancer".into(),
            )
            .await;
            (Op::Delete, LoadBalancerStatus::default())
        } else {
            self.event(
                svc,
                EventType::Normal,
                reasons::ENSURING_LOAD_BALANCER,
                "EnsureLoadBalancer",
                "Ensuring load balancer".into(),
            )
            .await;
            if !predicates::has_finalizer(svc) {
                self.patch_finalizer(svc, true).await.map_err(SyncError::AddFinalizer)?;
            }
            let nodes = self.read_backends_for(key);
            if nodes.is_empty() {
                self.event(
                    svc,
                    EventType::Warning,
                    reasons::UNAVAILABLE_LOAD_BALANCER,
                    "EnsureLoadBalancer",
                    "There are no available nodes for LoadBalancer".into(),
                )
                .await;
            }
            self.metrics.loadbalancer_sync.inc();
            let ensure = self.lb.ensure_load_balancer(&self.cluster_name, svc, &nodes);
            let status = match self.deadline.try_run("EnsureLoadBalancer", ensure).await {
                Ok(status) => status,
                Err(ProviderError::ImplementedElsewhere) => {
                    tracing::debug!(
                        service = key,
                        "load balancer implemented elsewhere; status left alone"
                    );
                    return Ok(Op::Ensure);
                }
                Err(e) => return Err(SyncError::EnsureLoadBalancer(e)),
            };
            self.event(
                svc,
                EventType::Normal,
                reasons::ENSURED_LOAD_BALANCER,
                "EnsureLoadBalancer",
                "Ensured load balancer".into(),
            )
            .await;
            (Op::Ensure, status)
        };
        if ingress_of(previous.as_ref()) != ingress_of(Some(&new_status)) {
            let ingress = match new_status.ingress {
                Some(i) if !i.is_empty() => json!(i),
                _ => serde_json::Value::Null,
            };
            let patch = json!({"status": {"loadBalancer": {"ingress": ingress}}});
            let name = svc.metadata.name.as_deref().unwrap_or_default();
            match self
                .api(svc)
                .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
                .await
            {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(SyncError::UpdateStatus(e)),
            }
        }
        Ok(op)
    }

    /// Adds or removes the cleanup finalizer through the status subresource. The strategic
    /// merge patch touches only this finalizer, so other finalizers are never lost.
    async fn patch_finalizer(&self, svc: &Service, add: bool) -> Result<(), kube::Error> {
        let patch = if add {
            json!({"metadata": {"finalizers": [names::FINALIZER_LB_CLEANUP]}})
        } else {
            json!({"metadata": {"$deleteFromPrimitiveList/finalizers": [names::FINALIZER_LB_CLEANUP]}})
        };
        let name = svc.metadata.name.as_deref().unwrap_or_default();
        match self
            .api(svc)
            .patch_status(name, &PatchParams::default(), &Patch::Strategic(patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(s)) if s.code == 404 && !add => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// One pass over every cached load balancer Service: updates the backends of those
    /// whose backend set changed, with bounded parallelism. Failures re-queue the Service.
    ///
    /// Without a load balancer Service the pass ends before looking at the Nodes: a
    /// cluster initialising N Nodes triggers up to N passes, and walking all N Nodes in each
    /// was O(N²) CPU (issue #15).
    async fn sync_nodes(self: &Arc<Self>) {
        let start = Instant::now();
        let services: Vec<(String, Arc<Service>)> = self
            .lock_cache()
            .iter()
            .filter(|(_, s)| wants_load_balancer(s))
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect();
        let total = services.len();
        if total == 0 {
            self.metrics.nodesync_latency.observe(start.elapsed().as_secs_f64());
            tracing::debug!("node sync: no load balancer services");
            return;
        }
        let nodes = Arc::new(self.backends());
        let set = Arc::new(predicates::node_set(nodes.iter()));
        let failed: Vec<(String, Option<Duration>)> = futures::stream::iter(services)
            .map(|(key, svc)| {
                let (nodes, set) = (nodes.clone(), set.clone());
                async move {
                    match self.node_sync_service(&key, &svc, &nodes, &set).await {
                        Ok(()) => None,
                        Err(e) => {
                            self.metrics.nodesync_error.inc();
                            let delay = e.retry_after();
                            match delay {
                                Some(delay) => tracing::info!(service = %key, ?delay, error = %e, "node sync: load balancer pending; re-queueing the service after the delay the cloud asked for"),
                                None => tracing::warn!(service = %key, error = %e, "node sync failed; re-queueing the service"),
                            }
                            Some((key, delay))
                        }
                    }
                }
            })
            .buffer_unordered(self.node_sync_workers)
            .filter_map(|k| async move { k })
            .collect()
            .await;
        // A pending load balancer comes back after the delay its cloud asked for: queued at
        // once, its ensure would only meet the same pending state.
        for (key, delay) in &failed {
            match delay {
                Some(delay) => self.queue.add_after(key, *delay),
                None => self.queue.add(key),
            }
        }
        let elapsed = start.elapsed();
        self.metrics.nodesync_latency.observe(elapsed.as_secs_f64());
        // One line per pass at debug: passes follow every Node change, so at INFO a large
        // cluster's start-up logged thousands of them.
        tracing::debug!(
            services = total,
            failed = failed.len(),
            backends = set.len(),
            ?elapsed,
            "node sync done"
        );
    }

    async fn node_sync_service(
        &self,
        key: &str,
        svc: &Service,
        nodes: &[Node],
        set: &NodeSet,
    ) -> Result<(), SyncError> {
        let lock = self.key_lock(key);
        let Ok(_guard) = lock.try_lock() else {
            // The Service's own sync (or deletion) is calling the cloud right now. Waiting
            // for it would hold this whole pass behind one load balancer; instead its key is
            // queued again, and that sync ensures with the nodes current by then.
            // No record: that sync has not read the nodes yet (reading and recording are one
            // critical section, and `set` was read before this check), so it will use nodes
            // at least as new as ours; re-queueing it would only repeat its ensure.
            let stale = self
                .last_synced
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .get(key)
                .is_some_and(|old| old != set);
            if stale {
                tracing::debug!(
                    service = key,
                    "service sync in flight; re-queued for the new node set"
                );
                self.queue.add(key);
            }
            return Ok(());
        };
        if !self.lock_cache().contains_key(key) {
            // Deleted meanwhile: nothing to update, and no lock to keep.
            self.key_locks.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
            return Ok(());
        }
        {
            let mut last = self.last_synced.lock().unwrap_or_else(|p| p.into_inner());
            match last.get_mut(key) {
                // Never ensured yet (or being ensured right now): its sync uses the
                // current nodes, so an update here would only race with it.
                None => return Ok(()),
                Some(old) if old == set => return Ok(()),
                Some(old) => *old = set.clone(),
            }
        }
        self.metrics.loadbalancer_sync.inc();
        let start = Instant::now();
        let update = self.lb.update_load_balancer(&self.cluster_name, svc, nodes);
        match self.deadline.try_run("UpdateLoadBalancer", update).await {
            Ok(()) => {
                self.metrics.update_host_latency.observe(start.elapsed().as_secs_f64());
                if nodes.is_empty() {
                    self.event(
                        svc,
                        EventType::Warning,
                        reasons::UNAVAILABLE_LOAD_BALANCER,
                        "UpdateLoadBalancer",
                        "There are no available nodes for LoadBalancer".into(),
                    )
                    .await;
                } else {
                    self.event(
                        svc,
                        EventType::Normal,
                        reasons::UPDATED_LOAD_BALANCER,
                        "UpdateLoadBalancer",
                        "Updated load balancer with new hosts".into(),
                    )
                    .await;
                }
                Ok(())
            }
            Err(ProviderError::ImplementedElsewhere) => Ok(()),
            Err(e) => {
                if let Ok(None) = self.get_lb(svc).await {
                    return Ok(());
                }
                let (type_, reason, note) =
                    failure_event(pending(&e), reasons::UPDATE_LOAD_BALANCER_FAILED, || {
                        format!(
                            "Error updating load balancer with new hosts {} [node names limited, \
                             total number of nodes: {}], error: {e}",
                            predicates::node_names_for_log(set),
                            set.len()
                        )
                    });
                self.event(svc, type_, reason, "UpdateLoadBalancer", note).await;
                Err(SyncError::UpdateHosts(e))
            }
        }
    }
}
