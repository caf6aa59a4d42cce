//! Routes against the emulator: upstream's names and bodies, the list filter, 200 nodes
//! routed and unrouted, blackholes, conflicts and outages.

use std::sync::Arc;

use ccm_core::cloud::{ProviderError, Route, Routes};
use ccm_core::controllers::route::MAX_CONCURRENT_ROUTE_OPERATIONS;
use ccm_emulators::admin::PauseMode;
use ccm_provider_gcp::client::{GceClient, link};
use ccm_provider_gcp::config::Global;
use ccm_provider_gcp::routes::GceRoutes;
use futures::StreamExt;
use google_cloud_compute_v1::model::Route as GceRoute;
use serde_json::Value;

use crate::fixture::{self, NETWORK, PROJECT, ZONE_A, ZONE_B};

const CLUSTER: &str = "kubernetes-cluster-with-a-long-name";
const PREFIX: &str = "kubernetes-cluster-with-a-"; // its first 26 characters

fn route(node: &str, cidr: &str) -> Route {
    Route {
        name: String::new(),
        target_node: node.into(),
        target_node_addresses: vec![],
        enable_node_addresses: false,
        destination_cidr: cidr.into(),
        blackhole: false,
    }
}

fn uid(i: usize) -> String {
    format!("00000000-0000-4000-8000-{i:012}")
}

fn network() -> String {
    link(&format!("projects/{PROJECT}/global/networks/{NETWORK}"))
}

fn stored(f: &fixture::Fixture, name: &str) -> Value {
    f.cloud.resource("routes", "global", name).unwrap_or_else(|| panic!("no route {name}"))
}

#[tokio::test]
async fn routes_for_200_nodes_are_created_listed_and_deleted() {
    let f = fixture::start().await;
    for i in 0..200 {
        let zone = if i % 2 == 0 { ZONE_A } else { ZONE_B };
        let ip = format!("10.{}.{}.{}", if zone == ZONE_A { 1 } else { 2 }, i / 200, i % 200 + 1);
        f.cloud.add_instance(&fixture::instance(&format!("node-{i:03}"), zone, &ip)).unwrap();
    }
    let routes = GceRoutes::new(f.client.clone());
    let before = f.server.counters();
    let created: Vec<Result<(), ProviderError>> = futures::stream::iter(0..200)
        .map(|i| {
            let routes = &routes;
            async move {
                let r =
                    route(&format!("node-{i:03}.c.{PROJECT}.internal"), &format!("10.64.{i}.0/24"));
                routes.create_route(CLUSTER, &uid(i), &r).await
            }
        })
        .buffer_unordered(MAX_CONCURRENT_ROUTE_OPERATIONS)
        .collect()
        .await;
    let after = f.server.counters();
    assert!(created.iter().all(Result::is_ok), "{:?}", created.iter().find(|r| r.is_err()));
    let d = |op: &str| after.get(op) - before.get(op);
    println!(
        "200 routes created: {} routes.insert, {} globalOperations.get, {} instances.list, {} instances.get, {} calls in all",
        d("compute.routes.insert"),
        d("compute.globalOperations.get"),
        d("compute.instances.list"),
        d("compute.instances.get"),
        after.total - before.total
    );
    assert_eq!(d("compute.routes.insert"), 200);
    assert!(d("compute.globalOperations.get") >= 200, "every operation awaited");
    assert_eq!(d("compute.instances.list"), 2, "one listing of the two zones for the burst");
    assert_eq!(d("compute.instances.get"), 0);

    // Upstream's body.
    let r = stored(&f, &format!("{PREFIX}-{}", uid(7)));
    assert_eq!(r["destRange"], "10.64.7.0/24");
    assert_eq!(r["network"], network());
    assert_eq!(
        r["nextHopInstance"],
        link(&format!("projects/{PROJECT}/zones/{ZONE_B}/instances/node-007"))
    );
    assert_eq!(r["priority"], 1000);
    assert_eq!(r["description"], "k8s-node-route");

    let listed = routes.list_routes(CLUSTER).await.unwrap();
    assert_eq!(listed.len(), 200);
    let r7 = listed.iter().find(|r| r.destination_cidr == "10.64.7.0/24").unwrap();
    assert_eq!(r7.target_node, "node-007");
    assert_eq!(r7.name, format!("{PREFIX}-{}", uid(7)));
    assert!(listed.iter().all(|r| !r.blackhole));

    let before = f.server.counters();
    let deleted: Vec<Result<(), ProviderError>> = futures::stream::iter(listed.iter())
        .map(|r| routes.delete_route(CLUSTER, r))
        .buffer_unordered(MAX_CONCURRENT_ROUTE_OPERATIONS)
        .collect()
        .await;
    let after = f.server.counters();
    assert!(deleted.iter().all(Result::is_ok));
    let d = |op: &str| after.get(op) - before.get(op);
    println!(
        "200 routes deleted: {} routes.delete, {} globalOperations.get, {} calls in all",
        d("compute.routes.delete"),
        d("compute.globalOperations.get"),
        after.total - before.total
    );
    assert_eq!(d("compute.routes.delete"), 200);
    assert!(f.cloud.resources("routes").is_empty());
    assert!(routes.list_routes(CLUSTER).await.unwrap().is_empty());
}

#[tokio::test]
async fn the_list_holds_only_the_cluster_s_node_routes() {
    let f = fixture::start().await;
    let routes = GceRoutes::new(f.client.clone());
    routes.create_route(CLUSTER, "uid-a", &route("node-a", "10.64.0.0/24")).await.unwrap();
    // Routes upstream's filter leaves out: another cluster, another description, another
    // network.
    let c = f.client.compute().await.unwrap();
    let hop = link(&format!("projects/{PROJECT}/zones/{ZONE_A}/instances/node-a"));
    let other_net = link(&format!("projects/{PROJECT}/global/networks/default"));
    for (name, desc, net) in [
        ("other-cluster-uid-a", "k8s-node-route", network()),
        (&*format!("{PREFIX}-by-hand"), "added by hand", network()),
        (&*format!("{PREFIX}-other-net"), "k8s-node-route", other_net),
    ] {
        let body = GceRoute::new()
            .set_name(name)
            .set_dest_range("10.64.9.0/24")
            .set_network(net)
            .set_next_hop_instance(&hop)
            .set_description(desc);
        f.client
            .mutate("compute.routes.insert", || {
                c.routes.insert().set_project(PROJECT).set_body(body.clone()).send()
            })
            .await
            .unwrap();
    }
    let listed = routes.list_routes(CLUSTER).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].name, format!("{PREFIX}-uid-a"));
    assert_eq!(listed[0].target_node, "node-a");

    // Deleting is for the cluster's routes only.
    let mut foreign = route("node-a", "10.64.9.0/24");
    foreign.name = "other-cluster-uid-a".into();
    assert!(matches!(
        routes.delete_route(CLUSTER, &foreign).await,
        Err(ProviderError::Invalid { .. })
    ));
    assert!(f.cloud.resource("routes", "global", "other-cluster-uid-a").is_some());
}

#[tokio::test]
async fn a_dual_stack_node_gets_two_routes() {
    let f = fixture::start().await;
    let routes = GceRoutes::new(f.client.clone());
    let hint = uid(1);
    routes.create_route(CLUSTER, &hint, &route("node-b", "10.64.1.0/24")).await.unwrap();
    routes.create_route(CLUSTER, &hint, &route("node-b", "fd00:10:64:1::/64")).await.unwrap();
    let v6 = stored(&f, &format!("{PREFIX}-{}-v6", hint.replace('-', "")));
    assert_eq!(v6["destRange"], "fd00:10:64:1::/64");
    let mut listed: Vec<String> = routes
        .list_routes(CLUSTER)
        .await
        .unwrap()
        .into_iter()
        .map(|r| r.destination_cidr)
        .collect();
    listed.sort();
    assert_eq!(listed, ["10.64.1.0/24", "fd00:10:64:1::/64"]);
}

#[tokio::test]
async fn an_existing_route_of_that_name_must_be_the_node_s() {
    let f = fixture::start().await;
    let routes = GceRoutes::new(f.client.clone());
    let r = route("node-a", "10.64.0.0/24");
    routes.create_route(CLUSTER, "uid-a", &r).await.unwrap();
    // Again (a lost answer, another manager): the same route, fine.
    routes.create_route(CLUSTER, "uid-a", &r).await.unwrap();
    // The name taken by another destination: an error, not a silent success.
    let e =
        routes.create_route(CLUSTER, "uid-a", &route("node-a", "10.64.5.0/24")).await.unwrap_err();
    assert!(e.to_string().contains("already exists with destination 10.64.0.0/24"), "{e}");
    // Deleting a route that is already gone is done.
    let mut gone = route("node-a", "10.64.0.0/24");
    gone.name = format!("{PREFIX}-never-made");
    routes.delete_route(CLUSTER, &gone).await.unwrap();
    // A node without an instance cannot be routed to.
    let e = routes
        .create_route(CLUSTER, "uid-x", &route("no-such-node", "10.64.8.0/24"))
        .await
        .unwrap_err();
    assert!(e.to_string().contains("no instance named \"no-such-node\""), "{e}");
    let e =
        routes.create_route(CLUSTER, "uid-y", &route("node-a", "not-a-cidr")).await.unwrap_err();
    assert!(matches!(e, ProviderError::Invalid { .. }), "{e}");
}

#[tokio::test]
async fn a_route_to_a_deleted_instance_is_a_blackhole() {
    let f = fixture::start().await;
    let routes = GceRoutes::new(f.client.clone());
    routes.create_route(CLUSTER, "uid-a", &route("node-a", "10.64.0.0/24")).await.unwrap();
    routes.create_route(CLUSTER, "uid-b", &route("node-b", "10.64.1.0/24")).await.unwrap();
    assert!(f.cloud.delete_instance("node-b"));
    let listed = routes.list_routes(CLUSTER).await.unwrap();
    let b = listed.iter().find(|r| r.target_node == "node-b").unwrap();
    assert!(b.blackhole);
    assert!(!listed.iter().find(|r| r.target_node == "node-a").unwrap().blackhole);
    routes.delete_route(CLUSTER, b).await.unwrap();
    assert_eq!(routes.list_routes(CLUSTER).await.unwrap().len(), 1);
}

#[tokio::test]
async fn a_single_managed_zone_needs_no_lookup() {
    let f = fixture::start().await;
    // One managed zone: the next hop is in it, nothing is looked up.
    let global = Global { multizone: false, ..fixture::global() };
    let routes = GceRoutes::new(Arc::new(GceClient::new(&global, f.options.clone()).unwrap()));
    let before = f.server.counters();
    routes.create_route(CLUSTER, "uid-a", &route("node-a", "10.64.0.0/24")).await.unwrap();
    let after = f.server.counters();
    assert_eq!(after.matching("compute.instances.*"), before.matching("compute.instances.*"));
    // A node of another zone: Compute refuses the next hop, an error.
    let e =
        routes.create_route(CLUSTER, "uid-b", &route("node-b", "10.64.1.0/24")).await.unwrap_err();
    assert!(e.to_string().contains("404"), "{e}");
}

#[tokio::test]
async fn an_outage_fails_the_calls() {
    let f = fixture::start().await;
    let routes = GceRoutes::new(f.client.clone());
    routes.create_route(CLUSTER, "uid-a", &route("node-a", "10.64.0.0/24")).await.unwrap();
    let listed = routes.list_routes(CLUSTER).await.unwrap();
    f.server.admin().pause(PauseMode::Fail).await.unwrap();
    assert!(routes.list_routes(CLUSTER).await.is_err());
    assert!(routes.create_route(CLUSTER, "uid-b", &route("node-b", "10.64.1.0/24")).await.is_err());
    assert!(routes.delete_route(CLUSTER, &listed[0]).await.is_err());
    f.server.admin().resume().await.unwrap();
    assert_eq!(routes.list_routes(CLUSTER).await.unwrap().len(), 1, "nothing was deleted");
}
