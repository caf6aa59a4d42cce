//! Routes against the emulator: batched route-table writes (200 nodes → a handful of PUTs),
//! upstream's route names, next hops of the CIDR's family, operator routes and other tables
//! untouched, deletes, ARM failures reported to every waiting caller, and listings within
//! the route table TTL (deletions confirmed on a fresh read).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::{Route, Routes};
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_provider_azure::routes::AzureRoutes;
use k8s_openapi::api::core::v1::NodeAddress;
use serde_json::json;

use crate::fixture::{self, CLUSTER, RESOURCE_GROUP};

const PUT: &str = "network.route_tables.create_or_update";
const GET: &str = "network.route_tables.get";

fn route(node: &str, cidr: &str, ips: &[&str]) -> Route {
    Route {
        name: String::new(),
        target_node: node.into(),
        target_node_addresses: ips
            .iter()
            .map(|ip| NodeAddress { type_: "InternalIP".into(), address: ip.to_string() })
            .chain(std::iter::once(NodeAddress { type_: "Hostname".into(), address: node.into() }))
            .collect(),
        enable_node_addresses: false,
        destination_cidr: cidr.into(),
        blackhole: false,
    }
}

fn table_id(f: &fixture::Fixture, name: &str) -> String {
    f.client.resource_id(RESOURCE_GROUP, "Microsoft.Network/routeTables", name).unwrap()
}

fn routes_of(f: &fixture::Fixture, name: &str) -> Vec<serde_json::Value> {
    let t = f.cloud.resource(&table_id(f, name)).expect("the route table exists");
    t["properties"]["routes"].as_array().cloned().unwrap_or_default()
}

fn routes(f: &fixture::Fixture) -> Arc<AzureRoutes> {
    Arc::new(AzureRoutes::with_interval(
        f.client.clone(),
        f.config.clone(),
        Duration::from_millis(300),
    ))
}

#[tokio::test]
async fn routes_for_200_nodes_take_a_handful_of_route_table_puts() {
    let f = fixture::start().await;
    let table = format!("{CLUSTER}-routetable");
    // An operator's route and setting in the cluster's table, and another table.
    f.cloud
        .put_resource(
            &table_id(&f, &table),
            json!({"properties": {"disableBgpRoutePropagation": true, "routes": [
                {"name": "to-firewall", "properties": {"addressPrefix": "0.0.0.0/0", "nextHopType": "VirtualAppliance", "nextHopIpAddress": "10.0.0.4"}}
            ]}}),
        )
        .unwrap();
    f.cloud
        .put_resource(
            &table_id(&f, "other"),
            json!({"properties": {"routes": [
                {"name": "node-7____102447024", "properties": {"addressPrefix": "10.244.7.0/24", "nextHopType": "VirtualAppliance", "nextHopIpAddress": "10.9.9.9"}}
            ]}}),
        )
        .unwrap();
    let r = routes(&f);
    let tasks: Vec<_> = (0..200u32)
        .map(|i| {
            let r = r.clone();
            tokio::spawn(async move {
                let ip = format!("10.240.{}.{}", i / 250, i % 250 + 4);
                let cidr = format!("10.244.{i}.0/24");
                r.create_route(CLUSTER, "uid", &route(&format!("node-{i}"), &cidr, &[&ip])).await
            })
        })
        .collect();
    for t in futures::future::join_all(tasks).await {
        t.unwrap().unwrap();
    }
    let puts = f.server.counters().get(PUT);
    println!(
        "routes for 200 nodes: {puts} route-table PUT(s), {} GET(s)",
        f.server.counters().get(GET)
    );
    assert!((1..=3).contains(&puts), "{puts} PUTs for 200 routes");

    let arm = routes_of(&f, &table);
    assert_eq!(arm.len(), 201, "200 node routes and the operator's");
    let r7 = arm.iter().find(|r| r["name"] == "node-7____102447024").unwrap();
    assert_eq!(r7["properties"]["addressPrefix"], "10.244.7.0/24");
    assert_eq!(r7["properties"]["nextHopType"], "VirtualAppliance");
    assert_eq!(r7["properties"]["nextHopIpAddress"], "10.240.0.11");
    assert!(arm.iter().any(|r| r["name"] == "to-firewall"), "the operator's route survives");
    let t = f.cloud.resource(&table_id(&f, &table)).unwrap();
    assert_eq!(
        t["properties"]["disableBgpRoutePropagation"], true,
        "the operator's setting survives"
    );
    assert_eq!(routes_of(&f, "other").len(), 1, "another table is untouched");
    assert_eq!(routes_of(&f, "other")[0]["properties"]["nextHopIpAddress"], "10.9.9.9");

    // list_routes: one GET, the node each route targets.
    let gets = f.server.counters().get(GET);
    let listed = r.list_routes(CLUSTER).await.unwrap();
    assert_eq!(f.server.counters().get(GET), gets + 1);
    assert_eq!(listed.len(), 201);
    let l7 = listed.iter().find(|l| l.destination_cidr == "10.244.7.0/24").unwrap();
    assert_eq!((l7.name.as_str(), l7.target_node.as_str()), ("node-7____102447024", "node-7"));

    // Deleting 50 routes concurrently: again one batch.
    let puts = f.server.counters().get(PUT);
    let tasks: Vec<_> = listed
        .iter()
        .filter(|l| {
            l.target_node.starts_with("node-") && l.target_node[5..].parse::<u32>().unwrap() < 50
        })
        .cloned()
        .map(|l| {
            let r = r.clone();
            tokio::spawn(async move { r.delete_route(CLUSTER, &l).await })
        })
        .collect();
    assert_eq!(tasks.len(), 50);
    for t in futures::future::join_all(tasks).await {
        t.unwrap().unwrap();
    }
    assert!(f.server.counters().get(PUT) - puts <= 2);
    let arm = routes_of(&f, &table);
    assert_eq!(arm.len(), 151);
    assert!(!arm.iter().any(|r| r["name"] == "node-7____102447024"));
    assert!(arm.iter().any(|r| r["name"] == "node-50____1024450024"));
}

#[tokio::test]
async fn a_missing_table_is_created_tagged_with_dual_stack_routes() {
    let f = fixture::start_with(fixture::WORLD, Default::default(), |c| {
        c.tags = Some("team=net".into());
        c.tags_map = Some([("env".to_string(), "prod".to_string())].into());
    })
    .await;
    let r = routes(&f);
    let (v4, v6) = (
        route("vm-6", "10.244.6.0/24", &["10.240.0.8", "fd00::8"]),
        route("vm-6", "fd00:10:244:6::/64", &["10.240.0.8", "fd00::8"]),
    );
    let (a, b) =
        tokio::join!(r.create_route(CLUSTER, "uid", &v4), r.create_route(CLUSTER, "uid", &v6));
    a.unwrap();
    b.unwrap();
    assert_eq!(f.server.counters().get(PUT), 1, "created with both routes in one PUT");
    let table = format!("{CLUSTER}-routetable");
    let t = f.cloud.resource(&table_id(&f, &table)).unwrap();
    assert_eq!(t["location"], fixture::LOCATION);
    assert_eq!(t["tags"], json!({"team": "net", "env": "prod"}));
    let arm = routes_of(&f, &table);
    let hop = |name: &str| {
        arm.iter().find(|r| r["name"] == name).map(|r| r["properties"]["nextHopIpAddress"].clone())
    };
    assert_eq!(hop("vm-6____102446024"), Some(json!("10.240.0.8")));
    assert_eq!(hop("vm-6____fd0010244664"), Some(json!("fd00::8")));

    // A node without an address of the family is an error naming it; nothing is written.
    let e = r
        .create_route(CLUSTER, "uid", &route("vm-1", "fd00:10:244:1::/64", &["10.240.0.5"]))
        .await
        .unwrap_err()
        .to_string();
    assert!(e.contains("vm-1") && e.contains("IPv6"), "{e}");
    assert_eq!(f.server.counters().get(PUT), 1);
}

#[tokio::test]
async fn an_arm_outage_is_an_error_for_every_caller_not_a_lost_route() {
    let f = fixture::start().await;
    let r = routes(&f);
    f.server
        .inject(FaultRule::new(PUT, Fault::Status { status: 500, body: None }).times(1))
        .unwrap();
    let (r0, r1) = (
        route("vm-0", "10.244.0.0/24", &["10.240.0.4"]),
        route("vm-1", "10.244.1.0/24", &["10.240.0.5"]),
    );
    let (a, b) =
        tokio::join!(r.create_route(CLUSTER, "uid", &r0), r.create_route(CLUSTER, "uid", &r1));
    let (a, b) = (a.unwrap_err().to_string(), b.unwrap_err().to_string());
    assert!(a.contains("500") && a.contains(PUT), "{a}");
    assert_eq!(a, b, "both waiters get the batch's failure");
    // The route controller retries: now it is written.
    r.create_route(CLUSTER, "uid", &route("vm-0", "10.244.0.0/24", &["10.240.0.4"])).await.unwrap();
    assert_eq!(routes_of(&f, &format!("{CLUSTER}-routetable")).len(), 1);

    // Reads failing: listing is an error, not an empty table.
    f.server.inject(FaultRule::new(GET, Fault::Status { status: 503, body: None })).unwrap();
    assert!(r.list_routes(CLUSTER).await.is_err());
}

#[tokio::test]
async fn a_stale_etag_is_read_again_and_the_change_applied() {
    let f = fixture::start().await;
    let r = routes(&f);
    r.create_route(CLUSTER, "uid", &route("vm-0", "10.244.0.0/24", &["10.240.0.4"])).await.unwrap();
    f.server
        .inject(FaultRule::new(PUT, Fault::Status { status: 412, body: None }).times(1))
        .unwrap();
    let puts = f.server.counters().get(PUT);
    r.create_route(CLUSTER, "uid", &route("vm-1", "10.244.1.0/24", &["10.240.0.5"])).await.unwrap();
    assert_eq!(f.server.counters().get(PUT) - puts, 2, "412, then read again and written");
    assert_eq!(routes_of(&f, &format!("{CLUSTER}-routetable")).len(), 2);
}

#[tokio::test]
async fn listings_read_the_table_once_per_ttl_and_deletions_are_confirmed_on_a_fresh_read() {
    let f = fixture::start().await;
    let table = format!("{CLUSTER}-routetable");
    let r = routes(&f);
    let (a, b) = (
        route("vm-0", "10.244.0.0/24", &["10.240.0.4"]),
        route("vm-1", "10.244.1.0/24", &["10.240.0.5"]),
    );
    r.create_route(CLUSTER, "uid", &a).await.unwrap();
    r.create_route(CLUSTER, "uid", &b).await.unwrap();

    // The route controller lists every 10 s: 30 listings (5 minutes' worth) read the table
    // once within the TTL, not 30 times.
    let gets = f.server.counters().get(GET);
    for _ in 0..30 {
        assert_eq!(r.list_routes(CLUSTER).await.unwrap().len(), 2);
    }
    assert_eq!(f.server.counters().get(GET) - gets, 1, "one read for 30 listings");

    // Our own write drops the cached table: the next listing shows the new route.
    r.create_route(CLUSTER, "uid", &route("vm-6", "10.244.6.0/24", &["10.240.0.8"])).await.unwrap();
    let listed = r.list_routes(CLUSTER).await.unwrap();
    assert_eq!(listed.len(), 3, "{listed:?}");

    // A change made outside the cluster: vm-1's route now points at another prefix under
    // the same name. The (cached) listing still shows the old one; a deletion decided on it
    // finds the route changed in the table read afresh and deletes nothing.
    let id = table_id(&f, &table);
    let mut t = f.cloud.resource(&id).unwrap();
    for rt in t["properties"]["routes"].as_array_mut().unwrap() {
        if rt["name"] == "vm-1____102441024" {
            rt["properties"]["addressPrefix"] = json!("10.244.99.0/24");
        }
    }
    f.cloud.put_resource(&id, t).unwrap();
    let stale = r.list_routes(CLUSTER).await.unwrap();
    let old = stale.iter().find(|l| l.target_node == "vm-1").cloned().unwrap();
    assert_eq!(old.destination_cidr, "10.244.1.0/24", "the listing is the cached one");
    r.delete_route(CLUSTER, &old).await.unwrap();
    let arm = routes_of(&f, &table);
    let kept = arm.iter().find(|x| x["name"] == "vm-1____102441024").unwrap();
    assert_eq!(kept["properties"]["addressPrefix"], "10.244.99.0/24", "not deleted: {arm:?}");
    // A deletion of a route the fresh table still holds as listed is applied.
    let a_listed = stale.iter().find(|l| l.target_node == "vm-0").cloned().unwrap();
    r.delete_route(CLUSTER, &a_listed).await.unwrap();
    assert!(!routes_of(&f, &table).iter().any(|x| x["name"] == "vm-0____102440024"));

    // disableAPICallCache: every listing reads the table.
    let g = fixture::start_with(fixture::WORLD, Default::default(), |c| {
        c.disable_api_call_cache = true
    })
    .await;
    let r = routes(&g);
    r.create_route(CLUSTER, "uid", &a).await.unwrap();
    let gets = g.server.counters().get(GET);
    for _ in 0..5 {
        r.list_routes(CLUSTER).await.unwrap();
    }
    assert_eq!(g.server.counters().get(GET) - gets, 5);
}

#[tokio::test]
async fn a_missing_table_is_read_once_per_ttl_and_our_create_is_listed_at_once() {
    // No route table yet (a cluster before its first route): ARM's 404 is kept as upstream's
    // cache keeps it, so the route controller's listings every 10 s do not each ask ARM.
    let f = fixture::start().await;
    let r = routes(&f);
    let gets = f.server.counters().get(GET);
    for _ in 0..6 {
        assert!(r.list_routes(CLUSTER).await.unwrap().is_empty());
    }
    assert_eq!(f.server.counters().get(GET) - gets, 1, "one read for 6 listings");
    // The batch that creates it reads afresh, and the next listing shows the route.
    r.create_route(CLUSTER, "uid", &route("vm-0", "10.244.0.0/24", &["10.240.0.4"])).await.unwrap();
    let listed = r.list_routes(CLUSTER).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0].name, "vm-0____102440024");
}
