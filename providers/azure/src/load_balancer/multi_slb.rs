//! Multiple standard load balancers (`multipleStandardLoadBalancerConfigurations`), as
//! upstream's multi-SLB mode (cloud-provider-azure v1.36):
//!
//! - **Configurations**: one per public load balancer (`name`; its internal twin is
//!   `<name>-internal` and shares the configuration), each with a `primaryVMSet` (required,
//!   one load balancer per VM set), `allowServicePlacement` (default true),
//!   `serviceLabelSelector`, `serviceNamespaceSelector` and `nodeSelector` (Kubernetes label
//!   selectors: `matchLabels`, `matchExpressions`). One must be named after the cluster (or
//!   `loadBalancerName`). Pools list node IPs (`loadBalancerBackendPoolConfigurationType:
//!   nodeIP`), as upstream requires.
//! - **Service placement** ([`eligible`], [`most_eligible`]): the
//!   `azure-load-balancer-configurations` annotation narrows the candidates; a configuration
//!   with `allowServicePlacement: false` takes no new Service; selectors must match the
//!   Service's labels and its namespace's labels; configurations without selectors are
//!   candidates only when no selector matched. Among candidates the load balancer already
//!   holding the Service wins (upstream records placement only in where the Service's
//!   `a<uid>` frontend and rules are); else an existing one without rules, else one not
//!   created yet, else the one with fewest rules.
//! - **Nodes** ([`assign_nodes`]): each Node is in exactly one load balancer's pool: the one
//!   whose `primaryVMSet` holds it; else among those whose non-empty `nodeSelector` matches
//!   it (else those with an empty one) it stays where it is, or goes to the one with fewest
//!   Nodes. Only load balancers that exist (or are being created) take Nodes. A Node none
//!   takes is a Warning `FailedToFindLoadBalancerForNode` on the Service being synced.
//! - **Local Services** ([`local_members`], [`AzureLoadBalancer::local_pool_pass`]): an
//!   `externalTrafficPolicy: Local` Service has its own pool `<namespace>-<name>` on its load
//!   balancer, holding the backend Nodes with its endpoints (its EndpointSlices), set by each
//!   sync and kept in step every `loadBalancerBackendPoolUpdateIntervalInSeconds`.

use std::collections::{BTreeMap, BTreeSet};

use ccm_core::cloud::ProviderError;
use ccm_core::controllers::events::{EventRecorder, publish};
use k8s_openapi::api::core::v1::{Namespace, Node, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::events::{EventType, Reporter};
use serde_json::Value;
use tracing::{debug, info, warn};

use super::annotations::{self, Family, ServiceConfig};
use super::frontend::{self, Target};
use super::{AzureLoadBalancer, naming};
use crate::client::api_version::COMPUTE;
use crate::client::models::{LoadBalancer as ArmLoadBalancer, PublicIpAddress, VirtualMachine};
use crate::provider_id::VmRef;

/// An entry of `multipleStandardLoadBalancerConfigurations`, checked.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbConfig {
    /// The public load balancer's name (the internal one is `<name>-internal`).
    pub name: String,
    /// Whether new Services may be placed on it (default true).
    pub allow_service_placement: bool,
    /// The VM set whose Nodes are always in its pool.
    pub primary_vm_set: String,
    /// Services must match this (absent: any).
    pub service_label_selector: Option<Selector>,
    /// The Service's namespace must match this (absent: any).
    pub service_namespace_selector: Option<Selector>,
    /// Nodes it prefers (absent or empty: none in particular).
    pub node_selector: Option<Selector>,
}

impl LbConfig {
    fn has_service_selector(&self) -> bool {
        self.service_label_selector.is_some() || self.service_namespace_selector.is_some()
    }
}

/// A Kubernetes label selector (`matchLabels` and `matchExpressions`, all must hold).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Selector {
    match_labels: BTreeMap<String, String>,
    expressions: Vec<Expression>,
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Expression {
    key: String,
    op: Op,
    values: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

impl Selector {
    /// Neither labels nor expressions (matches everything).
    pub fn is_empty(&self) -> bool {
        self.match_labels.is_empty() && self.expressions.is_empty()
    }

    /// Whether `labels` satisfy the selector.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.match_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            && self.expressions.iter().all(|e| {
                let v = labels.get(&e.key);
                match e.op {
                    Op::In => v.is_some_and(|v| e.values.contains(v)),
                    Op::NotIn => v.is_none_or(|v| !e.values.contains(v)),
                    Op::Exists => v.is_some(),
                    Op::DoesNotExist => v.is_none(),
                }
            })
    }
}

/// What is wrong with the configurations: the entry (index and name) and the field.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("entry {index}{}: {field}: {message}", name.as_ref().map(|n| format!(" ({n:?})")).unwrap_or_default())]
pub struct ConfigurationError {
    /// The entry's index in the list.
    pub index: usize,
    /// The entry's name, when it has one.
    pub name: Option<String>,
    /// The field (`name`, `primaryVMSet`, `nodeSelector.matchExpressions[0].operator`, …).
    pub field: String,
    /// Why.
    pub message: String,
}

/// A field of a JSON object, its key matched case-insensitively (as Go's `encoding/json`).
fn field<'a>(obj: &'a serde_json::Map<String, Value>, key: &str) -> Option<&'a Value> {
    obj.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v)
}

/// Upstream's fields of an entry; `activeServices` / `activeNodes` are upstream's runtime
/// status, accepted and ignored.
const FIELDS: &[&str] = &[
    "name",
    "allowServicePlacement",
    "primaryVMSet",
    "serviceLabelSelector",
    "serviceNamespaceSelector",
    "nodeSelector",
    "activeServices",
    "activeNodes",
];

/// A label key or value as Kubernetes allows (a key: optional DNS-subdomain prefix and `/`,
/// a name of at most 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric).
fn label_name_ok(s: &str) -> bool {
    s.len() <= 63
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && s.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && s.bytes().last().is_some_and(|b| b.is_ascii_alphanumeric())
}

fn label_key_ok(k: &str) -> bool {
    match k.split_once('/') {
        Some((prefix, name)) => {
            !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.split('.').all(|p| {
                    !p.is_empty()
                        && p.bytes()
                            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                        && !p.starts_with('-')
                        && !p.ends_with('-')
                })
                && label_name_ok(name)
        }
        None => label_name_ok(k),
    }
}

fn label_value_ok(v: &str) -> bool {
    v.is_empty() || label_name_ok(v)
}

/// Parses a label selector; errors name the field under `at`.
fn selector(v: &Value, at: &str) -> Result<Option<Selector>, (String, String)> {
    let obj = match v {
        Value::Null => return Ok(None),
        Value::Object(o) => o,
        _ => {
            return Err((
                at.into(),
                "expected a label selector (matchLabels, matchExpressions)".into(),
            ));
        }
    };
    let mut s = Selector::default();
    for (k, val) in obj {
        if k.eq_ignore_ascii_case("matchLabels") {
            match val {
                Value::Null => {}
                Value::Object(m) => {
                    for (lk, lv) in m {
                        let f = format!("{at}.matchLabels");
                        if !label_key_ok(lk) {
                            return Err((f, format!("{lk:?} is not a valid label key")));
                        }
                        let Some(lv) = lv.as_str() else {
                            return Err((format!("{f}.{lk}"), "expected a string".into()));
                        };
                        if !label_value_ok(lv) {
                            return Err((format!("{f}.{lk}"), "not a valid label value".into()));
                        }
                        s.match_labels.insert(lk.clone(), lv.to_string());
                    }
                }
                _ => return Err((format!("{at}.matchLabels"), "expected a map of labels".into())),
            }
        } else if k.eq_ignore_ascii_case("matchExpressions") {
            let list = match val {
                Value::Null => continue,
                Value::Array(a) => a,
                _ => return Err((format!("{at}.matchExpressions"), "expected a list".into())),
            };
            for (i, e) in list.iter().enumerate() {
                let f = format!("{at}.matchExpressions[{i}]");
                let Some(e) = e.as_object() else {
                    return Err((f, "expected {key, operator, values}".into()));
                };
                let key = field(e, "key").and_then(Value::as_str).unwrap_or_default();
                if !label_key_ok(key) {
                    return Err((format!("{f}.key"), format!("{key:?} is not a valid label key")));
                }
                let op_text = field(e, "operator").and_then(Value::as_str).unwrap_or_default();
                let op = match op_text {
                    "In" => Op::In,
                    "NotIn" => Op::NotIn,
                    "Exists" => Op::Exists,
                    "DoesNotExist" => Op::DoesNotExist,
                    other => {
                        return Err((
                            format!("{f}.operator"),
                            format!("{other:?} is not one of In, NotIn, Exists, DoesNotExist"),
                        ));
                    }
                };
                let values: Vec<String> = match field(e, "values") {
                    None | Some(Value::Null) => Vec::new(),
                    Some(Value::Array(a)) => {
                        let mut out = Vec::new();
                        for v in a {
                            match v.as_str() {
                                Some(v) if label_value_ok(v) => out.push(v.to_string()),
                                _ => {
                                    return Err((
                                        format!("{f}.values"),
                                        "every value must be a valid label value".into(),
                                    ));
                                }
                            }
                        }
                        out
                    }
                    Some(_) => return Err((format!("{f}.values"), "expected a list".into())),
                };
                match op {
                    Op::In | Op::NotIn if values.is_empty() => {
                        return Err((format!("{f}.values"), format!("{op_text} needs values")));
                    }
                    Op::Exists | Op::DoesNotExist if !values.is_empty() => {
                        return Err((format!("{f}.values"), format!("{op_text} takes no values")));
                    }
                    _ => {}
                }
                s.expressions.push(Expression { key: key.to_string(), op, values });
            }
        } else {
            return Err((
                format!("{at}.{k}"),
                "unknown field (matchLabels, matchExpressions)".into(),
            ));
        }
    }
    Ok(Some(s))
}

/// Parses and checks the configurations (`null` or `[]`: none). Names and primary VM sets
/// must be unique (ignoring case, as ARM), every entry needs both.
pub fn parse(v: &Value) -> Result<Vec<LbConfig>, ConfigurationError> {
    let list = match v {
        Value::Null => return Ok(Vec::new()),
        Value::Array(a) => a,
        _ => {
            return Err(ConfigurationError {
                index: 0,
                name: None,
                field: "(the key)".into(),
                message: "expected a list of load balancer configurations".into(),
            });
        }
    };
    let mut out: Vec<LbConfig> = Vec::new();
    for (index, entry) in list.iter().enumerate() {
        let err = |name: Option<&str>, field: &str, message: String| ConfigurationError {
            index,
            name: name.map(str::to_string),
            field: field.to_string(),
            message,
        };
        let Some(obj) = entry.as_object() else {
            return Err(err(None, "(entry)", "expected a mapping".into()));
        };
        let name = match field(obj, "name") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
            _ => return Err(err(None, "name", "required: the load balancer's name".into())),
        };
        let n = Some(name.as_str());
        if let Err(m) = crate::client::names::check(crate::client::names::NameKind::Network, &name)
        {
            return Err(err(n, "name", m));
        }
        if name.to_ascii_lowercase().ends_with(super::naming::INTERNAL_SUFFIX) {
            return Err(err(
                n,
                "name",
                "name the public load balancer; its internal one is <name>-internal".into(),
            ));
        }
        if out.iter().any(|c| c.name.eq_ignore_ascii_case(&name)) {
            return Err(err(n, "name", "duplicated: another entry has this name".into()));
        }
        for k in obj.keys() {
            if !FIELDS.iter().any(|f| f.eq_ignore_ascii_case(k)) {
                return Err(err(n, k, "unknown field".into()));
            }
        }
        let allow_service_placement = match field(obj, "allowServicePlacement") {
            None | Some(Value::Null) => true,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(err(n, "allowServicePlacement", "expected true or false".into()));
            }
        };
        let primary_vm_set = match field(obj, "primaryVMSet") {
            Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
            _ => {
                return Err(err(
                    n,
                    "primaryVMSet",
                    "required: the VM set (availability set or scale set) whose Nodes are always in this load balancer".into(),
                ));
            }
        };
        if let Some(other) =
            out.iter().find(|c| c.primary_vm_set.eq_ignore_ascii_case(&primary_vm_set))
        {
            return Err(err(
                n,
                "primaryVMSet",
                format!("{primary_vm_set:?} is already the primary VM set of {:?}", other.name),
            ));
        }
        let sel = |key: &str| -> Result<Option<Selector>, ConfigurationError> {
            match field(obj, key) {
                None => Ok(None),
                Some(v) => selector(v, key).map_err(|(f, m)| err(n, &f, m)),
            }
        };
        out.push(LbConfig {
            allow_service_placement,
            primary_vm_set,
            service_label_selector: sel("serviceLabelSelector")?,
            service_namespace_selector: sel("serviceNamespaceSelector")?,
            node_selector: sel("nodeSelector")?,
            name,
        });
    }
    Ok(out)
}

/// The names in the `azure-load-balancer-configurations` annotation (comma-separated,
/// trimmed, lower case as upstream).
pub fn annotated(annotation: Option<&str>) -> Vec<String> {
    annotation
        .into_iter()
        .flat_map(|a| a.split(','))
        .map(|s| s.trim().to_ascii_lowercase())
        .filter(|s| !s.is_empty())
        .collect()
}

/// The configurations the Service may be placed on (upstream's
/// `getEligibleLoadBalancersForService`), in configuration order. `current` is the
/// configuration whose load balancer holds the Service now; `namespace_labels` is needed only
/// when a candidate has a `serviceNamespaceSelector` (`None` then is an error). An empty
/// result is an error saying why.
pub fn eligible(
    configs: &[LbConfig],
    annotation: Option<&str>,
    service_labels: &BTreeMap<String, String>,
    namespace_labels: Option<&BTreeMap<String, String>>,
    current: Option<&str>,
) -> Result<Vec<String>, String> {
    let wanted = annotated(annotation);
    let mut candidates: Vec<&LbConfig> = if wanted.is_empty() {
        configs.iter().collect()
    } else {
        let c: Vec<&LbConfig> = configs
            .iter()
            .filter(|c| wanted.iter().any(|w| w.eq_ignore_ascii_case(&c.name)))
            .collect();
        if c.is_empty() {
            return Err(format!(
                "the annotation {} names {} load balancer configuration(s), none of them in the cloud config's multipleStandardLoadBalancerConfigurations",
                super::annotations::LOAD_BALANCER_CONFIGURATIONS,
                wanted.len()
            ));
        }
        c
    };
    let named: Vec<String> = candidates.iter().map(|c| c.name.clone()).collect();
    let (mut closed, mut labels_failed, mut ns_failed) = (Vec::new(), Vec::new(), Vec::new());
    let mut selector_matched = false;
    let mut kept = Vec::new();
    for c in candidates.drain(..) {
        let in_use = current.is_some_and(|n| n.eq_ignore_ascii_case(&c.name));
        if !c.allow_service_placement && !in_use {
            closed.push(c.name.clone());
            continue;
        }
        if let Some(s) = &c.service_label_selector {
            if !s.matches(service_labels) {
                labels_failed.push(c.name.clone());
                continue;
            }
            selector_matched = true;
        }
        if let Some(s) = &c.service_namespace_selector {
            let Some(ns) = namespace_labels else {
                return Err(format!(
                    "load balancer configuration {:?} selects namespaces, but the Service's namespace could not be read",
                    c.name
                ));
            };
            if !s.matches(ns) {
                ns_failed.push(c.name.clone());
                continue;
            }
            selector_matched = true;
        }
        kept.push(c);
    }
    if kept.is_empty() {
        return Err(format!(
            "no load balancer configuration takes the Service: of {:?}, {:?} allow no new Services (allowServicePlacement: false), {:?} do not match the Service's labels (serviceLabelSelector), {:?} do not match its namespace's labels (serviceNamespaceSelector)",
            named, closed, labels_failed, ns_failed
        ));
    }
    if selector_matched {
        kept.retain(|c| c.has_service_selector());
    }
    Ok(kept.into_iter().map(|c| c.name.clone()).collect())
}

/// An existing load balancer as placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Existing {
    /// Its configuration's name (without `-internal`).
    pub config: String,
    /// Whether it is the internal one.
    pub internal: bool,
    /// How many load-balancing rules it has.
    pub rules: usize,
}

/// Upstream's `getMostEligibleLBForService`: the current load balancer when eligible; else
/// the first eligible existing one (of the Service's kind) without rules; else the first
/// eligible one not created yet; else the eligible one with fewest rules. `None` only when
/// `eligible` is empty.
pub fn most_eligible(
    current: Option<&str>,
    eligible: &[String],
    existing: &[Existing],
    internal: bool,
) -> Option<String> {
    if let Some(c) = current
        && let Some(e) = eligible.iter().find(|e| e.eq_ignore_ascii_case(c))
    {
        return Some(e.clone());
    }
    let of_kind = |name: &str| {
        existing.iter().find(|x| x.internal == internal && x.config.eq_ignore_ascii_case(name))
    };
    let mut first_missing = None;
    for e in eligible {
        match of_kind(e) {
            Some(x) if x.rules == 0 => return Some(e.clone()),
            Some(_) => {}
            None => {
                if first_missing.is_none() {
                    first_missing = Some(e.clone());
                }
            }
        }
    }
    if first_missing.is_some() {
        return first_missing;
    }
    eligible
        .iter()
        .filter_map(|e| of_kind(e).map(|x| (x.rules, e)))
        .min_by_key(|(r, _)| *r)
        .map(|(_, e)| e.clone())
}

/// A Node as node placement sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeInfo {
    /// Its name.
    pub name: String,
    /// Its labels.
    pub labels: BTreeMap<String, String>,
    /// Its VM set (availability set or scale set name), when known.
    pub vm_set: Option<String>,
}

/// Which configuration's pool each Node is in (upstream's
/// `reconcileMultipleStandardLoadBalancerBackendNodes`): `current` is where Nodes are now
/// (node name → configuration), `present` the configurations whose load balancers exist or
/// are being created. Returns node name → configuration name; a Node no present
/// configuration takes is left out (upstream warns `FailedToFindLoadBalancerForNode`).
pub fn assign_nodes(
    configs: &[LbConfig],
    nodes: &[NodeInfo],
    current: &BTreeMap<String, String>,
    present: &BTreeSet<String>,
) -> BTreeMap<String, String> {
    let is_present = |c: &LbConfig| present.iter().any(|p| p.eq_ignore_ascii_case(&c.name));
    let idx_of = |name: &str| configs.iter().position(|c| c.name.eq_ignore_ascii_case(name));
    // Where Nodes are now, for Nodes that still exist.
    let mut at: BTreeMap<String, usize> = nodes
        .iter()
        .filter_map(|n| Some((n.name.clone(), idx_of(current.get(&n.name)?)?)))
        .collect();
    let mut counts = vec![0usize; configs.len()];
    for i in at.values() {
        counts[*i] += 1;
    }
    fn put(at: &mut BTreeMap<String, usize>, counts: &mut [usize], node: &str, to: Option<usize>) {
        if let Some(old) = at.remove(node) {
            counts[old] = counts[old].saturating_sub(1);
        }
        if let Some(to) = to {
            counts[to] += 1;
            at.insert(node.to_string(), to);
        }
    }
    for n in nodes {
        let primary = n.vm_set.as_deref().and_then(|vs| {
            configs.iter().position(|c| c.primary_vm_set.eq_ignore_ascii_case(vs) && is_present(c))
        });
        if let Some(p) = primary {
            put(&mut at, &mut counts, &n.name, Some(p));
            continue;
        }
        let mut candidates: Vec<usize> = configs
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                is_present(c)
                    && c.node_selector
                        .as_ref()
                        .is_some_and(|s| !s.is_empty() && s.matches(&n.labels))
            })
            .map(|(i, _)| i)
            .collect();
        if candidates.is_empty() {
            candidates = configs
                .iter()
                .enumerate()
                .filter(|(_, c)| {
                    is_present(c) && c.node_selector.as_ref().is_none_or(Selector::is_empty)
                })
                .map(|(i, _)| i)
                .collect();
        }
        if at.get(&n.name).is_some_and(|i| candidates.contains(i)) {
            continue;
        }
        let mut best: Option<usize> = None;
        for i in candidates {
            if best.is_none_or(|b| counts[i] < counts[b]) {
                best = Some(i);
            }
        }
        put(&mut at, &mut counts, &n.name, best);
    }
    at.into_iter().map(|(n, i)| (n, configs[i].name.clone())).collect()
}

/// One of the cluster's load balancers as read: its name, whether internal, its
/// configuration, and the load balancer (`None`: absent).
pub(super) struct Read {
    pub name: String,
    pub internal: bool,
    pub config: String,
    pub lb: Option<ArmLoadBalancer>,
}

impl AzureLoadBalancer {
    /// The configurations in multi-SLB mode (`None`: one load balancer), checked against the
    /// cluster: one must be named after it (or after `loadBalancerName`).
    pub(super) fn multi(&self, cluster: &str) -> Result<Option<&[LbConfig]>, ProviderError> {
        let configs = self.slbs.as_ref().map_err(|m| ProviderError::Invalid {
            what: "multipleStandardLoadBalancerConfigurations".into(),
            message: m.clone(),
        })?;
        if configs.is_empty() {
            return Ok(None);
        }
        let base = naming::base_name(&self.config, cluster);
        if !configs
            .iter()
            .any(|c| c.name.eq_ignore_ascii_case(cluster) || c.name.eq_ignore_ascii_case(&base))
        {
            return Err(ProviderError::Invalid {
                what: "multipleStandardLoadBalancerConfigurations".into(),
                message: format!(
                    "no configuration is named after the cluster ({cluster:?}): the primary load balancer must be one of them"
                ),
            });
        }
        Ok(Some(configs))
    }

    /// Every load balancer the cluster's Services may be on: `(name, internal, config)`.
    pub(super) fn lb_names(
        &self,
        cluster: &str,
    ) -> Result<Vec<(String, bool, String)>, ProviderError> {
        Ok(match self.multi(cluster)? {
            None => {
                let base = naming::base_name(&self.config, cluster);
                [false, true]
                    .into_iter()
                    .map(|i| (naming::lb_name(&self.config, cluster, i), i, base.clone()))
                    .collect()
            }
            Some(configs) => configs
                .iter()
                .flat_map(|c| {
                    [
                        (c.name.clone(), false, c.name.clone()),
                        (format!("{}{}", c.name, naming::INTERNAL_SUFFIX), true, c.name.clone()),
                    ]
                })
                .collect(),
        })
    }

    /// Reads every load balancer of [`Self::lb_names`].
    pub(super) async fn read_all(&self, cluster: &str) -> Result<Vec<Read>, ProviderError> {
        let mut out = Vec::new();
        for (name, internal, config) in self.lb_names(cluster)? {
            let lb = self.get_lb(&self.lb_id(&name)?).await?;
            out.push(Read { name, internal, config, lb });
        }
        Ok(out)
    }

    /// The labels of the Service's namespace (one GET on the Kubernetes API).
    async fn namespace_labels(
        &self,
        service: &Service,
    ) -> Result<BTreeMap<String, String>, ProviderError> {
        let ns = service.metadata.namespace.as_deref().unwrap_or("default");
        let kube = self.kube.get().cloned().ok_or_else(|| {
            ProviderError::other(
                "a serviceNamespaceSelector needs the Service's namespace, and this provider has no Kubernetes client",
            )
        })?;
        let api: kube::Api<Namespace> = kube::Api::all(kube);
        let read = tokio::time::timeout(NAMESPACE_READ_TIMEOUT, api.get_opt(ns)).await;
        match read {
            Err(_) => Err(ProviderError::other(format!(
                "reading namespace {ns} for the serviceNamespaceSelector timed out"
            ))),
            Ok(Err(e)) => Err(ProviderError::other(format!(
                "reading namespace {ns} for the serviceNamespaceSelector: {e}"
            ))),
            Ok(Ok(None)) => Err(ProviderError::other(format!("namespace {ns} does not exist"))),
            Ok(Ok(Some(n))) => Ok(n.metadata.labels.unwrap_or_default()),
        }
    }

    /// Which load balancer the Service goes on (multi-SLB): where it is now if still
    /// eligible, else the most eligible one (see the module docs). `public_ips` and
    /// `targets`: where its frontends point (a Service naming an address goes where that
    /// address is).
    pub(super) async fn place(
        &self,
        cluster: &str,
        service: &Service,
        svc: &ServiceConfig,
        read: &[Read],
        public_ips: &BTreeMap<Family, PublicIpAddress>,
        targets: &BTreeMap<Family, Target>,
    ) -> Result<String, ProviderError> {
        let configs = self.multi(cluster)?.unwrap_or_default();
        let annotation = service
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::LOAD_BALANCER_CONFIGURATIONS))
            .map(String::as_str);
        let pinned = !svc.load_balancer_ip.is_empty() || !svc.pip_name.is_empty();
        if pinned && !annotated(annotation).is_empty() {
            return Err(ProviderError::Invalid {
                what: annotations::LOAD_BALANCER_CONFIGURATIONS.into(),
                message: "the Service names both load balancer configurations and an address (loadBalancerIP, azure-load-balancer-ipv4/-ipv6 or azure-pip-name): an address decides the load balancer it is on; remove one of them".into(),
            });
        }
        let of_kind = || read.iter().filter(|r| r.internal == svc.internal);
        // Where it is now: its frontends or rules, else the frontend it shares, else the
        // load balancer its public IP is attached to.
        let mut current = of_kind()
            .find(|r| r.lb.as_ref().is_some_and(|lb| frontend::used(svc, lb).next().is_some()))
            .map(|r| r.config.clone());
        if current.is_none() {
            current = of_kind()
                .find(|r| {
                    r.lb.as_ref().is_some_and(|lb| {
                        targets.iter().any(|(f, t)| frontend::shared_with(svc, lb, *f, t).is_some())
                    })
                })
                .map(|r| r.config.clone());
        }
        if current.is_none() && !svc.internal {
            for pip in public_ips.values() {
                if pip.tag(naming::CLUSTER_TAG).is_some_and(|c| !c.eq_ignore_ascii_case(cluster)) {
                    continue;
                }
                let Some(fe) = &pip.properties.ip_configuration else { continue };
                let lb = lb_of_frontend(&fe.id);
                if let Some(r) = of_kind().find(|r| r.name.eq_ignore_ascii_case(lb)) {
                    current = Some(r.config.clone());
                    break;
                }
            }
        }
        let ns_labels = if configs.iter().any(|c| c.service_namespace_selector.is_some()) {
            Some(self.namespace_labels(service).await?)
        } else {
            None
        };
        let svc_labels = service.metadata.labels.clone().unwrap_or_default();
        let eligible =
            eligible(configs, annotation, &svc_labels, ns_labels.as_ref(), current.as_deref())
                .map_err(|message| ProviderError::Invalid {
                    what: "multipleStandardLoadBalancerConfigurations".into(),
                    message,
                })?;
        if pinned
            && let Some(c) = &current
            && !eligible.iter().any(|e| e.eq_ignore_ascii_case(c))
        {
            return Err(ProviderError::Invalid {
                what: "multipleStandardLoadBalancerConfigurations".into(),
                message: format!(
                    "the Service's address is on load balancer {c:?}, which may not take the Service (eligible: {eligible:?}); adjust the configuration's selectors or allowServicePlacement"
                ),
            });
        }
        let existing: Vec<Existing> = read
            .iter()
            .filter_map(|r| {
                let lb = r.lb.as_ref()?;
                Some(Existing {
                    config: r.config.clone(),
                    internal: r.internal,
                    rules: lb.properties.load_balancing_rules.len(),
                })
            })
            .collect();
        let config = most_eligible(current.as_deref(), &eligible, &existing, svc.internal)
            .ok_or_else(|| ProviderError::other("no eligible load balancer"))?;
        if current.as_deref().is_some_and(|c| !c.eq_ignore_ascii_case(&config)) {
            info!(service = %svc.key, from = ?current, to = %config,
                "the Service is no longer eligible for its load balancer: moving it");
        }
        Ok(if svc.internal { format!("{config}{}", naming::INTERNAL_SUFFIX) } else { config })
    }

    /// Before a Service moves off `lb`: a frontend of it that another Service's rules use
    /// too cannot move (upstream refuses the same way).
    pub(super) fn check_movable(
        svc: &ServiceConfig,
        lb: &ArmLoadBalancer,
    ) -> Result<(), ProviderError> {
        for fe in frontend::used(svc, lb) {
            if frontend::in_use_by_others(svc, lb, fe) {
                return Err(ProviderError::Invalid {
                    what: annotations::LOAD_BALANCER_CONFIGURATIONS.into(),
                    message: format!(
                        "the Service cannot move off load balancer {}: its frontend {} is used by other Services too; keep it where it is",
                        lb.name(),
                        fe.name()
                    ),
                });
            }
        }
        Ok(())
    }

    /// The VM set of each Node (uniform scale set from its providerID; an availability set
    /// or flexible scale set from its VM, one VM list per resource group).
    async fn vm_sets(&self, nodes: &[Node]) -> Result<BTreeMap<String, String>, ProviderError> {
        let mut out = BTreeMap::new();
        let mut vms: BTreeMap<String, Vec<(String, String)>> = BTreeMap::new(); // rg → (vm, node)
        for node in nodes {
            let name = node.metadata.name.clone().unwrap_or_default();
            let Some(pid) = node.spec.as_ref().and_then(|s| s.provider_id.as_deref()) else {
                continue;
            };
            match VmRef::parse(pid) {
                Ok(VmRef::ScaleSetVm { scale_set, .. }) => {
                    out.insert(name, scale_set);
                }
                Ok(VmRef::Vm { subscription, resource_group, name: vm })
                    if subscription.eq_ignore_ascii_case(self.client.subscription_id()) =>
                {
                    vms.entry(resource_group.to_ascii_lowercase()).or_default().push((vm, name));
                }
                _ => {}
            }
        }
        for (rg, wanted) in vms {
            let collection = self.client.collection_id(&rg, "Microsoft.Compute/virtualMachines")?;
            let list: Vec<VirtualMachine> = self
                .client
                .list("compute.virtual_machines.list", &collection, COMPUTE, &[])
                .await?;
            for (vm, node) in wanted {
                let Some(found) = list.iter().find(|v| v.name().eq_ignore_ascii_case(&vm)) else {
                    continue;
                };
                let set = found
                    .properties
                    .availability_set
                    .as_ref()
                    .or(found.properties.virtual_machine_scale_set.as_ref())
                    .map(|r| naming::last_segment(&r.id).to_string())
                    .filter(|s| !s.is_empty());
                if let Some(set) = set {
                    out.insert(node, set);
                }
            }
        }
        Ok(out)
    }

    /// Multi-SLB backend pools: every Node goes in exactly one configuration's pools
    /// ([`assign_nodes`]; where it is now read from the pools' addresses), and every existing
    /// load balancer's pools (and `creating`'s) get exactly their Nodes; a Node no
    /// configuration takes is a Warning `FailedToFindLoadBalancerForNode` Event on `service`
    /// (the Service being synced, as upstream). Returns the Nodes of each configuration.
    pub(super) async fn ensure_multi_members(
        &self,
        cluster: &str,
        service: &Service,
        configs: &[LbConfig],
        members: &[Node],
        creating: &str,
    ) -> Result<BTreeMap<String, Vec<Node>>, ProviderError> {
        let read = self.read_all(cluster).await?;
        let ip_to_node: BTreeMap<String, String> = members
            .iter()
            .flat_map(|n| {
                let name = n.metadata.name.clone().unwrap_or_default();
                n.status
                    .as_ref()
                    .and_then(|s| s.addresses.as_ref())
                    .into_iter()
                    .flatten()
                    .filter(|a| a.type_ == "InternalIP")
                    .map(move |a| (a.address.clone(), name.clone()))
            })
            .collect();
        let mut current = BTreeMap::new();
        let mut present = BTreeSet::new();
        present.insert(super::config_of(creating).to_string());
        for r in &read {
            let Some(lb) = &r.lb else { continue };
            present.insert(r.config.clone());
            for pool in &lb.properties.backend_address_pools {
                for f in [Family::V4, Family::V6] {
                    if !pool.name().eq_ignore_ascii_case(&naming::backend_pool_name(cluster, f)) {
                        continue;
                    }
                    let addrs = pool.properties.extra.get("loadBalancerBackendAddresses");
                    for a in addrs.and_then(Value::as_array).into_iter().flatten() {
                        if let Some(node) =
                            a["properties"]["ipAddress"].as_str().and_then(|ip| ip_to_node.get(ip))
                        {
                            current.entry(node.clone()).or_insert_with(|| r.config.clone());
                        }
                    }
                }
            }
        }
        let sets = self.vm_sets(members).await?;
        let infos: Vec<NodeInfo> = members
            .iter()
            .map(|n| {
                let name = n.metadata.name.clone().unwrap_or_default();
                NodeInfo {
                    labels: n.metadata.labels.clone().unwrap_or_default(),
                    vm_set: sets.get(&name).cloned(),
                    name,
                }
            })
            .collect();
        let placed = assign_nodes(configs, &infos, &current, &present);
        let mut by_config: BTreeMap<String, Vec<Node>> =
            configs.iter().map(|c| (c.name.clone(), Vec::new())).collect();
        for n in members {
            let name = n.metadata.name.as_deref().unwrap_or_default();
            match placed.get(name) {
                Some(c) => by_config.entry(c.clone()).or_default().push(n.clone()),
                None => {
                    warn!(
                        node = name,
                        service = service.metadata.name.as_deref().unwrap_or_default(),
                        "no load balancer configuration takes the node (FailedToFindLoadBalancerForNode)"
                    );
                    // Upstream's Warning, on the Service being synced; one series per Node
                    // (its action), so each sync grows their counts, as client-go folds
                    // repeats of one message.
                    self.event_as(
                        service,
                        EventType::Warning,
                        "FailedToFindLoadBalancerForNode",
                        name,
                        format!("failed to find a lb for node {name}"),
                    )
                    .await;
                }
            }
        }
        // Pools to fill: every existing load balancer's cluster pools (re-read: `creating`
        // exists by now).
        let mut pools: Vec<(String, bool, String)> = Vec::new();
        for r in &read {
            let lb = if r.name.eq_ignore_ascii_case(creating) {
                self.get_lb(&self.lb_id(&r.name)?).await?
            } else {
                r.lb.clone()
            };
            let Some(lb) = lb else { continue };
            let lb_id = lb.id.clone().unwrap_or(self.lb_id(&r.name)?);
            for f in [Family::V4, Family::V6] {
                let name = naming::backend_pool_name(cluster, f);
                if lb
                    .properties
                    .backend_address_pools
                    .iter()
                    .any(|p| p.name().eq_ignore_ascii_case(&name))
                {
                    pools.push((
                        naming::child_id(&lb_id, "backendAddressPools", &name),
                        r.internal,
                        r.config.clone(),
                    ));
                }
            }
        }
        // Twice on this process's first pass: a Node moving between load balancers is only
        // taken out of a pool once its address is known as a Node's (see `backend`).
        let passes = if self.multi_pass_done.swap(true, std::sync::atomic::Ordering::SeqCst) {
            1
        } else {
            2
        };
        for _ in 0..passes {
            for (pool, internal, config) in &pools {
                if self.config.backend_pool_pre_configured(*internal) {
                    continue;
                }
                let nodes = by_config.get(config).map(Vec::as_slice).unwrap_or_default();
                self.backends.ensure_members(pool, nodes).await?;
            }
        }
        Ok(by_config)
    }
}

/// The label naming an EndpointSlice's Service.
const SERVICE_NAME_LABEL: &str = "kubernetes.io/service-name";

/// The Nodes in an `externalTrafficPolicy: Local` Service's own pool (upstream's
/// `getLocalServiceEndpointsNodeNames`): the backend Nodes named by an endpoint of its
/// EndpointSlices (`nodeName`, any readiness: the health check node port decides where
/// traffic goes), matched ignoring case; every backend Node when the Service has no
/// EndpointSlice (`endpoints` `None`), as upstream.
pub fn local_members(members: &[Node], endpoints: Option<&BTreeSet<String>>) -> Vec<Node> {
    let Some(eps) = endpoints else { return members.to_vec() };
    members
        .iter()
        .filter(|n| {
            n.metadata.name.as_deref().is_some_and(|name| eps.contains(&name.to_ascii_lowercase()))
        })
        .cloned()
        .collect()
}

/// What the periodic pool updater keeps of a Local Service it placed: where its pools are,
/// the backend Nodes of its last sync, and the endpoint Nodes last written.
#[derive(Debug, Clone)]
pub(super) struct LocalService {
    /// The Service (its metadata: the Events' object and the EndpointSlice lookup).
    pub service: Service,
    /// Its pools' IDs (one per IP family).
    pub pools: Vec<String>,
    /// The backend Nodes at its last sync.
    pub members: Vec<Node>,
    /// The endpoint Nodes (lower case) its pools were last written with (`None`: every
    /// backend Node, the Service had no EndpointSlice).
    pub applied: Option<BTreeSet<String>>,
}

/// What one pass of the pool updater did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PoolUpdaterPass {
    /// Local Services looked at.
    pub services: usize,
    /// Services whose pools were written (their endpoint Nodes changed).
    pub updated: usize,
    /// Services whose update failed (an Event and a retry at the next pass).
    pub failed: usize,
}

impl AzureLoadBalancer {
    /// The lower-case names of the Nodes with an endpoint of the Service (its EndpointSlices
    /// in its namespace, labelled `kubernetes.io/service-name: <name>`); `None` when it has
    /// no EndpointSlice.
    pub(super) async fn endpoint_nodes(
        &self,
        service: &Service,
    ) -> Result<Option<BTreeSet<String>>, ProviderError> {
        let ns = service.metadata.namespace.as_deref().unwrap_or("default");
        let name = service.metadata.name.as_deref().unwrap_or_default();
        let kube = self.kube.get().cloned().ok_or_else(|| {
            ProviderError::other(
                "an externalTrafficPolicy: Local Service needs its EndpointSlices, and this provider has no Kubernetes client",
            )
        })?;
        let api: kube::Api<EndpointSlice> = kube::Api::namespaced(kube, ns);
        let lp = kube::api::ListParams::default().labels(&format!("{SERVICE_NAME_LABEL}={name}"));
        let slices = match tokio::time::timeout(NAMESPACE_READ_TIMEOUT, api.list(&lp)).await {
            Err(_) => {
                return Err(ProviderError::other(format!(
                    "listing the EndpointSlices of {ns}/{name} timed out"
                )));
            }
            Ok(Err(e)) => {
                return Err(ProviderError::other(format!(
                    "listing the EndpointSlices of {ns}/{name}: {e}"
                )));
            }
            Ok(Ok(l)) => l.items,
        };
        if slices.is_empty() {
            debug!(service = %format!("{ns}/{name}"), "no EndpointSlice: every backend Node in its pool");
            return Ok(None);
        }
        Ok(Some(
            slices
                .iter()
                .flat_map(|s| s.endpoints.iter())
                .filter_map(|e| e.node_name.as_deref())
                .map(str::to_ascii_lowercase)
                .collect(),
        ))
    }

    /// Remembers (or, `local` `None`, forgets) the Service `key` for the pool updater.
    pub(super) fn remember_local(&self, key: &str, local: Option<LocalService>) {
        let mut map = self.local.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        match local {
            Some(l) => {
                map.insert(key.to_ascii_lowercase(), l);
            }
            None => {
                map.remove(&key.to_ascii_lowercase());
            }
        }
    }

    /// One pass of upstream's backend pool updater (`loadBalancerBackendPoolUpdateIntervalInSeconds`):
    /// for each Local Service placed by this process, its EndpointSlices are read and, when
    /// the Nodes holding its endpoints changed since its pools were last written, its pools
    /// get exactly those Nodes (serialised with the Service syncs: no update is lost to a
    /// concurrent one). Each write is a Normal `LoadBalancerBackendPoolUpdated` Event on the
    /// Service, each failure a Warning `LoadBalancerBackendPoolUpdateFailed` (retried at the
    /// next pass), as upstream.
    pub async fn local_pool_pass(&self) -> PoolUpdaterPass {
        let entries: Vec<(String, LocalService)> = {
            let map = self.local.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            map.iter().map(|(k, v)| (k.clone(), v.clone())).collect()
        };
        let mut pass = PoolUpdaterPass { services: entries.len(), ..Default::default() };
        for (key, entry) in entries {
            let eps = match self.endpoint_nodes(&entry.service).await {
                Ok(e) => e,
                Err(e) => {
                    warn!(service = %key, error = %e, "backend pool updater: EndpointSlices not read");
                    pass.failed += 1;
                    continue;
                }
            };
            if eps == entry.applied {
                continue;
            }
            let _guard = self.lock.lock().await;
            // The Service may have been synced, moved or deleted meanwhile: its entry now.
            let now = {
                let map = self.local.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                map.get(&key).cloned()
            };
            let Some(now) = now else { continue };
            let nodes = local_members(&now.members, eps.as_ref());
            let mut result = Ok(());
            for pool in &now.pools {
                result = self.backends.ensure_members(pool, &nodes).await;
                if result.is_err() {
                    break;
                }
            }
            match result {
                Ok(()) => {
                    pass.updated += 1;
                    info!(service = %key, nodes = nodes.len(), "backend pool updater: the Local Service's pool follows its endpoints");
                    if let Some(l) = self
                        .local
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .get_mut(&key)
                    {
                        l.applied = eps.clone();
                    }
                    self.event(
                        &now.service,
                        EventType::Normal,
                        "LoadBalancerBackendPoolUpdated",
                        "Load balancer backend pool updated successfully".into(),
                    )
                    .await;
                }
                Err(e) => {
                    pass.failed += 1;
                    warn!(service = %key, error = %e, "backend pool updater: update failed");
                    self.event(
                        &now.service,
                        EventType::Warning,
                        "LoadBalancerBackendPoolUpdateFailed",
                        e.to_string(),
                    )
                    .await;
                }
            }
        }
        pass
    }

    /// Runs [`Self::local_pool_pass`] every `loadBalancerBackendPoolUpdateIntervalInSeconds`
    /// (default 30, upstream's) while `lb` lives, until `stop` completes. Only with several
    /// standard load balancers (the only mode with Local Services' own pools).
    pub fn spawn_pool_updater(
        lb: &std::sync::Arc<Self>,
        stop: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        if !lb.slbs.as_ref().is_ok_and(|c| !c.is_empty()) {
            return;
        }
        let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
        let every = std::time::Duration::from_secs(
            lb.config.load_balancer_backend_pool_update_interval_in_seconds.unwrap_or(30).max(1),
        );
        let weak = std::sync::Arc::downgrade(lb);
        rt.spawn(async move {
            tokio::pin!(stop);
            loop {
                tokio::select! {
                    _ = &mut stop => return,
                    _ = tokio::time::sleep(every) => {}
                }
                let Some(lb) = weak.upgrade() else { return };
                let pass = lb.local_pool_pass().await;
                if pass.updated > 0 || pass.failed > 0 {
                    debug!(?pass, "backend pool updater pass");
                }
            }
        });
    }

    /// Records an Event on `obj` as upstream's provider does (source `azure-cloud-provider`);
    /// nothing without a Kubernetes client; a failure to record is logged only.
    pub(super) async fn event(
        &self,
        obj: &Service,
        type_: EventType,
        reason: &str,
        message: String,
    ) {
        self.event_as(obj, type_, reason, "", message).await;
    }

    /// [`Self::event`] with an `action` (a series of its own).
    async fn event_as(
        &self,
        obj: &Service,
        type_: EventType,
        reason: &str,
        action: &str,
        message: String,
    ) {
        let Some(kube) = self.kube.get() else { return };
        let recorder = self.events.get_or_init(|| {
            EventRecorder::new(
                kube.clone(),
                Reporter { controller: EVENT_COMPONENT.into(), instance: None },
            )
        });
        publish(recorder, obj, type_, reason, action, message).await;
    }
}

/// The source of the provider's own Events (upstream's).
pub const EVENT_COMPONENT: &str = "azure-cloud-provider";

/// The load balancer's name in a frontend IP configuration's ID (`""` when not one).
fn lb_of_frontend(id: &str) -> &str {
    let lower = id.to_ascii_lowercase();
    let Some(at) = lower.find("/loadbalancers/") else { return "" };
    let rest = &id[at + "/loadbalancers/".len()..];
    rest.split('/').next().unwrap_or_default()
}

const NAMESPACE_READ_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(15);

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn labels(l: &[(&str, &str)]) -> BTreeMap<String, String> {
        l.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn configs() -> Vec<LbConfig> {
        parse(&json!([
            {"name": "kubernetes", "primaryVMSet": "as-main"},
            {"name": "lb-a", "primaryVMSet": "pool-a",
             "serviceNamespaceSelector": {"matchLabels": {"team": "a"}},
             "nodeSelector": {"matchLabels": {"pool": "a"}}},
            {"name": "lb-b", "primaryVMSet": "pool-b",
             "serviceLabelSelector": {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["web"]}]},
             "nodeSelector": {"matchLabels": {"pool": "b"}}},
        ]))
        .unwrap()
    }

    #[test]
    fn bad_configurations_name_the_entry_and_field() {
        let e = |v: Value| parse(&v).unwrap_err().to_string();
        assert_eq!(
            e(json!([{"primaryVMSet": "x"}])),
            "entry 0: name: required: the load balancer's name"
        );
        assert!(
            e(json!([{"name": "a", "primaryVMSet": "x"}, {"name": "A", "primaryVMSet": "y"}]))
                .starts_with("entry 1 (\"A\"): name: duplicated")
        );
        assert!(e(json!([{"name": "a"}])).starts_with("entry 0 (\"a\"): primaryVMSet: required"));
        assert!(
            e(json!([{"name": "a", "primaryVMSet": "x"}, {"name": "b", "primaryVMSet": "X"}]))
                .contains("primaryVMSet: \"X\" is already the primary VM set of \"a\"")
        );
        assert!(
            e(json!([{"name": "a", "primaryVMSet": "x",
                "nodeSelector": {"matchExpressions": [{"key": "k", "operator": "Like", "values": ["v"]}]}}]))
            .contains("nodeSelector.matchExpressions[0].operator: \"Like\" is not one of")
        );
        assert!(
            e(json!([{"name": "a", "primaryVMSet": "x",
                "serviceLabelSelector": {"matchExpressions": [{"key": "k", "operator": "In"}]}}]))
            .contains("serviceLabelSelector.matchExpressions[0].values: In needs values")
        );
        assert!(
            e(json!([{"name": "a", "primaryVMSet": "x", "nodeSelector": {"matchLabels": {"bad key!": "v"}}}]))
                .contains("nodeSelector.matchLabels: \"bad key!\" is not a valid label key")
        );
        assert!(
            e(json!([{"name": "a", "primaryVMSet": "x", "nodeSelecter": {}}]))
                .contains("nodeSelecter: unknown field")
        );
        assert!(
            e(json!([{"name": "a/b", "primaryVMSet": "x"}])).contains("entry 0 (\"a/b\"): name:")
        );
        assert!(
            e(json!([{"name": "a-internal", "primaryVMSet": "x"}])).contains("<name>-internal")
        );
        assert!(e(json!({"name": "a"})).contains("expected a list"));
        assert_eq!(parse(&json!(null)).unwrap(), vec![]);
        // Upstream's runtime status fields and any key case are accepted.
        let c = parse(&json!([{"NAME": "a", "primaryVmSet": "x", "activeServices": null,
            "AllowServicePlacement": false}]))
        .unwrap();
        assert_eq!((c[0].name.as_str(), c[0].allow_service_placement), ("a", false));
    }

    #[test]
    fn selectors_match_labels_and_expressions() {
        let s = selector(
            &json!({"matchLabels": {"a": "1"}, "matchExpressions": [
                {"key": "b", "operator": "NotIn", "values": ["x"]},
                {"key": "c", "operator": "Exists"},
                {"key": "d", "operator": "DoesNotExist"}]}),
            "s",
        )
        .unwrap()
        .unwrap();
        assert!(s.matches(&labels(&[("a", "1"), ("c", "")])));
        assert!(!s.matches(&labels(&[("a", "1"), ("b", "x"), ("c", "")])));
        assert!(!s.matches(&labels(&[("a", "1")])));
        assert!(!s.matches(&labels(&[("a", "1"), ("c", ""), ("d", "")])));
        assert!(!s.matches(&labels(&[("a", "2"), ("c", "")])));
    }

    #[test]
    fn placement_follows_annotation_selectors_and_fallback() {
        let c = configs();
        let none = BTreeMap::new();
        let team_a = labels(&[("team", "a")]);
        // No selector matches: only the selector-less configuration.
        assert_eq!(eligible(&c, None, &none, Some(&none), None).unwrap(), vec!["kubernetes"]);
        // The namespace selector matches: lb-a only (selector-less ones drop out).
        assert_eq!(eligible(&c, None, &none, Some(&team_a), None).unwrap(), vec!["lb-a"]);
        let web = labels(&[("tier", "web")]);
        assert_eq!(eligible(&c, None, &web, Some(&team_a), None).unwrap(), vec!["lb-a", "lb-b"]);
        // The annotation narrows (case and spaces ignored).
        assert_eq!(
            eligible(&c, Some(" LB-B ,kubernetes"), &web, Some(&team_a), None).unwrap(),
            vec!["lb-b"]
        );
        let e = eligible(&c, Some("lb-a"), &none, Some(&none), None).unwrap_err();
        assert!(e.contains("[\"lb-a\"] do not match its namespace's labels"), "{e}");
        assert!(
            eligible(&c, Some("nope"), &none, Some(&none), None)
                .unwrap_err()
                .contains("none of them")
        );
        // Namespaces unknown while a candidate selects them: an error, not a guess.
        assert!(eligible(&c, None, &none, None, None).is_err());
        // Closed to new Services, except the one already there.
        let mut closed = c.clone();
        closed[0].allow_service_placement = false;
        assert!(eligible(&closed, Some("kubernetes"), &none, Some(&none), None).is_err());
        assert_eq!(
            eligible(&closed, Some("kubernetes"), &none, Some(&none), Some("kubernetes")).unwrap(),
            vec!["kubernetes"]
        );
    }

    #[test]
    fn the_most_eligible_load_balancer() {
        let el = vec!["a".to_string(), "b".to_string(), "c".to_string()];
        let x = |config: &str, internal, rules| Existing { config: config.into(), internal, rules };
        // Current and eligible: stays.
        assert_eq!(most_eligible(Some("C"), &el, &[], false).as_deref(), Some("c"));
        // An existing one without rules beats a missing one.
        let ex = [x("a", false, 3), x("b", false, 0)];
        assert_eq!(most_eligible(None, &el, &ex, false).as_deref(), Some("b"));
        // Else the first missing one.
        let ex = [x("a", false, 3), x("b", false, 1)];
        assert_eq!(most_eligible(Some("z"), &el, &ex, false).as_deref(), Some("c"));
        // All exist: fewest rules; internal ones are counted for internal Services only.
        let ex = [x("a", false, 3), x("b", false, 1), x("c", false, 2), x("a", true, 0)];
        assert_eq!(most_eligible(None, &el, &ex, false).as_deref(), Some("b"));
        assert_eq!(most_eligible(None, &el, &ex, true).as_deref(), Some("a"));
        assert_eq!(most_eligible(None, &[], &ex, true), None);
    }

    #[test]
    fn nodes_go_by_primary_vm_set_then_selector_then_fewest() {
        let c = configs();
        let n = |name: &str, l: &[(&str, &str)], vs: Option<&str>| NodeInfo {
            name: name.into(),
            labels: labels(l),
            vm_set: vs.map(str::to_string),
        };
        let nodes = vec![
            n("main-0", &[], Some("as-main")),
            n("a-0", &[("pool", "a")], Some("pool-a")),
            n("a-1", &[("pool", "a")], None),
            n("b-0", &[("pool", "b")], None),
            n("x-0", &[], None),
        ];
        let all: BTreeSet<String> = ["kubernetes", "lb-a", "lb-b"].map(String::from).into();
        let got = assign_nodes(&c, &nodes, &BTreeMap::new(), &all);
        let want: BTreeMap<String, String> = [
            ("main-0", "kubernetes"),
            ("a-0", "lb-a"),
            ("a-1", "lb-a"),
            ("b-0", "lb-b"),
            ("x-0", "kubernetes"),
        ]
        .map(|(a, b)| (a.to_string(), b.to_string()))
        .into();
        assert_eq!(got, want);
        // lb-b not there (and not being created): b-0 falls back to the selector-less one.
        let two: BTreeSet<String> = ["kubernetes", "lb-a"].map(String::from).into();
        assert_eq!(assign_nodes(&c, &nodes, &BTreeMap::new(), &two)["b-0"], "kubernetes");
        // A Node where it is allowed stays; one that no longer fits moves.
        let current: BTreeMap<String, String> =
            [("x-0", "kubernetes"), ("b-0", "lb-a")].map(|(a, b)| (a.into(), b.into())).into();
        let got = assign_nodes(&c, &nodes, &current, &all);
        assert_eq!((got["x-0"].as_str(), got["b-0"].as_str()), ("kubernetes", "lb-b"));
        // Nothing present: nobody placed.
        assert!(assign_nodes(&c, &nodes, &BTreeMap::new(), &BTreeSet::new()).is_empty());
    }

    #[test]
    fn fewest_nodes_breaks_ties_among_selector_less_configurations() {
        let c = parse(&json!([
            {"name": "kubernetes", "primaryVMSet": "s1"},
            {"name": "second", "primaryVMSet": "s2"},
        ]))
        .unwrap();
        let nodes: Vec<NodeInfo> = (0..4)
            .map(|i| NodeInfo { name: format!("n{i}"), labels: BTreeMap::new(), vm_set: None })
            .collect();
        let all: BTreeSet<String> = ["kubernetes", "second"].map(String::from).into();
        let got = assign_nodes(&c, &nodes, &BTreeMap::new(), &all);
        let per: Vec<usize> = ["kubernetes", "second"]
            .iter()
            .map(|l| got.values().filter(|v| v == l).count())
            .collect();
        assert_eq!(per, vec![2, 2]);
    }
}
