//! The conformance harness for OpenStack: the in-process OpenStack emulator
//! (`ccm_emulators::openstack`: Keystone, Nova, Neutron, Octavia on one loopback server) with
//! one tenant network and subnet, servers named like their Nodes in two availability zones,
//! the external network `public` for floating IPs and the router `router1` (routes are its
//! extra routes). The emulator has the kit's admin API itself: no fault proxy.

use std::sync::Arc;
use std::time::Duration;

use ccm_emulators::Admin;
use ccm_emulators::openstack::{OpenStackCloud, OpenStackOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::{PowerState, World};
use serde_json::Value;

use super::{Harness, Instance, LbView};
use crate::support::{Binary, SecretKind, register_secret};

const USER: &str = "ccm-conformance";
const PASSWORD: &str = "os-conformance-Password-never-logged-4Tz";
const ZONES: [&str; 2] = ["az-1", "az-2"];

pub struct OpenStack {
    cloud: Arc<OpenStackCloud>,
    server: Server,
    instances: Vec<Instance>,
}

impl Harness for OpenStack {
    const PROVIDER: &'static str = "openstack";
    const BINARY: Binary = Binary {
        path: env!("CARGO_BIN_EXE_cloud-controller-manager-openstack"),
        provider: "openstack",
        clear_prefixes: &["OS_"],
        env: &[],
    };
    const LOAD_BALANCERS: bool = true;
    const ROUTES: bool = true;

    async fn start(count: usize) -> Self {
        register_secret(SecretKind::OpenStackPassword, PASSWORD);
        let mut world = String::from(
            "region: RegionOne\nzones: [az-1, az-2]\n\
             networks:\n  - { name: private, cidr: 10.0.0.0/16 }\n\
             subnets:\n  - { name: private-subnet, network: private, zone: az-1, cidr: 10.0.0.0/16 }\n\
             instances:\n",
        );
        let mut specs = Vec::new();
        for i in 0..count {
            let zone = ZONES[i % 2];
            let node = format!("node-{i}");
            let ip = format!("10.0.{}.{}", i / 200, 10 + i % 200);
            world.push_str(&format!(
                "  - {{ name: {node}, zone: {zone}, type: m1.medium, private_ips: [{ip}] }}\n"
            ));
            specs.push((node, ip, zone));
        }
        let cloud = OpenStackCloud::new(
            World::parse(&world).unwrap(),
            OpenStackOptions {
                users: vec![(USER.into(), PASSWORD.into())],
                lb_pending: Duration::from_millis(500),
                ..OpenStackOptions::default()
            },
        );
        let server = Server::start(cloud.clone(), ServerOptions::default()).await.unwrap();
        let instances = specs
            .into_iter()
            .map(|(node, ip, zone)| {
                let id = cloud.server_id(&node).unwrap();
                Instance {
                    addresses: vec![
                        ("InternalIP".into(), ip.clone()),
                        // The kubelet's Hostname, kept by the cloud-node controller.
                        ("Hostname".into(), node.clone()),
                    ],
                    provider_id: format!("openstack:///{id}"),
                    id,
                    node,
                    ip,
                    zone: zone.into(),
                    region: "RegionOne".into(),
                    instance_type_prefix: "m1.medium".into(),
                }
            })
            .collect();
        OpenStack { cloud, server, instances }
    }

    fn instances(&self) -> &[Instance] {
        &self.instances
    }

    fn cloud_config(&self) -> String {
        let url = self.server.url();
        let subnet = self.cloud.neutron_id("subnets", "private-subnet").unwrap();
        let public = self.cloud.neutron_id("networks", "public").unwrap();
        let router = self.cloud.neutron_id("routers", "router1").unwrap();
        format!(
            "[Global]\nauth-url = {url}/identity/v3\nusername = {USER}\npassword = {PASSWORD}\n\
             tenant-name = demo\ndomain-name = Default\nregion = RegionOne\n\
             [LoadBalancer]\nsubnet-id = {subnet}\nfloating-network-id = {public}\n\
             [Route]\nrouter-id = {router}\n"
        )
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
        assert!(self.cloud.set_power(&self.instances[i].node, PowerState::Stopped));
    }

    async fn power_on(&self, i: usize) {
        assert!(self.cloud.set_power(&self.instances[i].node, PowerState::Running));
    }

    async fn delete(&self, i: usize) {
        assert!(self.cloud.delete_server(&self.instances[i].node));
    }

    /// The suite names load balancers as upstream's default (`a` + UID); ours (as upstream
    /// OpenStack's) is `kube_service_<cluster>_<namespace>_<name>`: the suite has one
    /// LoadBalancer Service at a time, so the one such load balancer is it. `None` while it is
    /// not ACTIVE (an update under way is not a settled view).
    async fn load_balancer(&self, _name: &str) -> Option<LbView> {
        let lbs = self.cloud.octavia_objects("loadbalancers");
        let lb = lbs.iter().find(|lb| str_of(lb, "name").starts_with("kube_service_"))?;
        if str_of(lb, "provisioning_status") != "ACTIVE" {
            return None;
        }
        let lb_id = str_of(lb, "id");
        let on_lb = |o: &Value| {
            o["loadbalancers"].as_array().into_iter().flatten().any(|l| str_of(l, "id") == lb_id)
        };
        let mut ports: Vec<i32> = self
            .cloud
            .octavia_objects("listeners")
            .iter()
            .filter(|l| on_lb(l))
            .filter_map(|l| l["protocol_port"].as_i64())
            .map(|p| p as i32)
            .collect();
        ports.sort();
        let pools: Vec<String> = self
            .cloud
            .octavia_objects("pools")
            .iter()
            .filter(|p| on_lb(p))
            .map(|p| str_of(p, "id").to_string())
            .collect();
        let mut instances: Vec<String> = Vec::new();
        for m in self.cloud.objects("members") {
            if !pools.iter().any(|p| p == str_of(&m, "pool_id")) {
                continue;
            }
            let ip = str_of(&m, "address");
            let id = self.instances.iter().find(|i| i.ip == ip)?.id.clone();
            if !instances.contains(&id) {
                instances.push(id);
            }
        }
        instances.sort();
        Some(LbView { ports, instances })
    }

    async fn load_balancer_resources(&self) -> Vec<String> {
        // Members are the node set (it may grow, e.g. after an outage): not listed; they go
        // with their pools.
        let mut left = Vec::new();
        for coll in ["loadbalancers", "listeners", "pools", "healthmonitors"] {
            for o in self.cloud.objects(coll) {
                left.push(format!("Octavia {coll} {} {}", str_of(&o, "name"), str_of(&o, "id")));
            }
        }
        for fip in self.cloud.objects("floatingips") {
            // The world's own floating IPs are on server ports; one the CCM made is on a VIP.
            if self.instances.iter().any(|i| fip["fixed_ip_address"].as_str() == Some(&i.ip)) {
                continue;
            }
            left.push(format!("floating IP {}", str_of(&fip, "floating_ip_address")));
        }
        for sg in self.cloud.objects("security-groups") {
            if str_of(&sg, "name").starts_with("lb-sg-") {
                left.push(format!("security group {}", str_of(&sg, "name")));
            }
        }
        left
    }

    async fn routes(&self) -> Vec<(String, String)> {
        let routers = self.cloud.objects("routers");
        let Some(router) = routers.iter().find(|r| str_of(r, "name") == "router1") else {
            return Vec::new();
        };
        router["routes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| {
                let hop = str_of(r, "nexthop");
                let id = self.instances.iter().find(|i| i.ip == hop)?.id.clone();
                Some((str_of(r, "destination").to_string(), id))
            })
            .collect()
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

super::scenarios!(OpenStack);
