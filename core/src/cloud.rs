//! The provider interface: what a cloud must answer for the controllers to work.
//!
//! This is the Rust shape of upstream `k8s.io/cloud-provider`'s `cloud.go`. A provider
//! implements [`CloudProvider`] and returns the capabilities it supports; every capability is
//! optional, and a controller whose capability is missing is not started (it logs why).
//!
//! ```text
//! CloudProvider ─┬─ instances_v2()  → InstancesV2   (cloud-node, cloud-node-lifecycle)
//!                ├─ load_balancer() → LoadBalancer  (service)
//!                ├─ routes()        → Routes        (route)
//!                ├─ zones()         → Zones         (PV labelling; unused with InstancesV2)
//!                ├─ clusters()      → Clusters
//!                └─ node_cidrs()    → NodeCidrs     (nodeipam with CloudAllocator)
//! ```
//!
//! Scale: upstream asks the cloud once per node. Here [`InstancesV2`] has batch methods
//! (`*_batch`) with a per-node default, and the controllers never call the single methods
//! directly: they go through [`crate::batch::Coalescer`], which merges concurrent lookups
//! into one batch call. A provider that overrides the batch methods answers many nodes with
//! one cloud request; one that does not still works, one call per node.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, NodeAddress, Service};

/// What the manager hands a provider at start ([`CloudProvider::initialize`]).
#[derive(Clone)]
#[non_exhaustive]
pub struct ProviderInit {
    /// A Kubernetes client for the provider (e.g. to read its credential Secret), with its
    /// own `--kube-api-qps`/`--kube-api-burst` bucket and user agent
    /// `cloud-controller-manager/<version> (...)/cloud-provider`.
    pub client: kube::Client,
    /// Cancelled when the manager stops leading or shuts down: stop background work then.
    pub shutdown: tokio_util::sync::CancellationToken,
}

impl ProviderInit {
    /// An init value (for tests of providers).
    pub fn new(client: kube::Client, shutdown: tokio_util::sync::CancellationToken) -> Self {
        ProviderInit { client, shutdown }
    }
}

/// The concrete provider behind `cloud`, for a provider's own controllers (see
/// [`crate::manager::extensions`]): `None` when `cloud` is not a `T`.
pub fn downcast_provider<T: CloudProvider>(cloud: &Arc<dyn CloudProvider>) -> Option<Arc<T>> {
    let any: Arc<dyn std::any::Any + Send + Sync> = cloud.clone();
    any.downcast::<T>().ok()
}

/// A cloud provider: its name and the capabilities it supports.
pub trait CloudProvider: std::any::Any + Send + Sync + 'static {
    /// The provider name, as given to `--cloud-provider` (e.g. `aws`).
    fn name(&self) -> &str;

    /// Whether the provider knows which cluster it serves (e.g. from ownership tags).
    /// Without one the manager refuses to start unless `--allow-untagged-cloud` is set.
    fn has_cluster_id(&self) -> bool {
        true
    }

    /// What the provider skipped or ignored in its cloud config (unknown sections and keys,
    /// ignored settings), one sentence each, never quoting a value. The manager logs each and
    /// records it once as a `Warning` `CloudConfigWarning` Event at start. None by default.
    fn config_warnings(&self) -> Vec<String> {
        Vec::new()
    }

    /// Node metadata and existence; `None` when unsupported.
    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        None
    }

    /// Load balancers for `type: LoadBalancer` Services; `None` when unsupported.
    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        None
    }

    /// Routes for pod CIDRs; `None` when unsupported.
    fn routes(&self) -> Option<Arc<dyn Routes>> {
        None
    }

    /// Zones (deprecated; never used for nodes when InstancesV2 is supported).
    fn zones(&self) -> Option<Arc<dyn Zones>> {
        None
    }

    /// Cluster enumeration; `None` when unsupported.
    fn clusters(&self) -> Option<Arc<dyn Clusters>> {
        None
    }

    /// Pod CIDRs decided by the cloud, for node-IPAM's `CloudAllocator`; `None` when
    /// unsupported.
    fn node_cidrs(&self) -> Option<Arc<dyn NodeCidrs>> {
        None
    }

    /// Whether the provider names or tags cloud resources by `--cluster-name`, so that two
    /// clusters with the same name could claim each other's resources. The manager warns at
    /// start when this is true and `--cluster-name` is left at its default, `kubernetes`.
    fn names_resources_by_cluster(&self) -> bool {
        false
    }

    /// Registers the provider's own metrics (e.g. cloud API call counters) in the manager's
    /// registry, served on `/metrics` next to the controllers' metrics. Called once at start.
    fn register_metrics(&self, _registry: &mut prometheus_client::registry::Registry) {}

    /// Hands the provider a Kubernetes client, once, after leadership is acquired and before
    /// the first controller starts (upstream `Initialize(clientBuilder, stop)`). Spawn any
    /// background work (e.g. watching a credential Secret) and stop it when
    /// `init.shutdown` fires. An error stops the manager. The default does nothing.
    fn initialize(&self, _init: ProviderInit) -> Result<(), BoxError> {
        Ok(())
    }
}

/// What the cloud knows about the instance behind a Node.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct InstanceMetadata {
    /// Written to `spec.providerID` if that is empty (never changed afterwards).
    /// Conventionally `<provider>://<instance-id>`.
    pub provider_id: String,
    /// Written to `node.kubernetes.io/instance-type` and the deprecated beta label.
    pub instance_type: String,
    /// Written to `status.addresses` (order matters: it is kept).
    pub node_addresses: Vec<NodeAddress>,
    /// Written to `topology.kubernetes.io/zone` and the deprecated beta label.
    pub zone: String,
    /// Written to `topology.kubernetes.io/region` and the deprecated beta label.
    pub region: String,
    /// Extra labels; keys in the `kubernetes.io`/`k8s.io` namespaces are dropped and
    /// existing labels are never overwritten.
    pub additional_labels: BTreeMap<String, String>,
}

/// Existence and power state of an instance, as the lifecycle controller needs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstanceStatus {
    /// The instance is gone: the Node may be deleted.
    NotFound,
    /// The instance exists and is running (or in any state that is not shut down).
    Running,
    /// The instance exists but is shut down (stopped, powered off).
    Shutdown,
}

/// Node metadata and existence, for providers running outside the Kubernetes tree.
///
/// Implementations should identify the instance by `node.spec.providerID` first, and fall
/// back to the node name (or labels/annotations) when it is empty, because a new node may
/// not have a providerID yet.
///
/// # Deletion safety: only a positive answer says "gone"
///
/// The lifecycle controller deletes a Node when [`Self::instance_exists`] returns `Ok(false)`
/// or [`Self::instance_status_batch`] returns [`InstanceStatus::NotFound`]; an error only
/// skips the Node until the next pass. So every provider follows one rule:
///
/// - "gone" only from a lookup of a **known instance by its ID** whose answer positively
///   says so: the cloud reports that instance terminated/deleted, or answers "no such
///   instance" for the exact ID taken from the Node's providerID.
/// - "I could not find it by name" is **an error**, never "gone": a lookup by node name, DNS
///   name, label or annotation can miss a running instance (a missing or wrong ownership
///   tag, a name the cloud reports differently, another region, an eventually consistent
///   search index). A Node without providerID that matches no instance is kept.
/// - Anything uncertain (timeouts, throttling, partial or ambiguous answers, permission
///   errors, a providerID of another cloud) is an error. Errors never delete.
///
/// For metadata (node initialisation) "not found by name" is
/// [`ProviderError::InstanceNotFound`]: "not yet", retried with backoff; it never deletes.
#[async_trait]
pub trait InstancesV2: Send + Sync + 'static {
    /// Whether the instance exists. `Ok(false)` means "gone": the lifecycle controller will
    /// delete the Node, so return it only as the trait's deletion-safety rule allows (a
    /// positive answer about an instance looked up by its ID) and an error whenever the
    /// answer is not certain, including "not found by name". A stopped instance exists.
    async fn instance_exists(&self, node: &Node) -> Result<bool, ProviderError>;

    /// Whether the instance is shut down. Only asked for instances that exist.
    async fn instance_shutdown(&self, node: &Node) -> Result<bool, ProviderError>;

    /// The metadata to stamp on the Node. [`ProviderError::InstanceNotFound`] when the
    /// instance is not (yet) known: the node stays tainted and is retried with backoff.
    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata, ProviderError>;

    /// Metadata for many nodes, one result per node in the same order. The default asks
    /// one node at a time; override it to answer with one cloud request.
    async fn instance_metadata_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceMetadata, ProviderError>> {
        let calls = nodes.iter().map(|n| self.instance_metadata(n));
        futures::future::join_all(calls).await
    }

    /// Existence and shutdown state for many nodes, one result per node in the same order.
    /// [`InstanceStatus::NotFound`] deletes the Node: the deletion-safety rule of the trait
    /// applies to every node of the batch (a node looked up by name and not found is an
    /// error, not `NotFound`). The default combines [`Self::instance_exists`] and [`Self::instance_shutdown`] per
    /// node; override it to answer with one cloud request.
    async fn instance_status_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceStatus, ProviderError>> {
        let calls = nodes.iter().map(|n| async move {
            if !self.instance_exists(n).await? {
                return Ok(InstanceStatus::NotFound);
            }
            Ok(if self.instance_shutdown(n).await? {
                InstanceStatus::Shutdown
            } else {
                InstanceStatus::Running
            })
        });
        futures::future::join_all(calls).await
    }

    /// The most Nodes the controllers put in one batch call (default 500). A provider that
    /// splits a batch into list calls of `k` items answers best with a multiple of `k`: no
    /// call for a short remainder. A whole batch must fit the controller's deadline for one
    /// call (`instance_call_timeout`, 60 s): a batch that misses it fails every Node in it,
    /// and the retry costs the same, so a provider that looks Nodes up one by one answers
    /// with a small batch, and one that lists keeps its listing when a caller gives up.
    fn max_batch(&self) -> usize {
        500
    }
}

/// For providers whose batch methods do the work: [`InstancesV2::instance_exists`] answered
/// by [`InstancesV2::instance_status_batch`] for the one node.
pub async fn exists_from_batch<I: InstancesV2 + ?Sized>(
    instances: &I,
    node: &Node,
) -> Result<bool, ProviderError> {
    match instances.instance_status_batch(std::slice::from_ref(node)).await.pop() {
        Some(r) => r.map(|s| s != InstanceStatus::NotFound),
        None => Err(ProviderError::other("no answer for the node")),
    }
}

/// [`InstancesV2::instance_shutdown`] answered by [`InstancesV2::instance_status_batch`].
pub async fn shutdown_from_batch<I: InstancesV2 + ?Sized>(
    instances: &I,
    node: &Node,
) -> Result<bool, ProviderError> {
    match instances.instance_status_batch(std::slice::from_ref(node)).await.pop() {
        Some(r) => r.map(|s| s == InstanceStatus::Shutdown),
        None => Err(ProviderError::other("no answer for the node")),
    }
}

/// [`InstancesV2::instance_metadata`] answered by [`InstancesV2::instance_metadata_batch`].
pub async fn metadata_from_batch<I: InstancesV2 + ?Sized>(
    instances: &I,
    node: &Node,
) -> Result<InstanceMetadata, ProviderError> {
    let mut out = instances.instance_metadata_batch(std::slice::from_ref(node)).await;
    out.pop().unwrap_or_else(|| Err(ProviderError::other("no answer for the node")))
}

/// Cloud load balancers for `type: LoadBalancer` Services.
///
/// Implementations must treat the Service and Nodes as read-only. If another controller
/// handles a Service (e.g. by annotation), `ensure`/`update` return
/// [`ProviderError::ImplementedElsewhere`]; the finalizer is still managed.
#[async_trait]
pub trait LoadBalancer: Send + Sync + 'static {
    /// The status of the load balancer if it exists. Only load balancers this controller
    /// created count as existing.
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError>;

    /// The cloud name of the load balancer for this Service. The default is upstream's
    /// legacy name: `a` + the UID without dashes, at most 32 characters.
    fn load_balancer_name(&self, _cluster_name: &str, service: &Service) -> String {
        default_load_balancer_name(service)
    }

    /// Creates or updates the load balancer so it serves `service` on `nodes`; returns its
    /// status. May return [`ProviderError::RetryAfter`] to ask for a fixed-delay retry.
    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError>;

    /// Updates the backend hosts of an existing load balancer.
    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<(), ProviderError>;

    /// Deletes the load balancer and everything created for it. `Ok` when it is gone or
    /// never existed. Must not return `ImplementedElsewhere`.
    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> Result<(), ProviderError>;

    /// Operator tools (`orphans`, `migrate-check`; [`crate::ops`]): the load balancers of
    /// the kinds this provider manages that the cloud shows, each with the resources created
    /// for it and whether it is tagged (or named) as created by this cluster. Read-only.
    /// The default is [`ProviderError::NotImplemented`] (the tools say so).
    async fn list_cloud_load_balancers(
        &self,
        _cluster_name: &str,
    ) -> Result<Vec<CloudLoadBalancer>, ProviderError> {
        Err(ProviderError::NotImplemented)
    }

    /// Operator tool `orphans --delete`: deletes a load balancer listed by
    /// [`Self::list_cloud_load_balancers`] and the resources created for it. Must refuse
    /// ([`ProviderError::Invalid`]) one that is not [`CloudLoadBalancer::owned`], checking
    /// the cloud again rather than trusting the argument. The default is
    /// [`ProviderError::NotImplemented`].
    async fn delete_cloud_load_balancer(
        &self,
        _cluster_name: &str,
        _lb: &CloudLoadBalancer,
    ) -> Result<(), ProviderError> {
        Err(ProviderError::NotImplemented)
    }
}

/// A load balancer as the cloud shows it, for the operator tools.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CloudLoadBalancer {
    /// The cloud name (what [`LoadBalancer::load_balancer_name`] returns for its Service).
    pub name: String,
    /// What it is, for people (`classic ELB`, `NLB`, `VPC load balancer`).
    pub kind: String,
    /// The cloud's ID (ARN, ID).
    pub id: String,
    /// The hostnames and IPs clients use (what a Service's status shows).
    pub ingress: Vec<String>,
    /// Tagged (or, where the cloud has no tags, named) as created by this cluster. Only such
    /// load balancers are ever deleted by the tools.
    pub owned: bool,
    /// `<namespace>/<name>` of the Service it was created for, when the cloud records it.
    pub service: Option<String>,
    /// Resources created for it that go with it (security groups, target groups, IPs).
    pub resources: Vec<CloudResource>,
}

/// A cloud resource created for a load balancer.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct CloudResource {
    /// What it is (`security group`, `target group`, `public IP`).
    pub kind: String,
    /// The cloud's ID.
    pub id: String,
    /// Its name, when it has one.
    pub name: String,
}

/// Upstream's legacy load balancer name: `a` + UID without dashes, cut to 32 bytes.
pub fn default_load_balancer_name(service: &Service) -> String {
    let uid = service.metadata.uid.as_deref().unwrap_or_default();
    let mut name: String = std::iter::once('a').chain(uid.chars().filter(|c| *c != '-')).collect();
    name.truncate(32);
    name
}

/// A route sending a pod CIDR to a node.
#[derive(Debug, Clone, PartialEq)]
pub struct Route {
    /// Provider-assigned name (ignored on create).
    pub name: String,
    /// The node the traffic goes to; empty when the cloud's route has no known target.
    pub target_node: String,
    /// The node's addresses, for providers that route by address ([`Route::enable_node_addresses`]).
    pub target_node_addresses: Vec<NodeAddress>,
    /// Whether `target_node_addresses` is meaningful for this provider.
    pub enable_node_addresses: bool,
    /// The pod CIDR.
    pub destination_cidr: String,
    /// The target no longer exists; the route leads nowhere.
    pub blackhole: bool,
}

/// Routes for pod CIDRs in the cloud network.
#[async_trait]
pub trait Routes: Send + Sync + 'static {
    /// All routes of the cluster.
    async fn list_routes(&self, cluster_name: &str) -> Result<Vec<Route>, ProviderError>;

    /// Creates a route. `name_hint` is the node UID; a dual-stack node gets two routes with
    /// the same hint, so the provider must make names unique.
    async fn create_route(
        &self,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<(), ProviderError>;

    /// Deletes a route.
    async fn delete_route(&self, cluster_name: &str, route: &Route) -> Result<(), ProviderError>;
}

/// A failure domain.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Zone {
    /// The zone.
    pub failure_domain: String,
    /// The region.
    pub region: String,
}

/// Zone lookups (deprecated upstream; used for volume labelling).
#[async_trait]
pub trait Zones: Send + Sync + 'static {
    /// The zone of the instance with this providerID.
    async fn zone_by_provider_id(&self, provider_id: &str) -> Result<Zone, ProviderError>;
    /// The zone of the instance backing this node name.
    async fn zone_by_node_name(&self, node_name: &str) -> Result<Zone, ProviderError>;
}

/// Pod CIDRs the cloud assigned to instances (e.g. GCE alias IP ranges), for node-IPAM's
/// `CloudAllocator`.
#[async_trait]
pub trait NodeCidrs: Send + Sync + 'static {
    /// The pod CIDRs of the instance behind `node`, every IP family it has, in any order: the
    /// CloudAllocator keeps the families of the service CIDRs, in their order, and the first
    /// range of each. Empty when the cloud has none for it yet (a `CIDRNotAvailable` Event).
    async fn node_pod_cidrs(&self, node: &Node) -> Result<Vec<ipnet::IpNet>, ProviderError>;
}

/// Cluster enumeration.
#[async_trait]
pub trait Clusters: Send + Sync + 'static {
    /// Names of all clusters.
    async fn list_clusters(&self) -> Result<Vec<String>, ProviderError>;
    /// The address of the control plane of a cluster.
    async fn master(&self, cluster_name: &str) -> Result<String, ProviderError>;
}

/// A boxed error source.
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Errors a provider returns, with the meanings the controllers act on.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ProviderError {
    /// The instance does not exist (upstream `instance not found`).
    #[error("instance not found")]
    InstanceNotFound,
    /// The provider does not implement this call (upstream `unimplemented`).
    #[error("unimplemented")]
    NotImplemented,
    /// Another controller handles this object (upstream
    /// `implemented by alternate to cloud provider`).
    #[error("implemented by alternate to cloud provider")]
    ImplementedElsewhere,
    /// Retry after a fixed delay, without growing the backoff (upstream `RetryError`).
    #[error("{message} (retry after {delay:?})")]
    RetryAfter {
        /// What is pending.
        message: String,
        /// When to retry.
        delay: Duration,
    },
    /// The cloud throttled us; retried with backoff, never taken as "not found".
    #[error("throttled by the cloud API: {0}")]
    Throttled(String),
    /// Bad input (a Service annotation, a config value): retrying will not help until the
    /// object changes. The message names what is wrong.
    #[error("invalid {what}: {message}")]
    Invalid {
        /// What was invalid (e.g. the annotation key).
        what: String,
        /// Why.
        message: String,
    },
    /// Any other failure (network, authentication, cloud error), with context.
    #[error("{message}")]
    Other {
        /// What was being done and what failed.
        message: String,
        /// The underlying error.
        #[source]
        source: Option<BoxError>,
    },
}

impl ProviderError {
    /// An [`ProviderError::Other`] with a message and no source.
    pub fn other(message: impl Into<String>) -> Self {
        ProviderError::Other { message: message.into(), source: None }
    }

    /// An [`ProviderError::Other`] with a message and a source error.
    pub fn with_source(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        ProviderError::Other { message: message.into(), source: Some(source.into()) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    #[test]
    fn default_lb_name_strips_dashes_and_truncates() {
        let svc = Service {
            metadata: ObjectMeta {
                uid: Some("6f7f1b2c-1234-5678-9abc-def012345678".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let name = default_load_balancer_name(&svc);
        assert_eq!(name, "a6f7f1b2c123456789abcdef01234567");
        assert_eq!(name.len(), 32);
    }

    #[test]
    fn error_messages_match_upstream() {
        assert_eq!(ProviderError::InstanceNotFound.to_string(), "instance not found");
        assert_eq!(ProviderError::NotImplemented.to_string(), "unimplemented");
        assert_eq!(
            ProviderError::ImplementedElsewhere.to_string(),
            "implemented by alternate to cloud provider"
        );
    }
}
