//! Every name and ID the load balancer uses, as upstream builds them
//! (`azure_standard.go`, `azure_loadbalancer.go`, `azure_utils.go`): the shared load balancers
//! `<loadBalancerName or cluster>` and `…-internal`, frontends `a<uid>` (`-<subnet>`,
//! `-IPv6`), rules and probes `<prefix>-<PROTO>-<port>`, public IPs `<cluster>-a<uid>`,
//! backend pools `<cluster>` / `<cluster>-IPv6`, and the shared probe.

use crate::config::Config;

use super::annotations::{Family, ServiceConfig};

/// Internal load balancers' suffix.
pub const INTERNAL_SUFFIX: &str = "-internal";
/// The shared kube-proxy probe (`clusterServiceLoadBalancerHealthProbeMode: shared`).
pub const SHARED_PROBE: &str = "cluster-service-shared-health-probe";
/// The IPv6 suffix of dual-stack resources.
pub const IPV6_SUFFIX: &str = "-IPv6";
/// ARM type of load balancers.
pub const LB_TYPE: &str = "Microsoft.Network/loadBalancers";
/// ARM type of public IPs.
pub const PIP_TYPE: &str = "Microsoft.Network/publicIPAddresses";
/// Public IP tag: the Services using it (`ns/name[,ns/name…]`).
pub const SERVICE_TAG: &str = "k8s-azure-service";
/// Upstream's legacy service tag.
pub const LEGACY_SERVICE_TAG: &str = "service";
/// Public IP tag: the cluster that created it.
pub const CLUSTER_TAG: &str = "k8s-azure-cluster-name";
/// Upstream's legacy cluster tag.
pub const LEGACY_CLUSTER_TAG: &str = "kubernetes-cluster-name";
/// Public IP tag: the Service owning its DNS label.
pub const DNS_SERVICE_TAG: &str = "k8s-azure-dns-label-service";
/// Upstream's legacy DNS tag.
pub const LEGACY_DNS_SERVICE_TAG: &str = "kubernetes-dns-label-service";

const NAME_MAX: usize = 80;
const FAMILY_SUFFIX_LEN: usize = 5;

/// The shared load balancer's base name: `loadBalancerName`, else the cluster name.
pub fn base_name(config: &Config, cluster: &str) -> String {
    config
        .load_balancer_name
        .clone()
        .filter(|n| !n.is_empty())
        .unwrap_or_else(|| cluster.to_string())
}

/// The load balancer of a public (`<base>`) or internal (`<base>-internal`) Service.
pub fn lb_name(config: &Config, cluster: &str, internal: bool) -> String {
    let base = base_name(config, cluster);
    if internal { format!("{base}{INTERNAL_SUFFIX}") } else { base }
}

/// `name`, or `name-IPv6` for the IPv6 resource of a dual-stack Service.
pub fn by_family(name: String, dual_stack: bool, family: Family) -> String {
    if dual_stack && family == Family::V6 { format!("{name}{IPV6_SUFFIX}") } else { name }
}

fn cut(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

/// The frontend IP configuration of the Service for `family`: `a<uid>`, with
/// `-<subnet>` for the internal-subnet annotation (cut to 75 characters, a trailing
/// non-letter replaced by `_`), and `-IPv6` for dual-stack IPv6.
pub fn frontend_name(svc: &ServiceConfig, family: Family) -> String {
    let base = match &svc.internal_subnet {
        Some(subnet) => {
            let full = format!("{}-{subnet}", svc.prefix);
            let mut name = cut(&full, NAME_MAX - FAMILY_SUFFIX_LEN).to_string();
            if name.chars().count() < full.chars().count()
                && let Some(last) = name.pop()
            {
                name.push(if last.is_alphabetic() || last == '_' { last } else { '_' });
            }
            name
        }
        None => svc.prefix.clone(),
    };
    by_family(base, svc.dual_stack(), family)
}

/// A load-balancing rule (and its probe): `<prefix>-<PROTO>-<port>`, or
/// `<prefix>-<subnet>-<PROTO>-<port>` with the internal-subnet annotation (the subnet cut so
/// the name stays within 75 characters), `-IPv6` for dual-stack IPv6.
pub fn rule_name(svc: &ServiceConfig, proto: &str, port: i32, family: Family) -> String {
    let plain = format!("{}-{proto}-{port}", svc.prefix);
    let name = match &svc.internal_subnet {
        None => plain,
        Some(subnet) => {
            let max = NAME_MAX - FAMILY_SUFFIX_LEN;
            let room = max.saturating_sub(plain.len() + 1);
            format!("{}-{}-{proto}-{port}", svc.prefix, cut(subnet, room))
        }
    };
    by_family(name, svc.dual_stack(), family)
}

/// Whether a rule or probe named `name` belongs to the Service (upstream's
/// `serviceOwnsRule`: the prefix, case-insensitively).
pub fn owns(svc: &ServiceConfig, name: &str) -> bool {
    name.len() >= svc.prefix.len()
        && name.as_bytes()[..svc.prefix.len()].eq_ignore_ascii_case(svc.prefix.as_bytes())
}

/// The public IP created for the Service: `<cluster>-a<uid>` (`-<prefix name>` when
/// allocated from a prefix), cut to 75 characters, `-IPv6` for dual-stack IPv6.
pub fn pip_name(cluster: &str, svc: &ServiceConfig, family: Family) -> String {
    let mut name = format!("{cluster}-{}", svc.prefix);
    if let Some(prefix) = svc.pip_prefix_id.get(&family)
        && let Some(last) = prefix.rsplit('/').next().filter(|s| !s.is_empty())
    {
        name = format!("{name}-{last}");
    }
    let name = cut(&name, NAME_MAX - FAMILY_SUFFIX_LEN).to_string();
    by_family(name, svc.dual_stack(), family)
}

/// The backend pool every Service shares: `<cluster>`, `<cluster>-IPv6` for IPv6 (also in
/// single-stack IPv6 clusters).
pub fn backend_pool_name(cluster: &str, family: Family) -> String {
    match family {
        Family::V4 => cluster.to_string(),
        Family::V6 => format!("{cluster}{IPV6_SUFFIX}"),
    }
}

/// With several standard load balancers, an `externalTrafficPolicy: Local` Service's own
/// backend pool: `<namespace>-<name>` in lower case, `-ipv6` appended for IPv6 (upstream's
/// names, so its pools are found after the swap). `key` is `<namespace>/<name>`.
pub fn local_pool_name(key: &str, family: Family) -> String {
    let base = key.replace('/', "-").to_ascii_lowercase();
    match family {
        Family::V4 => base,
        Family::V6 => format!("{base}-ipv6"),
    }
}

/// Whether the pool `name` is the Service `key`'s own (see [`local_pool_name`]).
pub fn is_local_pool_of(key: &str, name: &str) -> bool {
    [Family::V4, Family::V6].iter().any(|f| name.eq_ignore_ascii_case(&local_pool_name(key, *f)))
}

/// `<lb id>/<collection>/<name>`.
pub fn child_id(lb_id: &str, collection: &str, name: &str) -> String {
    format!("{lb_id}/{collection}/{name}")
}

/// The last segment of an ARM ID.
pub fn last_segment(id: &str) -> &str {
    id.rsplit('/').next().unwrap_or(id)
}

/// The resource group in an ARM ID (`/subscriptions/s/resourceGroups/<rg>/…`).
pub fn resource_group_of(id: &str) -> Option<&str> {
    let mut parts = id.split('/');
    while let Some(p) = parts.next() {
        if p.eq_ignore_ascii_case("resourceGroups") {
            return parts.next();
        }
    }
    None
}

/// The Services in a public IP's service tag.
pub fn tag_services(tag: &str) -> Vec<String> {
    tag.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

#[cfg(test)]
mod tests {
    use super::super::annotations::{self, INTERNAL, INTERNAL_SUBNET, parse};
    use super::*;

    fn cfg(annotations: &[(&str, &str)], families: &[&str]) -> ServiceConfig {
        let mut s = annotations::tests::svc(annotations, &[(80, "TCP")]);
        if !families.is_empty() {
            s.spec.as_mut().unwrap().ip_families =
                Some(families.iter().map(|f| f.to_string()).collect());
        }
        parse(&s).unwrap()
    }

    const P: &str = "a6f7f1b2c123456789abcdef01234567";

    #[test]
    fn load_balancer_names() {
        let mut c = Config::default();
        assert_eq!(lb_name(&c, "kubernetes", false), "kubernetes");
        assert_eq!(lb_name(&c, "kubernetes", true), "kubernetes-internal");
        c.load_balancer_name = Some("shared".into());
        assert_eq!(lb_name(&c, "kubernetes", true), "shared-internal");
    }

    #[test]
    fn single_stack_names_have_no_family_suffix() {
        for fam in [&["IPv4"][..], &["IPv6"][..]] {
            let c = cfg(&[], fam);
            let f = c.families[0];
            assert_eq!(frontend_name(&c, f), P);
            assert_eq!(rule_name(&c, "TCP", 80, f), format!("{P}-TCP-80"));
            assert_eq!(pip_name("kubernetes", &c, f), format!("kubernetes-{P}"));
        }
        assert_eq!(backend_pool_name("kubernetes", Family::V6), "kubernetes-IPv6");
    }

    #[test]
    fn dual_stack_ipv6_resources_get_the_suffix() {
        let c = cfg(&[], &["IPv4", "IPv6"]);
        assert_eq!(frontend_name(&c, Family::V4), P);
        assert_eq!(frontend_name(&c, Family::V6), format!("{P}-IPv6"));
        assert_eq!(rule_name(&c, "UDP", 53, Family::V6), format!("{P}-UDP-53-IPv6"));
        assert_eq!(pip_name("k", &c, Family::V6), format!("k-{P}-IPv6"));
    }

    #[test]
    fn internal_subnet_names() {
        let c = cfg(&[(INTERNAL, "true"), (INTERNAL_SUBNET, "apps")], &[]);
        assert_eq!(frontend_name(&c, Family::V4), format!("{P}-apps"));
        assert_eq!(rule_name(&c, "TCP", 443, Family::V4), format!("{P}-apps-TCP-443"));
        let long = "s".repeat(70) + "-x";
        let c = cfg(&[(INTERNAL, "true"), (INTERNAL_SUBNET, long.as_str())], &[]);
        let fe = frontend_name(&c, Family::V4);
        assert_eq!(fe.len(), 75);
        let rule = rule_name(&c, "TCP", 443, Family::V4);
        assert!(rule.len() <= 75 && rule.ends_with("-TCP-443"), "{rule}");
        // The subnet annotation only counts for internal Services.
        let c = cfg(&[(INTERNAL_SUBNET, "apps")], &[]);
        assert_eq!(frontend_name(&c, Family::V4), P);
    }

    #[test]
    fn a_trailing_dash_after_cutting_becomes_underscore() {
        // 32 + 1 + 41 = 74 characters, then "-" at position 75.
        let subnet = "s".repeat(41) + "-tail";
        let c = cfg(&[(INTERNAL, "true"), (INTERNAL_SUBNET, subnet.as_str())], &[]);
        let fe = frontend_name(&c, Family::V4);
        assert_eq!(fe.len(), 75);
        assert!(fe.ends_with("s_"), "{fe}");
    }

    #[test]
    fn ownership_is_by_prefix_case_insensitively() {
        let c = cfg(&[], &[]);
        assert!(owns(&c, &format!("{P}-TCP-80")));
        assert!(owns(&c, &format!("{}-TCP-80", P.to_uppercase())));
        assert!(!owns(&c, "a0000-TCP-80"));
        assert!(!owns(&c, SHARED_PROBE));
    }

    #[test]
    fn ids() {
        let id =
            "/subscriptions/s/resourceGroups/rg-a/providers/Microsoft.Network/publicIPAddresses/x";
        assert_eq!(resource_group_of(id), Some("rg-a"));
        assert_eq!(last_segment(id), "x");
        assert_eq!(tag_services("a/b, c/d,"), vec!["a/b", "c/d"]);
    }
}
