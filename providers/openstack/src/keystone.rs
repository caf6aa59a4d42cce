//! Our own Keystone v3 authentication (`POST /v3/auth/tokens`) and service catalog, for every
//! method upstream's gophercloud-based client accepts from `[Global]`:
//!
//! | `[Global]` | identity | scope |
//! |---|---|---|
//! | `username` (+ `user-domain-name`/`-id`, else `domain-name`/`-id`, else `Default`) or `user-id`, `password` | `password` | project by `tenant-id`, or `tenant-name` in `tenant-domain-id`/`-name` (else `domain-id`/`-name`, else `Default`); no project but `domain-id` (else `domain-name`): that domain (a domain-scoped token, as gophercloud's clientconfig scopes it); neither: Keystone's default project |
//! | `application-credential-id` + secret | `application_credential` by ID | none (the credential's own project) |
//! | `application-credential-name` + secret + `user-id`, or `username` and its domain | `application_credential` by name and user | none |
//! | `token` | `token` | as password |
//! | `trust-id` with `trustee-id` (else `user-id`, else `username`) and `trustee-password` (else `password`) | `password` | `OS-TRUST:trust` (the trustor's project and roles) |
//!
//! The reply's `X-Subject-Token` is the token; `expires_at` when to renew it; `catalog` the
//! endpoints ([`Catalog::endpoint`]: by service type, `[Global] region` and
//! `os-endpoint-type`). Nothing here formats a secret: [`Auth`] has a hand-written `Debug`,
//! and the request body (the only place secrets go) is built on the stack of the call.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde_json::{Value, json};

use crate::config::{Global, Secret};

/// Who authenticates (built from `[Global]` by [`Auth::from_global`]).
#[derive(Clone)]
pub enum Auth {
    /// `password` method.
    Password {
        /// The user.
        user: User,
        /// The password.
        password: Secret,
        /// The scope.
        scope: Scope,
    },
    /// `application_credential` method by ID.
    ApplicationCredentialId {
        /// The credential's ID.
        id: String,
        /// Its secret.
        secret: Secret,
    },
    /// `application_credential` method by name and user.
    ApplicationCredentialName {
        /// The credential's name.
        name: String,
        /// Its user.
        user: User,
        /// Its secret.
        secret: Secret,
    },
    /// `token` method (a pre-issued token exchanged for a scoped one).
    Token {
        /// The token.
        token: Secret,
        /// The scope.
        scope: Scope,
    },
}

/// A Keystone user: by ID, or by name in a domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum User {
    /// `{"id": …}`.
    Id(String),
    /// `{"name": …, "domain": …}`.
    Name(String, IdOrName),
}

/// A domain or project named by ID or by name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum IdOrName {
    /// By ID.
    Id(String),
    /// By name.
    Name(String),
}

impl IdOrName {
    fn json(&self) -> Value {
        match self {
            IdOrName::Id(id) => json!({"id": id}),
            IdOrName::Name(name) => json!({"name": name}),
        }
    }
}

/// What a token is scoped to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Scope {
    /// No scope: Keystone's default project of the user (if any).
    Default,
    /// A project by ID.
    ProjectId(String),
    /// A project by name in a domain.
    ProjectName(String, IdOrName),
    /// A domain (`domain-id` or `domain-name` without a project): a domain-scoped token,
    /// which no project-scoped API (Nova, Neutron, Octavia) accepts.
    Domain(IdOrName),
    /// A trust (`OS-TRUST:trust`): the trustor's project and the delegated roles.
    Trust(String),
}

impl std::fmt::Debug for Auth {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Auth::Password { user, scope, .. } => f
                .debug_struct("Password")
                .field("user", user)
                .field("scope", scope)
                .finish_non_exhaustive(),
            Auth::ApplicationCredentialId { id, .. } => {
                f.debug_struct("ApplicationCredentialId").field("id", id).finish_non_exhaustive()
            }
            Auth::ApplicationCredentialName { name, user, .. } => f
                .debug_struct("ApplicationCredentialName")
                .field("name", name)
                .field("user", user)
                .finish_non_exhaustive(),
            Auth::Token { scope, .. } => {
                f.debug_struct("Token").field("scope", scope).finish_non_exhaustive()
            }
        }
    }
}

/// Why `[Global]` names no usable credential: the key and what is wrong (never a value).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AuthConfigError {
    /// `[Global] <key>`.
    pub key: &'static str,
    /// What is wrong.
    pub message: &'static str,
}

fn non_empty(s: &str) -> Option<&str> {
    let s = s.trim();
    (!s.is_empty()).then_some(s)
}

fn id_or_name(id: &str, name: &str) -> Option<IdOrName> {
    non_empty(id)
        .map(|i| IdOrName::Id(i.into()))
        .or_else(|| non_empty(name).map(|n| IdOrName::Name(n.into())))
}

impl Auth {
    /// How upstream's client authenticates with `[Global]` (gophercloud's clientconfig, then
    /// trusts' `AuthOptsExt`): a trust first, then an application credential, then a token,
    /// then a password.
    pub fn from_global(g: &Global) -> Result<Auth, AuthConfigError> {
        let err = |key, message| AuthConfigError { key, message };
        let domain = id_or_name(&g.domain_id, &g.domain_name);
        let user_domain = id_or_name(&g.user_domain_id, &g.user_domain_name)
            .or_else(|| domain.clone())
            .unwrap_or_else(|| IdOrName::Name("Default".into()));
        let user = |id: &str| -> Option<User> {
            non_empty(id)
                .map(|i| User::Id(i.into()))
                .or_else(|| non_empty(&g.user_id).map(|i| User::Id(i.into())))
                .or_else(|| {
                    non_empty(&g.username).map(|n| User::Name(n.into(), user_domain.clone()))
                })
        };
        let scope = if let Some(id) = non_empty(&g.project_id) {
            Scope::ProjectId(id.into())
        } else if let Some(name) = non_empty(&g.project_name) {
            let d = id_or_name(&g.project_domain_id, &g.project_domain_name)
                .or_else(|| domain.clone())
                .unwrap_or_else(|| IdOrName::Name("Default".into()));
            Scope::ProjectName(name.into(), d)
        } else if let Some(d) = domain.clone() {
            // gophercloud's clientconfig (upstream's `ToAuthOptions`): no project but a
            // domain scopes the token to that domain (the ID first).
            Scope::Domain(d)
        } else {
            Scope::Default
        };
        if let Some(trust) = non_empty(&g.trust_id) {
            let user = user(&g.trustee_id).ok_or(err(
                "[Global] trustee-id",
                "required with trust-id (or user-id, or username)",
            ))?;
            let password = if g.trustee_password.is_empty() {
                g.password.clone()
            } else {
                g.trustee_password.clone()
            };
            if password.is_empty() {
                return Err(err(
                    "[Global] trustee-password",
                    "required with trust-id (or password)",
                ));
            }
            return Ok(Auth::Password { user, password, scope: Scope::Trust(trust.into()) });
        }
        let app_id = non_empty(&g.application_credential_id);
        let app_name = non_empty(&g.application_credential_name);
        if app_id.is_some() || app_name.is_some() {
            if g.application_credential_secret.is_empty() {
                return Err(err(
                    "[Global] application-credential-secret",
                    "required with an application credential",
                ));
            }
            let secret = g.application_credential_secret.clone();
            if let Some(id) = app_id {
                return Ok(Auth::ApplicationCredentialId { id: id.into(), secret });
            }
            let user = user("").ok_or(err(
                "[Global] application-credential-name",
                "an application credential by name needs its user: set user-id, or username \
                 (and user-domain-name or -id)",
            ))?;
            let name = app_name.unwrap_or_default().to_string();
            return Ok(Auth::ApplicationCredentialName { name, user, secret });
        }
        if !g.token.is_empty() {
            return Ok(Auth::Token { token: g.token.clone(), scope });
        }
        let Some(user) = user("") else {
            return Err(err(
                "[Global] username",
                "no credentials: set username or user-id with password, an application \
                 credential, a trust, or token",
            ));
        };
        if g.password.is_empty() {
            return Err(err("[Global] password", "required with username or user-id"));
        }
        Ok(Auth::Password { user, password: g.password.clone(), scope })
    }

    /// The method's name in messages.
    pub fn method(&self) -> &'static str {
        match self {
            Auth::Password { scope: Scope::Trust(_), .. } => "trust",
            Auth::Password { .. } => "password",
            Auth::ApplicationCredentialId { .. } | Auth::ApplicationCredentialName { .. } => {
                "application credential"
            }
            Auth::Token { .. } => "token",
        }
    }

    /// The `POST /v3/auth/tokens` body. Holds secrets: never logged.
    pub(crate) fn request_body(&self) -> Value {
        let user_json = |u: &User| match u {
            User::Id(id) => json!({"id": id}),
            User::Name(name, domain) => json!({"name": name, "domain": domain.json()}),
        };
        let scope_json = |s: &Scope| match s {
            Scope::Default => None,
            Scope::ProjectId(id) => Some(json!({"project": {"id": id}})),
            Scope::ProjectName(name, d) => {
                Some(json!({"project": {"name": name, "domain": d.json()}}))
            }
            Scope::Trust(id) => Some(json!({"OS-TRUST:trust": {"id": id}})),
            Scope::Domain(d) => Some(json!({"domain": d.json()})),
        };
        let (identity, scope) = match self {
            Auth::Password { user, password, scope } => {
                let mut u = user_json(user);
                u["password"] = Value::String(password.expose().to_string());
                (json!({"methods": ["password"], "password": {"user": u}}), scope_json(scope))
            }
            Auth::ApplicationCredentialId { id, secret } => (
                json!({"methods": ["application_credential"],
                    "application_credential": {"id": id, "secret": secret.expose()}}),
                None,
            ),
            Auth::ApplicationCredentialName { name, user, secret } => (
                json!({"methods": ["application_credential"],
                    "application_credential": {"name": name, "user": user_json(user),
                        "secret": secret.expose()}}),
                None,
            ),
            Auth::Token { token, scope } => {
                (json!({"methods": ["token"], "token": {"id": token.expose()}}), scope_json(scope))
            }
        };
        let mut auth = json!({"identity": identity});
        if let Some(s) = scope {
            auth["scope"] = s;
        }
        json!({ "auth": auth })
    }
}

/// The tokens URL of an `auth-url`: `…/v3/auth/tokens`; an `auth-url` without a version gets
/// `/v3` (upstream's gophercloud finds v3 by version discovery). `v2.0` is refused: Keystone v2
/// is gone (and upstream's client no longer speaks it either).
pub fn tokens_url(auth_url: &url::Url) -> Result<url::Url, &'static str> {
    let mut segs: Vec<String> = auth_url
        .path_segments()
        .map(|s| s.filter(|x| !x.is_empty()).map(str::to_string).collect())
        .unwrap_or_default();
    match segs.last().map(String::as_str) {
        Some("v3") => {}
        Some(v) if v.starts_with("v2") => return Err("Keystone v2 is not supported: use …/v3"),
        _ => segs.push("v3".into()),
    }
    segs.push("auth".into());
    segs.push("tokens".into());
    let mut url = auth_url.clone();
    url.set_path(&format!("/{}", segs.join("/")));
    url.set_query(None);
    url.set_fragment(None);
    Ok(url)
}

/// One catalog endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Endpoint {
    interface: String,
    region: String,
    region_id: String,
    url: String,
}

/// A token's service catalog.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Catalog {
    /// (service type, its endpoints).
    services: Vec<(String, Vec<Endpoint>)>,
}

impl Catalog {
    /// The URL of `service_type`'s endpoint on `interface` (`public`, `internal`, `admin`) in
    /// `region` (empty: any), as gophercloud picks it: the first that matches. An error names
    /// what is missing and what the catalog has.
    pub fn endpoint(
        &self,
        service_type: &str,
        region: &str,
        interface: &str,
    ) -> Result<url::Url, String> {
        let Some((_, endpoints)) = self.services.iter().find(|(t, _)| t == service_type) else {
            let have: Vec<&str> = self.services.iter().map(|(t, _)| t.as_str()).collect();
            return Err(format!(
                "the Keystone catalog has no {service_type:?} service (it has: {})",
                if have.is_empty() { "nothing".to_string() } else { have.join(", ") }
            ));
        };
        let found = endpoints.iter().find(|e| {
            e.interface == interface
                && (region.is_empty() || e.region_id == region || e.region == region)
        });
        let Some(e) = found else {
            let have: Vec<String> =
                endpoints.iter().map(|e| format!("{}/{}", e.region_id, e.interface)).collect();
            return Err(format!(
                "the Keystone catalog has no {service_type:?} endpoint for region {region:?} and \
                 interface {interface:?} (it has: {})",
                have.join(", ")
            ));
        };
        url::Url::parse(&e.url).map_err(|err| {
            format!("the Keystone catalog's {service_type:?} endpoint is not a URL: {err}")
        })
    }
}

/// An issued token.
#[derive(Clone)]
pub struct Token {
    /// `X-Subject-Token`.
    pub value: Secret,
    /// When Keystone says it expires.
    pub expires_at: Option<SystemTime>,
    /// When it was received.
    pub received: SystemTime,
    /// Its catalog.
    pub catalog: Catalog,
    /// The project it is scoped to (ID), if any.
    pub project_id: Option<String>,
    /// The domain it is scoped to (its name, else its ID) when it is domain-scoped.
    pub domain: Option<String>,
}

impl std::fmt::Debug for Token {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Token")
            .field("expires_at", &self.expires_at)
            .field("project_id", &self.project_id)
            .field("domain", &self.domain)
            .finish_non_exhaustive()
    }
}

/// The longest a token is kept before its expiry (renewed earlier).
pub const RENEW_BEFORE: Duration = Duration::from_secs(120);

impl Token {
    /// Whether the token should be renewed at `now`: within [`RENEW_BEFORE`] of its expiry, or
    /// within half its lifetime of it for short-lived tokens.
    pub fn needs_renewal(&self, now: SystemTime) -> bool {
        let Some(expires) = self.expires_at else { return false };
        let lifetime = expires.duration_since(self.received).unwrap_or_default();
        let margin = RENEW_BEFORE.min(lifetime / 2);
        match expires.duration_since(now) {
            Ok(left) => left <= margin,
            Err(_) => true,
        }
    }
}

/// Parses Keystone's token reply (`X-Subject-Token` and the body). An error says what is
/// missing (never the token).
pub fn parse_token(subject: Option<&str>, body: &Value) -> Result<Token, String> {
    let value = subject
        .filter(|s| !s.trim().is_empty())
        .ok_or("the reply has no X-Subject-Token header")?
        .trim()
        .to_string();
    let token = body.get("token").filter(|t| t.is_object()).ok_or("the reply has no token")?;
    let expires_at = match token.get("expires_at").and_then(Value::as_str) {
        Some(s) => Some(parse_time(s).ok_or("the token's expires_at is not a time")?),
        None => None,
    };
    let mut services = Vec::new();
    for svc in token.get("catalog").and_then(Value::as_array).into_iter().flatten() {
        let Some(ty) = svc.get("type").and_then(Value::as_str) else { continue };
        let s =
            |e: &Value, k: &str| e.get(k).and_then(Value::as_str).unwrap_or_default().to_string();
        let endpoints = svc
            .get("endpoints")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .map(|e| Endpoint {
                interface: s(e, "interface"),
                region: s(e, "region"),
                region_id: s(e, "region_id"),
                url: s(e, "url"),
            })
            .collect();
        services.push((ty.to_string(), endpoints));
    }
    let project_id =
        token.get("project").and_then(|p| p.get("id")).and_then(Value::as_str).map(str::to_string);
    let domain = token.get("domain").and_then(|d| {
        d.get("name").or_else(|| d.get("id")).and_then(Value::as_str).map(str::to_string)
    });
    Ok(Token {
        value: Secret(value),
        expires_at,
        received: SystemTime::now(),
        catalog: Catalog { services },
        project_id,
        domain,
    })
}

/// An ISO 8601 UTC time as Keystone writes it (`2026-11-28T17:00:00.000000Z`, or with
/// `+00:00`, or no zone).
pub fn parse_time(s: &str) -> Option<SystemTime> {
    let s = s.trim();
    let (date, time) = s.split_once(['T', ' '])?;
    let mut d = date.splitn(3, '-');
    let year: i64 = d.next()?.parse().ok()?;
    let month: i64 = d.next()?.parse().ok()?;
    let day: i64 = d.next()?.parse().ok()?;
    let time = time
        .strip_suffix('Z')
        .or_else(|| time.strip_suffix("+00:00"))
        .or_else(|| time.strip_suffix("+0000"))
        .unwrap_or(time);
    let (hms, frac) = time.split_once('.').unwrap_or((time, ""));
    let mut t = hms.splitn(3, ':');
    let hour: i64 = t.next()?.parse().ok()?;
    let minute: i64 = t.next()?.parse().ok()?;
    let second: i64 = t.next().unwrap_or("0").parse().ok()?;
    if !(1..=12).contains(&month)
        || !(1..=31).contains(&day)
        || hour > 23
        || minute > 59
        || second > 60
        || !frac.bytes().all(|b| b.is_ascii_digit())
    {
        return None;
    }
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    let secs = days * 86_400 + hour * 3600 + minute * 60 + second;
    let nanos: u32 = if frac.is_empty() {
        0
    } else {
        let digits: String = frac.chars().chain(std::iter::repeat('0')).take(9).collect();
        digits.parse().ok()?
    };
    let secs = u64::try_from(secs).ok()?;
    Some(UNIX_EPOCH + Duration::new(secs, nanos))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn g() -> Global {
        Global { auth_url: "https://k:5000/v3".into(), ..Global::default() }
    }

    #[test]
    fn keystone_times_parse() {
        let t = parse_time("1970-01-02T00:00:01.500000Z").unwrap();
        assert_eq!(t, UNIX_EPOCH + Duration::new(86_401, 500_000_000));
        let t = parse_time("2026-11-28T17:00:00Z").unwrap();
        assert_eq!(t.duration_since(UNIX_EPOCH).unwrap().as_secs(), 1_795_885_200);
        assert_eq!(parse_time("2026-11-28T17:00:00+00:00"), Some(t));
        for bad in ["", "2026-13-01T00:00:00Z", "yesterday", "2026-11-28T25:00:00Z"] {
            assert_eq!(parse_time(bad), None, "{bad}");
        }
    }

    #[test]
    fn tokens_url_adds_v3_when_missing() {
        let u = |s: &str| tokens_url(&url::Url::parse(s).unwrap()).map(|u| u.to_string());
        assert_eq!(u("https://k:5000/v3"), Ok("https://k:5000/v3/auth/tokens".into()));
        assert_eq!(u("https://k:5000/v3/"), Ok("https://k:5000/v3/auth/tokens".into()));
        assert_eq!(u("https://k:5000"), Ok("https://k:5000/v3/auth/tokens".into()));
        assert_eq!(u("https://k/identity"), Ok("https://k/identity/v3/auth/tokens".into()));
        assert!(u("https://k:5000/v2.0").is_err());
    }

    #[test]
    fn every_upstream_method_builds_its_request() {
        // Password by user ID, project by name in a domain given by ID.
        let mut c = g();
        c.user_id = "u-1".into();
        c.password = Secret("pw".into());
        c.project_name = "kube".into();
        c.project_domain_id = "d-1".into();
        let a = Auth::from_global(&c).unwrap();
        assert_eq!(a.method(), "password");
        assert_eq!(
            a.request_body(),
            json!({"auth": {"identity": {"methods": ["password"], "password": {"user":
                {"id": "u-1", "password": "pw"}}},
                "scope": {"project": {"name": "kube", "domain": {"id": "d-1"}}}}})
        );
        // Username in a domain by ID (domain-id applies to user and project).
        let mut c = g();
        c.username = "ccm".into();
        c.password = Secret("pw".into());
        c.domain_id = "d-2".into();
        c.project_name = "kube".into();
        let body = Auth::from_global(&c).unwrap().request_body();
        assert_eq!(body["auth"]["identity"]["password"]["user"]["domain"], json!({"id": "d-2"}));
        assert_eq!(body["auth"]["scope"]["project"]["domain"], json!({"id": "d-2"}));
        // user-domain-name wins over domain-id for the user.
        c.user_domain_name = "Users".into();
        let body = Auth::from_global(&c).unwrap().request_body();
        assert_eq!(
            body["auth"]["identity"]["password"]["user"]["domain"],
            json!({"name": "Users"})
        );
        // Trust (Magnum): user-id + password + trust-id; any project scope is replaced.
        let mut c = g();
        c.user_id = "trustee".into();
        c.password = Secret("pw".into());
        c.trust_id = "t-1".into();
        c.project_id = "ignored".into();
        let a = Auth::from_global(&c).unwrap();
        assert_eq!(a.method(), "trust");
        assert_eq!(a.request_body()["auth"]["scope"], json!({"OS-TRUST:trust": {"id": "t-1"}}));
        // trustee-id and trustee-password win over user-id and password.
        c.trustee_id = "trustee-2".into();
        c.trustee_password = Secret("tpw".into());
        let body = Auth::from_global(&c).unwrap().request_body();
        assert_eq!(
            body["auth"]["identity"]["password"]["user"],
            json!({"id": "trustee-2", "password": "tpw"})
        );
        // Application credential by name with the user by name.
        let mut c = g();
        c.application_credential_name = "ccm".into();
        c.application_credential_secret = Secret("s".into());
        c.username = "u".into();
        c.user_domain_id = "d-3".into();
        let body = Auth::from_global(&c).unwrap().request_body();
        assert_eq!(
            body,
            json!({"auth": {"identity": {"methods": ["application_credential"],
                "application_credential": {"name": "ccm", "secret": "s",
                    "user": {"name": "u", "domain": {"id": "d-3"}}}}}})
        );
        // No project but a domain: a domain-scoped token (the ID before the name), as
        // gophercloud's clientconfig builds it; the user's domain is that domain too.
        let mut c = g();
        c.username = "ccm".into();
        c.password = Secret("pw".into());
        c.domain_name = "Ops".into();
        let body = Auth::from_global(&c).unwrap().request_body();
        assert_eq!(body["auth"]["scope"], json!({"domain": {"name": "Ops"}}));
        c.domain_id = "d-9".into();
        let body = Auth::from_global(&c).unwrap().request_body();
        assert_eq!(body["auth"]["scope"], json!({"domain": {"id": "d-9"}}));
        // A project wins over the domain; no domain and no project: no scope at all.
        c.project_id = "p-9".into();
        let body = Auth::from_global(&c).unwrap().request_body();
        assert_eq!(body["auth"]["scope"], json!({"project": {"id": "p-9"}}));
        let mut c = g();
        c.user_id = "u".into();
        c.password = Secret("pw".into());
        assert!(Auth::from_global(&c).unwrap().request_body()["auth"].get("scope").is_none());
        // Token with a project ID.
        let mut c = g();
        c.token = Secret("tok".into());
        c.project_id = "p-1".into();
        let body = Auth::from_global(&c).unwrap().request_body();
        assert_eq!(body["auth"]["scope"], json!({"project": {"id": "p-1"}}));
        assert_eq!(body["auth"]["identity"]["token"]["id"], "tok");
    }

    #[test]
    fn missing_parts_name_the_key_and_debug_hides_secrets() {
        let mut c = g();
        c.application_credential_name = "ccm".into();
        c.application_credential_secret = Secret("very-secret-1".into());
        let e = Auth::from_global(&c).unwrap_err();
        assert_eq!(e.key, "[Global] application-credential-name");
        let mut c = g();
        c.trust_id = "t".into();
        c.user_id = "u".into();
        assert_eq!(Auth::from_global(&c).unwrap_err().key, "[Global] trustee-password");
        let mut c = g();
        c.username = "u".into();
        c.password = Secret("very-secret-2".into());
        let a = Auth::from_global(&c).unwrap();
        assert!(!format!("{a:?}").contains("very-secret"), "{a:?}");
    }

    #[test]
    fn the_catalog_picks_region_and_interface() {
        let body = json!({"token": {"expires_at": "2030-01-01T00:00:00.000000Z",
            "project": {"id": "p"},
            "catalog": [{"type": "compute", "endpoints": [
                {"interface": "public", "region_id": "R1", "region": "R1", "url": "https://pub1/v2.1"},
                {"interface": "internal", "region_id": "R1", "region": "R1", "url": "https://int1/v2.1"},
                {"interface": "public", "region_id": "R2", "region": "R2", "url": "https://pub2/v2.1"}]}]}});
        let t = parse_token(Some("tok"), &body).unwrap();
        let c = &t.catalog;
        assert_eq!(c.endpoint("compute", "R2", "public").unwrap().host_str(), Some("pub2"));
        assert_eq!(c.endpoint("compute", "R1", "internal").unwrap().host_str(), Some("int1"));
        assert_eq!(c.endpoint("compute", "", "public").unwrap().host_str(), Some("pub1"));
        let e = c.endpoint("compute", "R3", "public").unwrap_err();
        assert!(e.contains("R3") && e.contains("R1/public"), "{e}");
        assert!(c.endpoint("network", "R1", "public").unwrap_err().contains("compute"));
        assert_eq!(t.project_id.as_deref(), Some("p"));
        assert!(!format!("{t:?}").contains("tok"));
        assert!(parse_token(None, &body).is_err());
    }

    #[test]
    fn tokens_are_renewed_before_they_expire() {
        let now = SystemTime::now();
        let t = |life: u64| Token {
            value: Secret("x".into()),
            expires_at: Some(now + Duration::from_secs(life)),
            received: now,
            catalog: Catalog::default(),
            project_id: None,
            domain: None,
        };
        assert!(!t(3600).needs_renewal(now));
        assert!(t(3600).needs_renewal(now + Duration::from_secs(3600 - 100)));
        assert!(!t(10).needs_renewal(now + Duration::from_secs(4)));
        assert!(t(10).needs_renewal(now + Duration::from_secs(6)));
        assert!(t(10).needs_renewal(now + Duration::from_secs(20)));
    }
}
