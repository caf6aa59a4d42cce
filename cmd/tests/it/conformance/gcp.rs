//! The conformance harness for GCP: the in-process Compute Engine emulator
//! (`ccm_emulators::gcp`) with instances named like their Nodes in two zones of one region,
//! the cluster network `k8s-net` and the node tag `k8s-node`. The manager gets its token from
//! the emulator's `token-url` (upstream's `AltTokenSource`) and everything else from
//! `gce.conf`, so it needs no metadata server. The emulator has the kit's admin API itself:
//! no fault proxy. Instances are named by their Compute names (routes and target pools refer
//! to instances by name).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_emulators::Admin;
use ccm_emulators::gcp::{GcpCloud, GcpOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::{PowerState, World};
use serde_json::Value;

use k8s_openapi::api::core::v1::Service;
use serde_json::json;

use super::{Attack, Foreign, Harness, Instance, LbView};
use crate::support::{Binary, SecretKind, register_secret};

const PROJECT: &str = "conformance-project";
const ZONES: [&str; 2] = ["us-central1-a", "us-central1-b"];

pub struct Gcp {
    cloud: Arc<GcpCloud>,
    server: Server,
    instances: Vec<Instance>,
}

impl Drop for Gcp {
    fn drop(&mut self) {
        // Every token the manager was given is a credential its log must not show.
        for t in self.cloud.tokens() {
            register_secret(SecretKind::GoogleToken, &t);
        }
    }
}

impl Harness for Gcp {
    const PROVIDER: &'static str = "gcp";
    const BINARY: Binary = Binary {
        path: env!("CARGO_BIN_EXE_cloud-controller-manager-gcp"),
        provider: "gce",
        clear_prefixes: &["GCE_", "GOOGLE_"],
        env: &[],
    };
    const LOAD_BALANCERS: bool = true;
    const ROUTES: bool = true;
    const INSTANCE_LOOKUPS: &'static [&'static str] = &["compute.instances.*"];

    async fn start(count: usize) -> Self {
        let mut world = String::from(
            "region: us-central1\nzones: [us-central1-a, us-central1-b]\n\
             networks:\n  - { name: k8s-net, cidr: 10.0.0.0/8 }\n\
             subnets:\n\
             \x20 - { name: subnet-a, network: k8s-net, zone: us-central1-a, cidr: 10.0.0.0/16 }\n\
             \x20 - { name: subnet-b, network: k8s-net, zone: us-central1-b, cidr: 10.1.0.0/16 }\n\
             instances:\n",
        );
        let mut instances = Vec::new();
        for i in 0..count {
            let zone = ZONES[i % 2];
            let subnet = if i % 2 == 0 { "subnet-a" } else { "subnet-b" };
            let node = format!("node-{i}");
            let ip = format!("10.{}.{}.{}", i % 2, i / 200, 10 + i % 200);
            world.push_str(&format!(
                "  - {{ name: {node}, zone: {zone}, subnet: {subnet}, type: n2-standard-2, \
                 private_ips: [{ip}], tags: {{ gce.tags: k8s-node }} }}\n"
            ));
            instances.push(Instance {
                addresses: vec![
                    ("InternalIP".into(), ip.clone()),
                    // The kubelet's Hostname, kept by the cloud-node controller.
                    ("Hostname".into(), node.clone()),
                ],
                provider_id: format!("gce://{PROJECT}/{zone}/{node}"),
                id: node.clone(),
                node,
                ip,
                zone: zone.into(),
                region: "us-central1".into(),
                instance_type_prefix: "n2-standard-2".into(),
            });
        }
        let cloud = GcpCloud::new(
            World::parse(&world).unwrap(),
            GcpOptions {
                project: PROJECT.into(),
                pending: Duration::from_millis(300),
                ..GcpOptions::default()
            },
        );
        let server = Server::start(cloud.clone(), ServerOptions::default()).await.unwrap();
        Gcp { cloud, server, instances }
    }

    fn instances(&self) -> &[Instance] {
        &self.instances
    }

    fn cloud_config(&self) -> String {
        let url = self.server.url();
        format!(
            "[global]\nproject-id = {PROJECT}\nlocal-zone = us-central1-a\nmultizone = true\n\
             network-name = k8s-net\nnode-tags = k8s-node\napi-endpoint = {url}/compute/v1/\n\
             token-url = {url}/token\ntoken-body = {{\"cluster\":\"conformance\"}}\n"
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
        assert!(self.cloud.delete_instance(&self.instances[i].node));
    }

    /// The external load balancer `name` (upstream's `a<uid>`): its forwarding rule's target
    /// pool's instances, and the ports its `k8s-fw-<name>` firewall opens (the forwarding
    /// rule's port range spans them). `None` until the forwarding rule exists.
    async fn load_balancer(&self, name: &str) -> Option<LbView> {
        let rule =
            self.cloud.resources("forwardingRules").into_iter().find(|r| r["name"] == name)?;
        let pool = self.cloud.resources("targetPools").into_iter().find(|p| p["name"] == name)?;
        let fw_name = format!("k8s-fw-{name}");
        let fw = self.cloud.resources("firewalls").into_iter().find(|f| f["name"] == fw_name)?;
        let mut ports: Vec<i32> = fw["allowed"]
            .as_array()
            .into_iter()
            .flatten()
            .flat_map(|a| a["ports"].as_array().cloned().unwrap_or_default())
            .filter_map(|p| p.as_str().map(str::to_string))
            .flat_map(|p| {
                // Consecutive ports are folded into ranges (`80-81`).
                let (lo, hi) = p.split_once('-').unwrap_or((&p, &p));
                let (lo, hi): (i32, i32) = (lo.parse().unwrap_or(0), hi.parse().unwrap_or(-1));
                (lo..=hi).collect::<Vec<_>>()
            })
            .collect();
        ports.sort();
        let range = str_of(&rule, "portRange");
        let (lo, hi) = range.split_once('-').unwrap_or((range, range));
        let (lo, hi): (i32, i32) = (lo.parse().ok()?, hi.parse().ok()?);
        if ports.iter().any(|p| *p < lo || *p > hi) {
            return None;
        }
        let mut instances: Vec<String> = pool["instances"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(Value::as_str)
            .map(|l| l.rsplit('/').next().unwrap_or(l).to_string())
            .collect();
        instances.sort();
        Some(LbView { ports, instances })
    }

    async fn load_balancer_resources(&self) -> Vec<String> {
        let mut left = Vec::new();
        for coll in [
            "forwardingRules",
            "targetPools",
            "addresses",
            "httpHealthChecks",
            "healthChecks",
            "backendServices",
            "instanceGroups",
        ] {
            for o in self.cloud.resources(coll) {
                left.push(format!("{coll} {}", str_of(&o, "name")));
            }
        }
        for fw in self.cloud.resources("firewalls") {
            if str_of(&fw, "name").starts_with("k8s-") {
                left.push(format!("firewall {}", str_of(&fw, "name")));
            }
        }
        left
    }

    /// Another cluster's load balancer (its reserved address, target pool and forwarding
    /// rule, named and described as upstream's CCM of another cluster makes them) and a
    /// hand-reserved static address (unattached: a Service naming it may use it, never
    /// change or delete it).
    async fn plant_foreign(&self) -> Foreign {
        let other = "a0f1e2d3c4b5a69788796a5b4c3d2e1f";
        let desc = r#"{"kubernetes.io/service-name":"tenant-a/victim"}"#;
        self.insert("addresses", json!({"name": other, "description": desc})).await;
        let other_ip = self.address_of(other);
        let node0 =
            self.cloud.link(&format!("zones/{}", ZONES[0]), "instances", &self.instances[0].node);
        self.insert(
            "targetPools",
            json!({"name": other, "description": desc, "instances": [node0]}),
        )
        .await;
        let pool = self.cloud.link("regions/us-central1", "targetPools", other);
        self.insert(
            "forwardingRules",
            json!({"name": other, "description": desc, "IPAddress": other_ip,
                "IPProtocol": "TCP", "portRange": "443-443", "target": pool}),
        )
        .await;
        self.insert(
            "addresses",
            json!({"name": "shop-frontend-ip", "description": "made by hand"}),
        )
        .await;
        let hand_ip = self.address_of("shop-frontend-ip");
        let ids = [("other_ip", other_ip.clone()), ("hand_ip", hand_ip.clone())];
        Foreign {
            // The hand-reserved address is unattached: a Service naming it may use it.
            addresses: vec![other_ip],
            ids: ids.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }

    async fn attacks(&self, victim: &Service, _victim_lb: &str, f: &Foreign) -> Vec<Attack> {
        let v_ip = super::status_addresses(victim).first().cloned().unwrap_or_default();
        let internal = |what: &str, ip: &str| {
            let mut a = Attack::annotations(what, &[(LB_TYPE, "Internal"), (SUBNET, "subnet-b")]);
            a.load_balancer_ip = Some(ip.to_string());
            a
        };
        vec![
            Attack::load_balancer_ip("loadBalancerIP: the victim's address", &v_ip),
            Attack::load_balancer_ip("loadBalancerIP: another cluster's address", f.id("other_ip")),
            Attack::load_balancer_ip("loadBalancerIP: a hand-reserved address", f.id("hand_ip")),
            internal("internal, subnet annotation, the victim's address", &v_ip),
            internal("internal, subnet annotation, a hand-reserved address", f.id("hand_ip")),
        ]
    }

    /// Every forwarding rule, target pool, address, health check, backend service, instance
    /// group and firewall, whole, as the API shows it.
    async fn lb_snapshot(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        for coll in [
            "forwardingRules",
            "targetPools",
            "addresses",
            "httpHealthChecks",
            "healthChecks",
            "backendServices",
            "instanceGroups",
            "firewalls",
        ] {
            for o in self.cloud.resources(coll) {
                let key = o["selfLink"].as_str().unwrap_or(str_of(&o, "name")).to_string();
                out.insert(format!("{coll} {key}"), o.to_string());
            }
        }
        out
    }

    async fn routes(&self) -> Vec<(String, String)> {
        self.cloud
            .resources("routes")
            .iter()
            .filter(|r| str_of(r, "description") == "k8s-node-route")
            .map(|r| {
                let hop = str_of(r, "nextHopInstance");
                let name = hop.rsplit('/').next().unwrap_or(hop).to_string();
                (str_of(r, "destRange").to_string(), name)
            })
            .collect()
    }
}

/// The annotations of upstream's GCE CCM that name existing resources.
const LB_TYPE: &str = "networking.gke.io/load-balancer-type";
const SUBNET: &str = "networking.gke.io/internal-load-balancer-subnet";

impl Gcp {
    /// Inserts a regional resource through the emulator's API (as another cluster's manager
    /// or a person would) and waits until it exists.
    async fn insert(&self, coll: &str, body: Value) {
        let token = self.cloud.issue_token();
        register_secret(SecretKind::GoogleToken, &token);
        let bearer = format!("Bearer {token}");
        let path = format!("/compute/v1/projects/{PROJECT}/regions/us-central1/{coll}");
        let r = self
            .server
            .admin()
            .cloud_call(
                "POST",
                &path,
                &[("content-type", "application/json"), ("authorization", bearer.as_str())],
                Some(body.to_string()),
            )
            .await
            .unwrap();
        assert!(r.status < 300, "{path}: HTTP {}: {}", r.status, r.body);
        let name = body["name"].as_str().unwrap_or_default();
        for _ in 0..100 {
            if self.cloud.resources(coll).iter().any(|o| o["name"] == name) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("{coll} {name} never appeared");
    }

    fn address_of(&self, name: &str) -> String {
        let a = self.cloud.resources("addresses").into_iter().find(|a| a["name"] == name);
        a.map(|a| str_of(&a, "address").to_string()).unwrap_or_default()
    }
}

fn str_of<'a>(v: &'a Value, key: &str) -> &'a str {
    v[key].as_str().unwrap_or_default()
}

super::scenarios!(Gcp);
super::metrics::scenario!(Gcp);
