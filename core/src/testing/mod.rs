//! A scripted cloud for controller tests (feature `testing`; never in shipped binaries).
//!
//! Tests script instances (and their errors and latency), run the real controllers against
//! the real apiserver, and assert on what the controllers did and on how many cloud calls
//! they made ([`Calls`]).

mod instances;
mod load_balancer;
mod node_cidrs;
mod routes;

use std::sync::Arc;

pub use instances::{Calls, Fault, ScriptedInstance, TestInstances};
pub use load_balancer::{LbCalls, LbFault, ScriptedLoadBalancer, TestLoadBalancers};
pub use node_cidrs::TestNodeCidrs;
pub use routes::{RouteCalls, RouteFault, TestRoutes};

use crate::cloud::{CloudProvider, InstancesV2, LoadBalancer, NodeCidrs, Routes};

/// Makes in-process log capture with a thread-scoped subscriber (`set_default`) reliable
/// while other tests of the binary run in parallel. Call it right after installing the
/// capturing subscriber.
///
/// `tracing` caches each callsite's interest process-wide, computed once, on the thread that
/// first reaches it: a sibling test with no subscriber caches `never` and the event is then
/// dropped everywhere, including on the capturing thread (CI lost a "cloud call is stalled"
/// warning this way). A global no-op subscriber (a bare `Registry`) makes every thread
/// interested, and rebuilding the cache repairs callsites cached before it was installed.
pub fn anchor_tracing() {
    static ANCHOR: std::sync::Once = std::sync::Once::new();
    ANCHOR.call_once(|| {
        // Fails only when a global subscriber exists already, which anchors just as well.
        let _ = tracing::subscriber::set_global_default(tracing_subscriber::registry());
    });
    tracing::callsite::rebuild_interest_cache();
}

/// The provider name of the test cloud; providerIDs look like `test://<instance-id>`.
pub const PROVIDER_NAME: &str = "test";

/// A scripted cloud. Capabilities are present when set.
#[derive(Clone, Default)]
pub struct TestCloud {
    /// Scripted instances (InstancesV2).
    pub instances: Option<Arc<TestInstances>>,
    /// Scripted load balancers.
    pub load_balancers: Option<Arc<TestLoadBalancers>>,
    /// Scripted routes.
    pub routes: Option<Arc<TestRoutes>>,
    /// Scripted cloud-assigned pod CIDRs.
    pub node_cidrs: Option<Arc<TestNodeCidrs>>,
}

impl TestCloud {
    /// A cloud with scripted instances only.
    pub fn with_instances(instances: Arc<TestInstances>) -> Self {
        TestCloud { instances: Some(instances), ..Default::default() }
    }
}

impl CloudProvider for TestCloud {
    fn name(&self) -> &str {
        PROVIDER_NAME
    }

    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        self.instances.clone().map(|i| i as Arc<dyn InstancesV2>)
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        self.load_balancers.clone().map(|l| l as Arc<dyn LoadBalancer>)
    }

    fn routes(&self) -> Option<Arc<dyn Routes>> {
        self.routes.clone().map(|r| r as Arc<dyn Routes>)
    }

    fn node_cidrs(&self) -> Option<Arc<dyn NodeCidrs>> {
        self.node_cidrs.clone().map(|c| c as Arc<dyn NodeCidrs>)
    }
}

/// A scripted cloud that names its resources by `--cluster-name` (as the AWS or GCP
/// providers do), for the manager's start-up warning about the default cluster name.
#[derive(Clone, Default)]
pub struct ClusterNamedCloud(pub TestCloud);

impl CloudProvider for ClusterNamedCloud {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn names_resources_by_cluster(&self) -> bool {
        true
    }

    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        self.0.instances_v2()
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        self.0.load_balancer()
    }

    fn routes(&self) -> Option<Arc<dyn Routes>> {
        self.0.routes()
    }

    fn node_cidrs(&self) -> Option<Arc<dyn NodeCidrs>> {
        self.0.node_cidrs()
    }
}
