//! `CloudAllocator`: the cloud decides each Node's pod CIDRs (GCE alias IP ranges upstream);
//! this copies them to `spec.podCIDR(s)` and marks the node's network as ready
//! (`NetworkUnavailable=False`, reason `RouteCreated`, since the cloud routes implicitly).
//!
//! Queue `cloudCIDRAllocator`: per-node backoff 250 ms doubling to 15 s, 30 workers, a node
//! is dropped after 20 failed attempts (until its next qualifying update). Deleted nodes
//! need nothing: the cloud releases their ranges.
//!
//! **Families and order** (upstream's cluster stack type): the provider answers every range
//! the instance has (any order, at most one per family is used); the cluster's IP families
//! come from `--service-cluster-ip-range`: the family of its first CIDR first, the second
//! CIDR's next, IPv4 alone when none is set. `podCIDRs` gets, per family in that order, the
//! cloud's first range of the family; families the service CIDRs do not have are dropped.
//! So an IPv4-primary dual-stack cluster gets `[v4, v6]`, an IPv6-primary one `[v6, v4]`, a
//! single-stack one its family's range only.
//!
//! **No range**: when the cloud cannot be asked (any error) or has no range at all for the
//! node, the Node gets upstream's `Normal` Event `CIDRNotAvailable` (`Node <name> status is
//! now: CIDRNotAvailable`) and the node is retried. When it has ranges but none of a family
//! the cluster needs (a dual-stack cluster, an instance without IPv6), the node is retried
//! with an error naming the missing family and nothing is written, as upstream (no Event).
//!
//! Order of writes as upstream: `spec.podCIDR(s)` first, then `NetworkUnavailable=False`,
//! so a node never reports a ready network without its pod CIDR. The cloud lookup has a
//! deadline (`ControllerConfig::instance_call_timeout`); a timeout is retried like any error.

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::events::EventRecorder;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{EventType, Reporter};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::super::informer::{Change, Changes, Informer};
use super::super::service::WorkQueue;
use super::super::workqueue_metrics::QueueMetrics;
use crate::cloud::{NodeCidrs, ProviderError};
use crate::cloud_call::Deadline;
use crate::names::{self, controllers as cnames, reasons};

const WORKERS: usize = 30;
const MAX_RETRIES: u32 = 20;

/// Why one node could not be synced.
#[derive(Debug, thiserror::Error)]
enum SyncError {
    #[error("node {0} doesn't have providerID")]
    NoProviderId(String),
    #[error("failed to get pod CIDRs of node {node} from the cloud: {source}")]
    Cloud {
        node: String,
        #[source]
        source: ProviderError,
    },
    #[error("the cloud has no pod CIDR for node {0}")]
    NoCidr(String),
    #[error(
        "the cloud has no {missing} pod CIDR for node {node} (it has {cidrs:?}); the cluster's \
         service CIDRs make it {stack}"
    )]
    MissingFamily { node: String, missing: Family, stack: String, cidrs: Vec<IpNet> },
    #[error("failed to update node {node}: {source}")]
    Patch {
        node: String,
        #[source]
        source: kube::Error,
    },
}

pub(super) struct CloudAllocator {
    pub(super) client: kube::Client,
    pub(super) cloud: Arc<dyn NodeCidrs>,
    /// The cluster's IP families in `podCIDRs` order ([`stack`] of the service CIDRs).
    pub(super) stack: Vec<Family>,
    pub(super) shutdown: CancellationToken,
    /// Deadline of each cloud lookup.
    pub(super) deadline: Deadline,
    /// The `workqueue_*` metrics of the queue ([`QUEUE_NAME`]).
    pub(super) queue_metrics: QueueMetrics,
}

/// Upstream's name of the allocator's work queue (the `name` label of `workqueue_*`).
pub(super) const QUEUE_NAME: &str = "cloudCIDRAllocator";

fn needs_sync(node: &Node) -> bool {
    let spec = node.spec.as_ref();
    let no_cidr = spec.and_then(|s| s.pod_cidr.as_deref()).unwrap_or_default().is_empty();
    let net_ok = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|c| c.iter().find(|c| c.type_ == names::CONDITION_NETWORK_UNAVAILABLE))
        .is_some_and(|c| c.status == "False");
    let tainted = spec.and_then(|s| s.taints.as_ref()).is_some_and(|t| {
        t.iter().any(|t| t.key == names::TAINT_NETWORK_UNAVAILABLE && t.effect == "NoSchedule")
    });
    no_cidr || !net_ok || tainted
}

/// An IP family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Family {
    V4,
    V6,
}

impl Family {
    fn of(net: &IpNet) -> Family {
        match net {
            IpNet::V4(_) => Family::V4,
            IpNet::V6(_) => Family::V6,
        }
    }
}

impl std::fmt::Display for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// The cluster's IP families, in `podCIDRs` order, from its service CIDRs (upstream's
/// cluster stack type): the first CIDR's family, then the second's if it is the other one;
/// IPv4 alone without service CIDRs.
pub(super) fn stack(service_cidrs: &[IpNet]) -> Vec<Family> {
    let mut families: Vec<Family> = Vec::with_capacity(2);
    for f in service_cidrs.iter().map(Family::of) {
        if !families.contains(&f) {
            families.push(f);
        }
    }
    if families.is_empty() {
        families.push(Family::V4);
    }
    families
}

fn stack_name(stack: &[Family]) -> String {
    stack.iter().map(ToString::to_string).collect::<Vec<_>>().join("_")
}

/// The pod CIDRs of a node of a `stack` cluster from the cloud's ranges: per family of the
/// stack, in its order, the cloud's first range of that family. `Err` names the first family
/// the cloud has no range of.
fn select(cidrs: &[IpNet], stack: &[Family]) -> Result<Vec<IpNet>, Family> {
    stack.iter().map(|f| cidrs.iter().find(|c| Family::of(c) == *f).copied().ok_or(*f)).collect()
}

impl CloudAllocator {
    pub(super) async fn run(
        self: Arc<Self>,
        nodes: Arc<Informer<Node>>,
        mut changes: Changes<Node>,
    ) {
        let queue = WorkQueue::new(
            Duration::from_millis(250),
            Duration::from_secs(15),
            self.shutdown.clone(),
            self.queue_metrics.clone(),
        );
        let recorder = Arc::new(EventRecorder::new(
            self.client.clone(),
            Reporter::from(cnames::COMPONENT_IPAM),
        ));
        let q = queue.clone();
        tokio::spawn(async move {
            while let Some(change) = changes.recv().await {
                match change {
                    Change::Added(n) => q.add(&n.metadata.name.clone().unwrap_or_default()),
                    Change::Updated { new, .. } if needs_sync(&new) => {
                        q.add(&new.metadata.name.clone().unwrap_or_default())
                    }
                    _ => {}
                }
            }
        });
        tokio::select! {
            _ = self.shutdown.cancelled() => return,
            _ = nodes.wait_synced() => {}
        }
        let mut workers = Vec::new();
        for _ in 0..WORKERS {
            let (this, queue, nodes, recorder) =
                (self.clone(), queue.clone(), nodes.clone(), recorder.clone());
            workers.push(tokio::spawn(async move {
                while let Some(key) = queue.get().await {
                    match this.sync(&nodes, &recorder, &key).await {
                        Ok(()) => queue.forget(&key),
                        Err(e) if queue.failures(&key) < MAX_RETRIES => {
                            tracing::warn!(node = %key, error = %e, "CIDR from the cloud not applied; retrying");
                            queue.add_rate_limited(&key);
                        }
                        Err(e) => {
                            tracing::error!(node = %key, error = %e, "dropping node out of the CIDR queue after {MAX_RETRIES} attempts");
                            queue.forget(&key);
                        }
                    }
                    queue.done(&key);
                }
            }));
        }
        for w in workers {
            let _ = w.await;
        }
    }

    async fn event(&self, recorder: &EventRecorder, node: &Node, status: &str) {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let note = format!("Node {name} status is now: {status}");
        crate::controllers::events::publish(
            recorder,
            node,
            EventType::Normal,
            status,
            "AllocateCIDR",
            note,
        )
        .await;
    }

    async fn sync(
        &self,
        nodes: &Informer<Node>,
        recorder: &EventRecorder,
        name: &str,
    ) -> Result<(), SyncError> {
        let Some(node) = nodes.get(name) else { return Ok(()) };
        let spec = node.spec.clone().unwrap_or_default();
        if spec.provider_id.as_deref().unwrap_or_default().is_empty() {
            return Err(SyncError::NoProviderId(name.into()));
        }
        let cidrs =
            match self.deadline.try_run("NodePodCIDRs", self.cloud.node_pod_cidrs(&node)).await {
                Ok(c) => c,
                Err(source) => {
                    // As upstream: the instance could not be read, so no CIDR is available.
                    self.event(recorder, &node, reasons::CIDR_NOT_AVAILABLE).await;
                    return Err(SyncError::Cloud { node: name.into(), source });
                }
            };
        if cidrs.is_empty() {
            self.event(recorder, &node, reasons::CIDR_NOT_AVAILABLE).await;
            return Err(SyncError::NoCidr(name.into()));
        }
        let cidrs = select(&cidrs, &self.stack).map_err(|missing| SyncError::MissingFamily {
            node: name.into(),
            missing,
            stack: stack_name(&self.stack),
            cidrs,
        })?;
        let want: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        let api = Api::<Node>::all(self.client.clone());
        let patch_err = |source| SyncError::Patch { node: name.into(), source };
        let have = spec.pod_cidrs.clone().unwrap_or_default();
        if have.is_empty() {
            let patch = json!({"spec": {"podCIDR": want[0], "podCIDRs": want}});
            if let Err(e) = api.patch(name, &PatchParams::default(), &Patch::Strategic(patch)).await
            {
                self.event(recorder, &node, reasons::CIDR_ASSIGNMENT_FAILED).await;
                return Err(patch_err(e));
            }
            tracing::info!(node = name, cidrs = ?want, "set node pod CIDRs from the cloud");
        } else if have != want {
            tracing::warn!(
                node = name,
                ?have,
                ?want,
                "node has other pod CIDRs than the cloud; left alone (they are immutable)"
            );
        }
        // After the pod CIDR, as upstream: the network is only reported ready once the node
        // has its range.
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let cond = json!({"status": {"conditions": [{
            "type": names::CONDITION_NETWORK_UNAVAILABLE,
            "status": "False",
            "reason": reasons::ROUTE_CREATED,
            "message": "NodeController create implicit route",
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }]}});
        api.patch_status(name, &PatchParams::default(), &Patch::Strategic(cond))
            .await
            .map_err(patch_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|c| c.parse().unwrap()).collect()
    }

    #[test]
    fn the_service_cidrs_make_the_stack() {
        use Family::{V4, V6};
        assert_eq!(stack(&[]), [V4], "IPv4 without service CIDRs, as upstream");
        assert_eq!(stack(&nets(&["10.96.0.0/12"])), [V4]);
        assert_eq!(stack(&nets(&["fd00:96::/112"])), [V6]);
        assert_eq!(stack(&nets(&["10.96.0.0/12", "fd00:96::/112"])), [V4, V6]);
        assert_eq!(stack(&nets(&["fd00:96::/112", "10.96.0.0/12"])), [V6, V4]);
        assert_eq!(stack_name(&[V6, V4]), "IPv6_IPv4");
    }

    #[test]
    fn pod_cidrs_follow_the_stack_and_drop_other_families() {
        use Family::{V4, V6};
        let cloud = nets(&["fd00:1::/112", "10.1.0.0/24", "10.2.0.0/24"]);
        let s = |v: Vec<IpNet>| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(s(select(&cloud, &[V4, V6]).unwrap()), ["10.1.0.0/24", "fd00:1::/112"]);
        assert_eq!(s(select(&cloud, &[V6, V4]).unwrap()), ["fd00:1::/112", "10.1.0.0/24"]);
        assert_eq!(s(select(&cloud, &[V4]).unwrap()), ["10.1.0.0/24"]);
        assert_eq!(s(select(&cloud, &[V6]).unwrap()), ["fd00:1::/112"]);
        let v4_only = nets(&["10.1.0.0/24"]);
        assert_eq!(select(&v4_only, &[V4, V6]), Err(V6));
        assert_eq!(select(&v4_only, &[V6]), Err(V6));
    }

    #[test]
    fn nodes_need_sync_until_they_have_a_cidr_and_a_ready_network() {
        let mut n = Node::default();
        assert!(needs_sync(&n));
        n.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            pod_cidr: Some("10.0.0.0/24".into()),
            ..Default::default()
        });
        assert!(needs_sync(&n), "NetworkUnavailable not False yet");
        n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            conditions: Some(vec![k8s_openapi::api::core::v1::NodeCondition {
                type_: "NetworkUnavailable".into(),
                status: "False".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert!(!needs_sync(&n));
    }
}
