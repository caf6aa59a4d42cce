//! Routes (`Routes`): pod CIDRs as user-defined routes in the cluster's route table
//! (`routeTableName` in `routeTableResourceGroup`), as upstream's `azure_routes.go`:
//!
//! - a route is named `<node>____<cidr without . : />` (upstream always uses its dual-stack
//!   form now), e.g. `node-1____102441024` for `10.244.1.0/24`; its target node is the part
//!   before `____`;
//! - `nextHopType: VirtualAppliance`, `nextHopIpAddress`: the node's `InternalIP` of the
//!   CIDR's family;
//! - writes are batched as upstream's delayed route updater: create and delete requests
//!   collect for `routeUpdateIntervalInSeconds` (default 30), then one GET and one PUT of the
//!   whole table apply them all (`If-Match` with the table's ETag; a 412 re-reads and applies
//!   again). Every waiting caller gets the batch's result: an ARM failure is an error for
//!   each of them (the route controller retries), never a route reported done but not
//!   written;
//! - the table is created when absent (in `location`, with the config's tags), and its tags
//!   are kept as the config's `tags`/`tagsMap` say (with `systemTags` deleting others) when it
//!   is in the cluster's resource group, as upstream;
//! - a legacy single-stack route named just `<node>` is removed when that node's routes are
//!   written or deleted (upstream's clean-up of outdated routes);
//! - routes of other tables, and routes in this table the cluster did not ask for, are never
//!   touched: only routes named in a request change;
//! - listing routes (the route controller, every 10 s) reads the table from the client's read
//!   cache within upstream's route table TTL (120 s; none with `disableAPICallCache`), so the
//!   controller's periodic listing costs 30 reads an hour, not 360; our writes of the table
//!   drop it. What a listing older than a change made outside the cluster may show never
//!   deletes anything on its own: a batch reads the table afresh, and a deletion applies only
//!   when that fresh table still holds the route the controller decided on (same name, same
//!   destination).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::cloud::{ProviderError, Route, Routes};
use ipnet::IpNet;
use tokio::sync::oneshot;

use crate::client::models::{self, RouteProperties, RouteTable, RouteTableProperties};
use crate::client::{ArmClient, ArmError, api_version};
use crate::config::Config;

/// Separates the node name from the CIDR in a route's name.
pub const ROUTE_NAME_SEPARATOR: &str = "____";

/// How often a batch is re-read and re-applied after a 412 before giving up.
const PRECONDITION_ATTEMPTS: usize = 5;

const ARM_TYPE: &str = "Microsoft.Network/routeTables";
const OP_GET: &str = "network.route_tables.get";
const OP_PUT: &str = "network.route_tables.create_or_update";

/// Upstream's route name: `<node>____<cidr without '.', ':' and '/'>`.
pub fn route_name(node: &str, cidr: &str) -> String {
    let compact: String = cidr.chars().filter(|c| !matches!(c, '.' | ':' | '/')).collect();
    format!("{node}{ROUTE_NAME_SEPARATOR}{compact}")
}

/// The node a route's name points at (the part before `____`; the whole name for a legacy
/// single-stack route).
pub fn route_name_to_node(name: &str) -> &str {
    name.split(ROUTE_NAME_SEPARATOR).next().unwrap_or(name)
}

/// One requested change.
#[derive(Debug, Clone)]
enum Op {
    /// Create or replace the route (and drop the node's legacy route).
    Add { route: Box<models::Route>, node: String },
    /// Remove routes with these names (case-insensitive), only when the table read afresh
    /// still holds the route `confirm` names (name, and destination unless empty): the one
    /// the caller decided to delete from a listing that may be older.
    Delete { confirm: (String, String), names: Vec<String> },
    /// Only bring the table's tags in line.
    Tags,
}

type BatchResult = Result<(), Arc<ArmError>>;

#[derive(Default)]
struct Pending {
    ops: Vec<(Op, oneshot::Sender<BatchResult>)>,
    scheduled: bool,
}

/// The delayed updater: collects [`Op`]s and applies each batch with one GET and one PUT.
struct Updater {
    client: Arc<ArmClient>,
    table_id: String,
    table_name: String,
    location: Option<String>,
    /// The tags to keep on the table (`None`: leave tags alone).
    tags: Option<BTreeMap<String, String>>,
    system_tags: Vec<String>,
    interval: Duration,
    pending: Mutex<Pending>,
    /// One batch at a time.
    flushing: tokio::sync::Mutex<()>,
}

impl Updater {
    fn lock(&self) -> std::sync::MutexGuard<'_, Pending> {
        self.pending.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `op` and waits for the batch that applies it.
    async fn submit(self: &Arc<Self>, op: Op) -> BatchResult {
        let (tx, rx) = oneshot::channel();
        let start = {
            let mut p = self.lock();
            p.ops.push((op, tx));
            !std::mem::replace(&mut p.scheduled, true)
        };
        if start {
            let me = self.clone();
            tokio::spawn(async move { me.run().await });
        }
        rx.await.unwrap_or_else(|_| {
            Err(Arc::new(ArmError::Transport {
                operation: OP_PUT,
                resource: self.table_id.clone(),
                message: "the route update was abandoned (shutting down)".into(),
                broken: false,
            }))
        })
    }

    async fn run(self: Arc<Self>) {
        tokio::time::sleep(self.interval).await;
        let _one = self.flushing.lock().await;
        let ops = {
            let mut p = self.lock();
            p.scheduled = false;
            std::mem::take(&mut p.ops)
        };
        if ops.is_empty() {
            return;
        }
        let (ops, waiters): (Vec<Op>, Vec<_>) = ops.into_iter().unzip();
        let result = self.apply(&ops).await.map_err(Arc::new);
        match &result {
            Ok(()) => {
                tracing::debug!(table = %self.table_name, changes = ops.len(), "route table updated")
            }
            Err(e) => {
                tracing::warn!(table = %self.table_name, changes = ops.len(), error = %e, "route table update failed")
            }
        }
        for w in waiters {
            let _ = w.send(result.clone());
        }
    }

    /// GET, apply every op, PUT when something changed; again on a 412.
    async fn apply(&self, ops: &[Op]) -> Result<(), ArmError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let current: Option<RouteTable> =
                self.client.get_opt(OP_GET, &self.table_id, api_version::NETWORK, &[]).await?;
            let Some(mut table) = current else {
                let mut table = RouteTable {
                    name: Some(self.table_name.clone()),
                    location: Some(self.location.clone().ok_or_else(|| ArmError::Decode {
                        operation: OP_PUT,
                        resource: self.table_id.clone(),
                        message: "the route table does not exist and the cloud config has no location to create it in".into(),
                    })?),
                    tags: self.tags.clone().filter(|t| !t.is_empty()),
                    properties: RouteTableProperties::default(),
                    ..RouteTable::default()
                };
                apply_ops(&mut table.properties.routes, ops);
                tracing::info!(table = %self.table_name, "creating the route table");
                self.client.put(OP_PUT, &self.table_id, api_version::NETWORK, &table, None).await?;
                return Ok(());
            };
            let routes_changed = apply_ops(&mut table.properties.routes, ops);
            let tags_changed = self.reconcile_tags(&mut table);
            if !routes_changed && !tags_changed {
                return Ok(());
            }
            let etag = table.etag.clone();
            match self
                .client
                .put(OP_PUT, &self.table_id, api_version::NETWORK, &table, etag.as_deref())
                .await
            {
                Ok(_) => return Ok(()),
                Err(e) if e.is_precondition_failed() && attempt < PRECONDITION_ATTEMPTS => {
                    tracing::debug!(table = %self.table_name, "route table changed meanwhile; applying again");
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Upstream's tag reconciliation: configured tags added or updated (keys and values
    /// compared ignoring case); with `systemTags`, other keys not starting with a system tag
    /// are removed. Whether anything changed.
    fn reconcile_tags(&self, table: &mut RouteTable) -> bool {
        let Some(wanted) = &self.tags else { return false };
        if wanted.is_empty() {
            return false;
        }
        let current = table.tags.get_or_insert_with(BTreeMap::new);
        let mut changed = false;
        for (k, v) in wanted {
            match current.keys().find(|c| c.eq_ignore_ascii_case(k)).cloned() {
                None => {
                    current.insert(k.clone(), v.clone());
                    changed = true;
                }
                Some(existing) => {
                    if !current.get(&existing).is_some_and(|c| c.eq_ignore_ascii_case(v)) {
                        current.insert(existing, v.clone());
                        changed = true;
                    }
                }
            }
        }
        if !self.system_tags.is_empty() {
            let stale: Vec<String> = current
                .keys()
                .filter(|k| !wanted.contains_key(*k))
                .filter(|k| {
                    !self
                        .system_tags
                        .iter()
                        .any(|s| k.to_ascii_lowercase().starts_with(&s.to_ascii_lowercase()))
                })
                .cloned()
                .collect();
            for k in stale {
                current.remove(&k);
                changed = true;
            }
        }
        changed
    }

    fn tags_need_update(&self, table: &RouteTable) -> bool {
        self.reconcile_tags(&mut table.clone())
    }
}

/// Applies `ops` in order to `routes`; whether anything changed.
fn apply_ops(routes: &mut Vec<models::Route>, ops: &[Op]) -> bool {
    let mut changed = false;
    let remove = |routes: &mut Vec<models::Route>, name: &str| {
        let before = routes.len();
        routes.retain(|r| !r.name().eq_ignore_ascii_case(name));
        before != routes.len()
    };
    for op in ops {
        match op {
            Op::Add { route, node } => {
                changed |= remove(routes, node);
                let same = |r: &models::Route| r.name().eq_ignore_ascii_case(route.name());
                let eq = |a: &Option<String>, b: &Option<String>| {
                    a.as_deref()
                        .unwrap_or_default()
                        .eq_ignore_ascii_case(b.as_deref().unwrap_or_default())
                };
                match routes.iter_mut().find(|r| same(r)) {
                    Some(existing)
                        if eq(
                            &existing.properties.address_prefix,
                            &route.properties.address_prefix,
                        ) && eq(
                            &existing.properties.next_hop_ip_address,
                            &route.properties.next_hop_ip_address,
                        ) && eq(
                            &existing.properties.next_hop_type,
                            &route.properties.next_hop_type,
                        ) => {}
                    Some(existing) => {
                        existing.properties.address_prefix =
                            route.properties.address_prefix.clone();
                        existing.properties.next_hop_type = route.properties.next_hop_type.clone();
                        existing.properties.next_hop_ip_address =
                            route.properties.next_hop_ip_address.clone();
                        changed = true;
                    }
                    None => {
                        routes.push((**route).clone());
                        changed = true;
                    }
                }
            }
            Op::Delete { confirm: (name, prefix), names } => {
                let still_there = routes.iter().any(|r| {
                    r.name().eq_ignore_ascii_case(name)
                        && (prefix.is_empty()
                            || r.properties
                                .address_prefix
                                .as_deref()
                                .is_some_and(|p| p.eq_ignore_ascii_case(prefix)))
                });
                if !still_there {
                    tracing::debug!(route = %name, "not in the table read afresh: nothing deleted");
                    continue;
                }
                for n in names {
                    changed |= remove(routes, n);
                }
            }
            Op::Tags => {}
        }
    }
    changed
}

/// Routes in the cluster's route table.
pub struct AzureRoutes {
    client: Arc<ArmClient>,
    updater: Arc<Updater>,
    configured: bool,
}

impl std::fmt::Debug for AzureRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureRoutes")
            .field("table", &self.updater.table_id)
            .field("interval", &self.updater.interval)
            .finish_non_exhaustive()
    }
}

impl AzureRoutes {
    /// Routes batched every `routeUpdateIntervalInSeconds` (default 30 s).
    pub fn new(client: Arc<ArmClient>, config: Arc<Config>) -> AzureRoutes {
        let interval = config.route_update_interval();
        AzureRoutes::with_interval(client, config, interval)
    }

    /// Routes batched every `interval` (tests use a short one).
    pub fn with_interval(
        client: Arc<ArmClient>,
        config: Arc<Config>,
        interval: Duration,
    ) -> AzureRoutes {
        let table_name = config.route_table_name.clone().unwrap_or_default();
        let rg = config.route_table_resource_group().to_string();
        // The names were checked at start (`Config::validate`); a path the client refuses
        // makes every route call an error naming it.
        let table_id = client.resource_id(&rg, ARM_TYPE, &table_name).unwrap_or_else(|e| {
            tracing::error!(error = %e, "routeTableName / routeTableResourceGroup: not usable");
            String::new()
        });
        // Upstream keeps the table's tags only when it is in the cluster's resource group.
        let manage_tags = rg.eq_ignore_ascii_case(config.resource_group());
        let tags = manage_tags.then(|| config.resource_tags());
        let updater = Arc::new(Updater {
            client: client.clone(),
            table_id,
            table_name: table_name.clone(),
            location: config.location.clone().filter(|l| !l.trim().is_empty()),
            tags,
            system_tags: config.system_tag_keys(),
            interval,
            pending: Mutex::new(Pending::default()),
            flushing: tokio::sync::Mutex::new(()),
        });
        AzureRoutes { client, updater, configured: !table_name.trim().is_empty() }
    }

    fn check_configured(&self) -> Result<(), ProviderError> {
        if self.configured {
            Ok(())
        } else {
            Err(ProviderError::Invalid {
                what: "cloud config routeTableName".into(),
                message: "not set: routes need the cluster's route table".into(),
            })
        }
    }
}

fn batch_error(e: Arc<ArmError>) -> ProviderError {
    if e.is_throttled() {
        return ProviderError::Throttled(e.to_string());
    }
    ProviderError::with_source(e.to_string(), e)
}

/// The node's `InternalIP` of `cidr`'s family.
fn next_hop(route: &Route, cidr: &IpNet) -> Result<String, ProviderError> {
    let v6 = matches!(cidr, IpNet::V6(_));
    route
        .target_node_addresses
        .iter()
        .filter(|a| a.type_ == "InternalIP")
        .filter_map(|a| a.address.parse::<IpAddr>().ok())
        .find(|ip| ip.is_ipv6() == v6)
        .map(|ip| ip.to_string())
        .ok_or_else(|| {
            ProviderError::other(format!(
                "route for node {:?} to {}: the node has no InternalIP address of the {} family",
                route.target_node,
                cidr,
                if v6 { "IPv6" } else { "IPv4" }
            ))
        })
}

#[async_trait]
impl Routes for AzureRoutes {
    async fn list_routes(&self, _cluster_name: &str) -> Result<Vec<Route>, ProviderError> {
        self.check_configured()?;
        // Upstream's route table cache: the listing may be up to its TTL old (our writes drop
        // it); a deletion it leads to is confirmed on a fresh read (`Op::Delete`).
        let max_age = self.client.cache_ttls().route_table;
        let table: Option<RouteTable> = self
            .client
            .get_opt_within(OP_GET, &self.updater.table_id, api_version::NETWORK, max_age)
            .await?;
        let Some(table) = table else { return Ok(Vec::new()) };
        let routes = table
            .properties
            .routes
            .iter()
            .filter_map(|r| {
                let cidr = r.properties.address_prefix.clone()?;
                Some(Route {
                    name: r.name().to_string(),
                    target_node: route_name_to_node(r.name()).to_string(),
                    target_node_addresses: Vec::new(),
                    enable_node_addresses: false,
                    destination_cidr: cidr,
                    blackhole: false,
                })
            })
            .collect();
        if self.updater.tags_need_update(&table) {
            tracing::info!(table = %self.updater.table_name, "updating the route table's tags");
            self.updater.submit(Op::Tags).await.map_err(batch_error)?;
        }
        Ok(routes)
    }

    async fn create_route(
        &self,
        _cluster_name: &str,
        _name_hint: &str,
        route: &Route,
    ) -> Result<(), ProviderError> {
        self.check_configured()?;
        let node = route.target_node.trim();
        if node.is_empty() {
            return Err(ProviderError::Invalid {
                what: "route".into(),
                message: format!("no target node for {}", route.destination_cidr),
            });
        }
        let cidr: IpNet = route.destination_cidr.parse().map_err(|_| ProviderError::Invalid {
            what: "route destination".into(),
            message: format!("{:?} is not a CIDR", route.destination_cidr),
        })?;
        let hop = next_hop(route, &cidr)?;
        let name = route_name(node, &route.destination_cidr);
        let arm_route = models::Route {
            name: Some(name.clone()),
            properties: RouteProperties {
                address_prefix: Some(route.destination_cidr.clone()),
                next_hop_type: Some("VirtualAppliance".into()),
                next_hop_ip_address: Some(hop),
                ..RouteProperties::default()
            },
            ..models::Route::default()
        };
        tracing::debug!(route = %name, node, "queueing route creation");
        self.updater
            .submit(Op::Add { route: Box::new(arm_route), node: node.to_string() })
            .await
            .map_err(batch_error)
    }

    async fn delete_route(&self, _cluster_name: &str, route: &Route) -> Result<(), ProviderError> {
        self.check_configured()?;
        let mut names = Vec::new();
        if !route.name.is_empty() {
            names.push(route.name.clone());
        }
        let node = route.target_node.trim();
        if !node.is_empty() {
            names.push(route_name(node, &route.destination_cidr));
            // Upstream also removes the node's legacy single-stack route.
            names.push(node.to_string());
        }
        names.dedup();
        // The route decided on: the listed name, else the one ours would have.
        let Some(first) = names.first().cloned() else { return Ok(()) };
        let confirm = (first, route.destination_cidr.trim().to_string());
        tracing::debug!(routes = ?names, "queueing route deletion");
        self.updater.submit(Op::Delete { confirm, names }).await.map_err(batch_error)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn arm_route(name: &str, prefix: &str, hop: &str) -> models::Route {
        models::Route {
            name: Some(name.into()),
            properties: RouteProperties {
                address_prefix: Some(prefix.into()),
                next_hop_type: Some("VirtualAppliance".into()),
                next_hop_ip_address: Some(hop.into()),
                ..RouteProperties::default()
            },
            ..models::Route::default()
        }
    }

    #[test]
    fn route_names_are_upstreams() {
        assert_eq!(route_name("node-1", "10.244.1.0/24"), "node-1____102441024");
        assert_eq!(route_name("node-1", "fd00:10:244:1::/64"), "node-1____fd0010244164");
        assert_eq!(route_name_to_node("node-1____102441024"), "node-1");
        assert_eq!(route_name_to_node("node-1"), "node-1");
    }

    #[test]
    fn ops_add_replace_delete_and_leave_others_alone() {
        let mut routes = vec![
            arm_route("operator-default", "0.0.0.0/0", "10.0.0.4"),
            arm_route("a", "10.244.0.0/24", "10.240.0.9"),
            arm_route("b____102441024", "10.244.1.0/24", "10.240.0.5"),
        ];
        let add_a = Op::Add {
            route: Box::new(arm_route("a____102440024", "10.244.0.0/24", "10.240.0.4")),
            node: "a".into(),
        };
        assert!(apply_ops(&mut routes, std::slice::from_ref(&add_a)));
        let names: Vec<&str> = routes.iter().map(|r| r.name()).collect();
        assert_eq!(
            names,
            ["operator-default", "b____102441024", "a____102440024"],
            "legacy route of a dropped"
        );
        // The same request again changes nothing (no PUT).
        assert!(!apply_ops(&mut routes, &[add_a]));
        // A new next hop replaces the route in place.
        let moved = Op::Add {
            route: Box::new(arm_route("B____102441024", "10.244.1.0/24", "10.240.0.6")),
            node: "b".into(),
        };
        assert!(apply_ops(&mut routes, &[moved]));
        assert_eq!(routes[1].properties.next_hop_ip_address.as_deref(), Some("10.240.0.6"));
        let delete_b = |prefix: &str| Op::Delete {
            confirm: ("b____102441024".into(), prefix.into()),
            names: vec!["b____102441024".into(), "b".into()],
        };
        // A deletion decided on a route the fresh table holds with another destination (a
        // listing older than a change): nothing deleted.
        assert!(!apply_ops(&mut routes, &[delete_b("10.244.9.0/24")]));
        assert_eq!(routes.len(), 3);
        assert!(apply_ops(&mut routes, &[delete_b("10.244.1.0/24")]));
        assert!(!apply_ops(&mut routes, &[delete_b("10.244.1.0/24")]));
        let names: Vec<&str> = routes.iter().map(|r| r.name()).collect();
        assert_eq!(names, ["operator-default", "a____102440024"]);
    }

    #[test]
    fn next_hop_is_the_internal_ip_of_the_family() {
        use k8s_openapi::api::core::v1::NodeAddress;
        let addr = |t: &str, a: &str| NodeAddress { type_: t.into(), address: a.into() };
        let route = Route {
            name: String::new(),
            target_node: "n".into(),
            target_node_addresses: vec![
                addr("ExternalIP", "20.0.0.1"),
                addr("InternalIP", "fd00::8"),
                addr("InternalIP", "10.240.0.8"),
            ],
            enable_node_addresses: false,
            destination_cidr: String::new(),
            blackhole: false,
        };
        assert_eq!(next_hop(&route, &"10.244.0.0/24".parse().unwrap()).unwrap(), "10.240.0.8");
        assert_eq!(next_hop(&route, &"fd00:1::/64".parse().unwrap()).unwrap(), "fd00::8");
        let v4_only =
            Route { target_node_addresses: vec![addr("InternalIP", "10.0.0.1")], ..route };
        let e = next_hop(&v4_only, &"fd00:1::/64".parse().unwrap()).unwrap_err().to_string();
        assert!(e.contains("no InternalIP address of the IPv6 family"), "{e}");
    }
}
