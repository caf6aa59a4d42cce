//! Octavia v2 (`/lbaas/…`) and the Neutron objects the load balancer uses (floating IPs,
//! networks, subnets, ports, security groups and rules): serde models of the fields read,
//! and one function per call, each with its own operation name. No waiting here: the
//! caller waits for the load balancer to be `ACTIVE` after every Octavia change.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};

use crate::client::{ClientError, OpenStackClient, Service};

/// `null` → the type's default (OpenStack returns `null` for many unset fields).
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: serde::Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

fn decode<T: DeserializeOwned>(op: &str, v: Value) -> Result<T, ClientError> {
    serde_json::from_value(v)
        .map_err(|e| ClientError::Decode { op: op.into(), message: e.to_string() })
}

fn single<T: DeserializeOwned>(op: &str, mut v: Value, key: &str) -> Result<T, ClientError> {
    match v.get_mut(key).map(Value::take) {
        Some(inner) if inner.is_object() => decode(op, inner),
        _ => Err(ClientError::Decode {
            op: op.into(),
            message: format!("no {key:?} object in the reply"),
        }),
    }
}

/// `{"id": …}`.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct IdRef {
    /// The ID.
    pub id: String,
}

/// An Octavia load balancer.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct LoadBalancer {
    /// ID.
    pub id: String,
    /// Name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// Description.
    #[serde(default, deserialize_with = "nullable")]
    pub description: String,
    /// `ACTIVE`, `PENDING_*`, `ERROR`, `DELETED`.
    #[serde(default, deserialize_with = "nullable")]
    pub provisioning_status: String,
    /// The VIP.
    #[serde(default, deserialize_with = "nullable")]
    pub vip_address: String,
    /// The VIP port.
    #[serde(default, deserialize_with = "nullable")]
    pub vip_port_id: String,
    /// The VIP subnet.
    #[serde(default, deserialize_with = "nullable")]
    pub vip_subnet_id: String,
    /// Tags.
    #[serde(default, deserialize_with = "nullable")]
    pub tags: Vec<String>,
    /// Listeners.
    #[serde(default, deserialize_with = "nullable")]
    pub listeners: Vec<IdRef>,
    /// Pools.
    #[serde(default, deserialize_with = "nullable")]
    pub pools: Vec<IdRef>,
}

impl LoadBalancer {
    /// `PENDING_CREATE`/`PENDING_UPDATE`/`PENDING_DELETE`.
    pub fn is_pending(&self) -> bool {
        self.provisioning_status.starts_with("PENDING_")
    }
    /// Being or already deleted.
    pub fn is_deleting(&self) -> bool {
        matches!(self.provisioning_status.as_str(), "PENDING_DELETE" | "DELETED")
    }
}

/// An Octavia listener.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Listener {
    /// ID.
    pub id: String,
    /// Name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// `TCP`, `UDP`, `SCTP`, `HTTP`, …
    #[serde(default, deserialize_with = "nullable")]
    pub protocol: String,
    /// Port.
    #[serde(default, deserialize_with = "nullable")]
    pub protocol_port: i64,
    /// `connection_limit`.
    #[serde(default, deserialize_with = "nullable")]
    pub connection_limit: i64,
    /// `timeout_client_data`.
    #[serde(default, deserialize_with = "nullable")]
    pub timeout_client_data: i64,
    /// `timeout_member_connect`.
    #[serde(default, deserialize_with = "nullable")]
    pub timeout_member_connect: i64,
    /// `timeout_member_data`.
    #[serde(default, deserialize_with = "nullable")]
    pub timeout_member_data: i64,
    /// `timeout_tcp_inspect`.
    #[serde(default, deserialize_with = "nullable")]
    pub timeout_tcp_inspect: i64,
    /// `insert_headers`.
    #[serde(default, deserialize_with = "nullable")]
    pub insert_headers: BTreeMap<String, String>,
    /// `allowed_cidrs`.
    #[serde(default, deserialize_with = "nullable")]
    pub allowed_cidrs: Vec<String>,
    /// Tags.
    #[serde(default, deserialize_with = "nullable")]
    pub tags: Vec<String>,
    /// Its default pool.
    #[serde(default, deserialize_with = "nullable")]
    pub default_pool_id: String,
    /// `default_tls_container_ref` (`TERMINATED_HTTPS`).
    #[serde(default, deserialize_with = "nullable")]
    pub default_tls_container_ref: String,
}

/// An Octavia pool.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Pool {
    /// ID.
    pub id: String,
    /// Name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// `TCP`, `HTTP`, `PROXY`, …
    #[serde(default, deserialize_with = "nullable")]
    pub protocol: String,
    /// `lb_algorithm`.
    #[serde(default, deserialize_with = "nullable")]
    pub lb_algorithm: String,
    /// Listeners using it.
    #[serde(default, deserialize_with = "nullable")]
    pub listeners: Vec<IdRef>,
    /// Its health monitor.
    #[serde(default, deserialize_with = "nullable")]
    pub healthmonitor_id: String,
}

/// A pool member.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Member {
    /// ID.
    pub id: String,
    /// Name (the node's).
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// Address.
    #[serde(default, deserialize_with = "nullable")]
    pub address: String,
    /// Port.
    #[serde(default, deserialize_with = "nullable")]
    pub protocol_port: i64,
    /// Monitor port (0: none).
    #[serde(default, deserialize_with = "nullable")]
    pub monitor_port: i64,
}

/// A health monitor.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct HealthMonitor {
    /// ID.
    pub id: String,
    /// Name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// `TCP`, `UDP-CONNECT`, `HTTP`, …
    #[serde(rename = "type", default, deserialize_with = "nullable")]
    pub kind: String,
    /// Delay.
    #[serde(default, deserialize_with = "nullable")]
    pub delay: i64,
    /// Timeout.
    #[serde(default, deserialize_with = "nullable")]
    pub timeout: i64,
    /// `max_retries`.
    #[serde(default, deserialize_with = "nullable")]
    pub max_retries: i64,
    /// `max_retries_down`.
    #[serde(default, deserialize_with = "nullable")]
    pub max_retries_down: i64,
}

/// A Neutron floating IP.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FloatingIp {
    /// ID.
    pub id: String,
    /// The address.
    #[serde(default, deserialize_with = "nullable")]
    pub floating_ip_address: String,
    /// The port it is associated with.
    #[serde(default, deserialize_with = "nullable")]
    pub port_id: String,
    /// Description (upstream recognises its own by it).
    #[serde(default, deserialize_with = "nullable")]
    pub description: String,
}

/// A Neutron network.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Network {
    /// ID.
    pub id: String,
    /// Name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// `router:external`.
    #[serde(rename = "router:external", default, deserialize_with = "nullable")]
    pub external: bool,
    /// Its subnets.
    #[serde(default, deserialize_with = "nullable")]
    pub subnets: Vec<String>,
}

/// A Neutron subnet.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Subnet {
    /// ID.
    pub id: String,
    /// Name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// Network.
    #[serde(default, deserialize_with = "nullable")]
    pub network_id: String,
    /// CIDR.
    #[serde(default, deserialize_with = "nullable")]
    pub cidr: String,
    /// 4 or 6.
    #[serde(default, deserialize_with = "nullable")]
    pub ip_version: i64,
    /// Tags.
    #[serde(default, deserialize_with = "nullable")]
    pub tags: Vec<String>,
}

/// A fixed IP of a port.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FixedIp {
    /// Address.
    #[serde(default, deserialize_with = "nullable")]
    pub ip_address: String,
    /// Subnet.
    #[serde(default, deserialize_with = "nullable")]
    pub subnet_id: String,
}

/// A Neutron port (with its security groups).
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Port {
    /// ID.
    pub id: String,
    /// The server.
    #[serde(default, deserialize_with = "nullable")]
    pub device_id: String,
    /// What uses it (`compute:nova`, `Octavia`, `network:router_interface`…).
    #[serde(default, deserialize_with = "nullable")]
    pub device_owner: String,
    /// Fixed IPs.
    #[serde(default, deserialize_with = "nullable")]
    pub fixed_ips: Vec<FixedIp>,
    /// Security groups.
    #[serde(default, deserialize_with = "nullable")]
    pub security_groups: Vec<String>,
    /// `port_security_enabled` (absent: enabled).
    #[serde(default)]
    pub port_security_enabled: Option<bool>,
}

/// A Neutron security group.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SecurityGroup {
    /// ID.
    pub id: String,
    /// Name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// Description.
    #[serde(default, deserialize_with = "nullable")]
    pub description: String,
}

/// A Neutron security group rule.
#[derive(Debug, Clone, Default, Deserialize, PartialEq, Eq)]
pub struct Rule {
    /// ID.
    #[serde(default, deserialize_with = "nullable")]
    pub id: String,
    /// `ingress`/`egress`.
    #[serde(default, deserialize_with = "nullable")]
    pub direction: String,
    /// `IPv4`/`IPv6`.
    #[serde(default, deserialize_with = "nullable")]
    pub ethertype: String,
    /// `tcp`, `udp`, `sctp` (empty: any).
    #[serde(default, deserialize_with = "nullable")]
    pub protocol: String,
    /// First port.
    #[serde(default, deserialize_with = "nullable")]
    pub port_range_min: i64,
    /// Last port.
    #[serde(default, deserialize_with = "nullable")]
    pub port_range_max: i64,
    /// Source CIDR.
    #[serde(default, deserialize_with = "nullable")]
    pub remote_ip_prefix: String,
}

impl Rule {
    /// Same rule (IDs aside; protocol case-insensitive), as upstream compares them.
    pub fn same(&self, other: &Rule) -> bool {
        self.direction == other.direction
            && self.protocol.eq_ignore_ascii_case(&other.protocol)
            && self.ethertype == other.ethertype
            && self.remote_ip_prefix == other.remote_ip_prefix
            && self.port_range_min == other.port_range_min
            && self.port_range_max == other.port_range_max
    }
}

/// The Octavia and Neutron calls of the load balancer.
#[derive(Debug, Clone, Copy)]
pub struct Api<'a> {
    /// The client.
    pub client: &'a OpenStackClient,
}

const LB: Service = Service::LoadBalancer;
const NET: Service = Service::Network;

impl Api<'_> {
    // ---- API versions --------------------------------------------------------------------

    /// Octavia's API versions (`GET /` on the load-balancer endpoint): the highest `v2.N`
    /// listed, as `(2, N)`. Upstream takes the last entry; Octavia lists them in order, so
    /// the highest is the same one, without relying on the order.
    pub async fn api_version(&self) -> Result<(u32, u32), ClientError> {
        const OP: &str = "octavia:ListVersions";
        let v = self.client.get_root(OP, LB).await?;
        let items = v.get("versions").and_then(Value::as_array).cloned().unwrap_or_default();
        items
            .iter()
            .filter_map(|i| i.get("id").and_then(Value::as_str).and_then(parse_version))
            .filter(|(major, _)| *major == 2)
            .max()
            .ok_or_else(|| ClientError::Decode {
                op: OP.into(),
                message: "no API version (\"versions\": [{\"id\": \"v2.N\"}]) in the reply".into(),
            })
    }

    // ---- load balancers ----------------------------------------------------------------

    /// Load balancers, optionally by exact name.
    pub async fn list_load_balancers(
        &self,
        name: Option<&str>,
    ) -> Result<Vec<LoadBalancer>, ClientError> {
        const OP: &str = "octavia:ListLoadBalancers";
        let query: Vec<(&str, String)> =
            name.map(|n| ("name", n.to_string())).into_iter().collect();
        self.client.list(OP, LB, &["lbaas", "loadbalancers"], &query, "loadbalancers").await
    }

    /// One load balancer; `None` on 404.
    pub async fn get_load_balancer(&self, id: &str) -> Result<Option<LoadBalancer>, ClientError> {
        const OP: &str = "octavia:GetLoadBalancer";
        match self.client.get(OP, LB, &["lbaas", "loadbalancers", id], &[]).await {
            Ok(v) => single(OP, v, "loadbalancer").map(Some),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates a load balancer (`body` is the `loadbalancer` object).
    pub async fn create_load_balancer(&self, body: Value) -> Result<LoadBalancer, ClientError> {
        const OP: &str = "octavia:CreateLoadBalancer";
        let v = self
            .client
            .post(OP, LB, &["lbaas", "loadbalancers"], &json!({ "loadbalancer": body }))
            .await?;
        single(OP, v, "loadbalancer")
    }

    /// Updates a load balancer (tags).
    pub async fn update_load_balancer(&self, id: &str, body: Value) -> Result<(), ClientError> {
        const OP: &str = "octavia:UpdateLoadBalancer";
        self.client
            .put(OP, LB, &["lbaas", "loadbalancers", id], &json!({ "loadbalancer": body }))
            .await
            .map(|_| ())
    }

    /// Deletes a load balancer (with its children when `cascade`).
    pub async fn delete_load_balancer(&self, id: &str, cascade: bool) -> Result<(), ClientError> {
        const OP: &str = "octavia:DeleteLoadBalancer";
        let query: Vec<(&str, String)> =
            if cascade { vec![("cascade", "true".to_string())] } else { vec![] };
        self.client.delete(OP, LB, &["lbaas", "loadbalancers", id], &query).await
    }

    // ---- listeners ---------------------------------------------------------------------

    /// The listeners of a load balancer.
    pub async fn list_listeners(&self, lb: &str) -> Result<Vec<Listener>, ClientError> {
        const OP: &str = "octavia:ListListeners";
        let q = [("loadbalancer_id", lb.to_string())];
        self.client.list(OP, LB, &["lbaas", "listeners"], &q, "listeners").await
    }

    /// Creates a listener.
    pub async fn create_listener(&self, body: Value) -> Result<Listener, ClientError> {
        const OP: &str = "octavia:CreateListener";
        let v =
            self.client.post(OP, LB, &["lbaas", "listeners"], &json!({ "listener": body })).await?;
        single(OP, v, "listener")
    }

    /// Updates a listener.
    pub async fn update_listener(&self, id: &str, body: Value) -> Result<(), ClientError> {
        const OP: &str = "octavia:UpdateListener";
        self.client
            .put(OP, LB, &["lbaas", "listeners", id], &json!({ "listener": body }))
            .await
            .map(|_| ())
    }

    /// Deletes a listener (gone already: `Ok`).
    pub async fn delete_listener(&self, id: &str) -> Result<(), ClientError> {
        const OP: &str = "octavia:DeleteListener";
        ok_if_gone(self.client.delete(OP, LB, &["lbaas", "listeners", id], &[]).await)
    }

    // ---- pools, members, monitors ------------------------------------------------------

    /// The pools of a load balancer.
    pub async fn list_pools(&self, lb: &str) -> Result<Vec<Pool>, ClientError> {
        const OP: &str = "octavia:ListPools";
        let q = [("loadbalancer_id", lb.to_string())];
        self.client.list(OP, LB, &["lbaas", "pools"], &q, "pools").await
    }

    /// Creates a pool.
    pub async fn create_pool(&self, body: Value) -> Result<Pool, ClientError> {
        const OP: &str = "octavia:CreatePool";
        let v = self.client.post(OP, LB, &["lbaas", "pools"], &json!({ "pool": body })).await?;
        single(OP, v, "pool")
    }

    /// Updates a pool.
    pub async fn update_pool(&self, id: &str, body: Value) -> Result<(), ClientError> {
        const OP: &str = "octavia:UpdatePool";
        self.client.put(OP, LB, &["lbaas", "pools", id], &json!({ "pool": body })).await.map(|_| ())
    }

    /// Deletes a pool with its members and monitor (gone already: `Ok`).
    pub async fn delete_pool(&self, id: &str) -> Result<(), ClientError> {
        const OP: &str = "octavia:DeletePool";
        ok_if_gone(self.client.delete(OP, LB, &["lbaas", "pools", id], &[]).await)
    }

    /// The members of a pool.
    pub async fn list_members(&self, pool: &str) -> Result<Vec<Member>, ClientError> {
        const OP: &str = "octavia:ListMembers";
        self.client.list(OP, LB, &["lbaas", "pools", pool, "members"], &[], "members").await
    }

    /// Replaces all members of a pool (one `PUT /pools/{id}/members`).
    pub async fn batch_update_members(
        &self,
        pool: &str,
        members: Vec<Value>,
    ) -> Result<(), ClientError> {
        const OP: &str = "octavia:BatchUpdateMembers";
        self.client
            .put(OP, LB, &["lbaas", "pools", pool, "members"], &json!({ "members": members }))
            .await
            .map(|_| ())
    }

    /// Adds one member to a pool (`POST /pools/{id}/members`).
    pub async fn create_member(&self, pool: &str, member: Value) -> Result<(), ClientError> {
        const OP: &str = "octavia:CreateMember";
        self.client
            .post(OP, LB, &["lbaas", "pools", pool, "members"], &json!({ "member": member }))
            .await
            .map(|_| ())
    }

    /// Removes one member of a pool (gone already: `Ok`).
    pub async fn delete_member(&self, pool: &str, id: &str) -> Result<(), ClientError> {
        const OP: &str = "octavia:DeleteMember";
        ok_if_gone(self.client.delete(OP, LB, &["lbaas", "pools", pool, "members", id], &[]).await)
    }

    /// One health monitor; `None` on 404.
    pub async fn get_health_monitor(&self, id: &str) -> Result<Option<HealthMonitor>, ClientError> {
        const OP: &str = "octavia:GetHealthMonitor";
        match self.client.get(OP, LB, &["lbaas", "healthmonitors", id], &[]).await {
            Ok(v) => single(OP, v, "healthmonitor").map(Some),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates a health monitor.
    pub async fn create_health_monitor(&self, body: Value) -> Result<(), ClientError> {
        const OP: &str = "octavia:CreateHealthMonitor";
        self.client
            .post(OP, LB, &["lbaas", "healthmonitors"], &json!({ "healthmonitor": body }))
            .await
            .map(|_| ())
    }

    /// Updates a health monitor.
    pub async fn update_health_monitor(&self, id: &str, body: Value) -> Result<(), ClientError> {
        const OP: &str = "octavia:UpdateHealthMonitor";
        self.client
            .put(OP, LB, &["lbaas", "healthmonitors", id], &json!({ "healthmonitor": body }))
            .await
            .map(|_| ())
    }

    /// Deletes a health monitor (gone already: `Ok`).
    pub async fn delete_health_monitor(&self, id: &str) -> Result<(), ClientError> {
        const OP: &str = "octavia:DeleteHealthMonitor";
        ok_if_gone(self.client.delete(OP, LB, &["lbaas", "healthmonitors", id], &[]).await)
    }

    // ---- floating IPs, networks, subnets, ports ----------------------------------------

    /// Floating IPs matching `filters` (`port_id`, `floating_ip_address`; none: all).
    pub async fn list_floating_ips(
        &self,
        filters: &[(&str, String)],
    ) -> Result<Vec<FloatingIp>, ClientError> {
        const OP: &str = "neutron:ListFloatingIPs";
        self.client.list(OP, NET, &["floatingips"], filters, "floatingips").await
    }

    /// Creates a floating IP.
    pub async fn create_floating_ip(&self, body: Value) -> Result<FloatingIp, ClientError> {
        const OP: &str = "neutron:CreateFloatingIP";
        let v = self.client.post(OP, NET, &["floatingips"], &json!({ "floatingip": body })).await?;
        single(OP, v, "floatingip")
    }

    /// Associates a floating IP with a port (`None`: disassociates it).
    pub async fn associate_floating_ip(
        &self,
        id: &str,
        port: Option<&str>,
    ) -> Result<FloatingIp, ClientError> {
        const OP: &str = "neutron:UpdateFloatingIP";
        let v = self
            .client
            .put(OP, NET, &["floatingips", id], &json!({ "floatingip": { "port_id": port } }))
            .await?;
        single(OP, v, "floatingip")
    }

    /// Sets a floating IP's description (the ownership record, on a cluster rename).
    pub async fn set_floating_ip_description(
        &self,
        id: &str,
        description: &str,
    ) -> Result<(), ClientError> {
        const OP: &str = "neutron:UpdateFloatingIP";
        let body = json!({ "floatingip": { "description": description } });
        self.client.put(OP, NET, &["floatingips", id], &body).await.map(|_| ())
    }

    /// Sets a security group's description (the ownership record, on a cluster rename).
    pub async fn set_security_group_description(
        &self,
        id: &str,
        description: &str,
    ) -> Result<(), ClientError> {
        const OP: &str = "neutron:UpdateSecurityGroup";
        let body = json!({ "security_group": { "description": description } });
        self.client.put(OP, NET, &["security-groups", id], &body).await.map(|_| ())
    }

    /// Deletes a floating IP (gone already: `Ok`).
    pub async fn delete_floating_ip(&self, id: &str) -> Result<(), ClientError> {
        const OP: &str = "neutron:DeleteFloatingIP";
        ok_if_gone(self.client.delete(OP, NET, &["floatingips", id], &[]).await)
    }

    /// The external networks (`router:external=true`).
    pub async fn list_external_networks(&self) -> Result<Vec<Network>, ClientError> {
        const OP: &str = "neutron:ListNetworks";
        let q = [("router:external", "true".to_string())];
        let nets: Vec<Network> = self.client.list(OP, NET, &["networks"], &q, "networks").await?;
        // A Neutron without the filter answers every network: keep the external ones.
        Ok(nets.into_iter().filter(|n| n.external).collect())
    }

    /// Subnets matching `filters`.
    pub async fn list_subnets(
        &self,
        filters: &[(&str, String)],
    ) -> Result<Vec<Subnet>, ClientError> {
        const OP: &str = "neutron:ListSubnets";
        self.client.list(OP, NET, &["subnets"], filters, "subnets").await
    }

    /// One subnet; `None` on 404.
    pub async fn get_subnet(&self, id: &str) -> Result<Option<Subnet>, ClientError> {
        const OP: &str = "neutron:GetSubnet";
        match self.client.get(OP, NET, &["subnets", id], &[]).await {
            Ok(v) => single(OP, v, "subnet").map(Some),
            Err(e) if e.is_not_found() => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Ports matching `filters` (`device_id`, `security_groups`; none: all of the project).
    pub async fn list_ports(&self, filters: &[(&str, String)]) -> Result<Vec<Port>, ClientError> {
        const OP: &str = "neutron:ListPorts";
        self.client.list(OP, NET, &["ports"], filters, "ports").await
    }

    /// Sets a port's security groups.
    pub async fn set_port_security_groups(
        &self,
        port: &str,
        groups: &[String],
    ) -> Result<(), ClientError> {
        const OP: &str = "neutron:UpdatePort";
        self.client
            .put(OP, NET, &["ports", port], &json!({ "port": { "security_groups": groups } }))
            .await
            .map(|_| ())
    }

    // ---- security groups ---------------------------------------------------------------

    /// Security groups, optionally by exact name.
    pub async fn list_security_groups(
        &self,
        name: Option<&str>,
    ) -> Result<Vec<SecurityGroup>, ClientError> {
        const OP: &str = "neutron:ListSecurityGroups";
        let query: Vec<(&str, String)> =
            name.map(|n| ("name", n.to_string())).into_iter().collect();
        self.client.list(OP, NET, &["security-groups"], &query, "security_groups").await
    }

    /// Creates a security group.
    pub async fn create_security_group(
        &self,
        name: &str,
        description: &str,
    ) -> Result<SecurityGroup, ClientError> {
        const OP: &str = "neutron:CreateSecurityGroup";
        let body = json!({ "security_group": { "name": name, "description": description } });
        let v = self.client.post(OP, NET, &["security-groups"], &body).await?;
        single(OP, v, "security_group")
    }

    /// Deletes a security group (gone already: `Ok`).
    pub async fn delete_security_group(&self, id: &str) -> Result<(), ClientError> {
        const OP: &str = "neutron:DeleteSecurityGroup";
        ok_if_gone(self.client.delete(OP, NET, &["security-groups", id], &[]).await)
    }

    /// The rules of a security group.
    pub async fn list_rules(&self, group: &str) -> Result<Vec<Rule>, ClientError> {
        const OP: &str = "neutron:ListSecurityGroupRules";
        let q = [("security_group_id", group.to_string())];
        self.client.list(OP, NET, &["security-group-rules"], &q, "security_group_rules").await
    }

    /// Creates a rule (already there — 409 — is `Ok`, as upstream).
    pub async fn create_rule(&self, group: &str, rule: &Rule) -> Result<(), ClientError> {
        const OP: &str = "neutron:CreateSecurityGroupRule";
        let body = json!({ "security_group_rule": {
            "security_group_id": group,
            "direction": rule.direction,
            "ethertype": rule.ethertype,
            "protocol": rule.protocol,
            "port_range_min": rule.port_range_min,
            "port_range_max": rule.port_range_max,
            "remote_ip_prefix": rule.remote_ip_prefix,
        }});
        match self.client.post(OP, NET, &["security-group-rules"], &body).await {
            Ok(_) => Ok(()),
            Err(e) if e.is_conflict() => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Deletes a rule (gone already: `Ok`).
    pub async fn delete_rule(&self, id: &str) -> Result<(), ClientError> {
        const OP: &str = "neutron:DeleteSecurityGroupRule";
        ok_if_gone(self.client.delete(OP, NET, &["security-group-rules", id], &[]).await)
    }
}

/// `v2.12` (or `2.12`) → `(2, 12)`; `v2` → `(2, 0)`; anything else `None`.
pub fn parse_version(id: &str) -> Option<(u32, u32)> {
    let rest = id.trim().strip_prefix('v').unwrap_or(id.trim());
    let (major, minor) = rest.split_once('.').unwrap_or((rest, "0"));
    Some((major.parse().ok()?, minor.parse().ok()?))
}

fn ok_if_gone(r: Result<(), ClientError>) -> Result<(), ClientError> {
    match r {
        Err(e) if e.is_not_found() => Ok(()),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nulls_decode_as_defaults() {
        let lb: LoadBalancer = decode(
            "t",
            json!({"id": "x", "name": null, "tags": null, "vip_port_id": null, "provisioning_status": "PENDING_UPDATE"}),
        )
        .unwrap();
        assert!(lb.is_pending() && !lb.is_deleting() && lb.name.is_empty() && lb.tags.is_empty());
        let l: Listener =
            decode("t", json!({"id": "l", "allowed_cidrs": null, "insert_headers": {}})).unwrap();
        assert!(l.allowed_cidrs.is_empty());
        let m: Member =
            decode("t", json!({"id": "m", "monitor_port": null, "address": "10.0.0.1"})).unwrap();
        assert_eq!(m.monitor_port, 0);
        let r: Rule =
            decode("t", json!({"direction": "egress", "protocol": null, "port_range_min": null}))
                .unwrap();
        assert!(r.protocol.is_empty());
        assert_eq!(parse_version("v2.12"), Some((2, 12)));
        assert_eq!(parse_version("v2.0"), Some((2, 0)));
        assert_eq!(parse_version("v2"), Some((2, 0)));
        assert_eq!(parse_version("2.5"), Some((2, 5)));
        assert_eq!(parse_version("v2.x"), None);
        assert_eq!(parse_version("latest"), None);
        let e = single::<Pool>("op", json!({"nope": 1}), "pool").unwrap_err();
        assert!(e.to_string().contains("pool"), "{e}");
    }
}
