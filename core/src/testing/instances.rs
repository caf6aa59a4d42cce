//! Scripted instances with call counts, fault injection and latency.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::Node;

use crate::cloud::{InstanceMetadata, InstanceStatus, InstancesV2, ProviderError};

/// One scripted instance.
#[derive(Debug, Clone)]
pub struct ScriptedInstance {
    /// What the cloud reports.
    pub metadata: InstanceMetadata,
    /// Whether it is shut down.
    pub shutdown: bool,
}

/// Counts of cloud calls, by kind.
#[derive(Debug, Default)]
pub struct Calls {
    /// `instance_metadata` single calls.
    pub metadata: AtomicUsize,
    /// `instance_metadata_batch` calls answered in one "cloud request" (batching on).
    pub metadata_batches: AtomicUsize,
    /// Nodes asked about in metadata batches.
    pub metadata_batched_nodes: AtomicUsize,
    /// `instance_exists` / `instance_shutdown` single calls.
    pub status: AtomicUsize,
    /// `instance_status_batch` calls answered in one "cloud request" (batching on).
    pub status_batches: AtomicUsize,
}

impl Calls {
    /// Every cloud request made so far (a batch counts once).
    pub fn total(&self) -> usize {
        self.metadata.load(Ordering::SeqCst)
            + self.metadata_batches.load(Ordering::SeqCst)
            + self.status.load(Ordering::SeqCst)
            + self.status_batches.load(Ordering::SeqCst)
    }
}

/// Which calls fail, and how.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every call fails with a generic cloud error.
    Unavailable,
    /// Every call is throttled.
    Throttled,
}

impl From<Fault> for ProviderError {
    fn from(f: Fault) -> Self {
        match f {
            Fault::Unavailable => ProviderError::other("test cloud: service unavailable"),
            Fault::Throttled => ProviderError::Throttled("test cloud: rate exceeded".into()),
        }
    }
}

/// Scripted instances keyed by node name. Lookups use `spec.providerID` when set
/// (`test://<node-name>`), else the node name.
#[derive(Debug, Default)]
pub struct TestInstances {
    instances: Mutex<HashMap<String, ScriptedInstance>>,
    fault: Mutex<Option<Fault>>,
    latency: Mutex<Duration>,
    batching: bool,
    /// Call counts.
    pub calls: Calls,
}

fn node_key(node: &Node) -> String {
    let pid = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default();
    match pid.strip_prefix("test://") {
        Some(id) if !id.is_empty() => id.to_string(),
        _ => node.metadata.name.clone().unwrap_or_default(),
    }
}

impl TestInstances {
    /// A cloud that answers batch methods one node at a time (the trait defaults).
    pub fn new() -> Self {
        Self::default()
    }

    /// A cloud that answers each batch with one request, as a batching provider does.
    pub fn batching() -> Self {
        TestInstances { batching: true, ..Self::default() }
    }

    /// Adds or replaces the instance behind `node_name`.
    pub fn set(&self, node_name: &str, instance: ScriptedInstance) {
        self.lock_instances().insert(node_name.to_string(), instance);
    }

    /// Removes the instance behind `node_name` (it no longer exists).
    pub fn remove(&self, node_name: &str) {
        self.lock_instances().remove(node_name);
    }

    /// Marks the instance behind `node_name` as shut down or running.
    pub fn set_shutdown(&self, node_name: &str, shutdown: bool) {
        if let Some(i) = self.lock_instances().get_mut(node_name) {
            i.shutdown = shutdown;
        }
    }

    /// Makes every call fail (or succeed again with `None`).
    pub fn set_fault(&self, fault: Option<Fault>) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = fault;
    }

    /// Adds latency to every cloud request.
    pub fn set_latency(&self, latency: Duration) {
        *self.latency.lock().unwrap_or_else(|p| p.into_inner()) = latency;
    }

    fn lock_instances(&self) -> std::sync::MutexGuard<'_, HashMap<String, ScriptedInstance>> {
        self.instances.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One cloud request: waits the scripted latency, then fails if a fault is set.
    async fn request(&self) -> Result<(), Fault> {
        let latency = *self.latency.lock().unwrap_or_else(|p| p.into_inner());
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match *self.fault.lock().unwrap_or_else(|p| p.into_inner()) {
            None => Ok(()),
            Some(f) => Err(f),
        }
    }

    fn lookup(&self, node: &Node) -> Option<ScriptedInstance> {
        self.lock_instances().get(&node_key(node)).cloned()
    }

    fn status_of(&self, node: &Node) -> InstanceStatus {
        match self.lookup(node) {
            None => InstanceStatus::NotFound,
            Some(i) if i.shutdown => InstanceStatus::Shutdown,
            Some(_) => InstanceStatus::Running,
        }
    }
}

#[async_trait]
impl InstancesV2 for TestInstances {
    async fn instance_exists(&self, node: &Node) -> Result<bool, ProviderError> {
        self.calls.status.fetch_add(1, Ordering::SeqCst);
        self.request().await?;
        Ok(self.lookup(node).is_some())
    }

    async fn instance_shutdown(&self, node: &Node) -> Result<bool, ProviderError> {
        self.calls.status.fetch_add(1, Ordering::SeqCst);
        self.request().await?;
        Ok(self.lookup(node).is_some_and(|i| i.shutdown))
    }

    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata, ProviderError> {
        self.calls.metadata.fetch_add(1, Ordering::SeqCst);
        self.request().await?;
        self.lookup(node).map(|i| i.metadata).ok_or(ProviderError::InstanceNotFound)
    }

    async fn instance_metadata_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceMetadata, ProviderError>> {
        if !self.batching {
            let calls = nodes.iter().map(|n| self.instance_metadata(n));
            return futures::future::join_all(calls).await;
        }
        self.calls.metadata_batches.fetch_add(1, Ordering::SeqCst);
        self.calls.metadata_batched_nodes.fetch_add(nodes.len(), Ordering::SeqCst);
        if let Err(f) = self.request().await {
            return nodes.iter().map(|_| Err(f.into())).collect();
        }
        nodes
            .iter()
            .map(|n| self.lookup(n).map(|i| i.metadata).ok_or(ProviderError::InstanceNotFound))
            .collect()
    }

    async fn instance_status_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceStatus, ProviderError>> {
        if !self.batching {
            let calls = nodes.iter().map(|n| async move {
                if !self.instance_exists(n).await? {
                    return Ok(InstanceStatus::NotFound);
                }
                Ok(if self.instance_shutdown(n).await? {
                    InstanceStatus::Shutdown
                } else {
                    InstanceStatus::Running
                })
            });
            return futures::future::join_all(calls).await;
        }
        self.calls.status_batches.fetch_add(1, Ordering::SeqCst);
        if let Err(f) = self.request().await {
            return nodes.iter().map(|_| Err(f.into())).collect();
        }
        nodes.iter().map(|n| Ok(self.status_of(n))).collect()
    }
}
