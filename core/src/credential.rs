//! The kubelet image credential-provider exec protocol (KEP-2133, spec §10), as a small library
//! for the cloud credential binaries (`ecr-credential-provider`, `acr-credential-provider`, ...).
//!
//! The kubelet writes a `CredentialProviderRequest` to the plugin's stdin and reads a
//! `CredentialProviderResponse` from its stdout, both in the configured
//! `credentialprovider.kubelet.k8s.io` version. A plugin's `main` is:
//!
//! ```no_run
//! use ccm_core::credential::{self, AuthConfig, CacheKeyType};
//! fn main() -> std::process::ExitCode {
//!     credential::run(|req| {
//!         let registry = credential::registry_of(&req.image).to_string();
//!         let auth = [(registry, AuthConfig { username: "AWS".into(), password: "secret".into() })];
//!         Ok(req.respond(CacheKeyType::Registry, None, auth.into_iter().collect()))
//!     })
//! }
//! ```
//!
//! Malformed stdin exits 1 with a message on stderr and nothing on stdout. Messages never echo
//! the input (it may hold a ServiceAccount token), and `Debug` redacts tokens and passwords.
//!
//! The kubelet-side semantics (cache key, cache duration, `matchImages` globs) are here too, so
//! plugins and their tests agree with the kubelet.

use std::collections::BTreeMap;
use std::fmt;
use std::io::{Read, Write};
use std::process::ExitCode;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::cloud::BoxError;
use crate::manager::duration;

/// The API group.
pub const GROUP: &str = "credentialprovider.kubelet.k8s.io";
/// `credentialprovider.kubelet.k8s.io/v1`.
pub const API_VERSION_V1: &str = "credentialprovider.kubelet.k8s.io/v1";
/// Versions a plugin answers (the response uses the request's version).
pub const SUPPORTED_API_VERSIONS: &[&str] = &[
    "credentialprovider.kubelet.k8s.io/v1",
    "credentialprovider.kubelet.k8s.io/v1beta1",
    "credentialprovider.kubelet.k8s.io/v1alpha1",
];
/// Request kind.
pub const REQUEST_KIND: &str = "CredentialProviderRequest";
/// Response kind.
pub const RESPONSE_KIND: &str = "CredentialProviderResponse";

/// Malformed input or output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CredentialError {
    /// Nothing on stdin.
    #[error("no CredentialProviderRequest on stdin (empty input)")]
    Empty,
    /// stdin could not be read.
    #[error("error reading CredentialProviderRequest from stdin: {0}")]
    Read(String),
    /// Not a valid JSON request (position and category only: the input is never echoed).
    #[error("error decoding CredentialProviderRequest from stdin: {0}")]
    Decode(String),
    /// `apiVersion` missing or not supported.
    #[error("unsupported apiVersion {0:?} in CredentialProviderRequest; supported: {supported}", supported = SUPPORTED_API_VERSIONS.join(", "))]
    ApiVersion(String),
    /// `kind` is not `CredentialProviderRequest`.
    #[error("unsupported kind {0:?}; expected \"CredentialProviderRequest\"")]
    Kind(String),
    /// `image` is empty.
    #[error("image is required in CredentialProviderRequest")]
    MissingImage,
    /// The response could not be written.
    #[error("error writing CredentialProviderResponse to stdout: {0}")]
    Write(String),
}

/// The request the kubelet sends.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CredentialProviderRequest {
    /// `CredentialProviderRequest`.
    #[serde(default)]
    pub kind: String,
    /// E.g. `credentialprovider.kubelet.k8s.io/v1`.
    #[serde(default)]
    pub api_version: String,
    /// The image being pulled, as in the Pod spec.
    #[serde(default)]
    pub image: String,
    /// A ServiceAccount token (only with `tokenAttributes` in the kubelet config).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_token: Option<String>,
    /// ServiceAccount annotations (only with `tokenAttributes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_account_annotations: Option<BTreeMap<String, String>>,
}

impl fmt::Debug for CredentialProviderRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("CredentialProviderRequest")
            .field("api_version", &self.api_version)
            .field("image", &self.image)
            .field(
                "service_account_token",
                &self.service_account_token.as_ref().map(|_| "<redacted>"),
            )
            .field("service_account_annotations", &self.service_account_annotations)
            .finish()
    }
}

/// How the kubelet caches a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CacheKeyType {
    /// Per image string.
    Image,
    /// Per registry host (and port).
    Registry,
    /// For every image this plugin matches.
    Global,
}

impl CacheKeyType {
    /// The kubelet's cache key for `image` (`Image`: the image; `Registry`: the part before
    /// the first `/`; `Global`: `global`).
    pub fn key_for(self, image: &str) -> String {
        match self {
            CacheKeyType::Image => image.to_string(),
            CacheKeyType::Registry => registry_of(image).to_string(),
            CacheKeyType::Global => "global".to_string(),
        }
    }
}

/// Credentials for one registry pattern.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuthConfig {
    /// Username (may be empty).
    #[serde(default)]
    pub username: String,
    /// Password (may be empty).
    #[serde(default)]
    pub password: String,
}

impl fmt::Debug for AuthConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("AuthConfig")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

mod go_duration {
    use super::*;
    pub fn serialize<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_str(&duration::format(*d)),
            None => s.serialize_none(),
        }
    }
    pub fn deserialize<'de, D: serde::Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Duration>, D::Error> {
        let s: Option<String> = Option::deserialize(d)?;
        s.map(|s| duration::parse(&s).map_err(serde::de::Error::custom)).transpose()
    }
}

/// The response a plugin writes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct CredentialProviderResponse {
    /// `CredentialProviderResponse`.
    pub kind: String,
    /// The request's apiVersion.
    pub api_version: String,
    /// How the kubelet keys its cache.
    pub cache_key_type: CacheKeyType,
    /// How long to cache (`None`: the kubelet's `defaultCacheDuration`; zero: do not cache).
    #[serde(default, with = "go_duration", skip_serializing_if = "Option::is_none")]
    pub cache_duration: Option<Duration>,
    /// Credentials by registry pattern (same glob rules as `matchImages`).
    #[serde(default)]
    pub auth: BTreeMap<String, AuthConfig>,
}

impl CredentialProviderRequest {
    /// A response in this request's apiVersion.
    pub fn respond(
        &self,
        cache_key_type: CacheKeyType,
        cache_duration: Option<Duration>,
        auth: BTreeMap<String, AuthConfig>,
    ) -> CredentialProviderResponse {
        CredentialProviderResponse {
            kind: RESPONSE_KIND.into(),
            api_version: self.api_version.clone(),
            cache_key_type,
            cache_duration,
            auth,
        }
    }
}

/// Decodes and validates a request.
pub fn decode_request(input: &[u8]) -> Result<CredentialProviderRequest, CredentialError> {
    if input.iter().all(u8::is_ascii_whitespace) {
        return Err(CredentialError::Empty);
    }
    let req: CredentialProviderRequest = serde_json::from_slice(input).map_err(|e| {
        use serde_json::error::Category;
        let what = match e.classify() {
            Category::Syntax => "invalid JSON".to_string(),
            Category::Eof => "unexpected end of input".to_string(),
            Category::Io => "read error".to_string(),
            // Data errors name fields and types; strip anything quoted after a type mismatch.
            Category::Data => {
                let m = e.to_string();
                let m = m.split(" at line ").next().unwrap_or("").to_string();
                if m.starts_with("invalid type") {
                    "a field has the wrong type".to_string()
                } else {
                    m
                }
            }
        };
        CredentialError::Decode(format!("{what} at line {} column {}", e.line(), e.column()))
    })?;
    if !SUPPORTED_API_VERSIONS.contains(&req.api_version.as_str()) {
        return Err(CredentialError::ApiVersion(req.api_version));
    }
    if req.kind != REQUEST_KIND {
        return Err(CredentialError::Kind(req.kind));
    }
    if req.image.is_empty() {
        return Err(CredentialError::MissingImage);
    }
    Ok(req)
}

/// Encodes a response as one JSON line.
pub fn encode_response(resp: &CredentialProviderResponse) -> Result<Vec<u8>, CredentialError> {
    let mut out = serde_json::to_vec(resp).map_err(|e| CredentialError::Write(e.to_string()))?;
    out.push(b'\n');
    Ok(out)
}

/// Reads a request from `stdin`, calls `handler`, writes the response to `stdout`. Any error
/// goes to `stderr` (nothing is written to `stdout`) and the result is exit code 1.
pub fn run_with<F>(
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
    handler: F,
) -> ExitCode
where
    F: FnOnce(&CredentialProviderRequest) -> Result<CredentialProviderResponse, BoxError>,
{
    let fail = |stderr: &mut dyn Write, msg: String| {
        let _ = writeln!(stderr, "{msg}");
        ExitCode::FAILURE
    };
    let mut input = Vec::new();
    if let Err(e) = stdin.read_to_end(&mut input) {
        return fail(stderr, CredentialError::Read(e.to_string()).to_string());
    }
    let req = match decode_request(&input) {
        Ok(r) => r,
        Err(e) => return fail(stderr, e.to_string()),
    };
    let resp = match handler(&req) {
        Ok(r) => r,
        Err(e) => {
            return fail(
                stderr,
                format!("error getting credentials for image {:?}: {e}", req.image),
            );
        }
    };
    let bytes = match encode_response(&resp) {
        Ok(b) => b,
        Err(e) => return fail(stderr, e.to_string()),
    };
    if let Err(e) = stdout.write_all(&bytes).and_then(|_| stdout.flush()) {
        return fail(stderr, CredentialError::Write(e.to_string()).to_string());
    }
    ExitCode::SUCCESS
}

/// [`run_with`] with an async `handler`, driven on a current-thread runtime (one request per
/// process needs no more). A runtime that cannot start is one line on `stderr` naming
/// `program`, and exit code 1.
pub fn run_async_with<F, Fut>(
    program: &str,
    stdin: &mut dyn Read,
    stdout: &mut dyn Write,
    stderr: &mut dyn Write,
    handler: F,
) -> ExitCode
where
    F: FnOnce(CredentialProviderRequest) -> Fut,
    Fut: std::future::Future<Output = Result<CredentialProviderResponse, BoxError>>,
{
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            let _ = writeln!(stderr, "{program}: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    run_with(stdin, stdout, stderr, |req| rt.block_on(handler(req.clone())))
}

/// A plugin's testable entry point: the arguments after the program name, a lookup of the
/// environment, and the three standard streams.
pub type PluginEntry = fn(
    &[String],
    &dyn Fn(&str) -> Option<String>,
    &mut dyn Read,
    &mut dyn Write,
    &mut dyn Write,
) -> ExitCode;

/// A plugin binary's `main`: `entry` on the process's arguments, environment and streams.
pub fn plugin_main(entry: PluginEntry) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    entry(
        &args,
        &|name| std::env::var(name).ok(),
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
    )
}

/// [`run_with`] on the process's stdin, stdout and stderr.
pub fn run<F>(handler: F) -> ExitCode
where
    F: FnOnce(&CredentialProviderRequest) -> Result<CredentialProviderResponse, BoxError>,
{
    run_with(
        &mut std::io::stdin().lock(),
        &mut std::io::stdout().lock(),
        &mut std::io::stderr().lock(),
        handler,
    )
}

/// The registry part of an image (host and optional port: everything before the first `/`).
pub fn registry_of(image: &str) -> &str {
    image.split('/').next().unwrap_or(image)
}

/// How long the kubelet caches a response: `None` means not at all.
/// Absent `cacheDuration` uses `default_cache_duration` (0: no caching); an explicit 0 means
/// no caching.
pub fn cache_ttl(
    response: &CredentialProviderResponse,
    default_cache_duration: Duration,
) -> Option<Duration> {
    let d = response.cache_duration.unwrap_or(default_cache_duration);
    (!d.is_zero()).then_some(d)
}

fn glob_label(pattern: &str, text: &str) -> bool {
    // `filepath.Match` on one DNS label: `*` (no separators inside a label anyway), `?`, literal.
    fn m(p: &[u8], t: &[u8]) -> bool {
        match (p.first(), t.first()) {
            (None, None) => true,
            (Some(b'*'), _) => m(&p[1..], t) || (!t.is_empty() && m(p, &t[1..])),
            (Some(b'?'), Some(_)) => m(&p[1..], &t[1..]),
            (Some(a), Some(b)) if a == b => m(&p[1..], &t[1..]),
            _ => false,
        }
    }
    m(pattern.as_bytes(), text.as_bytes())
}

fn split_image(s: &str) -> (&str, &str, &str) {
    let s = s.split_once("://").map(|(_, rest)| rest).unwrap_or(s);
    let (hostport, path) = s.split_once('/').unwrap_or((s, ""));
    let (host, port) = match hostport.rsplit_once(':') {
        Some((h, p)) if !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()) => (h, p),
        _ => (hostport, ""),
    };
    (host, port, path)
}

/// Whether `image` matches a `matchImages` (or `auth` key) pattern: the host's dot-separated
/// parts match one by one with globs (equal counts), the port matches exactly, and the
/// pattern's path is a prefix of the image's path. The scheme is ignored.
pub fn image_matches(pattern: &str, image: &str) -> bool {
    let (ph, pp, ppath) = split_image(pattern);
    let (ih, ip, ipath) = split_image(image);
    let pparts: Vec<&str> = ph.split('.').collect();
    let iparts: Vec<&str> = ih.split('.').collect();
    pparts.len() == iparts.len()
        && pparts.iter().zip(&iparts).all(|(p, i)| glob_label(p, i))
        && pp == ip
        && ipath.starts_with(ppath)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run_on(input: &str) -> (ExitCode, String, String) {
        let mut out = Vec::new();
        let mut err = Vec::new();
        let code = run_with(&mut input.as_bytes(), &mut out, &mut err, |req| {
            let mut auth = BTreeMap::new();
            auth.insert(
                "*.dkr.ecr.*.amazonaws.com".to_string(),
                AuthConfig { username: "AWS".into(), password: "pw".into() },
            );
            Ok(req.respond(CacheKeyType::Registry, Some(Duration::from_secs(6 * 3600)), auth))
        });
        (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
    }

    #[test]
    fn golden_round_trip() {
        let req = r#"{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"123456789.dkr.ecr.us-east-1.amazonaws.com/app:v1"}"#;
        let (code, out, err) = run_on(req);
        assert_eq!(code, ExitCode::SUCCESS, "{err}");
        assert_eq!(
            out,
            "{\"kind\":\"CredentialProviderResponse\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"cacheKeyType\":\"Registry\",\"cacheDuration\":\"6h0m0s\",\"auth\":{\"*.dkr.ecr.*.amazonaws.com\":{\"username\":\"AWS\",\"password\":\"pw\"}}}\n"
        );
        assert!(err.is_empty());
        // The response echoes the request's version.
        let (_, out, _) = run_on(&req.replace("/v1\"", "/v1beta1\""));
        assert!(
            out.contains("\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1beta1\""),
            "{out}"
        );
    }

    #[test]
    fn golden_request_with_service_account() {
        let req = decode_request(br#"{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"r.io/a","serviceAccountToken":"jwt","serviceAccountAnnotations":{"k":"v"}}"#).unwrap();
        assert_eq!(req.service_account_token.as_deref(), Some("jwt"));
        assert!(!format!("{req:?}").contains("jwt"), "Debug redacts the token");
        let resp = req.respond(CacheKeyType::Image, None, BTreeMap::new());
        assert_eq!(
            String::from_utf8(encode_response(&resp).unwrap()).unwrap(),
            "{\"kind\":\"CredentialProviderResponse\",\"apiVersion\":\"credentialprovider.kubelet.k8s.io/v1\",\"cacheKeyType\":\"Image\",\"auth\":{}}\n"
        );
    }

    #[test]
    fn malformed_input_fails_without_stdout() {
        let cases = [
            ("", "no CredentialProviderRequest on stdin"),
            (
                "{not json",
                "error decoding CredentialProviderRequest from stdin: invalid JSON at line 1",
            ),
            ("{\"kind\":\"CredentialProviderRequest\"", "unexpected end of input"),
            (
                r#"{"kind":"CredentialProviderRequest","apiVersion":"v1","image":"x"}"#,
                "unsupported apiVersion \"v1\"",
            ),
            (
                r#"{"kind":"Nope","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"x"}"#,
                "unsupported kind \"Nope\"",
            ),
            (
                r#"{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1"}"#,
                "image is required",
            ),
            (
                r#"{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"x","serviceAccountToken":{"secret":"s3cr3t"}}"#,
                "a field has the wrong type",
            ),
        ];
        for (input, want) in cases {
            let (code, out, err) = run_on(input);
            assert_eq!(code, ExitCode::FAILURE, "{input}");
            assert!(out.is_empty(), "nothing on stdout for {input}");
            assert!(err.contains(want), "{input}: {err}");
            assert!(!err.contains("s3cr3t"), "input is not echoed");
        }
    }

    #[test]
    fn cache_semantics() {
        let image = "registry.io:8080/path/app:v1";
        assert_eq!(CacheKeyType::Image.key_for(image), image);
        assert_eq!(CacheKeyType::Registry.key_for(image), "registry.io:8080");
        assert_eq!(CacheKeyType::Global.key_for(image), "global");
        let mut r = CredentialProviderRequest {
            kind: REQUEST_KIND.into(),
            api_version: API_VERSION_V1.into(),
            image: image.into(),
            service_account_token: None,
            service_account_annotations: None,
        }
        .respond(CacheKeyType::Image, None, BTreeMap::new());
        assert_eq!(cache_ttl(&r, Duration::from_secs(60)), Some(Duration::from_secs(60)));
        assert_eq!(cache_ttl(&r, Duration::ZERO), None);
        r.cache_duration = Some(Duration::ZERO);
        assert_eq!(cache_ttl(&r, Duration::from_secs(60)), None);
        r.cache_duration = Some(Duration::from_secs(300));
        assert_eq!(cache_ttl(&r, Duration::from_secs(60)), Some(Duration::from_secs(300)));
        let parsed: CredentialProviderResponse = serde_json::from_str(
            r#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","cacheKeyType":"Global","cacheDuration":"5m0s"}"#,
        )
        .unwrap();
        assert_eq!(parsed.cache_duration, Some(Duration::from_secs(300)));
    }

    #[test]
    fn match_images_globs() {
        assert!(image_matches(
            "*.dkr.ecr.*.amazonaws.com",
            "123.dkr.ecr.us-east-1.amazonaws.com/app:v1"
        ));
        assert!(!image_matches(
            "*.dkr.ecr.*.amazonaws.com",
            "a.b.dkr.ecr.us-east-1.amazonaws.com/app"
        ));
        assert!(image_matches("registry.io:8080/path", "registry.io:8080/path/app"));
        assert!(!image_matches("registry.io:8080/path", "registry.io/path/app"));
        assert!(!image_matches("registry.io/path", "registry.io/other/app"));
        assert!(image_matches("https://*.azurecr.io", "my.azurecr.io/x"));
    }
}
