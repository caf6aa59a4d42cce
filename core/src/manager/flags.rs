//! The command line, with upstream's flag names and defaults (spec §7.3), and its validation
//! into [`Options`].
//!
//! Flags upstream has but this manager does not act on (profiling, content type, cipher
//! suites, ...) are accepted so an upstream manifest starts unchanged; `--help` marks them.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use clap::{ArgAction, Parser};

use super::duration;
use super::selection::{self, ControllerSelection};
use super::tls::TlsPolicy;
use crate::controllers::{ControllerConfig, ControllerDescriptor};

/// Feature gates this manager knows, with their defaults (spec §7.3).
pub const KNOWN_FEATURE_GATES: &[(&str, bool)] = &[
    ("CloudControllerManagerWebhook", false),
    ("CloudControllerManagerWatchBasedRoutesReconciliation", false),
    ("ControllerManagerReleaseLeaderElectionLockOnExit", false),
];

/// The gates of [`KNOWN_FEATURE_GATES`] at beta; every other one is alpha.
const BETA_FEATURE_GATES: &[&str] = &[];
/// `--feature-gates=AllAlpha=<bool>`: the default of every alpha gate (always known upstream).
const ALL_ALPHA: &str = "AllAlpha";
/// `--feature-gates=AllBeta=<bool>`: the default of every beta gate (always known upstream).
const ALL_BETA: &str = "AllBeta";

fn parse_duration(s: &str) -> Result<Duration, String> {
    duration::parse(s).map_err(|e| e.to_string())
}

fn parse_bool(s: &str) -> Result<bool, String> {
    match s {
        "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
        "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
        _ => Err(format!("invalid boolean {s:?}")),
    }
}

/// A ServiceAccount name prefix: the name `<prefix><client name>` must stay a DNS subdomain
/// (lower-case letters, digits, '-' and '.', starting with a letter or digit; at most 253
/// characters with the longest client name).
fn parse_service_account_prefix(s: &str) -> Result<String, String> {
    if s.is_empty() {
        return Ok(String::new());
    }
    if s.len() > 200 {
        return Err("longer than 200 characters".into());
    }
    if !s.starts_with(|c: char| c.is_ascii_lowercase() || c.is_ascii_digit()) {
        return Err("must start with a lower-case letter or a digit".into());
    }
    if !s.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.') {
        return Err("only lower-case letters, digits, '-' and '.' are allowed".into());
    }
    Ok(s.to_string())
}

/// What `--version` asks for (component-base's verflag).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum VersionFlag {
    /// `--version=false` (the default): run.
    #[default]
    Off,
    /// `--version` / `--version=true`: print `Kubernetes <gitVersion>` and quit.
    Short,
    /// `--version=raw`: print the whole version info, Go-style (`version.Info{...}`), and quit.
    Raw,
    /// `--version=vX.Y.Z...`: run, reporting this version instead of ours (upstream's dynamic
    /// version; no effect here beyond what [`VersionInfo::get`] reports).
    Override(String),
}

impl VersionFlag {
    /// Whether the flag asks to print the version and quit.
    pub fn prints(&self) -> bool {
        matches!(self, VersionFlag::Short | VersionFlag::Raw)
    }
}

fn parse_version(s: &str) -> Result<VersionFlag, String> {
    if s == "raw" {
        return Ok(VersionFlag::Raw);
    }
    if let Some(rest) = s.strip_prefix('v') {
        // vMAJOR.MINOR[.PATCH][-pre][+build], as upstream's SetDynamicVersion parses it.
        let core = rest.split(['-', '+']).next().unwrap_or_default();
        let parts: Vec<&str> = core.split('.').collect();
        let numeric = |p: &&str| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit());
        if (2..=3).contains(&parts.len()) && parts.iter().all(numeric) {
            return Ok(VersionFlag::Override(s.to_string()));
        }
        return Err(format!("invalid version {s:?}: expected vMAJOR.MINOR[.PATCH]"));
    }
    match parse_bool(s)? {
        true => Ok(VersionFlag::Short),
        false => Ok(VersionFlag::Off),
    }
}

/// This binary's version as upstream's `version.Info` (k8s.io/apimachinery): what `--version`
/// prints. Version from the crate; git commit, tree state and build date from the build's
/// environment (`CCM_GIT_COMMIT`, `CCM_GIT_TREE_STATE`, `CCM_BUILD_DATE`), "unknown" for a
/// commit nobody recorded and upstream's epoch default for the date.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VersionInfo {
    /// Major version (`0`).
    pub major: String,
    /// Minor version (`1`).
    pub minor: String,
    /// `v<version>`, or the `--version=vX.Y.Z` override.
    pub git_version: String,
    /// The commit built, or "unknown".
    pub git_commit: String,
    /// `clean`, `dirty` or "".
    pub git_tree_state: String,
    /// RFC 3339 build time.
    pub build_date: String,
    /// The compiler (`rustc`; `goVersion` stays empty).
    pub compiler: String,
    /// `<os>/<arch>` with Go's architecture names (`linux/amd64`).
    pub platform: String,
}

impl VersionInfo {
    /// The version of this build; `flag` may override the reported version.
    pub fn get(flag: &VersionFlag) -> VersionInfo {
        let version = env!("CARGO_PKG_VERSION");
        let mut parts = version.split('.');
        let major = parts.next().unwrap_or_default().to_string();
        let minor = parts.next().unwrap_or_default().to_string();
        let git_version = match flag {
            VersionFlag::Override(v) => v.clone(),
            _ => format!("v{version}"),
        };
        let env_or = |v: Option<&str>, default: &str| {
            v.filter(|v| !v.is_empty()).unwrap_or(default).to_string()
        };
        let arch = match std::env::consts::ARCH {
            "x86_64" => "amd64",
            "aarch64" => "arm64",
            "x86" => "386",
            other => other,
        };
        VersionInfo {
            major,
            minor,
            git_version,
            git_commit: env_or(option_env!("CCM_GIT_COMMIT"), "unknown"),
            git_tree_state: env_or(option_env!("CCM_GIT_TREE_STATE"), ""),
            build_date: env_or(option_env!("CCM_BUILD_DATE"), "1970-01-01T00:00:00Z"),
            compiler: "rustc".to_string(),
            platform: format!("{}/{arch}", std::env::consts::OS),
        }
    }

    /// What `--version` prints: `Kubernetes v0.1.0` (verflag's program name and gitVersion).
    pub fn short(&self) -> String {
        format!("Kubernetes {}", self.git_version)
    }

    /// What `--version=raw` prints: Go's `%#v` of `version.Info`, every field in upstream's
    /// order (the emulation and compatibility fields empty, as upstream's binaries print them).
    pub fn raw(&self) -> String {
        let fields: [(&str, &str); 13] = [
            ("Major", &self.major),
            ("Minor", &self.minor),
            ("EmulationMajor", ""),
            ("EmulationMinor", ""),
            ("MinCompatibilityMajor", ""),
            ("MinCompatibilityMinor", ""),
            ("GitVersion", &self.git_version),
            ("GitCommit", &self.git_commit),
            ("GitTreeState", &self.git_tree_state),
            ("BuildDate", &self.build_date),
            ("GoVersion", ""),
            ("Compiler", &self.compiler),
            ("Platform", &self.platform),
        ];
        let body: Vec<String> =
            fields.iter().map(|(k, v)| format!("{k}:{}", go_quote(v))).collect();
        format!("version.Info{{{}}}", body.join(", "))
    }
}

/// A string as Go's `%#v` (strconv.Quote) writes it: double quotes, `\"` and `\\` escaped,
/// control characters as `\n`, `\t`, `\xNN` or `\uNNNN`.
fn go_quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\t' => out.push_str("\\t"),
            '\r' => out.push_str("\\r"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The commands upstream's manifests and images start their cloud-controller-manager with. An
/// upstream manifest written for an image without an entrypoint passes one as the container's
/// first argument (OpenStack's chart and manifests: `args: [/bin/openstack-cloud-controller-manager,
/// --v=1, ...]`); run with our image's entrypoint, it arrives as the first positional and is
/// skipped ([`Options::skipped_command`]). Our own binary's names count too
/// (`cloud-controller-manager-<provider>`, with or without `/usr/local/bin/`).
pub const UPSTREAM_COMMANDS: &[&str] = &[
    // OpenStack: image CMD and chart/manifest args[0].
    "/bin/openstack-cloud-controller-manager",
    "openstack-cloud-controller-manager",
    // AWS: image entrypoint.
    "/bin/aws-cloud-controller-manager",
    "aws-cloud-controller-manager",
    // vSphere: image entrypoint.
    "/bin/vsphere-cloud-controller-manager",
    "vsphere-cloud-controller-manager",
    // Azure: image entrypoint and chart/manifest command (on PATH); its build's binary name.
    "/usr/local/bin/cloud-controller-manager",
    "cloud-controller-manager",
    "azure-cloud-controller-manager",
    // GCP: kube-up's static Pod passes it to its go-runner.
    "/cloud-controller-manager",
];

/// Whether `arg` names an upstream cloud-controller-manager command (or ours for `provider`).
pub fn is_upstream_command(arg: &str, provider: &str) -> bool {
    if UPSTREAM_COMMANDS.contains(&arg) {
        return true;
    }
    let ours = format!("cloud-controller-manager-{provider}");
    arg == ours || arg.strip_prefix("/usr/local/bin/") == Some(ours.as_str())
}

/// The cloud-controller-manager command line.
///
/// Booleans take `--flag`, `--flag=true` or `--flag=false`, as Go's pflag does.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "cloud-controller-manager",
    about = "The Cloud controller manager is a daemon that embeds the cloud specific control loops shipped with Kubernetes.",
    long_about = "The Cloud controller manager is a daemon that embeds the cloud specific control loops shipped with Kubernetes.\n\nBooleans take --flag, --flag=true or --flag=false, as upstream. -h gives a summary, --help the details.",
    disable_version_flag = true,
    // As pflag: a repeated single-value flag takes its last value; list flags (`Vec`, clap's
    // `Append`) keep appending on repeat, as pflag's StringSlice does.
    args_override_self = true,
    max_term_width = 100
)]
pub struct Flags {
    // ---- generic
    /// The provider for cloud services. Must name this binary's provider.
    #[arg(long, default_value = "", help_heading = "Generic flags")]
    pub cloud_provider: String,
    /// The path to the cloud provider configuration file. Empty string for no configuration file.
    #[arg(long, default_value = "", help_heading = "Generic flags")]
    pub cloud_config: String,
    /// The plugin to use when cloud provider is set to external (accepted; no effect).
    #[arg(long, default_value = "", help_heading = "Generic flags")]
    pub external_cloud_volume_plugin: String,
    /// If true, use individual service account credentials for each controller.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool, help_heading = "Generic flags")]
    pub use_service_account_credentials: bool,
    /// With --use-service-account-credentials: a prefix for the per-controller ServiceAccounts
    /// in kube-system (each controller acts as `kube-system/<prefix><client name>`, e.g.
    /// `ccm-node-controller`). Empty (the default) uses upstream's names, which are
    /// kube-controller-manager's own accounts (`node-controller`, `service-controller`,
    /// `route-controller`) and hold its bootstrap roles; the chart sets a prefix so the CCM
    /// never mints tokens for those. Lower-case letters, digits, '-' and '.'.
    #[arg(long, default_value = "", value_parser = parse_service_account_prefix, help_heading = "Generic flags")]
    pub controller_service_account_prefix: String,
    /// Allow the cluster to run without the cluster-id on cloud instances (deprecated).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool, help_heading = "Generic flags")]
    pub allow_untagged_cloud: bool,
    /// The period for reconciling routes created for Nodes by cloud provider.
    #[arg(long, default_value = "10s", value_parser = parse_duration, help_heading = "Generic flags")]
    pub route_reconciliation_period: Duration,
    /// The period for syncing NodeStatus in cloud-node-lifecycle-controller.
    #[arg(long, default_value = "5s", value_parser = parse_duration, help_heading = "Generic flags")]
    pub node_monitor_period: Duration,
    /// The instance prefix for the cluster.
    #[arg(long, default_value = "kubernetes", help_heading = "Generic flags")]
    pub cluster_name: String,
    /// CIDR Range for Pods in cluster. Only used when --allocate-node-cidrs=true.
    #[arg(long, default_value = "", help_heading = "Generic flags")]
    pub cluster_cidr: String,
    /// Should CIDRs for Pods be allocated and set on the cloud provider. Requires --cluster-cidr.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool, help_heading = "Generic flags")]
    pub allocate_node_cidrs: bool,
    /// Type of CIDR allocator to use (RangeAllocator or CloudAllocator).
    #[arg(long, default_value = "RangeAllocator", help_heading = "Generic flags")]
    pub cidr_allocator_type: String,
    /// Should CIDRs allocated by allocate-node-cidrs be configured on the cloud provider.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = parse_bool, help_heading = "Generic flags")]
    pub configure_cloud_routes: bool,
    /// Deprecated no-op (accepted).
    #[arg(long, default_value = "0s", value_parser = parse_duration, help_heading = "Generic flags")]
    pub node_sync_period: Duration,
    /// Informer resync base period (accepted; watches here do not resync).
    #[arg(long, default_value = "12h0m0s", value_parser = parse_duration, help_heading = "Generic flags")]
    pub min_resync_period: Duration,
    /// Content type of requests sent to apiserver (accepted; JSON is always used).
    #[arg(
        long,
        default_value = "application/vnd.kubernetes.protobuf",
        help_heading = "Generic flags"
    )]
    pub kube_api_content_type: String,
    /// QPS to use while talking with kubernetes apiserver.
    #[arg(long, default_value = "20", help_heading = "Generic flags")]
    pub kube_api_qps: f32,
    /// Burst to use while talking with kubernetes apiserver.
    #[arg(long, default_value = "30", help_heading = "Generic flags")]
    pub kube_api_burst: u32,
    /// Interval between starting controller managers.
    #[arg(long, default_value = "0s", value_parser = parse_duration, help_heading = "Generic flags")]
    pub controller_start_interval: Duration,
    /// A list of controllers to enable. '*' enables all on-by-default controllers, 'foo'
    /// enables the controller named 'foo', '-foo' disables the controller named 'foo'.
    /// All controllers: cloud-node-controller (cloud-node), cloud-node-lifecycle-controller
    /// (cloud-node-lifecycle), service-lb-controller (service), node-route-controller
    /// (route), node-ipam-controller (nodeipam).
    #[arg(long, default_value = "*", value_delimiter = ',', help_heading = "Generic flags")]
    pub controllers: Vec<String>,
    /// A set of key=value pairs that describe feature gates for alpha/experimental features.
    /// Known: CloudControllerManagerWebhook, CloudControllerManagerWatchBasedRoutesReconciliation,
    /// ControllerManagerReleaseLeaderElectionLockOnExit.
    #[arg(long, default_value = "", value_delimiter = ',', help_heading = "Generic flags")]
    pub feature_gates: Vec<String>,

    // ---- leader election
    /// Start a leader election client and gain leadership before executing the main loop.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = parse_bool, help_heading = "Leader election flags")]
    pub leader_elect: bool,
    /// How long non-leader candidates wait after observing a leadership renewal.
    #[arg(long, default_value = "15s", value_parser = parse_duration, help_heading = "Leader election flags")]
    pub leader_elect_lease_duration: Duration,
    /// How long the leader tries to renew before it stops leading.
    #[arg(long, default_value = "10s", value_parser = parse_duration, help_heading = "Leader election flags")]
    pub leader_elect_renew_deadline: Duration,
    /// How long clients wait between attempts of acquisition and renewal.
    #[arg(long, default_value = "2s", value_parser = parse_duration, help_heading = "Leader election flags")]
    pub leader_elect_retry_period: Duration,
    /// The type of resource object used for locking ("leases").
    #[arg(long, default_value = "leases", help_heading = "Leader election flags")]
    pub leader_elect_resource_lock: String,
    /// The name of the Lease used for locking.
    #[arg(
        long,
        default_value = "cloud-controller-manager",
        help_heading = "Leader election flags"
    )]
    pub leader_elect_resource_name: String,
    /// The namespace of the Lease used for locking.
    #[arg(long, default_value = "kube-system", help_heading = "Leader election flags")]
    pub leader_elect_resource_namespace: String,

    // ---- leader migration
    /// Whether to enable controller leader migration.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool, help_heading = "Leader migration flags")]
    pub enable_leader_migration: bool,
    /// Path to the LeaderMigrationConfiguration file (empty: the default configuration).
    #[arg(long, default_value = "", help_heading = "Leader migration flags")]
    pub leader_migration_config: String,

    // ---- debugging (accepted)
    /// Enable profiling via web interface (accepted; no profiling endpoints are served).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "true", value_parser = parse_bool, help_heading = "Debugging flags")]
    pub profiling: bool,
    /// Enable block profiling (accepted; no effect).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool, help_heading = "Debugging flags")]
    pub contention_profiling: bool,

    // ---- controllers
    /// Number of workers concurrently syncing nodes.
    #[arg(long, default_value = "1", help_heading = "Cloud-node-controller flags")]
    pub concurrent_node_syncs: usize,
    /// Number of workers concurrently updating node status (0: --concurrent-node-syncs).
    #[arg(long, default_value = "0", help_heading = "Cloud-node-controller flags")]
    pub concurrent_node_status_updates: usize,
    /// Number of services that are allowed to sync concurrently.
    #[arg(long, default_value = "1", help_heading = "Service-lb-controller flags")]
    pub concurrent_service_syncs: usize,
    /// CIDR range(s) for Services (at most two, comma separated).
    #[arg(long, default_value = "", help_heading = "Node-ipam-controller flags")]
    pub service_cluster_ip_range: String,
    /// Mask size for node CIDRs in single-stack clusters (0: family default).
    #[arg(long, default_value = "0", help_heading = "Node-ipam-controller flags")]
    pub node_cidr_mask_size: u8,
    /// Mask size for IPv4 node CIDRs (0: 24).
    #[arg(long, default_value = "0", help_heading = "Node-ipam-controller flags")]
    pub node_cidr_mask_size_ipv4: u8,
    /// Mask size for IPv6 node CIDRs (0: 64).
    #[arg(long, default_value = "0", help_heading = "Node-ipam-controller flags")]
    pub node_cidr_mask_size_ipv6: u8,

    // ---- webhooks
    /// A list of webhooks to enable ('*', 'foo', '-foo'). Known: persistentvolumelabel.
    #[arg(long, default_value = "", value_delimiter = ',', help_heading = "Webhook flags")]
    pub webhooks: Vec<String>,
    /// The IP address on which to listen for --webhook-secure-port.
    #[arg(long, default_value = "0.0.0.0", help_heading = "Webhook serving flags")]
    pub webhook_bind_address: std::net::IpAddr,
    /// The port on which to serve HTTPS for webhooks (0 disables).
    #[arg(long, default_value = "10260", help_heading = "Webhook serving flags")]
    pub webhook_secure_port: u16,
    /// Directory for webhook TLS certificates (accepted; the generated cert is kept in memory).
    #[arg(long, default_value = "", help_heading = "Webhook serving flags")]
    pub webhook_cert_dir: String,
    /// PEM certificate (chain) for the webhook port.
    #[arg(long, default_value = "", help_heading = "Webhook serving flags")]
    pub webhook_tls_cert_file: String,
    /// PEM private key for --webhook-tls-cert-file.
    #[arg(long, default_value = "", help_heading = "Webhook serving flags")]
    pub webhook_tls_private_key_file: String,
    /// As --tls-cipher-suites, for the webhook port.
    #[arg(long, default_value = "", value_delimiter = ',', help_heading = "Webhook serving flags")]
    pub webhook_tls_cipher_suites: Vec<String>,
    /// As --tls-min-version, for the webhook port.
    #[arg(long, default_value = "", help_heading = "Webhook serving flags")]
    pub webhook_tls_min_version: String,
    /// As --tls-curve-preferences, for the webhook port.
    #[arg(long, default_value = "", value_delimiter = ',', help_heading = "Webhook serving flags")]
    pub webhook_tls_curve_preferences: Vec<String>,
    /// As --tls-sni-cert-key, for the webhook port (repeatable).
    #[arg(long, action = ArgAction::Append, help_heading = "Webhook serving flags")]
    pub webhook_tls_sni_cert_key: Vec<String>,
    /// Accepted no-op: the webhook port serves HTTP/1.1 only, so HTTP/2 is always off.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool, help_heading = "Webhook serving flags")]
    pub webhook_disable_http2_serving: bool,

    // ---- secure serving
    /// The IP address on which to listen for --secure-port.
    #[arg(long, default_value = "0.0.0.0", help_heading = "Secure serving flags")]
    pub bind_address: std::net::IpAddr,
    /// The port on which to serve HTTPS with authentication and authorization (0 disables).
    #[arg(long, default_value = "10258", help_heading = "Secure serving flags")]
    pub secure_port: u16,
    /// Directory for TLS certificates (accepted; the generated cert is kept in memory).
    #[arg(long, default_value = "", help_heading = "Secure serving flags")]
    pub cert_dir: String,
    /// PEM certificate (chain) for HTTPS. Without it a self-signed certificate is generated.
    #[arg(long, default_value = "", help_heading = "Secure serving flags")]
    pub tls_cert_file: String,
    /// PEM private key matching --tls-cert-file.
    #[arg(long, default_value = "", help_heading = "Secure serving flags")]
    pub tls_private_key_file: String,
    /// Comma-separated TLS 1.2 cipher suites (Go names, e.g.
    /// TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256); empty: rustls' defaults. TLS 1.3 suites are not
    /// configurable. Suites rustls does not implement (RSA key exchange, CBC) are refused.
    #[arg(long, default_value = "", value_delimiter = ',', help_heading = "Secure serving flags")]
    pub tls_cipher_suites: Vec<String>,
    /// Minimum TLS version: VersionTLS12 (default) or VersionTLS13 (rustls has no TLS 1.0/1.1).
    #[arg(long, default_value = "", help_heading = "Secure serving flags")]
    pub tls_min_version: String,
    /// Elliptic curves (key-exchange groups) offered, in order: Go names (X25519, CurveP256,
    /// CurveP384, X25519MLKEM768) or their decimal IDs. Empty: rustls' defaults. CurveP521 is
    /// refused (rustls does not implement it).
    #[arg(long, default_value = "", value_delimiter = ',', help_heading = "Secure serving flags")]
    pub tls_curve_preferences: Vec<String>,
    /// A certificate and key for the SNI names it matches: "cert.pem,key.pem" (names from the
    /// certificate) or "cert.pem,key.pem:*.foo.com,foo.com". Repeatable; the most specific
    /// match wins; without a match --tls-cert-file is served.
    #[arg(long, action = ArgAction::Append, help_heading = "Secure serving flags")]
    pub tls_sni_cert_key: Vec<String>,
    /// Accepted no-op: the secure port serves HTTP/1.1 only.
    #[arg(long, default_value = "0", help_heading = "Secure serving flags")]
    pub http2_max_streams_per_connection: i64,
    /// If true, SO_REUSEPORT is set on the listening sockets, so several processes can bind the
    /// same port.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool, help_heading = "Secure serving flags")]
    pub permit_port_sharing: bool,
    /// Accepted; SO_REUSEADDR is always set on the listening sockets (the effect of true).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool, help_heading = "Secure serving flags")]
    pub permit_address_sharing: bool,
    /// Accepted no-op: the secure port serves HTTP/1.1 only, so HTTP/2 is always off.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool, help_heading = "Secure serving flags")]
    pub disable_http2_serving: bool,
    /// Address (IP:port) of a plain-HTTP listener that serves only /healthz, /livez and
    /// /readyz (the secure port's checks, which need no credentials there either) and nothing
    /// else; empty (the default) disables it. For kubelet probes that an unauthenticated flood
    /// of the secure port must not starve: bind it to loopback, e.g. 127.0.0.1:10268, run the
    /// Pod with hostNetwork so only the node reaches it, and point httpGet probes at host
    /// 127.0.0.1 and that port. It has its own small connection limits (64).
    #[arg(long, default_value = "", help_heading = "Secure serving flags")]
    pub healthz_bind_address: String,

    // ---- authentication / authorization
    /// Kubeconfig pointing at the core apiserver that can create TokenReviews (optional).
    #[arg(long, default_value = "", help_heading = "Authentication flags")]
    pub authentication_kubeconfig: String,
    /// Accepted for compatibility (no lookup of the authentication ConfigMap is done).
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool, help_heading = "Authentication flags")]
    pub authentication_skip_lookup: bool,
    /// How long to cache TokenReview responses.
    #[arg(long, default_value = "10s", value_parser = parse_duration, help_heading = "Authentication flags")]
    pub authentication_token_webhook_cache_ttl: Duration,
    /// Accepted for compatibility.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool, help_heading = "Authentication flags")]
    pub authentication_tolerate_lookup_failure: bool,
    /// If set, a client certificate signed by one of these CAs authenticates its request as
    /// the certificate's CommonName (user) and Organizations (groups).
    #[arg(long, default_value = "", help_heading = "Authentication flags")]
    pub client_ca_file: String,
    /// Root CA of the front proxy: requests with a client certificate from it may name their
    /// user in the --requestheader-username-headers. Without it, those headers are ignored.
    #[arg(long, default_value = "", help_heading = "Authentication flags")]
    pub requestheader_client_ca_file: String,
    /// Client certificate CommonNames allowed to name users in the request headers (empty:
    /// any certificate from --requestheader-client-ca-file).
    #[arg(long, default_value = "", value_delimiter = ',', help_heading = "Authentication flags")]
    pub requestheader_allowed_names: Vec<String>,
    /// Request headers to inspect for the username, first non-empty wins.
    #[arg(
        long,
        default_value = "x-remote-user",
        value_delimiter = ',',
        help_heading = "Authentication flags"
    )]
    pub requestheader_username_headers: Vec<String>,
    /// Request headers to inspect for groups.
    #[arg(
        long,
        default_value = "x-remote-group",
        value_delimiter = ',',
        help_heading = "Authentication flags"
    )]
    pub requestheader_group_headers: Vec<String>,
    /// Request header prefixes to inspect for extra attributes (the rest of the header name,
    /// lower-cased and unescaped, is the key).
    #[arg(
        long,
        default_value = "x-remote-extra-",
        value_delimiter = ',',
        help_heading = "Authentication flags"
    )]
    pub requestheader_extra_headers_prefix: Vec<String>,
    /// Request headers to inspect for the UID (empty: none).
    #[arg(long, default_value = "", value_delimiter = ',', help_heading = "Authentication flags")]
    pub requestheader_uid_headers: Vec<String>,
    /// Kubeconfig pointing at the core apiserver that can create SubjectAccessReviews (optional).
    #[arg(long, default_value = "", help_heading = "Authorization flags")]
    pub authorization_kubeconfig: String,
    /// Paths that need no authorization.
    #[arg(
        long,
        default_value = "/healthz,/readyz,/livez",
        value_delimiter = ',',
        help_heading = "Authorization flags"
    )]
    pub authorization_always_allow_paths: Vec<String>,
    /// How long to cache 'authorized' responses.
    #[arg(long, default_value = "10s", value_parser = parse_duration, help_heading = "Authorization flags")]
    pub authorization_webhook_cache_authorized_ttl: Duration,
    /// How long to cache 'unauthorized' responses.
    #[arg(long, default_value = "10s", value_parser = parse_duration, help_heading = "Authorization flags")]
    pub authorization_webhook_cache_unauthorized_ttl: Duration,

    // ---- misc
    /// The address of the Kubernetes API server (overrides any value in kubeconfig).
    #[arg(long, default_value = "", help_heading = "Misc flags")]
    pub master: String,
    /// Path to kubeconfig file with authorization and master location information
    /// (empty: the in-cluster configuration).
    #[arg(long, default_value = "", help_heading = "Misc flags")]
    pub kubeconfig: String,
    /// How often the cloud-node controller refreshes the addresses of initialised nodes.
    #[arg(long, default_value = "5m0s", value_parser = parse_duration, help_heading = "Misc flags")]
    pub node_status_update_frequency: Duration,

    // ---- global
    /// Print version information and quit: --version (or =true) prints `Kubernetes
    /// v<version>`, --version=raw the whole version info; --version=vX.Y.Z sets the reported
    /// version.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_version, help_heading = "Global flags")]
    pub version: VersionFlag,
    /// Number for the log level verbosity (as klog: 0 info, 2 debug, 4 trace of this manager).
    #[arg(short = 'v', long = "v", default_value = "0", help_heading = "Global flags")]
    pub verbosity: u8,
    /// Sets the log format. Permitted formats: "text", "json".
    #[arg(long, default_value = "text", help_heading = "Global flags")]
    pub logging_format: String,
    /// Comma-separated pattern=N settings (Go source file patterns). Accepted, syntax checked;
    /// no effect: Rust modules are not Go files (use -v or RUST_LOG).
    #[arg(long, default_value = "", help_heading = "Global flags")]
    pub vmodule: String,
    /// Accepted no-op: log lines are written unbuffered.
    #[arg(long, default_value = "5s", value_parser = parse_duration, help_heading = "Global flags")]
    pub log_flush_frequency: Duration,
    /// Accepted no-op (alpha upstream): info lines are not buffered.
    #[arg(long, default_value = "0", help_heading = "Global flags")]
    pub log_json_info_buffer_size: String,
    /// Accepted no-op (alpha upstream): every JSON line goes to stderr.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool, help_heading = "Global flags")]
    pub log_json_split_stream: bool,
    /// Accepted no-op (alpha upstream): info lines are not buffered.
    #[arg(long, default_value = "0", help_heading = "Global flags")]
    pub log_text_info_buffer_size: String,
    /// Accepted no-op (alpha upstream): every text line goes to stderr.
    #[arg(long, action = ArgAction::Set, num_args = 0..=1, require_equals = true, default_missing_value = "true", default_value = "false", value_parser = parse_bool, help_heading = "Global flags")]
    pub log_text_split_stream: bool,

    /// Positional arguments are rejected with upstream's message, except a first one naming
    /// an upstream cloud-controller-manager command ([`UPSTREAM_COMMANDS`]), which is skipped.
    #[arg(hide = true)]
    pub args: Vec<String>,
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogFormat {
    /// klog-like text.
    Text,
    /// One JSON object per line.
    Json,
}

/// A flag value that is syntactically fine but not valid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FlagError {
    /// A validation failure, already naming the flag.
    #[error("{0}")]
    Invalid(String),
}

fn invalid(msg: impl Into<String>) -> FlagError {
    FlagError::Invalid(msg.into())
}

/// Leader-election settings.
#[derive(Debug, Clone)]
pub struct LeaderElectionOptions {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// Lease duration.
    pub lease_duration: Duration,
    /// Renew deadline.
    pub renew_deadline: Duration,
    /// Retry period.
    pub retry_period: Duration,
}

/// Validated options the manager runs with.
#[derive(Debug, Clone)]
pub struct Options {
    /// The raw flags (for the settings that need no validation).
    pub flags: Flags,
    /// Controller settings.
    pub controller_config: ControllerConfig,
    /// Which controllers run.
    pub controllers: ControllerSelection,
    /// Leader election, when enabled.
    pub leader_election: Option<LeaderElectionOptions>,
    /// Feature gates after defaults.
    pub feature_gates: BTreeMap<String, bool>,
    /// Log format.
    pub log_format: LogFormat,
    /// The validated `--webhooks` entries.
    pub webhooks: Vec<String>,
    /// `--tls-min-version` / `--tls-cipher-suites` of the secure port.
    pub tls: TlsPolicy,
    /// `--webhook-tls-min-version` / `--webhook-tls-cipher-suites` of the webhook port.
    pub webhook_tls: TlsPolicy,
    /// `--healthz-bind-address`, when set.
    pub healthz_bind_address: Option<std::net::SocketAddr>,
    /// The first positional argument, when it named an upstream command and was skipped (the
    /// manager logs it once logging is set up).
    pub skipped_command: Option<String>,
}

impl Options {
    /// Whether a feature gate is on.
    pub fn feature_enabled(&self, gate: &str) -> bool {
        self.feature_gates.get(gate).copied().unwrap_or(false)
    }

    /// `/configz`: the effective configuration as upstream's v1alpha1
    /// `CloudControllerManagerConfiguration`, keyed `cloudcontrollermanager.config.k8s.io`.
    /// Only settings, never credentials (kubeconfig paths are paths, not contents).
    pub fn configz(&self) -> serde_json::Value {
        let f = &self.flags;
        let d = duration::format;
        serde_json::json!({
            "cloudcontrollermanager.config.k8s.io": {
                "apiVersion": "cloudcontrollermanager.config.k8s.io/v1alpha1",
                "kind": "CloudControllerManagerConfiguration",
                "Generic": {
                    "Port": f.secure_port,
                    "Address": f.bind_address.to_string(),
                    "MinResyncPeriod": d(f.min_resync_period),
                    "ClientConnection": {
                        "kubeconfig": f.kubeconfig,
                        "acceptContentTypes": "",
                        "contentType": f.kube_api_content_type,
                        "qps": f.kube_api_qps,
                        "burst": f.kube_api_burst,
                    },
                    "ControllerStartInterval": d(f.controller_start_interval),
                    "LeaderElection": {
                        "leaderElect": f.leader_elect,
                        "leaseDuration": d(f.leader_elect_lease_duration),
                        "renewDeadline": d(f.leader_elect_renew_deadline),
                        "retryPeriod": d(f.leader_elect_retry_period),
                        "resourceLock": f.leader_elect_resource_lock,
                        "resourceName": f.leader_elect_resource_name,
                        "resourceNamespace": f.leader_elect_resource_namespace,
                    },
                    "Controllers": f.controllers,
                    "Debugging": {
                        "EnableProfiling": f.profiling,
                        "EnableContentionProfiling": f.contention_profiling,
                    },
                    "LeaderMigrationEnabled": f.enable_leader_migration,
                },
                "KubeCloudShared": {
                    "CloudProvider": { "Name": f.cloud_provider, "CloudConfigFile": f.cloud_config },
                    "ExternalCloudVolumePlugin": f.external_cloud_volume_plugin,
                    "UseServiceAccountCredentials": f.use_service_account_credentials,
                    "AllowUntaggedCloud": f.allow_untagged_cloud,
                    "RouteReconciliationPeriod": d(f.route_reconciliation_period),
                    "NodeMonitorPeriod": d(f.node_monitor_period),
                    "ClusterName": f.cluster_name,
                    "ClusterCIDR": f.cluster_cidr,
                    "AllocateNodeCIDRs": f.allocate_node_cidrs,
                    "CIDRAllocatorType": f.cidr_allocator_type,
                    "ConfigureCloudRoutes": f.configure_cloud_routes,
                    "NodeSyncPeriod": d(f.node_sync_period),
                },
                "NodeController": {
                    "ConcurrentNodeSyncs": f.concurrent_node_syncs,
                    "ConcurrentNodeStatusUpdates": f.concurrent_node_status_updates,
                },
                "ServiceController": { "ConcurrentServiceSyncs": f.concurrent_service_syncs },
                "NodeStatusUpdateFrequency": d(f.node_status_update_frequency),
                "Webhook": { "Webhooks": self.webhooks },
            }
        })
    }

    /// The cloud-config path, if given.
    pub fn cloud_config_path(&self) -> Option<PathBuf> {
        (!self.flags.cloud_config.is_empty()).then(|| PathBuf::from(&self.flags.cloud_config))
    }
}

fn parse_feature_gates(items: &[String]) -> Result<BTreeMap<String, bool>, FlagError> {
    let mut gates: BTreeMap<String, bool> =
        KNOWN_FEATURE_GATES.iter().map(|(k, v)| ((*k).to_string(), *v)).collect();
    // component-base's always-known `AllAlpha` / `AllBeta`: the default of every alpha / beta
    // gate not set explicitly.
    let (mut all_alpha, mut all_beta) = (None, None);
    let mut explicit = Vec::new();
    for item in items.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        let Some((key, value)) = item.split_once('=') else {
            return Err(invalid(format!(
                "invalid argument {item:?} for \"--feature-gates\" flag: missing bool value for {item}"
            )));
        };
        let key = key.trim();
        if !gates.contains_key(key) && key != ALL_ALPHA && key != ALL_BETA {
            return Err(invalid(format!(
                "invalid argument {item:?} for \"--feature-gates\" flag: unrecognized feature gate: {key}"
            )));
        }
        let value = parse_bool(value.trim()).map_err(|_| {
            invalid(format!(
                "invalid argument {item:?} for \"--feature-gates\" flag: invalid value of {key}: {}, err: expected true or false",
                value.trim()
            ))
        })?;
        match key {
            ALL_ALPHA => all_alpha = Some(value),
            ALL_BETA => all_beta = Some(value),
            _ => {
                gates.insert(key.to_string(), value);
                explicit.push(key.to_string());
            }
        }
    }
    for (name, value) in gates.iter_mut() {
        if explicit.contains(name) {
            continue;
        }
        let all = if BETA_FEATURE_GATES.contains(&name.as_str()) { all_beta } else { all_alpha };
        if let Some(all) = all {
            *value = all;
        }
    }
    Ok(gates)
}

/// `--vmodule`: comma-separated `pattern=N` (as klog).
fn validate_vmodule(value: &str) -> Result<(), FlagError> {
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let ok = item
            .split_once('=')
            .is_some_and(|(pat, n)| !pat.is_empty() && n.trim().parse::<u32>().is_ok());
        if !ok {
            return Err(invalid(format!(
                "invalid argument {value:?} for \"--vmodule\" flag: expected comma-separated pattern=N, got {item:?}"
            )));
        }
    }
    Ok(())
}

/// A Kubernetes quantity as the log buffer sizes take (e.g. `0`, `512`, `64Ki`, `1M`).
fn validate_quantity(flag: &str, value: &str) -> Result<(), FlagError> {
    let v = value.trim();
    let digits = v.trim_end_matches(|c: char| c.is_ascii_alphabetic());
    let suffix = &v[digits.len()..];
    let known = ["", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei"];
    if digits.is_empty() || digits.parse::<f64>().is_err() || !known.contains(&suffix) {
        return Err(invalid(format!(
            "invalid argument {value:?} for \"{flag}\" flag: not a quantity"
        )));
    }
    Ok(())
}

/// An optional `IP:port` listen address (empty: none); port 0 is refused (nobody could
/// find the listener).
fn parse_listen_address(
    flag: &str,
    value: &str,
    example: &str,
) -> Result<Option<std::net::SocketAddr>, FlagError> {
    let value = value.trim();
    if value.is_empty() {
        return Ok(None);
    }
    let addr: std::net::SocketAddr = value.parse().map_err(|_| {
        invalid(format!(
            "{flag}: expected IP:port (e.g. {example}, IPv6 as [::1]:10268), got {value:?}"
        ))
    })?;
    if addr.port() == 0 {
        return Err(invalid(format!("{flag}: the port must not be 0, got {value:?}")));
    }
    Ok(Some(addr))
}

fn parse_cidrs(flag: &str, value: &str, max: usize) -> Result<Vec<ipnet::IpNet>, FlagError> {
    let mut out = Vec::new();
    for item in value.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let net: ipnet::IpNet =
            item.parse().map_err(|e| invalid(format!("--{flag}: invalid CIDR {item:?}: {e}")))?;
        out.push(net);
    }
    if out.len() > max {
        return Err(invalid(format!("--{flag} can not contain more than {max} entries")));
    }
    Ok(out)
}

impl Flags {
    /// Validates the flags for the binary of `provider` against the known controllers (and
    /// the core's webhooks).
    pub fn validate(
        self,
        provider: &str,
        known: &[ControllerDescriptor],
    ) -> Result<Options, FlagError> {
        self.validate_with_webhooks(provider, known, super::webhooks::KNOWN)
    }

    /// [`Self::validate`] with `--webhooks` checked against `webhooks`, `(name, alias)` pairs
    /// (the core's and a provider's, see [`super::extensions::Extensions::validate`]).
    pub fn validate_with_webhooks(
        self,
        provider: &str,
        known: &[ControllerDescriptor],
        webhooks: &[(&str, &str)],
    ) -> Result<Options, FlagError> {
        let skipped_command =
            self.args.first().filter(|a| is_upstream_command(a, provider)).cloned();
        let rest = &self.args[usize::from(skipped_command.is_some())..];
        if !rest.is_empty() {
            return Err(invalid(format!(
                "\"cloud-controller-manager\" does not take any arguments, got {rest:?}"
            )));
        }
        if self.cloud_provider.is_empty() {
            return Err(invalid("--cloud-provider cannot be empty"));
        }
        if self.cloud_provider != provider {
            return Err(invalid(format!(
                "--cloud-provider: unknown cloud provider {:?}: this binary runs only {provider:?}",
                self.cloud_provider
            )));
        }
        let controllers = selection::validate(&self.controllers, known)?;
        let webhooks = selection::validate_names(&self.webhooks, webhooks, "webhooks")?;
        let log_format = match self.logging_format.as_str() {
            "text" => LogFormat::Text,
            "json" => LogFormat::Json,
            other => {
                return Err(invalid(format!(
                    "--logging-format: unsupported log format {other:?}; permitted formats: \"json\", \"text\""
                )));
            }
        };
        let feature_gates = parse_feature_gates(&self.feature_gates)?;
        // Periods that drive a controller loop: zero would spin (upstream's wait.Until) or stop
        // the controller; refused at start.
        for (flag, value) in [
            ("--node-monitor-period", self.node_monitor_period),
            ("--node-status-update-frequency", self.node_status_update_frequency),
            ("--route-reconciliation-period", self.route_reconciliation_period),
        ] {
            if value.is_zero() {
                return Err(invalid(format!(
                    "{flag} must be greater than 0, got {}",
                    duration::format(value)
                )));
            }
        }
        let tls = TlsPolicy::from_flags("", &self.tls_min_version, &self.tls_cipher_suites)
            .and_then(|p| {
                p.with_curves_and_sni("", &self.tls_curve_preferences, &self.tls_sni_cert_key)
            })
            .map_err(invalid)?;
        let webhook_tls = TlsPolicy::from_flags(
            "webhook-",
            &self.webhook_tls_min_version,
            &self.webhook_tls_cipher_suites,
        )
        .and_then(|p| {
            p.with_curves_and_sni(
                "webhook-",
                &self.webhook_tls_curve_preferences,
                &self.webhook_tls_sni_cert_key,
            )
        })
        .map_err(invalid)?;
        let healthz_bind_address = parse_listen_address(
            "--healthz-bind-address",
            &self.healthz_bind_address,
            "127.0.0.1:10268",
        )?;
        validate_vmodule(&self.vmodule)?;
        for (flag, value) in [
            ("--log-json-info-buffer-size", &self.log_json_info_buffer_size),
            ("--log-text-info-buffer-size", &self.log_text_info_buffer_size),
        ] {
            validate_quantity(flag, value)?;
        }
        if !(self.kube_api_qps > 0.0 && self.kube_api_qps.is_finite()) {
            return Err(invalid("--kube-api-qps must be a positive number"));
        }
        if self.kube_api_burst == 0 {
            return Err(invalid("--kube-api-burst must be positive"));
        }
        if self.cidr_allocator_type != "RangeAllocator"
            && self.cidr_allocator_type != "CloudAllocator"
        {
            return Err(invalid(format!(
                "--cidr-allocator-type: unknown allocator type {:?} (RangeAllocator or CloudAllocator)",
                self.cidr_allocator_type
            )));
        }

        let leader_election = if self.leader_elect {
            if self.leader_elect_resource_lock != "leases" {
                return Err(invalid(format!(
                    "--leader-elect-resource-lock: resourceLock value must be \"leases\", got {:?}",
                    self.leader_elect_resource_lock
                )));
            }
            if self.leader_elect_resource_name.is_empty() {
                return Err(invalid("--leader-elect-resource-name cannot be empty"));
            }
            if self.leader_elect_resource_namespace.is_empty() {
                return Err(invalid("--leader-elect-resource-namespace cannot be empty"));
            }
            let (lease, renew, retry) = (
                self.leader_elect_lease_duration,
                self.leader_elect_renew_deadline,
                self.leader_elect_retry_period,
            );
            if retry.is_zero() || renew.is_zero() || lease.is_zero() {
                return Err(invalid(
                    "--leader-elect-lease-duration, --leader-elect-renew-deadline and --leader-elect-retry-period must be greater than zero",
                ));
            }
            if lease <= renew {
                return Err(invalid(
                    "--leader-elect-lease-duration must be greater than --leader-elect-renew-deadline",
                ));
            }
            if renew <= retry.mul_f64(1.2) {
                return Err(invalid(
                    "--leader-elect-renew-deadline must be greater than --leader-elect-retry-period*1.2",
                ));
            }
            Some(LeaderElectionOptions {
                namespace: self.leader_elect_resource_namespace.clone(),
                name: self.leader_elect_resource_name.clone(),
                lease_duration: lease,
                renew_deadline: renew,
                retry_period: retry,
            })
        } else {
            None
        };

        if self.webhook_secure_port != 0 && self.webhook_secure_port == self.secure_port {
            return Err(invalid("--webhook-secure-port cannot be the same value as --secure-port"));
        }
        if self.tls_cert_file.is_empty() != self.tls_private_key_file.is_empty() {
            return Err(invalid(
                "--tls-cert-file and --tls-private-key-file must be given together",
            ));
        }
        if self.webhook_tls_cert_file.is_empty() != self.webhook_tls_private_key_file.is_empty() {
            return Err(invalid(
                "--webhook-tls-cert-file and --webhook-tls-private-key-file must be given together",
            ));
        }

        let cluster_cidrs = parse_cidrs("cluster-cidr", &self.cluster_cidr, 2)?;
        let service_cidrs =
            parse_cidrs("service-cluster-ip-range", &self.service_cluster_ip_range, 2)?;
        let (mut v4, mut v6) = (self.node_cidr_mask_size_ipv4, self.node_cidr_mask_size_ipv6);
        if self.node_cidr_mask_size != 0 {
            if cluster_cidrs.len() > 1 {
                return Err(invalid(
                    "usage of --node-cidr-mask-size is not allowed with dual-stack clusters",
                ));
            }
            if v4 != 0 || v6 != 0 {
                return Err(invalid(
                    "usage of --node-cidr-mask-size-ipv4 and --node-cidr-mask-size-ipv6 is not allowed if --node-cidr-mask-size is set. For dual-stack clusters please unset it and use IPFamily specific flags",
                ));
            }
            match cluster_cidrs.first() {
                Some(ipnet::IpNet::V6(_)) => v6 = self.node_cidr_mask_size,
                _ => v4 = self.node_cidr_mask_size,
            }
        }
        if v4 > 32 {
            return Err(invalid("--node-cidr-mask-size-ipv4 must be at most 32"));
        }
        if v6 > 128 {
            return Err(invalid("--node-cidr-mask-size-ipv6 must be at most 128"));
        }

        let controller_config = ControllerConfig {
            cluster_name: self.cluster_name.clone(),
            cluster_cidrs,
            service_cidrs,
            allocate_node_cidrs: self.allocate_node_cidrs,
            cidr_allocator_type: self.cidr_allocator_type.clone(),
            node_cidr_mask_size_ipv4: if v4 == 0 { 24 } else { v4 },
            node_cidr_mask_size_ipv6: if v6 == 0 { 64 } else { v6 },
            configure_cloud_routes: self.configure_cloud_routes,
            concurrent_service_syncs: self.concurrent_service_syncs,
            concurrent_node_syncs: self.concurrent_node_syncs,
            concurrent_node_status_updates: self.concurrent_node_status_updates,
            node_monitor_period: self.node_monitor_period,
            node_status_update_frequency: self.node_status_update_frequency,
            route_reconciliation_period: self.route_reconciliation_period,
            ..ControllerConfig::default()
        };
        Ok(Options {
            flags: self,
            controller_config,
            controllers,
            leader_election,
            feature_gates,
            log_format,
            webhooks,
            tls,
            webhook_tls,
            healthz_bind_address,
            skipped_command,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers;

    fn parse(args: &[&str]) -> Result<Options, String> {
        let flags = Flags::try_parse_from(std::iter::once("ccm").chain(args.iter().copied()))
            .map_err(|e| e.to_string())?;
        flags.validate("test", &controllers::all()).map_err(|e| e.to_string())
    }

    #[test]
    fn a_repeated_flag_takes_its_last_value_and_list_flags_append() {
        let o = parse(&[
            "--cloud-provider=aws",
            "--cloud-provider=test",
            "--leader-elect=false",
            "--leader-elect",
            "--kube-api-qps=5",
            "--kube-api-qps=7",
        ])
        .unwrap();
        assert_eq!(o.flags.cloud_provider, "test");
        assert!(o.flags.leader_elect);
        assert_eq!(o.flags.kube_api_qps, 7.0);

        // pflag's StringSlice appends on repeat (the first use replaces the default).
        let o = parse(&[
            "--cloud-provider=test",
            "--controllers=cloud-node,service",
            "--controllers=-route",
        ])
        .unwrap();
        assert_eq!(o.flags.controllers, vec!["cloud-node", "service", "-route"]);
        assert!(!o.controllers.entries.iter().any(|e| e == "*"), "{:?}", o.controllers);
        // mapStringBool merges on repeat; a later value of the same gate wins.
        let o = parse(&[
            "--cloud-provider=test",
            "--feature-gates=CloudControllerManagerWebhook=true",
            "--feature-gates=CloudControllerManagerWatchBasedRoutesReconciliation=true",
            "--feature-gates=CloudControllerManagerWebhook=false",
        ])
        .unwrap();
        assert!(!o.feature_enabled("CloudControllerManagerWebhook"));
        assert!(o.feature_enabled("CloudControllerManagerWatchBasedRoutesReconciliation"));
    }

    #[test]
    fn all_alpha_and_all_beta_are_known_gates() {
        let o = parse(&["--cloud-provider=test", "--feature-gates=AllAlpha=false,AllBeta=false"])
            .unwrap();
        assert!(KNOWN_FEATURE_GATES.iter().all(|(g, _)| !o.feature_enabled(g)));
        // AllAlpha=true turns on every alpha gate not set explicitly.
        let o = parse(&[
            "--cloud-provider=test",
            "--feature-gates=CloudControllerManagerWebhook=false,AllAlpha=true",
        ])
        .unwrap();
        assert!(!o.feature_enabled("CloudControllerManagerWebhook"));
        assert!(o.feature_enabled("CloudControllerManagerWatchBasedRoutesReconciliation"));
        assert!(o.feature_enabled("ControllerManagerReleaseLeaderElectionLockOnExit"));
        let err = parse(&["--cloud-provider=test", "--feature-gates=AllAlpha=maybe"]).unwrap_err();
        assert!(err.contains("invalid value of AllAlpha: maybe"), "{err}");
    }

    #[test]
    fn defaults_match_upstream() {
        let o = parse(&["--cloud-provider=test"]).unwrap();
        let f = &o.flags;
        assert_eq!(f.kube_api_qps, 20.0);
        assert_eq!(f.kube_api_burst, 30);
        assert_eq!(f.secure_port, 10258);
        assert_eq!(f.webhook_secure_port, 10260);
        assert_eq!(f.bind_address.to_string(), "0.0.0.0");
        assert!(f.leader_elect);
        let le = o.leader_election.clone().unwrap();
        assert_eq!(
            (le.namespace.as_str(), le.name.as_str()),
            ("kube-system", "cloud-controller-manager")
        );
        assert_eq!(le.lease_duration, Duration::from_secs(15));
        assert_eq!(le.renew_deadline, Duration::from_secs(10));
        assert_eq!(le.retry_period, Duration::from_secs(2));
        let c = &o.controller_config;
        assert_eq!(c.cluster_name, "kubernetes");
        assert!(c.configure_cloud_routes);
        assert!(!c.allocate_node_cidrs);
        assert_eq!(c.node_status_update_frequency, Duration::from_secs(300));
        assert_eq!(c.node_monitor_period, Duration::from_secs(5));
        assert_eq!(c.route_reconciliation_period, Duration::from_secs(10));
        assert_eq!(f.controllers, vec!["*"]);
        assert_eq!(o.log_format, LogFormat::Text);
        assert!(!o.feature_enabled("CloudControllerManagerWebhook"));
    }

    #[test]
    fn go_style_booleans_and_durations() {
        let o = parse(&[
            "--cloud-provider",
            "test",
            "--leader-elect=false",
            "--allocate-node-cidrs",
            "--configure-cloud-routes=false",
            "--node-monitor-period=1m30s",
            "--cluster-cidr=10.0.0.0/16,fd00::/48",
            "-v=4",
        ])
        .unwrap();
        assert!(o.leader_election.is_none());
        assert!(o.controller_config.allocate_node_cidrs);
        assert!(!o.controller_config.configure_cloud_routes);
        assert_eq!(o.controller_config.node_monitor_period, Duration::from_secs(90));
        assert_eq!(o.controller_config.cluster_cidrs.len(), 2);
        assert_eq!(o.flags.verbosity, 4);
    }

    #[test]
    fn bad_values_name_the_flag() {
        let cases: &[(&[&str], &str)] = &[
            (&[], "--cloud-provider cannot be empty"),
            (&["--cloud-provider=aws"], "--cloud-provider"),
            (
                &["--cloud-provider=test", "--controllers=*,bogus"],
                "\"bogus\" is not in the list of known controllers",
            ),
            (&["--cloud-provider=test", "--no-such-flag"], "--no-such-flag"),
            (&["--cloud-provider=test", "--node-monitor-period=5"], "--node-monitor-period"),
            (&["--cloud-provider=test", "--secure-port=70000"], "--secure-port"),
            (&["--cloud-provider=test", "--leader-elect=maybe"], "--leader-elect"),
            (&["--cloud-provider=test", "--logging-format=xml"], "--logging-format"),
            (
                &["--cloud-provider=test", "--feature-gates=Nope=true"],
                "unrecognized feature gate: Nope",
            ),
            (
                &["--cloud-provider=test", "--leader-elect-resource-lock=endpoints"],
                "resourceLock value must be \"leases\"",
            ),
            (&["--cloud-provider=test", "--cluster-cidr=10.0.0.0/33"], "--cluster-cidr"),
            (
                &["--cloud-provider=test", "--webhook-secure-port=10258"],
                "--webhook-secure-port cannot be the same value as --secure-port",
            ),
            (
                &["--cloud-provider=test", "--leader-elect-renew-deadline=20s"],
                "--leader-elect-lease-duration must be greater",
            ),
            (&["--cloud-provider=test", "extra"], "does not take any arguments, got [\"extra\"]"),
            (
                &["--cloud-provider=test", "--node-monitor-period=0s"],
                "--node-monitor-period must be greater than 0, got 0s",
            ),
            (
                &["--cloud-provider=test", "--node-status-update-frequency=0"],
                "--node-status-update-frequency must be greater than 0",
            ),
            (
                &["--cloud-provider=test", "--route-reconciliation-period=0ms"],
                "--route-reconciliation-period must be greater than 0",
            ),
            (&["--cloud-provider=test", "--tls-min-version=VersionTLS11"], "--tls-min-version"),
            (
                &["--cloud-provider=test", "--tls-cipher-suites=TLS_RSA_WITH_AES_128_CBC_SHA"],
                "TLS_RSA_WITH_AES_128_CBC_SHA",
            ),
            (
                &["--cloud-provider=test", "--webhook-tls-min-version=VersionTLS10"],
                "--webhook-tls-min-version",
            ),
        ];
        for (args, want) in cases {
            let err = parse(args).err().unwrap_or_else(|| panic!("{args:?} should fail"));
            assert!(err.contains(want), "{args:?}: {err:?} should contain {want:?}");
        }
    }

    /// Every flag upstream's `aws-cloud-controller-manager --help` lists (k8s.io/cloud-provider
    /// options, k8s.io/apiserver secure serving / delegated authn / authz, component-base
    /// logs, verflag, plus the webhook serving and node-ipam sets), with a representative value.
    pub(crate) const UPSTREAM_FLAGS: &[&str] = &[
        // generic
        "--allocate-node-cidrs=true",
        "--allow-untagged-cloud=true",
        "--cidr-allocator-type=RangeAllocator",
        "--cloud-config=/etc/kubernetes/cloud.conf",
        "--cloud-provider=test",
        "--cluster-cidr=10.0.0.0/16",
        "--cluster-name=kubernetes",
        "--configure-cloud-routes=false",
        "--controller-start-interval=0s",
        "--controllers=*",
        "--external-cloud-volume-plugin=aws",
        "--feature-gates=CloudControllerManagerWebhook=false",
        "--kube-api-burst=30",
        "--kube-api-content-type=application/vnd.kubernetes.protobuf",
        "--kube-api-qps=20",
        "--leader-elect=true",
        "--leader-elect-lease-duration=15s",
        "--leader-elect-renew-deadline=10s",
        "--leader-elect-resource-lock=leases",
        "--leader-elect-resource-name=cloud-controller-manager",
        "--leader-elect-resource-namespace=kube-system",
        "--leader-elect-retry-period=2s",
        "--min-resync-period=12h0m0s",
        "--node-monitor-period=5s",
        "--node-sync-period=0s",
        "--route-reconciliation-period=10s",
        "--use-service-account-credentials=true",
        // debugging
        "--contention-profiling=false",
        "--profiling=true",
        // leader migration
        "--enable-leader-migration=false",
        "--leader-migration-config=",
        // controllers
        "--concurrent-node-status-updates=0",
        "--concurrent-node-syncs=1",
        "--concurrent-service-syncs=1",
        "--node-cidr-mask-size-ipv4=24",
        "--node-cidr-mask-size-ipv6=64",
        "--service-cluster-ip-range=10.96.0.0/12",
        // webhook
        "--webhooks=",
        "--webhook-bind-address=0.0.0.0",
        "--webhook-cert-dir=/var/run/webhook",
        "--webhook-disable-http2-serving=true",
        "--webhook-secure-port=10260",
        "--webhook-tls-cert-file=",
        "--webhook-tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
        "--webhook-tls-curve-preferences=X25519",
        "--webhook-tls-min-version=VersionTLS12",
        "--webhook-tls-private-key-file=",
        "--webhook-tls-sni-cert-key=/w.crt,/w.key:w.example.com",
        // secure serving
        "--bind-address=0.0.0.0",
        "--cert-dir=/var/run/kubernetes",
        "--disable-http2-serving=true",
        "--http2-max-streams-per-connection=1000",
        "--permit-address-sharing=true",
        "--permit-port-sharing=false",
        "--secure-port=10258",
        "--tls-cert-file=",
        "--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,TLS_AES_128_GCM_SHA256",
        "--tls-curve-preferences=X25519,CurveP256",
        "--tls-min-version=VersionTLS12",
        "--tls-private-key-file=",
        "--tls-sni-cert-key=/a.crt,/a.key",
        "--tls-sni-cert-key=/b.crt,/b.key:*.example.com,example.com",
        // authentication
        "--authentication-kubeconfig=/etc/kubernetes/ccm.conf",
        "--authentication-skip-lookup=true",
        "--authentication-token-webhook-cache-ttl=10s",
        "--authentication-tolerate-lookup-failure=true",
        "--client-ca-file=/etc/kubernetes/pki/ca.crt",
        "--requestheader-allowed-names=front-proxy-client",
        "--requestheader-client-ca-file=/etc/kubernetes/pki/front-proxy-ca.crt",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-uid-headers=X-Remote-Uid",
        "--requestheader-username-headers=X-Remote-User",
        // authorization
        "--authorization-always-allow-paths=/healthz,/readyz,/livez,/metrics",
        "--authorization-kubeconfig=/etc/kubernetes/ccm.conf",
        "--authorization-webhook-cache-authorized-ttl=10s",
        "--authorization-webhook-cache-unauthorized-ttl=10s",
        // misc
        "--kubeconfig=/etc/kubernetes/ccm.conf",
        "--master=https://127.0.0.1:6443",
        "--node-status-update-frequency=5m0s",
        // logs (component-base) and global
        "--log-flush-frequency=5s",
        "--log-json-info-buffer-size=0",
        "--log-json-split-stream=false",
        "--log-text-info-buffer-size=64Ki",
        "--log-text-split-stream=true",
        "--logging-format=text",
        "--v=2",
        "--vmodule=controller*=4,node=2",
        "--version=false",
    ];

    #[test]
    fn every_upstream_flag_parses() {
        let o = parse(UPSTREAM_FLAGS).unwrap_or_else(|e| panic!("{e}"));
        let f = &o.flags;
        assert_eq!(f.requestheader_username_headers, vec!["X-Remote-User"]);
        assert_eq!(f.requestheader_allowed_names, vec!["front-proxy-client"]);
        assert_eq!(o.tls.sni.len(), 2);
        assert_eq!(o.webhook_tls.sni.len(), 1);
        assert_eq!(o.tls.kx_groups.as_ref().map(Vec::len), Some(2));
        assert!(f.disable_http2_serving && f.permit_address_sharing);
        assert_eq!(f.verbosity, 2);
        // Each flag on its own, too (defaults of the others).
        for flag in UPSTREAM_FLAGS {
            let args: Vec<&str> = if flag.starts_with("--cloud-provider") {
                vec![flag]
            } else {
                vec!["--cloud-provider=test", flag]
            };
            parse(&args).unwrap_or_else(|e| panic!("{flag}: {e}"));
        }
        // Bare booleans and the other spellings pflag takes.
        parse(&[
            "--cloud-provider=test",
            "--disable-http2-serving",
            "--permit-port-sharing",
            "-v",
            "4",
        ])
        .unwrap();
        assert_eq!(
            Flags::try_parse_from(["ccm", "--version=raw"]).unwrap().version,
            VersionFlag::Raw
        );
        assert_eq!(
            Flags::try_parse_from(["ccm", "--version"]).unwrap().version,
            VersionFlag::Short
        );
        let e = parse(&["--cloud-provider=test", "--vmodule=nonsense"]).unwrap_err();
        assert!(e.contains("--vmodule"), "{e}");
        let e = parse(&["--cloud-provider=test", "--log-json-info-buffer-size=lots"]).unwrap_err();
        assert!(e.contains("--log-json-info-buffer-size"), "{e}");
    }

    #[test]
    fn an_upstream_command_as_first_argument_is_skipped_any_other_argument_is_refused() {
        // OpenStack's chart and manifests (v1.36.0): args[0] is the binary of an image with no
        // entrypoint; ours has one, so it arrives as a positional.
        let o =
            parse(&["/bin/openstack-cloud-controller-manager", "--v=1", "--cloud-provider=test"])
                .unwrap();
        assert_eq!(o.skipped_command.as_deref(), Some("/bin/openstack-cloud-controller-manager"));
        assert_eq!(o.flags.verbosity, 1, "the flags after it still apply");
        for command in UPSTREAM_COMMANDS.iter().copied().chain([
            "cloud-controller-manager-test",
            "/usr/local/bin/cloud-controller-manager-test",
        ]) {
            let o = parse(&[command, "--cloud-provider=test"]).unwrap_or_else(|e| panic!("{e}"));
            assert_eq!(o.skipped_command.as_deref(), Some(command));
        }
        let o = parse(&["--cloud-provider=test"]).unwrap();
        assert_eq!(o.skipped_command, None);
        let refused: &[(&[&str], &str)] = &[
            // Anything else, or a second positional, stays upstream's error.
            (&["--cloud-provider=test", "extra"], "got [\"extra\"]"),
            (&["/bin/sh", "--cloud-provider=test"], "got [\"/bin/sh\"]"),
            (
                &["/bin/openstack-cloud-controller-manager", "--cloud-provider=test", "extra"],
                "got [\"extra\"]",
            ),
            (
                &["cloud-controller-manager", "cloud-controller-manager", "--cloud-provider=test"],
                "got [\"cloud-controller-manager\"]",
            ),
            // Another cloud's binary of ours is not this one.
            (
                &["cloud-controller-manager-aws", "--cloud-provider=test"],
                "cloud-controller-manager-aws",
            ),
            (&["/bin/openstack-cloud-controller-manager-x", "--cloud-provider=test"], "-x"),
        ];
        for (args, want) in refused {
            let err = parse(args).err().unwrap_or_else(|| panic!("{args:?} should fail"));
            assert!(
                err.contains("does not take any arguments") && err.contains(want),
                "{args:?}: {err}"
            );
        }
    }

    #[test]
    fn version_prints_as_upstreams_verflag() {
        let flag = |a: &str| Flags::try_parse_from(["ccm", a]).map(|f| f.version);
        assert_eq!(Flags::try_parse_from(["ccm"]).unwrap().version, VersionFlag::Off);
        assert_eq!(flag("--version=false").unwrap(), VersionFlag::Off);
        assert_eq!(flag("--version=true").unwrap(), VersionFlag::Short);
        assert_eq!(flag("--version=v1.36.0").unwrap(), VersionFlag::Override("v1.36.0".into()));
        assert!(!VersionFlag::Override("v1.36.0".into()).prints(), "an override runs the manager");
        assert!(VersionFlag::Short.prints() && VersionFlag::Raw.prints());
        for bad in ["--version=maybe", "--version=v1", "--version=vx.y", "--version=v1.2.3.4"] {
            let e = flag(bad).unwrap_err().to_string();
            assert!(e.contains("--version"), "{bad}: {e}");
        }

        let info = VersionInfo::get(&VersionFlag::Short);
        let version = env!("CARGO_PKG_VERSION");
        assert_eq!(info.short(), format!("Kubernetes v{version}"));
        assert_eq!(
            VersionInfo::get(&VersionFlag::Override("v1.36.0".into())).short(),
            "Kubernetes v1.36.0"
        );
        assert!(!info.git_commit.is_empty(), "a commit or \"unknown\"");
        let raw = info.raw();
        let mut parts = version.split('.');
        let (major, minor) = (parts.next().unwrap(), parts.next().unwrap());
        let want = format!(
            "version.Info{{Major:\"{major}\", Minor:\"{minor}\", EmulationMajor:\"\", \
             EmulationMinor:\"\", MinCompatibilityMajor:\"\", MinCompatibilityMinor:\"\", \
             GitVersion:\"v{version}\", GitCommit:\"{}\", GitTreeState:\"{}\", \
             BuildDate:\"{}\", GoVersion:\"\", Compiler:\"rustc\", Platform:\"{}\"}}",
            info.git_commit, info.git_tree_state, info.build_date, info.platform
        );
        assert_eq!(raw, want);
        assert!(
            info.platform == "linux/amd64" || info.platform == "linux/arm64",
            "{}",
            info.platform
        );
        assert_eq!(go_quote("a\"b\\c\n\u{1}"), r#""a\"b\\c\n\x01""#);
    }

    #[test]
    fn configz_is_upstreams_shape() {
        let o = parse(&["--cloud-provider=test", "--cluster-name=prod", "--leader-elect=false"])
            .unwrap();
        let c = &o.configz()["cloudcontrollermanager.config.k8s.io"];
        assert_eq!(c["kind"], "CloudControllerManagerConfiguration");
        assert_eq!(c["KubeCloudShared"]["ClusterName"], "prod");
        assert_eq!(c["Generic"]["LeaderElection"]["leaderElect"], false);
        assert_eq!(c["Generic"]["LeaderElection"]["leaseDuration"], "15s");
        assert_eq!(c["NodeStatusUpdateFrequency"], "5m0s");
    }

    #[test]
    fn help_says_which_flags_are_no_ops() {
        let help = Flags::try_parse_from(["ccm", "--help"]).unwrap_err().to_string();
        let flat = help.split_whitespace().collect::<Vec<_>>().join(" ");
        for flag in [
            "--http2-max-streams-per-connection",
            "--disable-http2-serving",
            "--webhook-disable-http2-serving",
            "--log-json-split-stream",
            "--log-text-info-buffer-size",
            "--log-flush-frequency",
        ] {
            let at = [" ", "[", "<"]
                .iter()
                .find_map(|end| flat.find(&format!("{flag}{end}")))
                .unwrap_or_else(|| panic!("{flag} in help"));
            let text = &flat[at..(at + 200).min(flat.len())];
            assert!(text.contains("no-op"), "{flag}: {text}");
        }
        assert!(flat.contains("--vmodule"), "{flat}");
    }

    #[test]
    fn help_is_readable() {
        let err = Flags::try_parse_from(["ccm", "--help"]).unwrap_err();
        let help = err.to_string();
        for flag in [
            "--cloud-provider",
            "--controllers",
            "--leader-elect",
            "--secure-port",
            "Generic flags",
        ] {
            assert!(help.contains(flag), "help mentions {flag}");
        }
    }

    #[test]
    fn controller_service_account_prefix_is_a_name_prefix_or_empty() {
        let off = parse(&["--cloud-provider=test"]).unwrap();
        assert_eq!(off.flags.controller_service_account_prefix, "", "upstream's names by default");
        let on = parse(&["--cloud-provider=test", "--controller-service-account-prefix=ccm-"]);
        assert_eq!(on.unwrap().flags.controller_service_account_prefix, "ccm-");
        for bad in ["CCM-", "-ccm", "ccm/", "ccm_", "a b"] {
            let e = parse(&[
                "--cloud-provider=test",
                &format!("--controller-service-account-prefix={bad}"),
            ])
            .unwrap_err();
            assert!(e.contains("--controller-service-account-prefix"), "{bad}: {e}");
        }
    }

    #[test]
    fn healthz_bind_address_is_an_ip_and_port_or_off() {
        let off = parse(&["--cloud-provider=test"]).unwrap();
        assert_eq!(off.healthz_bind_address, None, "off by default");
        let on = parse(&["--cloud-provider=test", "--healthz-bind-address=127.0.0.1:10268"]);
        assert_eq!(on.unwrap().healthz_bind_address, Some("127.0.0.1:10268".parse().unwrap()));
        let v6 = parse(&["--cloud-provider=test", "--healthz-bind-address=[::1]:10268"]);
        assert_eq!(v6.unwrap().healthz_bind_address, Some("[::1]:10268".parse().unwrap()));
        for (bad, want) in [
            ("localhost:10268", "expected IP:port"),
            ("127.0.0.1", "expected IP:port"),
            ("127.0.0.1:0", "the port must not be 0"),
        ] {
            let e = parse(&["--cloud-provider=test", &format!("--healthz-bind-address={bad}")])
                .unwrap_err();
            assert!(e.starts_with("--healthz-bind-address: ") && e.contains(want), "{bad}: {e}");
        }
    }
}
