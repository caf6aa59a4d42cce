//! LoadBalancer: one Octavia load balancer per Service, as upstream's
//! `pkg/openstack/loadbalancer.go` and `loadbalancer_sg.go` build it.
//!
//! - **Names** (upstream's formats, each cut to 255 bytes): load balancer
//!   `kube_service_<cluster>_<namespace>_<name>` (tagged with its own name; the legacy
//!   `a<uid>` name is still found), listener `listener_<i>_<lb>`, pool `pool_<i>_<lb>`,
//!   monitor `monitor_<i>_<lb>` for Service port `i`; security group
//!   `lb-sg-<uid>-<namespace>-<name>`. Descriptions as upstream: `Kubernetes external service
//!   <ns>/<name> from cluster <cluster>` (load balancer), `Floating IP for Kubernetes external
//!   service <ns>/<name> from cluster <cluster>` (how deletion recognises a floating IP it
//!   created), `Security Group for <ns>/<name> Service LoadBalancer in cluster <cluster>`.
//! - **VIP**: `port-id`, else `subnet-id` / `network-id` (annotation > class > config), else
//!   the subnet of the first member node's port holding its address (as upstream).
//! - **Per port**: a listener (TCP/UDP/SCTP, HTTP with `x-forwarded-for`, `TERMINATED_HTTPS`
//!   naming the Barbican container of `default-tls-container-ref`, which is read from
//!   Barbican first, before any Octavia call, as upstream; connection limit,
//!   timeouts, `allowed_cidrs` from the source ranges, tagged with the load balancer name),
//!   its pool (`lb-method`, PROXY/PROXYV2, `SOURCE_IP` persistence for `ClientIP` affinity),
//!   members = the nodes' `InternalIP` (else `ExternalIP`) of the Service's IP family on the
//!   node port, replaced by ONE batch update per pool and only when they differ, and a health
//!   monitor when enabled. Existing listeners are brought to the annotations in place
//!   (cloud-provider-openstack#1149); a listener whose protocol changes (X-Forwarded-For) and
//!   listeners of ports the Service no longer has are deleted with their pools **before** new
//!   ones are created, so a port is never claimed twice.
//! - **Nothing waits for Octavia inside a sync** (issue #35): a load balancer found
//!   `PENDING_*`, a change just sent (Octavia makes the load balancer `PENDING_UPDATE` until
//!   it is applied) and a 409 while it is pending are a [`ProviderError::RetryAfter`], so the
//!   service controller's worker moves on to the next Service and comes back after the
//!   delay; the next sync resumes from what exists (listeners, pools, members and monitors
//!   are found by port and protocol, never created twice). The address is returned only by
//!   the sync that finds everything in place. `ERROR` is an error naming the load balancer;
//!   one this cluster created for the Service that went `ERROR` before it had a listener
//!   (its create failed) is deleted so that the next sync creates it afresh, as upstream.
//!   Upstream (v1.36) waits in the sync instead (up to ≈5.4 min per step); with
//!   [`Timings::max_wait`] above zero this provider waits too (tests of the end state use
//!   it). Calls are sent one by one (the single-call "fully populated" create is not used);
//!   with `provider-requires-serial-api-calls` members too are added and removed one per
//!   call.
//! - **Octavia version** ([`features`]): discovered once, features gated as upstream.
//! - **Written back** ([`kube_api`]): `load-balancer-id` and `load-balancer-address` on the
//!   Service, Warning Events; **renamed** on a `--cluster-name` change ([`rename`]).
//! - **Floating IP** unless internal: the one on the VIP port, else `spec.loadBalancerIP`'s
//!   (an existing, unassociated floating IP of the project), else a new one on the floating
//!   network (class > annotation > config, else the only external network) and subnet spec.
//!   Deleting the Service deletes the floating IP it created unless `keep-floatingip`; a kept
//!   or user-provided one is disassociated.
//! - **Security group** with `[LoadBalancer] manage-security-groups`: ingress rules on the
//!   node ports (and health-check node port) from the member subnet's CIDR (the source ranges
//!   with `lb-provider = ovn`) and no other rule (Neutron's default egress rules are deleted,
//!   as upstream; a group of that name not described as this Service's is refused), added to
//!   the member nodes' ports on the member subnet and taken
//!   off ports that are no longer members; removed from every port and deleted with the
//!   Service (also when the load balancer is already gone).
//! - **Ownership** (issue #29): this cluster created a load balancer for a Service when its
//!   name is `kube_service_<cluster>_<ns>_<name>` (or the legacy `a<uid>`) AND its description
//!   is upstream's `Kubernetes external service <ns>/<name> from cluster <cluster>`, both
//!   written at creation ([`created_for`]). Tags are never proof: a sharer writes its own.
//!   Found by name but not created for the Service: an error, never adopted.
//! - **Sharing**: `load-balancer-id` names the Service's own load balancer, or one to share
//!   (its tags count the Services, up to `max-shared-lb`; internal Services cannot share; only
//!   the owner may add a floating IP). A load balancer created for a Service of another
//!   namespace, by another cluster or by hand is used only with `[LoadBalancer]
//!   allow-cross-namespace-sharing` (upstream: any, by anyone). A sharer or user
//!   adds and removes only its own listeners (tagged with its name) and its tag: it never
//!   deletes the load balancer nor its floating IP, with one exception: the owner deleted
//!   while others still shared it marks it [`OWNER_GONE_TAG`] (and
//!   [`OWNER_GONE_KEEP_FIP_TAG`] when it kept its floating IP), and the last allowed sharer of
//!   a load balancer this cluster created then deletes it, as upstream's "last user".
//! - **Floating IPs** are deleted only when their description is exactly
//!   `Floating IP for Kubernetes external service <ns>/<name> from cluster <cluster>` for the
//!   Service the load balancer was created for, that Service did not ask to keep it
//!   (`keep-floatingip`, or `spec.loadBalancerIP`), and the load balancer is being deleted by
//!   its owner (or its last allowed sharer after the owner); else they are disassociated.
//! - **Status**: the floating IP (or the VIP when internal or IPv6); `hostname` replaces it;
//!   with PROXY protocol the IP has `ipMode: Proxy`, or with `enable-ingress-hostname` a
//!   `<ip>.<ingress-hostname-suffix>` hostname.

pub mod annotations;
pub mod features;
pub mod kube_api;
pub mod octavia;
pub mod rename;

use std::collections::{BTreeMap, BTreeSet};
use std::future::Future;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::cloud::{
    CloudLoadBalancer, CloudResource, LoadBalancer, ProviderError, default_load_balancer_name,
};
use ccm_core::cloud_call::api_metrics::{self, ApiMetrics};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use serde_json::{Value, json};

pub use annotations::ANNOTATIONS;
use annotations::{PortSpec, ServiceConfig, keys, node_address, node_matches, service_key};
use features::{Features, VersionCache};
use kube_api::KubeHandle;
use octavia::{Api, FloatingIp, Listener, Pool, Rule};

use crate::client::{ClientError, OpenStackClient, Service as ClientService};
use crate::config::Config;
use crate::instances::parse_provider_id;

/// Upstream's Warning reason when no floating network is configured and none is found.
pub const EVENT_EXTERNAL_NETWORK_SEARCH_FAILED: &str = "LoadBalancerExternalNetworkSearchFailed";
/// Upstream's Warning reason when an external Service is given its VIP for want of a
/// floating network.
pub const EVENT_FORCED_INTERNAL: &str = "LoadBalancerForcedInternal";
/// Upstream's Warning reason when an IPv6 load balancer's VIP is reported (no floating IPs
/// for IPv6); raised for internal Services too, as upstream.
pub const EVENT_FLOATING_IP_SKIPPED: &str = "LoadBalancerFloatingIPSkipped";

/// The name prefix of the load balancers (and of their tags).
pub const SERVICE_PREFIX: &str = "kube_service_";
/// How a floating IP created by this provider (and upstream) is described.
pub const FIP_DESCRIPTION_PREFIX: &str = "Floating IP for Kubernetes external service";
/// Tag added when the Service a load balancer was created for is deleted while other Services
/// still share it: the last of them (allowed to share) deletes it.
pub const OWNER_GONE_TAG: &str = "ccm_owner_deleted";
/// Added with [`OWNER_GONE_TAG`] when that Service kept its floating IP (`keep-floatingip` or
/// its own `spec.loadBalancerIP`): the floating IP is then only disassociated.
pub const OWNER_GONE_KEEP_FIP_TAG: &str = "ccm_owner_deleted_keep_floatingip";
/// Nodes up to this many have their ports listed one by one; more: one listing of all ports.
const PORTS_ONE_BY_ONE: usize = 2;

/// How long a sync may wait for a load balancer to become `ACTIVE` (or gone), and how often
/// to ask.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// Time between `GET /lbaas/loadbalancers/{id}` polls while waiting; twice it (at least
    /// 1 s) is the delay of the [`ProviderError::RetryAfter`] a pending load balancer asks for.
    pub poll: Duration,
    /// The longest wait inside one sync for one state change; then
    /// [`ProviderError::RetryAfter`]. Zero (the default): never wait, a pending load balancer
    /// is a `RetryAfter` at once and the sync resumes where it stopped.
    pub max_wait: Duration,
}

impl Default for Timings {
    /// Never wait inside a sync; retry a pending load balancer every 4 s (upstream waits in
    /// the sync: 1 s growing ×1.2 for 23 steps, ≈5.4 min).
    fn default() -> Self {
        Timings { poll: Duration::from_secs(2), max_wait: Duration::ZERO }
    }
}

impl Timings {
    /// Whether a sync waits for Octavia (`max_wait` above zero).
    pub fn waits(&self) -> bool {
        !self.max_wait.is_zero()
    }
}

/// How long the operator tools ([`LoadBalancer::delete_cloud_load_balancer`]) wait for a
/// load balancer to settle or go: they run outside the service controller's workers.
const TOOL_WAIT: Duration = Duration::from_secs(300);

/// `s` cut to at most 255 bytes (on a character boundary), as upstream's `Sprintf255`.
pub fn cut255(mut s: String) -> String {
    if s.len() > 255 {
        let mut end = 255;
        while !s.is_char_boundary(end) {
            end -= 1;
        }
        s.truncate(end);
    }
    s
}

/// `kube_service_<cluster>_<namespace>_<name>`, at most 255 bytes.
pub fn load_balancer_name(cluster: &str, service: &Service) -> String {
    cut255(format!(
        "{SERVICE_PREFIX}{cluster}_{}_{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    ))
}

/// `listener_<i>_<lb>`.
pub fn listener_name(index: usize, lb: &str) -> String {
    cut255(format!("listener_{index}_{lb}"))
}

/// `pool_<i>_<lb>`.
pub fn pool_name(index: usize, lb: &str) -> String {
    cut255(format!("pool_{index}_{lb}"))
}

/// `monitor_<i>_<lb>`.
pub fn monitor_name(index: usize, lb: &str) -> String {
    cut255(format!("monitor_{index}_{lb}"))
}

/// `lb-sg-<uid>-<namespace>-<name>`, at most 255 bytes.
pub fn security_group_name(service: &Service) -> String {
    cut255(format!(
        "lb-sg-{}-{}-{}",
        service.metadata.uid.as_deref().unwrap_or_default(),
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    ))
}

fn lb_description(service: &str, cluster: &str) -> String {
    format!("Kubernetes external service {service} from cluster {cluster}")
}

fn fip_description(service: &str, cluster: &str) -> String {
    format!("{FIP_DESCRIPTION_PREFIX} {service} from cluster {cluster}")
}

fn sg_description(service: &str, cluster: &str) -> String {
    format!("Security Group for {service} Service LoadBalancer in cluster {cluster}")
}

/// `(service, cluster)` of a load balancer description written by [`lb_description`].
fn parse_lb_description(d: &str) -> Option<(String, String)> {
    let rest = d.strip_prefix("Kubernetes external service ")?;
    let (service, cluster) = rest.split_once(" from cluster ")?;
    Some((service.to_string(), cluster.to_string()))
}

/// `(service, cluster)` of a floating IP description written by [`fip_description`].
fn parse_fip_description(d: &str) -> Option<(String, String)> {
    let rest = d.strip_prefix(FIP_DESCRIPTION_PREFIX)?.strip_prefix(' ')?;
    let (service, cluster) = rest.split_once(" from cluster ")?;
    Some((service.to_string(), cluster.to_string()))
}

/// Whether the floating IP's ownership record names exactly `service` (`<ns>/<name>`) of
/// `cluster` (never a prefix match).
fn fip_created_for(fip: &FloatingIp, service: &str, cluster: &str) -> bool {
    !cluster.is_empty() && fip.description == fip_description(service, cluster)
}

/// Whom this cluster's (or another cluster's) provider created a load balancer for, read from
/// upstream's name and description, which must agree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Creator {
    /// The Service's namespace.
    pub namespace: String,
    /// The Service's name.
    pub name: String,
    /// The cluster.
    pub cluster: String,
}

impl Creator {
    /// `<namespace>/<name>`.
    pub fn service(&self) -> String {
        format!("{}/{}", self.namespace, self.name)
    }
}

/// The Service and cluster `lb` was created for: its description is upstream's
/// `Kubernetes external service <ns>/<name> from cluster <cluster>` and its name
/// `kube_service_<cluster>_<ns>_<name>` (cut to 255 bytes).
pub fn creator(lb: &octavia::LoadBalancer) -> Option<Creator> {
    let (service, cluster) = parse_lb_description(&lb.description)?;
    let (namespace, name) = service.split_once('/')?;
    if namespace.is_empty() || name.is_empty() || cluster.is_empty() {
        return None;
    }
    let expected = cut255(format!("{SERVICE_PREFIX}{cluster}_{namespace}_{name}"));
    (lb.name == expected).then(|| Creator {
        namespace: namespace.to_string(),
        name: name.to_string(),
        cluster,
    })
}

/// Whether this cluster created `lb` for `service`: named for it (or its legacy `a<uid>` name)
/// and described for it and this cluster, both written at creation. Tags are not proof.
pub fn created_for(lb: &octavia::LoadBalancer, cluster: &str, service: &Service) -> bool {
    if cluster.is_empty() || lb.description != lb_description(&service_key(service), cluster) {
        return false;
    }
    let legacy = default_load_balancer_name(service);
    lb.name == load_balancer_name(cluster, service) || (!legacy.is_empty() && lb.name == legacy)
}

/// What a Service is to a load balancer.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Role {
    /// This cluster created it for this Service.
    Owner,
    /// This cluster created it for another Service, which allows this one to share it (same
    /// namespace, or `allow-cross-namespace-sharing`).
    Sharer(Creator),
    /// Not created by this cluster (by hand, another cluster): used, never deleted.
    Guest,
}

/// Other Services' tags on `lb` (upstream's sharing count): `kube_service_…` other than `name`.
fn other_services(lb: &octavia::LoadBalancer, name: &str) -> usize {
    lb.tags.iter().filter(|t| *t != name && t.starts_with(SERVICE_PREFIX)).count()
}

fn is_ipv6(addr: &str) -> bool {
    addr.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_ipv6())
}

/// Whether a reconcile's error is a failure (the cached Octavia version is then asked again):
/// a load balancer still pending asks for a retry without having failed.
fn failed(e: &ProviderError) -> bool {
    !matches!(e, ProviderError::RetryAfter { .. })
}

fn invalid(what: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::Invalid { what: what.to_string(), message: message.into() }
}

/// A cloud error with what was being done to which load balancer.
fn ctx(name: &str, what: &str, e: ClientError) -> ProviderError {
    if e.status() == Some(429) {
        return e.into();
    }
    ProviderError::with_source(format!("load balancer {name}: {what}: {e}"), e)
}

/// A 409 saying the load balancer is pending (Octavia: `Invalid state PENDING_UPDATE of
/// loadbalancer resource …`, `Load Balancer … is immutable and cannot be updated`).
fn pending_conflict(e: &ClientError) -> bool {
    match e {
        ClientError::Api { status: 409, message, .. } => {
            message.contains("PENDING_") || message.to_ascii_lowercase().contains("immutable")
        }
        _ => false,
    }
}

/// The status of a Service with address `addr`.
fn status(conf: &ServiceConfig, addr: &str, config: &Config) -> LoadBalancerStatus {
    let one = |i: LoadBalancerIngress| LoadBalancerStatus { ingress: Some(vec![i]) };
    if !conf.hostname.is_empty() {
        return one(LoadBalancerIngress {
            hostname: Some(conf.hostname.clone()),
            ..Default::default()
        });
    }
    let mut mode = "VIP";
    if conf.proxy_protocol.is_some() {
        // PROXY protocol: keep kube-proxy from short-circuiting the load balancer.
        if config.load_balancer.enable_ingress_hostname {
            let host = format!("{addr}.{}", config.load_balancer.ingress_hostname_suffix);
            return one(LoadBalancerIngress { hostname: Some(host), ..Default::default() });
        }
        mode = "Proxy";
    }
    one(LoadBalancerIngress {
        ip: Some(addr.to_string()),
        ip_mode: Some(mode.into()),
        ..Default::default()
    })
}

/// One wanted member.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct MemberKey {
    name: String,
    address: String,
    port: i64,
    monitor_port: i64,
}

/// The LoadBalancer of the OpenStack provider (Octavia).
#[derive(Debug)]
pub struct OctaviaLoadBalancer {
    client: Arc<OpenStackClient>,
    config: Arc<Config>,
    timings: Timings,
    /// Octavia's API version, once discovered.
    version: VersionCache,
    /// The Kubernetes client (annotations written back, Events), once the manager gave one.
    kube: OnceLock<KubeHandle>,
}

impl OctaviaLoadBalancer {
    /// Load balancers on this client and config.
    pub fn new(client: Arc<OpenStackClient>, config: Arc<Config>, timings: Timings) -> Self {
        OctaviaLoadBalancer {
            client,
            config,
            timings,
            version: VersionCache::default(),
            kube: OnceLock::new(),
        }
    }

    /// Gives the load balancer a Kubernetes client (the manager's, from
    /// [`ccm_core::cloud::CloudProvider::initialize`]): from then on the `load-balancer-id`
    /// and `load-balancer-address` annotations are written back and Warning Events raised on
    /// Services. A second call is ignored.
    pub fn set_kube_client(&self, client: kube::Client) {
        let _ = self.kube.set(KubeHandle::new(client));
    }

    /// What the deployed Octavia supports: its API version (`GET /` on the load-balancer
    /// endpoint, cached; a failure is an error) and `lb-provider`.
    pub async fn features(&self) -> Result<Features, ProviderError> {
        let version = match self.version.get() {
            Some(v) => v,
            None => {
                let v = self.api().api_version().await.map_err(features::discovery_error)?;
                tracing::info!(version = %format!("v{}.{}", v.0, v.1), "OpenStack: Octavia API version");
                self.version.set(v);
                v
            }
        };
        Ok(Features::of(version, &self.config.load_balancer.lb_provider))
    }

    fn api(&self) -> Api<'_> {
        Api { client: &self.client }
    }

    fn retry_after(&self, message: String) -> ProviderError {
        ProviderError::RetryAfter {
            message,
            delay: (self.timings.poll * 2).max(Duration::from_secs(1)),
        }
    }

    /// The retry a load balancer that is `PENDING_*` asks for (nothing waits for Octavia).
    fn pending(&self, lb: &octavia::LoadBalancer) -> ProviderError {
        self.retry_after(format!(
            "load balancer {} ({}) is {}: the next step once it is ACTIVE",
            lb.name, lb.id, lb.provisioning_status
        ))
    }

    /// `lb` once it is `ACTIVE`: waited for when the timings allow a wait, else (a pending
    /// one) a [`ProviderError::RetryAfter`]. `ERROR` is returned as it is.
    async fn settled(
        &self,
        lb: octavia::LoadBalancer,
    ) -> Result<octavia::LoadBalancer, ProviderError> {
        if !lb.is_pending() {
            return Ok(lb);
        }
        if self.timings.waits() {
            let mut settled = self.wait_settled(&lb.id, &lb.name, self.timings.max_wait).await?;
            // The load balancer asked about (what a later delete acts on), whatever the
            // reply names.
            settled.id = lb.id;
            return Ok(settled);
        }
        Err(self.pending(&lb))
    }

    /// `lb` (pending or not) once `ACTIVE`, as [`Self::settled`]; `ERROR` is an error.
    async fn until_active(
        &self,
        lb: &octavia::LoadBalancer,
    ) -> Result<octavia::LoadBalancer, ProviderError> {
        let lb = self.settled(lb.clone()).await?;
        if lb.provisioning_status == "ERROR" {
            return Err(ProviderError::other(format!(
                "load balancer {} ({}) has gone into ERROR state: see `openstack loadbalancer show {}`",
                lb.name, lb.id, lb.id
            )));
        }
        Ok(lb)
    }

    // ---- ownership ------------------------------------------------------------------------

    /// What `service` is to `lb` (named by its `load-balancer-id`), or an error naming the
    /// annotation when it may not use it.
    fn role(
        &self,
        cluster: &str,
        service: &Service,
        lb: &octavia::LoadBalancer,
    ) -> Result<Role, ProviderError> {
        if created_for(lb, cluster, service) {
            return Ok(Role::Owner);
        }
        let namespace = service.metadata.namespace.as_deref().unwrap_or_default();
        let open = self.config.load_balancer.allow_cross_namespace_sharing;
        let refuse = |whose: String| {
            invalid(
                keys::LOAD_BALANCER_ID,
                format!(
                    "load balancer {} ({}) was created for {whose}: Service {} may not share it (set [LoadBalancer] allow-cross-namespace-sharing = true to allow sharing across namespaces and clusters)",
                    lb.id,
                    lb.name,
                    service_key(service)
                ),
            )
        };
        match creator(lb) {
            Some(c) if c.cluster == cluster && (c.namespace == namespace || open) => {
                Ok(Role::Sharer(c))
            }
            Some(c) if c.cluster == cluster => {
                Err(refuse(format!("Service {} of another namespace", c.service())))
            }
            Some(c) if !open => {
                Err(refuse(format!("Service {} of another cluster ({})", c.service(), c.cluster)))
            }
            // Made by hand, or a Service's whose name and description do not agree (a legacy
            // `a<uid>` name, an edited description): whose address it is cannot be told, so
            // only the operator's opt-in lets a Service use it.
            None if !open => Err(refuse(
                "no Service of this cluster (made by hand, or its name and description do not agree)"
                    .into(),
            )),
            _ => {
                tracing::info!(service = %service_key(service), load_balancer = %lb.id, "OpenStack: using a load balancer this cluster did not create (allow-cross-namespace-sharing)");
                Ok(Role::Guest)
            }
        }
    }

    /// An error for a load balancer found by the Service's name that this cluster did not
    /// create for it: never adopted.
    fn foreign_name(service: &Service, lb: &octavia::LoadBalancer) -> ProviderError {
        invalid(
            &format!("load balancer {}", lb.name),
            format!(
                "a load balancer with the name of Service {} exists ({}) but was not created for it by this cluster (description {:?}): refusing to use or delete it; rename or delete it, or name it with {}",
                service_key(service),
                lb.id,
                lb.description,
                keys::LOAD_BALANCER_ID
            ),
        )
    }

    // ---- finding and waiting ------------------------------------------------------------

    /// The Service's load balancer: by `load-balancer-id` (404: `None`), else by name, else
    /// by the legacy name. Ones being deleted do not count; two with the name are an error.
    async fn find(
        &self,
        lb_id: &str,
        name: &str,
        legacy: &str,
    ) -> Result<Option<octavia::LoadBalancer>, ProviderError> {
        self.find_among(lb_id, name, legacy, false).await
    }

    /// [`Self::find`]; with `deleting`, a load balancer of the name being deleted counts when
    /// no other has the name (a deletion resumed until it is gone).
    async fn find_among(
        &self,
        lb_id: &str,
        name: &str,
        legacy: &str,
        deleting: bool,
    ) -> Result<Option<octavia::LoadBalancer>, ProviderError> {
        let api = self.api();
        if !lb_id.is_empty() {
            return Ok(api.get_load_balancer(lb_id).await?);
        }
        for n in [name, legacy] {
            if n.is_empty() {
                continue;
            }
            let (gone, found): (Vec<_>, Vec<_>) = api
                .list_load_balancers(Some(n))
                .await?
                .into_iter()
                .partition(|lb| lb.is_deleting());
            match found.len() {
                0 if deleting && !gone.is_empty() => return Ok(gone.into_iter().next()),
                0 => continue,
                1 => return Ok(found.into_iter().next()),
                k => {
                    let ids: Vec<&str> = found.iter().map(|lb| lb.id.as_str()).collect();
                    return Err(ProviderError::other(format!(
                        "{k} load balancers are named {n} ({}): delete the extra ones",
                        ids.join(", ")
                    )));
                }
            }
        }
        Ok(None)
    }

    /// Polls until the load balancer is `ACTIVE` or `ERROR` (returned as it is), for up to
    /// `budget`.
    async fn wait_settled(
        &self,
        id: &str,
        name: &str,
        budget: Duration,
    ) -> Result<octavia::LoadBalancer, ProviderError> {
        let start = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.timings.poll).await;
            let lb = self
                .api()
                .get_load_balancer(id)
                .await
                .map_err(|e| ctx(name, "waiting for ACTIVE", e))?;
            let Some(lb) = lb else {
                return Err(ProviderError::other(format!(
                    "load balancer {name} ({id}) disappeared while waiting for it to become ACTIVE"
                )));
            };
            if matches!(lb.provisioning_status.as_str(), "ACTIVE" | "ERROR") {
                return Ok(lb);
            }
            if start.elapsed() >= budget {
                return Err(self.retry_after(format!(
                    "load balancer {name} ({id}) is still {}",
                    lb.provisioning_status
                )));
            }
            tracing::debug!(load_balancer = name, status = %lb.provisioning_status, "OpenStack: waiting for the load balancer to become ACTIVE");
        }
    }

    /// Polls until the load balancer is `ACTIVE` (for up to `budget`); `ERROR` is an error
    /// naming it.
    async fn wait_active(
        &self,
        id: &str,
        name: &str,
        budget: Duration,
    ) -> Result<octavia::LoadBalancer, ProviderError> {
        let lb = self.wait_settled(id, name, budget).await?;
        if lb.provisioning_status == "ERROR" {
            return Err(ProviderError::other(format!(
                "load balancer {name} ({id}) has gone into ERROR state: see `openstack loadbalancer show {id}`"
            )));
        }
        Ok(lb)
    }

    /// Polls until `GET` answers 404, for up to `budget` (zero: one look).
    async fn wait_gone(&self, id: &str, name: &str, budget: Duration) -> Result<(), ProviderError> {
        let start = tokio::time::Instant::now();
        loop {
            let Some(lb) = self
                .api()
                .get_load_balancer(id)
                .await
                .map_err(|e| ctx(name, "waiting for deletion", e))?
            else {
                return Ok(());
            };
            if start.elapsed() >= budget {
                return Err(self.retry_after(format!(
                    "load balancer {name} ({id}) is still {} after deletion",
                    lb.provisioning_status
                )));
            }
            tokio::time::sleep(self.timings.poll).await;
        }
    }

    /// One Octavia change: sent, then (when the timings allow a wait) waited out until the
    /// load balancer is `ACTIVE`, else a [`ProviderError::RetryAfter`]: Octavia applies it
    /// meanwhile and the next sync goes on from there. A 409 while the load balancer is
    /// pending is waited out and the change sent again, or (no wait) a `RetryAfter`.
    async fn mutate<T, F, Fut>(
        &self,
        id: &str,
        name: &str,
        what: &str,
        call: F,
    ) -> Result<T, ProviderError>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<T, ClientError>>,
    {
        let start = tokio::time::Instant::now();
        loop {
            match call().await {
                Ok(v) if self.timings.waits() => {
                    self.wait_active(id, name, self.timings.max_wait).await?;
                    return Ok(v);
                }
                Ok(_) => {
                    return Err(self.retry_after(format!(
                        "load balancer {name} ({id}): {what}: sent; Octavia applies it (PENDING_UPDATE), the next step once it is ACTIVE"
                    )));
                }
                Err(e) if e.is_conflict() => {
                    let pending = pending_conflict(&e)
                        || self
                            .api()
                            .get_load_balancer(id)
                            .await?
                            .is_some_and(|lb| lb.is_pending());
                    if !pending {
                        return Err(ctx(name, what, e));
                    }
                    if start.elapsed() >= self.timings.max_wait {
                        return Err(self.retry_after(format!(
                            "load balancer {name} ({id}) is busy: {what}: {e}"
                        )));
                    }
                    tracing::debug!(
                        load_balancer = name,
                        what,
                        "OpenStack: load balancer pending, waiting to send again"
                    );
                    self.wait_active(id, name, self.timings.max_wait).await?;
                }
                Err(e) => return Err(ctx(name, what, e)),
            }
        }
    }

    /// Deletes a load balancer (its children with `cascade`) and waits up to `budget` until
    /// it is gone (zero: one look; still there: [`ProviderError::RetryAfter`]). A 409 while
    /// it is pending is waited out within `budget` and the delete sent again.
    async fn delete_lb(
        &self,
        id: &str,
        name: &str,
        cascade: bool,
        budget: Duration,
    ) -> Result<(), ProviderError> {
        let start = tokio::time::Instant::now();
        loop {
            match self.api().delete_load_balancer(id, cascade).await {
                Ok(()) => break,
                Err(e) if e.is_not_found() => return Ok(()),
                Err(e) if e.is_conflict() => {
                    if start.elapsed() >= budget {
                        return Err(
                            self.retry_after(format!("load balancer {name} ({id}) is busy: {e}"))
                        );
                    }
                    match self.api().get_load_balancer(id).await? {
                        None => return Ok(()),
                        Some(lb) if lb.provisioning_status == "PENDING_DELETE" => break,
                        // Still pending, or it was pending when Octavia refused and has
                        // settled since: try again (within max_wait).
                        Some(lb) if lb.is_pending() || pending_conflict(&e) => {
                            tokio::time::sleep(self.timings.poll).await;
                        }
                        Some(_) => return Err(ctx(name, "deleting", e)),
                    }
                }
                Err(e) => return Err(ctx(name, "deleting", e)),
            }
        }
        self.wait_gone(id, name, budget).await
    }

    // ---- subnets --------------------------------------------------------------------------

    /// Upstream's subnet discovery: with no `subnet-id` and no `network-id`, the VIP (and
    /// member) subnet is the subnet of the first member node's port holding its address.
    async fn resolve_subnets(
        &self,
        conf: &mut ServiceConfig,
        nodes: &[&Node],
    ) -> Result<(), ProviderError> {
        if !conf.subnet_id.is_empty() || !conf.network_id.is_empty() {
            return Ok(());
        }
        let Some(node) = nodes.first() else { return Ok(()) };
        let node_name = node.metadata.name.as_deref().unwrap_or_default();
        let fail = |why: String| {
            ProviderError::other(format!(
                "no subnet-id found for Service {}: node {node_name}: {why} (set [LoadBalancer] subnet-id or the annotation {})",
                conf.service,
                keys::SUBNET_ID
            ))
        };
        let addr = node_address(node, conf.ip_family)
            .ok_or_else(|| fail("it has no usable address".into()))?;
        let provider_id =
            node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default();
        let (server, _) = parse_provider_id(provider_id).map_err(|e| fail(e.to_string()))?;
        let ports = self.api().list_ports(&[("device_id", server)]).await?;
        let subnet = ports
            .iter()
            .flat_map(|p| &p.fixed_ips)
            .find(|ip| ip.ip_address == addr)
            .map(|ip| ip.subnet_id.clone())
            .ok_or_else(|| fail(format!("no port of its server holds {addr}")))?;
        conf.subnet_id = subnet.clone();
        if !conf.member_subnet_explicit {
            conf.member_subnet_id = subnet;
        }
        Ok(())
    }

    // ---- creation -------------------------------------------------------------------------

    async fn create(
        &self,
        cluster: &str,
        name: &str,
        conf: &ServiceConfig,
    ) -> Result<octavia::LoadBalancer, ProviderError> {
        let mut body = json!({
            "name": name,
            "description": lb_description(&conf.service, cluster),
            "provider": self.config.load_balancer.lb_provider,
        });
        // Tags need Octavia API 2.5; without them ownership still rests on name and
        // description (tags were never proof).
        if conf.tags {
            body["tags"] = json!([name]);
        }
        if !conf.flavor_id.is_empty() {
            body["flavor_id"] = json!(conf.flavor_id);
        }
        if !conf.availability_zone.is_empty() {
            body["availability_zone"] = json!(conf.availability_zone);
        }
        if !conf.port_id.is_empty() {
            // The port is used as the VIP, never taken from its device: one in use is refused.
            let ports = self.api().list_ports(&[("id", conf.port_id.clone())]).await?;
            let port = ports.iter().find(|p| p.id == conf.port_id).ok_or_else(|| {
                invalid(keys::PORT_ID, format!("port {} not found in the project", conf.port_id))
            })?;
            if !port.device_id.is_empty() || !port.device_owner.is_empty() {
                return Err(invalid(
                    keys::PORT_ID,
                    format!(
                        "port {} is in use (device {} {}): give a free port",
                        port.id, port.device_owner, port.device_id
                    ),
                ));
            }
            body["vip_port_id"] = json!(conf.port_id);
        } else {
            if !conf.subnet_id.is_empty() {
                body["vip_subnet_id"] = json!(conf.subnet_id);
            }
            if !conf.network_id.is_empty() {
                body["vip_network_id"] = json!(conf.network_id);
            }
        }
        // spec.loadBalancerIP is the VIP for internal (and IPv6) Services, else a floating IP.
        if !conf.load_balancer_ip.is_empty()
            && (conf.internal || conf.ip_family == Some(annotations::IpFamily::V6))
        {
            body["vip_address"] = json!(conf.load_balancer_ip);
        }
        tracing::info!(service = %conf.service, load_balancer = name, "OpenStack: creating Octavia load balancer");
        self.api().create_load_balancer(body).await.map_err(|e| ctx(name, "creating", e))
    }

    /// A load balancer this cluster created for the Service that went `ERROR` before it was
    /// populated (no listener, no pool: its create failed): deleted, as upstream deletes a
    /// new load balancer that lands in `ERROR`, so that the next sync creates it afresh.
    /// Any other `ERROR` load balancer is an error naming it, nothing touched.
    async fn replace_errored(
        &self,
        lb: &octavia::LoadBalancer,
        created: bool,
    ) -> Result<octavia::LoadBalancer, ProviderError> {
        let (id, name) = (&lb.id, &lb.name);
        if !created && (!lb.listeners.is_empty() || !lb.pools.is_empty()) {
            return Err(ProviderError::other(format!(
                "load balancer {name} ({id}) is in ERROR state: see `openstack loadbalancer show {id}` (delete it to have it re-created)"
            )));
        }
        tracing::warn!(load_balancer = %name, id = %id, "OpenStack: new load balancer went into ERROR state; deleting it");
        match self.delete_lb(id, name, true, self.timings.max_wait).await {
            // Sent: gone, or Octavia deletes it now (the next sync finds it gone or going).
            Ok(()) | Err(ProviderError::RetryAfter { .. }) => Err(ProviderError::other(format!(
                "load balancer {name} ({id}) has gone into ERROR state, please check Octavia; it was deleted and its creation will be retried"
            ))),
            Err(d) => Err(ProviderError::other(format!(
                "load balancer {name} ({id}) is in ERROR state and deleting it failed: {d}"
            ))),
        }
    }

    // ---- listeners, pools, members, monitors ------------------------------------------------

    fn listener_body(
        &self,
        conf: &ServiceConfig,
        port: &PortSpec,
        lb_id: &str,
        name: &str,
    ) -> Value {
        let mut b = json!({
            "name": listener_name(port.index, name),
            "protocol": conf.listener_protocol(port),
            "protocol_port": port.port,
            "loadbalancer_id": lb_id,
            "connection_limit": conf.connection_limit,
        });
        if conf.tags {
            b["tags"] = json!([name]);
        }
        if let Some(t) = conf.timeouts {
            b["timeout_client_data"] = json!(t.client_data);
            b["timeout_member_connect"] = json!(t.member_connect);
            b["timeout_member_data"] = json!(t.member_data);
            b["timeout_tcp_inspect"] = json!(t.tcp_inspect);
        }
        if conf.keep_client_ip {
            b["insert_headers"] = json!({"X-Forwarded-For": "true"});
        }
        if !conf.tls_container_ref.is_empty() {
            b["default_tls_container_ref"] = json!(conf.tls_container_ref);
        }
        if let Some(c) = conf.allowed_cidrs.as_ref().filter(|c| !c.is_empty()) {
            b["allowed_cidrs"] = json!(c);
        }
        b
    }

    /// What a listener call does, for errors: a TLS listener names the reference and the
    /// annotation (Octavia refuses a reference it cannot read with a 400).
    fn listener_change(verb: &str, conf: &ServiceConfig) -> String {
        if conf.tls_container_ref.is_empty() {
            format!("{verb} a listener")
        } else {
            format!(
                "{verb} a TERMINATED_HTTPS listener with {} {:?}",
                keys::DEFAULT_TLS_CONTAINER_REF,
                conf.tls_container_ref
            )
        }
    }

    /// The listener of `port`: created, or brought to the annotations in place.
    async fn ensure_listener(
        &self,
        lb: &octavia::LoadBalancer,
        name: &str,
        listeners: &[Listener],
        port: &PortSpec,
        conf: &ServiceConfig,
    ) -> Result<Listener, ProviderError> {
        let protocol = conf.listener_protocol(port);
        let existing = listeners
            .iter()
            .find(|l| l.protocol == protocol && l.protocol_port == i64::from(port.port));
        let Some(l) = existing else {
            tracing::info!(load_balancer = name, port = port.port, protocol = %protocol, "OpenStack: creating listener");
            let body = self.listener_body(conf, port, &lb.id, name);
            let api = self.api();
            let what = Self::listener_change("creating", conf);
            return self.mutate(&lb.id, name, &what, || api.create_listener(body.clone())).await;
        };
        let mut update = serde_json::Map::new();
        if conf.tags && !l.tags.iter().any(|t| t == name) {
            let mut tags = l.tags.clone();
            tags.push(name.to_string());
            update.insert("tags".into(), json!(tags));
        }
        if l.connection_limit != conf.connection_limit {
            update.insert("connection_limit".into(), json!(conf.connection_limit));
        }
        let xff = l.insert_headers.get("X-Forwarded-For").map(String::as_str) == Some("true");
        if xff != conf.keep_client_ip {
            let mut headers = l.insert_headers.clone();
            if conf.keep_client_ip {
                headers.insert("X-Forwarded-For".into(), "true".into());
            } else {
                headers.remove("X-Forwarded-For");
            }
            update.insert("insert_headers".into(), json!(headers));
        }
        if l.default_tls_container_ref != conf.tls_container_ref {
            update.insert("default_tls_container_ref".into(), json!(conf.tls_container_ref));
        }
        if let Some(t) = conf.timeouts {
            for (field, have, want) in [
                ("timeout_client_data", l.timeout_client_data, t.client_data),
                ("timeout_member_connect", l.timeout_member_connect, t.member_connect),
                ("timeout_member_data", l.timeout_member_data, t.member_data),
                ("timeout_tcp_inspect", l.timeout_tcp_inspect, t.tcp_inspect),
            ] {
                if have != want {
                    update.insert(field.into(), json!(want));
                }
            }
        }
        if let Some(want) = &conf.allowed_cidrs {
            let a: BTreeSet<&String> = want.iter().collect();
            let b: BTreeSet<&String> = l.allowed_cidrs.iter().collect();
            if a != b {
                update.insert("allowed_cidrs".into(), json!(want));
            }
        }
        if !update.is_empty() {
            let fields: Vec<&String> = update.keys().collect();
            tracing::info!(load_balancer = name, listener = %l.id, fields = ?fields, "OpenStack: updating listener");
            let body = Value::Object(update.clone());
            let api = self.api();
            let what = Self::listener_change("updating", conf);
            self.mutate(&lb.id, &lb.name, &what, || api.update_listener(&l.id, body.clone()))
                .await?;
        }
        Ok(l.clone())
    }

    /// The members `port` should have on `nodes`.
    fn wanted_members(conf: &ServiceConfig, port: &PortSpec, nodes: &[&Node]) -> Vec<MemberKey> {
        if port.node_port == 0 {
            return vec![];
        }
        let monitor_port =
            if conf.http_monitor(port) { i64::from(conf.health_check_node_port) } else { 0 };
        let mut out = BTreeSet::new();
        for n in nodes {
            let node = n.metadata.name.clone().unwrap_or_default();
            match node_address(n, conf.ip_family) {
                Some(address) => {
                    out.insert(MemberKey {
                        name: node,
                        address,
                        port: i64::from(port.node_port),
                        monitor_port,
                    });
                }
                None => {
                    tracing::warn!(node = %node, service = %conf.service, "OpenStack: node has no address for a load balancer member; skipped")
                }
            }
        }
        out.into_iter().collect()
    }

    /// Replaces the pool's members (one batch call) when they differ from the nodes.
    #[allow(clippy::too_many_arguments)]
    async fn sync_members(
        &self,
        lb: &octavia::LoadBalancer,
        name: &str,
        pool: &str,
        new_pool: bool,
        port: &PortSpec,
        conf: &ServiceConfig,
        nodes: &[&Node],
    ) -> Result<(), ProviderError> {
        let wanted = Self::wanted_members(conf, port, nodes);
        if self.config.load_balancer.provider_requires_serial_api_calls {
            return self.sync_members_serially(lb, name, pool, new_pool, conf, &wanted).await;
        }
        let have: BTreeSet<MemberKey> = if new_pool {
            BTreeSet::new()
        } else {
            self.api()
                .list_members(pool)
                .await?
                .into_iter()
                .map(|m| MemberKey {
                    name: m.name,
                    address: m.address,
                    port: m.protocol_port,
                    monitor_port: m.monitor_port,
                })
                .collect()
        };
        if have == wanted.iter().cloned().collect::<BTreeSet<_>>() {
            return Ok(());
        }
        let members: Vec<Value> = wanted
            .iter()
            .map(|m| {
                let mut v = json!({"address": m.address, "protocol_port": m.port, "name": m.name});
                if !conf.member_subnet_id.is_empty() {
                    v["subnet_id"] = json!(conf.member_subnet_id);
                }
                if m.monitor_port > 0 {
                    v["monitor_port"] = json!(m.monitor_port);
                }
                v
            })
            .collect();
        tracing::info!(
            load_balancer = name,
            pool,
            members = members.len(),
            "OpenStack: updating pool members"
        );
        let api = self.api();
        self.mutate(&lb.id, &lb.name, "updating pool members", || {
            api.batch_update_members(pool, members.clone())
        })
        .await
    }

    /// `[LoadBalancer] provider-requires-serial-api-calls` (providers such as OVN that have
    /// no batch member update): each missing member is added and each extra one removed by
    /// its own call, waiting for `ACTIVE` after each, as upstream's
    /// `SeriallyReconcilePoolMembers`. Members are matched by address and port (as
    /// upstream); new ones are named `member_<node>_<address>_<port>` (upstream's name) and
    /// carry the member subnet and monitor port as the batch update does.
    async fn sync_members_serially(
        &self,
        lb: &octavia::LoadBalancer,
        name: &str,
        pool: &str,
        new_pool: bool,
        conf: &ServiceConfig,
        wanted: &[MemberKey],
    ) -> Result<(), ProviderError> {
        let api = self.api();
        let mut have = if new_pool { vec![] } else { api.list_members(pool).await? };
        for m in wanted {
            if let Some(i) =
                have.iter().position(|h| h.address == m.address && h.protocol_port == m.port)
            {
                have.swap_remove(i);
                continue;
            }
            let mut body = json!({
                "name": cut255(format!("member_{}_{}_{}", m.name, m.address, m.port)),
                "address": m.address,
                "protocol_port": m.port,
            });
            if !conf.member_subnet_id.is_empty() {
                body["subnet_id"] = json!(conf.member_subnet_id);
            }
            if m.monitor_port > 0 {
                body["monitor_port"] = json!(m.monitor_port);
            }
            tracing::info!(load_balancer = name, pool, node = %m.name, address = %m.address, "OpenStack: adding pool member (serial API calls)");
            self.mutate(&lb.id, &lb.name, "adding a pool member", || {
                api.create_member(pool, body.clone())
            })
            .await?;
        }
        for extra in &have {
            tracing::info!(load_balancer = name, pool, member = %extra.id, address = %extra.address, "OpenStack: removing pool member (serial API calls)");
            self.mutate(&lb.id, &lb.name, "removing a pool member", || {
                api.delete_member(pool, &extra.id)
            })
            .await?;
        }
        Ok(())
    }

    /// The pool of `listener`: the right protocol (else re-created), algorithm and members.
    #[allow(clippy::too_many_arguments)]
    async fn ensure_pool(
        &self,
        lb: &octavia::LoadBalancer,
        name: &str,
        listener: &Listener,
        pools: &mut Vec<Pool>,
        port: &PortSpec,
        conf: &ServiceConfig,
        nodes: &[&Node],
    ) -> Result<Pool, ProviderError> {
        let api = self.api();
        let protocol = conf.pool_protocol(&listener.protocol);
        let mut existing = pools
            .iter()
            .find(|p| {
                p.listeners.iter().any(|l| l.id == listener.id)
                    || (!listener.default_pool_id.is_empty() && p.id == listener.default_pool_id)
            })
            .cloned();
        if let Some(p) = existing.as_ref().filter(|p| p.protocol != protocol) {
            tracing::info!(load_balancer = name, pool = %p.id, from = %p.protocol, to = %protocol, "OpenStack: re-creating pool with a new protocol");
            self.mutate(&lb.id, &lb.name, "deleting a pool", || api.delete_pool(&p.id)).await?;
            pools.retain(|x| x.id != p.id);
            existing = None;
        }
        if let Some(p) = existing.as_mut().filter(|p| p.lb_algorithm != conf.lb_method) {
            tracing::info!(load_balancer = name, pool = %p.id, lb_method = %conf.lb_method, "OpenStack: updating pool algorithm");
            let body = json!({"lb_algorithm": conf.lb_method});
            self.mutate(&lb.id, &lb.name, "updating a pool", || {
                api.update_pool(&p.id, body.clone())
            })
            .await?;
            p.lb_algorithm = conf.lb_method.clone();
        }
        let (pool, new) = match existing {
            Some(p) => (p, false),
            None => {
                let mut body = json!({
                    "name": pool_name(port.index, name),
                    "protocol": protocol,
                    "lb_algorithm": conf.lb_method,
                    "listener_id": listener.id,
                });
                if conf.session_affinity {
                    body["session_persistence"] = json!({"type": "SOURCE_IP"});
                }
                tracing::info!(load_balancer = name, listener = %listener.id, protocol = %protocol, "OpenStack: creating pool");
                let p = self
                    .mutate(&lb.id, &lb.name, "creating a pool", || api.create_pool(body.clone()))
                    .await?;
                pools.push(p.clone());
                (p, true)
            }
        };
        self.sync_members(lb, name, &pool.id, new, port, conf, nodes).await?;
        Ok(pool)
    }

    fn monitor_body(conf: &ServiceConfig, port: &PortSpec, name: &str, pool: &str) -> Value {
        let m = conf.monitor;
        let mut b = json!({
            "pool_id": pool,
            "name": monitor_name(port.index, name),
            "type": conf.monitor_type(port),
            "delay": m.delay,
            "timeout": m.timeout,
            "max_retries": m.max_retries,
            "max_retries_down": m.max_retries_down,
        });
        if conf.http_monitor(port) {
            b["url_path"] = json!("/healthz");
            b["http_method"] = json!("GET");
            b["expected_codes"] = json!("200");
        }
        b
    }

    /// The pool's health monitor: created, deleted, re-created (new type) or updated.
    async fn ensure_monitor(
        &self,
        lb: &octavia::LoadBalancer,
        name: &str,
        pool: &Pool,
        port: &PortSpec,
        conf: &ServiceConfig,
    ) -> Result<(), ProviderError> {
        let api = self.api();
        let create = || async {
            let body = Self::monitor_body(conf, port, name, &pool.id);
            tracing::info!(load_balancer = name, pool = %pool.id, kind = %conf.monitor_type(port), "OpenStack: creating health monitor");
            self.mutate(&lb.id, &lb.name, "creating a health monitor", || {
                api.create_health_monitor(body.clone())
            })
            .await
        };
        if pool.healthmonitor_id.is_empty() {
            return if conf.enable_monitor { create().await } else { Ok(()) };
        }
        let id = pool.healthmonitor_id.as_str();
        if !conf.enable_monitor {
            tracing::info!(
                load_balancer = name,
                monitor = id,
                "OpenStack: deleting health monitor"
            );
            return self
                .mutate(&lb.id, &lb.name, "deleting a health monitor", || {
                    api.delete_health_monitor(id)
                })
                .await;
        }
        let Some(hm) = api.get_health_monitor(id).await? else { return create().await };
        if hm.kind != conf.monitor_type(port) {
            tracing::info!(
                load_balancer = name,
                monitor = id,
                "OpenStack: re-creating health monitor with a new type"
            );
            self.mutate(&lb.id, &lb.name, "deleting a health monitor", || {
                api.delete_health_monitor(id)
            })
            .await?;
            return create().await;
        }
        let m = conf.monitor;
        let want_name = monitor_name(port.index, name);
        if hm.name != want_name
            || hm.delay != m.delay
            || hm.timeout != m.timeout
            || hm.max_retries != m.max_retries
            || hm.max_retries_down != m.max_retries_down
        {
            let body = json!({"name": want_name, "delay": m.delay, "timeout": m.timeout,
                "max_retries": m.max_retries, "max_retries_down": m.max_retries_down});
            self.mutate(&lb.id, &lb.name, "updating a health monitor", || {
                api.update_health_monitor(id, body.clone())
            })
            .await?;
        }
        Ok(())
    }

    /// Deletes a listener with its pool (members and monitor go with the pool).
    async fn delete_listener_tree(
        &self,
        lb: &octavia::LoadBalancer,
        name: &str,
        listener: &Listener,
        pools: &mut Vec<Pool>,
    ) -> Result<(), ProviderError> {
        let api = self.api();
        let of_listener: Vec<Pool> = pools
            .iter()
            .filter(|p| {
                p.listeners.iter().any(|l| l.id == listener.id) || p.id == listener.default_pool_id
            })
            .cloned()
            .collect();
        for p in &of_listener {
            tracing::info!(load_balancer = name, pool = %p.id, "OpenStack: deleting pool");
            self.mutate(&lb.id, &lb.name, "deleting a pool", || api.delete_pool(&p.id)).await?;
            pools.retain(|x| x.id != p.id);
        }
        tracing::info!(load_balancer = name, listener = %listener.id, port = listener.protocol_port, "OpenStack: deleting listener");
        self.mutate(&lb.id, &lb.name, "deleting a listener", || api.delete_listener(&listener.id))
            .await
    }

    // ---- floating IPs -------------------------------------------------------------------------

    /// The floating network: the configured one, else the only external network. `None`:
    /// Neutron shows no external network (with subnets) — upstream's
    /// `LoadBalancerExternalNetworkSearchFailed` and `LoadBalancerForcedInternal` Warnings
    /// are raised on the Service and it gets its VIP, as upstream. A failed listing is the
    /// first Warning and an error (upstream forces the Service internal then too).
    async fn floating_network(
        &self,
        service: &Service,
        conf: &ServiceConfig,
    ) -> Result<Option<String>, ProviderError> {
        if !conf.floating_network_id.is_empty() {
            return Ok(Some(conf.floating_network_id.clone()));
        }
        let listed = match self.api().list_external_networks().await {
            Ok(l) => l,
            Err(e) => {
                let message =
                    format!("Failed to find floating-network-id for Service {}: {e}", conf.service);
                self.warn(service, EVENT_EXTERNAL_NETWORK_SEARCH_FAILED, message).await;
                return Err(e.into());
            }
        };
        let nets: Vec<_> = listed.into_iter().filter(|n| !n.subnets.is_empty()).collect();
        match nets.as_slice() {
            [one] => Ok(Some(one.id.clone())),
            [] => {
                let message = format!(
                    "Failed to find floating-network-id for Service {}: Neutron shows no external network with a subnet (set [LoadBalancer] floating-network-id or the annotation {})",
                    conf.service,
                    keys::FLOATING_NETWORK_ID
                );
                self.warn(service, EVENT_EXTERNAL_NETWORK_SEARCH_FAILED, message).await;
                let message = format!(
                    "Floating network configuration not provided for Service {}, forcing to ensure an internal load balancer service",
                    conf.service
                );
                self.warn(service, EVENT_FORCED_INTERNAL, message).await;
                Ok(None)
            }
            many => Err(invalid(
                "[LoadBalancer] floating-network-id",
                format!(
                    "not set and Neutron shows {} external networks ({}): set it or the annotation {}",
                    many.len(),
                    many.iter()
                        .map(|n| format!("{} {}", n.id, n.name))
                        .collect::<Vec<_>>()
                        .join(", "),
                    keys::FLOATING_NETWORK_ID
                ),
            )),
        }
    }

    /// Upstream's `ensureFloatingIP`: the address to report.
    async fn ensure_floating_ip(
        &self,
        cluster: &str,
        service: &Service,
        conf: &ServiceConfig,
        lb: &octavia::LoadBalancer,
        owner: bool,
    ) -> Result<String, ProviderError> {
        let api = self.api();
        let vip_port = lb.vip_port_id.as_str();
        if vip_port.is_empty() {
            return Ok(lb.vip_address.clone());
        }
        let attached =
            api.list_floating_ips(&[("port_id", vip_port.to_string())]).await?.into_iter().next();
        if conf.internal {
            if let (Some(fip), true) = (&attached, owner) {
                // The Service became internal: release (or detach) its floating IP.
                if !conf.keep_floating_ip
                    && conf.load_balancer_ip != fip.floating_ip_address
                    && fip_created_for(fip, &conf.service, cluster)
                {
                    tracing::info!(service = %conf.service, floating_ip = %fip.floating_ip_address, "OpenStack: deleting the floating IP of an internal Service");
                    api.delete_floating_ip(&fip.id).await?;
                } else {
                    tracing::info!(service = %conf.service, floating_ip = %fip.floating_ip_address, "OpenStack: detaching the floating IP of an internal Service");
                    api.associate_floating_ip(&fip.id, None).await?;
                }
            }
            return Ok(lb.vip_address.clone());
        }
        if let Some(fip) = attached {
            return Ok(fip.floating_ip_address);
        }
        if !owner {
            return Err(ProviderError::other(format!(
                "cannot attach a floating IP to load balancer {} shared by Service {}: only the Service that owns it can",
                lb.id, conf.service
            )));
        }
        if !conf.load_balancer_ip.is_empty() {
            let ip = &conf.load_balancer_ip;
            let found = api.list_floating_ips(&[("floating_ip_address", ip.clone())]).await?;
            let Some(fip) = found.into_iter().next() else {
                return Err(invalid(
                    "spec.loadBalancerIP",
                    format!(
                        "no floating IP {ip} in the project: allocate it first (or remove loadBalancerIP)"
                    ),
                ));
            };
            if !fip.port_id.is_empty() && fip.port_id != vip_port {
                return Err(invalid(
                    "spec.loadBalancerIP",
                    format!(
                        "floating IP {ip} is not available: it is associated with port {}",
                        fip.port_id
                    ),
                ));
            }
            // A floating IP created for (and kept by) a Service of another namespace or of
            // another cluster is that Service's address: not taken without the opt-in.
            if let Some((owner_svc, owner_cluster)) = parse_fip_description(&fip.description) {
                let namespace = conf.service.split_once('/').map(|(ns, _)| ns).unwrap_or_default();
                let same_ns = owner_svc.split_once('/').is_some_and(|(ns, _)| ns == namespace);
                let allowed = (owner_cluster == cluster && same_ns)
                    || self.config.load_balancer.allow_cross_namespace_sharing;
                if !allowed {
                    return Err(invalid(
                        "spec.loadBalancerIP",
                        format!(
                            "floating IP {ip} was created for Service {owner_svc} of cluster {owner_cluster}: Service {} of another namespace may not take it (set [LoadBalancer] allow-cross-namespace-sharing = true to allow it)",
                            conf.service
                        ),
                    ));
                }
            }
            tracing::info!(service = %conf.service, floating_ip = %ip, "OpenStack: associating the Service's floating IP");
            let fip = api.associate_floating_ip(&fip.id, Some(vip_port)).await?;
            return Ok(fip.floating_ip_address);
        }
        let Some(network) = self.floating_network(service, conf).await? else {
            return Ok(lb.vip_address.clone());
        };
        let mut body = json!({
            "floating_network_id": network,
            "port_id": vip_port,
            "description": fip_description(&conf.service, cluster),
        });
        let spec = &conf.floating_subnet;
        if spec.matcher_configured() {
            let mut q: Vec<(&str, String)> = vec![("network_id", network.clone())];
            if let Some(f) = spec.tag_filter() {
                q.push(f);
            }
            let candidates: Vec<_> = api
                .list_subnets(&q)
                .await?
                .into_iter()
                .filter(|s| spec.matches(&s.name, &s.tags))
                .collect();
            if candidates.is_empty() {
                return Err(invalid(
                    keys::FLOATING_SUBNET,
                    format!(
                        "no subnet of network {network} matches name {:?} / tags {:?}",
                        spec.subnet, spec.subnet_tags
                    ),
                ));
            }
            let mut last = None;
            for s in &candidates {
                body["subnet_id"] = json!(s.id);
                match api.create_floating_ip(body.clone()).await {
                    Ok(fip) => {
                        tracing::info!(service = %conf.service, floating_ip = %fip.floating_ip_address, subnet = %s.name, "OpenStack: created floating IP");
                        return Ok(fip.floating_ip_address);
                    }
                    Err(e) => {
                        tracing::info!(subnet = %s.name, error = %e, "OpenStack: cannot use floating subnet");
                        last = Some(e);
                    }
                }
            }
            let last = last.map(|e| e.to_string()).unwrap_or_default();
            return Err(ProviderError::other(format!(
                "no free floating subnet matching {:?} / tags {:?} in network {network} (last error: {last})",
                spec.subnet, spec.subnet_tags
            )));
        }
        if !spec.subnet_id.is_empty() {
            match api.get_subnet(&spec.subnet_id).await? {
                None => {
                    return Err(invalid(
                        keys::FLOATING_SUBNET_ID,
                        format!("subnet {} not found", spec.subnet_id),
                    ));
                }
                Some(s) if s.network_id != network => {
                    return Err(invalid(
                        keys::FLOATING_SUBNET_ID,
                        format!(
                            "floating IP subnet {} doesn't belong to the network {network}",
                            spec.subnet_id
                        ),
                    ));
                }
                Some(_) => body["subnet_id"] = json!(spec.subnet_id),
            }
        }
        let fip = api.create_floating_ip(body).await?;
        tracing::info!(service = %conf.service, floating_ip = %fip.floating_ip_address, load_balancer = %lb.name, "OpenStack: created floating IP");
        Ok(fip.floating_ip_address)
    }

    // ---- security groups ---------------------------------------------------------------------

    /// The ports of the member nodes, by node: `(address, ports)`.
    async fn member_ports(
        &self,
        conf: &ServiceConfig,
        nodes: &[&Node],
    ) -> Result<Vec<(String, Vec<octavia::Port>)>, ProviderError> {
        let mut servers: Vec<(String, String)> = Vec::new();
        for n in nodes {
            let node = n.metadata.name.as_deref().unwrap_or_default();
            let Some(addr) = node_address(n, conf.ip_family) else { continue };
            let pid = n.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default();
            match parse_provider_id(pid) {
                Ok((server, _)) => servers.push((server, addr)),
                Err(e) => {
                    return Err(ProviderError::other(format!(
                        "node {node}: cannot find its ports for the security group of Service {}: {e}",
                        conf.service
                    )));
                }
            }
        }
        let api = self.api();
        let mut by_server: BTreeMap<String, Vec<octavia::Port>> = BTreeMap::new();
        if servers.len() <= PORTS_ONE_BY_ONE {
            for (server, _) in &servers {
                by_server.insert(
                    server.clone(),
                    api.list_ports(&[("device_id", server.clone())]).await?,
                );
            }
        } else {
            for p in api.list_ports(&[]).await? {
                by_server.entry(p.device_id.clone()).or_default().push(p);
            }
        }
        Ok(servers
            .into_iter()
            .map(|(server, addr)| (addr, by_server.remove(&server).unwrap_or_default()))
            .collect())
    }

    /// Upstream's `ensureAndUpdateOctaviaSecurityGroup`, plus: the group leaves ports that
    /// are no longer members.
    async fn ensure_security_group(
        &self,
        cluster: &str,
        service: &Service,
        conf: &ServiceConfig,
        nodes: &[&Node],
    ) -> Result<(), ProviderError> {
        let api = self.api();
        let sg_name = security_group_name(service);
        let description = sg_description(&conf.service, cluster);
        let sg = match api.list_security_groups(Some(&sg_name)).await?.into_iter().next() {
            // Its rules are replaced: only a group created for this Service by this cluster.
            Some(sg) if sg.description != description => {
                return Err(invalid(
                    &format!("security group {sg_name}"),
                    format!(
                        "a security group with the name of Service {}'s group exists ({}) but was not created for it by this cluster (description {:?}): refusing to change it; rename or delete it, or set [LoadBalancer] manage-security-groups = false",
                        conf.service, sg.id, sg.description
                    ),
                ));
            }
            Some(sg) => sg,
            None => {
                tracing::info!(service = %conf.service, security_group = %sg_name, "OpenStack: creating security group");
                api.create_security_group(&sg_name, &description).await?
            }
        };
        let subnet = api.get_subnet(&conf.member_subnet_id).await?.ok_or_else(|| {
            ProviderError::other(format!(
                "security group of Service {}: member subnet {:?} not found",
                conf.service, conf.member_subnet_id
            ))
        })?;
        let ethertype = if subnet.cidr.contains(':') { "IPv6" } else { "IPv4" };
        let ovn = self.config.load_balancer.lb_provider.eq_ignore_ascii_case("ovn");
        let cidrs: Vec<String> =
            if ovn { conf.source_ranges.clone() } else { vec![subnet.cidr.clone()] };
        let rule = |protocol: &str, port: i32, cidr: &str| Rule {
            direction: "ingress".into(),
            ethertype: ethertype.into(),
            protocol: protocol.into(),
            port_range_min: i64::from(port),
            port_range_max: i64::from(port),
            remote_ip_prefix: cidr.into(),
            ..Default::default()
        };
        let mut wanted: Vec<Rule> = Vec::new();
        if conf.spec_health_check_node_port != 0 {
            wanted.push(rule("tcp", conf.spec_health_check_node_port, &subnet.cidr));
        }
        for p in conf.ports.iter().filter(|p| p.node_port != 0) {
            for c in &cidrs {
                wanted.push(rule(&p.protocol.to_ascii_lowercase(), p.node_port, c));
            }
        }
        // Every rule of the group is ours, as upstream: the egress rules Neutron adds to a new
        // group (any address, IPv4 and IPv6) are deleted with any other rule not wanted.
        let existing: Vec<Rule> = api.list_rules(&sg.id).await?;
        for w in wanted.iter().filter(|w| !existing.iter().any(|e| e.same(w))) {
            api.create_rule(&sg.id, w).await?;
        }
        for e in existing.iter().filter(|e| !wanted.iter().any(|w| w.same(e))) {
            tracing::info!(security_group = %sg_name, rule = %e.id, "OpenStack: deleting security group rule");
            api.delete_rule(&e.id).await?;
        }
        // Add the group to the members' ports on the member subnet.
        let mut members: BTreeSet<String> = BTreeSet::new();
        for (addr, ports) in self.member_ports(conf, nodes).await? {
            for port in ports {
                let on_member_subnet = port.fixed_ips.iter().any(|ip| {
                    ip.ip_address == addr
                        && (conf.member_subnet_id.is_empty()
                            || ip.subnet_id == conf.member_subnet_id)
                });
                if !on_member_subnet || port.port_security_enabled == Some(false) {
                    continue;
                }
                members.insert(port.id.clone());
                if port.security_groups.contains(&sg.id) {
                    continue;
                }
                let mut groups = port.security_groups.clone();
                groups.push(sg.id.clone());
                api.set_port_security_groups(&port.id, &groups).await?;
            }
        }
        // And take it off ports that are no longer members.
        for port in api.list_ports(&[("security_groups", sg.id.clone())]).await? {
            if members.contains(&port.id) || !port.security_groups.contains(&sg.id) {
                continue;
            }
            let groups: Vec<String> =
                port.security_groups.iter().filter(|g| **g != sg.id).cloned().collect();
            api.set_port_security_groups(&port.id, &groups).await?;
        }
        Ok(())
    }

    /// Takes a security group off every port and deletes it.
    async fn delete_security_group_by_id(&self, id: &str) -> Result<(), ProviderError> {
        let api = self.api();
        for port in api.list_ports(&[("security_groups", id.to_string())]).await? {
            if !port.security_groups.iter().any(|g| g == id) {
                continue;
            }
            let groups: Vec<String> =
                port.security_groups.iter().filter(|g| *g != id).cloned().collect();
            api.set_port_security_groups(&port.id, &groups).await?;
        }
        api.delete_security_group(id).await?;
        Ok(())
    }

    /// Upstream's `ensureSecurityGroupDeleted`; only a group described as this Service's of
    /// this cluster.
    async fn delete_security_group(
        &self,
        cluster: &str,
        service: &Service,
    ) -> Result<(), ProviderError> {
        let sg_name = security_group_name(service);
        let description = sg_description(&service_key(service), cluster);
        for sg in self.api().list_security_groups(Some(&sg_name)).await? {
            if sg.description != description {
                tracing::warn!(service = %service_key(service), security_group = %sg.id, "OpenStack: a security group with this Service's group name was not created for it by this cluster: left alone");
                continue;
            }
            tracing::info!(service = %service_key(service), security_group = %sg_name, "OpenStack: deleting security group");
            self.delete_security_group_by_id(&sg.id).await?;
        }
        Ok(())
    }

    // ---- the three calls ----------------------------------------------------------------------

    /// A Warning Event on the Service (logged only while there is no Kubernetes client).
    /// Upstream's read of the TLS reference before anything is changed (`checkService`):
    /// with `container-store = barbican`, `GET /v1/containers/{id}` (or `/v1/secrets/{id}`)
    /// on the catalog's `key-manager` endpoint with the CCM's own token. Metadata only: the
    /// secrets' payloads are never read. A reference Barbican does not show (404), may not
    /// show (403, its ACL), or a catalog without `key-manager` is an error naming the
    /// annotation (or key) and the reference, before any Octavia call.
    async fn read_tls_reference(
        &self,
        conf: &ServiceConfig,
        service: &Service,
    ) -> Result<(), ProviderError> {
        let reference = conf.tls_container_ref.trim();
        if reference.is_empty() || self.config.load_balancer.container_store != "barbican" {
            return Ok(());
        }
        let what = if annotations::annotation(service, keys::DEFAULT_TLS_CONTAINER_REF).is_some() {
            keys::DEFAULT_TLS_CONTAINER_REF
        } else {
            "[LoadBalancer] default-tls-container-ref"
        };
        // The form was checked by `ServiceConfig::parse` (`…/containers/<id>`, `…/secrets/<id>`).
        let mut segs = reference.rsplit('/');
        let id = segs.next().unwrap_or_default();
        let (op, kind, noun) = match segs.next() {
            Some("secrets") => ("barbican:GetSecret", "secrets", "secret"),
            _ => ("barbican:GetContainer", "containers", "container"),
        };
        match self.client.get(op, ClientService::KeyManager, &[kind, id], &[]).await {
            Ok(_) => {
                tracing::debug!(service = %conf.service, reference, "OpenStack: TLS {noun} found");
                Ok(())
            }
            Err(e) => {
                let message = format!(
                    "failed to get the TLS {noun} {reference} for Service {} from Barbican: {e}",
                    conf.service
                );
                match e.status() {
                    // Barbican refused or does not know the reference: the user's to fix.
                    Some(400..=404) => Err(invalid(what, message)),
                    Some(429) => Err(e.into()),
                    _ => Err(ProviderError::with_source(format!("{what}: {message}"), e)),
                }
            }
        }
    }

    async fn warn(&self, service: &Service, reason: &str, message: String) {
        match self.kube.get() {
            Some(k) => k.warn(service, reason, message).await,
            None => tracing::warn!(service = %service_key(service), reason, "OpenStack: {message}"),
        }
    }

    /// Upstream's `ensureOctaviaLoadBalancer` with its deferred Service patch: the
    /// `load-balancer-id` recorded once the load balancer is found or created is written
    /// back even when a later step fails; `load-balancer-address` after success. A failed
    /// reconcile also drops the cached Octavia version (asked again next time); a load
    /// balancer still pending (`RetryAfter`) has not failed and keeps it.
    async fn ensure(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        let mut written = BTreeMap::new();
        let result = self.ensure_inner(cluster, service, nodes, &mut written).await;
        if result.as_ref().is_err_and(failed) {
            self.version.forget();
        }
        let patched = match self.kube.get() {
            Some(k) if !written.is_empty() => k.set_annotations(service, &written).await,
            _ => Ok(()),
        };
        match (result, patched) {
            (Ok(status), Ok(())) => Ok(status),
            (Ok(_), Err(p)) => Err(p),
            (Err(e), Ok(())) => Err(e),
            (Err(e), Err(p)) => {
                tracing::warn!(service = %service_key(service), error = %p, "OpenStack: writing the annotations back failed too");
                Err(e)
            }
        }
    }

    async fn ensure_inner(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Node],
        written: &mut BTreeMap<&'static str, String>,
    ) -> Result<LoadBalancerStatus, ProviderError> {
        let mut conf = ServiceConfig::parse(service, &self.config)?;
        let nodes: Vec<&Node> =
            nodes.iter().filter(|n| node_matches(n, &conf.node_selector)).collect();
        if nodes.is_empty() {
            return Err(ProviderError::other(format!(
                "there are no available nodes for LoadBalancer service {}",
                conf.service
            )));
        }
        let features = self.features().await?;
        for (reason, message) in
            features::apply(&mut conf, &features, &self.config.load_balancer, service)
        {
            self.warn(service, reason, message).await;
        }
        self.read_tls_reference(&conf, service).await?;
        let name = load_balancer_name(cluster, service);
        let api = self.api();

        let (found, owner) = if !conf.lb_id.is_empty() {
            let lb = api.get_load_balancer(&conf.lb_id).await?.ok_or_else(|| {
                invalid(keys::LOAD_BALANCER_ID, format!("load balancer {} not found", conf.lb_id))
            })?;
            // --cluster-name changed: our own load balancer under the old name is renamed
            // (upstream's loadbalancer_rename.go), within the ownership proof.
            let lb = match self.rename_if_old_cluster(cluster, service, &conf, &lb).await? {
                Some(renamed) => renamed,
                None => lb,
            };
            let owner = self.role(cluster, service, &lb)? == Role::Owner;
            if !owner && !conf.tags {
                return Err(invalid(
                    keys::LOAD_BALANCER_ID,
                    format!(
                        "load balancer {} is not this Service's own: sharing a load balancer needs tags (Octavia API 2.5; this Octavia has v{}.{})",
                        lb.id, features.version.0, features.version.1
                    ),
                ));
            }
            if !owner {
                let shared = lb.tags.iter().filter(|t| t.starts_with(SERVICE_PREFIX)).count();
                let max = self.config.load_balancer.max_shared_lb as usize;
                if !lb.tags.contains(&name) && shared + 1 > max {
                    return Err(invalid(
                        keys::LOAD_BALANCER_ID,
                        format!(
                            "load balancer {} already shared with {shared} Services ([LoadBalancer] max-shared-lb = {max})",
                            lb.id
                        ),
                    ));
                }
                if conf.internal {
                    return Err(invalid(
                        keys::LOAD_BALANCER_ID,
                        "an internal Service cannot share a load balancer",
                    ));
                }
            }
            (Some(lb), owner)
        } else {
            let found = self.find("", &name, &default_load_balancer_name(service)).await?;
            if let Some(lb) = found.as_ref().filter(|lb| !created_for(lb, cluster, service)) {
                return Err(Self::foreign_name(service, lb));
            }
            (found, true)
        };
        if let Some(lb) = &found {
            written.insert(keys::LOAD_BALANCER_ID, lb.id.clone());
        }
        // A pending load balancer is a retry (or a wait) before anything else is read.
        let found = match found {
            Some(lb) if lb.is_deleting() => {
                return Err(self.retry_after(format!(
                    "load balancer {} ({}) is being deleted",
                    lb.name, lb.id
                )));
            }
            Some(lb) => Some((self.settled(lb).await?, false)),
            None => None,
        };
        self.resolve_subnets(&mut conf, &nodes).await?;
        let (lb, created) = match found {
            Some(found) => found,
            None => {
                let lb = self.create(cluster, &name, &conf).await?;
                written.insert(keys::LOAD_BALANCER_ID, lb.id.clone());
                (self.settled(lb).await?, true)
            }
        };
        let mut lb = match lb.provisioning_status.as_str() {
            "ERROR" if owner => self.replace_errored(&lb, created).await?,
            "ERROR" => {
                return Err(ProviderError::other(format!(
                    "load balancer {} ({}) is in ERROR state: see `openstack loadbalancer show {}`",
                    lb.name, lb.id, lb.id
                )));
            }
            _ => lb,
        };
        let lb_name = lb.name.clone();
        if conf.member_subnet_id.is_empty() {
            conf.member_subnet_id = lb.vip_subnet_id.clone();
        }

        // Listeners: ours are tagged with our name (or untagged on a load balancer we own).
        let listeners = api.list_listeners(&lb.id).await?;
        let ours = |l: &Listener| l.tags.contains(&name) || (l.tags.is_empty() && owner);
        let wanted: BTreeSet<(String, i64)> =
            conf.ports.iter().map(|p| (conf.listener_protocol(p), i64::from(p.port))).collect();
        for p in &conf.ports {
            let proto = conf.listener_protocol(p);
            if let Some(l) = listeners
                .iter()
                .find(|l| l.protocol == proto && l.protocol_port == i64::from(p.port))
                && !ours(l)
            {
                return Err(ProviderError::other(format!(
                    "load balancer {lb_name}: the listener port {} already exists (listener {} belongs to another Service)",
                    p.port, l.id
                )));
            }
        }
        let mut pools = api.list_pools(&lb.id).await?;
        // First delete what is no longer wanted, so a port is free before it is claimed again.
        for l in listeners
            .iter()
            .filter(|l| ours(l) && !wanted.contains(&(l.protocol.clone(), l.protocol_port)))
        {
            self.delete_listener_tree(&lb, &name, l, &mut pools).await?;
        }
        // Names and tags are this Service's (`name`), also on a shared load balancer.
        for p in &conf.ports {
            let listener = self.ensure_listener(&lb, &name, &listeners, p, &conf).await?;
            let pool =
                self.ensure_pool(&lb, &name, &listener, &mut pools, p, &conf, &nodes).await?;
            self.ensure_monitor(&lb, &name, &pool, p, &conf).await?;
        }

        let addr = if is_ipv6(&lb.vip_address) {
            let message = format!(
                "Floating IP not supported for IPv6 Service {}. Using IPv6 address instead {}.",
                conf.service, lb.vip_address
            );
            self.warn(service, EVENT_FLOATING_IP_SKIPPED, message).await;
            lb.vip_address.clone()
        } else {
            self.ensure_floating_ip(cluster, service, &conf, &lb, owner).await?
        };

        let mut tags: Vec<String> = lb
            .tags
            .iter()
            .filter(|t| !owner || (*t != OWNER_GONE_TAG && *t != OWNER_GONE_KEEP_FIP_TAG))
            .cloned()
            .collect();
        if !tags.contains(&name) {
            tags.push(name.clone());
        }
        if conf.tags && tags != lb.tags {
            let body = json!({ "tags": tags });
            self.mutate(&lb.id, &lb_name, "updating tags", || {
                api.update_load_balancer(&lb.id, body.clone())
            })
            .await?;
            lb.tags = tags;
        }

        if self.config.load_balancer.manage_security_groups {
            self.ensure_security_group(cluster, service, &conf, &nodes).await?;
        } else {
            self.delete_security_group(cluster, service).await?;
        }
        tracing::info!(service = %conf.service, load_balancer = %lb_name, address = %addr, "OpenStack: load balancer ensured");
        written.insert(keys::LOAD_BALANCER_ADDRESS, addr.clone());
        Ok(status(&conf, &addr, &self.config))
    }

    async fn update(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<(), ProviderError> {
        let result = self.update_inner(cluster, service, nodes).await;
        if result.as_ref().is_err_and(failed) {
            self.version.forget();
        }
        result
    }

    async fn update_inner(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<(), ProviderError> {
        let mut conf = ServiceConfig::parse(service, &self.config)?;
        let nodes: Vec<&Node> =
            nodes.iter().filter(|n| node_matches(n, &conf.node_selector)).collect();
        // The members' monitor port depends on the version (HTTP monitors on UDP pools);
        // the Warnings are raised by ensure.
        let features = self.features().await?;
        let _ = features::apply(&mut conf, &features, &self.config.load_balancer, service);
        let name = load_balancer_name(cluster, service);
        self.resolve_subnets(&mut conf, &nodes).await?;
        let Some(lb) = self.find(&conf.lb_id, &name, &default_load_balancer_name(service)).await?
        else {
            tracing::warn!(service = %conf.service, load_balancer = %name, "OpenStack: load balancer not found for update");
            return Ok(());
        };
        let owner = if conf.lb_id.is_empty() {
            if !created_for(&lb, cluster, service) {
                return Err(Self::foreign_name(service, &lb));
            }
            true
        } else {
            self.role(cluster, service, &lb)? == Role::Owner
        };
        let lb = match lb.provisioning_status.as_str() {
            "ACTIVE" => lb,
            "ERROR" => {
                return Err(ProviderError::other(format!(
                    "load balancer {} ({}) is in ERROR state: see `openstack loadbalancer show {}`",
                    lb.name, lb.id, lb.id
                )));
            }
            _ if lb.is_deleting() => {
                tracing::info!(service = %conf.service, load_balancer = %lb.name, "OpenStack: load balancer being deleted: no update");
                return Ok(());
            }
            // Pending: a retry (the service controller re-queues the Service), or a wait.
            _ => self.until_active(&lb).await?,
        };
        if conf.member_subnet_id.is_empty() {
            conf.member_subnet_id = lb.vip_subnet_id.clone();
        }
        let api = self.api();
        let listeners = api.list_listeners(&lb.id).await?;
        let pools = api.list_pools(&lb.id).await?;
        for p in &conf.ports {
            let proto = conf.listener_protocol(p);
            let listener = listeners
                .iter()
                .find(|l| l.protocol == proto && l.protocol_port == i64::from(p.port))
                // Only this Service's listener (tagged with its name; untagged: the owner's).
                .filter(|l| l.tags.contains(&name) || (l.tags.is_empty() && owner))
                .ok_or_else(|| {
                    ProviderError::other(format!(
                        "load balancer {} ({}) has no listener for port {} ({proto})",
                        lb.name, lb.id, p.port
                    ))
                })?;
            let pool = pools
                .iter()
                .find(|x| {
                    x.listeners.iter().any(|l| l.id == listener.id)
                        || x.id == listener.default_pool_id
                })
                .ok_or_else(|| {
                    ProviderError::other(format!(
                        "load balancer {} ({}) has no pool for the listener on port {}",
                        lb.name, lb.id, p.port
                    ))
                })?;
            self.sync_members(&lb, &lb.name, &pool.id, false, p, &conf, &nodes).await?;
        }
        if self.config.load_balancer.manage_security_groups {
            self.ensure_security_group(cluster, service, &conf, &nodes).await?;
        }
        Ok(())
    }

    async fn delete(&self, cluster: &str, service: &Service) -> Result<(), ProviderError> {
        let key = service_key(service);
        let name = load_balancer_name(cluster, service);
        let legacy = default_load_balancer_name(service);
        let lb_id = annotations::annotation(service, keys::LOAD_BALANCER_ID)
            .map(str::trim)
            .unwrap_or_default();
        // One being deleted counts: the Service keeps its finalizer until it is gone.
        let found = self.find_among(lb_id, &name, &legacy, true).await?;
        let result = match found {
            Some(lb) if lb_id.is_empty() && !created_for(&lb, cluster, service) => {
                // Our name on a load balancer we did not create: never touched.
                tracing::warn!(service = %key, load_balancer = %lb.name, id = %lb.id, description = %lb.description, "OpenStack: a load balancer with this Service's name was not created for it by this cluster: left alone");
                Ok(())
            }
            Some(lb) => self.delete_found(cluster, &key, &name, lb, service).await,
            None => Ok(()),
        };
        match result {
            // Even when the load balancer is gone already: no orphaned security group.
            Ok(()) => self.delete_security_group(cluster, service).await,
            // Octavia is deleting the load balancer (nothing waits for it): its security
            // group goes now, as the service controller stops calling once Octavia no longer
            // shows the load balancer. A load balancer still pending before its deletion
            // keeps it until then.
            Err(e @ ProviderError::RetryAfter { .. }) => {
                let going = self
                    .find_among(lb_id, &name, &legacy, true)
                    .await?
                    .is_none_or(|lb| lb.is_deleting());
                if going {
                    self.delete_security_group(cluster, service).await?;
                }
                Err(e)
            }
            Err(e) => Err(e),
        }
    }

    /// Deletes or disassociates the floating IPs on `lb`'s VIP port: deleted only when created
    /// for `owner` (`<ns>/<name>`) of `cluster` (exact description) and not `keep`.
    async fn release_floating_ips(
        &self,
        key: &str,
        cluster: &str,
        lb: &octavia::LoadBalancer,
        owner: &str,
        keep: bool,
    ) -> Result<(), ProviderError> {
        if lb.vip_port_id.is_empty() {
            return Ok(());
        }
        let api = self.api();
        for fip in api.list_floating_ips(&[("port_id", lb.vip_port_id.clone())]).await? {
            if !keep && fip_created_for(&fip, owner, cluster) {
                tracing::info!(service = key, floating_ip = %fip.floating_ip_address, "OpenStack: deleting floating IP");
                api.delete_floating_ip(&fip.id).await?;
            } else {
                tracing::info!(service = key, floating_ip = %fip.floating_ip_address, "OpenStack: keeping floating IP, disassociating it");
                api.associate_floating_ip(&fip.id, None).await?;
            }
        }
        Ok(())
    }

    /// Deletes `lb` with its children.
    async fn delete_whole(&self, lb: &octavia::LoadBalancer) -> Result<(), ProviderError> {
        let api = self.api();
        if self.config.load_balancer.cascade_delete {
            return self.delete_lb(&lb.id, &lb.name, true, self.timings.max_wait).await;
        }
        // Children first, as upstream: monitors, then pools (members go with them) and
        // listeners.
        let listeners = api.list_listeners(&lb.id).await?;
        let mut pools = api.list_pools(&lb.id).await?;
        for p in pools.iter().filter(|p| !p.healthmonitor_id.is_empty()) {
            let hm = p.healthmonitor_id.as_str();
            self.mutate(&lb.id, &lb.name, "deleting a health monitor", || {
                api.delete_health_monitor(hm)
            })
            .await?;
        }
        for l in &listeners {
            self.delete_listener_tree(lb, &lb.name, l, &mut pools).await?;
        }
        for p in pools.clone() {
            self.mutate(&lb.id, &lb.name, "deleting a pool", || api.delete_pool(&p.id)).await?;
        }
        self.delete_lb(&lb.id, &lb.name, false, self.timings.max_wait).await
    }

    async fn delete_found(
        &self,
        cluster: &str,
        key: &str,
        name: &str,
        lb: octavia::LoadBalancer,
        service: &Service,
    ) -> Result<(), ProviderError> {
        let api = self.api();
        let lb = match lb.provisioning_status.as_str() {
            "ACTIVE" | "ERROR" => lb,
            "PENDING_DELETE" | "DELETED" => {
                return self.wait_gone(&lb.id, &lb.name, self.timings.max_wait).await;
            }
            // Pending: a retry (the next sync resumes the deletion), or a wait.
            _ => self.until_active(&lb).await?,
        };
        // A Service refused the load balancer never had parts on it, but parts tagged with
        // its name (made before sharing was restricted) are still its own to remove.
        let role = self.role(cluster, service, &lb).unwrap_or_else(|e| {
            tracing::info!(service = key, load_balancer = %lb.id, error = %e, "OpenStack: not allowed to share this load balancer; removing only this Service's own listeners");
            Role::Guest
        });
        let others = other_services(&lb, name);
        // The owner's own keep-floatingip governs its floating IP (a bad value keeps it); so
        // does its own spec.loadBalancerIP (the user's address).
        let keep = || {
            let keep = annotations::bool_annotation(service, keys::KEEP_FLOATING_IP, false)
                .unwrap_or_else(|e| {
                    tracing::warn!(service = %key, error = %e, "OpenStack: keeping the floating IP");
                    true
                });
            keep || service
                .spec
                .as_ref()
                .and_then(|s| s.load_balancer_ip.as_deref())
                .is_some_and(|ip| !ip.trim().is_empty())
        };
        match &role {
            Role::Owner if others == 0 => {
                self.release_floating_ips(key, cluster, &lb, key, keep()).await?;
                tracing::info!(service = key, load_balancer = %lb.name, id = %lb.id, "OpenStack: deleting load balancer");
                return self.delete_whole(&lb).await;
            }
            Role::Sharer(creator) if others == 0 && lb.tags.iter().any(|t| t == OWNER_GONE_TAG) => {
                // The Service it was created for is gone and this is its last (allowed)
                // user: deleted, as upstream; the floating IP as its owner asked.
                let keep = lb.tags.iter().any(|t| t == OWNER_GONE_KEEP_FIP_TAG);
                self.release_floating_ips(key, cluster, &lb, &creator.service(), keep).await?;
                tracing::info!(service = key, load_balancer = %lb.name, id = %lb.id, owner = %creator.service(), "OpenStack: last user of a load balancer whose Service is gone: deleting it");
                return self.delete_whole(&lb).await;
            }
            _ => {}
        }
        // Not ours alone: only this Service's listeners (tagged with its name; untagged ones
        // too for the owner), then its tag.
        tracing::info!(service = key, load_balancer = %lb.name, id = %lb.id, "OpenStack: load balancer shared or not this Service's: deleting this Service's listeners only");
        let owner = role == Role::Owner;
        let listeners = api.list_listeners(&lb.id).await?;
        let mut pools = api.list_pools(&lb.id).await?;
        for l in listeners
            .iter()
            .filter(|l| l.tags.iter().any(|t| t == name) || (owner && l.tags.is_empty()))
        {
            self.delete_listener_tree(&lb, &lb.name, l, &mut pools).await?;
        }
        let mut tags: Vec<String> = lb.tags.iter().filter(|t| *t != name).cloned().collect();
        if owner {
            tags.retain(|t| t != OWNER_GONE_TAG && t != OWNER_GONE_KEEP_FIP_TAG);
            tags.push(OWNER_GONE_TAG.to_string());
            if keep() {
                tags.push(OWNER_GONE_KEEP_FIP_TAG.to_string());
            }
        }
        if tags != lb.tags {
            let body = json!({ "tags": tags });
            self.mutate(&lb.id, &lb.name, "updating tags", || {
                api.update_load_balancer(&lb.id, body.clone())
            })
            .await?;
        }
        Ok(())
    }

    async fn get(
        &self,
        cluster: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        let name = load_balancer_name(cluster, service);
        let lb_id = annotations::annotation(service, keys::LOAD_BALANCER_ID)
            .map(str::trim)
            .unwrap_or_default();
        // One being deleted exists until Octavia no longer shows it: the service controller
        // then calls the delete again (which waits for it to go) before it removes the
        // Service's finalizer.
        let legacy = default_load_balancer_name(service);
        let Some(lb) = self.find_among(lb_id, &name, &legacy, true).await? else {
            return Ok(None);
        };
        // Another Service's address is reported only where sharing is allowed; a load
        // balancer with our name that we did not create is not ours: none (ensure says why).
        let usable = if lb_id.is_empty() {
            created_for(&lb, cluster, service)
        } else {
            self.role(cluster, service, &lb).is_ok()
        };
        if !usable {
            return Ok(None);
        }
        let mut addr = lb.vip_address.clone();
        if !lb.vip_port_id.is_empty()
            && let Some(fip) = self
                .api()
                .list_floating_ips(&[("port_id", lb.vip_port_id.clone())])
                .await?
                .into_iter()
                .next()
        {
            addr = fip.floating_ip_address;
        }
        Ok(Some(match ServiceConfig::parse(service, &self.config) {
            Ok(conf) => status(&conf, &addr, &self.config),
            Err(_) => LoadBalancerStatus {
                ingress: Some(vec![LoadBalancerIngress { ip: Some(addr), ..Default::default() }]),
            },
        }))
    }

    // ---- operator tools -------------------------------------------------------------------------

    fn owned_prefix(cluster: &str) -> String {
        format!("{SERVICE_PREFIX}{cluster}_")
    }

    fn inventory_entry(
        cluster: &str,
        lb: &octavia::LoadBalancer,
        fips: &[FloatingIp],
        groups: &[octavia::SecurityGroup],
    ) -> CloudLoadBalancer {
        let described = parse_lb_description(&lb.description);
        // The same proof as deletion: created by this cluster (name and description agree)
        // and not in use by another Service (a sharer's tag).
        let owned = !cluster.is_empty()
            && creator(lb).is_some_and(|c| c.cluster == cluster)
            && other_services(lb, &lb.name) == 0;
        let service = described.as_ref().map(|(s, _)| s.clone());
        let mut ingress = Vec::new();
        let mut resources = Vec::new();
        for f in fips.iter().filter(|f| !lb.vip_port_id.is_empty() && f.port_id == lb.vip_port_id) {
            ingress.push(f.floating_ip_address.clone());
            resources.push(CloudResource {
                kind: "floating IP".into(),
                id: f.id.clone(),
                name: f.floating_ip_address.clone(),
            });
        }
        if !lb.vip_address.is_empty() {
            ingress.push(lb.vip_address.clone());
        }
        if let Some((svc, c)) = &described {
            let d = sg_description(svc, c);
            for g in groups.iter().filter(|g| g.description == d) {
                resources.push(CloudResource {
                    kind: "security group".into(),
                    id: g.id.clone(),
                    name: g.name.clone(),
                });
            }
        }
        for l in &lb.listeners {
            resources.push(CloudResource {
                kind: "listener".into(),
                id: l.id.clone(),
                name: String::new(),
            });
        }
        for p in &lb.pools {
            resources.push(CloudResource {
                kind: "pool".into(),
                id: p.id.clone(),
                name: String::new(),
            });
        }
        CloudLoadBalancer {
            name: lb.name.clone(),
            kind: "Octavia load balancer".into(),
            id: lb.id.clone(),
            ingress,
            owned,
            service,
            resources,
        }
    }
}

/// Runs one load balancer reconcile and records it in upstream's reconcile families
/// (`cloudprovider_openstack_reconcile_*{operation}`), as upstream's `EnsureLoadBalancer`,
/// `UpdateLoadBalancer` and `EnsureLoadBalancerDeleted` do (`loadbalancer_ensure`, `_update`,
/// `_delete`): its latency and count, and an error when it failed.
async fn reconciled<T>(
    operation: &'static str,
    reconcile: impl Future<Output = Result<T, ProviderError>>,
) -> Result<T, ProviderError> {
    let start = std::time::Instant::now();
    let result = reconcile.await;
    ApiMetrics::of(&api_metrics::OPENSTACK).reconcile_finished(
        &api_metrics::OPENSTACK_RECONCILE,
        &[operation],
        start.elapsed(),
        result.as_ref().err().map(|_| "error"),
    );
    result
}

#[async_trait]
impl LoadBalancer for OctaviaLoadBalancer {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        self.get(cluster_name, service).await
    }

    fn load_balancer_name(&self, cluster_name: &str, service: &Service) -> String {
        load_balancer_name(cluster_name, service)
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        reconciled("loadbalancer_ensure", self.ensure(cluster_name, service, nodes)).await
    }

    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<(), ProviderError> {
        reconciled("loadbalancer_update", self.update(cluster_name, service, nodes)).await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> Result<(), ProviderError> {
        reconciled("loadbalancer_delete", self.delete(cluster_name, service)).await
    }

    /// Every Octavia load balancer named `kube_service_…`; owned when this cluster created it
    /// ([`creator`]: name `kube_service_<cluster>_<ns>_<name>` and upstream's description for
    /// that Service and this cluster) and no other Service shares it (no other
    /// `kube_service_…` tag). Resources: its floating IP, its security group (by description),
    /// listeners and pools.
    async fn list_cloud_load_balancers(
        &self,
        cluster_name: &str,
    ) -> Result<Vec<CloudLoadBalancer>, ProviderError> {
        let api = self.api();
        let lbs: Vec<_> = api
            .list_load_balancers(None)
            .await?
            .into_iter()
            .filter(|lb| lb.name.starts_with(SERVICE_PREFIX) && !lb.is_deleting())
            .collect();
        if lbs.is_empty() {
            return Ok(vec![]);
        }
        let fips = api.list_floating_ips(&[]).await?;
        let groups = api.list_security_groups(None).await?;
        Ok(lbs.iter().map(|lb| Self::inventory_entry(cluster_name, lb, &fips, &groups)).collect())
    }

    /// Deletes an owned load balancer (looked up again by ID; gone already: `Ok`): its
    /// floating IP (if created by a Service), the load balancer with its children, its
    /// security group.
    async fn delete_cloud_load_balancer(
        &self,
        cluster_name: &str,
        lb: &CloudLoadBalancer,
    ) -> Result<(), ProviderError> {
        let api = self.api();
        let Some(fresh) = api.get_load_balancer(&lb.id).await? else { return Ok(()) };
        let fips = if fresh.vip_port_id.is_empty() {
            vec![]
        } else {
            api.list_floating_ips(&[("port_id", fresh.vip_port_id.clone())]).await?
        };
        let groups = api.list_security_groups(None).await?;
        let entry = Self::inventory_entry(cluster_name, &fresh, &fips, &groups);
        if !entry.owned || fresh.name != lb.name {
            return Err(invalid(
                &format!("load balancer {} ({})", fresh.name, fresh.id),
                format!(
                    "not owned by cluster {cluster_name} (name {}… and description naming the cluster and its Service, no other Service sharing it), refusing to delete it",
                    Self::owned_prefix(cluster_name)
                ),
            ));
        }
        let name = fresh.name.clone();
        let wait = self.timings.max_wait.max(TOOL_WAIT);
        let fresh = match fresh.provisioning_status.as_str() {
            "ACTIVE" | "ERROR" => fresh,
            "PENDING_DELETE" | "DELETED" => return self.wait_gone(&fresh.id, &name, wait).await,
            _ => self.wait_active(&fresh.id, &name, wait).await?,
        };
        let creator_svc = creator(&fresh).map(|c| c.service()).unwrap_or_default();
        let keep = fresh.tags.iter().any(|t| t == OWNER_GONE_KEEP_FIP_TAG);
        for f in fips.iter().filter(|f| !keep && fip_created_for(f, &creator_svc, cluster_name)) {
            tracing::info!(load_balancer = %name, floating_ip = %f.floating_ip_address, "OpenStack: deleting orphaned floating IP");
            api.delete_floating_ip(&f.id).await?;
        }
        tracing::info!(load_balancer = %name, "OpenStack: deleting orphaned load balancer");
        self.delete_lb(&fresh.id, &name, true, wait).await?;
        for r in entry.resources.iter().filter(|r| r.kind == "security group") {
            self.delete_security_group_by_id(&r.id).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn svc(ns: &str, name: &str) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(ns.into()),
                uid: Some("6f7f1b2c-1234-5678-9abc-def012345678".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn names_follow_upstream_and_are_capped() {
        let s = svc("default", "web");
        assert_eq!(load_balancer_name("kubernetes", &s), "kube_service_kubernetes_default_web");
        assert_eq!(listener_name(0, "lb"), "listener_0_lb");
        assert_eq!(pool_name(1, "lb"), "pool_1_lb");
        assert_eq!(monitor_name(2, "lb"), "monitor_2_lb");
        assert_eq!(
            security_group_name(&s),
            "lb-sg-6f7f1b2c-1234-5678-9abc-def012345678-default-web"
        );
        let long = svc(&"n".repeat(63), &"s".repeat(253));
        let name = load_balancer_name(&"c".repeat(40), &long);
        assert_eq!(name.len(), 255);
        assert!(name.starts_with("kube_service_cccc"));
        assert_eq!(listener_name(3, &name).len(), 255);
        assert!(listener_name(3, &name).starts_with("listener_3_kube_service_"));
        assert_eq!(security_group_name(&long).len(), 255);
        // Never cut inside a character.
        let cut = cut255(format!("{}é", "x".repeat(254)));
        assert_eq!(cut.len(), 254);
    }

    #[test]
    fn descriptions_round_trip() {
        let d = lb_description("default/web", "k8s");
        assert_eq!(d, "Kubernetes external service default/web from cluster k8s");
        assert_eq!(parse_lb_description(&d), Some(("default/web".into(), "k8s".into())));
        assert!(fip_description("default/web", "k8s").starts_with(FIP_DESCRIPTION_PREFIX));
        assert_eq!(
            sg_description("default/web", "k8s"),
            "Security Group for default/web Service LoadBalancer in cluster k8s"
        );
    }

    fn lb(name: &str, description: &str) -> octavia::LoadBalancer {
        serde_json::from_value(json!({"id": "l-1", "name": name, "description": description}))
            .unwrap()
    }

    #[test]
    fn ownership_needs_the_name_and_the_description_written_at_creation() {
        let s = svc("default", "web");
        let d = lb_description("default/web", "k8s");
        assert!(created_for(&lb("kube_service_k8s_default_web", &d), "k8s", &s));
        // Legacy name, same description.
        assert!(created_for(&lb(&default_load_balancer_name(&s), &d), "k8s", &s));
        // Name alone, description alone, another cluster's, another Service's: no.
        assert!(!created_for(&lb("kube_service_k8s_default_web", ""), "k8s", &s));
        assert!(!created_for(&lb("kube_service_k8s_default_web", "touched"), "k8s", &s));
        assert!(!created_for(&lb("my-lb", &d), "k8s", &s));
        assert!(!created_for(&lb("kube_service_k8s_default_web", &d), "other", &s));
        assert!(!created_for(&lb("kube_service_k8s_default_web", &d), "", &s));
        let c = creator(&lb("kube_service_k8s_default_web", &d)).unwrap();
        assert_eq!((c.service(), c.cluster.as_str()), ("default/web".to_string(), "k8s"));
        // Name and description must agree.
        assert!(creator(&lb("kube_service_k8s_default_api", &d)).is_none());
        assert!(creator(&lb("kube_service_k8s_default_web", "")).is_none());
        assert!(creator(&lb("hand-made", "my load balancer")).is_none());
    }

    #[test]
    fn floating_ips_are_recognised_by_their_exact_description() {
        let fip = |d: &str| FloatingIp { description: d.into(), ..Default::default() };
        let d = fip_description("default/web", "k8s");
        assert!(fip_created_for(&fip(&d), "default/web", "k8s"));
        assert!(!fip_created_for(&fip(&d), "default/we", "k8s"));
        assert!(!fip_created_for(&fip(&d), "evil/web", "k8s"));
        assert!(!fip_created_for(&fip(&d), "default/web", "k8"));
        assert!(!fip_created_for(&fip(&format!("{d} (kept)")), "default/web", "k8s"));
        assert!(!fip_created_for(&fip(FIP_DESCRIPTION_PREFIX), "default/web", "k8s"));
        assert_eq!(parse_fip_description(&d), Some(("default/web".into(), "k8s".into())));
        assert_eq!(parse_fip_description("mine"), None);
    }

    #[test]
    fn the_managers_timings_never_wait_inside_a_sync() {
        let t = Timings::default();
        assert!(!t.waits(), "{t:?}");
        assert_eq!(t.poll, Duration::from_secs(2));
        assert!(Timings { max_wait: Duration::from_secs(1), ..t }.waits());
    }

    #[test]
    fn pending_conflicts_are_recognised() {
        let api = |status: u16, message: &str| ClientError::Api {
            op: "x".into(),
            status,
            code: String::new(),
            message: message.into(),
            retry_after: None,
            not_found: false,
        };
        assert!(pending_conflict(&api(
            409,
            "Invalid state PENDING_UPDATE of loadbalancer resource x"
        )));
        assert!(pending_conflict(&api(409, "Load Balancer x is immutable and cannot be updated.")));
        assert!(!pending_conflict(&api(
            409,
            "Another Listener on this Load Balancer is already using protocol_port 80"
        )));
        assert!(!pending_conflict(&api(400, "PENDING_UPDATE")));
    }
}
