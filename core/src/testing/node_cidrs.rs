//! Scripted cloud-assigned pod CIDRs (node-IPAM `CloudAllocator`), keyed by node name.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use async_trait::async_trait;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Node;

use crate::cloud::{NodeCidrs, ProviderError};

/// The scripted capability.
#[derive(Debug, Default)]
pub struct TestNodeCidrs {
    cidrs: Mutex<HashMap<String, Vec<IpNet>>>,
    /// `node_pod_cidrs` calls.
    pub calls: AtomicUsize,
}

impl TestNodeCidrs {
    /// No CIDRs yet.
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the CIDRs the cloud reports for `node` (any order).
    pub fn set(&self, node: &str, cidrs: Vec<IpNet>) {
        self.cidrs.lock().unwrap_or_else(|p| p.into_inner()).insert(node.to_string(), cidrs);
    }
}

#[async_trait]
impl NodeCidrs for TestNodeCidrs {
    async fn node_pod_cidrs(&self, node: &Node) -> Result<Vec<IpNet>, ProviderError> {
        self.calls.fetch_add(1, Ordering::SeqCst);
        let name = node.metadata.name.as_deref().unwrap_or_default();
        Ok(self
            .cidrs
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(name)
            .cloned()
            .unwrap_or_default())
    }
}
