//! The conformance harness for Azure: the in-process ARM emulator (`ccm_emulators::azure`,
//! HTTPS with the testbed CA, trusted by the manager through `SSL_CERT_FILE`) with
//! availability-set VMs named like their Nodes in zones 1–3 of `eastus`, the virtual network
//! `vnet`, the cluster security group `k8s-nsg`. The manager signs in as the emulator's
//! service principal (`aadClientSecret` in `azure.json`) at the emulator's AAD, which is the
//! `resourceManagerEndpoint`'s host. The emulator has the kit's admin API itself: no fault
//! proxy. Instances are named by their VM names (a route's next hop is the node's IP, mapped
//! back to its VM here).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_emulators::Admin;
use ccm_emulators::azure::{AzureCloud, AzureOptions, DEFAULT_CLIENT_ID, DEFAULT_CLIENT_SECRET};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::{PowerState, World};
use serde_json::Value;

use k8s_openapi::api::core::v1::Service;
use serde_json::json;

use super::{Attack, Foreign, Harness, Instance, LbView};
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
    const INSTANCE_LOOKUPS: &'static [&'static str] = &["compute.virtual_machines.*"];

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

    async fn slow_cloud(&self) -> Option<Duration> {
        Some(super::realistic_profile(&self.server.admin(), Self::PROVIDER).await)
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

    /// Public IPs of another cluster (named and tagged as upstream's CCM of cluster
    /// `othercluster` makes them), made by hand, and in another resource group, and a
    /// virtual network with a subnet in that group.
    async fn plant_foreign(&self) -> Foreign {
        let rg = self.cloud.resource_group();
        let other = "othercluster-a0f1e2d3c4b5a69788796a5b4c3d2e1f";
        self.plant_pip(
            &rg,
            other,
            "20.1.2.3",
            json!({"k8s-azure-cluster-name": "othercluster", "k8s-azure-service": "tenant-a/victim"}),
        );
        self.plant_pip(&rg, "shop-frontend-ip", "20.1.2.4", json!({}));
        self.plant_pip(OTHER_RG, "other-rg-ip", "20.1.2.5", json!({}));
        let vnet = self.id_in(OTHER_RG, "Microsoft.Network/virtualNetworks", "other-vnet");
        let vnet_body =
            json!({"properties": {"addressSpace": {"addressPrefixes": ["10.9.0.0/16"]}}});
        self.cloud.put_resource(&vnet, vnet_body).unwrap();
        let subnet = json!({"properties": {"addressPrefix": "10.9.0.0/24"}});
        self.cloud.put_resource(&format!("{vnet}/subnets/other-subnet"), subnet).unwrap();
        let ids = [("other_pip", other), ("hand_pip", "shop-frontend-ip")];
        Foreign {
            // The hand-made public IP in the cluster's group is unattached: a Service naming
            // it may use it (never change or delete it); the other group's may not be named.
            // And the metadata address, which no Service's status may carry.
            addresses: vec!["20.1.2.3".into(), "20.1.2.5".into(), "169.254.169.254".into()],
            ids: ids.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        }
    }

    async fn attacks(&self, victim: &Service, victim_lb: &str, f: &Foreign) -> Vec<Attack> {
        let v_ip = super::status_addresses(victim).first().cloned().unwrap_or_default();
        let v_pip = self
            .cloud
            .resources("Microsoft.Network/publicIPAddresses")
            .into_iter()
            .find(|p| p["properties"]["ipAddress"] == v_ip.as_str())
            .map(|p| str_of(&p, "name").to_string())
            .unwrap_or_else(|| format!("{CLUSTER}-{victim_lb}"));
        let up = "../../../../../resourceGroups/other-rg/providers/Microsoft.Network";
        let ip_attack = |what: &str, ip: &str, ann: &[(&str, &str)]| {
            let mut a = Attack::annotations(what, ann);
            a.load_balancer_ip = Some(ip.to_string());
            a
        };
        vec![
            Attack::annotations("azure-pip-name: the victim's", &[(PIP_NAME, v_pip.as_str())]),
            Attack::annotations(
                "azure-pip-name: another cluster's",
                &[(PIP_NAME, f.id("other_pip"))],
            ),
            Attack::annotations("azure-pip-name: a hand-made one", &[(PIP_NAME, f.id("hand_pip"))]),
            Attack::annotations(
                "azure-load-balancer-resource-group: another group's public IP",
                &[(RESOURCE_GROUP, OTHER_RG), (PIP_NAME, "other-rg-ip")],
            ),
            Attack::annotations(
                "azure-pip-name: a path to a hand-made one",
                &[(PIP_NAME, "x/../shop-frontend-ip")],
            ),
            Attack::annotations(
                "azure-load-balancer-resource-group: a path to another group",
                &[(RESOURCE_GROUP, "../resourceGroups/other-rg"), (PIP_NAME, "other-rg-ip")],
            ),
            Attack::annotations(
                "azure-load-balancer-resource-group: a query and fragment",
                &[(
                    RESOURCE_GROUP,
                    "other-rg/providers/Microsoft.Network/publicIPAddresses/other-rg-ip?api-version=2022-07-01#",
                )],
            ),
            Attack::annotations(
                "azure-load-balancer-internal-subnet: a path to another group's subnet",
                &[
                    (INTERNAL, "true"),
                    (
                        INTERNAL_SUBNET,
                        format!("{up}/virtualNetworks/other-vnet/subnets/other-subnet").as_str(),
                    ),
                ],
            ),
            Attack::annotations(
                "azure-additional-public-ips: the victim's and a hand-made address",
                &[(ADDITIONAL_PUBLIC_IPS, format!("{v_ip},20.1.2.4").as_str())],
            ),
            Attack::annotations(
                "azure-additional-public-ips: the metadata address",
                &[(ADDITIONAL_PUBLIC_IPS, "169.254.169.254")],
            ),
            ip_attack("loadBalancerIP: the victim's address", &v_ip, &[]),
            ip_attack("loadBalancerIP: another cluster's address", "20.1.2.3", &[]),
            ip_attack("loadBalancerIP: a hand-made address", "20.1.2.4", &[]),
        ]
    }

    /// Every public IP and the other group's virtual network, whole; the cluster's shared load balancer and
    /// network security group one child each (frontends, rules, probes, pools, security
    /// rules: a Service adds its own children to them), without the etags and back
    /// references that change with the shared parent.
    async fn lb_snapshot(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for o in self.cloud.resources("Microsoft.Network/publicIPAddresses") {
            out.insert(str_of(&o, "id").to_ascii_lowercase(), o.to_string());
        }
        // The other group's network (the cluster's own gains the internal frontends' IP
        // configurations as back references).
        for t in ["Microsoft.Network/virtualNetworks", "Microsoft.Network/virtualNetworks/subnets"]
        {
            for o in self.cloud.resources(t) {
                let id = str_of(&o, "id").to_ascii_lowercase();
                if id.contains(&format!("/resourcegroups/{OTHER_RG}/")) {
                    out.insert(id, o.to_string());
                }
            }
        }
        let volatile = ["etag", "loadBalancingRules", "inboundNatRules", "outboundRules"];
        for lb in self.cloud.resources("Microsoft.Network/loadBalancers") {
            for child in
                ["frontendIPConfigurations", "loadBalancingRules", "probes", "backendAddressPools"]
            {
                for c in lb["properties"][child].as_array().into_iter().flatten() {
                    let v = if child == "loadBalancingRules" {
                        without(c, &["etag"])
                    } else {
                        without(c, &volatile)
                    };
                    out.insert(str_of(c, "id").to_ascii_lowercase(), v.to_string());
                }
            }
        }
        for nsg in self.cloud.resources("Microsoft.Network/networkSecurityGroups") {
            for r in nsg["properties"]["securityRules"].as_array().into_iter().flatten() {
                out.insert(str_of(r, "id").to_ascii_lowercase(), without(r, &["etag"]).to_string());
            }
        }
        out
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

/// The annotations of upstream's Azure CCM that name existing resources.
const PIP_NAME: &str = "service.beta.kubernetes.io/azure-pip-name";
const RESOURCE_GROUP: &str = "service.beta.kubernetes.io/azure-load-balancer-resource-group";
const INTERNAL: &str = "service.beta.kubernetes.io/azure-load-balancer-internal";
const INTERNAL_SUBNET: &str = "service.beta.kubernetes.io/azure-load-balancer-internal-subnet";
const ADDITIONAL_PUBLIC_IPS: &str = "service.beta.kubernetes.io/azure-additional-public-ips";

/// The resource group of "another team" in the subscription.
const OTHER_RG: &str = "other-rg";

impl Azure {
    /// The ARM ID of `name` of `arm_type` in resource group `rg`.
    fn id_in(&self, rg: &str, arm_type: &str, name: &str) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{rg}/providers/{arm_type}/{name}",
            self.cloud.subscription_id()
        )
    }

    fn plant_pip(&self, rg: &str, name: &str, ip: &str, tags: Value) {
        let id = self.id_in(rg, "Microsoft.Network/publicIPAddresses", name);
        let body = json!({"sku": {"name": "Standard"}, "tags": tags, "properties": {
            "publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4", "ipAddress": ip}});
        self.cloud.put_resource(&id, body).unwrap();
    }
}

/// `v` without the keys `keys` at any depth (back references and etags that change with the
/// shared parent, not with the object).
fn without(v: &Value, keys: &[&str]) -> Value {
    match v {
        Value::Object(m) => Value::Object(
            m.iter()
                .filter(|(k, _)| !keys.contains(&k.as_str()))
                .map(|(k, v)| (k.clone(), without(v, keys)))
                .collect(),
        ),
        Value::Array(a) => Value::Array(a.iter().map(|x| without(x, keys)).collect()),
        other => other.clone(),
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

super::scenarios!(Azure);
super::metrics::scenario!(Azure);
