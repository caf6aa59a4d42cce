//! The route controller against a real kube-apiserver and the scripted route table. Each
//! test scopes the controller to Nodes carrying its own group label.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::Route;
use ccm_core::controllers::probe::Probe;
use ccm_core::controllers::route::{self, RouteOptions};
use ccm_core::controllers::{ControllerConfig, ControllerContext, Started};
use ccm_core::testing::{RouteFault, TestCloud, TestRoutes};
use ccm_testbed::ControlPlane;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::service::{GROUP_LABEL, event_reasons};
use crate::support::{Running, run, wait_for};

fn config() -> ControllerConfig {
    ControllerConfig {
        cluster_cidrs: vec!["10.200.0.0/16".parse().unwrap(), "fd00:200::/48".parse().unwrap()],
        route_reconciliation_period: Duration::from_millis(200),
        ..Default::default()
    }
}

fn start(client: &Client, routes: &Arc<TestRoutes>, group: &str) -> Running {
    let cloud = TestCloud { routes: Some(routes.clone()), ..Default::default() };
    let opts = RouteOptions {
        node_selector: Some(format!("{GROUP_LABEL}={group}")),
        ..Default::default()
    };
    run(client, cloud, config(), move |ctx| route::start_with(ctx, opts))
}

async fn node_with_cidrs(client: &Client, group: &str, name: &str, cidrs: &[&str]) -> Node {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(BTreeMap::from([(GROUP_LABEL.to_string(), group.to_string())])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            pod_cidr: cidrs.first().map(|c| c.to_string()),
            pod_cidrs: Some(cidrs.iter().map(|c| c.to_string()).collect()),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap()
}

fn route(name: &str, target: &str, cidr: &str, blackhole: bool) -> Route {
    Route {
        name: name.into(),
        target_node: target.into(),
        target_node_addresses: vec![],
        enable_node_addresses: false,
        destination_cidr: cidr.into(),
        blackhole,
    }
}

/// `(status, reason)` of the node's NetworkUnavailable condition.
async fn network_unavailable(client: &Client, name: &str) -> Option<(String, String)> {
    let node = Api::<Node>::all(client.clone()).get(name).await.ok()?;
    let c = node.status?.conditions?.into_iter().find(|c| c.type_ == "NetworkUnavailable")?;
    Some((c.status, c.reason.unwrap_or_default()))
}

fn destinations_of(routes: &TestRoutes, node: &str) -> Vec<String> {
    let mut d: Vec<String> = routes
        .routes()
        .into_iter()
        .filter(|r| r.target_node == node)
        .map(|r| r.destination_cidr)
        .collect();
    d.sort();
    d
}

#[tokio::test]
async fn routes_follow_pod_cidrs_and_set_network_unavailable() {
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let group = ccm_testbed::unique_name("g");
    let routes = Arc::new(TestRoutes::new());
    routes.insert(route("outside", "someone-else", "172.16.5.0/24", false));
    routes.insert(route("stale", "no-such-node", "10.200.99.0/24", false));
    routes.insert(route("black", "", "10.200.98.0/24", true));
    let (a, b) = (ccm_testbed::unique_name("route-a"), ccm_testbed::unique_name("route-b"));
    let na = node_with_cidrs(&client, &group, &a, &["10.200.1.0/24", "fd00:200:0:1::/64"]).await;
    node_with_cidrs(&client, &group, &b, &["10.200.2.0/24"]).await;
    let c = start(&client, &routes, &group);

    wait_for("routes for both nodes", Duration::from_secs(60), || async {
        (destinations_of(&routes, &a) == ["10.200.1.0/24", "fd00:200:0:1::/64"]
            && destinations_of(&routes, &b) == ["10.200.2.0/24"])
        .then_some(())
    })
    .await;
    let uid = na.metadata.uid.unwrap();
    assert!(
        routes.routes().iter().filter(|r| r.target_node == a).all(|r| r.name.starts_with(&uid)),
        "created with the node UID as name hint"
    );
    wait_for("stale and blackholed routes deleted", Duration::from_secs(60), || async {
        let names: Vec<String> = routes.routes().into_iter().map(|r| r.name).collect();
        (!names.contains(&"stale".into()) && !names.contains(&"black".into())).then_some(())
    })
    .await;
    assert!(
        routes.routes().iter().any(|r| r.name == "outside"),
        "route outside the cluster CIDR left alone"
    );
    assert!(c.metric("route_controller_route_sync_total") >= 1.0);
    for n in [&a, &b] {
        let cond = wait_for("NetworkUnavailable=False", Duration::from_secs(60), || async {
            network_unavailable(&client, n).await.filter(|c| c.0 == "False")
        })
        .await;
        assert_eq!(cond.1, "RouteCreated");
    }

    // Deleting a node deletes its routes.
    Api::<Node>::all(client.clone()).delete(&a, &DeleteParams::default()).await.unwrap();
    wait_for("routes of the deleted node gone", Duration::from_secs(60), || async {
        destinations_of(&routes, &a).is_empty().then_some(())
    })
    .await;
    assert_eq!(destinations_of(&routes, &b), ["10.200.2.0/24"]);

    // A failing creation: event on the node, NetworkUnavailable=True/NoRouteCreated; the
    // next passes retry and succeed once the cloud recovers.
    routes.set_fault(Some(RouteFault::CreateFails));
    let c = ccm_testbed::unique_name("route-c");
    node_with_cidrs(&client, &group, &c, &["10.200.3.0/24"]).await;
    wait_for("FailedToCreateRoute event", Duration::from_secs(60), || async {
        event_reasons(&client, "default", &c)
            .await
            .contains(&"FailedToCreateRoute".into())
            .then_some(())
    })
    .await;
    let cond = wait_for("NetworkUnavailable=True", Duration::from_secs(60), || async {
        network_unavailable(&client, &c).await
    })
    .await;
    assert_eq!(cond, ("True".to_string(), "NoRouteCreated".to_string()));
    routes.set_fault(None);
    wait_for("route after recovery", Duration::from_secs(60), || async {
        (destinations_of(&routes, &c) == ["10.200.3.0/24"]).then_some(())
    })
    .await;
    let cond = wait_for("NetworkUnavailable=False", Duration::from_secs(60), || async {
        network_unavailable(&client, &c).await.filter(|c| c.0 == "False")
    })
    .await;
    assert_eq!(cond.1, "RouteCreated");
    crate::service::delete_nodes(&client, &[b, c]).await;
}

#[tokio::test]
async fn start_validates_flags_and_capabilities() {
    let cp = ControlPlane::shared().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    let ctx = |cloud: TestCloud, config: ControllerConfig| ControllerContext {
        client: client.clone(),
        cloud: Arc::new(cloud),
        config: Arc::new(config),
        metrics: Default::default(),
        shutdown: CancellationToken::new(),
        nodes: None,
    };
    let with_routes =
        || TestCloud { routes: Some(Arc::new(TestRoutes::new())), ..Default::default() };

    let err = route::start(&ctx(with_routes(), ControllerConfig::default()))
        .err()
        .expect("no --cluster-cidr is fatal");
    assert!(err.to_string().contains("--cluster-cidr"), "{err}");
    let two_v4 = ControllerConfig {
        cluster_cidrs: vec!["10.1.0.0/16".parse().unwrap(), "10.2.0.0/16".parse().unwrap()],
        ..Default::default()
    };
    let err = route::start(&ctx(with_routes(), two_v4)).err().expect("two IPv4 CIDRs are fatal");
    assert!(err.to_string().contains("dual stack"), "{err}");

    let off = ControllerConfig { configure_cloud_routes: false, ..config() };
    assert!(matches!(route::start(&ctx(with_routes(), off)), Ok(Started::Skipped(_))));
    match route::start(&ctx(TestCloud::default(), config())) {
        Ok(Started::Skipped(why)) => assert!(why.contains("does not support routes"), "{why}"),
        _ => panic!("a cloud without routes skips the controller"),
    }
}

#[tokio::test]
async fn route_operations_run_in_parallel_with_at_most_200_in_flight() {
    const NODES: usize = 250;
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let group = ccm_testbed::unique_name("g");
    let names: Vec<String> = (0..NODES).map(|_| ccm_testbed::unique_name("route-many")).collect();
    futures::stream::iter(names.iter().enumerate())
        .for_each_concurrent(20, |(i, n)| {
            let (client, group) = (client.clone(), group.clone());
            async move {
                node_with_cidrs(&client, &group, n, &[&format!("10.200.{i}.0/24")]).await;
            }
        })
        .await;
    let routes = Arc::new(TestRoutes::new());
    routes.set_latency(Duration::from_millis(200));
    let start_time = std::time::Instant::now();
    let _c = start(&client, &routes, &group);
    wait_for("a route per node", Duration::from_secs(120), || async {
        (routes.routes().len() == NODES).then_some(())
    })
    .await;
    let max = routes.calls.max_in_flight.load(std::sync::atomic::Ordering::SeqCst);
    eprintln!(
        "{NODES} routes created in {:?} (200 ms cloud latency each), max {max} in flight",
        start_time.elapsed()
    );
    assert!(max > 1 && max <= route::MAX_CONCURRENT_ROUTE_OPERATIONS, "{max}");
    assert_eq!(routes.calls.create.load(std::sync::atomic::Ordering::SeqCst), NODES);
    crate::service::delete_nodes(&client, &names).await;
    wait_for("routes of deleted nodes gone", Duration::from_secs(120), || async {
        routes.routes().is_empty().then_some(())
    })
    .await;
}

/// Issue #13 (1): the route controller used to keep every Node change (old and new version)
/// in a channel nobody read, so its memory grew with every Node update. 10 000 updates of
/// 10 Nodes against the real apiserver: the Node versions it retains stay at one per Node.
#[tokio::test]
async fn node_updates_do_not_accumulate_in_the_route_controller() {
    const NODES: usize = 10;
    const UPDATES_PER_NODE: usize = 1_000;
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let group = ccm_testbed::unique_name("g");
    let names: Vec<String> = (0..NODES).map(|_| ccm_testbed::unique_name("route-mem")).collect();
    for (i, n) in names.iter().enumerate() {
        node_with_cidrs(&client, &group, n, &[&format!("10.200.{}.0/24", 240 + i)]).await;
    }
    let routes = Arc::new(TestRoutes::new());
    let probe = Probe::new();
    let cloud = TestCloud { routes: Some(routes.clone()), ..Default::default() };
    let opts = RouteOptions {
        node_selector: Some(format!("{GROUP_LABEL}={group}")),
        probe: Some(probe.clone()),
    };
    let _c = run(&client, cloud, config(), move |ctx| route::start_with(ctx, opts));
    for n in &names {
        wait_for("NetworkUnavailable=False", Duration::from_secs(60), || async {
            network_unavailable(&client, n).await.filter(|c| c.0 == "False")
        })
        .await;
    }
    let before = probe.count(route::PROBE_RETAINED_NODE_VERSIONS).expect("gauge registered");

    let api = Api::<Node>::all(client.clone());
    let start = std::time::Instant::now();
    futures::stream::iter(names.iter())
        .for_each_concurrent(NODES, |n| {
            let api = api.clone();
            async move {
                for j in 0..UPDATES_PER_NODE {
                    let patch = serde_json::json!({"metadata": {"labels": {
                        "ccm-test.example.com/generation": j.to_string()}}});
                    api.patch(n, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
                }
            }
        })
        .await;
    let wrote = start.elapsed();
    // The controller has seen the last version of every Node.
    let mut want: Vec<String> = Vec::new();
    for n in &names {
        let rv = api.get(n).await.unwrap().metadata.resource_version.unwrap();
        want.push(format!("{n}@{rv}"));
    }
    wait_for(
        "the controller's cache has the last version of every node",
        Duration::from_secs(120),
        || async {
            let cached = probe.keys(route::PROBE_CACHED_NODES)?;
            want.iter().all(|w| cached.contains(w)).then_some(())
        },
    )
    .await;
    let after = probe.count(route::PROBE_RETAINED_NODE_VERSIONS).unwrap();
    eprintln!(
        "{} node updates written in {wrote:?}; node versions retained by the route \
         controller: {before} before, {after} after",
        NODES * UPDATES_PER_NODE
    );
    assert_eq!(after, NODES, "one version per node: memory does not grow with updates");
    crate::service::delete_nodes(&client, &names).await;
}
