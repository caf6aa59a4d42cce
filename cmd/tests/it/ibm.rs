//! `cloud-controller-manager-ibm` end to end (issue 19 acceptance): the real binary against a
//! real kube-apiserver and the in-process IBM Cloud emulator (`ccm_emulators::ibm`: IAM,
//! Resource Manager and VPC on one loopback server). Labelled (IKS-provisioned) and
//! unlabelled (VPC lookup) nodes join with upstream's providerID and labels; an IAM token
//! expiry is renewed; a stopped instance taints its node, a deleted one deletes it, a VPC
//! outage deletes nothing; a LoadBalancer Service (public and private) gets a hostname, its
//! members follow the nodes and deleting it leaves nothing. Every manager's output is scanned
//! for the API key (`crate::support`'s secret scanner).

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_core::names;
use ccm_emulators::admin::PauseMode;
use ccm_emulators::ibm::{IbmCloud, IbmOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::World;
use ccm_testbed::fixtures::{kubelet_node, load_balancer_service};
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::Value;

use crate::support::{
    Binary, Env, SecretKind, addresses, has_taint, initialised, label, pairs, provider_id,
    register, register_secret, wait_for,
};

pub const BIN: Binary = Binary {
    path: env!("CARGO_BIN_EXE_cloud-controller-manager-ibm"),
    provider: "ibm",
    clear_prefixes: &["IBM", "ENABLE_VPC_PUBLIC_ENDPOINT"],
    env: &[],
};

/// The API key of these tests: distinctive, so the secret scanner finds it anywhere.
pub const API_KEY: &str = "ibm-e2e-ApiKey-never-logged-7Qx2Lm";

pub const CLUSTER: &str = "e2ecluster01";

const IP_TYPE: &str = "service.kubernetes.io/ibm-load-balancer-cloud-provider-ip-type";

/// The lifecycle controller's log line for a node whose instance could not be checked.
const CHECK_ERROR: &str = "error checking if node exists";

pub const WORLD: &str = r#"
region: us-south
zones: [us-south-1, us-south-2]
networks:
  - { name: vpc-1, cidr: 10.240.0.0/16 }
subnets:
  - { name: subnet-1, network: vpc-1, zone: us-south-1, cidr: 10.240.0.0/24 }
  - { name: subnet-2, network: vpc-1, zone: us-south-2, cidr: 10.240.1.0/24 }
instances:
  - { name: node-a, zone: us-south-1, type: bx2-4x16, subnet: subnet-1, private_ips: [10.240.0.4] }
  - { name: node-b, zone: us-south-2, type: bx2-2x8, subnet: subnet-2, private_ips: [10.240.1.4] }
  - { name: node-c, zone: us-south-2, type: cx2-8x16, subnet: subnet-2, private_ips: [10.240.1.5], power: stopped }
"#;

/// The emulator (IAM, Resource Manager, VPC) with the test's API key.
pub async fn emulator(lb_pending: Duration) -> (Arc<IbmCloud>, Server) {
    register_secret(SecretKind::IbmApiKey, API_KEY);
    let cloud = IbmCloud::new(
        World::parse(WORLD).unwrap(),
        IbmOptions { api_keys: vec![API_KEY.into()], lb_pending, ..IbmOptions::default() },
    );
    let server = Server::start(cloud.clone(), ServerOptions::default()).await.unwrap();
    (cloud, server)
}

/// The cloud config (upstream's keys) pointing every endpoint at the emulator; the API key
/// file is written next to it.
pub fn cloud_config(dir: &std::path::Path, url: &str, account: &str) -> String {
    let key = dir.join("api-key");
    std::fs::write(&key, format!("{API_KEY}\n")).unwrap();
    format!(
        "[global]\nversion = 1.1.0\n[kubernetes]\nconfig-file = /etc/kubernetes/kubeconfig\n\
         [provider]\ncluster-default-provider = g2\naccountID = {account}\nclusterID = {CLUSTER}\n\
         region = us-south\ng2workerServiceAccountID = {account}\ng2VpcName = vpc-1\n\
         g2Credentials = {}\ng2ResourceGroupName = default\ng2VpcSubnetNames = subnet-1,subnet-2\n\
         g2EndpointOverride = {url}\niamEndpointOverride = {url}\nrmEndpointOverride = {url}\ntaggingEndpointOverride = {url}\n",
        key.display()
    )
}

/// A kubelet-registered Node, with the IKS provisioner's labels when `worker` is given.
pub fn ibm_node(name: &str, ip: &str, ready: &str, worker: Option<(&str, &str)>) -> Node {
    let mut n = kubelet_node(name, ip, ready);
    if let Some((worker, zone)) = worker {
        n.metadata.labels = Some(
            [
                ("ibm-cloud.kubernetes.io/internal-ip", ip),
                ("ibm-cloud.kubernetes.io/worker-id", worker),
                ("ibm-cloud.kubernetes.io/machine-type", "bx2.4x16"),
                ("ibm-cloud.kubernetes.io/zone", zone),
                ("ibm-cloud.kubernetes.io/region", "us-south"),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
        );
    }
    n
}

async fn create(nodes: &Api<Node>, node: Node) {
    nodes.create(&PostParams::default(), &node).await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn labelled_and_vpc_nodes_join_tokens_renew_and_an_outage_deletes_nothing() {
    let (cloud, server) = emulator(Duration::from_millis(500)).await;
    let account = cloud.account_id();
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm(&cloud_config(&env.dir, &server.url(), &account), &[]);
    let nodes = env.nodes();

    // An IKS-provisioned node (labels) and a VPC instance without labels.
    let start = Instant::now();
    create(
        &nodes,
        ibm_node("10.240.0.9", "10.240.0.9", "True", Some(("kube-w-00000109", "us-south-1"))),
    )
    .await;
    register(&nodes, "node-a", "10.240.0.4", "True").await;
    let labelled = initialised(&nodes, "10.240.0.9").await;
    let vpc = initialised(&nodes, "node-a").await;
    eprintln!("2 nodes initialised {:?} after registration", start.elapsed());
    assert_eq!(
        provider_id(&labelled),
        Some(format!("ibm://{account}///{CLUSTER}/kube-w-00000109").as_str()),
        "manager log:\n{}",
        ccm.logs()
    );
    assert_eq!(label(&labelled, names::LABEL_ZONE), Some("us-south-1"));
    assert_eq!(label(&labelled, names::LABEL_REGION), Some("us-south"));
    assert_eq!(label(&labelled, names::LABEL_INSTANCE_TYPE), Some("bx2.4x16"));
    assert_eq!(
        addresses(&labelled),
        // The kubelet's Hostname is kept by the cloud-node controller (upstream too).
        pairs(&[
            ("InternalIP", "10.240.0.9"),
            ("ExternalIP", "10.240.0.9"),
            ("Hostname", "10.240.0.9")
        ])
    );
    let id_a = cloud.instance_id("node-a").unwrap();
    assert_eq!(provider_id(&vpc), Some(format!("ibm://{account}///{CLUSTER}/{id_a}").as_str()));
    assert_eq!(label(&vpc, names::LABEL_ZONE), Some("us-south-1"));
    assert_eq!(label(&vpc, names::LABEL_REGION), Some("us-south"));
    assert_eq!(label(&vpc, names::LABEL_INSTANCE_TYPE), Some("bx2-4x16"));
    assert_eq!(
        addresses(&vpc),
        pairs(&[
            ("InternalIP", "10.240.0.4"),
            ("ExternalIP", "10.240.0.4"),
            ("Hostname", "node-a")
        ])
    );

    // Every token expires: the next node still joins (a fresh token is fetched).
    let issued = cloud.tokens_issued();
    cloud.expire_tokens();
    create(&nodes, ibm_node("node-b", "10.240.1.4", "False", None)).await;
    let b = initialised(&nodes, "node-b").await;
    assert_eq!(label(&b, names::LABEL_INSTANCE_TYPE), Some("bx2-2x8"));
    assert!(cloud.tokens_issued() > issued, "no new token after expiry");

    // A stopped instance: its NotReady node gets the shutdown taint.
    create(&nodes, ibm_node("node-c", "10.240.1.5", "False", None)).await;
    initialised(&nodes, "node-c").await;
    wait_for("the shutdown taint on node-c", || async {
        let n = nodes.get("node-c").await.ok()?;
        has_taint(&n, names::TAINT_SHUTDOWN).then_some(())
    })
    .await;

    // A VPC outage: every pass errs, nothing is deleted.
    let errors_before = ccm.logs().matches(CHECK_ERROR).count();
    server.admin().pause(PauseMode::Fail).await.unwrap();
    ccm.wait_for_log(CHECK_ERROR, errors_before + 4).await;
    for name in ["10.240.0.9", "node-a", "node-b", "node-c"] {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} deleted during the outage");
    }
    server.admin().resume().await.unwrap();

    // node-b's instance is deleted: its (NotReady) node goes; the others stay.
    let start = Instant::now();
    assert!(cloud.delete_instance("node-b"));
    wait_for("node-b to be deleted", || async {
        nodes.get_opt("node-b").await.unwrap().is_none().then_some(())
    })
    .await;
    eprintln!("node deleted {:?} after its instance was", start.elapsed());
    for name in ["10.240.0.9", "node-a", "node-c"] {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} deleted");
    }
}

async fn lbs(server: &Server) -> Vec<Value> {
    let state = server.admin().state().await.unwrap();
    state["cloud"]["load_balancers"].as_array().cloned().unwrap_or_default()
}

fn member_ips(lb: &Value) -> Vec<String> {
    let mut ips: Vec<String> = lb["pools"][0]["members"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|m| m["target"]["address"].as_str().map(str::to_string))
        .collect();
    ips.sort();
    ips
}

async fn hostname(services: &Api<Service>, name: &str) -> Option<String> {
    let s = services.get(name).await.ok()?;
    s.status?.load_balancer?.ingress?.first()?.hostname.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancer_services_get_hostnames_follow_nodes_and_leave_nothing() {
    let (cloud, server) = emulator(Duration::from_millis(500)).await;
    let account = cloud.account_id();
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm(&cloud_config(&env.dir, &server.url(), &account), &[]);
    let nodes = env.nodes();
    create(
        &nodes,
        ibm_node("10.240.0.9", "10.240.0.9", "True", Some(("kube-w-00000109", "us-south-1"))),
    )
    .await;
    create(&nodes, ibm_node("node-a", "10.240.0.4", "True", None)).await;
    initialised(&nodes, "10.240.0.9").await;
    initialised(&nodes, "node-a").await;

    let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
    let public = services
        .create(&PostParams::default(), &load_balancer_service("default", "web", 80))
        .await
        .unwrap();
    let mut private = load_balancer_service("default", "internal", 8080);
    private.metadata.annotations = Some([(IP_TYPE.to_string(), "private".to_string())].into());
    let private = services.create(&PostParams::default(), &private).await.unwrap();

    let start = Instant::now();
    let host = wait_for("a hostname on web", || hostname(&services, "web")).await;
    let host_private = wait_for("a hostname on internal", || hostname(&services, "internal")).await;
    eprintln!("2 load balancers ready {:?} after the Services were created", start.elapsed());
    let all = lbs(&server).await;
    assert_eq!(all.len(), 2, "manager log:\n{}", ccm.logs());
    for (svc, host, public_lb) in [(&public, &host, true), (&private, &host_private, false)] {
        let uid = svc.metadata.uid.as_deref().unwrap().replace('-', "");
        let port = &svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0];
        let node_port = port.node_port.unwrap();
        let name = format!("kube-{CLUSTER}-{uid}");
        let lb = all.iter().find(|l| l["name"] == name.as_str()).expect("named as upstream");
        assert_eq!(lb["hostname"], host.as_str());
        assert_eq!(lb["is_public"], public_lb);
        assert_eq!(lb["listeners"].as_array().unwrap().len(), 1);
        assert_eq!(lb["listeners"][0]["port"], port.port);
        let pool = &lb["pools"][0];
        assert_eq!(pool["name"], format!("tcp-{}-{node_port}", port.port).as_str());
        assert_eq!(pool["health_monitor"]["type"], "tcp");
        assert_eq!(pool["health_monitor"]["port"], node_port);
        assert_eq!(member_ips(lb), ["10.240.0.4", "10.240.0.9"]);
    }

    // A new node joins: both load balancers get it as a member.
    create(&nodes, ibm_node("node-b", "10.240.1.4", "True", None)).await;
    initialised(&nodes, "node-b").await;
    wait_for("node-b as a member of both load balancers", || async {
        let all = lbs(&server).await;
        (all.len() == 2
            && all.iter().all(|lb| member_ips(lb) == ["10.240.0.4", "10.240.0.9", "10.240.1.4"]))
        .then_some(())
    })
    .await;

    // Deleting the Services leaves nothing in the cloud.
    services.delete("web", &DeleteParams::default()).await.unwrap();
    services.delete("internal", &DeleteParams::default()).await.unwrap();
    wait_for("no load balancer left", || async { lbs(&server).await.is_empty().then_some(()) })
        .await;
    wait_for("the Services gone (finalizer removed)", || async {
        (services.get_opt("web").await.unwrap().is_none()
            && services.get_opt("internal").await.unwrap().is_none())
        .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_bad_config_or_key_file_fails_at_start_naming_the_key_and_never_the_api_key() {
    register_secret(SecretKind::IbmApiKey, API_KEY);
    let dir = tempfile::tempdir().unwrap();
    let good = cloud_config(dir.path(), "http://127.0.0.1:9", "acct-1");

    let (code, stderr) =
        BIN.run_to_exit(dir.path(), &good.replace("g2VpcName = vpc-1\n", "")).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("[provider] g2VpcName"), "{stderr}");

    let (code, stderr) = BIN.run_to_exit(dir.path(), &good.replace("= g2\n", "= gc\n")).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cluster-default-provider"), "{stderr}");

    // A key file holding two words (upstream logs such a key): an error naming the file.
    std::fs::write(dir.path().join("api-key"), format!("{API_KEY} extra\n")).unwrap();
    let (code, stderr) = BIN.run_to_exit_with(dir.path(), &good, &["-v=10".into()]).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("g2Credentials"), "{stderr}");

    std::fs::remove_file(dir.path().join("api-key")).unwrap();
    let (code, stderr) = BIN.run_to_exit(dir.path(), &good).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("g2Credentials") && stderr.contains("cannot read"), "{stderr}");
}
