//! Integration tests of the vSphere provider against govmomi's vCenter simulator.
//!
//! Every test starts its own simulator (`sim::Vcsim`) on a free loopback port and drives
//! the provider's public API: the vim25/tagging clients and `InstancesV2` with hand-built
//! Nodes.
// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod addresses;
mod client;
mod credentials;
mod deadline;
mod instances;
mod lookup;
mod provider;
mod sim;
mod throttling;
mod zones;

use k8s_openapi::api::core::v1::{Node, NodeSpec};

/// A Node with this name and, optionally, a providerID.
pub fn node(name: &str, provider_id: Option<&str>) -> Node {
    let mut node = Node::default();
    node.metadata.name = Some(name.to_string());
    node.spec = Some(NodeSpec { provider_id: provider_id.map(String::from), ..Default::default() });
    node
}

/// `(type, address)` pairs, for comparing node addresses.
pub fn addresses(meta: &ccm_core::cloud::InstanceMetadata) -> Vec<(String, String)> {
    meta.node_addresses.iter().map(|a| (a.type_.clone(), a.address.clone())).collect()
}

/// Owned `(type, address)` pairs from literals.
pub fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}
