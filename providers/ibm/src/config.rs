//! The cloud config: upstream's gcfg INI (`[global]`, `[kubernetes]`,
//! `[load-balancer-deployment]`, `[provider]`), validated for VPC (`cluster-default-provider
//! = g2`), and the endpoints it implies.
//!
//! Owns parsing, validation (every error names the key, never quotes a value that could be a
//! secret), and endpoint resolution: `g2EndpointOverride` / `iamEndpointOverride` /
//! `rmEndpointOverride` / `taggingEndpointOverride`, else IBM's regional (private unless
//! `ENABLE_VPC_PUBLIC_ENDPOINT=true`, as upstream) endpoints. An override must be `https://`:
//! plain `http://` (the API key and bearer tokens in clear text) is refused unless the host is
//! a loopback address (the traffic never leaves the machine: a local TLS-terminating proxy,
//! a test emulator) or `[provider] allowHttpEndpoints = true` says so explicitly. The API key itself is not in the config: `g2Credentials` names the
//! file holding it, read by [`crate::client`] whenever a token is needed (so a rotated key is
//! picked up without a restart).
//!
//! **Syntax** is gcfg's, read by the providers' shared reader [`ccm_core::gcfg`], as upstream
//! reads it: a syntax error is fatal and names its line; an unknown section or key is skipped
//! with a warning naming it ([`Config::config_warnings`]: the manager shows them as an Event at
//! start), as upstream's `gcfg.FatalOnly` skips it; `[load-balancer-deployment]` (classic
//! only) is skipped without one.

use std::collections::BTreeMap;
use std::path::PathBuf;

use ccm_core::gcfg::{self, Schema, Section, SectionSpec};
use ccm_core::reference::KeyDoc;

/// The versions of the cloud config upstream accepts in `[global] version`.
pub const SUPPORTED_VERSIONS: [&str; 2] = ["1.0.0", "1.1.0"];

/// The provider type for VPC Gen2 infrastructure.
pub const PROVIDER_TYPE_VPC: &str = "g2";

/// Why the cloud config cannot be used. Each message names the key (`[section] key`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// No cloud config was given (upstream requires one).
    #[error("cloud config required but none specified (--cloud-config)")]
    Missing,
    /// The file is not valid gcfg INI (the line is named, never its text).
    #[error("cloud config is not valid INI: {0}")]
    Syntax(String),
    /// A value that cannot be read as its type (names the key, never the value).
    #[error(transparent)]
    Value(#[from] gcfg::ValueError),
    /// A required key is missing or empty.
    #[error("missing required cloud configuration setting: {0}")]
    Required(&'static str),
    /// A key has a value that cannot be used.
    #[error("invalid cloud configuration setting {key}: {message}")]
    Invalid {
        /// The key, e.g. `[provider] cluster-default-provider`.
        key: &'static str,
        /// Why (never quoting a credential).
        message: String,
    },
}

/// The parsed `[provider]` section and the settings that matter for VPC.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Config {
    /// `[global] version`.
    pub version: String,
    /// `[kubernetes] config-file` (ignored: the manager's `--kubeconfig` is used).
    pub kube_config_files: Vec<String>,
    /// `[kubernetes] set-network-unavailable`: mark new Nodes `NetworkUnavailable`.
    pub set_network_unavailable: bool,
    /// `[kubernetes] cniProvider`.
    pub cni_provider: String,
    /// `[provider] accountID`.
    pub account_id: String,
    /// `[provider] clusterID`.
    pub cluster_id: String,
    /// `[provider] region`.
    pub region: String,
    /// `[provider] g2workerServiceAccountID` (empty when not set).
    pub worker_account_id: String,
    /// `[provider] g2VpcName`.
    pub vpc_name: String,
    /// `[provider] g2Credentials`: the file holding the IBM Cloud API key.
    pub credentials_file: PathBuf,
    /// `[provider] g2ResourceGroupName`.
    pub resource_group_name: String,
    /// `[provider] g2VpcSubnetNames`, split at commas.
    pub subnet_names: Vec<String>,
    /// The VPC API base URL, with `/v1`.
    pub vpc_url: String,
    /// The IAM token URL (`.../identity/token`).
    pub iam_token_url: String,
    /// The Resource Manager base URL (resource groups live under `/v2/resource_groups`).
    pub resource_manager_url: String,
    /// The Global Tagging base URL (`/v3/tags`).
    pub tagging_url: String,
    /// `[provider] allowHttpEndpoints`: plain `http://` overrides to non-loopback hosts.
    pub allow_http_endpoints: bool,
    /// What reading the file skipped, as upstream does: one line per unknown section or key,
    /// naming it, never a value.
    pub warnings: Vec<String>,
}

/// The file's sections; `[load-balancer-deployment]` (classic's keepalived deployment) is
/// skipped without a warning on VPC.
static SCHEMA: Schema = Schema {
    table: CONFIG_KEYS,
    sections: &[
        SectionSpec::plain("global"),
        SectionSpec::plain("kubernetes"),
        SectionSpec::plain("provider"),
        SectionSpec::ignored("load-balancer-deployment"),
    ],
    canonical: gcfg::no_aliases,
};

/// A string setting, trimmed; empty when absent.
fn trimmed(s: &Section<'_>, key: &'static str) -> Result<String, ConfigError> {
    Ok(s.string(key)?.trim().to_string())
}

/// A boolean setting: absent or empty is false, a bare key true (gcfg's blank value).
fn boolean(s: &Section<'_>, named: &'static str, key: &'static str) -> Result<bool, ConfigError> {
    match s.last(key) {
        None => Ok(false),
        Some(None) => Ok(true),
        Some(Some(v)) => parse_bool(named, v.trim()),
    }
}

/// Every key the parser reads, with its documentation: the parser reads only keys listed here
/// (checked in debug builds and so by every test), unknown keys are skipped with a warning (as
/// upstream's gcfg skips them), and the tests feed every example back in. `ccm-docgen`
/// renders it as the configuration reference.
pub const CONFIG_KEYS: &[KeyDoc] = &[
    KeyDoc {
        section: "global",
        key: "version",
        value: "`1.0.0` or `1.1.0`, required",
        example: "1.1.0",
        doc: "The config format version.",
    },
    KeyDoc {
        section: "kubernetes",
        key: "config-file",
        value: "path",
        example: "/etc/kubernetes/kubeconfig",
        doc: "Accepted; ignored (the manager's `--kubeconfig` is used).",
    },
    KeyDoc {
        section: "kubernetes",
        key: "set-network-unavailable",
        value: "bool",
        example: "false",
        doc: "`true`: a new Node (still tainted `uninitialized`) without a `NetworkUnavailable` condition gets `NetworkUnavailable=True` (reason `No CNI present`) when it is initialised, until its CNI clears it; not with `cniProvider = OVNKubernetes` (as upstream).",
    },
    KeyDoc {
        section: "kubernetes",
        key: "cniProvider",
        value: "string",
        example: "calico",
        doc: "The cluster's CNI, as upstream: with `OVNKubernetes`, `set-network-unavailable` sets no condition.",
    },
    KeyDoc {
        section: "provider",
        key: "cluster-default-provider",
        value: "`g2`, required",
        example: "g2",
        doc: "Infrastructure type: only VPC (`g2`) is supported.",
    },
    KeyDoc {
        section: "provider",
        key: "accountID",
        value: "string, required",
        example: "acct1",
        doc: "The IBM Cloud account of the cluster.",
    },
    KeyDoc {
        section: "provider",
        key: "clusterID",
        value: "string, required",
        example: "clus1",
        doc: "The cluster ID; load balancers are named and tagged with it.",
    },
    KeyDoc {
        section: "provider",
        key: "region",
        value: "string, required",
        example: "us-south",
        doc: "The VPC region; picks the regional (private) endpoints.",
    },
    KeyDoc {
        section: "provider",
        key: "g2workerServiceAccountID",
        value: "string",
        example: "acct1",
        doc: "Account the workers were allocated under; when it differs from `accountID`, Nodes without IKS labels cannot be looked up in the VPC.",
    },
    KeyDoc {
        section: "provider",
        key: "g2VpcName",
        value: "string, required",
        example: "vpc-a",
        doc: "The cluster's VPC.",
    },
    KeyDoc {
        section: "provider",
        key: "g2Credentials",
        value: "path, required",
        example: "/etc/ibm/api-key",
        doc: "File holding the IBM Cloud API key (re-read when a token is needed, so rotation needs no restart).",
    },
    KeyDoc {
        section: "provider",
        key: "g2ResourceGroupName",
        value: "string, required",
        example: "default",
        doc: "Resource group of the VPC and the load balancers.",
    },
    KeyDoc {
        section: "provider",
        key: "g2VpcSubnetNames",
        value: "comma-separated names, required",
        example: "subnet-1,subnet-2",
        doc: "The cluster's subnets (default load balancer subnets).",
    },
    KeyDoc {
        section: "provider",
        key: "g2EndpointOverride",
        value: "https URL",
        example: "https://us-south.iaas.cloud.ibm.com",
        doc: "VPC API endpoint instead of the regional one.",
    },
    KeyDoc {
        section: "provider",
        key: "iamEndpointOverride",
        value: "https URL",
        example: "https://iam.cloud.ibm.com",
        doc: "IAM endpoint instead of the private one.",
    },
    KeyDoc {
        section: "provider",
        key: "rmEndpointOverride",
        value: "https URL",
        example: "https://resource-controller.cloud.ibm.com",
        doc: "Resource Manager endpoint.",
    },
    KeyDoc {
        section: "provider",
        key: "taggingEndpointOverride",
        value: "https URL",
        example: "https://tags.global-search-tagging.cloud.ibm.com",
        doc: "Global Tagging endpoint (ownership tags of load balancers named by `vpc-lb-name`) instead of IBM's (private unless `ENABLE_VPC_PUBLIC_ENDPOINT=true`).",
    },
    KeyDoc {
        section: "provider",
        key: "allowHttpEndpoints",
        value: "bool, default `false`",
        example: "false",
        doc: "Allow plain `http://` endpoint overrides to non-loopback hosts (the API key and tokens then travel in clear text). Loopback hosts are always allowed.",
    },
    KeyDoc {
        section: "provider",
        key: "providerID",
        value: "string",
        example: "ibm://acct1///clus1/w1",
        doc: "Accepted; unused on VPC (upstream's classic/test key).",
    },
    KeyDoc {
        section: "provider",
        key: "internalIP",
        value: "string",
        example: "10.0.0.4",
        doc: "Accepted; unused on VPC.",
    },
    KeyDoc {
        section: "provider",
        key: "externalIP",
        value: "string",
        example: "169.0.0.4",
        doc: "Accepted; unused on VPC.",
    },
    KeyDoc {
        section: "provider",
        key: "zone",
        value: "string",
        example: "us-south-1",
        doc: "Accepted; unused on VPC.",
    },
    KeyDoc {
        section: "provider",
        key: "instanceType",
        value: "string",
        example: "bx2.4x16",
        doc: "Accepted; unused on VPC.",
    },
    KeyDoc {
        section: "provider",
        key: "iksPrivateEndpointHostname",
        value: "string",
        example: "c1.private.us-south.containers.cloud.ibm.com",
        doc: "Accepted; unused.",
    },
    KeyDoc {
        section: "provider",
        key: "cloudCredentials",
        value: "string",
        example: "x",
        doc: "Accepted; unused (classic).",
    },
];

fn parse_bool(key: &'static str, value: &str) -> Result<bool, ConfigError> {
    match value.to_ascii_lowercase().as_str() {
        "" | "false" | "no" | "off" | "0" => Ok(false),
        "true" | "yes" | "on" | "1" => Ok(true),
        _ => Err(ConfigError::Invalid {
            key,
            message: "not a boolean (true/false, yes/no, on/off, 1/0)".into(),
        }),
    }
}

/// Whether the URL's host is a loopback address (`127.0.0.0/8`, `::1`) or `localhost`.
fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Ipv4(a)) => a.is_loopback(),
        Some(url::Host::Ipv6(a)) => a.is_loopback(),
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        None => false,
    }
}

/// An endpoint override: `https://`, or `http://` to a loopback host, or `http://` anywhere
/// with `allow_http` (`[provider] allowHttpEndpoints`).
fn parse_url(key: &'static str, value: &str, allow_http: bool) -> Result<String, ConfigError> {
    let url = url::Url::parse(value)
        .map_err(|e| ConfigError::Invalid { key, message: format!("not a URL ({e})") })?;
    match url.scheme() {
        "https" => {}
        "http" if is_loopback(&url) => {
            tracing::warn!(key, "cloud config: plain http:// endpoint on a loopback host");
        }
        "http" if allow_http => {
            tracing::warn!(
                key,
                "cloud config: plain http:// endpoint allowed by [provider] allowHttpEndpoints: \
                 the API key and tokens travel in clear text"
            );
        }
        "http" => {
            return Err(ConfigError::Invalid {
                key,
                message: "plain http:// would send the API key and tokens in clear text: use \
                          https://, or set [provider] allowHttpEndpoints = true to allow it"
                    .into(),
            });
        }
        _ => {
            return Err(ConfigError::Invalid { key, message: "the URL must be https".into() });
        }
    }
    Ok(value.trim_end_matches('/').to_string())
}

impl Config {
    /// Parses and validates the cloud config. `env` is the process environment
    /// (`ENABLE_VPC_PUBLIC_ENDPOINT=true` selects IBM's public endpoints, as upstream).
    pub fn parse(text: &str, env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
        let parsed = gcfg::read(text, &SCHEMA).map_err(|e| ConfigError::Syntax(e.to_string()))?;
        let doc = &parsed.value;
        let (global, kubernetes, provider) =
            (doc.section("global"), doc.section("kubernetes"), doc.section("provider"));
        let version = trimmed(&global, "version")?;
        if !SUPPORTED_VERSIONS.contains(&version.as_str()) {
            return Err(ConfigError::Invalid {
                key: "[global] version",
                message: format!(
                    "not a supported version (use {})",
                    SUPPORTED_VERSIONS.join(" or ")
                ),
            });
        }
        let p = |k: &'static str| trimmed(&provider, k);
        let required = |k: &'static str, ini: &'static str| -> Result<String, ConfigError> {
            let v = p(ini)?;
            if v.is_empty() { Err(ConfigError::Required(k)) } else { Ok(v) }
        };
        let cluster_id = required("[provider] clusterID", "clusterID")?;
        if p("cluster-default-provider")? != PROVIDER_TYPE_VPC {
            return Err(ConfigError::Invalid {
                key: "[provider] cluster-default-provider",
                message: "only VPC infrastructure (\"g2\") is supported; upstream's classic load \
                          balancer is not public either"
                    .into(),
            });
        }
        let account_id = required("[provider] accountID", "accountID")?;
        let credentials_file =
            PathBuf::from(required("[provider] g2Credentials", "g2Credentials")?);
        let region = required("[provider] region", "region")?;
        let resource_group_name =
            required("[provider] g2ResourceGroupName", "g2ResourceGroupName")?;
        let subnet_names: Vec<String> =
            required("[provider] g2VpcSubnetNames", "g2VpcSubnetNames")?
                .split(',')
                .map(|s| s.trim().to_string())
                .filter(|s| !s.is_empty())
                .collect();
        if subnet_names.is_empty() {
            return Err(ConfigError::Required("[provider] g2VpcSubnetNames"));
        }
        let vpc_name = required("[provider] g2VpcName", "g2VpcName")?;
        for (key, value) in [("[provider] clusterID", &cluster_id), ("[provider] region", &region)]
        {
            if value.contains(['/', ' ', '?', '#']) {
                return Err(ConfigError::Invalid {
                    key,
                    message: "must not contain '/', '?', '#' or spaces".into(),
                });
            }
        }

        let allow_http = boolean(&provider, "[provider] allowHttpEndpoints", "allowHttpEndpoints")?;
        let public = env
            .get("ENABLE_VPC_PUBLIC_ENDPOINT")
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("true"));
        let stage = region.contains("stage");
        let vpc_url = match p("g2EndpointOverride")? {
            v if !v.is_empty() => parse_url("[provider] g2EndpointOverride", &v, allow_http)?,
            _ => {
                let base = if stage { "iaasdev.cloud.ibm.com" } else { "iaas.cloud.ibm.com" };
                if public {
                    format!("https://{region}.{base}")
                } else {
                    format!("https://{region}.private.{base}")
                }
            }
        } + "/v1";
        let iam_base = match p("iamEndpointOverride")? {
            v if !v.is_empty() => parse_url("[provider] iamEndpointOverride", &v, allow_http)?,
            _ => match (stage, public) {
                (true, false) => "https://private.iam.test.cloud.ibm.com".into(),
                (true, true) => "https://iam.stage1.bluemix.net".into(),
                (false, false) => "https://private.iam.cloud.ibm.com".into(),
                (false, true) => "https://iam.cloud.ibm.com".into(),
            },
        };
        let resource_manager_url = match p("rmEndpointOverride")? {
            v if !v.is_empty() => parse_url("[provider] rmEndpointOverride", &v, allow_http)?,
            _ if stage => "https://resource-controller.test.cloud.ibm.com".into(),
            _ => "https://resource-controller.cloud.ibm.com".into(),
        };
        let tagging_url = match p("taggingEndpointOverride")? {
            v if !v.is_empty() => parse_url("[provider] taggingEndpointOverride", &v, allow_http)?,
            _ => match (stage, public) {
                (true, _) => "https://tags.global-search-tagging.test.cloud.ibm.com".into(),
                (false, false) => "https://tags.private.global-search-tagging.cloud.ibm.com".into(),
                (false, true) => "https://tags.global-search-tagging.cloud.ibm.com".into(),
            },
        };
        Ok(Config {
            version,
            kube_config_files: kubernetes.list("config-file"),
            set_network_unavailable: boolean(
                &kubernetes,
                "[kubernetes] set-network-unavailable",
                "set-network-unavailable",
            )?,
            cni_provider: trimmed(&kubernetes, "cniProvider")?,
            account_id,
            cluster_id,
            region,
            worker_account_id: p("g2workerServiceAccountID")?,
            vpc_name,
            credentials_file,
            resource_group_name,
            subnet_names,
            vpc_url,
            iam_token_url: format!("{iam_base}/identity/token"),
            resource_manager_url,
            tagging_url,
            allow_http_endpoints: allow_http,
            warnings: parsed.warnings,
        })
    }

    /// What reading the file skipped, as upstream's gcfg (`FatalOnly`) skips it: unknown
    /// sections and keys, one line each naming the section and key, never a value. Each was
    /// logged as a warning when read; the manager may also show them as an Event.
    pub fn config_warnings(&self) -> &[String] {
        &self.warnings
    }

    /// Whether VPC lookups of nodes are allowed: upstream refuses them when the workers were
    /// allocated under another account (`g2workerServiceAccountID` set and different).
    pub fn vpc_node_lookup_error(&self) -> Option<String> {
        (!self.worker_account_id.is_empty() && self.worker_account_id != self.account_id).then(
            || {
                "cluster nodes are allocated under a different account \
                 ([provider] g2workerServiceAccountID differs from accountID): nodes without \
                 the ibm-cloud.kubernetes.io labels cannot be looked up in the VPC"
                    .to_string()
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "\
[global]
version = 1.1.0
[kubernetes]
config-file = /etc/kubernetes/kubeconfig
[provider]
cluster-default-provider = g2
accountID = acct1
clusterID = clus1
region = us-south
g2workerServiceAccountID = acct1
g2VpcName = vpc-a
g2Credentials = /etc/ibm/api-key
g2ResourceGroupName = default
g2VpcSubnetNames = subnet-1, subnet-2
";

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse(text, &BTreeMap::new())
    }

    #[test]
    fn every_documented_key_and_example_is_accepted() {
        for k in CONFIG_KEYS {
            // GOOD with the key set to its example (a later value wins, as in gcfg).
            let text = GOOD.replace(
                &format!("[{}]\n", k.section),
                &format!("[{}]\n{} = {}\n", k.section, k.key, k.example),
            );
            let text = if k.section == "provider" {
                format!("{text}{} = {}\n", k.key, k.example)
            } else {
                text
            };
            assert!(text.contains(k.example), "{}", k.key);
            if let Err(e) = parse(&text) {
                panic!("[{}] {} = {}: {e}", k.section, k.key, k.example);
            }
        }
    }

    #[test]
    fn a_vpc_config_parses_with_private_endpoints_by_default() {
        let c = parse(GOOD).unwrap();
        assert_eq!(c.account_id, "acct1");
        assert_eq!(c.cluster_id, "clus1");
        assert_eq!(c.subnet_names, vec!["subnet-1", "subnet-2"]);
        assert_eq!(c.credentials_file, PathBuf::from("/etc/ibm/api-key"));
        assert_eq!(c.vpc_url, "https://us-south.private.iaas.cloud.ibm.com/v1");
        assert_eq!(c.iam_token_url, "https://private.iam.cloud.ibm.com/identity/token");
        assert_eq!(c.resource_manager_url, "https://resource-controller.cloud.ibm.com");
        assert_eq!(c.tagging_url, "https://tags.private.global-search-tagging.cloud.ibm.com");
        assert_eq!(c.kube_config_files, vec!["/etc/kubernetes/kubeconfig"]);
        assert!(c.vpc_node_lookup_error().is_none());

        let env = BTreeMap::from([("ENABLE_VPC_PUBLIC_ENDPOINT".into(), "TRUE".into())]);
        let c = Config::parse(GOOD, &env).unwrap();
        assert_eq!(c.vpc_url, "https://us-south.iaas.cloud.ibm.com/v1");
        assert_eq!(c.iam_token_url, "https://iam.cloud.ibm.com/identity/token");
        assert_eq!(c.tagging_url, "https://tags.global-search-tagging.cloud.ibm.com");
    }

    #[test]
    fn endpoint_overrides_win_and_keys_are_case_insensitive() {
        let text = GOOD.to_string()
            + "G2ENDPOINTOVERRIDE = http://127.0.0.1:9000/\n\
               iamEndpointOverride = http://127.0.0.1:9000\n\
               rmendpointoverride = \"http://127.0.0.1:9001\"\n\
               taggingEndpointOverride = https://tags.example.test/\n";
        let c = parse(&text).unwrap();
        assert_eq!(c.vpc_url, "http://127.0.0.1:9000/v1");
        assert_eq!(c.iam_token_url, "http://127.0.0.1:9000/identity/token");
        assert_eq!(c.resource_manager_url, "http://127.0.0.1:9001");
        assert_eq!(c.tagging_url, "https://tags.example.test");
    }

    #[test]
    fn plain_http_to_another_host_needs_the_explicit_opt_in() {
        for key in [
            "g2EndpointOverride",
            "iamEndpointOverride",
            "rmEndpointOverride",
            "taggingEndpointOverride",
        ] {
            let text = format!("{GOOD}{key} = http://vpc-proxy.internal:8080\n");
            let err = parse(&text).unwrap_err();
            let msg = err.to_string();
            assert!(msg.contains(key) && msg.contains("allowHttpEndpoints"), "{msg}");
            let allowed = format!("{text}allowHttpEndpoints = true\n");
            assert!(parse(&allowed).unwrap().allow_http_endpoints, "{key}");
            // Loopback (the traffic never leaves the machine) needs no opt-in.
            for host in ["127.0.0.1:9000", "[::1]:9000", "localhost:9000"] {
                let text = format!("{GOOD}{key} = http://{host}\n");
                assert!(parse(&text).is_ok(), "{key} {host}");
            }
        }
        let err = parse(&format!("{GOOD}g2EndpointOverride = ftp://x\n")).unwrap_err();
        assert!(err.to_string().contains("https"), "{err}");
        let err = parse(&format!("{GOOD}allowHttpEndpoints = maybe\n")).unwrap_err();
        assert!(err.to_string().contains("allowHttpEndpoints"), "{err}");
    }

    #[test]
    fn each_missing_key_is_named() {
        for (ini, named) in [
            ("clusterID", "[provider] clusterID"),
            ("accountID", "[provider] accountID"),
            ("g2Credentials", "[provider] g2Credentials"),
            ("region", "[provider] region"),
            ("g2ResourceGroupName", "[provider] g2ResourceGroupName"),
            ("g2VpcSubnetNames", "[provider] g2VpcSubnetNames"),
            ("g2VpcName", "[provider] g2VpcName"),
        ] {
            let text: String = GOOD
                .lines()
                .filter(|l| !l.starts_with(&format!("{ini} =")))
                .map(|l| format!("{l}\n"))
                .collect();
            let err = parse(&text).unwrap_err();
            assert_eq!(err, ConfigError::Required(named), "{ini}");
            assert!(err.to_string().contains(named), "{err}");
        }
    }

    #[test]
    fn bad_values_are_named_and_classic_is_refused() {
        let err = parse(&GOOD.replace("version = 1.1.0", "version = 2")).unwrap_err();
        assert!(err.to_string().contains("[global] version"), "{err}");
        let err = parse(&GOOD.replace("= g2", "= g1")).unwrap_err();
        assert!(err.to_string().contains("cluster-default-provider"), "{err}");
        let err = parse(&GOOD.replace("cluster-default-provider = g2\n", "")).unwrap_err();
        assert!(err.to_string().contains("cluster-default-provider"), "{err}");
        let err = parse(&(GOOD.to_string() + "g2EndpointOverride = not a url\n")).unwrap_err();
        assert!(err.to_string().contains("g2EndpointOverride"), "{err}");
        let err = parse("[provider\nx=1").unwrap_err();
        assert!(matches!(err, ConfigError::Syntax(_)), "{err}");
        let err = parse(&GOOD.replace("clusterID = clus1", "clusterID = a/b")).unwrap_err();
        assert!(err.to_string().contains("[provider] clusterID"), "{err}");
    }

    #[test]
    fn a_different_worker_account_disables_vpc_node_lookups() {
        let c = parse(
            &GOOD.replace("g2workerServiceAccountID = acct1", "g2workerServiceAccountID = other"),
        )
        .unwrap();
        assert!(c.vpc_node_lookup_error().unwrap().contains("g2workerServiceAccountID"));
    }

    #[test]
    fn unknown_sections_and_keys_are_skipped_with_a_warning_naming_them_as_upstream() {
        let text = GOOD.to_string()
            + "futureKey = Zq7secret\n[load-balancer-deployment]\nimage = Zq7x\n[other]\na = Zq7y\n\
               [global]\nversiom = Zq7z\n";
        let c = parse(&text).unwrap();
        let w = c.config_warnings();
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("unknown key [provider] futureKey (line 15)"), "{w:?}");
        assert!(w[1].contains("unknown section [other] (line 18)"), "{w:?}");
        assert!(w[2].contains("unknown key [global] versiom (line 21)"), "{w:?}");
        assert!(!w.join(" ").contains("Zq7"), "a value is shown: {w:?}");
        assert!(parse(GOOD).unwrap().config_warnings().is_empty());
    }

    #[test]
    fn malformed_syntax_is_fatal_naming_the_line_never_the_text() {
        for (text, line) in [
            (format!("{GOOD}[provider\n"), 15),
            (format!("{GOOD}g2Credentials: /Zq7secret\n"), 15),
            (format!("{GOOD}region = \"Zq7secret\n"), 15),
            ("accountID = Zq7secret\n[provider]\n".to_string(), 1),
        ] {
            let err = parse(&text).unwrap_err();
            assert!(matches!(err, ConfigError::Syntax(_)), "{text}: {err:?}");
            let shown = format!("{err} {err:?}");
            assert!(shown.contains(&format!("line {line}")) && !shown.contains("Zq7"), "{shown}");
        }
    }
}
