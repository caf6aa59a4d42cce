//! One emulator per test, its world, and a client / config pointed at it.

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::CloudProvider;
use ccm_core::cloud_call::Retry;
use ccm_core::controllers::{
    ControllerConfig, ControllerContext, Started, node as node_controller,
};
use ccm_core::manager::CancellationToken;
use ccm_emulators::openstack::{DEFAULT_PASSWORD, DEFAULT_USER, OpenStackCloud, OpenStackOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::{Instance, PowerState, World};
use ccm_provider_openstack::OpenStackProvider;
use ccm_provider_openstack::client::{ClientOptions, OpenStackClient};
use ccm_provider_openstack::config::{Config, Global, Secret};
use ccm_provider_openstack::load_balancer::Timings;
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::ObjectMeta;

/// The emulator's project (`OpenStackOptions::default().project`).
pub const PROJECT: &str = "demo";
/// The world's region.
pub const REGION: &str = "RegionOne";

/// Three servers in two zones on `private` (two subnets) (node-a with a floating IP, node-c shut off), and
/// a second tenant network `storage` for a second NIC.
pub const WORLD: &str = r#"
region: RegionOne
zones: [az-1, az-2]
networks:
  - { name: private, cidr: 10.0.0.0/16 }
  - { name: storage, cidr: 10.1.0.0/16 }
subnets:
  - { name: private-subnet, network: private, zone: az-1, cidr: 10.0.0.0/24 }
  - { name: private-subnet-2, network: private, zone: az-2, cidr: 10.0.1.0/24 }
  - { name: storage-subnet, network: storage, zone: az-1, cidr: 10.1.0.0/24 }
instances:
  - { name: node-a, zone: az-1, type: m1.medium, subnet: private-subnet, private_ips: [10.0.0.11], public_ips: [172.24.4.11] }
  - { name: node-b, zone: az-2, type: m1.large, subnet: private-subnet-2, private_ips: [10.0.1.12] }
  - { name: node-c, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.13], power: stopped }
"#;

pub struct Fixture {
    pub cloud: Arc<OpenStackCloud>,
    pub server: Server,
    pub config: Config,
    pub client: Arc<OpenStackClient>,
}

/// `[Global]` for the emulator at `url`: Keystone at `<url>/identity`, the default user.
pub fn global(url: &str) -> Global {
    Global {
        auth_url: format!("{url}/identity"),
        username: DEFAULT_USER.into(),
        password: Secret(DEFAULT_PASSWORD.into()),
        project_name: PROJECT.into(),
        project_domain_name: "Default".into(),
        user_domain_name: "Default".into(),
        region: REGION.into(),
        ..Global::default()
    }
}

/// Short retries so fault tests end quickly.
pub fn fast_options() -> ClientOptions {
    ClientOptions {
        timeout: Duration::from_secs(20),
        retry: Retry {
            attempts: 4,
            base: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
    }
}

pub async fn start_with(
    world: &str,
    opts: OpenStackOptions,
    client: ClientOptions,
    server: ServerOptions,
) -> Fixture {
    let cloud = OpenStackCloud::new(World::parse(world).unwrap(), opts);
    let server = Server::start(cloud.clone(), server).await.unwrap();
    let mut g = global(&server.url());
    g.ca_file = server.ca_file().map(|p| p.to_path_buf());
    let config = Config { global: g, ..Config::default() };
    let client = Arc::new(OpenStackClient::new(&config.global, client).unwrap());
    Fixture { cloud, server, config, client }
}

pub async fn start() -> Fixture {
    start_with(WORLD, OpenStackOptions::default(), fast_options(), ServerOptions::default()).await
}

/// A Node named `name`, with a providerID when given.
pub fn node(name: &str, provider_id: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec { provider_id: provider_id.map(str::to_string), ..Default::default() }),
        status: None,
    }
}

/// A world instance on `private-subnet`.
pub fn instance(name: &str, zone: &str, ip: &str) -> Instance {
    Instance {
        name: name.into(),
        id: None,
        zone: zone.into(),
        instance_type: None,
        power: PowerState::Running,
        subnet: Some("private-subnet".into()),
        private_ips: vec![ip.parse().unwrap()],
        public_ips: vec![],
        tags: Default::default(),
    }
}

/// `openstack:///<id>` of the server named `name`.
pub fn provider_id(f: &Fixture, name: &str) -> String {
    format!("openstack:///{}", f.cloud.server_id(name).unwrap())
}

/// Runs the cloud-node controller on a provider made from `config` until the token is
/// cancelled (the mtls and trunks tests: Nodes initialised against a real API server).
pub fn run_node_controller(
    client: &kube::Client,
    config: &Config,
) -> (CancellationToken, Arc<dyn CloudProvider>) {
    let provider = OpenStackProvider::new(
        config.clone(),
        fast_options(),
        Timings { poll: Duration::from_millis(20), max_wait: Duration::from_secs(20) },
    )
    .unwrap();
    let provider: Arc<dyn CloudProvider> = Arc::new(provider);
    let token = CancellationToken::new();
    let ctx = ControllerContext {
        client: client.clone(),
        cloud: provider.clone(),
        config: Arc::new(ControllerConfig::default()),
        metrics: Default::default(),
        shutdown: token.clone(),
        nodes: None,
    };
    match node_controller::start(&ctx).unwrap() {
        Started::Running(fut) => {
            tokio::spawn(fut);
        }
        Started::Skipped(why) => panic!("cloud-node controller skipped: {why}"),
    }
    (token, provider)
}
