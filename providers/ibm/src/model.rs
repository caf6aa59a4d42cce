//! The VPC API's resources, as far as the provider reads them (field names as in IBM's
//! API reference and `vpc-go-sdk` v1.0.2's `vpcv1`). Every field has a default, so a reply
//! with fields we do not read (or an older API version missing one we do) still parses;
//! the code that needs a field checks it is there.

use serde::Deserialize;

/// `{ "id", "name" }` references (zones and profiles only have a name).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Reference {
    /// The resource ID (empty for zones and profiles).
    pub id: String,
    /// The resource name.
    pub name: String,
}

/// An address (`{ "address": "10.0.0.4" }`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Address {
    /// The IP address.
    pub address: String,
}

/// A virtual server instance's network interface.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct NetworkInterface {
    /// The interface ID.
    pub id: String,
    /// The primary IP (API versions since 2022-03-29).
    pub primary_ip: Address,
    /// The primary IPv4 address (older API versions).
    pub primary_ipv4_address: String,
    /// The subnet.
    pub subnet: Reference,
}

impl NetworkInterface {
    /// The primary IP in either API version's field; empty when neither is set.
    pub fn ip(&self) -> &str {
        if self.primary_ip.address.is_empty() {
            &self.primary_ipv4_address
        } else {
            &self.primary_ip.address
        }
    }
}

/// A virtual server instance (`GET /instances`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Instance {
    /// The instance ID.
    pub id: String,
    /// The instance name.
    pub name: String,
    /// `pending`, `running`, `starting`, `stopping`, `stopped`, `restarting`, `deleting`,
    /// `failed`.
    pub status: String,
    /// The zone.
    pub zone: Reference,
    /// The profile (instance type).
    pub profile: Reference,
    /// The VPC.
    pub vpc: Reference,
    /// The primary network interface.
    pub primary_network_interface: NetworkInterface,
}

/// A subnet (`GET /subnets`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Subnet {
    /// The subnet ID.
    pub id: String,
    /// The subnet name.
    pub name: String,
    /// The IPv4 CIDR.
    pub ipv4_cidr_block: String,
    /// The VPC.
    pub vpc: Reference,
    /// The zone.
    pub zone: Reference,
}

/// A load balancer profile reference.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Profile {
    /// The profile name.
    pub name: String,
    /// `application` or `network`.
    pub family: String,
}

/// A load balancer (`GET /load_balancers`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct LoadBalancer {
    /// The load balancer ID.
    pub id: String,
    /// Its CRN (Global Tagging attaches tags to it).
    pub crn: String,
    /// The name.
    pub name: String,
    /// The DNS name clients use.
    pub hostname: String,
    /// Public (internet-facing) or private.
    pub is_public: bool,
    /// `online` / `offline`.
    pub operating_status: String,
    /// `active`, `create_pending`, `update_pending`, `delete_pending`,
    /// `maintenance_pending`, `failed`.
    pub provisioning_status: String,
    /// The listeners.
    pub listeners: Vec<Reference>,
    /// The pools.
    pub pools: Vec<Reference>,
    /// The subnets.
    pub subnets: Vec<Reference>,
    /// Private IPs.
    pub private_ips: Vec<Address>,
    /// Public IPs.
    pub public_ips: Vec<Address>,
    /// The profile.
    pub profile: Profile,
}

impl LoadBalancer {
    /// `operating/provisioning`, as upstream logs it.
    pub fn status(&self) -> String {
        format!("{}/{}", self.operating_status, self.provisioning_status)
    }

    /// Whether the provisioning status is `active` (mutations are allowed).
    pub fn is_active(&self) -> bool {
        self.provisioning_status == "active"
    }
}

/// A listener (`GET /load_balancers/{id}/listeners`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Listener {
    /// The listener ID.
    pub id: String,
    /// The frontend port.
    pub port: i64,
    /// `tcp`, `http`, `https`, `udp`.
    pub protocol: String,
    /// The default pool.
    pub default_pool: Option<Reference>,
    /// The provisioning status.
    pub provisioning_status: String,
}

/// A pool's health monitor.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct HealthMonitor {
    /// Seconds between checks.
    pub delay: i64,
    /// Failed checks before a member is unhealthy.
    pub max_retries: i64,
    /// The port checked (absent: the member's port).
    pub port: Option<i64>,
    /// Seconds a check may take.
    pub timeout: i64,
    /// `tcp`, `http`, `https`.
    #[serde(rename = "type")]
    pub kind: String,
    /// The HTTP path.
    pub url_path: Option<String>,
}

/// A pool (`GET /load_balancers/{id}/pools`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Pool {
    /// The pool ID.
    pub id: String,
    /// The name (`<protocol>-<port>-<nodePort>` for ours).
    pub name: String,
    /// `round_robin`, ...
    pub algorithm: String,
    /// `tcp`, ...
    pub protocol: String,
    /// `disabled`, `v1`, `v2`.
    pub proxy_protocol: String,
    /// The health monitor.
    pub health_monitor: HealthMonitor,
    /// Member references.
    pub members: Vec<Reference>,
    /// The provisioning status.
    pub provisioning_status: String,
}

/// A pool member's target.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct MemberTarget {
    /// The IP address (IP targets).
    pub address: String,
    /// The instance ID (instance targets).
    pub id: String,
}

/// A pool member (`GET /load_balancers/{id}/pools/{pool_id}/members`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct Member {
    /// The member ID.
    pub id: String,
    /// The backend port.
    pub port: i64,
    /// The target.
    pub target: MemberTarget,
    /// `ok`, `faulted`, `unknown`.
    pub health: String,
    /// The provisioning status.
    pub provisioning_status: String,
}

/// A resource group (Resource Manager `GET /v2/resource_groups`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(default)]
pub struct ResourceGroup {
    /// The ID.
    pub id: String,
    /// The name.
    pub name: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replies_parse_with_either_primary_ip_shape_and_extra_fields() {
        let i: Instance = serde_json::from_value(serde_json::json!({
            "id": "0717_1", "name": "n1", "status": "running", "zone": {"name": "us-south-1", "href": "x"},
            "profile": {"name": "bx2-4x16"}, "vpc": {"id": "v", "name": "vpc-a", "crn": "c"},
            "primary_network_interface": {"id": "nic", "primary_ip": {"address": "10.0.0.4"}},
            "bandwidth": 4000
        }))
        .unwrap();
        assert_eq!(i.primary_network_interface.ip(), "10.0.0.4");
        let i: Instance = serde_json::from_value(serde_json::json!({
            "id": "0717_1", "primary_network_interface": {"primary_ipv4_address": "10.0.0.5"}
        }))
        .unwrap();
        assert_eq!(i.primary_network_interface.ip(), "10.0.0.5");
        let hm: HealthMonitor = serde_json::from_value(
            serde_json::json!({"delay": 5, "max_retries": 2, "timeout": 2, "type": "http", "port": 31000, "url_path": "/"}),
        )
        .unwrap();
        assert_eq!((hm.kind.as_str(), hm.port), ("http", Some(31000)));
    }
}
