//! One emulator per test (HTTPS, the testbed CA), its world, and a config / client pointed
//! at it.

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud_call::{Deadline, Retry};
use ccm_emulators::azure::{AzureCloud, AzureOptions, DEFAULT_CLIENT_ID, DEFAULT_CLIENT_SECRET};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::World;
use ccm_provider_azure::client::{ArmClient, ClientOptions};
use ccm_provider_azure::config::Config;
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::ObjectMeta;

/// The emulator's subscription, tenant, resource group and location (its defaults).
pub const SUBSCRIPTION: &str = "8ecadfc9-0000-0000-0000-00000000abcd";
pub const TENANT: &str = "72f988bf-0000-0000-0000-00000000e0a1";
pub const RESOURCE_GROUP: &str = "rg";
pub const LOCATION: &str = "eastus";
/// The cluster name (the shared load balancer's name).
pub const CLUSTER: &str = "kubernetes";
/// The cluster's virtual network, subnet and network security group.
pub const VNET: &str = "vnet";
pub const SUBNET: &str = "subnet";
pub const NSG: &str = "k8s-nsg";

/// Availability-set VMs in zones 1 and 2 (vm-0 with a public IP), a stopped and a
/// deallocated VM without zones (fault domains 1 and 0), a dual-stack VM, and a uniform
/// scale set `pool` of three.
pub const WORLD: &str = r#"
region: eastus
networks:
  - {name: vnet, cidr: 10.0.0.0/8}
subnets:
  - {name: subnet, network: vnet, zone: "1", cidr: 10.240.0.0/16}
instances:
  - {name: vm-0, zone: "1", type: Standard_D4s_v3, private_ips: [10.240.0.4], public_ips: [20.0.0.4]}
  - {name: vm-1, zone: "2", private_ips: [10.240.0.5]}
  - {name: vm-2, zone: none, power: stopped, private_ips: [10.240.0.6], tags: {azure.fault-domain: "1"}}
  - {name: vm-3, zone: none, power: terminated, private_ips: [10.240.0.7]}
  - {name: vm-6, zone: "1", private_ips: [10.240.0.8, "fd00::8"]}
  - {name: pool-0, zone: "1", private_ips: [10.240.1.4], tags: {azure.vmss: pool}}
  - {name: pool-1, zone: "2", private_ips: [10.240.1.5], tags: {azure.vmss: pool}}
  - {name: pool-2, zone: "3", private_ips: [10.240.1.6], tags: {azure.vmss: pool}}
"#;

pub struct Fixture {
    pub cloud: Arc<AzureCloud>,
    pub server: Server,
    pub config: Arc<Config>,
    pub options: ClientOptions,
    pub client: Arc<ArmClient>,
}

/// `azure.json` for the emulator: service principal credentials, the cluster's network.
pub fn config(url: &str) -> Config {
    Config {
        cloud: Some("AzureStackCloud".into()),
        resource_manager_endpoint: Some(url.to_string()),
        tenant_id: Some(TENANT.into()),
        subscription_id: Some(SUBSCRIPTION.into()),
        aad_client_id: Some(DEFAULT_CLIENT_ID.into()),
        aad_client_secret: Some(DEFAULT_CLIENT_SECRET.into()),
        resource_group: Some(RESOURCE_GROUP.into()),
        location: Some(LOCATION.into()),
        vnet_name: Some(VNET.into()),
        subnet_name: Some(SUBNET.into()),
        security_group_name: Some(NSG.into()),
        route_table_name: Some(format!("{CLUSTER}-routetable")),
        load_balancer_sku: Some("standard".into()),
        ..Config::default()
    }
}

/// Short retries, fast operation polling, the emulator's AAD, IMDS and CA.
pub fn options(server: &Server) -> ClientOptions {
    ClientOptions {
        deadline: Deadline::new(Duration::from_secs(20)),
        retry: Retry {
            attempts: 4,
            base: Duration::from_millis(50),
            max: Duration::from_millis(200),
        },
        poll_interval: Duration::from_millis(20),
        operation_timeout: Duration::from_secs(30),
        authority_host: Some(server.url()),
        imds_endpoint: Some(server.url()),
        ca_pem: server.ca_pem().map(|p| p.as_bytes().to_vec()),
        allow_http: false,
    }
}

/// An emulator of `world` with `opts`, and a client on it (config from [`config`], changed
/// by `edit`).
pub async fn start_with(
    world: &str,
    opts: AzureOptions,
    edit: impl FnOnce(&mut Config),
) -> Fixture {
    let cloud = AzureCloud::new(World::parse(world).unwrap(), opts);
    let server =
        Server::start(cloud.clone(), ServerOptions { tls: true, ..ServerOptions::default() })
            .await
            .unwrap();
    let mut config = config(&server.url());
    edit(&mut config);
    let options = options(&server);
    let client = Arc::new(ArmClient::new(&config, options.clone()).unwrap());
    Fixture { cloud, server, config: Arc::new(config), options, client }
}

/// The default world, operations done after 50 ms, pages of 50.
pub async fn start() -> Fixture {
    let opts = AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() };
    start_with(WORLD, opts, |_| {}).await
}

/// A Node named `name`, with a providerID when given.
pub fn node(name: &str, provider_id: Option<&str>) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec { provider_id: provider_id.map(str::to_string), ..Default::default() }),
        status: None,
    }
}

/// The providerID of availability-set VM `name`.
pub fn vm_provider_id(name: &str) -> String {
    format!(
        "azure:///subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Compute/virtualMachines/{name}"
    )
}

/// The providerID of scale-set VM `instance` of `set`.
pub fn vmss_provider_id(set: &str, instance: u32) -> String {
    format!(
        "azure:///subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Compute/virtualMachineScaleSets/{set}/virtualMachines/{instance}"
    )
}
