//! LoadBalancer: the external target-pool network load balancer and the internal passthrough
//! load balancer, named and built as upstream's `gce_loadbalancer{,_external,_internal}.go`.
//!
//! | module | owns |
//! |---|---|
//! | [`annotations`] | the Service fields and annotations read, their reference table, checked before any call |
//! | [`naming`] | every resource name and description (upstream's, byte for byte) |
//! | [`cluster_id`] | the cluster ID of the shared names: ConfigMap `kube-system/ingress-uid` |
//! | `external` | address, target pool, legacy HTTP health check, forwarding rule, firewalls |
//! | `internal` | instance groups, health check, backend service, internal forwarding rule, address, firewalls |
//! | `firewall` | firewall objects, upstream's drift checks, create/patch/delete |
//! | `hosts` | the nodes' instances and network tags |
//! | `api` | one function per Compute call (reads via `call`, mutations via `mutate`) |
//! | `parked` | the external load balancers' operations left running, read again by the next sync |
//!
//! - **Which Services**: `spec.loadBalancerClass` other than upstream's two legacy classes →
//!   [`ProviderError::ImplementedElsewhere`] (delete: nothing to do). External Services with
//!   `cloud.google.com/l4-rbs: enabled` (or the RBS class, or the newer controllers'
//!   finalizers) are GKE's L4 controller's, unless this provider already manages their
//!   target-pool forwarding rule (upstream's `gke.networking.io/l4-netlb-v1` finalizer test;
//!   here the forwarding rule itself is the proof, as the provider does not write finalizers).
//! - **Scheme switch**: a forwarding rule of the other scheme is deleted with everything of
//!   its kind before the new kind is built (upstream).
//! - **Existence** ([`LoadBalancer::get_load_balancer`]): the forwarding rule; without it, as
//!   upstream, a Service with upstream's finalizer exists; and (this provider's stand-in for
//!   that finalizer) any of the target pool, backend service, `k8s-fw-<lb>` firewall or
//!   address named for the Service, so a half-finished delete is finished.
//! - **Delete** removes upstream's `gke.networking.io/l4-{netlb,ilb}-v1` finalizer from the
//!   Service when a Kubernetes client was given ([`GceLoadBalancer::set_kube_client`]), so
//!   Services created by the upstream controller can be deleted after the swap.
//! - Errors name the load balancer and the Service; a 412 (a stale fingerprint: a shared
//!   backend service changed meanwhile) is [`ProviderError::RetryAfter`]
//!   ([`Timings::conflict_retry`]); a throttled call is [`ProviderError::Throttled`].
//! - **Nothing waits for Compute** (issue #35 (b); upstream waits for every operation in
//!   the sync, holding its worker): an external load balancer's own resource whose operation
//!   still runs after [`Timings::operation_inline`] is parked and the sync is a
//!   [`ProviderError::RetryAfter`] ([`Timings::operation_retry`]); the next sync reads the
//!   operation first and resumes from what exists (`parked`). Shared resources and the
//!   internal load balancers are still waited for.

pub mod annotations;
mod api;
pub mod cluster_id;
mod external;
mod firewall;
mod hosts;
mod internal;
mod kube_api;
pub mod naming;
mod parked;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::cloud::{CloudLoadBalancer, LoadBalancer, ProviderError, default_load_balancer_name};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};

pub use annotations::ANNOTATIONS;
use annotations::{Class, Scheme, ServiceConfig, has_finalizer, keys};
use api::Api;
pub use firewall::L4_HEALTH_CHECK_RANGES;

use crate::client::{GceClient, GceError};

/// How long one Kubernetes API request of the load balancers may take.
const KUBE_TIMEOUT: Duration = Duration::from_secs(30);

/// Delays the load balancers ask the service controller for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// The retry delay after Compute refused an update for a stale fingerprint (412: another
    /// Service changed a shared backend service meanwhile).
    pub conflict_retry: Duration,
    /// How long the nodes' instances found for one set of node names answer for every load
    /// balancer given the same names (issue #35: a Node joining K load balancers lists each
    /// zone's instances once, not K times; see [`GceLoadBalancer::hosts`]).
    pub hosts_ttl: Duration,
    /// How long a mutation of an external load balancer's own resources waits for its
    /// operation before the sync parks it and moves on (`parked`: issue #35 (b)).
    pub operation_inline: Duration,
    /// The retry delay while a parked operation runs.
    pub operation_retry: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Timings {
            conflict_retry: Duration::from_secs(5),
            hosts_ttl: Duration::from_secs(5),
            operation_inline: Duration::from_millis(500),
            operation_retry: Duration::from_secs(5),
        }
    }
}

/// The nodes' instances last found, for which names and when.
struct HostsSeen {
    names: Vec<String>,
    hosts: Vec<hosts::Host>,
    at: tokio::time::Instant,
}

/// What upstream's command line sets for the load balancers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbOptions {
    /// The source ranges of the health-check firewalls (`k8s-<clusterID>-node-http-hc`,
    /// `k8s-<hc>-http-hc`, `k8s-<lb>-fw-hc`...): `--cloud-provider-gce-lb-src-cidrs`, by
    /// default Google's health checkers and L3/L4 proxies ([`L4_HEALTH_CHECK_RANGES`]).
    pub health_check_sources: Vec<String>,
    /// `--enable-l4-lb-annotations`: after a sync, the Service is annotated with the
    /// resource that carries its traffic (`networking.gke.io/target-pool` for the external
    /// load balancer, `networking.gke.io/backend-service` for the internal one; the other
    /// key removed), as upstream.
    pub resource_annotations: bool,
}

impl Default for LbOptions {
    fn default() -> Self {
        LbOptions {
            health_check_sources: L4_HEALTH_CHECK_RANGES.iter().map(|s| s.to_string()).collect(),
            resource_annotations: false,
        }
    }
}

/// Upstream's `alpha-features` gates (`gce.conf`) the load balancers honour.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct AlphaFeatures {
    /// `ILBSubsets`: new internal load balancers belong to GKE's subsetting L4 controller
    /// ([`ProviderError::ImplementedElsewhere`]); one this provider (or upstream's legacy
    /// controller) already made, proven by its `a<uid>` INTERNAL forwarding rule, upstream's
    /// `gke.networking.io/l4-ilb-v1` finalizer or the legacy internal class, is still
    /// updated and deleted here.
    pub ilb_subsets: bool,
    /// `SkipIGsManagement`: the `k8s-ig--<clusterID>*` instance groups are someone else's:
    /// the internal load balancers use the groups they find in each zone with nodes and never
    /// create, change or delete one.
    pub skip_igs_management: bool,
}

impl AlphaFeatures {
    /// The gates named in `gce.conf`'s `alpha-features` (other names are not read here).
    pub fn from_names(names: &[String]) -> Self {
        let on = |f: &str| names.iter().any(|n| n == f);
        AlphaFeatures {
            ilb_subsets: on("ILBSubsets"),
            skip_igs_management: on("SkipIGsManagement"),
        }
    }
}

/// A failure inside a load balancer operation, given the load balancer's name at the top.
#[derive(Debug, thiserror::Error)]
pub(crate) enum LbError {
    /// A Compute call failed.
    #[error(transparent)]
    Gce(#[from] GceError),
    /// Anything else, already in the controller's terms.
    #[error(transparent)]
    Provider(#[from] ProviderError),
}

/// Everything one operation on one Service's load balancer needs.
pub(crate) struct Ctx<'a> {
    pub api: Api<'a>,
    /// `a<uid>`[:32].
    pub lb: String,
    /// The cluster ID of the shared names.
    pub cluster_id: String,
    /// The Service.
    pub service: &'a Service,
    /// The health-check firewalls' source ranges ([`LbOptions::health_check_sources`]).
    pub hc_sources: &'a [String],
}

/// The GCE load balancers.
pub struct GceLoadBalancer {
    client: Arc<GceClient>,
    timings: Timings,
    options: LbOptions,
    alpha: AlphaFeatures,
    cluster_id: cluster_id::ClusterId,
    kube: std::sync::OnceLock<kube::Client>,
    /// Events on Services, as upstream's `g-cloudprovider` source.
    events: std::sync::OnceLock<kube_api::Events>,
    /// The auto-mode network's subnetwork of the region, once found
    /// ([`Self::default_subnetwork`]).
    auto_subnet: Mutex<Option<String>>,
    /// Serialises the changes to resources Services share (the nodes health check and its
    /// firewall, instance groups, shared backend services), as upstream's
    /// `sharedResourceLock`.
    shared: tokio::sync::Mutex<()>,
    /// The nodes' instances last found ([`Self::hosts`]); held while they are looked up, so
    /// the syncs of one node change wait for one lookup instead of each making their own.
    hosts_seen: tokio::sync::Mutex<Option<HostsSeen>>,
    /// The external load balancers' operations left running (`parked`).
    parked: Arc<parked::Parked>,
}

impl std::fmt::Debug for GceLoadBalancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GceLoadBalancer").field("timings", &self.timings).finish_non_exhaustive()
    }
}

impl GceLoadBalancer {
    /// Load balancers through `client`. The cluster ID comes from ConfigMap
    /// `kube-system/ingress-uid` once [`Self::set_kube_client`] was called, or from
    /// [`Self::set_cluster_id`].
    pub fn new(client: Arc<GceClient>, timings: Timings) -> Self {
        GceLoadBalancer {
            client,
            timings,
            options: LbOptions::default(),
            alpha: AlphaFeatures::default(),
            cluster_id: cluster_id::ClusterId::default(),
            kube: std::sync::OnceLock::new(),
            events: std::sync::OnceLock::new(),
            auto_subnet: Mutex::new(None),
            shared: tokio::sync::Mutex::new(()),
            hosts_seen: tokio::sync::Mutex::new(None),
            parked: Arc::new(parked::Parked::default()),
        }
    }

    /// The instances of the nodes named `names` (upstream's `getInstancesByNames`: each
    /// managed zone's instances listed until all are found): the answer of a lookup for the
    /// same names less than [`Timings::hosts_ttl`] old, else a new lookup. The node sync
    /// gives every load balancer the same nodes, so one Node joining K load balancers costs
    /// one listing per zone instead of K (issue #35). What it answers only chooses
    /// target-pool and instance-group members and firewall tags, never a deletion of a
    /// cloud resource; a lookup that failed is not kept.
    pub(crate) async fn hosts(
        &self,
        api: &Api<'_>,
        names: &[String],
    ) -> Result<Vec<hosts::Host>, LbError> {
        if names.is_empty() {
            return Ok(vec![]);
        }
        let mut seen = self.hosts_seen.lock().await;
        if let Some(s) = seen.as_ref()
            && s.names == names
            && s.at.elapsed() < self.timings.hosts_ttl
        {
            return Ok(s.hosts.clone());
        }
        let found = hosts::hosts(api, names).await?;
        *seen = Some(HostsSeen {
            names: names.to_vec(),
            hosts: found.clone(),
            at: tokio::time::Instant::now(),
        });
        Ok(found)
    }

    /// These load balancers with the command line's `options`.
    pub fn with_options(mut self, options: LbOptions) -> Self {
        self.options = options;
        self
    }

    /// The options in use.
    pub fn options(&self) -> &LbOptions {
        &self.options
    }

    /// These load balancers with `gce.conf`'s `alpha-features` gates.
    pub fn with_alpha_features(mut self, alpha: AlphaFeatures) -> Self {
        self.alpha = alpha;
        self
    }

    /// The alpha feature gates in use.
    pub fn alpha_features(&self) -> AlphaFeatures {
        self.alpha
    }

    /// The subnetwork of an internal load balancer without the subnet annotation:
    /// `subnetwork-name`, else (as upstream picks it at start) the region's subnetwork of an
    /// auto-mode network: the one subnetwork of the network in the region inside the
    /// auto-mode range `10.128.0.0/9`. Found once, then kept. A custom-mode or legacy
    /// network, or none or several such subnetworks, is an error naming `subnetwork-name`.
    pub(crate) async fn default_subnetwork(&self, api: &Api<'_>) -> Result<String, LbError> {
        if let Some(s) = &api.scope.subnetwork_url {
            return Ok(s.clone());
        }
        if let Some(s) = self.auto_subnet.lock().ok().and_then(|c| c.clone()) {
            return Ok(s);
        }
        let chosen = auto_mode_subnetwork(api).await?;
        tracing::info!(subnetwork = %chosen, "GCE: auto-selected the auto-mode network's subnetwork of the region for internal load balancers");
        if let Ok(mut c) = self.auto_subnet.lock() {
            *c = Some(chosen.clone());
        }
        Ok(chosen)
    }

    /// The Kubernetes client (from the provider's `initialize`): reads (or creates) the
    /// cluster ID ConfigMap, and removes upstream's finalizers from deleted Services.
    pub fn set_kube_client(&self, client: kube::Client) {
        self.cluster_id.set_kube(client.clone());
        let _ = self.events.set(kube_api::Events::new(client.clone()));
        let _ = self.kube.set(client);
    }

    /// Uses `id` as the cluster ID instead of reading the ConfigMap (tests).
    pub fn set_cluster_id(&self, id: impl Into<String>) {
        self.cluster_id.set_fixed(id.into());
    }

    /// The error the controller sees: named by load balancer and Service.
    fn finish(&self, lb: &str, service: &str, e: LbError) -> ProviderError {
        match e {
            LbError::Gce(e) if e.is_throttled() => {
                ProviderError::Throttled(format!("load balancer {lb} ({service}): {e}"))
            }
            LbError::Gce(e) if e.is_precondition() => ProviderError::RetryAfter {
                message: format!("load balancer {lb} ({service}): {e}"),
                delay: self.timings.conflict_retry,
            },
            LbError::Gce(e @ GceError::Running { .. }) => ProviderError::RetryAfter {
                message: format!("load balancer {lb} ({service}): {e}"),
                delay: self.timings.operation_retry,
            },
            LbError::Gce(e) => {
                ProviderError::with_source(format!("load balancer {lb} ({service}): {e}"), e)
            }
            LbError::Provider(ProviderError::Other { message, source }) => ProviderError::Other {
                message: format!("load balancer {lb} ({service}): {message}"),
                source,
            },
            LbError::Provider(e) => e,
        }
    }

    async fn ctx<'a>(&'a self, service: &'a Service) -> Result<Ctx<'a>, LbError> {
        let cluster_id = self.cluster_id.get().await?;
        let lb = default_load_balancer_name(service);
        let api = Api::new(&self.client).await?.with_parking(
            self.parked.clone(),
            &lb,
            self.timings.operation_inline,
        );
        // What an earlier sync left running is read first: still running, a retry without
        // any other call; failed, this sync's error; done, the sync runs from fresh reads.
        self.parked.resume(&self.client, &lb).await?;
        Ok(Ctx { api, lb, cluster_id, service, hc_sources: &self.options.health_check_sources })
    }

    /// Upstream's `GetNodeTags`: `node-tags`, else computed from the instances of `names`
    /// as [`Self::hosts`] finds them (a lookup less than [`Timings::hosts_ttl`] old answers,
    /// so an instance whose network tags change is read again once that has passed).
    pub(crate) async fn node_tags(
        &self,
        api: &Api<'_>,
        names: &[String],
    ) -> Result<Vec<String>, LbError> {
        if !api.scope.node_tags.is_empty() {
            return Ok(api.scope.node_tags.clone());
        }
        let hosts = self.hosts(api, names).await?;
        Ok(hosts::target_tags(&[], &hosts).map_err(ProviderError::other)?)
    }

    async fn ensure(
        &self,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        let key = annotations::service_key(service);
        if let Class::Other(class) = annotations::class(service) {
            tracing::info!(service = %key, %class, "GCE: ignoring a Service of another load balancer class");
            return Err(ProviderError::ImplementedElsewhere);
        }
        let lb = default_load_balancer_name(service);
        if annotations::mixed_protocols(service) {
            // Upstream's `processMixedProtocolCheck` on a Service that is this provider's:
            // an Event and the LoadBalancerPortsError condition, and an error.
            let scheme = annotations::scheme(service)?;
            let run = async {
                let cx = self.ctx(service).await?;
                let existing = cx.api.forwarding_rule(&cx.lb).await?;
                if !self.is_ours(service, scheme, existing.as_ref()) {
                    return Err(LbError::Provider(ProviderError::ImplementedElsewhere));
                }
                if let Some(events) = self.events.get() {
                    events.mixed_protocols(service).await?;
                }
                Err(ProviderError::Invalid {
                    what: "spec.ports".into(),
                    message: "mixed protocol is not supported for LoadBalancer (all ports must be TCP, or all UDP)".into(),
                }
                .into())
            };
            return Box::pin(run).await.map_err(|e| self.finish(&lb, &key, e));
        }
        // Everything the Service asks is checked before the first Compute call.
        let conf = ServiceConfig::parse(service)?;
        let run = async {
            let cx = self.ctx(service).await?;
            let out = Box::pin(self.ensure_in(&cx, &conf, nodes, &key)).await;
            self.report_manual_changes(&cx).await;
            out
        };
        Box::pin(run).await.map_err(|e| self.finish(&lb, &key, e))
    }

    async fn ensure_in(
        &self,
        cx: &Ctx<'_>,
        conf: &ServiceConfig,
        nodes: &[Node],
        key: &str,
    ) -> Result<LoadBalancerStatus, LbError> {
        let service = cx.service;
        if let Some(events) = self.events.get() {
            events.ports_agree(service).await?;
        }
        let mut existing = cx.api.forwarding_rule(&cx.lb).await?;
        if let Some(fr) = &existing {
            let have = Scheme::of_rule(fr.load_balancing_scheme.as_ref().and_then(|s| s.name()));
            if have != conf.scheme {
                tracing::info!(load_balancer = %cx.lb, service = %key, from = have.compute(), to = conf.scheme.compute(),
                    "GCE: load balancer scheme changed; deleting the old one");
                match have {
                    Scheme::Internal => {
                        internal::delete_for_service(self, cx, existing.as_ref()).await?
                    }
                    Scheme::External => external::delete_for_service(self, cx).await?,
                }
                existing = None;
            }
        }
        let status = match conf.scheme {
            Scheme::External => Box::pin(external::ensure(self, cx, conf, existing, nodes)).await?,
            Scheme::Internal => Box::pin(internal::ensure(self, cx, conf, existing, nodes)).await?,
        };
        if self.options.resource_annotations {
            self.annotate_resources(cx, conf).await?;
        }
        Ok(status)
    }

    async fn update(&self, service: &Service, nodes: &[Node]) -> Result<(), ProviderError> {
        if let Class::Other(_) = annotations::class(service) {
            return Err(ProviderError::ImplementedElsewhere);
        }
        let scheme = annotations::scheme(service)?;
        let key = annotations::service_key(service);
        let lb = default_load_balancer_name(service);
        let run = async {
            let cx = self.ctx(service).await?;
            let out = self.update_in(&cx, scheme, nodes, &key).await;
            self.report_manual_changes(&cx).await;
            out
        };
        run.await.map_err(|e| self.finish(&lb, &key, e))
    }

    async fn update_in(
        &self,
        cx: &Ctx<'_>,
        scheme: Scheme,
        nodes: &[Node],
        key: &str,
    ) -> Result<(), LbError> {
        let service = cx.service;
        if scheme == Scheme::Internal
            && self.alpha.ilb_subsets
            && !self.is_ours(service, scheme, cx.api.forwarding_rule(&cx.lb).await?.as_ref())
        {
            tracing::debug!(service = %key, "GCE: ILBSubsets: internal load balancer of GKE's controller; implemented elsewhere");
            return Err(ProviderError::ImplementedElsewhere.into());
        }
        // Mixed protocols: the Event and condition, and the nodes are still updated (as
        // upstream: an update is never broken by them).
        if let Some(events) = self.events.get() {
            if annotations::mixed_protocols(service) {
                events.mixed_protocols(service).await?;
            } else {
                events.ports_agree(service).await?;
            }
        }
        match scheme {
            Scheme::External => external::update(self, cx, nodes).await,
            Scheme::Internal => {
                let conf = ServiceConfig::parse_allowing_mixed_protocols(service)?;
                internal::update(self, cx, &conf, nodes).await
            }
        }
    }

    async fn delete(&self, service: &Service) -> Result<(), ProviderError> {
        let key = annotations::service_key(service);
        if let Class::Other(_) = annotations::class(service) {
            // Never ours; nothing to clean up (the class cannot change).
            return Ok(());
        }
        let lb = default_load_balancer_name(service);
        let run = async {
            let cx = self.ctx(service).await?;
            let out = self.delete_in(&cx, &key).await;
            self.report_manual_changes(&cx).await;
            out
        };
        run.await.map_err(|e| self.finish(&lb, &key, e))
    }

    async fn delete_in(&self, cx: &Ctx<'_>, key: &str) -> Result<(), LbError> {
        let service = cx.service;
        let existing = cx.api.forwarding_rule(&cx.lb).await?;
        // The rule's own scheme when it still exists; else the Service's (both kinds when
        // the Service's annotation is unreadable).
        let schemes = match (&existing, annotations::scheme(service)) {
            (Some(fr), _) => {
                vec![Scheme::of_rule(fr.load_balancing_scheme.as_ref().and_then(|s| s.name()))]
            }
            (None, Ok(s)) => vec![s],
            (None, Err(_)) => vec![Scheme::External, Scheme::Internal],
        };
        for s in schemes {
            match s {
                Scheme::External => {
                    if !external::ours(service, existing.as_ref()) {
                        tracing::info!(service = %key, "GCE: external load balancer implemented elsewhere; nothing to delete");
                        continue;
                    }
                    external::delete_for_service(self, cx).await?
                }
                Scheme::Internal => {
                    if !self.is_ours(service, s, existing.as_ref()) {
                        tracing::info!(service = %key, "GCE: ILBSubsets: internal load balancer of GKE's controller; nothing to delete");
                        continue;
                    }
                    internal::delete_for_service(self, cx, existing.as_ref()).await?
                }
            }
        }
        self.remove_upstream_finalizers(service).await
    }

    /// Upstream's `raiseFirewallChangeNeededEvent`: for each firewall change Compute refused
    /// on a Shared VPC (the network project's administrators own the firewalls), a Normal
    /// Event `LoadBalancerManualChange` on the Service with the full `gcloud` command.
    async fn report_manual_changes(&self, cx: &Ctx<'_>) {
        let commands = cx.api.take_manual_changes();
        for cmd in commands {
            tracing::warn!(service = %annotations::service_key(cx.service), command = %cmd, "GCE: firewall change required by the network project's administrator");
            if let Some(events) = self.events.get() {
                events
                    .event(
                        cx.service,
                        kube::runtime::events::EventType::Normal,
                        kube_api::MANUAL_CHANGE_REASON,
                        format!("Firewall change required by security admin: `{cmd}`"),
                    )
                    .await;
            }
        }
    }

    /// Whether this provider handles the Service's `scheme` load balancer given the
    /// forwarding rule `<lb>` found (`existing`): external as `external::ours` says;
    /// internal always, except with `ILBSubsets` for a Service without proof of an earlier
    /// legacy load balancer (its INTERNAL rule, upstream's `l4-ilb-v1` finalizer or the
    /// legacy internal class), as upstream.
    fn is_ours(
        &self,
        service: &Service,
        scheme: Scheme,
        existing: Option<&google_cloud_compute_v1::model::ForwardingRule>,
    ) -> bool {
        match scheme {
            Scheme::External => external::ours(service, existing),
            Scheme::Internal => {
                !self.alpha.ilb_subsets
                    || has_finalizer(service, keys::FINALIZER_ILB_V1)
                    || annotations::class(service) == Class::InternalLegacy
                    || existing.is_some_and(|f| {
                        Scheme::of_rule(f.load_balancing_scheme.as_ref().and_then(|s| s.name()))
                            == Scheme::Internal
                    })
            }
        }
    }

    /// `--enable-l4-lb-annotations`: the Service names the resource carrying its traffic
    /// (`networking.gke.io/target-pool: <lb>` for the external load balancer,
    /// `networking.gke.io/backend-service: <backend service>` for the internal one) and loses
    /// the other key, written (through the `status` subresource, as upstream) only when they
    /// differ from the Service's.
    async fn annotate_resources(&self, cx: &Ctx<'_>, conf: &ServiceConfig) -> Result<(), LbError> {
        let want: [(&str, Option<String>); 2] = match conf.scheme {
            Scheme::External => [
                (keys::STATUS_TARGET_POOL, Some(cx.lb.clone())),
                (keys::STATUS_BACKEND_SERVICE, None),
            ],
            Scheme::Internal => [
                (keys::STATUS_TARGET_POOL, None),
                (
                    keys::STATUS_BACKEND_SERVICE,
                    Some(naming::backend_service(
                        &cx.lb,
                        &cx.cluster_id,
                        conf.share_backend,
                        &conf.protocol,
                        &conf.k8s_affinity,
                    )),
                ),
            ],
        };
        let have = cx.service.metadata.annotations.as_ref();
        if want.iter().all(|(k, v)| have.and_then(|a| a.get(*k)) == v.as_ref()) {
            return Ok(());
        }
        let service = annotations::service_key(cx.service);
        let (Some(kube), Some(name)) = (self.kube.get(), cx.service.metadata.name.as_deref())
        else {
            return Err(ProviderError::other(format!(
                "--enable-l4-lb-annotations: cannot annotate Service {service}: no Kubernetes client"
            ))
            .into());
        };
        let ns = cx.service.metadata.namespace.as_deref().unwrap_or("default");
        let api: kube::Api<Service> = kube::Api::namespaced(kube.clone(), ns);
        let annotations: serde_json::Map<String, serde_json::Value> =
            want.iter().map(|(k, v)| (k.to_string(), serde_json::json!(v))).collect();
        let patch = serde_json::json!({ "metadata": { "annotations": annotations } });
        let params = kube::api::PatchParams::default();
        let patch = kube::api::Patch::Merge(&patch);
        let call = api.patch_status(name, &params, &patch);
        match tokio::time::timeout(KUBE_TIMEOUT, call).await {
            Ok(Ok(_)) => {
                tracing::info!(%service, annotations = ?want, "GCE: annotated the Service with its load balancer's resources");
                Ok(())
            }
            Ok(Err(e)) => Err(ProviderError::with_source(
                format!("failed to set resource annotations on Service {service}: {e}"),
                e,
            )
            .into()),
            Err(_) => Err(ProviderError::other(format!(
                "failed to set resource annotations on Service {service}: no answer from the API server within {}s",
                KUBE_TIMEOUT.as_secs()
            ))
            .into()),
        }
    }

    /// Removes upstream's `gke.networking.io/l4-{netlb,ilb}-v1` finalizers (written by the
    /// upstream controller before the swap), so the Service's deletion is not held forever.
    async fn remove_upstream_finalizers(&self, service: &Service) -> Result<(), LbError> {
        let ours: Vec<&str> = [keys::FINALIZER_NETLB_V1, keys::FINALIZER_ILB_V1]
            .into_iter()
            .filter(|f| has_finalizer(service, f))
            .collect();
        if ours.is_empty() {
            return Ok(());
        }
        let (Some(kube), Some(name)) = (self.kube.get(), service.metadata.name.as_deref()) else {
            tracing::warn!(service = %annotations::service_key(service), finalizers = ?ours,
                "GCE: cannot remove upstream's finalizers: no Kubernetes client");
            return Ok(());
        };
        let ns = service.metadata.namespace.as_deref().unwrap_or("default");
        let api: kube::Api<Service> = kube::Api::namespaced(kube.clone(), ns);
        let patch =
            serde_json::json!({ "metadata": { "$deleteFromPrimitiveList/finalizers": ours } });
        match api
            .patch(name, &kube::api::PatchParams::default(), &kube::api::Patch::Strategic(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(service = %annotations::service_key(service), finalizers = ?ours, "GCE: removed upstream's finalizers");
                Ok(())
            }
            Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
            Err(e) => {
                Err(ProviderError::with_source(format!("removing finalizers {ours:?}: {e}"), e)
                    .into())
            }
        }
    }

    async fn get(&self, service: &Service) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        let key = annotations::service_key(service);
        let lb = default_load_balancer_name(service);
        let run = async {
            let api = Api::new(&self.client).await?;
            if let Some(fr) = api.forwarding_rule(&lb).await? {
                return Ok(Some(status(fr.ip_address.as_deref().unwrap_or_default())));
            }
            if has_finalizer(service, keys::FINALIZER_ILB_V1)
                || has_finalizer(service, keys::FINALIZER_NETLB_V1)
            {
                return Ok(Some(LoadBalancerStatus::default()));
            }
            let left = api.target_pool(&lb).await?.is_some()
                || api.backend_service(&lb).await?.is_some()
                || api.firewall(&naming::firewall(&lb)).await?.is_some()
                || api.address(&lb).await?.is_some();
            Ok(left.then(LoadBalancerStatus::default))
        };
        run.await.map_err(|e: LbError| self.finish(&lb, &key, e))
    }
}

/// Google's auto-mode subnetwork range (every auto-mode subnetwork is a /20 inside it).
pub const AUTO_MODE_RANGE: &str = "10.128.0.0/9";

/// Upstream's `determineSubnetURL` for the cluster network: its mode, then its one
/// subnetwork of the region inside [`AUTO_MODE_RANGE`].
async fn auto_mode_subnetwork(api: &Api<'_>) -> Result<String, LbError> {
    let network = crate::client::last_segment(&api.scope.network_url).to_string();
    let needs = |why: String| -> LbError {
        ProviderError::Invalid {
            what: "subnetwork-name".into(),
            message: format!(
                "{why}; an internal load balancer needs a subnetwork: set `subnetwork-name` in gce.conf or annotate the Service with {}",
                annotations::keys::SUBNET
            ),
        }
        .into()
    };
    let Some(net) = api.network().await? else {
        return Err(needs(format!(
            "network {network} (project {}) was not found",
            api.scope.network_project
        )));
    };
    // Compute still reports a legacy network's range here (deprecated in the API, as legacy
    // networks are): upstream's `typeOfNetwork` reads the same field.
    #[allow(deprecated)]
    let legacy = net.i_pv_4_range.as_deref().is_some_and(|r| !r.is_empty());
    if legacy {
        return Err(needs(format!(
            "network {network} is a legacy network (no subnetworks), which internal load balancers here do not support"
        )));
    }
    if net.auto_create_subnetworks != Some(true) {
        return Err(needs(format!(
            "network {network} is a custom-mode network, so no subnetwork is picked for it"
        )));
    }
    let range: ipnet::Ipv4Net = AUTO_MODE_RANGE
        .parse()
        .map_err(|e: ipnet::AddrParseError| ProviderError::other(e.to_string()))?;
    let mut inside = Vec::new();
    for s in api.network_subnetworks().await? {
        let cidr = s.ip_cidr_range.as_deref().unwrap_or_default();
        let Ok(net) = cidr.parse::<ipnet::Ipv4Net>() else {
            return Err(ProviderError::other(format!(
                "subnetwork {} of network {network} has an unreadable range {cidr:?}",
                s.name.as_deref().unwrap_or_default()
            ))
            .into());
        };
        if range.contains(&net) {
            inside.push(s);
        }
    }
    match inside.as_slice() {
        [one] => one.self_link.clone().ok_or_else(|| {
            ProviderError::other(format!(
                "subnetwork {} has no selfLink",
                one.name.as_deref().unwrap_or_default()
            ))
            .into()
        }),
        [] => Err(needs(format!(
            "auto-mode network {network} has no subnetwork in region {} inside {AUTO_MODE_RANGE}",
            api.scope.region
        ))),
        many => Err(needs(format!(
            "auto-mode network {network} has {} subnetworks in region {} inside {AUTO_MODE_RANGE} ({})",
            many.len(),
            api.scope.region,
            many.iter().filter_map(|s| s.name.as_deref()).collect::<Vec<_>>().join(", ")
        ))),
    }
}

/// `spec.loadBalancerIP` may not be an IP another load balancer answers on: a forwarding
/// rule of the region other than this Service's own `<lb>` holding `ip` (another Service's,
/// another cluster's, a person's) makes the request an error before anything is created,
/// so the IP never reaches the status (kube-proxy would capture traffic meant for it).
pub(crate) async fn refuse_ip_of_other_rules(
    api: &Api<'_>,
    lb: &str,
    ip: &str,
) -> Result<(), LbError> {
    let others: Vec<String> = api
        .forwarding_rules()
        .await?
        .into_iter()
        .filter(|f| f.ip_address.as_deref() == Some(ip))
        .filter_map(|f| f.name)
        .filter(|n| n != lb)
        .collect();
    if others.is_empty() {
        return Ok(());
    }
    Err(ProviderError::Invalid {
        what: "spec.loadBalancerIP".into(),
        message: format!(
            "requested IP {ip} is in use by the forwarding rule(s) {} of another load balancer; choose an IP only this Service uses",
            others.join(", ")
        ),
    }
    .into())
}

/// A status with one ingress IP.
pub(crate) fn status(ip: &str) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: Some(vec![LoadBalancerIngress { ip: Some(ip.to_string()), ..Default::default() }]),
    }
}

#[async_trait]
impl LoadBalancer for GceLoadBalancer {
    async fn get_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        self.get(service).await
    }

    async fn ensure_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        self.ensure(service, nodes).await
    }

    async fn update_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<(), ProviderError> {
        self.update(service, nodes).await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<(), ProviderError> {
        self.delete(service).await
    }

    /// The region's forwarding rules named `a<uid>` and described for a Service, with their
    /// target pool or backend service, health checks, firewalls and address. Owned when
    /// something names this cluster: the shared `k8s-<clusterID>-node` health check (external,
    /// Cluster policy) or the `k8s-ig--<clusterID>` instance groups (internal). An external
    /// Local-policy load balancer carries no cluster name: listed, never owned.
    async fn list_cloud_load_balancers(
        &self,
        _cluster_name: &str,
    ) -> Result<Vec<CloudLoadBalancer>, ProviderError> {
        let run = async {
            let cluster_id = self.cluster_id.get().await?;
            let api = Api::new(&self.client).await?;
            let mut out = Vec::new();
            for fr in api.forwarding_rules().await? {
                if let Some(entry) = inventory(&api, &cluster_id, fr).await? {
                    out.push(entry.lb);
                }
            }
            Ok::<_, LbError>(out)
        };
        run.await.map_err(|e| self.finish("*", "orphans", e))
    }

    /// Deletes a listed load balancer after checking again that it is owned.
    async fn delete_cloud_load_balancer(
        &self,
        _cluster_name: &str,
        lb: &CloudLoadBalancer,
    ) -> Result<(), ProviderError> {
        let run = async {
            let cluster_id = self.cluster_id.get().await?;
            let api = Api::new(&self.client).await?;
            let Some(fr) = api.forwarding_rule(&lb.name).await? else { return Ok(()) };
            let Some(entry) = inventory(&api, &cluster_id, fr).await? else {
                return Err(ProviderError::Invalid {
                    what: format!("load balancer {}", lb.name),
                    message: "not a load balancer of this provider, refusing to delete it".into(),
                }
                .into());
            };
            if !entry.lb.owned {
                return Err(ProviderError::Invalid {
                    what: format!("load balancer {}", lb.name),
                    message: format!("not owned by cluster ID {cluster_id}, refusing to delete it"),
                }
                .into());
            }
            let _guard = self.shared.lock().await;
            match entry.kind {
                Kind::External { health_checks } => {
                    external::delete(&api, &lb.name, &cluster_id, &health_checks).await
                }
                Kind::Internal { backend_service, health_check } => {
                    internal::delete(
                        &api,
                        &lb.name,
                        &cluster_id,
                        &backend_service,
                        health_check.as_deref(),
                        self.alpha.skip_igs_management,
                    )
                    .await
                }
            }
        };
        run.await.map_err(|e| self.finish(&lb.name, lb.service.as_deref().unwrap_or("orphan"), e))
    }
}

enum Kind {
    External { health_checks: Vec<String> },
    Internal { backend_service: String, health_check: Option<String> },
}

struct Entry {
    lb: CloudLoadBalancer,
    kind: Kind,
}

fn resource(kind: &str, name: &str) -> ccm_core::cloud::CloudResource {
    ccm_core::cloud::CloudResource { kind: kind.into(), id: name.into(), name: name.into() }
}

/// A forwarding rule as a [`CloudLoadBalancer`], when it has this provider's shape.
async fn inventory(
    api: &Api<'_>,
    cluster_id: &str,
    fr: google_cloud_compute_v1::model::ForwardingRule,
) -> Result<Option<Entry>, LbError> {
    let name = fr.name.clone().unwrap_or_default();
    let service = fr.description.as_deref().and_then(naming::service_of_description);
    if !naming::is_load_balancer_name(&name) || service.is_none() {
        return Ok(None);
    }
    let mut resources = vec![];
    if let Some(a) = api.address(&name).await? {
        resources.push(resource("address", a.name.as_deref().unwrap_or(&name)));
    }
    if api.firewall(&naming::firewall(&name)).await?.is_some() {
        resources.push(resource("firewall", &naming::firewall(&name)));
    }
    let (kind, owned, what) = if fr.target.as_deref().is_some_and(|t| !t.is_empty()) {
        let mut hcs = vec![];
        if let Some(tp) = api.target_pool(&name).await? {
            resources.push(resource("target pool", &name));
            hcs = tp
                .health_checks
                .iter()
                .map(|h| crate::client::last_segment(h).to_string())
                .collect();
        }
        for h in &hcs {
            resources.push(resource("HTTP health check", h));
        }
        let owned = hcs.iter().any(|h| naming::is_shared_health_check(h, cluster_id));
        (Kind::External { health_checks: hcs }, owned, "target-pool network load balancer")
    } else {
        let bs_name = fr
            .backend_service
            .as_deref()
            .map(crate::client::last_segment)
            .unwrap_or(&name)
            .to_string();
        let mut hc = None;
        let mut owned = false;
        if let Some(bs) = api.backend_service(&bs_name).await? {
            resources.push(resource("backend service", &bs_name));
            hc = bs.health_checks.first().cloned();
            // `k8s-ig--<clusterID>`, or (SkipIGsManagement) a group named after it.
            let ig = naming::instance_group(cluster_id);
            owned = bs.backends.iter().any(|b| {
                b.group
                    .as_deref()
                    .map(crate::client::last_segment)
                    .is_some_and(|g| g == ig || g.starts_with(&format!("{ig}-")))
            });
        }
        if let Some(h) = &hc {
            let kind =
                if api::is_regional_link(h) { "regional health check" } else { "health check" };
            resources.push(resource(kind, crate::client::last_segment(h)));
        }
        (
            Kind::Internal { backend_service: bs_name, health_check: hc },
            owned,
            "internal passthrough load balancer",
        )
    };
    let lb = CloudLoadBalancer {
        name: name.clone(),
        kind: what.into(),
        id: fr.id.map(|i| i.to_string()).unwrap_or_default(),
        ingress: fr.ip_address.into_iter().collect(),
        owned,
        service,
        resources,
    };
    Ok(Some(Entry { lb, kind }))
}
