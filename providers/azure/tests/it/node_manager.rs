//! `cloud-node-manager-azure` against a real API server and the emulator's IMDS, acting as a
//! ServiceAccount with exactly upstream's `cloud-node-manager` ClusterRole: it initialises its
//! own Node (providerID, labels, addresses, taint, NetworkUnavailable with --wait-routes),
//! keeps the addresses current, and leaves every other Node alone.

use std::sync::Arc;
use std::time::Duration;

use ccm_core::names;
use ccm_provider_azure::imds::ImdsClient;
use ccm_provider_azure::node_manager::{ImdsInstances, Options, run};
use ccm_testbed::fixtures::kubelet_node;
use ccm_testbed::{ControlPlane, chart, unique_name, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, PostParams};

use crate::fixture::{self, vm_provider_id};

fn addresses(n: &Node) -> Vec<(String, String)> {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .into_iter()
        .flatten()
        .map(|a| (a.type_.clone(), a.address.clone()))
        .collect()
}

fn label<'a>(n: &'a Node, k: &str) -> Option<&'a str> {
    n.metadata.labels.as_ref().and_then(|l| l.get(k)).map(String::as_str)
}

fn tainted(n: &Node) -> bool {
    ccm_core::controllers::node_util::has_taint(n, names::TAINT_UNINITIALIZED)
}

#[tokio::test]
async fn the_node_manager_initialises_only_its_own_node_from_imds() {
    let f = fixture::start().await;
    assert!(f.cloud.set_imds_instance("vm-0"));
    let cp = ControlPlane::shared().await.unwrap();
    let admin = cp.admin_client().await.unwrap();

    // Upstream's RBAC, and a client acting with nothing more.
    let sa = unique_name("cnm");
    let ns = unique_name("cnm-ns");
    let rbac: Vec<serde_json::Value> = vec![
        serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}}),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": sa},
        "rules": [
            {"apiGroups": [""], "resources": ["nodes"], "verbs": ["watch", "list", "get", "update", "patch"]},
            {"apiGroups": [""], "resources": ["nodes/status"], "verbs": ["patch"]},
        ]}),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": sa},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": sa},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}),
    ];
    chart::apply_rbac(&admin, &rbac).await.unwrap();
    let client = chart::service_account_client(cp, &admin, &ns, &sa).await.unwrap();

    let nodes: Api<Node> = Api::all(admin.clone());
    let mine = unique_name("azure-vm-0");
    let other = unique_name("azure-other");
    for (name, ip) in [(&mine, "10.240.0.4"), (&other, "10.240.0.5")] {
        nodes.create(&PostParams::default(), &kubelet_node(name, ip, "True")).await.unwrap();
    }

    let imds = ImdsClient::from_arm(&f.client).with_timeout(Duration::from_secs(5));
    let instances = Arc::new(ImdsInstances::new(imds, mine.clone()));
    let opts = Options {
        wait_routes: true,
        status_update_frequency: Duration::from_millis(500),
        retry_base: Duration::from_millis(100),
        ..Options::new(mine.clone())
    };
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let manager = tokio::spawn(run(client, instances, opts, async move {
        let _ = stopped.await;
    }));

    let n = wait_for("the node initialised", Duration::from_secs(30), || async {
        nodes.get(&mine).await.ok().filter(|n| !tainted(n))
    })
    .await;
    assert_eq!(
        n.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some(vm_provider_id("vm-0").as_str())
    );
    assert_eq!(label(&n, names::LABEL_INSTANCE_TYPE), Some("Standard_D4s_v3"));
    assert_eq!(label(&n, names::LABEL_ZONE), Some("eastus-1"));
    assert_eq!(label(&n, names::LABEL_REGION), Some("eastus"));
    assert_eq!(label(&n, names::LABEL_ZONE_BETA), None, "beta labels only with the flag");
    let want = |v: &[(&str, &str)]| {
        v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect::<Vec<_>>()
    };
    // Upstream's IMDS order: Hostname, InternalIP, ExternalIP.
    assert_eq!(
        addresses(&n),
        want(&[("Hostname", &mine), ("InternalIP", "10.240.0.4"), ("ExternalIP", "20.0.0.4")])
    );
    let unavailable = n
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .into_iter()
        .flatten()
        .find(|c| c.type_ == names::CONDITION_NETWORK_UNAVAILABLE)
        .map(|c| (c.status.clone(), c.reason.clone()));
    assert_eq!(unavailable, Some(("True".into(), Some("NoRouteCreated".into()))), "--wait-routes");

    // The VM's address changes (IMDS now speaks for a dual-stack VM): the next refresh
    // writes it; the providerID stays.
    assert!(f.cloud.set_imds_instance("vm-6"));
    let n = wait_for("the addresses refreshed", Duration::from_secs(30), || async {
        nodes.get(&mine).await.ok().filter(|n| addresses(n).iter().any(|(_, a)| a == "fd00::8"))
    })
    .await;
    assert_eq!(
        addresses(&n),
        want(&[("Hostname", &mine), ("InternalIP", "10.240.0.8"), ("InternalIP", "fd00::8")])
    );
    assert_eq!(
        n.spec.as_ref().and_then(|s| s.provider_id.as_deref()),
        Some(vm_provider_id("vm-0").as_str())
    );

    // The other Node is untouched.
    let o = nodes.get(&other).await.unwrap();
    assert!(tainted(&o));
    assert_eq!(o.spec.as_ref().and_then(|s| s.provider_id.as_deref()), None);

    // IMDS down: nothing changes, the manager keeps running and recovers.
    f.server.admin().pause(ccm_emulators::admin::PauseMode::Fail).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(!manager.is_finished());
    f.server.admin().resume().await.unwrap();

    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(10), manager).await.unwrap().unwrap();
    for name in [&mine, &other] {
        let _ = nodes.delete(name, &DeleteParams::default()).await;
    }
}
