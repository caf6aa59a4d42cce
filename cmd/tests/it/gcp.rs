//! `cloud-controller-manager-gcp` end to end (issue 17 acceptance): the real binary against a
//! real kube-apiserver and the in-process Compute Engine emulator (`ccm_emulators::gcp`:
//! Compute v1 and the metadata server on one loopback server), started as upstream's CCM is
//! (`--cloud-provider=gce`, `gce.conf`, credentials from the metadata server that
//! `GCE_METADATA_HOST` names). Nodes in two zones join with upstream's providerID, labels and
//! addresses; a stopped instance taints its Node, a deleted one deletes it, a Compute outage
//! deletes nothing; external and internal LoadBalancer Services get addresses, follow the nodes
//! and leave nothing behind; routes and node IPAM from alias ranges. Every manager's output is
//! scanned for the tokens the emulator issued.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_core::names;
use ccm_emulators::admin::PauseMode;
use ccm_emulators::gcp::{GcpCloud, GcpOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::{PowerState, World};
use ccm_testbed::fixtures::load_balancer_service;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Service};
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::support::{
    Binary, Ccm, Env, SecretKind, addresses, has_taint, initialised, label, provider_id, register,
    register_secret, wait_for,
};

pub const BIN: Binary = Binary {
    path: env!("CARGO_BIN_EXE_cloud-controller-manager-gcp"),
    provider: "gce",
    clear_prefixes: &["GCE_", "GOOGLE_"],
    env: &[],
};

pub const PROJECT: &str = "e2e-project";

/// The lifecycle controller's log line for a node whose instance could not be checked.
const CHECK_ERROR: &str = "error checking if node exists";

/// Four instances in two zones; node-a has an external IP and an alias range, node-d's
/// kubelet registers with its FQDN.
pub const WORLD: &str = r#"
region: us-central1
zones: [us-central1-a, us-central1-b]
networks:
  - { name: k8s-net, cidr: 10.0.0.0/8 }
subnets:
  - { name: subnet-a, network: k8s-net, zone: us-central1-a, cidr: 10.0.0.0/20 }
  - { name: subnet-b, network: k8s-net, zone: us-central1-b, cidr: 10.0.16.0/20 }
instances:
  - { name: node-a, zone: us-central1-a, subnet: subnet-a, type: n2-standard-4, private_ips: [10.0.0.11], public_ips: [34.1.2.3], tags: { gce.tags: k8s-node, gce.alias: 10.64.1.0/24 } }
  - { name: node-b, zone: us-central1-b, subnet: subnet-b, type: e2-standard-2, private_ips: [10.0.16.12], tags: { gce.tags: k8s-node, gce.alias: 10.64.2.0/24 } }
  - { name: node-c, zone: us-central1-b, subnet: subnet-b, private_ips: [10.0.16.13], tags: { gce.tags: k8s-node } }
  - { name: node-d, zone: us-central1-a, subnet: subnet-a, private_ips: [10.0.0.14], tags: { gce.tags: k8s-node } }
"#;

/// The emulator (operations take `pending` to finish).
pub async fn emulator(pending: Duration) -> (Arc<GcpCloud>, Server) {
    let cloud = GcpCloud::new(
        World::parse(WORLD).unwrap(),
        GcpOptions { project: PROJECT.into(), pending, ..GcpOptions::default() },
    );
    let server = Server::start(cloud.clone(), ServerOptions::default()).await.unwrap();
    (cloud, server)
}

/// `gce.conf` as an operator writes it for upstream's CCM on a multi-zone cluster, with
/// Compute at the emulator (`api-endpoint`, the Go client's base path).
pub fn gce_conf(url: &str) -> String {
    format!(
        "[global]\nproject-id = {PROJECT}\nnetwork-name = k8s-net\nnode-tags = k8s-node\n\
         multizone = true\napi-endpoint = {url}/compute/v1/\n"
    )
}

/// The manager's environment: the metadata server is the emulator's.
pub fn metadata_env(server: &Server) -> Vec<(String, String)> {
    let host = server.url().trim_start_matches("http://").to_string();
    vec![("GCE_METADATA_HOST".into(), host)]
}

/// Registers every token the emulator issued with the secret scanner (before the managers'
/// logs are scanned, when `Ccm` drops).
pub fn register_tokens(cloud: &GcpCloud) {
    for t in cloud.tokens() {
        register_secret(SecretKind::GoogleToken, &t);
    }
}

/// [`initialised`], with the manager's log in the failure.
pub async fn initialised_node(nodes: &Api<Node>, name: &str, ccm: &Ccm) -> Node {
    match tokio::time::timeout(Duration::from_secs(80), initialised(nodes, name)).await {
        Ok(n) => n,
        Err(_) => panic!("node {name} not initialised; manager log:\n{}", ccm.logs()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nodes_in_two_zones_join_a_stopped_one_is_tainted_a_deleted_one_goes_and_an_outage_deletes_nothing()
 {
    let (cloud, server) = emulator(Duration::from_millis(200)).await;
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm_with_env(
        &gce_conf(&server.url()),
        &["--configure-cloud-routes=false".into()],
        &metadata_env(&server),
    );
    let nodes = env.nodes();

    let start = Instant::now();
    register(&nodes, "node-a", "10.0.0.11", "True").await;
    // NotReady: the lifecycle controller checks only such Nodes (deleted below).
    register(&nodes, "node-b", "10.0.16.12", "False").await;
    // A kubelet that registers with its FQDN: the instance is the name up to the first dot.
    let fqdn = format!("node-d.us-central1-a.c.{PROJECT}.internal");
    register(&nodes, &fqdn, "10.0.0.14", "True").await;
    let a = initialised_node(&nodes, "node-a", &ccm).await;
    let b = initialised_node(&nodes, "node-b", &ccm).await;
    let d = initialised_node(&nodes, &fqdn, &ccm).await;
    eprintln!("3 nodes initialised {:?} after registration", start.elapsed());
    assert_eq!(
        provider_id(&a),
        Some(format!("gce://{PROJECT}/us-central1-a/node-a").as_str()),
        "manager log:\n{}",
        ccm.logs()
    );
    assert_eq!(label(&a, names::LABEL_ZONE), Some("us-central1-a"));
    assert_eq!(label(&a, names::LABEL_REGION), Some("us-central1"));
    assert_eq!(label(&a, names::LABEL_INSTANCE_TYPE), Some("n2-standard-4"));
    let got = addresses(&a);
    for want in [("InternalIP", "10.0.0.11"), ("ExternalIP", "34.1.2.3")] {
        assert!(got.contains(&(want.0.to_string(), want.1.to_string())), "{got:?}");
    }
    assert_eq!(provider_id(&b), Some(format!("gce://{PROJECT}/us-central1-b/node-b").as_str()));
    assert_eq!(label(&b, names::LABEL_ZONE), Some("us-central1-b"));
    assert_eq!(label(&b, names::LABEL_INSTANCE_TYPE), Some("e2-standard-2"));
    assert_eq!(provider_id(&d), Some(format!("gce://{PROJECT}/us-central1-a/node-d").as_str()));

    // A stopped instance (TERMINATED in Compute): its NotReady node gets the shutdown taint.
    assert!(cloud.set_power("node-c", PowerState::Stopped));
    register(&nodes, "node-c", "10.0.16.13", "False").await;
    initialised_node(&nodes, "node-c", &ccm).await;
    wait_for("the shutdown taint on node-c", || async {
        let n = nodes.get("node-c").await.ok()?;
        has_taint(&n, names::TAINT_SHUTDOWN).then_some(())
    })
    .await;

    // A Compute outage: every pass errs, nothing is deleted.
    let errors_before = ccm.logs().matches(CHECK_ERROR).count();
    server.admin().pause(PauseMode::Fail).await.unwrap();
    ccm.wait_for_log(CHECK_ERROR, errors_before + 4).await;
    for name in ["node-a", "node-b", "node-c", fqdn.as_str()] {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} deleted during the outage");
    }
    server.admin().resume().await.unwrap();

    // node-b's instance is deleted: its Node goes, the others stay.
    let start = Instant::now();
    assert!(cloud.delete_instance("node-b"));
    wait_for("node-b to be deleted", || async {
        nodes.get_opt("node-b").await.unwrap().is_none().then_some(())
    })
    .await;
    eprintln!("node deleted {:?} after its instance was", start.elapsed());
    for name in ["node-a", "node-c", fqdn.as_str()] {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} deleted");
    }
    register_tokens(&cloud);
    drop(ccm);
}

#[tokio::test]
async fn a_bad_config_fails_at_start_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = gce_conf("http://127.0.0.1:9");
    let (code, stderr) =
        BIN.run_to_exit(dir.path(), &good.replace("multizone = true", "multizone = maybe")).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("multizone"), "{stderr}");

    let (code, stderr) = BIN.run_to_exit(dir.path(), &good.replace("node-tags", "node-tag")).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("node-tag"), "{stderr}");
}

fn str_of<'a>(v: &'a serde_json::Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

/// The names of a collection's resources in the emulator, sorted.
fn names(cloud: &GcpCloud, coll: &str) -> Vec<String> {
    let mut v: Vec<String> =
        cloud.resources(coll).iter().map(|r| str_of(r, "name").to_string()).collect();
    v.sort();
    v
}

/// The instance names a link list holds, sorted.
fn instance_names(v: &serde_json::Value) -> Vec<String> {
    let mut n: Vec<String> = v
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(serde_json::Value::as_str)
        .map(|l| l.rsplit('/').next().unwrap_or(l).to_string())
        .collect();
    n.sort();
    n
}

async fn ingress_ip(services: &Api<Service>, name: &str) -> Option<String> {
    let s = services.get(name).await.ok()?;
    s.status?.load_balancer?.ingress?.first()?.ip.clone()
}

/// Every load-balancer resource left in the emulator, one line each (the world's own firewall
/// rules are none: the world has none).
fn lb_resources(cloud: &GcpCloud) -> Vec<String> {
    let mut left = Vec::new();
    for coll in [
        "forwardingRules",
        "targetPools",
        "addresses",
        "httpHealthChecks",
        "healthChecks",
        "backendServices",
        "firewalls",
    ] {
        for n in names(cloud, coll) {
            left.push(format!("{coll} {n}"));
        }
    }
    left
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn external_and_internal_load_balancers_get_addresses_follow_nodes_and_leave_nothing() {
    let (cloud, server) = emulator(Duration::from_millis(200)).await;
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let conf = format!("{}subnetwork-name = subnet-a\n", gce_conf(&server.url()));
    let ccm = env.spawn_ccm_with_env(
        &conf,
        &["--configure-cloud-routes=false".into()],
        &metadata_env(&server),
    );
    let nodes = env.nodes();
    register(&nodes, "node-a", "10.0.0.11", "True").await;
    register(&nodes, "node-b", "10.0.16.12", "True").await;
    initialised_node(&nodes, "node-a", &ccm).await;
    initialised_node(&nodes, "node-b", &ccm).await;

    let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
    let web = services
        .create(&PostParams::default(), &load_balancer_service("default", "web", 80))
        .await
        .unwrap();
    let mut ilb = load_balancer_service("default", "ilb", 8080);
    ilb.metadata.annotations =
        Some([("networking.gke.io/load-balancer-type".to_string(), "Internal".to_string())].into());
    let ilb = services.create(&PostParams::default(), &ilb).await.unwrap();
    let start = Instant::now();
    let ip = wait_for("an address on web", || ingress_ip(&services, "web")).await;
    let ilb_ip = wait_for("an address on ilb", || ingress_ip(&services, "ilb")).await;
    eprintln!("both load balancers ready {:?} after the Services were created", start.elapsed());

    // The cluster ID upstream keeps in ConfigMap kube-system/ingress-uid (created by the CCM).
    let cms: Api<ConfigMap> = Api::namespaced(env.client.clone(), "kube-system");
    let cm = cms.get("ingress-uid").await.unwrap();
    let id = cm.data.unwrap().get("uid").cloned().unwrap();
    assert_eq!(id.len(), 16, "{id}");

    // External: a regional address, target pool, forwarding rule, the shared legacy health
    // check and the two firewalls, named as upstream.
    let lb = ccm_core::cloud::default_load_balancer_name(&web);
    let rule = cloud.resource("forwardingRules", "regions/us-central1", &lb).expect("the rule");
    assert_eq!(str_of(&rule, "IPAddress"), ip);
    assert_eq!(str_of(&rule, "portRange"), "80-80");
    assert!(str_of(&rule, "target").ends_with(&format!("/targetPools/{lb}")), "{rule}");
    let pool = cloud.resource("targetPools", "regions/us-central1", &lb).expect("the pool");
    assert_eq!(instance_names(&pool["instances"]), ["node-a", "node-b"]);
    let hc = format!("k8s-{id}-node");
    assert_eq!(names(&cloud, "httpHealthChecks"), [hc]);
    let fws = names(&cloud, "firewalls");
    for want in [format!("k8s-fw-{lb}"), format!("k8s-{id}-node-http-hc")] {
        assert!(fws.contains(&want), "{want} not in {fws:?}");
    }
    let fw = cloud.resource("firewalls", "global", &format!("k8s-fw-{lb}")).unwrap();
    assert_eq!(fw["targetTags"], serde_json::json!(["k8s-node"]));
    assert_eq!(fw["sourceRanges"], serde_json::json!(["0.0.0.0/0"]));

    // Internal: per-zone instance groups, a health check, a regional backend service and an
    // internal forwarding rule on the subnet.
    let ilb_name = ccm_core::cloud::default_load_balancer_name(&ilb);
    let irule = cloud.resource("forwardingRules", "regions/us-central1", &ilb_name).unwrap();
    assert_eq!(str_of(&irule, "IPAddress"), ilb_ip);
    assert_eq!(str_of(&irule, "loadBalancingScheme"), "INTERNAL");
    assert!(ilb_ip.starts_with("10.0."), "an internal address on subnet-a: {ilb_ip}");
    let igs = cloud.resources("instanceGroups");
    let ig_name = format!("k8s-ig--{id}");
    assert_eq!(igs.len(), 2, "one group per zone: {igs:#?}");
    assert!(igs.iter().all(|g| str_of(g, "name") == ig_name));
    assert_eq!(names(&cloud, "backendServices"), [ilb_name]);

    // A third node: it joins the target pool and its zone's instance group.
    register(&nodes, "node-d", "10.0.0.14", "True").await;
    initialised_node(&nodes, "node-d", &ccm).await;
    wait_for("node-d in the target pool", || async {
        let pool = cloud.resource("targetPools", "regions/us-central1", &lb)?;
        (instance_names(&pool["instances"]) == ["node-a", "node-b", "node-d"]).then_some(())
    })
    .await;

    // Deleting both Services leaves nothing of them.
    services.delete("web", &DeleteParams::default()).await.unwrap();
    services.delete("ilb", &DeleteParams::default()).await.unwrap();
    wait_for("both Services gone (finalizers removed)", || async {
        (services.get_opt("web").await.unwrap().is_none()
            && services.get_opt("ilb").await.unwrap().is_none())
        .then_some(())
    })
    .await;
    let left = lb_resources(&cloud);
    assert!(left.is_empty(), "left in the cloud: {left:#?}\nmanager log:\n{}", ccm.logs());
    register_tokens(&cloud);
    drop(ccm);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_ipam_gives_each_node_its_alias_range() {
    let (cloud, server) = emulator(Duration::from_millis(200)).await;
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm_with_env(
        &gce_conf(&server.url()),
        &[
            "--configure-cloud-routes=false".into(),
            "--allocate-node-cidrs=true".into(),
            "--cidr-allocator-type=CloudAllocator".into(),
            "--cluster-cidr=10.64.0.0/14".into(),
        ],
        &metadata_env(&server),
    );
    let nodes = env.nodes();
    register(&nodes, "node-a", "10.0.0.11", "True").await;
    register(&nodes, "node-b", "10.0.16.12", "True").await;
    for (name, want) in [("node-a", "10.64.1.0/24"), ("node-b", "10.64.2.0/24")] {
        let got = wait_for(&format!("{name}'s pod CIDR"), || async {
            nodes.get(name).await.ok()?.spec?.pod_cidr
        })
        .await;
        assert_eq!(got, want, "manager log:\n{}", ccm.logs());
        let n = nodes.get(name).await.unwrap();
        assert_eq!(n.spec.unwrap().pod_cidrs, Some(vec![want.to_string()]));
    }
    register_tokens(&cloud);
    drop(ccm);
}

const AUTH_PLUGIN: &str = env!("CARGO_BIN_EXE_auth-provider-gcp");

/// Runs `auth-provider-gcp` as the kubelet does: `args`, one request on stdin, the metadata
/// server at `server`. (exit code, stdout, stderr); stderr and stdout are scanned for tokens.
async fn auth_plugin(
    server: &Server,
    cloud: &GcpCloud,
    args: &[&str],
    stdin: &str,
) -> (i32, String, String) {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new(AUTH_PLUGIN)
        .args(args)
        .env_remove("GOOGLE_APPLICATION_CREDENTIALS")
        .env("GCE_METADATA_HOST", server.url().trim_start_matches("http://"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // A plugin that refuses its arguments exits before reading stdin: a broken pipe here is
    // that refusal, judged below by the exit code and stderr.
    let mut pipe = child.stdin.take().unwrap();
    match pipe.write_all(stdin.as_bytes()).await {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.unwrap(),
    }
    drop(pipe);
    let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
        .await
        .unwrap()
        .unwrap();
    register_tokens(cloud);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    crate::support::assert_no_secrets("auth-provider-gcp (stderr)", &stderr);
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), stderr)
}

#[tokio::test]
async fn auth_provider_gcp_answers_the_kubelet_for_each_flow_and_refuses_bad_input() {
    let (cloud, server) = emulator(Duration::from_millis(50)).await;
    cloud.set_attribute(
        "google-dockercfg",
        Some(r#"{"registry.example.com":{"auth":"dXNlcjpzM2NyZXQ="}}"#),
    );
    let request = |image: &str| {
        format!(
            r#"{{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"{image}"}}"#
        )
    };

    // gcr: the metadata server's token as `_token`, for Google's registries.
    let (code, out, err) = auth_plugin(
        &server,
        &cloud,
        &["get-credentials", "--authFlow=gcr"],
        &request("us-docker.pkg.dev/p/r/img:1"),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["kind"], "CredentialProviderResponse");
    let auth = v["auth"].as_object().unwrap();
    assert!(auth.contains_key("*.pkg.dev") && auth.contains_key("gcr.io"), "{out}");
    assert_eq!(auth["gcr.io"]["username"], "_token");
    let token = auth["gcr.io"]["password"].as_str().unwrap();
    assert!(
        cloud.tokens().iter().any(|t| t == token),
        "the password is a token the metadata server issued"
    );

    // dockercfg: the instance attribute's credentials.
    let (code, out, err) = auth_plugin(
        &server,
        &cloud,
        &["get-credentials", "--authFlow=dockercfg"],
        &request("registry.example.com/app:2"),
    )
    .await;
    assert_eq!(code, 0, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["auth"]["registry.example.com"]["username"], "user");

    // Malformed input: a non-zero exit and one line naming the problem.
    for (args, stdin, want) in [
        (vec!["get-credentials"], "{not json".to_string(), "CredentialProviderRequest"),
        (vec!["get-credentials", "--authFlow=carrier-pigeon"], request("gcr.io/p/i"), "authFlow"),
        (vec!["fetch-credentials"], request("gcr.io/p/i"), "fetch-credentials"),
    ] {
        let (code, _, err) = auth_plugin(&server, &cloud, &args, &stdin).await;
        assert_ne!(code, 0, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}
