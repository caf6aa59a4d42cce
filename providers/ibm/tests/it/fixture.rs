//! One emulator per test, its world, and a provider pointed at it.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud_call::Retry;
use ccm_emulators::ibm::{DEFAULT_API_KEY, IbmCloud, IbmOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::World;
use ccm_provider_ibm::IbmProvider;
use ccm_provider_ibm::client::ClientOptions;
use ccm_provider_ibm::config::Config;
use ccm_provider_ibm::load_balancer::Timings;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeSpec, NodeStatus};
use kube::api::ObjectMeta;

pub const CLUSTER: &str = "clus1";

/// Three instances in two zones of `vpc-1`, one stopped; plus a VPC `other` with a subnet.
pub const WORLD: &str = r#"
region: us-south
zones: [us-south-1, us-south-2]
networks:
  - { name: vpc-1, cidr: 10.240.0.0/16 }
  - { name: other, cidr: 10.250.0.0/16 }
subnets:
  - { name: subnet-1, network: vpc-1, zone: us-south-1, cidr: 10.240.0.0/24 }
  - { name: subnet-2, network: vpc-1, zone: us-south-2, cidr: 10.240.1.0/24 }
  - { name: subnet-10, network: vpc-1, zone: us-south-2, cidr: 10.240.2.0/24 }
  - { name: subnet-x, network: other, zone: us-south-1, cidr: 10.250.0.0/24 }
instances:
  - { name: node-a, zone: us-south-1, type: bx2-4x16, subnet: subnet-1, private_ips: [10.240.0.4] }
  - { name: node-b, zone: us-south-1, type: bx2-2x8, subnet: subnet-1, private_ips: [10.240.0.5] }
  - { name: node-c, zone: us-south-2, type: cx2-8x16, subnet: subnet-2, private_ips: [10.240.1.4], power: stopped }
"#;

pub struct Fixture {
    pub cloud: Arc<IbmCloud>,
    pub server: Server,
    pub provider: IbmProvider,
    pub _dir: tempfile::TempDir,
}

pub fn config_text(url: &str, account: &str, key_file: &std::path::Path) -> String {
    format!(
        "[global]\nversion = 1.1.0\n[kubernetes]\nconfig-file = /dev/null\n[provider]\n\
         cluster-default-provider = g2\naccountID = {account}\nclusterID = {CLUSTER}\n\
         region = us-south\ng2workerServiceAccountID = {account}\ng2VpcName = vpc-1\n\
         g2Credentials = {}\ng2ResourceGroupName = default\ng2VpcSubnetNames = subnet-1,subnet-2\n\
         g2EndpointOverride = {url}\niamEndpointOverride = {url}\nrmEndpointOverride = {url}\n\
         taggingEndpointOverride = {url}\n",
        key_file.display()
    )
}

/// Short waits: the emulator's load balancers are pending for `lb_pending`.
pub const TIMINGS: Timings =
    Timings { poll: Duration::from_millis(100), max_wait: Duration::from_secs(60) };

pub async fn start_with(opts: IbmOptions, client: ClientOptions) -> Fixture {
    let world = World::parse(WORLD).unwrap();
    let cloud = IbmCloud::new(world, opts);
    let server = Server::start(cloud.clone(), ServerOptions::default()).await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let key = dir.path().join("api-key");
    std::fs::write(&key, format!("{DEFAULT_API_KEY}\n")).unwrap();
    let text = config_text(&server.url(), &cloud.account_id(), &key);
    let config = Config::parse(&text, &BTreeMap::new()).unwrap();
    let provider = IbmProvider::new(config, client, TIMINGS).unwrap();
    Fixture { cloud, server, provider, _dir: dir }
}

/// A second provider on the fixture's emulator and API key, for another cluster ID.
pub fn provider_for(f: &Fixture, cluster: &str) -> IbmProvider {
    let key = f._dir.path().join("api-key");
    let text = config_text(&f.server.url(), &f.cloud.account_id(), &key)
        .replace(&format!("clusterID = {CLUSTER}\n"), &format!("clusterID = {cluster}\n"));
    let config = Config::parse(&text, &BTreeMap::new()).unwrap();
    IbmProvider::new(config, ClientOptions::default(), TIMINGS).unwrap()
}

/// A second provider on the fixture's emulator and cluster with other waiting times.
pub fn provider_with_timings(f: &Fixture, timings: Timings) -> IbmProvider {
    let key = f._dir.path().join("api-key");
    let text = config_text(&f.server.url(), &f.cloud.account_id(), &key);
    let config = Config::parse(&text, &BTreeMap::new()).unwrap();
    IbmProvider::new(config, ClientOptions::default(), timings).unwrap()
}

pub async fn start() -> Fixture {
    start_with(
        IbmOptions { lb_pending: Duration::from_millis(300), ..IbmOptions::default() },
        ClientOptions {
            timeout: Duration::from_secs(20),
            retry: Retry {
                attempts: 4,
                base: Duration::from_millis(50),
                max: Duration::from_millis(200),
            },
        },
    )
    .await
}

pub fn node(
    name: &str,
    labels: &[(&str, &str)],
    provider_id: Option<&str>,
    ip: Option<&str>,
) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        },
        spec: Some(NodeSpec { provider_id: provider_id.map(str::to_string), ..Default::default() }),
        status: ip.map(|ip| NodeStatus {
            addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: ip.into() }]),
            ..Default::default()
        }),
    }
}

/// The labels an IKS provisioner sets.
pub fn iks_labels<'a>(worker: &'a str, ip: &'a str, zone: &'a str) -> Vec<(&'static str, &'a str)> {
    vec![
        ("ibm-cloud.kubernetes.io/internal-ip", ip),
        ("ibm-cloud.kubernetes.io/worker-id", worker),
        ("ibm-cloud.kubernetes.io/machine-type", "bx2.4x16"),
        ("ibm-cloud.kubernetes.io/zone", zone),
        ("ibm-cloud.kubernetes.io/region", "us-south"),
    ]
}

/// What the service controller does with a Service, for tests that call the provider
/// directly: ensure, again after each retry the provider asks for (nothing in the provider
/// waits, issue #33 item 11), until it succeeds and the load balancer is `active`. Panics on
/// any other error or after 60 s.
pub async fn converge(
    lb: &ccm_provider_ibm::load_balancer::IbmLoadBalancer,
    svc: &k8s_openapi::api::core::v1::Service,
    nodes: &[Node],
) -> k8s_openapi::api::core::v1::LoadBalancerStatus {
    use ccm_core::cloud::{LoadBalancer as _, ProviderError};
    let name = lb.load_balancer_name("k", svc);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "{name} did not converge in 60 s");
        match lb.ensure_load_balancer("k", svc, nodes).await {
            Ok(status) => {
                let all = lb.client().list_load_balancers().await.unwrap();
                if all.iter().any(|l| l.name == name && l.is_active()) {
                    return status;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(ProviderError::RetryAfter { delay, .. }) => tokio::time::sleep(delay).await,
            Err(e) => panic!("ensuring {name}: {e}"),
        }
    }
}

/// The deletion as the service controller drives it: again after each retry until it
/// succeeds (the load balancer is gone, or was never the Service's).
pub async fn delete_converged(
    lb: &ccm_provider_ibm::load_balancer::IbmLoadBalancer,
    svc: &k8s_openapi::api::core::v1::Service,
) {
    use ccm_core::cloud::{LoadBalancer as _, ProviderError};
    let name = lb.load_balancer_name("k", svc);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "{name} was not deleted in 60 s");
        match lb.ensure_load_balancer_deleted("k", svc).await {
            Ok(()) => return,
            Err(ProviderError::RetryAfter { delay, .. }) => tokio::time::sleep(delay).await,
            Err(e) => panic!("deleting {name}: {e}"),
        }
    }
}

/// [`converge`] for `update_load_balancer` (the node sync): again after each retry until it
/// succeeds and the load balancer is `active`.
pub async fn update_converged(
    lb: &ccm_provider_ibm::load_balancer::IbmLoadBalancer,
    svc: &k8s_openapi::api::core::v1::Service,
    nodes: &[Node],
) {
    use ccm_core::cloud::{LoadBalancer as _, ProviderError};
    let name = lb.load_balancer_name("k", svc);
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        assert!(tokio::time::Instant::now() < deadline, "{name} did not update in 60 s");
        match lb.update_load_balancer("k", svc, nodes).await {
            Ok(()) => {
                let all = lb.client().list_load_balancers().await.unwrap();
                if all.iter().any(|l| l.name == name && l.is_active()) {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(ProviderError::RetryAfter { delay, .. }) => tokio::time::sleep(delay).await,
            Err(e) => panic!("updating {name}: {e}"),
        }
    }
}

/// The emulator's load balancers once none is `delete_pending` any more (deletions return
/// once IBM accepted them; at most 30 s).
pub async fn settled_lbs(f: &Fixture) -> Vec<serde_json::Value> {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let state = f.server.admin().state().await.unwrap();
        let all = state["cloud"]["load_balancers"].as_array().cloned().unwrap_or_default();
        if all.iter().all(|l| l["provisioning_status"] != "delete_pending")
            || tokio::time::Instant::now() >= deadline
        {
            return all;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
