//! Issue #31 point 4 / #32 OpenStack items 3-4 on the emulator (and, where the provider writes
//! to Kubernetes, the testbed's real kube-apiserver): Octavia API version discovery and the
//! features gated on it, `provider-requires-serial-api-calls`, the `load-balancer-id` and
//! `load-balancer-address` annotations written back, the rename on a `--cluster-name`
//! change, a load balancer that goes `ERROR` on create, and a realistic (slow) Octavia.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_core::cloud::LoadBalancer;
use ccm_emulators::asyncop::{ActionMatch, TimingProfile};
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::openstack::OpenStackOptions;
use ccm_emulators::server::ServerOptions;
use ccm_provider_openstack::client::Service as Svc;
use ccm_provider_openstack::config::{Config, LoadBalancerOpts};
use ccm_provider_openstack::load_balancer::{OctaviaLoadBalancer, Timings};
use ccm_testbed::{ControlPlane, unique_name, wait_for};
use k8s_openapi::api::core::v1::{
    Event, Node, NodeAddress, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec,
};
use kube::Api;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::fixture::{Fixture, fast_options, provider_id, start_with};

const ID: &str = "loadbalancer.openstack.org/load-balancer-id";
const ADDRESS: &str = "loadbalancer.openstack.org/load-balancer-address";

/// Three servers on `private-subnet`.
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
  - { name: node-c, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.13] }
"#;

/// An emulator advertising Octavia up to v2.`minor`.
async fn start(minor: u32) -> Fixture {
    let opts = OpenStackOptions {
        lb_pending: Duration::from_millis(30),
        octavia_max_minor: minor,
        ..Default::default()
    };
    start_with(WORLD, opts, fast_options(), ServerOptions::default()).await
}

fn timings() -> Timings {
    Timings { poll: Duration::from_millis(20), max_wait: Duration::from_secs(20) }
}

fn lb_with(f: &Fixture, opts: LoadBalancerOpts) -> OctaviaLoadBalancer {
    let config = Config { load_balancer: opts, ..f.config.clone() };
    OctaviaLoadBalancer::new(Arc::clone(&f.client), Arc::new(config), timings())
}

fn node(f: &Fixture, name: &str) -> Node {
    let ip = match name {
        "node-a" => "10.0.0.11",
        "node-b" => "10.0.0.12",
        _ => "10.0.0.13",
    };
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec { provider_id: Some(provider_id(f, name)), ..Default::default() }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: ip.into() }]),
            ..Default::default()
        }),
    }
}

fn nodes(f: &Fixture, which: &[&str]) -> Vec<Node> {
    which.iter().map(|n| node(f, n)).collect()
}

/// A Service `default/<name>` (not in the API) with TCP port 80 on node port 30080.
fn service(name: &str, annotations: &[(&str, &str)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            annotations: Some(
                annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
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

fn objects(f: &Fixture, coll: &str) -> Vec<Value> {
    f.cloud.objects(coll)
}

fn versions_asked(f: &Fixture) -> u64 {
    f.server.counters().get("octavia.versions")
}

/// Below 2.5 no tags are written (that Octavia refuses the attribute), below 2.1 no timeouts,
/// below 2.12 no `allowed_cidrs`; ownership still rests on name and description: a load
/// balancer with the Service's name and another description is refused, and sharing by
/// `load-balancer-id` is refused without tags. The version is asked once.
#[tokio::test]
async fn features_follow_the_discovered_octavia_version() {
    for minor in [0u32, 4, 11, 27] {
        let f = start(minor).await;
        let lb = lb_with(&f, LoadBalancerOpts::default());
        let ns = nodes(&f, &["node-a", "node-b"]);
        let mut svc = service("web", &[]);
        svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["10.9.0.0/16".into()]);
        lb.ensure_load_balancer("k8s", &svc, &ns)
            .await
            .unwrap_or_else(|e| panic!("v2.{minor}: {e}"));
        // (The counter also counts osauth's own endpoint discovery of `/load-balancer/v2`.)
        let asked = versions_asked(&f);
        assert!(asked >= 1, "v2.{minor}: the version list was asked");
        lb.update_load_balancer("k8s", &svc, &ns).await.unwrap();
        lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
        assert_eq!(versions_asked(&f), asked, "v2.{minor}: cached, not asked again");
        let lbs = objects(&f, "loadbalancers");
        let listener = objects(&f, "listeners").pop().unwrap();
        let tags = |v: &Value| v["tags"].as_array().cloned().unwrap_or_default();
        assert_eq!(tags(&lbs[0]).is_empty(), minor < 5, "v2.{minor}: {}", lbs[0]);
        assert_eq!(tags(&listener).is_empty(), minor < 5, "v2.{minor}: {listener}");
        let cidrs = listener["allowed_cidrs"].as_array().cloned().unwrap_or_default();
        assert_eq!(cidrs.is_empty(), minor < 12, "v2.{minor}: {listener}");
        if minor >= 1 {
            assert_eq!(listener["timeout_client_data"], json!(50_000), "v2.{minor}: {listener}");
        }
        if minor < 5 {
            // Without tags the ownership proof is unchanged: another load balancer with a
            // Service's name but not its description is still refused, and a load balancer
            // that is not the Service's own cannot be shared.
            let other = service("api", &[(ID, lbs[0]["id"].as_str().unwrap())]);
            let e = lb.ensure_load_balancer("k8s", &other, &ns).await.unwrap_err().to_string();
            assert!(e.contains(ID) && e.contains("2.5"), "v2.{minor}: {e}");
            f.client
                .post(
                    "test:CreateLoadBalancer",
                    Svc::LoadBalancer,
                    &["lbaas", "loadbalancers"],
                    &json!({"loadbalancer": {"name": "kube_service_k8s_default_db",
                        "description": "hand-made", "vip_subnet_id": lbs[0]["vip_subnet_id"]}}),
                )
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            let db = service("db", &[]);
            let e = lb.ensure_load_balancer("k8s", &db, &ns).await.unwrap_err().to_string();
            assert!(e.contains("not created for it"), "v2.{minor}: {e}");
            lb.ensure_load_balancer_deleted("k8s", &db).await.unwrap();
            assert_eq!(
                objects(&f, "loadbalancers").len(),
                2,
                "v2.{minor}: the hand-made one stays"
            );
        }
        lb.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();
        assert!(
            objects(&f, "listeners").is_empty() && objects(&f, "floatingips").is_empty(),
            "v2.{minor}: deleted"
        );
    }
}

/// HTTP monitors on a UDP pool (externalTrafficPolicy Local) need 2.16: below, UDP-CONNECT.
#[tokio::test]
async fn http_monitors_on_udp_pools_need_api_2_16() {
    for (minor, want) in [(15u32, "UDP-CONNECT"), (16, "HTTP")] {
        let f = start(minor).await;
        let lb = lb_with(&f, LoadBalancerOpts { create_monitor: true, ..Default::default() });
        let mut svc = service("dns", &[]);
        let spec = svc.spec.as_mut().unwrap();
        spec.ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(31000);
        lb.ensure_load_balancer("k8s", &svc, &nodes(&f, &["node-a"]))
            .await
            .unwrap_or_else(|e| panic!("v2.{minor}: {e}"));
        let hm = objects(&f, "healthmonitors").pop().unwrap();
        assert_eq!(hm["type"], json!(want), "v2.{minor}: {hm}");
    }
}

/// A failed discovery is an error naming it (nothing created); the next reconcile asks again.
#[tokio::test]
async fn a_failed_version_discovery_is_an_error_and_asked_again() {
    let f = start(27).await;
    let lb = lb_with(&f, LoadBalancerOpts::default());
    let ns = nodes(&f, &["node-a"]);
    let svc = service("web", &[]);
    let fault = f
        .server
        .inject(FaultRule::new("octavia.versions", Fault::Status { status: 503, body: None }))
        .unwrap();
    let e = lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap_err().to_string();
    assert!(e.contains("Octavia API version discovery"), "{e}");
    assert!(objects(&f, "loadbalancers").is_empty());
    f.server.admin().remove_fault(fault).await.unwrap();
    lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    assert_eq!(objects(&f, "loadbalancers").len(), 1);
}

/// `provider-requires-serial-api-calls`: one member per call (created and deleted one by one,
/// waiting for ACTIVE after each), never the batch update.
#[tokio::test]
async fn serial_api_calls_change_one_member_per_call() {
    let f = start(27).await;
    let opts = LoadBalancerOpts { provider_requires_serial_api_calls: true, ..Default::default() };
    let lb = lb_with(&f, opts);
    let svc = service("web", &[]);
    lb.ensure_load_balancer("k8s", &svc, &nodes(&f, &["node-a", "node-b"])).await.unwrap();
    let c = f.server.counters();
    assert_eq!(c.get("octavia.members.create"), 2, "{:?}", c.operations);
    assert_eq!(c.get("octavia.members.batch_update"), 0);
    lb.update_load_balancer("k8s", &svc, &nodes(&f, &["node-b", "node-c"])).await.unwrap();
    let c = f.server.counters();
    assert_eq!(c.get("octavia.members.create"), 3, "{:?}", c.operations);
    assert_eq!(c.get("octavia.members.delete"), 1, "{:?}", c.operations);
    assert_eq!(c.get("octavia.members.batch_update"), 0);
    let mut addrs: Vec<String> =
        objects(&f, "members").iter().map(|m| m["address"].as_str().unwrap().to_string()).collect();
    addrs.sort();
    assert_eq!(addrs, ["10.0.0.12", "10.0.0.13"]);
    // Nothing to change: no member call at all.
    lb.update_load_balancer("k8s", &svc, &nodes(&f, &["node-b", "node-c"])).await.unwrap();
    let again = f.server.counters();
    assert_eq!(again.get("octavia.members.create") + again.get("octavia.members.delete"), 4);
}

/// A Service in the testbed's API server (`default`, unique name), as the controller sees it.
async fn api_service(client: &kube::Client, name: &str, annotations: &[(&str, &str)]) -> Service {
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let mut s = service(name, annotations);
    s.metadata.uid = None;
    s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = None;
    api.create(&PostParams::default(), &s).await.unwrap()
}

async fn fetch(client: &kube::Client, name: &str) -> Service {
    Api::<Service>::namespaced(client.clone(), "default").get(name).await.unwrap()
}

fn annotation(s: &Service, key: &str) -> Option<String> {
    s.metadata.annotations.as_ref().and_then(|a| a.get(key).cloned())
}

async fn events_of(client: &kube::Client, name: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    api.list(&lp).await.unwrap().items
}

/// The ID and the address are written back on the Service, as upstream; a second ensure
/// patches nothing. Below 2.12 the source ranges are a `LoadBalancerSourceRangesIgnored`
/// Warning from `cloud-provider-openstack` on the Service.
#[tokio::test]
async fn the_id_and_address_are_written_back_and_ignored_ranges_are_an_event() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = start(11).await;
    let lb = lb_with(&f, LoadBalancerOpts::default());
    lb.set_kube_client(client.clone());
    let name = unique_name("web");
    let svc = api_service(&client, &name, &[]).await;
    let ns = nodes(&f, &["node-a"]);
    let status = lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    let ip = status.ingress.unwrap()[0].ip.clone().unwrap();
    let fresh = fetch(&client, &name).await;
    let id = objects(&f, "loadbalancers")[0]["id"].as_str().unwrap().to_string();
    assert_eq!(annotation(&fresh, ID), Some(id));
    assert_eq!(annotation(&fresh, ADDRESS), Some(ip));
    // Again, with the written Service: nothing to write.
    lb.ensure_load_balancer("k8s", &fresh, &ns).await.unwrap();
    let same = fetch(&client, &name).await;
    assert_eq!(same.metadata.resource_version, fresh.metadata.resource_version);

    let ev = wait_for("the source-ranges Warning", Duration::from_secs(10), || async {
        events_of(&client, &name)
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("LoadBalancerSourceRangesIgnored"))
    })
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(ev.source.and_then(|s| s.component).as_deref(), Some("cloud-provider-openstack"));
    lb.ensure_load_balancer_deleted("k8s", &same).await.unwrap();
    assert!(objects(&f, "loadbalancers").is_empty());
}

/// A `--cluster-name` change renames the Service's own load balancer (found by its written-back
/// `load-balancer-id`, reported in its status) with its children and ownership records; a
/// Service of the other cluster pointing `load-balancer-id` at it without that proof is
/// refused and changes nothing.
#[tokio::test]
async fn a_cluster_name_change_renames_only_a_proven_own_load_balancer() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = start(27).await;
    let lb = lb_with(
        &f,
        LoadBalancerOpts {
            create_monitor: true,
            manage_security_groups: true,
            ..Default::default()
        },
    );
    lb.set_kube_client(client.clone());
    let name = unique_name("web");
    let svc = api_service(&client, &name, &[]).await;
    let ns = nodes(&f, &["node-a", "node-b"]);
    let status = lb.ensure_load_balancer("old", &svc, &ns).await.unwrap();
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let body = json!({"status": {"loadBalancer": serde_json::to_value(&status).unwrap()}});
    api.patch_status(&name, &PatchParams::default(), &Patch::Merge(&body)).await.unwrap();
    let written = fetch(&client, &name).await;
    let id = annotation(&written, ID).unwrap();

    // Another cluster's Service of the same name, pointing at it without the status proof.
    let before: Vec<Vec<Value>> = ["loadbalancers", "listeners", "pools", "floatingips"]
        .iter()
        .map(|c| objects(&f, c))
        .collect();
    let mut intruder = service(&name, &[(ID, id.as_str())]);
    intruder.metadata.uid = Some("another-uid".into());
    let e = lb.ensure_load_balancer("new", &intruder, &ns).await.unwrap_err().to_string();
    assert!(e.contains(ID) && e.contains("not renamed"), "{e}");
    let after: Vec<Vec<Value>> = ["loadbalancers", "listeners", "pools", "floatingips"]
        .iter()
        .map(|c| objects(&f, c))
        .collect();
    assert_eq!(before, after, "nothing changed");

    // The cluster's own Service after the rename.
    let fip_updates_before = f.server.counters().get("neutron.floatingips.update");
    let status = lb.ensure_load_balancer("new", &written, &ns).await.unwrap();
    let lbs = objects(&f, "loadbalancers");
    assert_eq!(lbs.len(), 1, "renamed, not re-created: {lbs:?}");
    let new_name = format!("kube_service_new_default_{name}");
    assert_eq!(lbs[0]["name"], json!(new_name));
    assert_eq!(
        lbs[0]["description"],
        json!(format!("Kubernetes external service default/{name} from cluster new"))
    );
    assert_eq!(lbs[0]["tags"], json!([new_name]));
    assert_eq!(objects(&f, "listeners")[0]["name"], json!(format!("listener_0_{new_name}")));
    assert_eq!(objects(&f, "pools")[0]["name"], json!(format!("pool_0_{new_name}")));
    assert_eq!(objects(&f, "healthmonitors")[0]["name"], json!(format!("monitor_0_{new_name}")));
    let fip = objects(&f, "floatingips").pop().unwrap();
    // Its ownership record is moved to the new cluster: one Neutron update of the floating
    // IP's description (the emulator's floating-IP update applies only `port_id` today, so
    // the stored description is not checked here).
    assert_eq!(f.server.counters().get("neutron.floatingips.update") - fip_updates_before, 1);
    assert_eq!(status.ingress.unwrap()[0].ip.as_deref(), fip["floating_ip_address"].as_str());
    let ev = wait_for("the rename Warning", Duration::from_secs(10), || async {
        events_of(&client, &name)
            .await
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("LoadBalancerRename"))
    })
    .await;
    assert!(ev.message.unwrap_or_default().contains(&new_name));
    // The new cluster deletes it (its ownership records now name it), its security group too.
    lb.ensure_load_balancer_deleted("new", &written).await.unwrap();
    for coll in ["loadbalancers", "listeners"] {
        assert!(objects(&f, coll).is_empty(), "{coll}: {:?}", objects(&f, coll));
    }
    assert_eq!(objects(&f, "security-groups").len(), 1, "only the default group is left");
}

/// A load balancer whose creation ends in Octavia `ERROR` (the kit's operation failure): the
/// ensure fails naming it, the ERROR load balancer (ours) is deleted and nothing else is, and
/// the next sync creates it afresh, as upstream.
#[tokio::test]
async fn a_load_balancer_going_error_on_create_is_replaced_on_the_next_sync() {
    let f = start(27).await;
    let lb = lb_with(&f, LoadBalancerOpts::default());
    let ns = nodes(&f, &["node-a"]);
    // Another Service's load balancer, which must survive.
    let other = service("other", &[]);
    lb.ensure_load_balancer("k8s", &other, &ns).await.unwrap();
    let admin = f.server.admin();
    admin.fail_operations("loadbalancer/*", ActionMatch::Create, 1, "No valid host").await.unwrap();
    let svc = service("web", &[]);
    let e = lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap_err().to_string();
    assert!(e.contains("kube_service_k8s_default_web") && e.contains("ERROR"), "{e}");
    let names: Vec<Value> =
        objects(&f, "loadbalancers").iter().map(|l| l["name"].clone()).collect();
    assert_eq!(names, [json!("kube_service_k8s_default_other")], "only ours in ERROR went");
    lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    assert_eq!(objects(&f, "loadbalancers").len(), 2);
    assert!(lb.get_load_balancer("k8s", &svc).await.unwrap().is_some(), "served again");
}

/// With Octavia's realistic timings (scaled down) every step still waits for ACTIVE and the
/// Service converges in one ensure.
#[tokio::test]
async fn a_slow_octavia_converges() {
    let f = start(27).await;
    let lb = lb_with(&f, LoadBalancerOpts { create_monitor: true, ..Default::default() });
    f.server.admin().set_timing(TimingProfile::Realistic, 0.02).await.unwrap();
    let svc = service("web", &[]);
    let started = Instant::now();
    lb.ensure_load_balancer("k8s", &svc, &nodes(&f, &["node-a", "node-b"])).await.unwrap();
    let took = started.elapsed();
    eprintln!("realistic Octavia ×0.02: one ensure took {took:?}");
    assert!(lb.get_load_balancer("k8s", &svc).await.unwrap().is_some());
    // The realistic table is in effect (Octavia's create takes tens of seconds, ×0.02 here):
    // the ensure waited for it rather than finding everything ACTIVE at once.
    let timing = f.server.admin().timing_report().await.unwrap();
    let create_ms = timing.realistic.map(|t| t.create_ms).unwrap_or(0);
    assert!(create_ms >= 10_000, "{timing:?}");
    assert!(took >= Duration::from_millis(create_ms / 50), "{took:?} for {timing:?}");
    assert_eq!(objects(&f, "members").len(), 2);
    assert_eq!(objects(&f, "healthmonitors").len(), 1);
}
