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
//! Azure's own flags ([`extensions`], [`command_line`]): `--cloud-config-secret-name`,
//! `--cloud-config-secret-namespace`, `--cloud-config-key` (the Secret the config is read
//! from without a `--cloud-config` file) and `--enable-dynamic-reloading` (the file, or else
//! the Secret, is re-read every [`RELOAD_INTERVAL`]; a change rebuilds the provider's clients
//! on the new config in place, as upstream restarts its controllers on it).
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

use std::path::PathBuf;
use std::sync::{Arc, RwLock, Weak};
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::cloud::{
    BoxError, CloudLoadBalancer, CloudProvider, InstanceMetadata, InstanceStatus, InstancesV2,
    LoadBalancer, ProviderError, ProviderInit, Route, Routes, Zone, Zones,
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

use crate::client::{ArmClient, ClientError, ClientOptions};
use crate::config::{CloudConfigType, Config, ConfigError, SecretLocation};
use crate::instances::AzureInstances;
use crate::load_balancer::AzureLoadBalancer;
use crate::routes::AzureRoutes;

/// How often `--enable-dynamic-reloading` re-reads the config file or Secret.
pub const RELOAD_INTERVAL: Duration = Duration::from_secs(10);

/// Why the provider could not be built.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cloud config is invalid.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The client could not be set up (credentials, HTTP client).
    #[error(transparent)]
    Client(#[from] ClientError),
    /// A provider flag's value is unusable (the flag is named).
    #[error("{0}")]
    Flag(String),
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

    fn has_routes(&self) -> bool {
        self.config.route_table_name.as_deref().is_some_and(|n| !n.trim().is_empty())
    }
}

/// Where the config comes from, and whether it is reloaded: Azure's flags.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Source {
    /// The `--cloud-config` file's path (re-read by dynamic reloading).
    pub file_path: Option<PathBuf>,
    /// The Secret read when there is no `--cloud-config` file
    /// (`--cloud-config-secret-namespace`/`-name`/`-key`; by default
    /// `kube-system/azure-cloud-provider`, key `cloud-config`). With a file, the Secret merged
    /// over it (`cloudConfigType`) is upstream's fixed `kube-system/azure-cloud-provider`.
    pub secret: SecretLocation,
    /// `--enable-dynamic-reloading`: re-read the file (or, without one, the Secret) this often
    /// and rebuild on a change.
    pub reload: Option<Duration>,
}

/// The provider's current clients; replaced as a whole when the config is reloaded. The
/// capabilities handed to the controllers ([`CloudProvider::instances_v2`] ...) are this, so
/// a reload reaches controllers that are already running.
#[derive(Debug, Default)]
struct Live {
    current: RwLock<Option<Arc<Inner>>>,
}

impl Live {
    fn get(&self) -> Option<Arc<Inner>> {
        self.current.read().ok().and_then(|c| c.clone())
    }

    fn set(&self, inner: Inner) {
        if let Ok(mut c) = self.current.write() {
            *c = Some(Arc::new(inner));
        }
    }

    fn inner(&self) -> Result<Arc<Inner>, ProviderError> {
        self.get().ok_or_else(|| {
            ProviderError::other("the Azure provider has no config yet (not initialised)")
        })
    }
}

/// The Azure provider.
#[derive(Debug)]
pub struct AzureProvider {
    /// The `--cloud-config` file's contents at start.
    file: Option<Vec<u8>>,
    options: ClientOptions,
    source: Source,
    live: Arc<Live>,
}

impl AzureProvider {
    /// The manager's factory: the `--cloud-config` contents and Azure's flags
    /// ([`extensions`]; unparsed: their defaults). With `cloudConfigType: file` everything is
    /// set up now (no request sent); otherwise the Secret is read when the manager hands over
    /// its client ([`CloudProvider::initialize`]).
    pub fn from_command_line(
        cloud_config: Option<&[u8]>,
        flags: &ccm_core::manager::extensions::ProviderFlags,
    ) -> Result<Self, Error> {
        let source = command_line::source(flags)?;
        if cloud_config.is_some() && flags.is_set(command_line::SECRET_NAME) {
            tracing::warn!(
                "--{} is not read: a --cloud-config file is given, and the file wins (as upstream)",
                command_line::SECRET_NAME
            );
        }
        Self::new_with(cloud_config, ClientOptions::from_env()?, source)
    }

    /// [`Self::from_command_line`] with every flag at its default.
    pub fn from_cloud_config(cloud_config: Option<&[u8]>) -> Result<Self, Error> {
        Self::new(cloud_config, ClientOptions::from_env()?)
    }

    /// The provider on a config file's contents with explicit client options (tests).
    pub fn new(cloud_config: Option<&[u8]>, options: ClientOptions) -> Result<Self, Error> {
        Self::new_with(cloud_config, options, Source::default())
    }

    /// [`Self::new`] with the config's source and reloading.
    pub fn new_with(
        cloud_config: Option<&[u8]>,
        options: ClientOptions,
        source: Source,
    ) -> Result<Self, Error> {
        let provider = AzureProvider {
            file: cloud_config.map(<[u8]>::to_vec),
            options,
            source,
            live: Arc::new(Live::default()),
        };
        if let Some(bytes) = cloud_config {
            let config = Config::from_bytes(bytes)?;
            if config.cloud_config_type == CloudConfigType::File {
                let inner = Inner::new(config, provider.options.clone())?;
                provider.live.set(inner);
            }
        }
        Ok(provider)
    }

    /// The config in use, once known (the latest, after a reload).
    pub fn config(&self) -> Option<Arc<Config>> {
        self.live.get().map(|i| i.config.clone())
    }

    /// The ARM client, once the config is known.
    pub fn client(&self) -> Option<Arc<ArmClient>> {
        self.live.get().map(|i| i.client.clone())
    }
}

/// Azure's own flags (upstream `cloud-provider-azure`'s command line), registered with the
/// manager's; the factory reads their values from [`Extensions::parsed`](ccm_core::manager::extensions::Extensions::parsed)
/// ([`AzureProvider::from_command_line`]). See [`command_line`].
pub fn extensions() -> ccm_core::manager::extensions::Extensions {
    ccm_core::manager::extensions::Extensions {
        flags: command_line::args(),
        ..ccm_core::manager::extensions::Extensions::default()
    }
}

/// The flags upstream's `cloud-controller-manager` (v1.36.5) registers beyond the common
/// ones (`cmd/cloud-controller-manager/app/options`, `pkg/log`):
///
/// | flag | here |
/// |---|---|
/// | `--cloud-config-secret-name`, `--cloud-config-secret-namespace` (default `kube-system`), `--cloud-config-key` (default `cloud-config`) | honoured: without a `--cloud-config` file, the config is that Secret's key (one `get` of that Secret) |
/// | `--enable-dynamic-reloading` | honoured: the file (or, without one, the Secret) is re-read every [`super::RELOAD_INTERVAL`]; a change rebuilds the provider on the new config (an unusable new config is logged and the old one kept) |
/// | `--node-filter-requirements` | accepted only (the manager warns when given): every Node is managed |
/// | `--log-format` | accepted only (the manager warns when given): use `--logging-format` |
pub mod command_line {
    use std::path::PathBuf;

    use ccm_core::manager::extensions::clap::Arg;
    use ccm_core::manager::extensions::{ProviderFlags, accepted_only, flag};

    use crate::config::{
        SECRET_KEY, SECRET_NAME as DEFAULT_SECRET, SECRET_NAMESPACE, SecretLocation,
    };
    use crate::{Error, RELOAD_INTERVAL, Source};

    /// `--enable-dynamic-reloading`.
    pub const DYNAMIC_RELOADING: &str = "enable-dynamic-reloading";
    /// `--cloud-config-secret-name`.
    pub const SECRET_NAME: &str = "cloud-config-secret-name";
    /// `--cloud-config-secret-namespace`.
    pub const SECRET_NAMESPACE_FLAG: &str = "cloud-config-secret-namespace";
    /// `--cloud-config-key`.
    pub const CONFIG_KEY: &str = "cloud-config-key";
    /// `--node-filter-requirements`.
    pub const NODE_FILTER: &str = "node-filter-requirements";
    /// `--log-format`.
    pub const LOG_FORMAT: &str = "log-format";

    /// Every Azure flag, for [`super::extensions`].
    pub fn args() -> Vec<Arg> {
        vec![
            flag::boolean(DYNAMIC_RELOADING, false).help(
                "Enable re-configuring cloud controller manager from secret without restarting: the --cloud-config file (or, without one, the Secret) is re-read and the provider rebuilt on a change.",
            ),
            flag::value(SECRET_NAME, "NAME").default_value("").help(
                "The name of the cloud config secret (read when no --cloud-config file is given; default azure-cloud-provider).",
            ),
            flag::value(SECRET_NAMESPACE_FLAG, "NAMESPACE")
                .default_value(SECRET_NAMESPACE)
                .help("The k8s namespace of the cloud config secret."),
            flag::value(CONFIG_KEY, "KEY")
                .default_value(SECRET_KEY)
                .help("The key of the config data in the cloud config secret."),
            accepted_only(flag::value(NODE_FILTER, "SELECTOR").help(
                "Upstream: a label selector for the Nodes the cloud-controller-manager manages. Here every Node is managed.",
            )),
            accepted_only(flag::value(LOG_FORMAT, "FORMAT").default_value("text").help(
                "Upstream: its own log format switch (text or json). Here --logging-format sets the format.",
            )),
        ]
    }

    /// A DNS-1123 subdomain (a Secret's name) or label (a namespace).
    fn dns_name(s: &str, max: usize, dots: bool) -> bool {
        !s.is_empty()
            && s.len() <= max
            && s.bytes().all(|b| {
                b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || (dots && b == b'.')
            })
            && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
            && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
    }

    /// A Secret data key.
    fn data_key(s: &str) -> bool {
        !s.is_empty()
            && s.len() <= 253
            && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
    }

    /// The config's source from the parsed flags (the core's `--cloud-config` path included).
    pub fn source(flags: &ProviderFlags) -> Result<Source, Error> {
        let name = flags.get::<String>(SECRET_NAME).unwrap_or_default();
        let namespace =
            flags.get::<String>(SECRET_NAMESPACE_FLAG).unwrap_or_else(|| SECRET_NAMESPACE.into());
        let key = flags.get::<String>(CONFIG_KEY).unwrap_or_else(|| SECRET_KEY.into());
        let name = if name.is_empty() { DEFAULT_SECRET.to_string() } else { name };
        if !dns_name(&name, 253, true) {
            return Err(Error::Flag(format!(
                "--{SECRET_NAME}: not a Secret name (lower-case letters, digits, '-' and '.')"
            )));
        }
        if !dns_name(&namespace, 63, false) {
            return Err(Error::Flag(format!(
                "--{SECRET_NAMESPACE_FLAG}: not a namespace name (lower-case letters, digits and '-')"
            )));
        }
        if !data_key(&key) {
            return Err(Error::Flag(format!(
                "--{CONFIG_KEY}: not a Secret key (letters, digits, '-', '_' and '.')"
            )));
        }
        let file_path =
            flags.get::<String>("cloud_config").filter(|p| !p.is_empty()).map(PathBuf::from);
        let reload = flags.bool_or(DYNAMIC_RELOADING, false).then_some(RELOAD_INTERVAL);
        Ok(Source { file_path, secret: SecretLocation { namespace, name, key }, reload })
    }
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
        self.live.get().map(|_| self.live.clone() as Arc<dyn InstancesV2>)
    }

    fn zones(&self) -> Option<Arc<dyn Zones>> {
        self.live.get().map(|_| self.live.clone() as Arc<dyn Zones>)
    }

    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        self.live.get().map(|_| self.live.clone() as Arc<dyn LoadBalancer>)
    }

    /// Routes need `routeTableName` (upstream's route controller fails every call without
    /// it; here the capability is simply absent and the route controller is skipped). A
    /// reload that adds it takes effect at the next start.
    fn routes(&self) -> Option<Arc<dyn Routes>> {
        self.live.get().filter(|i| i.has_routes()).map(|_| self.live.clone() as Arc<dyn Routes>)
    }

    /// With `cloudConfigType` `secret` or `merge` (upstream's default), or without a file,
    /// reads the Secret (one `get` of that Secret) and sets the provider up on the result;
    /// the controllers start after this returns. With `--enable-dynamic-reloading`, starts
    /// re-reading the file (or the Secret) until `init.shutdown`.
    fn initialize(&self, init: ProviderInit) -> Result<(), BoxError> {
        if self.live.get().is_none() {
            let file = self.file.clone();
            let client = init.client.clone();
            let at = self.at();
            let config = tokio::task::block_in_place(|| {
                tokio::runtime::Handle::current().block_on(async move {
                    config::load_from(file.as_deref(), Some(client), &at, &|k| {
                        std::env::var(k).ok()
                    })
                    .await
                })
            })?;
            self.live.set(Inner::new(config, self.options.clone())?);
        }
        // Namespace selectors of several load balancers read the Services' namespaces.
        if let Some(inner) = self.live.get() {
            inner.load_balancer.set_kube(init.client.clone());
            // Several load balancers: Local Services' own pools follow their endpoints.
            let shutdown = init.shutdown.clone();
            AzureLoadBalancer::spawn_pool_updater(&inner.load_balancer, async move {
                shutdown.cancelled().await
            });
        }
        if let Some(every) = self.source.reload {
            let watch = Reloader {
                live: Arc::downgrade(&self.live),
                options: self.options.clone(),
                file_path: self.source.file_path.clone(),
                file: self.file.clone(),
                at: self.at(),
                kube: init.client.clone(),
                every,
            };
            let shutdown = init.shutdown.clone();
            tokio::spawn(watch.run(async move { shutdown.cancelled().await }));
        }
        Ok(())
    }
}

impl AzureProvider {
    /// The Secret [`config::load_from`] reads: the flags' without a file, upstream's fixed
    /// one to merge over a file.
    fn at(&self) -> SecretLocation {
        if self.file.is_some() { SecretLocation::default() } else { self.source.secret.clone() }
    }
}

/// `--enable-dynamic-reloading`: re-reads the file (or the Secret) every `every`; on a change
/// loads the config as at start and replaces the provider's clients.
struct Reloader {
    live: Weak<Live>,
    options: ClientOptions,
    file_path: Option<PathBuf>,
    file: Option<Vec<u8>>,
    at: SecretLocation,
    kube: kube::Client,
    every: Duration,
}

impl Reloader {
    /// What is watched: the file's bytes, else the Secret key's.
    async fn input(&self) -> Result<Option<Vec<u8>>, String> {
        match &self.file_path {
            Some(path) => tokio::fs::read(path)
                .await
                .map(Some)
                .map_err(|e| format!("reading --cloud-config {}: {e}", path.display())),
            None => config::read_secret_bytes(self.kube.clone(), &self.at)
                .await
                .map_err(|e| e.to_string()),
        }
    }

    async fn run(self, stop: impl std::future::Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        let what = match &self.file_path {
            Some(p) => format!("file {}", p.display()),
            None => format!("Secret {}/{} key {}", self.at.namespace, self.at.name, self.at.key),
        };
        tracing::info!(source = %what, every = ?self.every, "azure: dynamic reloading of the cloud config");
        let mut last = match &self.file_path {
            Some(_) => self.file.clone(),
            None => self.input().await.ok().flatten(),
        };
        loop {
            tokio::select! {
                () = &mut stop => return,
                () = tokio::time::sleep(self.every) => {}
            }
            let Some(live) = self.live.upgrade() else { return };
            let now = match self.input().await {
                Ok(now) => now,
                Err(e) => {
                    tracing::warn!(source = %what, error = %e, "azure: could not re-read the cloud config; keeping the current one");
                    continue;
                }
            };
            if now == last {
                continue;
            }
            last = now.clone();
            let file = if self.file_path.is_some() { now } else { None };
            let loaded =
                config::load_from(file.as_deref(), Some(self.kube.clone()), &self.at, &|k| {
                    std::env::var(k).ok()
                })
                .await
                .map_err(Error::from)
                .and_then(|c| Inner::new(c, self.options.clone()));
            match loaded {
                Ok(inner) => {
                    inner.load_balancer.set_kube(self.kube.clone());
                    // Runs while this config is the live one (it holds the provider weakly).
                    AzureLoadBalancer::spawn_pool_updater(
                        &inner.load_balancer,
                        std::future::pending(),
                    );
                    live.set(inner);
                    tracing::info!(source = %what, "azure: the cloud config changed; the provider now runs on the new config");
                }
                Err(e) => {
                    tracing::error!(source = %what, error = %e, "azure: the changed cloud config is unusable; keeping the current one");
                }
            }
        }
    }
}

#[async_trait]
impl InstancesV2 for Live {
    async fn instance_exists(&self, node: &Node) -> Result<bool, ProviderError> {
        self.inner()?.instances.instance_exists(node).await
    }

    async fn instance_shutdown(&self, node: &Node) -> Result<bool, ProviderError> {
        self.inner()?.instances.instance_shutdown(node).await
    }

    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata, ProviderError> {
        self.inner()?.instances.instance_metadata(node).await
    }

    async fn instance_metadata_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceMetadata, ProviderError>> {
        match self.inner() {
            Ok(i) => i.instances.instance_metadata_batch(nodes).await,
            Err(e) => nodes.iter().map(|_| Err(ProviderError::other(e.to_string()))).collect(),
        }
    }

    async fn instance_status_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceStatus, ProviderError>> {
        match self.inner() {
            Ok(i) => i.instances.instance_status_batch(nodes).await,
            Err(e) => nodes.iter().map(|_| Err(ProviderError::other(e.to_string()))).collect(),
        }
    }

    fn max_batch(&self) -> usize {
        self.get().map(|i| i.instances.max_batch()).unwrap_or(500)
    }
}

#[async_trait]
impl Zones for Live {
    async fn zone_by_provider_id(&self, provider_id: &str) -> Result<Zone, ProviderError> {
        self.inner()?.instances.zone_by_provider_id(provider_id).await
    }

    async fn zone_by_node_name(&self, node_name: &str) -> Result<Zone, ProviderError> {
        self.inner()?.instances.zone_by_node_name(node_name).await
    }
}

#[async_trait]
impl LoadBalancer for Live {
    async fn get_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        self.inner()?.load_balancer.get_load_balancer(cluster_name, service).await
    }

    fn load_balancer_name(&self, cluster_name: &str, service: &Service) -> String {
        match self.get() {
            Some(i) => i.load_balancer.load_balancer_name(cluster_name, service),
            None => ccm_core::cloud::default_load_balancer_name(service),
        }
    }

    async fn ensure_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        self.inner()?.load_balancer.ensure_load_balancer(cluster_name, service, nodes).await
    }

    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<(), ProviderError> {
        self.inner()?.load_balancer.update_load_balancer(cluster_name, service, nodes).await
    }

    async fn ensure_load_balancer_deleted(
        &self,
        cluster_name: &str,
        service: &Service,
    ) -> Result<(), ProviderError> {
        self.inner()?.load_balancer.ensure_load_balancer_deleted(cluster_name, service).await
    }

    async fn list_cloud_load_balancers(
        &self,
        cluster_name: &str,
    ) -> Result<Vec<CloudLoadBalancer>, ProviderError> {
        self.inner()?.load_balancer.list_cloud_load_balancers(cluster_name).await
    }

    async fn delete_cloud_load_balancer(
        &self,
        cluster_name: &str,
        lb: &CloudLoadBalancer,
    ) -> Result<(), ProviderError> {
        self.inner()?.load_balancer.delete_cloud_load_balancer(cluster_name, lb).await
    }
}

#[async_trait]
impl Routes for Live {
    async fn list_routes(&self, cluster_name: &str) -> Result<Vec<Route>, ProviderError> {
        self.inner()?.routes.list_routes(cluster_name).await
    }

    async fn create_route(
        &self,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<(), ProviderError> {
        self.inner()?.routes.create_route(cluster_name, name_hint, route).await
    }

    async fn delete_route(&self, cluster_name: &str, route: &Route) -> Result<(), ProviderError> {
        self.inner()?.routes.delete_route(cluster_name, route).await
    }
}
