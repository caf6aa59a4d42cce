//! End-to-end tests of the `cloud-controller-manager-<cloud>` binaries: the real binary as a
//! process, against a real kube-apiserver (`ccm_testbed::ControlPlane`) and the cloud's
//! emulator (vSphere: `ccm_testbed::vcsim`; AWS: `ccm_testbed::moto`; IBM, OpenStack and GCP: the
//! in-process emulators of `ccm_emulators`).
//!
//! Each provider's module builds with its feature (`--features provider-vsphere`,
//! `--features provider-aws,testing`); CI enables all of them.
//!
//! Every test starts its own control plane: the node lifecycle controller acts on every Node
//! in the cluster (it deletes Nodes), so tests sharing one would act on each other's nodes.
// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(all(feature = "provider-aws", feature = "testing"))]
mod aws;
// Chaos suite (issue #21): ignored scenarios that ci/chaos runs.
#[cfg(feature = "provider-azure")]
mod azure;
#[cfg(any(all(feature = "provider-aws", feature = "testing"), feature = "provider-ibm"))]
mod chaos;
#[cfg(any(
    all(feature = "provider-aws", feature = "testing"),
    feature = "provider-vsphere",
    feature = "provider-ibm",
    feature = "provider-openstack",
    feature = "provider-gcp",
    feature = "provider-azure"
))]
mod conformance;
// Issue #30: every upstream flag of each cloud's binary parses (helpers shared by all clouds).
#[cfg(any(
    feature = "provider-aws",
    feature = "provider-vsphere",
    feature = "provider-ibm",
    feature = "provider-openstack",
    feature = "provider-gcp",
    feature = "provider-azure"
))]
mod flags;
// GCP and Azure flags (issue #30 point 2): upstream's every flag parses, unacted ones warned.
#[cfg(any(feature = "provider-gcp", feature = "provider-azure"))]
mod flags_gcp_azure;
#[cfg(feature = "provider-gcp")]
mod gcp;
#[cfg(feature = "provider-ibm")]
mod ibm;
#[cfg(feature = "provider-openstack")]
mod openstack;
// Operator tools (issue 20): `orphans` and `migrate-check` on AWS (moto) and IBM.
#[cfg(any(all(feature = "provider-aws", feature = "testing"), feature = "provider-ibm"))]
mod ops;
#[cfg(any(
    all(feature = "provider-aws", feature = "testing"),
    feature = "provider-vsphere",
    feature = "provider-ibm"
))]
mod secrets;
#[cfg(any(
    all(feature = "provider-aws", feature = "testing"),
    feature = "provider-vsphere",
    feature = "provider-ibm",
    feature = "provider-openstack",
    feature = "provider-gcp",
    feature = "provider-azure"
))]
mod support;
// Issue #34 point 3: --version, --version=raw and kubernetes_build_info of the binaries.
#[cfg(any(
    feature = "provider-aws",
    feature = "provider-vsphere",
    feature = "provider-ibm",
    feature = "provider-openstack",
    feature = "provider-gcp",
    feature = "provider-azure"
))]
mod version;
#[cfg(feature = "provider-vsphere")]
mod vsphere;
