//! Well-known Kubernetes names the controllers read and write: labels, taints, annotations,
//! finalizers, event reasons and controller names. One place, so operators replacing the
//! upstream CCM see byte-identical objects, and so a reader can grep one file.

/// Taint set by the kubelet (`--cloud-provider=external`) until the CCM initialised the node.
pub const TAINT_UNINITIALIZED: &str = "node.cloudprovider.kubernetes.io/uninitialized";
/// Taint the lifecycle controller puts on nodes whose instance is shut down.
pub const TAINT_SHUTDOWN: &str = "node.cloudprovider.kubernetes.io/shutdown";
/// Cluster-autoscaler's taint on nodes it is about to delete.
pub const TAINT_TO_BE_DELETED: &str = "ToBeDeletedByClusterAutoscaler";
/// Taint for nodes whose network is not ready.
pub const TAINT_NETWORK_UNAVAILABLE: &str = "node.kubernetes.io/network-unavailable";

/// Annotation with the node IP(s) the kubelet was told to use (`--node-ip`).
pub const ANNOTATION_PROVIDED_NODE_IP: &str = "alpha.kubernetes.io/provided-node-ip";
/// Annotation with load-balancer source ranges (used when the spec field is empty).
pub const ANNOTATION_LB_SOURCE_RANGES: &str =
    "service.beta.kubernetes.io/load-balancer-source-ranges";

/// Finalizer the service controller keeps on Services whose load balancer may exist.
pub const FINALIZER_LB_CLEANUP: &str = "service.kubernetes.io/load-balancer-cleanup";

/// Instance type label (GA).
pub const LABEL_INSTANCE_TYPE: &str = "node.kubernetes.io/instance-type";
/// Instance type label (deprecated beta).
pub const LABEL_INSTANCE_TYPE_BETA: &str = "beta.kubernetes.io/instance-type";
/// Zone label (GA).
pub const LABEL_ZONE: &str = "topology.kubernetes.io/zone";
/// Zone label (deprecated beta).
pub const LABEL_ZONE_BETA: &str = "failure-domain.beta.kubernetes.io/zone";
/// Region label (GA).
pub const LABEL_REGION: &str = "topology.kubernetes.io/region";
/// Region label (deprecated beta).
pub const LABEL_REGION_BETA: &str = "failure-domain.beta.kubernetes.io/region";
/// Nodes with this label are not load-balancer backends.
pub const LABEL_EXCLUDE_FROM_LB: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// Node condition type `Ready`.
pub const CONDITION_READY: &str = "Ready";
/// Node condition type `NetworkUnavailable`.
pub const CONDITION_NETWORK_UNAVAILABLE: &str = "NetworkUnavailable";

/// Event reasons, exactly as upstream emits them.
pub mod reasons {
    /// Node initialised (cloud-node controller).
    pub const SYNCED: &str = "Synced";
    /// Node deleted because its instance is gone (lifecycle controller).
    pub const DELETING_NODE: &str = "DeletingNode";
    /// Deleting a node failed (lifecycle controller).
    pub const DELETING_NODE_FAILED: &str = "DeletingNodeFailed";

    /// Service controller: about to create or update a load balancer.
    pub const ENSURING_LOAD_BALANCER: &str = "EnsuringLoadBalancer";
    /// Service controller: the load balancer is in place.
    pub const ENSURED_LOAD_BALANCER: &str = "EnsuredLoadBalancer";
    /// Service controller: about to delete a load balancer.
    pub const DELETING_LOAD_BALANCER: &str = "DeletingLoadBalancer";
    /// Service controller: the load balancer is gone (also sent when none existed).
    pub const DELETED_LOAD_BALANCER: &str = "DeletedLoadBalancer";
    /// Service controller: a sync failed (Warning).
    pub const SYNC_LOAD_BALANCER_FAILED: &str = "SyncLoadBalancerFailed";
    /// Service controller: deleting the load balancer of a vanished Service failed (Warning).
    pub const DELETE_LOAD_BALANCER_FAILED: &str = "DeleteLoadBalancerFailed";
    /// Service controller: the cloud asked for a retry after a delay (a load balancer still
    /// being created or changed, a resource still in use): Normal, not a failure. Not upstream,
    /// which records every sync error, this one included, as a Warning `SyncLoadBalancerFailed`
    /// (or `UpdateLoadBalancerFailed` in a node sync).
    pub const LOAD_BALANCER_PENDING: &str = "LoadBalancerPending";
    /// Service controller: backend hosts updated after a node-set change.
    pub const UPDATED_LOAD_BALANCER: &str = "UpdatedLoadBalancer";
    /// Service controller: updating backend hosts failed (Warning).
    pub const UPDATE_LOAD_BALANCER_FAILED: &str = "UpdateLoadBalancerFailed";
    /// Service controller: no node qualifies as a backend (Warning; upstream spelling).
    pub const UNAVAILABLE_LOAD_BALANCER: &str = "UnAvailableLoadBalancer";
    /// Route controller: creating a route failed (Warning, on the Node).
    pub const FAILED_TO_CREATE_ROUTE: &str = "FailedToCreateRoute";
    /// Route controller: `NetworkUnavailable=False` condition reason.
    pub const ROUTE_CREATED: &str = "RouteCreated";
    /// Route controller: `NetworkUnavailable=True` condition reason.
    pub const NO_ROUTE_CREATED: &str = "NoRouteCreated";
    /// Node IPAM: the cluster CIDR is exhausted.
    pub const CIDR_NOT_AVAILABLE: &str = "CIDRNotAvailable";
    /// Node IPAM: writing `spec.podCIDRs` failed.
    pub const CIDR_ASSIGNMENT_FAILED: &str = "CIDRAssignmentFailed";
    /// The provided-node-ip annotation matches no address the cloud reports, so the node
    /// stays tainted. Not upstream (upstream only logs); added so `kubectl describe node`
    /// explains why a node does not become schedulable.
    pub const PROVIDED_NODE_IP_INVALID: &str = "ProvidedNodeIPInvalid";
}

/// Controller names: canonical `--controllers` IDs, their upstream aliases, the names the
/// `running_managed_controllers` metric uses, and event-reporting components.
pub mod controllers {
    /// Canonical name of the cloud-node controller (alias [`CLOUD_NODE_ALIAS`]).
    pub const CLOUD_NODE: &str = "cloud-node-controller";
    /// Alias (and metric name) of the cloud-node controller.
    pub const CLOUD_NODE_ALIAS: &str = "cloud-node";
    /// Canonical name of the cloud-node-lifecycle controller.
    pub const CLOUD_NODE_LIFECYCLE: &str = "cloud-node-lifecycle-controller";
    /// Alias (and metric name) of the cloud-node-lifecycle controller.
    pub const CLOUD_NODE_LIFECYCLE_ALIAS: &str = "cloud-node-lifecycle";
    /// Canonical name of the service (load balancer) controller.
    pub const SERVICE_LB: &str = "service-lb-controller";
    /// Alias (and metric name) of the service controller.
    pub const SERVICE_LB_ALIAS: &str = "service";
    /// Canonical name of the route controller.
    pub const NODE_ROUTE: &str = "node-route-controller";
    /// Alias (and metric name) of the route controller.
    pub const NODE_ROUTE_ALIAS: &str = "route";
    /// Canonical name of the node-IPAM controller.
    pub const NODE_IPAM: &str = "node-ipam-controller";
    /// Alias (and metric name) of the node-IPAM controller.
    pub const NODE_IPAM_ALIAS: &str = "nodeipam";

    /// Event source of the cloud-node controller.
    pub const COMPONENT_CLOUD_NODE: &str = "cloud-node-controller";
    /// Event source of the cloud-node-lifecycle controller.
    pub const COMPONENT_CLOUD_NODE_LIFECYCLE: &str = "cloud-node-lifecycle-controller";
    /// Event source of the service controller.
    pub const COMPONENT_SERVICE: &str = "service-controller";
    /// Event source of the route controller (upstream uses an underscore here).
    pub const COMPONENT_ROUTE: &str = "route_controller";
    /// Event source of the node-IPAM allocator.
    pub const COMPONENT_IPAM: &str = "cidrAllocator";
}
