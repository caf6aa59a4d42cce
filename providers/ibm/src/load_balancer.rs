//! LoadBalancer: one IBM VPC (application) load balancer per Service, as upstream's
//! `pkg/vpcctl` builds it.
//!
//! - Name `kube-<clusterID>-<service UID without dashes>`, cut to 63 characters, or the
//!   `...-vpc-lb-name` annotation.
//! - One TCP listener and one pool per Service port; pool name
//!   `<protocol>-<port>-<nodePort>`, round robin; members are the nodes' internal IPs (the
//!   `ibm-cloud.kubernetes.io/internal-ip` label, else the `InternalIP` address) on the node
//!   port. Nodes are filtered as upstream: by the `...-vpc-node-selector` annotation when
//!   set, else by the `...-zone` annotation and then to `dedicated=edge` nodes if there are
//!   any.
//! - Health monitor TCP on the node port (delay 5, retries 2, timeout 2), or HTTP `/` on the
//!   health-check node port for `externalTrafficPolicy: Local`.
//! - Public or private from `...-ip-type`; subnets from `g2VpcSubnetNames` (in `g2VpcName`),
//!   narrowed by `...-zone`, or the `...-vpc-subnets` annotation (IDs, names or CIDRs).
//!   Neither can change after creation (an error says so, as upstream).
//! - Proxy protocol v1 on the pools with `...-enable-features: proxy-protocol`.
//! - Updates compute the same steps as upstream (delete listeners/pools of removed ports,
//!   fix pools whose node port, health check or proxy protocol changed, add/remove members,
//!   create pools/listeners for new ports; several member changes on a pool become one
//!   `ReplaceLoadBalancerPoolMembers`).
//! - **Nothing waits** (issue #33 item 11): a create returns the hostname IBM assigned while
//!   the load balancer is still `create_pending` (as upstream); a change applies one step and,
//!   when more remain, asks for a retry ([`ProviderError::RetryAfter`] after
//!   [`Timings::poll`]) instead of waiting out `update_pending` (IBM answers 409 while a load
//!   balancer is pending); a load balancer that is pending is a retry, never a wait; a delete
//!   is sent, then retried until IBM no longer lists the load balancer (the Service keeps its
//!   finalizer until then; upstream returned at once). So a service worker is never held for
//!   the minutes IBM takes: N Services created at once get their hostnames in about the time
//!   of one create call.
//! - The status is the load balancer's hostname.
//!
//! - **No listing per sync** (issue #35): a Service's load balancer is looked up by name
//!   through an index of name → ID filled by the creates and by the listings this provider
//!   makes, and read by that ID ([`IbmLoadBalancer::find`]): one `GetLoadBalancer` per
//!   sync, not a listing of every load balancer of the region (which made one Node joining K
//!   load balancers cost K listings of K). The index is never the answer: the load balancer
//!   read by ID must still carry the name (IBM's names are unique in a region), else the name
//!   is looked up in a listing again; "no load balancer of that name" only ever comes from a
//!   listing begun after the lookup began (concurrent lookups share one such listing).
//!
//! **Ownership** (issue #29): a load balancer is found by its exact name only (never by
//! hostname; an ID only as the index above keeps it, its name checked on the fresh read),
//! and it is created, changed or deleted only when it is provably this Service's:
//!
//! - a generated name `kube-<clusterID>-<Service UID>` is its own proof (the UID is the API
//!   server's, and no annotation may name a load balancer of that form: see [`naming`]);
//! - a load balancer named by `...-vpc-lb-name` is this Service's only when it carries the
//!   user tags [`tags::CLUSTER`]`<clusterID>` and [`tags::SERVICE_UID`]`<Service UID>`, which
//!   this provider attaches (Global Tagging) right after creating it, and which nobody with
//!   rights only in the cluster can write. Any other load balancer of that name is an error
//!   (the service controller records it as a warning Event): it is not used, not changed,
//!   and deleting the Service deletes nothing of it.
//!
//! The operator tools ([`LoadBalancer::list_cloud_load_balancers`]) count the same proofs.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::cloud::{CloudLoadBalancer, CloudResource, LoadBalancer, ProviderError};
use ccm_core::reference::{KeyDoc, has_key};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};
use serde_json::{Value, json};

use crate::client::{ClientError, IbmClient};
use crate::config::Config;
use crate::instances::labels;
use crate::model;

/// The Service annotations (prefix `service.kubernetes.io/ibm-load-balancer-cloud-provider-`).
pub mod annotations {
    /// `public` (default) or `private`.
    pub const IP_TYPE: &str = "service.kubernetes.io/ibm-load-balancer-cloud-provider-ip-type";
    /// Restrict members and subnets to one zone.
    pub const ZONE: &str = "service.kubernetes.io/ibm-load-balancer-cloud-provider-zone";
    /// The VPC subnets (IDs, names or CIDRs) of the load balancer.
    pub const VPC_SUBNETS: &str =
        "service.kubernetes.io/ibm-load-balancer-cloud-provider-vpc-subnets";
    /// `label=value` member filter (allowed label keys only).
    pub const VPC_NODE_SELECTOR: &str =
        "service.kubernetes.io/ibm-load-balancer-cloud-provider-vpc-node-selector";
    /// An explicit load balancer name (a new one, created and tagged for this Service; an
    /// existing one only when it carries this cluster's and this Service's tags).
    pub const VPC_LB_NAME: &str =
        "service.kubernetes.io/ibm-load-balancer-cloud-provider-vpc-lb-name";
    /// `proxy-protocol` (VPC); `ipvs` is classic-only.
    pub const ENABLE_FEATURES: &str =
        "service.kubernetes.io/ibm-load-balancer-cloud-provider-enable-features";
    /// Classic infrastructure only: ignored with a warning.
    pub const CLASSIC_ONLY: [&str; 4] = [
        "service.kubernetes.io/ibm-load-balancer-cloud-provider-vlan",
        "service.kubernetes.io/ibm-load-balancer-cloud-provider-ipvs-scheduler",
        "service.kubernetes.io/ibm-ingress-controller-public",
        "service.kubernetes.io/ibm-ingress-controller-private",
    ];
}

/// Every annotation the provider reads, with its documentation: [`annotation`] reads only keys
/// listed here (checked in debug builds and so by every test), and the tests feed every example
/// back into [`service_options`]. `ccm-docgen` renders it as the annotation reference.
pub const ANNOTATIONS: &[KeyDoc] = &[
    KeyDoc {
        section: "",
        key: annotations::IP_TYPE,
        value: "`public` (default) or `private`",
        example: "private",
        doc: "A public or a private VPC load balancer.",
    },
    KeyDoc {
        section: "",
        key: annotations::ZONE,
        value: "zone name",
        example: "us-south-1",
        doc: "Restrict the load balancer's subnets and members to one zone.",
    },
    KeyDoc {
        section: "",
        key: annotations::VPC_SUBNETS,
        value: "comma-separated subnet IDs, names or CIDRs",
        example: "subnet-1",
        doc: "The load balancer's subnets (in the cluster's VPC) instead of `g2VpcSubnetNames`.",
    },
    KeyDoc {
        section: "",
        key: annotations::VPC_NODE_SELECTOR,
        value: "`<label>=<value>` with an allowed label",
        example: "ibm-cloud.kubernetes.io/worker-pool-name=edge",
        doc: "Only Nodes with this label are members.",
    },
    KeyDoc {
        section: "",
        key: annotations::VPC_LB_NAME,
        value: "name",
        example: "my-lb",
        doc: "The load balancer's name instead of `kube-<clusterID>-<uid>` (changing it later re-creates the load balancer). A load balancer of that name that this cluster did not create for this Service is an error, never adopted; names of the generated `kube-<cluster>-<uid>` form, IDs and hostnames are refused.",
    },
    KeyDoc {
        section: "",
        key: annotations::ENABLE_FEATURES,
        value: "comma-separated features",
        example: "proxy-protocol",
        doc: "`proxy-protocol` enables PROXY protocol; other (classic) features are ignored with a warning.",
    },
    KeyDoc {
        section: "",
        key: annotations::CLASSIC_ONLY[0],
        value: "any",
        example: "1234",
        doc: "Classic infrastructure only: ignored with a warning.",
    },
    KeyDoc {
        section: "",
        key: annotations::CLASSIC_ONLY[1],
        value: "any",
        example: "rr",
        doc: "Classic infrastructure only: ignored with a warning.",
    },
    KeyDoc {
        section: "",
        key: annotations::CLASSIC_ONLY[2],
        value: "any",
        example: "true",
        doc: "Classic infrastructure only: ignored with a warning.",
    },
    KeyDoc {
        section: "",
        key: annotations::CLASSIC_ONLY[3],
        value: "any",
        example: "true",
        doc: "Classic infrastructure only: ignored with a warning.",
    },
];

/// Node label keys the node-selector annotation may use (upstream's list).
pub const NODE_SELECTOR_KEYS: [&str; 16] = [
    "ibm-cloud.kubernetes.io/internal-ip",
    "ibm-cloud.kubernetes.io/machine-type",
    "ibm-cloud.kubernetes.io/os",
    "ibm-cloud.kubernetes.io/region",
    "ibm-cloud.kubernetes.io/subnet-id",
    "ibm-cloud.kubernetes.io/worker-id",
    "ibm-cloud.kubernetes.io/worker-pool-id",
    "ibm-cloud.kubernetes.io/worker-pool-name",
    "ibm-cloud.kubernetes.io/worker-version",
    "ibm-cloud.kubernetes.io/zone",
    "kubernetes.io/arch",
    "kubernetes.io/hostname",
    "kubernetes.io/os",
    "node.kubernetes.io/instance-type",
    "topology.kubernetes.io/region",
    "topology.kubernetes.io/zone",
];

/// The name prefix of the load balancers we create.
pub const NAME_PREFIX: &str = "kube";

/// The user tags (Global Tagging, `tag_type=user`) that record, on a load balancer named by
/// the `...-vpc-lb-name` annotation, the cluster and the Service it was created for. Compared
/// without regard to case (IBM's tags are case-insensitive).
pub mod tags {
    /// `ccm-cluster:<clusterID>`.
    pub const CLUSTER: &str = "ccm-cluster:";
    /// `ccm-service-uid:<Service UID>`.
    pub const SERVICE_UID: &str = "ccm-service-uid:";
    /// `ccm-service:<namespace>.<name>` (for people and the operator tools; cut to 128
    /// characters, so not part of the proof).
    pub const SERVICE: &str = "ccm-service:";
}

/// IBM's user tag rules: 1 to 128 characters, letters, digits, spaces, `_`, `-`, `.`, `:`.
fn is_valid_tag(tag: &str) -> bool {
    (1..=128).contains(&tag.len())
        && tag
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '_' | '-' | '.' | ':'))
}

/// The tags that mark a load balancer as created by `cluster_id` for `service`: cluster, UID,
/// and `namespace.name`. An error when the cluster ID or UID cannot be a tag.
pub fn owner_tags(cluster_id: &str, service: &Service) -> Result<Vec<String>, ProviderError> {
    let uid = service.metadata.uid.as_deref().unwrap_or_default();
    let cluster = format!("{}{cluster_id}", tags::CLUSTER);
    if cluster_id.is_empty() || !is_valid_tag(&cluster) {
        return Err(ProviderError::other(format!(
            "[provider] clusterID cannot be written into the ownership tag {cluster:?} (IBM tags allow letters, digits, '_', '-', '.', ':', 128 characters)"
        )));
    }
    let uid_tag = format!("{}{uid}", tags::SERVICE_UID);
    if uid.is_empty() || !is_valid_tag(&uid_tag) {
        return Err(ProviderError::other(format!(
            "Service {} has no usable UID for the ownership tag",
            service_key(service)
        )));
    }
    let mut service_tag = format!(
        "{}{}.{}",
        tags::SERVICE,
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    );
    service_tag.truncate(128);
    let mut out = vec![cluster.to_ascii_lowercase(), uid_tag.to_ascii_lowercase()];
    if is_valid_tag(&service_tag) {
        out.push(service_tag.to_ascii_lowercase());
    }
    Ok(out)
}

/// The value of the tag `prefix<value>` among `have`, if any (case-insensitive prefix).
fn tag_value<'a>(have: &'a [String], prefix: &str) -> Option<&'a str> {
    have.iter().find_map(|t| {
        let head = t.get(..prefix.len())?;
        head.eq_ignore_ascii_case(prefix).then_some(&t[prefix.len()..])
    })
}

/// Whether `name` has the form of a generated name, `kube-<cluster>-<hex UID, maybe cut>`.
pub fn has_generated_form(name: &str) -> bool {
    let Some(rest) = name.strip_prefix(&format!("{NAME_PREFIX}-")) else { return false };
    let Some((cluster, tail)) = rest.rsplit_once('-') else { return false };
    !cluster.is_empty() && tail.len() >= 8 && tail.chars().all(|c| c.is_ascii_hexdigit())
}

/// Whether `name` is a valid VPC load balancer name: 1 to 63 lowercase letters, digits and
/// `-`, starting with a letter and not ending with `-`.
pub fn is_valid_name(name: &str) -> bool {
    (1..=63).contains(&name.len())
        && name.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
        && name.as_bytes()[0].is_ascii_lowercase()
        && !name.ends_with('-')
}

/// Whether `name` has the form of a VPC resource ID (`<4 characters>-<UUID>`, e.g.
/// `r006-0a1b2c3d-...`).
pub fn has_id_form(name: &str) -> bool {
    let Some((region, uuid)) = name.split_once('-') else { return false };
    let groups: Vec<&str> = uuid.split('-').collect();
    region.len() == 4
        && region.chars().all(|c| c.is_ascii_alphanumeric())
        && groups.iter().map(|g| g.len()).eq([8, 4, 4, 4, 12])
        && groups.iter().all(|g| g.chars().all(|c| c.is_ascii_hexdigit()))
}

/// How a Service's load balancer is named, which says how its ownership is proved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Naming {
    /// `kube-<clusterID>-<uid>`: the name is the proof.
    Generated(String),
    /// The `...-vpc-lb-name` annotation: the ownership tags are the proof.
    Annotated(String),
}

impl Naming {
    /// The load balancer's name.
    pub fn name(&self) -> &str {
        match self {
            Naming::Generated(n) | Naming::Annotated(n) => n,
        }
    }
}

/// The Service's load balancer name and how it is owned. An annotation equal to the
/// generated name is the generated name; any other annotated name that starts with
/// `kube-<clusterID>-` or has the generated form (another Service's or another cluster's
/// generated name) is refused: those names are proved by the name alone, so no annotation may
/// claim one.
pub fn naming(service: &Service, cluster_id: &str) -> Result<Naming, ProviderError> {
    let generated = generated_name(service, cluster_id);
    let Some(named) =
        annotation(service, annotations::VPC_LB_NAME).map(str::trim).filter(|n| !n.is_empty())
    else {
        return Ok(Naming::Generated(generated));
    };
    if named == generated {
        return Ok(Naming::Generated(generated));
    }
    if !is_valid_name(named) || has_id_form(named) {
        return Err(invalid(
            annotations::VPC_LB_NAME,
            format!(
                "{named:?} is not a load balancer name (1-63 lowercase letters, digits and '-', \
                 starting with a letter, not of a resource ID's form): the load balancer is \
                 found by its exact name only, never by ID or hostname"
            ),
        ));
    }
    if named.starts_with(&format!("{NAME_PREFIX}-{cluster_id}-")) || has_generated_form(named) {
        return Err(invalid(
            annotations::VPC_LB_NAME,
            format!(
                "{named:?} has the form of a name this provider generates for a Service \
                 (kube-<clusterID>-<Service UID>): such names are reserved; choose another"
            ),
        ));
    }
    Ok(Naming::Annotated(named.to_string()))
}
/// Connections per listener (upstream's value).
pub const CONNECTION_LIMIT: i64 = 15000;

/// How soon to look at a pending load balancer again, and how long the operator tools wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    /// The delay of the retry a pending load balancer asks for (the service controller
    /// requeues the Service after it; nothing sleeps), and the operator tools' poll interval.
    pub poll: Duration,
    /// The longest wait of the operator tools (`orphans --delete`) for one state change;
    /// the controllers never wait.
    pub max_wait: Duration,
}

impl Default for Timings {
    /// Retry after 5 s; the tools wait up to 2 minutes (upstream: every 8 s, 2 minutes).
    fn default() -> Self {
        Timings { poll: Duration::from_secs(5), max_wait: Duration::from_secs(120) }
    }
}

/// `kube-<clusterID>-<uid without dashes>`, at most 63 characters, unless the
/// `...-vpc-lb-name` annotation names the load balancer (see [`naming`] for which names are
/// accepted).
pub fn load_balancer_name(service: &Service, cluster_id: &str) -> String {
    if let Some(name) = annotation(service, annotations::VPC_LB_NAME)
        && !name.trim().is_empty()
    {
        return name.trim().to_string();
    }
    generated_name(service, cluster_id)
}

/// `kube-<clusterID>-<uid without dashes>`, at most 63 characters.
pub fn generated_name(service: &Service, cluster_id: &str) -> String {
    let uid: String =
        service.metadata.uid.as_deref().unwrap_or_default().chars().filter(|c| *c != '-').collect();
    let mut name = format!("{NAME_PREFIX}-{cluster_id}-{uid}");
    name.truncate(63);
    name
}

/// `<protocol>-<port>-<nodePort>` (protocol lower-cased).
pub fn pool_name(protocol: &str, port: i32, node_port: i32) -> String {
    format!("{}-{port}-{node_port}", protocol.to_ascii_lowercase())
}

/// The fields of a pool name; `None` when it is not `<tcp|udp>-<port>-<nodePort>`.
pub fn parse_pool_name(name: &str) -> Option<(String, i32, i32)> {
    let mut parts = name.split('-');
    let (proto, port, node_port) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || !matches!(proto, "tcp" | "udp") {
        return None;
    }
    Some((proto.to_string(), port.parse().ok()?, node_port.parse().ok()?))
}

fn annotation<'a>(service: &'a Service, key: &str) -> Option<&'a str> {
    debug_assert!(has_key(ANNOTATIONS, key), "annotation {key} is not in ANNOTATIONS");
    service.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

fn invalid(what: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::Invalid { what: what.to_string(), message: message.into() }
}

/// One Service port as the load balancer serves it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// `tcp`.
    pub protocol: String,
    /// The listener port.
    pub port: i32,
    /// The node port (member port).
    pub node_port: i32,
}

impl PortSpec {
    fn pool_name(&self) -> String {
        pool_name(&self.protocol, self.port, self.node_port)
    }
}

/// What the Service asks of its load balancer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceOptions {
    /// Public (default) or private.
    pub public: bool,
    /// The zone annotation.
    pub zone: Option<String>,
    /// The subnets annotation, split.
    pub subnets: Option<Vec<String>>,
    /// The node selector annotation.
    pub node_selector: Option<(String, String)>,
    /// Proxy protocol v1 on the pools.
    pub proxy_protocol: bool,
    /// The health-check node port for `externalTrafficPolicy: Local`.
    pub health_check_node_port: Option<i32>,
    /// The ports.
    pub ports: Vec<PortSpec>,
}

/// Reads and checks the Service: TCP ports with node ports, known annotation values.
pub fn service_options(service: &Service) -> Result<ServiceOptions, ProviderError> {
    let key = service_key(service);
    let spec = service.spec.clone().unwrap_or_default();
    if spec.allocate_load_balancer_node_ports == Some(false) {
        return Err(invalid(
            &format!("Service {key} spec.allocateLoadBalancerNodePorts"),
            "NodePort allocation is required for IBM VPC load balancers",
        ));
    }
    let mut ports = Vec::new();
    for p in spec.ports.unwrap_or_default() {
        let protocol = p.protocol.unwrap_or_else(|| "TCP".into());
        if protocol != "TCP" {
            return Err(invalid(
                &format!("Service {key} port {}", p.port),
                format!("protocol {protocol}: only TCP is supported by the VPC load balancer"),
            ));
        }
        let node_port = p.node_port.unwrap_or_default();
        if node_port <= 0 {
            return Err(invalid(
                &format!("Service {key} port {}", p.port),
                "no node port allocated",
            ));
        }
        ports.push(PortSpec { protocol: "tcp".into(), port: p.port, node_port });
    }
    if ports.is_empty() {
        return Err(invalid(&format!("Service {key}"), "no ports"));
    }
    let public = match annotation(service, annotations::IP_TYPE).map(str::trim) {
        None | Some("") | Some("public") => true,
        Some("private") => false,
        Some(other) => {
            return Err(invalid(
                annotations::IP_TYPE,
                format!("{other:?}: expected \"public\" or \"private\""),
            ));
        }
    };
    let no_spaces =
        |k: &str| annotation(service, k).map(|v| v.replace(' ', "")).filter(|v| !v.is_empty());
    let zone = no_spaces(annotations::ZONE);
    let subnets = no_spaces(annotations::VPC_SUBNETS)
        .map(|v| v.split(',').filter(|s| !s.is_empty()).map(str::to_string).collect::<Vec<_>>());
    let node_selector = match no_spaces(annotations::VPC_NODE_SELECTOR) {
        None => None,
        Some(v) => match v.split_once('=') {
            Some((k, val)) if !val.contains('=') && NODE_SELECTOR_KEYS.contains(&k) => {
                Some((k.to_string(), val.to_string()))
            }
            _ => {
                return Err(invalid(
                    annotations::VPC_NODE_SELECTOR,
                    format!(
                        "{v:?}: expected <label>=<value> with one of the labels {}",
                        NODE_SELECTOR_KEYS.join(", ")
                    ),
                ));
            }
        },
    };
    let features = no_spaces(annotations::ENABLE_FEATURES).unwrap_or_default().to_ascii_lowercase();
    let proxy_protocol = features.split(',').any(|f| f == "proxy-protocol");
    for f in features.split(',').filter(|f| !f.is_empty() && *f != "proxy-protocol") {
        tracing::warn!(service = %key, feature = f, "IBM VPC: load balancer feature not supported on VPC, ignored");
    }
    for a in annotations::CLASSIC_ONLY {
        if annotation(service, a).is_some() {
            tracing::warn!(service = %key, annotation = a, "IBM VPC: classic-only annotation ignored");
        }
    }
    let health_check_node_port = (spec.external_traffic_policy.as_deref() == Some("Local"))
        .then_some(spec.health_check_node_port.unwrap_or_default())
        .filter(|p| *p > 0);
    Ok(ServiceOptions {
        public,
        zone,
        subnets,
        node_selector,
        proxy_protocol,
        health_check_node_port,
        ports,
    })
}

fn node_label<'a>(node: &'a Node, key: &str) -> Option<&'a str> {
    node.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

/// The node's internal IP: the provisioner's label, else its `InternalIP` address.
pub fn node_internal_ip(node: &Node) -> Option<String> {
    if let Some(ip) = node_label(node, labels::INTERNAL_IP).filter(|v| !v.is_empty()) {
        return Some(ip.to_string());
    }
    node.status
        .as_ref()?
        .addresses
        .as_ref()?
        .iter()
        .find(|a| a.type_ == "InternalIP")
        .map(|a| a.address.clone())
}

/// The member IPs for the Service: nodes filtered as upstream (selector, else zone then
/// edge nodes), their internal IPs, sorted and without duplicates.
pub fn member_ips(nodes: &[Node], options: &ServiceOptions) -> Vec<String> {
    let matching = |key: &str, value: &str| -> Vec<&Node> {
        nodes.iter().filter(|n| node_label(n, key) == Some(value)).collect()
    };
    let chosen: Vec<&Node> = if let Some((k, v)) = &options.node_selector {
        matching(k, v)
    } else {
        let by_zone: Vec<&Node> = match &options.zone {
            Some(z) => matching(labels::ZONE, z),
            None => nodes.iter().collect(),
        };
        let edge: Vec<&Node> = by_zone
            .iter()
            .copied()
            .filter(|n| node_label(n, "dedicated") == Some("edge"))
            .collect();
        if edge.is_empty() { by_zone } else { edge }
    };
    let ips: BTreeSet<String> = chosen.into_iter().filter_map(node_internal_ip).collect();
    ips.into_iter().collect()
}

fn health_monitor(options: &ServiceOptions, node_port: i32) -> Value {
    match options.health_check_node_port {
        Some(hc) => {
            json!({"delay": 5, "max_retries": 2, "timeout": 2, "type": "http", "port": hc, "url_path": "/"})
        }
        None => {
            json!({"delay": 5, "max_retries": 2, "timeout": 2, "type": "tcp", "port": node_port})
        }
    }
}

fn health_monitor_matches(
    options: &ServiceOptions,
    node_port: i32,
    hm: &model::HealthMonitor,
) -> bool {
    match options.health_check_node_port {
        Some(hc) => hm.kind == "http" && hm.port == Some(i64::from(hc)),
        None => hm.kind == "tcp" && hm.port == Some(i64::from(node_port)),
    }
}

fn proxy_protocol(options: &ServiceOptions) -> &'static str {
    if options.proxy_protocol { "v1" } else { "disabled" }
}

fn members(ips: &[String], node_port: i32) -> Value {
    Value::Array(
        ips.iter().map(|ip| json!({"port": node_port, "target": {"address": ip}})).collect(),
    )
}

fn pool_prototype(options: &ServiceOptions, port: &PortSpec, ips: &[String]) -> Value {
    json!({
        "algorithm": "round_robin",
        "health_monitor": health_monitor(options, port.node_port),
        "members": members(ips, port.node_port),
        "name": port.pool_name(),
        "protocol": port.protocol,
        "proxy_protocol": proxy_protocol(options),
    })
}

/// The body of `CreateLoadBalancer` (upstream's shape: pools and listeners inline).
pub fn create_body(
    name: &str,
    options: &ServiceOptions,
    ips: &[String],
    subnet_ids: &[String],
    resource_group_id: &str,
) -> Value {
    json!({
        "name": name,
        "is_public": options.public,
        "subnets": subnet_ids.iter().map(|id| json!({"id": id})).collect::<Vec<_>>(),
        "pools": options.ports.iter().map(|p| pool_prototype(options, p, ips)).collect::<Vec<_>>(),
        "listeners": options.ports.iter().map(|p| json!({
            "connection_limit": CONNECTION_LIMIT,
            "default_pool": {"name": p.pool_name()},
            "port": p.port,
            "protocol": p.protocol,
        })).collect::<Vec<_>>(),
        "resource_group": {"id": resource_group_id},
    })
}

/// One step of an update, in upstream's order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// Delete a listener whose port left the Service.
    DeleteListener {
        /// The listener.
        id: String,
        /// Its port (for logs).
        port: i64,
    },
    /// Delete a pool whose port left the Service.
    DeletePool {
        /// The pool.
        id: String,
        /// Its name.
        name: String,
    },
    /// Delete one member.
    DeleteMember {
        /// The pool.
        pool: String,
        /// The member.
        id: String,
        /// Its address (for logs).
        address: String,
    },
    /// Rename the pool / fix its health monitor or proxy protocol.
    UpdatePool {
        /// The pool.
        id: String,
        /// The port it serves.
        port: PortSpec,
    },
    /// Replace all members of a pool.
    ReplaceMembers {
        /// The pool.
        id: String,
        /// The port it serves.
        port: PortSpec,
    },
    /// Add one member.
    CreateMember {
        /// The pool.
        pool: String,
        /// The address.
        address: String,
        /// The node port.
        node_port: i32,
    },
    /// Create the pool of a new port.
    CreatePool {
        /// The port.
        port: PortSpec,
    },
    /// Create the listener of a new port.
    CreateListener {
        /// The port.
        port: PortSpec,
    },
}

impl Step {
    fn order(&self) -> u8 {
        match self {
            Step::DeleteListener { .. } => 0,
            Step::DeletePool { .. } => 1,
            Step::DeleteMember { .. } => 2,
            Step::UpdatePool { .. } => 3,
            Step::ReplaceMembers { .. } => 4,
            Step::CreateMember { .. } => 5,
            Step::CreatePool { .. } => 6,
            Step::CreateListener { .. } => 7,
        }
    }
}

/// The steps that bring a load balancer's listeners, pools and members to what the Service
/// and nodes ask for. `pools` carry their members.
pub fn plan(
    options: &ServiceOptions,
    ips: &[String],
    listeners: &[model::Listener],
    pools: &[(model::Pool, Vec<model::Member>)],
) -> Result<Vec<Step>, ProviderError> {
    let mut steps = Vec::new();
    let serves = |proto: &str, port: i64| {
        options
            .ports
            .iter()
            .find(|p| p.protocol.eq_ignore_ascii_case(proto) && i64::from(p.port) == port)
    };
    for l in listeners {
        if serves(&l.protocol, l.port).is_none() {
            steps.push(Step::DeleteListener { id: l.id.clone(), port: l.port });
        }
    }
    let mut pooled: BTreeSet<(String, i32)> = BTreeSet::new();
    for (pool, members) in pools {
        let Some((proto, port, node_port)) = parse_pool_name(&pool.name) else {
            return Err(ProviderError::other(format!(
                "pool {:?} ({}) is not named <protocol>-<port>-<nodePort>: not created by this controller",
                pool.name, pool.id
            )));
        };
        let Some(want) = serves(&proto, i64::from(port)) else {
            steps.push(Step::DeletePool { id: pool.id.clone(), name: pool.name.clone() });
            continue;
        };
        pooled.insert((want.protocol.clone(), want.port));
        if node_port != want.node_port {
            // The node port changed: rename, new health check, all members on the new port.
            steps.push(Step::UpdatePool { id: pool.id.clone(), port: want.clone() });
            steps.push(Step::ReplaceMembers { id: pool.id.clone(), port: want.clone() });
            continue;
        }
        if !health_monitor_matches(options, want.node_port, &pool.health_monitor)
            || pool.proxy_protocol != proxy_protocol(options)
        {
            steps.push(Step::UpdatePool { id: pool.id.clone(), port: want.clone() });
        }
        let np = i64::from(want.node_port);
        let deletes: Vec<&model::Member> =
            members.iter().filter(|m| m.port != np || !ips.contains(&m.target.address)).collect();
        let adds: Vec<&String> = ips
            .iter()
            .filter(|ip| !members.iter().any(|m| &m.target.address == *ip && m.port == np))
            .collect();
        match (deletes.as_slice(), adds.as_slice()) {
            ([], []) => {}
            ([m], []) => steps.push(Step::DeleteMember {
                pool: pool.id.clone(),
                id: m.id.clone(),
                address: m.target.address.clone(),
            }),
            ([], [ip]) => steps.push(Step::CreateMember {
                pool: pool.id.clone(),
                address: (*ip).clone(),
                node_port: want.node_port,
            }),
            _ => steps.push(Step::ReplaceMembers { id: pool.id.clone(), port: want.clone() }),
        }
    }
    for p in &options.ports {
        if !pooled.contains(&(p.protocol.clone(), p.port)) {
            steps.push(Step::CreatePool { port: p.clone() });
        }
        let has_listener = listeners
            .iter()
            .any(|l| l.protocol.eq_ignore_ascii_case(&p.protocol) && l.port == i64::from(p.port));
        if !has_listener {
            steps.push(Step::CreateListener { port: p.clone() });
        }
    }
    steps.sort_by_key(Step::order);
    Ok(steps)
}

/// Whether a found load balancer is the Service's, and if not, why not.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Owner {
    /// Created by this cluster for this Service.
    Ours,
    /// Anything else; the text says what the load balancer carries instead.
    NotOurs(String),
}

/// The LoadBalancer of the IBM provider.
#[derive(Debug)]
pub struct IbmLoadBalancer {
    client: Arc<IbmClient>,
    config: Arc<Config>,
    timings: Timings,
    /// Load balancers this process created under an annotated name whose ownership tags are
    /// not attached yet (ID → Service UID): the recorded ID is the proof until the tags are
    /// attached on the next sync.
    unmarked: Mutex<HashMap<String, String>>,
    /// Name → ID of the load balancers seen in this process's listings and creates, and how
    /// many listings completed (see [`Self::find`]).
    index: Mutex<NameIndex>,
    /// Held while listing for [`Self::find`]: one listing at a time, shared by the lookups
    /// that wait for it.
    listing: tokio::sync::Mutex<()>,
}

/// Where [`IbmLoadBalancer::find`] looks first: an index, never an answer on its own.
#[derive(Debug, Default)]
struct NameIndex {
    ids: HashMap<String, String>,
    /// Listings by `find` completed so far (each begun after the one before completed).
    listings: u64,
}

impl IbmLoadBalancer {
    /// Load balancers on this client and config.
    pub fn new(client: Arc<IbmClient>, config: Arc<Config>, timings: Timings) -> Self {
        IbmLoadBalancer {
            client,
            config,
            timings,
            unmarked: Mutex::new(HashMap::new()),
            index: Mutex::new(NameIndex::default()),
            listing: tokio::sync::Mutex::new(()),
        }
    }

    /// The load balancer named exactly `name` (never matched by hostname), as IBM answers
    /// now. Through the index: the ID last seen under that name is read
    /// (`GetLoadBalancer`, one call) and the answer counts only when it still carries the
    /// name. Otherwise a listing answers, one begun after this lookup began: either one this
    /// lookup makes, or one another lookup began while this one waited its turn (so K
    /// lookups at once share a listing instead of making K). Two of that name in a listing
    /// is an error (IBM refuses a second, so it is never expected).
    async fn find(&self, name: &str) -> Result<Option<model::LoadBalancer>, ProviderError> {
        let seen = self.listings();
        if let Some(lb) = self.read_indexed(name).await? {
            return Ok(Some(lb));
        }
        let _turn = self.listing.lock().await;
        // Listings run one at a time: the second to complete since `seen` began after it.
        if self.listings() >= seen + 2 {
            if self.indexed(name).is_none() {
                return Ok(None);
            }
            if let Some(lb) = self.read_indexed(name).await? {
                return Ok(Some(lb));
            }
        }
        let all = self.client.list_load_balancers().await?;
        if let Ok(mut index) = self.index.lock() {
            let mut ids = HashMap::with_capacity(all.len());
            let mut twice = BTreeSet::new();
            for lb in &all {
                if ids.insert(lb.name.clone(), lb.id.clone()).is_some() {
                    twice.insert(lb.name.clone());
                }
            }
            // A name seen twice is looked up in a listing each time (and is an error).
            ids.retain(|n, _| !twice.contains(n));
            index.ids = ids;
            index.listings += 1;
        }
        let mut named: Vec<model::LoadBalancer> =
            all.into_iter().filter(|lb| lb.name == name).collect();
        match named.len() {
            0 | 1 => Ok(named.pop()),
            n => Err(ProviderError::other(format!("{n} VPC load balancers are named {name}"))),
        }
    }

    /// The load balancer the index names under `name`, read now; `None` when the index has
    /// none or IBM's answer does not carry the name any more (gone, or renamed: the entry is
    /// dropped).
    async fn read_indexed(&self, name: &str) -> Result<Option<model::LoadBalancer>, ProviderError> {
        let Some(id) = self.indexed(name) else { return Ok(None) };
        match self.client.get_load_balancer(&id).await? {
            Some(lb) if lb.name == name => Ok(Some(lb)),
            _ => {
                if let Ok(mut index) = self.index.lock()
                    && index.ids.get(name) == Some(&id)
                {
                    index.ids.remove(name);
                }
                Ok(None)
            }
        }
    }

    fn indexed(&self, name: &str) -> Option<String> {
        self.index.lock().map(|i| i.ids.get(name).cloned()).unwrap_or(None)
    }

    fn listings(&self) -> u64 {
        self.index.lock().map(|i| i.listings).unwrap_or(0)
    }

    fn index_created(&self, lb: &model::LoadBalancer) {
        if let Ok(mut index) = self.index.lock() {
            index.ids.insert(lb.name.clone(), lb.id.clone());
        }
    }

    fn unmarked_uid(&self, id: &str) -> Option<String> {
        self.unmarked.lock().map(|m| m.get(id).cloned()).unwrap_or(None)
    }

    fn set_unmarked(&self, id: &str, uid: Option<&str>) {
        if let Ok(mut m) = self.unmarked.lock() {
            match uid {
                Some(uid) => m.insert(id.to_string(), uid.to_string()),
                None => m.remove(id),
            };
        }
    }

    /// Whether `lb` (found under the Service's name) is this Service's: by its generated name,
    /// or, for an annotated name, by this cluster's and this Service's tags (or by this
    /// process's record of having created it, and then the tags are attached now).
    async fn owner(
        &self,
        naming: &Naming,
        service: &Service,
        lb: &model::LoadBalancer,
    ) -> Result<Owner, ProviderError> {
        if let Naming::Generated(name) = naming {
            return Ok(if &lb.name == name {
                Owner::Ours
            } else {
                Owner::NotOurs(format!("it is not named {name}"))
            });
        }
        let want = owner_tags(&self.config.cluster_id, service)?;
        if lb.crn.is_empty() {
            return Err(ProviderError::other(format!(
                "load balancer {} ({}) has no CRN: its ownership tags cannot be read",
                lb.name, lb.id
            )));
        }
        let have = self.client.list_tags(&lb.crn).await?;
        let holds = |t: &String| have.iter().any(|h| h.eq_ignore_ascii_case(t));
        if want[..2].iter().all(holds) {
            return Ok(Owner::Ours);
        }
        let uid = service.metadata.uid.as_deref().unwrap_or_default();
        if self.unmarked_uid(&lb.id).as_deref() == Some(uid) {
            tracing::info!(service = %service_key(service), load_balancer = %lb.name, "IBM: attaching the ownership tags of a load balancer this process created");
            self.client.attach_tags(&lb.crn, &want).await?;
            self.set_unmarked(&lb.id, None);
            return Ok(Owner::Ours);
        }
        let cluster = tag_value(&have, tags::CLUSTER);
        let owner_uid = tag_value(&have, tags::SERVICE_UID);
        let why = match (cluster, owner_uid) {
            (None, _) => "it carries no ownership tags of any cluster".to_string(),
            (Some(c), _) if !c.eq_ignore_ascii_case(&self.config.cluster_id) => {
                format!("it belongs to cluster {c}")
            }
            (Some(_), Some(u)) => format!("it belongs to the Service with UID {u}"),
            (Some(_), None) => "it names no Service".to_string(),
        };
        Ok(Owner::NotOurs(why))
    }

    /// The error for a load balancer of the Service's name that is not the Service's.
    fn not_ours(service: &Service, lb: &model::LoadBalancer, why: &str) -> ProviderError {
        invalid(
            &format!("Service {} annotation {}", service_key(service), annotations::VPC_LB_NAME),
            format!(
                "load balancer {} ({}) exists and was not created by this cluster for this \
                 Service ({why}): it is not used, changed or deleted; name another load \
                 balancer or remove the annotation",
                lb.name, lb.id
            ),
        )
    }

    /// The Service's load balancer when it exists and is the Service's; `NotOurs` is an
    /// error naming it.
    async fn find_ours(
        &self,
        naming: &Naming,
        service: &Service,
    ) -> Result<Option<model::LoadBalancer>, ProviderError> {
        let Some(lb) = self.find(naming.name()).await? else { return Ok(None) };
        match self.owner(naming, service, &lb).await? {
            Owner::Ours => Ok(Some(lb)),
            Owner::NotOurs(why) => Err(Self::not_ours(service, &lb, &why)),
        }
    }

    fn status(lb: &model::LoadBalancer) -> LoadBalancerStatus {
        let ingress = if !lb.hostname.is_empty() {
            vec![LoadBalancerIngress { hostname: Some(lb.hostname.clone()), ..Default::default() }]
        } else {
            let ips = if lb.is_public { &lb.public_ips } else { &lb.private_ips };
            ips.iter()
                .map(|a| LoadBalancerIngress { ip: Some(a.address.clone()), ..Default::default() })
                .collect()
        };
        LoadBalancerStatus { ingress: Some(ingress) }
    }

    /// Polls until the load balancer is `active`; `failed` is an error, a wait past
    /// [`Timings::max_wait`] a [`ProviderError::RetryAfter`].
    async fn wait_active(
        &self,
        id: &str,
        name: &str,
    ) -> Result<model::LoadBalancer, ProviderError> {
        let start = tokio::time::Instant::now();
        loop {
            let Some(lb) = self.client.get_load_balancer(id).await? else {
                return Err(ProviderError::other(format!(
                    "load balancer {name} ({id}) disappeared while waiting for it to become active"
                )));
            };
            if lb.is_active() {
                return Ok(lb);
            }
            if lb.provisioning_status == "failed" {
                return Err(ProviderError::other(format!(
                    "load balancer {name} ({id}) is {}: see the IBM Cloud console",
                    lb.status()
                )));
            }
            if start.elapsed() >= self.timings.max_wait {
                return Err(ProviderError::RetryAfter {
                    message: format!("load balancer {name} ({id}) is still {}", lb.status()),
                    delay: self.timings.poll.max(Duration::from_secs(1)) * 2,
                });
            }
            tracing::debug!(load_balancer = name, status = %lb.status(), "IBM: waiting for the load balancer to become active");
            tokio::time::sleep(self.timings.poll).await;
        }
    }

    /// The way out of a load balancer of the Service's that IBM left `failed` (nothing can
    /// change it but a delete): delete it, and ask for a retry, which creates it again once it
    /// is gone. The error names the load balancer and says what was done.
    async fn delete_failed(&self, lb: &model::LoadBalancer, service: &Service) -> ProviderError {
        tracing::warn!(service = %service_key(service), load_balancer = %lb.name, id = %lb.id, "IBM: the Service's load balancer is failed: deleting it to create it again");
        match self.client.delete_load_balancer(&lb.id).await {
            Ok(()) => ProviderError::RetryAfter {
                message: format!(
                    "load balancer {} ({}) is failed: deleted it; it is created again on the next sync",
                    lb.name, lb.id
                ),
                delay: self.timings.poll.max(Duration::from_secs(1)) * 2,
            },
            Err(e) => ProviderError::other(format!(
                "load balancer {} ({}) is failed and deleting it failed: {e}",
                lb.name, lb.id
            )),
        }
    }

    /// Polls until the load balancer is gone.
    async fn wait_gone(&self, id: &str, name: &str) -> Result<(), ProviderError> {
        let start = tokio::time::Instant::now();
        loop {
            let Some(lb) = self.client.get_load_balancer(id).await? else { return Ok(()) };
            if start.elapsed() >= self.timings.max_wait {
                return Err(ProviderError::RetryAfter {
                    message: format!("load balancer {name} ({id}) is still {}", lb.status()),
                    delay: self.timings.poll.max(Duration::from_secs(1)) * 2,
                });
            }
            tokio::time::sleep(self.timings.poll).await;
        }
    }

    /// The delay of the retry a pending load balancer asks for.
    fn requeue(&self) -> Duration {
        self.timings.poll.max(Duration::from_millis(50))
    }

    /// The retry a load balancer that is not `active` (pending, under maintenance) asks for:
    /// IBM refuses every change meanwhile, and nothing here waits it out.
    fn busy(&self, lb: &model::LoadBalancer) -> ProviderError {
        ProviderError::RetryAfter {
            message: format!(
                "load balancer {} ({}) is {}: changed once it is active again",
                lb.name,
                lb.id,
                lb.status()
            ),
            delay: self.requeue(),
        }
    }

    /// Maps a mutation's error: a 409 (the load balancer turned busy) asks for a retry.
    fn mutation_error(name: &str, e: ClientError) -> ProviderError {
        if e.is_conflict() {
            ProviderError::RetryAfter {
                message: format!("load balancer {name} is busy: {e}"),
                delay: Duration::from_secs(10),
            }
        } else {
            e.into()
        }
    }

    /// All subnets, those of the VPC, and the configured cluster subnets.
    async fn subnets(&self) -> Result<(Vec<model::Subnet>, Vec<model::Subnet>), ProviderError> {
        let all = self.client.list_subnets().await?;
        let cluster: Vec<model::Subnet> = all
            .iter()
            .filter(|s| {
                s.vpc.name == self.config.vpc_name && self.config.subnet_names.contains(&s.name)
            })
            .cloned()
            .collect();
        if cluster.is_empty() {
            return Err(ProviderError::other(format!(
                "none of the configured VPC subnets ([provider] g2VpcSubnetNames {}) were found in VPC {}",
                self.config.subnet_names.join(","),
                self.config.vpc_name
            )));
        }
        Ok((all, cluster))
    }

    /// The subnet IDs the subnets annotation names (IDs anywhere in the cluster's VPC;
    /// names and CIDRs within it), sorted.
    fn resolve_subnets(
        requested: &[String],
        all: &[model::Subnet],
        vpc_id: &str,
    ) -> Result<Vec<String>, ProviderError> {
        let mut ids = BTreeSet::new();
        for want in requested {
            if let Some(s) = all.iter().find(|s| &s.id == want) {
                if s.vpc.id != vpc_id {
                    return Err(invalid(
                        annotations::VPC_SUBNETS,
                        format!("subnet {want} is in a different VPC"),
                    ));
                }
                ids.insert(s.id.clone());
                continue;
            }
            match all
                .iter()
                .find(|s| s.vpc.id == vpc_id && (&s.name == want || &s.ipv4_cidr_block == want))
            {
                Some(s) => {
                    ids.insert(s.id.clone());
                }
                None => {
                    return Err(invalid(
                        annotations::VPC_SUBNETS,
                        format!("{want} is not a subnet (ID, name or CIDR) of the cluster's VPC"),
                    ));
                }
            }
        }
        Ok(ids.into_iter().collect())
    }

    /// Creates the load balancer and returns it as IBM answered (`create_pending`, with its
    /// hostname); `tags`: the ownership tags to attach right away (annotated names).
    async fn create(
        &self,
        name: &str,
        tags: Option<Vec<String>>,
        service: &Service,
        options: &ServiceOptions,
        nodes: &[Node],
    ) -> Result<model::LoadBalancer, ProviderError> {
        let (all, cluster) = self.subnets().await?;
        let vpc_id = cluster[0].vpc.id.clone();
        let subnet_ids: Vec<String> = if let Some(requested) = &options.subnets {
            Self::resolve_subnets(requested, &all, &vpc_id)?
        } else if let Some(zone) = &options.zone {
            let ids: Vec<String> =
                cluster.iter().filter(|s| &s.zone.name == zone).map(|s| s.id.clone()).collect();
            if ids.is_empty() {
                return Err(invalid(
                    annotations::ZONE,
                    format!("{zone}: there are no cluster subnets in that zone"),
                ));
            }
            ids
        } else {
            cluster.iter().map(|s| s.id.clone()).collect()
        };
        let ips = member_ips(nodes, options);
        if ips.is_empty() {
            return Err(ProviderError::other(format!(
                "there are no available nodes for Service {}",
                service_key(service)
            )));
        }
        let rg = self.client.resource_group_id().await?;
        let body = create_body(name, options, &ips, &subnet_ids, &rg);
        tracing::info!(service = %service_key(service), load_balancer = name, public = options.public, subnets = %subnet_ids.join(","), members = %ips.join(","), "IBM: creating VPC load balancer");
        let lb = self
            .client
            .create_load_balancer(body)
            .await
            .map_err(|e| Self::mutation_error(name, e))?;
        self.index_created(&lb);
        // No wait: IBM assigned the hostname with the create; the load balancer provisions
        // on its own (created with its listeners, pools and members inline).
        let Some(tags) = tags else { return Ok(lb) };
        // Recorded before anything else can fail: until the tags are attached, this record
        // is the proof that this process created it for this Service. Global Tagging tags a
        // CRN whatever the load balancer's provisioning status, so no wait here either.
        let uid = service.metadata.uid.as_deref().unwrap_or_default();
        self.set_unmarked(&lb.id, Some(uid));
        if lb.crn.is_empty() {
            return Err(ProviderError::other(format!(
                "load balancer {name} ({}) was created without a CRN: it cannot be tagged as this Service's",
                lb.id
            )));
        }
        self.client.attach_tags(&lb.crn, &tags).await.map_err(|e| {
            ProviderError::other(format!(
                "load balancer {name} ({}) was created, but attaching its ownership tags failed \
                 (tried again on the next sync): {e}",
                lb.id
            ))
        })?;
        self.set_unmarked(&lb.id, None);
        tracing::info!(service = %service_key(service), load_balancer = name, tags = %tags.join(","), "IBM: ownership tags attached");
        Ok(lb)
    }

    async fn update(
        &self,
        lb: model::LoadBalancer,
        service: &Service,
        options: &ServiceOptions,
        nodes: &[Node],
    ) -> Result<model::LoadBalancer, ProviderError> {
        let name = lb.name.clone();
        if options.public != lb.is_public {
            let was = if lb.is_public { "public" } else { "private" };
            return Err(invalid(
                annotations::IP_TYPE,
                format!(
                    "load balancer {name} was created as a {was} load balancer; this cannot be changed"
                ),
            ));
        }
        if let Some(requested) = &options.subnets {
            let (all, cluster) = self.subnets().await?;
            let vpc_id = all
                .iter()
                .find(|s| lb.subnets.iter().any(|r| r.id == s.id))
                .map(|s| s.vpc.id.clone())
                .unwrap_or_else(|| cluster[0].vpc.id.clone());
            let want = Self::resolve_subnets(requested, &all, &vpc_id)?;
            let have: BTreeSet<String> = lb.subnets.iter().map(|s| s.id.clone()).collect();
            if want.iter().cloned().collect::<BTreeSet<_>>() != have {
                return Err(invalid(
                    annotations::VPC_SUBNETS,
                    format!(
                        "load balancer {name} was created with subnets {}; this cannot be changed",
                        have.into_iter().collect::<Vec<_>>().join(",")
                    ),
                ));
            }
        }
        let ips = member_ips(nodes, options);
        if ips.is_empty() {
            return Err(ProviderError::other(format!(
                "there are no available nodes for Service {}",
                service_key(service)
            )));
        }
        // What IBM is deleting counts as gone: planning it again would send its delete again
        // (which starts IBM's deletion over), and a step that needs it gone first (a pool
        // whose listener is going) gets IBM's 409, a retry.
        let going = |status: &str| status == "delete_pending";
        let listeners: Vec<model::Listener> = self
            .client
            .list_listeners(&lb.id)
            .await?
            .into_iter()
            .filter(|l| !going(&l.provisioning_status))
            .collect();
        let mut pools = Vec::new();
        for pool in self.client.list_pools(&lb.id).await? {
            if going(&pool.provisioning_status) {
                continue;
            }
            let members: Vec<model::Member> = self
                .client
                .list_members(&lb.id, &pool.id)
                .await?
                .into_iter()
                .filter(|m| !going(&m.provisioning_status))
                .collect();
            pools.push((pool, members));
        }
        let steps = plan(options, &ips, &listeners, &pools)?;
        if steps.is_empty() {
            return Ok(lb);
        }
        tracing::info!(service = %service_key(service), load_balancer = %name, steps = ?steps, "IBM: updating VPC load balancer");
        // Pools by (protocol, port) for new listeners.
        let mut pool_ids: BTreeMap<(String, i64), String> = pools
            .iter()
            .filter_map(|(p, _)| {
                parse_pool_name(&p.name).map(|(pr, port, _)| ((pr, i64::from(port)), p.id.clone()))
            })
            .collect();
        let id = lb.id.clone();
        // The load balancer is active here. One step, then it is `update_pending` for a
        // while: the remaining steps are left to the retry this asks for (nothing waits).
        let remaining = steps.len() - 1;
        if let Some(step) = steps.into_iter().next() {
            let err = |e| Self::mutation_error(&name, e);
            match &step {
                Step::DeleteListener { id: l, .. } => {
                    self.client.delete_listener(&id, l).await.map_err(err)?
                }
                Step::DeletePool { id: p, .. } => {
                    self.client.delete_pool(&id, p).await.map_err(err)?;
                    pool_ids.retain(|_, v| v != p);
                }
                Step::DeleteMember { pool, id: m, .. } => {
                    self.client.delete_member(&id, pool, m).await.map_err(err)?
                }
                Step::UpdatePool { id: p, port } => {
                    let patch = json!({
                        "name": port.pool_name(),
                        "health_monitor": health_monitor(options, port.node_port),
                        "proxy_protocol": proxy_protocol(options),
                    });
                    self.client.update_pool(&id, p, patch).await.map_err(err)?;
                }
                Step::ReplaceMembers { id: p, port } => {
                    self.client
                        .replace_members(&id, p, members(&ips, port.node_port))
                        .await
                        .map_err(err)?;
                }
                Step::CreateMember { pool, address, node_port } => {
                    let body = json!({"port": node_port, "target": {"address": address}});
                    self.client.create_member(&id, pool, body).await.map_err(err)?;
                }
                Step::CreatePool { port } => {
                    let pool = self
                        .client
                        .create_pool(&id, pool_prototype(options, port, &ips))
                        .await
                        .map_err(err)?;
                    pool_ids.insert((port.protocol.clone(), i64::from(port.port)), pool.id);
                }
                Step::CreateListener { port } => {
                    let Some(pool) = pool_ids.get(&(port.protocol.clone(), i64::from(port.port)))
                    else {
                        return Err(ProviderError::other(format!(
                            "load balancer {name}: no pool {} for the listener on port {}",
                            port.pool_name(),
                            port.port
                        )));
                    };
                    let body = json!({
                        "connection_limit": CONNECTION_LIMIT,
                        "port": port.port,
                        "protocol": port.protocol,
                        "default_pool": {"id": pool},
                    });
                    self.client.create_listener(&id, body).await.map_err(err)?;
                }
            }
        }
        if remaining > 0 {
            return Err(ProviderError::RetryAfter {
                message: format!(
                    "load balancer {name} ({id}): applied one change, {remaining} more once it \
                     is active again"
                ),
                delay: self.requeue(),
            });
        }
        Ok(lb)
    }
}

#[async_trait]
impl LoadBalancer for IbmLoadBalancer {
    /// The status of the Service's load balancer when it exists and is the Service's; a load
    /// balancer of that name that is not the Service's is reported as none (its address is
    /// never shown as this Service's).
    async fn get_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        let Ok(naming) = naming(service, &self.config.cluster_id) else { return Ok(None) };
        let Some(lb) = self.find(naming.name()).await? else { return Ok(None) };
        Ok(match self.owner(&naming, service, &lb).await? {
            Owner::Ours => Some(Self::status(&lb)),
            Owner::NotOurs(_) => None,
        })
    }

    fn load_balancer_name(&self, _cluster_name: &str, service: &Service) -> String {
        load_balancer_name(service, &self.config.cluster_id)
    }

    async fn ensure_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        let options = service_options(service)?;
        let naming = naming(service, &self.config.cluster_id)?;
        let name = naming.name().to_string();
        let lb = match self.find_ours(&naming, service).await? {
            None => {
                let tags = match &naming {
                    Naming::Annotated(_) => Some(owner_tags(&self.config.cluster_id, service)?),
                    Naming::Generated(_) => None,
                };
                let lb = self.create(&name, tags, service, &options, nodes).await?;
                return Ok(Self::status(&lb));
            }
            Some(lb) if lb.is_active() => lb,
            Some(lb) if lb.provisioning_status == "failed" => {
                return Err(self.delete_failed(&lb, service).await);
            }
            Some(lb) => return Err(self.busy(&lb)),
        };
        let lb = self.update(lb, service, &options, nodes).await?;
        Ok(Self::status(&lb))
    }

    async fn update_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<(), ProviderError> {
        let options = service_options(service)?;
        let naming = naming(service, &self.config.cluster_id)?;
        let name = naming.name().to_string();
        let lb = match self.find_ours(&naming, service).await? {
            None => {
                tracing::warn!(service = %service_key(service), load_balancer = %name, "IBM: load balancer not found for update");
                return Ok(());
            }
            Some(lb) if lb.is_active() => lb,
            // The service controller re-queues the Service for a full ensure.
            Some(lb) => return Err(self.busy(&lb)),
        };
        self.update(lb, service, &options, nodes).await.map(|_| ())
    }

    /// Deletes the Service's load balancer when it is the Service's: sends the delete and
    /// asks for a retry ([`ProviderError::RetryAfter`]) until IBM no longer lists it, so the
    /// Service's finalizer goes only once it is gone, and no worker waits meanwhile. A pending
    /// load balancer (IBM refuses its deletion then) asks for a retry too. A load balancer of
    /// the Service's name that is not its own is left as it is (a warning names it) and the
    /// deletion succeeds: nothing of the Service's own exists. A failed ownership check is an
    /// error (nothing is deleted).
    async fn ensure_load_balancer_deleted(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<(), ProviderError> {
        let naming = match naming(service, &self.config.cluster_id) {
            Ok(n) => n,
            Err(e) => {
                // A reserved annotated name: this provider never created anything under it.
                tracing::warn!(service = %service_key(service), error = %e, "IBM: nothing to delete");
                return Ok(());
            }
        };
        let name = naming.name().to_string();
        let Some(lb) = self.find(&name).await? else { return Ok(()) };
        if let Owner::NotOurs(why) = self.owner(&naming, service, &lb).await? {
            tracing::warn!(service = %service_key(service), load_balancer = %name, id = %lb.id, reason = %why, "IBM: load balancer of the Service's name was not created for this Service: not deleting it");
            return Ok(());
        }
        if lb.provisioning_status != "delete_pending" {
            if !lb.is_active() && lb.provisioning_status != "failed" {
                return Err(self.busy(&lb));
            }
            tracing::info!(service = %service_key(service), load_balancer = %name, "IBM: deleting VPC load balancer");
            self.client
                .delete_load_balancer(&lb.id)
                .await
                .map_err(|e| Self::mutation_error(&name, e))?;
            self.set_unmarked(&lb.id, None);
        }
        // Not gone yet: a retry, not a wait; the Service keeps its finalizer until it is.
        Err(ProviderError::RetryAfter {
            message: format!(
                "load balancer {name} ({}) is being deleted by IBM: done once it is gone",
                lb.id
            ),
            delay: self.requeue(),
        })
    }

    /// Every VPC load balancer the account shows; owned when it carries the same proof the
    /// controller uses: the generated name `kube-<clusterID>-...` (no annotation may take
    /// such a name), or this cluster's ownership tag (annotated names; the Service comes from
    /// its `ccm-service:` tag). A load balancer whose tags cannot be read counts as not owned
    /// (a warning names it). Their public IPs go with them.
    async fn list_cloud_load_balancers(
        &self,
        _cluster_name: &str,
    ) -> Result<Vec<CloudLoadBalancer>, ProviderError> {
        let all = self.client.list_load_balancers().await?;
        let mut out = Vec::with_capacity(all.len());
        for lb in &all {
            let (owned, service) = match self.ownership(lb).await {
                Ok(o) => o,
                Err(e) => {
                    tracing::warn!(load_balancer = %lb.name, id = %lb.id, error = %e, "IBM: ownership tags cannot be read: counted as not owned");
                    (false, None)
                }
            };
            out.push(Self::inventory_entry(lb, owned, service));
        }
        Ok(out)
    }

    /// Deletes an owned VPC load balancer (looked up again by ID and its ownership proved
    /// again; gone already: `Ok`) and waits until it is gone.
    async fn delete_cloud_load_balancer(
        &self,
        _cluster_name: &str,
        lb: &CloudLoadBalancer,
    ) -> Result<(), ProviderError> {
        let Some(fresh) = self.client.get_load_balancer(&lb.id).await? else { return Ok(()) };
        let (owned, _) = self.ownership(&fresh).await?;
        if !owned || fresh.name != lb.name {
            return Err(ProviderError::Invalid {
                what: format!("load balancer {}", fresh.name),
                message: format!(
                    "neither named {} nor tagged {}{}: not owned by this cluster, refusing to delete it",
                    self.owned_prefix(),
                    tags::CLUSTER,
                    self.config.cluster_id
                ),
            });
        }
        let name = fresh.name.clone();
        if fresh.provisioning_status != "delete_pending" {
            if !fresh.is_active() && fresh.provisioning_status != "failed" {
                self.wait_active(&fresh.id, &name).await?;
            }
            tracing::info!(load_balancer = %name, "IBM: deleting orphaned VPC load balancer");
            self.client
                .delete_load_balancer(&fresh.id)
                .await
                .map_err(|e| Self::mutation_error(&name, e))?;
        }
        self.wait_gone(&fresh.id, &name).await
    }
}

impl IbmLoadBalancer {
    /// `kube-<clusterID>-`: the name prefix of the load balancers this cluster creates.
    pub(crate) fn owned_prefix(&self) -> String {
        format!("{NAME_PREFIX}-{}-", self.config.cluster_id)
    }

    /// The cluster ID of the config.
    pub fn cluster_id(&self) -> &str {
        &self.config.cluster_id
    }

    /// The IBM Cloud client.
    pub fn client(&self) -> &Arc<IbmClient> {
        &self.client
    }

    /// Whether `lb`, found under the Service's name, is the Service's (the proof of
    /// [`naming`]: generated name, or this cluster's and this Service's tags).
    pub(crate) async fn is_services(
        &self,
        naming: &Naming,
        service: &Service,
        lb: &model::LoadBalancer,
    ) -> Result<bool, ProviderError> {
        Ok(self.owner(naming, service, lb).await? == Owner::Ours)
    }

    /// The Service UID `lb`'s ownership tags name when they also name this cluster; `None`
    /// when it carries no such tags (not this cluster's by tags).
    pub(crate) async fn owner_uid(
        &self,
        lb: &model::LoadBalancer,
    ) -> Result<Option<String>, ProviderError> {
        if self.config.cluster_id.is_empty() || lb.crn.is_empty() {
            return Ok(None);
        }
        let have = self.client.list_tags(&lb.crn).await?;
        let ours = tag_value(&have, tags::CLUSTER)
            .is_some_and(|c| c.eq_ignore_ascii_case(&self.config.cluster_id));
        Ok(tag_value(&have, tags::SERVICE_UID)
            .filter(|u| ours && !u.is_empty())
            .map(str::to_ascii_lowercase))
    }

    /// The monitor's delete of an orphan: read again by ID, proved this cluster's again by
    /// the same proof (generated name, or this cluster's tags naming the same Service UID),
    /// then deleted without waiting. Gone already: `Ok`.
    pub(crate) async fn delete_orphan(
        &self,
        lb: &model::LoadBalancer,
        tagged_uid: Option<&str>,
    ) -> Result<(), ProviderError> {
        let Some(fresh) = self.client.get_load_balancer(&lb.id).await? else { return Ok(()) };
        let proven = fresh.name == lb.name
            && match tagged_uid {
                None => fresh.name.starts_with(&self.owned_prefix()),
                Some(uid) => self.owner_uid(&fresh).await?.as_deref() == Some(uid),
            };
        if !proven {
            return Err(ProviderError::other(format!(
                "load balancer {} ({}) changed since it was listed: not deleting it",
                fresh.name, fresh.id
            )));
        }
        if fresh.provisioning_status == "delete_pending" {
            return Ok(());
        }
        if !fresh.is_active() && fresh.provisioning_status != "failed" {
            return Err(self.busy(&fresh));
        }
        self.client
            .delete_load_balancer(&fresh.id)
            .await
            .map_err(|e| Self::mutation_error(&fresh.name, e))?;
        self.set_unmarked(&fresh.id, None);
        Ok(())
    }

    /// Whether this cluster created `lb` (generated name, or this cluster's ownership tag),
    /// and the `<namespace>/<name>` its tags record.
    async fn ownership(
        &self,
        lb: &model::LoadBalancer,
    ) -> Result<(bool, Option<String>), ProviderError> {
        if self.config.cluster_id.is_empty() {
            return Ok((false, None));
        }
        if lb.name.starts_with(&self.owned_prefix()) {
            return Ok((true, None));
        }
        if lb.crn.is_empty() {
            return Ok((false, None));
        }
        let have = self.client.list_tags(&lb.crn).await?;
        let owned = tag_value(&have, tags::CLUSTER)
            .is_some_and(|c| c.eq_ignore_ascii_case(&self.config.cluster_id))
            && tag_value(&have, tags::SERVICE_UID).is_some();
        let service = owned
            .then(|| tag_value(&have, tags::SERVICE))
            .flatten()
            .and_then(|v| v.split_once('.'))
            .map(|(ns, name)| format!("{ns}/{name}"));
        Ok((owned, service))
    }

    fn inventory_entry(
        lb: &model::LoadBalancer,
        owned: bool,
        service: Option<String>,
    ) -> CloudLoadBalancer {
        let mut ingress: Vec<String> = Vec::new();
        if !lb.hostname.is_empty() {
            ingress.push(lb.hostname.clone());
        }
        let ips = if lb.is_public { &lb.public_ips } else { &lb.private_ips };
        ingress.extend(ips.iter().map(|a| a.address.clone()));
        CloudLoadBalancer {
            name: lb.name.clone(),
            kind: "VPC load balancer".into(),
            id: lb.id.clone(),
            ingress,
            owned,
            service,
            resources: lb
                .public_ips
                .iter()
                .map(|a| CloudResource {
                    kind: "public IP".into(),
                    id: a.address.clone(),
                    name: String::new(),
                })
                .collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus, ServicePort, ServiceSpec};
    use kube::api::ObjectMeta;

    fn service(
        annotations: &[(&str, &str)],
        ports: &[(i32, i32)],
        local_hc: Option<i32>,
    ) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("6f7f1b2c-1234-5678-9abc-def012345678".into()),
                annotations: Some(
                    annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                ),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(p, np)| ServicePort {
                            port: *p,
                            node_port: Some(*np),
                            protocol: Some("TCP".into()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                external_traffic_policy: Some(
                    if local_hc.is_some() { "Local" } else { "Cluster" }.into(),
                ),
                health_check_node_port: local_hc,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(name: &str, labels: &[(&str, &str)], internal: Option<&str>) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            status: internal.map(|ip| NodeStatus {
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: ip.into(),
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn names_follow_upstream() {
        let svc = service(&[], &[(80, 30080)], None);
        assert_eq!(
            load_balancer_name(&svc, "clus1"),
            "kube-clus1-6f7f1b2c123456789abcdef012345678"
        );
        let long = "c".repeat(40);
        let name = load_balancer_name(&svc, &long);
        assert_eq!(name.len(), 63);
        assert!(name.starts_with(&format!("kube-{long}-6f7f1b2c")));
        let named = service(&[(annotations::VPC_LB_NAME, "my-lb")], &[(80, 30080)], None);
        assert_eq!(load_balancer_name(&named, "clus1"), "my-lb");
        assert_eq!(pool_name("TCP", 80, 30080), "tcp-80-30080");
        assert_eq!(parse_pool_name("tcp-80-30080"), Some(("tcp".into(), 80, 30080)));
        assert_eq!(parse_pool_name("http-80-30080"), None);
        assert_eq!(parse_pool_name("tcp-80"), None);
    }

    #[test]
    fn annotated_names_of_the_generated_form_are_refused_and_tags_name_cluster_and_service() {
        let own = service(&[], &[(80, 30080)], None);
        assert_eq!(
            naming(&own, "clus1").unwrap(),
            Naming::Generated("kube-clus1-6f7f1b2c123456789abcdef012345678".into())
        );
        let same = service(
            &[(annotations::VPC_LB_NAME, "kube-clus1-6f7f1b2c123456789abcdef012345678")],
            &[(80, 30080)],
            None,
        );
        assert!(matches!(naming(&same, "clus1").unwrap(), Naming::Generated(_)));
        let mine = service(&[(annotations::VPC_LB_NAME, " my-lb ")], &[(80, 30080)], None);
        assert_eq!(naming(&mine, "clus1").unwrap(), Naming::Annotated("my-lb".into()));
        assert_eq!(naming(&mine, "clus1").unwrap().name(), "my-lb");
        for reserved in [
            "kube-clus1-0a0a0a0a111122223333444444444444",
            "kube-clus1-anything",
            "kube-clus2-0a0a0a0a111122223333444444444444",
            "kube-c-0a0a0a0a",
        ] {
            let svc = service(&[(annotations::VPC_LB_NAME, reserved)], &[(80, 30080)], None);
            let e = naming(&svc, "clus1").unwrap_err().to_string();
            assert!(e.contains(annotations::VPC_LB_NAME) && e.contains("reserved"), "{e}");
        }
        for free in ["kube-other-web", "web-lb", "kube"] {
            assert!(!has_generated_form(free), "{free}");
        }
        let long = "a".repeat(64);
        for not_a_name in [
            "r006-dbc3865e-d8e5-4b4a-839a-21ba00d6e2ae",
            "76d1aae9-us-south.lb.appdomain.cloud",
            "My-LB",
            "1lb",
            "lb-",
            long.as_str(),
        ] {
            let svc = service(&[(annotations::VPC_LB_NAME, not_a_name)], &[(80, 30080)], None);
            let e = naming(&svc, "clus1").unwrap_err().to_string();
            assert!(e.contains(annotations::VPC_LB_NAME) && e.contains("exact name"), "{e}");
        }

        let tags = owner_tags("clus1", &mine).unwrap();
        assert_eq!(
            tags,
            [
                "ccm-cluster:clus1",
                "ccm-service-uid:6f7f1b2c-1234-5678-9abc-def012345678",
                "ccm-service:default.web"
            ]
        );
        assert!(tags.iter().all(|t| is_valid_tag(t)));
        assert_eq!(tag_value(&tags, "CCM-SERVICE:"), Some("default.web"));
        assert!(owner_tags("clus/1", &mine).unwrap_err().to_string().contains("clusterID"));
        let mut no_uid = mine.clone();
        no_uid.metadata.uid = None;
        assert!(owner_tags("clus1", &no_uid).is_err());
    }

    #[test]
    fn every_documented_annotation_example_is_accepted() {
        for a in ANNOTATIONS {
            let svc = service(&[(a.key, a.example)], &[(80, 30080)], None);
            if let Err(e) = service_options(&svc) {
                panic!("{} = {}: {e:?}", a.key, a.example);
            }
        }
    }

    #[test]
    fn annotations_are_read_and_bad_values_named() {
        let o = service_options(&service(&[], &[(80, 30080)], None)).unwrap();
        assert!(o.public && !o.proxy_protocol && o.health_check_node_port.is_none());
        let o = service_options(&service(
            &[
                (annotations::IP_TYPE, "private"),
                (annotations::ENABLE_FEATURES, "Proxy-Protocol"),
                (annotations::ZONE, " us-south-1 "),
            ],
            &[(80, 30080)],
            Some(31000),
        ))
        .unwrap();
        assert!(!o.public && o.proxy_protocol);
        assert_eq!(o.zone.as_deref(), Some("us-south-1"));
        assert_eq!(o.health_check_node_port, Some(31000));
        let e =
            service_options(&service(&[(annotations::IP_TYPE, "internet")], &[(80, 30080)], None))
                .unwrap_err();
        assert!(e.to_string().contains(annotations::IP_TYPE), "{e}");
        let e = service_options(&service(
            &[(annotations::VPC_NODE_SELECTOR, "color=blue")],
            &[(80, 30080)],
            None,
        ))
        .unwrap_err();
        assert!(e.to_string().contains(annotations::VPC_NODE_SELECTOR), "{e}");
        let o = service_options(&service(
            &[(annotations::VPC_NODE_SELECTOR, "ibm-cloud.kubernetes.io/worker-pool-name = edge")],
            &[(80, 30080)],
            None,
        ))
        .unwrap();
        assert_eq!(
            o.node_selector,
            Some(("ibm-cloud.kubernetes.io/worker-pool-name".into(), "edge".into()))
        );
        let mut udp = service(&[], &[(53, 30053)], None);
        udp.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
        assert!(service_options(&udp).unwrap_err().to_string().contains("only TCP"));
    }

    #[test]
    fn members_are_filtered_as_upstream() {
        let nodes = vec![
            node("a", &[(labels::ZONE, "z1"), (labels::INTERNAL_IP, "10.0.0.1")], None),
            node("b", &[(labels::ZONE, "z2")], Some("10.0.1.1")),
            node("c", &[(labels::ZONE, "z1"), ("dedicated", "edge")], Some("10.0.0.3")),
            node("d", &[], None),
        ];
        let base = service_options(&service(&[], &[(80, 30080)], None)).unwrap();
        // An edge node exists: only edge nodes.
        assert_eq!(member_ips(&nodes, &base), vec!["10.0.0.3"]);
        let no_edge = &nodes[..2];
        assert_eq!(member_ips(no_edge, &base), vec!["10.0.0.1", "10.0.1.1"]);
        let zoned = ServiceOptions { zone: Some("z2".into()), ..base.clone() };
        assert_eq!(member_ips(&nodes, &zoned), vec!["10.0.1.1"]);
        let selected =
            ServiceOptions { node_selector: Some((labels::ZONE.into(), "z1".into())), ..base };
        assert_eq!(member_ips(&nodes, &selected), vec!["10.0.0.1", "10.0.0.3"]);
    }

    #[test]
    fn the_create_body_has_a_listener_and_pool_per_port() {
        let o = service_options(&service(&[], &[(80, 30080), (443, 30443)], None)).unwrap();
        let body = create_body("kube-c-u", &o, &["10.0.0.1".into()], &["s1".into()], "rg1");
        assert_eq!(body["is_public"], true);
        assert_eq!(body["pools"][1]["name"], "tcp-443-30443");
        assert_eq!(
            body["pools"][0]["health_monitor"],
            json!({"delay": 5, "max_retries": 2, "timeout": 2, "type": "tcp", "port": 30080})
        );
        assert_eq!(
            body["pools"][0]["members"],
            json!([{"port": 30080, "target": {"address": "10.0.0.1"}}])
        );
        assert_eq!(
            body["listeners"][1],
            json!({"connection_limit": 15000, "default_pool": {"name": "tcp-443-30443"}, "port": 443, "protocol": "tcp"})
        );
        assert_eq!(body["resource_group"]["id"], "rg1");
        let local = service_options(&service(&[], &[(80, 30080)], Some(31000))).unwrap();
        let body = create_body("n", &local, &[], &[], "rg");
        assert_eq!(body["pools"][0]["health_monitor"]["type"], "http");
        assert_eq!(body["pools"][0]["health_monitor"]["port"], 31000);
        assert_eq!(body["pools"][0]["health_monitor"]["url_path"], "/");
    }

    fn pool(id: &str, name: &str, hm_port: i64) -> model::Pool {
        model::Pool {
            id: id.into(),
            name: name.into(),
            proxy_protocol: "disabled".into(),
            health_monitor: model::HealthMonitor {
                kind: "tcp".into(),
                port: Some(hm_port),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn member(id: &str, ip: &str, port: i64) -> model::Member {
        model::Member {
            id: id.into(),
            port,
            target: model::MemberTarget { address: ip.into(), id: String::new() },
            ..Default::default()
        }
    }

    fn listener(id: &str, port: i64) -> model::Listener {
        model::Listener { id: id.into(), port, protocol: "tcp".into(), ..Default::default() }
    }

    #[test]
    fn plans_follow_upstreams_steps() {
        let o = service_options(&service(&[], &[(80, 30080)], None)).unwrap();
        let ips: Vec<String> = vec!["10.0.0.1".into(), "10.0.0.2".into()];
        let steady = vec![(
            pool("p1", "tcp-80-30080", 30080),
            vec![member("m1", "10.0.0.1", 30080), member("m2", "10.0.0.2", 30080)],
        )];
        assert_eq!(plan(&o, &ips, &[listener("l1", 80)], &steady).unwrap(), vec![]);
        // One node gone: one member delete; one added: one create; both: a replace.
        let one_gone = plan(&o, &ips[..1], &[listener("l1", 80)], &steady).unwrap();
        assert_eq!(
            one_gone,
            vec![Step::DeleteMember {
                pool: "p1".into(),
                id: "m2".into(),
                address: "10.0.0.2".into()
            }]
        );
        let three: Vec<String> = vec!["10.0.0.1".into(), "10.0.0.2".into(), "10.0.0.3".into()];
        let added = plan(&o, &three, &[listener("l1", 80)], &steady).unwrap();
        assert_eq!(
            added,
            vec![Step::CreateMember {
                pool: "p1".into(),
                address: "10.0.0.3".into(),
                node_port: 30080
            }]
        );
        let swapped: Vec<String> = vec!["10.0.0.1".into(), "10.0.0.9".into()];
        assert!(matches!(
            plan(&o, &swapped, &[listener("l1", 80)], &steady).unwrap()[..],
            [Step::ReplaceMembers { .. }]
        ));
        // Node port changed: update pool and replace members.
        let moved = service_options(&service(&[], &[(80, 31080)], None)).unwrap();
        let steps = plan(&moved, &ips, &[listener("l1", 80)], &steady).unwrap();
        assert!(
            matches!(&steps[..], [Step::UpdatePool { .. }, Step::ReplaceMembers { .. }]),
            "{steps:?}"
        );
        // Port 80 replaced by 8080: delete listener and pool first, create pool then listener.
        let other = service_options(&service(&[], &[(8080, 30080)], None)).unwrap();
        let steps = plan(&other, &ips, &[listener("l1", 80)], &steady).unwrap();
        let kinds: Vec<u8> = steps.iter().map(Step::order).collect();
        assert_eq!(kinds, vec![0, 1, 6, 7], "{steps:?}");
        // ETP Local: health monitor update.
        let local = service_options(&service(&[], &[(80, 30080)], Some(31000))).unwrap();
        assert!(matches!(
            plan(&local, &ips, &[listener("l1", 80)], &steady).unwrap()[..],
            [Step::UpdatePool { .. }]
        ));
        // A foreign pool is an error naming it.
        let foreign = vec![(pool("p9", "my-pool", 1), vec![])];
        assert!(plan(&o, &ips, &[], &foreign).unwrap_err().to_string().contains("my-pool"));
    }
}
