//! The cloud config: upstream's gcfg-style INI file, parsed strictly.
//!
//! Owns the `[Global]` keys and the `[ServiceOverride "N"]` custom endpoints of upstream's
//! `CloudConfig`, and the values derived from them (cluster ID, node IP families, health-probe
//! mode). Parsing follows gcfg: section and key names are case-insensitive, `;` and `#` start
//! comments, values may be double-quoted (with `\"`, `\\`, `\n`, `\t` escapes), a key without
//! `=` is a boolean `true`, and a key given twice in a multi-valued variable appends.
//!
//! Unlike a lenient INI reader, an unknown section, an unknown key or a bad value is an error
//! that names the key and its line, so a typo never silently falls back to a default.

use std::collections::BTreeMap;
use std::path::Path;

use ccm_core::reference::KeyDoc;

/// Upstream's default shared health-probe port (kube-proxy's healthz).
pub const DEFAULT_SHARED_HEALTH_PROBE_PORT: u16 = 10256;
/// Upstream's default shared health-probe path.
pub const DEFAULT_SHARED_HEALTH_PROBE_PATH: &str = "/healthz";

/// Every key the parser accepts, with its documentation: the parser refuses a key that is not
/// here (see [`known_key`]) and the tests feed every example back in, so this table is the
/// parser's own list. `ccm-docgen` renders it as the configuration reference.
pub const CONFIG_KEYS: &[KeyDoc] = &[
    KeyDoc {
        section: "Global",
        key: "Zone",
        value: "string",
        example: "us-east-1a",
        doc: "The zone the CCM runs in; the region is derived from it when `Region` is empty.",
    },
    KeyDoc {
        section: "Global",
        key: "Region",
        value: "string, default: from `Zone`, else instance metadata",
        example: "us-east-1",
        doc: "The region every call goes to.",
    },
    KeyDoc {
        section: "Global",
        key: "VPC",
        value: "string",
        example: "vpc-0123456789abcdef0",
        doc: "The VPC for subnet and security-group discovery (needed when not on EC2).",
    },
    KeyDoc {
        section: "Global",
        key: "SubnetID",
        value: "string",
        example: "subnet-0123456789abcdef0",
        doc: "A subnet of the cluster (with `VPC`, when not on EC2).",
    },
    KeyDoc {
        section: "Global",
        key: "RouteTableID",
        value: "string",
        example: "rtb-0123456789abcdef0",
        doc: "Use this route table for Pod routes instead of discovering it by the cluster tag.",
    },
    KeyDoc {
        section: "Global",
        key: "RoleARN",
        value: "IAM role ARN",
        example: "arn:aws:iam::123456789012:role/ccm",
        doc: "Assume this role (STS `AssumeRole`) for every call.",
    },
    KeyDoc {
        section: "Global",
        key: "SourceARN",
        value: "ARN",
        example: "arn:aws:eks:us-east-1:123456789012:cluster/c1",
        doc: "Sent as `x-amz-source-arn` (and its account as `x-amz-source-account`) on the `AssumeRole` call for `RoleARN`.",
    },
    KeyDoc {
        section: "Global",
        key: "KubernetesClusterTag",
        value: "string (legacy)",
        example: "c1",
        doc: "Legacy cluster ID (`KubernetesCluster=<value>` tags); used when `KubernetesClusterID` is empty, must agree with it otherwise.",
    },
    KeyDoc {
        section: "Global",
        key: "KubernetesClusterID",
        value: "string",
        example: "c1",
        doc: "The cluster ID: resources tagged `kubernetes.io/cluster/<id>` belong to this cluster.",
    },
    KeyDoc {
        section: "Global",
        key: "DisableSecurityGroupIngress",
        value: "bool, default false",
        example: "true",
        doc: "Never add node security-group rules for load balancers.",
    },
    KeyDoc {
        section: "Global",
        key: "ElbSecurityGroup",
        value: "security group ID",
        example: "sg-0123456789abcdef0",
        doc: "Use this security group for every classic ELB instead of creating one per Service.",
    },
    KeyDoc {
        section: "Global",
        key: "NodeIPFamilies",
        value: "`ipv4` and/or `ipv6`, repeatable, default `ipv4`",
        example: "ipv4",
        doc: "Which address families a Node's addresses include, in order.",
    },
    KeyDoc {
        section: "Global",
        key: "ClusterServiceLoadBalancerHealthProbeMode",
        value: "`ServiceNodePort` (default) or `Shared`",
        example: "Shared",
        doc: "How a `Cluster`-traffic-policy Service's load balancer checks nodes: the Service's node port, or the shared kube-proxy health endpoint.",
    },
    KeyDoc {
        section: "Global",
        key: "ClusterServiceSharedLoadBalancerHealthProbePort",
        value: "port, default 10256",
        example: "10256",
        doc: "The shared health-probe port (`Shared` mode).",
    },
    KeyDoc {
        section: "Global",
        key: "ClusterServiceSharedLoadBalancerHealthProbePath",
        value: "path, default `/healthz`",
        example: "/healthz",
        doc: "The shared health-probe path (`Shared` mode).",
    },
    KeyDoc {
        section: "Global",
        key: "SupportedTopologyInstanceTypePattern",
        value: "regex",
        example: "^(p4d|trn1)",
        doc: "Accepted for compatibility; topology labels are not implemented.",
    },
    KeyDoc {
        section: "Global",
        key: "NLBSecurityGroupMode",
        value: "`Managed` or empty",
        example: "Managed",
        doc: "`Managed`: create and attach a security group to each NLB.",
    },
    KeyDoc {
        section: "ServiceOverride \"<name>\"",
        key: "Service",
        value: "endpoint ID or SDK service ID, required",
        example: "ec2",
        doc: "The service whose endpoint is overridden: an endpoint ID (`ec2`, `elasticloadbalancing` for both load-balancer APIs, `sts`) or, as upstream v1.30+ writes it, the SDK's service ID (`EC2`, `Elastic Load Balancing`, `Elastic Load Balancing v2`, `STS`); case and spaces are ignored.",
    },
    KeyDoc {
        section: "ServiceOverride \"<name>\"",
        key: "Region",
        value: "string, required",
        example: "us-east-1",
        doc: "The override applies when the provider runs in this region.",
    },
    KeyDoc {
        section: "ServiceOverride \"<name>\"",
        key: "URL",
        value: "http(s) URL, required",
        example: "https://ec2.example.internal",
        doc: "The endpoint.",
    },
    KeyDoc {
        section: "ServiceOverride \"<name>\"",
        key: "SigningRegion",
        value: "string, required",
        example: "us-east-1",
        doc: "The region requests are signed for.",
    },
    KeyDoc {
        section: "ServiceOverride \"<name>\"",
        key: "SigningMethod",
        value: "empty or `v4`",
        example: "v4",
        doc: "The signing method (only SigV4).",
    },
    KeyDoc {
        section: "ServiceOverride \"<name>\"",
        key: "SigningName",
        value: "string",
        example: "ec2",
        doc: "The signing name, when not the service's own.",
    },
];

/// The table entry for `key` in `section` (`Global` keys ignore case, `-` and `_` as the parser
/// does; `ServiceOverride` keys ignore case).
pub fn known_key(section: &str, key: &str) -> Option<&'static KeyDoc> {
    let norm = |s: &str| s.to_ascii_lowercase().replace(['-', '_'], "");
    let head = section.split_whitespace().next().unwrap_or_default();
    CONFIG_KEYS.iter().find(|k| {
        k.section.split_whitespace().next() == Some(head)
            && if head == "Global" {
                norm(k.key) == norm(key)
            } else {
                k.key.eq_ignore_ascii_case(key)
            }
    })
}

/// A cloud config that cannot be read or used. Every variant names where the problem is.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("reading cloud config {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// A line is not a section header, a key, a comment or blank.
    #[error("cloud config line {line}: {message}")]
    Syntax {
        /// 1-based line number.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// A section this provider does not know.
    #[error(
        "cloud config line {line}: unknown section [{section}] (known: [Global], [ServiceOverride \"N\"])"
    )]
    UnknownSection {
        /// 1-based line number.
        line: usize,
        /// The section as written.
        section: String,
    },
    /// A key the section does not have.
    #[error("cloud config line {line}: unknown key {key:?} in section [{section}]")]
    UnknownKey {
        /// 1-based line number.
        line: usize,
        /// The section.
        section: String,
        /// The key as written.
        key: String,
    },
    /// A key with a value of the wrong type or out of range.
    #[error("cloud config line {line}: invalid value {} for key {key}: {message}", shown_value(.value))]
    BadValue {
        /// 1-based line number.
        line: usize,
        /// The key.
        key: String,
        /// The value as written.
        value: String,
        /// Why it is wrong.
        message: String,
    },
    /// Values that parse but do not make sense together (names the key).
    #[error("cloud config: invalid {key}: {message}")]
    Invalid {
        /// The key (with its section when not `[Global]`).
        key: String,
        /// Why.
        message: String,
    },
}

/// An IP family, as listed in `NodeIPFamilies`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpFamily {
    /// IPv4.
    Ipv4,
    /// IPv6.
    Ipv6,
}

/// How a `Cluster`-traffic-policy Service's load balancer checks node health.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HealthProbeMode {
    /// Probe the Service's node port (upstream default).
    #[default]
    ServiceNodePort,
    /// Probe the shared kube-proxy health endpoint (`...SharedLoadBalancerHealthProbePort/Path`).
    Shared,
}

/// `[Global]`: the upstream keys.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Global {
    /// `Zone`: the zone the CCM runs in (used to derive the region if `Region` is empty).
    pub zone: String,
    /// `Region`.
    pub region: String,
    /// `VPC`: the VPC for subnet and security-group discovery.
    pub vpc: String,
    /// `SubnetID`.
    pub subnet_id: String,
    /// `RouteTableID`: use this route table instead of discovering it by cluster tag.
    pub route_table_id: String,
    /// `RoleARN`: assume this IAM role for every call.
    pub role_arn: String,
    /// `SourceARN`: sent as `x-amz-source-arn` (and its account as `x-amz-source-account`) on
    /// the STS `AssumeRole` call for `RoleARN`, as upstream.
    pub source_arn: String,
    /// `KubernetesClusterTag` (legacy `KubernetesCluster=<value>` tagging).
    pub kubernetes_cluster_tag: String,
    /// `KubernetesClusterID`.
    pub kubernetes_cluster_id: String,
    /// `DisableSecurityGroupIngress`: never add node security-group rules for load balancers.
    pub disable_security_group_ingress: bool,
    /// `ElbSecurityGroup`: use this security group for every classic ELB instead of creating one.
    pub elb_security_group: String,
    /// `NodeIPFamilies`, in order (empty in the file means `ipv4`).
    pub node_ip_families: Vec<IpFamily>,
    /// `ClusterServiceLoadBalancerHealthProbeMode`.
    pub health_probe_mode: HealthProbeMode,
    /// `ClusterServiceSharedLoadBalancerHealthProbePort`.
    pub shared_health_probe_port: u16,
    /// `ClusterServiceSharedLoadBalancerHealthProbePath`.
    pub shared_health_probe_path: String,
    /// `SupportedTopologyInstanceTypePattern` (accepted; topology labels are not implemented).
    pub supported_topology_instance_type_pattern: String,
    /// `NLBSecurityGroupMode`: `Managed` or empty.
    pub nlb_security_group_mode: String,
}

/// `[ServiceOverride "N"]`: a custom endpoint for one service in one region.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ServiceOverride {
    /// The section's name (`N`).
    pub name: String,
    /// `Service`: the endpoint ID, e.g. `ec2`, `elasticloadbalancing`, `sts`.
    pub service: String,
    /// `Region`: the override applies when the provider runs in this region.
    pub region: String,
    /// `URL`: the endpoint.
    pub url: String,
    /// `SigningRegion`: the region requests are signed for.
    pub signing_region: String,
    /// `SigningMethod`: empty or `v4` (the only method the SDK signs with).
    pub signing_method: String,
    /// `SigningName`: empty or the service's own signing name.
    pub signing_name: String,
}

/// The parsed cloud config.
#[derive(Debug, Clone, PartialEq)]
pub struct CloudConfig {
    /// `[Global]`.
    pub global: Global,
    /// `[ServiceOverride "N"]`, in file order.
    pub service_overrides: Vec<ServiceOverride>,
}

impl Default for CloudConfig {
    fn default() -> Self {
        CloudConfig {
            global: Global {
                node_ip_families: vec![IpFamily::Ipv4],
                shared_health_probe_port: DEFAULT_SHARED_HEALTH_PROBE_PORT,
                shared_health_probe_path: DEFAULT_SHARED_HEALTH_PROBE_PATH.to_string(),
                ..Global::default()
            },
            service_overrides: Vec::new(),
        }
    }
}

/// The endpoint IDs of the services this provider (and `ecr-credential-provider`) calls. An
/// override for any other service is accepted, as upstream, with a warning that it is unused.
pub const CALLED_SERVICES: &[&str] = &["ec2", "elasticloadbalancing", "sts", "ecr", "ecr-public"];

impl CloudConfig {
    /// Reads and parses a cloud-config file.
    pub fn from_file(path: &Path) -> Result<Self, ConfigError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| ConfigError::Read { path: path.display().to_string(), source })?;
        Self::parse(&text)
    }

    /// Parses cloud-config text. An empty text is the default config.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let mut cfg = CloudConfig::default();
        let mut families_seen = false;
        let mut section = Section::None;
        let mut overrides: BTreeMap<String, (usize, ServiceOverride)> = BTreeMap::new();
        let mut order: Vec<String> = Vec::new();

        for (idx, raw) in text.lines().enumerate() {
            let line = idx + 1;
            let trimmed = raw.trim();
            if trimmed.is_empty() || trimmed.starts_with(';') || trimmed.starts_with('#') {
                continue;
            }
            if trimmed.starts_with('[') {
                section = parse_section_header(trimmed, line)?;
                if let Section::Override(name) = &section {
                    overrides.entry(name.clone()).or_insert_with(|| {
                        order.push(name.clone());
                        (line, ServiceOverride { name: name.clone(), ..Default::default() })
                    });
                }
                continue;
            }
            let (key, value) = parse_key_value(trimmed, line)?;
            match &section {
                Section::None => {
                    return Err(ConfigError::Syntax {
                        line,
                        message: format!("key {key:?} appears before any [section]"),
                    });
                }
                Section::Global => {
                    set_global(&mut cfg.global, &mut families_seen, &key, value, line)?;
                }
                Section::Override(name) => {
                    let (_, o) = overrides.get_mut(name).ok_or_else(|| ConfigError::Syntax {
                        line,
                        message: format!("internal: section [ServiceOverride {name:?}] lost"),
                    })?;
                    set_override(o, &key, value, line)?;
                }
            }
        }
        for name in order {
            if let Some((line, o)) = overrides.remove(&name) {
                validate_override(&o, line)?;
                if let Some(dup) = cfg.service_overrides.iter().find(|d| {
                    endpoint_id(&d.service) == endpoint_id(&o.service) && d.region == o.region
                }) {
                    return Err(ConfigError::Invalid {
                        key: format!("ServiceOverride \"{}\"", o.name),
                        message: format!(
                            "service {} in region {} is already overridden by [ServiceOverride \"{}\"]",
                            o.service, o.region, dup.name
                        ),
                    });
                }
                let id = endpoint_id(&o.service);
                if !CALLED_SERVICES.contains(&id.as_str()) && id != "elasticloadbalancingv2" {
                    tracing::warn!(
                        section = %format!("ServiceOverride \"{}\"", o.name),
                        service = %o.service,
                        "cloud config overrides the endpoint of a service this provider does not call; the override is unused (called: {})",
                        CALLED_SERVICES.join(", ")
                    );
                }
                cfg.service_overrides.push(o);
            }
        }
        let (tag, id) =
            (cfg.global.kubernetes_cluster_tag.trim(), cfg.global.kubernetes_cluster_id.trim());
        if !tag.is_empty() && !id.is_empty() && tag != id {
            return Err(ConfigError::Invalid {
                key: "KubernetesClusterID".into(),
                message: format!(
                    "KubernetesClusterID {id:?} and KubernetesClusterTag {tag:?} are both set and differ; set one, or both to the same cluster ID"
                ),
            });
        }
        Ok(cfg)
    }

    /// The cluster ID: `KubernetesClusterID`, else the legacy `KubernetesClusterTag`.
    pub fn cluster_id(&self) -> Option<&str> {
        [&self.global.kubernetes_cluster_id, &self.global.kubernetes_cluster_tag]
            .into_iter()
            .map(|s| s.trim())
            .find(|s| !s.is_empty())
    }

    /// The configured region: `Region`, else the `Zone` without its letter suffix.
    pub fn configured_region(&self) -> Option<String> {
        if !self.global.region.is_empty() {
            return Some(self.global.region.clone());
        }
        region_of_zone(&self.global.zone)
    }

    /// The endpoint override for `service` (an endpoint ID such as `ec2`) in `region`.
    /// The override for `service` (an endpoint ID: `ec2`, `elasticloadbalancing`,
    /// `elasticloadbalancingv2`, `sts`, ...) in `region`. `Service` may be written as the
    /// endpoint ID (upstream before its SDK v2 move) or as the SDK's service ID (upstream
    /// v1.30 and later: `EC2`, `Elastic Load Balancing`, `Elastic Load Balancing v2`, `STS`):
    /// case and spaces are ignored. ELBv2 falls back to the `elasticloadbalancing` override,
    /// which older manifests use for both load-balancer APIs.
    pub fn override_for(&self, service: &str, region: &str) -> Option<&ServiceOverride> {
        let find = |id: &str| {
            self.service_overrides
                .iter()
                .find(|o| endpoint_id(&o.service) == endpoint_id(id) && o.region == region)
        };
        find(service).or_else(|| match endpoint_id(service).as_str() {
            "elasticloadbalancingv2" => find("elasticloadbalancing"),
            _ => None,
        })
    }
}

/// The account field of an ARN (`arn:<partition>:<service>:<region>:<account>:<resource>`);
/// `None` when `arn` is not an ARN. The account may be empty (e.g. an S3 bucket ARN).
pub fn arn_account(arn: &str) -> Option<&str> {
    let parts: Vec<&str> = arn.splitn(6, ':').collect();
    match parts.as_slice() {
        ["arn", partition, service, _region, account, resource]
            if !partition.is_empty() && !service.is_empty() && !resource.is_empty() =>
        {
            Some(account)
        }
        _ => None,
    }
}

/// The region of an availability zone: `us-east-1a` → `us-east-1` (also `us-west-2-lax-1a`).
pub fn region_of_zone(zone: &str) -> Option<String> {
    let zone = zone.trim();
    let last = zone.chars().last()?;
    if !last.is_ascii_lowercase() || zone.len() < 2 {
        return None;
    }
    let region = &zone[..zone.len() - 1];
    region.ends_with(|c: char| c.is_ascii_digit()).then(|| region.to_string())
}

enum Section {
    None,
    Global,
    Override(String),
}

/// A bad value as it may appear in an error: quoted, unless it may carry credentials (a URL
/// with user information), which is never quoted back.
fn shown_value(value: &str) -> String {
    if value.contains('@') { "<redacted: contains '@'>".to_string() } else { format!("{value:?}") }
}

fn parse_section_header(s: &str, line: usize) -> Result<Section, ConfigError> {
    let inner = s
        .strip_prefix('[')
        .and_then(|r| {
            // A comment may follow the closing bracket.
            let end = r.rfind(']')?;
            let rest = r[end + 1..].trim();
            (rest.is_empty() || rest.starts_with(';') || rest.starts_with('#')).then(|| &r[..end])
        })
        .ok_or_else(|| ConfigError::Syntax {
            line,
            message: format!("malformed section header {s:?}"),
        })?
        .trim();
    let (name, sub) = match inner.find(char::is_whitespace) {
        Some(i) => (&inner[..i], Some(inner[i..].trim())),
        None => (inner, None),
    };
    let sub = match sub {
        None => None,
        Some(q) => Some(unquote(q, line).and_then(|(v, quoted)| {
            if quoted {
                Ok(v)
            } else {
                Err(ConfigError::Syntax {
                    line,
                    message: format!("subsection name in {s:?} must be double-quoted"),
                })
            }
        })?),
    };
    match (name.to_ascii_lowercase().as_str(), sub) {
        ("global", None) => Ok(Section::Global),
        ("serviceoverride", Some(n)) if !n.is_empty() => Ok(Section::Override(n)),
        ("serviceoverride", _) => Err(ConfigError::Syntax {
            line,
            message: "[ServiceOverride] needs a name: [ServiceOverride \"1\"]".into(),
        }),
        _ => Err(ConfigError::UnknownSection { line, section: inner.to_string() }),
    }
}

/// Splits `key = value` (or a bare `key`, meaning boolean true). Returns the value unquoted
/// and without a trailing comment; `None` for a bare key.
fn parse_key_value(s: &str, line: usize) -> Result<(String, Option<String>), ConfigError> {
    let (key, value) = match s.find('=') {
        Some(i) => (s[..i].trim(), Some(s[i + 1..].trim())),
        None => (s.trim(), None),
    };
    let key_ok = key.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !key_ok {
        // The "key" may be a whole line without `=`: never quote it (it may hold a secret).
        return Err(ConfigError::Syntax {
            line,
            message: "malformed key: expected `key = value`, with a key of letters, digits, '-' and '_' starting with a letter".into(),
        });
    }
    let value = match value {
        None => None,
        Some(v) => Some(unquote(v, line)?.0),
    };
    Ok((key.to_string(), value))
}

/// gcfg value rules: quoted parts keep whitespace and comment characters; an unquoted `;` or
/// `#` starts a comment. Returns the value and whether any of it was quoted.
fn unquote(v: &str, line: usize) -> Result<(String, bool), ConfigError> {
    let mut out = String::new();
    let mut quoted = false;
    let mut in_quote = false;
    let mut chars = v.chars();
    let mut pending_ws = String::new();
    while let Some(c) = chars.next() {
        match c {
            '"' => {
                quoted = true;
                in_quote = !in_quote;
                out.push_str(&pending_ws);
                pending_ws.clear();
            }
            '\\' => {
                let e = chars.next().ok_or_else(|| ConfigError::Syntax {
                    line,
                    message: "value ends with a lone backslash".into(),
                })?;
                out.push_str(&pending_ws);
                pending_ws.clear();
                out.push(match e {
                    '"' => '"',
                    '\\' => '\\',
                    'n' => '\n',
                    't' => '\t',
                    other => {
                        return Err(ConfigError::Syntax {
                            line,
                            message: format!("unknown escape sequence \\{other}"),
                        });
                    }
                });
            }
            ';' | '#' if !in_quote => break,
            c if c.is_whitespace() && !in_quote => pending_ws.push(c),
            c => {
                out.push_str(&pending_ws);
                pending_ws.clear();
                out.push(c);
            }
        }
    }
    if in_quote {
        return Err(ConfigError::Syntax { line, message: "unterminated quoted value".into() });
    }
    Ok((out, quoted))
}

fn bad(line: usize, key: &str, value: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::BadValue {
        line,
        key: key.to_string(),
        value: value.to_string(),
        message: message.into(),
    }
}

fn parse_bool(key: &str, value: Option<String>, line: usize) -> Result<bool, ConfigError> {
    let Some(v) = value else { return Ok(true) };
    match v.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" => Ok(false),
        _ => Err(bad(line, key, &v, "expected a boolean (true/false, yes/no, on/off, 1/0)")),
    }
}

fn string(key: &str, value: Option<String>, line: usize) -> Result<String, ConfigError> {
    value.ok_or_else(|| bad(line, key, "", "expected `key = value`"))
}

fn set_global(
    g: &mut Global,
    families_seen: &mut bool,
    key: &str,
    value: Option<String>,
    line: usize,
) -> Result<(), ConfigError> {
    if known_key("Global", key).is_none() {
        return Err(ConfigError::UnknownKey {
            line,
            section: "Global".into(),
            key: key.to_string(),
        });
    }
    let k = key.to_ascii_lowercase().replace(['-', '_'], "");
    match k.as_str() {
        "zone" => g.zone = string(key, value, line)?,
        "region" => g.region = string(key, value, line)?,
        "vpc" => g.vpc = string(key, value, line)?,
        "subnetid" => g.subnet_id = string(key, value, line)?,
        "routetableid" => g.route_table_id = string(key, value, line)?,
        "rolearn" => {
            let v = string(key, value, line)?;
            if !v.is_empty() && !v.starts_with("arn:") {
                return Err(bad(
                    line,
                    key,
                    &v,
                    "expected an IAM role ARN (arn:aws:iam::<account>:role/<name>)",
                ));
            }
            g.role_arn = v;
        }
        "sourcearn" => {
            let v = string(key, value, line)?;
            if !v.is_empty() && arn_account(&v).is_none() {
                return Err(bad(
                    line,
                    key,
                    &v,
                    "expected an ARN (arn:<partition>:<service>:<region>:<account>:<resource>)",
                ));
            }
            g.source_arn = v;
        }
        "kubernetesclustertag" => g.kubernetes_cluster_tag = string(key, value, line)?,
        "kubernetesclusterid" => g.kubernetes_cluster_id = string(key, value, line)?,
        "disablesecuritygroupingress" => {
            g.disable_security_group_ingress = parse_bool(key, value, line)?
        }
        "elbsecuritygroup" => {
            let v = string(key, value, line)?;
            if !v.is_empty() && !v.starts_with("sg-") {
                return Err(bad(line, key, &v, "expected a security group ID (sg-...)"));
            }
            g.elb_security_group = v;
        }
        "nodeipfamilies" => {
            let v = string(key, value, line)?;
            if !*families_seen {
                g.node_ip_families.clear();
                *families_seen = true;
            }
            // Repeated keys append (gcfg multi-value); a comma list is accepted too.
            for item in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                let fam = match item.to_ascii_lowercase().as_str() {
                    "ipv4" => IpFamily::Ipv4,
                    "ipv6" => IpFamily::Ipv6,
                    _ => return Err(bad(line, key, item, "expected ipv4 or ipv6")),
                };
                if g.node_ip_families.contains(&fam) {
                    return Err(bad(line, key, item, "family listed twice"));
                }
                g.node_ip_families.push(fam);
            }
        }
        "clusterserviceloadbalancerhealthprobemode" => {
            let v = string(key, value, line)?;
            g.health_probe_mode = match v.as_str() {
                "" | "ServiceNodePort" => HealthProbeMode::ServiceNodePort,
                "Shared" => HealthProbeMode::Shared,
                _ => return Err(bad(line, key, &v, "expected Shared or ServiceNodePort")),
            };
        }
        "clusterservicesharedloadbalancerhealthprobeport" => {
            let v = string(key, value, line)?;
            g.shared_health_probe_port = match v.parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Err(bad(line, key, &v, "expected a port number 1-65535")),
            };
        }
        "clusterservicesharedloadbalancerhealthprobepath" => {
            let v = string(key, value, line)?;
            if !v.starts_with('/') {
                return Err(bad(line, key, &v, "expected an absolute HTTP path"));
            }
            g.shared_health_probe_path = v;
        }
        "supportedtopologyinstancetypepattern" => {
            g.supported_topology_instance_type_pattern = string(key, value, line)?
        }
        "nlbsecuritygroupmode" => {
            let v = string(key, value, line)?;
            if !(v.is_empty() || v == "Managed") {
                return Err(bad(line, key, &v, "expected Managed or empty"));
            }
            g.nlb_security_group_mode = v;
        }
        _ => {
            return Err(ConfigError::UnknownKey {
                line,
                section: "Global".into(),
                key: key.to_string(),
            });
        }
    }
    Ok(())
}

fn set_override(
    o: &mut ServiceOverride,
    key: &str,
    value: Option<String>,
    line: usize,
) -> Result<(), ConfigError> {
    if known_key("ServiceOverride", key).is_none() {
        return Err(ConfigError::UnknownKey {
            line,
            section: format!("ServiceOverride \"{}\"", o.name),
            key: key.to_string(),
        });
    }
    let v = string(key, value, line)?;
    match key.to_ascii_lowercase().as_str() {
        "service" => {
            let s = v.trim().to_ascii_lowercase();
            if s.is_empty() {
                return Err(bad(line, key, &v, "expected a service endpoint ID, e.g. ec2"));
            }
            o.service = s;
        }
        "region" => o.region = v.trim().to_string(),
        "url" => {
            let u = v.trim();
            if !(u.starts_with("https://") || u.starts_with("http://")) {
                return Err(bad(line, key, &v, "expected an http:// or https:// URL"));
            }
            o.url = u.to_string();
        }
        "signingregion" => o.signing_region = v.trim().to_string(),
        "signingmethod" => {
            let m = v.trim();
            if !(m.is_empty() || m.eq_ignore_ascii_case("v4")) {
                return Err(bad(line, key, &v, "only v4 signing is supported"));
            }
            o.signing_method = m.to_string();
        }
        "signingname" => o.signing_name = v.trim().to_string(),
        _ => {
            return Err(ConfigError::UnknownKey {
                line,
                section: format!("ServiceOverride \"{}\"", o.name),
                key: key.to_string(),
            });
        }
    }
    Ok(())
}

/// A `Service` value as an endpoint ID: lower case, spaces dropped (`Elastic Load Balancing
/// v2` → `elasticloadbalancingv2`).
fn endpoint_id(service: &str) -> String {
    service.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase()
}

fn validate_override(o: &ServiceOverride, line: usize) -> Result<(), ConfigError> {
    let section = format!("ServiceOverride \"{}\"", o.name);
    for (key, v) in [
        ("Service", &o.service),
        ("Region", &o.region),
        ("URL", &o.url),
        ("SigningRegion", &o.signing_region),
    ] {
        if v.is_empty() {
            return Err(ConfigError::Invalid {
                key: format!("[{section}] {key}"),
                message: format!("missing (section starts at line {line})"),
            });
        }
    }
    let id = endpoint_id(&o.service);
    let own = if id.starts_with("elasticloadbalancing") { "elasticloadbalancing" } else { &id };
    if !o.signing_name.is_empty() && o.signing_name != own {
        return Err(ConfigError::Invalid {
            key: format!("[{section}] SigningName"),
            message: format!(
                "{:?}: the SDK signs {} requests as {own:?}; a different signing name is not supported",
                o.signing_name, o.service
            ),
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_never_quote_a_line_without_key_or_a_url_with_credentials() {
        let err = CloudConfig::parse("[Global]\nKubernetesClusterID = c1\nhunter2-s3cr3t-line!\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3") && err.contains("malformed key"), "{err}");
        assert!(!err.contains("hunter2"), "the malformed line is quoted back: {err}");
        let err = CloudConfig::parse(
            "[Global]\nKubernetesClusterID = c1\n[ServiceOverride \"1\"]\nService = ec2\nRegion = r\nURL = ftp://user:hunter2pw@host\nSigningRegion = r\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("line 6") && err.contains("URL"), "{err}");
        assert!(!err.contains("hunter2pw"), "a URL with credentials is quoted back: {err}");
    }

    #[test]
    fn an_upstream_style_config_parses() {
        let cfg = CloudConfig::parse(
            r#"
; a comment
[Global]
Zone = us-east-1a
KubernetesClusterID = my-cluster   # trailing comment
DisableSecurityGroupIngress = true
ElbSecurityGroup = sg-0123
NodeIPFamilies = ipv6
NodeIPFamilies = ipv4
RoleARN = "arn:aws:iam::123456789012:role/ccm"
ClusterServiceLoadBalancerHealthProbeMode = Shared
ClusterServiceSharedLoadBalancerHealthProbePort = 10257

[ServiceOverride "1"]
Service = ec2
Region = us-east-1
URL = http://127.0.0.1:5000
SigningRegion = us-east-1

[serviceoverride "elb"]
service = elasticloadbalancing
region = us-east-1
url = http://127.0.0.1:5000
signingregion = us-east-1
signingmethod = v4
"#,
        )
        .unwrap();
        let g = &cfg.global;
        assert_eq!(cfg.cluster_id(), Some("my-cluster"));
        assert_eq!(cfg.configured_region().as_deref(), Some("us-east-1"));
        assert!(g.disable_security_group_ingress);
        assert_eq!(g.elb_security_group, "sg-0123");
        assert_eq!(g.node_ip_families, vec![IpFamily::Ipv6, IpFamily::Ipv4]);
        assert_eq!(g.role_arn, "arn:aws:iam::123456789012:role/ccm");
        assert_eq!(g.health_probe_mode, HealthProbeMode::Shared);
        assert_eq!(g.shared_health_probe_port, 10257);
        assert_eq!(g.shared_health_probe_path, "/healthz");
        assert_eq!(cfg.service_overrides.len(), 2);
        let ec2 = cfg.override_for("ec2", "us-east-1").unwrap();
        assert_eq!(ec2.url, "http://127.0.0.1:5000");
        assert!(cfg.override_for("ec2", "eu-west-1").is_none());
        assert_eq!(cfg.override_for("elasticloadbalancing", "us-east-1").unwrap().name, "elb");
        assert_eq!(cfg.override_for("elasticloadbalancingv2", "us-east-1").unwrap().name, "elb");
    }

    #[test]
    fn overrides_named_by_sdk_v2_service_ids_as_upstream_writes_them_are_found() {
        let section = |n: &str, service: &str, url: &str| {
            format!(
                "[ServiceOverride \"{n}\"]\nService = {service}\nRegion = us-east-1\nURL = {url}\nSigningRegion = us-east-1\n"
            )
        };
        let text = format!(
            "[Global]\nKubernetesClusterID = c\n{}{}{}",
            section("1", "EC2", "http://ec2.local"),
            section("2", "Elastic Load Balancing", "http://elb.local"),
            section("3", "Elastic Load Balancing v2", "http://elbv2.local")
        );
        let cfg = CloudConfig::parse(&text).unwrap();
        let url = |id: &str| cfg.override_for(id, "us-east-1").map(|o| o.url.as_str());
        assert_eq!(url("ec2"), Some("http://ec2.local"));
        assert_eq!(url("elasticloadbalancing"), Some("http://elb.local"));
        assert_eq!(url("elasticloadbalancingv2"), Some("http://elbv2.local"));
        assert_eq!(url("sts"), None);
        // Its signing name is the endpoint's own.
        let signed = format!(
            "{}SigningName = elasticloadbalancing\n",
            section("4", "Elastic Load Balancing", "http://x")
        );
        assert!(
            CloudConfig::parse(&format!("[Global]\nKubernetesClusterID = c\n{signed}")).is_ok()
        );
    }

    #[test]
    fn every_documented_key_and_example_is_accepted_and_nothing_else() {
        for k in CONFIG_KEYS.iter().filter(|k| k.section == "Global") {
            let text = format!("[Global]\n{} = {}\n", k.key, k.example);
            CloudConfig::parse(&text).unwrap_or_else(|e| panic!("{}: {e}", k.key));
        }
        let mut text = String::from("[ServiceOverride \"1\"]\n");
        for k in CONFIG_KEYS.iter().filter(|k| k.section.starts_with("ServiceOverride")) {
            text.push_str(&format!("{} = {}\n", k.key, k.example));
        }
        let cfg = CloudConfig::parse(&text).unwrap();
        assert_eq!(cfg.service_overrides[0].url, "https://ec2.example.internal");
        let err = CloudConfig::parse("[Global]\nNotAKey = 1\n").unwrap_err();
        assert!(matches!(err, ConfigError::UnknownKey { .. }), "{err:?}");
    }

    #[test]
    fn defaults_when_empty() {
        let cfg = CloudConfig::parse("").unwrap();
        assert_eq!(cfg.global.node_ip_families, vec![IpFamily::Ipv4]);
        assert_eq!(cfg.cluster_id(), None);
        assert_eq!(cfg.global.health_probe_mode, HealthProbeMode::ServiceNodePort);
        assert_eq!(cfg.global.shared_health_probe_port, 10256);
    }

    #[test]
    fn legacy_cluster_tag_is_the_fallback_cluster_id() {
        let cfg = CloudConfig::parse("[Global]\nKubernetesClusterTag = legacy\n").unwrap();
        assert_eq!(cfg.cluster_id(), Some("legacy"));
    }

    #[test]
    fn bare_key_is_boolean_true() {
        let cfg = CloudConfig::parse("[Global]\nDisableSecurityGroupIngress\n").unwrap();
        assert!(cfg.global.disable_security_group_ingress);
    }

    #[test]
    fn unknown_key_names_key_and_line() {
        let err = CloudConfig::parse("[Global]\nZone = us-east-1a\nKubernetesClusterIDD = x\n")
            .unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, ConfigError::UnknownKey { line: 3, .. }), "{err:?}");
        assert!(msg.contains("KubernetesClusterIDD") && msg.contains("line 3"), "{msg}");
    }

    #[test]
    fn bad_values_name_key_and_line() {
        for (text, key, line) in [
            ("[Global]\nDisableSecurityGroupIngress = maybe\n", "DisableSecurityGroupIngress", 2),
            ("[Global]\n\nNodeIPFamilies = ipv5\n", "NodeIPFamilies", 3),
            (
                "[Global]\nClusterServiceSharedLoadBalancerHealthProbePort = 70000\n",
                "ClusterServiceSharedLoadBalancerHealthProbePort",
                2,
            ),
            (
                "[Global]\nClusterServiceLoadBalancerHealthProbeMode = sometimes\n",
                "ClusterServiceLoadBalancerHealthProbeMode",
                2,
            ),
            ("[Global]\nElbSecurityGroup = default\n", "ElbSecurityGroup", 2),
            ("[Global]\nRoleARN = ccm-role\n", "RoleARN", 2),
            ("[ServiceOverride \"1\"]\nURL = 127.0.0.1:5000\n", "URL", 2),
            ("[ServiceOverride \"1\"]\nSigningMethod = v2\n", "SigningMethod", 2),
        ] {
            let err = CloudConfig::parse(text).unwrap_err();
            match &err {
                ConfigError::BadValue { line: l, key: k, .. } => {
                    assert_eq!((k.as_str(), *l), (key, line), "{text}");
                }
                other => panic!("{text}: expected BadValue, got {other:?}"),
            }
            assert!(err.to_string().contains(key), "{err}");
        }
    }

    #[test]
    fn unknown_sections_and_syntax_errors_are_rejected() {
        let err = CloudConfig::parse("[Globall]\n").unwrap_err();
        assert!(matches!(err, ConfigError::UnknownSection { line: 1, .. }), "{err:?}");
        let err = CloudConfig::parse("Zone = x\n").unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { line: 1, .. }), "{err:?}");
        let err = CloudConfig::parse("[Global]\nZone = \"us-east-1a\n").unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { line: 2, .. }), "{err:?}");
        let err = CloudConfig::parse("[Global\n").unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { line: 1, .. }), "{err:?}");
        let err = CloudConfig::parse("[Global]\nunknown key = x\n").unwrap_err();
        assert!(matches!(err, ConfigError::Syntax { line: 2, .. }), "{err:?}");
    }

    #[test]
    fn incomplete_or_duplicate_overrides_are_rejected() {
        let err =
            CloudConfig::parse("[ServiceOverride \"1\"]\nService = ec2\nRegion = us-east-1\n")
                .unwrap_err();
        assert!(err.to_string().contains("URL"), "{err}");
        let one = "Service = ec2\nRegion = r\nURL = http://a\nSigningRegion = r\n";
        let err = CloudConfig::parse(&format!(
            "[ServiceOverride \"1\"]\n{one}[ServiceOverride \"2\"]\n{one}"
        ))
        .unwrap_err();
        assert!(err.to_string().contains("already overridden"), "{err}");
        let err = CloudConfig::parse(&format!("[ServiceOverride \"1\"]\n{one}SigningName = s3\n"))
            .unwrap_err();
        assert!(err.to_string().contains("SigningName"), "{err}");
    }

    #[test]
    fn quoted_values_keep_comment_characters() {
        let cfg =
            CloudConfig::parse("[Global]\nKubernetesClusterID = \"a;b#c\" ; comment\n").unwrap();
        assert_eq!(cfg.cluster_id(), Some("a;b#c"));
    }

    #[test]
    fn any_service_override_is_accepted() {
        let cfg = CloudConfig::parse(
            "[ServiceOverride \"s3\"]\nService = s3\nRegion = r\nURL = http://a\nSigningRegion = r\n\
             [ServiceOverride \"asg\"]\nService = autoscaling\nRegion = r\nURL = http://b\nSigningRegion = r\n",
        )
        .unwrap();
        assert_eq!(cfg.override_for("s3", "r").map(|o| o.url.as_str()), Some("http://a"));
        assert_eq!(cfg.override_for("autoscaling", "r").map(|o| o.url.as_str()), Some("http://b"));
    }

    #[test]
    fn cluster_tag_and_id_must_agree() {
        let err =
            CloudConfig::parse("[Global]\nKubernetesClusterTag = one\nKubernetesClusterID = two\n")
                .unwrap_err();
        assert!(matches!(err, ConfigError::Invalid { .. }), "{err:?}");
        let msg = err.to_string();
        assert!(
            msg.contains("KubernetesClusterTag") && msg.contains("KubernetesClusterID"),
            "{msg}"
        );
        let cfg = CloudConfig::parse(
            "[Global]\nKubernetesClusterTag = same\nKubernetesClusterID = same\n",
        )
        .unwrap();
        assert_eq!(cfg.cluster_id(), Some("same"));
    }

    #[test]
    fn region_is_derived_from_zone() {
        assert_eq!(region_of_zone("us-east-1a").as_deref(), Some("us-east-1"));
        assert_eq!(region_of_zone(""), None);
        assert_eq!(region_of_zone("us-east-1"), None);
    }
}
