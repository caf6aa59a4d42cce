//! The conformance harness for OpenStack: the in-process OpenStack emulator
//! (`ccm_emulators::openstack`: Keystone, Nova, Neutron, Octavia on one loopback server) with
//! one tenant network and subnet, servers named like their Nodes in two availability zones,
//! the external network `public` for floating IPs and the router `router1` (routes are its
//! extra routes). The emulator has the kit's admin API itself: no fault proxy.
//!
//! The manager's `cloud.conf` is **Magnum's layout** (issue #32): the trustee's `user-id` and
//! `password` with `trust-id` (the trust delegates the project owner's roles on `demo`), the
//! domains by ID (`user-domain-id`, `tenant-domain-id`; the trustee lives in its own domain,
//! as Magnum's do), and `ca-file` (the emulator serves HTTPS with a testbed CA, and its
//! catalog names its `https://` URL): every scenario (join, lifecycle, load balancers,
//! routes) runs on a trust-scoped token.

use std::sync::Arc;
use std::time::Duration;

use std::collections::BTreeMap;

use ccm_emulators::Admin;
use ccm_emulators::openstack::{
    KeystoneTrust, KeystoneUser, OpenStackCloud, OpenStackOptions, keystone_domain_id,
    keystone_user_id,
};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::{PowerState, World};
use serde_json::Value;

use k8s_openapi::api::core::v1::Service;

use super::{Attack, Foreign, Harness, Instance, LbView};
use crate::support::{Binary, SecretKind, register_secret};

const USER: &str = "ccm-conformance";
const PASSWORD: &str = "os-conformance-Password-never-logged-4Tz";
/// Magnum's trustee user (in its own domain) and the trust naming it.
const TRUSTEE: &str = "ccm-conformance-trustee";
const TRUSTEE_DOMAIN: &str = "magnum";
const TRUST_ID: &str = "ccm-conformance-trust";
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
    const INSTANCE_LOOKUPS: &'static [&'static str] = &["nova.servers.*"];

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
                extra_users: vec![KeystoneUser {
                    name: TRUSTEE.into(),
                    password: PASSWORD.into(),
                    domain: TRUSTEE_DOMAIN.into(),
                    projects: Vec::new(),
                    roles: vec!["member".into()],
                    default_project: None,
                }],
                // The project owner's roles, delegated (the owner is an admin here, as the
                // plain password login of this harness was).
                trusts: vec![KeystoneTrust {
                    id: TRUST_ID.into(),
                    trustor: USER.into(),
                    trustee: TRUSTEE.into(),
                    project: "demo".into(),
                    roles: vec!["admin".into(), "member".into()],
                    impersonation: false,
                }],
                ..OpenStackOptions::default()
            },
        );
        let server =
            Server::start(cloud.clone(), ServerOptions { tls: true, ..ServerOptions::default() })
                .await
                .unwrap();
        cloud.set_catalog_base(Some(server.url()));
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
        let ca = self.server.ca_file().unwrap().display().to_string();
        let trustee = keystone_user_id(TRUSTEE);
        let user_domain = keystone_domain_id(TRUSTEE_DOMAIN);
        let project_domain = keystone_domain_id("Default");
        format!(
            "[Global]\nauth-url = {url}/identity/v3\nuser-id = {trustee}\npassword = {PASSWORD}\n\
             trust-id = {TRUST_ID}\nuser-domain-id = {user_domain}\n\
             tenant-domain-id = {project_domain}\nca-file = {ca}\nregion = RegionOne\n\
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
        assert!(self.cloud.delete_server(&self.instances[i].node));
    }

    /// The suite names load balancers as upstream's default (`a` + UID); ours (as upstream
    /// OpenStack's) is `kube_service_<cluster>_<namespace>_<name>`: the suite has one
    /// LoadBalancer Service at a time, so the one such load balancer is it. `None` while it is
    /// not ACTIVE (an update under way is not a settled view).
    async fn load_balancer(&self, _name: &str) -> Option<LbView> {
        let lbs = self.cloud.octavia_objects("loadbalancers");
        // (Only this cluster's: the tenant_isolation scenario plants another cluster's.)
        let lb =
            lbs.iter().find(|lb| str_of(lb, "name").starts_with("kube_service_kubernetes_"))?;
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

    /// Another cluster's load balancer (named, described and tagged as upstream's CCM of
    /// cluster `othercluster` makes them, for a Service of the victim's name and namespace)
    /// and a hand-made one (no tag, its own name), each with a floating IP, and a floating IP
    /// reserved by hand (kept by a `keep-floatingip` Service of another cluster).
    async fn plant_foreign(&self) -> Foreign {
        let other = "kube_service_othercluster_tenant-a_victim";
        let (other_id, other_port, other_fip) = self
            .plant_lb(
                other,
                "Kubernetes external service tenant-a/victim from cluster othercluster",
                &[other],
                "Floating IP for Kubernetes external service tenant-a/victim from cluster othercluster",
            )
            .await;
        let (hand_id, hand_port, hand_fip) =
            self.plant_lb("shop-frontend", "made by hand", &[], "shop").await;
        let public = self.cloud.neutron_id("networks", "public").unwrap();
        let f = self
            .api(
                "POST",
                "/network/v2.0/floatingips",
                serde_json::json!({"floatingip": {"floating_network_id": public,
                    "description": "Floating IP for Kubernetes external service tenant-a/kept from cluster othercluster"}}),
            )
            .await;
        let spare = f["floatingip"]["floating_ip_address"].as_str().unwrap().to_string();
        let ids = [
            ("other_id", other_id),
            ("other_port", other_port),
            ("other_fip", other_fip.clone()),
            ("hand_id", hand_id),
            ("hand_port", hand_port),
            ("hand_fip", hand_fip.clone()),
            ("spare_fip", spare.clone()),
        ];
        Foreign {
            addresses: vec![other_fip, hand_fip, spare],
            ids: ids.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }

    async fn attacks(&self, victim: &Service, _victim_lb: &str, f: &Foreign) -> Vec<Attack> {
        let lbs = self.cloud.octavia_objects("loadbalancers");
        let v = lbs
            .iter()
            .find(|l| str_of(l, "name") == "kube_service_kubernetes_tenant-a_victim")
            .expect("the victim's load balancer");
        let (v_id, v_port) = (str_of(v, "id").to_string(), str_of(v, "vip_port_id").to_string());
        let v_fip = super::status_addresses(victim).first().cloned().unwrap_or_default();
        vec![
            Attack::annotations("load-balancer-id of the victim's", &[(LB_ID, v_id.as_str())]),
            Attack::annotations(
                "load-balancer-id of the victim's, keep-floatingip",
                &[(LB_ID, v_id.as_str()), (KEEP_FIP, "true")],
            ),
            Attack::annotations(
                "load-balancer-id of another cluster's",
                &[(LB_ID, f.id("other_id"))],
            ),
            Attack::annotations("load-balancer-id of a hand-made one", &[(LB_ID, f.id("hand_id"))]),
            Attack::annotations("port-id of the victim's VIP", &[(PORT_ID, v_port.as_str())]),
            Attack::annotations(
                "port-id of another cluster's VIP",
                &[(PORT_ID, f.id("other_port"))],
            ),
            Attack::annotations("port-id of a hand-made VIP", &[(PORT_ID, f.id("hand_port"))]),
            Attack::load_balancer_ip("loadBalancerIP of the victim's floating IP", &v_fip),
            Attack::load_balancer_ip(
                "loadBalancerIP of another cluster's floating IP",
                f.id("other_fip"),
            ),
            Attack::load_balancer_ip("loadBalancerIP of a hand-made floating IP", f.id("hand_fip")),
            Attack::load_balancer_ip("loadBalancerIP of a kept floating IP", f.id("spare_fip")),
        ]
    }

    /// Octavia's load balancers, listeners, pools, members and health monitors and Neutron's
    /// floating IPs, ports, security groups and rules, whole, as the API shows them.
    async fn lb_snapshot(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for coll in ["loadbalancers", "listeners", "pools", "healthmonitors"] {
            for o in self.cloud.octavia_objects(coll) {
                out.insert(format!("octavia {coll} {}", str_of(&o, "id")), o.to_string());
            }
        }
        for coll in ["members", "floatingips", "ports", "security-groups", "security-group-rules"] {
            for o in self.cloud.objects(coll) {
                out.insert(format!("{coll} {}", str_of(&o, "id")), o.to_string());
            }
        }
        out
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

/// The annotations of upstream's OpenStack CCM that name an existing resource.
const LB_ID: &str = "loadbalancer.openstack.org/load-balancer-id";
const PORT_ID: &str = "loadbalancer.openstack.org/port-id";
const KEEP_FIP: &str = "loadbalancer.openstack.org/keep-floatingip";

impl OpenStack {
    /// One call of the emulator's own API, with a token of the harness' user (the same
    /// project as the cluster: another cluster of the project, or a person).
    async fn api(&self, method: &str, path: &str, body: Value) -> Value {
        let admin = self.server.admin();
        let auth = serde_json::json!({"auth": {"identity": {"methods": ["password"], "password": {"user": {
            "name": USER, "domain": {"name": "Default"}, "password": PASSWORD}}},
            "scope": {"project": {"name": "demo", "domain": {"name": "Default"}}}}});
        let t = admin
            .cloud_call(
                "POST",
                "/identity/v3/auth/tokens",
                &[("content-type", "application/json")],
                Some(auth.to_string()),
            )
            .await
            .unwrap();
        let token = t.header("x-subject-token").unwrap().to_string();
        let r = admin
            .cloud_call(
                method,
                path,
                &[("content-type", "application/json"), ("x-auth-token", token.as_str())],
                Some(body.to_string()),
            )
            .await
            .unwrap();
        assert!(r.status < 300, "{path}: HTTP {}: {}", r.status, r.body);
        r.json()
    }

    /// Waits until Octavia load balancer `id` is ACTIVE again (a change makes it pending).
    async fn lb_active(&self, id: &str) {
        for _ in 0..100 {
            let lbs = self.cloud.octavia_objects("loadbalancers");
            if lbs
                .iter()
                .any(|l| str_of(l, "id") == id && str_of(l, "provisioning_status") == "ACTIVE")
            {
                return;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        panic!("load balancer {id} never became ACTIVE");
    }

    /// A load balancer made outside this cluster, with a TCP listener on 443, a pool with
    /// node 0 as member and a floating IP: (its ID, its VIP port ID, its floating IP).
    async fn plant_lb(
        &self,
        name: &str,
        description: &str,
        tags: &[&str],
        fip_description: &str,
    ) -> (String, String, String) {
        let subnet = self.cloud.neutron_id("subnets", "private-subnet").unwrap();
        let public = self.cloud.neutron_id("networks", "public").unwrap();
        let lb = self
            .api(
                "POST",
                "/load-balancer/v2/lbaas/loadbalancers",
                serde_json::json!({"loadbalancer": {"name": name, "description": description,
                    "vip_subnet_id": subnet, "tags": tags}}),
            )
            .await;
        let id = lb["loadbalancer"]["id"].as_str().unwrap().to_string();
        let port = lb["loadbalancer"]["vip_port_id"].as_str().unwrap().to_string();
        self.lb_active(&id).await;
        let l = self
            .api(
                "POST",
                "/load-balancer/v2/lbaas/listeners",
                serde_json::json!({"listener": {"name": format!("listener_0_{name}"), "loadbalancer_id": id,
                    "protocol": "TCP", "protocol_port": 443, "tags": tags}}),
            )
            .await;
        let listener = l["listener"]["id"].as_str().unwrap().to_string();
        self.lb_active(&id).await;
        let p = self
            .api(
                "POST",
                "/load-balancer/v2/lbaas/pools",
                serde_json::json!({"pool": {"name": format!("pool_0_{name}"), "listener_id": listener,
                    "protocol": "TCP", "lb_algorithm": "ROUND_ROBIN", "tags": tags}}),
            )
            .await;
        let pool = p["pool"]["id"].as_str().unwrap().to_string();
        self.lb_active(&id).await;
        self.api(
            "POST",
            &format!("/load-balancer/v2/lbaas/pools/{pool}/members"),
            serde_json::json!({"member": {"name": "node-0", "address": self.instances[0].ip,
                "protocol_port": 30443, "subnet_id": subnet}}),
        )
        .await;
        self.lb_active(&id).await;
        let f = self
            .api(
                "POST",
                "/network/v2.0/floatingips",
                serde_json::json!({"floatingip": {"floating_network_id": public, "port_id": port,
                    "description": fip_description}}),
            )
            .await;
        let fip = f["floatingip"]["floating_ip_address"].as_str().unwrap().to_string();
        (id, port, fip)
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

super::scenarios!(OpenStack);
super::metrics::scenario!(OpenStack);
