//! `acr-credential-provider`: the kubelet image credential plugin for Azure Container
//! Registry (spec §2.7), as upstream's `pkg/credentialprovider`:
//!
//! `acr-credential-provider <azure.json> [--registry-mirror src:dst[,src:dst]]` reads one
//! `CredentialProviderRequest` on stdin ([`ccm_core::credential`]) and answers:
//!
//! - an image whose registry is not `<name>.azurecr.io|cn|de|us` (after the mirror
//!   mapping): no credentials, `cacheDuration: 0`;
//! - with `useManagedIdentityExtension`: an AAD token for
//!   `https://containerregistry.azure.net/.default` — from the kubelet's service-account
//!   token (workload identity: client and tenant from the ServiceAccount annotations
//!   `kubernetes.azure.com/acr-client-id` / `acr-tenant-id`) when the kubelet sends one and
//!   the image is not mirrored, else from the VM's managed identity (IMDS) — then the
//!   registry's `GET /v2/` challenge (`WWW-Authenticate: Bearer realm=…,service=…`) and a
//!   `POST <realm host>/oauth2/exchange` (`grant_type=access_token_refresh_token`) for an ACR
//!   refresh token, returned as user `00000000-0000-0000-0000-000000000000` for the registry
//!   (and the mirror's source registry);
//! - otherwise the service principal (`aadClientId`/`aadClientSecret`) for every ACR glob;
//! - ACR answers carry upstream's placeholder entry `*.azurecr.*` (empty user and password),
//!   `cacheKeyType: Registry` and `cacheDuration: 1h`.
//!
//! Every request has a deadline; failures exit 1 with one line naming what failed, never a
//! token or a secret. The registry is reached over HTTPS trusting `SSL_CERT_FILE`'s CAs.
//!
//! Tests: the environment variable [`REGISTRY_ENDPOINT_ENV`] (or
//! [`Options::registry_endpoint`]) sends every registry call (challenge and exchange) to one
//! address, with the registry's name in the `Host` header — the emulator serves every host
//! on one port, as IMDS is redirected by `CCM_AZURE_IMDS_ENDPOINT`. Never set in production.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use azure_core::credentials::TokenCredential;
use ccm_core::credential::{
    self, AuthConfig, CacheKeyType, CredentialProviderRequest, CredentialProviderResponse,
};

use crate::client::auth::ImdsCredential;
use crate::client::{
    ALLOW_HTTP_ENV, ClientOptions, CloudEndpoints, DEFAULT_IMDS_ENDPOINT, IMDS_ENDPOINT_ENV,
    allow_http, check_scheme, http_client, read_capped,
};
use crate::config::Config;

/// The registry globs the plugin answers for (its `matchImages`).
pub const ACR_REGISTRY_PATTERNS: [&str; 4] =
    ["*.azurecr.io", "*.azurecr.cn", "*.azurecr.de", "*.azurecr.us"];
/// Upstream's placeholder entry in every ACR answer.
pub const ACR_PLACEHOLDER_PATTERN: &str = "*.azurecr.*";
/// The user name ACR expects with a refresh token.
pub const ACR_TOKEN_USERNAME: &str = "00000000-0000-0000-0000-000000000000";
/// The AAD scope of ACR tokens.
pub const ACR_SCOPE: &str = "https://containerregistry.azure.net/.default";
/// How long the kubelet caches an ACR answer (upstream: 60 minutes).
pub const CACHE_TTL: Duration = Duration::from_secs(60 * 60);
/// ServiceAccount annotation: the workload identity's client id.
pub const CLIENT_ID_ANNOTATION: &str = "kubernetes.azure.com/acr-client-id";
/// ServiceAccount annotation: the workload identity's tenant.
pub const TENANT_ID_ANNOTATION: &str = "kubernetes.azure.com/acr-tenant-id";
/// Test-only: the address every registry call goes to (see the module doc).
pub const REGISTRY_ENDPOINT_ENV: &str = "CCM_AZURE_ACR_ENDPOINT";
/// Each HTTP request's deadline.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// The largest reply read from a registry or AAD.
const MAX_REPLY: usize = 1 << 20;

const USAGE: &str = "usage: acr-credential-provider <azure.json> [--registry-mirror src:dst[,src:dst]]\n\
Answers the kubelet's CredentialProviderRequest on stdin for Azure Container Registry images.";

/// Why the plugin could not answer. Messages name what failed, never a token or a secret.
#[derive(Debug, thiserror::Error)]
pub enum AcrError {
    /// Bad command line.
    #[error("{0}\n{USAGE}")]
    Usage(String),
    /// The config file could not be read or parsed.
    #[error("{0}")]
    Config(String),
    /// No AAD token.
    #[error("getting an AAD token for ACR: {0}")]
    Token(String),
    /// The registry's challenge failed or was not understood.
    #[error("registry {registry}: challenge: {message}")]
    Challenge {
        /// The registry.
        registry: String,
        /// What went wrong.
        message: String,
    },
    /// The token exchange failed.
    #[error("registry {registry}: token exchange: {message}")]
    Exchange {
        /// The registry.
        registry: String,
        /// What went wrong.
        message: String,
    },
}

/// The plugin's settings.
#[derive(Debug, Clone)]
pub struct Options {
    /// The `azure.json` path.
    pub config_path: String,
    /// `--registry-mirror`: source registry → target registry, in the order given.
    pub registry_mirror: Vec<(String, String)>,
    /// IMDS, AAD authority and CA settings (as the CCM's: `CCM_AZURE_IMDS_ENDPOINT`,
    /// `AZURE_AUTHORITY_HOST`, `SSL_CERT_FILE`).
    pub client: ClientOptions,
    /// Test-only: every registry call goes to this base URL with the registry's name in the
    /// `Host` header ([`REGISTRY_ENDPOINT_ENV`]).
    pub registry_endpoint: Option<String>,
    /// Each request's deadline.
    pub request_timeout: Duration,
}

impl Options {
    /// Reads the command line (after the program name) and the environment. `Ok(None)`:
    /// `--help`.
    pub fn from_args(
        args: &[String],
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<Options>, AcrError> {
        let mut config_path = None;
        let mut mirror = None;
        let mut it = args.iter();
        while let Some(arg) = it.next() {
            let (flag, inline) = match arg.split_once('=') {
                Some((f, v)) if f.starts_with('-') => (f, Some(v.to_string())),
                _ => (arg.as_str(), None),
            };
            let mut value = |name: &str| -> Result<String, AcrError> {
                match inline.clone() {
                    Some(v) => Ok(v),
                    None => it
                        .next()
                        .cloned()
                        .ok_or_else(|| AcrError::Usage(format!("flag {name} needs a value"))),
                }
            };
            match flag {
                "-h" | "--help" => return Ok(None),
                "-r" | "--registry-mirror" => mirror = Some(value(flag)?),
                // Upstream's logging flags: accepted, logging goes to stderr anyway.
                "-v" | "--v" | "--vmodule" | "--log-flush-frequency" => {
                    value(flag)?;
                }
                "--ib-sni-name"
                | "--ib-default-client-id"
                | "--ib-default-tenant-id"
                | "--ib-apiserver-ip" => {
                    return Err(AcrError::Usage(format!(
                        "{flag}: identity bindings are not supported"
                    )));
                }
                f if f.starts_with('-') => {
                    return Err(AcrError::Usage(format!("unknown flag {f}")));
                }
                path => {
                    if config_path.replace(path.to_string()).is_some() {
                        return Err(AcrError::Usage("exactly one config file expected".into()));
                    }
                }
            }
        }
        let config_path =
            config_path.ok_or_else(|| AcrError::Usage("the config file is required".into()))?;
        let var = |k: &str| env(k).filter(|v| !v.trim().is_empty());
        let ca_pem = match var("SSL_CERT_FILE") {
            Some(path) => Some(
                std::fs::read(&path)
                    .map_err(|e| AcrError::Config(format!("reading SSL_CERT_FILE {path}: {e}")))?,
            ),
            None => None,
        };
        Ok(Some(Options {
            config_path,
            registry_mirror: parse_registry_mirror(mirror.as_deref().unwrap_or_default())?,
            client: ClientOptions {
                authority_host: var("AZURE_AUTHORITY_HOST"),
                imds_endpoint: var(IMDS_ENDPOINT_ENV),
                ca_pem,
                allow_http: allow_http(var(ALLOW_HTTP_ENV).as_deref()),
                ..ClientOptions::default()
            },
            registry_endpoint: var(REGISTRY_ENDPOINT_ENV),
            request_timeout: REQUEST_TIMEOUT,
        }))
    }
}

/// `src:dst,src2:dst2` (spaces ignored) → pairs. A mapping without exactly one `:` is an
/// error (upstream skips it with a log line).
pub fn parse_registry_mirror(text: &str) -> Result<Vec<(String, String)>, AcrError> {
    let text: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    if text.is_empty() {
        return Ok(Vec::new());
    }
    text.split(',')
        .map(|m| match m.split(':').collect::<Vec<_>>().as_slice() {
            [src, dst] if !src.is_empty() && !dst.is_empty() => {
                Ok((src.to_string(), dst.to_string()))
            }
            _ => Err(AcrError::Usage(format!("--registry-mirror: {m:?} is not source:target"))),
        })
        .collect()
}

/// The ACR login server an image is pulled from (`<alphanumerics>.azurecr.<io|cn|de|us>`
/// followed by `/` or nothing), as upstream's pattern.
pub fn acr_login_server(image: &str) -> Option<&str> {
    let dot = image.find('.')?;
    let name = &image[..dot];
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric()) {
        return None;
    }
    ["azurecr.io", "azurecr.cn", "azurecr.de", "azurecr.us"].iter().find_map(|suffix| {
        let end = dot + 1 + suffix.len();
        let host = image.get(..end)?;
        let rest = &image[end..];
        (image[dot + 1..].starts_with(suffix) && (rest.is_empty() || rest.starts_with('/')))
            .then_some(host)
    })
}

/// The `WWW-Authenticate: Bearer realm=…,service=…` parameters.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Challenge {
    /// Where tokens are issued (its scheme and host take the exchange).
    pub realm: String,
    /// The registry's service name.
    pub service: String,
}

/// Parses a `WWW-Authenticate` value (`Bearer k="v",k2=v2`).
pub fn parse_challenge(header: &str) -> Result<Challenge, String> {
    let (scheme, params) = header.trim().split_once(' ').ok_or("not `Bearer <params>`")?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return Err(format!("scheme {scheme:?}, expected Bearer"));
    }
    let mut map = BTreeMap::new();
    let mut rest = params.trim();
    while !rest.is_empty() {
        let (key, after) = rest.split_once('=').ok_or("malformed parameters")?;
        let after = after.trim_start();
        let (value, tail) = if let Some(quoted) = after.strip_prefix('"') {
            let end = quoted.find('"').ok_or("unterminated quoted value")?;
            (&quoted[..end], quoted[end + 1..].trim_start())
        } else {
            match after.find(',') {
                Some(i) => (after[..i].trim(), &after[i..]),
                None => (after.trim(), ""),
            }
        };
        map.insert(key.trim().to_ascii_lowercase(), value.to_string());
        rest = match tail.strip_prefix(',') {
            Some(t) => t.trim_start(),
            None if tail.is_empty() => "",
            None => return Err("malformed parameters".into()),
        };
    }
    let get = |k: &str| map.get(k).filter(|v| !v.is_empty()).cloned();
    Ok(Challenge {
        realm: get("realm").ok_or("no realm")?,
        service: get("service").ok_or("no service")?,
    })
}

/// The plugin.
pub struct AcrProvider {
    config: Config,
    options: Options,
    http: reqwest::Client,
    endpoints: CloudEndpoints,
}

impl std::fmt::Debug for AcrProvider {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AcrProvider").field("options", &self.options).finish_non_exhaustive()
    }
}

impl AcrProvider {
    /// The plugin on a parsed config.
    pub fn new(config: Config, options: Options) -> Result<AcrProvider, AcrError> {
        let http = http_client(options.client.ca_pem.as_deref())
            .map_err(|e| AcrError::Config(e.to_string()))?;
        let endpoints = CloudEndpoints::resolve(&config, &options.client)
            .map_err(|e| AcrError::Config(e.to_string()))?;
        if let Some(base) = &options.registry_endpoint {
            check_scheme(base, options.client.allow_http)
                .map_err(|m| AcrError::Config(format!("{REGISTRY_ENDPOINT_ENV}: {m}")))?;
        }
        Ok(AcrProvider { config, options, http, endpoints })
    }

    /// Reads and parses `options.config_path` (with upstream's `AZURE_*` overrides from `env`).
    pub fn from_options(
        options: Options,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<AcrProvider, AcrError> {
        let bytes = std::fs::read(&options.config_path).map_err(|e| {
            AcrError::Config(format!("reading config file {}: {e}", options.config_path))
        })?;
        let text = std::str::from_utf8(&bytes).map_err(|_| {
            AcrError::Config(format!("config file {} is not UTF-8 text", options.config_path))
        })?;
        let mut config = Config::parse(text).map_err(|e| AcrError::Config(e.to_string()))?;
        config.apply_env(env);
        AcrProvider::new(config, options)
    }

    /// The image after the mirror mapping, and the mirror's source registry when one applied.
    fn mirror<'a>(&'a self, image: &'a str) -> (String, Option<&'a str>) {
        for (src, dst) in &self.options.registry_mirror {
            if image.starts_with(src.as_str()) {
                return (image.replacen(src.as_str(), dst, 1), Some(src.as_str()));
            }
        }
        (image.to_string(), None)
    }

    /// Answers one request.
    pub async fn provide(
        &self,
        req: &CredentialProviderRequest,
    ) -> Result<CredentialProviderResponse, AcrError> {
        let (target_image, source) = self.mirror(&req.image);
        let Some(login_server) = acr_login_server(&target_image) else {
            tracing::debug!(image = %req.image, "not an ACR image: no credentials");
            return Ok(req.respond(CacheKeyType::Registry, Some(Duration::ZERO), BTreeMap::new()));
        };
        let mut auth = BTreeMap::from([(
            ACR_PLACEHOLDER_PATTERN.to_string(),
            AuthConfig { username: String::new(), password: String::new() },
        )]);
        if self.config.use_managed_identity_extension {
            let aad_token = self.aad_token(req, source.is_some()).await?;
            let refresh = self.exchange(login_server, &aad_token).await?;
            let entry = AuthConfig { username: ACR_TOKEN_USERNAME.into(), password: refresh };
            if let Some(src) = source {
                auth.insert(src.to_string(), entry.clone());
            }
            auth.insert(login_server.to_string(), entry);
        } else {
            let entry = AuthConfig {
                username: self.config.aad_client_id.clone().unwrap_or_default(),
                password: self.config.aad_client_secret.clone().unwrap_or_default(),
            };
            for pattern in ACR_REGISTRY_PATTERNS {
                auth.insert(pattern.to_string(), entry.clone());
            }
        }
        Ok(req.respond(CacheKeyType::Registry, Some(CACHE_TTL), auth))
    }

    /// An AAD token for ACR: the kubelet's service-account token exchanged at AAD (unless
    /// the image is mirrored, as upstream), else the managed identity.
    async fn aad_token(
        &self,
        req: &CredentialProviderRequest,
        mirrored: bool,
    ) -> Result<String, AcrError> {
        if let Some(sa_token) = req.service_account_token.as_deref().filter(|t| !t.is_empty())
            && !mirrored
        {
            let annotation = |key: &str| {
                req.service_account_annotations
                    .as_ref()
                    .and_then(|a| a.get(key))
                    .filter(|v| !v.trim().is_empty())
                    .cloned()
                    .ok_or_else(|| {
                        AcrError::Token(format!(
                            "the ServiceAccount annotation {key} is missing or empty"
                        ))
                    })
            };
            let client_id = annotation(CLIENT_ID_ANNOTATION)?;
            let tenant = annotation(TENANT_ID_ANNOTATION)?;
            return self.assertion_token(&tenant, &client_id, sa_token).await;
        }
        let imds = self.options.client.imds_endpoint.as_deref().unwrap_or(DEFAULT_IMDS_ENDPOINT);
        let credential = ImdsCredential::new(
            self.http.clone(),
            imds,
            self.config.user_assigned_identity_id.clone().filter(|s| !s.trim().is_empty()),
        );
        let token = tokio::time::timeout(
            self.options.request_timeout,
            credential.get_token(&[ACR_SCOPE], None),
        )
        .await
        .map_err(|_| AcrError::Token("managed identity: no answer in time".into()))?
        .map_err(|e| AcrError::Token(one_line(&e.to_string())))?;
        Ok(token.token.secret().to_string())
    }

    /// Client credentials with the service-account token as the client assertion.
    async fn assertion_token(
        &self,
        tenant: &str,
        client_id: &str,
        assertion: &str,
    ) -> Result<String, AcrError> {
        let url = format!(
            "{}/{}/oauth2/v2.0/token",
            self.endpoints.authority_host.trim_end_matches('/'),
            tenant
        );
        let form = [
            ("client_id", client_id),
            ("scope", ACR_SCOPE),
            ("grant_type", "client_credentials"),
            ("client_assertion_type", "urn:ietf:params:oauth:client-assertion-type:jwt-bearer"),
            ("client_assertion", assertion),
        ];
        let fail = |m: String| AcrError::Token(format!("workload identity: {m}"));
        let reply = tokio::time::timeout(
            self.options.request_timeout,
            self.http.post(&url).header("Content-Type", FORM).body(encode_form(&form)).send(),
        )
        .await
        .map_err(|_| fail("AAD did not answer in time".into()))?
        .map_err(|e| fail(format!("AAD unreachable: {}", e.without_url())))?;
        let status = reply.status();
        let body = read_limited(reply).await.map_err(fail)?;
        #[derive(serde::Deserialize)]
        struct Reply {
            #[serde(default)]
            access_token: String,
            #[serde(default)]
            error: String,
        }
        let parsed: Option<Reply> = serde_json::from_slice(&body).ok();
        if !status.is_success() {
            let code = parsed.map(|r| r.error).filter(|e| !e.is_empty()).unwrap_or_default();
            return Err(fail(format!("AAD answered HTTP {} {code}", status.as_u16())));
        }
        parsed
            .map(|r| r.access_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| fail("AAD's reply has no access_token".into()))
    }

    /// The URL for `path` on `host` (or the test endpoint), and the `Host` header to send.
    fn registry_url(&self, scheme: &str, host: &str, path: &str) -> (String, Option<String>) {
        match &self.options.registry_endpoint {
            Some(base) => (format!("{}{path}", base.trim_end_matches('/')), Some(host.to_string())),
            None => (format!("{scheme}://{host}{path}"), None),
        }
    }

    /// The challenge, then the refresh-token exchange.
    async fn exchange(&self, registry: &str, aad_token: &str) -> Result<String, AcrError> {
        let challenge_fail =
            |message: String| AcrError::Challenge { registry: registry.to_string(), message };
        let (url, host) = self.registry_url("https", registry, "/v2/");
        let mut request =
            self.http.get(&url).header("User-Agent", "kubernetes-credentialprovider-acr");
        if let Some(h) = &host {
            request = request.header("Host", h);
        }
        let reply = tokio::time::timeout(self.options.request_timeout, request.send())
            .await
            .map_err(|_| challenge_fail("no answer in time".into()))?
            .map_err(|e| challenge_fail(format!("unreachable: {}", e.without_url())))?;
        if reply.status().as_u16() != 401 {
            return Err(challenge_fail(format!(
                "expected HTTP 401 with an AAD challenge, got {}",
                reply.status().as_u16()
            )));
        }
        let headers: Vec<&reqwest::header::HeaderValue> =
            reply.headers().get_all(reqwest::header::WWW_AUTHENTICATE).iter().collect();
        let [header] = headers.as_slice() else {
            return Err(challenge_fail(format!(
                "expected one WWW-Authenticate header, got {}",
                headers.len()
            )));
        };
        let challenge = header
            .to_str()
            .map_err(|_| "not text".to_string())
            .and_then(parse_challenge)
            .map_err(|m| challenge_fail(format!("WWW-Authenticate: {m}")))?;
        let realm = url::Url::parse(&challenge.realm)
            .map_err(|_| challenge_fail("WWW-Authenticate: the realm is not a URL".into()))?;
        // The AAD token goes to the realm: never in clear text.
        check_scheme(realm.as_str(), self.options.client.allow_http)
            .map_err(|m| challenge_fail(format!("WWW-Authenticate: the realm: {m}")))?;
        let realm_host = match (realm.host_str(), realm.port()) {
            (Some(h), Some(p)) => format!("{h}:{p}"),
            (Some(h), None) => h.to_string(),
            (None, _) => {
                return Err(challenge_fail("WWW-Authenticate: the realm has no host".into()));
            }
        };

        let exchange_fail =
            |message: String| AcrError::Exchange { registry: registry.to_string(), message };
        let (url, host) = self.registry_url(realm.scheme(), &realm_host, "/oauth2/exchange");
        let tenant = self.config.tenant_id.clone().unwrap_or_default();
        let form = [
            ("grant_type", "access_token_refresh_token"),
            ("service", challenge.service.as_str()),
            ("tenant", tenant.as_str()),
            ("access_token", aad_token),
            ("refresh_token", aad_token),
        ];
        let mut request = self
            .http
            .post(&url)
            .header("User-Agent", "kubernetes-credentialprovider-acr")
            .header("Content-Type", FORM)
            .body(encode_form(&form));
        if let Some(h) = &host {
            request = request.header("Host", h);
        }
        let reply = tokio::time::timeout(self.options.request_timeout, request.send())
            .await
            .map_err(|_| exchange_fail("no answer in time".into()))?
            .map_err(|e| exchange_fail(format!("unreachable: {}", e.without_url())))?;
        let status = reply.status();
        if !status.is_success() {
            return Err(exchange_fail(format!("HTTP {}", status.as_u16())));
        }
        let body = read_limited(reply).await.map_err(exchange_fail)?;
        #[derive(serde::Deserialize)]
        struct Reply {
            #[serde(default)]
            refresh_token: String,
        }
        serde_json::from_slice::<Reply>(&body)
            .ok()
            .map(|r| r.refresh_token)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| exchange_fail("the reply has no refresh_token".into()))
    }
}

async fn read_limited(reply: reqwest::Response) -> Result<Vec<u8>, String> {
    read_capped(reply, MAX_REPLY).await
}

const FORM: &str = "application/x-www-form-urlencoded";

fn encode_form(pairs: &[(&str, &str)]) -> String {
    url::form_urlencoded::Serializer::new(String::new()).extend_pairs(pairs).finish()
}

fn one_line(s: &str) -> String {
    s.split_whitespace().collect::<Vec<_>>().join(" ")
}

/// The whole command: `args` after the program name, `env` for the environment. Exit 0 with
/// the response on `stdout`, or 1 with one line on `stderr`.
pub fn run(
    args: &[String],
    env: &dyn Fn(&str) -> Option<String>,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
) -> ExitCode {
    let fail = |stderr: &mut dyn Write, e: &dyn std::fmt::Display| {
        let _ = writeln!(stderr, "acr-credential-provider: {e}");
        ExitCode::FAILURE
    };
    let options = match Options::from_args(args, env) {
        Ok(Some(o)) => o,
        Ok(None) => {
            let _ = writeln!(stdout, "{USAGE}");
            return ExitCode::SUCCESS;
        }
        Err(e) => return fail(stderr, &e),
    };
    let provider = match AcrProvider::from_options(options, env) {
        Ok(p) => Arc::new(p),
        Err(e) => return fail(stderr, &e),
    };
    credential::run_async_with("acr-credential-provider", stdin, stdout, stderr, |req| async move {
        provider.provide(&req).await.map_err(|e| one_line(&e.to_string()).into())
    })
}

/// The binary's `main`.
pub fn main() -> ExitCode {
    credential::plugin_main(run)
}

/// The fuzz target's entry for what the plugin parses besides the request (the
/// `WWW-Authenticate` header, image names, the command line).
#[cfg(feature = "fuzzing")]
pub fn fuzz_replies(data: &[u8]) {
    if let Ok(text) = std::str::from_utf8(data) {
        let _ = parse_challenge(text);
        let _ = acr_login_server(text);
        let _ = parse_registry_mirror(text);
        let args: Vec<String> = text.split('\n').map(str::to_string).collect();
        let _ = Options::from_args(&args, &|_| None);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn args(s: &str) -> Vec<String> {
        s.split_whitespace().map(str::to_string).collect()
    }

    #[test]
    fn login_servers_as_upstreams_pattern() {
        assert_eq!(acr_login_server("myreg.azurecr.io/app:v1"), Some("myreg.azurecr.io"));
        assert_eq!(acr_login_server("myreg.azurecr.cn"), Some("myreg.azurecr.cn"));
        assert_eq!(acr_login_server("Reg1.azurecr.us/a/b"), Some("Reg1.azurecr.us"));
        assert_eq!(acr_login_server("myreg.azurecr.de/x"), Some("myreg.azurecr.de"));
        for not_acr in [
            "docker.io/library/nginx",
            "my-reg.azurecr.io/app",
            "myreg.azurecr.io:443/app",
            "myreg.azurecr.iox/app",
            "a.b.azurecr.io/app",
            "myreg.azurecr.com/app",
            ".azurecr.io/app",
            "nginx",
        ] {
            assert_eq!(acr_login_server(not_acr), None, "{not_acr}");
        }
    }

    #[test]
    fn challenges_parse_quoted_and_bare() {
        let c = parse_challenge(
            r#"Bearer realm="https://r.azurecr.io/oauth2/token",service="r.azurecr.io""#,
        )
        .unwrap();
        assert_eq!(c.realm, "https://r.azurecr.io/oauth2/token");
        assert_eq!(c.service, "r.azurecr.io");
        let c =
            parse_challenge("bearer service=r.azurecr.io, realm=https://r/oauth2/token").unwrap();
        assert_eq!(
            (c.realm.as_str(), c.service.as_str()),
            ("https://r/oauth2/token", "r.azurecr.io")
        );
        assert!(parse_challenge(r#"Basic realm="x""#).unwrap_err().contains("Bearer"));
        assert!(parse_challenge(r#"Bearer realm="x""#).unwrap_err().contains("no service"));
        assert!(parse_challenge(r#"Bearer realm="x"#).is_err());
        assert!(parse_challenge("Bearer").is_err());
    }

    #[test]
    fn the_command_line() {
        let o =
            Options::from_args(&args("/etc/kubernetes/azure.json"), &|_| None).unwrap().unwrap();
        assert_eq!(o.config_path, "/etc/kubernetes/azure.json");
        assert!(o.registry_mirror.is_empty());
        let o = Options::from_args(
            &args("--registry-mirror mcr.microsoft.com:myreg.azurecr.io,docker.io:b.azurecr.io azure.json --v=2"),
            &|k| (k == REGISTRY_ENDPOINT_ENV).then(|| "https://127.0.0.1:1".to_string()),
        )
        .unwrap()
        .unwrap();
        assert_eq!(o.registry_mirror[0], ("mcr.microsoft.com".into(), "myreg.azurecr.io".into()));
        assert_eq!(o.registry_mirror.len(), 2);
        assert_eq!(o.registry_endpoint.as_deref(), Some("https://127.0.0.1:1"));
        assert!(Options::from_args(&args("--help"), &|_| None).unwrap().is_none());
        for (bad, want) in [
            ("", "the config file is required"),
            ("a.json b.json", "exactly one config file"),
            ("a.json --registry-mirror", "needs a value"),
            ("a.json --registry-mirror=nocolon", "is not source:target"),
            ("a.json --bogus", "unknown flag --bogus"),
            ("a.json --ib-sni-name=x", "identity bindings are not supported"),
        ] {
            let e = Options::from_args(&args(bad), &|_| None).unwrap_err().to_string();
            assert!(e.contains(want), "{bad}: {e}");
        }
    }

    #[test]
    fn mirrors_map_the_image_first() {
        let config = Config { tenant_id: Some("t".into()), ..Config::default() };
        let options = Options {
            config_path: String::new(),
            registry_mirror: parse_registry_mirror("mcr.microsoft.com:myreg.azurecr.io").unwrap(),
            client: ClientOptions::default(),
            registry_endpoint: None,
            request_timeout: REQUEST_TIMEOUT,
        };
        let p = AcrProvider::new(config, options).unwrap();
        let (image, src) = p.mirror("mcr.microsoft.com/oss/nginx:1");
        assert_eq!(image, "myreg.azurecr.io/oss/nginx:1");
        assert_eq!(src, Some("mcr.microsoft.com"));
        assert_eq!(p.mirror("docker.io/x").1, None);
    }
}
