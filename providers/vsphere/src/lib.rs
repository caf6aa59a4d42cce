//! The `vsphere` cloud provider: nodes backed by vSphere VMs, across one or more vCenters.
//!
//! ```text
//! VsphereProvider ── instances_v2() ──▶ Instances ──▶ VCenterConn ×N ─┬─ Vim25Client  (SOAP /sdk)
//!                                                                     └─ TaggingClient (REST /rest)
//! ```
//!
//! Modules: [`config`] (YAML/INI cloud config, credentials), [`client`] (vim25 SOAP and CIS
//! tagging REST on reqwest), [`instances`] (`InstancesV2`). Zones come with the instance
//! metadata. LoadBalancer and Routes are not supported (upstream offers them only with
//! NSX-T); the provider says so once when it is built.

pub mod client;
pub mod config;
pub mod instances;

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::{CloudProvider, InstancesV2};

use crate::client::ClientError;
use crate::client::tagging::TaggingClient;
use crate::client::vim25::Vim25Client;
use crate::config::{Config, ConfigError, CredentialSources};
use crate::instances::{Instances, VCenterConn};

/// The provider name, as given to `--cloud-provider`.
pub const PROVIDER_NAME: &str = "vsphere";

/// Per-request timeout for vCenter calls.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the provider could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cloud config is invalid or credentials are missing.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// A client could not be set up (e.g. an unreadable CA file).
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// The vSphere provider.
#[derive(Debug)]
pub struct VsphereProvider {
    config: Config,
    instances: Arc<Instances>,
}

impl VsphereProvider {
    /// Builds the provider from the cloud-config file's bytes and the other credential
    /// sources (the Secret named by `global.secretName`, which the caller reads, and the
    /// `VSPHERE_*` environment; `SKIP_NODE_DELETION=true` there keeps Nodes whose VM is
    /// gone). No request is sent; a bad config or missing credentials
    /// fail here with a message naming the key.
    pub fn new(cloud_config: &[u8], sources: &CredentialSources) -> Result<Self, Error> {
        let config = Config::parse(cloud_config, &sources.env)?;
        Self::from_config(config, sources)
    }

    /// The manager's factory: builds the provider from the `--cloud-config` contents (if
    /// any) and this process's environment (`VSPHERE_*`, `SKIP_NODE_DELETION`). Secret
    /// credentials are read from `secretsDirectory` (the Secret mounted as a volume); a
    /// caller with API access can add the Secret itself with [`CredentialSources::with_secret`]
    /// and [`VsphereProvider::new`].
    ///
    /// ```ignore
    /// ccm_cmd::main_with(ccm_provider_vsphere::PROVIDER_NAME, Box::new(|config| {
    ///     Ok(std::sync::Arc::new(ccm_provider_vsphere::VsphereProvider::from_cloud_config(config)?))
    /// }))
    /// ```
    pub fn from_cloud_config(cloud_config: Option<&[u8]>) -> Result<Self, Error> {
        Self::new(cloud_config.unwrap_or_default(), &CredentialSources::from_process_env())
    }

    /// Builds the provider from a parsed config.
    pub fn from_config(config: Config, sources: &CredentialSources) -> Result<Self, Error> {
        let endpoints = config.endpoints(sources, REQUEST_TIMEOUT)?;
        let mut vcenters = Vec::new();
        for (endpoint, vc) in endpoints.into_iter().zip(&config.vcenters) {
            let vim = Vim25Client::new(endpoint.clone())?;
            let tagging = TaggingClient::new(endpoint)?;
            vcenters.push(Arc::new(VCenterConn::new(
                vc.name.clone(),
                vim,
                tagging,
                vc.datacenters.clone(),
                vc.ip_families.clone(),
            )));
        }
        tracing::info!(
            vcenters = %config.vcenters.iter().map(|v| v.name.as_str()).collect::<Vec<_>>().join(","),
            "vSphere provider: LoadBalancer and Routes are not supported (upstream needs NSX-T for them); \
             the service and route controllers will not run"
        );
        let skip_node_deletion = sources.env.get("SKIP_NODE_DELETION").is_some_and(|v| {
            matches!(v.trim().to_ascii_lowercase().as_str(), "true" | "1" | "yes")
        });
        if skip_node_deletion {
            tracing::warn!(
                "SKIP_NODE_DELETION is set: Nodes are never deleted when their VM is gone"
            );
        }
        let instances = Arc::new(
            Instances::new(vcenters, config.labels.clone(), config.nodes.clone())
                .with_skip_node_deletion(skip_node_deletion),
        );
        Ok(VsphereProvider { config, instances })
    }

    /// The parsed config (e.g. to find the credentials Secret).
    pub fn config(&self) -> &Config {
        &self.config
    }
}

impl CloudProvider for VsphereProvider {
    fn name(&self) -> &str {
        PROVIDER_NAME
    }

    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        Some(self.instances.clone())
    }
}
