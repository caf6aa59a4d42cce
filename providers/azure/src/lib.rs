//! The `azure` cloud provider: Azure Resource Manager, as upstream
//! `kubernetes-sigs/cloud-provider-azure`.
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | `azure.json` (JSON or YAML; the `--cloud-config` file, the Secret `kube-system/azure-cloud-provider`, or both merged) |
//! | [`client`] | credentials, the ARM client (deadlines, retries, long-running operations, paging, ETags), ARM models |
//! | [`provider_id`] | providerIDs (`azure://` + the VM's ARM ID) |
//! | [`imds`] | the instance metadata service |
//! | [`instances`] | InstancesV2 and Zones for availability-set, scale-set and flexible-scale-set VMs; batched listings |
//! | [`load_balancer`] | LoadBalancer: the shared Standard load balancers, public IPs, backend membership, security rules |
//! | [`routes`] | Routes: the cluster's route table, batched writes |
//! | [`node_manager`] | `cloud-node-manager-azure`: one node initialised from IMDS |
//! | [`credential`] | `acr-credential-provider`: the kubelet image credential provider |
//!
//! Upstream decisions kept or changed are listed in `providers/azure/README.md`.

pub mod client;
pub mod config;
pub mod credential;
pub mod imds;
pub mod instances;
pub mod load_balancer;
pub mod node_manager;
pub mod provider_id;
pub mod routes;

/// The provider name, as given to `--cloud-provider` (providerIDs are `azure://…`).
pub const PROVIDER_NAME: &str = "azure";

use std::sync::{Arc, OnceLock};

use ccm_core::cloud::{
    BoxError, CloudProvider, InstancesV2, LoadBalancer, ProviderInit, Routes, Zones,
};

use crate::client::{ArmClient, ClientError, ClientOptions};
use crate::config::{CloudConfigType, Config, ConfigError};
use crate::instances::AzureInstances;
use crate::load_balancer::AzureLoadBalancer;
use crate::routes::AzureRoutes;

/// Why the provider could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cloud config is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The client could not be set up (credentials, HTTP client).
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// What the provider runs on once its config is known.
#[derive(Debug)]
struct Inner {
    config: Arc<Config>,
    client: Arc<ArmClient>,
    instances: Arc<AzureInstances>,
    load_balancer: Arc<AzureLoadBalancer>,
    routes: Arc<AzureRoutes>,
}

impl Inner {
    fn new(config: Config, options: ClientOptions) -> Result<Inner, Error> {
        config.validate()?;
        let config = Arc::new(config);
        let client = Arc::new(ArmClient::new(&config, options)?);
        let instances = Arc::new(AzureInstances::new(client.clone(), config.clone()));
        let load_balancer = Arc::new(AzureLoadBalancer::new(client.clone(), config.clone()));
        let routes = Arc::new(AzureRoutes::new(client.clone(), config.clone()));
        tracing::info!(
            resource_manager = %client.endpoints().resource_manager,
            resource_group = config.resource_group(),
            vm_type = ?config.vm_type,
            "Azure provider"
        );
        Ok(Inner { config, client, instances, load_balancer, routes })
    }
}

/// The Azure provider.
#[derive(Debug)]
pub struct AzureProvider {
    /// The `--cloud-config` file's contents, until the Secret is merged in.
    file: Option<Vec<u8>>,
    options: ClientOptions,
    inner: OnceLock<Inner>,
}

impl AzureProvider {
    /// The manager's factory: the `--cloud-config` contents. With `cloudConfigType: file`
    /// everything is set up now (no request sent); otherwise the Secret
    /// `kube-system/azure-cloud-provider` is read when the manager hands over its client.
    pub fn from_command_line(
        cloud_config: Option<&[u8]>,
        flags: &ccm_core::manager::extensions::ProviderFlags,
    ) -> Result<Self, Error> {
        let _ = flags.matches();
        Self::from_cloud_config(cloud_config)
    }

    /// The manager's factory without the provider's flags (their defaults).
    pub fn from_cloud_config(cloud_config: Option<&[u8]>) -> Result<Self, Error> {
        Self::new(cloud_config, ClientOptions::from_env()?)
    }

    /// The provider on a config file's contents with explicit client options (tests).
    pub fn new(cloud_config: Option<&[u8]>, options: ClientOptions) -> Result<Self, Error> {
        let provider = AzureProvider {
            file: cloud_config.map(<[u8]>::to_vec),
            options,
            inner: OnceLock::new(),
        };
        if let Some(bytes) = cloud_config {
            let config = Config::from_bytes(bytes)?;
            if config.cloud_config_type == CloudConfigType::File {
                let inner = Inner::new(config, provider.options.clone())?;
                let _ = provider.inner.set(inner);
            }
        }
        Ok(provider)
    }

    /// The config in use, once known.
    pub fn config(&self) -> Option<&Arc<Config>> {
        self.inner.get().map(|i| &i.config)
    }

    /// The ARM client, once the config is known.
    pub fn client(&self) -> Option<&Arc<ArmClient>> {
        self.inner.get().map(|i| &i.client)
    }
}

/// Azure's own flags (upstream `cloud-provider-azure`'s command line), registered with the
/// manager's; the factory reads their values from [`Extensions::parsed`](ccm_core::manager::extensions::Extensions::parsed).
pub fn extensions() -> ccm_core::manager::extensions::Extensions {
    ccm_core::manager::extensions::Extensions::default()
}

impl CloudProvider for AzureProvider {
    /// Cloud resources carry `--cluster-name`: public IPs carry `k8s-azure-cluster-name: <cluster>` and the shared load balancer is named after the cluster unless `loadBalancerName` is set.
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
        self.inner.get().map(|i| i.instances.clone() as Arc<dyn InstancesV2>)
    }

    fn zones(&self) -> Option<Arc<dyn Zones>> {
        self.inner.get().map(|i| i.instances.clone() as Arc<dyn Zones>)
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        self.inner.get().map(|i| i.load_balancer.clone() as Arc<dyn LoadBalancer>)
    }

    /// Routes need `routeTableName` (upstream's route controller fails every call without
    /// it; here the capability is simply absent and the route controller is skipped).
    fn routes(&self) -> Option<Arc<dyn Routes>> {
        self.inner
            .get()
            .filter(|i| i.config.route_table_name.as_deref().is_some_and(|n| !n.trim().is_empty()))
            .map(|i| i.routes.clone() as Arc<dyn Routes>)
    }

    /// With `cloudConfigType` `secret` or `merge` (upstream's default), reads the Secret
    /// `kube-system/azure-cloud-provider` (one `get` of that Secret) and sets the provider up
    /// on the result; the controllers start after this returns.
    fn initialize(&self, init: ProviderInit) -> Result<(), BoxError> {
        if self.inner.get().is_some() {
            return Ok(());
        }
        let file = self.file.clone();
        let client = init.client.clone();
        let config = tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current()
                .block_on(async move { config::load(file.as_deref(), Some(client)).await })
        })?;
        let inner = Inner::new(config, self.options.clone())?;
        let _ = self.inner.set(inner);
        Ok(())
    }
}
