//! OpenStack emulator: Keystone v3 (tokens and a service catalog pointing back at this
//! server), Nova (servers, flavors, availability zones), Neutron (extensions, networks,
//! subnets (IPv4 and IPv6), ports, trunks, floating IPs, routers with extra routes, security
//! groups and rules, tags)
//! and Octavia v2 (load balancers, listeners, pools, members, health monitors), with
//! OpenStack's field names, status codes, paging and error bodies, so
//! `gophercloud/gophercloud/v2` parses every reply (`ci/fidelity/run openstack` checks that).
//!
//! One server serves all four services under path prefixes, as DevStack does:
//!
//! | prefix | service | operations (faults and counters key on them) |
//! |---|---|---|
//! | `/identity` | Keystone v3 | `keystone.versions`, `keystone.tokens.create` |
//! | `/compute/v2.1` | Nova | `nova.servers.{list,get}`, `nova.flavors.{list,get}`, `nova.availability_zones.list` |
//! | `/network` | Neutron (`/v2.0/…`) | `neutron.<collection>.{list,get,create,update,delete}`, `neutron.routers.{add,remove}_extraroutes`, `neutron.tags.{replace,add}` |
//! | `/load-balancer` | Octavia (`/v2/lbaas/…`) | `octavia.<collection>.{list,get,create,update,delete}`, `octavia.members.batch_update` |
//! | `/key-manager` | Barbican (`/v1/…`, [`crate::openstack_barbican`]) | `barbican.versions`, `barbican.{containers,secrets}.{get,create}`, `barbican.acls.{get,update}` |
//!
//! Rules enforced as OpenStack does: every service call needs an `X-Auth-Token` this emulator
//! issued and that has not expired (401, the client re-authenticates); lists page with
//! `limit`/`marker` (`<collection>_links` with a `next` href; Nova's pages hold at most its
//! `[api] max_limit`, [`OpenStackOptions::nova_max_limit`], default 1000, with or without
//! `limit`, a full page links to the next, and an unknown `marker` is Nova's 400 `badRequest`
//! "marker [<id>] not found") and filter on any top-level field
//! given as a query parameter (a field given more than once matches any of its values, as
//! Neutron's `?id=a&id=b`; Nova's `name` is a regular expression: `^…$` anchors and
//! backslash escapes are understood, otherwise a substring match); a load balancer is
//! `PENDING_CREATE`/`PENDING_UPDATE`/`PENDING_DELETE` for a configurable time after each change
//! to it or its children, and any change while it is pending is a 409 ("immutable");
//! deleting a load balancer with children is a 400 unless `cascade=true`; a load balancer
//! create may carry the whole tree (Octavia's "fully populated" create: `listeners` with a
//! `default_pool` — inline, or naming one of the body's `pools` — and pools with `members` and
//! a `healthmonitor`): every child is validated as its own create would be and created with
//! the load balancer (`PENDING_CREATE`, then `ACTIVE`), the reply shows the tree in full, and a
//! refused child refuses the whole create (nothing is left behind); `GET /load-balancer/` (and
//! `/load-balancer/v2`) lists every v2 minor version up to v2.[`OCTAVIA_MAX_MINOR`]
//! (`CURRENT`; the others `SUPPORTED`); deleting a security
//! group a port uses is a 409; extra routes' next hops must be on a subnet (400).
//!
//! Behaviour rules (issue 31; `docs/emulators.md` lists each with its source and check):
//! Keystone looks users up in the domain the request names, scopes tokens to a project the
//! user has a role on (else 401), issues unscoped tokens (no scope, no default project; the
//! services answer them 403), domain-scoped tokens (`{"domain": …}` for a user with a role on
//! that domain, [`OpenStackOptions::domain_roles`], else 401: domain, roles and catalog, no
//! project, so the services answer 403) and trust-scoped tokens (`OS-TRUST:trust`); another project's
//! objects are 404 in Nova and Neutron and 403 in Octavia. Nova knows every server status
//! (world tag [`STATUS_TAG`]) and a deleted server is a 404. Neutron honours a floating IP's
//! `subnet_id`, lets only admins choose its address (403), refuses security groups and
//! address pairs without port security (409), more than `max_routes` routes (400) and more
//! than the quotas (409 `OverQuota`); a trunk (`POST /v2.0/trunks`) turns its sub-ports into
//! `trunk:subport` ports (`device_id` the trunk) and shows them in the parent port's
//! `trunk_details`, refuses a port already in a trunk (409) and a duplicate or invalid VLAN,
//! and a trunk's ports cannot be deleted while it exists (409). Octavia honours `vip_port_id`, validates `vip_address`,
//! provider, flavor and availability zone, refuses what its `octavia_max_version` does not
//! know, and shows a failed operation (the kit's operation failures) as `ERROR`.
//! Errors: Nova `{"itemNotFound": {"code","message"}}`-style, Neutron
//! `{"NeutronError": {"type","message","detail"}}`, Octavia
//! `{"faultcode","faultstring","debuginfo"}`, Keystone `{"error": {"code","title","message"}}`.
//!
//! World mapping: `networks` are tenant networks (one `private` network when none), `subnets`
//! are subnets (one `private-subnet` when none), plus an external network `public`
//! (`172.24.4.0/24`) for floating IPs and a router `router1` attached to every subnet.
//! `instances` are servers (`ACTIVE`, `SHUTOFF` for `stopped`, `DELETED` for `terminated`;
//! `type` is the flavor, default `m1.small`; `zone` the availability zone; `tags` the
//! metadata) with one port on their subnet holding `private_ips`, and a floating IP per
//! `public_ips` entry. IDs are derived from names, so they are the same after a reset.

// Handlers return the OpenStack error reply itself as their error.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use serde_json::{Map, Value, json};

use crate::asyncop::{Action, AsyncOps, Operation, Phase, Timing, octavia_provisioning_status};
use crate::server::{Body, Cloud, ErrorKind, ErrorReply, ServeFuture, full};
use crate::world::{Instance, PowerState, World, WorldError};

/// The user [`OpenStackOptions::default`] accepts.
pub const DEFAULT_USER: &str = "admin";
/// Its password.
pub const DEFAULT_PASSWORD: &str = "openstack-emulator-password";
/// The application credential ID accepted by default.
pub const DEFAULT_APP_CRED_ID: &str = "emulator-app-cred";
/// Its secret.
pub const DEFAULT_APP_CRED_SECRET: &str = "openstack-emulator-app-cred-secret";
/// The name of the application credential [`OpenStackOptions::default`] accepts by name and
/// user ([`DEFAULT_USER`], by ID or by name in domain `Default`), with
/// [`DEFAULT_APP_CRED_SECRET`].
pub const DEFAULT_APP_CRED_NAME: &str = "emulator-app-cred-by-name";
/// A non-admin user [`OpenStackOptions::default`] also accepts (role `member` on the default
/// project and on [`ALT_PROJECT`], domain `Default`, no default project).
pub const MEMBER_USER: &str = "member";
/// Its password.
pub const MEMBER_PASSWORD: &str = "openstack-emulator-member-password";
/// A second project (domain `Default`) [`OpenStackOptions::default`] has.
pub const ALT_PROJECT: &str = "alt";
/// The trust [`OpenStackOptions::default`] defines: trustor [`DEFAULT_USER`], trustee
/// [`MEMBER_USER`], on the default project, role `member`.
pub const DEFAULT_TRUST_ID: &str = "emulator-trust";

/// A Keystone user beyond [`OpenStackOptions::users`] (those are admins in domain `Default`
/// with a role on every project, the default project their default).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeystoneUser {
    /// Name, unique in its domain.
    pub name: String,
    /// Password.
    pub password: String,
    /// Its domain's name (default `Default`).
    #[serde(default = "default_domain")]
    pub domain: String,
    /// The projects (names) it has its roles on.
    #[serde(default)]
    pub projects: Vec<String>,
    /// Its roles (default `[member]`; `admin` makes it a cloud admin).
    #[serde(default = "member_roles")]
    pub roles: Vec<String>,
    /// The project a token request without a scope is scoped to (none: such a token is
    /// unscoped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_project: Option<String>,
}

/// A Keystone project beyond [`OpenStackOptions::project`].
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeystoneProject {
    /// Name, unique in its domain.
    pub name: String,
    /// Its domain's name (default `Default`).
    #[serde(default = "default_domain")]
    pub domain: String,
}

/// A Keystone trust (OS-TRUST): the trustee may get a token scoped to the trust, on the
/// trust's project with the trust's roles.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeystoneTrust {
    /// The trust's ID.
    pub id: String,
    /// The delegating user's name.
    pub trustor: String,
    /// The user who may use it.
    pub trustee: String,
    /// The project (name) the trust scopes to.
    pub project: String,
    /// The roles it delegates (default `[member]`).
    #[serde(default = "member_roles")]
    pub roles: Vec<String>,
    /// Whether the trustee acts as the trustor.
    #[serde(default)]
    pub impersonation: bool,
}

fn default_domain() -> String {
    "Default".into()
}

fn member_roles() -> Vec<String> {
    vec!["member".into()]
}

/// How the emulator is set up beyond its world.
#[derive(Debug, Clone)]
pub struct OpenStackOptions {
    /// User name and password Keystone accepts.
    pub users: Vec<(String, String)>,
    /// Application credential ID and secret Keystone accepts.
    pub app_creds: Vec<(String, String)>,
    /// Application credentials Keystone accepts by name and user: (name, the user's name,
    /// secret). The name is unique per user, so a request naming it must name the user (by
    /// ID, or by name in its domain): without one 400, another user's or a wrong secret 401.
    pub app_cred_names: Vec<(String, String, String)>,
    /// The project (tenant) name.
    pub project: String,
    /// The region (default: the world's, else `RegionOne`).
    pub region: Option<String>,
    /// How long issued tokens live (default 3600 s).
    pub token_lifetime: Duration,
    /// How long a load balancer stays `PENDING_*` after each change (default 2 s).
    pub lb_pending: Duration,
    /// The base URL of the catalog's Nova, Neutron and Octavia endpoints (default: this
    /// server, as the request's `Host` names it), e.g. to show a client a catalog naming
    /// another host or scheme.
    pub catalog_base: Option<String>,
    /// The newest Octavia API version the emulator advertises and implements, as the minor
    /// of v2 (default [`OCTAVIA_MAX_MINOR`]; the world file's `openstack.octavia_max_version`).
    /// Below 2.5 a `tags` attribute is refused, below 2.12 a listener's `allowed_cidrs`,
    /// below 2.16 an HTTP(S) health monitor on a UDP pool, below 2.1 a listener's timeouts
    /// (400, as that Octavia refuses an attribute it does not know).
    pub octavia_max_minor: u32,
    /// Users beyond `users` (default: [`MEMBER_USER`]).
    pub extra_users: Vec<KeystoneUser>,
    /// Projects beyond `project` (default: [`ALT_PROJECT`]).
    pub extra_projects: Vec<KeystoneProject>,
    /// Trusts (default: [`DEFAULT_TRUST_ID`]).
    pub trusts: Vec<KeystoneTrust>,
    /// Domain role assignments: (user name, domain name). Such a user may get a token
    /// scoped to that domain (default: [`DEFAULT_USER`] on `Default`); anyone else asking for
    /// a domain scope gets a 401, as Keystone answers a user without a role there.
    pub domain_roles: Vec<(String, String)>,
    /// Neutron's `max_routes`: routes per router (default 30).
    pub max_routes: usize,
    /// Neutron quotas, per project.
    pub quotas: NeutronQuotas,
    /// Octavia's enabled provider drivers.
    pub octavia_providers: Vec<String>,
    /// Octavia flavors a load balancer may name (by name or ID).
    pub octavia_flavors: Vec<String>,
    /// Octavia availability zones.
    pub octavia_availability_zones: Vec<String>,
    /// More subnets of the external network.
    pub public_subnets: Vec<PublicSubnet>,
    /// Nova's `[api] max_limit` (`osapi_max_limit`; default [`NOVA_MAX_LIMIT`]): the most
    /// servers one `GET /servers[/detail]` page holds, whatever `limit` asks; a full page
    /// carries a `servers_links` `next` link (`marker` = its last server), as Nova pages.
    pub nova_max_limit: usize,
    /// Octavia's `[api_settings] pagination_max_limit` (default
    /// [`OCTAVIA_PAGINATION_MAX_LIMIT`]): the most objects one Octavia list page holds,
    /// whatever `limit` asks; a full page carries a `<collection>_links` `next` link.
    pub octavia_max_limit: usize,
}

/// Octavia's default `[api_settings] pagination_max_limit`: 1000 objects per list page.
pub const OCTAVIA_PAGINATION_MAX_LIMIT: usize = 1000;

/// Nova's default `[api] max_limit` (`osapi_max_limit`): 1000 servers per listing page.
pub const NOVA_MAX_LIMIT: usize = 1000;

impl Default for OpenStackOptions {
    fn default() -> Self {
        OpenStackOptions {
            users: vec![(DEFAULT_USER.into(), DEFAULT_PASSWORD.into())],
            app_creds: vec![(DEFAULT_APP_CRED_ID.into(), DEFAULT_APP_CRED_SECRET.into())],
            app_cred_names: vec![(
                DEFAULT_APP_CRED_NAME.into(),
                DEFAULT_USER.into(),
                DEFAULT_APP_CRED_SECRET.into(),
            )],
            project: "demo".into(),
            region: None,
            token_lifetime: Duration::from_secs(3600),
            lb_pending: Duration::from_secs(2),
            catalog_base: None,
            octavia_max_minor: OCTAVIA_MAX_MINOR,
            extra_users: vec![KeystoneUser {
                name: MEMBER_USER.into(),
                password: MEMBER_PASSWORD.into(),
                domain: default_domain(),
                projects: vec!["demo".into(), ALT_PROJECT.into()],
                roles: member_roles(),
                default_project: None,
            }],
            extra_projects: vec![KeystoneProject {
                name: ALT_PROJECT.into(),
                domain: default_domain(),
            }],
            trusts: vec![KeystoneTrust {
                id: DEFAULT_TRUST_ID.into(),
                trustor: DEFAULT_USER.into(),
                trustee: MEMBER_USER.into(),
                project: "demo".into(),
                roles: member_roles(),
                impersonation: false,
            }],
            domain_roles: vec![(DEFAULT_USER.into(), default_domain())],
            max_routes: 30,
            quotas: NeutronQuotas::default(),
            octavia_providers: vec!["amphora".into(), "octavia".into(), "ovn".into()],
            octavia_flavors: Vec::new(),
            octavia_availability_zones: Vec::new(),
            public_subnets: Vec::new(),
            nova_max_limit: NOVA_MAX_LIMIT,
            octavia_max_limit: OCTAVIA_PAGINATION_MAX_LIMIT,
        }
    }
}

impl OpenStackOptions {
    /// These options with a world file's `openstack:` settings applied; an invalid setting is
    /// an error naming it.
    pub fn with_world(mut self, w: &OpenStackWorld) -> Result<OpenStackOptions, WorldError> {
        let invalid = |detail: String| WorldError::Invalid { origin: "openstack".into(), detail };
        if let Some(v) = &w.octavia_max_version {
            self.octavia_max_minor = parse_octavia_version(v).map_err(invalid)?;
        }
        self.extra_projects.extend(w.projects.iter().cloned());
        self.extra_users.extend(w.users.iter().cloned());
        self.trusts.extend(w.trusts.iter().cloned());
        let known = |p: &str| p == self.project || self.extra_projects.iter().any(|x| x.name == p);
        for u in &self.extra_users {
            for p in u.projects.iter().chain(&u.default_project) {
                if !known(p) {
                    return Err(invalid(format!("user {:?}: unknown project {p:?}", u.name)));
                }
            }
        }
        for t in &self.trusts {
            if !known(&t.project) {
                return Err(invalid(format!("trust {:?}: unknown project {:?}", t.id, t.project)));
            }
            let user = |n: &str| {
                self.users.iter().any(|u| u.0 == n) || self.extra_users.iter().any(|u| u.name == n)
            };
            for who in [&t.trustor, &t.trustee] {
                if !user(who) {
                    return Err(invalid(format!("trust {:?}: unknown user {who:?}", t.id)));
                }
            }
        }
        if let Some(m) = w.max_routes {
            self.max_routes = m;
        }
        if let Some(q) = &w.quotas {
            self.quotas = q.clone();
        }
        if !w.octavia_providers.is_empty() {
            self.octavia_providers = w.octavia_providers.clone();
        }
        self.octavia_flavors.extend(w.octavia_flavors.iter().cloned());
        self.octavia_availability_zones.extend(w.octavia_availability_zones.iter().cloned());
        self.public_subnets.extend(w.public_subnets.iter().cloned());
        if let Some(m) = w.nova_max_limit {
            if m == 0 {
                return Err(invalid("nova_max_limit: must be at least 1".into()));
            }
            self.nova_max_limit = m;
        }
        if let Some(m) = w.octavia_pagination_max_limit {
            if m == 0 {
                return Err(invalid("octavia_pagination_max_limit: must be at least 1".into()));
            }
            self.octavia_max_limit = m;
        }
        Ok(self)
    }
}

/// The OpenStack-only settings of a world file, under its top-level `openstack:` key (read by
/// [`parse_world`] / [`load_world`]; the rest of the file is the kit's [`World`]):
///
/// ```yaml
/// openstack:
///   octavia_max_version: "2.11"   # GET /load-balancer/ lists v2.0..v2.11; newer attributes are 400
///   nova_max_limit: 3             # Nova's [api] max_limit: servers per listing page (default 1000)
///   octavia_pagination_max_limit: 3  # Octavia's objects per list page (default 1000)
/// ```
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenStackWorld {
    /// The newest Octavia API version (`"2.11"` or `"v2.11"`, v2.0 to v2.[`OCTAVIA_MAX_MINOR`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub octavia_max_version: Option<String>,
    /// Keystone projects beyond the default one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub projects: Vec<KeystoneProject>,
    /// Keystone users beyond the defaults.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub users: Vec<KeystoneUser>,
    /// Keystone trusts beyond the default one.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub trusts: Vec<KeystoneTrust>,
    /// Neutron's `max_routes` (routes per router; default 30).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_routes: Option<usize>,
    /// Neutron quotas per project (default: Neutron's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<NeutronQuotas>,
    /// Octavia's enabled provider drivers (default `amphora`, `octavia`, `ovn`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub octavia_providers: Vec<String>,
    /// Octavia flavors (names or IDs a load balancer may name; default none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub octavia_flavors: Vec<String>,
    /// Octavia availability zones (default none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub octavia_availability_zones: Vec<String>,
    /// More subnets of the external network `public` (besides `public-subnet`,
    /// `172.24.4.0/24`), e.g. for floating IPs by `subnet_id`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub public_subnets: Vec<PublicSubnet>,
    /// Nova's `[api] max_limit`: servers per listing page (default 1000, Nova's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nova_max_limit: Option<usize>,
    /// Octavia's `[api_settings] pagination_max_limit`: objects per list page (default 1000,
    /// Octavia's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub octavia_pagination_max_limit: Option<usize>,
}

/// Neutron quotas of a project (Neutron's defaults).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct NeutronQuotas {
    /// Security groups (Neutron default 10).
    pub security_group: usize,
    /// Security group rules (default 100).
    pub security_group_rule: usize,
    /// Floating IPs (default 50).
    pub floatingip: usize,
}

impl Default for NeutronQuotas {
    fn default() -> Self {
        NeutronQuotas { security_group: 10, security_group_rule: 100, floatingip: 50 }
    }
}

/// A subnet of the external network.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PublicSubnet {
    /// Name.
    pub name: String,
    /// Its range.
    pub cidr: String,
}

/// `"2.11"` / `"v2.11"` → 11, for v2.0 up to v2.[`OCTAVIA_MAX_MINOR`].
pub fn parse_octavia_version(v: &str) -> Result<u32, String> {
    let bad = || {
        format!(
            "octavia_max_version {v:?}: expected a version v2.0 to v2.{OCTAVIA_MAX_MINOR}, e.g. \"2.11\""
        )
    };
    let minor = v.trim().trim_start_matches('v').strip_prefix("2.").ok_or_else(bad)?;
    let minor: u32 = minor.parse().map_err(|_| bad())?;
    if minor > OCTAVIA_MAX_MINOR {
        return Err(bad());
    }
    Ok(minor)
}

/// Parses a world file's text (YAML or JSON) for the OpenStack emulator: the kit's [`World`]
/// plus the OpenStack-only settings under its `openstack:` key.
pub fn parse_world(text: &str) -> Result<(World, OpenStackWorld), WorldError> {
    parse_world_named(text, "<inline>")
}

/// Reads a world file for the OpenStack emulator (see [`parse_world`]).
pub fn load_world(path: &std::path::Path) -> Result<(World, OpenStackWorld), WorldError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| WorldError::Read { path: path.to_path_buf(), source })?;
    parse_world_named(&text, &path.display().to_string())
}

fn parse_world_named(text: &str, origin: &str) -> Result<(World, OpenStackWorld), WorldError> {
    let invalid = |detail: String| WorldError::Invalid { origin: origin.into(), detail };
    let mut v: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?
    } else {
        serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?
    };
    let os = match v.as_object_mut().and_then(|m| m.remove("openstack")) {
        None | Some(Value::Null) => OpenStackWorld::default(),
        Some(o) => serde_json::from_value(o).map_err(|e| invalid(format!("openstack: {e}")))?,
    };
    if let Some(version) = &os.octavia_max_version {
        parse_octavia_version(version).map_err(|e| invalid(format!("openstack: {e}")))?;
    }
    let rest = if v.is_null() { "{}".to_string() } else { v.to_string() };
    let world = World::parse(&rest).map_err(|e| match e {
        WorldError::Invalid { detail, .. } => invalid(detail),
        other => other,
    })?;
    Ok((world, os))
}

type Resp = Response<Body>;
type Res<T> = Result<T, Resp>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

// `YYYY-MM-DDTHH:MM:SS` (UTC) of a UNIX timestamp.
use crate::kit::utc_datetime as civil;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

/// A UUID-shaped id derived from `seed`.
fn uuid(seed: &str) -> String {
    let a = splitmix(fnv(seed));
    let b = splitmix(a ^ 0x5555);
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        b >> 52,
        b & 0xffff_ffff_ffff
    )
}

fn query(q: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

use crate::kit::json_reply as reply;

fn no_content() -> Resp {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = StatusCode::NO_CONTENT;
    r
}

/// Which service a path belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Svc {
    Keystone,
    Nova,
    Neutron,
    Octavia,
    Other,
}

fn service(path: &str) -> Svc {
    if path.starts_with("/identity") {
        Svc::Keystone
    } else if path.starts_with("/compute") {
        Svc::Nova
    } else if path.starts_with("/network") {
        Svc::Neutron
    } else if path.starts_with("/load-balancer") {
        Svc::Octavia
    } else {
        Svc::Other
    }
}

/// An error body in the service's own shape.
fn error_body(svc: Svc, status: u16, kind: &str, message: &str) -> Value {
    match svc {
        Svc::Keystone | Svc::Other => json!({"error": {
            "code": status,
            "title": match status { 401 => "Unauthorized", 404 => "Not Found", 429 => "Too Many Requests", 503 => "Service Unavailable", _ => "Error" },
            "message": message,
        }}),
        Svc::Nova => {
            let key = match status {
                400 => "badRequest",
                401 => "unauthorized",
                403 => "forbidden",
                404 => "itemNotFound",
                409 => "conflictingRequest",
                413 | 429 => "overLimit",
                _ => "computeFault",
            };
            json!({ key: {"code": status, "message": message} })
        }
        Svc::Neutron => {
            json!({"NeutronError": {"type": kind, "message": message, "detail": ""}})
        }
        Svc::Octavia => json!({"faultcode": if status < 500 { "Client" } else { "Server" },
            "faultstring": message, "debuginfo": null}),
    }
}

fn err(svc: Svc, status: StatusCode, kind: &str, message: impl AsRef<str>) -> Resp {
    reply(status, &error_body(svc, status.as_u16(), kind, message.as_ref()))
}

/// Neutron's collection → its singular key and JSON plural key.
const NEUTRON: &[(&str, &str, &str)] = &[
    ("networks", "network", "networks"),
    ("subnets", "subnet", "subnets"),
    ("ports", "port", "ports"),
    ("floatingips", "floatingip", "floatingips"),
    ("routers", "router", "routers"),
    ("security-groups", "security_group", "security_groups"),
    ("security-group-rules", "security_group_rule", "security_group_rules"),
    ("trunks", "trunk", "trunks"),
];

/// Octavia's collections → singular key.
const OCTAVIA: &[(&str, &str)] = &[
    ("loadbalancers", "loadbalancer"),
    ("listeners", "listener"),
    ("pools", "pool"),
    ("healthmonitors", "healthmonitor"),
];

/// The route of a call: its operation name and the path segments after the service prefix.
fn route(method: &Method, path: &str) -> String {
    let mut segs: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    // Octavia answers under `/v2` and `/v2.0` alike.
    if segs.len() > 1 && segs[0] == "load-balancer" && segs[1] == "v2.0" {
        segs[1] = "v2";
    }
    let verb = |m: &Method, item: bool| -> &'static str {
        match (m.as_str(), item) {
            ("GET", false) => "list",
            ("GET", true) => "get",
            ("POST", false) => "create",
            ("PUT", true) => "update",
            ("DELETE", true) => "delete",
            _ => "unknown",
        }
    };
    match segs.as_slice() {
        ["identity"] | ["identity", "v3"] if method == Method::GET => "keystone.versions".into(),
        ["identity", "v3", "auth", "tokens"] if method == Method::POST => {
            "keystone.tokens.create".into()
        }
        ["compute", "v2.1", "servers", "detail"] if method == Method::GET => {
            "nova.servers.list".into()
        }
        ["compute", "v2.1", "servers", _] if method == Method::GET => "nova.servers.get".into(),
        ["compute", "v2.1", "flavors", "detail"] if method == Method::GET => {
            "nova.flavors.list".into()
        }
        ["compute", "v2.1", "flavors", _] if method == Method::GET => "nova.flavors.get".into(),
        ["compute", "v2.1", "os-availability-zone"] if method == Method::GET => {
            "nova.availability_zones.list".into()
        }
        ["compute"] | ["compute", "v2.1"] if method == Method::GET => "nova.versions".into(),
        ["network"] if method == Method::GET => "neutron.versions".into(),
        ["network", "v2.0", "extensions"] if method == Method::GET => {
            "neutron.extensions.list".into()
        }
        ["network", "v2.0", "routers", _, "add_extraroutes"] if method == Method::PUT => {
            "neutron.routers.add_extraroutes".into()
        }
        ["network", "v2.0", "routers", _, "remove_extraroutes"] if method == Method::PUT => {
            "neutron.routers.remove_extraroutes".into()
        }
        ["network", "v2.0", c, _, "tags"] if method == Method::PUT && neutron_coll(c).is_some() => {
            "neutron.tags.replace".into()
        }
        ["network", "v2.0", c, _, "tags", _]
            if method == Method::PUT && neutron_coll(c).is_some() =>
        {
            "neutron.tags.add".into()
        }
        ["network", "v2.0", c] if neutron_coll(c).is_some() => {
            format!("neutron.{}.{}", c.replace('-', "_"), verb(method, false))
        }
        ["network", "v2.0", c, _] if neutron_coll(c).is_some() => {
            format!("neutron.{}.{}", c.replace('-', "_"), verb(method, true))
        }
        ["load-balancer"] | ["load-balancer", "v2"] if method == Method::GET => {
            "octavia.versions".into()
        }
        ["key-manager"] if method == Method::GET => "barbican.versions".into(),
        ["key-manager", "v1", "containers" | "secrets", _, "acl"] if method == Method::GET => {
            "barbican.acls.get".into()
        }
        ["key-manager", "v1", "containers" | "secrets", _, "acl"] if method == Method::PUT => {
            "barbican.acls.update".into()
        }
        ["key-manager", "v1", c @ ("containers" | "secrets"), _] if method == Method::GET => {
            format!("barbican.{c}.get")
        }
        ["key-manager", "v1", c @ ("containers" | "secrets")] if method == Method::POST => {
            format!("barbican.{c}.create")
        }
        ["load-balancer", "v2", "lbaas", "pools", _, "members"] if method == Method::PUT => {
            "octavia.members.batch_update".into()
        }
        ["load-balancer", "v2", "lbaas", "pools", _, "members"] => {
            format!("octavia.members.{}", verb(method, false))
        }
        ["load-balancer", "v2", "lbaas", "pools", _, "members", _] => {
            format!("octavia.members.{}", verb(method, true))
        }
        ["load-balancer", "v2", "lbaas", c] if octavia_coll(c).is_some() => {
            format!("octavia.{c}.{}", verb(method, false))
        }
        ["load-balancer", "v2", "lbaas", c, _] if octavia_coll(c).is_some() => {
            format!("octavia.{c}.{}", verb(method, true))
        }
        _ => format!("http.unknown.{}", method.as_str().to_lowercase()),
    }
}

fn neutron_coll(c: &str) -> Option<(&'static str, &'static str, &'static str)> {
    NEUTRON.iter().find(|(p, _, _)| *p == c).copied()
}

fn octavia_coll(c: &str) -> Option<(&'static str, &'static str)> {
    OCTAVIA.iter().find(|(p, _)| *p == c).copied()
}

/// A CIDR (IPv4 or IPv6) as (network bits, mask, IPv6?) over 128 bits.
fn parse_cidr(cidr: &str) -> Option<(u128, u128, bool)> {
    let (ip, len) = cidr.split_once('/')?;
    let ip: IpAddr = ip.parse().ok()?;
    let len: u32 = len.parse().ok()?;
    let (bits, width, v6) = match ip {
        IpAddr::V4(a) => (u128::from(u32::from(a)), 32, false),
        IpAddr::V6(a) => (u128::from(a), 128, true),
    };
    if len > width {
        return None;
    }
    let all = u128::MAX >> (128 - width);
    let mask = if len == 0 { 0 } else { all & !((1u128 << (width - len)) - 1) };
    Some((bits & mask, mask, v6))
}

fn in_cidr(ip: &str, cidr: &str) -> bool {
    let (Ok(ip), Some((net, mask, v6))) = (ip.parse::<IpAddr>(), parse_cidr(cidr)) else {
        return false;
    };
    match ip {
        IpAddr::V4(a) if !v6 => u128::from(u32::from(a)) & mask == net,
        IpAddr::V6(a) if v6 => u128::from(a) & mask == net,
        _ => false,
    }
}

/// The `n`th address of `cidr` (IPv4 or IPv6).
fn nth_host(cidr: &str, n: u32) -> String {
    match parse_cidr(cidr) {
        Some((net, _, true)) => Ipv6Addr::from(net.wrapping_add(u128::from(n))).to_string(),
        Some((net, _, false)) => Ipv4Addr::from((net as u32).wrapping_add(n)).to_string(),
        None => Ipv4Addr::from(u32::from(Ipv4Addr::new(10, 0, 0, 0)).wrapping_add(n)).to_string(),
    }
}

/// Neutron's default allocation pool of `cidr` (`[start, end]`): every address after the
/// gateway (the first host, `nth_host(cidr, 1)`) up to the last host — for IPv4 the address
/// before the broadcast address, for IPv6 the last address of the prefix — as Neutron fills
/// in `allocation_pools` when a subnet is created without them.
fn default_pool(cidr: &str) -> Value {
    let end = match parse_cidr(cidr) {
        Some((net, mask, true)) => Ipv6Addr::from(net | !mask).to_string(),
        Some((net, mask, false)) => {
            let last = (net | (!mask & u128::from(u32::MAX))) as u32;
            Ipv4Addr::from(last.saturating_sub(1)).to_string()
        }
        None => nth_host(cidr, 254),
    };
    json!([{"start": nth_host(cidr, 2), "end": end}])
}

/// The lowest address of `subnet`'s `allocation_pools` that no port (or floating IP, per
/// `used`) holds, as Neutron's IPAM allocates a fixed IP when none is asked for; `None` when
/// every address of every pool is in use (Neutron's 409 `IpAddressGenerationFailure`). The
/// gateway is never handed out.
fn allocate_ip(subnet: &Value, used: &BTreeSet<IpAddr>) -> Option<String> {
    let gateway = subnet["gateway_ip"].as_str().and_then(|g| g.parse::<IpAddr>().ok());
    let num = |a: &IpAddr| match a {
        IpAddr::V4(a) => u128::from(u32::from(*a)),
        IpAddr::V6(a) => u128::from(*a),
    };
    let pools = match subnet["allocation_pools"].as_array() {
        Some(p) if !p.is_empty() => Value::Array(p.clone()),
        // A subnet created without pools gets Neutron's default one.
        _ => default_pool(subnet["cidr"].as_str().unwrap_or_default()),
    };
    for pool in pools.as_array().into_iter().flatten() {
        let bound = |k: &str| pool[k].as_str().and_then(|a| a.parse::<IpAddr>().ok());
        let (Some(start), Some(end)) = (bound("start"), bound("end")) else { continue };
        let v6 = start.is_ipv6();
        let mut n = num(&start);
        // Each step either returns or passes a used address (or the gateway): at most
        // `used.len() + 2` steps before a free address or the pool's end.
        while n <= num(&end) {
            let a = if v6 {
                IpAddr::V6(Ipv6Addr::from(n))
            } else {
                IpAddr::V4(Ipv4Addr::from(n as u32))
            };
            if !used.contains(&a) && Some(a) != gateway {
                return Some(a.to_string());
            }
            n += 1;
        }
    }
    None
}

/// Neutron's `IpAddressGenerationFailure` message for network `net`.
fn no_more_addresses(net: &str) -> String {
    format!("No more IP addresses available on network {net}.")
}

/// Every address Neutron shows as held: the ports' fixed IPs and the floating IPs.
fn used_addresses(st: &mut State) -> BTreeSet<IpAddr> {
    let mut used: BTreeSet<IpAddr> = st
        .coll("ports")
        .iter()
        .flat_map(|p| p["fixed_ips"].as_array().cloned().unwrap_or_default())
        .filter_map(|f| f["ip_address"].as_str().and_then(|a| a.parse().ok()))
        .collect();
    let gateways: Vec<IpAddr> = st
        .coll("routers")
        .iter()
        .flat_map(|r| {
            r["external_gateway_info"]["external_fixed_ips"].as_array().cloned().unwrap_or_default()
        })
        .filter_map(|f| f["ip_address"].as_str().and_then(|a| a.parse().ok()))
        .collect();
    used.extend(gateways);
    used.extend(
        st.coll("floatingips").iter().filter_map(|f| {
            f["floating_ip_address"].as_str().and_then(|a| a.parse::<IpAddr>().ok())
        }),
    );
    used
}

/// Nova's `name` filter: a regular expression; anchors and escapes are understood.
fn name_matches(pattern: &str, name: &str) -> bool {
    let start = pattern.starts_with('^');
    let end = pattern.ends_with('$') && !pattern.ends_with("\\$");
    let inner = &pattern[usize::from(start)..pattern.len() - usize::from(end)];
    let mut lit = String::new();
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        if c == '\\' {
            if let Some(n) = chars.next() {
                lit.push(n);
            }
        } else {
            lit.push(c);
        }
    }
    match (start, end) {
        (true, true) => name == lit,
        (true, false) => name.starts_with(&lit),
        (false, true) => name.ends_with(&lit),
        (false, false) => name.contains(&lit),
    }
}

/// Whether a stored object matches a query parameter (Neutron/Octavia filter semantics).
fn field_matches(obj: &Value, key: &str, want: &str) -> bool {
    match obj.get(key) {
        Some(Value::String(s)) => s == want,
        Some(Value::Bool(b)) => b.to_string() == want.to_lowercase(),
        Some(Value::Number(n)) => n.to_string() == want,
        Some(Value::Array(a)) => {
            // tags: every comma-separated tag present.
            want.split(',').all(|w| a.iter().any(|x| x.as_str() == Some(w)))
        }
        Some(Value::Null) | None => false,
        Some(_) => false,
    }
}

const PAGING_KEYS: &[&str] = &["limit", "marker", "page_reverse", "sort_key", "sort_dir", "fields"];

/// How a service caps its list pages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cap {
    /// Neutron: a page is cut only at the `limit` asked for.
    Asked,
    /// Nova's `[api] max_limit`: a page holds at most that many items whatever `limit` asks
    /// (and without one), a full page carries a `next` link (Nova's `_get_collection_links`:
    /// even when nothing follows; the next page is then empty), and errors are Nova's
    /// (`badRequest`).
    Nova(usize),
    /// Octavia's `[api_settings] pagination_max_limit`: a page holds at most that many items
    /// whatever `limit` asks (and without one; a `limit` below 1 asks for the maximum), and
    /// a full page carries a `next` link (Octavia's `PaginationHelper._make_links`:
    /// `len(page) >= limit`, so a full last page links to an empty one).
    Octavia(usize),
}

/// Filters and pages `items` as Neutron, Nova and Octavia do ([`Cap`]).
fn page(
    items: Vec<Value>,
    q: &[(String, String)],
    base: &str,
    links_key: &str,
    plural: &str,
    custom: &dyn Fn(&Value, &str, &str) -> Option<bool>,
    cap: Cap,
) -> Res<Value> {
    let nova_max = match cap {
        Cap::Nova(max) => Some(max),
        _ => None,
    };
    let svc = if nova_max.is_some() { Svc::Nova } else { Svc::Other };
    // A key given more than once matches any of its values (`?id=a&id=b`, as Neutron
    // filters); different keys must all match.
    let mut filters: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for (k, v) in q.iter().filter(|(k, _)| !PAGING_KEYS.contains(&k.as_str())) {
        filters.entry(k.as_str()).or_default().push(v.as_str());
    }
    let mut out: Vec<Value> = items
        .into_iter()
        .filter(|o| {
            filters.iter().all(|(k, values)| {
                values.iter().any(|v| {
                    custom(o, k, v).unwrap_or_else(|| {
                        let k = k.strip_prefix("tags-any").map(|_| "tags").unwrap_or(k);
                        field_matches(o, k, v)
                    })
                })
            })
        })
        .collect();
    let get = |k: &str| q.iter().find(|(kk, _)| kk == k).map(|(_, v)| v.clone());
    if let Some(marker) = get("marker") {
        match out.iter().position(|o| o["id"].as_str() == Some(marker.as_str())) {
            Some(i) => {
                out.drain(..=i);
            }
            None => return Err(svc.marker_error(&marker)),
        }
    }
    let mut links = vec![];
    let limit = get("limit")
        .map(|limit| {
            limit.parse::<usize>().map_err(|_| {
                let message = match nova_max {
                    Some(_) => format!(
                        "Invalid input for query parameters limit. Value: {limit}. {limit:?} is \
                         not a non-negative integer"
                    ),
                    None => format!("limit {limit:?}"),
                };
                err(svc, StatusCode::BAD_REQUEST, "BadRequest", message)
            })
        })
        .transpose()?;
    // Where the page ends, and whether it links to the next page.
    let next = match (cap, limit) {
        (Cap::Nova(max), limit) => {
            let limit = limit.unwrap_or(max).min(max);
            out.truncate(limit);
            limit > 0 && out.len() == limit
        }
        (Cap::Octavia(max), limit) => {
            let limit = limit.filter(|l| *l >= 1).unwrap_or(max).min(max).max(1);
            out.truncate(limit);
            out.len() >= limit
        }
        (Cap::Asked, Some(limit)) if limit > 0 && out.len() > limit => {
            out.truncate(limit);
            true
        }
        (Cap::Asked, _) => false,
    };
    if next {
        let last = out.last().and_then(|o| o["id"].as_str()).unwrap_or_default();
        let mut qs = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in q.iter().filter(|(k, _)| k != "marker") {
            qs.append_pair(k, v);
        }
        qs.append_pair("marker", last);
        links.push(json!({"rel": "next", "href": format!("{base}?{}", qs.finish())}));
    }
    let mut m = Map::new();
    m.insert(plural.into(), Value::Array(out));
    if !links.is_empty() {
        m.insert(links_key.into(), Value::Array(links));
    }
    Ok(Value::Object(m))
}

impl Svc {
    fn marker_error(self, marker: &str) -> Resp {
        err(self, StatusCode::BAD_REQUEST, "BadRequest", format!("marker [{marker}] not found"))
    }
}

/// What Keystone recorded about an issued token.
#[derive(Debug, Clone)]
struct TokenInfo {
    /// Expiry, UNIX seconds.
    expires: f64,
    /// The user's name.
    user: String,
    /// The project ID it is scoped to (None: unscoped or domain-scoped).
    project: Option<String>,
    /// Whether it carries the `admin` role.
    admin: bool,
}

/// The caller of a service API.
#[derive(Debug, Clone)]
struct Ctx {
    /// The token's project ID.
    project: String,
    /// Whether it is an admin.
    admin: bool,
    /// The token's user ID (Barbican's ACLs name users).
    user: String,
}

/// A user Keystone knows, as the token request sees it.
#[derive(Debug, Clone)]
struct Account {
    name: String,
    password: String,
    domain: String,
    /// Projects it has roles on (None: every project).
    projects: Option<Vec<String>>,
    roles: Vec<String>,
    default_project: Option<String>,
}

impl Account {
    fn on(&self, project: &str) -> bool {
        self.projects.as_ref().is_none_or(|p| p.iter().any(|x| x == project))
    }
}

fn accounts(opts: &OpenStackOptions) -> Vec<Account> {
    opts.users
        .iter()
        .map(|(n, p)| Account {
            name: n.clone(),
            password: p.clone(),
            domain: default_domain(),
            projects: None,
            roles: vec!["admin".into(), "member".into()],
            default_project: Some(opts.project.clone()),
        })
        .chain(opts.extra_users.iter().map(|u| Account {
            name: u.name.clone(),
            password: u.password.clone(),
            domain: u.domain.clone(),
            projects: Some(u.projects.clone()),
            roles: u.roles.clone(),
            default_project: u.default_project.clone(),
        }))
        .collect()
}

/// Every project: (name, domain name).
fn projects(opts: &OpenStackOptions) -> Vec<(String, String)> {
    std::iter::once((opts.project.clone(), default_domain()))
        .chain(opts.extra_projects.iter().map(|p| (p.name.clone(), p.domain.clone())))
        .collect()
}

/// Keystone's ID of the project named `name` (as tokens and the catalog show it).
pub fn keystone_project_id(name: &str) -> String {
    project_uuid(name)
}

/// Keystone's ID of the user named `name` (as `user-id` / `trustee-id` name it).
pub fn keystone_user_id(name: &str) -> String {
    user_id(name)
}

/// Keystone's ID of the domain named `name` (`default` for `Default`).
pub fn keystone_domain_id(name: &str) -> String {
    domain_id(name)
}

fn project_uuid(name: &str) -> String {
    uuid(&format!("project-{name}")).replace('-', "")
}

fn user_id(name: &str) -> String {
    uuid(&format!("user-{name}")).replace('-', "")
}

fn domain_id(name: &str) -> String {
    if name == "Default" {
        "default".into()
    } else {
        uuid(&format!("domain-{name}")).replace('-', "")
    }
}

/// The services' answer to a caller their policy refuses.
const POLICY_FORBIDDEN: &str = "Policy does not allow this request to be performed.";

#[derive(Debug, Default)]
struct State {
    /// Issued tokens.
    tokens: BTreeMap<String, TokenInfo>,
    tokens_issued: u64,
    /// server id → (world instance, network names of its ports).
    servers: Vec<(String, Instance)>,
    flavors: Vec<Value>,
    /// Neutron collections by URL name.
    neutron: BTreeMap<&'static str, Vec<Value>>,
    /// Octavia collections by URL name, plus `members`.
    octavia: BTreeMap<&'static str, Vec<Value>>,
    /// Octavia child id → its load balancer.
    lb_of: BTreeMap<String, String>,
    /// Load balancer id → its latest operation.
    lb_ops: BTreeMap<String, Operation>,
    /// Child id → the latest operation on that child (its own `ERROR` when it failed).
    child_ops: BTreeMap<String, Operation>,
    /// Children being deleted (collection, id): removed when their operation is done, left
    /// `ERROR` when it failed.
    deleting: Vec<(&'static str, String)>,
    seq: u64,
}

impl State {
    fn next_id(&mut self, kind: &str) -> String {
        self.seq += 1;
        uuid(&format!("{kind}-{}-{}", self.seq, now_secs()))
    }

    fn coll(&mut self, c: &str) -> &mut Vec<Value> {
        let key = NEUTRON.iter().map(|x| x.0).find(|x| *x == c).unwrap_or("networks");
        self.neutron.entry(key).or_default()
    }

    fn ocoll(&mut self, c: &str) -> &mut Vec<Value> {
        let key = OCTAVIA
            .iter()
            .map(|x| x.0)
            .chain(["members"])
            .find(|x| *x == c)
            .unwrap_or("loadbalancers");
        self.octavia.entry(key).or_default()
    }

    fn find(&self, c: &str, id: &str) -> Option<&Value> {
        self.neutron.get(c)?.iter().find(|o| o["id"].as_str() == Some(id))
    }
}

/// The OpenStack emulator (see the module doc). Start it with
/// `Server::start(OpenStackCloud::new(world, opts), ServerOptions::default())`.
pub struct OpenStackCloud {
    world: Mutex<World>,
    opts: Mutex<OpenStackOptions>,
    state: Mutex<State>,
    /// The load balancers' pending operations.
    pub ops: AsyncOps,
    /// Barbican's containers and secrets (TLS listeners name them).
    pub barbican: crate::openstack_barbican::Barbican,
}

impl std::fmt::Debug for OpenStackCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OpenStackCloud").finish_non_exhaustive()
    }
}

fn flavor_id(name: &str) -> String {
    uuid(&format!("flavor-{name}"))
}

fn flavor(name: &str) -> Value {
    let (vcpus, ram) = match name {
        "m1.tiny" => (1, 512),
        "m1.small" => (1, 2048),
        "m1.medium" => (2, 4096),
        "m1.large" => (4, 8192),
        _ => (2, 4096),
    };
    json!({"id": flavor_id(name), "name": name, "vcpus": vcpus, "ram": ram, "disk": 20,
        "OS-FLV-EXT-DATA:ephemeral": 0, "swap": "", "rxtx_factor": 1.0,
        "os-flavor-access:is_public": true, "links": []})
}

fn mac(seed: &str) -> String {
    let h = splitmix(fnv(seed));
    format!("fa:16:3e:{:02x}:{:02x}:{:02x}", (h >> 16) & 0xff, (h >> 8) & 0xff, h & 0xff)
}

impl OpenStackCloud {
    /// An emulator serving `world`.
    pub fn new(world: World, opts: OpenStackOptions) -> Arc<OpenStackCloud> {
        let ops = AsyncOps::new(opts.lb_pending);
        ops.set_realistic(OCTAVIA_REALISTIC);
        let cloud = OpenStackCloud {
            ops,
            world: Mutex::new(world),
            opts: Mutex::new(opts),
            state: Mutex::new(State::default()),
            barbican: Default::default(),
        };
        cloud.load();
        Arc::new(cloud)
    }

    /// The region.
    pub fn region(&self) -> String {
        let w = lock(&self.world);
        lock(&self.opts).region.clone().or_else(|| w.region.clone()).unwrap_or("RegionOne".into())
    }

    /// The project's ID.
    pub fn project_id(&self) -> String {
        project_uuid(&lock(&self.opts).project)
    }

    /// The server ID of the world instance named `name`.
    pub fn server_id(&self, name: &str) -> Option<String> {
        lock(&self.state).servers.iter().find(|(_, i)| i.name == name).map(|(id, _)| id.clone())
    }

    /// The ID of a Neutron network or subnet named `name` (`public` is the external network).
    pub fn neutron_id(&self, collection: &str, name: &str) -> Option<String> {
        let st = lock(&self.state);
        st.neutron
            .get(collection)?
            .iter()
            .find(|o| o["name"].as_str() == Some(name))
            .and_then(|o| o["id"].as_str().map(str::to_string))
    }

    /// A Neutron or Octavia collection as stored (e.g. `routers`, `loadbalancers`, `members`).
    pub fn objects(&self, collection: &str) -> Vec<Value> {
        let mut st = lock(&self.state);
        Self::purge(&mut st);
        st.neutron
            .get(collection)
            .or_else(|| st.octavia.get(collection))
            .cloned()
            .unwrap_or_default()
    }

    /// An Octavia collection as the API shows it: with `provisioning_status` and the links
    /// to its load balancer, pools and members (what [`Self::objects`] stores lacks them).
    pub fn octavia_objects(&self, collection: &str) -> Vec<Value> {
        let mut st = lock(&self.state);
        Self::purge(&mut st);
        st.octavia
            .get(collection)
            .into_iter()
            .flatten()
            .map(|o| Self::render(&st, collection, o))
            .collect()
    }

    /// Sets a server's power state (`stopped` is `SHUTOFF`). False when unknown.
    pub fn set_power(&self, name: &str, power: PowerState) -> bool {
        let mut st = lock(&self.state);
        match st.servers.iter_mut().find(|(_, i)| i.name == name) {
            Some((_, i)) => {
                i.power = power;
                i.tags.remove(STATUS_TAG);
                true
            }
            None => false,
        }
    }

    /// Sets a server's Nova status (one of [`NOVA_STATUSES`], e.g. `SUSPENDED`,
    /// `SHELVED_OFFLOADED`, `ERROR`; `DELETED` makes it answer 404). False when the server or
    /// the status is unknown.
    pub fn set_status(&self, name: &str, status: &str) -> bool {
        if !NOVA_STATUSES.contains(&status) {
            return false;
        }
        let mut st = lock(&self.state);
        match st.servers.iter_mut().find(|(_, i)| i.name == name) {
            Some((_, i)) => {
                i.tags.insert(STATUS_TAG.into(), status.into());
                true
            }
            None => false,
        }
    }

    /// Deletes a server and its ports. False when unknown.
    pub fn delete_server(&self, name: &str) -> bool {
        let mut st = lock(&self.state);
        let Some(pos) = st.servers.iter().position(|(_, i)| i.name == name) else {
            return false;
        };
        let (id, _) = st.servers.remove(pos);
        st.coll("ports").retain(|p| p["device_id"].as_str() != Some(id.as_str()));
        true
    }

    /// Adds a server (its subnet, zone and IPs as in a world file). Errors name what is wrong.
    pub fn add_server(&self, inst: Instance) -> Result<String, String> {
        let mut st = lock(&self.state);
        if st.servers.iter().any(|(_, i)| i.name == inst.name) {
            return Err(format!("server {:?} exists", inst.name));
        }
        let n = st.servers.len();
        add_server(&mut st, inst, n)
    }

    /// Adds a second (third…) interface to a server on the subnet named `subnet` with `ip`.
    pub fn add_interface(&self, server: &str, subnet: &str, ip: &str) -> Result<String, String> {
        let mut st = lock(&self.state);
        let id = st
            .servers
            .iter()
            .find(|(_, i)| i.name == server)
            .map(|(id, _)| id.clone())
            .ok_or_else(|| format!("no server {server:?}"))?;
        let sub = st
            .coll("subnets")
            .iter()
            .find(|s| s["name"].as_str() == Some(subnet))
            .cloned()
            .ok_or_else(|| format!("no subnet {subnet:?}"))?;
        let zone = st.servers.iter().find(|(i, _)| *i == id).map(|(_, i)| i.zone.clone());
        Ok(add_port(&mut st, &id, &sub, ip, zone.as_deref().unwrap_or("nova")))
    }

    /// Makes the first port of the server named `server` the parent of a new trunk whose
    /// sub-ports are new ports on the subnets named in `sub_ports` (subnet, fixed IP, VLAN
    /// ID), as `POST /v2.0/trunks` would; returns the trunk's ID.
    pub fn add_trunk(
        &self,
        server: &str,
        sub_ports: &[(&str, &str, u32)],
    ) -> Result<String, String> {
        let project = self.project_id();
        let mut st = lock(&self.state);
        let sid = st
            .servers
            .iter()
            .find(|(_, i)| i.name == server)
            .map(|(id, _)| id.clone())
            .ok_or_else(|| format!("no server {server:?}"))?;
        let parent = st
            .coll("ports")
            .iter()
            .find(|p| p["device_id"].as_str() == Some(sid.as_str()))
            .and_then(|p| p["id"].as_str().map(str::to_string))
            .ok_or_else(|| format!("server {server:?} has no port"))?;
        let mut subs = Vec::new();
        for (subnet, ip, vlan) in sub_ports {
            let sub = st
                .coll("subnets")
                .iter()
                .find(|s| s["name"].as_str() == Some(*subnet))
                .cloned()
                .ok_or_else(|| format!("no subnet {subnet:?}"))?;
            let port = add_port(&mut st, &format!("subport-{sid}"), &sub, ip, "nova");
            subs.push(
                json!({"port_id": port, "segmentation_type": "vlan", "segmentation_id": vlan}),
            );
        }
        let id = st.next_id("trunks");
        let now = format!("{}Z", civil(now_secs() as u64));
        let o = json!({"id": id, "tenant_id": project, "project_id": project, "description": "",
            "tags": [], "created_at": now, "updated_at": now, "revision_number": 0});
        let spec = json!({"port_id": parent, "name": format!("trunk-{server}"), "sub_ports": subs});
        let trunk =
            create_trunk(&mut st, &spec, o).map_err(|_| "the trunk was refused".to_string())?;
        st.coll("trunks").push(trunk);
        Ok(id)
    }

    /// Changes how long issued tokens live from now on.
    pub fn set_token_lifetime(&self, d: Duration) {
        lock(&self.opts).token_lifetime = d;
    }

    /// Sets the base URL of the catalog's Nova, Neutron and Octavia endpoints from now on
    /// ([`OpenStackOptions::catalog_base`]), e.g. the server's `https://` URL once it serves
    /// TLS (the catalog otherwise names `http://` and the request's `Host`).
    pub fn set_catalog_base(&self, base: Option<String>) {
        lock(&self.opts).catalog_base = base;
    }

    /// Expires every issued token now (the next call with one is a 401).
    pub fn expire_tokens(&self) {
        for t in lock(&self.state).tokens.values_mut() {
            t.expires = 0.0;
        }
    }

    /// How many tokens Keystone has issued.
    pub fn tokens_issued(&self) -> u64 {
        lock(&self.state).tokens_issued
    }

    /// Changes how long load balancers stay `PENDING_*` after changes made from now on
    /// (the `fast` profile's time, every action).
    pub fn set_lb_pending(&self, d: Duration) {
        self.ops.set_pending_for(d);
    }

    /// Sets Neutron's floating IP quota of every project from now on.
    pub fn set_floating_ip_quota(&self, n: usize) {
        lock(&self.opts).quotas.floatingip = n;
    }

    /// Completes every pending Octavia operation now (deletes take effect), so a test can
    /// hold load balancers `PENDING_*` for as long as it likes (a long `lb_pending`), look
    /// at what a provider does meanwhile, then let Octavia finish without waiting.
    pub fn complete_pending(&self) {
        let mut st = lock(&self.state);
        let deleting: Vec<String> = st
            .lb_ops
            .iter()
            .filter(|(lb, o)| {
                o.action == Action::Delete
                    && o.target == format!("loadbalancer/{lb}")
                    && o.phase() == Phase::Pending
            })
            .map(|(id, _)| id.clone())
            .collect();
        for lb in deleting {
            Self::remove_lb(&mut st, &lb);
        }
        let children = std::mem::take(&mut st.deleting);
        for (coll, id) in children {
            match st.child_ops.get(&id).map(Operation::phase) {
                Some(Phase::Failed(_)) => st.deleting.push((coll, id)),
                _ => Self::remove_child(&mut st, coll, &id),
            }
        }
        st.lb_ops.retain(|_, o| o.phase() != Phase::Pending);
        st.child_ops.retain(|_, o| o.phase() != Phase::Pending);
    }

    fn load(&self) {
        let world = lock(&self.world).clone();
        let opts = lock(&self.opts).clone();
        let project = uuid(&format!("project-{}", opts.project)).replace('-', "");
        let created = format!("{}Z", civil(now_secs() as u64));
        let mut st = State::default();
        let base = |name: &str, id: String| {
            json!({"id": id, "name": name, "tenant_id": project, "project_id": project,
                "description": "", "tags": [], "created_at": created, "updated_at": created,
                "revision_number": 0})
        };
        // Networks.
        let mut nets: Vec<(String, Option<String>)> =
            world.networks.iter().map(|n| (n.name.clone(), n.cidr.clone())).collect();
        if nets.is_empty() {
            nets.push(("private".into(), Some("10.0.0.0/16".into())));
        }
        for (name, _) in &nets {
            let mut n = base(name, uuid(&format!("network-{name}")));
            merge(
                &mut n,
                json!({"admin_state_up": true, "status": "ACTIVE", "shared": false,
                "router:external": false, "mtu": 1450, "subnets": [], "availability_zones": ["nova"],
                "port_security_enabled": true}),
            );
            st.coll("networks").push(n);
        }
        let mut public = base("public", uuid("network-public"));
        merge(
            &mut public,
            json!({"admin_state_up": true, "status": "ACTIVE", "shared": false,
            "router:external": true, "mtu": 1500, "subnets": [uuid("subnet-public-subnet")],
            "availability_zones": ["nova"], "port_security_enabled": true}),
        );
        st.coll("networks").push(public);
        // Subnets.
        let mut subs: Vec<(String, String, String)> = world
            .subnets
            .iter()
            .enumerate()
            .map(|(i, s)| {
                (
                    s.name.clone(),
                    s.network.clone().unwrap_or_else(|| nets[0].0.clone()),
                    s.cidr.clone().unwrap_or_else(|| format!("10.0.{i}.0/24")),
                )
            })
            .collect();
        if subs.is_empty() {
            subs.push(("private-subnet".into(), nets[0].0.clone(), "10.0.0.0/24".into()));
        }
        subs.push(("public-subnet".into(), "public".into(), "172.24.4.0/24".into()));
        for p in &opts.public_subnets {
            subs.push((p.name.clone(), "public".into(), p.cidr.clone()));
        }
        for (name, net, cidr) in &subs {
            let id = uuid(&format!("subnet-{name}"));
            let net_id = uuid(&format!("network-{net}"));
            let mut s = base(name, id.clone());
            merge(
                &mut s,
                json!({"network_id": net_id, "cidr": cidr,
                "ip_version": if cidr.contains(':') { 6 } else { 4 },
                "gateway_ip": nth_host(cidr, 1), "enable_dhcp": true, "dns_nameservers": [],
                "allocation_pools": default_pool(cidr),
                "host_routes": [], "ipv6_address_mode": null, "ipv6_ra_mode": null,
                "subnetpool_id": null}),
            );
            st.coll("subnets").push(s);
            if net != "public" || name != "public-subnet" {
                for n in st.coll("networks").iter_mut() {
                    if n["id"].as_str() == Some(net_id.as_str())
                        && let Some(a) = n["subnets"].as_array_mut()
                    {
                        a.push(Value::String(id.clone()));
                    }
                }
            }
        }
        // The router.
        let mut r = base("router1", uuid("router-router1"));
        merge(
            &mut r,
            json!({"admin_state_up": true, "status": "ACTIVE", "routes": [],
            "distributed": false, "ha": false, "availability_zones": ["nova"],
            "external_gateway_info": {"network_id": uuid("network-public"), "enable_snat": true,
                "external_fixed_ips": [{"subnet_id": uuid("subnet-public-subnet"),
                    "ip_address": "172.24.4.1"}]}}),
        );
        st.coll("routers").push(r);
        // The default security group.
        let sg = security_group(&mut st, &project, "default", "Default security group");
        st.coll("security-groups").push(sg);
        // Flavors.
        let mut flavors: BTreeSet<String> = ["m1.tiny", "m1.small", "m1.medium", "m1.large"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        for i in &world.instances {
            if let Some(t) = &i.instance_type {
                flavors.insert(t.clone());
            }
        }
        st.flavors = flavors.iter().map(|f| flavor(f)).collect();
        for (n, i) in world.instances.iter().enumerate() {
            // World entries were checked when the world loaded; a bad one is skipped.
            let _ = add_server(&mut st, i.clone(), n);
        }
        *lock(&self.state) = st;
    }

    /// The caller of a service API: a token this emulator issued, not expired (else 401),
    /// scoped to a project (an unscoped token is a 403, as the services' policies answer a
    /// request without a project).
    fn check_token(&self, req: &Request<Bytes>, svc: Svc) -> Res<Ctx> {
        let tok = req.headers().get("x-auth-token").and_then(|v| v.to_str().ok());
        let st = lock(&self.state);
        let unauthorized = || {
            err(
                svc,
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "The request you have made requires authentication.",
            )
        };
        let t = tok.and_then(|t| st.tokens.get(t)).ok_or_else(unauthorized)?;
        if t.expires <= now_secs() {
            return Err(unauthorized());
        }
        let project = t.project.clone().ok_or_else(|| {
            err(svc, StatusCode::FORBIDDEN, "PolicyNotAuthorized", POLICY_FORBIDDEN)
        })?;
        Ok(Ctx { project, admin: t.admin, user: user_id(&t.user) })
    }

    fn state_json(&self) -> Value {
        let st = lock(&self.state);
        json!({
            "region": self.region(),
            "tokens_issued": st.tokens_issued,
            "servers": st.servers.iter().map(|(id, i)| json!({"id": id, "name": i.name, "zone": i.zone, "power": i.power})).collect::<Vec<_>>(),
            "neutron": st.neutron,
            "octavia": st.octavia,
        })
    }
}

fn merge(into: &mut Value, from: Value) {
    if let (Some(a), Value::Object(b)) = (into.as_object_mut(), from) {
        for (k, v) in b {
            a.insert(k, v);
        }
    }
}

fn security_group(st: &mut State, project: &str, name: &str, description: &str) -> Value {
    let id = if name == "default" { uuid("sg-default") } else { st.next_id("sg") };
    let rules: Vec<Value> = ["IPv4", "IPv6"]
        .iter()
        .map(|e| {
            let rid = st.next_id("sgr");
            rule(&rid, &id, project, json!({"direction": "egress", "ethertype": e}))
        })
        .collect();
    for r in &rules {
        st.coll("security-group-rules").push(r.clone());
    }
    let t = format!("{}Z", civil(now_secs() as u64));
    json!({"id": id, "name": name, "description": description, "tenant_id": project,
        "project_id": project, "security_group_rules": rules, "tags": [], "stateful": true,
        "created_at": t, "updated_at": t, "revision_number": 0})
}

fn rule(id: &str, sg: &str, project: &str, spec: Value) -> Value {
    let t = format!("{}Z", civil(now_secs() as u64));
    let mut r = json!({"id": id, "security_group_id": sg, "tenant_id": project,
        "project_id": project, "direction": "ingress", "ethertype": "IPv4", "protocol": null,
        "port_range_min": null, "port_range_max": null, "remote_ip_prefix": null,
        "remote_group_id": null, "description": "", "created_at": t, "updated_at": t,
        "revision_number": 0});
    merge(&mut r, spec);
    r
}

fn add_port(st: &mut State, device: &str, subnet: &Value, ip: &str, zone: &str) -> String {
    let id = uuid(&format!("port-{device}-{ip}"));
    let t = format!("{}Z", civil(now_secs() as u64));
    let project = subnet["project_id"].clone();
    let p = json!({"id": id, "name": "", "network_id": subnet["network_id"], "tenant_id": project,
        "project_id": project, "mac_address": mac(&id), "admin_state_up": true,
        "status": "ACTIVE", "device_id": device, "device_owner": format!("compute:{zone}"),
        "fixed_ips": [{"subnet_id": subnet["id"], "ip_address": ip}],
        "allowed_address_pairs": [], "security_groups": [uuid("sg-default")],
        "port_security_enabled": true, "tags": [], "description": "",
        "binding:vnic_type": "normal", "created_at": t, "updated_at": t, "revision_number": 0});
    st.coll("ports").push(p);
    id
}

fn add_server(st: &mut State, inst: Instance, n: usize) -> Result<String, String> {
    let subnet = match &inst.subnet {
        Some(s) => st
            .coll("subnets")
            .iter()
            .find(|x| x["name"].as_str() == Some(s.as_str()))
            .cloned()
            .ok_or_else(|| format!("server {:?}: no subnet {s:?}", inst.name))?,
        None => st.coll("subnets").first().cloned().ok_or("no subnet")?,
    };
    let id = inst.id.clone().unwrap_or_else(|| uuid(&format!("server-{}", inst.name)));
    let ips: Vec<String> = if inst.private_ips.is_empty() {
        vec![nth_host(subnet["cidr"].as_str().unwrap_or("10.0.0.0/24"), 10 + n as u32)]
    } else {
        inst.private_ips.iter().map(|i| i.to_string()).collect()
    };
    let mut port_ids = vec![];
    for ip in &ips {
        port_ids.push(add_port(st, &id, &subnet, ip, &inst.zone));
    }
    for (k, fip) in inst.public_ips.iter().enumerate() {
        let fid = uuid(&format!("fip-{id}-{fip}"));
        let t = format!("{}Z", civil(now_secs() as u64));
        let f = json!({"id": fid, "floating_ip_address": fip.to_string(),
            "floating_network_id": uuid("network-public"), "router_id": uuid("router-router1"),
            "port_id": port_ids[k.min(port_ids.len() - 1)], "fixed_ip_address": ips[k.min(ips.len() - 1)],
            "status": "ACTIVE", "tenant_id": subnet["project_id"], "project_id": subnet["project_id"],
            "description": "", "tags": [], "created_at": t, "updated_at": t, "revision_number": 0});
        st.coll("floatingips").push(f);
    }
    st.servers.push((id.clone(), inst));
    Ok(id)
}

/// The world instance tag that sets a server's Nova status (`openstack.status: SUSPENDED`);
/// not shown in the server's metadata.
pub const STATUS_TAG: &str = "openstack.status";

/// The Nova statuses a world (tag [`STATUS_TAG`]) or [`OpenStackCloud::set_status`] may set.
pub const NOVA_STATUSES: &[&str] = &[
    "ACTIVE",
    "BUILD",
    "DELETED",
    "ERROR",
    "HARD_REBOOT",
    "MIGRATING",
    "PAUSED",
    "REBOOT",
    "REBUILD",
    "RESCUE",
    "RESIZE",
    "REVERT_RESIZE",
    "SHELVED",
    "SHELVED_OFFLOADED",
    "SHUTOFF",
    "SOFT_DELETED",
    "SUSPENDED",
    "UNKNOWN",
    "VERIFY_RESIZE",
];

/// A server's Nova status: its [`STATUS_TAG`], else from its power state (`stopped` is
/// `SHUTOFF`, `terminated` is `DELETED`).
fn server_status(inst: &Instance) -> &'static str {
    if let Some(s) = inst.tags.get(STATUS_TAG) {
        let up = s.to_uppercase();
        if let Some(known) = NOVA_STATUSES.iter().find(|k| **k == up) {
            return known;
        }
    }
    match inst.power {
        PowerState::Running => "ACTIVE",
        PowerState::Stopped => "SHUTOFF",
        PowerState::Terminated => "DELETED",
    }
}

/// `OS-EXT-STS:vm_state` and `OS-EXT-STS:power_state` (0 NOSTATE, 1 RUNNING, 3 PAUSED,
/// 4 SHUTDOWN, 7 SUSPENDED) of a status.
fn nova_states(status: &str) -> (&'static str, u8) {
    match status {
        "ACTIVE" | "REBOOT" | "HARD_REBOOT" | "MIGRATING" | "REBUILD" => ("active", 1),
        "BUILD" => ("building", 0),
        "ERROR" => ("error", 0),
        "PAUSED" => ("paused", 3),
        "SUSPENDED" => ("suspended", 7),
        "SHELVED" => ("shelved", 4),
        "SHELVED_OFFLOADED" => ("shelved_offloaded", 4),
        "RESCUE" => ("rescued", 1),
        "RESIZE" | "VERIFY_RESIZE" | "REVERT_RESIZE" => ("resized", 1),
        "SOFT_DELETED" => ("soft-delete", 4),
        "DELETED" => ("deleted", 4),
        "SHUTOFF" => ("stopped", 4),
        _ => ("active", 0),
    }
}

/// The microversion a Nova request asks for (`2.1` when none).
fn microversion(req: &Request<Bytes>) -> (u32, u32) {
    let h = req
        .headers()
        .get("openstack-api-version")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("compute "))
        .or_else(|| {
            req.headers().get("x-openstack-nova-api-version").and_then(|v| v.to_str().ok())
        });
    let v = match h {
        Some("latest") => "2.96",
        Some(v) => v.trim(),
        None => "2.1",
    };
    let (a, b) = v.split_once('.').unwrap_or(("2", "1"));
    (a.parse().unwrap_or(2), b.parse().unwrap_or(1))
}

/// Octavia's `realistic` timing (amphora provider): a create boots an amphora VM through Nova
/// and waits for its agent (tens of seconds; Octavia bounds the wait by
/// `[controller_worker] amp_active_retries` × `amp_active_wait_sec`), a change reconfigures
/// HAProxy on the amphora (seconds), a delete tears the VM and its ports down.
pub const OCTAVIA_REALISTIC: Timing = Timing {
    create: Duration::from_secs(45),
    update: Duration::from_secs(10),
    delete: Duration::from_secs(15),
};

/// The newest Octavia API minor version this emulator claims (`v2.<n>`).
pub const OCTAVIA_MAX_MINOR: u32 = 27;

/// When each Octavia v2 minor version appeared (nominal dates; clients read only `id` and
/// `status`).
const OCTAVIA_VERSION_DATES: [&str; OCTAVIA_MAX_MINOR as usize + 1] = [
    "2016-12-11",
    "2018-04-20",
    "2018-07-31",
    "2018-12-18",
    "2018-12-19",
    "2019-01-21",
    "2019-01-25",
    "2019-01-25",
    "2019-02-12",
    "2019-03-04",
    "2019-03-05",
    "2019-06-24",
    "2019-09-11",
    "2019-09-13",
    "2019-10-12",
    "2020-03-10",
    "2020-03-15",
    "2020-03-28",
    "2020-04-29",
    "2020-05-12",
    "2020-08-24",
    "2020-09-03",
    "2021-04-22",
    "2021-05-14",
    "2021-06-09",
    "2021-10-02",
    "2022-08-29",
    "2023-05-05",
];

/// Octavia's version discovery (`GET /`): every v2 minor version up to `max_minor`
/// ([`OpenStackOptions::octavia_max_minor`]), the newest `CURRENT`, the others `SUPPORTED`,
/// each linking the one `/v2` endpoint (minor versions share it).
fn octavia_versions(base: &str, max_minor: u32) -> Value {
    let versions: Vec<Value> = OCTAVIA_VERSION_DATES
        .iter()
        .enumerate()
        .take(max_minor as usize + 1)
        .map(|(minor, date)| {
            let status = if minor == max_minor as usize { "CURRENT" } else { "SUPPORTED" };
            json!({"id": format!("v2.{minor}"), "status": status,
                "updated": format!("{date}T00:00:00Z"),
                "links": [{"rel": "self", "href": format!("{base}/load-balancer/v2")}]})
        })
        .collect();
    json!({ "versions": versions })
}

fn body_json(req: &Request<Bytes>, svc: Svc) -> Res<Value> {
    serde_json::from_slice(req.body()).map_err(|e| {
        err(svc, StatusCode::BAD_REQUEST, "BadRequest", format!("Malformed request body: {e}"))
    })
}

fn host_base(req: &Request<Bytes>) -> String {
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .unwrap_or("127.0.0.1")
        .to_string();
    format!("http://{host}")
}

impl OpenStackCloud {
    fn handle(&self, op: &str, req: &Request<Bytes>) -> Res<Resp> {
        let path = req.uri().path().to_string();
        let svc = service(&path);
        let segs: Vec<String> = path.trim_matches('/').split('/').map(str::to_string).collect();
        let base = host_base(req);
        match op {
            "keystone.versions" => return Ok(self.keystone_versions(&base, segs.len() == 1)),
            "keystone.tokens.create" => return self.token(req, &base),
            "nova.versions" => {
                return Ok(reply(
                    StatusCode::OK,
                    &json!({"version": {"id": "v2.1", "status": "CURRENT",
                    "version": "2.96", "min_version": "2.1", "updated": "2013-07-23T11:33:21Z",
                    "links": [{"rel": "self", "href": format!("{base}/compute/v2.1/")}]}}),
                ));
            }
            "neutron.versions" => {
                return Ok(reply(
                    StatusCode::OK,
                    &json!({"versions": [{"id": "v2.0", "status": "CURRENT",
                    "links": [{"rel": "self", "href": format!("{base}/network/v2.0/")}]}]}),
                ));
            }
            "octavia.versions" => {
                let max = lock(&self.opts).octavia_max_minor;
                return Ok(reply(StatusCode::OK, &octavia_versions(&base, max)));
            }
            _ => {}
        }
        if op == "barbican.versions" {
            let caller = crate::openstack_barbican::Caller { project: "", user: "", admin: false };
            let (status, v) = self.barbican.handle(op, &segs, &base, &caller, None);
            return Ok(reply(status, &v));
        }
        let ctx = self.check_token(req, svc)?;
        if op.starts_with("barbican.") {
            let caller = crate::openstack_barbican::Caller {
                project: &ctx.project,
                user: &ctx.user,
                admin: ctx.admin,
            };
            let body: Option<Value> = serde_json::from_slice(req.body()).ok();
            let (status, v) = self.barbican.handle(op, &segs, &base, &caller, body.as_ref());
            return Ok(reply(status, &v));
        }
        let q = query(req.uri().query());
        match svc {
            Svc::Nova => self.nova(op, &segs, &q, req, &base, &ctx),
            Svc::Neutron => self.neutron(op, &segs, &q, req, &base, &ctx),
            Svc::Octavia => self.octavia(op, &segs, &q, req, &base, &ctx),
            _ => {
                Err(err(svc, StatusCode::NOT_FOUND, "NotFound", "The resource could not be found."))
            }
        }
    }

    fn keystone_versions(&self, base: &str, root: bool) -> Resp {
        let v3 = json!({"id": "v3.14", "status": "stable", "updated": "2020-04-07T00:00:00Z",
            "links": [{"rel": "self", "href": format!("{base}/identity/v3/")}],
            "media-types": [{"base": "application/json",
                "type": "application/vnd.openstack.identity-v3+json"}]});
        if root {
            reply(StatusCode::MULTIPLE_CHOICES, &json!({"versions": {"values": [v3]}}))
        } else {
            reply(StatusCode::OK, &json!({"version": v3}))
        }
    }

    fn token(&self, req: &Request<Bytes>, base: &str) -> Res<Resp> {
        let svc = Svc::Keystone;
        let unauthorized = || {
            err(
                svc,
                StatusCode::UNAUTHORIZED,
                "Unauthorized",
                "The request you have made requires authentication.",
            )
        };
        let bad = |m: &str| err(svc, StatusCode::BAD_REQUEST, "BadRequest", m);
        let b = body_json(req, svc)?;
        let ident = &b["auth"]["identity"];
        let methods: Vec<String> = ident["methods"]
            .as_array()
            .map(|a| a.iter().filter_map(|m| m.as_str().map(str::to_string)).collect())
            .unwrap_or_default();
        let opts = lock(&self.opts).clone();
        let accounts = accounts(&opts);
        let domain_matches = |d: &Value, domain: &str| {
            d["name"].as_str().is_none_or(|n| n == domain)
                && d["id"].as_str().is_none_or(|i| i == domain_id(domain))
        };
        // The authenticated user, and the project a request without scope gets (if any).
        let (user, app_cred_project): (Account, Option<String>) =
            if methods.iter().any(|m| m == "password") {
                let u = &ident["password"]["user"];
                let pw = u["password"].as_str().unwrap_or_default();
                let found = match (u["id"].as_str(), u["name"].as_str()) {
                    (Some(id), _) => accounts.iter().find(|a| user_id(&a.name) == id),
                    (None, Some(name)) => {
                        // A user by name is looked up in the domain the request names: the same
                        // name in another domain is another user (401).
                        if !u["domain"].is_object() {
                            return Err(bad("Expecting to find domain in user."));
                        }
                        accounts
                            .iter()
                            .find(|a| a.name == name && domain_matches(&u["domain"], &a.domain))
                    }
                    (None, None) => return Err(bad("Expecting to find id or name in user.")),
                };
                match found {
                    Some(a) if a.password == pw => (a.clone(), None),
                    _ => return Err(unauthorized()),
                }
            } else if methods.iter().any(|m| m == "application_credential") {
                let c = &ident["application_credential"];
                let secret = c["secret"].as_str().unwrap_or_default();
                let a = if let Some(id) = c["id"].as_str() {
                    if !opts.app_creds.iter().any(|(i, s)| i == id && s == secret) {
                        return Err(unauthorized());
                    }
                    accounts.first().cloned().ok_or_else(unauthorized)?
                } else if let Some(name) = c["name"].as_str() {
                    // A name is unique per user only: the request must name the user.
                    let u = &c["user"];
                    if !u.is_object() {
                        return Err(bad("Expecting to find user in application credential."));
                    }
                    let owner = match (u["id"].as_str(), u["name"].as_str()) {
                        (Some(id), _) => accounts.iter().find(|a| user_id(&a.name) == id),
                        (None, Some(n)) => {
                            if !u["domain"].is_object() {
                                return Err(bad("Expecting to find domain in user."));
                            }
                            accounts
                                .iter()
                                .find(|a| a.name == n && domain_matches(&u["domain"], &a.domain))
                        }
                        (None, None) => return Err(bad("Expecting to find id or name in user.")),
                    };
                    let owner = owner.ok_or_else(unauthorized)?;
                    if !opts
                        .app_cred_names
                        .iter()
                        .any(|(n, who, s)| n == name && *who == owner.name && s == secret)
                    {
                        return Err(unauthorized());
                    }
                    owner.clone()
                } else {
                    return Err(bad("Expecting to find id or name in application credential."));
                };
                // An application credential is always scoped to its own project.
                let project = a.default_project.clone().unwrap_or_else(|| opts.project.clone());
                (a, Some(project))
            } else if methods.iter().any(|m| m == "token") {
                let t = ident["token"]["id"].as_str().unwrap_or_default();
                let user = lock(&self.state)
                    .tokens
                    .get(t)
                    .filter(|x| x.expires > now_secs())
                    .map(|x| x.user.clone())
                    .ok_or_else(unauthorized)?;
                let a =
                    accounts.iter().find(|a| a.name == user).cloned().ok_or_else(unauthorized)?;
                (a, None)
            } else {
                return Err(bad("Expecting to find identity methods in auth."));
            };
        // The scope: a project (by ID, or by name in a domain), a trust, or none.
        let scope = &b["auth"]["scope"];
        let projects = projects(&opts);
        let mut trust = None;
        let mut domain_scope: Option<String> = None;
        let (project, roles): (Option<(String, String)>, Vec<String>) = if let Some(t) =
            scope.get("OS-TRUST:trust")
        {
            let id = t["id"].as_str().unwrap_or_default();
            let tr = opts.trusts.iter().find(|x| x.id == id).ok_or_else(|| {
                err(svc, StatusCode::NOT_FOUND, "NotFound", format!("Could not find trust: {id}."))
            })?;
            if tr.trustee != user.name {
                return Err(err(
                    svc,
                    StatusCode::FORBIDDEN,
                    "Forbidden",
                    format!("User {} is not a trustee for trust {id}.", user_id(&user.name)),
                ));
            }
            let p =
                projects.iter().find(|p| p.0 == tr.project).cloned().ok_or_else(unauthorized)?;
            trust = Some(tr.clone());
            (Some(p), tr.roles.clone())
        } else if let Some(p) = scope.get("project") {
            let found = match (p["id"].as_str(), p["name"].as_str()) {
                (Some(id), _) => projects.iter().find(|x| project_uuid(&x.0) == id),
                (None, Some(name)) => projects.iter().find(|x| {
                    x.0 == name && (!p["domain"].is_object() || domain_matches(&p["domain"], &x.1))
                }),
                (None, None) => return Err(bad("Expecting to find id or name in project.")),
            };
            // An unknown project, or one the user has no role on, is a 401.
            let p = found.filter(|x| user.on(&x.0)).cloned().ok_or_else(unauthorized)?;
            (Some(p), user.roles.clone())
        } else if scope.is_null() || scope == "unscoped" {
            let default = if scope == "unscoped" {
                None
            } else {
                app_cred_project.or_else(|| user.default_project.clone())
            };
            let p = default.and_then(|d| projects.iter().find(|x| x.0 == d).cloned());
            let roles = if p.is_some() { user.roles.clone() } else { Vec::new() };
            (p, roles)
        } else if let Some(d) = scope.get("domain") {
            // A domain scope: a known domain (by ID or name) the user has a role on, else
            // 401. The token has the domain, roles and a catalog but no project, so every
            // project-scoped API (Nova, Neutron, Octavia, Barbican) refuses it (403).
            let known: BTreeSet<String> = std::iter::once(default_domain())
                .chain(accounts.iter().map(|a| a.domain.clone()))
                .chain(projects.iter().map(|p| p.1.clone()))
                .collect();
            let found = match (d["id"].as_str(), d["name"].as_str()) {
                (Some(id), _) => known.iter().find(|x| domain_id(x) == id),
                (None, Some(name)) => known.iter().find(|x| x.as_str() == name),
                (None, None) => return Err(bad("Expecting to find id or name in domain.")),
            };
            let dom = found
                .filter(|x| opts.domain_roles.iter().any(|(u, dd)| *u == user.name && dd == *x))
                .cloned()
                .ok_or_else(unauthorized)?;
            domain_scope = Some(dom);
            (None, user.roles.clone())
        } else {
            // System scope: no project, so no service API accepts the token.
            (None, Vec::new())
        };
        let region = self.region();
        let life = opts.token_lifetime.as_secs_f64().max(1.0);
        let now = now_secs();
        let token = {
            let mut st = lock(&self.state);
            st.tokens_issued += 1;
            let t = format!("gAAAAA{}", st.next_id("token").replace('-', ""));
            st.tokens.insert(
                t.clone(),
                TokenInfo {
                    expires: now + life,
                    user: user.name.clone(),
                    project: project.as_ref().map(|p| project_uuid(&p.0)),
                    admin: roles.iter().any(|r| r == "admin"),
                },
            );
            t
        };
        let ep = |ty: &str, name: &str, url: String| {
            let endpoints: Vec<Value> = ["public", "internal", "admin"]
                .iter()
                .map(|i| {
                    json!({"id": uuid(&format!("ep-{ty}-{i}")), "interface": i, "region": region,
                    "region_id": region, "url": url})
                })
                .collect();
            json!({"type": ty, "name": name, "id": uuid(&format!("svc-{ty}")), "endpoints": endpoints})
        };
        let services = opts.catalog_base.as_deref().unwrap_or(base);
        let catalog = vec![
            ep("identity", "keystone", format!("{base}/identity")),
            ep("compute", "nova", format!("{services}/compute/v2.1")),
            ep("network", "neutron", format!("{services}/network")),
            ep("load-balancer", "octavia", format!("{services}/load-balancer")),
            ep("key-manager", "barbican", format!("{services}/key-manager")),
        ];
        let mut body = json!({"token": {
            "methods": methods,
            "user": {"id": user_id(&user.name), "name": user.name,
                "domain": {"id": domain_id(&user.domain), "name": user.domain},
                "password_expires_at": null},
            "audit_ids": [uuid(&token)[..22].to_string()],
            "issued_at": format!("{}.000000Z", civil(now as u64)),
            "expires_at": format!("{}.000000Z", civil((now + life) as u64)),
        }});
        // Only a scoped token has a project, roles and a catalog.
        if let Some((name, domain)) = &project {
            body["token"]["project"] = json!({"id": project_uuid(name), "name": name,
                "domain": {"id": domain_id(domain), "name": domain}});
            body["token"]["roles"] = Value::Array(
                roles
                    .iter()
                    .map(|r| json!({"id": uuid(&format!("role-{r}")).replace('-', ""), "name": r}))
                    .collect(),
            );
            body["token"]["is_domain"] = json!(false);
            body["token"]["catalog"] = Value::Array(catalog);
        } else if let Some(domain) = &domain_scope {
            // A domain-scoped token: the domain, its roles and the catalog.
            body["token"]["domain"] = json!({"id": domain_id(domain), "name": domain});
            body["token"]["roles"] = Value::Array(
                roles
                    .iter()
                    .map(|r| json!({"id": uuid(&format!("role-{r}")).replace('-', ""), "name": r}))
                    .collect(),
            );
            body["token"]["catalog"] = Value::Array(catalog);
        }
        if let Some(tr) = &trust {
            body["token"]["OS-TRUST:trust"] = json!({"id": tr.id,
                "impersonation": tr.impersonation,
                "trustee_user": {"id": user_id(&tr.trustee)},
                "trustor_user": {"id": user_id(&tr.trustor)}});
        }
        let mut r = reply(StatusCode::CREATED, &body);
        if let Ok(v) = HeaderValue::from_str(&token) {
            r.headers_mut().insert("x-subject-token", v);
        }
        Ok(r)
    }

    fn server_json(&self, st: &State, id: &str, inst: &Instance, mv: (u32, u32)) -> Value {
        let ports: Vec<&Value> = st
            .neutron
            .get("ports")
            .map(|p| p.iter().filter(|p| p["device_id"].as_str() == Some(id)).collect())
            .unwrap_or_default();
        self.server_json_with_ports(st, id, inst, mv, ports)
    }

    /// The ports of every server, by `device_id`, for a listing: one pass over the ports
    /// instead of one per server (a 1000-server page rendered 1000 × 1000 port lookups).
    fn ports_by_device(st: &State) -> HashMap<&str, Vec<&Value>> {
        let mut by: HashMap<&str, Vec<&Value>> = HashMap::new();
        for p in st.neutron.get("ports").into_iter().flatten() {
            if let Some(d) = p["device_id"].as_str() {
                by.entry(d).or_default().push(p);
            }
        }
        by
    }

    /// [`Self::server_json`] with the server's ports already found.
    fn server_json_with_ports(
        &self,
        st: &State,
        id: &str,
        inst: &Instance,
        mv: (u32, u32),
        ports: Vec<&Value>,
    ) -> Value {
        let project = self.project_id();
        let mut addresses: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for p in ports {
            let net = st
                .find("networks", p["network_id"].as_str().unwrap_or_default())
                .and_then(|n| n["name"].as_str())
                .unwrap_or("private")
                .to_string();
            let entry = addresses.entry(net).or_default();
            for f in p["fixed_ips"].as_array().into_iter().flatten() {
                entry.push(json!({"version": 4, "addr": f["ip_address"],
                    "OS-EXT-IPS:type": "fixed", "OS-EXT-IPS-MAC:mac_addr": p["mac_address"]}));
            }
            for fip in st.neutron.get("floatingips").into_iter().flatten() {
                if fip["port_id"] == p["id"] {
                    entry.push(json!({"version": 4, "addr": fip["floating_ip_address"],
                        "OS-EXT-IPS:type": "floating", "OS-EXT-IPS-MAC:mac_addr": p["mac_address"]}));
                }
            }
        }
        let fname = inst.instance_type.clone().unwrap_or_else(|| "m1.small".into());
        let fl = flavor(&fname);
        let flavor = if mv >= (2, 47) {
            json!({"original_name": fname, "vcpus": fl["vcpus"], "ram": fl["ram"], "disk": 20,
                "ephemeral": 0, "swap": 0, "extra_specs": {}})
        } else {
            json!({"id": fl["id"], "links": []})
        };
        let status = server_status(inst);
        let (vm_state, power_state) = nova_states(status);
        let metadata: BTreeMap<&String, &String> =
            inst.tags.iter().filter(|(k, _)| k.as_str() != STATUS_TAG).collect();
        let created = format!("{}Z", civil(1_700_000_000));
        json!({
            "id": id, "name": inst.name, "status": status, "tenant_id": project,
            "user_id": uuid("user-admin").replace('-', ""), "metadata": metadata,
            "hostId": format!("{:x}", fnv(&inst.zone)), "image": "", "flavor": flavor,
            "created": created, "updated": created, "addresses": addresses,
            "accessIPv4": "", "accessIPv6": "", "progress": 0, "key_name": null,
            "links": [], "OS-EXT-AZ:availability_zone": inst.zone,
            "OS-EXT-STS:power_state": power_state,
            "OS-EXT-STS:vm_state": vm_state,
            "OS-EXT-STS:task_state": null, "OS-DCF:diskConfig": "MANUAL",
            "security_groups": [{"name": "default"}], "os-extended-volumes:volumes_attached": [],
            "config_drive": "", "tags": [],
        })
    }

    fn nova(
        &self,
        op: &str,
        segs: &[String],
        q: &[(String, String)],
        req: &Request<Bytes>,
        base: &str,
        ctx: &Ctx,
    ) -> Res<Resp> {
        let svc = Svc::Nova;
        let mv = microversion(req);
        // Read before the state lock (never both held in the other order).
        let nova_max = lock(&self.opts).nova_max_limit.max(1);
        let st = lock(&self.state);
        let mut r = match op {
            "nova.servers.list" => {
                // The world's servers are the default project's: another project's token sees
                // none. A deleted server is listed only with `deleted=true`, for an admin (and
                // then only deleted ones).
                let deleted = ctx.admin
                    && q.iter().any(|(k, v)| {
                        k == "deleted" && matches!(v.as_str(), "true" | "True" | "1")
                    });
                let mine = ctx.project == self.project_id();
                let mut ports = Self::ports_by_device(&st);
                let items: Vec<Value> = st
                    .servers
                    .iter()
                    .filter(|_| mine)
                    .filter(|(_, i)| (server_status(i) == "DELETED") == deleted)
                    .map(|(id, i)| {
                        let own = ports.remove(id.as_str()).unwrap_or_default();
                        self.server_json_with_ports(&st, id, i, mv, own)
                    })
                    .collect();
                let custom = |o: &Value, k: &str, v: &str| -> Option<bool> {
                    match k {
                        "name" => Some(name_matches(v, o["name"].as_str().unwrap_or_default())),
                        "availability_zone" => {
                            Some(o["OS-EXT-AZ:availability_zone"].as_str() == Some(v))
                        }
                        "all_tenants" | "deleted" => Some(true),
                        "ip" => Some(o["addresses"].to_string().contains(v)),
                        _ => None,
                    }
                };
                // Nova pages at its `[api] max_limit`; an unknown marker is its 400
                // `badRequest` "marker [<id>] not found".
                let v = page(
                    items,
                    q,
                    &format!("{base}/compute/v2.1/servers/detail"),
                    "servers_links",
                    "servers",
                    &custom,
                    Cap::Nova(nova_max),
                )?;
                reply(StatusCode::OK, &v)
            }
            "nova.servers.get" => {
                let id = &segs[3];
                // A deleted server, or another project's, is not found (404 itemNotFound).
                let visible = ctx.admin || ctx.project == self.project_id();
                let found = st
                    .servers
                    .iter()
                    .find(|(s, i)| s == id && visible && server_status(i) != "DELETED");
                let (sid, inst) = found.ok_or_else(|| {
                    err(
                        svc,
                        StatusCode::NOT_FOUND,
                        "NotFound",
                        format!("Instance {id} could not be found."),
                    )
                })?;
                reply(StatusCode::OK, &json!({"server": self.server_json(&st, sid, inst, mv)}))
            }
            "nova.flavors.list" => reply(StatusCode::OK, &json!({"flavors": st.flavors})),
            "nova.flavors.get" => {
                let id = &segs[3];
                let f =
                    st.flavors.iter().find(|f| f["id"].as_str() == Some(id.as_str())).ok_or_else(
                        || {
                            err(
                                svc,
                                StatusCode::NOT_FOUND,
                                "NotFound",
                                format!("Flavor {id} could not be found."),
                            )
                        },
                    )?;
                reply(StatusCode::OK, &json!({"flavor": f}))
            }
            "nova.availability_zones.list" => {
                let zones: BTreeSet<String> = st
                    .servers
                    .iter()
                    .map(|(_, i)| i.zone.clone())
                    .chain(lock(&self.world).zones())
                    .collect();
                reply(
                    StatusCode::OK,
                    &json!({"availabilityZoneInfo": zones.iter().map(|z| json!({
                    "zoneName": z, "zoneState": {"available": true}, "hosts": null})).collect::<Vec<_>>()}),
                )
            }
            _ => err(svc, StatusCode::NOT_FOUND, "NotFound", "The resource could not be found."),
        };
        let v = format!("compute {}.{}", mv.0, mv.1);
        if let Ok(h) = HeaderValue::from_str(&v) {
            r.headers_mut().insert("openstack-api-version", h);
        }
        if let Ok(h) = HeaderValue::from_str(&format!("{}.{}", mv.0, mv.1)) {
            r.headers_mut().insert("x-openstack-nova-api-version", h);
        }
        Ok(r)
    }
}

const EXTENSIONS: &[(&str, &str)] = &[
    ("extraroute", "Neutron Extra Route"),
    ("extraroute-atomic", "Atomically add/remove extra routes"),
    ("security-group", "security-group"),
    ("allowed-address-pairs", "Allowed Address Pairs"),
    ("standard-attr-tag", "Tag support for resources with standard attribute"),
    ("router", "Neutron L3 Router"),
    ("external-net", "Neutron external network"),
    ("port-security", "Port Security"),
    ("trunk", "Trunk Extension"),
    ("trunk-details", "Trunk port details"),
];

fn conflict(kind: &str, message: String) -> Resp {
    err(Svc::Neutron, StatusCode::CONFLICT, kind, message)
}

/// Neutron's trunk create (`POST /v2.0/trunks`): the parent port and every sub-port must exist
/// and be in no trunk yet (409 `TrunkPortInUse`, `PortInUseAsSubPort`); a sub-port is
/// `vlan` (segmentation ID 1-4094, unique on the trunk: 409 `DuplicateSubPort`) or
/// `inherit`. The sub-ports become `trunk:subport` ports of the trunk (`device_id` the
/// trunk's ID); the parent port shows them in its `trunk_details`.
fn create_trunk(st: &mut State, spec: &Value, mut o: Value) -> Res<Value> {
    let id = o["id"].as_str().unwrap_or_default().to_string();
    let parent = spec["port_id"]
        .as_str()
        .ok_or_else(|| nbad("Invalid input for operation: 'port_id' is required."))?
        .to_string();
    let in_trunk = |st: &State, port: &str| -> Option<String> {
        st.neutron.get("trunks").into_iter().flatten().find_map(|t| {
            let sub = t["sub_ports"]
                .as_array()
                .into_iter()
                .flatten()
                .any(|s| s["port_id"].as_str() == Some(port));
            (t["port_id"].as_str() == Some(port) || sub)
                .then(|| t["id"].as_str().unwrap_or_default().to_string())
        })
    };
    let mac_of = |st: &State, port: &str| st.find("ports", port).map(|p| p["mac_address"].clone());
    if mac_of(st, &parent).is_none() {
        return Err(neutron_not_found("ports", &parent));
    }
    if in_trunk(st, &parent).is_some() {
        return Err(conflict(
            "TrunkPortInUse",
            format!("Port {parent} is in use by another trunk."),
        ));
    }
    let mut subs = Vec::new();
    let mut details = Vec::new();
    let mut seen = BTreeSet::new();
    for sp in spec["sub_ports"].as_array().into_iter().flatten() {
        let port = sp["port_id"]
            .as_str()
            .ok_or_else(|| nbad("Invalid input for operation: a sub-port needs a port_id."))?;
        let Some(mac) = mac_of(st, port) else { return Err(neutron_not_found("ports", port)) };
        if port == parent {
            return Err(conflict(
                "TrunkPortInUse",
                format!("Port {port} is in use by another trunk."),
            ));
        }
        if let Some(t) = in_trunk(st, port) {
            return Err(conflict(
                "PortInUseAsSubPort",
                format!("Port {port} is currently a subport for trunk {t}."),
            ));
        }
        let ty = sp["segmentation_type"].as_str().unwrap_or("vlan");
        let seg = sp["segmentation_id"].as_u64();
        match (ty, seg) {
            ("vlan", Some(n)) if (1..=4094).contains(&n) => {}
            ("inherit", _) => {}
            _ => {
                return Err(nbad(format!(
                    "Invalid input for operation: segmentation_type {ty} with segmentation_id {} is not valid.",
                    seg.map(|n| n.to_string()).unwrap_or_else(|| "None".into())
                )));
            }
        }
        if ty == "vlan" && !seen.insert(seg) {
            return Err(conflict(
                "DuplicateSubPort",
                format!(
                    "segmentation_type {ty} and segmentation_id {} already in use on trunk {id}.",
                    seg.unwrap_or_default()
                ),
            ));
        }
        subs.push(json!({"port_id": port, "segmentation_type": ty, "segmentation_id": seg}));
        details.push(json!({"port_id": port, "segmentation_type": ty, "segmentation_id": seg,
            "mac_address": mac}));
    }
    for p in st.coll("ports").iter_mut() {
        let pid = p["id"].as_str().unwrap_or_default().to_string();
        if pid == parent {
            p["trunk_details"] = json!({"trunk_id": id, "sub_ports": details});
        } else if subs.iter().any(|s| s["port_id"].as_str() == Some(pid.as_str())) {
            p["device_owner"] = json!("trunk:subport");
            p["device_id"] = json!(id);
            p["status"] = json!("ACTIVE");
        }
    }
    merge(
        &mut o,
        json!({"name": spec["name"].as_str().unwrap_or_default(), "port_id": parent,
            "status": "ACTIVE", "admin_state_up": true, "sub_ports": subs}),
    );
    if let Some(d) = spec.get("description") {
        o["description"] = d.clone();
    }
    Ok(o)
}

/// Deleting a trunk: refused while its parent port is bound to a server (409 `TrunkInUse`);
/// its sub-ports are released and the parent's `trunk_details` go.
fn delete_trunk(st: &mut State, id: &str) -> Res<()> {
    let Some(t) = st.find("trunks", id).cloned() else { return Ok(()) };
    let parent = t["port_id"].as_str().unwrap_or_default().to_string();
    if st
        .find("ports", &parent)
        .is_some_and(|p| p["device_id"].as_str().is_some_and(|d| !d.is_empty()))
    {
        return Err(conflict("TrunkInUse", format!("Trunk {id} is currently in use.")));
    }
    for p in st.coll("ports").iter_mut() {
        if p["id"].as_str() == Some(parent.as_str()) {
            if let Some(m) = p.as_object_mut() {
                m.remove("trunk_details");
            }
        } else if p["device_id"].as_str() == Some(id) && p["device_owner"] == json!("trunk:subport")
        {
            p["device_owner"] = json!("");
            p["device_id"] = json!("");
            p["status"] = json!("DOWN");
        }
    }
    Ok(())
}

/// A trunk's parent port or sub-port cannot be deleted (409, as Neutron).
fn trunk_port_in_use(st: &State, port: &str) -> Res<()> {
    for t in st.neutron.get("trunks").into_iter().flatten() {
        let tid = t["id"].as_str().unwrap_or_default();
        if t["port_id"].as_str() == Some(port) {
            return Err(conflict(
                "PortInUseAsTrunkParent",
                format!("Port {port} is currently a parent port for trunk {tid}."),
            ));
        }
        if t["sub_ports"]
            .as_array()
            .into_iter()
            .flatten()
            .any(|s| s["port_id"].as_str() == Some(port))
        {
            return Err(conflict(
                "PortInUseAsSubPort",
                format!("Port {port} is currently a subport for trunk {tid}."),
            ));
        }
    }
    Ok(())
}

fn neutron_not_found(kind: &str, id: &str) -> Resp {
    let ty = match kind {
        "networks" => "NetworkNotFound",
        "subnets" => "SubnetNotFound",
        "ports" => "PortNotFound",
        "floatingips" => "FloatingIPNotFound",
        "routers" => "RouterNotFound",
        "security-groups" => "SecurityGroupNotFound",
        "security-group-rules" => "SecurityGroupRuleNotFound",
        "trunks" => "TrunkNotFound",
        _ => "NotFound",
    };
    let what = neutron_coll(kind).map(|c| c.1).unwrap_or("resource");
    err(Svc::Neutron, StatusCode::NOT_FOUND, ty, format!("{what} {id} could not be found."))
}

/// Whether the caller sees a Neutron object: its own project's, an admin everything, and
/// everyone external or shared networks and their subnets.
fn neutron_visible(st: &State, ctx: &Ctx, coll: &str, o: &Value) -> bool {
    let public = |n: &Value| n["router:external"] == json!(true) || n["shared"] == json!(true);
    ctx.admin
        || o["project_id"].as_str() == Some(ctx.project.as_str())
        || (coll == "networks" && public(o))
        || (coll == "subnets"
            && st
                .find("networks", o["network_id"].as_str().unwrap_or_default())
                .is_some_and(public))
}

/// Security groups and allowed address pairs need port security (409, as Neutron answers).
fn port_security_check(port: &Value, spec: &Value) -> Res<()> {
    if port["port_security_enabled"] != json!(false) {
        return Ok(());
    }
    let has = |k: &str| port[k].as_array().is_some_and(|a| !a.is_empty());
    let conflict = |ty: &str, m: &str| err(Svc::Neutron, StatusCode::CONFLICT, ty, m);
    if has("security_groups") {
        return Err(if spec.get("security_groups").is_some() {
            conflict(
                "PortSecurityAndIPRequiredForSecurityGroups",
                "Port security must be enabled and port must have an IP address in order to use security groups.",
            )
        } else {
            conflict(
                "PortSecurityPortHasSecurityGroup",
                "Port has security group associated. Cannot disable port security or ip address until security group is removed",
            )
        });
    }
    if has("allowed_address_pairs") {
        return Err(conflict(
            "AddressPairAndPortSecurityRequired",
            "Port Security must be enabled in order to have allowed address pairs on a port.",
        ));
    }
    Ok(())
}

fn nbad(msg: impl AsRef<str>) -> Resp {
    err(Svc::Neutron, StatusCode::BAD_REQUEST, "BadRequest", msg)
}

fn routes_set(v: &Value) -> Vec<(String, String)> {
    v.as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            (
                r["destination"].as_str().unwrap_or_default().to_string(),
                r["nexthop"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn routes_json(r: &[(String, String)]) -> Value {
    Value::Array(r.iter().map(|(d, n)| json!({"destination": d, "nexthop": n})).collect())
}

impl OpenStackCloud {
    fn neutron(
        &self,
        op: &str,
        segs: &[String],
        q: &[(String, String)],
        req: &Request<Bytes>,
        base: &str,
        ctx: &Ctx,
    ) -> Res<Resp> {
        let mut st = lock(&self.state);
        let project = ctx.project.clone();
        let now = format!("{}Z", civil(now_secs() as u64));
        if op == "neutron.extensions.list" {
            return Ok(reply(
                StatusCode::OK,
                &json!({"extensions": EXTENSIONS.iter().map(|(a, n)| json!({
                "alias": a, "name": n, "description": n, "updated": "2013-01-20T00:00:00-00:00",
                "links": []})).collect::<Vec<_>>()}),
            ));
        }
        let coll = segs[2].as_str();
        let Some((cname, single, plural)) = neutron_coll(coll) else {
            return Err(neutron_not_found("", ""));
        };
        let id = segs.get(3).cloned().unwrap_or_default();
        // Another project's object is not found (Neutron hides it), unless the caller is an
        // admin; external and shared networks and their subnets are everyone's.
        let exists = |st: &State, id: &str| {
            st.find(cname, id).filter(|o| neutron_visible(st, ctx, cname, o)).cloned()
        };
        match op.rsplit('.').next().unwrap_or_default() {
            "list" => {
                let items: Vec<Value> = st
                    .neutron
                    .get(cname)
                    .into_iter()
                    .flatten()
                    .filter(|o| neutron_visible(&st, ctx, cname, o))
                    .cloned()
                    .collect();
                let custom = |o: &Value, k: &str, v: &str| -> Option<bool> {
                    match k {
                        "fixed_ips" => {
                            let (fk, fv) = v.split_once('=')?;
                            Some(
                                o["fixed_ips"]
                                    .as_array()
                                    .into_iter()
                                    .flatten()
                                    .any(|f| f[fk].as_str() == Some(fv)),
                            )
                        }
                        "tenant_id" | "project_id" => Some(true),
                        _ => None,
                    }
                };
                let v = page(
                    items,
                    q,
                    &format!("{base}/network/v2.0/{cname}"),
                    &format!("{plural}_links"),
                    plural,
                    &custom,
                    Cap::Asked,
                )?;
                Ok(reply(StatusCode::OK, &v))
            }
            "get" => {
                let o = exists(&st, &id).ok_or_else(|| neutron_not_found(cname, &id))?;
                Ok(reply(StatusCode::OK, &json!({ single: o })))
            }
            "delete" => {
                exists(&st, &id).ok_or_else(|| neutron_not_found(cname, &id))?;
                match cname {
                    "security-groups" => {
                        let used = st.coll("ports").iter().any(|p| {
                            p["security_groups"]
                                .as_array()
                                .into_iter()
                                .flatten()
                                .any(|s| s.as_str() == Some(id.as_str()))
                        });
                        if used {
                            return Err(err(
                                Svc::Neutron,
                                StatusCode::CONFLICT,
                                "SecurityGroupInUse",
                                format!("Security Group {id} in use."),
                            ));
                        }
                        st.coll("security-group-rules")
                            .retain(|r| r["security_group_id"].as_str() != Some(id.as_str()));
                    }
                    "security-group-rules" => {
                        for g in st.coll("security-groups").iter_mut() {
                            if let Some(a) = g["security_group_rules"].as_array_mut() {
                                a.retain(|r| r["id"].as_str() != Some(id.as_str()));
                            }
                        }
                    }
                    "trunks" => delete_trunk(&mut st, &id)?,
                    "ports" => {
                        trunk_port_in_use(&st, &id)?;
                        st.coll("floatingips")
                            .iter_mut()
                            .filter(|f| f["port_id"].as_str() == Some(id.as_str()))
                            .for_each(|f| {
                                f["port_id"] = Value::Null;
                                f["fixed_ip_address"] = Value::Null;
                                f["status"] = json!("DOWN");
                            });
                    }
                    _ => {}
                }
                st.coll(cname).retain(|o| o["id"].as_str() != Some(id.as_str()));
                Ok(no_content())
            }
            "create" => {
                let b = body_json(req, Svc::Neutron)?;
                let spec = b
                    .get(single)
                    .cloned()
                    .filter(Value::is_object)
                    .ok_or_else(|| nbad(format!("Resource body required: {single}")))?;
                let new_id = st.next_id(cname);
                let mut o = json!({"id": new_id, "tenant_id": project, "project_id": project,
                    "description": "", "tags": [], "created_at": now, "updated_at": now,
                    "revision_number": 0});
                match cname {
                    "floatingips" => {
                        let net =
                            spec["floating_network_id"].as_str().unwrap_or_default().to_string();
                        let ext = st
                            .find("networks", &net)
                            .is_some_and(|n| n["router:external"] == json!(true));
                        if !ext {
                            return Err(err(
                                Svc::Neutron,
                                StatusCode::NOT_FOUND,
                                "ExternalNetworkNotFound",
                                format!("External network {net} could not be found."),
                            ));
                        }
                        let quota = lock(&self.opts).quotas.floatingip;
                        self.check_quota(&mut st, "floatingips", "floatingip", quota, &project)?;
                        // Choosing the address is an admin's right (Neutron's default policy).
                        if spec["floating_ip_address"].is_string() && !ctx.admin {
                            return Err(err(
                                Svc::Neutron,
                                StatusCode::FORBIDDEN,
                                "PolicyNotAuthorized",
                                "(rule:create_floatingip and rule:create_floatingip:floating_ip_address) is disallowed by policy",
                            ));
                        }
                        // The subnets of the external network to allocate from: the one
                        // `subnet_id` names (it must be on that network), else all of them.
                        let net_subnets: Vec<Value> = st
                            .coll("subnets")
                            .iter()
                            .filter(|s| s["network_id"].as_str() == Some(net.as_str()))
                            .cloned()
                            .collect();
                        let pool: Vec<Value> = match spec["subnet_id"].as_str() {
                            Some(sid) => {
                                let sub = st
                                    .find("subnets", sid)
                                    .cloned()
                                    .ok_or_else(|| neutron_not_found("subnets", sid))?;
                                if sub["network_id"].as_str() != Some(net.as_str()) {
                                    return Err(nbad(format!(
                                        "Invalid input for operation: Subnet {sid} does not belong to network {net}."
                                    )));
                                }
                                vec![sub]
                            }
                            None => net_subnets,
                        };
                        let used = used_addresses(&mut st);
                        let addr = match spec["floating_ip_address"].as_str() {
                            Some(a)
                                if !pool.iter().any(|s| {
                                    in_cidr(a, s["cidr"].as_str().unwrap_or_default())
                                }) =>
                            {
                                return Err(nbad(format!(
                                    "Invalid input for operation: IP address {a} is not a valid IP for the specified subnet."
                                )));
                            }
                            Some(a) if a.parse::<IpAddr>().is_ok_and(|a| used.contains(&a)) => {
                                return Err(err(
                                    Svc::Neutron,
                                    StatusCode::CONFLICT,
                                    "IpAddressAlreadyAllocated",
                                    format!("IP address {a} already allocated in subnet"),
                                ));
                            }
                            Some(a) => a.to_string(),
                            // Any free address of the subnets' allocation pools, as
                            // Neutron's IPAM; 409 only when they are all in use.
                            None => pool.iter().find_map(|s| allocate_ip(s, &used)).ok_or_else(
                                || {
                                    err(
                                        Svc::Neutron,
                                        StatusCode::CONFLICT,
                                        "IpAddressGenerationFailure",
                                        no_more_addresses(&net),
                                    )
                                },
                            )?,
                        };
                        merge(
                            &mut o,
                            json!({"floating_ip_address": addr, "floating_network_id": net,
                            "router_id": null, "port_id": null, "fixed_ip_address": null, "status": "DOWN",
                            "port_details": null}),
                        );
                        if let Some(d) = spec.get("description") {
                            o["description"] = d.clone();
                        }
                        if let Some(p) = spec["port_id"].as_str() {
                            self.associate(&st, &mut o, p, &spec)?;
                        }
                    }
                    "security-groups" => {
                        let quota = lock(&self.opts).quotas.security_group;
                        self.check_quota(&mut st, cname, "security_group", quota, &project)?;
                        let name = spec["name"].as_str().unwrap_or_default();
                        let desc = spec["description"].as_str().unwrap_or_default();
                        o = security_group(&mut st, &project, name, desc);
                    }
                    "security-group-rules" => {
                        let sg = spec["security_group_id"].as_str().unwrap_or_default().to_string();
                        if !st
                            .find("security-groups", &sg)
                            .is_some_and(|g| neutron_visible(&st, ctx, "security-groups", g))
                        {
                            return Err(neutron_not_found("security-groups", &sg));
                        }
                        let quota = lock(&self.opts).quotas.security_group_rule;
                        self.check_quota(&mut st, cname, "security_group_rule", quota, &project)?;
                        let dir = spec["direction"].as_str().unwrap_or_default();
                        if dir != "ingress" && dir != "egress" {
                            return Err(nbad(format!(
                                "Invalid input for direction. Reason: {dir:?} is not in ['ingress', 'egress']."
                            )));
                        }
                        let keys = [
                            "direction",
                            "ethertype",
                            "protocol",
                            "port_range_min",
                            "port_range_max",
                            "remote_ip_prefix",
                            "remote_group_id",
                        ];
                        let r = rule(&new_id, &sg, &project, spec.clone());
                        let dup = st.coll("security-group-rules").iter().any(|x| {
                            x["security_group_id"] == r["security_group_id"]
                                && keys.iter().all(|k| x[*k] == r[*k])
                        });
                        if dup {
                            return Err(err(
                                Svc::Neutron,
                                StatusCode::CONFLICT,
                                "SecurityGroupRuleExists",
                                "Security group rule already exists.",
                            ));
                        }
                        for g in st.coll("security-groups").iter_mut() {
                            if g["id"].as_str() == Some(sg.as_str())
                                && let Some(a) = g["security_group_rules"].as_array_mut()
                            {
                                a.push(r.clone());
                            }
                        }
                        o = r;
                    }
                    "trunks" => o = create_trunk(&mut st, &spec, o)?,
                    "ports" => {
                        let net = spec["network_id"].as_str().unwrap_or_default().to_string();
                        if st.find("networks", &net).is_none() {
                            return Err(neutron_not_found("networks", &net));
                        }
                        merge(
                            &mut o,
                            json!({"name": "", "network_id": net, "mac_address": mac(&new_id),
                            "admin_state_up": true, "status": "DOWN", "device_id": "", "device_owner": "",
                            "fixed_ips": [], "allowed_address_pairs": [], "security_groups": [],
                            "port_security_enabled": true}),
                        );
                        merge(&mut o, spec.clone());
                        port_security_check(&o, &spec)?;
                    }
                    _ => {
                        merge(
                            &mut o,
                            json!({"name": "", "admin_state_up": true, "status": "ACTIVE"}),
                        );
                        merge(&mut o, spec);
                    }
                }
                st.coll(cname).push(o.clone());
                Ok(reply(StatusCode::CREATED, &json!({ single: o })))
            }
            "update" => {
                let b = body_json(req, Svc::Neutron)?;
                let spec = b
                    .get(single)
                    .cloned()
                    .filter(Value::is_object)
                    .ok_or_else(|| nbad(format!("Resource body required: {single}")))?;
                let mut o = exists(&st, &id).ok_or_else(|| neutron_not_found(cname, &id))?;
                match cname {
                    "floatingips" => match spec.get("port_id") {
                        Some(Value::String(p)) => self.associate(&st, &mut o, &p.clone(), &spec)?,
                        Some(Value::Null) => {
                            merge(
                                &mut o,
                                json!({"port_id": null, "fixed_ip_address": null, "router_id": null, "status": "DOWN"}),
                            );
                        }
                        _ => {}
                    },
                    "routers" => {
                        if let Some(r) = spec.get("routes") {
                            let routes = routes_set(r);
                            self.check_nexthops(&st, &routes)?;
                            self.check_max_routes(&id, routes.len())?;
                            o["routes"] = routes_json(&routes);
                        }
                        for (k, v) in spec.as_object().into_iter().flatten() {
                            if k != "routes" {
                                o[k.as_str()] = v.clone();
                            }
                        }
                    }
                    "ports" => {
                        if let Some(sgs) = spec.get("security_groups").and_then(Value::as_array) {
                            for s in sgs {
                                let s = s.as_str().unwrap_or_default();
                                if st.find("security-groups", s).is_none() {
                                    return Err(neutron_not_found("security-groups", s));
                                }
                            }
                        }
                        merge(&mut o, spec.clone());
                        port_security_check(&o, &spec)?;
                    }
                    _ => merge(&mut o, spec),
                }
                o["updated_at"] = json!(now);
                o["revision_number"] = json!(o["revision_number"].as_u64().unwrap_or(0) + 1);
                for x in st.coll(cname).iter_mut() {
                    if x["id"].as_str() == Some(id.as_str()) {
                        *x = o.clone();
                    }
                }
                Ok(reply(StatusCode::OK, &json!({ single: o })))
            }
            "add_extraroutes" | "remove_extraroutes" => {
                let b = body_json(req, Svc::Neutron)?;
                let want = routes_set(&b["router"]["routes"]);
                let mut o = exists(&st, &id).ok_or_else(|| neutron_not_found(cname, &id))?;
                let mut have = routes_set(&o["routes"]);
                if op.ends_with("add_extraroutes") {
                    self.check_nexthops(&st, &want)?;
                    for r in want {
                        if !have.contains(&r) {
                            have.push(r);
                        }
                    }
                } else {
                    have.retain(|r| !want.contains(r));
                }
                self.check_max_routes(&id, have.len())?;
                o["routes"] = routes_json(&have);
                o["revision_number"] = json!(o["revision_number"].as_u64().unwrap_or(0) + 1);
                for x in st.coll(cname).iter_mut() {
                    if x["id"].as_str() == Some(id.as_str()) {
                        *x = o.clone();
                    }
                }
                Ok(reply(StatusCode::OK, &json!({ single: o })))
            }
            "replace" | "add" => {
                let mut o = exists(&st, &id).ok_or_else(|| neutron_not_found(cname, &id))?;
                let tags: Vec<Value> = if op.ends_with("replace") {
                    body_json(req, Svc::Neutron)?["tags"].as_array().cloned().unwrap_or_default()
                } else {
                    let mut t = o["tags"].as_array().cloned().unwrap_or_default();
                    let tag = Value::String(segs.get(5).cloned().unwrap_or_default());
                    if !t.contains(&tag) {
                        t.push(tag);
                    }
                    t
                };
                o["tags"] = Value::Array(tags.clone());
                for x in st.coll(cname).iter_mut() {
                    if x["id"].as_str() == Some(id.as_str()) {
                        *x = o.clone();
                    }
                }
                if op.ends_with("replace") {
                    Ok(reply(StatusCode::OK, &json!({"tags": tags})))
                } else {
                    Ok(reply(StatusCode::CREATED, &Value::Null))
                }
            }
            _ => Err(neutron_not_found(cname, &id)),
        }
    }

    fn associate(&self, st: &State, fip: &mut Value, port: &str, spec: &Value) -> Res<()> {
        let p = st.find("ports", port).ok_or_else(|| neutron_not_found("ports", port))?;
        let fixed = spec["fixed_ip_address"]
            .as_str()
            .map(str::to_string)
            .or_else(|| p["fixed_ips"][0]["ip_address"].as_str().map(str::to_string))
            .ok_or_else(|| nbad(format!("Port {port} does not have any IP addresses")))?;
        let taken = st.neutron.get("floatingips").into_iter().flatten().any(|f| {
            f["port_id"].as_str() == Some(port)
                && f["fixed_ip_address"].as_str() == Some(fixed.as_str())
                && f["id"] != fip["id"]
        });
        if taken {
            return Err(err(
                Svc::Neutron,
                StatusCode::CONFLICT,
                "FloatingIPPortAlreadyAssociated",
                format!(
                    "Cannot associate floating IP with port {port} using fixed IP {fixed}, as that fixed IP already has a floating IP."
                ),
            ));
        }
        merge(
            fip,
            json!({"port_id": port, "fixed_ip_address": fixed, "router_id": uuid("router-router1"), "status": "ACTIVE"}),
        );
        Ok(())
    }

    /// Neutron's `max_routes`: a router with more routes is a 400 `RoutesExhausted`.
    fn check_max_routes(&self, router: &str, n: usize) -> Res<()> {
        let max = lock(&self.opts).max_routes;
        if n > max {
            return Err(err(
                Svc::Neutron,
                StatusCode::BAD_REQUEST,
                "RoutesExhausted",
                format!(
                    "Unable to complete operation for {router}. The number of routes exceeds the maximum {max}."
                ),
            ));
        }
        Ok(())
    }

    /// A project's quota of `coll` (`resource` as Neutron names it): one more over it is a
    /// 409 `OverQuota`.
    fn check_quota(
        &self,
        st: &mut State,
        coll: &str,
        resource: &str,
        quota: usize,
        project: &str,
    ) -> Res<()> {
        let used =
            st.coll(coll).iter().filter(|o| o["project_id"].as_str() == Some(project)).count();
        if used >= quota {
            return Err(err(
                Svc::Neutron,
                StatusCode::CONFLICT,
                "OverQuota",
                format!("Quota exceeded for resources: ['{resource}']."),
            ));
        }
        Ok(())
    }

    fn check_nexthops(&self, st: &State, routes: &[(String, String)]) -> Res<()> {
        for (dest, hop) in routes {
            if parse_cidr(dest).is_none() {
                return Err(nbad(format!(
                    "Invalid input for routes. Reason: '{dest}' is not a valid IP subnet."
                )));
            }
            let on_subnet = st.neutron.get("subnets").into_iter().flatten().any(|s| {
                s["name"].as_str() != Some("public-subnet")
                    && in_cidr(hop, s["cidr"].as_str().unwrap_or_default())
            });
            if !on_subnet {
                return Err(err(
                    Svc::Neutron,
                    StatusCode::BAD_REQUEST,
                    "InvalidRoutes",
                    format!(
                        "Invalid format for routes: [{{'destination': '{dest}', 'nexthop': '{hop}'}}], the nexthop is not connected with router"
                    ),
                ));
            }
        }
        Ok(())
    }
}

fn obad(msg: impl AsRef<str>) -> Resp {
    err(Svc::Octavia, StatusCode::BAD_REQUEST, "", msg)
}

/// A listener's timeout attributes (Octavia v2.1).
const LISTENER_TIMEOUTS: &[&str] = &[
    "timeout_client_data",
    "timeout_member_connect",
    "timeout_member_data",
    "timeout_tcp_inspect",
];

/// The keys of an Octavia create body that nest children (the "fully populated" create).
const NESTED: &[&str] = &["listeners", "pools", "default_pool", "members", "healthmonitor"];

/// A nested list of child objects (absent or null: none).
fn nested_list(v: Option<Value>, what: &str) -> Res<Vec<Value>> {
    match v {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(a)) => a.into_iter().map(|x| nested_object(x, what)).collect(),
        Some(_) => {
            Err(obad(format!("Invalid input for field/attribute {what}. Value: not a list.")))
        }
    }
}

/// A nested child object.
fn nested_object(v: Value, what: &str) -> Res<Value> {
    if v.is_object() {
        Ok(v)
    } else {
        Err(obad(format!("Invalid input for field/attribute {what}. Value: not an object.")))
    }
}

/// Octavia's policy: another project's object is a 403 unless the caller is an admin.
fn octavia_allowed(ctx: &Ctx, o: &Value) -> Res<()> {
    if ctx.admin || o["project_id"].as_str() == Some(ctx.project.as_str()) {
        Ok(())
    } else {
        Err(err(Svc::Octavia, StatusCode::FORBIDDEN, "", POLICY_FORBIDDEN))
    }
}

fn onf(what: &str, id: &str) -> Resp {
    err(Svc::Octavia, StatusCode::NOT_FOUND, "", format!("{what} {id} not found."))
}

fn ids(v: &[&Value]) -> Value {
    Value::Array(v.iter().map(|o| json!({"id": o["id"]})).collect())
}

impl OpenStackCloud {
    /// A load balancer's provisioning status: its latest operation's. A failed operation on
    /// one of its children leaves the load balancer `ACTIVE` (Octavia reverts it; the child is
    /// `ERROR`); a failed operation on the load balancer itself leaves it `ERROR`.
    fn lb_status(st: &State, lb: &str) -> &'static str {
        match st.lb_ops.get(lb) {
            // A child's operation: the load balancer is PENDING_UPDATE meanwhile, whatever the
            // child's action, and ACTIVE afterwards.
            Some(op) if op.target != format!("loadbalancer/{lb}") => match op.phase() {
                Phase::Pending => "PENDING_UPDATE",
                Phase::Done | Phase::Failed(_) => "ACTIVE",
            },
            Some(op) => octavia_provisioning_status(op),
            None => "ACTIVE",
        }
    }

    /// Removes load balancers whose deletion finished, with their children and VIP port, and
    /// children whose deletion finished.
    fn purge(st: &mut State) {
        let deleting = std::mem::take(&mut st.deleting);
        for (coll, id) in deleting {
            match st.child_ops.get(&id).map(Operation::phase) {
                Some(Phase::Pending) => st.deleting.push((coll, id)),
                Some(Phase::Done) | None => Self::remove_child(st, coll, &id),
                Some(Phase::Failed(_)) => {}
            }
        }
        let done: Vec<String> = st
            .lb_ops
            .iter()
            .filter(|(lb, o)| {
                // The load balancer's own delete, done (a failed one leaves it ERROR).
                o.action == Action::Delete
                    && o.target == format!("loadbalancer/{lb}")
                    && o.phase() == Phase::Done
            })
            .map(|(id, _)| id.clone())
            .collect();
        for lb in done {
            Self::remove_lb(st, &lb);
        }
    }

    /// Removes load balancer `lb` whose deletion finished, with its children; its VIP port
    /// when Octavia made it (a `vip_port_id` port is the caller's: it stays), and the floating
    /// IPs on that port are disassociated.
    fn remove_lb(st: &mut State, lb: &str) {
        let lb = lb.to_string();
        st.lb_ops.remove(&lb);
        let vip = st
            .ocoll("loadbalancers")
            .iter()
            .find(|o| o["id"].as_str() == Some(lb.as_str()))
            .and_then(|o| o["vip_port_id"].as_str().map(str::to_string));
        st.ocoll("loadbalancers").retain(|o| o["id"].as_str() != Some(lb.as_str()));
        let children: BTreeSet<String> =
            st.lb_of.iter().filter(|(_, l)| **l == lb).map(|(c, _)| c.clone()).collect();
        for c in ["listeners", "pools", "healthmonitors", "members"] {
            st.ocoll(c).retain(|o| !children.contains(o["id"].as_str().unwrap_or_default()));
        }
        st.lb_of.retain(|_, l| *l != lb);
        if let Some(vip) = vip {
            // Only the port Octavia made (a `vip_port_id` port is the caller's: it stays).
            let device = format!("lb-{lb}");
            st.coll("ports").retain(|p| {
                p["id"].as_str() != Some(vip.as_str())
                    || p["device_id"].as_str() != Some(device.as_str())
            });
            for f in st.coll("floatingips").iter_mut() {
                if f["port_id"].as_str() == Some(vip.as_str()) {
                    merge(f, json!({"port_id": null, "fixed_ip_address": null, "status": "DOWN"}));
                }
            }
        }
    }

    fn render(st: &State, coll: &str, o: &Value) -> Value {
        let mut o = o.clone();
        let id = o["id"].as_str().unwrap_or_default().to_string();
        let lb = if coll == "loadbalancers" {
            id.clone()
        } else {
            st.lb_of.get(&id).cloned().unwrap_or_default()
        };
        let lbst = Self::lb_status(st, &lb);
        let children = |c: &str, f: &dyn Fn(&Value) -> bool| -> Value {
            ids(&st.octavia.get(c).into_iter().flatten().filter(|x| f(x)).collect::<Vec<_>>())
        };
        // A child's own latest operation: pending, or failed (ERROR, and it stays so).
        let own = (coll != "loadbalancers")
            .then(|| st.child_ops.get(&id).map(octavia_provisioning_status))
            .flatten()
            .filter(|s| *s != "ACTIVE" && *s != "DELETED");
        let status = match (coll, lbst) {
            ("loadbalancers", s) => s,
            (_, _) if own.is_some() => own.unwrap_or("ACTIVE"),
            // Children made with their load balancer (a fully populated create).
            (_, "PENDING_CREATE") => "PENDING_CREATE",
            (_, "PENDING_UPDATE" | "PENDING_DELETE") => "PENDING_UPDATE",
            (_, "ERROR") => "ERROR",
            _ => "ACTIVE",
        };
        o["provisioning_status"] = json!(status);
        o["operating_status"] = json!(if status == "ACTIVE" { "ONLINE" } else { "OFFLINE" });
        match coll {
            "loadbalancers" => {
                o["listeners"] = children("listeners", &|x| {
                    st.lb_of.get(x["id"].as_str().unwrap_or_default()) == Some(&id)
                });
                o["pools"] = children("pools", &|x| {
                    st.lb_of.get(x["id"].as_str().unwrap_or_default()) == Some(&id)
                });
            }
            "listeners" => {
                o["loadbalancers"] = json!([{"id": lb}]);
                o["l7policies"] = json!([]);
            }
            "pools" => {
                o["loadbalancers"] = json!([{"id": lb}]);
                o["members"] = children("members", &|x| x["pool_id"].as_str() == Some(id.as_str()));
                let hm = st
                    .octavia
                    .get("healthmonitors")
                    .into_iter()
                    .flatten()
                    .find(|x| x["pools"][0]["id"].as_str() == Some(id.as_str()))
                    .map(|x| x["id"].clone());
                o["healthmonitor_id"] = hm.unwrap_or(Value::Null);
                let ls = st
                    .octavia
                    .get("listeners")
                    .into_iter()
                    .flatten()
                    .filter(|x| x["default_pool_id"].as_str() == Some(id.as_str()))
                    .collect::<Vec<_>>();
                if o["listener_id"].is_string() && ls.is_empty() {
                    o["listeners"] = json!([{"id": o["listener_id"]}]);
                } else {
                    o["listeners"] = ids(&ls);
                }
            }
            _ => {}
        }
        if let Some(m) = o.as_object_mut() {
            m.remove("listener_id");
        }
        o
    }

    /// Creates one Octavia object from its create body (`spec`, the body's inner object) with
    /// the children the body nests: a load balancer's `listeners` and `pools`, a listener's
    /// `default_pool`, a pool's `members` and `healthmonitor` (Octavia's "fully populated"
    /// create). Each child is validated as its own create would be; `nested` children skip the
    /// pending check (their load balancer is being created by this very call). Every object
    /// made is pushed to `created`, so the caller can undo them all when one fails (Octavia
    /// creates the whole tree or nothing). Returns the object as stored and its load balancer.
    // The recursion threads the state, the undo list and the caller through every level.
    #[allow(clippy::too_many_arguments)]
    fn create_tree(
        &self,
        st: &mut State,
        coll: &'static str,
        mut spec: Value,
        pool_id: &str,
        nested: bool,
        created: &mut Vec<(&'static str, String)>,
        ctx: &Ctx,
    ) -> Res<(Value, String)> {
        let project = ctx.project.clone();
        let now = civil(now_secs() as u64);
        let mut kids: BTreeMap<&str, Value> = BTreeMap::new();
        let allowed: &[&str] = match coll {
            "loadbalancers" => &["listeners", "pools"],
            "listeners" => &["default_pool"],
            "pools" => &["members", "healthmonitor"],
            _ => &[],
        };
        if let Some(m) = spec.as_object_mut() {
            for k in NESTED {
                if let Some(v) = m.remove(*k) {
                    if !allowed.contains(k) {
                        return Err(obad(format!("Invalid input for field/attribute {k}.")));
                    }
                    kids.insert(k, v);
                }
            }
        }
        self.octavia_gate(st, coll, &spec, pool_id)?;
        let new_id = st.next_id(coll);
        let mut o = json!({"id": new_id, "name": "", "description": "", "admin_state_up": true,
            "project_id": project, "tenant_id": project, "tags": [], "created_at": now, "updated_at": now});
        let lb = match coll {
            "loadbalancers" => {
                // Provider, flavor and availability zone: known ones only (400, as Octavia).
                let opts = lock(&self.opts).clone();
                if let Some(p) = spec["provider"].as_str()
                    && !opts.octavia_providers.iter().any(|x| x == p)
                {
                    return Err(obad(format!("Provider '{p}' is not enabled.")));
                }
                if let Some(f) = spec["flavor_id"].as_str()
                    && !opts.octavia_flavors.iter().any(|x| x == f)
                {
                    return Err(obad(format!(
                        "Validation failure: Invalid input for field/attribute flavor_id. Value: '{f}'. Flavor {f} not found."
                    )));
                }
                if let Some(z) = spec["availability_zone"].as_str()
                    && !opts.octavia_availability_zones.iter().any(|x| x == z)
                {
                    return Err(obad(format!(
                        "Validation failure: Invalid input for field/attribute availability_zone. Value: '{z}'. Availability zone {z} not found."
                    )));
                }
                // The VIP: a port the caller made (its subnet and address; Octavia uses it and
                // leaves it behind on delete), else a new port on the subnet or network.
                let user_port = match spec["vip_port_id"].as_str() {
                    Some(pid) => Some(
                        st.find("ports", pid)
                            .filter(|p| neutron_visible(st, ctx, "ports", p))
                            .cloned()
                            .ok_or_else(|| {
                                obad(format!("Validation failure: Port {pid} not found."))
                            })?,
                    ),
                    None => None,
                };
                let subnet = if let Some(p) = &user_port {
                    let sid = p["fixed_ips"][0]["subnet_id"].as_str().unwrap_or_default();
                    st.find("subnets", sid).cloned().ok_or_else(|| {
                        obad(format!(
                            "Validation failure: Port {} has no IP address.",
                            p["id"].as_str().unwrap_or_default()
                        ))
                    })?
                } else if let Some(s) = spec["vip_subnet_id"].as_str() {
                    st.find("subnets", s)
                        .cloned()
                        .ok_or_else(|| obad(format!("Subnet {s} not found.")))?
                } else if let Some(n) = spec["vip_network_id"].as_str() {
                    st.coll("subnets")
                        .iter()
                        .find(|s| s["network_id"].as_str() == Some(n))
                        .cloned()
                        .ok_or_else(|| obad(format!("Network {n} not found.")))?
                } else {
                    return Err(obad(
                        "Validation failure: VIP must contain one of: vip_port_id, vip_network_id, vip_subnet_id.",
                    ));
                };
                let cidr = subnet["cidr"].as_str().unwrap_or("10.0.0.0/24").to_string();
                let used = used_addresses(st);
                let (vip, port) = if let Some(p) = &user_port {
                    let addr = p["fixed_ips"][0]["ip_address"].as_str().unwrap_or_default();
                    if let Some(want) = spec["vip_address"].as_str()
                        && want != addr
                    {
                        return Err(obad(format!(
                            "Validation failure: vip_address {want} is not the address of port {}.",
                            p["id"].as_str().unwrap_or_default()
                        )));
                    }
                    (addr.to_string(), p["id"].as_str().unwrap_or_default().to_string())
                } else {
                    let vip = match spec["vip_address"].as_str() {
                        Some(a) if !in_cidr(a, &cidr) => {
                            return Err(obad(format!(
                                "Validation failure: {a} is not a valid IP address for subnet {}.",
                                subnet["id"].as_str().unwrap_or_default()
                            )));
                        }
                        Some(a) if a.parse::<IpAddr>().is_ok_and(|a| used.contains(&a)) => {
                            return Err(err(
                                Svc::Octavia,
                                StatusCode::CONFLICT,
                                "",
                                format!(
                                    "IP address {a} already allocated in subnet {}.",
                                    subnet["id"].as_str().unwrap_or_default()
                                ),
                            ));
                        }
                        Some(a) => a.to_string(),
                        // Neutron allocates the VIP port's address from the subnet's
                        // pools; Octavia passes Neutron's 409 on with its message.
                        None => allocate_ip(&subnet, &used).ok_or_else(|| {
                            err(
                                Svc::Octavia,
                                StatusCode::CONFLICT,
                                "",
                                no_more_addresses(
                                    subnet["network_id"].as_str().unwrap_or_default(),
                                ),
                            )
                        })?,
                    };
                    let port = add_port(st, &format!("lb-{new_id}"), &subnet, &vip, "nova");
                    for p in st.coll("ports").iter_mut() {
                        if p["id"].as_str() == Some(port.as_str()) {
                            p["device_owner"] = json!("Octavia");
                            p["name"] = json!(format!("octavia-lb-{new_id}"));
                            p["project_id"] = json!(project);
                            p["tenant_id"] = json!(project);
                        }
                    }
                    (vip, port)
                };
                merge(
                    &mut o,
                    json!({"vip_address": vip, "vip_port_id": port, "vip_subnet_id": subnet["id"],
                    "vip_network_id": subnet["network_id"], "vip_qos_policy_id": null, "provider": "amphora",
                    "flavor_id": null, "availability_zone": null, "additional_vips": []}),
                );
                for k in [
                    "name",
                    "description",
                    "flavor_id",
                    "availability_zone",
                    "provider",
                    "tags",
                    "admin_state_up",
                ] {
                    if let Some(v) = spec.get(k) {
                        o[k] = v.clone();
                    }
                }
                new_id.clone()
            }
            "listeners" => {
                let lb = spec["loadbalancer_id"].as_str().unwrap_or_default().to_string();
                if !st.ocoll("loadbalancers").iter().any(|l| l["id"].as_str() == Some(lb.as_str()))
                {
                    return Err(obad(format!("Load Balancer {lb} not found.")));
                }
                if !nested {
                    Self::mutable(st, &lb)?;
                }
                let port = spec["protocol_port"]
                    .as_u64()
                    .ok_or_else(|| obad("Missing mandatory field: protocol_port"))?;
                let proto = spec["protocol"]
                    .as_str()
                    .ok_or_else(|| obad("Missing mandatory field: protocol"))?
                    .to_string();
                let clash = st.octavia.get("listeners").into_iter().flatten().any(|l| {
                    st.lb_of.get(l["id"].as_str().unwrap_or_default()) == Some(&lb)
                        && l["protocol_port"].as_u64() == Some(port)
                        && (l["protocol"] == json!("UDP")) == (proto == "UDP")
                });
                if clash {
                    return Err(err(
                        Svc::Octavia,
                        StatusCode::CONFLICT,
                        "",
                        format!(
                            "Another Listener on this Load Balancer is already using protocol_port {port}"
                        ),
                    ));
                }
                self.check_listener_tls(&proto, &spec, ctx)?;
                merge(
                    &mut o,
                    json!({"protocol": proto, "protocol_port": port, "default_pool_id": null,
                    "connection_limit": -1, "timeout_client_data": 50000, "timeout_member_connect": 5000,
                    "timeout_member_data": 50000, "timeout_tcp_inspect": 0, "insert_headers": {},
                    "allowed_cidrs": null, "default_tls_container_ref": null, "sni_container_refs": []}),
                );
                merge(&mut o, spec);
                if let Some(m) = o.as_object_mut() {
                    m.remove("loadbalancer_id");
                }
                lb
            }
            "pools" => {
                let lb = if let Some(l) = spec["loadbalancer_id"].as_str() {
                    l.to_string()
                } else if let Some(l) = spec["listener_id"].as_str() {
                    st.lb_of
                        .get(l)
                        .cloned()
                        .ok_or_else(|| obad(format!("Listener {l} not found.")))?
                } else {
                    return Err(obad(
                        "Validation failure: Must provide a listener_id or loadbalancer_id.",
                    ));
                };
                if !st.ocoll("loadbalancers").iter().any(|l| l["id"].as_str() == Some(lb.as_str()))
                {
                    return Err(obad(format!("Load Balancer {lb} not found.")));
                }
                if !nested {
                    Self::mutable(st, &lb)?;
                }
                for k in ["lb_algorithm", "protocol"] {
                    if !spec[k].is_string() {
                        return Err(obad(format!("Missing mandatory field: {k}")));
                    }
                }
                merge(&mut o, json!({"session_persistence": null, "tls_enabled": false}));
                merge(&mut o, spec.clone());
                if let Some(m) = o.as_object_mut() {
                    m.remove("loadbalancer_id");
                }
                if let Some(l) = spec["listener_id"].as_str() {
                    for x in st.ocoll("listeners").iter_mut() {
                        if x["id"].as_str() == Some(l) {
                            x["default_pool_id"] = json!(new_id);
                        }
                    }
                }
                lb
            }
            "healthmonitors" => {
                let pool = spec["pool_id"].as_str().unwrap_or_default().to_string();
                let lb = st
                    .lb_of
                    .get(&pool)
                    .cloned()
                    .ok_or_else(|| obad(format!("Pool {pool} not found.")))?;
                if !nested {
                    Self::mutable(st, &lb)?;
                }
                if st
                    .ocoll("healthmonitors")
                    .iter()
                    .any(|h| h["pools"][0]["id"].as_str() == Some(pool.as_str()))
                {
                    return Err(err(
                        Svc::Octavia,
                        StatusCode::CONFLICT,
                        "",
                        format!("Pool {pool} already has a health monitor"),
                    ));
                }
                for k in ["type", "delay", "timeout", "max_retries"] {
                    if spec[k].is_null() {
                        return Err(obad(format!("Missing mandatory field: {k}")));
                    }
                }
                merge(
                    &mut o,
                    json!({"max_retries_down": 3, "http_method": null, "url_path": null,
                    "expected_codes": null, "pools": [{"id": pool}]}),
                );
                merge(&mut o, spec);
                if let Some(m) = o.as_object_mut() {
                    m.remove("pool_id");
                }
                lb
            }
            _ => {
                let lb = st.lb_of.get(pool_id).cloned().unwrap_or_default();
                if !nested {
                    Self::mutable(st, &lb)?;
                }
                let addr = spec["address"]
                    .as_str()
                    .ok_or_else(|| obad("Missing mandatory field: address"))?
                    .to_string();
                let port = spec["protocol_port"]
                    .as_u64()
                    .ok_or_else(|| obad("Missing mandatory field: protocol_port"))?;
                if st.ocoll("members").iter().any(|m| {
                    m["pool_id"].as_str() == Some(pool_id)
                        && m["address"].as_str() == Some(addr.as_str())
                        && m["protocol_port"].as_u64() == Some(port)
                }) {
                    return Err(err(
                        Svc::Octavia,
                        StatusCode::CONFLICT,
                        "",
                        format!("Duplicate member with address {addr} and protocol_port {port}"),
                    ));
                }
                merge(
                    &mut o,
                    json!({"weight": 1, "backup": false, "subnet_id": null, "monitor_address": null,
                    "monitor_port": null, "pool_id": pool_id}),
                );
                merge(&mut o, spec);
                lb
            }
        };
        st.lb_of.insert(new_id.clone(), lb.clone());
        if coll == "loadbalancers" {
            st.lb_of.remove(&new_id);
        }
        st.ocoll(coll).push(o.clone());
        created.push((coll, new_id.clone()));
        match coll {
            "loadbalancers" => {
                // The graph's pools first, so a listener's `default_pool` may name one of them.
                let mut named: BTreeMap<String, String> = BTreeMap::new();
                for mut p in nested_list(kids.remove("pools"), "pools")? {
                    p["loadbalancer_id"] = json!(new_id);
                    let (po, _) = self.create_tree(st, "pools", p, "", true, created, ctx)?;
                    if let (Some(n), Some(i)) = (po["name"].as_str(), po["id"].as_str())
                        && !n.is_empty()
                    {
                        named.insert(n.to_string(), i.to_string());
                    }
                }
                for mut l in nested_list(kids.remove("listeners"), "listeners")? {
                    l["loadbalancer_id"] = json!(new_id);
                    let by_name = l["default_pool"]
                        .as_object()
                        .filter(|d| !d.contains_key("lb_algorithm"))
                        .and_then(|d| d.get("name"))
                        .and_then(Value::as_str)
                        .map(|n| named.get(n).cloned().ok_or(n.to_string()));
                    match by_name {
                        Some(Ok(pid)) => {
                            if let Some(m) = l.as_object_mut() {
                                m.remove("default_pool");
                            }
                            l["default_pool_id"] = json!(pid);
                        }
                        Some(Err(n)) => return Err(obad(format!("Pool {n} not found."))),
                        None => {}
                    }
                    self.create_tree(st, "listeners", l, "", true, created, ctx)?;
                }
            }
            "listeners" => {
                if let Some(dp) = kids.remove("default_pool").filter(|v| !v.is_null()) {
                    let mut dp = nested_object(dp, "default_pool")?;
                    dp["listener_id"] = json!(new_id);
                    dp["loadbalancer_id"] = json!(lb);
                    self.create_tree(st, "pools", dp, "", true, created, ctx)?;
                }
            }
            "pools" => {
                for m in nested_list(kids.remove("members"), "members")? {
                    self.create_tree(st, "members", m, &new_id, true, created, ctx)?;
                }
                if let Some(hm) = kids.remove("healthmonitor").filter(|v| !v.is_null()) {
                    let mut hm = nested_object(hm, "healthmonitor")?;
                    hm["pool_id"] = json!(new_id);
                    self.create_tree(st, "healthmonitors", hm, "", true, created, ctx)?;
                }
            }
            _ => {}
        }
        Ok((o, lb))
    }

    /// Undoes the objects a failed create made (newest first), with a load balancer's VIP port
    /// and operation.
    fn rollback(st: &mut State, created: &[(&'static str, String)]) {
        for (c, id) in created.iter().rev() {
            st.ocoll(c).retain(|o| o["id"].as_str() != Some(id.as_str()));
            st.lb_of.remove(id);
            if *c == "pools" {
                for l in st.ocoll("listeners").iter_mut() {
                    if l["default_pool_id"].as_str() == Some(id.as_str()) {
                        l["default_pool_id"] = Value::Null;
                    }
                }
            }
            if *c == "loadbalancers" {
                let device = format!("lb-{id}");
                st.coll("ports").retain(|p| p["device_id"].as_str() != Some(device.as_str()));
                st.lb_ops.remove(id);
            }
        }
    }

    /// An object rendered with its children in full, as Octavia answers a fully populated
    /// create: a load balancer's listeners and pools, a pool's members and health monitor.
    fn render_full(st: &State, coll: &str, o: &Value) -> Value {
        let mut r = Self::render(st, coll, o);
        let full = |c: &str, id: &Value| -> Value {
            st.octavia
                .get(c)
                .into_iter()
                .flatten()
                .find(|x| x["id"] == *id)
                .map(|x| Self::render_full(st, c, x))
                .unwrap_or(Value::Null)
        };
        let expand = |c: &str, v: &Value| -> Value {
            Value::Array(v.as_array().into_iter().flatten().map(|x| full(c, &x["id"])).collect())
        };
        match coll {
            "loadbalancers" => {
                r["listeners"] = expand("listeners", &r["listeners"]);
                r["pools"] = expand("pools", &r["pools"]);
            }
            "pools" => {
                r["members"] = expand("members", &r["members"]);
                r["healthmonitor"] = if r["healthmonitor_id"].is_null() {
                    Value::Null
                } else {
                    full("healthmonitors", &r["healthmonitor_id"])
                };
            }
            _ => {}
        }
        r
    }

    /// Refuses what the advertised Octavia version ([`OpenStackOptions::octavia_max_minor`])
    /// does not know in a create or update body of `coll` (`pool_id`: a member's pool), with
    /// the 400 that version answers: an attribute it does not have (`tags` before 2.5, a
    /// listener's `allowed_cidrs` before 2.12 and timeouts before 2.1), or an HTTP(S) health
    /// monitor on a UDP pool before 2.16.
    fn octavia_gate(&self, st: &State, coll: &str, spec: &Value, pool_id: &str) -> Res<()> {
        let max = lock(&self.opts).octavia_max_minor;
        let single = octavia_coll(coll).map(|c| c.1).unwrap_or("member");
        let given = |k: &str| spec.get(k).is_some_and(|v| !v.is_null());
        let unknown = |attr: &str| {
            obad(format!(
                "Invalid input for field/attribute {single}. Value: '{attr}'. Unknown attribute for argument {single}: {attr}"
            ))
        };
        if max < 5 && given("tags") {
            return Err(unknown("tags"));
        }
        if coll == "listeners" {
            if max < 12 && given("allowed_cidrs") {
                return Err(unknown("allowed_cidrs"));
            }
            if max < 1 {
                for k in LISTENER_TIMEOUTS {
                    if given(k) {
                        return Err(unknown(k));
                    }
                }
            }
        }
        if coll == "healthmonitors" && max < 16 {
            let ty = spec["type"].as_str().unwrap_or_default();
            let pool = spec["pool_id"].as_str().unwrap_or(pool_id);
            let udp = st
                .octavia
                .get("pools")
                .into_iter()
                .flatten()
                .any(|p| p["id"].as_str() == Some(pool) && p["protocol"] == json!("UDP"));
            if udp && matches!(ty, "HTTP" | "HTTPS") {
                return Err(obad(format!(
                    "Validation failure: The associated pool protocol is UDP, so only a UDP-CONNECT, TCP or PING health monitor is supported, not {ty}."
                )));
            }
        }
        Ok(())
    }

    /// Octavia's TLS rules for a listener (`spec`: its create body, or the listener as an
    /// update leaves it): `TERMINATED_HTTPS` needs a certificate reference, other protocols
    /// may not have one, and the reference must name a Barbican container or secret the
    /// caller may read (Octavia reads it with the user's token: 400 otherwise).
    fn check_listener_tls(&self, protocol: &str, spec: &Value, ctx: &Ctx) -> Res<()> {
        let tls_ref =
            spec.get("default_tls_container_ref").and_then(Value::as_str).filter(|r| !r.is_empty());
        let sni =
            spec.get("sni_container_refs").and_then(Value::as_array).is_some_and(|a| !a.is_empty());
        if protocol == "TERMINATED_HTTPS" {
            if tls_ref.is_none() && !sni {
                return Err(obad(
                    "Validation failure: An SNI or default certificate container reference must be provided for TERMINATED_HTTPS protocol listeners.",
                ));
            }
        } else if tls_ref.is_some() || sni {
            return Err(obad(format!(
                "Validation failure: Certificate container references are only allowed on TERMINATED_HTTPS protocol listeners, not {protocol}."
            )));
        }
        if let Some(r) = tls_ref {
            let caller = crate::openstack_barbican::Caller {
                project: &ctx.project,
                user: &ctx.user,
                admin: ctx.admin,
            };
            if self.barbican.check_ref(r, &caller).is_err() {
                return Err(obad(format!("Could not retrieve certificate: {r}")));
            }
        }
        Ok(())
    }

    /// The load balancer of `lb_or_child`, refusing changes while it is pending (409).
    fn mutable(st: &State, lb: &str) -> Res<()> {
        let s = Self::lb_status(st, lb);
        if s.starts_with("PENDING_") {
            return Err(err(
                Svc::Octavia,
                StatusCode::CONFLICT,
                "",
                format!("Invalid state {s} of loadbalancer resource {lb}"),
            ));
        }
        Ok(())
    }

    /// Starts an operation on load balancer `lb` itself (target `loadbalancer/<lb>`).
    fn touch(&self, st: &mut State, lb: &str, action: Action) {
        let op = self.ops.start(format!("loadbalancer/{lb}"), action);
        st.lb_ops.insert(lb.to_string(), op);
    }

    /// Starts an operation on a child of `lb` (target `loadbalancer/<lb>/<kind>/<id>`, kind
    /// `listener`, `pool`, `healthmonitor` or `member`): the load balancer is `PENDING_UPDATE`
    /// meanwhile, for as long as an update of it takes whatever the child's action (Octavia
    /// pushes the amphora's configuration; only the load balancer's own create boots one);
    /// a failure leaves the child `ERROR` and the load balancer `ACTIVE`.
    fn touch_child(&self, st: &mut State, lb: &str, kind: &str, id: &str, action: Action) {
        let op =
            self.ops.start_timed(format!("loadbalancer/{lb}/{kind}/{id}"), action, Action::Update);
        st.child_ops.insert(id.to_string(), op.clone());
        st.lb_ops.insert(lb.to_string(), op);
    }

    /// Removes a child whose deletion finished, with what goes with it.
    fn remove_child(st: &mut State, coll: &str, id: &str) {
        if coll == "pools" {
            let mem: BTreeSet<String> = st
                .ocoll("members")
                .iter()
                .filter(|m| m["pool_id"].as_str() == Some(id))
                .filter_map(|m| m["id"].as_str().map(str::to_string))
                .collect();
            st.ocoll("members").retain(|m| m["pool_id"].as_str() != Some(id));
            st.ocoll("healthmonitors").retain(|m| m["pools"][0]["id"].as_str() != Some(id));
            for l in st.ocoll("listeners").iter_mut() {
                if l["default_pool_id"].as_str() == Some(id) {
                    l["default_pool_id"] = Value::Null;
                }
            }
            st.lb_of.retain(|c, _| !mem.contains(c));
        }
        if coll == "listeners" {
            for p in st.ocoll("pools").iter_mut() {
                if p["listener_id"].as_str() == Some(id) {
                    p["listener_id"] = Value::Null;
                }
            }
        }
        st.ocoll(coll).retain(|o| o["id"].as_str() != Some(id));
        st.lb_of.remove(id);
        st.child_ops.remove(id);
    }

    fn octavia(
        &self,
        op: &str,
        segs: &[String],
        q: &[(String, String)],
        req: &Request<Bytes>,
        base: &str,
        ctx: &Ctx,
    ) -> Res<Resp> {
        let mut st = lock(&self.state);
        Self::purge(&mut st);
        let project = ctx.project.clone();
        let now = civil(now_secs() as u64);
        let members = segs.len() >= 6 && segs[5] == "members";
        let (coll, single) = if members {
            ("members", "member")
        } else {
            octavia_coll(&segs[3]).unwrap_or(("loadbalancers", "loadbalancer"))
        };
        let pool_id = if members { segs[4].clone() } else { String::new() };
        let id =
            if members { segs.get(6).cloned() } else { segs.get(4).cloned() }.unwrap_or_default();
        if members {
            let pool = st
                .octavia
                .get("pools")
                .into_iter()
                .flatten()
                .find(|p| p["id"].as_str() == Some(pool_id.as_str()))
                .ok_or_else(|| onf("Pool", &pool_id))?;
            octavia_allowed(ctx, pool)?;
        }
        let find = |st: &State, id: &str| {
            st.octavia
                .get(coll)
                .into_iter()
                .flatten()
                .find(|o| o["id"].as_str() == Some(id))
                .cloned()
        };
        let what = match coll {
            "loadbalancers" => "Load Balancer",
            "listeners" => "Listener",
            "pools" => "Pool",
            "members" => "Member",
            _ => "Health Monitor",
        };
        match op.rsplit('.').next().unwrap_or_default() {
            "list" => {
                let items: Vec<Value> = st
                    .octavia
                    .get(coll)
                    .into_iter()
                    .flatten()
                    .filter(|o| !members || o["pool_id"].as_str() == Some(pool_id.as_str()))
                    .filter(|o| ctx.admin || o["project_id"].as_str() == Some(ctx.project.as_str()))
                    .map(|o| Self::render(&st, coll, o))
                    .collect();
                let custom = |o: &Value, k: &str, v: &str| -> Option<bool> {
                    match k {
                        "loadbalancer_id" => Some(
                            o["loadbalancers"][0]["id"].as_str() == Some(v)
                                || o["id"].as_str() == Some(v) && coll == "loadbalancers",
                        ),
                        "pool_id" if coll == "healthmonitors" => {
                            Some(o["pools"][0]["id"].as_str() == Some(v))
                        }
                        "project_id" => Some(true),
                        _ => None,
                    }
                };
                let path = if members {
                    format!("{base}/load-balancer/v2/lbaas/pools/{pool_id}/members")
                } else {
                    format!("{base}/load-balancer/v2/lbaas/{coll}")
                };
                // Octavia pages at its `pagination_max_limit`.
                let cap = Cap::Octavia(lock(&self.opts).octavia_max_limit.max(1));
                let v = page(items, q, &path, &format!("{coll}_links"), coll, &custom, cap)
                    .map_err(|_| obad("marker not found"))?;
                Ok(reply(StatusCode::OK, &v))
            }
            "get" => {
                let o = find(&st, &id).ok_or_else(|| onf(what, &id))?;
                octavia_allowed(ctx, &o)?;
                Ok(reply(StatusCode::OK, &json!({ single: Self::render(&st, coll, &o) })))
            }
            "delete" => {
                let o = find(&st, &id).ok_or_else(|| onf(what, &id))?;
                octavia_allowed(ctx, &o)?;
                if coll == "loadbalancers" {
                    Self::mutable(&st, &id)?;
                    let cascade = q.iter().any(|(k, v)| k == "cascade" && v == "true");
                    let has = st.lb_of.values().any(|l| *l == id);
                    if has && !cascade {
                        return Err(obad(format!(
                            "Cannot delete Load Balancer {id} - it has children"
                        )));
                    }
                    self.touch(&mut st, &id, Action::Delete);
                    let _ = o;
                } else {
                    let lb = st.lb_of.get(&id).cloned().unwrap_or_default();
                    Self::mutable(&st, &lb)?;
                    // The child is PENDING_DELETE until its operation is done, then gone; if
                    // the operation fails it stays, ERROR.
                    let kind = coll.trim_end_matches('s');
                    let coll: &'static str = octavia_coll(coll).map(|c| c.0).unwrap_or("members");
                    self.touch_child(&mut st, &lb, kind, &id, Action::Delete);
                    st.deleting.push((coll, id.clone()));
                }
                Ok(no_content())
            }
            "create" => {
                let b = body_json(req, Svc::Octavia)?;
                let spec = b
                    .get(single)
                    .cloned()
                    .filter(Value::is_object)
                    .ok_or_else(|| obad(format!("Missing mandatory field: {single}")))?;
                let graph = NESTED
                    .iter()
                    .any(|k| spec.get(*k).is_some_and(|v| !v.is_null() && *v != json!([])));
                let mut created = Vec::new();
                let (o, lb) =
                    match self.create_tree(&mut st, coll, spec, &pool_id, false, &mut created, ctx)
                    {
                        Ok(x) => x,
                        Err(e) => {
                            Self::rollback(&mut st, &created);
                            return Err(e);
                        }
                    };
                if coll == "loadbalancers" {
                    self.touch(&mut st, &lb, Action::Create);
                } else {
                    let cid = o["id"].as_str().unwrap_or_default().to_string();
                    self.touch_child(
                        &mut st,
                        &lb,
                        coll.trim_end_matches('s'),
                        &cid,
                        Action::Create,
                    );
                }
                let o = find(&st, o["id"].as_str().unwrap_or_default()).unwrap_or(o);
                let r = if graph {
                    Self::render_full(&st, coll, &o)
                } else {
                    Self::render(&st, coll, &o)
                };
                Ok(reply(StatusCode::CREATED, &json!({ single: r })))
            }
            "update" => {
                let b = body_json(req, Svc::Octavia)?;
                let spec = b
                    .get(single)
                    .cloned()
                    .filter(Value::is_object)
                    .ok_or_else(|| obad(format!("Missing mandatory field: {single}")))?;
                let mut o = find(&st, &id).ok_or_else(|| onf(what, &id))?;
                octavia_allowed(ctx, &o)?;
                let lb = if coll == "loadbalancers" {
                    id.clone()
                } else {
                    st.lb_of.get(&id).cloned().unwrap_or_default()
                };
                Self::mutable(&st, &lb)?;
                self.octavia_gate(&st, coll, &spec, &pool_id)?;
                if let Some(p) = spec.get("default_pool_id").and_then(Value::as_str)
                    && st.lb_of.get(p) != Some(&lb)
                {
                    return Err(obad(format!("Pool {p} not found.")));
                }
                merge(&mut o, spec);
                if coll == "listeners" {
                    let proto = o["protocol"].as_str().unwrap_or_default().to_string();
                    self.check_listener_tls(&proto, &o, ctx)?;
                }
                o["updated_at"] = json!(now);
                for x in st.ocoll(coll).iter_mut() {
                    if x["id"].as_str() == Some(id.as_str()) {
                        *x = o.clone();
                    }
                }
                if coll == "loadbalancers" {
                    self.touch(&mut st, &lb, Action::Update);
                } else {
                    self.touch_child(&mut st, &lb, coll.trim_end_matches('s'), &id, Action::Update);
                }
                Ok(reply(StatusCode::OK, &json!({ single: Self::render(&st, coll, &o) })))
            }
            "batch_update" => {
                let lb = st.lb_of.get(&pool_id).cloned().unwrap_or_default();
                Self::mutable(&st, &lb)?;
                let b = body_json(req, Svc::Octavia)?;
                let want = b["members"]
                    .as_array()
                    .cloned()
                    .ok_or_else(|| obad("Missing mandatory field: members"))?;
                for w in &want {
                    self.octavia_gate(&st, "members", w, &pool_id)?;
                }
                let old: Vec<Value> = st
                    .ocoll("members")
                    .iter()
                    .filter(|m| m["pool_id"].as_str() == Some(pool_id.as_str()))
                    .cloned()
                    .collect();
                st.ocoll("members").retain(|m| m["pool_id"].as_str() != Some(pool_id.as_str()));
                for w in want {
                    let addr = w["address"]
                        .as_str()
                        .ok_or_else(|| obad("Missing mandatory field: address"))?
                        .to_string();
                    let port = w["protocol_port"]
                        .as_u64()
                        .ok_or_else(|| obad("Missing mandatory field: protocol_port"))?;
                    let mut m = old.iter().find(|m| m["address"].as_str() == Some(addr.as_str()) && m["protocol_port"].as_u64() == Some(port)).cloned()
                        .unwrap_or_else(|| {
                            let mid = st.next_id("members");
                            json!({"id": mid, "name": "", "admin_state_up": true, "project_id": project, "tenant_id": project,
                                "weight": 1, "backup": false, "subnet_id": null, "monitor_address": null, "monitor_port": null,
                                "pool_id": pool_id, "tags": [], "created_at": now, "updated_at": now})
                        });
                    merge(&mut m, w);
                    let mid = m["id"].as_str().unwrap_or_default().to_string();
                    st.lb_of.insert(mid, lb.clone());
                    st.ocoll("members").push(m);
                }
                let keep: BTreeSet<String> = st
                    .ocoll("members")
                    .iter()
                    .filter_map(|m| m["id"].as_str().map(str::to_string))
                    .collect();
                for m in old {
                    let mid = m["id"].as_str().unwrap_or_default();
                    if !keep.contains(mid) {
                        st.lb_of.remove(mid);
                    }
                }
                self.touch_child(&mut st, &lb, "pool", &pool_id, Action::Update);
                let mut r = Response::new(full(Bytes::new()));
                *r.status_mut() = StatusCode::ACCEPTED;
                Ok(r)
            }
            _ => Err(onf(what, &id)),
        }
    }
}

impl Cloud for OpenStackCloud {
    fn name(&self) -> String {
        "openstack".into()
    }

    fn operation(&self, head: &http::request::Parts, _body: &Bytes) -> String {
        route(&head.method, head.uri.path())
    }

    fn error(&self, head: &http::request::Parts, _op: &str, kind: ErrorKind) -> ErrorReply {
        let svc = service(head.uri.path());
        let (status, ty, message) = match kind {
            ErrorKind::Throttle => (429, "OverQuota", "Rate limit exceeded, retry later."),
            ErrorKind::Unavailable => {
                (503, "ServiceUnavailable", "The service is temporarily unavailable.")
            }
            ErrorKind::Status(s) => (s, "InjectedFault", "Injected fault."),
        };
        ErrorReply {
            status,
            content_type: "application/json",
            body: error_body(svc, status, ty, message).to_string(),
        }
    }

    fn serve(&self, op: String, req: Request<Bytes>) -> ServeFuture {
        let resp = if op.starts_with("http.unknown") {
            err(
                service(req.uri().path()),
                StatusCode::NOT_FOUND,
                "NotFound",
                "The resource could not be found.",
            )
        } else {
            match self.handle(&op, &req) {
                Ok(r) | Err(r) => r,
            }
        };
        Box::pin(async move { Ok(resp) })
    }

    fn reset(&self) {
        self.ops.reset();
        self.barbican.clear();
        self.load();
    }

    fn async_ops(&self) -> Option<&AsyncOps> {
        Some(&self.ops)
    }

    fn state(&self) -> Value {
        self.state_json()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes_name_operations() {
        assert_eq!(route(&Method::GET, "/compute/v2.1/servers/detail"), "nova.servers.list");
        assert_eq!(
            route(&Method::PUT, "/network/v2.0/routers/x/add_extraroutes"),
            "neutron.routers.add_extraroutes"
        );
        assert_eq!(
            route(&Method::DELETE, "/network/v2.0/security-groups/x"),
            "neutron.security_groups.delete"
        );
        assert_eq!(
            route(&Method::PUT, "/load-balancer/v2/lbaas/pools/p/members"),
            "octavia.members.batch_update"
        );
        assert_eq!(
            route(&Method::POST, "/load-balancer/v2/lbaas/loadbalancers"),
            "octavia.loadbalancers.create"
        );
    }

    #[test]
    fn octavia_lists_every_minor_version_up_to_the_current_one() {
        assert_eq!(route(&Method::GET, "/load-balancer/"), "octavia.versions");
        assert_eq!(route(&Method::GET, "/load-balancer/v2"), "octavia.versions");
        let v = octavia_versions("http://h", OCTAVIA_MAX_MINOR);
        let list = v["versions"].as_array().cloned().unwrap_or_default();
        assert_eq!(list.len(), OCTAVIA_MAX_MINOR as usize + 1);
        assert_eq!(list[0]["id"], "v2.0");
        assert_eq!(list[0]["status"], "SUPPORTED");
        let last = &list[list.len() - 1];
        assert_eq!(last["id"], format!("v2.{OCTAVIA_MAX_MINOR}"));
        assert_eq!(last["status"], "CURRENT");
        assert_eq!(last["links"][0]["href"], "http://h/load-balancer/v2");
        assert_eq!(list.iter().filter(|x| x["status"] == "CURRENT").count(), 1);
    }

    /// Calls the emulator directly (no server): the status and JSON body of `method path`.
    pub(super) async fn call(
        c: &OpenStackCloud,
        method: Method,
        path: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (StatusCode, Value) {
        use http_body_util::BodyExt as _;
        let mut b = Request::builder().method(method.clone()).uri(path).header("host", "h");
        if let Some(t) = token {
            b = b.header("x-auth-token", t);
        }
        let bytes = body.map(|v| Bytes::from(v.to_string())).unwrap_or_default();
        let Ok(req) = b.body(bytes) else { panic!("request {path}") };
        let op = route(&method, req.uri().path());
        let (Ok(r) | Err(r)) = c.handle(&op, &req);
        let status = r.status();
        let Ok(got) = r.into_body().collect().await else { panic!("body of {path}") };
        let v = serde_json::from_slice(&got.to_bytes()).unwrap_or(Value::Null);
        (status, v)
    }

    /// A token for the default user and project.
    pub(super) async fn login(c: &OpenStackCloud) -> String {
        let body = json!({"auth": {"identity": {"methods": ["password"], "password": {"user": {
            "name": DEFAULT_USER, "password": DEFAULT_PASSWORD, "domain": {"name": "Default"}}}},
            "scope": {"project": {"name": "demo", "domain": {"name": "Default"}}}}});
        use http_body_util::BodyExt as _;
        let Ok(req) = Request::builder()
            .method(Method::POST)
            .uri("/identity/v3/auth/tokens")
            .header("host", "h")
            .body(Bytes::from(body.to_string()))
        else {
            panic!("token request")
        };
        let (Ok(r) | Err(r)) = c.handle("keystone.tokens.create", &req);
        assert_eq!(r.status(), StatusCode::CREATED);
        let t =
            r.headers().get("x-subject-token").and_then(|v| v.to_str().ok()).map(str::to_string);
        let _ = r.into_body().collect().await;
        t.unwrap_or_default()
    }

    fn cloud_at(minor: u32) -> Arc<OpenStackCloud> {
        let opts = OpenStackOptions {
            octavia_max_minor: minor,
            lb_pending: Duration::ZERO,
            ..Default::default()
        };
        OpenStackCloud::new(World::default(), opts)
    }

    async fn lb(c: &OpenStackCloud, t: &str, extra: Value) -> (StatusCode, Value) {
        let subnet = c.neutron_id("subnets", "private-subnet").unwrap_or_default();
        let mut spec = json!({"name": "lb", "vip_subnet_id": subnet});
        merge(&mut spec, extra);
        call(
            c,
            Method::POST,
            "/load-balancer/v2/lbaas/loadbalancers",
            Some(t),
            Some(json!({"loadbalancer": spec})),
        )
        .await
    }

    /// A cloud whose `private-subnet` is `cidr`, load balancers ACTIVE at once, and Octavia
    /// pages of `octavia_max` objects.
    /// Floating IPs on `network` until a create is refused (at most 260): that answer.
    async fn floating_ips_until_refused(
        c: &OpenStackCloud,
        t: &str,
        network: &str,
    ) -> (StatusCode, Value) {
        let mut last = (StatusCode::OK, Value::Null);
        for _ in 0..260 {
            last = call(
                c,
                Method::POST,
                "/network/v2.0/floatingips",
                Some(t),
                Some(json!({"floatingip": {"floating_network_id": network}})),
            )
            .await;
            if last.0 != StatusCode::CREATED {
                break;
            }
        }
        last
    }

    fn cloud_on(cidr: &str, octavia_max: usize) -> Arc<OpenStackCloud> {
        let world = format!(
            "networks: [{{ name: private, cidr: {cidr} }}]\n\
             subnets: [{{ name: private-subnet, network: private, zone: nova, cidr: {cidr} }}]\n\
             instances: [{{ name: n1, zone: nova, subnet: private-subnet, private_ips: [{}] }}]\n",
            nth_host(cidr, 2)
        );
        let opts = OpenStackOptions {
            lb_pending: Duration::ZERO,
            octavia_max_limit: octavia_max,
            ..Default::default()
        };
        let world = match World::parse(&world) {
            Ok(w) => w,
            Err(e) => panic!("world {world}: {e}"),
        };
        OpenStackCloud::new(world, opts)
    }

    /// VIPs come from the whole allocation pool of the subnet, as Neutron allocates them: a
    /// /16 holds 1000 load balancers (the 1000th gets a free address of the pool, none twice,
    /// never the gateway nor a server's), and the pool Neutron reports is the subnet's.
    #[tokio::test]
    async fn a_thousand_load_balancers_get_distinct_vips_from_a_16s_pool() {
        let c = cloud_on("10.0.0.0/16", 1000);
        let t = login(&c).await;
        let (_, subnet) =
            call(&c, Method::GET, "/network/v2.0/subnets?name=private-subnet", Some(&t), None)
                .await;
        assert_eq!(
            subnet["subnets"][0]["allocation_pools"],
            json!([{"start": "10.0.0.2", "end": "10.0.255.254"}]),
            "{subnet}"
        );
        let mut vips = BTreeSet::new();
        for i in 0..1000 {
            let (s, v) = lb(&c, &t, json!({"name": format!("lb-{i}")})).await;
            assert_eq!(s, StatusCode::CREATED, "load balancer {i}: {v}");
            let vip = v["loadbalancer"]["vip_address"].as_str().unwrap_or_default().to_string();
            assert!(in_cidr(&vip, "10.0.0.0/16"), "{vip}");
            assert!(vip != "10.0.0.1" && vip != "10.0.0.2", "gateway or the server's: {vip}");
            assert!(vips.insert(vip.clone()), "VIP {vip} handed out twice");
        }
        assert_eq!(vips.len(), 1000);
    }

    /// When every address of the pool is held, a load balancer is Octavia's 409 with
    /// Neutron's `IpAddressGenerationFailure` message naming the network, and a floating IP
    /// create on an exhausted external network is Neutron's 409 of that type.
    #[tokio::test]
    async fn an_exhausted_pool_is_a_409_naming_the_network() {
        // 10.9.0.0/29: pool .2–.6, .2 is the server's: four VIPs.
        let c = cloud_on("10.9.0.0/29", 1000);
        let t = login(&c).await;
        for i in 0..4 {
            let (s, v) = lb(&c, &t, json!({"name": format!("lb-{i}")})).await;
            assert_eq!(s, StatusCode::CREATED, "load balancer {i}: {v}");
        }
        let (s, v) = lb(&c, &t, json!({"name": "one-too-many"})).await;
        assert_eq!(s, StatusCode::CONFLICT, "{v}");
        let net = c.neutron_id("networks", "private").unwrap_or_default();
        assert_eq!(
            v["faultstring"],
            format!("No more IP addresses available on network {net}."),
            "{v}"
        );
        // The public subnet (172.24.4.0/24, Neutron's pool .2–.254): 253 addresses.
        let public = c.neutron_id("networks", "public").unwrap_or_default();
        let mut last = floating_ips_until_refused(&c, &t, &public).await;
        // Neutron's quota (50) comes first; raise it and the pool is what ends it.
        assert_eq!(last.0, StatusCode::CONFLICT, "{}", last.1);
        assert_eq!(last.1["NeutronError"]["type"], "OverQuota", "{}", last.1);
        c.set_floating_ip_quota(1000);
        last = floating_ips_until_refused(&c, &t, &public).await;
        assert_eq!(last.0, StatusCode::CONFLICT, "{}", last.1);
        assert_eq!(last.1["NeutronError"]["type"], "IpAddressGenerationFailure", "{}", last.1);
        assert_eq!(
            last.1["NeutronError"]["message"],
            format!("No more IP addresses available on network {public}.")
        );
        let (_, all) = call(&c, Method::GET, "/network/v2.0/floatingips", Some(&t), None).await;
        assert_eq!(all["floatingips"].as_array().map(Vec::len), Some(253), "pool .2–.254");
    }

    /// Octavia pages at `pagination_max_limit` with or without `limit` (a larger `limit` is
    /// capped, a smaller one honoured), a full page links to the next with its last object
    /// as the marker, and a full last page links to an empty one.
    #[tokio::test]
    async fn octavia_caps_its_pages_and_links_the_next() {
        let c = cloud_on("10.0.0.0/24", 3);
        let t = login(&c).await;
        for i in 0..6 {
            let (s, v) = lb(&c, &t, json!({"name": format!("lb-{i}")})).await;
            assert_eq!(s, StatusCode::CREATED, "{v}");
        }
        let list = |q: &str| {
            let c = c.clone();
            let (t, q) = (t.clone(), q.to_string());
            async move {
                call(
                    &c,
                    Method::GET,
                    &format!("/load-balancer/v2/lbaas/loadbalancers{q}"),
                    Some(&t),
                    None,
                )
                .await
                .1
            }
        };
        let names = |v: &Value| -> Vec<String> {
            v["loadbalancers"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|l| l["name"].as_str().map(str::to_string))
                .collect()
        };
        let next = |v: &Value| -> Option<String> {
            v["loadbalancers_links"].as_array()?.iter().find(|l| l["rel"] == "next")?["href"]
                .as_str()
                .map(str::to_string)
        };
        let first = list("").await;
        assert_eq!(names(&first), ["lb-0", "lb-1", "lb-2"], "{first}");
        let href = next(&first).expect("a full page links to the next");
        let marker = url::Url::parse(&href)
            .ok()
            .and_then(|u| u.query_pairs().find(|(k, _)| k == "marker").map(|(_, v)| v.into_owned()))
            .unwrap_or_default();
        assert_eq!(marker, first["loadbalancers"][2]["id"].as_str().unwrap_or_default());
        let second = list(&format!("?marker={marker}")).await;
        assert_eq!(names(&second), ["lb-3", "lb-4", "lb-5"], "{second}");
        let last = next(&second).expect("a full last page links on");
        assert!(last.contains("marker="), "{last}");
        let marker = second["loadbalancers"][2]["id"].as_str().unwrap_or_default().to_string();
        let empty = list(&format!("?marker={marker}")).await;
        assert!(names(&empty).is_empty() && next(&empty).is_none(), "{empty}");
        assert_eq!(names(&list("?limit=100").await).len(), 3, "capped at the maximum");
        let two = list("?limit=2").await;
        assert_eq!(names(&two), ["lb-0", "lb-1"]);
        assert!(next(&two).is_some());
    }

    #[tokio::test]
    async fn octavia_max_version_lists_only_up_to_it_and_refuses_newer_attributes() {
        // 2.4: no tags.
        let c = cloud_at(4);
        let (s, v) = call(&c, Method::GET, "/load-balancer/", None, None).await;
        assert_eq!(s, StatusCode::OK);
        let list = v["versions"].as_array().cloned().unwrap_or_default();
        assert_eq!(list.len(), 5, "{v}");
        assert_eq!(list[4]["id"], "v2.4");
        assert_eq!(list[4]["status"], "CURRENT");
        let t = login(&c).await;
        let (s, v) = lb(&c, &t, json!({"tags": ["kube_service_x"]})).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert_eq!(v["faultcode"], "Client");
        assert!(v["faultstring"].as_str().unwrap_or_default().contains("tags"), "{v}");
        assert!(c.octavia_objects("loadbalancers").is_empty(), "a refused create leaves nothing");
        let (s, _) = lb(&c, &t, json!({})).await;
        assert_eq!(s, StatusCode::CREATED);

        // 2.11: tags, but no allowed_cidrs (also inside a fully populated create).
        let c = cloud_at(11);
        let t = login(&c).await;
        let listener =
            json!({"protocol": "TCP", "protocol_port": 80, "allowed_cidrs": ["10.0.0.0/8"]});
        let (s, v) = lb(&c, &t, json!({"tags": ["a"], "listeners": [listener]})).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert!(v["faultstring"].as_str().unwrap_or_default().contains("allowed_cidrs"), "{v}");
        assert!(c.octavia_objects("loadbalancers").is_empty());
        let (s, v) = lb(&c, &t, json!({"tags": ["a"]})).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");

        // 2.15: allowed_cidrs, but an HTTP monitor on a UDP pool is refused (TCP is fine).
        let c = cloud_at(15);
        let t = login(&c).await;
        let udp = |ty: &str| {
            json!({"listeners": [{"protocol": "UDP", "protocol_port": 53,
            "allowed_cidrs": ["10.0.0.0/8"],
            "default_pool": {"protocol": "UDP", "lb_algorithm": "ROUND_ROBIN",
                "healthmonitor": {"type": ty, "delay": 5, "timeout": 3, "max_retries": 1}}}]})
        };
        let (s, v) = lb(&c, &t, udp("HTTP")).await;
        assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
        assert!(v["faultstring"].as_str().unwrap_or_default().contains("UDP"), "{v}");
        let (s, v) = lb(&c, &t, udp("UDP-CONNECT")).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");

        // The default (newest) accepts all of it.
        let c = cloud_at(OCTAVIA_MAX_MINOR);
        let t = login(&c).await;
        let (s, v) = lb(&c, &t, udp("HTTP")).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
    }

    #[test]
    fn the_world_file_s_openstack_section_sets_the_octavia_version() {
        let (w, os) = parse_world(
            "openstack:\n  octavia_max_version: \"2.11\"\ninstances:\n  - {name: a, zone: nova}\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(w.instances.len(), 1);
        assert_eq!(os.octavia_max_version.as_deref(), Some("2.11"));
        let opts = OpenStackOptions::default().with_world(&os).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(opts.octavia_max_minor, 11);
        let Err(e) = parse_world("openstack: {octavia_max_version: \"3.1\"}\n") else {
            panic!("3.1 accepted")
        };
        assert!(e.to_string().contains("octavia_max_version \"3.1\""), "{e}");
        let Err(e) = parse_world("openstack: {octavia_max_version: \"2.99\"}\n") else {
            panic!("2.99 accepted")
        };
        assert!(e.to_string().contains("v2.0 to v2.27"), "{e}");
        let (_, os) = parse_world(
            "openstack:\n  users: [{name: ccm, password: p, projects: [tenant-b]}]\n  projects: [{name: tenant-b}]\n  trusts: [{id: t1, trustor: admin, trustee: ccm, project: tenant-b}]\n  max_routes: 5\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let opts = OpenStackOptions::default().with_world(&os).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(opts.max_routes, 5);
        assert!(opts.trusts.iter().any(|t| t.id == "t1" && t.roles == ["member"]));
        assert!(opts.extra_users.iter().any(|u| u.name == "ccm" && u.domain == "Default"));
        let (_, os) = parse_world(
            "openstack:\n  trusts: [{id: t2, trustor: admin, trustee: nobody, project: demo}]\n",
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let Err(e) = OpenStackOptions::default().with_world(&os) else { panic!("unknown trustee") };
        assert!(e.to_string().contains("trust \"t2\": unknown user \"nobody\""), "{e}");
        let Err(e) = parse_world("openstack: {colour: red}\n") else { panic!("colour accepted") };
        assert!(e.to_string().contains("colour"), "{e}");
        let Err(e) = parse_world("instances:\n  - {name: a, zone: z, subnet: nope}\n") else {
            panic!("bad world accepted")
        };
        assert!(e.to_string().contains("unknown subnet"), "{e}");
        assert_eq!(parse_world("").map(|(w, _)| w.instances.len()).ok(), Some(0));
    }

    /// Through the kit's server and admin API: an armed operation failure makes a load
    /// balancer `ERROR` (and it stays), a failed child operation makes that child `ERROR` and
    /// leaves the load balancer `ACTIVE`; the realistic table is Octavia's.
    #[tokio::test]
    async fn an_operation_failure_is_octavia_error_and_stays() {
        use crate::asyncop::{Action, TimingProfile};
        use crate::server::{Server, ServerOptions};
        let opts =
            OpenStackOptions { lb_pending: Duration::from_millis(200), ..Default::default() };
        let cloud = OpenStackCloud::new(World::default(), opts);
        let subnet = cloud.neutron_id("subnets", "private-subnet").unwrap_or_default();
        let Ok(server) = Server::start(cloud, ServerOptions::default()).await else {
            panic!("server")
        };
        let admin = server.admin();
        let url = server.url();
        let http = reqwest::Client::new();
        let body = json!({"auth": {"identity": {"methods": ["password"], "password": {"user": {
            "name": DEFAULT_USER, "password": DEFAULT_PASSWORD, "domain": {"name": "Default"}}}}}});
        let Ok(r) = http.post(format!("{url}/identity/v3/auth/tokens")).json(&body).send().await
        else {
            panic!("token")
        };
        let tok = r
            .headers()
            .get("x-subject-token")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_string();
        let call = |m: reqwest::Method, path: &str, body: Option<Value>| {
            let mut rb = http
                .request(m, format!("{url}/load-balancer/v2/lbaas/{path}"))
                .header("x-auth-token", &tok);
            if let Some(b) = body {
                rb = rb.json(&b);
            }
            async move {
                let Ok(r) = rb.send().await else { panic!("call") };
                let status = r.status().as_u16();
                (status, r.json::<Value>().await.unwrap_or(Value::Null))
            }
        };
        let status_of = |path: String, key: &'static str| {
            let c = call(reqwest::Method::GET, &path, None);
            async move { c.await.1[key]["provisioning_status"].as_str().unwrap_or_default().to_string() }
        };
        let Ok(_) = admin
            .fail_operations("loadbalancer/*", Action::Create, 1, "No valid host was found")
            .await
        else {
            panic!("arming")
        };
        let (s, v) = call(
            reqwest::Method::POST,
            "loadbalancers",
            Some(json!({"loadbalancer": {"name": "doomed", "vip_subnet_id": subnet}})),
        )
        .await;
        assert_eq!(s, 201, "{v}");
        let lb = v["loadbalancer"]["id"].as_str().unwrap_or_default().to_string();
        assert_eq!(v["loadbalancer"]["provisioning_status"], "PENDING_CREATE");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(status_of(format!("loadbalancers/{lb}"), "loadbalancer").await, "ERROR");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(
            status_of(format!("loadbalancers/{lb}"), "loadbalancer").await,
            "ERROR",
            "ERROR stays"
        );

        // A second load balancer is fine; its listener's create fails.
        let (_, v) = call(
            reqwest::Method::POST,
            "loadbalancers",
            Some(json!({"loadbalancer": {"name": "ok", "vip_subnet_id": subnet}})),
        )
        .await;
        let lb2 = v["loadbalancer"]["id"].as_str().unwrap_or_default().to_string();
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(status_of(format!("loadbalancers/{lb2}"), "loadbalancer").await, "ACTIVE");
        let Ok(_) = admin
            .fail_operations(
                &format!("loadbalancer/{lb2}/listener/*"),
                Action::Create,
                1,
                "amphora agent unreachable",
            )
            .await
        else {
            panic!("arming")
        };
        let (s, v) = call(reqwest::Method::POST, "listeners",
            Some(json!({"listener": {"loadbalancer_id": lb2, "protocol": "TCP", "protocol_port": 80}}))).await;
        assert_eq!(s, 201, "{v}");
        let ln = v["listener"]["id"].as_str().unwrap_or_default().to_string();
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(status_of(format!("listeners/{ln}"), "listener").await, "ERROR");
        assert_eq!(status_of(format!("loadbalancers/{lb2}"), "loadbalancer").await, "ACTIVE");
        // A failed child delete leaves the child, ERROR.
        let Ok(_) =
            admin.fail_operations("loadbalancer/*/listener/*", Action::Delete, 1, "x").await
        else {
            panic!("arming")
        };
        let (s, _) = call(reqwest::Method::DELETE, &format!("listeners/{ln}"), None).await;
        assert_eq!(s, 204);
        assert_eq!(status_of(format!("listeners/{ln}"), "listener").await, "PENDING_DELETE");
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(status_of(format!("listeners/{ln}"), "listener").await, "ERROR");
        // A delete that succeeds removes it.
        let (s, _) = call(reqwest::Method::DELETE, &format!("listeners/{ln}"), None).await;
        assert_eq!(s, 204);
        tokio::time::sleep(Duration::from_millis(400)).await;
        let (s, _) = call(reqwest::Method::GET, &format!("listeners/{ln}"), None).await;
        assert_eq!(s, 404);
        assert_eq!(
            status_of(format!("loadbalancers/{lb2}"), "loadbalancer").await,
            "ACTIVE",
            "a child's delete leaves its load balancer ACTIVE"
        );

        let Ok(report) = admin.timing_report().await else { panic!("timing") };
        assert_eq!(report.realistic.map(|t| t.create_ms), Some(45_000));
        let Ok(()) = admin.set_timing(TimingProfile::Realistic, 0.01).await else {
            panic!("timing")
        };
        let (_, v) = call(
            reqwest::Method::POST,
            "loadbalancers",
            Some(json!({"loadbalancer": {"name": "slow", "vip_subnet_id": subnet}})),
        )
        .await;
        let lb3 = v["loadbalancer"]["id"].as_str().unwrap_or_default().to_string();
        tokio::time::sleep(Duration::from_millis(250)).await;
        assert_eq!(
            status_of(format!("loadbalancers/{lb3}"), "loadbalancer").await,
            "PENDING_CREATE",
            "450 ms at 0.01"
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(status_of(format!("loadbalancers/{lb3}"), "loadbalancer").await, "ACTIVE");
        // A listener created on it is an update of the load balancer (100 ms at 0.01), not a
        // second create (450 ms): Octavia pushes the amphora's configuration.
        let (s, v) = call(
            reqwest::Method::POST,
            "listeners",
            Some(json!({"listener": {"loadbalancer_id": lb3, "protocol": "TCP", "protocol_port": 80}})),
        )
        .await;
        assert_eq!(s, 201, "{v}");
        assert_eq!(
            status_of(format!("loadbalancers/{lb3}"), "loadbalancer").await,
            "PENDING_UPDATE"
        );
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(
            status_of(format!("loadbalancers/{lb3}"), "loadbalancer").await,
            "ACTIVE",
            "a child's create takes an update's time"
        );
    }

    #[test]
    fn nova_name_filter_is_a_regex() {
        assert!(name_matches("^node\\-1$", "node-1"));
        assert!(!name_matches("^node\\-1$", "node-10"));
        assert!(name_matches("node", "my-node-3"));
    }

    #[test]
    fn cidr_membership() {
        assert!(in_cidr("10.0.0.7", "10.0.0.0/24"));
        assert!(!in_cidr("10.0.1.7", "10.0.0.0/24"));
        assert_eq!(nth_host("10.1.0.0/16", 260), "10.1.1.4");
    }
}
