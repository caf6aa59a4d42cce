//! InstancesV2 against the emulator: metadata as upstream (providerID, addresses incl.
//! floating and multi-NIC, zone, flavor, region), batches of one listing, existence with the
//! deletion-safety rule.

use std::sync::Arc;

use ccm_core::cloud::{InstanceMetadata, InstanceStatus, InstancesV2, ProviderError};
use ccm_emulators::admin::PauseMode;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::world::PowerState;
use ccm_provider_openstack::config::{Config, Networking};
use ccm_provider_openstack::instances::{OpenStackInstances, SERVER_PAGE};

use crate::fixture::{Fixture, REGION, instance, node, provider_id, start};

fn instances(f: &Fixture, config: &Config) -> OpenStackInstances {
    OpenStackInstances::new(Arc::clone(&f.client), config)
}

fn addrs(md: &InstanceMetadata) -> Vec<(String, String)> {
    md.node_addresses.iter().map(|a| (a.type_.clone(), a.address.clone())).collect()
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_string(), b.to_string())
}

fn status(out: Vec<Result<InstanceStatus, ProviderError>>) -> Vec<String> {
    out.into_iter()
        .map(|r| match r {
            Ok(s) => format!("{s:?}"),
            Err(_) => "error".into(),
        })
        .collect()
}

#[tokio::test]
async fn metadata_is_upstreams_with_floating_and_multi_nic_addresses_in_one_listing() {
    let f = start().await;
    // node-a gets a second NIC on the storage network.
    f.cloud.add_interface("node-a", "storage-subnet", "10.1.0.21").unwrap();
    let inst = instances(&f, &f.config);
    let nodes = [node("node-a", None), node("node-b", None), node("node-c", None)];
    let out = inst.instance_metadata_batch(&nodes).await;
    let a = out[0].as_ref().unwrap();
    assert_eq!(a.provider_id, provider_id(&f, "node-a"));
    assert_eq!(a.instance_type, "m1.medium");
    assert_eq!((a.zone.as_str(), a.region.as_str()), ("az-1", REGION));
    assert_eq!(
        addrs(a),
        vec![
            pair("InternalIP", "10.0.0.11"),
            pair("InternalIP", "10.1.0.21"),
            pair("ExternalIP", "172.24.4.11"),
        ]
    );
    // No labels of our own: no upstream release sets `topology.openstack.org/host-id`.
    assert!(a.additional_labels.is_empty(), "{:?}", a.additional_labels);
    let b = out[1].as_ref().unwrap();
    assert_eq!((b.instance_type.as_str(), b.zone.as_str()), ("m1.large", "az-2"));
    assert_eq!(addrs(b), vec![pair("InternalIP", "10.0.1.12")]);
    // No type in the world: the emulator's default flavor.
    assert_eq!(out[2].as_ref().unwrap().instance_type, "m1.small");
    let c = f.server.counters();
    println!(
        "3 nodes: {} server list, {} port list, {} server get, {} flavor get",
        c.get("nova.servers.list"),
        c.get("neutron.ports.list"),
        c.get("nova.servers.get"),
        c.get("nova.flavors.get")
    );
    assert_eq!(c.get("nova.servers.list"), 1);
    assert_eq!(c.get("neutron.ports.list"), 1);
    assert_eq!(c.get("nova.servers.get") + c.get("nova.flavors.get"), 0);

    // internal-network-name keeps only `private`; storage becomes public instead.
    let mut config = f.config.clone();
    config.networking =
        Networking { internal_network_names: vec!["private".into()], ..Networking::default() };
    let md = instances(&f, &config).instance_metadata(&node("node-a", None)).await.unwrap();
    assert_eq!(
        addrs(&md),
        vec![pair("InternalIP", "10.0.0.11"), pair("ExternalIP", "172.24.4.11")]
    );
    config.networking = Networking {
        public_network_names: vec!["storage".into()],
        address_sort_order: vec!["172.24.4.0/24".parse().unwrap()],
        ..Networking::default()
    };
    let md = instances(&f, &config).instance_metadata(&node("node-a", None)).await.unwrap();
    assert_eq!(
        addrs(&md),
        vec![
            pair("ExternalIP", "172.24.4.11"),
            pair("InternalIP", "10.0.0.11"),
            pair("ExternalIP", "10.1.0.21"),
        ]
    );
    // A single node uses upstream's calls: the list by exact name and its ports.
    let c = f.server.counters();
    assert_eq!(c.get("nova.servers.list"), 3);
    assert_eq!(c.get("neutron.ports.list"), 3);
}

#[tokio::test]
async fn the_regional_provider_id_and_lookups_by_provider_id() {
    let f = start().await;
    let mut config = f.config.clone();
    config.regional_provider_id = true;
    let inst = instances(&f, &config);
    let id = f.cloud.server_id("node-b").unwrap();
    let md = inst.instance_metadata(&node("node-b", None)).await.unwrap();
    assert_eq!(md.provider_id, format!("openstack://{REGION}/{id}"));
    // Looked up by the providerID (either form; a node renamed in Kubernetes still works).
    for pid in [format!("openstack://{REGION}/{id}"), format!("openstack:///{id}"), id.clone()] {
        let md = inst.instance_metadata(&node("renamed", Some(&pid))).await.unwrap();
        assert_eq!(md.node_addresses[0].address, "10.0.1.12", "{pid}");
    }
    assert_eq!(f.server.counters().get("nova.servers.get"), 3);
    // Another region, another cloud: errors, never "gone".
    for pid in [format!("openstack://RegionTwo/{id}"), "aws:///us-east-1a/i-0abc".to_string()] {
        let n = node("x", Some(&pid));
        assert!(inst.instance_metadata(&n).await.is_err(), "{pid}");
        let e = inst.instance_exists(&n).await.unwrap_err();
        assert!(e.to_string().contains(&pid), "{e}");
    }
}

#[tokio::test]
async fn shutoff_is_shutdown_and_only_the_answer_for_the_exact_id_says_gone() {
    let f = start().await;
    let inst = instances(&f, &f.config);
    let (pa, pb, pc) =
        (provider_id(&f, "node-a"), provider_id(&f, "node-b"), provider_id(&f, "node-c"));
    let nodes = vec![
        node("node-a", Some(&pa)),
        node("node-b", Some(&pb)),
        node("node-c", Some(&pc)),
        node("node-a", None),
    ];
    assert_eq!(
        status(inst.instance_status_batch(&nodes).await),
        ["Running", "Running", "Shutdown", "Running"]
    );
    assert_eq!(f.server.counters().get("nova.servers.list"), 1, "one listing per pass");
    assert!(inst.instance_shutdown(&nodes[2]).await.unwrap());
    assert!(!inst.instance_shutdown(&nodes[0]).await.unwrap());

    // node-b's server is deleted: Nova answers 404 for its ID. node-c is DELETED.
    assert!(f.cloud.delete_server("node-b"));
    assert!(f.cloud.set_power("node-c", PowerState::Terminated));
    let gets = f.server.counters().get("nova.servers.get");
    assert_eq!(
        status(inst.instance_status_batch(&nodes).await),
        ["Running", "NotFound", "NotFound", "Running"]
    );
    assert_eq!(f.server.counters().get("nova.servers.get") - gets, 2, "absences confirmed by ID");
    assert!(!inst.instance_exists(&nodes[1]).await.unwrap());
    // Without providerID a missing server is an error (kept), for metadata "not yet".
    let by_name = node("node-b", None);
    assert!(inst.instance_exists(&by_name).await.is_err());
    assert!(matches!(inst.instance_metadata(&by_name).await, Err(ProviderError::InstanceNotFound)));
    assert!(matches!(
        inst.instance_metadata(&nodes[1]).await,
        Err(ProviderError::InstanceNotFound)
    ));
    // In a batch too.
    let batch = vec![by_name.clone(), node("node-c", None), nodes[0].clone()];
    assert_eq!(status(inst.instance_status_batch(&batch).await), ["error", "error", "Running"]);
}

#[tokio::test]
async fn an_outage_deletes_nothing() {
    let f = start().await;
    let inst = instances(&f, &f.config);
    let pb = provider_id(&f, "node-b");
    let nodes: Vec<_> =
        ["node-a", "node-b", "node-c"].iter().map(|n| node(n, Some(&provider_id(&f, n)))).collect();
    f.server.admin().pause(PauseMode::Fail).await.unwrap();
    let out = inst.instance_status_batch(&nodes).await;
    assert!(out.iter().all(|r| r.is_err()), "{out:?}");
    assert!(inst.instance_exists(&nodes[0]).await.is_err());
    assert!(inst.instance_metadata_batch(&nodes).await.iter().all(|r| r.is_err()));
    f.server.admin().resume().await.unwrap();
    // The server is gone but Nova fails the confirming GET: an error, not "gone".
    assert!(f.cloud.delete_server("node-b"));
    f.server
        .inject(FaultRule::new("nova.servers.get", Fault::Status { status: 500, body: None }))
        .unwrap();
    let out = inst.instance_status_batch(&nodes).await;
    assert_eq!(status(out), ["Running", "error", "Shutdown"]);
    assert!(inst.instance_exists(&node("node-b", Some(&pb))).await.is_err());
    f.server.admin().clear_faults().await.unwrap();
    // A 404 that is not Nova's "no such server" (a proxy's page): an error too.
    let html = Fault::Status { status: 404, body: Some("<html>Not Found</html>".into()) };
    f.server.inject(FaultRule::new("nova.servers.get", html).times(1)).unwrap();
    assert!(inst.instance_exists(&node("node-b", Some(&pb))).await.is_err());
    assert!(!inst.instance_exists(&node("node-b", Some(&pb))).await.unwrap());
}

#[tokio::test]
async fn thirty_nodes_cost_one_server_listing_and_one_port_listing() {
    let f = start().await;
    for i in 0..27 {
        f.cloud
            .add_server(instance(&format!("w-{i:02}"), "az-1", &format!("10.0.0.{}", 100 + i)))
            .unwrap();
    }
    let inst = instances(&f, &f.config);
    let mut nodes: Vec<_> = (0..27).map(|i| node(&format!("w-{i:02}"), None)).collect();
    nodes.extend(["node-a", "node-b", "node-c"].iter().map(|n| node(n, None)));
    let out = inst.instance_metadata_batch(&nodes).await;
    assert!(out.iter().all(|r| r.is_ok()), "{out:?}");
    let c = f.server.counters();
    println!(
        "30 nodes, metadata: {} server list, {} port list, {} other nova/neutron calls",
        c.get("nova.servers.list"),
        c.get("neutron.ports.list"),
        c.matching("nova.*") + c.matching("neutron.*")
            - c.get("nova.servers.list")
            - c.get("neutron.ports.list")
            - c.get("nova.versions")
            - c.get("neutron.versions"),
    );
    assert_eq!(c.get("nova.servers.list"), 1);
    assert_eq!(c.get("neutron.ports.list"), 1);
    assert_eq!(c.get("nova.servers.get"), 0);
    let with_ids: Vec<_> = out
        .iter()
        .zip(&nodes)
        .map(|(md, n)| {
            node(n.metadata.name.as_deref().unwrap(), Some(&md.as_ref().unwrap().provider_id))
        })
        .collect();
    let st = inst.instance_status_batch(&with_ids).await;
    assert!(st.iter().all(|r| r.is_ok()), "{st:?}");
    let c = f.server.counters();
    println!("30 nodes, status: {} server list in all", c.get("nova.servers.list"));
    assert_eq!(c.get("nova.servers.list"), 2);
    assert_eq!(c.get("nova.servers.get"), 0);
}

#[tokio::test]
async fn thousand_servers_join_with_few_list_calls() {
    let f = start().await;
    for i in 0..1000u32 {
        let ip = format!("10.0.{}.{}", 2 + i / 250, 2 + i % 250);
        f.cloud.add_server(instance(&format!("k-{i:04}"), "az-1", &ip)).unwrap();
    }
    let inst = instances(&f, &f.config);
    let nodes: Vec<_> = (0..1000).map(|i| node(&format!("k-{i:04}"), None)).collect();
    let started = std::time::Instant::now();
    let out = inst.instance_metadata_batch(&nodes).await;
    let took = started.elapsed();
    assert!(out.iter().all(|r| r.is_ok()), "{:?}", out.iter().find(|r| r.is_err()));
    let c = f.server.counters();
    let servers: u64 = 1003;
    let bound = servers.div_ceil(SERVER_PAGE as u64) + 10;
    println!(
        "1000 nodes ({servers} servers), one metadata batch: {} server list calls (bound {bound}, \
         page {SERVER_PAGE}), {} port list calls, {} server gets, {} flavor gets, {} token, {took:?}",
        c.get("nova.servers.list"),
        c.get("neutron.ports.list"),
        c.get("nova.servers.get"),
        c.get("nova.flavors.get"),
        c.get("keystone.tokens.create"),
    );
    assert!(c.get("nova.servers.list") <= bound);
    assert_eq!(c.get("nova.servers.list"), 2);
    assert_eq!(c.get("neutron.ports.list"), 1);
    assert_eq!(out[999].as_ref().unwrap().node_addresses[0].address, "10.0.5.251");
    // The lifecycle pass over the same 1000 nodes (by providerID): one more listing.
    let with_ids: Vec<_> = out
        .iter()
        .zip(&nodes)
        .map(|(md, n)| {
            node(n.metadata.name.as_deref().unwrap(), Some(&md.as_ref().unwrap().provider_id))
        })
        .collect();
    let st = inst.instance_status_batch(&with_ids).await;
    assert!(st.iter().all(|r| matches!(r, Ok(InstanceStatus::Running))));
    let c = f.server.counters();
    println!(
        "1000 nodes, one status batch: {} server list calls in all",
        c.get("nova.servers.list")
    );
    assert_eq!(c.get("nova.servers.list"), 4);
    assert_eq!(c.get("nova.servers.get"), 0);
}

#[tokio::test]
async fn a_nova_without_microversion_2_47_gives_the_flavor_name_by_id_once_per_flavor() {
    let f = start().await;
    // Nova refuses the microversion (406): asked again without, and never with again.
    f.server
        .inject(
            FaultRule::new("nova.servers.list", Fault::Status { status: 406, body: None }).times(1),
        )
        .unwrap();
    let inst = instances(&f, &f.config);
    let nodes = [node("node-a", None), node("node-b", None), node("node-c", None)];
    let out = inst.instance_metadata_batch(&nodes).await;
    let types: Vec<_> = out.iter().map(|r| r.as_ref().unwrap().instance_type.clone()).collect();
    assert_eq!(types, ["m1.medium", "m1.large", "m1.small"]);
    assert_eq!(f.server.counters().get("nova.servers.list"), 2);
    assert_eq!(f.server.counters().get("nova.flavors.get"), 3);
    // Moments later the same Nodes are answered from the batch's listing (reused for its
    // TTL); a Node the listing lacks gets one fresh listing, without the refused microversion.
    let again = inst.instance_metadata_batch(&nodes).await;
    assert!(again.iter().all(|r| r.is_ok()), "{again:?}");
    assert_eq!(f.server.counters().get("nova.servers.list"), 2, "the listing is reused");
    let newer = [node("node-a", None), node("node-b", None), node("node-new", None)];
    let out = inst.instance_metadata_batch(&newer).await;
    assert!(matches!(out[2], Err(ProviderError::InstanceNotFound)), "{:?}", out[2]);
    assert_eq!(f.server.counters().get("nova.servers.list"), 3, "no second 406");
    assert_eq!(f.server.counters().get("nova.flavors.get"), 3, "flavor names are cached");
}

/// HIGH 3 (issue #29): only Nova's typed `itemNotFound` JSON body says a server is gone. A
/// proxy's HTML 404 page echoing the URL (and so the server ID), a JSON 404 of another shape
/// and another service's typed 404 are errors: the lifecycle controller keeps the Node.
#[tokio::test]
async fn a_404_that_is_not_novas_typed_answer_never_says_gone() {
    let f = start().await;
    let inst = instances(&f, &f.config);
    let pb = provider_id(&f, "node-b");
    let id = f.cloud.server_id("node-b").unwrap();
    let node_b = node("node-b", Some(&pb));
    let pages = [
        Fault::Page {
            status: 404,
            content_type: Some("text/html; charset=iso-8859-1".into()),
            body: format!(
                "<!DOCTYPE HTML PUBLIC \"-//IETF//DTD HTML 2.0//EN\">\n<html><head>\n<title>404 Not Found</title>\n</head><body>\n<h1>Not Found</h1>\n<p>The requested URL /compute/v2.1/servers/{id} was not found on this server.</p>\n<hr>\n<address>Apache/2.4.41 (Ubuntu) Server at nova.example.com Port 8774</address>\n</body></html>\n"
            ),
        },
        Fault::Page {
            status: 404,
            content_type: Some("application/json".into()),
            body: format!(
                r#"{{"message": "no route for /compute/v2.1/servers/{id}", "code": 404}}"#
            ),
        },
        Fault::Page {
            status: 404,
            content_type: Some("application/json".into()),
            body: format!(r#"{{"itemNotFound": "Instance {id} could not be found."}}"#),
        },
        Fault::Page {
            status: 404,
            content_type: Some("application/json".into()),
            body: format!(
                r#"{{"NeutronError": {{"type": "PortNotFound", "message": "Port {id} could not be found.", "detail": ""}}}}"#
            ),
        },
        Fault::Page {
            status: 404,
            content_type: Some("text/plain".into()),
            body: format!("404 page not found: servers/{id}"),
        },
    ];
    for page in &pages {
        f.server.admin().clear_faults().await.unwrap();
        f.server.inject(FaultRule::new("nova.servers.get", page.clone())).unwrap();
        let exists = inst.instance_exists(&node_b).await;
        assert!(exists.is_err(), "{page:?} said the server is gone: {exists:?}");
    }
    // Missing from the listing, its confirming GET answered by such a page: an error too.
    assert!(f.cloud.delete_server("node-b"));
    let batch_of_b = [
        node("node-a", Some(&provider_id(&f, "node-a"))),
        node("node-c", Some(&provider_id(&f, "node-c"))),
        node_b.clone(),
    ];
    for page in &pages {
        f.server.admin().clear_faults().await.unwrap();
        f.server.inject(FaultRule::new("nova.servers.get", page.clone())).unwrap();
        let out = status(inst.instance_status_batch(&batch_of_b).await);
        assert_eq!(out, ["Running", "Shutdown", "error"], "{page:?}");
    }
    // Nova's own answer says gone.
    f.server.admin().clear_faults().await.unwrap();
    assert_eq!(
        status(inst.instance_status_batch(&batch_of_b).await),
        ["Running", "Shutdown", "NotFound"]
    );
    assert!(!inst.instance_exists(&node_b).await.unwrap());
}
