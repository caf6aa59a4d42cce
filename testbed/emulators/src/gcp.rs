//! GCP emulator: the Compute Engine v1 REST subset the GCP provider calls and the metadata
//! server, with Compute's paths, `Operation`s, paging, filters, fingerprints and Google error
//! bodies, so `google.golang.org/api/compute/v1` and `cloud.google.com/go/compute/metadata`
//! parse every reply (`ci/fidelity/run gcp` checks that). Shapes follow the discovery
//! document `compute/v1/compute-api.json` of `google.golang.org/api` v0.311.0.
//!
//! | call | operation (faults and counters key on it) |
//! |---|---|
//! | `GET /computeMetadata/v1/…` (`Metadata-Flavor: Google`; `universe/universe-domain` is `googleapis.com`) | `metadata.get` |
//! | `POST /token` (gce.conf `token-url`, body ignored) | `token.alt` |
//! | `POST /v1/token` (Google STS token exchange: Workload Identity image pulls) | `sts.token` |
//! | `GET …/projects/{p}` (with `quotas[]`) | `compute.projects.get` |
//! | `GET …/projects/{p}/zones[/{z}]`, `…/regions[/{r}]` | `compute.zones.{list,get}`, `compute.regions.{list,get}` |
//! | `GET …/aggregated/{coll}` | `compute.{coll}.aggregatedList` |
//! | `{GET,POST} …/{global,zones/z,regions/r}/{coll}` | `compute.{coll}.{list,insert}` |
//! | `{GET,DELETE,PATCH,PUT} …/{coll}/{name}` | `compute.{coll}.{get,delete,patch,update}` |
//! | `POST …/{coll}/{name}/{action}` | `compute.{coll}.{action}` (`addInstance`, `removeInstance`, `addInstances`, `removeInstances`, `listInstances`, `getHealth`, `setTarget`, `setLabels`) |
//! | `GET …/operations/{op}`, `POST …/operations/{op}/wait` | `compute.{zone,region,global}Operations.{get,wait}` |
//!
//! `{coll}` is the URL collection; regional `healthChecks`/`backendServices` are named
//! `regionHealthChecks`/`regionBackendServices`, global `addresses`/`forwardingRules`
//! `globalAddresses`/`globalForwardingRules` (the Go client's service names).
//!
//! Rules enforced as Compute does: every Compute call needs a bearer token this emulator
//! issued (metadata server or token URL; 401 `authError`); an insert of an existing name is a
//! 409 `alreadyExists`; an unknown resource is a 404 `notFound`; a `PATCH`/`PUT` or
//! `setLabels` with a stale `fingerprint`/`labelFingerprint` is a 412 `conditionNotMet`;
//! deleting a resource another one references (a target pool, health check, instance group
//! or backend service in use) is a 400 `resourceInUseByAnotherResource`, but deleting an
//! address a forwarding rule uses releases it (the rule keeps its IP, now ephemeral: how
//! upstream's load balancers "demote" the static IP they held, kubernetes/kubernetes#20662); a
//! forwarding rule's `target`/`backendService`, a target pool's instances and health checks,
//! a backend service's groups and health checks must exist (404 `notFound`); a route whose
//! `nextHopInstance` was deleted stays, listed with the warning `NEXT_HOP_INSTANCE_NOT_FOUND`.
//! Mutations answer with an `Operation` that is `PENDING`, then `RUNNING`, then `DONE` after
//! [`GcpOptions::pending`] (or the kit's timing profile: [`REALISTIC`] seconds, scaled), and
//! take effect when it is `DONE`: before, a GET shows the resource as it was (an insert: 404;
//! an address: `RESERVING`), and a change to it, or an insert naming it, is a 400
//! `resourceNotReady`. An operation the kit fails (admin `operation-failures`) ends `DONE`
//! with `error.errors[]{code, message}` (`INTERNAL_ERROR`, or the `CODE:` the message starts
//! with), `httpErrorStatusCode`, and changes nothing. Refused as Compute refuses them: a
//! backend-service update or patch without its `fingerprint` (412 `conditionNotMet`); a
//! forwarding rule with more than 5 `ports`, with both `ports` and `portRange`, `INTERNAL`
//! without a `backendService`, or on an address of another network tier (400 `invalid`); an
//! instance of another zone added to an instance group (400 `invalid`); an insert past a
//! quota (403 `quotaExceeded`, `Quota 'METRIC' exceeded.  Limit: N.0 in region R.`; metrics
//! [`REGIONAL_QUOTAS`] and [`PROJECT_QUOTAS`], limits [`GcpOptions::quotas`], reported by
//! `regions.get` and `projects.get` `quotas[]`). Lists page with `maxResults` (at most
//! [`GcpOptions::max_results`]) and `pageToken`; `filter` takes `field eq|ne regex`,
//! `field = value` and `field != value` terms (ANDed, optionally parenthesised).
//! Errors: `{"error":{"code","message","errors":[{"message","domain","reason"}]}}`.
//!
//! World mapping: instances are Compute instances in their zone (region = the zone without its
//! last `-x`); `type` is the machine type (`e2-standard-2` by default); the primary private
//! IPv4 is `networkIP`, an IPv6 private address `ipv6Address` (`ipv6AccessType: INTERNAL`,
//! `internalIpv6PrefixLength: 96`), a public IPv6 an external `DIRECT_IPV6` access config
//! (`ipv6AccessType: EXTERNAL`, `externalIpv6`, prefix length 96, no `ipv6Address`), the
//! `stackType` `IPV4_ONLY`, `IPV4_IPV6` or (IPv6 without IPv4) `IPV6_ONLY`; public IPv4s
//! one-to-one NAT access configs; tag `gce.tags` (comma-separated) gives the network tags (default
//! `k8s-node`), `gce.alias` an alias IP range (`10.64.1.0/24`); other tags are labels. Power:
//! running `RUNNING`, stopped `TERMINATED`, terminated `STOPPING`. `networks` are global
//! networks (`default` when none), custom mode unless named in [`GcpOptions::auto_mode_networks`]
//! (then `autoCreateSubnetworks: true` with a subnetwork named like the network in every
//! region, from Google's auto-mode range, [`auto_mode_range`]); `subnets` regional
//! subnetworks. The world file's `gcp:` section ([`GcpWorld`], read by [`load_world`]) sets
//! quota limits and auto-mode networks. The metadata server speaks for
//! [`GcpOptions::metadata_instance`] (default: the world's first instance).

// Handlers return the Compute error reply itself as their error.
#![allow(clippy::result_large_err)]

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use serde_json::{Map, Value, json};

use crate::asyncop::{Action, AsyncOps, Operation, Phase, Timing, gce_operation};
use crate::server::{Body, Cloud, ErrorKind, ErrorReply, ServeFuture, full};
use crate::world::{Instance, PowerState, World, WorldError};

/// Where Compute's self-links point (as Compute answers whatever endpoint was called).
pub const LINK_PREFIX: &str = "https://www.googleapis.com/compute/v1/";

/// The `realistic` timing profile of Compute operations: a regional or global networking
/// insert (address, forwarding rule, target pool, backend service, firewall) is `DONE` after
/// tens of seconds, a change after about ten, a delete after about fifteen (orders of
/// magnitude as Compute's operations report them in `insertTime`/`endTime`; see
/// docs/emulators.md).
pub const REALISTIC: Timing = Timing {
    create: Duration::from_secs(20),
    update: Duration::from_secs(10),
    delete: Duration::from_secs(15),
};

/// How the emulator is set up beyond its world.
#[derive(Debug, Clone)]
pub struct GcpOptions {
    /// The project id.
    pub project: String,
    /// The numeric project id.
    pub project_number: u64,
    /// How long operations stay `PENDING`/`RUNNING`.
    pub pending: Duration,
    /// The largest page (`maxResults` above it is capped; Compute's is 500).
    pub max_results: usize,
    /// The instance the metadata server speaks for (default: the world's first).
    pub metadata_instance: Option<String>,
    /// The service account's scopes the metadata server reports.
    pub scopes: Vec<String>,
    /// The service account's email.
    pub service_account: String,
    /// How long issued tokens live.
    pub token_lifetime: Duration,
    /// Quota limits by Compute metric ([`REGIONAL_QUOTAS`] per region, [`PROJECT_QUOTAS`] per
    /// project); a metric not given has its [`default_quota`].
    pub quotas: BTreeMap<String, u64>,
    /// Networks in auto mode (`autoCreateSubnetworks: true`): each has a subnetwork named
    /// like it in every region of the world, from Google's auto-mode range
    /// ([`auto_mode_range`]), besides the world's own subnets of it.
    pub auto_mode_networks: BTreeSet<String>,
}

/// The GCP-only part of a world file, under its `gcp:` key:
///
/// ```yaml
/// gcp:
///   quotas: { FORWARDING_RULES: 2, HEALTH_CHECKS: 10 }   # limits; see REGIONAL_QUOTAS, PROJECT_QUOTAS
///   auto_mode_networks: [default]                     # networks in auto mode
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GcpWorld {
    /// Quota limits by metric ([`GcpOptions::quotas`]); an unknown metric is refused.
    #[serde(default)]
    pub quotas: BTreeMap<String, u64>,
    /// Networks in auto mode ([`GcpOptions::auto_mode_networks`]); each must be a network of
    /// the world (`default` when the world names none).
    #[serde(default)]
    pub auto_mode_networks: Vec<String>,
}

impl GcpWorld {
    /// Sets these on `opts`.
    pub fn apply(&self, opts: &mut GcpOptions) {
        opts.quotas.extend(self.quotas.iter().map(|(k, v)| (k.clone(), *v)));
        opts.auto_mode_networks.extend(self.auto_mode_networks.iter().cloned());
    }
}

/// Reads a world file with an optional `gcp:` section ([`GcpWorld`]): the kit's world and the
/// GCP settings, each checked (an unknown quota metric or auto-mode network is named).
pub fn load_world(path: &std::path::Path) -> Result<(World, GcpWorld), WorldError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| WorldError::Read { path: path.to_path_buf(), source })?;
    parse_world_named(&text, &path.display().to_string())
}

/// [`load_world`] from text.
pub fn parse_world(text: &str) -> Result<(World, GcpWorld), WorldError> {
    parse_world_named(text, "<inline>")
}

fn parse_world_named(text: &str, origin: &str) -> Result<(World, GcpWorld), WorldError> {
    let invalid = |detail: String| WorldError::Invalid { origin: origin.into(), detail };
    let mut v: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?
    } else {
        serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?
    };
    let gcp = match v.as_object_mut().and_then(|m| m.remove("gcp")) {
        None | Some(Value::Null) => GcpWorld::default(),
        Some(o) => serde_json::from_value(o).map_err(|e| invalid(format!("gcp: {e}")))?,
    };
    for metric in gcp.quotas.keys() {
        if !REGIONAL_QUOTAS.contains(&metric.as_str()) && !PROJECT_QUOTAS.contains(&metric.as_str())
        {
            return Err(invalid(format!(
                "gcp: quotas: unknown metric {metric:?} (known: {})",
                REGIONAL_QUOTAS
                    .iter()
                    .chain(PROJECT_QUOTAS)
                    .copied()
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
    }
    let rest = if v.is_null() { "{}".to_string() } else { v.to_string() };
    let world = World::parse(&rest).map_err(|e| match e {
        WorldError::Invalid { detail, .. } => invalid(detail),
        other => other,
    })?;
    for n in &gcp.auto_mode_networks {
        let known = if world.networks.is_empty() {
            n == "default"
        } else {
            world.networks.iter().any(|x| &x.name == n)
        };
        if !known {
            return Err(invalid(format!(
                "gcp: auto_mode_networks: {n:?} is not a network of the world"
            )));
        }
    }
    Ok((world, gcp))
}

/// The IPv4 range of an auto-mode network's subnetwork in `region`: Google's for the regions
/// it publishes (us-central1 `10.128.0.0/20`, …), else a /20 inside `10.128.0.0/9` derived
/// from the region's name.
pub fn auto_mode_range(region: &str) -> String {
    const KNOWN: &[(&str, &str)] = &[
        ("us-central1", "10.128.0.0/20"),
        ("europe-west1", "10.132.0.0/20"),
        ("us-west1", "10.138.0.0/20"),
        ("asia-east1", "10.140.0.0/20"),
        ("us-east1", "10.142.0.0/20"),
        ("asia-northeast1", "10.146.0.0/20"),
        ("asia-southeast1", "10.148.0.0/20"),
        ("us-east4", "10.150.0.0/20"),
        ("australia-southeast1", "10.152.0.0/20"),
        ("europe-west2", "10.154.0.0/20"),
        ("europe-west3", "10.156.0.0/20"),
        ("southamerica-east1", "10.158.0.0/20"),
        ("asia-south1", "10.160.0.0/20"),
        ("northamerica-northeast1", "10.162.0.0/20"),
        ("europe-west4", "10.164.0.0/20"),
        ("europe-north1", "10.166.0.0/20"),
    ];
    if let Some((_, r)) = KNOWN.iter().find(|(name, _)| *name == region) {
        return (*r).to_string();
    }
    format!("10.{}.{}.0/20", 168 + fnv(region) % 80, (fnv(region) >> 8) % 16 * 16)
}

/// The regional quota metrics the emulator enforces: `FORWARDING_RULES` (forwarding rules of
/// the region), `STATIC_ADDRESSES` (reserved external addresses), `IN_USE_ADDRESSES`
/// (external IPs held: reserved external addresses and external forwarding rules on an
/// ephemeral IP), `INTERNAL_ADDRESSES` (reserved internal addresses).
pub const REGIONAL_QUOTAS: &[&str] =
    &["FORWARDING_RULES", "STATIC_ADDRESSES", "IN_USE_ADDRESSES", "INTERNAL_ADDRESSES"];

/// The project quota metrics the emulator enforces: `BACKEND_SERVICES` and `HEALTH_CHECKS`
/// (global and regional ones, legacy HTTP health checks included), `FIREWALLS`.
pub const PROJECT_QUOTAS: &[&str] = &["BACKEND_SERVICES", "HEALTH_CHECKS", "FIREWALLS"];

/// The emulator's default limit of a quota metric (roomy, in the order of a new project's
/// defaults; tests lower them with [`GcpOptions::quotas`] or [`GcpCloud::set_quota`]).
pub fn default_quota(metric: &str) -> u64 {
    match metric {
        "FORWARDING_RULES" => 75,
        "STATIC_ADDRESSES" => 21,
        "IN_USE_ADDRESSES" => 69,
        "INTERNAL_ADDRESSES" => 200,
        "BACKEND_SERVICES" => 75,
        "HEALTH_CHECKS" => 75,
        "FIREWALLS" => 200,
        _ => u64::MAX,
    }
}

impl Default for GcpOptions {
    fn default() -> Self {
        GcpOptions {
            project: "emulated-project".into(),
            project_number: 123_456_789_012,
            pending: Duration::from_millis(300),
            max_results: 500,
            metadata_instance: None,
            scopes: vec![
                "https://www.googleapis.com/auth/cloud-platform".into(),
                "https://www.googleapis.com/auth/devstorage.read_only".into(),
            ],
            service_account: "default-sa@emulated-project.iam.gserviceaccount.com".into(),
            token_lifetime: Duration::from_secs(3600),
            quotas: BTreeMap::new(),
            auto_mode_networks: BTreeSet::new(),
        }
    }
}

type Resp = Response<Body>;
type Res<T> = Result<T, Resp>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn rfc3339_now() -> String {
    format!("{}.000-00:00", crate::kit::utc_datetime(crate::kit::unix_now()))
}

/// Google's JSON error body.
pub fn error_body(code: u16, reason: &str, message: &str) -> Value {
    json!({ "error": {
        "code": code,
        "message": message,
        "errors": [{ "message": message, "domain": "global", "reason": reason }],
    }})
}

fn reply(status: StatusCode, v: &Value) -> Resp {
    let mut r = Response::new(full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json; charset=UTF-8"));
    r
}

fn err(code: u16, reason: &str, message: impl AsRef<str>) -> Resp {
    let status = StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    reply(status, &error_body(code, reason, message.as_ref()))
}

fn not_found(path: &str) -> Resp {
    err(404, "notFound", format!("The resource '{path}' was not found"))
}

fn bad(reason: &str, message: impl AsRef<str>) -> Resp {
    err(400, reason, message)
}

fn text(status: StatusCode, body: impl Into<String>) -> Resp {
    let mut r = Response::new(full(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/text"));
    r.headers_mut().insert("Metadata-Flavor", HeaderValue::from_static("Google"));
    r
}

fn query(req: &Request<Bytes>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn q<'a>(qs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    qs.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

/// The region of a zone (`us-central1-a` → `us-central1`).
pub fn region_of(zone: &str) -> String {
    match zone.rsplit_once('-') {
        Some((r, _)) => r.to_string(),
        None => zone.to_string(),
    }
}

/// The part of a link from `projects/` on, or the link itself.
fn rel(link: &str) -> &str {
    match link.find("projects/") {
        Some(i) => &link[i..],
        None => link,
    }
}

/// A parsed Compute path (after `/compute/v1/projects/{p}/`).
#[derive(Debug, Clone, PartialEq, Eq)]
enum Target {
    Metadata(String),
    AltToken,
    /// Google's Security Token Service token exchange (`POST /v1/token`).
    Sts,
    Project,
    Zones(Option<String>),
    Regions(Option<String>),
    Aggregated(String),
    /// scope (`global`, `zones/z`, `regions/r`), op id, wait?
    Operation(String, String, bool),
    /// scope, collection, name, action
    Resource(String, String, Option<String>, Option<String>),
    Unknown,
}

fn parse_target(path: &str) -> (Option<String>, Target) {
    if let Some(rest) = path.strip_prefix("/computeMetadata/v1/") {
        return (None, Target::Metadata(rest.to_string()));
    }
    if path == "/token" {
        return (None, Target::AltToken);
    }
    if path == "/v1/token" {
        return (None, Target::Sts);
    }
    let Some(rest) = path.strip_prefix("/compute/v1/projects/") else {
        return (None, Target::Unknown);
    };
    let segs: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let Some((project, segs)) = segs.split_first() else {
        return (None, Target::Unknown);
    };
    let s = |i: usize| segs.get(i).map(|x| x.to_string());
    let t = match segs {
        [] => Target::Project,
        ["zones"] => Target::Zones(None),
        ["zones", z] => Target::Zones(Some(z.to_string())),
        ["regions"] => Target::Regions(None),
        ["regions", r] => Target::Regions(Some(r.to_string())),
        ["aggregated", c] => Target::Aggregated(c.to_string()),
        ["global", "operations", id] => Target::Operation("global".into(), id.to_string(), false),
        ["global", "operations", id, "wait"] => {
            Target::Operation("global".into(), id.to_string(), true)
        }
        [k @ ("zones" | "regions"), z, "operations", id, rest @ ..] if rest.len() <= 1 => {
            Target::Operation(format!("{k}/{z}"), id.to_string(), rest == ["wait"])
        }
        ["global", c, ..] if segs.len() <= 4 => {
            Target::Resource("global".into(), c.to_string(), s(2), s(3))
        }
        [k @ ("zones" | "regions"), z, c, ..] if segs.len() <= 5 => {
            Target::Resource(format!("{k}/{z}"), c.to_string(), s(3), s(4))
        }
        _ => Target::Unknown,
    };
    (Some(project.to_string()), t)
}

/// The Go client's service name of a collection in a scope.
fn service(scope: &str, coll: &str) -> String {
    let regional = scope.starts_with("regions/");
    let global = scope == "global";
    match coll {
        "healthChecks" | "backendServices" if regional => {
            format!("region{}{}", coll[..1].to_ascii_uppercase(), &coll[1..])
        }
        "addresses" | "forwardingRules" if global => {
            format!("global{}{}", coll[..1].to_ascii_uppercase(), &coll[1..])
        }
        _ => coll.to_string(),
    }
}

fn operation_name(method: &Method, t: &Target) -> String {
    match t {
        Target::Metadata(_) => "metadata.get".into(),
        Target::AltToken => "token.alt".into(),
        Target::Sts => "sts.token".into(),
        Target::Project => "compute.projects.get".into(),
        Target::Zones(None) => "compute.zones.list".into(),
        Target::Zones(Some(_)) => "compute.zones.get".into(),
        Target::Regions(None) => "compute.regions.list".into(),
        Target::Regions(Some(_)) => "compute.regions.get".into(),
        Target::Aggregated(c) => format!("compute.{c}.aggregatedList"),
        Target::Operation(scope, _, wait) => {
            let kind = scope.split('/').next().unwrap_or("global");
            let kind = match kind {
                "zones" => "zone",
                "regions" => "region",
                _ => "global",
            };
            format!("compute.{kind}Operations.{}", if *wait { "wait" } else { "get" })
        }
        Target::Resource(scope, coll, name, action) => {
            let verb = match (method, name, action) {
                (_, Some(_), Some(a)) => a.as_str(),
                (&Method::GET, None, None) => "list",
                (&Method::POST, None, None) => "insert",
                (&Method::GET, Some(_), None) => "get",
                (&Method::DELETE, Some(_), None) => "delete",
                (&Method::PATCH, Some(_), None) => "patch",
                (&Method::PUT, Some(_), None) => "update",
                _ => "unknown",
            };
            format!("compute.{}.{verb}", service(scope, coll))
        }
        Target::Unknown => "compute.unknown".into(),
    }
}

fn singular(coll: &str) -> String {
    match coll {
        "addresses" => "address".into(),
        c => c.strip_suffix('s').unwrap_or(c).to_string(),
    }
}

/// A tiny regular-expression matcher (RE2 subset Compute filters use): literals, `.`, `\x`,
/// `*`, `+`, `?`, `^`/`$` (anchoring is implied) and `(a|b)` groups. Whole-string match.
mod re {
    #[derive(Debug, Clone)]
    enum Atom {
        Char(char),
        Any,
        Group(Vec<Vec<Item>>),
    }
    #[derive(Debug, Clone)]
    struct Item {
        atom: Atom,
        min: usize,
        many: bool,
    }

    pub fn full_match(pattern: &str, s: &str) -> Result<bool, String> {
        let chars: Vec<char> = pattern.chars().collect();
        let mut pos = 0;
        let alts = parse_alts(&chars, &mut pos)?;
        if pos != chars.len() {
            return Err(format!("unbalanced ')' in {pattern:?}"));
        }
        let text: Vec<char> = s.chars().collect();
        Ok(match_alts(&alts, &text, 0, &mut |end| end == text.len()))
    }

    fn parse_alts(c: &[char], pos: &mut usize) -> Result<Vec<Vec<Item>>, String> {
        let mut alts = vec![Vec::new()];
        while *pos < c.len() {
            let ch = c[*pos];
            let atom = match ch {
                ')' => break,
                '|' => {
                    *pos += 1;
                    alts.push(Vec::new());
                    continue;
                }
                '^' | '$' => {
                    *pos += 1;
                    continue;
                }
                '(' => {
                    *pos += 1;
                    if c.get(*pos) == Some(&'?') && c.get(*pos + 1) == Some(&':') {
                        *pos += 2;
                    }
                    let inner = parse_alts(c, pos)?;
                    if c.get(*pos) != Some(&')') {
                        return Err("unclosed '('".into());
                    }
                    *pos += 1;
                    Atom::Group(inner)
                }
                '.' => {
                    *pos += 1;
                    Atom::Any
                }
                '\\' => {
                    *pos += 2;
                    Atom::Char(*c.get(*pos - 1).ok_or("trailing backslash")?)
                }
                '*' | '+' | '?' => return Err(format!("nothing to repeat before {ch:?}")),
                _ => {
                    *pos += 1;
                    Atom::Char(ch)
                }
            };
            let (min, many) = match c.get(*pos) {
                Some('*') => (0, true),
                Some('+') => (1, true),
                Some('?') => (0, false),
                _ => (1, false),
            };
            if min != 1 || many {
                *pos += 1;
            }
            if let Some(last) = alts.last_mut() {
                last.push(Item { atom, min, many });
            }
        }
        Ok(alts)
    }

    fn match_alts(
        alts: &[Vec<Item>],
        t: &[char],
        i: usize,
        k: &mut dyn FnMut(usize) -> bool,
    ) -> bool {
        alts.iter().any(|seq| match_seq(seq, t, i, k))
    }

    fn match_seq(seq: &[Item], t: &[char], i: usize, k: &mut dyn FnMut(usize) -> bool) -> bool {
        let Some((first, rest)) = seq.split_first() else {
            return k(i);
        };
        match_item(first, 0, t, i, &mut |j| match_seq(rest, t, j, k))
    }

    fn match_item(
        it: &Item,
        count: usize,
        t: &[char],
        i: usize,
        k: &mut dyn FnMut(usize) -> bool,
    ) -> bool {
        let max = if it.many { usize::MAX } else { 1 };
        // Greedy: one more first, then stop.
        if count < max {
            let more =
                match_atom(&it.atom, t, i, &mut |j| j != i && match_item(it, count + 1, t, j, k));
            if more {
                return true;
            }
        }
        count >= it.min && k(i)
    }

    fn match_atom(a: &Atom, t: &[char], i: usize, k: &mut dyn FnMut(usize) -> bool) -> bool {
        match a {
            Atom::Char(c) => t.get(i) == Some(c) && k(i + 1),
            Atom::Any => i < t.len() && k(i + 1),
            Atom::Group(alts) => match_alts(alts, t, i, k),
        }
    }
}

/// One filter term.
#[derive(Debug)]
struct Term {
    field: String,
    op: String,
    value: String,
}

fn parse_filter(f: &str) -> Result<Vec<Term>, String> {
    let mut toks = Vec::new();
    let mut cur = String::new();
    let mut quoted = false;
    for ch in f.chars() {
        match ch {
            '"' => {
                quoted = !quoted;
                cur.push(ch);
            }
            '(' | ')' if !quoted => {
                if !cur.is_empty() {
                    toks.push(std::mem::take(&mut cur));
                }
            }
            c if c.is_whitespace() && !quoted => {
                if !cur.is_empty() {
                    toks.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        toks.push(cur);
    }
    let mut terms = Vec::new();
    let mut i = 0;
    while i < toks.len() {
        if toks[i].eq_ignore_ascii_case("AND") {
            i += 1;
            continue;
        }
        if toks[i].eq_ignore_ascii_case("OR") {
            return Err("OR is not supported by this emulator's filter".into());
        }
        let (field, op, value) = match (toks.get(i), toks.get(i + 1), toks.get(i + 2)) {
            (Some(f), Some(o), Some(v)) if ["eq", "ne", "=", "!="].contains(&o.as_str()) => {
                (f.clone(), o.clone(), v.clone())
            }
            _ => {
                return Err(format!(
                    "Invalid value for field 'filter': '{f}'. Invalid list filter expression."
                ));
            }
        };
        let value = value.trim_matches('"').to_string();
        terms.push(Term { field, op, value });
        i += 3;
    }
    Ok(terms)
}

fn field_values(v: &Value, path: &[&str], out: &mut Vec<String>) {
    match v {
        Value::Array(a) => a.iter().for_each(|x| field_values(x, path, out)),
        _ => match path.split_first() {
            None => out.push(match v {
                Value::String(s) => s.clone(),
                Value::Null => String::new(),
                x => x.to_string(),
            }),
            Some((k, rest)) => {
                if let Some(x) = v.get(*k) {
                    field_values(x, rest, out);
                } else if rest.is_empty() {
                    out.push(String::new());
                }
            }
        },
    }
}

fn matches(terms: &[Term], v: &Value) -> Result<bool, String> {
    for t in terms {
        let path: Vec<&str> = t.field.split('.').collect();
        let mut vals = Vec::new();
        field_values(v, &path, &mut vals);
        let hit = match t.op.as_str() {
            "eq" | "ne" => {
                let mut any = false;
                for x in &vals {
                    if re::full_match(&t.value, x)? {
                        any = true;
                    }
                }
                any == (t.op == "eq")
            }
            "=" => vals.iter().any(|x| x == &t.value),
            _ => !vals.iter().any(|x| x == &t.value),
        };
        if !hit {
            return Ok(false);
        }
    }
    Ok(true)
}

type Key = (String, String, String);

/// What a mutation does to its resource once its operation is `DONE`.
#[derive(Debug, Clone)]
enum Change {
    /// The resource becomes this (an insert, an update, an action's result).
    Put(Value),
    /// The resource goes.
    Remove,
}

/// A mutation accepted and not yet applied: Compute applies it when its operation is `DONE`
/// (a failed operation leaves the resource as it was, an insert not made).
#[derive(Debug, Clone)]
struct PendingChange {
    op: String,
    key: Key,
    link: String,
    change: Change,
}

#[derive(Debug, Default)]
struct State {
    /// (collection, scope, name) → resource.
    res: BTreeMap<Key, Value>,
    /// Mutations whose operations are still running, in the order they were accepted.
    pending: Vec<PendingChange>,
    /// Operation id → scope.
    op_scope: BTreeMap<String, String>,
    /// Issued tokens.
    tokens: BTreeSet<String>,
    next_id: u64,
    next_ip: u32,
    attributes: BTreeMap<String, String>,
    /// Subject tokens STS exchanged.
    sts_subjects: Vec<String>,
}

/// The GCP emulator (Compute v1 subset and the metadata server on one URL).
pub struct GcpCloud {
    world: World,
    opts: Mutex<GcpOptions>,
    state: Mutex<State>,
    ops: AsyncOps,
}

impl std::fmt::Debug for GcpCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GcpCloud").finish_non_exhaustive()
    }
}

impl GcpCloud {
    /// An emulator holding `world`.
    pub fn new(world: World, opts: GcpOptions) -> Arc<GcpCloud> {
        let ops = AsyncOps::new(opts.pending);
        ops.set_realistic(REALISTIC);
        let c = Arc::new(GcpCloud { world, opts: Mutex::new(opts), state: Mutex::default(), ops });
        c.load();
        c
    }

    fn o(&self) -> GcpOptions {
        lock(&self.opts).clone()
    }

    /// The state, with every mutation whose operation has finished applied (done) or dropped
    /// (failed).
    fn st(&self) -> MutexGuard<'_, State> {
        let mut st = lock(&self.state);
        settle(&self.ops, &mut st);
        st
    }

    /// Sets a quota metric's limit (see [`REGIONAL_QUOTAS`], [`PROJECT_QUOTAS`]).
    pub fn set_quota(&self, metric: &str, limit: u64) {
        lock(&self.opts).quotas.insert(metric.to_string(), limit);
    }

    /// The limit of a quota metric.
    pub fn quota(&self, metric: &str) -> u64 {
        lock(&self.opts).quotas.get(metric).copied().unwrap_or_else(|| default_quota(metric))
    }

    /// The operations' long-running machinery (failures, timing).
    pub fn ops(&self) -> &AsyncOps {
        &self.ops
    }

    /// The project id.
    pub fn project(&self) -> String {
        self.o().project
    }

    /// The region: the world's, else that of its first zone, else `us-central1`.
    pub fn region(&self) -> String {
        self.world.region.clone().unwrap_or_else(|| {
            self.world.zones().iter().next().map(|z| region_of(z)).unwrap_or("us-central1".into())
        })
    }

    fn base(&self) -> String {
        format!("{LINK_PREFIX}projects/{}", self.project())
    }

    /// The self-link of a resource.
    pub fn link(&self, scope: &str, coll: &str, name: &str) -> String {
        format!("{}/{scope}/{coll}/{name}", self.base())
    }

    /// Sets how long operations stay pending.
    pub fn set_pending(&self, d: Duration) {
        lock(&self.opts).pending = d;
        self.ops.set_pending_for(d);
    }

    /// Ends every running operation now (its change takes effect at the next request), so a
    /// test can hold operations running (a long [`Self::set_pending`]), look at what a
    /// client does meanwhile, then let Compute finish without waiting.
    pub fn complete_pending(&self) {
        self.ops.finish_pending();
    }

    /// Sets the largest page.
    pub fn set_max_results(&self, n: usize) {
        lock(&self.opts).max_results = n.max(1);
    }

    /// Sets (Some) or removes (None) an instance attribute of the metadata server's instance.
    pub fn set_attribute(&self, key: &str, value: Option<&str>) {
        let mut st = self.st();
        match value {
            Some(v) => st.attributes.insert(key.into(), v.into()),
            None => st.attributes.remove(key),
        };
    }

    /// Sets the scopes the metadata server reports.
    pub fn set_scopes(&self, scopes: Vec<String>) {
        lock(&self.opts).scopes = scopes;
    }

    /// Forgets every issued token (clients must fetch new ones).
    pub fn expire_tokens(&self) {
        self.st().tokens.clear();
    }

    /// A token the compute API accepts (for tests that do not use the metadata server).
    pub fn issue_token(&self) -> String {
        let mut st = self.st();
        st.next_id += 1;
        let t = format!("ya29.emulator-{}-{}", st.next_id, fnv(&st.next_id.to_string()));
        st.tokens.insert(t.clone());
        t
    }

    /// Every token issued and not forgotten (tests scan logs for them).
    pub fn tokens(&self) -> Vec<String> {
        self.st().tokens.iter().cloned().collect()
    }

    /// Every resource of a collection in every scope (`instances`, `targetPools`…).
    pub fn resources(&self, coll: &str) -> Vec<Value> {
        let st = self.st();
        st.res.iter().filter(|((c, _, _), _)| c == coll).map(|(_, v)| self.render(&st, v)).collect()
    }

    /// One resource.
    pub fn resource(&self, coll: &str, scope: &str, name: &str) -> Option<Value> {
        let st = self.st();
        st.res.get(&(coll.into(), scope.into(), name.into())).map(|v| self.render(&st, v))
    }

    /// Deletes an instance (as if by the user); false when unknown.
    pub fn delete_instance(&self, name: &str) -> bool {
        let mut st = self.st();
        let key = st.res.keys().find(|(c, _, n)| c == "instances" && n == name).cloned();
        match key {
            Some(k) => st.res.remove(&k).is_some(),
            None => false,
        }
    }

    /// Adds an instance of the world's shape.
    pub fn add_instance(&self, inst: &Instance) -> Result<(), String> {
        let mut st = self.st();
        if st.res.keys().any(|(c, _, n)| c == "instances" && n == &inst.name) {
            return Err(format!("instance {} exists", inst.name));
        }
        self.add_instance_locked(&mut st, inst);
        Ok(())
    }

    /// Sets an instance's status (`RUNNING`, `TERMINATED`…); false when unknown.
    pub fn set_power(&self, name: &str, power: PowerState) -> bool {
        let mut st = self.st();
        for ((c, _, n), v) in st.res.iter_mut() {
            if c == "instances" && n == name {
                v["status"] = json!(status_of(power));
                return true;
            }
        }
        false
    }

    fn next_id(st: &mut State, seed: &str) -> String {
        st.next_id += 1;
        (fnv(seed) % 9_000_000_000_000_000_000 + 1_000_000_000_000_000_000 + st.next_id).to_string()
    }

    fn load(&self) {
        let mut st = State::default();
        let nets = if self.world.networks.is_empty() {
            vec![("default".to_string(), None)]
        } else {
            self.world.networks.iter().map(|n| (n.name.clone(), n.cidr.clone())).collect()
        };
        let auto = self.o().auto_mode_networks;
        for (name, _) in &nets {
            let id = Self::next_id(&mut st, name);
            let auto_mode = auto.contains(name);
            let mut v = json!({
                "kind": "compute#network", "id": id, "name": name,
                "creationTimestamp": rfc3339_now(),
                "selfLink": self.link("global", "networks", name),
                "autoCreateSubnetworks": auto_mode,
                "routingConfig": { "routingMode": "REGIONAL" },
            });
            if auto_mode {
                let mut subnets = vec![];
                for r in self.regions() {
                    let scope = format!("regions/{r}");
                    let id = Self::next_id(&mut st, &format!("{name}/{r}"));
                    let link = self.link(&scope, "subnetworks", name);
                    let s = json!({
                        "kind": "compute#subnetwork", "id": id, "name": name,
                        "creationTimestamp": rfc3339_now(),
                        "network": self.link("global", "networks", name),
                        "ipCidrRange": auto_mode_range(&r),
                        "gatewayAddress": gateway_of(&auto_mode_range(&r)),
                        "region": format!("{}/regions/{r}", self.base()),
                        "selfLink": link,
                        "stackType": "IPV4_ONLY",
                        "fingerprint": "AAAAAAAAAAA=",
                    });
                    st.res.insert(("subnetworks".into(), scope, name.clone()), s);
                    subnets.push(json!(link));
                }
                v["subnetworks"] = json!(subnets);
            }
            st.res.insert(("networks".into(), "global".into(), name.clone()), v);
        }
        let first_net = nets[0].0.clone();
        for s in &self.world.subnets {
            let net = s.network.clone().unwrap_or(first_net.clone());
            let r = region_of(&s.zone);
            let scope = format!("regions/{r}");
            let id = Self::next_id(&mut st, &s.name);
            let v = json!({
                "kind": "compute#subnetwork", "id": id, "name": s.name,
                "creationTimestamp": rfc3339_now(),
                "network": self.link("global", "networks", &net),
                "ipCidrRange": s.cidr.clone().unwrap_or("10.128.0.0/20".into()),
                "region": format!("{}/regions/{r}", self.base()),
                "selfLink": self.link(&scope, "subnetworks", &s.name),
                "stackType": "IPV4_ONLY",
                "fingerprint": "AAAAAAAAAAA=",
            });
            st.res.insert(("subnetworks".into(), scope, s.name.clone()), v);
        }
        for inst in &self.world.instances {
            self.add_instance_locked(&mut st, inst);
        }
        let metadata_attrs = std::mem::take(&mut lock(&self.state).attributes);
        st.attributes = metadata_attrs;
        *lock(&self.state) = st;
    }

    fn add_instance_locked(&self, st: &mut State, inst: &Instance) {
        let zone = &inst.zone;
        let region = region_of(zone);
        let scope = format!("zones/{zone}");
        let subnet =
            inst.subnet.as_ref().and_then(|s| self.world.subnets.iter().find(|x| &x.name == s));
        let net = subnet
            .and_then(|s| s.network.clone())
            .or_else(|| self.world.networks.first().map(|n| n.name.clone()))
            .unwrap_or("default".into());
        let mut nic = json!({
            "kind": "compute#networkInterface",
            "name": "nic0",
            "network": self.link("global", "networks", &net),
            "fingerprint": "AAAAAAAAAAA=",
            "stackType": "IPV4_ONLY",
        });
        if let Some(s) = subnet {
            nic["subnetwork"] =
                json!(self.link(&format!("regions/{region}"), "subnetworks", &s.name));
        }
        let v4 = inst.private_ips.iter().find(|i| i.is_ipv4());
        let v6 = inst.private_ips.iter().find(|i| i.is_ipv6());
        let v6_public = inst.public_ips.iter().find(|i| i.is_ipv6());
        if let Some(ip) = v4 {
            nic["networkIP"] = json!(ip.to_string());
        }
        // As Compute: a NIC's IPv6 is either internal (`ipv6Address`, a /96 per NIC) or
        // external (a `DIRECT_IPV6` access config, `ipv6Address` unset), as its subnet's
        // IPv6 access type says; without IPv4 the NIC is IPv6-only.
        if let Some(ip) = v6_public {
            nic["ipv6AccessType"] = json!("EXTERNAL");
            nic["ipv6AccessConfigs"] = json!([{
                "kind": "compute#accessConfig", "type": "DIRECT_IPV6", "name": "external-ipv6",
                "externalIpv6": ip.to_string(), "externalIpv6PrefixLength": 96,
                "networkTier": "PREMIUM",
            }]);
        } else if let Some(ip) = v6 {
            nic["ipv6AccessType"] = json!("INTERNAL");
            nic["ipv6Address"] = json!(ip.to_string());
            nic["internalIpv6PrefixLength"] = json!(96);
        }
        if v6_public.or(v6).is_some() {
            nic["stackType"] = json!(if v4.is_some() { "IPV4_IPV6" } else { "IPV6_ONLY" });
        }
        let access: Vec<Value> = inst
            .public_ips
            .iter()
            .filter(|i| i.is_ipv4())
            .map(|ip| {
                json!({ "kind": "compute#accessConfig", "type": "ONE_TO_ONE_NAT", "name": "External NAT",
                        "natIP": ip.to_string(), "networkTier": "PREMIUM" })
            })
            .collect();
        if !access.is_empty() {
            nic["accessConfigs"] = json!(access);
        }
        if let Some(alias) = inst.tags.get("gce.alias") {
            nic["aliasIpRanges"] = json!([{ "ipCidrRange": alias, "subnetworkRangeName": "pods" }]);
        }
        let tags: Vec<String> = inst
            .tags
            .get("gce.tags")
            .map(|t| t.split(',').map(|s| s.trim().to_string()).filter(|s| !s.is_empty()).collect())
            .unwrap_or_else(|| vec!["k8s-node".into()]);
        let labels: Map<String, Value> = inst
            .tags
            .iter()
            .filter(|(k, _)| !k.starts_with("gce."))
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        let id = inst.id.clone().unwrap_or_else(|| Self::next_id(st, &inst.name));
        let mt = inst.instance_type.clone().unwrap_or("e2-standard-2".into());
        let v = json!({
            "kind": "compute#instance",
            "id": id,
            "name": inst.name,
            "creationTimestamp": rfc3339_now(),
            "zone": format!("{}/zones/{zone}", self.base()),
            "machineType": format!("{}/zones/{zone}/machineTypes/{mt}", self.base()),
            "status": status_of(inst.power),
            "canIpForward": true,
            "networkInterfaces": [nic],
            "tags": { "items": tags, "fingerprint": fingerprint(1) },
            "labels": labels,
            "labelFingerprint": fingerprint(1),
            "fingerprint": fingerprint(1),
            "selfLink": self.link(&scope, "instances", &inst.name),
            "serviceAccounts": [{ "email": self.o().service_account, "scopes": self.o().scopes }],
        });
        st.res.insert(("instances".into(), scope, inst.name.clone()), v);
    }

    fn zones(&self) -> Vec<String> {
        let mut z: Vec<String> = self.world.zones().into_iter().collect();
        if z.is_empty() {
            z.push(format!("{}-a", self.region()));
        }
        z
    }

    fn regions(&self) -> Vec<String> {
        let mut r: BTreeSet<String> = self.zones().iter().map(|z| region_of(z)).collect();
        r.insert(self.region());
        r.into_iter().collect()
    }

    fn zone_json(&self, z: &str) -> Value {
        json!({
            "kind": "compute#zone", "id": (fnv(z) % 10_000).to_string(), "name": z, "status": "UP",
            "region": format!("{}/regions/{}", self.base(), region_of(z)),
            "selfLink": format!("{}/zones/{z}", self.base()),
            "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
            "availableCpuPlatforms": ["Intel Broadwell"],
        })
    }

    fn region_json(&self, r: &str) -> Value {
        let zones: Vec<String> = self
            .zones()
            .iter()
            .filter(|z| region_of(z) == r)
            .map(|z| format!("{}/zones/{z}", self.base()))
            .collect();
        json!({
            "kind": "compute#region", "id": (fnv(r) % 10_000).to_string(), "name": r, "status": "UP",
            "zones": zones, "selfLink": format!("{}/regions/{r}", self.base()),
            "creationTimestamp": "1969-12-31T16:00:00.000-08:00",
        })
    }

    /// A stored resource as Compute answers it (computed fields filled in).
    fn render(&self, st: &State, v: &Value) -> Value {
        let mut v = v.clone();
        let mut members = None;
        if let Some(m) = v.as_object_mut() {
            members = m.remove("_members");
        }
        if v["kind"] == "compute#instanceGroup" {
            v["size"] =
                json!(members.as_ref().and_then(Value::as_array).map(Vec::len).unwrap_or(0));
        }
        if v["kind"] == "compute#address" {
            let addr = v["address"].as_str().unwrap_or_default().to_string();
            let scope = v["region"]
                .as_str()
                .map(|r| format!("regions/{}", last(r)))
                .unwrap_or("global".into());
            let users: Vec<Value> = st
                .res
                .iter()
                .filter(|((c, s, _), f)| {
                    c == "forwardingRules" && s == &scope && f["IPAddress"] == addr.as_str()
                })
                .map(|(_, f)| f["selfLink"].clone())
                .collect();
            v["status"] = json!(if users.is_empty() { "RESERVED" } else { "IN_USE" });
            if v.as_object_mut().and_then(|m| m.remove("_reserving")).is_some() {
                v["status"] = json!("RESERVING");
            }
            if !users.is_empty() {
                v["users"] = json!(users);
            }
        }
        if v["kind"] == "compute#route" {
            self.route_warnings(st, &mut v);
        }
        v
    }

    /// Compute's warning on a route whose `nextHopInstance` no longer exists (the route stays,
    /// leading nowhere: `NEXT_HOP_INSTANCE_NOT_FOUND`).
    fn route_warnings(&self, st: &State, v: &mut Value) {
        let Some(hop) = v["nextHopInstance"].as_str().map(String::from) else { return };
        if self.exists(st, &hop, &["instances"]) {
            return;
        }
        v["warnings"] = json!([{
            "code": "NEXT_HOP_INSTANCE_NOT_FOUND",
            "message": format!("Next hop instance '{}' does not exist.", rel(&hop)),
            "data": [{ "key": "instance", "value": hop }],
        }]);
    }

    fn authorise(&self, req: &Request<Bytes>) -> Res<()> {
        let token = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer "));
        match token {
            Some(t) if self.st().tokens.contains(t) => Ok(()),
            _ => {
                let mut r = err(
                    401,
                    "authError",
                    "Request had invalid authentication credentials. Expected OAuth 2 access token, login cookie or other valid authentication credential.",
                );
                r.headers_mut().insert(
                    header::WWW_AUTHENTICATE,
                    HeaderValue::from_static("Bearer realm=\"https://accounts.google.com/\""),
                );
                Err(r)
            }
        }
    }

    fn metadata(&self, req: &Request<Bytes>, path: &str) -> Resp {
        let flavor = req.headers().get("Metadata-Flavor").and_then(|h| h.to_str().ok());
        if flavor != Some("Google") {
            return text(
                StatusCode::FORBIDDEN,
                "Missing required header \"Metadata-Flavor\": \"Google\"\n",
            );
        }
        let o = self.o();
        let name = o
            .metadata_instance
            .clone()
            .or_else(|| self.world.instances.first().map(|i| i.name.clone()));
        let inst = {
            let st = self.st();
            name.as_ref().and_then(|n| {
                st.res
                    .iter()
                    .find(|((c, _, x), _)| c == "instances" && x == n)
                    .map(|(_, v)| v.clone())
            })
        };
        let nic = inst.as_ref().map(|i| i["networkInterfaces"][0].clone()).unwrap_or(Value::Null);
        let sa = o.service_account.clone();
        let body: Option<String> = match path {
            "" => Some("instance/\nproject/\nuniverse/\n".into()),
            // The universe this server belongs to (Google's public cloud: `googleapis.com`);
            // cloud.google.com/go/compute/metadata's `UniverseDomain` reads it.
            "universe/" => Some("universe-domain\n".into()),
            "universe/universe-domain" => Some("googleapis.com".into()),
            "project/project-id" => Some(o.project.clone()),
            "project/numeric-project-id" => Some(o.project_number.to_string()),
            "instance/id" => inst.as_ref().and_then(|i| i["id"].as_str().map(String::from)),
            "instance/name" => inst.as_ref().and_then(|i| i["name"].as_str().map(String::from)),
            "instance/hostname" => inst.as_ref().and_then(|i| {
                let z = last(i["zone"].as_str()?);
                Some(format!("{}.{z}.c.{}.internal", i["name"].as_str()?, o.project))
            }),
            "instance/zone" => inst.as_ref().and_then(|i| {
                Some(format!("projects/{}/zones/{}", o.project_number, last(i["zone"].as_str()?)))
            }),
            "instance/machine-type" => inst.as_ref().and_then(|i| {
                Some(format!(
                    "projects/{}/machineTypes/{}",
                    o.project_number,
                    last(i["machineType"].as_str()?)
                ))
            }),
            "instance/tags" => inst.as_ref().map(|i| i["tags"]["items"].to_string()),
            "instance/network-interfaces/" => inst.as_ref().map(|_| "0/\n".into()),
            "instance/network-interfaces/0/ip" => nic["networkIP"].as_str().map(String::from),
            "instance/network-interfaces/0/ipv6s" => nic["ipv6Address"]
                .as_str()
                .or(nic["ipv6AccessConfigs"][0]["externalIpv6"].as_str())
                .map(|s| format!("{s}\n")),
            "instance/network-interfaces/0/network" => nic["network"]
                .as_str()
                .map(|n| format!("projects/{}/networks/{}", o.project_number, last(n))),
            "instance/network-interfaces/0/access-configs/0/external-ip" => {
                nic["accessConfigs"][0]["natIP"].as_str().map(String::from)
            }
            "instance/network-interfaces/0/ip-aliases/" => {
                nic["aliasIpRanges"].as_array().map(|a| {
                    a.iter()
                        .filter_map(|r| r["ipCidrRange"].as_str())
                        .map(|r| format!("{r}\n"))
                        .collect()
                })
            }
            "instance/service-accounts/" => Some(format!("default/\n{sa}/\n")),
            "instance/service-accounts/default/email" => Some(sa.clone()),
            "instance/service-accounts/default/scopes" => {
                Some(o.scopes.iter().map(|s| format!("{s}\n")).collect())
            }
            "instance/service-accounts/default/token" => {
                let t = self.issue_token();
                let mut r = reply(
                    StatusCode::OK,
                    &json!({ "access_token": t, "expires_in": o.token_lifetime.as_secs(), "token_type": "Bearer" }),
                );
                r.headers_mut().insert("Metadata-Flavor", HeaderValue::from_static("Google"));
                return r;
            }
            "instance/attributes/" => {
                Some(self.st().attributes.keys().map(|k| format!("{k}\n")).collect())
            }
            p => match p.strip_prefix("instance/attributes/") {
                Some(k) => self.st().attributes.get(k).cloned(),
                None => None,
            },
        };
        match body {
            Some(b) => text(StatusCode::OK, b),
            None => {
                let mut r = Response::new(full(format!(
                    "<!DOCTYPE html>\n<title>Error 404 (Not Found)!!1</title>\n/computeMetadata/v1/{path}"
                )));
                *r.status_mut() = StatusCode::NOT_FOUND;
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/html; charset=UTF-8"),
                );
                r.headers_mut().insert("Metadata-Flavor", HeaderValue::from_static("Google"));
                r
            }
        }
    }

    fn alt_token(&self) -> Resp {
        let t = self.issue_token();
        let exp = SystemTime::now() + self.o().token_lifetime;
        let secs = exp.duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        reply(StatusCode::OK, &json!({ "accessToken": t, "expireTime": rfc3339_at(secs) }))
    }

    /// Google STS's token exchange as Workload Identity image pulls call it: a JSON body with
    /// `grant_type` token-exchange, `subject_token_type` jwt, `requested_token_type`
    /// access_token, a non-empty `subject_token` and the audience
    /// `identitynamespace:<project>.svc.id.goog:<identity provider>`; answered with a token
    /// this emulator issued (Compute accepts it). Anything else: 400 in STS's OAuth shape
    /// (`{"error":"invalid_request"|"invalid_grant","error_description"}`). The subject
    /// tokens received are kept ([`GcpCloud::sts_subjects`]).
    fn sts_exchange(&self, req: &Request<Bytes>) -> Resp {
        let oauth = |code: &str, why: &str| {
            reply(StatusCode::BAD_REQUEST, &json!({ "error": code, "error_description": why }))
        };
        let Ok(body) = serde_json::from_slice::<Value>(req.body()) else {
            return oauth("invalid_request", "The request body is not JSON.");
        };
        let field = |k: &str| body[k].as_str().unwrap_or_default().to_string();
        if field("grant_type") != "urn:ietf:params:oauth:grant-type:token-exchange" {
            return oauth("unsupported_grant_type", "Invalid value for \"grant_type\".");
        }
        if field("subject_token_type") != "urn:ietf:params:oauth:token-type:jwt"
            || field("requested_token_type") != "urn:ietf:params:oauth:token-type:access_token"
        {
            return oauth("invalid_request", "Invalid token type.");
        }
        let prefix = format!("identitynamespace:{}.svc.id.goog:", self.project());
        if !field("audience").starts_with(&prefix) {
            return oauth(
                "invalid_target",
                "The target service indicated by the \"audience\" parameters is invalid.",
            );
        }
        let subject = field("subject_token");
        if subject.is_empty() {
            return oauth("invalid_grant", "The subject token is empty.");
        }
        self.st().sts_subjects.push(subject);
        let t = self.issue_token();
        reply(
            StatusCode::OK,
            &json!({
                "access_token": t,
                "issued_token_type": "urn:ietf:params:oauth:token-type:access_token",
                "token_type": "Bearer",
                "expires_in": self.o().token_lifetime.as_secs(),
            }),
        )
    }

    /// The subject tokens STS exchanged so far.
    pub fn sts_subjects(&self) -> Vec<String> {
        self.st().sts_subjects.clone()
    }

    fn page(
        &self,
        qs: &[(String, String)],
        items: Vec<Value>,
    ) -> Res<(Vec<Value>, Option<String>)> {
        let filter = q(qs, "filter").unwrap_or_default();
        let items = if filter.trim().is_empty() {
            items
        } else {
            let terms = parse_filter(filter).map_err(|m| bad("invalid", m))?;
            let mut out = Vec::new();
            for v in items {
                if matches(&terms, &v)
                    .map_err(|m| bad("invalid", format!("Invalid value for field 'filter': {m}")))?
                {
                    out.push(v);
                }
            }
            out
        };
        let cap = self.o().max_results;
        let max = match q(qs, "maxResults") {
            Some(m) => m
                .parse::<usize>()
                .map_err(|_| {
                    bad("invalid", format!("Invalid value for field 'maxResults': '{m}'"))
                })?
                .clamp(1, cap),
            None => cap,
        };
        let start = match q(qs, "pageToken") {
            Some(t) if !t.is_empty() => {
                t.strip_prefix("pt-").and_then(|n| n.parse::<usize>().ok()).ok_or_else(|| {
                    bad("invalid", format!("Invalid value for field 'pageToken': '{t}'"))
                })?
            }
            _ => 0,
        };
        let end = (start + max).min(items.len());
        let next = (end < items.len()).then(|| format!("pt-{end}"));
        Ok((items.into_iter().skip(start).take(max).collect(), next))
    }

    fn list(&self, qs: &[(String, String)], scope: &str, coll: &str) -> Res<Value> {
        self.check_scope(scope)?;
        let items: Vec<Value> = {
            let st = self.st();
            st.res
                .iter()
                .filter(|((c, s, _), _)| c == coll && s == scope)
                .map(|(_, v)| self.render(&st, v))
                .collect()
        };
        let (items, next) = self.page(qs, items)?;
        let mut v = json!({
            "kind": format!("compute#{}List", singular(coll)),
            "id": format!("projects/{}/{scope}/{coll}", self.project()),
            "items": items,
            "selfLink": format!("{}/{scope}/{coll}", self.base()),
        });
        if let Some(n) = next {
            v["nextPageToken"] = json!(n);
        }
        Ok(v)
    }

    fn aggregated(&self, qs: &[(String, String)], coll: &str) -> Res<Value> {
        let items: Vec<(String, Value)> = {
            let st = self.st();
            st.res
                .iter()
                .filter(|((c, _, _), _)| c == coll)
                .map(|((_, s, _), v)| (s.clone(), self.render(&st, v)))
                .collect()
        };
        let scopes: Vec<String> = items.iter().map(|(s, _)| s.clone()).collect();
        let tagged: Vec<Value> = items
            .into_iter()
            .map(|(s, mut v)| {
                v["__scope"] = json!(s);
                v
            })
            .collect();
        let (page, next) = self.page(qs, tagged)?;
        let mut groups: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for s in self
            .zones()
            .iter()
            .map(|z| format!("zones/{z}"))
            .chain(self.regions().iter().map(|r| format!("regions/{r}")))
        {
            groups.entry(s).or_default();
        }
        for s in scopes {
            groups.entry(s).or_default();
        }
        for mut v in page {
            let s = v["__scope"].as_str().unwrap_or_default().to_string();
            if let Some(m) = v.as_object_mut() {
                m.remove("__scope");
            }
            groups.entry(s).or_default().push(v);
        }
        let items: Map<String, Value> = groups
            .into_iter()
            .map(|(s, list)| {
                let g = if list.is_empty() {
                    json!({ "warning": { "code": "NO_RESULTS_ON_PAGE",
                        "message": format!("There are no results for scope '{s}' on this page."),
                        "data": [{ "key": "scope", "value": s }] } })
                } else {
                    json!({ coll: list })
                };
                (s, g)
            })
            .collect();
        let mut v = json!({
            "kind": format!("compute#{}AggregatedList", singular(coll)),
            "id": format!("projects/{}/aggregated/{coll}", self.project()),
            "items": items,
            "selfLink": format!("{}/aggregated/{coll}", self.base()),
        });
        if let Some(n) = next {
            v["nextPageToken"] = json!(n);
        }
        Ok(v)
    }

    fn check_scope(&self, scope: &str) -> Res<()> {
        let ok = match scope.split_once('/') {
            None => scope == "global",
            Some(("zones", z)) => self.zones().iter().any(|x| x == z),
            Some(("regions", r)) => self.regions().iter().any(|x| x == r),
            _ => false,
        };
        if ok { Ok(()) } else { Err(not_found(&format!("projects/{}/{scope}", self.project()))) }
    }

    fn path_of(&self, scope: &str, coll: &str, name: &str) -> String {
        format!("projects/{}/{scope}/{coll}/{name}", self.project())
    }

    /// The stored key of a reference (link or partial path) of collection `coll`.
    fn key_of(&self, link: &str, coll: &str) -> Option<Key> {
        let r = rel(link);
        let segs: Vec<&str> = r.split('/').collect();
        let i = segs.iter().position(|s| *s == coll)?;
        let name = segs.get(i + 1)?.to_string();
        let scope = match (segs.get(i.wrapping_sub(2)), segs.get(i.wrapping_sub(1))) {
            (_, Some(&"global")) => "global".to_string(),
            (Some(k @ (&"zones" | &"regions")), Some(z)) => format!("{k}/{z}"),
            _ => return None,
        };
        Some((coll.to_string(), scope, name))
    }

    fn exists(&self, st: &State, link: &str, colls: &[&str]) -> bool {
        colls.iter().any(|c| self.key_of(link, c).is_some_and(|k| st.res.contains_key(&k)))
    }

    /// Starts the operation of a mutation of `key`; `change` is applied when it is `DONE`.
    fn start_op(
        &self,
        st: &mut State,
        key: &Key,
        change: Change,
        action: Action,
        op_type: &str,
    ) -> Value {
        let (coll, scope, name) = key;
        let link = self.link(scope, coll, name);
        let op = self.ops.start(link.clone(), action);
        st.op_scope.insert(op.id.clone(), scope.to_string());
        st.pending.push(PendingChange { op: op.id.clone(), key: key.clone(), link, change });
        self.op_json(&op, scope, Some(op_type))
    }

    /// 400 `resourceNotReady` while an operation on `key` runs.
    fn check_ready(&self, st: &State, key: &Key) -> Res<()> {
        if st.pending.iter().any(|p| &p.key == key) {
            return Err(not_ready(&self.path_of(&key.1, &key.0, &key.2)));
        }
        Ok(())
    }

    /// Whether an insert of `key` is accepted and not yet done.
    fn inserting(st: &State, key: &Key) -> bool {
        st.pending.iter().any(|p| &p.key == key && matches!(p.change, Change::Put(_)))
            && st.res.get(key).is_none_or(|v| v.get("_reserving").is_some())
    }

    fn op_json(&self, op: &Operation, scope: &str, op_type: Option<&str>) -> Value {
        render_op(op, &self.base(), scope, op_type)
    }

    fn handle(
        &self,
        op: &str,
        project: Option<&str>,
        target: Target,
        req: &Request<Bytes>,
    ) -> Result<Resp, ServeFuture> {
        let qs = query(req);
        let out = match target {
            Target::Metadata(p) => return Ok(self.metadata(req, &p)),
            Target::AltToken => {
                return Ok(if req.method() == Method::POST {
                    self.alt_token()
                } else {
                    err(405, "methodNotAllowed", "POST only")
                });
            }
            Target::Sts => {
                return Ok(if req.method() == Method::POST {
                    self.sts_exchange(req)
                } else {
                    err(405, "methodNotAllowed", "POST only")
                });
            }
            Target::Unknown => return Ok(not_found(req.uri().path())),
            t => {
                if let Err(r) = self.authorise(req) {
                    return Ok(r);
                }
                if project != Some(self.project().as_str()) {
                    return Ok(not_found(&format!("projects/{}", project.unwrap_or_default())));
                }
                t
            }
        };
        let res: Res<(StatusCode, Value)> = (|| match out {
            Target::Zones(None) => {
                let items = self.zones().iter().map(|z| self.zone_json(z)).collect();
                let (items, next) = self.page(&qs, items)?;
                let mut v = json!({ "kind": "compute#zoneList", "items": items, "selfLink": format!("{}/zones", self.base()) });
                if let Some(n) = next {
                    v["nextPageToken"] = json!(n);
                }
                Ok((StatusCode::OK, v))
            }
            Target::Zones(Some(z)) => {
                self.check_scope(&format!("zones/{z}"))?;
                Ok((StatusCode::OK, self.zone_json(&z)))
            }
            Target::Regions(None) => {
                let items = self.regions().iter().map(|r| self.region_json(r)).collect();
                let (items, next) = self.page(&qs, items)?;
                let mut v = json!({ "kind": "compute#regionList", "items": items, "selfLink": format!("{}/regions", self.base()) });
                if let Some(n) = next {
                    v["nextPageToken"] = json!(n);
                }
                Ok((StatusCode::OK, v))
            }
            Target::Regions(Some(r)) => {
                self.check_scope(&format!("regions/{r}"))?;
                let mut v = self.region_json(&r);
                v["quotas"] = self.quotas_json(&self.st(), &format!("regions/{r}"));
                Ok((StatusCode::OK, v))
            }
            Target::Project => Ok((
                StatusCode::OK,
                json!({
                    "kind": "compute#project",
                    "id": self.o().project_number.to_string(),
                    "name": self.project(),
                    "selfLink": self.base(),
                    "quotas": self.quotas_json(&self.st(), "global"),
                }),
            )),
            Target::Aggregated(c) => Ok((StatusCode::OK, self.aggregated(&qs, &c)?)),
            Target::Operation(scope, id, _) => {
                let known = self.st().op_scope.get(&id).cloned();
                match (known, self.ops.get(&id)) {
                    (Some(s), Some(o)) if s == scope => {
                        Ok((StatusCode::OK, self.op_json(&o, &scope, None)))
                    }
                    _ => Err(not_found(&format!(
                        "projects/{}/{scope}/operations/{id}",
                        self.project()
                    ))),
                }
            }
            Target::Resource(scope, coll, name, action) => {
                self.check_scope(&scope)?;
                self.resource_call(req, &qs, &scope, &coll, name.as_deref(), action.as_deref())
            }
            _ => Err(not_found(req.uri().path())),
        })();
        // operations.wait: answer when done (or after at most 30 s, as Compute's 2 min).
        if op.ends_with("Operations.wait")
            && let Ok((_, v)) = &res
            && v["status"] != "DONE"
            && let Some(o) = v["name"].as_str().and_then(|id| self.ops.get(id))
        {
            let base = self.base();
            let scope = match out_scope(v) {
                Some(s) => s,
                None => "global".into(),
            };
            return Err(Box::pin(async move {
                tokio::time::sleep(o.remaining().min(Duration::from_secs(30))).await;
                Ok(reply(StatusCode::OK, &render_op(&o, &base, &scope, None)))
            }));
        }
        Ok(match res {
            Ok((s, v)) => reply(s, &v),
            Err(r) => r,
        })
    }

    fn body_json(req: &Request<Bytes>) -> Res<Value> {
        if req.body().is_empty() {
            return Ok(json!({}));
        }
        serde_json::from_slice(req.body())
            .map_err(|e| bad("parseError", format!("Invalid JSON payload received. {e}")))
    }

    fn resource_call(
        &self,
        req: &Request<Bytes>,
        qs: &[(String, String)],
        scope: &str,
        coll: &str,
        name: Option<&str>,
        action: Option<&str>,
    ) -> Res<(StatusCode, Value)> {
        let m = req.method().clone();
        match (m, name, action) {
            (Method::GET, None, None) => Ok((StatusCode::OK, self.list(qs, scope, coll)?)),
            (Method::POST, None, None) => {
                let body = Self::body_json(req)?;
                self.insert(scope, coll, body).map(|v| (StatusCode::OK, v))
            }
            (Method::GET, Some(n), None) => {
                let st = self.st();
                st.res
                    .get(&(coll.into(), scope.into(), n.into()))
                    .map(|v| (StatusCode::OK, self.render(&st, v)))
                    .ok_or_else(|| not_found(&self.path_of(scope, coll, n)))
            }
            (Method::DELETE, Some(n), None) => {
                self.delete(scope, coll, n).map(|v| (StatusCode::OK, v))
            }
            (m @ (Method::PATCH | Method::PUT), Some(n), None) => {
                let body = Self::body_json(req)?;
                self.update(scope, coll, n, body, m == Method::PUT).map(|v| (StatusCode::OK, v))
            }
            (Method::POST, Some(n), Some(a)) => {
                let body = Self::body_json(req)?;
                self.action(qs, scope, coll, n, a, body).map(|v| (StatusCode::OK, v))
            }
            _ => Err(err(405, "methodNotAllowed", "Method not allowed")),
        }
    }

    /// An internal address from the named subnetwork's range (as Compute allocates one),
    /// when the body names a known subnetwork with an IPv4 range.
    fn alloc_subnet_ip(st: &mut State, subnet_link: &str) -> Option<String> {
        let name = subnet_link.rsplit('/').next()?;
        let region = subnet_region(subnet_link);
        let range = st
            .res
            .iter()
            .find(|((c, sc, n), _)| {
                c == "subnetworks" && n == name && region.as_ref().is_none_or(|r| sc == r)
            })
            .and_then(|(_, v)| v["ipCidrRange"].as_str().map(str::to_string))?;
        let net: ipnet::Ipv4Net = range.parse().ok()?;
        let hosts = (1u64 << (32 - u32::from(net.prefix_len()))).saturating_sub(2);
        if hosts < 512 {
            return None;
        }
        st.next_ip += 1;
        // From the top half of the range, clear of the instances' addresses.
        let offset = (hosts / 2 + u64::from(st.next_ip) % (hosts / 2)) as u32;
        Some(std::net::Ipv4Addr::from(u32::from(net.network()) + offset).to_string())
    }

    fn alloc_ip(st: &mut State, internal: bool) -> String {
        st.next_ip += 1;
        let n = st.next_ip;
        if internal {
            format!("10.200.{}.{}", (n >> 8) & 0xff, n & 0xff)
        } else {
            format!("35.{}.{}.{}", 190 + ((n >> 16) & 0x7), (n >> 8) & 0xff, n & 0xff)
        }
    }

    fn insert(&self, scope: &str, coll: &str, mut body: Value) -> Res<Value> {
        const KNOWN: &[&str] = &[
            "addresses",
            "forwardingRules",
            "targetPools",
            "httpHealthChecks",
            "healthChecks",
            "backendServices",
            "instanceGroups",
            "firewalls",
            "routes",
            "networks",
            "subnetworks",
        ];
        if !KNOWN.contains(&coll) {
            return Err(err(
                405,
                "methodNotAllowed",
                format!("insert is not supported for {coll} by this emulator"),
            ));
        }
        let Some(name) = body["name"].as_str().map(String::from) else {
            return Err(bad("required", "Required field 'resource.name' not specified"));
        };
        if !valid_name(&name) {
            return Err(bad(
                "invalid",
                format!(
                    "Invalid value for field 'resource.name': '{name}'. Must be a match of regex '(?:[a-z](?:[-a-z0-9]{{0,61}}[a-z0-9])?)'"
                ),
            ));
        }
        let mut st = self.st();
        let key: Key = (coll.into(), scope.into(), name.clone());
        if st.res.contains_key(&key) || Self::inserting(&st, &key) {
            return Err(err(
                409,
                "alreadyExists",
                format!("The resource '{}' already exists", self.path_of(scope, coll, &name)),
            ));
        }
        self.check_refs(&st, coll, &mut body)?;
        Self::check_ip(&st, scope, coll, &body)?;
        self.check_rule(&st, scope, coll, &body)?;
        self.check_quota(&st, scope, coll, &body)?;
        let id = Self::next_id(&mut st, &name);
        let link = self.link(scope, coll, &name);
        body["kind"] = json!(format!("compute#{}", singular(coll)));
        body["id"] = json!(id);
        body["selfLink"] = json!(link);
        body["creationTimestamp"] = json!(rfc3339_now());
        if let Some(r) = scope.strip_prefix("regions/") {
            body["region"] = json!(format!("{}/regions/{r}", self.base()));
        }
        if let Some(z) = scope.strip_prefix("zones/") {
            body["zone"] = json!(format!("{}/zones/{z}", self.base()));
        }
        match coll {
            "addresses" => {
                let internal = body["addressType"] == "INTERNAL";
                if body["address"].as_str().unwrap_or_default().is_empty() {
                    let subnet = body["subnetwork"].as_str().unwrap_or_default().to_string();
                    let ip = internal
                        .then(|| Self::alloc_subnet_ip(&mut st, &subnet))
                        .flatten()
                        .unwrap_or_else(|| Self::alloc_ip(&mut st, internal));
                    body["address"] = json!(ip);
                }
                default(&mut body, "addressType", "EXTERNAL");
                if !internal {
                    default(&mut body, "networkTier", "PREMIUM");
                }
            }
            "forwardingRules" => {
                let internal = body["loadBalancingScheme"] == "INTERNAL";
                if body["IPAddress"].as_str().unwrap_or_default().is_empty() {
                    let subnet = body["subnetwork"].as_str().unwrap_or_default().to_string();
                    let ip = internal
                        .then(|| Self::alloc_subnet_ip(&mut st, &subnet))
                        .flatten()
                        .unwrap_or_else(|| Self::alloc_ip(&mut st, internal));
                    body["IPAddress"] = json!(ip);
                }
                default(&mut body, "IPProtocol", "TCP");
                default(&mut body, "loadBalancingScheme", "EXTERNAL");
                if !internal {
                    default(&mut body, "networkTier", "PREMIUM");
                }
                body["labelFingerprint"] = json!(fingerprint(1));
                body["fingerprint"] = json!(fingerprint(1));
            }
            "targetPools" => {
                let insts: Vec<Value> = body["instances"].as_array().cloned().unwrap_or_default();
                body["instances"] = json!(
                    insts
                        .iter()
                        .filter_map(|i| i.as_str().map(|s| self.full_link(s)))
                        .collect::<Vec<_>>()
                );
                default(&mut body, "sessionAffinity", "NONE");
            }
            "httpHealthChecks" => {
                default_num(&mut body, "port", 80);
                default(&mut body, "requestPath", "/");
                default_num(&mut body, "checkIntervalSec", 5);
                default_num(&mut body, "timeoutSec", 5);
                default_num(&mut body, "healthyThreshold", 2);
                default_num(&mut body, "unhealthyThreshold", 2);
            }
            "healthChecks" => {
                default_num(&mut body, "checkIntervalSec", 5);
                default_num(&mut body, "timeoutSec", 5);
                default_num(&mut body, "healthyThreshold", 2);
                default_num(&mut body, "unhealthyThreshold", 2);
            }
            "backendServices" => {
                body["fingerprint"] = json!(fingerprint(1));
                default(&mut body, "protocol", "TCP");
            }
            "instanceGroups" => {
                body["_members"] = json!([]);
                body["fingerprint"] = json!(fingerprint(1));
            }
            "firewalls" => {
                default(&mut body, "direction", "INGRESS");
                default_num(&mut body, "priority", 1000);
                default(&mut body, "network", &self.link("global", "networks", "default"));
            }
            "routes" => {
                default_num(&mut body, "priority", 1000);
                if let Some(hop) = body["nextHopInstance"].as_str().map(|s| self.full_link(s)) {
                    body["nextHopInstance"] = json!(hop);
                }
            }
            _ => {}
        }
        if coll == "addresses" {
            // An address is listed `RESERVING` while its insert runs (Compute's Address.status).
            let mut shown = body.clone();
            shown["_reserving"] = json!(true);
            st.res.insert(key.clone(), shown);
        }
        Ok(self.start_op(&mut st, &key, Change::Put(body), Action::Create, "insert"))
    }

    /// The IPv4 range of the subnetwork `link` names (`None` when unknown).
    fn subnet_range(st: &State, link: &str) -> Option<ipnet::Ipv4Net> {
        let name = link.rsplit('/').next()?;
        let region = subnet_region(link);
        st.res
            .iter()
            .find(|((c, sc, n), _)| {
                c == "subnetworks" && n == name && region.as_ref().is_none_or(|r| sc == r)
            })
            .and_then(|(_, v)| v["ipCidrRange"].as_str())
            .and_then(|r| r.parse().ok())
    }

    /// Compute's refusals of an IP a new address or forwarding rule asks for: an internal IP
    /// outside its subnetwork's range (400 `invalid`), an IP another address of the scope
    /// holds (409 `IP_IN_USE_BY_ANOTHER_RESOURCE`), a forwarding rule on an IP, protocol and
    /// port another forwarding rule of the scope already uses (400 `invalid`).
    fn check_ip(st: &State, scope: &str, coll: &str, body: &Value) -> Res<()> {
        let (field, internal) = match coll {
            "addresses" => ("address", body["addressType"] == "INTERNAL"),
            "forwardingRules" => ("IPAddress", body["loadBalancingScheme"] == "INTERNAL"),
            _ => return Ok(()),
        };
        let Some(ip) = body[field].as_str().filter(|s| !s.is_empty()) else {
            return Ok(());
        };
        if internal
            && let Ok(addr) = ip.parse::<std::net::Ipv4Addr>()
            && let Some(range) = body["subnetwork"].as_str().and_then(|l| Self::subnet_range(st, l))
            && !range.contains(&addr)
        {
            return Err(bad(
                "invalid",
                format!(
                    "Invalid value for field 'resource.{field}': '{ip}'. Requested internal IP is outside the subnetwork CIDR range."
                ),
            ));
        }
        let same_scope = |c: &str, s: &str| c == coll && s == scope;
        if coll == "addresses" {
            if st.res.iter().any(|((c, s, _), v)| same_scope(c, s) && v["address"] == ip) {
                return Err(err(
                    409,
                    "conflict",
                    format!(
                        "IP_IN_USE_BY_ANOTHER_RESOURCE - IP '{ip}' is already being used by another resource."
                    ),
                ));
            }
            return Ok(());
        }
        let protocol = |v: &Value| v["IPProtocol"].as_str().unwrap_or("TCP").to_string();
        let mine = rule_ports(body);
        let clash = st.res.iter().any(|((c, s, _), v)| {
            same_scope(c, s)
                && v["IPAddress"] == ip
                && protocol(v) == protocol(body)
                && overlaps(&rule_ports(v), &mine)
        });
        if clash {
            return Err(bad(
                "invalid",
                format!(
                    "Invalid value for field 'resource.IPAddress': '{ip}'. Specified IP address is in-use and would result in a conflict."
                ),
            ));
        }
        Ok(())
    }

    /// Compute's refusals of a forwarding rule's shape (400 `invalid`): more than 5 `ports`,
    /// `ports` together with `portRange`, an `INTERNAL` rule without a `backendService`, an
    /// external rule whose `networkTier` differs from that of the address it names.
    fn check_rule(&self, st: &State, scope: &str, coll: &str, body: &Value) -> Res<()> {
        if coll != "forwardingRules" {
            return Ok(());
        }
        let ports: Vec<&str> =
            body["ports"].as_array().into_iter().flatten().filter_map(Value::as_str).collect();
        let range = body["portRange"].as_str().unwrap_or_default();
        if ports.len() > 5 {
            return Err(bad(
                "invalid",
                format!(
                    "Invalid value for field 'resource.ports': '{}'. A forwarding rule takes at most 5 ports; use portRange or allPorts for more.",
                    ports.join(",")
                ),
            ));
        }
        if !ports.is_empty() && !range.is_empty() {
            return Err(bad(
                "invalid",
                format!(
                    "Invalid value for field 'resource.portRange': '{range}'. portRange and ports cannot both be specified."
                ),
            ));
        }
        let scheme = body["loadBalancingScheme"].as_str().unwrap_or("EXTERNAL");
        if scheme == "INTERNAL" && body["backendService"].as_str().unwrap_or_default().is_empty() {
            return Err(bad(
                "invalid",
                "Invalid value for field 'resource.backendService': ''. An INTERNAL forwarding rule needs a backend service.",
            ));
        }
        if scheme == "EXTERNAL"
            && let Some(ip) = body["IPAddress"].as_str().filter(|s| !s.is_empty())
        {
            let addr = if ip.parse::<std::net::IpAddr>().is_ok() {
                st.res
                    .iter()
                    .find(|((c, s, _), v)| c == "addresses" && s == scope && v["address"] == ip)
                    .map(|(_, v)| v)
            } else {
                self.key_of(ip, "addresses").and_then(|k| st.res.get(&k))
            };
            let rule_tier = body["networkTier"].as_str().unwrap_or("PREMIUM");
            if let Some(a) = addr
                && a["addressType"] != "INTERNAL"
            {
                let addr_tier = a["networkTier"].as_str().unwrap_or("PREMIUM");
                if addr_tier != rule_tier {
                    return Err(bad(
                        "invalid",
                        format!(
                            "Invalid value for field 'resource.networkTier': '{rule_tier}'. The network tier of specified IP address is {addr_tier}, that of Forwarding Rule must be the same."
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Every resource, with the inserts still running (they hold quota already).
    fn view(st: &State) -> Vec<(&Key, &Value)> {
        let mut out: Vec<(&Key, &Value)> = st.res.iter().collect();
        for p in &st.pending {
            if let Change::Put(v) = &p.change
                && !st.res.contains_key(&p.key)
            {
                out.push((&p.key, v));
            }
        }
        out
    }

    /// The usage of a quota metric in a scope (`regions/r` for regional metrics, else the
    /// project).
    fn quota_usage(st: &State, metric: &str, region_scope: &str) -> u64 {
        let view = Self::view(st);
        let external = |v: &Value| v["addressType"] != "INTERNAL";
        let in_region = |s: &str| s == region_scope;
        let count =
            |f: &dyn Fn(&Key, &Value) -> bool| view.iter().filter(|(k, v)| f(k, v)).count() as u64;
        match metric {
            "FORWARDING_RULES" => count(&|k, _| k.0 == "forwardingRules" && in_region(&k.1)),
            "STATIC_ADDRESSES" => {
                count(&|k, v| k.0 == "addresses" && in_region(&k.1) && external(v))
            }
            "INTERNAL_ADDRESSES" => {
                count(&|k, v| k.0 == "addresses" && in_region(&k.1) && !external(v))
            }
            "IN_USE_ADDRESSES" => {
                let reserved: BTreeSet<&str> = view
                    .iter()
                    .filter(|(k, v)| k.0 == "addresses" && in_region(&k.1) && external(v))
                    .filter_map(|(_, v)| v["address"].as_str())
                    .collect();
                let ephemeral = count(&|k, v| {
                    k.0 == "forwardingRules"
                        && in_region(&k.1)
                        && v["loadBalancingScheme"] != "INTERNAL"
                        && !v["IPAddress"].as_str().is_some_and(|ip| reserved.contains(ip))
                });
                reserved.len() as u64 + ephemeral
            }
            "BACKEND_SERVICES" => count(&|k, _| k.0 == "backendServices"),
            "HEALTH_CHECKS" => count(&|k, _| k.0 == "healthChecks" || k.0 == "httpHealthChecks"),
            "FIREWALLS" => count(&|k, _| k.0 == "firewalls"),
            _ => 0,
        }
    }

    /// The quota metrics an insert of `coll` (with `body`) in `scope` takes one more of.
    fn quota_metrics(st: &State, scope: &str, coll: &str, body: &Value) -> Vec<&'static str> {
        let regional = scope.starts_with("regions/");
        match coll {
            "forwardingRules" if regional => {
                let mut m = vec!["FORWARDING_RULES"];
                let ip = body["IPAddress"].as_str().unwrap_or_default();
                let reserved = !ip.is_empty()
                    && st.res.iter().any(|((c, s, _), v)| {
                        c == "addresses"
                            && s == scope
                            && (v["address"] == ip || v["selfLink"] == ip)
                    });
                if body["loadBalancingScheme"] != "INTERNAL" && !reserved {
                    m.push("IN_USE_ADDRESSES");
                }
                m
            }
            "addresses" if regional => {
                if body["addressType"] == "INTERNAL" {
                    vec!["INTERNAL_ADDRESSES"]
                } else {
                    vec!["STATIC_ADDRESSES", "IN_USE_ADDRESSES"]
                }
            }
            "backendServices" => vec!["BACKEND_SERVICES"],
            "healthChecks" | "httpHealthChecks" => vec!["HEALTH_CHECKS"],
            "firewalls" => vec!["FIREWALLS"],
            _ => vec![],
        }
    }

    /// 403 `quotaExceeded` when the insert would take a metric past its limit.
    fn check_quota(&self, st: &State, scope: &str, coll: &str, body: &Value) -> Res<()> {
        for metric in Self::quota_metrics(st, scope, coll, body) {
            let limit = self.quota(metric);
            let regional = REGIONAL_QUOTAS.contains(&metric);
            if Self::quota_usage(st, metric, scope) + 1 > limit {
                let place = match scope.strip_prefix("regions/") {
                    Some(r) if regional => format!("in region {r}"),
                    _ => "globally".to_string(),
                };
                return Err(err(
                    403,
                    "quotaExceeded",
                    format!("Quota '{metric}' exceeded.  Limit: {limit}.0 {place}."),
                ));
            }
        }
        Ok(())
    }

    /// Compute's `quotas[]` of a region (`regions/r`) or, for `global`, of the project.
    fn quotas_json(&self, st: &State, scope: &str) -> Value {
        let metrics = if scope == "global" { PROJECT_QUOTAS } else { REGIONAL_QUOTAS };
        json!(
            metrics
                .iter()
                .map(|m| json!({
                    "metric": m,
                    "limit": self.quota(m) as f64,
                    "usage": Self::quota_usage(st, m, scope) as f64,
                }))
                .collect::<Vec<_>>()
        )
    }

    fn full_link(&self, s: &str) -> String {
        let r = rel(s);
        if r.starts_with("projects/") {
            format!("{LINK_PREFIX}{r}")
        } else {
            format!("{}/{}", self.base(), r.trim_start_matches('/'))
        }
    }

    fn check_refs(&self, st: &State, coll: &str, body: &mut Value) -> Res<()> {
        let need = |field: &str, v: &Value, colls: &[&str]| -> Res<()> {
            if let Some(link) = v.as_str()
                && !self.exists(st, link, colls)
            {
                // A resource whose insert is still running is not ready to be used.
                if colls
                    .iter()
                    .any(|c| self.key_of(link, c).is_some_and(|k| Self::inserting(st, &k)))
                {
                    return Err(not_ready(rel(link)));
                }
                tracing::debug!(field, link, "gcp emulator: reference to a missing resource");
                return Err(not_found(rel(link)));
            }
            Ok(())
        };
        match coll {
            "forwardingRules" => {
                need("target", &body["target"], &["targetPools"])?;
                need("backendService", &body["backendService"], &["backendServices"])?;
            }
            "targetPools" => {
                for i in body["instances"].as_array().cloned().unwrap_or_default() {
                    need("instances", &i, &["instances"])?;
                }
                for h in body["healthChecks"].as_array().cloned().unwrap_or_default() {
                    need("healthChecks", &h, &["httpHealthChecks"])?;
                }
            }
            "backendServices" => {
                for h in body["healthChecks"].as_array().cloned().unwrap_or_default() {
                    need("healthChecks", &h, &["healthChecks", "httpHealthChecks"])?;
                }
                for b in body["backends"].as_array().cloned().unwrap_or_default() {
                    need("group", &b["group"], &["instanceGroups"])?;
                }
            }
            "routes" => need("nextHopInstance", &body["nextHopInstance"], &["instances"])?,
            "firewalls" => need("network", &body["network"], &["networks"])?,
            _ => {}
        }
        Ok(())
    }

    /// Who references the resource at `link` (self-links of the referrers).
    fn users(&self, st: &State, coll: &str, scope: &str, name: &str) -> Vec<String> {
        let me = (coll.to_string(), scope.to_string(), name.to_string());
        let refers = |v: &Value| -> bool {
            let mut links = Vec::new();
            for f in ["target", "backendService", "group"] {
                if let Some(s) = v[f].as_str() {
                    links.push(s.to_string());
                }
            }
            for f in ["healthChecks", "instances"] {
                for s in v[f].as_array().into_iter().flatten().filter_map(Value::as_str) {
                    links.push(s.to_string());
                }
            }
            for b in v["backends"].as_array().into_iter().flatten() {
                if let Some(s) = b["group"].as_str() {
                    links.push(s.to_string());
                }
            }
            links.iter().any(|l| self.key_of(l, coll).as_ref() == Some(&me))
        };
        let mut out: Vec<String> = st
            .res
            .iter()
            .filter(|(k, v)| **k != me && k.0 != "instances" && refers(v))
            .filter_map(|(_, v)| v["selfLink"].as_str().map(String::from))
            .collect();
        if coll == "addresses"
            && let Some(a) = st.res.get(&me)
        {
            let rendered = self.render(st, a);
            out.extend(
                rendered["users"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(String::from),
            );
        }
        out
    }

    /// The referrers that keep a resource from being deleted: all of them, except for an
    /// address, which Compute releases while forwarding rules use its IP (they keep it).
    fn delete_blockers(&self, st: &State, coll: &str, scope: &str, name: &str) -> Vec<String> {
        if coll == "addresses" {
            return vec![];
        }
        self.users(st, coll, scope, name)
    }

    fn delete(&self, scope: &str, coll: &str, name: &str) -> Res<Value> {
        let mut st = self.st();
        let key: Key = (coll.into(), scope.into(), name.into());
        if !st.res.contains_key(&key) {
            if Self::inserting(&st, &key) {
                return Err(not_ready(&self.path_of(scope, coll, name)));
            }
            return Err(not_found(&self.path_of(scope, coll, name)));
        }
        self.check_ready(&st, &key)?;
        if coll != "instances" {
            let users = self.delete_blockers(&st, coll, scope, name);
            if let Some(u) = users.first() {
                return Err(bad(
                    "resourceInUseByAnotherResource",
                    format!(
                        "The {} resource '{}' is already being used by '{}'",
                        singular(coll),
                        self.path_of(scope, coll, name),
                        rel(u)
                    ),
                ));
            }
        }
        Ok(self.start_op(&mut st, &key, Change::Remove, Action::Delete, "delete"))
    }

    fn check_fingerprint(cur: &Value, body: &Value, field: &str) -> Res<()> {
        if let Some(fp) = body[field].as_str()
            && cur[field].as_str().is_some_and(|c| c != fp)
        {
            return Err(err(
                412,
                "conditionNotMet",
                format!(
                    "Supplied fingerprint does not match current metadata fingerprint ({field})."
                ),
            ));
        }
        Ok(())
    }

    fn update(
        &self,
        scope: &str,
        coll: &str,
        name: &str,
        body: Value,
        replace: bool,
    ) -> Res<Value> {
        let mut st = self.st();
        let key: Key = (coll.into(), scope.into(), name.into());
        let Some(cur) = st.res.get(&key).cloned() else {
            if Self::inserting(&st, &key) {
                return Err(not_ready(&self.path_of(scope, coll, name)));
            }
            return Err(not_found(&self.path_of(scope, coll, name)));
        };
        self.check_ready(&st, &key)?;
        if coll == "backendServices" && body["fingerprint"].as_str().unwrap_or_default().is_empty()
        {
            // Compute: "fingerprint … required in order to update the BackendService".
            return Err(err(
                412,
                "conditionNotMet",
                format!(
                    "Precondition not met: a fingerprint is required to {} the backend service '{}'; get it first.",
                    if replace { "update" } else { "patch" },
                    self.path_of(scope, coll, name)
                ),
            ));
        }
        Self::check_fingerprint(&cur, &body, "fingerprint")?;
        let mut body = body;
        self.check_refs(&st, coll, &mut body)?;
        let mut next = if replace { body } else { merged(&cur, &body) };
        for keep in
            ["kind", "id", "selfLink", "creationTimestamp", "region", "zone", "name", "_members"]
        {
            if !cur[keep].is_null() {
                next[keep] = cur[keep].clone();
            }
        }
        if !cur["fingerprint"].is_null() {
            next["fingerprint"] = json!(bump(&cur["fingerprint"]));
        }
        // A replaced resource gets the server defaults again.
        for f in ["direction", "network", "requestPath", "sessionAffinity", "protocol"] {
            if next[f].is_null() && !cur[f].is_null() {
                next[f] = cur[f].clone();
            }
        }
        for f in [
            "priority",
            "port",
            "checkIntervalSec",
            "timeoutSec",
            "healthyThreshold",
            "unhealthyThreshold",
        ] {
            if next[f].as_u64().unwrap_or(0) == 0 && !cur[f].is_null() {
                next[f] = cur[f].clone();
            }
        }
        Ok(self.start_op(
            &mut st,
            &key,
            Change::Put(next),
            Action::Update,
            if replace { "update" } else { "patch" },
        ))
    }

    fn members(&self, st: &State, key: &Key) -> Vec<String> {
        st.res
            .get(key)
            .and_then(|v| v["_members"].as_array())
            .map(|a| a.iter().filter_map(Value::as_str).map(String::from).collect())
            .unwrap_or_default()
    }

    fn action(
        &self,
        qs: &[(String, String)],
        scope: &str,
        coll: &str,
        name: &str,
        action: &str,
        body: Value,
    ) -> Res<Value> {
        let mut st = self.st();
        let key: Key = (coll.into(), scope.into(), name.into());
        if !st.res.contains_key(&key) {
            if Self::inserting(&st, &key) {
                return Err(not_ready(&self.path_of(scope, coll, name)));
            }
            return Err(not_found(&self.path_of(scope, coll, name)));
        }
        let reads = matches!(action, "listInstances" | "getHealth");
        if !reads {
            self.check_ready(&st, &key)?;
        }
        let link = self.link(scope, coll, name);
        let refs = |field: &str| -> Vec<String> {
            body[field]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|x| x["instance"].as_str().or(x.as_str()))
                .map(|s| self.full_link(s))
                .collect()
        };
        match (coll, action) {
            ("targetPools", "addInstance" | "removeInstance")
            | ("instanceGroups", "addInstances" | "removeInstances") => {
                let insts = refs("instances");
                let add = action.starts_with("add");
                if add {
                    for (n, i) in insts.iter().enumerate() {
                        if !self.exists(&st, i, &["instances"]) {
                            return Err(not_found(rel(i)));
                        }
                        // An instance group holds instances of its own zone only.
                        if coll == "instanceGroups"
                            && let Some((_, iz, _)) = self.key_of(i, "instances")
                            && iz != scope
                        {
                            return Err(bad(
                                "invalid",
                                format!(
                                    "Invalid value for field 'resource.instances[{n}].instance': '{}'. Instance must be in zone '{}' of the instance group, not '{}'.",
                                    rel(i),
                                    scope.trim_start_matches("zones/"),
                                    iz.trim_start_matches("zones/"),
                                ),
                            ));
                        }
                    }
                }
                let field = if coll == "targetPools" { "instances" } else { "_members" };
                let mut v = st.res.get(&key).cloned().ok_or_else(|| not_found(&link))?;
                let mut cur: Vec<String> = v[field]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect();
                if add {
                    for i in insts {
                        if cur.contains(&i) {
                            if coll == "instanceGroups" {
                                return Err(bad(
                                    "memberAlreadyExists",
                                    format!(
                                        "The resource '{}' is already a member of '{}'",
                                        rel(&i),
                                        rel(&link)
                                    ),
                                ));
                            }
                        } else {
                            cur.push(i);
                        }
                    }
                } else {
                    cur.retain(|c| !insts.contains(c));
                }
                v[field] = json!(cur);
                Ok(self.start_op(&mut st, &key, Change::Put(v), Action::Update, action))
            }
            ("instanceGroups", "listInstances") => {
                let items: Vec<Value> = self
                    .members(&st, &key)
                    .into_iter()
                    .map(|i| {
                        let status = self
                            .key_of(&i, "instances")
                            .and_then(|k| st.res.get(&k))
                            .and_then(|v| v["status"].as_str().map(String::from))
                            .unwrap_or("TERMINATED".into());
                        json!({ "instance": i, "status": status })
                    })
                    .collect();
                drop(st);
                let (items, next) = self.page(qs, items)?;
                let mut v = json!({ "kind": "compute#instanceGroupsListInstances", "id": format!("{}/listInstances", rel(&link)), "items": items, "selfLink": link });
                if let Some(n) = next {
                    v["nextPageToken"] = json!(n);
                }
                Ok(v)
            }
            ("backendServices", "getHealth") => {
                let Some(group) = body["group"].as_str() else {
                    return Err(bad("required", "Required field 'group' not specified"));
                };
                let Some(gk) =
                    self.key_of(group, "instanceGroups").filter(|k| st.res.contains_key(k))
                else {
                    return Err(not_found(rel(group)));
                };
                let statuses: Vec<Value> = self
                    .members(&st, &gk)
                    .into_iter()
                    .filter_map(|i| {
                        let inst = st.res.get(&self.key_of(&i, "instances")?)?;
                        let ip = inst["networkInterfaces"][0]["networkIP"].clone();
                        let healthy = inst["status"] == "RUNNING";
                        Some(json!({ "instance": i, "ipAddress": ip,
                            "healthState": if healthy { "HEALTHY" } else { "UNHEALTHY" } }))
                    })
                    .collect();
                Ok(json!({ "kind": "compute#backendServiceGroupHealth", "healthStatus": statuses }))
            }
            ("forwardingRules", "setTarget") => {
                if let Some(t) = body["target"].as_str()
                    && !self.exists(&st, t, &["targetPools"])
                {
                    return Err(not_found(rel(t)));
                }
                let mut v = st.res.get(&key).cloned().ok_or_else(|| not_found(&link))?;
                v["target"] = body["target"].clone();
                Ok(self.start_op(&mut st, &key, Change::Put(v), Action::Update, action))
            }
            (_, "setLabels") => {
                let cur = st.res.get(&key).cloned().unwrap_or_default();
                Self::check_fingerprint(&cur, &body, "labelFingerprint")?;
                let mut v = cur.clone();
                v["labels"] = body["labels"].clone();
                v["labelFingerprint"] = json!(bump(&cur["labelFingerprint"]));
                Ok(self.start_op(&mut st, &key, Change::Put(v), Action::Update, action))
            }
            _ => Err(err(
                405,
                "methodNotAllowed",
                format!("{action} is not supported on {coll} by this emulator"),
            )),
        }
    }

    fn state_json(&self) -> Value {
        let st = self.st();
        let mut out: BTreeMap<String, Vec<Value>> = BTreeMap::new();
        for ((c, _, _), v) in &st.res {
            let mut v = self.render(&st, v);
            if let Some(m) = v.as_object_mut() {
                m.remove("_members");
            }
            out.entry(c.clone()).or_default().push(v);
        }
        json!({ "project": self.project(), "resources": out, "operations": self.ops.state() })
    }
}

/// Applies the mutations whose operations are `DONE` (in the order they were accepted) and
/// drops those whose operations failed: a failed insert leaves nothing (an address shown
/// `RESERVING` goes), a failed update or delete leaves the resource as it was.
fn settle(ops: &AsyncOps, st: &mut State) {
    if st.pending.is_empty() {
        return;
    }
    let mut still = Vec::new();
    for p in std::mem::take(&mut st.pending) {
        match ops.phase(&p.op) {
            Some(Phase::Pending) => still.push(p),
            Some(Phase::Done) => match p.change {
                Change::Put(v) => {
                    st.res.insert(p.key, v);
                }
                Change::Remove => {
                    st.res.remove(&p.key);
                    if p.key.0 == "instances" {
                        // Compute removes a deleted instance from its instance groups.
                        for v in st.res.values_mut() {
                            if let Some(m) = v.get_mut("_members").and_then(Value::as_array_mut) {
                                m.retain(|x| x.as_str() != Some(p.link.as_str()));
                            }
                        }
                    }
                }
            },
            Some(Phase::Failed(_)) | None => {
                if st.res.get(&p.key).is_some_and(|v| v.get("_reserving").is_some()) {
                    st.res.remove(&p.key);
                }
            }
        }
    }
    st.pending = still;
}

/// Compute's 400 `resourceNotReady`: a change to a resource with an operation in flight.
fn not_ready(path: &str) -> Resp {
    bad("resourceNotReady", format!("The resource '{path}' is not ready"))
}

fn out_scope(op: &Value) -> Option<String> {
    let link = op["selfLink"].as_str()?;
    let r = rel(link);
    let segs: Vec<&str> = r.split('/').collect();
    let i = segs.iter().position(|s| *s == "operations")?;
    match segs.get(i - 1) {
        Some(&"global") => Some("global".into()),
        Some(z) => Some(format!("{}/{z}", segs.get(i - 2)?)),
        None => None,
    }
}

fn render_op(op: &Operation, base: &str, scope: &str, op_type: Option<&str>) -> Value {
    let zone = scope.strip_prefix("zones/");
    let mut v = gce_operation(op, base, zone);
    v["selfLink"] = json!(format!("{base}/{scope}/operations/{}", op.id));
    if let Some(r) = scope.strip_prefix("regions/") {
        v["region"] = json!(format!("{base}/regions/{r}"));
    }
    if let Some(t) = op_type {
        v["operationType"] = json!(t);
    }
    v["insertTime"] = json!(rfc3339_now());
    v["startTime"] = json!(rfc3339_now());
    v["targetId"] = json!((fnv(&op.target) % 1_000_000_000_000).to_string());
    if v["status"] == "DONE" {
        v["endTime"] = json!(rfc3339_now());
    }
    if let Phase::Failed(message) = op.phase() {
        // Compute's failed operation: DONE with `error.errors[]{code, message}` and the HTTP
        // status the call would have had. A message `CODE: text` names its code (e.g.
        // `QUOTA_EXCEEDED: …`); otherwise the failure is Compute's `INTERNAL_ERROR`.
        let (code, text) = match message.split_once(": ") {
            Some((c, t))
                if !c.is_empty() && c.bytes().all(|b| b.is_ascii_uppercase() || b == b'_') =>
            {
                (c.to_string(), t.to_string())
            }
            _ => ("INTERNAL_ERROR".to_string(), message.clone()),
        };
        let (status, status_text) = match code.as_str() {
            "INTERNAL_ERROR" => (500, "INTERNAL SERVER ERROR"),
            "QUOTA_EXCEEDED" => (403, "FORBIDDEN"),
            "RESOURCE_NOT_FOUND" => (404, "NOT FOUND"),
            "RESOURCE_ALREADY_EXISTS" => (409, "CONFLICT"),
            _ => (400, "BAD REQUEST"),
        };
        v["error"] = json!({ "errors": [{ "code": code, "message": text }] });
        v["httpErrorStatusCode"] = json!(status);
        v["httpErrorMessage"] = json!(status_text);
    }
    v
}

/// The port ranges a forwarding rule listens on (`allPorts`, no port range or no ports: all).
fn rule_ports(v: &Value) -> Vec<(u32, u32)> {
    let parse = |s: &str| -> Option<(u32, u32)> {
        let (a, b) = s.split_once('-').unwrap_or((s, s));
        Some((a.trim().parse().ok()?, b.trim().parse().ok()?))
    };
    if v["allPorts"] == true {
        return vec![(0, 65535)];
    }
    let mut out: Vec<(u32, u32)> = Vec::new();
    if let Some(r) = v["portRange"].as_str().filter(|s| !s.is_empty()) {
        out.extend(parse(r));
    }
    for p in v["ports"].as_array().into_iter().flatten().filter_map(Value::as_str) {
        out.extend(parse(p));
    }
    if out.is_empty() {
        out.push((0, 65535));
    }
    out
}

fn overlaps(a: &[(u32, u32)], b: &[(u32, u32)]) -> bool {
    a.iter().any(|(a0, a1)| b.iter().any(|(b0, b1)| a0 <= b1 && b0 <= a1))
}

use crate::kit::rfc3339 as rfc3339_at;

/// The `regions/<r>` scope a subnetwork link names (auto-mode subnetworks share their
/// network's name in every region).
fn subnet_region(link: &str) -> Option<String> {
    let i = link.find("/regions/")?;
    let rest = &link[i + "/regions/".len()..];
    Some(format!("regions/{}", rest.split('/').next()?))
}

/// The first host of an IPv4 range (a subnetwork's gateway).
fn gateway_of(cidr: &str) -> String {
    match cidr.parse::<ipnet::Ipv4Net>() {
        Ok(n) => std::net::Ipv4Addr::from(u32::from(n.network()) + 1).to_string(),
        Err(_) => String::new(),
    }
}

fn last(link: &str) -> &str {
    link.rsplit('/').next().unwrap_or(link)
}

fn status_of(p: PowerState) -> &'static str {
    match p {
        PowerState::Running => "RUNNING",
        PowerState::Stopped => "TERMINATED",
        PowerState::Terminated => "STOPPING",
    }
}

/// A fingerprint: base64 of the big-endian version number (Compute's are opaque base64).
fn fingerprint(n: u64) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let data = n.to_be_bytes();
    let mut out = String::new();
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let v = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for k in 0..4 {
            if k <= chunk.len() {
                out.push(A[((v >> (18 - 6 * k)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn bump(fp: &Value) -> String {
    let n = (1..10_000).find(|n| fp.as_str() == Some(fingerprint(*n).as_str())).unwrap_or(0);
    fingerprint(n + 1)
}

fn default(body: &mut Value, field: &str, v: &str) {
    if body[field].as_str().unwrap_or_default().is_empty() {
        body[field] = json!(v);
    }
}

fn default_num(body: &mut Value, field: &str, v: u64) {
    if body[field].as_u64().unwrap_or(0) == 0 {
        body[field] = json!(v);
    }
}

fn merged(cur: &Value, patch: &Value) -> Value {
    let mut out = cur.clone();
    if let (Some(o), Some(p)) = (out.as_object_mut(), patch.as_object()) {
        for (k, v) in p {
            o.insert(k.clone(), v.clone());
        }
    }
    out
}

fn valid_name(n: &str) -> bool {
    let b = n.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_lowercase()
        && b.iter().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
        && b[b.len() - 1] != b'-'
}

impl Cloud for GcpCloud {
    fn name(&self) -> String {
        "gcp".into()
    }

    fn operation(&self, head: &http::request::Parts, _body: &Bytes) -> String {
        operation_name(&head.method, &parse_target(head.uri.path()).1)
    }

    fn error(&self, head: &http::request::Parts, _op: &str, kind: ErrorKind) -> ErrorReply {
        let (status, reason, message) = match kind {
            // Compute's throttling answer: 403 with reason `rateLimitExceeded` (domain
            // `usageLimits`), not a 429 (a 403 `quotaExceeded` is a quota, not a throttle).
            ErrorKind::Throttle => (403, "rateLimitExceeded", "Rate Limit Exceeded"),
            ErrorKind::Unavailable => {
                (503, "backendError", "The service is currently unavailable.")
            }
            ErrorKind::Status(s) => (
                s,
                match s {
                    400 => "badRequest",
                    401 => "authError",
                    403 => "forbidden",
                    404 => "notFound",
                    409 => "alreadyExists",
                    412 => "conditionNotMet",
                    429 => "rateLimitExceeded",
                    503 => "backendError",
                    _ => "internalError",
                },
                "Injected fault.",
            ),
        };
        if head.uri.path().starts_with("/computeMetadata/") {
            return ErrorReply { status, content_type: "text/plain", body: format!("{message}\n") };
        }
        let mut body = error_body(status, reason, message);
        if matches!(kind, ErrorKind::Throttle) {
            body["error"]["errors"][0]["domain"] = json!("usageLimits");
        }
        ErrorReply {
            status,
            content_type: "application/json; charset=UTF-8",
            body: body.to_string(),
        }
    }

    fn serve(&self, op: String, req: Request<Bytes>) -> ServeFuture {
        let (project, target) = parse_target(req.uri().path());
        match self.handle(&op, project.as_deref(), target, &req) {
            Ok(resp) => Box::pin(async move { Ok(resp) }),
            Err(fut) => fut,
        }
    }

    fn reset(&self) {
        self.ops.reset();
        self.load();
    }

    fn state(&self) -> Value {
        self.state_json()
    }

    fn async_ops(&self) -> Option<&AsyncOps> {
        Some(&self.ops)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operation_names_follow_the_go_client_services() {
        let cases = [
            (Method::GET, "/compute/v1/projects/p/zones/z/instances", "compute.instances.list"),
            (
                Method::GET,
                "/compute/v1/projects/p/aggregated/instances",
                "compute.instances.aggregatedList",
            ),
            (
                Method::POST,
                "/compute/v1/projects/p/regions/r/targetPools/t/addInstance",
                "compute.targetPools.addInstance",
            ),
            (
                Method::POST,
                "/compute/v1/projects/p/regions/r/healthChecks",
                "compute.regionHealthChecks.insert",
            ),
            (
                Method::PUT,
                "/compute/v1/projects/p/regions/r/backendServices/b",
                "compute.regionBackendServices.update",
            ),
            (Method::DELETE, "/compute/v1/projects/p/global/routes/x", "compute.routes.delete"),
            (
                Method::POST,
                "/compute/v1/projects/p/zones/z/operations/op-1/wait",
                "compute.zoneOperations.wait",
            ),
            (
                Method::GET,
                "/compute/v1/projects/p/global/operations/op-1",
                "compute.globalOperations.get",
            ),
            (Method::GET, "/computeMetadata/v1/instance/zone", "metadata.get"),
            (Method::GET, "/elsewhere", "compute.unknown"),
        ];
        for (m, p, want) in cases {
            assert_eq!(operation_name(&m, &parse_target(p).1), want, "{m} {p}");
        }
    }

    #[test]
    fn filters_match_whole_values_with_regexes() {
        let v = json!({"name": "node-12", "status": "RUNNING", "labels": {"team": "blue"}});
        let ok = |f: &str| matches(&parse_filter(f).unwrap(), &v).unwrap();
        assert!(ok(r#"name eq "node-.*""#));
        assert!(ok(r#"name eq "(node-1|node-12)""#));
        assert!(!ok(r#"name eq "node-1""#), "whole-value match");
        assert!(ok(r#"(name ne "x.*") (status = "RUNNING")"#));
        assert!(ok(r#"labels.team = blue AND status != "TERMINATED""#));
        assert!(!ok(r#"labels.team = red"#));
        assert!(parse_filter("name OR").is_err());
        assert!(re::full_match("a\\.b+", "a.bbb").unwrap());
        assert!(!re::full_match("a\\.b+", "axb").unwrap());
    }

    #[test]
    fn fingerprints_change_on_every_update() {
        assert_ne!(fingerprint(1), fingerprint(2));
        assert_eq!(bump(&json!(fingerprint(7))), fingerprint(8));
        assert_eq!(rfc3339_at(0), "1970-01-01T00:00:00Z");
        assert_eq!(rfc3339_at(951_782_400), "2000-02-29T00:00:00Z");
    }
}
