//! Tenant safety (issue #29) against the emulator: a Service's annotations that name ARM
//! resources cannot splice the ARM URL (`..`, `?`, `#`, `/`) to reach another resource, name
//! only the resource groups the config allows, and `azure-additional-public-ips` never puts
//! an address kube-proxy would capture in-cluster traffic for into the status. A public IP
//! tagged for another cluster, or for a Service of another namespace, is never re-tagged,
//! used or reported.

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::sync::Arc;

use ccm_core::cloud::LoadBalancer;
use ccm_provider_azure::load_balancer::AzureLoadBalancer;
use serde_json::json;

use crate::fixture::{self, CLUSTER, NSG};
use crate::load_balancer::{UID, UID2, arm_calls, id, invalid_what, ips, nodes, pip, setup, svc};

const PIP_NAME: &str = "service.beta.kubernetes.io/azure-pip-name";
const RESOURCE_GROUP: &str = "service.beta.kubernetes.io/azure-load-balancer-resource-group";
const INTERNAL: &str = "service.beta.kubernetes.io/azure-load-balancer-internal";
const INTERNAL_SUBNET: &str = "service.beta.kubernetes.io/azure-load-balancer-internal-subnet";
const DNS_LABEL: &str = "service.beta.kubernetes.io/azure-dns-label-name";
const ADDITIONAL: &str = "service.beta.kubernetes.io/azure-additional-public-ips";

#[tokio::test]
async fn annotations_naming_arm_resources_cannot_splice_the_arm_url() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let nsg_id = id(&f, "Microsoft.Network/networkSecurityGroups", NSG);
    let nsg_before = f.cloud.resource(&nsg_id).unwrap();
    let cases: [(&str, &str, bool); 4] = [
        // `..` walks from the public IP to the cluster's security group (and a DNS label
        // would be written onto it).
        (PIP_NAME, "../networkSecurityGroups/k8s-nsg", false),
        // `?` ends the path at the security group and chooses the api-version.
        (
            RESOURCE_GROUP,
            "rg/providers/Microsoft.Network/networkSecurityGroups/k8s-nsg?api-version=2019-02-01&x=",
            false,
        ),
        // `..` from the subnet up to the security group.
        (INTERNAL_SUBNET, "../../../networkSecurityGroups/k8s-nsg", true),
        // `#` cuts the rest of the path off.
        (RESOURCE_GROUP, "rg/providers/Microsoft.Network/networkSecurityGroups/k8s-nsg#", false),
    ];
    for (i, (key, value, internal)) in cases.into_iter().enumerate() {
        let mut a = vec![(key, value), (DNS_LABEL, "pwned")];
        if internal {
            a.push((INTERNAL, "true"));
        }
        let s = svc(UID, &format!("evil-{i}"), &[(80, "TCP")], &a);
        let calls = arm_calls(&f);
        let r = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await;
        let nsg_after = f.cloud.resource(&nsg_id).unwrap();
        assert_eq!(nsg_after, nsg_before, "{key}={value:?} reached the security group");
        assert_eq!(arm_calls(&f), calls, "{key}={value:?}: no ARM call before it is refused");
        let message = format!("{r:?}");
        assert_eq!(invalid_what(r), key, "{key}={value:?}");
        assert!(!message.contains("api-version=2019"), "the whole value is quoted: {message}");
    }
    // Nothing of the Services was made.
    assert_eq!(f.server.counters().matching("network.*.create_or_update"), 0);
}

#[tokio::test]
async fn a_service_names_only_the_resource_groups_the_config_allows() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    // Another team's public IP in another resource group.
    let theirs = format!(
        "/subscriptions/{}/resourceGroups/other-rg/providers/Microsoft.Network/publicIPAddresses/their-ip",
        fixture::SUBSCRIPTION
    );
    f.cloud
        .put_resource(&theirs, json!({"sku": {"name": "Standard"}, "properties": {"ipAddress": "20.9.9.9", "publicIPAllocationMethod": "Static"}}))
        .unwrap();
    let before = f.cloud.resource(&theirs).unwrap();
    let s =
        svc(UID, "evil", &[(80, "TCP")], &[(RESOURCE_GROUP, "other-rg"), (PIP_NAME, "their-ip")]);
    let calls = arm_calls(&f);
    let r = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await;
    assert_eq!(invalid_what(r), RESOURCE_GROUP);
    assert_eq!(arm_calls(&f), calls, "refused before any ARM call");
    assert_eq!(f.cloud.resource(&theirs).unwrap(), before, "their public IP is untouched");
    assert!(
        f.cloud.resource(&id(&f, "Microsoft.Network/loadBalancers", CLUSTER)).is_none(),
        "nothing was made"
    );
}

#[tokio::test]
async fn additional_public_ips_are_off_by_default_and_never_reach_the_status() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    // The IMDS address: kube-proxy would send every Pod's metadata request to this Service.
    let s = svc(UID2, "evil", &[(80, "TCP")], &[(ADDITIONAL, "169.254.169.254")]);
    let r = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await;
    if let Ok(status) = &r {
        assert!(
            !format!("{status:?}").contains("169.254.169.254"),
            "the IMDS address is in the Service's status: {status:?}"
        );
    }
    assert_eq!(invalid_what(r), ADDITIONAL);
}

#[tokio::test]
async fn a_resource_group_the_config_allows_is_used_and_nothing_there_is_adopted() {
    let f = fixture::start().await;
    let theirs = format!(
        "/subscriptions/{}/resourceGroups/other-rg/providers/Microsoft.Network/publicIPAddresses/their-ip",
        fixture::SUBSCRIPTION
    );
    f.cloud
        .put_resource(&theirs, json!({"sku": {"name": "Standard"}, "tags": {"team": "ips"}, "properties": {"ipAddress": "20.9.9.9", "publicIPAllocationMethod": "Static"}}))
        .unwrap();
    let mut config = (*f.config).clone();
    config.service_resource_groups = Some("rg, other-rg".into());
    assert!(config.validate_names().is_ok());
    let lbs = AzureLoadBalancer::new(f.client.clone(), Arc::new(config));
    let s =
        svc(UID, "web", &[(80, "TCP")], &[(RESOURCE_GROUP, "other-rg"), (PIP_NAME, "their-ip")]);
    let status = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    assert_eq!(ips(&status), vec!["20.9.9.9".parse::<IpAddr>().unwrap()]);
    assert_eq!(f.cloud.resource(&theirs).unwrap()["tags"], json!({"team": "ips"}), "not re-tagged");
    lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
    assert!(f.cloud.resource(&theirs).is_some(), "used, never deleted");

    // A name breaking ARM's rules in the list is refused at start.
    let mut bad = (*f.config).clone();
    bad.service_resource_groups = Some("rg,../x".into());
    let e = bad.validate().unwrap_err().to_string();
    assert!(e.contains("serviceResourceGroups"), "{e}");
}

#[tokio::test]
async fn allowed_additional_public_ips_are_only_public_ips_the_cluster_may_use() {
    let f = fixture::start().await;
    let mut config = (*f.config).clone();
    config.allow_additional_public_ips = true;
    let lbs = AzureLoadBalancer::new(f.client.clone(), Arc::new(config));
    // A firewall's public IP the operator made (unattached here).
    f.cloud
        .put_resource(
            &id(&f, "Microsoft.Network/publicIPAddresses", "firewall-ip"),
            json!({"sku": {"name": "Standard"}, "properties": {"ipAddress": "20.1.2.3", "publicIPAllocationMethod": "Static"}}),
        )
        .unwrap();
    let victim = svc(UID, "victim", &[(80, "TCP")], &[]);
    let victim_ip = ips(&lbs.ensure_load_balancer(CLUSTER, &victim, &nodes()).await.unwrap())[0];

    let s = svc(UID2, "web", &[(443, "TCP")], &[(ADDITIONAL, "20.1.2.3")]);
    let status = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    assert!(ips(&status).contains(&"20.1.2.3".parse().unwrap()), "{status:?}");
    lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();

    let victim_ip = victim_ip.to_string();
    for (bad, why) in [
        ("169.254.169.254", "link-local"),
        ("10.240.0.4", "private"),
        ("20.0.0.4", "network interface"), // vm-0's own public IP
        (victim_ip.as_str(), "another Service"),
        ("20.7.7.7", "not the address of a public IP"),
    ] {
        let s = svc(UID2, "evil", &[(443, "TCP")], &[(ADDITIONAL, bad)]);
        let calls = f.server.counters().matching("network.*.create_or_update");
        let r = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await;
        let message = format!("{r:?}");
        assert_eq!(invalid_what(r), ADDITIONAL, "{bad}");
        assert!(message.contains(why), "{bad}: {message}");
        assert_eq!(
            f.server.counters().matching("network.*.create_or_update"),
            calls,
            "{bad}: refused before any write"
        );
    }
}

/// A Service of namespace `ns`.
fn in_namespace(
    uid: &str,
    ns: &str,
    name: &str,
    a: &[(&str, &str)],
) -> k8s_openapi::api::core::v1::Service {
    let mut s = svc(uid, name, &[(443, "TCP")], a);
    s.metadata.namespace = Some(ns.into());
    s
}

#[tokio::test]
async fn a_public_ip_of_another_cluster_or_namespace_is_never_retagged_used_or_reported() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    // Tagged as upstream's manager of cluster `othercluster` tags its Service's public IP;
    // this cluster's public IP of a Service in another namespace; and a legacy one (no
    // cluster tag) of a Service in another namespace.
    let planted = [
        (
            "othercluster-a0f1e2d3c4b5a69788796a5b4c3d2e1f",
            "20.1.2.3",
            json!({"k8s-azure-cluster-name": "othercluster", "k8s-azure-service": "tenant-a/victim"}),
        ),
        (
            "victim-ip",
            "20.1.2.6",
            json!({"k8s-azure-cluster-name": CLUSTER, "k8s-azure-service": "tenant-a/victim"}),
        ),
        ("legacy-ip", "20.1.2.7", json!({"k8s-azure-service": "tenant-a/victim"})),
    ];
    for (name, address, tags) in &planted {
        f.cloud
            .put_resource(
                &id(&f, "Microsoft.Network/publicIPAddresses", name),
                json!({"sku": {"name": "Standard"}, "tags": tags, "properties": {"ipAddress": address, "publicIPAllocationMethod": "Static"}}),
            )
            .unwrap();
    }
    let lb_id = id(&f, "Microsoft.Network/loadBalancers", CLUSTER);
    for (name, address, _) in &planted {
        let before = pip(&f, name).unwrap();
        for by_address in [false, true] {
            let mut s = if by_address {
                in_namespace(UID2, "tenant-b", "attack-1", &[])
            } else {
                in_namespace(UID2, "tenant-b", "attack-1", &[(PIP_NAME, name)])
            };
            if by_address {
                s.spec.as_mut().unwrap().load_balancer_ip = Some(address.to_string());
            }
            let case = format!("{name} by {}", if by_address { "loadBalancerIP" } else { "name" });
            let r = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await;
            if let Ok(status) = &r {
                assert!(
                    !format!("{status:?}").contains(address),
                    "{case}: the attacker reports {address}: {status:?}"
                );
            }
            let message = format!("{r:?}");
            assert_eq!(
                invalid_what(r),
                if by_address { "loadBalancerIP" } else { PIP_NAME },
                "{case}"
            );
            assert!(message.contains(name), "{case}: the message names the public IP: {message}");
            assert_eq!(pip(&f, name).unwrap(), before, "{case}: the public IP was rewritten");
            assert!(f.cloud.resource(&lb_id).is_none(), "{case}: a load balancer was made");
            lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
            assert_eq!(pip(&f, name).unwrap(), before, "{case}: changed by the deletion");
        }
    }
    assert_eq!(f.server.counters().matching("network.*.create_or_update"), 0, "nothing written");
}

#[tokio::test]
async fn a_public_ip_of_this_cluster_and_namespace_may_be_shared_and_is_given_back() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let name = "team-ip";
    let tags = json!({"k8s-azure-cluster-name": CLUSTER, "k8s-azure-service": "tenant-b/other"});
    f.cloud
        .put_resource(
            &id(&f, "Microsoft.Network/publicIPAddresses", name),
            json!({"sku": {"name": "Standard"}, "tags": tags, "properties": {"ipAddress": "20.1.2.8", "publicIPAllocationMethod": "Static"}}),
        )
        .unwrap();
    let s = in_namespace(UID, "tenant-b", "web", &[(PIP_NAME, name)]);
    let status = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    assert_eq!(ips(&status), vec!["20.1.2.8".parse::<IpAddr>().unwrap()]);
    assert_eq!(pip(&f, name).unwrap()["tags"]["k8s-azure-service"], "tenant-b/other,tenant-b/web");
    lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
    let after = pip(&f, name).expect("still tagged for tenant-b/other: kept");
    assert_eq!(after["tags"]["k8s-azure-service"], "tenant-b/other");
}
