//! `InstancesV2` for vSphere: finds the VM behind a Node in every datacenter of every
//! configured vCenter and reports its providerID, addresses, instance type, zone/region and
//! power state.
//!
//! - Lookup: `vsphere://<bios-uuid>` → `SearchIndex.FindByUuid`; without a providerID the
//!   node name → `FindAllByDnsName` (the guest host name VMware Tools reports), and, when
//!   the name is an IP address, `FindByIp`.
//! - "Gone" (`Ok(false)` / [`InstanceStatus::NotFound`]) is only answered when every
//!   vCenter answered the search and none has the VM. Any vCenter error makes the answer an
//!   error, so an unreachable vCenter never gets Nodes deleted.
//! - Addresses: [`select_addresses`] (one InternalIP and one ExternalIP per configured IP
//!   family, chosen by subnet, network name or exclusion lists; then the Hostname).
//! - Zone/region: tags of the configured categories on the VM's host or its nearest
//!   ancestor (cluster, folders, datacenter), read through the tagging REST API.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use async_trait::async_trait;
use ccm_core::cloud::{InstanceMetadata, InstanceStatus, InstancesV2, ProviderError};
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use tokio::sync::{Mutex, OnceCell};

use crate::client::tagging::TaggingClient;
use crate::client::vim25::{GuestNic, PowerState, Vim25Client, VmInfo};
use crate::client::{ClientError, MoRef};
use crate::config::{IpFamily, Labels, NodeSelection};

/// The providerID scheme.
pub const PROVIDER_ID_PREFIX: &str = "vsphere://";

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
    datacenters: OnceCell<Vec<MoRef>>,
    categories: Mutex<BTreeMap<String, String>>,
}

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
            datacenters: OnceCell::new(),
            categories: Mutex::new(BTreeMap::new()),
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

    /// The datacenters to search (resolved once, on first success).
    async fn datacenters(&self) -> Result<&[MoRef], ProviderError> {
        let dcs = self
            .datacenters
            .get_or_try_init(|| async {
                let all = self
                    .vim
                    .datacenters()
                    .await
                    .map_err(|e| client_error("listing datacenters", e))?;
                if self.datacenter_names.is_empty() {
                    return Ok(all.into_values().collect());
                }
                self.datacenter_names
                    .iter()
                    .map(|name| {
                        all.get(name).cloned().ok_or_else(|| ProviderError::Invalid {
                            what: format!("datacenter {name:?} of vCenter {}", self.name),
                            message: format!(
                                "not found; the vCenter has: {}",
                                all.keys().cloned().collect::<Vec<_>>().join(", ")
                            ),
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .await?;
        Ok(dcs)
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

fn node_key(node: &Node) -> Result<Key, ProviderError> {
    let provider_id = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default();
    if !provider_id.is_empty() {
        let uuid = provider_id
            .strip_prefix(PROVIDER_ID_PREFIX)
            .filter(|u| !u.is_empty())
            .ok_or_else(|| ProviderError::Invalid {
                what: "spec.providerID".into(),
                message: format!("{provider_id:?} is not a vsphere://<uuid> providerID"),
            })?;
        return Ok(Key::Uuid(uuid.to_ascii_lowercase()));
    }
    let name = node.metadata.name.clone().unwrap_or_default();
    if name.is_empty() {
        return Err(ProviderError::Invalid {
            what: "node".into(),
            message: "has neither providerID nor name".into(),
        });
    }
    if name.parse::<IpAddr>().is_ok() {
        return Ok(Key::Ip(name));
    }
    Ok(Key::DnsName(name))
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

    /// Finds the VM: `Ok(None)` only when every vCenter answered and none has it.
    async fn locate(
        &self,
        node: &Node,
    ) -> Result<Option<(Arc<VCenterConn>, MoRef)>, ProviderError> {
        let key = node_key(node)?;
        if let Some((name, why)) =
            self.waiting.read().unwrap_or_else(|e| e.into_inner()).iter().next()
        {
            return Err(ProviderError::other(format!(
                "vSphere: vCenter {name} is not connected: {why}"
            )));
        }
        let vcenters = self.vcenters.read().unwrap_or_else(|e| e.into_inner()).clone();
        let searches = vcenters.iter().map(|vc| {
            let key = key.clone();
            async move { (vc.clone(), search_one(vc, &key).await) }
        });
        let mut first_error = None;
        for (vc, result) in futures::future::join_all(searches).await {
            match result {
                Ok(Some(vm)) => return Ok(Some((vc, vm))),
                Ok(None) => {}
                Err(e) => {
                    tracing::warn!(vcenter = %vc.name, error = %e, "vCenter search failed");
                    first_error.get_or_insert(e);
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(None),
        }
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

    /// Zone and region from tags on the VM's host or its nearest ancestor.
    async fn topology(
        &self,
        vc: &VCenterConn,
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
        let found = self.tags_up_the_tree(vc, vm, &wanted).await?;
        let get =
            |c: &Option<String>| c.as_ref().and_then(|c| found.get(c)).cloned().unwrap_or_default();
        Ok((get(&self.labels.zone), get(&self.labels.region)))
    }

    /// For each wanted category name, the tag nearest to the VM's host (host first).
    async fn tags_up_the_tree(
        &self,
        vc: &VCenterConn,
        vm: &VmInfo,
        wanted: &[&str],
    ) -> Result<BTreeMap<String, String>, ProviderError> {
        let category_names = vc.categories(wanted).await?;
        for name in wanted {
            if !category_names.values().any(|n| n == name) {
                return Err(ProviderError::Invalid {
                    what: format!("labels category {name:?}"),
                    message: format!("no tag category with this name in vCenter {}", vc.name),
                });
            }
        }
        let mut found = BTreeMap::new();
        let mut next = vm.host.clone();
        let mut depth = 0;
        while let Some(object) = next {
            let mut tag_ids = vc
                .tagging
                .attached_tags(&object)
                .await
                .map_err(|e| client_error(&format!("listing tags of {object}"), e))?;
            tag_ids.sort();
            for id in tag_ids {
                let tag =
                    vc.tagging.tag(&id).await.map_err(|e| client_error("reading a tag", e))?;
                if let Some(cat) = category_names.get(&tag.category_id) {
                    found.entry(cat.clone()).or_insert(tag.name);
                }
            }
            if found.len() == wanted.len() || object.kind == "Datacenter" {
                break;
            }
            depth += 1;
            if depth > 32 {
                break;
            }
            next = vc
                .vim
                .parent(&object)
                .await
                .map_err(|e| client_error(&format!("reading the parent of {object}"), e))?;
        }
        for name in wanted {
            if !found.contains_key(*name) {
                tracing::warn!(vm = %vm.name, vcenter = %vc.name, category = name,
                    "no tag of this category on the VM's host or its ancestors; the label stays unset");
            }
        }
        Ok(found)
    }

    async fn metadata(&self, node: &Node) -> Result<InstanceMetadata, ProviderError> {
        let Some((vc, vm)) = self.vm(node).await? else {
            return Err(ProviderError::InstanceNotFound);
        };
        if vm.uuid.is_empty() {
            return Err(ProviderError::other(format!(
                "vSphere: VM {} in vCenter {} has no BIOS UUID",
                vm.name, vc.name
            )));
        }
        let node_addresses = select_addresses(
            &vm.nics,
            &vm.guest_host_name,
            &vc.ip_families,
            &self.nodes,
        )
        .map_err(|m| {
            ProviderError::other(format!("vSphere: VM {} in vCenter {}: {m}", vm.name, vc.name))
        })?;
        let (zone, region) = self.topology(&vc, &vm).await?;
        Ok(InstanceMetadata {
            provider_id: format!("{PROVIDER_ID_PREFIX}{}", vm.uuid.to_ascii_lowercase()),
            instance_type: instance_type(&vm),
            node_addresses,
            zone,
            region,
            additional_labels: BTreeMap::new(),
        })
    }
}

async fn search_one(vc: &VCenterConn, key: &Key) -> Result<Option<MoRef>, ProviderError> {
    for dc in vc.datacenters().await? {
        let found = match key {
            Key::Uuid(uuid) => vc.vim.find_vm_by_uuid(Some(dc), uuid).await,
            Key::Ip(ip) => vc.vim.find_vm_by_ip(Some(dc), ip).await,
            Key::DnsName(name) => {
                vc.vim.find_vms_by_dns_name(Some(dc), name).await.map(|v| v.into_iter().next())
            }
        }
        .map_err(|e| client_error("searching the VM", e))?;
        if found.is_some() {
            return Ok(found);
        }
    }
    Ok(None)
}

/// The synthetic instance type: `vsphere-vm.cpu-<n>.mem-<gb>gb.os-<guestId>`.
pub fn instance_type(vm: &VmInfo) -> String {
    format!("vsphere-vm.cpu-{}.mem-{}gb.os-{}", vm.num_cpu, vm.memory_mb / 1024, vm.guest_id)
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

/// Chooses node addresses from the guest NICs: per IP family (in order) one InternalIP and
/// one ExternalIP, then the Hostname.
///
/// For each of internal/external: with subnets configured, the first IP in them; else with
/// a network name configured, the first IP of a NIC on that network; else the first IP not
/// in that side's exclusion list. Loopback, link-local and multicast addresses are never
/// used. A configured selector that matches nothing leaves that address out (no fallback to
/// an arbitrary IP, which could be a VIP). Fails when no NIC is reported or the first family
/// yields no address at all.
pub fn select_addresses(
    nics: &[GuestNic],
    host_name: &str,
    families: &[IpFamily],
    sel: &NodeSelection,
) -> Result<Vec<NodeAddress>, String> {
    if nics.is_empty() {
        return Err("VMware Tools reports no network interfaces (is VMware Tools running?)".into());
    }
    let candidates: Vec<(&str, IpAddr)> = nics
        .iter()
        .flat_map(|n| {
            n.ip_addresses.iter().filter_map(move |ip| Some((n.network.as_str(), ip.parse().ok()?)))
        })
        .filter(|(_, ip)| usable(ip))
        .collect();
    let mut out: Vec<NodeAddress> = Vec::new();
    let mut push = |kind: &str, ip: IpAddr| {
        let a = NodeAddress { type_: kind.to_string(), address: ip.to_string() };
        if !out.contains(&a) {
            out.push(a);
        }
    };
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
        let pick =
            |subnets: &[ipnet::IpNet], network: &Option<String>, exclude: &[ipnet::IpNet]| {
                let allowed = of_family.iter().filter(|(_, ip)| !in_any(ip, exclude));
                let mut allowed = allowed.clone();
                if !subnets.is_empty() {
                    allowed.find(|(_, ip)| in_any(ip, subnets)).map(|(_, ip)| *ip)
                } else if let Some(net) = network {
                    allowed.find(|(n, _)| n == net).map(|(_, ip)| *ip)
                } else {
                    allowed.next().map(|(_, ip)| *ip)
                }
            };
        let internal =
            pick(&sel.internal_subnets, &sel.internal_network, &sel.exclude_internal_subnets);
        let external =
            pick(&sel.external_subnets, &sel.external_network, &sel.exclude_external_subnets);
        if internal.is_none() && external.is_none() {
            let fam = match family {
                IpFamily::V4 => "IPv4",
                IpFamily::V6 => "IPv6",
            };
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
        }
        if let Some(ip) = internal {
            push("InternalIP", ip);
        }
        if let Some(ip) = external {
            push("ExternalIP", ip);
        }
    }
    if !host_name.is_empty() {
        out.push(NodeAddress { type_: "Hostname".into(), address: host_name.to_string() });
    }
    Ok(out)
}

#[async_trait]
impl InstancesV2 for Instances {
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

    async fn instance_status_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceStatus, ProviderError>> {
        // One search and one property read per node (the default would search twice).
        futures::future::join_all(nodes.iter().map(|n| self.status(n))).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nic(network: &str, ips: &[&str]) -> GuestNic {
        GuestNic {
            network: network.into(),
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

    #[test]
    fn default_selection_uses_first_usable_ip_for_both() {
        let nics =
            [nic("VM Network", &["127.0.0.1", "fe80::1", "169.254.0.9", "10.0.0.5", "10.0.0.6"])];
        let got =
            select_addresses(&nics, "node-a", &[IpFamily::V4], &NodeSelection::default()).unwrap();
        assert_eq!(
            addrs(&got),
            pairs(&[
                ("InternalIP", "10.0.0.5"),
                ("ExternalIP", "10.0.0.5"),
                ("Hostname", "node-a")
            ])
        );
    }

    #[test]
    fn subnets_network_names_and_exclusions_select() {
        let nics =
            [nic("internal", &["192.168.1.10", "10.0.0.100"]), nic("public", &["203.0.113.7"])];
        let sel = NodeSelection {
            internal_subnets: vec!["10.0.0.0/24".parse().unwrap()],
            external_network: Some("public".into()),
            ..Default::default()
        };
        let got = select_addresses(&nics, "", &[IpFamily::V4], &sel).unwrap();
        assert_eq!(
            addrs(&got),
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
        let got = select_addresses(&nics, "", &[IpFamily::V4], &sel).unwrap();
        assert_eq!(
            addrs(&got),
            pairs(&[("InternalIP", "10.0.0.100"), ("ExternalIP", "203.0.113.7")])
        );
    }

    #[test]
    fn dual_stack_gives_one_pair_per_family_in_order() {
        let nics = [nic("n", &["fd00::5", "10.0.0.5"])];
        let got =
            select_addresses(&nics, "h", &[IpFamily::V6, IpFamily::V4], &NodeSelection::default())
                .unwrap();
        assert_eq!(
            addrs(&got),
            pairs(&[
                ("InternalIP", "fd00::5"),
                ("ExternalIP", "fd00::5"),
                ("InternalIP", "10.0.0.5"),
                ("ExternalIP", "10.0.0.5"),
                ("Hostname", "h"),
            ])
        );
    }

    #[test]
    fn no_nics_or_no_match_is_an_error() {
        assert!(select_addresses(&[], "h", &[IpFamily::V4], &NodeSelection::default()).is_err());
        let sel = NodeSelection {
            internal_subnets: vec!["10.9.0.0/16".parse().unwrap()],
            ..Default::default()
        };
        let sel = NodeSelection { external_subnets: sel.internal_subnets.clone(), ..sel };
        let err =
            select_addresses(&[nic("n", &["10.0.0.5"])], "h", &[IpFamily::V4], &sel).unwrap_err();
        assert!(err.contains("10.0.0.5"), "{err}");
    }

    #[test]
    fn provider_ids_are_parsed_and_validated() {
        let mut node = Node::default();
        node.metadata.name = Some("node-a".into());
        assert_eq!(node_key(&node).unwrap(), Key::DnsName("node-a".into()));
        node.metadata.name = Some("10.0.0.5".into());
        assert_eq!(node_key(&node).unwrap(), Key::Ip("10.0.0.5".into()));
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some("vsphere://ABC-def".into()),
            ..Default::default()
        });
        assert_eq!(node_key(&node).unwrap(), Key::Uuid("abc-def".into()));
        node.spec = Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some("aws:///i-1".into()),
            ..Default::default()
        });
        assert!(matches!(node_key(&node), Err(ProviderError::Invalid { .. })));
    }
}
