//! End-to-end tests of the `cloud-controller-manager-<cloud>` binaries: the real binary as a
//! process, against a real kube-apiserver (`ccm_testbed::ControlPlane`) and, for vSphere,
//! govmomi's vCenter simulator (`ccm_testbed::vcsim`).
//!
//! Every test starts its own control plane: the node lifecycle controller acts on every Node
//! in the cluster (it deletes Nodes), so tests sharing one would act on each other's nodes.
// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod vsphere;
