//! The `openstack` cloud provider: Nova, Neutron and Octavia, as upstream
//! `kubernetes/cloud-provider-openstack` (`openstack-cloud-controller-manager`).
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | the gcfg INI `cloud.conf` and the `clouds.yaml` entry it may point at |
//! | [`client`] | the Keystone token shared by every call, JSON calls to the catalog's services (Nova, Neutron, Octavia), OpenStack errors, deadlines, retries, renewal before expiry and re-authentication on 401 |
//! | [`keystone`] | our Keystone v3 authentication (password by name or ID, application credential by ID or name and user, token, trust) and the service catalog |
//! | [`instances`] | InstancesV2: providerID, addresses, zone, flavor; one server and one port listing per batch |
//! | [`load_balancer`] | LoadBalancer: Octavia load balancers, listeners, pools, members, monitors, floating IPs, security groups |
//! | [`routes`] | Routes: the router's extra routes and the nodes' ports' allowed address pairs |
//!
//! No image credential provider (upstream has none). Upstream decisions kept or changed are
//! listed in `providers/openstack/README.md`.

pub mod client;
pub mod config;
pub mod instances;
pub mod keystone;
pub mod load_balancer;
pub mod routes;

use std::collections::BTreeMap;
use std::sync::Arc;

use ccm_core::cloud::{BoxError, CloudProvider, InstancesV2, LoadBalancer, ProviderInit, Routes};
use ccm_core::manager::extensions::{Extensions, ProviderFlags, flag};

use crate::client::{ClientError, ClientOptions, OpenStackClient};
use crate::config::{Config, ConfigError};
use crate::instances::OpenStackInstances;
use crate::load_balancer::{OctaviaLoadBalancer, Timings};
use crate::routes::OpenStackRoutes;

/// The provider name, as given to `--cloud-provider`.
pub const PROVIDER_NAME: &str = "openstack";

/// `--user-agent`: upstream's one own flag (`openstack.AddExtraFlags`).
const USER_AGENT_FLAG: &str = "user-agent";

/// What OpenStack adds to the manager: upstream's `--user-agent` (repeatable; each value is
/// added to the `User-Agent` of every OpenStack call, see
/// [`client::user_agent_with`]). The binary's factory is
/// [`OpenStackProvider::from_command_line`] with a clone of [`Extensions::parsed`].
pub fn extensions() -> Extensions {
    Extensions {
        flags: vec![
            flag::string_array(USER_AGENT_FLAG)
                .help(
                    "Extra data for the User-Agent of OpenStack calls; repeat the flag to add more \
                     than one (the last given comes first).",
                )
                .help_heading("OpenStack client flags"),
        ],
        ..Extensions::default()
    }
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
    /// The client could not be set up (e.g. an unreadable `ca-file`, an unsupported
    /// authentication method).
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// The OpenStack provider.
#[derive(Debug)]
pub struct OpenStackProvider {
    config: Arc<Config>,
    client: Arc<OpenStackClient>,
    instances: Arc<OpenStackInstances>,
    load_balancer: Option<Arc<OctaviaLoadBalancer>>,
    routes: Option<Arc<OpenStackRoutes>>,
}

impl OpenStackProvider {
    /// The manager's factory: [`Self::from_cloud_config`], then the `--user-agent` values of
    /// the parsed command line on the client (an unusable value is an error naming it).
    pub fn from_command_line(
        cloud_config: Option<&[u8]>,
        flags: &ProviderFlags,
    ) -> Result<Self, Error> {
        let provider = Self::from_cloud_config(cloud_config)?;
        let extra = flags.strings(USER_AGENT_FLAG);
        if !extra.is_empty() {
            provider.client.set_user_agents(extra)?;
        }
        Ok(provider)
    }

    /// The manager's factory: the `--cloud-config` contents and this process's environment
    /// (`OS_CCM_REGIONAL`, and for `use-clouds` the clouds.yaml search variables). No request
    /// is sent: Keystone is asked on the first cloud call.
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
        let config = Arc::new(config);
        let client = Arc::new(OpenStackClient::new(&config.global, options)?);
        let instances = Arc::new(OpenStackInstances::new(client.clone(), &config));
        // As upstream: `[LoadBalancer] enabled = false` turns load balancers off.
        let load_balancer = config
            .load_balancer
            .enabled
            .then(|| Arc::new(OctaviaLoadBalancer::new(client.clone(), config.clone(), timings)));
        // Upstream offers routes when `[Route] router-id` is set and Neutron has an
        // extra-route extension; the extension is checked on the first route call (the
        // factory sends no request), and a Neutron without it fails those calls, naming it.
        let routes = OpenStackRoutes::new(client.clone(), &config).ok().map(Arc::new);
        tracing::info!(
            auth_url = %config.global.auth_url,
            region = %config.global.region,
            load_balancers = load_balancer.is_some(),
            routes = routes.is_some(),
            "OpenStack provider"
        );
        Ok(OpenStackProvider { config, client, instances, load_balancer, routes })
    }

    /// The parsed config.
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// The OpenStack client.
    pub fn client(&self) -> &Arc<OpenStackClient> {
        &self.client
    }
}

impl CloudProvider for OpenStackProvider {
    /// Cloud resources carry `--cluster-name`: load balancers are named `kube_service_<cluster>_<ns>_<name>` and described with the cluster name (the ownership proof).
    fn names_resources_by_cluster(&self) -> bool {
        true
    }

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
        self.load_balancer.clone().map(|lb| lb as Arc<dyn LoadBalancer>)
    }

    fn routes(&self) -> Option<Arc<dyn Routes>> {
        self.routes.clone().map(|r| r as Arc<dyn Routes>)
    }

    /// Upstream's `Initialize`: the manager's Kubernetes client, with which the load balancer
    /// writes `load-balancer-id`/`load-balancer-address` back on Services and raises its
    /// Warning Events (component `cloud-provider-openstack`).
    fn initialize(&self, init: ProviderInit) -> Result<(), BoxError> {
        if let Some(lb) = &self.load_balancer {
            lb.set_kube_client(init.client);
        }
        Ok(())
    }
}
