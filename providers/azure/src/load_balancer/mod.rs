//! LoadBalancer: the Standard SKU load balancer shared by every Service of the cluster, as
//! upstream's `azure_loadbalancer*.go` with one standard load balancer.
//!
//! | module | owns |
//! |---|---|
//! | [`annotations`] | the Service fields and annotations read, checked before any ARM call |
//! | [`naming`] | every name and ID (upstream's) |
//! | [`frontend`] | the Service's frontend IP configurations |
//! | [`rules`] | its load-balancing rules and health probes |
//! | [`public_ip`] | its public IPs (create, tag, DNS label, release) |
//! | [`backend`] | backend pool membership of the nodes (NICs, scale-set VMs) |
//! | [`security_group`] | its rules in the cluster's network security group |
//!
//! - **Which load balancer**: `loadBalancerName` (else the cluster name) for public
//!   Services, `<that>-internal` for internal ones, in `loadBalancerResourceGroup`; created
//!   when absent (Standard SKU, the config's `location`), with the backend pools `<cluster>`
//!   (`<cluster>-IPv6`) every Service shares.
//! - **Writes** are GET → change only this Service's frontends, rules and probes (by their
//!   `a<uid>` prefix; the shared probe while used) → PUT with `If-Match`; a 412 (someone
//!   else wrote meanwhile) reads again and redoes the change, so both changes survive.
//!   Everything else on the load balancer — other Services, the operator's outbound rules,
//!   NAT rules, tags, fields this provider does not know — goes back unchanged. Changes of
//!   one process are serialised (upstream's `serviceReconcileLock`).
//! - **Ensure**: public IPs (or the internal subnet) → load balancer → backend membership →
//!   the Service is taken off the load balancer of the other kind (an internal ↔ public
//!   switch) → public IPs the Service no longer uses are released → NSG rules.
//! - **Delete**: NSG rules → frontends, rules, probes from both load balancers (a frontend
//!   another rule still uses is kept, as upstream) → a load balancer left without frontends
//!   is emptied of members and deleted (upstream) → the Service's public IPs released
//!   (a user's untagged public IP is never deleted).
//! - **Nodes**: control-plane nodes are left out unless `excludeMasterFromStandardLB:
//!   false`, and `kubernetes.azure.com/managed: "false"` nodes always (upstream); the
//!   `exclude-from-external-load-balancers` label is applied by the service controller.

pub mod annotations;
pub mod backend;
pub mod frontend;
pub mod multi_slb;
pub mod naming;
pub mod pls;
pub mod public_ip;
pub mod rules;
pub mod security_group;

pub use annotations::ANNOTATIONS;

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use ccm_core::cloud::{CloudLoadBalancer, CloudResource, LoadBalancer, ProviderError};
use ccm_core::cloud_call::api_metrics::{self, ApiMetrics};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

use crate::client::ArmClient;
use crate::client::api_version::NETWORK;
use crate::client::models::{
    BackendAddressPool, LoadBalancer as ArmLoadBalancer, Resource, Sku, Subnet,
};
use crate::config::Config;

use annotations::{Family, ServiceConfig};
use backend::Backends;
use frontend::Target;
use naming::LB_TYPE;
use public_ip::PublicIps;
use security_group::SecurityGroup;

/// How many times a write is redone after a 412.
const ETAG_ATTEMPTS: usize = 6;

/// What a read-modify-write step decided.
pub(crate) enum Action<T> {
    /// Leave it (this is what it is).
    Keep(T),
    /// PUT this (with the `If-Match` of the version read).
    Put(T),
}

/// The ARM operation names of a resource type.
#[derive(Clone, Copy)]
pub(crate) struct Ops {
    get: &'static str,
    put: &'static str,
    delete: &'static str,
}

const LB_OPS: Ops = Ops {
    get: "network.load_balancers.get",
    put: "network.load_balancers.create_or_update",
    delete: "network.load_balancers.delete",
};

pub(crate) const PIP_OPS: Ops = Ops {
    get: "network.public_ip_addresses.get",
    put: "network.public_ip_addresses.create_or_update",
    delete: "network.public_ip_addresses.delete",
};

/// GET `id` (`None` when absent), let `change` decide, and write it back with `If-Match`
/// (no `If-Match` when creating); a 412 reads again and asks `change` again. Returns the
/// resource as ARM shows it afterwards (`None` when deleted).
pub(crate) async fn rmw<P>(
    client: &ArmClient,
    ops: Ops,
    id: &str,
    change: &mut impl FnMut(Option<Resource<P>>) -> Result<Action<Resource<P>>, ProviderError>,
) -> Result<Option<Resource<P>>, ProviderError>
where
    P: Serialize + DeserializeOwned + Default,
{
    let mut attempt = 0;
    loop {
        attempt += 1;
        let current: Option<Resource<P>> = client.get_opt(ops.get, id, NETWORK, &[]).await?;
        let existed = current.is_some();
        match change(current)? {
            Action::Keep(r) => return Ok(Some(r)),
            Action::Put(r) => {
                let etag = if existed { r.etag.clone() } else { None };
                match client.put(ops.put, id, NETWORK, &r, etag.as_deref()).await {
                    Ok(v) => return Ok(Some(v)),
                    Err(e) if e.is_precondition_failed() && attempt < ETAG_ATTEMPTS => {
                        debug!(
                            resource = id,
                            attempt, "changed by someone else meanwhile; reading again"
                        );
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
    }
}

/// Whether an ARM provisioning state says the resource's last operation failed (`Failed`;
/// ARM leaves a resource so when its operation fails, until the next `PUT` succeeds).
pub(crate) fn provisioning_failed(state: Option<&str>) -> bool {
    state.is_some_and(|s| s.eq_ignore_ascii_case("Failed"))
}

/// Whether the node may be a backend (upstream: control-plane nodes only with
/// `excludeMasterFromStandardLB: false`; never `kubernetes.azure.com/managed: "false"`).
pub fn is_backend(config: &Config, node: &Node) -> bool {
    let labels = node.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).map(String::as_str);
    if label("kubernetes.azure.com/managed").is_some_and(|v| v.eq_ignore_ascii_case("false")) {
        return false;
    }
    let control_plane = label("node-role.kubernetes.io/control-plane").is_some()
        || label("node-role.kubernetes.io/master").is_some()
        || label("kubernetes.io/role") == Some("master");
    !(control_plane && config.exclude_master_from_standard_lb.unwrap_or(true))
}

/// The `LoadBalancer` capability for Azure.
pub struct AzureLoadBalancer {
    client: Arc<ArmClient>,
    config: Arc<Config>,
    backends: Backends,
    security: SecurityGroup,
    pips: PublicIps,
    pls: pls::PrivateLinks,
    lock: tokio::sync::Mutex<()>,
    /// `multipleStandardLoadBalancerConfigurations` (empty: one load balancer), or why not.
    slbs: Result<Vec<multi_slb::LbConfig>, String>,
    /// The Kubernetes API, for the namespaces `serviceNamespaceSelector` looks at.
    kube: std::sync::OnceLock<kube::Client>,
    /// Whether a multi-SLB pool pass ran in this process.
    multi_pass_done: std::sync::atomic::AtomicBool,
    /// Multi-SLB `externalTrafficPolicy: Local` Services placed by this process, by
    /// `<namespace>/<name>` (lower case): what the pool updater keeps in step.
    local: std::sync::Mutex<BTreeMap<String, multi_slb::LocalService>>,
    /// The provider's own Events (made with the Kubernetes client).
    events: std::sync::OnceLock<ccm_core::controllers::events::EventRecorder>,
}

impl std::fmt::Debug for AzureLoadBalancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureLoadBalancer").finish_non_exhaustive()
    }
}

impl AzureLoadBalancer {
    /// The load balancers of the cluster `config` describes, through `client`.
    pub fn new(client: Arc<ArmClient>, config: Arc<Config>) -> Self {
        let slbs = match &config.multiple_standard_load_balancer_configurations {
            None => Ok(Vec::new()),
            Some(v) => multi_slb::parse(v).map_err(|e| e.to_string()),
        };
        AzureLoadBalancer {
            slbs,
            kube: std::sync::OnceLock::new(),
            multi_pass_done: std::sync::atomic::AtomicBool::new(false),
            local: std::sync::Mutex::new(BTreeMap::new()),
            events: std::sync::OnceLock::new(),
            backends: Backends::new(client.clone(), config.clone()),
            security: SecurityGroup::new(client.clone(), config.clone()),
            pips: PublicIps::new(client.clone(), config.clone()),
            pls: pls::PrivateLinks::new(client.clone(), config.clone()),
            client,
            config,
            lock: tokio::sync::Mutex::new(()),
        }
    }

    /// With the Kubernetes API: `serviceNamespaceSelector`s read the Services' namespaces.
    pub fn with_kube(self, kube: kube::Client) -> Self {
        self.set_kube(kube);
        self
    }

    /// Gives it the Kubernetes API (once; later calls change nothing).
    pub fn set_kube(&self, kube: kube::Client) {
        let _ = self.kube.set(kube);
    }

    fn check_config(&self) -> Result<(), ProviderError> {
        if let Some(sku) = self.config.load_balancer_sku.as_deref()
            && !sku.is_empty()
            && !sku.eq_ignore_ascii_case("standard")
        {
            return Err(ProviderError::Invalid {
                what: "loadBalancerSku".into(),
                message: format!("{sku:?}: only the standard SKU is supported"),
            });
        }
        Ok(())
    }

    fn lb_id(&self, name: &str) -> Result<String, ProviderError> {
        Ok(self.client.resource_id(self.config.load_balancer_resource_group(), LB_TYPE, name)?)
    }

    /// What the config lets the Service name, checked before any ARM call: its resource
    /// group (`serviceResourceGroups`, default the cluster's own) and
    /// `azure-additional-public-ips` (only with `allowAdditionalPublicIPs`).
    fn check_allowed(&self, svc: &ServiceConfig) -> Result<(), ProviderError> {
        if let Some(rg) = &svc.resource_group
            && !self.config.service_resource_groups().allows(rg)
        {
            return Err(ProviderError::Invalid {
                what: annotations::RESOURCE_GROUP.into(),
                message: format!(
                    "resource group {rg} is not one this cluster's Services may name (the config's serviceResourceGroups; default the cluster's own resource groups)"
                ),
            });
        }
        if !svc.additional_public_ips.is_empty() && !self.config.allow_additional_public_ips {
            return Err(ProviderError::Invalid {
                what: annotations::ADDITIONAL_PUBLIC_IPS.into(),
                message: "refused: kube-proxy would capture in-cluster traffic to these addresses; the cloud config's allowAdditionalPublicIPs is off (nothing was written into the Service's status)".into(),
            });
        }
        Ok(())
    }

    /// The Service's public IPs' resource group from its annotation, when the config allows
    /// it (deletion and lookups: a group it may not name never held anything of it).
    fn lenient_resource_group(&self, service: &Service) -> Option<String> {
        annotations::resource_group_lenient(service)
            .filter(|rg| self.config.service_resource_groups().allows(rg))
    }

    fn pool_id(&self, lb_id: &str, cluster: &str, family: Family) -> String {
        naming::child_id(lb_id, "backendAddressPools", &naming::backend_pool_name(cluster, family))
    }

    async fn get_lb(&self, id: &str) -> Result<Option<ArmLoadBalancer>, ProviderError> {
        Ok(self.client.get_opt(LB_OPS.get, id, NETWORK, &[]).await?)
    }

    /// The internal frontend's subnet: the annotation's, else `subnetName`, in `vnetName`.
    async fn subnet(
        &self,
        svc: &ServiceConfig,
    ) -> Result<(String, Vec<ipnet::IpNet>), ProviderError> {
        let name = svc
            .internal_subnet
            .clone()
            .or_else(|| self.config.subnet_name.clone())
            .filter(|s| !s.is_empty())
            .ok_or_else(|| ProviderError::Invalid {
                what: "subnetName".into(),
                message: "internal load balancers need subnetName in the cloud config or the azure-load-balancer-internal-subnet annotation".into(),
            })?;
        let vnet = self.config.vnet_name.clone().filter(|s| !s.is_empty()).ok_or_else(|| {
            ProviderError::Invalid {
                what: "vnetName".into(),
                message: "internal load balancers need vnetName in the cloud config".into(),
            }
        })?;
        let id = format!(
            "{}/subnets/{name}",
            self.client.resource_id(
                self.config.vnet_resource_group(),
                "Microsoft.Network/virtualNetworks",
                &vnet
            )?
        );
        let subnet: Subnet = self
            .client
            .get_opt("network.subnets.get", &id, NETWORK, &[])
            .await?
            .ok_or_else(|| {
            ProviderError::other(format!("subnet {name} of virtual network {vnet} does not exist"))
        })?;
        let prefixes = subnet
            .properties
            .address_prefix
            .iter()
            .chain(subnet.properties.address_prefixes.iter().flatten())
            .filter_map(|p| p.parse().ok())
            .collect();
        Ok((subnet.id.clone().unwrap_or(id), prefixes))
    }

    /// The Service's addresses on `lb` (private IPs, or its public IPs' addresses).
    async fn frontend_ips(
        &self,
        svc: &ServiceConfig,
        lb: &ArmLoadBalancer,
    ) -> Result<Vec<IpAddr>, ProviderError> {
        let mut out = Vec::new();
        let mut owned: Vec<_> = frontend::used(svc, lb).collect();
        owned.sort_by_key(|f| frontend::family_of(svc, f));
        for fe in owned {
            if let Some(ip) = self.frontend_address(fe).await? {
                out.push(ip);
            }
        }
        Ok(out)
    }

    /// A frontend's address: its private IP, or its public IP's address.
    async fn frontend_address(
        &self,
        fe: &crate::client::models::FrontendIpConfiguration,
    ) -> Result<Option<IpAddr>, ProviderError> {
        if let Some(ip) = fe.properties.private_ip_address.as_deref().and_then(|a| a.parse().ok()) {
            return Ok(Some(ip));
        }
        if let Some(pip) = &fe.properties.public_ip_address
            && let Some(pip) = self.pips.get(&pip.id).await?
        {
            return Ok(pip.properties.ip_address.as_deref().and_then(|a| a.parse().ok()));
        }
        Ok(None)
    }

    /// What the Service shares with other Services on `lb` (frontends their rules use too):
    /// those frontends' addresses and the other Services' protocols and ports, so the NSG
    /// keeps the addresses where the others need them.
    async fn shared(
        &self,
        svc: &ServiceConfig,
        lb: &ArmLoadBalancer,
    ) -> Result<security_group::Shared, ProviderError> {
        let mut out = security_group::Shared::default();
        for fe in frontend::used(svc, lb) {
            let others: Vec<_> = lb
                .properties
                .load_balancing_rules
                .iter()
                .filter(|r| !naming::owns(svc, r.name()))
                .filter(|r| {
                    r.properties
                        .frontend_ip_configuration
                        .as_ref()
                        .is_some_and(|f| f.id.eq_ignore_ascii_case(fe.id()))
                })
                .collect();
            if others.is_empty() {
                continue;
            }
            if let Some(ip) = self.frontend_address(fe).await? {
                out.ips.push(ip);
            }
            for r in others {
                let p = &r.properties;
                let proto = match p.protocol.as_deref().map(str::to_ascii_lowercase).as_deref() {
                    Some("tcp") => "Tcp",
                    Some("udp") => "Udp",
                    _ => "*",
                };
                let mut ports = vec![p.frontend_port];
                if p.enable_floating_ip == Some(false) {
                    ports.push(p.backend_port);
                }
                for port in ports.into_iter().flatten() {
                    let port = if port == 0 { "*".to_string() } else { port.to_string() };
                    out.ports.push((proto.to_string(), port));
                }
            }
        }
        Ok(out)
    }

    fn status(&self, svc: &ServiceConfig, ips: &[IpAddr]) -> LoadBalancerStatus {
        let ingress = ips
            .iter()
            .chain(svc.additional_public_ips.iter())
            .map(|ip| LoadBalancerIngress { ip: Some(ip.to_string()), ..Default::default() })
            .collect::<Vec<_>>();
        LoadBalancerStatus { ingress: (!ingress.is_empty()).then_some(ingress) }
    }

    /// Takes the Service off load balancer `name`: its frontends (unless another rule still
    /// uses one), rules and probes; a load balancer left without frontends is emptied of
    /// members and deleted. Returns the Service's addresses that were there.
    async fn remove_from(
        &self,
        cluster: &str,
        service: &Service,
        svc: &ServiceConfig,
        name: &str,
    ) -> Result<Vec<IpAddr>, ProviderError> {
        let id = self.lb_id(name)?;
        let multi = matches!(self.multi(cluster), Ok(Some(_)));
        let Some(current) = self.get_lb(&id).await? else { return Ok(Vec::new()) };
        let ips = self.frontend_ips(svc, &current).await?;
        // A private link service on a frontend about to go goes first (ARM refuses).
        self.pls.release_removed(cluster, service, svc, &current).await?;
        let after = rmw::<crate::client::models::LoadBalancerProperties>(
            &self.client,
            LB_OPS,
            &id,
            &mut |cur| {
                let Some(mut lb) = cur else { return Ok(Action::Keep(ArmLoadBalancer::default())) };
                let removed = frontend::remove(&mut lb, svc);
                let mut changed = rules::reconcile(&mut lb, svc, Vec::new(), Vec::new());
                if multi {
                    changed |= drop_local_pools(&mut lb, &svc.key, &[]);
                }
                Ok(if removed.is_empty() && !changed { Action::Keep(lb) } else { Action::Put(lb) })
            },
        )
        .await?;
        if let Some(lb) = after
            && lb.id.is_some()
            && lb.properties.frontend_ip_configurations.is_empty()
        {
            self.delete_empty(&id, &lb).await?;
        }
        if !ips.is_empty() {
            info!(service = %svc.key, load_balancer = name, "removed the Service from the load balancer");
        }
        Ok(ips)
    }

    /// Deletes a load balancer without frontends, after taking every node out of its pools;
    /// one whose pools the operator fills (`preConfiguredBackendPoolLoadBalancerTypes`) is
    /// left as it is (upstream).
    async fn delete_empty(&self, id: &str, lb: &ArmLoadBalancer) -> Result<(), ProviderError> {
        let internal = lb.name().to_ascii_lowercase().ends_with(naming::INTERNAL_SUFFIX);
        if self.config.backend_pool_pre_configured(internal) {
            info!(
                load_balancer = lb.name(),
                "no frontend left; its backend pools are pre-configured: kept"
            );
            return Ok(());
        }
        for pool in &lb.properties.backend_address_pools {
            let pool_id = pool
                .id
                .clone()
                .unwrap_or_else(|| naming::child_id(id, "backendAddressPools", pool.name()));
            self.backends.remove_all_members(&pool_id).await?;
        }
        // Only when still empty: someone may have added a frontend meanwhile.
        match self.get_lb(id).await? {
            Some(now) if now.properties.frontend_ip_configurations.is_empty() => {
                info!(load_balancer = lb.name(), "deleting the load balancer: no frontend left");
                self.client.delete(LB_OPS.delete, id, NETWORK).await?;
            }
            _ => {}
        }
        Ok(())
    }

    async fn ensure(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        self.check_config()?;
        let svc = pls::parse_service(service)?;
        self.check_allowed(&svc)?;
        let _guard = self.lock.lock().await;
        let multi = self.multi(cluster)?;
        for key in annotations::ignored(service, multi.is_some()) {
            warn!(service = %svc.key, annotation = key,
                "ignored: the single standard load balancer does not use it (as upstream)");
        }
        // With several load balancers, a Local Service has a pool of its own: the Nodes
        // with its endpoints (upstream).
        let local_pools = multi.is_some() && svc.local_traffic;
        // Before anything is written: the additional addresses must be public IPs the
        // cluster may use.
        self.pips.check_additional(cluster, &svc).await?;
        let location = self.config.location.clone().filter(|l| !l.is_empty()).ok_or_else(|| {
            ProviderError::Invalid {
                what: "location".into(),
                message: "the cloud config has no location for the load balancer".into(),
            }
        })?;

        // Where each family's frontend points.
        let mut targets = BTreeMap::new();
        let mut public_ips = BTreeMap::new();
        if svc.internal {
            let (subnet_id, prefixes) = self.subnet(&svc).await?;
            let zones = self.pips.region_zones().await?;
            for f in &svc.families {
                targets.insert(
                    *f,
                    Target::Internal {
                        subnet_id: subnet_id.clone(),
                        prefixes: prefixes.clone(),
                        ip: svc.load_balancer_ip.get(f).copied(),
                        zones: zones.clone(),
                    },
                );
            }
        } else {
            for f in &svc.families {
                let pip = self.pips.ensure(cluster, &svc, *f).await?;
                targets.insert(*f, Target::Public { pip_id: pip.id().to_string() });
                public_ips.insert(*f, pip);
            }
        }

        // Which load balancer; with several, the Service leaves any other it is on first (a
        // public IP is on one frontend at a time).
        let (lb_name, other_names) = match multi {
            None => (
                naming::lb_name(&self.config, cluster, svc.internal),
                vec![naming::lb_name(&self.config, cluster, !svc.internal)],
            ),
            Some(_) => {
                let read = self.read_all(cluster).await?;
                let name = self.place(cluster, service, &svc, &read, &public_ips, &targets).await?;
                let holding: Vec<&multi_slb::Read> = read
                    .iter()
                    .filter(|r| !r.name.eq_ignore_ascii_case(&name))
                    .filter(|r| r.lb.as_ref().is_some_and(|lb| holds(&svc, lb)))
                    .collect();
                for r in &holding {
                    if let Some(lb) = &r.lb
                        && r.internal == svc.internal
                    {
                        Self::check_movable(&svc, lb)?;
                    }
                }
                for r in &holding {
                    self.remove_from(cluster, service, &svc, &r.name).await?;
                }
                (name, Vec::new())
            }
        };
        let lb_id = self.lb_id(&lb_name)?;
        let config_tags = public_ip::config_tags(&self.config)?;
        let pool_names: BTreeMap<Family, String> = svc
            .families
            .iter()
            .map(|f| {
                let name = if local_pools {
                    naming::local_pool_name(&svc.key, *f)
                } else {
                    naming::backend_pool_name(cluster, *f)
                };
                (*f, name)
            })
            .collect();
        let pools: BTreeMap<Family, String> = pool_names
            .iter()
            .map(|(f, n)| (*f, naming::child_id(&lb_id, "backendAddressPools", n)))
            .collect();
        let keep_local: Vec<String> =
            if local_pools { pool_names.values().cloned().collect() } else { Vec::new() };
        let lb = rmw::<crate::client::models::LoadBalancerProperties>(
            &self.client,
            LB_OPS,
            &lb_id,
            &mut |cur| {
                let created = cur.is_none();
                let mut lb = cur.unwrap_or_else(|| ArmLoadBalancer {
                    name: Some(lb_name.clone()),
                    location: Some(location.clone()),
                    sku: Some(Sku {
                        name: Some("Standard".into()),
                        tier: Some("Regional".into()),
                        ..Default::default()
                    }),
                    ..Default::default()
                });
                let mut changed = created;
                for name in pool_names.values() {
                    let name = name.clone();
                    if !lb
                        .properties
                        .backend_address_pools
                        .iter()
                        .any(|p| p.name().eq_ignore_ascii_case(&name))
                    {
                        lb.properties
                            .backend_address_pools
                            .push(BackendAddressPool { name: Some(name), ..Default::default() });
                        changed = true;
                    }
                }
                if !config_tags.is_empty() {
                    changed |= public_ip::merge_tags(
                        lb.tags.get_or_insert_with(BTreeMap::new),
                        &config_tags,
                    );
                }
                let (fe_changed, fe_ids) = frontend::reconcile(&mut lb, &lb_id, &svc, &targets);
                changed |= fe_changed;
                let (mut probes, mut want_rules) = (Vec::new(), Vec::new());
                for (f, fe_id) in &fe_ids {
                    let pool = pools.get(f).cloned().unwrap_or_default();
                    let (p, r) = rules::expected(&self.config, &svc, *f, &lb_id, fe_id, &pool);
                    for p in p {
                        if !probes
                            .iter()
                            .any(|q: &crate::client::models::Probe| q.name() == p.name())
                        {
                            probes.push(p);
                        }
                    }
                    want_rules.extend(r);
                }
                check_conflicts(&lb, &svc, &want_rules)?;
                changed |= rules::reconcile(&mut lb, &svc, probes, want_rules);
                // Its own pool of an earlier Local sync (only where this mode makes them).
                if multi.is_some() {
                    changed |= drop_local_pools(&mut lb, &svc.key, &keep_local);
                }
                // A load balancer whose last operation failed is put again as it is, as
                // upstream does: ARM retries the failed operation.
                let failed = provisioning_failed(lb.properties.provisioning_state.as_deref());
                if failed && !changed {
                    info!(load_balancer = %lb_name, "provisioning state Failed: putting it again");
                }
                Ok(if changed || failed { Action::Put(lb) } else { Action::Keep(lb) })
            },
        )
        .await;
        let lb = match lb {
            Err(e) if arm_code(&e) == Some(NOT_PROVISIONED) => {
                // A public IP the frontend needs is not `Succeeded` (stuck `Updating` or
                // `Failed`): the Service's own public IPs are put again, unchanged (ARM
                // retries their operation), as upstream does; then the load balancer again.
                self.reput_stuck_public_ips(cluster, &svc, &public_ips).await?;
                return Err(ProviderError::RetryAfter {
                    message: format!(
                        "load balancer {lb_name}: a public IP of {} was not provisioned ({NOT_PROVISIONED}); put again",
                        svc.key
                    ),
                    delay: std::time::Duration::from_secs(5),
                });
            }
            other => other?,
        }
        .ok_or_else(|| ProviderError::other(format!("load balancer {lb_name} vanished")))?;

        let mut members: Vec<Node> =
            nodes.iter().filter(|n| is_backend(&self.config, n)).cloned().collect();
        match multi {
            // Pools the operator fills (`preConfiguredBackendPoolLoadBalancerTypes`) are theirs.
            None if !self.config.backend_pool_pre_configured(svc.internal) => {
                for pool in pools.values() {
                    self.backends.ensure_members(pool, &members).await?;
                }
            }
            None => {}
            Some(configs) => {
                let by = self
                    .ensure_multi_members(cluster, service, configs, &members, &lb_name)
                    .await?;
                if local_pools {
                    members = self.ensure_local_members(service, &svc, &pools, members).await?;
                } else {
                    self.remember_local(&svc.key, None);
                    members = by.get(config_of(&lb_name)).cloned().unwrap_or_default();
                }
            }
        }

        // An internal ↔ public switch: off the other load balancer.
        for other in &other_names {
            self.remove_from(cluster, service, &svc, other).await?;
        }

        let keep: Vec<String> = public_ips.values().map(|p| p.id().to_string()).collect();
        self.pips.release(cluster, &svc.key, svc.resource_group.as_deref(), &keep).await?;

        let ips: Vec<IpAddr> = if svc.internal {
            self.frontend_ips(&svc, &lb).await?
        } else {
            svc.families
                .iter()
                .filter_map(|f| public_ips.get(f))
                .filter_map(|p| p.properties.ip_address.as_deref().and_then(|a| a.parse().ok()))
                .collect()
        };
        if ips.len() < svc.families.len() {
            return Err(ProviderError::RetryAfter {
                message: format!(
                    "load balancer {lb_name}: the frontend address of {} is not allocated yet",
                    svc.key
                ),
                delay: std::time::Duration::from_secs(5),
            });
        }
        let destinations =
            if svc.floating_ip { ips.clone() } else { node_ips(&members, &svc.families) };
        let shared = self.shared(&svc, &lb).await?;
        self.security.ensure_service_rules_shared(service, &destinations, &shared).await?;
        self.pls.ensure(cluster, service, &svc, &pls::frontends_of(&svc, &lb)).await?;
        info!(service = %svc.key, load_balancer = %lb_name, ips = ?ips, "load balancer ensured");
        Ok(self.status(&svc, &ips))
    }

    async fn delete(&self, cluster: &str, service: &Service) -> Result<(), ProviderError> {
        let svc = annotations::minimal(service)?;
        let _guard = self.lock.lock().await;
        let names: Vec<String> = self.lb_names(cluster)?.into_iter().map(|(n, _, _)| n).collect();
        // The addresses first: the NSG rules are keyed on them.
        let mut ips = Vec::new();
        let mut shared = security_group::Shared::default();
        for name in &names {
            if let Some(lb) = self.get_lb(&self.lb_id(name)?).await? {
                // A private link service goes before its frontend (ARM refuses the
                // frontend's removal while one uses it); another's stops the delete here,
                // before anything changed.
                self.pls.release_removed(cluster, service, &svc, &lb).await?;
                ips.extend(self.frontend_ips(&svc, &lb).await?);
                let s = self.shared(&svc, &lb).await?;
                shared.ips.extend(s.ips);
                shared.ports.extend(s.ports);
            }
        }
        self.security.remove_service_rules_shared(service, &ips, &shared).await?;
        for name in &names {
            self.remove_from(cluster, service, &svc, name).await?;
        }
        let rg = self.lenient_resource_group(service);
        self.pips.release(cluster, &svc.key, rg.as_deref(), &[]).await?;
        self.remember_local(&svc.key, None);
        info!(service = %svc.key, "load balancer resources deleted");
        Ok(())
    }
}

/// ARM's answer to a load balancer whose frontend names a public IP that is not `Succeeded`.
const NOT_PROVISIONED: &str = "ReferencedResourceNotProvisioned";

/// ARM's error code behind a provider error, when an ARM reply caused it.
fn arm_code(e: &ProviderError) -> Option<&str> {
    let ProviderError::Other { source: Some(source), .. } = e else { return None };
    source.downcast_ref::<crate::client::ArmError>()?.code()
}

impl AzureLoadBalancer {
    /// Puts the Service's own public IPs (named `<cluster>-a<uid>`, tagged for it by this
    /// cluster) that are not `Succeeded` again, unchanged. A public IP a Service names is
    /// never rewritten.
    async fn reput_stuck_public_ips(
        &self,
        cluster: &str,
        svc: &ServiceConfig,
        public_ips: &BTreeMap<Family, crate::client::models::PublicIpAddress>,
    ) -> Result<(), ProviderError> {
        for (family, pip) in public_ips {
            if !pip.name().eq_ignore_ascii_case(&naming::pip_name(cluster, svc, *family))
                || !public_ip::owned_by(pip, &svc.key, cluster)
            {
                continue;
            }
            let Some(now) = self.pips.get(pip.id()).await? else { continue };
            let state = now.properties.provisioning_state.as_deref().unwrap_or("Succeeded");
            if state.eq_ignore_ascii_case("Succeeded") {
                continue;
            }
            info!(public_ip = now.name(), state, "public IP not provisioned: putting it again");
            self.client.put(PIP_OPS.put, now.id(), NETWORK, &now, now.etag.as_deref()).await?;
        }
        Ok(())
    }
}

/// Upstream's `checkLoadBalancerResourcesConflicts`: another Service's rule on the same
/// frontend, protocol and port.
fn check_conflicts(
    lb: &ArmLoadBalancer,
    svc: &ServiceConfig,
    want: &[crate::client::models::LoadBalancingRule],
) -> Result<(), ProviderError> {
    for w in want {
        let wp = &w.properties;
        for r in &lb.properties.load_balancing_rules {
            if naming::owns(svc, r.name()) {
                continue;
            }
            let p = &r.properties;
            let same_fe = match (&p.frontend_ip_configuration, &wp.frontend_ip_configuration) {
                (Some(a), Some(b)) => a.is(&b.id),
                _ => false,
            };
            if same_fe
                && p.frontend_port == wp.frontend_port
                && p.protocol.as_deref().map(str::to_ascii_lowercase)
                    == wp.protocol.as_deref().map(str::to_ascii_lowercase)
            {
                return Err(ProviderError::Invalid {
                    what: "spec.ports".into(),
                    message: format!(
                        "port {} conflicts with rule {} of the load balancer",
                        wp.frontend_port.unwrap_or(0),
                        r.name()
                    ),
                });
            }
        }
    }
    Ok(())
}

fn node_ips(nodes: &[Node], families: &[Family]) -> Vec<IpAddr> {
    nodes
        .iter()
        .filter_map(|n| n.status.as_ref()?.addresses.as_ref())
        .flatten()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse::<IpAddr>().ok())
        .filter(|ip| families.contains(&Family::of(ip)))
        .collect()
}

impl AzureLoadBalancer {
    /// A multi-SLB Local Service's pools (`pools`, one per family) get the backend Nodes
    /// (`members`) that hold its endpoints, and the Service is remembered for the pool
    /// updater. Returns those Nodes.
    async fn ensure_local_members(
        &self,
        service: &Service,
        svc: &ServiceConfig,
        pools: &BTreeMap<Family, String>,
        members: Vec<Node>,
    ) -> Result<Vec<Node>, ProviderError> {
        let eps = self.endpoint_nodes(service).await?;
        let mine = multi_slb::local_members(&members, eps.as_ref());
        for pool in pools.values() {
            self.backends.ensure_members(pool, &mine).await?;
        }
        let remembered = multi_slb::LocalService {
            service: Service { metadata: service.metadata.clone(), ..Default::default() },
            pools: pools.values().cloned().collect(),
            members,
            applied: eps,
        };
        self.remember_local(&svc.key, Some(remembered));
        Ok(mine)
    }

    /// Upstream's `UpdateLoadBalancer`: the members of the Service's backend pools and its
    /// security rules follow `nodes`; nothing when the load balancer is not the Service's.
    async fn update(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<(), ProviderError> {
        let svc = pls::parse_service(service)?;
        let _guard = self.lock.lock().await;
        if let Some(configs) = self.multi(cluster)? {
            let read = self.read_all(cluster).await?;
            let Some(on) = read.iter().find(|r| {
                r.lb.as_ref().is_some_and(|lb| frontend::used(&svc, lb).next().is_some())
            }) else {
                return Ok(());
            };
            let members: Vec<Node> =
                nodes.iter().filter(|n| is_backend(&self.config, n)).cloned().collect();
            let by =
                self.ensure_multi_members(cluster, service, configs, &members, &on.name).await?;
            let mut mine = by.get(&on.config).cloned().unwrap_or_default();
            if svc.local_traffic {
                let lb_id = self.lb_id(&on.name)?;
                let pools: BTreeMap<Family, String> = svc
                    .families
                    .iter()
                    .map(|f| {
                        let name = naming::local_pool_name(&svc.key, *f);
                        (*f, naming::child_id(&lb_id, "backendAddressPools", &name))
                    })
                    .collect();
                mine = self.ensure_local_members(service, &svc, &pools, members).await?;
            }
            if !svc.floating_ip {
                self.security
                    .ensure_service_rules(service, &node_ips(&mine, &svc.families))
                    .await?;
            }
            return Ok(());
        }
        let lb_id = self.lb_id(&naming::lb_name(&self.config, cluster, svc.internal))?;
        // One read of the load balancer for its frontends and pools (the read cache's view:
        // the Services synced for one Node change read it once, not once each).
        let Some(lb) = self.backends.load_balancer(&lb_id).await? else { return Ok(()) };
        if frontend::used(&svc, &lb).next().is_none() {
            return Ok(());
        }
        let members: Vec<Node> =
            nodes.iter().filter(|n| is_backend(&self.config, n)).cloned().collect();
        if !self.config.backend_pool_pre_configured(svc.internal) {
            for f in &svc.families {
                let pool = self.pool_id(&lb_id, cluster, *f);
                self.backends.ensure_members_in(&lb, &pool, &members).await?;
            }
        }
        if !svc.floating_ip {
            self.security.ensure_service_rules(service, &node_ips(&members, &svc.families)).await?;
        }
        Ok(())
    }

    /// Runs one service operation and records it as upstream's `NewMetricContext("services",
    /// <operation>, resourceGroup, subscription, "<namespace>/<name>")` and
    /// `ObserveOperationWithResult` do: its latency in `cloudprovider_azure_op_duration_seconds`
    /// and, when it failed, one more `cloudprovider_azure_op_failure_count`.
    async fn operation<T>(
        &self,
        operation: &str,
        service: &Service,
        run: impl std::future::Future<Output = Result<T, ProviderError>>,
    ) -> Result<T, ProviderError> {
        let start = std::time::Instant::now();
        let result = run.await;
        let request = format!("services_{operation}");
        let group = self.config.resource_group.as_deref().unwrap_or_default().to_ascii_lowercase();
        let source = format!(
            "{}/{}",
            service.metadata.namespace.as_deref().unwrap_or_default(),
            service.metadata.name.as_deref().unwrap_or_default()
        );
        let labels = [request.as_str(), group.as_str(), self.client.subscription_id(), &source];
        ApiMetrics::of(&api_metrics::AZURE).reconcile_finished(
            &api_metrics::AZURE_OPERATION,
            &labels,
            start.elapsed(),
            result.as_ref().err().map(|_| "failed"),
        );
        result
    }
}

#[async_trait]
impl LoadBalancer for AzureLoadBalancer {
    async fn get_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        let svc = annotations::minimal(service)?;
        for (name, _, _) in self.lb_names(cluster)? {
            let id = self.lb_id(&name)?;
            if let Some(lb) = self.get_lb(&id).await?
                && frontend::used(&svc, &lb).next().is_some()
            {
                let ips = self.frontend_ips(&svc, &lb).await?;
                return Ok(Some(self.status(&svc, &ips)));
            }
        }
        // Only the public IP left (a half-finished delete): it still exists (upstream).
        let rg = self.lenient_resource_group(service);
        let rg = self.pips.resource_group(rg.as_deref());
        for f in &svc.families {
            let id = self.client.resource_id(
                &rg,
                naming::PIP_TYPE,
                &naming::pip_name(cluster, &svc, *f),
            )?;
            if let Some(pip) = self.pips.get(&id).await?
                && public_ip::owned_by(&pip, &svc.key, cluster)
            {
                return Ok(Some(LoadBalancerStatus::default()));
            }
        }
        Ok(None)
    }

    async fn ensure_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        self.operation("ensure_loadbalancer", service, self.ensure(cluster, service, nodes)).await
    }

    async fn update_load_balancer(
        &self,
        cluster: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<(), ProviderError> {
        self.operation("update_loadbalancer", service, self.update(cluster, service, nodes)).await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cluster: &str,
        service: &Service,
    ) -> Result<(), ProviderError> {
        self.operation("ensure_loadbalancer_deleted", service, self.delete(cluster, service)).await
    }

    async fn list_cloud_load_balancers(
        &self,
        cluster: &str,
    ) -> Result<Vec<CloudLoadBalancer>, ProviderError> {
        let mut out = Vec::new();
        let pips = self.pips.list(None).await?;
        for (name, internal, _) in self.lb_names(cluster)? {
            let Some(lb) = self.get_lb(&self.lb_id(&name)?).await? else { continue };
            let mut by_prefix: BTreeMap<String, CloudLoadBalancer> = BTreeMap::new();
            for fe in &lb.properties.frontend_ip_configurations {
                let Some(prefix) = service_prefix(fe.name()) else { continue };
                let entry = by_prefix.entry(prefix.clone()).or_insert_with(|| CloudLoadBalancer {
                    name: prefix.clone(),
                    kind: format!(
                        "frontend on {}load balancer {name}",
                        if internal { "internal " } else { "" }
                    ),
                    id: fe.id().to_string(),
                    owned: true,
                    ..Default::default()
                });
                entry.resources.push(CloudResource {
                    kind: "frontend IP configuration".into(),
                    id: fe.id().to_string(),
                    name: fe.name().to_string(),
                });
                if let Some(ip) = &fe.properties.private_ip_address {
                    entry.ingress.push(ip.clone());
                }
                if let Some(r) = &fe.properties.public_ip_address
                    && let Some(pip) = pips.iter().find(|p| p.id().eq_ignore_ascii_case(&r.id))
                {
                    if let Some(ip) = &pip.properties.ip_address {
                        entry.ingress.push(ip.clone());
                    }
                    if !public_ip::user_made(pip) {
                        entry.service = public_ip::services_of(pip).first().cloned();
                        entry.resources.push(CloudResource {
                            kind: "public IP".into(),
                            id: pip.id().to_string(),
                            name: pip.name().to_string(),
                        });
                    }
                }
            }
            // A frontend another Service's rules still use (it shares it) is not an orphan.
            by_prefix.retain(|prefix, entry| {
                !lb.properties.load_balancing_rules.iter().any(|r| {
                    !starts_with_ignore_case(r.name(), prefix)
                        && r.properties.frontend_ip_configuration.as_ref().is_some_and(|f| {
                            entry.resources.iter().any(|c| c.id.eq_ignore_ascii_case(&f.id))
                        })
                })
            });
            for (prefix, entry) in by_prefix.iter_mut() {
                let has = |n: &str| starts_with_ignore_case(n, prefix);
                for r in lb.properties.load_balancing_rules.iter().filter(|r| has(r.name())) {
                    entry.resources.push(CloudResource {
                        kind: "load-balancing rule".into(),
                        id: r.id().to_string(),
                        name: r.name().to_string(),
                    });
                }
                for p in lb.properties.probes.iter().filter(|p| has(p.name())) {
                    entry.resources.push(CloudResource {
                        kind: "health probe".into(),
                        id: p.id().to_string(),
                        name: p.name().to_string(),
                    });
                }
            }
            out.extend(by_prefix.into_values());
        }
        Ok(out)
    }

    async fn delete_cloud_load_balancer(
        &self,
        cluster: &str,
        lb: &CloudLoadBalancer,
    ) -> Result<(), ProviderError> {
        let listed = self.list_cloud_load_balancers(cluster).await?;
        let Some(now) =
            listed.iter().find(|l| l.name == lb.name && l.id.eq_ignore_ascii_case(&lb.id))
        else {
            return Ok(());
        };
        if !now.owned {
            return Err(ProviderError::Invalid {
                what: "load balancer".into(),
                message: format!("{} is not owned by cluster {cluster}", lb.name),
            });
        }
        let svc = ServiceConfig {
            prefix: now.name.clone(),
            key: now.service.clone().unwrap_or_default(),
            ..Default::default()
        };
        let _guard = self.lock.lock().await;
        for (name, _, _) in self.lb_names(cluster)? {
            self.remove_from(cluster, &Service::default(), &svc, &name).await?;
        }
        for r in now.resources.iter().filter(|r| r.kind == "public IP") {
            if let Some(pip) = self.pips.get(&r.id).await?
                && !public_ip::user_made(&pip)
                && public_ip::services_of(&pip).len() <= 1
                && pip.properties.ip_configuration.is_none()
                && pip.tag(naming::CLUSTER_TAG).is_none_or(|c| c.eq_ignore_ascii_case(cluster))
            {
                self.client.delete(PIP_OPS.delete, &r.id, NETWORK).await?;
            }
        }
        Ok(())
    }
}

/// Removes the Service `key`'s own Local pools ([`naming::local_pool_name`]) from `lb`,
/// except those named in `keep`: only a pool that lists no NIC or scale-set member and that
/// nothing left on the load balancer references (no rule, outbound or NAT rule names it).
/// Called only with several load balancers (the mode that makes such pools; with one, a
/// pool of that name is left alone). Returns whether one went.
fn drop_local_pools(lb: &mut ArmLoadBalancer, key: &str, keep: &[String]) -> bool {
    if key.is_empty() {
        return false;
    }
    let before = lb.properties.backend_address_pools.len();
    let refs = {
        let rules = serde_json::to_string(&lb.properties.load_balancing_rules).unwrap_or_default();
        let extra = serde_json::to_string(&lb.properties.extra).unwrap_or_default();
        format!("{rules}{extra}").to_ascii_lowercase()
    };
    lb.properties.backend_address_pools.retain(|p| {
        let name = p.name();
        if !naming::is_local_pool_of(key, name) || keep.iter().any(|k| k.eq_ignore_ascii_case(name))
        {
            return true;
        }
        let nic_members =
            p.properties.backend_ip_configurations.as_ref().is_some_and(|v| !v.is_empty());
        let referenced =
            refs.contains(&format!("/backendaddresspools/{}\"", name.to_ascii_lowercase()));
        if !nic_members && !referenced {
            info!(
                load_balancer = lb_name_of(p.id.as_deref()),
                pool = name,
                service = key,
                "removing the Service's own backend pool: no longer used"
            );
        }
        nic_members || referenced
    });
    before != lb.properties.backend_address_pools.len()
}

/// The load balancer's name in a child resource's ID (for logs).
fn lb_name_of(id: Option<&str>) -> &str {
    id.and_then(|i| i.split('/').skip_while(|s| !s.eq_ignore_ascii_case("loadBalancers")).nth(1))
        .unwrap_or_default()
}

/// Whether the Service has anything on `lb`: a frontend, a rule or a probe of its own.
fn holds(svc: &ServiceConfig, lb: &ArmLoadBalancer) -> bool {
    frontend::used(svc, lb).next().is_some()
        || lb.properties.load_balancing_rules.iter().any(|r| naming::owns(svc, r.name()))
        || lb.properties.probes.iter().any(|p| naming::owns(svc, p.name()))
}

/// The configuration of a load balancer name (`<name>` or `<name>-internal`).
fn config_of(lb_name: &str) -> &str {
    let n = naming::INTERNAL_SUFFIX.len();
    match lb_name.len().checked_sub(n) {
        Some(at)
            if lb_name.is_char_boundary(at)
                && lb_name[at..].eq_ignore_ascii_case(naming::INTERNAL_SUFFIX) =>
        {
            &lb_name[..at]
        }
        _ => lb_name,
    }
}

/// Whether `name` starts with `prefix`, ASCII case-insensitively (bytes: a name from ARM
/// need not have a character boundary where the prefix ends).
fn starts_with_ignore_case(name: &str, prefix: &str) -> bool {
    name.as_bytes().get(..prefix.len()).is_some_and(|b| b.eq_ignore_ascii_case(prefix.as_bytes()))
}

/// `a` + 31 hex digits at the start of a frontend name: the Service prefix.
fn service_prefix(name: &str) -> Option<String> {
    let p = name.get(..32)?;
    (p.starts_with('a') && p[1..].bytes().all(|b| b.is_ascii_hexdigit())).then(|| p.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn node(labels: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn control_plane_and_unmanaged_nodes_are_not_backends() {
        let c = Config::default();
        assert!(is_backend(&c, &node(&[])));
        assert!(!is_backend(&c, &node(&[("node-role.kubernetes.io/control-plane", "")])));
        assert!(!is_backend(&c, &node(&[("node-role.kubernetes.io/master", "")])));
        assert!(!is_backend(&c, &node(&[("kubernetes.io/role", "master")])));
        assert!(!is_backend(&c, &node(&[("kubernetes.azure.com/managed", "false")])));
        let keep = Config { exclude_master_from_standard_lb: Some(false), ..Default::default() };
        assert!(is_backend(&keep, &node(&[("node-role.kubernetes.io/control-plane", "")])));
        assert!(!is_backend(&keep, &node(&[("kubernetes.azure.com/managed", "false")])));
    }

    #[test]
    fn rule_names_from_arm_never_panic_the_prefix_match() {
        let p = "a6f7f1b2c123456789abcdef01234567";
        assert!(starts_with_ignore_case("A6F7F1B2C123456789ABCDEF01234567-TCP-80", p));
        assert!(!starts_with_ignore_case("a6f7f1b2c123456789abcdef0123456", p));
        // A multi-byte character across the prefix's end: no match, no panic.
        assert!(!starts_with_ignore_case("a6f7f1b2c123456789abcdef0123456é-TCP-80", p));
    }

    #[test]
    fn service_prefix_of_frontend_names() {
        assert_eq!(
            service_prefix("a6f7f1b2c123456789abcdef01234567-IPv6").as_deref(),
            Some("a6f7f1b2c123456789abcdef01234567")
        );
        assert_eq!(service_prefix("outbound"), None);
        assert_eq!(service_prefix("zzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzzz"), None);
    }
}
