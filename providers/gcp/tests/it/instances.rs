//! InstancesV2, NodeCidrs and Zones against the emulator: upstream's metadata, one listing
//! per zone for a batch, and "gone" only from a 404 for the exact instance.

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::{InstanceStatus, InstancesV2, NodeCidrs, ProviderError, Zones};
use ccm_emulators::admin::PauseMode;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::gcp::GcpOptions;
use ccm_emulators::server::ServerOptions;
use ccm_emulators::world::PowerState;
use ccm_provider_gcp::client::GceClient;
use ccm_provider_gcp::config::{Global, StackType};
use ccm_provider_gcp::instances::{GceInstances, PAGE_SIZE};
use k8s_openapi::api::core::v1::NodeAddress;

use crate::fixture::{self, PROJECT, REGION, ZONE_A, ZONE_B, node, provider_id};

fn addrs(a: &[NodeAddress]) -> Vec<(&str, &str)> {
    a.iter().map(|a| (a.type_.as_str(), a.address.as_str())).collect()
}

#[tokio::test]
async fn nodes_get_upstreams_metadata_from_one_listing_per_zone() {
    let f = fixture::start().await;
    let inst = GceInstances::new(f.client.clone());
    let nodes = [
        // By name: the node name up to its first dot.
        node("node-a.c.emulated-project.internal", None),
        node("node-b", Some(&provider_id(ZONE_B, "node-b"))),
        node("node-c", None),
    ];
    let got = inst.instance_metadata_batch(&nodes).await;
    let a = got[0].as_ref().unwrap();
    assert_eq!(a.provider_id, provider_id(ZONE_A, "node-a"));
    assert_eq!(a.instance_type, "n2-standard-4");
    assert_eq!((a.zone.as_str(), a.region.as_str()), (ZONE_A, REGION));
    assert_eq!(addrs(&a.node_addresses), [("InternalIP", "10.0.0.10"), ("ExternalIP", "34.1.2.3")]);
    assert!(a.additional_labels.is_empty());
    let b = got[1].as_ref().unwrap();
    assert_eq!(b.provider_id, provider_id(ZONE_B, "node-b"));
    assert_eq!(b.instance_type, "e2-standard-2");
    assert_eq!((b.zone.as_str(), b.region.as_str()), (ZONE_B, REGION));
    assert_eq!(addrs(&b.node_addresses), [("InternalIP", "10.0.16.11")]);
    // A stopped instance still has metadata.
    assert_eq!(got[2].as_ref().unwrap().zone, ZONE_B);
    let c = f.server.counters();
    assert_eq!(c.get("compute.instances.list"), 2, "one listing per managed zone");
    assert_eq!(c.get("compute.instances.get"), 0);

    // One node: upstream's instances.get, same answer.
    let one = inst.instance_metadata(&nodes[1]).await.unwrap();
    assert_eq!(&one, b);
    assert_eq!(f.server.counters().get("compute.instances.get"), 1);
    // By name, zone a then zone b: two gets.
    let c0 = f.server.counters().get("compute.instances.get");
    assert_eq!(inst.instance_metadata(&nodes[2]).await.unwrap().zone, ZONE_B);
    assert_eq!(f.server.counters().get("compute.instances.get") - c0, 2);
}

#[tokio::test]
async fn a_thousand_instances_join_with_a_few_list_calls() {
    let f = fixture::start().await;
    // 600 in zone a, 400 in zone b: zone a takes two pages of 500.
    let mut nodes = Vec::new();
    let mut by_pid = Vec::new();
    for i in 0..1000u32 {
        let zone = if i < 600 { ZONE_A } else { ZONE_B };
        let name = format!("pool-{i:04}");
        let ip = format!("10.{}.{}.{}", if zone == ZONE_A { 1 } else { 2 }, i / 250, i % 250 + 1);
        let mut inst = fixture::instance(&name, zone, &ip);
        inst.tags.insert("gce.alias".into(), format!("10.96.{}.{}/28", i / 16, (i % 16) * 16));
        f.cloud.add_instance(&inst).unwrap();
        nodes.push(node(&name, None));
        by_pid.push(node(&name, Some(&provider_id(zone, &name))));
    }
    let inst = GceInstances::new(f.client.clone());
    let before = f.server.counters();
    let got = inst.instance_metadata_batch(&nodes).await;
    let after = f.server.counters();
    assert_eq!(got.len(), 1000);
    for (i, r) in got.iter().enumerate() {
        let m = r.as_ref().unwrap_or_else(|e| panic!("node {i}: {e}"));
        let zone = if i < 600 { ZONE_A } else { ZONE_B };
        assert_eq!(m.provider_id, provider_id(zone, &format!("pool-{i:04}")));
    }
    let lists = after.get("compute.instances.list") - before.get("compute.instances.list");
    let gets = after.get("compute.instances.get") - before.get("compute.instances.get");
    let bound = 1000u64.div_ceil(u64::from(PAGE_SIZE));
    println!(
        "1000 joining nodes (by name, one batch): {lists} instances.list calls, {gets} instances.get calls (bound {bound} + 10)"
    );
    assert_eq!(lists, 3, "zone a: 2 pages, zone b: 1");
    assert_eq!(gets, 0);
    assert!(lists <= bound + 10);

    // The lifecycle pass asks by providerID in batches of 500, as core does.
    let before = f.server.counters();
    let mut statuses = Vec::new();
    for chunk in by_pid.chunks(500) {
        statuses.extend(inst.instance_status_batch(chunk).await);
    }
    let after = f.server.counters();
    assert!(statuses.iter().all(|s| matches!(s, Ok(InstanceStatus::Running))));
    let lists = after.get("compute.instances.list") - before.get("compute.instances.list");
    let gets = after.get("compute.instances.get") - before.get("compute.instances.get");
    println!(
        "1000 nodes' status (by providerID, 2 batches of 500): {lists} instances.list calls, {gets} instances.get calls"
    );
    // Batch 1: zone a (500 of them, 2 pages); batch 2: zone a (100) and zone b (400).
    assert!(lists <= 5, "{lists}");
    assert_eq!(gets, 0);
}

#[tokio::test]
async fn only_a_404_for_the_exact_instance_says_gone() {
    let f = fixture::start().await;
    let inst = GceInstances::new(f.client.clone());
    f.cloud.add_instance(&fixture::instance("node-gone", ZONE_A, "10.0.0.99")).unwrap();
    assert!(f.cloud.delete_instance("node-gone"));
    let nodes = [
        node("node-a", Some(&provider_id(ZONE_A, "node-a"))),
        node("node-b", None),
        node("node-c", Some(&provider_id(ZONE_B, "node-c"))),
        node("node-gone", Some(&provider_id(ZONE_A, "node-gone"))),
        // By name and absent: never "gone".
        node("nameless-gone", None),
        // A zone that does not exist: Compute's 404 names the zone, not the instance.
        node("no-zone", Some(&provider_id("us-central1-z", "no-zone"))),
        // Another project's providerID: an error, not looked up.
        node("elsewhere", Some("gce://other-project/us-central1-a/node-a")),
        node("garbled", Some("aws:///us-east-1a/i-0123")),
    ];
    let got = inst.instance_status_batch(&nodes).await;
    assert!(matches!(got[0], Ok(InstanceStatus::Running)), "{:?}", got[0]);
    assert!(matches!(got[1], Ok(InstanceStatus::Running)), "{:?}", got[1]);
    assert!(matches!(got[2], Ok(InstanceStatus::Shutdown)), "stopped: {:?}", got[2]);
    assert!(matches!(got[3], Ok(InstanceStatus::NotFound)), "{:?}", got[3]);
    let e = got[4].as_ref().unwrap_err().to_string();
    assert!(e.contains("no instance named \"nameless-gone\""), "{e}");
    let e = got[5].as_ref().unwrap_err().to_string();
    assert!(e.contains("us-central1-z"), "{e}");
    let e = got[6].as_ref().unwrap_err();
    assert!(
        matches!(e, ProviderError::Invalid { .. }) && e.to_string().contains("other-project"),
        "{e}"
    );
    assert!(matches!(got[7], Err(ProviderError::Invalid { .. })), "{:?}", got[7]);
    // Absent from the listing of its zone, the gone instance was asked for by name: one get
    // (the missing zone's listing failed: no get).
    assert_eq!(f.server.counters().get("compute.instances.get"), 1);
    // Alone (upstream's per-node get), the missing zone is still an error.
    assert!(inst.instance_exists(&nodes[5]).await.is_err());

    // The single-node methods say the same.
    assert!(!inst.instance_exists(&nodes[3]).await.unwrap());
    assert!(inst.instance_exists(&nodes[2]).await.unwrap());
    assert!(inst.instance_shutdown(&nodes[2]).await.unwrap());
    assert!(inst.instance_exists(&nodes[4]).await.is_err());
    assert!(matches!(
        inst.instance_metadata(&nodes[3]).await,
        Err(ProviderError::InstanceNotFound)
    ));
    assert!(matches!(
        inst.instance_metadata(&nodes[4]).await,
        Err(ProviderError::InstanceNotFound)
    ));

    // Started again: running, no shutdown taint.
    assert!(f.cloud.set_power("node-c", PowerState::Running));
    assert!(!inst.instance_shutdown(&nodes[2]).await.unwrap());
}

#[tokio::test]
async fn an_outage_is_an_error_never_gone() {
    let f = fixture::start().await;
    let inst = GceInstances::new(f.client.clone());
    f.client.scope().await.unwrap();
    let nodes: Vec<_> = ["node-a", "node-b", "node-c"]
        .iter()
        .zip([ZONE_A, ZONE_B, ZONE_B])
        .map(|(n, z)| node(n, Some(&provider_id(z, n))))
        .collect();

    // Compute down: every node errs, nothing is gone.
    f.server.admin().pause(PauseMode::Fail).await.unwrap();
    let got = inst.instance_status_batch(&nodes).await;
    assert!(got.iter().all(Result::is_err), "{got:?}");
    assert!(inst.instance_exists(&nodes[0]).await.is_err());
    f.server.admin().resume().await.unwrap();

    // The listings fail: every node errs, without a get each.
    f.server
        .inject(
            FaultRule::new("compute.instances.list", Fault::Status { status: 503, body: None })
                .times(100),
        )
        .unwrap();
    let gets = f.server.counters().get("compute.instances.get");
    let got = inst.instance_status_batch(&nodes).await;
    assert!(got.iter().all(Result::is_err), "{got:?}");
    assert_eq!(
        f.server.counters().get("compute.instances.get"),
        gets,
        "no get per node in an outage"
    );
    f.server.admin().clear_faults().await.unwrap();

    // A 404 that is not Compute's (a proxy's page): an error, not "gone".
    f.server
        .inject(FaultRule::new(
            "compute.instances.get",
            Fault::Status { status: 404, body: Some("<html>Not Found</html>".into()) },
        ))
        .unwrap();
    let e = inst.instance_exists(&nodes[0]).await.unwrap_err();
    assert!(e.to_string().contains("404"), "{e}");
    f.server.admin().clear_faults().await.unwrap();

    // Throttling says "throttled", not "gone": a few throttles are waited out within the
    // call (the instance exists)...
    let gets = f.server.counters().get("compute.instances.get");
    f.server
        .inject(
            FaultRule::new("compute.instances.get", Fault::Throttle { retry_after_secs: 0 })
                .times(3),
        )
        .unwrap();
    assert!(inst.instance_exists(&nodes[0]).await.unwrap());
    assert_eq!(
        f.server.counters().get("compute.instances.get"),
        gets + 4,
        "3 throttled, 1 answered"
    );
    // ...and throttles outlasting the call's deadline (1 s here: far fewer attempts than the
    // rule's 1000 fit in it) end as `Throttled`.
    let short = ccm_provider_gcp::client::ClientOptions {
        deadline: ccm_core::cloud_call::Deadline::new(Duration::from_secs(1)),
        ..f.options.clone()
    };
    let hasty = GceInstances::new(Arc::new(GceClient::new(&fixture::global(), short).unwrap()));
    f.server
        .inject(
            FaultRule::new("compute.instances.get", Fault::Throttle { retry_after_secs: 0 })
                .times(1000),
        )
        .unwrap();
    let e = hasty.instance_exists(&nodes[0]).await.unwrap_err();
    assert!(matches!(e, ProviderError::Throttled(_)), "{e}");
    f.server.admin().clear_faults().await.unwrap();
}

async fn client_with(f: &fixture::Fixture, global: Global) -> Arc<GceClient> {
    match GceClient::new(&global, f.options.clone()) {
        Ok(c) => Arc::new(c),
        Err(e) => panic!("client: {e}"),
    }
}

/// Issue #32 GCP 8: every family the instance has, whatever `stack-type` says (the node-IPAM
/// controller picks by the service CIDRs): the alias range, and the `/112` of the NIC's
/// internal IPv6 (`ipv6Address`) or external IPv6 (its `DIRECT_IPV6` access config).
#[tokio::test]
async fn pod_cidrs_are_every_family_of_the_instance() {
    let world = format!(
        "{}\n  - {{ name: node-d, zone: us-central1-a, subnet: subnet-a, private_ips: [10.0.0.20, \"2600:1900:4000:7::\"], tags: {{ gce.alias: 10.64.7.0/24 }} }}\n  - {{ name: node-e, zone: us-central1-a, subnet: subnet-a, private_ips: [10.0.0.21], public_ips: [\"2600:1900:4001:9::\"], tags: {{ gce.alias: 10.64.9.0/24 }} }}\n  - {{ name: node-f, zone: us-central1-a, subnet: subnet-a, private_ips: [\"fd20:0:0:6::\"] }}\n",
        fixture::WORLD.trim_end()
    );
    let opts = GcpOptions { pending: Duration::from_millis(50), ..GcpOptions::default() };
    let f = fixture::start_with(&world, opts, ServerOptions::default()).await;
    let pid = |n: &str, z: &str| node(n, Some(&provider_id(z, n)));
    let s = |v: Vec<ipnet::IpNet>| v.iter().map(ToString::to_string).collect::<Vec<_>>();

    let v4 = GceInstances::new(f.client.clone());
    assert_eq!(s(v4.node_pod_cidrs(&pid("node-a", ZONE_A)).await.unwrap()), ["10.64.0.0/24"]);
    assert_eq!(s(v4.node_pod_cidrs(&pid("node-b", ZONE_B)).await.unwrap()), ["10.64.1.0/24"]);
    assert!(v4.node_pod_cidrs(&pid("node-c", ZONE_B)).await.unwrap().is_empty(), "no alias yet");
    assert_eq!(
        s(v4.node_pod_cidrs(&pid("node-d", ZONE_A)).await.unwrap()),
        ["10.64.7.0/24", "2600:1900:4000:7::/112"]
    );
    assert_eq!(
        s(v4.node_pod_cidrs(&pid("node-e", ZONE_A)).await.unwrap()),
        ["10.64.9.0/24", "2600:1900:4001:9::/112"],
        "external IPv6"
    );
    assert_eq!(
        s(v4.node_pod_cidrs(&pid("node-f", ZONE_A)).await.unwrap()),
        ["fd20:0:0:6::/112"],
        "IPv6-only instance"
    );
    assert!(matches!(
        v4.node_pod_cidrs(&pid("nope", ZONE_A)).await,
        Err(ProviderError::InstanceNotFound)
    ));
    for stack in [StackType::DualStack, StackType::Ipv6] {
        let other = GceInstances::new(
            client_with(&f, Global { stack_type: stack, ..fixture::global() }).await,
        );
        assert_eq!(
            s(other.node_pod_cidrs(&pid("node-d", ZONE_A)).await.unwrap()),
            ["10.64.7.0/24", "2600:1900:4000:7::/112"],
            "stack-type {stack:?} does not choose the pod CIDRs"
        );
    }
    let v6 = GceInstances::new(
        client_with(&f, Global { stack_type: StackType::Ipv6, ..fixture::global() }).await,
    );
    // IPv6 clusters list the IPv6 address first.
    let m = v6.instance_metadata(&pid("node-d", ZONE_A)).await.unwrap();
    assert_eq!(
        addrs(&m.node_addresses),
        [("InternalIP", "2600:1900:4000:7::"), ("InternalIP", "10.0.0.20")]
    );
    let m = v4.instance_metadata(&pid("node-d", ZONE_A)).await.unwrap();
    assert_eq!(
        addrs(&m.node_addresses),
        [("InternalIP", "10.0.0.20"), ("InternalIP", "2600:1900:4000:7::")]
    );
    let m = v4.instance_metadata(&pid("node-e", ZONE_A)).await.unwrap();
    assert_eq!(
        addrs(&m.node_addresses),
        [("InternalIP", "10.0.0.21"), ("InternalIP", "2600:1900:4001:9::")],
        "external IPv6 is an InternalIP, as upstream"
    );
}

#[tokio::test]
async fn zones_come_from_the_instance() {
    let f = fixture::start().await;
    let inst = GceInstances::new(f.client.clone());
    let z = inst.zone_by_provider_id(&provider_id(ZONE_B, "node-b")).await.unwrap();
    assert_eq!((z.failure_domain.as_str(), z.region.as_str()), (ZONE_B, REGION));
    let z = inst.zone_by_node_name("node-c.c.emulated-project.internal").await.unwrap();
    assert_eq!(z.failure_domain, ZONE_B);
    assert!(matches!(
        inst.zone_by_provider_id(&provider_id(ZONE_A, "nope")).await,
        Err(ProviderError::InstanceNotFound)
    ));
    assert!(matches!(inst.zone_by_node_name("nope").await, Err(ProviderError::InstanceNotFound)));
    assert!(matches!(
        inst.zone_by_provider_id("gce://p/z").await,
        Err(ProviderError::Invalid { .. })
    ));
    assert!(matches!(
        inst.zone_by_provider_id("gce://other-project/us-central1-a/node-a").await,
        Err(ProviderError::Invalid { .. })
    ));
    assert_eq!(
        inst.zone_by_provider_id(&format!("gce://{PROJECT}/{ZONE_A}/node-a"))
            .await
            .unwrap()
            .failure_domain,
        ZONE_A
    );
}

#[tokio::test]
async fn the_node_instance_prefix_filters_the_listing() {
    let f = fixture::start().await;
    // With every node inside the prefix the listing is filtered (upstream's `name eq
    // "node-.*"`); a node outside it drops the filter, so its instance is still found.
    f.cloud.add_instance(&fixture::instance("other-1", ZONE_A, "10.0.0.50")).unwrap();
    let global = Global { node_instance_prefix: Some("node-".into()), ..fixture::global() };
    let inst = GceInstances::new(client_with(&f, global).await);
    let nodes = [node("node-a", None), node("node-b", None), node("node-c", None)];
    assert!(inst.instance_metadata_batch(&nodes).await.iter().all(Result::is_ok));
    let mixed = [node("node-a", None), node("node-b", None), node("other-1", None)];
    let got = inst.instance_metadata_batch(&mixed).await;
    assert!(got.iter().all(Result::is_ok), "{got:?}");
    assert_eq!(got[2].as_ref().unwrap().zone, ZONE_A);
}
