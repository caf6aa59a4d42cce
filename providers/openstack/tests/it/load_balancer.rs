//! LoadBalancer against the emulator: the Octavia load balancer, listeners, pools, members,
//! monitors, floating IP and security group upstream would create; updates (nodes, listener
//! annotations, ports); deletion leaving nothing; pending load balancers waited out; errors.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::{LoadBalancer, ProviderError};
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::openstack::OpenStackOptions;
use ccm_emulators::server::ServerOptions;
use ccm_provider_openstack::client::Service as Svc;
use ccm_provider_openstack::config::{Config, LoadBalancerClass, LoadBalancerOpts};
use ccm_provider_openstack::load_balancer::{
    OWNER_GONE_KEEP_FIP_TAG, OWNER_GONE_TAG, OctaviaLoadBalancer, Timings,
};
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec,
};
use kube::api::ObjectMeta;
use serde_json::{Value, json};

use crate::fixture::{Fixture, fast_options, provider_id, start_with};

const CLUSTER: &str = "k8s";
const LB_NAME: &str = "kube_service_k8s_default_web";
const UID: &str = "6f7f1b2c-1234-5678-9abc-def012345678";

/// Four servers on `private-subnet` (10.0.0.0/24), no floating IPs.
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
  - { name: node-d, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.14] }
"#;

async fn start(pending: Duration) -> Fixture {
    let opts = OpenStackOptions { lb_pending: pending, ..Default::default() };
    start_with(WORLD, opts, fast_options(), ServerOptions::default()).await
}

fn timings() -> Timings {
    Timings { poll: Duration::from_millis(20), max_wait: Duration::from_secs(10) }
}

fn lb_with(f: &Fixture, opts: LoadBalancerOpts) -> OctaviaLoadBalancer {
    let config = Config { load_balancer: opts, ..f.config.clone() };
    OctaviaLoadBalancer::new(Arc::clone(&f.client), Arc::new(config), timings())
}

fn lb(f: &Fixture) -> OctaviaLoadBalancer {
    lb_with(f, LoadBalancerOpts::default())
}

fn service(annotations: &[(&str, &str)], ports: &[(i32, i32)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some(UID.into()),
            annotations: Some(
                annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(p, np)| ServicePort {
                        port: *p,
                        node_port: Some(*np),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn named(mut s: Service, name: &str, uid: &str) -> Service {
    s.metadata.name = Some(name.into());
    s.metadata.uid = Some(uid.into());
    s
}

fn node(f: &Fixture, name: &str, ip: &str) -> Node {
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
    which
        .iter()
        .map(|n| {
            let ip = match *n {
                "node-a" => "10.0.0.11",
                "node-b" => "10.0.0.12",
                "node-c" => "10.0.0.13",
                _ => "10.0.0.14",
            };
            node(f, n, ip)
        })
        .collect()
}

fn ip_of(status: &k8s_openapi::api::core::v1::LoadBalancerStatus) -> String {
    status.ingress.as_ref().unwrap()[0].ip.clone().unwrap()
}

fn names(f: &Fixture, coll: &str) -> Vec<String> {
    let mut v: Vec<String> = f
        .cloud
        .objects(coll)
        .iter()
        .map(|o| o["name"].as_str().unwrap_or("").to_string())
        .collect();
    v.sort();
    v
}

/// Members as (address, port) per pool name.
fn members_by_pool(f: &Fixture) -> BTreeMap<String, Vec<(String, i64)>> {
    let pools: BTreeMap<String, String> = f
        .cloud
        .objects("pools")
        .iter()
        .map(|p| (p["id"].as_str().unwrap().to_string(), p["name"].as_str().unwrap().to_string()))
        .collect();
    let mut out: BTreeMap<String, Vec<(String, i64)>> = BTreeMap::new();
    for m in f.cloud.objects("members") {
        let pool = pools[m["pool_id"].as_str().unwrap()].clone();
        out.entry(pool).or_default().push((
            m["address"].as_str().unwrap().to_string(),
            m["protocol_port"].as_i64().unwrap(),
        ));
    }
    for v in out.values_mut() {
        v.sort();
    }
    out
}

fn listener(f: &Fixture, port: i64) -> Value {
    f.cloud.objects("listeners").into_iter().find(|l| l["protocol_port"] == port).unwrap()
}

fn octavia_changes(f: &Fixture) -> u64 {
    let c = f.server.counters();
    c.matching("octavia.*.create")
        + c.matching("octavia.*.update")
        + c.matching("octavia.*.delete")
        + c.get("octavia.members.batch_update")
}

fn assert_nothing_left(f: &Fixture) {
    for coll in ["loadbalancers", "listeners", "pools", "members", "healthmonitors", "floatingips"]
    {
        assert!(f.cloud.objects(coll).is_empty(), "{coll}: {:?}", f.cloud.objects(coll));
    }
    assert_eq!(names(f, "security-groups"), ["default"]);
    for p in f.cloud.objects("ports") {
        assert_eq!(p["security_groups"].as_array().unwrap().len(), 1, "{p}");
    }
}

#[tokio::test]
async fn a_public_service_gets_what_upstream_creates_and_deleting_it_leaves_nothing() {
    let f = start(Duration::from_millis(100)).await;
    let lb = lb_with(
        &f,
        LoadBalancerOpts {
            create_monitor: true,
            manage_security_groups: true,
            ..Default::default()
        },
    );
    let svc = service(&[], &[(80, 30080), (443, 30443)]);
    let ns = nodes(&f, &["node-a", "node-b", "node-c"]);
    assert_eq!(lb.load_balancer_name(CLUSTER, &svc), LB_NAME);
    assert!(lb.get_load_balancer(CLUSTER, &svc).await.unwrap().is_none());

    let status = lb.ensure_load_balancer(CLUSTER, &svc, &ns).await.unwrap();
    let fip = ip_of(&status);
    assert!(fip.starts_with("172.24.4."), "{fip}");
    assert_eq!(status.ingress.as_ref().unwrap()[0].ip_mode.as_deref(), Some("VIP"));

    let lbs = f.cloud.objects("loadbalancers");
    assert_eq!(lbs.len(), 1);
    let l = &lbs[0];
    assert_eq!(l["name"], LB_NAME);
    assert_eq!(l["description"], "Kubernetes external service default/web from cluster k8s");
    assert_eq!(l["tags"], json!([LB_NAME]));
    assert_eq!(l["provider"], "amphora");
    assert_eq!(
        l["vip_subnet_id"].as_str(),
        f.cloud.neutron_id("subnets", "private-subnet").as_deref(),
        "the VIP subnet is discovered from the first node's port"
    );
    assert_eq!(
        names(&f, "listeners"),
        [format!("listener_0_{LB_NAME}"), format!("listener_1_{LB_NAME}")]
    );
    let l80 = listener(&f, 80);
    assert_eq!(l80["protocol"], "TCP");
    assert_eq!(l80["tags"], json!([LB_NAME]));
    assert_eq!(l80["connection_limit"], -1);
    assert_eq!(l80["timeout_client_data"], 50000);
    assert_eq!(l80["allowed_cidrs"], json!(["0.0.0.0/0"]));
    assert_eq!(names(&f, "pools"), [format!("pool_0_{LB_NAME}"), format!("pool_1_{LB_NAME}")]);
    for p in f.cloud.objects("pools") {
        assert_eq!(p["protocol"], "TCP");
        assert_eq!(p["lb_algorithm"], "ROUND_ROBIN");
    }
    let ips = ["10.0.0.11", "10.0.0.12", "10.0.0.13"];
    let want = |port: i64| ips.iter().map(|ip| (ip.to_string(), port)).collect::<Vec<_>>();
    let members = members_by_pool(&f);
    assert_eq!(members[&format!("pool_0_{LB_NAME}")], want(30080));
    assert_eq!(members[&format!("pool_1_{LB_NAME}")], want(30443));
    assert_eq!(f.cloud.objects("members").len(), 6);
    let member = &f.cloud.objects("members")[0];
    assert_eq!(
        member["subnet_id"].as_str(),
        f.cloud.neutron_id("subnets", "private-subnet").as_deref()
    );
    assert!(member["name"].as_str().unwrap().starts_with("node-"));
    assert_eq!(
        names(&f, "healthmonitors"),
        [format!("monitor_0_{LB_NAME}"), format!("monitor_1_{LB_NAME}")]
    );
    for m in f.cloud.objects("healthmonitors") {
        assert_eq!(
            (m["type"].as_str(), m["delay"].as_i64(), m["timeout"].as_i64()),
            (Some("TCP"), Some(5), Some(3))
        );
        assert_eq!((m["max_retries"].as_i64(), m["max_retries_down"].as_i64()), (Some(1), Some(3)));
    }
    let fips = f.cloud.objects("floatingips");
    assert_eq!(fips.len(), 1);
    assert_eq!(fips[0]["floating_ip_address"], fip.as_str());
    assert_eq!(fips[0]["port_id"], l["vip_port_id"]);
    assert_eq!(
        fips[0]["description"],
        "Floating IP for Kubernetes external service default/web from cluster k8s"
    );
    // The security group: ingress on the node ports from the member subnet.
    let sg_name = format!("lb-sg-{UID}-default-web");
    assert_eq!(names(&f, "security-groups"), ["default".to_string(), sg_name.clone()]);
    let sg = f.cloud.neutron_id("security-groups", &sg_name).unwrap();
    let sg_obj =
        f.cloud.objects("security-groups").into_iter().find(|g| g["id"] == sg.as_str()).unwrap();
    assert_eq!(
        sg_obj["description"],
        "Security Group for default/web Service LoadBalancer in cluster k8s"
    );
    let mut ingress: Vec<(String, i64, String)> = f
        .cloud
        .objects("security-group-rules")
        .iter()
        .filter(|r| r["security_group_id"] == sg.as_str() && r["direction"] == "ingress")
        .map(|r| {
            (
                r["protocol"].as_str().unwrap().to_string(),
                r["port_range_min"].as_i64().unwrap(),
                r["remote_ip_prefix"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    ingress.sort();
    assert_eq!(
        ingress,
        [("tcp".into(), 30080, "10.0.0.0/24".into()), ("tcp".into(), 30443, "10.0.0.0/24".into())]
    );
    let with_sg: Vec<String> = f
        .cloud
        .objects("ports")
        .iter()
        .filter(|p| p["security_groups"].as_array().unwrap().iter().any(|g| g == sg.as_str()))
        .map(|p| p["fixed_ips"][0]["ip_address"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(with_sg, ips, "the group is on the three members' ports, not node-d's");

    // get shows it; a second ensure changes nothing.
    let got = lb.get_load_balancer(CLUSTER, &svc).await.unwrap().unwrap();
    assert_eq!(ip_of(&got), fip);
    let before = octavia_changes(&f);
    let again = lb.ensure_load_balancer(CLUSTER, &svc, &ns).await.unwrap();
    assert_eq!(ip_of(&again), fip);
    assert_eq!(octavia_changes(&f), before, "a steady Service changes nothing");
    assert_eq!(f.server.counters().get("neutron.floatingips.create"), 1);

    lb.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert_nothing_left(&f);
    assert!(lb.get_load_balancer(CLUSTER, &svc).await.unwrap().is_none());
    // Deleting again is fine.
    lb.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
}

#[tokio::test]
async fn node_changes_replace_members_with_one_batch_call_per_pool() {
    let f = start(Duration::from_millis(50)).await;
    let lb = lb_with(&f, LoadBalancerOpts { manage_security_groups: true, ..Default::default() });
    let svc = service(&[], &[(80, 30080), (443, 30443)]);
    lb.ensure_load_balancer(CLUSTER, &svc, &nodes(&f, &["node-a", "node-b", "node-c"]))
        .await
        .unwrap();
    let batches = || f.server.counters().get("octavia.members.batch_update");
    assert_eq!(batches(), 2, "one per new pool");

    // node-c leaves, node-d joins.
    let changed = nodes(&f, &["node-a", "node-b", "node-d"]);
    lb.update_load_balancer(CLUSTER, &svc, &changed).await.unwrap();
    assert_eq!(batches(), 4, "one batch update per pool");
    let members = members_by_pool(&f);
    let want = |port: i64| {
        ["10.0.0.11", "10.0.0.12", "10.0.0.14"]
            .iter()
            .map(|ip| (ip.to_string(), port))
            .collect::<Vec<_>>()
    };
    assert_eq!(members[&format!("pool_0_{LB_NAME}")], want(30080));
    assert_eq!(members[&format!("pool_1_{LB_NAME}")], want(30443));
    // The security group followed: on node-d's port, off node-c's.
    let sg = f.cloud.neutron_id("security-groups", &format!("lb-sg-{UID}-default-web")).unwrap();
    let mut with_sg: Vec<String> = f
        .cloud
        .objects("ports")
        .iter()
        .filter(|p| p["security_groups"].as_array().unwrap().iter().any(|g| g == sg.as_str()))
        .map(|p| p["fixed_ips"][0]["ip_address"].as_str().unwrap().to_string())
        .collect();
    with_sg.sort();
    assert_eq!(with_sg, ["10.0.0.11", "10.0.0.12", "10.0.0.14"]);

    // Same nodes again: nothing sent.
    lb.update_load_balancer(CLUSTER, &svc, &changed).await.unwrap();
    assert_eq!(batches(), 4);
    // The node selector narrows the members.
    let mut labelled = changed.clone();
    labelled[0].metadata.labels = Some([("pool".to_string(), "edge".to_string())].into());
    let selected = service(
        &[("loadbalancer.openstack.org/node-selector", "pool=edge")],
        &[(80, 30080), (443, 30443)],
    );
    lb.update_load_balancer(CLUSTER, &selected, &labelled).await.unwrap();
    assert_eq!(batches(), 6);
    assert_eq!(
        members_by_pool(&f)[&format!("pool_0_{LB_NAME}")],
        [("10.0.0.11".to_string(), 30080)]
    );
}

#[tokio::test]
async fn listener_annotations_are_reconciled_and_removed_ports_cleaned_up() {
    let f = start(Duration::from_millis(50)).await;
    let lb = lb(&f);
    let ns = nodes(&f, &["node-a", "node-b"]);
    let svc = service(&[], &[(80, 30080), (443, 30443)]);
    lb.ensure_load_balancer(CLUSTER, &svc, &ns).await.unwrap();
    let id80 = listener(&f, 80)["id"].clone();

    // Timeouts and connection limit: updated in place (cloud-provider-openstack#1149).
    let tuned = service(
        &[
            ("loadbalancer.openstack.org/timeout-client-data", "60000"),
            ("loadbalancer.openstack.org/connection-limit", "1000"),
            ("loadbalancer.openstack.org/lb-method", "LEAST_CONNECTIONS"),
        ],
        &[(80, 30080), (443, 30443)],
    );
    let updates = || f.server.counters().get("octavia.listeners.update");
    lb.ensure_load_balancer(CLUSTER, &tuned, &ns).await.unwrap();
    assert_eq!(updates(), 2, "one update per listener");
    let l80 = listener(&f, 80);
    assert_eq!(l80["id"], id80, "the same listener");
    assert_eq!(l80["timeout_client_data"], 60000);
    assert_eq!(l80["connection_limit"], 1000);
    for p in f.cloud.objects("pools") {
        assert_eq!(p["lb_algorithm"], "LEAST_CONNECTIONS");
    }

    // X-Forwarded-For: HTTP listeners and pools, re-created on the same ports.
    let xff = service(
        &[("loadbalancer.openstack.org/x-forwarded-for", "true")],
        &[(80, 30080), (443, 30443)],
    );
    lb.ensure_load_balancer(CLUSTER, &xff, &ns).await.unwrap();
    let l80 = listener(&f, 80);
    assert_ne!(l80["id"], id80);
    assert_eq!(l80["protocol"], "HTTP");
    assert_eq!(l80["insert_headers"], json!({"X-Forwarded-For": "true"}));
    assert_eq!(l80["timeout_client_data"], 50000, "back to the default");
    assert_eq!(f.cloud.objects("listeners").len(), 2);
    assert_eq!(f.cloud.objects("pools").len(), 2);
    for p in f.cloud.objects("pools") {
        assert_eq!(p["protocol"], "HTTP");
    }
    assert_eq!(f.cloud.objects("members").len(), 4);

    // Port 443 removed: its listener, pool and members go.
    let one = service(&[("loadbalancer.openstack.org/x-forwarded-for", "true")], &[(80, 30080)]);
    lb.ensure_load_balancer(CLUSTER, &one, &ns).await.unwrap();
    assert_eq!(names(&f, "listeners"), [format!("listener_0_{LB_NAME}")]);
    assert_eq!(names(&f, "pools"), [format!("pool_0_{LB_NAME}")]);
    assert_eq!(f.cloud.objects("members").len(), 2);

    // Monitors come and go with the annotation.
    let monitored = service(
        &[
            ("loadbalancer.openstack.org/x-forwarded-for", "true"),
            ("loadbalancer.openstack.org/enable-health-monitor", "true"),
            ("loadbalancer.openstack.org/health-monitor-delay", "7"),
        ],
        &[(80, 30080)],
    );
    lb.ensure_load_balancer(CLUSTER, &monitored, &ns).await.unwrap();
    let hm = f.cloud.objects("healthmonitors");
    assert_eq!((hm.len(), hm[0]["delay"].as_i64()), (1, Some(7)));
    lb.ensure_load_balancer(CLUSTER, &one, &ns).await.unwrap();
    assert!(f.cloud.objects("healthmonitors").is_empty());

    lb.ensure_load_balancer_deleted(CLUSTER, &one).await.unwrap();
    assert_nothing_left(&f);
}

#[tokio::test]
async fn internal_services_have_no_floating_ip_and_kept_ones_survive_deletion() {
    let f = start(Duration::from_millis(50)).await;
    let lb = lb(&f);
    let ns = nodes(&f, &["node-a"]);
    let internal = service(
        &[("service.beta.kubernetes.io/openstack-internal-load-balancer", "true")],
        &[(80, 30080)],
    );
    let status = lb.ensure_load_balancer(CLUSTER, &internal, &ns).await.unwrap();
    let vip = f.cloud.objects("loadbalancers")[0]["vip_address"].as_str().unwrap().to_string();
    assert_eq!(ip_of(&status), vip);
    assert!(vip.starts_with("10.0.0."));
    assert!(f.cloud.objects("floatingips").is_empty());

    // Becoming external adds a floating IP; internal again releases it.
    let public = service(&[], &[(80, 30080)]);
    let fip = ip_of(&lb.ensure_load_balancer(CLUSTER, &public, &ns).await.unwrap());
    assert!(fip.starts_with("172.24.4."));
    lb.ensure_load_balancer(CLUSTER, &internal, &ns).await.unwrap();
    assert!(f.cloud.objects("floatingips").is_empty());
    lb.ensure_load_balancer_deleted(CLUSTER, &internal).await.unwrap();
    assert_nothing_left(&f);

    // keep-floatingip: kept, unassociated, after deletion.
    let keep = service(&[("loadbalancer.openstack.org/keep-floatingip", "true")], &[(80, 30080)]);
    let fip = ip_of(&lb.ensure_load_balancer(CLUSTER, &keep, &ns).await.unwrap());
    lb.ensure_load_balancer_deleted(CLUSTER, &keep).await.unwrap();
    assert!(f.cloud.objects("loadbalancers").is_empty());
    let fips = f.cloud.objects("floatingips");
    assert_eq!(fips.len(), 1);
    assert_eq!(fips[0]["floating_ip_address"], fip.as_str());
    assert!(fips[0]["port_id"].is_null());

    // That address given as spec.loadBalancerIP: reused; deleting only disassociates it
    // (it was created as a Service's, but keep-floatingip still says keep).
    let mut given =
        service(&[("loadbalancer.openstack.org/keep-floatingip", "true")], &[(80, 30080)]);
    given.spec.as_mut().unwrap().load_balancer_ip = Some(fip.clone());
    assert_eq!(ip_of(&lb.ensure_load_balancer(CLUSTER, &given, &ns).await.unwrap()), fip);
    assert_eq!(f.server.counters().get("neutron.floatingips.create"), 2);
    lb.ensure_load_balancer_deleted(CLUSTER, &given).await.unwrap();
    assert_eq!(f.cloud.objects("floatingips").len(), 1);

    // A loadBalancerIP the project does not have is invalid, naming the field.
    let mut missing = service(&[], &[(80, 30080)]);
    missing.spec.as_mut().unwrap().load_balancer_ip = Some("172.24.4.250".into());
    let e = lb.ensure_load_balancer(CLUSTER, &missing, &ns).await.unwrap_err();
    assert!(matches!(e, ProviderError::Invalid { .. }), "{e:?}");
    assert!(e.to_string().contains("spec.loadBalancerIP"), "{e}");
    lb.ensure_load_balancer_deleted(CLUSTER, &missing).await.unwrap();
}

#[tokio::test]
async fn a_users_floating_ip_is_associated_and_only_disassociated_on_delete() {
    let f = start(Duration::from_millis(50)).await;
    let lb = lb(&f);
    let public = f.cloud.neutron_id("networks", "public").unwrap();
    let created = f
        .client
        .post(
            "test:CreateFloatingIP",
            Svc::Network,
            &["floatingips"],
            &json!({"floatingip": {"floating_network_id": public, "description": "mine"}}),
        )
        .await
        .unwrap();
    let addr = created["floatingip"]["floating_ip_address"].as_str().unwrap().to_string();
    let mut svc = service(&[], &[(80, 30080)]);
    svc.spec.as_mut().unwrap().load_balancer_ip = Some(addr.clone());
    let status = lb.ensure_load_balancer(CLUSTER, &svc, &nodes(&f, &["node-a"])).await.unwrap();
    assert_eq!(ip_of(&status), addr);
    assert_eq!(f.server.counters().get("neutron.floatingips.create"), 1, "only the test's");
    lb.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    let fips = f.cloud.objects("floatingips");
    assert_eq!(fips.len(), 1, "the user's floating IP is kept");
    assert!(fips[0]["port_id"].is_null());
}

#[tokio::test]
async fn bad_annotations_are_invalid_and_name_the_annotation() {
    let f = start(Duration::from_millis(50)).await;
    let lb = lb(&f);
    let ns = nodes(&f, &["node-a"]);
    for (k, v) in [
        ("loadbalancer.openstack.org/timeout-client-data", "soon"),
        ("loadbalancer.openstack.org/lb-method", "FASTEST"),
        ("loadbalancer.openstack.org/proxy-protocol", "v9"),
        ("loadbalancer.openstack.org/class", "gold"),
        ("loadbalancer.openstack.org/default-tls-container-ref", "https://kms/v1/orders/x"),
        ("loadbalancer.openstack.org/health-monitor-max-retries", "many"),
    ] {
        let e = lb
            .ensure_load_balancer(CLUSTER, &service(&[(k, v)], &[(80, 30080)]), &ns)
            .await
            .unwrap_err();
        match &e {
            ProviderError::Invalid { what, message } => {
                assert!(what.contains(k), "{k}: {e}");
                assert!(
                    message.contains(v)
                        || k.ends_with("/class")
                        || k.ends_with("tls-container-ref"),
                    "{k}: {e}"
                );
            }
            other => panic!("{k}: {other:?}"),
        }
    }
    assert!(e_contains(
        lb.ensure_load_balancer(
            CLUSTER,
            &service(&[("loadbalancer.openstack.org/class", "gold")], &[(80, 30080)]),
            &ns
        )
        .await,
        "gold"
    ));
    assert!(f.cloud.objects("loadbalancers").is_empty(), "nothing was created");
    assert_eq!(f.server.counters().matching("octavia.*"), 0, "rejected before any cloud call");
}

fn e_contains<T: std::fmt::Debug>(r: Result<T, ProviderError>, s: &str) -> bool {
    r.unwrap_err().to_string().contains(s)
}

#[tokio::test]
async fn classes_pick_subnets_and_floating_networks() {
    let f = start(Duration::from_millis(50)).await;
    let subnet = f.cloud.neutron_id("subnets", "private-subnet").unwrap();
    let public = f.cloud.neutron_id("networks", "public").unwrap();
    let public_subnet = f.cloud.neutron_id("subnets", "public-subnet").unwrap();
    let mut config = Config { ..f.config.clone() };
    config.lb_classes.insert(
        "gold".into(),
        LoadBalancerClass {
            floating_network_id: Some(public.clone()),
            floating_subnet_id: Some(public_subnet),
            subnet_id: Some(subnet.clone()),
            ..Default::default()
        },
    );
    let lb = OctaviaLoadBalancer::new(Arc::clone(&f.client), Arc::new(config), timings());
    let svc = service(&[("loadbalancer.openstack.org/class", "gold")], &[(80, 30080)]);
    let status = lb.ensure_load_balancer(CLUSTER, &svc, &nodes(&f, &["node-a"])).await.unwrap();
    assert!(ip_of(&status).starts_with("172.24.4."));
    assert_eq!(f.cloud.objects("loadbalancers")[0]["vip_subnet_id"], subnet.as_str());
    assert_eq!(
        f.server.counters().get("neutron.ports.list"),
        0,
        "no subnet discovery with a class subnet"
    );
    assert_eq!(
        f.server.counters().get("neutron.networks.list"),
        0,
        "no external network discovery"
    );
    lb.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert_nothing_left(&f);
}

#[tokio::test]
async fn proxy_protocol_local_traffic_and_hostnames() {
    let f = start(Duration::from_millis(50)).await;
    let lb = lb_with(
        &f,
        LoadBalancerOpts {
            enable_ingress_hostname: true,
            manage_security_groups: true,
            ..Default::default()
        },
    );
    let ns = nodes(&f, &["node-a", "node-b"]);
    let mut svc = service(
        &[
            ("loadbalancer.openstack.org/proxy-protocol", "v2"),
            ("loadbalancer.openstack.org/enable-health-monitor", "true"),
        ],
        &[(80, 30080)],
    );
    let spec = svc.spec.as_mut().unwrap();
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(32000);
    let status = lb.ensure_load_balancer(CLUSTER, &svc, &ns).await.unwrap();
    let host = status.ingress.unwrap()[0].hostname.clone().unwrap();
    assert!(host.starts_with("172.24.4.") && host.ends_with(".nip.io"), "{host}");
    assert_eq!(f.cloud.objects("pools")[0]["protocol"], "PROXYV2");
    let hm = &f.cloud.objects("healthmonitors")[0];
    assert_eq!((hm["type"].as_str(), hm["url_path"].as_str()), (Some("HTTP"), Some("/healthz")));
    for m in f.cloud.objects("members") {
        assert_eq!(m["monitor_port"], 32000);
    }
    let sg = f.cloud.neutron_id("security-groups", &format!("lb-sg-{UID}-default-web")).unwrap();
    let mut ports: Vec<i64> = f
        .cloud
        .objects("security-group-rules")
        .iter()
        .filter(|r| r["security_group_id"] == sg.as_str() && r["direction"] == "ingress")
        .map(|r| r["port_range_min"].as_i64().unwrap())
        .collect();
    ports.sort();
    assert_eq!(ports, [30080, 32000]);

    // An explicit hostname wins.
    svc.metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert("loadbalancer.openstack.org/hostname".into(), "lb.example.com".into());
    let status = lb.ensure_load_balancer(CLUSTER, &svc, &ns).await.unwrap();
    assert_eq!(status.ingress.unwrap()[0].hostname.as_deref(), Some("lb.example.com"));
    let got = lb.get_load_balancer(CLUSTER, &svc).await.unwrap().unwrap();
    assert_eq!(got.ingress.unwrap()[0].hostname.as_deref(), Some("lb.example.com"));
    lb.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert_nothing_left(&f);
}

#[tokio::test]
async fn an_error_load_balancer_is_an_error_naming_it() {
    let f = start(Duration::from_millis(50)).await;
    let lb = lb(&f);
    let ns = nodes(&f, &["node-a"]);
    let svc = service(&[], &[(80, 30080)]);
    // The new load balancer goes into ERROR: the error names it, and it is deleted.
    let error_lb =
        json!({"loadbalancer": {"id": "x", "name": LB_NAME, "provisioning_status": "ERROR"}});
    f.server
        .inject(
            FaultRule::new(
                "octavia.loadbalancers.get",
                Fault::Status { status: 200, body: Some(error_lb.to_string()) },
            )
            .times(1),
        )
        .unwrap();
    // Octavia refuses the delete as pending, and by the time it is asked again the load
    // balancer has settled: the delete is tried again, not given up (a CI flake once).
    let pending = json!({"faultcode": "Client", "faultstring": "Invalid state PENDING_CREATE of loadbalancer resource x", "debuginfo": null});
    f.server
        .inject(
            FaultRule::new(
                "octavia.loadbalancers.delete",
                Fault::Status { status: 409, body: Some(pending.to_string()) },
            )
            .times(1),
        )
        .unwrap();
    f.server
        .inject(FaultRule::new("octavia.loadbalancers.get", Fault::Latency { ms: 300 }).times(1))
        .unwrap();
    let e = lb.ensure_load_balancer(CLUSTER, &svc, &ns).await.unwrap_err();
    assert!(e.to_string().contains(LB_NAME) && e.to_string().contains("ERROR"), "{e}");
    assert!(e.to_string().contains("was deleted"), "{e}");
    assert!(
        f.cloud.objects("loadbalancers").is_empty(),
        "deleted so that it is created afresh: {:?} {:?}",
        f.cloud.objects("loadbalancers"),
        f.server.counters().operations
    );

    // An existing one in ERROR (populated: it has its listener and pool, as Octavia lists
    // them): an error naming it, nothing touched.
    lb.ensure_load_balancer(CLUSTER, &svc, &ns).await.unwrap();
    let mut listed = f.cloud.octavia_objects("loadbalancers");
    assert_eq!(listed[0]["listeners"].as_array().map(Vec::len), Some(1), "{listed:?}");
    listed[0]["provisioning_status"] = json!("ERROR");
    let body = json!({"loadbalancers": listed}).to_string();
    f.server
        .inject(
            FaultRule::new(
                "octavia.loadbalancers.list",
                Fault::Status { status: 200, body: Some(body) },
            )
            .times(1),
        )
        .unwrap();
    let before = octavia_changes(&f);
    let e = lb.ensure_load_balancer(CLUSTER, &svc, &ns).await.unwrap_err();
    assert!(e.to_string().contains(LB_NAME) && e.to_string().contains("ERROR"), "{e}");
    assert_eq!(octavia_changes(&f), before);
    lb.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert_nothing_left(&f);
}

#[tokio::test]
async fn calls_made_while_the_load_balancer_is_pending_are_retried_not_failed() {
    let f = start(Duration::from_millis(500)).await;
    let lb = lb(&f);
    let svc = service(&[], &[(80, 30080)]);
    lb.ensure_load_balancer(CLUSTER, &svc, &nodes(&f, &["node-a", "node-b"])).await.unwrap();
    let id = f.cloud.objects("loadbalancers")[0]["id"].as_str().unwrap().to_string();

    // Someone changes the load balancer: it is PENDING_UPDATE for 500 ms.
    let busy = || async {
        f.client
            .put(
                "test:UpdateLoadBalancer",
                Svc::LoadBalancer,
                &["lbaas", "loadbalancers", &id],
                &json!({"loadbalancer": {"admin_state_up": true}}),
            )
            .await
            .unwrap();
    };
    busy().await;
    lb.update_load_balancer(CLUSTER, &svc, &nodes(&f, &["node-a", "node-c"])).await.unwrap();
    assert_eq!(members_by_pool(&f)[&format!("pool_0_{LB_NAME}")].len(), 2);
    assert!(f.cloud.objects("members").iter().any(|m| m["address"] == "10.0.0.13"));

    // A 409 "pending" answer to a change is waited out and the change sent again.
    let pending = json!({"faultcode": "Client", "faultstring": format!("Invalid state PENDING_UPDATE of loadbalancer resource {id}"), "debuginfo": null});
    f.server
        .inject(
            FaultRule::new(
                "octavia.members.batch_update",
                Fault::Status { status: 409, body: Some(pending.to_string()) },
            )
            .times(2),
        )
        .unwrap();
    let before = f.server.counters().get("octavia.members.batch_update");
    lb.update_load_balancer(CLUSTER, &svc, &nodes(&f, &["node-a", "node-b", "node-c"]))
        .await
        .unwrap();
    assert_eq!(f.server.counters().get("octavia.members.batch_update"), before + 3);
    assert_eq!(f.cloud.objects("members").len(), 3);

    // Two Services sharing the load balancer reconciled at once: each one's changes meet the
    // other's pending state (real 409s from the emulator), are waited out and sent again.
    let lbx = lb_with(&f, LoadBalancerOpts { max_shared_lb: 3, ..Default::default() });
    let guest = named(
        service(&[("loadbalancer.openstack.org/load-balancer-id", &id)], &[(8080, 31080)]),
        "api",
        "11111111-2222-4333-8444-555555555555",
    );
    let tuned = service(&[("loadbalancer.openstack.org/connection-limit", "500")], &[(80, 30080)]);
    let ns = nodes(&f, &["node-a", "node-b"]);
    let (a, b) = tokio::join!(
        lbx.ensure_load_balancer(CLUSTER, &tuned, &ns),
        lbx.ensure_load_balancer(CLUSTER, &guest, &ns)
    );
    a.unwrap();
    b.unwrap();
    assert_eq!(listener(&f, 80)["connection_limit"], 500);
    assert_eq!(listener(&f, 8080)["tags"], json!(["kube_service_k8s_default_api"]));
    let conflicts = f
        .server
        .admin()
        .requests()
        .await
        .unwrap()
        .iter()
        .filter(|r| r.operation.starts_with("octavia.") && r.status == 409)
        .count();
    assert!(conflicts >= 3, "the injected two and at least one real one: {conflicts}");
    lbx.ensure_load_balancer_deleted(CLUSTER, &guest).await.unwrap();

    // While pending, deletion waits too.
    busy().await;
    lb.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert_nothing_left(&f);
}

#[tokio::test]
async fn a_load_balancer_is_shared_by_id_and_deleted_only_by_its_last_user() {
    let f = start(Duration::from_millis(50)).await;
    let lb = lb_with(&f, LoadBalancerOpts { max_shared_lb: 3, ..Default::default() });
    let ns = nodes(&f, &["node-a"]);
    let owner = service(&[], &[(80, 30080)]);
    let fip = ip_of(&lb.ensure_load_balancer(CLUSTER, &owner, &ns).await.unwrap());
    let id = f.cloud.objects("loadbalancers")[0]["id"].as_str().unwrap().to_string();

    let guest = named(
        service(&[("loadbalancer.openstack.org/load-balancer-id", &id)], &[(8080, 31080)]),
        "api",
        "11111111-2222-4333-8444-555555555555",
    );
    let status = lb.ensure_load_balancer(CLUSTER, &guest, &ns).await.unwrap();
    assert_eq!(ip_of(&status), fip, "the shared load balancer's floating IP");
    let tags = f.cloud.objects("loadbalancers")[0]["tags"].clone();
    assert_eq!(tags, json!([LB_NAME, "kube_service_k8s_default_api"]));
    assert_eq!(listener(&f, 8080)["tags"], json!(["kube_service_k8s_default_api"]));

    // A port already used by another Service's listener is refused.
    let clash = named(
        service(&[("loadbalancer.openstack.org/load-balancer-id", &id)], &[(80, 31081)]),
        "clash",
        "21111111-2222-4333-8444-555555555555",
    );
    let e = lb.ensure_load_balancer(CLUSTER, &clash, &ns).await.unwrap_err();
    assert!(e.to_string().contains("already exists"), "{e}");
    // Internal Services cannot share; max-shared-lb is a bound.
    let internal = named(
        service(
            &[
                ("loadbalancer.openstack.org/load-balancer-id", &id),
                ("service.beta.kubernetes.io/openstack-internal-load-balancer", "true"),
            ],
            &[(9090, 31090)],
        ),
        "internal",
        "31111111-2222-4333-8444-555555555555",
    );
    let e = lb.ensure_load_balancer(CLUSTER, &internal, &ns).await.unwrap_err();
    assert!(matches!(e, ProviderError::Invalid { .. }), "{e:?}");
    assert!(e.to_string().contains("internal"), "{e}");
    let two = lb_with(&f, LoadBalancerOpts { max_shared_lb: 2, ..Default::default() });
    let third = named(
        service(&[("loadbalancer.openstack.org/load-balancer-id", &id)], &[(9091, 31091)]),
        "third",
        "41111111-2222-4333-8444-555555555555",
    );
    let e = two.ensure_load_balancer(CLUSTER, &third, &ns).await.unwrap_err();
    assert!(e.to_string().contains("max-shared-lb"), "{e}");

    // The owner goes first: the load balancer stays (shared), only its listener goes.
    lb.ensure_load_balancer_deleted(CLUSTER, &owner).await.unwrap();
    assert_eq!(f.cloud.objects("loadbalancers").len(), 1);
    assert_eq!(names(&f, "listeners"), ["listener_0_kube_service_k8s_default_api"]);
    assert_eq!(
        f.cloud.objects("loadbalancers")[0]["tags"],
        json!(["kube_service_k8s_default_api", OWNER_GONE_TAG])
    );
    assert_eq!(f.cloud.objects("floatingips").len(), 1);
    // The guest goes last: its Service (same namespace) is gone and only the guest's tag is
    // left on it, so it goes, with its owner's floating IP (as upstream).
    lb.ensure_load_balancer_deleted(CLUSTER, &guest).await.unwrap();
    assert_nothing_left(&f);
}

#[tokio::test]
async fn udp_ports_and_deletion_without_cascade_children_first() {
    let f = start(Duration::from_millis(50)).await;
    let lb = lb_with(
        &f,
        LoadBalancerOpts { cascade_delete: false, create_monitor: true, ..Default::default() },
    );
    let mut svc = service(&[], &[(80, 30080), (53, 30053)]);
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].protocol = Some("UDP".into());
    lb.ensure_load_balancer(CLUSTER, &svc, &nodes(&f, &["node-a", "node-b"])).await.unwrap();
    assert_eq!(listener(&f, 53)["protocol"], "UDP");
    let mut kinds: Vec<String> = f
        .cloud
        .objects("healthmonitors")
        .iter()
        .map(|m| m["type"].as_str().unwrap().to_string())
        .collect();
    kinds.sort();
    assert_eq!(kinds, ["TCP", "UDP-CONNECT"]);
    lb.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert_nothing_left(&f);
    let c = f.server.counters();
    assert_eq!((c.get("octavia.listeners.delete"), c.get("octavia.pools.delete")), (2, 2));
    assert_eq!(c.get("octavia.loadbalancers.delete"), 1);
}

#[tokio::test]
async fn operator_tools_list_owned_load_balancers_and_refuse_others() {
    let f = start(Duration::from_millis(50)).await;
    let lb = lb_with(&f, LoadBalancerOpts { manage_security_groups: true, ..Default::default() });
    let svc = service(&[], &[(80, 30080)]);
    let fip =
        ip_of(&lb.ensure_load_balancer(CLUSTER, &svc, &nodes(&f, &["node-a"])).await.unwrap());

    let listed = lb.list_cloud_load_balancers(CLUSTER).await.unwrap();
    assert_eq!(listed.len(), 1);
    let entry = &listed[0];
    assert_eq!(entry.name, LB_NAME);
    assert!(entry.owned);
    assert_eq!(entry.service.as_deref(), Some("default/web"));
    assert_eq!(entry.ingress[0], fip);
    let kinds: Vec<&str> = entry.resources.iter().map(|r| r.kind.as_str()).collect();
    assert_eq!(kinds, ["floating IP", "security group", "listener", "pool"]);

    let other = lb.list_cloud_load_balancers("other").await.unwrap();
    assert!(!other[0].owned);
    let e = lb.delete_cloud_load_balancer("other", &other[0]).await.unwrap_err();
    assert!(matches!(e, ProviderError::Invalid { .. }), "{e:?}");
    assert_eq!(f.cloud.objects("loadbalancers").len(), 1);

    lb.delete_cloud_load_balancer(CLUSTER, entry).await.unwrap();
    assert_nothing_left(&f);
    assert!(lb.list_cloud_load_balancers(CLUSTER).await.unwrap().is_empty());
}

// ---- tenant safety (issue #29, HIGH 2) ---------------------------------------------------------

const LB_ID: &str = "loadbalancer.openstack.org/load-balancer-id";

/// `s` as the Service `<ns>/<name>` with `uid`.
fn in_ns(mut s: Service, ns: &str, name: &str, uid: &str) -> Service {
    s.metadata.namespace = Some(ns.into());
    named(s, name, uid)
}

/// Every Octavia and Neutron object a load balancer is made of, as the cloud holds them.
fn snapshot(f: &Fixture) -> Vec<Vec<Value>> {
    ["loadbalancers", "listeners", "pools", "members", "healthmonitors", "floatingips"]
        .iter()
        .map(|c| f.cloud.objects(c))
        .collect()
}

/// HIGH 2 (a): an untagged load balancer made by upstream's CCM (an Octavia without tags) for a
/// Service of namespace `victim`, named by `load-balancer-id` in namespace `evil`: on today's
/// main the attacker's Service was given the victim's floating IP, and deleting it deleted the
/// victim's load balancer with its floating IP.
#[tokio::test]
async fn another_namespace_cannot_share_or_delete_an_untagged_load_balancer() {
    let f = start(Duration::from_millis(20)).await;
    let lb = lb_with(&f, LoadBalancerOpts { max_shared_lb: 3, ..Default::default() });
    let ns = nodes(&f, &["node-a"]);
    let victim = in_ns(
        service(&[], &[(80, 30080)]),
        "victim",
        "web",
        "a1111111-2222-4333-8444-555555555555",
    );
    let fip = ip_of(&lb.ensure_load_balancer(CLUSTER, &victim, &ns).await.unwrap());
    let id = f.cloud.objects("loadbalancers")[0]["id"].as_str().unwrap().to_string();
    // As upstream's CCM leaves it on an Octavia without tags.
    f.client
        .put(
            "test:UpdateLoadBalancer",
            Svc::LoadBalancer,
            &["lbaas", "loadbalancers", &id],
            &json!({"loadbalancer": {"tags": []}}),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let before = snapshot(&f);

    let attacker = in_ns(
        service(&[(LB_ID, &id)], &[(8080, 31080)]),
        "evil",
        "grab",
        "e1111111-2222-4333-8444-555555555555",
    );
    let taken = lb.ensure_load_balancer(CLUSTER, &attacker, &ns).await;
    assert!(
        taken.is_err(),
        "a Service of another namespace was given the victim's load balancer: {:?}",
        taken.map(|s| ip_of(&s))
    );
    let e = taken.unwrap_err();
    assert!(matches!(e, ProviderError::Invalid { .. }), "{e:?}");
    assert!(e.to_string().contains(LB_ID) && e.to_string().contains("victim/web"), "{e}");
    let shown = lb.get_load_balancer(CLUSTER, &attacker).await.unwrap();
    assert!(shown.is_none(), "the victim's address reported for the attacker: {shown:?}");
    lb.ensure_load_balancer_deleted(CLUSTER, &attacker).await.unwrap();
    assert_eq!(snapshot(&f), before, "the victim's load balancer is untouched");
    assert_eq!(f.cloud.objects("floatingips")[0]["floating_ip_address"], fip.as_str());
}

/// HIGH 2 (b): a tagged load balancer whose Service keeps its floating IP
/// (`keep-floatingip`): on today's main a sharing Service of another namespace was served the
/// victim's floating IP, stayed on the load balancer after the victim was deleted, and on its
/// own deletion deleted the load balancer and the victim's kept floating IP.
#[tokio::test]
async fn another_namespace_is_never_served_nor_deletes_a_kept_floating_ip() {
    let f = start(Duration::from_millis(20)).await;
    let lb = lb_with(&f, LoadBalancerOpts { max_shared_lb: 3, ..Default::default() });
    let ns = nodes(&f, &["node-a"]);
    let victim = in_ns(
        service(&[("loadbalancer.openstack.org/keep-floatingip", "true")], &[(80, 30080)]),
        "victim",
        "web",
        "a1111111-2222-4333-8444-555555555555",
    );
    let fip = ip_of(&lb.ensure_load_balancer(CLUSTER, &victim, &ns).await.unwrap());
    let id = f.cloud.objects("loadbalancers")[0]["id"].as_str().unwrap().to_string();
    let attacker = in_ns(
        service(&[(LB_ID, &id)], &[(8080, 31080)]),
        "evil",
        "grab",
        "e1111111-2222-4333-8444-555555555555",
    );
    let taken = lb.ensure_load_balancer(CLUSTER, &attacker, &ns).await;
    assert!(
        taken.is_err(),
        "a Service of another namespace was served the victim's address: {:?}",
        taken.map(|s| ip_of(&s))
    );
    assert!(lb.get_load_balancer(CLUSTER, &attacker).await.unwrap().is_none());
    // The victim goes (keeping its address), then the attacker.
    lb.ensure_load_balancer_deleted(CLUSTER, &victim).await.unwrap();
    assert!(f.cloud.objects("loadbalancers").is_empty());
    lb.ensure_load_balancer_deleted(CLUSTER, &attacker).await.unwrap();
    let fips = f.cloud.objects("floatingips");
    assert_eq!(fips.len(), 1, "the victim's kept floating IP survives");
    assert_eq!(fips[0]["floating_ip_address"], fip.as_str());
    assert!(fips[0]["port_id"].is_null());

    // Nor can another namespace take the kept address with spec.loadBalancerIP, and delete it.
    let mut thief = in_ns(
        service(&[], &[(80, 30080)]),
        "evil",
        "thief",
        "f1111111-2222-4333-8444-555555555555",
    );
    thief.spec.as_mut().unwrap().load_balancer_ip = Some(fip.clone());
    let taken = lb.ensure_load_balancer(CLUSTER, &thief, &ns).await;
    assert!(
        taken.is_err(),
        "another namespace took the kept address: {:?}",
        taken.map(|s| ip_of(&s))
    );
    lb.ensure_load_balancer_deleted(CLUSTER, &thief).await.unwrap();
    let fips = f.cloud.objects("floatingips");
    assert_eq!(fips.len(), 1, "the victim's kept floating IP survives");
    assert!(fips[0]["port_id"].is_null());
}

/// HIGH 3 (Octavia's half): a 404 page from a proxy while a Service is deleted is not "the load
/// balancer is gone": an error, the load balancer stays and the deletion is retried.
#[tokio::test]
async fn a_proxy_404_is_not_a_deleted_load_balancer() {
    let f = start(Duration::from_millis(20)).await;
    let lb = lb(&f);
    let svc = service(&[], &[(80, 30080)]);
    lb.ensure_load_balancer(CLUSTER, &svc, &nodes(&f, &["node-a"])).await.unwrap();
    let id = f.cloud.objects("loadbalancers")[0]["id"].as_str().unwrap().to_string();
    let page = format!(
        "<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1><p>The requested URL /load-balancer/v2/lbaas/loadbalancers/{id} was not found on this server.</p></body></html>"
    );
    let fault =
        Fault::Page { status: 404, content_type: Some("text/html".into()), body: page.clone() };
    f.server.inject(FaultRule::new("octavia.loadbalancers.*", fault)).unwrap();
    let mut annotated = svc.clone();
    annotated.metadata.annotations.as_mut().unwrap().insert(LB_ID.into(), id.clone());
    for s in [&svc, &annotated] {
        let r = lb.ensure_load_balancer_deleted(CLUSTER, s).await;
        assert!(r.is_err(), "a proxy's 404 page taken for a deleted load balancer");
        assert!(lb.get_load_balancer(CLUSTER, s).await.is_err());
    }
    // A JSON 404 of another shape (a gateway's) is not Octavia's either.
    f.server.admin().clear_faults().await.unwrap();
    let other = Fault::Page {
        status: 404,
        content_type: Some("application/json".into()),
        body: format!(r#"{{"message": "loadbalancer {id} not found", "code": 404}}"#),
    };
    f.server.inject(FaultRule::new("octavia.loadbalancers.*", other)).unwrap();
    assert!(lb.ensure_load_balancer_deleted(CLUSTER, &annotated).await.is_err());
    f.server.admin().clear_faults().await.unwrap();
    assert_eq!(f.cloud.objects("loadbalancers").len(), 1);
    lb.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert_nothing_left(&f);
}

/// Where the operator allows sharing across namespaces, a sharer of another namespace adds and
/// removes only its own listener and tag: the load balancer and its floating IP stay while
/// their Service lives; deleted with it.
#[tokio::test]
async fn with_the_opt_in_another_namespace_shares_but_removes_only_its_own_parts() {
    let f = start(Duration::from_millis(20)).await;
    let open = lb_with(
        &f,
        LoadBalancerOpts {
            max_shared_lb: 3,
            allow_cross_namespace_sharing: true,
            ..Default::default()
        },
    );
    let ns = nodes(&f, &["node-a"]);
    let victim = in_ns(
        service(&[], &[(80, 30080)]),
        "victim",
        "web",
        "a1111111-2222-4333-8444-555555555555",
    );
    let fip = ip_of(&open.ensure_load_balancer(CLUSTER, &victim, &ns).await.unwrap());
    let id = f.cloud.objects("loadbalancers")[0]["id"].as_str().unwrap().to_string();
    // Untagged, as upstream's CCM leaves it on an Octavia without tags.
    f.client
        .put(
            "test:UpdateLoadBalancer",
            Svc::LoadBalancer,
            &["lbaas", "loadbalancers", &id],
            &json!({"loadbalancer": {"tags": []}}),
        )
        .await
        .unwrap();
    let guest = in_ns(
        service(&[(LB_ID, &id)], &[(8080, 31080)]),
        "evil",
        "grab",
        "e1111111-2222-4333-8444-555555555555",
    );
    let status = open.ensure_load_balancer(CLUSTER, &guest, &ns).await.unwrap();
    assert_eq!(ip_of(&status), fip, "sharing allowed: the shared address");
    assert_eq!(listener(&f, 8080)["tags"], json!(["kube_service_k8s_evil_grab"]));
    // A port of the owner's is not the sharer's to take.
    let clash = in_ns(
        service(&[(LB_ID, &id)], &[(80, 31081)]),
        "evil",
        "clash",
        "e2111111-2222-4333-8444-555555555555",
    );
    assert!(open.ensure_load_balancer(CLUSTER, &clash, &ns).await.is_err());
    open.ensure_load_balancer_deleted(CLUSTER, &clash).await.unwrap();
    // The sharer's update touches only its own pool.
    open.update_load_balancer(CLUSTER, &guest, &nodes(&f, &["node-a", "node-b"])).await.unwrap();
    let members = members_by_pool(&f);
    assert_eq!(members[&format!("pool_0_{}", "kube_service_k8s_victim_web")].len(), 1);
    assert_eq!(members["pool_0_kube_service_k8s_evil_grab"].len(), 2);

    open.ensure_load_balancer_deleted(CLUSTER, &guest).await.unwrap();
    assert_eq!(f.cloud.objects("loadbalancers").len(), 1, "the sharer never deletes it");
    assert_eq!(names(&f, "listeners"), ["listener_0_kube_service_k8s_victim_web"]);
    let fips = f.cloud.objects("floatingips");
    assert_eq!(fips.len(), 1);
    assert_eq!(fips[0]["port_id"], f.cloud.objects("loadbalancers")[0]["vip_port_id"]);
    assert_eq!(f.cloud.objects("loadbalancers")[0]["tags"], json!([]));
    // Its own Service deletes it, with its floating IP.
    open.ensure_load_balancer_deleted(CLUSTER, &victim).await.unwrap();
    assert_nothing_left(&f);
}

/// With the opt-in, the owner (keeping its floating IP) goes first while another namespace
/// still shares the load balancer: the last sharer deletes the load balancer, and the floating
/// IP stays, as its owner asked.
#[tokio::test]
async fn the_owners_keep_floatingip_governs_when_its_last_sharer_deletes_the_load_balancer() {
    let f = start(Duration::from_millis(20)).await;
    let open = lb_with(
        &f,
        LoadBalancerOpts {
            max_shared_lb: 3,
            allow_cross_namespace_sharing: true,
            ..Default::default()
        },
    );
    let ns = nodes(&f, &["node-a"]);
    let victim = in_ns(
        service(&[("loadbalancer.openstack.org/keep-floatingip", "true")], &[(80, 30080)]),
        "victim",
        "web",
        "a1111111-2222-4333-8444-555555555555",
    );
    let fip = ip_of(&open.ensure_load_balancer(CLUSTER, &victim, &ns).await.unwrap());
    let id = f.cloud.objects("loadbalancers")[0]["id"].as_str().unwrap().to_string();
    let guest = in_ns(
        service(&[(LB_ID, &id)], &[(8080, 31080)]),
        "evil",
        "grab",
        "e1111111-2222-4333-8444-555555555555",
    );
    open.ensure_load_balancer(CLUSTER, &guest, &ns).await.unwrap();
    open.ensure_load_balancer_deleted(CLUSTER, &victim).await.unwrap();
    let lbs = f.cloud.objects("loadbalancers");
    assert_eq!(
        lbs[0]["tags"],
        json!(["kube_service_k8s_evil_grab", OWNER_GONE_TAG, OWNER_GONE_KEEP_FIP_TAG])
    );
    assert_eq!(names(&f, "listeners"), ["listener_0_kube_service_k8s_evil_grab"]);
    open.ensure_load_balancer_deleted(CLUSTER, &guest).await.unwrap();
    assert!(f.cloud.objects("loadbalancers").is_empty());
    let fips = f.cloud.objects("floatingips");
    assert_eq!(fips.len(), 1, "kept, as its owner asked");
    assert_eq!(fips[0]["floating_ip_address"], fip.as_str());
    assert!(fips[0]["port_id"].is_null());
}

/// A load balancer with the Service's own name that this cluster did not create for it
/// (another description) is an error, never adopted, and deleting the Service leaves it. A
/// load balancer made by hand named by load-balancer-id: refused without the opt-in; with it,
/// used with this Service's own listener only, never deleted, its floating IP never deleted.
#[tokio::test]
async fn a_name_clash_is_an_error_and_hand_made_load_balancers_are_only_used() {
    let f = start(Duration::from_millis(20)).await;
    let lb = lb(&f);
    let ns = nodes(&f, &["node-a"]);
    let subnet = f.cloud.neutron_id("subnets", "private-subnet").unwrap();
    let public = f.cloud.neutron_id("networks", "public").unwrap();
    let plant = |name: &'static str, description: &'static str| {
        let (f, subnet, public) = (&f, subnet.clone(), public.clone());
        async move {
            let made = f
                .client
                .post(
                    "test:CreateLoadBalancer",
                    Svc::LoadBalancer,
                    &["lbaas", "loadbalancers"],
                    &json!({"loadbalancer": {"name": name, "description": description, "vip_subnet_id": subnet}}),
                )
                .await
                .unwrap();
            let lb = &made["loadbalancer"];
            let fip = f
                .client
                .post(
                    "test:CreateFloatingIP",
                    Svc::Network,
                    &["floatingips"],
                    &json!({"floatingip": {"floating_network_id": public, "port_id": lb["vip_port_id"],
                        "description": "Floating IP for Kubernetes external service default/web from cluster k8s"}}),
                )
                .await
                .unwrap();
            tokio::time::sleep(Duration::from_millis(100)).await;
            (
                lb["id"].as_str().unwrap().to_string(),
                fip["floatingip"]["floating_ip_address"].as_str().unwrap().to_string(),
            )
        }
    };
    let (_clash_id, _) = plant(LB_NAME, "made by hand").await;
    let svc = service(&[], &[(80, 30080)]);
    let before = snapshot(&f);
    let e = lb.ensure_load_balancer(CLUSTER, &svc, &ns).await.unwrap_err();
    assert!(matches!(e, ProviderError::Invalid { .. }), "{e:?}");
    assert!(e.to_string().contains("not created for it"), "{e}");
    assert!(lb.get_load_balancer(CLUSTER, &svc).await.unwrap().is_none());
    assert!(lb.update_load_balancer(CLUSTER, &svc, &ns).await.is_err());
    lb.ensure_load_balancer_deleted(CLUSTER, &svc).await.unwrap();
    assert_eq!(snapshot(&f), before);

    let (hand_id, hand_fip) = plant("shop-frontend", "made by hand").await;
    let user = in_ns(
        service(&[(LB_ID, &hand_id)], &[(8080, 31080)]),
        "shop",
        "front",
        "b1111111-2222-4333-8444-555555555555",
    );
    let before = snapshot(&f);
    let e = lb.ensure_load_balancer(CLUSTER, &user, &ns).await.unwrap_err();
    assert!(e.to_string().contains("allow-cross-namespace-sharing"), "{e}");
    assert!(lb.get_load_balancer(CLUSTER, &user).await.unwrap().is_none());
    lb.ensure_load_balancer_deleted(CLUSTER, &user).await.unwrap();
    assert_eq!(snapshot(&f), before);

    let open =
        lb_with(&f, LoadBalancerOpts { allow_cross_namespace_sharing: true, ..Default::default() });
    assert_eq!(ip_of(&open.ensure_load_balancer(CLUSTER, &user, &ns).await.unwrap()), hand_fip);
    assert_eq!(listener(&f, 8080)["tags"], json!(["kube_service_k8s_shop_front"]));
    open.ensure_load_balancer_deleted(CLUSTER, &user).await.unwrap();
    let hand: Vec<Value> = f
        .cloud
        .objects("loadbalancers")
        .into_iter()
        .filter(|l| l["id"] == hand_id.as_str())
        .collect();
    assert_eq!(hand.len(), 1, "never deleted");
    assert_eq!(hand[0]["tags"], json!([]));
    assert!(f.cloud.objects("listeners").is_empty(), "only its own listener, gone");
    let fips = f.cloud.objects("floatingips");
    assert!(
        fips.iter().any(|x| x["floating_ip_address"] == hand_fip.as_str()
            && x["port_id"] == hand[0]["vip_port_id"]),
        "{fips:?}"
    );
}

/// `orphans` decides ownership from the same proof as deletion: another cluster's, a
/// hand-made one with our name, and one still shared by another Service are not owned.
#[tokio::test]
async fn orphans_use_the_ownership_proof() {
    let f = start(Duration::from_millis(20)).await;
    let lb = lb_with(&f, LoadBalancerOpts { max_shared_lb: 3, ..Default::default() });
    let ns = nodes(&f, &["node-a"]);
    let owner = service(&[], &[(80, 30080)]);
    lb.ensure_load_balancer(CLUSTER, &owner, &ns).await.unwrap();
    let id = f.cloud.objects("loadbalancers")[0]["id"].as_str().unwrap().to_string();
    let guest = named(
        service(&[(LB_ID, &id)], &[(8080, 31080)]),
        "api",
        "c1111111-2222-4333-8444-555555555555",
    );
    lb.ensure_load_balancer(CLUSTER, &guest, &ns).await.unwrap();
    let listed = lb.list_cloud_load_balancers(CLUSTER).await.unwrap();
    assert!(!listed[0].owned, "shared by another Service: not an orphan");
    let e = lb.delete_cloud_load_balancer(CLUSTER, &listed[0]).await.unwrap_err();
    assert!(matches!(e, ProviderError::Invalid { .. }), "{e:?}");
    lb.ensure_load_balancer_deleted(CLUSTER, &guest).await.unwrap();
    assert!(lb.list_cloud_load_balancers(CLUSTER).await.unwrap()[0].owned);
    // An edited description: no proof.
    f.client
        .put(
            "test:UpdateLoadBalancer",
            Svc::LoadBalancer,
            &["lbaas", "loadbalancers", &id],
            &json!({"loadbalancer": {"description": "touched"}}),
        )
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(!lb.list_cloud_load_balancers(CLUSTER).await.unwrap()[0].owned);
}
