//! A Service's rules in the cluster's network security group against the emulator: names,
//! sources, destinations, ports and unique priorities; shared rules; operator rules left
//! alone; `azure-disable-load-balancer-nsg-rule`; bad annotations.
// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;

use ccm_core::cloud::ProviderError;
use ccm_provider_azure::load_balancer::security_group::{
    ALLOWED_IP_RANGES, DENY_ALL_EXCEPT_SOURCE_RANGES, DISABLE_NSG_RULE, SecurityGroup,
    allow_rule_name,
};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;
use serde_json::{Value, json};

use crate::fixture::{self, Fixture, NSG, RESOURCE_GROUP};

const NSG_PUT: &str = "network.network_security_groups.create_or_update";

fn service(
    name: &str,
    annotations: &[(&str, &str)],
    ranges: &[&str],
    ports: &[(i32, &str)],
) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            load_balancer_source_ranges: (!ranges.is_empty())
                .then(|| ranges.iter().map(|r| r.to_string()).collect()),
            ports: Some(
                ports
                    .iter()
                    .map(|(p, proto)| ServicePort {
                        port: *p,
                        node_port: Some(30000 + p % 1000),
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

fn nsg_id(f: &Fixture) -> String {
    f.client.resource_id(RESOURCE_GROUP, "Microsoft.Network/networkSecurityGroups", NSG).unwrap()
}

fn rules(f: &Fixture) -> Vec<Value> {
    f.cloud.resource(&nsg_id(f)).unwrap()["properties"]["securityRules"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

fn rule(f: &Fixture, name: &str) -> Option<Value> {
    rules(f).into_iter().find(|r| r["name"] == name)
}

/// An operator's own rule at priority 500 (the first one a managed rule would take).
fn operator_rule(f: &Fixture) {
    let mut nsg = f.cloud.resource(&nsg_id(f)).unwrap();
    nsg["properties"]["securityRules"] = json!([{
        "name": "operator-ssh",
        "properties": {"priority": 500, "direction": "Inbound", "access": "Allow", "protocol": "Tcp",
            "sourceAddressPrefix": "10.0.0.0/8", "sourcePortRange": "*",
            "destinationAddressPrefix": "*", "destinationPortRange": "22"}
    }]);
    f.cloud.put_resource(&nsg_id(f), nsg).unwrap();
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

fn puts(f: &Fixture) -> u64 {
    f.server.counters().get(NSG_PUT)
}

#[tokio::test]
async fn a_public_service_gets_internet_rules_and_services_with_the_same_ports_share_one() {
    let f = fixture::start().await;
    operator_rule(&f);
    let operator = rule(&f, "operator-ssh").unwrap();
    let sg = SecurityGroup::new(f.client.clone(), f.config.clone());
    let a = service("a", &[], &[], &[(80, "TCP"), (443, "TCP"), (53, "UDP")]);
    let b = service("b", &[], &[], &[(443, "TCP"), (80, "TCP")]);

    sg.ensure_service_rules(&a, &[ip("20.0.0.1")]).await.unwrap();
    let tcp = allow_rule_name("Tcp", false, &["Internet".into()], &["80".into(), "443".into()]);
    let udp = allow_rule_name("Udp", false, &["Internet".into()], &["53".into()]);
    let r = rule(&f, &tcp).unwrap();
    let p = &r["properties"];
    assert_eq!(p["priority"], 501, "500 is the operator's");
    assert_eq!((p["access"].as_str(), p["direction"].as_str()), (Some("Allow"), Some("Inbound")));
    assert_eq!(p["protocol"], "Tcp");
    assert_eq!(p["sourceAddressPrefix"], "Internet");
    assert_eq!(p["sourcePortRange"], "*");
    assert_eq!(p["destinationAddressPrefix"], "20.0.0.1");
    assert_eq!(p["destinationPortRanges"], json!(["443", "80"]));
    let u = rule(&f, &udp).unwrap();
    assert_eq!(u["properties"]["priority"], 502);
    assert_eq!(u["properties"]["destinationPortRanges"], json!(["53"]));
    assert_eq!(puts(&f), 1);

    // Same again: no write.
    sg.ensure_service_rules(&a, &[ip("20.0.0.1")]).await.unwrap();
    assert_eq!(puts(&f), 1, "a re-sync with no change writes nothing");

    // b has the same protocol, sources and ports: it joins a's rule.
    sg.ensure_service_rules(&b, &[ip("20.0.0.2")]).await.unwrap();
    let r = rule(&f, &tcp).unwrap();
    assert_eq!(r["properties"]["destinationAddressPrefixes"], json!(["20.0.0.1", "20.0.0.2"]));
    assert_eq!(r["properties"]["priority"], 501);
    assert_eq!(rules(&f).len(), 3);

    // Removing a leaves b's address (and drops a's UDP rule); removing b drops the rule.
    sg.remove_service_rules(&a, &[ip("20.0.0.1")]).await.unwrap();
    let r = rule(&f, &tcp).unwrap();
    assert_eq!(r["properties"]["destinationAddressPrefix"], "20.0.0.2");
    assert!(r["properties"]["destinationAddressPrefixes"].as_array().is_none_or(|a| a.is_empty()));
    assert!(rule(&f, &udp).is_none());
    sg.remove_service_rules(&b, &[ip("20.0.0.2")]).await.unwrap();
    let left = rules(&f);
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0]["name"], "operator-ssh");
    assert_eq!(
        left[0]["properties"]["destinationPortRange"],
        operator["properties"]["destinationPortRange"]
    );
    assert_eq!(left[0]["properties"]["priority"], 500);
}

#[tokio::test]
async fn source_ranges_and_deny_all_and_a_changed_port_moves_the_address() {
    let f = fixture::start().await;
    let sg = SecurityGroup::new(f.client.clone(), f.config.clone());
    let svc = service(
        "restricted",
        &[(DENY_ALL_EXCEPT_SOURCE_RANGES, "true")],
        &["203.0.113.0/24", "198.51.100.0/24"],
        &[(8443, "TCP")],
    );
    sg.ensure_service_rules(&svc, &[ip("10.240.0.200"), ip("fd00::200")]).await.unwrap();
    let allow = allow_rule_name(
        "Tcp",
        false,
        &["198.51.100.0/24".into(), "203.0.113.0/24".into()],
        &["8443".into()],
    );
    let r = rule(&f, &allow).expect("allow rule for the ranges");
    assert_eq!(
        r["properties"]["sourceAddressPrefixes"],
        json!(["198.51.100.0/24", "203.0.113.0/24"])
    );
    assert_eq!(r["properties"]["destinationAddressPrefix"], "10.240.0.200");
    assert_eq!(r["properties"]["priority"], 500);
    assert!(
        rules(&f).iter().all(|r| r["properties"]["sourceAddressPrefix"] != "Internet"),
        "no Internet rule"
    );
    let deny = rule(&f, "k8s-azure-lb_deny-all_IPv4").expect("deny-all rule");
    assert_eq!(deny["properties"]["access"], "Deny");
    assert_eq!(deny["properties"]["priority"], 4095);
    assert_eq!(deny["properties"]["destinationPortRange"], "*");
    assert_eq!(deny["properties"]["destinationAddressPrefix"], "10.240.0.200");
    // The IPv6 frontend has no IPv6 source range: only the deny-all rule.
    let v6 = rule(&f, "k8s-azure-lb_deny-all_IPv6").expect("IPv6 deny-all rule");
    assert_eq!(v6["properties"]["priority"], 4094);
    assert_eq!(rules(&f).len(), 3);

    // The port changes: the address leaves the old rule (which goes) for a new one.
    let moved = service(
        "restricted",
        &[(DENY_ALL_EXCEPT_SOURCE_RANGES, "true")],
        &["203.0.113.0/24", "198.51.100.0/24"],
        &[(9443, "TCP")],
    );
    sg.ensure_service_rules(&moved, &[ip("10.240.0.200"), ip("fd00::200")]).await.unwrap();
    assert!(rule(&f, &allow).is_none());
    let new = allow_rule_name(
        "Tcp",
        false,
        &["198.51.100.0/24".into(), "203.0.113.0/24".into()],
        &["9443".into()],
    );
    assert_eq!(
        rule(&f, &new).unwrap()["properties"]["priority"],
        500,
        "the freed priority is reused"
    );
    assert_eq!(rules(&f).len(), 3);
}

#[tokio::test]
async fn disabled_nsg_rules_write_nothing_and_bad_annotations_are_invalid() {
    let f = fixture::start().await;
    let sg = SecurityGroup::new(f.client.clone(), f.config.clone());
    let off = service("off", &[(DISABLE_NSG_RULE, "true")], &[], &[(80, "TCP")]);
    sg.ensure_service_rules(&off, &[ip("20.0.0.9")]).await.unwrap();
    assert_eq!(puts(&f), 0);
    assert!(rules(&f).is_empty());

    let bad =
        service("bad", &[(ALLOWED_IP_RANGES, "10.0.0.0/8, 10.1.2.3/33")], &[], &[(80, "TCP")]);
    match sg.ensure_service_rules(&bad, &[ip("20.0.0.9")]).await {
        Err(ProviderError::Invalid { what, message }) => {
            assert_eq!(what, ALLOWED_IP_RANGES);
            assert!(message.contains("10.1.2.3/33"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(puts(&f), 0);
}

#[tokio::test]
async fn a_missing_security_group_is_a_clear_error() {
    let f = fixture::start().await;
    let mut config = (*f.config).clone();
    config.security_group_name = Some("no-such-nsg".into());
    let sg = SecurityGroup::new(f.client.clone(), Arc::new(config));
    let svc = service("a", &[], &[], &[(80, "TCP")]);
    let err = sg.ensure_service_rules(&svc, &[ip("20.0.0.1")]).await.unwrap_err();
    assert!(
        err.to_string().contains("no-such-nsg") && err.to_string().contains("does not exist"),
        "{err}"
    );
    // Removing rules from a security group that is not there: nothing to do.
    sg.remove_service_rules(&svc, &[ip("20.0.0.1")]).await.unwrap();
}
