//! The nodes' instances (upstream's `getInstancesByNames`) and the network tags the firewalls
//! target (upstream's `computeHostTags`, used when `node-tags` is not configured).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;

use ccm_core::cloud::ProviderError;

use super::LbError;
use super::api::Api;

/// An instance backing a node.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Host {
    /// The instance name.
    pub name: String,
    /// Its zone.
    pub zone: String,
    /// Its network tags.
    pub tags: Vec<String>,
}

impl Host {
    /// `/zones/<zone>/instances/<name>`: how upstream compares target-pool members.
    pub fn comparable(&self) -> String {
        format!("/zones/{}/instances/{}", self.zone, self.name)
    }
}

/// The part of a link from `/zones/` on (upstream's `hostURLToComparablePath`).
pub(crate) fn comparable_path(link: &str) -> String {
    link.find("/zones/").map(|i| link[i..].to_string()).unwrap_or_default()
}

/// A node name as an instance name: up to the first `.` (upstream's
/// `canonicalizeInstanceName`).
pub(crate) fn instance_name(node: &str) -> &str {
    node.split('.').next().unwrap_or(node)
}

/// The nodes' names as instance names, sorted and without duplicates.
pub(crate) fn node_instance_names(nodes: &[Node]) -> Vec<String> {
    let set: BTreeSet<String> = nodes
        .iter()
        .filter_map(|n| n.metadata.name.as_deref())
        .map(|n| instance_name(n).to_string())
        .collect();
    set.into_iter().collect()
}

/// The instances named `names`, looked for zone by zone across the managed zones with one
/// (paged) listing per zone until all are found, filtered by `node-instance-prefix` when every
/// name has it. Names not found are skipped (logged); when none is found while some were
/// asked for, it is an error, so a target pool is never emptied by a lookup gone wrong.
pub(crate) async fn hosts(api: &Api<'_>, names: &[String]) -> Result<Vec<Host>, LbError> {
    if names.is_empty() {
        return Ok(vec![]);
    }
    let prefix = api.scope.node_instance_prefix.clone().unwrap_or_default();
    let prefix = if names.iter().all(|n| n.starts_with(&prefix)) { prefix } else { String::new() };
    let filter = if prefix.is_empty() { String::new() } else { format!("name eq {prefix}.*") };
    let mut wanted: BTreeMap<&str, Option<Host>> =
        names.iter().map(|n| (n.as_str(), None)).collect();
    let mut remaining = wanted.len();
    for zone in &api.scope.zones {
        if remaining == 0 {
            break;
        }
        for inst in api.instances(zone, &filter).await? {
            let Some(name) = inst.name.as_deref() else { continue };
            let Some(slot) = wanted.get_mut(name) else { continue };
            if let Some(h) = slot {
                tracing::error!(instance = name, zone, other_zone = %h.zone, "GCE: instance name duplicated across zones");
                continue;
            }
            *slot = Some(Host {
                name: name.to_string(),
                zone: zone.clone(),
                tags: inst.tags.map(|t| t.items).unwrap_or_default(),
            });
            remaining -= 1;
        }
    }
    let missing: Vec<&str> = wanted.iter().filter(|(_, h)| h.is_none()).map(|(n, _)| *n).collect();
    let found: Vec<Host> = wanted.into_values().flatten().collect();
    if !missing.is_empty() {
        tracing::warn!(
            ?missing,
            found = found.len(),
            "GCE: instances of some nodes not found; continuing without them"
        );
    }
    if found.is_empty() {
        return Err(ProviderError::other(format!(
            "none of the instances of the {} node(s) was found in zones {:?}",
            names.len(),
            api.scope.zones
        ))
        .into());
    }
    Ok(found)
}

/// The firewalls' target tags: `node-tags` when configured, else for each instance the longest
/// of its tags that is a prefix of its name (upstream's `computeHostTags`), sorted.
pub(crate) fn target_tags(configured: &[String], hosts: &[Host]) -> Result<Vec<String>, String> {
    if !configured.is_empty() {
        return Ok(configured.to_vec());
    }
    let mut tags = BTreeSet::new();
    for h in hosts {
        let longest =
            h.tags.iter().filter(|t| h.name.starts_with(t.as_str())).max_by_key(|t| t.len());
        match longest {
            Some(t) => {
                tags.insert(t.clone());
            }
            None => {
                return Err(format!(
                    "no node tags supplied (gce.conf `node-tags`) and instance {} has no network tag that is a prefix of its name: cannot target the firewall",
                    h.name
                ));
            }
        }
    }
    if tags.is_empty() {
        return Err("no node tags supplied (gce.conf `node-tags`) and no instances found: cannot target the firewall".into());
    }
    Ok(tags.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host(name: &str, tags: &[&str]) -> Host {
        Host {
            name: name.into(),
            zone: "z".into(),
            tags: tags.iter().map(|t| t.to_string()).collect(),
        }
    }

    #[test]
    fn tags_are_the_longest_name_prefix() {
        let hosts = [
            host("gke-c1-pool-1-abcd", &["gke-c1", "gke-c1-pool-1", "web"]),
            host("gke-c1-pool-2-efgh", &["gke-c1"]),
        ];
        assert_eq!(target_tags(&[], &hosts).unwrap(), vec!["gke-c1", "gke-c1-pool-1"]);
        let e = target_tags(&[], &[host("node-a", &["k8s-node"])]).unwrap_err();
        assert!(e.contains("node-tags") && e.contains("node-a"), "{e}");
        assert_eq!(
            target_tags(&["k8s-node".into()], &[host("node-a", &[])]).unwrap(),
            vec!["k8s-node"]
        );
        assert!(target_tags(&[], &[]).is_err());
    }

    #[test]
    fn names_and_paths() {
        assert_eq!(instance_name("node-a.c.project.internal"), "node-a");
        assert_eq!(
            comparable_path("https://x/compute/v1/projects/p/zones/z1/instances/i"),
            "/zones/z1/instances/i"
        );
        assert_eq!(comparable_path("nonsense"), "");
        assert_eq!(host("i", &[]).comparable(), "/zones/z/instances/i");
    }
}
