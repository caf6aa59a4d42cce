//! One emulator per test, its world, and a client / config pointed at it.

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud_call::{Deadline, Retry};
use ccm_emulators::gcp::{GcpCloud, GcpOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::{Instance, PowerState, World};
use ccm_provider_gcp::client::{ClientOptions, GceClient};
use ccm_provider_gcp::config::{Config, Global};
use ccm_provider_gcp::load_balancer::Timings;
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::ObjectMeta;

/// The emulator's project.
pub const PROJECT: &str = "emulated-project";
/// The world's region and zones.
pub const REGION: &str = "us-central1";
pub const ZONE_A: &str = "us-central1-a";
pub const ZONE_B: &str = "us-central1-b";
/// The cluster network.
pub const NETWORK: &str = "k8s-net";

/// Three instances in two zones (node-a with a public IP, two network tags and an alias
/// range; node-c stopped).
pub const WORLD: &str = r#"
region: us-central1
zones: [us-central1-a, us-central1-b]
networks:
  - { name: k8s-net, cidr: 10.0.0.0/8 }
subnets:
  - { name: subnet-a, network: k8s-net, zone: us-central1-a, cidr: 10.0.0.0/20 }
  - { name: subnet-b, network: k8s-net, zone: us-central1-b, cidr: 10.0.16.0/20 }
instances:
  - { name: node-a, zone: us-central1-a, subnet: subnet-a, type: n2-standard-4, private_ips: [10.0.0.10], public_ips: [34.1.2.3], tags: { gce.tags: "k8s-node,web", gce.alias: 10.64.0.0/24 } }
  - { name: node-b, zone: us-central1-b, subnet: subnet-b, private_ips: [10.0.16.11], tags: { gce.alias: 10.64.1.0/24 } }
  - { name: node-c, zone: us-central1-b, subnet: subnet-b, private_ips: [10.0.16.12], power: stopped }
"#;

pub struct Fixture {
    pub cloud: Arc<GcpCloud>,
    pub server: Server,
    pub options: ClientOptions,
    pub client: Arc<GceClient>,
}

/// `[global]` for the emulator: the project, the local zone, multizone, the network.
pub fn global() -> Global {
    Global {
        project_id: Some(PROJECT.into()),
        local_zone: Some(ZONE_A.into()),
        network_name: Some(NETWORK.into()),
        multizone: true,
        ..Global::default()
    }
}

/// Short retries and fast operation polling, pointed at the emulator at `url`.
pub fn options(url: &str) -> ClientOptions {
    ClientOptions {
        deadline: Deadline::new(Duration::from_secs(20)),
        retry: Retry {
            attempts: 4,
            base: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
        poll_interval: Duration::from_millis(20),
        operation_timeout: Duration::from_secs(30),
        endpoint: Some(url.to_string()),
        metadata_endpoint: Some(url.to_string()),
    }
}

pub async fn start_with(world: &str, opts: GcpOptions, server: ServerOptions) -> Fixture {
    let cloud = GcpCloud::new(World::parse(world).unwrap(), opts);
    let server = Server::start(cloud.clone(), server).await.unwrap();
    let config = Config { global: global() };
    let options = options(&server.url());
    let client = Arc::new(GceClient::new(&config.global, options.clone()).unwrap());
    Fixture { cloud, server, options, client }
}

/// The default world, operations done after 50 ms.
pub async fn start() -> Fixture {
    let opts = GcpOptions { pending: Duration::from_millis(50), ..GcpOptions::default() };
    start_with(WORLD, opts, ServerOptions::default()).await
}

/// A Node named `name`, with a providerID when given.
pub fn node(name: &str, provider_id: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec { provider_id: provider_id.map(str::to_string), ..Default::default() }),
        status: None,
    }
}

/// `gce://<project>/<zone>/<name>`.
pub fn provider_id(zone: &str, name: &str) -> String {
    format!("gce://{PROJECT}/{zone}/{name}")
}

/// A running world instance in `zone` on that zone's subnet.
pub fn instance(name: &str, zone: &str, ip: &str) -> Instance {
    Instance {
        name: name.into(),
        id: None,
        zone: zone.into(),
        instance_type: None,
        power: PowerState::Running,
        subnet: Some(if zone == ZONE_A { "subnet-a" } else { "subnet-b" }.into()),
        private_ips: vec![ip.parse().unwrap()],
        public_ips: vec![],
        tags: Default::default(),
    }
}

/// The load balancers' timings for tests not about parked operations: every operation waited
/// for (30 s inline, as before parking), so a loaded machine never turns a 50 ms operation
/// into a retry.
pub fn timings() -> Timings {
    Timings { operation_inline: Duration::from_secs(30), ..Timings::default() }
}
