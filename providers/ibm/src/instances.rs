//! InstancesV2: node metadata from the provisioner's labels or the VPC, the providerID
//! `ibm://<accountID>///<clusterID>/<workerID>`, and existence/shutdown from the VPC.
//!
//! **Metadata** (as upstream): a Node carrying all of `ibm-cloud.kubernetes.io/internal-ip`,
//! `worker-id`, `machine-type`, `zone` and `region` (and optionally `external-ip`) is
//! answered from its labels without a cloud call. Otherwise the VPC instance named like the
//! Node in `g2VpcName` gives the primary IP, instance ID (worker ID), profile and zone; the
//! region is the config's. A batch makes **one** `ListInstances` call for all the nodes that
//! need it. `ExternalIP` falls back to the internal IP (upstream: consumers expect one).
//!
//! **Existence** (upstream always answers "exists, running"; we do better where the VPC
//! instance is known, and never worse than upstream's safety): one `ListInstances` of the VPC
//! per pass. A node whose worker ID (from its `ibm://` providerID, else its `worker-id`
//! label) or name matches a listed instance gets that instance's state (`stopped` →
//! shut down). A node matching nothing is **gone only** when its worker ID is a VPC instance
//! ID (seen in a VPC listing by this process, or of the VPC's `<zone code>_<uuid>` form) and
//! `GetInstance` for that exact ID answers IBM's typed not-found: a 404 whose JSON error body
//! (`{"errors":[{"code":"not_found"}]}`, or `<resource>_not_found`) comes from the endpoint
//! that just listed the VPC's instances. A 404 with an HTML page (a proxy's or gateway's, even
//! one echoing the instance ID), a JSON body without that code, or no body is an error, and
//! the Node is kept. Otherwise (an IKS worker ID that is not a VPC
//! instance, no worker ID at all) it keeps upstream's answer: exists, running. Any failed or
//! uncertain call is an error (the node is kept), and a providerID of another cloud,
//! account or cluster is an error.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ccm_core::cloud::{InstanceMetadata, InstanceStatus, InstancesV2, ProviderError};
use ccm_core::listing::{Fetched, Listings, Wanted};
use ccm_core::names;
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::client::IbmClient;
use crate::config::Config;
use crate::model::Instance;

/// The provisioner's node labels.
pub mod labels {
    /// Internal (private) IP.
    pub const INTERNAL_IP: &str = "ibm-cloud.kubernetes.io/internal-ip";
    /// External (public) IP, absent on private-only workers.
    pub const EXTERNAL_IP: &str = "ibm-cloud.kubernetes.io/external-ip";
    /// Zone.
    pub const ZONE: &str = "ibm-cloud.kubernetes.io/zone";
    /// Region.
    pub const REGION: &str = "ibm-cloud.kubernetes.io/region";
    /// Worker ID.
    pub const WORKER_ID: &str = "ibm-cloud.kubernetes.io/worker-id";
    /// Machine type (instance type).
    pub const MACHINE_TYPE: &str = "ibm-cloud.kubernetes.io/machine-type";
}

/// What we know about the instance behind a Node (upstream's `NodeMetadata`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeMetadata {
    /// Internal IP.
    pub internal_ip: String,
    /// External IP (may be empty).
    pub external_ip: String,
    /// Worker ID (the VPC instance ID when looked up in the VPC).
    pub worker_id: String,
    /// Instance type.
    pub instance_type: String,
    /// Zone.
    pub zone: String,
    /// Region.
    pub region: String,
}

fn label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// The metadata from the node's labels, when all required labels are there (upstream
/// requires internal-ip, worker-id, machine-type, zone and region).
pub fn metadata_from_labels(node: &Node) -> Option<NodeMetadata> {
    Some(NodeMetadata {
        internal_ip: label(node, labels::INTERNAL_IP)?.to_string(),
        external_ip: label(node, labels::EXTERNAL_IP).unwrap_or_default().to_string(),
        worker_id: label(node, labels::WORKER_ID)?.to_string(),
        instance_type: label(node, labels::MACHINE_TYPE)?.to_string(),
        zone: label(node, labels::ZONE)?.to_string(),
        region: label(node, labels::REGION)?.to_string(),
    })
}

/// `ibm://<accountID>///<clusterID>/<workerID>`.
pub fn provider_id(account_id: &str, cluster_id: &str, worker_id: &str) -> String {
    format!("ibm://{account_id}///{cluster_id}/{worker_id}")
}

/// The worker ID of an `ibm://` providerID of this account and cluster. Anything else
/// (another cloud, account or cluster, a malformed ID) is an error naming the providerID.
pub fn parse_provider_id(
    provider_id: &str,
    account_id: &str,
    cluster_id: &str,
) -> Result<String, ProviderError> {
    let invalid = |message: &str| ProviderError::Invalid {
        what: format!("providerID {provider_id:?}"),
        message: message.to_string(),
    };
    let Some(rest) = provider_id.strip_prefix("ibm://") else {
        return Err(invalid("not an ibm:// providerID"));
    };
    let parts: Vec<&str> = rest.split('/').collect();
    match parts.as_slice() {
        [account, "", "", cluster, worker] if !worker.is_empty() => {
            if *account != account_id || *cluster != cluster_id {
                return Err(invalid(&format!(
                    "belongs to another account or cluster (this is {account_id}/{cluster_id})"
                )));
            }
            Ok((*worker).to_string())
        }
        _ => Err(invalid("expected ibm://<accountID>///<clusterID>/<workerID>")),
    }
}

/// Whether `id` has the form of a VPC instance ID: a four-character zone code, `_`, and a
/// UUID (e.g. `0717_0a1b2c3d-...`).
pub fn looks_like_vpc_instance_id(id: &str) -> bool {
    let Some((zone, uuid)) = id.split_once('_') else { return false };
    let groups: Vec<&str> = uuid.split('-').collect();
    zone.len() == 4
        && zone.chars().all(|c| c.is_ascii_alphanumeric())
        && groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// The metadata of a VPC instance (region from the config, as upstream).
pub fn metadata_from_instance(instance: &Instance, region: &str) -> NodeMetadata {
    NodeMetadata {
        internal_ip: instance.primary_network_interface.ip().to_string(),
        external_ip: String::new(),
        worker_id: instance.id.clone(),
        instance_type: instance.profile.name.clone(),
        zone: instance.zone.name.clone(),
        region: region.to_string(),
    }
}

/// How long a batch's listing of the VPC's instances answers later batches (at least; a
/// listing is reused for as long as it took to fetch when that is longer). A Node the
/// listing lacks gets a fresh one.
pub const LISTING_TTL: Duration = Duration::from_secs(5);

/// The `NetworkUnavailable` condition's reason when `[kubernetes] set-network-unavailable`
/// sets it (upstream's value).
pub const NO_CNI_REASON: &str = "No CNI present";

/// The CNI that marks node networks itself (upstream sets no condition with it).
pub const OVN_KUBERNETES: &str = "OVNKubernetes";

/// The InstancesV2 of the IBM provider.
#[derive(Debug)]
pub struct IbmInstances {
    client: Arc<IbmClient>,
    config: Arc<Config>,
    /// VPC instance IDs seen in listings: an ID here is known to be a VPC instance.
    seen: Mutex<HashSet<String>>,
    /// The manager's Kubernetes client (from `initialize`), for `set-network-unavailable`.
    kube: std::sync::OnceLock<KubeClient>,
    /// The VPC's instances for metadata batches, shared by concurrent batches and reused
    /// ([`ccm_core::listing`], [`LISTING_TTL`]).
    listings: Listings<Vec<Instance>>,
}

/// The Kubernetes client (`kube::Client` has no `Debug`).
struct KubeClient(kube::Client);

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("kube::Client")
    }
}

impl IbmInstances {
    /// InstancesV2 on this client and config.
    pub fn new(client: Arc<IbmClient>, config: Arc<Config>) -> Self {
        IbmInstances {
            client,
            config,
            seen: Mutex::new(HashSet::new()),
            kube: std::sync::OnceLock::new(),
            listings: Listings::default(),
        }
    }

    /// The Kubernetes client `set-network-unavailable` writes Node conditions with (the
    /// provider's `initialize` sets it; a second call changes nothing).
    pub fn set_kube_client(&self, client: kube::Client) {
        let _ = self.kube.set(KubeClient(client));
    }

    /// `[kubernetes] set-network-unavailable = true` (and a CNI other than
    /// `OVNKubernetes`), as upstream: a Node being initialised (it still has the
    /// `uninitialized` taint) that has no `NetworkUnavailable` condition gets
    /// `NetworkUnavailable=True` (reason `No CNI present`), which the CNI (Calico) clears once
    /// the node's network is ready. `Ok` when there is nothing to do; an error (the Node is
    /// retried) when the condition cannot be written.
    async fn mark_network_unavailable(&self, node: &Node) -> Result<(), ProviderError> {
        if !self.config.set_network_unavailable || self.config.cni_provider == OVN_KUBERNETES {
            return Ok(());
        }
        let initialising = node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == names::TAINT_UNINITIALIZED));
        let has_condition = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == names::CONDITION_NETWORK_UNAVAILABLE));
        if !initialising || has_condition {
            return Ok(());
        }
        let name = node_name(node);
        let Some(kube) = self.kube.get() else {
            return Err(ProviderError::other(format!(
                "[kubernetes] set-network-unavailable: no Kubernetes client yet to mark node {name}"
            )));
        };
        let now = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
            k8s_openapi::jiff::Timestamp::now(),
        );
        let condition = serde_json::json!({
            "type": names::CONDITION_NETWORK_UNAVAILABLE,
            "status": "True",
            "reason": NO_CNI_REASON,
            "message": "The cloud provider marks a new node's network unavailable until its CNI reports it ready ([kubernetes] set-network-unavailable)",
            "lastTransitionTime": now,
            "lastHeartbeatTime": now,
        });
        let patch = serde_json::json!({"status": {"conditions": [condition]}});
        kube::Api::<Node>::all(kube.0.clone())
            .patch_status(name, &kube::api::PatchParams::default(), &kube::api::Patch::Strategic(patch))
            .await
            .map_err(|e| {
                ProviderError::with_source(
                    format!("[kubernetes] set-network-unavailable: marking node {name} NetworkUnavailable"),
                    e,
                )
            })?;
        tracing::info!(
            node = name,
            "IBM: NetworkUnavailable condition set on a new node (set-network-unavailable)"
        );
        Ok(())
    }

    fn remember(&self, instances: &[Instance]) {
        if let Ok(mut seen) = self.seen.lock() {
            seen.extend(instances.iter().map(|i| i.id.clone()));
        }
    }

    fn is_vpc_instance_id(&self, id: &str) -> bool {
        looks_like_vpc_instance_id(id) || self.seen.lock().map(|s| s.contains(id)).unwrap_or(false)
    }

    /// One `ListInstances` in the VPC (by `name` when there is only one node to look up).
    async fn list(&self, only: Option<&str>) -> Result<Vec<Instance>, ProviderError> {
        if let Some(why) = self.config.vpc_node_lookup_error() {
            return Err(ProviderError::other(why));
        }
        let found = self.client.list_instances(&self.config.vpc_name, only).await?;
        self.remember(&found);
        Ok(found)
    }

    /// The VPC's instances for a metadata batch of several Nodes: a listing this batch
    /// started or one reused within [`LISTING_TTL`] (or as long as it took to fetch), fetched
    /// again once, started after the batch began, when it lacks a Node's name (a worker
    /// newer than the listing). Concurrent batches share one listing (at 5000 workers, 50
    /// pages); it outlives a batch's deadline.
    async fn list_shared(
        &self,
        names: &[&str],
    ) -> Result<Arc<Fetched<Vec<Instance>>>, ProviderError> {
        if let Some(why) = self.config.vpc_node_lookup_error() {
            return Err(ProviderError::other(why));
        }
        let pass = Instant::now();
        let mut wanted = Wanted::recent(pass, LISTING_TTL);
        loop {
            let client = Arc::clone(&self.client);
            let vpc = self.config.vpc_name.clone();
            let fetch = move || async move {
                client.list_instances(&vpc, None).await.map_err(ProviderError::from)
            };
            let listed = self
                .listings
                .get(&self.config.vpc_name, wanted, fetch, ProviderError::other)
                .await?;
            self.remember(&listed);
            let names_listed: HashSet<&str> = listed.iter().map(|i| i.name.as_str()).collect();
            if names.iter().all(|n| names_listed.contains(n)) || listed.started >= pass {
                return Ok(listed);
            }
            wanted = Wanted::StartedAfter(pass);
        }
    }

    fn to_metadata(&self, node: &Node, md: &NodeMetadata) -> InstanceMetadata {
        let provider_id = match node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) {
            Some(p) if !p.is_empty() => p.to_string(),
            _ => provider_id(&self.config.account_id, &self.config.cluster_id, &md.worker_id),
        };
        let external = if md.external_ip.is_empty() { &md.internal_ip } else { &md.external_ip };
        let mut node_addresses = Vec::new();
        if !md.internal_ip.is_empty() {
            node_addresses
                .push(NodeAddress { type_: "InternalIP".into(), address: md.internal_ip.clone() });
        }
        if !external.is_empty() {
            node_addresses
                .push(NodeAddress { type_: "ExternalIP".into(), address: external.clone() });
        }
        InstanceMetadata {
            provider_id,
            instance_type: md.instance_type.clone(),
            node_addresses,
            zone: md.zone.clone(),
            region: md.region.clone(),
            additional_labels: BTreeMap::new(),
        }
    }

    /// The worker ID a node names: from its providerID (which must be ours), else its
    /// `worker-id` label; `None` when it names none.
    fn worker_id(&self, node: &Node) -> Result<Option<String>, ProviderError> {
        match node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) {
            Some(p) if !p.is_empty() => {
                parse_provider_id(p, &self.config.account_id, &self.config.cluster_id).map(Some)
            }
            _ => Ok(label(node, labels::WORKER_ID).map(str::to_string)),
        }
    }

    fn status_of(instance: &Instance) -> InstanceStatus {
        if instance.status == "stopped" {
            InstanceStatus::Shutdown
        } else {
            InstanceStatus::Running
        }
    }
}

fn node_name(node: &Node) -> &str {
    node.metadata.name.as_deref().unwrap_or_default()
}

#[async_trait]
impl InstancesV2 for IbmInstances {
    async fn instance_exists(&self, node: &Node) -> Result<bool, ProviderError> {
        ccm_core::cloud::exists_from_batch(self, node).await
    }

    async fn instance_shutdown(&self, node: &Node) -> Result<bool, ProviderError> {
        ccm_core::cloud::shutdown_from_batch(self, node).await
    }

    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata, ProviderError> {
        ccm_core::cloud::metadata_from_batch(self, node).await
    }

    async fn instance_metadata_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceMetadata, ProviderError>> {
        let marked: Vec<Result<(), ProviderError>> =
            futures::future::join_all(nodes.iter().map(|n| self.mark_network_unavailable(n))).await;
        let from_labels: Vec<Option<NodeMetadata>> =
            nodes.iter().map(metadata_from_labels).collect();
        let lookups: Vec<&str> = nodes
            .iter()
            .zip(&from_labels)
            .filter(|(_, md)| md.is_none())
            .map(|(n, _)| node_name(n))
            .collect();
        let listed = if lookups.is_empty() {
            None
        } else {
            tracing::debug!(nodes = lookups.len(), "IBM: looking up unlabelled nodes in the VPC");
            Some(match lookups.as_slice() {
                [only] => self.list(Some(only)).await.map(|value| {
                    let now = Instant::now();
                    Arc::new(Fetched { started: now, done: now, value })
                }),
                several => self.list_shared(several).await,
            })
        };
        // Each Node's instance by name from an index built once per batch, not a scan of
        // the listing per Node (10 000 Nodes: 10^8 comparisons, ci/bench #35).
        let by_name: HashMap<&str, Vec<&Instance>> = match &listed {
            Some(Ok(list)) => {
                let mut index: HashMap<&str, Vec<&Instance>> = HashMap::new();
                for i in list.iter() {
                    index.entry(i.name.as_str()).or_default().push(i);
                }
                index
            }
            _ => HashMap::new(),
        };
        nodes
            .iter()
            .zip(from_labels)
            .zip(marked)
            .map(|((node, md), marked)| {
                marked?;
                if let Some(md) = md {
                    return Ok(self.to_metadata(node, &md));
                }
                match &listed {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => {
                        return Err(ProviderError::other(format!(
                            "looking up node {} in VPC {}: {e}",
                            node_name(node),
                            self.config.vpc_name
                        )));
                    }
                    None => return Err(ProviderError::other("internal: no VPC listing")),
                };
                let named = by_name.get(node_name(node)).map(Vec::as_slice).unwrap_or_default();
                match named {
                    [] => Err(ProviderError::InstanceNotFound),
                    [one] => {
                        let md = metadata_from_instance(one, &self.config.region);
                        if md.internal_ip.is_empty() {
                            return Err(ProviderError::other(format!(
                                "VPC instance {} ({}) has no primary IP yet",
                                one.name, one.id
                            )));
                        }
                        Ok(self.to_metadata(node, &md))
                    }
                    many => Err(ProviderError::other(format!(
                        "{} VPC instances are named {} in VPC {}",
                        many.len(),
                        node_name(node),
                        self.config.vpc_name
                    ))),
                }
            })
            .collect()
    }

    async fn instance_status_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceStatus, ProviderError>> {
        if self.config.vpc_node_lookup_error().is_some() {
            // The workers live in another account: we cannot see them. Upstream's answer.
            return nodes.iter().map(|_| Ok(InstanceStatus::Running)).collect();
        }
        let listed = self.list(None).await;
        let list = match listed {
            Ok(list) => list,
            Err(e) => {
                let message = format!("listing VPC {} instances: {e}", self.config.vpc_name);
                return nodes.iter().map(|_| Err(ProviderError::other(message.clone()))).collect();
            }
        };
        // Indexes built once per batch (the first instance of a name, as a scan finds it).
        let mut ids: HashMap<&str, &Instance> = HashMap::new();
        let mut names: HashMap<&str, &Instance> = HashMap::new();
        for i in list.iter() {
            ids.entry(i.id.as_str()).or_insert(i);
            names.entry(i.name.as_str()).or_insert(i);
        }
        let answers = nodes.iter().map(|node| {
            let (ids, names) = (&ids, &names);
            async move {
                let worker = self.worker_id(node)?;
                let by_id = worker.as_deref().and_then(|w| ids.get(w).copied());
                let by_name = || names.get(node_name(node)).copied();
                if let Some(found) = by_id.or_else(by_name) {
                    return Ok(Self::status_of(found));
                }
                match worker {
                    Some(id) if self.is_vpc_instance_id(&id) => {
                        // The listing does not have it: ask for this exact ID. Only IBM's
                        // typed "not found" for it says gone (`ClientError::is_not_found`).
                        match Box::pin(self.client.get_instance(&id)).await? {
                            None => {
                                tracing::info!(node = node_name(node), instance = %id, "IBM: VPC instance is gone");
                                Ok(InstanceStatus::NotFound)
                            }
                            Some(i) => Ok(Self::status_of(&i)),
                        }
                    }
                    // Not a VPC instance we can identify: upstream's answer.
                    _ => Ok(InstanceStatus::Running),
                }
            }
        });
        futures::future::join_all(answers).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn node(name: &str, labels: &[(&str, &str)], provider_id: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            spec: Some(k8s_openapi::api::core::v1::NodeSpec {
                provider_id: provider_id.map(str::to_string),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn provider_ids_round_trip_and_foreign_ones_are_refused() {
        let p = provider_id("acct", "clus", "kube-clus-default-00000123");
        assert_eq!(p, "ibm://acct///clus/kube-clus-default-00000123");
        assert_eq!(parse_provider_id(&p, "acct", "clus").unwrap(), "kube-clus-default-00000123");
        for bad in [
            "aws:///us-east-1a/i-1",
            "ibm://acct///other/w",
            "ibm://x///clus/w",
            "ibm://acct/clus/w",
            "ibm://acct///clus/",
        ] {
            let e = parse_provider_id(bad, "acct", "clus").unwrap_err();
            assert!(e.to_string().contains(bad), "{e}");
        }
    }

    #[test]
    fn labels_give_metadata_only_when_complete() {
        let full = [
            (labels::INTERNAL_IP, "10.0.0.4"),
            (labels::WORKER_ID, "w1"),
            (labels::MACHINE_TYPE, "bx2.4x16"),
            (labels::ZONE, "us-south-1"),
            (labels::REGION, "us-south"),
        ];
        let md = metadata_from_labels(&node("n", &full, None)).unwrap();
        assert_eq!(md.internal_ip, "10.0.0.4");
        assert_eq!(md.external_ip, "");
        for skip in 0..full.len() {
            let partial: Vec<_> =
                full.iter().enumerate().filter(|(i, _)| *i != skip).map(|(_, l)| *l).collect();
            assert!(metadata_from_labels(&node("n", &partial, None)).is_none(), "{skip}");
        }
    }

    #[test]
    fn vpc_instance_ids_are_recognised_by_form() {
        assert!(looks_like_vpc_instance_id("0717_e21b7391-2ca2-4ab5-84a8-b92157a633b0"));
        assert!(!looks_like_vpc_instance_id("kube-clus-default-00000123"));
        assert!(!looks_like_vpc_instance_id("0717_not-a-uuid"));
        assert!(!looks_like_vpc_instance_id("07170_e21b7391-2ca2-4ab5-84a8-b92157a633b0"));
    }
}
