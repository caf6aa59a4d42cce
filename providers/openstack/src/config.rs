//! The cloud config: upstream's gcfg INI `cloud.conf` (`[Global]`, `[LoadBalancer]`,
//! `[LoadBalancerClass "name"]`, `[Networking]`, `[Route]`, `[Metadata]`) and, with
//! `use-clouds = true`, the `clouds.yaml` entry it points at.
//!
//! Owns parsing and validation: every error names the key (`[Section] key`, or the clouds.yaml
//! file and key) and never quotes a value that could be a secret (`password`,
//! `trustee-password`, `application-credential-secret`, `token`, nor anything of a
//! clouds.yaml).
//!
//! CONTRACT (types used by client, instances, load_balancer, routes): field names below are
//! fixed; the parser fills them.
//!
//! **Syntax** is gcfg's, read by the providers' shared reader [`ccm_core::gcfg`] (not
//! `rust-ini`, which reads a bare `key` line together with the next line as one key, accepts
//! `key: value` and single quotes, and lower-cases subsection names): sections and keys match case-insensitively, subsection
//! names (`[LoadBalancerClass "Gold"]`) are case-sensitive, values may be double-quoted in
//! whole or in part (escapes `\"` `\\` `\n` `\t`), an unquoted `;` or `#` starts a comment, a
//! `\` at the end of a line continues the value, a bare `key` (no `=`) is boolean true, and
//! for the multi-valued `public-network-name` / `internal-network-name` each line adds a
//! name while a bare key clears the list. A repeated single-valued key: the last wins.
//!
//! **Validation** where upstream reads the config (`ReadConfig`, `checkOpenStackOpts`,
//! `client.ReadClouds`) and, deliberately, at parse time what upstream only finds out when a
//! value is used (`lb-method`, monitor settings, `os-endpoint-type`, `address-sort-order`,
//! `lb-version`, credentials): see [`CONFIG_KEYS`] and the crate README for each difference.
//! Unknown sections and keys are skipped with a warning naming them, as upstream's
//! `gcfg.FatalOnly` skips them ([`Config::config_warnings`]: the manager shows them as an
//! Event at start); `[BlockStorage]`, which the Cinder CSI driver reads from the same file, is
//! skipped without one. A `[LoadBalancerClass]` without a name (upstream stores it under the
//! empty name, which no Service can select) is skipped with a warning too.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use ccm_core::gcfg::{self, Schema, Section, SectionSpec, Values};
use ccm_core::reference::KeyDoc;

/// Why the cloud config cannot be used. Each message names the key (`[Section] key`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// No cloud config was given (upstream requires one).
    #[error("cloud config required but none specified (--cloud-config)")]
    Missing,
    /// The file is not valid INI (or the clouds.yaml is not valid YAML).
    #[error("cloud config is not valid: {0}")]
    Syntax(String),
    /// A required key is missing or empty.
    #[error("missing required cloud configuration setting: {0}")]
    Required(&'static str),
    /// A key has a value that cannot be used.
    #[error("invalid cloud configuration setting {key}: {message}")]
    Invalid {
        /// The key, e.g. `[LoadBalancer] lb-method`.
        key: String,
        /// Why (never quoting a credential).
        message: String,
    },
}

/// A secret string: never printed by `Debug`.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.is_empty() { f.write_str("\"\"") } else { f.write_str("<redacted>") }
    }
}

impl Secret {
    /// The secret's value (pass it to the auth layer only).
    pub fn expose(&self) -> &str {
        &self.0
    }
    /// Whether it is empty.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

/// The whole parsed config.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Config {
    /// `[Global]` (after merging the clouds.yaml entry when `use-clouds = true`).
    pub global: Global,
    /// `[LoadBalancer]`.
    pub load_balancer: LoadBalancerOpts,
    /// `[LoadBalancerClass "name"]` sections, by name; each holds only the keys it sets
    /// (`None` = inherit from `[LoadBalancer]`).
    pub lb_classes: BTreeMap<String, LoadBalancerClass>,
    /// `[Networking]`.
    pub networking: Networking,
    /// `[Route]`.
    pub route: RouteOpts,
    /// `[Metadata]`.
    pub metadata: MetadataOpts,
    /// `OS_CCM_REGIONAL=true` in the environment: providerIDs `openstack://<region>/<id>`.
    pub regional_provider_id: bool,
    /// What reading the file skipped, as upstream does: one line per unknown section or key,
    /// naming it, never a value.
    pub warnings: Vec<String>,
}

/// `[Global]`: Keystone credentials and TLS.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Global {
    /// `auth-url` (Keystone, e.g. `https://keystone:5000/v3`).
    pub auth_url: String,
    /// `username`.
    pub username: String,
    /// `user-id`.
    pub user_id: String,
    /// `password`.
    pub password: Secret,
    /// `tenant-id` / `project-id`.
    pub project_id: String,
    /// `tenant-name` / `project-name`.
    pub project_name: String,
    /// `domain-id`.
    pub domain_id: String,
    /// `domain-name`.
    pub domain_name: String,
    /// `tenant-domain-id` / `project-domain-id`.
    pub project_domain_id: String,
    /// `tenant-domain-name` / `project-domain-name`.
    pub project_domain_name: String,
    /// `user-domain-id`.
    pub user_domain_id: String,
    /// `user-domain-name`.
    pub user_domain_name: String,
    /// `region`.
    pub region: String,
    /// `trust-id`.
    pub trust_id: String,
    /// `trustee-id`.
    pub trustee_id: String,
    /// `trustee-password`.
    pub trustee_password: Secret,
    /// `application-credential-id`.
    pub application_credential_id: String,
    /// `application-credential-name`.
    pub application_credential_name: String,
    /// `application-credential-secret`.
    pub application_credential_secret: Secret,
    /// `token` (a pre-issued token).
    pub token: Secret,
    /// `ca-file`: extra CA bundle (PEM) to trust.
    pub ca_file: Option<PathBuf>,
    /// `cert-file` (client certificate, PEM).
    pub cert_file: Option<PathBuf>,
    /// `key-file` (client key, PEM).
    pub key_file: Option<PathBuf>,
    /// `tls-insecure`.
    pub tls_insecure: bool,
    /// `allow-insecure-http` (ours, default false): plain `http://` Keystone and catalog
    /// endpoints on a host other than loopback. Off: refused.
    pub allow_insecure_http: bool,
    /// `os-endpoint-type` (`public` default, `internal`, `admin`).
    pub endpoint_type: String,
    /// `use-clouds`.
    pub use_clouds: bool,
    /// `clouds-file`.
    pub clouds_file: Option<PathBuf>,
    /// `cloud`.
    pub cloud: String,
}

/// `[LoadBalancer]` with upstream's defaults filled in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadBalancerOpts {
    /// `enabled` (default true).
    pub enabled: bool,
    /// `lb-provider` (default `amphora`).
    pub lb_provider: String,
    /// `lb-method` (default `ROUND_ROBIN`).
    pub lb_method: String,
    /// `subnet-id`.
    pub subnet_id: String,
    /// `member-subnet-id`.
    pub member_subnet_id: String,
    /// `network-id`.
    pub network_id: String,
    /// `floating-network-id`.
    pub floating_network_id: String,
    /// `floating-subnet-id`.
    pub floating_subnet_id: String,
    /// `floating-subnet`.
    pub floating_subnet: String,
    /// `floating-subnet-tags`.
    pub floating_subnet_tags: String,
    /// `create-monitor` (default false).
    pub create_monitor: bool,
    /// `monitor-delay` in seconds (default 5).
    pub monitor_delay: u32,
    /// `monitor-timeout` in seconds (default 3).
    pub monitor_timeout: u32,
    /// `monitor-max-retries` (default 1).
    pub monitor_max_retries: u32,
    /// `monitor-max-retries-down` (default 3).
    pub monitor_max_retries_down: u32,
    /// `manage-security-groups` (default false).
    pub manage_security_groups: bool,
    /// `internal-lb` (default false).
    pub internal_lb: bool,
    /// `node-selector` (`k=v,k2=v2`; empty selects all).
    pub node_selector: BTreeMap<String, String>,
    /// `cascade-delete` (default true).
    pub cascade_delete: bool,
    /// `flavor-id`.
    pub flavor_id: String,
    /// `availability-zone`.
    pub availability_zone: String,
    /// `enable-ingress-hostname` (default false).
    pub enable_ingress_hostname: bool,
    /// `ingress-hostname-suffix` (default `nip.io`).
    pub ingress_hostname_suffix: String,
    /// `max-shared-lb` (default 2).
    pub max_shared_lb: u32,
    /// `container-store` (default `barbican`).
    pub container_store: String,
    /// `default-tls-container-ref`.
    pub default_tls_container_ref: String,
    /// `provider-requires-serial-api-calls` (default false).
    pub provider_requires_serial_api_calls: bool,
    /// `allow-cross-namespace-sharing` (ours, default false): a Service may share, by
    /// `load-balancer-id`, a load balancer created for a Service of another namespace, by
    /// another cluster or by hand. Off: only within the namespace of the Service it was
    /// created for.
    pub allow_cross_namespace_sharing: bool,
}

impl Default for LoadBalancerOpts {
    fn default() -> Self {
        LoadBalancerOpts {
            enabled: true,
            lb_provider: "amphora".into(),
            lb_method: "ROUND_ROBIN".into(),
            subnet_id: String::new(),
            member_subnet_id: String::new(),
            network_id: String::new(),
            floating_network_id: String::new(),
            floating_subnet_id: String::new(),
            floating_subnet: String::new(),
            floating_subnet_tags: String::new(),
            create_monitor: false,
            monitor_delay: 5,
            monitor_timeout: 3,
            monitor_max_retries: 1,
            monitor_max_retries_down: 3,
            manage_security_groups: false,
            internal_lb: false,
            node_selector: BTreeMap::new(),
            cascade_delete: true,
            flavor_id: String::new(),
            availability_zone: String::new(),
            enable_ingress_hostname: false,
            ingress_hostname_suffix: "nip.io".into(),
            max_shared_lb: 2,
            container_store: "barbican".into(),
            default_tls_container_ref: String::new(),
            provider_requires_serial_api_calls: false,
            allow_cross_namespace_sharing: false,
        }
    }
}

/// `[LoadBalancerClass "name"]`: the subset of `[LoadBalancer]` keys a class may set.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct LoadBalancerClass {
    /// `floating-network-id`.
    pub floating_network_id: Option<String>,
    /// `floating-subnet-id`.
    pub floating_subnet_id: Option<String>,
    /// `floating-subnet`.
    pub floating_subnet: Option<String>,
    /// `floating-subnet-tags`.
    pub floating_subnet_tags: Option<String>,
    /// `network-id`.
    pub network_id: Option<String>,
    /// `subnet-id`.
    pub subnet_id: Option<String>,
    /// `member-subnet-id`.
    pub member_subnet_id: Option<String>,
}

/// `[Networking]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Networking {
    /// `ipv6-support-disabled`.
    pub ipv6_support_disabled: bool,
    /// `public-network-name` (may repeat).
    pub public_network_names: Vec<String>,
    /// `internal-network-name` (may repeat).
    pub internal_network_names: Vec<String>,
    /// `address-sort-order`: CIDRs, comma-separated in the file.
    pub address_sort_order: Vec<ipnet::IpNet>,
}

/// `[Route]`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RouteOpts {
    /// `router-id`: routes are enabled only when set (and the extraroute extension exists).
    pub router_id: String,
}

/// `[Metadata]` (the CCM reads nothing from the metadata service; accepted for compatibility).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct MetadataOpts {
    /// `search-order` (default `configDrive,metadataService`).
    pub search_order: String,
    /// `request-timeout` (Go duration text, kept as given).
    pub request_timeout: String,
}

/// Octavia pool algorithms `lb-method` accepts.
pub const LB_METHODS: [&str; 4] =
    ["ROUND_ROBIN", "LEAST_CONNECTIONS", "SOURCE_IP", "SOURCE_IP_PORT"];

/// `lb-provider` values upstream has tested (others are accepted with a warning, as upstream).
pub const SUPPORTED_LB_PROVIDERS: [&str; 5] = ["amphora", "octavia", "ovn", "f5", "amphorav2"];

/// `container-store` values upstream knows (others are accepted with a warning, as upstream).
pub const SUPPORTED_CONTAINER_STORES: [&str; 2] = ["barbican", "external"];

/// `os-endpoint-type` values (gophercloud's availabilities).
pub const ENDPOINT_TYPES: [&str; 3] = ["public", "internal", "admin"];

/// `[Metadata] search-order` when not set.
pub const DEFAULT_SEARCH_ORDER: &str = "configDrive,metadataService";

/// Every key the parser reads, with its documentation. The parser looks each key of the file
/// up here (an unknown key is an error), reads only keys listed here (checked in debug builds,
/// so by every test), and the tests feed every example back in. `ccm-docgen` can render it as
/// the configuration reference.
pub const CONFIG_KEYS: &[KeyDoc] = &[
    KeyDoc {
        section: "Global",
        key: "auth-url",
        value: "URL, required (or `auth.auth_url` of the clouds.yaml entry)",
        example: "https://keystone.example.com:5000/v3",
        doc: "Keystone v3 endpoint.",
    },
    KeyDoc {
        section: "Global",
        key: "username",
        value: "string",
        example: "ccm",
        doc: "Keystone user name (password authentication).",
    },
    KeyDoc {
        section: "Global",
        key: "user-id",
        value: "string",
        example: "4f1a5c",
        doc: "Keystone user ID (password or application-credential-by-name authentication).",
    },
    KeyDoc {
        section: "Global",
        key: "password",
        value: "secret",
        example: "s3cret",
        doc: "The user's password. Never logged nor shown in errors.",
    },
    KeyDoc {
        section: "Global",
        key: "tenant-id",
        value: "string",
        example: "0c7a9d",
        doc: "Project ID to scope the token to.",
    },
    KeyDoc {
        section: "Global",
        key: "project-id",
        value: "string",
        example: "0c7a9d",
        doc: "Alias of `tenant-id` (upstream's gcfg silently ignores it; accepted here).",
    },
    KeyDoc {
        section: "Global",
        key: "tenant-name",
        value: "string",
        example: "kube",
        doc: "Project name to scope the token to (with `tenant-domain-name`/`-id`).",
    },
    KeyDoc {
        section: "Global",
        key: "project-name",
        value: "string",
        example: "kube",
        doc: "Alias of `tenant-name`.",
    },
    KeyDoc {
        section: "Global",
        key: "domain-id",
        value: "string",
        example: "default",
        doc: "Domain ID (user and project domain when those are not set).",
    },
    KeyDoc {
        section: "Global",
        key: "domain-name",
        value: "string",
        example: "Default",
        doc: "Domain name (user and project domain when those are not set).",
    },
    KeyDoc {
        section: "Global",
        key: "tenant-domain-id",
        value: "string",
        example: "default",
        doc: "The project's domain ID.",
    },
    KeyDoc {
        section: "Global",
        key: "project-domain-id",
        value: "string",
        example: "default",
        doc: "Alias of `tenant-domain-id`.",
    },
    KeyDoc {
        section: "Global",
        key: "tenant-domain-name",
        value: "string",
        example: "Default",
        doc: "The project's domain name.",
    },
    KeyDoc {
        section: "Global",
        key: "project-domain-name",
        value: "string",
        example: "Default",
        doc: "Alias of `tenant-domain-name`.",
    },
    KeyDoc {
        section: "Global",
        key: "user-domain-id",
        value: "string",
        example: "default",
        doc: "The user's domain ID.",
    },
    KeyDoc {
        section: "Global",
        key: "user-domain-name",
        value: "string",
        example: "Default",
        doc: "The user's domain name.",
    },
    KeyDoc {
        section: "Global",
        key: "region",
        value: "string",
        example: "RegionOne",
        doc: "Keystone catalog region of every endpoint; the region of Nodes and of regional providerIDs.",
    },
    KeyDoc {
        section: "Global",
        key: "trust-id",
        value: "string",
        example: "7e2b1f",
        doc: "Keystone trust to scope the token to (Magnum's layout): the trustee (`trustee-id`, else `user-id`, else `username`) authenticates with `trustee-password` (else `password`) and gets the trustor's project and delegated roles; a project set here is not used.",
    },
    KeyDoc {
        section: "Global",
        key: "trustee-id",
        value: "string",
        example: "9a8b7c",
        doc: "The trustee's user ID (instead of `user-id` with `trust-id`).",
    },
    KeyDoc {
        section: "Global",
        key: "trustee-password",
        value: "secret",
        example: "s3cret",
        doc: "The trustee's password. Never logged nor shown in errors.",
    },
    KeyDoc {
        section: "Global",
        key: "application-credential-id",
        value: "string",
        example: "ac1d",
        doc: "Application credential ID (with `application-credential-secret`).",
    },
    KeyDoc {
        section: "Global",
        key: "application-credential-name",
        value: "string",
        example: "ccm",
        doc: "Application credential name (with `application-credential-secret` and the user).",
    },
    KeyDoc {
        section: "Global",
        key: "application-credential-secret",
        value: "secret",
        example: "s3cret",
        doc: "Application credential secret. Never logged nor shown in errors.",
    },
    KeyDoc {
        section: "Global",
        key: "token",
        value: "secret",
        example: "gAAAAAB",
        doc: "A pre-issued Keystone token. Never logged nor shown in errors.",
    },
    KeyDoc {
        section: "Global",
        key: "ca-file",
        value: "path",
        example: "/etc/kubernetes/openstack-ca.pem",
        doc: "The CA bundle (PEM) to trust, as upstream instead of the system's roots (read when the provider starts; unreadable or without a certificate: an error naming the key).",
    },
    KeyDoc {
        section: "Global",
        key: "cert-file",
        value: "path (with `key-file`)",
        example: "/etc/kubernetes/client.pem",
        doc: "TLS client certificate (PEM), presented to Keystone and every service.",
    },
    KeyDoc {
        section: "Global",
        key: "key-file",
        value: "path (with `cert-file`)",
        example: "/etc/kubernetes/client-key.pem",
        doc: "TLS client key (PEM; PKCS#8, PKCS#1 or SEC1). Never logged nor shown in errors.",
    },
    KeyDoc {
        section: "Global",
        key: "tls-insecure",
        value: "`true` or `false`, default false",
        example: "false",
        doc: "Skip TLS verification (a warning is logged at start). As upstream only the text `true` turns it on; `yes`, `on`, `1` (which upstream silently reads as false) are refused.",
    },
    KeyDoc {
        section: "Global",
        key: "allow-insecure-http",
        value: "bool, default false (ours; not in upstream)",
        example: "false",
        doc: "Allow plain `http://` for `auth-url` and the catalog's endpoints on a host other than loopback (credentials and tokens then cross the network in clear text). Off: such a URL is refused with an error naming it (upstream's gophercloud accepts it silently). Loopback `http://` is always accepted, with a warning.",
    },
    KeyDoc {
        section: "Global",
        key: "os-endpoint-type",
        value: "`public` (default), `internal` or `admin`",
        example: "internal",
        doc: "Which catalog endpoints to use.",
    },
    KeyDoc {
        section: "Global",
        key: "use-clouds",
        value: "bool, default false",
        example: "false",
        doc: "Also read a clouds.yaml entry: it fills the `[Global]` settings left empty here (as upstream: this file wins).",
    },
    KeyDoc {
        section: "Global",
        key: "clouds-file",
        value: "path",
        example: "/etc/openstack/clouds.yaml",
        doc: "The clouds.yaml; default `OS_CLIENT_CONFIG_FILE`, then `clouds.yaml` in the working directory, `~/.config/openstack/`, `/etc/openstack/` (then `clouds.yml` likewise).",
    },
    KeyDoc {
        section: "Global",
        key: "cloud",
        value: "string",
        example: "openstack",
        doc: "The clouds.yaml entry; `OS_CLOUD` in the environment overrides it (as upstream's clientconfig); neither: the file's only entry.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "enabled",
        value: "bool, default true",
        example: "true",
        doc: "`false` turns the load-balancer controller's cloud side off.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "lb-provider",
        value: "string, default `amphora`",
        example: "amphora",
        doc: "Octavia provider (`amphora`, `octavia`, `ovn`, `f5`, `amphorav2`; others are accepted with a warning).",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "lb-method",
        value: "`ROUND_ROBIN` (default), `LEAST_CONNECTIONS`, `SOURCE_IP`, `SOURCE_IP_PORT`",
        example: "ROUND_ROBIN",
        doc: "Pool algorithm (`ovn` needs `SOURCE_IP_PORT`). Checked here, case-insensitively; upstream passes any text to Octavia.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "lb-version",
        value: "`v2` or empty",
        example: "v2",
        doc: "Accepted for compatibility: only `v2` exists.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "use-octavia",
        value: "bool",
        example: "true",
        doc: "Accepted and ignored (removed upstream in v1.26; Octavia is always used). Logged.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "subnet-id",
        value: "string",
        example: "4a2b6f0e-5c1d-4d6e-9f3a-2b7c8d9e0f1a",
        doc: "Subnet of the VIP (and of members without `member-subnet-id`); default: detected from the nodes.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "member-subnet-id",
        value: "string",
        example: "5b3c7a1f-6d2e-4e7f-8a4b-3c8d9e0f1a2b",
        doc: "Subnet of the members.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "network-id",
        value: "string",
        example: "6c4d8b2a-7e3f-4f8a-9b5c-4d9e0f1a2b3c",
        doc: "Network of the VIP when `subnet-id` is not set.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "floating-network-id",
        value: "string",
        example: "7d5e9c3b-8f4a-4a9b-8c6d-5e0f1a2b3c4d",
        doc: "External network of the floating IP; default: the only external network.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "floating-subnet-id",
        value: "string",
        example: "8e6f0d4c-9a5b-4b0c-9d7e-6f1a2b3c4d5e",
        doc: "Subnet of the floating IP.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "floating-subnet",
        value: "name pattern (glob, or regexp after `~`)",
        example: "public-*",
        doc: "Subnet of the floating IP, by name.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "floating-subnet-tags",
        value: "comma-separated tags",
        example: "fip,public",
        doc: "Subnet of the floating IP, by tags.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "create-monitor",
        value: "bool, default false",
        example: "true",
        doc: "Create a health monitor per pool.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "monitor-delay",
        value: "Go duration or whole seconds, ≥ 1s, default `5s`",
        example: "5s",
        doc: "Seconds between probes (whole seconds, truncated as upstream; a bare number means seconds, which upstream refuses).",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "monitor-timeout",
        value: "Go duration or whole seconds, ≥ 1s, default `3s`",
        example: "3s",
        doc: "Probe timeout.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "monitor-max-retries",
        value: "integer 1–10, default 1",
        example: "1",
        doc: "Successful probes before a member is ONLINE.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "monitor-max-retries-down",
        value: "integer 1–10, default 3",
        example: "3",
        doc: "Failed probes before a member is in ERROR.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "manage-security-groups",
        value: "bool, default false",
        example: "false",
        doc: "Create a security group per Service opening the node ports.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "internal-lb",
        value: "bool, default false",
        example: "false",
        doc: "No floating IP by default.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "node-selector",
        value: "`k=v,k2=v2,k3` (a key alone: the label exists)",
        example: "env=production, region",
        doc: "Only Nodes with these labels become members; empty selects all.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "cascade-delete",
        value: "bool, default true",
        example: "true",
        doc: "Delete load balancers with Octavia's cascade delete.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "flavor-id",
        value: "string",
        example: "a1b2c3",
        doc: "Octavia flavor.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "availability-zone",
        value: "string",
        example: "az-1",
        doc: "Octavia availability zone.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "enable-ingress-hostname",
        value: "bool, default false",
        example: "false",
        doc: "With the PROXY protocol, report `<ip>.<ingress-hostname-suffix>` as the ingress hostname.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "ingress-hostname-suffix",
        value: "string, default `nip.io`",
        example: "nip.io",
        doc: "Suffix of that hostname.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "max-shared-lb",
        value: "integer ≥ 0, default 2",
        example: "2",
        doc: "Services that may share one load balancer (0 and 1: no sharing, as upstream).",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "allow-cross-namespace-sharing",
        value: "bool, default false (ours; not in upstream)",
        example: "false",
        doc: "Let a Service share (`loadbalancer.openstack.org/load-balancer-id`) a load balancer created for a Service of another namespace, by another cluster or by hand. Off: sharing only within the namespace of the Service the load balancer was created for; any other is refused with an error naming the annotation (upstream allows any). A sharer never deletes the load balancer nor its floating IP.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "container-store",
        value: "`barbican` (default) or `external`",
        example: "barbican",
        doc: "Where TLS container refs live (`external`: not checked). Others are accepted with a warning, as upstream.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "default-tls-container-ref",
        value: "Barbican container or secret URL",
        example: "https://barbican.example.com/v1/containers/1b2c",
        doc: "TERMINATED_HTTPS listeners with this certificate.",
    },
    KeyDoc {
        section: "LoadBalancer",
        key: "provider-requires-serial-api-calls",
        value: "bool, default false",
        example: "false",
        doc: "Create load balancers step by step instead of one fully populated call.",
    },
    KeyDoc {
        section: "LoadBalancerClass \"<name>\"",
        key: "floating-network-id",
        value: "string",
        example: "7d5e9c3b-8f4a-4a9b-8c6d-5e0f1a2b3c4d",
        doc: "As `[LoadBalancer]`, for Services with `loadbalancer.openstack.org/class: <name>` (names are case-sensitive).",
    },
    KeyDoc {
        section: "LoadBalancerClass \"<name>\"",
        key: "floating-subnet-id",
        value: "string",
        example: "8e6f0d4c-9a5b-4b0c-9d7e-6f1a2b3c4d5e",
        doc: "As `[LoadBalancer]`.",
    },
    KeyDoc {
        section: "LoadBalancerClass \"<name>\"",
        key: "floating-subnet",
        value: "name pattern",
        example: "public-*",
        doc: "As `[LoadBalancer]`.",
    },
    KeyDoc {
        section: "LoadBalancerClass \"<name>\"",
        key: "floating-subnet-tags",
        value: "comma-separated tags",
        example: "fip",
        doc: "As `[LoadBalancer]`.",
    },
    KeyDoc {
        section: "LoadBalancerClass \"<name>\"",
        key: "network-id",
        value: "string",
        example: "6c4d8b2a-7e3f-4f8a-9b5c-4d9e0f1a2b3c",
        doc: "As `[LoadBalancer]`.",
    },
    KeyDoc {
        section: "LoadBalancerClass \"<name>\"",
        key: "subnet-id",
        value: "string",
        example: "4a2b6f0e-5c1d-4d6e-9f3a-2b7c8d9e0f1a",
        doc: "As `[LoadBalancer]`.",
    },
    KeyDoc {
        section: "LoadBalancerClass \"<name>\"",
        key: "member-subnet-id",
        value: "string",
        example: "5b3c7a1f-6d2e-4e7f-8a4b-3c8d9e0f1a2b",
        doc: "As `[LoadBalancer]`.",
    },
    KeyDoc {
        section: "Networking",
        key: "ipv6-support-disabled",
        value: "bool, default false",
        example: "false",
        doc: "Report no IPv6 Node addresses.",
    },
    KeyDoc {
        section: "Networking",
        key: "public-network-name",
        value: "string, may repeat",
        example: "public",
        doc: "Networks whose addresses are ExternalIPs.",
    },
    KeyDoc {
        section: "Networking",
        key: "internal-network-name",
        value: "string, may repeat",
        example: "private",
        doc: "Networks whose addresses are InternalIPs (when set, only these).",
    },
    KeyDoc {
        section: "Networking",
        key: "address-sort-order",
        value: "CIDRs separated by commas or spaces",
        example: "10.0.0.0/8, fd00::/8",
        doc: "Node addresses in these CIDRs first, in this order. A bad CIDR is an error (upstream skips it with a warning).",
    },
    KeyDoc {
        section: "Route",
        key: "router-id",
        value: "string",
        example: "2f3e4d5c",
        doc: "Neutron router for pod routes; routes are off when unset.",
    },
    KeyDoc {
        section: "Metadata",
        key: "search-order",
        value: "`configDrive`/`metadataService`, comma-separated, at most 2",
        example: "configDrive,metadataService",
        doc: "Accepted and checked as upstream; the manager reads no instance metadata.",
    },
    KeyDoc {
        section: "Metadata",
        key: "request-timeout",
        value: "Go duration",
        example: "30s",
        doc: "Accepted and checked as upstream (a Go duration); unused.",
    },
];

/// The deprecated spellings upstream's client also knows (`mapstructure` tags).
fn canonical_key(key: &'static str) -> &'static str {
    match key {
        "project-id" => "tenant-id",
        "project-name" => "tenant-name",
        "project-domain-id" => "tenant-domain-id",
        "project-domain-name" => "tenant-domain-name",
        k => k,
    }
}

// ---- sections and raw values ---------------------------------------------------------------

/// A section of the file.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Sect {
    Global,
    LoadBalancer,
    Class(String),
    Networking,
    Route,
    Metadata,
}

impl Sect {
    /// The section as [`CONFIG_KEYS`] names it (compared up to the first space).
    fn doc_name(&self) -> &'static str {
        match self {
            Sect::Global => "Global",
            Sect::LoadBalancer => "LoadBalancer",
            Sect::Class(_) => "LoadBalancerClass",
            Sect::Networking => "Networking",
            Sect::Route => "Route",
            Sect::Metadata => "Metadata",
        }
    }

    /// `[LoadBalancer]`, `[LoadBalancerClass "gold"]`.
    fn label(&self) -> String {
        match self {
            Sect::Class(name) => format!("[LoadBalancerClass {name:?}]"),
            other => format!("[{}]", other.doc_name()),
        }
    }
}

impl From<gcfg::SyntaxError> for ConfigError {
    fn from(e: gcfg::SyntaxError) -> Self {
        ConfigError::Syntax(e.to_string())
    }
}

impl From<gcfg::ValueError> for ConfigError {
    fn from(e: gcfg::ValueError) -> Self {
        ConfigError::Invalid { key: e.key, message: e.message }
    }
}

/// The file's values, by section (every section header seen has an entry, even empty).
#[derive(Debug, Default)]
struct Raw {
    sections: BTreeMap<Sect, Values>,
}

/// `cloud.conf`'s sections (upstream's `Config`: `Global`, `LoadBalancer`,
/// `LoadBalancerClass` by name, `Networking`, `Route`, `Metadata`), and the Cinder CSI
/// driver's `[BlockStorage]` of a shared file.
static SCHEMA: Schema = Schema {
    table: CONFIG_KEYS,
    sections: &[
        SectionSpec::plain("Global"),
        SectionSpec::plain("LoadBalancer"),
        SectionSpec::named("LoadBalancerClass"),
        SectionSpec::plain("Networking"),
        SectionSpec::plain("Route"),
        SectionSpec::plain("Metadata"),
        SectionSpec::ignored("BlockStorage"),
    ],
    canonical: canonical_key,
};

/// Reads the file with the shared gcfg reader; unknown sections and keys become warnings.
fn read_gcfg(text: &str) -> Result<(Raw, Vec<String>), ConfigError> {
    let parsed = gcfg::read(text, &SCHEMA)?;
    let mut warnings = parsed.warnings;
    let mut raw = Raw::default();
    for block in parsed.value.blocks() {
        let sect = match (block.name, &block.sub) {
            ("Global", _) => Sect::Global,
            ("LoadBalancer", _) => Sect::LoadBalancer,
            ("LoadBalancerClass", Some(class)) => Sect::Class(class.clone()),
            ("LoadBalancerClass", None) => {
                let message = format!(
                    "[LoadBalancerClass] (line {}) has no name, so no Service can select it: \
                     skipped with its keys (write [LoadBalancerClass \"name\"])",
                    block.line
                );
                tracing::warn!(section = "LoadBalancerClass", "cloud config: {message}");
                warnings.push(message);
                continue;
            }
            ("Networking", _) => Sect::Networking,
            ("Route", _) => Sect::Route,
            _ => Sect::Metadata,
        };
        raw.sections.insert(sect, block.values.clone());
    }
    Ok((raw, warnings))
}

fn invalid(key: String, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid { key, message: message.into() }
}

/// OpenStack's typed reads on top of gcfg's.
trait SectionExt {
    fn secret(&self, key: &'static str) -> Result<Secret, ConfigError>;
    fn path(&self, key: &'static str) -> Result<Option<PathBuf>, ConfigError>;
    fn uint(&self, key: &'static str, default: u32, min: u32, max: u32)
    -> Result<u32, ConfigError>;
    fn seconds(&self, key: &'static str, default: u32) -> Result<u32, ConfigError>;
}

impl SectionExt for Section<'_> {
    fn secret(&self, key: &'static str) -> Result<Secret, ConfigError> {
        Ok(Secret(self.string(key)?))
    }

    fn path(&self, key: &'static str) -> Result<Option<PathBuf>, ConfigError> {
        Ok(self.non_empty(key)?.map(PathBuf::from))
    }

    /// A gcfg integer in `min..=max`.
    fn uint(
        &self,
        key: &'static str,
        default: u32,
        min: u32,
        max: u32,
    ) -> Result<u32, ConfigError> {
        let max = if max == u32::MAX { i64::MAX } else { i64::from(max) };
        let n = self.integer(key, i64::from(default), i64::from(min)..=max)?;
        u32::try_from(n).map_err(|_| invalid(self.key(key), "too large"))
    }

    /// A Go duration (`5s`, `1m`) or a number of seconds, in whole seconds (truncated, as
    /// upstream's `int(d.Seconds())`), at least 1.
    fn seconds(&self, key: &'static str, default: u32) -> Result<u32, ConfigError> {
        let Some(v) = self.opt_string(key)? else { return Ok(default) };
        let t = v.trim();
        let secs = if !t.is_empty() && t.chars().all(|c| c.is_ascii_digit()) {
            t.parse::<u64>().ok()
        } else {
            ccm_core::manager::duration::parse(t).ok().map(|d| d.as_secs())
        };
        let Some(secs) = secs else {
            return Err(invalid(
                self.key(key),
                "not a duration (e.g. 5s, 1m) nor a number of seconds",
            ));
        };
        if secs == 0 {
            return Err(invalid(self.key(key), "less than 1s (Octavia takes whole seconds)"));
        }
        u32::try_from(secs).map_err(|_| invalid(self.key(key), "too long"))
    }
}

impl Raw {
    fn section(&self, sect: Sect) -> Section<'_> {
        static EMPTY: Values = BTreeMap::new();
        let values = self.sections.get(&sect).unwrap_or(&EMPTY);
        Section::new(sect.label(), CONFIG_KEYS, sect.doc_name(), values)
    }
}

// ---- value checks --------------------------------------------------------------------------

/// `tls-insecure`: upstream keeps the text and compares it with `true`. `false` (or empty)
/// is false; the other gcfg booleans, which upstream silently reads as false, are refused.
fn tls_insecure(s: &Section<'_>) -> Result<bool, ConfigError> {
    match s.last("tls-insecure") {
        None => Ok(false),
        Some(Some("true")) => Ok(true),
        Some(Some("false" | "")) => Ok(false),
        Some(Some(v)) => Err(invalid(
            s.key("tls-insecure"),
            format!(
                "{v:?}: write true or false (upstream only turns verification off for the exact text `true`)"
            ),
        )),
        Some(None) => Err(invalid(
            s.key("tls-insecure"),
            "needs a value: `tls-insecure = true` (upstream refuses the bare key)",
        )),
    }
}

/// gophercloud's availability; case-insensitive here, lower-cased.
fn endpoint_type(key: String, value: &str) -> Result<String, ConfigError> {
    let lower = value.trim().to_ascii_lowercase();
    if ENDPOINT_TYPES.contains(&lower.as_str()) {
        Ok(lower)
    } else {
        Err(invalid(key, format!("not one of {}", ENDPOINT_TYPES.join(", "))))
    }
}

/// `k=v,k2=v2,k3` as upstream's `StringToMap` (`k3` alone: any value), keys and values
/// trimmed; an empty key is refused (upstream keeps it, and then no Node matches).
fn node_selector(key: String, value: &str) -> Result<BTreeMap<String, String>, ConfigError> {
    let mut out = BTreeMap::new();
    for item in value.trim().split(',') {
        let item = item.trim();
        if item.is_empty() {
            continue;
        }
        let (k, v) = item.split_once('=').unwrap_or((item, ""));
        let k = k.trim();
        if k.is_empty() {
            return Err(invalid(key, format!("{item:?} has no label key (expected k=v or k)")));
        }
        out.insert(k.to_string(), v.trim().to_string());
    }
    Ok(out)
}

/// CIDRs separated by commas and/or blanks (upstream's `SplitTrim`), host bits cleared.
fn cidrs(key: String, value: &str) -> Result<Vec<ipnet::IpNet>, ConfigError> {
    value
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .enumerate()
        .map(|(n, item)| {
            item.parse::<ipnet::IpNet>().map(|n| n.trunc()).map_err(|_| {
                invalid(key.clone(), format!("entry {} is not a CIDR (e.g. 10.0.0.0/8)", n + 1))
            })
        })
        .collect()
}

/// Upstream's `CheckMetadataSearchOrder`.
fn search_order(key: String, value: &str) -> Result<String, ConfigError> {
    let elements: Vec<&str> = value.split(',').collect();
    if value.is_empty() {
        return Err(invalid(key, "cannot be empty"));
    }
    if elements.len() > 2 {
        return Err(invalid(key, "cannot contain more than 2 elements"));
    }
    for (n, e) in elements.into_iter().enumerate() {
        let e = e.trim();
        if e != "configDrive" && e != "metadataService" {
            return Err(invalid(
                key,
                format!(
                    "element {} is invalid: use \"configDrive\" and/or \"metadataService\"",
                    n + 1
                ),
            ));
        }
    }
    Ok(value.to_string())
}

fn has(s: &str) -> bool {
    !s.trim().is_empty()
}

/// The credentials upstream's client can authenticate with: names what is missing.
fn check_credentials(g: &Global) -> Result<(), ConfigError> {
    let user = has(&g.username) || has(&g.user_id);
    let app_cred = has(&g.application_credential_id) || has(&g.application_credential_name);
    if app_cred && g.application_credential_secret.is_empty() {
        return Err(ConfigError::Required(
            "[Global] application-credential-secret (with application-credential-id or -name)",
        ));
    }
    if !app_cred && !g.application_credential_secret.is_empty() {
        return Err(ConfigError::Required(
            "[Global] application-credential-id or application-credential-name (with \
             application-credential-secret)",
        ));
    }
    if has(&g.application_credential_name) && !has(&g.application_credential_id) && !user {
        return Err(ConfigError::Required(
            "[Global] user-id or username (with application-credential-name)",
        ));
    }
    match (g.cert_file.is_some(), g.key_file.is_some()) {
        (true, false) => return Err(ConfigError::Required("[Global] key-file (with cert-file)")),
        (false, true) => return Err(ConfigError::Required("[Global] cert-file (with key-file)")),
        _ => {}
    }
    if has(&g.trust_id) {
        // As upstream: the trustee, else the user, authenticates with the trust.
        if !has(&g.trustee_id) && !has(&g.user_id) && !has(&g.username) {
            return Err(ConfigError::Required("[Global] trustee-id (with trust-id)"));
        }
        if g.trustee_password.is_empty() && g.password.is_empty() {
            return Err(ConfigError::Required("[Global] trustee-password (with trust-id)"));
        }
        return Ok(());
    }
    if app_cred || !g.token.is_empty() || g.cert_file.is_some() {
        return Ok(());
    }
    if user && g.password.is_empty() {
        return Err(ConfigError::Required("[Global] password (with username or user-id)"));
    }
    if user {
        return Ok(());
    }
    Err(ConfigError::Required(
        "[Global] credentials: username or user-id with password, application-credential-id \
         (or -name) with application-credential-secret, trust-id with trustee-id and \
         trustee-password, token, or cert-file with key-file",
    ))
}

// ---- clouds.yaml ---------------------------------------------------------------------------

/// A clouds.yaml (or secure.yaml). Every scalar is read as text, as Go's yaml does into
/// string fields (`password: 0123` stays `0123`).
#[derive(Default, serde::Deserialize)]
struct CloudsFile {
    #[serde(default)]
    clouds: Option<BTreeMap<String, CloudEntry>>,
}

/// One cloud. No `Debug`: it holds secrets.
#[derive(Default, serde::Deserialize)]
struct CloudEntry {
    #[serde(default)]
    auth: Option<CloudAuth>,
    #[serde(default)]
    region_name: Option<String>,
    #[serde(default)]
    endpoint_type: Option<String>,
    #[serde(default)]
    interface: Option<String>,
    #[serde(default)]
    cacert: Option<String>,
    #[serde(default)]
    cert: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    verify: Option<String>,
    #[serde(default)]
    profile: Option<String>,
    #[serde(default)]
    cloud: Option<String>,
}

#[derive(Default, serde::Deserialize)]
struct CloudAuth {
    #[serde(default)]
    auth_url: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    user_id: Option<String>,
    #[serde(default)]
    password: Option<String>,
    #[serde(default)]
    project_id: Option<String>,
    #[serde(default)]
    project_name: Option<String>,
    #[serde(default)]
    domain_id: Option<String>,
    #[serde(default)]
    domain_name: Option<String>,
    #[serde(default)]
    project_domain_id: Option<String>,
    #[serde(default)]
    project_domain_name: Option<String>,
    #[serde(default)]
    user_domain_id: Option<String>,
    #[serde(default)]
    user_domain_name: Option<String>,
    #[serde(default)]
    application_credential_id: Option<String>,
    #[serde(default)]
    application_credential_name: Option<String>,
    #[serde(default)]
    application_credential_secret: Option<String>,
    #[serde(default)]
    token: Option<String>,
}

/// The keys of a clouds.yaml entry this parser knows (YAML error paths show only these).
const CLOUDS_YAML_KEYS: &[&str] = &[
    "clouds",
    "auth",
    "auth_url",
    "username",
    "user_id",
    "password",
    "project_id",
    "project_name",
    "domain_id",
    "domain_name",
    "project_domain_id",
    "project_domain_name",
    "user_domain_id",
    "user_domain_name",
    "application_credential_id",
    "application_credential_name",
    "application_credential_secret",
    "token",
    "region_name",
    "endpoint_type",
    "interface",
    "cacert",
    "cert",
    "key",
    "verify",
    "profile",
    "cloud",
    "auth_type",
];

impl CloudEntry {
    /// The non-empty values, by YAML key (`auth.` prefixed for the auth block).
    fn flatten(self) -> BTreeMap<&'static str, String> {
        let a = self.auth.unwrap_or_default();
        [
            ("auth.auth_url", a.auth_url),
            ("auth.username", a.username),
            ("auth.user_id", a.user_id),
            ("auth.password", a.password),
            ("auth.project_id", a.project_id),
            ("auth.project_name", a.project_name),
            ("auth.domain_id", a.domain_id),
            ("auth.domain_name", a.domain_name),
            ("auth.project_domain_id", a.project_domain_id),
            ("auth.project_domain_name", a.project_domain_name),
            ("auth.user_domain_id", a.user_domain_id),
            ("auth.user_domain_name", a.user_domain_name),
            ("auth.application_credential_id", a.application_credential_id),
            ("auth.application_credential_name", a.application_credential_name),
            ("auth.application_credential_secret", a.application_credential_secret),
            ("auth.token", a.token),
            ("region_name", self.region_name),
            ("endpoint_type", self.endpoint_type),
            ("interface", self.interface),
            ("cacert", self.cacert),
            ("cert", self.cert),
            ("key", self.key),
            ("verify", self.verify),
            ("profile", self.profile),
            ("cloud", self.cloud),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.filter(|v| !v.is_empty()).map(|v| (k, v)))
        .collect()
    }
}

/// Replaces the contents of every `"..."` and `` `...` `` of a parser message.
fn redact_quoted(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut open: Option<char> = None;
    for c in message.chars() {
        match open {
            Some(q) if c == q => {
                out.push_str("<redacted>");
                out.push(c);
                open = None;
            }
            Some(_) => {}
            None => {
                out.push(c);
                if c == '"' || c == '`' {
                    open = Some(c);
                }
            }
        }
    }
    if open.is_some() {
        out.push_str("<redacted>");
    }
    out
}

/// The key path (`clouds.prod.auth`) of a 1-based line, from its less-indented ancestors. The
/// line's own key is shown only when it is a known clouds.yaml key (the line may be inside a
/// multi-line secret); values are never read.
fn yaml_key_path(text: &str, line: usize) -> Option<String> {
    let block_key = |l: &str| -> Option<String> {
        let l = l.strip_prefix("- ").unwrap_or(l);
        let (key, rest) = l.split_once(':')?;
        let key = key.trim().trim_matches(['"', '\'']);
        let plain = !key.is_empty()
            && key.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'));
        (plain && (rest.is_empty() || rest.starts_with([' ', '\t']))).then(|| key.to_string())
    };
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
        let own = i + 1 == lines.len();
        match block_key(trimmed) {
            Some(k) if !own || CLOUDS_YAML_KEYS.contains(&k.as_str()) => path.push(k),
            _ if own => {}
            _ => break,
        }
        limit = indent;
        if indent == 0 {
            break;
        }
    }
    path.reverse();
    (!path.is_empty()).then(|| path.join("."))
}

/// A YAML error naming the file, the position and (best effort) the key, quoting nothing.
fn yaml_error(path: &Path, text: &str, e: &serde_saphyr::Error) -> ConfigError {
    let e = e.without_snippet();
    let rendered = e.to_string();
    let at = e.location().filter(|l| l.line() > 0).map(|l| (l.line(), l.column()));
    let message = match at {
        Some((line, column)) => {
            let message = rendered
                .strip_suffix(&format!(" at line {line}, column {column}"))
                .unwrap_or(&rendered);
            let key = usize::try_from(line)
                .ok()
                .and_then(|l| yaml_key_path(text, l))
                .map(|k| format!(" ({k})"))
                .unwrap_or_default();
            format!("line {line}, column {column}{key}: {}", redact_quoted(message))
        }
        None => redact_quoted(&rendered),
    };
    ConfigError::Syntax(format!("{}: {message}", path.display()))
}

fn read_clouds_yaml(path: &Path, text: &str) -> Result<BTreeMap<String, CloudEntry>, ConfigError> {
    let options = serde_saphyr::options! { with_snippet: false };
    if text.trim().is_empty() {
        return Ok(BTreeMap::new());
    }
    let file: CloudsFile = serde_saphyr::from_str_with_options(text, options)
        .map_err(|e| yaml_error(path, text, &e))?;
    Ok(file.clouds.unwrap_or_default())
}

type ReadFile<'a> = &'a dyn Fn(&Path) -> std::io::Result<String>;

/// The first of `candidates` that exists (a missing file is skipped; another read error is
/// an error naming the file and `key`).
fn first_existing(
    candidates: &[PathBuf],
    read_file: ReadFile<'_>,
    key: &str,
) -> Result<Option<(PathBuf, String)>, ConfigError> {
    for path in candidates {
        match read_file(path) {
            Ok(text) => return Ok(Some((path.clone(), text))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => {
                return Err(invalid(
                    key.to_string(),
                    format!("cannot read {}: {e}", path.display()),
                ));
            }
        }
    }
    Ok(None)
}

/// gophercloud's search path for `name`: the working directory, `~/.config/openstack`,
/// `/etc/openstack`.
fn search_path(name: &str, env: &BTreeMap<String, String>) -> Vec<PathBuf> {
    let mut out = vec![PathBuf::from(name)];
    if let Some(home) = env.get("HOME").filter(|h| !h.is_empty()) {
        out.push(Path::new(home).join(".config/openstack").join(name));
    }
    out.push(Path::new("/etc/openstack").join(name));
    out
}

/// `use-clouds = true`: the clouds.yaml entry (overlaid by the same entry of a secure.yaml,
/// as gophercloud) fills the `[Global]` settings that are empty (upstream's `ReadClouds`).
fn merge_clouds(
    g: &mut Global,
    env: &BTreeMap<String, String>,
    read_file: ReadFile<'_>,
) -> Result<(), ConfigError> {
    let env_get = |k: &str| env.get(k).map(String::as_str).filter(|v| !v.is_empty());
    let (path, text) = match &g.clouds_file {
        // Upstream points OS_CLIENT_CONFIG_FILE at it and, when the file is missing, silently
        // falls back to the search path: here a missing file is an error.
        Some(file) => match read_file(file) {
            Ok(text) => (file.clone(), text),
            Err(e) => {
                return Err(invalid(
                    "[Global] clouds-file".into(),
                    format!("cannot read {}: {e}", file.display()),
                ));
            }
        },
        None => {
            let mut candidates: Vec<PathBuf> =
                env_get("OS_CLIENT_CONFIG_FILE").map(PathBuf::from).into_iter().collect();
            candidates.extend(search_path("clouds.yaml", env));
            candidates.extend(search_path("clouds.yml", env));
            first_existing(&candidates, read_file, "[Global] clouds-file")?.ok_or(
                ConfigError::Required(
                    "[Global] clouds-file (use-clouds = true and no clouds.yaml in \
                     OS_CLIENT_CONFIG_FILE, ./, ~/.config/openstack/ or /etc/openstack/)",
                ),
            )?
        }
    };
    let mut clouds = read_clouds_yaml(&path, &text)?;
    // As upstream's clientconfig (`GetCloudFromYAML`): `OS_CLOUD` overrides `[Global] cloud`.
    let name = if let Some(name) = env_get("OS_CLOUD") {
        if has(&g.cloud) && g.cloud.trim() != name {
            tracing::info!(
                cloud = %g.cloud.trim(),
                os_cloud = name,
                "OpenStack: OS_CLOUD overrides [Global] cloud, as upstream"
            );
        }
        name.to_string()
    } else if has(&g.cloud) {
        g.cloud.trim().to_string()
    } else if clouds.len() == 1 {
        clouds.keys().next().cloned().unwrap_or_default()
    } else if clouds.is_empty() {
        return Err(invalid(
            "[Global] use-clouds".into(),
            format!("{} has no clouds (expected `clouds: {{<name>: ...}}`)", path.display()),
        ));
    } else {
        let names: Vec<&str> = clouds.keys().map(String::as_str).collect();
        return Err(invalid(
            "[Global] cloud".into(),
            format!(
                "{} has {} clouds ({}): name one with [Global] cloud or OS_CLOUD",
                path.display(),
                names.len(),
                names.join(", ")
            ),
        ));
    };
    let mut entry = clouds.remove(&name).map(CloudEntry::flatten);
    let mut secure_candidates = search_path("secure.yaml", env);
    secure_candidates.extend(search_path("secure.yml", env));
    if let Some((secure_path, secure_text)) =
        first_existing(&secure_candidates, read_file, "[Global] use-clouds")?
    {
        let mut secure = read_clouds_yaml(&secure_path, &secure_text)?;
        if let Some(over) = secure.remove(&name) {
            entry.get_or_insert_with(BTreeMap::new).extend(over.flatten());
        }
    }
    let Some(mut e) = entry else {
        return Err(invalid(
            "[Global] cloud".into(),
            format!("no cloud {name:?} in {}", path.display()),
        ));
    };
    let yaml_key = |k: &str| format!("{}: clouds.{name}.{k}", path.display());
    for k in ["profile", "cloud"] {
        if e.contains_key(k) {
            return Err(invalid(
                yaml_key(k),
                "public-cloud profiles (clouds-public.yaml) are not supported: put auth_url and \
                 region_name in the entry",
            ));
        }
    }
    if e.get("verify").is_some_and(|v| gcfg::parse_bool(v) == Some(false)) {
        tracing::warn!(
            file = %path.display(),
            cloud = %name,
            "clouds.yaml `verify: false` is ignored, as upstream: TLS is verified (see [Global] tls-insecure)"
        );
    }
    if e.contains_key("interface") && !e.contains_key("endpoint_type") {
        tracing::warn!(
            file = %path.display(),
            cloud = %name,
            "clouds.yaml `interface` is ignored, as upstream (which reads `endpoint_type`): set [Global] os-endpoint-type"
        );
    }
    let mut take = |k: &str| e.remove(k).unwrap_or_default();
    let fill = |dst: &mut String, v: String| {
        if dst.is_empty() {
            *dst = v;
        }
    };
    fill(&mut g.auth_url, take("auth.auth_url"));
    fill(&mut g.user_id, take("auth.user_id"));
    fill(&mut g.username, take("auth.username"));
    fill(&mut g.password.0, take("auth.password"));
    fill(&mut g.project_id, take("auth.project_id"));
    fill(&mut g.project_name, take("auth.project_name"));
    fill(&mut g.domain_id, take("auth.domain_id"));
    fill(&mut g.domain_name, take("auth.domain_name"));
    fill(&mut g.project_domain_id, take("auth.project_domain_id"));
    fill(&mut g.project_domain_name, take("auth.project_domain_name"));
    fill(&mut g.user_domain_id, take("auth.user_domain_id"));
    fill(&mut g.user_domain_name, take("auth.user_domain_name"));
    fill(&mut g.region, take("region_name"));
    let endpoint = take("endpoint_type");
    if g.endpoint_type.is_empty() && !endpoint.is_empty() {
        g.endpoint_type = endpoint_type(yaml_key("endpoint_type"), &endpoint)?;
    }
    for (dst, k) in
        [(&mut g.ca_file, "cacert"), (&mut g.cert_file, "cert"), (&mut g.key_file, "key")]
    {
        let v = take(k);
        if dst.is_none() && !v.is_empty() {
            *dst = Some(PathBuf::from(v));
        }
    }
    fill(&mut g.application_credential_id, take("auth.application_credential_id"));
    fill(&mut g.application_credential_name, take("auth.application_credential_name"));
    fill(&mut g.application_credential_secret.0, take("auth.application_credential_secret"));
    fill(&mut g.token.0, take("auth.token"));
    Ok(())
}

impl Config {
    /// Parses and validates `cloud.conf` text. `env` is the process environment
    /// (`OS_CCM_REGIONAL`; with `use-clouds`, `OS_CLIENT_CONFIG_FILE`, `OS_CLOUD`, `HOME`). A
    /// clouds.yaml is read from the file system.
    pub fn parse(text: &str, env: &BTreeMap<String, String>) -> Result<Config, ConfigError> {
        Self::parse_with(text, env, &|path: &Path| std::fs::read_to_string(path))
    }

    /// [`Config::parse`] with the clouds.yaml (and secure.yaml) read by `read_file` (tests
    /// and fuzzing pass a closure; a missing file is `ErrorKind::NotFound`).
    pub fn parse_with(
        text: &str,
        env: &BTreeMap<String, String>,
        read_file: &dyn Fn(&Path) -> std::io::Result<String>,
    ) -> Result<Config, ConfigError> {
        let (raw, warnings) = read_gcfg(text)?;
        let global = parse_global(&raw.section(Sect::Global), env, read_file)?;
        let load_balancer = parse_load_balancer(&raw.section(Sect::LoadBalancer))?;

        let mut lb_classes = BTreeMap::new();
        for sect in raw.sections.keys() {
            let Sect::Class(name) = sect else { continue };
            let s = raw.section(sect.clone());
            lb_classes.insert(
                name.clone(),
                LoadBalancerClass {
                    floating_network_id: s.non_empty("floating-network-id")?,
                    floating_subnet_id: s.non_empty("floating-subnet-id")?,
                    floating_subnet: s.non_empty("floating-subnet")?,
                    floating_subnet_tags: s.non_empty("floating-subnet-tags")?,
                    network_id: s.non_empty("network-id")?,
                    subnet_id: s.non_empty("subnet-id")?,
                    member_subnet_id: s.non_empty("member-subnet-id")?,
                },
            );
        }

        let n = raw.section(Sect::Networking);
        let networking = Networking {
            ipv6_support_disabled: n.boolean("ipv6-support-disabled", false)?,
            public_network_names: n.list("public-network-name"),
            internal_network_names: n.list("internal-network-name"),
            address_sort_order: cidrs(
                n.key("address-sort-order"),
                &n.string("address-sort-order")?,
            )?,
        };

        let route = RouteOpts { router_id: raw.section(Sect::Route).string("router-id")? };

        let m = raw.section(Sect::Metadata);
        let search = match m.opt_string("search-order")? {
            None => DEFAULT_SEARCH_ORDER.to_string(),
            Some(v) => search_order(m.key("search-order"), &v)?,
        };
        let request_timeout = m.string("request-timeout")?;
        if !request_timeout.is_empty() {
            ccm_core::manager::duration::parse(&request_timeout)
                .map_err(|_| invalid(m.key("request-timeout"), "not a Go duration (e.g. 30s)"))?;
        }
        let metadata = MetadataOpts { search_order: search, request_timeout };

        // Upstream compares the text with "true" exactly.
        let regional = env.get("OS_CCM_REGIONAL").map(String::as_str);
        if let Some(v) = regional.filter(|v| *v != "true" && v.trim().eq_ignore_ascii_case("true"))
        {
            tracing::warn!(
                value = v,
                "OS_CCM_REGIONAL is not exactly \"true\": providerIDs stay non-regional, as upstream"
            );
        }

        Ok(Config {
            global,
            load_balancer,
            lb_classes,
            networking,
            route,
            metadata,
            regional_provider_id: regional == Some("true"),
            warnings,
        })
    }

    /// What reading the file skipped, as upstream's gcfg (`FatalOnly`) skips it: unknown
    /// sections and keys, one line each naming the section and key, never a value. Each was
    /// logged as a warning when read; the manager may also show them as an Event.
    pub fn config_warnings(&self) -> &[String] {
        &self.warnings
    }
}

fn parse_global(
    s: &Section<'_>,
    env: &BTreeMap<String, String>,
    read_file: ReadFile<'_>,
) -> Result<Global, ConfigError> {
    let mut g = Global {
        auth_url: s.string("auth-url")?,
        username: s.string("username")?,
        user_id: s.string("user-id")?,
        password: s.secret("password")?,
        project_id: s.string("tenant-id")?,
        project_name: s.string("tenant-name")?,
        domain_id: s.string("domain-id")?,
        domain_name: s.string("domain-name")?,
        project_domain_id: s.string("tenant-domain-id")?,
        project_domain_name: s.string("tenant-domain-name")?,
        user_domain_id: s.string("user-domain-id")?,
        user_domain_name: s.string("user-domain-name")?,
        region: s.string("region")?,
        trust_id: s.string("trust-id")?,
        trustee_id: s.string("trustee-id")?,
        trustee_password: s.secret("trustee-password")?,
        application_credential_id: s.string("application-credential-id")?,
        application_credential_name: s.string("application-credential-name")?,
        application_credential_secret: s.secret("application-credential-secret")?,
        token: s.secret("token")?,
        ca_file: s.path("ca-file")?,
        cert_file: s.path("cert-file")?,
        key_file: s.path("key-file")?,
        tls_insecure: tls_insecure(s)?,
        allow_insecure_http: s.boolean("allow-insecure-http", false)?,
        endpoint_type: match s.non_empty("os-endpoint-type")? {
            Some(v) => endpoint_type(s.key("os-endpoint-type"), &v)?,
            None => String::new(),
        },
        use_clouds: s.boolean("use-clouds", false)?,
        clouds_file: s.path("clouds-file")?,
        cloud: s.string("cloud")?,
    };
    if g.use_clouds {
        merge_clouds(&mut g, env, read_file)?;
    }
    if g.endpoint_type.is_empty() {
        g.endpoint_type = "public".into();
    }
    if !has(&g.auth_url) {
        return Err(ConfigError::Required(if g.use_clouds {
            "[Global] auth-url (or auth.auth_url of the clouds.yaml entry)"
        } else {
            "[Global] auth-url"
        }));
    }
    // The URL is not quoted back: it may carry user information.
    match url::Url::parse(g.auth_url.trim()) {
        Ok(u) if u.scheme() == "http" || u.scheme() == "https" => {}
        Ok(_) => return Err(invalid(s.key("auth-url"), "must be an http(s) URL")),
        Err(e) => return Err(invalid(s.key("auth-url"), format!("not a URL ({e})"))),
    }
    check_credentials(&g)?;
    Ok(g)
}

fn parse_load_balancer(s: &Section<'_>) -> Result<LoadBalancerOpts, ConfigError> {
    let d = LoadBalancerOpts::default();
    let lb_method = s.string_or("lb-method", &d.lb_method)?;
    let upper = lb_method.trim().to_ascii_uppercase();
    if !LB_METHODS.contains(&upper.as_str()) {
        return Err(invalid(s.key("lb-method"), format!("not one of {}", LB_METHODS.join(", "))));
    }
    // Upstream refuses any other version when the load-balancer controller starts.
    if let Some(v) = s.non_empty("lb-version")?
        && v.trim() != "v2"
    {
        return Err(invalid(s.key("lb-version"), "only v2 is supported"));
    }
    if s.last("use-octavia").is_some() {
        s.boolean("use-octavia", true)?;
        tracing::warn!(
            "cloud config: [LoadBalancer] use-octavia is ignored (Octavia is always used)"
        );
    }
    let lb = LoadBalancerOpts {
        enabled: s.boolean("enabled", d.enabled)?,
        lb_provider: s.string_or("lb-provider", &d.lb_provider)?,
        lb_method: upper,
        subnet_id: s.string("subnet-id")?,
        member_subnet_id: s.string("member-subnet-id")?,
        network_id: s.string("network-id")?,
        floating_network_id: s.string("floating-network-id")?,
        floating_subnet_id: s.string("floating-subnet-id")?,
        floating_subnet: s.string("floating-subnet")?,
        floating_subnet_tags: s.string("floating-subnet-tags")?,
        create_monitor: s.boolean("create-monitor", d.create_monitor)?,
        monitor_delay: s.seconds("monitor-delay", d.monitor_delay)?,
        monitor_timeout: s.seconds("monitor-timeout", d.monitor_timeout)?,
        monitor_max_retries: s.uint("monitor-max-retries", d.monitor_max_retries, 1, 10)?,
        monitor_max_retries_down: s.uint(
            "monitor-max-retries-down",
            d.monitor_max_retries_down,
            1,
            10,
        )?,
        manage_security_groups: s.boolean("manage-security-groups", d.manage_security_groups)?,
        internal_lb: s.boolean("internal-lb", d.internal_lb)?,
        node_selector: node_selector(s.key("node-selector"), &s.string("node-selector")?)?,
        cascade_delete: s.boolean("cascade-delete", d.cascade_delete)?,
        flavor_id: s.string("flavor-id")?,
        availability_zone: s.string("availability-zone")?,
        enable_ingress_hostname: s.boolean("enable-ingress-hostname", d.enable_ingress_hostname)?,
        ingress_hostname_suffix: s
            .string_or("ingress-hostname-suffix", &d.ingress_hostname_suffix)?,
        max_shared_lb: s.uint("max-shared-lb", d.max_shared_lb, 0, u32::MAX)?,
        container_store: s.string_or("container-store", &d.container_store)?,
        default_tls_container_ref: s.string("default-tls-container-ref")?,
        provider_requires_serial_api_calls: s
            .boolean("provider-requires-serial-api-calls", d.provider_requires_serial_api_calls)?,
        allow_cross_namespace_sharing: s
            .boolean("allow-cross-namespace-sharing", d.allow_cross_namespace_sharing)?,
    };
    if !SUPPORTED_LB_PROVIDERS.contains(&lb.lb_provider.as_str()) {
        tracing::warn!(lb_provider = %lb.lb_provider, "cloud config: unsupported [LoadBalancer] lb-provider");
    }
    if !SUPPORTED_CONTAINER_STORES.contains(&lb.container_store.as_str()) {
        tracing::warn!(container_store = %lb.container_store, "cloud config: unsupported [LoadBalancer] container-store");
    }
    Ok(lb)
}

#[cfg(test)]
mod upstream_examples;

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use ccm_core::reference::has_key;

    /// The smallest config that parses: password authentication.
    const MINIMAL: &str = "\
[Global]
auth-url = https://keystone.example.com:5000/v3
username = ccm
password = s3cret
";

    /// An upstream-style cloud.conf with every `[LoadBalancer]` key.
    const FULL: &str = r#"
; managed by the installer
[Global]
auth-url = https://keystone.example.com:5000/v3
username = ccm
password = "p@ss;word #1"   # quoted: ';' and '#' are part of it
user-domain-name = Default
tenant-name = kube
tenant-domain-name = Default
region = RegionOne
ca-file = /etc/kubernetes/openstack-ca.pem
os-endpoint-type = internal

[LoadBalancer]
enabled = true
lb-provider = ovn
lb-method = source_ip_port
lb-version = v2
subnet-id = sub-vip
member-subnet-id = sub-members
network-id = net-vip
floating-network-id = net-ext
floating-subnet-id = sub-ext
floating-subnet = ~public-.*
floating-subnet-tags = fip,public
create-monitor = yes
monitor-delay = 1m
monitor-timeout = 30s
monitor-max-retries = 2
monitor-max-retries-down = 0x4
manage-security-groups = on
internal-lb = false
node-selector = "env=production, region"
cascade-delete = off
flavor-id = flavor-1
availability-zone = az-1
enable-ingress-hostname = TRUE
ingress-hostname-suffix = example.org
max-shared-lb = 5
container-store = external
default-tls-container-ref = https://barbican.example.com/v1/containers/1b2c
provider-requires-serial-api-calls = 1

[LoadBalancerClass "Gold"]
floating-network-id = net-gold
floating-subnet-id = sub-gold

[LoadBalancerClass "internal"]
network-id = net-int
subnet-id = sub-int
member-subnet-id = sub-int-members
floating-subnet =

[Networking]
ipv6-support-disabled = true
public-network-name = public
internal-network-name = private-a
internal-network-name = private-b
address-sort-order = 192.168.0.0/16, 10.1.2.3/8 2001:db8::/32

[Route]
router-id = router-1

[Metadata]
search-order = configDrive, metadataService
request-timeout = 5s
"#;

    fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse_with(text, &BTreeMap::new(), &no_files)
    }

    fn no_files(path: &Path) -> std::io::Result<String> {
        Err(std::io::Error::new(std::io::ErrorKind::NotFound, path.display().to_string()))
    }

    fn env(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    /// A `read_file` serving `files` (path → text), `NotFound` for anything else.
    fn files(files: &[(&str, &str)]) -> impl Fn(&Path) -> std::io::Result<String> + use<> {
        let files: BTreeMap<PathBuf, String> =
            files.iter().map(|(p, t)| (PathBuf::from(p), t.to_string())).collect();
        move |path: &Path| files.get(path).cloned().ok_or_else(|| no_files(path).unwrap_err())
    }

    fn err_of(text: &str) -> ConfigError {
        match parse(text) {
            Ok(c) => panic!("expected an error for:\n{text}\ngot {c:?}"),
            Err(e) => e,
        }
    }

    fn invalid_key(e: &ConfigError) -> &str {
        match e {
            ConfigError::Invalid { key, .. } => key,
            other => panic!("expected Invalid, got {other:?}"),
        }
    }

    #[test]
    fn a_full_upstream_config_parses_to_the_expected_struct() {
        let c = parse(FULL).unwrap();
        let expected = Config {
            global: Global {
                auth_url: "https://keystone.example.com:5000/v3".into(),
                username: "ccm".into(),
                password: Secret("p@ss;word #1".into()),
                project_name: "kube".into(),
                project_domain_name: "Default".into(),
                user_domain_name: "Default".into(),
                region: "RegionOne".into(),
                ca_file: Some("/etc/kubernetes/openstack-ca.pem".into()),
                endpoint_type: "internal".into(),
                ..Global::default()
            },
            load_balancer: LoadBalancerOpts {
                enabled: true,
                lb_provider: "ovn".into(),
                lb_method: "SOURCE_IP_PORT".into(),
                subnet_id: "sub-vip".into(),
                member_subnet_id: "sub-members".into(),
                network_id: "net-vip".into(),
                floating_network_id: "net-ext".into(),
                floating_subnet_id: "sub-ext".into(),
                floating_subnet: "~public-.*".into(),
                floating_subnet_tags: "fip,public".into(),
                create_monitor: true,
                monitor_delay: 60,
                monitor_timeout: 30,
                monitor_max_retries: 2,
                monitor_max_retries_down: 4,
                manage_security_groups: true,
                internal_lb: false,
                node_selector: BTreeMap::from([
                    ("env".into(), "production".into()),
                    ("region".into(), String::new()),
                ]),
                cascade_delete: false,
                flavor_id: "flavor-1".into(),
                availability_zone: "az-1".into(),
                enable_ingress_hostname: true,
                ingress_hostname_suffix: "example.org".into(),
                max_shared_lb: 5,
                container_store: "external".into(),
                default_tls_container_ref: "https://barbican.example.com/v1/containers/1b2c".into(),
                provider_requires_serial_api_calls: true,
                allow_cross_namespace_sharing: false,
            },
            lb_classes: BTreeMap::from([
                (
                    "Gold".into(),
                    LoadBalancerClass {
                        floating_network_id: Some("net-gold".into()),
                        floating_subnet_id: Some("sub-gold".into()),
                        ..Default::default()
                    },
                ),
                (
                    "internal".into(),
                    LoadBalancerClass {
                        network_id: Some("net-int".into()),
                        subnet_id: Some("sub-int".into()),
                        member_subnet_id: Some("sub-int-members".into()),
                        // Set but empty: inherits, as upstream's `!= ""` checks.
                        floating_subnet: None,
                        ..Default::default()
                    },
                ),
            ]),
            networking: Networking {
                ipv6_support_disabled: true,
                public_network_names: vec!["public".into()],
                internal_network_names: vec!["private-a".into(), "private-b".into()],
                address_sort_order: vec![
                    "192.168.0.0/16".parse().unwrap(),
                    "10.0.0.0/8".parse().unwrap(),
                    "2001:db8::/32".parse().unwrap(),
                ],
            },
            route: RouteOpts { router_id: "router-1".into() },
            metadata: MetadataOpts {
                search_order: "configDrive, metadataService".into(),
                request_timeout: "5s".into(),
            },
            regional_provider_id: false,
            warnings: Vec::new(),
        };
        assert_eq!(c, expected);
    }

    #[test]
    fn absent_sections_give_upstream_defaults() {
        let c = parse(MINIMAL).unwrap();
        assert_eq!(c.load_balancer, LoadBalancerOpts::default());
        assert_eq!(c.load_balancer.lb_provider, "amphora");
        assert_eq!(c.load_balancer.lb_method, "ROUND_ROBIN");
        assert_eq!(
            (
                c.load_balancer.monitor_delay,
                c.load_balancer.monitor_timeout,
                c.load_balancer.monitor_max_retries,
                c.load_balancer.monitor_max_retries_down
            ),
            (5, 3, 1, 3)
        );
        assert!(c.load_balancer.enabled && c.load_balancer.cascade_delete);
        assert_eq!(c.load_balancer.max_shared_lb, 2);
        assert_eq!(c.load_balancer.container_store, "barbican");
        assert_eq!(c.load_balancer.ingress_hostname_suffix, "nip.io");
        assert!(c.lb_classes.is_empty());
        assert_eq!(c.networking, Networking::default());
        assert_eq!(c.route, RouteOpts::default());
        assert_eq!(c.metadata.search_order, "configDrive,metadataService");
        assert_eq!(c.metadata.request_timeout, "");
        assert_eq!(c.global.endpoint_type, "public");
        assert!(!c.global.tls_insecure && !c.global.use_clouds);
        assert_eq!(c.global.ca_file, None);
        assert!(!c.regional_provider_id);
    }

    #[test]
    fn every_documented_key_and_example_is_accepted() {
        let clouds = "clouds:\n  openstack:\n    auth:\n      auth_url: https://k:5000/v3\n";
        let read = files(&[("/etc/openstack/clouds.yaml", clouds)]);
        for k in CONFIG_KEYS {
            let header = match k.section {
                "LoadBalancerClass \"<name>\"" => "[LoadBalancerClass \"c\"]".to_string(),
                s => format!("[{s}]"),
            };
            let pair = match k.key {
                "cert-file" => "key-file = /k.pem\n",
                "key-file" => "cert-file = /c.pem\n",
                "application-credential-id" | "application-credential-name" => {
                    "application-credential-secret = x\n"
                }
                "application-credential-secret" => "application-credential-id = x\n",
                "trust-id" => "trustee-id = t\n",
                _ => "",
            };
            let text = format!("{MINIMAL}{header}\n{} = {}\n{pair}", k.key, k.example);
            if let Err(e) = Config::parse_with(&text, &BTreeMap::new(), &read) {
                panic!("{} {} = {}: {e}", k.section, k.key, k.example);
            }
            assert!(has_key(CONFIG_KEYS, k.key));
        }
    }

    #[test]
    fn application_credentials_by_id_or_by_name_with_the_user() {
        let c = parse(
            "[Global]\nauth-url = https://k:5000/v3\napplication-credential-id = ac1\n\
             application-credential-secret = shh\n",
        )
        .unwrap();
        assert_eq!(c.global.application_credential_id, "ac1");
        assert_eq!(c.global.application_credential_secret.expose(), "shh");
        assert!(c.global.password.is_empty());

        let c = parse(
            "[Global]\nauth-url = https://k:5000/v3\napplication-credential-name = ccm\n\
             user-id = u1\napplication-credential-secret = shh\n",
        )
        .unwrap();
        assert_eq!(c.global.application_credential_name, "ccm");
        assert_eq!(c.global.user_id, "u1");

        let e = err_of(
            "[Global]\nauth-url = https://k:5000/v3\napplication-credential-name = ccm\n\
             application-credential-secret = shh\n",
        );
        assert!(e.to_string().contains("user-id or username"), "{e}");
    }

    #[test]
    fn trust_token_and_client_certificate_credentials() {
        let base = "[Global]\nauth-url = https://k:5000/v3\n";
        let c = parse(&format!("{base}trust-id = t1\ntrustee-id = u2\ntrustee-password = p\n"))
            .unwrap();
        assert_eq!((c.global.trust_id.as_str(), c.global.trustee_id.as_str()), ("t1", "u2"));
        // The legacy form: the user authenticates with the trust.
        parse(&format!("{base}trust-id = t1\nuser-id = u1\npassword = p\n")).unwrap();
        parse(&format!("{base}token = gAAAA\n")).unwrap();
        let c = parse(&format!("{base}cert-file = /c.pem\nkey-file = /k.pem\n")).unwrap();
        assert_eq!(c.global.cert_file, Some(PathBuf::from("/c.pem")));
    }

    #[test]
    fn missing_credentials_are_named() {
        let base = "[Global]\nauth-url = https://k:5000/v3\n";
        for (extra, named) in [
            ("", "[Global] credentials"),
            ("username = ccm\n", "[Global] password (with username or user-id)"),
            ("user-id = u\n", "[Global] password (with username or user-id)"),
            ("application-credential-id = a\n", "[Global] application-credential-secret"),
            ("application-credential-secret = s\n", "[Global] application-credential-id"),
            ("trust-id = t\npassword = p\n", "[Global] trustee-id (with trust-id)"),
            ("trust-id = t\ntrustee-id = u\n", "[Global] trustee-password (with trust-id)"),
            ("cert-file = /c\n", "[Global] key-file (with cert-file)"),
            ("key-file = /k\ntoken = t\n", "[Global] cert-file (with key-file)"),
        ] {
            let e = err_of(&format!("{base}{extra}"));
            match &e {
                ConfigError::Required(m) => assert!(m.starts_with(named), "{extra:?}: {m}"),
                other => panic!("{extra:?}: {other:?}"),
            }
        }
        assert_eq!(
            err_of("[Global]\nusername = u\npassword = p\n"),
            ConfigError::Required("[Global] auth-url")
        );
        assert_eq!(err_of(""), ConfigError::Required("[Global] auth-url"));
        let e = err_of("[Global]\nauth-url = ftp://k/\ntoken = t\n");
        assert_eq!(invalid_key(&e), "[Global] auth-url");
    }

    #[test]
    fn unknown_keys_and_sections_are_skipped_with_a_warning_naming_them_as_upstream() {
        let warnings_of = |extra: &str| {
            let c = parse(&format!("{MINIMAL}{extra}")).unwrap();
            let w = c.config_warnings().to_vec();
            assert!(!w.join(" ").contains("Zq7"), "a value is shown: {w:?}");
            (c, w)
        };
        let (c, w) =
            warnings_of("[LoadBalancer]\nlb-methd = Zq7x\nlb-method = LEAST_CONNECTIONS\n");
        assert_eq!(w.len(), 1, "{w:?}");
        assert!(w[0].contains("unknown key [LoadBalancer] lb-methd"), "{w:?}");
        assert_eq!(c.load_balancer.lb_method, "LEAST_CONNECTIONS");
        let (c, w) = warnings_of("[LoadBalancerClass \"gold\"]\nlb-method = Zq7x\nsubnet-id = s\n");
        assert!(w[0].contains("[LoadBalancerClass \"gold\"] lb-method"), "{w:?}");
        assert_eq!(c.lb_classes["gold"].subnet_id.as_deref(), Some("s"));
        let (_, w) = warnings_of("[Loadbalancers]\npassword = Zq7x\n");
        assert!(w[0].contains("unknown section [Loadbalancers]"), "{w:?}");
        let (c, w) = warnings_of("[Route \"r\"]\nrouter-id = Zq7x\n");
        assert!(w[0].contains("[Route \"r\"]") && c.route.router_id.is_empty(), "{w:?}");
        let (c, w) = warnings_of("[LoadBalancerClass]\nsubnet-id = Zq7x\n");
        assert!(w[0].contains("[LoadBalancerClass] (line") && c.lb_classes.is_empty(), "{w:?}");
        // A key of another section.
        let (_, w) = warnings_of("[Route]\nsubnet-id = Zq7x\n");
        assert!(w[0].contains("unknown key [Route] subnet-id"), "{w:?}");
        // A bare word (a pasted secret?) is named by its line only.
        let (_, w) = warnings_of("[Global]\nZq7secret\n");
        assert!(w[0].contains("[Global] on line"), "{w:?}");
        assert!(parse(MINIMAL).unwrap().config_warnings().is_empty());
    }

    #[test]
    fn bad_values_name_the_key() {
        for (section, line, key) in [
            ("LoadBalancer", "monitor-delay = soon", "[LoadBalancer] monitor-delay"),
            ("LoadBalancer", "monitor-delay = 500ms", "[LoadBalancer] monitor-delay"),
            ("LoadBalancer", "monitor-delay = -5s", "[LoadBalancer] monitor-delay"),
            ("LoadBalancer", "monitor-timeout = 0", "[LoadBalancer] monitor-timeout"),
            ("LoadBalancer", "monitor-max-retries = 0", "[LoadBalancer] monitor-max-retries"),
            (
                "LoadBalancer",
                "monitor-max-retries-down = 11",
                "[LoadBalancer] monitor-max-retries-down",
            ),
            ("LoadBalancer", "max-shared-lb = -1", "[LoadBalancer] max-shared-lb"),
            ("LoadBalancer", "max-shared-lb = two", "[LoadBalancer] max-shared-lb"),
            ("LoadBalancer", "lb-method = RANDOM", "[LoadBalancer] lb-method"),
            ("LoadBalancer", "lb-method =", "[LoadBalancer] lb-method"),
            ("LoadBalancer", "lb-version = v1", "[LoadBalancer] lb-version"),
            ("LoadBalancer", "enabled = maybe", "[LoadBalancer] enabled"),
            ("LoadBalancer", "enabled =", "[LoadBalancer] enabled"),
            ("LoadBalancer", "node-selector = a=b,=c", "[LoadBalancer] node-selector"),
            ("LoadBalancer", "subnet-id", "[LoadBalancer] subnet-id"),
            (
                "Networking",
                "address-sort-order = 10.0.0.0/8, 10.0.0.0/33",
                "[Networking] address-sort-order",
            ),
            ("Global", "os-endpoint-type = internalURL", "[Global] os-endpoint-type"),
            ("Global", "tls-insecure = yes", "[Global] tls-insecure"),
            ("Global", "tls-insecure", "[Global] tls-insecure"),
            (
                "Metadata",
                "search-order = configDrive,metadataService,configDrive",
                "[Metadata] search-order",
            ),
            ("Metadata", "search-order = cloudInit", "[Metadata] search-order"),
            ("Metadata", "search-order =", "[Metadata] search-order"),
            ("Metadata", "request-timeout = 5", "[Metadata] request-timeout"),
        ] {
            let e = err_of(&format!("{MINIMAL}[{section}]\n{line}\n"));
            assert_eq!(invalid_key(&e), key, "{line}: {e}");
            assert!(e.to_string().contains(key), "{e}");
        }
        let e =
            err_of(&format!("{MINIMAL}[Networking]\naddress-sort-order = 10.0.0.0/8,fd00::/129\n"));
        // The entry is named by its place, never quoted (no value is).
        assert!(e.to_string().contains("entry 2") && !e.to_string().contains("fd00"), "{e}");
    }

    #[test]
    fn monitor_durations_are_go_durations_or_seconds() {
        let lb = |v: &str| {
            parse(&format!("{MINIMAL}[LoadBalancer]\nmonitor-delay = {v}\n")).unwrap().load_balancer
        };
        assert_eq!(lb("1m").monitor_delay, 60);
        assert_eq!(lb("1m30s").monitor_delay, 90);
        assert_eq!(lb("7").monitor_delay, 7);
        // Truncated to whole seconds, as upstream.
        assert_eq!(lb("1500ms").monitor_delay, 1);
    }

    #[test]
    fn secrets_never_appear_in_errors_or_debug() {
        const SECRET: &str = "Zq7-distinctive-secret-9X";
        let creds = format!(
            "[Global]\nauth-url = https://k:5000/v3\nusername = u\npassword = {SECRET}\n\
             trust-id = t\ntrustee-id = u2\ntrustee-password = {SECRET}\n\
             application-credential-id = a\napplication-credential-secret = {SECRET}\n\
             token = {SECRET}\n"
        );
        let c = parse(&creds).unwrap();
        let debug = format!("{c:?}");
        assert!(!debug.contains(SECRET), "{debug}");
        assert!(debug.contains("<redacted>"));

        let clouds_bad = format!(
            "clouds:\n  openstack:\n    auth:\n      password: {SECRET}\n      username: [{SECRET}\n"
        );
        let clouds_type = format!(
            "clouds:\n  openstack:\n    auth:\n      password:\n        nested: {SECRET}\n"
        );
        let mut errors = vec![
            // A bad value next to the secrets.
            err_of(&format!("{creds}[LoadBalancer]\nmonitor-delay = nope\n")),
            // No auth-url.
            err_of(&format!("[Global]\npassword = {SECRET}\nusername = u\n")),
            // A bare password key, an unterminated quote, a bad escape.
            err_of(&format!("{MINIMAL}password\n")),
            err_of(&format!("[Global]\npassword = \"{SECRET}\n")),
            err_of(&format!("[Global]\npassword = \"{SECRET}\\q\"\n")),
            err_of(&format!("[Global]\npassword = {SECRET}\\x\n")),
            // The secret after a bad key.
            err_of(&format!("{MINIMAL}pass_word = {SECRET}\n")),
            err_of(&format!("{MINIMAL}password : {SECRET}\n")),
            err_of(&format!("password = {SECRET}\n[Global]\n")),
            err_of(&format!("[Global] {SECRET}\n")),
        ];
        for yaml in [clouds_bad, clouds_type] {
            let read = files(&[("/etc/openstack/clouds.yaml", &yaml)]);
            let text = "[Global]\nuse-clouds = true\n";
            errors.push(Config::parse_with(text, &BTreeMap::new(), &read).unwrap_err());
        }
        for e in errors {
            let shown = format!("{e} / {e:?}");
            assert!(!shown.contains(SECRET), "{shown}");
            assert!(!shown.contains("Zq7"), "{shown}");
        }
        // The secret pasted alone on a line is skipped, as upstream's gcfg skips it, with a
        // warning that names only its line.
        let c = parse(&format!("{MINIMAL}{SECRET}\n")).unwrap();
        let shown = format!("{:?} {c:?}", c.config_warnings());
        assert!(!shown.contains("Zq7") && shown.contains("line 5"), "{shown}");
    }

    #[test]
    fn os_ccm_regional_is_exactly_true() {
        for (value, regional) in
            [("true", true), ("TRUE", false), ("True", false), ("1", false), ("false", false)]
        {
            let c = Config::parse_with(MINIMAL, &env(&[("OS_CCM_REGIONAL", value)]), &no_files)
                .unwrap();
            assert_eq!(c.regional_provider_id, regional, "{value}");
        }
    }

    #[test]
    fn quoted_values_comments_and_continuations() {
        let c = parse(
            "[Global]\n\
             auth-url = \"https://k:5000/v3\" ; comment\n\
             username = \"a \\\"quoted\\\" name\"\n\
             password = pa\"ss; #\"word   # trailing comment\n\
             region = Region  One\t\n\
             tenant-name = line\\\n  continued\n\
             user-domain-name = \"\\ttab\\nnewline\\\\\"\n\
             domain-name = unquoted \\\" quote\n\
             tenant-id = \"  padded  \"\n",
        )
        .unwrap();
        let g = c.global;
        assert_eq!(g.auth_url, "https://k:5000/v3");
        assert_eq!(g.username, "a \"quoted\" name");
        assert_eq!(g.password.expose(), "pass; #word");
        assert_eq!(g.region, "Region  One");
        assert_eq!(g.project_name, "line  continued");
        assert_eq!(g.user_domain_name, "\ttab\nnewline\\");
        assert_eq!(g.domain_name, "unquoted \" quote");
        assert_eq!(g.project_id, "  padded  ");
        // CRLF files and a BOM.
        let c = parse(&format!("\u{feff}{}", MINIMAL.replace('\n', "\r\n"))).unwrap();
        assert_eq!(c.global.password.expose(), "s3cret");
    }

    #[test]
    fn syntax_errors_give_the_line() {
        for (text, line) in [
            ("username = u\n[Global]\n", 1),
            ("[Global]\n\n[Global\n", 3),
            ("[Global]\nauth_url = x\n", 2),
            ("[Global]\nauth-url: x\n", 2),
            ("[Global]\n= x\n", 2),
            ("[Global] extra\n", 1),
            ("[Global]\nregion = \"open\n", 2),
            ("[LoadBalancerClass \"\"]\n", 1),
            ("[LoadBalancerClass \"a\\nb\"]\n", 1),
            ("[Global]\nregion = a\0b\n", 2),
        ] {
            let e = err_of(text);
            assert!(matches!(e, ConfigError::Syntax(_)), "{text:?}: {e:?}");
            assert!(e.to_string().contains(&format!("line {line}")), "{text:?}: {e}");
        }
    }

    #[test]
    fn bare_keys_are_true_and_clear_multi_valued_keys() {
        let c = parse(&format!(
            "{MINIMAL}[LoadBalancer]\ncreate-monitor\ninternal-lb ; comment\n\
             [Networking]\nipv6-support-disabled\npublic-network-name = old\n\
             public-network-name\npublic-network-name = new\ninternal-network-name =\n"
        ))
        .unwrap();
        assert!(c.load_balancer.create_monitor && c.load_balancer.internal_lb);
        assert!(c.networking.ipv6_support_disabled);
        assert_eq!(c.networking.public_network_names, vec!["new"]);
        assert!(c.networking.internal_network_names.is_empty());
        // A repeated single-valued key: the last wins.
        let c = parse(&format!("{MINIMAL}[Route]\nrouter-id = a\nrouter-id = b\n")).unwrap();
        assert_eq!(c.route.router_id, "b");
    }

    #[test]
    fn block_storage_is_ignored() {
        let c = parse(&format!(
            "{MINIMAL}[BlockStorage]\nbs-version = v3\nignore-volume-az\nrescan-on-resize = true\n\
             [Route]\nrouter-id = r\n"
        ))
        .unwrap();
        assert_eq!(c.route.router_id, "r");
    }

    #[test]
    fn sections_and_keys_are_case_insensitive_class_names_are_not() {
        let c = parse(
            "[GLOBAL]\nAUTH-URL = https://k:5000/v3\nUserName = u\nPassword = p\n\
             [loadbalancer]\nLB-Method = least_connections\n\
             [loadBalancerClass \"Gold\"]\nSubnet-ID = s1\n[LoadBalancerClass \"gold\"]\nsubnet-id = s2\n\
             [networking]\nPublic-Network-Name = pub\n[ROUTE]\nRouter-Id = r\n[metadata]\n",
        )
        .unwrap();
        assert_eq!(c.global.username, "u");
        assert_eq!(c.load_balancer.lb_method, "LEAST_CONNECTIONS");
        assert_eq!(c.lb_classes["Gold"].subnet_id.as_deref(), Some("s1"));
        assert_eq!(c.lb_classes["gold"].subnet_id.as_deref(), Some("s2"));
        assert_eq!(c.networking.public_network_names, vec!["pub"]);
        assert_eq!(c.route.router_id, "r");
    }

    #[test]
    fn deprecated_project_aliases_fill_the_tenant_fields() {
        let c = parse(&format!(
            "{MINIMAL}project-id = p1\nproject-name = pn\nproject-domain-id = d1\n\
             project-domain-name = dn\n"
        ))
        .unwrap();
        let g = c.global;
        assert_eq!(
            [g.project_id, g.project_name, g.project_domain_id, g.project_domain_name],
            ["p1", "pn", "d1", "dn"]
        );
    }

    #[test]
    fn an_empty_class_section_still_defines_the_class() {
        let c = parse(&format!("{MINIMAL}[LoadBalancerClass \"empty\"]\n")).unwrap();
        assert_eq!(c.lb_classes["empty"], LoadBalancerClass::default());
    }

    const CLOUDS: &str = "\
clouds:
  openstack:
    auth:
      auth_url: https://yaml-keystone:5000/v3
      username: yaml-user
      password: 0123
      project_name: yaml-project
      user_domain_name: YamlDomain
      project_domain_id: default
    region_name: YamlRegion
    endpoint_type: internal
    cacert: /etc/openstack/ca.pem
    verify: false
  other:
    auth:
      auth_url: https://other:5000/v3
      application_credential_id: ac-other
      application_credential_secret: other-secret
";

    #[test]
    fn clouds_yaml_fills_what_the_ini_leaves_empty() {
        let read = files(&[("/etc/openstack/clouds.yaml", CLOUDS)]);
        let text = "[Global]\nuse-clouds = true\ncloud = openstack\nusername = ini-user\n\
                    region = IniRegion\n";
        let c = Config::parse_with(text, &BTreeMap::new(), &read).unwrap();
        let g = &c.global;
        // The INI wins (upstream's ReadClouds fills only empty settings).
        assert_eq!(g.username, "ini-user");
        assert_eq!(g.region, "IniRegion");
        assert_eq!(g.auth_url, "https://yaml-keystone:5000/v3");
        // Scalars are text, as in Go's yaml: `0123` stays `0123`.
        assert_eq!(g.password.expose(), "0123");
        assert_eq!(g.project_name, "yaml-project");
        assert_eq!(g.user_domain_name, "YamlDomain");
        assert_eq!(g.project_domain_id, "default");
        assert_eq!(g.endpoint_type, "internal");
        assert_eq!(g.ca_file, Some(PathBuf::from("/etc/openstack/ca.pem")));
        // `verify` is not read, as upstream.
        assert!(!g.tls_insecure);

        // OS_CLOUD picks the entry when [Global] cloud is not set.
        let c = Config::parse_with(
            "[Global]\nuse-clouds = true\n",
            &env(&[("OS_CLOUD", "other")]),
            &read,
        )
        .unwrap();
        assert_eq!(c.global.application_credential_id, "ac-other");
        assert_eq!(c.global.endpoint_type, "public");
        // ... and overrides it when set, as upstream's clientconfig.
        let c = Config::parse_with(
            "[Global]\nuse-clouds = true\ncloud = openstack\n",
            &env(&[("OS_CLOUD", "other")]),
            &read,
        )
        .unwrap();
        assert_eq!(c.global.application_credential_id, "ac-other");

        // Two clouds and no name: an error naming [Global] cloud and the choices.
        let e = Config::parse_with("[Global]\nuse-clouds = true\n", &BTreeMap::new(), &read)
            .unwrap_err();
        assert_eq!(invalid_key(&e), "[Global] cloud");
        assert!(e.to_string().contains("openstack, other"), "{e}");
        let e = Config::parse_with(
            "[Global]\nuse-clouds = true\ncloud = nope\n",
            &BTreeMap::new(),
            &read,
        )
        .unwrap_err();
        assert!(e.to_string().contains("no cloud \"nope\" in /etc/openstack/clouds.yaml"), "{e}");
    }

    #[test]
    fn the_clouds_yaml_search_order() {
        let one = |url: &str| {
            format!("clouds:\n  c:\n    auth:\n      auth_url: {url}\n      token: t\n")
        };
        let all = [
            ("/env/clouds.yaml", one("https://env:5000")),
            ("clouds.yaml", one("https://cwd:5000")),
            ("/home/u/.config/openstack/clouds.yaml", one("https://home:5000")),
            ("/etc/openstack/clouds.yaml", one("https://etc:5000")),
            ("/etc/openstack/clouds.yml", one("https://yml:5000")),
            ("/explicit.yaml", one("https://explicit:5000")),
        ];
        let e = env(&[("OS_CLIENT_CONFIG_FILE", "/env/clouds.yaml"), ("HOME", "/home/u")]);
        // Each file wins over the ones after it (the last, /explicit.yaml, is never searched).
        let expected = [
            "https://env:5000",
            "https://cwd:5000",
            "https://home:5000",
            "https://etc:5000",
            "https://yml:5000",
        ];
        for (skip, url) in expected.iter().enumerate() {
            let present: Vec<(&str, &str)> =
                all[skip..].iter().map(|(p, t)| (*p, t.as_str())).collect();
            let read = files(&present);
            let c = Config::parse_with("[Global]\nuse-clouds = yes\n", &e, &read).unwrap();
            assert_eq!(c.global.auth_url, *url, "skip {skip}");
        }
        // clouds-file wins over the search, and a missing one is an error naming the key.
        let read = files(&[("/explicit.yaml", &all[5].1), ("clouds.yaml", &all[1].1)]);
        let c = Config::parse_with(
            "[Global]\nuse-clouds = true\nclouds-file = /explicit.yaml\n",
            &BTreeMap::new(),
            &read,
        )
        .unwrap();
        assert_eq!(c.global.auth_url, "https://explicit:5000");
        let e = Config::parse_with(
            "[Global]\nuse-clouds = true\nclouds-file = /missing.yaml\n",
            &BTreeMap::new(),
            &read,
        )
        .unwrap_err();
        assert_eq!(invalid_key(&e), "[Global] clouds-file");
        assert!(e.to_string().contains("/missing.yaml"), "{e}");
        // None at all.
        let e = Config::parse_with("[Global]\nuse-clouds = true\n", &BTreeMap::new(), &no_files)
            .unwrap_err();
        assert!(matches!(e, ConfigError::Required(m) if m.starts_with("[Global] clouds-file")));
        // Without auth_url anywhere.
        let read = files(&[("clouds.yaml", "clouds:\n  c:\n    auth:\n      token: t\n")]);
        let e = Config::parse_with("[Global]\nuse-clouds = true\n", &BTreeMap::new(), &read)
            .unwrap_err();
        assert_eq!(
            e,
            ConfigError::Required("[Global] auth-url (or auth.auth_url of the clouds.yaml entry)")
        );
    }

    #[test]
    fn secure_yaml_overlays_the_entry() {
        let read = files(&[
            ("/etc/openstack/clouds.yaml", CLOUDS),
            (
                "/etc/openstack/secure.yaml",
                "clouds:\n  openstack:\n    auth:\n      password: from-secure\n",
            ),
        ]);
        let c = Config::parse_with(
            "[Global]\nuse-clouds = true\ncloud = openstack\n",
            &BTreeMap::new(),
            &read,
        )
        .unwrap();
        assert_eq!(c.global.password.expose(), "from-secure");
        assert_eq!(c.global.username, "yaml-user");
    }

    #[test]
    fn clouds_yaml_errors_name_the_file_and_key() {
        let run = |yaml: &str| {
            let read = files(&[("/etc/openstack/clouds.yaml", yaml)]);
            Config::parse_with("[Global]\nuse-clouds = true\n", &BTreeMap::new(), &read)
                .unwrap_err()
                .to_string()
        };
        let e = run("clouds:\n  c:\n    region_name: [a, b]\n");
        assert!(e.contains("/etc/openstack/clouds.yaml"), "{e}");
        assert!(e.contains("clouds.c.region_name"), "{e}");
        let e = run(
            "clouds:\n  c:\n    endpoint_type: internalURL\n    auth:\n      auth_url: https://k\n",
        );
        assert!(e.contains("clouds.c.endpoint_type"), "{e}");
        let e = run("clouds:\n  c:\n    profile: vexxhost\n");
        assert!(e.contains("clouds.c.profile"), "{e}");
        let e = run("clouds: [\n");
        assert!(e.contains("/etc/openstack/clouds.yaml"), "{e}");
    }

    #[test]
    fn redaction_helpers() {
        assert_eq!(
            redact_quoted("invalid type: string \"x\", expected `y`"),
            "invalid type: string \"<redacted>\", expected `<redacted>`"
        );
        assert_eq!(redact_quoted("open \"abc"), "open \"<redacted>");
        let text = "clouds:\n  c:\n    auth:\n      password: |\n        secret: x\n";
        assert_eq!(yaml_key_path(text, 5).as_deref(), Some("clouds.c.auth.password"));
        assert_eq!(yaml_key_path(text, 4).as_deref(), Some("clouds.c.auth.password"));
    }
}
