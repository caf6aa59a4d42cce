//! The vcsim fixture server lives in the testbed crate (`ccm_testbed::vcsim`), shared with
//! the end-to-end tests of the `cloud-controller-manager-vsphere` binary and the demo.

pub use ccm_testbed::vcsim::Vcsim;
