//! The controllers, one module each, and the contract the manager uses to start them.
//!
//! ```text
//!  manager ──(ControllerContext: client, cloud, config, metrics registry, shutdown)──▶
//!     node            cloud-node-controller            (InstancesV2)
//!     node_lifecycle  cloud-node-lifecycle-controller  (InstancesV2)
//!     service         service-lb-controller            (LoadBalancer)
//!     route           node-route-controller            (Routes)
//!     node_ipam       node-ipam-controller             (Routes-free; CloudAllocator asks the cloud)
//! ```
//!
//! Each controller module exposes `pub fn start(ctx: &ControllerContext) ->
//! Result<Started, StartError>`: it checks its prerequisites (a missing capability is
//! [`Started::Skipped`] with the reason, logged by the manager, as upstream), registers its
//! metrics, and returns the future that runs the controller until `ctx.shutdown` fires.
//! A controller never returns early on one bad object: errors are logged, evented and retried.

use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;

use crate::cloud::CloudProvider;
use crate::names::controllers as names;

pub mod backoff;
pub mod events;
pub mod informer;
pub mod node;
pub mod node_ipam;
pub mod node_lifecycle;
pub mod node_util;
pub mod probe;
pub mod route;
pub mod service;
pub(crate) mod workqueue_metrics;

/// Settings the controllers read, with upstream's defaults (see `--help` of the manager for
/// the flags that set them).
#[derive(Debug, Clone)]
pub struct ControllerConfig {
    /// `--cluster-name`: passed to LoadBalancer and Routes calls.
    pub cluster_name: String,
    /// `--cluster-cidr`, parsed (empty when not set).
    pub cluster_cidrs: Vec<ipnet::IpNet>,
    /// `--service-cluster-ip-range`, parsed (at most two, one per family).
    pub service_cidrs: Vec<ipnet::IpNet>,
    /// `--allocate-node-cidrs`.
    pub allocate_node_cidrs: bool,
    /// `--cidr-allocator-type` (`RangeAllocator` or `CloudAllocator`).
    pub cidr_allocator_type: String,
    /// `--node-cidr-mask-size-ipv4` (24 when unset).
    pub node_cidr_mask_size_ipv4: u8,
    /// `--node-cidr-mask-size-ipv6` (64 when unset).
    pub node_cidr_mask_size_ipv6: u8,
    /// `--configure-cloud-routes`.
    pub configure_cloud_routes: bool,
    /// `--concurrent-service-syncs`.
    pub concurrent_service_syncs: usize,
    /// `--concurrent-node-syncs`.
    pub concurrent_node_syncs: usize,
    /// `--concurrent-node-status-updates` (0: use `concurrent_node_syncs`).
    pub concurrent_node_status_updates: usize,
    /// `--node-monitor-period` (lifecycle controller pass interval).
    pub node_monitor_period: Duration,
    /// `--node-status-update-frequency` (address refresh of initialised nodes).
    pub node_status_update_frequency: Duration,
    /// `--route-reconciliation-period`.
    pub route_reconciliation_period: Duration,
    /// Deadline of one instance lookup (`InstancesV2` metadata/status batches, node-IPAM's
    /// `NodeCidrs`), default 60 s. Upstream bounds the lifecycle controller's and the node
    /// controller's per-node lookups with short contexts; a batch of up to 500 nodes is
    /// still one or a few describe calls, so a minute is ample, and a node that is not
    /// answered in time is only retried (never deleted, never stamped).
    pub instance_call_timeout: Duration,
    /// Deadline of one load balancer call (get, ensure, update, delete), default 5 min.
    /// Creating or deleting a load balancer legitimately takes minutes on some clouds
    /// (GCE/Azure poll long-running operations, AWS NLB target registration); a timed-out
    /// call is an ordinary sync error, retried with the per-Service backoff.
    pub load_balancer_call_timeout: Duration,
    /// Deadline of one route call (list, create, delete), default 2 min. Route creation is
    /// an asynchronous operation on GCE and Azure that is polled to completion; the next
    /// `--route-reconciliation-period` pass retries whatever timed out.
    pub route_call_timeout: Duration,
    /// The client every controller records its events through: a rate-limit bucket of its
    /// own, so events never delay a controller's writes
    /// (`None`: each controller's own client, as in tests).
    pub events_client: Option<EventsClient>,
}

/// The events client of [`ControllerConfig::events_client`].
#[derive(Clone)]
pub struct EventsClient(pub kube::Client);

impl std::fmt::Debug for EventsClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EventsClient")
    }
}

impl Default for ControllerConfig {
    fn default() -> Self {
        ControllerConfig {
            cluster_name: "kubernetes".into(),
            cluster_cidrs: Vec::new(),
            service_cidrs: Vec::new(),
            allocate_node_cidrs: false,
            cidr_allocator_type: "RangeAllocator".into(),
            node_cidr_mask_size_ipv4: 24,
            node_cidr_mask_size_ipv6: 64,
            configure_cloud_routes: true,
            concurrent_service_syncs: 1,
            concurrent_node_syncs: 1,
            concurrent_node_status_updates: 0,
            node_monitor_period: Duration::from_secs(5),
            node_status_update_frequency: Duration::from_secs(5 * 60),
            route_reconciliation_period: Duration::from_secs(10),
            instance_call_timeout: Duration::from_secs(60),
            load_balancer_call_timeout: Duration::from_secs(5 * 60),
            route_call_timeout: Duration::from_secs(2 * 60),
            events_client: None,
        }
    }
}

/// Everything a controller needs to start.
#[derive(Clone)]
pub struct ControllerContext {
    /// The client this controller acts with (its own ServiceAccount with
    /// `--use-service-account-credentials`).
    pub client: kube::Client,
    /// The cloud.
    pub cloud: Arc<dyn CloudProvider>,
    /// Settings.
    pub config: Arc<ControllerConfig>,
    /// Where the controller registers its metrics (shared by the whole process).
    pub metrics: Arc<std::sync::Mutex<prometheus_client::registry::Registry>>,
    /// Cancelled when the controller must stop (shutdown or lost leadership).
    pub shutdown: CancellationToken,
    /// The manager's one Node informer, shared by every controller (`None`: each
    /// controller watches Nodes itself, as in tests).
    pub nodes: Option<informer::SharedNodes>,
}

impl ControllerContext {
    /// The client to record events with: the manager's events client (a bucket of its own),
    /// else the controller's client.
    pub fn events_client(&self) -> kube::Client {
        match &self.config.events_client {
            Some(EventsClient(c)) => c.clone(),
            None => self.client.clone(),
        }
    }
}

/// The result of starting a controller.
pub enum Started {
    /// Running: drive this future to completion (it ends when `shutdown` fires).
    Running(BoxFuture<'static, ()>),
    /// Not started, for this reason (logged by the manager; not an error, as upstream).
    Skipped(String),
}

/// A controller could not be configured; the manager treats this as fatal, as upstream.
#[derive(Debug, thiserror::Error)]
#[error("{controller}: {message}")]
pub struct StartError {
    /// The canonical controller name.
    pub controller: &'static str,
    /// What is wrong (names the flag or setting).
    pub message: String,
}

/// A known controller: its names and how to start it.
#[derive(Debug, Clone, Copy)]
pub struct ControllerDescriptor {
    /// Canonical `--controllers` name, e.g. `cloud-node-controller`.
    pub name: &'static str,
    /// Upstream alias, e.g. `cloud-node` (also the `running_managed_controllers` name).
    pub alias: &'static str,
    /// The ServiceAccount used with `--use-service-account-credentials`.
    pub client_name: &'static str,
    /// Starts it.
    pub start: fn(&ControllerContext) -> Result<Started, StartError>,
}

/// Every controller this core provides, in a fixed order.
pub fn all() -> Vec<ControllerDescriptor> {
    vec![
        ControllerDescriptor {
            name: names::CLOUD_NODE,
            alias: names::CLOUD_NODE_ALIAS,
            client_name: "node-controller",
            start: node::start,
        },
        ControllerDescriptor {
            name: names::CLOUD_NODE_LIFECYCLE,
            alias: names::CLOUD_NODE_LIFECYCLE_ALIAS,
            client_name: "node-controller",
            start: node_lifecycle::start,
        },
        ControllerDescriptor {
            name: names::SERVICE_LB,
            alias: names::SERVICE_LB_ALIAS,
            client_name: "service-controller",
            start: service::start,
        },
        ControllerDescriptor {
            name: names::NODE_ROUTE,
            alias: names::NODE_ROUTE_ALIAS,
            client_name: "route-controller",
            start: route::start,
        },
        ControllerDescriptor {
            name: names::NODE_IPAM,
            alias: names::NODE_IPAM_ALIAS,
            client_name: "node-controller",
            start: node_ipam::start,
        },
    ]
}
