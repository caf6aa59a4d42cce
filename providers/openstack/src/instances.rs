//! InstancesV2: Nova servers behind Nodes, as upstream (`pkg/openstack/instances.go`,
//! `instances_addresses.go`), answered in batches.
//!
//! - **providerID**: `openstack:///<server-id>`, or `openstack://<region>/<server-id>` when
//!   `OS_CCM_REGIONAL=true` ([`Config::regional_provider_id`]). Parsed with upstream's
//!   `^openstack://([^/]*)/([^/]+)$` (a value without `://` gets the `openstack://` prefix
//!   first, as upstream); a region that is not ours, or another cloud's providerID, is an
//!   error.
//! - **Lookup**: by the providerID's server ID, else by the exact server name (the node
//!   name).
//! - **Addresses** (upstream's order): fixed IPs of the server's `ACTIVE` Neutron ports →
//!   `InternalIP`; `accessIPv4`/`accessIPv6` → `ExternalIP`; metadata `hostname` →
//!   `Hostname`; then the server's `addresses` by network name: `floating` → `ExternalIP`,
//!   networks in `public-network-name` → `ExternalIP` (dropping the same address as
//!   internal), others → `InternalIP` unless `internal-network-name` excludes them (then the
//!   address is dropped altogether); the fixed IPs of the server's **trunk sub-ports** (each
//!   port's `trunk_details.sub_ports`) join the `addresses` of their network's name (after
//!   the server's own), so the same network rules apply to them; IPv6 dropped with
//!   `ipv6-support-disabled`; finally `address-sort-order`.
//! - **Zone** = availability zone (sanitised as a label value), **region** = `[Global]
//!   region`, **instance type** = flavor `original_name` (Nova ≥ 2.47) else the flavor's
//!   name by `GET /flavors/{id}` (cached) else its ID. No additional labels, as every
//!   upstream release (the `topology.openstack.org/host-id` label an earlier version of this
//!   crate set from `hostId` is gone: see the provider README).
//! - **Shutdown** = `SHUTOFF`.
//!
//! **Batches**: a batch of more than [`SMALL_BATCH`] nodes costs one paged `GET
//! /servers/detail` ([`SERVER_PAGE`] per page) plus, for metadata, one `GET /ports` of the
//! project, whatever the number of nodes (upstream: 2–3 calls per node). Metadata batches
//! share that listing: one fetch at a time, reused for [`LISTING_TTL`] (or as long as it
//! took), fetched again when it lacks a Node's server ([`ccm_core::listing`]). Smaller batches
//! use upstream's targeted calls (`GET /servers/{id}` or `GET /servers?name=^…$`, `GET
//! /ports?device_id=`). Trunk sub-ports (*changed*: upstream asks `GET /ports/{id}` and `GET
//! /networks/{id}` per sub-port): a batch finds them in its port listing and lists the
//! networks once (only when some port has sub-ports); a small batch lists them with one `GET
//! /ports?id=…&id=…` and one `GET /networks?id=…` per node with a trunk.
//!
//! **Deletion safety** ([`InstancesV2`]): a node is `NotFound` only when `GET
//! /servers/{id}` for the exact ID of its providerID answers Nova's typed 404 JSON error
//! (`{"itemNotFound": {"code": 404, …}}`; an HTML page, a proxy's or gateway's error or JSON of
//! another shape is an error, the Node kept), or shows the server
//! `DELETED`/`SOFT_DELETED`. An ID missing from a listing (a listing may be partial or
//! behind) is asked for by ID before anything is concluded. A node without providerID that
//! matches no server name is an error (never "gone"); for metadata it is
//! [`ProviderError::InstanceNotFound`] ("not yet").

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ccm_core::cloud::{InstanceMetadata, InstanceStatus, InstancesV2, ProviderError};
use ccm_core::listing::{Fetched, Listings, Wanted};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use serde::{Deserialize, Deserializer};
use serde_json::Value;

use crate::client::{ClientError, OpenStackClient, Service};
use crate::config::{Config, Networking};

/// Servers per page of `GET /servers/detail` (Nova's default `max_limit`).
pub const SERVER_PAGE: usize = 1000;
/// Batches of at most this many nodes use upstream's per-node calls; larger ones list.
pub const SMALL_BATCH: usize = 2;
/// How long a batch's listing of servers and ports answers later batches (at least; a
/// listing is reused for as long as it took to fetch when that is longer). A Node the
/// listing lacks gets a fresh one.
pub const LISTING_TTL: Duration = Duration::from_secs(5);
/// The provider name in providerIDs.
pub const PROVIDER_ID_SCHEME: &str = "openstack://";

/// `null` (and absent) as the type's default: OpenStack sends `null` for many empty fields.
fn nullable<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: Default + Deserialize<'de>,
{
    Ok(Option::<T>::deserialize(d)?.unwrap_or_default())
}

/// A Nova server, the fields the provider reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Server {
    /// Its ID.
    pub id: String,
    /// Its name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
    /// `ACTIVE`, `SHUTOFF`, `DELETED`, …
    #[serde(default, deserialize_with = "nullable")]
    pub status: String,
    /// `OS-EXT-AZ:availability_zone`.
    #[serde(rename = "OS-EXT-AZ:availability_zone", default, deserialize_with = "nullable")]
    pub availability_zone: String,
    /// `{"id": …}` (before 2.47) or `{"original_name": …}` (2.47 and later).
    #[serde(default, deserialize_with = "nullable")]
    pub flavor: Value,
    /// Addresses by network name.
    #[serde(default, deserialize_with = "nullable")]
    pub addresses: BTreeMap<String, Vec<ServerAddress>>,
    /// `accessIPv4`.
    #[serde(rename = "accessIPv4", default, deserialize_with = "nullable")]
    pub access_ipv4: String,
    /// `accessIPv6`.
    #[serde(rename = "accessIPv6", default, deserialize_with = "nullable")]
    pub access_ipv6: String,
    /// User metadata (`hostname` is read).
    #[serde(default, deserialize_with = "nullable")]
    pub metadata: BTreeMap<String, Value>,
}

/// One entry of a server's `addresses`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct ServerAddress {
    /// The address.
    #[serde(default, deserialize_with = "nullable")]
    pub addr: String,
    /// `OS-EXT-IPS:type`: `fixed` or `floating`.
    #[serde(rename = "OS-EXT-IPS:type", default, deserialize_with = "nullable")]
    pub ip_type: String,
}

/// A Neutron port, the fields the provider reads.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Port {
    /// Its ID.
    pub id: String,
    /// Its network.
    #[serde(default, deserialize_with = "nullable")]
    pub network_id: String,
    /// The server (or router) it is attached to.
    #[serde(default, deserialize_with = "nullable")]
    pub device_id: String,
    /// `ACTIVE`, `DOWN`, …
    #[serde(default, deserialize_with = "nullable")]
    pub status: String,
    /// Fixed IPs.
    #[serde(default, deserialize_with = "nullable")]
    pub fixed_ips: Vec<FixedIp>,
    /// Allowed address pairs, as Neutron returns them (kept whole on update).
    #[serde(default, deserialize_with = "nullable")]
    pub allowed_address_pairs: Vec<Value>,
    /// `port_security_enabled` (absent: enabled).
    #[serde(default)]
    pub port_security_enabled: Option<bool>,
    /// `trunk_details` of a trunk's parent port (Neutron's `trunk-details` extension).
    #[serde(default, deserialize_with = "nullable")]
    pub trunk_details: TrunkDetails,
}

/// A parent port's `trunk_details`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct TrunkDetails {
    /// The trunk's ID.
    #[serde(default, deserialize_with = "nullable")]
    pub trunk_id: String,
    /// Its sub-ports.
    #[serde(default, deserialize_with = "nullable")]
    pub sub_ports: Vec<SubPort>,
}

/// One entry of `trunk_details.sub_ports`.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct SubPort {
    /// The sub-port's port ID.
    #[serde(default, deserialize_with = "nullable")]
    pub port_id: String,
}

/// A Neutron network: its ID and name.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct Network {
    /// Its ID.
    pub id: String,
    /// Its name.
    #[serde(default, deserialize_with = "nullable")]
    pub name: String,
}

/// A fixed IP of a port.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct FixedIp {
    /// The address.
    #[serde(default, deserialize_with = "nullable")]
    pub ip_address: String,
    /// Its subnet.
    #[serde(default, deserialize_with = "nullable")]
    pub subnet_id: String,
}

fn decode<T: for<'de> Deserialize<'de>>(op: &str, what: &str, v: Value) -> Result<T, ClientError> {
    serde_json::from_value(v).map_err(|e| ClientError::Decode {
        op: op.into(),
        message: format!("{what}: {}", ccm_core::cloud_call::strip_quoted_values(&e.to_string())),
    })
}

/// All servers of the project: one paged `GET /servers/detail`.
pub async fn list_servers(client: &OpenStackClient) -> Result<Vec<Server>, ClientError> {
    list_servers_where(client, &[]).await
}

async fn list_servers_where(
    client: &OpenStackClient,
    filters: &[(&str, String)],
) -> Result<Vec<Server>, ClientError> {
    const OP: &str = "nova:ListServers";
    let mut query = filters.to_vec();
    query.push(("limit", SERVER_PAGE.to_string()));
    client.list(OP, Service::Compute, &["servers", "detail"], &query, "servers").await
}

/// `GET /servers/{id}`; `Ok(None)` when Nova answers 404 `itemNotFound` for this ID.
pub async fn get_server(client: &OpenStackClient, id: &str) -> Result<Option<Server>, ClientError> {
    const OP: &str = "nova:GetServer";
    match client.get(OP, Service::Compute, &["servers", id], &[]).await {
        Ok(mut v) => Ok(Some(decode(OP, "the server", v["server"].take())?)),
        // Only Nova's own typed answer says so (`{"itemNotFound": {"code": 404, …}}`, parsed
        // from the JSON body); any other 404 (a proxy's page echoing the URL, JSON of another
        // shape, another service) is an error like any other.
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// Neutron ports, one paged `GET /ports` with `filters` (none: every port of the project).
pub async fn list_ports(
    client: &OpenStackClient,
    filters: &[(&str, String)],
) -> Result<Vec<Port>, ClientError> {
    const OP: &str = "neutron:ListPorts";
    client.list(OP, Service::Network, &["ports"], filters, "ports").await
}

/// Neutron networks, one paged `GET /networks` with `filters`.
pub async fn list_networks(
    client: &OpenStackClient,
    filters: &[(&str, String)],
) -> Result<Vec<Network>, ClientError> {
    const OP: &str = "neutron:ListNetworks";
    client.list(OP, Service::Network, &["networks"], filters, "networks").await
}

/// The sub-port IDs of `ports`' trunks, in port order.
fn sub_port_ids<'a>(ports: &'a [&'a Port]) -> impl Iterator<Item = &'a str> + 'a {
    ports
        .iter()
        .flat_map(|p| &p.trunk_details.sub_ports)
        .map(|s| s.port_id.as_str())
        .filter(|id| !id.is_empty())
}

/// The fixed IPs of the trunk sub-ports of `ports`, as (network name, address) in upstream's
/// order (ports, then sub-ports, then fixed IPs). `port` finds a sub-port by ID, `networks`
/// maps network IDs to names; a sub-port or network not found (deleted meanwhile) is
/// skipped with a warning, as upstream skips a sub-port it cannot read.
pub fn trunk_addresses<'a>(
    server: &str,
    ports: &[&Port],
    port: impl Fn(&str) -> Option<&'a Port>,
    networks: &HashMap<String, String>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for id in sub_port_ids(ports) {
        let Some(p) = port(id) else {
            tracing::warn!(
                server,
                sub_port = id,
                "OpenStack: trunk sub-port not found: its addresses are left out"
            );
            continue;
        };
        let Some(network) = networks.get(&p.network_id) else {
            tracing::warn!(server, sub_port = id, network = %p.network_id, "OpenStack: the trunk sub-port's network was not found: its addresses are left out");
            continue;
        };
        for ip in p.fixed_ips.iter().filter(|ip| !ip.ip_address.is_empty()) {
            out.push((network.clone(), ip.ip_address.clone()));
        }
    }
    out
}

/// Nova's `name` filter is a regular expression: the exact name, escaped (Go's
/// `regexp.QuoteMeta`), anchored.
pub fn exact_name_filter(name: &str) -> String {
    let mut out = String::from("^");
    for c in name.chars() {
        if "\\.+*?()|[]{}^$".contains(c) {
            out.push('\\');
        }
        out.push(c);
    }
    out.push('$');
    out
}

/// The server ID of a providerID, as upstream's `instanceIDFromProviderID`, plus: a bare
/// server UUID (no scheme, no slash) is accepted. Returns `(id, region)`; anything that is
/// not an OpenStack providerID is an error naming it.
pub fn parse_provider_id(provider_id: &str) -> Result<(String, String), ProviderError> {
    let invalid = || ProviderError::Invalid {
        what: format!("providerID {provider_id:?}"),
        message: "does not match the expected format \"openstack://region/InstanceID\"".into(),
    };
    if is_uuid(provider_id) {
        return Ok((provider_id.to_string(), String::new()));
    }
    let full = if provider_id.contains("://") {
        provider_id.to_string()
    } else {
        format!("{PROVIDER_ID_SCHEME}{provider_id}")
    };
    let rest = full.strip_prefix(PROVIDER_ID_SCHEME).ok_or_else(invalid)?;
    let (region, id) = rest.split_once('/').ok_or_else(invalid)?;
    if id.is_empty() || id.contains('/') {
        return Err(invalid());
    }
    Ok((id.to_string(), region.to_string()))
}

fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// A Kubernetes label value (`validation.IsValidLabelValue`).
pub fn is_valid_label_value(v: &str) -> bool {
    let ok_char = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    v.len() <= 63
        && v.chars().all(ok_char)
        && (v.is_empty()
            || (v.starts_with(|c: char| c.is_ascii_alphanumeric())
                && v.ends_with(|c: char| c.is_ascii_alphanumeric())))
}

/// A label value made from `v`: runs of characters a label cannot hold become `-`, the ends
/// are trimmed to alphanumerics, at most 63 characters (upstream's `util.SanitizeLabel`).
pub fn sanitize_label(v: &str) -> String {
    if is_valid_label_value(v) {
        return v.to_string();
    }
    let mut out = String::new();
    let mut dash = false;
    for c in v.chars() {
        if c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') {
            out.push(c);
            dash = false;
        } else if !dash {
            out.push('-');
            dash = true;
        }
    }
    let trim = |s: &str| s.trim_matches(|c: char| !c.is_ascii_alphanumeric()).to_string();
    let mut out = trim(&out);
    if out.len() > 63 {
        out.truncate(63);
        out = trim(&out);
    }
    out
}

fn is_ipv6(addr: &str) -> bool {
    matches!(addr.parse::<IpAddr>(), Ok(IpAddr::V6(v6)) if v6.to_ipv4_mapped().is_none())
}

fn add_address(addrs: &mut Vec<NodeAddress>, type_: &str, address: &str) {
    if !addrs.iter().any(|a| a.address == address && a.type_ == type_) {
        addrs.push(NodeAddress { type_: type_.into(), address: address.into() });
    }
}

/// The node addresses of `server` with its `ports` and the fixed IPs of its trunk sub-ports
/// (`sub_ports`: network name, address; [`trunk_addresses`]), as upstream's `nodeAddresses`.
pub fn node_addresses(
    server: &Server,
    ports: &[&Port],
    sub_ports: &[(String, String)],
    net: &Networking,
) -> Vec<NodeAddress> {
    let v6_ok = |a: &str| !net.ipv6_support_disabled || !is_ipv6(a);
    let mut addrs: Vec<NodeAddress> = Vec::new();
    for port in ports.iter().filter(|p| p.status == "ACTIVE") {
        for ip in &port.fixed_ips {
            if !ip.ip_address.is_empty() && v6_ok(&ip.ip_address) {
                add_address(&mut addrs, "InternalIP", &ip.ip_address);
            }
        }
    }
    if !server.access_ipv4.is_empty() {
        add_address(&mut addrs, "ExternalIP", &server.access_ipv4);
    }
    if !server.access_ipv6.is_empty() && !net.ipv6_support_disabled {
        add_address(&mut addrs, "ExternalIP", &server.access_ipv6);
    }
    if let Some(Value::String(h)) = server.metadata.get("hostname")
        && !h.is_empty()
    {
        add_address(&mut addrs, "Hostname", h);
    }
    // The sub-ports' addresses join their network's entries (after the server's own).
    let mut addresses = server.addresses.clone();
    for (network, addr) in sub_ports {
        addresses
            .entry(network.clone())
            .or_default()
            .push(ServerAddress { addr: addr.clone(), ip_type: "fixed".into() });
    }
    // BTreeMap: networks in name order, as upstream sorts them.
    for (network, entries) in &addresses {
        for entry in entries.iter().filter(|e| !e.addr.is_empty()) {
            let type_ = if entry.ip_type == "floating" {
                "ExternalIP"
            } else if net.public_network_names.iter().any(|n| n == network) {
                addrs.retain(|a| a.address != entry.addr);
                "ExternalIP"
            } else if net.internal_network_names.is_empty()
                || net.internal_network_names.iter().any(|n| n == network)
            {
                "InternalIP"
            } else {
                addrs.retain(|a| a.address != entry.addr);
                continue;
            };
            if v6_ok(&entry.addr) {
                add_address(&mut addrs, type_, &entry.addr);
            }
        }
    }
    if !net.address_sort_order.is_empty() {
        sort_addresses(&mut addrs, &net.address_sort_order);
    }
    addrs
}

/// Upstream's `sortNodeAddresses`: addresses in the earlier CIDRs first, ascending within
/// a CIDR; the others keep their order after them.
pub fn sort_addresses(addrs: &mut [NodeAddress], order: &[IpNet]) {
    let priority = |a: &str| -> usize {
        let Ok(ip) = a.parse::<IpAddr>() else { return 0 };
        order.iter().position(|c| c.contains(&ip)).map(|i| order.len() - i).unwrap_or(0)
    };
    let bytes = |a: &str| -> [u8; 16] {
        match a.parse::<IpAddr>() {
            Ok(IpAddr::V4(v4)) => v4.to_ipv6_mapped().octets(),
            Ok(IpAddr::V6(v6)) => v6.octets(),
            Err(_) => [0; 16],
        }
    };
    addrs.sort_by(|l, r| {
        let (pl, pr) = (priority(&l.address), priority(&r.address));
        if pl > 0 && pl == pr { bytes(&l.address).cmp(&bytes(&r.address)) } else { pr.cmp(&pl) }
    });
}

/// Whether a server's status says it is gone.
fn is_deleted(status: &str) -> bool {
    matches!(status, "DELETED" | "SOFT_DELETED")
}

fn status_of(server: &Server) -> InstanceStatus {
    if is_deleted(&server.status) {
        InstanceStatus::NotFound
    } else if server.status == "SHUTOFF" {
        InstanceStatus::Shutdown
    } else {
        InstanceStatus::Running
    }
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

/// How a node is looked up.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Key {
    /// The server ID of its providerID.
    Id(String),
    /// Its name (no providerID yet).
    Name(String),
}

/// What the cloud showed for one batch.
#[derive(Default)]
struct Snapshot {
    servers: Vec<Server>,
    ports: Vec<Port>,
    /// Network ID → name (listed only when a port has trunk sub-ports).
    networks: HashMap<String, String>,
}

/// Every server of the project, and with `with_ports` every port (and the networks' names
/// when a port has trunk sub-ports).
async fn fetch_snapshot(
    client: &OpenStackClient,
    with_ports: bool,
) -> Result<Snapshot, ClientError> {
    if with_ports {
        let (servers, ports) = tokio::try_join!(list_servers(client), list_ports(client, &[]))?;
        let refs: Vec<&Port> = ports.iter().collect();
        let networks = if sub_port_ids(&refs).next().is_some() {
            list_networks(client, &[]).await?.into_iter().map(|n| (n.id, n.name)).collect()
        } else {
            HashMap::new()
        };
        Ok(Snapshot { servers, ports, networks })
    } else {
        Ok(Snapshot { servers: list_servers(client).await?, ..Snapshot::default() })
    }
}

/// The InstancesV2 of the OpenStack provider.
#[derive(Debug)]
pub struct OpenStackInstances {
    client: Arc<OpenStackClient>,
    region: String,
    regional_provider_id: bool,
    networking: Networking,
    /// Flavor ID → instance type (flavors do not change).
    flavors: Mutex<HashMap<String, String>>,
    /// The project's servers and ports for metadata batches, shared by concurrent batches
    /// and reused ([`ccm_core::listing`], [`LISTING_TTL`]).
    listings: Listings<Snapshot>,
}

impl OpenStackInstances {
    /// InstancesV2 on this client and config.
    pub fn new(client: Arc<OpenStackClient>, config: &Config) -> Self {
        OpenStackInstances {
            client,
            region: config.global.region.trim().to_string(),
            regional_provider_id: config.regional_provider_id,
            networking: config.networking.clone(),
            flavors: Mutex::new(HashMap::new()),
            listings: Listings::default(),
        }
    }

    /// The providerID of a server (upstream's `makeInstanceID`).
    pub fn provider_id(&self, server_id: &str) -> String {
        if self.regional_provider_id {
            format!("{PROVIDER_ID_SCHEME}{}/{server_id}", self.region)
        } else {
            format!("{PROVIDER_ID_SCHEME}/{server_id}")
        }
    }

    fn key(&self, node: &Node) -> Result<Key, ProviderError> {
        match node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) {
            Some(p) if !p.is_empty() => {
                let (id, region) = parse_provider_id(p)?;
                if !region.is_empty() && region != self.region {
                    return Err(ProviderError::Invalid {
                        what: format!("providerID {p:?}"),
                        message: format!("does not match the region {:?}", self.region),
                    });
                }
                Ok(Key::Id(id))
            }
            _ => Ok(Key::Name(node_name(node).to_string())),
        }
    }

    /// The instance type of a server: `original_name`, else the flavor's name, else its ID.
    async fn instance_type(&self, server: &Server) -> Result<String, ProviderError> {
        if let Some(name) = server.flavor.get("original_name").and_then(Value::as_str)
            && is_valid_label_value(name)
        {
            return Ok(name.to_string());
        }
        let Some(id) = server.flavor.get("id").and_then(Value::as_str) else {
            return Err(ProviderError::other(format!(
                "server {} ({}): flavor original_name/id not found",
                server.name, server.id
            )));
        };
        if let Some(t) = self.flavors.lock().ok().and_then(|m| m.get(id).cloned()) {
            return Ok(t);
        }
        // Boxed: the lookups of a batch are made at once; a call held inline weighs kilobytes.
        let v =
            Box::pin(self.client.get("nova:GetFlavor", Service::Compute, &["flavors", id], &[]))
                .await;
        let v = v.map_err(|e| {
            ProviderError::other(format!(
                "server {} ({}): flavor {id}: {e}",
                server.name, server.id
            ))
        })?;
        let name = v["flavor"]["name"].as_str().unwrap_or_default();
        let t = if is_valid_label_value(name) && !name.is_empty() { name } else { id }.to_string();
        if let Ok(mut m) = self.flavors.lock() {
            m.insert(id.to_string(), t.clone());
        }
        Ok(t)
    }

    async fn metadata_of(
        &self,
        server: &Server,
        ports: &[&Port],
        sub_ports: &[(String, String)],
    ) -> Result<InstanceMetadata, ProviderError> {
        let instance_type = self.instance_type(server).await?;
        Ok(InstanceMetadata {
            provider_id: self.provider_id(&server.id),
            instance_type,
            node_addresses: node_addresses(server, ports, sub_ports, &self.networking),
            zone: sanitize_label(&server.availability_zone),
            region: self.region.clone(),
            // None, as upstream (no release sets `topology.openstack.org/host-id`).
            additional_labels: BTreeMap::new(),
        })
    }

    /// The full listing for a batch: every server (and every port, for metadata, with the
    /// networks' names when a port has trunk sub-ports).
    async fn snapshot(&self, with_ports: bool) -> Result<Snapshot, ClientError> {
        fetch_snapshot(&self.client, with_ports).await
    }

    /// The servers and ports a metadata batch reads: a listing this batch started or one
    /// reused within [`LISTING_TTL`] (or as long as it took to fetch), fetched again once,
    /// started after the batch began, when it lacks a server a Node names (a Node newer than
    /// the listing). Concurrent batches share one listing; it outlives a batch's deadline.
    async fn metadata_snapshot(
        &self,
        names: &[&str],
    ) -> Result<Arc<Fetched<Snapshot>>, ClientError> {
        let pass = Instant::now();
        let mut wanted = Wanted::recent(pass, LISTING_TTL);
        loop {
            let client = Arc::clone(&self.client);
            let fetch = move || async move { fetch_snapshot(&client, true).await };
            let snap = self
                .listings
                .get("servers and ports", wanted, fetch, |message| ClientError::Transport {
                    op: "listing the project's servers and ports".into(),
                    message,
                })
                .await?;
            let listed: BTreeSet<&str> = snap.servers.iter().map(|s| s.name.as_str()).collect();
            let missing = names.iter().any(|n| !listed.contains(n));
            if !missing || snap.started >= pass {
                return Ok(snap);
            }
            wanted = Wanted::StartedAfter(pass);
        }
    }

    /// The trunk sub-ports' addresses of a server's `ports` (a small batch): one `GET
    /// /ports?id=…` and one `GET /networks?id=…`, none without sub-ports.
    async fn sub_ports_small(
        &self,
        server: &Server,
        ports: &[&Port],
    ) -> Result<Vec<(String, String)>, ClientError> {
        let ids: Vec<(&str, String)> =
            sub_port_ids(ports).map(|id| ("id", id.to_string())).collect();
        if ids.is_empty() {
            return Ok(Vec::new());
        }
        let subs = list_ports(&self.client, &ids).await?;
        let nets: BTreeSet<&str> = subs.iter().map(|p| p.network_id.as_str()).collect();
        let nets: Vec<(&str, String)> = nets.into_iter().map(|id| ("id", id.to_string())).collect();
        let networks: HashMap<String, String> =
            list_networks(&self.client, &nets).await?.into_iter().map(|n| (n.id, n.name)).collect();
        let by_id = |id: &str| subs.iter().find(|p| p.id == id);
        Ok(trunk_addresses(&server.name, ports, by_id, &networks))
    }

    /// The server of a node looked up by name in a listing: `None` when none is named so.
    fn by_name<'a>(servers: &'a [Server], name: &str) -> Result<Option<&'a Server>, ProviderError> {
        let named: Vec<&Server> = servers.iter().filter(|s| s.name == name).collect();
        match named.as_slice() {
            [] => Ok(None),
            [one] => Ok(Some(one)),
            many => Err(ProviderError::other(format!(
                "{} servers are named {name:?}: cannot tell which one is the node",
                many.len()
            ))),
        }
    }

    /// Upstream's per-node lookup: `GET /servers/{id}` or the list by exact name.
    async fn lookup_one(&self, key: &Key) -> Result<Option<Server>, ProviderError> {
        match key {
            Key::Id(id) => Ok(get_server(&self.client, id).await?),
            Key::Name(name) => {
                let found =
                    list_servers_where(&self.client, &[("name", exact_name_filter(name))]).await?;
                Ok(Self::by_name(&found, name)?.cloned())
            }
        }
    }

    async fn metadata_small(&self, key: &Key) -> Result<InstanceMetadata, ProviderError> {
        let Some(server) = self.lookup_one(key).await? else {
            return Err(ProviderError::InstanceNotFound);
        };
        if is_deleted(&server.status) {
            return Err(ProviderError::InstanceNotFound);
        }
        let ports = list_ports(&self.client, &[("device_id", server.id.clone())]).await?;
        let ports: Vec<&Port> = ports.iter().collect();
        let sub_ports = self.sub_ports_small(&server, &ports).await?;
        self.metadata_of(&server, &ports, &sub_ports).await
    }

    async fn status_small(&self, key: &Key, node: &str) -> Result<InstanceStatus, ProviderError> {
        match (key, self.lookup_one(key).await?) {
            (Key::Id(id), None) => {
                tracing::info!(node, server = %id, "OpenStack: Nova has no server with this ID");
                Ok(InstanceStatus::NotFound)
            }
            (Key::Id(_), Some(s)) => Ok(status_of(&s)),
            (Key::Name(name), found) => status_by_name(name, found.as_ref()),
        }
    }
}

/// The status of a node looked up by name: never `NotFound` (a name says nothing certain).
fn status_by_name(name: &str, found: Option<&Server>) -> Result<InstanceStatus, ProviderError> {
    match found {
        None => Err(ProviderError::other(format!(
            "no server named {name:?}: the node is kept (only a lookup by the providerID's \
             server ID can say it is gone)"
        ))),
        Some(s) if is_deleted(&s.status) => Err(ProviderError::other(format!(
            "the server named {name:?} ({}) is {}; the node has no providerID, so it is kept",
            s.id, s.status
        ))),
        Some(s) => Ok(status_of(s)),
    }
}

/// One error for every node of a batch whose listing failed.
fn batch_error(what: &str, e: &ClientError) -> ProviderError {
    ProviderError::other(format!("{what}: {e}"))
}

#[async_trait]
impl InstancesV2 for OpenStackInstances {
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
        let keys: Vec<Result<Key, ProviderError>> = nodes.iter().map(|n| self.key(n)).collect();
        let lookups = keys.iter().filter(|k| k.is_ok()).count();
        if lookups <= SMALL_BATCH {
            let answers = keys.into_iter().map(|k| async move { self.metadata_small(&k?).await });
            return futures::future::join_all(answers).await;
        }
        let names: Vec<&str> = keys
            .iter()
            .filter_map(|k| match k {
                Ok(Key::Name(n)) => Some(n.as_str()),
                _ => None,
            })
            .collect();
        let snap = match self.metadata_snapshot(&names).await {
            Ok(s) => s,
            Err(e) => {
                let e = batch_error("listing the project's servers and ports", &e);
                let message = e.to_string();
                return keys
                    .into_iter()
                    .map(|k| k.and_then(|_| Err(ProviderError::other(message.clone()))))
                    .collect();
            }
        };
        let by_id: HashMap<&str, &Server> =
            snap.servers.iter().map(|s| (s.id.as_str(), s)).collect();
        let mut ports_of: HashMap<&str, Vec<&Port>> = HashMap::new();
        for p in &snap.ports {
            ports_of.entry(p.device_id.as_str()).or_default().push(p);
        }
        let port_by_id: HashMap<&str, &Port> =
            snap.ports.iter().map(|p| (p.id.as_str(), p)).collect();
        let snap = &snap;
        let by_id = &by_id;
        let ports_of = &ports_of;
        let port_by_id = &port_by_id;
        let answers = keys.into_iter().map(|k| async move {
            let server: Server = match k? {
                Key::Id(id) => match by_id.get(id.as_str()) {
                    Some(s) if !is_deleted(&s.status) => (*s).clone(),
                    // Not in the listing (or listed as deleted): ask for this exact ID.
                    _ => match Box::pin(get_server(&self.client, &id)).await? {
                        Some(s) if !is_deleted(&s.status) => s,
                        _ => return Err(ProviderError::InstanceNotFound),
                    },
                },
                Key::Name(name) => match Self::by_name(&snap.servers, &name)? {
                    Some(s) if !is_deleted(&s.status) => s.clone(),
                    _ => return Err(ProviderError::InstanceNotFound),
                },
            };
            let ports = ports_of.get(server.id.as_str()).cloned().unwrap_or_default();
            let sub_ports = trunk_addresses(
                &server.name,
                &ports,
                |id| port_by_id.get(id).copied(),
                &snap.networks,
            );
            self.metadata_of(&server, &ports, &sub_ports).await
        });
        futures::future::join_all(answers).await
    }

    async fn instance_status_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceStatus, ProviderError>> {
        let keys: Vec<Result<Key, ProviderError>> = nodes.iter().map(|n| self.key(n)).collect();
        let lookups = keys.iter().filter(|k| k.is_ok()).count();
        if lookups <= SMALL_BATCH {
            let answers = keys
                .into_iter()
                .zip(nodes)
                .map(|(k, n)| async move { self.status_small(&k?, node_name(n)).await });
            return futures::future::join_all(answers).await;
        }
        let snap = match self.snapshot(false).await {
            Ok(s) => s,
            Err(e) => {
                let message = batch_error("listing the project's servers", &e).to_string();
                return keys
                    .into_iter()
                    .map(|k| k.and_then(|_| Err(ProviderError::other(message.clone()))))
                    .collect();
            }
        };
        let by_id: HashMap<&str, &Server> =
            snap.servers.iter().map(|s| (s.id.as_str(), s)).collect();
        let snap = &snap;
        let by_id = &by_id;
        let answers = keys.into_iter().zip(nodes).map(|(k, n)| async move {
            match k? {
                Key::Id(id) => match by_id.get(id.as_str()) {
                    Some(s) if !is_deleted(&s.status) => Ok(status_of(s)),
                    // Absent from the listing, or listed as deleted: only the answer for this
                    // exact ID decides.
                    _ => match Box::pin(get_server(&self.client, &id)).await? {
                        None => {
                            tracing::info!(node = node_name(n), server = %id, "OpenStack: Nova has no server with this ID");
                            Ok(InstanceStatus::NotFound)
                        }
                        Some(s) => Ok(status_of(&s)),
                    },
                },
                Key::Name(name) => status_by_name(&name, Self::by_name(&snap.servers, &name)?),
            }
        });
        futures::future::join_all(answers).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_ids_parse_as_upstream() {
        let id = "7b1c3a52-2f5e-4e8a-9d0c-1a2b3c4d5e6f";
        assert_eq!(
            parse_provider_id(&format!("openstack:///{id}")).unwrap(),
            (id.into(), "".into())
        );
        assert_eq!(
            parse_provider_id(&format!("openstack://RegionOne/{id}")).unwrap(),
            (id.into(), "RegionOne".into())
        );
        // kubernetes#85731: a value without a scheme gets it.
        assert_eq!(parse_provider_id(&format!("/{id}")).unwrap().0, id);
        // A bare server UUID.
        assert_eq!(parse_provider_id(id).unwrap().0, id);
        for bad in [
            "aws:///us-east-1a/i-0123",
            "gce://project/zone/name",
            "openstack://",
            "openstack:///",
            "openstack:///a/b",
            "not-a-uuid",
            "",
        ] {
            let e = parse_provider_id(bad).unwrap_err();
            assert!(matches!(e, ProviderError::Invalid { .. }), "{bad}: {e}");
        }
    }

    #[test]
    fn labels_are_sanitised() {
        assert_eq!(sanitize_label("nova"), "nova");
        assert_eq!(sanitize_label("az 1/rack#2"), "az-1-rack-2");
        assert_eq!(sanitize_label("-x-"), "-x-".trim_matches('-'));
        assert_eq!(sanitize_label(&"a".repeat(70)).len(), 63);
        assert!(is_valid_label_value("m1.small"));
        assert!(!is_valid_label_value("m1 small"));
        assert_eq!(exact_name_filter("node.1"), "^node\\.1$");
    }

    fn server(addresses: Value) -> Server {
        serde_json::from_value(json_server(addresses)).unwrap()
    }

    fn json_server(addresses: Value) -> Value {
        serde_json::json!({"id": "s1", "name": "n", "status": "ACTIVE", "addresses": addresses,
            "accessIPv4": "", "accessIPv6": null, "metadata": {"hostname": "n.example"},
            "hostId": "abc", "flavor": {"original_name": "m1.small"}})
    }

    fn port(ips: &[&str], status: &str) -> Port {
        Port {
            id: "p".into(),
            status: status.into(),
            fixed_ips: ips
                .iter()
                .map(|i| FixedIp { ip_address: i.to_string(), subnet_id: String::new() })
                .collect(),
            ..Port::default()
        }
    }

    fn pairs(a: &[NodeAddress]) -> Vec<(String, String)> {
        a.iter().map(|a| (a.type_.clone(), a.address.clone())).collect()
    }

    fn p(t: &str, a: &str) -> (String, String) {
        (t.into(), a.into())
    }

    #[test]
    fn addresses_follow_upstreams_order_and_options() {
        let s = server(serde_json::json!({
            "private": [{"addr": "10.0.0.5", "OS-EXT-IPS:type": "fixed"},
                        {"addr": "172.24.4.9", "OS-EXT-IPS:type": "floating"},
                        {"addr": "fd00::5", "OS-EXT-IPS:type": "fixed"}],
            "storage": [{"addr": "10.1.0.5", "OS-EXT-IPS:type": "fixed"}],
            "ext": [{"addr": "203.0.113.5", "OS-EXT-IPS:type": "fixed"}],
        }));
        let p1 = port(&["10.0.0.5", "fd00::5"], "ACTIVE");
        let p2 = port(&["10.1.0.5"], "ACTIVE");
        let down = port(&["10.9.9.9"], "DOWN");
        let ports = [&p1, &p2, &down];
        let all = node_addresses(&s, &ports, &[], &Networking::default());
        assert_eq!(
            pairs(&all),
            vec![
                p("InternalIP", "10.0.0.5"),
                p("InternalIP", "fd00::5"),
                p("InternalIP", "10.1.0.5"),
                p("Hostname", "n.example"),
                p("InternalIP", "203.0.113.5"),
                p("ExternalIP", "172.24.4.9"),
            ]
        );
        let net = Networking {
            ipv6_support_disabled: true,
            public_network_names: vec!["ext".into()],
            internal_network_names: vec!["private".into()],
            address_sort_order: vec![],
        };
        assert_eq!(
            pairs(&node_addresses(&s, &ports, &[], &net)),
            vec![
                p("InternalIP", "10.0.0.5"),
                p("Hostname", "n.example"),
                p("ExternalIP", "203.0.113.5"),
                p("ExternalIP", "172.24.4.9"),
            ]
        );
        let net = Networking {
            address_sort_order: vec![
                "10.1.0.0/16".parse().unwrap(),
                "172.24.4.0/24".parse().unwrap(),
            ],
            ..Networking::default()
        };
        let sorted = node_addresses(&s, &ports, &[], &net);
        assert_eq!(
            pairs(&sorted)[..2],
            [p("InternalIP", "10.1.0.5"), p("ExternalIP", "172.24.4.9")]
        );
        assert_eq!(sorted.len(), 6);
    }

    #[test]
    fn trunk_sub_port_addresses_join_their_networks_entries() {
        let s = server(serde_json::json!({
            "private": [{"addr": "10.0.0.5", "OS-EXT-IPS:type": "fixed"}],
        }));
        let mut parent = port(&["10.0.0.5"], "ACTIVE");
        parent.trunk_details = TrunkDetails {
            trunk_id: "t".into(),
            sub_ports: vec![
                SubPort { port_id: "sp1".into() },
                SubPort { port_id: "gone".into() },
                SubPort { port_id: "sp2".into() },
            ],
        };
        let mut sp1 = port(&["10.100.0.5", "fd00:100::5"], "DOWN");
        sp1.network_id = "n100".into();
        let mut sp2 = port(&["10.0.9.9"], "ACTIVE");
        sp2.network_id = "nprivate".into();
        let subs = [("sp1", &sp1), ("sp2", &sp2)];
        let networks: HashMap<String, String> = [("n100", "vlan-100"), ("nprivate", "private")]
            .into_iter()
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .collect();
        let found = |id: &str| subs.iter().find(|(i, _)| *i == id).map(|(_, p)| *p);
        let sub = trunk_addresses("n", &[&parent], found, &networks);
        assert_eq!(
            sub,
            vec![
                p("vlan-100", "10.100.0.5"),
                p("vlan-100", "fd00:100::5"),
                p("private", "10.0.9.9"),
            ]
        );
        let all = node_addresses(&s, &[&parent], &sub, &Networking::default());
        assert_eq!(
            pairs(&all),
            vec![
                p("InternalIP", "10.0.0.5"),
                p("Hostname", "n.example"),
                p("InternalIP", "10.0.9.9"),
                p("InternalIP", "10.100.0.5"),
                p("InternalIP", "fd00:100::5"),
            ]
        );
        let net = Networking {
            ipv6_support_disabled: true,
            public_network_names: vec!["vlan-100".into()],
            ..Networking::default()
        };
        assert_eq!(
            pairs(&node_addresses(&s, &[&parent], &sub, &net)),
            vec![
                p("InternalIP", "10.0.0.5"),
                p("Hostname", "n.example"),
                p("InternalIP", "10.0.9.9"),
                p("ExternalIP", "10.100.0.5"),
            ]
        );
    }
}
