//! The node-IPAM controller (RangeAllocator) against a real kube-apiserver. Each test scopes
//! the controller to Nodes carrying its own group label.

use std::collections::{BTreeMap, HashSet};
use std::time::{Duration, Instant};

use ccm_core::controllers::ControllerConfig;
use ccm_core::controllers::node_ipam::{self, IpamOptions};
use ccm_core::testing::{TestCloud, TestNodeCidrs};
use ccm_testbed::ControlPlane;
use futures::StreamExt;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::service::{GROUP_LABEL, event_reasons};
use crate::support::{Running, run, wait_for};

fn start(client: &Client, group: &str, config: ControllerConfig) -> Running {
    let opts = IpamOptions { node_selector: Some(format!("{GROUP_LABEL}={group}")) };
    let config = ControllerConfig { allocate_node_cidrs: true, ..config };
    run(client, TestCloud::default(), config, move |ctx| node_ipam::start_with(ctx, opts))
}

async fn create_nodes(client: &Client, group: &str, names: &[String]) {
    let api = Api::<Node>::all(client.clone());
    futures::stream::iter(names)
        .for_each_concurrent(20, |name| {
            let api = api.clone();
            let node = Node {
                metadata: ObjectMeta {
                    name: Some(name.clone()),
                    labels: Some(BTreeMap::from([(GROUP_LABEL.to_string(), group.to_string())])),
                    ..Default::default()
                },
                ..Default::default()
            };
            async move {
                api.create(&PostParams::default(), &node).await.unwrap();
            }
        })
        .await;
}

/// Nodes of the group, by name → pod CIDRs.
async fn pod_cidrs(client: &Client, group: &str) -> BTreeMap<String, Vec<String>> {
    let lp = ListParams::default().labels(&format!("{GROUP_LABEL}={group}"));
    Api::<Node>::all(client.clone())
        .list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|n| {
            let spec = n.spec.unwrap_or_default();
            if let Some(first) = spec.pod_cidrs.as_ref().and_then(|c| c.first()) {
                assert_eq!(spec.pod_cidr.as_ref(), Some(first), "podCIDR is podCIDRs[0]");
            }
            (n.metadata.name.unwrap(), spec.pod_cidrs.unwrap_or_default())
        })
        .collect()
}

async fn delete_group(client: &Client, group: &str) {
    let lp = ListParams::default().labels(&format!("{GROUP_LABEL}={group}"));
    let _ = Api::<Node>::all(client.clone()).delete_collection(&DeleteParams::default(), &lp).await;
}

fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|_| ccm_testbed::unique_name(prefix)).collect()
}

#[tokio::test]
async fn hundreds_of_nodes_get_distinct_dual_stack_cidrs_and_a_restart_reuses_them() {
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let group = ccm_testbed::unique_name("g");
    let v4: IpNet = "10.128.0.0/15".parse().unwrap();
    let v6: IpNet = "fd00:128::/48".parse().unwrap();
    let svc: IpNet = "10.128.0.0/20".parse().unwrap();
    let config = ControllerConfig {
        cluster_cidrs: vec![v4, v6],
        service_cidrs: vec![svc],
        ..Default::default()
    };

    // Half the nodes exist before the controller starts, half arrive while it runs.
    let first = names("ipam-node", 150);
    let second = names("ipam-node", 150);
    create_nodes(&client, &group, &first).await;
    let start_time = Instant::now();
    let c = start(&client, &group, config.clone());
    create_nodes(&client, &group, &second).await;
    let assigned = wait_for("300 nodes with pod CIDRs", Duration::from_secs(120), || async {
        let all = pod_cidrs(&client, &group).await;
        (all.len() == 300 && all.values().all(|c| c.len() == 2)).then_some(all)
    })
    .await;
    eprintln!("300 nodes got dual-stack pod CIDRs in {:?}", start_time.elapsed());
    let check = |all: &BTreeMap<String, Vec<String>>| {
        let mut seen = HashSet::new();
        for cidrs in all.values() {
            let a: IpNet = cidrs[0].parse().unwrap();
            let b: IpNet = cidrs[1].parse().unwrap();
            assert!(v4.contains(&a) && a.prefix_len() == 24, "{a}");
            assert!(v6.contains(&b) && b.prefix_len() == 64, "{b}");
            assert!(!svc.contains(&a.network()), "{a} lies in the reserved service CIDR");
            assert!(seen.insert(a) && seen.insert(b), "duplicate CIDR {a} or {b}");
        }
    };
    check(&assigned);
    let allocations = c.metric("node_ipam_controller_cidrset_cidrs_allocations_total");
    assert!(allocations >= 600.0, "{allocations}");
    assert!(c.metric("node_ipam_controller_cidrset_usage_cidrs") > 0.0);
    drop(c);

    // A new controller rebuilds its map from the Nodes: new nodes never get a taken CIDR.
    let third = names("ipam-node", 5);
    create_nodes(&client, &group, &third).await;
    let _c = start(&client, &group, config);
    let all = wait_for("5 more nodes with pod CIDRs", Duration::from_secs(60), || async {
        let all = pod_cidrs(&client, &group).await;
        (all.len() == 305 && all.values().all(|c| c.len() == 2)).then_some(all)
    })
    .await;
    check(&all);
    for (name, cidrs) in &assigned {
        assert_eq!(&all[name], cidrs, "existing assignments unchanged");
    }
    delete_group(&client, &group).await;
}

#[tokio::test]
async fn exhaustion_emits_cidr_not_available_and_released_cidrs_are_reused() {
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let group = ccm_testbed::unique_name("g");
    let config = ControllerConfig {
        cluster_cidrs: vec!["10.250.0.0/23".parse().unwrap()],
        ..Default::default()
    };
    let _c = start(&client, &group, config);
    let nodes = names("ipam-small", 3);
    // One at a time, so the third is the one left without a CIDR.
    for n in &nodes[..2] {
        create_nodes(&client, &group, std::slice::from_ref(n)).await;
        wait_for("pod CIDR", Duration::from_secs(60), || async {
            (!pod_cidrs(&client, &group).await.get(n)?.is_empty()).then_some(())
        })
        .await;
    }
    create_nodes(&client, &group, &nodes[2..]).await;
    wait_for("CIDRNotAvailable on the third node", Duration::from_secs(60), || async {
        event_reasons(&client, "default", &nodes[2])
            .await
            .contains(&"CIDRNotAvailable".into())
            .then_some(())
    })
    .await;
    let all = pod_cidrs(&client, &group).await;
    assert!(all[&nodes[2]].is_empty());
    let freed = all[&nodes[0]].clone();
    assert_eq!(freed.len(), 1);

    // Deleting a node frees its CIDR; the next update of the waiting node takes it.
    Api::<Node>::all(client.clone()).delete(&nodes[0], &DeleteParams::default()).await.unwrap();
    wait_for("node deleted", Duration::from_secs(60), || async {
        (!pod_cidrs(&client, &group).await.contains_key(&nodes[0])).then_some(())
    })
    .await;
    let api = Api::<Node>::all(client.clone());
    let cidrs = wait_for("the freed CIDR reused", Duration::from_secs(60), || async {
        let patch = json!({"metadata": {"annotations": {"poke": ccm_testbed::unique_name("x")}}});
        api.patch(&nodes[2], &PatchParams::default(), &Patch::Merge(patch)).await.ok()?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let c = pod_cidrs(&client, &group).await.get(&nodes[2])?.clone();
        (!c.is_empty()).then_some(c)
    })
    .await;
    assert_eq!(cidrs, freed);
    delete_group(&client, &group).await;
}

#[tokio::test]
async fn cloud_allocator_copies_the_clouds_cidrs_and_marks_the_network_ready() {
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let group = ccm_testbed::unique_name("g");
    let config = ControllerConfig {
        allocate_node_cidrs: true,
        cidr_allocator_type: "CloudAllocator".into(),
        ..Default::default()
    };
    let opts = || IpamOptions { node_selector: Some(format!("{GROUP_LABEL}={group}")) };

    // Without the capability, CloudAllocator is a start error naming the flag.
    let ctx = ccm_core::controllers::ControllerContext {
        client: client.clone(),
        cloud: std::sync::Arc::new(TestCloud::default()),
        config: std::sync::Arc::new(config.clone()),
        metrics: Default::default(),
        shutdown: Default::default(),
        nodes: None,
    };
    let err = node_ipam::start_with(&ctx, opts())
        .err()
        .expect("CloudAllocator without cloud support is fatal");
    assert!(err.to_string().contains("--cidr-allocator-type"), "{err}");

    let cidrs = std::sync::Arc::new(TestNodeCidrs::new());
    let name = ccm_testbed::unique_name("ipam-cloud");
    cidrs.set(&name, vec!["fd00:77:0:5::/64".parse().unwrap(), "10.77.5.0/24".parse().unwrap()]);
    let cloud = TestCloud { node_cidrs: Some(cidrs.clone()), ..Default::default() };
    let o = opts();
    let config = ControllerConfig {
        service_cidrs: vec!["10.96.0.0/12".parse().unwrap(), "fd00:96::/112".parse().unwrap()],
        ..config
    };
    let c = run(&client, cloud, config, move |ctx| node_ipam::start_with(ctx, o));
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(GROUP_LABEL.to_string(), group.clone())])),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some(format!("test://{name}")),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap();
    let got = wait_for("pod CIDRs from the cloud", Duration::from_secs(60), || async {
        let c = pod_cidrs(&client, &group).await.get(&name)?.clone();
        (!c.is_empty()).then_some(c)
    })
    .await;
    assert_eq!(got, ["10.77.5.0/24", "fd00:77:0:5::/64"], "IPv4-primary dual-stack");
    // The pod CIDR is written before the condition (see the next test), so wait for it.
    let cond = wait_for("NetworkUnavailable set", Duration::from_secs(60), || async {
        let n = Api::<Node>::all(client.clone()).get(&name).await.ok()?;
        n.status
            .and_then(|s| s.conditions)
            .and_then(|c| c.into_iter().find(|c| c.type_ == "NetworkUnavailable"))
    })
    .await;
    assert_eq!((cond.status.as_str(), cond.reason.as_deref()), ("False", Some("RouteCreated")));
    // Issue #13 point 7: the allocator's queue is upstream's `cloudCIDRAllocator`.
    wait_for("workqueue metrics of queue cloudCIDRAllocator", Duration::from_secs(60), || async {
        let adds = c.sample(r#"workqueue_adds_total{name="cloudCIDRAllocator"}"#)?;
        let done =
            c.sample(r#"workqueue_work_duration_seconds_count{name="cloudCIDRAllocator"}"#)?;
        let depth = c.sample(r#"workqueue_depth{name="cloudCIDRAllocator"}"#)?;
        (adds >= 1.0 && done >= 1.0 && depth == 0.0).then_some(())
    })
    .await;
    delete_group(&client, &group).await;
}

/// Issue #13 (9): as upstream, `CloudAllocator` writes the pod CIDR before it reports the
/// network ready: no version of the Node ever has `NetworkUnavailable=False` without a pod
/// CIDR (watched from the Node's creation on the real apiserver).
#[tokio::test]
async fn cloud_allocator_writes_the_pod_cidr_before_the_network_condition() {
    use kube::api::{WatchEvent, WatchParams};
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let group = ccm_testbed::unique_name("g");
    let config = ControllerConfig {
        allocate_node_cidrs: true,
        cidr_allocator_type: "CloudAllocator".into(),
        ..Default::default()
    };
    let cidrs = std::sync::Arc::new(TestNodeCidrs::new());
    let name = ccm_testbed::unique_name("ipam-order");
    cidrs.set(&name, vec!["10.78.5.0/24".parse().unwrap()]);
    let cloud = TestCloud { node_cidrs: Some(cidrs.clone()), ..Default::default() };
    let o = IpamOptions { node_selector: Some(format!("{GROUP_LABEL}={group}")) };
    let _c = run(&client, cloud, config, move |ctx| node_ipam::start_with(ctx, o));
    let api = Api::<Node>::all(client.clone());
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(GROUP_LABEL.to_string(), group.clone())])),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some(format!("test://{name}")),
            ..Default::default()
        }),
        ..Default::default()
    };
    let created = api.create(&PostParams::default(), &node).await.unwrap();
    let rv = created.metadata.resource_version.clone().unwrap();
    // (has a pod CIDR, NetworkUnavailable=False) of every version after the creation.
    let state = |n: &Node| {
        let cidr =
            n.spec.as_ref().and_then(|s| s.pod_cidr.as_deref()).is_some_and(|c| !c.is_empty());
        let ready = n
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == "NetworkUnavailable"))
            .is_some_and(|c| c.status == "False");
        (cidr, ready)
    };
    let mut versions = vec![state(&created)];
    let wp = WatchParams::default().fields(&format!("metadata.name={name}")).timeout(60);
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut from = rv;
    'watch: while Instant::now() < deadline {
        let mut stream = api.watch(&wp, &from).await.unwrap().boxed();
        while let Some(ev) = stream.next().await {
            if let WatchEvent::Modified(n) = ev.unwrap() {
                from = n.metadata.resource_version.clone().unwrap_or(from);
                versions.push(state(&n));
                if state(&n) == (true, true) {
                    break 'watch;
                }
            }
        }
    }
    eprintln!("node versions (has pod CIDR, network ready): {versions:?}");
    assert_eq!(versions.last(), Some(&(true, true)), "the node got its CIDR and a ready network");
    assert!(
        !versions.contains(&(false, true)),
        "the network was reported ready before the pod CIDR was set: {versions:?}"
    );
    delete_group(&client, &group).await;
}

/// A Node with this providerID in `group` (created on the apiserver).
async fn create_cloud_node(client: &Client, group: &str, name: &str) {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.to_string()),
            labels: Some(BTreeMap::from([(GROUP_LABEL.to_string(), group.to_string())])),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some(format!("test://{name}")),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap();
}

/// Issue #32 GCP 8: as upstream's CloudAllocator, the service CIDRs decide which of the
/// cloud's ranges a Node gets and in which order: IPv4-primary dual-stack `[v4, v6]`,
/// IPv6-primary `[v6, v4]`, single-stack only its family (the other range dropped), no
/// service CIDR IPv4 only. Each cluster stack is its own controller on the real apiserver;
/// the cloud answers both families (IPv6 first) for every node.
#[tokio::test]
async fn cloud_allocator_orders_and_keeps_the_families_of_the_service_cidrs() {
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let v4: IpNet = "10.96.0.0/12".parse().unwrap();
    let v6: IpNet = "fd00:96::/112".parse().unwrap();
    let stacks: [(&str, Vec<IpNet>, &[&str]); 5] = [
        ("v4v6", vec![v4, v6], &["10.79.1.0/24", "fd00:79:1::/112"]),
        ("v6v4", vec![v6, v4], &["fd00:79:1::/112", "10.79.1.0/24"]),
        ("v4", vec![v4], &["10.79.1.0/24"]),
        ("v6", vec![v6], &["fd00:79:1::/112"]),
        ("none", vec![], &["10.79.1.0/24"]),
    ];
    let mut running = Vec::new();
    let mut nodes = Vec::new();
    for (label, service_cidrs, want) in &stacks {
        let group = ccm_testbed::unique_name("g");
        let cidrs = std::sync::Arc::new(TestNodeCidrs::new());
        let name = ccm_testbed::unique_name(&format!("ipam-{label}"));
        cidrs.set(&name, vec!["fd00:79:1::/112".parse().unwrap(), "10.79.1.0/24".parse().unwrap()]);
        let cloud = TestCloud { node_cidrs: Some(cidrs), ..Default::default() };
        let config = ControllerConfig {
            allocate_node_cidrs: true,
            cidr_allocator_type: "CloudAllocator".into(),
            service_cidrs: service_cidrs.clone(),
            ..Default::default()
        };
        let o = IpamOptions { node_selector: Some(format!("{GROUP_LABEL}={group}")) };
        running.push(run(&client, cloud, config, move |ctx| node_ipam::start_with(ctx, o)));
        create_cloud_node(&client, &group, &name).await;
        nodes.push((label, group, name, want));
    }
    for (label, group, name, want) in &nodes {
        let got = wait_for(&format!("{label}: pod CIDRs"), Duration::from_secs(60), || async {
            let c = pod_cidrs(&client, group).await.get(name)?.clone();
            (!c.is_empty()).then_some(c)
        })
        .await;
        assert_eq!(got, want.to_vec(), "cluster stack {label}");
    }
    for (_, group, _, _) in &nodes {
        delete_group(&client, group).await;
    }
}

/// Issue #32 GCP 8: a node the cloud has no range for gets upstream's `Normal` Event
/// `CIDRNotAvailable` and is retried: once the cloud has its range, it gets it. A
/// dual-stack cluster's node whose instance has only IPv4 gets nothing written (no half
/// dual-stack podCIDRs) and, as upstream, no Event.
#[tokio::test]
async fn cloud_allocator_without_a_range_raises_cidr_not_available_and_retries() {
    use k8s_openapi::api::core::v1::Event;
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let group = ccm_testbed::unique_name("g");
    let cidrs = std::sync::Arc::new(TestNodeCidrs::new());
    let cloud = TestCloud { node_cidrs: Some(cidrs.clone()), ..Default::default() };
    let config = ControllerConfig {
        allocate_node_cidrs: true,
        cidr_allocator_type: "CloudAllocator".into(),
        service_cidrs: vec!["10.96.0.0/12".parse().unwrap(), "fd00:96::/112".parse().unwrap()],
        ..Default::default()
    };
    let o = IpamOptions { node_selector: Some(format!("{GROUP_LABEL}={group}")) };
    let _c = run(&client, cloud, config, move |ctx| node_ipam::start_with(ctx, o));
    let empty = ccm_testbed::unique_name("ipam-none");
    let half = ccm_testbed::unique_name("ipam-half");
    cidrs.set(&half, vec!["10.80.2.0/24".parse().unwrap()]);
    create_cloud_node(&client, &group, &empty).await;
    create_cloud_node(&client, &group, &half).await;

    let event = wait_for("CIDRNotAvailable on the node", Duration::from_secs(60), || async {
        let api = Api::<Event>::namespaced(client.clone(), "default");
        let lp = ListParams::default().fields(&format!("involvedObject.name={empty}"));
        api.list(&lp)
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("CIDRNotAvailable"))
    })
    .await;
    assert_eq!(event.type_.as_deref(), Some("Normal"));
    assert_eq!(
        event.message.as_deref(),
        Some(format!("Node {empty} status is now: CIDRNotAvailable").as_str())
    );
    assert_eq!(event.involved_object.kind.as_deref(), Some("Node"));
    // Both nodes are retried (backoff from 250 ms): nothing written, no Event for the half one.
    wait_for("both nodes retried", Duration::from_secs(30), || async {
        (cidrs.calls.load(std::sync::atomic::Ordering::SeqCst) >= 4).then_some(())
    })
    .await;
    let now = pod_cidrs(&client, &group).await;
    assert!(now[&half].is_empty(), "no IPv4-only podCIDRs on a dual-stack cluster: {now:?}");
    assert!(now[&empty].is_empty(), "{now:?}");
    assert_eq!(event_reasons(&client, "default", &half).await, Vec::<String>::new());

    // The cloud gets both ranges: the retries pick them up.
    cidrs.set(&empty, vec!["fd00:80:1::/112".parse().unwrap(), "10.80.1.0/24".parse().unwrap()]);
    cidrs.set(&half, vec!["10.80.2.0/24".parse().unwrap(), "fd00:80:2::/112".parse().unwrap()]);
    for (name, want) in [
        (&empty, ["10.80.1.0/24", "fd00:80:1::/112"]),
        (&half, ["10.80.2.0/24", "fd00:80:2::/112"]),
    ] {
        let got = wait_for("pod CIDRs after the retry", Duration::from_secs(60), || async {
            let c = pod_cidrs(&client, &group).await.get(name)?.clone();
            (!c.is_empty()).then_some(c)
        })
        .await;
        assert_eq!(got, want);
    }
    delete_group(&client, &group).await;
}
