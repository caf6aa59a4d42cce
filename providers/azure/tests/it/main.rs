//! Azure provider integration tests: every module against the ARM emulator over HTTPS.
// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod additional_ips;
mod backend;
mod client;
mod client_certificate;
mod command_line;
mod config;
mod credential;
mod error_repair;
mod fixture;
mod imds;
mod instances;
mod load_balancer;
mod multi_slb;
mod network_tenant;
mod node_labels;
mod node_manager;
mod operations;
mod pool_ownership;
mod private_link;
mod read_budget;
mod routes;
mod security_group;
mod shared_frontend;
mod support;
mod tenant_safety;
mod vmss_flex;
mod zones;
