//! Several Services on one frontend IP (issue #33 item 1), as upstream's primary/secondary
//! frontend ownership: the frontend belongs to the first Service (named by its UID); a
//! secondary Service naming the same public IP (`loadBalancerIP`, `azure-pip-name`) or, on the
//! internal load balancer, the same private address adds only its rules and probes on that
//! frontend and its name to the public IP's service tag; the NSG keeps the shared address for
//! each Service's ports; when one Service goes only its rules go; the frontend and the public
//! IP go with the last user (the public IP only when the cluster made it).
//!
//! `an_upstream_made_shared_frontend_is_adopted_in_place` starts from the objects upstream
//! (cloud-provider-azure) leaves behind for two DNS Services on one address (TCP and UDP 53),
//! named and tagged as upstream names them, and checks ours changes nothing that carries
//! traffic.

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;

use ccm_core::cloud::LoadBalancer;
use k8s_openapi::api::core::v1::Service;
use serde_json::{Value, json};

use crate::fixture::{self, CLUSTER, Fixture, NSG};
use crate::load_balancer::{P, P2, UID, UID2, id, ips, lb, nodes, pip, setup, svc};
use crate::support::put_upstream_public_ip;

const LB_TYPE: &str = "Microsoft.Network/loadBalancers";
const PIP_TYPE: &str = "Microsoft.Network/publicIPAddresses";

fn with_ip(mut s: Service, ip: &str) -> Service {
    if let Some(spec) = s.spec.as_mut() {
        spec.load_balancer_ip = Some(ip.to_string());
    }
    s
}

/// Names of a load balancer's children of `collection`, sorted.
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

/// Each rule's name → (its frontend's name, protocol, frontend port): what carries traffic.
fn rule_map(v: &Value) -> Vec<(String, String, String, i64)> {
    let mut out: Vec<_> = v["properties"]["loadBalancingRules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let p = &r["properties"];
            let fe = p["frontendIPConfiguration"]["id"].as_str().unwrap_or_default();
            (
                r["name"].as_str().unwrap().to_string(),
                fe.rsplit('/').next().unwrap().to_string(),
                p["protocol"].as_str().unwrap().to_string(),
                p["frontendPort"].as_i64().unwrap(),
            )
        })
        .collect();
    out.sort();
    out
}

/// NSG rules whose destinations include `ip`: (protocol, ports).
fn nsg_rules_for(f: &Fixture, ip: &str) -> Vec<(String, Vec<String>)> {
    let nsg = f.cloud.resource(&id(f, "Microsoft.Network/networkSecurityGroups", NSG)).unwrap();
    let mut out = Vec::new();
    for r in nsg["properties"]["securityRules"].as_array().into_iter().flatten() {
        let p = &r["properties"];
        let mut dst: Vec<&str> = p["destinationAddressPrefix"].as_str().into_iter().collect();
        dst.extend(
            p["destinationAddressPrefixes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str),
        );
        if dst.contains(&ip) {
            let mut ports: Vec<String> =
                p["destinationPortRange"].as_str().map(str::to_string).into_iter().collect();
            ports.extend(
                p["destinationPortRanges"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|x| x.as_str().map(str::to_string)),
            );
            out.push((p["protocol"].as_str().unwrap_or_default().to_string(), ports));
        }
    }
    out.sort();
    out
}

fn tcp(p: &str) -> (String, Vec<String>) {
    ("Tcp".into(), vec![p.into()])
}
fn udp(p: &str) -> (String, Vec<String>) {
    ("Udp".into(), vec![p.into()])
}

/// Upstream's objects for `dns-tcp` (primary, UID) and `dns-udp` (secondary, UID2, with
/// `loadBalancerIP`) on one public IP: the public IP `kubernetes-a<uid>` tagged for both
/// Services and the cluster, the load balancer `kubernetes` with the frontend `a<uid>`, the
/// pool `kubernetes`, the probe and rule of each Service (`<prefix>-<PROTO>-<port>`) on that
/// frontend. Returns the address.
fn upstream_world(f: &Fixture) -> String {
    let addr = "20.9.9.9";
    let pip_id = id(f, PIP_TYPE, &format!("{CLUSTER}-{P}"));
    put_upstream_public_ip(f, &pip_id, "default/dns-tcp,default/dns-udp", addr);
    let lb_id = id(f, LB_TYPE, CLUSTER);
    let fe_id = format!("{lb_id}/frontendIPConfigurations/{P}");
    let pool_id = format!("{lb_id}/backendAddressPools/{CLUSTER}");
    let rule = |prefix: &str, proto: &str, port: i64, probe: Option<&str>| {
        let mut r = json!({
            "name": format!("{prefix}-{}-{port}", proto.to_ascii_uppercase()),
            "id": format!("{lb_id}/loadBalancingRules/{prefix}-{}-{port}", proto.to_ascii_uppercase()),
            "properties": {
                "frontendIPConfiguration": {"id": fe_id}, "backendAddressPool": {"id": pool_id},
                "protocol": proto, "frontendPort": port, "backendPort": port,
                "enableFloatingIP": true, "idleTimeoutInMinutes": 4,
                "loadDistribution": "Default", "disableOutboundSnat": false,
            }
        });
        if proto == "Tcp" {
            r["properties"]["enableTcpReset"] = json!(true);
        }
        if let Some(p) = probe {
            r["properties"]["probe"] = json!({"id": format!("{lb_id}/probes/{p}")});
        }
        r
    };
    f.cloud
        .put_resource(
            &lb_id,
            json!({
                "sku": {"name": "Standard", "tier": "Regional"},
                "properties": {
                    "frontendIPConfigurations": [{"name": P, "id": fe_id,
                        "properties": {"publicIPAddress": {"id": pip_id}}}],
                    "backendAddressPools": [{"name": CLUSTER, "id": pool_id}],
                    "probes": [{"name": format!("{P}-TCP-53"), "id": format!("{lb_id}/probes/{P}-TCP-53"),
                        "properties": {"protocol": "Tcp", "port": 30053, "intervalInSeconds": 5,
                                       "probeThreshold": 2}}],
                    "loadBalancingRules": [
                        rule(P, "Tcp", 53, Some(&format!("{P}-TCP-53"))),
                        rule(P2, "Udp", 53, None),
                    ],
                }
            }),
        )
        .unwrap();
    addr.to_string()
}

#[tokio::test]
async fn an_upstream_made_shared_frontend_is_adopted_in_place() {
    let f = fixture::start().await;
    let addr = upstream_world(&f);
    let before = lb(&f, CLUSTER).unwrap();
    let lbs = setup(&f);
    let primary = svc(UID, "dns-tcp", &[(53, "TCP")], &[]);
    let secondary = with_ip(svc(UID2, "dns-udp", &[(53, "UDP")], &[]), &addr);

    let a = lbs.ensure_load_balancer(CLUSTER, &primary, &nodes()).await.unwrap();
    let b = lbs.ensure_load_balancer(CLUSTER, &secondary, &nodes()).await.unwrap();
    let want: Vec<IpAddr> = vec![addr.parse().unwrap()];
    assert_eq!(ips(&a), want, "the primary keeps its address");
    assert_eq!(ips(&b), want, "the secondary gets the same address");

    // What carries traffic is as upstream left it: one frontend on the same public IP, both
    // Services' rules on it, the public IP kept with both Services in its tag.
    let after = lb(&f, CLUSTER).unwrap();
    assert_eq!(names(&after, "frontendIPConfigurations"), vec![P.to_string()]);
    assert_eq!(
        after["properties"]["frontendIPConfigurations"],
        before["properties"]["frontendIPConfigurations"]
    );
    assert_eq!(rule_map(&after), rule_map(&before));
    let p = pip(&f, &format!("{CLUSTER}-{P}")).unwrap();
    assert_eq!(p["properties"]["ipAddress"], addr.as_str());
    assert_eq!(p["tags"]["k8s-azure-service"], "default/dns-tcp,default/dns-udp");
    assert_eq!(
        f.cloud.resources(PIP_TYPE).len(),
        2,
        "no new public IP (vm-0's and the shared one)"
    );
    assert_eq!(nsg_rules_for(&f, &addr), vec![tcp("53"), udp("53")]);
    // A re-sync of either writes nothing.
    let puts = f.server.counters().matching("network.*.create_or_update");
    lbs.ensure_load_balancer(CLUSTER, &primary, &nodes()).await.unwrap();
    lbs.ensure_load_balancer(CLUSTER, &secondary, &nodes()).await.unwrap();
    assert_eq!(f.server.counters().matching("network.*.create_or_update"), puts);
    eprintln!(
        "adopting upstream's shared frontend: {puts} PUTs (the load balancer {} times)",
        f.server.counters().matching("network.load_balancers.create_or_update")
    );

    // The primary goes first: only its rule and probe; the frontend, the public IP and the
    // secondary's NSG rule stay.
    lbs.ensure_load_balancer_deleted(CLUSTER, &primary).await.unwrap();
    let l = lb(&f, CLUSTER).unwrap();
    assert_eq!(names(&l, "frontendIPConfigurations"), vec![P.to_string()]);
    assert_eq!(names(&l, "loadBalancingRules"), vec![format!("{P2}-UDP-53")]);
    assert_eq!(names(&l, "probes"), Vec::<String>::new());
    let p = pip(&f, &format!("{CLUSTER}-{P}")).expect("the shared public IP stays");
    assert_eq!(p["tags"]["k8s-azure-service"], "default/dns-udp");
    assert_eq!(nsg_rules_for(&f, &addr), vec![udp("53")]);
    assert_eq!(
        lbs.get_load_balancer(CLUSTER, &secondary).await.unwrap().map(|s| ips(&s)),
        Some(want.clone())
    );
    // Nothing is an orphan while the secondary uses the frontend.
    assert!(lbs.list_cloud_load_balancers(CLUSTER).await.unwrap().is_empty());
    // The secondary's re-sync writes nothing.
    let puts = f.server.counters().matching("network.*.create_or_update");
    lbs.ensure_load_balancer(CLUSTER, &secondary, &nodes()).await.unwrap();
    assert_eq!(f.server.counters().matching("network.*.create_or_update"), puts);

    // The last user goes: the frontend, the emptied load balancer and the cluster's public IP.
    lbs.ensure_load_balancer_deleted(CLUSTER, &secondary).await.unwrap();
    assert!(lb(&f, CLUSTER).is_none(), "the load balancer went with its last frontend");
    assert!(
        pip(&f, &format!("{CLUSTER}-{P}")).is_none(),
        "the cluster's public IP went with its last Service"
    );
    assert!(nsg_rules_for(&f, &addr).is_empty());
}

#[tokio::test]
async fn a_second_service_joins_a_frontend_by_its_address_and_a_users_ip_is_never_deleted() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    // A user's public IP (no service tag), named by both Services.
    let user_pip = id(&f, PIP_TYPE, "user-ip");
    f.cloud
        .put_resource(
            &user_pip,
            json!({"sku": {"name": "Standard"}, "properties": {"publicIPAllocationMethod": "Static",
                "publicIPAddressVersion": "IPv4", "ipAddress": "20.8.8.8"}}),
        )
        .unwrap();
    let name = ("service.beta.kubernetes.io/azure-pip-name", "user-ip");
    let web = svc(UID, "web", &[(80, "TCP"), (443, "TCP")], &[name]);
    let extra = svc(UID2, "extra", &[(8080, "TCP")], &[name]);
    lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    let st = lbs.ensure_load_balancer(CLUSTER, &extra, &nodes()).await.unwrap();
    assert_eq!(ips(&st), vec!["20.8.8.8".parse::<IpAddr>().unwrap()]);
    let l = lb(&f, CLUSTER).unwrap();
    assert_eq!(names(&l, "frontendIPConfigurations"), vec![P.to_string()]);
    assert!(rule_map(&l).iter().all(|(_, fe, _, _)| fe == P), "{:?}", rule_map(&l));
    assert_eq!(rule_map(&l).len(), 3);
    assert_eq!(nsg_rules_for(&f, "20.8.8.8").len(), 2, "80+443 and 8080");
    let p = f.cloud.resource(&user_pip).unwrap();
    assert!(p["tags"]["k8s-azure-service"].is_null(), "a user's public IP is never tagged: {p}");

    // A rule of the second Service on a port the first one uses is a conflict, not a takeover.
    let clash = svc(UID2, "extra", &[(80, "TCP")], &[name]);
    assert!(lbs.ensure_load_balancer(CLUSTER, &clash, &nodes()).await.is_err());
    assert_eq!(rule_map(&lb(&f, CLUSTER).unwrap()).len(), 3);

    lbs.ensure_load_balancer_deleted(CLUSTER, &web).await.unwrap();
    let l = lb(&f, CLUSTER).unwrap();
    assert_eq!(names(&l, "frontendIPConfigurations"), vec![P.to_string()]);
    assert_eq!(names(&l, "loadBalancingRules"), vec![format!("{P2}-TCP-8080")]);
    assert_eq!(nsg_rules_for(&f, "20.8.8.8"), vec![tcp("8080")]);
    lbs.ensure_load_balancer_deleted(CLUSTER, &extra).await.unwrap();
    assert!(lb(&f, CLUSTER).is_none());
    assert!(f.cloud.resource(&user_pip).is_some(), "a user's public IP is never deleted");
}

#[tokio::test]
async fn internal_services_share_one_private_address() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let internal = ("service.beta.kubernetes.io/azure-load-balancer-internal", "true");
    let ip = ("service.beta.kubernetes.io/azure-load-balancer-ipv4", "10.240.3.3");
    let a = svc(UID, "dns-tcp", &[(53, "TCP")], &[internal, ip]);
    let b = svc(UID2, "dns-udp", &[(53, "UDP")], &[internal, ip]);
    let sa = lbs.ensure_load_balancer(CLUSTER, &a, &nodes()).await.unwrap();
    let sb = lbs.ensure_load_balancer(CLUSTER, &b, &nodes()).await.unwrap();
    assert_eq!(ips(&sa), ips(&sb));
    let name = format!("{CLUSTER}-internal");
    let l = lb(&f, &name).unwrap();
    assert_eq!(names(&l, "frontendIPConfigurations"), vec![P.to_string()]);
    assert_eq!(
        rule_map(&l),
        vec![
            (format!("{P2}-UDP-53"), P.to_string(), "Udp".into(), 53),
            (format!("{P}-TCP-53"), P.to_string(), "Tcp".into(), 53)
        ]
    );
    lbs.ensure_load_balancer_deleted(CLUSTER, &a).await.unwrap();
    let l = lb(&f, &name).unwrap();
    assert_eq!(names(&l, "frontendIPConfigurations"), vec![P.to_string()]);
    assert_eq!(names(&l, "loadBalancingRules"), vec![format!("{P2}-UDP-53")]);
    assert_eq!(ips(&lbs.get_load_balancer(CLUSTER, &b).await.unwrap().unwrap()), ips(&sb));
    lbs.ensure_load_balancer_deleted(CLUSTER, &b).await.unwrap();
    assert!(lb(&f, &name).is_none());
}
