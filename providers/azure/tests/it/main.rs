//! Azure provider integration tests: every module against the ARM emulator over HTTPS.
// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod backend;
mod client;
mod command_line;
mod config;
mod credential;
mod error_repair;
mod fixture;
mod imds;
mod instances;
mod load_balancer;
mod node_manager;
mod operations;
mod pool_ownership;
mod routes;
mod security_group;
mod shared_frontend;
mod tenant_safety;
