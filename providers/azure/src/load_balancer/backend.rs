//! Backend pool membership: which nodes' IP configurations reference a load balancer's
//! backend pool (`loadBalancerBackendPoolConfigurationType: nodeIPConfiguration`, upstream's
//! default), as upstream's `EnsureHostsInPool` / `EnsureBackendPoolDeleted` in
//! `azure_standard.go` (availability-set and standalone VMs, flexible scale sets) and
//! `azure_vmss.go` (uniform scale sets).
//!
//! Owns every write to NICs, scale-set models and scale-set VMs:
//! - a VM (availability set, standalone, flexible scale set): its primary NIC's IP
//!   configuration of the pool's family (IPv4 pool `<lb pool>`: the primary IP configuration;
//!   IPv6 pool `…-IPv6`: the first IPv6 one) lists the pool — GET NIC, change, PUT NIC with
//!   `If-Match` (412: read again and redo);
//! - a uniform scale-set VM: the same IP configuration in the VM's
//!   `networkProfileConfiguration` (PUT `…/virtualMachineScaleSets/{ss}/virtualMachines/{id}`,
//!   upstream's per-VM update), and the scale set's model (`virtualMachineProfile`) lists the
//!   pool too, so instances it adds later join (upstream's `ensureVMSSInPool`);
//! - a flexible scale set's VM (a VM whose `virtualMachineScaleSet` names its scale set): its
//!   NIC as any VM's, and the flexible scale set's model lists the pool too, so instances it
//!   adds later join at once (upstream's `ensureVMSSFlexInPool`). Only scale sets in the
//!   config's `resourceGroup` get their model changed, as upstream.
//!
//! The pool's read-only `backendIPConfigurations` (one GET of the load balancer) say who is in
//! it now; only the difference is read and written, at most [`CONCURRENCY`] at a time, so a
//! re-sync with nothing to change reads no NIC and writes nothing (the ARM read budget,
//! issue #33 item 10: at 1000 Nodes × 100 Services a NIC read per Node and Service sync
//! would be 100,000 reads, eight times ARM's hourly subscription limit). Nodes are found by
//! `spec.providerID` ([`VmRef::parse`]); a node without one, or not an Azure VM's, is
//! skipped. VMs of the nodes are read from one VM list per resource group (never one GET per
//! node; the listing is cached for `vmCacheTTLInSeconds`). A member read to be added that
//! needed no write (its IP configuration is in another load balancer's pool, it is already
//! listed, its NIC or scale-set VM is gone or being deleted) is not read again for that pool
//! within the same TTL: a Node ARM will not let into the pool costs one read per TTL, not
//! one per Service sync. Nothing is skipped when caching is off (`disableAPICallCache`).
//!
//! Before a pool (or its load balancer) is deleted, [`Backends::remove_all_members`] takes
//! the pool out of every NIC, scale-set VM and scale-set model that lists it — the models of
//! every uniform and flexible scale set of the resource group, whatever `vmType` says (a
//! cluster may mix them, and upstream's cleanup walks both kinds): ARM refuses to delete a
//! pool in use (`InUseBackendAddressPoolCannotBeDeleted`). A scale set being deleted is left
//! alone (its model takes no update).
//!
//! `nodeIP` pools list the nodes' private IPs in the pool itself (`loadBalancerBackendAddresses`,
//! written through the load balancer); pulling nodes out before a delete is not needed there
//! (ARM deletes a pool holding addresses). `podIP` pools are not supported: a clear error.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Instant;

use ccm_core::cloud::ProviderError;
use futures::stream::{self, StreamExt};
use k8s_openapi::api::core::v1::Node;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tracing::{debug, info, warn};

use crate::client::api_version::{COMPUTE, NETWORK};
use crate::client::models::{
    LoadBalancer, NetworkInterface, Ref, Resource, VirtualMachine, VirtualMachineScaleSet,
    VirtualMachineScaleSetVm, VmssNetworkProfile,
};
use crate::client::{ArmClient, ArmError};
use crate::config::{BackendPoolType, Config};
use crate::provider_id::VmRef;

/// How many NICs / scale-set VMs are read and written at once.
pub const CONCURRENCY: usize = 8;

/// How often a write whose ETag went stale (412) is redone before giving up.
const ETAG_ATTEMPTS: usize = 5;

/// Backend pool membership of the cluster's nodes.
pub struct Backends {
    client: Arc<ArmClient>,
    config: Arc<Config>,
    /// Members (lower-case NIC / scale-set VM IDs) and `nodeIP` addresses this process has
    /// seen as its Nodes': the ones it may take out of a pool when their Node leaves.
    known: std::sync::Mutex<BTreeSet<String>>,
    /// `(pool, member, removing)` (lower case) whose last read to add it needed no write, or
    /// that was taken out of the pool (or found out of it), and when: not read again for that
    /// within the VM listing's TTL (a load balancer read before ARM's back-references caught
    /// up still lists a member just taken out).
    settled: std::sync::Mutex<BTreeMap<(String, String, bool), Instant>>,
}

/// A member of a pool, from one of its `backendIPConfigurations`.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Member {
    /// A NIC (`…/networkInterfaces/{nic}`).
    Nic(String),
    /// A uniform scale-set VM (`…/virtualMachineScaleSets/{ss}/virtualMachines/{id}`).
    ScaleSetVm(String),
}

impl Member {
    /// The member owning an IP configuration ID, if it is a NIC's or a scale-set VM's.
    pub(crate) fn of_ip_configuration(id: &str) -> Option<Member> {
        let segs: Vec<&str> = id.split('/').collect();
        let at = |i: usize, want: &str| segs.get(i).is_some_and(|s| s.eq_ignore_ascii_case(want));
        for i in 0..segs.len() {
            if at(i, "virtualMachines")
                && i >= 2
                && at(i - 2, "virtualMachineScaleSets")
                && segs.get(i + 1).is_some_and(|s| !s.is_empty())
            {
                return Some(Member::ScaleSetVm(segs[..=i + 1].join("/")));
            }
        }
        for i in 0..segs.len() {
            if at(i, "networkInterfaces") && segs.get(i + 1).is_some_and(|s| !s.is_empty()) {
                return Some(Member::Nic(segs[..=i + 1].join("/")));
            }
        }
        None
    }

    fn key(&self) -> String {
        match self {
            Member::Nic(id) | Member::ScaleSetVm(id) => id.to_ascii_lowercase(),
        }
    }
}

/// What a read-modify-write did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Written {
    /// The resource does not exist (404 for it).
    Missing,
    /// Nothing needed changing: no PUT.
    Unchanged,
    /// PUT.
    Yes,
}

/// GET `id`, let `change` edit it (returning whether it changed anything), and PUT it back
/// with `If-Match` when ARM gave an ETag; a 412 reads again and redoes the change.
pub(crate) async fn read_modify_write<P, F>(
    client: &ArmClient,
    ops: (&'static str, &'static str),
    id: &str,
    api_version: &str,
    mut change: F,
) -> Result<Written, ArmError>
where
    P: Serialize + DeserializeOwned + Default,
    F: FnMut(&mut Resource<P>) -> Result<bool, ArmError>,
{
    let (get_op, put_op) = ops;
    let mut attempt = 0;
    loop {
        attempt += 1;
        let Some(mut res) = client.get_opt::<Resource<P>>(get_op, id, api_version, &[]).await?
        else {
            return Ok(Written::Missing);
        };
        if !change(&mut res)? {
            return Ok(Written::Unchanged);
        }
        let etag = res.etag.clone();
        match client.put(put_op, id, api_version, &res, etag.as_deref()).await {
            Ok(_) => return Ok(Written::Yes),
            Err(e) if e.is_precondition_failed() && attempt < ETAG_ATTEMPTS => {
                debug!(resource = id, "ETag changed while updating; reading again");
            }
            Err(e) => return Err(e),
        }
    }
}

/// The resource group named in an ARM ID (`/subscriptions/{s}/resourceGroups/{rg}/…`).
fn resource_group_of(id: &str) -> Option<&str> {
    let mut segs = id.split('/');
    while let Some(s) = segs.next() {
        if s.eq_ignore_ascii_case("resourceGroups") {
            return segs.next().filter(|rg| !rg.is_empty());
        }
    }
    None
}

/// The load balancer ID of a backend pool ID (`…/loadBalancers/{lb}/backendAddressPools/{p}`).
fn split_pool_id(pool_id: &str) -> Option<(&str, &str)> {
    let lower = pool_id.to_ascii_lowercase();
    let at = lower.find("/backendaddresspools/")?;
    let name = &pool_id[at + "/backendAddressPools/".len()..];
    if name.is_empty() || name.contains('/') || !lower[..at].contains("/loadbalancers/") {
        return None;
    }
    Some((&pool_id[..at], name))
}

/// Whether a pool is the IPv6 one (upstream: the name ends in `-IPv6`).
pub(crate) fn is_ipv6_pool(pool_id: &str) -> bool {
    pool_id.to_ascii_lowercase().ends_with("-ipv6")
}

/// The load balancer name of a pool ID, without upstream's `-internal` suffix.
fn lb_family(pool_id: &str) -> Option<String> {
    let (lb, _) = split_pool_id(pool_id)?;
    let name = lb.rsplit('/').next()?.to_ascii_lowercase();
    Some(name.strip_suffix("-internal").unwrap_or(&name).to_string())
}

/// Upstream's `isBackendPoolOnSameLB`: an IP configuration already in a pool of another
/// cluster's load balancer is left alone (ARM refuses one IP configuration in two standard
/// load balancers' pools of the same kind).
fn in_other_lb(pool_id: &str, existing: &[Ref]) -> Option<String> {
    let mine = lb_family(pool_id)?;
    existing.iter().find_map(|r| {
        let other = lb_family(&r.id)?;
        (other != mine).then_some(other)
    })
}

/// The error for a backend pool ID that is not `…/loadBalancers/<lb>/backendAddressPools/<pool>`.
fn bad_pool_id(pool_id: &str) -> ProviderError {
    ProviderError::Invalid {
        what: "backend pool ID".into(),
        message: format!("{pool_id:?} is not …/loadBalancers/<lb>/backendAddressPools/<pool>"),
    }
}

/// The members of the pool `pool_id` (named `name`) of `lb`, from its
/// `backendIPConfigurations`; `None` when `lb` has no such pool.
fn pool_members(lb: &LoadBalancer, pool_id: &str, name: &str) -> Option<Vec<Member>> {
    let pool = lb.properties.backend_address_pools.iter().find(|p| {
        p.id.as_deref().is_some_and(|id| id.eq_ignore_ascii_case(pool_id))
            || p.name().eq_ignore_ascii_case(name)
    })?;
    let mut out: Vec<Member> = pool
        .properties
        .backend_ip_configurations
        .iter()
        .flatten()
        .filter_map(|r| {
            let m = Member::of_ip_configuration(&r.id);
            if m.is_none() {
                debug!(ip_configuration = %r.id, "backend pool member is neither a NIC nor a scale-set VM; left alone");
            }
            m
        })
        .collect();
    out.sort();
    out.dedup_by(|a, b| a.key() == b.key());
    Some(out)
}

/// Adds `pool_id` to a pool list; `false` when it is already there.
fn add_pool(pools: &mut Option<Vec<Ref>>, pool_id: &str) -> bool {
    let list = pools.get_or_insert_with(Vec::new);
    if list.iter().any(|r| r.is(pool_id)) {
        return false;
    }
    list.push(Ref::to(pool_id));
    true
}

/// Removes `pool_id` from a pool list; `false` when it was not there.
fn remove_pool(pools: &mut Option<Vec<Ref>>, pool_id: &str) -> bool {
    let Some(list) = pools else { return false };
    let before = list.len();
    list.retain(|r| !r.is(pool_id));
    before != list.len()
}

/// A scale-set VM Compute is deleting: its model takes no update (ARM refuses one, and the
/// VM leaves every pool with it), as upstream skips it.
fn being_deleted(v: &VirtualMachineScaleSetVm) -> bool {
    let deleting = v
        .properties
        .provisioning_state
        .as_deref()
        .is_some_and(|p| p.eq_ignore_ascii_case("Deleting"));
    if deleting {
        debug!(
            vm = v.id.as_deref().unwrap_or_default(),
            "scale-set VM is being deleted; left alone"
        );
    }
    deleting
}

fn arm_err(what: &str, e: ArmError) -> ProviderError {
    let throttled = e.is_throttled();
    let message = format!("{what}: {e}");
    if throttled {
        ProviderError::Throttled(message)
    } else {
        ProviderError::with_source(message, e)
    }
}

/// Why an IP configuration could not be chosen.
fn no_ip_config(resource: &str, ipv6: bool) -> ArmError {
    ArmError::Decode {
        operation: "backend_pool.membership",
        resource: resource.to_string(),
        message: format!(
            "no {} IP configuration to put in the backend pool",
            if ipv6 { "IPv6" } else { "primary IPv4" }
        ),
    }
}

/// Outcome of adding to one IP configuration.
enum Added {
    Changed,
    Already,
    OtherLb(String),
}

impl Added {
    /// Whether the resource changed; the other load balancer that holds the IP configuration,
    /// if that is why nothing changed, goes to `skipped`.
    fn changed(self, skipped: &mut Option<String>) -> bool {
        match self {
            Added::Changed => true,
            Added::Already => false,
            Added::OtherLb(lb) => {
                *skipped = Some(lb);
                false
            }
        }
    }
}

/// Adds `pool_id` to a NIC's IP configuration of the pool's family.
fn nic_add(nic: &mut NetworkInterface, pool_id: &str) -> Result<Added, ArmError> {
    let ipv6 = is_ipv6_pool(pool_id);
    let configs = &mut nic.properties.ip_configurations;
    let idx = pick(
        configs.len(),
        |i| configs[i].properties.primary == Some(true),
        |i| {
            configs[i]
                .properties
                .private_ip_address_version
                .as_deref()
                .is_some_and(|v| v.eq_ignore_ascii_case("IPv6"))
        },
        ipv6,
    )
    .ok_or_else(|| no_ip_config(nic.id.as_deref().unwrap_or_default(), ipv6))?;
    let pools = &mut configs[idx].properties.load_balancer_backend_address_pools;
    add_to(pools, pool_id)
}

fn add_to(pools: &mut Option<Vec<Ref>>, pool_id: &str) -> Result<Added, ArmError> {
    if pools.as_ref().is_some_and(|l| l.iter().any(|r| r.is(pool_id))) {
        return Ok(Added::Already);
    }
    if let Some(other) = pools.as_deref().and_then(|l| in_other_lb(pool_id, l)) {
        return Ok(Added::OtherLb(other));
    }
    Ok(if add_pool(pools, pool_id) { Added::Changed } else { Added::Already })
}

/// The IP configuration to use: IPv4 → the only one or the primary; IPv6 → the first IPv6.
fn pick(
    n: usize,
    primary: impl Fn(usize) -> bool,
    is_v6: impl Fn(usize) -> bool,
    ipv6: bool,
) -> Option<usize> {
    if ipv6 {
        (0..n).find(|&i| is_v6(i))
    } else if n == 1 {
        Some(0)
    } else {
        (0..n).find(|&i| primary(i))
    }
}

/// Adds `pool_id` to a scale-set (or scale-set VM) network profile's primary NIC
/// configuration.
fn profile_add(
    profile: &mut Option<VmssNetworkProfile>,
    pool_id: &str,
    resource: &str,
) -> Result<Added, ArmError> {
    let ipv6 = is_ipv6_pool(pool_id);
    let nics = &mut profile
        .as_mut()
        .ok_or_else(|| no_ip_config(resource, ipv6))?
        .network_interface_configurations;
    let nic = if nics.len() == 1 {
        0
    } else {
        (0..nics.len())
            .find(|&i| nics[i].properties.primary == Some(true))
            .ok_or_else(|| no_ip_config(resource, ipv6))?
    };
    let configs = &mut nics[nic].properties.ip_configurations;
    let idx = pick(
        configs.len(),
        |i| configs[i].properties.primary == Some(true),
        |i| {
            configs[i]
                .properties
                .private_ip_address_version
                .as_deref()
                .is_some_and(|v| v.eq_ignore_ascii_case("IPv6"))
        },
        ipv6,
    )
    .ok_or_else(|| no_ip_config(resource, ipv6))?;
    add_to(&mut configs[idx].properties.load_balancer_backend_address_pools, pool_id)
}

/// Removes `pool_id` from every IP configuration of a network profile.
fn profile_remove(profile: &mut Option<VmssNetworkProfile>, pool_id: &str) -> bool {
    let mut changed = false;
    for nic in profile.iter_mut().flat_map(|p| p.network_interface_configurations.iter_mut()) {
        for c in &mut nic.properties.ip_configurations {
            changed |= remove_pool(&mut c.properties.load_balancer_backend_address_pools, pool_id);
        }
    }
    changed
}

/// Removes `pool_id` from every IP configuration of a NIC.
fn nic_remove(nic: &mut NetworkInterface, pool_id: &str) -> bool {
    let mut changed = false;
    for c in &mut nic.properties.ip_configurations {
        changed |= remove_pool(&mut c.properties.load_balancer_backend_address_pools, pool_id);
    }
    changed
}

/// One unit of NIC / scale-set VM work.
#[derive(Debug, Clone)]
enum Task {
    AddNic { nic: String, node: String },
    AddVmssVm { vm: String, node: String },
    Remove(Member),
}

impl Backends {
    /// Membership through `client`, for the cluster `config` describes.
    pub fn new(client: Arc<ArmClient>, config: Arc<Config>) -> Self {
        Backends {
            client,
            config,
            known: std::sync::Mutex::new(BTreeSet::new()),
            settled: std::sync::Mutex::new(BTreeMap::new()),
        }
    }

    fn settled(&self) -> std::sync::MutexGuard<'_, BTreeMap<(String, String, bool), Instant>> {
        // A panic elsewhere while holding the lock leaves a map that is still valid.
        self.settled.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Whether adding member `key` to `pool_id` (`removing`: taking it out) was found to need
    /// no more within the VM listing's TTL (never when caching is off).
    fn is_settled(&self, pool_id: &str, key: &str, removing: bool) -> bool {
        let ttl = self.client.cache_ttls().vm;
        if ttl.is_zero() {
            return false;
        }
        let k = (pool_id.to_ascii_lowercase(), key.to_ascii_lowercase(), removing);
        let mut settled = self.settled();
        match settled.get(&k) {
            Some(at) if at.elapsed() < ttl => true,
            Some(_) => {
                settled.remove(&k);
                false
            }
            None => false,
        }
    }

    /// Records what adding member `key` to `pool_id` did: no write (`true`: not read again
    /// within the TTL) or a write (`false`: forgotten). Either way a taking-out recorded
    /// before is forgotten (the member may leave again).
    fn settle(&self, pool_id: &str, key: &str, no_write: bool) {
        let (pool, key) = (pool_id.to_ascii_lowercase(), key.to_ascii_lowercase());
        let mut settled = self.settled();
        settled.remove(&(pool.clone(), key.clone(), true));
        let k = (pool, key, false);
        if no_write && !self.client.cache_ttls().vm.is_zero() {
            settled.insert(k, Instant::now());
        } else {
            settled.remove(&k);
        }
    }

    /// Records that member `key` is out of `pool_id` now (taken out, or found out): not read
    /// again to take it out within the TTL; an adding recorded before is forgotten.
    fn settle_out(&self, pool_id: &str, key: &str) {
        let (pool, key) = (pool_id.to_ascii_lowercase(), key.to_ascii_lowercase());
        let mut settled = self.settled();
        settled.remove(&(pool.clone(), key.clone(), false));
        if !self.client.cache_ttls().vm.is_zero() {
            settled.insert((pool, key, true), Instant::now());
        }
    }

    fn known(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        // A panic elsewhere while holding the lock leaves a set that is still valid.
        self.known.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Remembers `keys` as the cluster's Nodes' members.
    fn remember<'a>(&self, keys: impl IntoIterator<Item = &'a String>) {
        let mut known = self.known();
        for k in keys {
            known.insert(k.clone());
        }
    }

    /// `podIP` pools are not supported.
    fn check_pool_type(&self) -> Result<(), ProviderError> {
        match self.config.load_balancer_backend_pool_configuration_type {
            BackendPoolType::PodIp => Err(ProviderError::Invalid {
                what: "loadBalancerBackendPoolConfigurationType".into(),
                message: "podIP is not supported; use nodeIPConfiguration (the default) or nodeIP"
                    .into(),
            }),
            _ => Ok(()),
        }
    }

    /// `nodeIP` pools: the pool itself lists the nodes' private IPs of its family
    /// (`loadBalancerBackendAddresses`: name = node name, `-ipv6` appended for IPv6, the IP
    /// and the cluster's virtual network, as upstream), written through the load balancer
    /// (GET → change → PUT with `If-Match`). Addresses of nodes not in `nodes` are removed.
    async fn ensure_node_ips(&self, pool_id: &str, nodes: &[Node]) -> Result<(), ProviderError> {
        let (lb_id, name) = split_pool_id(pool_id).ok_or_else(|| ProviderError::Invalid {
            what: "backend pool ID".into(),
            message: format!("{pool_id:?} is not …/loadBalancers/<lb>/backendAddressPools/<pool>"),
        })?;
        let vnet = self.config.vnet_name.as_deref().filter(|v| !v.is_empty()).ok_or_else(|| {
            ProviderError::Invalid {
                what: "vnetName".into(),
                message: "loadBalancerBackendPoolConfigurationType nodeIP needs the cluster's virtual network".into(),
            }
        })?;
        let vnet_id = self.client.resource_id(
            self.config.vnet_resource_group(),
            "Microsoft.Network/virtualNetworks",
            vnet,
        )?;
        let ipv6 = is_ipv6_pool(pool_id);
        let mut desired: Vec<(String, String)> = Vec::new(); // (entry name, ip)
        for node in nodes {
            let node_name = node.metadata.name.clone().unwrap_or_default();
            let ip = node
                .status
                .as_ref()
                .and_then(|s| s.addresses.as_ref())
                .into_iter()
                .flatten()
                .filter(|a| a.type_ == "InternalIP")
                .filter_map(|a| a.address.parse::<std::net::IpAddr>().ok())
                .find(|a| a.is_ipv6() == ipv6);
            match ip {
                Some(ip) => desired.push((
                    if ipv6 { format!("{node_name}-ipv6") } else { node_name },
                    ip.to_string(),
                )),
                None => {
                    debug!(node = %node_name, ipv6, "node has no InternalIP of the pool's family; not in the pool")
                }
            }
        }
        let desired_keys: Vec<String> = desired.iter().map(|(_, ip)| format!("ip:{ip}")).collect();
        self.remember(&desired_keys);
        let known: BTreeSet<String> = self.known().clone();
        let mut kept_foreign = 0usize;
        let mut found = true;
        let w = read_modify_write(
            &self.client,
            ("network.load_balancers.get", "network.load_balancers.create_or_update"),
            lb_id,
            NETWORK,
            |lb: &mut LoadBalancer| {
                found = true;
                let Some(pool) = lb.properties.backend_address_pools.iter_mut().find(|p| {
                    p.id.as_deref().is_some_and(|id| id.eq_ignore_ascii_case(pool_id))
                        || p.name().eq_ignore_ascii_case(name)
                }) else {
                    found = false;
                    return Ok(false);
                };
                let current: Vec<serde_json::Value> = pool
                    .properties
                    .extra
                    .get("loadBalancerBackendAddresses")
                    .and_then(|v| v.as_array())
                    .cloned()
                    .unwrap_or_default();
                let ip_of = |v: &serde_json::Value| {
                    v["properties"]["ipAddress"].as_str().unwrap_or_default().to_string()
                };
                // Kept: the Nodes' addresses, and any address not provably a Node's (the
                // operator's own members of the shared pool).
                kept_foreign = 0;
                let mut next: Vec<serde_json::Value> = current
                    .iter()
                    .filter(|v| {
                        let ip = ip_of(v);
                        if desired.iter().any(|(_, d)| *d == ip) {
                            return true;
                        }
                        let foreign = !known.contains(&format!("ip:{ip}"));
                        kept_foreign += usize::from(foreign);
                        foreign
                    })
                    .cloned()
                    .collect();
                for (entry, ip) in &desired {
                    if !next.iter().any(|v| ip_of(v) == *ip) {
                        next.push(serde_json::json!({
                            "name": entry,
                            "properties": {"ipAddress": ip, "virtualNetwork": {"id": vnet_id}},
                        }));
                    }
                }
                if next == current {
                    return Ok(false);
                }
                pool.properties
                    .extra
                    .insert("loadBalancerBackendAddresses".into(), serde_json::Value::Array(next));
                Ok(true)
            },
        )
        .await
        .map_err(|e| arm_err(&format!("updating the addresses of backend pool {pool_id}"), e))?;
        if w == Written::Missing || !found {
            return Err(ProviderError::other(format!("backend pool {pool_id} does not exist")));
        }
        if w == Written::Yes {
            info!(pool = pool_id, nodes = desired.len(), "backend pool addresses updated");
        }
        if kept_foreign > 0 {
            debug!(
                pool = pool_id,
                addresses = kept_foreign,
                "addresses in the pool that are not known Nodes' left alone"
            );
        }
        Ok(())
    }

    /// The members of the pool now (from its `backendIPConfigurations`); `None` when the
    /// load balancer or the pool does not exist.
    async fn members(&self, pool_id: &str) -> Result<Option<Vec<Member>>, ProviderError> {
        let (lb_id, name) = split_pool_id(pool_id).ok_or_else(|| bad_pool_id(pool_id))?;
        let lb: Option<LoadBalancer> = self
            .client
            .get_opt("network.load_balancers.get", lb_id, NETWORK, &[])
            .await
            .map_err(|e| arm_err("reading the backend pool's load balancer", e))?;
        let Some(lb) = lb else { return Ok(None) };
        Ok(pool_members(&lb, pool_id, name))
    }

    /// The load balancer `lb_id` for the node sync (`UpdateLoadBalancer`), which writes
    /// nothing from it but NICs and scale-set VMs (each read afresh before its write): from
    /// the client's read cache within [`CacheTtls::load_balancer_view`] (120 s, upstream's
    /// load balancer cache; our writes of the load balancer, of NICs and of scale sets drop
    /// it), so the Services of a shared load balancer synced one after the other for one
    /// Node change read it once, not once each. `None` when ARM says it does not exist.
    ///
    /// [`CacheTtls::load_balancer_view`]: crate::client::CacheTtls::load_balancer_view
    pub async fn load_balancer(&self, lb_id: &str) -> Result<Option<LoadBalancer>, ProviderError> {
        let max_age = self.client.cache_ttls().load_balancer_view;
        self.client
            .get_opt_within("network.load_balancers.get", lb_id, NETWORK, max_age)
            .await
            .map_err(|e| arm_err("reading the backend pool's load balancer", e))
    }

    /// Makes the IP configurations of exactly `nodes` (of the pool's IP family) reference
    /// the backend pool `pool_id`: adds the missing ones, removes the ones of nodes not in
    /// `nodes`, and adds the pool to the scale-set models of the nodes' scale sets. Writes
    /// only what changes. Reads the pool's load balancer; [`Backends::ensure_members_in`]
    /// takes one the caller has just read.
    pub async fn ensure_members(&self, pool_id: &str, nodes: &[Node]) -> Result<(), ProviderError> {
        self.check_pool_type()?;
        if self.config.load_balancer_backend_pool_configuration_type == BackendPoolType::NodeIp {
            return self.ensure_node_ips(pool_id, nodes).await;
        }
        let current = self.members(pool_id).await?.ok_or_else(|| {
            ProviderError::other(format!("backend pool {pool_id} does not exist"))
        })?;
        self.ensure_nic_members(pool_id, current, nodes).await
    }

    /// [`Backends::ensure_members`] with the pool's members taken from `lb`, the pool's load
    /// balancer as the caller read it (no second read of it). Which members are added or
    /// removed is then decided on each NIC or scale-set VM read afresh before its write, so a
    /// `lb` older than a change made outside the cluster costs at most a read, never a wrong
    /// write. `nodeIP` pools are written through the load balancer: read afresh there.
    pub async fn ensure_members_in(
        &self,
        lb: &LoadBalancer,
        pool_id: &str,
        nodes: &[Node],
    ) -> Result<(), ProviderError> {
        self.check_pool_type()?;
        if self.config.load_balancer_backend_pool_configuration_type == BackendPoolType::NodeIp {
            return self.ensure_node_ips(pool_id, nodes).await;
        }
        let (_, name) = split_pool_id(pool_id).ok_or_else(|| bad_pool_id(pool_id))?;
        let current = pool_members(lb, pool_id, name).ok_or_else(|| {
            ProviderError::other(format!("backend pool {pool_id} does not exist"))
        })?;
        self.ensure_nic_members(pool_id, current, nodes).await
    }

    /// The members of `pool_id` follow `nodes`, from its `current` members.
    async fn ensure_nic_members(
        &self,
        pool_id: &str,
        current: Vec<Member>,
        nodes: &[Node],
    ) -> Result<(), ProviderError> {
        let current_keys: BTreeSet<String> = current.iter().map(Member::key).collect();

        // The nodes' VMs.
        let mut vms: Vec<(String, String, String, String)> = Vec::new(); // sub, rg, vm name, node
        let mut scale_set_vms: Vec<(String, String)> = Vec::new(); // vm id, node
        let mut scale_sets: BTreeMap<String, String> = BTreeMap::new(); // lower id → id
        let mut node_scale_sets: BTreeSet<String> = BTreeSet::new(); // lower ids
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let Some(pid) = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) else {
                debug!(node = %name, "node has no providerID; not in the backend pool");
                continue;
            };
            match VmRef::parse(pid) {
                Ok(VmRef::Vm { subscription, resource_group, name: vm }) => {
                    vms.push((subscription, resource_group, vm, name));
                }
                Ok(r @ VmRef::ScaleSetVm { .. }) => {
                    let vm_id = r.arm_id();
                    if let Some(at) = vm_id.to_ascii_lowercase().rfind("/virtualmachines/") {
                        node_scale_sets.insert(vm_id[..at].to_ascii_lowercase());
                    }
                    if let VmRef::ScaleSetVm { resource_group, .. } = &r
                        && resource_group.eq_ignore_ascii_case(self.config.resource_group())
                        && let Some(at) = vm_id.to_ascii_lowercase().rfind("/virtualmachines/")
                    {
                        let ss = vm_id[..at].to_string();
                        scale_sets.insert(ss.to_ascii_lowercase(), ss);
                    }
                    scale_set_vms.push((vm_id, name));
                }
                Err(e) => debug!(node = %name, "{e}; not in the backend pool"),
            }
        }
        let nics = self.primary_nics(&vms).await?;

        let mut desired: BTreeSet<String> = BTreeSet::new();
        let mut tasks = Vec::new();
        for (nic, node, flex) in nics {
            // A flexible scale set's VM: its scale set's model lists the pool too (only
            // scale sets of the config's resource group, as upstream).
            if let Some(ss) = flex
                && resource_group_of(&ss)
                    .is_some_and(|rg| rg.eq_ignore_ascii_case(self.config.resource_group()))
            {
                scale_sets.insert(ss.to_ascii_lowercase(), ss);
            }
            let key = nic.to_ascii_lowercase();
            if desired.insert(key.clone())
                && !current_keys.contains(&key)
                && !self.is_settled(pool_id, &key, false)
            {
                tasks.push(Task::AddNic { nic, node });
            }
        }
        for (vm, node) in scale_set_vms {
            let key = vm.to_ascii_lowercase();
            if desired.insert(key.clone())
                && !current_keys.contains(&key)
                && !self.is_settled(pool_id, &key, false)
            {
                tasks.push(Task::AddVmssVm { vm, node });
            }
        }
        // Out: only members provably a Node's (one this process saw as a Node's, or an
        // instance of a scale set whose instances are the cluster's Nodes). Anything else in
        // the shared pool is the operator's and stays.
        self.remember(&desired);
        let known: BTreeSet<String> = self.known().clone();
        for m in current {
            let key = m.key();
            if desired.contains(&key) {
                continue;
            }
            let of_node_scale_set = matches!(&m, Member::ScaleSetVm(_))
                && key
                    .rfind("/virtualmachines/")
                    .is_some_and(|at| node_scale_sets.contains(&key[..at]));
            if (known.contains(&key) || of_node_scale_set) && !self.is_settled(pool_id, &key, true)
            {
                tasks.push(Task::Remove(m));
            } else {
                debug!(pool = pool_id, member = %key, "not a known Node's; left in the pool");
            }
        }

        // The scale-set models first (upstream's order), then the instances.
        for ss in scale_sets.values() {
            self.model_add(ss, pool_id).await?;
        }
        self.run(pool_id, tasks).await
    }

    /// Takes the backend pool `pool_id` out of every NIC, scale-set VM and scale-set model
    /// that references it, so the pool (or its load balancer) can be deleted. `Ok` when the
    /// load balancer or the pool is already gone.
    pub async fn remove_all_members(&self, pool_id: &str) -> Result<(), ProviderError> {
        let Some(current) = self.members(pool_id).await? else {
            return Ok(());
        };
        let mut scale_sets: BTreeMap<String, String> = BTreeMap::new();
        for m in &current {
            if let Member::ScaleSetVm(vm) = m
                && let Some(at) = vm.to_ascii_lowercase().rfind("/virtualmachines/")
            {
                let ss = vm[..at].to_string();
                scale_sets.insert(ss.to_ascii_lowercase(), ss);
            }
        }
        {
            // Scale sets with no instance in the pool may still list it in their model:
            // uniform and flexible ones alike, whatever `vmType` says.
            let rg = self.config.resource_group();
            let collection = self
                .client
                .collection_id(rg, "Microsoft.Compute/virtualMachineScaleSets")
                .map_err(|e| arm_err("listing the scale sets", e))?;
            let all: Vec<VirtualMachineScaleSet> = self
                .client
                .list("compute.virtual_machine_scale_sets.list", &collection, COMPUTE, &[])
                .await
                .map_err(|e| arm_err("listing the scale sets", e))?;
            for ss in all {
                let refs = ss
                    .properties
                    .virtual_machine_profile
                    .as_ref()
                    .and_then(|p| p.network_profile.as_ref())
                    .is_some_and(|p| profile_lists(p, pool_id));
                if refs && let Some(id) = ss.id {
                    scale_sets.insert(id.to_ascii_lowercase(), id);
                }
            }
        }
        self.run(pool_id, current.into_iter().map(Task::Remove).collect()).await?;
        for ss in scale_sets.values() {
            self.model_remove(ss, pool_id).await?;
        }
        Ok(())
    }

    /// The primary NIC of each VM (`(sub, rg, vm, node)`) and the flexible scale set the VM
    /// belongs to, if any: `(nic, node, scale set)`, from one VM list per resource group. VMs
    /// not in the list are skipped (they do not exist).
    async fn primary_nics(
        &self,
        vms: &[(String, String, String, String)],
    ) -> Result<Vec<(String, String, Option<String>)>, ProviderError> {
        let mut groups: BTreeMap<(String, String), String> = BTreeMap::new();
        for (sub, rg, _, _) in vms {
            if !sub.eq_ignore_ascii_case(self.client.subscription_id()) {
                // Another subscription's VM is not this cluster's to put in its pool.
                continue;
            }
            match self.client.collection_id(rg, "Microsoft.Compute/virtualMachines") {
                Ok(c) => {
                    groups.entry((sub.to_ascii_lowercase(), rg.to_ascii_lowercase())).or_insert(c);
                }
                // A providerID naming no valid resource group: that node only is left out.
                Err(e) => warn!(error = %e, "a node's providerID names no valid resource group"),
            }
        }
        let mut by_name: BTreeMap<(String, String, String), (String, Option<String>)> =
            BTreeMap::new();
        for ((sub, rg), collection) in groups {
            let list: Vec<VirtualMachine> = self
                .client
                .list("compute.virtual_machines.list", &collection, COMPUTE, &[])
                .await
                .map_err(|e| arm_err("listing the nodes' VMs", e))?;
            for vm in list {
                let Some(profile) = vm.properties.network_profile.as_ref() else { continue };
                let nics = &profile.network_interfaces;
                let primary = if nics.len() == 1 {
                    nics.first()
                } else {
                    nics.iter()
                        .find(|n| n.properties.as_ref().and_then(|p| p.primary) == Some(true))
                };
                if let Some(nic) = primary {
                    let flex = vm
                        .properties
                        .virtual_machine_scale_set
                        .as_ref()
                        .map(|r| r.id.clone())
                        .filter(|id| !id.is_empty());
                    by_name.insert(
                        (sub.clone(), rg.clone(), vm.name().to_ascii_lowercase()),
                        (nic.id.clone(), flex),
                    );
                }
            }
        }
        let mut out = Vec::new();
        for (sub, rg, vm, node) in vms {
            let key = (sub.to_ascii_lowercase(), rg.to_ascii_lowercase(), vm.to_ascii_lowercase());
            match by_name.get(&key) {
                Some((nic, flex)) => out.push((nic.clone(), node.clone(), flex.clone())),
                None => {
                    info!(node = %node, vm = %vm, "VM not found (or has no NIC); not added to the backend pool")
                }
            }
        }
        Ok(out)
    }

    /// Runs the NIC / scale-set VM tasks, [`CONCURRENCY`] at a time; every task runs, the
    /// first error is returned.
    async fn run(&self, pool_id: &str, tasks: Vec<Task>) -> Result<(), ProviderError> {
        if tasks.is_empty() {
            return Ok(());
        }
        debug!(pool = pool_id, tasks = tasks.len(), "updating backend pool membership");
        let results: Vec<Result<(), ProviderError>> = stream::iter(tasks)
            .map(|t| self.one(pool_id, t))
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let mut errors = results.into_iter().filter_map(Result::err);
        match errors.next() {
            None => Ok(()),
            Some(first) => {
                let more = errors.count();
                if more > 0 {
                    warn!(pool = pool_id, more, "more backend pool updates failed");
                }
                Err(first)
            }
        }
    }

    async fn one(&self, pool_id: &str, task: Task) -> Result<(), ProviderError> {
        let client = &*self.client;
        match task {
            Task::AddNic { nic, node } => {
                let mut skipped = None;
                let w = read_modify_write(
                    client,
                    (
                        "network.network_interfaces.get",
                        "network.network_interfaces.create_or_update",
                    ),
                    &nic,
                    NETWORK,
                    |n: &mut NetworkInterface| Ok(nic_add(n, pool_id)?.changed(&mut skipped)),
                )
                .await
                .map_err(|e| {
                    arm_err(&format!("adding node {node} to backend pool {pool_id}"), e)
                })?;
                self.settle(pool_id, &nic, w != Written::Yes);
                log_add(&node, w, skipped);
            }
            Task::AddVmssVm { vm, node } => {
                let mut skipped = None;
                let w = read_modify_write(
                    client,
                    (
                        "compute.virtual_machine_scale_set_vms.get",
                        "compute.virtual_machine_scale_set_vms.update",
                    ),
                    &vm,
                    COMPUTE,
                    |v: &mut VirtualMachineScaleSetVm| {
                        // A scale-set VM being deleted takes no update (upstream skips it).
                        if being_deleted(v) {
                            return Ok(false);
                        }
                        let id = v.id.clone().unwrap_or_default();
                        Ok(profile_add(
                            &mut v.properties.network_profile_configuration,
                            pool_id,
                            &id,
                        )?
                        .changed(&mut skipped))
                    },
                )
                .await
                .map_err(|e| {
                    arm_err(&format!("adding node {node} to backend pool {pool_id}"), e)
                })?;
                self.settle(pool_id, &vm, w != Written::Yes);
                log_add(&node, w, skipped);
            }
            Task::Remove(Member::Nic(nic)) => {
                let w = read_modify_write(
                    client,
                    (
                        "network.network_interfaces.get",
                        "network.network_interfaces.create_or_update",
                    ),
                    &nic,
                    NETWORK,
                    |n: &mut NetworkInterface| Ok(nic_remove(n, pool_id)),
                )
                .await
                .map_err(|e| {
                    arm_err(&format!("removing NIC {nic} from backend pool {pool_id}"), e)
                })?;
                self.settle_out(pool_id, &nic);
                if w == Written::Yes {
                    info!(nic = %nic, pool = pool_id, "removed from backend pool");
                }
            }
            Task::Remove(Member::ScaleSetVm(vm)) => {
                let w = read_modify_write(
                    client,
                    (
                        "compute.virtual_machine_scale_set_vms.get",
                        "compute.virtual_machine_scale_set_vms.update",
                    ),
                    &vm,
                    COMPUTE,
                    |v: &mut VirtualMachineScaleSetVm| {
                        if being_deleted(v) {
                            return Ok(false);
                        }
                        Ok(profile_remove(&mut v.properties.network_profile_configuration, pool_id))
                    },
                )
                .await
                .map_err(|e| {
                    arm_err(&format!("removing scale-set VM {vm} from backend pool {pool_id}"), e)
                })?;
                self.settle_out(pool_id, &vm);
                if w == Written::Yes {
                    info!(vm = %vm, pool = pool_id, "removed from backend pool");
                }
            }
        }
        Ok(())
    }

    /// Adds the pool to a scale set's model (upstream's `ensureVMSSInPool`).
    async fn model_add(&self, ss: &str, pool_id: &str) -> Result<(), ProviderError> {
        let mut skipped = None;
        let w = read_modify_write(
            &self.client,
            (
                "compute.virtual_machine_scale_sets.get",
                "compute.virtual_machine_scale_sets.create_or_update",
            ),
            ss,
            COMPUTE,
            |s: &mut VirtualMachineScaleSet| {
                if s.properties
                    .provisioning_state
                    .as_deref()
                    .is_some_and(|p| p.eq_ignore_ascii_case("Deleting"))
                {
                    return Ok(false);
                }
                // No model to give new instances (a flexible scale set of VMs attached by
                // hand): nothing to do, as upstream.
                let Some(profile) = s.properties.virtual_machine_profile.as_mut() else {
                    return Ok(false);
                };
                if profile
                    .network_profile
                    .as_ref()
                    .is_none_or(|p| p.network_interface_configurations.is_empty())
                {
                    return Ok(false);
                }
                Ok(profile_add(&mut profile.network_profile, pool_id, ss)?.changed(&mut skipped))
            },
        )
        .await
        .map_err(|e| arm_err(&format!("adding backend pool {pool_id} to scale set {ss}"), e))?;
        match (w, skipped) {
            (_, Some(lb)) => {
                info!(scale_set = ss, other = %lb, "scale set is in another load balancer's pool; model left alone");
            }
            (Written::Yes, _) => {
                info!(scale_set = ss, pool = pool_id, "backend pool added to the scale-set model")
            }
            (Written::Missing, _) => debug!(scale_set = ss, "scale set not found"),
            _ => {}
        }
        Ok(())
    }

    /// Removes the pool from a scale set's model.
    async fn model_remove(&self, ss: &str, pool_id: &str) -> Result<(), ProviderError> {
        let w = read_modify_write(
            &self.client,
            (
                "compute.virtual_machine_scale_sets.get",
                "compute.virtual_machine_scale_sets.create_or_update",
            ),
            ss,
            COMPUTE,
            |s: &mut VirtualMachineScaleSet| {
                // A scale set being deleted takes no update (upstream skips it).
                if s.properties
                    .provisioning_state
                    .as_deref()
                    .is_some_and(|p| p.eq_ignore_ascii_case("Deleting"))
                {
                    return Ok(false);
                }
                Ok(s.properties
                    .virtual_machine_profile
                    .as_mut()
                    .is_some_and(|p| profile_remove(&mut p.network_profile, pool_id)))
            },
        )
        .await
        .map_err(|e| arm_err(&format!("removing backend pool {pool_id} from scale set {ss}"), e))?;
        if w == Written::Yes {
            info!(scale_set = ss, pool = pool_id, "backend pool removed from the scale-set model");
        }
        Ok(())
    }
}

fn profile_lists(p: &VmssNetworkProfile, pool_id: &str) -> bool {
    p.network_interface_configurations.iter().any(|n| {
        n.properties.ip_configurations.iter().any(|c| {
            c.properties.load_balancer_backend_address_pools.iter().flatten().any(|r| r.is(pool_id))
        })
    })
}

fn log_add(node: &str, w: Written, skipped: Option<String>) {
    match (w, skipped) {
        (_, Some(lb)) => info!(
            node,
            other = %lb,
            "node's IP configuration is in another load balancer's pool; not added"
        ),
        (Written::Yes, _) => info!(node, "added to the backend pool"),
        (Written::Missing, _) => {
            info!(node, "node's VM or NIC not found; not added to the backend pool")
        }
        (Written::Unchanged, _) => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::models::{InterfaceIpProperties, SubResource};

    const POOL: &str = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/kubernetes/backendAddressPools/kubernetes";
    const POOL6: &str = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/kubernetes/backendAddressPools/kubernetes-IPv6";

    #[test]
    fn members_are_nics_or_scale_set_vms() {
        assert_eq!(
            Member::of_ip_configuration(
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/vm-0-nic/ipConfigurations/ipconfig1"
            ),
            Some(Member::Nic(
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/vm-0-nic".into()
            ))
        );
        assert_eq!(
            Member::of_ip_configuration(
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/pool/virtualMachines/2/networkInterfaces/pool/ipConfigurations/ipconfig1"
            ),
            Some(Member::ScaleSetVm(
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/pool/virtualMachines/2".into()
            ))
        );
        assert_eq!(Member::of_ip_configuration("/subscriptions/s/whatever"), None);
    }

    #[test]
    fn the_resource_group_of_an_id() {
        assert_eq!(
            resource_group_of(
                "/subscriptions/s/resourceGroups/MC_rg/providers/Microsoft.Compute/virtualMachineScaleSets/flex"
            ),
            Some("MC_rg")
        );
        assert_eq!(resource_group_of("/subscriptions/s/resourceGroups/"), None);
        assert_eq!(resource_group_of("flex"), None);
    }

    #[test]
    fn pool_ids_split_and_ipv6_pools_are_named_so() {
        let (lb, name) = split_pool_id(POOL).unwrap();
        assert!(lb.ends_with("/loadBalancers/kubernetes"));
        assert_eq!(name, "kubernetes");
        assert!(split_pool_id("/subscriptions/s/x/backendAddressPools/").is_none());
        assert!(is_ipv6_pool(POOL6));
        assert!(!is_ipv6_pool(POOL));
    }

    #[test]
    fn an_ip_configuration_in_another_clusters_lb_is_left_alone() {
        let internal =
            POOL.replace("loadBalancers/kubernetes/", "loadBalancers/kubernetes-internal/");
        assert_eq!(in_other_lb(POOL, &[Ref::to(internal)]), None);
        let other = POOL.replace("loadBalancers/kubernetes/", "loadBalancers/other/");
        assert_eq!(in_other_lb(POOL, &[Ref::to(other)]).as_deref(), Some("other"));
    }

    fn ipc(name: &str, primary: bool, v6: bool) -> SubResource<InterfaceIpProperties> {
        SubResource {
            name: Some(name.into()),
            properties: InterfaceIpProperties {
                primary: Some(primary),
                private_ip_address_version: Some(if v6 { "IPv6" } else { "IPv4" }.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn the_pool_goes_on_the_ip_configuration_of_its_family_once() {
        let mut nic = NetworkInterface::default();
        nic.properties.ip_configurations = vec![
            ipc("secondary", false, false),
            ipc("ipconfig1", true, false),
            ipc("v6", false, true),
        ];
        assert!(matches!(nic_add(&mut nic, POOL).unwrap(), Added::Changed));
        assert!(matches!(nic_add(&mut nic, POOL).unwrap(), Added::Already));
        assert!(matches!(nic_add(&mut nic, POOL6).unwrap(), Added::Changed));
        let pools = |nic: &NetworkInterface, i: usize| {
            nic.properties.ip_configurations[i]
                .properties
                .load_balancer_backend_address_pools
                .clone()
                .unwrap_or_default()
        };
        assert!(pools(&nic, 0).is_empty());
        assert_eq!(pools(&nic, 1), vec![Ref::to(POOL)]);
        assert_eq!(pools(&nic, 2), vec![Ref::to(POOL6)]);
        assert!(nic_remove(&mut nic, POOL));
        assert!(!nic_remove(&mut nic, POOL));
        assert_eq!(pools(&nic, 2), vec![Ref::to(POOL6)]);

        let mut v4_only = NetworkInterface::default();
        v4_only.properties.ip_configurations = vec![ipc("ipconfig1", true, false)];
        assert!(nic_add(&mut v4_only, POOL6).is_err());
    }
}
