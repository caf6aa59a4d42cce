//! The conformance harness for Azure: the in-process ARM emulator (`ccm_emulators::azure`,
//! HTTPS with the testbed CA, trusted by the manager through `SSL_CERT_FILE`) with
//! availability-set VMs named like their Nodes in zones 1–3 of `eastus`, the virtual network
//! `vnet`, the cluster security group `k8s-nsg`. The manager signs in as the emulator's
//! service principal (`aadClientSecret` in `azure.json`) at the emulator's AAD, which is the
//! `resourceManagerEndpoint`'s host. The emulator has the kit's admin API itself: no fault
//! proxy. Instances are named by their VM names (a route's next hop is the node's IP, mapped
//! back to its VM here).

use std::sync::Arc;
use std::time::Duration;

use ccm_emulators::Admin;
use ccm_emulators::azure::{AzureCloud, AzureOptions, DEFAULT_CLIENT_ID, DEFAULT_CLIENT_SECRET};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::{PowerState, World};
use serde_json::Value;

use super::{Harness, Instance, LbView};
use crate::support::{Binary, SecretKind, register_secret};

const CLUSTER: &str = "kubernetes";

pub struct Azure {
    cloud: Arc<AzureCloud>,
    server: Server,
    instances: Vec<Instance>,
}

impl Harness for Azure {
    const PROVIDER: &'static str = "azure";
    const BINARY: Binary = Binary {
        path: env!("CARGO_BIN_EXE_cloud-controller-manager-azure"),
        provider: "azure",
        clear_prefixes: &["AZURE_", "CCM_AZURE_", "SSL_CERT_"],
        env: &[],
    };
    const LOAD_BALANCERS: bool = true;
    const ROUTES: bool = true;

    async fn start(count: usize) -> Self {
        let mut world = String::from(
            "region: eastus\nnetworks:\n  - {name: vnet, cidr: 10.0.0.0/8}\n\
             subnets:\n  - {name: subnet, network: vnet, zone: \"1\", cidr: 10.240.0.0/16}\n\
             instances:\n",
        );
        let mut instances = Vec::new();
        let defaults = AzureOptions::default();
        let (sub, rg) = (&defaults.subscription_id, &defaults.resource_group);
        for i in 0..count {
            let zone = (i % 3) + 1;
            let node = format!("node-{i}");
            let ip = format!("10.240.{}.{}", i / 200, 10 + i % 200);
            world.push_str(&format!(
                "  - {{name: {node}, zone: \"{zone}\", type: Standard_D2s_v3, private_ips: [{ip}]}}\n"
            ));
            instances.push(Instance {
                addresses: vec![
                    ("InternalIP".into(), ip.clone()),
                    ("Hostname".into(), node.clone()),
                ],
                provider_id: format!(
                    "azure:///subscriptions/{sub}/resourceGroups/{rg}/providers/Microsoft.Compute/virtualMachines/{node}"
                ),
                id: node.clone(),
                node,
                ip,
                zone: format!("eastus-{zone}"),
                region: "eastus".into(),
                instance_type_prefix: "Standard_D2s_v3".into(),
            });
        }
        let cloud = AzureCloud::new(
            World::parse(&world).unwrap(),
            AzureOptions { lro: Duration::from_millis(300), ..AzureOptions::default() },
        );
        let server =
            Server::start(cloud.clone(), ServerOptions { tls: true, ..ServerOptions::default() })
                .await
                .unwrap();
        register_secret(SecretKind::AzureSecret, DEFAULT_CLIENT_SECRET);
        Azure { cloud, server, instances }
    }

    fn instances(&self) -> &[Instance] {
        &self.instances
    }

    fn cloud_config(&self) -> String {
        serde_json::json!({
            "cloud": "AzureStackCloud",
            "resourceManagerEndpoint": self.server.url(),
            "tenantId": self.cloud.tenant_id(),
            "subscriptionId": self.cloud.subscription_id(),
            "aadClientId": DEFAULT_CLIENT_ID,
            "aadClientSecret": DEFAULT_CLIENT_SECRET,
            "resourceGroup": self.cloud.resource_group(),
            "location": "eastus",
            "vnetName": "vnet",
            "subnetName": "subnet",
            "securityGroupName": "k8s-nsg",
            "routeTableName": format!("{CLUSTER}-routetable"),
            "vmType": "standard",
            "loadBalancerSku": "standard",
            "routeUpdateIntervalInSeconds": 1,
            "cloudConfigType": "file",
        })
        .to_string()
    }

    fn env(&self) -> Vec<(String, String)> {
        let ca = self.server.ca_file().expect("HTTPS emulator has a CA");
        vec![("SSL_CERT_FILE".into(), ca.display().to_string())]
    }

    fn args(&self, routes: bool) -> Vec<String> {
        if routes {
            vec!["--cluster-cidr=100.64.0.0/16".into(), "--configure-cloud-routes=true".into()]
        } else {
            vec!["--configure-cloud-routes=false".into()]
        }
    }

    fn admin(&self) -> Admin {
        self.server.admin()
    }

    async fn power_off(&self, i: usize) {
        assert!(self.cloud.set_power(&self.instances[i].node, PowerState::Terminated));
    }

    async fn power_on(&self, i: usize) {
        assert!(self.cloud.set_power(&self.instances[i].node, PowerState::Running));
    }

    async fn delete(&self, i: usize) {
        assert!(self.cloud.delete_instance(&self.instances[i].node));
    }

    /// The Service's frontend `name` (upstream's `a<uid>`) on the shared load balancer: the
    /// frontend ports of its rules, and the VMs whose NICs are in the cluster's backend pool.
    /// `None` until the frontend and a rule exist.
    async fn load_balancer(&self, name: &str) -> Option<LbView> {
        let lb = self
            .cloud
            .resources("Microsoft.Network/loadBalancers")
            .into_iter()
            .find(|lb| lb["name"] == CLUSTER)?;
        let props = &lb["properties"];
        let frontend =
            props["frontendIPConfigurations"].as_array()?.iter().find(|f| f["name"] == name)?;
        let frontend_id = frontend["id"].as_str()?.to_ascii_lowercase();
        let mut ports: Vec<i32> = props["loadBalancingRules"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|r| {
                r["properties"]["frontendIPConfiguration"]["id"]
                    .as_str()
                    .is_some_and(|id| id.to_ascii_lowercase() == frontend_id)
            })
            .filter_map(|r| r["properties"]["frontendPort"].as_i64().map(|p| p as i32))
            .collect();
        if ports.is_empty() {
            return None;
        }
        ports.sort();
        let pool =
            props["backendAddressPools"].as_array()?.iter().find(|p| p["name"] == CLUSTER)?;
        let mut instances: Vec<String> = pool["properties"]["backendIPConfigurations"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["id"].as_str())
            .filter_map(|id| id.split("/networkInterfaces/").nth(1))
            .filter_map(|rest| rest.split('/').next())
            .map(|nic| nic.trim_end_matches("-nic").to_string())
            .collect();
        instances.sort();
        instances.dedup();
        Some(LbView { ports, instances })
    }

    async fn load_balancer_resources(&self) -> Vec<String> {
        let mut left = Vec::new();
        for lb in self.cloud.resources("Microsoft.Network/loadBalancers") {
            left.push(format!("load balancer {}", str_of(&lb, "name")));
        }
        for pip in self.cloud.resources("Microsoft.Network/publicIPAddresses") {
            left.push(format!("public IP {}", str_of(&pip, "name")));
        }
        for nsg in self.cloud.resources("Microsoft.Network/networkSecurityGroups") {
            for rule in nsg["properties"]["securityRules"].as_array().into_iter().flatten() {
                if str_of(rule, "name").starts_with("k8s-azure") {
                    left.push(format!("security rule {}", str_of(rule, "name")));
                }
            }
        }
        left
    }

    async fn routes(&self) -> Vec<(String, String)> {
        let Some(table) = self
            .cloud
            .resources("Microsoft.Network/routeTables")
            .into_iter()
            .find(|t| t["name"] == format!("{CLUSTER}-routetable"))
        else {
            return Vec::new();
        };
        table["properties"]["routes"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|r| {
                let hop = r["properties"]["nextHopIpAddress"].as_str().unwrap_or_default();
                let id = self
                    .instances
                    .iter()
                    .find(|i| i.ip == hop)
                    .map(|i| i.id.clone())
                    .unwrap_or_else(|| hop.to_string());
                (r["properties"]["addressPrefix"].as_str().unwrap_or_default().to_string(), id)
            })
            .collect()
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

super::scenarios!(Azure);
