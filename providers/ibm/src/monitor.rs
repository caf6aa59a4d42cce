//! The load-balancer monitor (upstream's 5-minute `MonitorLoadBalancers` task; issue #33
//! item 12), started by [`crate::IbmProvider`]'s `initialize`.
//!
//! Every [`MonitorOptions::period`] (default 5 minutes) one pass:
//!
//! 1. lists the account's VPC load balancers, **then** every Service of the cluster (in that
//!    order: a load balancer in the first list was created after its Service, so its Service
//!    is in the second unless it was deleted). A failed list ends the pass: nothing is
//!    decided on a partial view.
//! 2. **Health**: for each `type: LoadBalancer` Service (without `loadBalancerClass`) whose
//!    load balancer is this cluster's, its state `<operating_status>/<provisioning_status>`
//!    (or `offline/not_found` when no load balancer has its name) is compared with the
//!    previous pass: a state other than `online/active` seen in two passes in a row is a
//!    `Warning` `VerifyingCloudLoadBalancerFailed` Event on the Service (upstream's reason and
//!    rule: a load balancer that is merely pending for a moment is not reported), and the
//!    return to `online/active` after such a state a `Normal` `CloudVPCLoadBalancerNormalEvent`
//!    (upstream also sends one for every healthy load balancer on its first pass; here only
//!    a recovery is news). Reporting component: `ibm-cloud-provider`, as upstream.
//! 3. **Orphans** (upstream's public code does not delete them; the issue asks for it, under
//!    the tenant-safety rule of issue #29): a load balancer is deleted only when it is proven
//!    to be this cluster's (its generated name `kube-<clusterID>-<Service UID>`, or this
//!    cluster's ownership tags `ccm-cluster:` and `ccm-service-uid:`), the Service it was
//!    created for is gone (no Service of the cluster has that UID), no Service's
//!    `vpc-lb-name` annotation names it, and it is `active` or `failed` (IBM accepts the
//!    deletion; a pending one waits for the next pass). Its ownership is proved again by
//!    reading it by ID right before the delete. Nothing else is ever deleted: not another
//!    cluster's, not one an operator made, not one a Service's annotation names, not one
//!    whose tags cannot be read.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_core::cloud::ProviderError;
use ccm_core::controllers::events::{EventRecorder, publish};
use k8s_openapi::api::core::v1::Service;
use kube::Api;
use kube::api::ListParams;
use kube::runtime::events::{EventType, Reporter};

use crate::load_balancer::{IbmLoadBalancer, annotations, generated_name, naming};
use crate::model;

/// The reporting component of the monitor's Events (upstream: `<provider>-cloud-provider`).
pub const COMPONENT: &str = "ibm-cloud-provider";

/// Event reasons, as upstream names them.
pub mod reasons {
    /// A load balancer seen unhealthy (or missing) in two passes in a row.
    pub const VERIFYING_FAILED: &str = "VerifyingCloudLoadBalancerFailed";
    /// A load balancer back to `online/active` after being reported.
    pub const NORMAL: &str = "CloudVPCLoadBalancerNormalEvent";
}

/// The state upstream calls healthy.
pub const ONLINE_ACTIVE: &str = "online/active";
/// The state of a Service whose load balancer does not exist.
pub const NOT_FOUND: &str = "offline/not_found";

/// How often the monitor runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MonitorOptions {
    /// Time between passes (upstream: 5 minutes).
    pub period: Duration,
}

impl Default for MonitorOptions {
    fn default() -> Self {
        MonitorOptions { period: Duration::from_secs(300) }
    }
}

/// What one pass saw and did (logged; tests read it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Load balancers listed.
    pub load_balancers: usize,
    /// Warning Events sent (`<namespace>/<name>` of the Service).
    pub warnings: Vec<String>,
    /// Normal Events sent.
    pub recoveries: Vec<String>,
    /// Orphans whose deletion IBM accepted (load balancer names).
    pub deleted: Vec<String>,
    /// Orphans left for a later pass (pending), or whose deletion failed, with why.
    pub skipped: Vec<String>,
}

/// The monitor: the provider's load balancers, a Kubernetes client and the states of the
/// previous pass.
pub struct Monitor {
    lb: Arc<IbmLoadBalancer>,
    client: kube::Client,
    recorder: EventRecorder,
    /// Service UID → the state seen by the previous pass.
    last: Mutex<HashMap<String, String>>,
}

impl std::fmt::Debug for Monitor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Monitor").finish_non_exhaustive()
    }
}

fn key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

fn wants_load_balancer(svc: &Service) -> bool {
    let spec = svc.spec.as_ref();
    spec.and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
        && spec.and_then(|s| s.load_balancer_class.as_deref()).is_none()
        && svc.metadata.deletion_timestamp.is_none()
}

fn state_of(lb: &model::LoadBalancer) -> String {
    format!("{}/{}", lb.operating_status, lb.provisioning_status)
}

/// Upstream's explanation of a state, for the Event's message.
fn explain(state: &str) -> String {
    match state {
        "offline/failed" => "the VPC load balancer that routes this Service's traffic is offline (failed): see the IBM Cloud console; deleting and re-creating the Service's load balancer is the way out".to_string(),
        NOT_FOUND => "the VPC load balancer of this Service was not found; it is created again when the Service is next synced (e.g. after a change to it or a restart of the manager)".to_string(),
        s if s.ends_with("/maintenance_pending") => "the VPC load balancer that routes this Service's traffic is under maintenance by IBM".to_string(),
        s => format!("the VPC load balancer that routes this Service's traffic is {s}"),
    }
}

impl Monitor {
    /// A monitor of `lb`'s load balancers, recording Events with `client`.
    pub fn new(lb: Arc<IbmLoadBalancer>, client: kube::Client) -> Self {
        let recorder = EventRecorder::new(client.clone(), Reporter::from(COMPONENT));
        Monitor { lb, client, recorder, last: Mutex::new(HashMap::new()) }
    }

    /// Runs a pass every `opts.period` (the first one period after the start, as upstream's
    /// ticker) until `shutdown`.
    pub fn spawn(
        self: Arc<Self>,
        opts: MonitorOptions,
        shutdown: ccm_core::manager::CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            let period = opts.period.max(Duration::from_millis(100));
            tracing::info!(?period, "IBM: load balancer monitor started");
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => return,
                    _ = tokio::time::sleep(period) => {}
                }
                let pass = self.pass();
                let report = tokio::select! {
                    _ = shutdown.cancelled() => return,
                    r = pass => r,
                };
                match report {
                    Ok(r) => tracing::info!(
                        load_balancers = r.load_balancers,
                        warnings = r.warnings.len(),
                        deleted = ?r.deleted,
                        skipped = ?r.skipped,
                        "IBM: load balancer monitor pass"
                    ),
                    Err(e) => {
                        tracing::warn!(error = %e, "IBM: load balancer monitor pass skipped")
                    }
                }
            }
        })
    }

    /// One pass (see the module doc). An error: a list failed, nothing was decided.
    pub async fn pass(&self) -> Result<PassReport, ProviderError> {
        let cluster_id = self.lb.cluster_id().to_string();
        // Load balancers first, then Services (see the module doc).
        let lbs = self.lb.client().list_load_balancers().await?;
        let services = Api::<Service>::all(self.client.clone())
            .list(&ListParams::default())
            .await
            .map_err(|e| ProviderError::with_source("listing the cluster's Services", e))?
            .items;
        let mut report = PassReport { load_balancers: lbs.len(), ..Default::default() };
        let by_name: HashMap<&str, &model::LoadBalancer> =
            lbs.iter().map(|l| (l.name.as_str(), l)).collect();
        let uids: HashSet<&str> =
            services.iter().filter_map(|s| s.metadata.uid.as_deref()).collect();
        let generated: HashSet<String> =
            services.iter().map(|s| generated_name(s, &cluster_id)).collect();
        let annotated: HashSet<String> = services
            .iter()
            .filter_map(|s| s.metadata.annotations.as_ref()?.get(annotations::VPC_LB_NAME))
            .map(|n| n.trim().to_string())
            .filter(|n| !n.is_empty())
            .collect();

        self.health(&services, &by_name, &mut report).await;

        for lb in &lbs {
            let Some((why, tagged_uid)) = self.orphan(lb, &uids, &generated, &annotated).await
            else {
                continue;
            };
            if !(lb.is_active() || lb.provisioning_status == "failed") {
                report.skipped.push(format!("{} ({}): {}", lb.name, lb.id, lb.status()));
                continue;
            }
            match self.lb.delete_orphan(lb, tagged_uid.as_deref()).await {
                Ok(()) => {
                    tracing::info!(load_balancer = %lb.name, id = %lb.id, reason = %why, "IBM: deleted a load balancer of this cluster that no Service uses");
                    report.deleted.push(lb.name.clone());
                }
                Err(e) => {
                    tracing::warn!(load_balancer = %lb.name, id = %lb.id, error = %e, "IBM: deleting an orphaned load balancer failed (tried again on the next pass)");
                    report.skipped.push(format!("{} ({}): {e}", lb.name, lb.id));
                }
            }
        }
        Ok(report)
    }

    /// Why `lb` is an orphan this cluster may delete (and the Service UID its tags name, when
    /// tags are the proof), or `None` when it is not one (not proven this cluster's, its
    /// Service still exists, or an annotation names it).
    async fn orphan(
        &self,
        lb: &model::LoadBalancer,
        uids: &HashSet<&str>,
        generated: &HashSet<String>,
        annotated: &HashSet<String>,
    ) -> Option<(String, Option<String>)> {
        if annotated.contains(&lb.name) {
            return None;
        }
        if lb.name.starts_with(&self.lb.owned_prefix()) {
            // The generated name is the proof; a Service of the cluster whose UID gives
            // this name still exists: not an orphan (whatever its type or annotations now).
            return (!generated.contains(&lb.name)).then(|| {
                ("its generated name names a Service UID the cluster has not".into(), None)
            });
        }
        if crate::load_balancer::has_generated_form(&lb.name) {
            // Another cluster's generated name: never ours, no tag lookup.
            return None;
        }
        let uid = match self.lb.owner_uid(lb).await {
            Ok(Some(uid)) => uid,
            Ok(None) => return None,
            Err(e) => {
                tracing::debug!(load_balancer = %lb.name, error = %e, "IBM monitor: ownership tags cannot be read: not an orphan");
                return None;
            }
        };
        (!uids.contains(uid.as_str())).then(|| {
            (format!("tagged for this cluster and Service UID {uid}, which is gone"), Some(uid))
        })
    }

    /// Health Events for the cluster's load balancer Services.
    async fn health(
        &self,
        services: &[Service],
        by_name: &HashMap<&str, &model::LoadBalancer>,
        report: &mut PassReport,
    ) {
        let cluster_id = self.lb.cluster_id().to_string();
        let mut now: BTreeMap<String, (Service, String, String)> = BTreeMap::new();
        for svc in services.iter().filter(|s| wants_load_balancer(s)) {
            let Some(uid) = svc.metadata.uid.clone() else { continue };
            let Ok(n) = naming(svc, &cluster_id) else { continue };
            let name = n.name().to_string();
            let state = match by_name.get(name.as_str()) {
                // Only a load balancer proven the Service's is reported on.
                Some(lb) => match self.lb.is_services(&n, svc, lb).await {
                    Ok(true) => state_of(lb),
                    Ok(false) | Err(_) => continue,
                },
                None => NOT_FOUND.to_string(),
            };
            now.insert(uid, (svc.clone(), name, state));
        }
        let previous = {
            let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
            let prev = last.clone();
            *last = now.iter().map(|(uid, (_, _, state))| (uid.clone(), state.clone())).collect();
            prev
        };
        for (uid, (svc, name, state)) in &now {
            let before = previous.get(uid);
            if state == ONLINE_ACTIVE {
                if before.is_some_and(|b| b != ONLINE_ACTIVE) {
                    let note = format!(
                        "cloud load balancer {name} of Service {} (UID {uid}) is {ONLINE_ACTIVE} again",
                        key(svc)
                    );
                    publish(
                        &self.recorder,
                        svc,
                        EventType::Normal,
                        reasons::NORMAL,
                        "MonitorLoadBalancer",
                        note,
                    )
                    .await;
                    report.recoveries.push(key(svc));
                }
                continue;
            }
            if before == Some(state) {
                let note = format!(
                    "cloud load balancer {name} of Service {} (UID {uid}) is {state}: {}",
                    key(svc),
                    explain(state)
                );
                publish(
                    &self.recorder,
                    svc,
                    EventType::Warning,
                    reasons::VERIFYING_FAILED,
                    "MonitorLoadBalancer",
                    note,
                )
                .await;
                report.warnings.push(key(svc));
            }
        }
    }
}
