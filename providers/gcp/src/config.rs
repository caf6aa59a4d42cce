//! The cloud config: upstream's gcfg INI `gce.conf`, section `[global]` (upstream's
//! `ConfigFile` / `ConfigGlobal` in `providers/gce/gce.go`).
//!
//! Owns parsing and validation. Every error names the key (`[global] key`) and none quotes a
//! value: `token-body` is a credential and `token-url` may carry one.
//!
//! CONTRACT (types used by client, instances, load_balancer, routes): field names below are
//! fixed; the parser fills them.
//!
//! **No file** (`--cloud-config` not given) is [`Config::default()`], as upstream: credentials
//! from the metadata server, everything else discovered from it.
//!
//! **Syntax** is gcfg's, read by the providers' shared reader [`ccm_core::gcfg`]: the section
//! and keys match case-insensitively (`[Global]` works as `[global]`), values may be quoted,
//! `;`/`#` start comments, `node-tags` and `alpha-features` take one value per line (a bare
//! key clears them), a bare boolean key is true, a repeated single-valued key: the last wins,
//! an empty value is the same as no value (upstream tests each key against `""`).
//!
//! **Unknown sections and keys** are skipped with a warning naming them, as upstream's
//! `gcfg.FatalOnly` skips them ([`Config::config_warnings`]: the manager shows them as an Event
//! at start), as are the two keys OpenShift's installer writes for its fork
//! (`external-instance-groups-prefix`, `firewall-rules-management`).
//!
//! **Validation**, stricter than upstream where upstream would go on with a config that cannot
//! work (each difference is in [`CONFIG_KEYS`] and the crate README): `token-url`, `api-endpoint` and `container-api-endpoint` must be
//! https URLs without user information (URLs are logged; `token-url = nil` still selects
//! Application Default Credentials), plain `http://` only on a loopback host or with our own
//! opt-in `allow-http-endpoints = true`; the endpoints carry no query string, and the token
//! URL's is never shown ([`redacted_url`]);
//! `stack-type` must be one of upstream's three values; `node-tags` must be Compute network
//! tags (upstream takes `a,b` as one tag and Compute refuses the firewall); `local-zone` must
//! be a zone (`<region>-<letter>`).

use ccm_core::gcfg::{self, Schema, Section, SectionSpec};
use ccm_core::reference::KeyDoc;

/// Why the cloud config cannot be used. Each message names the key (`[global] key`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    /// The file is not valid gcfg INI (the line is given, never its text).
    #[error("cloud config is not valid: {0}")]
    Syntax(String),
    /// A key has a value that cannot be used.
    #[error("invalid cloud configuration setting {key}: {message}")]
    Invalid {
        /// The key, e.g. `[global] stack-type`.
        key: String,
        /// Why (never the value).
        message: String,
    },
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

/// A secret string (`token-body`): never printed by `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

impl Secret {
    /// The secret's value (for the token request only).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

/// The whole parsed config.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Config {
    /// `[global]`.
    pub global: Global,
}

/// `[global]`. `None` / empty means "not set": the client discovers it from the metadata
/// server (project, zone, network) or goes without it, as upstream. `Debug` shows URLs by
/// [`redacted_url`].
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Global {
    /// `token-url` / `token-body`: how the manager gets its access tokens.
    pub credentials: Credentials,
    /// `project-id` (name or number).
    pub project_id: Option<String>,
    /// `network-project-id`: the project owning the network (Shared VPC); `project-id` when
    /// not set.
    pub network_project_id: Option<String>,
    /// `network-name`: a name, or a URL when it contains `/`.
    pub network_name: Option<String>,
    /// `subnetwork-name`: a name, or a URL when it contains `/`.
    pub subnetwork_name: Option<String>,
    /// `secondary-range-name` (deprecated upstream).
    pub secondary_range_name: Option<String>,
    /// `node-tags` (one per line): the target tags of the load balancers' firewall rules.
    pub node_tags: Vec<String>,
    /// `node-instance-prefix`.
    pub node_instance_prefix: Option<String>,
    /// `regional`: the cluster spans the region (every zone managed).
    pub regional: bool,
    /// `multizone`: every zone of the region managed.
    pub multizone: bool,
    /// `api-endpoint`: Compute's base path instead of Google's.
    pub api_endpoint: Option<url::Url>,
    /// `container-api-endpoint`: the GKE API's base path instead of Google's.
    pub container_api_endpoint: Option<url::Url>,
    /// `local-zone`: the manager's own zone instead of the metadata server's.
    pub local_zone: Option<String>,
    /// `alpha-features` (one per line).
    pub alpha_features: Vec<String>,
    /// `stack-type`.
    pub stack_type: StackType,
    /// What reading the file skipped, as upstream does (unknown sections and keys, the
    /// OpenShift keys): one line each, naming the section and key, never a value.
    pub warnings: Vec<String>,
}

/// Where access tokens come from (upstream's `GenerateCloudConfig`). `Debug` shows the token
/// URL by [`redacted_url`] and never the body.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Credentials {
    /// No `token-url`: the metadata server's service-account token.
    #[default]
    Metadata,
    /// `token-url = <URL>`: upstream's `AltTokenSource`, `POST` of `token-body` to the URL.
    TokenUrl {
        /// The URL (not shown in errors: it may carry credentials).
        url: url::Url,
        /// `token-body` (`None` when not set).
        body: Option<Secret>,
    },
    /// `token-url = nil`: Application Default Credentials (`GOOGLE_APPLICATION_CREDENTIALS`).
    ApplicationDefault,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Metadata => f.write_str("Metadata"),
            Credentials::TokenUrl { url, body } => f
                .debug_struct("TokenUrl")
                .field("url", &redacted_url(url))
                .field("body", body)
                .finish(),
            Credentials::ApplicationDefault => f.write_str("ApplicationDefault"),
        }
    }
}

impl std::fmt::Debug for Global {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let url = |u: &Option<url::Url>| u.as_ref().map(redacted_url);
        f.debug_struct("Global")
            .field("credentials", &self.credentials)
            .field("project_id", &self.project_id)
            .field("network_project_id", &self.network_project_id)
            .field("network_name", &self.network_name)
            .field("subnetwork_name", &self.subnetwork_name)
            .field("secondary_range_name", &self.secondary_range_name)
            .field("node_tags", &self.node_tags)
            .field("node_instance_prefix", &self.node_instance_prefix)
            .field("regional", &self.regional)
            .field("multizone", &self.multizone)
            .field("api_endpoint", &url(&self.api_endpoint))
            .field("container_api_endpoint", &url(&self.container_api_endpoint))
            .field("local_zone", &self.local_zone)
            .field("alpha_features", &self.alpha_features)
            .field("stack_type", &self.stack_type)
            .field("warnings", &self.warnings)
            .finish()
    }
}

/// `stack-type`: which address family a Node lists first.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum StackType {
    /// `IPV4`, or not set: IPv4 addresses first.
    #[default]
    Ipv4,
    /// `IPV4_IPV6`: IPv4 addresses first, as upstream.
    DualStack,
    /// `IPV6`: IPv6 addresses first.
    Ipv6,
}

impl StackType {
    /// Upstream's spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            StackType::Ipv4 => "IPV4",
            StackType::DualStack => "IPV4_IPV6",
            StackType::Ipv6 => "IPV6",
        }
    }

    /// Upstream's spelling, exactly (upstream compares the text with `IPV6`).
    pub fn parse(text: &str) -> Option<StackType> {
        [StackType::Ipv4, StackType::DualStack, StackType::Ipv6]
            .into_iter()
            .find(|s| s.as_str() == text)
    }
}

/// `token-url`'s value selecting Application Default Credentials.
pub const TOKEN_URL_ADC: &str = "nil";

/// The alpha features upstream's code tests for (`gce_alpha.go`); others are accepted with a
/// warning, as upstream accepts any name.
pub const KNOWN_ALPHA_FEATURES: [&str; 2] = ["ILBSubsets", "SkipIGsManagement"];

/// Keys OpenShift's installer writes for its fork of the provider: accepted, ignored.
const FOREIGN_KEYS: [&str; 2] = ["external-instance-groups-prefix", "firewall-rules-management"];

/// The section's name.
const GLOBAL: &str = "global";

/// Every key the parser reads, with its documentation. The parser looks each key of the file
/// up here (an unknown key is an error), reads only keys listed here (checked in debug builds,
/// so by every test), and the tests feed every example back in. `ccm-docgen` can render it as
/// the configuration reference.
pub static CONFIG_KEYS: &[KeyDoc] = &[
    KeyDoc {
        section: GLOBAL,
        key: "token-url",
        value: "URL, or `nil`",
        example: "https://gkeauth.example.com/v1/token",
        doc: "Not set: the metadata server's service-account token. A URL: tokens are `POST`ed for (with `token-body`), answered as `{\"accessToken\", \"expireTime\"}`. `nil`: Application Default Credentials (`GOOGLE_APPLICATION_CREDENTIALS`). Must be an https URL without user information (upstream accepts any text and fails on first use); `http://` only on a loopback host or with `allow-http-endpoints`. Its query string is never logged (shown as `?<redacted>`).",
    },
    KeyDoc {
        section: GLOBAL,
        key: "token-body",
        value: "secret",
        example: "{\"projectNumber\":123}",
        doc: "The body of the token request to `token-url`. Never logged nor shown in errors. Ignored (with a warning) without a `token-url`, as upstream.",
    },
    KeyDoc {
        section: GLOBAL,
        key: "project-id",
        value: "string (project name or number)",
        example: "my-project",
        doc: "The cluster's project. Default: the metadata server's.",
    },
    KeyDoc {
        section: GLOBAL,
        key: "network-project-id",
        value: "string (project name or number)",
        example: "my-host-project",
        doc: "The project owning the network (Shared VPC). Default: `project-id`.",
    },
    KeyDoc {
        section: GLOBAL,
        key: "network-name",
        value: "network name or URL",
        example: "k8s-net",
        doc: "The cluster's network: a name in `network-project-id`, or a URL when it contains `/`. Default: the metadata server's (the instance's first interface).",
    },
    KeyDoc {
        section: GLOBAL,
        key: "subnetwork-name",
        value: "subnetwork name or URL",
        example: "k8s-subnet",
        doc: "The subnetwork of internal load balancers: a name in the region, or a URL when it contains `/`. Not set: on an auto-mode network, the network's subnetwork of the region (inside `10.128.0.0/9`), as upstream picks it; on a custom-mode network an internal load balancer without the subnet annotation is an error naming this key.",
    },
    KeyDoc {
        section: GLOBAL,
        key: "stack-type",
        value: "`IPV4` (default), `IPV4_IPV6` or `IPV6`",
        example: "IPV4_IPV6",
        doc: "`IPV6` lists a Node's IPv6 addresses first, the others IPv4 first. Exactly these spellings (upstream compares the text, so `ipv6` would silently mean IPv4 there; here it is an error).",
    },
    KeyDoc {
        section: GLOBAL,
        key: "secondary-range-name",
        value: "string",
        example: "pods",
        doc: "Deprecated upstream: the subnetwork's secondary range for alias IPs. Accepted and kept; node IPAM reads the instance's alias ranges.",
    },
    KeyDoc {
        section: GLOBAL,
        key: "node-tags",
        value: "network tag, one per line, may repeat",
        example: "k8s-node",
        doc: "The network tags of the nodes: the target tags of load-balancer firewall rules. Each must be a Compute network tag (lower-case letters, digits, `-`, at most 63); `a,b` on one line is an error (upstream takes it as one tag that Compute refuses). A bare `node-tags` clears the list.",
    },
    KeyDoc {
        section: GLOBAL,
        key: "node-instance-prefix",
        value: "string",
        example: "k8s-node",
        doc: "The common prefix of the nodes' instance names (used to find the node tags when `node-tags` is not set).",
    },
    KeyDoc {
        section: GLOBAL,
        key: "regional",
        value: "bool, default false",
        example: "true",
        doc: "A regional cluster: every zone of the region is managed.",
    },
    KeyDoc {
        section: GLOBAL,
        key: "multizone",
        value: "bool, default false",
        example: "true",
        doc: "Every zone of the region is managed (else only `local-zone`).",
    },
    KeyDoc {
        section: GLOBAL,
        key: "api-endpoint",
        value: "https URL, no user information, query or fragment",
        example: "https://www.googleapis.com/compute/v1/",
        doc: "Compute's base path instead of Google's (private endpoints, tests). `http://` only on a loopback host or with `allow-http-endpoints`.",
    },
    KeyDoc {
        section: GLOBAL,
        key: "container-api-endpoint",
        value: "https URL, no user information, query or fragment",
        example: "https://container.googleapis.com/",
        doc: "The GKE API's base path instead of Google's. Accepted and kept; this manager does not call the GKE API. `http://` only on a loopback host or with `allow-http-endpoints`.",
    },
    KeyDoc {
        section: GLOBAL,
        key: "allow-http-endpoints",
        value: "bool, default false",
        example: "false",
        doc: "Not upstream's: accept plain `http://` for `token-url`, `api-endpoint` and `container-api-endpoint` on hosts other than loopback. Tokens and every API call then cross the network in clear text: only for a trusted proxy on the node's own network. The metadata server (`GCE_METADATA_HOST`) is http by nature and needs no opt-in.",
    },
    KeyDoc {
        section: GLOBAL,
        key: "local-zone",
        value: "zone",
        example: "us-central1-a",
        doc: "The manager's zone (its region is the zone without the last `-x`). Default: the metadata server's.",
    },
    KeyDoc {
        section: GLOBAL,
        key: "alpha-features",
        value: "feature name, one per line, may repeat",
        example: "ILBSubsets",
        doc: "Upstream's alpha feature gates, honoured as upstream: `ILBSubsets` (new internal load balancers are left to GKE's L4 controller; ones made before are still updated and deleted) and `SkipIGsManagement` (the `k8s-ig--<clusterID>*` instance groups are used as found, never created, changed or deleted). Other names are accepted with a warning. A bare `alpha-features` clears the list.",
    },
    KeyDoc {
        section: GLOBAL,
        key: "external-instance-groups-prefix",
        value: "string",
        example: "mycluster-x7k2p",
        doc: "Written by OpenShift's installer for its fork; accepted and ignored with a warning (upstream ignores it as an unknown key).",
    },
    KeyDoc {
        section: GLOBAL,
        key: "firewall-rules-management",
        value: "string",
        example: "Managed",
        doc: "Written by OpenShift's installer for its fork; accepted and ignored with a warning (upstream ignores it as an unknown key).",
    },
];

/// `gce.conf`'s one section (upstream's `ConfigFile` has only `Global`, `gcfg:"global"`).
static SCHEMA: Schema = Schema {
    table: CONFIG_KEYS,
    sections: &[SectionSpec::plain(GLOBAL)],
    canonical: gcfg::no_aliases,
};

fn invalid(s: &Section<'_>, key: &str, message: impl Into<String>) -> ConfigError {
    s.invalid(key, message).into()
}

/// A URL as logs, events and errors may show it: `scheme://host[:port]/path`, with
/// `?<redacted>` for a query string and `#<redacted>` for a fragment (a signed token URL
/// carries its signature there) and never user information.
pub fn redacted_url(url: &url::Url) -> String {
    let mut out = format!("{}://{}", url.scheme(), url.host_str().unwrap_or_default());
    if let Some(port) = url.port() {
        out.push_str(&format!(":{port}"));
    }
    out.push_str(url.path());
    if url.query().is_some() {
        out.push_str("?<redacted>");
    }
    if url.fragment().is_some() {
        out.push_str("#<redacted>");
    }
    out
}

/// Whether `url`'s host is a loopback one (`localhost`, `127.0.0.0/8`, `::1`): plain http
/// there never leaves the machine.
fn is_loopback(url: &url::Url) -> bool {
    match url.host() {
        Some(url::Host::Domain(d)) => d.eq_ignore_ascii_case("localhost"),
        Some(url::Host::Ipv4(ip)) => ip.is_loopback(),
        Some(url::Host::Ipv6(ip)) => ip.is_loopback(),
        None => false,
    }
}

/// How [`http_url`] treats a URL's parts beyond scheme, host and path.
#[derive(Clone, Copy)]
struct UrlRules {
    /// `allow-http-endpoints`: plain http on any host.
    allow_http: bool,
    /// A query string (and fragment) is accepted (`token-url`; never shown).
    query: bool,
}

/// An https URL (http only on a loopback host or with `allow-http-endpoints`), never quoted
/// back: a URL may carry credentials.
fn http_url(
    s: &Section<'_>,
    key: &'static str,
    rules: UrlRules,
) -> Result<Option<url::Url>, ConfigError> {
    let Some(text) = s.non_empty(key)? else { return Ok(None) };
    match url::Url::parse(text.trim()) {
        Ok(u) if !u.username().is_empty() || u.password().is_some() => Err(invalid(
            s,
            key,
            "must not carry user information (URLs are logged); pass credentials another way",
        )),
        Ok(u) if !matches!(u.scheme(), "http" | "https") || !u.has_host() => {
            Err(invalid(s, key, "must be an https URL"))
        }
        Ok(u) if !rules.query && (u.query().is_some() || u.fragment().is_some()) => {
            Err(invalid(s, key, "must not carry a query string or a fragment"))
        }
        Ok(u) if u.scheme() == "http" && !rules.allow_http && !is_loopback(&u) => Err(invalid(
            s,
            key,
            "plain http:// would send tokens and API calls in clear text: use https://, or set \
             [global] allow-http-endpoints = true to accept it",
        )),
        Ok(u) => {
            if u.scheme() == "http" && !is_loopback(&u) {
                tracing::warn!(
                    key,
                    url = %redacted_url(&u),
                    "cloud config: [global] {key} is plain http (allow-http-endpoints is set): \
                     tokens and API calls cross the network in clear text"
                );
            }
            Ok(Some(u))
        }
        Err(e) => Err(invalid(s, key, format!("not a URL ({e})"))),
    }
}

fn credentials(s: &Section<'_>, allow_http: bool) -> Result<Credentials, ConfigError> {
    let body = s.opt_string("token-body")?.filter(|b| !b.is_empty()).map(Secret);
    let credentials = match s.non_empty("token-url")? {
        None => Credentials::Metadata,
        Some(t) if t.trim() == TOKEN_URL_ADC => Credentials::ApplicationDefault,
        Some(_) => match http_url(s, "token-url", UrlRules { allow_http, query: true }) {
            Ok(Some(url)) => Credentials::TokenUrl { url, body: body.clone() },
            Ok(None) => Credentials::Metadata,
            Err(ConfigError::Invalid { key, message }) => {
                return Err(ConfigError::Invalid {
                    key,
                    message: format!(
                        "{message}; write `{TOKEN_URL_ADC}` for Application Default Credentials"
                    ),
                });
            }
            Err(e) => return Err(e),
        },
    };
    if body.is_some() && !matches!(credentials, Credentials::TokenUrl { .. }) {
        tracing::warn!(
            "cloud config: [global] token-body is ignored without a token-url URL, as upstream"
        );
    }
    Ok(credentials)
}

/// A Compute network tag (RFC 1035 label: lower-case letter first, then lower-case letters,
/// digits and `-`, not ending with `-`, at most 63).
fn is_network_tag(tag: &str) -> bool {
    let b = tag.as_bytes();
    (1..=63).contains(&b.len())
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b.last() != Some(&b'-')
}

fn node_tags(s: &Section<'_>) -> Result<Vec<String>, ConfigError> {
    let tags: Vec<String> = s.list("node-tags").into_iter().map(|t| t.trim().to_string()).collect();
    for (i, tag) in tags.iter().enumerate() {
        if tag.contains(',') || tag.contains(char::is_whitespace) {
            return Err(invalid(
                s,
                "node-tags",
                format!(
                    "tag {} holds several tags: write one `node-tags = <tag>` line each",
                    i + 1
                ),
            ));
        }
        if !is_network_tag(tag) {
            return Err(invalid(
                s,
                "node-tags",
                format!(
                    "tag {} is not a Compute network tag (lower-case letters, digits and '-', \
                     starting with a letter, at most 63)",
                    i + 1
                ),
            ));
        }
    }
    Ok(tags)
}

/// `<region>-<zone letter>`, e.g. `us-central1-a` (upstream's `GetGCERegion` needs a `-`).
fn local_zone(s: &Section<'_>) -> Result<Option<String>, ConfigError> {
    let Some(zone) = s.non_empty("local-zone")?.map(|z| z.trim().to_string()) else {
        return Ok(None);
    };
    let ok = zone.rsplit_once('-').is_some_and(|(region, letter)| {
        !region.is_empty()
            && !letter.is_empty()
            && zone.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
    });
    if !ok {
        return Err(invalid(s, "local-zone", "not a zone (e.g. us-central1-a)"));
    }
    Ok(Some(zone))
}

fn stack_type(s: &Section<'_>) -> Result<StackType, ConfigError> {
    let Some(text) = s.non_empty("stack-type")? else { return Ok(StackType::Ipv4) };
    StackType::parse(text.trim()).ok_or_else(|| {
        invalid(
            s,
            "stack-type",
            "must be IPV4, IPV4_IPV6 or IPV6, spelt exactly so (upstream compares the text)",
        )
    })
}

/// A trimmed, non-empty string.
fn name(s: &Section<'_>, key: &'static str) -> Result<Option<String>, ConfigError> {
    Ok(s.non_empty(key)?.map(|v| v.trim().to_string()))
}

impl Config {
    /// Parses and validates `gce.conf` text (an empty text is [`Config::default()`]).
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        let parsed = gcfg::read(text, &SCHEMA)?;
        let mut warnings = parsed.warnings;
        let s = parsed.value.section(GLOBAL);
        for key in FOREIGN_KEYS {
            if s.is_set(key) {
                let message = format!("[global] {key} is ignored (an OpenShift key)");
                tracing::warn!(key, "cloud config: {message}");
                warnings.push(message);
            }
        }
        let alpha_features = s.list("alpha-features");
        for f in &alpha_features {
            if !KNOWN_ALPHA_FEATURES.contains(&f.as_str()) {
                tracing::warn!(feature = %f, "cloud config: unknown [global] alpha-features name");
            }
        }
        let allow_http = s.boolean("allow-http-endpoints", false)?;
        let endpoint = UrlRules { allow_http, query: false };
        let global = Global {
            credentials: credentials(&s, allow_http)?,
            project_id: name(&s, "project-id")?,
            network_project_id: name(&s, "network-project-id")?,
            network_name: name(&s, "network-name")?,
            subnetwork_name: name(&s, "subnetwork-name")?,
            secondary_range_name: name(&s, "secondary-range-name")?,
            node_tags: node_tags(&s)?,
            node_instance_prefix: name(&s, "node-instance-prefix")?,
            regional: s.boolean("regional", false)?,
            multizone: s.boolean("multizone", false)?,
            api_endpoint: http_url(&s, "api-endpoint", endpoint)?,
            container_api_endpoint: http_url(&s, "container-api-endpoint", endpoint)?,
            local_zone: local_zone(&s)?,
            alpha_features,
            stack_type: stack_type(&s)?,
            warnings,
        };
        Ok(Config { global })
    }

    /// What reading the file skipped, as upstream's gcfg (`FatalOnly`) skips it: unknown
    /// sections and keys (and the OpenShift keys), one line each naming the section and key,
    /// never a value. Each was logged as a warning when read; the manager may also show them
    /// as an Event.
    pub fn config_warnings(&self) -> &[String] {
        &self.global.warnings
    }
}

/// The fuzz target's entry (`fuzz/fuzz_targets/gcp_config.rs`): parses `text` and renders
/// the result as the manager would log it.
#[cfg(feature = "fuzzing")]
pub fn fuzz_parse(text: &str) {
    match Config::parse(text) {
        Ok(c) => drop(format!("{c:?}")),
        Err(e) => drop(format!("{e} {e:?}")),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn err_of(text: &str) -> ConfigError {
        match Config::parse(text) {
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

    /// Every upstream key, as kube-up / GKE write them.
    const FULL: &str = r#"
; written by the installer
[global]
token-url = https://gkeauth.example.com/v1/projects/123/locations/us-central1/clusters/c:generateToken
token-body = "{\"projectNumber\":123,\"clusterId\":\"c\"}"
project-id = my-project
network-project-id = host-project
network-name = projects/host-project/global/networks/shared   # a URL
subnetwork-name = k8s-subnet
stack-type = IPV4_IPV6
secondary-range-name = pods
node-tags = k8s-node
node-tags = k8s-web
node-instance-prefix = gke-c-default-pool
regional = true
multizone = yes
api-endpoint = https://www.googleapis.com/compute/v1/
container-api-endpoint = https://container.googleapis.com/
local-zone = us-central1-b
alpha-features = ILBSubsets
alpha-features = SkipIGsManagement
"#;

    #[test]
    fn a_full_upstream_config_parses_to_the_expected_struct() {
        let c = Config::parse(FULL).unwrap();
        let expected = Global {
            credentials: Credentials::TokenUrl {
                url: url::Url::parse(
                    "https://gkeauth.example.com/v1/projects/123/locations/us-central1/clusters/c:generateToken",
                )
                .unwrap(),
                body: Some(Secret("{\"projectNumber\":123,\"clusterId\":\"c\"}".into())),
            },
            project_id: Some("my-project".into()),
            network_project_id: Some("host-project".into()),
            network_name: Some("projects/host-project/global/networks/shared".into()),
            subnetwork_name: Some("k8s-subnet".into()),
            secondary_range_name: Some("pods".into()),
            node_tags: vec!["k8s-node".into(), "k8s-web".into()],
            node_instance_prefix: Some("gke-c-default-pool".into()),
            regional: true,
            multizone: true,
            api_endpoint: Some(url::Url::parse("https://www.googleapis.com/compute/v1/").unwrap()),
            container_api_endpoint: Some(
                url::Url::parse("https://container.googleapis.com/").unwrap(),
            ),
            local_zone: Some("us-central1-b".into()),
            alpha_features: vec!["ILBSubsets".into(), "SkipIGsManagement".into()],
            stack_type: StackType::DualStack,
            warnings: Vec::new(),
        };
        assert_eq!(c.global, expected);
    }

    #[test]
    fn no_file_or_an_empty_one_is_the_metadata_server_default() {
        for text in ["", "; nothing\n", "[global]\n", "[Global]\nproject-id =\ntoken-url =\n"] {
            let c = Config::parse(text).unwrap();
            assert_eq!(c, Config::default(), "{text:?}");
        }
        let g = Config::default().global;
        assert_eq!(g.credentials, Credentials::Metadata);
        assert_eq!(g.stack_type, StackType::Ipv4);
        assert!(!g.regional && !g.multizone && g.node_tags.is_empty());
    }

    #[test]
    fn every_documented_key_and_example_is_accepted() {
        for k in CONFIG_KEYS {
            let text = format!("[{}]\n{} = {}\n", k.section, k.key, k.example);
            if let Err(e) = Config::parse(&text) {
                panic!("{} = {}: {e}", k.key, k.example);
            }
            // Quoted, as gcfg allows for any value.
            let quoted = k.example.replace('\\', "\\\\").replace('"', "\\\"");
            let text = format!("[{}]\n{} = \"{quoted}\"\n", k.section, k.key);
            if let Err(e) = Config::parse(&text) {
                panic!("{} = \"{quoted}\": {e}", k.key);
            }
        }
    }

    #[test]
    fn upstreams_read_config_test_file_parses_but_for_its_token_url() {
        // Upstream's `TestReadConfigFile`, with a token URL that is one.
        let text = "[Global]\ntoken-url = https://t.example.com/token\ntoken-body = my-token-body\n\
                    project-id = my-project\nnetwork-project-id = my-network-project\n\
                    network-name = my-network\nsubnetwork-name = my-subnetwork\n\
                    secondary-range-name = my-secondary-range\nnode-tags = my-node-tag1\n\
                    node-instance-prefix = my-prefix\nmultizone = true\nregional = true\n   ";
        let g = Config::parse(text).unwrap().global;
        assert_eq!(g.project_id.as_deref(), Some("my-project"));
        assert_eq!(g.node_tags, vec!["my-node-tag1"]);
        assert!(g.multizone && g.regional);
        match g.credentials {
            Credentials::TokenUrl { url, body } => {
                assert_eq!(url.as_str(), "https://t.example.com/token");
                assert_eq!(body.unwrap().expose(), "my-token-body");
            }
            other => panic!("{other:?}"),
        }
        // Upstream's own file says `token-url = my-token-url`: refused here, naming the key.
        let e = err_of("[Global]\ntoken-url = my-token-url\n");
        assert_eq!(invalid_key(&e), "[global] token-url");
        assert!(e.to_string().contains("`nil`"), "{e}");
    }

    #[test]
    fn token_url_selects_the_credentials() {
        let c = |text: &str| Config::parse(text).unwrap().global.credentials;
        assert_eq!(c("[global]\n"), Credentials::Metadata);
        assert_eq!(c("[global]\ntoken-url = nil\n"), Credentials::ApplicationDefault);
        // token-body without a URL is ignored, as upstream.
        assert_eq!(
            c("[global]\ntoken-url = nil\ntoken-body = b\n"),
            Credentials::ApplicationDefault
        );
        assert_eq!(c("[global]\ntoken-body = b\n"), Credentials::Metadata);
        assert_eq!(
            c("[global]\ntoken-url = http://127.0.0.1:8080/token\n"),
            Credentials::TokenUrl {
                url: url::Url::parse("http://127.0.0.1:8080/token").unwrap(),
                body: None
            }
        );
        for bad in ["NIL", "ftp://x/y", "/token", "http://", "https://user:pw@t.example.com/"] {
            let e = err_of(&format!("[global]\ntoken-url = {bad}\n"));
            assert_eq!(invalid_key(&e), "[global] token-url", "{bad}");
        }
    }

    #[test]
    fn secrets_never_appear_in_errors_or_debug() {
        const SECRET: &str = "Zq7-distinctive-secret-9X";
        let creds =
            format!("[global]\ntoken-url = https://t.example.com/\ntoken-body = {SECRET}\n");
        let c = Config::parse(&creds).unwrap();
        let debug = format!("{c:?}");
        assert!(!debug.contains(SECRET), "{debug}");
        assert!(debug.contains("<redacted>"));
        let errors = [
            err_of(&format!("{creds}stack-type = ipv6\n")),
            err_of(&format!("{creds}regional = {SECRET}\n")),
            err_of(&format!("{creds}token-body\n")),
            err_of(&format!("[global]\ntoken-body = \"{SECRET}\n")),
            err_of(&format!("[global]\ntoken-body = \"{SECRET}\\q\"\n")),
            err_of(&format!("{creds}token_body = {SECRET}\n")),
            err_of(&format!("token-body = {SECRET}\n[global]\n")),
            err_of(&format!("[global] {SECRET}\n")),
            // A URL carrying credentials.
            err_of(&format!("[global]\ntoken-url = https://u:{SECRET}@/x\n")),
            err_of(&format!("[global]\napi-endpoint = ftp://u:{SECRET}@h/\n")),
            err_of(&format!("[global]\nnode-tags = {SECRET}\n")),
            err_of(&format!("[global]\nlocal-zone = {SECRET}\n")),
        ];
        for e in errors {
            let shown = format!("{e} / {e:?}");
            assert!(!shown.contains("Zq7"), "{shown}");
        }
        // A bare word (a pasted secret?) is skipped, as upstream's gcfg skips it, with a
        // warning that names only its line.
        let c = Config::parse(&format!("{creds}{SECRET}\n")).unwrap();
        let shown = format!("{:?} {c:?}", c.config_warnings());
        assert!(!shown.contains("Zq7") && shown.contains("line 4"), "{shown}");
    }

    /// Issue #29 (LOW): plain http needs an explicit opt-in (loopback aside: the emulator and a
    /// node-local proxy), and a token URL's query string never reaches a log, an event or an
    /// error.
    #[test]
    fn plain_http_needs_the_opt_in_and_query_strings_are_never_shown() {
        for key in ["token-url", "api-endpoint", "container-api-endpoint"] {
            let text = format!("[global]\n{key} = http://proxy.example.com:8080/x/\n");
            let e = err_of(&text);
            assert_eq!(invalid_key(&e), format!("[global] {key}"));
            assert!(e.to_string().contains("allow-http-endpoints"), "{e}");
            Config::parse(&format!("{text}allow-http-endpoints = true\n")).unwrap();
            for host in ["127.0.0.1:8080", "localhost", "[::1]:9"] {
                Config::parse(&format!("[global]\n{key} = http://{host}/x/\n")).unwrap();
            }
        }
        // The metadata server needs nothing: it is not configured here.
        assert_eq!(Config::parse("[global]\n").unwrap(), Config::default());

        const SIG: &str = "Zq7sig";
        let c = Config::parse(&format!(
            // Quoted: an unquoted `#` starts a comment in gcfg.
            "[global]\ntoken-url = \"https://t.example.com:8443/v1/token?sig={SIG}&x=1#frag{SIG}\"\n"
        ))
        .unwrap();
        let Credentials::TokenUrl { url, .. } = &c.global.credentials else { panic!("{c:?}") };
        assert_eq!(redacted_url(url), "https://t.example.com:8443/v1/token?<redacted>#<redacted>");
        let debug = format!("{c:?}");
        assert!(!debug.contains(SIG) && debug.contains("?<redacted>"), "{debug}");
        for key in ["api-endpoint", "container-api-endpoint"] {
            let e = err_of(&format!("[global]\n{key} = https://h.example.com/v1/?k={SIG}\n"));
            assert_eq!(invalid_key(&e), format!("[global] {key}"));
            assert!(!e.to_string().contains(SIG), "{e}");
        }
    }

    #[test]
    fn unknown_keys_and_sections_are_skipped_with_a_warning_naming_them_as_upstream() {
        let c = Config::parse(
            "[global]\nproject-id = p\nnode-tag = Zq7s3cret\n[LoadBalancer]\nkey = Zq7s3cret\n\
             [global \"x\"]\nproject-id = other\n",
        )
        .unwrap();
        assert_eq!(c.global.project_id.as_deref(), Some("p"));
        let w = c.config_warnings();
        assert_eq!(w.len(), 3, "{w:?}");
        assert!(w[0].contains("unknown key [global] node-tag (line 3)"), "{w:?}");
        assert!(w[1].contains("unknown section [LoadBalancer] (line 4)"), "{w:?}");
        assert!(w[2].contains("[global \"x\"] (line 6)"), "{w:?}");
        assert!(!w.join(" ").contains("Zq7"), "{w:?}");
        let e = err_of("project-id = p\n");
        assert!(matches!(&e, ConfigError::Syntax(m) if m.contains("line 1")), "{e}");
    }

    #[test]
    fn openshift_keys_are_accepted_and_ignored() {
        let c = Config::parse(
            "[global]\nproject-id = p\nregional = true\nmultizone = true\nnode-tags = c-master\n\
             node-tags = c-worker\nnode-instance-prefix = c\nexternal-instance-groups-prefix = c\n\
             subnetwork-name = c-worker-subnet\nfirewall-rules-management = Unmanaged\n",
        )
        .unwrap();
        assert_eq!(c.global.node_tags, vec!["c-master", "c-worker"]);
        assert_eq!(c.global.subnetwork_name.as_deref(), Some("c-worker-subnet"));
        assert_eq!(c.config_warnings().len(), 2, "{:?}", c.config_warnings());
    }

    #[test]
    fn bad_values_name_the_key() {
        for (line, key) in [
            ("regional = maybe", "regional"),
            ("multizone = 2", "multizone"),
            ("stack-type = ipv6", "stack-type"),
            ("stack-type = DUAL", "stack-type"),
            ("api-endpoint = compute.googleapis.com", "api-endpoint"),
            ("container-api-endpoint = file:///x", "container-api-endpoint"),
            ("node-tags = a,b", "node-tags"),
            ("node-tags = \"a b\"", "node-tags"),
            ("node-tags = K8s-Node", "node-tags"),
            ("node-tags = 1node", "node-tags"),
            ("node-tags = node-", "node-tags"),
            ("local-zone = uscentral1", "local-zone"),
            ("local-zone = us-central1-", "local-zone"),
            ("local-zone = US-CENTRAL1-A", "local-zone"),
            ("project-id", "project-id"),
            ("token-url", "token-url"),
        ] {
            let e = err_of(&format!("[global]\n{line}\n"));
            let key = format!("[global] {key}");
            assert_eq!(invalid_key(&e), key, "{line}: {e}");
            assert!(e.to_string().contains(&key), "{e}");
        }
        let e = err_of("[global]\nnode-tags = ok\nnode-tags = a,b\n");
        assert!(e.to_string().contains("tag 2"), "{e}");
    }

    #[test]
    fn stack_types_are_upstreams_strings() {
        let st = |v: &str| Config::parse(&format!("[global]\nstack-type = {v}\n")).unwrap();
        assert_eq!(st("IPV4").global.stack_type, StackType::Ipv4);
        assert_eq!(st("IPV4_IPV6").global.stack_type, StackType::DualStack);
        assert_eq!(st("IPV6").global.stack_type, StackType::Ipv6);
        assert_eq!(st("").global.stack_type, StackType::Ipv4);
        for s in [StackType::Ipv4, StackType::DualStack, StackType::Ipv6] {
            assert_eq!(StackType::parse(s.as_str()), Some(s));
        }
    }

    #[test]
    fn multi_valued_keys_keep_order_and_a_bare_key_clears() {
        let g = Config::parse(
            "[global]\nnode-tags = old\nnode-tags\nnode-tags = b\nnode-tags =\nnode-tags = a\n\
             alpha-features = X\nalpha-features = ILBSubsets\n",
        )
        .unwrap()
        .global;
        assert_eq!(g.node_tags, vec!["b", "a"]);
        assert_eq!(g.alpha_features, vec!["X", "ILBSubsets"]);
        // A repeated single-valued key: the last wins; a bare boolean is true.
        let g =
            Config::parse("[global]\nproject-id = a\nproject-id = b\nregional\n").unwrap().global;
        assert_eq!(g.project_id.as_deref(), Some("b"));
        assert!(g.regional);
    }

    #[test]
    fn sections_and_keys_are_case_insensitive_and_blocks_merge() {
        let g = Config::parse(
            "[GLOBAL]\nProject-ID = p\n[Global]\nNODE-TAGS = t1\n[global]\nnode-tags = t2\n\
             MultiZone = TRUE\n",
        )
        .unwrap()
        .global;
        assert_eq!(g.project_id.as_deref(), Some("p"));
        assert_eq!(g.node_tags, vec!["t1", "t2"]);
        assert!(g.multizone);
    }

    #[test]
    fn quoting_comments_and_line_ends() {
        let g = Config::parse(
            "\u{feff}[global]\r\nproject-id = \"my-project\" ; comment\r\n\
             network-name = net # comment\r\nnode-instance-prefix = \"a;b\"\r\n",
        )
        .unwrap()
        .global;
        assert_eq!(g.project_id.as_deref(), Some("my-project"));
        assert_eq!(g.network_name.as_deref(), Some("net"));
        assert_eq!(g.node_instance_prefix.as_deref(), Some("a;b"));
        let e = err_of("[global]\n\n[global\n");
        assert!(matches!(&e, ConfigError::Syntax(m) if m.contains("line 3")), "{e}");
    }
}
