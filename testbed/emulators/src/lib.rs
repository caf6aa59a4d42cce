//! The cloud emulator kit and the fault proxy (dev/test only, never shipped).
//!
//! Everything a cloud emulator needs apart from the cloud's own resources, written once:
//! - [`server`]: the loopback HTTP(S) server, the admin API under `/__emulator/`, fault
//!   injection, pause/resume, per-operation counters and the request log; a cloud plugs in
//!   through [`server::Cloud`] (operation names, error bodies, serving, state, reset);
//! - [`faults`]: fault rules (status, throttle, latency, hang, drop; times, probability);
//! - [`admin`]: the admin API's types and its Rust client [`admin::Admin`];
//! - [`world`]: the declarative world file (instances, networks, subnets);
//! - [`asyncop`]: long-running operations (ARM, GCE, Octavia, IBM shapes), their timing
//!   profiles (`fast`, `realistic`, scaled) and armed operation failures;
//! - [`ibm`]: the IBM Cloud emulator (IAM, Resource Manager, VPC `/v1`);
//! - [`openstack`]: the OpenStack emulator (Keystone v3, Nova, Neutron, Octavia v2);
//! - [`tls`]: HTTPS certificates from the testbed's CA;
//! - [`aws_imds`]: an EC2 instance metadata service (IMDSv2) for one instance;
//! - [`azure`]: the Azure emulator (ARM compute and network, AAD, IMDS);
//! - [`gcp`]: the GCP emulator (Compute v1 subset, metadata server);
//! - [`proxy`]: the same fault controls as a reverse proxy in front of moto ([`aws`]) and
//!   vcsim ([`vsphere`]).
//!
//! `docs/emulators.md` tells how to add a cloud. The `ccm-emulator` binary runs the proxy
//! (and later the clouds' emulators) as a standalone process for `ci/demo`.

pub mod admin;
pub mod asyncop;
pub mod aws;
pub mod aws_imds;
pub mod azure;
pub mod faults;
pub mod gcp;
pub mod ibm;
pub mod kit;
pub mod openstack;
pub mod openstack_barbican;
pub mod proxy;
pub mod server;
pub mod tls;
pub mod vsphere;
pub mod world;

pub use admin::{Admin, Counters, PauseMode};
pub use asyncop::{
    ActionMatch, OperationFailure, Timing, TimingMs, TimingProfile, TimingReport, TimingSelection,
};
pub use faults::{Fault, FaultRule};
pub use proxy::{FaultProxy, Protocol};
pub use world::World;
