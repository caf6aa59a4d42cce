//! Service annotations and spec checks for AWS load balancers, parsed before any cloud call.
//!
//! Owns turning a Service into [`LbOptions`], or an error naming the annotation (or spec
//! field) that is wrong: [`ProviderError::Invalid`] with `what` = the annotation key, which
//! the service controller reports as a Warning event. Nothing is changed in the cloud when
//! parsing fails.

use std::collections::BTreeMap;

use ccm_core::cloud::ProviderError;
use ccm_core::reference::{KeyDoc, has_key};
use ipnet::IpNet;
use k8s_openapi::api::core::v1::{Service, ServicePort};

/// The common annotation prefix.
pub const PREFIX: &str = "service.beta.kubernetes.io/";

/// Annotation keys (all under [`PREFIX`]).
pub mod keys {
    /// `nlb` → NLB; `external` / `nlb-ip` → another controller.
    pub const TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
    /// Internal scheme.
    pub const INTERNAL: &str = "service.beta.kubernetes.io/aws-load-balancer-internal";
    /// Explicit subnets (IDs or Name tags).
    pub const SUBNETS: &str = "service.beta.kubernetes.io/aws-load-balancer-subnets";
    /// Certificate ARN for TLS listeners.
    pub const SSL_CERT: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-cert";
    /// Which ports get TLS.
    pub const SSL_PORTS: &str = "service.beta.kubernetes.io/aws-load-balancer-ssl-ports";
    /// Backend protocol (classic ELB).
    pub const BACKEND_PROTOCOL: &str =
        "service.beta.kubernetes.io/aws-load-balancer-backend-protocol";
    /// Predefined SSL negotiation policy (classic ELB).
    pub const SSL_NEGOTIATION_POLICY: &str =
        "service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy";
    /// `*` enables proxy protocol (classic ELB).
    pub const PROXY_PROTOCOL: &str = "service.beta.kubernetes.io/aws-load-balancer-proxy-protocol";
    /// Replace the load balancer's security groups.
    pub const SECURITY_GROUPS: &str =
        "service.beta.kubernetes.io/aws-load-balancer-security-groups";
    /// Add security groups.
    pub const EXTRA_SECURITY_GROUPS: &str =
        "service.beta.kubernetes.io/aws-load-balancer-extra-security-groups";
    /// Extra tags on the load balancer.
    pub const ADDITIONAL_TAGS: &str =
        "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags";
    /// Health check protocol.
    pub const HC_PROTOCOL: &str =
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-protocol";
    /// Health check port (`traffic-port` or a number).
    pub const HC_PORT: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-port";
    /// Health check path.
    pub const HC_PATH: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-path";
    /// Health check interval (s).
    pub const HC_INTERVAL: &str =
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
    /// Health check timeout (s).
    pub const HC_TIMEOUT: &str = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-timeout";
    /// Healthy threshold.
    pub const HC_HEALTHY: &str =
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-healthy-threshold";
    /// Unhealthy threshold.
    pub const HC_UNHEALTHY: &str =
        "service.beta.kubernetes.io/aws-load-balancer-healthcheck-unhealthy-threshold";
    /// Cross-zone load balancing.
    pub const CROSS_ZONE: &str =
        "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled";
    /// Idle timeout (s, classic ELB).
    pub const IDLE_TIMEOUT: &str =
        "service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout";
    /// Connection draining (classic ELB).
    pub const DRAINING_ENABLED: &str =
        "service.beta.kubernetes.io/aws-load-balancer-connection-draining-enabled";
    /// Connection draining timeout (s, classic ELB).
    pub const DRAINING_TIMEOUT: &str =
        "service.beta.kubernetes.io/aws-load-balancer-connection-draining-timeout";
    /// Access logs enabled.
    pub const ACCESS_LOG_ENABLED: &str =
        "service.beta.kubernetes.io/aws-load-balancer-access-log-enabled";
    /// Access log emit interval (5 or 60 min).
    pub const ACCESS_LOG_INTERVAL: &str =
        "service.beta.kubernetes.io/aws-load-balancer-access-log-emit-interval";
    /// Access log bucket.
    pub const ACCESS_LOG_BUCKET: &str =
        "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name";
    /// Access log prefix.
    pub const ACCESS_LOG_PREFIX: &str =
        "service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-prefix";
    /// Elastic IP allocations, one per subnet (NLB).
    pub const EIP_ALLOCATIONS: &str =
        "service.beta.kubernetes.io/aws-load-balancer-eip-allocations";
    /// Private IPv4 addresses, one per subnet (internal NLB).
    pub const PRIVATE_IPV4: &str =
        "service.beta.kubernetes.io/aws-load-balancer-private-ipv4-addresses";
    /// Target group attributes (NLB).
    pub const TG_ATTRIBUTES: &str =
        "service.beta.kubernetes.io/aws-load-balancer-target-group-attributes";
    /// Backend node selector.
    pub const TARGET_NODE_LABELS: &str =
        "service.beta.kubernetes.io/aws-load-balancer-target-node-labels";
    /// Source ranges (when `spec.loadBalancerSourceRanges` is empty).
    pub const SOURCE_RANGES: &str = "service.beta.kubernetes.io/load-balancer-source-ranges";
}

/// Every annotation the parser reads, with its documentation: [`annotation`] reads only keys
/// listed here (checked in debug builds and so by every test), and the tests feed every example
/// back into [`parse`]. `ccm-docgen` renders it as the annotation reference.
pub const ANNOTATIONS: &[KeyDoc] = &[
    KeyDoc {
        section: "",
        key: keys::TYPE,
        value: "`nlb`, `external`, `nlb-ip`; default classic ELB",
        example: "nlb",
        doc: "`nlb`: a Network Load Balancer. `external`/`nlb-ip`: left to another controller (the AWS Load Balancer Controller).",
    },
    KeyDoc {
        section: "",
        key: keys::INTERNAL,
        value: "bool or CIDR (any value but `false` means internal)",
        example: "true",
        doc: "An internal load balancer (scheme `internal`, private subnets).",
    },
    KeyDoc {
        section: "",
        key: keys::SUBNETS,
        value: "comma-separated subnet IDs or Name tags",
        example: "subnet-0123456789abcdef0",
        doc: "Use these subnets instead of discovering them by cluster and role tags.",
    },
    KeyDoc {
        section: "",
        key: keys::SSL_CERT,
        value: "ACM/IAM certificate ARN",
        example: "arn:aws:acm:us-east-1:123456789012:certificate/x",
        doc: "TLS listeners with this certificate (on the ports of `...-ssl-ports`, default all).",
    },
    KeyDoc {
        section: "",
        key: keys::SSL_PORTS,
        value: "comma-separated port names/numbers, or `*`",
        example: "443",
        doc: "Which ports get TLS when `...-ssl-cert` is set.",
    },
    KeyDoc {
        section: "",
        key: keys::BACKEND_PROTOCOL,
        value: "`http`, `https`, `ssl`, `tcp`",
        example: "http",
        doc: "Classic ELB: the protocol to the instances (and so the listener's protocol).",
    },
    KeyDoc {
        section: "",
        key: keys::SSL_NEGOTIATION_POLICY,
        value: "predefined policy name",
        example: "ELBSecurityPolicy-TLS-1-2-2017-01",
        doc: "Classic ELB: the SSL negotiation policy of TLS listeners.",
    },
    KeyDoc {
        section: "",
        key: keys::PROXY_PROTOCOL,
        value: "`*`",
        example: "*",
        doc: "Classic ELB: enable proxy protocol on every backend.",
    },
    KeyDoc {
        section: "",
        key: keys::SECURITY_GROUPS,
        value: "comma-separated security group IDs",
        example: "sg-0123456789abcdef0",
        doc: "Replace the load balancer's security groups (none are created or managed).",
    },
    KeyDoc {
        section: "",
        key: keys::EXTRA_SECURITY_GROUPS,
        value: "comma-separated security group IDs",
        example: "sg-0123456789abcdef0",
        doc: "Add these security groups to the load balancer.",
    },
    KeyDoc {
        section: "",
        key: keys::ADDITIONAL_TAGS,
        value: "comma-separated `key=value`",
        example: "team=web,env=prod",
        doc: "Extra tags on the load balancer (and its target groups).",
    },
    KeyDoc {
        section: "",
        key: keys::HC_PROTOCOL,
        value: "`TCP`, `HTTP`, `HTTPS` (`SSL` classic)",
        example: "HTTP",
        doc: "Health check protocol.",
    },
    KeyDoc {
        section: "",
        key: keys::HC_PORT,
        value: "`traffic-port` or a port number",
        example: "traffic-port",
        doc: "Health check port.",
    },
    KeyDoc {
        section: "",
        key: keys::HC_PATH,
        value: "path",
        example: "/healthz",
        doc: "Health check path (HTTP/HTTPS checks).",
    },
    KeyDoc {
        section: "",
        key: keys::HC_INTERVAL,
        value: "seconds",
        example: "30",
        doc: "Health check interval.",
    },
    KeyDoc {
        section: "",
        key: keys::HC_TIMEOUT,
        value: "seconds",
        example: "5",
        doc: "Health check timeout.",
    },
    KeyDoc {
        section: "",
        key: keys::HC_HEALTHY,
        value: "count",
        example: "2",
        doc: "Healthy threshold.",
    },
    KeyDoc {
        section: "",
        key: keys::HC_UNHEALTHY,
        value: "count",
        example: "6",
        doc: "Unhealthy threshold.",
    },
    KeyDoc {
        section: "",
        key: keys::CROSS_ZONE,
        value: "bool",
        example: "true",
        doc: "Cross-zone load balancing.",
    },
    KeyDoc {
        section: "",
        key: keys::IDLE_TIMEOUT,
        value: "seconds",
        example: "120",
        doc: "Classic ELB: connection idle timeout.",
    },
    KeyDoc {
        section: "",
        key: keys::DRAINING_ENABLED,
        value: "bool",
        example: "true",
        doc: "Classic ELB: connection draining.",
    },
    KeyDoc {
        section: "",
        key: keys::DRAINING_TIMEOUT,
        value: "seconds",
        example: "60",
        doc: "Classic ELB: connection draining timeout.",
    },
    KeyDoc {
        section: "",
        key: keys::ACCESS_LOG_ENABLED,
        value: "bool",
        example: "false",
        doc: "Classic ELB: access logs (needs the bucket annotation).",
    },
    KeyDoc {
        section: "",
        key: keys::ACCESS_LOG_INTERVAL,
        value: "`5` or `60` (minutes)",
        example: "60",
        doc: "Classic ELB: access log emit interval.",
    },
    KeyDoc {
        section: "",
        key: keys::ACCESS_LOG_BUCKET,
        value: "S3 bucket name",
        example: "my-elb-logs",
        doc: "Classic ELB: access log bucket.",
    },
    KeyDoc {
        section: "",
        key: keys::ACCESS_LOG_PREFIX,
        value: "S3 key prefix",
        example: "web",
        doc: "Classic ELB: access log prefix.",
    },
    KeyDoc {
        section: "",
        key: keys::EIP_ALLOCATIONS,
        value: "comma-separated allocation IDs, one per subnet",
        example: "eipalloc-0123456789abcdef0",
        doc: "NLB: Elastic IPs for an internet-facing NLB.",
    },
    KeyDoc {
        section: "",
        key: keys::PRIVATE_IPV4,
        value: "comma-separated IPv4 addresses, one per subnet",
        example: "10.0.0.10",
        doc: "NLB: private addresses for an internal NLB.",
    },
    KeyDoc {
        section: "",
        key: keys::TG_ATTRIBUTES,
        value: "comma-separated `key=value`",
        example: "preserve_client_ip.enabled=true",
        doc: "NLB: target group attributes.",
    },
    KeyDoc {
        section: "",
        key: keys::TARGET_NODE_LABELS,
        value: "comma-separated `key=value`",
        example: "pool=edge",
        doc: "Only Nodes with these labels are backends.",
    },
    KeyDoc {
        section: "",
        key: keys::SOURCE_RANGES,
        value: "comma-separated CIDRs",
        example: "10.0.0.0/8",
        doc: "Allowed client ranges when `spec.loadBalancerSourceRanges` is empty (default `0.0.0.0/0`).",
    },
];

/// Which load balancer serves the Service.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LbKind {
    /// Classic ELB (default).
    Classic,
    /// Network Load Balancer.
    Nlb,
}

/// The listener protocol family of the Service's ports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum L4 {
    /// TCP.
    Tcp,
    /// UDP (NLB only).
    Udp,
}

/// The health-check port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HcPort {
    /// The traffic (node) port.
    TrafficPort,
    /// A fixed port.
    Port(u16),
}

/// Health-check overrides from annotations.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HealthCheckOverrides {
    /// Protocol (upper case).
    pub protocol: Option<String>,
    /// Port.
    pub port: Option<HcPort>,
    /// Path (HTTP/HTTPS).
    pub path: Option<String>,
    /// Interval in seconds.
    pub interval: Option<i32>,
    /// Timeout in seconds.
    pub timeout: Option<i32>,
    /// Healthy threshold.
    pub healthy: Option<i32>,
    /// Unhealthy threshold.
    pub unhealthy: Option<i32>,
}

/// Access-log settings (classic ELB).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessLog {
    /// Enabled.
    pub enabled: bool,
    /// Emit interval in minutes (5 or 60).
    pub emit_interval: Option<i32>,
    /// S3 bucket.
    pub bucket: Option<String>,
    /// S3 prefix.
    pub prefix: Option<String>,
}

/// Everything the annotations and spec say about the load balancer.
#[derive(Debug, Clone, PartialEq)]
pub struct LbOptions {
    /// Classic or NLB.
    pub kind: LbKind,
    /// TCP or UDP.
    pub protocol: L4,
    /// Internal scheme.
    pub internal: bool,
    /// Explicit subnets.
    pub subnets: Option<Vec<String>>,
    /// TLS certificate ARN.
    pub ssl_cert: Option<String>,
    /// Ports (by number or name) that get TLS; `None` = all.
    pub ssl_ports: Option<Vec<String>>,
    /// Backend protocol (lower case).
    pub backend_protocol: Option<String>,
    /// SSL negotiation policy.
    pub ssl_negotiation_policy: Option<String>,
    /// Proxy protocol on every backend port.
    pub proxy_protocol: bool,
    /// Replacement security groups.
    pub security_groups: Option<Vec<String>>,
    /// Extra security groups.
    pub extra_security_groups: Vec<String>,
    /// Extra tags.
    pub additional_tags: BTreeMap<String, String>,
    /// Health-check overrides.
    pub health_check: HealthCheckOverrides,
    /// Cross-zone load balancing.
    pub cross_zone: Option<bool>,
    /// Idle timeout.
    pub idle_timeout: Option<i32>,
    /// Connection draining enabled.
    pub draining_enabled: Option<bool>,
    /// Connection draining timeout.
    pub draining_timeout: Option<i32>,
    /// Access log.
    pub access_log: Option<AccessLog>,
    /// EIP allocation IDs (NLB).
    pub eip_allocations: Option<Vec<String>>,
    /// Private IPv4 addresses (NLB).
    pub private_ipv4: Option<Vec<String>>,
    /// Target group attributes (NLB).
    pub target_group_attributes: BTreeMap<String, String>,
    /// Backend node selector.
    pub target_node_labels: BTreeMap<String, String>,
    /// Allowed client CIDRs.
    pub source_ranges: Vec<IpNet>,
}

fn invalid(what: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::Invalid { what: what.to_string(), message: message.into() }
}

fn list(v: &str) -> Vec<String> {
    v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(str::to_string).collect()
}

fn kv_map(key: &str, v: &str) -> Result<BTreeMap<String, String>, ProviderError> {
    let mut out = BTreeMap::new();
    for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let (k, val) = match item.split_once('=') {
            Some((k, val)) => (k.trim(), val.trim()),
            None => (item, ""),
        };
        if k.is_empty() {
            return Err(invalid(key, format!("{item:?}: expected key=value")));
        }
        out.insert(k.to_string(), val.to_string());
    }
    Ok(out)
}

fn boolean(key: &str, v: &str) -> Result<bool, ProviderError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "1" | "t" => Ok(true),
        "false" | "0" | "f" => Ok(false),
        _ => Err(invalid(key, format!("{v:?} is not a boolean (true/false)"))),
    }
}

fn int_in(key: &str, v: &str, min: i32, max: i32) -> Result<i32, ProviderError> {
    match v.trim().parse::<i32>() {
        Ok(n) if (min..=max).contains(&n) => Ok(n),
        _ => Err(invalid(key, format!("{v:?} is not an integer in {min}..={max}"))),
    }
}

/// Whether another controller handles this Service (`aws-load-balancer-type` is `external`
/// or `nlb-ip`).
pub fn is_external(service: &Service) -> bool {
    let v = annotation(service, keys::TYPE).unwrap_or_default();
    v == "external" || v == "nlb-ip"
}

fn annotation<'a>(service: &'a Service, key: &str) -> Option<&'a str> {
    debug_assert!(has_key(ANNOTATIONS, key), "annotation {key} is not in ANNOTATIONS");
    service.metadata.annotations.as_ref().and_then(|a| a.get(key)).map(String::as_str)
}

/// The Service's ports, or an error if it has none.
pub fn ports(service: &Service) -> Result<&[ServicePort], ProviderError> {
    let ports = service.spec.as_ref().and_then(|s| s.ports.as_deref()).unwrap_or_default();
    if ports.is_empty() {
        return Err(invalid("spec.ports", "a LoadBalancer Service needs at least one port"));
    }
    Ok(ports)
}

/// Parses and checks everything before any cloud call.
pub fn parse(service: &Service) -> Result<LbOptions, ProviderError> {
    let get = |k: &str| annotation(service, k).map(str::trim).filter(|v| !v.is_empty());

    let kind = match get(keys::TYPE) {
        None => LbKind::Classic,
        Some("nlb") => LbKind::Nlb,
        Some("external") | Some("nlb-ip") => return Err(ProviderError::ImplementedElsewhere),
        Some(other) => {
            return Err(invalid(
                keys::TYPE,
                format!("{other:?}: expected nlb, external or nlb-ip"),
            ));
        }
    };

    let spec = service.spec.clone().unwrap_or_default();
    if spec.session_affinity.as_deref().is_some_and(|a| a != "None") {
        return Err(invalid("spec.sessionAffinity", "AWS load balancers support only None"));
    }
    let ports = ports(service)?;
    let mut protocol: Option<L4> = None;
    for p in ports {
        let this = match p.protocol.as_deref().unwrap_or("TCP") {
            "TCP" => L4::Tcp,
            "UDP" if kind == LbKind::Nlb => L4::Udp,
            other => {
                return Err(invalid(
                    "spec.ports",
                    format!(
                        "protocol {other} on port {} is not supported by {}",
                        p.port,
                        if kind == LbKind::Nlb {
                            "an NLB (TCP or UDP)"
                        } else {
                            "a classic ELB (TCP only)"
                        }
                    ),
                ));
            }
        };
        if protocol.is_some_and(|p| p != this) {
            return Err(invalid("spec.ports", "mixed protocols are not supported"));
        }
        protocol = Some(this);
        if p.node_port.unwrap_or(0) <= 0 {
            return Err(invalid("spec.ports", format!("port {} has no nodePort yet", p.port)));
        }
    }

    let internal = match get(keys::INTERNAL) {
        None => false,
        // "0.0.0.0/0" is the historical "true".
        Some("0.0.0.0/0") => true,
        Some(v) => boolean(keys::INTERNAL, v)?,
    };

    let ssl_cert = get(keys::SSL_CERT).map(str::to_string);
    if let Some(c) = &ssl_cert
        && !c.starts_with("arn:")
    {
        return Err(invalid(keys::SSL_CERT, format!("{c:?} is not a certificate ARN")));
    }
    let ssl_ports = match get(keys::SSL_PORTS) {
        None | Some("*") => None,
        Some(v) => {
            let l = list(v);
            for item in &l {
                let known = ports.iter().any(|p| {
                    p.port.to_string() == *item || p.name.as_deref() == Some(item.as_str())
                });
                if !known {
                    return Err(invalid(
                        keys::SSL_PORTS,
                        format!("{item:?} is not a port of the Service"),
                    ));
                }
            }
            Some(l)
        }
    };
    let backend_protocol = match get(keys::BACKEND_PROTOCOL) {
        None => None,
        Some(v) => match v.to_ascii_lowercase().as_str() {
            p @ ("http" | "https" | "ssl" | "tcp") => Some(p.to_string()),
            _ => {
                return Err(invalid(
                    keys::BACKEND_PROTOCOL,
                    format!("{v:?}: expected http, https, ssl or tcp"),
                ));
            }
        },
    };
    let proxy_protocol = match get(keys::PROXY_PROTOCOL) {
        None => false,
        Some("*") => true,
        Some(v) => {
            return Err(invalid(keys::PROXY_PROTOCOL, format!("{v:?}: only \"*\" is supported")));
        }
    };

    let sg_list = |key: &str| -> Result<Option<Vec<String>>, ProviderError> {
        match get(key) {
            None => Ok(None),
            Some(v) => {
                let l = list(v);
                if let Some(bad) = l.iter().find(|s| !s.starts_with("sg-")) {
                    return Err(invalid(
                        key,
                        format!("{bad:?} is not a security group ID (sg-...)"),
                    ));
                }
                Ok(Some(l))
            }
        }
    };
    let security_groups = sg_list(keys::SECURITY_GROUPS)?;
    let extra_security_groups = sg_list(keys::EXTRA_SECURITY_GROUPS)?.unwrap_or_default();

    let additional_tags = match get(keys::ADDITIONAL_TAGS) {
        None => BTreeMap::new(),
        Some(v) => kv_map(keys::ADDITIONAL_TAGS, v)?,
    };

    let hc_protocols: &[&str] = if kind == LbKind::Nlb {
        &["TCP", "HTTP", "HTTPS"]
    } else {
        &["TCP", "HTTP", "HTTPS", "SSL"]
    };
    let health_check = HealthCheckOverrides {
        protocol: match get(keys::HC_PROTOCOL) {
            None => None,
            Some(v) => {
                let up = v.to_ascii_uppercase();
                if !hc_protocols.contains(&up.as_str()) {
                    return Err(invalid(
                        keys::HC_PROTOCOL,
                        format!("{v:?}: expected one of {}", hc_protocols.join(", ")),
                    ));
                }
                Some(up)
            }
        },
        port: match get(keys::HC_PORT) {
            None => None,
            Some("traffic-port") => Some(HcPort::TrafficPort),
            Some(v) => match v.parse::<u16>() {
                Ok(p) if p > 0 => Some(HcPort::Port(p)),
                _ => {
                    return Err(invalid(
                        keys::HC_PORT,
                        format!("{v:?}: expected traffic-port or a port number"),
                    ));
                }
            },
        },
        path: match get(keys::HC_PATH) {
            None => None,
            Some(v) if v.starts_with('/') => Some(v.to_string()),
            Some(v) => {
                return Err(invalid(keys::HC_PATH, format!("{v:?} is not an absolute path")));
            }
        },
        interval: get(keys::HC_INTERVAL)
            .map(|v| int_in(keys::HC_INTERVAL, v, 5, 300))
            .transpose()?,
        timeout: get(keys::HC_TIMEOUT).map(|v| int_in(keys::HC_TIMEOUT, v, 2, 120)).transpose()?,
        healthy: get(keys::HC_HEALTHY).map(|v| int_in(keys::HC_HEALTHY, v, 2, 10)).transpose()?,
        unhealthy: get(keys::HC_UNHEALTHY)
            .map(|v| int_in(keys::HC_UNHEALTHY, v, 2, 10))
            .transpose()?,
    };

    let access_log = match get(keys::ACCESS_LOG_ENABLED) {
        None => None,
        Some(v) => Some(AccessLog {
            enabled: boolean(keys::ACCESS_LOG_ENABLED, v)?,
            emit_interval: match get(keys::ACCESS_LOG_INTERVAL) {
                None => None,
                Some(i @ ("5" | "60")) => i.parse().ok(),
                Some(i) => {
                    return Err(invalid(
                        keys::ACCESS_LOG_INTERVAL,
                        format!("{i:?}: expected 5 or 60"),
                    ));
                }
            },
            bucket: get(keys::ACCESS_LOG_BUCKET).map(str::to_string),
            prefix: get(keys::ACCESS_LOG_PREFIX).map(str::to_string),
        }),
    };
    if access_log.as_ref().is_some_and(|a| a.enabled && a.bucket.is_none()) {
        return Err(invalid(keys::ACCESS_LOG_BUCKET, "required when access logs are enabled"));
    }

    let eip_allocations = get(keys::EIP_ALLOCATIONS).map(list);
    let private_ipv4 = get(keys::PRIVATE_IPV4).map(list);
    if kind == LbKind::Classic {
        for (key, set) in [
            (keys::EIP_ALLOCATIONS, eip_allocations.is_some()),
            (keys::PRIVATE_IPV4, private_ipv4.is_some()),
            (keys::TG_ATTRIBUTES, get(keys::TG_ATTRIBUTES).is_some()),
        ] {
            if set {
                return Err(invalid(key, "only supported with aws-load-balancer-type: nlb"));
            }
        }
    }
    if let Some(e) = &eip_allocations {
        if let Some(bad) = e.iter().find(|a| !a.starts_with("eipalloc-")) {
            return Err(invalid(
                keys::EIP_ALLOCATIONS,
                format!("{bad:?} is not an allocation ID (eipalloc-...)"),
            ));
        }
        if internal {
            return Err(invalid(
                keys::EIP_ALLOCATIONS,
                "an internal load balancer cannot have Elastic IPs",
            ));
        }
    }
    if let Some(ips) = &private_ipv4 {
        if let Some(bad) = ips.iter().find(|a| a.parse::<std::net::Ipv4Addr>().is_err()) {
            return Err(invalid(keys::PRIVATE_IPV4, format!("{bad:?} is not an IPv4 address")));
        }
        if !internal {
            return Err(invalid(keys::PRIVATE_IPV4, "only supported on internal load balancers"));
        }
    }
    if let (Some(subnets), Some(n)) = (
        get(keys::SUBNETS).map(list),
        eip_allocations.as_ref().or(private_ipv4.as_ref()).map(Vec::len),
    ) && subnets.len() != n
    {
        return Err(invalid(
            keys::EIP_ALLOCATIONS,
            format!("{n} addresses for {} subnets: give one per subnet", subnets.len()),
        ));
    }

    let target_group_attributes = match get(keys::TG_ATTRIBUTES) {
        None => BTreeMap::new(),
        Some(v) => {
            let m = kv_map(keys::TG_ATTRIBUTES, v)?;
            for (k, val) in &m {
                if k.ends_with(".enabled") {
                    boolean(keys::TG_ATTRIBUTES, val).map_err(|_| {
                        invalid(keys::TG_ATTRIBUTES, format!("{k}={val:?}: expected true or false"))
                    })?;
                }
                if k.ends_with("_seconds") && val.parse::<u32>().is_err() {
                    return Err(invalid(
                        keys::TG_ATTRIBUTES,
                        format!("{k}={val:?}: expected a number of seconds"),
                    ));
                }
            }
            m
        }
    };

    let target_node_labels = match get(keys::TARGET_NODE_LABELS) {
        None => BTreeMap::new(),
        Some(v) => kv_map(keys::TARGET_NODE_LABELS, v)?,
    };

    let mut source_ranges = Vec::new();
    let (ranges, what): (Vec<String>, &str) =
        match spec.load_balancer_source_ranges.filter(|r| !r.is_empty()) {
            Some(r) => (r, "spec.loadBalancerSourceRanges"),
            None => (get(keys::SOURCE_RANGES).map(list).unwrap_or_default(), keys::SOURCE_RANGES),
        };
    for r in ranges {
        let net: IpNet =
            r.trim().parse().map_err(|_| invalid(what, format!("{r:?} is not a CIDR")))?;
        source_ranges.push(net);
    }
    if source_ranges.is_empty() {
        source_ranges.push(IpNet::V4(ipnet::Ipv4Net::default()));
    }

    Ok(LbOptions {
        kind,
        protocol: protocol.unwrap_or(L4::Tcp),
        internal,
        subnets: get(keys::SUBNETS).map(list),
        ssl_cert,
        ssl_ports,
        backend_protocol,
        ssl_negotiation_policy: get(keys::SSL_NEGOTIATION_POLICY).map(str::to_string),
        proxy_protocol,
        security_groups,
        extra_security_groups,
        additional_tags,
        health_check,
        cross_zone: get(keys::CROSS_ZONE).map(|v| boolean(keys::CROSS_ZONE, v)).transpose()?,
        idle_timeout: get(keys::IDLE_TIMEOUT)
            .map(|v| int_in(keys::IDLE_TIMEOUT, v, 1, 4000))
            .transpose()?,
        draining_enabled: get(keys::DRAINING_ENABLED)
            .map(|v| boolean(keys::DRAINING_ENABLED, v))
            .transpose()?,
        draining_timeout: get(keys::DRAINING_TIMEOUT)
            .map(|v| int_in(keys::DRAINING_TIMEOUT, v, 1, 3600))
            .transpose()?,
        access_log,
        eip_allocations,
        private_ipv4,
        target_group_attributes,
        target_node_labels,
        source_ranges,
    })
}

impl LbOptions {
    /// Whether `port` gets a TLS listener.
    pub fn is_ssl_port(&self, port: &ServicePort) -> bool {
        if self.ssl_cert.is_none() {
            return false;
        }
        match &self.ssl_ports {
            None => true,
            Some(l) => l
                .iter()
                .any(|p| *p == port.port.to_string() || Some(p.as_str()) == port.name.as_deref()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ServiceSpec;
    use kube::api::ObjectMeta;

    fn svc(annotations: &[(&str, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                uid: Some("11111111-2222-3333-4444-555555555555".into()),
                annotations: Some(
                    annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
                ),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("LoadBalancer".into()),
                ports: Some(vec![
                    ServicePort {
                        name: Some("http".into()),
                        port: 80,
                        node_port: Some(30080),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    },
                    ServicePort {
                        name: Some("https".into()),
                        port: 443,
                        node_port: Some(30443),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    },
                ]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn what(err: ProviderError) -> String {
        match err {
            ProviderError::Invalid { what, .. } => what,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn defaults_are_a_public_classic_elb_open_to_the_world() {
        let o = parse(&svc(&[])).unwrap();
        assert_eq!(o.kind, LbKind::Classic);
        assert!(!o.internal);
        assert_eq!(o.source_ranges, vec!["0.0.0.0/0".parse::<IpNet>().unwrap()]);
        assert!(o.security_groups.is_none());
    }

    #[test]
    fn type_selects_nlb_or_another_controller() {
        assert_eq!(parse(&svc(&[(keys::TYPE, "nlb")])).unwrap().kind, LbKind::Nlb);
        for v in ["external", "nlb-ip"] {
            assert!(matches!(
                parse(&svc(&[(keys::TYPE, v)])),
                Err(ProviderError::ImplementedElsewhere)
            ));
            assert!(is_external(&svc(&[(keys::TYPE, v)])));
        }
        assert_eq!(what(parse(&svc(&[(keys::TYPE, "alb")])).unwrap_err()), keys::TYPE);
    }

    #[test]
    fn every_bad_value_names_its_annotation() {
        for (key, value) in [
            (keys::INTERNAL, "maybe"),
            (keys::SSL_CERT, "my-cert"),
            (keys::SSL_PORTS, "8443"),
            (keys::BACKEND_PROTOCOL, "grpc"),
            (keys::PROXY_PROTOCOL, "80"),
            (keys::SECURITY_GROUPS, "sg-1,default"),
            (keys::EXTRA_SECURITY_GROUPS, "web"),
            (keys::ADDITIONAL_TAGS, "=v"),
            (keys::HC_PROTOCOL, "icmp"),
            (keys::HC_PORT, "http"),
            (keys::HC_PATH, "healthz"),
            (keys::HC_INTERVAL, "1"),
            (keys::HC_TIMEOUT, "x"),
            (keys::HC_HEALTHY, "11"),
            (keys::HC_UNHEALTHY, "-1"),
            (keys::CROSS_ZONE, "yes please"),
            (keys::IDLE_TIMEOUT, "0"),
            (keys::DRAINING_ENABLED, "on?"),
            (keys::DRAINING_TIMEOUT, "forever"),
            (keys::EIP_ALLOCATIONS, "eipalloc-1"),
            (keys::TG_ATTRIBUTES, "preserve_client_ip.enabled=true"),
            (keys::SOURCE_RANGES, "10.0.0.0/33"),
        ] {
            assert_eq!(what(parse(&svc(&[(key, value)])).unwrap_err()), key, "{key}={value}");
        }
        for (key, value) in [
            (keys::TG_ATTRIBUTES, "preserve_client_ip.enabled=maybe"),
            (keys::EIP_ALLOCATIONS, "10.0.0.1"),
            (keys::PRIVATE_IPV4, "10.0.0.1"),
        ] {
            assert_eq!(
                what(parse(&svc(&[(keys::TYPE, "nlb"), (key, value)])).unwrap_err()),
                key,
                "{key}={value}"
            );
        }
        let err = parse(&svc(&[
            (keys::TYPE, "nlb"),
            (keys::SUBNETS, "subnet-1,subnet-2"),
            (keys::EIP_ALLOCATIONS, "eipalloc-1"),
        ]))
        .unwrap_err();
        assert_eq!(what(err), keys::EIP_ALLOCATIONS);
        let err = parse(&svc(&[(keys::ACCESS_LOG_ENABLED, "true")])).unwrap_err();
        assert_eq!(what(err), keys::ACCESS_LOG_BUCKET);
    }

    #[test]
    fn every_documented_annotation_example_parses() {
        // Examples that only make sense with another annotation get it.
        let with = |key: &str| -> Vec<(&str, &str)> {
            match key {
                keys::SSL_PORTS | keys::SSL_NEGOTIATION_POLICY => {
                    vec![(keys::SSL_CERT, "arn:aws:acm:us-east-1:123456789012:certificate/x")]
                }
                keys::ACCESS_LOG_INTERVAL | keys::ACCESS_LOG_BUCKET | keys::ACCESS_LOG_PREFIX => {
                    vec![(keys::ACCESS_LOG_ENABLED, "true"), (keys::ACCESS_LOG_BUCKET, "b")]
                }
                keys::EIP_ALLOCATIONS | keys::TG_ATTRIBUTES => vec![(keys::TYPE, "nlb")],
                keys::PRIVATE_IPV4 => vec![(keys::TYPE, "nlb"), (keys::INTERNAL, "true")],
                _ => vec![],
            }
        };
        for a in ANNOTATIONS {
            let mut list = with(a.key);
            list.retain(|(k, _)| *k != a.key);
            list.push((a.key, a.example));
            if let Err(e) = parse(&svc(&list)) {
                panic!("{} = {}: {e:?}", a.key, a.example);
            }
        }
    }

    #[test]
    fn good_values_parse() {
        let o = parse(&svc(&[
            (keys::INTERNAL, "true"),
            (keys::SSL_CERT, "arn:aws:acm:us-east-1:123456789012:certificate/x"),
            (keys::SSL_PORTS, "https"),
            (keys::BACKEND_PROTOCOL, "HTTP"),
            (keys::PROXY_PROTOCOL, "*"),
            (keys::EXTRA_SECURITY_GROUPS, "sg-1, sg-2"),
            (keys::ADDITIONAL_TAGS, "team=web, cost-center = 42"),
            (keys::HC_PORT, "traffic-port"),
            (keys::HC_INTERVAL, "30"),
            (keys::CROSS_ZONE, "true"),
            (keys::IDLE_TIMEOUT, "120"),
            (keys::TARGET_NODE_LABELS, "pool=edge"),
            (keys::SOURCE_RANGES, "10.0.0.0/8, 192.168.0.0/16"),
        ]))
        .unwrap();
        assert!(o.internal);
        let ports = ports(&svc(&[])).unwrap().to_vec();
        assert!(!o.is_ssl_port(&ports[0]) && o.is_ssl_port(&ports[1]));
        assert_eq!(o.backend_protocol.as_deref(), Some("http"));
        assert!(o.proxy_protocol);
        assert_eq!(o.extra_security_groups, vec!["sg-1", "sg-2"]);
        assert_eq!(o.additional_tags.get("cost-center").map(String::as_str), Some("42"));
        assert_eq!(o.health_check.port, Some(HcPort::TrafficPort));
        assert_eq!(o.health_check.interval, Some(30));
        assert_eq!(o.cross_zone, Some(true));
        assert_eq!(o.idle_timeout, Some(120));
        assert_eq!(o.target_node_labels.get("pool").map(String::as_str), Some("edge"));
        assert_eq!(o.source_ranges.len(), 2);
        let o = parse(&svc(&[(keys::INTERNAL, "0.0.0.0/0")])).unwrap();
        assert!(o.internal);
    }

    #[test]
    fn spec_checks_name_the_field() {
        let mut s = svc(&[]);
        s.spec.as_mut().unwrap().session_affinity = Some("ClientIP".into());
        assert_eq!(what(parse(&s).unwrap_err()), "spec.sessionAffinity");
        let mut s = svc(&[]);
        s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
        assert_eq!(what(parse(&s).unwrap_err()), "spec.ports");
        // UDP alone is fine on an NLB, mixed is not.
        let mut s = svc(&[(keys::TYPE, "nlb")]);
        s.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].protocol = Some("UDP".into());
        assert_eq!(what(parse(&s).unwrap_err()), "spec.ports");
        s.spec.as_mut().unwrap().ports.as_mut().unwrap()[1].protocol = Some("UDP".into());
        assert_eq!(parse(&s).unwrap().protocol, L4::Udp);
        let mut s = svc(&[]);
        s.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["nope".into()]);
        assert_eq!(what(parse(&s).unwrap_err()), "spec.loadBalancerSourceRanges");
    }
}
