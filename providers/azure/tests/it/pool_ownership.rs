//! Pool ownership as upstream (issue #33 item 6): a pool upstream filled (the Nodes' NICs and
//! an operator's own member) is adopted in place, the operator's member kept; with
//! `preConfiguredBackendPoolLoadBalancerTypes` the operator fills the pools: nodes are neither
//! added nor removed, and the load balancer is not deleted with its last frontend.

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ccm_core::cloud::LoadBalancer;
use ccm_emulators::azure::AzureOptions;
use serde_json::{Value, json};

use crate::fixture::{self, CLUSTER, Fixture};
use crate::load_balancer::{UID, id, lb, nodes, setup, svc};

/// The pool members of `kubernetes`'s pool `kubernetes`, as IP configuration IDs' tails.
fn members(f: &Fixture) -> Vec<String> {
    let l = lb(f, CLUSTER).unwrap();
    let mut out: Vec<String> =
        l["properties"]["backendAddressPools"][0]["properties"]["backendIPConfigurations"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let id = c["id"].as_str().unwrap();
                id[id.find("networkInterfaces/").unwrap()..].to_string()
            })
            .collect();
    out.sort();
    out
}

/// Upstream's load balancer `kubernetes` with its pool `kubernetes`, and these VMs' NICs in
/// it (as upstream and an operator left them).
fn upstream_pool(f: &Fixture, vms: &[&str]) {
    let lb_id = id(f, "Microsoft.Network/loadBalancers", CLUSTER);
    let pool_id = format!("{lb_id}/backendAddressPools/{CLUSTER}");
    f.cloud
        .put_resource(
            &lb_id,
            json!({"sku": {"name": "Standard", "tier": "Regional"},
                   "properties": {"frontendIPConfigurations": [],
                                  "backendAddressPools": [{"name": CLUSTER, "id": pool_id}]}}),
        )
        .unwrap();
    for vm in vms {
        let nic_id = id(f, "Microsoft.Network/networkInterfaces", &format!("{vm}-nic"));
        let mut nic: Value = f.cloud.resource(&nic_id).unwrap();
        nic["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"] =
            json!([{"id": pool_id}]);
        f.cloud.put_resource(&nic_id, nic).unwrap();
    }
}

#[tokio::test]
async fn an_upstream_filled_pool_is_adopted_with_the_operators_member_kept() {
    let f = fixture::start().await;
    // vm-0 and vm-1 are Nodes; vm-2 is the operator's (a bastion), in the pool too.
    upstream_pool(&f, &["vm-0", "vm-1", "vm-2"]);
    let before = members(&f);
    let lbs = setup(&f);
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    assert_eq!(members(&f), before, "the pool carries the same members");
    assert_eq!(
        f.server.counters().get("network.network_interfaces.create_or_update"),
        0,
        "no NIC was written: every Node was already in"
    );
    // vm-1 leaves: only it goes; the operator's vm-2 stays.
    let one = vec![nodes().remove(0)];
    lbs.update_load_balancer(CLUSTER, &s, &one).await.unwrap();
    assert_eq!(
        members(&f),
        vec![
            "networkInterfaces/vm-0-nic/ipConfigurations/ipconfig1".to_string(),
            "networkInterfaces/vm-2-nic/ipConfigurations/ipconfig1".to_string()
        ]
    );
}

#[tokio::test]
async fn pre_configured_pools_are_the_operators() {
    let opts = AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() };
    let f = fixture::start_with(fixture::WORLD, opts, |c| {
        c.pre_configured_backend_pool_load_balancer_types = Some("all".into());
    })
    .await;
    // The operator put vm-0 and vm-2 in; vm-1 is a Node they left out.
    upstream_pool(&f, &["vm-0", "vm-2"]);
    let before = members(&f);
    let lbs = setup(&f);
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    lbs.update_load_balancer(CLUSTER, &s, &nodes()[..1]).await.unwrap();
    assert_eq!(members(&f), before, "nodes neither added nor removed");
    assert_eq!(f.server.counters().get("network.network_interfaces.create_or_update"), 0);
    lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
    let l = lb(&f, CLUSTER).expect("a load balancer with pre-configured pools is kept");
    assert!(l["properties"]["frontendIPConfigurations"].as_array().is_none_or(Vec::is_empty));
    assert_eq!(members(&f), before);
}
