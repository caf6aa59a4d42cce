//! Delegated authentication and authorization for the secure port, as upstream's
//! `DelegatingAuthenticationOptions` / `DelegatingAuthorizationOptions` (spec §7.3):
//!
//! - A bearer token is checked with a TokenReview; no token is `system:anonymous`
//!   (anonymous authentication is on, as upstream's delegated authenticator). An invalid token
//!   is 401.
//! - Always-allowed paths (`/healthz,/readyz,/livez` by default; a trailing `*` is a prefix) and
//!   the group `system:masters` are authorized without asking. Everything else is a
//!   SubjectAccessReview with non-resource attributes `{path, verb}`; a denial is 403.
//! - Identities are cached for the authentication TTL, keyed by a hash of the token (tokens
//!   are never logged or kept in clear); decisions for the authorization TTLs, keyed by the
//!   whole identity (name, UID, groups, extra), verb and path.
//! - Without a delegated client (no kubeconfig and not in a cluster), tokens cannot be checked
//!   and only always-allowed paths are served.
//! - Client certificates and the front proxy ([`X509Auth`]), tried before the token, in
//!   upstream's order:
//!   1. request header: a client certificate that verifies against
//!      `--requestheader-client-ca-file`, whose CommonName is in
//!      `--requestheader-allowed-names` (empty: any), makes the request's user the first
//!      non-empty `--requestheader-username-headers` value, with groups, extra (`<prefix><key>`,
//!      key lower-cased and URL-unescaped) and UID from the other `--requestheader-*` headers.
//!      Such a certificate whose CommonName is not allowed is 401. Without a username header the
//!      next step is tried;
//!   2. client certificate: a certificate that verifies against `--client-ca-file` is the user
//!      named by its CommonName, with its Organizations as groups. A certificate that verifies
//!      against neither is 401 (the TLS layer already refuses certificates from other CAs).

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use std::sync::Arc;

use http::HeaderMap;
use http::request::Parts;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};
use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, UnixTime};
use rustls::server::WebPkiClientVerifier;
use rustls::server::danger::ClientCertVerifier;

use super::flags::Flags;
use super::serving::{PeerCertificates, ServingError};

/// An authenticated user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct User {
    /// Username.
    pub name: String,
    /// UID.
    pub uid: String,
    /// Groups.
    pub groups: Vec<String>,
    /// Extra attributes.
    pub extra: BTreeMap<String, Vec<String>>,
}

impl User {
    fn anonymous() -> Self {
        User {
            name: "system:anonymous".into(),
            uid: String::new(),
            groups: vec!["system:unauthenticated".into()],
            extra: BTreeMap::new(),
        }
    }
}

/// The decision for one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// Serve it.
    Allow,
    /// 401: the credentials are invalid.
    Unauthorized,
    /// 403, with the message.
    Forbidden(String),
}

/// Client-certificate and request-header authentication (see the module documentation).
pub struct X509Auth {
    client_ca: Option<Arc<dyn ClientCertVerifier>>,
    requestheader: Option<(Arc<dyn ClientCertVerifier>, RequestHeaderNames)>,
    /// Verifies against both CAs (what the TLS layer asks for).
    union: Arc<dyn ClientCertVerifier>,
}

/// The `--requestheader-*` settings.
#[derive(Debug, Clone, Default)]
pub struct RequestHeaderNames {
    /// Allowed client certificate CommonNames (empty: any).
    pub allowed_names: Vec<String>,
    /// Username headers.
    pub username: Vec<String>,
    /// Group headers.
    pub group: Vec<String>,
    /// Extra header prefixes (lower-case).
    pub extra_prefix: Vec<String>,
    /// UID headers.
    pub uid: Vec<String>,
}

fn clean(v: &[String]) -> Vec<String> {
    v.iter().map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect()
}

fn load_roots(flag: &'static str, path: &str) -> Result<RootCertStore, ServingError> {
    let err = |m: String| ServingError::Pem { flag, path: path.to_string(), message: m };
    let mut roots = RootCertStore::empty();
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
        .map_err(|e| err(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| err(e.to_string()))?;
    if certs.is_empty() {
        return Err(err("no CERTIFICATE block found".into()));
    }
    for c in certs {
        roots.add(c).map_err(|e| err(e.to_string()))?;
    }
    Ok(roots)
}

fn verifier(roots: RootCertStore) -> Result<Arc<dyn ClientCertVerifier>, ServingError> {
    WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::new(rustls::crypto::aws_lc_rs::default_provider()),
    )
    .allow_unauthenticated()
    .build()
    .map_err(|e| ServingError::Tls(format!("client certificate verifier: {e}")))
}

impl X509Auth {
    /// From `--client-ca-file` and the `--requestheader-*` flags; `None` when neither CA file is
    /// set.
    pub fn from_flags(flags: &Flags) -> Result<Option<Arc<X509Auth>>, ServingError> {
        let client = (!flags.client_ca_file.is_empty())
            .then(|| load_roots("--client-ca-file", &flags.client_ca_file))
            .transpose()?;
        let front = (!flags.requestheader_client_ca_file.is_empty())
            .then(|| {
                load_roots("--requestheader-client-ca-file", &flags.requestheader_client_ca_file)
            })
            .transpose()?;
        if client.is_none() && front.is_none() {
            return Ok(None);
        }
        let mut union = RootCertStore::empty();
        for r in [&client, &front].into_iter().flatten() {
            union.roots.extend(r.roots.iter().cloned());
        }
        let names = RequestHeaderNames {
            allowed_names: clean(&flags.requestheader_allowed_names),
            username: clean(&flags.requestheader_username_headers),
            group: clean(&flags.requestheader_group_headers),
            extra_prefix: clean(&flags.requestheader_extra_headers_prefix)
                .into_iter()
                .map(|p| p.to_ascii_lowercase())
                .collect(),
            uid: clean(&flags.requestheader_uid_headers),
        };
        Ok(Some(Arc::new(X509Auth {
            client_ca: client.map(verifier).transpose()?,
            requestheader: front.map(verifier).transpose()?.map(|v| (v, names)),
            union: verifier(union)?,
        })))
    }

    /// The verifier for the TLS layer (either CA).
    pub fn tls_verifier(&self) -> Arc<dyn ClientCertVerifier> {
        self.union.clone()
    }

    /// `None`: no certificate-based identity (try the token); `Some(Err)`: 401.
    fn authenticate(
        &self,
        chain: &[CertificateDer<'static>],
        headers: &HeaderMap,
    ) -> Option<Result<User, ()>> {
        let (leaf, intermediates) = chain.split_first()?;
        let now = UnixTime::now();
        let verifies = |v: &Arc<dyn ClientCertVerifier>| {
            v.verify_client_cert(leaf, intermediates, now).is_ok()
        };
        let parsed = x509_parser::parse_x509_certificate(leaf.as_ref()).ok().map(|(_, c)| c);
        let common_name = parsed.as_ref().and_then(|c| {
            c.subject()
                .iter_common_name()
                .next()
                .and_then(|cn| cn.as_str().ok())
                .map(str::to_string)
        });
        let mut failed = false;
        if let Some((v, names)) = &self.requestheader {
            if verifies(v) {
                let cn = common_name.clone().unwrap_or_default();
                if !names.allowed_names.is_empty() && !names.allowed_names.contains(&cn) {
                    tracing::info!(common_name = %cn, "request-header client certificate not in --requestheader-allowed-names");
                    return Some(Err(()));
                }
                if let Some(user) = user_from_headers(names, headers) {
                    return Some(Ok(user));
                }
            } else {
                failed = true;
            }
        }
        if let Some(v) = &self.client_ca {
            if verifies(v) {
                let groups = parsed
                    .as_ref()
                    .map(|c| {
                        c.subject()
                            .iter_organization()
                            .filter_map(|o| o.as_str().ok())
                            .map(str::to_string)
                            .collect()
                    })
                    .unwrap_or_default();
                return match common_name {
                    Some(name) if !name.is_empty() => {
                        Some(Ok(User { name, uid: String::new(), groups, extra: BTreeMap::new() }))
                    }
                    _ => Some(Err(())),
                };
            }
            failed = true;
        }
        failed.then_some(Err(()))
    }
}

fn header_values(headers: &HeaderMap, names: &[String]) -> Vec<String> {
    names
        .iter()
        .flat_map(|n| headers.get_all(n.as_str()).iter())
        .filter_map(|v| v.to_str().ok())
        .map(str::to_string)
        .collect()
}

fn unescape(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && i + 2 < bytes.len()
            && let Some(b) = std::str::from_utf8(&bytes[i + 1..i + 3])
                .ok()
                .and_then(|h| u8::from_str_radix(h, 16).ok())
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn user_from_headers(names: &RequestHeaderNames, headers: &HeaderMap) -> Option<User> {
    let name = names
        .username
        .iter()
        .flat_map(|n| headers.get_all(n.as_str()).iter())
        .filter_map(|v| v.to_str().ok())
        .find(|v| !v.is_empty())?
        .to_string();
    let uid = names
        .uid
        .iter()
        .flat_map(|n| headers.get_all(n.as_str()).iter())
        .filter_map(|v| v.to_str().ok())
        .find(|v| !v.is_empty())
        .unwrap_or_default()
        .to_string();
    let mut extra: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for (key, value) in headers {
        let key = key.as_str();
        for prefix in &names.extra_prefix {
            if let Some(rest) = key.strip_prefix(prefix.as_str())
                && !rest.is_empty()
                && let Ok(v) = value.to_str()
            {
                extra.entry(unescape(rest).to_ascii_lowercase()).or_default().push(v.to_string());
            }
        }
    }
    Some(User { name, uid, groups: header_values(headers, &names.group), extra })
}

/// Who asked for what: the whole identity (name, UID, groups, extra), the verb and the path.
/// A decision made for one identity is never reused for another with the same name but other
/// groups, UID or extra (the SubjectAccessReview was asked about all of them).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct DecisionKey {
    name: String,
    uid: String,
    groups: Vec<String>,
    extra: BTreeMap<String, Vec<String>>,
    verb: String,
    path: String,
}

impl DecisionKey {
    fn new(user: &User, verb: &str, path: &str) -> Self {
        DecisionKey {
            name: user.name.clone(),
            uid: user.uid.clone(),
            groups: user.groups.clone(),
            extra: user.extra.clone(),
            verb: verb.to_string(),
            path: path.to_string(),
        }
    }
}

/// Delegated authn/authz.
pub struct Delegation {
    authn: Option<Client>,
    authz: Option<Client>,
    always_allow: Vec<String>,
    authn_ttl: Duration,
    allow_ttl: Duration,
    deny_ttl: Duration,
    hasher: std::collections::hash_map::RandomState,
    tokens: Mutex<HashMap<u64, (Option<User>, Instant)>>,
    decisions: Mutex<HashMap<DecisionKey, (bool, Instant)>>,
    x509: Option<Arc<X509Auth>>,
}

impl Delegation {
    /// A delegation using the given clients (either may be absent).
    pub fn new(
        authn: Option<Client>,
        authz: Option<Client>,
        always_allow: Vec<String>,
        authn_ttl: Duration,
        allow_ttl: Duration,
        deny_ttl: Duration,
    ) -> Self {
        Delegation {
            authn,
            authz,
            always_allow,
            authn_ttl,
            allow_ttl,
            deny_ttl,
            hasher: Default::default(),
            tokens: Mutex::new(HashMap::new()),
            decisions: Mutex::new(HashMap::new()),
            x509: None,
        }
    }

    /// Adds client-certificate and request-header authentication.
    pub fn with_x509(mut self, x509: Option<Arc<X509Auth>>) -> Self {
        self.x509 = x509;
        self
    }

    /// Authenticates and authorizes a request head: its client certificate (a
    /// [`PeerCertificates`] extension) first, then its bearer token.
    pub async fn check_request(&self, parts: &Parts) -> Decision {
        let path = parts.uri.path();
        let method = parts.method.as_str();
        if let (Some(x509), Some(PeerCertificates(chain))) =
            (&self.x509, parts.extensions.get::<PeerCertificates>())
        {
            match x509.authenticate(chain, &parts.headers) {
                Some(Ok(user)) => return self.decide(user, method, path).await,
                Some(Err(())) => return Decision::Unauthorized,
                None => {}
            }
        }
        self.check(&parts.headers, method, path).await
    }

    fn always_allowed(&self, path: &str) -> bool {
        self.always_allow.iter().any(|p| match p.strip_suffix('*') {
            Some(prefix) => path.starts_with(prefix),
            None => p == path,
        })
    }

    /// Authenticates and authorizes a request.
    pub async fn check(&self, headers: &HeaderMap, method: &str, path: &str) -> Decision {
        let token = headers
            .get(http::header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| {
                let (scheme, rest) = v.split_once(' ')?;
                scheme.eq_ignore_ascii_case("bearer").then(|| rest.trim().to_string())
            })
            .filter(|t| !t.is_empty());
        let user = match token {
            None => User::anonymous(),
            Some(token) => match self.authenticate(&token).await {
                Some(u) => u,
                None => return Decision::Unauthorized,
            },
        };
        self.decide(user, method, path).await
    }

    async fn decide(&self, user: User, method: &str, path: &str) -> Decision {
        if self.always_allowed(path) || user.groups.iter().any(|g| g == "system:masters") {
            return Decision::Allow;
        }
        let verb = method.to_ascii_lowercase();
        if self.authorize(&user, &verb, path).await {
            Decision::Allow
        } else {
            Decision::Forbidden(format!(
                "forbidden: User {:?} cannot {verb} path {path:?}",
                user.name
            ))
        }
    }

    async fn authenticate(&self, token: &str) -> Option<User> {
        let key = {
            let mut h = self.hasher.build_hasher();
            h.write(token.as_bytes());
            h.finish()
        };
        if let Some((u, at)) = self.tokens.lock().unwrap_or_else(|p| p.into_inner()).get(&key)
            && at.elapsed() < self.authn_ttl
        {
            return u.clone();
        }
        let client = self.authn.clone()?;
        let review = TokenReview {
            spec: TokenReviewSpec { token: Some(token.to_string()), ..Default::default() },
            ..Default::default()
        };
        let result = Api::<TokenReview>::all(client).create(&PostParams::default(), &review).await;
        let user = match result {
            Ok(r) => {
                let status = r.status.unwrap_or_default();
                if status.authenticated == Some(true) {
                    status.user.map(|u| User {
                        name: u.username.unwrap_or_default(),
                        uid: u.uid.unwrap_or_default(),
                        groups: u.groups.unwrap_or_default(),
                        extra: u.extra.unwrap_or_default(),
                    })
                } else {
                    None
                }
            }
            Err(e) => {
                tracing::warn!(error = %e, "TokenReview failed");
                return None;
            }
        };
        let mut cache = self.tokens.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|_, (_, at)| at.elapsed() < self.authn_ttl);
        cache.insert(key, (user.clone(), Instant::now()));
        user
    }

    /// A cached decision for `user` asking `verb path`, while its TTL lasts.
    fn cached_decision(&self, user: &User, verb: &str, path: &str) -> Option<bool> {
        let key = DecisionKey::new(user, verb, path);
        let cache = self.decisions.lock().unwrap_or_else(|p| p.into_inner());
        let (allowed, at) = cache.get(&key)?;
        let ttl = if *allowed { self.allow_ttl } else { self.deny_ttl };
        (at.elapsed() < ttl).then_some(*allowed)
    }

    fn remember_decision(&self, user: &User, verb: &str, path: &str, allowed: bool) {
        let mut cache = self.decisions.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|_, (_, at)| at.elapsed() < self.allow_ttl.max(self.deny_ttl));
        cache.insert(DecisionKey::new(user, verb, path), (allowed, Instant::now()));
    }

    async fn authorize(&self, user: &User, verb: &str, path: &str) -> bool {
        if let Some(allowed) = self.cached_decision(user, verb, path) {
            return allowed;
        }
        let Some(client) = self.authz.clone() else {
            return false;
        };
        let sar = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.name.clone()),
                uid: (!user.uid.is_empty()).then(|| user.uid.clone()),
                groups: Some(user.groups.clone()),
                extra: (!user.extra.is_empty()).then(|| user.extra.clone()),
                non_resource_attributes: Some(NonResourceAttributes {
                    path: Some(path.to_string()),
                    verb: Some(verb.to_string()),
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let allowed = match Api::<SubjectAccessReview>::all(client)
            .create(&PostParams::default(), &sar)
            .await
        {
            Ok(r) => r.status.map(|s| s.allowed).unwrap_or(false),
            Err(e) => {
                tracing::warn!(error = %e, "SubjectAccessReview failed");
                return false;
            }
        };
        self.remember_decision(user, verb, path, allowed);
        allowed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn delegation() -> Delegation {
        Delegation::new(
            None,
            None,
            vec!["/healthz".into(), "/readyz".into(), "/debug/*".into()],
            Duration::from_secs(10),
            Duration::from_secs(10),
            Duration::from_secs(10),
        )
    }

    #[test]
    fn request_header_user_groups_extra_and_uid() {
        let names = RequestHeaderNames {
            allowed_names: vec![],
            username: vec!["X-Remote-User".into(), "X-Other-User".into()],
            group: vec!["X-Remote-Group".into()],
            extra_prefix: vec!["x-remote-extra-".into()],
            uid: vec!["X-Remote-Uid".into()],
        };
        let mut h = HeaderMap::new();
        assert_eq!(
            user_from_headers(&names, &h),
            None,
            "no username header: not this authenticator"
        );
        h.append("x-other-user", "bob".parse().unwrap());
        h.append("x-remote-group", "g1".parse().unwrap());
        h.append("x-remote-group", "g2".parse().unwrap());
        h.append("x-remote-extra-Scopes%2fA", "s1".parse().unwrap());
        h.append("x-remote-uid", "1234".parse().unwrap());
        let u = user_from_headers(&names, &h).unwrap();
        assert_eq!(u.name, "bob");
        assert_eq!(u.groups, vec!["g1", "g2"]);
        assert_eq!(u.uid, "1234");
        assert_eq!(u.extra.get("scopes/a"), Some(&vec!["s1".to_string()]));
    }

    #[tokio::test]
    async fn without_delegation_only_always_allowed_paths() {
        let d = delegation();
        let h = HeaderMap::new();
        assert_eq!(d.check(&h, "GET", "/healthz").await, Decision::Allow);
        assert_eq!(d.check(&h, "GET", "/debug/flags/v").await, Decision::Allow);
        match d.check(&h, "GET", "/metrics").await {
            Decision::Forbidden(m) => {
                assert!(m.contains("system:anonymous") && m.contains("/metrics"), "{m}")
            }
            other => panic!("{other:?}"),
        }
        let mut with_token = HeaderMap::new();
        with_token.insert(http::header::AUTHORIZATION, "Bearer abc".parse().unwrap());
        assert_eq!(d.check(&with_token, "GET", "/metrics").await, Decision::Unauthorized);
    }

    #[tokio::test]
    async fn a_cached_decision_is_never_reused_for_another_identity_with_the_same_name() {
        // No authorizer: whatever is not cached is denied.
        let d = delegation();
        let reader = User {
            name: "alice".into(),
            uid: "1".into(),
            groups: vec!["metrics-readers".into()],
            extra: BTreeMap::from([("scopes".to_string(), vec!["metrics".to_string()])]),
        };
        d.remember_decision(&reader, "get", "/metrics", true);
        assert!(d.authorize(&reader, "get", "/metrics").await, "the cached decision is used");
        assert!(!d.authorize(&reader, "get", "/configz").await, "another path is not");
        let others = [
            User { groups: vec!["system:authenticated".into()], ..reader.clone() },
            User { groups: vec![], ..reader.clone() },
            User { uid: "2".into(), ..reader.clone() },
            User { extra: BTreeMap::new(), ..reader.clone() },
        ];
        for other in &others {
            assert!(
                !d.authorize(other, "get", "/metrics").await,
                "alice's decision for {:?} reused for {other:?}",
                reader.groups
            );
        }
    }
}
