//! The `ibm` cloud provider: IBM Cloud VPC (Gen2) infrastructure, as upstream
//! `IBM-Cloud/cloud-provider-ibm` with `cluster-default-provider = g2`.
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | the gcfg INI cloud config and the endpoints it implies |
//! | [`client`] | IAM token exchange, VPC REST (`version`/`generation`, paging, IBM errors, deadlines, retries), Resource Manager |
//! | [`model`] | the VPC resources as the API returns them |
//! | [`instances`] | InstancesV2: labels or VPC lookup, providerID, existence |
//! | [`load_balancer`] | LoadBalancer: VPC load balancers, listeners, pools, members |
//! | [`monitor`] | the 5-minute load-balancer monitor: health Events, orphans of this cluster deleted |
//!
//! No routes (as upstream: Calico handles pod networking) and no image credential provider.
//! Upstream decisions kept or changed are listed in `providers/ibm/README.md`.

pub mod client;
pub mod config;
pub mod instances;
pub mod load_balancer;
pub mod model;
pub mod monitor;

/// Parse entry points for `fuzz/` (issue #21) that are private in the client: never in
/// shipped binaries (feature `fuzzing`).
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    /// Reads an IBM error body (VPC, IAM or Resource Manager form) as the client does.
    pub fn error_body(status: u16, body: &[u8]) -> crate::client::ClientError {
        crate::client::parse_error("fuzz", status, None, body)
    }
}

use std::collections::BTreeMap;
use std::sync::Arc;

use ccm_core::cloud::{BoxError, CloudProvider, InstancesV2, LoadBalancer, ProviderInit};

use crate::client::{ClientError, ClientOptions, IbmClient};
use crate::config::{Config, ConfigError};
use crate::instances::IbmInstances;
use crate::load_balancer::{IbmLoadBalancer, Timings};
use crate::monitor::{Monitor, MonitorOptions};

/// The provider name, as given to `--cloud-provider`.
pub const PROVIDER_NAME: &str = "ibm";

/// What IBM adds to the manager: nothing. Upstream's `ibm-cloud-controller-manager` runs the
/// stock controllers with the stock `k8s.io/cloud-provider` command line and registers no flag
/// of its own, so every upstream flag is already the manager's.
pub fn extensions() -> ccm_core::manager::extensions::Extensions {
    ccm_core::manager::extensions::Extensions::default()
}

/// Why the provider could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cloud config is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The cloud config is not UTF-8.
    #[error("cloud config is not valid UTF-8")]
    NotUtf8,
    /// The client could not be set up, or the API key file cannot be used.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// The IBM Cloud provider.
#[derive(Debug)]
pub struct IbmProvider {
    config: Arc<Config>,
    client: Arc<IbmClient>,
    instances: Arc<IbmInstances>,
    load_balancer: Arc<IbmLoadBalancer>,
    monitor: MonitorOptions,
}

impl IbmProvider {
    /// The manager's factory: the `--cloud-config` contents and this process's environment
    /// (`ENABLE_VPC_PUBLIC_ENDPOINT`). The API key file must be readable now (a clear error
    /// at start beats one on every call); no request is sent.
    pub fn from_cloud_config(cloud_config: Option<&[u8]>) -> Result<Self, Error> {
        let Some(bytes) = cloud_config else { return Err(ConfigError::Missing.into()) };
        let text = std::str::from_utf8(bytes).map_err(|_| Error::NotUtf8)?;
        let env: BTreeMap<String, String> = std::env::vars().collect();
        let config = Config::parse(text, &env)?;
        Self::new(config, ClientOptions::default(), Timings::default())
    }

    /// The provider on a parsed config, with explicit call bounds and load-balancer waits
    /// (tests shorten them).
    pub fn new(config: Config, options: ClientOptions, timings: Timings) -> Result<Self, Error> {
        client::read_api_key(&config.credentials_file)?;
        let config = Arc::new(config);
        let client = Arc::new(IbmClient::new(&config, options)?);
        let instances = Arc::new(IbmInstances::new(client.clone(), config.clone()));
        let load_balancer = Arc::new(IbmLoadBalancer::new(client.clone(), config.clone(), timings));
        tracing::info!(
            account = %config.account_id,
            cluster = %config.cluster_id,
            region = %config.region,
            vpc = %config.vpc_name,
            vpc_endpoint = %config.vpc_url,
            "IBM Cloud VPC provider: no routes (as upstream)"
        );
        Ok(IbmProvider {
            config,
            client,
            instances,
            load_balancer,
            monitor: MonitorOptions::default(),
        })
    }

    /// The provider with another load-balancer monitor period (tests shorten it).
    pub fn with_monitor(mut self, monitor: MonitorOptions) -> Self {
        self.monitor = monitor;
        self
    }

    /// The parsed config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The IBM Cloud client.
    pub fn client(&self) -> &Arc<IbmClient> {
        &self.client
    }

    /// The concrete InstancesV2.
    pub fn ibm_instances(&self) -> &Arc<IbmInstances> {
        &self.instances
    }

    /// The concrete LoadBalancer.
    pub fn ibm_load_balancer(&self) -> &Arc<IbmLoadBalancer> {
        &self.load_balancer
    }
}

impl CloudProvider for IbmProvider {
    fn name(&self) -> &str {
        PROVIDER_NAME
    }

    /// What reading the cloud config skipped (unknown sections and keys), for the manager's
    /// start-up `CloudConfigWarning` Events.
    fn config_warnings(&self) -> Vec<String> {
        self.config().config_warnings().to_vec()
    }

    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        Some(self.instances.clone())
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        Some(self.load_balancer.clone())
    }

    /// Upstream's start-up work: the load-balancer monitor (every 5 minutes: health Events,
    /// orphans of this cluster deleted; [`monitor`]) until leadership ends, and the client
    /// `[kubernetes] set-network-unavailable` marks new Nodes with.
    fn initialize(&self, init: ProviderInit) -> Result<(), BoxError> {
        self.instances.set_kube_client(init.client.clone());
        let monitor = Arc::new(Monitor::new(self.load_balancer.clone(), init.client));
        monitor.spawn(self.monitor, init.shutdown);
        Ok(())
    }
}
