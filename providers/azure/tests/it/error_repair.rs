//! Error repair as upstream (issue #33 item 7), each on an emulator rule the Go SDK fidelity
//! program checks (`ci/fidelity/azure`): a public IP stuck `Updating` makes ARM refuse the
//! frontend (`ReferencedResourceNotProvisioned`): the Service's own public IP is put again and
//! the next sync converges; ARM refusing to delete a public IP still in use
//! (`PublicIPAddressCannotBeDeleted`) does not hold up the Service's removal; a scale-set VM
//! being deleted is left alone; a create answered 201 without an operation header is read
//! until it settles.

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ccm_core::cloud::{LoadBalancer, ProviderError};
use ccm_emulators::azure::AzureOptions;
use ccm_provider_azure::client::api_version::NETWORK;
use ccm_provider_azure::client::models::PublicIpAddress;
use serde_json::{Value, json};

use crate::fixture::{self, CLUSTER, vmss_provider_id};
use crate::load_balancer::{P, UID, id, ips, lb, nodes, pip, setup, svc};

const PIP_TYPE: &str = "Microsoft.Network/publicIPAddresses";

fn state(v: &Value) -> &str {
    v["properties"]["provisioningState"].as_str().unwrap_or_default()
}

#[tokio::test]
async fn a_public_ip_stuck_updating_is_put_again_when_arm_refuses_the_frontend() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    let name = format!("{CLUSTER}-{P}");
    // The Service's public IP exists (tagged for it) but ARM left it Updating.
    lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
    let pip_id = id(&f, PIP_TYPE, &name);
    f.cloud
        .put_resource(
            &pip_id,
            json!({"sku": {"name": "Standard", "tier": "Regional"},
                   "tags": {"k8s-azure-service": "default/web", "k8s-azure-cluster-name": CLUSTER},
                   "properties": {"publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4",
                                  "ipAddress": "20.7.7.7"}}),
        )
        .unwrap();
    assert!(f.cloud.set_provisioning_state(&pip_id, "Updating"));

    let puts = f.server.counters().get("network.public_ip_addresses.create_or_update");
    match lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await {
        Err(ProviderError::RetryAfter { message, .. }) => {
            assert!(message.contains("ReferencedResourceNotProvisioned"), "{message}")
        }
        other => panic!("want a retry naming ReferencedResourceNotProvisioned, got {other:?}"),
    }
    assert_eq!(
        f.server.counters().get("network.public_ip_addresses.create_or_update"),
        puts + 1,
        "the stuck public IP is put again"
    );
    assert_eq!(state(&pip(&f, &name).unwrap()), "Succeeded");
    let st = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    assert_eq!(ips(&st), vec!["20.7.7.7".parse::<std::net::IpAddr>().unwrap()]);
    assert_eq!(state(&lb(&f, CLUSTER).unwrap()), "Succeeded");
}

#[tokio::test]
async fn a_named_public_ip_stuck_updating_is_never_rewritten() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let user = id(&f, PIP_TYPE, "user-ip");
    f.cloud
        .put_resource(
            &user,
            json!({"sku": {"name": "Standard"}, "properties": {"publicIPAllocationMethod": "Static",
                   "publicIPAddressVersion": "IPv4", "ipAddress": "20.6.6.6"}}),
        )
        .unwrap();
    assert!(f.cloud.set_provisioning_state(&user, "Updating"));
    let s = svc(
        UID,
        "web",
        &[(80, "TCP")],
        &[("service.beta.kubernetes.io/azure-pip-name", "user-ip")],
    );
    let puts = f.server.counters().get("network.public_ip_addresses.create_or_update");
    assert!(lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.is_err());
    assert_eq!(
        f.server.counters().get("network.public_ip_addresses.create_or_update"),
        puts,
        "a user's public IP is not put"
    );
    assert_eq!(state(&f.cloud.resource(&user).unwrap()), "Updating");
}

#[tokio::test]
async fn a_public_ip_arm_will_not_delete_does_not_hold_up_the_services_removal() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    let name = format!("{CLUSTER}-{P}");
    let pip_id = pip(&f, &name).unwrap()["id"].as_str().unwrap().to_string();
    // Something else (a NIC) holds the Service's public IP too when the Service goes: ARM
    // answers its delete 400 PublicIPAddressCannotBeDeleted.
    let nic_id = id(&f, "Microsoft.Network/networkInterfaces", "vm-1-nic");
    let mut nic = f.cloud.resource(&nic_id).unwrap();
    nic["properties"]["ipConfigurations"][0]["properties"]["publicIPAddress"] =
        json!({"id": pip_id});
    f.cloud.put_resource(&nic_id, nic).unwrap();

    lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
    assert_eq!(f.server.counters().get("network.public_ip_addresses.delete"), 1, "tried once");
    let left: Option<PublicIpAddress> =
        f.client.get_opt("network.public_ip_addresses.get", &pip_id, NETWORK, &[]).await.unwrap();
    assert!(left.is_some(), "ARM refused the delete: the public IP stays, the Service is gone");
    assert!(lb(&f, CLUSTER).is_none(), "the load balancer went");
}

#[tokio::test]
async fn a_scale_set_vm_being_deleted_is_left_alone() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let vm1 = f.cloud.instance_resource_id("pool-1").unwrap();
    // Compute is deleting pool-1.
    assert!(f.cloud.set_provisioning_state(&vm1, "Deleting"));
    let ns: Vec<_> = (0..3)
        .map(|i| fixture::node(&format!("pool-{i}"), Some(&vmss_provider_id("pool", i))))
        .collect();
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    lbs.ensure_load_balancer(CLUSTER, &s, &ns).await.unwrap();
    let updates = f.server.counters().get("compute.virtual_machine_scale_set_vms.update");
    assert_eq!(updates, 2, "pool-0 and pool-2 joined; pool-1, being deleted, was not updated");
    let v = f.cloud.resource(&vm1).unwrap();
    assert!(
        !v["properties"]["networkProfileConfiguration"].to_string().contains("backendAddressPools"),
        "{v}"
    );
}

#[tokio::test]
async fn a_create_answered_201_without_an_operation_header_is_read_until_it_settles() {
    let opts = AzureOptions { lro: Duration::from_millis(400), ..AzureOptions::default() };
    let f = fixture::start_with(fixture::WORLD, opts, |_| {}).await;
    f.cloud.set_put_without_operation_header(true);
    let lbs = setup(&f);
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    // The public IP and the load balancer are created with 201 and no operation header; each
    // is read until Succeeded before the next step uses it.
    let st = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    assert_eq!(ips(&st).len(), 1);
    assert_eq!(state(&pip(&f, &format!("{CLUSTER}-{P}")).unwrap()), "Succeeded");
    assert_eq!(state(&lb(&f, CLUSTER).unwrap()), "Succeeded");
    let reads = f.server.counters().get("network.public_ip_addresses.get");
    assert!(reads >= 2, "the public IP was read until it settled ({reads} reads)");
}
