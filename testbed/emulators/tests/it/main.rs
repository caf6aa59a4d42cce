//! The kit's integration tests (one binary): the kit against an example cloud, and the fault
//! proxy in front of real moto and real vcsim.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod binary;
mod example;
mod gcp;
mod ibm;
mod kit;
mod proxy_aws;
mod proxy_vsphere;
