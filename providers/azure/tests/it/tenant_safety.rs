//! Tenant safety (issue #29) against the emulator: a Service's annotations that name ARM
//! resources cannot splice the ARM URL (`..`, `?`, `#`, `/`) to reach another resource, name
//! only the resource groups the config allows, and `azure-additional-public-ips` never puts
//! an address kube-proxy would capture in-cluster traffic for into the status.

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ccm_core::cloud::LoadBalancer;
use serde_json::json;

use crate::fixture::{self, CLUSTER, NSG};
use crate::load_balancer::{UID, UID2, arm_calls, id, invalid_what, nodes, setup, svc};

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
