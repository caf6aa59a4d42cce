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
//! | `bench` | the `ibm-lb` benchmark (ignored; `ci/bench-ibm-lb`): N Services created at once on realistic (scaled) timing, ours against the former waiting provider |
//! | `controller` | the core service controller on a real kube-apiserver: hostnames while `create_pending`, one slow load balancer blocks no other Service (issue #33 item 11) |
//! | `monitor` | the load-balancer monitor: health Events, only this cluster's orphans deleted, its period; `set-network-unavailable` (issue #33 item 12) |
// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod bench;
mod client;
mod controller;
mod fixture;
mod instances;
mod load_balancer;
mod monitor;
mod slow_cloud;
mod tenant;
