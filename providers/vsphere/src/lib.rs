//! The `vsphere` cloud provider: nodes backed by vSphere VMs, across one or more vCenters.
//!
//! ```text
//! VsphereProvider ── instances_v2() ──▶ Instances ──▶ VCenterConn ×N ─┬─ Vim25Client  (SOAP /sdk)
//!                                                                     └─ TaggingClient (REST /rest)
//! ```
//!
//! Modules: [`config`] (YAML/INI cloud config, credentials), [`credentials`] (the
//! credentials Secret, read at [`CloudProvider::initialize`] through the handed client),
//! [`client`] (vim25 SOAP and CIS tagging REST on reqwest), [`instances`] (`InstancesV2`). Zones come with the instance
//! metadata. LoadBalancer and Routes are not supported (upstream offers them only with
//! NSX-T); the provider says so once when it is built.
//!
//! Sessions: when the manager shuts down ([`ProviderInit::shutdown`]) every vCenter session
//! is logged out (`SessionManager.Logout` and the tagging session), best effort within
//! [`LOGOUT_DEADLINE`]; see [`VsphereProvider::logout`].

pub mod client;
pub mod config;
pub mod credentials;
pub mod instances;

/// Parse entry points for `fuzz/` (issue #21) that are private in the client: never in
/// shipped binaries (feature `fuzzing`).
#[cfg(feature = "fuzzing")]
pub mod fuzzing {
    /// Parses a SOAP response and reads its `<Fault>` as the client does: the fault kind and
    /// message, `None` without a fault, an error for a document that is not XML.
    pub fn soap_fault(doc: &str) -> Result<Option<crate::client::SoapFault>, String> {
        let root = crate::client::xml::parse(doc)?;
        let fault = root.child("Body").and_then(|b| b.child("Fault"));
        Ok(fault.map(crate::client::vim25::parse_fault))
    }
}

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::cloud::{
    BoxError, CloudProvider, InstanceMetadata, InstanceStatus, InstancesV2, ProviderError,
    ProviderInit,
};
use ccm_core::manager::extensions::{Extensions, ProviderFlags, accepted_only, flag};
use k8s_openapi::api::core::v1::Node;

use crate::client::ClientError;
use crate::config::{Config, ConfigError, CredentialSources};
use crate::credentials::{Connections, Loader};
use crate::instances::Instances;

/// The provider name, as given to `--cloud-provider`.
pub const PROVIDER_NAME: &str = "vsphere";

/// Per-request timeout for vCenter calls.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// How long logging out of every vCenter at shutdown may take in all.
pub const LOGOUT_DEADLINE: Duration = Duration::from_secs(5);

/// `--node-labels` (upstream `vsphere/options.AddFlags`).
const NODE_LABELS_FLAG: &str = "node-labels";

/// What vSphere adds to the manager, as upstream's `vsphere-cloud-controller-manager`
/// registers it: `--node-labels` (acted on: the labels are added to every Node's metadata),
/// and the flags of upstream's paravirtual (Supervisor cluster) mode, which this provider does
/// not implement: accepted, and warned about when set. The binary's factory is
/// [`VsphereProvider::from_command_line`] with a clone of [`Extensions::parsed`].
pub fn extensions() -> Extensions {
    let paravirtual = accepted_only;
    Extensions {
        flags: vec![
            flag::string_to_string(NODE_LABELS_FLAG)
                .help(
                    "Labels to add to every vSphere Node when it is initialised, as key=value \
                     pairs (each key a Kubernetes label key; an empty value is allowed).",
                )
                .help_heading("Cloud node controller flags"),
            paravirtual(flag::boolean("is-legacy-paravirtual", false).help(
                "Upstream paravirtual mode: capw.vmware.com machine labels. Paravirtual mode is \
                 not implemented here.",
            )),
            paravirtual(flag::boolean("enable-vpc-mode", false).help(
                "Upstream paravirtual mode: the routable pod controller in VPC mode. Not \
                 implemented here.",
            )),
            paravirtual(flag::value("pod-ip-pool-type", "Public|Private").help(
                "Upstream paravirtual VPC mode: the pod IP pool type. Not implemented here.",
            )),
            paravirtual(flag::boolean("enable-service-annotation-propagation", false).help(
                "Upstream paravirtual mode: copy Service annotations to the Supervisor cluster. \
                 Not implemented here.",
            )),
        ],
        ..Extensions::default()
    }
}

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

/// Why the provider could not be built from the command line.
#[derive(Debug, thiserror::Error)]
pub enum CommandLineError {
    /// The provider could not be built from its config.
    #[error(transparent)]
    Provider(#[from] Error),
    /// A `--node-labels` key is not a Kubernetes label key.
    #[error("invalid --node-labels key {key:?}: {message}")]
    NodeLabel {
        /// The key.
        key: String,
        /// What is wrong with it.
        message: String,
    },
}

/// The vSphere provider.
#[derive(Debug)]
pub struct VsphereProvider {
    config: Config,
    instances: Arc<Instances>,
    /// vCenters whose credentials come from a Secret read at [`CloudProvider::initialize`]
    /// (or are read again from it after a rejected login).
    loader: Option<Arc<Loader>>,
    /// Every connection made, for [`VsphereProvider::logout`].
    conns: Connections,
    /// `--node-labels`: added to every Node's metadata.
    node_labels: BTreeMap<String, String>,
}

impl VsphereProvider {
    /// Builds the provider from the cloud-config file's bytes and the other credential
    /// sources (Secret data the caller read, if any, and the `VSPHERE_*` environment;
    /// `SKIP_NODE_DELETION=true` there keeps Nodes whose VM is gone). No request is sent; a
    /// bad config or missing credentials fail here with a message naming the key. A
    /// vCenter whose credentials are only in the Secret named by `secretName`/
    /// `secretNamespace` (when `sources` holds no Secret data) is connected by
    /// [`CloudProvider::initialize`], which reads that Secret through the handed client.
    pub fn new(cloud_config: &[u8], sources: &CredentialSources) -> Result<Self, Error> {
        let config = Config::parse(cloud_config, &sources.env)?;
        Self::from_config(config, sources)
    }

    /// The manager's factory: builds the provider from the `--cloud-config` contents (if
    /// any) and this process's environment (`VSPHERE_*`, `SKIP_NODE_DELETION`). Credentials
    /// come from the config, `secretsDirectory` (the Secret mounted as a volume), the
    /// environment, or the Secret named by `secretName`/`secretNamespace`, read at
    /// [`CloudProvider::initialize`].
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
        let mut vcenters = Vec::new();
        let mut pending = Vec::new();
        let mut gates = Vec::new();
        for vc in &config.vcenters {
            match credentials::connect(&config, vc, sources, REQUEST_TIMEOUT) {
                Ok((conn, gate)) => {
                    vcenters.push(conn);
                    if vc.secret.is_some() {
                        gates.push((vc.clone(), gate));
                    }
                }
                Err(Error::Config(ConfigError::MissingCredentials { .. }))
                    if vc.secret.is_some() && sources.secret_data.is_empty() =>
                {
                    pending.push(vc.clone());
                }
                Err(e) => return Err(e),
            }
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
        let conns: Connections = Arc::new(std::sync::Mutex::new(vcenters.clone()));
        let instances = Arc::new(
            Instances::new(vcenters, config.labels.clone(), config.nodes.clone())
                .with_skip_node_deletion(skip_node_deletion),
        );
        let loader = (!pending.is_empty() || !gates.is_empty()).then(|| {
            Arc::new(Loader::new(
                config.clone(),
                sources.env.clone(),
                REQUEST_TIMEOUT,
                pending,
                instances.clone(),
                gates,
                conns.clone(),
            ))
        });
        Ok(VsphereProvider { config, instances, loader, conns, node_labels: BTreeMap::new() })
    }

    /// The manager's factory: [`Self::from_cloud_config`] with the provider's own flags from
    /// the parsed command line (`--node-labels`, each key checked as upstream does).
    pub fn from_command_line(
        cloud_config: Option<&[u8]>,
        flags: &ProviderFlags,
    ) -> Result<Self, CommandLineError> {
        let labels = flags.string_map(NODE_LABELS_FLAG);
        for key in labels.keys() {
            if let Err(message) = check_label_key(key) {
                return Err(CommandLineError::NodeLabel { key: key.clone(), message });
            }
        }
        Ok(Self::from_cloud_config(cloud_config)?.with_node_labels(labels))
    }

    /// Adds `labels` to every Node's metadata (`--node-labels`; the instances' own labels win
    /// on a clash).
    pub fn with_node_labels(mut self, labels: BTreeMap<String, String>) -> Self {
        self.node_labels = labels;
        self
    }

    /// Logs out of every vCenter session this provider opened (`SessionManager.Logout` and
    /// the tagging session), concurrently, within `deadline` in all; best effort: failures
    /// are logged. Returns how many sessions were ended. Called at shutdown.
    pub async fn logout(&self, deadline: Duration) -> usize {
        logout_all(&self.conns, deadline).await
    }

    /// The parsed config (e.g. to find the credentials Secret).
    pub fn config(&self) -> &Config {
        &self.config
    }

    /// Whether a vCenter still waits for its credentials Secret (read after
    /// [`CloudProvider::initialize`]); its lookups fail until then.
    pub fn awaits_credentials(&self) -> bool {
        self.loader.as_ref().is_some_and(|l| l.is_pending())
    }
}

impl CloudProvider for VsphereProvider {
    fn name(&self) -> &str {
        PROVIDER_NAME
    }

    /// What reading the cloud config skipped (unknown sections and keys), for the manager's
    /// start-up `CloudConfigWarning` Events.
    fn config_warnings(&self) -> Vec<String> {
        self.config().config_warnings().to_vec()
    }

    fn instances_v2(&self) -> Option<Arc<dyn InstancesV2>> {
        if self.node_labels.is_empty() {
            return Some(self.instances.clone());
        }
        Some(Arc::new(WithNodeLabels {
            inner: self.instances.clone(),
            labels: self.node_labels.clone(),
        }))
    }

    /// Reads the credentials Secret(s) through the handed client and connects the vCenters
    /// waiting for them, in the background (retrying until done or the manager stops).
    /// Also logs out of every vCenter when `init.shutdown` fires.
    fn initialize(&self, init: ProviderInit) -> Result<(), BoxError> {
        let runtime = tokio::runtime::Handle::try_current()
            .map_err(|e| format!("vSphere: no async runtime to start the provider: {e}"))?;
        if let Some(loader) = &self.loader {
            runtime.spawn(loader.clone().run(init.client, init.shutdown.clone()));
        }
        let conns = self.conns.clone();
        runtime.spawn(async move {
            init.shutdown.cancelled().await;
            logout_all(&conns, LOGOUT_DEADLINE).await;
        });
        Ok(())
    }
}

/// See [`VsphereProvider::logout`].
async fn logout_all(conns: &Connections, deadline: Duration) -> usize {
    let conns = conns.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let each = conns.iter().map(|conn| async move {
        let (vim, tagging) = futures::join!(conn.vim.logout(), conn.tagging.logout());
        let mut ended = 0;
        for (what, result) in [("vim25", vim), ("tagging", tagging)] {
            match result {
                Ok(true) => ended += 1,
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(vcenter = %conn.name, session = what, error = %e, "vCenter logout failed")
                }
            }
        }
        ended
    });
    match tokio::time::timeout(deadline, futures::future::join_all(each)).await {
        Ok(ended) => {
            let ended = ended.into_iter().sum();
            tracing::info!(sessions = ended, "logged out of the vCenters");
            ended
        }
        Err(_) => {
            tracing::warn!(deadline = ?deadline, "vCenter logout did not finish in time; sessions will expire");
            0
        }
    }
}

/// `--node-labels` on top of the instances: every metadata answer carries the labels.
struct WithNodeLabels {
    inner: Arc<Instances>,
    labels: BTreeMap<String, String>,
}

impl WithNodeLabels {
    fn add(&self, mut meta: InstanceMetadata) -> InstanceMetadata {
        for (k, v) in &self.labels {
            meta.additional_labels.entry(k.clone()).or_insert_with(|| v.clone());
        }
        meta
    }
}

#[async_trait]
impl InstancesV2 for WithNodeLabels {
    async fn instance_exists(&self, node: &Node) -> Result<bool, ProviderError> {
        self.inner.instance_exists(node).await
    }

    async fn instance_shutdown(&self, node: &Node) -> Result<bool, ProviderError> {
        self.inner.instance_shutdown(node).await
    }

    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata, ProviderError> {
        self.inner.instance_metadata(node).await.map(|m| self.add(m))
    }

    async fn instance_metadata_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceMetadata, ProviderError>> {
        let all = self.inner.instance_metadata_batch(nodes).await;
        all.into_iter().map(|r| r.map(|m| self.add(m))).collect()
    }

    async fn instance_status_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceStatus, ProviderError>> {
        self.inner.instance_status_batch(nodes).await
    }

    fn max_batch(&self) -> usize {
        self.inner.max_batch()
    }
}

/// A Kubernetes label key (apimachinery's `IsQualifiedName`): an optional DNS-subdomain
/// prefix and `/`, then a name of at most 63 characters, alphanumeric at both ends with
/// `-`, `_` and `.` inside.
fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        if p.is_empty() || p.len() > 253 || !p.split('.').all(label_ok) {
            return Err("the prefix must be a DNS subdomain (lowercase alphanumerics, '-' and \
                        '.', at most 253 characters)"
                .into());
        }
    }
    let edge = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
    let ok = !name.is_empty()
        && name.len() <= 63
        && edge(name.chars().next())
        && edge(name.chars().last())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if !ok {
        return Err("the name must be at most 63 characters, alphanumeric at both ends, with \
                    '-', '_' and '.' inside"
            .into());
    }
    Ok(())
}

#[cfg(test)]
mod flag_tests {
    use super::*;

    #[test]
    fn node_labels_are_added_to_the_metadata_and_the_instance_s_own_labels_win() {
        let wrapped = WithNodeLabels {
            inner: Arc::new(Instances::new(Vec::new(), Default::default(), Default::default())),
            labels: [("team", "a"), ("zone-hint", "flag")]
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .into(),
        };
        let own = InstanceMetadata {
            additional_labels: [("zone-hint".to_string(), "instance".to_string())].into(),
            ..InstanceMetadata::default()
        };
        let got = wrapped.add(own).additional_labels;
        let want: BTreeMap<String, String> = [("team", "a"), ("zone-hint", "instance")]
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .into();
        assert_eq!(got, want);
    }

    #[test]
    fn node_label_keys_are_checked_as_kubernetes_label_keys() {
        for ok in ["a", "node.foo.bar", "foo.bar/mapi", "example.com/A_b-c.9"] {
            assert_eq!(check_label_key(ok), Ok(()), "{ok}");
        }
        for bad in ["", "-a", "a-", "/a", "Foo.com/a", "a/b/c", "x/", &"a".repeat(64)] {
            assert!(check_label_key(bad).is_err(), "{bad:?} accepted");
        }
    }
}
