//! The provider against the emulator's failure and slowness profiles (issue 31): a load
//! balancer IBM leaves `failed`, one under IBM's maintenance, and realistic pending times
//! (minutes, scaled down).

use std::time::Duration;

use ccm_core::cloud::{LoadBalancer, ProviderError};
use ccm_emulators::asyncop::{Action, TimingProfile};
use k8s_openapi::api::core::v1::{Node, Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;
use serde_json::Value;

use crate::fixture::{CLUSTER, iks_labels, node, start};

const UID: &str = "0b1c2d3e-1234-5678-9abc-def012345678";
const NAME: &str = "kube-clus1-0b1c2d3e123456789abcdef012345678";

fn service(ports: &[(i32, i32)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
            namespace: Some("default".into()),
            uid: Some(UID.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|(p, np)| ServicePort {
                        port: *p,
                        node_port: Some(*np),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn nodes(ips: &[(&str, &str)]) -> Vec<Node> {
    ips.iter()
        .enumerate()
        .map(|(i, (ip, zone))| {
            let worker = format!("kube-{CLUSTER}-default-0000010{i}");
            node(ip, &iks_labels(&worker, ip, zone), None, None)
        })
        .collect()
}

async fn lbs(f: &crate::fixture::Fixture) -> Vec<Value> {
    let state = f.server.admin().state().await.unwrap();
    state["cloud"]["load_balancers"].as_array().cloned().unwrap_or_default()
}

/// IBM leaves the load balancer `failed`: the ensure fails naming it (the service controller
/// records that as its SyncLoadBalancerFailed Event); the next sync deletes the failed load
/// balancer (it is the Service's: its generated name) and asks for a retry; the one after
/// creates it again, and it converges. Nothing else is touched.
#[tokio::test]
async fn a_failed_load_balancer_is_an_error_then_replaced() {
    let f = start().await;
    let lb = f.provider.ibm_load_balancer();
    let svc = service(&[(80, 30080)]);
    let ns = nodes(&[("10.240.0.4", "us-south-1")]);
    f.server
        .admin()
        .fail_operations("load_balancers/*", Action::Create, 1, "provisioning failed")
        .await
        .unwrap();
    let e = lb.ensure_load_balancer("k", &svc, &ns).await.unwrap_err();
    let text = e.to_string();
    assert!(text.contains(NAME) && text.contains("failed"), "{text}");
    let all = lbs(&f).await;
    assert_eq!(all.len(), 1);
    assert_eq!(
        (all[0]["provisioning_status"].as_str(), all[0]["operating_status"].as_str()),
        (Some("failed"), Some("offline"))
    );

    // The next sync: the failed load balancer goes, and a retry is asked for.
    let e = lb.ensure_load_balancer("k", &svc, &ns).await.unwrap_err();
    assert!(matches!(e, ProviderError::RetryAfter { .. }), "{e}");
    assert!(e.to_string().contains("deleted it"), "{e}");
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(lbs(&f).await.is_empty(), "the failed load balancer is gone");

    // Then it is created again and converges.
    let status = lb.ensure_load_balancer("k", &svc, &ns).await.unwrap();
    assert!(status.ingress.unwrap()[0].hostname.is_some());
    let all = lbs(&f).await;
    assert_eq!(all.len(), 1);
    assert_eq!(
        (all[0]["name"].as_str(), all[0]["provisioning_status"].as_str()),
        (Some(NAME), Some("active"))
    );
    assert_eq!(f.server.counters().get("vpc.load_balancers.create"), 2);
}

/// A failed update (a listener's change IBM could not apply): the load balancer is `failed`;
/// deleting the Service still deletes it (a failed load balancer can be deleted).
#[tokio::test]
async fn a_load_balancer_failed_by_an_update_is_still_deleted_with_its_service() {
    let f = start().await;
    let lb = f.provider.ibm_load_balancer();
    let ns = nodes(&[("10.240.0.4", "us-south-1")]);
    lb.ensure_load_balancer("k", &service(&[(80, 30080)]), &ns).await.unwrap();
    f.server
        .admin()
        .fail_operations("load_balancers/*", Action::Update, 1, "update failed")
        .await
        .unwrap();
    let e = lb.ensure_load_balancer("k", &service(&[(80, 30080), (443, 30443)]), &ns).await;
    assert!(e.is_err(), "the update's failure is reported: {e:?}");
    assert_eq!(lbs(&f).await[0]["provisioning_status"], "failed");
    lb.ensure_load_balancer_deleted("k", &service(&[(80, 30080)])).await.unwrap();
    assert!(lbs(&f).await.is_empty());
}

/// IBM's maintenance (`maintenance_pending`, still online): a change waits and asks for a
/// retry instead of failing or deleting anything; after the maintenance the same update
/// converges.
#[tokio::test]
async fn maintenance_asks_for_a_retry_and_then_converges() {
    let f = start().await;
    let lb = f.provider.ibm_load_balancer();
    let svc = service(&[(80, 30080)]);
    lb.ensure_load_balancer("k", &svc, &nodes(&[("10.240.0.4", "us-south-1")])).await.unwrap();
    assert!(f.cloud.set_maintenance(NAME, Duration::from_secs(90)));
    assert_eq!(lbs(&f).await[0]["provisioning_status"], "maintenance_pending");
    assert_eq!(lbs(&f).await[0]["operating_status"], "online");
    let two = nodes(&[("10.240.0.4", "us-south-1"), ("10.240.0.5", "us-south-1")]);
    let provider = crate::fixture::provider_with_timings(
        &f,
        ccm_provider_ibm::load_balancer::Timings {
            poll: Duration::from_millis(100),
            max_wait: Duration::from_millis(800),
        },
    );
    let e = provider.ibm_load_balancer().update_load_balancer("k", &svc, &two).await.unwrap_err();
    assert!(matches!(e, ProviderError::RetryAfter { .. }), "{e}");
    assert!(e.to_string().contains("maintenance_pending"), "{e}");
    assert_eq!(lbs(&f).await.len(), 1, "nothing deleted");
    assert!(f.cloud.set_maintenance(NAME, Duration::ZERO));
    lb.update_load_balancer("k", &svc, &two).await.unwrap();
    let pools = lbs(&f).await[0]["pools"].clone();
    assert_eq!(pools[0]["members"].as_array().unwrap().len(), 2);
}

/// Realistic pending times (create and delete take minutes in IBM Cloud), scaled by 0.01:
/// the provider polls through them and converges.
#[tokio::test]
async fn realistic_pending_minutes_scaled_converge() {
    let f = start().await;
    f.server.admin().set_timing(TimingProfile::Realistic, 0.01).await.unwrap();
    let report = f.server.admin().timing_report().await.unwrap();
    let realistic = report.realistic.expect("IBM registers a realistic table");
    assert!(realistic.create_ms >= 120_000, "create pends minutes: {realistic:?}");
    let lb = f.provider.ibm_load_balancer();
    let svc = service(&[(80, 30080)]);
    let t = tokio::time::Instant::now();
    lb.ensure_load_balancer("k", &svc, &nodes(&[("10.240.0.4", "us-south-1")])).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(realistic.create_ms / 100), "{:?}", t.elapsed());
    assert_eq!(lbs(&f).await[0]["provisioning_status"], "active");
    lb.ensure_load_balancer_deleted("k", &svc).await.unwrap();
    assert!(lbs(&f).await.is_empty());
}
