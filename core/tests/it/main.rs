//! Integration tests of the core controllers against a real kube-apiserver.
#![allow(clippy::unwrap_used, clippy::expect_used)]
mod chart_tagging;
mod config_warnings;
mod node;
mod node_ipam;
mod rbac;
mod route;
mod service;
mod support;
mod upstream_rbac;
