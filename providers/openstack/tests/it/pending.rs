//! Nothing waits for Octavia's `PENDING_*` states (issue #35): the core service controller
//! with ONE worker against the testbed's real kube-apiserver and an emulator that holds every
//! load-balancer change pending (as Octavia does for minutes while it boots an amphora) until
//! the test lets it finish. A pending load balancer is a retry, not a wait, so the worker
//! goes on to the next Service, and each sync resumes from what exists. Also: VIPs come from
//! the subnet's whole allocation pool (the 60th load balancer gets one).

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::{CloudProvider, LoadBalancer, ProviderError, ProviderInit};
use ccm_core::controllers::service::{self, ServiceOptions};
use ccm_core::controllers::{ControllerConfig, ControllerContext, Started};
use ccm_core::manager::CancellationToken;
use ccm_core::names;
use ccm_emulators::openstack::OpenStackOptions;
use ccm_emulators::server::ServerOptions;
use ccm_provider_openstack::OpenStackProvider;
use ccm_provider_openstack::config::{Config, LoadBalancerOpts};
use ccm_provider_openstack::load_balancer::{OctaviaLoadBalancer, Timings};
use ccm_testbed::fixtures::{load_balancer_service, node_address};
use ccm_testbed::{ControlPlane, unique_name, wait_for};
use k8s_openapi::api::core::v1::{
    Namespace, Node, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec,
};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::fixture::{Fixture, fast_options, provider_id, start_with};

/// Label that gives each test its own Nodes.
const GROUP_LABEL: &str = "ccm-test.example.com/group";

/// Two servers on `private-subnet` (10.0.0.0/24).
const WORLD: &str = r#"
region: RegionOne
zones: [az-1]
networks:
  - { name: private, cidr: 10.0.0.0/16 }
subnets:
  - { name: private-subnet, network: private, zone: az-1, cidr: 10.0.0.0/24 }
instances:
  - { name: node-a, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.11] }
  - { name: node-b, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.12] }
"#;

/// An emulator holding every load-balancer change pending for 10 minutes (until the test
/// completes it), with room for this test's floating IPs.
async fn held() -> Fixture {
    let opts = OpenStackOptions { lb_pending: Duration::from_secs(600), ..Default::default() };
    let f = start_with(WORLD, opts, fast_options(), ServerOptions::default()).await;
    f.cloud.set_floating_ip_quota(1000);
    f
}

/// The provider as the manager runs it (the default timings), retrying after 1 s.
fn provider(f: &Fixture, client: &Client) -> Arc<dyn CloudProvider> {
    let timings = Timings { poll: Duration::from_millis(100), ..Timings::default() };
    let p = OpenStackProvider::new(f.config.clone(), fast_options(), timings).unwrap();
    p.initialize(ProviderInit::new(client.clone(), CancellationToken::new())).unwrap();
    Arc::new(p)
}

async fn namespace(client: &Client, prefix: &str) -> String {
    let name = unique_name(prefix);
    let ns = Namespace {
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
    name
}

/// The world's two servers as initialised Nodes (providerID, InternalIP) in `group`.
async fn group_nodes(f: &Fixture, client: &Client, group: &str) -> Vec<String> {
    let api = Api::<Node>::all(client.clone());
    let mut names = Vec::new();
    for (server, ip) in [("node-a", "10.0.0.11"), ("node-b", "10.0.0.12")] {
        let name = unique_name(server);
        let node = Node {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([(GROUP_LABEL.to_string(), group.to_string())].into()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(provider_id(f, server)),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(vec![node_address("InternalIP", ip)]),
                ..Default::default()
            }),
        };
        api.create(&PostParams::default(), &node).await.unwrap();
        names.push(name);
    }
    names
}

/// The service controller with ONE worker (upstream's default `--concurrent-service-syncs`),
/// scoped to `ns` and `group`.
fn start_controller(
    client: &Client,
    provider: Arc<dyn CloudProvider>,
    ns: &str,
    group: &str,
) -> CancellationToken {
    let token = CancellationToken::new();
    let ctx = ControllerContext {
        client: client.clone(),
        cloud: provider,
        config: Arc::new(ControllerConfig {
            concurrent_service_syncs: 1,
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

fn address(svc: &Service) -> Option<String> {
    svc.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?.first()?.ip.clone()
}

fn lb_name(ns: &str, name: &str) -> String {
    format!("kube_service_kubernetes_{ns}_{name}")
}

/// The emulator's load balancer named `name`, as Octavia shows it.
async fn lb_named(f: &Fixture, name: &str) -> Option<Value> {
    f.cloud.octavia_objects("loadbalancers").into_iter().find(|l| l["name"] == name)
}

fn status(lb: &Value) -> String {
    lb["provisioning_status"].as_str().unwrap_or_default().to_string()
}

fn count(f: &Fixture, op: &str) -> u64 {
    f.server.counters().get(op)
}

async fn clean_up(client: &Client, ns: &str, services: &[&str], nodes: &[String]) {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    for name in services {
        let _ = api.delete(name, &DeleteParams::default()).await;
        let _ = api
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"finalizers": null}})),
            )
            .await;
    }
    let nodes_api = Api::<Node>::all(client.clone());
    for n in nodes {
        let _ = nodes_api.delete(n, &DeleteParams::default()).await;
    }
}

/// N Services created at once with ONE service worker: while Octavia holds the first load
/// balancer `PENDING_CREATE`, the worker has already sent the creates of all N (each sync
/// returns a retry instead of waiting), so all N are provisioned in the time of one create,
/// not N. No Service shows an address while its load balancer is pending. Once Octavia
/// finishes, every Service gets its own floating IP, and every step was sent once: N load
/// balancers, listeners, pools, member updates (the syncs resumed, nothing made twice).
/// Before (the sync waited for ACTIVE, up to 5 minutes per step), the worker held the first
/// Service until its load balancer was ACTIVE: one create, then nothing for minutes.
#[tokio::test]
async fn services_created_at_once_are_all_created_while_the_first_is_pending() {
    const N: usize = 6;
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = held().await;
    let ns = namespace(&client, "os-pending").await;
    let group = unique_name("g");
    let nodes = group_nodes(&f, &client, &group).await;
    let stop = start_controller(&client, provider(&f, &client), &ns, &group);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let names: Vec<String> = (0..N).map(|i| format!("svc-{i}")).collect();
    for (i, name) in names.iter().enumerate() {
        let svc = load_balancer_service(&ns, name, 80 + i as i32);
        services.create(&PostParams::default(), &svc).await.unwrap();
    }

    // All N load balancers exist while Octavia still holds every one PENDING_CREATE.
    let lbs = wait_for("all load balancers created", Duration::from_secs(60), || async {
        let lbs: Vec<Value> = f
            .cloud
            .octavia_objects("loadbalancers")
            .into_iter()
            .filter(|l| names.iter().any(|n| l["name"] == lb_name(&ns, n)))
            .collect();
        (lbs.len() == N).then_some(lbs)
    })
    .await;
    for lb in &lbs {
        assert_eq!(status(lb), "PENDING_CREATE", "nothing waited for ACTIVE: {lb}");
    }
    for name in &names {
        let svc = services.get(name).await.unwrap();
        assert_eq!(address(&svc), None, "no address while pending: {name}");
    }
    assert_eq!(count(&f, "octavia.loadbalancers.create"), N as u64);
    assert_eq!(count(&f, "octavia.listeners.create"), 0, "nothing sent to a pending one");

    // Octavia finishes; later steps take 100 ms each.
    f.cloud.set_lb_pending(Duration::from_millis(100));
    f.cloud.complete_pending();
    let addresses = wait_for("every Service's address", Duration::from_secs(90), || async {
        let mut out = Vec::new();
        for name in &names {
            out.push(address(&services.get(name).await.ok()?)?);
        }
        Some(out)
    })
    .await;
    let distinct: std::collections::BTreeSet<&String> = addresses.iter().collect();
    assert_eq!(distinct.len(), N, "each its own address: {addresses:?}");
    let fips: Vec<String> = f
        .cloud
        .objects("floatingips")
        .iter()
        .filter(|x| !x["port_id"].is_null())
        .filter_map(|x| x["floating_ip_address"].as_str().map(str::to_string))
        .collect();
    for a in &addresses {
        assert!(fips.contains(a), "the address is the load balancer's floating IP: {a}");
    }
    // Each step sent once per Service: the syncs resumed from what existed.
    assert_eq!(count(&f, "octavia.loadbalancers.create"), N as u64);
    assert_eq!(count(&f, "octavia.listeners.create"), N as u64);
    assert_eq!(count(&f, "octavia.pools.create"), N as u64);
    assert_eq!(count(&f, "octavia.members.batch_update"), N as u64);
    assert_eq!(f.cloud.octavia_objects("members").len(), 2 * N, "two nodes per pool");
    // A pending load balancer is a retry, not a failure: Octavia's version was read once
    // (it was read again on every retry, 680 times in the 40-at-once benchmark).
    assert_eq!(count(&f, "octavia.versions"), 1, "Octavia's version read once");
    stop.cancel();
    let refs: Vec<&str> = names.iter().map(String::as_str).collect();
    clean_up(&client, &ns, &refs, &nodes).await;
}

/// A Service deleted while its load balancer is `PENDING_CREATE`: the delete is a retry, not
/// a wait — meanwhile the single worker creates another Service's load balancer — and it
/// resumes once Octavia lets it: the load balancer and the floating IP go, then the
/// finalizer, and the Service is gone. Before, the worker waited for the pending load
/// balancer inside the delete (up to 5 minutes) and the other Service waited behind it.
#[tokio::test]
async fn a_delete_while_pending_resumes_and_completes_without_holding_the_worker() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let mut f = held().await;
    f.config.load_balancer.manage_security_groups = true;
    let ns = namespace(&client, "os-pdel").await;
    let group = unique_name("g");
    let nodes = group_nodes(&f, &client, &group).await;
    let stop = start_controller(&client, provider(&f, &client), &ns, &group);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);

    services.create(&PostParams::default(), &load_balancer_service(&ns, "a", 80)).await.unwrap();
    let (name_a, name_b) = (lb_name(&ns, "a"), lb_name(&ns, "b"));
    wait_for("a's load balancer PENDING_CREATE", Duration::from_secs(30), || async {
        (status(&lb_named(&f, &name_a).await?) == "PENDING_CREATE").then_some(())
    })
    .await;
    wait_for("a's finalizer", Duration::from_secs(30), || async {
        let a = services.get("a").await.ok()?;
        a.metadata
            .finalizers
            .iter()
            .flatten()
            .any(|x| x == names::FINALIZER_LB_CLEANUP)
            .then_some(())
    })
    .await;
    services.delete("a", &DeleteParams::default()).await.unwrap();
    services.create(&PostParams::default(), &load_balancer_service(&ns, "b", 81)).await.unwrap();
    wait_for("b's load balancer created meanwhile", Duration::from_secs(30), || async {
        lb_named(&f, &name_b).await.map(|_| ())
    })
    .await;
    assert!(services.get_opt("a").await.unwrap().is_some(), "a keeps its finalizer while pending");
    assert_eq!(status(&lb_named(&f, &name_a).await.unwrap()), "PENDING_CREATE");

    // Octavia finishes: a's deletion resumes (it takes 2 s: the finalizer stays until the
    // load balancer is gone), b is completed.
    f.cloud.set_lb_pending(Duration::from_millis(100));
    f.cloud.complete_pending();
    f.cloud.set_lb_pending(Duration::from_secs(2));
    wait_for("a gone with its load balancer", Duration::from_secs(60), || async {
        let gone = services.get_opt("a").await.ok()?.is_none();
        if gone {
            assert!(
                lb_named(&f, &name_a).await.is_none(),
                "finalizer removed before the load balancer went"
            );
        }
        gone.then_some(())
    })
    .await;
    let b = wait_for("b's address", Duration::from_secs(60), || async {
        address(&services.get("b").await.ok()?)
    })
    .await;
    let fips: Vec<Value> = f.cloud.objects("floatingips");
    let addresses: Vec<&str> =
        fips.iter().filter_map(|x| x["floating_ip_address"].as_str()).collect();
    assert_eq!(addresses, [b.as_str()], "only b's floating IP: {fips:?}");
    let groups = |f: &Fixture| -> Vec<String> {
        f.cloud
            .objects("security-groups")
            .iter()
            .filter_map(|g| g["name"].as_str().map(str::to_string))
            .filter(|n| n.starts_with("lb-sg-"))
            .collect()
    };
    assert_eq!(groups(&f).len(), 1, "b's managed security group: {:?}", groups(&f));

    // b, fully ensured, deleted while Octavia takes 2 s to delete its load balancer: the
    // deletion is resumed until it is gone, and nothing of b's is left — its security group
    // too (the service controller stops calling once Octavia no longer shows the load
    // balancer, so the group goes while Octavia deletes it).
    services.delete("b", &DeleteParams::default()).await.unwrap();
    wait_for("b gone", Duration::from_secs(60), || async {
        services.get_opt("b").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(lb_named(&f, &name_b).await.is_none(), "b's load balancer gone before its finalizer");
    assert!(groups(&f).is_empty(), "b's security group left: {:?}", groups(&f));
    assert!(f.cloud.objects("floatingips").is_empty(), "b's floating IP deleted");
    stop.cancel();
    clean_up(&client, &ns, &["a", "b"], &nodes).await;
}

/// VIPs come from the subnet's whole allocation pool (before: hosts .200–.253 only, so the 55th load balancer of a subnet got
/// Octavia's 409 "No more IP addresses available"). Sixty internal Services on one /24 each
/// get their own VIP, the 60th too.
#[tokio::test]
async fn the_sixtieth_load_balancer_of_a_subnet_gets_its_vip() {
    let opts = OpenStackOptions { lb_pending: Duration::ZERO, ..Default::default() };
    let f = start_with(WORLD, opts, fast_options(), ServerOptions::default()).await;
    let config = Config { load_balancer: LoadBalancerOpts::default(), ..f.config.clone() };
    let lb = OctaviaLoadBalancer::new(
        Arc::clone(&f.client),
        Arc::new(config),
        Timings { poll: Duration::from_millis(20), max_wait: Duration::ZERO },
    );
    let nodes = vec![Node {
        metadata: ObjectMeta { name: Some("node-a".into()), ..Default::default() },
        spec: Some(NodeSpec { provider_id: Some(provider_id(&f, "node-a")), ..Default::default() }),
        status: Some(NodeStatus {
            addresses: Some(vec![node_address("InternalIP", "10.0.0.11")]),
            ..Default::default()
        }),
    }];
    let mut vips = std::collections::BTreeSet::new();
    for i in 0..60 {
        let svc =
            internal_service(&format!("svc-{i}"), &format!("00000000-0000-0000-0000-{i:012}"));
        let status = ensure_until_done(&lb, &svc, &nodes).await;
        let ip = status.ingress.unwrap()[0].ip.clone().unwrap();
        assert!(ip.starts_with("10.0.0."), "the VIP of an internal Service: {ip}");
        assert!(vips.insert(ip.clone()), "VIP {ip} twice");
    }
    assert_eq!(vips.len(), 60);
    assert_eq!(f.cloud.octavia_objects("loadbalancers").len(), 60);
}

/// An internal `type: LoadBalancer` Service `default/<name>` (its address is the VIP).
pub fn internal_service(name: &str, uid: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            annotations: Some(
                [(
                    "service.beta.kubernetes.io/openstack-internal-load-balancer".to_string(),
                    "true".to_string(),
                )]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port: 80,
                node_port: Some(30080),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Syncs `svc` as the service controller does: again after each retry the provider asks for
/// (a pending load balancer), until it is ensured.
pub async fn ensure_until_done(
    lb: &OctaviaLoadBalancer,
    svc: &Service,
    nodes: &[Node],
) -> k8s_openapi::api::core::v1::LoadBalancerStatus {
    for _ in 0..200 {
        match lb.ensure_load_balancer("kubernetes", svc, nodes).await {
            Ok(status) => return status,
            Err(ProviderError::RetryAfter { .. }) => {
                tokio::time::sleep(Duration::from_millis(25)).await;
            }
            Err(e) => panic!("ensure failed: {e}"),
        }
    }
    panic!("not ensured after 200 syncs");
}

/// A create Octavia fails while nobody waits for it (the kit's operation failure): the sync
/// that finds this cluster's new load balancer `ERROR` with nothing on it deletes it, as
/// upstream deletes a new load balancer that lands in `ERROR`, and says so; a later sync
/// creates it afresh and the Service gets its address.
#[tokio::test]
async fn a_create_that_fails_while_pending_is_replaced_by_a_later_sync() {
    use ccm_emulators::asyncop::ActionMatch;
    let opts = OpenStackOptions { lb_pending: Duration::from_millis(200), ..Default::default() };
    let f = start_with(WORLD, opts, fast_options(), ServerOptions::default()).await;
    let lb = OctaviaLoadBalancer::new(
        Arc::clone(&f.client),
        Arc::new(f.config.clone()),
        Timings { poll: Duration::from_millis(20), ..Timings::default() },
    );
    let nodes = vec![Node {
        metadata: ObjectMeta { name: Some("node-a".into()), ..Default::default() },
        spec: Some(NodeSpec { provider_id: Some(provider_id(&f, "node-a")), ..Default::default() }),
        status: Some(NodeStatus {
            addresses: Some(vec![node_address("InternalIP", "10.0.0.11")]),
            ..Default::default()
        }),
    }];
    f.server
        .admin()
        .fail_operations("loadbalancer/*", ActionMatch::Create, 1, "No valid host was found")
        .await
        .unwrap();
    let svc = internal_service("web", "00000000-0000-0000-0002-000000000001");
    let first = lb.ensure_load_balancer("kubernetes", &svc, &nodes).await.unwrap_err();
    assert!(matches!(first, ProviderError::RetryAfter { .. }), "{first}");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let failed = f.cloud.octavia_objects("loadbalancers");
    assert_eq!(failed.len(), 1);
    assert_eq!(status(&failed[0]), "ERROR", "{failed:?}");
    let e = lb.ensure_load_balancer("kubernetes", &svc, &nodes).await.unwrap_err().to_string();
    assert!(e.contains("ERROR") && e.contains("was deleted"), "{e}");
    let got = ensure_until_done(&lb, &svc, &nodes).await;
    assert!(got.ingress.unwrap()[0].ip.is_some());
    let lbs = f.cloud.octavia_objects("loadbalancers");
    assert_eq!(lbs.len(), 1, "the failed one gone, a new one: {lbs:?}");
    assert_ne!(lbs[0]["id"], failed[0]["id"]);
    assert_eq!(lbs[0]["provisioning_status"], "ACTIVE");
}
