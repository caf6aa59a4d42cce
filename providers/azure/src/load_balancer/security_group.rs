//! A Service's rules in the cluster's network security group (`securityGroupName` in
//! `securityGroupResourceGroup`, which the operator creates; never created or deleted here),
//! as upstream's `reconcileSecurityGroup` (`azure_loadbalancer.go`) with its
//! `AccessControl` / `securitygroup.RuleHelper` (`pkg/provider/securitygroup`).
//!
//! Rules (all `Inbound`, managed ones recognised as upstream: name prefix `k8s-azure-lb_`
//! and priority 500–4096; every other rule is the operator's and never touched):
//! - allow rules `k8s-azure-lb_allow_<IPv4|IPv6>_<md5("<protocol>_<sources>_<ports>")>`, one
//!   per protocol (`Tcp`, `Udp`, `*` for SCTP), source and IP family; sources are each service
//!   tag of `azure-allowed-service-tags`, `Internet` when the Service is open to everyone
//!   (public, with no tag or range restricting it; an internal Service only with an explicit
//!   all-addresses range), and the aggregated ranges of `spec.loadBalancerSourceRanges` (or
//!   the `service.beta.kubernetes.io/load-balancer-source-ranges` annotation) or
//!   `azure-allowed-ip-ranges` (not both); destination ports are the Service's ports (node
//!   ports with `azure-disable-load-balancer-floating-ip`); destinations are the addresses
//!   the caller passes (the frontend IPs; with floating IP disabled, upstream's backend node
//!   IPs). Services with the same protocol, sources and ports share a rule: its destinations
//!   are all their addresses.
//! - `k8s-azure-lb_deny-all_<family>` (protocol, source and ports `*`, priority from 4095
//!   down) with `azure-deny-all-except-load-balancer-source-ranges: "true"` and a range set.
//! - new rules take the lowest free inbound priority from 500 (deny rules the highest below
//!   4096); ARM requires priorities unique per direction.
//! - `azure-disable-load-balancer-nsg-rule: "true"`: no rules for the Service (its addresses
//!   are taken out of rules made before).
//! - `azure-additional-public-ips` (with the config's `allowAdditionalPublicIPs`; the load
//!   balancer checked each address before): with floating IP, the addresses are more
//!   destinations of the Service's own allow rules, as upstream (a Service fronted by another
//!   IP, e.g. a firewall's). Addresses the Service's status lists but it no longer wants
//!   (an address taken out of the annotation, an old frontend IP) leave every managed rule,
//!   except where another Service shares them ([`Shared`]).
//!
//! Writes are GET → change → PUT with `If-Match` (412: read again, redo); nothing is written
//! when nothing changes. A Service's addresses leave the managed rules it no longer wants (a
//! changed port or source moves them to the new rule), and removing a Service takes its
//! addresses out of every managed rule; rules left without a destination are deleted. With
//! floating IP disabled the addresses are node IPs shared by every such Service, so they are
//! only taken out of allow rules whose ports are all the Service's own node ports ([`Scope`]).

use std::collections::BTreeSet;
use std::net::IpAddr;
use std::sync::Arc;

use ccm_core::cloud::ProviderError;
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;
use md5::{Digest, Md5};
use tracing::{debug, info, warn};

use crate::client::ArmClient;
use crate::client::api_version::NETWORK;
use crate::client::models::{self, SecurityRule, SecurityRuleProperties};
use crate::config::Config;
use crate::load_balancer::backend::{Written, read_modify_write};

/// `true`: no NSG rules for the Service.
pub const DISABLE_NSG_RULE: &str =
    "service.beta.kubernetes.io/azure-disable-load-balancer-nsg-rule";
/// Comma-separated service tags allowed in (`Storage`, `AzureCloud.EastUS`, …).
pub const ALLOWED_SERVICE_TAGS: &str = "service.beta.kubernetes.io/azure-allowed-service-tags";
/// Comma-separated CIDRs allowed in (instead of `spec.loadBalancerSourceRanges`).
pub const ALLOWED_IP_RANGES: &str = "service.beta.kubernetes.io/azure-allowed-ip-ranges";
/// `true`: deny everything else (also from the virtual network) when ranges are set.
pub const DENY_ALL_EXCEPT_SOURCE_RANGES: &str =
    "service.beta.kubernetes.io/azure-deny-all-except-load-balancer-source-ranges";
/// Kubernetes' legacy annotation for `spec.loadBalancerSourceRanges`.
pub const SOURCE_RANGES_ANNOTATION: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";
/// What a bad `spec.loadBalancerSourceRanges` is reported as.
pub const SOURCE_RANGES_FIELD: &str = "spec.loadBalancerSourceRanges";
const INTERNAL: &str = "service.beta.kubernetes.io/azure-load-balancer-internal";
const DISABLE_FLOATING_IP: &str =
    "service.beta.kubernetes.io/azure-disable-load-balancer-floating-ip";
const ADDITIONAL_PUBLIC_IPS: &str = "service.beta.kubernetes.io/azure-additional-public-ips";

/// Managed rule names start with this (upstream `SecurityRuleNamePrefix`).
pub const RULE_PREFIX: &str = "k8s-azure-lb";
/// The lowest priority a managed rule takes (upstream `LoadBalancerMinimumPriority`).
pub const MIN_PRIORITY: i32 = 500;
/// The highest (upstream `LoadBalancerMaximumPriority`).
pub const MAX_PRIORITY: i32 = 4096;
/// The service tag for "everyone".
pub const INTERNET: &str = "Internet";

/// The cluster's network security group.
pub struct SecurityGroup {
    client: Arc<ArmClient>,
    config: Arc<Config>,
}

/// What a Service's annotations and spec ask of the security group.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Access {
    /// `azure-disable-load-balancer-nsg-rule`.
    pub disabled: bool,
    /// Service tags allowed in (with `Internet` added when open to everyone).
    pub service_tags: Vec<String>,
    /// Aggregated source CIDRs (IPv4 and IPv6).
    pub ranges: Vec<IpNet>,
    /// Add the deny-all rules.
    pub deny_all: bool,
    /// Ports per protocol (`Tcp`, `Udp`, `*`), as upstream hashes them (sorted as strings).
    pub ports: Vec<(&'static str, Vec<String>)>,
}

/// One rule the Service wants.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuleSpec {
    /// The rule name.
    pub name: String,
    /// `Tcp`, `Udp` or `*`.
    pub protocol: String,
    /// `Allow` or `Deny`.
    pub allow: bool,
    /// Source prefixes or tags (sorted).
    pub sources: Vec<String>,
    /// Destination ports (sorted as strings); `None`: `*`.
    pub ports: Option<Vec<String>>,
    /// The Service's destinations of the rule's family.
    pub destinations: Vec<IpAddr>,
}

fn invalid(what: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::Invalid { what: what.to_string(), message: message.into() }
}

fn flag(service: &Service, key: &str) -> Result<bool, ProviderError> {
    match service.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(|v| v.trim()) {
        None | Some("") => Ok(false),
        Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
        Some(_) => Err(invalid(key, "must be \"true\" or \"false\"")),
    }
}

fn annotation<'a>(service: &'a Service, key: &str) -> Option<&'a str> {
    service.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

/// Parses CIDRs as upstream does: network prefixes only (`10.0.0.0/8`, not `10.0.0.1/8`).
fn parse_ranges<'a>(
    what: &str,
    items: impl Iterator<Item = &'a str>,
) -> Result<Vec<IpNet>, ProviderError> {
    let mut out = Vec::new();
    for raw in items.map(str::trim).filter(|s| !s.is_empty()) {
        let net: IpNet = raw
            .parse()
            .map_err(|_| invalid(what, format!("{raw:?} is not a CIDR (like 10.0.0.0/8)")))?;
        if net.trunc() != net {
            return Err(invalid(
                what,
                format!("{raw:?} is not a network prefix; did you mean {}?", net.trunc()),
            ));
        }
        out.push(net);
    }
    Ok(out)
}

/// Service tags: letters, digits, `.`, `-`, `_` (e.g. `AzureCloud.EastUS`).
fn parse_tags(value: &str) -> Result<Vec<String>, ProviderError> {
    let mut out: Vec<String> = Vec::new();
    for tag in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        if !tag.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_')) {
            return Err(invalid(
                ALLOWED_SERVICE_TAGS,
                format!(
                    "{tag:?} is not a service tag (letters, digits, '.', '-', '_'); CIDRs go in {ALLOWED_IP_RANGES}"
                ),
            ));
        }
        if !out.iter().any(|t| t == tag) {
            out.push(tag.to_string());
        }
    }
    Ok(out)
}

/// `azure-additional-public-ips` ([`super::annotations::additional_public_ips`]).
pub fn additional_ips(service: &Service) -> Result<Vec<IpAddr>, ProviderError> {
    annotation(service, ADDITIONAL_PUBLIC_IPS)
        .map_or(Ok(Vec::new()), super::annotations::additional_public_ips)
}

/// The addresses in the Service's `status.loadBalancer.ingress` (what it was given before).
fn status_ips(service: &Service) -> Vec<IpAddr> {
    service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref().and_then(|ip| ip.trim().parse().ok()))
        .collect()
}

fn allows_all(ranges: &[IpNet]) -> bool {
    ranges.iter().any(|r| r.prefix_len() == 0)
}

/// Reads the Service's NSG settings (annotations, source ranges, ports).
pub fn access(service: &Service) -> Result<Access, ProviderError> {
    let disabled = flag(service, DISABLE_NSG_RULE)?;
    let spec = service.spec.as_ref();
    let source_ranges = match spec.and_then(|s| s.load_balancer_source_ranges.as_ref()) {
        Some(r) if !r.is_empty() => {
            parse_ranges(SOURCE_RANGES_FIELD, r.iter().map(String::as_str))?
        }
        _ => match annotation(service, SOURCE_RANGES_ANNOTATION) {
            Some(v) => parse_ranges(SOURCE_RANGES_ANNOTATION, v.split(','))?,
            None => Vec::new(),
        },
    };
    let allowed = match annotation(service, ALLOWED_IP_RANGES) {
        Some(v) => parse_ranges(ALLOWED_IP_RANGES, v.split(','))?,
        None => Vec::new(),
    };
    if !source_ranges.is_empty() && !allowed.is_empty() {
        return Err(invalid(
            ALLOWED_IP_RANGES,
            format!("cannot be set together with {SOURCE_RANGES_FIELD}"),
        ));
    }
    let mut service_tags = match annotation(service, ALLOWED_SERVICE_TAGS) {
        Some(v) => parse_tags(v)?,
        None => Vec::new(),
    };
    let internal = flag(service, INTERNAL).unwrap_or(false);
    let from_internet = service_tags.is_empty()
        && (source_ranges.is_empty() || allows_all(&source_ranges))
        && (allowed.is_empty() || allows_all(&allowed))
        && (!internal || !source_ranges.is_empty() || !allowed.is_empty());
    if from_internet {
        service_tags.push(INTERNET.to_string());
    }
    let any_ranges = !source_ranges.is_empty() || !allowed.is_empty();
    let deny_all = flag(service, DENY_ALL_EXCEPT_SOURCE_RANGES)? && any_ranges;
    let mut all = source_ranges;
    all.extend(allowed);
    let ranges = IpNet::aggregate(&all);

    let node_ports = flag(service, DISABLE_FLOATING_IP).unwrap_or(false);
    let mut ports: Vec<(&'static str, Vec<String>)> = Vec::new();
    for p in spec.and_then(|s| s.ports.as_ref()).into_iter().flatten() {
        let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
            "TCP" => "Tcp",
            "UDP" => "Udp",
            "SCTP" => "*",
            other => {
                return Err(invalid("spec.ports", format!("protocol {other:?} is not supported")));
            }
        };
        let number = if node_ports { p.node_port.unwrap_or(0) } else { p.port };
        if number <= 0 {
            if node_ports {
                debug!(port = p.port, "no node port yet; no NSG rule for it");
            }
            continue;
        }
        match ports.iter_mut().find(|(proto, _)| *proto == protocol) {
            Some((_, list)) => list.push(number.to_string()),
            None => ports.push((protocol, vec![number.to_string()])),
        }
    }
    for (_, list) in &mut ports {
        list.sort();
    }
    Ok(Access { disabled, service_tags, ranges, deny_all, ports })
}

/// Upstream's allow-rule name.
pub fn allow_rule_name(protocol: &str, ipv6: bool, sources: &[String], ports: &[String]) -> String {
    let mut s = sources.to_vec();
    s.sort();
    let mut p = ports.to_vec();
    p.sort();
    let digest = Md5::digest(format!("{protocol}_{}_{}", s.join(","), p.join(",")).as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("{RULE_PREFIX}_allow_{}_{hex}", family(ipv6))
}

/// Upstream's deny-all rule name.
pub fn deny_all_rule_name(ipv6: bool) -> String {
    format!("{RULE_PREFIX}_deny-all_{}", family(ipv6))
}

fn family(ipv6: bool) -> &'static str {
    if ipv6 { "IPv6" } else { "IPv4" }
}

/// The rules a Service wants for `destinations`, in upstream's order (which decides
/// priorities): per protocol (`Tcp`, `Udp`, `*`), IPv4 then IPv6, service tags then ranges;
/// then the deny-all rules.
pub fn desired_rules(access: &Access, destinations: &[IpAddr]) -> Vec<RuleSpec> {
    if access.disabled {
        return Vec::new();
    }
    let mut out = Vec::new();
    let mut dst = [Vec::new(), Vec::new()];
    for ip in destinations {
        let list = &mut dst[usize::from(ip.is_ipv6())];
        if !list.contains(ip) {
            list.push(*ip);
        }
    }
    for protocol in ["Tcp", "Udp", "*"] {
        let Some((_, ports)) = access.ports.iter().find(|(p, _)| *p == protocol) else { continue };
        for (v6, dsts) in [(false, &dst[0]), (true, &dst[1])] {
            if dsts.is_empty() {
                continue;
            }
            let mut push = |sources: Vec<String>| {
                out.push(RuleSpec {
                    name: allow_rule_name(protocol, v6, &sources, ports),
                    protocol: protocol.to_string(),
                    allow: true,
                    sources,
                    ports: Some(ports.clone()),
                    destinations: dsts.clone(),
                })
            };
            for tag in &access.service_tags {
                push(vec![tag.clone()]);
            }
            let mut ranges: Vec<String> = access
                .ranges
                .iter()
                .filter(|r| matches!(r, IpNet::V6(_)) == v6)
                .map(ToString::to_string)
                .collect();
            if !ranges.is_empty() {
                ranges.sort();
                push(ranges);
            }
        }
    }
    if access.deny_all {
        for (v6, dsts) in [(false, &dst[0]), (true, &dst[1])] {
            if !dsts.is_empty() {
                out.push(RuleSpec {
                    name: deny_all_rule_name(v6),
                    protocol: "*".into(),
                    allow: false,
                    sources: vec!["*".into()],
                    ports: None,
                    destinations: dsts.clone(),
                });
            }
        }
    }
    out
}

/// Whether a rule is one this provider (or upstream) manages.
pub fn is_managed(rule: &SecurityRule) -> bool {
    rule.name().starts_with(RULE_PREFIX)
        && rule.properties.priority.is_some_and(|p| (MIN_PRIORITY..=MAX_PRIORITY).contains(&p))
}

fn destinations_of(p: &SecurityRuleProperties) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    if let Some(d) = p.destination_address_prefix.as_deref().filter(|d| !d.is_empty()) {
        out.push(d.to_string());
    }
    out.extend(p.destination_address_prefixes.iter().flatten().cloned());
    out
}

fn set_destinations(p: &mut SecurityRuleProperties, list: Vec<String>) {
    let mut list: Vec<String> = list.into_iter().collect::<BTreeSet<_>>().into_iter().collect();
    if list.len() == 1 {
        p.destination_address_prefix = list.pop();
        p.destination_address_prefixes = None;
    } else {
        p.destination_address_prefix = None;
        p.destination_address_prefixes = Some(list);
    }
}

fn same_address(prefix: &str, ip: &IpAddr) -> bool {
    prefix.parse::<IpAddr>().is_ok_and(|p| p == *ip)
}

/// Takes `ips` out of a rule's destinations; whether it changed.
fn remove_destinations(p: &mut SecurityRuleProperties, ips: &[IpAddr]) -> bool {
    let before = destinations_of(p);
    let after: Vec<String> =
        before.iter().filter(|d| !ips.iter().any(|ip| same_address(d, ip))).cloned().collect();
    if after.len() == before.len() {
        return false;
    }
    set_destinations(p, after);
    true
}

fn has_destination(rule: &SecurityRule) -> bool {
    !destinations_of(&rule.properties).is_empty()
        || rule
            .properties
            .extra
            .get("destinationApplicationSecurityGroups")
            .and_then(|v| v.as_array())
            .is_some_and(|a| !a.is_empty())
}

fn inbound(rule: &SecurityRule) -> bool {
    rule.properties.direction.as_deref().is_none_or(|d| d.eq_ignore_ascii_case("Inbound"))
}

/// A rule list with empty lists read as absent (ARM answers `[]` for fields never set).
fn normalised(rules: &[SecurityRule]) -> Vec<SecurityRule> {
    let none_if_empty = |v: &mut Option<Vec<String>>| {
        if v.as_ref().is_some_and(Vec::is_empty) {
            *v = None;
        }
    };
    rules
        .iter()
        .cloned()
        .map(|mut r| {
            none_if_empty(&mut r.properties.source_address_prefixes);
            none_if_empty(&mut r.properties.destination_address_prefixes);
            none_if_empty(&mut r.properties.destination_port_ranges);
            r
        })
        .collect()
}

/// Which managed rules a Service's addresses may be taken out of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// Any managed rule: the addresses are the Service's own frontend IPs.
    Any,
    /// Only allow rules whose protocol and every destination port are the Service's: the
    /// addresses are node IPs (floating IP disabled) that other Services' rules share, and
    /// node ports are unique in the cluster.
    OwnPorts(Vec<(&'static str, Vec<String>)>),
}

impl Scope {
    fn covers(&self, rule: &SecurityRule) -> bool {
        let Scope::OwnPorts(own) = self else { return true };
        let p = &rule.properties;
        if !p.access.as_deref().is_some_and(|a| a.eq_ignore_ascii_case("Allow")) {
            return false;
        }
        let Some((_, ports)) = own.iter().find(|(proto, _)| Some(*proto) == p.protocol.as_deref())
        else {
            return false;
        };
        let mut rule_ports: Vec<&String> = p.destination_port_range.iter().collect();
        rule_ports.extend(p.destination_port_ranges.iter().flatten());
        !rule_ports.is_empty() && rule_ports.iter().all(|r| ports.contains(r))
    }
}

/// The [`Scope`] of a Service's addresses, read leniently (never an error: removal must
/// work whatever the annotations say now).
pub fn scope_of(service: &Service) -> Scope {
    if !flag(service, DISABLE_FLOATING_IP).unwrap_or(false) {
        return Scope::Any;
    }
    let mut own: Vec<(&'static str, Vec<String>)> = Vec::new();
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_ref()).into_iter().flatten();
    for p in ports {
        let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
            "UDP" => "Udp",
            "SCTP" => "*",
            _ => "Tcp",
        };
        let Some(n) = p.node_port.filter(|n| *n > 0) else { continue };
        match own.iter_mut().find(|(proto, _)| *proto == protocol) {
            Some((_, list)) => list.push(n.to_string()),
            None => own.push((protocol, vec![n.to_string()])),
        }
    }
    Scope::OwnPorts(own)
}

/// Addresses the Service shares with other Services (a shared frontend IP) and the ports
/// those Services' load-balancing rules use on them (upstream's `listSharedIPPortMapping`):
/// the shared addresses stay in managed rules carrying one of those ports, whichever
/// Service's addresses are taken out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Shared {
    /// The shared addresses.
    pub ips: Vec<IpAddr>,
    /// `(protocol as NSG rules name it: Tcp, Udp or *, destination port)` of the other
    /// Services.
    pub ports: Vec<(String, String)>,
}

impl Shared {
    /// Whether another Service needs the shared addresses in `rule`.
    fn keeps(&self, rule: &SecurityRule) -> bool {
        let p = &rule.properties;
        let proto = p.protocol.as_deref().unwrap_or("*");
        let mut rule_ports: Vec<&String> = p.destination_port_range.iter().collect();
        rule_ports.extend(p.destination_port_ranges.iter().flatten());
        self.ports.iter().any(|(sp, port)| {
            (sp.eq_ignore_ascii_case(proto) || sp == "*" || proto == "*")
                && rule_ports.iter().any(|r| *r == port || r.as_str() == "*")
        })
    }

    /// `ips` less the shared addresses when another Service needs them in `rule`.
    fn removable(&self, ips: &[IpAddr], rule: &SecurityRule) -> Vec<IpAddr> {
        if self.ips.is_empty() || !self.keeps(rule) {
            return ips.to_vec();
        }
        ips.iter().filter(|ip| !self.ips.contains(ip)).copied().collect()
    }
}

/// Applies a Service's wanted rules to the security group's rules: its addresses leave the
/// managed rules it no longer wants, join (or create) the ones it wants, and managed rules
/// left without a destination go. Operator rules are untouched. Whether anything changed.
pub fn apply(
    rules: &mut Vec<SecurityRule>,
    wanted: &[RuleSpec],
    service_ips: &[IpAddr],
    scope: &Scope,
) -> Result<bool, ProviderError> {
    apply_shared(rules, wanted, service_ips, scope, &Shared::default())
}

/// [`apply`], keeping addresses other Services share where they need them ([`Shared`]).
pub fn apply_shared(
    rules: &mut Vec<SecurityRule>,
    wanted: &[RuleSpec],
    service_ips: &[IpAddr],
    scope: &Scope,
    shared: &Shared,
) -> Result<bool, ProviderError> {
    apply_dropping(rules, wanted, service_ips, &[], scope, shared)
}

/// [`apply_shared`], also taking `stale` (addresses the Service had and no longer wants)
/// out of every managed rule in `scope`, shared ones kept where another Service needs them.
pub fn apply_dropping(
    rules: &mut Vec<SecurityRule>,
    wanted: &[RuleSpec],
    service_ips: &[IpAddr],
    stale: &[IpAddr],
    scope: &Scope,
    shared: &Shared,
) -> Result<bool, ProviderError> {
    let before = normalised(rules);
    if !stale.is_empty() && matches!(scope, Scope::Any) {
        for r in rules.iter_mut().filter(|r| is_managed(r)) {
            let ips = shared.removable(stale, r);
            remove_destinations(&mut r.properties, &ips);
        }
    }
    let wanted_names: BTreeSet<&str> = wanted.iter().map(|w| w.name.as_str()).collect();
    for r in rules.iter_mut() {
        if is_managed(r) && !wanted_names.contains(r.name()) && scope.covers(r) {
            if matches!(scope, Scope::Any) {
                let ips = shared.removable(service_ips, r);
                remove_destinations(&mut r.properties, &ips);
            } else {
                // Only this Service has these node ports: the whole rule is its.
                set_destinations(&mut r.properties, Vec::new());
            }
        }
    }
    // Rules emptied here free their priority for the Service's new rules.
    rules.retain(|r| !is_managed(r) || has_destination(r));
    let mut used: BTreeSet<i32> =
        rules.iter().filter(|r| inbound(r)).filter_map(|r| r.properties.priority).collect();
    for w in wanted {
        let idx = match rules.iter().position(|r| r.name() == w.name) {
            Some(i) => i,
            None => {
                let priority = if w.allow {
                    (MIN_PRIORITY..MAX_PRIORITY).find(|p| !used.contains(p))
                } else {
                    (MIN_PRIORITY..MAX_PRIORITY).rev().find(|p| !used.contains(p))
                }
                .ok_or_else(|| {
                    ProviderError::other(format!(
                        "no free inbound priority between {MIN_PRIORITY} and {MAX_PRIORITY} for NSG rule {}",
                        w.name
                    ))
                })?;
                used.insert(priority);
                rules.push(SecurityRule {
                    name: Some(w.name.clone()),
                    properties: SecurityRuleProperties {
                        priority: Some(priority),
                        ..Default::default()
                    },
                    ..Default::default()
                });
                rules.len() - 1
            }
        };
        let p = &mut rules[idx].properties;
        p.protocol = Some(w.protocol.clone());
        p.access = Some(if w.allow { "Allow" } else { "Deny" }.into());
        p.direction = Some("Inbound".into());
        p.source_port_range = Some("*".into());
        if w.sources.len() == 1 {
            p.source_address_prefix = w.sources.first().cloned();
            p.source_address_prefixes = None;
        } else {
            p.source_address_prefix = None;
            p.source_address_prefixes = Some(w.sources.clone());
        }
        match &w.ports {
            Some(ports) => {
                p.destination_port_range = None;
                p.destination_port_ranges = Some(ports.clone());
            }
            None => {
                p.destination_port_range = Some("*".into());
                p.destination_port_ranges = None;
            }
        }
        let mut dst = destinations_of(p);
        let missing: Vec<String> = w
            .destinations
            .iter()
            .filter(|ip| !dst.iter().any(|d| same_address(d, ip)))
            .map(ToString::to_string)
            .collect();
        if !missing.is_empty() {
            dst.extend(missing);
            set_destinations(p, dst);
        }
    }
    rules.retain(|r| !is_managed(r) || has_destination(r));
    Ok(normalised(rules) != before)
}

/// Takes `ips` out of every managed rule in `scope` (with [`Scope::OwnPorts`], the covered
/// rules go whole: they are the Service's alone); rules left without a destination go.
/// Whether anything changed.
pub fn remove(rules: &mut Vec<SecurityRule>, ips: &[IpAddr], scope: &Scope) -> bool {
    remove_shared(rules, ips, scope, &Shared::default())
}

/// [`remove`], keeping addresses other Services share where they need them ([`Shared`]).
pub fn remove_shared(
    rules: &mut Vec<SecurityRule>,
    ips: &[IpAddr],
    scope: &Scope,
    shared: &Shared,
) -> bool {
    let mut changed = false;
    for r in rules.iter_mut().filter(|r| is_managed(r) && scope.covers(r)) {
        if matches!(scope, Scope::Any) {
            let ips = shared.removable(ips, r);
            changed |= remove_destinations(&mut r.properties, &ips);
        } else {
            // Only this Service has these node ports: the whole rule is its.
            set_destinations(&mut r.properties, Vec::new());
        }
    }
    let n = rules.len();
    rules.retain(|r| !is_managed(r) || has_destination(r));
    changed || rules.len() != n
}

fn service_name(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

impl SecurityGroup {
    /// The security group `config` names, through `client`.
    pub fn new(client: Arc<ArmClient>, config: Arc<Config>) -> Self {
        SecurityGroup { client, config }
    }

    fn id(&self) -> Result<Option<String>, ProviderError> {
        let Some(name) = self.config.security_group_name.as_deref().filter(|n| !n.is_empty())
        else {
            return Ok(None);
        };
        Ok(Some(self.client.resource_id(
            self.config.security_group_resource_group(),
            "Microsoft.Network/networkSecurityGroups",
            name,
        )?))
    }

    /// Makes the security group hold exactly the rules `service` wants for `frontend_ips`
    /// (the Service's destination addresses: its frontend IPs; with floating IP disabled,
    /// the backend node IPs as upstream). Annotation errors are
    /// [`ProviderError::Invalid`] naming the annotation; a missing security group is an
    /// error (it is the operator's to create).
    pub async fn ensure_service_rules(
        &self,
        service: &Service,
        frontend_ips: &[IpAddr],
    ) -> Result<(), ProviderError> {
        self.ensure_service_rules_shared(service, frontend_ips, &Shared::default()).await
    }

    /// [`Self::ensure_service_rules`] for a Service that shares addresses with others.
    pub async fn ensure_service_rules_shared(
        &self,
        service: &Service,
        frontend_ips: &[IpAddr],
        shared: &Shared,
    ) -> Result<(), ProviderError> {
        let access = access(service)?;
        let scope = scope_of(service);
        // With floating IP the destinations are the frontend IPs, and the additional public
        // IPs join them (as upstream); the status's other addresses are stale.
        let mut destinations = frontend_ips.to_vec();
        let mut stale = Vec::new();
        if scope == Scope::Any {
            if self.config.allow_additional_public_ips {
                for ip in additional_ips(service)? {
                    if !destinations.contains(&ip) {
                        destinations.push(ip);
                    }
                }
            }
            stale = status_ips(service);
            stale.retain(|ip| !destinations.contains(ip));
        }
        let wanted = desired_rules(&access, &destinations);
        let id = self.id()?.ok_or_else(|| {
            invalid(
                "securityGroupName",
                "the cloud config names no network security group; LoadBalancer Services need the cluster's",
            )
        })?;
        let w = self
            .write(&id, |rules| {
                apply_dropping(rules, &wanted, &destinations, &stale, &scope, shared)
            })
            .await?;
        let svc = service_name(service);
        match w {
            Written::Missing => {
                return Err(ProviderError::other(format!(
                    "network security group {id} (securityGroupName) does not exist; the CCM does not create it"
                )));
            }
            Written::Yes => info!(service = %svc, rules = wanted.len(), "NSG rules updated"),
            Written::Unchanged => debug!(service = %svc, "NSG rules up to date"),
        }
        Ok(())
    }

    /// Takes `frontend_ips` out of every managed rule of the security group and deletes the
    /// rules left without a destination; with floating IP disabled, deletes the allow rules
    /// of the Service's own node ports (whatever `frontend_ips` says). `Ok` when there is no
    /// security group.
    pub async fn remove_service_rules(
        &self,
        service: &Service,
        frontend_ips: &[IpAddr],
    ) -> Result<(), ProviderError> {
        self.remove_service_rules_shared(service, frontend_ips, &Shared::default()).await
    }

    /// [`Self::remove_service_rules`] for a Service that shares addresses with others.
    pub async fn remove_service_rules_shared(
        &self,
        service: &Service,
        frontend_ips: &[IpAddr],
        shared: &Shared,
    ) -> Result<(), ProviderError> {
        let svc = service_name(service);
        let scope = scope_of(service);
        // The Service's additional public IPs and the addresses its status lists go too
        // (read leniently: a bad annotation must not stop the removal).
        let mut ips = frontend_ips.to_vec();
        if scope == Scope::Any {
            let extra = if self.config.allow_additional_public_ips {
                additional_ips(service).unwrap_or_default()
            } else {
                Vec::new()
            };
            for ip in extra.into_iter().chain(status_ips(service)) {
                if !ips.contains(&ip) {
                    ips.push(ip);
                }
            }
        }
        let frontend_ips = ips.as_slice();
        if frontend_ips.is_empty() && scope == Scope::Any {
            return Ok(());
        }
        let Some(id) = self.id()? else {
            debug!(service = %svc, "no network security group configured; no rules to remove");
            return Ok(());
        };
        match self
            .write(&id, |rules| Ok(remove_shared(rules, frontend_ips, &scope, shared)))
            .await?
        {
            Written::Missing => {
                warn!(service = %svc, nsg = %id, "network security group not found; no rules to remove");
            }
            Written::Yes => info!(service = %svc, "NSG rules removed"),
            Written::Unchanged => {}
        }
        Ok(())
    }

    async fn write(
        &self,
        id: &str,
        mut change: impl FnMut(&mut Vec<SecurityRule>) -> Result<bool, ProviderError>,
    ) -> Result<Written, ProviderError> {
        let mut failure: Option<ProviderError> = None;
        let result = read_modify_write(
            &self.client,
            (
                "network.network_security_groups.get",
                "network.network_security_groups.create_or_update",
            ),
            id,
            NETWORK,
            |nsg: &mut models::SecurityGroup| match change(&mut nsg.properties.security_rules) {
                Ok(c) => Ok(c),
                Err(e) => {
                    failure = Some(e);
                    Ok(false)
                }
            },
        )
        .await;
        if let Some(e) = failure {
            return Err(e);
        }
        result.map_err(|e| {
            let throttled = e.is_throttled();
            let message = format!("updating network security group rules: {e}");
            if throttled {
                ProviderError::Throttled(message)
            } else {
                ProviderError::with_source(message, e)
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use kube::api::ObjectMeta;
    use std::collections::BTreeMap;

    fn svc(annotations: &[(&str, &str)], ranges: &[&str], ports: &[(i32, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                load_balancer_source_ranges: (!ranges.is_empty())
                    .then(|| ranges.iter().map(|s| s.to_string()).collect()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(p, proto)| ServicePort {
                            port: *p,
                            node_port: Some(30000 + *p),
                            protocol: Some(proto.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn rule_names_hash_protocol_sources_and_ports_as_upstream() {
        // md5("Tcp_Internet_443,80"): ports sort as strings.
        let name =
            allow_rule_name("Tcp", false, &["Internet".into()], &["80".into(), "443".into()]);
        let digest = Md5::digest(b"Tcp_Internet_443,80");
        let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(name, format!("k8s-azure-lb_allow_IPv4_{hex}"));
        // A rule upstream made on an AKS cluster (Tcp from Internet to 80, 443 and 10254).
        let aks = allow_rule_name(
            "Tcp",
            false,
            &["Internet".into()],
            &["80".into(), "443".into(), "10254".into()],
        );
        assert_eq!(aks, "k8s-azure-lb_allow_IPv4_0e71c69d55927e99928ad7d522e5dd4f");
        assert_eq!(deny_all_rule_name(true), "k8s-azure-lb_deny-all_IPv6");
    }

    #[test]
    fn a_public_service_is_open_to_the_internet_on_its_ports() {
        let a = access(&svc(&[], &[], &[(80, "TCP"), (443, "TCP"), (53, "UDP")])).unwrap();
        assert_eq!(a.service_tags, ["Internet"]);
        let rules = desired_rules(&a, &[ip("20.0.0.1"), ip("2603::1")]);
        let summary: Vec<_> = rules
            .iter()
            .map(|r| (r.protocol.as_str(), r.sources.clone(), r.ports.clone()))
            .collect();
        assert_eq!(rules.len(), 4, "{summary:?}");
        assert_eq!(rules[0].ports.as_deref(), Some(&["443".to_string(), "80".to_string()][..]));
        assert!(rules[0].name.contains("_IPv4_") && rules[1].name.contains("_IPv6_"));
        assert_eq!(rules[2].protocol, "Udp");
        assert_eq!(rules[1].destinations, [ip("2603::1")]);
    }

    #[test]
    fn an_internal_service_gets_no_rule_unless_ranges_open_it() {
        let internal = [(INTERNAL, "true")];
        let a = access(&svc(&internal, &[], &[(80, "TCP")])).unwrap();
        assert!(desired_rules(&a, &[ip("10.240.0.9")]).is_empty());
        let a = access(&svc(&internal, &["0.0.0.0/0"], &[(80, "TCP")])).unwrap();
        let rules = desired_rules(&a, &[ip("10.240.0.9")]);
        let sources: Vec<_> = rules.iter().map(|r| r.sources.clone()).collect();
        assert_eq!(sources, [vec!["Internet".to_string()], vec!["0.0.0.0/0".to_string()]]);
    }

    #[test]
    fn source_ranges_replace_internet_aggregate_and_deny_the_rest_when_asked() {
        let a = access(&svc(
            &[(DENY_ALL_EXCEPT_SOURCE_RANGES, "true")],
            &["10.1.0.0/16", "10.0.0.0/16", "10.0.5.0/24", "fd00::/64"],
            &[(80, "TCP")],
        ))
        .unwrap();
        let rules = desired_rules(&a, &[ip("20.0.0.1")]);
        let names: Vec<_> = rules.iter().map(|r| r.name.clone()).collect();
        assert_eq!(rules.len(), 2, "{names:?}");
        assert_eq!(rules[0].sources, ["10.0.0.0/15"]);
        assert_eq!(rules[1].name, "k8s-azure-lb_deny-all_IPv4");
        assert_eq!(rules[1].ports, None);
    }

    /// Annotations, source ranges, and the key the error names.
    type Case<'a> = (&'a [(&'a str, &'a str)], &'a [&'a str], &'a str);

    #[test]
    fn bad_annotations_are_invalid_naming_the_key() {
        let cases: [Case<'_>; 5] = [
            (&[(ALLOWED_IP_RANGES, "10.0.0.0/8,nope")], &[], ALLOWED_IP_RANGES),
            (&[(ALLOWED_IP_RANGES, "10.0.0.1/8")], &[], ALLOWED_IP_RANGES),
            (&[], &["300.0.0.0/8"], SOURCE_RANGES_FIELD),
            (&[(ALLOWED_SERVICE_TAGS, "Storage,10.0.0.0/8")], &[], ALLOWED_SERVICE_TAGS),
            (&[(ALLOWED_IP_RANGES, "10.0.0.0/8")], &["10.0.0.0/8"], ALLOWED_IP_RANGES),
        ];
        for (ann, ranges, key) in cases {
            match access(&svc(ann, ranges, &[(80, "TCP")])) {
                Err(ProviderError::Invalid { what, .. }) => assert_eq!(what, key),
                other => panic!("{ann:?} {ranges:?}: {other:?}"),
            }
        }
        match access(&svc(&[(DISABLE_NSG_RULE, "yes")], &[], &[])) {
            Err(ProviderError::Invalid { what, .. }) => assert_eq!(what, DISABLE_NSG_RULE),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn floating_ip_disabled_uses_node_ports() {
        let a = access(&svc(&[(DISABLE_FLOATING_IP, "true")], &[], &[(80, "TCP")])).unwrap();
        assert_eq!(a.ports, [("Tcp", vec!["30080".to_string()])]);
    }

    fn operator_rule(priority: i32) -> SecurityRule {
        SecurityRule {
            name: Some("allow-ssh".into()),
            properties: SecurityRuleProperties {
                priority: Some(priority),
                protocol: Some("Tcp".into()),
                access: Some("Allow".into()),
                direction: Some("Inbound".into()),
                destination_port_range: Some("22".into()),
                source_address_prefix: Some("*".into()),
                destination_address_prefix: Some("*".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn shared_rules_carry_both_services_and_priorities_skip_taken_ones() {
        let mut rules = vec![operator_rule(500)];
        let a = access(&svc(&[], &[], &[(80, "TCP")])).unwrap();
        let one = [ip("20.0.0.1")];
        let two = [ip("20.0.0.2")];
        assert!(apply(&mut rules, &desired_rules(&a, &one), &one, &Scope::Any).unwrap());
        assert!(
            !apply(&mut rules, &desired_rules(&a, &one), &one, &Scope::Any).unwrap(),
            "idempotent"
        );
        assert!(apply(&mut rules, &desired_rules(&a, &two), &two, &Scope::Any).unwrap());
        assert_eq!(rules.len(), 2);
        assert_eq!(rules[1].properties.priority, Some(501));
        assert_eq!(
            rules[1].properties.destination_address_prefixes.as_deref(),
            Some(&["20.0.0.1".to_string(), "20.0.0.2".to_string()][..])
        );
        // A changed port moves only this Service's address to a new rule.
        let b = access(&svc(&[], &[], &[(8080, "TCP")])).unwrap();
        assert!(apply(&mut rules, &desired_rules(&b, &two), &two, &Scope::Any).unwrap());
        assert_eq!(rules.len(), 3);
        assert_eq!(rules[1].properties.destination_address_prefix.as_deref(), Some("20.0.0.1"));
        assert_eq!(rules[2].properties.priority, Some(502));
        assert!(remove(&mut rules, &one, &Scope::Any));
        assert_eq!(rules.len(), 2, "the emptied rule goes");
        assert!(remove(&mut rules, &two, &Scope::Any));
        assert_eq!(rules, vec![operator_rule(500)]);
        assert!(!remove(&mut rules, &two, &Scope::Any));
    }

    #[test]
    fn node_ip_rules_of_other_services_are_left_alone() {
        // Floating IP disabled: destinations are the node IPs every such Service shares.
        let nodes = [ip("10.240.0.4"), ip("10.240.0.5")];
        let a_svc = svc(&[(DISABLE_FLOATING_IP, "true")], &[], &[(80, "TCP")]);
        let b_svc = svc(&[(DISABLE_FLOATING_IP, "true")], &[], &[(81, "TCP")]);
        let (a, b) = (access(&a_svc).unwrap(), access(&b_svc).unwrap());
        let mut rules = Vec::new();
        apply(&mut rules, &desired_rules(&a, &nodes), &nodes, &scope_of(&a_svc)).unwrap();
        apply(&mut rules, &desired_rules(&b, &nodes), &nodes, &scope_of(&b_svc)).unwrap();
        assert_eq!(rules.len(), 2, "b did not take the node IPs out of a's rule");
        assert!(
            rules.iter().all(
                |r| r.properties.destination_address_prefixes.as_ref().map(Vec::len) == Some(2)
            )
        );
        assert!(!apply(&mut rules, &desired_rules(&a, &nodes), &nodes, &scope_of(&a_svc)).unwrap());
        assert!(remove(&mut rules, &[], &scope_of(&a_svc)), "without knowing the node IPs");
        assert_eq!(rules.len(), 1);
        assert_eq!(
            rules[0].properties.destination_port_ranges.as_deref(),
            Some(&["30081".to_string()][..])
        );
    }

    #[test]
    fn stale_addresses_leave_every_managed_rule_but_shared_ones_stay_where_needed() {
        let mut rules = vec![operator_rule(500)];
        let a = access(&svc(&[], &[], &[(80, "TCP")])).unwrap();
        let with_extra = [ip("20.0.0.1"), ip("20.1.2.3")];
        apply(&mut rules, &desired_rules(&a, &with_extra), &with_extra, &Scope::Any).unwrap();
        assert_eq!(
            rules[1].properties.destination_address_prefixes.as_ref().map(Vec::len),
            Some(2)
        );
        // The extra address is no longer wanted: it leaves the rule the Service keeps.
        let frontend = [ip("20.0.0.1")];
        let stale = [ip("20.1.2.3")];
        let wanted = desired_rules(&a, &frontend);
        let none = Shared::default();
        assert!(
            apply_dropping(&mut rules, &wanted, &frontend, &stale, &Scope::Any, &none).unwrap()
        );
        assert_eq!(rules[1].properties.destination_address_prefix.as_deref(), Some("20.0.0.1"));
        assert_eq!(rules[0], operator_rule(500), "the operator's rule is untouched");
        // Stale but shared with another Service on port 80: it stays.
        apply(&mut rules, &desired_rules(&a, &with_extra), &with_extra, &Scope::Any).unwrap();
        let shared = Shared { ips: stale.to_vec(), ports: vec![("Tcp".into(), "80".into())] };
        assert!(
            !apply_dropping(&mut rules, &wanted, &frontend, &stale, &Scope::Any, &shared).unwrap()
        );
        assert_eq!(
            rules[1].properties.destination_address_prefixes.as_ref().map(Vec::len),
            Some(2)
        );
    }
}
