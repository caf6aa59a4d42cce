//! Integration tests of the GCP provider against the Compute emulator
//! (`ccm_emulators::gcp`), through the same SDK crates as production.
// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod client;
mod cluster_id;
mod command_line;
mod config;
mod credential;
mod fixture;
mod instances;
mod internal_compat;
mod load_balancer;
mod mixed_protocols;
mod node_ipam;
mod routes;
mod shared_vpc;
mod throttle;
