//! Nodes: [`InstancesV2`] and [`Zones`] from ARM, for `vmType` `standard` (availability-set
//! and standalone VMs), `vmss` (uniform scale sets; standalone VMs are still found) and
//! `vmssflex` (a flexible scale set's VMs are standalone VMs with a `virtualMachineScaleSet`
//! reference).
//!
//! ```text
//!  batch of Nodes ──▶ per node: providerID ─▶ VmRef ─▶ listing of its resource group / scale set
//!                               (none)     ─▶ node name ─▶ VMs (name, computerName) and, with
//!                                             vmType vmss, every uniform scale set's VMs
//!                 ──▶ metadata: primary NIC (NIC listing of its resource group, or the scale
//!                     set's NIC listing) ─▶ public IPs (listing of their resource group)
//! ```
//!
//! Scale: a pass over N nodes costs a handful of list calls — VMs per resource group (with
//! `$expand=instanceView`, as upstream's `ListVMInstanceView`), scale sets per resource
//! group, VMs and NICs per scale set, NICs and public IPs per resource group — never one GET
//! per node. Listings are kept for a short time ([`DEFAULT_CACHE_TTL`], or as long as the
//! listing took to fetch when that is longer) and shared: concurrent batches wait for the one
//! listing in flight instead of starting their own. A listing is fetched by a task of its own,
//! so a batch that reaches its deadline (the node controller gives each batch one) leaves the
//! fetch running and its retry finds the listing: at thousands of VMs one listing takes tens
//! of seconds, and when each attempt started it over none ever finished (5000 Nodes: 2000
//! initialised, then every batch timed out). The NIC and public-IP listings of a batch's
//! resource groups are fetched beside the VM listing, not after it. Listings are read with
//! [`ArmClient::list_fresh`], never from the client's read cache (whose VM listings the
//! load balancers reuse for `vmCacheTTLInSeconds`), and refresh it.
//!
//! Deletion safety: `NotFound` only for a node whose providerID names a VM of this
//! subscription that a *complete, successful* listing of its resource group (or scale set),
//! fetched after the pass started, does not contain — or that a GET of that exact VM answers
//! with 404 (when the scale set's listing itself is a 404). A failed listing, a missing
//! resource group, another subscription's or another cloud's providerID, and a node found by
//! no name are errors, which never delete.
//!
//! Nodes labelled `kubernetes.azure.com/managed=false` are not Azure's: they exist, are not
//! shut down, and get empty metadata (upstream `IsNodeUnmanaged`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ccm_core::cloud::{
    InstanceMetadata, InstanceStatus, InstancesV2, ProviderError, Zone, Zones, exists_from_batch,
    metadata_from_batch, shutdown_from_batch,
};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec};
use kube::api::ObjectMeta;

use crate::client::views::{
    IdRef, InstanceView, Listed, NicProperties, NicView, PublicIpProperties, PublicIpView,
    ScaleSetProperties, ScaleSetView, VmProperties, VmView,
};
use crate::client::{ArmClient, ArmError, api_version};
use crate::config::{Config, VmType};
use crate::provider_id::VmRef;
use ccm_core::listing::{Fetched, Wanted};

/// Nodes with this label set to `false` are not managed by the provider.
pub const LABEL_MANAGED: &str = "kubernetes.azure.com/managed";
/// A node's resource group when it is not the config's (upstream `ExternalResourceGroupLabel`).
pub const LABEL_RESOURCE_GROUP: &str = "kubernetes.azure.com/resource-group";
/// API version of the scale-set NIC calls (`Microsoft.Compute/virtualMachineScaleSets/…/
/// networkInterfaces`): ARM serves them only at this version.
pub const VMSS_NIC_API_VERSION: &str = "2018-10-01";
/// How long a listing answers lookups before it is fetched again.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(5);

type Vm = VmView;

/// One listing, indexed by lower-case ARM ID and by the lower-case names a lookup finds a
/// resource by (a Node lookup is a map read, not a scan of the listing: at 10 000 VMs a
/// scan per Node was 10^8 name comparisons, ci/bench #35).
struct Indexed<P> {
    items: Vec<Listed<P>>,
    by_id: HashMap<String, usize>,
    by_name: HashMap<String, Vec<usize>>,
}

/// The names other than its own that a lookup finds a listed resource by.
trait OtherName {
    /// A VM's computer name (flexible and uniform scale sets name Nodes by it).
    fn other_name(&self) -> Option<&str> {
        None
    }
}

impl OtherName for VmProperties {
    fn other_name(&self) -> Option<&str> {
        self.os_profile.as_ref().and_then(|o| o.computer_name.as_deref())
    }
}
impl OtherName for NicProperties {}
impl OtherName for PublicIpProperties {}
impl OtherName for ScaleSetProperties {}

impl<P: OtherName> Indexed<P> {
    fn new(items: Vec<Listed<P>>) -> Self {
        let by_id = items
            .iter()
            .enumerate()
            .filter_map(|(i, r)| r.id.as_ref().map(|id| (id.to_ascii_lowercase(), i)))
            .collect();
        let mut by_name: HashMap<String, Vec<usize>> = HashMap::new();
        for (i, r) in items.iter().enumerate() {
            let own = r.name().to_ascii_lowercase();
            let other = r.properties.other_name().map(str::to_ascii_lowercase);
            for name in std::iter::once(own.clone()).chain(other.filter(|o| *o != own)) {
                if !name.is_empty() {
                    by_name.entry(name).or_default().push(i);
                }
            }
        }
        Indexed { items, by_id, by_name }
    }
}

impl<P> Indexed<P> {
    fn by_id(&self, id: &str) -> Option<&Listed<P>> {
        self.by_id.get(&id.to_ascii_lowercase()).and_then(|i| self.items.get(*i))
    }

    /// The resources whose name or other name ([`OtherName`]) is `name`, in listing order
    /// (compared case-insensitively).
    fn named(&self, name: &str) -> impl Iterator<Item = &Listed<P>> {
        self.by_name
            .get(&name.to_ascii_lowercase())
            .into_iter()
            .flatten()
            .filter_map(|i| self.items.get(*i))
    }
}

/// A listing as fetched ([`ccm_core::listing`]: shared, outlives a caller's deadline).
type Snapshot<P> = Fetched<Indexed<P>>;

/// Listings of one kind, by scope (a resource group or a scale set).
type Listings<P> = ccm_core::listing::Listings<Indexed<P>>;

/// The listing of `scope` through `listings`, fetched by `list` when none `wanted` takes.
async fn listing<P: OtherName + Send + Sync + 'static, Fut>(
    listings: &Listings<P>,
    scope: &str,
    wanted: Wanted,
    list: impl FnOnce() -> Fut,
) -> Result<Arc<Snapshot<P>>, ArmError>
where
    Fut: Future<Output = Result<Vec<Listed<P>>, ArmError>> + Send + 'static,
{
    let fetch = move || {
        let list = list();
        async move { list.await.map(Indexed::new) }
    };
    listings
        .get(scope, wanted, fetch, |message| ArmError::Transport {
            operation: "listing",
            resource: scope.to_string(),
            message,
            broken: false,
        })
        .await
}

/// Nodes from ARM (see the module docs).
pub struct AzureInstances {
    client: Arc<ArmClient>,
    config: Arc<Config>,
    ttl: Duration,
    vms: Listings<VmProperties>,
    nics: Listings<NicProperties>,
    public_ips: Listings<PublicIpProperties>,
    scale_sets: Listings<ScaleSetProperties>,
    scale_set_vms: Listings<VmProperties>,
    scale_set_nics: Listings<NicProperties>,
}

impl std::fmt::Debug for AzureInstances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureInstances")
            .field("vm_type", &self.config.vm_type)
            .finish_non_exhaustive()
    }
}

/// What a node is looked up by.
enum Target {
    /// `kubernetes.azure.com/managed=false`.
    Unmanaged,
    /// Its providerID.
    ById(VmRef),
    /// Its name, in this resource group.
    ByName { name: String, resource_group: String },
}

/// A VM found, with the scale set it is a uniform instance of.
struct Found {
    vm: Vm,
    scale_set: Option<(String, String)>,
}

/// One pass (a batch): listings fetched after `started` count as fresh after a miss.
#[derive(Clone, Copy)]
struct Pass {
    started: Instant,
}

impl AzureInstances {
    /// Nodes of `config`'s `vmType`, through `client`.
    pub fn new(client: Arc<ArmClient>, config: Arc<Config>) -> Self {
        AzureInstances {
            client,
            config,
            ttl: DEFAULT_CACHE_TTL,
            vms: Listings::default(),
            nics: Listings::default(),
            public_ips: Listings::default(),
            scale_sets: Listings::default(),
            scale_set_vms: Listings::default(),
            scale_set_nics: Listings::default(),
        }
    }

    /// How long listings are reused ([`DEFAULT_CACHE_TTL`]; zero: every pass lists again).
    pub fn with_cache_ttl(mut self, ttl: Duration) -> Self {
        self.ttl = ttl;
        self
    }

    fn wanted(&self, pass: Pass, force: bool) -> Wanted {
        if force {
            return Wanted::StartedAfter(pass.started);
        }
        Wanted::recent(pass.started, self.ttl)
    }

    fn collection(&self, resource_group: &str, arm_type: &str) -> Result<String, ArmError> {
        self.client.collection_id(resource_group, arm_type)
    }

    async fn vms(
        &self,
        pass: Pass,
        rg: &str,
        force: bool,
    ) -> Result<Arc<Snapshot<VmProperties>>, ArmError> {
        let path = self.collection(rg, "Microsoft.Compute/virtualMachines")?;
        listing(&self.vms, rg, self.wanted(pass, force), {
            let client = Arc::clone(&self.client);
            move || async move {
                client
                    .list_fresh::<VmView>(
                        "compute.virtual_machines.list",
                        &path,
                        api_version::COMPUTE,
                        &[("$expand", "instanceView")],
                    )
                    .await
            }
        })
        .await
    }

    async fn scale_sets(
        &self,
        pass: Pass,
        rg: &str,
        force: bool,
    ) -> Result<Arc<Snapshot<ScaleSetProperties>>, ArmError> {
        let path = self.collection(rg, "Microsoft.Compute/virtualMachineScaleSets")?;
        listing(&self.scale_sets, rg, self.wanted(pass, force), {
            let client = Arc::clone(&self.client);
            move || async move {
                client
                    .list_fresh::<ScaleSetView>(
                        "compute.virtual_machine_scale_sets.list",
                        &path,
                        api_version::COMPUTE,
                        &[],
                    )
                    .await
            }
        })
        .await
    }

    async fn scale_set_vms(
        &self,
        pass: Pass,
        rg: &str,
        scale_set: &str,
        force: bool,
    ) -> Result<Arc<Snapshot<VmProperties>>, ArmError> {
        let path = format!(
            "{}/{scale_set}/virtualMachines",
            self.collection(rg, "Microsoft.Compute/virtualMachineScaleSets")?
        );
        listing(&self.scale_set_vms, &format!("{rg}/{scale_set}"), self.wanted(pass, force), {
            let client = Arc::clone(&self.client);
            move || async move {
                client
                    .list_fresh::<VmView>(
                        "compute.virtual_machine_scale_set_vms.list",
                        &path,
                        api_version::COMPUTE,
                        &[("$expand", "instanceView")],
                    )
                    .await
            }
        })
        .await
    }

    async fn nics(
        &self,
        pass: Pass,
        rg: &str,
        force: bool,
    ) -> Result<Arc<Snapshot<NicProperties>>, ArmError> {
        let path = self.collection(rg, "Microsoft.Network/networkInterfaces")?;
        listing(&self.nics, rg, self.wanted(pass, force), {
            let client = Arc::clone(&self.client);
            move || async move {
                client
                    .list_fresh::<NicView>(
                        "network.network_interfaces.list",
                        &path,
                        api_version::NETWORK,
                        &[],
                    )
                    .await
            }
        })
        .await
    }

    async fn scale_set_nics(
        &self,
        pass: Pass,
        rg: &str,
        scale_set: &str,
        force: bool,
    ) -> Result<Arc<Snapshot<NicProperties>>, ArmError> {
        let path = format!(
            "{}/{scale_set}/networkInterfaces",
            self.collection(rg, "Microsoft.Compute/virtualMachineScaleSets")?
        );
        listing(
            &self.scale_set_nics,
            &format!("{rg}/{scale_set}"), self.wanted(pass, force), {
                let client = Arc::clone(&self.client);
                move || async move {
                    client.list_fresh::<NicView>(
                        "network.network_interfaces.list_virtual_machine_scale_set_network_interfaces",
                        &path,
                        VMSS_NIC_API_VERSION,
                        &[],
                    )
                    .await
                }
            })
            .await
    }

    async fn public_ips(
        &self,
        pass: Pass,
        rg: &str,
    ) -> Result<Arc<Snapshot<PublicIpProperties>>, ArmError> {
        let path = self.collection(rg, "Microsoft.Network/publicIPAddresses")?;
        listing(&self.public_ips, rg, self.wanted(pass, false), {
            let client = Arc::clone(&self.client);
            move || async move {
                client
                    .list_fresh::<PublicIpView>(
                        "network.public_ip_addresses.list",
                        &path,
                        api_version::NETWORK,
                        &[],
                    )
                    .await
            }
        })
        .await
    }

    /// What `node` is looked up by.
    fn target(&self, node: &Node) -> Result<Target, ProviderError> {
        let labels = node.metadata.labels.as_ref();
        if labels.and_then(|l| l.get(LABEL_MANAGED)).is_some_and(|v| v == "false") {
            return Ok(Target::Unmanaged);
        }
        let name = node.metadata.name.clone().unwrap_or_default();
        let provider_id =
            node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default();
        if !provider_id.is_empty() {
            let vm = VmRef::parse(provider_id).map_err(|e| ProviderError::Invalid {
                what: "providerID".into(),
                message: e.to_string(),
            })?;
            if !vm.subscription().eq_ignore_ascii_case(self.client.subscription_id()) {
                return Err(ProviderError::other(format!(
                    "node {name}: providerID {provider_id} is in subscription {}, not the configured {}",
                    vm.subscription(),
                    self.client.subscription_id()
                )));
            }
            return Ok(Target::ById(vm));
        }
        if name.is_empty() {
            return Err(ProviderError::other("a node without name or providerID"));
        }
        let resource_group = labels
            .and_then(|l| l.get(LABEL_RESOURCE_GROUP))
            .filter(|v| !v.is_empty())
            .cloned()
            .unwrap_or_else(|| self.config.resource_group().to_string());
        if resource_group.is_empty() {
            return Err(ProviderError::Invalid {
                what: "resourceGroup".into(),
                message: format!(
                    "node {name} has no providerID and the cloud config names no resource group"
                ),
            });
        }
        Ok(Target::ByName { name, resource_group })
    }

    /// The VM a providerID names: `None` when a complete listing fetched in this pass lacks
    /// it, or a GET of exactly it is a 404.
    async fn by_id(&self, pass: Pass, vm: &VmRef) -> Result<Option<Found>, ProviderError> {
        match vm {
            VmRef::Vm { resource_group, name, .. } => {
                for force in [false, true] {
                    let snap = self.vms(pass, resource_group, force).await?;
                    if let Some(v) = snap.named(name).find(|v| v.name().eq_ignore_ascii_case(name))
                    {
                        return Ok(Some(Found { vm: v.clone(), scale_set: None }));
                    }
                }
                Ok(None)
            }
            VmRef::ScaleSetVm { resource_group, scale_set, instance_id, .. } => {
                // `<set>_<id>` (a disk's managedBy) names the same instance as `<id>`.
                let prefix = format!("{}_", scale_set.to_ascii_lowercase());
                let id = match instance_id.to_ascii_lowercase().strip_prefix(&prefix) {
                    Some(rest) => rest.to_string(),
                    None => instance_id.clone(),
                };
                let scope = Some((resource_group.clone(), scale_set.clone()));
                for force in [false, true] {
                    let snap =
                        match self.scale_set_vms(pass, resource_group, scale_set, force).await {
                            Ok(s) => s,
                            // The scale set itself is missing: ask for exactly this VM.
                            Err(e) if e.is_not_found() => {
                                // Boxed: a call's future is kilobytes, and every waiting
                                // lookup of a batch would carry it inline (#35).
                                let got: Result<Vm, ArmError> = Box::pin(self.client.get(
                                    "compute.virtual_machine_scale_set_vms.get",
                                    &vm.arm_id(),
                                    api_version::COMPUTE,
                                    &[("$expand", "instanceView")],
                                ))
                                .await;
                                return match got {
                                    Ok(v) => Ok(Some(Found { vm: v, scale_set: scope })),
                                    Err(e) if arm_says_absent(&e) => Ok(None),
                                    Err(e) => Err(e.into()),
                                };
                            }
                            Err(e) => return Err(e.into()),
                        };
                    let hit = snap.items.iter().find(|v| {
                        v.instance_id
                            .as_deref()
                            .or_else(|| v.id().rsplit('/').next())
                            .is_some_and(|i| i.eq_ignore_ascii_case(&id))
                    });
                    if let Some(v) = hit {
                        return Ok(Some(Found { vm: v.clone(), scale_set: scope }));
                    }
                }
                Ok(None)
            }
        }
    }

    /// The VM behind a node name: a VM named so, or whose lower-case computer name it is
    /// (flexible scale sets), and with `vmType: vmss` a uniform scale-set VM whose lower-case
    /// computer name it is. `None`: found by no name (never "gone").
    async fn by_name(
        &self,
        pass: Pass,
        name: &str,
        rg: &str,
    ) -> Result<Option<Found>, ProviderError> {
        for force in [false, true] {
            let mut hits: Vec<Found> = Vec::new();
            let vms = self.vms(pass, rg, force).await?;
            for v in vms.named(name) {
                let computer =
                    v.properties.os_profile.as_ref().and_then(|o| o.computer_name.as_deref());
                if v.name().eq_ignore_ascii_case(name)
                    || computer.is_some_and(|c| c.eq_ignore_ascii_case(name))
                {
                    hits.push(Found { vm: v.clone(), scale_set: None });
                }
            }
            if self.config.vm_type == VmType::Vmss {
                let sets = self.scale_sets(pass, rg, force).await?;
                let uniform = sets.items.iter().filter(|s| {
                    s.properties
                        .orchestration_mode
                        .as_deref()
                        .is_none_or(|m| m.eq_ignore_ascii_case("Uniform"))
                });
                for set in uniform {
                    let vms = self.scale_set_vms(pass, rg, set.name(), force).await?;
                    for v in vms.named(name) {
                        let computer = v
                            .properties
                            .os_profile
                            .as_ref()
                            .and_then(|o| o.computer_name.as_deref());
                        if computer.is_some_and(|c| c.eq_ignore_ascii_case(name)) {
                            hits.push(Found {
                                vm: v.clone(),
                                scale_set: Some((rg.to_string(), set.name().to_string())),
                            });
                        }
                    }
                }
            }
            match hits.len() {
                0 => continue,
                1 => return Ok(hits.pop()),
                _ => {
                    let ids: Vec<&str> = hits.iter().map(|h| h.vm.id()).collect();
                    return Err(ProviderError::other(format!(
                        "node {name}: several VMs answer to this name: {}",
                        ids.join(", ")
                    )));
                }
            }
        }
        Ok(None)
    }

    async fn metadata_one(
        &self,
        pass: Pass,
        node: &Node,
    ) -> Result<InstanceMetadata, ProviderError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let found = match self.target(node)? {
            Target::Unmanaged => return Ok(InstanceMetadata::default()),
            Target::ById(vm) => self.by_id(pass, &vm).await?,
            Target::ByName { name, resource_group } => {
                self.by_name(pass, &name, &resource_group).await?
            }
        };
        let Some(found) = found else {
            tracing::debug!(node = %name, "no VM found for the node (yet)");
            return Err(ProviderError::InstanceNotFound);
        };
        let provider_id = match node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) {
            Some(p) if !p.is_empty() => p.to_string(),
            _ => provider_id_of(&found.vm)?,
        };
        let zone = zone_of(&found)?;
        let node_addresses = self.addresses(pass, &name, &found).await?;
        Ok(InstanceMetadata {
            provider_id,
            instance_type: instance_type_of(&found),
            node_addresses,
            zone: zone.failure_domain,
            region: zone.region,
            additional_labels: Default::default(),
        })
    }

    async fn status_one(&self, pass: Pass, node: &Node) -> Result<InstanceStatus, ProviderError> {
        let name = node.metadata.name.clone().unwrap_or_default();
        let found = match self.target(node)? {
            Target::Unmanaged => return Ok(InstanceStatus::Running),
            Target::ById(vm) => match self.by_id(pass, &vm).await? {
                Some(f) => f,
                None => {
                    tracing::info!(node = %name, vm = %vm.arm_id(), "the node's VM is gone");
                    return Ok(InstanceStatus::NotFound);
                }
            },
            Target::ByName { name, resource_group } => {
                match self.by_name(pass, &name, &resource_group).await? {
                    Some(f) => f,
                    None => {
                        return Err(ProviderError::other(format!(
                            "node {name} has no providerID and no VM in resource group {resource_group} answers to its name"
                        )));
                    }
                }
            }
        };
        Ok(status_of(&found.vm))
    }

    /// Upstream's order: InternalIP (primary IP configuration), Hostname, ExternalIP (its
    /// public IP); then the first IPv6 IP configuration's private (and public) address.
    async fn addresses(
        &self,
        pass: Pass,
        node_name: &str,
        found: &Found,
    ) -> Result<Vec<NodeAddress>, ProviderError> {
        let vm_id = found.vm.id();
        let refs = found
            .vm
            .properties
            .network_profile
            .as_ref()
            .map(|p| p.network_interfaces.as_slice())
            .unwrap_or_default();
        let primary = match refs {
            [only] => Some(only),
            _ => refs.iter().find(|r| r.properties.as_ref().and_then(|p| p.primary) == Some(true)),
        }
        .ok_or_else(|| ProviderError::other(format!("VM {vm_id}: no primary network interface")))?;
        let mut nic = None;
        for force in [false, true] {
            let snap = match &found.scale_set {
                Some((rg, ss)) => self.scale_set_nics(pass, rg, ss, force).await?,
                None => {
                    let rg = resource_group_of(&primary.id).ok_or_else(|| {
                        ProviderError::other(format!(
                            "VM {vm_id}: NIC ID {} has no resource group",
                            primary.id
                        ))
                    })?;
                    self.nics(pass, rg, force).await?
                }
            };
            if let Some(n) = snap.by_id(&primary.id) {
                nic = Some(n.clone());
                break;
            }
        }
        let nic = nic.ok_or_else(|| {
            ProviderError::other(format!(
                "VM {vm_id}: its primary network interface {} was not found",
                primary.id
            ))
        })?;
        let configs = &nic.properties.ip_configurations;
        let primary_cfg = match configs.as_slice() {
            [only] => Some(only),
            _ => configs.iter().find(|c| c.properties.primary == Some(true)),
        }
        .ok_or_else(|| {
            ProviderError::other(format!("NIC {}: no primary IP configuration", nic.id()))
        })?;
        let private = primary_cfg
            .properties
            .private_ip_address
            .clone()
            .filter(|ip| !ip.is_empty())
            .ok_or_else(|| {
                ProviderError::other(format!(
                    "NIC {}: the primary IP configuration has no private IP",
                    nic.id()
                ))
            })?;
        let mut out = vec![address("InternalIP", &private), address("Hostname", node_name)];
        if let Some(ip) =
            self.public_ip(pass, primary_cfg.properties.public_ip_address.as_ref()).await?
        {
            out.push(address("ExternalIP", &ip));
        }
        let v6 = configs.iter().find(|c| {
            c.properties
                .private_ip_address_version
                .as_deref()
                .is_some_and(|v| v.eq_ignore_ascii_case("IPv6"))
                && c.properties.private_ip_address.as_deref().is_some_and(|ip| !ip.is_empty())
        });
        if let Some(c) = v6
            && let Some(ip) = c.properties.private_ip_address.as_deref()
            && ip != private
        {
            out.push(address("InternalIP", ip));
            if let Some(public) =
                self.public_ip(pass, c.properties.public_ip_address.as_ref()).await?
            {
                out.push(address("ExternalIP", &public));
            }
        }
        Ok(out)
    }

    /// The address of a referenced public IP resource (from its resource group's listing);
    /// `None` when it has none or is not listed (upstream: no ExternalIP then).
    async fn public_ip(
        &self,
        pass: Pass,
        reference: Option<&IdRef>,
    ) -> Result<Option<String>, ProviderError> {
        let Some(r) = reference.filter(|r| !r.id.is_empty()) else { return Ok(None) };
        if r.id.to_ascii_lowercase().contains("/virtualmachinescalesets/") {
            // A scale-set VM's own public IP lives under the VM, not in a listing.
            tracing::debug!(public_ip = %r.id, "scale-set VM public IPs are not reported");
            return Ok(None);
        }
        let Some(rg) = resource_group_of(&r.id) else { return Ok(None) };
        let snap = self.public_ips(pass, rg).await?;
        Ok(snap
            .by_id(&r.id)
            .and_then(|p| p.properties.ip_address.clone())
            .filter(|ip| !ip.is_empty()))
    }

    async fn zone_for(&self, node: &Node) -> Result<Zone, ProviderError> {
        let pass = Pass { started: Instant::now() };
        let found = match self.target(node)? {
            Target::Unmanaged => return Ok(Zone::default()),
            Target::ById(vm) => self.by_id(pass, &vm).await?,
            Target::ByName { name, resource_group } => {
                self.by_name(pass, &name, &resource_group).await?
            }
        };
        zone_of(&found.ok_or(ProviderError::InstanceNotFound)?)
    }
}

/// ARM's own answer that the resource does not exist: a 404 with ARM's `ResourceNotFound`
/// (or `NotFound`) code — not a proxy's 404 page, not a missing resource group or parent.
fn arm_says_absent(e: &ArmError) -> bool {
    e.status() == Some(404) && matches!(e.code(), Some("ResourceNotFound" | "NotFound"))
}

fn address(type_: &str, value: &str) -> NodeAddress {
    NodeAddress { type_: type_.into(), address: value.into() }
}

/// The resource group segment of an ARM ID.
fn resource_group_of(id: &str) -> Option<&str> {
    let mut parts = id.trim_start_matches('/').split('/');
    while let Some(p) = parts.next() {
        if p.eq_ignore_ascii_case("resourceGroups") {
            return parts.next().filter(|rg| !rg.is_empty());
        }
    }
    None
}

/// `azure://` + the VM's ID with the resource group in lower case (upstream
/// `ConvertResourceGroupNameToLower`).
fn provider_id_of(vm: &Vm) -> Result<String, ProviderError> {
    let parsed = VmRef::parse(vm.id())
        .map_err(|e| ProviderError::other(format!("ARM listed a VM with an unexpected ID: {e}")))?;
    let lowered = match parsed {
        VmRef::Vm { subscription, resource_group, name } => {
            VmRef::Vm { subscription, resource_group: resource_group.to_ascii_lowercase(), name }
        }
        VmRef::ScaleSetVm { subscription, resource_group, scale_set, instance_id } => {
            VmRef::ScaleSetVm {
                subscription,
                resource_group: resource_group.to_ascii_lowercase(),
                scale_set,
                instance_id,
            }
        }
    };
    Ok(lowered.provider_id())
}

/// `hardwareProfile.vmSize`; a uniform scale-set VM's `sku.name`.
fn instance_type_of(found: &Found) -> String {
    let size = found.vm.properties.hardware_profile.as_ref().and_then(|h| h.vm_size.clone());
    let sku = found.vm.sku.as_ref().and_then(|s| s.name.clone());
    if found.scale_set.is_some() { sku.or(size) } else { size }.unwrap_or_default()
}

/// `<location>-<zone>` for a zonal VM, else the platform fault domain (upstream: `"0"` for a
/// VM without instance view; an error for a scale-set VM without one).
fn zone_of(found: &Found) -> Result<Zone, ProviderError> {
    let vm = &found.vm;
    let location = vm.location.as_deref().unwrap_or_default().to_ascii_lowercase();
    let failure_domain = match vm.zones.as_ref().and_then(|z| z.first()) {
        Some(z) => {
            let n: i64 = z.parse().map_err(|_| {
                ProviderError::other(format!("VM {}: zone {z:?} is not a number", vm.id()))
            })?;
            format!("{location}-{n}")
        }
        None => {
            match vm.properties.instance_view.as_ref().and_then(|iv| iv.platform_fault_domain) {
                Some(fd) => fd.to_string(),
                None if found.scale_set.is_none() => "0".to_string(),
                None => {
                    return Err(ProviderError::other(format!(
                        "VM {}: no zone and no fault domain",
                        vm.id()
                    )));
                }
            }
        }
    };
    Ok(Zone { failure_domain, region: location })
}

/// Shut down: provisioning `Succeeded` and power state stopped, deallocated or deallocating
/// (upstream `InstanceShutdownByProviderID`). No instance view: running (upstream: unknown).
fn status_of(vm: &Vm) -> InstanceStatus {
    let power = vm
        .properties
        .instance_view
        .as_ref()
        .and_then(InstanceView::power_state)
        .unwrap_or_default();
    let provisioned = vm
        .properties
        .provisioning_state
        .as_deref()
        .is_some_and(|p| p.eq_ignore_ascii_case("Succeeded"));
    if provisioned && matches!(power.as_str(), "stopped" | "deallocated" | "deallocating") {
        InstanceStatus::Shutdown
    } else {
        InstanceStatus::Running
    }
}

fn node_named(name: Option<&str>, provider_id: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta { name: name.map(str::to_string), ..Default::default() },
        spec: Some(NodeSpec { provider_id: provider_id.map(str::to_string), ..Default::default() }),
        status: None,
    }
}

#[async_trait]
impl InstancesV2 for AzureInstances {
    async fn instance_exists(&self, node: &Node) -> Result<bool, ProviderError> {
        exists_from_batch(self, node).await
    }

    async fn instance_shutdown(&self, node: &Node) -> Result<bool, ProviderError> {
        shutdown_from_batch(self, node).await
    }

    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata, ProviderError> {
        metadata_from_batch(self, node).await
    }

    async fn instance_metadata_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceMetadata, ProviderError>> {
        let pass = Pass { started: Instant::now() };
        // The NIC listings the lookups will read, fetched beside the VM listings (a lookup
        // reads its VM first, then its NIC): the resource groups of standalone VMs. A failed
        // prefetch is left to the lookup that needs the listing, which reports it.
        let groups: std::collections::BTreeSet<String> = nodes
            .iter()
            .filter_map(|n| match self.target(n) {
                Ok(Target::ById(vm @ VmRef::Vm { .. })) => Some(vm.resource_group().to_string()),
                Ok(Target::ByName { resource_group, .. })
                    if self.config.vm_type != VmType::Vmss =>
                {
                    Some(resource_group)
                }
                _ => None,
            })
            .collect();
        let prefetch =
            futures::future::join_all(groups.iter().map(|rg| self.nics(pass, rg, false)));
        let lookups = futures::future::join_all(nodes.iter().map(|n| self.metadata_one(pass, n)));
        futures::join!(prefetch, lookups).1
    }

    async fn instance_status_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceStatus, ProviderError>> {
        let pass = Pass { started: Instant::now() };
        futures::future::join_all(nodes.iter().map(|n| self.status_one(pass, n))).await
    }
}

#[async_trait]
impl Zones for AzureInstances {
    async fn zone_by_provider_id(&self, provider_id: &str) -> Result<Zone, ProviderError> {
        if provider_id.is_empty() {
            return Err(ProviderError::other(
                "providerID is empty, the node is not initialized yet",
            ));
        }
        self.zone_for(&node_named(None, Some(provider_id))).await
    }

    async fn zone_by_node_name(&self, node_name: &str) -> Result<Zone, ProviderError> {
        self.zone_for(&node_named(Some(node_name), None)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::views::{SkuName, Status};

    /// A lookup by name reads the listing's name index: a VM by its name or its computer
    /// name, case-insensitively, each VM once (its name and computer name alike), in listing
    /// order, and nothing for another name.
    #[test]
    fn listed_vms_are_found_by_name_and_computer_name() {
        let vm = |name: &str, computer: Option<&str>| VmView {
            id: Some(format!(
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/{name}"
            )),
            name: Some(name.into()),
            properties: VmProperties {
                os_profile: computer
                    .map(|c| crate::client::views::OsProfile { computer_name: Some(c.into()) }),
                ..Default::default()
            },
            ..Default::default()
        };
        let index = Indexed::new(vec![
            vm("vm-a", Some("node-a")),
            vm("Node-B", Some("node-b")),
            vm("vm-c", Some("NODE-A")),
            vm("vm-d", None),
        ]);
        let names = |n: &str| index.named(n).map(|v| v.name().to_string()).collect::<Vec<_>>();
        assert_eq!(names("NODE-a"), ["vm-a", "vm-c"]);
        assert_eq!(names("node-b"), ["Node-B"]);
        assert_eq!(names("VM-D"), ["vm-d"]);
        assert!(names("node-d").is_empty());
        assert!(index.by_id("/SUBSCRIPTIONS/s/resourcegroups/RG/providers/microsoft.compute/virtualmachines/vm-d").is_some());
    }

    /// A batch of 500 Nodes is 500 lookups waiting for the same listing at once (ten such
    /// batches at 5000 Nodes): each must weigh little while it waits. With the listing's
    /// future and a call's held inline, each weighed tens of kilobytes, 142 MB in all (#35).
    #[test]
    fn a_waiting_lookup_weighs_a_few_kilobytes() {
        let config = Config {
            cloud: Some("AzureStackCloud".into()),
            resource_manager_endpoint: Some("https://arm.example".into()),
            tenant_id: Some("t".into()),
            subscription_id: Some("8ecadfc9-0000-0000-0000-00000000abcd".into()),
            aad_client_id: Some("c".into()),
            aad_client_secret: Some("s".into()),
            resource_group: Some("rg".into()),
            ..Config::default()
        };
        let client = ArmClient::new(&config, Default::default()).unwrap();
        let i = AzureInstances::new(Arc::new(client), Arc::new(config));
        let node = Node::default();
        let pass = Pass { started: Instant::now() };
        let metadata = std::mem::size_of_val(&i.metadata_one(pass, &node));
        let status = std::mem::size_of_val(&i.status_one(pass, &node));
        assert!(metadata <= 4096, "a metadata lookup weighs {metadata} bytes");
        assert!(status <= 2048, "a status lookup weighs {status} bytes");
    }

    fn vm(json: serde_json::Value) -> Vm {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn shutdown_needs_a_stopped_power_state_and_a_finished_provisioning() {
        let with = |prov: &str, power: &str| {
            let mut v =
                vm(serde_json::json!({"id": "x", "properties": {"provisioningState": prov}}));
            v.properties.instance_view = Some(InstanceView {
                statuses: vec![Status { code: Some(format!("PowerState/{power}")) }],
                ..Default::default()
            });
            status_of(&v)
        };
        assert_eq!(with("Succeeded", "deallocated"), InstanceStatus::Shutdown);
        assert_eq!(with("Succeeded", "deallocating"), InstanceStatus::Shutdown);
        assert_eq!(with("Succeeded", "stopped"), InstanceStatus::Shutdown);
        assert_eq!(with("Succeeded", "running"), InstanceStatus::Running);
        assert_eq!(with("Updating", "stopped"), InstanceStatus::Running);
    }

    #[test]
    fn zones_are_location_dash_number_else_the_fault_domain() {
        let zonal = vm(serde_json::json!({"id": "x", "location": "EastUS", "zones": ["2"]}));
        assert_eq!(
            zone_of(&Found { vm: zonal, scale_set: None }).unwrap().failure_domain,
            "eastus-2"
        );
        let mut fd = vm(serde_json::json!({"id": "x", "location": "eastus"}));
        fd.properties.instance_view =
            Some(InstanceView { platform_fault_domain: Some(2), ..Default::default() });
        assert_eq!(
            zone_of(&Found { vm: fd.clone(), scale_set: None }).unwrap().failure_domain,
            "2"
        );
        fd.properties.instance_view = None;
        assert_eq!(
            zone_of(&Found { vm: fd.clone(), scale_set: None }).unwrap().failure_domain,
            "0"
        );
        assert!(zone_of(&Found { vm: fd, scale_set: Some(("rg".into(), "ss".into())) }).is_err());
    }

    #[test]
    fn provider_ids_lower_case_the_resource_group_and_scale_set_vms_report_their_sku() {
        let v = vm(serde_json::json!({
            "id": "/subscriptions/S/resourceGroups/MyRG/providers/Microsoft.Compute/virtualMachineScaleSets/pool/virtualMachines/3",
            "properties": {"hardwareProfile": {"vmSize": "Standard_A"}}}));
        assert_eq!(
            provider_id_of(&v).unwrap(),
            "azure:///subscriptions/S/resourceGroups/myrg/providers/Microsoft.Compute/virtualMachineScaleSets/pool/virtualMachines/3"
        );
        let mut f = Found { vm: v, scale_set: Some(("myrg".into(), "pool".into())) };
        f.vm.sku = Some(SkuName { name: Some("Standard_B".into()) });
        assert_eq!(instance_type_of(&f), "Standard_B");
        f.scale_set = None;
        assert_eq!(instance_type_of(&f), "Standard_A");
        assert_eq!(
            resource_group_of("/subscriptions/s/resourceGroups/rg2/providers/x/y"),
            Some("rg2")
        );
    }
}
