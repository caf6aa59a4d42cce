//! `cloud-controller-manager-azure` end to end (issue 16 acceptance): the real binary against a
//! real kube-apiserver and the in-process ARM emulator (`ccm_emulators::azure`: ARM, AAD and
//! IMDS on one loopback HTTPS server with the testbed CA, which the manager trusts through
//! `SSL_CERT_FILE` as it would a private cloud's CA), started as upstream's CCM is
//! (`--cloud-provider=azure`, `azure.json` with a service principal). Availability-set and
//! scale-set Nodes join with upstream's providerIDs and labels; a deallocated VM taints its
//! Node, a deleted one deletes it, an ARM outage deletes nothing; public and internal
//! LoadBalancer Services get addresses on the shared Standard load balancers, follow the
//! nodes, keep an operator's fields and leave nothing behind. Every manager's output is
//! scanned for the service principal's secret.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_core::names;
use ccm_emulators::admin::PauseMode;
use ccm_emulators::azure::{AzureCloud, AzureOptions, DEFAULT_CLIENT_ID, DEFAULT_CLIENT_SECRET};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::{PowerState, World};
use ccm_testbed::fixtures::load_balancer_service;
use k8s_openapi::api::core::v1::{Node, Secret, Service};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::{Value, json};

use crate::support::{
    Binary, Ccm, Env, SecretKind, addresses, has_taint, initialised, label, provider_id, register,
    register_secret, wait_for,
};

pub const BIN: Binary = Binary {
    path: env!("CARGO_BIN_EXE_cloud-controller-manager-azure"),
    provider: "azure",
    clear_prefixes: &["AZURE_", "CCM_AZURE_", "SSL_CERT_"],
    env: &[],
};

/// The lifecycle controller's log line for a node whose instance could not be checked.
const CHECK_ERROR: &str = "error checking if node exists";

/// Availability-set VMs in zones 1 and 2 (vm-a with a public IP), one without zones in fault
/// domain 1, and the uniform scale set `pool` of two.
pub const WORLD: &str = r#"
region: eastus
networks:
  - {name: vnet, cidr: 10.0.0.0/8}
subnets:
  - {name: subnet, network: vnet, zone: "1", cidr: 10.240.0.0/16}
instances:
  - {name: vm-a, zone: "1", type: Standard_D4s_v3, private_ips: [10.240.0.4], public_ips: [20.1.2.3]}
  - {name: vm-b, zone: "2", private_ips: [10.240.0.5]}
  - {name: vm-c, zone: none, private_ips: [10.240.0.6], tags: {azure.fault-domain: "1"}}
  - {name: pool-0, zone: "1", type: Standard_D8s_v3, private_ips: [10.240.1.4], tags: {azure.vmss: pool}}
  - {name: pool-1, zone: "2", type: Standard_D8s_v3, private_ips: [10.240.1.5], tags: {azure.vmss: pool}}
"#;

/// The emulator (long-running operations take `lro`), served over HTTPS.
pub async fn emulator(lro: Duration) -> (Arc<AzureCloud>, Server) {
    let cloud = AzureCloud::new(
        World::parse(WORLD).unwrap(),
        AzureOptions { lro, ..AzureOptions::default() },
    );
    let server =
        Server::start(cloud.clone(), ServerOptions { tls: true, ..ServerOptions::default() })
            .await
            .unwrap();
    register_secret(SecretKind::AzureSecret, DEFAULT_CLIENT_SECRET);
    (cloud, server)
}

/// `azure.json` as an operator writes it for upstream's CCM (a service principal, vmType
/// `vmss` so both kinds of VM are found), pointed at the emulator.
pub fn azure_json(cloud: &AzureCloud, server: &Server) -> Value {
    json!({
        "cloud": "AzureStackCloud",
        "resourceManagerEndpoint": server.url(),
        "tenantId": cloud.tenant_id(),
        "subscriptionId": cloud.subscription_id(),
        "aadClientId": DEFAULT_CLIENT_ID,
        "aadClientSecret": DEFAULT_CLIENT_SECRET,
        "resourceGroup": cloud.resource_group(),
        "location": "eastus",
        "vnetName": "vnet",
        "subnetName": "subnet",
        "securityGroupName": "k8s-nsg",
        "routeTableName": "kubernetes-routetable",
        "vmType": "vmss",
        "loadBalancerSku": "standard",
        "cloudConfigType": "file",
    })
}

/// The manager's environment: trust the emulator's CA.
pub fn ca_env(server: &Server) -> Vec<(String, String)> {
    let ca = server.ca_file().expect("the HTTPS emulator's CA");
    vec![("SSL_CERT_FILE".into(), ca.display().to_string())]
}

/// [`initialised`], with the manager's log in the failure.
pub async fn initialised_node(nodes: &Api<Node>, name: &str, ccm: &Ccm) -> Node {
    match tokio::time::timeout(Duration::from_secs(80), initialised(nodes, name)).await {
        Ok(n) => n,
        Err(_) => panic!("node {name} not initialised; manager log:\n{}", ccm.logs()),
    }
}

fn vm_id(cloud: &AzureCloud, name: &str) -> String {
    format!(
        "azure:///subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{name}",
        cloud.subscription_id(),
        cloud.resource_group()
    )
}

fn vmss_id(cloud: &AzureCloud, set: &str, instance: u32) -> String {
    format!(
        "azure:///subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachineScaleSets/{set}/virtualMachines/{instance}",
        cloud.subscription_id(),
        cloud.resource_group()
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn availability_set_and_scale_set_nodes_join_a_deallocated_one_is_tainted_a_deleted_one_goes_and_an_outage_deletes_nothing()
 {
    let (cloud, server) = emulator(Duration::from_millis(200)).await;
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm_with_env(
        &azure_json(&cloud, &server).to_string(),
        &["--configure-cloud-routes=false".into()],
        &ca_env(&server),
    );
    let nodes = env.nodes();

    let start = Instant::now();
    register(&nodes, "vm-a", "10.240.0.4", "True").await;
    // NotReady: the lifecycle controller checks only such Nodes (deleted below).
    register(&nodes, "vm-b", "10.240.0.5", "False").await;
    register(&nodes, "pool-1", "10.240.1.5", "True").await;
    let a = initialised_node(&nodes, "vm-a", &ccm).await;
    let b = initialised_node(&nodes, "vm-b", &ccm).await;
    let p = initialised_node(&nodes, "pool-1", &ccm).await;
    eprintln!("3 nodes initialised {:?} after registration", start.elapsed());
    assert_eq!(
        provider_id(&a),
        Some(vm_id(&cloud, "vm-a").as_str()),
        "manager log:\n{}",
        ccm.logs()
    );
    assert_eq!(label(&a, names::LABEL_ZONE), Some("eastus-1"));
    assert_eq!(label(&a, names::LABEL_REGION), Some("eastus"));
    assert_eq!(label(&a, names::LABEL_INSTANCE_TYPE), Some("Standard_D4s_v3"));
    let got = addresses(&a);
    for want in [("InternalIP", "10.240.0.4"), ("ExternalIP", "20.1.2.3")] {
        assert!(got.contains(&(want.0.to_string(), want.1.to_string())), "{got:?}");
    }
    assert_eq!(provider_id(&b), Some(vm_id(&cloud, "vm-b").as_str()));
    assert_eq!(label(&b, names::LABEL_ZONE), Some("eastus-2"));
    // The scale set's second instance: instance ID 1, its size from the scale-set VM's SKU.
    assert_eq!(provider_id(&p), Some(vmss_id(&cloud, "pool", 1).as_str()));
    assert_eq!(label(&p, names::LABEL_ZONE), Some("eastus-2"));
    assert_eq!(label(&p, names::LABEL_INSTANCE_TYPE), Some("Standard_D8s_v3"));
    assert!(addresses(&p).contains(&("InternalIP".to_string(), "10.240.1.5".to_string())));

    // A VM without zones: its zone label is its fault domain, as upstream.
    register(&nodes, "vm-c", "10.240.0.6", "False").await;
    let c = initialised_node(&nodes, "vm-c", &ccm).await;
    assert_eq!(label(&c, names::LABEL_ZONE), Some("1"));

    // A deallocated VM: its NotReady node gets the shutdown taint.
    assert!(cloud.set_power("vm-c", PowerState::Terminated));
    wait_for("the shutdown taint on vm-c", || async {
        let n = nodes.get("vm-c").await.ok()?;
        has_taint(&n, names::TAINT_SHUTDOWN).then_some(())
    })
    .await;

    // An ARM outage: every pass errs, nothing is deleted.
    let errors_before = ccm.logs().matches(CHECK_ERROR).count();
    server.admin().pause(PauseMode::Fail).await.unwrap();
    ccm.wait_for_log(CHECK_ERROR, errors_before + 4).await;
    for name in ["vm-a", "vm-b", "vm-c", "pool-1"] {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} deleted during the outage");
    }
    server.admin().resume().await.unwrap();

    // vm-b is deleted: its Node goes, the others stay.
    let start = Instant::now();
    assert!(cloud.delete_instance("vm-b"));
    wait_for("vm-b to be deleted", || async {
        nodes.get_opt("vm-b").await.unwrap().is_none().then_some(())
    })
    .await;
    eprintln!("node deleted {:?} after its VM was", start.elapsed());
    for name in ["vm-a", "vm-c", "pool-1"] {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} deleted");
    }
    drop(ccm);
}

#[tokio::test]
async fn a_bad_config_fails_at_start_naming_the_key_and_never_the_secret() {
    let dir = tempfile::tempdir().unwrap();
    let cloud = AzureCloud::new(World::parse(WORLD).unwrap(), AzureOptions::default());
    let server =
        Server::start(cloud.clone(), ServerOptions { tls: true, ..ServerOptions::default() })
            .await
            .unwrap();
    register_secret(SecretKind::AzureSecret, DEFAULT_CLIENT_SECRET);
    let good = azure_json(&cloud, &server);

    let mut bad = good.clone();
    bad["vmType"] = json!("vmsss");
    let (code, stderr) = BIN.run_to_exit(dir.path(), &bad.to_string()).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("vmType"), "{stderr}");

    let mut bad = good.clone();
    bad["securityGroupNmae"] = json!("k8s-nsg");
    let (code, stderr) = BIN.run_to_exit(dir.path(), &bad.to_string()).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("securityGroupNmae"), "{stderr}");

    // A secret of the wrong type: the key is named, the value never printed.
    let mut bad = good.clone();
    bad["aadClientSecret"] = json!(["azure-emulator-secret"]);
    let (code, stderr) = BIN.run_to_exit(dir.path(), &bad.to_string()).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("aadClientSecret"), "{stderr}");
    assert!(!stderr.contains(DEFAULT_CLIENT_SECRET), "{stderr}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_secret_is_merged_over_the_file_through_the_api() {
    let (cloud, server) = emulator(Duration::from_millis(100)).await;
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    // The file has no credentials; the Secret kube-system/azure-cloud-provider brings them
    // (upstream's default `merge`).
    let mut file = azure_json(&cloud, &server);
    let obj = file.as_object_mut().unwrap();
    obj.remove("aadClientSecret");
    obj.remove("cloudConfigType");
    let secret_part = json!({ "aadClientSecret": DEFAULT_CLIENT_SECRET });
    let secrets: Api<Secret> = Api::namespaced(env.client.clone(), "kube-system");
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": "azure-cloud-provider", "namespace": "kube-system"},
        "stringData": {"cloud-config": secret_part.to_string()}
    }))
    .unwrap();
    secrets.create(&PostParams::default(), &secret).await.unwrap();
    let ccm = env.spawn_ccm_with_env(
        &file.to_string(),
        &["--configure-cloud-routes=false".into()],
        &ca_env(&server),
    );
    let nodes = env.nodes();
    register(&nodes, "vm-a", "10.240.0.4", "True").await;
    let a = initialised_node(&nodes, "vm-a", &ccm).await;
    assert_eq!(provider_id(&a), Some(vm_id(&cloud, "vm-a").as_str()));
    drop(ccm);
}

async fn ingress_ip(services: &Api<Service>, name: &str) -> Option<String> {
    let s = services.get(name).await.ok()?;
    s.status?.load_balancer?.ingress?.first()?.ip.clone()
}

fn names_of(cloud: &AzureCloud, arm_type: &str) -> Vec<String> {
    let mut v: Vec<String> = cloud
        .resources(arm_type)
        .iter()
        .filter_map(|r| r["name"].as_str().map(str::to_string))
        .collect();
    v.sort();
    v
}

/// Sub-resource names of a collection of a resource (`frontendIPConfigurations`, …), sorted.
fn children(r: &Value, coll: &str) -> Vec<String> {
    let mut v: Vec<String> = r["properties"][coll]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| c["name"].as_str().map(str::to_string))
        .collect();
    v.sort();
    v
}

fn lb(cloud: &AzureCloud, name: &str) -> Option<Value> {
    cloud.resources("Microsoft.Network/loadBalancers").into_iter().find(|l| l["name"] == name)
}

/// The VMs (NIC name without `-nic`, or the scale-set VM) in the pool `pool` of `lb`.
fn pool_members(lb: &Value, pool: &str) -> Vec<String> {
    let mut v: Vec<String> = lb["properties"]["backendAddressPools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"] == pool)
        .flat_map(|p| {
            p["properties"]["backendIPConfigurations"].as_array().cloned().unwrap_or_default()
        })
        .filter_map(|c| c["id"].as_str().map(str::to_string))
        .map(|id| {
            if let Some(rest) = id.split("/networkInterfaces/").nth(1) {
                if id.contains("/virtualMachineScaleSets/") {
                    let ss = id.split("/virtualMachineScaleSets/").nth(1).unwrap_or_default();
                    let mut parts = ss.split('/');
                    let set = parts.next().unwrap_or_default();
                    let inst = parts.nth(1).unwrap_or_default();
                    return format!("{set}_{inst}");
                }
                return rest
                    .split('/')
                    .next()
                    .unwrap_or_default()
                    .trim_end_matches("-nic")
                    .to_string();
            }
            id
        })
        .collect();
    v.sort();
    v.dedup();
    v
}

fn nsg_rules(cloud: &AzureCloud) -> Vec<Value> {
    cloud
        .resources("Microsoft.Network/networkSecurityGroups")
        .into_iter()
        .filter(|n| n["name"] == "k8s-nsg")
        .flat_map(|n| n["properties"]["securityRules"].as_array().cloned().unwrap_or_default())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn public_and_internal_load_balancers_get_addresses_follow_nodes_keep_operator_fields_and_leave_nothing()
 {
    let (cloud, server) = emulator(Duration::from_millis(200)).await;
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm_with_env(
        &azure_json(&cloud, &server).to_string(),
        &["--configure-cloud-routes=false".into()],
        &ca_env(&server),
    );
    let nodes = env.nodes();
    register(&nodes, "vm-a", "10.240.0.4", "True").await;
    register(&nodes, "pool-0", "10.240.1.4", "True").await;
    initialised_node(&nodes, "vm-a", &ccm).await;
    initialised_node(&nodes, "pool-0", &ccm).await;

    let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
    let web = services
        .create(&PostParams::default(), &load_balancer_service("default", "web", 80))
        .await
        .unwrap();
    let mut ilb = load_balancer_service("default", "ilb", 8080);
    ilb.metadata.annotations = Some(
        [(
            "service.beta.kubernetes.io/azure-load-balancer-internal".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    let ilb = services.create(&PostParams::default(), &ilb).await.unwrap();
    let start = Instant::now();
    let ip = wait_for("an address on web", || ingress_ip(&services, "web")).await;
    let ilb_ip = wait_for("an address on ilb", || ingress_ip(&services, "ilb")).await;
    eprintln!("both load balancers ready {:?} after the Services were created", start.elapsed());

    // Public: the shared load balancer `kubernetes`, a frontend `a<uid>` on the public IP
    // `kubernetes-a<uid>` (tagged with the Service and cluster), a rule and a probe per port.
    let fe = ccm_core::cloud::default_load_balancer_name(&web);
    let public = lb(&cloud, "kubernetes").expect("the shared load balancer");
    assert_eq!(public["sku"]["name"], "Standard");
    assert_eq!(children(&public, "frontendIPConfigurations"), [fe.as_str()]);
    assert_eq!(children(&public, "loadBalancingRules"), [format!("{fe}-TCP-80")]);
    assert_eq!(children(&public, "probes").len(), 1, "{public:#}");
    let pip_name = format!("kubernetes-{fe}");
    let pip = cloud
        .resources("Microsoft.Network/publicIPAddresses")
        .into_iter()
        .find(|p| p["name"] == pip_name.as_str())
        .expect("the Service's public IP");
    assert_eq!(pip["properties"]["ipAddress"], ip.as_str());
    assert_eq!(pip["tags"]["k8s-azure-service"], "default/web");
    assert_eq!(pip["tags"]["k8s-azure-cluster-name"], "kubernetes");
    assert_eq!(pool_members(&public, "kubernetes"), ["pool_0", "vm-a"], "{public:#}");
    let rules = nsg_rules(&cloud);
    assert!(
        rules.iter().any(|r| {
            r["name"].as_str().unwrap_or_default().starts_with("k8s-azure-lb_allow_IPv4")
                && r["properties"].to_string().contains(&ip)
        }),
        "an allow rule to {ip}: {rules:#?}"
    );

    // Internal: `kubernetes-internal`, a private frontend in the subnet.
    let ife = ccm_core::cloud::default_load_balancer_name(&ilb);
    let internal = lb(&cloud, "kubernetes-internal").expect("the internal load balancer");
    assert_eq!(children(&internal, "frontendIPConfigurations"), [ife.as_str()]);
    assert!(ilb_ip.starts_with("10.240."), "an address in the subnet: {ilb_ip}");

    // An operator's field on the load balancer survives our updates.
    let id = public["id"].as_str().unwrap().to_string();
    let mut edited = cloud.resource(&id).unwrap();
    edited["properties"]["operatorNote"] = json!({"owner": "netops"});
    cloud.put_resource(&id, edited).unwrap();

    // A new node joins the pool; the operator's field is still there after that update.
    register(&nodes, "vm-b", "10.240.0.5", "True").await;
    initialised_node(&nodes, "vm-b", &ccm).await;
    wait_for("vm-b in the backend pool", || async {
        let public = lb(&cloud, "kubernetes")?;
        (pool_members(&public, "kubernetes") == ["pool_0", "vm-a", "vm-b"]).then_some(())
    })
    .await;
    // A port change rewrites the Service's rules: the field survives that PUT too.
    let mut web2 = services.get("web").await.unwrap();
    web2.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 8443;
    services.replace("web", &PostParams::default(), &web2).await.unwrap();
    wait_for("the rule for port 8443", || async {
        let public = lb(&cloud, "kubernetes")?;
        (children(&public, "loadBalancingRules") == [format!("{fe}-TCP-8443")]).then_some(())
    })
    .await;
    let public = lb(&cloud, "kubernetes").unwrap();
    assert_eq!(public["properties"]["operatorNote"], json!({"owner": "netops"}));

    // Deleting both Services leaves nothing of them.
    services.delete("web", &DeleteParams::default()).await.unwrap();
    services.delete("ilb", &DeleteParams::default()).await.unwrap();
    wait_for("both Services gone (finalizers removed)", || async {
        (services.get_opt("web").await.unwrap().is_none()
            && services.get_opt("ilb").await.unwrap().is_none())
        .then_some(())
    })
    .await;
    let pips: Vec<String> = names_of(&cloud, "Microsoft.Network/publicIPAddresses")
        .into_iter()
        .filter(|n| n != "vm-a-pip")
        .collect();
    assert!(pips.is_empty(), "public IPs left: {pips:?}");
    for name in ["kubernetes", "kubernetes-internal"] {
        if let Some(l) = lb(&cloud, name) {
            assert!(children(&l, "frontendIPConfigurations").is_empty(), "{l:#}");
            assert!(children(&l, "loadBalancingRules").is_empty(), "{l:#}");
            assert!(children(&l, "probes").is_empty(), "{l:#}");
        }
    }
    let left: Vec<_> = nsg_rules(&cloud)
        .into_iter()
        .filter(|r| r["name"].as_str().unwrap_or_default().starts_with("k8s-azure"))
        .collect();
    assert!(left.is_empty(), "security rules left: {left:#?}\nmanager log:\n{}", ccm.logs());
    drop(ccm);
}

const NODE_MANAGER: &str = env!("CARGO_BIN_EXE_cloud-node-manager-azure");

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cloud_node_manager_initialises_its_own_node_from_imds_and_no_other() {
    let (cloud, server) = emulator(Duration::from_millis(100)).await;
    assert!(cloud.set_imds_instance("vm-a"));
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let kubeconfig = env.dir.join("node-manager.kubeconfig");
    env.cp.write_kubeconfig(&kubeconfig, &ccm_testbed::Identity::admin()).unwrap();
    crate::support::register_kubeconfig_secrets(&kubeconfig);
    let nodes = env.nodes();
    register(&nodes, "vm-a", "10.240.0.4", "True").await;
    register(&nodes, "vm-b", "10.240.0.5", "True").await;
    // As upstream's DaemonSet runs it: its own node's name, the kubeconfig, IMDS.
    let log = env.dir.join("node-manager.log");
    let out = std::fs::File::create(&log).unwrap();
    let mut child = tokio::process::Command::new(NODE_MANAGER)
        .args(["--node-name=vm-a", "--wait-routes=false", "--v=2"])
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .env("CCM_AZURE_IMDS_ENDPOINT", server.url())
        .env("SSL_CERT_FILE", server.ca_file().unwrap())
        .stdout(out.try_clone().unwrap())
        .stderr(out)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let logs = || std::fs::read_to_string(&log).unwrap_or_default();
    let a = match tokio::time::timeout(Duration::from_secs(80), initialised(&nodes, "vm-a")).await {
        Ok(n) => n,
        Err(_) => panic!("vm-a not initialised; node manager log:\n{}", logs()),
    };
    assert_eq!(provider_id(&a), Some(vm_id(&cloud, "vm-a").as_str()), "{}", logs());
    assert_eq!(label(&a, names::LABEL_ZONE), Some("eastus-1"));
    assert_eq!(label(&a, names::LABEL_REGION), Some("eastus"));
    assert_eq!(label(&a, names::LABEL_INSTANCE_TYPE), Some("Standard_D4s_v3"));
    let got = addresses(&a);
    for want in [("InternalIP", "10.240.0.4"), ("ExternalIP", "20.1.2.3")] {
        assert!(got.contains(&(want.0.to_string(), want.1.to_string())), "{got:?}");
    }
    // Another node is not its business: still tainted, no providerID.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b = nodes.get("vm-b").await.unwrap();
    assert!(has_taint(&b, names::TAINT_UNINITIALIZED), "vm-b was touched");
    assert_eq!(provider_id(&b), None);
    let _ = child.kill().await;
    crate::support::assert_no_secrets("cloud-node-manager-azure", &logs());
}

#[tokio::test]
async fn cloud_node_manager_refuses_an_unknown_flag_naming_it() {
    let out = tokio::process::Command::new(NODE_MANAGER)
        .args(["--node-name=vm-a", "--wait-route=true"])
        .output()
        .await
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--wait-route"), "{stderr}");
}

const ACR_PLUGIN: &str = env!("CARGO_BIN_EXE_acr-credential-provider");

/// Runs `acr-credential-provider <azure.json>` as the kubelet does, with one request on stdin:
/// (exit code, stdout, stderr). stderr is scanned for credentials (stdout is the answer: it
/// carries them by design).
async fn acr_plugin(server: &Server, config: &Value, stdin: &str) -> (i32, String, String) {
    use tokio::io::AsyncWriteExt;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("azure.json");
    std::fs::write(&path, config.to_string()).unwrap();
    let mut child = tokio::process::Command::new(ACR_PLUGIN)
        .arg(&path)
        .env("SSL_CERT_FILE", server.ca_file().unwrap())
        .env("CCM_AZURE_IMDS_ENDPOINT", server.url())
        .env("CCM_AZURE_ACR_ENDPOINT", server.url())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
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
    crate::support::assert_no_secrets(
        "acr-credential-provider (stderr)",
        &String::from_utf8_lossy(&out.stderr),
    );
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn acr_credential_provider_answers_for_managed_identity_and_a_service_principal_and_refuses_bad_input()
 {
    let (cloud, server) = emulator(Duration::from_millis(50)).await;
    assert!(cloud.set_imds_instance("vm-a"));
    let request = |image: &str| {
        format!(
            r#"{{"apiVersion":"credentialprovider.kubelet.k8s.io/v1","kind":"CredentialProviderRequest","image":"{image}"}}"#
        )
    };

    // Managed identity: AAD token from IMDS → the registry's challenge → refresh token.
    let mi = json!({"tenantId": cloud.tenant_id(), "useManagedIdentityExtension": true});
    let (code, out, err) = acr_plugin(&server, &mi, &request("myreg.azurecr.io/app:1")).await;
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["kind"], "CredentialProviderResponse");
    assert_eq!(v["cacheKeyType"], "Registry");
    let auth = &v["auth"]["myreg.azurecr.io"];
    assert_eq!(auth["username"], "00000000-0000-0000-0000-000000000000", "{out}");
    let refresh = auth["password"].as_str().unwrap();
    assert!(refresh.len() > 20, "{out}");
    register_secret(SecretKind::AzureSecret, refresh);

    // A service principal: its id and secret for every ACR registry glob, no calls.
    let sp = json!({
        "tenantId": cloud.tenant_id(), "aadClientId": DEFAULT_CLIENT_ID,
        "aadClientSecret": DEFAULT_CLIENT_SECRET,
    });
    let (code, out, err) = acr_plugin(&server, &sp, &request("other.azurecr.io/app:2")).await;
    assert_eq!(code, 0, "{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    let globs: Vec<&String> = v["auth"].as_object().unwrap().keys().collect();
    for g in ["*.azurecr.io", "*.azurecr.cn", "*.azurecr.de", "*.azurecr.us"] {
        assert!(globs.iter().any(|k| *k == g), "{g} missing: {out}");
    }
    assert_eq!(v["auth"]["*.azurecr.io"]["username"], DEFAULT_CLIENT_ID);

    // Malformed input: a non-zero exit and one line naming the problem.
    let (code, out, err) = acr_plugin(&server, &mi, "{not json").await;
    assert_ne!(code, 0, "{out}");
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.to_lowercase().contains("request"), "{err}");
}
