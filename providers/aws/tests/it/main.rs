//! Integration tests for the AWS provider, against a local moto server.
//!
//! Each test starts its own `moto_server` (`ccm_testbed::moto`, installed by `ci/install-tools`)
//! on a free loopback port, so tests never see each other's resources; moto never outlives
//! the test process. The provider as the real binary runs it is tested in `cmd/tests/it/aws.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod assume_role;
#[cfg(feature = "ecr-credential-provider")]
mod ecr;
mod instances;
mod load_balancer;
mod load_balancer_parity;
mod metadata;
mod moto;
mod routes;
mod tagging;
mod throttling;
mod timeouts;
