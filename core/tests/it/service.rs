//! The service (load balancer) controller against a real kube-apiserver and the scripted
//! test cloud. Every test scopes the controller to its own namespace and to Nodes carrying
//! its own group label, so the tests share one control plane.
//!
//! Also holds the Service/Node fixtures the route and node-IPAM tests use.

use ccm_testbed::fixtures::load_balancer_service as lb_service;
use std::collections::BTreeMap;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::support::{Running, run, wait_for};
use ccm_core::controllers::ControllerConfig;
use ccm_core::controllers::service::{self, ServiceOptions};
use ccm_core::names;
use ccm_core::testing::{LbFault, TestCloud, TestLoadBalancers};
use ccm_testbed::ControlPlane;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Event, Namespace, Node, NodeCondition, NodeStatus, Service};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

/// Label key the tests use to give each test its own set of Nodes.
pub const GROUP_LABEL: &str = "ccm-test.example.com/group";

/// Creates a namespace with a unique name.
pub async fn namespace(client: &Client, prefix: &str) -> String {
    let name = ccm_testbed::unique_name(prefix);
    let ns = Namespace {
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
    name
}

/// Creates a Node in `group` with extra labels and a Ready condition.
pub async fn create_node(
    client: &Client,
    group: &str,
    name: &str,
    labels: &[(&str, &str)],
) -> Node {
    let mut l: BTreeMap<String, String> =
        labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    l.insert(GROUP_LABEL.into(), group.into());
    let node = Node {
        metadata: ObjectMeta { name: Some(name.into()), labels: Some(l), ..Default::default() },
        ..Default::default()
    };
    let api = Api::<Node>::all(client.clone());
    let created = api.create(&PostParams::default(), &node).await.unwrap();
    set_ready(client, name, true).await;
    created
}

/// Sets the Ready condition of a Node.
pub async fn set_ready(client: &Client, name: &str, ready: bool) {
    let status = NodeStatus {
        conditions: Some(vec![NodeCondition {
            type_: "Ready".into(),
            status: if ready { "True" } else { "False" }.into(),
            reason: Some("Test".into()),
            ..Default::default()
        }]),
        ..Default::default()
    };
    Api::<Node>::all(client.clone())
        .patch_status(name, &PatchParams::default(), &Patch::Strategic(json!({"status": status})))
        .await
        .unwrap();
}

/// Deletes Nodes by name (best effort).
pub async fn delete_nodes(client: &Client, names: &[String]) {
    let api = Api::<Node>::all(client.clone());
    for n in names {
        let _ = api.delete(n, &DeleteParams::default()).await;
    }
}

/// Event reasons about the object `name` in `namespace`, oldest first.
pub async fn event_reasons(client: &Client, namespace: &str, name: &str) -> Vec<String> {
    let api = Api::<Event>::namespaced(client.clone(), namespace);
    let mut evs: Vec<Event> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .collect();
    evs.sort_by_key(|e| e.first_timestamp.as_ref().map(|t| t.0));
    evs.into_iter().filter_map(|e| e.reason).collect()
}

/// Waits (up to 30 s) until the Service's event reasons, oldest first, satisfy `ok`; fails
/// with the reasons seen last.
pub async fn events_settle(
    client: &Client,
    namespace: &str,
    name: &str,
    ok: impl Fn(&[String]) -> bool,
) {
    let start = std::time::Instant::now();
    loop {
        let reasons = event_reasons(client, namespace, name).await;
        if ok(&reasons) {
            return;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "events of {namespace}/{name} after 30 s: {reasons:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn has_finalizer(svc: &Service) -> bool {
    svc.metadata.finalizers.iter().flatten().any(|f| f == names::FINALIZER_LB_CLEANUP)
}

fn ingress_ip(svc: &Service) -> Option<String> {
    svc.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?.first()?.ip.clone()
}

fn fast(ns: &str, group: &str) -> ServiceOptions {
    ServiceOptions {
        min_retry_delay: Duration::from_millis(250),
        max_retry_delay: Duration::from_secs(2),
        namespace: Some(ns.into()),
        node_selector: Some(format!("{GROUP_LABEL}={group}")),
        ..Default::default()
    }
}

fn start_service(
    client: &Client,
    lbs: &Arc<TestLoadBalancers>,
    config: ControllerConfig,
    opts: ServiceOptions,
) -> Running {
    let cloud = TestCloud { load_balancers: Some(lbs.clone()), ..Default::default() };
    run(client, cloud, config, move |ctx| service::start_with(ctx, opts))
}

#[tokio::test]
async fn load_balancer_lifecycle_follows_the_service() {
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let ns = namespace(&client, "svc-life").await;
    let group = ccm_testbed::unique_name("g");
    let n1 = ccm_testbed::unique_name("svc-node");
    let n2 = ccm_testbed::unique_name("svc-node-excluded");
    create_node(&client, &group, &n1, &[]).await;
    create_node(&client, &group, &n2, &[(names::LABEL_EXCLUDE_FROM_LB, "true")]).await;
    let lbs = Arc::new(TestLoadBalancers::new());
    let _c = start_service(&client, &lbs, ControllerConfig::default(), fast(&ns, &group));
    let api = Api::<Service>::namespaced(client.clone(), &ns);

    api.create(&PostParams::default(), &lb_service(&ns, "web", 80)).await.unwrap();
    let svc = wait_for("finalizer and ingress", Duration::from_secs(60), || async {
        let s = api.get("web").await.ok()?;
        (has_finalizer(&s) && ingress_ip(&s).is_some()).then_some(s)
    })
    .await;
    let lb = lbs.for_service(&ns, "web").expect("load balancer exists");
    assert_eq!(lb.nodes, vec![n1.clone()], "excluded node is not a backend");
    assert_eq!(lb.ports, vec![80]);
    assert_eq!(ingress_ip(&svc), lb.status.ingress.as_ref().unwrap()[0].ip);
    // Events are written as the controller goes; the last may land just after the status.
    events_settle(&client, &ns, "web", |r| r == ["EnsuringLoadBalancer", "EnsuredLoadBalancer"])
        .await;

    // Port change: the load balancer is updated.
    let patch = json!({"spec": {"ports": [{"port": 81, "protocol": "TCP"}]}});
    api.patch("web", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    wait_for("load balancer on port 81", Duration::from_secs(60), || async {
        (lbs.for_service(&ns, "web")?.ports == vec![81]).then_some(())
    })
    .await;

    // Type changed to ClusterIP: load balancer deleted, finalizer removed, ingress cleared.
    let patch = json!({"spec": {"type": "ClusterIP", "ports": [{"port": 81, "protocol": "TCP"}],
        "externalTrafficPolicy": null, "allocateLoadBalancerNodePorts": null}});
    api.patch("web", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    wait_for("cleanup after type change", Duration::from_secs(60), || async {
        let s = api.get("web").await.ok()?;
        (!has_finalizer(&s) && ingress_ip(&s).is_none()).then_some(())
    })
    .await;
    assert!(lbs.for_service(&ns, "web").is_none(), "load balancer deleted");
    // DeletedLoadBalancer may be written just after the finalizer is removed.
    events_settle(&client, &ns, "web", |r| {
        r.ends_with(&["DeletingLoadBalancer".into(), "DeletedLoadBalancer".into()])
    })
    .await;

    // Back to LoadBalancer, then delete the Service: the LB is gone before the Service is.
    let patch = json!({"spec": {"type": "LoadBalancer"}});
    api.patch("web", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    wait_for("load balancer again", Duration::from_secs(60), || async {
        let s = api.get("web").await.ok()?;
        ingress_ip(&s).and(lbs.for_service(&ns, "web"))
    })
    .await;
    lbs.set_latency(Duration::from_millis(300));
    api.delete("web", &DeleteParams::default()).await.unwrap();
    wait_for("service gone", Duration::from_secs(60), || async {
        matches!(api.get("web").await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await;
    assert!(
        lbs.for_service(&ns, "web").is_none(),
        "load balancer deleted before the Service vanished"
    );
    delete_nodes(&client, &[n1, n2]).await;
}

/// A second, different failure is a new event, not folded into the first one's series
/// (what `kubectl describe service` shows is the cloud's latest error); the same failure
/// again grows one event's series, as client-go's correlator does.
#[tokio::test]
async fn a_different_failure_is_a_new_event_and_a_repeated_one_is_counted() {
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let ns = namespace(&client, "svc-events").await;
    let group = ccm_testbed::unique_name("g");
    let n1 = ccm_testbed::unique_name("svc-node");
    create_node(&client, &group, &n1, &[]).await;
    let lbs = Arc::new(TestLoadBalancers::new());
    lbs.set_fault(Some(LbFault::Failing("first failure: quota exceeded".into())));
    let _c = start_service(&client, &lbs, ControllerConfig::default(), fast(&ns, &group));
    let api = Api::<Service>::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &lb_service(&ns, "evs", 80)).await.unwrap();
    let events = Api::<Event>::namespaced(client.clone(), &ns);
    let failures = || async {
        let mut evs: Vec<(String, i32)> = events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some("SyncLoadBalancerFailed"))
            .map(|e| (e.message.unwrap_or_default(), e.count.unwrap_or(1)))
            .collect();
        evs.sort();
        Some(evs)
    };
    let first = wait_for("the first failure counted twice", Duration::from_secs(60), || async {
        let evs = failures().await?;
        evs.iter().any(|(n, c)| n.contains("first failure") && *c >= 2).then_some(evs)
    })
    .await;
    assert_eq!(first.len(), 1, "a repeated failure is one event: {first:?}");
    lbs.set_fault(Some(LbFault::Failing("second failure: subnet full".into())));
    let both = wait_for("an event with the second failure", Duration::from_secs(60), || async {
        let evs = failures().await?;
        evs.iter().any(|(n, _)| n.contains("second failure")).then_some(evs)
    })
    .await;
    assert!(both.iter().any(|(n, _)| n.contains("first failure")), "{both:?}");
    lbs.set_fault(None);
    api.delete("evs", &DeleteParams::default()).await.unwrap();
    delete_nodes(&client, &[n1]).await;
}

#[tokio::test]
async fn cloud_failures_keep_the_finalizer_retry_with_backoff_and_leak_nothing() {
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let ns = namespace(&client, "svc-fail").await;
    let group = ccm_testbed::unique_name("g");
    let n1 = ccm_testbed::unique_name("svc-node");
    create_node(&client, &group, &n1, &[]).await;
    let lbs = Arc::new(TestLoadBalancers::new());
    lbs.set_fault(Some(LbFault::Unavailable));
    let _c = start_service(&client, &lbs, ControllerConfig::default(), fast(&ns, &group));
    let api = Api::<Service>::namespaced(client.clone(), &ns);

    api.create(&PostParams::default(), &lb_service(&ns, "flaky", 80)).await.unwrap();
    wait_for("5 ensure attempts", Duration::from_secs(60), || async {
        (lbs.calls.ensure.load(Ordering::SeqCst) >= 5).then_some(())
    })
    .await;
    let times = lbs.ensure_times();
    let gaps: Vec<Duration> = times.windows(2).map(|w| w[1] - w[0]).collect();
    eprintln!("ensure retry gaps with backoff 250ms doubling: {gaps:?}");
    // Retries wait at least their backoff (sleeps never end early): 250, 500, 1000, 2000 ms.
    assert!(gaps[3] >= Duration::from_millis(1990), "4th retry waited its grown backoff: {gaps:?}");
    let s = api.get("flaky").await.unwrap();
    assert!(has_finalizer(&s), "finalizer added before the cloud call and kept on failure");
    assert!(ingress_ip(&s).is_none());
    let reasons = event_reasons(&client, &ns, "flaky").await;
    assert!(reasons.contains(&"SyncLoadBalancerFailed".to_string()), "{reasons:?}");

    // The cloud recovers: the load balancer appears.
    lbs.set_fault(None);
    wait_for("ingress after recovery", Duration::from_secs(60), || async {
        ingress_ip(&api.get("flaky").await.ok()?)
    })
    .await;

    // Delete while the cloud fails: the Service stays (with its finalizer) until the cloud
    // recovers, then the load balancer is deleted and the Service goes.
    lbs.set_fault(Some(LbFault::Unavailable));
    let gets = lbs.calls.get.load(Ordering::SeqCst);
    api.delete("flaky", &DeleteParams::default()).await.unwrap();
    wait_for("3 failed deletion attempts", Duration::from_secs(60), || async {
        (lbs.calls.get.load(Ordering::SeqCst) >= gets + 3).then_some(())
    })
    .await;
    let s = api.get("flaky").await.expect("Service kept while its LB cannot be deleted");
    assert!(has_finalizer(&s) && s.metadata.deletion_timestamp.is_some());
    assert!(lbs.for_service(&ns, "flaky").is_some());
    lbs.set_fault(None);
    wait_for("service gone", Duration::from_secs(60), || async {
        matches!(api.get("flaky").await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await;
    assert!(lbs.for_service(&ns, "flaky").is_none(), "no leaked load balancer");
    delete_nodes(&client, &[n1]).await;
}

#[tokio::test]
async fn retry_after_is_a_fixed_delay() {
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let ns = namespace(&client, "svc-retry").await;
    let group = ccm_testbed::unique_name("g");
    let lbs = Arc::new(TestLoadBalancers::new());
    lbs.set_fault(Some(LbFault::RetryAfter(Duration::from_millis(200))));
    // An exponential retry would wait 10 minutes: only the fixed delay can make progress.
    let opts = ServiceOptions {
        min_retry_delay: Duration::from_secs(600),
        max_retry_delay: Duration::from_secs(600),
        ..fast(&ns, &group)
    };
    let _c = start_service(&client, &lbs, ControllerConfig::default(), opts);
    let api = Api::<Service>::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &lb_service(&ns, "slow", 80)).await.unwrap();
    wait_for("6 ensure attempts", Duration::from_secs(60), || async {
        (lbs.calls.ensure.load(Ordering::SeqCst) >= 6).then_some(())
    })
    .await;
    lbs.set_fault(None);
    wait_for("ingress", Duration::from_secs(60), || async {
        ingress_ip(&api.get("slow").await.ok()?)
    })
    .await;
    // A cloud asking to come back later is not a failure: a Normal LoadBalancerPending event
    // naming what is pending, no Warning (upstream: a Warning SyncLoadBalancerFailed on every
    // retry).
    let events = events_of(&client, &ns, "slow").await;
    let pending: Vec<&(String, String, String)> = events
        .iter()
        .filter(|(_, reason, _)| reason == names::reasons::LOAD_BALANCER_PENDING)
        .collect();
    assert!(!pending.is_empty(), "{events:?}");
    assert!(
        pending.iter().all(|(t, _, note)| t == "Normal"
            && note.contains("still provisioning")
            && note.contains("retrying in 200ms")),
        "{events:?}"
    );
    // (This test has no Node: its one Warning is UnAvailableLoadBalancer.)
    let warnings: Vec<_> = events
        .iter()
        .filter(|(t, reason, _)| {
            t != "Normal" && reason != names::reasons::UNAVAILABLE_LOAD_BALANCER
        })
        .collect();
    assert!(warnings.is_empty(), "no Warning for a pending load balancer: {warnings:?}");
}

/// Type, reason and note of every event of the object `name`, oldest first.
async fn events_of(client: &Client, namespace: &str, name: &str) -> Vec<(String, String, String)> {
    let api = Api::<Event>::namespaced(client.clone(), namespace);
    let mut evs: Vec<Event> = api
        .list(&Default::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .collect();
    evs.sort_by_key(|e| e.first_timestamp.as_ref().map(|t| t.0));
    evs.into_iter()
        .map(|e| {
            (
                e.type_.unwrap_or_default(),
                e.reason.unwrap_or_default(),
                e.message.unwrap_or_default(),
            )
        })
        .collect()
}

/// A node-sync update answered with RetryAfter re-queues the Service after the delay the
/// cloud asked for, not at once: no ensure comes while the delay runs (upstream re-adds the
/// key at once, and that ensure meets the same pending load balancer), one comes after it.
#[tokio::test]
async fn node_sync_waits_the_delay_a_pending_load_balancer_asks_for() {
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let ns = namespace(&client, "svc-nsretry").await;
    let group = ccm_testbed::unique_name("g");
    let n1 = ccm_testbed::unique_name("svc-node");
    let n2 = ccm_testbed::unique_name("svc-node");
    create_node(&client, &group, &n1, &[]).await;
    let lbs = Arc::new(TestLoadBalancers::new());
    let c = start_service(&client, &lbs, ControllerConfig::default(), fast(&ns, &group));
    let api = Api::<Service>::namespaced(client.clone(), &ns);
    api.create(&PostParams::default(), &lb_service(&ns, "web", 80)).await.unwrap();
    wait_for("the load balancer on the first node", Duration::from_secs(60), || async {
        lbs.for_service(&ns, "web").filter(|lb| lb.nodes == [n1.clone()])
    })
    .await;
    service_queue_settled(&c).await;
    let retries = r#"workqueue_retries_total{name="service"}"#;
    let (ensures, updates, retried) = (
        lbs.calls.ensure.load(Ordering::SeqCst),
        lbs.calls.update.load(Ordering::SeqCst),
        c.sample(retries).unwrap_or(0.0),
    );

    // The cloud is busy with the load balancer for a while: the node sync's update is
    // answered "retry after 30 s".
    lbs.set_fault(Some(LbFault::RetryAfter(Duration::from_secs(30))));
    create_node(&client, &group, &n2, &[]).await;
    wait_for("the node sync's update, re-queued", Duration::from_secs(60), || async {
        (lbs.calls.update.load(Ordering::SeqCst) > updates
            && c.sample(retries).unwrap_or(0.0) > retried)
            .then_some(())
    })
    .await;
    // Re-queued with the delay: no ensure yet (re-queued at once, it would have run its
    // ensure, answered "retry after" too, before its own delayed re-add counted the retry).
    assert_eq!(lbs.calls.ensure.load(Ordering::SeqCst), ensures, "no ensure during the delay");
    assert_eq!(c.sample(retries), Some(retried + 1.0), "one delayed re-add");
    let events = events_of(&client, &ns, "web").await;
    assert!(
        events.iter().any(|(t, reason, note)| t == "Normal"
            && reason == names::reasons::LOAD_BALANCER_PENDING
            && note.contains("retrying in 30s")),
        "{events:?}"
    );
    assert!(events.iter().all(|(t, _, _)| t == "Normal"), "no Warning: {events:?}");

    // The cloud settles; the delayed ensure puts both nodes behind the load balancer.
    lbs.set_fault(None);
    wait_for("the delayed ensure with both nodes", Duration::from_secs(120), || async {
        lbs.for_service(&ns, "web").filter(|lb| lb.nodes.len() == 2)
    })
    .await;
    assert_eq!(lbs.calls.ensure.load(Ordering::SeqCst), ensures + 1, "one ensure, after the delay");
    delete_nodes(&client, &[n1, n2]).await;
}

#[tokio::test]
async fn load_balancer_class_is_ignored_and_implemented_elsewhere_writes_no_status() {
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let ns = namespace(&client, "svc-other").await;
    let group = ccm_testbed::unique_name("g");
    let lbs = Arc::new(TestLoadBalancers::new());
    lbs.set_service_fault(&ns, "elsewhere", Some(LbFault::ImplementedElsewhere));
    let _c = start_service(&client, &lbs, ControllerConfig::default(), fast(&ns, &group));
    let api = Api::<Service>::namespaced(client.clone(), &ns);

    let mut classed = lb_service(&ns, "classed", 80);
    classed.spec.as_mut().unwrap().load_balancer_class = Some("example.com/other".into());
    api.create(&PostParams::default(), &classed).await.unwrap();
    api.create(&PostParams::default(), &lb_service(&ns, "elsewhere", 80)).await.unwrap();
    wait_for("ensure called for 'elsewhere'", Duration::from_secs(60), || async {
        (lbs.calls.ensure.load(Ordering::SeqCst) >= 1).then_some(())
    })
    .await;
    // Fence: one worker handles keys in order, so once a later Service is done, the earlier
    // ones are too.
    api.create(&PostParams::default(), &lb_service(&ns, "fence", 80)).await.unwrap();
    wait_for("fence ingress", Duration::from_secs(60), || async {
        ingress_ip(&api.get("fence").await.ok()?)
    })
    .await;

    let c = api.get("classed").await.unwrap();
    assert!(!has_finalizer(&c), "a Service with loadBalancerClass is not ours");
    assert!(lbs.for_service(&ns, "classed").is_none());
    assert!(event_reasons(&client, &ns, "classed").await.is_empty());

    let e = api.get("elsewhere").await.unwrap();
    assert!(has_finalizer(&e), "the finalizer is managed even when implemented elsewhere");
    assert!(ingress_ip(&e).is_none(), "no status written for ImplementedElsewhere");
    assert!(lbs.for_service(&ns, "elsewhere").is_none());
    assert_eq!(lbs.calls.ensure.load(Ordering::SeqCst), 2, "one ensure each, no retry");
}

/// Waits until the service queue is idle (no item queued or in progress) and stays so, with
/// no new item added, for a second.
async fn service_queue_settled(c: &crate::support::Running) {
    let idle = || {
        c.sample("workqueue_depth{name=\"service\"}") == Some(0.0)
            && c.sample("workqueue_unfinished_work_seconds{name=\"service\"}") == Some(0.0)
    };
    let mut last = None;
    wait_for("the service queue to settle", Duration::from_secs(120), || {
        let adds = c.sample("workqueue_adds_total{name=\"service\"}");
        let settled = idle() && last == Some(adds);
        last = Some(adds);
        async move {
            if !settled {
                tokio::time::sleep(Duration::from_millis(900)).await;
            }
            settled.then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn node_changes_update_only_changed_load_balancers_in_parallel() {
    const SERVICES: usize = 200;
    const WORKERS: usize = 16;
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let ns = namespace(&client, "svc-many").await;
    let group = ccm_testbed::unique_name("g");
    let n1 = ccm_testbed::unique_name("svc-node");
    let n2 = ccm_testbed::unique_name("svc-node");
    create_node(&client, &group, &n1, &[]).await;
    create_node(&client, &group, &n2, &[]).await;
    let lbs = Arc::new(TestLoadBalancers::new());
    let config = ControllerConfig { concurrent_service_syncs: 10, ..Default::default() };
    let opts = ServiceOptions { node_sync_workers: WORKERS, ..fast(&ns, &group) };
    let c = start_service(&client, &lbs, config, opts);
    let api = Api::<Service>::namespaced(client.clone(), &ns);

    // While the Services are created, excluded Nodes come and go: each add and delete runs a
    // node sync over Services whose first sync is in flight. Those syncs read the nodes
    // themselves; a node sync must not queue them for a second EnsureLoadBalancer.
    let churn_stop = Arc::new(AtomicBool::new(false));
    let churn = {
        let (client, group, stop) = (client.clone(), group.clone(), churn_stop.clone());
        tokio::spawn(async move {
            let mut passes = 0;
            while !stop.load(Ordering::SeqCst) {
                let name = ccm_testbed::unique_name("svc-churn");
                create_node(&client, &group, &name, &[(names::LABEL_EXCLUDE_FROM_LB, "true")])
                    .await;
                delete_nodes(&client, &[name]).await;
                passes += 2;
            }
            passes
        })
    };
    let start = Instant::now();
    futures::stream::iter(0..SERVICES)
        .for_each_concurrent(20, |i| {
            let api = api.clone();
            let svc = lb_service(&ns, &format!("lb-{i}"), 80);
            async move {
                api.create(&PostParams::default(), &svc).await.unwrap();
            }
        })
        .await;
    wait_for("all load balancers with ingress", Duration::from_secs(120), || async {
        let list = api.list(&Default::default()).await.ok()?;
        (list.items.iter().filter(|s| ingress_ip(s).is_some()).count() == SERVICES).then_some(())
    })
    .await;
    eprintln!("{SERVICES} LoadBalancer Services ensured in {:?}", start.elapsed());
    // Each ingress write comes back as a Service event and is synced (no cloud call). A node
    // sync that meets a Service mid-sync re-queues it for a full ensure instead of waiting on
    // its lock, so the exact call counts below hold only once those syncs are done.
    churn_stop.store(true, Ordering::SeqCst);
    let churned = churn.await.unwrap();
    service_queue_settled(&c).await;
    assert_eq!(lbs.all().len(), SERVICES);
    assert_eq!(lbs.calls.update.load(Ordering::SeqCst), 0);
    assert_eq!(
        c.metric("service_controller_loadbalancer_sync_total"),
        SERVICES as f64,
        "one EnsureLoadBalancer per Service despite {churned} excluded-node changes meanwhile"
    );

    // Readiness flapping and an excluded node: a node sync runs, but no LB changes.
    set_ready(&client, &n1, false).await;
    let syncs = c.metric("service_controller_nodesync_latency_seconds_count");
    let excluded = ccm_testbed::unique_name("svc-node-excluded");
    create_node(&client, &group, &excluded, &[(names::LABEL_EXCLUDE_FROM_LB, "true")]).await;
    wait_for("a node sync after the excluded node", Duration::from_secs(60), || async {
        (c.metric("service_controller_nodesync_latency_seconds_count") > syncs).then_some(())
    })
    .await;
    assert_eq!(
        lbs.calls.update.load(Ordering::SeqCst),
        0,
        "excluded node and NotReady node touch no LB"
    );

    // A normal node: every LB gets exactly one update, with bounded parallelism.
    lbs.set_latency(Duration::from_millis(100));
    lbs.calls.max_in_flight.store(0, Ordering::SeqCst);
    let n3 = ccm_testbed::unique_name("svc-node");
    let start = Instant::now();
    create_node(&client, &group, &n3, &[]).await;
    wait_for("every LB has the new node", Duration::from_secs(120), || async {
        lbs.all().values().all(|lb| lb.nodes.contains(&n3)).then_some(())
    })
    .await;
    let wall = start.elapsed();
    let max = lbs.calls.max_in_flight.load(Ordering::SeqCst);
    let updates = lbs.calls.update.load(Ordering::SeqCst);
    eprintln!(
        "node add → {SERVICES} LBs updated in {wall:?}: {updates} UpdateLoadBalancer calls \
         (100 ms cloud latency each), max {max} in flight (bound {WORKERS})"
    );
    assert_eq!(updates, SERVICES);
    for lb in lbs.all().values() {
        assert_eq!(lb.updates, 1);
        let mut want = vec![n1.clone(), n2.clone(), n3.clone()];
        want.sort();
        assert_eq!(lb.nodes, want, "NotReady node stays a backend, excluded one never is");
    }
    assert!(max > 1 && max <= WORKERS, "parallel but bounded: {max}");

    // Cluster-autoscaler taints n2 (no sync by itself, as upstream), then n3 is deleted: the
    // one resulting sync drops both from every LB, once per LB.
    let taint = json!({"spec": {"taints": [{"key": names::TAINT_TO_BE_DELETED, "value": "1",
        "effect": "NoSchedule"}]}});
    Api::<Node>::all(client.clone())
        .patch(&n2, &PatchParams::default(), &Patch::Merge(taint))
        .await
        .unwrap();
    let start = Instant::now();
    Api::<Node>::all(client.clone()).delete(&n3, &DeleteParams::default()).await.unwrap();
    wait_for(
        "every LB without the deleted and the tainted node",
        Duration::from_secs(120),
        || async { lbs.all().values().all(|lb| lb.nodes == [n1.clone()]).then_some(()) },
    )
    .await;
    eprintln!("node delete → {SERVICES} LBs updated in {:?}", start.elapsed());
    assert_eq!(lbs.calls.update.load(Ordering::SeqCst), 2 * SERVICES);
    // Upstream metric names: one configure per ensure and per host update.
    assert_eq!(c.metric("service_controller_loadbalancer_sync_total"), (3 * SERVICES) as f64);
    assert_eq!(c.metric("service_controller_nodesync_error_total"), 0.0);
    assert!(c.metric("service_controller_update_loadbalancer_host_latency_seconds_count") >= 400.0);

    // Cleanup: deleting the namespace's Services removes their load balancers.
    lbs.set_latency(Duration::ZERO);
    api.delete_collection(&DeleteParams::default(), &Default::default()).await.unwrap();
    wait_for("all load balancers deleted", Duration::from_secs(120), || async {
        lbs.all().is_empty().then_some(())
    })
    .await;
    delete_nodes(&client, &[n1, n2, n3, excluded]).await;
}

/// Issue #13 (2): one load balancer whose `EnsureLoadBalancer` never answers must not hold
/// back the backend updates of the others. 50 Services have load balancers, a 51st is stuck
/// in its ensure; two Nodes are added one after the other and all 50 load balancers get
/// each new node while the stuck ensure is still hanging. The deadline then ends the stuck
/// call: an error event, a retry, and once the cloud answers, a load balancer with every
/// node.
#[tokio::test]
async fn a_hung_ensure_holds_back_no_other_load_balancer() {
    const SERVICES: usize = 50;
    const DEADLINE: Duration = Duration::from_secs(30);
    // Its own control plane: the shared one's Service range (a /24) cannot hold these 51
    // Services next to the 200 of `node_changes_update_only_changed_load_balancers_in_parallel`.
    let cp = ControlPlane::start().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let ns = namespace(&client, "svc-hung").await;
    let group = ccm_testbed::unique_name("g");
    let n1 = ccm_testbed::unique_name("svc-node");
    create_node(&client, &group, &n1, &[]).await;
    let lbs = Arc::new(TestLoadBalancers::new());
    let config = ControllerConfig { load_balancer_call_timeout: DEADLINE, ..Default::default() };
    let _c = start_service(&client, &lbs, config, fast(&ns, &group));
    let api = Api::<Service>::namespaced(client.clone(), &ns);
    futures::stream::iter(0..SERVICES)
        .for_each_concurrent(10, |i| {
            let api = api.clone();
            let svc = lb_service(&ns, &format!("lb-{i}"), 80);
            async move {
                api.create(&PostParams::default(), &svc).await.unwrap();
            }
        })
        .await;
    wait_for("all load balancers with ingress", Duration::from_secs(120), || async {
        let list = api.list(&Default::default()).await.ok()?;
        (list.items.iter().filter(|s| ingress_ip(s).is_some()).count() == SERVICES).then_some(())
    })
    .await;

    lbs.set_service_fault(&ns, "stuck", Some(LbFault::HangEnsure));
    api.create(&PostParams::default(), &lb_service(&ns, "stuck", 80)).await.unwrap();
    wait_for("the stuck ensure hangs", Duration::from_secs(60), || async {
        (lbs.calls.hanging.load(Ordering::SeqCst) == 1).then_some(())
    })
    .await;
    let hung_at = Instant::now();

    let mut want = vec![n1.clone()];
    for round in 0..2 {
        let n = ccm_testbed::unique_name("svc-node");
        create_node(&client, &group, &n, &[]).await;
        want.push(n.clone());
        want.sort();
        let updated = || {
            lbs.all()
                .values()
                .filter(|lb| lb.service != format!("{ns}/stuck") && lb.nodes == want)
                .count()
        };
        wait_for(
            "every other load balancer has the new node",
            Duration::from_secs(120),
            || async { (updated() == SERVICES).then_some(()) },
        )
        .await;
        eprintln!(
            "node {round}: {SERVICES} load balancers updated {:?} after the stuck ensure started \
             ({} UpdateLoadBalancer calls so far)",
            hung_at.elapsed(),
            lbs.calls.update.load(Ordering::SeqCst)
        );
        assert_eq!(
            (lbs.calls.hung.load(Ordering::SeqCst), lbs.calls.hanging.load(Ordering::SeqCst)),
            (1, 1),
            "the updates happened while the first stuck ensure was still hanging"
        );
    }
    assert!(lbs.for_service(&ns, "stuck").is_none(), "no load balancer for the stuck one yet");

    // The deadline ends the stuck call: a sync error the user can see, then a retry.
    wait_for("SyncLoadBalancerFailed on the stuck service", Duration::from_secs(120), || async {
        event_reasons(&client, &ns, "stuck")
            .await
            .contains(&"SyncLoadBalancerFailed".to_string())
            .then_some(())
    })
    .await;
    let events =
        Api::<Event>::namespaced(client.clone(), &ns).list(&Default::default()).await.unwrap();
    let note = events
        .items
        .iter()
        .filter(|e| e.involved_object.name.as_deref() == Some("stuck"))
        .find(|e| e.reason.as_deref() == Some("SyncLoadBalancerFailed"))
        .and_then(|e| e.message.clone())
        .unwrap_or_default();
    assert!(note.contains("EnsureLoadBalancer") && note.contains("deadline"), "{note}");
    eprintln!("stuck ensure ended after {:?}: {note}", hung_at.elapsed());
    wait_for("the stuck service's ensure is retried", Duration::from_secs(120), || async {
        (lbs.calls.hung.load(Ordering::SeqCst) >= 2).then_some(())
    })
    .await;
    lbs.set_service_fault(&ns, "stuck", None);
    let svc =
        wait_for("the stuck service gets its load balancer", Duration::from_secs(180), || async {
            let s = api.get("stuck").await.ok()?;
            ingress_ip(&s).is_some().then_some(s)
        })
        .await;
    assert!(has_finalizer(&svc));
    assert_eq!(lbs.for_service(&ns, "stuck").unwrap().nodes, want, "ensured with every node");

    api.delete_collection(&DeleteParams::default(), &Default::default()).await.unwrap();
    wait_for("all load balancers deleted", Duration::from_secs(120), || async {
        lbs.all().is_empty().then_some(())
    })
    .await;
    delete_nodes(&client, &want).await;
}

/// Issue #13 point 7: the service controller's queues expose client-go's `workqueue_*`
/// series under upstream's queue names (`service`, and `node` for the node sync), so
/// dashboards and alerts written for the Go controller manager work unchanged.
#[tokio::test]
async fn workqueue_metrics_use_upstream_names_and_labels() {
    let cp = ControlPlane::shared().await.unwrap();
    let _g = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let ns = namespace(&client, "svc-wq").await;
    let group = ccm_testbed::unique_name("g");
    let node = ccm_testbed::unique_name("svc-wq-node");
    create_node(&client, &group, &node, &[]).await;
    let lbs = Arc::new(TestLoadBalancers::new());
    let c = start_service(&client, &lbs, ControllerConfig::default(), fast(&ns, &group));
    let api = Api::<Service>::namespaced(client.clone(), &ns);

    api.create(&PostParams::default(), &lb_service(&ns, "web", 80)).await.unwrap();
    wait_for("finalizer and ingress", Duration::from_secs(60), || async {
        let s = api.get("web").await.ok()?;
        (has_finalizer(&s) && ingress_ip(&s).is_some()).then_some(())
    })
    .await;
    // The worker marks the key done right after the sync: poll until it is observed.
    wait_for("a finished work item of queue service", Duration::from_secs(60), || async {
        let done = c.sample(r#"workqueue_work_duration_seconds_count{name="service"}"#)?;
        let depth = c.sample(r#"workqueue_depth{name="service"}"#)?;
        (done >= 1.0 && depth == 0.0).then_some(())
    })
    .await;

    let text = c.encoded();
    let service = |series: &str| c.sample(&format!("{series}{{name=\"service\"}}"));
    assert!(service("workqueue_adds_total").is_some_and(|n| n >= 1.0), "{text}");
    assert_eq!(service("workqueue_depth"), Some(0.0), "{text}");
    assert!(service("workqueue_queue_duration_seconds_count").is_some_and(|n| n >= 1.0));
    assert!(service("workqueue_work_duration_seconds_count").is_some_and(|n| n >= 1.0));
    assert_eq!(service("workqueue_retries_total"), Some(0.0), "no sync failed: {text}");
    assert_eq!(service("workqueue_unfinished_work_seconds"), Some(0.0), "{text}");
    assert_eq!(service("workqueue_longest_running_processor_seconds"), Some(0.0), "{text}");
    // The node sync runs through upstream's `node` queue; the Node above triggered it.
    wait_for("a node-sync pass", Duration::from_secs(60), || async {
        let done = c.sample(r#"workqueue_work_duration_seconds_count{name="node"}"#)?;
        (done >= 1.0 && c.sample(r#"workqueue_adds_total{name="node"}"#)? >= 1.0).then_some(())
    })
    .await;
    // Exactly client-go's families and types: one of each, nothing else named workqueue_.
    let mut families: Vec<&str> =
        text.lines().filter(|l| l.starts_with("# TYPE workqueue_")).collect();
    families.sort_unstable();
    assert_eq!(
        families,
        vec![
            "# TYPE workqueue_adds counter",
            "# TYPE workqueue_depth gauge",
            "# TYPE workqueue_longest_running_processor_seconds gauge",
            "# TYPE workqueue_queue_duration_seconds histogram",
            "# TYPE workqueue_retries counter",
            "# TYPE workqueue_unfinished_work_seconds gauge",
            "# TYPE workqueue_work_duration_seconds histogram",
        ],
        "{text}"
    );
    // The only label besides a histogram's `le` is `name`.
    for line in text.lines().filter(|l| l.starts_with("workqueue_")) {
        let labels = line.split_once('{').and_then(|(_, r)| r.split_once('}')).map(|(l, _)| l);
        let keys: Vec<&str> = labels
            .unwrap_or_default()
            .split(',')
            .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
            .filter(|k| *k != "le")
            .collect();
        assert_eq!(keys, vec!["name"], "{line}");
    }

    // A failing sync is retried through the queue: `workqueue_retries_total` counts it.
    lbs.set_fault(Some(LbFault::Unavailable));
    let patch = json!({"spec": {"ports": [{"port": 81, "protocol": "TCP"}]}});
    api.patch("web", &PatchParams::default(), &Patch::Merge(patch)).await.unwrap();
    wait_for("a retry of queue service", Duration::from_secs(60), || async {
        (c.sample(r#"workqueue_retries_total{name="service"}"#)? >= 1.0).then_some(())
    })
    .await;
    lbs.set_fault(None);
    wait_for("load balancer on port 81", Duration::from_secs(60), || async {
        (lbs.for_service(&ns, "web")?.ports == vec![81]).then_some(())
    })
    .await;

    api.delete("web", &DeleteParams::default()).await.unwrap();
    wait_for("service gone", Duration::from_secs(60), || async {
        matches!(api.get("web").await, Err(kube::Error::Api(s)) if s.code == 404).then_some(())
    })
    .await;
    delete_nodes(&client, &[node]).await;
}
