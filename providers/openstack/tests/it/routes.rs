//! Routes against the emulator: extra routes on `router1` and allowed address pairs on the
//! nodes' ports, created and deleted for 200 nodes, with the router updates counted.

use std::sync::Arc;

use ccm_core::cloud::{Route, Routes};
use ccm_provider_openstack::client::Service;
use ccm_provider_openstack::config::{Config, RouteOpts};
use ccm_provider_openstack::routes::{OpenStackRoutes, supported};
use k8s_openapi::api::core::v1::NodeAddress;
use serde_json::{Value, json};

use ccm_emulators::openstack::OpenStackOptions;
use ccm_emulators::server::ServerOptions;

use crate::fixture::{Fixture, WORLD, fast_options, instance, start, start_with};

fn config(f: &Fixture, router: &str) -> Config {
    Config { route: RouteOpts { router_id: router.into() }, ..f.config.clone() }
}

fn routes(f: &Fixture) -> OpenStackRoutes {
    let router = f.cloud.neutron_id("routers", "router1").unwrap();
    OpenStackRoutes::new(Arc::clone(&f.client), &config(f, &router)).unwrap()
}

fn route(node: &str, ip: Option<&str>, cidr: &str) -> Route {
    Route {
        name: String::new(),
        target_node: node.into(),
        target_node_addresses: ip
            .map(|ip| vec![NodeAddress { type_: "InternalIP".into(), address: ip.into() }])
            .unwrap_or_default(),
        enable_node_addresses: false,
        destination_cidr: cidr.into(),
        blackhole: false,
    }
}

/// The router's routes as `(destination, nexthop)`, sorted.
fn router_routes(f: &Fixture) -> Vec<(String, String)> {
    let routers = f.cloud.objects("routers");
    let mut out: Vec<(String, String)> = routers[0]["routes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["destination"].as_str().unwrap().into(), r["nexthop"].as_str().unwrap().into()))
        .collect();
    out.sort();
    out
}

/// The allowed address pairs of the port holding `ip`.
fn pairs_of(f: &Fixture, ip: &str) -> Vec<String> {
    let ports = f.cloud.objects("ports");
    let port = ports
        .iter()
        .find(|p| p["fixed_ips"].as_array().unwrap().iter().any(|x| x["ip_address"] == ip))
        .unwrap();
    port["allowed_address_pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["ip_address"].as_str().unwrap().to_string())
        .collect()
}

fn router_updates(f: &Fixture) -> u64 {
    let c = f.server.counters();
    c.get("neutron.routers.add_extraroutes")
        + c.get("neutron.routers.remove_extraroutes")
        + c.get("neutron.routers.update")
}

/// 200 servers `r-000`… at 10.0.0.20… and their routes 10.244.<i>.0/24.
async fn two_hundred(f: &Fixture) -> Vec<Route> {
    (0..200)
        .map(|i| {
            let (name, ip) = (format!("r-{i:03}"), format!("10.0.0.{}", 20 + i));
            f.cloud.add_server(instance(&name, "az-1", &ip)).unwrap();
            route(&name, Some(&ip), &format!("10.244.{i}.0/24"))
        })
        .collect()
}

async fn create_and_delete_two_hundred(atomic: bool) {
    // Neutron allows 30 routes per router by default (`max_routes`): a cluster routing 200
    // nodes' pod CIDRs through one router has it raised, as here.
    let opts = OpenStackOptions { max_routes: 256, ..Default::default() };
    let f = start_with(WORLD, opts, fast_options(), ServerOptions::default()).await;
    let mut r = routes(&f);
    if !atomic {
        r = r.without_atomic_updates();
    }
    let wanted = two_hundred(&f).await;
    assert!(supported(&f.client, &config(&f, r.router_id())).await.unwrap());

    // As the route controller does: every creation at once.
    let created =
        futures::future::join_all(wanted.iter().map(|w| r.create_route("k", "uid", w))).await;
    assert!(created.iter().all(|c| c.is_ok()), "{:?}", created.iter().find(|c| c.is_err()));
    let have = router_routes(&f);
    assert_eq!(have.len(), 200);
    assert!(have.contains(&("10.244.7.0/24".into(), "10.0.0.27".into())));
    assert_eq!(pairs_of(&f, "10.0.0.27"), ["10.244.7.0/24"]);
    let c = f.server.counters();
    let creates = (router_updates(&f), c.get("neutron.ports.update"), c.get("neutron.ports.list"));
    println!(
        "200 routes created ({}): {} router updates, {} port updates, {} port lists, {} router gets",
        if atomic { "add_extraroutes" } else { "read-modify-write" },
        creates.0,
        creates.1,
        creates.2,
        c.get("neutron.routers.get"),
    );
    assert!(creates.0 <= 10, "router updates are batched: {}", creates.0);
    assert_eq!(creates.1, 200, "one port update per node");
    assert!(creates.2 <= 10, "port lookups are batched: {}", creates.2);

    // Listed with their nodes, none blackholed.
    let listed = r.list_routes("k").await.unwrap();
    assert_eq!(listed.len(), 200);
    assert!(listed.iter().all(|l| !l.blackhole && l.target_node.starts_with("r-")));
    let l7 = listed.iter().find(|l| l.destination_cidr == "10.244.7.0/24").unwrap();
    assert_eq!((l7.name.as_str(), l7.target_node.as_str()), ("10.244.7.0/24", "r-007"));

    // Creating again changes nothing.
    let before = f.server.counters().get("neutron.ports.update");
    r.create_route("k", "uid", &wanted[7]).await.unwrap();
    assert_eq!(f.server.counters().get("neutron.ports.update"), before);
    assert_eq!(router_routes(&f).len(), 200);

    // Deleted, as listed, all at once.
    let updates = router_updates(&f);
    let deleted = futures::future::join_all(listed.iter().map(|l| r.delete_route("k", l))).await;
    assert!(deleted.iter().all(|d| d.is_ok()), "{:?}", deleted.iter().find(|d| d.is_err()));
    assert!(router_routes(&f).is_empty());
    assert!(pairs_of(&f, "10.0.0.27").is_empty());
    assert!(pairs_of(&f, "10.0.0.219").is_empty());
    let c = f.server.counters();
    println!(
        "200 routes deleted: {} router updates, {} port updates in all",
        router_updates(&f) - updates,
        c.get("neutron.ports.update")
    );
    assert!(router_updates(&f) - updates <= 10);
    assert_eq!(c.get("neutron.ports.update"), 400, "200 added, 200 removed");
    // Deleting again is fine.
    r.delete_route("k", &listed[0]).await.unwrap();
}

#[tokio::test]
async fn routes_for_200_nodes_are_created_and_deleted_with_atomic_updates() {
    create_and_delete_two_hundred(true).await;
}

#[tokio::test]
async fn routes_for_200_nodes_are_created_and_deleted_by_read_modify_write() {
    create_and_delete_two_hundred(false).await;
}

#[tokio::test]
async fn a_missing_router_is_a_clear_error() {
    let f = start().await;
    let r = OpenStackRoutes::new(Arc::clone(&f.client), &config(&f, "no-such-router")).unwrap();
    let err = r.list_routes("k").await.unwrap_err().to_string();
    assert!(err.contains("[Route] router-id no-such-router") && err.contains("404"), "{err}");
    let err =
        r.create_route("k", "uid", &route("node-a", Some("10.0.0.11"), "10.244.0.0/24")).await;
    let err = err.unwrap_err().to_string();
    assert!(err.contains("no-such-router") && err.contains("404"), "{err}");
    assert!(OpenStackRoutes::new(Arc::clone(&f.client), &config(&f, " ")).is_err());
    assert!(!supported(&f.client, &config(&f, "")).await.unwrap());
}

#[tokio::test]
async fn a_next_hop_off_the_router_subnets_is_refused_naming_it() {
    let f = start().await;
    let r = routes(&f);
    let bad = route("node-x", Some("192.168.77.5"), "10.244.9.0/24");
    let err = r.create_route("k", "uid", &bad).await.unwrap_err().to_string();
    assert!(err.contains("192.168.77.5") && err.contains("10.244.9.0/24"), "{err}");
    // In a batch with good routes: only the bad one fails.
    let good = [
        route("node-a", Some("10.0.0.11"), "10.244.1.0/24"),
        route("node-b", Some("10.0.1.12"), "10.244.2.0/24"),
        bad,
    ];
    let out = futures::future::join_all(good.iter().map(|g| r.create_route("k", "uid", g))).await;
    assert!(out[0].is_ok() && out[1].is_ok(), "{out:?}");
    assert!(out[2].as_ref().unwrap_err().to_string().contains("192.168.77.5"));
    assert_eq!(router_routes(&f).len(), 2);
}

#[tokio::test]
async fn blackholes_and_repairs_as_upstream() {
    let f = start().await;
    let r = routes(&f);
    let router = r.router_id().to_string();
    // A route to an address no server holds: a blackhole targeting its next hop.
    let body =
        json!({"router": {"routes": [{"destination": "10.244.50.0/24", "nexthop": "10.0.0.250"}]}});
    f.client
        .put("test", Service::Network, &["routers", &router, "add_extraroutes"], &body)
        .await
        .unwrap();
    // node-a's route, its next hop found from its server (no addresses given).
    r.create_route("k", "uid", &route("node-a", None, "10.244.1.0/24")).await.unwrap();
    assert_eq!(pairs_of(&f, "10.0.0.11"), ["10.244.1.0/24"]);
    let listed = r.list_routes("k").await.unwrap();
    let hole = listed.iter().find(|l| l.blackhole).unwrap();
    assert_eq!(
        (hole.target_node.as_str(), hole.destination_cidr.as_str()),
        ("10.0.0.250", "10.244.50.0/24")
    );
    r.delete_route("k", hole).await.unwrap();
    assert_eq!(router_routes(&f), [("10.244.1.0/24".to_string(), "10.0.0.11".to_string())]);

    // The pair is lost (someone edited the port): the route is not listed, so the controller
    // creates it again, which repairs the pair.
    let port = f
        .cloud
        .objects("ports")
        .into_iter()
        .find(|p| p["fixed_ips"][0]["ip_address"] == "10.0.0.11")
        .unwrap();
    let id = port["id"].as_str().unwrap().to_string();
    let clear = json!({"port": {"allowed_address_pairs": Value::Array(vec![])}});
    f.client.put("test", Service::Network, &["ports", &id], &clear).await.unwrap();
    assert!(r.list_routes("k").await.unwrap().is_empty());
    r.create_route("k", "uid", &route("node-a", Some("10.0.0.11"), "10.244.1.0/24")).await.unwrap();
    assert_eq!(pairs_of(&f, "10.0.0.11"), ["10.244.1.0/24"]);
    assert_eq!(r.list_routes("k").await.unwrap().len(), 1);
    assert_eq!(router_routes(&f).len(), 1, "the route itself was not added twice");
}

/// A route to a Node that lists no addresses takes its next hop from the server of its name:
/// a server of that name that Nova shows but that cannot be read (here its `addresses` is
/// not an object) is an error naming the server and the field, and no route is made — before,
/// it was dropped silently and the route went to the other server of the name.
#[tokio::test]
async fn an_unreadable_server_of_the_nodes_name_is_an_error_naming_it() {
    use ccm_emulators::faults::{Fault, FaultRule};
    let f = start().await;
    let r = routes(&f);
    let good = json!({"id": f.cloud.server_id("node-a").unwrap(), "name": "node-a",
        "status": "ACTIVE", "addresses": {}});
    let bad = json!({"id": "bad-server-0001", "name": "node-a", "status": "ACTIVE",
        "addresses": "not-an-object"});
    let body = json!({"servers": [good, bad]}).to_string();
    f.server
        .inject(
            FaultRule::new("nova.servers.list", Fault::Status { status: 200, body: Some(body) })
                .times(1),
        )
        .unwrap();
    let err = r
        .create_route("k", "uid", &route("node-a", None, "10.244.60.0/24"))
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("bad-server-0001") && err.contains("node-a"), "{err}");
    assert!(err.contains("invalid type"), "names what could not be read: {err}");
    assert!(router_routes(&f).is_empty(), "no route: {:?}", router_routes(&f));
    // Nova's own answer again: the next hop is node-a's port address.
    r.create_route("k", "uid", &route("node-a", None, "10.244.60.0/24")).await.unwrap();
    assert_eq!(router_routes(&f), [("10.244.60.0/24".to_string(), "10.0.0.11".to_string())]);
}
