//! Pure route reconciliation: given the cloud's routes, the Nodes and the cluster CIDRs,
//! which routes to delete, which to create, and what each node's routes look like.

use std::collections::{BTreeMap, BTreeSet};

use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::cloud::Route;

/// What to do with one pod CIDR of a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Action {
    /// A matching route exists.
    Keep,
    /// No route for this CIDR: create one.
    Add,
    /// A route exists but with stale node addresses: delete and re-create it.
    Update,
}

/// One route to create.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Create {
    /// Node name.
    pub node: String,
    /// The node UID, passed to the cloud as name hint.
    pub name_hint: String,
    /// The route.
    pub route: Route,
}

/// The outcome of [`plan`].
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Routes to delete (only routes inside a cluster CIDR).
    pub deletes: Vec<Route>,
    /// Routes to create.
    pub creates: Vec<Create>,
    /// Per node that has routes or pod CIDRs: pod CIDR → action. Empty when the node has
    /// routes but no pod CIDRs.
    pub actions: BTreeMap<String, BTreeMap<String, Action>>,
}

fn pod_cidrs(node: &Node) -> Vec<String> {
    let spec = node.spec.as_ref();
    match spec.and_then(|s| s.pod_cidrs.clone()) {
        Some(c) if !c.is_empty() => c,
        _ => spec.and_then(|s| s.pod_cidr.clone()).into_iter().filter(|c| !c.is_empty()).collect(),
    }
}

fn addresses(node: &Node) -> Vec<NodeAddress> {
    node.status.as_ref().and_then(|s| s.addresses.clone()).unwrap_or_default()
}

fn address_set(a: &[NodeAddress]) -> BTreeSet<(&str, &str)> {
    a.iter().map(|a| (a.type_.as_str(), a.address.as_str())).collect()
}

/// Whether the controller owns a route: its first or last address lies in a cluster CIDR.
/// Routes with an unparsable destination are never touched.
pub(crate) fn responsible(destination: &str, cluster_cidrs: &[IpNet]) -> bool {
    let Ok(net) = destination.parse::<IpNet>() else { return false };
    let (first, last) = (net.network(), net.broadcast());
    cluster_cidrs.iter().any(|c| c.contains(&first) || c.contains(&last))
}

/// Computes the reconciliation plan.
pub(crate) fn plan(routes: &[Route], nodes: &[&Node], cluster_cidrs: &[IpNet]) -> Plan {
    let mut by_node: BTreeMap<&str, Vec<&Route>> = BTreeMap::new();
    for r in routes.iter().filter(|r| !r.target_node.is_empty()) {
        by_node.entry(r.target_node.as_str()).or_default().push(r);
    }
    let mut p = Plan::default();
    for name in by_node.keys() {
        p.actions.insert((*name).to_string(), BTreeMap::new());
    }
    for node in nodes {
        let cidrs = pod_cidrs(node);
        if cidrs.is_empty() {
            continue;
        }
        let name = node.metadata.name.clone().unwrap_or_default();
        let addrs = addresses(node);
        let existing = by_node.get(name.as_str()).map(Vec::as_slice).unwrap_or_default();
        let actions = p.actions.entry(name.clone()).or_default();
        for cidr in cidrs {
            let matching: Vec<&&Route> =
                existing.iter().filter(|r| r.destination_cidr == cidr).collect();
            let action = if matching.is_empty() {
                Action::Add
            } else if matching.iter().any(|r| {
                !r.enable_node_addresses
                    || address_set(&r.target_node_addresses) == address_set(&addrs)
            }) {
                Action::Keep
            } else {
                Action::Update
            };
            if action != Action::Keep {
                p.creates.push(Create {
                    node: name.clone(),
                    name_hint: node.metadata.uid.clone().unwrap_or_default(),
                    route: Route {
                        name: String::new(),
                        target_node: name.clone(),
                        target_node_addresses: addrs.clone(),
                        enable_node_addresses: false,
                        destination_cidr: cidr.clone(),
                        blackhole: false,
                    },
                });
            }
            actions.insert(cidr, action);
        }
    }
    for r in routes {
        if !responsible(&r.destination_cidr, cluster_cidrs) {
            continue;
        }
        let action = p.actions.get(&r.target_node).and_then(|a| a.get(&r.destination_cidr));
        if r.blackhole || !matches!(action, Some(Action::Keep)) {
            p.deletes.push(r.clone());
        }
    }
    p
}

/// The `NetworkUnavailable` condition a node should have: `(status, reason, message)`.
pub(crate) fn network_condition(
    actions: &BTreeMap<String, Action>,
) -> (&'static str, &'static str, &'static str) {
    use crate::names::reasons::{NO_ROUTE_CREATED, ROUTE_CREATED};
    if !actions.is_empty() && actions.values().all(|a| *a == Action::Keep) {
        ("False", ROUTE_CREATED, "RouteController created a route")
    } else {
        ("True", NO_ROUTE_CREATED, "RouteController failed to create a route")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus};
    use kube::api::ObjectMeta;

    fn node(name: &str, cidrs: &[&str], addrs: &[&str]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                uid: Some(format!("uid-{name}")),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                pod_cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(
                    addrs
                        .iter()
                        .map(|a| NodeAddress { type_: "InternalIP".into(), address: a.to_string() })
                        .collect(),
                ),
                ..Default::default()
            }),
        }
    }

    fn route(name: &str, target: &str, cidr: &str) -> Route {
        Route {
            name: name.into(),
            target_node: target.into(),
            target_node_addresses: vec![],
            enable_node_addresses: false,
            destination_cidr: cidr.into(),
            blackhole: false,
        }
    }

    fn cluster() -> Vec<IpNet> {
        vec!["10.244.0.0/16".parse().unwrap(), "fd00:10:244::/56".parse().unwrap()]
    }

    #[test]
    fn dual_stack_node_gets_one_route_per_cidr_with_uid_hint() {
        let n = node("a", &["10.244.1.0/24", "fd00:10:244:1::/64"], &["192.0.2.1"]);
        let p = plan(&[], &[&n], &cluster());
        assert_eq!(p.creates.len(), 2);
        assert!(p.creates.iter().all(|c| c.name_hint == "uid-a" && c.route.target_node == "a"));
        assert_eq!(p.creates[1].route.destination_cidr, "fd00:10:244:1::/64");
        assert!(p.deletes.is_empty());
        assert_eq!(network_condition(&p.actions["a"]).0, "True");
    }

    #[test]
    fn existing_routes_are_kept_and_stale_blackholed_or_foreign_ones_handled() {
        let n = node("a", &["10.244.1.0/24"], &[]);
        let mut black = route("r3", "a", "10.244.1.0/24");
        black.blackhole = true;
        let routes = vec![
            route("r1", "a", "10.244.1.0/24"),
            route("r2", "gone", "10.244.9.0/24"),
            black,
            route("r4", "", "10.244.7.0/24"),
            route("outside", "gone", "172.16.0.0/24"),
            route("garbage", "gone", "not-a-cidr"),
        ];
        let p = plan(&routes, &[&n], &cluster());
        assert!(p.creates.is_empty());
        let deleted: Vec<&str> = p.deletes.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(deleted, vec!["r2", "r3", "r4"]);
        let (status, reason, _) = network_condition(&p.actions["a"]);
        assert_eq!((status, reason), ("False", "RouteCreated"));
        // The vanished node had routes but no pod CIDRs: empty action map.
        assert!(p.actions["gone"].is_empty());
        assert_eq!(network_condition(&p.actions["gone"]).0, "True");
    }

    #[test]
    fn changed_node_addresses_update_routes_that_track_them() {
        let n = node("a", &["10.244.1.0/24"], &["192.0.2.2"]);
        let mut r = route("r1", "a", "10.244.1.0/24");
        r.enable_node_addresses = true;
        r.target_node_addresses =
            vec![NodeAddress { type_: "InternalIP".into(), address: "192.0.2.1".into() }];
        let p = plan(&[r], &[&n], &cluster());
        assert_eq!(p.deletes.len(), 1);
        assert_eq!(p.creates.len(), 1);
        assert_eq!(p.actions["a"]["10.244.1.0/24"], Action::Update);
    }

    #[test]
    fn responsibility_uses_first_or_last_address() {
        let c: Vec<IpNet> = vec!["10.244.0.0/16".parse().unwrap()];
        assert!(responsible("10.244.3.0/24", &c));
        assert!(!responsible("10.0.0.0/8", &c));
        assert!(responsible("10.244.255.0/23", &c), "first address inside");
        assert!(!responsible("192.168.0.0/24", &c));
        assert!(!responsible("nonsense", &c));
    }
}
