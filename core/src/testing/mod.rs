//! A scripted cloud for controller tests (feature `testing`; never in shipped binaries).
//!
//! Tests script instances (and their errors and latency), run the real controllers against
//! the real apiserver, and assert on what the controllers did and on how many cloud calls
//! they made ([`Calls`]).

mod instances;

use std::sync::Arc;

pub use instances::{Calls, Fault, ScriptedInstance, TestInstances};

use crate::cloud::{CloudProvider, InstancesV2};

/// The provider name of the test cloud; providerIDs look like `test://<instance-id>`.
pub const PROVIDER_NAME: &str = "test";

/// A scripted cloud. Capabilities are present when set.
#[derive(Clone, Default)]
pub struct TestCloud {
    /// Scripted instances (InstancesV2).
    pub instances: Option<Arc<TestInstances>>,
}

impl TestCloud {
    /// A cloud with scripted instances only.
    pub fn with_instances(instances: Arc<TestInstances>) -> Self {
        TestCloud { instances: Some(instances) }
    }
}

impl CloudProvider for TestCloud {
    fn name(&self) -> &str {
        PROVIDER_NAME
    }

    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        self.instances.clone().map(|i| i as Arc<dyn InstancesV2>)
    }
}
