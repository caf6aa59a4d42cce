//! The external target-pool network load balancer (upstream's
//! `gce_loadbalancer_external.go`): a regional address reserved while the forwarding rule is
//! (re)created, the `k8s-fw-<lb>` firewall, the target pool `<lb>` with the nodes' instances,
//! a legacy HTTP health check (the shared `k8s-<clusterID>-node` on kube-proxy's 10256
//! `/healthz`, or `<lb>` on the Service's health check node port for `Local`) with its
//! firewall from Google's probers, and the forwarding rule `<lb>` (port range, protocol,
//! network tier).
//!
//! Order and rules as upstream: a forwarding rule or target pool cannot be changed in place,
//! so a port range, protocol or requested-IP change deletes and re-creates the forwarding
//! rule, and a session-affinity or Cluster⇄Local change re-creates the target pool (and the
//! rule on it); the IP is held by a static address `<lb>` across the re-creation and released
//! (demoted to the rule's ephemeral IP) once the rule exists, unless the user reserved it.
//! Node changes only add and remove target-pool members. **Changed**: upstream reserves and
//! releases the address on every sync; here only when the forwarding rule is (re)created, so
//! a sync that changes nothing makes no Compute mutation.

use std::collections::BTreeMap;

use ccm_core::cloud::ProviderError;
use google_cloud_compute_v1::model::{Address, ForwardingRule, HttpHealthCheck, TargetPool};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

use super::annotations::{self, Class, NetworkTier, ServiceConfig, has_finalizer, keys};
use super::api::Api;
use super::firewall::{self, PRIORITY};
use super::hosts::{self, Host, comparable_path};
use super::{Ctx, GceLoadBalancer, LbError, naming, status};
use crate::client::GceError;

/// Upstream's `maxTargetPoolCreateInstances`.
const CREATE_INSTANCES: usize = 200;
/// Upstream's `maxInstancesPerTargetPoolUpdate`.
const UPDATE_INSTANCES: usize = 1000;

/// Upstream's health check timings (`gceHc*`).
pub(crate) const HC_INTERVAL: i32 = 8;
pub(crate) const HC_TIMEOUT: i32 = 1;
pub(crate) const HC_HEALTHY: i32 = 1;
pub(crate) const HC_UNHEALTHY: i32 = 3;

/// Whether this provider handles the Service's external load balancer (upstream's
/// `shouldProcessNetLB`, with this provider's own target-pool forwarding rule standing in for
/// upstream's `gke.networking.io/l4-netlb-v1` finalizer).
pub(crate) fn ours(service: &Service, rule: Option<&ForwardingRule>) -> bool {
    match annotations::class(service) {
        Class::ExternalLegacy => return true,
        Class::Other(_) => return false,
        _ => {}
    }
    if has_finalizer(service, keys::FINALIZER_NETLB_V1) {
        return true;
    }
    if rule.and_then(|r| r.target.as_deref()).is_some_and(|t| !t.is_empty()) {
        return true;
    }
    let rbs_rule = rule.and_then(|r| r.backend_service.as_deref()).is_some_and(|b| !b.is_empty());
    !(annotations::uses_rbs(service) || rbs_rule)
}

fn tier_of(v: Option<&str>) -> NetworkTier {
    match v {
        Some("STANDARD") => NetworkTier::Standard,
        _ => NetworkTier::Premium,
    }
}

/// The address upstream holds for the load balancer, and whether it may be released.
#[derive(Debug, Default)]
struct Hold {
    /// The user reserved the IP: never released.
    user_owned: bool,
    /// Release `<lb>` at the end (upstream's `isSafeToReleaseIP`).
    release: bool,
    /// This sync, or an earlier one of the same chain whose operations were parked, reserved
    /// `<lb>` (upstream's "did not exist before": the later syncs find it existing).
    ours: bool,
}

pub(crate) async fn ensure(
    lbs: &GceLoadBalancer,
    cx: &Ctx<'_>,
    conf: &ServiceConfig,
    existing: Option<ForwardingRule>,
    nodes: &[Node],
) -> Result<LoadBalancerStatus, LbError> {
    if !ours(cx.service, existing.as_ref()) {
        tracing::info!(service = %conf.service, "GCE: backend-service network load balancer: implemented elsewhere");
        return Err(ProviderError::ImplementedElsewhere.into());
    }
    if nodes.is_empty() {
        return Err(ProviderError::other("cannot EnsureLoadBalancer() with no hosts").into());
    }
    let hosts = lbs.hosts(&cx.api, &hosts::node_instance_names(nodes)).await?;
    let tags = hosts::target_tags(&cx.api.scope.node_tags, &hosts).map_err(ProviderError::other)?;
    let _parking = cx.api.parking();
    let mut hold = Hold { ours: lbs.parked.reserved_address(&cx.lb), ..Hold::default() };
    let result = ensure_inner(lbs, cx, conf, existing, &hosts, &tags, &mut hold).await;
    if matches!(result, Err(LbError::Gce(GceError::Running { .. }))) {
        // An operation was parked: the sync resumes later, the address stays until then.
        lbs.parked.set_reserved_address(&cx.lb, hold.ours && !hold.user_owned);
        return result;
    }
    // Upstream releases an address this sync reserved; a chain of syncs releases it once
    // the forwarding rule exists (the one that succeeds).
    let release = hold.release || (result.is_ok() && hold.ours);
    // Whether the chain still holds `<lb>` after this sync.
    let still_reserved = if release && !hold.user_owned {
        match cx.api.delete_address(&cx.lb).await {
            Ok(true) => {
                tracing::info!(load_balancer = %cx.lb, "GCE: released the static IP (the forwarding rule keeps it)");
                false
            }
            Ok(false) => false,
            Err(GceError::Running { .. }) => {
                tracing::info!(load_balancer = %cx.lb, "GCE: releasing the static IP (the forwarding rule keeps it); its operation is read at the next sync");
                false
            }
            Err(e) => {
                tracing::error!(load_balancer = %cx.lb, error = %e, "GCE: failed to release the static IP");
                hold.ours
            }
        }
    } else {
        if release {
            tracing::debug!(load_balancer = %cx.lb, "GCE: the IP is the user's; kept");
        }
        hold.ours && !hold.user_owned
    };
    lbs.parked.set_reserved_address(&cx.lb, still_reserved);
    result
}

#[allow(clippy::too_many_arguments)]
async fn ensure_inner(
    lbs: &GceLoadBalancer,
    cx: &Ctx<'_>,
    conf: &ServiceConfig,
    mut existing: Option<ForwardingRule>,
    hosts: &[Host],
    tags: &[String],
    hold: &mut Hold,
) -> Result<LoadBalancerStatus, LbError> {
    let api = &cx.api;
    let lb = cx.lb.as_str();
    // Resources of the other network tier go (only when the tier is asked for explicitly).
    if conf.tier_annotated {
        if let Some(fr) = &existing
            && tier_of(fr.network_tier.as_ref().and_then(|t| t.name())) != conf.tier
        {
            tracing::info!(
                load_balancer = lb,
                tier = conf.tier.compute(),
                "GCE: network tier changed; deleting the forwarding rule"
            );
            api.delete_forwarding_rule(lb).await?;
            existing = None;
        }
        if let Some(a) = api.address(lb).await?
            && tier_of(a.network_tier.as_ref().and_then(|t| t.name())) != conf.tier
        {
            tracing::info!(
                load_balancer = lb,
                tier = conf.tier.compute(),
                "GCE: network tier changed; deleting the address"
            );
            api.delete_address(lb).await?;
        }
    }

    // What the forwarding rule needs (upstream's `forwardingRuleNeedsUpdate`).
    let rule_ip = existing.as_ref().and_then(|f| f.ip_address.clone()).unwrap_or_default();
    let rule_needs_update = match &existing {
        None => true,
        Some(fr) => {
            (!conf.requested_ip.is_empty() && conf.requested_ip != rule_ip)
                || fr.port_range.as_deref() != Some(conf.port_range().as_str())
                || fr.ip_protocol.as_ref().and_then(|p| p.name()) != Some(conf.protocol.as_str())
        }
    };

    // The target pool: re-created when the session affinity changed (upstream ignores an
    // empty affinity on the pool).
    let pool = api.target_pool(lb).await?;
    let mut pool_recreate = match &pool {
        None => true,
        Some(tp) => tp
            .session_affinity
            .as_ref()
            .and_then(|a| a.name())
            .is_some_and(|a| !a.is_empty() && a != conf.affinity),
    };

    // Health checks: Cluster uses the shared nodes check, Local its own; a switch re-creates
    // the pool with the other check and deletes the old one.
    let local_hc = api.http_health_check(lb).await?;
    let nodes_hc = naming::nodes_health_check(&cx.cluster_id);
    let (path, port) = conf.health_check();
    let (hc_name, hc_delete) = if conf.health_check_node_port.is_some() {
        let del = if local_hc.is_none() {
            pool_recreate = true;
            Some(nodes_hc.clone())
        } else {
            None
        };
        (lb.to_string(), del)
    } else {
        let del = if local_hc.is_some() {
            pool_recreate = true;
            Some(lb.to_string())
        } else {
            None
        };
        (nodes_hc.clone(), del)
    };
    let rule_recreate = rule_needs_update || pool_recreate;

    // The IP: the user's reserved address, else held by a static address `<lb>` while the rule
    // is (re)created, else the rule's.
    let mut ip = String::new();
    if !conf.requested_ip.is_empty() {
        hold.user_owned = verify_requested_ip(api, lb, conf, &rule_ip).await?;
        ip = conf.requested_ip.clone();
    }
    if !hold.user_owned {
        if rule_recreate {
            // An earlier sync of this chain reserved `<lb>`: read it (upstream's insert would
            // only be refused with 409, a write of the slow kind, on every resumed sync).
            let reserved = if hold.ours && rule_ip.is_empty() {
                api.address(lb).await?.and_then(|a| a.address).filter(|a| !a.is_empty())
            } else {
                None
            };
            let reserving = match reserved {
                Some(ip) => Ok((ip, true)),
                None => ensure_static_ip(api, lb, conf, &rule_ip).await,
            };
            if matches!(reserving, Err(LbError::Gce(GceError::Running { .. }))) {
                // The insert was accepted and runs: the address is this chain's.
                hold.ours = true;
            }
            let (reserved, existed) = reserving?;
            tracing::info!(load_balancer = lb, ip = %reserved, tier = conf.tier.compute(), "GCE: ensured the static IP");
            hold.ours |= !existed;
            hold.release = hold.ours;
            ip = reserved;
        } else {
            ip = rule_ip.clone();
        }
    }

    // The traffic firewall (before the rule: the rule's existence means "fully created").
    let want = firewall::object(
        api,
        &naming::firewall(lb),
        &naming::firewall_description(&conf.service, &ip),
        &ip,
        &conf.source_ranges,
        &conf.protocol,
        &conf.firewall_ports(),
        tags,
        Some(PRIORITY),
    );
    let enumerated = conf.port_strings();
    firewall::ensure(api, &want, |have, want| {
        firewall::external_traffic_equal(have, want, &enumerated)
    })
    .await?;

    if existing.is_some() && rule_recreate {
        // From here until the rule exists again the address must survive a failure.
        hold.release = false;
        api.delete_forwarding_rule(lb).await?;
        tracing::info!(load_balancer = lb, "GCE: deleted the forwarding rule to re-create it");
    }

    let hc = HcSpec { name: hc_name, path, port, nodes: conf.health_check_node_port.is_none() };
    if pool.is_some() && pool_recreate {
        let hcs: Vec<String> = hc_delete.into_iter().collect();
        let _guard = lbs.shared.lock().await;
        delete_pool_and_checks(api, lb, &cx.cluster_id, &hcs).await?;
    }
    if pool_recreate {
        create_pool_and_check(lbs, cx, conf, &ip, hosts, tags, &hc).await?;
        if hosts.len() > CREATE_INSTANCES {
            update_pool(api, lb, hosts).await?;
        }
    } else {
        update_pool(api, lb, hosts).await?;
        ensure_http_health_check(api, &hc).await?;
        let _guard = if hc.nodes { Some(lbs.shared.lock().await) } else { None };
        ensure_health_check_firewall(api, cx, conf, &ip, tags, &hc).await?;
    }

    if rule_recreate {
        let mut fr = ForwardingRule::default();
        fr.name = Some(lb.to_string());
        fr.description = Some(naming::service_description(&conf.service));
        fr.ip_address = Some(ip.clone());
        fr.ip_protocol = Some(conf.protocol.as_str().into());
        fr.port_range = Some(conf.port_range());
        fr.target = Some(api.regional_link("targetPools", lb));
        fr.network_tier = Some(conf.tier.compute().into());
        match api.insert_forwarding_rule(&fr).await {
            Ok(()) => {}
            Err(e) if e.is_already_exists() => {}
            Err(e) => return Err(e.into()),
        }
        hold.release = true;
        tracing::info!(load_balancer = lb, ip = %ip, "GCE: created the forwarding rule");
    }
    Ok(status(&ip))
}

/// The node-change path: target-pool members only.
pub(crate) async fn update(
    lbs: &GceLoadBalancer,
    cx: &Ctx<'_>,
    nodes: &[Node],
) -> Result<(), LbError> {
    let rule = if annotations::uses_rbs(cx.service)
        && !has_finalizer(cx.service, keys::FINALIZER_NETLB_V1)
    {
        cx.api.forwarding_rule(&cx.lb).await?
    } else {
        None
    };
    if annotations::uses_rbs(cx.service) && !ours(cx.service, rule.as_ref()) {
        return Err(ProviderError::ImplementedElsewhere.into());
    }
    let hosts = lbs.hosts(&cx.api, &hosts::node_instance_names(nodes)).await?;
    let _parking = cx.api.parking();
    update_pool(&cx.api, &cx.lb, &hosts).await
}

/// Upstream's `verifyUserRequestedIP`: the requested IP is a reserved address of the region
/// (the user's: never released; its tier must be the Service's), or already this rule's IP.
async fn verify_requested_ip(
    api: &Api<'_>,
    lb: &str,
    conf: &ServiceConfig,
    rule_ip: &str,
) -> Result<bool, LbError> {
    let ip = conf.requested_ip.as_str();
    super::refuse_ip_of_other_rules(api, lb, ip).await?;
    match api.address_by_ip(ip).await? {
        Some(a) => {
            // An address the cluster did not reserve, used by a rule that is not this
            // Service's: someone else's load balancer (refused, as Compute would refuse the
            // second rule on its IP and port).
            let foreign: Vec<&str> = a
                .users
                .iter()
                .filter(|u| u.contains("/forwardingRules/"))
                .map(|u| crate::client::last_segment(u))
                .filter(|n| *n != lb)
                .collect();
            if a.name.as_deref() != Some(lb) && !foreign.is_empty() {
                return Err(ProviderError::Invalid {
                    what: "spec.loadBalancerIP".into(),
                    message: format!(
                        "requested IP {ip} (address {}) is used by the forwarding rule(s) {} of another load balancer",
                        a.name.as_deref().unwrap_or_default(),
                        foreign.join(", ")
                    ),
                }
                .into());
            }
            let tier = tier_of(a.network_tier.as_ref().and_then(|t| t.name()));
            if tier != conf.tier {
                return Err(ProviderError::Invalid {
                    what: "spec.loadBalancerIP".into(),
                    message: format!(
                        "requested IP {ip} (address {}) belongs to the {} network tier; expected {}",
                        a.name.as_deref().unwrap_or_default(),
                        tier.compute(),
                        conf.tier.compute()
                    ),
                }
                .into());
            }
            // An address named for the load balancer is the one a failed sync left: ours.
            Ok(a.name.as_deref() != Some(lb))
        }
        None if ip == rule_ip => Ok(false),
        None => Err(ProviderError::Invalid {
            what: "spec.loadBalancerIP".into(),
            message: format!("requested ip {ip} is neither static nor assigned to the load balancer (reserve it as a regional static address)"),
        }
        .into()),
    }
}

/// Upstream's `ensureStaticIP`: reserves `<lb>` (promoting the rule's IP when it has one); a
/// 409/400 means it exists, unless no such address can then be read (the 400 was a refusal,
/// e.g. an invalid IP, and is the error). Returns the IP and whether it existed.
async fn ensure_static_ip(
    api: &Api<'_>,
    lb: &str,
    conf: &ServiceConfig,
    rule_ip: &str,
) -> Result<(String, bool), LbError> {
    let mut a = Address::default();
    a.name = Some(lb.to_string());
    a.description = Some(naming::service_description(&conf.service));
    a.network_tier = Some(conf.tier.compute().into());
    if !rule_ip.is_empty() {
        a.address = Some(rule_ip.to_string());
    }
    // A 409 (or a 400 for an address in use) means it exists; which one is decided by the
    // read below: when no address is there, the insert's own refusal is the error.
    let (existed, refusal) = match api.insert_address(&a).await {
        Ok(()) => (false, None),
        Err(e @ crate::client::GceError::Api { status: 409 | 400, .. }) => (true, Some(e)),
        Err(e) => return Err(e.into()),
    };
    let got = if rule_ip.is_empty() {
        api.address(lb).await?
    } else {
        api.address_by_ip(rule_ip).await?
    };
    match got.and_then(|a| a.address) {
        Some(ip) if !ip.is_empty() => Ok((ip, existed)),
        _ => match refusal {
            Some(e) => Err(e.into()),
            None => Err(ProviderError::other(format!(
                "static IP address {lb} not found after reserving it"
            ))
            .into()),
        },
    }
}

/// A legacy HTTP health check to have.
pub(crate) struct HcSpec {
    pub name: String,
    pub path: &'static str,
    pub port: i32,
    /// The shared nodes check (else the Service's own).
    pub nodes: bool,
}

fn http_health_check(hc: &HcSpec) -> HttpHealthCheck {
    let mut h = HttpHealthCheck::default();
    h.name = Some(hc.name.clone());
    h.port = Some(hc.port);
    h.request_path = Some(hc.path.to_string());
    h.description = Some(naming::http_health_check_description(&hc.name));
    h.check_interval_sec = Some(HC_INTERVAL);
    h.timeout_sec = Some(HC_TIMEOUT);
    h.healthy_threshold = Some(HC_HEALTHY);
    h.unhealthy_threshold = Some(HC_UNHEALTHY);
    h
}

/// Upstream's `needToUpdateHTTPHealthChecks`: port, path or description differ, or a
/// timing is below the default.
fn http_needs_update(have: &HttpHealthCheck, want: &HttpHealthCheck) -> bool {
    let lt = |a: Option<i32>, b: Option<i32>| a.unwrap_or(0) < b.unwrap_or(0);
    have.port != want.port
        || have.request_path != want.request_path
        || have.description != want.description
        || lt(have.check_interval_sec, want.check_interval_sec)
        || lt(have.timeout_sec, want.timeout_sec)
        || lt(have.unhealthy_threshold, want.unhealthy_threshold)
        || lt(have.healthy_threshold, want.healthy_threshold)
}

/// Keeps timings above the defaults (upstream's `mergeHTTPHealthChecks`).
fn merge_timings(have: &HttpHealthCheck, want: &mut HttpHealthCheck) {
    let max = |a: Option<i32>, b: Option<i32>| Some(a.unwrap_or(0).max(b.unwrap_or(0)));
    want.check_interval_sec = max(have.check_interval_sec, want.check_interval_sec);
    want.timeout_sec = max(have.timeout_sec, want.timeout_sec);
    want.unhealthy_threshold = max(have.unhealthy_threshold, want.unhealthy_threshold);
    want.healthy_threshold = max(have.healthy_threshold, want.healthy_threshold);
}

/// Upstream's `ensureHTTPHealthCheck`; returns the check's link.
async fn ensure_http_health_check(api: &Api<'_>, hc: &HcSpec) -> Result<String, LbError> {
    let mut want = http_health_check(hc);
    let have = match api.http_health_check(&hc.name).await? {
        None => {
            api.insert_http_health_check(&want).await?;
            tracing::info!(health_check = %hc.name, port = hc.port, "GCE: created HTTP health check");
            api.http_health_check(&hc.name).await?
        }
        Some(have) if http_needs_update(&have, &want) => {
            tracing::warn!(health_check = %hc.name, "GCE: health check parameters drifted; updating");
            merge_timings(&have, &mut want);
            api.update_http_health_check(&want).await?;
            api.http_health_check(&hc.name).await?
        }
        Some(have) => Some(have),
    };
    have.and_then(|h| h.self_link).ok_or_else(|| {
        ProviderError::other(format!("HTTP health check {} vanished", hc.name)).into()
    })
}

/// Upstream's `ensureHTTPHealthCheckFirewall`.
async fn ensure_health_check_firewall(
    api: &Api<'_>,
    cx: &Ctx<'_>,
    conf: &ServiceConfig,
    ip: &str,
    tags: &[String],
    hc: &HcSpec,
) -> Result<(), LbError> {
    let desc = if hc.nodes {
        naming::cluster_description(&cx.cluster_id)
    } else {
        naming::firewall_description(&conf.service, ip)
    };
    let sources = cx.hc_sources;
    let want = firewall::object(
        api,
        &naming::external_health_check_firewall(&cx.cluster_id, &hc.name, hc.nodes),
        &desc,
        ip,
        sources,
        "tcp",
        &[hc.port.to_string()],
        tags,
        Some(PRIORITY),
    );
    firewall::ensure(api, &want, firewall::health_check_equal).await
}

/// Upstream's `createTargetPoolAndHealthCheck`: the check's firewall, the check, the pool
/// (with up to 200 instances).
async fn create_pool_and_check(
    lbs: &GceLoadBalancer,
    cx: &Ctx<'_>,
    conf: &ServiceConfig,
    ip: &str,
    hosts: &[Host],
    tags: &[String],
    hc: &HcSpec,
) -> Result<(), LbError> {
    let api = &cx.api;
    let _guard = if hc.nodes { Some(lbs.shared.lock().await) } else { None };
    ensure_health_check_firewall(api, cx, conf, ip, tags, hc).await?;
    let hc_link = ensure_http_health_check(api, hc).await?;
    let mut tp = TargetPool::default();
    tp.name = Some(cx.lb.clone());
    tp.description = Some(naming::service_description(&conf.service));
    tp.instances =
        hosts.iter().take(CREATE_INSTANCES).map(|h| api.instance_link(&h.zone, &h.name)).collect();
    tp.session_affinity = Some(conf.affinity.into());
    tp.health_checks = vec![hc_link];
    match api.insert_target_pool(&tp).await {
        Ok(()) => {
            tracing::info!(load_balancer = %cx.lb, instances = tp.instances.len(), "GCE: created the target pool");
            Ok(())
        }
        Err(e) if e.is_already_exists() => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// Upstream's `updateTargetPool`: adds and removes members (at most 1000 per call), then
/// checks the count (upstream was bitten by a pool emptied by mistake).
async fn update_pool(api: &Api<'_>, lb: &str, hosts: &[Host]) -> Result<(), LbError> {
    let Some(tp) = api.target_pool(lb).await? else {
        return Err(ProviderError::other(format!("target pool {lb} not found")).into());
    };
    let mut existing: BTreeMap<String, String> =
        tp.instances.iter().map(|l| (comparable_path(l), l.clone())).collect();
    let mut add = Vec::new();
    for h in hosts {
        if existing.remove(&h.comparable()).is_none() {
            add.push(api.instance_link(&h.zone, &h.name));
        }
    }
    let remove: Vec<String> = existing.into_values().collect();
    if add.is_empty() && remove.is_empty() {
        return Ok(());
    }
    for chunk in add.chunks(UPDATE_INSTANCES) {
        api.add_to_target_pool(lb, chunk).await?;
    }
    for chunk in remove.chunks(UPDATE_INSTANCES) {
        api.remove_from_target_pool(lb, chunk).await?;
    }
    tracing::info!(
        load_balancer = lb,
        added = add.len(),
        removed = remove.len(),
        "GCE: updated the target pool"
    );
    let now = api.target_pool(lb).await?.map(|t| t.instances.len()).unwrap_or(0);
    if now != hosts.len() {
        return Err(ProviderError::other(format!(
            "unexpected number of instances ({now}) in target pool {lb} after update (expected {})",
            hosts.len()
        ))
        .into());
    }
    Ok(())
}

/// Upstream's `DeleteExternalTargetPoolAndChecks`: the pool, then each health check that no
/// other pool uses, with its firewall (a check in use is left, with its firewall).
async fn delete_pool_and_checks(
    api: &Api<'_>,
    lb: &str,
    cluster_id: &str,
    hcs: &[String],
) -> Result<(), LbError> {
    if api.delete_target_pool(lb).await? {
        tracing::info!(load_balancer = lb, "GCE: deleted the target pool");
    }
    for hc in hcs {
        let nodes = hc != lb;
        match api.delete_http_health_check(hc).await {
            Ok(_) => {}
            Err(e) if e.is_in_use() => {
                tracing::debug!(health_check = %hc, "GCE: health check still in use; kept");
                continue;
            }
            Err(e) => return Err(e.into()),
        }
        firewall::delete(api, &naming::external_health_check_firewall(cluster_id, hc, nodes))
            .await?;
    }
    Ok(())
}

/// Everything of an external load balancer: the forwarding rule, then the target pool and the
/// health checks `hcs` with their firewalls, then the traffic firewall and the address (both
/// attempted; the first error is returned). Those two go last because they are what
/// `get_load_balancer` takes for an unfinished load balancer once the rule is gone: a delete
/// whose operations are parked spans several syncs, and the service controller asks whether
/// the load balancer still exists before each (upstream deletes them alongside the rule, in
/// one sync).
pub(crate) async fn delete(
    api: &Api<'_>,
    lb: &str,
    cluster_id: &str,
    hcs: &[String],
) -> Result<(), LbError> {
    api.delete_forwarding_rule(lb).await?;
    delete_pool_and_checks(api, lb, cluster_id, hcs).await?;
    let fw_name = naming::firewall(lb);
    let fw = firewall::delete(api, &fw_name);
    let addr = async { api.delete_address(lb).await.map(|_| ()).map_err(LbError::from) };
    let (a, b) = futures::join!(fw, addr);
    a.and(b)
}

/// Deletes the Service's external load balancer (upstream's
/// `ensureExternalLoadBalancerDeleted`): the Local check `<lb>` when it exists, else both
/// `<lb>` and the shared nodes check (whichever it used; the shared one stays while another
/// pool uses it).
pub(crate) async fn delete_for_service(lbs: &GceLoadBalancer, cx: &Ctx<'_>) -> Result<(), LbError> {
    let local = cx.service.spec.as_ref().is_some_and(|s| {
        s.external_traffic_policy.as_deref() == Some("Local")
            && s.health_check_node_port.unwrap_or(0) != 0
    });
    let hcs = if local {
        cx.api.http_health_check(&cx.lb).await?.and_then(|h| h.name).into_iter().collect()
    } else {
        vec![cx.lb.clone(), naming::nodes_health_check(&cx.cluster_id)]
    };
    let _guard = lbs.shared.lock().await;
    let _parking = cx.api.parking();
    delete(&cx.api, &cx.lb, &cx.cluster_id, &hcs).await?;
    lbs.parked.forget(&cx.lb);
    tracing::info!(load_balancer = %cx.lb, service = %annotations::service_key(cx.service), "GCE: deleted the external load balancer");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceSpec;
    use kube::api::ObjectMeta;

    fn svc(annotations: &[(&str, &str)], finalizers: &[&str], class: Option<&str>) -> Service {
        Service {
            metadata: ObjectMeta {
                annotations: Some(
                    annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                ),
                finalizers: Some(finalizers.iter().map(|f| f.to_string()).collect()),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                load_balancer_class: class.map(Into::into),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn which_services_are_ours() {
        let rbs = [(keys::L4_RBS, "enabled")];
        assert!(ours(&svc(&[], &[], None), None));
        assert!(!ours(&svc(&rbs, &[], None), None));
        // Upstream's finalizer, or our own target-pool rule, keep an RBS-annotated Service ours.
        assert!(ours(&svc(&rbs, &[keys::FINALIZER_NETLB_V1], None), None));
        let mut tp_rule = ForwardingRule::default();
        tp_rule.target = Some("…/targetPools/a1".into());
        assert!(ours(&svc(&rbs, &[], None), Some(&tp_rule)));
        let mut bs_rule = ForwardingRule::default();
        bs_rule.backend_service = Some("…/backendServices/k8s2-x".into());
        assert!(!ours(&svc(&[], &[], None), Some(&bs_rule)));
        assert!(!ours(&svc(&[], &[keys::FINALIZER_NETLB_V3], None), None));
        assert!(ours(&svc(&rbs, &[], Some(keys::CLASS_EXTERNAL_LEGACY)), None));
        assert!(!ours(&svc(&[], &[], Some(keys::CLASS_EXTERNAL_RBS)), None));
    }

    #[test]
    fn health_check_drift_and_merge() {
        let spec = HcSpec { name: "k8s-c-node".into(), path: "/healthz", port: 10256, nodes: true };
        let want = http_health_check(&spec);
        assert!(!http_needs_update(&want, &want));
        let mut slower = want.clone();
        slower.check_interval_sec = Some(30);
        assert!(!http_needs_update(&slower, &want), "longer timings are kept");
        let mut faster = want.clone();
        faster.check_interval_sec = Some(2);
        assert!(http_needs_update(&faster, &want));
        let mut merged = want.clone();
        merge_timings(&slower, &mut merged);
        assert_eq!(merged.check_interval_sec, Some(30));
        let mut moved = want.clone();
        moved.port = Some(31000);
        assert!(http_needs_update(&moved, &want));
        assert_eq!(
            want.description.as_deref(),
            Some(r#"{"kubernetes.io/service-name":"k8s-c-node"}"#)
        );
    }
}
