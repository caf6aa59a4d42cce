//! LoadBalancer against the emulator: public and internal Services get addresses and the
//! resources upstream creates (frontend, rules, probes, pool membership, public IP and its
//! tags, NSG rules); a second sync writes nothing; a port change replaces the rules; delete
//! leaves nothing of the Service (and deletes the emptied load balancer); the operator's
//! fields and a user's public IP survive; bad annotations are refused before any write; a
//! write racing ours (412) is redone with both changes kept.

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::{LoadBalancer, ProviderError};
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_provider_azure::load_balancer::AzureLoadBalancer;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;
use serde_json::{Value, json};

use crate::fixture::{self, CLUSTER, Fixture, NSG, RESOURCE_GROUP, node, vm_provider_id};

pub(crate) const UID: &str = "6f7f1b2c-1234-5678-9abc-def012345678";
pub(crate) const P: &str = "a6f7f1b2c123456789abcdef01234567";
pub(crate) const UID2: &str = "0a0b0c0d-1111-2222-3333-444455556666";
pub(crate) const P2: &str = "a0a0b0c0d11112222333344445555666";
const LB_PUT: &str = "network.load_balancers.create_or_update";

pub(crate) fn svc(
    uid: &str,
    name: &str,
    ports: &[(i32, &str)],
    annotations: &[(&str, &str)],
) -> Service {
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
                    .map(|(p, proto)| ServicePort {
                        port: *p,
                        node_port: Some(30000 + *p % 1000),
                        protocol: Some(proto.to_string()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

pub(crate) fn nodes() -> Vec<Node> {
    ["vm-0", "vm-1"].iter().map(|n| node(n, Some(&vm_provider_id(n)))).collect()
}

pub(crate) fn setup(f: &Fixture) -> AzureLoadBalancer {
    AzureLoadBalancer::new(f.client.clone(), f.config.clone())
}

pub(crate) fn id(f: &Fixture, ty: &str, name: &str) -> String {
    f.client.resource_id(RESOURCE_GROUP, ty, name).unwrap()
}

pub(crate) fn lb(f: &Fixture, name: &str) -> Option<Value> {
    f.cloud.resource(&id(f, "Microsoft.Network/loadBalancers", name))
}

pub(crate) fn pip(f: &Fixture, name: &str) -> Option<Value> {
    f.cloud.resource(&id(f, "Microsoft.Network/publicIPAddresses", name))
}

fn names(v: &Value, collection: &str) -> Vec<String> {
    let mut out: Vec<String> = v["properties"][collection]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| c["name"].as_str().unwrap_or_default().to_string())
        .collect();
    out.sort();
    out
}

fn child<'a>(v: &'a Value, collection: &str, name: &str) -> &'a Value {
    v["properties"][collection]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("{collection}/{name} missing in {v:#}"))
}

pub(crate) fn ips(s: &LoadBalancerStatus) -> Vec<IpAddr> {
    s.ingress.iter().flatten().map(|i| i.ip.as_deref().unwrap().parse().unwrap()).collect()
}

/// Every address the NSG's rules send traffic to.
fn nsg_destinations(f: &Fixture) -> Vec<String> {
    let nsg = f.cloud.resource(&id(f, "Microsoft.Network/networkSecurityGroups", NSG)).unwrap();
    let mut out = Vec::new();
    for r in nsg["properties"]["securityRules"].as_array().into_iter().flatten() {
        let p = &r["properties"];
        if let Some(d) = p["destinationAddressPrefix"].as_str() {
            out.push(d.to_string());
        }
        for d in p["destinationAddressPrefixes"].as_array().into_iter().flatten() {
            out.push(d.as_str().unwrap().to_string());
        }
    }
    out
}

fn nic_pools(f: &Fixture, vm: &str) -> Vec<String> {
    let nic = f
        .cloud
        .resource(&id(f, "Microsoft.Network/networkInterfaces", &format!("{vm}-nic")))
        .unwrap();
    nic["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|p| p["id"].as_str().unwrap().to_string())
        .collect()
}

/// ARM calls so far, without token requests and long-running-operation polls.
pub(crate) fn arm_calls(f: &Fixture) -> u64 {
    let c = f.server.counters();
    c.operations
        .iter()
        .filter(|(op, _)| !op.starts_with("aad.") && !op.starts_with("arm.operation"))
        .map(|(_, n)| n)
        .sum()
}

pub(crate) fn invalid_what(r: Result<impl std::fmt::Debug, ProviderError>) -> String {
    match r {
        Err(ProviderError::Invalid { what, .. }) => what,
        other => panic!("expected Invalid, got {other:?}"),
    }
}

#[tokio::test]
async fn a_public_service_gets_upstreams_resources_and_a_resync_writes_nothing() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let s = svc(
        UID,
        "web",
        &[(80, "TCP"), (53, "UDP")],
        &[("service.beta.kubernetes.io/azure-pip-tags", "team=web")],
    );
    let calls0 = arm_calls(&f);
    let status = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    let first = arm_calls(&f) - calls0;
    let addr = ips(&status);
    assert_eq!(addr.len(), 1);

    let pip_name = format!("{CLUSTER}-{P}");
    let p = pip(&f, &pip_name).expect("public IP kubernetes-a<uid>");
    assert_eq!(p["properties"]["ipAddress"].as_str().unwrap(), addr[0].to_string());
    assert_eq!(p["sku"]["name"], "Standard");
    assert_eq!(p["properties"]["publicIPAllocationMethod"], "Static");
    assert_eq!(p["tags"]["k8s-azure-service"], "default/web");
    assert_eq!(p["tags"]["k8s-azure-cluster-name"], CLUSTER);
    assert_eq!(p["tags"]["team"], "web");

    let l = lb(&f, CLUSTER).expect("the shared load balancer");
    assert_eq!(l["sku"]["name"], "Standard");
    assert_eq!(l["location"], fixture::LOCATION);
    assert_eq!(names(&l, "frontendIPConfigurations"), vec![P.to_string()]);
    let fe = child(&l, "frontendIPConfigurations", P);
    assert!(fe["properties"]["publicIPAddress"]["id"].as_str().unwrap().ends_with(&pip_name));
    assert_eq!(names(&l, "loadBalancingRules"), vec![format!("{P}-TCP-80"), format!("{P}-UDP-53")]);
    assert_eq!(names(&l, "probes"), vec![format!("{P}-TCP-80")]);
    let probe = child(&l, "probes", &format!("{P}-TCP-80"));
    assert_eq!(probe["properties"]["protocol"], "Tcp");
    assert_eq!(probe["properties"]["port"], 30080);
    let rule = child(&l, "loadBalancingRules", &format!("{P}-TCP-80"));
    assert_eq!(rule["properties"]["enableFloatingIP"], true);
    assert_eq!(rule["properties"]["enableTcpReset"], true);
    assert_eq!(rule["properties"]["idleTimeoutInMinutes"], 4);
    assert_eq!(names(&l, "backendAddressPools"), vec![CLUSTER.to_string()]);

    // Membership (helper D's module) and NSG rules for the address.
    let pool_id = format!(
        "{}/backendAddressPools/{CLUSTER}",
        id(&f, "Microsoft.Network/loadBalancers", CLUSTER)
    );
    for vm in ["vm-0", "vm-1"] {
        assert!(
            nic_pools(&f, vm).iter().any(|p| p.eq_ignore_ascii_case(&pool_id)),
            "{vm} in the pool"
        );
    }
    assert!(nsg_destinations(&f).contains(&addr[0].to_string()));

    // A second sync changes nothing.
    let puts = f.server.counters().matching("network.*.create_or_update");
    let calls1 = arm_calls(&f);
    let again = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    eprintln!(
        "ARM calls (token and operation polls excluded): first ensure {first}, re-sync {}",
        arm_calls(&f) - calls1
    );
    assert_eq!(again, status);
    assert_eq!(f.server.counters().matching("network.*.create_or_update"), puts);
    assert_eq!(lbs.get_load_balancer(CLUSTER, &s).await.unwrap(), Some(status));
}

#[tokio::test]
async fn an_internal_service_gets_a_private_address_in_the_subnet() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let internal = ("service.beta.kubernetes.io/azure-load-balancer-internal", "true");
    let s = svc(UID, "api", &[(443, "TCP")], &[internal]);
    let status = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    let addr = ips(&status);
    assert_eq!(addr.len(), 1);
    assert!(addr[0].to_string().starts_with("10.240."), "{addr:?}");
    let l = lb(&f, &format!("{CLUSTER}-internal")).expect("the internal load balancer");
    let fe = child(&l, "frontendIPConfigurations", P);
    assert!(fe["properties"]["subnet"]["id"].as_str().unwrap().ends_with("/subnets/subnet"));
    assert_eq!(fe["properties"]["privateIPAddress"].as_str().unwrap(), addr[0].to_string());
    assert!(lb(&f, CLUSTER).is_none(), "no public load balancer");
    assert!(
        f.cloud
            .resources("Microsoft.Network/publicIPAddresses")
            .iter()
            .all(|p| p["tags"]["k8s-azure-service"].is_null())
    );

    // A static address asked for.
    let s2 = svc(
        UID2,
        "db",
        &[(5432, "TCP")],
        &[internal, ("service.beta.kubernetes.io/azure-load-balancer-ipv4", "10.240.3.3")],
    );
    let st2 = lbs.ensure_load_balancer(CLUSTER, &s2, &nodes()).await.unwrap();
    assert_eq!(ips(&st2), vec!["10.240.3.3".parse::<IpAddr>().unwrap()]);
    let l = lb(&f, &format!("{CLUSTER}-internal")).unwrap();
    assert_eq!(
        child(&l, "frontendIPConfigurations", P2)["properties"]["privateIPAllocationMethod"],
        "Static"
    );

    // Internal → public: off the internal load balancer, onto the public one.
    let mut public = s.clone();
    public.metadata.annotations = None;
    let st = lbs.ensure_load_balancer(CLUSTER, &public, &nodes()).await.unwrap();
    assert_eq!(
        names(&lb(&f, &format!("{CLUSTER}-internal")).unwrap(), "frontendIPConfigurations"),
        vec![P2.to_string()]
    );
    assert_eq!(names(&lb(&f, CLUSTER).unwrap(), "frontendIPConfigurations"), vec![P.to_string()]);
    assert_ne!(ips(&st), addr);
}

#[tokio::test]
async fn changing_ports_replaces_the_rules_and_deleting_leaves_nothing() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    let status = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    let addr = ips(&status)[0].to_string();

    let s = svc(UID, "web", &[(8080, "TCP"), (8443, "TCP")], &[]);
    assert_eq!(
        lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap(),
        status,
        "same address"
    );
    let l = lb(&f, CLUSTER).unwrap();
    assert_eq!(
        names(&l, "loadBalancingRules"),
        vec![format!("{P}-TCP-8080"), format!("{P}-TCP-8443")]
    );
    assert_eq!(names(&l, "probes"), vec![format!("{P}-TCP-8080"), format!("{P}-TCP-8443")]);

    lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
    assert!(lb(&f, CLUSTER).is_none(), "the emptied load balancer is deleted");
    assert!(pip(&f, &format!("{CLUSTER}-{P}")).is_none(), "the public IP is deleted");
    assert!(!nsg_destinations(&f).contains(&addr), "no NSG rule for the address");
    assert!(nic_pools(&f, "vm-0").is_empty());
    assert_eq!(lbs.get_load_balancer(CLUSTER, &s).await.unwrap(), None);
    // Deleting again is fine.
    lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
}

#[tokio::test]
async fn the_operators_fields_survive_and_other_services_stay() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let a = svc(UID, "a", &[(80, "TCP")], &[]);
    lbs.ensure_load_balancer(CLUSTER, &a, &nodes()).await.unwrap();

    // The operator adds an outbound frontend, an outbound rule, a tag and a field we do not know.
    let lb_id = id(&f, "Microsoft.Network/loadBalancers", CLUSTER);
    let out_pip = id(&f, "Microsoft.Network/publicIPAddresses", "outbound");
    f.cloud
        .put_resource(
            &out_pip,
            json!({"sku": {"name": "Standard"}, "properties": {"ipAddress": "20.9.9.9"}}),
        )
        .unwrap();
    let mut l = lb(&f, CLUSTER).unwrap();
    l["tags"] = json!({"owner": "ops"});
    l["properties"]["operatorSetting"] = json!({"keep": true});
    l["properties"]["frontendIPConfigurations"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "outbound", "id": format!("{lb_id}/frontendIPConfigurations/outbound"), "properties": {"publicIPAddress": {"id": out_pip}}}));
    l["properties"]["outboundRules"] = json!([{"name": "egress", "properties": {
        "frontendIPConfigurations": [{"id": format!("{lb_id}/frontendIPConfigurations/outbound")}],
        "backendAddressPool": {"id": format!("{lb_id}/backendAddressPools/{CLUSTER}")},
        "protocol": "All", "allocatedOutboundPorts": 1024}}]);
    f.cloud.put_resource(&lb_id, l).unwrap();

    let b = svc(UID2, "b", &[(443, "TCP")], &[]);
    lbs.ensure_load_balancer(CLUSTER, &b, &nodes()).await.unwrap();
    lbs.ensure_load_balancer_deleted(CLUSTER, &a).await.unwrap();
    let l = lb(&f, CLUSTER).unwrap();
    assert_eq!(l["tags"]["owner"], "ops");
    assert_eq!(l["properties"]["operatorSetting"], json!({"keep": true}));
    assert_eq!(l["properties"]["outboundRules"][0]["properties"]["allocatedOutboundPorts"], 1024);
    assert_eq!(names(&l, "frontendIPConfigurations"), vec![P2.to_string(), "outbound".to_string()]);
    assert_eq!(names(&l, "loadBalancingRules"), vec![format!("{P2}-TCP-443")]);

    // The last Service gone, the operator's frontend keeps the load balancer.
    lbs.ensure_load_balancer_deleted(CLUSTER, &b).await.unwrap();
    let l = lb(&f, CLUSTER).expect("kept: the operator's frontend is on it");
    assert_eq!(names(&l, "frontendIPConfigurations"), vec!["outbound".to_string()]);
    assert!(pip(&f, "outbound").is_some());
}

#[tokio::test]
async fn a_users_public_ip_is_used_and_never_deleted() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let mine = id(&f, "Microsoft.Network/publicIPAddresses", "my-ip");
    f.cloud
        .put_resource(&mine, json!({"sku": {"name": "Standard"}, "tags": {"team": "x"}, "properties": {"ipAddress": "20.1.1.1", "publicIPAllocationMethod": "Static"}}))
        .unwrap();
    let s =
        svc(UID, "web", &[(80, "TCP")], &[("service.beta.kubernetes.io/azure-pip-name", "my-ip")]);
    let status = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    assert_eq!(ips(&status), vec!["20.1.1.1".parse::<IpAddr>().unwrap()]);
    assert!(pip(&f, &format!("{CLUSTER}-{P}")).is_none(), "no public IP of our own");
    assert_eq!(
        pip(&f, "my-ip").unwrap()["tags"],
        json!({"team": "x"}),
        "the user's tags untouched"
    );

    lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
    assert!(pip(&f, "my-ip").is_some(), "the user's public IP is kept");
    assert!(lb(&f, CLUSTER).is_none());

    // A name that does not exist is an error, and nothing is created.
    let s =
        svc(UID, "web", &[(80, "TCP")], &[("service.beta.kubernetes.io/azure-pip-name", "nope")]);
    assert!(lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.is_err());
    assert!(pip(&f, "nope").is_none());
}

#[tokio::test]
async fn bad_annotations_are_invalid_naming_the_key_before_any_write() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    for (key, value) in [
        ("service.beta.kubernetes.io/azure-load-balancer-tcp-idle-timeout", "200"),
        ("service.beta.kubernetes.io/azure-load-balancer-internal", "yes"),
        ("service.beta.kubernetes.io/azure-load-balancer-health-probe-interval", "2"),
        ("service.beta.kubernetes.io/port_80_health-probe_protocol", "ftp"),
        ("service.beta.kubernetes.io/azure-pls-create", "true"),
    ] {
        let s = svc(UID, "web", &[(80, "TCP")], &[(key, value)]);
        assert_eq!(invalid_what(lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await), key);
    }
    assert_eq!(f.server.counters().matching("network.*.create_or_update"), 0);
    // A bad annotation does not stop the delete.
    let s = svc(
        UID,
        "web",
        &[(80, "TCP")],
        &[("service.beta.kubernetes.io/azure-load-balancer-tcp-idle-timeout", "200")],
    );
    lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
}

#[tokio::test]
async fn a_write_racing_ours_is_redone_and_both_survive() {
    let f = fixture::start().await;
    let lbs = Arc::new(setup(&f));
    let a = svc(UID, "a", &[(80, "TCP")], &[]);
    lbs.ensure_load_balancer(CLUSTER, &a, &nodes()).await.unwrap();
    let before = f.server.counters().get(LB_PUT);

    // Our next load balancer PUT waits; meanwhile someone else writes the load balancer.
    f.server.inject(FaultRule::new(LB_PUT, Fault::Latency { ms: 800 }).times(1)).unwrap();
    let b = svc(UID2, "b", &[(443, "TCP")], &[]);
    let task = {
        let lbs = lbs.clone();
        tokio::spawn(async move { lbs.ensure_load_balancer(CLUSTER, &b, &nodes()).await })
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while f.server.counters().get(LB_PUT) == before {
        assert!(tokio::time::Instant::now() < deadline, "no PUT");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let lb_id = id(&f, "Microsoft.Network/loadBalancers", CLUSTER);
    let mut l = lb(&f, CLUSTER).unwrap();
    l["tags"] = json!({"racer": "won"});
    f.cloud.put_resource(&lb_id, l).unwrap();

    task.await.unwrap().unwrap();
    assert_eq!(f.server.counters().get(LB_PUT), before + 2, "one 412, one redo");
    let l = lb(&f, CLUSTER).unwrap();
    assert_eq!(l["tags"]["racer"], "won");
    assert_eq!(names(&l, "frontendIPConfigurations"), vec![P2.to_string(), P.to_string()]);
}

#[tokio::test]
async fn local_traffic_probes_the_health_check_node_port_and_dual_stack_names() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let mut s = svc(UID, "web", &[(80, "TCP")], &[]);
    let spec = s.spec.as_mut().unwrap();
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(32123);
    spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
    // vm-6 is the dual-stack VM.
    let dual = vec![node("vm-6", Some(&vm_provider_id("vm-6")))];
    let status = lbs.ensure_load_balancer(CLUSTER, &s, &dual).await.unwrap();
    let addr = ips(&status);
    assert_eq!(addr.len(), 2);
    assert!(addr[0].is_ipv4() && addr[1].is_ipv6(), "{addr:?}");
    let l = lb(&f, CLUSTER).unwrap();
    assert_eq!(names(&l, "frontendIPConfigurations"), vec![P.to_string(), format!("{P}-IPv6")]);
    assert_eq!(
        names(&l, "loadBalancingRules"),
        vec![format!("{P}-TCP-80"), format!("{P}-TCP-80-IPv6")]
    );
    assert_eq!(names(&l, "probes"), vec![format!("{P}-TCP-32123"), format!("{P}-TCP-32123-IPv6")]);
    let probe = child(&l, "probes", &format!("{P}-TCP-32123"));
    assert_eq!(probe["properties"]["protocol"], "Http");
    assert_eq!(probe["properties"]["requestPath"], "/healthz");
    assert_eq!(
        names(&l, "backendAddressPools"),
        vec![CLUSTER.to_string(), format!("{CLUSTER}-IPv6")]
    );
    assert!(pip(&f, &format!("{CLUSTER}-{P}-IPv6")).is_some());
    lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
    assert!(
        f.cloud
            .resources("Microsoft.Network/publicIPAddresses")
            .iter()
            .all(|p| p["tags"]["k8s-azure-service"].is_null())
    );
    assert!(lb(&f, CLUSTER).is_none());
}

#[tokio::test]
async fn operator_tools_list_and_delete_a_services_frontend() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    let status = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    let listed = lbs.list_cloud_load_balancers(CLUSTER).await.unwrap();
    assert_eq!(listed.len(), 1, "{listed:?}");
    let l = &listed[0];
    assert_eq!(l.name, P);
    assert!(l.owned);
    assert_eq!(l.service.as_deref(), Some("default/web"));
    assert_eq!(l.ingress, vec![ips(&status)[0].to_string()]);
    let kinds: Vec<&str> = l.resources.iter().map(|r| r.kind.as_str()).collect();
    for k in ["frontend IP configuration", "public IP", "load-balancing rule", "health probe"] {
        assert!(kinds.contains(&k), "{kinds:?}");
    }
    lbs.delete_cloud_load_balancer(CLUSTER, l).await.unwrap();
    assert!(lb(&f, CLUSTER).is_none());
    assert!(pip(&f, &format!("{CLUSTER}-{P}")).is_none());
    assert!(lbs.list_cloud_load_balancers(CLUSTER).await.unwrap().is_empty());
}

#[tokio::test]
async fn load_balancer_ip_finds_the_public_ip_and_a_second_service_shares_it() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let reserved = id(&f, "Microsoft.Network/publicIPAddresses", "reserved");
    f.cloud
        .put_resource(
            &reserved,
            json!({"sku": {"name": "Standard"}, "properties": {"ipAddress": "20.2.2.2", "publicIPAllocationMethod": "Static"}}),
        )
        .unwrap();
    let mut a = svc(UID, "a", &[(80, "TCP")], &[]);
    a.spec.as_mut().unwrap().load_balancer_ip = Some("20.2.2.2".into());
    let status = lbs.ensure_load_balancer(CLUSTER, &a, &nodes()).await.unwrap();
    assert_eq!(ips(&status), vec!["20.2.2.2".parse::<IpAddr>().unwrap()]);
    let l = lb(&f, CLUSTER).unwrap();
    assert!(
        child(&l, "frontendIPConfigurations", P)["properties"]["publicIPAddress"]["id"]
            .as_str()
            .unwrap()
            .ends_with("/reserved")
    );

    // Another Service naming the same public IP shares the frontend (upstream's secondary
    // Service, issue #33 item 1; before, this was refused naming azure-pip-name): its rule
    // on the first Service's frontend, the user's public IP still untagged.
    let b = svc(
        UID2,
        "b",
        &[(443, "TCP")],
        &[("service.beta.kubernetes.io/azure-pip-name", "reserved")],
    );
    let sb = lbs.ensure_load_balancer(CLUSTER, &b, &nodes()).await.unwrap();
    assert_eq!(ips(&sb), vec!["20.2.2.2".parse::<IpAddr>().unwrap()]);
    let l = lb(&f, CLUSTER).unwrap();
    assert_eq!(names(&l, "frontendIPConfigurations"), vec![P.to_string()]);
    assert!(
        child(&l, "loadBalancingRules", &format!("{P2}-TCP-443"))["properties"]
            ["frontendIPConfiguration"]["id"]
            .as_str()
            .unwrap()
            .ends_with(&format!("/frontendIPConfigurations/{P}"))
    );
    assert!(pip(&f, "reserved").unwrap()["tags"]["k8s-azure-service"].is_null());

    // An address no public IP has: an error, nothing created.
    let mut c = svc(UID2, "c", &[(80, "TCP")], &[]);
    c.spec.as_mut().unwrap().load_balancer_ip = Some("20.7.7.7".into());
    assert!(lbs.ensure_load_balancer(CLUSTER, &c, &nodes()).await.is_err());
    assert_eq!(names(&lb(&f, CLUSTER).unwrap(), "frontendIPConfigurations"), vec![P.to_string()]);

    lbs.ensure_load_balancer_deleted(CLUSTER, &a).await.unwrap();
    assert_eq!(names(&lb(&f, CLUSTER).unwrap(), "frontendIPConfigurations"), vec![P.to_string()]);
    lbs.ensure_load_balancer_deleted(CLUSTER, &b).await.unwrap();
    assert!(lb(&f, CLUSTER).is_none());
    assert!(pip(&f, "reserved").is_some(), "the reserved public IP is kept");
}
