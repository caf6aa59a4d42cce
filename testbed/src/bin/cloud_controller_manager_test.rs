//! `cloud-controller-manager-test`: the real manager with the scripted test cloud, for
//! process-level tests only (never shipped).
//!
//! The cloud's instances fail every call (so controllers that run against the shared test
//! apiserver never change nodes of other tests); zones are static. `--cloud-config`, when
//! given, is JSON `{"zone": "...", "region": "..."}`.

use std::sync::Arc;

use async_trait::async_trait;
use ccm_core::cloud::{CloudProvider, InstancesV2, ProviderError, Zone, Zones};
use ccm_core::testing::{Fault, TestCloud, TestInstances};

#[derive(serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Config {
    #[serde(default = "default_zone")]
    zone: String,
    #[serde(default = "default_region")]
    region: String,
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
        self.inner.instances_v2()
    }

    fn zones(&self) -> Option<Arc<dyn Zones>> {
        Some(self.zones.clone())
    }
}

fn main() -> std::process::ExitCode {
    ccm_core::manager::main(
        ccm_core::testing::PROVIDER_NAME,
        Box::new(|config| {
            let config: Config = match config {
                Some(bytes) => serde_json::from_slice(bytes)
                    .map_err(|e| format!("invalid test cloud config: {e}"))?,
                None => Config { zone: default_zone(), region: default_region() },
            };
            let instances = Arc::new(TestInstances::batching());
            instances.set_fault(Some(Fault::Unavailable));
            Ok(Arc::new(Cloud {
                inner: TestCloud::with_instances(instances),
                zones: Arc::new(StaticZones(Zone {
                    failure_domain: config.zone,
                    region: config.region,
                })),
            }) as Arc<dyn CloudProvider>)
        }),
    )
}
