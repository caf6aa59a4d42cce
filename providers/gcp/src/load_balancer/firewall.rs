//! The load balancers' firewalls: the desired object, upstream's drift checks (which fields a
//! difference in triggers a `PATCH`), create-or-patch, delete. Firewalls live in the network
//! project; on a Shared VPC (network project ≠ project) a 403 is logged with the command an
//! administrator can run, and the sync goes on (upstream raises an event and does the same).

use std::collections::BTreeSet;

use google_cloud_compute_v1::model::Firewall;
use google_cloud_compute_v1::model::firewall::Allowed;

use super::LbError;
use super::api::Api;
use crate::client::GceError;

/// Google's health checkers and L3/L4 load balancer proxies (upstream's default
/// `--cloud-provider-gce-lb-src-cidrs`).
pub const L4_HEALTH_CHECK_RANGES: [&str; 4] =
    ["130.211.0.0/22", "209.85.152.0/22", "209.85.204.0/22", "35.191.0.0/16"];

/// Upstream's allow-rule priority.
pub const PRIORITY: i32 = 1000;

/// A firewall admitting `protocol` `ports` from `sources` to the instances tagged `tags`
/// (on `destination` when not empty).
#[allow(clippy::too_many_arguments)]
pub(crate) fn object(
    api: &Api<'_>,
    name: &str,
    description: &str,
    destination: &str,
    sources: &[String],
    protocol: &str,
    ports: &[String],
    tags: &[String],
    priority: Option<i32>,
) -> Firewall {
    let mut allowed = Allowed::default();
    allowed.ip_protocol = Some(protocol.to_ascii_lowercase());
    allowed.ports = ports.to_vec();
    let mut fw = Firewall::default();
    fw.name = Some(name.to_string());
    fw.description = Some(description.to_string());
    fw.network = Some(api.scope.network_url.clone());
    fw.source_ranges = sources.to_vec();
    fw.target_tags = tags.to_vec();
    fw.allowed = vec![allowed];
    fw.priority = priority;
    if !destination.is_empty() {
        fw.destination_ranges = vec![destination.to_string()];
    }
    fw
}

fn set(v: &[String]) -> BTreeSet<&str> {
    v.iter().map(String::as_str).collect()
}

/// CIDRs normalised (`10.1.2.3/8` → `10.0.0.0/8`; a bare IP is a /32), as a set.
fn cidr_set(v: &[String]) -> BTreeSet<String> {
    v.iter()
        .map(|s| match s.parse::<ipnet::IpNet>() {
            Ok(n) => n.trunc().to_string(),
            Err(_) => match s.parse::<std::net::IpAddr>() {
                Ok(ip) => ipnet::IpNet::from(ip).to_string(),
                Err(_) => s.clone(),
            },
        })
        .collect()
}

fn one_allowed(fw: &Firewall) -> Option<(&str, &[String])> {
    match fw.allowed.as_slice() {
        [a] => Some((a.ip_protocol.as_deref().unwrap_or_default(), a.ports.as_slice())),
        _ => None,
    }
}

/// The external traffic firewall is up to date (upstream's `firewallNeedsUpdate`:
/// description, one TCP/UDP rule with the ports (enumerated or folded), sources, destination,
/// priority). Also compared, unlike upstream: the protocol and the target tags (a node pool
/// with other tags, or a Service switching TCP/UDP, updates the firewall).
pub(crate) fn external_traffic_equal(have: &Fw, want: &Fw, enumerated: &[String]) -> bool {
    let (Some((hp, hports)), Some((wp, wports))) = (one_allowed(have), one_allowed(want)) else {
        return false;
    };
    have.description == want.description
        && (hp == "tcp" || hp == "udp")
        && hp == wp
        && (set(hports) == set(enumerated) || set(hports) == set(wports))
        && cidr_set(&have.source_ranges) == cidr_set(&want.source_ranges)
        && have.destination_ranges == want.destination_ranges
        && have.priority.unwrap_or(PRIORITY) == want.priority.unwrap_or(PRIORITY)
        && set(&have.target_tags) == set(&want.target_tags)
}

/// An external health-check firewall is up to date (upstream's check in
/// `ensureHTTPHealthCheckFirewall`: description, one TCP rule on the port, sources,
/// priority; the destination is not compared, so the shared one keeps the first Service's
/// address, as upstream). Also compared, unlike upstream: the target tags.
pub(crate) fn health_check_equal(have: &Fw, want: &Fw) -> bool {
    let (Some((hp, hports)), Some((wp, wports))) = (one_allowed(have), one_allowed(want)) else {
        return false;
    };
    have.description == want.description
        && hp == wp
        && set(hports) == set(wports)
        && cidr_set(&have.source_ranges) == cidr_set(&want.source_ranges)
        && have.priority.unwrap_or(PRIORITY) == want.priority.unwrap_or(PRIORITY)
        && set(&have.target_tags) == set(&want.target_tags)
}

/// An internal load balancer's firewall is up to date (upstream's `firewallRuleEqual`).
pub(crate) fn internal_equal(have: &Fw, want: &Fw) -> bool {
    let (Some((hp, hports)), Some((wp, wports))) = (one_allowed(have), one_allowed(want)) else {
        return false;
    };
    have.description == want.description
        && hp == wp
        && set(hports) == set(wports)
        && cidr_set(&have.source_ranges) == cidr_set(&want.source_ranges)
        && set(&have.destination_ranges) == set(&want.destination_ranges)
        && set(&have.target_tags) == set(&want.target_tags)
}

type Fw = Firewall;

/// A 403 on a Shared VPC, where firewalls belong to the host project's administrators.
fn forbidden_on_xpn(api: &Api<'_>, e: &GceError) -> bool {
    refused_permission(e) && api.scope.network_project != api.scope.project
}

/// A 403 that refuses the permission: not Compute's throttle, which is a 403 too
/// (`rateLimitExceeded`, `userRateLimitExceeded`) and reaches here once it outlasted the
/// call's deadline; that is an error to retry, never "an administrator must do it".
fn refused_permission(e: &GceError) -> bool {
    matches!(e, GceError::Api { status: 403, .. }) && !e.is_throttled()
}

/// Creates `want` when absent, patches it when `equal` says it drifted. A 409 on create
/// (created meanwhile) is fine, as upstream.
pub(crate) async fn ensure(
    api: &Api<'_>,
    want: &Firewall,
    equal: impl Fn(&Firewall, &Firewall) -> bool,
) -> Result<(), LbError> {
    let name = want.name.clone().unwrap_or_default();
    match api.firewall(&name).await? {
        None => match api.insert_firewall(want).await {
            Ok(()) => {
                tracing::info!(firewall = %name, "GCE: created firewall");
                Ok(())
            }
            Err(e) if e.is_already_exists() => Ok(()),
            Err(e) if forbidden_on_xpn(api, &e) => {
                tracing::warn!(firewall = %name, network_project = %api.scope.network_project, error = %e,
                    "GCE: no permission to create the firewall in the network project; an administrator must create it");
                api.manual_change(gcloud_create(want, &api.scope.network_project));
                Ok(())
            }
            Err(e) => Err(e.into()),
        },
        Some(have) if equal(&have, want) => Ok(()),
        Some(_) => match api.patch_firewall(want).await {
            Ok(()) => {
                tracing::info!(firewall = %name, "GCE: updated firewall");
                Ok(())
            }
            Err(e) if forbidden_on_xpn(api, &e) => {
                tracing::warn!(firewall = %name, network_project = %api.scope.network_project, error = %e,
                    "GCE: no permission to update the firewall in the network project; an administrator must update it");
                api.manual_change(gcloud_update(want, &api.scope.network_project));
                Ok(())
            }
            Err(e) => Err(e.into()),
        },
    }
}

/// Deletes a firewall; gone already is fine; forbidden on a Shared VPC is logged.
pub(crate) async fn delete(api: &Api<'_>, name: &str) -> Result<(), LbError> {
    match api.delete_firewall(name).await {
        Ok(true) => {
            tracing::info!(firewall = %name, "GCE: deleted firewall");
            Ok(())
        }
        Ok(false) => Ok(()),
        Err(e) if forbidden_on_xpn(api, &e) => {
            tracing::warn!(firewall = %name, error = %e,
                "GCE: no permission to delete the firewall in the network project; an administrator must delete it");
            api.manual_change(gcloud_delete(name, &api.scope.network_project));
            Ok(())
        }
        Err(e) => Err(e.into()),
    }
}

/// The `gcloud` command creating `fw` in `project` (upstream's `FirewallToGCloudCreateCmd`).
pub fn gcloud_create(fw: &Firewall, project: &str) -> String {
    let network = fw.network.as_deref().map(crate::client::last_segment).unwrap_or_default();
    format!(
        "gcloud compute firewall-rules create {} --network {network} {}",
        fw.name.as_deref().unwrap_or_default(),
        gcloud_args(fw, project)
    )
}

/// The `gcloud` command updating `fw` (upstream's `FirewallToGCloudUpdateCmd`).
pub fn gcloud_update(fw: &Firewall, project: &str) -> String {
    format!(
        "gcloud compute firewall-rules update {} {}",
        fw.name.as_deref().unwrap_or_default(),
        gcloud_args(fw, project)
    )
}

/// The `gcloud` command deleting firewall `name` (upstream's `FirewallToGCloudDeleteCmd`).
pub fn gcloud_delete(name: &str, project: &str) -> String {
    format!("gcloud compute firewall-rules delete {name} --project {project}")
}

/// The rule's flags as upstream's `firewallToGcloudArgs` writes them: the description
/// quoted, the allowed `proto:port` specs, sources, destinations and target tags sorted, the
/// priority when set, the project last.
fn gcloud_args(fw: &Firewall, project: &str) -> String {
    let mut args =
        vec![format!("--description {:?}", fw.description.as_deref().unwrap_or_default())];
    let mut allow: Vec<String> = fw
        .allowed
        .iter()
        .flat_map(|a| {
            let proto = a.ip_protocol.clone().unwrap_or_default();
            if a.ports.is_empty() {
                vec![proto]
            } else {
                a.ports.iter().map(|p| format!("{proto}:{p}")).collect()
            }
        })
        .collect();
    if !allow.is_empty() {
        allow.sort();
        args.push(format!("--allow {}", allow.join(",")));
    }
    let sorted = |v: &[String]| {
        let mut v = v.to_vec();
        v.sort();
        v.join(",")
    };
    if !fw.source_ranges.is_empty() {
        args.push(format!("--source-ranges {}", sorted(&fw.source_ranges)));
    }
    if !fw.destination_ranges.is_empty() {
        args.push(format!("--destination-ranges {}", sorted(&fw.destination_ranges)));
    }
    if !fw.target_tags.is_empty() {
        args.push(format!("--target-tags {}", sorted(&fw.target_tags)));
    }
    if let Some(p) = fw.priority.filter(|p| *p != 0) {
        args.push(format!("--priority {p}"));
    }
    args.push(format!("--project {project}"));
    args.join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_throttle_is_not_a_refused_permission() {
        let api = |status: u16, reason: &str| GceError::Api {
            operation: "compute.firewalls.insert",
            status,
            reason: reason.into(),
            message: "m".into(),
        };
        assert!(refused_permission(&api(403, "forbidden")));
        assert!(refused_permission(&api(403, "")));
        assert!(!refused_permission(&api(403, "rateLimitExceeded")));
        assert!(!refused_permission(&api(403, "userRateLimitExceeded")));
        assert!(!refused_permission(&api(429, "rateLimitExceeded")));
        assert!(!refused_permission(&api(404, "notFound")));
    }

    #[test]
    fn gcloud_commands_are_upstream_s() {
        let mut a = Allowed::default();
        a.ip_protocol = Some("tcp".into());
        a.ports = vec!["443".into(), "80".into()];
        let mut f = Firewall::default();
        f.name = Some("k8s-fw-a1".into());
        f.description = Some(r#"{"kubernetes.io/service-name":"default/web"}"#.into());
        f.network = Some(
            "https://www.googleapis.com/compute/v1/projects/host/global/networks/shared".into(),
        );
        f.allowed = vec![a];
        f.source_ranges = vec!["10.0.0.0/8".into(), "0.0.0.0/0".into()];
        f.destination_ranges = vec!["1.2.3.4".into()];
        f.target_tags = vec!["k8s-node".into()];
        f.priority = Some(1000);
        assert_eq!(
            gcloud_create(&f, "host"),
            r#"gcloud compute firewall-rules create k8s-fw-a1 --network shared --description "{\"kubernetes.io/service-name\":\"default/web\"}" --allow tcp:443,tcp:80 --source-ranges 0.0.0.0/0,10.0.0.0/8 --destination-ranges 1.2.3.4 --target-tags k8s-node --priority 1000 --project host"#
        );
        assert!(
            gcloud_update(&f, "host")
                .starts_with("gcloud compute firewall-rules update k8s-fw-a1 --description ")
        );
        assert_eq!(
            gcloud_delete("k8s-fw-a1", "host"),
            "gcloud compute firewall-rules delete k8s-fw-a1 --project host"
        );
    }

    fn fw(
        desc: &str,
        proto: &str,
        ports: &[&str],
        src: &[&str],
        dst: &[&str],
        tags: &[&str],
    ) -> Firewall {
        let s = |v: &[&str]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let mut a = Allowed::default();
        a.ip_protocol = Some(proto.into());
        a.ports = s(ports);
        let mut f = Firewall::default();
        f.description = Some(desc.into());
        f.allowed = vec![a];
        f.source_ranges = s(src);
        f.destination_ranges = s(dst);
        f.target_tags = s(tags);
        f.priority = Some(1000);
        f
    }

    #[test]
    fn external_drift_rules() {
        let want = fw("d", "tcp", &["80-81"], &["0.0.0.0/0"], &["1.2.3.4"], &["k8s"]);
        let enumerated = vec!["80".to_string(), "81".to_string()];
        assert!(external_traffic_equal(&want, &want, &enumerated));
        // Enumerated ports (an older upstream's rule) are as good as ranges.
        let old = fw("d", "tcp", &["81", "80"], &["0.0.0.0/0"], &["1.2.3.4"], &["k8s"]);
        assert!(external_traffic_equal(&old, &want, &enumerated));
        // Unnormalised source ranges compare as networks.
        let loose = fw("d", "tcp", &["80-81"], &["0.0.0.1/0"], &["1.2.3.4"], &["k8s"]);
        assert!(external_traffic_equal(&loose, &want, &enumerated));
        for drift in [
            fw("x", "tcp", &["80-81"], &["0.0.0.0/0"], &["1.2.3.4"], &["k8s"]),
            fw("d", "udp", &["80-81"], &["0.0.0.0/0"], &["1.2.3.4"], &["k8s"]),
            fw("d", "tcp", &["80"], &["0.0.0.0/0"], &["1.2.3.4"], &["k8s"]),
            fw("d", "tcp", &["80-81"], &["10.0.0.0/8"], &["1.2.3.4"], &["k8s"]),
            fw("d", "tcp", &["80-81"], &["0.0.0.0/0"], &["1.2.3.5"], &["k8s"]),
            fw("d", "tcp", &["80-81"], &["0.0.0.0/0"], &["1.2.3.4"], &["other"]),
        ] {
            assert!(!external_traffic_equal(&drift, &want, &enumerated), "{drift:?}");
        }
    }

    #[test]
    fn health_check_firewalls_ignore_the_destination() {
        let want = fw("d", "tcp", &["10256"], &["35.191.0.0/16"], &["1.2.3.4"], &["k8s"]);
        let other_ip = fw("d", "tcp", &["10256"], &["35.191.0.0/16"], &["9.9.9.9"], &["k8s"]);
        assert!(health_check_equal(&other_ip, &want));
        let other_port = fw("d", "tcp", &["31000"], &["35.191.0.0/16"], &["1.2.3.4"], &["k8s"]);
        assert!(!health_check_equal(&other_port, &want));
    }

    #[test]
    fn internal_compares_destinations_and_tags() {
        let want = fw("d", "tcp", &["80"], &["0.0.0.0/0"], &["10.0.0.5"], &["k8s"]);
        assert!(internal_equal(&want, &want));
        assert!(!internal_equal(
            &fw("d", "tcp", &["80"], &["0.0.0.0/0"], &["10.0.0.6"], &["k8s"]),
            &want
        ));
        assert!(!internal_equal(
            &fw("d", "tcp", &["80"], &["0.0.0.0/0"], &["10.0.0.5"], &["x"]),
            &want
        ));
    }
}
