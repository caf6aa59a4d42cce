//! A Shared VPC (issue #32, GCP 4), on the real kube-apiserver: the firewalls live in the
//! network project, whose administrators own them; when Compute refuses a firewall change
//! there (403), the load balancer is still built and the Service gets upstream's Normal Event
//! `LoadBalancerManualChange` from `g-cloudprovider` with the full `gcloud` command the
//! network administrator must run.

use std::sync::Arc;

use ccm_core::cloud::LoadBalancer;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_provider_gcp::client::GceClient;
use ccm_provider_gcp::load_balancer::GceLoadBalancer;
use ccm_testbed::{ControlPlane, unique_name};
use k8s_openapi::api::core::v1::{Event, Service};
use kube::Api;
use kube::api::{DeleteParams, ListParams, PostParams};

use crate::fixture::{self, ZONE_A};

#[tokio::test]
async fn a_firewall_change_refused_on_a_shared_vpc_raises_an_event_with_the_gcloud_command() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let f = fixture::start().await;
    let mut g = fixture::global();
    g.node_tags = vec!["k8s-node".into()];
    g.network_project_id = Some("host-project".into());
    let lbs = GceLoadBalancer::new(
        Arc::new(GceClient::new(&g, f.options.clone()).unwrap()),
        crate::fixture::timings(),
    );
    lbs.set_kube_client(admin.clone());
    lbs.set_cluster_id("5a4ed5a4ed5a4ed0");
    // The host project's administrators own the firewalls: every change there is refused.
    for op in ["compute.firewalls.insert", "compute.firewalls.patch", "compute.firewalls.delete"] {
        f.server.inject(FaultRule::new(op, Fault::Status { status: 403, body: None })).unwrap();
    }

    let ns = "default";
    let name = unique_name("gce-xpn");
    let services: Api<Service> = Api::namespaced(admin.clone(), ns);
    let svc: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": ns },
        "spec": {"type": "LoadBalancer", "selector": {"app": "web" },
                  "ports": [{"port": 80, "protocol": "TCP" }] }
    }))
    .unwrap();
    let svc = services.create(&PostParams::default(), &svc).await.unwrap();
    let lb = ccm_core::cloud::default_load_balancer_name(&svc);
    let node = fixture::node("node-a", Some(&fixture::provider_id(ZONE_A, "node-a")));

    let status = lbs.ensure_load_balancer("kubernetes", &svc, &[node]).await.unwrap();
    let ip = status.ingress.unwrap()[0].ip.clone().unwrap();

    let events: Api<Event> = Api::namespaced(admin.clone(), ns);
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .unwrap();
    let manual: Vec<&Event> = list
        .items
        .iter()
        .filter(|e| e.reason.as_deref() == Some("LoadBalancerManualChange"))
        .collect();
    let messages: Vec<&str> = manual.iter().filter_map(|e| e.message.as_deref()).collect();
    let want = format!(
        "Firewall change required by security admin: `gcloud compute firewall-rules create k8s-fw-{lb} --network k8s-net --description \"{{\\\"kubernetes.io/service-name\\\":\\\"default/{name}\\\", \\\"kubernetes.io/service-ip\\\":\\\"{ip}\\\"}}\" --allow tcp:80 --source-ranges 0.0.0.0/0 --destination-ranges {ip} --target-tags k8s-node --priority 1000 --project host-project`"
    );
    assert!(messages.contains(&want.as_str()), "want {want}\nin {messages:#?}");
    assert!(
        messages.iter().any(|m| m.contains("gcloud compute firewall-rules create k8s-")
            && m.contains("-node-http-hc")),
        "the health-check firewall too: {messages:#?}"
    );
    for e in &manual {
        assert_eq!(e.type_.as_deref(), Some("Normal"));
        assert_eq!(e.source.as_ref().and_then(|s| s.component.as_deref()), Some("g-cloudprovider"));
    }

    // Deleting: the firewall deletions are the administrator's too.
    lbs.ensure_load_balancer_deleted("kubernetes", &svc).await.unwrap();
    let list = events
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
        .unwrap();
    let delete = format!(
        "Firewall change required by security admin: `gcloud compute firewall-rules delete k8s-fw-{lb} --project host-project`"
    );
    assert!(
        list.items.iter().any(|e| e.message.as_deref() == Some(delete.as_str())),
        "{:#?}",
        list.items.iter().filter_map(|e| e.message.as_deref()).collect::<Vec<_>>()
    );
    services.delete(&name, &DeleteParams::default()).await.unwrap();
}

/// A throttle is not a refused permission: Compute answers its rate limit with a 403 too
/// (`rateLimitExceeded`), and one that outlasts the call's deadline fails the sync as
/// throttled (retried later), never "the network administrator must create the firewall"
/// with the load balancer reported built without it.
#[tokio::test]
async fn a_throttled_firewall_change_on_a_shared_vpc_is_a_throttle_not_a_manual_change() {
    let f = fixture::start().await;
    let mut g = fixture::global();
    g.node_tags = vec!["k8s-node".into()];
    g.network_project_id = Some("host-project".into());
    let options = ccm_provider_gcp::client::ClientOptions {
        deadline: ccm_core::cloud_call::Deadline::new(std::time::Duration::from_secs(2)),
        ..f.options.clone()
    };
    let lbs = GceLoadBalancer::new(
        Arc::new(GceClient::new(&g, options).unwrap()),
        crate::fixture::timings(),
    );
    lbs.set_cluster_id("5a4ed5a4ed5a4ed0");
    // Far more throttles than attempts fit in 2 s.
    f.server
        .inject(
            FaultRule::new("compute.firewalls.insert", Fault::Throttle { retry_after_secs: 0 })
                .times(1000),
        )
        .unwrap();
    let svc: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "web", "namespace": "default",
                      "uid": "7e57ab1e-0000-4000-8000-000000000001" },
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80, "protocol": "TCP", "nodePort": 30080 }] }
    }))
    .unwrap();
    let node = fixture::node("node-a", Some(&fixture::provider_id(ZONE_A, "node-a")));
    let e = lbs.ensure_load_balancer("kubernetes", &svc, &[node]).await.unwrap_err();
    assert!(matches!(e, ccm_core::cloud::ProviderError::Throttled(_)), "{e}");
    assert!(f.server.counters().get("compute.firewalls.insert") > 1, "retried until the deadline");
    f.server.admin().clear_faults().await.unwrap();
}
