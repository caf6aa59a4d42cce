//! The `gcp` cloud provider (shell: the provider lands with its own issue).
//!
//! Modules will mirror the core traits: `config`, `client`, `instances`, `load_balancer`,
//! `routes`, `credential`.

/// The provider name, as given to `--cloud-provider`.
pub const PROVIDER_NAME: &str = "gcp";
