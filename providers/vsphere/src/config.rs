//! The vSphere cloud config: YAML (preferred) or legacy INI, auto-detected, plus credential
//! resolution (config, Secret data, environment).
//!
//! Detection: a file whose first meaningful line is a `[Section]` header is INI; anything
//! else is YAML. Errors come from the detected format only and name the offending key in
//! that format's spelling (`vcenter.vc1.port`, `VirtualCenter "vc1".port`).
//!
//! ```yaml
//! global: { port: 443, insecureFlag: true, secretName: vsphere-creds, secretNamespace: kube-system }
//! vcenter:
//!   vc1: { server: 10.0.0.1, datacenters: [dc1] }
//! labels: { zone: k8s-zone, region: k8s-region }   # tag category names
//! nodes: { internalNetworkSubnetCidr: 10.0.0.0/24 }
//! ```
//!
//! Values set on a `vcenter` entry override `global`, which overrides the environment
//! (`VSPHERE_VCENTER`, `VSPHERE_VCENTER_PORT`, `VSPHERE_USER`, `VSPHERE_PASSWORD`,
//! `VSPHERE_INSECURE`, `VSPHERE_DATACENTER`). Credentials come from the vCenter entry,
//! then `global`, then the Secret (`<vcenter>.username` / `<vcenter>.password`, keyed by
//! the entry name or the server; read through the API at start by [`crate::credentials`],
//! or files in `secretsDirectory`), then the environment. A vCenter's Secret is its own
//! `secretName`/`secretNamespace`, each falling back to `global`'s. The NSX-T sections (`loadBalancer`, `loadBalancerClass`, `nsxt`, `route`)
//! are accepted and ignored: this provider has no load balancer or routes.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::time::Duration;

use ccm_core::gcfg::{self, Schema, Section, SectionSpec};
use ccm_core::reference::KeyDoc;
use ipnet::IpNet;
use serde::Deserialize;
use serde::de::{self, IgnoredAny, Visitor};

use crate::client::{Endpoint, Secret, normalize_thumbprint};

/// A config error; the message names the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The YAML document does not parse or has an unknown/ill-typed key.
    #[error("vSphere cloud config (YAML): {0}")]
    Yaml(String),
    /// The INI document does not parse (the line is named, never its text).
    #[error("vSphere cloud config (INI): {0}")]
    Ini(String),
    /// A value is invalid.
    #[error("vSphere cloud config: invalid {key}: {message}")]
    Invalid {
        /// The key, in the config's own spelling.
        key: String,
        /// Why.
        message: String,
    },
    /// No user name or password was found for a vCenter.
    #[error(
        "vSphere cloud config: no {what} for vCenter {vcenter}: set {key}, the Secret key {vcenter}.{secret_key} (Secret data or a file in secretsDirectory), or {env}"
    )]
    MissingCredentials {
        /// The vCenter.
        vcenter: String,
        /// `user name` or `password`.
        what: &'static str,
        /// The config key that would hold it.
        key: String,
        /// The Secret data key suffix (`username`/`password`).
        secret_key: &'static str,
        /// The environment variable.
        env: &'static str,
    },
}

/// The config's format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// YAML.
    Yaml,
    /// Legacy INI (gcfg).
    Ini,
}

/// An IP family of node addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IpFamily {
    /// IPv4.
    V4,
    /// IPv6.
    V6,
}

/// Where the vSphere credentials Secret lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRef {
    /// Secret name.
    pub name: String,
    /// Secret namespace.
    pub namespace: String,
}

/// Tag category names for topology labels.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Labels {
    /// Category whose tag is the zone.
    pub zone: Option<String>,
    /// Category whose tag is the region.
    pub region: Option<String>,
}

/// How node addresses are selected among the guest's IPs.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NodeSelection {
    /// InternalIP must be in one of these subnets.
    pub internal_subnets: Vec<IpNet>,
    /// ExternalIP must be in one of these subnets.
    pub external_subnets: Vec<IpNet>,
    /// InternalIP comes from a NIC on this network.
    pub internal_network: Option<String>,
    /// ExternalIP comes from a NIC on this network.
    pub external_network: Option<String>,
    /// InternalIP is never taken from these subnets.
    pub exclude_internal_subnets: Vec<IpNet>,
    /// ExternalIP is never taken from these subnets.
    pub exclude_external_subnets: Vec<IpNet>,
}

/// One vCenter.
#[derive(Debug, Clone, PartialEq)]
pub struct VCenter {
    /// The name of the entry (the `vcenter` key or INI subsection; the server by default).
    pub name: String,
    /// Host name or address.
    pub server: String,
    /// HTTPS port.
    pub port: u16,
    /// User name from the config, if any.
    pub user: Option<String>,
    /// Password from the config, if any.
    pub password: Option<Secret>,
    /// Datacenters to search; empty means all.
    pub datacenters: Vec<String>,
    /// Skip TLS verification.
    pub insecure: bool,
    /// CA bundle to trust.
    pub ca_file: Option<PathBuf>,
    /// Address families for node addresses, in order.
    pub ip_families: Vec<IpFamily>,
    /// The credentials Secret for this vCenter: its own `secretName`/`secretNamespace`,
    /// each falling back to `global`'s.
    pub secret: Option<SecretRef>,
    /// The pinned SHA-1 thumbprint of the server certificate (`AA:BB:...`), if any.
    pub thumbprint: Option<String>,
}

/// The parsed config.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// The format it was read from.
    pub format: Format,
    /// The vCenters, in name order.
    pub vcenters: Vec<VCenter>,
    /// Tag categories for zone/region.
    pub labels: Labels,
    /// Address selection.
    pub nodes: NodeSelection,
    /// The credentials Secret, if configured.
    pub secret: Option<SecretRef>,
    /// A directory holding the Secret's keys as files (`<vcenter>.username`, ...).
    pub secrets_directory: Option<PathBuf>,
    /// What reading an INI file skipped, as upstream's gcfg does: one line per unknown section
    /// or key, naming it, never a value.
    pub warnings: Vec<String>,
}

/// Credential sources besides the config itself.
#[derive(Debug, Clone, Default)]
pub struct CredentialSources {
    /// The data of the Secret named by `secretName`/`secretNamespace`, if read.
    pub secret_data: BTreeMap<String, Secret>,
    /// Environment variables (`VSPHERE_*`, `VCENTER_*`, `SKIP_NODE_DELETION`).
    pub env: BTreeMap<String, String>,
}

impl CredentialSources {
    /// The `VSPHERE_*` variables (and `SKIP_NODE_DELETION`) of this process.
    pub fn from_process_env() -> Self {
        let env = std::env::vars()
            .filter(|(k, _)| {
                k.starts_with("VSPHERE_") || k.starts_with("VCENTER_") || k == "SKIP_NODE_DELETION"
            })
            .collect();
        CredentialSources { secret_data: BTreeMap::new(), env }
    }

    /// Adds the data of the credentials Secret (`data` and `stringData`).
    pub fn with_secret(mut self, secret: &k8s_openapi::api::core::v1::Secret) -> Self {
        for (k, v) in secret.data.iter().flatten() {
            self.secret_data
                .insert(k.clone(), Secret::new(String::from_utf8_lossy(&v.0).trim().to_string()));
        }
        for (k, v) in secret.string_data.iter().flatten() {
            self.secret_data.insert(k.clone(), Secret::new(v.trim().to_string()));
        }
        self
    }
}

// ---- raw (serde) shapes -------------------------------------------------------------

/// A scalar read as text whatever its YAML type (`port: 443` and `port: "443"` both work).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Scalar(String);

impl<'de> Deserialize<'de> for Scalar {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Scalar;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string, number or boolean")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
            fn visit_bool<E: de::Error>(self, v: bool) -> Result<Scalar, E> {
                Ok(Scalar(v.to_string()))
            }
        }
        d.deserialize_any(V)
    }
}

/// A list given as a YAML sequence or as one comma-separated scalar.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct List(Vec<String>);

impl<'de> Deserialize<'de> for List {
    fn deserialize<D: de::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = List;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a list or a comma-separated string")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<List, E> {
                Ok(List(split_list(v)))
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<List, A::Error> {
                let mut out = Vec::new();
                while let Some(Scalar(s)) = seq.next_element()? {
                    out.extend(split_list(&s));
                }
                Ok(List(out))
            }
        }
        d.deserialize_any(V)
    }
}

fn split_list(s: &str) -> Vec<String> {
    s.split(',').map(str::trim).filter(|s| !s.is_empty()).map(String::from).collect()
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawVc {
    user: Option<Scalar>,
    password: Option<Scalar>,
    server: Option<Scalar>,
    port: Option<Scalar>,
    insecure_flag: Option<Scalar>,
    datacenters: Option<List>,
    soap_roundtrip_count: Option<Scalar>,
    ca_file: Option<Scalar>,
    thumbprint: Option<Scalar>,
    secret_name: Option<Scalar>,
    secret_namespace: Option<Scalar>,
    secrets_directory: Option<Scalar>,
    api_disable: Option<Scalar>,
    api_binding: Option<Scalar>,
    ip_family: Option<List>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawLabels {
    zone: Option<Scalar>,
    region: Option<Scalar>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawNodes {
    internal_network_subnet_cidr: Option<List>,
    external_network_subnet_cidr: Option<List>,
    internal_vm_network_name: Option<Scalar>,
    external_vm_network_name: Option<Scalar>,
    exclude_internal_network_subnet_cidr: Option<List>,
    exclude_external_network_subnet_cidr: Option<List>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    global: RawVc,
    #[serde(default)]
    vcenter: BTreeMap<String, RawVc>,
    #[serde(default)]
    labels: RawLabels,
    #[serde(default)]
    nodes: RawNodes,
    load_balancer: Option<IgnoredAny>,
    load_balancer_class: Option<IgnoredAny>,
    nsxt: Option<IgnoredAny>,
    route: Option<IgnoredAny>,
}

// ---- detection and INI ----------------------------------------------------------------

fn detect(text: &str) -> Format {
    let first = text
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty() && !l.starts_with('#') && !l.starts_with(';') && l != &"---");
    match first {
        Some(l) if l.starts_with('[') && l.ends_with(']') && !l.contains(',') => Format::Ini,
        _ => Format::Yaml,
    }
}

/// Every INI key the parser reads, with its documentation: `parse_ini` skips a key that is not
/// here with a warning (as upstream's gcfg does) and the tests feed every example back in, so
/// this table is the parser's own list.
/// `[Global]` keys are also accepted in `[VirtualCenter "<server>"]`, where they override
/// `[Global]` for that server. `ccm-docgen` renders it as the configuration reference.
pub const CONFIG_KEYS: &[KeyDoc] = &[
    KeyDoc {
        section: "Global",
        key: "user",
        value: "string",
        example: "administrator@vsphere.local",
        doc: "vCenter user (else from the credential Secret or secrets directory).",
    },
    KeyDoc {
        section: "Global",
        key: "password",
        value: "string",
        example: "s3cret",
        doc: "vCenter password; never logged.",
    },
    KeyDoc {
        section: "Global",
        key: "server",
        value: "host",
        example: "vc.example.com",
        doc: "A vCenter for `[Global]`-only configs (else the `[VirtualCenter]` section name).",
    },
    KeyDoc {
        section: "Global",
        key: "port",
        value: "port, default 443",
        example: "443",
        doc: "vCenter HTTPS port.",
    },
    KeyDoc {
        section: "Global",
        key: "insecure-flag",
        value: "bool, default false",
        example: "true",
        doc: "Skip TLS verification of vCenter (use `ca-file` or `thumbprint` instead).",
    },
    KeyDoc {
        section: "Global",
        key: "datacenters",
        value: "comma-separated names",
        example: "dc0,dc1",
        doc: "The datacenters searched for Node VMs.",
    },
    KeyDoc {
        section: "Global",
        key: "datacenter",
        value: "comma-separated names",
        example: "dc0",
        doc: "Alias of `datacenters`.",
    },
    KeyDoc {
        section: "Global",
        key: "soap-roundtrip-count",
        value: "count, default 3",
        example: "3",
        doc: "Attempts per SOAP call on transient failures.",
    },
    KeyDoc {
        section: "Global",
        key: "ca-file",
        value: "path",
        example: "/etc/vsphere/ca.pem",
        doc: "CA bundle that signs vCenter's certificate (mount it into the pod).",
    },
    KeyDoc {
        section: "Global",
        key: "thumbprint",
        value: "SHA-1 fingerprint",
        example: "AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01",
        doc: "Pin vCenter's certificate by fingerprint.",
    },
    KeyDoc {
        section: "Global",
        key: "secret-name",
        value: "Secret name",
        example: "vsphere-creds",
        doc: "Read credentials (`<server>.username`/`<server>.password`) from this Secret.",
    },
    KeyDoc {
        section: "Global",
        key: "secret-namespace",
        value: "namespace",
        example: "kube-system",
        doc: "Namespace of `secret-name` (the chart grants a namespaced Role there).",
    },
    KeyDoc {
        section: "Global",
        key: "secrets-directory",
        value: "path",
        example: "/etc/cloud/credentials",
        doc: "Read credentials from files in this directory (a mounted Secret).",
    },
    KeyDoc {
        section: "Global",
        key: "api-disable",
        value: "bool",
        example: "true",
        doc: "Accepted for compatibility (upstream's deprecated gRPC API); no effect.",
    },
    KeyDoc {
        section: "Global",
        key: "api-binding",
        value: "address",
        example: "127.0.0.1:43001",
        doc: "Accepted for compatibility (upstream's deprecated gRPC API); no effect.",
    },
    KeyDoc {
        section: "Global",
        key: "ip-family",
        value: "`ipv4` and/or `ipv6`, default `ipv4`",
        example: "ipv4",
        doc: "Address families reported for Nodes, in order.",
    },
    KeyDoc {
        section: "Global",
        key: "working-dir",
        value: "string",
        example: "kubernetes",
        doc: "Accepted and ignored (in-tree volume plugin key).",
    },
    KeyDoc {
        section: "Global",
        key: "vm-uuid",
        value: "string",
        example: "4201f1e5-0000-0000-0000-000000000000",
        doc: "Accepted and ignored (in-tree key).",
    },
    KeyDoc {
        section: "Global",
        key: "vm-name",
        value: "string",
        example: "node-1",
        doc: "Accepted and ignored (in-tree key).",
    },
    KeyDoc {
        section: "Global",
        key: "service-account",
        value: "string",
        example: "cloud-controller-manager",
        doc: "Accepted and ignored (in-tree key).",
    },
    KeyDoc {
        section: "Labels",
        key: "zone",
        value: "tag category name",
        example: "k8s-zone",
        doc: "The tag category whose tag on a VM's host, cluster or datacenter is its zone.",
    },
    KeyDoc {
        section: "Labels",
        key: "region",
        value: "tag category name",
        example: "k8s-region",
        doc: "The tag category whose tag gives the region.",
    },
    KeyDoc {
        section: "Nodes",
        key: "internal-network-subnet-cidr",
        value: "comma-separated CIDRs",
        example: "10.0.0.0/8",
        doc: "Addresses in these subnets are `InternalIP`.",
    },
    KeyDoc {
        section: "Nodes",
        key: "external-network-subnet-cidr",
        value: "comma-separated CIDRs",
        example: "192.0.2.0/24",
        doc: "Addresses in these subnets are `ExternalIP`.",
    },
    KeyDoc {
        section: "Nodes",
        key: "internal-vm-network-name",
        value: "network name",
        example: "VM Network",
        doc: "Addresses on this VM network are `InternalIP`.",
    },
    KeyDoc {
        section: "Nodes",
        key: "external-vm-network-name",
        value: "network name",
        example: "Public",
        doc: "Addresses on this VM network are `ExternalIP`.",
    },
    KeyDoc {
        section: "Nodes",
        key: "exclude-internal-network-subnet-cidr",
        value: "comma-separated CIDRs",
        example: "10.1.0.0/16",
        doc: "Never report addresses in these subnets as `InternalIP`.",
    },
    KeyDoc {
        section: "Nodes",
        key: "exclude-external-network-subnet-cidr",
        value: "comma-separated CIDRs",
        example: "198.51.100.0/24",
        doc: "Never report addresses in these subnets as `ExternalIP`.",
    },
];

/// The INI file's sections: upstream's `[Global]`, `[VirtualCenter "<server>"]` (which takes
/// `[Global]`'s keys), `[Labels]` and `[Nodes]`; the NSX-T, route and in-tree volume
/// sections are skipped without a warning (other components read them).
static INI_SCHEMA: Schema = Schema {
    table: CONFIG_KEYS,
    sections: &[
        SectionSpec::plain("Global"),
        SectionSpec { name: "VirtualCenter", keys: "Global", kind: gcfg::SectionKind::Named },
        SectionSpec::plain("Labels"),
        SectionSpec::plain("Nodes"),
        SectionSpec::ignored("LoadBalancer"),
        SectionSpec::ignored("LoadBalancerClass"),
        SectionSpec::ignored("NSXT"),
        SectionSpec::ignored("Route"),
        SectionSpec::ignored("Workspace"),
        SectionSpec::ignored("Disk"),
        SectionSpec::ignored("Network"),
    ],
    // `datacenter` is an alias: one key, so the last of either wins.
    canonical: |k| if k == "datacenter" { "datacenters" } else { k },
};

impl From<gcfg::ValueError> for ConfigError {
    fn from(e: gcfg::ValueError) -> Self {
        ConfigError::Invalid { key: e.key, message: e.message }
    }
}

/// The INI config, read with the providers' shared gcfg reader ([`ccm_core::gcfg`], the
/// dialect upstream reads it with): syntax errors give the line, never its text; value errors
/// name the key, never the value. Sections that repeat merge, as in gcfg; a repeated key's last
/// value wins. Unknown sections and keys are skipped with a warning (returned), as upstream's
/// `gcfg.FatalOnly` skips them; a bare word that is no known key (a password pasted on a line
/// of its own) is named by its line only.
fn parse_ini(text: &str) -> Result<(RawConfig, Vec<String>), ConfigError> {
    let parsed = gcfg::read(text, &INI_SCHEMA).map_err(|e| ConfigError::Ini(e.to_string()))?;
    let doc = &parsed.value;
    let mut raw =
        RawConfig { global: ini_vcenter(&doc.section("Global"))?, ..RawConfig::default() };
    for (block, s) in doc.blocks_of("VirtualCenter") {
        let Some(server) = &block.sub else {
            return Err(ConfigError::Ini(format!(
                "line {}: a vCenter needs its server: [VirtualCenter \"<server>\"]",
                block.line
            )));
        };
        raw.vcenter.insert(server.clone(), ini_vcenter(&s)?);
    }
    let s = doc.section("Labels");
    raw.labels = RawLabels { zone: ini_scalar(&s, "zone")?, region: ini_scalar(&s, "region")? };
    let s = doc.section("Nodes");
    raw.nodes = RawNodes {
        internal_network_subnet_cidr: ini_list(&s, "internal-network-subnet-cidr")?,
        external_network_subnet_cidr: ini_list(&s, "external-network-subnet-cidr")?,
        internal_vm_network_name: ini_scalar(&s, "internal-vm-network-name")?,
        external_vm_network_name: ini_scalar(&s, "external-vm-network-name")?,
        exclude_internal_network_subnet_cidr: ini_list(&s, "exclude-internal-network-subnet-cidr")?,
        exclude_external_network_subnet_cidr: ini_list(&s, "exclude-external-network-subnet-cidr")?,
    };
    Ok((raw, parsed.warnings))
}

/// A string value (a bare key is an error naming it).
fn ini_scalar(s: &Section<'_>, key: &'static str) -> Result<Option<Scalar>, ConfigError> {
    Ok(s.opt_string(key)?.map(Scalar))
}

/// A comma-separated list.
fn ini_list(s: &Section<'_>, key: &'static str) -> Result<Option<List>, ConfigError> {
    Ok(s.opt_string(key)?.map(|v| List(split_list(&v))))
}

/// A boolean: gcfg's bare key is `true`; the value is checked with the others.
fn ini_bool(s: &Section<'_>, key: &'static str) -> Option<Scalar> {
    s.last(key).map(|v| Scalar(v.unwrap_or("true").to_string()))
}

/// `[Global]` or `[VirtualCenter "<server>"]`.
fn ini_vcenter(s: &Section<'_>) -> Result<RawVc, ConfigError> {
    Ok(RawVc {
        user: ini_scalar(s, "user")?,
        password: ini_scalar(s, "password")?,
        server: ini_scalar(s, "server")?,
        port: ini_scalar(s, "port")?,
        insecure_flag: ini_bool(s, "insecure-flag"),
        datacenters: ini_list(s, "datacenters")?,
        soap_roundtrip_count: ini_scalar(s, "soap-roundtrip-count")?,
        ca_file: ini_scalar(s, "ca-file")?,
        thumbprint: ini_scalar(s, "thumbprint")?,
        secret_name: ini_scalar(s, "secret-name")?,
        secret_namespace: ini_scalar(s, "secret-namespace")?,
        secrets_directory: ini_scalar(s, "secrets-directory")?,
        api_disable: ini_bool(s, "api-disable"),
        api_binding: ini_scalar(s, "api-binding")?,
        ip_family: ini_list(s, "ip-family")?,
    })
}

// ---- YAML errors ---------------------------------------------------------------------------

/// A YAML parse error as `line L, column C (key.path): what`, never quoting the source: the
/// parser's snippet (the lines around the error, which can hold `password: ...`) is turned
/// off, and anything the message puts in double quotes (a scalar value) is redacted.
fn yaml_error(text: &str, e: &serde_saphyr::Error) -> String {
    let e = e.without_snippet();
    let rendered = e.to_string();
    let Some(loc) = e.location().filter(|l| l.line() > 0) else {
        return redact_quoted(&rendered);
    };
    let (line, column) = (loc.line(), loc.column());
    let message =
        rendered.strip_suffix(&format!(" at line {line}, column {column}")).unwrap_or(&rendered);
    let path = usize::try_from(line)
        .ok()
        .and_then(|l| yaml_key_path(text, l))
        .map(|p| format!(" ({p})"))
        .unwrap_or_default();
    format!("line {line}, column {column}{path}: {}", redact_quoted(message))
}

/// Replaces the contents of every `"..."` in a message by `<redacted>`.
fn redact_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut parts = message.split('"');
    if let Some(first) = parts.next() {
        out.push_str(first);
    }
    for (i, part) in parts.enumerate() {
        if i % 2 == 0 {
            out.push_str("\"<redacted>\"");
        } else {
            out.push_str(part);
        }
    }
    out
}

/// The block-mapping key path of a 1-based line (`vcenter.vc1.port`), from the keys of the
/// line and of its less-indented ancestors. Best effort: `None` when the line holds no key
/// (flow style, sequences). Keys only; values are never read.
fn yaml_key_path(text: &str, line: usize) -> Option<String> {
    let lines: Vec<&str> = text.lines().take(line).collect();
    let mut path = Vec::new();
    let mut limit = usize::MAX;
    for (i, l) in lines.iter().enumerate().rev() {
        let trimmed = l.trim_start();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let indent = l.len() - trimmed.len();
        if indent >= limit {
            continue;
        }
        match block_key(trimmed) {
            Some(key) => path.push(key),
            // The error's own line must be a key; a keyless ancestor ends the path.
            None if i + 1 == lines.len() => return None,
            None => break,
        }
        limit = indent;
        if indent == 0 {
            break;
        }
    }
    path.reverse();
    (!path.is_empty()).then(|| path.join("."))
}

/// The key of a `key: ...` line (plain keys only).
fn block_key(line: &str) -> Option<&str> {
    let (key, rest) = line.split_once(':')?;
    let plain = !key.is_empty()
        && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
    (plain && (rest.is_empty() || rest.starts_with([' ', '\t']))).then_some(key)
}

// ---- validation -------------------------------------------------------------------------

struct Keys {
    format: Format,
}

impl Keys {
    /// A key in the config's spelling: `section` is `None` for global.
    fn key(&self, vc: Option<&str>, yaml: &str, ini: &str) -> String {
        match (self.format, vc) {
            (Format::Yaml, None) => format!("global.{yaml}"),
            (Format::Yaml, Some(vc)) => format!("vcenter.{vc}.{yaml}"),
            (Format::Ini, None) => format!("[Global] {ini}"),
            (Format::Ini, Some(vc)) => format!("[VirtualCenter \"{vc}\"] {ini}"),
        }
    }

    fn section_key(&self, section_yaml: &str, section_ini: &str, yaml: &str, ini: &str) -> String {
        match self.format {
            Format::Yaml => format!("{section_yaml}.{yaml}"),
            Format::Ini => format!("[{section_ini}] {ini}"),
        }
    }
}

fn parse_bool(key: &str, v: &str) -> Result<bool, ConfigError> {
    match v.trim().to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Ok(true),
        "false" | "no" | "off" | "0" | "" => Ok(false),
        // Not quoted back: a value in the wrong place may be a secret.
        _ => Err(ConfigError::Invalid {
            key: key.into(),
            message: "not a boolean (true/false, yes/no, on/off, 1/0)".into(),
        }),
    }
}

fn parse_cidrs(key: String, list: &Option<List>) -> Result<Vec<IpNet>, ConfigError> {
    let Some(List(items)) = list else { return Ok(Vec::new()) };
    items
        .iter()
        .map(|s| {
            s.parse::<IpNet>().map_err(|e| ConfigError::Invalid {
                key: key.clone(),
                message: format!("an entry is not a CIDR: {e}"),
            })
        })
        .collect()
}

fn non_empty(s: &Option<Scalar>) -> Option<String> {
    s.as_ref().map(|s| s.0.trim().to_string()).filter(|s| !s.is_empty())
}

/// Upstream's environment (`FromEnv`, applied after the file, so set variables win):
///
/// - `VSPHERE_SECRET_NAME`, `VSPHERE_SECRET_NAMESPACE`, `VSPHERE_SECRETS_DIRECTORY`,
///   `VSPHERE_LABEL_ZONE`, `VSPHERE_LABEL_REGION` and `VSPHERE_NODES_*` replace the file's
///   `global`/`labels`/`nodes` values;
/// - `VSPHERE_VCENTER_<ID>=<name>` with `VCENTER_<ID>_{SERVER,USERNAME,PASSWORD,PORT,
///   INSECURE,DATACENTERS,CAFILE,THUMBPRINT,SECRET_NAME,SECRET_NAMESPACE,IP_FAMILY}` is a
///   vCenter entry (replacing a file entry of that name); what it leaves out comes from
///   `global`.
///
/// `VSPHERE_VCENTER`, `VSPHERE_VCENTER_PORT`, `VSPHERE_USER`, `VSPHERE_PASSWORD`,
/// `VSPHERE_INSECURE`, `VSPHERE_DATACENTER`, `VSPHERE_CAFILE` and `VSPHERE_THUMBPRINT` are
/// defaults for what neither a vCenter entry nor `global` sets (upstream overwrites its
/// global values with them only after its file entries were filled from `global`, so they
/// never change a vCenter the file configures either).
fn apply_env_overrides(
    raw: &mut RawConfig,
    env: &BTreeMap<String, String>,
) -> Result<(), ConfigError> {
    let get =
        |k: &str| env.get(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty()).map(Scalar);
    let list = |k: &str| get(k).map(|Scalar(v)| List(split_list(&v)));
    let g = &mut raw.global;
    for (var, slot) in [
        ("VSPHERE_SECRET_NAME", &mut g.secret_name),
        ("VSPHERE_SECRET_NAMESPACE", &mut g.secret_namespace),
        ("VSPHERE_SECRETS_DIRECTORY", &mut g.secrets_directory),
        ("VSPHERE_LABEL_ZONE", &mut raw.labels.zone),
        ("VSPHERE_LABEL_REGION", &mut raw.labels.region),
        ("VSPHERE_NODES_INTERNAL_VM_NETWORK_NAME", &mut raw.nodes.internal_vm_network_name),
        ("VSPHERE_NODES_EXTERNAL_VM_NETWORK_NAME", &mut raw.nodes.external_vm_network_name),
    ] {
        if let Some(v) = get(var) {
            *slot = Some(v);
        }
    }
    for (var, slot) in [
        ("VSPHERE_NODES_INTERNAL_NETWORK_SUBNET_CIDR", &mut raw.nodes.internal_network_subnet_cidr),
        ("VSPHERE_NODES_EXTERNAL_NETWORK_SUBNET_CIDR", &mut raw.nodes.external_network_subnet_cidr),
    ] {
        if let Some(v) = list(var) {
            parse_cidrs(var.to_string(), &Some(v.clone()))?;
            *slot = Some(v);
        }
    }
    for (key, value) in env {
        let Some(id) = key.strip_prefix("VSPHERE_VCENTER_") else { continue };
        // `VSPHERE_VCENTER_PORT` is the global port, not a vCenter with the id `PORT`.
        let name = value.trim();
        if id.is_empty() || id == "PORT" || name.is_empty() {
            continue;
        }
        let var = |suffix: &str| get(&format!("VCENTER_{id}_{suffix}"));
        if let Some(Scalar(p)) = var("PORT")
            && p.parse::<u16>().ok().filter(|p| *p != 0).is_none()
        {
            return Err(ConfigError::Invalid {
                key: format!("VCENTER_{id}_PORT"),
                message: "not a port number".into(),
            });
        }
        if let Some(Scalar(v)) = var("INSECURE") {
            parse_bool(&format!("VCENTER_{id}_INSECURE"), &v)?;
        }
        if let Some(Scalar(t)) = var("THUMBPRINT")
            && normalize_thumbprint(&t).is_none()
        {
            return Err(ConfigError::Invalid {
                key: format!("VCENTER_{id}_THUMBPRINT"),
                message: "not a SHA-1 thumbprint (20 hex bytes, e.g. AA:BB:...:FF)".into(),
            });
        }
        let vc = RawVc {
            server: var("SERVER").or_else(|| Some(Scalar(name.to_string()))),
            user: var("USERNAME"),
            password: var("PASSWORD"),
            port: var("PORT"),
            insecure_flag: var("INSECURE"),
            datacenters: var("DATACENTERS").map(|Scalar(v)| List(split_list(&v))),
            ca_file: var("CAFILE"),
            thumbprint: var("THUMBPRINT"),
            secret_name: var("SECRET_NAME"),
            secret_namespace: var("SECRET_NAMESPACE"),
            ip_family: var("IP_FAMILY").map(|Scalar(v)| List(split_list(&v))),
            ..RawVc::default()
        };
        tracing::info!(vcenter = %name, variable = %key, "vSphere: vCenter entry from the environment");
        raw.vcenter.insert(name.to_string(), vc);
    }
    Ok(())
}

impl Config {
    /// Parses a config file (format auto-detected) with the given environment for defaults.
    pub fn parse(bytes: &[u8], env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|e| ConfigError::Invalid {
            key: "cloud config".into(),
            message: format!("not UTF-8: {e}"),
        })?;
        let format = detect(text);
        let (raw, warnings) = match format {
            Format::Ini => parse_ini(text)?,
            Format::Yaml if text.trim().is_empty() => (RawConfig::default(), Vec::new()),
            Format::Yaml => {
                let options = serde_saphyr::options! { with_snippet: false };
                let raw = serde_saphyr::from_str_with_options::<RawConfig>(text, options)
                    .map_err(|e| ConfigError::Yaml(yaml_error(text, &e)))?;
                (raw, Vec::new())
            }
        };
        Ok(Config { warnings, ..Self::validate(format, raw, env)? })
    }

    /// What reading an INI file skipped, as upstream's gcfg (`FatalOnly`) skips it: unknown
    /// sections and keys, one line each naming the section and key, never a value. Each was
    /// logged as a warning when read; the manager may also show them as an Event.
    pub fn config_warnings(&self) -> &[String] {
        &self.warnings
    }

    fn validate(
        format: Format,
        mut raw: RawConfig,
        env: &BTreeMap<String, String>,
    ) -> Result<Config, ConfigError> {
        let keys = Keys { format };
        let env_get = |k: &str| env.get(k).map(|v| v.trim().to_string()).filter(|v| !v.is_empty());
        apply_env_overrides(&mut raw, env)?;
        let g = &raw.global;

        let mut entries: Vec<(String, &RawVc)> =
            raw.vcenter.iter().map(|(k, v)| (k.clone(), v)).collect();
        let empty = RawVc::default();
        // The global server is a vCenter of its own next to the `vcenter` entries (as
        // upstream), unless an entry already has that name or that server and port.
        let global_server = non_empty(&g.server)
            .or_else(|| entries.is_empty().then(|| env_get("VSPHERE_VCENTER")).flatten());
        if let Some(server) = global_server {
            let global_port = non_empty(&g.port);
            let same = |vc: &RawVc| {
                non_empty(&vc.server).as_deref() == Some(server.as_str())
                    && non_empty(&vc.port).or_else(|| global_port.clone()) == global_port
            };
            if !entries.iter().any(|(name, vc)| *name == server || same(vc)) {
                entries.push((server, &empty));
                entries.sort_by(|a, b| a.0.cmp(&b.0));
            }
        }
        if entries.is_empty() {
            return Err(ConfigError::Invalid {
                key: match format {
                    Format::Yaml => "vcenter".into(),
                    Format::Ini => "[VirtualCenter \"<server>\"]".into(),
                },
                message: "no vCenter configured: add a vcenter entry or set the global server (or VSPHERE_VCENTER)"
                    .into(),
            });
        }

        let mut vcenters = Vec::new();
        for (name, vc) in entries {
            let pick = |f: fn(&RawVc) -> &Option<Scalar>| -> Option<(String, String)> {
                if let Some(v) = non_empty(f(vc)) {
                    return Some((v, name.clone()));
                }
                non_empty(f(g)).map(|v| (v, String::new()))
            };
            let key_of = |source: &str, yaml: &str, ini: &str| {
                keys.key(if source.is_empty() { None } else { Some(source) }, yaml, ini)
            };
            let server = non_empty(&vc.server).unwrap_or_else(|| name.clone());
            let port = match pick(|v| &v.port) {
                Some((p, src)) => p.parse::<u16>().ok().filter(|p| *p != 0).ok_or_else(|| {
                    ConfigError::Invalid {
                        key: key_of(&src, "port", "port"),
                        message: "not a port number".into(),
                    }
                })?,
                None => match env_get("VSPHERE_VCENTER_PORT") {
                    Some(p) => p.parse::<u16>().map_err(|_| ConfigError::Invalid {
                        key: "VSPHERE_VCENTER_PORT".into(),
                        message: "not a port number".into(),
                    })?,
                    None => 443,
                },
            };
            let (insecure, insecure_key) = match pick(|v| &v.insecure_flag) {
                Some((v, src)) => {
                    let key = key_of(&src, "insecureFlag", "insecure-flag");
                    (parse_bool(&key, &v)?, key)
                }
                None => match env_get("VSPHERE_INSECURE") {
                    Some(v) => (parse_bool("VSPHERE_INSECURE", &v)?, "VSPHERE_INSECURE".into()),
                    None => (false, String::new()),
                },
            };
            let datacenters = vc
                .datacenters
                .clone()
                .or_else(|| g.datacenters.clone())
                .map(|l| l.0)
                .or_else(|| env_get("VSPHERE_DATACENTER").map(|v| split_list(&v)))
                .unwrap_or_default();
            let ip_src = if vc.ip_family.is_some() { Some(name.as_str()) } else { None };
            let ip_families = match vc.ip_family.as_ref().or(g.ip_family.as_ref()) {
                None => vec![IpFamily::V4],
                Some(List(items)) => {
                    let mut out = Vec::new();
                    for item in items {
                        out.push(match item.to_ascii_lowercase().as_str() {
                            "ipv4" => IpFamily::V4,
                            "ipv6" => IpFamily::V6,
                            _ => {
                                return Err(ConfigError::Invalid {
                                    key: keys.key(ip_src, "ipFamily", "ip-family"),
                                    message: "an entry is not ipv4 or ipv6".into(),
                                });
                            }
                        });
                    }
                    if out.is_empty() { vec![IpFamily::V4] } else { out }
                }
            };
            let secret = match (pick(|v| &v.secret_name), pick(|v| &v.secret_namespace)) {
                (None, None) => None,
                (Some((name, _)), Some((namespace, _))) => Some(SecretRef { name, namespace }),
                (Some((_, src)), None) => {
                    return Err(ConfigError::Invalid {
                        key: key_of(&src, "secretNamespace", "secret-namespace"),
                        message: "required when the secret name is set".into(),
                    });
                }
                (None, Some((_, src))) => {
                    return Err(ConfigError::Invalid {
                        key: key_of(&src, "secretName", "secret-name"),
                        message: "required when the secret namespace is set".into(),
                    });
                }
            };
            let thumbprint = match pick(|v| &v.thumbprint) {
                Some((t, src)) => {
                    Some(normalize_thumbprint(&t).ok_or_else(|| ConfigError::Invalid {
                        key: key_of(&src, "thumbprint", "thumbprint"),
                        message: "not a SHA-1 thumbprint (20 hex bytes, e.g. AA:BB:...:FF)".into(),
                    })?)
                }
                None => match env_get("VSPHERE_THUMBPRINT") {
                    Some(t) => {
                        Some(normalize_thumbprint(&t).ok_or_else(|| ConfigError::Invalid {
                            key: "VSPHERE_THUMBPRINT".into(),
                            message:
                                "not a SHA-1 thumbprint (20 hex bytes, e.g. AA:BB:...:FF)".into(),
                        })?)
                    }
                    None => None,
                },
            };
            if thumbprint.is_some() && insecure {
                tracing::warn!(
                    vcenter = %name,
                    server = %server,
                    setting = %insecure_key,
                    "vSphere: both a thumbprint and insecureFlag are set; the thumbprint is enforced"
                );
            } else if insecure {
                tracing::warn!(
                    vcenter = %name,
                    server = %server,
                    setting = %insecure_key,
                    "vSphere: {insecure_key} is set for vCenter {name}: TLS verification of its \
                     certificate is OFF, so anyone on the path can read the credentials sent to \
                     it; use caFile/ca-file or thumbprint instead"
                );
            }
            vcenters.push(VCenter {
                secret,
                thumbprint,
                name: name.clone(),
                server,
                port,
                user: pick(|v| &v.user).map(|(v, _)| v),
                password: pick(|v| &v.password).map(|(v, _)| Secret::new(v)),
                datacenters,
                insecure,
                ca_file: pick(|v| &v.ca_file)
                    .map(|(v, _)| v)
                    .or_else(|| env_get("VSPHERE_CAFILE"))
                    .map(PathBuf::from),
                ip_families,
            });
        }

        let secret = match (non_empty(&g.secret_name), non_empty(&g.secret_namespace)) {
            (None, None) => None,
            (Some(name), Some(namespace)) => Some(SecretRef { name, namespace }),
            (Some(_), None) => {
                return Err(ConfigError::Invalid {
                    key: keys.key(None, "secretNamespace", "secret-namespace"),
                    message: "required when the secret name is set".into(),
                });
            }
            (None, Some(_)) => {
                return Err(ConfigError::Invalid {
                    key: keys.key(None, "secretName", "secret-name"),
                    message: "required when the secret namespace is set".into(),
                });
            }
        };

        let n = &raw.nodes;
        let nk = |yaml: &str, ini: &str| keys.section_key("nodes", "Nodes", yaml, ini);
        let nodes = NodeSelection {
            internal_subnets: parse_cidrs(
                nk("internalNetworkSubnetCidr", "internal-network-subnet-cidr"),
                &n.internal_network_subnet_cidr,
            )?,
            external_subnets: parse_cidrs(
                nk("externalNetworkSubnetCidr", "external-network-subnet-cidr"),
                &n.external_network_subnet_cidr,
            )?,
            internal_network: non_empty(&n.internal_vm_network_name),
            external_network: non_empty(&n.external_vm_network_name),
            exclude_internal_subnets: parse_cidrs(
                nk("excludeInternalNetworkSubnetCidr", "exclude-internal-network-subnet-cidr"),
                &n.exclude_internal_network_subnet_cidr,
            )?,
            exclude_external_subnets: parse_cidrs(
                nk("excludeExternalNetworkSubnetCidr", "exclude-external-network-subnet-cidr"),
                &n.exclude_external_network_subnet_cidr,
            )?,
        };
        let labels =
            Labels { zone: non_empty(&raw.labels.zone), region: non_empty(&raw.labels.region) };
        if raw.load_balancer.is_some()
            || raw.load_balancer_class.is_some()
            || raw.nsxt.is_some()
            || raw.route.is_some()
        {
            tracing::warn!(
                "vSphere cloud config has NSX-T load balancer/route sections; they are ignored (LoadBalancer and \
                 Routes are not supported by this provider)"
            );
        }
        for (what, set) in [
            ("soapRoundtripCount", g.soap_roundtrip_count.is_some()),
            ("apiDisable/apiBinding", g.api_disable.is_some() || g.api_binding.is_some()),
        ] {
            if set {
                tracing::warn!(
                    key = what,
                    "vSphere cloud config key is not supported and is ignored"
                );
            }
        }
        let secrets_directory = non_empty(&g.secrets_directory).map(PathBuf::from);
        Ok(Config {
            format,
            vcenters,
            labels,
            nodes,
            secret,
            secrets_directory,
            warnings: Vec::new(),
        })
    }

    /// The connection settings of every vCenter, with credentials resolved; fails naming
    /// the first vCenter without a user name or password.
    pub fn endpoints(
        &self,
        sources: &CredentialSources,
        timeout: Duration,
    ) -> Result<Vec<Endpoint>, ConfigError> {
        self.vcenters.iter().map(|vc| self.endpoint(vc, sources, timeout)).collect()
    }

    /// The connection settings of one vCenter, with credentials resolved: the vCenter
    /// entry, then `global`, then the Secret data in `sources` (`<name or server>.username`),
    /// then `secretsDirectory`, then the environment.
    pub fn endpoint(
        &self,
        vc: &VCenter,
        sources: &CredentialSources,
        timeout: Duration,
    ) -> Result<Endpoint, ConfigError> {
        let keys = Keys { format: self.format };
        let secret = |suffix: &str| {
            let names = [vc.name.as_str(), vc.server.as_str()];
            let from_data = names
                .iter()
                .find_map(|n| sources.secret_data.get(&format!("{n}.{suffix}")))
                .filter(|s| !s.is_empty())
                .cloned();
            from_data.or_else(|| {
                let dir = self.secrets_directory.as_ref()?;
                names.iter().find_map(|n| {
                    let text = std::fs::read_to_string(dir.join(format!("{n}.{suffix}"))).ok()?;
                    Some(Secret::new(text.trim().to_string())).filter(|s| !s.is_empty())
                })
            })
        };
        let env = |k: &str| sources.env.get(k).filter(|v| !v.is_empty()).cloned();
        let user = vc
            .user
            .clone()
            .or_else(|| secret("username").map(|s| s.expose().to_string()))
            .or_else(|| env("VSPHERE_USER"))
            .ok_or_else(|| ConfigError::MissingCredentials {
                vcenter: vc.name.clone(),
                what: "user name",
                key: keys.key(Some(&vc.name), "user", "user"),
                secret_key: "username",
                env: "VSPHERE_USER",
            })?;
        let password = vc
            .password
            .clone()
            .or_else(|| secret("password"))
            .or_else(|| env("VSPHERE_PASSWORD").map(Secret::new))
            .ok_or_else(|| ConfigError::MissingCredentials {
                vcenter: vc.name.clone(),
                what: "password",
                key: keys.key(Some(&vc.name), "password", "password"),
                secret_key: "password",
                env: "VSPHERE_PASSWORD",
            })?;
        Ok(Endpoint {
            name: vc.name.clone(),
            server: vc.server.clone(),
            port: vc.port,
            user,
            password,
            insecure: vc.insecure,
            ca_file: vc.ca_file.clone(),
            timeout,
            thumbprint: vc.thumbprint.clone(),
            login: Default::default(),
        })
    }
}

#[cfg(test)]
mod upstream_examples;

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text.as_bytes(), &BTreeMap::new())
    }

    #[test]
    fn every_documented_key_and_example_is_accepted_and_nothing_else() {
        for k in CONFIG_KEYS {
            let mut extra = format!("[{}]\n{} = \"{}\"\n", k.section, k.key, k.example);
            // A Secret name and its namespace come together.
            match k.key {
                "secret-name" => extra.push_str("secret-namespace = kube-system\n"),
                "secret-namespace" => extra.push_str("secret-name = vsphere-creds\n"),
                _ => {}
            }
            let text = if k.section == "Global" {
                format!(
                    "{extra}[VirtualCenter \"10.0.0.1\"]\nuser = u\npassword = p\ndatacenters = dc0\n"
                )
            } else {
                format!(
                    "[VirtualCenter \"10.0.0.1\"]\nuser = u\npassword = p\ndatacenters = dc0\n{extra}"
                )
            };
            if let Err(e) = parse(&text) {
                panic!("[{}] {} = {}: {e}", k.section, k.key, k.example);
            }
        }
        // Anything else is skipped with a warning naming it, as upstream's gcfg skips it.
        let cfg = parse("[Global]\nserver = vc\nnot-a-key = 1\n").unwrap();
        assert_eq!(cfg.config_warnings().len(), 1, "{:?}", cfg.config_warnings());
        assert!(cfg.config_warnings()[0].contains("[Global] not-a-key"));
    }

    #[test]
    fn yaml_with_two_vcenters_and_global_defaults() {
        let cfg = parse(
            r#"
global:
  port: "8443"
  insecureFlag: true
  user: admin
  password: "s3cret"
  datacenters: dc0, dc1
vcenter:
  vc-b:
    server: 10.0.0.2
    port: 9443
    datacenters: [dcb]
    insecureFlag: false
    ipFamily: [ipv6, ipv4]
  vc-a:
    user: other
labels: { zone: k8s-zone, region: k8s-region }
nodes:
  internalNetworkSubnetCidr: 10.0.0.0/24, fd00::/64
  externalVmNetworkName: public
loadBalancer: { ipPoolName: pool }
"#,
        )
        .unwrap();
        assert_eq!(cfg.format, Format::Yaml);
        let [a, b] = &cfg.vcenters[..] else { panic!("{:?}", cfg.vcenters) };
        assert_eq!((a.name.as_str(), a.server.as_str(), a.port), ("vc-a", "vc-a", 8443));
        assert_eq!(a.user.as_deref(), Some("other"));
        assert_eq!(a.datacenters, vec!["dc0", "dc1"]);
        assert!(a.insecure);
        assert_eq!(a.ip_families, vec![IpFamily::V4]);
        assert_eq!((b.server.as_str(), b.port, b.insecure), ("10.0.0.2", 9443, false));
        assert_eq!(b.datacenters, vec!["dcb"]);
        assert_eq!(b.ip_families, vec![IpFamily::V6, IpFamily::V4]);
        assert_eq!(cfg.labels.zone.as_deref(), Some("k8s-zone"));
        assert_eq!(cfg.nodes.internal_subnets.len(), 2);
        assert_eq!(cfg.nodes.external_network.as_deref(), Some("public"));
        assert_eq!(format!("{:?}", b.password), "Some(<redacted>)");
    }

    #[test]
    fn legacy_ini_is_detected() {
        let cfg = parse(
            r#"
; legacy config
[Global]
insecure-flag = "true"
secret-name = "vsphere-creds"
secret-namespace = "kube-system"
port = "443"

[VirtualCenter "10.0.0.1"]
datacenters = "dc0"

[Labels]
zone = k8s-zone
region = k8s-region

[Nodes]
exclude-internal-network-subnet-cidr = "10.1.0.0/16,10.2.0.0/16"
"#,
        )
        .unwrap();
        assert_eq!(cfg.format, Format::Ini);
        assert_eq!(cfg.vcenters.len(), 1);
        assert_eq!(cfg.vcenters[0].server, "10.0.0.1");
        assert!(cfg.vcenters[0].insecure);
        assert_eq!(cfg.vcenters[0].datacenters, vec!["dc0"]);
        assert_eq!(
            cfg.secret,
            Some(SecretRef { name: "vsphere-creds".into(), namespace: "kube-system".into() })
        );
        assert_eq!(cfg.labels.region.as_deref(), Some("k8s-region"));
        assert_eq!(cfg.nodes.exclude_internal_subnets.len(), 2);
    }

    #[test]
    fn errors_name_the_key() {
        let err = |t: &str| parse(t).unwrap_err().to_string();
        let e = err("global:\n  server: vc\n  prot: 443\n");
        assert!(e.contains("prot"), "{e}");
        let e = err("vcenter:\n  vc1:\n    port: http\n");
        assert!(e.contains("vcenter.vc1.port"), "{e}");
        let e = err("global: {server: vc, insecureFlag: maybe}\n");
        assert!(e.contains("global.insecureFlag"), "{e}");
        let e = err("global: {server: vc}\nnodes: {internalNetworkSubnetCidr: 10.0.0.0/33}\n");
        assert!(e.contains("nodes.internalNetworkSubnetCidr"), "{e}");
        let e = err("[Global]\nserver = vc\n[Nodes]\ninternal-network-subnet-cidr = nope\n");
        assert!(e.contains("[Nodes] internal-network-subnet-cidr"), "{e}");
        let e = err("[Global]\nserver = vc\nbogus = 1\n[Global\n");
        assert!(e.contains("line 4") && e.contains("INI"), "{e}");
        let e = err("[VirtualCenter \"vc1\"]\nport = x\n");
        assert!(e.contains("[VirtualCenter \"vc1\"] port"), "{e}");
        let e = err("global: {user: a}\n");
        assert!(e.contains("no vCenter configured"), "{e}");
        let e = err("global: [unclosed\n");
        assert!(e.contains("YAML"), "{e}");
        let e = err("global: {server: vc, secretName: s}\n");
        assert!(e.contains("global.secretNamespace"), "{e}");
        let e = err("vcenter: {vc: {ipFamily: ipv5}}\n");
        assert!(e.contains("vcenter.vc.ipFamily"), "{e}");
    }

    /// Captures what `tracing` logs on this thread while `f` runs.
    fn logged<T>(f: impl FnOnce() -> T) -> (T, String) {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_ansi(false)
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .finish();
        let out = {
            let _guard = tracing::subscriber::set_default(subscriber);
            ccm_core::testing::anchor_tracing();
            f()
        };
        let text = String::from_utf8_lossy(&buf.0.lock().unwrap()).into_owned();
        (out, text)
    }

    /// Issue #29 (MED 7): a password pasted on a line of its own in an INI config is never
    /// echoed, neither in the error nor in the log; the error names the section and the line.
    #[test]
    fn a_bare_line_in_an_ini_config_is_named_by_its_line_never_echoed() {
        let mut failures = Vec::new();
        for (what, pw, text, line) in [
            (
                "[Global], a word, a key after it",
                "hunter2secret",
                "[Global]\nuser = u\npassword =\nhunter2secret\nport = 443\n",
                4,
            ),
            (
                "[Global], a word at the end",
                "hunter2secret",
                "[Global]\nuser = u\nhunter2secret\n",
                3,
            ),
            (
                "[VirtualCenter], a word with dashes",
                "hunter2-secret-9",
                "[Global]\nuser = u\n[VirtualCenter \"vc1\"]\nhunter2-secret-9\nport = 443\n",
                4,
            ),
            ("[Labels]", "hunter2secret", "[Labels]\nzone = z\nhunter2secret\nregion = r\n", 3),
            ("[Nodes]", "hunter2secret", "[Nodes]\nhunter2secret  ; a comment\n", 2),
            (
                "punctuation",
                "hunter2$ecret!",
                "[Global]\nserver = vc\nhunter2$ecret!\nport = 443\n",
                3,
            ),
            ("blanks", "hunter2 secret", "[Global]\nserver = vc\n  hunter2 secret\nport = 1\n", 3),
            ("an unknown section", "hunter2secret", "[Global]\n[Bogus]\nhunter2secret\n", 2),
        ] {
            // A bare word is skipped with a warning, as upstream's gcfg skips an unknown key
            // (the config may then fail for what it lacks); other text is a syntax error.
            let (result, logs) = logged(|| parse(text));
            let shown = match &result {
                Err(err) => format!("{err} {err:?}"),
                Ok(c) => c.config_warnings().join("\n"),
            };
            eprintln!("{what}: {shown}");
            let fragment = &pw[..7];
            if shown.contains(fragment) {
                failures
                    .push(format!("{what}: the error or warning quotes the bare line: {shown}"));
            }
            if logs.contains(fragment) {
                failures.push(format!("{what}: the log quotes the bare line: {logs}"));
            }
            if !format!("{shown}\n{logs}").contains(&format!("line {line}")) {
                failures.push(format!("{what}: no `line {line}` in: {shown}\n{logs}"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    /// Issue #29 (LOW): `insecureFlag` turns TLS verification off; it is said once at start,
    /// naming the setting as written and the vCenter it applies to.
    #[test]
    fn an_insecure_flag_is_warned_about_naming_the_setting_and_the_vcenter() {
        for (text, setting, vcenter) in [
            (
                "[Global]\nuser = u\n[VirtualCenter \"10.0.0.1\"]\ninsecure-flag = true\n",
                "[VirtualCenter \"10.0.0.1\"] insecure-flag",
                "10.0.0.1",
            ),
            (
                "global: {insecureFlag: true}\nvcenter: {vc1: {server: 10.0.0.1}}\n",
                "global.insecureFlag",
                "vc1",
            ),
        ] {
            let (cfg, logs) = logged(|| parse(text));
            assert!(cfg.unwrap().vcenters[0].insecure, "{text}");
            let warnings: Vec<&str> = logs.lines().filter(|l| l.contains("WARN")).collect();
            assert_eq!(warnings.len(), 1, "{logs}");
            let w = warnings[0];
            assert!(
                w.contains(setting)
                    && w.contains(&format!("vCenter {vcenter}"))
                    && w.contains("TLS verification"),
                "{w}"
            );
        }
        for quiet in [
            "[VirtualCenter \"10.0.0.1\"]\ninsecure-flag = false\n",
            "vcenter: {vc1: {server: 10.0.0.1}}\n",
        ] {
            let (cfg, logs) = logged(|| parse(quiet));
            assert!(!cfg.unwrap().vcenters[0].insecure);
            assert!(!logs.contains("TLS verification"), "{quiet}: {logs}");
        }
        // gcfg: a bare boolean key is true.
        let cfg = parse("[VirtualCenter \"10.0.0.1\"]\ninsecure-flag\n").unwrap();
        assert!(cfg.vcenters[0].insecure);
    }

    /// Issue #11: a parse error next to the password names the key and the line, and never
    /// quotes the config text (the parser's snippet used to print `password: "..."`).
    #[test]
    fn parse_errors_name_the_key_and_line_but_never_quote_the_password() {
        const PW: &str = "s3cr3t-4f9c1a";
        let cases: &[(&str, String, &[&str])] = &[
            (
                "wrong-typed value",
                format!("global:\n  user: u\n  password: \"{PW}\"\n  port: [443]\n"),
                &["line 4", "global.port"],
            ),
            (
                "syntax error (mis-indented key)",
                format!("global:\n  user: u\n password: \"{PW}\"\n  port: 443\n"),
                &["line 3", "global.password"],
            ),
            (
                "unknown key",
                format!("vcenter:\n  vc1:\n    user: u\n    password: \"{PW}\"\n    prot: 443\n"),
                &["line 5", "vcenter.vc1.prot", "unknown field"],
            ),
            (
                "unclosed quote in the password itself",
                format!("global:\n  password: \"{PW}\n  user: u\n"),
                &["line 2", "global.password"],
            ),
            (
                "the password where a mapping belongs",
                format!("global: \"{PW}\"\n"),
                &["line 1", "global"],
            ),
            (
                "password as a mapping",
                format!("global:\n  password: {{x: {PW}}}\n"),
                &["line 2", "global.password"],
            ),
            (
                "legacy INI, unclosed quote",
                format!("[Global]\nuser = u\npassword = \"{PW}\nport = 443\n"),
                &["INI", "line"],
            ),
        ];
        for (what, text, wanted) in cases {
            let err = parse(text).unwrap_err();
            let shown = err.to_string();
            eprintln!("{what}: {shown}");
            for s in [&shown, &format!("{err:?}")] {
                assert!(!s.contains("s3cr3t"), "{what}: the error quotes the password: {s}");
            }
            for w in *wanted {
                assert!(shown.contains(w), "{what}: {w:?} missing in {shown}");
            }
        }
    }

    #[test]
    fn credentials_resolve_in_order_and_missing_ones_are_named() {
        let cfg = parse("vcenter:\n  vc1: {server: 10.0.0.1}\n  vc2: {user: u2, password: p2}\n")
            .unwrap();
        let t = Duration::from_secs(5);
        let err = cfg.endpoints(&CredentialSources::default(), t).unwrap_err().to_string();
        assert!(
            err.contains("vCenter vc1")
                && err.contains("vcenter.vc1.user")
                && err.contains("vc1.username"),
            "{err}"
        );

        let mut sources = CredentialSources::default();
        sources.secret_data.insert("10.0.0.1.username".into(), Secret::new("su"));
        sources.secret_data.insert("10.0.0.1.password".into(), Secret::new("sp"));
        sources.env.insert("VSPHERE_USER".into(), "eu".into());
        let eps = cfg.endpoints(&sources, t).unwrap();
        assert_eq!((eps[0].user.as_str(), eps[0].password.expose()), ("su", "sp"));
        assert_eq!((eps[1].user.as_str(), eps[1].password.expose()), ("u2", "p2"));

        let mut env_only = CredentialSources::default();
        env_only.env.insert("VSPHERE_USER".into(), "eu".into());
        let err = cfg.endpoints(&env_only, t).unwrap_err().to_string();
        assert!(
            err.contains("no password for vCenter vc1") && err.contains("VSPHERE_PASSWORD"),
            "{err}"
        );
    }

    #[test]
    fn secret_objects_and_secrets_directories_provide_credentials() {
        let dir = std::env::temp_dir().join(format!("ccm-vsphere-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("vc1.username"), "file-user\n").unwrap();
        std::fs::write(dir.join("vc1.password"), "file-pass\n").unwrap();
        let cfg = Config::parse(
            format!(
                "global:\n  secretsDirectory: {}\nvcenter:\n  vc1: {{}}\n  vc2: {{}}\n",
                dir.display()
            )
            .as_bytes(),
            &BTreeMap::new(),
        )
        .unwrap();
        let secret = k8s_openapi::api::core::v1::Secret {
            data: Some(
                [("vc2.username", "s-user"), ("vc2.password", "s-pass")]
                    .map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.as_bytes().to_vec())))
                    .into(),
            ),
            ..Default::default()
        };
        let sources = CredentialSources::default().with_secret(&secret);
        let eps = cfg.endpoints(&sources, Duration::from_secs(1)).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!((eps[0].user.as_str(), eps[0].password.expose()), ("file-user", "file-pass"));
        assert_eq!((eps[1].user.as_str(), eps[1].password.expose()), ("s-user", "s-pass"));
    }

    #[test]
    fn environment_fills_what_the_config_leaves_out() {
        let env: BTreeMap<String, String> = [
            ("VSPHERE_VCENTER", "vc.example"),
            ("VSPHERE_VCENTER_PORT", "8443"),
            ("VSPHERE_INSECURE", "true"),
            ("VSPHERE_DATACENTER", "dc9"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let cfg = Config::parse(b"labels: {zone: z}\n", &env).unwrap();
        let vc = &cfg.vcenters[0];
        assert_eq!((vc.server.as_str(), vc.port, vc.insecure), ("vc.example", 8443, true));
        assert_eq!(vc.datacenters, vec!["dc9"]);
    }

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// Issue 14: upstream's `FromEnv` runs after the file, so a set variable wins over the
    /// file's global/labels/nodes; `VSPHERE_VCENTER_<ID>` with `VCENTER_<ID>_*` is a vCenter.
    #[test]
    fn upstreams_environment_overrides_the_file_and_defines_vcenters() {
        let file = "global:\n  secretName: file-secret\n  secretNamespace: file-ns\n\
                    vcenter:\n  vc-file: {server: 10.0.0.1}\n  vc-env: {server: 10.9.9.9, user: replaced}\n\
                    labels: {zone: file-zone, region: file-region}\n\
                    nodes: {internalVmNetworkName: file-net}\n";
        let e = env(&[
            ("VSPHERE_SECRET_NAME", "env-secret"),
            ("VSPHERE_SECRET_NAMESPACE", "env-ns"),
            ("VSPHERE_LABEL_ZONE", "env-zone"),
            ("VSPHERE_NODES_INTERNAL_VM_NETWORK_NAME", "env-net"),
            ("VSPHERE_NODES_EXTERNAL_NETWORK_SUBNET_CIDR", "192.168.0.0/16"),
            ("VSPHERE_VCENTER_PORT", "8443"),
            ("VSPHERE_VCENTER_X", "vc-env"),
            ("VCENTER_X_SERVER", "10.0.0.2"),
            ("VCENTER_X_PORT", "9443"),
            ("VCENTER_X_INSECURE", "true"),
            ("VCENTER_X_DATACENTERS", "dc1,dc2"),
            ("VCENTER_X_THUMBPRINT", "aa:bb:cc:dd:ee:ff:00:11:22:33:44:55:66:77:88:99:aa:bb:cc:dd"),
            ("VCENTER_X_SECRET_NAME", "x-secret"),
            ("VCENTER_X_SECRET_NAMESPACE", "x-ns"),
        ]);
        let cfg = Config::parse(file.as_bytes(), &e).unwrap();
        assert_eq!(
            cfg.secret,
            Some(SecretRef { name: "env-secret".into(), namespace: "env-ns".into() })
        );
        assert_eq!(cfg.labels.zone.as_deref(), Some("env-zone"));
        assert_eq!(cfg.labels.region.as_deref(), Some("file-region"));
        assert_eq!(cfg.nodes.internal_network.as_deref(), Some("env-net"));
        assert_eq!(cfg.nodes.external_subnets.len(), 1);
        // `VSPHERE_VCENTER_PORT` is the default port, never a vCenter named "8443".
        let names: Vec<&str> = cfg.vcenters.iter().map(|v| v.name.as_str()).collect();
        assert_eq!(names, ["vc-env", "vc-file"]);
        let (env_vc, file_vc) = (&cfg.vcenters[0], &cfg.vcenters[1]);
        assert_eq!(
            (env_vc.server.as_str(), env_vc.port, env_vc.insecure),
            ("10.0.0.2", 9443, true)
        );
        assert_eq!(env_vc.user, None, "the environment entry replaces the file entry of that name");
        assert_eq!(env_vc.datacenters, ["dc1", "dc2"]);
        assert_eq!(
            env_vc.thumbprint.as_deref(),
            Some("AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD")
        );
        assert_eq!(
            env_vc.secret,
            Some(SecretRef { name: "x-secret".into(), namespace: "x-ns".into() })
        );
        assert_eq!(file_vc.port, 8443);
        assert_eq!(
            file_vc.secret,
            Some(SecretRef { name: "env-secret".into(), namespace: "env-ns".into() })
        );

        let err = |pairs: &[(&str, &str)]| Config::parse(b"", &env(pairs)).unwrap_err().to_string();
        let e = err(&[("VSPHERE_VCENTER_A", "vc"), ("VCENTER_A_PORT", "x")]);
        assert!(e.contains("VCENTER_A_PORT"), "{e}");
        let e = err(&[("VSPHERE_VCENTER_A", "vc"), ("VCENTER_A_THUMBPRINT", "nope")]);
        assert!(e.contains("VCENTER_A_THUMBPRINT"), "{e}");
        let e =
            err(&[("VSPHERE_VCENTER", "vc"), ("VSPHERE_NODES_INTERNAL_NETWORK_SUBNET_CIDR", "x")]);
        assert!(e.contains("VSPHERE_NODES_INTERNAL_NETWORK_SUBNET_CIDR"), "{e}");
    }

    /// Issue 14: the global `server` is a vCenter next to the `vcenter` entries (upstream),
    /// unless an entry already is that vCenter.
    #[test]
    fn the_global_server_joins_the_vcenter_entries() {
        let cfg =
            parse("global: {server: 10.0.0.9, user: u}\nvcenter: {vc1: {server: 10.0.0.1}}\n")
                .unwrap();
        let names: Vec<(&str, &str)> =
            cfg.vcenters.iter().map(|v| (v.name.as_str(), v.server.as_str())).collect();
        assert_eq!(names, [("10.0.0.9", "10.0.0.9"), ("vc1", "10.0.0.1")]);
        assert_eq!(cfg.vcenters[0].user.as_deref(), Some("u"));
        for same in [
            "global: {server: 10.0.0.1}\nvcenter: {vc1: {server: 10.0.0.1}}\n",
            "global: {server: vc1}\nvcenter: {vc1: {server: 10.0.0.1}}\n",
            "[Global]\nserver = 10.0.0.1\n[VirtualCenter \"10.0.0.1\"]\n",
        ] {
            assert_eq!(parse(same).unwrap().vcenters.len(), 1, "{same}");
        }
        // Another port is another vCenter.
        let cfg = parse("global: {server: 10.0.0.1, port: 443}\nvcenter: {vc1: {server: 10.0.0.1, port: 8443}}\n")
            .unwrap();
        assert_eq!(cfg.vcenters.len(), 2);
    }

    #[test]
    fn thumbprints_fall_back_to_global_and_bad_ones_name_the_key() {
        let tp = "AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD";
        let cfg = parse(&format!(
            "global: {{thumbprint: \"{tp}\"}}\nvcenter: {{vc1: {{}}, vc2: {{thumbprint: \"{}\"}}}}\n",
            tp.replace("AA", "00")
        ))
        .unwrap();
        assert_eq!(cfg.vcenters[0].thumbprint.as_deref(), Some(tp));
        assert_eq!(cfg.vcenters[1].thumbprint, Some(tp.replace("AA", "00")));
        let e = parse("vcenter: {vc1: {thumbprint: abc}}\n").unwrap_err().to_string();
        assert!(e.contains("vcenter.vc1.thumbprint"), "{e}");
        let e = parse("[Global]\nserver = vc\nthumbprint = abc\n").unwrap_err().to_string();
        assert!(e.contains("[Global] thumbprint"), "{e}");
    }
}
