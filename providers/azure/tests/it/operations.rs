//! ARM's long-running operations that end `Failed` or `Canceled`, and a slow ARM (the
//! emulator's `realistic` timing, scaled): each failure branch of the load balancer's writes
//! is an error naming the operation, deletes nothing, and the next sync converges (issue 31).

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use ccm_core::cloud::LoadBalancer;
use ccm_emulators::admin::{ActionMatch, TimingProfile};
use ccm_emulators::asyncop::Action;
use ccm_provider_azure::client::api_version::NETWORK;
use serde_json::Value;

use crate::fixture::{self, CLUSTER};
use crate::load_balancer::{P, UID, ips, lb, nodes, pip, setup, svc};

const LB_PUT: &str = "network.load_balancers.create_or_update";
const PIP_PUT: &str = "network.public_ip_addresses.create_or_update";

fn state(v: &Value) -> &str {
    v["properties"]["provisioningState"].as_str().unwrap_or_default()
}

fn pip_name() -> String {
    format!("{CLUSTER}-{P}")
}

#[tokio::test]
async fn a_load_balancer_operation_that_fails_is_an_error_naming_it_and_the_next_sync_converges() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    let admin = f.server.admin();
    admin
        .fail_operations(
            "*/providers/Microsoft.Network/loadBalancers/kubernetes",
            Action::Create,
            1,
            "Internal error while programming load balancer kubernetes.",
        )
        .await
        .unwrap();

    let err = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap_err().to_string();
    assert!(
        err.contains(LB_PUT)
            && err.contains("operation Failed")
            && err.contains("Internal error while programming load balancer kubernetes"),
        "the error names the operation, its status and ARM's message: {err}"
    );
    // ARM leaves the load balancer Failed; nothing was deleted: the public IP stays.
    let l = lb(&f, CLUSTER).expect("the load balancer stays after its operation failed");
    assert_eq!(state(&l), "Failed");
    let p = pip(&f, &pip_name()).expect("the Service's public IP stays");
    assert_eq!(state(&p), "Succeeded");
    assert_eq!(f.server.counters().matching("network.*.delete"), 0, "nothing deleted");

    // The next sync puts the load balancer again (its body unchanged) and converges.
    let puts = f.server.counters().get(LB_PUT);
    let status = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    assert_eq!(f.server.counters().get(LB_PUT), puts + 1, "the Failed load balancer is put again");
    assert_eq!(state(&lb(&f, CLUSTER).unwrap()), "Succeeded");
    assert_eq!(
        ips(&status)[0].to_string(),
        pip(&f, &pip_name()).unwrap()["properties"]["ipAddress"].as_str().unwrap()
    );
    // And then stays: a third sync writes nothing.
    let puts = f.server.counters().matching("network.*.create_or_update");
    lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    assert_eq!(f.server.counters().matching("network.*.create_or_update"), puts);
}

#[tokio::test]
async fn a_public_ip_operation_that_fails_is_retried_by_putting_it_again() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    f.server
        .admin()
        .fail_operations(
            &format!("*/publicIPAddresses/{}", pip_name()),
            ActionMatch::Any,
            1,
            "Allocation of a public IP address failed.",
        )
        .await
        .unwrap();

    let err = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap_err().to_string();
    assert!(
        err.contains(PIP_PUT)
            && err.contains("Failed")
            && err.contains("Allocation of a public IP"),
        "{err}"
    );
    assert_eq!(state(&pip(&f, &pip_name()).unwrap()), "Failed");
    assert!(lb(&f, CLUSTER).is_none(), "no load balancer written on a Failed public IP");

    // ARM refuses a frontend on a public IP that is not Succeeded
    // (ReferencedResourceNotProvisioned): the next sync must put the public IP again first.
    let status = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    assert_eq!(state(&pip(&f, &pip_name()).unwrap()), "Succeeded");
    assert_eq!(state(&lb(&f, CLUSTER).unwrap()), "Succeeded");
    assert_eq!(ips(&status).len(), 1);
}

#[tokio::test]
async fn a_load_balancer_delete_that_fails_keeps_the_public_ip_and_the_next_sync_deletes_both() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    f.server
        .admin()
        .fail_operations("*/loadBalancers/kubernetes", Action::Delete, 1, "Deletion failed.")
        .await
        .unwrap();

    let err = lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap_err().to_string();
    assert!(
        err.contains("network.load_balancers.delete") && err.contains("Deletion failed"),
        "{err}"
    );
    assert_eq!(state(&lb(&f, CLUSTER).expect("a failed delete leaves it")), "Failed");
    assert!(pip(&f, &pip_name()).is_some(), "the public IP is not released before its frontend");

    lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
    assert!(lb(&f, CLUSTER).is_none());
    assert!(pip(&f, &pip_name()).is_none());
}

#[tokio::test]
async fn a_put_canceled_by_a_superseding_put_is_an_error_and_the_next_sync_converges() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    // Operations of 3 s; the Service gets a second port, and while that PUT runs someone
    // else puts the load balancer as it was (ARM cancels ours).
    f.cloud.set_lro(Duration::from_secs(3));
    let before = lb(&f, CLUSTER).unwrap();
    let s2 = svc(UID, "web", &[(80, "TCP"), (443, "TCP")], &[]);
    let task = {
        let lbs = setup(&f);
        let s2 = s2.clone();
        tokio::spawn(async move { lbs.ensure_load_balancer(CLUSTER, &s2, &nodes()).await })
    };
    let lb_id = before["id"].as_str().unwrap().to_string();
    let deadline = Instant::now() + Duration::from_secs(10);
    while lb(&f, CLUSTER).is_none_or(|l| state(&l) != "Updating") {
        assert!(Instant::now() < deadline, "our PUT never started");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut theirs = before.clone();
    theirs.as_object_mut().unwrap().remove("etag");
    let other = f.client.clone();
    let superseding = tokio::spawn(async move {
        other
            .put::<Value>("network.load_balancers.create_or_update", &lb_id, NETWORK, &theirs, None)
            .await
    });
    let err = task.await.unwrap().unwrap_err().to_string();
    assert!(
        err.contains(LB_PUT)
            && err.contains("Canceled")
            && err.contains("CanceledAndSupersededDueToAnotherOperation"),
        "{err}"
    );
    superseding.await.unwrap().unwrap();
    assert_eq!(f.server.counters().matching("network.*.delete"), 0, "nothing deleted");

    f.cloud.set_lro(Duration::from_millis(50));
    lbs.ensure_load_balancer(CLUSTER, &s2, &nodes()).await.unwrap();
    let l = lb(&f, CLUSTER).unwrap();
    assert_eq!(state(&l), "Succeeded");
    let rules: Vec<&str> = l["properties"]["loadBalancingRules"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["name"].as_str().unwrap())
        .collect();
    assert!(rules.contains(&format!("{P}-TCP-443").as_str()), "{rules:?}");
}

#[tokio::test]
async fn a_slow_arm_still_converges() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    // ARM's realistic durations at a twentieth: public IP create 0.3 s, load balancer
    // create 1 s, NIC and NSG updates 0.3 s.
    f.server.admin().set_timing(TimingProfile::Realistic, 0.05).await.unwrap();
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    let start = Instant::now();
    let status = lbs.ensure_load_balancer(CLUSTER, &s, &nodes()).await.unwrap();
    let took = start.elapsed();
    eprintln!("ensure against the realistic timing ×0.05: {took:?}");
    assert_eq!(ips(&status).len(), 1);
    assert_eq!(state(&lb(&f, CLUSTER).unwrap()), "Succeeded");
    assert!(
        took >= Duration::from_millis(300 + 1000 + 300),
        "the realistic profile applies (public IP, load balancer, NSG in sequence): {took:?}"
    );
    let start = Instant::now();
    lbs.ensure_load_balancer_deleted(CLUSTER, &s).await.unwrap();
    eprintln!("delete against the realistic timing ×0.05: {:?}", start.elapsed());
    assert!(lb(&f, CLUSTER).is_none() && pip(&f, &pip_name()).is_none());
}
