//! The cluster ID ConfigMap `kube-system/ingress-uid` under upstream's RBAC (issue #30):
//! upstream's role grants `list`/`watch` on ConfigMaps (and `create`), never `get`. The ID is
//! read through a `list` with the name's field selector, by a ServiceAccount holding exactly
//! such a Role, with no Forbidden answer; and then watched (issue #32), so a later change is
//! followed.

use ccm_provider_gcp::load_balancer::cluster_id::{self, ClusterId};
use ccm_testbed::{ControlPlane, chart, unique_name};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::DeleteParams;

/// A ServiceAccount bound in `kube-system` to a Role granting `verbs` on ConfigMaps; its client.
async fn client_with(cp: &ControlPlane, admin: &kube::Client, verbs: &[&str]) -> kube::Client {
    client_with_rule(
        cp,
        admin,
        serde_json::json!({"apiGroups": [""], "resources": ["configmaps"], "verbs": verbs}),
    )
    .await
}

/// A ServiceAccount bound in `kube-system` to a Role with `rule`; its client.
async fn client_with_rule(
    cp: &ControlPlane,
    admin: &kube::Client,
    rule: serde_json::Value,
) -> kube::Client {
    let sa = unique_name("gce-cid");
    let ns = unique_name("gce-cid-ns");
    let rbac = vec![
        serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}}),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": sa, "namespace": cluster_id::NAMESPACE},
            "rules": [rule]}),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": sa, "namespace": cluster_id::NAMESPACE},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}),
    ];
    chart::apply_rbac(admin, &rbac).await.unwrap();
    chart::service_account_client(cp, admin, &ns, &sa).await.unwrap()
}

#[tokio::test]
async fn the_cluster_id_is_read_with_list_and_watch_only_and_created_with_create() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let cms: Api<ConfigMap> = Api::namespaced(admin.clone(), cluster_id::NAMESPACE);
    // This binary's only user of the ConfigMap: start without it.
    let _ = cms.delete(cluster_id::CONFIG_MAP, &DeleteParams::default()).await;

    // Upstream's grant: list and watch, no get. Without the ConfigMap, a create is needed
    // (upstream creates it too): refused here, so the error names the create.
    let list_watch = client_with(cp, &admin, &["list", "watch"]).await;
    let reader = ClusterId::default();
    reader.set_kube(list_watch.clone());
    let e = reader.get().await.unwrap_err().to_string();
    assert!(e.contains("creating ConfigMap kube-system/ingress-uid"), "{e}");

    // With create as well, the ID is made and stored under both keys.
    let creator = ClusterId::default();
    creator.set_kube(client_with(cp, &admin, &["list", "watch", "create"]).await);
    let id = creator.get().await.unwrap();
    assert_eq!(id.len(), 16, "{id}");
    let cm = cms.get(cluster_id::CONFIG_MAP).await.unwrap();
    let data = cm.data.unwrap();
    assert_eq!(data.get(cluster_id::KEY_UID), Some(&id));
    assert_eq!(data.get(cluster_id::KEY_PROVIDER_UID), Some(&id));

    // The list/watch-only identity now reads it (a `get` would be Forbidden: shown below).
    let reader = ClusterId::default();
    reader.set_kube(list_watch.clone());
    assert_eq!(reader.get().await.unwrap(), id);
    let forbidden = Api::<ConfigMap>::namespaced(list_watch, cluster_id::NAMESPACE)
        .get(cluster_id::CONFIG_MAP)
        .await
        .unwrap_err();
    assert!(
        matches!(&forbidden, kube::Error::Api(s) if s.code == 403),
        "a get must be refused under this Role, else the test proves nothing: {forbidden}"
    );

    // `provider-uid` wins over `uid` (ingress-gce's federation key), read the same way.
    let mut cm = cms.get(cluster_id::CONFIG_MAP).await.unwrap();
    cm.data.get_or_insert_default().insert(cluster_id::KEY_PROVIDER_UID.into(), "feedface".into());
    cm.metadata.managed_fields = None;
    cms.replace(cluster_id::CONFIG_MAP, &Default::default(), &cm).await.unwrap();
    let reader = ClusterId::default();
    reader.set_kube(client_with(cp, &admin, &["list", "watch"]).await);
    assert_eq!(reader.get().await.unwrap(), "feedface");

    // Issue #32 (GCP 6): the ConfigMap is watched, not read once: the reader that created it
    // (and read `id` then) follows the change, through its list/watch.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        let now = creator.get().await.unwrap();
        if now == "feedface" {
            break;
        }
        assert_eq!(now, id);
        assert!(std::time::Instant::now() < deadline, "the change to provider-uid was never seen");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }

    // The tightest rule a chart can write: list/watch of that one name (the field selector
    // names it, so RBAC's resourceNames applies).
    let reader = ClusterId::default();
    reader.set_kube(
        client_with_rule(
            cp,
            &admin,
            serde_json::json!({"apiGroups": [""], "resources": ["configmaps"],
                "verbs": ["list", "watch"], "resourceNames": [cluster_id::CONFIG_MAP]}),
        )
        .await,
    );
    assert_eq!(reader.get().await.unwrap(), "feedface");

    cms.delete(cluster_id::CONFIG_MAP, &DeleteParams::default()).await.unwrap();
}
