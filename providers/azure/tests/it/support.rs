//! Start-up helpers shared by the Azure integration tests: the core service controller on a
//! provider (scoped to one namespace and a Node label), the whole manager on an `azure.json`
//! text (as the binary runs it, stopped cleanly at the end), and upstream-made objects put in
//! the emulator first (a public IP tagged as upstream tags it).

// Shared by every test file: a helper some files do not call yet is not dead.
#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::CloudProvider;
use ccm_core::controllers::service::{self, ServiceOptions};
use ccm_core::controllers::{ControllerConfig, ControllerContext, Started};
use ccm_core::manager::{CancellationToken, ManagerError};
use ccm_provider_azure::AzureProvider;
use ccm_provider_azure::client::ClientOptions;
use ccm_testbed::ControlPlane;
use kube::Client;
use serde_json::json;
use tokio::task::JoinHandle;

use crate::fixture::{CLUSTER, Fixture};

/// The service controller on `provider`, scoped to namespace `ns` and, with `node_selector`
/// (`key=value`), to the Nodes it selects; fast retries. Cancel the token to stop it.
pub fn start_service_controller(
    client: &Client,
    provider: Arc<dyn CloudProvider>,
    ns: &str,
    node_selector: Option<String>,
) -> CancellationToken {
    let token = CancellationToken::new();
    let ctx = ControllerContext {
        client: client.clone(),
        cloud: provider,
        config: Arc::new(ControllerConfig::default()),
        metrics: Default::default(),
        shutdown: token.clone(),
        nodes: None,
    };
    let opts = ServiceOptions {
        min_retry_delay: Duration::from_millis(250),
        max_retry_delay: Duration::from_secs(2),
        namespace: Some(ns.into()),
        node_selector,
        ..Default::default()
    };
    match service::start_with(&ctx, opts).unwrap() {
        Started::Running(fut) => {
            tokio::spawn(fut);
        }
        Started::Skipped(why) => panic!("service controller skipped: {why}"),
    }
    token
}

/// The whole manager (`cloud-controller-manager-azure`), running until [`Manager::stop`].
pub struct Manager {
    shutdown: CancellationToken,
    task: JoinHandle<Result<(), ManagerError>>,
}

impl Manager {
    /// Parses the binary's flags (admin kubeconfig of `cp`, no leader election, no serving,
    /// `--controllers=<controllers>`, routes off, `--cluster-name=kubernetes`, then `extra`)
    /// and runs the manager with the provider built from `azure_json` and `options`.
    pub fn start(
        cp: &ControlPlane,
        azure_json: String,
        options: ClientOptions,
        controllers: &str,
        extra: &[&str],
    ) -> Manager {
        let ext = ccm_provider_azure::extensions();
        let mut argv = vec![
            "cloud-controller-manager-azure".to_string(),
            "--cloud-provider=azure".into(),
            format!("--kubeconfig={}", cp.admin_kubeconfig_path().display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--webhook-secure-port=0".into(),
            format!("--controllers={controllers}"),
            "--configure-cloud-routes=false".into(),
            format!("--cluster-name={CLUSTER}"),
        ];
        argv.extend(extra.iter().map(|a| a.to_string()));
        let flags = ccm_core::manager::parse_flags(&ext, argv).unwrap();
        let run_options = ext.validate(flags, "azure").unwrap();
        let factory: ccm_core::manager::CloudFactory = Box::new(move |_| {
            let p = AzureProvider::new(Some(azure_json.as_bytes()), options)?;
            Ok(Arc::new(p) as Arc<dyn CloudProvider>)
        });
        let shutdown = CancellationToken::new();
        let stop = shutdown.clone();
        let task = tokio::spawn(async move {
            ccm_core::manager::run_until("azure", run_options, factory, &ext, stop).await
        });
        Manager { shutdown, task }
    }

    /// Cancels the manager and asserts it stopped cleanly within a minute.
    pub async fn stop(self) {
        self.shutdown.cancel();
        let stopped = tokio::time::timeout(Duration::from_secs(60), self.task).await;
        assert!(matches!(stopped, Ok(Ok(Ok(())))), "manager did not stop cleanly: {stopped:?}");
    }
}

/// Puts the Standard public IP `id` with address `addr`, tagged as upstream tags the public
/// IP it makes for `services` (`ns/name`, comma-separated) in this cluster.
pub fn put_upstream_public_ip(f: &Fixture, id: &str, services: &str, addr: &str) {
    f.cloud
        .put_resource(
            id,
            json!({
                "sku": {"name": "Standard", "tier": "Regional"},
                "tags": {"k8s-azure-service": services, "k8s-azure-cluster-name": CLUSTER},
                "properties": {"publicIPAllocationMethod": "Static",
                               "publicIPAddressVersion": "IPv4", "ipAddress": addr},
            }),
        )
        .unwrap();
}

/// `azure.json` with upstream's keys for the emulator at `url`: the fixture's tenant,
/// subscription, resource group, location and network, the emulator's default client and
/// secret, a standard load balancer. `changes` adds keys, or removes them with `null`.
pub fn azure_json(url: &str, changes: serde_json::Value) -> String {
    use crate::fixture::{LOCATION, NSG, RESOURCE_GROUP, SUBNET, SUBSCRIPTION, TENANT, VNET};
    let mut config = json!({
        "cloudConfigType": "file",
        "cloud": "AzureStackCloud",
        "resourceManagerEndpoint": url,
        "tenantId": TENANT,
        "subscriptionId": SUBSCRIPTION,
        "aadClientId": ccm_emulators::azure::DEFAULT_CLIENT_ID,
        "aadClientSecret": ccm_emulators::azure::DEFAULT_CLIENT_SECRET,
        "resourceGroup": RESOURCE_GROUP,
        "location": LOCATION,
        "vnetName": VNET,
        "subnetName": SUBNET,
        "securityGroupName": NSG,
        "loadBalancerSku": "standard",
    });
    if let (Some(config), Some(changes)) = (config.as_object_mut(), changes.as_object()) {
        for (key, value) in changes {
            if value.is_null() {
                config.remove(key);
            } else {
                config.insert(key.clone(), value.clone());
            }
        }
    }
    config.to_string()
}
