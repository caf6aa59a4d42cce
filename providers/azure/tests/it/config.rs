//! The cloud config read through the API server: the Secret (one `get` by name), merged over
//! the file or alone, as `cloudConfigType` says.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use ccm_provider_azure::config::{SecretLocation, VmType, load_from};
use ccm_testbed::{ControlPlane, unique_name};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::PostParams;

async fn namespace_with_secret(client: &kube::Client, data: Option<(&str, &str)>) -> String {
    let ns = unique_name("azure-config");
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.unwrap();
    if let Some((key, text)) = data {
        let secret: Secret = serde_json::from_value(serde_json::json!({
            "metadata": {"name": "azure-cloud-provider", "namespace": ns},
            "stringData": {key: text},
        }))
        .unwrap();
        Api::<Secret>::namespaced(client.clone(), &ns)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    ns
}

fn at(ns: &str) -> SecretLocation {
    SecretLocation { namespace: ns.into(), ..SecretLocation::default() }
}

#[tokio::test]
async fn the_secret_is_merged_over_the_file_or_used_alone() {
    let cp = ControlPlane::shared().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    let none = |_: &str| None;
    let ns = namespace_with_secret(
        &client,
        Some(("cloud-config", "location: westeurope\nvmType: vmssflex\n")),
    )
    .await;
    // merge (default): the Secret's keys over the file's.
    let file = b"{\"location\": \"eastus\", \"resourceGroup\": \"RG\", \"vmType\": \"standard\"}";
    let c = load_from(Some(file), Some(client.clone()), &at(&ns), &none).await.unwrap();
    assert_eq!(c.location.as_deref(), Some("westeurope"));
    assert_eq!(c.resource_group.as_deref(), Some("rg"));
    assert_eq!(c.vm_type, VmType::VmssFlex);
    // secret: the Secret alone.
    let c = load_from(
        Some(b"cloudConfigType: secret\nresourceGroup: rg"),
        Some(client.clone()),
        &at(&ns),
        &none,
    )
    .await
    .unwrap();
    assert_eq!((c.location.as_deref(), c.resource_group.as_deref()), (Some("westeurope"), None));
    // file: the Secret is not read.
    let c = load_from(
        Some(b"cloudConfigType: file\nlocation: eastus"),
        Some(client.clone()),
        &at(&ns),
        &none,
    )
    .await
    .unwrap();
    assert_eq!(c.location.as_deref(), Some("eastus"));
    // No file: the Secret alone, with the environment's overrides.
    let env = |k: &str| (k == "AZURE_TENANT_ID").then(|| "from-env".to_string());
    let c = load_from(None, Some(client.clone()), &at(&ns), &env).await.unwrap();
    assert_eq!(c.tenant_id.as_deref(), Some("from-env"));

    // merge without a Secret: the file alone; secret without one: an error.
    let empty = namespace_with_secret(&client, None).await;
    let c = load_from(Some(b"location: eastus"), Some(client.clone()), &at(&empty), &none)
        .await
        .unwrap();
    assert_eq!(c.location.as_deref(), Some("eastus"));
    let e =
        load_from(None, Some(client.clone()), &at(&empty), &none).await.unwrap_err().to_string();
    assert_eq!(e, format!("azure cloud config: Secret {empty}/azure-cloud-provider: not found"));
}

#[tokio::test]
async fn a_bad_secret_is_an_error_naming_it_and_never_quoting_it() {
    let cp = ControlPlane::shared().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    let none = |_: &str| None;
    let ns = namespace_with_secret(&client, Some(("other-key", "location: x"))).await;
    let e = load_from(None, Some(client.clone()), &at(&ns), &none).await.unwrap_err().to_string();
    assert!(e.ends_with("has no key \"cloud-config\""), "{e}");
    let ns = namespace_with_secret(
        &client,
        Some(("cloud-config", "aadClientSecret: s3cr3t\naadClientSecert: s3cr3t\n")),
    )
    .await;
    let e = load_from(None, Some(client.clone()), &at(&ns), &none).await.unwrap_err().to_string();
    assert!(e.contains("unknown key \"aadClientSecert\""), "{e}");
    assert!(!e.contains("s3cr3t"), "{e}");
}
