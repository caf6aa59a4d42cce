//! The `gcp` cloud provider: Compute Engine, as upstream `kubernetes/cloud-provider-gcp`
//! (`providers/gce`, and the legacy in-tree `gce` provider it came from).
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | the gcfg INI `gce.conf` (`[global]`) |
//! | [`client`] | credentials (metadata server, `token-url`, Application Default Credentials), the Compute clients, the cluster's scope (project, region, managed zones, network), Compute errors, deadlines, retries, waiting for `Operation`s |
//! | [`instances`] | InstancesV2 and NodeCidrs: providerID, addresses, zone, machine type, alias IP ranges; one instance listing per batch |
//! | [`load_balancer`] | LoadBalancer: the external target-pool network load balancer and the internal load balancer, their addresses, health checks and firewalls |
//! | [`routes`] | Routes: GCE routes to the nodes' instances |
//! | [`credential`] | `auth-provider-gcp`: the kubelet image credential provider |
//!
//! Upstream decisions kept or changed are listed in `providers/gcp/README.md`.

pub mod client;
pub mod config;
pub mod credential;
pub mod instances;
pub mod load_balancer;
pub mod routes;

/// The provider name, as given to `--cloud-provider` (upstream's `gce`: providerIDs are
/// `gce://…` and upstream manifests pass `--cloud-provider=gce`).
pub const PROVIDER_NAME: &str = "gce";

use std::sync::Arc;

use ccm_core::cloud::{
    BoxError, CloudProvider, InstancesV2, LoadBalancer, NodeCidrs, ProviderInit, Routes, Zones,
};

use crate::client::{ClientError, ClientOptions, GceClient};
use crate::config::{Config, ConfigError};
use crate::instances::GceInstances;
use crate::load_balancer::{GceLoadBalancer, Timings};
use crate::routes::GceRoutes;

/// Why the provider could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cloud config is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The cloud config is not UTF-8.
    #[error("cloud config is not valid UTF-8")]
    NotUtf8,
    /// The client could not be set up (credentials, HTTP client).
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// The GCE provider.
#[derive(Debug)]
pub struct GcpProvider {
    config: Arc<Config>,
    client: Arc<GceClient>,
    instances: Arc<GceInstances>,
    load_balancer: Arc<GceLoadBalancer>,
    routes: Arc<GceRoutes>,
}

impl GcpProvider {
    /// The manager's factory: the `--cloud-config` contents (none: everything from the
    /// metadata server, as upstream). No request is sent: the metadata server and Compute
    /// are asked on the first cloud call.
    pub fn from_command_line(
        cloud_config: Option<&[u8]>,
        flags: &ccm_core::manager::extensions::ProviderFlags,
    ) -> Result<Self, Error> {
        let _ = flags.matches();
        Self::from_cloud_config(cloud_config)
    }

    /// The manager's factory without the provider's flags (their defaults).
    pub fn from_cloud_config(cloud_config: Option<&[u8]>) -> Result<Self, Error> {
        let config = match cloud_config {
            None => Config::default(),
            Some(bytes) => Config::parse(std::str::from_utf8(bytes).map_err(|_| Error::NotUtf8)?)?,
        };
        Self::new(config, ClientOptions::default(), Timings::default())
    }

    /// The provider on a parsed config, with explicit call bounds and load-balancer retry
    /// delays (tests shorten them).
    pub fn new(config: Config, options: ClientOptions, timings: Timings) -> Result<Self, Error> {
        let config = Arc::new(config);
        let client = Arc::new(GceClient::new(&config.global, options)?);
        let instances = Arc::new(GceInstances::new(client.clone()));
        let routes = Arc::new(GceRoutes::new(client.clone()));
        let load_balancer = Arc::new(GceLoadBalancer::new(client.clone(), timings));
        tracing::info!(
            project = config.global.project_id.as_deref().unwrap_or("<metadata server>"),
            endpoint = %client.endpoint(),
            multizone = config.global.multizone,
            "GCE provider"
        );
        Ok(GcpProvider { config, client, instances, load_balancer, routes })
    }

    /// The parsed config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The Compute client.
    pub fn client(&self) -> &Arc<GceClient> {
        &self.client
    }
}

/// GCP's own flags (upstream `cloud-provider-gcp`'s command line), registered with the
/// manager's; the factory reads their values from [`Extensions::parsed`](ccm_core::manager::extensions::Extensions::parsed).
pub fn extensions() -> ccm_core::manager::extensions::Extensions {
    ccm_core::manager::extensions::Extensions::default()
}

impl CloudProvider for GcpProvider {
    /// Cloud resources carry `--cluster-name`: routes are named `<cluster-name>-<node UID>`.
    fn names_resources_by_cluster(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        PROVIDER_NAME
    }

    fn has_cluster_id(&self) -> bool {
        true
    }

    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        Some(self.instances.clone())
    }

    fn zones(&self) -> Option<Arc<dyn Zones>> {
        Some(self.instances.clone())
    }

    fn node_cidrs(&self) -> Option<Arc<dyn NodeCidrs>> {
        Some(self.instances.clone())
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        Some(self.load_balancer.clone())
    }

    fn routes(&self) -> Option<Arc<dyn Routes>> {
        Some(self.routes.clone())
    }

    /// The load balancer's names carry the cluster ID of ConfigMap `kube-system/ingress-uid`
    /// (read, or created, on first use with this client), as upstream's.
    fn initialize(&self, init: ProviderInit) -> Result<(), BoxError> {
        self.load_balancer.set_kube_client(init.client);
        Ok(())
    }
}
