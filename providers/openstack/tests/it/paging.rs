//! Nova's listing page limit (`[api] max_limit`, `osapi_max_limit`, 1000 by default): Nova
//! cuts `GET /servers/detail` at it whatever `limit` asks for and links a full page to the
//! next by `marker`. The emulator's knob set to 3 with 7 servers: every listing the provider
//! makes (the batch of the cloud-node controllers, the server list) follows the links to the
//! last server; an unknown marker is Nova's 400. Neutron pages only when asked (`limit`), as
//! Neutron's default `pagination_max_limit = -1` does: our provider sends no `limit` there.
//! Octavia pages at its `[api_settings] pagination_max_limit` (1000 by default, 3 here): the
//! provider follows `loadbalancers_links` to the last load balancer.

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::{InstancesV2, LoadBalancer};
use ccm_emulators::openstack::OpenStackOptions;
use ccm_emulators::server::ServerOptions;
use ccm_provider_openstack::client::{ClientError, Service};
use ccm_provider_openstack::instances::{
    OpenStackInstances, SERVER_PAGE, list_ports, list_servers,
};
use ccm_provider_openstack::load_balancer::{OctaviaLoadBalancer, Timings};
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};

use crate::fixture::{Fixture, WORLD, fast_options, instance, node, provider_id, start_with};
use crate::pending::{ensure_until_done, internal_service};

/// The fixture's world (3 servers) and 4 more: 7 servers, Nova pages of 3.
async fn seven_servers() -> Fixture {
    let opts = OpenStackOptions { nova_max_limit: 3, ..OpenStackOptions::default() };
    let f = start_with(WORLD, opts, fast_options(), ServerOptions::default()).await;
    for i in 0..4 {
        f.cloud
            .add_server(instance(&format!("extra-{i}"), "az-1", &format!("10.0.0.{}", 50 + i)))
            .unwrap();
    }
    f
}

#[tokio::test]
async fn every_server_listing_follows_novas_pages_to_the_last_server() {
    let f = seven_servers().await;
    let lists = || f.server.counters().get("nova.servers.list");

    // The provider asks for SERVER_PAGE (1000) per page; Nova gives 3: pages 3, 3, 1.
    assert_eq!(SERVER_PAGE, 1000);
    let all = list_servers(&f.client).await.unwrap();
    let mut names: Vec<_> = all.iter().map(|s| s.name.clone()).collect();
    names.sort();
    assert_eq!(
        names,
        ["extra-0", "extra-1", "extra-2", "extra-3", "node-a", "node-b", "node-c"],
        "every server, each once"
    );
    assert_eq!(lists(), 3, "pages of 3, 3 and 1");

    // The cloud-node controllers' batch: every Node found through the pages.
    let inst = OpenStackInstances::new(Arc::clone(&f.client), &f.config);
    let nodes: Vec<_> = ["node-a", "node-b", "node-c", "extra-0", "extra-1", "extra-2", "extra-3"]
        .iter()
        .map(|n| node(n, None))
        .collect();
    let before = lists();
    let md = inst.instance_metadata_batch(&nodes).await;
    assert!(md.iter().all(Result::is_ok), "{md:?}");
    assert_eq!(
        md[6].as_ref().unwrap().provider_id,
        format!("openstack:///{}", f.cloud.server_id("extra-3").unwrap())
    );
    assert_eq!(lists() - before, 3, "one paged listing for the batch");

    // Six servers: the second page is full, so Nova links to a third, empty one.
    assert!(f.cloud.delete_server("extra-3"));
    let before = lists();
    assert_eq!(list_servers(&f.client).await.unwrap().len(), 6);
    assert_eq!(lists() - before, 3, "pages of 3, 3 and 0");
}

/// What Nova answers on the wire: at most `max_limit` servers whatever `limit` says, a
/// `servers_links` `next` link with the last server as `marker`, and 400 `badRequest`
/// "marker [<id>] not found" for a marker it does not know.
#[tokio::test]
async fn nova_caps_the_page_links_the_next_and_refuses_an_unknown_marker() {
    let f = seven_servers().await;
    let op = "nova:ListServers";
    let path = ["servers", "detail"];
    let page =
        f.client.get(op, Service::Compute, &path, &[("limit", "1000".into())]).await.unwrap();
    let servers = page["servers"].as_array().unwrap();
    assert_eq!(servers.len(), 3);
    let next = page["servers_links"][0]["href"].as_str().unwrap();
    assert_eq!(page["servers_links"][0]["rel"], "next");
    let last = servers[2]["id"].as_str().unwrap();
    assert!(next.contains(&format!("marker={last}")) && next.contains("limit=1000"), "{next}");

    let err = f
        .client
        .get(op, Service::Compute, &path, &[("marker", "no-such-server".into())])
        .await
        .unwrap_err();
    assert!(
        matches!(&err, ClientError::Api { status: 400, code, message, .. }
            if code == "badRequest" && message == "marker [no-such-server] not found"),
        "{err:?}"
    );
}

/// Neutron pages only when the caller asks (`limit`); the provider's listings (which send
/// none) get every port in one call, and a `limit` is followed to the end.
#[tokio::test]
async fn neutron_pages_only_when_asked_and_the_pages_are_followed() {
    let f = seven_servers().await;
    let lists = || f.server.counters().get("neutron.ports.list");
    let all = list_ports(&f.client, &[]).await.unwrap();
    assert!(all.len() >= 7, "{}", all.len());
    assert_eq!(lists(), 1);
    let paged = list_ports(&f.client, &[("limit", "2".into())]).await.unwrap();
    assert_eq!(paged.len(), all.len());
    assert_eq!(lists() - 1, all.len().div_ceil(2) as u64);
}

/// Octavia's `pagination_max_limit` at 3 and 7 load balancers: the operator inventory lists
/// all 7 in three calls (pages of 3, 3 and 1, following each `next` link), and a Service
/// whose load balancer is on the last page is found by its name.
#[tokio::test]
async fn octavia_listings_follow_the_pages_to_the_last_load_balancer() {
    let opts = OpenStackOptions {
        octavia_max_limit: 3,
        lb_pending: Duration::ZERO,
        ..OpenStackOptions::default()
    };
    let f = start_with(WORLD, opts, fast_options(), ServerOptions::default()).await;
    let lb = OctaviaLoadBalancer::new(
        Arc::clone(&f.client),
        Arc::new(f.config.clone()),
        Timings { poll: Duration::from_millis(20), max_wait: Duration::ZERO },
    );
    let mut n = node("node-a", Some(&provider_id(&f, "node-a")));
    n.status = Some(NodeStatus {
        addresses: Some(vec![NodeAddress {
            type_: "InternalIP".into(),
            address: "10.0.0.11".into(),
        }]),
        ..Default::default()
    });
    let nodes: Vec<Node> = vec![n];
    let services: Vec<_> = (0..7)
        .map(|i| {
            internal_service(&format!("paged-{i}"), &format!("00000000-0000-0000-0001-{i:012}"))
        })
        .collect();
    for svc in &services {
        ensure_until_done(&lb, svc, &nodes).await;
    }
    let lists = || f.server.counters().get("octavia.loadbalancers.list");
    let before = lists();
    let all = lb.list_cloud_load_balancers("kubernetes").await.unwrap();
    assert_eq!(all.len(), 7, "{all:?}");
    assert_eq!(lists() - before, 3, "pages of 3, 3 and 1");
    let last = lb.get_load_balancer("kubernetes", &services[6]).await.unwrap();
    assert!(last.is_some(), "the last page's load balancer is found by name");
}
