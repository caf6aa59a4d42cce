//! The cloud-agnostic core of the cloud-controller-manager.
//!
//! - [`cloud`]: the provider traits every cloud implements (read this first).
//! - [`names`]: well-known label, taint, annotation, event and controller names.
//!
//! The controllers, the manager and the credential-provider protocol build on these.

pub mod cloud;
pub mod names;
