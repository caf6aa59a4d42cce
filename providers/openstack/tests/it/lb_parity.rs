//! Issue #32 OpenStack items 5 and 6 on the emulator and the testbed's real kube-apiserver:
//! upstream's Warning Events for a floating network that cannot be found
//! (`LoadBalancerExternalNetworkSearchFailed`, `LoadBalancerForcedInternal`); a regular
//! expression `floating-subnet` (`~…`); a managed security group keeping only its wanted rules
//! (Neutron's default egress rules removed, as upstream) and a foreign group of the same name
//! refused.

use std::time::Duration;

use ccm_core::cloud::LoadBalancer;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::openstack::{OpenStackOptions, PublicSubnet};
use ccm_emulators::server::ServerOptions;
use ccm_provider_openstack::client::Service as Svc;
use ccm_provider_openstack::config::LoadBalancerOpts;
use ccm_testbed::{ControlPlane, unique_name, wait_for};
use k8s_openapi::api::core::v1::{Event, Service, ServicePort, ServiceSpec};
use kube::Api;
use kube::api::{ListParams, ObjectMeta};
use serde_json::{Value, json};

use crate::fixture::{fast_options, start_with};
use crate::tls::{api_service, lb_with, nodes, start};

const WORLD: &str = r#"
region: RegionOne
zones: [az-1]
networks:
  - { name: private, cidr: 10.0.0.0/16 }
subnets:
  - { name: private-subnet, network: private, zone: az-1, cidr: 10.0.0.0/24 }
instances:
  - { name: node-a, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.11] }
  - { name: node-b, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.12] }
"#;

async fn events_of(client: &kube::Client, name: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), "default");
    let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
    api.list(&lp).await.unwrap().items
}

async fn warning(client: &kube::Client, name: &str, reason: &str) -> Event {
    let ev = wait_for(reason, Duration::from_secs(10), || async {
        events_of(client, name).await.into_iter().find(|e| e.reason.as_deref() == Some(reason))
    })
    .await;
    assert_eq!(ev.type_.as_deref(), Some("Warning"));
    assert_eq!(
        ev.source.as_ref().and_then(|s| s.component.as_deref()),
        Some("cloud-provider-openstack")
    );
    ev
}

/// A Service `default/<name>` (not in the API) with TCP port 80 on node port 30080.
fn service(name: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(format!("uid-{name}")),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port: 80,
                node_port: Some(30080),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn ip(status: &k8s_openapi::api::core::v1::LoadBalancerStatus) -> String {
    status.ingress.as_ref().unwrap()[0].ip.clone().unwrap()
}

/// No floating network configured and Neutron shows no external network: upstream's two
/// Warnings on the Service and its VIP as the address (no floating IP). A failed network
/// listing is the first Warning and an error (the reconcile is retried), never the VIP.
#[tokio::test]
async fn a_missing_external_network_is_upstreams_events_and_the_vip() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = start().await;
    let lb = lb_with(&f, LoadBalancerOpts::default());
    lb.set_kube_client(client.clone());
    let ns = nodes(&f);

    // The listing fails: an error and the search Warning.
    let name = unique_name("fip-err");
    let svc = api_service(&client, &name, &[]).await;
    f.server
        .inject(
            FaultRule::new("neutron.networks.list", Fault::Status { status: 403, body: None })
                .times(1),
        )
        .unwrap();
    lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap_err();
    let ev = warning(&client, &name, "LoadBalancerExternalNetworkSearchFailed").await;
    assert!(ev.message.unwrap_or_default().contains(&format!("default/{name}")));
    assert!(
        events_of(&client, &name)
            .await
            .iter()
            .all(|e| e.reason.as_deref() != Some("LoadBalancerForcedInternal")),
        "an uncertain answer never makes the Service internal"
    );
    lb.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();

    // No external network at all: the VIP, and both Warnings.
    let public = f.cloud.neutron_id("networks", "public").unwrap();
    f.client
        .put(
            "test:UpdateNetwork",
            Svc::Network,
            &["networks", &public],
            &json!({"network": {"router:external": false}}),
        )
        .await
        .unwrap();
    let name = unique_name("fip-none");
    let svc = api_service(&client, &name, &[]).await;
    let status = lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    let vip = f.cloud.objects("loadbalancers")[0]["vip_address"].as_str().unwrap().to_string();
    assert_eq!(ip(&status), vip);
    assert!(f.cloud.objects("floatingips").is_empty());
    warning(&client, &name, "LoadBalancerExternalNetworkSearchFailed").await;
    let ev = warning(&client, &name, "LoadBalancerForcedInternal").await;
    assert!(ev.message.unwrap_or_default().contains("forcing to ensure an internal"));
    lb.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();
}

/// `floating-subnet: ~<regex>` picks the floating network's subnet whose whole name the
/// expression matches (upstream: the leftmost match is the name), as upstream.
#[tokio::test]
async fn a_regex_floating_subnet_picks_the_subnet_it_matches_whole() {
    let opts = OpenStackOptions {
        lb_pending: Duration::from_millis(30),
        public_subnets: vec![
            PublicSubnet { name: "fip-pool-7x".into(), cidr: "172.24.8.0/24".into() },
            PublicSubnet { name: "fip-pool-7".into(), cidr: "172.24.7.0/24".into() },
        ],
        ..Default::default()
    };
    let f = start_with(WORLD, opts, fast_options(), ServerOptions::default()).await;
    let lb = lb_with(&f, LoadBalancerOpts::default());
    let ns = nodes(&f);
    let mut svc = service("regex");
    svc.metadata.annotations = Some(
        [("loadbalancer.openstack.org/floating-subnet".to_string(), "~fip-pool-[0-9]+".into())]
            .into(),
    );
    let status = lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    assert!(ip(&status).starts_with("172.24.7."), "{status:?}");
    lb.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();
    // A pattern that does not compile is an error naming the annotation, before any call.
    svc.metadata.annotations =
        Some([("loadbalancer.openstack.org/floating-subnet".to_string(), "~fip-(".into())].into());
    let e = lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap_err().to_string();
    assert!(
        e.contains("loadbalancer.openstack.org/floating-subnet") && e.contains("regexp"),
        "{e}"
    );
}

fn rules_of(f: &crate::fixture::Fixture, sg: &str) -> Vec<Value> {
    f.cloud
        .objects("security-group-rules")
        .into_iter()
        .filter(|r| r["security_group_id"] == sg)
        .collect()
}

/// `manage-security-groups`: the group keeps only the rules the Service needs (ingress on
/// its node port from the member subnet): Neutron's default egress rules are deleted, as
/// upstream. A group with the Service's group name that this cluster did not create for it
/// is refused and left unchanged.
#[tokio::test]
async fn a_managed_security_group_keeps_only_wanted_rules_and_a_foreign_one_is_refused() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = start().await;
    let lb = lb_with(
        &f,
        LoadBalancerOpts { manage_security_groups: true, ..LoadBalancerOpts::default() },
    );
    let ns = nodes(&f);
    let name = unique_name("sg");
    let svc = api_service(&client, &name, &[]).await;
    lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    let uid = svc.metadata.uid.clone().unwrap();
    let sg = f.cloud.neutron_id("security-groups", &format!("lb-sg-{uid}-default-{name}")).unwrap();
    let node_port = svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port.unwrap();
    let rules = rules_of(&f, &sg);
    assert_eq!(rules.len(), 1, "{rules:?}");
    assert_eq!(rules[0]["direction"], "ingress");
    assert_eq!(rules[0]["port_range_min"], node_port);
    assert_eq!(rules[0]["remote_ip_prefix"], "10.0.0.0/24");
    lb.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();

    // A hand-made group with the next Service's group name.
    let name = unique_name("sg-foreign");
    let svc = api_service(&client, &name, &[]).await;
    let uid = svc.metadata.uid.clone().unwrap();
    let group = f
        .client
        .post(
            "test:CreateSecurityGroup",
            Svc::Network,
            &["security-groups"],
            &json!({"security_group": {"name": format!("lb-sg-{uid}-default-{name}"),
                "description": "hand-made"}}),
        )
        .await
        .unwrap();
    let id = group["security_group"]["id"].as_str().unwrap().to_string();
    let before = rules_of(&f, &id);
    let e = lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap_err().to_string();
    assert!(e.contains("not created for it") && e.contains(&id), "{e}");
    assert_eq!(rules_of(&f, &id), before, "unchanged");
    lb.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();
    assert!(
        f.cloud.objects("security-groups").iter().any(|g| g["id"] == id.as_str()),
        "never deleted"
    );
}

/// An IPv6 VIP (the Service's `subnet-id` names an IPv6 subnet) gets no floating IP: the
/// Service reports the VIP itself and upstream's `LoadBalancerFloatingIPSkipped` Warning is on
/// the Service; nothing is allocated on the external network.
#[tokio::test]
async fn an_ipv6_vip_skips_the_floating_ip_with_upstreams_event() {
    const V6_WORLD: &str = r#"
region: RegionOne
zones: [az-1]
networks:
  - { name: private, cidr: 10.0.0.0/16 }
  - { name: private-v6, cidr: "fd00:10::/48" }
subnets:
  - { name: private-subnet, network: private, zone: az-1, cidr: 10.0.0.0/24 }
  - { name: private-v6-subnet, network: private-v6, zone: az-1, cidr: "fd00:10::/64" }
instances:
  - { name: node-a, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.11] }
  - { name: node-b, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.12] }
"#;
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let opts = OpenStackOptions { lb_pending: Duration::from_millis(30), ..Default::default() };
    let f = start_with(V6_WORLD, opts, fast_options(), ServerOptions::default()).await;
    let subnet = f.cloud.neutron_id("subnets", "private-v6-subnet").unwrap();
    assert_eq!(
        f.cloud.objects("subnets").iter().find(|s| s["id"] == subnet.as_str()).unwrap()["ip_version"],
        6
    );
    let lb = lb_with(&f, LoadBalancerOpts::default());
    lb.set_kube_client(client.clone());
    let ns = nodes(&f);
    let name = unique_name("v6");
    let svc =
        api_service(&client, &name, &[("loadbalancer.openstack.org/subnet-id", &subnet)]).await;
    let status = lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    let vip = f.cloud.objects("loadbalancers")[0]["vip_address"].as_str().unwrap().to_string();
    assert!(vip.starts_with("fd00:10::"), "{vip}");
    assert_eq!(ip(&status), vip);
    assert!(f.cloud.objects("floatingips").is_empty(), "no floating IP for an IPv6 VIP");
    let ev = warning(&client, &name, "LoadBalancerFloatingIPSkipped").await;
    let message = ev.message.unwrap_or_default();
    assert!(
        message.contains(&format!("IPv6 Service default/{name}")) && message.contains(&vip),
        "{message}"
    );
    lb.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();
    assert!(f.cloud.objects("loadbalancers").is_empty());
}
