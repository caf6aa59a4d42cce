//! The Services' public IPs (upstream `determinePublicIPName`, `ensurePublicIPExists`,
//! `reconcilePublicIP`, `serviceOwnsPublicIP`): `<cluster>-a<uid>` created Standard/Static
//! and tagged `k8s-azure-service: <ns>/<name>`, `k8s-azure-cluster-name: <cluster>` (+ the
//! config's tags and `azure-pip-tags`), or the one the Service names (`azure-pip-name`) or
//! addresses (`loadBalancerIP`), in `azure-load-balancer-resource-group` or the cluster's
//! resource group.
//!
//! A public IP without a service tag was made by a user: it is used as is (only a DNS label
//! the Service asks for is set) and never deleted. A tagged one is released when no Service
//! in its tag remains — deleted only when its cluster tag is this cluster (or absent, as
//! upstream's legacy public IPs).

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_core::cloud::ProviderError;
use serde_json::json;
use tracing::{info, warn};

use crate::client::ArmClient;
use crate::client::api_version::NETWORK;
use crate::client::models::{DnsSettings, PublicIpAddress, PublicIpProperties, Sku};
use crate::config::{Config, ServiceGroups};

use super::annotations::{Family, ServiceConfig};
use super::naming::{
    self, CLUSTER_TAG, DNS_SERVICE_TAG, LEGACY_CLUSTER_TAG, LEGACY_DNS_SERVICE_TAG,
    LEGACY_SERVICE_TAG, PIP_TYPE, SERVICE_TAG,
};
use super::{Action, PIP_OPS, rmw};

/// ARM's answer to deleting a public IP something still uses.
const CANNOT_BE_DELETED: &str = "PublicIPAddressCannotBeDeleted";

/// The config's `tags` / `tagsMap` (the map wins), as upstream's `parseTags`.
pub fn config_tags(config: &Config) -> Result<BTreeMap<String, String>, ProviderError> {
    // One reader of `tags`/`tagsMap` (the config's); malformed pairs were refused at start
    // by `Config::validate`.
    Ok(config.resource_tags())
}

/// Adds or updates `want` in `tags` (keys case-insensitively); other tags stay. Returns
/// whether anything changed.
pub fn merge_tags(tags: &mut BTreeMap<String, String>, want: &BTreeMap<String, String>) -> bool {
    let mut changed = false;
    for (k, v) in want {
        match tags.keys().find(|h| h.eq_ignore_ascii_case(k)).cloned() {
            Some(have) => {
                if !tags.get(&have).is_some_and(|x| x.eq_ignore_ascii_case(v)) {
                    tags.insert(have, v.clone());
                    changed = true;
                }
            }
            None => {
                tags.insert(k.clone(), v.clone());
                changed = true;
            }
        }
    }
    changed
}

fn tag<'a>(pip: &'a PublicIpAddress, key: &str, legacy: &str) -> Option<&'a str> {
    pip.tag(key).or_else(|| pip.tag(legacy)).filter(|v| !v.is_empty())
}

/// The Services in the public IP's service tag.
pub fn services_of(pip: &PublicIpAddress) -> Vec<String> {
    tag(pip, SERVICE_TAG, LEGACY_SERVICE_TAG).map(naming::tag_services).unwrap_or_default()
}

/// Made by a user: no service tag.
pub fn user_made(pip: &PublicIpAddress) -> bool {
    tag(pip, SERVICE_TAG, LEGACY_SERVICE_TAG).is_none()
}

/// Tagged for `service` by `cluster` (or by a cluster that did not tag itself).
pub fn owned_by(pip: &PublicIpAddress, service: &str, cluster: &str) -> bool {
    services_of(pip).iter().any(|s| s.eq_ignore_ascii_case(service))
        && tag(pip, CLUSTER_TAG, LEGACY_CLUSTER_TAG).is_none_or(|c| c.eq_ignore_ascii_case(cluster))
}

/// Why Service `service` (`<namespace>/<name>`) of `cluster` may not use `pip`: it is
/// tagged for another cluster, or for a Service of another namespace. `None` when it may: a
/// user's (untagged) public IP, or one of this cluster (or legacy, without a cluster tag)
/// tagged only for Services of the same namespace (upstream's sharing). The reason names
/// neither the other cluster nor the other Service.
pub fn refusal(pip: &PublicIpAddress, service: &str, cluster: &str) -> Option<String> {
    if tag(pip, CLUSTER_TAG, LEGACY_CLUSTER_TAG).is_some_and(|c| !c.eq_ignore_ascii_case(cluster)) {
        return Some(format!("public IP {} is tagged for another cluster", pip.name()));
    }
    let ns = namespace(service);
    services_of(pip)
        .iter()
        .any(|s| !namespace(s).eq_ignore_ascii_case(ns))
        .then(|| format!("public IP {} is tagged for a Service of another namespace", pip.name()))
}

/// The namespace of a `<namespace>/<name>` key (the whole key when it has no `/`).
fn namespace(key: &str) -> &str {
    key.split_once('/').map_or(key, |(ns, _)| ns)
}

/// `GET /subscriptions/<sub>/providers/Microsoft.Compute` (ARM's resource providers API).
const PROVIDERS_API_VERSION: &str = "2021-04-01";

/// How long the region → zones map is used before it is read again (upstream refreshes it
/// every 30 minutes).
const ZONES_TTL: Duration = Duration::from_secs(30 * 60);

/// The availability zones of each region, as upstream's `getRegionZonesBackoff` reads them:
/// the `zoneMappings` of `Microsoft.Compute`'s `virtualMachines` resource type (locations as
/// ARM's display names, lower-cased without spaces: `East US` → `eastus`). Read once and
/// kept for [`ZONES_TTL`]; a failed read is not kept (the next call reads again) and is an
/// error for the caller.
#[derive(Default)]
pub struct RegionZones {
    cache: tokio::sync::Mutex<Option<(Instant, ZonesByRegion)>>,
}

/// Region (ARM's location name) → its availability zones.
type ZonesByRegion = BTreeMap<String, Vec<String>>;

impl RegionZones {
    /// The zones of `location` (empty: a region without zones).
    pub async fn of(
        &self,
        client: &ArmClient,
        location: &str,
    ) -> Result<Vec<String>, ProviderError> {
        let mut cache = self.cache.lock().await;
        let fresh = cache.as_ref().is_some_and(|(at, _)| at.elapsed() < ZONES_TTL);
        if !fresh {
            let path =
                format!("/subscriptions/{}/providers/Microsoft.Compute", client.subscription_id());
            let provider: serde_json::Value =
                client.get("resources.providers.get", &path, PROVIDERS_API_VERSION, &[]).await?;
            *cache = Some((Instant::now(), zone_mappings(&provider)));
        }
        let want = normalize_location(location);
        Ok(cache.as_ref().and_then(|(_, m)| m.get(&want)).cloned().unwrap_or_default())
    }
}

/// `East US` → `eastus`.
fn normalize_location(l: &str) -> String {
    l.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase()
}

/// Region → zones (sorted) from a resource provider's `virtualMachines` resource type.
fn zone_mappings(provider: &serde_json::Value) -> BTreeMap<String, Vec<String>> {
    let mut out = BTreeMap::new();
    let types = provider["resourceTypes"].as_array().into_iter().flatten();
    for t in types.filter(|t| {
        t["resourceType"].as_str().is_some_and(|r| r.eq_ignore_ascii_case("virtualMachines"))
    }) {
        for m in t["zoneMappings"].as_array().into_iter().flatten() {
            let Some(location) = m["location"].as_str() else { continue };
            let mut zones: Vec<String> = m["zones"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|z| z.as_str().map(str::to_string))
                .collect();
            zones.sort();
            zones.dedup();
            out.insert(normalize_location(location), zones);
        }
    }
    out
}

/// The public IPs of the Services.
pub struct PublicIps {
    client: Arc<ArmClient>,
    config: Arc<Config>,
    zones: RegionZones,
}

impl PublicIps {
    /// A manager for public IPs.
    pub fn new(client: Arc<ArmClient>, config: Arc<Config>) -> Self {
        PublicIps { client, config, zones: RegionZones::default() }
    }

    /// The availability zones of the config's `location` (cached, see [`RegionZones`]): new
    /// public IPs and new internal frontends are made in all of them (zone-redundant), as
    /// upstream does; existing ones keep theirs (ARM never changes a resource's zones).
    pub async fn region_zones(&self) -> Result<Vec<String>, ProviderError> {
        let location = self.config.location.as_deref().unwrap_or_default();
        self.zones.of(&self.client, location).await
    }

    /// The resource group of the Service's public IPs.
    pub fn resource_group(&self, svc_rg: Option<&str>) -> String {
        svc_rg.map(str::to_string).unwrap_or_else(|| self.config.resource_group().to_string())
    }

    /// Every public IP of the resource groups public IPs of Services may be in.
    pub async fn list(&self, svc_rg: Option<&str>) -> Result<Vec<PublicIpAddress>, ProviderError> {
        let mut groups = vec![self.resource_group(svc_rg)];
        let cluster_rg = self.config.resource_group().to_string();
        if !groups.iter().any(|g| g.eq_ignore_ascii_case(&cluster_rg)) {
            groups.push(cluster_rg);
        }
        self.list_in(groups).await
    }

    /// Every public IP of the resource groups `groups`, one listing each.
    async fn list_in(
        &self,
        groups: impl IntoIterator<Item = String>,
    ) -> Result<Vec<PublicIpAddress>, ProviderError> {
        let mut out = Vec::new();
        for rg in groups {
            let collection = self.client.collection_id(&rg, PIP_TYPE)?;
            out.extend(
                self.client
                    .list::<PublicIpAddress>(
                        "network.public_ip_addresses.list",
                        &collection,
                        NETWORK,
                        &[],
                    )
                    .await?,
            );
        }
        Ok(out)
    }

    /// The public IP the Service uses for `family`, created or updated as needed.
    pub async fn ensure(
        &self,
        cluster: &str,
        svc: &ServiceConfig,
        family: Family,
    ) -> Result<PublicIpAddress, ProviderError> {
        let rg = self.resource_group(svc.resource_group.as_deref());
        let (name, named, source) = if let Some(n) = svc.pip_name.get(&family) {
            let key = if family == Family::V6 && svc.dual_stack() {
                super::annotations::PIP_NAME_IPV6
            } else {
                super::annotations::PIP_NAME
            };
            (n.clone(), true, key.to_string())
        } else if svc.pip_prefix_id.contains_key(&family) {
            (naming::pip_name(cluster, svc, family), false, "public IP".to_string())
        } else if let Some(ip) = svc.load_balancer_ip.get(&family) {
            (self.find_by_address(&rg, ip).await?, true, "loadBalancerIP".to_string())
        } else {
            (naming::pip_name(cluster, svc, family), false, "public IP".to_string())
        };
        let id = self.client.resource_id(&rg, PIP_TYPE, &name)?;
        let config_tags = config_tags(&self.config)?;
        let location = self.config.location.clone().unwrap_or_default();
        // The zones a new public IP gets (a named one must exist: never created, never
        // re-zoned).
        let zones = if named { Vec::new() } else { self.region_zones().await? };
        // Frontends of the cluster's public load balancer: another Service's there is shared.
        let lb_frontends = format!(
            "{}/frontendipconfigurations/",
            self.client.resource_id(
                self.config.load_balancer_resource_group(),
                naming::LB_TYPE,
                &naming::lb_name(&self.config, cluster, false),
            )?
        )
        .to_ascii_lowercase();
        let out = rmw::<PublicIpProperties>(
            &self.client,
            PIP_OPS,
            &id,
            &mut |current| {
                let Some(pip) = current else {
                    if named {
                        return Err(ProviderError::other(format!(
                            "public IP {name} (from the Service's annotations) does not exist in resource group {rg}"
                        )));
                    }
                    let mut pip = PublicIpAddress {
                        name: Some(name.clone()),
                        location: Some(location.clone()),
                        sku: Some(Sku { name: Some("Standard".into()), tier: Some("Regional".into()), ..Default::default() }),
                        zones: (!zones.is_empty()).then(|| zones.clone()),
                        tags: Some(BTreeMap::new()),
                        properties: PublicIpProperties {
                            public_ip_allocation_method: Some("Static".into()),
                            public_ip_address_version: Some(family.arm().into()),
                            ip_tags: svc.pip_ip_tags.as_ref().map(|t| {
                                t.iter().map(|(k, v)| json!({"ipTagType": k, "tag": v})).collect()
                            }),
                            ..Default::default()
                        },
                        ..Default::default()
                    };
                    if let Some(prefix) = svc.pip_prefix_id.get(&family) {
                        pip.properties.extra.insert("publicIPPrefix".into(), json!({"id": prefix}));
                    }
                    update(&mut pip, svc, cluster, &config_tags)?;
                    return Ok(Action::Put(pip));
                };
                let mut pip = pip;
                // Another cluster's or another namespace's: never re-tagged, used or
                // reported (an error naming the annotation; nothing written).
                if let Some(message) = refusal(&pip, &svc.key, cluster) {
                    return Err(ProviderError::Invalid { what: source.clone(), message });
                }
                // Used by something else: the Service's own frontend, or another Service's
                // frontend on the cluster's load balancer (shared, upstream's secondary
                // Service) are fine; a NIC, another load balancer or an operator's frontend
                // is an error.
                if let Some(user) = &pip.properties.ip_configuration {
                    let frontend = naming::last_segment(&user.id);
                    let lower = user.id.to_ascii_lowercase();
                    let shareable = lower.starts_with(&lb_frontends)
                        && super::service_prefix(frontend).is_some();
                    if !lower.contains("/frontendipconfigurations/")
                        || !(naming::owns(svc, frontend) || shareable)
                    {
                        return Err(ProviderError::Invalid {
                            what: source.clone(),
                            message: format!(
                                "public IP {name} is already used by {}; only a frontend of the cluster's load balancer {} made for a Service can be shared",
                                user.id,
                                naming::lb_name(&self.config, cluster, false)
                            ),
                        });
                    }
                }
                // One of ours whose last operation failed is put again (ARM retries it;
                // a load balancer cannot use it until it is `Succeeded`).
                let failed = !named
                    && !user_made(&pip)
                    && super::provisioning_failed(pip.properties.provisioning_state.as_deref());
                if update(&mut pip, svc, cluster, &config_tags)? || failed {
                    Ok(Action::Put(pip))
                } else {
                    Ok(Action::Keep(pip))
                }
            },
        )
        .await?;
        out.ok_or_else(|| {
            ProviderError::other(format!("public IP {name} vanished while being set up"))
        })
    }

    /// `azure-additional-public-ips` (allowed by the config, special addresses refused by
    /// the annotation's parser): each address must be that of a public IP resource in the
    /// resource groups Services may name, not used by a network interface (a VM's address),
    /// not another Service's frontend, and not tagged for another Service or cluster.
    pub async fn check_additional(
        &self,
        cluster: &str,
        svc: &ServiceConfig,
    ) -> Result<(), ProviderError> {
        if svc.additional_public_ips.is_empty() {
            return Ok(());
        }
        let key = super::annotations::ADDITIONAL_PUBLIC_IPS;
        let refuse = |message: String| ProviderError::Invalid { what: key.into(), message };
        let pips: Vec<PublicIpAddress> = match self.config.service_resource_groups() {
            ServiceGroups::Any => {
                // Public IPs live in the network subscription
                // (`networkResourceSubscriptionID`, else `subscriptionId`).
                let all = format!(
                    "/subscriptions/{}/providers/{PIP_TYPE}",
                    self.client.network_subscription_id()
                );
                self.client.list("network.public_ip_addresses.list_all", &all, NETWORK, &[]).await?
            }
            ServiceGroups::Only(groups) => self.list_in(groups).await?,
        };
        for ip in &svc.additional_public_ips {
            let Some(pip) = pips.iter().find(|p| {
                p.properties.ip_address.as_deref().and_then(|a| a.parse::<IpAddr>().ok())
                    == Some(*ip)
            }) else {
                return Err(refuse(format!(
                    "{ip} is not the address of a public IP in the resource groups this cluster's Services may use"
                )));
            };
            if !user_made(pip) && !owned_by(pip, &svc.key, cluster) {
                return Err(refuse(format!(
                    "{ip} is public IP {} of another Service or cluster",
                    pip.name()
                )));
            }
            if let Some(user) = &pip.properties.ip_configuration {
                let lower = user.id.to_ascii_lowercase();
                let frontend = naming::last_segment(&user.id);
                let others_frontend = lower.contains("/frontendipconfigurations/")
                    && !naming::owns(svc, frontend)
                    && super::service_prefix(frontend).is_some();
                if lower.contains("/networkinterfaces/") || others_frontend {
                    return Err(refuse(format!(
                        "{ip} is public IP {} used by {}",
                        pip.name(),
                        if others_frontend { "another Service" } else { "a network interface" }
                    )));
                }
            }
        }
        Ok(())
    }

    async fn find_by_address(&self, rg: &str, ip: &IpAddr) -> Result<String, ProviderError> {
        let collection = self.client.collection_id(rg, PIP_TYPE)?;
        let all: Vec<PublicIpAddress> =
            self.client.list("network.public_ip_addresses.list", &collection, NETWORK, &[]).await?;
        all.into_iter()
            .find(|p| p.properties.ip_address.as_deref().and_then(|a| a.parse::<IpAddr>().ok()) == Some(*ip))
            .map(|p| p.name().to_string())
            .ok_or_else(|| {
                ProviderError::other(format!(
                    "no public IP with address {ip} in resource group {rg} (loadBalancerIP of a public Service must be an existing public IP)"
                ))
            })
    }

    /// Unbinds the Service from the public IPs it owns that are not in `keep` (IDs): a public
    /// IP left with no Service is deleted, otherwise its tag is updated.
    pub async fn release(
        &self,
        cluster: &str,
        service: &str,
        svc_rg: Option<&str>,
        keep: &[String],
    ) -> Result<(), ProviderError> {
        for pip in self.list(svc_rg).await? {
            if keep.iter().any(|k| k.eq_ignore_ascii_case(pip.id())) {
                continue;
            }
            if user_made(&pip) {
                continue;
            }
            if !owned_by(&pip, service, cluster) {
                continue;
            }
            let id = pip.id().to_string();
            let mut delete = false;
            rmw::<PublicIpProperties>(&self.client, PIP_OPS, &id, &mut |current| {
                let Some(mut pip) = current else {
                    return Ok(Action::Keep(PublicIpAddress::default()));
                };
                if !owned_by(&pip, service, cluster) {
                    return Ok(Action::Keep(pip));
                }
                let rest: Vec<String> = services_of(&pip)
                    .into_iter()
                    .filter(|s| !s.eq_ignore_ascii_case(service))
                    .collect();
                let tags = pip.tags.get_or_insert_with(BTreeMap::new);
                for k in [DNS_SERVICE_TAG, LEGACY_DNS_SERVICE_TAG] {
                    if tags.get(k).is_some_and(|v| v.eq_ignore_ascii_case(service)) {
                        tags.remove(k);
                    }
                }
                if rest.is_empty() {
                    delete = true;
                    return Ok(Action::Keep(pip));
                }
                tags.remove(LEGACY_SERVICE_TAG);
                tags.insert(SERVICE_TAG.into(), rest.join(","));
                Ok(Action::Put(pip))
            })
            .await?;
            if delete {
                match self.client.delete(PIP_OPS.delete, &id, NETWORK).await {
                    Ok(()) => info!(public_ip = %id, service, "deleted the Service's public IP"),
                    // Still referenced (ARM's 400): left as it is, as upstream does; the
                    // Service's removal is not held up by it.
                    Err(e) if e.code() == Some(CANNOT_BE_DELETED) => {
                        warn!(public_ip = %id, service, error = %e,
                            "public IP is still in use and cannot be deleted; left in place");
                    }
                    Err(e) => return Err(e.into()),
                }
            }
        }
        Ok(())
    }

    /// Reads a public IP by ID (`None` when gone).
    pub async fn get(&self, id: &str) -> Result<Option<PublicIpAddress>, ProviderError> {
        Ok(self.client.get_opt("network.public_ip_addresses.get", id, NETWORK, &[]).await?)
    }
}

/// Tags, DNS label: what the Service wants on a public IP. Returns whether it changed.
fn update(
    pip: &mut PublicIpAddress,
    svc: &ServiceConfig,
    cluster: &str,
    config_tags: &BTreeMap<String, String>,
) -> Result<bool, ProviderError> {
    let user = user_made(pip) && pip.id.is_some();
    let mut changed = false;
    if !user {
        let mut want = config_tags.clone();
        merge_tags(&mut want, &svc.pip_tags);
        let mut services = services_of(pip);
        if !services.iter().any(|s| s.eq_ignore_ascii_case(&svc.key)) {
            services.push(svc.key.clone());
        }
        want.insert(SERVICE_TAG.into(), services.join(","));
        if tag(pip, CLUSTER_TAG, LEGACY_CLUSTER_TAG).is_none() {
            want.insert(CLUSTER_TAG.into(), cluster.to_string());
        }
        let tags = pip.tags.get_or_insert_with(BTreeMap::new);
        changed |= merge_tags(tags, &want);
        if pip
            .sku
            .as_ref()
            .and_then(|s| s.name.as_deref())
            .is_none_or(|n| !n.eq_ignore_ascii_case("Standard"))
        {
            pip.sku = Some(Sku {
                name: Some("Standard".into()),
                tier: Some("Regional".into()),
                ..Default::default()
            });
            changed = true;
        }
    }
    if let Some(label) = &svc.dns_label {
        let holder = pip
            .tag(DNS_SERVICE_TAG)
            .or_else(|| pip.tag(LEGACY_DNS_SERVICE_TAG))
            .filter(|v| !v.is_empty())
            .map(str::to_string);
        if let Some(h) = &holder
            && !h.eq_ignore_ascii_case(&svc.key)
        {
            return Err(ProviderError::Invalid {
                what: super::annotations::DNS_LABEL_NAME.into(),
                message: format!(
                    "public IP {} already carries the DNS label of Service {h}",
                    pip.name()
                ),
            });
        }
        let have = pip.properties.dns_settings.as_ref().and_then(|d| d.domain_name_label.clone());
        if label.is_empty() {
            if pip.properties.dns_settings.is_some() {
                pip.properties.dns_settings = None;
                changed = true;
            }
        } else {
            if !have.as_deref().is_some_and(|h| h.eq_ignore_ascii_case(label)) {
                let d = pip.properties.dns_settings.get_or_insert_with(DnsSettings::default);
                d.domain_name_label = Some(label.clone());
                d.fqdn = None;
                changed = true;
            }
            if !user && holder.is_none() {
                pip.tags
                    .get_or_insert_with(BTreeMap::new)
                    .insert(DNS_SERVICE_TAG.into(), svc.key.clone());
                changed = true;
            }
        }
    }
    Ok(changed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pip(tags: &[(&str, &str)]) -> PublicIpAddress {
        PublicIpAddress {
            id: Some("/x".into()),
            tags: Some(tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
            ..Default::default()
        }
    }

    #[test]
    fn region_zones_from_the_compute_providers_zone_mappings() {
        let provider = json!({
            "namespace": "Microsoft.Compute",
            "resourceTypes": [
                {"resourceType": "availabilitySets", "zoneMappings": [{"location": "East US", "zones": ["9"]}]},
                {"resourceType": "virtualMachines", "zoneMappings": [
                    {"location": "East US", "zones": ["3", "1", "2"]},
                    {"location": "West Central US", "zones": []}
                ]}
            ]
        });
        let m = zone_mappings(&provider);
        assert_eq!(m["eastus"], vec!["1", "2", "3"]);
        assert!(m["westcentralus"].is_empty());
        assert_eq!(m.len(), 2);
        assert_eq!(normalize_location(" East US 2"), "eastus2");
    }

    #[test]
    fn ownership_from_tags() {
        assert!(user_made(&pip(&[("team", "a")])));
        let p = pip(&[(SERVICE_TAG, "default/web,other/x"), (CLUSTER_TAG, "k")]);
        assert!(owned_by(&p, "default/web", "k"));
        assert!(!owned_by(&p, "default/web", "other-cluster"));
        assert!(owned_by(&pip(&[(LEGACY_SERVICE_TAG, "default/web")]), "default/web", "k"));
    }

    #[test]
    fn refused_when_tagged_for_another_cluster_or_namespace() {
        assert_eq!(refusal(&pip(&[("team", "a")]), "b/x", "k"), None);
        let same = pip(&[(SERVICE_TAG, "b/web"), (CLUSTER_TAG, "K")]);
        assert_eq!(refusal(&same, "b/x", "k"), None);
        assert_eq!(refusal(&pip(&[(LEGACY_SERVICE_TAG, "b/web")]), "b/x", "k"), None);
        for p in [
            pip(&[(SERVICE_TAG, "b/web"), (CLUSTER_TAG, "other")]),
            pip(&[(CLUSTER_TAG, "other")]),
            pip(&[(SERVICE_TAG, "b/web,a/victim"), (CLUSTER_TAG, "k")]),
            pip(&[(LEGACY_SERVICE_TAG, "a/victim")]),
        ] {
            assert!(refusal(&p, "b/x", "k").is_some(), "{p:?}");
        }
    }

    #[test]
    fn config_tags_map_wins_case_insensitively() {
        let c = Config {
            tags: Some("Env=prod, team = a".into()),
            tags_map: Some(BTreeMap::from([("env".to_string(), "dev".to_string())])),
            ..Default::default()
        };
        let t = config_tags(&c).unwrap();
        assert_eq!(t, BTreeMap::from([("env".into(), "dev".into()), ("team".into(), "a".into())]));
    }

    #[test]
    fn merge_keeps_other_tags() {
        let mut t = BTreeMap::from([
            ("mine".to_string(), "1".to_string()),
            ("Env".to_string(), "x".to_string()),
        ]);
        assert!(merge_tags(&mut t, &BTreeMap::from([("env".to_string(), "y".to_string())])));
        assert_eq!(t.get("Env").map(String::as_str), Some("y"));
        assert_eq!(t.get("mine").map(String::as_str), Some("1"));
        assert!(!merge_tags(&mut t, &BTreeMap::from([("env".to_string(), "Y".to_string())])));
    }
}
