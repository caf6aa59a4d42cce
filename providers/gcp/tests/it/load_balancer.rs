//! LoadBalancer against the emulator: the resources upstream would create (names, shapes),
//! a second sync that changes nothing, node changes touching membership only, port and
//! traffic-policy changes, deletion leaving nothing, the user's reserved IP kept, bad
//! annotations refused before any Compute call, Services of other controllers left alone.

use std::collections::BTreeMap;
use std::sync::Arc;

use ccm_core::cloud::{LoadBalancer, ProviderError};
use ccm_emulators::admin::Counters;
use ccm_provider_gcp::client::GceClient;
use ccm_provider_gcp::config::Global;
use ccm_provider_gcp::load_balancer::{GceLoadBalancer, Timings};
use google_cloud_compute_v1::model::Address;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;
use serde_json::Value;

use crate::fixture::{self, Fixture, PROJECT, REGION, ZONE_A, ZONE_B};

const CLUSTER_ID: &str = "c0ffee1234567890";
const UID: &str = "6f7f1b2c-1234-5678-9abc-def012345678";
const LB: &str = "a6f7f1b2c123456789abcdef01234567";
const UID2: &str = "0a0b0c0d-1111-2222-3333-444455556666";

struct T {
    f: Fixture,
    lb: GceLoadBalancer,
}

/// The emulator, and load balancers with `node-tags = k8s-node` and `subnetwork-name =
/// subnet-a` on top of the fixture's config.
async fn setup() -> T {
    setup_with(|g| {
        g.node_tags = vec!["k8s-node".into()];
        g.subnetwork_name = Some("subnet-a".into());
    })
    .await
}

async fn setup_with(tweak: impl FnOnce(&mut Global)) -> T {
    let f = fixture::start().await;
    let mut g = fixture::global();
    tweak(&mut g);
    let client = Arc::new(GceClient::new(&g, f.options.clone()).unwrap());
    let lb = GceLoadBalancer::new(client, crate::fixture::timings());
    lb.set_cluster_id(CLUSTER_ID);
    T { f, lb }
}

fn svc(uid: &str, name: &str, ports: &[i32], annotations: &[(&str, &str)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            annotations: Some(
                annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|p| ServicePort {
                        port: *p,
                        node_port: Some(30000 + *p % 1000),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

fn web(annotations: &[(&str, &str)]) -> Service {
    svc(UID, "web", &[80], annotations)
}

fn internal() -> Service {
    web(&[("networking.gke.io/load-balancer-type", "Internal")])
}

fn local(mut s: Service, hc_port: i32) -> Service {
    let spec = s.spec.as_mut().unwrap();
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(hc_port);
    s
}

fn node(name: &str, zone: &str) -> Node {
    fixture::node(name, Some(&fixture::provider_id(zone, name)))
}

fn nodes_ab() -> Vec<Node> {
    vec![node("node-a", ZONE_A), node("node-b", ZONE_B)]
}

fn ip(s: &LoadBalancerStatus) -> String {
    s.ingress.as_ref().unwrap()[0].ip.clone().unwrap()
}

/// The calls that change something, per operation.
fn mutations(c: &Counters) -> BTreeMap<String, u64> {
    const VERBS: [&str; 9] = [
        ".insert",
        ".delete",
        ".patch",
        ".update",
        ".addInstance",
        ".removeInstance",
        ".addInstances",
        ".removeInstances",
        ".setTarget",
    ];
    c.operations
        .iter()
        .filter(|(op, n)| {
            op.starts_with("compute.") && **n > 0 && VERBS.iter().any(|v| op.ends_with(v))
        })
        .map(|(op, n)| (op.clone(), *n))
        .collect()
}

/// What happened between two snapshots.
fn diff(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(op, n)| {
            let d = n - before.get(op).copied().unwrap_or(0);
            (d > 0).then(|| (op.clone(), d))
        })
        .collect()
}

fn ops(list: &[(&str, u64)]) -> BTreeMap<String, u64> {
    list.iter().map(|(k, v)| (k.to_string(), *v)).collect()
}

impl T {
    fn muts(&self) -> BTreeMap<String, u64> {
        mutations(&self.f.server.counters())
    }

    fn names(&self, coll: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .f
            .cloud
            .resources(coll)
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect();
        v.sort();
        v
    }

    fn one(&self, coll: &str, name: &str) -> Value {
        self.f
            .cloud
            .resources(coll)
            .into_iter()
            .find(|r| r["name"] == name)
            .unwrap_or_else(|| panic!("no {coll} {name}: {:?}", self.names(coll)))
    }

    /// The instances of an instance group, as Compute lists them.
    async fn members(&self, zone: &str, group: &str) -> Vec<String> {
        let c = self.f.client.compute().await.unwrap();
        let page = self
            .f
            .client
            .call("compute.instanceGroups.listInstances", || {
                c.instance_groups
                    .list_instances()
                    .set_project(PROJECT)
                    .set_zone(zone)
                    .set_instance_group(group)
                    .send()
            })
            .await
            .unwrap();
        let mut v: Vec<String> = page
            .items
            .iter()
            .filter_map(|i| i.instance.as_deref())
            .map(|l| last(l).to_string())
            .collect();
        v.sort();
        v
    }

    fn k8s_firewalls(&self) -> Vec<String> {
        self.names("firewalls")
            .into_iter()
            .filter(|n| n.starts_with("k8s-") || n.starts_with('a'))
            .collect()
    }

    async fn ensure(
        &self,
        s: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        self.lb.ensure_load_balancer("kubernetes", s, nodes).await
    }

    async fn update(&self, s: &Service, nodes: &[Node]) -> Result<(), ProviderError> {
        self.lb.update_load_balancer("kubernetes", s, nodes).await
    }

    async fn delete(&self, s: &Service) -> Result<(), ProviderError> {
        self.lb.ensure_load_balancer_deleted("kubernetes", s).await
    }

    /// Nothing of any load balancer is left.
    fn assert_empty(&self) {
        for coll in [
            "forwardingRules",
            "targetPools",
            "httpHealthChecks",
            "healthChecks",
            "backendServices",
            "addresses",
            "instanceGroups",
        ] {
            assert_eq!(self.names(coll), Vec::<String>::new(), "{coll} left");
        }
        assert_eq!(self.k8s_firewalls(), Vec::<String>::new(), "firewalls left");
    }
}

fn strs(v: &Value) -> Vec<String> {
    let mut out: Vec<String> =
        v.as_array().into_iter().flatten().filter_map(|x| x.as_str().map(str::to_string)).collect();
    out.sort();
    out
}

fn last(link: &str) -> &str {
    link.rsplit('/').next().unwrap()
}

fn link(path: &str) -> String {
    format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/{path}")
}

#[tokio::test]
async fn external_is_built_as_upstream_names_it_and_a_second_sync_changes_nothing() {
    let t = setup().await;
    let s = web(&[]);
    let status = t.ensure(&s, &nodes_ab()).await.unwrap();
    let addr = ip(&status);

    let fr = t.one("forwardingRules", LB);
    assert_eq!(fr["IPAddress"], addr.as_str());
    assert_eq!(fr["portRange"], "80-80");
    assert_eq!(fr["IPProtocol"], "TCP");
    assert_eq!(fr["networkTier"], "PREMIUM");
    assert_eq!(fr["target"], link(&format!("regions/{REGION}/targetPools/{LB}")));
    assert_eq!(fr["description"], r#"{"kubernetes.io/service-name":"default/web"}"#);

    let tp = t.one("targetPools", LB);
    assert_eq!(
        strs(&tp["instances"]),
        vec![
            link(&format!("zones/{ZONE_A}/instances/node-a")),
            link(&format!("zones/{ZONE_B}/instances/node-b"))
        ]
    );
    assert_eq!(tp["sessionAffinity"], "NONE");
    let nodes_hc = format!("k8s-{CLUSTER_ID}-node");
    assert_eq!(
        strs(&tp["healthChecks"]).iter().map(|h| last(h)).collect::<Vec<_>>(),
        vec![nodes_hc.as_str()]
    );

    assert_eq!(t.names("httpHealthChecks"), vec![nodes_hc.clone()]);
    let hc = t.one("httpHealthChecks", &nodes_hc);
    assert_eq!((hc["port"].as_i64(), hc["requestPath"].as_str()), (Some(10256), Some("/healthz")));
    assert_eq!((hc["checkIntervalSec"].as_i64(), hc["timeoutSec"].as_i64()), (Some(8), Some(1)));
    assert_eq!(
        (hc["healthyThreshold"].as_i64(), hc["unhealthyThreshold"].as_i64()),
        (Some(1), Some(3))
    );

    let hc_fw = format!("k8s-{CLUSTER_ID}-node-http-hc");
    let fw_name = format!("k8s-fw-{LB}");
    assert_eq!(t.k8s_firewalls(), {
        let mut v = vec![fw_name.clone(), hc_fw.clone()];
        v.sort();
        v
    });
    let fw = t.one("firewalls", &fw_name);
    assert_eq!(strs(&fw["sourceRanges"]), vec!["0.0.0.0/0"]);
    assert_eq!(strs(&fw["targetTags"]), vec!["k8s-node"]);
    assert_eq!(strs(&fw["destinationRanges"]), vec![addr.clone()]);
    assert_eq!(fw["allowed"][0]["IPProtocol"], "tcp");
    assert_eq!(strs(&fw["allowed"][0]["ports"]), vec!["80"]);
    assert_eq!(
        fw["description"],
        format!(
            r#"{{"kubernetes.io/service-name":"default/web", "kubernetes.io/service-ip":"{addr}"}}"#
        )
    );
    let fw = t.one("firewalls", &hc_fw);
    assert_eq!(
        strs(&fw["sourceRanges"]),
        vec!["130.211.0.0/22", "209.85.152.0/22", "209.85.204.0/22", "35.191.0.0/16"]
    );
    assert_eq!(strs(&fw["allowed"][0]["ports"]), vec!["10256"]);
    assert_eq!(fw["description"], format!(r#"{{"kubernetes.io/cluster-id":"{CLUSTER_ID}"}}"#));

    // The static IP was held while the rule was created, then released to the rule.
    let m = t.muts();
    assert_eq!((m["compute.addresses.insert"], m["compute.addresses.delete"]), (1, 1));
    assert_eq!(t.names("addresses"), Vec::<String>::new());

    // Nothing changed: no mutation, same address.
    let before = t.muts();
    assert_eq!(ip(&t.ensure(&s, &nodes_ab()).await.unwrap()), addr);
    assert_eq!(diff(&before, &t.muts()), BTreeMap::new());
    assert_eq!(ip(&t.lb.get_load_balancer("kubernetes", &s).await.unwrap().unwrap()), addr);
}

#[tokio::test]
async fn external_node_changes_only_touch_the_target_pool() {
    let t = setup().await;
    let s = web(&[]);
    t.ensure(&s, &nodes_ab()).await.unwrap();
    let members = || {
        strs(&t.one("targetPools", LB)["instances"])
            .iter()
            .map(|l| last(l).to_string())
            .collect::<Vec<_>>()
    };

    let before = t.muts();
    t.update(&s, &[node("node-a", ZONE_A)]).await.unwrap();
    assert_eq!(diff(&before, &t.muts()), ops(&[("compute.targetPools.removeInstance", 1)]));
    assert_eq!(members(), vec!["node-a"]);

    let before = t.muts();
    t.update(&s, &[node("node-a", ZONE_A), node("node-b", ZONE_B), node("node-c", ZONE_B)])
        .await
        .unwrap();
    assert_eq!(diff(&before, &t.muts()), ops(&[("compute.targetPools.addInstance", 1)]));
    assert_eq!(members(), vec!["node-a", "node-b", "node-c"]);

    // A full sync with one node fewer: one removal, nothing else.
    let before = t.muts();
    t.ensure(&s, &nodes_ab()).await.unwrap();
    assert_eq!(diff(&before, &t.muts()), ops(&[("compute.targetPools.removeInstance", 1)]));

    // A node whose instance is gone is left out; none found at all is an error, never an
    // emptied pool.
    let before = t.muts();
    t.update(&s, &[node("node-a", ZONE_A), node("node-b", ZONE_B), node("ghost", ZONE_B)])
        .await
        .unwrap();
    assert_eq!(diff(&before, &t.muts()), BTreeMap::new());
    let e = t.update(&s, &[node("ghost", ZONE_B)]).await.unwrap_err();
    assert!(e.to_string().contains("none of the instances"), "{e}");
    assert_eq!(members(), vec!["node-a", "node-b"]);
}

#[tokio::test]
async fn external_port_change_recreates_the_forwarding_rule_on_the_same_ip() {
    let t = setup().await;
    let addr = ip(&t.ensure(&web(&[]), &nodes_ab()).await.unwrap());
    let before = t.muts();
    let s = svc(UID, "web", &[80, 443], &[]);
    assert_eq!(ip(&t.ensure(&s, &nodes_ab()).await.unwrap()), addr);
    assert_eq!(
        diff(&before, &t.muts()),
        ops(&[
            ("compute.addresses.insert", 1),
            ("compute.addresses.delete", 1),
            ("compute.firewalls.patch", 1),
            ("compute.forwardingRules.delete", 1),
            ("compute.forwardingRules.insert", 1),
        ])
    );
    assert_eq!(t.one("forwardingRules", LB)["portRange"], "80-443");
    assert_eq!(
        strs(&t.one("firewalls", &format!("k8s-fw-{LB}"))["allowed"][0]["ports"]),
        vec!["443", "80"]
    );
    assert_eq!(t.names("addresses"), Vec::<String>::new());
}

#[tokio::test]
async fn local_traffic_gets_its_own_health_check_and_cluster_shares_one() {
    let t = setup().await;
    let nodes_hc = format!("k8s-{CLUSTER_ID}-node");
    let s = local(web(&[]), 31500);
    t.ensure(&s, &nodes_ab()).await.unwrap();
    assert_eq!(t.names("httpHealthChecks"), vec![LB.to_string()]);
    let hc = t.one("httpHealthChecks", LB);
    assert_eq!((hc["port"].as_i64(), hc["requestPath"].as_str()), (Some(31500), Some("/healthz")));
    assert_eq!(hc["description"], format!(r#"{{"kubernetes.io/service-name":"{LB}"}}"#));
    let own_fw = format!("k8s-{LB}-http-hc");
    assert_eq!(strs(&t.one("firewalls", &own_fw)["allowed"][0]["ports"]), vec!["31500"]);
    assert_eq!(
        strs(&t.one("targetPools", LB)["healthChecks"]).iter().map(|h| last(h)).collect::<Vec<_>>(),
        vec![LB]
    );

    // A second Service with Cluster policy uses the shared check.
    let other = svc(UID2, "other", &[8080], &[]);
    t.ensure(&other, &nodes_ab()).await.unwrap();
    assert_eq!(t.names("httpHealthChecks"), {
        let mut v = vec![LB.to_string(), nodes_hc.clone()];
        v.sort();
        v
    });

    // Local → Cluster: the pool is re-created on the shared check, the Service's own check
    // and its firewall go.
    let before = t.muts();
    t.ensure(&web(&[]), &nodes_ab()).await.unwrap();
    let d = diff(&before, &t.muts());
    assert_eq!(d.get("compute.targetPools.delete"), Some(&1));
    assert_eq!(d.get("compute.targetPools.insert"), Some(&1));
    assert_eq!(d.get("compute.httpHealthChecks.delete"), Some(&1));
    assert_eq!(t.names("httpHealthChecks"), vec![nodes_hc.clone()]);
    assert!(!t.k8s_firewalls().contains(&own_fw));
    assert_eq!(
        strs(&t.one("targetPools", LB)["healthChecks"]).iter().map(|h| last(h)).collect::<Vec<_>>(),
        vec![nodes_hc.as_str()]
    );

    // The shared check stays while another pool uses it, and goes with the last one.
    t.delete(&web(&[])).await.unwrap();
    assert_eq!(t.names("httpHealthChecks"), vec![nodes_hc.clone()]);
    assert!(t.k8s_firewalls().contains(&format!("{nodes_hc}-http-hc")));
    t.delete(&other).await.unwrap();
    t.assert_empty();
}

#[tokio::test]
async fn deleting_leaves_nothing_and_twice_is_fine() {
    let t = setup().await;
    let s = web(&[]);
    t.ensure(&s, &nodes_ab()).await.unwrap();
    t.delete(&s).await.unwrap();
    t.assert_empty();
    assert_eq!(t.lb.get_load_balancer("kubernetes", &s).await.unwrap(), None);
    t.delete(&s).await.unwrap();

    let l = local(web(&[]), 31500);
    t.ensure(&l, &nodes_ab()).await.unwrap();
    t.delete(&l).await.unwrap();
    t.assert_empty();
}

#[tokio::test]
async fn a_half_deleted_load_balancer_still_exists_until_it_is_gone() {
    let t = setup().await;
    let s = web(&[]);
    t.ensure(&s, &nodes_ab()).await.unwrap();
    // The forwarding rule went (a delete interrupted after it): the rest still counts.
    let c = t.f.client.compute().await.unwrap();
    t.f.client
        .mutate("compute.forwardingRules.delete", || {
            c.forwarding_rules
                .delete()
                .set_project(PROJECT)
                .set_region(REGION)
                .set_forwarding_rule(LB)
                .send()
        })
        .await
        .unwrap();
    assert_eq!(
        t.lb.get_load_balancer("kubernetes", &s).await.unwrap(),
        Some(LoadBalancerStatus::default())
    );
    t.delete(&s).await.unwrap();
    assert_eq!(t.lb.get_load_balancer("kubernetes", &s).await.unwrap(), None);
    t.assert_empty();
}

#[tokio::test]
async fn the_user_s_reserved_ip_is_used_and_kept() {
    let t = setup().await;
    let c = t.f.client.compute().await.unwrap();
    t.f.client
        .mutate("compute.addresses.insert", || {
            c.addresses
                .insert()
                .set_project(PROJECT)
                .set_region(REGION)
                .set_body(Address::new().set_name("my-ip"))
                .send()
        })
        .await
        .unwrap();
    let mine = t.one("addresses", "my-ip")["address"].as_str().unwrap().to_string();
    let mut s = web(&[]);
    s.spec.as_mut().unwrap().load_balancer_ip = Some(mine.clone());
    assert_eq!(ip(&t.ensure(&s, &nodes_ab()).await.unwrap()), mine);
    assert_eq!(t.one("forwardingRules", LB)["IPAddress"], mine.as_str());
    assert_eq!(t.names("addresses"), vec!["my-ip"]);
    assert_eq!(t.one("addresses", "my-ip")["status"], "IN_USE");
    t.delete(&s).await.unwrap();
    assert_eq!(t.names("addresses"), vec!["my-ip"]);
    assert_eq!(t.one("addresses", "my-ip")["status"], "RESERVED");

    // An IP that is neither reserved nor the rule's: refused, nothing created.
    let before = t.muts();
    s.spec.as_mut().unwrap().load_balancer_ip = Some("35.1.2.3".into());
    let e = t.ensure(&s, &nodes_ab()).await.unwrap_err();
    assert!(
        matches!(&e, ProviderError::Invalid { what, .. } if what == "spec.loadBalancerIP"),
        "{e}"
    );
    assert_eq!(diff(&before, &t.muts()), BTreeMap::new());
}

/// Issue #29 (LOW): an internal address the user reserved, named by `spec.loadBalancerIP`, is
/// used by the internal forwarding rule and never deleted, also when the Service goes.
#[tokio::test]
async fn the_user_s_reserved_internal_ip_is_used_and_kept() {
    let t = setup().await;
    let c = t.f.client.compute().await.unwrap();
    let mut a = Address::new().set_name("my-ilb-ip");
    a.address_type = Some("INTERNAL".into());
    a.subnetwork = Some(link(&format!("regions/{REGION}/subnetworks/subnet-a")));
    t.f.client
        .mutate("compute.addresses.insert", || {
            c.addresses.insert().set_project(PROJECT).set_region(REGION).set_body(a.clone()).send()
        })
        .await
        .unwrap();
    let mine = t.one("addresses", "my-ilb-ip")["address"].as_str().unwrap().to_string();
    let mut s = internal();
    s.spec.as_mut().unwrap().load_balancer_ip = Some(mine.clone());
    assert_eq!(ip(&t.ensure(&s, &nodes_ab()).await.unwrap()), mine);
    assert_eq!(t.one("forwardingRules", LB)["IPAddress"], mine.as_str());
    assert!(t.names("addresses").contains(&"my-ilb-ip".to_string()));
    t.delete(&s).await.unwrap();
    assert_eq!(t.names("addresses"), vec!["my-ilb-ip"]);
    assert_eq!(t.one("addresses", "my-ilb-ip")["address"], mine.as_str());
}

/// Issue #29 (LOW): an address that merely has the load balancer's name (reserved by someone,
/// not for a Service: no `kubernetes.io/service-name` description) is never deleted, neither
/// by the Service's deletion nor by `orphans`.
#[tokio::test]
async fn an_address_with_the_load_balancer_s_name_but_no_service_proof_is_never_deleted() {
    let t = setup().await;
    let c = t.f.client.compute().await.unwrap();
    t.f.client
        .mutate("compute.addresses.insert", || {
            c.addresses
                .insert()
                .set_project(PROJECT)
                .set_region(REGION)
                .set_body(Address::new().set_name(LB).set_description("reserved by hand"))
                .send()
        })
        .await
        .unwrap();
    let before = t.muts();
    t.delete(&web(&[])).await.unwrap();
    assert_eq!(t.names("addresses"), vec![LB]);
    assert_eq!(diff(&before, &t.muts()).get("compute.addresses.delete"), None);
}

#[tokio::test]
async fn bad_annotations_are_refused_before_any_compute_call() {
    let t = setup().await;
    for (key, value) in [
        ("cloud.google.com/network-tier", "Gold"),
        ("networking.gke.io/load-balancer-type", "INTERNAL"),
        ("networking.gke.io/internal-load-balancer-allow-global-access", "yes"),
        ("networking.gke.io/internal-load-balancer-subnet", "Bad_Subnet"),
        ("service.beta.kubernetes.io/load-balancer-source-ranges", "10.0.0.0/40"),
    ] {
        let e = t.ensure(&web(&[(key, value)]), &nodes_ab()).await.unwrap_err();
        assert!(matches!(e, ProviderError::Invalid { .. }), "{key}: {e}");
        assert!(e.to_string().contains(key), "{key}: {e}");
    }
    assert_eq!(t.f.server.counters().matching("compute.*"), 0);
}

#[tokio::test]
async fn services_of_other_controllers_are_left_alone() {
    let t = setup().await;
    let mut classed = web(&[]);
    classed.spec.as_mut().unwrap().load_balancer_class = Some("example.com/lb".into());
    assert!(matches!(
        t.ensure(&classed, &nodes_ab()).await,
        Err(ProviderError::ImplementedElsewhere)
    ));
    assert!(matches!(
        t.update(&classed, &nodes_ab()).await,
        Err(ProviderError::ImplementedElsewhere)
    ));
    t.delete(&classed).await.unwrap();
    assert_eq!(t.f.server.counters().matching("compute.*"), 0);

    let rbs = web(&[("cloud.google.com/l4-rbs", "enabled")]);
    assert!(matches!(t.ensure(&rbs, &nodes_ab()).await, Err(ProviderError::ImplementedElsewhere)));
    t.delete(&rbs).await.unwrap();
    assert_eq!(t.muts(), BTreeMap::new());

    // Ours already (a target-pool rule exists): annotating it later changes nothing.
    let s = web(&[]);
    t.ensure(&s, &nodes_ab()).await.unwrap();
    let late = web(&[("cloud.google.com/l4-rbs", "enabled")]);
    t.ensure(&late, &nodes_ab()).await.unwrap();
    t.update(&late, &[node("node-a", ZONE_A)]).await.unwrap();
    t.delete(&late).await.unwrap();
    t.assert_empty();
}

#[tokio::test]
async fn without_node_tags_the_instances_tags_must_prefix_their_names() {
    let t = setup_with(|_| {}).await;
    // The world's instances (node-a tagged k8s-node,web) have no tag prefixing their name.
    let e = t.ensure(&web(&[]), &nodes_ab()).await.unwrap_err();
    assert!(e.to_string().contains("node-tags") && e.to_string().contains("node-"), "{e}");
    assert_eq!(t.muts(), BTreeMap::new());

    let mut gke = fixture::instance("gke-pool-1-abcd", ZONE_A, "10.0.0.50");
    gke.tags.insert("gce.tags".into(), "gke-pool-1,gke-pool".into());
    t.f.cloud.add_instance(&gke).unwrap();
    t.ensure(&web(&[]), &[node("gke-pool-1-abcd", ZONE_A)]).await.unwrap();
    assert_eq!(
        strs(&t.one("firewalls", &format!("k8s-fw-{LB}"))["targetTags"]),
        vec!["gke-pool-1"]
    );
}

#[tokio::test]
async fn standard_tier_is_set_on_address_and_rule_and_a_tier_change_rebuilds_the_rule() {
    let t = setup().await;
    let before = t.ensure(&web(&[]), &nodes_ab()).await.unwrap();
    let s = web(&[("cloud.google.com/network-tier", "Standard")]);
    let after = t.ensure(&s, &nodes_ab()).await.unwrap();
    assert_eq!(t.one("forwardingRules", LB)["networkTier"], "STANDARD");
    // A new tier is a new address (Compute's addresses have one tier).
    assert_ne!(ip(&before), ip(&after));
    let before = t.muts();
    t.ensure(&s, &nodes_ab()).await.unwrap();
    assert_eq!(diff(&before, &t.muts()), BTreeMap::new());
}

#[tokio::test]
async fn internal_is_built_as_upstream_names_it_and_a_second_sync_changes_nothing() {
    let t = setup().await;
    let s = internal();
    let addr = ip(&t.ensure(&s, &nodes_ab()).await.unwrap());
    assert!(addr.starts_with("10."), "{addr}");

    let ig = format!("k8s-ig--{CLUSTER_ID}");
    let groups: Vec<Value> = t.f.cloud.resources("instanceGroups");
    assert_eq!(groups.len(), 2);
    for (zone, member) in [(ZONE_A, "node-a"), (ZONE_B, "node-b")] {
        assert_eq!(t.members(zone, &ig).await, vec![member.to_string()], "{zone}");
    }
    let nodes_hc = format!("k8s-{CLUSTER_ID}-node");
    assert_eq!(t.names("healthChecks"), vec![nodes_hc.clone()]);
    let hc = t.one("healthChecks", &nodes_hc);
    assert_eq!(hc["type"], "HTTP");
    assert_eq!(
        (hc["httpHealthCheck"]["port"].as_i64(), hc["httpHealthCheck"]["requestPath"].as_str()),
        (Some(10256), Some("/healthz"))
    );

    let bs = t.one("backendServices", LB);
    assert_eq!(bs["loadBalancingScheme"], "INTERNAL");
    assert_eq!(bs["protocol"], "TCP");
    assert_eq!(bs["description"], r#"{"kubernetes.io/service-name":"default/web"}"#);
    let mut backends: Vec<String> = bs["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["group"].as_str().unwrap().to_string())
        .collect();
    backends.sort();
    assert_eq!(
        backends,
        vec![
            link(&format!("zones/{ZONE_A}/instanceGroups/{ig}")),
            link(&format!("zones/{ZONE_B}/instanceGroups/{ig}"))
        ]
    );
    assert_eq!(
        strs(&bs["healthChecks"]).iter().map(|h| last(h)).collect::<Vec<_>>(),
        vec![nodes_hc.as_str()]
    );

    let fr = t.one("forwardingRules", LB);
    assert_eq!(fr["loadBalancingScheme"], "INTERNAL");
    assert_eq!(fr["IPAddress"], addr.as_str());
    assert_eq!(strs(&fr["ports"]), vec!["80"]);
    assert_eq!(fr["subnetwork"], link(&format!("regions/{REGION}/subnetworks/subnet-a")));
    assert_eq!(fr["network"], link("global/networks/k8s-net"));
    assert_eq!(fr["backendService"], link(&format!("regions/{REGION}/backendServices/{LB}")));
    assert!(fr["allowGlobalAccess"].is_null() || fr["allowGlobalAccess"] == false);

    let fw_name = format!("k8s-fw-{LB}");
    let hc_fw = format!("k8s-{CLUSTER_ID}-node-hc");
    assert_eq!(t.k8s_firewalls(), {
        let mut v = vec![fw_name.clone(), hc_fw.clone()];
        v.sort();
        v
    });
    let fw = t.one("firewalls", &fw_name);
    assert_eq!(strs(&fw["destinationRanges"]), vec![addr.clone()]);
    assert_eq!(strs(&fw["targetTags"]), vec!["k8s-node"]);
    let fw = t.one("firewalls", &hc_fw);
    assert_eq!(strs(&fw["allowed"][0]["ports"]), vec!["10256"]);
    assert_eq!(fw["description"], "");
    assert_eq!(
        t.names("addresses"),
        Vec::<String>::new(),
        "the internal address is released to the rule"
    );

    let before = t.muts();
    assert_eq!(ip(&t.ensure(&s, &nodes_ab()).await.unwrap()), addr);
    assert_eq!(diff(&before, &t.muts()), BTreeMap::new());

    // Global access: the rule is re-created, on the same IP.
    let g = web(&[
        ("networking.gke.io/load-balancer-type", "Internal"),
        ("networking.gke.io/internal-load-balancer-allow-global-access", "true"),
    ]);
    assert_eq!(ip(&t.ensure(&g, &nodes_ab()).await.unwrap()), addr);
    assert_eq!(t.one("forwardingRules", LB)["allowGlobalAccess"], true);
}

#[tokio::test]
async fn internal_node_changes_only_touch_instance_groups_and_backends() {
    let t = setup().await;
    let s = internal();
    t.ensure(&s, &nodes_ab()).await.unwrap();
    let ig = format!("k8s-ig--{CLUSTER_ID}");
    let size = |zone: &str| {
        t.f.cloud.resource("instanceGroups", &format!("zones/{zone}"), &ig).unwrap()["size"]
            .as_i64()
    };
    let backends = || t.one("backendServices", LB)["backends"].as_array().unwrap().len();

    // Zone b loses its nodes: its group leaves the backend service (its members stay, as
    // upstream leaves groups of zones without nodes alone).
    let before = t.muts();
    t.update(&s, &[node("node-a", ZONE_A)]).await.unwrap();
    assert_eq!(diff(&before, &t.muts()), ops(&[("compute.regionBackendServices.update", 1)]));
    assert_eq!(backends(), 1);
    assert_eq!(t.members(ZONE_B, &ig).await, vec!["node-b"]);

    let before = t.muts();
    t.update(&s, &[node("node-a", ZONE_A), node("node-c", ZONE_B)]).await.unwrap();
    assert_eq!(
        diff(&before, &t.muts()),
        ops(&[
            ("compute.instanceGroups.addInstances", 1),
            ("compute.instanceGroups.removeInstances", 1),
            ("compute.regionBackendServices.update", 1),
        ])
    );
    assert_eq!((size(ZONE_A), size(ZONE_B), backends()), (Some(1), Some(1), 2));
    assert_eq!(t.members(ZONE_B, &ig).await, vec!["node-c"]);
}

#[tokio::test]
async fn internal_local_and_deletion_leave_nothing() {
    let t = setup().await;
    let s = local(internal(), 31700);
    t.ensure(&s, &nodes_ab()).await.unwrap();
    assert_eq!(t.names("healthChecks"), vec![LB.to_string()]);
    assert_eq!(t.one("healthChecks", LB)["httpHealthCheck"]["port"], 31700);
    assert!(t.k8s_firewalls().contains(&format!("{LB}-hc")));
    t.delete(&s).await.unwrap();
    t.assert_empty();
    assert_eq!(t.lb.get_load_balancer("kubernetes", &s).await.unwrap(), None);
}

#[tokio::test]
async fn internal_without_a_subnetwork_is_an_error_naming_the_setting() {
    let t = setup_with(|g| g.node_tags = vec!["k8s-node".into()]).await;
    let e = t.ensure(&internal(), &nodes_ab()).await.unwrap_err();
    assert!(e.to_string().contains("subnetwork-name"), "{e}");
    assert_eq!(t.muts(), BTreeMap::new());
    // The annotation names one.
    let s = web(&[
        ("networking.gke.io/load-balancer-type", "Internal"),
        ("networking.gke.io/internal-load-balancer-subnet", "subnet-b"),
    ]);
    t.ensure(&s, &nodes_ab()).await.unwrap();
    assert_eq!(
        t.one("forwardingRules", LB)["subnetwork"],
        link(&format!("regions/{REGION}/subnetworks/subnet-b"))
    );
}

#[tokio::test]
async fn switching_external_to_internal_replaces_the_load_balancer() {
    let t = setup().await;
    t.ensure(&web(&[]), &nodes_ab()).await.unwrap();
    t.ensure(&internal(), &nodes_ab()).await.unwrap();
    assert_eq!(t.names("targetPools"), Vec::<String>::new());
    assert_eq!(t.names("httpHealthChecks"), Vec::<String>::new());
    assert_eq!(t.one("forwardingRules", LB)["loadBalancingScheme"], "INTERNAL");
    assert_eq!(t.names("backendServices"), vec![LB.to_string()]);
    t.delete(&internal()).await.unwrap();
    t.assert_empty();
}

#[tokio::test]
async fn orphans_are_listed_with_their_resources_and_deleted_when_owned() {
    let t = setup().await;
    t.ensure(&web(&[]), &nodes_ab()).await.unwrap();
    let listed = t.lb.list_cloud_load_balancers("kubernetes").await.unwrap();
    assert_eq!(listed.len(), 1);
    let l = &listed[0];
    assert_eq!((l.name.as_str(), l.owned, l.service.as_deref()), (LB, true, Some("default/web")));
    assert!(l.resources.iter().any(|r| r.kind == "target pool" && r.name == LB));
    t.lb.delete_cloud_load_balancer("kubernetes", l).await.unwrap();
    t.assert_empty();
}

/// Issue #29 (LOW): `orphans` owns only a load balancer that carries this cluster's proof (its
/// pool uses the cluster's `k8s-<clusterID>-node` health check, or its backend service the
/// cluster's `k8s-ig--<clusterID>` instance groups); one with only our name shape and a
/// Service description (a Local-policy one, or another cluster's) is listed, never deleted.
#[tokio::test]
async fn orphans_never_delete_a_load_balancer_without_this_cluster_s_proof() {
    let t = setup().await;
    t.ensure(&local(web(&[]), 31000), &nodes_ab()).await.unwrap();
    let listed = t.lb.list_cloud_load_balancers("kubernetes").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!((listed[0].name.as_str(), listed[0].owned), (LB, false));
    let before = t.muts();
    let e = t.lb.delete_cloud_load_balancer("kubernetes", &listed[0]).await.unwrap_err();
    assert!(matches!(e, ProviderError::Invalid { .. }), "{e}");
    assert_eq!(diff(&before, &t.muts()), BTreeMap::new());

    // Another cluster's (another cluster ID): not owned either.
    let mut g = fixture::global();
    g.node_tags = vec!["k8s-node".into()];
    let other = GceLoadBalancer::new(
        Arc::new(GceClient::new(&g, t.f.options.clone()).unwrap()),
        crate::fixture::timings(),
    );
    other.set_cluster_id("0ther0000000000c");
    let s = svc(UID2, "api", &[80], &[]);
    other.ensure_load_balancer("kubernetes", &s, &nodes_ab()).await.unwrap();
    let listed = t.lb.list_cloud_load_balancers("kubernetes").await.unwrap();
    assert!(listed.iter().all(|l| !l.owned), "{listed:?}");
}

/// Issue #29 (HIGH, tenant isolation): `spec.loadBalancerIP` naming an IP another load
/// balancer answers on (another Service's reserved address, in use by its forwarding rule) is
/// an error naming the field, before anything is created; the IP never reaches a status.
#[tokio::test]
async fn an_ip_another_load_balancer_uses_is_refused_before_anything_is_created() {
    let t = setup().await;
    let c = t.f.client.compute().await.unwrap();
    t.f.client
        .mutate("compute.addresses.insert", || {
            c.addresses
                .insert()
                .set_project(PROJECT)
                .set_region(REGION)
                .set_body(Address::new().set_name("victim-ip"))
                .send()
        })
        .await
        .unwrap();
    let theirs = t.one("addresses", "victim-ip")["address"].as_str().unwrap().to_string();
    let mut victim = svc(UID2, "victim", &[80], &[]);
    victim.spec.as_mut().unwrap().load_balancer_ip = Some(theirs.clone());
    assert_eq!(ip(&t.ensure(&victim, &nodes_ab()).await.unwrap()), theirs);
    let victim_rules = t.names("forwardingRules");

    let refused = |e: &ProviderError| matches!(e, ProviderError::Invalid { what, .. } if what == "spec.loadBalancerIP");
    // External, same port: the victim's reserved address (in use by its rule).
    let before = t.muts();
    let mut s = web(&[]);
    s.spec.as_mut().unwrap().load_balancer_ip = Some(theirs.clone());
    let e = t.ensure(&s, &nodes_ab()).await.unwrap_err();
    assert!(refused(&e), "{e}");
    assert_eq!(diff(&before, &t.muts()), BTreeMap::new(), "nothing created");
    // Internal: the victim's external IP as an internal load balancer's IP.
    let mut s = internal();
    s.spec.as_mut().unwrap().load_balancer_ip = Some(theirs.clone());
    let e = t.ensure(&s, &nodes_ab()).await.unwrap_err();
    assert!(refused(&e), "{e}");
    assert_eq!(diff(&before, &t.muts()), BTreeMap::new(), "nothing created");
    assert_eq!(t.names("forwardingRules"), victim_rules);
    assert_eq!(t.one("forwardingRules", victim_rules[0].as_str())["IPAddress"], theirs.as_str());
}

/// Issue #29 (HIGH, tenant isolation): an internal load balancer never takes an IP outside its
/// subnetwork: an unattached EXTERNAL address, or an IP no address holds that Compute refuses
/// to reserve in the subnetwork, is an error naming `spec.loadBalancerIP`; nothing is left.
#[tokio::test]
async fn an_internal_load_balancer_never_takes_an_ip_outside_its_subnetwork() {
    let t = setup().await;
    let c = t.f.client.compute().await.unwrap();
    t.f.client
        .mutate("compute.addresses.insert", || {
            c.addresses
                .insert()
                .set_project(PROJECT)
                .set_region(REGION)
                .set_body(Address::new().set_name("hand-made"))
                .send()
        })
        .await
        .unwrap();
    let hand = t.one("addresses", "hand-made")["address"].as_str().unwrap().to_string();
    let refused = |e: &ProviderError| matches!(e, ProviderError::Invalid { what, .. } if what == "spec.loadBalancerIP");
    let before = t.muts();
    let mut s = internal();
    s.spec.as_mut().unwrap().load_balancer_ip = Some(hand.clone());
    let e = t.ensure(&s, &nodes_ab()).await.unwrap_err();
    assert!(refused(&e), "{e}");
    assert_eq!(diff(&before, &t.muts()), BTreeMap::new(), "nothing created");
    // An IP no address holds, outside subnet-a: Compute refuses the reservation.
    s.spec.as_mut().unwrap().load_balancer_ip = Some("192.0.2.10".into());
    let e = t.ensure(&s, &nodes_ab()).await.unwrap_err();
    assert!(refused(&e), "{e}");
    assert_eq!(t.names("forwardingRules"), Vec::<String>::new());
    assert_eq!(t.names("addresses"), vec!["hand-made"]);
}

/// A Compute operation that ends `DONE` with `error.errors[]` (issue 31's failure profile):
/// a port change deletes the forwarding rule and its re-insert fails. The ensure is an error
/// naming Compute's code, the IP stays reserved under the load balancer's name (nothing the
/// Service holds is lost), and the next sync converges on the same IP, releasing it.
#[tokio::test]
async fn a_failed_operation_is_an_error_keeps_the_ip_and_the_next_sync_converges() {
    let t = setup().await;
    let addr = ip(&t.ensure(&web(&[]), &nodes_ab()).await.unwrap());
    t.f.server
        .admin()
        .fail_operations(
            "*/forwardingRules/*",
            ccm_emulators::asyncop::Action::Create,
            1,
            "QUOTA_EXCEEDED: Quota 'FORWARDING_RULES' exceeded.  Limit: 15.0 in region us-central1.",
        )
        .await
        .unwrap();
    let s = svc(UID, "web", &[80, 443], &[]);
    let e = t.ensure(&s, &nodes_ab()).await.unwrap_err();
    assert!(e.to_string().contains("QUOTA_EXCEEDED"), "{e}");
    assert_eq!(t.names("forwardingRules"), Vec::<String>::new(), "the failed insert made nothing");
    assert_eq!(t.one("addresses", LB)["address"], addr.as_str(), "the IP is still held");
    assert_eq!(t.names("targetPools"), vec![LB.to_string()]);

    assert_eq!(ip(&t.ensure(&s, &nodes_ab()).await.unwrap()), addr);
    assert_eq!(t.one("forwardingRules", LB)["portRange"], "80-443");
    assert_eq!(t.names("addresses"), Vec::<String>::new(), "released once the rule holds it");
}

/// A failed `removeInstance` leaves the target pool as it was (Compute changes nothing); the
/// update is an error, and the next one converges.
#[tokio::test]
async fn a_failed_membership_operation_changes_nothing_and_is_retried() {
    let t = setup().await;
    let s = web(&[]);
    t.ensure(&s, &nodes_ab()).await.unwrap();
    let members = || {
        strs(&t.one("targetPools", LB)["instances"])
            .iter()
            .map(|l| last(l).to_string())
            .collect::<Vec<_>>()
    };
    t.f.server
        .admin()
        .fail_operations("*/targetPools/*", ccm_emulators::asyncop::Action::Update, 1, "boom")
        .await
        .unwrap();
    let e = t.update(&s, &[node("node-a", ZONE_A)]).await.unwrap_err();
    assert!(e.to_string().contains("INTERNAL_ERROR") && e.to_string().contains("boom"), "{e}");
    assert_eq!(members(), vec!["node-a", "node-b"]);
    t.update(&s, &[node("node-a", ZONE_A)]).await.unwrap();
    assert_eq!(members(), vec!["node-a"]);
}

/// Realistic Compute operation times (seconds), scaled: the provider polls through them.
#[tokio::test]
async fn realistic_operation_times_scaled_converge() {
    let t = setup().await;
    t.f.server
        .admin()
        .set_timing(ccm_emulators::asyncop::TimingProfile::Realistic, 0.05)
        .await
        .unwrap();
    let report = t.f.server.admin().timing_report().await.unwrap();
    assert!(report.realistic.is_some_and(|r| r.create_ms >= 10_000), "{report:?}");
    let s = web(&[]);
    let addr = ip(&t.ensure(&s, &nodes_ab()).await.unwrap());
    assert_eq!(t.one("forwardingRules", LB)["IPAddress"], addr.as_str());
    t.lb.ensure_load_balancer_deleted("k", &s).await.unwrap();
    assert_eq!(t.names("forwardingRules"), Vec::<String>::new());
}

/// Issue #35 (a): one Node joining K external load balancers. Each target-pool update used
/// to list every zone's instances again to find the nodes' (K × zones listings); the node
/// sync gives every load balancer the same nodes, and the updates now share one lookup:
/// one listing per zone whatever K, and every pool gets the new instance.
#[tokio::test]
async fn a_node_joining_k_target_pools_lists_each_zone_s_instances_once() {
    use futures::StreamExt;
    const K: usize = 6;
    let t = setup().await;
    let svcs: Vec<Service> = (0..K)
        .map(|i| svc(&format!("{i:08x}-aaaa-4bbb-8ccc-{i:012x}"), &format!("web{i}"), &[80], &[]))
        .collect();
    for s in &svcs {
        t.ensure(s, &nodes_ab()).await.unwrap();
    }
    let three = [node("node-a", ZONE_A), node("node-b", ZONE_B), node("node-c", ZONE_B)];
    let before = t.f.server.counters();
    let results: Vec<Result<(), ProviderError>> = futures::stream::iter(&svcs)
        .map(|s| t.update(s, &three))
        .buffer_unordered(16)
        .collect()
        .await;
    let after = t.f.server.counters();
    for r in results {
        r.unwrap();
    }
    let lists = after.get("compute.instances.list") - before.get("compute.instances.list");
    println!("K = {K}: {lists} compute.instances.list calls");
    // node-c is in the second zone: both zones listed, once. Before: 2 per load balancer.
    assert_eq!(lists, 2, "one listing per zone for {K} target pools");
    let pools = t.f.cloud.resources("targetPools");
    assert_eq!(pools.len(), K);
    for tp in &pools {
        let members: Vec<String> =
            strs(&tp["instances"]).iter().map(|l| last(l).to_string()).collect();
        assert_eq!(members, ["node-a", "node-b", "node-c"], "{}", tp["name"]);
    }
}

#[tokio::test]
async fn an_instances_changed_network_tags_are_read_again_after_the_hosts_ttl() {
    let f = fixture::start().await;
    let mut g = fixture::global();
    g.subnetwork_name = Some("subnet-a".into());
    let client = Arc::new(GceClient::new(&g, f.options.clone()).unwrap());
    let ttl = std::time::Duration::from_millis(300);
    let lb = GceLoadBalancer::new(client, Timings { hosts_ttl: ttl, ..crate::fixture::timings() });
    lb.set_cluster_id(CLUSTER_ID);
    let t = T { f, lb };
    let name = "gke-pool-1-abcd";
    let mut inst = fixture::instance(name, ZONE_A, "10.0.0.50");
    inst.tags.insert("gce.tags".into(), "gke-pool-1".into());
    t.f.cloud.add_instance(&inst).unwrap();
    let nodes = [node(name, ZONE_A)];
    let fw = format!("k8s-fw-{LB}");

    t.ensure(&internal(), &nodes).await.unwrap();
    assert_eq!(strs(&t.one("firewalls", &fw)["targetTags"]), vec!["gke-pool-1"]);

    // The user re-tags the instance (same name, same zone): the next sync past the TTL
    // targets the new tag.
    assert!(t.f.cloud.delete_instance(name));
    inst.tags.insert("gce.tags".into(), "gke-pool,web".into());
    t.f.cloud.add_instance(&inst).unwrap();
    tokio::time::sleep(ttl * 2).await;
    t.ensure(&internal(), &nodes).await.unwrap();
    assert_eq!(strs(&t.one("firewalls", &fw)["targetTags"]), vec!["gke-pool"]);
}

/// Load balancers whose syncs wait at most 100 ms for an operation of the Service's own
/// resources, on an emulator that holds every operation running until the test ends it.
async fn held() -> T {
    let t = setup().await;
    let client = Arc::new(GceClient::new(&held_global(), t.f.options.clone()).unwrap());
    let timings = Timings {
        operation_inline: std::time::Duration::from_millis(100),
        operation_retry: std::time::Duration::from_millis(200),
        ..Timings::default()
    };
    let lb = GceLoadBalancer::new(client, timings);
    lb.set_cluster_id(CLUSTER_ID);
    T { f: t.f, lb }
}

/// A load balancer built before the test holds operations: the nodes' shared health check
/// and its firewall exist (their changes are waited for, under the shared lock), and stay
/// while its target pool uses them. Then every operation is held running.
async fn warm_up(t: &T) -> Service {
    let warm = svc("9f9f9f9f-0000-4000-8000-000000000009", "warm", &[82], &[]);
    let nodes = nodes_ab();
    let (status, _) = until_done(t, || t.ensure(&warm, &nodes)).await;
    status.unwrap();
    t.f.cloud.complete_pending();
    t.f.cloud.set_pending(std::time::Duration::from_secs(600));
    warm
}

/// Deletes the warm-up load balancer (operations short again) and checks nothing is left.
async fn cool_down(t: &T, warm: &Service) {
    t.f.cloud.complete_pending();
    t.f.cloud.set_pending(std::time::Duration::from_millis(50));
    let (deleted, _) = until_done(t, || t.delete(warm)).await;
    deleted.unwrap();
    t.f.cloud.complete_pending();
    t.assert_empty();
}

fn held_global() -> Global {
    let mut g = fixture::global();
    g.node_tags = vec!["k8s-node".into()];
    g.subnetwork_name = Some("subnet-a".into());
    g
}

/// Runs `sync` until it is not a retry, letting Compute finish whatever is running before
/// each next try; the result and how many retries it took.
async fn until_done<R, F, Fut>(t: &T, mut sync: F) -> (Result<R, ProviderError>, usize)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<R, ProviderError>>,
{
    for retries in 0..20 {
        match sync().await {
            Err(ProviderError::RetryAfter { .. }) => t.f.cloud.complete_pending(),
            other => return (other, retries),
        }
    }
    panic!("still a retry after 20 syncs");
}

/// Issue #35 (b): Compute takes seconds to minutes per operation, and a sync that waited for
/// each held its worker (with upstream's one worker, 100 Services created at once took 100
/// times one). An operation of the Service's own resources still running after a moment is
/// parked and the sync is a retry (`RetryAfter`): meanwhile another Service's sync starts its
/// own; a retry while it runs sends nothing but a read of the operation; once it is done the
/// sync resumes from what exists. The end state is the one a waiting sync builds: each
/// resource inserted once, the static IP released once the forwarding rule holds it.
#[tokio::test]
async fn a_running_operation_is_parked_and_the_sync_resumes_from_what_exists() {
    let t = held().await;
    let warm = warm_up(&t).await;
    let base = t.muts();
    let s = web(&[]);
    let other = svc(UID2, "other", &[81], &[]);
    let nodes = nodes_ab();

    let e = t.ensure(&s, &nodes_ab()).await.unwrap_err();
    assert!(
        matches!(&e, ProviderError::RetryAfter { message, .. } if message.contains("compute.addresses.insert")),
        "the address insert runs: {e}"
    );
    assert_eq!(diff(&base, &t.muts()), ops(&[("compute.addresses.insert", 1)]));
    // Another Service is not held up by it.
    let e = t.ensure(&other, &nodes_ab()).await.unwrap_err();
    assert!(matches!(e, ProviderError::RetryAfter { .. }), "{e}");
    assert_eq!(diff(&base, &t.muts()), ops(&[("compute.addresses.insert", 2)]));
    // A retry while the operation runs sends nothing.
    let before = t.f.server.counters();
    let e = t.ensure(&s, &nodes_ab()).await.unwrap_err();
    assert!(matches!(e, ProviderError::RetryAfter { .. }), "{e}");
    let after = t.f.server.counters();
    assert_eq!(diff(&mutations(&before), &mutations(&after)), BTreeMap::new());
    assert_eq!(
        after.matching("compute.*") - before.matching("compute.*"),
        1,
        "one read of the operation: {:?}",
        after.operations
    );

    // Compute finishes each operation before the next try: the sync goes on from there.
    let (status, retries) = until_done(&t, || t.ensure(&s, &nodes)).await;
    let addr = ip(&status.unwrap());
    assert!(retries >= 3, "the firewall, the target pool and the rule were parked too: {retries}");
    let fr = t.one("forwardingRules", LB);
    assert_eq!(fr["IPAddress"], addr.as_str());
    assert_eq!(fr["target"], link(&format!("regions/{REGION}/targetPools/{LB}")));
    assert_eq!(t.one("firewalls", &format!("k8s-fw-{LB}"))["destinationRanges"][0], addr.as_str());
    // The release of the static IP was started by the sync that succeeded.
    t.f.cloud.complete_pending();
    assert_eq!(
        t.names("addresses").into_iter().filter(|n| n == LB).count(),
        0,
        "the static IP is released once the rule holds it"
    );
    let m = diff(&base, &t.muts());
    for (op, n) in [
        ("compute.forwardingRules.insert", 1),
        ("compute.targetPools.insert", 1),
        ("compute.firewalls.insert", 1),
        ("compute.addresses.delete", 1),
    ] {
        assert_eq!(m.get(op).copied(), Some(n), "{op} sent {n} time(s): {m:?}");
    }
    assert_eq!(m.get("compute.httpHealthChecks.insert"), None, "the shared check existed");
    // The next sync reads the release's operation and changes nothing.
    let before = t.muts();
    assert_eq!(ip(&t.ensure(&s, &nodes_ab()).await.unwrap()), addr);
    assert_eq!(diff(&before, &t.muts()), BTreeMap::new());

    // A node change's membership update is parked the same way, and a retry resumes it.
    let only_a = [node("node-a", ZONE_A)];
    let (updated, _) = until_done(&t, || t.update(&s, &only_a)).await;
    updated.unwrap();
    assert_eq!(
        strs(&t.one("targetPools", LB)["instances"]),
        vec![link(&format!("zones/{ZONE_A}/instances/node-a"))]
    );

    // The other Service's load balancer is finished too, and deleting both leaves nothing.
    let (status, _) = until_done(&t, || t.ensure(&other, &nodes)).await;
    assert_ne!(ip(&status.unwrap()), addr);
    for x in [&s, &other] {
        let (deleted, _) = until_done(&t, || t.delete(x)).await;
        deleted.unwrap();
    }
    cool_down(&t, &warm).await;
}

/// A parked operation that fails is the next sync's error, naming Compute's code; the sync
/// after it sends the mutation again and converges. A Service deleted while its operation
/// runs waits for it (retries), then deletes everything.
#[tokio::test]
async fn a_parked_operation_that_fails_is_an_error_and_a_delete_waits_for_it() {
    let t = held().await;
    let warm = warm_up(&t).await;
    let base = t.muts();
    t.f.server
        .admin()
        .fail_operations(
            "*/targetPools/*",
            ccm_emulators::asyncop::Action::Create,
            1,
            "QUOTA_EXCEEDED: Quota 'TARGET_POOLS' exceeded.  Limit: 50.0 in region us-central1.",
        )
        .await
        .unwrap();
    let s = web(&[]);
    let nodes = nodes_ab();
    let mut failed = None;
    for _ in 0..20 {
        match t.ensure(&s, &nodes_ab()).await {
            Err(ProviderError::RetryAfter { .. }) => t.f.cloud.complete_pending(),
            Err(e) => {
                failed = Some(e);
                break;
            }
            Ok(_) => panic!("the target pool's insert failed; the sync cannot succeed"),
        }
    }
    let e = failed.expect("the failure reached a sync");
    assert!(e.to_string().contains("QUOTA_EXCEEDED"), "{e}");
    assert!(!matches!(e, ProviderError::RetryAfter { .. }), "a failure, not a retry: {e}");
    assert!(!t.names("targetPools").contains(&LB.to_string()), "the failed insert made nothing");

    // The next syncs insert the pool again and finish.
    let (status, _) = until_done(&t, || t.ensure(&s, &nodes)).await;
    status.unwrap();
    assert_eq!(diff(&base, &t.muts())["compute.targetPools.insert"], 2);

    // A change whose operation runs, then the Service is deleted: the delete is a retry
    // until the operation is done, then removes everything.
    t.f.cloud.complete_pending();
    let wider = svc(UID, "web", &[80, 443], &[]);
    assert!(matches!(t.ensure(&wider, &nodes_ab()).await, Err(ProviderError::RetryAfter { .. })));
    let e = t.delete(&wider).await.unwrap_err();
    assert!(matches!(e, ProviderError::RetryAfter { .. }), "the delete waits for it: {e}");
    let (deleted, _) = until_done(&t, || t.delete(&wider)).await;
    deleted.unwrap();
    cool_down(&t, &warm).await;
}

/// Compute's realistic operation times (scaled): every operation of one Service's load
/// balancer parked in turn, creating and then deleting it (each retry after the delay it
/// asked for) leaves nothing, the shared health check and its firewall included.
#[tokio::test]
async fn parked_operations_at_realistic_times_create_and_delete_everything() {
    let t = held().await;
    t.f.server
        .admin()
        .set_timing(ccm_emulators::asyncop::TimingProfile::Realistic, 0.05)
        .await
        .unwrap();
    let s = web(&[]);
    let nodes = nodes_ab();
    let mut retries = 0;
    let status = loop {
        match t.ensure(&s, &nodes).await {
            Err(ProviderError::RetryAfter { delay, .. }) => {
                retries += 1;
                assert!(retries < 60, "still a retry after 60 syncs");
                tokio::time::sleep(delay).await;
            }
            other => break other.unwrap(),
        }
    };
    assert!(retries >= 4, "the operations were parked: {retries} retries");
    assert_eq!(t.one("forwardingRules", LB)["IPAddress"], ip(&status).as_str());
    // A port change re-creates the rule; the Service is deleted while its new rule's insert
    // still runs (the change's chain unfinished, its address still held).
    let s = svc(UID, "web", &[8080, 443], &[]);
    for _ in 0..60 {
        match t.ensure(&s, &nodes).await {
            Err(ProviderError::RetryAfter { message, delay })
                if !message.contains("compute.forwardingRules.insert") =>
            {
                tokio::time::sleep(delay).await
            }
            Err(ProviderError::RetryAfter { .. }) => break,
            other => panic!("the rule's insert was to be parked: {other:?}"),
        }
    }
    // As the service controller deletes: it asks whether the load balancer still exists
    // before each try and stops (removing its finalizer) once it does not, so "gone" must
    // mean nothing is left, the shared health check and its firewall included.
    let mut retries = 0;
    while t.lb.get_load_balancer("kubernetes", &s).await.unwrap().is_some() {
        match t.delete(&s).await {
            Err(ProviderError::RetryAfter { delay, .. }) => {
                retries += 1;
                assert!(retries < 60, "still a retry after 60 syncs");
                tokio::time::sleep(delay).await;
            }
            other => {
                other.unwrap();
                break;
            }
        }
    }
    assert!(retries >= 2, "the deletes were parked: {retries} retries");
    t.f.cloud.complete_pending();
    t.assert_empty();
}
