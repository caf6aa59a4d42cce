//! Routes: Neutron router extra routes for pod CIDRs, as upstream (`pkg/openstack/routes.go`).
//!
//! - The router is `[Route] router-id`. A route is `{destination: <pod CIDR>, nexthop: <node
//!   InternalIP of the CIDR's family>}` (dual-stack nodes get one route per family). The
//!   node's InternalIP comes from the Node's addresses the route controller passes, else
//!   from its server (ports' fixed IPs), as upstream's older lookup.
//! - **Create**: the route is added (`PUT /routers/{id}/add_extraroutes` when Neutron has
//!   `extraroute-atomic`, else a read-modify-write of the router's whole `routes` under one
//!   lock, as upstream serialises it), then the pod CIDR is added to the
//!   `allowed_address_pairs` of the node's port holding the next hop (`PUT /ports/{id}`;
//!   skipped when the port has port security disabled or Neutron lacks
//!   `allowed-address-pairs`). If the port update fails the route is removed again
//!   (upstream's unwinding). Idempotent.
//! - **Delete** reverses both (the pair only if present); a blackhole route (its next hop
//!   is no server's) only loses the route.
//! - **List**: the router's routes, each next hop mapped to the server (node) owning a port
//!   with that IP; none → blackhole with the next hop as target (upstream). A route whose
//!   node port lacks the pod CIDR in its allowed address pairs is left out, so the
//!   controller creates it again and the pair is repaired (upstream's check).
//! - Route name = the destination CIDR (upstream).
//!
//! **Batching** (beyond upstream, which makes one router update per route): concurrent
//! route changes are gathered for up to [`ROUTER_WINDOW`] into one router update (one
//! `add_extraroutes` / `remove_extraroutes`, or one read-modify-write), and concurrent port
//! lookups into one port listing. A batch Neutron refuses (400) is retried route by route so
//! the error lands on the route that caused it. Port updates stay one per route (Neutron
//! has no batch), serialised per node.

use std::collections::{BTreeMap, HashMap};
use std::net::IpAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::batch::Coalescer;
use ccm_core::cloud::{ProviderError, Route, Routes};
use k8s_openapi::api::core::v1::NodeAddress;
use serde_json::{Value, json};

use crate::client::{ClientError, OpenStackClient, Service};
use crate::config::Config;
use crate::instances::{Port, exact_name_filter, list_ports, list_servers};

/// How long concurrent route changes are gathered into one router update.
pub const ROUTER_WINDOW: Duration = Duration::from_millis(50);
/// Most routes in one router update.
pub const ROUTER_BATCH: usize = 250;
/// Port lookups gathered in one window up to this many are asked one by one (`GET
/// /ports?fixed_ips=ip_address=…`); more make one listing of every port.
const SMALL_LOOKUP: usize = 2;

/// One extra route.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ExtraRoute {
    /// The destination CIDR.
    pub destination: String,
    /// The next hop.
    pub nexthop: String,
}

impl ExtraRoute {
    fn json(&self) -> Value {
        json!({"destination": self.destination, "nexthop": self.nexthop})
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    Add,
    Remove,
}

type Shared<T> = Result<T, Arc<ClientError>>;

/// Whether Neutron can hold extra routes: `[Route] router-id` is set and Neutron has
/// `extraroute` or `extraroute-atomic` (upstream's condition for `Routes()`).
pub async fn supported(client: &OpenStackClient, config: &Config) -> Result<bool, ClientError> {
    if config.route.router_id.trim().is_empty() {
        return Ok(false);
    }
    Ok(client.has_extension("extraroute-atomic").await?
        || client.has_extension("extraroute").await?)
}

/// The Routes of the OpenStack provider.
pub struct OpenStackRoutes {
    inner: Arc<Inner>,
    router_batches: OnceLock<Coalescer<(Change, ExtraRoute), Shared<()>>>,
    port_lookups: OnceLock<Coalescer<String, Shared<Vec<Port>>>>,
    /// Node name → lock of its port's read-modify-write.
    node_locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
}

struct Inner {
    client: Arc<OpenStackClient>,
    router_id: String,
    /// `Some(false)`: read-modify-write even if `extraroute-atomic` exists (tests).
    atomic: Option<bool>,
    /// Upstream's lock around the router's read-modify-write.
    router_lock: tokio::sync::Mutex<()>,
    /// The networks the router is attached to (its interface ports), refreshed by
    /// `list_routes`; empty: do not filter.
    router_networks: tokio::sync::Mutex<Option<Vec<String>>>,
}

impl std::fmt::Debug for OpenStackRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenStackRoutes").field("router_id", &self.inner.router_id).finish()
    }
}

fn router_error(router: &str, e: &ClientError) -> ProviderError {
    ProviderError::other(format!("[Route] router-id {router}: {e}"))
}

fn shared_error(e: Arc<ClientError>) -> ProviderError {
    ProviderError::with_source(e.to_string(), e)
}

impl OpenStackRoutes {
    /// Routes on the router `[Route] router-id` (an error when it is not set).
    pub fn new(client: Arc<OpenStackClient>, config: &Config) -> Result<Self, ProviderError> {
        let router_id = config.route.router_id.trim().to_string();
        if router_id.is_empty() {
            return Err(ProviderError::Invalid {
                what: "[Route] router-id".into(),
                message: "required for routes".into(),
            });
        }
        Ok(OpenStackRoutes {
            inner: Arc::new(Inner {
                client,
                router_id,
                atomic: None,
                router_lock: tokio::sync::Mutex::new(()),
                router_networks: tokio::sync::Mutex::new(None),
            }),
            router_batches: OnceLock::new(),
            port_lookups: OnceLock::new(),
            node_locks: Mutex::new(HashMap::new()),
        })
    }

    /// Update the router's whole `routes` (read-modify-write) even when Neutron has
    /// `extraroute-atomic` (as upstream does without the extension). For tests.
    pub fn without_atomic_updates(mut self) -> Self {
        if let Some(inner) = Arc::get_mut(&mut self.inner) {
            inner.atomic = Some(false);
        }
        self
    }

    /// The router ID.
    pub fn router_id(&self) -> &str {
        &self.inner.router_id
    }

    fn router_batches(&self) -> &Coalescer<(Change, ExtraRoute), Shared<()>> {
        self.router_batches.get_or_init(|| {
            let inner = self.inner.clone();
            Coalescer::new(ROUTER_WINDOW, ROUTER_BATCH, move |reqs| {
                let inner = inner.clone();
                async move { inner.apply(reqs).await }
            })
        })
    }

    fn port_lookups(&self) -> &Coalescer<String, Shared<Vec<Port>>> {
        self.port_lookups.get_or_init(|| {
            let inner = self.inner.clone();
            Coalescer::new(ROUTER_WINDOW, 1000, move |ips: Vec<String>| {
                let inner = inner.clone();
                async move { inner.lookup_ports(ips).await }
            })
        })
    }

    fn node_lock(&self, node: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.node_locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(node.to_string()).or_default().clone()
    }

    async fn change(&self, change: Change, route: ExtraRoute) -> Result<(), ProviderError> {
        match self.router_batches().call((change, route)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(shared_error(e)),
            Err(closed) => Err(ProviderError::with_source("router update not answered", closed)),
        }
    }

    /// The port holding `ip` on the router's networks: exactly one, else an error.
    async fn port_of(&self, ip: &str) -> Result<Port, ProviderError> {
        let ports = match self.port_lookups().call(ip.to_string()).await {
            Ok(Ok(p)) => p,
            Ok(Err(e)) => return Err(shared_error(e)),
            Err(closed) => {
                return Err(ProviderError::with_source("port lookup not answered", closed));
            }
        };
        let networks = self.inner.router_networks().await.map_err(shared_error)?;
        let on_router: Vec<Port> = ports
            .into_iter()
            .filter(|p| networks.is_empty() || networks.contains(&p.network_id))
            .collect();
        match <[Port; 1]>::try_from(on_router) {
            Ok([one]) => Ok(one),
            Err(v) if v.is_empty() => Err(ProviderError::other(format!(
                "no port holds the next hop {ip} on the networks of router {}",
                self.inner.router_id
            ))),
            Err(v) => Err(ProviderError::other(format!(
                "{} ports hold the next hop {ip} on the networks of router {}",
                v.len(),
                self.inner.router_id
            ))),
        }
    }

    /// The next hop for a route to `node`: its InternalIP of the CIDR's family, from the
    /// Node's addresses, else from its server's ports.
    async fn nexthop(&self, route: &Route) -> Result<String, ProviderError> {
        let v6 = cidr_is_v6(&route.destination_cidr)?;
        if let Some(ip) = internal_ip(&route.target_node_addresses, v6) {
            return Ok(ip);
        }
        // No addresses given: the node's server by name, as upstream's older lookup.
        let client = &self.inner.client;
        let name = &route.target_node;
        let servers = list_servers_named(client, name).await?;
        let [server] = servers.as_slice() else {
            return Err(ProviderError::other(format!(
                "node {name}: {} servers with this name; cannot pick a next hop",
                servers.len()
            )));
        };
        let ports = list_ports(client, &[("device_id", server.id.clone())]).await?;
        let addrs: Vec<NodeAddress> = ports
            .iter()
            .flat_map(|p| &p.fixed_ips)
            .map(|f| NodeAddress { type_: "InternalIP".into(), address: f.ip_address.clone() })
            .collect();
        internal_ip(&addrs, v6).ok_or_else(|| {
            ProviderError::other(format!(
                "node {name} has no IPv{} InternalIP for {}",
                if v6 { 6 } else { 4 },
                route.destination_cidr
            ))
        })
    }

    /// Adds or removes `cidr` in the allowed address pairs of the port holding `ip`.
    async fn update_pairs(
        &self,
        node: &str,
        ip: &str,
        cidr: &str,
        change: Change,
    ) -> Result<(), ProviderError> {
        let client = &self.inner.client;
        if !client.has_extension("allowed-address-pairs").await? {
            tracing::debug!(
                node,
                "OpenStack: Neutron has no allowed-address-pairs: port left alone"
            );
            return Ok(());
        }
        let lock = self.node_lock(node);
        let _held = lock.lock().await;
        let port = self.port_of(ip).await?;
        if port.port_security_enabled == Some(false) {
            tracing::warn!(port = %port.id, node, "OpenStack: port security disabled: allowed address pairs left alone");
            return Ok(());
        }
        let has = |p: &Value| p.get("ip_address").and_then(Value::as_str) == Some(cidr);
        let present = port.allowed_address_pairs.iter().any(has);
        let pairs: Vec<Value> = match (change, present) {
            (Change::Add, false) => {
                let mut pairs = port.allowed_address_pairs.clone();
                pairs.push(json!({"ip_address": cidr}));
                pairs
            }
            (Change::Remove, true) => {
                port.allowed_address_pairs.iter().filter(|p| !has(p)).cloned().collect()
            }
            _ => return Ok(()),
        };
        let body = json!({"port": {"allowed_address_pairs": pairs}});
        client
            .put("neutron:UpdatePort", Service::Network, &["ports", &port.id], &body)
            .await
            .map(|_| ())
            .map_err(|e| ProviderError::other(format!("node {node} port {}: {e}", port.id)))
    }
}

async fn list_servers_named(
    client: &OpenStackClient,
    name: &str,
) -> Result<Vec<crate::instances::Server>, ProviderError> {
    const OP: &str = "nova:ListServers";
    let q = [("name", exact_name_filter(name))];
    let items: Vec<Value> =
        client.list(OP, Service::Compute, &["servers", "detail"], &q, "servers").await?;
    // The server chooses a route's next hop: one Nova shows that cannot be read is an error
    // naming it (and what could not be read), never skipped for another of the name.
    let mut servers = Vec::with_capacity(items.len());
    for v in items {
        let id = v.get("id").and_then(Value::as_str).unwrap_or("<no id>").to_string();
        let server: crate::instances::Server =
            serde_json::from_value(v).map_err(|e| ProviderError::other(format!(
                "{OP}: server {id} (named {name:?}) cannot be read: {e}: refusing to choose a route's next hop without it"
            )))?;
        servers.push(server);
    }
    Ok(servers.into_iter().filter(|s| s.name == name).collect())
}

fn cidr_is_v6(cidr: &str) -> Result<bool, ProviderError> {
    let net: ipnet::IpNet = cidr.parse().map_err(|_| ProviderError::Invalid {
        what: format!("route destination {cidr:?}"),
        message: "not a CIDR".into(),
    })?;
    Ok(matches!(net, ipnet::IpNet::V6(_)))
}

/// The first InternalIP of the family (upstream's `getAddrByNodeName`).
pub fn internal_ip(addrs: &[NodeAddress], v6: bool) -> Option<String> {
    addrs
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .find(|a| matches!(a.address.parse::<IpAddr>(), Ok(ip) if ip.is_ipv6() == v6))
        .map(|a| a.address.clone())
}

/// The routes of a router's JSON.
fn routes_of(router: &Value) -> Vec<ExtraRoute> {
    router
        .get("routes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|r| ExtraRoute {
            destination: r["destination"].as_str().unwrap_or_default().to_string(),
            nexthop: r["nexthop"].as_str().unwrap_or_default().to_string(),
        })
        .collect()
}

impl Inner {
    async fn get_router(&self) -> Result<Value, ClientError> {
        let mut v = self
            .client
            .get("neutron:GetRouter", Service::Network, &["routers", &self.router_id], &[])
            .await?;
        Ok(v["router"].take())
    }

    async fn atomic(&self) -> Result<bool, ClientError> {
        match self.atomic {
            Some(a) => Ok(a),
            None => self.client.has_extension("extraroute-atomic").await,
        }
    }

    /// The router's networks (asked once, concurrent callers wait for that answer;
    /// refreshed by `list_routes`).
    async fn router_networks(&self) -> Result<Vec<String>, Arc<ClientError>> {
        let mut slot = self.router_networks.lock().await;
        if let Some(n) = slot.as_ref() {
            return Ok(n.clone());
        }
        let networks = self.ask_router_networks().await.map_err(Arc::new)?;
        *slot = Some(networks.clone());
        Ok(networks)
    }

    async fn refresh_router_networks(&self) -> Result<Vec<String>, ClientError> {
        let networks = self.ask_router_networks().await?;
        *self.router_networks.lock().await = Some(networks.clone());
        Ok(networks)
    }

    /// The networks of the router's interface ports (`GET /ports?device_id=<router>`).
    async fn ask_router_networks(&self) -> Result<Vec<String>, ClientError> {
        let ports = list_ports(&self.client, &[("device_id", self.router_id.clone())]).await?;
        let mut networks: Vec<String> =
            ports.into_iter().map(|p| p.network_id).filter(|n| !n.is_empty()).collect();
        networks.sort();
        networks.dedup();
        Ok(networks)
    }

    /// The ports holding each IP (one listing of every port for a large batch).
    async fn lookup_ports(&self, ips: Vec<String>) -> Vec<Shared<Vec<Port>>> {
        if ips.len() <= SMALL_LOOKUP {
            let one = |ip: String| async move {
                list_ports(&self.client, &[("fixed_ips", format!("ip_address={ip}"))])
                    .await
                    .map_err(Arc::new)
            };
            return futures::future::join_all(ips.into_iter().map(one)).await;
        }
        match list_ports(&self.client, &[]).await {
            Ok(all) => ips
                .iter()
                .map(|ip| {
                    Ok(all
                        .iter()
                        .filter(|p| p.fixed_ips.iter().any(|f| &f.ip_address == ip))
                        .cloned()
                        .collect())
                })
                .collect(),
            Err(e) => {
                let e = Arc::new(e);
                ips.iter().map(|_| Err(e.clone())).collect()
            }
        }
    }

    /// Applies a batch of route changes: removals first, then additions; a refused batch is
    /// retried route by route.
    async fn apply(&self, reqs: Vec<(Change, ExtraRoute)>) -> Vec<Shared<()>> {
        let atomic = match self.atomic().await {
            Ok(a) => a,
            Err(e) => {
                let e = Arc::new(e);
                return reqs.iter().map(|_| Err(e.clone())).collect();
            }
        };
        let mut out: Vec<Option<Shared<()>>> = vec![None; reqs.len()];
        for change in [Change::Remove, Change::Add] {
            let idx: Vec<usize> = (0..reqs.len()).filter(|i| reqs[*i].0 == change).collect();
            if idx.is_empty() {
                continue;
            }
            let routes: Vec<ExtraRoute> = idx.iter().map(|i| reqs[*i].1.clone()).collect();
            match self.update(change, &routes, atomic).await {
                Ok(()) => idx.iter().for_each(|i| out[*i] = Some(Ok(()))),
                Err(e) if routes.len() > 1 && e.status() == Some(400) => {
                    // One of them is refused: find which.
                    let reqs = &reqs;
                    let each = idx.iter().map(|i| async move {
                        (*i, self.update(change, std::slice::from_ref(&reqs[*i].1), atomic).await)
                    });
                    for (i, r) in futures::future::join_all(each).await {
                        out[i] = Some(r.map_err(Arc::new));
                    }
                }
                Err(e) => {
                    let e = Arc::new(e);
                    idx.iter().for_each(|i| out[*i] = Some(Err(e.clone())));
                }
            }
        }
        out.into_iter().map(|r| r.unwrap_or(Ok(()))).collect()
    }

    /// One router update adding or removing `routes`.
    async fn update(
        &self,
        change: Change,
        routes: &[ExtraRoute],
        atomic: bool,
    ) -> Result<(), ClientError> {
        let client = &self.client;
        let router = self.router_id.as_str();
        if atomic {
            let (op, action) = match change {
                Change::Add => ("neutron:AddExtraRoutes", "add_extraroutes"),
                Change::Remove => ("neutron:RemoveExtraRoutes", "remove_extraroutes"),
            };
            let body = json!({"router": {"routes": routes.iter().map(ExtraRoute::json).collect::<Vec<_>>()}});
            return client
                .put(op, Service::Network, &["routers", router, action], &body)
                .await
                .map(|_| ());
        }
        // Upstream's classical logic: the whole list, under one lock.
        let _held = self.router_lock.lock().await;
        let mut current = routes_of(&self.get_router().await?);
        let before = current.clone();
        match change {
            Change::Add => {
                for r in routes {
                    if !current.contains(r) {
                        current.push(r.clone());
                    }
                }
            }
            Change::Remove => current.retain(|r| !routes.contains(r)),
        }
        if current == before {
            return Ok(());
        }
        let body =
            json!({"router": {"routes": current.iter().map(ExtraRoute::json).collect::<Vec<_>>()}});
        client
            .put("neutron:UpdateRouter", Service::Network, &["routers", router], &body)
            .await
            .map(|_| ())
    }
}

#[async_trait]
impl Routes for OpenStackRoutes {
    async fn list_routes(&self, _cluster_name: &str) -> Result<Vec<Route>, ProviderError> {
        let inner = &self.inner;
        let client = &inner.client;
        let (router, servers, ports, networks) = tokio::try_join!(
            inner.get_router(),
            list_servers(client),
            list_ports(client, &[]),
            inner.refresh_router_networks(),
        )
        .map_err(|e| router_error(&inner.router_id, &e))?;
        let names: HashMap<&str, &str> =
            servers.iter().map(|s| (s.id.as_str(), s.name.as_str())).collect();
        // IP → (node name, port) for the ports of servers on the router's networks.
        let mut by_ip: BTreeMap<&str, (&str, &Port)> = BTreeMap::new();
        for p in &ports {
            let Some(name) = names.get(p.device_id.as_str()) else { continue };
            if !networks.is_empty() && !networks.contains(&p.network_id) {
                continue;
            }
            for f in &p.fixed_ips {
                by_ip.insert(f.ip_address.as_str(), (name, p));
            }
        }
        let pairs_checked = client.has_extension("allowed-address-pairs").await?;
        let mut out = Vec::new();
        for r in routes_of(&router) {
            let route = match by_ip.get(r.nexthop.as_str()) {
                Some((name, port)) => {
                    let pair_missing = pairs_checked
                        && port.port_security_enabled != Some(false)
                        && !port.allowed_address_pairs.iter().any(|p| {
                            p.get("ip_address").and_then(Value::as_str)
                                == Some(r.destination.as_str())
                        });
                    if pair_missing {
                        // Created again by the controller, which repairs the pair.
                        tracing::debug!(node = %name, cidr = %r.destination, "OpenStack: route without its allowed address pair");
                        continue;
                    }
                    Route {
                        name: r.destination.clone(),
                        target_node: name.to_string(),
                        target_node_addresses: vec![NodeAddress {
                            type_: "InternalIP".into(),
                            address: r.nexthop.clone(),
                        }],
                        enable_node_addresses: false,
                        destination_cidr: r.destination.clone(),
                        blackhole: false,
                    }
                }
                None => Route {
                    name: r.destination.clone(),
                    target_node: r.nexthop.clone(),
                    target_node_addresses: vec![],
                    enable_node_addresses: false,
                    destination_cidr: r.destination.clone(),
                    blackhole: true,
                },
            };
            out.push(route);
        }
        Ok(out)
    }

    async fn create_route(
        &self,
        _cluster_name: &str,
        _name_hint: &str,
        route: &Route,
    ) -> Result<(), ProviderError> {
        let nexthop = self.nexthop(route).await?;
        let extra =
            ExtraRoute { destination: route.destination_cidr.clone(), nexthop: nexthop.clone() };
        self.change(Change::Add, extra.clone()).await.map_err(|e| {
            ProviderError::other(format!(
                "route {} via {nexthop} (node {}) on router {}: {e}",
                route.destination_cidr, route.target_node, self.inner.router_id
            ))
        })?;
        if let Err(e) = self
            .update_pairs(&route.target_node, &nexthop, &route.destination_cidr, Change::Add)
            .await
        {
            // Upstream's unwinding: the route goes again, the next pass retries both.
            if let Err(undo) = self.change(Change::Remove, extra).await {
                tracing::warn!(cidr = %route.destination_cidr, error = %undo, "OpenStack: could not remove the route again");
            }
            return Err(e);
        }
        Ok(())
    }

    async fn delete_route(&self, _cluster_name: &str, route: &Route) -> Result<(), ProviderError> {
        let nexthop = if route.blackhole {
            // Upstream: a blackhole route's target is its next hop.
            route.target_node.clone()
        } else {
            self.nexthop(route).await?
        };
        let extra =
            ExtraRoute { destination: route.destination_cidr.clone(), nexthop: nexthop.clone() };
        self.change(Change::Remove, extra).await.map_err(|e| {
            ProviderError::other(format!(
                "route {} via {nexthop} on router {}: {e}",
                route.destination_cidr, self.inner.router_id
            ))
        })?;
        if route.blackhole {
            return Ok(());
        }
        self.update_pairs(&route.target_node, &nexthop, &route.destination_cidr, Change::Remove)
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn a(t: &str, ip: &str) -> NodeAddress {
        NodeAddress { type_: t.into(), address: ip.into() }
    }

    #[test]
    fn the_next_hop_is_the_internal_ip_of_the_cidrs_family() {
        let addrs = [
            a("ExternalIP", "172.24.4.3"),
            a("InternalIP", "fd00::3"),
            a("InternalIP", "10.0.0.3"),
        ];
        assert_eq!(internal_ip(&addrs, false).as_deref(), Some("10.0.0.3"));
        assert_eq!(internal_ip(&addrs, true).as_deref(), Some("fd00::3"));
        assert_eq!(internal_ip(&addrs[..1], false), None);
        assert!(cidr_is_v6("fd00:10:244::/64").unwrap());
        assert!(!cidr_is_v6("10.244.1.0/24").unwrap());
        assert!(cidr_is_v6("10.244.1.0").is_err());
    }
}
