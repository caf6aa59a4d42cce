//! InstancesV2: which EC2 instance backs a Node, and what to stamp on it.
//!
//! Owns providerID parsing and formatting (`aws:///<az>/<instance-id>`), node-name lookup,
//! node addresses, zone/region/instance type, the `topology.k8s.aws/zone-id` label, and
//! existence/shutdown. Batches are answered with as few `DescribeInstances` calls as AWS
//! allows: one for all instance IDs and one for all private DNS names, each split only when
//! it exceeds [`MAX_FILTER_VALUES`]. Both use *filters* (`instance-id`, `private-dns-name`),
//! never the `InstanceIds` parameter, because one unknown ID makes AWS fail the whole call.
//! Found instances are cached for a short time ([`DEFAULT_CACHE_TTL`]).
//!
//! Deletion safety (the `InstancesV2` rule): only a lookup by the instance ID of the Node's
//! providerID may answer "gone" (terminated, or no such instance). A Node without providerID
//! is looked up by name: by private DNS name, which only finds this cluster's tagged,
//! non-terminated instances, or by the instance ID its resource-based name carries. There,
//! "not found" is an error (the lifecycle controller keeps the Node) and only an instance
//! positively reported terminated is gone. For metadata, "not found by name" is
//! `InstanceNotFound`: not yet, retried.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, Instance, InstanceStateName, Reservation, Tag};
use ccm_core::cloud::{InstanceMetadata, InstanceStatus, InstancesV2, ProviderError};
use k8s_openapi::api::core::v1::{Node, NodeAddress};
use tokio::sync::Mutex;

use crate::client::{Clients, api_error};
use crate::config::IpFamily;
use crate::tags::ClusterTags;

/// AWS accepts at most this many values across the filters of one `DescribeInstances` call.
pub const MAX_FILTER_VALUES: usize = 200;
/// How long a found instance is reused before it is described again.
pub const DEFAULT_CACHE_TTL: Duration = Duration::from_secs(10);
/// The label carrying the AWS zone ID (e.g. `use1-az1`).
pub const ZONE_ID_LABEL: &str = "topology.k8s.aws/zone-id";

/// How a Node names its instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum InstanceRef {
    /// By instance ID (from the providerID or a resource-based node name).
    Id(String),
    /// By private DNS name (the node name), as EC2 reports it.
    PrivateDns(String),
}

/// The instance ID in a providerID. Accepts `aws:///<zone>/<id>`, `aws:////<id>`,
/// `aws://<zone>/<id>` and a bare `i-...`; the ID must start with `i-` and contain no `/`.
pub fn parse_provider_id(provider_id: &str) -> Result<String, ProviderError> {
    provider_id_parts(provider_id).map(|(_, id)| id)
}

/// The location (the zone of `aws:///<zone>/<id>`, else the host of `aws://<zone or
/// region>/<id>`; `None` when neither is given) and the instance ID of a providerID.
pub fn provider_id_parts(provider_id: &str) -> Result<(Option<String>, String), ProviderError> {
    let invalid = |message: &str| ProviderError::Invalid {
        what: format!("providerID {provider_id:?}"),
        message: message.to_string(),
    };
    let (host, path) = if let Some(rest) = provider_id.strip_prefix("aws://") {
        // `aws://<host>/<path>`: the host (usually empty) is a zone or a region.
        match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => return Err(invalid("expected aws:///<zone>/<instance-id>")),
        }
    } else if provider_id.contains("://") {
        return Err(invalid("not an aws:// providerID"));
    } else {
        ("", provider_id)
    };
    let tokens: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (zone, id) = match tokens.as_slice() {
        [id] => ("", *id),
        [zone, id] => (*zone, *id),
        _ => return Err(invalid("expected aws:///<zone>/<instance-id>")),
    };
    if id.starts_with("fargate-") {
        return Err(invalid("Fargate nodes are not EC2 instances and are not supported"));
    }
    if !id.starts_with("i-") || id.len() < 3 {
        return Err(invalid("the instance ID must start with i-"));
    }
    let location = [zone, host].into_iter().find(|l| !l.is_empty()).map(str::to_string);
    Ok((location, id.to_string()))
}

/// Whether a providerID's location (a zone such as `us-east-1a` or the Local Zone
/// `us-east-1-bos-1a`, or a region) lies in `region`.
pub fn location_in_region(location: &str, region: &str) -> bool {
    location == region
        || location.strip_prefix(region).is_some_and(|rest| {
            (rest.len() == 1 && rest.bytes().all(|b| b.is_ascii_lowercase()))
                || rest.starts_with('-')
        })
}

/// The error for a providerID naming a zone or region other than the configured one: its
/// instance ID means nothing in this region (an ID absent here is no proof that the instance
/// is gone), so the Node is neither looked up nor deleted.
fn foreign_region(provider_id: &str, location: &str, region: &str) -> ProviderError {
    ProviderError::Invalid {
        what: format!("providerID {provider_id:?}"),
        message: format!(
            "names {location}, which is not in this manager's region {region}: the instance is \
             not looked up here (an ID unknown in {region} would not prove it gone); run a \
             manager for that region, or fix the providerID"
        ),
    }
}

/// The providerID of an instance: `aws:///<az>/<instance-id>`.
pub fn provider_id(az: &str, instance_id: &str) -> String {
    format!("aws:///{az}/{instance_id}")
}

/// The instance a node refers to: its providerID if set, else a resource-based node name
/// (`i-0abc` or `i-0abc.<region>.compute.internal`), else the node name as private DNS name.
pub fn instance_ref(node: &Node) -> Result<InstanceRef, ProviderError> {
    if let Some(pid) =
        node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|p| !p.is_empty())
    {
        return parse_provider_id(pid).map(InstanceRef::Id);
    }
    let name = node.metadata.name.as_deref().unwrap_or_default();
    if name.is_empty() {
        return Err(ProviderError::Invalid {
            what: "node".into(),
            message: "node has no name".into(),
        });
    }
    Ok(instance_ref_for_name(name))
}

/// The instance a node name refers to (see [`instance_ref`]).
pub fn instance_ref_for_name(name: &str) -> InstanceRef {
    let first = name.split('.').next().unwrap_or(name);
    let resource_name = first.len() > 2
        && first.starts_with("i-")
        && first[2..].chars().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase());
    if resource_name {
        InstanceRef::Id(first.to_string())
    } else {
        InstanceRef::PrivateDns(name.to_ascii_lowercase())
    }
}

/// What the provider reads of an EC2 instance, taken out of the SDK's `Instance` as each page
/// of a `DescribeInstances` answer is read. The SDK's type carries some 70 fields (block
/// devices, CPU, metadata and maintenance options, ...) and takes several kilobytes per
/// instance; found instances are cached and shared by every batch, so at 5000 Nodes keeping
/// the whole answer cost tens of megabytes (issue #15). A field read elsewhere in this crate
/// must be added here: the type has no other way in.
#[derive(Debug, Clone, PartialEq)]
pub struct Ec2Instance {
    id: String,
    state: Option<InstanceStateName>,
    instance_type: Option<String>,
    /// `placement.availabilityZone`.
    zone: Option<String>,
    vpc_id: Option<String>,
    private_ip: Option<String>,
    public_ip: Option<String>,
    private_dns: Option<String>,
    public_dns: Option<String>,
    /// The network interfaces in use (or without a status), by device index.
    enis: Vec<Eni>,
    tags: Vec<Tag>,
    /// Security group IDs, in EC2's order.
    security_groups: Vec<String>,
    source_dest_check: Option<bool>,
}

/// The addresses of one network interface.
#[derive(Debug, Clone, PartialEq)]
struct Eni {
    /// Its private IPv4 addresses (`privateIpAddressesSet`, else `privateIpAddress`).
    ipv4: Vec<String>,
    /// Its first IPv6 address.
    ipv6: Option<String>,
}

impl Ec2Instance {
    /// The fields the provider reads; `None` for an instance without an ID (never acted on).
    pub fn from_sdk(instance: Instance) -> Option<Self> {
        let Instance {
            instance_id,
            state,
            instance_type,
            placement,
            vpc_id,
            private_ip_address,
            public_ip_address,
            private_dns_name,
            public_dns_name,
            network_interfaces,
            tags,
            security_groups,
            source_dest_check,
            ..
        } = instance;
        let mut enis: Vec<(i32, Eni)> = network_interfaces
            .unwrap_or_default()
            .into_iter()
            .filter(|eni| eni.status.as_ref().is_none_or(|s| s.as_str() == "in-use"))
            .map(|eni| {
                let device =
                    eni.attachment.as_ref().and_then(|a| a.device_index).unwrap_or(i32::MAX);
                let ipv4 = match eni.private_ip_addresses {
                    Some(list) if !list.is_empty() => {
                        list.into_iter().filter_map(|ip| ip.private_ip_address).collect()
                    }
                    _ => eni.private_ip_address.into_iter().collect(),
                };
                let ipv6 = eni
                    .ipv6_addresses
                    .and_then(|list| list.into_iter().next())
                    .and_then(|a| a.ipv6_address);
                (device, Eni { ipv4, ipv6 })
            })
            .collect();
        enis.sort_by_key(|(device, _)| *device);
        Some(Ec2Instance {
            id: instance_id?,
            state: state.and_then(|s| s.name),
            instance_type: instance_type.map(|t| t.as_str().to_string()),
            zone: placement.and_then(|p| p.availability_zone),
            vpc_id,
            private_ip: private_ip_address,
            public_ip: public_ip_address,
            private_dns: private_dns_name,
            public_dns: public_dns_name,
            enis: enis.into_iter().map(|(_, eni)| eni).collect(),
            tags: tags.unwrap_or_default(),
            security_groups: security_groups
                .unwrap_or_default()
                .into_iter()
                .filter_map(|g| g.group_id)
                .collect(),
            source_dest_check,
        })
    }

    /// The instances of a `DescribeInstances` page, each cut down as it is read (the SDK's
    /// are several times larger).
    fn all_in(reservations: Option<Vec<Reservation>>) -> impl Iterator<Item = Ec2Instance> {
        reservations
            .unwrap_or_default()
            .into_iter()
            .flat_map(|r| r.instances.unwrap_or_default())
            .filter_map(Ec2Instance::from_sdk)
    }

    /// The instance ID (`i-...`).
    pub fn id(&self) -> &str {
        &self.id
    }

    /// The instance state, if EC2 gave one.
    pub fn state(&self) -> Option<&InstanceStateName> {
        self.state.as_ref()
    }

    /// Whether EC2 reported the instance terminated.
    pub fn is_terminated(&self) -> bool {
        matches!(self.state, Some(InstanceStateName::Terminated))
    }

    /// The instance type (`m5.large`).
    pub fn instance_type(&self) -> Option<&str> {
        self.instance_type.as_deref()
    }

    /// The availability zone (`us-east-1a`).
    pub fn zone(&self) -> Option<&str> {
        self.zone.as_deref()
    }

    /// The VPC ID.
    pub fn vpc_id(&self) -> Option<&str> {
        self.vpc_id.as_deref()
    }

    /// The private DNS name (`ip-10-0-0-1.ec2.internal`).
    pub fn private_dns_name(&self) -> Option<&str> {
        self.private_dns.as_deref()
    }

    /// The instance's tags.
    pub fn tags(&self) -> &[Tag] {
        &self.tags
    }

    /// The IDs of the instance's security groups.
    pub fn security_group_ids(&self) -> &[String] {
        &self.security_groups
    }

    /// The source/destination check flag.
    pub fn source_dest_check(&self) -> Option<bool> {
        self.source_dest_check
    }
}

/// Node addresses of an instance, in upstream's order, for the given families.
///
/// IPv4: every private IPv4 of every attached ENI (by device index) as `InternalIP` (the
/// instance's private IP if it has no ENI), the public IP as `ExternalIP`, the private DNS name
/// as `InternalDNS` and `Hostname`, the public DNS name as `ExternalDNS`. IPv6: the first IPv6
/// of each ENI as `InternalIP`.
pub fn node_addresses(instance: &Ec2Instance, families: &[IpFamily]) -> Vec<NodeAddress> {
    let mut out: Vec<NodeAddress> = Vec::new();
    let mut push = |kind: &str, addr: Option<&str>| {
        let Some(addr) = addr.filter(|a| !a.is_empty()) else { return };
        if !out.iter().any(|a| a.type_ == kind && a.address == addr) {
            out.push(NodeAddress { type_: kind.to_string(), address: addr.to_string() });
        }
    };
    for family in families {
        match family {
            IpFamily::Ipv4 => {
                let mut any = false;
                for eni in &instance.enis {
                    for ip in &eni.ipv4 {
                        any = true;
                        push("InternalIP", Some(ip));
                    }
                }
                if !any {
                    push("InternalIP", instance.private_ip.as_deref());
                }
                push("ExternalIP", instance.public_ip.as_deref());
                push("InternalDNS", instance.private_dns.as_deref());
                push("Hostname", instance.private_dns.as_deref());
                push("ExternalDNS", instance.public_dns.as_deref());
            }
            IpFamily::Ipv6 => {
                for eni in &instance.enis {
                    push("InternalIP", eni.ipv6.as_deref());
                }
            }
        }
    }
    out
}

/// A per-node answer shared by the batch methods.
/// One lookup's answer. Instances are shared (`Arc`): the cache, the indexes of a batch and
/// its answers hold one copy each instance, not one each (hundreds per batch, kilobytes each).
type Found = Result<Option<Arc<Ec2Instance>>, ProviderError>;

/// A copy of an error for every node of a failed chunk (sources are kept as text).
fn copy_error(e: &ProviderError) -> ProviderError {
    match e {
        ProviderError::Throttled(m) => ProviderError::Throttled(m.clone()),
        ProviderError::Invalid { what, message } => {
            ProviderError::Invalid { what: what.clone(), message: message.clone() }
        }
        other => ProviderError::other(other.to_string()),
    }
}

#[derive(Default)]
struct Cache {
    by_id: HashMap<String, (Instant, Arc<Ec2Instance>)>,
    by_dns: HashMap<String, String>,
}

impl Cache {
    /// Drops instances found more than `ttl` ago, and the names that led to them (names of
    /// Nodes long gone would otherwise pile up for the life of the process).
    fn expire(&mut self, ttl: Duration) {
        let Cache { by_id, by_dns } = self;
        by_id.retain(|_, (at, _)| at.elapsed() < ttl);
        by_dns.retain(|_, id| by_id.contains_key(id));
    }
}

/// The InstancesV2 implementation.
pub struct AwsInstances {
    clients: Clients,
    families: Vec<IpFamily>,
    tags: ClusterTags,
    cache_ttl: Duration,
    cache: Mutex<Cache>,
    zone_ids: Mutex<Option<HashMap<String, String>>>,
}

impl std::fmt::Debug for AwsInstances {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsInstances").field("families", &self.families).finish_non_exhaustive()
    }
}

impl AwsInstances {
    /// An InstancesV2 for `clients`' region.
    pub fn new(clients: Clients, families: Vec<IpFamily>, tags: ClusterTags) -> Self {
        AwsInstances {
            clients,
            families,
            tags,
            cache_ttl: DEFAULT_CACHE_TTL,
            cache: Mutex::new(Cache::default()),
            zone_ids: Mutex::new(None),
        }
    }

    /// Changes how long found instances are reused (zero disables the cache).
    pub fn with_cache_ttl(mut self, ttl: Duration) -> Self {
        self.cache_ttl = ttl;
        self
    }

    /// Finds the instances behind `refs`, one answer per ref in order: `Ok(None)` when AWS
    /// has no such instance (by DNS name: no instance of this cluster that is not terminated).
    /// Instances found in the last [`DEFAULT_CACHE_TTL`] are reused.
    pub async fn find(&self, refs: &[InstanceRef]) -> Vec<Found> {
        self.lookup(refs, false).await
    }

    /// [`find`](Self::find) without reading the cache (what it finds still refreshes it):
    /// for instance state, which must be current at every lifecycle pass.
    pub async fn find_fresh(&self, refs: &[InstanceRef]) -> Vec<Found> {
        self.lookup(refs, true).await
    }

    async fn lookup(&self, refs: &[InstanceRef], fresh: bool) -> Vec<Found> {
        let mut ids: Vec<String> = Vec::new();
        let mut dns: Vec<String> = Vec::new();
        let mut known: HashMap<InstanceRef, Arc<Ec2Instance>> = HashMap::new();
        {
            let mut cache = self.cache.lock().await;
            let ttl = self.cache_ttl;
            cache.expire(ttl);
            for r in refs {
                let hit = if fresh {
                    None
                } else {
                    match r {
                        InstanceRef::Id(id) => cache.by_id.get(id).map(|(_, i)| Arc::clone(i)),
                        InstanceRef::PrivateDns(n) => cache
                            .by_dns
                            .get(n)
                            .and_then(|id| cache.by_id.get(id))
                            .map(|(_, i)| Arc::clone(i)),
                    }
                };
                match (hit, r) {
                    (Some(i), _) => {
                        known.insert(r.clone(), i);
                    }
                    (None, InstanceRef::Id(id)) if !ids.contains(id) => ids.push(id.clone()),
                    (None, InstanceRef::PrivateDns(n)) if !dns.contains(n) => dns.push(n.clone()),
                    _ => {}
                }
            }
        }

        let mut failed: HashMap<InstanceRef, Arc<ProviderError>> = HashMap::new();
        let mut fetched: Vec<Arc<Ec2Instance>> = Vec::new();
        let calls = ids
            .chunks(MAX_FILTER_VALUES)
            .map(|c| ("instance-id", c.to_vec()))
            .chain(dns.chunks(MAX_FILTER_VALUES).map(|c| ("private-dns-name", c.to_vec())))
            .map(|(filter, values)| async move {
                let res = self.describe(filter, &values).await;
                (filter, values, res)
            });
        for (filter, values, res) in futures::future::join_all(calls).await {
            match res {
                Ok(found) => fetched.extend(found.into_iter().map(Arc::new)),
                Err(e) => {
                    let e = Arc::new(e);
                    for v in values {
                        let r = if filter == "instance-id" {
                            InstanceRef::Id(v)
                        } else {
                            InstanceRef::PrivateDns(v)
                        };
                        failed.insert(r, Arc::clone(&e));
                    }
                }
            }
        }

        // Index what came back; DNS matches must belong to this cluster and not be terminated.
        let mut by_id: HashMap<String, Arc<Ec2Instance>> = HashMap::new();
        let mut by_dns: HashMap<String, Vec<Arc<Ec2Instance>>> = HashMap::new();
        for i in fetched {
            let id = i.id().to_string();
            if let Some(name) = i.private_dns_name().filter(|n| !n.is_empty())
                && !i.is_terminated()
                && self.tags.owns(i.tags())
            {
                by_dns.entry(name.to_ascii_lowercase()).or_default().push(Arc::clone(&i));
            }
            by_id.insert(id, i);
        }
        {
            let mut cache = self.cache.lock().await;
            if !self.cache_ttl.is_zero() {
                let now = Instant::now();
                for (id, i) in &by_id {
                    // Only instances a DNS lookup may return (this cluster's, not terminated).
                    if let Some(name) = i
                        .private_dns_name()
                        .filter(|n| !n.is_empty() && !i.is_terminated() && self.tags.owns(i.tags()))
                    {
                        cache.by_dns.insert(name.to_ascii_lowercase(), id.clone());
                    }
                    cache.by_id.insert(id.clone(), (now, Arc::clone(i)));
                }
            }
        }

        refs.iter()
            .map(|r| {
                if let Some(i) = known.get(r) {
                    return Ok(Some(Arc::clone(i)));
                }
                if let Some(e) = failed.get(r) {
                    return Err(copy_error(e));
                }
                match r {
                    InstanceRef::Id(id) => Ok(by_id.get(id).cloned()),
                    InstanceRef::PrivateDns(n) => match by_dns.get(n).map(Vec::as_slice) {
                        None | Some([]) => Ok(None),
                        Some([one]) => Ok(Some(Arc::clone(one))),
                        Some(many) => Err(ProviderError::other(format!(
                            "{} instances of this cluster have private DNS name {n}: {}",
                            many.len(),
                            many.iter().map(|i| i.id()).collect::<Vec<_>>().join(", ")
                        ))),
                    },
                }
            })
            .collect()
    }

    async fn describe(
        &self,
        filter: &str,
        values: &[String],
    ) -> Result<Vec<Ec2Instance>, ProviderError> {
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let resp = self
                .clients
                .get()
                .await?
                .ec2
                .describe_instances()
                .filters(Filter::builder().name(filter).set_values(Some(values.to_vec())).build())
                .set_next_token(token.take())
                .send()
                .await
                .map_err(|e| {
                    api_error(format!("DescribeInstances by {filter} ({} values)", values.len()), e)
                })?;
            let next = resp.next_token().filter(|t| !t.is_empty()).map(str::to_string);
            out.extend(Ec2Instance::all_in(resp.reservations));
            match next {
                Some(t) => token = Some(t),
                None => break,
            }
        }
        Ok(out)
    }

    async fn find_nodes(&self, nodes: &[Node], fresh: bool) -> Vec<Found> {
        // A providerID naming another region is an error, before any lookup (issue #29).
        let located = nodes.iter().any(|n| {
            provider_id_of(n)
                .and_then(|p| provider_id_parts(p).ok())
                .is_some_and(|(l, _)| l.is_some())
        });
        let region = if located {
            match self.clients.get().await {
                Ok(c) => Some(c.region.clone()),
                Err(e) => {
                    let e = Arc::new(e);
                    return nodes.iter().map(|_| Err(copy_error(&e))).collect();
                }
            }
        } else {
            None
        };
        let refs: Vec<Result<InstanceRef, ProviderError>> = nodes
            .iter()
            .map(|n| {
                if let (Some(region), Some(pid)) = (&region, provider_id_of(n))
                    && let Ok((Some(location), _)) = provider_id_parts(pid)
                    && !location_in_region(&location, region)
                {
                    return Err(foreign_region(pid, &location, region));
                }
                instance_ref(n)
            })
            .collect();
        let valid: Vec<InstanceRef> =
            refs.iter().filter_map(|r| r.as_ref().ok().cloned()).collect();
        let mut found = self.lookup(&valid, fresh).await.into_iter();
        refs.into_iter()
            .map(|r| match r {
                Ok(_) => found
                    .next()
                    .unwrap_or_else(|| Err(ProviderError::other("lookup lost an answer"))),
                Err(e) => Err(e),
            })
            .collect()
    }

    /// Zone name → zone ID, from one `DescribeAvailabilityZones` (kept for the process).
    async fn zone_id(&self, zone: &str) -> Result<Option<String>, ProviderError> {
        let mut guard = self.zone_ids.lock().await;
        if guard.as_ref().is_none_or(|m| !m.contains_key(zone)) {
            let resp = self
                .clients
                .get()
                .await?
                .ec2
                .describe_availability_zones()
                .send()
                .await
                .map_err(|e| api_error("DescribeAvailabilityZones", e))?;
            let map = resp
                .availability_zones()
                .iter()
                .filter_map(|z| Some((z.zone_name()?.to_string(), z.zone_id()?.to_string())))
                .collect();
            *guard = Some(map);
        }
        Ok(guard.as_ref().and_then(|m| m.get(zone).cloned()))
    }

    async fn metadata(&self, instance: &Ec2Instance) -> Result<InstanceMetadata, ProviderError> {
        let id = instance.id();
        let zone = instance.zone().unwrap_or_default().to_string();
        let mut additional_labels = BTreeMap::new();
        if !zone.is_empty()
            && let Some(zone_id) = self.zone_id(&zone).await?
        {
            additional_labels.insert(ZONE_ID_LABEL.to_string(), zone_id);
        }
        Ok(InstanceMetadata {
            provider_id: provider_id(&zone, id),
            instance_type: instance.instance_type().unwrap_or_default().to_string(),
            node_addresses: node_addresses(instance, &self.families),
            zone,
            region: self.clients.get().await?.region.clone(),
            additional_labels,
        })
    }
}

/// Whether the node's instance is named by its providerID (the only lookup whose "no such
/// instance" may delete the Node).
fn has_provider_id(node: &Node) -> bool {
    provider_id_of(node).is_some()
}

/// The node's providerID, when set.
fn provider_id_of(node: &Node) -> Option<&str> {
    node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).filter(|p| !p.is_empty())
}

/// The lifecycle answer for one node. `by_provider_id`: the instance was looked up by the ID
/// in the node's providerID, so "not found" is a positive answer; otherwise (looked up by
/// name) it is an error and the Node is kept.
fn status_of(
    node: &Node,
    by_provider_id: bool,
    found: Found,
) -> Result<InstanceStatus, ProviderError> {
    Ok(match found? {
        None if by_provider_id => InstanceStatus::NotFound,
        None => {
            let name = node.metadata.name.as_deref().unwrap_or_default();
            return Err(ProviderError::other(format!(
                "node {name} has no providerID and no instance of this cluster was found by its \
                 name (by private DNS name only instances with the cluster tag that are not \
                 terminated are found); not being found by name does not prove the instance \
                 is gone, so the node is kept"
            )));
        }
        Some(i) if i.is_terminated() => InstanceStatus::NotFound,
        Some(i) if matches!(i.state(), Some(InstanceStateName::Stopped)) => {
            InstanceStatus::Shutdown
        }
        Some(_) => InstanceStatus::Running,
    })
}

#[async_trait]
impl InstancesV2 for AwsInstances {
    /// Two full DescribeInstances filters ([`MAX_FILTER_VALUES`] each): 5000 joining Nodes
    /// cost 25 calls, where batches of 500 left a remainder call of 100 each (35).
    fn max_batch(&self) -> usize {
        2 * MAX_FILTER_VALUES
    }

    async fn instance_exists(&self, node: &Node) -> Result<bool, ProviderError> {
        let status = self.instance_status_batch(std::slice::from_ref(node)).await;
        let status = status.into_iter().next().unwrap_or(Err(ProviderError::other("no answer")))?;
        Ok(status != InstanceStatus::NotFound)
    }

    async fn instance_shutdown(&self, node: &Node) -> Result<bool, ProviderError> {
        let status = self.instance_status_batch(std::slice::from_ref(node)).await;
        let status = status.into_iter().next().unwrap_or(Err(ProviderError::other("no answer")))?;
        Ok(status == InstanceStatus::Shutdown)
    }

    async fn instance_metadata(&self, node: &Node) -> Result<InstanceMetadata, ProviderError> {
        let meta = self.instance_metadata_batch(std::slice::from_ref(node)).await;
        meta.into_iter().next().unwrap_or(Err(ProviderError::other("no answer")))
    }

    async fn instance_metadata_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceMetadata, ProviderError>> {
        let found = self.find_nodes(nodes, false).await;
        let mut out = Vec::with_capacity(found.len());
        for f in found {
            out.push(match f {
                Ok(Some(i)) if !i.is_terminated() => self.metadata(&i).await,
                Ok(_) => Err(ProviderError::InstanceNotFound),
                Err(e) => Err(e),
            });
        }
        out
    }

    async fn instance_status_batch(
        &self,
        nodes: &[Node],
    ) -> Vec<Result<InstanceStatus, ProviderError>> {
        // State is never answered from the cache: a stopped or terminated instance is seen at
        // the next lifecycle pass (one call per pass for all NotReady nodes).
        let found = self.find_nodes(nodes, true).await;
        let mut out = Vec::with_capacity(nodes.len());
        for (node, found) in nodes.iter().zip(found) {
            let by_provider_id = has_provider_id(node);
            // A filtered page without the instance is not proof that it is gone (an empty or
            // truncated page says the same): ask for the ID itself (issue #21, chaos suite).
            let found = match (found, by_provider_id, instance_ref(node)) {
                (Ok(None), true, Ok(InstanceRef::Id(id))) => self.confirm_absent(&id).await,
                (found, _, _) => found,
            };
            out.push(status_of(node, by_provider_id, found));
        }
        out
    }
}

impl AwsInstances {
    /// Confirms "no such instance" for an instance ID a filtered lookup did not list: a
    /// `DescribeInstances` by `InstanceIds`, where EC2 names an unknown ID with the error
    /// `InvalidInstanceID.NotFound`. Only that error is "gone" (`Ok(None)`); the instance in
    /// the answer is returned; an answer without it (an empty or truncated page) is an error,
    /// so the Node is kept.
    async fn confirm_absent(&self, id: &str) -> Found {
        let resp = self.clients.get().await?.ec2.describe_instances().instance_ids(id).send().await;
        match resp {
            Ok(resp) => Ec2Instance::all_in(resp.reservations)
                .find(|i| i.id() == id)
                .map(|i| Some(Arc::new(i)))
                .ok_or_else(|| {
                    ProviderError::other(format!(
                        "DescribeInstances by instance ID {id}: the answer neither lists the \
                         instance nor reports it unknown (an incomplete answer); the node is kept"
                    ))
                }),
            Err(e) if crate::client::error_code(&e) == Some(INSTANCE_NOT_FOUND) => Ok(None),
            Err(e) => Err(api_error(format!("DescribeInstances by instance ID {id}"), e)),
        }
    }
}

/// The EC2 error code naming an instance ID that does not exist.
const INSTANCE_NOT_FOUND: &str = "InvalidInstanceID.NotFound";

#[cfg(test)]
mod tests {
    use super::*;
    use aws_sdk_ec2::types::{
        InstanceIpv6Address, InstanceNetworkInterface, InstanceNetworkInterfaceAttachment,
        InstancePrivateIpAddress, NetworkInterfaceStatus,
    };

    #[test]
    fn expired_instances_take_their_names_with_them() {
        let mut cache = Cache::default();
        let old = Instant::now() - Duration::from_secs(30);
        for (id, at) in [("i-old", old), ("i-new", Instant::now())] {
            let i = Ec2Instance::from_sdk(Instance::builder().instance_id(id).build()).unwrap();
            cache.by_id.insert(id.to_string(), (at, Arc::new(i)));
            cache.by_dns.insert(format!("{id}.ec2.internal"), id.to_string());
        }
        cache.expire(Duration::from_secs(10));
        assert_eq!(cache.by_id.keys().collect::<Vec<_>>(), ["i-new"]);
        assert_eq!(cache.by_dns.keys().collect::<Vec<_>>(), ["i-new.ec2.internal"]);
    }

    #[test]
    fn provider_id_forms() {
        for ok in [
            "aws:///us-east-1a/i-0abc",
            "aws:////i-0abc",
            "aws://us-east-1a/i-0abc",
            "i-0abc",
            "aws:///i-0abc",
        ] {
            assert_eq!(parse_provider_id(ok).unwrap(), "i-0abc", "{ok}");
        }
        for bad in [
            "gce://p/z/n",
            "aws:///us-east-1a/fargate-10.0.0.1",
            "aws:///a/b/i-0abc",
            "aws:///us-east-1a/vol-1",
            "aws://",
            "",
        ] {
            let err = parse_provider_id(bad).unwrap_err();
            assert!(matches!(err, ProviderError::Invalid { .. }), "{bad}: {err:?}");
        }
        assert_eq!(provider_id("us-east-1a", "i-1"), "aws:///us-east-1a/i-1");
        for (pid, location) in [
            ("aws:///us-east-1a/i-0abc", Some("us-east-1a")),
            ("aws://us-west-2/i-0abc", Some("us-west-2")),
            ("aws://eu-west-1b/i-0abc", Some("eu-west-1b")),
            ("aws:////i-0abc", None),
            ("i-0abc", None),
        ] {
            let (l, id) = provider_id_parts(pid).unwrap();
            assert_eq!((l.as_deref(), id.as_str()), (location, "i-0abc"), "{pid}");
        }
    }

    #[test]
    fn zones_and_regions_belong_to_their_region_only() {
        for l in
            ["us-east-1", "us-east-1a", "us-east-1f", "us-east-1-bos-1a", "us-east-1-wl1-bos-wlz-1"]
        {
            assert!(location_in_region(l, "us-east-1"), "{l}");
        }
        for l in
            ["eu-west-1a", "us-east-10a", "us-east-2a", "us-east-1ab", "us-east", "", "us-east-1A"]
        {
            assert!(!location_in_region(l, "us-east-1"), "{l}");
        }
    }

    #[test]
    fn node_names_resolve_to_ids_or_dns() {
        assert_eq!(instance_ref_for_name("i-0123abcd"), InstanceRef::Id("i-0123abcd".into()));
        assert_eq!(
            instance_ref_for_name("i-0123abcd.us-east-1.compute.internal"),
            InstanceRef::Id("i-0123abcd".into())
        );
        assert_eq!(
            instance_ref_for_name("ip-10-0-0-1.ec2.internal"),
            InstanceRef::PrivateDns("ip-10-0-0-1.ec2.internal".into())
        );
        assert_eq!(instance_ref_for_name("i-not-hex"), InstanceRef::PrivateDns("i-not-hex".into()));
    }

    fn eni(device: i32, ips: &[&str], v6: &[&str]) -> InstanceNetworkInterface {
        let mut b = InstanceNetworkInterface::builder()
            .status(NetworkInterfaceStatus::InUse)
            .attachment(InstanceNetworkInterfaceAttachment::builder().device_index(device).build());
        for ip in ips {
            b = b.private_ip_addresses(
                InstancePrivateIpAddress::builder().private_ip_address(*ip).build(),
            );
        }
        for ip in v6 {
            b = b.ipv6_addresses(InstanceIpv6Address::builder().ipv6_address(*ip).build());
        }
        b.build()
    }

    #[test]
    fn addresses_follow_eni_device_order_and_families() {
        let inst = Instance::builder()
            .instance_id("i-1")
            .network_interfaces(eni(1, &["10.0.1.5"], &["2600::2"]))
            .network_interfaces(eni(0, &["10.0.0.5", "10.0.0.6"], &["2600::1", "2600::9"]))
            .private_ip_address("10.0.0.5")
            .public_ip_address("54.1.2.3")
            .private_dns_name("ip-10-0-0-5.ec2.internal")
            .public_dns_name("ec2-54-1-2-3.compute-1.amazonaws.com")
            .build();
        let inst = Ec2Instance::from_sdk(inst).unwrap();
        let got = |fams: &[IpFamily]| -> Vec<(String, String)> {
            node_addresses(&inst, fams).into_iter().map(|a| (a.type_, a.address)).collect()
        };
        let s = |t: &str, a: &str| (t.to_string(), a.to_string());
        assert_eq!(
            got(&[IpFamily::Ipv4]),
            vec![
                s("InternalIP", "10.0.0.5"),
                s("InternalIP", "10.0.0.6"),
                s("InternalIP", "10.0.1.5"),
                s("ExternalIP", "54.1.2.3"),
                s("InternalDNS", "ip-10-0-0-5.ec2.internal"),
                s("Hostname", "ip-10-0-0-5.ec2.internal"),
                s("ExternalDNS", "ec2-54-1-2-3.compute-1.amazonaws.com"),
            ]
        );
        let dual = got(&[IpFamily::Ipv6, IpFamily::Ipv4]);
        assert_eq!(&dual[..2], &[s("InternalIP", "2600::1"), s("InternalIP", "2600::2")]);
        assert_eq!(dual[2], s("InternalIP", "10.0.0.5"));
    }

    #[test]
    fn from_sdk_keeps_what_the_provider_reads() {
        use aws_sdk_ec2::types::{
            GroupIdentifier, InstanceBlockDeviceMapping, InstanceState, InstanceType, Placement,
        };
        let detached = InstanceNetworkInterface::builder()
            .status(NetworkInterfaceStatus::Detaching)
            .private_ip_address("10.9.9.9")
            .build();
        // An ENI whose address list is empty names its address in privateIpAddress.
        let bare = InstanceNetworkInterface::builder()
            .attachment(InstanceNetworkInterfaceAttachment::builder().device_index(2).build())
            .private_ip_address("10.0.2.5")
            .build();
        let sdk = Instance::builder()
            .instance_id("i-0abc")
            .state(InstanceState::builder().name(InstanceStateName::Stopped).build())
            .instance_type(InstanceType::M5Large)
            .placement(Placement::builder().availability_zone("us-east-1b").build())
            .vpc_id("vpc-1")
            .private_dns_name("ip-10-0-0-5.ec2.internal")
            .tags(Tag::builder().key("Name").value("n1").build())
            .security_groups(GroupIdentifier::builder().group_id("sg-1").group_name("a").build())
            .security_groups(GroupIdentifier::builder().group_name("no id").build())
            .security_groups(GroupIdentifier::builder().group_id("sg-2").build())
            .source_dest_check(false)
            .block_device_mappings(
                InstanceBlockDeviceMapping::builder().device_name("/dev/xvda").build(),
            )
            .network_interfaces(bare)
            .network_interfaces(detached)
            .network_interfaces(eni(0, &["10.0.0.5"], &[]))
            .build();
        let i = Ec2Instance::from_sdk(sdk).unwrap();
        assert_eq!(i.id(), "i-0abc");
        assert_eq!(i.state(), Some(&InstanceStateName::Stopped));
        assert!(!i.is_terminated());
        assert_eq!(i.instance_type(), Some("m5.large"));
        assert_eq!(i.zone(), Some("us-east-1b"));
        assert_eq!(i.vpc_id(), Some("vpc-1"));
        assert_eq!(i.private_dns_name(), Some("ip-10-0-0-5.ec2.internal"));
        assert_eq!(i.tags().len(), 1);
        assert_eq!(i.security_group_ids(), ["sg-1", "sg-2"]);
        assert_eq!(i.source_dest_check(), Some(false));
        // In device order; the detaching ENI is not an address of the Node.
        let ips: Vec<(String, String)> = node_addresses(&i, &[IpFamily::Ipv4])
            .into_iter()
            .filter(|a| a.type_ == "InternalIP")
            .map(|a| (a.type_, a.address))
            .collect();
        assert_eq!(
            ips,
            [
                ("InternalIP".to_string(), "10.0.0.5".to_string()),
                ("InternalIP".into(), "10.0.2.5".into())
            ]
        );

        assert_eq!(Ec2Instance::from_sdk(Instance::builder().vpc_id("vpc-1").build()), None);
        let gone = Instance::builder()
            .instance_id("i-1")
            .state(InstanceState::builder().name(InstanceStateName::Terminated).build())
            .build();
        assert!(Ec2Instance::from_sdk(gone).unwrap().is_terminated());
    }

    #[test]
    fn an_instance_without_enis_uses_its_private_ip() {
        let inst = Instance::builder().instance_id("i-1").private_ip_address("10.1.1.1").build();
        let inst = Ec2Instance::from_sdk(inst).unwrap();
        let addrs = node_addresses(&inst, &[IpFamily::Ipv4]);
        assert_eq!(addrs.len(), 1);
        assert_eq!(addrs[0].address, "10.1.1.1");
    }
}
