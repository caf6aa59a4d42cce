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
use crate::load_balancer::{AlphaFeatures, GceLoadBalancer, LbOptions, Timings};
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
    /// A provider flag's value is unusable (the flag is named; the value is not quoted).
    #[error("{0}")]
    Flag(String),
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

/// The `--cloud-config` contents (none: the defaults).
fn parse(cloud_config: Option<&[u8]>) -> Result<Config, Error> {
    Ok(match cloud_config {
        None => Config::default(),
        Some(bytes) => Config::parse(std::str::from_utf8(bytes).map_err(|_| Error::NotUtf8)?)?,
    })
}

impl GcpProvider {
    /// The manager's factory: the `--cloud-config` contents (none: everything from the
    /// metadata server, as upstream) and GCP's flags ([`extensions`]; unparsed: their
    /// defaults). No request is sent: the metadata server and Compute are asked on the first
    /// cloud call.
    pub fn from_command_line(
        cloud_config: Option<&[u8]>,
        flags: &ccm_core::manager::extensions::ProviderFlags,
    ) -> Result<Self, Error> {
        let lb = match flags.matches() {
            Some(m) => command_line::lb_options(m)?,
            None => LbOptions::default(),
        };
        Self::new_with(parse(cloud_config)?, ClientOptions::default(), Timings::default(), lb)
    }

    /// [`Self::from_command_line`] with every flag at its default.
    pub fn from_cloud_config(cloud_config: Option<&[u8]>) -> Result<Self, Error> {
        Self::new(parse(cloud_config)?, ClientOptions::default(), Timings::default())
    }

    /// The provider on a parsed config, with explicit call bounds and load-balancer retry
    /// delays (tests shorten them).
    pub fn new(config: Config, options: ClientOptions, timings: Timings) -> Result<Self, Error> {
        Self::new_with(config, options, timings, LbOptions::default())
    }

    /// [`Self::new`] with the load balancers' command-line options.
    pub fn new_with(
        config: Config,
        options: ClientOptions,
        timings: Timings,
        lb: LbOptions,
    ) -> Result<Self, Error> {
        let config = Arc::new(config);
        let client = Arc::new(GceClient::new(&config.global, options)?);
        let instances = Arc::new(GceInstances::new(client.clone()));
        let routes = Arc::new(GceRoutes::new(client.clone()));
        let alpha = AlphaFeatures::from_names(&config.global.alpha_features);
        let load_balancer = Arc::new(
            GceLoadBalancer::new(client.clone(), timings)
                .with_options(lb)
                .with_alpha_features(alpha),
        );
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
/// manager's; the factory reads their values from [`Extensions::parsed`](ccm_core::manager::extensions::Extensions::parsed)
/// ([`GcpProvider::from_command_line`]). See [`command_line`].
pub fn extensions() -> ccm_core::manager::extensions::Extensions {
    ccm_core::manager::extensions::Extensions {
        flags: command_line::args(),
        ..ccm_core::manager::extensions::Extensions::default()
    }
}

/// Upstream's eleven GCP flags (`cmd/cloud-controller-manager/main.go`, its node IPAM
/// options and the `gce` package's source-range flags, at v36.3.x):
///
/// | flag | here |
/// |---|---|
/// | `--cloud-provider-gce-lb-src-cidrs` | honoured: the health-check firewalls' source ranges (default Google's four L3/L4 ranges) |
/// | `--enable-l4-lb-annotations` | honoured: the Service is annotated with its target pool / backend service |
/// | `--cloud-provider-gce-l7lb-src-cidrs` | validated, accepted only (the manager warns when given) |
/// | `--enable-multi-project`, `--enable-rbs-default-l4-netlb`, `--enable-l4-deny-firewall`, `--enable-l4-deny-firewall-rollback-cleanup`, `--enable-gke-tenant-controller`, `--enable-l4-ilb-fine-grained-lock`, `--enable-multi-subnet-cluster`, `--enable-multi-networking` | GKE features: accepted only (the manager warns when given); the deny-firewall pair is checked as upstream |
pub mod command_line {
    use ccm_core::manager::extensions::clap::{Arg, ArgMatches};
    use ccm_core::manager::extensions::{accepted_only, flag};

    use crate::Error;
    use crate::load_balancer::{L4_HEALTH_CHECK_RANGES, LbOptions};

    /// `--cloud-provider-gce-lb-src-cidrs`.
    pub const LB_SRC_CIDRS: &str = "cloud-provider-gce-lb-src-cidrs";
    /// `--cloud-provider-gce-l7lb-src-cidrs`.
    pub const L7LB_SRC_CIDRS: &str = "cloud-provider-gce-l7lb-src-cidrs";
    /// `--enable-l4-lb-annotations`.
    pub const L4_LB_ANNOTATIONS: &str = "enable-l4-lb-annotations";
    /// `--enable-l4-deny-firewall`.
    pub const L4_DENY_FIREWALL: &str = "enable-l4-deny-firewall";
    /// `--enable-l4-deny-firewall-rollback-cleanup`.
    pub const L4_DENY_FIREWALL_CLEANUP: &str = "enable-l4-deny-firewall-rollback-cleanup";
    /// Upstream's default `--cloud-provider-gce-l7lb-src-cidrs`.
    pub const L7_RANGES: [&str; 2] = ["130.211.0.0/22", "35.191.0.0/16"];

    /// The GKE-only boolean flags: accepted, not acted on (the manager warns when one is
    /// given), with what upstream does with them.
    pub const GKE_ONLY: [(&str, &str); 8] = [
        (
            "enable-multi-project",
            "Upstream: takes the project of GCE API calls from the Node's providerID (GKE multi-project). Here the config's project is used.",
        ),
        (
            "enable-rbs-default-l4-netlb",
            "Upstream: L4 NetLB Services default to GKE's regional backend-service controller (GKE).",
        ),
        (
            L4_DENY_FIREWALL,
            "Upstream: an extra deny firewall rule for L4 external load balancers (GKE); needs --enable-l4-deny-firewall-rollback-cleanup, as upstream.",
        ),
        (
            L4_DENY_FIREWALL_CLEANUP,
            "Upstream: cleans up the deny firewall rules of --enable-l4-deny-firewall (GKE).",
        ),
        ("enable-gke-tenant-controller", "Upstream: the GKE tenant controller manager (GKE)."),
        ("enable-l4-ilb-fine-grained-lock", "Upstream: per-resource locking for L4 ILB syncs."),
        (
            "enable-multi-subnet-cluster",
            "Upstream: node IPAM's multi-subnet cluster feature (GKE nodeTopology).",
        ),
        ("enable-multi-networking", "Upstream: node IPAM's multi-networking (GKE)."),
    ];

    /// Comma-separated CIDRs (upstream parses each with `ParseCIDRSloppy`): normalised to the
    /// network address, sorted as text (as upstream prints them), without duplicates. The
    /// value is never quoted back.
    pub fn parse_cidrs(flag: &str, value: &str) -> Result<Vec<String>, Error> {
        let mut out = std::collections::BTreeSet::new();
        for (i, part) in value.split(',').enumerate() {
            let net: ipnet::IpNet = part.trim().parse().map_err(|_| {
                Error::Flag(format!(
                    "--{flag}: entry {} is not a CIDR (want e.g. 130.211.0.0/22)",
                    i + 1
                ))
            })?;
            out.insert(net.trunc().to_string());
        }
        Ok(out.into_iter().collect())
    }

    fn cidrs_arg(name: &'static str, default: &'static str) -> Arg {
        flag::value(name, "CIDRS")
            .default_value(default)
            .value_parser(move |v: &str| parse_cidrs(name, v).map(|_| v.to_string()))
    }

    /// Every GCP flag, for [`super::extensions`].
    pub fn args() -> Vec<Arg> {
        let mut args = vec![
            cidrs_arg(
                LB_SRC_CIDRS,
                "130.211.0.0/22,35.191.0.0/16,209.85.152.0/22,209.85.204.0/22",
            )
            .help("CIDRs opened in GCE firewall for L4 LB traffic proxy & health checks: the source ranges of the health-check firewalls the load balancers create."),
            accepted_only(cidrs_arg(L7LB_SRC_CIDRS, "130.211.0.0/22,35.191.0.0/16").help(
                "CIDRs opened in GCE firewall for L7 LB traffic proxy & health checks. Upstream: kept for ingress-gce; its cloud-controller-manager does not use it either.",
            )),
            flag::boolean(L4_LB_ANNOTATIONS, false).help(
                "Enables Annotations for GCE L4 LB Services: networking.gke.io/target-pool (external) or networking.gke.io/backend-service (internal).",
            ),
        ];
        args.extend(
            GKE_ONLY
                .iter()
                .map(|(name, help)| accepted_only(flag::boolean(name, false).help(*help))),
        );
        args
    }

    fn on(m: &ArgMatches, id: &str) -> bool {
        m.try_get_one::<bool>(id).ok().flatten().copied().unwrap_or(false)
    }

    /// The load balancers' options from the parsed command line; refuses what upstream
    /// refuses (`--enable-l4-deny-firewall` without
    /// `--enable-l4-deny-firewall-rollback-cleanup`).
    pub fn lb_options(m: &ArgMatches) -> Result<LbOptions, Error> {
        let cidrs = |id: &str, default: &[&str]| -> Result<Vec<String>, Error> {
            match m.try_get_one::<String>(id).ok().flatten() {
                Some(v) => parse_cidrs(id, v),
                None => Ok(default.iter().map(|s| s.to_string()).collect()),
            }
        };
        let health_check_sources = cidrs(LB_SRC_CIDRS, &L4_HEALTH_CHECK_RANGES)?;
        cidrs(L7LB_SRC_CIDRS, &L7_RANGES)?;
        if on(m, L4_DENY_FIREWALL) && !on(m, L4_DENY_FIREWALL_CLEANUP) {
            return Err(Error::Flag(format!(
                "--{L4_DENY_FIREWALL} requires --{L4_DENY_FIREWALL_CLEANUP} to be true (as upstream)"
            )));
        }
        let options =
            LbOptions { health_check_sources, resource_annotations: on(m, L4_LB_ANNOTATIONS) };
        tracing::info!(
            health_check_sources = ?options.health_check_sources,
            resource_annotations = options.resource_annotations,
            "GCE: load balancer options"
        );
        Ok(options)
    }
}

impl CloudProvider for GcpProvider {
    /// Cloud resources carry `--cluster-name`: routes are named `<cluster-name>-<node UID>`.
    fn names_resources_by_cluster(&self) -> bool {
        true
    }

    fn name(&self) -> &str {
        PROVIDER_NAME
    }

    /// What reading `gce.conf` skipped (unknown sections and keys), for the manager's start-up
    /// `CloudConfigWarning` Events.
    fn config_warnings(&self) -> Vec<String> {
        self.config().config_warnings().to_vec()
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
