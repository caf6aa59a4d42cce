//! The conformance harness for IBM Cloud (VPC): the in-process IBM Cloud emulator
//! (`ccm_emulators::ibm`: IAM, Resource Manager, VPC) with one VPC, a subnet per zone and
//! VPC instances named like their Nodes, which carry no provisioner labels (so every node is
//! looked up in the VPC). The emulator has the kit's admin API itself: no fault proxy.
//! Upstream's IBM CCM has no routes: that scenario is "n/a".

use std::sync::Arc;
use std::time::Duration;

use ccm_emulators::Admin;
use ccm_emulators::ibm::{IbmCloud, IbmOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::{PowerState, World};

use super::{Harness, Instance, LbView};
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
             g2EndpointOverride = {url}\niamEndpointOverride = {url}\nrmEndpointOverride = {url}\n",
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

super::scenarios!(Ibm);
