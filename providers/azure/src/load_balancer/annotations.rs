//! The Service fields and `service.beta.kubernetes.io/*` annotations the load balancer reads
//! (upstream `pkg/consts/consts.go`), parsed once into a [`ServiceConfig`] before any ARM
//! call. A bad value is [`ProviderError::Invalid`] naming the annotation (or field).
//!
//! Booleans are `true`/`false` in any case (empty means false); upstream takes anything but
//! `true` as false, which silently made `"yes"` on `azure-load-balancer-internal` a public
//! load balancer — here it is an error. The NSG annotations (`azure-allowed-service-tags`,
//! `azure-allowed-ip-ranges`, `azure-deny-all-except-load-balancer-source-ranges`,
//! `azure-disable-load-balancer-nsg-rule`, `loadBalancerSourceRanges`) are read by
//! [`super::security_group`].

use std::collections::BTreeMap;
use std::net::IpAddr;

use ccm_core::cloud::ProviderError;
use ccm_core::reference::{KeyDoc, annotation as kd};
use k8s_openapi::api::core::v1::Service;

use crate::client::names::{self, NameKind};

use super::security_group::{
    ALLOWED_IP_RANGES, ALLOWED_SERVICE_TAGS, DENY_ALL_EXCEPT_SOURCE_RANGES, DISABLE_NSG_RULE,
    SOURCE_RANGES_ANNOTATION,
};

/// `service.beta.kubernetes.io/`.
pub const PREFIX: &str = "service.beta.kubernetes.io/";
/// `true` → internal load balancer (`<name>-internal`).
pub const INTERNAL: &str = "service.beta.kubernetes.io/azure-load-balancer-internal";
/// The subnet of an internal frontend.
pub const INTERNAL_SUBNET: &str = "service.beta.kubernetes.io/azure-load-balancer-internal-subnet";
/// The IPv4 frontend address (replaces `spec.loadBalancerIP`).
pub const IPV4: &str = "service.beta.kubernetes.io/azure-load-balancer-ipv4";
/// The IPv6 frontend address.
pub const IPV6: &str = "service.beta.kubernetes.io/azure-load-balancer-ipv6";
/// The public IP to use or create (IPv4, or the only family).
pub const PIP_NAME: &str = "service.beta.kubernetes.io/azure-pip-name";
/// The IPv6 public IP to use or create.
pub const PIP_NAME_IPV6: &str = "service.beta.kubernetes.io/azure-pip-name-ipv6";
/// A public IP prefix to allocate the public IP from.
pub const PIP_PREFIX_ID: &str = "service.beta.kubernetes.io/azure-pip-prefix-id";
/// The IPv6 public IP prefix.
pub const PIP_PREFIX_ID_IPV6: &str = "service.beta.kubernetes.io/azure-pip-prefix-id-ipv6";
/// The resource group of the public IP.
pub const RESOURCE_GROUP: &str = "service.beta.kubernetes.io/azure-load-balancer-resource-group";
/// The DNS label of the public IP.
pub const DNS_LABEL_NAME: &str = "service.beta.kubernetes.io/azure-dns-label-name";
/// Health probe protocol for every port.
pub const PROBE_PROTOCOL: &str =
    "service.beta.kubernetes.io/azure-load-balancer-health-probe-protocol";
/// Health probe path for every port.
pub const PROBE_REQUEST_PATH: &str =
    "service.beta.kubernetes.io/azure-load-balancer-health-probe-request-path";
/// Health probe interval (seconds, ≥ 5).
pub const PROBE_INTERVAL: &str =
    "service.beta.kubernetes.io/azure-load-balancer-health-probe-interval";
/// Failed probes before a backend is out (≥ 2).
pub const PROBE_NUM_OF_PROBE: &str =
    "service.beta.kubernetes.io/azure-load-balancer-health-probe-num-of-probe";
/// Idle timeout in minutes (4–100).
pub const TCP_IDLE_TIMEOUT: &str =
    "service.beta.kubernetes.io/azure-load-balancer-tcp-idle-timeout";
/// `true` → rules without TCP reset.
pub const DISABLE_TCP_RESET: &str =
    "service.beta.kubernetes.io/azure-load-balancer-disable-tcp-reset";
/// `true` → rules without floating IP (backend port = node port).
pub const DISABLE_FLOATING_IP: &str =
    "service.beta.kubernetes.io/azure-disable-load-balancer-floating-ip";
/// `true` → one HA-ports rule (internal load balancers only).
pub const HA_PORTS: &str =
    "service.beta.kubernetes.io/azure-load-balancer-enable-high-availability-ports";
/// Tags for the public IP: `k1=v1,k2=v2`.
pub const PIP_TAGS: &str = "service.beta.kubernetes.io/azure-pip-tags";
/// IP tags for a new public IP: `type1=tag1,type2=tag2`.
pub const PIP_IP_TAGS: &str = "service.beta.kubernetes.io/azure-pip-ip-tags";
/// Extra public IPs: in the status for kube-proxy and in the Service's security rules (not
/// configured on the load balancer).
pub const ADDITIONAL_PUBLIC_IPS: &str = "service.beta.kubernetes.io/azure-additional-public-ips";
/// Private Link Service on the Service's frontend: [`super::pls`] reads and documents the
/// ten `azure-pls-*` annotations ([`super::pls::PLS_ANNOTATIONS`]).
pub const PLS_CREATE: &str = super::pls::CREATE;
/// Basic-SKU load balancer selection (ignored on the standard SKU, as upstream).
pub const LOAD_BALANCER_MODE: &str = "service.beta.kubernetes.io/azure-load-balancer-mode";
/// Multiple standard load balancers (ignored without that config, as upstream).
pub const LOAD_BALANCER_CONFIGURATIONS: &str =
    "service.beta.kubernetes.io/azure-load-balancer-configurations";

/// Every Service annotation the load balancer reads, with its documentation: this module's
/// keys, the per-port keys (`<port>` is the Service port's number) and the security group's
/// ([`super::security_group`]), including the ones refused or ignored (their `doc` says so;
/// a refused one starts with `Refused`). The tests feed every example back into [`parse`] and
/// [`super::security_group::access`]; `ccm-docgen` renders it as the annotation reference.
pub static ANNOTATIONS: &[KeyDoc] = &[
    kd(
        INTERNAL,
        "`true`/`false` (any case), default `false`",
        "true",
        "An internal load balancer: a frontend in the subnet (`azure-load-balancer-internal-subnet`, else the config's `subnetName`, in `vnetName`) on `<loadBalancerName>-internal`, instead of a public IP on `<loadBalancerName>`. Changing it moves the Service from one load balancer to the other. An internal Service gets no `Internet` security rule unless a source range allows every address. Other values are an error (upstream reads them as `false`).",
    ),
    kd(
        INTERNAL_SUBNET,
        "subnet name in `vnetName`, default the config's `subnetName`",
        "ilb-subnet",
        "Internal only (ignored otherwise): the subnet the frontend address comes from, in the config's `vnetName`. A name breaking ARM's rules for network resources (1-80 letters, digits, `_`, `.`, `-`; starting with a letter or digit, ending with one or `_`) is an error naming the annotation, before any ARM call.",
    ),
    kd(
        IPV4,
        "IPv4 address",
        "10.240.0.100",
        "The IPv4 frontend address, instead of `spec.loadBalancerIP`. Internal: a static private address in the subnet. Public: the existing public IP with this address in the public IPs' resource group (else an error). An address another Service's frontend already has (public IP or, internal, private address) is shared: the Service adds its own rules on that frontend (upstream's secondary Service). An address of the other family is an error.",
    ),
    kd(
        IPV6,
        "IPv6 address",
        "fd00::100",
        "The IPv6 frontend address, as `azure-load-balancer-ipv4` for IPv4.",
    ),
    kd(
        PIP_NAME,
        "public IP name",
        "my-service-pip",
        "Public: the public IP to use for IPv4 (or the only family of a single-stack IPv6 Service without `azure-pip-name-ipv6`), in the public IPs' resource group. It must exist and not be used by a NIC or another load balancer; when another Service's frontend on the cluster's load balancer uses it, the Service shares that frontend (its own rules on it, as upstream's secondary Service). It is used, never re-tagged or deleted (only a DNS label the Service asks for is set). Wins over `azure-pip-prefix-id` and the frontend address. A name breaking ARM's rules for network resources is an error naming the annotation, before any ARM call.",
    ),
    kd(
        PIP_NAME_IPV6,
        "public IP name",
        "my-service-pip-ipv6",
        "Public: the IPv6 public IP of a dual-stack Service, or of a single-stack IPv6 one (preferred to `azure-pip-name`).",
    ),
    kd(
        PIP_PREFIX_ID,
        "public IP prefix resource ID",
        "/subscriptions/2fbf2a4e-8e1c-4e3c-9c0e-2d2f1c7a9b10/resourceGroups/net-rg/providers/Microsoft.Network/publicIPPrefixes/k8s-prefix",
        "Public, without `azure-pip-name`: the public IP `<cluster>-a<uid>` this provider creates takes its address from this prefix (IPv4, or the only family as for `azure-pip-name`). Anything but a `.../publicIPPrefixes/...` resource ID is an error.",
    ),
    kd(
        PIP_PREFIX_ID_IPV6,
        "public IP prefix resource ID",
        "/subscriptions/2fbf2a4e-8e1c-4e3c-9c0e-2d2f1c7a9b10/resourceGroups/net-rg/providers/Microsoft.Network/publicIPPrefixes/k8s-prefix-ipv6",
        "Public: the IPv6 prefix, as `azure-pip-name-ipv6` for names.",
    ),
    kd(
        RESOURCE_GROUP,
        "resource group, default the config's `resourceGroup`",
        "pip-rg",
        "The resource group of the Service's public IPs (found, created and deleted there). Only a resource group the cloud config's `serviceResourceGroups` allows (default: the cluster's own `resourceGroup`, `loadBalancerResourceGroup`, `vnetResourceGroup`); another, or a name breaking ARM's rules (1-90 letters, digits, `_`, `-`, `.`, `(`, `)`, not ending in `.`), is an error naming the annotation, before any ARM call.",
    ),
    kd(
        DNS_LABEL_NAME,
        "DNS label; empty removes it",
        "myapp",
        "Public: the DNS label of the Service's public IP. Absent: the label is left as it is. A public IP holding another Service's label is an error.",
    ),
    kd(
        PROBE_PROTOCOL,
        "`Tcp`, `Http` or `Https` (any case), default `Tcp`",
        "Http",
        "The protocol of every TCP port's health probe, after `port_<port>_health-probe_protocol` and the port's `appProtocol` (`http`, `https`; others mean TCP). UDP and SCTP ports get no probe of their own. Other values are an error.",
    ),
    kd(
        PROBE_REQUEST_PATH,
        "path, default `/`",
        "/healthz",
        "The path of HTTP and HTTPS port probes (`port_<port>_health-probe_request-path` wins).",
    ),
    kd(
        PROBE_INTERVAL,
        "whole seconds, at least 5, default 5",
        "10",
        "The probes' interval (`port_<port>_health-probe_interval` wins). Interval × number of probes must be below 120 seconds.",
    ),
    kd(
        PROBE_NUM_OF_PROBE,
        "whole number, at least 2, default 2",
        "3",
        "Failed probes before a backend is taken out (`port_<port>_health-probe_num-of-probe` wins). Interval × number of probes must be below 120 seconds.",
    ),
    kd(
        TCP_IDLE_TIMEOUT,
        "whole minutes, 4 to 100, default 4",
        "30",
        "The idle timeout of the Service's load-balancing rules.",
    ),
    kd(
        DISABLE_TCP_RESET,
        "`true`/`false` (any case), default `false`",
        "true",
        "TCP rules without TCP reset on idle timeout.",
    ),
    kd(
        DISABLE_FLOATING_IP,
        "`true`/`false` (any case), default `false`",
        "true",
        "Rules without floating IP: traffic goes to the nodes' node ports, and the security rules admit the node ports on the node IPs. Internal IPv6 frontends never use floating IP.",
    ),
    kd(
        HA_PORTS,
        "`true`/`false` (any case), default `false`",
        "true",
        "Internal only (ignored otherwise): one HA-ports rule (every protocol and port) instead of one rule per Service port.",
    ),
    kd(
        PIP_TAGS,
        "`k1=v1,k2=v2`",
        "team=web,env=prod",
        "Tags added to the public IPs this provider creates or tags (never to a user's untagged public IP), over the config's `tags`. Keys and values are trimmed; a pair that is not `key=value` is an error.",
    ),
    kd(
        PIP_IP_TAGS,
        "`type1=tag1,type2=tag2`",
        "RoutingPreference=Internet",
        "IP tags of a public IP this provider creates; existing public IPs are not changed.",
    ),
    kd(
        ADDITIONAL_PUBLIC_IPS,
        "comma-separated IP addresses",
        "20.30.40.50,20.30.40.51",
        "Off by default: an error on the Service naming the annotation, and nothing in its status, unless the cloud config sets `allowAdditionalPublicIPs` (kube-proxy captures in-cluster traffic to every status address). Allowed, each address must be a public IP resource's in the resource groups of `serviceResourceGroups`, not used by a network interface or another Service, and not tagged for another Service or cluster; it is then added to `status.loadBalancer.ingress` and, with floating IP, to the destinations of the Service's own security rules, as upstream (the load balancer itself is not configured for it); taken out of the annotation, it leaves the status and the rules. Private, loopback, link-local (169.254.169.254), unspecified, multicast and reserved addresses are always an error.",
    ),
    kd(
        LOAD_BALANCER_MODE,
        "any value",
        "__auto__",
        "Ignored, with a warning: it selects among the availability sets' Basic load balancers; the single standard load balancer does not use it (as upstream).",
    ),
    kd(
        LOAD_BALANCER_CONFIGURATIONS,
        "any value",
        "lb-1",
        "With `multipleStandardLoadBalancerConfigurations`: the configurations (comma-separated names, any case) the Service may be placed on. Without it: ignored, with a warning (as upstream).",
    ),
    kd(
        "service.beta.kubernetes.io/port_<port>_no_lb_rule",
        "`true`/`false` (any case), default `false`",
        "true",
        "No load-balancing rule (and no probe) for the Service port `<port>`.",
    ),
    kd(
        "service.beta.kubernetes.io/port_<port>_no_probe_rule",
        "`true`/`false` (any case), default `false`",
        "true",
        "The rule of port `<port>` gets no health probe.",
    ),
    kd(
        "service.beta.kubernetes.io/port_<port>_health-probe_protocol",
        "`Tcp`, `Http` or `Https` (any case)",
        "Https",
        "The probe protocol of port `<port>` (TCP ports only), over `appProtocol` and `azure-load-balancer-health-probe-protocol`.",
    ),
    kd(
        "service.beta.kubernetes.io/port_<port>_health-probe_request-path",
        "path",
        "/ready",
        "The HTTP(S) probe path of port `<port>`, over `azure-load-balancer-health-probe-request-path`.",
    ),
    kd(
        "service.beta.kubernetes.io/port_<port>_health-probe_port",
        "a Service port's name or number, or a port number 0 to 65535",
        "10256",
        "Where port `<port>`'s probe goes: a Service port (by name or number) means its node port; another number is probed as it is.",
    ),
    kd(
        "service.beta.kubernetes.io/port_<port>_health-probe_interval",
        "whole seconds, at least 5",
        "15",
        "The probe interval of port `<port>` (for `externalTrafficPolicy: Local`, `<port>` may be the health check node port), over `azure-load-balancer-health-probe-interval`.",
    ),
    kd(
        "service.beta.kubernetes.io/port_<port>_health-probe_num-of-probe",
        "whole number, at least 2",
        "4",
        "The failed probes of port `<port>` (for `externalTrafficPolicy: Local`, `<port>` may be the health check node port), over `azure-load-balancer-health-probe-num-of-probe`.",
    ),
    kd(
        DISABLE_NSG_RULE,
        "`true`/`false` (any case), default `false`",
        "true",
        "No security group rules for the Service (its addresses are taken out of the rules made before).",
    ),
    kd(
        ALLOWED_SERVICE_TAGS,
        "comma-separated service tags",
        "AzureFrontDoor.Backend,AzureCloud.EastUS",
        "Service tags allowed in, one allow rule each; with any, `Internet` is no longer allowed. Letters, digits, `.`, `-`, `_` only (CIDRs go in `azure-allowed-ip-ranges`).",
    ),
    kd(
        ALLOWED_IP_RANGES,
        "comma-separated CIDRs (network prefixes)",
        "203.0.113.0/24,2001:db8::/32",
        "Source ranges allowed in, instead of `spec.loadBalancerSourceRanges` (setting both, or this and `load-balancer-source-ranges`, is an error). `10.0.0.1/8` is an error naming `10.0.0.0/8`.",
    ),
    kd(
        DENY_ALL_EXCEPT_SOURCE_RANGES,
        "`true`/`false` (any case), default `false`",
        "true",
        "With source ranges set: also deny-all rules `k8s-azure-lb_deny-all_<family>` for the Service's addresses, so only the ranges (and service tags) get in, not even the virtual network.",
    ),
    kd(
        SOURCE_RANGES_ANNOTATION,
        "comma-separated CIDRs (network prefixes)",
        "10.0.0.0/8,192.168.0.0/16",
        "Kubernetes' annotation, read when `spec.loadBalancerSourceRanges` is empty: the sources the security rules admit. Without any range or service tag a public Service admits `Internet`.",
    ),
];

/// Default probe interval (seconds).
pub const DEFAULT_PROBE_INTERVAL: i32 = 5;
/// Default failed probes.
pub const DEFAULT_NUM_OF_PROBE: i32 = 2;
/// Default HTTP(S) probe path of a port probe.
pub const DEFAULT_PROBE_PATH: &str = "/";
/// Default idle timeout (minutes).
pub const DEFAULT_IDLE_TIMEOUT: i32 = 4;

/// An IP family.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Family {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

impl Family {
    /// ARM's `IPv4`/`IPv6`.
    pub fn arm(self) -> &'static str {
        match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        }
    }

    /// The family of an address.
    pub fn of(ip: &IpAddr) -> Family {
        if ip.is_ipv4() { Family::V4 } else { Family::V6 }
    }
}

/// A Service port's transport protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// TCP.
    Tcp,
    /// UDP.
    Udp,
    /// SCTP (internal load balancers only; ARM protocol `All`).
    Sctp,
}

impl Protocol {
    /// As Kubernetes spells it (`TCP`), used in rule names.
    pub fn k8s(self) -> &'static str {
        match self {
            Protocol::Tcp => "TCP",
            Protocol::Udp => "UDP",
            Protocol::Sctp => "SCTP",
        }
    }

    /// ARM's transport protocol for a load-balancing rule.
    pub fn arm(self) -> &'static str {
        match self {
            Protocol::Tcp => "Tcp",
            Protocol::Udp => "Udp",
            Protocol::Sctp => "All",
        }
    }
}

/// A health probe protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeProtocol {
    /// TCP connect.
    Tcp,
    /// HTTP GET.
    Http,
    /// HTTPS GET.
    Https,
}

impl ProbeProtocol {
    /// ARM's spelling.
    pub fn arm(self) -> &'static str {
        match self {
            ProbeProtocol::Tcp => "Tcp",
            ProbeProtocol::Http => "Http",
            ProbeProtocol::Https => "Https",
        }
    }

    fn parse(s: &str) -> Option<ProbeProtocol> {
        match s.trim().to_ascii_lowercase().as_str() {
            "tcp" => Some(ProbeProtocol::Tcp),
            "http" => Some(ProbeProtocol::Http),
            "https" => Some(ProbeProtocol::Https),
            _ => None,
        }
    }
}

/// Where a port's probe goes (`port_<port>_health-probe_port`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbePort {
    /// The node port of the Service port with this name or port number.
    ServicePort(String),
    /// This port number.
    Number(i32),
}

/// The per-port overrides (`port_<port>_health-probe_*`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PortProbe {
    /// `port_<port>_health-probe_port`.
    pub port: Option<ProbePort>,
    /// `port_<port>_health-probe_protocol`.
    pub protocol: Option<ProbeProtocol>,
    /// `port_<port>_health-probe_request-path`.
    pub request_path: Option<String>,
    /// Interval (port override, else the global annotation, else 5).
    pub interval: i32,
    /// Failed probes (port override, else the global annotation, else 2).
    pub num_of_probe: i32,
}

/// One Service port with its annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortConfig {
    /// The port's name.
    pub name: String,
    /// The frontend port.
    pub port: i32,
    /// The node port (0 when unset).
    pub node_port: i32,
    /// The protocol.
    pub protocol: Protocol,
    /// `appProtocol`.
    pub app_protocol: Option<String>,
    /// `port_<port>_no_lb_rule`.
    pub no_lb_rule: bool,
    /// `port_<port>_no_probe_rule`.
    pub no_probe_rule: bool,
    /// The probe settings.
    pub probe: PortProbe,
}

/// A Service as the load balancer sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceConfig {
    /// `<namespace>/<name>` (the public IP's `k8s-azure-service` tag).
    pub key: String,
    /// `a` + the UID without dashes (at most 32): the prefix of every name.
    pub prefix: String,
    /// Internal load balancer.
    pub internal: bool,
    /// The internal frontend's subnet from the annotation (internal only).
    pub internal_subnet: Option<String>,
    /// The IP families in `spec.ipFamilies` order (IPv4 when none).
    pub families: Vec<Family>,
    /// The frontend address asked for, per family (annotation, else `spec.loadBalancerIP`).
    pub load_balancer_ip: BTreeMap<Family, IpAddr>,
    /// The public IP name asked for, per family.
    pub pip_name: BTreeMap<Family, String>,
    /// The public IP prefix, per family.
    pub pip_prefix_id: BTreeMap<Family, String>,
    /// The public IPs' resource group, when not the cluster's.
    pub resource_group: Option<String>,
    /// The DNS label; `Some("")` removes it, `None` leaves it alone.
    pub dns_label: Option<String>,
    /// Global probe protocol.
    pub probe_protocol: Option<ProbeProtocol>,
    /// Global probe path.
    pub probe_request_path: Option<String>,
    /// Idle timeout (minutes).
    pub idle_timeout: i32,
    /// TCP reset on the rules.
    pub tcp_reset: bool,
    /// Floating IP on the rules.
    pub floating_ip: bool,
    /// One HA-ports rule.
    pub ha_ports: bool,
    /// Tags for the public IP.
    pub pip_tags: BTreeMap<String, String>,
    /// IP tags for a new public IP (`None` when not asked for).
    pub pip_ip_tags: Option<Vec<(String, String)>>,
    /// Extra status IPs.
    pub additional_public_ips: Vec<IpAddr>,
    /// `externalTrafficPolicy: Local` with a health check node port.
    pub health_check_node_port: Option<i32>,
    /// Probe settings for the health check node port (its `port_<port>_*` overrides).
    pub health_check_probe: PortProbe,
    /// `externalTrafficPolicy: Local`.
    pub local_traffic: bool,
    /// `sessionAffinity: ClientIP`.
    pub client_ip_affinity: bool,
    /// The ports.
    pub ports: Vec<PortConfig>,
    /// The addresses in `status.loadBalancer.ingress` (kept when a frontend is rebuilt).
    pub ingress_ips: Vec<IpAddr>,
}

impl ServiceConfig {
    /// Dual-stack: both families (names of IPv6 resources get `-IPv6`).
    pub fn dual_stack(&self) -> bool {
        self.families.len() == 2
    }

    /// Whether `family` is enabled.
    pub fn has(&self, family: Family) -> bool {
        self.families.contains(&family)
    }
}

fn invalid(what: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::Invalid { what: what.to_string(), message: message.into() }
}

/// An annotation as a boolean: `true`/`false` in any case; empty is false.
pub fn parse_bool(
    annotations: &BTreeMap<String, String>,
    key: &str,
) -> Result<bool, ProviderError> {
    match annotations.get(key).map(|v| v.trim()) {
        None | Some("") => Ok(false),
        Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
        Some(v) => Err(invalid(key, format!("{v:?} is not true or false"))),
    }
}

fn parse_int(
    annotations: &BTreeMap<String, String>,
    key: &str,
    check: impl Fn(i32) -> Result<(), String>,
) -> Result<Option<i32>, ProviderError> {
    let Some(v) = annotations.get(key) else { return Ok(None) };
    let n: i32 =
        v.trim().parse().map_err(|_| invalid(key, format!("{v:?} is not a whole number")))?;
    check(n).map_err(|m| invalid(key, m))?;
    Ok(Some(n))
}

fn parse_ip(key: &str, v: &str, family: Option<Family>) -> Result<IpAddr, ProviderError> {
    let ip: IpAddr =
        v.trim().parse().map_err(|_| invalid(key, format!("{v:?} is not an IP address")))?;
    if let Some(f) = family
        && Family::of(&ip) != f
    {
        return Err(invalid(key, format!("{ip} is not an {} address", f.arm())));
    }
    Ok(ip)
}

/// `k1=v1,k2=v2` (spaces around keys and values trimmed; empty entries skipped).
pub fn parse_pairs(key: &str, value: &str) -> Result<Vec<(String, String)>, ProviderError> {
    let mut out = Vec::new();
    for pair in value.split(',') {
        if pair.trim().is_empty() {
            continue;
        }
        let mut parts = pair.split('=');
        let (Some(k), Some(v), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(invalid(key, format!("{pair:?} is not key=value")));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(invalid(key, format!("{pair:?} has an empty key")));
        }
        out.push((k.to_string(), v.trim().to_string()));
    }
    Ok(out)
}

/// The key `service.beta.kubernetes.io/port_<port>_<param>`.
pub fn port_key(port: i32, param: &str) -> String {
    format!("{PREFIX}port_{port}_{param}")
}

fn probe_settings(
    a: &BTreeMap<String, String>,
    port: i32,
) -> Result<(Option<ProbeProtocol>, Option<String>, i32, i32), ProviderError> {
    let protocol_key = port_key(port, "health-probe_protocol");
    let protocol =
        match a.get(&protocol_key) {
            None => None,
            Some(v) => Some(ProbeProtocol::parse(v).ok_or_else(|| {
                invalid(&protocol_key, format!("{v:?} is not Tcp, Http or Https"))
            })?),
        };
    let path = a.get(&port_key(port, "health-probe_request-path")).cloned();
    let interval_key = port_key(port, "health-probe_interval");
    let min_interval = |n: i32| {
        if n < 5 { Err(format!("{n} is below the minimum interval of 5 seconds")) } else { Ok(()) }
    };
    let min_num = |n: i32| {
        if n < 2 { Err(format!("{n} is below the minimum of 2 probes")) } else { Ok(()) }
    };
    let (interval, interval_from) = match parse_int(a, &interval_key, min_interval)? {
        Some(n) => (n, interval_key.clone()),
        None => (
            parse_int(a, PROBE_INTERVAL, min_interval)?.unwrap_or(DEFAULT_PROBE_INTERVAL),
            PROBE_INTERVAL.to_string(),
        ),
    };
    let num_key = port_key(port, "health-probe_num-of-probe");
    let (num, num_from) = match parse_int(a, &num_key, min_num)? {
        Some(n) => (n, num_key.clone()),
        None => (
            parse_int(a, PROBE_NUM_OF_PROBE, min_num)?.unwrap_or(DEFAULT_NUM_OF_PROBE),
            PROBE_NUM_OF_PROBE.to_string(),
        ),
    };
    if i64::from(interval) * i64::from(num) >= 120 {
        return Err(invalid(
            &format!("{interval_from}, {num_from}"),
            format!("interval {interval}s × {num} probes must be below 120 seconds (port {port})"),
        ));
    }
    Ok((protocol, path, interval, num))
}

/// The annotations the Service carries that the load balancer ignores (each logged by the
/// sync): `azure-load-balancer-mode` always (Basic load balancers' availability sets), and
/// `azure-load-balancer-configurations` only with one standard load balancer (`multi`
/// false); with several it places the Service.
pub fn ignored(service: &Service, multi: bool) -> Vec<&'static str> {
    let a = service.metadata.annotations.as_ref();
    let has = |k: &str| a.is_some_and(|a| a.contains_key(k));
    let mut out = Vec::new();
    if has(LOAD_BALANCER_MODE) {
        out.push(LOAD_BALANCER_MODE);
    }
    if !multi && has(LOAD_BALANCER_CONFIGURATIONS) {
        out.push(LOAD_BALANCER_CONFIGURATIONS);
    }
    out
}

/// Reads the Service: every annotation the load balancer uses, checked.
pub fn parse(service: &Service) -> Result<ServiceConfig, ProviderError> {
    let empty = BTreeMap::new();
    let a = service.metadata.annotations.as_ref().unwrap_or(&empty);
    let spec = service.spec.clone().unwrap_or_default();
    let namespace = service.metadata.namespace.as_deref().unwrap_or_default();
    let name = service.metadata.name.as_deref().unwrap_or_default();
    let uid = service.metadata.uid.as_deref().unwrap_or_default();
    if uid.is_empty() {
        return Err(invalid("metadata.uid", "the Service has no UID"));
    }

    // The ten `azure-pls-*` annotations are checked by the PLS code, before any ARM call.
    let pls = super::pls::parse(service)?;

    let internal = parse_bool(a, INTERNAL)?;
    if pls.create && !internal && !parse_bool(a, DISABLE_FLOATING_IP)? {
        return Err(invalid(
            PLS_CREATE,
            "a private link service needs an internal Service (azure-load-balancer-internal) or floating IP disabled",
        ));
    }
    let internal_subnet = if internal {
        a.get(INTERNAL_SUBNET).filter(|s| !s.trim().is_empty()).cloned()
    } else {
        None
    };
    if let Some(subnet) = &internal_subnet {
        arm_name(INTERNAL_SUBNET, NameKind::Network, subnet)?;
    }

    let mut families = Vec::new();
    for f in spec.ip_families.iter().flatten() {
        let fam = match f.as_str() {
            "IPv4" => Family::V4,
            "IPv6" => Family::V6,
            other => return Err(invalid("spec.ipFamilies", format!("unknown family {other:?}"))),
        };
        if !families.contains(&fam) {
            families.push(fam);
        }
    }
    if families.is_empty() {
        families.push(Family::V4);
    }
    let dual = families.len() == 2;

    let mut load_balancer_ip = BTreeMap::new();
    for (key, fam) in [(IPV4, Family::V4), (IPV6, Family::V6)] {
        if let Some(v) = a.get(key).filter(|v| !v.trim().is_empty()) {
            load_balancer_ip.insert(fam, parse_ip(key, v, Some(fam))?);
        }
    }
    if load_balancer_ip.is_empty()
        && let Some(v) = spec.load_balancer_ip.as_deref().filter(|v| !v.trim().is_empty())
    {
        let ip = parse_ip("spec.loadBalancerIP", v, None)?;
        load_balancer_ip.insert(Family::of(&ip), ip);
    }

    // Upstream's getServicePIPName: single-stack IPv6 takes the -ipv6 annotation, else the
    // plain one; dual-stack takes one per family.
    let per_family = |v4_key: &str, v6_key: &str| -> BTreeMap<Family, String> {
        let get = |k: &str| a.get(k).filter(|v| !v.trim().is_empty()).map(|v| v.trim().to_string());
        let mut out = BTreeMap::new();
        if dual {
            if let Some(v) = get(v4_key) {
                out.insert(Family::V4, v);
            }
            if let Some(v) = get(v6_key) {
                out.insert(Family::V6, v);
            }
        } else if families[0] == Family::V6 {
            if let Some(v) = get(v6_key).or_else(|| get(v4_key)) {
                out.insert(Family::V6, v);
            }
        } else if let Some(v) = get(v4_key) {
            out.insert(Family::V4, v);
        }
        out
    };
    // Upstream's getServicePIPName: the key a family's value came from.
    let key_of = |fam: Family, v4_key: &'static str, v6_key: &'static str| -> &'static str {
        if fam == Family::V6 && (dual || a.get(v6_key).is_some_and(|v| !v.trim().is_empty())) {
            v6_key
        } else {
            v4_key
        }
    };
    let pip_name = per_family(PIP_NAME, PIP_NAME_IPV6);
    for (fam, name) in &pip_name {
        arm_name(key_of(*fam, PIP_NAME, PIP_NAME_IPV6), NameKind::Network, name)?;
    }
    let pip_prefix_id = per_family(PIP_PREFIX_ID, PIP_PREFIX_ID_IPV6);
    for (fam, id) in &pip_prefix_id {
        prefix_id(key_of(*fam, PIP_PREFIX_ID, PIP_PREFIX_ID_IPV6), id)?;
    }

    let resource_group = a.get(RESOURCE_GROUP).map(|v| v.trim()).filter(|v| !v.is_empty());
    if let Some(rg) = resource_group {
        arm_name(RESOURCE_GROUP, NameKind::ResourceGroup, rg)?;
    }
    let dns_label = a.get(DNS_LABEL_NAME).cloned();
    let probe_protocol =
        match a.get(PROBE_PROTOCOL) {
            None => None,
            Some(v) => Some(ProbeProtocol::parse(v).ok_or_else(|| {
                invalid(PROBE_PROTOCOL, format!("{v:?} is not Tcp, Http or Https"))
            })?),
        };
    let idle_timeout = parse_int(a, TCP_IDLE_TIMEOUT, |n| {
        if (4..=100).contains(&n) {
            Ok(())
        } else {
            Err(format!("{n} is not a whole number of minutes between 4 and 100"))
        }
    })?
    .unwrap_or(DEFAULT_IDLE_TIMEOUT);

    let pip_tags = match a.get(PIP_TAGS) {
        Some(v) => parse_pairs(PIP_TAGS, v)?.into_iter().collect(),
        None => BTreeMap::new(),
    };
    let pip_ip_tags = match a.get(PIP_IP_TAGS) {
        Some(v) => Some(parse_pairs(PIP_IP_TAGS, v)?),
        None => None,
    };
    let additional_public_ips = match a.get(ADDITIONAL_PUBLIC_IPS) {
        Some(v) => additional_public_ips(v)?,
        None => Vec::new(),
    };

    let local_traffic = spec.external_traffic_policy.as_deref() == Some("Local");
    let health_check_node_port = spec.health_check_node_port.filter(|p| local_traffic && *p > 0);
    let health_check_probe = match health_check_node_port {
        Some(p) => {
            let (_, _, interval, num_of_probe) = probe_settings(a, p)?;
            PortProbe { interval, num_of_probe, ..PortProbe::default() }
        }
        None => PortProbe::default(),
    };

    let raw_ports = spec.ports.clone().unwrap_or_default();
    let mut ports = Vec::new();
    for p in &raw_ports {
        let protocol = match p.protocol.as_deref().unwrap_or("TCP") {
            "TCP" => Protocol::Tcp,
            "UDP" => Protocol::Udp,
            "SCTP" => Protocol::Sctp,
            other => {
                return Err(invalid(
                    "spec.ports",
                    format!("protocol {other:?} of port {} is not TCP, UDP or SCTP", p.port),
                ));
            }
        };
        if protocol == Protocol::Sctp && !internal {
            return Err(invalid(
                "spec.ports",
                format!("SCTP (port {}) is only supported on internal load balancers", p.port),
            ));
        }
        let probe_port_key = port_key(p.port, "health-probe_port");
        let probe_port = match a.get(&probe_port_key) {
            None => None,
            Some(v) => {
                let v = v.trim();
                if raw_ports
                    .iter()
                    .any(|q| q.name.as_deref().is_some_and(|n| n.eq_ignore_ascii_case(v)))
                {
                    Some(ProbePort::ServicePort(v.to_string()))
                } else {
                    let n: i32 = v.parse().map_err(|_| {
                        invalid(
                            &probe_port_key,
                            format!("{v:?} is neither a port of the Service nor a number"),
                        )
                    })?;
                    if !(0..=65535).contains(&n) {
                        return Err(invalid(&probe_port_key, format!("{n} is out of range")));
                    }
                    if raw_ports.iter().any(|q| q.port == n) {
                        Some(ProbePort::ServicePort(n.to_string()))
                    } else {
                        Some(ProbePort::Number(n))
                    }
                }
            }
        };
        let (protocol_override, request_path, interval, num_of_probe) = probe_settings(a, p.port)?;
        ports.push(PortConfig {
            name: p.name.clone().unwrap_or_default(),
            port: p.port,
            node_port: p.node_port.unwrap_or(0),
            protocol,
            app_protocol: p.app_protocol.clone(),
            no_lb_rule: parse_bool(a, &port_key(p.port, "no_lb_rule"))?,
            no_probe_rule: parse_bool(a, &port_key(p.port, "no_probe_rule"))?,
            probe: PortProbe {
                port: probe_port,
                protocol: protocol_override,
                request_path,
                interval,
                num_of_probe,
            },
        });
    }

    let ingress_ips = service
        .status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.as_deref().and_then(|ip| ip.parse().ok()))
        .collect();

    Ok(ServiceConfig {
        key: format!("{namespace}/{name}"),
        prefix: ccm_core::cloud::default_load_balancer_name(service),
        internal,
        internal_subnet,
        families,
        load_balancer_ip,
        pip_name,
        pip_prefix_id,
        resource_group: resource_group.map(str::to_string),
        dns_label,
        probe_protocol,
        probe_request_path: a.get(PROBE_REQUEST_PATH).cloned(),
        idle_timeout,
        tcp_reset: !parse_bool(a, DISABLE_TCP_RESET)?,
        floating_ip: !parse_bool(a, DISABLE_FLOATING_IP)?,
        ha_ports: parse_bool(a, HA_PORTS)?,
        pip_tags,
        pip_ip_tags,
        additional_public_ips,
        health_check_node_port,
        health_check_probe,
        local_traffic,
        client_ip_affinity: spec.session_affinity.as_deref() == Some("ClientIP"),
        ports,
        ingress_ips,
    })
}

/// `azure-additional-public-ips`: comma-separated public unicast addresses (duplicates
/// once). Anything else is an error naming the annotation.
pub fn additional_public_ips(value: &str) -> Result<Vec<IpAddr>, ProviderError> {
    let mut out: Vec<IpAddr> = Vec::new();
    for s in value.split(',').filter(|s| !s.trim().is_empty()) {
        let ip = parse_ip(ADDITIONAL_PUBLIC_IPS, s, None)?;
        if let Some(why) = not_public(&ip) {
            return Err(invalid(
                ADDITIONAL_PUBLIC_IPS,
                format!("{ip} is {why}: kube-proxy would capture in-cluster traffic to it"),
            ));
        }
        if !out.contains(&ip) {
            out.push(ip);
        }
    }
    Ok(out)
}

/// What deletion and lookups need, read leniently (a Service with a bad annotation must
/// still be deletable): the key, the prefix, the families. Everything else is default.
pub fn minimal(service: &Service) -> Result<ServiceConfig, ProviderError> {
    let uid = service.metadata.uid.as_deref().unwrap_or_default();
    if uid.is_empty() {
        return Err(invalid("metadata.uid", "the Service has no UID"));
    }
    let mut families: Vec<Family> = Vec::new();
    for f in service.spec.as_ref().and_then(|s| s.ip_families.as_ref()).into_iter().flatten() {
        let fam = if f == "IPv6" { Family::V6 } else { Family::V4 };
        if !families.contains(&fam) {
            families.push(fam);
        }
    }
    if families.is_empty() {
        families.push(Family::V4);
    }
    Ok(ServiceConfig {
        key: format!(
            "{}/{}",
            service.metadata.namespace.as_deref().unwrap_or_default(),
            service.metadata.name.as_deref().unwrap_or_default()
        ),
        prefix: ccm_core::cloud::default_load_balancer_name(service),
        families,
        ..ServiceConfig::default()
    })
}

/// What deletion needs, read leniently: a Service with a bad annotation must still be
/// deletable. The public IPs' resource group (or `None`); a value breaking ARM's rules is
/// `None` too (nothing was ever made there: [`parse`] refuses it).
pub fn resource_group_lenient(service: &Service) -> Option<String> {
    service
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(RESOURCE_GROUP))
        .map(|v| v.trim().to_string())
        .filter(|v| !v.is_empty())
        .filter(|v| names::check(NameKind::ResourceGroup, v).is_ok())
}

/// An annotation naming an ARM resource must follow ARM's rules for that type: it goes
/// into ARM URLs. The message names the rule broken, never the whole value.
fn arm_name(key: &str, kind: NameKind, value: &str) -> Result<(), ProviderError> {
    names::check(kind, value).map_err(|m| invalid(key, m))
}

/// A public IP prefix's resource ID:
/// `/subscriptions/<s>/resourceGroups/<rg>/providers/Microsoft.Network/publicIPPrefixes/<name>`
/// exactly (its name is part of the public IP's name, which goes into URLs).
fn prefix_id(key: &str, id: &str) -> Result<(), ProviderError> {
    let shape = || {
        invalid(
            key,
            "not a public IP prefix resource ID (/subscriptions/<subscription>/resourceGroups/<group>/providers/Microsoft.Network/publicIPPrefixes/<name>)",
        )
    };
    let parts: Vec<&str> = id.strip_prefix('/').ok_or_else(shape)?.split('/').collect();
    let [subs, sub, rgs, rg, providers, ns, ty, name] = parts.as_slice() else {
        return Err(shape());
    };
    let is = |have: &str, want: &str| have.eq_ignore_ascii_case(want);
    if !is(subs, "subscriptions")
        || !is(rgs, "resourceGroups")
        || !is(providers, "providers")
        || !is(ns, "Microsoft.Network")
        || !is(ty, "publicIPPrefixes")
    {
        return Err(shape());
    }
    if sub.is_empty() || !sub.chars().all(|c| c.is_ascii_hexdigit() || c == '-') {
        return Err(invalid(key, "the subscription is not a subscription ID"));
    }
    arm_name(key, NameKind::ResourceGroup, rg)?;
    arm_name(key, NameKind::Network, name)
}

/// Why an address is not one a public IP resource can have (and kube-proxy must never
/// capture): `None` for a public unicast address.
pub fn not_public(ip: &IpAddr) -> Option<&'static str> {
    match ip {
        IpAddr::V4(v4) => {
            let o = v4.octets();
            if v4.is_unspecified() || o[0] == 0 {
                Some("unspecified (0.0.0.0/8)")
            } else if v4.is_loopback() {
                Some("a loopback address")
            } else if v4.is_link_local() {
                Some("a link-local address (169.254.0.0/16, the instance metadata service's)")
            } else if v4.is_private() {
                Some("a private address")
            } else if o[0] == 100 && (o[1] & 0xc0) == 64 {
                Some("a shared (carrier-grade NAT) address")
            } else if v4.is_multicast() {
                Some("a multicast address")
            } else if o[0] >= 240 {
                Some("a reserved or broadcast address")
            } else {
                None
            }
        }
        IpAddr::V6(v6) => {
            if let Some(v4) = v6.to_ipv4_mapped() {
                return not_public(&IpAddr::V4(v4)).or(Some("an IPv4-mapped address"));
            }
            let first = v6.segments()[0];
            if v6.is_unspecified() {
                Some("unspecified (::)")
            } else if v6.is_loopback() {
                Some("a loopback address")
            } else if v6.is_multicast() {
                Some("a multicast address")
            } else if (first & 0xffc0) == 0xfe80 || (first & 0xffc0) == 0xfec0 {
                Some("a link-local address")
            } else if (first & 0xfe00) == 0xfc00 {
                Some("a private (unique local) address")
            } else {
                None
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{ServicePort, ServiceSpec};
    use kube::api::ObjectMeta;

    pub(crate) fn svc(annotations: &[(&str, &str)], ports: &[(i32, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("6f7f1b2c-1234-5678-9abc-def012345678".into()),
                annotations: Some(
                    annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                ),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(
                    ports
                        .iter()
                        .map(|(p, proto)| ServicePort {
                            name: Some(format!("p{p}")),
                            port: *p,
                            node_port: Some(30000 + p),
                            protocol: Some(proto.to_string()),
                            ..Default::default()
                        })
                        .collect(),
                ),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn err_what(r: Result<ServiceConfig, ProviderError>) -> String {
        match r {
            Err(ProviderError::Invalid { what, .. }) => what,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_upstreams() {
        let c = parse(&svc(&[], &[(80, "TCP")])).unwrap();
        assert_eq!(c.key, "default/web");
        assert_eq!(c.prefix, "a6f7f1b2c123456789abcdef01234567");
        assert!(!c.internal);
        assert_eq!(c.families, vec![Family::V4]);
        assert_eq!(c.idle_timeout, 4);
        assert!(c.tcp_reset && c.floating_ip && !c.ha_ports);
        assert_eq!(c.ports[0].probe.interval, 5);
        assert_eq!(c.ports[0].probe.num_of_probe, 2);
    }

    #[test]
    fn booleans_accept_any_case_and_refuse_garbage() {
        let c = parse(&svc(&[(INTERNAL, "True")], &[(80, "TCP")])).unwrap();
        assert!(c.internal);
        assert_eq!(err_what(parse(&svc(&[(INTERNAL, "yes")], &[(80, "TCP")]))), INTERNAL);
        let key = port_key(80, "no_lb_rule");
        assert_eq!(err_what(parse(&svc(&[(key.as_str(), "1")], &[(80, "TCP")]))), key);
    }

    #[test]
    fn idle_timeout_range_is_4_to_100() {
        for ok in ["4", "100", " 30 "] {
            assert!(parse(&svc(&[(TCP_IDLE_TIMEOUT, ok)], &[(80, "TCP")])).is_ok(), "{ok}");
        }
        for bad in ["3", "101", "x", ""] {
            assert_eq!(
                err_what(parse(&svc(&[(TCP_IDLE_TIMEOUT, bad)], &[(80, "TCP")]))),
                TCP_IDLE_TIMEOUT
            );
        }
    }

    #[test]
    fn probe_limits_name_the_annotation() {
        let k = port_key(80, "health-probe_interval");
        assert_eq!(err_what(parse(&svc(&[(k.as_str(), "4")], &[(80, "TCP")]))), k);
        assert_eq!(
            err_what(parse(&svc(&[(PROBE_NUM_OF_PROBE, "1")], &[(80, "TCP")]))),
            PROBE_NUM_OF_PROBE
        );
        let what = err_what(parse(&svc(
            &[(PROBE_INTERVAL, "60"), (PROBE_NUM_OF_PROBE, "2")],
            &[(80, "TCP")],
        )));
        assert!(what.contains(PROBE_INTERVAL) && what.contains(PROBE_NUM_OF_PROBE), "{what}");
        assert_eq!(
            err_what(parse(&svc(&[(PROBE_PROTOCOL, "htp")], &[(80, "TCP")]))),
            PROBE_PROTOCOL
        );
        let c =
            parse(&svc(&[(PROBE_INTERVAL, "10"), (k.as_str(), "7")], &[(80, "TCP"), (81, "TCP")]))
                .unwrap();
        assert_eq!((c.ports[0].probe.interval, c.ports[1].probe.interval), (7, 10));
    }

    #[test]
    fn probe_port_is_a_port_name_a_service_port_or_a_number() {
        let k = port_key(80, "health-probe_port");
        let c = parse(&svc(&[(k.as_str(), "p81")], &[(80, "TCP"), (81, "TCP")])).unwrap();
        assert_eq!(c.ports[0].probe.port, Some(ProbePort::ServicePort("p81".into())));
        let c = parse(&svc(&[(k.as_str(), "10256")], &[(80, "TCP")])).unwrap();
        assert_eq!(c.ports[0].probe.port, Some(ProbePort::Number(10256)));
        assert_eq!(err_what(parse(&svc(&[(k.as_str(), "nope")], &[(80, "TCP")]))), k);
    }

    #[test]
    fn addresses_are_checked_per_family() {
        assert_eq!(err_what(parse(&svc(&[(IPV4, "fd00::1")], &[(80, "TCP")]))), IPV4);
        assert_eq!(err_what(parse(&svc(&[(IPV4, "10.0.0")], &[(80, "TCP")]))), IPV4);
        let mut s = svc(&[], &[(80, "TCP")]);
        s.spec.as_mut().unwrap().load_balancer_ip = Some("10.1.2.3".into());
        let c = parse(&s).unwrap();
        assert_eq!(c.load_balancer_ip[&Family::V4].to_string(), "10.1.2.3");
        // The annotation wins over the spec field.
        s.metadata.annotations.as_mut().unwrap().insert(IPV4.into(), "10.9.9.9".into());
        assert_eq!(parse(&s).unwrap().load_balancer_ip[&Family::V4].to_string(), "10.9.9.9");
        assert_eq!(
            err_what(parse(&svc(&[(ADDITIONAL_PUBLIC_IPS, "1.2.3.4,bad")], &[(80, "TCP")]))),
            ADDITIONAL_PUBLIC_IPS
        );
    }

    #[test]
    fn annotations_naming_arm_resources_follow_arms_rules() {
        let internal = |k: &'static str, v: &'static str| [(INTERNAL, "true"), (k, v)];
        for (key, bad) in [
            (PIP_NAME, "../networkSecurityGroups/k8s-nsg"),
            (PIP_NAME, "pip?api-version=2019-02-01"),
            (PIP_NAME, "pip#"),
            (PIP_NAME, "a/b"),
            (PIP_NAME, "-pip"),
            (RESOURCE_GROUP, "rg/providers/Microsoft.Network/networkSecurityGroups/k8s-nsg?x="),
            (RESOURCE_GROUP, ".."),
            (RESOURCE_GROUP, "rg."),
            (RESOURCE_GROUP, "rg%2f"),
            (
                PIP_PREFIX_ID,
                "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/publicIPPrefixes/p?api-version=1",
            ),
            (
                PIP_PREFIX_ID,
                "/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Network/publicIPPrefixes/p/../x",
            ),
            (
                PIP_PREFIX_ID,
                "/subscriptions/0000/resourceGroups/../providers/Microsoft.Network/publicIPPrefixes/p",
            ),
        ] {
            let r = parse(&svc(&[(key, bad)], &[(80, "TCP")]));
            let message = format!("{r:?}");
            assert_eq!(err_what(r), key, "{key}={bad:?}");
            if bad.len() > 8 {
                assert!(!message.contains(bad), "the value is quoted back: {message}");
            }
        }
        for bad in ["../../../networkSecurityGroups/k8s-nsg", "s?x", "s#"] {
            let a = internal(INTERNAL_SUBNET, bad);
            assert_eq!(err_what(parse(&svc(&a, &[(80, "TCP")]))), INTERNAL_SUBNET, "{bad:?}");
        }
        // The subnet annotation is not read (nor checked) on public Services.
        assert!(parse(&svc(&[(INTERNAL_SUBNET, "a/b")], &[(80, "TCP")])).is_ok());
        // The -ipv6 key is named for the IPv6 name.
        let mut s = svc(&[(PIP_NAME_IPV6, "bad/name")], &[(80, "TCP")]);
        s.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into()]);
        assert_eq!(err_what(parse(&s)), PIP_NAME_IPV6);
        let ok = parse(&svc(
            &[(PIP_NAME, "my-service.pip_"), (RESOURCE_GROUP, "MC_rg_(prod)")],
            &[(80, "TCP")],
        ))
        .unwrap();
        assert_eq!(ok.resource_group.as_deref(), Some("MC_rg_(prod)"));
        // Deletion reads a bad resource group as none.
        assert_eq!(resource_group_lenient(&svc(&[(RESOURCE_GROUP, "a/../b")], &[])), None);
        assert_eq!(
            resource_group_lenient(&svc(&[(RESOURCE_GROUP, " rg2 ")], &[])).as_deref(),
            Some("rg2")
        );
    }

    #[test]
    fn additional_public_ips_are_never_special_addresses() {
        for bad in [
            "169.254.169.254",
            "127.0.0.1",
            "10.0.0.1",
            "172.16.0.1",
            "192.168.1.1",
            "100.64.0.1",
            "0.0.0.0",
            "224.0.0.1",
            "255.255.255.255",
            "::1",
            "::",
            "fe80::1",
            "fd00::1",
            "ff02::1",
            "::ffff:169.254.169.254",
            "::ffff:20.1.2.3",
        ] {
            let r = parse(&svc(&[(ADDITIONAL_PUBLIC_IPS, bad)], &[(80, "TCP")]));
            assert_eq!(err_what(r), ADDITIONAL_PUBLIC_IPS, "{bad}");
        }
        let c =
            parse(&svc(&[(ADDITIONAL_PUBLIC_IPS, "20.30.40.50, 2603:1030::5")], &[(80, "TCP")]))
                .unwrap();
        assert_eq!(c.additional_public_ips.len(), 2);
    }

    #[test]
    fn pip_names_follow_the_families() {
        let mut s = svc(&[(PIP_NAME, "v4"), (PIP_NAME_IPV6, "v6")], &[(80, "TCP")]);
        assert_eq!(parse(&s).unwrap().pip_name, BTreeMap::from([(Family::V4, "v4".to_string())]));
        s.spec.as_mut().unwrap().ip_families = Some(vec!["IPv6".into()]);
        assert_eq!(parse(&s).unwrap().pip_name, BTreeMap::from([(Family::V6, "v6".to_string())]));
        s.spec.as_mut().unwrap().ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        let c = parse(&s).unwrap();
        assert!(c.dual_stack());
        assert_eq!(c.pip_name.len(), 2);
    }

    #[test]
    fn tags_and_unsupported_features() {
        let c = parse(&svc(&[(PIP_TAGS, "a=b, c = d ,")], &[(80, "TCP")])).unwrap();
        assert_eq!(c.pip_tags.get("c").map(String::as_str), Some("d"));
        assert_eq!(err_what(parse(&svc(&[(PIP_TAGS, "a=b=c")], &[(80, "TCP")]))), PIP_TAGS);
        // A PLS needs an internal Service (or floating IP disabled); the PLS annotations are
        // checked here too.
        assert_eq!(err_what(parse(&svc(&[(PLS_CREATE, "true")], &[(80, "TCP")]))), PLS_CREATE);
        assert!(parse(&svc(&[(PLS_CREATE, "true"), (INTERNAL, "true")], &[(80, "TCP")])).is_ok());
        assert!(
            parse(&svc(&[(PLS_CREATE, "true"), (DISABLE_FLOATING_IP, "true")], &[(80, "TCP")]))
                .is_ok()
        );
        let bad_count = svc(
            &[
                (PLS_CREATE, "true"),
                (INTERNAL, "true"),
                (super::super::pls::IP_CONFIGURATION_IP_ADDRESS_COUNT, "9"),
            ],
            &[(80, "TCP")],
        );
        assert_eq!(
            err_what(parse(&bad_count)),
            super::super::pls::IP_CONFIGURATION_IP_ADDRESS_COUNT
        );
        assert_eq!(err_what(parse(&svc(&[], &[(80, "SCTP")]))), "spec.ports");
        assert!(parse(&svc(&[(INTERNAL, "true")], &[(80, "SCTP")])).is_ok());
        assert!(parse(&svc(&[(LOAD_BALANCER_MODE, "__auto__")], &[(80, "TCP")])).is_ok());
    }

    #[test]
    fn the_configurations_annotation_is_ignored_only_with_one_load_balancer() {
        let s = svc(&[(LOAD_BALANCER_CONFIGURATIONS, "lb-a")], &[(80, "TCP")]);
        assert_eq!(ignored(&s, false), vec![LOAD_BALANCER_CONFIGURATIONS]);
        assert!(ignored(&s, true).is_empty(), "several load balancers: it places the Service");
        let both = svc(
            &[(LOAD_BALANCER_CONFIGURATIONS, "lb-a"), (LOAD_BALANCER_MODE, "as")],
            &[(80, "TCP")],
        );
        assert_eq!(ignored(&both, true), vec![LOAD_BALANCER_MODE]);
        assert_eq!(ignored(&both, false), vec![LOAD_BALANCER_MODE, LOAD_BALANCER_CONFIGURATIONS]);
        assert!(ignored(&svc(&[], &[(80, "TCP")]), false).is_empty());
    }

    /// `svc` as IPv4, and as dual-stack (so the `-ipv6` keys are read too).
    fn both_stacks(annotations: &[(&str, &str)]) -> [Service; 2] {
        let v4 = svc(annotations, &[(80, "TCP")]);
        let mut dual = v4.clone();
        if let Some(spec) = dual.spec.as_mut() {
            spec.ip_families = Some(vec!["IPv4".into(), "IPv6".into()]);
        }
        [v4, dual]
    }

    #[test]
    fn every_documented_annotation_example_is_accepted_unless_refused() {
        use super::super::security_group::access;
        for k in ANNOTATIONS {
            let key = k.key.replace("<port>", "80");
            for s in both_stacks(&[(key.as_str(), k.example)]) {
                if k.doc.starts_with("Refused") {
                    assert_eq!(err_what(parse(&s)), key, "{key} = {:?}", k.example);
                } else if let Err(e) = parse(&s) {
                    panic!("{key} = {:?}: {e}", k.example);
                }
                if let Err(e) = access(&s) {
                    panic!("{key} = {:?}: security group: {e}", k.example);
                }
            }
        }
    }

    #[test]
    fn annotations_lists_every_key_read() {
        use super::super::security_group as sg;
        for key in [
            INTERNAL,
            INTERNAL_SUBNET,
            IPV4,
            IPV6,
            PIP_NAME,
            PIP_NAME_IPV6,
            PIP_PREFIX_ID,
            PIP_PREFIX_ID_IPV6,
            RESOURCE_GROUP,
            DNS_LABEL_NAME,
            PROBE_PROTOCOL,
            PROBE_REQUEST_PATH,
            PROBE_INTERVAL,
            PROBE_NUM_OF_PROBE,
            TCP_IDLE_TIMEOUT,
            DISABLE_TCP_RESET,
            DISABLE_FLOATING_IP,
            HA_PORTS,
            PIP_TAGS,
            PIP_IP_TAGS,
            ADDITIONAL_PUBLIC_IPS,
            PLS_CREATE,
            LOAD_BALANCER_MODE,
            LOAD_BALANCER_CONFIGURATIONS,
            sg::DISABLE_NSG_RULE,
            sg::ALLOWED_SERVICE_TAGS,
            sg::ALLOWED_IP_RANGES,
            sg::DENY_ALL_EXCEPT_SOURCE_RANGES,
            sg::SOURCE_RANGES_ANNOTATION,
        ] {
            assert!(
                ccm_core::reference::has_key(ANNOTATIONS, key)
                    || ccm_core::reference::has_key(super::super::pls::PLS_ANNOTATIONS, key),
                "{key} is not documented"
            );
        }
        for k in super::super::pls::PLS_ANNOTATIONS {
            assert!(!ccm_core::reference::has_key(ANNOTATIONS, k.key), "{} twice", k.key);
        }
        let keys: std::collections::BTreeSet<&str> = ANNOTATIONS.iter().map(|k| k.key).collect();
        assert_eq!(keys.len(), ANNOTATIONS.len(), "an annotation is documented twice");
        // The per-port keys are the ones the parser builds: a bad value is an error naming the
        // key (every one but the free-form request path).
        for k in ANNOTATIONS.iter().filter(|k| k.key.contains("<port>")) {
            let key = k.key.replace("<port>", "80");
            assert!(key.starts_with(&port_key(80, "")), "{key}");
            if !key.ends_with("_request-path") {
                let what = err_what(parse(&svc(&[(key.as_str(), "not valid")], &[(80, "TCP")])));
                assert!(what.contains(&key), "{key}: {what}");
            }
        }
    }
}
