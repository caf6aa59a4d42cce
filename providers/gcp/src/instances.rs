//! InstancesV2, NodeCidrs and Zones: the Compute instances behind Nodes, as upstream
//! (`providers/gce/gce_instances.go`, `gce_zones.go`, and the cloud CIDR allocator of
//! `pkg/controller/nodeipam`), answered in batches.
//!
//! - **providerID**: `gce://<project>/<zone>/<instance>` (upstream's
//!   `^gce://([^/]+)/([^/]+)/([^/]+)$`). The project must be the cluster's (upstream's default:
//!   without its GKE multi-project mode it looks the instance up in the cluster's project
//!   whatever the providerID says, which could call another project's instance "gone"; here
//!   such a providerID is an error).
//! - **Lookup**: the providerID's zone and name, else the node name up to its first `.`
//!   (upstream's `canonicalizeInstanceName`) searched across the managed zones
//!   ([`Scope::zones`]) in order; the first zone holding it wins.
//! - **Addresses** (upstream's `nodeAddressesFromInstance`): per network interface its
//!   `networkIP` → `InternalIP`, each access config's `natIP` → `ExternalIP`, its IPv6 address
//!   (`ipv6Address`, else for `ipv6AccessType: EXTERNAL` the external IPv6 of its IPv6 access
//!   configs) → `InternalIP`; then the addresses of the preferred family first: IPv6 for
//!   `stack-type = IPV6`, IPv4 otherwise. An instance without network interfaces is an error.
//! - **Zone** = the instance's zone, **region** = the zone without its last `-x`
//!   (`GetGCERegion`), **instance type** = the last path segment of `machineType`.
//! - **Shutdown** (upstream: not implemented, so upstream never taints): `TERMINATED`,
//!   `STOPPED` and `SUSPENDED` instances are shut down, as every other provider reports a
//!   stopped machine; the taint only lands on NotReady Nodes and goes when they are Ready.
//! - **Pod CIDRs** ([`NodeCidrs`], the cloud CIDR allocator): the first alias IP range of the
//!   instance's `nic0` (else its first interface) and the `/112` holding that interface's IPv6
//!   address, every family the instance has. Which of them a Node gets, and in which order,
//!   is the node-IPAM controller's choice from the service CIDRs, as upstream's allocator
//!   chooses by cluster stack (`stack-type` does not enter into it, as upstream).
//!
//! **Batches**: a batch of more than [`SMALL_BATCH`] nodes costs one paged `instances.list`
//! ([`PAGE_SIZE`] per page) per zone it needs (the managed zones, plus the zones of
//! providerIDs outside them), run concurrently, whatever the number of nodes; with
//! `node-instance-prefix` set (and every node's instance name starting with it) the listing is
//! filtered by `name eq "<prefix>.*"` as upstream. Smaller batches use upstream's
//! `instances.get` per node. Batches share the zone listings: one fetch at a time per zone
//! and filter, reused for [`LISTING_TTL`] (or as long as it took), fetched again when they
//! lack a Node's instance ([`ccm_core::listing`]); a listing outlives a batch's deadline.
//!
//! **Deletion safety** ([`InstancesV2`]): a node is `NotFound` only when `instances.get` of the
//! exact project/zone/name of its providerID answers 404 naming that instance (not a 404 for
//! the project or the zone, not a 404 that is not Compute's). An instance missing from a
//! complete listing is asked for by name before anything is concluded; a zone whose listing
//! failed (an outage, throttling, a bad page) answers every node in it with an error. A node
//! without providerID whose name matches no instance is an error (never "gone"); for metadata
//! it is [`ProviderError::InstanceNotFound`] ("not yet").

use std::collections::HashMap;
use std::net::{IpAddr, Ipv6Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ccm_core::cloud::{
    InstanceMetadata, InstanceStatus, InstancesV2, NodeCidrs, ProviderError, Zone, Zones,
};
use google_cloud_compute_v1::model::{AccessConfig, AliasIpRange, Instance, NetworkInterface};
use ipnet::{IpNet, Ipv6Net};
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use ccm_core::listing::{Fetched, Listings, Wanted};

use crate::client::{GceClient, GceError, Scope, last_segment};
use crate::config::StackType;

/// The scheme of GCE providerIDs.
pub const PROVIDER_ID_SCHEME: &str = "gce://";
/// Instances per page of `instances.list` (Compute's largest).
pub const PAGE_SIZE: u32 = 500;
/// Batches of at most this many nodes use upstream's per-node `instances.get`; larger ones
/// list the zones.
pub const SMALL_BATCH: usize = 2;
/// How long a batch's zone listings answer later batches (at least; a listing is reused for
/// as long as it took to fetch when that is longer). A Node they lack gets fresh ones.
pub const LISTING_TTL: Duration = Duration::from_secs(5);
/// The prefix length of the IPv6 pod range upstream carves from a node's IPv6 address.
pub const IPV6_POD_PREFIX: u8 = 112;

/// Where the instance behind a Node is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InstanceKey {
    /// The exact instance, from the Node's providerID.
    Exact {
        /// The project.
        project: String,
        /// The zone.
        zone: String,
        /// The instance name.
        name: String,
    },
    /// An instance name (the node name up to its first `.`), searched in the managed zones.
    Name(String),
}

impl InstanceKey {
    fn name(&self) -> &str {
        match self {
            InstanceKey::Exact { name, .. } | InstanceKey::Name(name) => name,
        }
    }
}

/// `(project, zone, instance)` of a providerID, as upstream's `splitProviderID`; anything else
/// is an error naming the value.
pub fn parse_provider_id(provider_id: &str) -> Result<(String, String, String), ProviderError> {
    let invalid = || ProviderError::Invalid {
        what: format!("providerID {provider_id:?}"),
        message: "does not match the expected format \"gce://<project>/<zone>/<instance>\"".into(),
    };
    let rest = provider_id.strip_prefix(PROVIDER_ID_SCHEME).ok_or_else(invalid)?;
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [p, z, n] if !p.is_empty() && !z.is_empty() && !n.is_empty() => {
            Ok((p.to_string(), z.to_string(), n.to_string()))
        }
        _ => Err(invalid()),
    }
}

/// `gce://<project>/<zone>/<instance>`.
pub fn provider_id(project: &str, zone: &str, name: &str) -> String {
    format!("{PROVIDER_ID_SCHEME}{project}/{zone}/{name}")
}

/// The instance name of a node name: up to the first `.` (upstream's
/// `canonicalizeInstanceName`: `node-2.c.my-proj.internal` → `node-2`).
pub fn instance_name(node_name: &str) -> &str {
    node_name.split('.').next().unwrap_or(node_name)
}

/// The region of a zone (upstream's `GetGCERegion`): an error for a zone without `-`.
pub fn region_of(zone: &str) -> Result<&str, ProviderError> {
    match zone.rsplit_once('-') {
        Some((region, _)) if !region.is_empty() => Ok(region),
        _ => Err(ProviderError::other(format!("unexpected zone: {zone:?}"))),
    }
}

/// A value quoted for a Compute filter regular expression (RE2; Go's `regexp.QuoteMeta`).
pub fn quote_regex(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// The IPv6 address of an interface (upstream's `getIPV6AddressFromInterface`): its
/// `ipv6Address`, else for external IPv6 access the last IPv6 access config's `externalIpv6`.
pub fn interface_ipv6(nic: &NetworkInterface) -> Option<&str> {
    if let Some(a) = nic.ipv_6_address.as_deref().filter(|a| !a.is_empty()) {
        return Some(a);
    }
    let external = nic.ipv_6_access_type.as_ref().and_then(|t| t.name()) == Some("EXTERNAL");
    if !external {
        return None;
    }
    nic.ipv_6_access_configs
        .iter()
        .filter_map(|c| c.external_ipv_6.as_deref().filter(|a| !a.is_empty()))
        .next_back()
}

/// The node addresses of an instance, as upstream's `nodeAddressesFromInstance` and
/// `orderAddresses`. Access configs without a `natIP` (one still being assigned) are skipped
/// (upstream adds an empty `ExternalIP`).
pub fn node_addresses(
    instance: &Instance,
    stack: StackType,
) -> Result<Vec<NodeAddress>, ProviderError> {
    if instance.network_interfaces.is_empty() {
        return Err(ProviderError::other(format!(
            "instance {} has no network interfaces",
            instance.name.as_deref().unwrap_or_default()
        )));
    }
    let addr = |t: &str, a: &str| NodeAddress { type_: t.into(), address: a.into() };
    let mut all = Vec::new();
    for nic in &instance.network_interfaces {
        if let Some(ip) = nic.network_ip.as_deref().filter(|a| !a.is_empty()) {
            all.push(addr("InternalIP", ip));
        }
        for ac in &nic.access_configs {
            if let Some(ip) = ac.nat_ip.as_deref().filter(|a| !a.is_empty()) {
                all.push(addr("ExternalIP", ip));
            }
        }
        if let Some(ip) = interface_ipv6(nic) {
            all.push(addr("InternalIP", ip));
        }
    }
    let prefer_v6 = stack == StackType::Ipv6;
    let is_v6 = |a: &NodeAddress| matches!(a.address.parse::<IpAddr>(), Ok(IpAddr::V6(_)));
    let (mut first, second): (Vec<_>, Vec<_>) = all.into_iter().partition(|a| {
        // Not an IP (never from Compute): kept with the preferred family, as upstream.
        a.address.parse::<IpAddr>().is_err() || is_v6(a) == prefer_v6
    });
    first.extend(second);
    Ok(first)
}

/// Whether an instance is shut down: `TERMINATED` (stopped), `STOPPED` or `SUSPENDED`.
pub fn is_shut_down(instance: &Instance) -> bool {
    matches!(
        instance.status.as_ref().and_then(|s| s.name()),
        Some("TERMINATED" | "STOPPED" | "SUSPENDED")
    )
}

fn status_of(instance: &Instance) -> InstanceStatus {
    if is_shut_down(instance) { InstanceStatus::Shutdown } else { InstanceStatus::Running }
}

/// The pod CIDRs of an instance (upstream's cloud CIDR allocator reads them so): the first
/// alias IP range of `nic0` (else the first interface), and the `/112` holding that
/// interface's IPv6 address (internal `ipv6Address`, else the external IPv6 of its IPv6 access
/// config). Every family the instance has, IPv4 first; empty when it has neither. The
/// node-IPAM controller keeps the families of the cluster's service CIDRs, in their order.
pub fn pod_cidrs(instance: &Instance) -> Result<Vec<IpNet>, ProviderError> {
    let name = instance.name.as_deref().unwrap_or_default();
    let nics = &instance.network_interfaces;
    let Some(nic) = nics.iter().find(|n| n.name.as_deref() == Some("nic0")).or(nics.first()) else {
        return Ok(vec![]);
    };
    let mut out = Vec::with_capacity(2);
    if let Some(r) = nic.alias_ip_ranges.first().and_then(|r| r.ip_cidr_range.as_deref()) {
        out.push(r.parse::<IpNet>().map_err(|_| {
            ProviderError::other(format!("instance {name}: alias IP range {r:?} is not a CIDR"))
        })?);
    }
    if let Some(a) = interface_ipv6(nic) {
        let ip: Ipv6Addr = a.parse().map_err(|_| {
            ProviderError::other(format!("instance {name}: IPv6 address {a:?} is not valid"))
        })?;
        if let Ok(n) = Ipv6Net::new(ip, IPV6_POD_PREFIX) {
            out.push(IpNet::V6(n.trunc()));
        }
    }
    Ok(out)
}

/// Whether a Compute error is "no such instance" for exactly this instance: a 404 with
/// Compute's typed reason `notFound` (read from its JSON error body) whose message names it
/// (`The resource 'projects/p/zones/z/instances/n' was not found`). Any other 404 is an error
/// like any other: Compute's for a missing project or zone (also `notFound`), a proxy's page,
/// a wrong endpoint, a 404 without Compute's reason.
pub fn is_instance_not_found(e: &GceError, zone: &str, name: &str) -> bool {
    match e {
        GceError::Api { status: 404, reason, message, .. } if reason == "notFound" => {
            message.contains(&format!("/zones/{zone}/instances/{name}'"))
        }
        _ => false,
    }
}

/// `instances.get` of one instance; `Ok(None)` only when Compute says it does not exist.
pub async fn get_instance(
    client: &GceClient,
    project: &str,
    zone: &str,
    name: &str,
) -> Result<Option<Instance>, GceError> {
    let c = client.compute().await?;
    let got = client
        .call_in("compute.instances.get", Some(zone), || {
            c.instances.get().set_project(project).set_zone(zone).set_instance(name).send()
        })
        .await;
    match got {
        Ok(i) => Ok(Some(i)),
        Err(e) if is_instance_not_found(&e, zone, name) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Every instance of a zone (optionally filtered): one paged `instances.list`.
pub async fn list_instances(
    client: &GceClient,
    project: &str,
    zone: &str,
    filter: Option<&str>,
) -> Result<Vec<Instance>, GceError> {
    list_instances_map(client, project, zone, filter, Some).await
}

/// [`list_instances`], keeping of each instance what `keep` makes of it, page by page.
async fn list_instances_map<T>(
    client: &GceClient,
    project: &str,
    zone: &str,
    filter: Option<&str>,
    keep: impl FnMut(Instance) -> Option<T>,
) -> Result<Vec<T>, GceError> {
    let c = client.compute().await?;
    client
        .list_all_map(
            "compute.instances.list",
            Some(zone),
            |token| {
                let b = c
                    .instances
                    .list()
                    .set_project(project)
                    .set_zone(zone)
                    .set_max_results(PAGE_SIZE)
                    .set_or_clear_page_token(token);
                match filter {
                    Some(f) => b.set_filter(f).send(),
                    None => b.send(),
                }
            },
            keep,
        )
        .await
}

/// The first instance named `name` in `zones` (in order), by `instances.get` per zone as
/// upstream's `getInstanceByName`: `Ok(None)` when every zone says it has none.
pub async fn find_by_name(
    client: &GceClient,
    project: &str,
    zones: &[String],
    name: &str,
) -> Result<Option<Instance>, GceError> {
    for zone in zones {
        if let Some(i) = get_instance(client, project, zone, name).await? {
            return Ok(Some(i));
        }
    }
    Ok(None)
}

/// The `name` filter of a listing: upstream's `name eq "<prefix>.*"` when
/// `node-instance-prefix` is set and every name looked for starts with it.
pub fn prefix_filter<'a>(
    prefix: Option<&str>,
    mut names: impl Iterator<Item = &'a str>,
) -> Option<String> {
    let p = prefix.filter(|p| !p.is_empty())?;
    if names.all(|n| n.starts_with(p)) {
        Some(format!("name eq \"{}.*\"", quote_regex(p)))
    } else {
        tracing::warn!(
            prefix = p,
            "GCE: a node's instance does not start with node-instance-prefix; listing without the filter"
        );
        None
    }
}

/// One error for every node of a batch whose zone listing failed.
fn shared_error(context: &str, e: &GceError) -> ProviderError {
    let message = format!("{context}: {e}");
    if e.is_throttled() { ProviderError::Throttled(message) } else { ProviderError::other(message) }
}

/// The zone listings of a batch: instance name → instance, or why the zone could not be
/// listed.
type Listing = HashMap<String, Result<Arc<Fetched<ZoneListing>>, Arc<GceError>>>;

/// One zone's instances by name.
type ZoneListing = HashMap<String, Listed>;

/// What a lookup reads of a listed instance. A zone's listing is held for [`LISTING_TTL`] and
/// has thousands of instances; Compute's `Instance` model is kilobytes each even when mostly
/// empty (at 5000 Nodes the listings held as models were a third of the heap, #35). A lookup
/// that finds one gets an `Instance` rebuilt with these fields ([`Listed::instance`]).
#[derive(Debug, Clone)]
struct Listed {
    zone: Option<String>,
    machine_type: Option<String>,
    status: Option<google_cloud_compute_v1::model::instance::Status>,
    network_interfaces: Vec<NetworkInterface>,
}

impl Listed {
    /// The instance's name and what a lookup reads of it (`None`: an instance without name,
    /// which no lookup can name).
    fn of(i: Instance) -> Option<(String, Listed)> {
        let name = i.name?;
        let network_interfaces = i.network_interfaces.into_iter().map(lookup_fields).collect();
        Some((
            name,
            Listed {
                zone: i.zone,
                machine_type: i.machine_type,
                status: i.status,
                network_interfaces,
            },
        ))
    }

    /// An `Instance` with what a lookup reads (addresses, pod CIDRs, zone, type, status).
    fn instance(&self, name: &str) -> Instance {
        let mut i = Instance::new().set_name(name);
        i.zone = self.zone.clone();
        i.machine_type = self.machine_type.clone();
        i.status = self.status.clone();
        i.network_interfaces = self.network_interfaces.clone();
        i
    }
}

/// The fields of an interface that [`node_addresses`] and [`pod_cidrs`] read.
fn lookup_fields(n: NetworkInterface) -> NetworkInterface {
    let access = |configs: Vec<AccessConfig>| -> Vec<AccessConfig> {
        configs
            .into_iter()
            .map(|c| {
                let mut lean = AccessConfig::new();
                lean.nat_ip = c.nat_ip;
                lean.external_ipv_6 = c.external_ipv_6;
                lean
            })
            .collect()
    };
    let mut lean = NetworkInterface::new();
    lean.name = n.name;
    lean.network_ip = n.network_ip;
    lean.ipv_6_address = n.ipv_6_address;
    lean.ipv_6_access_type = n.ipv_6_access_type;
    lean.access_configs = access(n.access_configs);
    lean.ipv_6_access_configs = access(n.ipv_6_access_configs);
    lean.alias_ip_ranges = n
        .alias_ip_ranges
        .into_iter()
        .map(|r| AliasIpRange::new().set_or_clear_ip_cidr_range(r.ip_cidr_range))
        .collect();
    lean
}

/// What a key resolved to.
enum Found {
    Instance(Box<Instance>),
    /// Compute answered 404 for the exact instance of the providerID.
    Gone,
    /// No instance by this name in any managed zone (says nothing certain).
    NoneByName,
}

/// InstancesV2, NodeCidrs and Zones for GCE.
#[derive(Debug, Clone)]
pub struct GceInstances {
    client: Arc<GceClient>,
    /// Zone listings (by project, zone and name filter) for metadata batches, shared by
    /// concurrent batches and reused ([`ccm_core::listing`], [`LISTING_TTL`]).
    listings: Arc<Listings<ZoneListing>>,
}

impl GceInstances {
    /// Instances answered through `client`.
    pub fn new(client: Arc<GceClient>) -> Self {
        GceInstances { client, listings: Arc::default() }
    }

    fn key(&self, scope: &Scope, node: &Node) -> Result<InstanceKey, ProviderError> {
        let pid = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default();
        if !pid.is_empty() {
            let (project, zone, name) = parse_provider_id(pid)?;
            if project != scope.project {
                return Err(ProviderError::Invalid {
                    what: format!("providerID {pid:?}"),
                    message: format!(
                        "project {project:?} is not the cluster's project {:?} (instances are \
                         looked up in the cluster's project only)",
                        scope.project
                    ),
                });
            }
            return Ok(InstanceKey::Exact { project, zone, name: instance_name(&name).into() });
        }
        let node_name = node.metadata.name.as_deref().unwrap_or_default();
        let name = instance_name(node_name);
        if name.is_empty() {
            return Err(ProviderError::Invalid {
                what: format!("node name {node_name:?}"),
                message: "names no instance and the node has no providerID".into(),
            });
        }
        Ok(InstanceKey::Name(name.into()))
    }

    async fn scope_and_keys(
        &self,
        nodes: &[Node],
    ) -> Result<(Arc<Scope>, Vec<Result<InstanceKey, ProviderError>>), ProviderError> {
        let scope = self.client.scope().await?;
        let keys = nodes.iter().map(|n| self.key(&scope, n)).collect();
        Ok((scope, keys))
    }

    /// The listings a batch needs: every managed zone when a node is looked up by name, and
    /// the zones of the providerIDs. Zones are listed concurrently.
    async fn listing(
        &self,
        scope: &Scope,
        keys: &[Result<InstanceKey, ProviderError>],
        wanted: Wanted,
    ) -> Listing {
        let mut zones: Vec<String> = Vec::new();
        let ok_keys: Vec<&InstanceKey> = keys.iter().filter_map(|k| k.as_ref().ok()).collect();
        if ok_keys.iter().any(|k| matches!(k, InstanceKey::Name(_))) {
            zones.extend(scope.zones.iter().cloned());
        }
        for k in &ok_keys {
            if let InstanceKey::Exact { zone, .. } = k
                && !zones.contains(zone)
            {
                zones.push(zone.clone());
            }
        }
        let filter =
            prefix_filter(scope.node_instance_prefix.as_deref(), ok_keys.iter().map(|k| k.name()));
        let lists = zones.iter().map(|z| {
            let key = format!("{}/{z}/{}", scope.project, filter.as_deref().unwrap_or_default());
            let (client, project, zone) =
                (Arc::clone(&self.client), scope.project.clone(), z.clone());
            let filter = filter.clone();
            let fetch = move || async move {
                let items =
                    list_instances_map(&client, &project, &zone, filter.as_deref(), Listed::of)
                        .await?;
                Ok(items.into_iter().collect())
            };
            async move {
                let r = self
                    .listings
                    .get(&key, wanted, fetch, |message| GceError::Transport {
                        operation: "compute.instances.list",
                        message,
                    })
                    .await
                    .map_err(|e| {
                        tracing::warn!(zone = %z, error = %e, "GCE: listing the zone's instances failed");
                        Arc::new(e)
                    });
                (z.clone(), r)
            }
        });
        futures::future::join_all(lists).await.into_iter().collect()
    }

    /// Resolves a key from the batch's listing (`None`: upstream's per-node calls).
    async fn resolve(
        &self,
        scope: &Scope,
        listing: Option<&Listing>,
        key: &InstanceKey,
    ) -> Result<Found, ProviderError> {
        match key {
            InstanceKey::Exact { project, zone, name } => {
                match listing.and_then(|l| l.get(zone)) {
                    Some(Ok(instances)) => {
                        if let Some(i) = instances.get(name) {
                            return Ok(Found::Instance(Box::new(i.instance(name))));
                        }
                    }
                    Some(Err(e)) => {
                        return Err(shared_error(&format!("listing instances in zone {zone}"), e));
                    }
                    None => {}
                }
                // Not listed (or absent from the listing): only the answer for this exact
                // instance decides.
                // Boxed, as the other calls of a lookup: the batch's lookups are made at
                // once, and a call's future held inline by each weighs kilobytes (#35).
                match Box::pin(get_instance(&self.client, project, zone, name)).await? {
                    Some(i) => Ok(Found::Instance(Box::new(i))),
                    None => Ok(Found::Gone),
                }
            }
            InstanceKey::Name(name) => {
                let Some(listing) = listing else {
                    let found =
                        Box::pin(find_by_name(&self.client, &scope.project, &scope.zones, name))
                            .await?;
                    return Ok(found.map_or(Found::NoneByName, |i| Found::Instance(Box::new(i))));
                };
                for zone in &scope.zones {
                    match listing.get(zone) {
                        Some(Ok(instances)) => {
                            if let Some(i) = instances.get(name) {
                                return Ok(Found::Instance(Box::new(i.instance(name))));
                            }
                        }
                        Some(Err(e)) => {
                            return Err(shared_error(
                                &format!("listing instances in zone {zone}"),
                                e,
                            ));
                        }
                        None => {
                            return Err(ProviderError::other(format!(
                                "zone {zone} was not listed"
                            )));
                        }
                    }
                }
                Ok(Found::NoneByName)
            }
        }
    }

    fn metadata_of(&self, scope: &Scope, i: &Instance) -> Result<InstanceMetadata, ProviderError> {
        let name = i.name.clone().unwrap_or_default();
        let zone = last_segment(i.zone.as_deref().unwrap_or_default()).to_string();
        let region = region_of(&zone)?.to_string();
        Ok(InstanceMetadata {
            provider_id: provider_id(&scope.project, &zone, &name),
            instance_type: last_segment(i.machine_type.as_deref().unwrap_or_default()).to_string(),
            node_addresses: node_addresses(i, scope.stack_type)?,
            zone,
            region,
            additional_labels: Default::default(),
        })
    }

    /// The listing for a batch of more than [`SMALL_BATCH`] lookups.
    async fn listing_for(
        &self,
        scope: &Scope,
        keys: &[Result<InstanceKey, ProviderError>],
    ) -> Option<Listing> {
        let lookups = keys.iter().filter(|k| k.is_ok()).count();
        if lookups <= SMALL_BATCH {
            return None;
        }
        // A listing this batch started, or one reused; fetched again once, started after the
        // batch began, when it lacks an instance a Node names (a Node newer than the listing).
        let pass = Instant::now();
        let listing = self.listing(scope, keys, Wanted::recent(pass, LISTING_TTL)).await;
        let names: Vec<&str> = keys
            .iter()
            .filter_map(|k| match k {
                Ok(InstanceKey::Name(n)) => Some(n.as_str()),
                _ => None,
            })
            .collect();
        let stale = listing.values().any(|l| l.as_ref().is_ok_and(|l| l.started < pass));
        let missing = names
            .iter()
            .any(|n| !listing.values().any(|l| l.as_ref().is_ok_and(|l| l.contains_key(*n))));
        if stale && missing {
            Some(self.listing(scope, keys, Wanted::StartedAfter(pass)).await)
        } else {
            Some(listing)
        }
    }

    async fn lookup_one(&self, node: &Node) -> Result<(Arc<Scope>, Instance), ProviderError> {
        let scope = self.client.scope().await?;
        let key = self.key(&scope, node)?;
        match self.resolve(&scope, None, &key).await? {
            Found::Instance(i) => Ok((scope, *i)),
            Found::Gone | Found::NoneByName => Err(ProviderError::InstanceNotFound),
        }
    }
}

#[async_trait]
impl InstancesV2 for GceInstances {
    async fn instance_exists(&self, node: &Node) -> Result<bool, ProviderError> {
        ccm_core::cloud::exists_from_batch(self, node).await
    }

    async fn instance_shutdown(&self, node: &Node) -> Result<bool, ProviderError> {
        ccm_core::cloud::shutdown_from_batch(self, node).await
    }

    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata, ProviderError> {
        ccm_core::cloud::metadata_from_batch(self, node).await
    }

    async fn instance_metadata_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceMetadata, ProviderError>> {
        let (scope, keys) = match self.scope_and_keys(nodes).await {
            Ok(x) => x,
            Err(e) => {
                let m = e.to_string();
                return nodes.iter().map(|_| Err(ProviderError::other(m.clone()))).collect();
            }
        };
        let listing = self.listing_for(&scope, &keys).await;
        let (scope, listing) = (&scope, listing.as_ref());
        let answers = keys.into_iter().map(|k| async move {
            match self.resolve(scope, listing, &k?).await? {
                Found::Instance(i) => self.metadata_of(scope, &i),
                Found::Gone | Found::NoneByName => Err(ProviderError::InstanceNotFound),
            }
        });
        futures::future::join_all(answers).await
    }

    async fn instance_status_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceStatus, ProviderError>> {
        let (scope, keys) = match self.scope_and_keys(nodes).await {
            Ok(x) => x,
            Err(e) => {
                let m = e.to_string();
                return nodes.iter().map(|_| Err(ProviderError::other(m.clone()))).collect();
            }
        };
        let listing = self.listing_for(&scope, &keys).await;
        let (scope, listing) = (&scope, listing.as_ref());
        let answers = keys.into_iter().zip(nodes).map(|(k, n)| async move {
            let k = k?;
            match self.resolve(scope, listing, &k).await? {
                Found::Instance(i) => Ok(status_of(&i)),
                Found::Gone => {
                    tracing::info!(
                        node = n.metadata.name.as_deref().unwrap_or_default(),
                        instance = k.name(),
                        "GCE: Compute has no instance for the node's providerID"
                    );
                    Ok(InstanceStatus::NotFound)
                }
                Found::NoneByName => Err(ProviderError::other(format!(
                    "no instance named {:?} in zones {:?}: the node is kept (only a lookup of \
                     its providerID's instance can say it is gone)",
                    k.name(),
                    scope.zones
                ))),
            }
        });
        futures::future::join_all(answers).await
    }
}

#[async_trait]
impl NodeCidrs for GceInstances {
    async fn node_pod_cidrs(&self, node: &Node) -> Result<Vec<IpNet>, ProviderError> {
        let (_, instance) = self.lookup_one(node).await?;
        pod_cidrs(&instance)
    }
}

#[async_trait]
impl Zones for GceInstances {
    async fn zone_by_provider_id(&self, provider_id: &str) -> Result<Zone, ProviderError> {
        let scope = self.client.scope().await?;
        let node = Node {
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                provider_id: Some(provider_id.into()),
                ..Default::default()
            }),
            ..Default::default()
        };
        let InstanceKey::Exact { project, zone, name } = self.key(&scope, &node)? else {
            return Err(ProviderError::other("a providerID is needed"));
        };
        match get_instance(&self.client, &project, &zone, &name).await? {
            Some(i) => {
                let zone = last_segment(i.zone.as_deref().unwrap_or_default()).to_string();
                Ok(Zone { region: region_of(&zone)?.to_string(), failure_domain: zone })
            }
            None => Err(ProviderError::InstanceNotFound),
        }
    }

    async fn zone_by_node_name(&self, node_name: &str) -> Result<Zone, ProviderError> {
        let scope = self.client.scope().await?;
        let name = instance_name(node_name);
        match find_by_name(&self.client, &scope.project, &scope.zones, name).await? {
            Some(i) => {
                let zone = last_segment(i.zone.as_deref().unwrap_or_default()).to_string();
                Ok(Zone { region: region_of(&zone)?.to_string(), failure_domain: zone })
            }
            None => Err(ProviderError::InstanceNotFound),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_parse_as_upstream() {
        assert_eq!(
            parse_provider_id("gce://p/us-central1-a/node-1").unwrap(),
            ("p".into(), "us-central1-a".into(), "node-1".into())
        );
        for bad in [
            "gce://p/z",
            "gce://p/z/n/x",
            "gce:///z/n",
            "gce://p//n",
            "aws:///us-east-1a/i-1",
            "openstack:///0d0c",
            "p/z/n",
            "",
        ] {
            let e = parse_provider_id(bad).unwrap_err();
            assert!(matches!(e, ProviderError::Invalid { .. }), "{bad}: {e}");
        }
        assert_eq!(provider_id("p", "z", "n"), "gce://p/z/n");
        assert_eq!(instance_name("node-2.c.my-proj.internal"), "node-2");
        assert_eq!(instance_name("node-2"), "node-2");
        assert_eq!(region_of("europe-west1-b").unwrap(), "europe-west1");
        assert!(region_of("zone").is_err());
        assert_eq!(quote_regex("k8s.node-(1)"), "k8s\\.node-\\(1\\)");
    }

    fn nic(ip: &str, nat: &[&str], v6: Option<&str>) -> NetworkInterface {
        let mut n = NetworkInterface::new().set_name("nic0").set_network_ip(ip).set_access_configs(
            nat.iter().map(|a| AccessConfig::new().set_nat_ip(*a)).collect::<Vec<_>>(),
        );
        if let Some(v6) = v6 {
            n = n.set_ipv_6_address(v6);
        }
        n
    }

    /// A listed instance keeps, in far less memory, everything a lookup reads: the same
    /// addresses in both stacks, pod CIDRs, zone, type and status as the full instance.
    #[test]
    fn a_listed_instance_answers_as_the_full_one() {
        let mut external = nic("10.0.0.2", &["34.1.1.1"], None)
            .set_alias_ip_ranges([AliasIpRange::new().set_ip_cidr_range("10.64.3.0/24")])
            .set_ipv_6_access_type(
                google_cloud_compute_v1::model::network_interface::Ipv6AccessType::External,
            )
            .set_ipv_6_access_configs([AccessConfig::new()
                .set_external_ipv_6("2600:1900:4000:1::")
                .set_name("external-ipv6")]);
        external.network = Some("projects/p/global/networks/default".into());
        external.subnetwork = Some("projects/p/regions/r/subnetworks/s".into());
        let full = Instance::new()
            .set_name("n")
            .set_zone("projects/p/zones/europe-west1-b")
            .set_machine_type("projects/p/zones/europe-west1-b/machineTypes/e2-medium")
            .set_status(google_cloud_compute_v1::model::instance::Status::Terminated)
            .set_hostname("n.example")
            .set_labels([("team", "a")])
            .set_network_interfaces([external, nic("10.1.0.2", &[], Some("fd20::2"))]);
        let (name, listed) = Listed::of(full.clone()).unwrap();
        assert_eq!(name, "n");
        let lean = listed.instance(&name);
        for stack in [StackType::Ipv4, StackType::Ipv6] {
            assert_eq!(
                node_addresses(&lean, stack).unwrap(),
                node_addresses(&full, stack).unwrap()
            );
        }
        assert_eq!(pod_cidrs(&lean).unwrap(), pod_cidrs(&full).unwrap());
        assert_eq!(pod_cidrs(&lean).unwrap().len(), 2);
        assert!(is_shut_down(&lean));
        // What metadata reads besides the addresses.
        assert_eq!(
            (&lean.name, &lean.zone, &lean.machine_type),
            (&full.name, &full.zone, &full.machine_type)
        );
        assert!(lean.labels.is_empty() && lean.hostname.is_none(), "the rest is not kept");
    }

    fn pairs(a: &[NodeAddress]) -> Vec<(&str, &str)> {
        a.iter().map(|a| (a.type_.as_str(), a.address.as_str())).collect()
    }

    #[test]
    fn addresses_are_upstreams_in_stack_order() {
        let i = Instance::new().set_name("n").set_network_interfaces([
            nic("10.0.0.2", &["34.1.1.1", ""], Some("fd20::2")),
            nic("10.1.0.2", &[], None),
        ]);
        let v4 = node_addresses(&i, StackType::Ipv4).unwrap();
        assert_eq!(
            pairs(&v4),
            [
                ("InternalIP", "10.0.0.2"),
                ("ExternalIP", "34.1.1.1"),
                ("InternalIP", "10.1.0.2"),
                ("InternalIP", "fd20::2"),
            ]
        );
        assert_eq!(node_addresses(&i, StackType::DualStack).unwrap(), v4);
        let v6 = node_addresses(&i, StackType::Ipv6).unwrap();
        assert_eq!(pairs(&v6)[0], ("InternalIP", "fd20::2"));
        assert_eq!(v6.len(), 4);
        assert!(node_addresses(&Instance::new(), StackType::Ipv4).is_err());
    }

    #[test]
    fn external_ipv6_comes_from_the_ipv6_access_config() {
        let mut n = nic("10.0.0.2", &[], None);
        assert_eq!(interface_ipv6(&n), None);
        n = n
            .set_ipv_6_access_type(
                google_cloud_compute_v1::model::network_interface::Ipv6AccessType::External,
            )
            .set_ipv_6_access_configs([AccessConfig::new().set_external_ipv_6("2600:1900::5")]);
        assert_eq!(interface_ipv6(&n), Some("2600:1900::5"));
    }

    #[test]
    fn pod_cidrs_are_every_family_of_nic0() {
        let mut n = nic("10.0.0.2", &[], Some("2600:1900:4000:1::"));
        n = n.set_alias_ip_ranges([
            AliasIpRange::new().set_ip_cidr_range("10.64.3.0/24"),
            AliasIpRange::new().set_ip_cidr_range("10.99.0.0/28"),
        ]);
        let i = Instance::new().set_name("n").set_network_interfaces([n]);
        let s = |v: Vec<IpNet>| v.iter().map(ToString::to_string).collect::<Vec<_>>();
        assert_eq!(s(pod_cidrs(&i).unwrap()), ["10.64.3.0/24", "2600:1900:4000:1::/112"]);
        let v4_only = Instance::new().set_network_interfaces([nic("10.0.0.3", &[], None)
            .set_alias_ip_ranges([AliasIpRange::new().set_ip_cidr_range("10.64.4.0/24")])]);
        assert_eq!(s(pod_cidrs(&v4_only).unwrap()), ["10.64.4.0/24"]);
        let v6_only = Instance::new().set_network_interfaces([nic("", &[], Some("fd20:0:0:5::"))]);
        assert_eq!(s(pod_cidrs(&v6_only).unwrap()), ["fd20:0:0:5::/112"]);
        // nic0 is the default interface wherever it stands.
        let second = nic("10.0.0.4", &[], None)
            .set_name("nic1")
            .set_alias_ip_ranges([AliasIpRange::new().set_ip_cidr_range("10.70.0.0/24")]);
        let first = nic("10.0.0.5", &[], None)
            .set_name("nic0")
            .set_alias_ip_ranges([AliasIpRange::new().set_ip_cidr_range("10.71.0.0/24")]);
        let two = Instance::new().set_network_interfaces([second, first]);
        assert_eq!(s(pod_cidrs(&two).unwrap()), ["10.71.0.0/24"]);
        assert!(pod_cidrs(&Instance::new()).unwrap().is_empty());
        let bad = Instance::new().set_network_interfaces([nic("10.0.0.3", &[], None)
            .set_alias_ip_ranges([AliasIpRange::new().set_ip_cidr_range("/24")])]);
        assert!(pod_cidrs(&bad).is_err());
    }

    #[test]
    fn only_a_404_naming_the_instance_is_not_found() {
        let e = |status, message: &str| GceError::Api {
            operation: "compute.instances.get",
            status,
            reason: "notFound".into(),
            message: message.into(),
        };
        let gone = e(404, "The resource 'projects/p/zones/z-a/instances/n1' was not found");
        assert!(is_instance_not_found(&gone, "z-a", "n1"));
        assert!(!is_instance_not_found(&gone, "z-a", "n"));
        assert!(!is_instance_not_found(&gone, "z-b", "n1"));
        assert!(!is_instance_not_found(
            &e(404, "The resource 'projects/p' was not found"),
            "z-a",
            "n1"
        ));
        assert!(!is_instance_not_found(
            &e(404, "The resource 'projects/p/zones/z-a' was not found"),
            "z-a",
            "n1"
        ));
        assert!(!is_instance_not_found(
            &e(500, "The resource 'projects/p/zones/z-a/instances/n1' was not found"),
            "z-a",
            "n1"
        ));
        // A 404 naming the instance without Compute's typed reason (a gateway's JSON echoing
        // the path): not "gone".
        let untyped = GceError::Api {
            operation: "compute.instances.get",
            status: 404,
            reason: String::new(),
            message: "The resource 'projects/p/zones/z-a/instances/n1' was not found".into(),
        };
        assert!(!is_instance_not_found(&untyped, "z-a", "n1"));
        assert!(!untyped.is_not_found());
        assert!(gone.is_not_found());
    }

    #[test]
    fn the_prefix_filter_is_dropped_for_a_name_outside_it() {
        let names = ["k8s-node-1", "k8s-node-2"];
        assert_eq!(
            prefix_filter(Some("k8s-node"), names.iter().copied()).as_deref(),
            Some("name eq \"k8s-node.*\"")
        );
        assert_eq!(prefix_filter(Some("k8s-node"), ["other"].iter().copied()), None);
        assert_eq!(prefix_filter(None, names.iter().copied()), None);
        assert_eq!(prefix_filter(Some(""), names.iter().copied()), None);
    }
}
