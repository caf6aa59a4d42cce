//! The node-IPAM controller: owns `spec.podCIDR` / `spec.podCIDRs` of Nodes when
//! `--allocate-node-cidrs` is set (spec §6).
//!
//! `RangeAllocator` (the default) hands out `/--node-cidr-mask-size-ipv4` and
//! `/--node-cidr-mask-size-ipv6` subnets of each `--cluster-cidr` (one per family on
//! dual-stack clusters) from an in-memory bitmap ([`cidr_set`]). On start it waits for the
//! full Node list and rebuilds the bitmap from every Node's existing pod CIDRs, and reserves
//! `--service-cluster-ip-range` wherever it overlaps a cluster CIDR, so a restart never hands
//! out a CIDR twice. Nodes without pod CIDRs get one per family, written with a strategic
//! merge patch by at most 30 concurrent writers; a deleted Node's CIDRs are released.
//! Exhaustion emits `CIDRNotAvailable` on the Node; a failed write `CIDRAssignmentFailed`.
//!
//! `CloudAllocator` ([`cloud_allocator`]) asks the provider ([`crate::cloud::NodeCidrs`])
//! and keeps the families of the service CIDRs, in their order; a provider without that
//! capability makes it a start error naming the flag.
//!
//! Upstream decisions:
//! - Kept: allocation is retried by later Node updates (upstream: kubelet heartbeats), not
//!   by a timer, when the range is exhausted.
//! - **FIX**: upstream fails the whole controller when one Node carries an unparsable pod
//!   CIDR at start. Here that Node is logged and skipped; the others are still protected.
//! - **FIX**: when a Node turned out to have other CIDRs than the ones reserved for it,
//!   upstream releases its reservation but does not mark the Node's actual CIDRs as taken.
//!   Here they are occupied too.
//! - Kept: `--allocate-node-cidrs=false` means "not started" (sample CCM), not an error
//!   (GCP's fork).

mod cidr_set;
mod cloud_allocator;

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::controllers::events::EventRecorder;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{EventType, Reporter};

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use serde_json::json;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use super::informer::{self, Change, Changes, Informer};
use super::{ControllerContext, StartError, Started};
use crate::names::{controllers as cnames, reasons};
use cidr_set::{CidrSet, CidrSetError};

/// Concurrent `spec.podCIDRs` writers (upstream `cidrUpdateWorkers`).
const CIDR_UPDATE_WORKERS: usize = 30;
/// Patch attempts per Node before giving up for now (upstream `cidrUpdateRetries`).
const CIDR_UPDATE_RETRIES: usize = 3;
/// `--cidr-allocator-type` values.
const RANGE_ALLOCATOR: &str = "RangeAllocator";
const CLOUD_ALLOCATOR: &str = "CloudAllocator";

/// Tunables of the node-IPAM controller. [`start`] uses the defaults.
#[derive(Debug, Clone, Default)]
pub struct IpamOptions {
    /// Consider only Nodes matching this label selector (`None`: all Nodes). For tests.
    pub node_selector: Option<String>,
}

/// Starts the node-IPAM controller with upstream's settings.
pub fn start(ctx: &ControllerContext) -> Result<Started, StartError> {
    start_with(ctx, IpamOptions::default())
}

fn start_error(message: String) -> StartError {
    StartError { controller: cnames::NODE_IPAM, message }
}

fn is_v4(n: &IpNet) -> bool {
    matches!(n, IpNet::V4(_))
}

/// Two service CIDRs must be of different families (upstream checks this for every
/// allocator).
fn validate_service_cidrs(config: &super::ControllerConfig) -> Result<(), StartError> {
    if let [a, b] = config.service_cidrs.as_slice()
        && is_v4(a) == is_v4(b)
    {
        return Err(start_error(
            "--service-cluster-ip-range: serviceCIDR and secondaryServiceCIDR are not dualstack (from different IPfamiles)".into(),
        ));
    }
    Ok(())
}

/// Builds one CIDR set per cluster CIDR from the configuration, validating it as upstream
/// does (spec §6.3).
fn cidr_sets(config: &super::ControllerConfig) -> Result<Vec<CidrSet>, StartError> {
    if config.cluster_cidrs.is_empty() {
        return Err(start_error(
            "Controller: Must specify --cluster-cidr if --allocate-node-cidrs is set".into(),
        ));
    }
    super::route::validate_cluster_cidrs(cnames::NODE_IPAM, &config.cluster_cidrs)?;
    validate_service_cidrs(config)?;
    config
        .cluster_cidrs
        .iter()
        .map(|c| {
            let (mask, flag) = if is_v4(c) {
                (config.node_cidr_mask_size_ipv4, "--node-cidr-mask-size-ipv4")
            } else {
                (config.node_cidr_mask_size_ipv6, "--node-cidr-mask-size-ipv6")
            };
            CidrSet::new(*c, mask).map_err(|e| match e {
                CidrSetError::MaskTooSmall { .. } => start_error(format!(
                    "Controller: Invalid --cluster-cidr, mask size of cluster CIDR must be less than or equal to --node-cidr-mask-size configured for CIDR family ({c}, {flag}={mask})"
                )),
                e => start_error(format!("--cluster-cidr {c} with {flag}={mask}: {e}")),
            })
        })
        .collect()
}

/// Starts the node-IPAM controller with explicit tunables.
pub fn start_with(ctx: &ControllerContext, opts: IpamOptions) -> Result<Started, StartError> {
    if !ctx.config.allocate_node_cidrs {
        return Ok(Started::Skipped("--allocate-node-cidrs is not set".into()));
    }
    match ctx.config.cidr_allocator_type.as_str() {
        RANGE_ALLOCATOR => {}
        CLOUD_ALLOCATOR => {
            let Some(cloud) = ctx.cloud.node_cidrs() else {
                return Err(start_error(
                    "--cidr-allocator-type is set to 'CloudAllocator' but the cloud provider does not offer node CIDR allocation".into(),
                ));
            };
            validate_service_cidrs(&ctx.config)?;
            let stack = cloud_allocator::stack(&ctx.config.service_cidrs);
            tracing::info!(
                ?stack,
                "cloud CIDR allocator: pod CIDR families from the service CIDRs"
            );
            let a = Arc::new(cloud_allocator::CloudAllocator {
                client: ctx.client.clone(),
                cloud,
                stack,
                shutdown: ctx.shutdown.clone(),
                deadline: crate::cloud_call::Deadline::new(ctx.config.instance_call_timeout),
                queue_metrics: crate::controllers::workqueue_metrics::WorkqueueMetrics::of(
                    &ctx.metrics,
                )
                .queue(cloud_allocator::QUEUE_NAME),
            });
            let ctx = ctx.clone();
            return Ok(Started::Running(Box::pin(async move {
                let nodes = informer::nodes_for(&ctx, opts.node_selector.as_deref());
                let changes = nodes.subscribe();
                a.run(nodes, changes).await;
            })));
        }
        other => {
            return Err(start_error(format!(
                "--cidr-allocator-type: invalid CIDR allocator type: {other}"
            )));
        }
    }
    let sets = cidr_sets(&ctx.config)?;
    let metrics = Metrics::register(&mut ctx.metrics.lock().unwrap_or_else(|p| p.into_inner()));
    let a = Arc::new(RangeAllocator {
        client: ctx.client.clone(),
        sets: Mutex::new(sets),
        service_cidrs: ctx.config.service_cidrs.clone(),
        processing: Mutex::new(HashSet::new()),
        writers: Semaphore::new(CIDR_UPDATE_WORKERS),
        recorder: EventRecorder::new(ctx.events_client(), Reporter::from(cnames::COMPONENT_IPAM)),
        metrics,
        shutdown: ctx.shutdown.clone(),
    });
    let ctx = ctx.clone();
    Ok(Started::Running(Box::pin(async move {
        let nodes = informer::nodes_for(&ctx, opts.node_selector.as_deref());
        let changes = nodes.subscribe();
        a.run(nodes, changes).await;
    })))
}

type Labels = Vec<(String, String)>;

/// Metrics of subsystem `node_ipam_controller` (spec §6.4), labelled by `clusterCIDR`.
struct Metrics {
    allocations: Family<Labels, Counter>,
    releases: Family<Labels, Counter>,
    usage: Family<Labels, Gauge<f64, std::sync::atomic::AtomicU64>>,
    tries: Family<Labels, Histogram, fn() -> Histogram>,
}

impl Metrics {
    fn register(registry: &mut prometheus_client::registry::Registry) -> Self {
        let m = Metrics {
            allocations: Family::default(),
            releases: Family::default(),
            usage: Family::default(),
            tries: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(1.0, 5.0, 5))
            }),
        };
        let r = registry.sub_registry_with_prefix("node_ipam_controller");
        r.register(
            "cidrset_cidrs_allocations",
            "Counter measuring total number of CIDR allocations.",
            m.allocations.clone(),
        );
        r.register(
            "cidrset_cidrs_releases",
            "Counter measuring total number of CIDR releases.",
            m.releases.clone(),
        );
        r.register(
            "cidrset_usage_cidrs",
            "Gauge measuring percentage of allocated CIDRs.",
            m.usage.clone(),
        );
        r.register(
            "cidrset_allocation_tries_per_request",
            "Number of endpoints added on each Service sync",
            m.tries.clone(),
        );
        m
    }
}

struct RangeAllocator {
    client: kube::Client,
    sets: Mutex<Vec<CidrSet>>,
    service_cidrs: Vec<IpNet>,
    /// Nodes with a reservation being written.
    processing: Mutex<HashSet<String>>,
    writers: Semaphore,
    recorder: EventRecorder,
    metrics: Metrics,
    shutdown: CancellationToken,
}

/// A Node's pod CIDRs, parsed; `Err` names the bad value.
fn pod_cidrs(node: &Node) -> Result<Vec<IpNet>, String> {
    let spec = node.spec.as_ref();
    let raw: Vec<String> = match spec.and_then(|s| s.pod_cidrs.clone()) {
        Some(c) if !c.is_empty() => c,
        _ => spec.and_then(|s| s.pod_cidr.clone()).into_iter().filter(|c| !c.is_empty()).collect(),
    };
    raw.iter().map(|c| c.parse::<IpNet>().map_err(|e| format!("{c:?}: {e}"))).collect()
}

fn name_of(node: &Node) -> String {
    node.metadata.name.clone().unwrap_or_default()
}

impl RangeAllocator {
    fn lock_sets(&self) -> std::sync::MutexGuard<'_, Vec<CidrSet>> {
        self.sets.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_processing(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.processing.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn labels(set: &CidrSet) -> Labels {
        vec![("clusterCIDR".into(), set.cluster().to_string())]
    }

    fn observe_usage(&self, sets: &[CidrSet]) {
        for s in sets {
            self.metrics.usage.get_or_create(&Self::labels(s)).set(s.usage());
        }
    }

    async fn run(self: Arc<Self>, nodes: Arc<Informer<Node>>, mut changes: Changes<Node>) {
        // Changes before the first complete list are covered by the rebuild below.
        let mut synced = false;
        loop {
            let change = tokio::select! {
                _ = self.shutdown.cancelled() => return,
                c = changes.recv() => c,
            };
            let Some(change) = change else { return };
            match change {
                Change::Synced if !synced => {
                    synced = true;
                    self.rebuild(&nodes.list());
                }
                _ if !synced => {}
                Change::Synced => {}
                Change::Added(n) => self.allocate_or_occupy(&n),
                Change::Updated { new, .. } => {
                    if matches!(pod_cidrs(&new), Ok(c) if c.is_empty()) {
                        self.allocate_or_occupy(&new);
                    }
                }
                Change::Deleted(n) => self.release_node(&n),
            }
        }
    }

    /// Marks every existing assignment and the service ranges as taken, then allocates for
    /// the Nodes that have none.
    fn rebuild(self: &Arc<Self>, nodes: &[Arc<Node>]) {
        {
            let mut sets = self.lock_sets();
            for node in nodes {
                match pod_cidrs(node) {
                    Ok(cidrs) => {
                        if let Err(e) = occupy_all(&mut sets, &cidrs) {
                            tracing::error!(node = %name_of(node), error = %e, "cannot mark the node's pod CIDRs as taken");
                        }
                    }
                    Err(e) => {
                        tracing::error!(node = %name_of(node), error = %e, "node has an unparsable pod CIDR; skipped")
                    }
                }
            }
            for svc in &self.service_cidrs {
                for set in sets.iter_mut().filter(|s| s.overlaps(svc)) {
                    if let Err(e) = set.occupy(svc) {
                        tracing::warn!(service_cidr = %svc, error = %e, "cannot reserve the service CIDR");
                    }
                }
            }
            self.observe_usage(&sets);
            tracing::info!(nodes = nodes.len(), "node CIDR map rebuilt from existing nodes");
        }
        for node in nodes {
            if matches!(pod_cidrs(node), Ok(c) if c.is_empty()) {
                self.allocate_or_occupy(node);
            }
        }
    }

    fn release_node(&self, node: &Node) {
        let Ok(cidrs) = pod_cidrs(node) else { return };
        self.release(&cidrs);
    }

    fn release(&self, cidrs: &[IpNet]) {
        let mut sets = self.lock_sets();
        for (set, cidr) in sets.iter_mut().zip(cidrs) {
            match set.release(cidr) {
                Ok(()) => {
                    self.metrics.releases.get_or_create(&Self::labels(set)).inc();
                }
                Err(e) => tracing::warn!(%cidr, error = %e, "cannot release CIDR"),
            }
        }
        self.observe_usage(&sets);
    }

    fn allocate_or_occupy(self: &Arc<Self>, node: &Arc<Node>) {
        let name = name_of(node);
        let cidrs = match pod_cidrs(node) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(node = %name, error = %e, "node has an unparsable pod CIDR");
                return;
            }
        };
        if !cidrs.is_empty() {
            if let Err(e) = occupy_all(&mut self.lock_sets(), &cidrs) {
                tracing::warn!(node = %name, error = %e, "cannot mark the node's pod CIDRs as taken");
            }
            return;
        }
        if !self.lock_processing().insert(name.clone()) {
            return;
        }
        let allocated = {
            let mut sets = self.lock_sets();
            let mut got = Vec::new();
            let mut failed = None;
            for set in sets.iter_mut() {
                match set.allocate_next() {
                    Ok((cidr, tries)) => {
                        let labels = Self::labels(set);
                        self.metrics.allocations.get_or_create(&labels).inc();
                        self.metrics.tries.get_or_create(&labels).observe(tries as f64);
                        got.push(cidr);
                    }
                    Err(e) => {
                        failed = Some(e);
                        break;
                    }
                }
            }
            if failed.is_some() {
                for (set, cidr) in sets.iter_mut().zip(&got) {
                    let _ = set.release(cidr);
                }
            }
            self.observe_usage(&sets);
            match failed {
                None => Ok(got),
                Some(e) => Err(e),
            }
        };
        match allocated {
            Ok(cidrs) => {
                let this = self.clone();
                let node = node.clone();
                tokio::spawn(async move {
                    let Ok(_permit) = this.writers.acquire().await else { return };
                    this.update(&node, cidrs).await;
                });
            }
            Err(e) => {
                self.lock_processing().remove(&name);
                tracing::error!(node = %name, error = %e, "no CIDR for node");
                let this = self.clone();
                let node = node.clone();
                tokio::spawn(
                    async move { this.node_event(&node, reasons::CIDR_NOT_AVAILABLE).await },
                );
            }
        }
    }

    /// Writes the reserved CIDRs to the Node (or gives them back).
    async fn update(self: &Arc<Self>, node: &Node, cidrs: Vec<IpNet>) {
        let name = name_of(node);
        let api = Api::<Node>::all(self.client.clone());
        let want: Vec<String> = cidrs.iter().map(ToString::to_string).collect();
        let mut last_err = None;
        for _ in 0..CIDR_UPDATE_RETRIES {
            let current = match api.get(&name).await {
                Ok(n) => n,
                Err(kube::Error::Api(s)) if s.code == 404 => {
                    self.release(&cidrs);
                    last_err = None;
                    break;
                }
                Err(e) => {
                    last_err = Some(e);
                    continue;
                }
            };
            match pod_cidrs(&current) {
                Ok(c) if c == cidrs => {
                    last_err = None;
                    break;
                }
                Ok(c) if !c.is_empty() => {
                    tracing::info!(node = %name, has = ?c, "node already has pod CIDRs; releasing the reservation");
                    self.release(&cidrs);
                    let _ = occupy_all(&mut self.lock_sets(), &c);
                    last_err = None;
                    break;
                }
                _ => {}
            }
            let patch = json!({"spec": {"podCIDR": want[0], "podCIDRs": want}});
            match api.patch(&name, &PatchParams::default(), &Patch::Strategic(patch)).await {
                Ok(_) => {
                    tracing::info!(node = %name, cidrs = ?want, "set node pod CIDRs");
                    last_err = None;
                    break;
                }
                Err(e) => last_err = Some(e),
            }
        }
        self.lock_processing().remove(&name);
        if let Some(e) = last_err {
            tracing::warn!(node = %name, error = %e, "failed to set node pod CIDRs; retrying later");
            self.node_event(node, reasons::CIDR_ASSIGNMENT_FAILED).await;
            let timeout = matches!(&e, kube::Error::Api(s) if s.code == 504);
            if !timeout {
                self.release(&cidrs);
            }
            let this = self.clone();
            let node = Arc::new(node.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = this.shutdown.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_secs(5)) => this.allocate_or_occupy(&node),
                }
            });
        }
    }

    async fn node_event(&self, node: &Node, status: &str) {
        let note = format!("Node {} status is now: {status}", name_of(node));
        crate::controllers::events::publish(
            &self.recorder,
            node,
            EventType::Normal,
            status,
            "AllocateCIDR",
            note,
        )
        .await;
    }
}

/// Occupies `cidrs[i]` in set `i`; more CIDRs than sets is an error.
fn occupy_all(sets: &mut [CidrSet], cidrs: &[IpNet]) -> Result<(), String> {
    if cidrs.len() > sets.len() {
        return Err(format!(
            "node has {} pod CIDRs but the cluster has {} cluster CIDRs",
            cidrs.len(),
            sets.len()
        ));
    }
    for (set, cidr) in sets.iter_mut().zip(cidrs) {
        set.occupy(cidr).map_err(|e| e.to_string())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::ControllerConfig;

    #[test]
    fn configuration_errors_name_the_flag() {
        let base = ControllerConfig { allocate_node_cidrs: true, ..Default::default() };
        let e = cidr_sets(&base).unwrap_err();
        assert!(e.message.contains("Must specify --cluster-cidr"), "{e}");
        let small = ControllerConfig {
            cluster_cidrs: vec!["10.0.0.0/26".parse().unwrap()],
            ..base.clone()
        };
        let e = cidr_sets(&small).unwrap_err();
        assert!(e.message.contains("--node-cidr-mask-size-ipv4=24"), "{e}");
        let svc = ControllerConfig {
            cluster_cidrs: vec!["10.0.0.0/16".parse().unwrap()],
            service_cidrs: vec!["10.96.0.0/12".parse().unwrap(), "10.112.0.0/12".parse().unwrap()],
            ..base.clone()
        };
        assert!(cidr_sets(&svc).unwrap_err().message.contains("--service-cluster-ip-range"));
        let dual = ControllerConfig {
            cluster_cidrs: vec!["10.0.0.0/16".parse().unwrap(), "fd00::/48".parse().unwrap()],
            ..base
        };
        assert_eq!(cidr_sets(&dual).unwrap().len(), 2);
    }

    #[test]
    fn more_pod_cidrs_than_sets_is_rejected() {
        let mut sets = vec![CidrSet::new("10.0.0.0/16".parse().unwrap(), 24).unwrap()];
        let cidrs: Vec<IpNet> = vec!["10.0.1.0/24".parse().unwrap(), "fd00::/64".parse().unwrap()];
        assert!(occupy_all(&mut sets, &cidrs).is_err());
    }
}
