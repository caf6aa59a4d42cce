//! Lookup-only projections of the resources the Node lookups list: VMs (standalone and
//! scale-set), NICs, public IPs and scale sets, decoded with only the fields a lookup reads.
//!
//! [`super::models`] keeps every field it does not name (ARM's PUT replaces a resource whole),
//! which is what a write needs and what a listing of thousands of VMs held for a few seconds
//! does not: at 5000 Nodes the VM and NIC listings held as models were 64 MB of a 101 MB heap
//! (#35). A view skips the other fields as it decodes (no flattened map, so nothing is
//! buffered), and is never written back. Field names follow the models', so a lookup reads a
//! view as it would read the model.

use serde::Deserialize;

/// A listed resource, with the top-level fields a lookup reads.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Listed<P> {
    /// The ARM resource ID.
    #[serde(default)]
    pub id: Option<String>,
    /// The resource name.
    #[serde(default)]
    pub name: Option<String>,
    /// The location (region).
    #[serde(default)]
    pub location: Option<String>,
    /// Availability zones (`["1"]`).
    #[serde(default)]
    pub zones: Option<Vec<String>>,
    /// The SKU (a uniform scale-set VM's size is its `sku.name`).
    #[serde(default)]
    pub sku: Option<SkuName>,
    /// A uniform scale-set VM's instance ID (`"0"`, `"1"`, …).
    #[serde(default)]
    pub instance_id: Option<String>,
    /// The properties a lookup reads.
    #[serde(default)]
    pub properties: P,
}

impl<P> Listed<P> {
    /// The name, or `""`.
    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or_default()
    }

    /// The ID, or `""`.
    pub fn id(&self) -> &str {
        self.id.as_deref().unwrap_or_default()
    }
}

/// `sku.name`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct SkuName {
    /// The SKU name (a VM size for scale-set VMs).
    #[serde(default)]
    pub name: Option<String>,
}

/// A VM (`Microsoft.Compute/virtualMachines`, or a uniform scale set's VM).
pub type VmView = Listed<VmProperties>;
/// A NIC (`Microsoft.Network/networkInterfaces`, or a scale-set VM's).
pub type NicView = Listed<NicProperties>;
/// A public IP address (`Microsoft.Network/publicIPAddresses`).
pub type PublicIpView = Listed<PublicIpProperties>;
/// A scale set (`Microsoft.Compute/virtualMachineScaleSets`).
pub type ScaleSetView = Listed<ScaleSetProperties>;

/// A scale set's orchestration mode.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ScaleSetProperties {
    /// `Uniform` or `Flexible`.
    #[serde(default)]
    pub orchestration_mode: Option<String>,
}

/// A VM's properties, as far as a lookup reads them.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VmProperties {
    /// `hardwareProfile.vmSize`.
    #[serde(default)]
    pub hardware_profile: Option<HardwareProfile>,
    /// `osProfile.computerName`.
    #[serde(default)]
    pub os_profile: Option<OsProfile>,
    /// The NIC references.
    #[serde(default)]
    pub network_profile: Option<NetworkProfile>,
    /// The instance view (`$expand=instanceView`).
    #[serde(default)]
    pub instance_view: Option<InstanceView>,
    /// `Succeeded`, …
    #[serde(default)]
    pub provisioning_state: Option<String>,
}

/// `hardwareProfile`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct HardwareProfile {
    /// The VM size, e.g. `Standard_D2s_v3`.
    #[serde(default)]
    pub vm_size: Option<String>,
}

/// `osProfile`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OsProfile {
    /// The host name.
    #[serde(default)]
    pub computer_name: Option<String>,
}

/// `networkProfile`: the VM's NICs.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkProfile {
    /// NIC references (`properties.primary` marks the primary one).
    #[serde(default)]
    pub network_interfaces: Vec<NicReference>,
}

/// A VM's NIC reference.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct NicReference {
    /// The NIC's ARM ID.
    #[serde(default)]
    pub id: String,
    /// `{"primary": bool}`.
    #[serde(default)]
    pub properties: Option<Primary>,
}

/// `{"primary": bool}`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Primary {
    /// Whether it is the primary one.
    #[serde(default)]
    pub primary: Option<bool>,
}

/// A VM's instance view: its statuses' codes and its fault domain.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InstanceView {
    /// `ProvisioningState/succeeded`, `PowerState/running`, …
    #[serde(default)]
    pub statuses: Vec<Status>,
    /// The platform fault domain.
    #[serde(default)]
    pub platform_fault_domain: Option<i32>,
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
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Status {
    /// E.g. `PowerState/running`.
    #[serde(default)]
    pub code: Option<String>,
}

/// A NIC's properties: its IP configurations.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NicProperties {
    /// The IP configurations.
    #[serde(default, rename = "ipConfigurations")]
    pub ip_configurations: Vec<IpConfiguration>,
}

/// One IP configuration of a NIC.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct IpConfiguration {
    /// Its properties.
    #[serde(default)]
    pub properties: IpConfigurationProperties,
}

/// An IP configuration's addresses.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpConfigurationProperties {
    /// The private IP.
    #[serde(default, rename = "privateIPAddress")]
    pub private_ip_address: Option<String>,
    /// `IPv4` or `IPv6`.
    #[serde(default, rename = "privateIPAddressVersion")]
    pub private_ip_address_version: Option<String>,
    /// Whether it is the NIC's primary configuration.
    #[serde(default)]
    pub primary: Option<bool>,
    /// The public IP resource it uses.
    #[serde(default, rename = "publicIPAddress")]
    pub public_ip_address: Option<IdRef>,
}

/// A reference to another resource: `{"id": …}`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct IdRef {
    /// The referenced resource's ARM ID.
    #[serde(default)]
    pub id: String,
}

/// A public IP's address.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicIpProperties {
    /// The address, once allocated.
    #[serde(default)]
    pub ip_address: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::client::models;

    /// A VM as ARM lists it with `$expand=instanceView`, with the profiles a lookup never reads.
    fn listed_vm() -> serde_json::Value {
        serde_json::json!({
            "id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/n1",
            "name": "n1", "type": "Microsoft.Compute/virtualMachines", "location": "eastus",
            "zones": ["2"], "tags": {"k": "v"}, "instanceId": "7",
            "sku": {"name": "Standard_B", "tier": "Standard"},
            "identity": {"type": "SystemAssigned", "principalId": "p"},
            "properties": {
                "vmId": "guid", "provisioningState": "Succeeded",
                "hardwareProfile": {"vmSize": "Standard_A"},
                "storageProfile": {"osDisk": {"name": "d", "managedDisk": {"id": "x"}},
                                   "imageReference": {"publisher": "p", "offer": "o"}},
                "osProfile": {"computerName": "host-1", "adminUsername": "u",
                              "linuxConfiguration": {"ssh": {"publicKeys": [{"keyData": "k"}]}}},
                "networkProfile": {"networkInterfaces": [
                    {"id": "/nic/a", "properties": {"primary": false}},
                    {"id": "/nic/b", "properties": {"primary": true}}]},
                "instanceView": {"platformFaultDomain": 1,
                    "vmAgent": {"vmAgentVersion": "2.2"},
                    "statuses": [{"code": "ProvisioningState/succeeded", "level": "Info"},
                                 {"code": "PowerState/Deallocated", "displayStatus": "VM deallocated"}]}
            }
        })
    }

    /// What a lookup reads of a VM is the same through the view as through the full model.
    #[test]
    fn a_vm_view_reads_what_the_model_reads() {
        let view: VmView = serde_json::from_value(listed_vm()).unwrap();
        let model: models::VirtualMachineScaleSetVm = serde_json::from_value(listed_vm()).unwrap();
        assert_eq!(view.id(), model.id());
        assert_eq!(view.name(), model.name());
        assert_eq!(view.location, model.location);
        assert_eq!(view.zones, model.zones);
        assert_eq!(
            view.instance_id.as_deref(),
            model.extra.get("instanceId").and_then(serde_json::Value::as_str)
        );
        assert_eq!(view.sku.and_then(|s| s.name), model.sku.and_then(|s| s.name));
        let (v, m) = (view.properties, model.properties);
        assert_eq!(
            v.hardware_profile.and_then(|h| h.vm_size),
            m.hardware_profile.and_then(|h| h.vm_size)
        );
        assert_eq!(
            v.os_profile.and_then(|o| o.computer_name),
            m.os_profile.and_then(|o| o.computer_name)
        );
        let nics = |ids: Vec<(String, Option<bool>)>| ids;
        assert_eq!(
            nics(
                v.network_profile
                    .unwrap()
                    .network_interfaces
                    .into_iter()
                    .map(|n| (n.id, n.properties.and_then(|p| p.primary)))
                    .collect()
            ),
            nics(
                m.network_profile
                    .unwrap()
                    .network_interfaces
                    .into_iter()
                    .map(|n| (n.id, n.properties.and_then(|p| p.primary)))
                    .collect()
            )
        );
        let (vi, mi) = (v.instance_view.unwrap(), m.instance_view.unwrap());
        assert_eq!(vi.power_state().as_deref(), Some("deallocated"));
        assert_eq!(vi.power_state(), mi.power_state());
        assert_eq!(vi.platform_fault_domain, mi.platform_fault_domain);
        assert_eq!(v.provisioning_state, m.provisioning_state);
    }

    #[test]
    fn a_nic_view_keeps_each_configurations_addresses() {
        let nic: NicView = serde_json::from_value(serde_json::json!({
            "id": "/nic/b", "name": "b", "etag": "W/\"1\"",
            "properties": {"macAddress": "00-0D", "enableIPForwarding": false,
                "virtualMachine": {"id": "/vm"},
                "ipConfigurations": [
                    {"id": "/nic/b/ipConfigurations/v4", "name": "v4", "properties": {
                        "primary": true, "privateIPAddress": "10.0.0.4",
                        "privateIPAddressVersion": "IPv4", "subnet": {"id": "/subnet"},
                        "publicIPAddress": {"id": "/pip/1"}}},
                    {"name": "v6", "properties": {"privateIPAddress": "fd00::4",
                        "privateIPAddressVersion": "IPv6"}}]}
        }))
        .unwrap();
        let c = &nic.properties.ip_configurations;
        assert_eq!(c.len(), 2);
        assert_eq!(c[0].properties.primary, Some(true));
        assert_eq!(c[0].properties.private_ip_address.as_deref(), Some("10.0.0.4"));
        assert_eq!(
            c[0].properties.public_ip_address.as_ref().map(|r| r.id.as_str()),
            Some("/pip/1")
        );
        assert_eq!(c[1].properties.private_ip_address_version.as_deref(), Some("IPv6"));
        assert_eq!(c[1].properties.primary, None);
    }
}
