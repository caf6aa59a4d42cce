//! The control plane is real: real storage, real RBAC, the pinned version.

use std::time::Duration;

use ccm_testbed::{ControlPlane, Identity, tools::pinned_kubernetes_version, unique_name};
use k8s_openapi::api::core::v1::{Node, NodeSpec, Taint};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};

const UNINITIALIZED_TAINT: &str = "node.cloudprovider.kubernetes.io/uninitialized";

async fn admin() -> (&'static ControlPlane, Client) {
    let cp = ControlPlane::shared().await.expect("control plane starts");
    let client = cp.admin_client().await.expect("admin client");
    (cp, client)
}

fn tainted_node(name: &str) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: UNINITIALIZED_TAINT.to_string(),
                value: Some("true".to_string()),
                effect: "NoSchedule".to_string(),
                time_added: None,
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

#[tokio::test]
async fn node_with_uninitialized_taint_round_trips() {
    let (cp, client) = admin().await;
    let _logs = cp.log_guard();
    let nodes: Api<Node> = Api::all(client);
    let name = unique_name("taint-node");

    nodes.create(&PostParams::default(), &tainted_node(&name)).await.expect("create node");
    let read = nodes.get(&name).await.expect("read node back");

    let taints = read.spec.and_then(|s| s.taints).unwrap_or_default();
    let ours: Vec<_> = taints.iter().filter(|t| t.key == UNINITIALIZED_TAINT).collect();
    assert_eq!(ours.len(), 1, "the uninitialized taint survives storage: {taints:?}");
    assert_eq!(ours[0].effect, "NoSchedule");
    assert_eq!(ours[0].value.as_deref(), Some("true"));
    // Real admission ran: TaintNodesByCondition adds the not-ready taint to a new Node.
    assert!(
        taints.iter().any(|t| t.key == "node.kubernetes.io/not-ready"),
        "admission plugins of the real apiserver ran: {taints:?}"
    );
    assert!(read.metadata.uid.is_some(), "the apiserver assigned a uid");
    nodes.delete(&name, &Default::default()).await.expect("delete node");
}

#[tokio::test]
async fn rbac_is_enforced_for_the_ccm_identity() {
    let (cp, admin) = admin().await;
    let _logs = cp.log_guard();
    let nodes: Api<Node> = Api::all(admin.clone());
    let name = unique_name("rbac-node");
    nodes.create(&PostParams::default(), &tainted_node(&name)).await.expect("create node");

    let ccm = cp
        .client(&Identity::new("system:cloud-controller-manager", &[]))
        .await
        .expect("ccm client");
    let ccm_nodes: Api<Node> = Api::all(ccm);
    let patch = Patch::Merge(serde_json::json!({"metadata": {"labels": {"rbac-test": "yes"}}}));

    // No binding yet: the real authorizer says 403.
    match ccm_nodes.patch(&name, &PatchParams::default(), &patch).await {
        Err(kube::Error::Api(s)) => assert_eq!(s.code, 403, "forbidden without a binding: {s:?}"),
        other => panic!("expected 403 Forbidden without a binding, got {other:?}"),
    }

    let role_name = unique_name("ccm-nodes");
    let roles: Api<ClusterRole> = Api::all(admin.clone());
    roles
        .create(
            &PostParams::default(),
            &ClusterRole {
                metadata: ObjectMeta { name: Some(role_name.clone()), ..Default::default() },
                rules: Some(vec![PolicyRule {
                    api_groups: Some(vec![String::new()]),
                    resources: Some(vec!["nodes".to_string()]),
                    verbs: vec!["get".to_string(), "patch".to_string()],
                    ..Default::default()
                }]),
                aggregation_rule: None,
            },
        )
        .await
        .expect("create ClusterRole");
    let bindings: Api<ClusterRoleBinding> = Api::all(admin);
    bindings
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: ObjectMeta { name: Some(role_name.clone()), ..Default::default() },
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".to_string(),
                    kind: "ClusterRole".to_string(),
                    name: role_name.clone(),
                },
                subjects: Some(vec![Subject {
                    api_group: Some("rbac.authorization.k8s.io".to_string()),
                    kind: "User".to_string(),
                    name: "system:cloud-controller-manager".to_string(),
                    namespace: None,
                }]),
            },
        )
        .await
        .expect("create ClusterRoleBinding");

    // The authorizer's cache catches up within moments; allow a few seconds.
    let mut last = None;
    for _ in 0..50 {
        match ccm_nodes.patch(&name, &PatchParams::default(), &patch).await {
            Ok(n) => {
                assert_eq!(
                    n.metadata.labels.unwrap_or_default().get("rbac-test").map(String::as_str),
                    Some("yes")
                );
                nodes.delete(&name, &Default::default()).await.expect("delete node");
                return;
            }
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("patch still refused after the binding was applied: {last:?}");
}

#[tokio::test]
async fn apiserver_reports_the_pinned_version() {
    let (cp, client) = admin().await;
    let _logs = cp.log_guard();
    let version = client.apiserver_version().await.expect("GET /version");
    let pinned = pinned_kubernetes_version().expect("pinned version");
    assert_eq!(version.git_version, pinned, "not a v0.0.0-master build");
}

#[tokio::test]
async fn kubeconfig_file_works_for_kubectl() {
    let (cp, _) = admin().await;
    let _logs = cp.log_guard();
    let out = std::process::Command::new(&cp.tools().kubectl)
        .arg("--kubeconfig")
        .arg(cp.admin_kubeconfig_path())
        .args(["get", "--raw", "/version"])
        .output()
        .expect("run kubectl");
    assert!(out.status.success(), "kubectl failed: {}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON /version");
    assert_eq!(v["gitVersion"], pinned_kubernetes_version().expect("pinned version"));
}

#[tokio::test]
async fn a_third_group_is_refused_with_a_clear_error() {
    let (cp, _) = admin().await;
    let Err(err) = cp.client(&Identity::new("many-groups", &["a", "b", "c"])).await else {
        panic!("three groups are not representable in a client certificate");
    };
    assert!(err.to_string().contains("many-groups"), "error names the identity: {err}");
}

/// An apiserver outage (the chaos suite's): while it is stopped no request is answered; once
/// it is back on the same address, what was stored before is there (etcd kept running) and the
/// same client works again.
#[tokio::test]
async fn the_apiserver_alone_can_be_stopped_and_started_and_keeps_its_objects() {
    let cp = ControlPlane::start().await.expect("control plane starts");
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.expect("admin client");
    let nodes: Api<Node> = Api::all(client);
    let name = unique_name("outage-node");
    nodes.create(&PostParams::default(), &tainted_node(&name)).await.expect("create node");

    cp.stop_apiserver().await.expect("apiserver stops");
    let during = tokio::time::timeout(Duration::from_secs(20), nodes.get(&name)).await;
    assert!(
        !matches!(during, Ok(Ok(_))),
        "a request was answered while the apiserver was stopped: {during:?}"
    );

    cp.start_apiserver().await.expect("apiserver starts again");
    let read = nodes.get(&name).await.expect("the same client reads the Node after the outage");
    assert_eq!(read.metadata.name.as_deref(), Some(name.as_str()));
    cp.stop();
}
