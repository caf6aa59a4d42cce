//! The route controller: owns the cloud routes that send each node's pod CIDRs to it, and
//! the Nodes' `NetworkUnavailable` condition (spec §5).
//!
//! Every `--route-reconciliation-period` (first run at once, period counted from each run's
//! start) it lists the cloud's routes and the Nodes, deletes routes inside `--cluster-cidr`
//! that are blackholed or belong to no node's pod CIDR, creates one route per pod CIDR
//! (dual-stack nodes get two, both with the node UID as name hint), at most 200 cloud
//! operations in flight, and then sets `NetworkUnavailable` (`RouteCreated` /
//! `NoRouteCreated`). Routes outside the cluster CIDRs are never touched.
//!
//! Upstream decisions:
//! - Kept: a failed creation is not retried within a pass (the next pass retries it); it
//!   emits `FailedToCreateRoute` on the Node and leaves `NetworkUnavailable=True`.
//! - **FIX** (QUIRK in spec §5.3): upstream treats a failed creation as success when it has
//!   no event recorder. There is always a recorder here, and a failure is a failure.
//! - **FIX**: upstream waits for deletions before creations only for providers that track
//!   node addresses; otherwise both run at once, so an `update` (delete + re-create of the
//!   same CIDR) can race with itself. Here deletions always finish first.
//! - Every cloud call has a deadline (`ControllerConfig::route_call_timeout`); a timed-out
//!   call counts as failed and the next pass retries it.
//! - The Node cache keeps only the current version of each Node (no change stream: the
//!   controller is periodic), so memory does not grow with Node updates.
//! - Kept: the watch-based mode behind the alpha gate
//!   `CloudControllerManagerWatchBasedRoutesReconciliation` is not implemented; the periodic
//!   mode is upstream's default.

mod plan;

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::controllers::events::EventRecorder;
use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{EventType, Reporter};

use prometheus_client::metrics::counter::Counter;
use serde_json::json;

use super::informer::{self, Informer};
use super::probe::Probe;
use super::{ControllerContext, StartError, Started};
use crate::cloud::{self, ProviderError, Routes};
use crate::cloud_call::Deadline;
use crate::names::{self, controllers as cnames, reasons};

/// Most route creations or deletions in flight (upstream `maxConcurrentRouteOperations`).
pub const MAX_CONCURRENT_ROUTE_OPERATIONS: usize = 200;

/// Tunables of the route controller. [`start`] uses the defaults.
#[derive(Debug, Clone, Default)]
pub struct RouteOptions {
    /// Consider only Nodes matching this label selector (`None`: all Nodes). For tests.
    pub node_selector: Option<String>,
    /// Where to publish debug gauges: `retained_node_versions` (Node versions the
    /// controller keeps in memory). For tests.
    pub probe: Option<Probe>,
}

/// Probe gauge: how many Node versions the route controller keeps in memory.
pub const PROBE_RETAINED_NODE_VERSIONS: &str = "retained_node_versions";
/// Probe gauge: `name@resourceVersion` of every Node in the route controller's cache.
pub const PROBE_CACHED_NODES: &str = "cached_nodes";

/// Starts the route controller with upstream's settings.
pub fn start(ctx: &ControllerContext) -> Result<Started, StartError> {
    start_with(ctx, RouteOptions::default())
}

/// Validates the cluster CIDRs as upstream does (spec §5.1): one CIDR, or two of different
/// families.
pub(crate) fn validate_cluster_cidrs(
    controller: &'static str,
    cidrs: &[IpNet],
) -> Result<(), StartError> {
    let err = |message: String| Err(StartError { controller, message });
    match cidrs {
        [] => err("--cluster-cidr must be set".into()),
        [_] => Ok(()),
        [a, b] if matches!(a, IpNet::V4(_)) != matches!(b, IpNet::V4(_)) => Ok(()),
        [_, _] => err(format!(
            "--cluster-cidr: len of ClusterCIDRs=={} and they are not configured as dual stack (at least one from each IPFamily)",
            cidrs.len()
        )),
        _ => err(format!(
            "--cluster-cidr: length of clusterCIDRs is:{} more than max allowed of 2",
            cidrs.len()
        )),
    }
}

/// Starts the route controller with explicit tunables.
pub fn start_with(ctx: &ControllerContext, opts: RouteOptions) -> Result<Started, StartError> {
    if !ctx.config.configure_cloud_routes {
        return Ok(Started::Skipped("--configure-cloud-routes is false".into()));
    }
    let Some(routes) = ctx.cloud.routes() else {
        return Ok(Started::Skipped(
            "--configure-cloud-routes is set, but cloud provider does not support routes. Will not configure cloud provider routes.".into(),
        ));
    };
    validate_cluster_cidrs(cnames::NODE_ROUTE, &ctx.config.cluster_cidrs)?;
    let route_sync = Counter::default();
    ctx.metrics.lock().unwrap_or_else(|p| p.into_inner()).register(
        "route_controller_route_sync",
        "A metric counting the amount of times routes have been synced with the cloud provider.",
        route_sync.clone(),
    );
    let c = RouteController {
        client: ctx.client.clone(),
        routes,
        cluster_name: ctx.config.cluster_name.clone(),
        cluster_cidrs: ctx.config.cluster_cidrs.clone(),
        recorder: EventRecorder::new(ctx.events_client(), Reporter::from(cnames::COMPONENT_ROUTE)),
        route_sync,
        deadline: Deadline::new(ctx.config.route_call_timeout),
    };
    let (ctx, period) = (ctx.clone(), ctx.config.route_reconciliation_period);
    Ok(Started::Running(Box::pin(async move {
        // Cache only (no change stream): the controller is periodic and reads the cache on
        // each pass.
        let nodes = informer::nodes_for(&ctx, opts.node_selector.as_deref());
        if let Some(probe) = &opts.probe {
            let n = nodes.clone();
            probe.register_count(PROBE_RETAINED_NODE_VERSIONS, move || n.retained_versions());
            let n = nodes.clone();
            probe.register_keys(PROBE_CACHED_NODES, move || {
                n.list()
                    .iter()
                    .map(|node| {
                        let m = &node.metadata;
                        format!(
                            "{}@{}",
                            m.name.as_deref().unwrap_or_default(),
                            m.resource_version.as_deref().unwrap_or_default()
                        )
                    })
                    .collect()
            });
        }
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            _ = nodes.wait_synced() => {}
        }
        tracing::info!(?period, cidrs = ?c.cluster_cidrs, "route controller started");
        let mut tick = tokio::time::interval(period.max(Duration::from_millis(10)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ctx.shutdown.cancelled() => return,
                _ = tick.tick() => {}
            }
            if let Err(e) = c.reconcile(&nodes).await {
                tracing::warn!(error = %e, "Couldn't reconcile node routes");
            }
        }
    })))
}

/// Why a reconciliation pass failed.
#[derive(Debug, thiserror::Error)]
enum RouteError {
    #[error("error listing routes: {0}")]
    List(#[source] ProviderError),
}

/// A `NetworkUnavailable` condition to write.
struct CondUpdate {
    node: String,
    status: &'static str,
    reason: &'static str,
    message: &'static str,
}

struct RouteController {
    client: kube::Client,
    routes: Arc<dyn Routes>,
    cluster_name: String,
    cluster_cidrs: Vec<IpNet>,
    recorder: EventRecorder,
    route_sync: Counter,
    deadline: Deadline,
}

impl RouteController {
    /// One pass (boxed, so the future's `Send` bound is checked here, not by the caller).
    fn reconcile<'a>(
        &'a self,
        nodes: &'a Informer<Node>,
    ) -> futures::future::BoxFuture<'a, Result<(), RouteError>> {
        Box::pin(self.reconcile_inner(nodes))
    }

    async fn reconcile_inner(&self, nodes: &Informer<Node>) -> Result<(), RouteError> {
        self.route_sync.inc();
        let routes = self
            .deadline
            .try_run("ListRoutes", self.routes.list_routes(&self.cluster_name))
            .await
            .map_err(RouteError::List)?;
        let nodes = nodes.list();
        let node_refs: Vec<&Node> = nodes.iter().map(|n| n.as_ref()).collect();
        let mut p = plan::plan(&routes, &node_refs, &self.cluster_cidrs);

        let _: Vec<()> = futures::stream::iter(p.deletes.clone())
            .map(|r| async move { self.delete_one(&r).await })
            .buffer_unordered(MAX_CONCURRENT_ROUTE_OPERATIONS)
            .collect()
            .await;
        let nodes_ref = &nodes;
        let results: Vec<(String, String, bool)> = futures::stream::iter(p.creates.clone())
            .map(|c| async move { self.create_one(&c, nodes_ref).await })
            .buffer_unordered(MAX_CONCURRENT_ROUTE_OPERATIONS)
            .collect()
            .await;
        for (node, cidr, ok) in results {
            if ok && let Some(a) = p.actions.get_mut(&node).and_then(|a| a.get_mut(&cidr)) {
                *a = plan::Action::Keep;
            }
        }

        let updates = nodes.iter().filter_map(|n| {
            let name = n.metadata.name.as_deref()?;
            let actions = p.actions.get(name)?;
            let (status, reason, message) = plan::network_condition(actions);
            let current =
                n.status.as_ref().and_then(|s| s.conditions.as_ref()).and_then(|c| {
                    c.iter().find(|c| c.type_ == names::CONDITION_NETWORK_UNAVAILABLE)
                });
            if current.is_some_and(|c| c.status == status && c.reason.as_deref() == Some(reason)) {
                return None;
            }
            Some(CondUpdate { node: name.to_string(), status, reason, message })
        });
        let updates: Vec<CondUpdate> = updates.collect();
        let _: Vec<()> = futures::stream::iter(updates)
            .map(|u| self.update_condition(u))
            .buffer_unordered(MAX_CONCURRENT_ROUTE_OPERATIONS)
            .collect()
            .await;
        Ok(())
    }

    async fn delete_one(&self, r: &cloud::Route) {
        match self
            .deadline
            .try_run("DeleteRoute", self.routes.delete_route(&self.cluster_name, r))
            .await
        {
            Ok(()) => {
                tracing::info!(route = %r.name, cidr = %r.destination_cidr, node = %r.target_node, "deleted route")
            }
            Err(e) => {
                tracing::warn!(route = %r.name, cidr = %r.destination_cidr, error = %e, "could not delete route")
            }
        }
    }

    async fn create_one(&self, c: &plan::Create, nodes: &[Arc<Node>]) -> (String, String, bool) {
        let start = Instant::now();
        let res = self
            .deadline
            .try_run(
                "CreateRoute",
                self.routes.create_route(&self.cluster_name, &c.name_hint, &c.route),
            )
            .await;
        let cidr = c.route.destination_cidr.clone();
        match res {
            Ok(()) => {
                tracing::info!(node = %c.node, %cidr, "created route");
                (c.node.clone(), cidr, true)
            }
            Err(e) => {
                let msg = format!(
                    "Could not create route {} {} for node {} after {:?}: {e}",
                    c.name_hint,
                    cidr,
                    c.node,
                    start.elapsed()
                );
                tracing::warn!("{msg}");
                if let Some(node) =
                    nodes.iter().find(|n| n.metadata.name.as_deref() == Some(&c.node))
                {
                    self.event(node, msg).await;
                }
                (c.node.clone(), cidr, false)
            }
        }
    }

    async fn update_condition(&self, u: CondUpdate) {
        if let Err(e) = self.set_network_condition(&u.node, u.status, u.reason, u.message).await {
            tracing::warn!(node = %u.node, error = %e, "Error updating node NetworkUnavailable condition");
        }
    }

    async fn set_network_condition(
        &self,
        node: &str,
        status: &str,
        reason: &str,
        message: &str,
    ) -> Result<(), kube::Error> {
        let now = Time(k8s_openapi::jiff::Timestamp::now());
        let patch = json!({"status": {"conditions": [{
            "type": names::CONDITION_NETWORK_UNAVAILABLE,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": now,
            "lastTransitionTime": now,
        }]}});
        Api::<Node>::all(self.client.clone())
            .patch_status(node, &PatchParams::default(), &Patch::Strategic(patch))
            .await
            .map(|_| ())
    }

    async fn event(&self, node: &Node, note: String) {
        let reason = reasons::FAILED_TO_CREATE_ROUTE;
        crate::controllers::events::publish(
            &self.recorder,
            node,
            EventType::Warning,
            reason,
            "CreateRoute",
            note,
        )
        .await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_cidr_validation_names_the_flag() {
        let v4: IpNet = "10.244.0.0/16".parse().unwrap();
        let v4b: IpNet = "10.245.0.0/16".parse().unwrap();
        let v6: IpNet = "fd00::/56".parse().unwrap();
        assert!(validate_cluster_cidrs("route", &[v4]).is_ok());
        assert!(validate_cluster_cidrs("route", &[v4, v6]).is_ok());
        let e = validate_cluster_cidrs("route", &[]).unwrap_err();
        assert!(e.message.contains("--cluster-cidr"), "{e}");
        let e = validate_cluster_cidrs("route", &[v4, v4b]).unwrap_err();
        assert!(e.message.contains("not configured as dual stack"), "{e}");
        let e = validate_cluster_cidrs("route", &[v4, v6, v4b]).unwrap_err();
        assert!(e.message.contains("more than max allowed of 2"), "{e}");
    }
}
