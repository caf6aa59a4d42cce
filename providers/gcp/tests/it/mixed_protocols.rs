//! A Service whose ports mix protocols (issue #32, GCP 5), on the real kube-apiserver: as
//! upstream's `processMixedProtocolCheck`, the Service gets the `LoadBalancerPortsError`
//! condition and one Warning Event `LoadBalancerMixedProtocolNotSupported` from
//! `g-cloudprovider`; ensure is an error, but node updates keep reconciling its existing load
//! balancer; once the ports agree again the condition goes and the load balancer follows the
//! Service.

use std::sync::Arc;

use ccm_core::cloud::LoadBalancer;
use ccm_provider_gcp::client::GceClient;
use ccm_provider_gcp::load_balancer::GceLoadBalancer;
use ccm_testbed::{ControlPlane, unique_name};
use k8s_openapi::api::core::v1::{Event, Node, Service, ServicePort};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

use crate::fixture::{self, ZONE_A, ZONE_B};

const K: &str = "kubernetes";

fn node(name: &str, zone: &str) -> Node {
    fixture::node(name, Some(&fixture::provider_id(zone, name)))
}

fn port(p: i32, protocol: &str) -> ServicePort {
    ServicePort { port: p, protocol: Some(protocol.into()), ..Default::default() }
}

async fn events_of(client: &kube::Client, ns: &str, name: &str, reason: &str) -> Vec<Event> {
    let api: Api<Event> = Api::namespaced(client.clone(), ns);
    let list = api
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .unwrap();
    list.items.into_iter().filter(|e| e.reason.as_deref() == Some(reason)).collect()
}

fn ports_error(svc: &Service) -> Option<(String, String)> {
    svc.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "LoadBalancerPortsError")
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn target_pool_members(f: &fixture::Fixture, lb: &str) -> Vec<String> {
    let tp = f
        .cloud
        .resources("targetPools")
        .into_iter()
        .find(|r| r["name"] == lb)
        .unwrap_or_else(|| panic!("no target pool {lb}"));
    let mut v: Vec<String> = tp["instances"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|i| i.as_str().map(|s| s.rsplit('/').next().unwrap().to_string()))
        .collect();
    v.sort();
    v
}

#[tokio::test]
async fn mixed_protocols_set_the_ports_error_condition_and_an_event_and_updates_go_on() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let f = fixture::start().await;
    let mut g = fixture::global();
    g.node_tags = vec!["k8s-node".into()];
    let lbs = GceLoadBalancer::new(
        Arc::new(GceClient::new(&g, f.options.clone()).unwrap()),
        crate::fixture::timings(),
    );
    lbs.set_kube_client(admin.clone());
    lbs.set_cluster_id("ba5eba11ba5eba11");

    let ns = "default";
    let name = unique_name("gce-mixed");
    let services: Api<Service> = Api::namespaced(admin.clone(), ns);
    let mut svc: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns },
        "spec": {"type": "LoadBalancer", "selector": {"app": "dns" },
                  "ports": [{"name": "dns-tcp", "port": 53, "protocol": "TCP" }] }
    }))
    .unwrap();
    svc = services.create(&PostParams::default(), &svc).await.unwrap();
    let lb = ccm_core::cloud::default_load_balancer_name(&svc);

    // A TCP load balancer exists (made before the UDP port was added).
    lbs.ensure_load_balancer(K, &svc, &[node("node-a", ZONE_A)]).await.unwrap();
    assert_eq!(target_pool_members(&f, &lb), vec!["node-a"]);

    // The user adds a UDP port.
    let mut spec = svc.spec.clone().unwrap();
    spec.ports
        .as_mut()
        .unwrap()
        .push(ServicePort { name: Some("dns-udp".into()), ..port(53, "UDP") });
    svc.spec = Some(spec);
    svc.metadata.managed_fields = None;
    svc = services.replace(&name, &PostParams::default(), &svc).await.unwrap();

    let e = lbs.ensure_load_balancer(K, &svc, &[node("node-a", ZONE_A)]).await.unwrap_err();
    assert!(e.to_string().contains("mixed protocol is not supported for LoadBalancer"), "{e}");
    let now = services.get(&name).await.unwrap();
    assert_eq!(
        ports_error(&now),
        Some(("True".into(), "LoadBalancerMixedProtocolNotSupported".into())),
        "{:?}",
        now.status
    );
    let events = events_of(&admin, ns, &name, "LoadBalancerMixedProtocolNotSupported").await;
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].type_.as_deref(), Some("Warning"));
    assert_eq!(
        events[0].source.as_ref().and_then(|s| s.component.as_deref()),
        Some("g-cloudprovider")
    );

    // Nodes change: the existing load balancer keeps following them; the Service already
    // shows the condition, so no second Event.
    lbs.update_load_balancer(K, &now, &[node("node-a", ZONE_A), node("node-b", ZONE_B)])
        .await
        .unwrap();
    assert_eq!(target_pool_members(&f, &lb), vec!["node-a", "node-b"]);
    let again = lbs.ensure_load_balancer(K, &now, &[node("node-a", ZONE_A)]).await;
    assert!(again.is_err());
    let events = events_of(&admin, ns, &name, "LoadBalancerMixedProtocolNotSupported").await;
    assert_eq!(events.iter().map(|e| e.count.unwrap_or(1)).sum::<i32>(), 1, "{events:?}");

    // The ports agree again: the condition goes, the load balancer is synced.
    let mut fixed = now.clone();
    fixed
        .spec
        .as_mut()
        .unwrap()
        .ports
        .as_mut()
        .unwrap()
        .retain(|p| p.protocol.as_deref() == Some("TCP"));
    fixed.metadata.managed_fields = None;
    fixed.status = None;
    let fixed = services.replace(&name, &PostParams::default(), &fixed).await.unwrap();
    lbs.ensure_load_balancer(K, &fixed, &[node("node-a", ZONE_A), node("node-b", ZONE_B)])
        .await
        .unwrap();
    assert_eq!(ports_error(&services.get(&name).await.unwrap()), None);

    lbs.ensure_load_balancer_deleted(K, &fixed).await.unwrap();
    services.delete(&name, &DeleteParams::default()).await.unwrap();
}
