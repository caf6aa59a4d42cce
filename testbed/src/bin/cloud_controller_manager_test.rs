//! `cloud-controller-manager-test`: the real manager with the scripted test cloud, for
//! process-level tests only (never shipped).
//!
//! The cloud's instances fail every call (so controllers that run against the shared test
//! apiserver never change nodes of other tests); zones are static. `--cloud-config`, when
//! given, is JSON `{"zone": "...", "region": "...", "panic": false}`; `"panic": true` makes
//! every instances call panic (a provider bug), which kills the controller that made it.
//!
//! `CCM_TEST_PROVIDER_NAME` (e.g. `aws`) changes the name `--cloud-provider` must give, so an
//! upstream provider's manifest arguments can be passed unchanged.

use std::sync::Arc;

use async_trait::async_trait;
use ccm_core::cloud::{CloudProvider, InstanceMetadata, InstancesV2, ProviderError, Zone, Zones};
use ccm_core::testing::{Fault, TestCloud, TestInstances};
use k8s_openapi::api::core::v1::Node;

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_zone")]
    zone: String,
    #[serde(default = "default_region")]
    region: String,
    #[serde(default)]
    panic: bool,
}

fn default_zone() -> String {
    "test-zone-a".into()
}

fn default_region() -> String {
    "test-region-1".into()
}

struct Cloud {
    inner: TestCloud,
    zones: Arc<StaticZones>,
    panicking: bool,
}

/// Instances whose every call panics (`"panic": true`).
struct PanickingInstances;

#[async_trait]
impl InstancesV2 for PanickingInstances {
    async fn instance_exists(&self, node: &Node) -> Result<bool, ProviderError> {
        panic!("test cloud: scripted panic in instance_exists({:?})", node.metadata.name)
    }

    async fn instance_shutdown(&self, node: &Node) -> Result<bool, ProviderError> {
        panic!("test cloud: scripted panic in instance_shutdown({:?})", node.metadata.name)
    }

    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata, ProviderError> {
        panic!("test cloud: scripted panic in instance_metadata({:?})", node.metadata.name)
    }
}

struct StaticZones(Zone);

#[async_trait]
impl Zones for StaticZones {
    async fn zone_by_provider_id(&self, _provider_id: &str) -> Result<Zone, ProviderError> {
        Ok(self.0.clone())
    }

    async fn zone_by_node_name(&self, _node_name: &str) -> Result<Zone, ProviderError> {
        Ok(self.0.clone())
    }
}

impl CloudProvider for Cloud {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        if self.panicking {
            return Some(Arc::new(PanickingInstances));
        }
        self.inner.instances_v2()
    }

    fn zones(&self) -> Option<Arc<dyn Zones>> {
        Some(self.zones.clone())
    }
}

fn main() -> std::process::ExitCode {
    let provider = std::env::var("CCM_TEST_PROVIDER_NAME")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| ccm_core::testing::PROVIDER_NAME.to_string());
    ccm_core::manager::main(
        &provider,
        Box::new(|config| {
            let config: Config = match config {
                Some(bytes) => serde_json::from_slice(bytes)
                    .map_err(|e| format!("invalid test cloud config: {e}"))?,
                None => Config { zone: default_zone(), region: default_region(), panic: false },
            };
            let instances = Arc::new(TestInstances::batching());
            instances.set_fault(Some(Fault::Unavailable));
            Ok(Arc::new(Cloud {
                inner: TestCloud::with_instances(instances),
                zones: Arc::new(StaticZones(Zone {
                    failure_domain: config.zone,
                    region: config.region,
                })),
                panicking: config.panic,
            }) as Arc<dyn CloudProvider>)
        }),
    )
}
