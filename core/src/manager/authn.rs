//! Delegated authentication and authorization for the secure port, as upstream's
//! `DelegatingAuthenticationOptions` / `DelegatingAuthorizationOptions` (spec §7.3):
//!
//! - A bearer token is checked with a TokenReview; no token is `system:anonymous`
//!   (anonymous authentication is on, as upstream's delegated authenticator). An invalid token
//!   is 401.
//! - Always-allowed paths (`/healthz,/readyz,/livez` by default; a trailing `*` is a prefix) and
//!   the group `system:masters` are authorized without asking. Everything else is a
//!   SubjectAccessReview with non-resource attributes `{path, verb}`; a denial is 403.
//! - Decisions are cached for the configured TTLs, keyed by a hash of the token (tokens are
//!   never logged or kept in clear).
//! - Without a delegated client (no kubeconfig and not in a cluster), tokens cannot be checked
//!   and only always-allowed paths are served.
//! - Not implemented: client-certificate (`--client-ca-file`) and request-header
//!   authentication.

use std::collections::{BTreeMap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use http::HeaderMap;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::authorization::v1::{
    NonResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use kube::api::PostParams;
use kube::{Api, Client};

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

/// (user, verb, path).
type DecisionKey = (String, String, String);

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
        }
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

    async fn authorize(&self, user: &User, verb: &str, path: &str) -> bool {
        let key = (user.name.clone(), verb.to_string(), path.to_string());
        if let Some((allowed, at)) =
            self.decisions.lock().unwrap_or_else(|p| p.into_inner()).get(&key)
        {
            let ttl = if *allowed { self.allow_ttl } else { self.deny_ttl };
            if at.elapsed() < ttl {
                return *allowed;
            }
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
        let mut cache = self.decisions.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|_, (_, at)| at.elapsed() < self.allow_ttl.max(self.deny_ttl));
        cache.insert(key, (allowed, Instant::now()));
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
}
