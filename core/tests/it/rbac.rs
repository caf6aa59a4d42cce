//! The chart's ClusterRole is enough for the node controllers: the test applies
//! `charts/cloud-controller-manager/templates/clusterrole.yaml` as it is, binds it to the
//! `system:cloud-controller-manager` user, and runs the cloud-node and lifecycle controllers
//! as that user against the real RBAC authorizer.

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::InstanceMetadata;
use ccm_core::controllers::{ControllerConfig, node, node_lifecycle};
use ccm_core::names;
use ccm_core::testing::{ScriptedInstance, TestCloud, TestInstances};
use ccm_testbed::fixtures::kubelet_node;
use ccm_testbed::{ControlPlane, Identity};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, RoleRef, Subject};
use kube::Api;
use kube::api::{ObjectMeta, PostParams};

use crate::support::run;

const CHART_ROLE: &str =
    include_str!("../../../charts/cloud-controller-manager/templates/clusterrole.yaml");

#[tokio::test]
async fn node_controllers_work_under_the_chart_cluster_role() {
    let cp = ControlPlane::start().await.expect("control plane");
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let role: ClusterRole =
        serde_saphyr::from_str(CHART_ROLE).expect("the chart's ClusterRole parses");
    let role_name = role.metadata.name.clone().unwrap();
    Api::<ClusterRole>::all(admin.clone()).create(&PostParams::default(), &role).await.unwrap();
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta { name: Some(role_name.clone()), ..Default::default() },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: role_name,
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "User".into(),
            name: "system:cloud-controller-manager".into(),
            namespace: None,
        }]),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    let ccm = cp.client(&Identity::new("system:cloud-controller-manager", &[])).await.unwrap();
    let instances = Arc::new(TestInstances::batching());
    instances.set(
        "rbac-live",
        ScriptedInstance {
            metadata: InstanceMetadata {
                provider_id: "test://rbac-live".into(),
                instance_type: "t.small".into(),
                ..Default::default()
            },
            shutdown: false,
        },
    );
    let config =
        ControllerConfig { node_monitor_period: Duration::from_millis(200), ..Default::default() };
    let cloud = TestCloud::with_instances(instances);
    let _node = run(&ccm, cloud.clone(), config.clone(), node::start);
    let _lifecycle = run(&ccm, cloud, config, node_lifecycle::start);

    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .create(&PostParams::default(), &kubelet_node("rbac-live", "10.9.0.1", "True"))
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &kubelet_node("rbac-gone", "10.9.0.2", "False"))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let live = nodes.get("rbac-live").await.unwrap();
        let initialised = live.spec.as_ref().and_then(|s| s.provider_id.as_deref())
            == Some("test://rbac-live")
            && !live
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|t| t.key == names::TAINT_UNINITIALIZED));
        let gone_deleted = nodes.get_opt("rbac-gone").await.unwrap().is_none();
        if initialised && gone_deleted {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "under the chart's role: initialised={initialised}, gone node deleted={gone_deleted}; \
             see the apiserver log for 403s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
