//! The Service annotations upstream reads (`pkg/openstack/loadbalancer.go`), their
//! documentation table, and [`ServiceConfig`]: everything a Service asks of its load balancer,
//! resolved against `[LoadBalancer]` and `[LoadBalancerClass "name"]` and checked before any
//! cloud call.
//!
//! Differences from upstream, on purpose: a value upstream would silently replace by its
//! default (a non-numeric timeout, a boolean other than `true`/`false`, an unknown
//! `proxy-protocol`) or pass on to Octavia (an unknown `lb-method`) is a
//! [`ProviderError::Invalid`] naming the annotation and the value.

use std::collections::BTreeMap;

use ccm_core::cloud::ProviderError;
use ccm_core::reference::{KeyDoc, has_key};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Node, Service};

use crate::config::{Config, LoadBalancerClass};

/// The annotation keys.
pub mod keys {
    /// `true`: no floating IP (the VIP is the address).
    pub const INTERNAL: &str = "service.beta.kubernetes.io/openstack-internal-load-balancer";
    /// `k=v,k2=v2` (or `k`): only matching Nodes are members.
    pub const NODE_SELECTOR: &str = "loadbalancer.openstack.org/node-selector";
    /// Listener connection limit (`-1`: unlimited).
    pub const CONNECTION_LIMIT: &str = "loadbalancer.openstack.org/connection-limit";
    /// The external network of the floating IP.
    pub const FLOATING_NETWORK_ID: &str = "loadbalancer.openstack.org/floating-network-id";
    /// A name pattern of the floating IP's subnet.
    pub const FLOATING_SUBNET: &str = "loadbalancer.openstack.org/floating-subnet";
    /// The floating IP's subnet.
    pub const FLOATING_SUBNET_ID: &str = "loadbalancer.openstack.org/floating-subnet-id";
    /// Tags of the floating IP's subnet.
    pub const FLOATING_SUBNET_TAGS: &str = "loadbalancer.openstack.org/floating-subnet-tags";
    /// A `[LoadBalancerClass "name"]`.
    pub const CLASS: &str = "loadbalancer.openstack.org/class";
    /// Keep the floating IP when the Service is deleted.
    pub const KEEP_FLOATING_IP: &str = "loadbalancer.openstack.org/keep-floatingip";
    /// The VIP port.
    pub const PORT_ID: &str = "loadbalancer.openstack.org/port-id";
    /// The pools' algorithm.
    pub const LB_METHOD: &str = "loadbalancer.openstack.org/lb-method";
    /// PROXY protocol (`true`/`v1`, `v2`).
    pub const PROXY_PROTOCOL: &str = "loadbalancer.openstack.org/proxy-protocol";
    /// The VIP subnet.
    pub const SUBNET_ID: &str = "loadbalancer.openstack.org/subnet-id";
    /// The VIP network.
    pub const NETWORK_ID: &str = "loadbalancer.openstack.org/network-id";
    /// The members' subnet.
    pub const MEMBER_SUBNET_ID: &str = "loadbalancer.openstack.org/member-subnet-id";
    /// Listener client inactivity timeout (ms).
    pub const TIMEOUT_CLIENT_DATA: &str = "loadbalancer.openstack.org/timeout-client-data";
    /// Listener member connect timeout (ms).
    pub const TIMEOUT_MEMBER_CONNECT: &str = "loadbalancer.openstack.org/timeout-member-connect";
    /// Listener member inactivity timeout (ms).
    pub const TIMEOUT_MEMBER_DATA: &str = "loadbalancer.openstack.org/timeout-member-data";
    /// Listener TCP inspection wait (ms).
    pub const TIMEOUT_TCP_INSPECT: &str = "loadbalancer.openstack.org/timeout-tcp-inspect";
    /// HTTP listeners inserting `X-Forwarded-For`.
    pub const X_FORWARDED_FOR: &str = "loadbalancer.openstack.org/x-forwarded-for";
    /// The Octavia flavor.
    pub const FLAVOR_ID: &str = "loadbalancer.openstack.org/flavor-id";
    /// The Octavia availability zone.
    pub const AVAILABILITY_ZONE: &str = "loadbalancer.openstack.org/availability-zone";
    /// Health monitors on or off (default `[LoadBalancer] create-monitor`).
    pub const ENABLE_HEALTH_MONITOR: &str = "loadbalancer.openstack.org/enable-health-monitor";
    /// Health monitor delay (s).
    pub const HEALTH_MONITOR_DELAY: &str = "loadbalancer.openstack.org/health-monitor-delay";
    /// Health monitor timeout (s).
    pub const HEALTH_MONITOR_TIMEOUT: &str = "loadbalancer.openstack.org/health-monitor-timeout";
    /// Health monitor retries before up.
    pub const HEALTH_MONITOR_MAX_RETRIES: &str =
        "loadbalancer.openstack.org/health-monitor-max-retries";
    /// Health monitor retries before down.
    pub const HEALTH_MONITOR_MAX_RETRIES_DOWN: &str =
        "loadbalancer.openstack.org/health-monitor-max-retries-down";
    /// A hostname reported instead of the address.
    pub const HOSTNAME: &str = "loadbalancer.openstack.org/hostname";
    /// Written back with the address (an output; read by nobody), as upstream.
    pub const LOAD_BALANCER_ADDRESS: &str = "loadbalancer.openstack.org/load-balancer-address";
    /// TLS termination: `TERMINATED_HTTPS` listeners with this Barbican container or secret.
    pub const DEFAULT_TLS_CONTAINER_REF: &str =
        "loadbalancer.openstack.org/default-tls-container-ref";
    /// Use (adopt or share) this existing Octavia load balancer.
    pub const LOAD_BALANCER_ID: &str = "loadbalancer.openstack.org/load-balancer-id";
    /// Source ranges when `spec.loadBalancerSourceRanges` is empty (Kubernetes' annotation).
    pub const SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";
}

use ccm_core::reference::annotation as kd;

/// Every annotation the provider reads, with its documentation: [`annotation`] reads only
/// keys listed here (checked in debug builds and so by every test), and the tests feed every
/// example back into [`ServiceConfig::parse`]. `ccm-docgen` can render it as the reference.
pub const ANNOTATIONS: &[KeyDoc] = &[
    kd(
        keys::INTERNAL,
        "`true`/`false`, default `[LoadBalancer] internal-lb`",
        "true",
        "No floating IP: the load balancer's VIP is its address. `[LoadBalancer] internal-lb = true` forces it.",
    ),
    kd(
        keys::CLASS,
        "name of a `[LoadBalancerClass \"name\"]`",
        "",
        "Take floating-network/subnet, network, subnet and member-subnet settings from that class. An unknown class is an error.",
    ),
    kd(
        keys::FLOATING_NETWORK_ID,
        "network ID, default class / `[LoadBalancer] floating-network-id` / the only external network",
        "a2c1f0e4-0000-4000-8000-000000000001",
        "The external network the floating IP is allocated from.",
    ),
    kd(
        keys::FLOATING_SUBNET_ID,
        "subnet ID",
        "a2c1f0e4-0000-4000-8000-000000000002",
        "The floating IP's subnet (must be on the floating network); wins over `floating-subnet` and `floating-subnet-tags`.",
    ),
    kd(
        keys::FLOATING_SUBNET,
        "subnet name glob (`*`, `?`) or, after `~`, a regular expression (RE2 syntax, matching the whole name); `!` first negates",
        "public-*",
        "The first subnet of the floating network whose name matches and has a free address.",
    ),
    kd(
        keys::FLOATING_SUBNET_TAGS,
        "comma-separated tags; `&` all of them, `!` none of them",
        "fip-pool",
        "Floating IP subnets carrying these tags.",
    ),
    kd(
        keys::SUBNET_ID,
        "subnet ID, default class / `[LoadBalancer] subnet-id` / a node's subnet",
        "a2c1f0e4-0000-4000-8000-000000000003",
        "The VIP subnet (set at creation).",
    ),
    kd(
        keys::NETWORK_ID,
        "network ID, default class / `[LoadBalancer] network-id`",
        "a2c1f0e4-0000-4000-8000-000000000004",
        "The VIP network (set at creation).",
    ),
    kd(
        keys::MEMBER_SUBNET_ID,
        "subnet ID, default class / `[LoadBalancer] member-subnet-id`",
        "a2c1f0e4-0000-4000-8000-000000000005",
        "The subnet of the members (nodes' addresses).",
    ),
    kd(
        keys::PORT_ID,
        "port ID",
        "a2c1f0e4-0000-4000-8000-000000000006",
        "Use this existing Neutron port as the VIP (set at creation).",
    ),
    kd(
        keys::KEEP_FLOATING_IP,
        "`true`/`false`, default `false`",
        "true",
        "Keep (only disassociate) the floating IP when the Service is deleted or becomes internal. Only the value on the Service the load balancer was created for counts; a sharing Service never deletes a floating IP.",
    ),
    kd(
        keys::PROXY_PROTOCOL,
        "`true`/`v1` (PROXY), `v2` (PROXYV2), `false`",
        "v2",
        "Pools speak the PROXY protocol; the status reports the IP with `ipMode: Proxy` (or a hostname with `enable-ingress-hostname`).",
    ),
    kd(
        keys::X_FORWARDED_FOR,
        "`true`/`false`, default `false`",
        "true",
        "HTTP listeners and pools inserting `X-Forwarded-For` (changing it re-creates the listeners). Not with `proxy-protocol`.",
    ),
    kd(
        keys::LB_METHOD,
        "`ROUND_ROBIN`, `LEAST_CONNECTIONS`, `SOURCE_IP`, `SOURCE_IP_PORT`; default `[LoadBalancer] lb-method`",
        "LEAST_CONNECTIONS",
        "The pools' algorithm (updated in place).",
    ),
    kd(
        keys::TIMEOUT_CLIENT_DATA,
        "milliseconds, default 50000",
        "60000",
        "Listener client inactivity timeout (updated in place; ignored with `lb-provider = ovn`).",
    ),
    kd(
        keys::TIMEOUT_MEMBER_CONNECT,
        "milliseconds, default 5000",
        "6000",
        "Listener member connection timeout (updated in place; ignored with `lb-provider = ovn`).",
    ),
    kd(
        keys::TIMEOUT_MEMBER_DATA,
        "milliseconds, default 50000",
        "60000",
        "Listener member inactivity timeout (updated in place; ignored with `lb-provider = ovn`).",
    ),
    kd(
        keys::TIMEOUT_TCP_INSPECT,
        "milliseconds, default 0",
        "100",
        "Listener TCP content inspection wait (updated in place; ignored with `lb-provider = ovn`).",
    ),
    kd(
        keys::CONNECTION_LIMIT,
        "integer, `-1` (default) unlimited",
        "1000",
        "Listener connection limit (updated in place).",
    ),
    kd(
        keys::ENABLE_HEALTH_MONITOR,
        "`true`/`false`, default `[LoadBalancer] create-monitor`",
        "true",
        "A health monitor per pool (TCP, UDP-CONNECT for UDP, HTTP `/healthz` on the health-check node port for `externalTrafficPolicy: Local`); created and deleted as it changes.",
    ),
    kd(
        keys::HEALTH_MONITOR_DELAY,
        "seconds, default `[LoadBalancer] monitor-delay`",
        "10",
        "Health monitor delay.",
    ),
    kd(
        keys::HEALTH_MONITOR_TIMEOUT,
        "seconds, default `[LoadBalancer] monitor-timeout`",
        "5",
        "Health monitor timeout (less than the delay).",
    ),
    kd(
        keys::HEALTH_MONITOR_MAX_RETRIES,
        "integer, default `[LoadBalancer] monitor-max-retries`",
        "2",
        "Health monitor successes before a member is up.",
    ),
    kd(
        keys::HEALTH_MONITOR_MAX_RETRIES_DOWN,
        "integer, default `[LoadBalancer] monitor-max-retries-down`",
        "4",
        "Health monitor failures before a member is down.",
    ),
    kd(
        keys::FLAVOR_ID,
        "Octavia flavor ID, default `[LoadBalancer] flavor-id`",
        "a2c1f0e4-0000-4000-8000-000000000007",
        "The load balancer's flavor (set at creation; ignored with `lb-provider = ovn`).",
    ),
    kd(
        keys::AVAILABILITY_ZONE,
        "Octavia availability zone, default `[LoadBalancer] availability-zone`",
        "az-1",
        "The load balancer's availability zone (set at creation; ignored with `lb-provider = ovn`).",
    ),
    kd(
        keys::LOAD_BALANCER_ID,
        "Octavia load balancer ID",
        "a2c1f0e4-0000-4000-8000-000000000008",
        "Use this existing load balancer: this Service's own when this cluster created it for this Service (name and description), else shared (only this Service's listeners, tagged with its name, are added and removed; at most `[LoadBalancer] max-shared-lb` Services; external Services only). One created for a Service of another namespace, by another cluster or by hand is refused unless `[LoadBalancer] allow-cross-namespace-sharing = true`. A sharer never deletes the load balancer nor its floating IP (the last sharer of one whose own Service was deleted does, as upstream). Sharing needs Octavia API ≥ 2.5 (tags). Written back with the load balancer's ID once it is found or created, as upstream.",
    ),
    kd(
        keys::HOSTNAME,
        "hostname",
        "lb.example.com",
        "Report this hostname instead of the address in the Service status.",
    ),
    kd(
        keys::LOAD_BALANCER_ADDRESS,
        "(output)",
        "",
        "Written back with the load balancer's address (its floating IP, else its VIP) after each successful ensure, as upstream; read by nobody.",
    ),
    kd(
        keys::NODE_SELECTOR,
        "`k=v,k2=v2` (`k` alone: the label exists), default `[LoadBalancer] node-selector`",
        "env=production, region=default",
        "Only Nodes with all these labels are members.",
    ),
    kd(
        keys::DEFAULT_TLS_CONTAINER_REF,
        "Barbican container or secret URL (`https://<key-manager>/v1/containers/<uuid>` or `…/v1/secrets/<uuid>`; any text with `[LoadBalancer] container-store = external`), default `[LoadBalancer] default-tls-container-ref`",
        "https://barbican.example.com/v1/containers/a2c1f0e4-0000-4000-8000-000000000009",
        "TLS termination, as upstream: every listener of the Service is `TERMINATED_HTTPS` with this `default_tls_container_ref` (its pool HTTP, or PROXY/PROXYV2 with `proxy-protocol`); changing it updates the listeners in place, adding or removing it re-creates them. With `container-store = barbican` (the default) the reference must end in `containers/<id>` or `secrets/<id>` and is read from Barbican first (as upstream; metadata only), so the CCM's user must be able to read it (its project with the default ACL, or the container's ACL naming the user): a missing (404) or unreadable (403) reference fails the sync with an error naming this annotation and the reference, before any Octavia call.",
    ),
    kd(
        keys::SOURCE_RANGES,
        "comma-separated CIDRs (when `spec.loadBalancerSourceRanges` is empty)",
        "10.0.0.0/8,192.168.0.0/16",
        "The listeners' `allowed_cidrs` (default all).",
    ),
];

/// A Service annotation; `None` when absent. Only keys of [`ANNOTATIONS`] may be read.
pub fn annotation<'a>(service: &'a Service, key: &str) -> Option<&'a str> {
    debug_assert!(has_key(ANNOTATIONS, key), "annotation {key} is not in ANNOTATIONS");
    service.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

fn invalid(what: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::Invalid { what: what.to_string(), message: message.into() }
}

/// A boolean annotation: `true`/`false` (any case); absent or empty → `default`.
pub fn bool_annotation(service: &Service, key: &str, default: bool) -> Result<bool, ProviderError> {
    match annotation(service, key).map(str::trim) {
        None | Some("") => Ok(default),
        Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
        Some(v) => Err(invalid(key, format!("{v:?} is not a boolean (\"true\" or \"false\")"))),
    }
}

fn int_annotation(
    service: &Service,
    key: &str,
    default: i64,
    min: i64,
) -> Result<i64, ProviderError> {
    match annotation(service, key).map(str::trim) {
        None | Some("") => Ok(default),
        Some(v) => match v.parse::<i64>() {
            Ok(n) if n >= min && n <= i64::from(i32::MAX) => Ok(n),
            Ok(_) => Err(invalid(key, format!("{v:?} is out of range (at least {min})"))),
            Err(_) => Err(invalid(key, format!("{v:?} is not an integer"))),
        },
    }
}

/// A string annotation, trimmed; absent → `default`. Upstream: a present but empty annotation
/// wins over the config (it can clear a setting).
pub(crate) fn str_annotation(service: &Service, key: &str, default: &str) -> String {
    match annotation(service, key) {
        Some(v) => v.trim().to_string(),
        None => default.to_string(),
    }
}

/// The pools' algorithms Octavia knows.
pub const LB_METHODS: [&str; 4] =
    ["ROUND_ROBIN", "LEAST_CONNECTIONS", "SOURCE_IP", "SOURCE_IP_PORT"];

/// The PROXY protocol version of the pools.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProxyProtocol {
    /// `PROXY` (v1).
    V1,
    /// `PROXYV2`.
    V2,
}

impl ProxyProtocol {
    /// The Octavia pool protocol.
    pub fn pool_protocol(self) -> &'static str {
        match self {
            ProxyProtocol::V1 => "PROXY",
            ProxyProtocol::V2 => "PROXYV2",
        }
    }
}

/// The IP family of the Service (its first `spec.ipFamilies` entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpFamily {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// Where a floating IP's subnet comes from (`floating-subnet-id`, or a name pattern and tags).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FloatingSubnetSpec {
    /// An explicit subnet.
    pub subnet_id: String,
    /// A name glob (`!` negates).
    pub subnet: String,
    /// Tags (`&` all, `!` none; default any).
    pub subnet_tags: String,
}

impl FloatingSubnetSpec {
    /// Anything set.
    pub fn configured(&self) -> bool {
        !self.subnet_id.is_empty() || self.matcher_configured()
    }

    /// A pattern or tags (and no explicit subnet).
    pub fn matcher_configured(&self) -> bool {
        self.subnet_id.is_empty() && (!self.subnet.is_empty() || !self.subnet_tags.is_empty())
    }

    /// The tag list and its mode: (tags, negated, all).
    pub fn tags(&self) -> (Vec<String>, bool, bool) {
        let mut t = self.subnet_tags.as_str();
        let not = t.starts_with('!');
        if not {
            t = &t[1..];
        }
        let all = t.starts_with('&');
        if all {
            t = &t[1..];
        }
        let list = t.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string);
        (list.collect(), not, all)
    }

    /// The Neutron subnet list filter for the tags (as upstream's `tweakListOpts`).
    pub fn tag_filter(&self) -> Option<(&'static str, String)> {
        let (list, not, all) = self.tags();
        if list.is_empty() {
            return None;
        }
        let key = match (all, not) {
            (true, true) => "not-tags-any",
            (true, false) => "tags",
            (false, true) => "not-tags",
            (false, false) => "tags-any",
        };
        Some((key, list.join(",")))
    }

    /// The regular expression of a `~…` name pattern (after an optional `!`), compiled;
    /// `None` for a glob or no pattern.
    pub fn name_regex(&self) -> Option<Result<regex::Regex, regex::Error>> {
        let pat = self.subnet.strip_prefix('!').unwrap_or(&self.subnet);
        pat.strip_prefix('~').map(regex::Regex::new)
    }

    /// Whether a subnet (name, tags) matches the pattern and tags. A `~regex` matches when
    /// its leftmost match is the whole name (upstream's `FindString(name) == name`); a
    /// regex that does not compile matches nothing ([`ServiceConfig::parse`] refuses it).
    pub fn matches(&self, name: &str, tags: &[String]) -> bool {
        if !self.subnet.is_empty() {
            let (pat, not) = match self.subnet.strip_prefix('!') {
                Some(p) => (p, true),
                None => (self.subnet.as_str(), false),
            };
            let hit = match self.name_regex() {
                Some(Ok(re)) => re.find(name).map_or("", |m| m.as_str()) == name,
                Some(Err(_)) => return false,
                None => glob(pat, name),
            };
            if hit == not {
                return false;
            }
        }
        let (list, not, all) = self.tags();
        if list.is_empty() {
            return true;
        }
        let has = |t: &String| tags.contains(t);
        let hit = if all { list.iter().all(has) } else { list.iter().any(has) };
        hit != not
    }
}

/// A whole-string glob match: `*` any run, `?` one character (ccm-core's shared matcher).
pub use ccm_core::glob::glob;

/// One Service port.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PortSpec {
    /// Its index in `spec.ports` (names `listener_<i>_…`).
    pub index: usize,
    /// `TCP`, `UDP` or `SCTP`.
    pub protocol: String,
    /// The listener port.
    pub port: i32,
    /// The node port (0 without one: no members).
    pub node_port: i32,
}

/// Health monitor settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MonitorSettings {
    /// Seconds between probes.
    pub delay: i64,
    /// Probe timeout.
    pub timeout: i64,
    /// Successes before up.
    pub max_retries: i64,
    /// Failures before down.
    pub max_retries_down: i64,
}

/// Listener timeouts (ms).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timeouts {
    /// `timeout_client_data`.
    pub client_data: i64,
    /// `timeout_member_connect`.
    pub member_connect: i64,
    /// `timeout_member_data`.
    pub member_data: i64,
    /// `timeout_tcp_inspect`.
    pub tcp_inspect: i64,
}

/// What the Service asks of its load balancer (upstream's `serviceConfig`).
#[derive(Debug, Clone, PartialEq)]
pub struct ServiceConfig {
    /// `<namespace>/<name>`.
    pub service: String,
    /// No floating IP.
    pub internal: bool,
    /// The class, by name.
    pub class: Option<String>,
    /// The VIP subnet (may be empty: then the network, or a node's subnet).
    pub subnet_id: String,
    /// The VIP network.
    pub network_id: String,
    /// The VIP port.
    pub port_id: String,
    /// The members' subnet (empty: filled in from the VIP subnet / a node's subnet).
    pub member_subnet_id: String,
    /// `member-subnet-id` was given (annotation, class or config).
    pub member_subnet_explicit: bool,
    /// The floating network (empty: discovered).
    pub floating_network_id: String,
    /// The floating IP's subnet.
    pub floating_subnet: FloatingSubnetSpec,
    /// Member node selector.
    pub node_selector: BTreeMap<String, String>,
    /// `x-forwarded-for`.
    pub keep_client_ip: bool,
    /// `proxy-protocol`.
    pub proxy_protocol: Option<ProxyProtocol>,
    /// The pools' algorithm.
    pub lb_method: String,
    /// Listener connection limit.
    pub connection_limit: i64,
    /// Listener timeouts (`None` with `lb-provider = ovn`).
    pub timeouts: Option<Timeouts>,
    /// Listener `allowed_cidrs` (`None` with `lb-provider = ovn`).
    pub allowed_cidrs: Option<Vec<String>>,
    /// The source ranges (normalised CIDRs).
    pub source_ranges: Vec<String>,
    /// Health monitors.
    pub enable_monitor: bool,
    /// HTTP monitors on this port (`externalTrafficPolicy: Local` with monitors), else 0.
    pub health_check_node_port: i32,
    /// `spec.healthCheckNodePort` (security group rule), else 0.
    pub spec_health_check_node_port: i32,
    /// Monitor settings.
    pub monitor: MonitorSettings,
    /// HTTP monitors can be used (not with `lb-provider = ovn`).
    pub http_monitors: bool,
    /// HTTP monitors on UDP pools (Octavia API ≥ 2.16; set from the discovered version).
    pub http_monitors_on_udp: bool,
    /// Tags on the load balancer and listeners (Octavia API ≥ 2.5; set from the discovered
    /// version).
    pub tags: bool,
    /// Octavia flavor.
    pub flavor_id: String,
    /// Octavia availability zone.
    pub availability_zone: String,
    /// `load-balancer-id`.
    pub lb_id: String,
    /// `keep-floatingip`.
    pub keep_floating_ip: bool,
    /// `hostname`.
    pub hostname: String,
    /// `default-tls-container-ref`: `TERMINATED_HTTPS` listeners with this reference.
    pub tls_container_ref: String,
    /// The Service's IP family.
    pub ip_family: Option<IpFamily>,
    /// `spec.loadBalancerIP`.
    pub load_balancer_ip: String,
    /// `sessionAffinity: ClientIP`.
    pub session_affinity: bool,
    /// The ports.
    pub ports: Vec<PortSpec>,
}

/// `<namespace>/<name>`.
pub fn service_key(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or_default(),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

/// `k=v,k2=v2,k3` as upstream's `StringToMap`.
pub fn parse_selector(text: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for kv in text.trim().split(',') {
        let kv = kv.trim();
        match kv.split_once('=') {
            Some((k, v)) => {
                out.insert(k.trim().to_string(), v.trim().to_string());
            }
            None if !kv.is_empty() => {
                out.insert(kv.to_string(), String::new());
            }
            None => {}
        }
    }
    out
}

fn parse_cidrs(what: &str, items: &[&str]) -> Result<Vec<String>, ProviderError> {
    let mut out = Vec::new();
    for item in items {
        let net: IpNet = item.trim().parse().map_err(|_| {
            invalid(what, format!("{item:?} is not a CIDR (expected e.g. 10.0.0.0/24)"))
        })?;
        let s = net.trunc().to_string();
        if !out.contains(&s) {
            out.push(s);
        }
    }
    Ok(out)
}

impl ServiceConfig {
    /// The Service's settings; errors name the annotation (or field) and value.
    pub fn parse(service: &Service, config: &Config) -> Result<ServiceConfig, ProviderError> {
        let opts = &config.load_balancer;
        let key = service_key(service);
        let spec = service.spec.clone().unwrap_or_default();
        let ovn = opts.lb_provider.eq_ignore_ascii_case("ovn");

        let mut ports = Vec::new();
        for (index, p) in spec.ports.clone().unwrap_or_default().into_iter().enumerate() {
            let protocol = p.protocol.unwrap_or_else(|| "TCP".into()).to_ascii_uppercase();
            if !matches!(protocol.as_str(), "TCP" | "UDP" | "SCTP") {
                return Err(invalid(
                    &format!("Service {key} port {}", p.port),
                    format!("protocol {protocol}: Octavia listeners are TCP, UDP or SCTP"),
                ));
            }
            ports.push(PortSpec {
                index,
                protocol,
                port: p.port,
                node_port: p.node_port.unwrap_or(0),
            });
        }
        if ports.is_empty() {
            return Err(invalid(
                &format!("Service {key} spec.ports"),
                "no ports provided to the load balancer",
            ));
        }

        let ip_family = match spec.ip_families.as_ref().and_then(|f| f.first()).map(String::as_str)
        {
            Some("IPv6") => Some(IpFamily::V6),
            Some("IPv4") => Some(IpFamily::V4),
            _ => None,
        };

        let internal = opts.internal_lb || bool_annotation(service, keys::INTERNAL, false)?;

        let tls_container_ref = str_annotation(
            service,
            keys::DEFAULT_TLS_CONTAINER_REF,
            &opts.default_tls_container_ref,
        );
        if !tls_container_ref.is_empty() && opts.container_store == "barbican" {
            let what = if annotation(service, keys::DEFAULT_TLS_CONTAINER_REF).is_some() {
                keys::DEFAULT_TLS_CONTAINER_REF
            } else {
                "[LoadBalancer] default-tls-container-ref"
            };
            check_barbican_ref(what, &key, &tls_container_ref)?;
        }

        // The class: an unknown name is an error (as upstream).
        let class_name = annotation(service, keys::CLASS).map(str::trim).filter(|c| !c.is_empty());
        let class: Option<&LoadBalancerClass> = match class_name {
            None => None,
            Some(name) => Some(config.lb_classes.get(name).ok_or_else(|| {
                let known: Vec<&str> = config.lb_classes.keys().map(String::as_str).collect();
                invalid(
                    keys::CLASS,
                    format!(
                        "unknown load balancer class {name:?}: no [LoadBalancerClass {name:?}] section in the cloud config{}",
                        if known.is_empty() { String::new() } else { format!(" (known: {})", known.join(", ")) }
                    ),
                )
            })?),
        };
        let from_class = |f: fn(&LoadBalancerClass) -> &Option<String>| -> String {
            class.and_then(|c| f(c).clone()).unwrap_or_default()
        };
        // subnet-id / network-id / member-subnet-id: annotation > class > config.
        let pick = |k: &str, class_value: String, cfg: &str| -> String {
            match annotation(service, k).map(str::trim).filter(|v| !v.is_empty()) {
                Some(v) => v.to_string(),
                None if !class_value.is_empty() => class_value,
                None => cfg.to_string(),
            }
        };
        let subnet_id = pick(keys::SUBNET_ID, from_class(|c| &c.subnet_id), &opts.subnet_id);
        let network_id = pick(keys::NETWORK_ID, from_class(|c| &c.network_id), &opts.network_id);
        let member_override = pick(
            keys::MEMBER_SUBNET_ID,
            from_class(|c| &c.member_subnet_id),
            &opts.member_subnet_id,
        );
        // Upstream: members on `[LoadBalancer] subnet-id` when set, else on the VIP subnet.
        let mut member_subnet_id =
            if !opts.subnet_id.is_empty() { opts.subnet_id.clone() } else { subnet_id.clone() };
        if !member_override.is_empty() {
            member_subnet_id = member_override.clone();
        }
        let port_id = str_annotation(service, keys::PORT_ID, "");

        // Floating network and subnet: class > annotation > config (as upstream).
        let mut floating_network_id = from_class(|c| &c.floating_network_id);
        let mut floating_subnet = FloatingSubnetSpec::default();
        if class.is_some() {
            floating_subnet.subnet_id = from_class(|c| &c.floating_subnet_id);
            if floating_subnet.subnet_id.is_empty() {
                floating_subnet.subnet = from_class(|c| &c.floating_subnet);
                floating_subnet.subnet_tags = from_class(|c| &c.floating_subnet_tags);
            }
        }
        if floating_network_id.is_empty() {
            floating_network_id =
                str_annotation(service, keys::FLOATING_NETWORK_ID, &opts.floating_network_id);
        }
        if !floating_subnet.configured() {
            let mut annos = FloatingSubnetSpec {
                subnet_id: str_annotation(service, keys::FLOATING_SUBNET_ID, ""),
                ..Default::default()
            };
            if annos.subnet_id.is_empty() {
                annos.subnet = str_annotation(service, keys::FLOATING_SUBNET, "");
                annos.subnet_tags = str_annotation(service, keys::FLOATING_SUBNET_TAGS, "");
            }
            floating_subnet = if annos.configured() {
                annos
            } else if !opts.floating_subnet_id.is_empty() {
                FloatingSubnetSpec {
                    subnet_id: opts.floating_subnet_id.clone(),
                    ..Default::default()
                }
            } else {
                FloatingSubnetSpec {
                    subnet_id: String::new(),
                    subnet: opts.floating_subnet.clone(),
                    subnet_tags: opts.floating_subnet_tags.clone(),
                }
            };
        }
        if let Some(Err(e)) = floating_subnet.name_regex() {
            let what = if annotation(service, keys::FLOATING_SUBNET).is_some() {
                keys::FLOATING_SUBNET
            } else {
                "floating-subnet"
            };
            return Err(invalid(
                what,
                format!("{:?}: invalid subnet regexp pattern: {e}", floating_subnet.subnet),
            ));
        }

        let node_selector = match annotation(service, keys::NODE_SELECTOR) {
            Some(v) => parse_selector(v),
            None => opts.node_selector.clone(),
        };

        let keep_client_ip = bool_annotation(service, keys::X_FORWARDED_FOR, false)?;
        let proxy_protocol = match annotation(service, keys::PROXY_PROTOCOL).map(str::trim) {
            None | Some("") => None,
            Some(v) => match v.to_ascii_lowercase().as_str() {
                "true" | "v1" => Some(ProxyProtocol::V1),
                "v2" => Some(ProxyProtocol::V2),
                "false" => None,
                _ => {
                    return Err(invalid(
                        keys::PROXY_PROTOCOL,
                        format!("{v:?}: expected \"true\", \"v1\", \"v2\" or \"false\""),
                    ));
                }
            },
        };
        if proxy_protocol.is_some() && keep_client_ip {
            return Err(invalid(
                keys::PROXY_PROTOCOL,
                format!(
                    "annotations {} and {} cannot be used together",
                    keys::PROXY_PROTOCOL,
                    keys::X_FORWARDED_FOR
                ),
            ));
        }

        let lb_method =
            match annotation(service, keys::LB_METHOD).map(str::trim).filter(|v| !v.is_empty()) {
                Some(v) => {
                    let up = v.to_ascii_uppercase();
                    if !LB_METHODS.contains(&up.as_str()) {
                        return Err(invalid(
                            keys::LB_METHOD,
                            format!("{v:?}: expected one of {}", LB_METHODS.join(", ")),
                        ));
                    }
                    up
                }
                None => opts.lb_method.clone(),
            };

        let connection_limit = int_annotation(service, keys::CONNECTION_LIMIT, -1, -1)?;
        let timeouts = Timeouts {
            client_data: int_annotation(service, keys::TIMEOUT_CLIENT_DATA, 50_000, 0)?,
            member_connect: int_annotation(service, keys::TIMEOUT_MEMBER_CONNECT, 5_000, 0)?,
            member_data: int_annotation(service, keys::TIMEOUT_MEMBER_DATA, 50_000, 0)?,
            tcp_inspect: int_annotation(service, keys::TIMEOUT_TCP_INSPECT, 0, 0)?,
        };

        let source_ranges = match spec.load_balancer_source_ranges.as_deref() {
            Some(r) if !r.is_empty() => {
                let items: Vec<&str> = r.iter().map(String::as_str).collect();
                parse_cidrs("spec.loadBalancerSourceRanges", &items)?
            }
            _ => match annotation(service, keys::SOURCE_RANGES)
                .map(str::trim)
                .filter(|v| !v.is_empty())
            {
                Some(v) => {
                    let items: Vec<&str> =
                        v.split(',').map(str::trim).filter(|s| !s.is_empty()).collect();
                    parse_cidrs(keys::SOURCE_RANGES, &items)?
                }
                None if ip_family == Some(IpFamily::V6) => vec!["::/0".to_string()],
                None => vec!["0.0.0.0/0".to_string()],
            },
        };
        // OVN has no listener ACLs: its security group rules use the source ranges instead.
        let allowed_cidrs = (!ovn).then(|| source_ranges.clone());

        let enable_monitor =
            bool_annotation(service, keys::ENABLE_HEALTH_MONITOR, opts.create_monitor)?;
        let spec_hc = spec.health_check_node_port.unwrap_or(0);
        let local = spec.external_traffic_policy.as_deref() == Some("Local");
        let health_check_node_port =
            if enable_monitor && local && spec_hc > 0 { spec_hc } else { 0 };
        let monitor = MonitorSettings {
            delay: int_annotation(
                service,
                keys::HEALTH_MONITOR_DELAY,
                i64::from(opts.monitor_delay),
                1,
            )?,
            timeout: int_annotation(
                service,
                keys::HEALTH_MONITOR_TIMEOUT,
                i64::from(opts.monitor_timeout),
                1,
            )?,
            max_retries: int_annotation(
                service,
                keys::HEALTH_MONITOR_MAX_RETRIES,
                i64::from(opts.monitor_max_retries),
                1,
            )?,
            max_retries_down: int_annotation(
                service,
                keys::HEALTH_MONITOR_MAX_RETRIES_DOWN,
                i64::from(opts.monitor_max_retries_down),
                1,
            )?,
        };

        let flavor_id = if ovn {
            String::new()
        } else {
            str_annotation(service, keys::FLAVOR_ID, &opts.flavor_id)
        };
        let az = str_annotation(service, keys::AVAILABILITY_ZONE, &opts.availability_zone);
        if ovn && !az.is_empty() {
            tracing::warn!(service = %key, "OpenStack: availability zones are not supported with lb-provider ovn; ignored");
        }
        let availability_zone = if ovn { String::new() } else { az };

        Ok(ServiceConfig {
            service: key,
            internal,
            class: class_name.map(str::to_string),
            subnet_id,
            network_id,
            port_id,
            member_subnet_explicit: !member_override.is_empty(),
            member_subnet_id,
            floating_network_id,
            floating_subnet,
            node_selector,
            keep_client_ip,
            proxy_protocol,
            lb_method,
            connection_limit,
            timeouts: (!ovn).then_some(timeouts),
            allowed_cidrs,
            source_ranges,
            enable_monitor,
            health_check_node_port,
            spec_health_check_node_port: spec_hc,
            monitor,
            http_monitors: !ovn,
            http_monitors_on_udp: !ovn,
            tags: true,
            flavor_id,
            availability_zone,
            lb_id: str_annotation(service, keys::LOAD_BALANCER_ID, ""),
            keep_floating_ip: bool_annotation(service, keys::KEEP_FLOATING_IP, false)?,
            hostname: str_annotation(service, keys::HOSTNAME, ""),
            tls_container_ref,
            ip_family,
            load_balancer_ip: spec.load_balancer_ip.clone().unwrap_or_default().trim().to_string(),
            session_affinity: spec.session_affinity.as_deref() == Some("ClientIP"),
            ports,
        })
    }

    /// The listener protocol of a port, as upstream's `getListenerProtocol`:
    /// `TERMINATED_HTTPS` with a TLS container (every port, as upstream), else HTTP with
    /// `x-forwarded-for`, else the port's.
    pub fn listener_protocol(&self, port: &PortSpec) -> String {
        if !self.tls_container_ref.is_empty() {
            "TERMINATED_HTTPS".into()
        } else if self.keep_client_ip {
            "HTTP".into()
        } else {
            port.protocol.clone()
        }
    }

    /// The pool protocol of a listener protocol: PROXY/PROXYV2, HTTP with
    /// `x-forwarded-for` or TLS termination, else the listener's.
    pub fn pool_protocol(&self, listener_protocol: &str) -> String {
        match self.proxy_protocol {
            Some(p) => p.pool_protocol().into(),
            None if self.keep_client_ip || !self.tls_container_ref.is_empty() => "HTTP".into(),
            None => listener_protocol.to_string(),
        }
    }

    /// Whether the pool of `port` uses an HTTP monitor on the health-check node port.
    pub fn http_monitor(&self, port: &PortSpec) -> bool {
        // Octavia has HTTP monitors on UDP pools since API 2.16, as upstream checks.
        self.health_check_node_port > 0
            && self.http_monitors
            && (port.protocol != "UDP" || self.http_monitors_on_udp)
    }

    /// The health monitor type of a port's pool.
    pub fn monitor_type(&self, port: &PortSpec) -> String {
        if self.http_monitor(port) {
            "HTTP".into()
        } else if port.protocol == "UDP" {
            "UDP-CONNECT".into()
        } else {
            port.protocol.clone()
        }
    }
}

/// Upstream's check of a `default-tls-container-ref` with `container-store = barbican`: the
/// reference's last two path segments are `containers/<id>` or `secrets/<id>`. (The container
/// or secret is then read from Barbican before any Octavia call, as upstream: the load
/// balancer's `read_tls_reference`.)
fn check_barbican_ref(what: &str, service: &str, reference: &str) -> Result<(), ProviderError> {
    let mut segs = reference.trim().rsplit('/');
    let id = segs.next().unwrap_or_default();
    let kind = segs.next();
    match kind {
        None => Err(invalid(
            what,
            format!(
                "invalid TLS container reference {reference:?} for Service {service}: expected https://<key-manager>/v1/containers/<uuid> or .../v1/secrets/<uuid> (or set [LoadBalancer] container-store = external)"
            ),
        )),
        Some("containers" | "secrets") if !id.is_empty() => Ok(()),
        Some(kind @ ("containers" | "secrets")) => Err(invalid(
            what,
            format!(
                "TLS container reference {reference:?} for Service {service}: no ID after {kind}/"
            ),
        )),
        Some(other) => Err(invalid(
            what,
            format!(
                "TLS container reference {reference:?} for Service {service}: type {other:?} unknown (expected containers/<uuid> or secrets/<uuid>; or set [LoadBalancer] container-store = external)"
            ),
        )),
    }
}

/// Whether a Node carries every label of the selector (an empty value: the key exists).
pub fn node_matches(node: &Node, selector: &BTreeMap<String, String>) -> bool {
    if selector.is_empty() {
        return true;
    }
    let Some(labels) = node.metadata.labels.as_ref() else { return false };
    selector.iter().all(|(k, v)| labels.get(k).is_some_and(|have| v.is_empty() || have == v))
}

/// The member address of a Node: its first `InternalIP`, else `ExternalIP`, of the
/// Service's family when it has one (upstream's `nodeAddressForLB`).
pub fn node_address(node: &Node, family: Option<IpFamily>) -> Option<String> {
    let addrs = node.status.as_ref()?.addresses.as_ref()?;
    for kind in ["InternalIP", "ExternalIP"] {
        for a in addrs.iter().filter(|a| a.type_ == kind) {
            let ok = match (family, a.address.parse::<std::net::IpAddr>()) {
                (None, _) => true,
                (Some(IpFamily::V4), Ok(ip)) => ip.is_ipv4(),
                (Some(IpFamily::V6), Ok(ip)) => ip.is_ipv6(),
                (Some(_), Err(_)) => false,
            };
            if ok {
                return Some(a.address.clone());
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::LoadBalancerOpts;
    use k8s_openapi::api::core::v1::{NodeAddress, NodeStatus, ServicePort, ServiceSpec};
    use kube::api::ObjectMeta;

    fn service(annotations: &[(&str, &str)]) -> Service {
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
                ports: Some(vec![ServicePort {
                    port: 80,
                    node_port: Some(30080),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn config() -> Config {
        let mut c = Config::default();
        c.lb_classes.insert(
            "gold".into(),
            LoadBalancerClass {
                floating_network_id: Some("net-gold".into()),
                subnet_id: Some("sub-gold".into()),
                ..Default::default()
            },
        );
        c
    }

    #[test]
    fn every_documented_annotation_example_is_accepted() {
        for a in ANNOTATIONS {
            let svc = service(&[(a.key, a.example)]);
            if let Err(e) = ServiceConfig::parse(&svc, &config()) {
                panic!("{} = {:?}: {e}", a.key, a.example);
            }
        }
    }

    #[test]
    fn defaults_follow_upstream() {
        let c = ServiceConfig::parse(&service(&[]), &config()).unwrap();
        assert!(!c.internal && !c.keep_client_ip && c.proxy_protocol.is_none());
        assert_eq!(c.lb_method, "ROUND_ROBIN");
        assert_eq!(c.connection_limit, -1);
        assert_eq!(
            c.timeouts,
            Some(Timeouts {
                client_data: 50000,
                member_connect: 5000,
                member_data: 50000,
                tcp_inspect: 0
            })
        );
        assert_eq!(c.allowed_cidrs, Some(vec!["0.0.0.0/0".to_string()]));
        assert_eq!(
            c.monitor,
            MonitorSettings { delay: 5, timeout: 3, max_retries: 1, max_retries_down: 3 }
        );
        assert!(!c.enable_monitor);
        assert_eq!(c.ports[0].protocol, "TCP");
        assert_eq!(c.listener_protocol(&c.ports[0]), "TCP");
        assert_eq!(c.pool_protocol("TCP"), "TCP");
    }

    #[test]
    fn bad_values_are_named() {
        for (k, v) in [
            (keys::TIMEOUT_CLIENT_DATA, "soon"),
            (keys::CONNECTION_LIMIT, "-5"),
            (keys::LB_METHOD, "RANDOM"),
            (keys::PROXY_PROTOCOL, "v3"),
            (keys::INTERNAL, "yes"),
            (keys::HEALTH_MONITOR_DELAY, "0"),
            (keys::CLASS, "silver"),
            (keys::DEFAULT_TLS_CONTAINER_REF, "https://barbican/v1/orders/x"),
            (keys::DEFAULT_TLS_CONTAINER_REF, "no-slashes"),
            (keys::FLOATING_SUBNET, "~pub(.*"),
            (keys::SOURCE_RANGES, "10.0.0.0/33"),
        ] {
            let e = ServiceConfig::parse(&service(&[(k, v)]), &config()).unwrap_err();
            assert!(matches!(e, ProviderError::Invalid { .. }), "{k}: {e:?}");
            let text = e.to_string();
            assert!(text.contains(k), "{k}: {text}");
        }
        let e = ServiceConfig::parse(
            &service(&[(keys::PROXY_PROTOCOL, "true"), (keys::X_FORWARDED_FOR, "true")]),
            &config(),
        )
        .unwrap_err();
        assert!(e.to_string().contains("cannot be used together"), "{e}");
    }

    #[test]
    fn tls_termination_as_upstream() {
        let tls = "https://kms.example.com/v1/containers/a2c1f0e4-0000-4000-8000-000000000009";
        let mut svc = service(&[(keys::DEFAULT_TLS_CONTAINER_REF, tls)]);
        svc.spec.as_mut().unwrap().ports.as_mut().unwrap().push(ServicePort {
            port: 53,
            node_port: Some(30053),
            protocol: Some("UDP".into()),
            ..Default::default()
        });
        let c = ServiceConfig::parse(&svc, &config()).unwrap();
        assert_eq!(c.tls_container_ref, tls);
        // Every port, UDP too, as upstream's getListenerProtocol.
        assert_eq!(c.listener_protocol(&c.ports[0]), "TERMINATED_HTTPS");
        assert_eq!(c.listener_protocol(&c.ports[1]), "TERMINATED_HTTPS");
        assert_eq!(c.pool_protocol("TERMINATED_HTTPS"), "HTTP");
        assert_eq!(c.monitor_type(&c.ports[0]), "TCP");
        let c = ServiceConfig::parse(
            &service(&[(keys::DEFAULT_TLS_CONTAINER_REF, tls), (keys::PROXY_PROTOCOL, "v2")]),
            &config(),
        )
        .unwrap();
        assert_eq!(c.pool_protocol("TERMINATED_HTTPS"), "PROXYV2");
        // The config's default, a secret reference; the annotation (even empty) wins.
        let mut cfg = config();
        cfg.load_balancer.default_tls_container_ref =
            "https://kms.example.com/v1/secrets/a2c1f0e4-0000-4000-8000-00000000000a".into();
        let c = ServiceConfig::parse(&service(&[]), &cfg).unwrap();
        assert_eq!(c.tls_container_ref, cfg.load_balancer.default_tls_container_ref);
        let c =
            ServiceConfig::parse(&service(&[(keys::DEFAULT_TLS_CONTAINER_REF, "")]), &cfg).unwrap();
        assert_eq!(c.tls_container_ref, "");
        assert_eq!(c.listener_protocol(&c.ports[0]), "TCP");
        // A bad config default is named as the config key.
        cfg.load_balancer.default_tls_container_ref = "https://kms.example.com/v1/orders/x".into();
        let e = ServiceConfig::parse(&service(&[]), &cfg).unwrap_err().to_string();
        assert!(
            e.contains("[LoadBalancer] default-tls-container-ref") && e.contains("orders"),
            "{e}"
        );
        // container-store = external: any text.
        cfg.load_balancer.container_store = "external".into();
        cfg.load_balancer.default_tls_container_ref = "vault:tls/web".into();
        let c = ServiceConfig::parse(&service(&[]), &cfg).unwrap();
        assert_eq!(c.tls_container_ref, "vault:tls/web");
    }

    #[test]
    fn classes_and_precedence() {
        let c = ServiceConfig::parse(&service(&[(keys::CLASS, "gold")]), &config()).unwrap();
        assert_eq!(c.floating_network_id, "net-gold");
        assert_eq!(c.subnet_id, "sub-gold");
        assert_eq!(c.member_subnet_id, "sub-gold");
        let c = ServiceConfig::parse(
            &service(&[
                (keys::CLASS, "gold"),
                (keys::SUBNET_ID, "sub-anno"),
                (keys::FLOATING_NETWORK_ID, "net-anno"),
            ]),
            &config(),
        )
        .unwrap();
        assert_eq!(c.subnet_id, "sub-anno");
        assert_eq!(c.floating_network_id, "net-gold", "the class wins for floating settings");
        let mut cfg = config();
        cfg.load_balancer = LoadBalancerOpts {
            subnet_id: "sub-cfg".into(),
            internal_lb: true,
            ..Default::default()
        };
        let c = ServiceConfig::parse(
            &service(&[(keys::SUBNET_ID, "sub-anno"), (keys::INTERNAL, "false")]),
            &cfg,
        )
        .unwrap();
        assert!(c.internal, "[LoadBalancer] internal-lb forces internal");
        assert_eq!(c.subnet_id, "sub-anno");
        assert_eq!(c.member_subnet_id, "sub-cfg", "members on [LoadBalancer] subnet-id");
        let c = ServiceConfig::parse(&service(&[(keys::MEMBER_SUBNET_ID, "sub-m")]), &cfg).unwrap();
        assert_eq!(c.member_subnet_id, "sub-m");
        assert!(c.member_subnet_explicit);
    }

    #[test]
    fn protocols_and_monitors() {
        let c =
            ServiceConfig::parse(&service(&[(keys::X_FORWARDED_FOR, "true")]), &config()).unwrap();
        assert_eq!(c.listener_protocol(&c.ports[0]), "HTTP");
        assert_eq!(c.pool_protocol("HTTP"), "HTTP");
        let c = ServiceConfig::parse(&service(&[(keys::PROXY_PROTOCOL, "v2")]), &config()).unwrap();
        assert_eq!(c.pool_protocol("TCP"), "PROXYV2");
        let mut svc = service(&[(keys::ENABLE_HEALTH_MONITOR, "true")]);
        let spec = svc.spec.as_mut().unwrap();
        spec.external_traffic_policy = Some("Local".into());
        spec.health_check_node_port = Some(32000);
        spec.ports.as_mut().unwrap().push(ServicePort {
            port: 53,
            node_port: Some(30053),
            protocol: Some("UDP".into()),
            ..Default::default()
        });
        let c = ServiceConfig::parse(&svc, &config()).unwrap();
        assert_eq!(c.health_check_node_port, 32000);
        assert_eq!(c.monitor_type(&c.ports[0]), "HTTP");
        let mut ovn = config();
        ovn.load_balancer.lb_provider = "ovn".into();
        let c = ServiceConfig::parse(&svc, &ovn).unwrap();
        assert_eq!(c.monitor_type(&c.ports[0]), "TCP");
        assert_eq!(c.monitor_type(&c.ports[1]), "UDP-CONNECT");
        assert!(c.timeouts.is_none() && c.allowed_cidrs.is_none());
    }

    #[test]
    fn source_ranges_are_normalised() {
        let mut svc = service(&[(keys::SOURCE_RANGES, "10.1.2.3/8, 192.168.0.0/16")]);
        let c = ServiceConfig::parse(&svc, &config()).unwrap();
        assert_eq!(c.source_ranges, vec!["10.0.0.0/8", "192.168.0.0/16"]);
        svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["172.16.0.0/12".into()]);
        let c = ServiceConfig::parse(&svc, &config()).unwrap();
        assert_eq!(c.source_ranges, vec!["172.16.0.0/12"], "the field wins over the annotation");
    }

    #[test]
    fn selectors_globs_and_addresses() {
        let s = parse_selector(" env=production, region=default ,gpu,");
        assert_eq!(s.len(), 3);
        assert_eq!(s["env"], "production");
        assert_eq!(s["gpu"], "");
        let node = |labels: &[(&str, &str)], addrs: &[(&str, &str)]| Node {
            metadata: ObjectMeta {
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            status: Some(NodeStatus {
                addresses: Some(
                    addrs
                        .iter()
                        .map(|(t, a)| NodeAddress { type_: t.to_string(), address: a.to_string() })
                        .collect(),
                ),
                ..Default::default()
            }),
            ..Default::default()
        };
        let n = node(
            &[("env", "production"), ("region", "default"), ("gpu", "x")],
            &[("ExternalIP", "172.24.4.5"), ("InternalIP", "fd00::5"), ("InternalIP", "10.0.0.5")],
        );
        assert!(node_matches(&n, &s));
        assert!(!node_matches(&node(&[("env", "production")], &[]), &s));
        assert_eq!(node_address(&n, None).as_deref(), Some("fd00::5"));
        assert_eq!(node_address(&n, Some(IpFamily::V4)).as_deref(), Some("10.0.0.5"));
        assert_eq!(
            node_address(&node(&[], &[("ExternalIP", "172.24.4.5")]), Some(IpFamily::V4))
                .as_deref(),
            Some("172.24.4.5")
        );
        assert!(glob("public-*", "public-subnet"));
        assert!(glob("p?blic", "public"));
        assert!(!glob("public", "public-subnet"));
        let spec = FloatingSubnetSpec { subnet: "!internal-*".into(), ..Default::default() };
        assert!(spec.matches("public-1", &[]) && !spec.matches("internal-1", &[]));
        // `~`: a regular expression whose leftmost match must be the whole name, as upstream.
        let re = FloatingSubnetSpec { subnet: "~public-[0-9]+".into(), ..Default::default() };
        assert!(re.matches("public-12", &[]));
        assert!(!re.matches("public-12b", &[]) && !re.matches("xpublic-1", &[]));
        let re = FloatingSubnetSpec { subnet: "~a|ab".into(), ..Default::default() };
        assert!(re.matches("a", &[]) && !re.matches("ab", &[]), "leftmost-first, as Go's");
        let re = FloatingSubnetSpec { subnet: "!~ext-.*".into(), ..Default::default() };
        assert!(re.matches("public-1", &[]) && !re.matches("ext-1", &[]));
        let c = ServiceConfig::parse(&service(&[(keys::FLOATING_SUBNET, "~pub.*")]), &config())
            .unwrap();
        assert!(c.floating_subnet.matches("public", &[]));
        let tags = FloatingSubnetSpec { subnet_tags: "&a,b".into(), ..Default::default() };
        assert_eq!(tags.tag_filter(), Some(("tags", "a,b".into())));
        assert!(tags.matches("x", &["a".into(), "b".into()]) && !tags.matches("x", &["a".into()]));
    }
}
