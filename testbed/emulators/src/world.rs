//! The declarative world file every cloud emulator loads (YAML or JSON): instances (name,
//! zone, IPs, power state, type, tags/labels), networks and subnets, so a test, the demo and a
//! benchmark say "3 instances in 2 zones" the same way for every cloud.
//!
//! ```yaml
//! region: us-east-1
//! networks:
//!   - { name: vpc-1, cidr: 10.0.0.0/16 }
//! subnets:
//!   - { name: subnet-a, network: vpc-1, zone: us-east-1a, cidr: 10.0.0.0/24 }
//!   - { name: subnet-b, network: vpc-1, zone: us-east-1b, cidr: 10.0.1.0/24 }
//! instances:
//!   - { name: node-1, zone: us-east-1a, type: m5.large, subnet: subnet-a, private_ips: [10.0.0.4] }
//!   - { name: node-2, zone: us-east-1a, power: stopped, tags: { role: worker } }
//!   - { name: node-3, zone: us-east-1b, public_ips: [203.0.113.7] }
//! timing: { profile: realistic, scale: 0.1 }  # optional: long-running operations' timing
//! ```
//!
//! Each cloud maps these onto its own resources (an instance's `tags` are AWS tags, GCE
//! labels, Azure tags…). Loading checks references (unique names, known subnets/networks,
//! declared zones) and says which entry is wrong.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// A world file did not load.
#[derive(Debug, thiserror::Error)]
pub enum WorldError {
    /// The file could not be read.
    #[error("reading world file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The text is not a valid world.
    #[error("world {origin}: {detail}")]
    Invalid {
        /// The file (or `<inline>`).
        origin: String,
        /// What is wrong.
        detail: String,
    },
}

/// An instance's power state.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PowerState {
    /// Running (the default).
    #[default]
    Running,
    /// Stopped / powered off / deallocated.
    Stopped,
    /// Terminated / deleted but still listed by the cloud for a while.
    Terminated,
}

/// A virtual network (VPC, VNet, GCE network, Neutron network).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Network {
    /// Name, unique in the world.
    pub name: String,
    /// Address range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
}

/// A subnet in one zone.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Subnet {
    /// Name, unique in the world.
    pub name: String,
    /// The network it belongs to (a [`Network::name`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<String>,
    /// Its zone.
    pub zone: String,
    /// Address range.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cidr: Option<String>,
}

/// A VM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Instance {
    /// Name, unique in the world (the node name unless the cloud derives it otherwise).
    pub name: String,
    /// The cloud's id; the emulator makes one up when absent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
    /// Its zone.
    pub zone: String,
    /// Machine type (`m5.large`, `n2-standard-4`, `Standard_D2s_v3`…).
    #[serde(default, rename = "type", skip_serializing_if = "Option::is_none")]
    pub instance_type: Option<String>,
    /// Power state (default running).
    #[serde(default)]
    pub power: PowerState,
    /// The subnet of its primary NIC (a [`Subnet::name`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub subnet: Option<String>,
    /// Private addresses, primary first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub private_ips: Vec<IpAddr>,
    /// Public addresses.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub public_ips: Vec<IpAddr>,
    /// Tags or labels.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub tags: BTreeMap<String, String>,
}

/// A whole emulated cloud account/project/subscription.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct World {
    /// The region (each cloud has a default when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub region: Option<String>,
    /// Zones that exist; when given, every instance and subnet zone must be one of them.
    /// When empty, the zones are those used.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub zones: Vec<String>,
    /// Networks.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub networks: Vec<Network>,
    /// Subnets.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub subnets: Vec<Subnet>,
    /// Instances.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instances: Vec<Instance>,
    /// The timing profile of long-running operations (default `fast`, scale 1): what the
    /// `ccm-emulator` binary starts with (its `--timing`/`--time-scale` win) and what a
    /// `reset` restores; in-process, pass it as `ServerOptions::timing`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timing: Option<crate::asyncop::TimingSelection>,
}

impl World {
    /// Reads and checks a world file (YAML or JSON).
    pub fn load(path: &Path) -> Result<World, WorldError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| WorldError::Read { path: path.to_path_buf(), source })?;
        Self::parse_named(&text, &path.display().to_string())
    }

    /// Parses and checks a world from YAML or JSON text.
    pub fn parse(text: &str) -> Result<World, WorldError> {
        Self::parse_named(text, "<inline>")
    }

    fn parse_named(text: &str, origin: &str) -> Result<World, WorldError> {
        let invalid = |detail: String| WorldError::Invalid { origin: origin.into(), detail };
        let world: World = if text.trim_start().starts_with('{') {
            serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?
        } else {
            serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?
        };
        world.check().map_err(invalid)?;
        Ok(world)
    }

    /// `n` running instances `node-0`… spread round-robin over `zones`, one subnet per zone
    /// (`10.<z>.0.0/16` in network `net-0`): the same shape for tests, the demo and
    /// benchmarks.
    pub fn synthetic(n: usize, zones: &[&str]) -> World {
        let zones: Vec<String> = if zones.is_empty() {
            vec!["zone-a".to_string()]
        } else {
            zones.iter().map(|z| z.to_string()).collect()
        };
        let subnets = zones
            .iter()
            .enumerate()
            .map(|(i, z)| Subnet {
                name: format!("subnet-{i}"),
                network: Some("net-0".into()),
                zone: z.clone(),
                cidr: Some(format!("10.{i}.0.0/16")),
            })
            .collect();
        let instances = (0..n)
            .map(|i| {
                let z = i % zones.len();
                let host = i / zones.len() + 4;
                Instance {
                    name: format!("node-{i}"),
                    id: None,
                    zone: zones[z].clone(),
                    instance_type: None,
                    power: PowerState::Running,
                    subnet: Some(format!("subnet-{z}")),
                    private_ips: vec![IpAddr::from([10, z as u8, (host >> 8) as u8, host as u8])],
                    public_ips: Vec::new(),
                    tags: BTreeMap::new(),
                }
            })
            .collect();
        World {
            region: None,
            zones: zones.clone(),
            networks: vec![Network { name: "net-0".into(), cidr: Some("10.0.0.0/8".into()) }],
            subnets,
            instances,
            timing: None,
        }
    }

    /// Every zone: the declared ones, or those instances and subnets use.
    pub fn zones(&self) -> BTreeSet<String> {
        if !self.zones.is_empty() {
            return self.zones.iter().cloned().collect();
        }
        self.instances
            .iter()
            .map(|i| i.zone.clone())
            .chain(self.subnets.iter().map(|s| s.zone.clone()))
            .collect()
    }

    /// The instance with this name.
    pub fn instance(&self, name: &str) -> Option<&Instance> {
        self.instances.iter().find(|i| i.name == name)
    }

    fn check(&self) -> Result<(), String> {
        if let Some(t) = &self.timing {
            t.validate().map_err(|e| format!("timing: {e}"))?;
        }
        let mut names = BTreeSet::new();
        for n in &self.networks {
            if !names.insert(("network", n.name.as_str())) {
                return Err(format!("network {:?} is declared twice", n.name));
            }
        }
        let declared: BTreeSet<&str> = self.zones.iter().map(String::as_str).collect();
        let zone_ok = |z: &str| declared.is_empty() || declared.contains(z);
        for s in &self.subnets {
            if !names.insert(("subnet", s.name.as_str())) {
                return Err(format!("subnet {:?} is declared twice", s.name));
            }
            if let Some(net) = &s.network
                && !names.contains(&("network", net.as_str()))
            {
                return Err(format!("subnet {:?}: unknown network {net:?}", s.name));
            }
            if !zone_ok(&s.zone) {
                return Err(format!("subnet {:?}: zone {:?} is not in zones", s.name, s.zone));
            }
        }
        for i in &self.instances {
            if i.name.is_empty() {
                return Err("an instance has an empty name".into());
            }
            if !names.insert(("instance", i.name.as_str())) {
                return Err(format!("instance {:?} is declared twice", i.name));
            }
            if !zone_ok(&i.zone) {
                return Err(format!("instance {:?}: zone {:?} is not in zones", i.name, i.zone));
            }
            if let Some(sn) = &i.subnet {
                match self.subnets.iter().find(|s| &s.name == sn) {
                    None => return Err(format!("instance {:?}: unknown subnet {sn:?}", i.name)),
                    Some(s) if s.zone != i.zone => {
                        return Err(format!(
                            "instance {:?} in zone {:?} is on subnet {sn:?} of zone {:?}",
                            i.name, i.zone, s.zone
                        ));
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn synthetic_worlds_are_valid() {
        let w = World::synthetic(5000, &["a", "b", "c"]);
        w.check().unwrap();
        assert_eq!(w.instances.len(), 5000);
        assert_eq!(w.zones().len(), 3);
        let ips: BTreeSet<_> = w.instances.iter().map(|i| i.private_ips[0]).collect();
        assert_eq!(ips.len(), 5000, "private IPs are unique");
    }

    #[test]
    fn errors_name_the_entry() {
        let e = World::parse("instances:\n  - {name: a, zone: z1, subnet: nope}\n").unwrap_err();
        assert!(e.to_string().contains("unknown subnet \"nope\""), "{e}");
        let e = World::parse("zones: [z1]\ninstances:\n  - {name: a, zone: z2}\n").unwrap_err();
        assert!(e.to_string().contains("zone \"z2\" is not in zones"), "{e}");
        let e = World::parse("instances:\n  - {name: a, zone: z, colour: red}\n").unwrap_err();
        assert!(e.to_string().contains("colour"), "{e}");
    }
}
