//! The Service fields and annotations upstream reads (`gce_annotations.go`,
//! `gce_loadbalancer*.go`), their documentation table, and [`ServiceConfig`]: everything a
//! Service asks of its load balancer, checked before any Compute call.
//!
//! Differences from upstream, on purpose: a value upstream silently reads as "not set" (a
//! load-balancer type other than `Internal`/`internal`, a boolean other than `"true"`, an
//! unparsable subnet name or `loadBalancerIP`) is a [`ProviderError::Invalid`] naming the
//! annotation (or field) and the value. `External`/`external` and the empty string are
//! accepted as "external" (upstream's reading of them).

use std::collections::BTreeSet;
use std::net::IpAddr;

use ccm_core::cloud::ProviderError;
use ccm_core::reference::{KeyDoc, has_key};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::Service;

use super::naming;

/// The annotation keys, and the other well-known strings upstream matches.
pub mod keys {
    /// `Internal`: an internal load balancer.
    pub const LOAD_BALANCER_TYPE: &str = "networking.gke.io/load-balancer-type";
    /// The deprecated spelling of [`LOAD_BALANCER_TYPE`] (read when that is absent).
    pub const LOAD_BALANCER_TYPE_DEPRECATED: &str = "cloud.google.com/load-balancer-type";
    /// Internal: reachable from every region.
    pub const ALLOW_GLOBAL_ACCESS: &str =
        "networking.gke.io/internal-load-balancer-allow-global-access";
    /// Internal: the subnetwork the address comes from.
    pub const SUBNET: &str = "networking.gke.io/internal-load-balancer-subnet";
    /// Internal: share one backend service among Cluster-policy Services.
    pub const BACKEND_SHARE: &str = "alpha.cloud.google.com/load-balancer-backend-share";
    /// The misnamed earlier spelling of [`BACKEND_SHARE`].
    pub const BACKEND_SHARE_DEPRECATED: &str = "cloud.google.com/load-balancer-backend-share";
    /// External: `Standard` or `Premium`.
    pub const NETWORK_TIER: &str = "cloud.google.com/network-tier";
    /// `enabled`: a backend-service network load balancer, built by another controller.
    pub const L4_RBS: &str = "cloud.google.com/l4-rbs";
    /// Written by upstream with `--enable-l4-lb-annotations` (off by default): the target pool.
    pub const STATUS_TARGET_POOL: &str = "networking.gke.io/target-pool";
    /// Written by upstream with `--enable-l4-lb-annotations`: the backend service.
    pub const STATUS_BACKEND_SERVICE: &str = "networking.gke.io/backend-service";
    /// Kubernetes' source ranges annotation (when `spec.loadBalancerSourceRanges` is empty).
    pub const SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";

    /// `spec.loadBalancerClass` forcing the internal load balancer of this controller.
    pub const CLASS_INTERNAL_LEGACY: &str = "networking.gke.io/l4-regional-internal-legacy";
    /// `spec.loadBalancerClass` forcing the external load balancer of this controller.
    pub const CLASS_EXTERNAL_LEGACY: &str = "networking.gke.io/l4-regional-external-legacy";
    /// `spec.loadBalancerClass` of the backend-service network load balancer (elsewhere).
    pub const CLASS_EXTERNAL_RBS: &str = "networking.gke.io/l4-regional-external";

    /// Upstream's finalizer on external load balancers it manages (read, and removed on delete).
    pub const FINALIZER_NETLB_V1: &str = "gke.networking.io/l4-netlb-v1";
    /// The finalizers of the newer external controllers (their Services are left alone).
    pub const FINALIZER_NETLB_V2: &str = "gke.networking.io/l4-netlb-v2";
    /// See [`FINALIZER_NETLB_V2`].
    pub const FINALIZER_NETLB_V3: &str = "gke.networking.io/l4-netlb-v3";
    /// Upstream's finalizer on internal load balancers it manages.
    pub const FINALIZER_ILB_V1: &str = "gke.networking.io/l4-ilb-v1";
    /// The finalizer of the newer internal controller (its Services are left alone).
    pub const FINALIZER_ILB_V2: &str = "gke.networking.io/l4-ilb-v2";
}

use ccm_core::reference::annotation as kd;

/// Every annotation the provider reads, with its documentation: [`annotation`] reads only
/// keys listed here (checked in debug builds), and the tests feed every example back into
/// [`ServiceConfig::parse`]. `ccm-docgen` can render it as the reference.
pub const ANNOTATIONS: &[KeyDoc] = &[
    kd(
        keys::LOAD_BALANCER_TYPE,
        "`Internal` (also `internal`); `External`/`external`/empty: external",
        "Internal",
        "An internal passthrough load balancer (instance groups, backend service, internal forwarding rule) instead of the external target-pool one. `spec.loadBalancerClass: networking.gke.io/l4-regional-internal-legacy` (or `…-external-legacy`) wins over it. Other values are an error. Changing it deletes the old kind and builds the new one (new address).",
    ),
    kd(
        keys::LOAD_BALANCER_TYPE_DEPRECATED,
        "as `networking.gke.io/load-balancer-type`",
        "Internal",
        "Deprecated spelling, read when `networking.gke.io/load-balancer-type` is absent.",
    ),
    kd(
        keys::ALLOW_GLOBAL_ACCESS,
        "`true`/`false`, default `false`",
        "true",
        "Internal: clients in every region may reach the address (`allowGlobalAccess` on the forwarding rule; changing it re-creates the forwarding rule).",
    ),
    kd(
        keys::SUBNET,
        "subnetwork name in the network project and region, default `subnetwork-name`",
        "ilb-subnet",
        "Internal: the subnetwork the address is taken from. Adding, changing or removing it re-creates the forwarding rule with a new address (unless `loadBalancerIP` is set).",
    ),
    kd(
        keys::BACKEND_SHARE,
        "`true`/`false`, default `false`",
        "true",
        "Internal, `externalTrafficPolicy: Cluster` only: use the backend service `k8s-<clusterID>-internal-<protocol>-nmv1-<hash>` shared with the other Services asking for it.",
    ),
    kd(
        keys::BACKEND_SHARE_DEPRECATED,
        "as `alpha.cloud.google.com/load-balancer-backend-share`",
        "true",
        "Earlier spelling, read as well (either set to `true` shares).",
    ),
    kd(
        keys::NETWORK_TIER,
        "`Premium` (default) or `Standard`",
        "Standard",
        "External: the network tier of the address and forwarding rule. When set, an existing forwarding rule or reserved address of the other tier is deleted and re-created (new address).",
    ),
    kd(
        keys::L4_RBS,
        "`enabled`",
        "enabled",
        "External: a backend-service network load balancer built by GKE's L4 controller: this provider leaves the Service alone (implemented elsewhere), unless it already manages its target-pool load balancer. Other values are ignored, as upstream.",
    ),
    kd(
        keys::SOURCE_RANGES,
        "comma-separated CIDRs (when `spec.loadBalancerSourceRanges` is empty), default `0.0.0.0/0`",
        "10.0.0.0/8,192.168.0.0/16",
        "The sources the `k8s-fw-<lb>` firewall admits.",
    ),
    kd(
        keys::STATUS_TARGET_POOL,
        "(output) the target pool's name",
        "",
        "Written with `--enable-l4-lb-annotations` (off by default, as upstream) on an external load balancer's Service; removed from an internal one's.",
    ),
    kd(
        keys::STATUS_BACKEND_SERVICE,
        "(output) the backend service's name",
        "",
        "Written with `--enable-l4-lb-annotations` (off by default, as upstream) on an internal load balancer's Service; removed from an external one's.",
    ),
];

/// A Service annotation; `None` when absent. Only keys of [`ANNOTATIONS`] may be read.
pub fn annotation<'a>(service: &'a Service, key: &str) -> Option<&'a str> {
    debug_assert!(has_key(ANNOTATIONS, key), "annotation {key} is not in ANNOTATIONS");
    service.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

pub(crate) fn invalid(what: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::Invalid { what: what.to_string(), message: message.into() }
}

/// A boolean annotation: `true`/`false`; absent or empty → `false`.
fn bool_annotation(service: &Service, key: &str) -> Result<bool, ProviderError> {
    match annotation(service, key).map(str::trim) {
        None | Some("") => Ok(false),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(v) => Err(invalid(key, format!("{v:?} is not \"true\" or \"false\""))),
    }
}

/// Which load balancer the Service gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    /// The target-pool network load balancer (`EXTERNAL` forwarding rule).
    External,
    /// The internal passthrough load balancer (`INTERNAL` forwarding rule).
    Internal,
}

impl Scheme {
    /// Compute's `loadBalancingScheme`.
    pub fn compute(self) -> &'static str {
        match self {
            Scheme::External => "EXTERNAL",
            Scheme::Internal => "INTERNAL",
        }
    }

    /// The scheme of a forwarding rule's `loadBalancingScheme` (upstream: anything but
    /// `INTERNAL` is external).
    pub fn of_rule(scheme: Option<&str>) -> Scheme {
        match scheme {
            Some(s) if s.eq_ignore_ascii_case("INTERNAL") => Scheme::Internal,
            _ => Scheme::External,
        }
    }
}

/// The network tier of an external load balancer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NetworkTier {
    /// `PREMIUM` (the default).
    Premium,
    /// `STANDARD`.
    Standard,
}

impl NetworkTier {
    /// Compute's value.
    pub fn compute(self) -> &'static str {
        match self {
            NetworkTier::Premium => "PREMIUM",
            NetworkTier::Standard => "STANDARD",
        }
    }
}

/// What `spec.loadBalancerClass` says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Class {
    /// No class: this controller's, type from the annotations.
    None,
    /// `networking.gke.io/l4-regional-internal-legacy`.
    InternalLegacy,
    /// `networking.gke.io/l4-regional-external-legacy`.
    ExternalLegacy,
    /// Any other class: another controller's.
    Other(String),
}

/// The Service's `spec.loadBalancerClass`.
pub fn class(service: &Service) -> Class {
    match service.spec.as_ref().and_then(|s| s.load_balancer_class.as_deref()) {
        None => Class::None,
        Some(keys::CLASS_INTERNAL_LEGACY) => Class::InternalLegacy,
        Some(keys::CLASS_EXTERNAL_LEGACY) => Class::ExternalLegacy,
        Some(c) => Class::Other(c.to_string()),
    }
}

/// Whether the Service carries finalizer `key`.
pub fn has_finalizer(service: &Service, key: &str) -> bool {
    service.metadata.finalizers.iter().flatten().any(|f| f == key)
}

/// `<namespace>/<name>`.
pub fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// The scheme the Service asks for (class first, then the annotations; upstream's
/// `GetLoadBalancerAnnotationType`).
pub fn scheme(service: &Service) -> Result<Scheme, ProviderError> {
    match class(service) {
        Class::InternalLegacy => return Ok(Scheme::Internal),
        Class::ExternalLegacy => return Ok(Scheme::External),
        _ => {}
    }
    for key in [keys::LOAD_BALANCER_TYPE, keys::LOAD_BALANCER_TYPE_DEPRECATED] {
        if let Some(v) = annotation(service, key) {
            return match v {
                "Internal" | "internal" => Ok(Scheme::Internal),
                "External" | "external" | "" => Ok(Scheme::External),
                v => Err(invalid(
                    key,
                    format!("{v:?} is not a load balancer type (\"Internal\", or \"External\")"),
                )),
            };
        }
    }
    Ok(Scheme::External)
}

/// Whether the Service asks for a backend-service network load balancer (handled by GKE's
/// L4 controller; upstream's `usesL4RBS` without the forwarding-rule test).
pub fn uses_rbs(service: &Service) -> bool {
    class(service) == Class::Other(keys::CLASS_EXTERNAL_RBS.into())
        || annotation(service, keys::L4_RBS) == Some("enabled")
        || has_finalizer(service, keys::FINALIZER_NETLB_V2)
        || has_finalizer(service, keys::FINALIZER_NETLB_V3)
}

/// One Service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Port {
    /// `spec.ports[].port`.
    pub port: i32,
    /// `spec.ports[].nodePort` (0 when none).
    pub node_port: i32,
}

/// What a Service asks of its load balancer (everything upstream reads from it).
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceConfig {
    /// `<namespace>/<name>`.
    pub service: String,
    /// External or internal.
    pub scheme: Scheme,
    /// `TCP` or `UDP` (all ports share it).
    pub protocol: String,
    /// The ports, in spec order.
    pub ports: Vec<Port>,
    /// `spec.loadBalancerIP` (empty when unset).
    pub requested_ip: String,
    /// The firewall's sources, normalised and sorted.
    pub source_ranges: Vec<String>,
    /// Compute's session affinity (`NONE`, `CLIENT_IP`).
    pub affinity: &'static str,
    /// Kubernetes' session affinity as written (`None`, `ClientIP`; hashed into the shared
    /// backend service's name).
    pub k8s_affinity: String,
    /// `externalTrafficPolicy: Local`.
    pub local: bool,
    /// The per-service health check node port (Local with `healthCheckNodePort`), else `None`.
    pub health_check_node_port: Option<i32>,
    /// The network tier (external).
    pub tier: NetworkTier,
    /// The tier annotation is present (upstream deletes other-tier resources only then).
    pub tier_annotated: bool,
    /// Internal: global access.
    pub global_access: bool,
    /// Internal: the subnetwork name from the annotation.
    pub subnet: Option<String>,
    /// Internal: share the backend service (asked for, and Cluster policy).
    pub share_backend: bool,
}

/// The Service's ports use more than one protocol (upstream's `checkMixedProtocol`).
pub fn mixed_protocols(service: &Service) -> bool {
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_deref()).unwrap_or_default();
    let proto = |p: &k8s_openapi::api::core::v1::ServicePort| {
        p.protocol.clone().unwrap_or_else(|| "TCP".into())
    };
    ports.first().is_some_and(|first| ports.iter().any(|p| proto(p) != proto(first)))
}

/// Whether `s` is a valid Compute resource name (RFC 1035 label, lower case, ≤ 63).
pub fn valid_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

fn parse_cidrs(what: &str, items: &[&str]) -> Result<Vec<String>, ProviderError> {
    let mut out = BTreeSet::new();
    for i in items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let net: IpNet = i
            .parse()
            .map_err(|_| invalid(what, format!("{i:?} is not a CIDR (for example 10.0.0.0/24)")))?;
        out.insert(net.trunc().to_string());
    }
    if out.is_empty() {
        return Err(invalid(what, "no CIDR given"));
    }
    Ok(out.into_iter().collect())
}

impl ServiceConfig {
    /// Reads and checks the Service. No cloud call.
    pub fn parse(service: &Service) -> Result<ServiceConfig, ProviderError> {
        Self::parse_with(service, false)
    }

    /// [`Self::parse`] for a node update of a Service whose ports mix protocols (upstream
    /// keeps updating those): the first port's protocol is used.
    pub fn parse_allowing_mixed_protocols(
        service: &Service,
    ) -> Result<ServiceConfig, ProviderError> {
        Self::parse_with(service, true)
    }

    fn parse_with(service: &Service, allow_mixed: bool) -> Result<ServiceConfig, ProviderError> {
        let spec = service.spec.clone().unwrap_or_default();
        let scheme = scheme(service)?;
        let sp = spec.ports.clone().unwrap_or_default();
        if sp.is_empty() {
            return Err(invalid("spec.ports", "no ports specified for GCE load balancer"));
        }
        let protocol = sp[0].protocol.clone().unwrap_or_else(|| "TCP".into());
        if !allow_mixed && mixed_protocols(service) {
            return Err(invalid(
                "spec.ports",
                "mixed protocol is not supported for LoadBalancer (all ports must be TCP, or all UDP)",
            ));
        }
        if protocol != "TCP" && protocol != "UDP" {
            return Err(invalid(
                "spec.ports",
                format!("invalid protocol {protocol}, only TCP and UDP are supported"),
            ));
        }
        let ports =
            sp.iter().map(|p| Port { port: p.port, node_port: p.node_port.unwrap_or(0) }).collect();
        let requested_ip = spec.load_balancer_ip.clone().unwrap_or_default().trim().to_string();
        if !requested_ip.is_empty() && requested_ip.parse::<IpAddr>().is_err() {
            return Err(invalid(
                "spec.loadBalancerIP",
                format!("{requested_ip:?} is not an IP address"),
            ));
        }
        let source_ranges = match spec.load_balancer_source_ranges.as_deref() {
            Some(r) if !r.is_empty() => {
                let items: Vec<&str> = r.iter().map(String::as_str).collect();
                parse_cidrs("spec.loadBalancerSourceRanges", &items)?
            }
            _ => match annotation(service, keys::SOURCE_RANGES).map(str::trim) {
                Some(v) if !v.is_empty() => {
                    let items: Vec<&str> = v.split(',').collect();
                    parse_cidrs(keys::SOURCE_RANGES, &items)?
                }
                _ => vec!["0.0.0.0/0".to_string()],
            },
        };
        let k8s_affinity = spec.session_affinity.clone().unwrap_or_else(|| "None".into());
        let affinity = if k8s_affinity == "ClientIP" { "CLIENT_IP" } else { "NONE" };
        let local = spec.external_traffic_policy.as_deref() == Some("Local");
        let health_check_node_port = spec.health_check_node_port.filter(|p| local && *p != 0);
        let (tier, tier_annotated) = match annotation(service, keys::NETWORK_TIER) {
            None => (NetworkTier::Premium, false),
            Some("Premium") => (NetworkTier::Premium, true),
            Some("Standard") => (NetworkTier::Standard, true),
            Some(v) => {
                return Err(invalid(
                    keys::NETWORK_TIER,
                    format!("unsupported network tier: {v:?} (\"Premium\" or \"Standard\")"),
                ));
            }
        };
        let global_access = bool_annotation(service, keys::ALLOW_GLOBAL_ACCESS)?;
        let subnet = match annotation(service, keys::SUBNET).map(str::trim) {
            None | Some("") => None,
            Some(s) if valid_name(s) => Some(s.to_string()),
            Some(s) => {
                return Err(invalid(
                    keys::SUBNET,
                    format!(
                        "{s:?} is not a subnetwork name (lower-case letters, digits and '-', at most 63)"
                    ),
                ));
            }
        };
        let share = bool_annotation(service, keys::BACKEND_SHARE)?
            | bool_annotation(service, keys::BACKEND_SHARE_DEPRECATED)?;
        Ok(ServiceConfig {
            service: service_key(service),
            scheme,
            protocol,
            ports,
            requested_ip,
            source_ranges,
            affinity,
            k8s_affinity,
            local,
            health_check_node_port,
            tier,
            tier_annotated,
            global_access,
            subnet,
            share_backend: share && !local,
        })
    }

    /// The ports as strings, in spec order (the internal forwarding rule's `ports`).
    pub fn port_strings(&self) -> Vec<String> {
        self.ports.iter().map(|p| p.port.to_string()).collect()
    }

    /// `<min>-<max>` of the ports (the external forwarding rule's `portRange`).
    pub fn port_range(&self) -> String {
        let min = self.ports.iter().map(|p| p.port).min().unwrap_or(0);
        let max = self.ports.iter().map(|p| p.port).max().unwrap_or(0);
        format!("{min}-{max}")
    }

    /// The ports folded into ranges (`80`, `8080-8082`), sorted: firewall `ports`.
    pub fn firewall_ports(&self) -> Vec<String> {
        port_ranges(self.ports.iter().map(|p| p.port).collect())
    }

    /// The health check path and port of the Service's load balancer: the per-service one for
    /// Local with a health check node port, else the nodes' (`/healthz` on 10256).
    pub fn health_check(&self) -> (&'static str, i32) {
        match self.health_check_node_port {
            Some(p) => (naming::NODES_HEALTH_CHECK_PATH, p),
            None => (naming::NODES_HEALTH_CHECK_PATH, naming::NODES_HEALTH_CHECK_PORT),
        }
    }
}

/// Consecutive ports folded into `a-b` ranges (upstream's `getPortRanges`).
pub fn port_ranges(mut ports: Vec<i32>) -> Vec<String> {
    ports.sort_unstable();
    ports.dedup();
    let mut out = Vec::new();
    let mut i = 0;
    while i < ports.len() {
        let start = ports[i];
        let mut end = start;
        while i + 1 < ports.len() && ports[i + 1] == end + 1 {
            i += 1;
            end = ports[i];
        }
        out.push(if start == end { start.to_string() } else { format!("{start}-{end}") });
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use kube::api::ObjectMeta;

    fn svc(annotations: &[(&str, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("6f7f1b2c-1234-5678-9abc-def012345678".into()),
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
                ports: Some(vec![ServicePort {
                    port: 80,
                    node_port: Some(30080),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn every_documented_example_parses() {
        for k in ANNOTATIONS.iter().filter(|k| !k.example.is_empty()) {
            ServiceConfig::parse(&svc(&[(k.key, k.example)]))
                .unwrap_or_else(|e| panic!("{}: {e}", k.key));
        }
    }

    #[test]
    fn defaults_are_upstream_s() {
        let c = ServiceConfig::parse(&svc(&[])).unwrap();
        assert_eq!(c.scheme, Scheme::External);
        assert_eq!(c.protocol, "TCP");
        assert_eq!(c.source_ranges, vec!["0.0.0.0/0"]);
        assert_eq!(c.affinity, "NONE");
        assert_eq!(c.tier, NetworkTier::Premium);
        assert!(!c.tier_annotated && !c.global_access && !c.share_backend && !c.local);
        assert_eq!(c.health_check(), ("/healthz", 10256));
        assert_eq!(c.port_range(), "80-80");
    }

    #[test]
    fn the_type_annotation_and_the_class() {
        let t = |v: &str| scheme(&svc(&[(keys::LOAD_BALANCER_TYPE, v)]));
        assert_eq!(t("Internal").unwrap(), Scheme::Internal);
        assert_eq!(t("internal").unwrap(), Scheme::Internal);
        assert_eq!(t("External").unwrap(), Scheme::External);
        assert_eq!(t("").unwrap(), Scheme::External);
        let e = t("INTERNAL").unwrap_err().to_string();
        assert!(e.contains(keys::LOAD_BALANCER_TYPE) && e.contains("INTERNAL"), "{e}");
        // The deprecated key is read when the new one is absent; the new one wins.
        assert_eq!(
            scheme(&svc(&[(keys::LOAD_BALANCER_TYPE_DEPRECATED, "Internal")])).unwrap(),
            Scheme::Internal
        );
        let both = svc(&[
            (keys::LOAD_BALANCER_TYPE, "External"),
            (keys::LOAD_BALANCER_TYPE_DEPRECATED, "Internal"),
        ]);
        assert_eq!(scheme(&both).unwrap(), Scheme::External);
        // The legacy classes win over the annotation.
        let mut s = svc(&[(keys::LOAD_BALANCER_TYPE, "Internal")]);
        s.spec.as_mut().unwrap().load_balancer_class = Some(keys::CLASS_EXTERNAL_LEGACY.into());
        assert_eq!(scheme(&s).unwrap(), Scheme::External);
        s.spec.as_mut().unwrap().load_balancer_class = Some(keys::CLASS_INTERNAL_LEGACY.into());
        assert_eq!(scheme(&svc(&[])).unwrap(), Scheme::External);
        assert_eq!(scheme(&s).unwrap(), Scheme::Internal);
        s.spec.as_mut().unwrap().load_balancer_class = Some("example.com/mine".into());
        assert_eq!(class(&s), Class::Other("example.com/mine".into()));
    }

    #[test]
    fn bad_values_name_the_annotation() {
        for (k, v) in [
            (keys::NETWORK_TIER, "STANDARD"),
            (keys::ALLOW_GLOBAL_ACCESS, "yes"),
            (keys::BACKEND_SHARE, "True"),
            (keys::SUBNET, "My_Subnet"),
            (keys::SOURCE_RANGES, "10.0.0.0/8,nonsense"),
        ] {
            let e = ServiceConfig::parse(&svc(&[(k, v)])).unwrap_err();
            assert!(matches!(e, ProviderError::Invalid { .. }), "{k}: {e}");
            assert!(
                e.to_string().contains(k)
                    && e.to_string().contains(v.split(',').next_back().unwrap()),
                "{e}"
            );
        }
        let mut s = svc(&[]);
        s.spec.as_mut().unwrap().load_balancer_ip = Some("not-an-ip".into());
        assert!(ServiceConfig::parse(&s).unwrap_err().to_string().contains("spec.loadBalancerIP"));
        let mut s = svc(&[]);
        s.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["10.0.0.0/33".into()]);
        assert!(
            ServiceConfig::parse(&s)
                .unwrap_err()
                .to_string()
                .contains("spec.loadBalancerSourceRanges")
        );
    }

    #[test]
    fn ports_protocols_and_ranges() {
        let mut s = svc(&[]);
        let p = |port, proto: &str| ServicePort {
            port,
            protocol: Some(proto.into()),
            ..Default::default()
        };
        s.spec.as_mut().unwrap().ports =
            Some(vec![p(443, "TCP"), p(80, "TCP"), p(81, "TCP"), p(8080, "TCP")]);
        let c = ServiceConfig::parse(&s).unwrap();
        assert_eq!(c.port_range(), "80-8080");
        assert_eq!(c.firewall_ports(), vec!["80-81", "443", "8080"]);
        assert_eq!(c.port_strings(), vec!["443", "80", "81", "8080"]);
        s.spec.as_mut().unwrap().ports = Some(vec![p(53, "UDP"), p(53, "TCP")]);
        assert!(ServiceConfig::parse(&s).unwrap_err().to_string().contains("mixed protocol"));
        s.spec.as_mut().unwrap().ports = Some(vec![p(5000, "SCTP")]);
        assert!(ServiceConfig::parse(&s).unwrap_err().to_string().contains("only TCP and UDP"));
        s.spec.as_mut().unwrap().ports = Some(vec![]);
        assert!(ServiceConfig::parse(&s).unwrap_err().to_string().contains("spec.ports"));
        assert_eq!(port_ranges(vec![1, 2, 3, 5, 5, 7, 8]), vec!["1-3", "5", "7-8"]);
    }

    #[test]
    fn local_traffic_policy_and_sharing() {
        let mut s = svc(&[(keys::BACKEND_SHARE, "true")]);
        let c = ServiceConfig::parse(&s).unwrap();
        assert!(c.share_backend);
        let spec = s.spec.as_mut().unwrap();
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(31000);
        let c = ServiceConfig::parse(&s).unwrap();
        assert!(c.local && !c.share_backend, "Local never shares the backend service");
        assert_eq!(c.health_check(), ("/healthz", 31000));
    }

    #[test]
    fn source_ranges_come_from_the_spec_else_the_annotation() {
        let mut s = svc(&[(keys::SOURCE_RANGES, " 192.168.0.0/16, 10.1.2.3/8 ")]);
        assert_eq!(
            ServiceConfig::parse(&s).unwrap().source_ranges,
            vec!["10.0.0.0/8", "192.168.0.0/16"]
        );
        s.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["1.2.3.4/32".into()]);
        assert_eq!(ServiceConfig::parse(&s).unwrap().source_ranges, vec!["1.2.3.4/32"]);
    }

    #[test]
    fn rbs_is_recognised() {
        assert!(uses_rbs(&svc(&[(keys::L4_RBS, "enabled")])));
        assert!(!uses_rbs(&svc(&[(keys::L4_RBS, "disabled")])));
        let mut s = svc(&[]);
        s.metadata.finalizers = Some(vec![keys::FINALIZER_NETLB_V2.into()]);
        assert!(uses_rbs(&s));
    }
}
