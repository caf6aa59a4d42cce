//! Azure providerIDs, as upstream writes them: `azure://` + the VM's ARM resource ID.
//!
//! - availability-set, standalone and flexible-scale-set VMs:
//!   `azure:///subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachines/<vm>`
//! - uniform scale-set VMs:
//!   `azure:///subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachineScaleSets/<ss>/virtualMachines/<instance id>`
//!
//! Upstream lower-cases the resource group in some paths and not in others; ARM compares
//! IDs case-insensitively, and so does [`VmRef::parse`].

/// The VM a providerID names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VmRef {
    /// A VM (availability set, standalone, or flexible scale set).
    Vm {
        /// The subscription.
        subscription: String,
        /// The resource group.
        resource_group: String,
        /// The VM name.
        name: String,
    },
    /// A uniform scale set's VM.
    ScaleSetVm {
        /// The subscription.
        subscription: String,
        /// The resource group.
        resource_group: String,
        /// The scale set.
        scale_set: String,
        /// The instance ID (`"0"`, `"1"`, …).
        instance_id: String,
    },
}

/// A providerID that is not an Azure VM's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "providerID {0:?} is not an Azure VM (azure:///subscriptions/<sub>/resourceGroups/<rg>/providers/Microsoft.Compute/virtualMachines/<vm> or …/virtualMachineScaleSets/<ss>/virtualMachines/<id>)"
)]
pub struct NotAzure(pub String);

impl VmRef {
    /// Parses a providerID (or a bare ARM ID without the `azure://` prefix).
    pub fn parse(provider_id: &str) -> Result<VmRef, NotAzure> {
        let bad = || NotAzure(provider_id.to_string());
        let id = provider_id.strip_prefix("azure://").unwrap_or(provider_id);
        let parts: Vec<&str> = id.trim_start_matches('/').split('/').collect();
        let eq = |i: usize, want: &str| parts.get(i).is_some_and(|p| p.eq_ignore_ascii_case(want));
        // A segment is one ARM name: not empty, not a dot segment, nothing a URL reads as a
        // query, fragment, escape or separator (the IDs go into request paths: `rg/..` or
        // `rg?x` would list another scope, whose answer says nothing about this VM).
        let nonempty = |i: usize| {
            parts
                .get(i)
                .filter(|p| {
                    !p.is_empty()
                        && **p != "."
                        && **p != ".."
                        && !p.chars().any(|c| matches!(c, '?' | '#' | '%' | '\\') || c.is_control())
                })
                .map(|p| p.to_string())
        };
        if !(eq(0, "subscriptions")
            && eq(2, "resourceGroups")
            && eq(4, "providers")
            && eq(5, "Microsoft.Compute"))
        {
            return Err(bad());
        }
        let subscription = nonempty(1).ok_or_else(bad)?;
        let resource_group = nonempty(3).ok_or_else(bad)?;
        match parts.len() {
            8 if eq(6, "virtualMachines") => {
                Ok(VmRef::Vm { subscription, resource_group, name: nonempty(7).ok_or_else(bad)? })
            }
            10 if eq(6, "virtualMachineScaleSets") && eq(8, "virtualMachines") => {
                Ok(VmRef::ScaleSetVm {
                    subscription,
                    resource_group,
                    scale_set: nonempty(7).ok_or_else(bad)?,
                    instance_id: nonempty(9).ok_or_else(bad)?,
                })
            }
            _ => Err(bad()),
        }
    }

    /// The ARM resource ID.
    pub fn arm_id(&self) -> String {
        match self {
            VmRef::Vm { subscription, resource_group, name } => format!(
                "/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/Microsoft.Compute/virtualMachines/{name}"
            ),
            VmRef::ScaleSetVm { subscription, resource_group, scale_set, instance_id } => format!(
                "/subscriptions/{subscription}/resourceGroups/{resource_group}/providers/Microsoft.Compute/virtualMachineScaleSets/{scale_set}/virtualMachines/{instance_id}"
            ),
        }
    }

    /// The providerID: `azure://` + the ARM ID.
    pub fn provider_id(&self) -> String {
        format!("azure://{}", self.arm_id())
    }

    /// The subscription.
    pub fn subscription(&self) -> &str {
        match self {
            VmRef::Vm { subscription, .. } | VmRef::ScaleSetVm { subscription, .. } => subscription,
        }
    }

    /// The resource group.
    pub fn resource_group(&self) -> &str {
        match self {
            VmRef::Vm { resource_group, .. } | VmRef::ScaleSetVm { resource_group, .. } => {
                resource_group
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vm_and_scale_set_vm_provider_ids_round_trip() {
        for id in [
            "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm-0",
            "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/pool/virtualMachines/3",
        ] {
            assert_eq!(VmRef::parse(id).unwrap().provider_id(), id);
        }
        let v = VmRef::parse(
            "azure:///subscriptions/s/resourcegroups/RG/providers/microsoft.compute/virtualmachines/vm-0",
        )
        .unwrap();
        assert_eq!(
            v,
            VmRef::Vm {
                subscription: "s".into(),
                resource_group: "RG".into(),
                name: "vm-0".into()
            }
        );
    }

    #[test]
    fn other_clouds_and_partial_ids_are_refused() {
        for id in [
            "aws:///us-east-1a/i-0123",
            "azure://",
            "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/",
            "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/networkInterfaces/n",
            "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss",
            // Segments a URL would not keep as one name.
            "azure:///subscriptions/s/resourceGroups/../providers/Microsoft.Compute/virtualMachines/vm",
            "azure:///subscriptions/s/resourceGroups/./providers/Microsoft.Compute/virtualMachines/vm",
            "azure:///subscriptions/s/resourceGroups/rg?x=/providers/Microsoft.Compute/virtualMachines/vm",
            "azure:///subscriptions/s/resourceGroups/rg#x/providers/Microsoft.Compute/virtualMachines/vm",
            "azure:///subscriptions/s/resourceGroups/rg%2Fx/providers/Microsoft.Compute/virtualMachines/vm",
            "azure:///subscriptions/../resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vm",
            "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines/..",
        ] {
            assert!(VmRef::parse(id).is_err(), "{id}");
        }
    }
}
