//! The node-IPAM controller's `CloudAllocator` on the GCP provider (issue #32, GCP 8), against
//! the real kube-apiserver and the Compute emulator: as upstream's, the service CIDRs decide
//! which of the instance's ranges (alias IP range, the NIC's IPv6 /112) a Node gets and in
//! which order; an instance without a range (or one that cannot be read) gets upstream's
//! `CIDRNotAvailable` Event on the Node and the node is retried.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::controllers::node_ipam::{self, IpamOptions};
use ccm_core::controllers::{ControllerConfig, ControllerContext, Started};
use ccm_emulators::gcp::GcpOptions;
use ccm_emulators::server::ServerOptions;
use ccm_provider_gcp::GcpProvider;
use ccm_provider_gcp::config::Config;
use ccm_testbed::{ControlPlane, unique_name, wait_for};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Event, Node, NodeSpec};
use kube::Api;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};

use crate::fixture::{self, ZONE_A};

const GROUP: &str = "ccm-test/ipam-group";

/// node-dual: alias range and internal IPv6; node-ext: alias range and external IPv6;
/// node-bare: neither.
fn world() -> String {
    format!(
        "{}\n  - {{ name: ipam-dual, zone: us-central1-a, subnet: subnet-a, private_ips: [10.0.0.30, \"fd20:0:0:30::\"], tags: {{ gce.alias: 10.64.30.0/24 }} }}\n  - {{ name: ipam-ext, zone: us-central1-a, subnet: subnet-a, private_ips: [10.0.0.31], public_ips: [\"2600:1900:4001:31::\"], tags: {{ gce.alias: 10.64.31.0/24 }} }}\n  - {{ name: ipam-bare, zone: us-central1-a, subnet: subnet-a, private_ips: [10.0.0.32] }}\n",
        fixture::WORLD.trim_end()
    )
}

/// A running node-IPAM controller (`CloudAllocator`) for the Nodes labelled `group`;
/// stopped on drop.
struct Allocator(ControllerContext);

impl Drop for Allocator {
    fn drop(&mut self) {
        self.0.shutdown.cancel();
    }
}

fn start(
    client: &kube::Client,
    f: &fixture::Fixture,
    group: &str,
    service_cidrs: &[&str],
) -> Allocator {
    let provider = GcpProvider::new(
        Config { global: fixture::global() },
        f.options.clone(),
        crate::fixture::timings(),
    )
    .unwrap();
    let config = ControllerConfig {
        allocate_node_cidrs: true,
        cidr_allocator_type: "CloudAllocator".into(),
        service_cidrs: service_cidrs.iter().map(|c| c.parse::<IpNet>().unwrap()).collect(),
        ..Default::default()
    };
    let ctx = ControllerContext {
        client: client.clone(),
        cloud: Arc::new(provider),
        config: Arc::new(config),
        metrics: Default::default(),
        shutdown: Default::default(),
        nodes: None,
    };
    let opts = IpamOptions { node_selector: Some(format!("{GROUP}={group}")) };
    match node_ipam::start_with(&ctx, opts) {
        Ok(Started::Running(fut)) => {
            tokio::spawn(fut);
        }
        Ok(Started::Skipped(why)) => panic!("node IPAM skipped: {why}"),
        Err(e) => panic!("node IPAM: {e}"),
    }
    Allocator(ctx)
}

/// Creates a Node (labelled `group`) whose providerID names `instance` in zone A.
async fn create_node(client: &kube::Client, group: &str, instance: &str) -> String {
    let name = unique_name(&format!("gce-{instance}"));
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some(BTreeMap::from([(GROUP.to_string(), group.to_string())])),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(fixture::provider_id(ZONE_A, instance)),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap();
    name
}

/// The Node's `spec.podCIDRs` once set (`podCIDR` is their first).
async fn pod_cidrs(client: &kube::Client, name: &str) -> Vec<String> {
    wait_for(&format!("pod CIDRs of {name}"), Duration::from_secs(60), || async {
        let spec = Api::<Node>::all(client.clone()).get(name).await.ok()?.spec?;
        let cidrs = spec.pod_cidrs.filter(|c| !c.is_empty())?;
        assert_eq!(spec.pod_cidr.as_ref(), cidrs.first(), "podCIDR is podCIDRs[0]");
        Some(cidrs)
    })
    .await
}

async fn cidr_not_available(client: &kube::Client, name: &str) -> Event {
    wait_for(&format!("CIDRNotAvailable on {name}"), Duration::from_secs(60), || async {
        let api = Api::<Event>::namespaced(client.clone(), "default");
        let lp = ListParams::default().fields(&format!("involvedObject.name={name}"));
        api.list(&lp)
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some("CIDRNotAvailable"))
    })
    .await
}

async fn delete_group(client: &kube::Client, group: &str) {
    let lp = ListParams::default().labels(&format!("{GROUP}={group}"));
    let _ = Api::<Node>::all(client.clone()).delete_collection(&DeleteParams::default(), &lp).await;
}

#[tokio::test]
async fn pod_cidrs_follow_the_service_cidrs_families_and_order() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let opts = GcpOptions { pending: Duration::from_millis(50), ..GcpOptions::default() };
    let f = fixture::start_with(&world(), opts, ServerOptions::default()).await;
    let cases: [(&str, &[&str], &str, &[&str]); 5] = [
        (
            "IPv4-primary dual-stack",
            &["10.96.0.0/12", "fd00:96::/112"],
            "ipam-dual",
            &["10.64.30.0/24", "fd20:0:0:30::/112"],
        ),
        (
            "IPv6-primary dual-stack",
            &["fd00:96::/112", "10.96.0.0/12"],
            "ipam-dual",
            &["fd20:0:0:30::/112", "10.64.30.0/24"],
        ),
        (
            "IPv6-primary dual-stack, external IPv6",
            &["fd00:96::/112", "10.96.0.0/12"],
            "ipam-ext",
            &["2600:1900:4001:31::/112", "10.64.31.0/24"],
        ),
        ("IPv4 single-stack", &["10.96.0.0/12"], "ipam-dual", &["10.64.30.0/24"]),
        ("IPv6 single-stack", &["fd00:96::/112"], "ipam-dual", &["fd20:0:0:30::/112"]),
    ];
    let mut running = Vec::new();
    let mut nodes = Vec::new();
    for (what, service_cidrs, instance, want) in cases {
        let group = unique_name("ipam");
        running.push(start(&client, &f, &group, service_cidrs));
        nodes.push((what, create_node(&client, &group, instance).await, want, group));
    }
    for (what, node, want, _) in &nodes {
        assert_eq!(pod_cidrs(&client, node).await, *want, "{what}");
        wait_for("NetworkUnavailable=False", Duration::from_secs(30), || async {
            let n = Api::<Node>::all(client.clone()).get(node).await.ok()?;
            n.status?.conditions?.into_iter().find(|c| {
                c.type_ == "NetworkUnavailable"
                    && c.status == "False"
                    && c.reason.as_deref() == Some("RouteCreated")
            })
        })
        .await;
    }
    for (_, _, _, group) in &nodes {
        delete_group(&client, group).await;
    }
}

#[tokio::test]
async fn no_range_raises_cidr_not_available_and_the_node_is_retried() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let opts = GcpOptions { pending: Duration::from_millis(50), ..GcpOptions::default() };
    let f = fixture::start_with(&world(), opts, ServerOptions::default()).await;
    let group = unique_name("ipam");
    let _a = start(&client, &f, &group, &["10.96.0.0/12"]);

    // An instance with neither an alias range nor IPv6.
    let bare = create_node(&client, &group, "ipam-bare").await;
    let e = cidr_not_available(&client, &bare).await;
    assert_eq!(e.type_.as_deref(), Some("Normal"));
    assert_eq!(e.message, Some(format!("Node {bare} status is now: CIDRNotAvailable")));
    assert_eq!(e.source.and_then(|s| s.component).as_deref(), Some("cidrAllocator"));

    // An instance not there yet: the same Event; once it exists with its range, the retry
    // gives the Node its pod CIDR.
    let late = create_node(&client, &group, "ipam-late").await;
    cidr_not_available(&client, &late).await;
    let mut inst = fixture::instance("ipam-late", ZONE_A, "10.0.0.33");
    inst.tags.insert("gce.alias".into(), "10.64.33.0/24".into());
    f.cloud.add_instance(&inst).unwrap();
    assert_eq!(pod_cidrs(&client, &late).await, ["10.64.33.0/24"]);

    let n = Api::<Node>::all(client.clone()).get(&bare).await.unwrap();
    assert_eq!(n.spec.and_then(|s| s.pod_cidrs), None, "nothing written without a range");
    delete_group(&client, &group).await;
}
