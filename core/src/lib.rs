//! The cloud-agnostic core of the cloud-controller-manager.
//!
//! - [`cloud`]: the provider traits every cloud implements (read this first).
//! - [`names`]: well-known label, taint, annotation, event and controller names.
//! - [`batch`]: coalescing of concurrent cloud lookups into batch calls.
//! - [`controllers`]: the controllers and the contract the manager starts them with.
//! - [`manager`]: the cloud-controller-manager command (flags, leader election, serving).
//! - [`credential`]: the kubelet image credential-provider exec protocol.
//! - [`gcfg`]: the gcfg INI reader of the providers' cloud configs.
//! - [`ops`]: the operator tools `migrate-check` and `orphans` (subcommands of every binary).
//! - `testing` (feature `testing`): a scripted cloud for tests.

pub mod batch;
pub mod cloud;
pub mod cloud_call;
pub mod controllers;
pub mod credential;
pub mod gcfg;
pub mod glob;
pub mod listing;
pub mod manager;
pub mod names;
pub mod ops;
pub mod reference;

#[cfg(any(test, feature = "testing"))]
pub mod testing;
