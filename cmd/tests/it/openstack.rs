//! `cloud-controller-manager-openstack` end to end (issue 18 acceptance): the real binary
//! against a real kube-apiserver and the in-process OpenStack emulator
//! (`ccm_emulators::openstack`: Keystone, Nova, Neutron and Octavia on one loopback server).
//! Nodes join with upstream's providerID, labels and addresses (a two-NIC server included); an
//! expired token is renewed without an error surfacing; a `SHUTOFF` server taints its Node, a
//! deleted one deletes it, a Nova outage deletes nothing; a LoadBalancer Service gets a
//! floating IP, follows port changes and the nodes, and deleting it leaves nothing. Every
//! manager's output is scanned for the password (`crate::support`'s secret scanner).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_core::names;
use ccm_emulators::admin::PauseMode;
use ccm_emulators::openstack::{OpenStackCloud, OpenStackOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::{PowerState, World};
use ccm_testbed::fixtures::load_balancer_service;
use k8s_openapi::api::core::v1::{Node, Service, ServicePort};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::Value;

use crate::support::{
    Binary, Env, SecretKind, addresses, has_taint, initialised, label, pairs, provider_id,
    register, register_secret, wait_for,
};

pub const BIN: Binary = Binary {
    path: env!("CARGO_BIN_EXE_cloud-controller-manager-openstack"),
    provider: "openstack",
    clear_prefixes: &["OS_"],
    env: &[],
};

const USER: &str = "ccm-e2e";
/// The password of these tests: distinctive, so the secret scanner finds it anywhere.
pub const PASSWORD: &str = "os-e2e-Password-never-logged-8Vw3Qn";

/// The lifecycle controller's log line for a node whose instance could not be checked.
const CHECK_ERROR: &str = "error checking if node exists";

pub const WORLD: &str = r#"
region: RegionOne
zones: [az-1, az-2]
networks:
  - { name: private, cidr: 10.0.0.0/24 }
  - { name: storage, cidr: 10.1.0.0/24 }
subnets:
  - { name: private-subnet, network: private, zone: az-1, cidr: 10.0.0.0/24 }
  - { name: storage-subnet, network: storage, zone: az-1, cidr: 10.1.0.0/24 }
instances:
  - { name: node-a, zone: az-1, type: m1.medium, private_ips: [10.0.0.11], public_ips: [172.24.4.11] }
  - { name: node-b, zone: az-2, type: m1.large, private_ips: [10.0.0.12] }
  - { name: node-c, zone: az-2, type: m1.small, private_ips: [10.0.0.13], power: stopped }
  - { name: node-d, zone: az-1, type: m1.small, private_ips: [10.0.0.14] }
"#;

/// The emulator with the test's user; node-a has a second NIC on the storage network.
pub async fn emulator(lb_pending: Duration) -> (Arc<OpenStackCloud>, Server) {
    register_secret(SecretKind::OpenStackPassword, PASSWORD);
    let cloud = OpenStackCloud::new(
        World::parse(WORLD).unwrap(),
        OpenStackOptions {
            users: vec![(USER.into(), PASSWORD.into())],
            lb_pending,
            ..OpenStackOptions::default()
        },
    );
    cloud.add_interface("node-a", "storage-subnet", "10.1.0.11").unwrap();
    let server = Server::start(cloud.clone(), ServerOptions::default()).await.unwrap();
    (cloud, server)
}

/// `cloud.conf` as an operator writes it for upstream's CCM, pointing at the emulator.
/// `[Route] router-id` only when `routes`: upstream's manager (and ours) refuses to start the
/// route controller without `--cluster-cidr` once the cloud offers routes.
pub fn cloud_config(
    cloud: &OpenStackCloud,
    url: &str,
    internal_network: bool,
    routes: bool,
) -> String {
    let subnet = cloud.neutron_id("subnets", "private-subnet").unwrap();
    let public = cloud.neutron_id("networks", "public").unwrap();
    let router = cloud.neutron_id("routers", "router1").unwrap();
    let route = if routes { format!("[Route]\nrouter-id = {router}\n") } else { String::new() };
    let networking =
        if internal_network { "[Networking]\ninternal-network-name = private\n" } else { "" };
    format!(
        "[Global]\nauth-url = {url}/identity/v3\nusername = {USER}\npassword = {PASSWORD}\n\
         tenant-name = demo\ndomain-name = Default\nregion = RegionOne\n\
         [LoadBalancer]\nsubnet-id = {subnet}\nfloating-network-id = {public}\n\
         create-monitor = true\nmanage-security-groups = true\n{networking}{route}"
    )
}

/// [`initialised`], with the manager's log in the failure.
async fn initialised_node(nodes: &Api<Node>, name: &str, ccm: &crate::support::Ccm) -> Node {
    match tokio::time::timeout(Duration::from_secs(80), initialised(nodes, name)).await {
        Ok(n) => n,
        Err(_) => panic!("node {name} not initialised; manager log:\n{}", ccm.logs()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_join_tokens_renew_shutoff_taints_deleted_goes_and_an_outage_deletes_nothing() {
    let (cloud, server) = emulator(Duration::from_millis(300)).await;
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm(&cloud_config(&cloud, &server.url(), false, false), &[]);
    let nodes = env.nodes();

    let start = Instant::now();
    register(&nodes, "node-a", "10.0.0.11", "True").await;
    // NotReady: the lifecycle controller checks only such Nodes (deleted below).
    register(&nodes, "node-b", "10.0.0.12", "False").await;
    let a = initialised_node(&nodes, "node-a", &ccm).await;
    let b = initialised_node(&nodes, "node-b", &ccm).await;
    eprintln!("2 nodes initialised {:?} after registration", start.elapsed());
    let id_a = cloud.server_id("node-a").unwrap();
    assert_eq!(
        provider_id(&a),
        Some(format!("openstack:///{id_a}").as_str()),
        "manager log:\n{}",
        ccm.logs()
    );
    assert_eq!(label(&a, names::LABEL_ZONE), Some("az-1"));
    assert_eq!(label(&a, names::LABEL_REGION), Some("RegionOne"));
    assert_eq!(label(&a, names::LABEL_INSTANCE_TYPE), Some("m1.medium"));
    // Two NICs: both ports' fixed IPs are InternalIPs, the floating IP an ExternalIP; the
    // kubelet's Hostname is kept by the cloud-node controller.
    let got = addresses(&a);
    for want in
        [("InternalIP", "10.0.0.11"), ("InternalIP", "10.1.0.11"), ("ExternalIP", "172.24.4.11")]
    {
        assert!(got.contains(&(want.0.to_string(), want.1.to_string())), "{got:?}");
    }
    let id_b = cloud.server_id("node-b").unwrap();
    assert_eq!(provider_id(&b), Some(format!("openstack:///{id_b}").as_str()));
    assert_eq!(label(&b, names::LABEL_ZONE), Some("az-2"));
    assert_eq!(label(&b, names::LABEL_INSTANCE_TYPE), Some("m1.large"));
    assert_eq!(addresses(&b), pairs(&[("InternalIP", "10.0.0.12"), ("Hostname", "node-b")]));

    // Every token expires: the next node still joins (a fresh token), and no error surfaces.
    let issued = cloud.tokens_issued();
    cloud.expire_tokens();
    register(&nodes, "node-d", "10.0.0.14", "True").await;
    let d = initialised_node(&nodes, "node-d", &ccm).await;
    assert_eq!(label(&d, names::LABEL_INSTANCE_TYPE), Some("m1.small"));
    assert!(cloud.tokens_issued() > issued, "no new token after expiry");
    // Warnings and errors only: a bare "401" also matches a random port in a logged URL.
    let logs = ccm.logs();
    assert!(
        logs.lines().any(|l| l.starts_with('I') && is_klog_header(l)),
        "the manager log is not klog's text format, the filter below would match nothing:\n{logs}"
    );
    let surfaced: Vec<&str> = logs
        .lines()
        .filter(|l| is_warning_or_error(l))
        .filter(|l| l.contains("401") || l.to_ascii_lowercase().contains("unauthorized"))
        .collect();
    assert!(surfaced.is_empty(), "a 401 surfaced in the manager log:\n{logs}");

    // A SHUTOFF server: its NotReady node gets the shutdown taint.
    register(&nodes, "node-c", "10.0.0.13", "False").await;
    initialised_node(&nodes, "node-c", &ccm).await;
    wait_for("the shutdown taint on node-c", || async {
        let n = nodes.get("node-c").await.ok()?;
        has_taint(&n, names::TAINT_SHUTDOWN).then_some(())
    })
    .await;

    // A Nova outage: every pass errs, nothing is deleted.
    let errors_before = ccm.logs().matches(CHECK_ERROR).count();
    server.admin().pause(PauseMode::Fail).await.unwrap();
    ccm.wait_for_log(CHECK_ERROR, errors_before + 4).await;
    for name in ["node-a", "node-b", "node-c", "node-d"] {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} deleted during the outage");
    }
    server.admin().resume().await.unwrap();

    // node-c is powered on again: the taint goes. node-b's server is deleted: its node goes.
    assert!(cloud.set_power("node-c", PowerState::Running));
    let start = Instant::now();
    assert!(cloud.delete_server("node-b"));
    wait_for("node-b to be deleted", || async {
        nodes.get_opt("node-b").await.unwrap().is_none().then_some(())
    })
    .await;
    eprintln!("node deleted {:?} after its server was", start.elapsed());
    for name in ["node-a", "node-c", "node-d"] {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} deleted");
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

/// The members' `address:port`, sorted.
fn members(cloud: &OpenStackCloud) -> Vec<String> {
    let mut m: Vec<String> = cloud
        .objects("members")
        .iter()
        .map(|m| format!("{}:{}", str_of(m, "address"), m["protocol_port"]))
        .collect();
    m.sort();
    m
}

async fn ingress_ip(services: &Api<Service>, name: &str) -> Option<String> {
    let s = services.get(name).await.ok()?;
    s.status?.load_balancer?.ingress?.first()?.ip.clone()
}

/// Octavia, floating IPs and security groups the CCM made, one line each.
fn lb_resources(cloud: &OpenStackCloud) -> Vec<String> {
    let mut left = Vec::new();
    for coll in ["loadbalancers", "listeners", "pools", "members", "healthmonitors"] {
        for o in cloud.objects(coll) {
            left.push(format!("{coll} {}", str_of(&o, "name")));
        }
    }
    for sg in cloud.objects("security-groups") {
        if str_of(&sg, "name").starts_with("lb-sg-") {
            left.push(format!("security group {}", str_of(&sg, "name")));
        }
    }
    for fip in cloud.objects("floatingips") {
        if str_of(&fip, "floating_ip_address") != "172.24.4.11" {
            left.push(format!("floating IP {}", str_of(&fip, "floating_ip_address")));
        }
    }
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_service_gets_a_floating_ip_follows_ports_and_nodes_and_leaves_nothing() {
    let (cloud, server) = emulator(Duration::from_millis(300)).await;
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm(&cloud_config(&cloud, &server.url(), true, false), &[]);
    let nodes = env.nodes();
    register(&nodes, "node-a", "10.0.0.11", "True").await;
    register(&nodes, "node-b", "10.0.0.12", "True").await;
    initialised_node(&nodes, "node-a", &ccm).await;
    initialised_node(&nodes, "node-b", &ccm).await;

    let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
    let svc = services
        .create(&PostParams::default(), &load_balancer_service("default", "web", 80))
        .await
        .unwrap();
    let start = Instant::now();
    let ip = wait_for("an address on web", || ingress_ip(&services, "web")).await;
    eprintln!("load balancer ready {:?} after the Service was created", start.elapsed());
    assert!(ip.starts_with("172.24.4."), "not a floating IP: {ip}; log:\n{}", ccm.logs());

    let lbs = cloud.objects("loadbalancers");
    assert_eq!(lbs.len(), 1, "manager log:\n{}", ccm.logs());
    let lb = &lbs[0];
    assert_eq!(str_of(lb, "name"), "kube_service_kubernetes_default_web");
    let vip_port = str_of(lb, "vip_port_id").to_string();
    let fips = cloud.objects("floatingips");
    let fip = fips.iter().find(|f| str_of(f, "floating_ip_address") == ip).expect("the FIP");
    assert_eq!(str_of(fip, "port_id"), vip_port, "the floating IP is on the VIP port");
    let listeners = cloud.objects("listeners");
    assert_eq!(listeners.len(), 1);
    assert_eq!(str_of(&listeners[0], "name"), "listener_0_kube_service_kubernetes_default_web");
    assert_eq!(listeners[0]["protocol_port"], 80);
    let pools = cloud.objects("pools");
    assert_eq!(pools.len(), 1);
    assert_eq!(str_of(&pools[0], "name"), "pool_0_kube_service_kubernetes_default_web");
    let monitors = cloud.objects("healthmonitors");
    assert_eq!(monitors.len(), 1, "create-monitor = true");
    let node_port = svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port.unwrap();
    // manage-security-groups: a group for the Service, allowing the node port, on the nodes'
    // ports.
    let uid = svc.metadata.uid.clone().unwrap();
    let sg_name = format!("lb-sg-{uid}-default-web");
    let sgs = cloud.objects("security-groups");
    let sg =
        sgs.iter().find(|g| str_of(g, "name") == sg_name).expect("the Service's security group");
    let sg_id = str_of(sg, "id").to_string();
    let rules = cloud.objects("security-group-rules");
    assert!(
        rules.iter().any(|r| str_of(r, "security_group_id") == sg_id
            && r["port_range_min"] == node_port
            && str_of(r, "direction") == "ingress"),
        "no ingress rule for node port {node_port}: {rules:#?}"
    );
    let ports_with_sg = cloud
        .objects("ports")
        .iter()
        .filter(|p| {
            p["security_groups"].as_array().into_iter().flatten().any(|g| g == sg_id.as_str())
        })
        .count();
    assert_eq!(ports_with_sg, 2, "the group is on both member nodes' ports");
    assert_eq!(
        members(&cloud),
        [format!("10.0.0.11:{node_port}"), format!("10.0.0.12:{node_port}")],
        "members are the nodes' InternalIPs on the internal network"
    );

    // A second port: a listener and a pool for it.
    let mut ports: Vec<ServicePort> = svc.spec.as_ref().unwrap().ports.clone().unwrap();
    ports.push(ServicePort {
        name: Some("https".into()),
        port: 443,
        protocol: Some("TCP".into()),
        ..Default::default()
    });
    ports[0].name = Some("http".into());
    let patch = serde_json::json!({"spec": {"ports": ports}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_for("a listener per port", || async {
        let mut p: Vec<i64> =
            cloud.objects("listeners").iter().filter_map(|l| l["protocol_port"].as_i64()).collect();
        p.sort();
        (p == [80, 443] && cloud.objects("pools").len() == 2).then_some(())
    })
    .await;

    // A listener annotation changed on the existing Service is applied (upstream #1149).
    let patch = serde_json::json!({"metadata": {"annotations": {
        "loadbalancer.openstack.org/timeout-client-data": "70000"}}});
    services.patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    wait_for("the new client timeout on every listener", || async {
        let l = cloud.objects("listeners");
        (l.len() == 2 && l.iter().all(|l| l["timeout_client_data"] == 70000)).then_some(())
    })
    .await;

    // A new node joins: it becomes a member of both pools.
    register(&nodes, "node-d", "10.0.0.14", "True").await;
    initialised_node(&nodes, "node-d", &ccm).await;
    wait_for("node-d in both pools", || async {
        let m = cloud.objects("members");
        (m.iter().filter(|m| str_of(m, "address") == "10.0.0.14").count() == 2).then_some(())
    })
    .await;

    // Deleting the Service leaves nothing in the cloud.
    services.delete("web", &DeleteParams::default()).await.unwrap();
    wait_for("the Service gone (finalizer removed)", || async {
        services.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    let left = lb_resources(&cloud);
    assert!(left.is_empty(), "left in the cloud: {left:#?}\nmanager log:\n{}", ccm.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_internal_service_gets_the_vip_and_keep_floatingip_keeps_it() {
    let (cloud, server) = emulator(Duration::from_millis(300)).await;
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm(&cloud_config(&cloud, &server.url(), true, false), &[]);
    let nodes = env.nodes();
    register(&nodes, "node-b", "10.0.0.12", "True").await;
    initialised_node(&nodes, "node-b", &ccm).await;
    let services: Api<Service> = Api::namespaced(env.client.clone(), "default");

    let mut internal = load_balancer_service("default", "internal", 8080);
    internal.metadata.annotations = Some(
        [(
            "service.beta.kubernetes.io/openstack-internal-load-balancer".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    services.create(&PostParams::default(), &internal).await.unwrap();
    let mut kept = load_balancer_service("default", "kept", 80);
    kept.metadata.annotations = Some(
        [("loadbalancer.openstack.org/keep-floatingip".to_string(), "true".to_string())].into(),
    );
    services.create(&PostParams::default(), &kept).await.unwrap();

    let vip = wait_for("an address on internal", || ingress_ip(&services, "internal")).await;
    assert!(vip.starts_with("10.0.0."), "an internal Service gets its VIP: {vip}");
    let fip = wait_for("an address on kept", || ingress_ip(&services, "kept")).await;
    assert!(fip.starts_with("172.24.4."), "{fip}; log:\n{}", ccm.logs());

    services.delete("internal", &DeleteParams::default()).await.unwrap();
    services.delete("kept", &DeleteParams::default()).await.unwrap();
    wait_for("both Services gone", || async {
        (services.get_opt("internal").await.unwrap().is_none()
            && services.get_opt("kept").await.unwrap().is_none())
        .then_some(())
    })
    .await;
    assert!(cloud.objects("loadbalancers").is_empty());
    let fips = cloud.objects("floatingips");
    let kept_fip = fips.iter().find(|f| str_of(f, "floating_ip_address") == fip);
    let kept_fip = kept_fip.expect("keep-floatingip: the floating IP is kept");
    assert!(kept_fip["port_id"].is_null(), "kept but no longer associated: {kept_fip}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn routes_follow_pod_cidrs_on_the_router_and_the_ports() {
    let (cloud, server) = emulator(Duration::from_millis(300)).await;
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm(
        &cloud_config(&cloud, &server.url(), true, true),
        &["--cluster-cidr=100.64.0.0/16".into(), "--configure-cloud-routes=true".into()],
    );
    let nodes = env.nodes();
    for (name, ip, cidr) in
        [("node-a", "10.0.0.11", "100.64.1.0/24"), ("node-b", "10.0.0.12", "100.64.2.0/24")]
    {
        let mut node = ccm_testbed::fixtures::kubelet_node(name, ip, "True");
        let spec = node.spec.as_mut().unwrap();
        spec.pod_cidr = Some(cidr.into());
        spec.pod_cidrs = Some(vec![cidr.into()]);
        nodes.create(&PostParams::default(), &node).await.unwrap();
    }
    let router_routes = || {
        let r = cloud.objects("routers");
        let mut v: Vec<String> = r
            .iter()
            .flat_map(|r| r["routes"].as_array().cloned().unwrap_or_default())
            .map(|r| format!("{} via {}", str_of(&r, "destination"), str_of(&r, "nexthop")))
            .collect();
        v.sort();
        v
    };
    wait_for("a route per node on router1", || async {
        (router_routes() == ["100.64.1.0/24 via 10.0.0.11", "100.64.2.0/24 via 10.0.0.12"])
            .then_some(())
    })
    .await;
    let pairs_of = |ip: &str| -> Vec<String> {
        cloud
            .objects("ports")
            .iter()
            .filter(|p| {
                p["fixed_ips"].as_array().into_iter().flatten().any(|f| f["ip_address"] == ip)
            })
            .flat_map(|p| p["allowed_address_pairs"].as_array().cloned().unwrap_or_default())
            .map(|a| str_of(&a, "ip_address").to_string())
            .collect()
    };
    wait_for("the pod CIDR allowed on node-a's port", || async {
        pairs_of("10.0.0.11").contains(&"100.64.1.0/24".to_string()).then_some(())
    })
    .await;

    nodes.delete("node-a", &DeleteParams::default()).await.unwrap();
    wait_for("node-a's route gone", || async {
        (router_routes() == ["100.64.2.0/24 via 10.0.0.12"]).then_some(())
    })
    .await;
    wait_for("node-a's allowed address pair gone", || async {
        (!pairs_of("10.0.0.11").contains(&"100.64.1.0/24".to_string())).then_some(())
    })
    .await;
    drop(ccm);
}

#[tokio::test]
async fn a_bad_config_fails_at_start_naming_the_key_and_never_the_password() {
    register_secret(SecretKind::OpenStackPassword, PASSWORD);
    let dir = tempfile::tempdir().unwrap();
    let (cloud, _server) = emulator(Duration::from_millis(300)).await;
    let good = cloud_config(&cloud, "http://127.0.0.1:9", false, false);

    let (code, stderr) =
        BIN.run_to_exit(dir.path(), &good.replace("create-monitor", "create-monitr")).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("create-monitr"), "{stderr}");

    let (code, stderr) = BIN
        .run_to_exit(dir.path(), &good.replace("create-monitor = true", "monitor-delay = soon"))
        .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("[LoadBalancer] monitor-delay"), "{stderr}");

    let no_auth =
        good.lines().filter(|l| !l.starts_with("auth-url")).collect::<Vec<_>>().join("\n");
    let (code, stderr) = BIN.run_to_exit(dir.path(), &no_auth).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("auth-url"), "{stderr}");

    // Every run above was given the password: the scanner found it in no output.
    assert!(good.contains(PASSWORD));
}

/// A klog text line's header: severity letter, then month and day (`W1128 10:30:33.407016 ...`).
fn is_klog_header(line: &str) -> bool {
    let b = line.as_bytes();
    b.len() > 5 && b[1..5].iter().all(u8::is_ascii_digit) && b.get(5) == Some(&b' ')
}

/// A klog warning (`W`) or error (`E`) line.
fn is_warning_or_error(line: &str) -> bool {
    (line.starts_with('W') || line.starts_with('E')) && is_klog_header(line)
}
