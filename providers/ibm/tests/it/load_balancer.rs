//! LoadBalancer against the emulator: what upstream would create, updates, deletion.

use ccm_core::cloud::{LoadBalancer, ProviderError};
use k8s_openapi::api::core::v1::{Node, Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;
use serde_json::Value;

use crate::fixture::{CLUSTER, iks_labels, node, start};

const IP_TYPE: &str = "service.kubernetes.io/ibm-load-balancer-cloud-provider-ip-type";
const ZONE: &str = "service.kubernetes.io/ibm-load-balancer-cloud-provider-zone";

fn service(
    uid: &str,
    annotations: &[(&str, &str)],
    ports: &[(i32, i32)],
    local_hc: Option<i32>,
) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("web".into()),
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
                    .map(|(p, np)| ServicePort {
                        port: *p,
                        node_port: Some(*np),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
            external_traffic_policy: Some(
                if local_hc.is_some() { "Local" } else { "Cluster" }.into(),
            ),
            health_check_node_port: local_hc,
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
            let labels = iks_labels(&worker, ip, zone);
            node(ip, &labels, None, None)
        })
        .collect()
}

async fn lbs(f: &crate::fixture::Fixture) -> Vec<Value> {
    crate::fixture::settled_lbs(f).await
}

fn members(pool: &Value) -> Vec<(String, i64)> {
    let mut m: Vec<(String, i64)> = pool["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            (m["target"]["address"].as_str().unwrap().to_string(), m["port"].as_i64().unwrap())
        })
        .collect();
    m.sort();
    m
}

#[tokio::test]
async fn a_public_load_balancer_is_built_as_upstream_and_deleting_it_leaves_nothing() {
    let f = start().await;
    let lb = f.provider.ibm_load_balancer();
    let svc =
        service("6f7f1b2c-1234-5678-9abc-def012345678", &[], &[(80, 30080), (443, 30443)], None);
    let ns = nodes(&[("10.240.0.4", "us-south-1"), ("10.240.1.4", "us-south-2")]);
    assert!(lb.get_load_balancer("k", &svc).await.unwrap().is_none());
    let status = crate::fixture::converge(lb, &svc, &ns).await;
    let hostname = status.ingress.unwrap()[0].hostname.clone().unwrap();
    assert!(!hostname.is_empty());

    let all = lbs(&f).await;
    assert_eq!(all.len(), 1);
    let v = &all[0];
    assert_eq!(v["name"], "kube-clus1-6f7f1b2c123456789abcdef012345678");
    assert_eq!(v["is_public"], true);
    assert_eq!(v["provisioning_status"], "active");
    assert_eq!(v["hostname"], hostname.as_str());
    let mut subnets: Vec<&str> =
        v["subnets"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    subnets.sort();
    assert_eq!(subnets, ["subnet-1", "subnet-2"], "exact names: subnet-10 is not one of them");
    let mut listeners: Vec<(i64, String, String)> = v["listeners"]
        .as_array()
        .unwrap()
        .iter()
        .map(|l| {
            (
                l["port"].as_i64().unwrap(),
                l["protocol"].as_str().unwrap().into(),
                l["default_pool"]["name"].as_str().unwrap().into(),
            )
        })
        .collect();
    listeners.sort();
    assert_eq!(
        listeners,
        [(80, "tcp".into(), "tcp-80-30080".into()), (443, "tcp".into(), "tcp-443-30443".into())]
    );
    let pools = v["pools"].as_array().unwrap();
    assert_eq!(pools.len(), 2);
    for p in pools {
        let np = if p["name"] == "tcp-80-30080" { 30080 } else { 30443 };
        assert_eq!(p["algorithm"], "round_robin");
        assert_eq!(p["protocol"], "tcp");
        assert_eq!(p["proxy_protocol"], "disabled");
        let hm = &p["health_monitor"];
        assert_eq!((hm["type"].as_str(), hm["port"].as_i64()), (Some("tcp"), Some(np)));
        assert_eq!(
            (hm["delay"].as_i64(), hm["max_retries"].as_i64(), hm["timeout"].as_i64()),
            (Some(5), Some(2), Some(2))
        );
        assert_eq!(members(p), [("10.240.0.4".into(), np), ("10.240.1.4".into(), np)]);
    }
    assert_eq!(
        lb.get_load_balancer("k", &svc).await.unwrap().unwrap().ingress.unwrap()[0]
            .hostname
            .as_deref(),
        Some(hostname.as_str())
    );

    // Ensure again with nothing changed: no mutation.
    let before = f.server.counters();
    crate::fixture::converge(lb, &svc, &ns).await;
    let after = f.server.counters();
    for op in [
        "vpc.load_balancers.create",
        "vpc.load_balancer_pool_members.create",
        "vpc.load_balancer_pool_members.replace",
        "vpc.load_balancer_pools.update",
    ] {
        assert_eq!(before.get(op), after.get(op), "{op}");
    }

    crate::fixture::delete_converged(lb, &svc).await;
    assert!(lbs(&f).await.is_empty(), "nothing left");
    assert!(lb.get_load_balancer("k", &svc).await.unwrap().is_none());
    // Deleting again is a no-op.
    crate::fixture::delete_converged(lb, &svc).await;
}

#[tokio::test]
async fn node_changes_update_members_and_a_private_local_service_gets_an_http_check() {
    let f = start().await;
    let lb = f.provider.ibm_load_balancer();
    let svc = service(
        "11111111-2222-3333-4444-555555555555",
        &[(IP_TYPE, "private")],
        &[(8080, 31080)],
        Some(32000),
    );
    let two = nodes(&[("10.240.0.4", "us-south-1"), ("10.240.0.5", "us-south-1")]);
    crate::fixture::converge(lb, &svc, &two).await;
    let v = &lbs(&f).await[0];
    assert_eq!(v["is_public"], false);
    let pool = &v["pools"][0];
    assert_eq!(pool["name"], "tcp-8080-31080");
    assert_eq!(pool["health_monitor"]["type"], "http");
    assert_eq!(pool["health_monitor"]["port"], 32000);
    assert_eq!(pool["health_monitor"]["url_path"], "/");

    // A third node: one member added.
    let three = nodes(&[
        ("10.240.0.4", "us-south-1"),
        ("10.240.0.5", "us-south-1"),
        ("10.240.1.4", "us-south-2"),
    ]);
    crate::fixture::update_converged(lb, &svc, &three).await;
    let v = &lbs(&f).await[0];
    assert_eq!(members(&v["pools"][0]).len(), 3);
    assert_eq!(f.server.counters().get("vpc.load_balancer_pool_members.create"), 1);
    // Two nodes replaced by another: one ReplaceLoadBalancerPoolMembers.
    let other = nodes(&[("10.240.1.4", "us-south-2")]);
    crate::fixture::update_converged(lb, &svc, &other).await;
    let v = &lbs(&f).await[0];
    assert_eq!(members(&v["pools"][0]), [("10.240.1.4".into(), 31080)]);
    assert_eq!(f.server.counters().get("vpc.load_balancer_pool_members.replace"), 1);

    // Switching to public is refused (as upstream), naming the annotation.
    let public =
        service("11111111-2222-3333-4444-555555555555", &[], &[(8080, 31080)], Some(32000));
    let err = lb.ensure_load_balancer("k", &public, &other).await.unwrap_err();
    assert!(
        matches!(err, ProviderError::Invalid { .. }) && err.to_string().contains(IP_TYPE),
        "{err}"
    );

    // A new port and a node-port change: pools and listeners follow.
    let moved = service(
        "11111111-2222-3333-4444-555555555555",
        &[(IP_TYPE, "private")],
        &[(8080, 31081), (9090, 31090)],
        None,
    );
    crate::fixture::converge(lb, &moved, &other).await;
    let v = &lbs(&f).await[0];
    let mut names: Vec<&str> =
        v["pools"].as_array().unwrap().iter().map(|p| p["name"].as_str().unwrap()).collect();
    names.sort();
    assert_eq!(names, ["tcp-8080-31081", "tcp-9090-31090"]);
    for p in v["pools"].as_array().unwrap() {
        assert_eq!(p["health_monitor"]["type"], "tcp");
        let np = p["health_monitor"]["port"].as_i64().unwrap();
        assert_eq!(members(p), [("10.240.1.4".into(), np)]);
    }
    assert_eq!(v["listeners"].as_array().unwrap().len(), 2);

    crate::fixture::delete_converged(lb, &moved).await;
    assert!(lbs(&f).await.is_empty());
}

#[tokio::test]
async fn the_zone_annotation_narrows_members_and_subnets() {
    let f = start().await;
    let lb = f.provider.ibm_load_balancer();
    let svc = service(
        "aaaaaaaa-2222-3333-4444-555555555555",
        &[(ZONE, "us-south-2")],
        &[(80, 30080)],
        None,
    );
    let ns = nodes(&[("10.240.0.4", "us-south-1"), ("10.240.1.4", "us-south-2")]);
    crate::fixture::converge(lb, &svc, &ns).await;
    let v = &lbs(&f).await[0];
    let subnets: Vec<&str> =
        v["subnets"].as_array().unwrap().iter().map(|s| s["name"].as_str().unwrap()).collect();
    assert_eq!(subnets, ["subnet-2"]);
    assert_eq!(members(&v["pools"][0]), [("10.240.1.4".into(), 30080)]);
    crate::fixture::delete_converged(lb, &svc).await;
    assert!(lbs(&f).await.is_empty());
}

#[tokio::test]
async fn a_vpc_outage_fails_the_call_and_changes_nothing() {
    let f = start().await;
    let lb = f.provider.ibm_load_balancer();
    let svc = service("bbbbbbbb-2222-3333-4444-555555555555", &[], &[(80, 30080)], None);
    let ns = nodes(&[("10.240.0.4", "us-south-1")]);
    crate::fixture::converge(lb, &svc, &ns).await;
    f.server.admin().pause(ccm_emulators::admin::PauseMode::Fail).await.unwrap();
    assert!(lb.ensure_load_balancer_deleted("k", &svc).await.is_err());
    assert!(lb.get_load_balancer("k", &svc).await.is_err());
    f.server.admin().resume().await.unwrap();
    assert_eq!(lbs(&f).await.len(), 1, "an error deletes nothing");
    crate::fixture::delete_converged(lb, &svc).await;
    assert!(lbs(&f).await.is_empty());
}

#[tokio::test]
async fn a_throttled_create_is_sent_again_and_a_failed_one_is_not() {
    use ccm_emulators::faults::{Fault, FaultRule};
    let f = start().await;
    let lb = f.provider.ibm_load_balancer();
    let svc = service("cccccccc-2222-3333-4444-555555555555", &[], &[(80, 30080)], None);
    let ns = nodes(&[("10.240.0.4", "us-south-1")]);
    // A 429 is IBM's rate limiter refusing the request unprocessed: the same sync sends it
    // again after the Retry-After and completes.
    f.server
        .inject(
            FaultRule::new("vpc.load_balancers.create", Fault::Throttle { retry_after_secs: 1 })
                .times(1),
        )
        .unwrap();
    crate::fixture::converge(lb, &svc, &ns).await;
    assert_eq!(f.server.counters().get("vpc.load_balancers.create"), 2);
    assert_eq!(lbs(&f).await.len(), 1, "one load balancer, not two");
    crate::fixture::delete_converged(lb, &svc).await;

    // A 503 on a create may follow a create that was carried out: not sent again by this
    // call; the sync fails and the next one reads what exists first.
    f.server
        .inject(
            FaultRule::new("vpc.load_balancers.create", Fault::Status { status: 503, body: None })
                .times(1),
        )
        .unwrap();
    assert!(lb.ensure_load_balancer("k", &svc, &ns).await.is_err());
    assert_eq!(f.server.counters().get("vpc.load_balancers.create"), 3);
    crate::fixture::converge(lb, &svc, &ns).await;
    assert_eq!(lbs(&f).await.len(), 1);
}

/// Issue #35 (a): one Node joining K load balancers. Each update used to list every load
/// balancer of the region to find its own by name (K listings of ⌈K/100⌉ pages: O(K²)
/// calls). Now a provider that has not seen them (a restarted manager) lists them once per
/// wave of concurrent lookups and reads each by ID; every load balancer gets the new member.
/// A load balancer deleted behind the provider's back is not taken for present: the next
/// ensure creates it again.
#[tokio::test]
async fn a_node_joining_k_load_balancers_lists_them_once_not_once_per_load_balancer() {
    use futures::StreamExt;
    const K: usize = 120;
    let f = crate::fixture::start_with(
        ccm_emulators::ibm::IbmOptions {
            lb_pending: std::time::Duration::from_millis(300),
            lb_quota: K + 5,
            ..Default::default()
        },
        ccm_provider_ibm::client::ClientOptions::default(),
    )
    .await;
    let creator = f.provider.ibm_load_balancer();
    let two = nodes(&[("10.240.0.4", "us-south-1"), ("10.240.1.4", "us-south-2")]);
    let svcs: Vec<Service> = (0..K)
        .map(|i| service(&format!("{i:08x}-aaaa-4bbb-8ccc-{i:012x}"), &[], &[(80, 30080)], None))
        .collect();
    for svc in &svcs {
        creator.ensure_load_balancer("k", svc, &two).await.unwrap();
    }
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(60);
    while !creator.client().list_load_balancers().await.unwrap().iter().all(|l| l.is_active()) {
        assert!(tokio::time::Instant::now() < deadline, "not all active after 60 s");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }

    // A restarted manager's node sync: 16 updates at a time, as the service controller's.
    let restarted = crate::fixture::provider_with_timings(&f, crate::fixture::TIMINGS);
    let lb = restarted.ibm_load_balancer();
    let three = nodes(&[
        ("10.240.0.4", "us-south-1"),
        ("10.240.1.4", "us-south-2"),
        ("10.240.0.5", "us-south-1"),
    ]);
    let before = f.server.counters();
    let results: Vec<Result<(), ProviderError>> = futures::stream::iter(&svcs)
        .map(|svc| lb.update_load_balancer("k", svc, &three))
        .buffer_unordered(16)
        .collect()
        .await;
    let after = f.server.counters();
    for r in results {
        r.unwrap();
    }
    let lists = after.get("vpc.load_balancers.list") - before.get("vpc.load_balancers.list");
    let gets = after.get("vpc.load_balancers.get") - before.get("vpc.load_balancers.get");
    println!("K = {K}: {lists} vpc.load_balancers.list calls, {gets} vpc.load_balancers.get");
    // Two pages of 100 per listing; at most two listings for the first wave of lookups
    // (the one that was running when they began, and one begun after). Before: K × 2 = 240.
    assert!(lists <= 4, "{lists} listing calls for {K} load balancers (pages of 100)");
    assert_eq!(
        after.get("vpc.load_balancer_pool_members.create")
            - before.get("vpc.load_balancer_pool_members.create"),
        K as u64,
        "one new member per load balancer"
    );
    let all = lbs(&f).await;
    assert_eq!(all.len(), K);
    for v in &all {
        let got: Vec<String> = members(&v["pools"][0]).into_iter().map(|(ip, _)| ip).collect();
        assert_eq!(got, ["10.240.0.4", "10.240.0.5", "10.240.1.4"], "{}", v["name"]);
    }

    // Deleted behind its back: the index's ID is gone, and the ensure creates it again.
    let svc = &svcs[0];
    let name = lb.load_balancer_name("k", svc);
    let id = all.iter().find(|v| v["name"] == name.as_str()).unwrap()["id"].as_str().unwrap();
    lb.client().delete_load_balancer(id).await.unwrap();
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    while lb.client().get_load_balancer(id).await.unwrap().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "{name} not deleted after 30 s");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(lb.get_load_balancer("k", svc).await.unwrap().is_none(), "gone is gone");
    crate::fixture::converge(lb, svc, &three).await;
    let again: Vec<Value> =
        lbs(&f).await.into_iter().filter(|v| v["name"] == name.as_str()).collect();
    assert_eq!(again.len(), 1);
    assert_ne!(again[0]["id"].as_str(), Some(id), "a new load balancer");
}
