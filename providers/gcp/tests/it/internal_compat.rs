//! The internal load balancer where upstream starts (issue #32, GCP 1-3): on an auto-mode
//! network without `subnetwork-name`, with upstream's `alpha-features` gates `ILBSubsets` and
//! `SkipIGsManagement`, and with upstream's global health checks (a cluster moving from
//! upstream keeps its checks; one moving from this provider's earlier regional checks has
//! them replaced).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::{LoadBalancer, ProviderError};
use ccm_emulators::gcp::{GcpCloud, GcpOptions, parse_world};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_provider_gcp::client::GceClient;
use ccm_provider_gcp::config::Global;
use ccm_provider_gcp::load_balancer::{AlphaFeatures, GceLoadBalancer};
use google_cloud_compute_v1::model::{HTTPHealthCheck, HealthCheck, InstanceGroup};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;
use serde_json::Value;

use crate::fixture::{self, PROJECT, REGION, ZONE_A, ZONE_B};

const CLUSTER_ID: &str = "5eed5eed5eed5eed";
const UID: &str = "7e57ab1e-0000-4000-8000-00000000c0de";
const LB: &str = "a7e57ab1e00004000800000000000c0d";

/// An auto-mode `default` network (its subnetwork `default` in us-central1 is
/// `10.128.0.0/20`, as Google's), the instances on it.
const AUTO_WORLD: &str = r#"
region: us-central1
zones: [us-central1-a, us-central1-b]
instances:
  - {name: node-a, zone: us-central1-a, private_ips: [10.128.0.10] }
  - {name: node-b, zone: us-central1-b, private_ips: [10.128.0.11] }
  - {name: node-c, zone: us-central1-b, private_ips: [10.128.0.12] }
gcp:
  auto_mode_networks: [default]
"#;

struct T {
    cloud: Arc<GcpCloud>,
    server: Server,
    client: Arc<GceClient>,
    global: Global,
    options: ccm_provider_gcp::client::ClientOptions,
}

impl T {
    /// Load balancers of this cluster with `alpha` gates.
    fn lbs(&self, alpha: AlphaFeatures) -> GceLoadBalancer {
        let client = Arc::new(GceClient::new(&self.global, self.options.clone()).unwrap());
        let lb = GceLoadBalancer::new(client, crate::fixture::timings()).with_alpha_features(alpha);
        lb.set_cluster_id(CLUSTER_ID);
        lb
    }

    fn muts(&self) -> BTreeMap<String, u64> {
        const VERBS: [&str; 7] = [
            ".insert",
            ".delete",
            ".patch",
            ".update",
            ".addInstances",
            ".removeInstances",
            ".setTarget",
        ];
        self.server
            .counters()
            .operations
            .into_iter()
            .filter(|(op, n)| *n > 0 && VERBS.iter().any(|v| op.ends_with(v)))
            .collect()
    }

    fn calls(&self, op: &str) -> u64 {
        self.server.counters().operations.get(op).copied().unwrap_or(0)
    }

    fn get(&self, coll: &str, scope: &str, name: &str) -> Option<Value> {
        self.cloud.resource(coll, scope, name)
    }

    fn names(&self, coll: &str) -> Vec<String> {
        let mut v: Vec<String> = self
            .cloud
            .resources(coll)
            .iter()
            .map(|r| r["name"].as_str().unwrap().to_string())
            .collect();
        v.sort();
        v
    }

    /// The instances of an instance group.
    async fn members(&self, zone: &str, group: &str) -> Vec<String> {
        let c = self.client.compute().await.unwrap();
        let page = self
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
            .map(|l| l.rsplit('/').next().unwrap().to_string())
            .collect();
        v.sort();
        v
    }
}

fn diff(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter_map(|(op, n)| {
            let d = n - before.get(op).copied().unwrap_or(0);
            (d > 0).then(|| (op.clone(), d))
        })
        .collect()
}

async fn start(world: &str, tweak: impl FnOnce(&mut Global)) -> T {
    let (world, gcp) = parse_world(world).unwrap();
    let mut opts = GcpOptions { pending: Duration::from_millis(50), ..GcpOptions::default() };
    gcp.apply(&mut opts);
    let cloud = GcpCloud::new(world, opts);
    let server = Server::start(cloud.clone(), ServerOptions::default()).await.unwrap();
    let options = fixture::options(&server.url());
    let mut global = fixture::global();
    global.node_tags = vec!["k8s-node".into()];
    tweak(&mut global);
    let client = Arc::new(GceClient::new(&global, options.clone()).unwrap());
    T { cloud, server, client, global, options }
}

/// The fixture's custom-mode world, `subnetwork-name = subnet-a`.
async fn start_custom() -> T {
    start(fixture::WORLD, |g| g.subnetwork_name = Some("subnet-a".into())).await
}

fn internal_svc() -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("db".into()),
            namespace: Some("default".into()),
            uid: Some(UID.into()),
            annotations: Some(
                [("networking.gke.io/load-balancer-type".to_string(), "Internal".to_string())]
                    .into(),
            ),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port: 5432,
                node_port: Some(30432),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
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

fn link(path: &str) -> String {
    format!("https://www.googleapis.com/compute/v1/projects/{PROJECT}/{path}")
}

const K: &str = "kubernetes";

/// Acceptance (issue #32, GCP 1): no `subnetwork-name` in gce.conf and no subnet annotation,
/// on an auto-mode network: the internal load balancer gets its address from the region's
/// auto-mode subnetwork, as upstream picks it. The network's mode is read once.
#[tokio::test]
async fn an_internal_load_balancer_on_an_auto_mode_network_gets_an_address_without_subnetwork_name()
{
    let t = start(AUTO_WORLD, |g| {
        g.network_name = Some("default".into());
        g.subnetwork_name = None;
    })
    .await;
    let lbs = t.lbs(AlphaFeatures::default());
    let s = internal_svc();
    let addr = ip(&lbs.ensure_load_balancer(K, &s, &nodes_ab()).await.unwrap());
    let range: ipnet::Ipv4Net = "10.128.0.0/20".parse().unwrap();
    assert!(range.contains(&addr.parse::<std::net::Ipv4Addr>().unwrap()), "{addr}");
    let fr = t.get("forwardingRules", &format!("regions/{REGION}"), LB).unwrap();
    assert_eq!(fr["subnetwork"], link(&format!("regions/{REGION}/subnetworks/default")));
    assert_eq!(fr["IPAddress"], addr.as_str());

    // A second sync changes nothing and asks for the network no more.
    let before = t.muts();
    assert_eq!(ip(&lbs.ensure_load_balancer(K, &s, &nodes_ab()).await.unwrap()), addr);
    assert_eq!(diff(&before, &t.muts()), BTreeMap::new());
    assert_eq!(t.calls("compute.networks.get"), 1);
    assert_eq!(t.calls("compute.subnetworks.list"), 1);

    lbs.ensure_load_balancer_deleted(K, &s).await.unwrap();
    assert_eq!(t.names("forwardingRules"), Vec::<String>::new());
}

/// A custom-mode network gives no subnetwork: the error names `subnetwork-name` and the
/// network's mode, and nothing is created.
#[tokio::test]
async fn a_custom_mode_network_without_subnetwork_name_is_an_error_naming_the_setting() {
    let t = start(fixture::WORLD, |g| g.subnetwork_name = None).await;
    let lbs = t.lbs(AlphaFeatures::default());
    let e = lbs.ensure_load_balancer(K, &internal_svc(), &nodes_ab()).await.unwrap_err();
    let msg = e.to_string();
    assert!(msg.contains("subnetwork-name") && msg.contains("custom-mode"), "{msg}");
    assert!(matches!(e, ProviderError::Invalid { .. }), "{e:?}");
    assert_eq!(t.muts(), BTreeMap::new());
}

/// `ILBSubsets` (issue #32, GCP 2): a new internal load balancer is GKE's L4 controller's:
/// ensure, update and delete are ImplementedElsewhere / nothing, without a single Compute
/// mutation. One this provider made before the gate was set is still updated and deleted.
#[tokio::test]
async fn with_ilb_subsets_new_internal_load_balancers_are_left_to_gke_and_old_ones_kept_up() {
    let t = start_custom().await;
    let gated = t.lbs(AlphaFeatures { ilb_subsets: true, ..Default::default() });
    let s = internal_svc();
    let e = gated.ensure_load_balancer(K, &s, &nodes_ab()).await.unwrap_err();
    assert!(matches!(e, ProviderError::ImplementedElsewhere), "{e:?}");
    let e = gated.update_load_balancer(K, &s, &nodes_ab()).await.unwrap_err();
    assert!(matches!(e, ProviderError::ImplementedElsewhere), "{e:?}");
    gated.ensure_load_balancer_deleted(K, &s).await.unwrap();
    assert_eq!(t.muts(), BTreeMap::new(), "nothing may be created, changed or deleted");

    // Made before the gate: the forwarding rule proves it is this provider's.
    let addr = ip(&t
        .lbs(AlphaFeatures::default())
        .ensure_load_balancer(K, &s, &nodes_ab())
        .await
        .unwrap());
    assert_eq!(ip(&gated.ensure_load_balancer(K, &s, &nodes_ab()).await.unwrap()), addr);
    let ig = format!("k8s-ig--{CLUSTER_ID}");
    gated
        .update_load_balancer(K, &s, &[node("node-a", ZONE_A), node("node-c", ZONE_B)])
        .await
        .unwrap();
    assert_eq!(t.members(ZONE_B, &ig).await, vec!["node-c"]);
    gated.ensure_load_balancer_deleted(K, &s).await.unwrap();
    for coll in ["forwardingRules", "backendServices", "healthChecks", "instanceGroups"] {
        assert_eq!(t.names(coll), Vec::<String>::new(), "{coll} left");
    }
}

/// `SkipIGsManagement` (issue #32, GCP 2): the `k8s-ig--<clusterID>` groups are someone
/// else's: the internal load balancer uses the ones it finds in each zone with nodes and
/// never creates, changes or deletes a group, whatever the nodes.
#[tokio::test]
async fn with_skip_igs_management_instance_groups_are_used_never_created_changed_or_deleted() {
    let t = start_custom().await;
    let ig = format!("k8s-ig--{CLUSTER_ID}");
    // The groups another controller keeps: node-a in zone a, node-b in zone b.
    let c = t.client.compute().await.unwrap();
    for (zone, member) in [(ZONE_A, "node-a"), (ZONE_B, "node-b")] {
        let mut g = InstanceGroup::default();
        g.name = Some(ig.clone());
        t.client
            .mutate("compute.instanceGroups.insert", || {
                c.instance_groups
                    .insert()
                    .set_project(PROJECT)
                    .set_zone(zone)
                    .set_body(g.clone())
                    .send()
            })
            .await
            .unwrap();
        let mut body = google_cloud_compute_v1::model::InstanceGroupsAddInstancesRequest::default();
        let mut r = google_cloud_compute_v1::model::InstanceReference::default();
        r.instance = Some(link(&format!("zones/{zone}/instances/{member}")));
        body.instances = vec![r];
        t.client
            .mutate("compute.instanceGroups.addInstances", || {
                c.instance_groups
                    .add_instances()
                    .set_project(PROJECT)
                    .set_zone(zone)
                    .set_instance_group(&ig)
                    .set_body(body.clone())
                    .send()
            })
            .await
            .unwrap();
    }
    let ig_muts = |m: &BTreeMap<String, u64>| -> BTreeMap<String, u64> {
        m.iter()
            .filter(|(k, _)| k.starts_with("compute.instanceGroups."))
            .map(|(k, v)| (k.clone(), *v))
            .collect()
    };
    let before = ig_muts(&t.muts());

    let lbs = t.lbs(AlphaFeatures { skip_igs_management: true, ..Default::default() });
    let s = internal_svc();
    // node-c is in zone b but not in its group: it is not added.
    let all = vec![node("node-a", ZONE_A), node("node-b", ZONE_B), node("node-c", ZONE_B)];
    lbs.ensure_load_balancer(K, &s, &all).await.unwrap();
    let bs = t.get("backendServices", &format!("regions/{REGION}"), LB).unwrap();
    let mut groups: Vec<String> = bs["backends"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["group"].as_str().unwrap().to_string())
        .collect();
    groups.sort();
    assert_eq!(
        groups,
        vec![
            link(&format!("zones/{ZONE_A}/instanceGroups/{ig}")),
            link(&format!("zones/{ZONE_B}/instanceGroups/{ig}"))
        ]
    );
    lbs.update_load_balancer(K, &s, &[node("node-c", ZONE_B)]).await.unwrap();
    assert_eq!(t.members(ZONE_A, &ig).await, vec!["node-a"]);
    assert_eq!(t.members(ZONE_B, &ig).await, vec!["node-b"]);
    lbs.ensure_load_balancer_deleted(K, &s).await.unwrap();
    assert_eq!(t.names("forwardingRules"), Vec::<String>::new());
    assert_eq!(t.names("instanceGroups"), vec![ig.clone(), ig.clone()], "the groups stay");
    assert_eq!(ig_muts(&t.muts()), before, "no instance group was created, changed or deleted");
}

/// Issue #32, GCP 3: the internal load balancer's health checks are global, as upstream's.
/// A cluster moving from upstream keeps its global `k8s-<clusterID>-node` check (used, not
/// re-created); one moving from this provider's earlier regional checks has the backend
/// service moved to the global check and the regional one deleted (its firewall, shared with
/// the global check, kept).
#[tokio::test]
async fn internal_health_checks_are_global_as_upstream_and_earlier_regional_ones_are_replaced() {
    let t = start_custom().await;
    let nodes_hc = format!("k8s-{CLUSTER_ID}-node");
    let region = format!("regions/{REGION}");
    // Upstream's check, already there (upstream's timings: 8 s / 1 s / 1 / 3).
    let c = t.client.compute().await.unwrap();
    let mut http = HTTPHealthCheck::default();
    http.port = Some(10256);
    http.request_path = Some("/healthz".into());
    let mut hc = HealthCheck::default();
    hc.name = Some(nodes_hc.clone());
    hc.r#type = Some("HTTP".into());
    hc.http_health_check = Some(http);
    hc.check_interval_sec = Some(8);
    hc.timeout_sec = Some(1);
    hc.healthy_threshold = Some(1);
    hc.unhealthy_threshold = Some(3);
    hc.description = Some(String::new());
    t.client
        .mutate("compute.healthChecks.insert", || {
            c.health_checks.insert().set_project(PROJECT).set_body(hc.clone()).send()
        })
        .await
        .unwrap();
    let lbs = t.lbs(AlphaFeatures::default());
    let s = internal_svc();
    lbs.ensure_load_balancer(K, &s, &nodes_ab()).await.unwrap();
    assert_eq!(
        t.calls("compute.healthChecks.insert"),
        1,
        "upstream's check is used, not re-created"
    );
    assert_eq!(t.calls("compute.regionHealthChecks.insert"), 0);
    let global_link = link(&format!("global/healthChecks/{nodes_hc}"));
    let bs = t.get("backendServices", &region, LB).unwrap();
    assert_eq!(bs["healthChecks"], serde_json::json!([global_link]));
    assert!(t.get("healthChecks", &region, &nodes_hc).is_none(), "no regional check");

    // This provider's earlier shape: the backend service on a regional check of that name.
    let mut regional = hc.clone();
    regional.self_link = None;
    t.client
        .mutate("compute.regionHealthChecks.insert", || {
            c.region_health_checks
                .insert()
                .set_project(PROJECT)
                .set_region(REGION)
                .set_body(regional.clone())
                .send()
        })
        .await
        .unwrap();
    let mut bs = t
        .client
        .call("compute.regionBackendServices.get", || {
            c.region_backend_services
                .get()
                .set_project(PROJECT)
                .set_region(REGION)
                .set_backend_service(LB)
                .send()
        })
        .await
        .unwrap();
    bs.health_checks = vec![link(&format!("{region}/healthChecks/{nodes_hc}"))];
    t.client
        .mutate("compute.regionBackendServices.update", || {
            c.region_backend_services
                .update()
                .set_project(PROJECT)
                .set_region(REGION)
                .set_backend_service(LB)
                .set_body(bs.clone())
                .send()
        })
        .await
        .unwrap();
    // The next sync (a new manager: nothing cached) moves it to the global check.
    let lbs = t.lbs(AlphaFeatures::default());
    lbs.ensure_load_balancer(K, &s, &nodes_ab()).await.unwrap();
    let bs = t.get("backendServices", &region, LB).unwrap();
    assert_eq!(bs["healthChecks"], serde_json::json!([global_link]));
    assert!(t.get("healthChecks", &region, &nodes_hc).is_none(), "the regional check is deleted");
    assert!(t.get("healthChecks", "global", &nodes_hc).is_some());
    assert!(
        t.get("firewalls", "global", &format!("k8s-{CLUSTER_ID}-node-hc")).is_some(),
        "the health-check firewall stays for the global check"
    );

    // Deleting the load balancer deletes the global check too (no other user).
    lbs.ensure_load_balancer_deleted(K, &s).await.unwrap();
    assert_eq!(t.names("healthChecks"), Vec::<String>::new());
}
