//! Private link services of the Azure emulator (`Microsoft.Network/privateLinkServices`,
//! issue #33 item 2): GET, PUT, DELETE and lists (resource group and subscription) through
//! the emulator's generic ARM paths (long-running `PUT`/`DELETE` with `Azure-AsyncOperation`,
//! ETags, paging), with ARM's rules checked here:
//!
//! | rule | answer |
//! |---|---|
//! | no `loadBalancerFrontendIpConfigurations` | 400 `InvalidRequestFormat` |
//! | a frontend (or its load balancer) that does not exist | 400 `InvalidResourceReference` |
//! | a frontend with a public IP (not internal) | 400 `PrivateLinkServiceFrontendIpConfigurationIsNotInternal` (ours: ARM refuses it, code not documented) |
//! | a frontend another private link service already uses | 400 `LoadBalancerFrontendIpConfigurationAlreadyUsedByPrivateLinkService` (ours) |
//! | fewer than 1 or more than 8 `ipConfigurations`, or not exactly one `primary` | 400 `InvalidRequestFormat` |
//! | an IP configuration's subnet missing | 400 `InvalidResourceReference` |
//! | a NAT subnet with `privateLinkServiceNetworkPolicies` not `Disabled` | 400 `PrivateLinkServiceCannotBeCreatedInSubnetThatHasNetworkPoliciesEnabled` (ARM's) |
//! | an IPv6 NAT IP configuration | 400 `PrivateLinkServiceIpConfigurationIPv6NotSupported` (ours) |
//! | a static NAT address outside its subnet / taken | 400 `PrivateIPAddressNotInSubnet` / `PrivateIPAddressIsAllocated` (ARM's) |
//! | a load balancer `PUT` dropping a frontend a private link service uses, or a load balancer `DELETE` with one | 400 `LoadBalancerFrontendIpConfigurationInUseByPrivateLinkService` (ours) |
//! | a subnet `PUT` enabling `privateLinkServiceNetworkPolicies` while a private link service has a NAT address in it | 400 `PrivateLinkServiceNetworkPoliciesCannotBeEnabledOnPrivateLinkServiceSubnet` (ARM's) |
//!
//! Dynamic NAT addresses are allocated from the subnet; ARM's read-only parts are computed:
//! `alias` (`<name>.<guid>.<location>.azure.privatelinkservice`), `networkInterfaces`,
//! `privateEndpointConnections` (none: the emulator makes no private endpoints).

use serde_json::{Value, json};

use super::{Kind, Res, State, bad, children_mut, ids_eq, name_child, uuid};

/// ARM's code for a PLS in a subnet whose network policies are on.
pub(super) const SUBNET_POLICIES_ENABLED: &str =
    "PrivateLinkServiceCannotBeCreatedInSubnetThatHasNetworkPoliciesEnabled";
/// A frontend with a public IP.
pub(super) const FRONTEND_NOT_INTERNAL: &str =
    "PrivateLinkServiceFrontendIpConfigurationIsNotInternal";
/// A frontend another PLS already serves.
pub(super) const FRONTEND_TAKEN: &str =
    "LoadBalancerFrontendIpConfigurationAlreadyUsedByPrivateLinkService";
/// A frontend a PLS uses cannot go.
pub(super) const FRONTEND_IN_USE: &str =
    "LoadBalancerFrontendIpConfigurationInUseByPrivateLinkService";
/// Enabling network policies on a subnet with a PLS in it.
pub(super) const POLICIES_ON_PLS_SUBNET: &str =
    "PrivateLinkServiceNetworkPoliciesCannotBeEnabledOnPrivateLinkServiceSubnet";

fn invalid_ref(id: &str, what: &str, r: &str) -> super::Resp {
    bad(
        "InvalidResourceReference",
        format!(
            "Resource {r} referenced by resource {id} was not found. Please make sure that the referenced resource exists, and that both resources are in the same region. ({what})"
        ),
    )
}

fn frontend_refs(pls: &Value) -> Vec<String> {
    pls["properties"]["loadBalancerFrontendIpConfigurations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["id"].as_str().map(str::to_string))
        .collect()
}

/// The private link service (its ID) that serves frontend `fe_id`, other than `except`.
pub(super) fn user_of_frontend(st: &State, fe_id: &str, except: &str) -> Option<String> {
    st.res
        .values()
        .filter(|r| r.kind == Kind::Pls)
        .filter(|r| !ids_eq(r.body["id"].as_str().unwrap_or_default(), except))
        .find(|r| frontend_refs(&r.body).iter().any(|f| ids_eq(f, fe_id)))
        .map(|r| r.body["id"].as_str().unwrap_or_default().to_string())
}

/// A load balancer `PUT` (`body`, replacing `current`) may not drop a frontend a private link
/// service uses.
pub(super) fn check_frontends_kept(st: &State, body: &Value, current: Option<&Value>) -> Res<()> {
    let Some(current) = current else { return Ok(()) };
    let kept: Vec<String> = body["properties"]["frontendIPConfigurations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|f| f["name"].as_str().map(str::to_ascii_lowercase))
        .collect();
    let lb_id = current["id"].as_str().unwrap_or_default();
    for fe in current["properties"]["frontendIPConfigurations"].as_array().into_iter().flatten() {
        let name = fe["name"].as_str().unwrap_or_default();
        if kept.contains(&name.to_ascii_lowercase()) {
            continue;
        }
        let fe_id = format!("{lb_id}/frontendIPConfigurations/{name}");
        if let Some(pls) = user_of_frontend(st, &fe_id, "") {
            return Err(in_use(&fe_id, &pls));
        }
    }
    Ok(())
}

/// A load balancer `DELETE`: none of its frontends may be used by a private link service.
pub(super) fn check_lb_delete(st: &State, lb: &Value) -> Res<()> {
    check_frontends_kept(st, &json!({"properties": {"frontendIPConfigurations": []}}), Some(lb))
}

fn in_use(fe_id: &str, pls: &str) -> super::Resp {
    bad(
        FRONTEND_IN_USE,
        format!(
            "Frontend IP configuration {fe_id} is used by private link service {pls} and cannot be deleted. Delete the private link service first."
        ),
    )
}

/// A subnet `PUT` may not turn `privateLinkServiceNetworkPolicies` on while a private link
/// service has a NAT address in the subnet.
pub(super) fn check_subnet(st: &State, id: &str, body: &Value) -> Res<()> {
    let on = body["properties"]["privateLinkServiceNetworkPolicies"]
        .as_str()
        .is_none_or(|p| !p.eq_ignore_ascii_case("Disabled"));
    if !on {
        return Ok(());
    }
    for r in st.res.values().filter(|r| r.kind == Kind::Pls) {
        let uses = r.body["properties"]["ipConfigurations"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|c| c["properties"]["subnet"]["id"].as_str().is_some_and(|s| ids_eq(s, id)));
        if uses {
            return Err(bad(
                POLICIES_ON_PLS_SUBNET,
                format!(
                    "Private link service network policies cannot be enabled on subnet {id}: private link service {} has IP configurations in it.",
                    r.body["id"].as_str().unwrap_or_default()
                ),
            ));
        }
    }
    Ok(())
}

/// A dynamic address of subnet `sn` (as the load balancer's frontends get theirs).
fn allocate(st: &mut State, sn: &str) -> String {
    let n = st.next_private.entry(sn.to_ascii_lowercase()).or_insert(4);
    *n += 1;
    let n = *n;
    let prefix = st
        .res
        .get(&sn.to_ascii_lowercase())
        .and_then(|r| r.body["properties"]["addressPrefix"].as_str())
        .unwrap_or("10.240.0.0/16")
        .to_string();
    let octs: Vec<&str> = prefix.split(['.', '/']).collect();
    format!(
        "{}.{}.{}.{}",
        octs.first().unwrap_or(&"10"),
        octs.get(1).unwrap_or(&"240"),
        200 + (n >> 8).min(50),
        n & 255
    )
}

/// Checks a private link service `PUT` as ARM does; fills in IDs, dynamic NAT addresses and
/// the read-only parts.
pub(super) fn validate(
    st: &mut State,
    id: &str,
    body: &mut Value,
    current: Option<&Value>,
    location: &str,
) -> Res<()> {
    let fes = frontend_refs(body);
    if fes.is_empty() {
        return Err(bad(
            "InvalidRequestFormat",
            format!(
                "Private link service {id} must reference at least one load balancer frontend IP configuration (loadBalancerFrontendIpConfigurations)."
            ),
        ));
    }
    for fe in &fes {
        let lb_id = fe
            .to_ascii_lowercase()
            .find("/frontendipconfigurations/")
            .map(|i| fe[..i].to_string())
            .unwrap_or_default();
        let Some(lb) = st.res.get(&lb_id.to_ascii_lowercase()).filter(|r| r.kind == Kind::Lb)
        else {
            return Err(invalid_ref(id, "loadBalancerFrontendIpConfigurations", fe));
        };
        let Some(config) = lb.body["properties"]["frontendIPConfigurations"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["id"].as_str().is_some_and(|c| ids_eq(c, fe)))
        else {
            return Err(invalid_ref(id, "loadBalancerFrontendIpConfigurations", fe));
        };
        if !config["properties"]["publicIPAddress"].is_null()
            || config["properties"]["subnet"]["id"].as_str().is_none()
        {
            return Err(bad(
                FRONTEND_NOT_INTERNAL,
                format!(
                    "Private link service {id} cannot use frontend IP configuration {fe}: only an internal (private) frontend IP configuration of a Standard load balancer can be used."
                ),
            ));
        }
        if let Some(other) = user_of_frontend(st, fe, id) {
            return Err(bad(
                FRONTEND_TAKEN,
                format!(
                    "Frontend IP configuration {fe} is already used by private link service {other}."
                ),
            ));
        }
    }
    let count = body["properties"]["ipConfigurations"].as_array().map_or(0, Vec::len);
    if !(1..=8).contains(&count) {
        return Err(bad(
            "InvalidRequestFormat",
            format!("Private link service {id} must have 1 to 8 ipConfigurations; it has {count}."),
        ));
    }
    let primaries = body["properties"]["ipConfigurations"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["properties"]["primary"] == json!(true))
        .count();
    if primaries != 1 {
        return Err(bad(
            "InvalidRequestFormat",
            format!(
                "Private link service {id} must have exactly one primary IP configuration; it has {primaries}."
            ),
        ));
    }
    // The NAT addresses it had keep being its own.
    let had: Vec<(String, String)> = current
        .map(|c| {
            c["properties"]["ipConfigurations"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|c| {
                    Some((
                        c["name"].as_str()?.to_ascii_lowercase(),
                        c["properties"]["privateIPAddress"].as_str()?.to_string(),
                    ))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut seen = std::collections::BTreeSet::new();
    let mut checked: Vec<(String, String, String)> = Vec::new();
    for c in children_mut(body, "ipConfigurations") {
        let n = name_child(c, id, "ipConfigurations", &mut seen)?;
        let cfg_id = format!("{id}/ipConfigurations/{n}");
        let p = &mut c["properties"];
        if p["privateIPAddressVersion"].as_str().is_some_and(|v| v.eq_ignore_ascii_case("IPv6")) {
            return Err(bad(
                "PrivateLinkServiceIpConfigurationIPv6NotSupported",
                format!(
                    "IP configuration {cfg_id}: private link service NAT IP configurations are IPv4 only."
                ),
            ));
        }
        let Some(sn) = p["subnet"]["id"].as_str().map(str::to_string) else {
            return Err(invalid_ref(id, "ipConfigurations.subnet", "(none)"));
        };
        let Some(subnet) = st.res.get(&sn.to_ascii_lowercase()).filter(|r| r.kind == Kind::Subnet)
        else {
            return Err(invalid_ref(id, "ipConfigurations.subnet", &sn));
        };
        if subnet.body["properties"]["privateLinkServiceNetworkPolicies"]
            .as_str()
            .is_none_or(|v| !v.eq_ignore_ascii_case("Disabled"))
        {
            return Err(bad(
                SUBNET_POLICIES_ENABLED,
                format!(
                    "Private link service {id} cannot be created in a subnet {sn} since it has private link service network policies enabled."
                ),
            ));
        }
        let is_static = p["privateIPAllocationMethod"]
            .as_str()
            .is_some_and(|m| m.eq_ignore_ascii_case("Static"));
        match p["privateIPAddress"].as_str().filter(|a| !a.is_empty()).map(str::to_string) {
            Some(addr) if is_static => {
                let own = had
                    .iter()
                    .any(|(hn, ha)| *hn == n.to_ascii_lowercase() && super::same_ip(ha, &addr));
                if !own {
                    checked.push((cfg_id.clone(), sn.clone(), addr));
                }
            }
            _ => {
                // Dynamic: the address it had, else a new one.
                let keep = had
                    .iter()
                    .find(|(hn, _)| *hn == n.to_ascii_lowercase())
                    .map(|(_, a)| a.clone());
                let addr = match keep {
                    Some(a) => a,
                    None => allocate(st, &sn),
                };
                p["privateIPAddress"] = json!(addr);
                p["privateIPAllocationMethod"] = json!("Dynamic");
            }
        }
        p["privateIPAddressVersion"] = json!("IPv4");
        p["provisioningState"] = json!("Succeeded");
    }
    for (cfg_id, sn, addr) in &checked {
        super::check_private_ip(st, id, cfg_id, sn, addr)?;
    }
    // Read-only parts, computed by ARM.
    let name = id.rsplit('/').next().unwrap_or_default().to_string();
    let props = super::props_mut(body);
    props.insert(
        "alias".into(),
        json!(format!(
            "{name}.{}.{}.azure.privatelinkservice",
            uuid(id),
            super::norm_location(location)
        )),
    );
    props.insert(
        "networkInterfaces".into(),
        json!([{ "id": format!("{}/networkInterfaces/{name}.nic.{}", resource_group_prefix(id), uuid(&format!("{id}#nic"))) }]),
    );
    let connections = current
        .and_then(|c| c["properties"].get("privateEndpointConnections").cloned())
        .unwrap_or_else(|| json!([]));
    props.insert("privateEndpointConnections".into(), connections);
    props.remove("provisioningState");
    Ok(())
}

/// `/subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Network` of a resource ID.
fn resource_group_prefix(id: &str) -> String {
    let parts: Vec<&str> = id.split('/').collect();
    parts.get(..7).map(|p| p.join("/")).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn network_interface_ids_sit_in_the_services_resource_group() {
        let id =
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/privateLinkServices/p";
        assert_eq!(
            resource_group_prefix(id),
            "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network"
        );
    }
}
