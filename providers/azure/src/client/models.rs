//! ARM resource models for the resources the provider reads and writes.
//!
//! ARM's `PUT` replaces a whole resource, so every model carries the fields it does not name
//! in a flattened `extra` map: a GET → modify → PUT round trip sends back every setting an
//! operator or another controller made, unchanged. Fields the provider reads or writes are
//! typed; everything else (and every field a newer API version adds) lives in `extra`.
//! Optional fields are skipped when absent, so a round trip does not add `null`s.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Fields of a model that it does not name, kept for the round trip.
pub type Extra = Map<String, Value>;

/// A top-level ARM resource (`id`, `name`, `location`, `etag`, `tags`, `properties`, …).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Resource<P> {
    /// The ARM resource ID.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The resource name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The ARM type, e.g. `Microsoft.Network/loadBalancers`.
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub kind: Option<String>,
    /// The location (region), e.g. `eastus`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub location: Option<String>,
    /// The entity tag, for `If-Match`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// Resource tags.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tags: Option<BTreeMap<String, String>>,
    /// Availability zones (`["1"]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zones: Option<Vec<String>>,
    /// The SKU.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sku: Option<Sku>,
    /// The resource's properties.
    #[serde(default)]
    pub properties: P,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

impl<P> Resource<P> {
    /// The name, or `""`.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }

    /// The ID, or `""`.
    pub fn id(&self) -> &str {
        self.id.as_deref().unwrap_or_default()
    }

    /// The tag `key`, if set.
    pub fn tag(&self, key: &str) -> Option<&str> {
        self.tags.as_ref().and_then(|t| t.get(key)).map(String::as_str)
    }
}

/// A child resource inside a parent's properties (a frontend, a rule, a route, …).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubResource<P> {
    /// The ARM ID (`<parent id>/<collection>/<name>`); ARM fills it in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// The name, unique in its collection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The entity tag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<String>,
    /// Availability zones (frontend IP configurations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub zones: Option<Vec<String>>,
    /// The properties.
    #[serde(default)]
    pub properties: P,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

impl<P> SubResource<P> {
    /// The name, or `""`.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }

    /// The ID, or `""`.
    pub fn id(&self) -> &str {
        self.id.as_deref().unwrap_or_default()
    }
}

/// A reference to another resource: `{"id": …}`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Ref {
    /// The referenced resource's ARM ID.
    #[serde(default)]
    pub id: String,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

impl Ref {
    /// A reference to `id`.
    pub fn to(id: impl Into<String>) -> Self {
        Ref { id: id.into(), extra: Extra::new() }
    }

    /// Whether this references `id` (ARM IDs compare case-insensitively).
    pub fn is(&self, id: &str) -> bool {
        self.id.eq_ignore_ascii_case(id)
    }
}

/// A SKU (`{"name": "Standard", "tier": "Regional"}`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Sku {
    /// The SKU name (`Standard`, `Basic`, a VM size for scale-set VMs).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The tier.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tier: Option<String>,
    /// Everything else (`capacity`).
    #[serde(flatten)]
    pub extra: Extra,
}

// ---------------------------------------------------------------------------------------------
// Microsoft.Network/loadBalancers

/// `Microsoft.Network/loadBalancers`.
pub type LoadBalancer = Resource<LoadBalancerProperties>;
/// A load balancer's frontend IP configuration.
pub type FrontendIpConfiguration = SubResource<FrontendIpProperties>;
/// A load balancer's backend address pool.
pub type BackendAddressPool = SubResource<BackendPoolProperties>;
/// A load-balancing rule.
pub type LoadBalancingRule = SubResource<RuleProperties>;
/// A health probe.
pub type Probe = SubResource<ProbeProperties>;

/// A load balancer's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerProperties {
    /// Frontend IP configurations.
    #[serde(default, rename = "frontendIPConfigurations")]
    pub frontend_ip_configurations: Vec<FrontendIpConfiguration>,
    /// Backend address pools.
    #[serde(default)]
    pub backend_address_pools: Vec<BackendAddressPool>,
    /// Load-balancing rules.
    #[serde(default)]
    pub load_balancing_rules: Vec<LoadBalancingRule>,
    /// Health probes.
    #[serde(default)]
    pub probes: Vec<Probe>,
    /// `Succeeded`, `Updating`, … (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
    /// Everything else (inbound NAT rules, outbound rules, …).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A frontend IP configuration's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FrontendIpProperties {
    /// The private IP (internal load balancers).
    #[serde(default, rename = "privateIPAddress", skip_serializing_if = "Option::is_none")]
    pub private_ip_address: Option<String>,
    /// `Static` or `Dynamic`.
    #[serde(
        default,
        rename = "privateIPAllocationMethod",
        skip_serializing_if = "Option::is_none"
    )]
    pub private_ip_allocation_method: Option<String>,
    /// `IPv4` or `IPv6`.
    #[serde(default, rename = "privateIPAddressVersion", skip_serializing_if = "Option::is_none")]
    pub private_ip_address_version: Option<String>,
    /// The subnet (internal load balancers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<Ref>,
    /// The public IP (public load balancers).
    #[serde(default, rename = "publicIPAddress", skip_serializing_if = "Option::is_none")]
    pub public_ip_address: Option<Ref>,
    /// Everything else (read-only back-references, provisioning state, …).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A backend address pool's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackendPoolProperties {
    /// The NIC / scale-set IP configurations in the pool (read-only, computed by ARM).
    #[serde(default, rename = "backendIPConfigurations", skip_serializing_if = "Option::is_none")]
    pub backend_ip_configurations: Option<Vec<Ref>>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A load-balancing rule's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RuleProperties {
    /// The frontend.
    #[serde(default, rename = "frontendIPConfiguration", skip_serializing_if = "Option::is_none")]
    pub frontend_ip_configuration: Option<Ref>,
    /// The backend pool.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_address_pool: Option<Ref>,
    /// The health probe.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe: Option<Ref>,
    /// `Tcp`, `Udp` or `All`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The frontend port (0 with `All`: HA ports).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub frontend_port: Option<i32>,
    /// The backend port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backend_port: Option<i32>,
    /// Idle timeout in minutes (4–30 on Standard).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idle_timeout_in_minutes: Option<i32>,
    /// Floating IP (direct server return).
    #[serde(default, rename = "enableFloatingIP", skip_serializing_if = "Option::is_none")]
    pub enable_floating_ip: Option<bool>,
    /// TCP reset on idle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_tcp_reset: Option<bool>,
    /// `Default`, `SourceIP`, `SourceIPProtocol`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_distribution: Option<String>,
    /// Disable outbound SNAT through this rule's frontend.
    #[serde(default, rename = "disableOutboundSnat", skip_serializing_if = "Option::is_none")]
    pub disable_outbound_snat: Option<bool>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A health probe's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ProbeProperties {
    /// `Tcp`, `Http` or `Https`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// The port probed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub port: Option<i32>,
    /// The HTTP(S) path.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request_path: Option<String>,
    /// Seconds between probes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_in_seconds: Option<i32>,
    /// Failed probes before a backend is taken out.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub number_of_probes: Option<i32>,
    /// Consecutive failures before a backend is taken out (newer API versions).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probe_threshold: Option<i32>,
    /// Everything else (read-only `loadBalancingRules`, …).
    #[serde(flatten)]
    pub extra: Extra,
}

// ---------------------------------------------------------------------------------------------
// Microsoft.Network/publicIPAddresses

/// `Microsoft.Network/publicIPAddresses`.
pub type PublicIpAddress = Resource<PublicIpProperties>;

/// A public IP's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicIpProperties {
    /// `Static` or `Dynamic`.
    #[serde(default, rename = "publicIPAllocationMethod", skip_serializing_if = "Option::is_none")]
    pub public_ip_allocation_method: Option<String>,
    /// `IPv4` or `IPv6`.
    #[serde(default, rename = "publicIPAddressVersion", skip_serializing_if = "Option::is_none")]
    pub public_ip_address_version: Option<String>,
    /// The address (read-only when allocated by ARM).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_address: Option<String>,
    /// DNS label and FQDN.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns_settings: Option<DnsSettings>,
    /// The IP configuration using it (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_configuration: Option<Ref>,
    /// IP tags (`[{"ipTagType","tag"}]`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ip_tags: Option<Vec<Value>>,
    /// `Succeeded`, … (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A public IP's DNS settings.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DnsSettings {
    /// The label: `<label>.<location>.cloudapp.azure.com`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub domain_name_label: Option<String>,
    /// The FQDN (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fqdn: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

// ---------------------------------------------------------------------------------------------
// Microsoft.Network/networkSecurityGroups

/// `Microsoft.Network/networkSecurityGroups`.
pub type SecurityGroup = Resource<SecurityGroupProperties>;
/// A security rule.
pub type SecurityRule = SubResource<SecurityRuleProperties>;

/// A network security group's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecurityGroupProperties {
    /// The rules operators and controllers made.
    #[serde(default)]
    pub security_rules: Vec<SecurityRule>,
    /// Everything else (`defaultSecurityRules`, subnets, …).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A security rule's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecurityRuleProperties {
    /// `Tcp`, `Udp`, `*`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<String>,
    /// Source port range (`*`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_port_range: Option<String>,
    /// Destination port range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_port_range: Option<String>,
    /// Destination port ranges.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_port_ranges: Option<Vec<String>>,
    /// Source prefix (a CIDR, an IP, `*`, a service tag).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_address_prefix: Option<String>,
    /// Source prefixes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_address_prefixes: Option<Vec<String>>,
    /// Destination prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_address_prefix: Option<String>,
    /// Destination prefixes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub destination_address_prefixes: Option<Vec<String>>,
    /// `Allow` or `Deny`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access: Option<String>,
    /// 100–4096, unique per direction.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub priority: Option<i32>,
    /// `Inbound` or `Outbound`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub direction: Option<String>,
    /// Free text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub description: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

// ---------------------------------------------------------------------------------------------
// Microsoft.Network/routeTables

/// `Microsoft.Network/routeTables`.
pub type RouteTable = Resource<RouteTableProperties>;
/// A route.
pub type Route = SubResource<RouteProperties>;

/// A route table's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteTableProperties {
    /// The routes.
    #[serde(default)]
    pub routes: Vec<Route>,
    /// Everything else (`subnets`, `disableBgpRoutePropagation`, …).
    #[serde(flatten)]
    pub extra: Extra,
}

/// A route's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RouteProperties {
    /// The destination CIDR.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_prefix: Option<String>,
    /// `VirtualAppliance`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop_type: Option<String>,
    /// The next hop (a node's private IP).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub next_hop_ip_address: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

// ---------------------------------------------------------------------------------------------
// Microsoft.Network/networkInterfaces, virtualNetworks/subnets

/// `Microsoft.Network/networkInterfaces`.
pub type NetworkInterface = Resource<InterfaceProperties>;
/// A NIC's IP configuration.
pub type InterfaceIpConfiguration = SubResource<InterfaceIpProperties>;

/// A NIC's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceProperties {
    /// The IP configurations.
    #[serde(default, rename = "ipConfigurations")]
    pub ip_configurations: Vec<InterfaceIpConfiguration>,
    /// Whether this is the VM's primary NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<bool>,
    /// The VM it is attached to (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machine: Option<Ref>,
    /// `Succeeded`, … (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A NIC IP configuration's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InterfaceIpProperties {
    /// The private IP.
    #[serde(default, rename = "privateIPAddress", skip_serializing_if = "Option::is_none")]
    pub private_ip_address: Option<String>,
    /// `IPv4` or `IPv6`.
    #[serde(default, rename = "privateIPAddressVersion", skip_serializing_if = "Option::is_none")]
    pub private_ip_address_version: Option<String>,
    /// Whether this is the NIC's primary IP configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<bool>,
    /// The subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<Ref>,
    /// The public IP attached.
    #[serde(default, rename = "publicIPAddress", skip_serializing_if = "Option::is_none")]
    pub public_ip_address: Option<Ref>,
    /// The load balancer backend pools this IP configuration is in.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer_backend_address_pools: Option<Vec<Ref>>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `Microsoft.Network/virtualNetworks/subnets`.
pub type Subnet = SubResource<SubnetProperties>;

/// A subnet's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubnetProperties {
    /// The IPv4 (or only) prefix.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_prefix: Option<String>,
    /// All prefixes (dual-stack subnets).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub address_prefixes: Option<Vec<String>>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

// ---------------------------------------------------------------------------------------------
// Microsoft.Compute

/// `Microsoft.Compute/virtualMachines`.
pub type VirtualMachine = Resource<VirtualMachineProperties>;

/// A VM's properties (also a scale-set VM's).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VirtualMachineProperties {
    /// The VM's unique id (GUID).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_id: Option<String>,
    /// The size.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hardware_profile: Option<HardwareProfile>,
    /// The OS profile (`computerName`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub os_profile: Option<OsProfile>,
    /// The NICs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_profile: Option<NetworkProfile>,
    /// A scale-set VM's network configuration (where its backend pools are set).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_profile_configuration: Option<VmssNetworkProfile>,
    /// The instance view, with `$expand=instanceView` (or from `/instanceView`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instance_view: Option<InstanceView>,
    /// The availability set (VMAS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub availability_set: Option<Ref>,
    /// The flexible scale set this VM belongs to (VMSS Flex).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machine_scale_set: Option<Ref>,
    /// `Succeeded`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `hardwareProfile`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HardwareProfile {
    /// The VM size, e.g. `Standard_D2s_v3`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vm_size: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `osProfile`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OsProfile {
    /// The host name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub computer_name: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `networkProfile` of a VM: its NICs.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkProfile {
    /// NIC references (`properties.primary` marks the primary one).
    #[serde(default)]
    pub network_interfaces: Vec<NicReference>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A VM's NIC reference.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NicReference {
    /// The NIC's ARM ID.
    #[serde(default)]
    pub id: String,
    /// `{"primary": bool}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub properties: Option<NicReferenceProperties>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A NIC reference's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NicReferenceProperties {
    /// Whether it is the primary NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<bool>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// An instance view: power state, fault domain.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceView {
    /// `ProvisioningState/succeeded`, `PowerState/running`, …
    #[serde(default)]
    pub statuses: Vec<InstanceViewStatus>,
    /// The platform fault domain.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub platform_fault_domain: Option<i32>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

impl InstanceView {
    /// The power state's code suffix: `running`, `stopped`, `deallocated`, … (lower case).
    pub fn power_state(&self) -> Option<String> {
        self.statuses
            .iter()
            .filter_map(|s| s.code.as_deref())
            .find_map(|c| c.strip_prefix("PowerState/"))
            .map(str::to_ascii_lowercase)
    }
}

/// One instance-view status.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceViewStatus {
    /// E.g. `PowerState/running`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub code: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `Microsoft.Compute/virtualMachineScaleSets`.
pub type VirtualMachineScaleSet = Resource<ScaleSetProperties>;
/// `…/virtualMachineScaleSets/{ss}/virtualMachines/{id}` (uniform orchestration). The
/// top-level `instanceId` is in `extra` (the Node lookups read it from
/// [`super::views::Listed::instance_id`]).
pub type VirtualMachineScaleSetVm = Resource<VirtualMachineProperties>;

/// A scale set's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleSetProperties {
    /// `Uniform` or `Flexible`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub orchestration_mode: Option<String>,
    /// The model every instance gets.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub virtual_machine_profile: Option<ScaleSetVmProfile>,
    /// `Succeeded`, …
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// `virtualMachineProfile` of a scale set.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleSetVmProfile {
    /// The NIC configurations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network_profile: Option<VmssNetworkProfile>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A scale set's (or scale-set VM's) NIC configurations.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmssNetworkProfile {
    /// The NIC configurations.
    #[serde(default)]
    pub network_interface_configurations: Vec<SubResource<VmssNicProperties>>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A scale-set NIC configuration's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmssNicProperties {
    /// Whether it is the primary NIC.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<bool>,
    /// Its IP configurations.
    #[serde(default, rename = "ipConfigurations")]
    pub ip_configurations: Vec<SubResource<VmssIpProperties>>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A scale-set IP configuration's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmssIpProperties {
    /// Whether it is the primary IP configuration.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<bool>,
    /// The subnet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<Ref>,
    /// `IPv4` or `IPv6`.
    #[serde(default, rename = "privateIPAddressVersion", skip_serializing_if = "Option::is_none")]
    pub private_ip_address_version: Option<String>,
    /// The load balancer backend pools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancer_backend_address_pools: Option<Vec<Ref>>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_round_trip_keeps_every_field_the_model_does_not_name() {
        let body = serde_json::json!({
            "id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/k",
            "name": "k", "location": "eastus", "etag": "W/\"3\"",
            "sku": {"name": "Standard", "tier": "Regional"},
            "operatorField": {"x": 1},
            "properties": {
                "frontendIPConfigurations": [{"name": "f", "zones": ["1"], "properties": {
                    "privateIPAddress": "10.0.0.9", "gatewayLoadBalancer": {"id": "g"}}}],
                "backendAddressPools": [], "loadBalancingRules": [], "probes": [],
                "outboundRules": [{"name": "o", "properties": {"allocatedOutboundPorts": 1024}}],
                "inboundNatRules": []
            }
        });
        let lb: LoadBalancer = serde_json::from_value(body.clone()).unwrap();
        assert_eq!(lb.properties.frontend_ip_configurations[0].name(), "f");
        assert_eq!(serde_json::to_value(&lb).unwrap(), body);
    }
}
