//! The Service's frontend IP configurations on the shared load balancer (upstream
//! `reconcileFrontendIPConfigs`, `isFrontendIPChanged`, `isFrontendIPConfigUnsafeToDelete`):
//! one per IP family, named by [`naming::frontend_name`], pointing at the Service's public
//! IP or at the internal subnet (static when an address is asked for, or to keep the address
//! the Service already has). A frontend whose name or target no longer matches is rebuilt;
//! other Services' and the operator's frontends are never touched.

use std::collections::BTreeMap;
use std::net::IpAddr;

use ipnet::IpNet;
use serde_json::Value;

use crate::client::models::{FrontendIpConfiguration, FrontendIpProperties, LoadBalancer, Ref};

use super::annotations::{Family, ServiceConfig};
use super::naming;

/// Where a frontend points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// A public IP (public load balancer).
    Public {
        /// The public IP's ARM ID.
        pip_id: String,
    },
    /// A subnet (internal load balancer).
    Internal {
        /// The subnet's ARM ID.
        subnet_id: String,
        /// The subnet's prefixes (to keep a status address that is in it).
        prefixes: Vec<IpNet>,
        /// The address asked for (annotation or `spec.loadBalancerIP`).
        ip: Option<IpAddr>,
        /// The availability zones a new frontend gets (the region's; empty: none).
        zones: Vec<String>,
    },
}

/// The family of a frontend the Service owns (upstream `isFIPIPv6`: by the `-IPv6` suffix
/// for dual-stack Services, else the Service's only family).
pub fn family_of(svc: &ServiceConfig, fe: &FrontendIpConfiguration) -> Family {
    if svc.dual_stack() {
        if fe.name().to_ascii_lowercase().ends_with(&naming::IPV6_SUFFIX.to_ascii_lowercase()) {
            Family::V6
        } else {
            Family::V4
        }
    } else {
        svc.families.first().copied().unwrap_or(Family::V4)
    }
}

/// The Service's frontends on `lb`.
pub fn owned<'a>(
    svc: &'a ServiceConfig,
    lb: &'a LoadBalancer,
) -> impl Iterator<Item = &'a FrontendIpConfiguration> {
    lb.properties.frontend_ip_configurations.iter().filter(|f| naming::owns(svc, f.name()))
}

fn matches(
    svc: &ServiceConfig,
    fe: &FrontendIpConfiguration,
    family: Family,
    target: &Target,
) -> bool {
    if !fe.name().eq_ignore_ascii_case(&naming::frontend_name(svc, family)) {
        return false;
    }
    let p = &fe.properties;
    match target {
        Target::Public { pip_id } => p.public_ip_address.as_ref().is_some_and(|r| r.is(pip_id)),
        Target::Internal { subnet_id, ip, .. } => {
            if p.public_ip_address.is_some() || p.subnet.is_none() {
                return false;
            }
            if svc.internal_subnet.is_some() && !p.subnet.as_ref().is_some_and(|r| r.is(subnet_id))
            {
                return false;
            }
            if let Some(v) = p.private_ip_address_version.as_deref()
                && !v.eq_ignore_ascii_case(family.arm())
            {
                return false;
            }
            match ip {
                Some(ip) => {
                    p.private_ip_address.as_deref().and_then(|a| a.parse::<IpAddr>().ok())
                        == Some(*ip)
                }
                None => true,
            }
        }
    }
}

/// A new frontend of the Service. `previous`: the zones of the frontend of the same name this
/// one replaces (ARM never changes a frontend's zones, so a rebuilt one keeps them, as
/// upstream's `getFrontendZones`); otherwise an internal frontend gets the target's zones
/// (the region's), a public one none (its public IP carries them).
fn new_frontend(
    svc: &ServiceConfig,
    lb_id: &str,
    family: Family,
    target: &Target,
    previous: Option<Option<Vec<String>>>,
) -> FrontendIpConfiguration {
    let name = naming::frontend_name(svc, family);
    let zones = match (previous, target) {
        (Some(had), _) => had,
        (None, Target::Internal { zones, .. }) if !zones.is_empty() => Some(zones.clone()),
        (None, _) => None,
    };
    let properties = match target {
        Target::Public { pip_id } => {
            FrontendIpProperties { public_ip_address: Some(Ref::to(pip_id)), ..Default::default() }
        }
        Target::Internal { subnet_id, prefixes, ip, .. } => {
            // The address asked for, else the one the Service has (when in the subnet), else
            // whatever ARM allocates.
            let keep = ip.or_else(|| {
                svc.ingress_ips
                    .iter()
                    .find(|a| Family::of(a) == family && prefixes.iter().any(|n| n.contains(*a)))
                    .copied()
            });
            FrontendIpProperties {
                subnet: Some(Ref::to(subnet_id)),
                private_ip_address: keep.map(|a| a.to_string()),
                private_ip_allocation_method: Some(
                    if keep.is_some() { "Static" } else { "Dynamic" }.to_string(),
                ),
                private_ip_address_version: (family == Family::V6)
                    .then(|| family.arm().to_string()),
                ..Default::default()
            }
        }
    };
    FrontendIpConfiguration {
        id: Some(naming::child_id(lb_id, "frontendIPConfigurations", &name)),
        name: Some(name),
        zones,
        properties,
        ..Default::default()
    }
}

/// Another Service's frontend that already points where the Service wants its frontend of
/// `family`, so the Service shares it as a secondary (upstream's `serviceOwnsFrontendIP`):
/// the same public IP (the Service names it by `azure-pip-name` or `loadBalancerIP`), or, on
/// an internal load balancer, the private address the Service asks for. The Service's own
/// frontend wins (it is the primary). Only frontends the cluster made for a Service (named
/// `a<uid>`) are shared; an operator's frontend is not.
pub fn shared_with<'a>(
    svc: &ServiceConfig,
    lb: &'a LoadBalancer,
    family: Family,
    target: &Target,
) -> Option<&'a FrontendIpConfiguration> {
    let fes = &lb.properties.frontend_ip_configurations;
    if fes.iter().any(|fe| naming::owns(svc, fe.name()) && matches(svc, fe, family, target)) {
        return None;
    }
    fes.iter().filter(|fe| !naming::owns(svc, fe.name())).find(|fe| {
        if super::service_prefix(fe.name()).is_none() {
            return false;
        }
        let p = &fe.properties;
        match target {
            Target::Public { pip_id } => p.public_ip_address.as_ref().is_some_and(|r| r.is(pip_id)),
            Target::Internal { ip: Some(ip), .. } => {
                p.public_ip_address.is_none()
                    && p.private_ip_address.as_deref().and_then(|a| a.parse::<IpAddr>().ok())
                        == Some(*ip)
            }
            Target::Internal { ip: None, .. } => false,
        }
    })
}

/// The frontends the Service uses on `lb`: its own (by name) and those its rules reference
/// (shared with another Service, see [`shared_with`]).
pub fn used<'a>(
    svc: &'a ServiceConfig,
    lb: &'a LoadBalancer,
) -> impl Iterator<Item = &'a FrontendIpConfiguration> {
    let referenced: Vec<String> = lb
        .properties
        .load_balancing_rules
        .iter()
        .filter(|r| naming::owns(svc, r.name()))
        .filter_map(|r| r.properties.frontend_ip_configuration.as_ref().map(|f| f.id.clone()))
        .collect();
    lb.properties.frontend_ip_configurations.iter().filter(move |f| {
        naming::owns(svc, f.name()) || referenced.iter().any(|id| f.id().eq_ignore_ascii_case(id))
    })
}

/// Makes the Service's frontends on `lb` exactly one per family in `targets` (its own, or
/// another Service's it shares: [`shared_with`]). Returns whether `lb` changed and the
/// frontend IDs per family.
pub fn reconcile(
    lb: &mut LoadBalancer,
    lb_id: &str,
    svc: &ServiceConfig,
    targets: &BTreeMap<Family, Target>,
) -> (bool, BTreeMap<Family, String>) {
    let mut changed = false;
    let shared: BTreeMap<Family, String> = targets
        .iter()
        .filter_map(|(f, t)| {
            let fe = shared_with(svc, lb, *f, t)?;
            Some((
                *f,
                fe.id.clone().unwrap_or_else(|| {
                    naming::child_id(lb_id, "frontendIPConfigurations", fe.name())
                }),
            ))
        })
        .collect();
    let fes = &mut lb.properties.frontend_ip_configurations;
    let before = fes.len();
    // The zones of the Service's frontends as they are (a rebuilt one keeps them).
    let had_zones: Vec<(String, Option<Vec<String>>)> = fes
        .iter()
        .filter(|fe| naming::owns(svc, fe.name()))
        .map(|fe| (fe.name().to_ascii_lowercase(), fe.zones.clone()))
        .collect();
    fes.retain(|fe| {
        if !naming::owns(svc, fe.name()) {
            return true;
        }
        let family = family_of(svc, fe);
        !shared.contains_key(&family)
            && targets.get(&family).is_some_and(|t| matches(svc, fe, family, t))
    });
    changed |= fes.len() != before;
    let mut ids = shared.clone();
    for (family, target) in targets.iter().filter(|(f, _)| !shared.contains_key(f)) {
        let name = naming::frontend_name(svc, *family);
        let id = match fes.iter().find(|f| f.name().eq_ignore_ascii_case(&name)) {
            Some(f) => f
                .id
                .clone()
                .unwrap_or_else(|| naming::child_id(lb_id, "frontendIPConfigurations", f.name())),
            None => {
                let previous = had_zones
                    .iter()
                    .find(|(n, _)| n.eq_ignore_ascii_case(&name))
                    .map(|(_, z)| z.clone());
                let fe = new_frontend(svc, lb_id, *family, target, previous);
                let id = fe.id().to_string();
                fes.push(fe);
                changed = true;
                id
            }
        };
        ids.insert(*family, id);
    }
    (changed, ids)
}

fn mentions(v: &Value, id: &str) -> bool {
    match v {
        Value::String(s) => s.eq_ignore_ascii_case(id),
        Value::Array(a) => a.iter().any(|x| mentions(x, id)),
        Value::Object(o) => o.values().any(|x| mentions(x, id)),
        _ => false,
    }
}

/// Whether something not of the Service still uses the frontend: another Service's rule, an
/// outbound rule, an inbound NAT rule or pool (upstream keeps such a frontend on delete).
pub fn in_use_by_others(
    svc: &ServiceConfig,
    lb: &LoadBalancer,
    fe: &FrontendIpConfiguration,
) -> bool {
    let id = fe.id();
    if id.is_empty() {
        return false;
    }
    let p = &lb.properties;
    p.load_balancing_rules.iter().any(|r| {
        !naming::owns(svc, r.name())
            && r.properties.frontend_ip_configuration.as_ref().is_some_and(|f| f.is(id))
    }) || ["outboundRules", "inboundNatRules", "inboundNatPools"]
        .iter()
        .any(|k| p.extra.get(*k).is_some_and(|v| mentions(v, id)))
}

/// Removes the Service's frontends that nothing else uses, and the frontends of other
/// Services it shared that nothing but its rules uses any more (upstream's
/// `removeStaleServiceLBResources`: a shared frontend goes with its last user, whichever
/// Service made it; only frontends the cluster made for a Service, never an operator's).
/// Call before the Service's rules are taken off. Returns the removed ones.
pub fn remove(lb: &mut LoadBalancer, svc: &ServiceConfig) -> Vec<FrontendIpConfiguration> {
    let shared: Vec<String> = used(svc, lb)
        .filter(|f| !naming::owns(svc, f.name()) && super::service_prefix(f.name()).is_some())
        .map(|f| f.id().to_string())
        .collect();
    let (mine, rest): (Vec<_>, Vec<_>) =
        std::mem::take(&mut lb.properties.frontend_ip_configurations).into_iter().partition(|f| {
            naming::owns(svc, f.name()) || shared.iter().any(|id| f.id().eq_ignore_ascii_case(id))
        });
    lb.properties.frontend_ip_configurations = rest;
    let mut removed = Vec::new();
    for fe in mine {
        if in_use_by_others(svc, lb, &fe) {
            tracing::warn!(frontend = fe.name(), service = %svc.key,
                "frontend kept: another rule of the load balancer still uses it");
            lb.properties.frontend_ip_configurations.push(fe);
        } else {
            removed.push(fe);
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::super::annotations::{self, parse};
    use super::*;
    use serde_json::json;

    const LB: &str =
        "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/k";
    const P: &str = "a6f7f1b2c123456789abcdef01234567";
    const PIP: &str =
        "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/publicIPAddresses/k-a6f";

    fn svc(a: &[(&str, &str)]) -> ServiceConfig {
        parse(&annotations::tests::svc(a, &[(80, "TCP")])).unwrap()
    }

    #[test]
    fn adds_keeps_and_rebuilds() {
        let c = svc(&[]);
        let mut lb = LoadBalancer::default();
        let other = FrontendIpConfiguration { name: Some("outbound".into()), ..Default::default() };
        lb.properties.frontend_ip_configurations.push(other.clone());
        let t = BTreeMap::from([(Family::V4, Target::Public { pip_id: PIP.into() })]);
        let (changed, ids) = reconcile(&mut lb, LB, &c, &t);
        assert!(changed);
        assert_eq!(ids[&Family::V4], format!("{LB}/frontendIPConfigurations/{P}"));
        assert_eq!(lb.properties.frontend_ip_configurations.len(), 2);
        assert!(!reconcile(&mut lb, LB, &c, &t).0);
        let t2 = BTreeMap::from([(Family::V4, Target::Public { pip_id: format!("{PIP}x") })]);
        assert!(reconcile(&mut lb, LB, &c, &t2).0);
        let fe = &lb.properties.frontend_ip_configurations[1];
        assert!(fe.properties.public_ip_address.as_ref().unwrap().is(&format!("{PIP}x")));
        assert_eq!(lb.properties.frontend_ip_configurations[0], other);
    }

    #[test]
    fn internal_static_and_kept_addresses() {
        let sn = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/n";
        let mut c = svc(&[(annotations::INTERNAL, "true")]);
        c.ingress_ips = vec!["10.0.0.9".parse().unwrap()];
        let prefixes = vec!["10.0.0.0/24".parse().unwrap()];
        let t = BTreeMap::from([(
            Family::V4,
            Target::Internal { subnet_id: sn.into(), prefixes, ip: None, zones: vec![] },
        )]);
        let mut lb = LoadBalancer::default();
        reconcile(&mut lb, LB, &c, &t);
        let p = &lb.properties.frontend_ip_configurations[0].properties;
        assert_eq!(p.private_ip_address.as_deref(), Some("10.0.0.9"));
        assert_eq!(p.private_ip_allocation_method.as_deref(), Some("Static"));
        // A new address asked for rebuilds the frontend.
        let t = BTreeMap::from([(
            Family::V4,
            Target::Internal {
                subnet_id: sn.into(),
                prefixes: vec![],
                ip: Some("10.0.0.7".parse().unwrap()),
                zones: vec!["1".into(), "2".into()],
            },
        )]);
        assert!(reconcile(&mut lb, LB, &c, &t).0);
        let fe = &lb.properties.frontend_ip_configurations[0];
        assert_eq!(fe.properties.private_ip_address.as_deref(), Some("10.0.0.7"));
        // Rebuilt: it keeps the zones it had (none), not the region's.
        assert_eq!(fe.zones, None);
    }

    #[test]
    fn a_new_internal_frontend_gets_the_regions_zones_a_public_one_none() {
        let sn = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/virtualNetworks/v/subnets/n";
        let zones = vec!["1".to_string(), "2".to_string(), "3".to_string()];
        let c = svc(&[(annotations::INTERNAL, "true")]);
        let t = BTreeMap::from([(
            Family::V4,
            Target::Internal {
                subnet_id: sn.into(),
                prefixes: vec![],
                ip: None,
                zones: zones.clone(),
            },
        )]);
        let mut lb = LoadBalancer::default();
        reconcile(&mut lb, LB, &c, &t);
        assert_eq!(lb.properties.frontend_ip_configurations[0].zones.as_ref(), Some(&zones));
        let p = svc(&[]);
        let t = BTreeMap::from([(Family::V4, Target::Public { pip_id: PIP.into() })]);
        let mut lb = LoadBalancer::default();
        reconcile(&mut lb, LB, &p, &t);
        assert_eq!(lb.properties.frontend_ip_configurations[0].zones, None);
    }

    #[test]
    fn remove_keeps_frontends_others_use() {
        let c = svc(&[]);
        let mut lb: LoadBalancer = serde_json::from_value(json!({
            "properties": {
                "frontendIPConfigurations": [
                    {"name": P, "id": format!("{LB}/frontendIPConfigurations/{P}")},
                    {"name": format!("{P}-IPv6"), "id": format!("{LB}/frontendIPConfigurations/{P}-IPv6")}
                ],
                "outboundRules": [{"name": "o", "properties": {"frontendIPConfigurations": [
                    {"id": format!("{LB}/frontendIPConfigurations/{P}-IPv6")}]}}]
            }
        }))
        .unwrap();
        let removed = remove(&mut lb, &c);
        assert_eq!(removed.len(), 1);
        assert_eq!(removed[0].name(), P);
        assert_eq!(lb.properties.frontend_ip_configurations.len(), 1);
    }
}
