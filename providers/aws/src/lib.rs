//! The `aws` cloud provider: EC2 instances, classic ELB / NLB load balancers and VPC route
//! tables, behind the core's provider traits.
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | the gcfg INI cloud config (`[Global]`, `[ServiceOverride "N"]`) |
//! | [`client`] | SDK clients, credentials, endpoint overrides, API call metrics, error mapping |
//! | [`tags`] | cluster ownership tags |
//! | [`instances`] | InstancesV2: providerID, addresses, zone, existence; batched lookups |
//! | [`load_balancer`] | LoadBalancer: classic ELB and NLB, security groups, annotations |
//! | [`routes`] | Routes: pod-CIDR routes in the cluster route table |
//! | [`credential`] | ECR registry patterns, token decoding, cache duration (credential plugin) |
//! | [`metadata`] | drop-in without a cloud config: region, VPC and cluster ID from IMDS and tags |
//! | [`tagging`] | the `tagging` controller and its flags (`--tags`, `--resources`, `--tagging-controller-*`) |
//! | `testing` | (feature `testing`) moto fixtures: SDK clients, cloud config, VPC, instances |
//!
//! Upstream decisions kept or changed are listed in `providers/aws/README.md`.

use std::sync::Arc;

use ccm_core::cloud::{BoxError, CloudProvider, InstancesV2, LoadBalancer, ProviderInit, Routes};
use ccm_core::manager::extensions::{Extensions, ProviderFlags};

pub mod client;
pub mod config;
pub mod credential;
pub mod instances;
pub mod load_balancer;
pub mod metadata;
pub mod routes;
pub mod tagging;
pub mod tags;
#[cfg(feature = "testing")]
pub mod testing;

pub use client::{ApiMetrics, AwsClients, LazyClients};
pub use config::{CloudConfig, ConfigError};

use instances::AwsInstances;
use load_balancer::AwsLoadBalancer;
use routes::AwsRoutes;
use tagging::TaggingOptions;
use tags::ClusterTags;

/// The provider name, as given to `--cloud-provider`.
pub const PROVIDER_NAME: &str = "aws";

/// What AWS adds to the manager, as upstream's `aws-cloud-controller-manager` registers it:
/// the `tagging` controller (disabled by default) and its flags ([`tagging`]). The binary's
/// factory is [`Cloud::from_command_line`] with a clone of the returned
/// [`Extensions::parsed`].
pub fn extensions() -> Extensions {
    Extensions {
        controllers: vec![tagging::controller()],
        flags: tagging::flags(),
        ..Extensions::default()
    }
}

/// The cloud config could not be used to build the provider.
#[derive(Debug, thiserror::Error)]
pub enum AwsError {
    /// The `--cloud-config` file is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The `--cloud-config` file is not UTF-8.
    #[error("cloud config is not valid UTF-8: {0}")]
    NotUtf8(#[from] std::str::Utf8Error),
    /// Instance metadata or the instance's tags cannot be used.
    #[error(transparent)]
    Metadata(#[from] metadata::MetadataError),
    /// The discovery runtime could not be started.
    #[error("starting the runtime for instance metadata discovery: {0}")]
    Runtime(String),
    /// The clients could not be built.
    #[error(transparent)]
    Client(#[from] client::ClientError),
}

/// The AWS cloud provider.
#[derive(Debug)]
pub struct Cloud {
    config: CloudConfig,
    clients: Arc<LazyClients>,
    instances: Arc<AwsInstances>,
    routes: Arc<AwsRoutes>,
    load_balancer: Arc<AwsLoadBalancer>,
    /// The `tagging` controller's flags.
    tagging: TaggingOptions,
}

impl Cloud {
    /// The manager's factory: [`Self::from_config`] with the provider's own flags (the
    /// `tagging` controller's) read from the parsed command line.
    pub fn from_command_line(
        config: Option<&[u8]>,
        flags: &ProviderFlags,
    ) -> Result<Self, AwsError> {
        Ok(Self::from_config(config)?.with_tagging(TaggingOptions::from_flags(flags)))
    }

    /// Sets the `tagging` controller's options (default: none; the controller refuses to
    /// start without `--tags` and `--resources`).
    pub fn with_tagging(mut self, options: TaggingOptions) -> Self {
        self.tagging = options;
        self
    }

    /// Builds the provider from the `--cloud-config` contents (none: all defaults). The SDK
    /// clients are created on first use from the default credential chain.
    ///
    /// Without a cluster ID in the config (e.g. no `--cloud-config` at all, as upstream's
    /// example manifest), the region, VPC and cluster ID are read from instance metadata and
    /// the tags of the instance the manager runs on ([`metadata`]), as upstream.
    pub fn from_config(config: Option<&[u8]>) -> Result<Self, AwsError> {
        let mut cfg = parse(config)?;
        if cfg.cluster_id().is_none() {
            // Called synchronously, possibly on the manager's runtime: discover on a thread
            // with its own runtime (bounded by `metadata::DISCOVERY_DEADLINE`).
            let found = std::thread::scope(|scope| {
                let cfg = &cfg;
                scope
                    .spawn(move || {
                        let rt = tokio::runtime::Builder::new_current_thread()
                            .enable_all()
                            .build()
                            .map_err(|e| AwsError::Runtime(e.to_string()))?;
                        Ok::<_, AwsError>(
                            rt.block_on(metadata::discover(cfg, &metadata::Sources::default()))?,
                        )
                    })
                    .join()
                    .map_err(|_| AwsError::Runtime("the discovery thread panicked".into()))?
            })?;
            if let Some(found) = found {
                found.apply(&mut cfg);
            }
        }
        let clients = Arc::new(LazyClients::new(cfg.clone(), ApiMetrics::default()));
        Ok(Self::with_clients(cfg, clients))
    }

    /// [`Self::from_config`] on the current runtime, discovering from `sources` (tests point
    /// them at the IMDS emulator and moto; `sources.sdk` also builds the clients).
    pub async fn from_config_with_sources(
        config: Option<&[u8]>,
        sources: metadata::Sources,
    ) -> Result<Self, AwsError> {
        let mut cfg = parse(config)?;
        if cfg.cluster_id().is_none()
            && let Some(found) = metadata::discover(&cfg, &sources).await?
        {
            found.apply(&mut cfg);
        }
        let metrics = ApiMetrics::default();
        let clients = match &sources.sdk {
            Some(sdk) => LazyClients::ready(AwsClients::from_sdk_config(&cfg, sdk, metrics).await?),
            None => LazyClients::new(cfg.clone(), metrics),
        };
        Ok(Self::with_clients(cfg, Arc::new(clients)))
    }

    /// Builds the provider on given clients (tests point these at moto).
    pub fn with_clients(config: CloudConfig, clients: Arc<LazyClients>) -> Self {
        let tags = ClusterTags::new(config.cluster_id());
        let instances = Arc::new(AwsInstances::new(
            Arc::clone(&clients),
            config.global.node_ip_families.clone(),
            tags.clone(),
        ));
        let routes = Arc::new(AwsRoutes::new(
            Arc::clone(&clients),
            Arc::clone(&instances),
            tags.clone(),
            Some(config.global.route_table_id.clone()),
        ));
        let load_balancer = Arc::new(AwsLoadBalancer::new(
            Arc::clone(&clients),
            Arc::clone(&instances),
            tags,
            config.clone(),
        ));
        Cloud {
            config,
            clients,
            instances,
            routes,
            load_balancer,
            tagging: TaggingOptions::default(),
        }
    }

    /// The AWS API call counters (register them in the manager's registry).
    pub fn metrics(&self) -> &ApiMetrics {
        self.clients.metrics()
    }

    /// The parsed cloud config.
    pub fn config(&self) -> &CloudConfig {
        &self.config
    }

    /// The concrete InstancesV2 (for lookups outside the trait, e.g. tests).
    pub fn aws_instances(&self) -> &Arc<AwsInstances> {
        &self.instances
    }
}

fn parse(config: Option<&[u8]>) -> Result<CloudConfig, AwsError> {
    let text = match config {
        Some(bytes) => std::str::from_utf8(bytes)?,
        None => "",
    };
    Ok(CloudConfig::parse(text)?)
}

impl CloudProvider for Cloud {
    fn name(&self) -> &str {
        PROVIDER_NAME
    }

    /// What reading the cloud config skipped (unknown sections and keys), for the manager's
    /// start-up `CloudConfigWarning` Events.
    fn config_warnings(&self) -> Vec<String> {
        self.config().config_warnings().to_vec()
    }

    fn has_cluster_id(&self) -> bool {
        self.config.cluster_id().is_some()
    }

    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        Some(Arc::clone(&self.instances) as Arc<dyn InstancesV2>)
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        Some(Arc::clone(&self.load_balancer) as Arc<dyn LoadBalancer>)
    }

    fn routes(&self) -> Option<Arc<dyn Routes>> {
        Some(Arc::clone(&self.routes) as Arc<dyn Routes>)
    }

    fn register_metrics(&self, registry: &mut prometheus_client::registry::Registry) {
        self.metrics().register(registry);
    }

    /// Keeps the client to name route targets by their Nodes (see [`routes`]).
    fn initialize(&self, init: ProviderInit) -> Result<(), BoxError> {
        self.routes.node_names().set_client(init.client);
        Ok(())
    }
}
