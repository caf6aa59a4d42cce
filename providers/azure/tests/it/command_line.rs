//! Azure's own flags (issue #30): `--cloud-config-secret-name/-namespace/-key` read the config
//! from that one Secret through the API (a ServiceAccount allowed to `get` only that Secret),
//! and `--enable-dynamic-reloading` rebuilds the provider when the Secret (or the
//! `--cloud-config` file) changes: the capability a running controller holds answers with the
//! new config; an unusable change keeps the old one.

use std::path::PathBuf;
use std::time::Duration;

use ccm_core::cloud::{CloudProvider, InstancesV2, ProviderInit};
use ccm_core::manager::{CancellationToken, parse_flags};
use ccm_emulators::azure::{DEFAULT_CLIENT_ID, DEFAULT_CLIENT_SECRET};
use ccm_provider_azure::config::SecretLocation;
use ccm_provider_azure::{AzureProvider, Source, command_line};
use ccm_testbed::{ControlPlane, chart, unique_name, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::PostParams;

use crate::fixture::{self, LOCATION, NSG, RESOURCE_GROUP, SUBNET, SUBSCRIPTION, TENANT, VNET};

/// The emulator's `azure.json` with this client secret and location.
fn azure_json(url: &str, secret: &str, location: &str) -> String {
    serde_json::json!({
        "cloud": "AzureStackCloud",
        "resourceManagerEndpoint": url,
        "tenantId": TENANT,
        "subscriptionId": SUBSCRIPTION,
        "aadClientId": DEFAULT_CLIENT_ID,
        "aadClientSecret": secret,
        "resourceGroup": RESOURCE_GROUP,
        "location": location,
        "vnetName": VNET,
        "subnetName": SUBNET,
        "securityGroupName": NSG,
        "loadBalancerSku": "standard",
    })
    .to_string()
}

/// `args` after the program name and `--cloud-provider=azure`, parsed as the binary parses
/// them, as the provider's [`Source`].
fn source(args: &[&str]) -> Result<Source, String> {
    let ext = ccm_provider_azure::extensions();
    let argv = ["cloud-controller-manager-azure", "--cloud-provider=azure"].iter().chain(args);
    parse_flags(&ext, argv).map_err(|e| e.to_string())?;
    command_line::source(&ext.parsed).map_err(|e| e.to_string())
}

#[test]
fn the_secret_flags_name_the_secret_and_reloading_is_off_by_default() {
    let s = source(&[]).unwrap();
    assert_eq!(
        s.secret,
        SecretLocation::default(),
        "kube-system/azure-cloud-provider, cloud-config"
    );
    assert_eq!((s.reload, s.file_path), (None, None));

    let s = source(&[
        "--cloud-config-secret-name=ccm-config",
        "--cloud-config-secret-namespace=infra",
        "--cloud-config-key=azure.json",
        "--enable-dynamic-reloading=true",
        "--cloud-config=/etc/kubernetes/azure.json",
    ])
    .unwrap();
    let want = SecretLocation {
        namespace: "infra".into(),
        name: "ccm-config".into(),
        key: "azure.json".into(),
    };
    assert_eq!(s.secret, want);
    assert_eq!(s.reload, Some(ccm_provider_azure::RELOAD_INTERVAL));
    assert_eq!(s.file_path, Some(PathBuf::from("/etc/kubernetes/azure.json")));

    let e = source(&["--cloud-config-secret-namespace=Not_A_Namespace"]).unwrap_err();
    assert!(e.contains("--cloud-config-secret-namespace"), "{e}");
    let e = source(&["--cloud-config-secret-name=a/b"]).unwrap_err();
    assert!(e.contains("--cloud-config-secret-name"), "{e}");
    let e = source(&["--cloud-config-key=a b"]).unwrap_err();
    assert!(e.contains("--cloud-config-key"), "{e}");
    // Upstream's other own flags are accepted (not acted on).
    source(&["--node-filter-requirements=pool in (a,b)", "--log-format=json"]).unwrap();
}

fn vm0() -> k8s_openapi::api::core::v1::Node {
    fixture::node("vm-0", Some(&fixture::vm_provider_id("vm-0")))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_config_comes_from_the_named_secret_and_a_change_is_reloaded() {
    let f = fixture::start().await;
    let url = f.server.url();
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();

    // The Secret, in a namespace of its own, under a non-default name and key.
    let ns = unique_name("azure-cfg");
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(admin.clone()).create(&PostParams::default(), &namespace).await.unwrap();
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &ns);
    let put = |text: String| {
        serde_json::from_value::<Secret>(serde_json::json!({
            "metadata": {"name": "ccm-config", "namespace": ns},
            "stringData": {"azure.json": text},
        }))
        .unwrap()
    };
    // First a wrong client secret: every ARM call is refused.
    secrets
        .create(&PostParams::default(), &put(azure_json(&url, "wrong", LOCATION)))
        .await
        .unwrap();

    // A ServiceAccount that may `get` that one Secret and nothing else.
    let sa = unique_name("azure-cfg-sa");
    let rbac = vec![
        serde_json::json!({"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": sa, "namespace": ns}}),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
            "metadata": {"name": sa, "namespace": ns},
            "rules": [{"apiGroups": [""], "resources": ["secrets"], "resourceNames": ["ccm-config"], "verbs": ["get"]}]}),
        serde_json::json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
            "metadata": {"name": sa, "namespace": ns},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": sa},
            "subjects": [{"kind": "ServiceAccount", "name": sa, "namespace": ns}]}),
    ];
    chart::apply_rbac(&admin, &rbac).await.unwrap();
    let client = chart::service_account_client(cp, &admin, &ns, &sa).await.unwrap();

    let source = Source {
        file_path: None,
        secret: SecretLocation {
            namespace: ns.clone(),
            name: "ccm-config".into(),
            key: "azure.json".into(),
        },
        reload: Some(Duration::from_millis(200)),
    };
    let provider = AzureProvider::new_with(None, f.options.clone(), source).unwrap();
    assert!(provider.instances_v2().is_none(), "no config before the Secret is read");
    let stop = CancellationToken::new();
    provider.initialize(ProviderInit::new(client, stop.clone())).unwrap();
    assert_eq!(provider.config().unwrap().location.as_deref(), Some(LOCATION));

    // What a running controller holds, taken once.
    let instances: std::sync::Arc<dyn InstancesV2> = provider.instances_v2().unwrap();
    let e = instances.instance_metadata(&vm0()).await.unwrap_err().to_string();
    assert!(!e.contains("wrong"), "the client secret is never quoted: {e}");

    // The Secret is fixed: the same capability answers with the new config.
    let mut s = secrets.get("ccm-config").await.unwrap();
    s = Secret { metadata: s.metadata, ..put(azure_json(&url, DEFAULT_CLIENT_SECRET, "westus")) };
    s.metadata.managed_fields = None;
    secrets.replace("ccm-config", &PostParams::default(), &s).await.unwrap();
    let meta =
        wait_for("the reloaded config to reach the controllers", Duration::from_secs(30), || {
            let instances = instances.clone();
            async move { instances.instance_metadata(&vm0()).await.ok() }
        })
        .await;
    assert_eq!(meta.instance_type, "Standard_D4s_v3");
    assert_eq!(provider.config().unwrap().location.as_deref(), Some("westus"));

    // An unusable change is logged and the working config kept.
    let mut s = secrets.get("ccm-config").await.unwrap();
    s = Secret { metadata: s.metadata, ..put("{not json".into()) };
    s.metadata.managed_fields = None;
    secrets.replace("ccm-config", &PostParams::default(), &s).await.unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(provider.config().unwrap().location.as_deref(), Some("westus"));
    instances.instance_metadata(&vm0()).await.unwrap();
    stop.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_changed_cloud_config_file_is_reloaded() {
    let f = fixture::start().await;
    let url = f.server.url();
    let cp = ControlPlane::shared().await.unwrap();
    let admin = cp.admin_client().await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("azure.json");
    let with_type = |json: String| {
        let mut v: serde_json::Value = serde_json::from_str(&json).unwrap();
        v["cloudConfigType"] = "file".into();
        v.to_string()
    };
    let first = with_type(azure_json(&url, "wrong", LOCATION));
    std::fs::write(&path, &first).unwrap();
    let source = Source {
        file_path: Some(path.clone()),
        secret: SecretLocation::default(),
        reload: Some(Duration::from_millis(200)),
    };
    let provider =
        AzureProvider::new_with(Some(first.as_bytes()), f.options.clone(), source).unwrap();
    let stop = CancellationToken::new();
    provider.initialize(ProviderInit::new(admin, stop.clone())).unwrap();
    let instances = provider.instances_v2().unwrap();
    instances.instance_metadata(&vm0()).await.unwrap_err();

    std::fs::write(&path, with_type(azure_json(&url, DEFAULT_CLIENT_SECRET, "westus"))).unwrap();
    wait_for("the reloaded file to reach the controllers", Duration::from_secs(30), || {
        let instances = instances.clone();
        async move { instances.instance_metadata(&vm0()).await.ok() }
    })
    .await;
    assert_eq!(provider.config().unwrap().location.as_deref(), Some("westus"));

    // Without --enable-dynamic-reloading nothing is re-read.
    let still = with_type(azure_json(&url, DEFAULT_CLIENT_SECRET, LOCATION));
    std::fs::write(&path, &still).unwrap();
    let fixed = AzureProvider::new_with(
        Some(still.as_bytes()),
        f.options.clone(),
        Source { file_path: Some(path.clone()), ..Source::default() },
    )
    .unwrap();
    std::fs::write(&path, with_type(azure_json(&url, DEFAULT_CLIENT_SECRET, "westus"))).unwrap();
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(fixed.config().unwrap().location.as_deref(), Some(LOCATION));
    stop.cancel();
}
