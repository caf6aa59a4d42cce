//! The internal passthrough load balancer (upstream's `gce_loadbalancer_internal.go`):
//! unmanaged instance groups `k8s-ig--<clusterID>` in each zone with nodes (shared by every
//! internal load balancer of the cluster), a health check (the shared `k8s-<clusterID>-node`
//! for Cluster policy, `<lb>` on the health check node port for Local), a regional backend
//! service (`<lb>`, or the shared `k8s-<clusterID>-internal-…` one), an `INTERNAL`
//! forwarding rule `<lb>` (ports, or all ports beyond 5; subnetwork; global access) whose IP
//! is held by an internal address `<lb>` while the rule is (re)created, and two firewalls
//! (`k8s-fw-<lb>` for the traffic, `k8s-<clusterID>-node-hc` / `<lb>-hc` for the probers).
//!
//! A rule that differs (upstream's `forwardingRulesEqual`) is deleted before the backend
//! service changes and re-created after. Node changes add and remove instance-group members
//! and fix the backend service's groups. A previous backend service or health check that a
//! change replaced is deleted (when no longer in use).
//!
//! **Changed**: upstream reserves and releases the address on every sync; here only when the
//! rule is (re)created. Instance groups hold instance names up to the node name's first `.`;
//! a node without zone label is placed by its providerID's zone.

use std::collections::{BTreeMap, BTreeSet};

use ccm_core::cloud::ProviderError;
use google_cloud_compute_v1::model::{
    Address, Backend, BackendService, ForwardingRule, HTTPHealthCheck, HealthCheck, InstanceGroup,
};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node};

use super::annotations::{Class, ServiceConfig, has_finalizer, keys};
use super::api::Api;
use super::external::{HC_HEALTHY, HC_INTERVAL, HC_TIMEOUT, HC_UNHEALTHY};
use super::firewall;
use super::hosts;
use super::{Ctx, GceLoadBalancer, LbError, annotations, naming, status};
use crate::client::{GceError, last_segment};

/// Upstream's `maxInstancesPerInstanceGroup`.
const MAX_GROUP_INSTANCES: usize = 1000;
/// Upstream's `maxL4ILBPorts`: more ports use `allPorts`.
const MAX_PORTS: usize = 5;
/// The node label naming the subnetwork of a node's pool (multi-subnet clusters).
pub const LABEL_NODE_POOL_SUBNET: &str = "cloud.google.com/gke-node-pool-subnet";

pub(crate) async fn ensure(
    lbs: &GceLoadBalancer,
    cx: &Ctx<'_>,
    conf: &ServiceConfig,
    existing: Option<ForwardingRule>,
    nodes: &[Node],
) -> Result<LoadBalancerStatus, LbError> {
    let svc = cx.service;
    if existing.is_none()
        && !has_finalizer(svc, keys::FINALIZER_ILB_V1)
        && annotations::class(svc) != Class::InternalLegacy
    {
        if lbs.alpha.ilb_subsets {
            tracing::info!(service = %conf.service, "GCE: ILBSubsets is on: a new internal load balancer is GKE's L4 controller's; implemented elsewhere");
            return Err(ProviderError::ImplementedElsewhere.into());
        }
        if has_finalizer(svc, keys::FINALIZER_ILB_V2) {
            tracing::info!(service = %conf.service, "GCE: internal load balancer of the newer controller: implemented elsewhere");
            return Err(ProviderError::ImplementedElsewhere.into());
        }
    }
    let api = &cx.api;
    let lb = cx.lb.as_str();
    let subnet_url = match &conf.subnet {
        Some(s) => api.subnetwork_link(s),
        None => lbs.default_subnetwork(api).await?,
    };
    // Before anything is created: an IP another load balancer answers on is refused.
    if !conf.requested_ip.is_empty() {
        super::refuse_ip_of_other_rules(&cx.api, &cx.lb, &conf.requested_ip).await?;
        if let Some(a) = cx.api.address_by_ip(&conf.requested_ip).await? {
            let kind = a.address_type.as_ref().and_then(|t| t.name()).unwrap_or("EXTERNAL");
            if kind != "INTERNAL" {
                return Err(ProviderError::Invalid {
                    what: "spec.loadBalancerIP".into(),
                    message: format!(
                        "requested IP {} is held by the {kind} address {}; an internal load balancer needs an INTERNAL address of its subnetwork",
                        conf.requested_ip,
                        a.name.as_deref().unwrap_or_default()
                    ),
                }
                .into());
            }
        }
    }
    let _guard = lbs.shared.lock().await;

    let bs_name = naming::backend_service(
        lb,
        &cx.cluster_id,
        conf.share_backend,
        &conf.protocol,
        &conf.k8s_affinity,
    );
    let groups = instance_groups(lbs, api, &naming::instance_group(&cx.cluster_id), nodes).await?;

    let existing_bs = match existing
        .as_ref()
        .and_then(|f| f.backend_service.as_deref())
        .filter(|b| !b.is_empty())
    {
        Some(link) => api.backend_service(last_segment(link)).await?,
        None => None,
    };

    let shared_hc = !conf.local;
    let hc_name = naming::internal_health_check(lb, &cx.cluster_id, shared_hc);
    let (path, port) = conf.health_check();
    let hc_link = ensure_health_check(api, &hc_name, &conf.service, shared_hc, path, port).await?;

    // The IP: the requested one, else the rule's while the subnetwork stays.
    let ip_to_use = if !conf.requested_ip.is_empty() {
        conf.requested_ip.clone()
    } else {
        match &existing {
            Some(fr) if fr.subnetwork.as_deref() == Some(subnet_url.as_str()) => {
                fr.ip_address.clone().unwrap_or_default()
            }
            _ => String::new(),
        }
    };
    let mut want = ForwardingRule::default();
    want.name = Some(lb.to_string());
    want.description = Some(naming::service_description(&conf.service));
    want.ip_address = Some(ip_to_use.clone());
    want.backend_service = Some(api.regional_link("backendServices", &bs_name));
    want.ip_protocol = Some(conf.protocol.as_str().into());
    want.load_balancing_scheme = Some("INTERNAL".into());
    want.subnetwork = Some(subnet_url.clone());
    want.network = Some(api.scope.network_url.clone());
    if conf.global_access {
        want.allow_global_access = Some(true);
    }
    if conf.ports.len() > MAX_PORTS {
        want.all_ports = Some(true);
    } else {
        want.ports = conf.port_strings();
    }
    let rule_unchanged = existing.as_ref().is_some_and(|e| rules_equal(e, &want));

    let mut hold = None;
    if !rule_unchanged {
        let mut h = AddressHold::new(lb, &conf.service, &subnet_url, &ip_to_use);
        let ip = h.hold(api).await?;
        tracing::info!(load_balancer = lb, ip = %ip, "GCE: holding the internal IP");
        want.ip_address = Some(ip);
        hold = Some(h);
    }
    let result = async {
        let mut deleted = false;
        if existing.is_some() && !rule_unchanged {
            tracing::info!(
                load_balancer = lb,
                "GCE: forwarding rule changed; deleting it to re-create it"
            );
            api.delete_forwarding_rule(lb).await?;
            deleted = true;
        }
        let description = if conf.share_backend {
            String::new()
        } else {
            naming::service_description(&conf.service)
        };
        ensure_backend_service(api, &bs_name, &description, conf, &groups, &hc_link).await?;
        if deleted || existing.is_none() {
            api.insert_forwarding_rule(&want).await?;
            tracing::info!(load_balancer = lb, "GCE: created the internal forwarding rule");
        }
        let ip = api.forwarding_rule(lb).await?.and_then(|f| f.ip_address).ok_or_else(|| {
            ProviderError::other(format!("forwarding rule {lb} vanished after its creation"))
        })?;
        let names = hosts::node_instance_names(nodes);
        let tags = lbs.node_tags(api, &names).await?;
        ensure_firewalls(api, cx, conf, &ip, &tags, shared_hc, port).await?;
        if let Some(old) = &existing_bs {
            clear_previous(api, old, &bs_name, &hc_link).await;
        }
        Ok::<_, LbError>(status(&ip))
    }
    .await;
    if let Some(h) = hold
        && let Err(e) = h.release(api).await
    {
        tracing::error!(load_balancer = lb, error = %e, "GCE: failed to release the address reservation; it may be orphaned");
    }
    result
}

/// The node-change path: instance-group members and the backend service's groups.
pub(crate) async fn update(
    lbs: &GceLoadBalancer,
    cx: &Ctx<'_>,
    conf: &ServiceConfig,
    nodes: &[Node],
) -> Result<(), LbError> {
    let api = &cx.api;
    let _guard = lbs.shared.lock().await;
    let groups = instance_groups(lbs, api, &naming::instance_group(&cx.cluster_id), nodes).await?;
    let bs_name = naming::backend_service(
        &cx.lb,
        &cx.cluster_id,
        conf.share_backend,
        &conf.protocol,
        &conf.k8s_affinity,
    );
    let Some(mut bs) = api.backend_service(&bs_name).await? else {
        return Err(ProviderError::other(format!("backend service {bs_name} not found")).into());
    };
    let want = backends(&groups);
    if same_groups(&bs.backends, &want) {
        return Ok(());
    }
    bs.backends = want;
    api.update_backend_service(&bs).await?;
    tracing::info!(backend_service = %bs_name, "GCE: updated the backend service's instance groups");
    Ok(())
}

/// The zone of a node: its zone label, else the beta label, else its providerID's zone.
fn node_zone(node: &Node) -> Option<String> {
    let labels = node.metadata.labels.as_ref();
    let label = |k: &str| labels.and_then(|l| l.get(k)).filter(|z| !z.is_empty()).cloned();
    label("topology.kubernetes.io/zone")
        .or_else(|| label("failure-domain.beta.kubernetes.io/zone"))
        .or_else(|| {
            let pid = node.spec.as_ref()?.provider_id.as_deref()?;
            let rest = pid.strip_prefix("gce://")?;
            let mut parts = rest.split('/');
            let (_project, zone) = (parts.next()?, parts.next()?);
            (!zone.is_empty()).then(|| zone.to_string())
        })
}

/// Upstream's `ensureInternalInstanceGroups`: nodes of other subnetworks' pools left out,
/// one group per zone with nodes, members made exactly the zone's nodes (a node without a
/// zone is never removed). Returns the groups' links, sorted by zone. With
/// `SkipIGsManagement` the groups are someone else's: the ones named `<name>*` in each zone
/// with nodes are used as they are, never created or changed.
async fn instance_groups(
    lbs: &GceLoadBalancer,
    api: &Api<'_>,
    name: &str,
    nodes: &[Node],
) -> Result<Vec<String>, LbError> {
    // The nodes of the default subnetwork's pools only (a failure to find the auto-mode
    // subnetwork leaves the pools unfiltered, as upstream without a subnetwork).
    let default_subnet = match &api.scope.subnetwork_url {
        Some(s) => Some(last_segment(s).to_string()),
        None => lbs
            .auto_subnet
            .lock()
            .ok()
            .and_then(|c| c.clone())
            .map(|s| last_segment(&s).to_string()),
    };
    let mut by_zone: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut zoneless = BTreeSet::new();
    for n in nodes {
        let Some(node_name) = n.metadata.name.as_deref() else { continue };
        if let Some(default) = &default_subnet {
            let label = n.metadata.labels.as_ref().and_then(|l| l.get(LABEL_NODE_POOL_SUBNET));
            if label.is_some_and(|l| !l.is_empty() && l != default) {
                continue;
            }
        }
        let instance = hosts::instance_name(node_name).to_string();
        match node_zone(n) {
            Some(z) => {
                by_zone.entry(z).or_default().insert(instance);
            }
            None => {
                zoneless.insert(instance);
            }
        }
    }
    let mut links = Vec::new();
    for (zone, members) in &by_zone {
        if lbs.alpha.skip_igs_management {
            for g in api.instance_groups_with_prefix(zone, name).await? {
                match g.self_link {
                    Some(l) => links.push(l),
                    None => {
                        tracing::warn!(instance_group = ?g.name, zone, "GCE: instance group without selfLink; skipped")
                    }
                }
            }
            continue;
        }
        links.push(ensure_instance_group(api, name, zone, members, &zoneless).await?);
    }
    Ok(links)
}

async fn ensure_instance_group(
    api: &Api<'_>,
    name: &str,
    zone: &str,
    members: &BTreeSet<String>,
    zoneless: &BTreeSet<String>,
) -> Result<String, LbError> {
    let members: BTreeSet<&String> = members.iter().take(MAX_GROUP_INSTANCES).collect();
    if members.len() == MAX_GROUP_INSTANCES {
        tracing::warn!(
            instance_group = name,
            zone,
            "GCE: instance group limited to {MAX_GROUP_INSTANCES} instances"
        );
    }
    let (group, have) = match api.instance_group(zone, name).await? {
        Some(g) => {
            let have: BTreeSet<String> =
                api.instance_group_members(zone, name).await?.into_iter().collect();
            (g, have)
        }
        None => {
            let mut g = InstanceGroup::default();
            g.name = Some(name.to_string());
            match api.insert_instance_group(zone, &g).await {
                Ok(()) => {
                    tracing::info!(instance_group = name, zone, "GCE: created the instance group")
                }
                Err(e) if e.is_already_exists() => {}
                Err(e) => return Err(e.into()),
            }
            let g = api.instance_group(zone, name).await?.ok_or_else(|| {
                ProviderError::other(format!(
                    "instance group {name} in {zone} vanished after its creation"
                ))
            })?;
            (g, BTreeSet::new())
        }
    };
    let remove: Vec<String> = have
        .iter()
        .filter(|i| !members.contains(i) && !zoneless.contains(*i))
        .map(|i| api.instance_link(zone, i))
        .collect();
    let add: Vec<String> = members
        .iter()
        .filter(|i| !have.contains(**i))
        .map(|i| api.instance_link(zone, i))
        .collect();
    if !remove.is_empty() {
        match api.remove_from_instance_group(zone, name, &remove).await {
            Ok(()) | Err(GceError::Api { status: 404, .. }) => {}
            Err(e) => return Err(e.into()),
        }
        tracing::info!(
            instance_group = name,
            zone,
            removed = remove.len(),
            "GCE: removed instances from the group"
        );
    }
    if !add.is_empty() {
        api.add_to_instance_group(zone, name, &add).await?;
        tracing::info!(
            instance_group = name,
            zone,
            added = add.len(),
            "GCE: added instances to the group"
        );
    }
    group.self_link.ok_or_else(|| {
        ProviderError::other(format!("instance group {name} has no selfLink")).into()
    })
}

fn health_check(name: &str, service: &str, shared: bool, path: &str, port: i32) -> HealthCheck {
    let mut http = HTTPHealthCheck::default();
    http.port = Some(port);
    http.request_path = Some(path.to_string());
    let mut hc = HealthCheck::default();
    hc.name = Some(name.to_string());
    hc.check_interval_sec = Some(HC_INTERVAL);
    hc.timeout_sec = Some(HC_TIMEOUT);
    hc.healthy_threshold = Some(HC_HEALTHY);
    hc.unhealthy_threshold = Some(HC_UNHEALTHY);
    hc.http_health_check = Some(http);
    hc.r#type = Some("HTTP".into());
    hc.description =
        Some(if shared { String::new() } else { naming::service_description(service) });
    hc
}

/// Upstream's `needToUpdateHealthChecks`.
fn hc_needs_update(have: &HealthCheck, want: &HealthCheck) -> bool {
    let lt = |a: Option<i32>, b: Option<i32>| a.unwrap_or(0) < b.unwrap_or(0);
    let (Some(h), Some(w)) = (&have.http_health_check, &want.http_health_check) else {
        return true;
    };
    h.port != w.port
        || h.request_path != w.request_path
        || have.description.as_deref().unwrap_or_default()
            != want.description.as_deref().unwrap_or_default()
        || lt(have.check_interval_sec, want.check_interval_sec)
        || lt(have.timeout_sec, want.timeout_sec)
        || lt(have.unhealthy_threshold, want.unhealthy_threshold)
        || lt(have.healthy_threshold, want.healthy_threshold)
}

/// Upstream's `ensureInternalHealthCheck`; returns the check's link.
async fn ensure_health_check(
    api: &Api<'_>,
    name: &str,
    service: &str,
    shared: bool,
    path: &str,
    port: i32,
) -> Result<String, LbError> {
    let mut want = health_check(name, service, shared, path, port);
    let got = match api.health_check(name).await? {
        None => {
            api.insert_health_check(&want).await?;
            tracing::info!(health_check = name, port, "GCE: created health check");
            api.health_check(name).await?
        }
        Some(have) if hc_needs_update(&have, &want) => {
            tracing::warn!(health_check = name, "GCE: health check parameters drifted; updating");
            let max = |a: Option<i32>, b: Option<i32>| Some(a.unwrap_or(0).max(b.unwrap_or(0)));
            want.check_interval_sec = max(have.check_interval_sec, want.check_interval_sec);
            want.timeout_sec = max(have.timeout_sec, want.timeout_sec);
            want.unhealthy_threshold = max(have.unhealthy_threshold, want.unhealthy_threshold);
            want.healthy_threshold = max(have.healthy_threshold, want.healthy_threshold);
            api.update_health_check(&want).await?;
            api.health_check(name).await?
        }
        Some(have) => Some(have),
    };
    got.and_then(|h| h.self_link)
        .ok_or_else(|| ProviderError::other(format!("health check {name} vanished")).into())
}

fn backends(groups: &[String]) -> Vec<Backend> {
    groups
        .iter()
        .map(|g| {
            let mut b = Backend::default();
            b.group = Some(g.clone());
            b
        })
        .collect()
}

/// The groups of two backend lists are the same set (upstream's `backendsListEqual`).
fn same_groups(a: &[Backend], b: &[Backend]) -> bool {
    let set = |v: &[Backend]| {
        v.iter().map(|x| x.group.clone().unwrap_or_default()).collect::<BTreeSet<_>>()
    };
    a.len() == b.len() && set(a) == set(b)
}

/// Upstream's `ensureInternalBackendService` (equality: protocol, description, affinity,
/// scheme, health checks, groups; an update carries the fingerprint read).
async fn ensure_backend_service(
    api: &Api<'_>,
    name: &str,
    description: &str,
    conf: &ServiceConfig,
    groups: &[String],
    hc_link: &str,
) -> Result<(), LbError> {
    let mut want = BackendService::default();
    want.name = Some(name.to_string());
    want.protocol = Some(conf.protocol.as_str().into());
    want.description = Some(description.to_string());
    want.health_checks = vec![hc_link.to_string()];
    want.backends = backends(groups);
    want.session_affinity = Some(conf.affinity.into());
    want.load_balancing_scheme = Some("INTERNAL".into());
    let Some(have) = api.backend_service(name).await? else {
        api.insert_backend_service(&want).await?;
        tracing::info!(backend_service = name, "GCE: created the backend service");
        return Ok(());
    };
    let hcs = |v: &[String]| v.iter().cloned().collect::<BTreeSet<_>>();
    let equal = have.protocol.as_ref().and_then(|p| p.name()) == Some(conf.protocol.as_str())
        && have.description.as_deref().unwrap_or_default() == description
        && have.session_affinity.as_ref().and_then(|a| a.name()) == Some(conf.affinity)
        && have.load_balancing_scheme.as_ref().and_then(|s| s.name()) == Some("INTERNAL")
        && hcs(&have.health_checks) == hcs(&want.health_checks)
        && same_groups(&have.backends, &want.backends);
    if equal {
        return Ok(());
    }
    want.fingerprint = have.fingerprint.clone();
    api.update_backend_service(&want).await?;
    tracing::info!(backend_service = name, "GCE: updated the backend service");
    Ok(())
}

/// `projects/…` of a link (links from different endpoints compare equal).
fn resource_path(link: &str) -> &str {
    link.find("projects/").map(|i| &link[i..]).unwrap_or(link)
}

/// Upstream's `forwardingRulesEqual` (an empty IP on either side matches).
fn rules_equal(old: &ForwardingRule, new: &ForwardingRule) -> bool {
    let ip = |f: &ForwardingRule| f.ip_address.clone().unwrap_or_default();
    let ports = |f: &ForwardingRule| f.ports.iter().cloned().collect::<BTreeSet<_>>();
    (ip(old).is_empty() || ip(new).is_empty() || ip(old) == ip(new))
        && old.ip_protocol.as_ref().and_then(|p| p.name())
            == new.ip_protocol.as_ref().and_then(|p| p.name())
        && old.load_balancing_scheme.as_ref().and_then(|s| s.name())
            == new.load_balancing_scheme.as_ref().and_then(|s| s.name())
        && ports(old) == ports(new)
        && old.all_ports.unwrap_or(false) == new.all_ports.unwrap_or(false)
        && resource_path(old.backend_service.as_deref().unwrap_or_default())
            == resource_path(new.backend_service.as_deref().unwrap_or_default())
        && old.allow_global_access.unwrap_or(false) == new.allow_global_access.unwrap_or(false)
        && old.subnetwork == new.subnetwork
}

/// Upstream's `ensureInternalFirewalls`: traffic (`k8s-fw-<lb>`, deleting the legacy `<lb>`
/// once the new one exists) and health checks.
async fn ensure_firewalls(
    api: &Api<'_>,
    cx: &Ctx<'_>,
    conf: &ServiceConfig,
    ip: &str,
    tags: &[String],
    shared_hc: bool,
    hc_port: i32,
) -> Result<(), LbError> {
    let lb = cx.lb.as_str();
    let fw_name = naming::firewall(lb);
    let existed = api.firewall(&fw_name).await?.is_some();
    let legacy = api.firewall(lb).await?.is_some();
    let want = firewall::object(
        api,
        &fw_name,
        &naming::firewall_description(&conf.service, ip),
        ip,
        &conf.source_ranges,
        &conf.protocol,
        &conf.firewall_ports(),
        tags,
        None,
    );
    firewall::ensure(api, &want, firewall::internal_equal).await?;
    if legacy
        && existed
        && let Err(e) = firewall::delete(api, lb).await
    {
        tracing::error!(firewall = lb, error = %e, "GCE: failed to delete the legacy firewall");
    }
    let hc_fw = naming::internal_health_check_firewall(&naming::internal_health_check(
        lb,
        &cx.cluster_id,
        shared_hc,
    ));
    let sources = cx.hc_sources;
    let want =
        firewall::object(api, &hc_fw, "", "", sources, "tcp", &[hc_port.to_string()], tags, None);
    firewall::ensure(api, &want, firewall::internal_equal).await
}

/// Upstream's `clearPreviousInternalResources`: the backend service and health check a change
/// replaced are deleted (kept while in use; failures logged only). A regional health check of
/// the same name (this provider's earlier internal load balancers made regional ones) is
/// replaced by the global one `hc_link` and deleted, its firewall kept: the global check
/// uses the same firewall.
async fn clear_previous(api: &Api<'_>, old: &BackendService, bs_name: &str, hc_link: &str) {
    let old_name = old.name.clone().unwrap_or_default();
    if old_name != bs_name {
        tracing::info!(old = %old_name, new = bs_name, "GCE: backend service replaced; deleting the old one");
        if let Err(e) = teardown_backend_service(api, &old_name).await {
            tracing::warn!(backend_service = %old_name, error = %e, "GCE: could not delete the old backend service");
        }
    }
    match old.health_checks.as_slice() {
        [one] => {
            if resource_path(one) != resource_path(hc_link) {
                let same_name = last_segment(one) == last_segment(hc_link);
                tracing::info!(old = %one, new = hc_link, "GCE: health check replaced; deleting the old one");
                if let Err(e) = teardown_health_check(api, one, !same_name).await {
                    tracing::warn!(health_check = %one, error = %e, "GCE: could not delete the old health check");
                }
            }
        }
        [] => {}
        many => {
            tracing::warn!(backend_service = %old_name, health_checks = ?many, "GCE: more than one health check on the backend service")
        }
    }
}

async fn teardown_backend_service(api: &Api<'_>, name: &str) -> Result<(), LbError> {
    match api.delete_backend_service(name).await {
        Ok(_) => Ok(()),
        Err(e) if e.is_in_use() => {
            tracing::debug!(backend_service = name, "GCE: backend service in use; kept");
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// Upstream's `teardownInternalHealthCheckAndFirewall`: a check in use stays with its
/// firewall. `check` is a name (a global check) or a backend service's link to one (global
/// or regional); `with_firewall` deletes its firewall too.
async fn teardown_health_check(
    api: &Api<'_>,
    check: &str,
    with_firewall: bool,
) -> Result<(), LbError> {
    let name = last_segment(check);
    let deleted = if check.contains('/') {
        api.delete_health_check_link(check).await
    } else {
        api.delete_health_check(name).await
    };
    match deleted {
        Ok(_) => {}
        Err(e) if e.is_in_use() => {
            tracing::debug!(health_check = name, "GCE: health check in use; kept");
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    }
    if !with_firewall {
        return Ok(());
    }
    firewall::delete(api, &naming::internal_health_check_firewall(name)).await
}

/// Everything of an internal load balancer, in upstream's order: address, forwarding rule,
/// backend service `bs`, the traffic firewalls (new and legacy names), the health check `hc`
/// with its firewall (both stay while another load balancer uses the check; `hc` a name or
/// a backend service's link), and the cluster's instance groups in every zone of the region
/// (they stay while in use; never touched when `skip_igs`, `SkipIGsManagement`).
pub(crate) async fn delete(
    api: &Api<'_>,
    lb: &str,
    cluster_id: &str,
    bs: &str,
    hc: Option<&str>,
    skip_igs: bool,
) -> Result<(), LbError> {
    if let Err(e) = api.delete_address(lb).await {
        tracing::warn!(load_balancer = lb, error = %e, "GCE: could not delete the internal address");
    }
    api.delete_forwarding_rule(lb).await?;
    teardown_backend_service(api, bs).await?;
    firewall::delete(api, &naming::firewall(lb)).await?;
    firewall::delete(api, lb).await?;
    if let Some(hc) = hc {
        teardown_health_check(api, hc, true).await?;
    }
    if skip_igs {
        return Ok(());
    }
    let ig = naming::instance_group(cluster_id);
    for zone in api.region_zones().await? {
        match api.delete_instance_group(&zone, &ig).await {
            Ok(_) => {}
            Err(e) if e.is_in_use() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Deletes the Service's internal load balancer: backend service and health check named by
/// the forwarding rule and backend service when they still exist, else as the Service asks.
pub(crate) async fn delete_for_service(
    lbs: &GceLoadBalancer,
    cx: &Ctx<'_>,
    existing: Option<&ForwardingRule>,
) -> Result<(), LbError> {
    let api = &cx.api;
    let spec = cx.service.spec.clone().unwrap_or_default();
    let local = spec.external_traffic_policy.as_deref() == Some("Local");
    let bs_name =
        match existing.and_then(|f| f.backend_service.as_deref()).filter(|b| !b.is_empty()) {
            Some(link) => last_segment(link).to_string(),
            None => {
                let share = ServiceConfig::parse_allowing_mixed_protocols(cx.service)
                    .map(|c| c.share_backend)
                    .unwrap_or(false);
                let protocol = spec
                    .ports
                    .as_ref()
                    .and_then(|p| p.first())
                    .and_then(|p| p.protocol.clone())
                    .unwrap_or_else(|| "TCP".into());
                let affinity = spec.session_affinity.clone().unwrap_or_else(|| "None".into());
                naming::backend_service(&cx.lb, &cx.cluster_id, share, &protocol, &affinity)
            }
        };
    let hc = match api.backend_service(&bs_name).await? {
        Some(bs) if bs.health_checks.len() == 1 => bs.health_checks[0].clone(),
        _ => naming::internal_health_check(&cx.lb, &cx.cluster_id, !local),
    };
    let _guard = lbs.shared.lock().await;
    let skip_igs = lbs.alpha.skip_igs_management;
    delete(api, &cx.lb, &cx.cluster_id, &bs_name, Some(&hc), skip_igs).await?;
    tracing::info!(load_balancer = %cx.lb, service = %annotations::service_key(cx.service), "GCE: deleted the internal load balancer");
    Ok(())
}

/// Upstream's `addressManager`: holds the internal IP with an address `<lb>` while the rule
/// is (re)created; a user's reserved address (another name) is used and never released.
struct AddressHold {
    name: String,
    service: String,
    subnet: String,
    target: String,
    release: bool,
}

impl AddressHold {
    fn new(name: &str, service: &str, subnet: &str, target: &str) -> Self {
        AddressHold {
            name: name.into(),
            service: service.into(),
            subnet: subnet.into(),
            target: target.into(),
            release: true,
        }
    }

    fn validate(&self, a: &Address) -> Result<(), String> {
        let ip = a.address.clone().unwrap_or_default();
        if !self.target.is_empty() && self.target != ip {
            return Err(format!(
                "address {} does not have the expected IP {}, actual: {ip}",
                self.name, self.target
            ));
        }
        let kind = a.address_type.as_ref().and_then(|t| t.name()).unwrap_or("EXTERNAL");
        if kind != "INTERNAL" {
            return Err(format!(
                "address {} does not have the expected address type INTERNAL, actual: {kind}",
                self.name
            ));
        }
        Ok(())
    }

    async fn hold(&mut self, api: &Api<'_>) -> Result<String, LbError> {
        if let Some(a) = api.address(&self.name).await? {
            match self.validate(&a) {
                Ok(()) => return Ok(a.address.unwrap_or_default()),
                Err(why) => {
                    tracing::info!(address = %self.name, %why, "GCE: deleting the existing address");
                    api.delete_address(&self.name).await?;
                }
            }
        }
        let mut a = Address::default();
        a.name = Some(self.name.clone());
        a.description = Some(naming::service_description(&self.service));
        if !self.target.is_empty() {
            a.address = Some(self.target.clone());
        }
        a.address_type = Some("INTERNAL".into());
        a.subnetwork = Some(self.subnet.clone());
        let err = match api.insert_address(&a).await {
            Ok(()) => {
                if !self.target.is_empty() {
                    return Ok(self.target.clone());
                }
                return api.address(&self.name).await?.and_then(|a| a.address).ok_or_else(|| {
                    ProviderError::other(format!(
                        "address {} vanished after its reservation",
                        self.name
                    ))
                    .into()
                });
            }
            Err(e @ GceError::Api { status: 409 | 400, .. }) => e,
            Err(e) => return Err(e.into()),
        };
        if self.target.is_empty() {
            return Err(ProviderError::other(format!(
                "failed to reserve address {} with no specific IP: {err}",
                self.name
            ))
            .into());
        }
        // The IP is reserved already: the user's address (used, never released) or ours.
        // Compute refused the IP (outside the subnetwork's range, held by another resource)
        // and no address holds it: the request is at fault.
        let Some(found) = api.address_by_ip(&self.target).await? else {
            return Err(ProviderError::Invalid {
                what: "spec.loadBalancerIP".into(),
                message: format!(
                    "Compute refused to reserve the internal IP {} in subnetwork {}: {err}",
                    self.target,
                    last_segment(&self.subnet)
                ),
            }
            .into());
        };
        self.validate(&found).map_err(|m| ProviderError::Invalid {
            what: "spec.loadBalancerIP".into(),
            message: m,
        })?;
        if found.name.as_deref() != Some(self.name.as_str()) {
            tracing::info!(address = ?found.name, ip = %self.target, "GCE: the IP is reserved by the user's address; using it");
            self.release = false;
        }
        Ok(found.address.unwrap_or_default())
    }

    async fn release(&self, api: &Api<'_>) -> Result<(), GceError> {
        if self.release {
            api.delete_address(&self.name).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::NodeSpec;
    use kube::api::ObjectMeta;

    fn rule(ip: &str, ports: &[&str], subnet: &str) -> ForwardingRule {
        let mut f = ForwardingRule::default();
        f.ip_address = Some(ip.into());
        f.ports = ports.iter().map(|p| p.to_string()).collect();
        f.ip_protocol = Some("TCP".into());
        f.load_balancing_scheme = Some("INTERNAL".into());
        f.backend_service = Some(
            "https://www.googleapis.com/compute/v1/projects/p/regions/r/backendServices/a1".into(),
        );
        f.subnetwork = Some(subnet.into());
        f
    }

    #[test]
    fn rule_equality_is_upstream_s() {
        let a = rule("10.0.0.5", &["80", "443"], "s1");
        assert!(
            rules_equal(&a, &rule("", &["443", "80"], "s1")),
            "an empty IP matches, ports are a set"
        );
        let mut other_endpoint = a.clone();
        other_endpoint.backend_service = Some(
            "https://compute.googleapis.com/compute/v1/projects/p/regions/r/backendServices/a1"
                .into(),
        );
        assert!(rules_equal(&a, &other_endpoint));
        assert!(!rules_equal(&a, &rule("10.0.0.6", &["80", "443"], "s1")));
        assert!(!rules_equal(&a, &rule("10.0.0.5", &["80"], "s1")));
        assert!(!rules_equal(&a, &rule("10.0.0.5", &["80", "443"], "s2")));
        let mut global = a.clone();
        global.allow_global_access = Some(true);
        assert!(!rules_equal(&a, &global));
        let mut explicit_false = a.clone();
        explicit_false.allow_global_access = Some(false);
        assert!(rules_equal(&a, &explicit_false));
    }

    #[test]
    fn node_zones_come_from_labels_then_the_provider_id() {
        let node = |labels: &[(&str, &str)], pid: Option<&str>| Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            spec: Some(NodeSpec { provider_id: pid.map(Into::into), ..Default::default() }),
            status: None,
        };
        assert_eq!(
            node_zone(&node(&[("topology.kubernetes.io/zone", "z1")], Some("gce://p/z2/n"))),
            Some("z1".into())
        );
        assert_eq!(
            node_zone(&node(&[("failure-domain.beta.kubernetes.io/zone", "z3")], None)),
            Some("z3".into())
        );
        assert_eq!(node_zone(&node(&[], Some("gce://p/z2/n"))), Some("z2".into()));
        assert_eq!(node_zone(&node(&[], None)), None);
    }

    #[test]
    fn health_check_drift() {
        let want = health_check("a1", "default/web", false, "/healthz", 31000);
        assert!(!hc_needs_update(&want, &want));
        let shared = health_check("k8s-c-node", "default/web", true, "/healthz", 10256);
        assert_eq!(shared.description.as_deref(), Some(""));
        let mut moved = want.clone();
        moved.http_health_check.as_mut().unwrap().port = Some(31001);
        assert!(hc_needs_update(&moved, &want));
        let mut no_http = want.clone();
        no_http.http_health_check = None;
        assert!(hc_needs_update(&no_http, &want));
    }
}
