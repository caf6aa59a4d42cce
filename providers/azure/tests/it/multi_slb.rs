//! Multiple standard load balancers (issue #33 item 5): Services placed by the
//! `azure-load-balancer-configurations` annotation and the configurations' Service and
//! namespace selectors (namespaces read from the testbed's real kube-apiserver), each load
//! balancer's pool holding only its Nodes (primary VM set, node selector); a Service that
//! stops being eligible moves with its public IP; upstream's objects adopted in place; a bad
//! configuration refused at start naming the entry and field.

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::time::Duration;

use ccm_core::cloud::LoadBalancer;
use ccm_emulators::azure::AzureOptions;
use ccm_provider_azure::AzureProvider;
use ccm_provider_azure::config::{BackendPoolType, Config};
use ccm_provider_azure::load_balancer::AzureLoadBalancer;
use ccm_testbed::{ControlPlane, unique_name, wait_for};
use k8s_openapi::api::core::v1::{
    Event, Namespace, Node, NodeAddress, NodeSpec, NodeStatus, Service,
};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use kube::Api;
use kube::api::{ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::fixture::{self, CLUSTER, Fixture, RESOURCE_GROUP, VNET};
use crate::load_balancer::{P, P2, UID, UID2, id, ips, lb, svc};
use crate::support::put_upstream_public_ip;

const LB_PUT: &str = "network.load_balancers.create_or_update";
const PIP_TYPE: &str = "Microsoft.Network/publicIPAddresses";
const LB_TYPE: &str = "Microsoft.Network/loadBalancers";
const UID3: &str = "33333333-4444-5555-6666-777777777777";
const P3: &str = "a3333333344445555666677777777777";
const UID4: &str = "44444444-5555-6666-7777-888888888888";
const P4: &str = "a4444444455556666777788888888888";

/// The configurations: the cluster's own (no selectors), `lb-a` for namespaces labelled
/// `team=<team>` whose pool takes the scale set `pool` and Nodes labelled `lbpool=a`, `lb-b`
/// for Services labelled `tier=web` and Nodes labelled `lbpool=b`.
fn configurations(team: &str) -> Value {
    json!([
        {"name": CLUSTER, "primaryVMSet": "as-main"},
        {"name": "lb-a", "primaryVMSet": "pool",
         "serviceNamespaceSelector": {"matchLabels": {"team": team}},
         "nodeSelector": {"matchLabels": {"lbpool": "a"}}},
        {"name": "lb-b", "primaryVMSet": "set-b",
         "serviceLabelSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]},
         "nodeSelector": {"matchLabels": {"lbpool": "b"}}},
    ])
}

async fn start(team: &str) -> Fixture {
    let opts = AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() };
    let team = team.to_string();
    fixture::start_with(fixture::WORLD, opts, move |c: &mut Config| {
        c.load_balancer_backend_pool_configuration_type = BackendPoolType::NodeIp;
        c.multiple_standard_load_balancer_configurations = Some(configurations(&team));
        c.load_balancer_backend_pool_update_interval_in_seconds = Some(1);
    })
    .await
}

/// A Node with its InternalIP, providerID and labels.
fn node(name: &str, provider_id: String, ip: &str, labels: &[(&str, &str)]) -> Node {
    Node {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        },
        spec: Some(NodeSpec { provider_id: Some(provider_id), ..Default::default() }),
        status: Some(NodeStatus {
            addresses: Some(vec![NodeAddress { type_: "InternalIP".into(), address: ip.into() }]),
            ..Default::default()
        }),
    }
}

/// vm-0 (`lbpool=b`), vm-1 (no label), the scale set `pool`'s instances 0 and 1.
fn nodes() -> Vec<Node> {
    vec![
        node("vm-0", fixture::vm_provider_id("vm-0"), "10.240.0.4", &[("lbpool", "b")]),
        node("vm-1", fixture::vm_provider_id("vm-1"), "10.240.0.5", &[]),
        node("pool-0", fixture::vmss_provider_id("pool", 0), "10.240.1.4", &[]),
        node("pool-1", fixture::vmss_provider_id("pool", 1), "10.240.1.5", &[]),
    ]
}

/// A Service in `ns` with these labels and annotations.
fn service(
    uid: &str,
    ns: &str,
    name: &str,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> Service {
    let mut s = svc(uid, name, &[(80, "TCP")], annotations);
    s.metadata.namespace = Some(ns.into());
    s.metadata.labels = Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect());
    s
}

async fn namespace(client: &kube::Client, labels: &[(&str, &str)]) -> String {
    let name = unique_name("multi-slb");
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &ns).await.unwrap();
    name
}

fn names(v: &Value, collection: &str) -> Vec<String> {
    let mut out: Vec<String> = v["properties"][collection]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|x| x["name"].as_str().map(str::to_string))
        .collect();
    out.sort();
    out
}

/// The addresses in load balancer `name`'s pool `kubernetes`.
fn pool_ips(f: &Fixture, name: &str) -> Vec<String> {
    addresses_in(f, name, CLUSTER)
}

fn lbs_with_kube(f: &Fixture, client: &kube::Client) -> AzureLoadBalancer {
    AzureLoadBalancer::new(f.client.clone(), f.config.clone()).with_kube(client.clone())
}

/// A test's world: the admin client, an emulator whose `lb-a` takes the namespace `ns_a`
/// (labelled with a team of its own), a namespace no selector matches, and the load
/// balancers reading namespaces through the API.
struct Setup {
    client: kube::Client,
    f: Fixture,
    ns_a: String,
    ns_other: String,
    lbs: AzureLoadBalancer,
}

async fn setup(cp: &ControlPlane) -> Setup {
    let client = cp.admin_client().await.unwrap();
    let team = unique_name("team");
    let f = start(&team).await;
    let ns_a = namespace(&client, &[("team", &team)]).await;
    let ns_other = namespace(&client, &[]).await;
    let lbs = lbs_with_kube(&f, &client);
    Setup { client, f, ns_a, ns_other, lbs }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_go_where_annotation_and_selectors_say_and_each_pool_has_its_nodes() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let Setup { f, ns_a, ns_other, lbs, .. } = setup(cp).await;

    // No selector matches: the cluster's own load balancer.
    let plain = service(UID, &ns_other, "plain", &[], &[]);
    lbs.ensure_load_balancer(CLUSTER, &plain, &nodes()).await.unwrap();
    // The namespace is team's: lb-a.
    let team_svc = service(UID2, &ns_a, "team", &[], &[]);
    lbs.ensure_load_balancer(CLUSTER, &team_svc, &nodes()).await.unwrap();
    // Labelled tier=web: lb-b.
    let web = service(UID3, &ns_other, "web", &[("tier", "web")], &[]);
    lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    // Both lb-a and lb-b would take it; the annotation narrows to lb-b.
    let pinned = service(
        UID4,
        &ns_a,
        "pinned",
        &[("tier", "web")],
        &[("service.beta.kubernetes.io/azure-load-balancer-configurations", "lb-b")],
    );
    lbs.ensure_load_balancer(CLUSTER, &pinned, &nodes()).await.unwrap();

    assert_eq!(names(&lb(&f, CLUSTER).unwrap(), "frontendIPConfigurations"), vec![P]);
    assert_eq!(names(&lb(&f, "lb-a").unwrap(), "frontendIPConfigurations"), vec![P2]);
    let mut on_b = vec![P3.to_string(), P4.to_string()];
    on_b.sort();
    assert_eq!(names(&lb(&f, "lb-b").unwrap(), "frontendIPConfigurations"), on_b);
    assert_eq!(names(&lb(&f, "lb-a").unwrap(), "loadBalancingRules"), vec![format!("{P2}-TCP-80")]);

    // Each Node in exactly one pool: the scale set `pool` in lb-a (its primary VM set),
    // vm-0 (lbpool=b) in lb-b, vm-1 (no selector matches) in the cluster's own.
    assert_eq!(pool_ips(&f, CLUSTER), vec!["10.240.0.5"]);
    assert_eq!(pool_ips(&f, "lb-a"), vec!["10.240.1.4", "10.240.1.5"]);
    assert_eq!(pool_ips(&f, "lb-b"), vec!["10.240.0.4"]);

    // A re-sync of every Service writes no load balancer.
    let puts = f.server.counters().get(LB_PUT);
    for s in [&plain, &team_svc, &web, &pinned] {
        lbs.ensure_load_balancer(CLUSTER, s, &nodes()).await.unwrap();
        lbs.update_load_balancer(CLUSTER, s, &nodes()).await.unwrap();
    }
    assert_eq!(f.server.counters().get(LB_PUT), puts, "a re-sync writes nothing");

    // A Node leaving goes from its pool only.
    let fewer: Vec<Node> =
        nodes().into_iter().filter(|n| n.metadata.name.as_deref() != Some("pool-1")).collect();
    lbs.update_load_balancer(CLUSTER, &team_svc, &fewer).await.unwrap();
    assert_eq!(pool_ips(&f, "lb-a"), vec!["10.240.1.4"]);
    assert_eq!(pool_ips(&f, CLUSTER), vec!["10.240.0.5"]);

    // The status names each Service's address; deleting every Service leaves no load
    // balancer (each was the cluster's own, emptied).
    for s in [&plain, &team_svc, &web, &pinned] {
        let st = lbs.get_load_balancer(CLUSTER, s).await.unwrap().expect("status");
        assert_eq!(ips(&st).len(), 1);
        lbs.ensure_load_balancer_deleted(CLUSTER, s).await.unwrap();
    }
    for name in [CLUSTER, "lb-a", "lb-b"] {
        assert!(lb(&f, name).is_none(), "{name} deleted with its last frontend");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_service_that_stops_being_eligible_moves_with_its_address() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let Setup { client, f, ns_a, lbs, .. } = setup(cp).await;

    // One Service stays on the cluster's load balancer, so it is not deleted when the other
    // leaves lb-a.
    let stay = service(
        UID,
        &ns_a,
        "stay",
        &[],
        &[("service.beta.kubernetes.io/azure-load-balancer-configurations", CLUSTER)],
    );
    lbs.ensure_load_balancer(CLUSTER, &stay, &nodes()).await.unwrap();
    let mover = service(UID2, &ns_a, "mover", &[], &[]);
    let before = lbs.ensure_load_balancer(CLUSTER, &mover, &nodes()).await.unwrap();
    assert_eq!(names(&lb(&f, "lb-a").unwrap(), "frontendIPConfigurations"), vec![P2]);
    let pip_id = id(&f, PIP_TYPE, &format!("{CLUSTER}-{P2}"));

    // The namespace loses its label: the Service may no longer be on lb-a.
    Api::<Namespace>::all(client.clone())
        .patch(
            &ns_a,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"team": null}}})),
        )
        .await
        .unwrap();
    let after = lbs.ensure_load_balancer(CLUSTER, &mover, &nodes()).await.unwrap();

    // Off lb-a (emptied: deleted, the cluster's own), on the cluster's with the same public
    // IP: the address follows.
    assert!(lb(&f, "lb-a").is_none(), "lb-a had no other frontend: deleted");
    let k = lb(&f, CLUSTER).unwrap();
    let mut fes = vec![P.to_string(), P2.to_string()];
    fes.sort();
    assert_eq!(names(&k, "frontendIPConfigurations"), fes);
    assert!(names(&k, "loadBalancingRules").contains(&format!("{P2}-TCP-80")));
    let fe = k["properties"]["frontendIPConfigurations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["name"] == P2)
        .unwrap();
    assert!(
        fe["properties"]["publicIPAddress"]["id"].as_str().unwrap().eq_ignore_ascii_case(&pip_id)
    );
    assert_eq!(ips(&after), ips(&before), "the address follows the Service");
    // lb-a's Nodes came back to the cluster's pool.
    assert_eq!(pool_ips(&f, CLUSTER), vec!["10.240.0.4", "10.240.0.5", "10.240.1.4", "10.240.1.5"]);
}

/// Puts the load balancer `lb_name` as upstream makes it for one Service (`prefix`) on the
/// public IP `pip_id`: its frontend, the pool `pool` listing `members` (Node, IP) by IP, the
/// probe `<prefix>-TCP-<probe.0>` with the properties `probe.1`, and the rule
/// `<prefix>-TCP-80`.
fn put_upstream_lb(
    f: &Fixture,
    lb_name: &str,
    prefix: &str,
    pip_id: &str,
    pool: &str,
    members: &[(&str, &str)],
    probe: (&str, Value),
) {
    let vnet_id = id(f, "Microsoft.Network/virtualNetworks", VNET);
    let lb_id = id(f, LB_TYPE, lb_name);
    let fe_id = format!("{lb_id}/frontendIPConfigurations/{prefix}");
    let pool_id = format!("{lb_id}/backendAddressPools/{pool}");
    let (probe_port, probe) = probe;
    let probe_name = format!("{prefix}-TCP-{probe_port}");
    let probe_id = format!("{lb_id}/probes/{probe_name}");
    let backends: Vec<Value> = members
        .iter()
        .map(|(n, ip)| {
            json!({"name": n, "properties": {"ipAddress": ip, "virtualNetwork": {"id": vnet_id}}})
        })
        .collect();
    f.cloud
        .put_resource(
            &lb_id,
            json!({
                "sku": {"name": "Standard", "tier": "Regional"},
                "properties": {
                    "frontendIPConfigurations": [{"name": prefix, "id": fe_id,
                        "properties": {"publicIPAddress": {"id": pip_id}}}],
                    "backendAddressPools": [{"name": pool, "id": pool_id,
                        "properties": {"loadBalancerBackendAddresses": backends}}],
                    "probes": [{"name": probe_name, "id": probe_id, "properties": probe}],
                    "loadBalancingRules": [{
                        "name": format!("{prefix}-TCP-80"),
                        "id": format!("{lb_id}/loadBalancingRules/{prefix}-TCP-80"),
                        "properties": {
                            "frontendIPConfiguration": {"id": fe_id},
                            "backendAddressPool": {"id": pool_id},
                            "probe": {"id": probe_id},
                            "protocol": "Tcp", "frontendPort": 80, "backendPort": 80,
                            "enableFloatingIP": true, "idleTimeoutInMinutes": 4,
                            "enableTcpReset": true, "loadDistribution": "Default",
                            "disableOutboundSnat": false,
                        }
                    }],
                }
            }),
        )
        .unwrap();
}

/// What upstream made for two Services before the swap, named and tagged as upstream names
/// them: `kubernetes` (Service P, vm-1's address in its pool) and `lb-a` (Service P2, the
/// scale set's instances in its pool), each with its frontend on the public IP
/// `kubernetes-a<uid>`, the rule and probe `<prefix>-TCP-80`, the pool `kubernetes` listing
/// node IPs.
fn upstream_world(f: &Fixture, ns_plain: &str, ns_team: &str) -> BTreeMap<String, String> {
    let mut addrs = BTreeMap::new();
    for (lb_name, prefix, addr, members) in [
        (CLUSTER, P, "20.7.7.1", vec![("vm-1", "10.240.0.5"), ("vm-0", "10.240.0.4")]),
        ("lb-a", P2, "20.7.7.2", vec![("pool-0", "10.240.1.4"), ("pool-1", "10.240.1.5")]),
    ] {
        let pip_id = id(f, PIP_TYPE, &format!("{CLUSTER}-{prefix}"));
        let svc_name =
            if prefix == P { format!("{ns_plain}/plain") } else { format!("{ns_team}/team") };
        put_upstream_public_ip(f, &pip_id, &svc_name, addr);
        let probe = json!({"protocol": "Tcp", "port": 30080, "intervalInSeconds": 5,
                           "probeThreshold": 2});
        put_upstream_lb(f, lb_name, prefix, &pip_id, CLUSTER, &members, ("80", probe));
        addrs.insert(lb_name.to_string(), addr.to_string());
    }
    addrs
}

fn etag(f: &Fixture, name: &str) -> Value {
    lb(f, name).unwrap()["etag"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_load_balancers_are_adopted_without_touching_what_carries_traffic() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let Setup { client, f, ns_a, ns_other, .. } = setup(cp).await;
    let addrs = upstream_world(&f, &ns_other, &ns_a);
    let (etag_k, etag_a) = (etag(&f, CLUSTER), etag(&f, "lb-a"));
    let (before_k, before_a) = (lb(&f, CLUSTER).unwrap(), lb(&f, "lb-a").unwrap());

    // Our CCM starts (a new process: nothing remembered) and syncs both Services. vm-0
    // has lbpool=b, but lb-b does not exist: it stays where upstream put it.
    let lbs = lbs_with_kube(&f, &client);
    let plain = service(UID, &ns_other, "plain", &[], &[]);
    let team_svc = service(UID2, &ns_a, "team", &[], &[]);
    let a = lbs.ensure_load_balancer(CLUSTER, &plain, &nodes()).await.unwrap();
    let b = lbs.ensure_load_balancer(CLUSTER, &team_svc, &nodes()).await.unwrap();
    for s in [&plain, &team_svc] {
        lbs.update_load_balancer(CLUSTER, s, &nodes()).await.unwrap();
    }
    assert_eq!(ips(&a), vec![addrs[CLUSTER].parse::<IpAddr>().unwrap()]);
    assert_eq!(ips(&b), vec![addrs["lb-a"].parse::<IpAddr>().unwrap()]);
    assert_eq!(f.server.counters().get(LB_PUT), 0, "no load balancer was written");
    assert_eq!((etag(&f, CLUSTER), etag(&f, "lb-a")), (etag_k, etag_a));
    assert_eq!(lb(&f, CLUSTER).unwrap(), before_k);
    assert_eq!(lb(&f, "lb-a").unwrap(), before_a);
    assert!(lb(&f, "lb-b").is_none(), "no load balancer was created");
    assert_eq!(
        f.server.counters().matching("network.public_ip_addresses.create_or_update"),
        0,
        "upstream's public IPs are used as they are"
    );
}

#[tokio::test]
async fn a_bad_configuration_is_refused_at_start_naming_the_entry_and_field() {
    let f = fixture::start().await;
    let base = format!(
        "cloud: AzureStackCloud\nresourceManagerEndpoint: {}\ntenantId: {}\nsubscriptionId: {}\naadClientId: {}\naadClientSecret: {}\nresourceGroup: {RESOURCE_GROUP}\nlocation: eastus\nvnetName: {VNET}\nloadBalancerSku: standard\n",
        f.server.url(),
        fixture::TENANT,
        fixture::SUBSCRIPTION,
        ccm_emulators::azure::DEFAULT_CLIENT_ID,
        ccm_emulators::azure::DEFAULT_CLIENT_SECRET,
    );
    let refused = |extra: &str| {
        let text = format!("{base}{extra}");
        AzureProvider::new(Some(text.as_bytes()), f.options.clone())
            .map(|_| ())
            .expect_err(extra)
            .to_string()
    };
    let e = refused(
        "loadBalancerBackendPoolConfigurationType: nodeIP\nmultipleStandardLoadBalancerConfigurations:\n- {name: kubernetes, primaryVMSet: a, nodeSelector: {matchExpressions: [{key: pool, operator: Near, values: [x]}]}}\ncloudConfigType: file\n",
    );
    assert!(
        e.contains("multipleStandardLoadBalancerConfigurations: entry 0 (\"kubernetes\"): nodeSelector.matchExpressions[0].operator"),
        "{e}"
    );
    let e = refused(
        "loadBalancerBackendPoolConfigurationType: nodeIP\nmultipleStandardLoadBalancerConfigurations:\n- {name: kubernetes, primaryVMSet: a}\n- {name: kubernetes, primaryVMSet: b}\ncloudConfigType: file\n",
    );
    assert!(e.contains("entry 1 (\"kubernetes\"): name: duplicated"), "{e}");
    let e = refused(
        "loadBalancerBackendPoolConfigurationType: nodeIP\nmultipleStandardLoadBalancerConfigurations:\n- {name: kubernetes}\ncloudConfigType: file\n",
    );
    assert!(e.contains("primaryVMSet: required"), "{e}");
    // Upstream's rule: several load balancers list node IPs in their pools.
    let e = refused(
        "multipleStandardLoadBalancerConfigurations:\n- {name: kubernetes, primaryVMSet: a}\ncloudConfigType: file\n",
    );
    assert!(e.contains("loadBalancerBackendPoolConfigurationType"), "{e}");
    // A good one starts.
    AzureProvider::new(
        Some(
            format!("{base}loadBalancerBackendPoolConfigurationType: nodeIP\nmultipleStandardLoadBalancerConfigurations:\n- {{name: kubernetes, primaryVMSet: a}}\n- {{name: lb-a, primaryVMSet: b, serviceNamespaceSelector: {{matchLabels: {{team: a}}}}}}\ncloudConfigType: file\n")
                .as_bytes(),
        ),
        f.options.clone(),
    )
    .unwrap();
}

/// `service` with `externalTrafficPolicy: Local` and health check node port 32080.
fn local(mut s: Service) -> Service {
    let spec = s.spec.as_mut().unwrap();
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(32080);
    s
}

/// Puts the EndpointSlice `<svc>-eps` of Service `svc` in `ns` with one endpoint on each of
/// `on` (Node names), as the EndpointSlice controller writes it.
async fn endpoints(client: &kube::Client, ns: &str, svc: &str, on: &[&str]) {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    let name = format!("{svc}-eps");
    let slice = EndpointSlice {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some([("kubernetes.io/service-name".to_string(), svc.to_string())].into()),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: on
            .iter()
            .enumerate()
            .map(|(i, n)| Endpoint {
                addresses: vec![format!("10.244.{i}.9")],
                node_name: Some(n.to_string()),
                ..Default::default()
            })
            .collect(),
        ports: None,
    };
    match api.get_opt(&name).await.unwrap() {
        Some(old) => {
            let mut slice = slice;
            slice.metadata.resource_version = old.metadata.resource_version;
            api.replace(&name, &PostParams::default(), &slice).await.unwrap();
        }
        None => {
            api.create(&PostParams::default(), &slice).await.unwrap();
        }
    }
}

/// The addresses in pool `pool` of load balancer `name`.
fn addresses_in(f: &Fixture, name: &str, pool: &str) -> Vec<String> {
    let Some(l) = lb(f, name) else { return Vec::new() };
    let mut out: Vec<String> = l["properties"]["backendAddressPools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|p| p["name"].as_str().is_some_and(|n| n.eq_ignore_ascii_case(pool)))
        .flat_map(|p| p["properties"]["loadBalancerBackendAddresses"].as_array().cloned())
        .flatten()
        .filter_map(|a| a["properties"]["ipAddress"].as_str().map(str::to_string))
        .collect();
    out.sort();
    out
}

/// Each rule's name → the name of the pool it sends to.
fn rule_pools(v: &Value) -> Vec<(String, String)> {
    v["properties"]["loadBalancingRules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let pool = r["properties"]["backendAddressPool"]["id"].as_str().unwrap_or_default();
            (
                r["name"].as_str().unwrap_or_default().to_string(),
                pool.rsplit('/').next().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

/// The Events about Service `name` in `ns` with `reason`: their messages.
async fn events(client: &kube::Client, ns: &str, name: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let all = api.list(&ListParams::default()).await.unwrap().items;
    all.into_iter()
        .filter(|e| e.involved_object.name.as_deref() == Some(name))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_local_service_gets_its_own_pool_of_the_nodes_with_its_endpoints_which_follows_them() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let Setup { client, f, ns_other, lbs, .. } = setup(cp).await;
    let lbs = std::sync::Arc::new(lbs);
    let pool = format!("{ns_other}-web");

    // Its endpoints run on vm-1 and the scale set's pool-0.
    endpoints(&client, &ns_other, "web", &["vm-1", "pool-0"]).await;
    let web = local(service(UID, &ns_other, "web", &[], &[]));
    let st = lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    assert_eq!(ips(&st).len(), 1);

    // Its own pool `<namespace>-<name>` holds those Nodes (not the Nodes placed on this load
    // balancer), and its rule sends there; its probe is the health check node port.
    let k = lb(&f, CLUSTER).unwrap();
    assert_eq!(names(&k, "backendAddressPools"), vec![pool.clone()]);
    assert_eq!(addresses_in(&f, CLUSTER, &pool), vec!["10.240.0.5", "10.240.1.4"]);
    assert_eq!(rule_pools(&k), vec![(format!("{P}-TCP-80"), pool.clone())]);
    assert_eq!(names(&k, "probes"), vec![format!("{P}-TCP-32080")]);

    // The pod moves to pool-1: the updater (every second here) follows it.
    let stop = tokio_util_stop();
    AzureLoadBalancer::spawn_pool_updater(&lbs, stop.1);
    endpoints(&client, &ns_other, "web", &["pool-1"]).await;
    wait_for("the pool follows the endpoints", Duration::from_secs(30), || async {
        (addresses_in(&f, CLUSTER, &pool) == vec!["10.240.1.5"]).then_some(())
    })
    .await;
    let _ = stop.0.send(());
    let updated =
        wait_for("a LoadBalancerBackendPoolUpdated event", Duration::from_secs(20), || {
            let (client, ns) = (client.clone(), ns_other.clone());
            async move {
                let ev = events(&client, &ns, "web", "LoadBalancerBackendPoolUpdated").await;
                (!ev.is_empty()).then_some(ev)
            }
        })
        .await;
    assert_eq!(updated[0].type_.as_deref(), Some("Normal"));
    // Nothing changed since: a pass writes nothing.
    let puts = f.server.counters().get(LB_PUT);
    let pass = lbs.local_pool_pass().await;
    assert_eq!((pass.services, pass.updated, pass.failed), (1, 0, 0));
    assert_eq!(f.server.counters().get(LB_PUT), puts);

    // A node sync without pool-1 takes it out; a Node without an endpoint never goes in.
    let fewer: Vec<Node> =
        nodes().into_iter().filter(|n| n.metadata.name.as_deref() != Some("pool-1")).collect();
    lbs.update_load_balancer(CLUSTER, &web, &fewer).await.unwrap();
    assert_eq!(addresses_in(&f, CLUSTER, &pool), Vec::<String>::new());
    lbs.update_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    assert_eq!(addresses_in(&f, CLUSTER, &pool), vec!["10.240.1.5"]);

    // Back to Cluster: the rule goes to the shared pool, its own pool goes.
    let cluster = service(UID, &ns_other, "web", &[], &[]);
    lbs.ensure_load_balancer(CLUSTER, &cluster, &nodes()).await.unwrap();
    let k = lb(&f, CLUSTER).unwrap();
    assert_eq!(names(&k, "backendAddressPools"), vec![CLUSTER.to_string()]);
    assert_eq!(rule_pools(&k), vec![(format!("{P}-TCP-80"), CLUSTER.to_string())]);
    assert_eq!(lbs.local_pool_pass().await.services, 0, "no longer a Local Service's pool");

    // Local again, then deleted: the load balancer goes with its last frontend.
    lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    assert_eq!(addresses_in(&f, CLUSTER, &pool), vec!["10.240.1.5"]);
    lbs.ensure_load_balancer_deleted(CLUSTER, &web).await.unwrap();
    assert!(lb(&f, CLUSTER).is_none());
    assert_eq!(lbs.local_pool_pass().await.services, 0);
}

/// A stop signal for the updater: (sender, the future it completes).
fn tokio_util_stop() -> (tokio::sync::oneshot::Sender<()>, impl Future<Output = ()> + Send) {
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    (tx, async move {
        let _ = rx.await;
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upstreams_local_service_pool_is_adopted_without_a_write() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let Setup { client, f, ns_other, lbs, .. } = setup(cp).await;
    let pool = format!("{ns_other}-web");
    endpoints(&client, &ns_other, "web", &["vm-1", "pool-0"]).await;

    // What upstream made for the Local Service `web`: its public IP, and on `kubernetes` its
    // frontend, its pool `<namespace>-web` with its endpoint Nodes' addresses, the rule to
    // it and the probe on the health check node port.
    let pip_id = id(&f, PIP_TYPE, &format!("{CLUSTER}-{P}"));
    put_upstream_public_ip(&f, &pip_id, &format!("{ns_other}/web"), "20.7.7.9");
    let members = [("vm-1", "10.240.0.5"), ("pool-0", "10.240.1.4")];
    let probe = json!({"protocol": "Http", "port": 32080, "requestPath": "/healthz",
                       "intervalInSeconds": 5, "probeThreshold": 2});
    put_upstream_lb(&f, CLUSTER, P, &pip_id, &pool, &members, ("32080", probe));
    let before = lb(&f, CLUSTER).unwrap();

    // Our CCM starts and syncs it, then a node sync and an updater pass: nothing written.
    let web = local(service(UID, &ns_other, "web", &[], &[]));
    let st = lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    lbs.update_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    assert_eq!(lbs.local_pool_pass().await.updated, 0);
    assert_eq!(ips(&st), vec!["20.7.7.9".parse::<IpAddr>().unwrap()]);
    assert_eq!(f.server.counters().get(LB_PUT), 0, "no load balancer was written");
    assert_eq!(lb(&f, CLUSTER).unwrap(), before);
    assert_eq!(f.server.counters().matching("network.public_ip_addresses.create_or_update"), 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_no_load_balancer_takes_is_a_warning_event_on_the_service() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let Setup { client, f, ns_other, lbs, .. } = setup(cp).await;

    // Only lb-b is made (tier=web): vm-0 (lbpool=b) goes there; the cluster's own load
    // balancer (vm-1's) and lb-a (the scale set's) do not exist, so those Nodes have none.
    let web = service(UID, &ns_other, "web", &[("tier", "web")], &[]);
    lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    assert_eq!(pool_ips(&f, "lb-b"), vec!["10.240.0.4"]);
    let got = wait_for("FailedToFindLoadBalancerForNode events", Duration::from_secs(20), || {
        let client = client.clone();
        let ns = ns_other.clone();
        async move {
            let ev = events(&client, &ns, "web", "FailedToFindLoadBalancerForNode").await;
            let mut msgs: Vec<String> = ev.iter().filter_map(|e| e.message.clone()).collect();
            msgs.sort();
            (msgs.len() == 3).then_some((ev, msgs))
        }
    })
    .await;
    assert_eq!(
        got.1,
        vec![
            "failed to find a lb for node pool-0",
            "failed to find a lb for node pool-1",
            "failed to find a lb for node vm-1",
        ]
    );
    for e in &got.0 {
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(
            e.source.as_ref().and_then(|s| s.component.as_deref()),
            Some("azure-cloud-provider")
        );
    }

    // A re-sync repeats them (one event each, its count grown), no new ones.
    lbs.update_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    let again = events(&client, &ns_other, "web", "FailedToFindLoadBalancerForNode").await;
    assert_eq!(again.len(), 3);
    assert!(again.iter().all(|e| e.count == Some(2)), "{again:?}");

    // Once the cluster's load balancer exists, every Node has one: nothing more is recorded
    // for the Service synced then.
    let plain = service(UID2, &ns_other, "plain", &[], &[]);
    lbs.ensure_load_balancer(CLUSTER, &plain, &nodes()).await.unwrap();
    assert!(
        events(&client, &ns_other, "plain", "FailedToFindLoadBalancerForNode").await.is_empty()
    );
    assert_eq!(pool_ips(&f, CLUSTER), vec!["10.240.0.5", "10.240.1.4", "10.240.1.5"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pools_converge_after_a_burst_of_node_label_changes() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let Setup { f, ns_a, ns_other, lbs, .. } = setup(cp).await;
    let plain = service(UID, &ns_other, "plain", &[], &[]);
    let team_svc = service(UID2, &ns_a, "team", &[], &[]);
    let web = service(UID3, &ns_other, "web", &[("tier", "web")], &[]);
    for s in [&plain, &team_svc, &web] {
        lbs.ensure_load_balancer(CLUSTER, s, &nodes()).await.unwrap();
    }

    // Six rounds of label flips on vm-0 (lbpool a/b) and vm-1 (lbpool b/none); in each,
    // the node sync of the three Services runs concurrently.
    let with = |l0: &str, l1: Option<&str>| -> Vec<Node> {
        let mut n = nodes();
        n[0] = node("vm-0", fixture::vm_provider_id("vm-0"), "10.240.0.4", &[("lbpool", l0)]);
        n[1] = match l1 {
            Some(l) => {
                node("vm-1", fixture::vm_provider_id("vm-1"), "10.240.0.5", &[("lbpool", l)])
            }
            None => node("vm-1", fixture::vm_provider_id("vm-1"), "10.240.0.5", &[]),
        };
        n
    };
    for round in 0..6 {
        let snapshot = if round % 2 == 0 { with("a", Some("b")) } else { with("b", None) };
        let (a, b, c) = tokio::join!(
            lbs.update_load_balancer(CLUSTER, &plain, &snapshot),
            lbs.update_load_balancer(CLUSTER, &team_svc, &snapshot),
            lbs.update_load_balancer(CLUSTER, &web, &snapshot),
        );
        a.unwrap();
        b.unwrap();
        c.unwrap();
    }
    // The last labels: vm-0 lbpool=b (lb-b), vm-1 none (the cluster's own); the scale set
    // in lb-a. Each Node in exactly one pool: no update lost.
    assert_eq!(pool_ips(&f, "lb-b"), vec!["10.240.0.4"]);
    assert_eq!(pool_ips(&f, CLUSTER), vec!["10.240.0.5"]);
    assert_eq!(pool_ips(&f, "lb-a"), vec!["10.240.1.4", "10.240.1.5"]);

    // One more flip, synced by one Service only: every pool follows.
    let last = with("a", Some("b"));
    lbs.update_load_balancer(CLUSTER, &plain, &last).await.unwrap();
    assert_eq!(pool_ips(&f, "lb-a"), vec!["10.240.0.4", "10.240.1.4", "10.240.1.5"]);
    assert_eq!(pool_ips(&f, "lb-b"), vec!["10.240.0.5"]);
    assert_eq!(pool_ips(&f, CLUSTER), Vec::<String>::new());
}
