//! Integration tests of the testbed against the real etcd + kube-apiserver it starts.
//! One binary; every test shares one control plane and isolates itself by unique names.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod chart;
mod clients;
mod control_plane;
mod differential;
mod manager;
mod startup;
mod upstream;
