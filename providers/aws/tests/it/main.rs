//! Integration tests for the AWS provider, against a local moto server.
//!
//! Each test starts its own `moto_server` (from `ci/install-tools`) on a free loopback port, so
//! tests never see each other's resources. The server runs under a small `sh` supervisor that
//! reads a pipe from the test process: when the test ends, panics, or the process is killed,
//! the pipe closes and the supervisor stops moto.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[cfg(feature = "ecr-credential-provider")]
mod ecr;
mod instances;
mod load_balancer;
mod moto;
mod routes;
