//! The cloud-node-lifecycle controller: deletes Nodes whose instance is gone and taints
//! Nodes whose instance is shut down.
//!
//! ```text
//!  every --node-monitor-period (5s), over the Node watch cache:
//!    Ready=True   ──▶ remove node.cloudprovider.kubernetes.io/shutdown:NoSchedule if present
//!    otherwise    ──▶ InstancesV2::instance_status_batch (one call for all such nodes)
//!                       NotFound ──▶ event DeletingNode, DELETE Node (uid precondition)
//!                       Shutdown ──▶ add the shutdown taint
//!                       error    ──▶ log; skip the node this pass (never delete on doubt)
//! ```
//!
//! Safety: a node is only deleted on a definite "not found" from the provider. Cloud
//! errors, throttling and timeouts skip the node for the pass. The delete carries the node's
//! UID as a precondition, so a node re-registered under the same name is never deleted by a
//! stale decision (an improvement on upstream, which deletes by name).

use std::sync::Arc;
use std::time::Duration;

use crate::controllers::events::EventRecorder;
use k8s_openapi::api::core::v1::{Node, Taint};
use kube::api::{DeleteParams, Patch, PatchParams, Preconditions};
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::reflector::Store;
use kube::{Api, ResourceExt};

use super::node_util;
use super::{ControllerContext, StartError, Started};
use crate::cloud::{InstanceStatus, InstancesV2};
use crate::cloud_call::Deadline;
use crate::names::{self, controllers as cnames, reasons};

/// Starts the lifecycle controller; skipped when the cloud has no InstancesV2.
pub fn start(ctx: &ControllerContext) -> Result<Started, StartError> {
    let Some(instances) = ctx.cloud.instances_v2() else {
        return Ok(Started::Skipped("cloud provider does not support instances".into()));
    };
    let ctx = ctx.clone();
    Ok(Started::Running(Box::pin(run(ctx, instances))))
}

async fn run(ctx: ControllerContext, instances: Arc<dyn InstancesV2>) {
    let nodes: Api<Node> = Api::all(ctx.client.clone());
    // The shared Node cache (read on each pass; no change stream).
    let informer = super::informer::nodes_for(&ctx, None);
    let Some(store) = informer.synced_reader(&ctx.shutdown).await else { return };
    let recorder = EventRecorder::new(
        ctx.events_client(),
        Reporter { controller: cnames::COMPONENT_CLOUD_NODE_LIFECYCLE.into(), instance: None },
    );
    // A pass's cloud lookups give up after `instance_call_timeout` (the nodes are skipped,
    // not deleted).
    let deadline = Deadline::new(ctx.config.instance_call_timeout);
    let monitor =
        monitor_loop(store, nodes, instances, recorder, ctx.config.node_monitor_period, deadline);
    tokio::select! {
        _ = monitor => {}
        _ = ctx.shutdown.cancelled() => {}
    }
    tracing::info!("cloud-node-lifecycle controller stopped");
}

async fn monitor_loop(
    store: Store<Node>,
    nodes: Api<Node>,
    instances: Arc<dyn InstancesV2>,
    recorder: EventRecorder,
    period: Duration,
    deadline: Deadline,
) {
    if store.wait_until_ready().await.is_err() {
        return;
    }
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        monitor_nodes(&store, &nodes, instances.as_ref(), &recorder, deadline).await;
    }
}

fn shutdown_taint() -> Taint {
    Taint {
        key: names::TAINT_SHUTDOWN.into(),
        effect: "NoSchedule".into(),
        value: None,
        time_added: None,
    }
}

fn has_shutdown_taint(node: &Node) -> bool {
    node_util::taints(node)
        .iter()
        .any(|t| t.key == names::TAINT_SHUTDOWN && t.effect == "NoSchedule")
}

/// One pass over all nodes.
pub(crate) async fn monitor_nodes(
    store: &Store<Node>,
    nodes: &Api<Node>,
    instances: &dyn InstancesV2,
    recorder: &EventRecorder,
    deadline: Deadline,
) {
    let all = store.state();
    let mut not_ready = Vec::new();
    for node in &all {
        if node_util::ready_status(node) == "True" {
            if has_shutdown_taint(node) {
                set_shutdown_taint(nodes, node, false).await;
            }
        } else {
            not_ready.push((**node).clone());
        }
    }
    for chunk in not_ready.chunks(instances.max_batch().max(1)) {
        let statuses =
            match deadline.run("InstanceStatus", instances.instance_status_batch(chunk)).await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(
                        nodes = chunk.len(),
                        error = %e,
                        "skipping these nodes this pass"
                    );
                    continue;
                }
            };
        if statuses.len() != chunk.len() {
            tracing::error!(
                asked = chunk.len(),
                answered = statuses.len(),
                "provider answered a status batch with the wrong count; skipping"
            );
            continue;
        }
        for (node, status) in chunk.iter().zip(statuses) {
            let name = node.name_any();
            match status {
                Err(e) => tracing::warn!(node = %name, error = %e, "error checking if node exists"),
                Ok(InstanceStatus::NotFound) => delete_node(nodes, node, recorder).await,
                Ok(InstanceStatus::Shutdown) => {
                    if !has_shutdown_taint(node) {
                        set_shutdown_taint(nodes, node, true).await;
                    }
                }
                Ok(InstanceStatus::Running) => {}
            }
        }
    }
}

async fn delete_node(nodes: &Api<Node>, node: &Node, recorder: &EventRecorder) {
    let name = node.name_any();
    publish(
        recorder,
        node,
        EventType::Normal,
        reasons::DELETING_NODE,
        format!("Deleting node {name} because it does not exist in the cloud provider"),
    )
    .await;
    let params = DeleteParams {
        preconditions: Some(Preconditions {
            uid: node.metadata.uid.clone(),
            resource_version: None,
        }),
        ..Default::default()
    };
    match nodes.delete(&name, &params).await {
        Ok(_) => tracing::info!(node = %name, "deleted node: its instance no longer exists"),
        Err(kube::Error::Api(s)) if s.code == 404 => {}
        Err(e) => {
            tracing::warn!(node = %name, error = %e, "failed deleting node");
            publish(
                recorder,
                node,
                EventType::Warning,
                reasons::DELETING_NODE_FAILED,
                format!("Failed deleting node {name}: {e}"),
            )
            .await;
        }
    }
}

/// Adds or removes the shutdown taint with optimistic concurrency (the patch carries the
/// resourceVersion the decision was made on; a conflict retries at the next pass).
async fn set_shutdown_taint(nodes: &Api<Node>, node: &Node, present: bool) {
    let name = node.name_any();
    let mut taints: Vec<Taint> = node_util::taints(node)
        .iter()
        .filter(|t| !(t.key == names::TAINT_SHUTDOWN && t.effect == "NoSchedule"))
        .cloned()
        .collect();
    if present {
        taints.push(shutdown_taint());
    }
    let patch = serde_json::json!({
        "metadata": {"resourceVersion": node.resource_version()},
        "spec": {"taints": taints},
    });
    match nodes.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => tracing::info!(node = %name, shutdown = present, "updated shutdown taint"),
        Err(e) => {
            tracing::warn!(node = %name, error = %e, "failed to apply shutdown taint to node, it may have been deleted")
        }
    }
}

async fn publish(
    recorder: &EventRecorder,
    node: &Node,
    type_: EventType,
    reason: &str,
    note: String,
) {
    super::events::publish(recorder, node, type_, reason, "MonitorNode", note).await;
}
