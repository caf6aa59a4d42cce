//! The load-balancer monitor (issue #33 item 12) against the testbed's real kube-apiserver
//! and the IBM emulator: health Events on the owning Service, deletion of this cluster's load
//! balancers whose Service is gone (and of nothing else), the 5-minute period shortened, and
//! `[kubernetes] set-network-unavailable`.

use std::collections::BTreeMap;
use std::time::Duration;

use ccm_core::cloud::{CloudProvider, LoadBalancer, ProviderInit};
use ccm_core::manager::CancellationToken;
use ccm_core::names;
use ccm_emulators::asyncop::Action;
use ccm_provider_ibm::IbmProvider;
use ccm_provider_ibm::client::ClientOptions;
use ccm_provider_ibm::config::Config;
use ccm_provider_ibm::load_balancer::annotations;
use ccm_provider_ibm::monitor::{Monitor, MonitorOptions, reasons};
use ccm_testbed::fixtures::{kubelet_node, load_balancer_service};
use ccm_testbed::{ControlPlane, unique_name, wait_for};
use k8s_openapi::api::core::v1::{Event, Node, Service};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::controller::{lb_named, lbs, namespace};
use crate::fixture::{CLUSTER, Fixture, TIMINGS, config_text, converge, iks_labels, node, start};

/// A monitor lists every Service of the shared kube-apiserver and reports on each: a Service
/// whose load balancer its own emulator lacks is `offline/not_found`, a Warning after two
/// passes. The tests that run one take turns, so none reads another monitor's Events on its
/// Services.
static ONE_MONITOR_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn members() -> Vec<Node> {
    let labels = iks_labels("kube-clus1-default-00000101", "10.240.0.4", "us-south-1");
    vec![node("10.240.0.4", &labels, None, None)]
}

/// A Service in the API (so it has a UID), with its load balancer made and active.
async fn with_lb(
    f: &Fixture,
    client: &Client,
    ns: &str,
    name: &str,
    port: i32,
    lb_name: Option<&str>,
) -> Service {
    let mut svc = load_balancer_service(ns, name, port);
    if let Some(n) = lb_name {
        svc.metadata.annotations = Some([(annotations::VPC_LB_NAME.to_string(), n.into())].into());
    }
    let mut svc = Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    // The API allocated the node port; the provider needs it.
    assert!(svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port.is_some());
    converge(f.provider.ibm_load_balancer(), &svc, &members()).await;
    svc.status = None;
    svc
}

async fn events_of(client: &Client, ns: &str, name: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    api.list(&lp).await.unwrap().items
}

fn lb_name_of(f: &Fixture, svc: &Service) -> String {
    f.provider.ibm_load_balancer().load_balancer_name("k", svc)
}

/// Orphans: this cluster's load balancers whose Service is gone are deleted — by generated
/// name and by ownership tags (annotated name) — and nothing else: not the load balancer of a
/// live Service, not another cluster's (its generated name, and one tagged for it), not one
/// an operator made, not one a live Service's annotation names (even though its tags name a
/// deleted Service of this cluster), not one still pending (left for a later pass).
#[tokio::test]
async fn orphans_of_this_cluster_are_deleted_and_nothing_else() {
    let _turn = ONE_MONITOR_AT_A_TIME.lock().await;
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = start().await;
    let ns = namespace(&client, "ibm-orphans").await;
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);

    let live = with_lb(&f, &client, &ns, "live", 80, None).await;
    let gone = with_lb(&f, &client, &ns, "gone", 81, None).await;
    let tagged = with_lb(&f, &client, &ns, "tagged", 82, Some("my-shop-lb")).await;
    let old = with_lb(&f, &client, &ns, "old", 83, Some("kept-by-annotation")).await;
    // Another cluster's, by generated name and by tags (a Service UID nobody here has).
    let other = crate::fixture::provider_for(&f, "clus2");
    let mut foreign = load_balancer_service(&ns, "foreign", 84);
    foreign.metadata.uid = Some("0f0f0f0f-1111-2222-3333-444444444444".into());
    foreign.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(30084);
    converge(other.ibm_load_balancer(), &foreign, &members()).await;
    let mut foreign_tagged = foreign.clone();
    foreign_tagged.metadata.annotations =
        Some([(annotations::VPC_LB_NAME.to_string(), "their-lb".to_string())].into());
    converge(other.ibm_load_balancer(), &foreign_tagged, &members()).await;
    // One an operator made by hand (untagged).
    let subnet = f.cloud.subnet_id("subnet-1").unwrap();
    f.provider
        .client()
        .create_load_balancer(json!({"name": "operator-lb", "is_public": true,
            "subnets": [{"id": subnet}], "resource_group": {"id": f.cloud.resource_group_id()}}))
        .await
        .unwrap();
    let names_before: Vec<String> =
        lbs(&f).await.iter().map(|l| l["name"].as_str().unwrap().to_string()).collect();
    assert_eq!(names_before.len(), 7, "{names_before:?}");

    // Services go (no finalizer here: no controller runs), one name is taken up by a live
    // Service's annotation.
    for name in ["gone", "tagged", "old"] {
        services.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let mut taker = load_balancer_service(&ns, "taker", 85);
    taker.metadata.annotations =
        Some([(annotations::VPC_LB_NAME.to_string(), "kept-by-annotation".to_string())].into());
    services.create(&PostParams::default(), &taker).await.unwrap();

    let monitor = Monitor::new(f.provider.ibm_load_balancer().clone(), client.clone());
    let report = monitor.pass().await.unwrap();
    let mut deleted = report.deleted.clone();
    deleted.sort();
    let mut want = vec![lb_name_of(&f, &gone), "my-shop-lb".to_string()];
    want.sort();
    assert_eq!(deleted, want, "{report:?}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    let mut left: Vec<String> =
        lbs(&f).await.iter().map(|l| l["name"].as_str().unwrap().to_string()).collect();
    left.sort();
    let mut kept = vec![
        lb_name_of(&f, &live),
        lb_name_of(&f, &old),
        other.ibm_load_balancer().load_balancer_name("k", &foreign),
        "their-lb".to_string(),
        "operator-lb".to_string(),
    ];
    kept.sort();
    assert_eq!(left, kept);
    assert_eq!(lb_name_of(&f, &old), "kept-by-annotation");
    let _ = tagged;

    // A pending orphan is left for a later pass, then deleted.
    let late = with_lb(&f, &client, &ns, "late", 86, None).await;
    services.delete("late", &DeleteParams::default()).await.unwrap();
    f.cloud.set_lb_pending(Duration::from_secs(600));
    f.provider
        .client()
        .create_member(
            lb_named(&f, &lb_name_of(&f, &late)).await.unwrap()["id"].as_str().unwrap(),
            lb_named(&f, &lb_name_of(&f, &late)).await.unwrap()["pools"][0]["id"].as_str().unwrap(),
            json!({"port": 30086, "target": {"address": "10.240.0.5"}}),
        )
        .await
        .unwrap();
    let report = monitor.pass().await.unwrap();
    assert!(report.deleted.is_empty(), "{report:?}");
    assert!(report.skipped.iter().any(|s| s.contains("update_pending")), "{report:?}");
    f.cloud.set_lb_pending(Duration::from_millis(300));
    f.cloud.complete_pending();
    let report = monitor.pass().await.unwrap();
    assert_eq!(report.deleted, vec![lb_name_of(&f, &late)], "{report:?}");
    let _ = services.delete("live", &DeleteParams::default()).await;
    let _ = services.delete("taker", &DeleteParams::default()).await;
}

/// Health: a load balancer IBM left `failed` is a Warning `VerifyingCloudLoadBalancerFailed`
/// on its Service once seen in two passes in a row (not after one: a pending moment is not
/// news), from `ibm-cloud-provider`; a Service whose load balancer is missing likewise
/// (`offline/not_found`); the return to `online/active` is a Normal
/// `CloudVPCLoadBalancerNormalEvent`. A healthy load balancer gets no Event.
#[tokio::test]
async fn unhealthy_load_balancers_are_warning_events_on_their_service() {
    let _turn = ONE_MONITOR_AT_A_TIME.lock().await;
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = start().await;
    let ns = namespace(&client, "ibm-health").await;
    let healthy = with_lb(&f, &client, &ns, "healthy", 80, None).await;
    let sick = with_lb(&f, &client, &ns, "sick", 81, None).await;
    let sick_lb = lb_name_of(&f, &sick);
    // An update IBM fails leaves the load balancer failed/offline.
    f.server
        .admin()
        .fail_operations("load_balancers/*", Action::Update, 1, "update failed")
        .await
        .unwrap();
    let id = lb_named(&f, &sick_lb).await.unwrap()["id"].as_str().unwrap().to_string();
    let pool =
        lb_named(&f, &sick_lb).await.unwrap()["pools"][0]["id"].as_str().unwrap().to_string();
    f.provider
        .client()
        .create_member(&id, &pool, json!({"port": 30081, "target": {"address": "10.240.0.5"}}))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(lb_named(&f, &sick_lb).await.unwrap()["provisioning_status"], "failed");
    // A Service whose load balancer does not exist (its creation never happened here).
    let missing = Api::<Service>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &load_balancer_service(&ns, "missing", 82))
        .await
        .unwrap();

    let monitor = Monitor::new(f.provider.ibm_load_balancer().clone(), client.clone());
    let first = monitor.pass().await.unwrap();
    let mine = |v: &Vec<String>| -> Vec<String> {
        let mut v: Vec<String> =
            v.iter().filter(|k| k.starts_with(&format!("{ns}/"))).cloned().collect();
        v.sort();
        v
    };
    assert!(mine(&first.warnings).is_empty(), "one pass is not enough: {first:?}");
    let second = monitor.pass().await.unwrap();
    assert_eq!(mine(&second.warnings), vec![format!("{ns}/missing"), format!("{ns}/sick")]);
    let ev = wait_for("the Warning on sick", Duration::from_secs(10), || async {
        events_of(&client, &ns, "sick")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reasons::VERIFYING_FAILED))
    })
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.source.and_then(|s| s.component).as_deref(), Some("ibm-cloud-provider"));
    let note = ev.message.unwrap_or_default();
    assert!(note.contains(&sick_lb) && note.contains("offline/failed"), "{note}");
    let ev = wait_for("the Warning on missing", Duration::from_secs(10), || async {
        events_of(&client, &ns, "missing")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reasons::VERIFYING_FAILED))
    })
    .await;
    assert!(ev.message.unwrap_or_default().contains("offline/not_found"));
    assert!(
        events_of(&client, &ns, "healthy").await.is_empty(),
        "no Event for a healthy load balancer"
    );

    // Recovery: the failed load balancer replaced (delete, create again) is online/active.
    let lb = f.provider.ibm_load_balancer();
    crate::fixture::delete_converged(lb, &sick).await;
    converge(lb, &sick, &members()).await;
    let third = monitor.pass().await.unwrap();
    assert_eq!(mine(&third.recoveries), vec![format!("{ns}/sick")], "{third:?}");
    let ev = wait_for("the Normal on sick", Duration::from_secs(10), || async {
        events_of(&client, &ns, "sick")
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reasons::NORMAL))
    })
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Normal"));
    let _ = (healthy, missing);
}

/// The monitor runs on its own every period once the manager initialises the provider (5
/// minutes by default, shortened here) and stops with leadership.
#[tokio::test]
async fn the_monitor_runs_every_period_after_initialize() {
    let _turn = ONE_MONITOR_AT_A_TIME.lock().await;
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = start().await;
    let ns = namespace(&client, "ibm-period").await;
    let svc = with_lb(&f, &client, &ns, "brief", 80, None).await;
    let name = lb_name_of(&f, &svc);
    assert_eq!(MonitorOptions::default().period, Duration::from_secs(300));
    let provider = crate::fixture::provider_with_timings(&f, TIMINGS)
        .with_monitor(MonitorOptions { period: Duration::from_millis(500) });
    let stop = CancellationToken::new();
    provider.initialize(ProviderInit::new(client.clone(), stop.clone())).unwrap();
    Api::<Service>::namespaced(client.clone(), &ns)
        .delete("brief", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the orphan deleted by the running monitor", Duration::from_secs(30), || async {
        lb_named(&f, &name).await.is_none().then_some(())
    })
    .await;
    stop.cancel();
}

/// `[kubernetes] set-network-unavailable = true`: a Node being initialised (the
/// `uninitialized` taint) without a `NetworkUnavailable` condition gets
/// `NetworkUnavailable=True` (reason `No CNI present`) when the provider is asked for its
/// metadata, as upstream; an initialised Node, and every Node with `cniProvider =
/// OVNKubernetes` or without the setting, gets none.
#[tokio::test]
async fn set_network_unavailable_marks_new_nodes() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = start().await;
    let key = f._dir.path().join("api-key");
    let provider = |extra: &str| {
        let text = config_text(&f.server.url(), &f.cloud.account_id(), &key)
            .replace("config-file = /dev/null\n", &format!("config-file = /dev/null\n{extra}"));
        let config = Config::parse(&text, &BTreeMap::new()).unwrap();
        let p = IbmProvider::new(config, ClientOptions::default(), TIMINGS).unwrap();
        p.initialize(ProviderInit::new(client.clone(), CancellationToken::new())).unwrap();
        p
    };
    let nodes: Api<Node> = Api::all(client.clone());
    let condition = |n: &Node| {
        n.status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .and_then(|c| c.iter().find(|c| c.type_ == names::CONDITION_NETWORK_UNAVAILABLE))
            .cloned()
    };
    let new_node = |tainted: bool| {
        let name = unique_name("ibm-net");
        let mut n = kubelet_node(&name, "10.240.0.4", "True");
        let labels = iks_labels("kube-clus1-default-00000101", "10.240.0.4", "us-south-1");
        n.metadata.labels =
            Some(labels.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
        if !tainted {
            n.spec.as_mut().unwrap().taints = None;
        }
        (name, n)
    };
    let mut made = Vec::new();
    for (extra, tainted, want) in [
        ("set-network-unavailable = true\n", true, true),
        ("set-network-unavailable = true\n", false, false),
        ("set-network-unavailable = true\ncniProvider = OVNKubernetes\n", true, false),
        ("", true, false),
    ] {
        let p = provider(extra);
        let (name, n) = new_node(tainted);
        let created = nodes.create(&PostParams::default(), &n).await.unwrap();
        made.push(name.clone());
        let md = p.ibm_instances().clone();
        let out =
            ccm_core::cloud::InstancesV2::instance_metadata_batch(md.as_ref(), &[created]).await;
        let md = out.into_iter().next().unwrap().unwrap();
        assert_eq!(
            md.provider_id,
            format!("ibm://{}///{CLUSTER}/kube-clus1-default-00000101", f.cloud.account_id())
        );
        let fresh = nodes.get(&name).await.unwrap();
        match condition(&fresh) {
            Some(c) if want => {
                assert_eq!(c.status, "True");
                assert_eq!(c.reason.as_deref(), Some("No CNI present"));
            }
            None if !want => {}
            other => panic!("{extra:?} tainted={tainted}: condition {other:?}"),
        }
    }
    for n in made {
        let _ = nodes.delete(&n, &DeleteParams::default()).await;
    }
}
