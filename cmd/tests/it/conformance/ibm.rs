//! The conformance harness for IBM Cloud (VPC): the in-process IBM Cloud emulator
//! (`ccm_emulators::ibm`: IAM, Resource Manager, VPC) with one VPC, a subnet per zone and
//! VPC instances named like their Nodes, which carry no provisioner labels (so every node is
//! looked up in the VPC). The emulator has the kit's admin API itself: no fault proxy.
//! Upstream's IBM CCM has no routes: that scenario is "n/a".

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_emulators::ibm::{IbmCloud, IbmOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::{PowerState, World};
use ccm_emulators::{Admin, Fault, FaultRule};

use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use super::{Attack, Foreign, Harness, Instance, LbView};
use crate::support::{Binary, SecretKind, register_secret};

const CLUSTER: &str = "conformance01";
const API_KEY: &str = "ibm-conformance-ApiKey-never-logged-5Rt";
const ZONES: [&str; 2] = ["us-south-1", "us-south-2"];

pub struct Ibm {
    cloud: Arc<IbmCloud>,
    server: Server,
    instances: Vec<Instance>,
    dir: tempfile::TempDir,
}

impl Harness for Ibm {
    const PROVIDER: &'static str = "ibm";
    const BINARY: Binary = Binary {
        path: env!("CARGO_BIN_EXE_cloud-controller-manager-ibm"),
        provider: "ibm",
        clear_prefixes: &["IBM", "ENABLE_VPC_PUBLIC_ENDPOINT"],
        env: &[],
    };
    const LOAD_BALANCERS: bool = true;
    const ROUTES: bool = false;
    const INSTANCE_LOOKUPS: &'static [&'static str] = &["vpc.instances.*"];

    async fn start(count: usize) -> Self {
        register_secret(SecretKind::IbmApiKey, API_KEY);
        let mut world = String::from(
            "region: us-south\nzones: [us-south-1, us-south-2]\n\
             networks:\n  - { name: vpc-1, cidr: 10.240.0.0/16 }\n\
             subnets:\n  - { name: subnet-1, network: vpc-1, zone: us-south-1, cidr: 10.240.0.0/24 }\n\
             \x20 - { name: subnet-2, network: vpc-1, zone: us-south-2, cidr: 10.240.1.0/24 }\n\
             instances:\n",
        );
        let mut specs = Vec::new();
        for i in 0..count {
            let zone = ZONES[i % 2];
            let node = format!("node-{i}");
            let ip = format!("10.240.{}.{}", i % 2, 10 + i);
            world.push_str(&format!(
                "  - {{ name: {node}, zone: {zone}, type: bx2-4x16, subnet: subnet-{}, private_ips: [{ip}] }}\n",
                i % 2 + 1
            ));
            specs.push((node, ip, zone));
        }
        let cloud = IbmCloud::new(
            World::parse(&world).unwrap(),
            IbmOptions {
                api_keys: vec![API_KEY.into()],
                lb_pending: Duration::from_secs(1),
                ..IbmOptions::default()
            },
        );
        let server = Server::start(cloud.clone(), ServerOptions::default()).await.unwrap();
        let account = cloud.account_id();
        let instances = specs
            .into_iter()
            .map(|(node, ip, zone)| {
                let id = cloud.instance_id(&node).unwrap();
                Instance {
                    addresses: vec![
                        ("InternalIP".into(), ip.clone()),
                        ("ExternalIP".into(), ip.clone()),
                        // The kubelet's Hostname, kept by the cloud-node controller.
                        ("Hostname".into(), node.clone()),
                    ],
                    provider_id: format!("ibm://{account}///{CLUSTER}/{id}"),
                    id,
                    node,
                    ip,
                    zone: zone.into(),
                    region: "us-south".into(),
                    instance_type_prefix: "bx2-4x16".into(),
                }
            })
            .collect();
        Ibm { cloud, server, instances, dir: tempfile::tempdir().unwrap() }
    }

    fn instances(&self) -> &[Instance] {
        &self.instances
    }

    fn cloud_config(&self) -> String {
        let key = self.dir.path().join("api-key");
        std::fs::write(&key, API_KEY).unwrap();
        let url = self.server.url();
        format!(
            "[global]\nversion = 1.1.0\n[provider]\ncluster-default-provider = g2\n\
             accountID = {}\nclusterID = {CLUSTER}\nregion = us-south\ng2VpcName = vpc-1\n\
             g2Credentials = {}\ng2ResourceGroupName = default\ng2VpcSubnetNames = subnet-1,subnet-2\n\
             g2EndpointOverride = {url}\niamEndpointOverride = {url}\nrmEndpointOverride = {url}\ntaggingEndpointOverride = {url}\n",
            self.cloud.account_id(),
            key.display()
        )
    }

    fn args(&self, _routes: bool) -> Vec<String> {
        Vec::new()
    }

    fn admin(&self) -> Admin {
        self.server.admin()
    }

    async fn slow_cloud(&self) -> Option<Duration> {
        Some(super::realistic_profile(&self.server.admin(), Self::PROVIDER).await)
    }

    async fn power_off(&self, i: usize) {
        assert!(self.cloud.set_power(&self.instances[i].node, PowerState::Stopped));
    }

    async fn power_on(&self, i: usize) {
        assert!(self.cloud.set_power(&self.instances[i].node, PowerState::Running));
    }

    async fn delete(&self, i: usize) {
        assert!(self.cloud.delete_instance(&self.instances[i].node));
    }

    /// The suite names load balancers as upstream's default (`a` + UID, 32 characters); ours
    /// is `kube-<clusterID>-<UID>`: found by that UID prefix.
    async fn load_balancer(&self, name: &str) -> Option<LbView> {
        let uid_prefix = name.strip_prefix('a').unwrap_or(name);
        let state = self.server.admin().state().await.ok()?;
        let lbs = state["cloud"]["load_balancers"].as_array()?.clone();
        let lb = lbs.iter().find(|lb| {
            lb["name"]
                .as_str()
                .is_some_and(|n| n.starts_with(&format!("kube-{CLUSTER}-{uid_prefix}")))
        })?;
        if lb["provisioning_status"] != "active" {
            return None;
        }
        let mut ports: Vec<i32> = lb["listeners"]
            .as_array()?
            .iter()
            .filter_map(|l| l["port"].as_i64())
            .map(|p| p as i32)
            .collect();
        ports.sort();
        let mut instances: Vec<String> = Vec::new();
        for pool in lb["pools"].as_array()? {
            for m in pool["members"].as_array().into_iter().flatten() {
                let ip = m["target"]["address"].as_str()?;
                let id = self.instances.iter().find(|i| i.ip == ip)?.id.clone();
                if !instances.contains(&id) {
                    instances.push(id);
                }
            }
        }
        instances.sort();
        Some(LbView { ports, instances })
    }

    /// The provider lists the VPC's instances and asks for one by ID only when the listing
    /// lacks it: a listing that has not caught up (an empty page, as VPC answers it) sends
    /// the lookup to `GetInstance`, where the proxy's 404s are.
    fn not_found_setup(&self) -> Vec<FaultRule> {
        let empty = json!({"instances": [], "limit": 50, "total_count": 0,
            "first": {"href": format!("{}/v1/instances?limit=50", self.server.url())}});
        let page = Fault::Page {
            status: 200,
            content_type: Some("application/json".into()),
            body: empty.to_string(),
        };
        vec![FaultRule::new("vpc.instances.list", page)]
    }

    /// Another cluster's load balancer (named as upstream's CCM of cluster `othercluster01`
    /// names them) and a hand-made one, each with a listener on 443.
    async fn plant_foreign(&self) -> Foreign {
        let other_name = "kube-othercluster01-6f7f1b2c3d4e5f60718293a4b5c6d7e8";
        let (other_id, other_host, other_ip) = self.plant_lb(other_name).await;
        let (hand_id, hand_host, hand_ip) = self.plant_lb("shop-frontend").await;
        let ids = [
            ("other_name", other_name.to_string()),
            ("other_id", other_id),
            ("other_host", other_host.clone()),
            ("hand_name", "shop-frontend".to_string()),
            ("hand_id", hand_id),
            ("hand_host", hand_host.clone()),
        ];
        Foreign {
            addresses: [other_host, other_ip, hand_host, hand_ip]
                .into_iter()
                .filter(|a| !a.is_empty())
                .collect(),
            ids: ids.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }

    async fn attacks(&self, _victim: &Service, victim_lb: &str, f: &Foreign) -> Vec<Attack> {
        let uid_prefix = victim_lb.strip_prefix('a').unwrap_or(victim_lb);
        let prefix = format!("kube-{CLUSTER}-{uid_prefix}");
        let lbs = self.lbs().await;
        let v = lbs
            .iter()
            .find(|l| l["name"].as_str().is_some_and(|n| n.starts_with(&prefix)))
            .expect("the victim's load balancer");
        let field = |k: &str| v[k].as_str().unwrap_or_default().to_string();
        let (name, id, host) = (field("name"), field("id"), field("hostname"));
        let mut out = vec![
            Attack::annotations("vpc-lb-name: the victim's name", &[(LB_NAME, name.as_str())]),
            Attack::annotations("vpc-lb-name: the victim's ID", &[(LB_NAME, id.as_str())]),
            Attack::annotations(
                "vpc-lb-name: another cluster's name",
                &[(LB_NAME, f.id("other_name"))],
            ),
            Attack::annotations(
                "vpc-lb-name: another cluster's ID",
                &[(LB_NAME, f.id("other_id"))],
            ),
            Attack::annotations(
                "vpc-lb-name: a hand-made one's name",
                &[(LB_NAME, f.id("hand_name"))],
            ),
            Attack::annotations("vpc-lb-name: a hand-made one's ID", &[(LB_NAME, f.id("hand_id"))]),
        ];
        if !host.is_empty() {
            out.push(Attack::annotations(
                "vpc-lb-name: the victim's hostname",
                &[(LB_NAME, host.as_str())],
            ));
        }
        out.push(Attack::annotations(
            "vpc-lb-name: another cluster's hostname",
            &[(LB_NAME, f.id("other_host"))],
        ));
        out
    }

    /// Every VPC load balancer, whole (listeners, pools, members), as the API shows it.
    async fn lb_snapshot(&self) -> BTreeMap<String, String> {
        self.lbs()
            .await
            .into_iter()
            .map(|lb| {
                (format!("load balancer {}", lb["id"].as_str().unwrap_or_default()), lb.to_string())
            })
            .collect()
    }

    async fn load_balancer_resources(&self) -> Vec<String> {
        let state = self.server.admin().state().await.unwrap();
        state["cloud"]["load_balancers"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|lb| {
                format!(
                    "VPC load balancer {}|{}, {} listeners, {} pools",
                    lb["name"].as_str().unwrap_or_default(),
                    lb["provisioning_status"].as_str().unwrap_or_default(),
                    lb["listeners"].as_array().map(Vec::len).unwrap_or_default(),
                    lb["pools"].as_array().map(Vec::len).unwrap_or_default()
                )
            })
            .collect()
    }
}

/// The annotation of upstream's IBM CCM that names an existing load balancer.
const LB_NAME: &str = "service.kubernetes.io/ibm-load-balancer-cloud-provider-vpc-lb-name";

impl Ibm {
    /// One call of the emulator's VPC API with a token of the harness' API key (the same
    /// account: another cluster of the account, or a person).
    async fn api(&self, method: &str, path: &str, body: Value) -> Value {
        let admin = self.server.admin();
        let form = format!("grant_type=urn:ibm:params:oauth:grant-type:apikey&apikey={API_KEY}");
        let t = admin
            .cloud_call(
                "POST",
                "/identity/token",
                &[("content-type", "application/x-www-form-urlencoded")],
                Some(form),
            )
            .await
            .unwrap();
        let token = t.json()["access_token"].as_str().unwrap().to_string();
        let bearer = format!("Bearer {token}");
        let sep = if path.contains('?') { '&' } else { '?' };
        let path = format!("{path}{sep}version=2024-06-01&generation=2");
        let r = admin
            .cloud_call(
                method,
                &path,
                &[("content-type", "application/json"), ("authorization", bearer.as_str())],
                Some(body.to_string()),
            )
            .await
            .unwrap();
        assert!(r.status < 300, "{path}: HTTP {}: {}", r.status, r.body);
        r.json()
    }

    async fn lbs(&self) -> Vec<Value> {
        let state = self.server.admin().state().await.unwrap();
        state["cloud"]["load_balancers"].as_array().cloned().unwrap_or_default()
    }

    /// A public load balancer made outside this cluster with a TCP listener on 443 to node 0:
    /// (its ID, hostname, public IP).
    async fn plant_lb(&self, name: &str) -> (String, String, String) {
        let subnet = self.cloud.subnet_id("subnet-1").unwrap();
        let lb = self
            .api(
                "POST",
                "/v1/load_balancers",
                json!({"name": name, "is_public": true, "subnets": [{"id": subnet}],
                    "pools": [{"name": "tcp-443-30443", "algorithm": "round_robin", "protocol": "tcp",
                        "health_monitor": {"delay": 5, "max_retries": 2, "timeout": 2, "type": "tcp"},
                        "members": [{"port": 30443, "target": {"address": self.instances[0].ip}}]}],
                    "listeners": [{"port": 443, "protocol": "tcp", "default_pool": {"name": "tcp-443-30443"}}]}),
            )
            .await;
        let id = lb["id"].as_str().unwrap().to_string();
        for _ in 0..100 {
            let lbs = self.lbs().await;
            if let Some(l) = lbs.iter().find(|l| l["id"] == id.as_str())
                && l["provisioning_status"] == "active"
            {
                let host = l["hostname"].as_str().unwrap_or_default().to_string();
                let ip = l["public_ips"][0]["address"].as_str().unwrap_or_default().to_string();
                return (id, host, ip);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("load balancer {name} never became active");
    }
}

super::scenarios!(Ibm);
super::metrics::scenario!(Ibm);
