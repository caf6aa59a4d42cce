//! Pure helpers over Nodes shared by the node controllers: taints, readiness, labels, the
//! provided-node-ip annotation and the address-update rules. No API calls here, so every
//! rule is unit-tested without a server.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::net::IpAddr;

use k8s_openapi::api::core::v1::{Node, NodeAddress, Taint};

use crate::cloud::InstanceMetadata;
use crate::names;

/// The node's taints (empty when none).
pub fn taints(node: &Node) -> &[Taint] {
    node.spec.as_ref().and_then(|s| s.taints.as_deref()).unwrap_or_default()
}

/// Whether the node has a taint with this key (any effect).
pub fn has_taint(node: &Node, key: &str) -> bool {
    taints(node).iter().any(|t| t.key == key)
}

/// The status of the node's Ready condition: `True`, `False`, or `Unknown` when absent.
pub fn ready_status(node: &Node) -> &str {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == names::CONDITION_READY))
        .map(|c| c.status.as_str())
        .unwrap_or("Unknown")
}

/// The node's `spec.providerID`, empty when unset.
pub fn provider_id(node: &Node) -> &str {
    node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default()
}

/// The node's current `status.addresses`.
pub fn addresses(node: &Node) -> &[NodeAddress] {
    node.status.as_ref().and_then(|s| s.addresses.as_deref()).unwrap_or_default()
}

/// Whether a label key is in a reserved Kubernetes namespace (`kubernetes.io/` or
/// `k8s.io/`, alone or as the last part of a dotted prefix). Such keys are never taken from
/// a provider's additional labels.
pub fn is_reserved_label(key: &str) -> bool {
    ["kubernetes.io/", "k8s.io/"].iter().any(|ns| {
        key.match_indices(ns).any(|(i, _)| i == 0 || key.as_bytes().get(i - 1) == Some(&b'.'))
    })
}

/// The labels initialisation writes: instance type, zone and region (GA and deprecated
/// beta), and the provider's additional labels that are not reserved and not already on the
/// node (existing labels are never overwritten). Returns the full new label map.
pub fn labels_with_metadata(
    existing: &BTreeMap<String, String>,
    meta: &InstanceMetadata,
) -> BTreeMap<String, String> {
    let mut labels = existing.clone();
    let mut set_pair = |ga: &str, beta: &str, value: &str| {
        if !value.is_empty() {
            labels.insert(ga.to_string(), value.to_string());
            labels.insert(beta.to_string(), value.to_string());
        }
    };
    set_pair(names::LABEL_INSTANCE_TYPE, names::LABEL_INSTANCE_TYPE_BETA, &meta.instance_type);
    set_pair(names::LABEL_ZONE, names::LABEL_ZONE_BETA, &meta.zone);
    set_pair(names::LABEL_REGION, names::LABEL_REGION_BETA, &meta.region);
    for (k, v) in &meta.additional_labels {
        if is_reserved_label(k) {
            tracing::info!(label = %k, "discarding node label with kubernetes namespace");
            continue;
        }
        match existing.get(k) {
            Some(old) if old != v => {
                tracing::info!(label = %k, "discarding node label that is already present");
            }
            Some(_) => {}
            None => {
                labels.insert(k.clone(), v.clone());
            }
        }
    }
    labels
}

/// For initialised nodes: the deprecated beta labels are the source of truth for their GA
/// twins (as upstream). Returns the GA labels to set, empty when nothing is missing.
pub fn missing_ga_labels(existing: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    [
        (names::LABEL_ZONE_BETA, names::LABEL_ZONE),
        (names::LABEL_REGION_BETA, names::LABEL_REGION),
        (names::LABEL_INSTANCE_TYPE_BETA, names::LABEL_INSTANCE_TYPE),
    ]
    .into_iter()
    .filter_map(|(primary, secondary)| {
        let value = existing.get(primary)?;
        (existing.get(secondary) != Some(value)).then(|| (secondary.to_string(), value.clone()))
    })
    .collect()
}

/// Parses an IP the way Go's lenient parser does: IPv4 parts may have leading zeros.
fn parse_ip_lenient(s: &str) -> Option<IpAddr> {
    if let Ok(ip) = s.parse::<IpAddr>() {
        return Some(ip);
    }
    let parts: Vec<&str> = s.split('.').collect();
    if parts.len() != 4 {
        return None;
    }
    let mut octets = [0u8; 4];
    for (o, p) in octets.iter_mut().zip(parts) {
        if p.is_empty() || p.len() > 3 || !p.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        *o = p.parse().ok()?;
    }
    Some(IpAddr::from(octets))
}

/// Parses the `alpha.kubernetes.io/provided-node-ip` annotation: one IP, or a dual-stack
/// pair (comma-separated, no spaces trimmed, as upstream).
pub fn parse_provided_node_ip(value: &str) -> Result<Vec<IpAddr>, String> {
    let inner = || -> Result<Vec<IpAddr>, String> {
        let ips = value
            .split(',')
            .map(|p| parse_ip_lenient(p).ok_or_else(|| format!("could not parse {p:?}")))
            .collect::<Result<Vec<_>, _>>()?;
        if ips.len() > 2 || (ips.len() == 2 && ips[0].is_ipv4() == ips[1].is_ipv4()) {
            return Err("must contain either a single IP or a dual-stack pair of IPs".into());
        }
        if ips.len() == 2 && ips.iter().any(IpAddr::is_unspecified) {
            return Err("dual-stack node IP cannot include '0.0.0.0' or '::'".into());
        }
        Ok(ips)
    };
    inner().map_err(|e| format!("failed to parse node IP {value:?}: {e}"))
}

/// Orders the cloud's addresses by the provided node IP(s): for each IP in order, every
/// cloud address equal to it; then every cloud address of a type none of those had.
/// Fails when an IP matches no cloud address.
pub fn addresses_for_provided_ip(
    annotation: &str,
    cloud: &[NodeAddress],
) -> Result<Vec<NodeAddress>, String> {
    let ips = parse_provided_node_ip(annotation)?;
    let mut out = Vec::new();
    let mut matched_types = HashSet::new();
    for ip in ips {
        let matches: Vec<&NodeAddress> =
            cloud.iter().filter(|a| parse_ip_lenient(&a.address) == Some(ip)).collect();
        if matches.is_empty() {
            return Err(format!(
                "failed to get node address from cloud provider that matches ip: {ip}"
            ));
        }
        for a in matches {
            matched_types.insert(a.type_.clone());
            out.push(a.clone());
        }
    }
    out.extend(cloud.iter().filter(|a| !matched_types.contains(&a.type_)).cloned());
    Ok(out)
}

/// Whether the address list changed, by upstream's rule: a different length, or an address
/// that differs from the last old address of its type.
///
/// QUIRK kept: with several addresses of one type, a pure reordering can go unnoticed. Upstream
/// operators see the same behaviour, and the next real change corrects it.
pub fn addresses_changed(old: &[NodeAddress], new: &[NodeAddress]) -> bool {
    if old.len() != new.len() {
        return true;
    }
    let by_type: HashMap<&str, &str> =
        old.iter().map(|a| (a.type_.as_str(), a.address.as_str())).collect();
    new.iter().any(|a| by_type.get(a.type_.as_str()) != Some(&a.address.as_str()))
}

/// The addresses to write for an initialised node, or `None` when nothing changes. Keeps
/// the kubelet's Hostname addresses when the cloud reports none, and honours the
/// provided-node-ip annotation (an unusable annotation leaves the node untouched).
pub fn updated_addresses(node: &Node, cloud: &[NodeAddress]) -> Option<Vec<NodeAddress>> {
    if cloud.is_empty() {
        return None;
    }
    let mut addrs = cloud.to_vec();
    if !addrs.iter().any(|a| a.type_ == "Hostname") {
        addrs.extend(addresses(node).iter().filter(|a| a.type_ == "Hostname").cloned());
    }
    if let Some(ann) =
        node.metadata.annotations.as_ref().and_then(|a| a.get(names::ANNOTATION_PROVIDED_NODE_IP))
    {
        match addresses_for_provided_ip(ann, &addrs) {
            Ok(a) => addrs = a,
            Err(e) => {
                tracing::warn!(node = ?node.metadata.name, error = %e, "not updating addresses");
                return None;
            }
        }
    }
    addresses_changed(addresses(node), &addrs).then_some(addrs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn addr(t: &str, a: &str) -> NodeAddress {
        NodeAddress { type_: t.into(), address: a.into() }
    }

    #[test]
    fn reserved_label_namespaces() {
        for k in ["kubernetes.io/x", "node.kubernetes.io/x", "k8s.io/x", "a.k8s.io/x"] {
            assert!(is_reserved_label(k), "{k}");
        }
        for k in ["example.com/x", "mykubernetes.io/x", "zone", "k8s.io.example.com/x"] {
            assert!(!is_reserved_label(k), "{k}");
        }
    }

    #[test]
    fn provided_node_ip_parsing() {
        assert_eq!(
            parse_provided_node_ip("10.0.0.1").unwrap(),
            vec!["10.0.0.1".parse::<IpAddr>().unwrap()]
        );
        assert_eq!(
            parse_provided_node_ip("010.000.000.001").unwrap().len(),
            1,
            "leading zeros allowed"
        );
        assert_eq!(parse_provided_node_ip("10.0.0.1,fd00::1").unwrap().len(), 2);
        let e = parse_provided_node_ip("10.0.0.1,10.0.0.2").unwrap_err();
        assert!(e.contains("dual-stack pair"), "{e}");
        let e = parse_provided_node_ip("0.0.0.0,fd00::1").unwrap_err();
        assert!(e.contains("cannot include '0.0.0.0'"), "{e}");
        let e = parse_provided_node_ip("10.0.0.1, fd00::1").unwrap_err();
        assert!(e.contains("could not parse \" fd00::1\""), "no trimming: {e}");
        assert!(e.starts_with("failed to parse node IP"), "{e}");
    }

    #[test]
    fn provided_ip_orders_matches_first_then_other_types() {
        let cloud = vec![
            addr("InternalIP", "10.0.0.1"),
            addr("InternalIP", "10.0.0.2"),
            addr("ExternalIP", "1.2.3.4"),
            addr("Hostname", "n1"),
        ];
        let got = addresses_for_provided_ip("10.0.0.2", &cloud).unwrap();
        assert_eq!(
            got,
            vec![
                addr("InternalIP", "10.0.0.2"),
                addr("ExternalIP", "1.2.3.4"),
                addr("Hostname", "n1")
            ]
        );
        let e = addresses_for_provided_ip("10.9.9.9", &cloud).unwrap_err();
        assert!(e.contains("matches ip: 10.9.9.9"), "{e}");
    }

    #[test]
    fn change_detection_follows_upstream_rule() {
        let a = vec![addr("InternalIP", "10.0.0.1"), addr("Hostname", "n1")];
        assert!(!addresses_changed(&a, &a));
        assert!(addresses_changed(&a, &a[..1]));
        assert!(addresses_changed(&a, &[addr("InternalIP", "10.0.0.9"), addr("Hostname", "n1")]));
    }

    #[test]
    fn beta_labels_fill_missing_ga_twins() {
        let mut l = BTreeMap::new();
        l.insert(names::LABEL_ZONE_BETA.to_string(), "z1".to_string());
        l.insert(names::LABEL_INSTANCE_TYPE_BETA.to_string(), "big".to_string());
        l.insert(names::LABEL_INSTANCE_TYPE.to_string(), "big".to_string());
        let missing = missing_ga_labels(&l);
        assert_eq!(missing.len(), 1);
        assert_eq!(missing.get(names::LABEL_ZONE).map(String::as_str), Some("z1"));
    }

    #[test]
    fn additional_labels_never_overwrite_or_use_reserved_keys() {
        let mut existing = BTreeMap::new();
        existing.insert("team".to_string(), "a".to_string());
        let meta = InstanceMetadata {
            instance_type: "m5".into(),
            additional_labels: [("team", "b"), ("k8s.io/x", "y"), ("example.com/rack", "r1")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            ..Default::default()
        };
        let l = labels_with_metadata(&existing, &meta);
        assert_eq!(l.get("team").map(String::as_str), Some("a"));
        assert!(!l.contains_key("k8s.io/x"));
        assert_eq!(l.get("example.com/rack").map(String::as_str), Some("r1"));
        assert_eq!(l.get(names::LABEL_INSTANCE_TYPE_BETA).map(String::as_str), Some("m5"));
        assert!(!l.contains_key(names::LABEL_ZONE), "empty zone writes no label");
    }
}
