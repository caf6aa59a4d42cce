//! The cloud config: upstream's gcfg INI file (`[Global]`, `[ServiceOverride "N"]`), read
//! with the providers' shared gcfg reader ([`ccm_core::gcfg`]), as upstream reads it
//! (`gcfg.FatalOnly(gcfg.ReadInto(..))`).
//!
//! Owns the `[Global]` keys and the `[ServiceOverride "N"]` custom endpoints of upstream's
//! `CloudConfig`, and the values derived from them (cluster ID, node IP families, health-probe
//! mode). Syntax is gcfg's: section and key names are case-insensitive, `;` and `#` start
//! comments, values may be double-quoted (with `\"`, `\\`, `\n`, `\t` escapes), a key without
//! `=` is a boolean `true`, and a multi-valued key (`NodeIPFamilies`) takes one value per line.
//!
//! A syntax error is fatal and names its line. An unknown section or key is skipped with a
//! warning naming it, as upstream skips it ([`CloudConfig::config_warnings`]: the manager shows
//! them as an Event at start). A bad value is an error naming the key, never quoting the value.

use std::path::Path;

use ccm_core::gcfg::{self, Block, Schema, Section, SectionSpec};
use ccm_core::reference::KeyDoc;

/// Upstream's default shared health-probe port (kube-proxy's healthz).
pub const DEFAULT_SHARED_HEALTH_PROBE_PORT: u16 = 10256;
/// Upstream's default shared health-probe path.
pub const DEFAULT_SHARED_HEALTH_PROBE_PATH: &str = "/healthz";

/// Every key the parser reads, with its documentation: the parser skips a key that is not
/// here with a warning (as upstream's gcfg skips it) and the tests feed every example back in,
/// so this table is the parser's own list. `ccm-docgen` renders it as the configuration reference.
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

/// The file's sections (upstream's `CloudConfig`: `Global`, and `ServiceOverride` by name).
static SCHEMA: Schema = Schema {
    table: CONFIG_KEYS,
    sections: &[SectionSpec::plain("Global"), SectionSpec::named("ServiceOverride")],
    canonical: gcfg::no_aliases,
};

/// A cloud config that cannot be read or used. Every variant names where the problem is and
/// none quotes a value.
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
    /// A line is not a section header, a key, a comment or blank (gcfg's fatal errors).
    #[error("cloud config line {line}: {message}")]
    Syntax {
        /// 1-based line number.
        line: usize,
        /// What is wrong (never the line's text).
        message: &'static str,
    },
    /// A value that cannot be used, or values that do not make sense together.
    #[error("cloud config: invalid {key}: {message}")]
    Invalid {
        /// The key, `[Global] Zone` or `[ServiceOverride "1"] URL`.
        key: String,
        /// Why (never the value).
        message: String,
    },
}

impl From<gcfg::SyntaxError> for ConfigError {
    fn from(e: gcfg::SyntaxError) -> Self {
        ConfigError::Syntax { line: e.line, message: e.message }
    }
}

impl From<gcfg::ValueError> for ConfigError {
    fn from(e: gcfg::ValueError) -> Self {
        ConfigError::Invalid { key: e.key, message: e.message }
    }
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
    /// `SigningMethod`: as written (upstream ignores it; requests are signed with SigV4).
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
    /// What reading the file skipped, as upstream does: one line per unknown section or key,
    /// naming it, never a value.
    pub warnings: Vec<String>,
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
            warnings: Vec::new(),
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
        let parsed = gcfg::read(text, &SCHEMA)?;
        let doc = &parsed.value;
        let mut cfg = CloudConfig { warnings: parsed.warnings.clone(), ..CloudConfig::default() };
        read_global(&doc.section("Global"), &mut cfg.global)?;
        for (block, s) in doc.blocks_of("ServiceOverride") {
            let o = read_override(block, &s, &mut cfg.warnings)?;
            let id = endpoint_id(&o.service);
            if let Some(dup) = cfg
                .service_overrides
                .iter()
                .find(|d| endpoint_id(&d.service) == id && d.region == o.region)
            {
                return Err(ConfigError::Invalid {
                    key: s.label().to_string(),
                    message: format!(
                        "overrides the same service in the same region as {}",
                        override_label(&dup.name)
                    ),
                });
            }
            if !CALLED_SERVICES.contains(&id.as_str()) && id != "elasticloadbalancingv2" {
                tracing::warn!(
                    section = %s.label(),
                    "cloud config overrides the endpoint of a service this provider does not call; the override is unused (called: {})",
                    CALLED_SERVICES.join(", ")
                );
            }
            cfg.service_overrides.push(o);
        }
        let (tag, id) =
            (cfg.global.kubernetes_cluster_tag.trim(), cfg.global.kubernetes_cluster_id.trim());
        if !tag.is_empty() && !id.is_empty() && tag != id {
            return Err(ConfigError::Invalid {
                key: "[Global] KubernetesClusterID".into(),
                message: "differs from [Global] KubernetesClusterTag; set one, or both to the \
                          same cluster ID"
                    .into(),
            });
        }
        Ok(cfg)
    }

    /// What reading the file skipped, as upstream's gcfg (`FatalOnly`) skips it: unknown
    /// sections and keys, one line each naming the section and key, never a value. Each was
    /// logged as a warning when read; the manager may also show them as an Event.
    pub fn config_warnings(&self) -> &[String] {
        &self.warnings
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

/// How errors name a `[ServiceOverride]` block.
fn override_label(name: &str) -> String {
    if name.is_empty() {
        "[ServiceOverride]".to_string()
    } else {
        format!("[ServiceOverride {name:?}]")
    }
}

/// `[Global]`.
fn read_global(s: &Section<'_>, g: &mut Global) -> Result<(), ConfigError> {
    g.zone = s.string("Zone")?;
    g.region = s.string("Region")?;
    g.vpc = s.string("VPC")?;
    g.subnet_id = s.string("SubnetID")?;
    g.route_table_id = s.string("RouteTableID")?;
    g.role_arn = s.string("RoleARN")?;
    if !g.role_arn.is_empty() && !g.role_arn.starts_with("arn:") {
        return Err(s
            .invalid("RoleARN", "expected an IAM role ARN (arn:aws:iam::<account>:role/<name>)")
            .into());
    }
    g.source_arn = s.string("SourceARN")?;
    if !g.source_arn.is_empty() && arn_account(&g.source_arn).is_none() {
        return Err(s
            .invalid(
                "SourceARN",
                "expected an ARN (arn:<partition>:<service>:<region>:<account>:<resource>)",
            )
            .into());
    }
    g.kubernetes_cluster_tag = s.string("KubernetesClusterTag")?;
    g.kubernetes_cluster_id = s.string("KubernetesClusterID")?;
    g.disable_security_group_ingress = s.boolean("DisableSecurityGroupIngress", false)?;
    g.elb_security_group = s.string("ElbSecurityGroup")?;
    if !g.elb_security_group.is_empty() && !g.elb_security_group.starts_with("sg-") {
        return Err(s.invalid("ElbSecurityGroup", "expected a security group ID (sg-...)").into());
    }
    // One family per line (gcfg's multi-valued key; a bare key clears); a comma list too.
    let mut families = Vec::new();
    for (n, item) in s
        .list("NodeIPFamilies")
        .iter()
        .flat_map(|v| v.split(','))
        .map(str::trim)
        .filter(|v| !v.is_empty())
        .enumerate()
    {
        let family = match item.to_ascii_lowercase().as_str() {
            "ipv4" => IpFamily::Ipv4,
            "ipv6" => IpFamily::Ipv6,
            _ => {
                return Err(s
                    .invalid("NodeIPFamilies", format!("family {} is not ipv4 or ipv6", n + 1))
                    .into());
            }
        };
        if families.contains(&family) {
            return Err(s
                .invalid("NodeIPFamilies", format!("family {} is listed twice", n + 1))
                .into());
        }
        families.push(family);
    }
    if !families.is_empty() {
        g.node_ip_families = families;
    }
    g.health_probe_mode = match s.string("ClusterServiceLoadBalancerHealthProbeMode")?.as_str() {
        "" | "ServiceNodePort" => HealthProbeMode::ServiceNodePort,
        "Shared" => HealthProbeMode::Shared,
        _ => {
            return Err(s
                .invalid(
                    "ClusterServiceLoadBalancerHealthProbeMode",
                    "expected Shared or ServiceNodePort",
                )
                .into());
        }
    };
    // 0 (upstream's own example writes it) or absent: the default port, as upstream.
    let port = s.integer("ClusterServiceSharedLoadBalancerHealthProbePort", 0, 0..=65535)?;
    g.shared_health_probe_port = match u16::try_from(port) {
        Ok(0) | Err(_) => DEFAULT_SHARED_HEALTH_PROBE_PORT,
        Ok(p) => p,
    };
    let path = s.string("ClusterServiceSharedLoadBalancerHealthProbePath")?;
    if path.is_empty() {
        g.shared_health_probe_path = DEFAULT_SHARED_HEALTH_PROBE_PATH.to_string();
    } else if path.starts_with('/') {
        g.shared_health_probe_path = path;
    } else {
        return Err(s
            .invalid(
                "ClusterServiceSharedLoadBalancerHealthProbePath",
                "expected an absolute HTTP path",
            )
            .into());
    }
    g.supported_topology_instance_type_pattern =
        s.string("SupportedTopologyInstanceTypePattern")?;
    g.nlb_security_group_mode = s.string("NLBSecurityGroupMode")?;
    if !(g.nlb_security_group_mode.is_empty() || g.nlb_security_group_mode == "Managed") {
        return Err(s.invalid("NLBSecurityGroupMode", "expected Managed or empty").into());
    }
    Ok(())
}

/// One `[ServiceOverride "N"]` block, checked as upstream's `ValidateOverrides` checks it (and
/// what the SDK can sign).
fn read_override(
    block: &Block,
    s: &Section<'_>,
    warnings: &mut Vec<String>,
) -> Result<ServiceOverride, ConfigError> {
    let o = ServiceOverride {
        name: block.sub.clone().unwrap_or_default(),
        service: s.string("Service")?.trim().to_ascii_lowercase(),
        region: s.string("Region")?.trim().to_string(),
        url: s.string("URL")?.trim().to_string(),
        signing_region: s.string("SigningRegion")?.trim().to_string(),
        signing_method: s.string("SigningMethod")?.trim().to_string(),
        signing_name: s.string("SigningName")?.trim().to_string(),
    };
    for (key, v) in [
        ("Service", &o.service),
        ("Region", &o.region),
        ("URL", &o.url),
        ("SigningRegion", &o.signing_region),
    ] {
        if v.is_empty() {
            return Err(s
                .invalid(key, format!("missing (the section starts at line {})", block.line))
                .into());
        }
    }
    if !(o.url.starts_with("https://") || o.url.starts_with("http://")) {
        return Err(s.invalid("URL", "expected an http:// or https:// URL").into());
    }
    if !(o.signing_method.is_empty() || o.signing_method.eq_ignore_ascii_case("v4")) {
        // Upstream reads the key and never uses it: both SDKs sign with SigV4.
        let message = format!(
            "{} is not v4: ignored, as upstream ignores it (requests are signed with SigV4)",
            s.key("SigningMethod")
        );
        tracing::warn!(section = %s.label(), key = "SigningMethod", "cloud config: {message}");
        warnings.push(message);
    }
    let id = endpoint_id(&o.service);
    let own = if id.starts_with("elasticloadbalancing") { "elasticloadbalancing" } else { &id };
    if !o.signing_name.is_empty() && o.signing_name != own {
        return Err(s
            .invalid(
                "SigningName",
                format!(
                    "the SDK signs this service's requests as {own:?}; a different signing name \
                     is not supported"
                ),
            )
            .into());
    }
    Ok(o)
}

/// A `Service` value as an endpoint ID: lower case, spaces dropped (`Elastic Load Balancing
/// v2` → `elasticloadbalancingv2`).
fn endpoint_id(service: &str) -> String {
    service.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase()
}

#[cfg(test)]
mod upstream_examples;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_never_quote_a_line_without_key_or_a_url_with_credentials() {
        let err = CloudConfig::parse("[Global]\nKubernetesClusterID = c1\nhunter2-s3cr3t-line!\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("line 3"), "{err}");
        assert!(!err.contains("hunter2"), "the malformed line is quoted back: {err}");
        let err = CloudConfig::parse(
            "[Global]\nKubernetesClusterID = c1\n[ServiceOverride \"1\"]\nService = ec2\nRegion = r\nURL = ftp://user:hunter2pw@host\nSigningRegion = r\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("[ServiceOverride \"1\"] URL"), "{err}");
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
        let cfg = CloudConfig::parse("[Global]\nNotAKey = 1\n").unwrap();
        assert_eq!(cfg.config_warnings().len(), 1, "{:?}", cfg.config_warnings());
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
    fn unknown_keys_and_sections_are_skipped_with_a_warning_naming_them_as_upstream() {
        let cfg = CloudConfig::parse(
            "[Global]\nZone = us-east-1a\nKubernetesClusterIDD = Zq7secret\nZq7bare\n\
             [Globall]\nPassword = Zq7secret\n[Global \"x\"]\nZone = Zq7x\n\
             [ServiceOverride \"1\"]\nService = ec2\nRegion = r\nURL = http://a\n\
             SigningRegion = r\nSigningKey = Zq7secret\n",
        )
        .unwrap();
        assert_eq!(cfg.global.zone, "us-east-1a");
        assert_eq!(cfg.service_overrides.len(), 1);
        let w = cfg.config_warnings();
        assert_eq!(w.len(), 5, "{w:?}");
        assert!(w[0].contains("unknown key [Global] KubernetesClusterIDD (line 3)"), "{w:?}");
        assert!(w[1].contains("[Global] on line 4"), "{w:?}");
        assert!(w[2].contains("unknown section [Globall] (line 5)"), "{w:?}");
        assert!(w[3].contains("[Global \"x\"] (line 7)"), "{w:?}");
        assert!(w[4].contains("[ServiceOverride \"1\"] SigningKey (line 14)"), "{w:?}");
        assert!(!w.join(" ").contains("Zq7"), "a value is shown: {w:?}");
        assert!(CloudConfig::parse("[Global]\nZone = z\n").unwrap().config_warnings().is_empty());
    }

    #[test]
    fn bad_values_name_the_key_and_never_the_value() {
        for (text, key) in [
            (
                "[Global]\nDisableSecurityGroupIngress = Zq7\n",
                "[Global] DisableSecurityGroupIngress",
            ),
            ("[Global]\n\nNodeIPFamilies = Zq7\n", "[Global] NodeIPFamilies"),
            ("[Global]\nNodeIPFamilies = ipv4\nNodeIPFamilies = IPv4\n", "[Global] NodeIPFamilies"),
            (
                "[Global]\nClusterServiceSharedLoadBalancerHealthProbePort = 70000\n",
                "[Global] ClusterServiceSharedLoadBalancerHealthProbePort",
            ),
            (
                "[Global]\nClusterServiceLoadBalancerHealthProbeMode = Zq7\n",
                "[Global] ClusterServiceLoadBalancerHealthProbeMode",
            ),
            ("[Global]\nElbSecurityGroup = Zq7\n", "[Global] ElbSecurityGroup"),
            ("[Global]\nRoleARN = Zq7\n", "[Global] RoleARN"),
            ("[Global]\nSourceARN = Zq7\n", "[Global] SourceARN"),
            ("[Global]\nZone\n", "[Global] Zone"),
            ("[ServiceOverride \"1\"]\nURL = Zq7:5000\n", "[ServiceOverride \"1\"] URL"),
        ] {
            let one = "Service = ec2\nRegion = r\nURL = http://a\nSigningRegion = r\n";
            let text = text
                .replace("[ServiceOverride \"1\"]\n", &format!("[ServiceOverride \"1\"]\n{one}"));
            let err = CloudConfig::parse(&text).unwrap_err();
            match &err {
                ConfigError::Invalid { key: k, .. } => assert_eq!(k, key, "{text}"),
                other => panic!("{text}: expected Invalid, got {other:?}"),
            }
            assert!(err.to_string().contains(key) && !err.to_string().contains("Zq7"), "{err}");
        }
    }

    #[test]
    fn syntax_errors_name_the_line() {
        for (text, line) in [
            ("Zone = x\n", 1),
            ("[Global]\nZone = \"us-east-1a\n", 2),
            ("[Global\n", 1),
            ("[Global]\nunknown key = x\n", 2),
            ("[Global]\nZone = a\n\nKubernetes_Cluster_ID = c\n", 4),
        ] {
            let err = CloudConfig::parse(text).unwrap_err();
            assert!(
                matches!(err, ConfigError::Syntax { line: l, .. } if l == line),
                "{text}: {err:?}"
            );
            assert!(err.to_string().contains(&format!("line {line}")), "{err}");
        }
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
        assert!(err.to_string().contains("same service in the same region"), "{err}");
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
