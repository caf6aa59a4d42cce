//! `cloud-node-manager-azure`: upstream's per-node DaemonSet (`cmd/cloud-node-manager`,
//! `pkg/nodemanager`). It initialises only its own Node — providerID, addresses,
//! instance-type/zone/region labels, the `node.cloudprovider.kubernetes.io/uninitialized`
//! taint lifted — from the instance metadata service (or, with
//! `--use-instance-metadata=false`, from ARM with `--cloud-config`), and keeps the addresses
//! current every `--node-status-update-frequency`. Clusters run it with the CCM's
//! `--controllers=*,-cloud-node`.
//!
//! ```text
//!  watch Node <node-name> (field selector) ──▶ tainted? ──yes──▶ [wait-routes: NetworkUnavailable=True]
//!        │ every --node-status-update-frequency          ImdsInstances (InstancesV2 for this node)
//!        ▼                                                 ▼
//!   addresses refreshed                          PATCH nodes/status addresses
//!                                                PUT Node: providerID, labels, taint removed
//! ```
//!
//! What the Node gets is decided by core's node-initialisation rules
//! ([`ccm_core::controllers::node_util`]: which labels, beta twins, provided-node-ip
//! ordering, when addresses changed) with an [`InstancesV2`] answering for the one local node
//! ([`ImdsInstances`]), so both binaries stamp Nodes identically.
//!
//! RBAC (upstream's `cloud-node-manager` ClusterRole): `nodes` get, list, watch (the watch
//! carries `fieldSelector=metadata.name=<node>`), update, patch; `nodes/status` patch.

use std::future::Future;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::cloud::{InstanceMetadata, InstancesV2, ProviderError};
use ccm_core::controllers::node_util;
use ccm_core::manager::flags::LogFormat;
use ccm_core::names;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use kube::api::{Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};

use crate::imds::{ImdsClient, InstanceMetadata as Imds};

/// Upstream's default `--node-status-update-frequency`.
pub const DEFAULT_STATUS_UPDATE_FREQUENCY: Duration = Duration::from_secs(5 * 60);
/// The label of the VM's platform sub-fault domain (upstream `LabelPlatformSubFaultDomain`).
pub const LABEL_SUB_FAULT_DOMAIN: &str = "topology.kubernetes.azure.com/sub-fault-domain";
/// The label of the VM's platform interconnect group (upstream
/// `LabelPlatformInterconnectGroup`), from the IMDS tag [`TAG_INTERCONNECT_GROUP`].
pub const LABEL_INTERCONNECT_GROUP: &str = "topology.kubernetes.azure.com/interconnect-group";
/// The IMDS `tagsList` entry naming the interconnect group (upstream
/// `TagNameInterconnectGroup`; an empty value sets no label).
pub const TAG_INTERCONNECT_GROUP: &str = "Platform_Interconnect_Group";

/// [`InstancesV2`] for the node this process runs on, from IMDS (upstream's
/// `IMDSNodeProvider`). It answers only for its own node; it never says another node's
/// instance is gone.
#[derive(Debug, Clone)]
pub struct ImdsInstances {
    imds: ImdsClient,
    node_name: String,
}

impl ImdsInstances {
    /// Answers for `node_name` from `imds`.
    pub fn new(imds: ImdsClient, node_name: impl Into<String>) -> Self {
        ImdsInstances { imds, node_name: node_name.into() }
    }

    fn own(&self, node: &Node) -> Result<(), ProviderError> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        if name.eq_ignore_ascii_case(&self.node_name) {
            Ok(())
        } else {
            Err(ProviderError::other(format!(
                "instance metadata answers for node {} only, not {name}",
                self.node_name
            )))
        }
    }
}

#[async_trait]
impl InstancesV2 for ImdsInstances {
    /// IMDS answering means this VM runs.
    async fn instance_exists(&self, node: &Node) -> Result<bool, ProviderError> {
        self.own(node)?;
        self.imds.instance().await?;
        Ok(true)
    }

    async fn instance_shutdown(&self, node: &Node) -> Result<bool, ProviderError> {
        self.own(node)?;
        Ok(false)
    }

    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata, ProviderError> {
        self.own(node)?;
        local_metadata(&self.imds.metadata().await?, &self.node_name)
    }
}

/// What IMDS says about this VM, as node metadata (upstream `getLocalInstanceProviderID`,
/// `GetZone`, `InstanceType` and `getLocalInstanceNodeAddresses`):
/// - providerID `azure://` + the resource ID with subscription and resource group in lower
///   case;
/// - zone `<location>-<zone>` or the fault domain; region the lower-case location;
/// - addresses: Hostname, then the first NIC's first IPv4 private (InternalIP) and public
///   (ExternalIP), then its first IPv6 ones; no address at all is an error;
/// - `topology.kubernetes.azure.com/sub-fault-domain` when IMDS reports one.
pub fn local_metadata(meta: &Imds, node_name: &str) -> Result<InstanceMetadata, ProviderError> {
    let compute = meta
        .compute
        .as_ref()
        .ok_or_else(|| ProviderError::other("instance metadata has no compute section"))?;
    if compute.resource_id.is_empty() {
        return Err(ProviderError::other("instance metadata has an empty resourceId"));
    }
    let mut provider_id = compute.resource_id.clone();
    for part in [&compute.subscription_id, &compute.resource_group_name] {
        if !part.is_empty() {
            provider_id = provider_id.replace(part.as_str(), &part.to_ascii_lowercase());
        }
    }
    let location = compute.location.to_ascii_lowercase();
    let zone = if compute.zone.is_empty() {
        compute.platform_fault_domain.clone()
    } else {
        let n: i64 = compute.zone.parse().map_err(|_| {
            ProviderError::other(format!(
                "instance metadata zone {:?} is not a number",
                compute.zone
            ))
        })?;
        format!("{location}-{n}")
    };
    let mut addresses = vec![address("Hostname", node_name)];
    if let Some(nic) = meta.network.as_ref().and_then(|n| n.interface.first()) {
        for data in [&nic.ipv4, &nic.ipv6] {
            if let Some(first) =
                data.ip_address.first().filter(|a| !a.private_ip_address.is_empty())
            {
                addresses.push(address("InternalIP", &first.private_ip_address));
                if !first.public_ip_address.is_empty() {
                    addresses.push(address("ExternalIP", &first.public_ip_address));
                }
            }
        }
    }
    if addresses.len() == 1 {
        return Err(ProviderError::other("instance metadata reports no IP address"));
    }
    let mut additional_labels = std::collections::BTreeMap::new();
    if !compute.platform_sub_fault_domain.is_empty() {
        additional_labels
            .insert(LABEL_SUB_FAULT_DOMAIN.to_string(), compute.platform_sub_fault_domain.clone());
    }
    if let Some(group) = compute
        .tags_list
        .iter()
        .find(|t| t.name == TAG_INTERCONNECT_GROUP)
        .map(|t| t.value.as_str())
        .filter(|v| !v.is_empty())
    {
        additional_labels.insert(LABEL_INTERCONNECT_GROUP.to_string(), group.to_string());
    }
    Ok(InstanceMetadata {
        provider_id: format!("azure://{provider_id}"),
        instance_type: compute.vm_size.clone(),
        node_addresses: addresses,
        zone,
        region: location,
        additional_labels,
    })
}

fn address(type_: &str, value: &str) -> NodeAddress {
    NodeAddress { type_: type_.into(), address: value.into() }
}

/// How the node manager runs.
#[derive(Debug, Clone)]
pub struct Options {
    /// The Node it manages (`--node-name`).
    pub node_name: String,
    /// `--wait-routes`: mark a new Node `NetworkUnavailable` until the route controller
    /// creates its route.
    pub wait_routes: bool,
    /// `--node-status-update-frequency`: how often addresses are refreshed.
    pub status_update_frequency: Duration,
    /// `--enable-deprecated-beta-topology-labels`: also write the beta twins of the
    /// instance-type, zone and region labels.
    pub beta_topology_labels: bool,
    /// First retry delay after a failed initialisation (doubling up to `retry_max`).
    pub retry_base: Duration,
    /// Longest retry delay.
    pub retry_max: Duration,
}

impl Options {
    /// Upstream's defaults for `node_name`.
    pub fn new(node_name: impl Into<String>) -> Self {
        Options {
            node_name: node_name.into(),
            wait_routes: false,
            status_update_frequency: DEFAULT_STATUS_UPDATE_FREQUENCY,
            beta_topology_labels: false,
            retry_base: Duration::from_millis(500),
            retry_max: Duration::from_secs(60),
        }
    }
}

/// Why a sync of the Node failed (it is retried).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The cloud could not say what the Node is.
    #[error("node {node}: instance metadata: {source}")]
    Metadata {
        /// The node.
        node: String,
        /// Why.
        source: ProviderError,
    },
    /// The `alpha.kubernetes.io/provided-node-ip` annotation matches no cloud address.
    #[error("node {node}: provided node IP is not valid: {message}")]
    ProvidedNodeIp {
        /// The node.
        node: String,
        /// Why.
        message: String,
    },
    /// An API call failed.
    #[error("node {node}: {what}: {source}")]
    Kube {
        /// The node.
        node: String,
        /// What was being done.
        what: &'static str,
        /// The API error.
        source: kube::Error,
    },
}

struct Manager {
    nodes: Api<Node>,
    instances: Arc<dyn InstancesV2>,
    opts: Options,
}

/// Runs until `shutdown` completes (or the watch ends): initialises the Node when it carries
/// the uninitialized taint, refreshes its addresses every
/// [`Options::status_update_frequency`].
pub async fn run(
    client: kube::Client,
    instances: Arc<dyn InstancesV2>,
    opts: Options,
    shutdown: impl Future<Output = ()>,
) {
    let nodes: Api<Node> = Api::all(client);
    let selector = format!("metadata.name={}", opts.node_name);
    let mut events = watcher(nodes.clone(), watcher::Config::default().fields(&selector))
        .default_backoff()
        .applied_objects()
        .boxed();
    let manager = Manager { nodes, instances, opts };
    let period = manager.opts.status_update_frequency.max(Duration::from_millis(1));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    let mut failures: u32 = 0;
    let retry = tokio::time::sleep(Duration::ZERO);
    tokio::pin!(retry);
    let mut retry_armed = false;
    tokio::pin!(shutdown);
    tracing::info!(node = %manager.opts.node_name, "cloud-node-manager started");
    loop {
        let node = tokio::select! {
            _ = &mut shutdown => break,
            ev = events.next() => match ev {
                Some(Ok(node)) => Some(node),
                Some(Err(e)) => {
                    tracing::warn!(error = %e, "watching the node");
                    None
                }
                None => break,
            },
            _ = tick.tick() => manager.get().await,
            _ = &mut retry, if retry_armed => {
                retry_armed = false;
                manager.get().await
            }
        };
        let Some(node) = node else { continue };
        match manager.sync(&node).await {
            Ok(()) => failures = 0,
            Err(e) => {
                failures = failures.saturating_add(1);
                let delay = manager
                    .opts
                    .retry_base
                    .saturating_mul(2u32.saturating_pow(failures.min(16) - 1))
                    .min(manager.opts.retry_max);
                tracing::warn!(error = %e, retry_in = ?delay, "error syncing node");
                retry.as_mut().reset(tokio::time::Instant::now() + delay);
                retry_armed = true;
            }
        }
    }
    tracing::info!(node = %manager.opts.node_name, "cloud-node-manager stopped");
}

impl Manager {
    async fn get(&self) -> Option<Node> {
        match self.nodes.get_opt(&self.opts.node_name).await {
            Ok(n) => n,
            Err(e) => {
                tracing::warn!(error = %e, "reading the node");
                None
            }
        }
    }

    fn kube(&self, what: &'static str) -> impl FnOnce(kube::Error) -> Error + '_ {
        move |source| Error::Kube { node: self.opts.node_name.clone(), what, source }
    }

    async fn sync(&self, node: &Node) -> Result<(), Error> {
        if node.metadata.deletion_timestamp.is_some() {
            return Ok(());
        }
        if node_util::has_taint(node, names::TAINT_UNINITIALIZED) {
            return self.initialize(node).await;
        }
        // Initialised: addresses as the cloud has them now, GA labels from beta twins.
        let missing = node_util::missing_ga_labels(node.labels());
        if !missing.is_empty() {
            let patch = serde_json::json!({"metadata": {"labels": missing}});
            self.nodes
                .patch(&self.opts.node_name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(self.kube("patching labels"))?;
        }
        let meta = self.metadata(node).await?;
        if let Some(addrs) = node_util::updated_addresses(node, &meta.node_addresses) {
            self.patch_addresses(addrs).await?;
        }
        Ok(())
    }

    async fn metadata(&self, node: &Node) -> Result<InstanceMetadata, Error> {
        self.instances
            .instance_metadata(node)
            .await
            .map_err(|source| Error::Metadata { node: self.opts.node_name.clone(), source })
    }

    async fn patch_addresses(&self, addrs: Vec<NodeAddress>) -> Result<Node, Error> {
        let patch = serde_json::json!({"status": {"addresses": addrs}});
        self.nodes
            .patch_status(&self.opts.node_name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(self.kube("patching addresses"))
    }

    async fn initialize(&self, node: &Node) -> Result<(), Error> {
        let name = &self.opts.node_name;
        tracing::info!(node = %name, "initializing node with instance metadata");
        if self.opts.wait_routes {
            self.network_unavailable(node).await?;
        }
        let meta = self.metadata(node).await?;
        if node_util::provider_id(node).is_empty() && meta.provider_id.is_empty() {
            return Err(Error::Metadata {
                node: name.clone(),
                source: ProviderError::other("no providerID"),
            });
        }
        if let Some(ann) = node.annotations().get(names::ANNOTATION_PROVIDED_NODE_IP)
            && let Err(message) = node_util::addresses_for_provided_ip(ann, &meta.node_addresses)
        {
            return Err(Error::ProvidedNodeIp { node: name.clone(), message });
        }
        let mut updated = node.clone();
        if let Some(addrs) = node_util::updated_addresses(node, &meta.node_addresses) {
            updated = self.patch_addresses(addrs).await?;
        }
        let before = updated.labels().clone();
        let mut labels = node_util::labels_with_metadata(&before, &meta);
        if !self.opts.beta_topology_labels {
            for beta in
                [names::LABEL_INSTANCE_TYPE_BETA, names::LABEL_ZONE_BETA, names::LABEL_REGION_BETA]
            {
                if !before.contains_key(beta) {
                    labels.remove(beta);
                }
            }
        }
        updated.metadata.labels = Some(labels);
        let spec = updated.spec.get_or_insert_with(Default::default);
        if spec.provider_id.as_deref().unwrap_or_default().is_empty() {
            spec.provider_id = Some(meta.provider_id.clone());
        }
        if let Some(taints) = spec.taints.as_mut() {
            taints.retain(|t| t.key != names::TAINT_UNINITIALIZED);
        }
        updated.status = None;
        self.nodes
            .replace(name, &PostParams::default(), &updated)
            .await
            .map_err(self.kube("updating the node"))?;
        tracing::info!(node = %name, provider_id = %meta.provider_id, "node initialized");
        Ok(())
    }

    /// `--wait-routes`: `NetworkUnavailable=True` (`NoRouteCreated`) until the route
    /// controller reports the route (upstream `updateNetworkingCondition(node, false)`).
    async fn network_unavailable(&self, node: &Node) -> Result<(), Error> {
        let already = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .into_iter()
            .flatten()
            .any(|c| c.type_ == names::CONDITION_NETWORK_UNAVAILABLE && c.status == "True");
        if already {
            return Ok(());
        }
        let now = jiff::Timestamp::now().to_string();
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": names::CONDITION_NETWORK_UNAVAILABLE, "status": "True",
            "reason": "NoRouteCreated", "message": "Node created without a route",
            "lastTransitionTime": now, "lastHeartbeatTime": now,
        }]}});
        self.nodes
            .patch_status(&self.opts.node_name, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .map_err(self.kube("setting NetworkUnavailable"))?;
        Ok(())
    }
}

// ---------------------------------------------------------------------------------------------
// The binary.

/// Flags of upstream's `cloud-node-manager` that change nothing here: accepted (with a log
/// line) so that upstream manifests work unchanged. Prefixes end in `-`.
const IGNORED_FLAGS: &[&str] = &[
    "--kube-api-qps",
    "--kube-api-burst",
    "--kube-api-content-type",
    "--min-resync-period",
    "--windows-service",
    "--bind-address",
    "--secure-port",
    "--cert-dir",
    "--permit-port-sharing",
    "--permit-address-sharing",
    "--http2-max-streams-per-connection",
    "--client-ca-file",
    "--logtostderr",
    "--alsologtostderr",
    "--log-dir",
    "--log-file",
    "--add-dir-header",
    "--skip-headers",
    // component-base's logging flags other than --logging-format and -v (the manager accepts
    // them as no-ops too: lines are written unbuffered to stderr).
    "--log-flush-frequency",
    "--vmodule",
    "--log-json-",
    "--log-text-",
    "--tls-",
    "--authentication-",
    "--authorization-",
    "--requestheader-",
];

/// The command line (upstream's flags).
#[derive(Debug, Clone, PartialEq)]
pub struct Flags {
    /// `--node-name` (default: the host name, lower case).
    pub node_name: Option<String>,
    /// `--kubeconfig` (default: in-cluster).
    pub kubeconfig: Option<String>,
    /// `--master`: overrides the kubeconfig's server.
    pub master: Option<String>,
    /// `--wait-routes`.
    pub wait_routes: bool,
    /// `--use-instance-metadata` (default true).
    pub use_instance_metadata: bool,
    /// `--cloud-config` (with `--use-instance-metadata=false`).
    pub cloud_config: Option<String>,
    /// `--node-status-update-frequency`.
    pub status_update_frequency: Duration,
    /// `--enable-deprecated-beta-topology-labels`.
    pub beta_topology_labels: bool,
    /// `--v`.
    pub verbosity: u8,
    /// `--logging-format`: `text` (klog's) or `json` (component-base's).
    pub log_format: LogFormat,
    /// `--help`.
    pub help: bool,
    /// Flags accepted and ignored, as given.
    pub ignored: Vec<String>,
}

impl Default for Flags {
    fn default() -> Self {
        Flags {
            node_name: None,
            kubeconfig: None,
            master: None,
            wait_routes: false,
            use_instance_metadata: true,
            cloud_config: None,
            status_update_frequency: DEFAULT_STATUS_UPDATE_FREQUENCY,
            beta_topology_labels: false,
            verbosity: 2,
            log_format: LogFormat::Text,
            help: false,
            ignored: Vec::new(),
        }
    }
}

const USAGE: &str = "\
cloud-node-manager-azure: initialises this machine's Node from the Azure instance metadata service.

Flags:
  --node-name string                         the Node (default: the host name)
  --kubeconfig string                        kubeconfig (default: in-cluster)
  --master string                            the API server (overrides the kubeconfig)
  --wait-routes                              mark new Nodes NetworkUnavailable until their route exists
  --use-instance-metadata                    use IMDS (default true); false: ARM with --cloud-config
  --cloud-config string                      azure.json, for --use-instance-metadata=false
  --node-status-update-frequency duration    address refresh period (default 5m0s)
  --enable-deprecated-beta-topology-labels   also write the beta topology labels
  --v int                                    log verbosity (as the manager's -v)
  --logging-format string                    text (klog's format, default) or json (component-base's)
Upstream's serving, authentication, authorization, client-tuning and other logging flags are
accepted and ignored.
";

fn parse_bool(flag: &str, v: &str) -> Result<bool, String> {
    match v {
        "true" | "1" | "t" | "T" | "TRUE" | "True" => Ok(true),
        "false" | "0" | "f" | "F" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("invalid value {v:?} for {flag}: want true or false")),
    }
}

impl Flags {
    /// Parses the arguments (without the program name).
    pub fn parse<I: IntoIterator<Item = String>>(args: I) -> Result<Flags, String> {
        let mut f = Flags::default();
        let mut args = args.into_iter().peekable();
        while let Some(arg) = args.next() {
            if arg == "-h" || arg == "--help" {
                f.help = true;
                continue;
            }
            if !arg.starts_with('-') {
                return Err(format!("unexpected argument {arg:?}"));
            }
            let dashed = if arg.starts_with("--") { arg.clone() } else { format!("-{arg}") };
            let (flag, inline) = match dashed.split_once('=') {
                Some((k, v)) => (k.to_string(), Some(v.to_string())),
                None => (dashed.clone(), None),
            };
            let value = |args: &mut std::iter::Peekable<I::IntoIter>| -> Result<String, String> {
                match &inline {
                    Some(v) => Ok(v.clone()),
                    None => args.next().ok_or_else(|| format!("flag needs an argument: {flag}")),
                }
            };
            match flag.as_str() {
                "--node-name" => f.node_name = Some(value(&mut args)?).filter(|v| !v.is_empty()),
                "--kubeconfig" => f.kubeconfig = Some(value(&mut args)?).filter(|v| !v.is_empty()),
                "--master" => f.master = Some(value(&mut args)?).filter(|v| !v.is_empty()),
                "--cloud-config" => {
                    f.cloud_config = Some(value(&mut args)?).filter(|v| !v.is_empty())
                }
                "--wait-routes" => {
                    f.wait_routes = inline.as_deref().map_or(Ok(true), |v| parse_bool(&flag, v))?
                }
                "--use-instance-metadata" => {
                    f.use_instance_metadata =
                        inline.as_deref().map_or(Ok(true), |v| parse_bool(&flag, v))?
                }
                "--enable-deprecated-beta-topology-labels" => {
                    f.beta_topology_labels =
                        inline.as_deref().map_or(Ok(true), |v| parse_bool(&flag, v))?
                }
                "--node-status-update-frequency" => {
                    let v = value(&mut args)?;
                    f.status_update_frequency = ccm_core::manager::duration::parse(&v)
                        .map_err(|e| format!("invalid value {v:?} for {flag}: {e}"))?;
                    // A zero period would panic `tokio::time::interval` (and spin).
                    if f.status_update_frequency.is_zero() {
                        return Err(format!("invalid value {v:?} for {flag}: must be positive"));
                    }
                }
                "--logging-format" => {
                    let v = value(&mut args)?;
                    f.log_format = match v.as_str() {
                        "text" => LogFormat::Text,
                        "json" => LogFormat::Json,
                        other => {
                            return Err(format!(
                                "--logging-format: unsupported log format {other:?}; permitted formats: \"json\", \"text\""
                            ));
                        }
                    };
                }
                "--v" | "-v" => {
                    let v = value(&mut args)?;
                    f.verbosity = v
                        .parse()
                        .map_err(|_| format!("invalid value {v:?} for {flag}: want a number"))?;
                }
                other => {
                    let known = IGNORED_FLAGS
                        .iter()
                        .any(|k| if k.ends_with('-') { other.starts_with(k) } else { other == *k });
                    if !known {
                        return Err(format!("unknown flag: {other}"));
                    }
                    // A value that is not itself a flag belongs to it.
                    if inline.is_none() && args.peek().is_some_and(|n| !n.starts_with('-')) {
                        args.next();
                    }
                    f.ignored.push(other.to_string());
                }
            }
        }
        if !f.use_instance_metadata && f.cloud_config.is_none() {
            return Err(
                "--use-instance-metadata=false needs --cloud-config (ARM credentials)".into()
            );
        }
        Ok(f)
    }
}

fn host_name() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|h| h.trim().to_ascii_lowercase())
        .filter(|h| !h.is_empty())
}

async fn kube_client(flags: &Flags) -> Result<kube::Client, String> {
    let mut config = match &flags.kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path)
                .map_err(|e| format!("--kubeconfig {path}: {e}"))?;
            kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
                .await
                .map_err(|e| format!("--kubeconfig {path}: {e}"))?
        }
        None => kube::Config::infer()
            .await
            .map_err(|e| format!("no kubeconfig and not in a cluster: {e}"))?,
    };
    if let Some(master) = &flags.master {
        config.cluster_url = master.parse().map_err(|e| format!("--master {master:?}: {e}"))?;
    }
    kube::Client::try_from(config).map_err(|e| format!("Kubernetes client: {e}"))
}

fn instances(flags: &Flags, node_name: &str) -> Result<Arc<dyn InstancesV2>, String> {
    let options = crate::client::ClientOptions::from_env().map_err(|e| e.to_string())?;
    if flags.use_instance_metadata {
        let http =
            crate::client::http_client(options.ca_pem.as_deref()).map_err(|e| e.to_string())?;
        let endpoint = options
            .imds_endpoint
            .clone()
            .unwrap_or_else(|| crate::client::DEFAULT_IMDS_ENDPOINT.into());
        return Ok(Arc::new(ImdsInstances::new(ImdsClient::new(http, endpoint), node_name)));
    }
    let path = flags.cloud_config.as_deref().unwrap_or_default();
    let bytes = std::fs::read(path).map_err(|e| format!("--cloud-config {path}: {e}"))?;
    let config = crate::config::Config::from_bytes(&bytes).map_err(|e| e.to_string())?;
    config.validate().map_err(|e| e.to_string())?;
    let client = crate::client::ArmClient::new(&config, options).map_err(|e| e.to_string())?;
    Ok(Arc::new(crate::instances::AzureInstances::new(Arc::new(client), Arc::new(config))))
}

async fn terminated() {
    #[cfg(unix)]
    {
        if let Ok(mut term) =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}

/// `cloud-node-manager-azure`'s `main`.
pub fn main() -> ExitCode {
    main_with(std::env::args().skip(1))
}

/// [`main`] with the arguments (without the program name).
pub fn main_with<I: IntoIterator<Item = String>>(args: I) -> ExitCode {
    let flags = match Flags::parse(args) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cloud-node-manager-azure: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if flags.help {
        print!("{USAGE}");
        return ExitCode::SUCCESS;
    }
    ccm_core::manager::logging::init(flags.log_format, flags.verbosity);
    for flag in &flags.ignored {
        tracing::info!(flag = %flag, "flag accepted for compatibility with upstream and ignored");
    }
    // From here on every message is a log line in the chosen format (one JSON object a line
    // with --logging-format=json), so a log pipeline sees why the process ended.
    let Some(node_name) = flags.node_name.clone().or_else(host_name) else {
        tracing::error!("cloud-node-manager-azure: no --node-name and no host name");
        return ExitCode::from(2);
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            tracing::error!(error = %e, "cloud-node-manager-azure: starting the runtime");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let setup = async {
            let client = kube_client(&flags).await?;
            let instances = instances(&flags, &node_name)?;
            Ok::<_, String>((client, instances))
        };
        let (client, instances) = match setup.await {
            Ok(x) => x,
            Err(e) => {
                tracing::error!(error = %e, "cloud-node-manager-azure: cannot start");
                return ExitCode::FAILURE;
            }
        };
        let opts = Options {
            wait_routes: flags.wait_routes,
            status_update_frequency: flags.status_update_frequency,
            beta_topology_labels: flags.beta_topology_labels,
            ..Options::new(node_name)
        };
        run(client, instances, opts, terminated()).await;
        ExitCode::SUCCESS
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::imds::{Compute, Interface, IpAddress, Network, NetworkData, Tag};

    fn args(a: &[&str]) -> Result<Flags, String> {
        Flags::parse(a.iter().map(|s| s.to_string()))
    }

    #[test]
    fn upstream_manifests_flags_parse_and_unknown_ones_are_refused() {
        let f = args(&[
            "--node-name=node-1",
            "--wait-routes=true",
            "--v",
            "4",
            "--kube-api-qps",
            "50",
            "--secure-port=0",
        ])
        .unwrap();
        assert_eq!(f.node_name.as_deref(), Some("node-1"));
        assert!(f.wait_routes && f.use_instance_metadata);
        assert_eq!(f.verbosity, 4);
        assert_eq!(f.ignored, ["--kube-api-qps", "--secure-port"]);
        let f = args(&[
            "--node-status-update-frequency=30s",
            "--enable-deprecated-beta-topology-labels",
            "--wait-routes",
        ])
        .unwrap();
        assert_eq!(f.status_update_frequency, Duration::from_secs(30));
        assert!(f.beta_topology_labels && f.wait_routes);
        assert!(args(&["--no-such-flag"]).unwrap_err().contains("--no-such-flag"));
        assert!(args(&["--wait-routes=maybe"]).unwrap_err().contains("--wait-routes"));
        assert!(args(&["--use-instance-metadata=false"]).unwrap_err().contains("--cloud-config"));
        assert!(args(&["--node-name"]).unwrap_err().contains("needs an argument"));
        assert_eq!(args(&["--logging-format=json"]).unwrap().log_format, LogFormat::Json);
        assert_eq!(args(&["--logging-format", "text"]).unwrap().log_format, LogFormat::Text);
        assert_eq!(args(&[]).unwrap().log_format, LogFormat::Text);
        let f = args(&[
            "--logging-format=json",
            "--log-flush-frequency=5s",
            "--log-json-split-stream",
            "--vmodule",
            "x=2",
            "--v=3",
        ])
        .unwrap();
        assert_eq!((f.log_format, f.verbosity), (LogFormat::Json, 3));
        assert_eq!(f.ignored, ["--log-flush-frequency", "--log-json-split-stream", "--vmodule"]);
        let e = args(&["--logging-format=xml"]).unwrap_err();
        assert!(e.contains("--logging-format") && e.contains("\"xml\""), "{e}");
        for zero in ["0", "0s", "0.1ns"] {
            let e = args(&[&format!("--node-status-update-frequency={zero}")]).unwrap_err();
            assert!(e.contains("must be positive"), "{zero}: {e}");
        }
    }

    /// Set in the child process of the logging test: the arguments, one per line.
    const CHILD: &str = "CCM_NODE_MANAGER_TEST_CHILD";

    /// The child's body (a no-op in an ordinary run): `main` with the given arguments.
    #[test]
    fn main_child() {
        let Ok(argv) = std::env::var(CHILD) else { return };
        let code = main_with(argv.lines().map(str::to_string));
        assert_eq!(code, ExitCode::FAILURE);
    }

    /// Runs `main` in a child process (the log subscriber is once per process): its stderr.
    fn run_main(argv: &[&str]) -> String {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "node_manager::tests::main_child", "--nocapture"])
            .env(CHILD, argv.join("\n"))
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        String::from_utf8(out.stderr).unwrap()
    }

    /// `--logging-format` and `-v` as the manager's: a start that fails (no kubeconfig) is one
    /// component-base JSON line with `err`, or one klog line, and nothing else on stderr.
    #[test]
    fn the_node_manager_logs_in_the_format_and_verbosity_it_is_given() {
        let kubeconfig = "--kubeconfig=/nonexistent/ccm-test/kubeconfig";
        let log = run_main(&["--node-name=vm-a", "--logging-format=json", "-v=0", kubeconfig]);
        let lines: Vec<&str> = log.lines().collect();
        assert_eq!(lines.len(), 1, "{log}");
        let line: serde_json::Value = serde_json::from_str(lines[0]).unwrap();
        assert!(line["ts"].is_f64() && line["caller"].is_string(), "{log}");
        assert_eq!(line["msg"], "cloud-node-manager-azure: cannot start", "{log}");
        assert!(
            line["err"].as_str().unwrap().contains("/nonexistent/ccm-test/kubeconfig"),
            "{log}"
        );
        assert!(line.get("v").is_none(), "an error line has no v: {log}");

        let log = run_main(&["--node-name=vm-a", "--v", "0", kubeconfig]);
        assert!(log.starts_with('E'), "{log}");
        assert!(
            log.contains("node_manager.rs:")
                && log.contains("] \"cloud-node-manager-azure: cannot start\" err=\"--kubeconfig /nonexistent/ccm-test/kubeconfig"),
            "{log}"
        );
    }

    #[test]
    fn imds_metadata_becomes_upstreams_node_metadata() {
        let meta = Imds {
            compute: Some(Compute {
                name: "pool_3".into(),
                location: "EastUS".into(),
                zone: "2".into(),
                vm_size: "Standard_D2s_v3".into(),
                platform_fault_domain: "0".into(),
                platform_sub_fault_domain: "4".into(),
                resource_group_name: "MyRG".into(),
                vm_scale_set_name: "pool".into(),
                subscription_id: "SUB".into(),
                resource_id: "/subscriptions/SUB/resourceGroups/MyRG/providers/Microsoft.Compute/virtualMachineScaleSets/pool/virtualMachines/3".into(),
                tags_list: vec![
                    Tag { name: "team".into(), value: "a".into() },
                    Tag { name: TAG_INTERCONNECT_GROUP.into(), value: "ig-7".into() },
                ],
            }),
            network: Some(Network {
                interface: vec![Interface {
                    ipv4: NetworkData { ip_address: vec![IpAddress { private_ip_address: "10.0.0.4".into(), public_ip_address: "20.0.0.4".into() }] },
                    ipv6: NetworkData { ip_address: vec![IpAddress { private_ip_address: "fd00::4".into(), public_ip_address: String::new() }] },
                    mac_address: String::new(),
                }],
            }),
        };
        let m = local_metadata(&meta, "pool000003").unwrap();
        assert_eq!(
            m.provider_id,
            "azure:///subscriptions/sub/resourceGroups/myrg/providers/Microsoft.Compute/virtualMachineScaleSets/pool/virtualMachines/3"
        );
        assert_eq!(
            (m.zone.as_str(), m.region.as_str(), m.instance_type.as_str()),
            ("eastus-2", "eastus", "Standard_D2s_v3")
        );
        let a: Vec<_> =
            m.node_addresses.iter().map(|a| (a.type_.as_str(), a.address.as_str())).collect();
        assert_eq!(
            a,
            [
                ("Hostname", "pool000003"),
                ("InternalIP", "10.0.0.4"),
                ("ExternalIP", "20.0.0.4"),
                ("InternalIP", "fd00::4")
            ]
        );
        assert_eq!(m.additional_labels.get(LABEL_SUB_FAULT_DOMAIN).map(String::as_str), Some("4"));
        assert_eq!(
            m.additional_labels.get(LABEL_INTERCONNECT_GROUP).map(String::as_str),
            Some("ig-7"),
            "upstream's interconnect-group label from the IMDS tag"
        );
        let mut empty_group = meta.clone();
        if let Some(c) = empty_group.compute.as_mut() {
            c.tags_list[1].value.clear();
        }
        let m = local_metadata(&empty_group, "pool000003").unwrap();
        assert!(!m.additional_labels.contains_key(LABEL_INTERCONNECT_GROUP));

        let mut no_zone = meta.clone();
        if let Some(c) = no_zone.compute.as_mut() {
            c.zone.clear();
            c.platform_fault_domain = "1".into();
        }
        assert_eq!(local_metadata(&no_zone, "n").unwrap().zone, "1");
        let mut no_ips = meta;
        no_ips.network = None;
        assert!(local_metadata(&no_ips, "n").is_err());
    }
}
