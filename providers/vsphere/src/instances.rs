//! `InstancesV2` for vSphere: finds the VM behind a Node in every datacenter of every
//! configured vCenter and reports its providerID, addresses, instance type, zone/region and
//! power state.
//!
//! - Lookup, in order, the next only after a definite miss: the providerID's BIOS UUID
//!   (`SearchIndex.FindByUuid`), then the same UUID byte-swapped (the SMBIOS byte order some
//!   guests report); without a providerID the Node's `status.nodeInfo.systemUUID` (as is,
//!   then byte-swapped), then the node name: `FindAllByDnsName` (the guest host name VMware
//!   Tools reports; several VMs with that name are an error, no pick) or, when the name is
//!   an IP address, `FindByIp`.
//! - Batches (joining Nodes): a Node whose first key is a BIOS UUID is taken from one
//!   listing of every VM's UUID per vCenter ([`UUID_LISTING_TTL`], shared by concurrent
//!   batches) when exactly one VM has it, and the batch's VMs are read in one property read;
//!   every other Node is looked up as above. "Gone" never rests on the listing.
//! - Datacenters: listed per vCenter and cached for [`DATACENTER_REFRESH`]; a lookup that
//!   finds nothing (or hits a datacenter that no longer exists) lists them again before
//!   answering, so a VM in a datacenter created after start is found and a deleted one is
//!   dropped. Each search runs at most [`SEARCH_CONCURRENCY`] datacenter searches at a
//!   time, and each vCenter at most as many `SearchIndex` calls over all lookups.
//! - "Gone" (`Ok(false)` / [`InstanceStatus::NotFound`]) is only answered when every
//!   vCenter answered the search in a freshly listed set of datacenters and none has the
//!   VM. Any error (a vCenter, a datacenter search, a configured datacenter that does not
//!   exist) makes the answer an error, so an unreachable vCenter never gets Nodes deleted.
//! - Addresses: [`select_addresses`] (Hostname first, then per IP family one InternalIP and
//!   one ExternalIP, chosen by subnet, then network name; non-vNIC interfaces skipped;
//!   static addresses from `guestinfo.metadata` preferred, see [`static_addresses`]).
//! - Instance type: `vsphere-vm.cpu-<n>.mem-<GiB>gb.os-<os>` with upstream's guest-OS short
//!   names ([`guest_os`]).
//! - Zone/region: tags of the configured categories on the VM's host and its ancestors,
//!   else on its resource pool and its ancestors, else on the VM and its folders (nearest
//!   wins within each walk), read through the tagging REST API. A category with no tag on
//!   any of the three walks is an error: the Node stays uninitialised and is retried.

use std::collections::{BTreeMap, BTreeSet};
use std::io::Read as _;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use base64::Engine as _;
use ccm_core::cloud::{InstanceMetadata, InstanceStatus, InstancesV2, ProviderError};
use ccm_core::listing::{Fetched, Listings, Wanted};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use tokio::sync::{Mutex, Semaphore};

use crate::client::tagging::TaggingClient;
use crate::client::vim25::{GuestNic, PowerState, Vim25Client, VmInfo};
use crate::client::{ClientError, FaultKind, MoRef};
use crate::config::{IpFamily, Labels, NodeSelection};

/// The providerID scheme.
pub const PROVIDER_ID_PREFIX: &str = "vsphere://";

/// Datacenter searches in flight per lookup, and `SearchIndex` calls in flight per vCenter
/// (upstream searches with 8 workers).
pub const SEARCH_CONCURRENCY: usize = 8;

/// The most Nodes the node controller puts in one lookup batch. The controller gives a batch
/// one deadline (`instance_call_timeout`, 60 s) and fails all of it at the end: with the
/// default 500, a batch of Nodes looked up one by one cost about 75 s on vcsim at 200 ms a
/// call and every batch timed out, again on every retry (ci/bench, #35). A batch is now
/// answered from the shared UUID listing and one property read per vCenter (a page of the
/// read: [`crate::client::vim25::DEFAULT_PAGE_SIZE`] VMs); when that cannot answer, its Nodes
/// are searched one by one, [`SEARCH_CONCURRENCY`] at a time: 100 Nodes, two calls each, take
/// 5 s at 200 ms a call, and reach 60 s only at twelve times that latency.
pub const LOOKUP_BATCH: usize = 100;

/// How long the tags found up from a host or a resource pool (their own and their
/// ancestors') answer the lookups of other VMs there: every VM of a host shares them, and
/// reading them again per VM was 10 of a Node's 13 calls (ci/bench, #35). A tag moved or
/// renamed within this time labels a Node that joins meanwhile with the old zone; the tags
/// the VM itself carries are always read afresh.
pub const TOPOLOGY_TTL: Duration = Duration::from_secs(5);

/// How long a listing of every VM's BIOS UUID answers the lookups of later batches (or as
/// long as it took to list, when longer; `ccm_core::listing`). A Node whose UUID it lacks is
/// searched for as before, so a VM created since is found all the same.
pub const UUID_LISTING_TTL: Duration = Duration::from_secs(10);

/// How long a vCenter's datacenter list is used before it is listed again (it is also
/// listed again whenever a lookup finds nothing).
pub const DATACENTER_REFRESH: Duration = Duration::from_secs(300);

/// The datacenters of one vCenter as last listed.
#[derive(Debug)]
struct Datacenters {
    /// When the listing was started.
    fetched: Instant,
    /// Name and reference of each datacenter to search.
    found: Vec<(String, MoRef)>,
    /// Configured datacenter names the vCenter does not have (a lookup that finds nothing
    /// is then an error, never "gone").
    missing: Vec<String>,
    /// Every datacenter name the vCenter has (for error messages).
    available: Vec<String>,
}

/// One vCenter with its clients and the datacenters to search.
#[derive(Debug)]
pub struct VCenterConn {
    /// The vCenter's name in the config.
    pub name: String,
    /// The SOAP client.
    pub vim: Vim25Client,
    /// The tagging client.
    pub tagging: TaggingClient,
    /// Configured datacenter names (empty: all).
    pub datacenter_names: Vec<String>,
    /// Address families, in order.
    pub ip_families: Vec<IpFamily>,
    datacenters: Mutex<Option<Arc<Datacenters>>>,
    searches: Semaphore,
    categories: Mutex<BTreeMap<String, String>>,
    /// Tags up from shared objects (hosts, resource pools), by object and category IDs.
    walks: Listings<BTreeMap<String, String>>,
    /// Every VM's BIOS UUID in the datacenters searched (for batches of Nodes).
    uuids: Listings<UuidIndex>,
}

/// Lower-cased BIOS UUID → the VM with it; `None` when several VMs have it (a clone's
/// duplicate: left to the search, which answers as upstream does).
type UuidIndex = std::collections::HashMap<String, Option<MoRef>>;

/// Nodes of a batch (by index) and the VMs a vCenter's UUID listing gives them.
type ListedGroup = (Arc<VCenterConn>, Vec<(usize, MoRef)>);

impl VCenterConn {
    /// Bundles the clients of one vCenter.
    pub fn new(
        name: String,
        vim: Vim25Client,
        tagging: TaggingClient,
        datacenter_names: Vec<String>,
        ip_families: Vec<IpFamily>,
    ) -> Self {
        VCenterConn {
            name,
            vim,
            tagging,
            datacenter_names,
            ip_families,
            datacenters: Mutex::new(None),
            searches: Semaphore::new(SEARCH_CONCURRENCY),
            categories: Mutex::new(BTreeMap::new()),
            walks: Listings::default(),
            uuids: Listings::default(),
        }
    }

    /// Category id → name for the wanted category names. Cached; read again from vCenter
    /// when a wanted name is not in the cache (a category created or renamed later).
    async fn categories(&self, wanted: &[&str]) -> Result<BTreeMap<String, String>, ProviderError> {
        let mut cache = self.categories.lock().await;
        let complete =
            |c: &BTreeMap<String, String>| wanted.iter().all(|w| c.values().any(|n| n == w));
        if !complete(&cache) {
            let ids = self
                .tagging
                .category_ids()
                .await
                .map_err(|e| client_error("listing tag categories", e))?;
            let mut fresh = BTreeMap::new();
            for id in ids {
                let cat = self
                    .tagging
                    .category(&id)
                    .await
                    .map_err(|e| client_error("reading a tag category", e))?;
                fresh.insert(cat.id, cat.name);
            }
            *cache = fresh;
        }
        Ok(cache
            .iter()
            .filter(|(_, n)| wanted.contains(&n.as_str()))
            .map(|(i, n)| (i.clone(), n.clone()))
            .collect())
    }

    /// The datacenters to search: the cached list if it was listed at or after
    /// `fresh_since` (any cached list when `None`), else listed now. Concurrent callers
    /// share one listing.
    async fn datacenters(
        &self,
        fresh_since: Option<Instant>,
    ) -> Result<Arc<Datacenters>, ProviderError> {
        let mut cache = self.datacenters.lock().await;
        if let Some(list) = cache.as_ref()
            && fresh_since.is_none_or(|t| list.fetched >= t)
        {
            return Ok(list.clone());
        }
        let fetched = Instant::now();
        let all =
            self.vim.datacenters().await.map_err(|e| client_error("listing datacenters", e))?;
        let available: Vec<String> = all.keys().cloned().collect();
        let (found, missing) = if self.datacenter_names.is_empty() {
            (all.into_iter().collect(), Vec::new())
        } else {
            let mut found = Vec::new();
            let mut missing = Vec::new();
            for name in &self.datacenter_names {
                match all.get(name) {
                    Some(dc) => found.push((name.clone(), dc.clone())),
                    None => missing.push(name.clone()),
                }
            }
            (found, missing)
        };
        if !missing.is_empty() {
            tracing::warn!(vcenter = %self.name, missing = %missing.join(","), available = %available.join(","),
                "configured datacenters not found in vCenter; lookups that find nothing are errors until they exist");
        }
        let list = Arc::new(Datacenters { fetched, found, missing, available });
        *cache = Some(list.clone());
        Ok(list)
    }

    /// One `SearchIndex` search in one datacenter (at most [`SEARCH_CONCURRENCY`] of them
    /// in flight per vCenter).
    async fn search_in(&self, dc: &MoRef, key: &Key) -> Result<Vec<MoRef>, ClientError> {
        // The semaphore is never closed; if it were, search unbounded rather than fail.
        let _permit = self.searches.acquire().await.ok();
        match key {
            Key::Uuid(uuid) => self.vim.find_vm_by_uuid(Some(dc), uuid).await.map(Vec::from_iter),
            Key::Ip(ip) => self.vim.find_vm_by_ip(Some(dc), ip).await.map(Vec::from_iter),
            Key::DnsName(name) => self.vim.find_vms_by_dns_name(Some(dc), name).await,
        }
    }

    /// The VMs matching `key` in this vCenter's datacenters (for UUID and IP keys the
    /// first hit only). The datacenter list is listed again when it predates `started`
    /// and the search found nothing or hit a datacenter error: a new datacenter is then
    /// searched too, and errors of datacenters that no longer exist are dropped.
    async fn search(&self, key: &Key, started: Instant) -> Result<Vec<MoRef>, ProviderError> {
        let mut list = self.datacenters(started.checked_sub(DATACENTER_REFRESH)).await?;
        let first_only = !matches!(key, Key::DnsName(_));
        let mut searched: BTreeSet<MoRef> = BTreeSet::new();
        let mut found: Vec<MoRef> = Vec::new();
        let mut errors: Vec<(String, MoRef, ClientError)> = Vec::new();
        for round in 0..2 {
            let todo: Vec<(String, MoRef)> =
                list.found.iter().filter(|(_, dc)| !searched.contains(dc)).cloned().collect();
            errors.clear();
            let mut results = futures::stream::iter(todo)
                .map(|(name, dc)| async move {
                    let r = self.search_in(&dc, key).await;
                    (name, dc, r)
                })
                .buffer_unordered(SEARCH_CONCURRENCY);
            while let Some((name, dc, result)) = results.next().await {
                match result {
                    Ok(hits) => {
                        searched.insert(dc);
                        for hit in hits {
                            if !found.contains(&hit) {
                                found.push(hit);
                            }
                        }
                        if first_only && !found.is_empty() {
                            break;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(vcenter = %self.name, datacenter = %name, error = %e,
                            "datacenter search failed");
                        errors.push((name, dc, e));
                    }
                }
            }
            drop(results);
            let stale_datacenter = errors.iter().any(|(_, _, e)| {
                matches!(e.fault().map(|f| &f.kind), Some(FaultKind::ManagedObjectNotFound))
            });
            // An unreachable vCenter is not listed again (the search already failed); a
            // miss or a datacenter that is gone is.
            let retry = round == 0
                && list.fetched < started
                && (stale_datacenter || (found.is_empty() && errors.is_empty()));
            if !retry {
                break;
            }
            list = self.datacenters(Some(started)).await?;
            tracing::debug!(vcenter = %self.name, datacenters = list.found.len(),
                "listed datacenters again before answering");
        }
        if !found.is_empty() {
            return Ok(found);
        }
        if let Some((name, _, e)) = errors.into_iter().next() {
            return Err(client_error(&format!("searching the VM in datacenter {name}"), e));
        }
        if !list.missing.is_empty() {
            return Err(ProviderError::Invalid {
                what: format!("datacenters of vCenter {}", self.name),
                message: format!(
                    "{} not found (the vCenter has: {}); a VM found in no datacenter is not \
                     reported gone while a configured one is missing",
                    list.missing.join(", "),
                    list.available.join(", ")
                ),
            });
        }
        Ok(found)
    }

    /// Every VM's BIOS UUID in the datacenters this vCenter searches, listed once for the
    /// batches that want it (one `RetrievePropertiesEx` per datacenter and its pages).
    async fn uuid_index(
        self: &Arc<Self>,
        wanted: Wanted,
    ) -> Result<Arc<Fetched<UuidIndex>>, ProviderError> {
        let conn = Arc::clone(self);
        let fetch = move || async move {
            let list = conn.datacenters(None).await?;
            let mut index = UuidIndex::new();
            for (name, dc) in &list.found {
                let vms = conn.vim.vm_uuids(dc).await.map_err(|e| {
                    client_error(&format!("listing the VMs' BIOS UUIDs in datacenter {name}"), e)
                })?;
                for (uuid, vm) in vms {
                    index
                        .entry(uuid.to_ascii_lowercase())
                        .and_modify(|seen| *seen = None)
                        .or_insert(Some(vm));
                }
            }
            Ok(index)
        };
        self.uuids.get("vms", wanted, fetch, ProviderError::other).await
    }
}

fn client_error(what: &str, e: ClientError) -> ProviderError {
    ProviderError::with_source(format!("vSphere: {what}: {e}"), e)
}

/// How a node is identified in vCenter.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    Uuid(String),
    DnsName(String),
    Ip(String),
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Key::Uuid(u) => write!(f, "BIOS UUID {u}"),
            Key::DnsName(n) => write!(f, "guest host name {n}"),
            Key::Ip(ip) => write!(f, "IP {ip}"),
        }
    }
}

/// The UUID with its first three groups byte-swapped (SMBIOS little-endian fields), the
/// form some guests report as `product_uuid`; `None` unless it is a 36-character UUID.
pub fn swap_uuid_bytes(uuid: &str) -> Option<String> {
    let u = uuid.trim().to_ascii_lowercase();
    let b = u.as_bytes();
    let well_formed = b.len() == 36
        && b.iter().enumerate().all(|(i, c)| {
            if matches!(i, 8 | 13 | 18 | 23) { *c == b'-' } else { c.is_ascii_hexdigit() }
        });
    if !well_formed {
        return None;
    }
    let pairs = |range: std::ops::Range<usize>| -> String {
        let s = &u[range];
        (0..s.len() / 2).rev().map(|i| &s[2 * i..2 * i + 2]).collect()
    };
    Some(format!("{}-{}-{}-{}", pairs(0..8), pairs(9..13), pairs(14..18), &u[19..]))
}

fn uuid_keys(uuid: &str, keys: &mut Vec<Key>) {
    let uuid = uuid.trim().to_ascii_lowercase();
    if uuid.is_empty() {
        return;
    }
    let swapped = swap_uuid_bytes(&uuid);
    keys.push(Key::Uuid(uuid.clone()));
    if let Some(swapped) = swapped.filter(|s| *s != uuid) {
        keys.push(Key::Uuid(swapped));
    }
}

/// The lookups to try for a node, in order.
fn node_keys(node: &Node) -> Result<Vec<Key>, ProviderError> {
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default();
    let mut keys = Vec::new();
    if !provider_id.is_empty() {
        let uuid = provider_id
            .strip_prefix(PROVIDER_ID_PREFIX)
            .filter(|u| !u.trim().is_empty())
            .ok_or_else(|| ProviderError::Invalid {
                what: "spec.providerID".into(),
                message: format!("{provider_id:?} is not a vsphere://<uuid> providerID"),
            })?;
        uuid_keys(uuid, &mut keys);
        return Ok(keys);
    }
    let system_uuid = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.as_ref())
        .map(|i| i.system_uuid.as_str())
        .unwrap_or_default();
    uuid_keys(system_uuid, &mut keys);
    let name = node.metadata.name.as_deref().unwrap_or_default().trim();
    if !name.is_empty() {
        keys.push(if name.parse::<IpAddr>().is_ok() {
            Key::Ip(name.to_string())
        } else {
            Key::DnsName(name.to_ascii_lowercase())
        });
    }
    if keys.is_empty() {
        return Err(ProviderError::Invalid {
            what: "node".into(),
            message: "has neither providerID, systemUUID nor name".into(),
        });
    }
    Ok(keys)
}

/// The `InstancesV2` implementation over one or more vCenters.
#[derive(Debug)]
pub struct Instances {
    vcenters: std::sync::RwLock<Vec<Arc<VCenterConn>>>,
    /// vCenters not connected yet (credentials from a Secret not read yet): name → why.
    /// While any is here every lookup is an error, never "gone".
    waiting: std::sync::RwLock<BTreeMap<String, String>>,
    labels: Labels,
    nodes: NodeSelection,
    skip_node_deletion: bool,
}

/// Several VMs answer one lookup: no pick.
fn ambiguous(key: &Key, hits: &[(Arc<VCenterConn>, MoRef)]) -> ProviderError {
    let list: Vec<String> =
        hits.iter().map(|(vc, vm)| format!("{vm} in vCenter {}", vc.name)).collect();
    ProviderError::other(format!(
        "vSphere: {} VMs have the {key} ({}); refusing to pick one: give the VMs distinct host \
         names or set the Node's providerID",
        hits.len(),
        list.join(", ")
    ))
}

impl Instances {
    /// Instances over these vCenters.
    pub fn new(vcenters: Vec<Arc<VCenterConn>>, labels: Labels, nodes: NodeSelection) -> Self {
        Instances {
            vcenters: std::sync::RwLock::new(vcenters),
            waiting: Default::default(),
            labels,
            nodes,
            skip_node_deletion: false,
        }
    }

    /// Marks a vCenter as not connected yet; `why` (no credential values) is the error
    /// of every lookup until [`Instances::connect`] adds it.
    pub fn await_credentials(&self, vcenter: &str, why: String) {
        self.waiting.write().unwrap_or_else(|e| e.into_inner()).insert(vcenter.to_string(), why);
    }

    /// Adds (or replaces) a connected vCenter.
    pub fn connect(&self, conn: Arc<VCenterConn>) {
        self.waiting.write().unwrap_or_else(|e| e.into_inner()).remove(&conn.name);
        let mut all = self.vcenters.write().unwrap_or_else(|e| e.into_inner());
        all.retain(|c| c.name != conn.name);
        all.push(conn);
    }

    /// Never report a VM as gone (upstream's `SKIP_NODE_DELETION`): Nodes are kept even
    /// when their VM was removed.
    pub fn with_skip_node_deletion(mut self, skip: bool) -> Self {
        self.skip_node_deletion = skip;
        self
    }

    /// One key in every vCenter: `Ok(None)` only when every vCenter answered.
    async fn search(
        &self,
        vcenters: &[Arc<VCenterConn>],
        key: &Key,
    ) -> Result<Option<(Arc<VCenterConn>, MoRef)>, ProviderError> {
        let started = Instant::now();
        let searches =
            vcenters.iter().map(|vc| async move { (vc.clone(), vc.search(key, started).await) });
        let mut hits = Vec::new();
        let mut first_error = None;
        for (vc, result) in futures::future::join_all(searches).await {
            match result {
                Ok(found) => hits.extend(found.into_iter().map(|vm| (vc.clone(), vm))),
                Err(e) => {
                    tracing::warn!(vcenter = %vc.name, error = %e, "vCenter search failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        if matches!(key, Key::DnsName(_)) && hits.len() > 1 {
            return Err(ambiguous(key, &hits));
        }
        if let Some(hit) = hits.into_iter().next() {
            return Ok(Some(hit));
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(None),
        }
    }

    /// Finds the VM: `Ok(None)` only when every lookup was answered by every vCenter and
    /// none has it. A lookup that fails ends the search with its error (the next one is
    /// only tried after a definite miss, as upstream).
    async fn locate(
        &self,
        node: &Node,
    ) -> Result<Option<(Arc<VCenterConn>, MoRef)>, ProviderError> {
        let keys = node_keys(node)?;
        if let Some((name, why)) =
            self.waiting.read().unwrap_or_else(|e| e.into_inner()).iter().next()
        {
            return Err(ProviderError::other(format!(
                "vSphere: vCenter {name} is not connected: {why}"
            )));
        }
        let vcenters = self.vcenters.read().unwrap_or_else(|e| e.into_inner()).clone();
        for key in &keys {
            match self.search(&vcenters, key).await {
                Ok(Some(hit)) => {
                    tracing::debug!(node = node.metadata.name.as_deref().unwrap_or_default(),
                        vcenter = %hit.0.name, vm = %hit.1, by = %key, "found the node's VM");
                    return Ok(Some(hit));
                }
                Ok(None) => {}
                // As upstream: the next lookup is only tried after a definite miss.
                Err(e) => return Err(e),
            }
        }
        Ok(None)
    }

    /// The Nodes of a batch (by index) whose first lookup key is a BIOS UUID that the
    /// vCenters' UUID listings give to exactly one VM, grouped by vCenter. Empty when a
    /// vCenter is not connected or any listing failed (the Nodes are then searched for).
    async fn listed_vms(&self, nodes: &[Node], pass: Instant) -> Vec<ListedGroup> {
        let uuids: Vec<(usize, String)> = nodes
            .iter()
            .enumerate()
            .filter_map(|(i, n)| match node_keys(n).ok()?.into_iter().next()? {
                Key::Uuid(u) => Some((i, u)),
                _ => None,
            })
            .collect();
        if uuids.len() < 2 || !self.waiting.read().unwrap_or_else(|e| e.into_inner()).is_empty() {
            return Vec::new();
        }
        let vcenters = self.vcenters.read().unwrap_or_else(|e| e.into_inner()).clone();
        let wanted = Wanted::recent(pass, UUID_LISTING_TTL);
        let mut indexes = Vec::with_capacity(vcenters.len());
        for vc in &vcenters {
            match vc.uuid_index(wanted).await {
                Ok(index) => indexes.push((Arc::clone(vc), index)),
                Err(e) => {
                    tracing::debug!(vcenter = %vc.name, error = %e,
                        "listing the VMs' UUIDs failed; searching for each Node");
                    return Vec::new();
                }
            }
        }
        let mut groups: Vec<ListedGroup> =
            indexes.iter().map(|(vc, _)| (Arc::clone(vc), Vec::new())).collect();
        for (i, uuid) in uuids {
            // In one vCenter's listing only, and one VM there (`None`: several).
            let hits: Vec<(usize, &Option<MoRef>)> = indexes
                .iter()
                .enumerate()
                .filter_map(|(v, (_, index))| Some((v, index.get(&uuid)?)))
                .collect();
            if let [(v, Some(vm))] = hits.as_slice() {
                groups[*v].1.push((i, vm.clone()));
            }
        }
        groups.retain(|(_, g)| !g.is_empty());
        groups
    }

    async fn vm(&self, node: &Node) -> Result<Option<(Arc<VCenterConn>, VmInfo)>, ProviderError> {
        let Some((vc, vm)) = self.locate(node).await? else { return Ok(None) };
        let info =
            vc.vim.vm_info(&vm).await.map_err(|e| client_error("reading VM properties", e))?;
        Ok(info.map(|i| (vc, i)))
    }

    async fn status(&self, node: &Node) -> Result<InstanceStatus, ProviderError> {
        Ok(match self.vm(node).await? {
            None if self.skip_node_deletion => InstanceStatus::Running,
            None => InstanceStatus::NotFound,
            Some((_, vm)) if vm.power_state == PowerState::PoweredOn => InstanceStatus::Running,
            Some(_) => InstanceStatus::Shutdown,
        })
    }

    /// Zone and region: the first of the walks from the VM's host, its resource pool and
    /// the VM itself (each up to the inventory root) that finds a tag of every configured
    /// category. None does: an error (the Node is retried), never an empty zone.
    async fn topology(
        &self,
        vc: &Arc<VCenterConn>,
        vm: &VmInfo,
    ) -> Result<(String, String), ProviderError> {
        let wanted: Vec<&str> = [&self.labels.zone, &self.labels.region]
            .into_iter()
            .flatten()
            .map(String::as_str)
            .collect();
        if wanted.is_empty() {
            return Ok((String::new(), String::new()));
        }
        let category_names = vc.categories(&wanted).await?;
        for name in &wanted {
            if !category_names.values().any(|n| n == name) {
                return Err(ProviderError::Invalid {
                    what: format!("labels category {name:?}"),
                    message: format!("no tag category with this name in vCenter {}", vc.name),
                });
            }
        }
        // The host's and the resource pool's walks are shared (TOPOLOGY_TTL); the VM's own.
        // When none completes and a shared one was older than this lookup, they are walked
        // again (a tag added since the cached walk completes it: the Node's retry must not
        // meet the walk that failed it).
        let pass = Instant::now();
        let mut seen: BTreeSet<String> = BTreeSet::new();
        for fresh in [false, true] {
            let wanted_walk =
                if fresh { Wanted::StartedAfter(pass) } else { Wanted::recent(pass, TOPOLOGY_TTL) };
            let mut reused = false;
            // The VM's own walk is never shared: the second round leaves it out.
            let own = (!fresh).then(|| (Some(vm.moref.clone()), false));
            let starts =
                [(vm.host.clone(), true), (vm.resource_pool.clone(), true)].into_iter().chain(own);
            for (start, shared) in starts {
                let Some(start) = start else { continue };
                let found = if shared {
                    let walk =
                        shared_tags_up_from(vc, start, &category_names, wanted.len(), wanted_walk)
                            .await?;
                    reused |= walk.started < pass;
                    walk.value.clone()
                } else {
                    tags_up_from(vc, start, &category_names, wanted.len()).await?
                };
                if found.len() == wanted.len() {
                    let get = |c: &Option<String>| {
                        c.as_ref().and_then(|c| found.get(c)).cloned().unwrap_or_default()
                    };
                    return Ok((get(&self.labels.zone), get(&self.labels.region)));
                }
                seen.extend(found.into_keys());
            }
            if !reused {
                break;
            }
        }
        let missing: Vec<&str> = wanted.iter().copied().filter(|w| !seen.contains(*w)).collect();
        let missing = if missing.is_empty() { wanted.clone() } else { missing };
        Err(ProviderError::other(format!(
            "vSphere: VM {} in vCenter {}: no tag of categor{} {} on its host, its resource pool \
             or the VM (or their ancestors) completes the zone/region; tag them, the Node is retried",
            vm.name,
            vc.name,
            if missing.len() == 1 { "y" } else { "ies" },
            missing.join(", ")
        )))
    }

    async fn metadata(&self, node: &Node) -> Result<InstanceMetadata, ProviderError> {
        let Some((vc, vm)) = self.vm(node).await? else {
            return Err(ProviderError::InstanceNotFound);
        };
        self.metadata_of(&vc, &vm).await
    }

    /// The metadata of a VM found for a Node.
    async fn metadata_of(
        &self,
        vc: &Arc<VCenterConn>,
        vm: &VmInfo,
    ) -> Result<InstanceMetadata, ProviderError> {
        if vm.uuid.is_empty() {
            return Err(ProviderError::other(format!(
                "vSphere: VM {} in vCenter {} has no BIOS UUID",
                vm.name, vc.name
            )));
        }
        let vm_error = |m: String| {
            ProviderError::other(format!("vSphere: VM {} in vCenter {}: {m}", vm.name, vc.name))
        };
        let preferred = static_addresses(&vm.guestinfo).map_err(vm_error)?;
        let node_addresses = select_addresses(
            &vm.nics,
            &vm.guest_host_name,
            &vc.ip_families,
            &self.nodes,
            &preferred,
        )
        .map_err(vm_error)?;
        let (zone, region) = self.topology(vc, vm).await?;
        Ok(InstanceMetadata {
            provider_id: format!("{PROVIDER_ID_PREFIX}{}", vm.uuid.to_ascii_lowercase()),
            instance_type: instance_type(vm),
            node_addresses,
            zone,
            region,
            additional_labels: BTreeMap::new(),
        })
    }
}

/// [`tags_up_from`] through the vCenter's shared walks: one walk per object at a time,
/// reused while `wanted` takes it (keyed by the category IDs too: categories read again
/// after a rename never meet a walk made with the old ones).
async fn shared_tags_up_from(
    vc: &Arc<VCenterConn>,
    start: MoRef,
    category_names: &BTreeMap<String, String>,
    wanted: usize,
    wanted_walk: Wanted,
) -> Result<Arc<Fetched<BTreeMap<String, String>>>, ProviderError> {
    let ids: Vec<&str> = category_names.keys().map(String::as_str).collect();
    let key = format!("{start} {}", ids.join(","));
    let (conn, categories) = (Arc::clone(vc), category_names.clone());
    let fetch = move || async move { tags_up_from(&conn, start, &categories, wanted).await };
    vc.walks.get(&key, wanted_walk, fetch, ProviderError::other).await
}

/// Category name → tag name, nearest to `start` first, walking up the `parent` chain.
async fn tags_up_from(
    vc: &VCenterConn,
    start: MoRef,
    category_names: &BTreeMap<String, String>,
    wanted: usize,
) -> Result<BTreeMap<String, String>, ProviderError> {
    let mut found = BTreeMap::new();
    let mut next = Some(start);
    let mut depth = 0;
    while let Some(object) = next {
        let mut tag_ids = vc
            .tagging
            .attached_tags(&object)
            .await
            .map_err(|e| client_error(&format!("listing tags of {object}"), e))?;
        tag_ids.sort();
        for id in tag_ids {
            let tag = vc.tagging.tag(&id).await.map_err(|e| client_error("reading a tag", e))?;
            if let Some(cat) = category_names.get(&tag.category_id) {
                found.entry(cat.clone()).or_insert(tag.name);
            }
        }
        depth += 1;
        if found.len() == wanted || depth > 32 {
            break;
        }
        next = vc
            .vim
            .parent(&object)
            .await
            .map_err(|e| client_error(&format!("reading the parent of {object}"), e))?;
    }
    Ok(found)
}

/// The instance type: `vsphere-vm.cpu-<n>.mem-<GiB, rounded down>gb.os-<os>`, `<os>` the
/// short name [`guest_os`] gives the guest ID (upstream's names).
pub fn instance_type(vm: &VmInfo) -> String {
    format!(
        "vsphere-vm.cpu-{}.mem-{}gb.os-{}",
        vm.num_cpu,
        vm.memory_mb / 1024,
        guest_os(&vm.guest_id)
    )
}

/// Upstream's short name for a vSphere guest OS identifier; `unknown` for any other.
pub fn guest_os(guest_id: &str) -> &'static str {
    GUEST_OS.iter().find(|(id, _)| *id == guest_id).map(|(_, os)| *os).unwrap_or("unknown")
}

fn usable(ip: &IpAddr) -> bool {
    if ip.is_loopback() || ip.is_unspecified() || ip.is_multicast() {
        return false;
    }
    match ip {
        IpAddr::V4(v4) => !v4.is_link_local(),
        IpAddr::V6(v6) => (v6.segments()[0] & 0xffc0) != 0xfe80,
    }
}

fn in_any(ip: &IpAddr, nets: &[ipnet::IpNet]) -> bool {
    nets.iter().any(|n| n.contains(ip))
}

fn same_network(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b) || a.to_lowercase() == b.to_lowercase()
}

/// Cloud-init's network config in `guestinfo.metadata` (upstream reads the same): the
/// static addresses of its `network.ethernets.*.addresses`, in order (interfaces by name).
///
/// Only read when `guestinfo.metadata.encoding` is `base64`; the decoded YAML carries
/// `network` either as a mapping or, with `network.encoding: base64|b64|gzip+base64|gz+b64`,
/// as an encoded string. Empty when there is no such metadata; an error when it is there
/// but unreadable (upstream fails the same way).
pub fn static_addresses(guestinfo: &BTreeMap<String, String>) -> Result<Vec<IpAddr>, String> {
    let metadata = guestinfo.get("guestinfo.metadata").map(|s| s.trim()).unwrap_or_default();
    let encoding = guestinfo.get("guestinfo.metadata.encoding").map(|s| s.trim());
    if metadata.is_empty() || encoding != Some("base64") {
        return Ok(Vec::new());
    }
    let b64 = |what: &str, s: &str| {
        let compact: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        base64::engine::general_purpose::STANDARD
            .decode(compact)
            .map_err(|e| format!("{what} is not valid base64: {e}"))
    };
    let decoded = b64("guestinfo.metadata", metadata)?;
    let doc = yaml("guestinfo.metadata", &decoded)?;
    let network_encoding =
        doc.get("network.encoding").and_then(|v| v.as_str()).unwrap_or_default().to_string();
    let network: serde_json::Value = match network_encoding.as_str() {
        "base64" | "b64" | "gzip+base64" | "gz+b64" => {
            let text = doc.get("network").and_then(|v| v.as_str()).unwrap_or_default();
            let mut raw = b64("guestinfo.metadata network", text)?;
            if network_encoding.starts_with("gz") {
                let mut out = Vec::new();
                flate2::read::GzDecoder::new(raw.as_slice())
                    .read_to_end(&mut out)
                    .map_err(|e| format!("guestinfo.metadata network is not gzip: {e}"))?;
                raw = out;
            }
            yaml("guestinfo.metadata network", &raw)?
        }
        _ => doc.get("network").cloned().unwrap_or_default(),
    };
    let mut out = Vec::new();
    let ethernets = network.get("ethernets").and_then(|e| e.as_object());
    for (_, eth) in ethernets.into_iter().flatten() {
        let addresses = eth.get("addresses").and_then(|a| a.as_array());
        for address in addresses.into_iter().flatten().filter_map(|a| a.as_str()) {
            let ip = address.split('/').next().unwrap_or_default().trim();
            if let Ok(ip) = ip.parse::<IpAddr>()
                && !out.contains(&ip)
            {
                out.push(ip);
            }
        }
    }
    Ok(out)
}

fn yaml(what: &str, bytes: &[u8]) -> Result<serde_json::Value, String> {
    let text = std::str::from_utf8(bytes).map_err(|e| format!("{what} is not UTF-8: {e}"))?;
    let options = serde_saphyr::options! { with_snippet: false };
    serde_saphyr::from_str_with_options::<serde_json::Value>(text, options)
        .map_err(|e| format!("{what} is not YAML: {e}"))
}

/// Chooses node addresses from the guest NICs: the Hostname first, then per IP family (in
/// order) one InternalIP and one ExternalIP.
///
/// NICs that are not vNICs (`deviceConfigId == -1`: docker0, CNI bridges) and loopback,
/// link-local, multicast and unspecified addresses are never used. Addresses in
/// `preferred` (the static ones from `guestinfo.metadata`) come first, in that order, the
/// rest in NIC order. For each of internal/external (after its exclusion list): the first
/// IP in the configured subnets (subnet order), else the first IP of a NIC on the
/// configured network (names compared case-insensitively). With no selector configured at
/// all, the first IP is both. A side without a selector gets no address when the other
/// side's selector matched. A configured selector that matches nothing on both sides
/// leaves the family without addresses (no fallback to an arbitrary IP, which could be a
/// VIP). Fails when no NIC is reported, when both network names are configured and the VM
/// is on neither, or when the first family yields no address at all.
pub fn select_addresses(
    nics: &[GuestNic],
    host_name: &str,
    families: &[IpFamily],
    sel: &NodeSelection,
    preferred: &[IpAddr],
) -> Result<Vec<NodeAddress>, String> {
    if nics.is_empty() {
        return Err("VMware Tools reports no network interfaces (is VMware Tools running?)".into());
    }
    let vnics: Vec<&GuestNic> = nics.iter().filter(|n| n.device_config_id != Some(-1)).collect();
    if let (Some(int), Some(ext)) = (&sel.internal_network, &sel.external_network)
        && !vnics.iter().any(|n| same_network(&n.network, int) || same_network(&n.network, ext))
    {
        return Err(format!(
            "the VM has no NIC on network {int:?} or {ext:?} (it is on: {})",
            vnics.iter().map(|n| n.network.as_str()).collect::<Vec<_>>().join(", ")
        ));
    }
    let mut candidates: Vec<(&str, IpAddr)> = vnics
        .iter()
        .flat_map(|n| {
            n.ip_addresses.iter().filter_map(move |ip| Some((n.network.as_str(), ip.parse().ok()?)))
        })
        .filter(|(_, ip)| usable(ip))
        .collect();
    if candidates.is_empty() {
        return Err(format!(
            "no usable address on the VM's vNICs ({})",
            nics.iter()
                .flat_map(|n| n.ip_addresses.iter().map(String::as_str))
                .collect::<Vec<_>>()
                .join(", ")
        ));
    }
    let rank = |ip: &IpAddr| preferred.iter().position(|p| p == ip).unwrap_or(usize::MAX);
    candidates.sort_by_key(|(_, ip)| rank(ip));
    let any_selector = !sel.internal_subnets.is_empty()
        || !sel.external_subnets.is_empty()
        || sel.internal_network.is_some()
        || sel.external_network.is_some();
    let mut out: Vec<NodeAddress> = Vec::new();
    let mut push = |kind: &str, address: String| {
        let a = NodeAddress { type_: kind.to_string(), address };
        if !out.contains(&a) {
            out.push(a);
        }
    };
    if !host_name.is_empty() {
        push("Hostname", host_name.to_string());
    }
    for (i, family) in families.iter().enumerate() {
        let of_family: Vec<(&str, IpAddr)> = candidates
            .iter()
            .copied()
            .filter(|(_, ip)| {
                matches!(
                    (family, ip),
                    (IpFamily::V4, IpAddr::V4(_)) | (IpFamily::V6, IpAddr::V6(_))
                )
            })
            .collect();
        let allowed = |exclude: &[ipnet::IpNet]| -> Vec<(&str, IpAddr)> {
            of_family.iter().copied().filter(|(_, ip)| !in_any(ip, exclude)).collect()
        };
        let internal_pool = allowed(&sel.exclude_internal_subnets);
        let external_pool = allowed(&sel.exclude_external_subnets);
        let choose =
            |pool: &[(&str, IpAddr)], subnets: &[ipnet::IpNet], network: &Option<String>| {
                subnets
                    .iter()
                    .find_map(|net| pool.iter().find(|(_, ip)| net.contains(ip)))
                    .or_else(|| {
                        network
                            .as_ref()
                            .and_then(|want| pool.iter().find(|(n, _)| same_network(n, want)))
                    })
                    .map(|(_, ip)| *ip)
            };
        let mut internal = choose(&internal_pool, &sel.internal_subnets, &sel.internal_network);
        let mut external = choose(&external_pool, &sel.external_subnets, &sel.external_network);
        if internal.is_none() && external.is_none() && !any_selector {
            internal = internal_pool.first().map(|(_, ip)| *ip);
            external = external_pool.first().map(|(_, ip)| *ip);
        }
        let fam = match family {
            IpFamily::V4 => "IPv4",
            IpFamily::V6 => "IPv6",
        };
        if internal.is_none() && external.is_none() {
            if i == 0 {
                return Err(format!(
                    "no {fam} address of the guest ({}) matches the nodes address selection",
                    candidates.iter().map(|(_, ip)| ip.to_string()).collect::<Vec<_>>().join(", ")
                ));
            }
            tracing::warn!(
                family = fam,
                "no guest address of this family matches; the node gets none"
            );
        } else if internal.is_none() || external.is_none() {
            tracing::debug!(family = fam, internal = ?internal, external = ?external,
                "only one of InternalIP/ExternalIP matched the nodes address selection");
        }
        if let Some(ip) = internal {
            push("InternalIP", ip.to_string());
        }
        if let Some(ip) = external {
            push("ExternalIP", ip.to_string());
        }
    }
    Ok(out)
}

#[async_trait]
impl InstancesV2 for Instances {
    /// [`LOOKUP_BATCH`]: a batch shares the vCenters' UUID listings and one property read
    /// (the tags up from its hosts and resource pools are shared too, [`TOPOLOGY_TTL`]).
    fn max_batch(&self) -> usize {
        LOOKUP_BATCH
    }

    async fn instance_exists(&self, node: &Node) -> Result<bool, ProviderError> {
        let found = self.locate(node).await?.is_some();
        if !found && self.skip_node_deletion {
            tracing::info!(
                node = node.metadata.name.as_deref().unwrap_or_default(),
                "VM not found in any vCenter; keeping the Node (SKIP_NODE_DELETION)"
            );
            return Ok(true);
        }
        Ok(found)
    }

    async fn instance_shutdown(&self, node: &Node) -> Result<bool, ProviderError> {
        Ok(self.status(node).await? == InstanceStatus::Shutdown)
    }

    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata, ProviderError> {
        self.metadata(node).await
    }

    /// Nodes whose first lookup is a BIOS UUID (a providerID, or a kubelet's systemUUID) are
    /// found in one listing of every VM's UUID per vCenter (shared by concurrent batches,
    /// [`UUID_LISTING_TTL`]) and their VMs read in one property read per vCenter, where each
    /// costs a search and a read alone. Only a UUID that exactly one VM of one vCenter has,
    /// with every vCenter listed, is taken from the listing; every other Node (a UUID the
    /// listing lacks or shows twice, a VM gone before the read, a failed listing) is looked
    /// up alone as before, so the answer is the one the search gives and "not found" still
    /// rests on the searches only.
    async fn instance_metadata_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceMetadata, ProviderError>> {
        let pass = Instant::now();
        // The VM each Node's listing gave, read in one call per vCenter.
        let mut read: Vec<Option<(Arc<VCenterConn>, VmInfo)>> =
            nodes.iter().map(|_| None).collect();
        for (vc, wanted) in self.listed_vms(nodes, pass).await {
            let morefs: Vec<MoRef> = wanted.iter().map(|(_, vm)| vm.clone()).collect();
            let infos = match vc.vim.vm_infos(&morefs).await {
                Ok(infos) => infos,
                Err(e) => {
                    tracing::debug!(vcenter = %vc.name, error = %e,
                        "reading the VMs of a batch failed; looking them up one by one");
                    continue;
                }
            };
            let infos: std::collections::HashMap<MoRef, VmInfo> =
                infos.into_iter().map(|info| (info.moref.clone(), info)).collect();
            for (i, vm) in wanted {
                read[i] = infos.get(&vm).map(|info| (Arc::clone(&vc), info.clone()));
            }
        }
        // Then every Node, SEARCH_CONCURRENCY at a time: from its VM as read, else alone.
        let lookups: Vec<_> = nodes
            .iter()
            .zip(read)
            .map(|(node, read)| async move {
                match read {
                    Some((vc, info)) => self.metadata_of(&vc, &info).await,
                    None => self.metadata(node).await,
                }
            })
            .collect();
        futures::stream::iter(lookups).buffered(SEARCH_CONCURRENCY).collect().await
    }

    async fn instance_status_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceStatus, ProviderError>> {
        // One search and one property read per node (the default would search twice), at
        // most SEARCH_CONCURRENCY nodes at a time, answers in the nodes' order.
        let lookups: Vec<_> = nodes.iter().map(|n| self.status(n)).collect();
        futures::stream::iter(lookups).buffered(SEARCH_CONCURRENCY).collect().await
    }
}

/// vSphere guest OS identifier → upstream's short name (its `GuestOSLookup`).
const GUEST_OS: &[(&str, &str)] = &[
    ("asianux3_64Guest", "asianux3"),
    ("asianux3Guest", "asianux3"),
    ("asianux4_64Guest", "asianux4"),
    ("asianux4Guest", "asianux4"),
    ("asianux5_64Guest", "asianux5"),
    ("asianux7_64Guest", "asianux7"),
    ("centos6_64Guest", "centos6"),
    ("centos64Guest", "centos64"),
    ("centos6Guest", "centos6"),
    ("centos7_64Guest", "centos7"),
    ("centos7Guest", "centos7"),
    ("centosGuest", "centos"),
    ("coreos64Guest", "coreos"),
    ("darwin10_64Guest", "darwin"),
    ("darwin10Guest", "darwin"),
    ("darwin11_64Guest", "darwin"),
    ("darwin11Guest", "darwin"),
    ("darwin12_64Guest", "darwin"),
    ("darwin13_64Guest", "darwin"),
    ("darwin14_64Guest", "darwin"),
    ("darwin15_64Guest", "darwin"),
    ("darwin16_64Guest", "darwin"),
    ("darwin64Guest", "darwin"),
    ("darwinGuest", "darwin"),
    ("debian10_64Guest", "debian10"),
    ("debian10Guest", "debian10"),
    ("debian4_64Guest", "debian4"),
    ("debian4Guest", "debian4"),
    ("debian5_64Guest", "debian5"),
    ("debian5Guest", "debian5"),
    ("debian6_64Guest", "debian6"),
    ("debian6Guest", "debian6"),
    ("debian7_64Guest", "debian7"),
    ("debian7Guest", "debian7"),
    ("debian8_64Guest", "debian8"),
    ("debian8Guest", "debian8"),
    ("debian9_64Guest", "debian9"),
    ("debian9Guest", "debian9"),
    ("dosGuest", "dos"),
    ("eComStation2Guest", "eComStation2"),
    ("eComStationGuest", "eComStation"),
    ("fedora64Guest", "fedora"),
    ("fedoraGuest", "fedora"),
    ("freebsd64Guest", "freebsd"),
    ("freebsdGuest", "freebsd"),
    ("genericLinuxGuest", "linux"),
    ("mandrakeGuest", "mandrake"),
    ("mandriva64Guest", "mandriva"),
    ("mandrivaGuest", "mandriva"),
    ("netware4Guest", "netware4"),
    ("netware5Guest", "netware5"),
    ("netware6Guest", "netware6"),
    ("nld9Guest", "nld9"),
    ("oesGuest", "oes"),
    ("openServer5Guest", "openServer5"),
    ("openServer6Guest", "openServer6"),
    ("opensuse64Guest", "opensuse"),
    ("opensuseGuest", "opensuse"),
    ("oracleLinux6_64Guest", "oracleLinux6"),
    ("oracleLinux64Guest", "oracleLinux"),
    ("oracleLinux6Guest", "oracleLinux6"),
    ("oracleLinux7_64Guest", "oracleLinux7"),
    ("oracleLinux7Guest", "oracleLinux7"),
    ("oracleLinuxGuest", "oracleLinux"),
    ("os2Guest", "os2"),
    ("other24xLinux64Guest", "linux"),
    ("other24xLinuxGuest", "linux"),
    ("other26xLinux64Guest", "linux"),
    ("other26xLinuxGuest", "linux"),
    ("other3xLinux64Guest", "linux"),
    ("other3xLinuxGuest", "linux"),
    ("otherGuest", "other"),
    ("otherGuest64", "other"),
    ("otherLinux64Guest", "linux"),
    ("otherLinuxGuest", "linux"),
    ("redhatGuest", "rhel"),
    ("rhel2Guest", "rhel2"),
    ("rhel3_64Guest", "rhel3"),
    ("rhel3Guest", "rhel3"),
    ("rhel4_64Guest", "rhel4"),
    ("rhel4Guest", "rhel4"),
    ("rhel5_64Guest", "rhel5"),
    ("rhel5Guest", "rhel5"),
    ("rhel6_64Guest", "rhel6"),
    ("rhel6Guest", "rhel6"),
    ("rhel7_64Guest", "rhel7"),
    ("rhel7Guest", "rhel7"),
    ("rhel8_64Guest", "rhel8"),
    ("rhel9_64Guest", "rhel9"),
    ("rhel10_64Guest", "rhel10"),
    ("sjdsGuest", "sjds"),
    ("sles10_64Guest", "sles10"),
    ("sles10Guest", "sles10"),
    ("sles11_64Guest", "sles11"),
    ("sles11Guest", "sles11"),
    ("sles12_64Guest", "sles12"),
    ("sles12Guest", "sles12"),
    ("sles64Guest", "sles64"),
    ("slesGuest", "sles"),
    ("solaris10_64Guest", "solaris10"),
    ("solaris10Guest", "solaris10"),
    ("solaris11_64Guest", "solaris11"),
    ("solaris6Guest", "solaris6"),
    ("solaris7Guest", "solaris7"),
    ("solaris8Guest", "solaris8"),
    ("solaris9Guest", "solaris9"),
    ("suse64Guest", "suse"),
    ("suseGuest", "suse"),
    ("turboLinux64Guest", "turbolinux"),
    ("turboLinuxGuest", "turbolinux"),
    ("ubuntu64Guest", "ubuntu"),
    ("ubuntuGuest", "ubuntu"),
    ("unixWare7Guest", "unixware7"),
    ("vmkernel5Guest", "vmkernel5"),
    ("vmkernel65Guest", "vmkernel65"),
    ("vmkernel6Guest", "vmkernel6"),
    ("vmkernelGuest", "vmkernel"),
    ("vmwarePhoton64Guest", "photon"),
    ("win2000AdvServGuest", "win2000advserv"),
    ("win2000ProGuest", "win2000pro"),
    ("win2000ServGuest", "win2000serv"),
    ("win31Guest", "win31"),
    ("win95Guest", "win95"),
    ("win98Guest", "win98"),
    ("windows7_64Guest", "win7"),
    ("windows7Guest", "win7"),
    ("windows7Server64Guest", "win7server"),
    ("windows8_64Guest", "win8"),
    ("windows8Guest", "win8"),
    ("windows8Server64Guest", "win8server"),
    ("windows9_64Guest", "win10"),
    ("windows9Guest", "win10"),
    ("windows9Server64Guest", "win10server"),
    ("windowsHyperVGuest", "windowshyperv"),
    ("winLonghorn64Guest", "winlonghorn"),
    ("winLonghornGuest", "winlonghorn"),
    ("winMeGuest", "winme"),
    ("winNetBusinessGuest", "winnetbusiness"),
    ("winNetDatacenter64Guest", "winnetdatacenter"),
    ("winNetDatacenterGuest", "winnetdatacenter"),
    ("winNetEnterprise64Guest", "winnetenterprise"),
    ("winNetEnterpriseGuest", "winnetenterprise"),
    ("winNetStandard64Guest", "winnetstandard"),
    ("winNetStandardGuest", "winnetstandard"),
    ("winNetWebGuest", "winnetweb"),
    ("winNTGuest", "winnt"),
    ("winVista64Guest", "winvista"),
    ("winVistaGuest", "winvista"),
    ("winXPHomeGuest", "winxphome"),
    ("winXPPro64Guest", "winxppro"),
    ("winXPProGuest", "winxppro"),
];

#[cfg(test)]
mod tests {
    use super::*;
    use base64::engine::general_purpose::STANDARD;
    use std::io::Write as _;

    fn nic(network: &str, ips: &[&str]) -> GuestNic {
        GuestNic {
            network: network.into(),
            device_config_id: Some(4000),
            ip_addresses: ips.iter().map(|s| s.to_string()).collect(),
            mac_address: String::new(),
        }
    }

    fn addrs(v: &[NodeAddress]) -> Vec<(String, String)> {
        v.iter().map(|a| (a.type_.clone(), a.address.clone())).collect()
    }

    fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
        v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
    }

    fn select(
        nics: &[GuestNic],
        host: &str,
        sel: &NodeSelection,
    ) -> Result<Vec<(String, String)>, String> {
        select_addresses(nics, host, &[IpFamily::V4], sel, &[]).map(|a| addrs(&a))
    }

    #[test]
    fn default_selection_puts_the_hostname_first_and_uses_the_first_usable_ip_for_both() {
        let nics =
            [nic("VM Network", &["127.0.0.1", "fe80::1", "169.254.0.9", "10.0.0.5", "10.0.0.6"])];
        assert_eq!(
            select(&nics, "node-a", &NodeSelection::default()).unwrap(),
            pairs(&[
                ("Hostname", "node-a"),
                ("InternalIP", "10.0.0.5"),
                ("ExternalIP", "10.0.0.5"),
            ])
        );
    }

    #[test]
    fn subnets_network_names_and_exclusions_select() {
        let nics =
            [nic("internal", &["192.168.1.10", "10.0.0.100"]), nic("Public", &["203.0.113.7"])];
        let sel = NodeSelection {
            internal_subnets: vec!["10.0.0.0/24".parse().unwrap()],
            external_network: Some("public".into()),
            ..Default::default()
        };
        assert_eq!(
            select(&nics, "", &sel).unwrap(),
            pairs(&[("InternalIP", "10.0.0.100"), ("ExternalIP", "203.0.113.7")])
        );

        let sel = NodeSelection {
            exclude_internal_subnets: vec!["192.168.0.0/16".parse().unwrap()],
            exclude_external_subnets: vec![
                "192.168.0.0/16".parse().unwrap(),
                "10.0.0.0/8".parse().unwrap(),
            ],
            ..Default::default()
        };
        assert_eq!(
            select(&nics, "", &sel).unwrap(),
            pairs(&[("InternalIP", "10.0.0.100"), ("ExternalIP", "203.0.113.7")])
        );
    }

    #[test]
    fn a_subnet_that_matches_nothing_falls_back_to_the_network_name() {
        let nics = [nic("VM Network", &["192.168.1.10"]), nic("k8s", &["10.1.0.5"])];
        let sel = NodeSelection {
            internal_subnets: vec!["172.16.0.0/12".parse().unwrap()],
            internal_network: Some("K8S".into()),
            ..Default::default()
        };
        assert_eq!(
            select(&nics, "h", &sel).unwrap(),
            pairs(&[("Hostname", "h"), ("InternalIP", "10.1.0.5")])
        );
    }

    #[test]
    fn only_an_internal_selector_gives_no_external_ip() {
        let nics = [nic("VM Network", &["192.168.1.10", "10.1.0.5"])];
        let sel = NodeSelection {
            internal_subnets: vec!["10.1.0.0/16".parse().unwrap()],
            ..Default::default()
        };
        assert_eq!(
            select(&nics, "h", &sel).unwrap(),
            pairs(&[("Hostname", "h"), ("InternalIP", "10.1.0.5")])
        );
    }

    #[test]
    fn non_vnic_interfaces_are_skipped() {
        let mut bridge = nic("", &["172.17.0.1"]);
        bridge.device_config_id = Some(-1);
        let nics = [bridge, nic("VM Network", &["10.0.0.5"])];
        assert_eq!(
            select(&nics, "h", &NodeSelection::default()).unwrap(),
            pairs(&[("Hostname", "h"), ("InternalIP", "10.0.0.5"), ("ExternalIP", "10.0.0.5")])
        );
        let err = select(&nics[..1], "h", &NodeSelection::default()).unwrap_err();
        assert!(err.contains("no usable address"), "{err}");
    }

    #[test]
    fn both_network_names_missing_is_an_error() {
        let nics = [nic("VM Network", &["10.0.0.5"])];
        let sel = NodeSelection {
            internal_network: Some("a".into()),
            external_network: Some("b".into()),
            ..Default::default()
        };
        let err = select(&nics, "h", &sel).unwrap_err();
        assert!(err.contains("VM Network"), "{err}");
    }

    #[test]
    fn static_addresses_come_first() {
        let nics = [nic("VM Network", &["10.0.0.200", "10.0.0.5"])];
        let preferred: Vec<IpAddr> = vec!["10.0.0.5".parse().unwrap()];
        let got =
            select_addresses(&nics, "h", &[IpFamily::V4], &NodeSelection::default(), &preferred)
                .unwrap();
        assert_eq!(
            addrs(&got),
            pairs(&[("Hostname", "h"), ("InternalIP", "10.0.0.5"), ("ExternalIP", "10.0.0.5")])
        );
    }

    fn metadata(doc: &str) -> BTreeMap<String, String> {
        BTreeMap::from([
            ("guestinfo.metadata".to_string(), STANDARD.encode(doc)),
            ("guestinfo.metadata.encoding".to_string(), "base64".to_string()),
        ])
    }

    #[test]
    fn static_addresses_are_read_from_cloud_init_metadata_in_every_encoding() {
        let network =
            "version: 2\nethernets:\n  id0:\n    addresses: [10.0.0.5/24, \"fd00::5/64\"]\n";
        let expected: Vec<IpAddr> = vec!["10.0.0.5".parse().unwrap(), "fd00::5".parse().unwrap()];
        let raw = format!("local-hostname: n\nnetwork:\n  {}", network.replace('\n', "\n  "));
        assert_eq!(static_addresses(&metadata(&raw)).unwrap(), expected);
        let b64 = format!("network.encoding: base64\nnetwork: {}\n", STANDARD.encode(network));
        assert_eq!(static_addresses(&metadata(&b64)).unwrap(), expected);
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(network.as_bytes()).unwrap();
        let gz = format!(
            "network.encoding: gzip+base64\nnetwork: {}\n",
            STANDARD.encode(gz.finish().unwrap())
        );
        assert_eq!(static_addresses(&metadata(&gz)).unwrap(), expected);
        // Not base64 (upstream reads only base64) or absent: nothing preferred.
        let mut plain = metadata(&raw);
        plain.insert("guestinfo.metadata.encoding".into(), "yaml".into());
        assert!(static_addresses(&plain).unwrap().is_empty());
        assert!(static_addresses(&BTreeMap::new()).unwrap().is_empty());
        let mut bad = metadata(&raw);
        bad.insert("guestinfo.metadata".into(), "%%%".into());
        assert!(static_addresses(&bad).unwrap_err().contains("base64"));
    }

    #[test]
    fn dual_stack_gives_one_pair_per_family_in_order() {
        let nics = [nic("n", &["fd00::5", "10.0.0.5"])];
        let got = select_addresses(
            &nics,
            "h",
            &[IpFamily::V6, IpFamily::V4],
            &NodeSelection::default(),
            &[],
        )
        .unwrap();
        assert_eq!(
            addrs(&got),
            pairs(&[
                ("Hostname", "h"),
                ("InternalIP", "fd00::5"),
                ("ExternalIP", "fd00::5"),
                ("InternalIP", "10.0.0.5"),
                ("ExternalIP", "10.0.0.5"),
            ])
        );
    }

    #[test]
    fn no_nics_or_no_match_is_an_error() {
        assert!(select(&[], "h", &NodeSelection::default()).is_err());
        let sel = NodeSelection {
            internal_subnets: vec!["10.9.0.0/16".parse().unwrap()],
            ..Default::default()
        };
        let sel = NodeSelection { external_subnets: sel.internal_subnets.clone(), ..sel };
        let err = select(&[nic("n", &["10.0.0.5"])], "h", &sel).unwrap_err();
        assert!(err.contains("10.0.0.5"), "{err}");
    }

    #[test]
    fn guest_os_names_are_upstreams() {
        assert_eq!(guest_os("ubuntu64Guest"), "ubuntu");
        assert_eq!(guest_os("otherGuest"), "other");
        assert_eq!(guest_os("otherLinux64Guest"), "linux");
        assert_eq!(guest_os("vmwarePhoton64Guest"), "photon");
        assert_eq!(guest_os("rhel9_64Guest"), "rhel9");
        assert_eq!(guest_os("windows9Server64Guest"), "win10server");
        assert_eq!(guest_os("somethingNew64Guest"), "unknown");
        assert_eq!(guest_os(""), "unknown");
    }

    #[test]
    fn uuids_are_byte_swapped_like_smbios() {
        assert_eq!(
            swap_uuid_bytes("56492E42-22ad-3911-6d72-59cc8f26bc90").as_deref(),
            Some("422e4956-ad22-1139-6d72-59cc8f26bc90")
        );
        assert_eq!(
            swap_uuid_bytes("422e4956-ad22-1139-6d72-59cc8f26bc90").as_deref(),
            Some("56492e42-22ad-3911-6d72-59cc8f26bc90")
        );
        assert_eq!(swap_uuid_bytes("abc"), None);
        assert_eq!(swap_uuid_bytes("zz492e42-22ad-3911-6d72-59cc8f26bc90"), None);
    }

    #[test]
    fn lookups_are_tried_in_upstreams_order() {
        let uuid = "56492e42-22ad-3911-6d72-59cc8f26bc90";
        let swapped = "422e4956-ad22-1139-6d72-59cc8f26bc90";
        let mut node = Node::default();
        node.metadata.name = Some("Node-A".into());
        assert_eq!(node_keys(&node).unwrap(), vec![Key::DnsName("node-a".into())]);
        node.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            node_info: Some(k8s_openapi::api::core::v1::NodeSystemInfo {
                system_uuid: uuid.to_uppercase(),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(
            node_keys(&node).unwrap(),
            vec![Key::Uuid(uuid.into()), Key::Uuid(swapped.into()), Key::DnsName("node-a".into())]
        );
        node.metadata.name = Some("10.0.0.5".into());
        assert_eq!(node_keys(&node).unwrap()[2], Key::Ip("10.0.0.5".into()));
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some(format!("vsphere://{}", swapped.to_uppercase())),
            ..Default::default()
        });
        assert_eq!(
            node_keys(&node).unwrap(),
            vec![Key::Uuid(swapped.into()), Key::Uuid(uuid.into())]
        );
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some("vsphere://ABC-def".into()),
            ..Default::default()
        });
        assert_eq!(node_keys(&node).unwrap(), vec![Key::Uuid("abc-def".into())]);
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some("aws:///i-1".into()),
            ..Default::default()
        });
        assert!(matches!(node_keys(&node), Err(ProviderError::Invalid { .. })));
    }
}
