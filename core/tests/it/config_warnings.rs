//! A provider's cloud-config warnings (`CloudProvider::config_warnings`: what reading its config
//! skipped) reach the cluster: the manager records each once, at start, as a core/v1 `Warning`
//! Event `CloudConfigWarning` from component `cloud-controller-manager`, about its
//! leader-election Lease (no Pod identity here: POD_NAME/POD_NAMESPACE unset).

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::CloudProvider;
use ccm_core::manager::extensions::Extensions;
use ccm_core::manager::flags::Flags;
use ccm_core::manager::{CONFIG_WARNING_REASON, CancellationToken, run_until};
use ccm_testbed::{ControlPlane, Identity, unique_name, wait_for};
use clap::Parser;
use k8s_openapi::api::core::v1::Event;
use kube::Api;
use kube::api::ListParams;

/// A cloud whose config reading skipped two things.
struct WarnedCloud;

const WARNINGS: [&str; 2] = [
    "cloud config line 3: unknown key \"Zoen\" in section [Global] skipped",
    "cloud config line 7: unknown section [Nope] skipped",
];

impl CloudProvider for WarnedCloud {
    fn name(&self) -> &str {
        "test"
    }

    fn config_warnings(&self) -> Vec<String> {
        WARNINGS.iter().map(|w| w.to_string()).collect()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_config_warning_is_one_warning_event_about_the_lease() {
    assert!(std::env::var_os("POD_NAME").is_none(), "this test expects no Pod identity");
    let cp = ControlPlane::shared().await.expect("control plane");
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let dir = std::env::temp_dir().join(unique_name("ccm-config-warnings"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("admin.kubeconfig");
    cp.write_kubeconfig(&kubeconfig, &Identity::admin()).unwrap();
    let lease = unique_name("ccm-warned");
    let flags = Flags::try_parse_from([
        "ccm".to_string(),
        "--cloud-provider=test".into(),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--leader-elect=false".into(),
        format!("--leader-elect-resource-name={lease}"),
        "--secure-port=0".into(),
        "--webhook-secure-port=0".into(),
        "--controllers=cloud-node".into(),
    ])
    .unwrap();
    let options = flags.validate("test", &ccm_core::controllers::all()).unwrap();
    let factory: ccm_core::manager::CloudFactory =
        Box::new(|_| Ok(Arc::new(WarnedCloud) as Arc<dyn CloudProvider>));
    let stop = CancellationToken::new();
    let manager = {
        let stop = stop.clone();
        tokio::spawn(async move {
            run_until("test", options, factory, &Extensions::default(), stop).await
        })
    };

    let events = Api::<Event>::namespaced(admin.clone(), "kube-system");
    let selector = format!("involvedObject.name={lease},reason={CONFIG_WARNING_REASON}");
    let list =
        || async { events.list(&ListParams::default().fields(&selector)).await.unwrap().items };
    wait_for("the CloudConfigWarning Events", Duration::from_secs(30), || async {
        let items = list().await;
        (items.len() >= WARNINGS.len()).then_some(())
    })
    .await;
    // Nothing more arrives: one Event per warning, each recorded once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.cancel();
    let result = tokio::time::timeout(Duration::from_secs(60), manager).await;
    assert!(matches!(result, Ok(Ok(Ok(())))), "manager did not stop cleanly: {result:?}");

    let items = list().await;
    let mut messages: Vec<String> =
        items.iter().map(|e| e.message.clone().unwrap_or_default()).collect();
    messages.sort();
    assert_eq!(messages, WARNINGS, "one Event per warning");
    for e in &items {
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.count, Some(1), "{e:?}");
        assert_eq!(e.involved_object.kind.as_deref(), Some("Lease"));
        assert_eq!(e.involved_object.namespace.as_deref(), Some("kube-system"));
        let source = e.source.as_ref().and_then(|s| s.component.as_deref());
        let reporting = e.reporting_component.as_deref();
        assert!(
            source == Some("cloud-controller-manager")
                || reporting == Some("cloud-controller-manager"),
            "{e:?}"
        );
    }
}
