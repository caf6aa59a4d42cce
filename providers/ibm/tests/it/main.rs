//! Integration tests of the IBM provider against the in-process IBM Cloud emulator
//! (`ccm_emulators::ibm`): IAM, Resource Manager and VPC on one loopback server.
//!
//! | module | shows |
//! |---|---|
//! | `instances` | nodes by label and by VPC lookup (one list call per batch), existence and shutdown, an outage deletes nothing |
//! | `client` | IBM error bodies, token expiry renewed, throttling retried, a hung call ends at its deadline, paging |
//! | `tenant` | a Service never gets, changes or deletes a load balancer its cluster did not create for it (`vpc-lb-name`) |
//! | `load_balancer` | public and private load balancers as upstream builds them, member updates, deletion leaves nothing |
//! | `slow_cloud` | a `failed` load balancer (error, then replaced), maintenance (retry, then converges), realistic pending minutes scaled |
// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod client;
mod fixture;
mod instances;
mod load_balancer;
mod slow_cloud;
mod tenant;
