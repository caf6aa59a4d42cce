//! The chart's RBAC for AWS's tagging controller (providers/aws/src/tagging.rs) with
//! `useServiceAccountCredentials`: the controller calls with the client of its own client name,
//! `tagging-controller`, so the chart renders that per-controller ServiceAccount and a
//! ClusterRole with exactly its calls (list/watch Nodes, patch a Node's label) when `controllers`
//! enables it, and nothing when it does not. Checked with a real apiserver's RBAC authorizer.

use std::time::Duration;

use ccm_testbed::ControlPlane;
use ccm_testbed::chart;
use ccm_testbed::fixtures::kubelet_node;
use k8s_openapi::api::core::v1::{Node, Secret, Service};
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchParams};
use kube::{Api, Client};
use serde_json::{Value, json};

const SA_CREDENTIALS: (&str, &str) = ("useServiceAccountCredentials", "true");
const TAGGING_ON: (&str, &str) = ("controllers", "{*,tagging}");

fn is_forbidden<T>(r: &Result<T, kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403)
}

fn assert_forbidden<T>(what: &str, r: Result<T, kube::Error>) {
    let got = match &r {
        Ok(_) => "it was allowed".to_string(),
        Err(e) => e.to_string(),
    };
    assert!(is_forbidden(&r), "tagging-controller: {what} must be forbidden; {got}");
}

/// The rendered per-controller ServiceAccounts in kube-system.
fn kube_system_accounts(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .filter(|o| {
            chart::kind(o) == "ServiceAccount" && chart::namespace(o) == Some("kube-system")
        })
        .map(|o| chart::name(o).to_string())
        .collect()
}

fn tagging_objects(objects: &[Value]) -> Vec<String> {
    objects
        .iter()
        .filter(|o| chart::name(o).ends_with("-tagging-controller"))
        .map(|o| format!("{} {}", chart::kind(o), chart::name(o)))
        .collect()
}

#[test]
fn the_tagging_account_is_rendered_only_when_aws_enables_the_controller() {
    for values in [
        vec![SA_CREDENTIALS],
        vec![SA_CREDENTIALS, ("controllers", "{*,tagging,-tagging}")],
        vec![SA_CREDENTIALS, TAGGING_ON, ("provider", "vsphere")],
    ] {
        let objects = chart::render(&values).expect("helm template");
        assert_eq!(tagging_objects(&objects), Vec::<String>::new(), "{values:?}");
    }
    let objects = chart::render(&[SA_CREDENTIALS, TAGGING_ON]).expect("helm template");
    let mut found = tagging_objects(&objects);
    found.sort();
    assert_eq!(
        found,
        [
            "ClusterRole ccm-cloud-controller-manager-tagging-controller",
            "ClusterRoleBinding ccm-cloud-controller-manager-tagging-controller",
            "ServiceAccount ccm-cloud-controller-manager-tagging-controller",
        ]
    );
    // The manager may mint its token (the per-controller token Role names it).
    let role = objects
        .iter()
        .find(|o| chart::kind(o) == "Role" && chart::name(o).ends_with("-controller-accounts"))
        .expect("the token Role");
    let names = role["rules"][1]["resourceNames"].as_array().expect("resourceNames");
    assert!(names.contains(&json!("ccm-cloud-controller-manager-tagging-controller")), "{names:?}");
    // Without per-controller credentials the manager's identity makes the calls: no tagging
    // account; the role is bound to the manager's ServiceAccount, as every controller role.
    let objects = chart::render(&[TAGGING_ON]).expect("helm template");
    let manager = chart::name(chart::manager_service_account(&objects).unwrap()).to_string();
    assert_eq!(kube_system_accounts(&objects), [manager.as_str()]);
    let binding = objects
        .iter()
        .find(|o| {
            chart::kind(o) == "ClusterRoleBinding"
                && chart::name(o).ends_with("-tagging-controller")
        })
        .expect("the tagging binding");
    assert_eq!(binding["subjects"][0]["name"], json!(manager));
}

#[tokio::test]
async fn the_tagging_account_makes_the_tagging_controllers_calls_and_nothing_else() {
    let cp = ControlPlane::start().await.expect("control plane");
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let objects = chart::render(&[SA_CREDENTIALS, TAGGING_ON]).expect("helm template");
    chart::apply_rbac(&admin, &objects).await.expect("the chart's RBAC applies");
    let name = kube_system_accounts(&objects)
        .into_iter()
        .find(|n| n.ends_with("-tagging-controller"))
        .expect("the tagging-controller account");
    let sa: Client =
        chart::service_account_client(&cp, &admin, "kube-system", &name).await.unwrap();
    Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &kubelet_node("tag-1", "10.0.0.9", "True"))
        .await
        .unwrap();
    let nodes: Api<Node> = Api::all(sa.clone());

    // list (RBAC reaches the authorizer through informers: poll).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = nodes.list(&ListParams::default()).await;
        if !is_forbidden(&r) {
            assert_eq!(r.unwrap().items.len(), 1);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "list nodes still forbidden: {r:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // watch, and the label patch (tagging.rs: a merge patch of metadata.labels).
    let _watch = nodes.watch(&WatchParams::default().timeout(1), "0").await.expect("watch nodes");
    let patch = json!({"metadata": {"labels": {"k8s.io/cloud-provider-aws": "x"}}});
    nodes.patch("tag-1", &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch");

    // Nothing else.
    assert_forbidden("get a Node", nodes.get("tag-1").await);
    assert_forbidden("delete a Node", nodes.delete("tag-1", &DeleteParams::default()).await);
    assert_forbidden(
        "patch Node status",
        nodes.patch_status("tag-1", &PatchParams::default(), &Patch::Merge(&patch)).await,
    );
    assert_forbidden(
        "list Services",
        Api::<Service>::all(sa.clone()).list(&ListParams::default()).await,
    );
    assert_forbidden(
        "list Secrets",
        Api::<Secret>::all(sa.clone()).list(&ListParams::default()).await,
    );
}
