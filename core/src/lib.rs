//! The cloud-agnostic core of the cloud-controller-manager.
//!
//! - [`cloud`]: the provider traits every cloud implements (read this first).
//! - [`names`]: well-known label, taint, annotation, event and controller names.
//! - [`batch`]: coalescing of concurrent cloud lookups into batch calls.
//! - [`controllers`]: the controllers and the contract the manager starts them with.
//! - `testing` (feature `testing`): a scripted cloud for tests.

pub mod batch;
pub mod cloud;
pub mod controllers;
pub mod names;

#[cfg(any(test, feature = "testing"))]
pub mod testing;
