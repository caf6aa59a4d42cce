//! The core service controller driving this provider, against the testbed's real
//! kube-apiserver and the IBM emulator (issue #33 item 11): nothing waits for IBM's pending
//! states. Each test scopes the controller to its own namespace and to Nodes carrying its own
//! group label, so the tests share one control plane.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_core::cloud::CloudProvider;
use ccm_core::controllers::service::{self, ServiceOptions};
use ccm_core::controllers::{ControllerConfig, ControllerContext, Started};
use ccm_core::manager::CancellationToken;
use ccm_core::names;
use ccm_emulators::ibm::IbmOptions;
use ccm_provider_ibm::IbmProvider;
use ccm_testbed::fixtures::load_balancer_service;
use ccm_testbed::{ControlPlane, unique_name, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Node, Service, ServicePort};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::fixture::{Fixture, iks_labels, start_with};

/// Label that gives each test its own Nodes.
pub const GROUP_LABEL: &str = "ccm-test.example.com/group";

pub async fn namespace(client: &Client, prefix: &str) -> String {
    let name = unique_name(prefix);
    let ns = Namespace {
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
    name
}

/// Nodes as IKS registers them (provisioner labels, the fixture world's IPs), in `group`.
pub async fn group_nodes(client: &Client, group: &str, ips: &[(&str, &str)]) -> Vec<String> {
    let api = Api::<Node>::all(client.clone());
    let mut names = Vec::new();
    for (i, (ip, zone)) in ips.iter().enumerate() {
        let name = unique_name(&format!("ibm-node-{i}"));
        let worker = format!("kube-clus1-default-0000{i:04}");
        let mut labels: std::collections::BTreeMap<String, String> = iks_labels(&worker, ip, zone)
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        labels.insert(GROUP_LABEL.into(), group.into());
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some(labels),
                ..Default::default()
            },
            ..Default::default()
        };
        api.create(&PostParams::default(), &node).await.unwrap();
        names.push(name);
    }
    names
}

pub async fn delete_nodes(client: &Client, names: &[String]) {
    let api = Api::<Node>::all(client.clone());
    for n in names {
        let _ = api.delete(n, &DeleteParams::default()).await;
    }
}

/// The service controller with `workers` workers on `provider`, scoped to `ns` and `group`.
pub fn start_controller(
    client: &Client,
    provider: Arc<dyn CloudProvider>,
    ns: &str,
    group: &str,
    workers: usize,
) -> CancellationToken {
    let token = CancellationToken::new();
    let ctx = ControllerContext {
        client: client.clone(),
        cloud: provider,
        config: Arc::new(ControllerConfig {
            concurrent_service_syncs: workers,
            ..ControllerConfig::default()
        }),
        metrics: Default::default(),
        shutdown: token.clone(),
        nodes: None,
    };
    let opts = ServiceOptions {
        min_retry_delay: Duration::from_millis(250),
        max_retry_delay: Duration::from_secs(2),
        namespace: Some(ns.into()),
        node_selector: Some(format!("{GROUP_LABEL}={group}")),
        ..Default::default()
    };
    match service::start_with(&ctx, opts).unwrap() {
        Started::Running(fut) => {
            tokio::spawn(fut);
        }
        Started::Skipped(why) => panic!("service controller skipped: {why}"),
    }
    token
}

pub fn hostname(svc: &Service) -> Option<String> {
    svc.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?.first()?.hostname.clone()
}

pub async fn lbs(f: &Fixture) -> Vec<Value> {
    let state = f.server.admin().state().await.unwrap();
    state["cloud"]["load_balancers"].as_array().cloned().unwrap_or_default()
}

pub async fn lb_named(f: &Fixture, name: &str) -> Option<Value> {
    lbs(f).await.into_iter().find(|l| l["name"] == name)
}

/// An emulator that holds every load balancer change pending for 10 minutes (until the test
/// completes it), and a provider retrying every 100 ms.
async fn held() -> Fixture {
    start_with(
        IbmOptions { lb_pending: Duration::from_secs(600), ..IbmOptions::default() },
        ccm_provider_ibm::client::ClientOptions::default(),
    )
    .await
}

/// While the emulator holds a new load balancer `create_pending` (as IBM does for minutes),
/// the Service already has its hostname (IBM assigns it with the create, upstream returns it);
/// a second Service created meanwhile gets its own at once through the same single worker
/// (before: the worker polled the first load balancer until `active`, up to its 2-minute
/// wait, so the second Service waited behind it). A port added while the load balancer is
/// pending is applied once it is `active` (a retry, not a wait), and while IBM deletes a
/// Service's load balancer another Service gets its hostname (the deleted Service keeps its
/// finalizer until the load balancer is gone).
#[tokio::test]
async fn hostnames_come_while_create_pending_and_one_slow_load_balancer_blocks_no_other_service() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = held().await;
    let provider: Arc<IbmProvider> = Arc::new(crate::fixture::provider_with_timings(
        &f,
        ccm_provider_ibm::load_balancer::Timings {
            poll: Duration::from_millis(100),
            max_wait: Duration::from_secs(60),
        },
    ));
    let ns = namespace(&client, "ibm-nb").await;
    let group = unique_name("g");
    let nodes = group_nodes(&client, &group, &[("10.240.0.4", "us-south-1")]).await;
    let stop = start_controller(&client, provider.clone(), &ns, &group, 1);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);

    let t = Instant::now();
    let a = services
        .create(&PostParams::default(), &load_balancer_service(&ns, "a", 80))
        .await
        .unwrap();
    let host_a = wait_for("Service a's hostname", Duration::from_secs(30), || async {
        hostname(&services.get("a").await.ok()?)
    })
    .await;
    let name_a = format!("kube-clus1-{}", a.metadata.uid.as_deref().unwrap().replace('-', ""));
    let lb_a = lb_named(&f, &name_a).await.expect("Service a's load balancer");
    assert_eq!(lb_a["provisioning_status"], "create_pending", "{lb_a}");
    assert_eq!(lb_a["hostname"].as_str(), Some(host_a.as_str()));

    let b = services
        .create(&PostParams::default(), &load_balancer_service(&ns, "b", 81))
        .await
        .unwrap();
    let host_b = wait_for("Service b's hostname", Duration::from_secs(30), || async {
        hostname(&services.get("b").await.ok()?)
    })
    .await;
    let both = t.elapsed();
    let name_b = format!("kube-clus1-{}", b.metadata.uid.as_deref().unwrap().replace('-', ""));
    for name in [&name_a, &name_b] {
        let lb = lb_named(&f, name).await.unwrap();
        assert_eq!(lb["provisioning_status"], "create_pending", "still pending: {lb}");
    }
    assert_ne!(host_a, host_b);
    println!("two hostnames while both load balancers are create_pending: {both:?}");

    // A port added while Service a's load balancer is pending: retried, not waited for.
    let mut ports = a.spec.clone().unwrap().ports.unwrap();
    ports[0].name = Some("http".into());
    ports.push(ServicePort {
        name: Some("https".into()),
        port: 443,
        protocol: Some("TCP".into()),
        ..Default::default()
    });
    services
        .patch("a", &PatchParams::default(), &Patch::Merge(json!({"spec": {"ports": ports}})))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let pending = lb_named(&f, &name_a).await.unwrap();
    assert_eq!(pending["listeners"].as_array().unwrap().len(), 1, "nothing sent while pending");
    f.cloud.set_lb_pending(Duration::from_millis(200));
    f.cloud.complete_pending();
    wait_for("the second listener of Service a", Duration::from_secs(30), || async {
        let lb = lb_named(&f, &name_a).await?;
        (lb["listeners"].as_array()?.len() == 2 && lb["provisioning_status"] == "active")
            .then_some(())
    })
    .await;

    // Deleting is a retry, not a wait: while IBM deletes Service b's load balancer (the
    // Service keeps its finalizer until it is gone), a new Service c gets its hostname
    // through the same single worker.
    f.cloud.set_lb_pending(Duration::from_secs(10));
    services.delete("b", &DeleteParams::default()).await.unwrap();
    wait_for("Service b's load balancer delete_pending", Duration::from_secs(30), || async {
        (lb_named(&f, &name_b).await?["provisioning_status"] == "delete_pending").then_some(())
    })
    .await;
    services.create(&PostParams::default(), &load_balancer_service(&ns, "c", 82)).await.unwrap();
    wait_for("Service c's hostname", Duration::from_secs(30), || async {
        hostname(&services.get("c").await.ok()?)
    })
    .await;
    let b_now = services.get_opt("b").await.unwrap();
    let b_lb = lb_named(&f, &name_b).await;
    assert!(
        b_now.is_some() && b_lb.is_some(),
        "b (finalizer) and its load balancer still there while IBM deletes: {b_lb:?}"
    );
    wait_for("Service b gone with its load balancer", Duration::from_secs(30), || async {
        (services.get_opt("b").await.ok()?.is_none() && lb_named(&f, &name_b).await.is_none())
            .then_some(())
    })
    .await;
    let fin = services.get("a").await.unwrap();
    assert!(
        fin.metadata.finalizers.iter().flatten().any(|x| x == names::FINALIZER_LB_CLEANUP),
        "Service a keeps its finalizer"
    );
    stop.cancel();
    for name in ["a", "c"] {
        let _ = services.delete(name, &DeleteParams::default()).await;
        let _ = services
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
    delete_nodes(&client, &nodes).await;
}
