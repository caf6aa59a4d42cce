//! IBM Cloud emulator: IAM (API-key → bearer token), Resource Manager resource groups and the
//! VPC Gen2 `/v1` API the IBM provider calls (VPCs, subnets, instances, load balancers with
//! their listeners, pools and pool members), with IBM's field names, status codes, paging and
//! error bodies, so `IBM/vpc-go-sdk` and `IBM/go-sdk-core` parse every reply
//! (`ci/fidelity ibm` checks that).
//!
//! One server serves all three APIs; point IAM, Resource Manager and VPC endpoints at it:
//!
//! | call | operation (faults and counters key on it) |
//! |---|---|
//! | `POST /identity/token` | `iam.token` |
//! | `GET /v2/resource_groups` | `resource_manager.resource_groups.list` |
//! | `GET /v1/vpcs`, `/v1/vpcs/{id}` | `vpc.vpcs.list`, `vpc.vpcs.get` |
//! | `GET /v1/subnets`, `/v1/subnets/{id}` | `vpc.subnets.list`, `vpc.subnets.get` |
//! | `GET /v1/instances`, `/v1/instances/{id}` | `vpc.instances.list`, `vpc.instances.get` |
//! | `/v1/load_balancers[/{id}]` | `vpc.load_balancers.{list,create,get,update,delete}` |
//! | `…/{id}/listeners[/{id}]` | `vpc.load_balancer_listeners.{list,create,get,update,delete}` |
//! | `…/{id}/pools[/{id}]` | `vpc.load_balancer_pools.{list,create,get,update,delete}` |
//! | `…/pools/{id}/members[/{id}]` | `vpc.load_balancer_pool_members.{list,create,replace,get,update,delete}` |
//! | `GET /v3/tags`, `POST /v3/tags/attach`, `POST /v3/tags/detach` | `tagging.tags.{list,attach,detach}` |
//!
//! Global Tagging (user tags only) as IBM's API answers it: tags are attached to a resource's
//! CRN (here: load balancers), `attach`/`detach` take `{"resources":[{"resource_id"}],
//! "tag_names":[...]}` (or `tag_name`) and answer `{"results":[{"resource_id","is_error"}]}`
//! (`is_error` for a CRN this account does not have), `GET /v3/tags?attached_to=<crn>` pages
//! `{"total_count","offset","limit","items":[{"name"}]}` with `offset`/`limit` (1..=1000).
//! Rejected as IBM does: a tag that is not 1-128 letters, digits, spaces, `_`, `-`, `.`, `:`
//! (400), no resources or no tag names (400), another account's `account_id` (403), a
//! `tag_type` other than `user` (400: only user tags are emulated). Tags are
//! case-insensitive and kept lower-cased; they go when their load balancer is deleted, and the
//! state dump lists each load balancer's `tags`.
//!
//! Rules enforced as IBM does: every VPC and Resource Manager call needs a bearer token this
//! emulator issued and that has not expired (401); VPC calls need `version=YYYY-MM-DD` and
//! `generation=2` (400); lists page with `start`/`limit` (`first`/`next` hrefs carry `start`
//! and `limit` and the filters, never `version`/`generation`); a load balancer is
//! `create_pending`/`update_pending`/`delete_pending` for a configurable time after each change
//! ([`AsyncOps`], [`ibm_status`]) and any change to it or its children while it is not
//! `active` is a 409; a pool that is a listener's default pool cannot be deleted (409).
//! Errors: `{"errors":[{"code","message","more_info"}],"trace"}` (IAM: `errorCode`,
//! `errorMessage`, `context`).
//!
//! World mapping: `networks` are VPCs (one VPC `IbmOptions::vpc_name` when none),
//! `subnets` are subnets (one per zone when none), `instances` are VPC instances (status
//! `running`, `stopped`, or `deleting` for `terminated`; `type` is the profile, default
//! `bx2-4x16`). IDs are derived from names, so they are the same after a reset.

// Handlers return the IBM error reply itself as their error (`Res`): it is built once and sent
// as is, so its size does not matter.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode, header};
use serde_json::{Value, json};

use crate::asyncop::{Action, AsyncOps, Operation, Phase, Timing, ibm_status};
use crate::server::{Body, Cloud, ErrorKind, ErrorReply, ServeFuture, full};
use crate::world::{Instance, PowerState, World};

/// The API keys [`IbmOptions::default`] accepts.
pub const DEFAULT_API_KEY: &str = "ibm-emulator-api-key";

/// The `realistic` timing profile of VPC load balancers: provisioning takes minutes (IBM's
/// docs: a new load balancer is `create_pending` for several minutes before it is `active`),
/// a change (listener, pool, members) under a minute, a delete a few minutes (see
/// docs/emulators.md).
pub const REALISTIC: Timing = Timing {
    create: Duration::from_secs(240),
    update: Duration::from_secs(45),
    delete: Duration::from_secs(180),
};

/// How the emulator is set up beyond its world.
#[derive(Debug, Clone)]
pub struct IbmOptions {
    /// API keys IAM accepts (default: [`DEFAULT_API_KEY`]).
    pub api_keys: Vec<String>,
    /// The account ID (tokens' `account.bss` claim, resource groups, CRNs).
    pub account_id: String,
    /// The region (default: the world's, else `us-south`).
    pub region: Option<String>,
    /// The VPC made when the world has no `networks` (default `vpc-1`).
    pub vpc_name: String,
    /// The resource group's name (default `default`).
    pub resource_group: String,
    /// How long issued access tokens live (default 3600 s; whole seconds, at least 1).
    pub token_lifetime: Duration,
    /// How long a load balancer stays `*_pending` after each change (default 2 s).
    pub lb_pending: Duration,
    /// How many load balancers the region allows (IBM's default quota: 50 per region); a
    /// create past it is a 400 `over_quota`.
    pub lb_quota: usize,
    /// Listeners per load balancer (IBM's default: 10); past it, 400 `over_quota`.
    pub listener_quota: usize,
    /// Pools per load balancer (IBM's default: 10); past it, 400 `over_quota`.
    pub pool_quota: usize,
    /// Members per pool (IBM's default: 50); past it, 400 `over_quota`.
    pub member_quota: usize,
}

/// The IBM-only settings of a world file, under its `ibm:` key (read by [`parse_world`] and
/// [`load_world`]; the rest of the file is the kit's [`World`]):
///
/// ```yaml
/// ibm:
///   quotas: { load_balancers: 2, listeners_per_load_balancer: 10, pools_per_load_balancer: 10, members_per_pool: 50 }
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IbmWorld {
    /// VPC quotas (default: IBM's defaults).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quotas: Option<IbmQuotas>,
}

/// VPC load-balancer quotas; a create past one is a 400 `over_quota`, IBM's documented error
/// code. An absent key keeps IBM's default.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IbmQuotas {
    /// Load balancers in the account's region (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub load_balancers: Option<usize>,
    /// Listeners per load balancer (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listeners_per_load_balancer: Option<usize>,
    /// Pools per load balancer (default 10).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pools_per_load_balancer: Option<usize>,
    /// Members per pool (default 50).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub members_per_pool: Option<usize>,
}

impl IbmOptions {
    /// These options with the world file's `ibm:` settings applied (its quotas).
    pub fn with_world(mut self, ibm: &IbmWorld) -> Self {
        if let Some(q) = &ibm.quotas {
            self.lb_quota = q.load_balancers.unwrap_or(self.lb_quota);
            self.listener_quota = q.listeners_per_load_balancer.unwrap_or(self.listener_quota);
            self.pool_quota = q.pools_per_load_balancer.unwrap_or(self.pool_quota);
            self.member_quota = q.members_per_pool.unwrap_or(self.member_quota);
        }
        self
    }
}

/// Reads a world file with an optional `ibm:` section (see [`IbmWorld`]).
pub fn load_world(path: &std::path::Path) -> Result<(World, IbmWorld), crate::world::WorldError> {
    let text = std::fs::read_to_string(path)
        .map_err(|source| crate::world::WorldError::Read { path: path.to_path_buf(), source })?;
    parse_world_named(&text, &path.display().to_string())
}

/// Parses a world (YAML or JSON) with an optional `ibm:` section (see [`IbmWorld`]).
pub fn parse_world(text: &str) -> Result<(World, IbmWorld), crate::world::WorldError> {
    parse_world_named(text, "<inline>")
}

fn parse_world_named(
    text: &str,
    origin: &str,
) -> Result<(World, IbmWorld), crate::world::WorldError> {
    use crate::world::WorldError;
    let invalid = |detail: String| WorldError::Invalid { origin: origin.into(), detail };
    let mut v: Value = if text.trim_start().starts_with('{') {
        serde_json::from_str(text).map_err(|e| invalid(e.to_string()))?
    } else {
        serde_saphyr::from_str(text).map_err(|e| invalid(e.to_string()))?
    };
    let ibm = match v.as_object_mut().and_then(|m| m.remove("ibm")) {
        None | Some(Value::Null) => IbmWorld::default(),
        Some(o) => serde_json::from_value(o).map_err(|e| invalid(format!("ibm: {e}")))?,
    };
    let rest = if v.is_null() { "{}".to_string() } else { v.to_string() };
    let world = World::parse(&rest).map_err(|e| match e {
        WorldError::Invalid { detail, .. } => invalid(detail),
        other => other,
    })?;
    Ok((world, ibm))
}

/// IBM's 400 for a create past a quota.
fn over_quota(what: &str, quota: usize, have: usize) -> Resp {
    err(
        StatusCode::BAD_REQUEST,
        "over_quota",
        format!("{what} quota exceeded: the quota is {quota} and {have} exist or are requested."),
    )
}

impl Default for IbmOptions {
    fn default() -> Self {
        IbmOptions {
            api_keys: vec![DEFAULT_API_KEY.to_string()],
            account_id: "emulator-account-0001".into(),
            region: None,
            vpc_name: "vpc-1".into(),
            resource_group: "default".into(),
            token_lifetime: Duration::from_secs(3600),
            lb_pending: Duration::from_secs(2),
            lb_quota: 50,
            listener_quota: 10,
            pool_quota: 10,
            member_quota: 50,
        }
    }
}

type Resp = Response<Body>;
type Res<T> = Result<T, Resp>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_secs() -> f64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs_f64()).unwrap_or(0.0)
}

use crate::kit::rfc3339;

fn now_rfc3339() -> String {
    rfc3339(now_secs() as u64)
}

fn b64url(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(data.len() * 4 / 3 + 3);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        let chars = chunk.len() + 1;
        for i in 0..chars {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

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

/// A query string's parameters.
#[derive(Debug, Default)]
struct Query(Vec<(String, String)>);

impl Query {
    fn parse(q: Option<&str>) -> Query {
        Query(
            url::form_urlencoded::parse(q.unwrap_or_default().as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect(),
        )
    }

    fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }
}

fn trace_id() -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    uuid(&format!("trace-{}-{}", N.fetch_add(1, Ordering::Relaxed), now_secs()))
}

fn error_body(code: &str, message: &str) -> Value {
    json!({
        "errors": [{
            "code": code,
            "message": message,
            "more_info": "https://cloud.ibm.com/docs/vpc?topic=vpc-rias-error-messages",
        }],
        "trace": trace_id(),
    })
}

use crate::kit::json_reply as reply;

/// An IBM error answer.
fn err(status: StatusCode, code: &str, message: impl AsRef<str>) -> Resp {
    reply(status, &error_body(code, message.as_ref()))
}

fn not_found(what: &str, id: &str) -> Resp {
    err(StatusCode::NOT_FOUND, "not_found", format!("{what} with ID '{id}' cannot be found."))
}

fn bad(message: impl AsRef<str>) -> Resp {
    err(StatusCode::BAD_REQUEST, "validation_failed", message)
}

fn iam_error(status: StatusCode, code: &str, message: &str) -> Value {
    let _ = status;
    json!({
        "context": {
            "requestId": trace_id(),
            "requestType": "incoming.OIDC_Token",
            "userAgent": "",
            "url": "iam.emulator",
            "instanceId": "iam-emulator",
            "threadId": "1",
            "host": "iam-emulator",
            "startTime": now_rfc3339(),
            "endTime": now_rfc3339(),
            "elapsedTime": "0",
            "locale": "en_US",
            "clusterName": "iam-emulator",
        },
        "errorCode": code,
        "errorMessage": message,
    })
}

/// The route of a call: its operation name and the ids in its path.
fn route(method: &Method, path: &str) -> (String, Vec<String>) {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let m = method.clone();
    let ids = |idx: &[usize]| idx.iter().map(|&i| segs[i].to_string()).collect::<Vec<_>>();
    let (op, ids): (&str, Vec<String>) = match (m, segs.as_slice()) {
        (Method::POST, ["identity", "token"]) => ("iam.token", vec![]),
        (Method::GET, ["v2", "resource_groups"]) => {
            ("resource_manager.resource_groups.list", vec![])
        }
        (Method::GET, ["v1", "vpcs"]) => ("vpc.vpcs.list", vec![]),
        (Method::GET, ["v1", "vpcs", _]) => ("vpc.vpcs.get", ids(&[2])),
        (Method::GET, ["v1", "subnets"]) => ("vpc.subnets.list", vec![]),
        (Method::GET, ["v1", "subnets", _]) => ("vpc.subnets.get", ids(&[2])),
        (Method::GET, ["v1", "instances"]) => ("vpc.instances.list", vec![]),
        (Method::GET, ["v1", "instances", _]) => ("vpc.instances.get", ids(&[2])),
        (Method::GET, ["v1", "load_balancers"]) => ("vpc.load_balancers.list", vec![]),
        (Method::POST, ["v1", "load_balancers"]) => ("vpc.load_balancers.create", vec![]),
        (Method::GET, ["v1", "load_balancers", _]) => ("vpc.load_balancers.get", ids(&[2])),
        (Method::PATCH, ["v1", "load_balancers", _]) => ("vpc.load_balancers.update", ids(&[2])),
        (Method::DELETE, ["v1", "load_balancers", _]) => ("vpc.load_balancers.delete", ids(&[2])),
        (Method::GET, ["v1", "load_balancers", _, "listeners"]) => {
            ("vpc.load_balancer_listeners.list", ids(&[2]))
        }
        (Method::POST, ["v1", "load_balancers", _, "listeners"]) => {
            ("vpc.load_balancer_listeners.create", ids(&[2]))
        }
        (Method::GET, ["v1", "load_balancers", _, "listeners", _]) => {
            ("vpc.load_balancer_listeners.get", ids(&[2, 4]))
        }
        (Method::PATCH, ["v1", "load_balancers", _, "listeners", _]) => {
            ("vpc.load_balancer_listeners.update", ids(&[2, 4]))
        }
        (Method::DELETE, ["v1", "load_balancers", _, "listeners", _]) => {
            ("vpc.load_balancer_listeners.delete", ids(&[2, 4]))
        }
        (Method::GET, ["v1", "load_balancers", _, "pools"]) => {
            ("vpc.load_balancer_pools.list", ids(&[2]))
        }
        (Method::POST, ["v1", "load_balancers", _, "pools"]) => {
            ("vpc.load_balancer_pools.create", ids(&[2]))
        }
        (Method::GET, ["v1", "load_balancers", _, "pools", _]) => {
            ("vpc.load_balancer_pools.get", ids(&[2, 4]))
        }
        (Method::PATCH, ["v1", "load_balancers", _, "pools", _]) => {
            ("vpc.load_balancer_pools.update", ids(&[2, 4]))
        }
        (Method::DELETE, ["v1", "load_balancers", _, "pools", _]) => {
            ("vpc.load_balancer_pools.delete", ids(&[2, 4]))
        }
        (Method::GET, ["v1", "load_balancers", _, "pools", _, "members"]) => {
            ("vpc.load_balancer_pool_members.list", ids(&[2, 4]))
        }
        (Method::POST, ["v1", "load_balancers", _, "pools", _, "members"]) => {
            ("vpc.load_balancer_pool_members.create", ids(&[2, 4]))
        }
        (Method::PUT, ["v1", "load_balancers", _, "pools", _, "members"]) => {
            ("vpc.load_balancer_pool_members.replace", ids(&[2, 4]))
        }
        (Method::GET, ["v1", "load_balancers", _, "pools", _, "members", _]) => {
            ("vpc.load_balancer_pool_members.get", ids(&[2, 4, 6]))
        }
        (Method::PATCH, ["v1", "load_balancers", _, "pools", _, "members", _]) => {
            ("vpc.load_balancer_pool_members.update", ids(&[2, 4, 6]))
        }
        (Method::DELETE, ["v1", "load_balancers", _, "pools", _, "members", _]) => {
            ("vpc.load_balancer_pool_members.delete", ids(&[2, 4, 6]))
        }
        (Method::GET, ["v3", "tags"]) => ("tagging.tags.list", vec![]),
        (Method::POST, ["v3", "tags", "attach"]) => ("tagging.tags.attach", vec![]),
        (Method::POST, ["v3", "tags", "detach"]) => ("tagging.tags.detach", vec![]),
        (m, ["v1", ..]) => return (format!("vpc.unknown.{}", m.as_str().to_lowercase()), vec![]),
        (m, _) => return (format!("http.unknown.{}", m.as_str().to_lowercase()), vec![]),
    };
    (op.to_string(), ids)
}

#[derive(Debug, Clone)]
struct Vpc {
    id: String,
    name: String,
    created_at: String,
}

#[derive(Debug, Clone)]
struct SubnetR {
    id: String,
    name: String,
    zone: String,
    cidr: String,
    vpc: usize,
    created_at: String,
}

#[derive(Debug, Clone)]
struct Inst {
    w: Instance,
    id: String,
    subnet: usize,
    ip: String,
    created_at: String,
}

#[derive(Debug, Clone)]
struct Member {
    id: String,
    port: u64,
    address: String,
    weight: u64,
    op: Option<Operation>,
    created_at: String,
}

#[derive(Debug, Clone)]
struct Pool {
    id: String,
    name: String,
    algorithm: String,
    protocol: String,
    health_monitor: Value,
    proxy_protocol: String,
    session_persistence: Option<Value>,
    members: Vec<Member>,
    op: Option<Operation>,
    created_at: String,
}

#[derive(Debug, Clone)]
struct Listener {
    id: String,
    port: u64,
    protocol: String,
    default_pool: Option<String>,
    accept_proxy_protocol: bool,
    connection_limit: Option<u64>,
    op: Option<Operation>,
    created_at: String,
}

#[derive(Debug, Clone)]
struct Lb {
    id: String,
    name: String,
    is_public: bool,
    subnets: Vec<usize>,
    listeners: Vec<Listener>,
    pools: Vec<Pool>,
    op: Option<Operation>,
    created_at: String,
    private_ip: String,
    public_ip: Option<String>,
    /// Global Tagging user tags attached to its CRN (lower-cased).
    tags: std::collections::BTreeSet<String>,
    /// IBM's maintenance of the load balancer runs until then (`maintenance_pending`).
    maintenance_until: Option<tokio::time::Instant>,
}

#[derive(Debug, Default)]
struct State {
    vpcs: Vec<Vpc>,
    subnets: Vec<SubnetR>,
    instances: Vec<Inst>,
    lbs: Vec<Lb>,
    /// access token → expiry (UNIX seconds).
    tokens: BTreeMap<String, f64>,
    /// refresh token → API key it was issued for.
    refresh: BTreeMap<String, String>,
    tokens_issued: u64,
    seq: u64,
}

impl State {
    fn next_id(&mut self, kind: &str) -> String {
        self.seq += 1;
        format!("r006-{}", uuid(&format!("{kind}-{}-{}", self.seq, now_secs())))
    }
}

/// A status of a resource with an optional pending operation.
fn op_status(op: &Option<Operation>) -> &'static str {
    match op {
        Some(o) => ibm_status(o),
        None => "active",
    }
}

/// A delete that finished: the resource is gone. A failed delete leaves it (`failed`).
fn op_done_delete(op: &Option<Operation>) -> bool {
    matches!(op, Some(o) if o.action == Action::Delete && o.phase() == Phase::Done)
}

/// A load balancer's `provisioning_status`: `maintenance_pending` while IBM maintains it,
/// else that of its last operation (`failed` when it failed).
fn lb_status(lb: &Lb) -> &'static str {
    if lb.maintenance_until.is_some_and(|t| tokio::time::Instant::now() < t) {
        return "maintenance_pending";
    }
    op_status(&lb.op)
}

/// The IBM Cloud emulator (see the module doc). Start it with
/// `Server::start(IbmCloud::new(world, opts), ServerOptions::default())`.
pub struct IbmCloud {
    world: Mutex<World>,
    opts: Mutex<IbmOptions>,
    state: Mutex<State>,
    /// The load balancers' pending operations.
    pub ops: AsyncOps,
}

impl std::fmt::Debug for IbmCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IbmCloud").finish_non_exhaustive()
    }
}

impl IbmCloud {
    /// An emulator serving `world`.
    pub fn new(world: World, opts: IbmOptions) -> Arc<IbmCloud> {
        let cloud = IbmCloud {
            ops: {
                let ops = AsyncOps::new(opts.lb_pending);
                ops.set_realistic(REALISTIC);
                ops
            },
            world: Mutex::new(world),
            opts: Mutex::new(opts),
            state: Mutex::new(State::default()),
        };
        cloud.load();
        Arc::new(cloud)
    }

    /// The region.
    pub fn region(&self) -> String {
        let w = lock(&self.world);
        lock(&self.opts).region.clone().or_else(|| w.region.clone()).unwrap_or("us-south".into())
    }

    /// The account ID.
    pub fn account_id(&self) -> String {
        lock(&self.opts).account_id.clone()
    }

    /// The resource group's ID.
    pub fn resource_group_id(&self) -> String {
        let o = lock(&self.opts);
        format!(
            "{:032x}",
            (u128::from(fnv(&o.resource_group)) << 64) | u128::from(fnv(&o.account_id))
        )
    }

    /// The VPC instance ID of the world instance named `name`.
    pub fn instance_id(&self, name: &str) -> Option<String> {
        lock(&self.state).instances.iter().find(|i| i.w.name == name).map(|i| i.id.clone())
    }

    /// The ID of the subnet named `name`.
    pub fn subnet_id(&self, name: &str) -> Option<String> {
        lock(&self.state).subnets.iter().find(|s| s.name == name).map(|s| s.id.clone())
    }

    /// The ID of the VPC named `name`.
    pub fn vpc_id(&self, name: &str) -> Option<String> {
        lock(&self.state).vpcs.iter().find(|v| v.name == name).map(|v| v.id.clone())
    }

    /// Sets an instance's power state (`terminated` lists it as `deleting`). False when
    /// unknown.
    pub fn set_power(&self, name: &str, power: PowerState) -> bool {
        let mut st = lock(&self.state);
        match st.instances.iter_mut().find(|i| i.w.name == name) {
            Some(i) => {
                i.w.power = power;
                true
            }
            None => false,
        }
    }

    /// Deletes an instance (it is no longer listed; a get is a 404). False when unknown.
    pub fn delete_instance(&self, name: &str) -> bool {
        let mut st = lock(&self.state);
        let before = st.instances.len();
        st.instances.retain(|i| i.w.name != name);
        st.instances.len() != before
    }

    /// Adds an instance (its subnet, zone and IP as in a world file). Errors name what is
    /// wrong.
    pub fn add_instance(&self, inst: Instance) -> Result<String, String> {
        let mut st = lock(&self.state);
        if st.instances.iter().any(|i| i.w.name == inst.name) {
            return Err(format!("instance {:?} exists", inst.name));
        }
        let n = st.instances.len();
        let i = make_instance(&st.subnets, inst, n)?;
        let id = i.id.clone();
        st.instances.push(i);
        Ok(id)
    }

    /// Changes how long issued tokens live from now on (whole seconds, at least 1).
    pub fn set_token_lifetime(&self, d: Duration) {
        lock(&self.opts).token_lifetime = d;
    }

    /// Makes every token issued so far expired (the next call with one is a 401).
    pub fn expire_tokens(&self) {
        let mut st = lock(&self.state);
        for exp in st.tokens.values_mut() {
            *exp = 0.0;
        }
    }

    /// How many access tokens IAM issued since the start (or the last reset).
    pub fn tokens_issued(&self) -> u64 {
        lock(&self.state).tokens_issued
    }

    /// Changes how long load balancers stay pending after a change from now on.
    pub fn set_lb_pending(&self, d: Duration) {
        lock(&self.opts).lb_pending = d;
        self.ops.set_pending_for(d);
    }

    /// Puts a load balancer (by ID or name) under IBM's maintenance for `d`: it is
    /// `maintenance_pending` (still `online`) and refuses every change with a 409 until then;
    /// false when unknown.
    pub fn set_maintenance(&self, lb: &str, d: Duration) -> bool {
        let mut st = lock(&self.state);
        match st.lbs.iter_mut().find(|l| l.id == lb || l.name == lb) {
            Some(l) => {
                l.maintenance_until = Some(tokio::time::Instant::now() + d);
                true
            }
            None => false,
        }
    }

    /// Sets how many load balancers the region allows.
    pub fn set_lb_quota(&self, n: usize) {
        lock(&self.opts).lb_quota = n;
    }

    /// Completes every pending load-balancer change now (deletes take effect), so a test can
    /// use a long pending time, see the `*_pending` states and the 409s, then move on without
    /// waiting.
    pub fn complete_pending(&self) {
        let mut st = lock(&self.state);
        st.lbs.retain(|lb| !matches!(&lb.op, Some(o) if o.action == Action::Delete));
        for lb in &mut st.lbs {
            lb.op = None;
            lb.listeners.retain(|l| !matches!(&l.op, Some(o) if o.action == Action::Delete));
            lb.pools.retain(|p| !matches!(&p.op, Some(o) if o.action == Action::Delete));
            for l in &mut lb.listeners {
                l.op = None;
            }
            for p in &mut lb.pools {
                p.op = None;
                p.members.retain(|m| !matches!(&m.op, Some(o) if o.action == Action::Delete));
                for m in &mut p.members {
                    m.op = None;
                }
            }
        }
    }

    fn load(&self) {
        let world = lock(&self.world).clone();
        let opts = lock(&self.opts).clone();
        let created = now_rfc3339();
        let mut st = State::default();
        let nets: Vec<String> = if world.networks.is_empty() {
            vec![opts.vpc_name.clone()]
        } else {
            world.networks.iter().map(|n| n.name.clone()).collect()
        };
        for n in &nets {
            st.vpcs.push(Vpc {
                id: format!("r006-{}", uuid(&format!("vpc-{n}"))),
                name: n.clone(),
                created_at: created.clone(),
            });
        }
        if world.subnets.is_empty() {
            for (i, z) in world.zones().into_iter().enumerate() {
                let name = format!("subnet-{z}");
                st.subnets.push(SubnetR {
                    id: format!("0717-{}", uuid(&format!("subnet-{name}"))),
                    name,
                    zone: z,
                    cidr: format!("10.{}.0.0/24", 240 + i % 16),
                    vpc: 0,
                    created_at: created.clone(),
                });
            }
        } else {
            for (i, s) in world.subnets.iter().enumerate() {
                let vpc = s
                    .network
                    .as_ref()
                    .and_then(|n| st.vpcs.iter().position(|v| &v.name == n))
                    .unwrap_or(0);
                st.subnets.push(SubnetR {
                    id: format!("0717-{}", uuid(&format!("subnet-{}", s.name))),
                    name: s.name.clone(),
                    zone: s.zone.clone(),
                    cidr: s.cidr.clone().unwrap_or_else(|| format!("10.{}.0.0/24", 240 + i % 16)),
                    vpc,
                    created_at: created.clone(),
                });
            }
        }
        for (n, i) in world.instances.iter().enumerate() {
            match make_instance(&st.subnets, i.clone(), n) {
                Ok(inst) => st.instances.push(inst),
                Err(e) => {
                    tracing::warn!(instance = %i.name, error = %e, "IBM emulator skips instance")
                }
            }
        }
        // Tokens survive a reset: IAM is its own service, and a provider's cached token
        // stays valid as it would in IBM Cloud.
        let mut cur = lock(&self.state);
        st.tokens = std::mem::take(&mut cur.tokens);
        st.refresh = std::mem::take(&mut cur.refresh);
        st.tokens_issued = cur.tokens_issued;
        *cur = st;
        drop(cur);
        self.ops.set_pending_for(opts.lb_pending);
    }

    fn settle(st: &mut State) {
        st.lbs.retain(|lb| !op_done_delete(&lb.op));
        for lb in &mut st.lbs {
            lb.listeners.retain(|l| !op_done_delete(&l.op));
            lb.pools.retain(|p| !op_done_delete(&p.op));
            for p in &mut lb.pools {
                p.members.retain(|m| !op_done_delete(&m.op));
            }
        }
    }
}

/// The VPC (index) of a load balancer: that of its first subnet.
fn lb_vpc(st: &State, lb: &Lb) -> usize {
    lb.subnets.first().and_then(|&s| st.subnets.get(s)).map(|s| s.vpc).unwrap_or(0)
}

/// The VPC an address belongs to: that of an instance with the address, else that of a
/// subnet whose range holds it (None: neither; such an address is not refused).
fn address_vpc(st: &State, ip: std::net::Ipv4Addr) -> Option<usize> {
    let text = ip.to_string();
    if let Some(i) = st.instances.iter().find(|i| i.ip == text) {
        return st.subnets.get(i.subnet).map(|s| s.vpc);
    }
    st.subnets
        .iter()
        .find(|s| s.cidr.parse::<ipnet::Ipv4Net>().is_ok_and(|n| n.contains(&ip)))
        .map(|s| s.vpc)
}

/// 400: a pool member's target is not in the load balancer's VPC.
fn not_in_vpc(target: &str, lb_vpc: &str, other: &str) -> Resp {
    err(
        StatusCode::BAD_REQUEST,
        "load_balancer_pool_member_target_not_in_vpc",
        format!(
            "The member target '{target}' is in VPC '{other}', not in the load balancer's VPC '{lb_vpc}'."
        ),
    )
}

fn make_instance(subnets: &[SubnetR], w: Instance, n: usize) -> Result<Inst, String> {
    let subnet = match &w.subnet {
        Some(name) => subnets
            .iter()
            .position(|s| &s.name == name)
            .ok_or_else(|| format!("unknown subnet {name:?}"))?,
        None => subnets
            .iter()
            .position(|s| s.zone == w.zone)
            .or(if subnets.is_empty() { None } else { Some(0) })
            .ok_or_else(|| "no subnet".to_string())?,
    };
    let ip = match w.private_ips.first() {
        Some(ip) => ip.to_string(),
        None => format!("10.250.{}.{}", (n / 250) % 256, n % 250 + 4),
    };
    let id =
        w.id.clone().unwrap_or_else(|| format!("0717_{}", uuid(&format!("instance-{}", w.name))));
    Ok(Inst { w, id, subnet, ip, created_at: now_rfc3339() })
}

/// The request's context: base URL, region, account, resource group.
struct Ctx {
    base: String,
    region: String,
    account: String,
    rg_id: String,
    rg_name: String,
}

impl Ctx {
    fn href(&self, path: &str) -> String {
        format!("{}/v1/{path}", self.base)
    }

    fn crn(&self, kind: &str, id: &str) -> String {
        format!("crn:v1:bluemix:public:is:{}:a/{}::{kind}:{id}", self.region, self.account)
    }

    fn rg(&self) -> Value {
        json!({
            "id": self.rg_id,
            "href": format!("https://resource-controller.cloud.ibm.com/v2/resource_groups/{}", self.rg_id),
            "name": self.rg_name,
        })
    }

    fn zone(&self, z: &str) -> Value {
        json!({"name": z, "href": self.href(&format!("regions/{}/zones/{z}", self.region))})
    }

    fn vpc_ref(&self, v: &Vpc) -> Value {
        json!({
            "id": v.id, "crn": self.crn("vpc", &v.id), "href": self.href(&format!("vpcs/{}", v.id)),
            "name": v.name, "resource_type": "vpc",
        })
    }

    fn subnet_ref(&self, s: &SubnetR) -> Value {
        json!({
            "id": s.id, "crn": self.crn("subnet", &s.id),
            "href": self.href(&format!("subnets/{}", s.id)), "name": s.name,
            "resource_type": "subnet",
        })
    }

    fn vpc(&self, st: &State, v: &Vpc) -> Value {
        let acl = format!("r006-{}", uuid(&format!("acl-{}", v.id)));
        let sg = format!("r006-{}", uuid(&format!("sg-{}", v.id)));
        let rt = format!("r006-{}", uuid(&format!("rt-{}", v.id)));
        let _ = st;
        json!({
            "id": v.id, "crn": self.crn("vpc", &v.id), "href": self.href(&format!("vpcs/{}", v.id)),
            "name": v.name, "status": "available", "classic_access": false,
            "created_at": v.created_at, "resource_group": self.rg(), "cse_source_ips": [],
            "default_network_acl": {"id": acl, "crn": self.crn("network-acl", &acl),
                "href": self.href(&format!("network_acls/{acl}")), "name": format!("{}-acl", v.name)},
            "default_security_group": {"id": sg, "crn": self.crn("security-group", &sg),
                "href": self.href(&format!("security_groups/{sg}")), "name": format!("{}-sg", v.name)},
            "default_routing_table": {"id": rt, "href": self.href(&format!("vpcs/{}/routing_tables/{rt}", v.id)),
                "name": format!("{}-rt", v.name), "resource_type": "routing_table"},
        })
    }

    fn subnet(&self, st: &State, s: &SubnetR) -> Value {
        let v = &st.vpcs[s.vpc];
        let acl = format!("r006-{}", uuid(&format!("acl-{}", v.id)));
        let rt = format!("r006-{}", uuid(&format!("rt-{}", v.id)));
        json!({
            "id": s.id, "crn": self.crn("subnet", &s.id), "href": self.href(&format!("subnets/{}", s.id)),
            "name": s.name, "ipv4_cidr_block": s.cidr, "ip_version": "ipv4", "status": "available",
            "zone": self.zone(&s.zone), "vpc": self.vpc_ref(v), "created_at": s.created_at,
            "total_ipv4_address_count": 256, "available_ipv4_address_count": 248,
            "resource_group": self.rg(),
            "network_acl": {"id": acl, "crn": self.crn("network-acl", &acl),
                "href": self.href(&format!("network_acls/{acl}")), "name": format!("{}-acl", v.name)},
            "routing_table": {"id": rt, "href": self.href(&format!("vpcs/{}/routing_tables/{rt}", v.id)),
                "name": format!("{}-rt", v.name), "resource_type": "routing_table"},
        })
    }

    fn instance(&self, st: &State, i: &Inst) -> Value {
        let s = &st.subnets[i.subnet];
        let v = &st.vpcs[s.vpc];
        let nic = format!("0717-{}", uuid(&format!("nic-{}", i.id)));
        let rip = format!("0717-{}", uuid(&format!("rip-{}", i.id)));
        let profile = i.w.instance_type.clone().unwrap_or_else(|| "bx2-4x16".into());
        let status = match i.w.power {
            PowerState::Running => "running",
            PowerState::Stopped => "stopped",
            PowerState::Terminated => "deleting",
        };
        let href = self.href(&format!("instances/{}", i.id));
        let nic_ref = json!({
            "id": nic, "href": format!("{href}/network_interfaces/{nic}"), "name": "eth0",
            "resource_type": "network_interface",
            "primary_ip": {"address": i.ip, "id": rip, "name": format!("{}-ip", i.w.name),
                "href": self.href(&format!("subnets/{}/reserved_ips/{rip}", s.id)),
                "resource_type": "subnet_reserved_ip"},
            "subnet": self.subnet_ref(s),
        });
        json!({
            "id": i.id, "crn": self.crn("instance", &i.id), "href": href, "name": i.w.name,
            "status": status, "status_reasons": [], "created_at": i.created_at,
            "zone": self.zone(&i.w.zone),
            "profile": {"name": profile, "href": self.href(&format!("instance/profiles/{profile}"))},
            "vpc": self.vpc_ref(v), "resource_group": self.rg(),
            "primary_network_interface": nic_ref.clone(), "network_interfaces": [nic_ref],
            "memory": 16, "bandwidth": 8000, "vcpu": {"architecture": "amd64", "count": 4},
            "volume_attachments": [], "disks": [], "startable": true,
        })
    }

    fn lb_href(&self, lb: &Lb) -> String {
        self.href(&format!("load_balancers/{}", lb.id))
    }

    fn listener(&self, lb: &Lb, l: &Listener) -> Value {
        let mut v = json!({
            "id": l.id, "href": format!("{}/listeners/{}", self.lb_href(lb), l.id),
            "port": l.port, "port_min": l.port, "port_max": l.port, "protocol": l.protocol,
            "accept_proxy_protocol": l.accept_proxy_protocol,
            "provisioning_status": op_status(&l.op), "created_at": l.created_at,
        });
        if let Some(c) = l.connection_limit {
            v["connection_limit"] = json!(c);
        }
        if let Some(p) =
            l.default_pool.as_ref().and_then(|id| lb.pools.iter().find(|p| &p.id == id))
        {
            v["default_pool"] = self.pool_ref(lb, p);
        }
        v
    }

    fn pool_ref(&self, lb: &Lb, p: &Pool) -> Value {
        json!({"id": p.id, "href": format!("{}/pools/{}", self.lb_href(lb), p.id), "name": p.name})
    }

    fn member(&self, lb: &Lb, p: &Pool, m: &Member) -> Value {
        json!({
            "id": m.id, "href": format!("{}/pools/{}/members/{}", self.lb_href(lb), p.id, m.id),
            "port": m.port, "weight": m.weight, "target": {"address": m.address},
            "health": if lb.op.is_none() && m.op.is_none() { "ok" } else { "unknown" },
            "provisioning_status": op_status(&m.op), "created_at": m.created_at,
        })
    }

    fn pool(&self, lb: &Lb, p: &Pool) -> Value {
        let members: Vec<Value> = p
            .members
            .iter()
            .map(|m| {
                json!({"id": m.id,
                    "href": format!("{}/pools/{}/members/{}", self.lb_href(lb), p.id, m.id)})
            })
            .collect();
        let mut v = json!({
            "id": p.id, "href": format!("{}/pools/{}", self.lb_href(lb), p.id), "name": p.name,
            "algorithm": p.algorithm, "protocol": p.protocol, "health_monitor": p.health_monitor,
            "proxy_protocol": p.proxy_protocol, "members": members,
            "provisioning_status": op_status(&p.op), "created_at": p.created_at,
        });
        if let Some(sp) = &p.session_persistence {
            v["session_persistence"] = sp.clone();
        }
        v
    }

    fn lb(&self, st: &State, lb: &Lb) -> Value {
        let status = lb_status(lb);
        let short = lb.id.trim_start_matches("r006-").chars().take(8).collect::<String>();
        json!({
            "id": lb.id, "crn": self.crn("load-balancer", &lb.id), "href": self.lb_href(lb),
            "name": lb.name, "is_public": lb.is_public, "created_at": lb.created_at,
            "hostname": format!("{short}-{}.lb.appdomain.cloud", self.region),
            "provisioning_status": status,
            "operating_status": if matches!(status, "create_pending" | "failed") { "offline" } else { "online" },
            "listeners": lb.listeners.iter().map(|l| json!({"id": l.id,
                "href": format!("{}/listeners/{}", self.lb_href(lb), l.id)})).collect::<Vec<_>>(),
            "pools": lb.pools.iter().map(|p| self.pool_ref(lb, p)).collect::<Vec<_>>(),
            "subnets": lb.subnets.iter().map(|&s| self.subnet_ref(&st.subnets[s])).collect::<Vec<_>>(),
            "private_ips": [{"address": lb.private_ip}],
            "public_ips": lb.public_ip.iter().map(|a| json!({"address": a})).collect::<Vec<_>>(),
            "profile": {"family": "application", "name": "dynamic",
                "href": self.href("load_balancer/profiles/dynamic")},
            "resource_group": self.rg(), "resource_type": "load_balancer",
            "route_mode": false, "security_groups": [], "security_groups_supported": false,
            "udp_supported": false,
            "logging": {"datapath": {"active": false}},
        })
    }
}

/// Pages `items` (id, JSON) by `start`/`limit` as VPC does.
fn page(q: &Query, ctx: &Ctx, path: &str, key: &str, items: Vec<(String, Value)>) -> Res<Value> {
    page_with(q, ctx, path, key, items, |v| v)
}

/// [`page`] of items rendered as JSON only when they are on the page: a listing of 10 000
/// instances rendered all of them for each page of 100 (ci/bench #35: a listing outlasted
/// the manager's 60 s lookup deadline on the emulator).
fn page_with<V>(
    q: &Query,
    ctx: &Ctx,
    path: &str,
    key: &str,
    items: Vec<(String, V)>,
    mut render: impl FnMut(V) -> Value,
) -> Res<Value> {
    let limit = match q.get("limit") {
        None => 50,
        Some(s) => match s.parse::<usize>() {
            Ok(n) if (1..=100).contains(&n) => n,
            _ => return Err(bad(format!("limit must be an integer from 1 to 100, got {s:?}"))),
        },
    };
    let from = match q.get("start") {
        None => 0,
        Some(tok) => match items.iter().position(|(id, _)| id == tok) {
            Some(i) => i,
            None => return Err(bad("the start token is not valid for this collection")),
        },
    };
    let total = items.len();
    let filters: String =
        q.0.iter()
            .filter(|(k, _)| !matches!(k.as_str(), "start" | "limit" | "version" | "generation"))
            .map(|(k, v)| {
                format!(
                    "&{}={}",
                    url::form_urlencoded::byte_serialize(k.as_bytes()).collect::<String>(),
                    url::form_urlencoded::byte_serialize(v.as_bytes()).collect::<String>()
                )
            })
            .collect();
    let next_id = items.get(from + limit).map(|(id, _)| id.clone());
    let page: Vec<Value> =
        items.into_iter().skip(from).take(limit).map(|(_, v)| render(v)).collect();
    let mut out = json!({
        key: page,
        "first": {"href": format!("{}?limit={limit}{filters}", ctx.href(path))},
        "limit": limit,
        "total_count": total,
    });
    if let Some(id) = next_id {
        out["next"] =
            json!({"href": format!("{}?start={id}&limit={limit}{filters}", ctx.href(path))});
    }
    Ok(out)
}

fn body_json(req: &Request<Bytes>) -> Res<Value> {
    if req.body().is_empty() {
        return Ok(json!({}));
    }
    match serde_json::from_slice::<Value>(req.body()) {
        Ok(v @ Value::Object(_)) => Ok(v),
        Ok(_) => Err(bad("the request body must be a JSON object")),
        Err(e) => Err(bad(format!("the request body is not valid JSON: {e}"))),
    }
}

fn req_str<'a>(v: &'a Value, key: &str, what: &str) -> Res<&'a str> {
    v.get(key).and_then(Value::as_str).ok_or_else(|| {
        err(
            StatusCode::BAD_REQUEST,
            "validation_required_field_missing",
            format!("{what}: {key} is required"),
        )
    })
}

fn one_of(v: &str, allowed: &[&str], what: &str) -> Res<()> {
    if allowed.contains(&v) {
        Ok(())
    } else {
        Err(bad(format!("{what} must be one of {}, got {v:?}", allowed.join(", "))))
    }
}

fn port_of(v: &Value, key: &str, what: &str, required: bool) -> Res<Option<u64>> {
    match v.get(key) {
        None | Some(Value::Null) if !required => Ok(None),
        None | Some(Value::Null) => Err(err(
            StatusCode::BAD_REQUEST,
            "validation_required_field_missing",
            format!("{what}: {key} is required"),
        )),
        Some(p) => match p.as_u64() {
            Some(n) if (1..=65535).contains(&n) => Ok(Some(n)),
            _ => Err(bad(format!("{what}: {key} must be a port from 1 to 65535"))),
        },
    }
}

fn health_monitor(v: &Value) -> Res<Value> {
    let what = "health_monitor";
    let num = |k: &str, lo: u64, hi: u64| -> Res<u64> {
        match v.get(k).and_then(Value::as_u64) {
            Some(n) if (lo..=hi).contains(&n) => Ok(n),
            Some(_) => Err(bad(format!("{what}.{k} must be from {lo} to {hi}"))),
            None => Err(err(
                StatusCode::BAD_REQUEST,
                "validation_required_field_missing",
                format!("{what}.{k} is required"),
            )),
        }
    };
    let delay = num("delay", 2, 60)?;
    let max_retries = num("max_retries", 1, 10)?;
    let timeout = num("timeout", 1, 59)?;
    if timeout >= delay {
        return Err(bad(format!("{what}.timeout ({timeout}) must be less than delay ({delay})")));
    }
    let ty = req_str(v, "type", what)?;
    one_of(ty, &["http", "https", "tcp"], "health_monitor.type")?;
    let mut out =
        json!({"delay": delay, "max_retries": max_retries, "timeout": timeout, "type": ty});
    if let Some(p) = port_of(v, "port", what, false)? {
        out["port"] = json!(p);
    }
    match v.get("url_path") {
        Some(Value::String(p)) if ty != "tcp" => {
            if !p.starts_with('/') {
                return Err(bad("health_monitor.url_path must start with /"));
            }
            out["url_path"] = json!(p);
        }
        Some(Value::String(_)) => {}
        _ if ty != "tcp" => out["url_path"] = json!("/"),
        _ => {}
    }
    Ok(out)
}

/// JSON merge patch (RFC 7386) of `patch` onto `target`.
fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl IbmCloud {
    fn ctx(&self, req: &Request<Bytes>) -> Ctx {
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("127.0.0.1")
            .to_string();
        let o = lock(&self.opts).clone();
        Ctx {
            base: format!("http://{host}"),
            region: self.region(),
            account: o.account_id,
            rg_id: self.resource_group_id(),
            rg_name: o.resource_group,
        }
    }

    fn iam_token(&self, req: &Request<Bytes>) -> Resp {
        let form: BTreeMap<String, String> = url::form_urlencoded::parse(req.body())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let iam_err = |status: StatusCode, code: &str, msg: &str| {
            reply(status, &iam_error(status, code, msg))
        };
        let key = match form.get("grant_type").map(String::as_str) {
            Some("urn:ibm:params:oauth:grant-type:apikey") => match form.get("apikey") {
                Some(k) if !k.is_empty() => k.clone(),
                _ => {
                    return iam_err(
                        StatusCode::BAD_REQUEST,
                        "BXNIM0109E",
                        "Property missing or empty.",
                    );
                }
            },
            Some("refresh_token") => {
                let tok = form.get("refresh_token").cloned().unwrap_or_default();
                match lock(&self.state).refresh.get(&tok) {
                    Some(k) => k.clone(),
                    None => {
                        return iam_err(
                            StatusCode::BAD_REQUEST,
                            "BXNIM0407E",
                            "The refresh token is not valid.",
                        );
                    }
                }
            }
            _ => {
                return iam_err(StatusCode::BAD_REQUEST, "BXNIM0102E", "Unsupported grant type.");
            }
        };
        let opts = lock(&self.opts).clone();
        if !opts.api_keys.contains(&key) {
            return iam_err(
                StatusCode::BAD_REQUEST,
                "BXNIM0415E",
                "Provided API key could not be found.",
            );
        }
        let lifetime = opts.token_lifetime.as_secs().max(1);
        let iat = now_secs().floor() as u64;
        let exp = iat + lifetime;
        let mut st = lock(&self.state);
        st.tokens_issued += 1;
        let n = st.tokens_issued;
        let header = b64url(br#"{"kid":"emulator-1","alg":"RS256"}"#);
        let claims = json!({
            "iam_id": format!("iam-ServiceId-{}", uuid(&key)),
            "id": format!("iam-ServiceId-{}", uuid(&key)),
            "realmid": "iam", "jti": uuid(&format!("jti-{n}-{iat}")),
            "identifier": format!("ServiceId-{}", uuid(&key)),
            "sub": format!("ServiceId-{}", uuid(&key)), "sub_type": "ServiceId",
            "account": {"valid": true, "bss": opts.account_id},
            "iat": iat, "exp": exp, "iss": "https://iam.cloud.ibm.com/identity",
            "grant_type": "urn:ibm:params:oauth:grant-type:apikey",
            "scope": "ibm openid", "client_id": "default", "acr": 1, "amr": ["pwd"],
        });
        let payload = b64url(claims.to_string().as_bytes());
        let sig = b64url(uuid(&format!("sig-{n}-{iat}")).as_bytes());
        let access = format!("{header}.{payload}.{sig}");
        let refresh = format!("emulator-refresh-{}", uuid(&format!("refresh-{n}-{iat}")));
        st.tokens.insert(access.clone(), exp as f64);
        st.refresh.insert(refresh.clone(), key);
        // Forget long-expired tokens so a long run does not grow without bound.
        let now = now_secs();
        st.tokens.retain(|_, e| *e == 0.0 || *e > now - 3600.0);
        drop(st);
        reply(
            StatusCode::OK,
            &json!({
                "access_token": access,
                "refresh_token": refresh,
                "ims_user_id": 0,
                "token_type": "Bearer",
                "expires_in": lifetime,
                "expiration": exp,
                "scope": "ibm openid",
            }),
        )
    }

    fn authorize(&self, req: &Request<Bytes>) -> Res<()> {
        let token = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|h| h.to_str().ok())
            .and_then(|h| h.strip_prefix("Bearer ").or_else(|| h.strip_prefix("bearer ")))
            .map(str::trim);
        let Some(token) = token else {
            return Err(err(
                StatusCode::UNAUTHORIZED,
                "not_authorized",
                "The request does not carry an Authorization: Bearer token.",
            ));
        };
        match lock(&self.state).tokens.get(token) {
            None => Err(err(
                StatusCode::UNAUTHORIZED,
                "not_authorized",
                "The bearer token was not issued by IAM.",
            )),
            Some(&exp) if now_secs() >= exp => {
                Err(err(StatusCode::UNAUTHORIZED, "not_authorized", "The bearer token is expired."))
            }
            Some(_) => Ok(()),
        }
    }

    fn check_version(q: &Query) -> Res<()> {
        let Some(v) = q.get("version") else {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "missing_version",
                "The version query parameter is required (YYYY-MM-DD).",
            ));
        };
        let b = v.as_bytes();
        let ok = b.len() == 10
            && b.iter()
                .enumerate()
                .all(|(i, c)| if i == 4 || i == 7 { *c == b'-' } else { c.is_ascii_digit() })
            && v >= "2019-01-01";
        if !ok {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "invalid_version",
                format!(
                    "The version query parameter must be a date from 2019-01-01 as YYYY-MM-DD, got {v:?}."
                ),
            ));
        }
        match q.get("generation") {
            Some("2") => Ok(()),
            Some(g) => Err(err(
                StatusCode::BAD_REQUEST,
                "invalid_generation",
                format!("The generation query parameter must be 2, got {g:?}."),
            )),
            None => Err(err(
                StatusCode::BAD_REQUEST,
                "missing_generation",
                "The generation query parameter is required (2).",
            )),
        }
    }

    fn handle(&self, op: &str, ids: &[String], req: &Request<Bytes>) -> Resp {
        if op == "iam.token" {
            return self.iam_token(req);
        }
        if let Err(r) = self.authorize(req) {
            return r;
        }
        let q = Query::parse(req.uri().query());
        let ctx = self.ctx(req);
        if op == "resource_manager.resource_groups.list" {
            let o = lock(&self.opts).clone();
            let matches = q.get("name").is_none_or(|n| n == o.resource_group)
                && q.get("account_id").is_none_or(|a| a == o.account_id);
            let list: Vec<Value> = if matches {
                vec![json!({
                    "id": ctx.rg_id, "name": o.resource_group, "account_id": o.account_id,
                    "crn": format!("crn:v1:bluemix:public:resource-controller::a/{}::resource-group:{}", o.account_id, ctx.rg_id),
                    "state": "ACTIVE", "default": true, "enable_reclamation": false,
                    "quota_id": "a3d7b8d01e261c24677937c29ab33f3c",
                    "quota_url": "/v2/quota_definitions/a3d7b8d01e261c24677937c29ab33f3c",
                    "payment_methods_url": format!("/v2/resource_groups/{}/payment_methods", ctx.rg_id),
                    "resource_linkages": [], "teams_url": format!("/v2/resource_groups/{}/teams", ctx.rg_id),
                    "created_at": "2024-01-01T00:00:00.000Z", "updated_at": "2024-01-01T00:00:00.000Z",
                })]
            } else {
                vec![]
            };
            return reply(StatusCode::OK, &json!({ "resources": list }));
        }
        if op.starts_with("tagging.") {
            return self.tagging(op, &q, &ctx, req).unwrap_or_else(|e| e);
        }
        if !req.uri().path().starts_with("/v1/") {
            return err(
                StatusCode::NOT_FOUND,
                "not_found",
                "The requested resource cannot be found.",
            );
        }
        if let Err(r) = Self::check_version(&q) {
            return r;
        }
        let mut st = lock(&self.state);
        Self::settle(&mut st);
        let result = match op {
            "vpc.vpcs.list" => {
                let items =
                    st.vpcs.iter().map(|v| (v.id.clone(), ctx.vpc(&st, v))).collect::<Vec<_>>();
                page(&q, &ctx, "vpcs", "vpcs", items).map(|v| reply(StatusCode::OK, &v))
            }
            "vpc.vpcs.get" => match st.vpcs.iter().find(|v| v.id == ids[0]) {
                Some(v) => Ok(reply(StatusCode::OK, &ctx.vpc(&st, v))),
                None => Err(not_found("VPC", &ids[0])),
            },
            "vpc.subnets.list" => {
                let items = st
                    .subnets
                    .iter()
                    .filter(|_| q.get("resource_group.id").is_none_or(|r| r == ctx.rg_id))
                    .map(|s| (s.id.clone(), ctx.subnet(&st, s)))
                    .collect::<Vec<_>>();
                page(&q, &ctx, "subnets", "subnets", items).map(|v| reply(StatusCode::OK, &v))
            }
            "vpc.subnets.get" => match st.subnets.iter().find(|s| s.id == ids[0]) {
                Some(s) => Ok(reply(StatusCode::OK, &ctx.subnet(&st, s))),
                None => Err(not_found("Subnet", &ids[0])),
            },
            "vpc.instances.list" => {
                let items = st
                    .instances
                    .iter()
                    .filter(|i| {
                        let v = &st.vpcs[st.subnets[i.subnet].vpc];
                        q.get("name").is_none_or(|n| n == i.w.name)
                            && q.get("vpc.name").is_none_or(|n| n == v.name)
                            && q.get("vpc.id").is_none_or(|n| n == v.id)
                            && q.get("resource_group.id").is_none_or(|r| r == ctx.rg_id)
                    })
                    .map(|i| (i.id.clone(), i))
                    .collect::<Vec<_>>();
                page_with(&q, &ctx, "instances", "instances", items, |i| ctx.instance(&st, i))
                    .map(|v| reply(StatusCode::OK, &v))
            }
            "vpc.instances.get" => match st.instances.iter().find(|i| i.id == ids[0]) {
                Some(i) => Ok(reply(StatusCode::OK, &ctx.instance(&st, i))),
                None => Err(not_found("Instance", &ids[0])),
            },
            _ => self.lb_ops(&mut st, &ctx, &q, op, ids, req),
        };
        result.unwrap_or_else(|e| e)
    }

    fn lb_index(st: &State, id: &str) -> Res<usize> {
        st.lbs.iter().position(|l| l.id == id).ok_or_else(|| not_found("Load balancer", id))
    }

    /// 409 unless the load balancer is `active`.
    fn require_active(lb: &Lb) -> Res<()> {
        let status = lb_status(lb);
        if status == "active" {
            Ok(())
        } else {
            Err(err(
                StatusCode::CONFLICT,
                "load_balancer_update_conflict",
                format!(
                    "The load balancer with ID '{}' cannot be updated because its status is '{}'.",
                    lb.id,
                    status.to_uppercase()
                ),
            ))
        }
    }

    fn parse_pool(&self, st: &mut State, v: &Value, lb: &Lb) -> Res<Pool> {
        let algorithm = req_str(v, "algorithm", "pool")?.to_string();
        one_of(
            &algorithm,
            &["round_robin", "weighted_round_robin", "least_connections"],
            "pool.algorithm",
        )?;
        let protocol = req_str(v, "protocol", "pool")?.to_string();
        one_of(&protocol, &["tcp", "http", "https", "udp"], "pool.protocol")?;
        let hm = v.get("health_monitor").ok_or_else(|| {
            err(
                StatusCode::BAD_REQUEST,
                "validation_required_field_missing",
                "pool: health_monitor is required",
            )
        })?;
        let health_monitor = health_monitor(hm)?;
        let proxy_protocol =
            v.get("proxy_protocol").and_then(Value::as_str).unwrap_or("disabled").to_string();
        one_of(&proxy_protocol, &["disabled", "v1", "v2"], "pool.proxy_protocol")?;
        let session_persistence = match v.get("session_persistence") {
            None | Some(Value::Null) => None,
            Some(sp) => {
                let t = req_str(sp, "type", "session_persistence")?;
                one_of(t, &["source_ip", "app_cookie", "http_cookie"], "session_persistence.type")?;
                Some(sp.clone())
            }
        };
        let id = st.next_id("pool");
        let name = match v.get("name").and_then(Value::as_str) {
            Some(n) => n.to_string(),
            None => format!("pool-{}", &id[5..13]),
        };
        if lb.pools.iter().any(|p| p.name == name) {
            return Err(err(
                StatusCode::CONFLICT,
                "load_balancer_pool_duplicate_name",
                format!("A pool named '{name}' already exists in load balancer '{}'.", lb.id),
            ));
        }
        let mut pool = Pool {
            id,
            name,
            algorithm,
            protocol,
            health_monitor,
            proxy_protocol,
            session_persistence,
            members: Vec::new(),
            op: None,
            created_at: now_rfc3339(),
        };
        if let Some(ms) = v.get("members") {
            let ms = ms.as_array().ok_or_else(|| bad("pool.members must be an array"))?;
            let vpc = lb_vpc(st, lb);
            for m in ms {
                let member = self.parse_member(st, m, vpc)?;
                pool.members.push(member);
            }
        }
        Ok(pool)
    }

    fn parse_member(&self, st: &mut State, v: &Value, vpc: usize) -> Res<Member> {
        let port = port_of(v, "port", "member", true)?.unwrap_or_default();
        let target = v.get("target").ok_or_else(|| {
            err(
                StatusCode::BAD_REQUEST,
                "validation_required_field_missing",
                "member: target is required",
            )
        })?;
        let address = if let Some(a) = target.get("address").and_then(Value::as_str) {
            let Ok(ip) = a.parse::<std::net::Ipv4Addr>() else {
                return Err(bad(format!(
                    "member.target.address must be an IPv4 address, got {a:?}"
                )));
            };
            if let Some(other) = address_vpc(st, ip).filter(|o| *o != vpc) {
                return Err(not_in_vpc(a, &st.vpcs[vpc].name, &st.vpcs[other].name));
            }
            a.to_string()
        } else if let Some(id) = target.get("id").and_then(Value::as_str) {
            match st.instances.iter().find(|i| i.id == id) {
                Some(i) if st.subnets[i.subnet].vpc != vpc => {
                    let other = st.subnets[i.subnet].vpc;
                    return Err(not_in_vpc(id, &st.vpcs[vpc].name, &st.vpcs[other].name));
                }
                Some(i) => i.ip.clone(),
                None => return Err(not_found("Instance", id)),
            }
        } else {
            return Err(bad("member.target needs an address or an instance id"));
        };
        let weight = match v.get("weight") {
            None | Some(Value::Null) => 50,
            Some(w) => match w.as_u64() {
                Some(n) if n <= 100 => n,
                _ => return Err(bad("member.weight must be from 0 to 100")),
            },
        };
        Ok(Member {
            id: st.next_id("member"),
            port,
            address,
            weight,
            op: None,
            created_at: now_rfc3339(),
        })
    }

    fn parse_listener(v: &Value, lb: &Lb, id: String, inline_pools: &[Pool]) -> Res<Listener> {
        let port = port_of(v, "port", "listener", true)?.unwrap_or_default();
        let protocol = req_str(v, "protocol", "listener")?.to_string();
        one_of(&protocol, &["tcp", "http", "https", "udp"], "listener.protocol")?;
        if lb.listeners.iter().any(|l| l.port == port) {
            return Err(err(
                StatusCode::CONFLICT,
                "load_balancer_listener_duplicate_port",
                format!("A listener on port {port} already exists in load balancer '{}'.", lb.id),
            ));
        }
        let default_pool = match v.get("default_pool") {
            None | Some(Value::Null) => None,
            Some(p) => {
                let pools = lb.pools.iter().chain(inline_pools);
                let found = if let Some(id) = p.get("id").and_then(Value::as_str) {
                    pools.clone().find(|x| x.id == id)
                } else if let Some(name) = p.get("name").and_then(Value::as_str) {
                    pools.clone().find(|x| x.name == name)
                } else if let Some(href) = p.get("href").and_then(Value::as_str) {
                    pools.clone().find(|x| href.ends_with(&x.id))
                } else {
                    return Err(bad("listener.default_pool needs an id, href or name"));
                };
                match found {
                    Some(pool) => Some(pool.id.clone()),
                    None => return Err(not_found("Pool", &p.to_string())),
                }
            }
        };
        Ok(Listener {
            id,
            port,
            protocol,
            default_pool,
            accept_proxy_protocol: v
                .get("accept_proxy_protocol")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            connection_limit: v.get("connection_limit").and_then(Value::as_u64),
            op: None,
            created_at: now_rfc3339(),
        })
    }

    fn create_lb(&self, st: &mut State, ctx: &Ctx, req: &Request<Bytes>) -> Res<Resp> {
        let v = body_json(req)?;
        let is_public = v.get("is_public").and_then(Value::as_bool).ok_or_else(|| {
            err(
                StatusCode::BAD_REQUEST,
                "validation_required_field_missing",
                "load balancer: is_public is required",
            )
        })?;
        let subnets =
            v.get("subnets").and_then(Value::as_array).filter(|a| !a.is_empty()).ok_or_else(
                || {
                    err(
                        StatusCode::BAD_REQUEST,
                        "validation_required_field_missing",
                        "load balancer: subnets is required",
                    )
                },
            )?;
        let mut sidx = Vec::new();
        for s in subnets {
            let found = if let Some(id) = s.get("id").and_then(Value::as_str) {
                st.subnets.iter().position(|x| x.id == id)
            } else if let Some(crn) = s.get("crn").and_then(Value::as_str) {
                st.subnets.iter().position(|x| crn.ends_with(&x.id))
            } else if let Some(href) = s.get("href").and_then(Value::as_str) {
                st.subnets.iter().position(|x| href.ends_with(&x.id))
            } else {
                return Err(bad("load balancer: each subnet needs an id, crn or href"));
            };
            match found {
                Some(i) => sidx.push(i),
                None => return Err(not_found("Subnet", &s.to_string())),
            }
        }
        let id = st.next_id("lb");
        let name = match v.get("name").and_then(Value::as_str) {
            Some(n) => {
                let valid = !n.is_empty()
                    && n.len() <= 63
                    && n.bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == b'-')
                    && n.as_bytes()[0].is_ascii_lowercase()
                    && !n.ends_with('-');
                if !valid {
                    return Err(bad(format!(
                        "load balancer name {n:?} must be 1-63 lowercase letters, digits and dashes, starting with a letter"
                    )));
                }
                n.to_string()
            }
            None => format!("lb-{}", &id[5..13]),
        };
        if st.lbs.iter().any(|l| l.name == name) {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "validation_unique_failed",
                format!("Provided Name ({name}) is not unique"),
            ));
        }
        if let Some(rg) = v.get("resource_group").and_then(|r| r.get("id")).and_then(Value::as_str)
            && rg != ctx.rg_id
        {
            return Err(not_found("Resource group", rg));
        }
        let quota = lock(&self.opts).lb_quota;
        if st.lbs.len() >= quota {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "over_quota",
                format!(
                    "Load balancer quota exceeded: the region allows {quota} load balancers and has {}.",
                    st.lbs.len()
                ),
            ));
        }
        let n = st.lbs.len() as u64 + st.seq;
        let subnet0 = &st.subnets[sidx[0]];
        let private_ip =
            match subnet0.cidr.split('/').next().and_then(|a| a.parse::<std::net::Ipv4Addr>().ok())
            {
                Some(a) => {
                    let o = a.octets();
                    format!("{}.{}.{}.{}", o[0], o[1], o[2], 200 + n % 50)
                }
                None => format!("10.255.0.{}", 200 + n % 50),
            };
        let mut lb = Lb {
            id,
            name,
            is_public,
            subnets: sidx,
            listeners: Vec::new(),
            pools: Vec::new(),
            op: None,
            created_at: now_rfc3339(),
            private_ip,
            public_ip: is_public.then(|| format!("203.0.113.{}", 10 + n % 240)),
            tags: Default::default(),
            maintenance_until: None,
        };
        if let Some(pools) = v.get("pools") {
            let pools =
                pools.as_array().ok_or_else(|| bad("load balancer: pools must be an array"))?;
            for p in pools {
                let pool = self.parse_pool(st, p, &lb)?;
                lb.pools.push(pool);
            }
        }
        let opts = lock(&self.opts).clone();
        if lb.pools.len() > opts.pool_quota {
            return Err(over_quota("Pools per load balancer", opts.pool_quota, lb.pools.len()));
        }
        if let Some(p) = lb.pools.iter().find(|p| p.members.len() > opts.member_quota) {
            return Err(over_quota("Members per pool", opts.member_quota, p.members.len()));
        }
        if let Some(ls) = v.get("listeners") {
            let ls =
                ls.as_array().ok_or_else(|| bad("load balancer: listeners must be an array"))?;
            if ls.len() > opts.listener_quota {
                return Err(over_quota(
                    "Listeners per load balancer",
                    opts.listener_quota,
                    ls.len(),
                ));
            }
            for l in ls {
                let lid = st.next_id("listener");
                let listener = Self::parse_listener(l, &lb, lid, &[])?;
                lb.listeners.push(listener);
            }
        }
        lb.op = Some(self.ops.start(format!("load_balancers/{}", lb.id), Action::Create));
        let out = ctx.lb(st, &lb);
        st.lbs.push(lb);
        Ok(reply(StatusCode::CREATED, &out))
    }

    /// Marks `lb` changed: `update_pending` for the configured time.
    fn touch(&self, lb: &mut Lb) {
        lb.op = Some(self.ops.start(format!("load_balancers/{}", lb.id), Action::Update));
    }

    fn lb_ops(
        &self,
        st: &mut State,
        ctx: &Ctx,
        q: &Query,
        op: &str,
        ids: &[String],
        req: &Request<Bytes>,
    ) -> Res<Resp> {
        match op {
            "vpc.load_balancers.list" => {
                let items =
                    st.lbs.iter().map(|l| (l.id.clone(), ctx.lb(st, l))).collect::<Vec<_>>();
                return page(q, ctx, "load_balancers", "load_balancers", items)
                    .map(|v| reply(StatusCode::OK, &v));
            }
            "vpc.load_balancers.create" => return self.create_lb(st, ctx, req),
            _ => {}
        }
        let Some(lb_id) = ids.first() else {
            return Err(err(
                StatusCode::NOT_FOUND,
                "not_found",
                "The requested resource cannot be found.",
            ));
        };
        let li = Self::lb_index(st, lb_id)?;
        match op {
            "vpc.load_balancers.get" => Ok(reply(StatusCode::OK, &ctx.lb(st, &st.lbs[li]))),
            "vpc.load_balancers.update" => {
                Self::require_active(&st.lbs[li])?;
                let v = body_json(req)?;
                if let Some(n) = v.get("name").and_then(Value::as_str) {
                    if st.lbs.iter().any(|l| l.name == n && l.id != *lb_id) {
                        return Err(err(
                            StatusCode::BAD_REQUEST,
                            "validation_unique_failed",
                            format!("Provided Name ({n}) is not unique"),
                        ));
                    }
                    st.lbs[li].name = n.to_string();
                }
                self.touch(&mut st.lbs[li]);
                Ok(reply(StatusCode::OK, &ctx.lb(st, &st.lbs[li])))
            }
            "vpc.load_balancers.delete" => {
                // A `failed` load balancer can be deleted (IBM's way out of it).
                if lb_status(&st.lbs[li]) != "failed" {
                    Self::require_active(&st.lbs[li])?;
                }
                let lb = &mut st.lbs[li];
                lb.op = Some(self.ops.start(format!("load_balancers/{}", lb.id), Action::Delete));
                Ok(empty(StatusCode::ACCEPTED))
            }
            "vpc.load_balancer_listeners.list" => {
                let lb = &st.lbs[li];
                let ls: Vec<Value> = lb.listeners.iter().map(|l| ctx.listener(lb, l)).collect();
                Ok(reply(StatusCode::OK, &json!({ "listeners": ls })))
            }
            "vpc.load_balancer_listeners.create" => {
                Self::require_active(&st.lbs[li])?;
                let quota = lock(&self.opts).listener_quota;
                if st.lbs[li].listeners.len() >= quota {
                    let have = st.lbs[li].listeners.len() + 1;
                    return Err(over_quota("Listeners per load balancer", quota, have));
                }
                let v = body_json(req)?;
                let lid = st.next_id("listener");
                let mut l = Self::parse_listener(&v, &st.lbs[li], lid, &[])?;
                l.op = Some(self.ops.start(format!("listeners/{}", l.id), Action::Create));
                let lb = &mut st.lbs[li];
                lb.listeners.push(l);
                self.touch(lb);
                let lb = &st.lbs[li];
                Ok(reply(
                    StatusCode::CREATED,
                    &ctx.listener(lb, &lb.listeners[lb.listeners.len() - 1]),
                ))
            }
            "vpc.load_balancer_listeners.get"
            | "vpc.load_balancer_listeners.update"
            | "vpc.load_balancer_listeners.delete" => {
                let lid = &ids[1];
                let Some(x) = st.lbs[li].listeners.iter().position(|l| &l.id == lid) else {
                    return Err(not_found("Listener", lid));
                };
                if op.ends_with(".get") {
                    let lb = &st.lbs[li];
                    return Ok(reply(StatusCode::OK, &ctx.listener(lb, &lb.listeners[x])));
                }
                Self::require_active(&st.lbs[li])?;
                if op.ends_with(".delete") {
                    let lb = &mut st.lbs[li];
                    lb.listeners[x].op =
                        Some(self.ops.start(format!("listeners/{lid}"), Action::Delete));
                    self.touch(lb);
                    return Ok(empty(StatusCode::ACCEPTED));
                }
                let v = body_json(req)?;
                let lb = &st.lbs[li];
                let mut l = lb.listeners[x].clone();
                if v.get("port").is_some() {
                    let port = port_of(&v, "port", "listener", true)?.unwrap_or_default();
                    if lb.listeners.iter().any(|o| o.port == port && o.id != *lid) {
                        return Err(err(
                            StatusCode::CONFLICT,
                            "load_balancer_listener_duplicate_port",
                            format!(
                                "A listener on port {port} already exists in load balancer '{}'.",
                                lb.id
                            ),
                        ));
                    }
                    l.port = port;
                }
                if let Some(p) = v.get("protocol").and_then(Value::as_str) {
                    one_of(p, &["tcp", "http", "https", "udp"], "listener.protocol")?;
                    l.protocol = p.to_string();
                }
                match v.get("default_pool") {
                    Some(Value::Null) => l.default_pool = None,
                    Some(p) => {
                        let id = p.get("id").and_then(Value::as_str).unwrap_or_default();
                        match lb.pools.iter().find(|x| x.id == id) {
                            Some(pool) => l.default_pool = Some(pool.id.clone()),
                            None => return Err(not_found("Pool", id)),
                        }
                    }
                    None => {}
                }
                if let Some(b) = v.get("accept_proxy_protocol").and_then(Value::as_bool) {
                    l.accept_proxy_protocol = b;
                }
                if let Some(c) = v.get("connection_limit").and_then(Value::as_u64) {
                    l.connection_limit = Some(c);
                }
                l.op = Some(self.ops.start(format!("listeners/{lid}"), Action::Update));
                let lb = &mut st.lbs[li];
                lb.listeners[x] = l;
                self.touch(lb);
                let lb = &st.lbs[li];
                Ok(reply(StatusCode::OK, &ctx.listener(lb, &lb.listeners[x])))
            }
            "vpc.load_balancer_pools.list" => {
                let lb = &st.lbs[li];
                let ps: Vec<Value> = lb.pools.iter().map(|p| ctx.pool(lb, p)).collect();
                Ok(reply(StatusCode::OK, &json!({ "pools": ps })))
            }
            "vpc.load_balancer_pools.create" => {
                Self::require_active(&st.lbs[li])?;
                let (pool_quota, member_quota) = {
                    let o = lock(&self.opts);
                    (o.pool_quota, o.member_quota)
                };
                if st.lbs[li].pools.len() >= pool_quota {
                    let have = st.lbs[li].pools.len() + 1;
                    return Err(over_quota("Pools per load balancer", pool_quota, have));
                }
                let v = body_json(req)?;
                let lb = st.lbs[li].clone();
                let mut p = self.parse_pool(st, &v, &lb)?;
                if p.members.len() > member_quota {
                    return Err(over_quota("Members per pool", member_quota, p.members.len()));
                }
                p.op = Some(self.ops.start(format!("pools/{}", p.id), Action::Create));
                for m in &mut p.members {
                    m.op = Some(self.ops.start(format!("members/{}", m.id), Action::Create));
                }
                let out = ctx.pool(&lb, &p);
                let lb = &mut st.lbs[li];
                lb.pools.push(p);
                self.touch(lb);
                Ok(reply(StatusCode::CREATED, &out))
            }
            _ => self.pool_ops(st, ctx, op, ids, li, req),
        }
    }

    fn pool_ops(
        &self,
        st: &mut State,
        ctx: &Ctx,
        op: &str,
        ids: &[String],
        li: usize,
        req: &Request<Bytes>,
    ) -> Res<Resp> {
        let Some(pid) = ids.get(1) else {
            return Err(err(
                StatusCode::NOT_FOUND,
                "not_found",
                "The requested resource cannot be found.",
            ));
        };
        let Some(pi) = st.lbs[li].pools.iter().position(|p| &p.id == pid) else {
            return Err(not_found("Pool", pid));
        };
        match op {
            "vpc.load_balancer_pools.get" => {
                let lb = &st.lbs[li];
                Ok(reply(StatusCode::OK, &ctx.pool(lb, &lb.pools[pi])))
            }
            "vpc.load_balancer_pools.delete" => {
                Self::require_active(&st.lbs[li])?;
                let lb = &mut st.lbs[li];
                if let Some(l) =
                    lb.listeners.iter().find(|l| l.default_pool.as_deref() == Some(pid))
                {
                    return Err(err(
                        StatusCode::CONFLICT,
                        "load_balancer_pool_in_use",
                        format!("The pool '{pid}' is the default pool of listener '{}'.", l.id),
                    ));
                }
                lb.pools[pi].op = Some(self.ops.start(format!("pools/{pid}"), Action::Delete));
                self.touch(lb);
                Ok(empty(StatusCode::ACCEPTED))
            }
            "vpc.load_balancer_pools.update" => {
                Self::require_active(&st.lbs[li])?;
                let v = body_json(req)?;
                let lb = &st.lbs[li];
                let mut p = lb.pools[pi].clone();
                if let Some(a) = v.get("algorithm").and_then(Value::as_str) {
                    one_of(
                        a,
                        &["round_robin", "weighted_round_robin", "least_connections"],
                        "pool.algorithm",
                    )?;
                    p.algorithm = a.to_string();
                }
                if let Some(pr) = v.get("protocol").and_then(Value::as_str) {
                    one_of(pr, &["tcp", "http", "https", "udp"], "pool.protocol")?;
                    p.protocol = pr.to_string();
                }
                if let Some(n) = v.get("name").and_then(Value::as_str) {
                    if lb.pools.iter().any(|o| o.name == n && o.id != *pid) {
                        return Err(err(
                            StatusCode::CONFLICT,
                            "load_balancer_pool_duplicate_name",
                            format!(
                                "A pool named '{n}' already exists in load balancer '{}'.",
                                lb.id
                            ),
                        ));
                    }
                    p.name = n.to_string();
                }
                if let Some(hm) = v.get("health_monitor") {
                    let mut merged = p.health_monitor.clone();
                    merge(&mut merged, hm);
                    p.health_monitor = health_monitor(&merged)?;
                }
                if let Some(pp) = v.get("proxy_protocol").and_then(Value::as_str) {
                    one_of(pp, &["disabled", "v1", "v2"], "pool.proxy_protocol")?;
                    p.proxy_protocol = pp.to_string();
                }
                match v.get("session_persistence") {
                    Some(Value::Null) => p.session_persistence = None,
                    Some(sp) => {
                        let t = req_str(sp, "type", "session_persistence")?;
                        one_of(
                            t,
                            &["source_ip", "app_cookie", "http_cookie"],
                            "session_persistence.type",
                        )?;
                        p.session_persistence = Some(sp.clone());
                    }
                    None => {}
                }
                p.op = Some(self.ops.start(format!("pools/{pid}"), Action::Update));
                let lb = &mut st.lbs[li];
                lb.pools[pi] = p;
                self.touch(lb);
                let lb = &st.lbs[li];
                Ok(reply(StatusCode::OK, &ctx.pool(lb, &lb.pools[pi])))
            }
            "vpc.load_balancer_pool_members.list" => {
                let lb = &st.lbs[li];
                let p = &lb.pools[pi];
                let ms: Vec<Value> = p.members.iter().map(|m| ctx.member(lb, p, m)).collect();
                Ok(reply(StatusCode::OK, &json!({ "members": ms })))
            }
            "vpc.load_balancer_pool_members.create" => {
                Self::require_active(&st.lbs[li])?;
                let quota = lock(&self.opts).member_quota;
                if st.lbs[li].pools[pi].members.len() >= quota {
                    let have = st.lbs[li].pools[pi].members.len() + 1;
                    return Err(over_quota("Members per pool", quota, have));
                }
                let v = body_json(req)?;
                let vpc = lb_vpc(st, &st.lbs[li]);
                let mut m = self.parse_member(st, &v, vpc)?;
                let lb = &st.lbs[li];
                if lb.pools[pi].members.iter().any(|o| o.address == m.address && o.port == m.port) {
                    return Err(err(
                        StatusCode::CONFLICT,
                        "load_balancer_pool_member_duplicate",
                        format!(
                            "A member {}:{} already exists in pool '{pid}'.",
                            m.address, m.port
                        ),
                    ));
                }
                m.op = Some(self.ops.start(format!("members/{}", m.id), Action::Create));
                let out = ctx.member(lb, &lb.pools[pi], &m);
                let lb = &mut st.lbs[li];
                lb.pools[pi].members.push(m);
                self.touch(lb);
                Ok(reply(StatusCode::CREATED, &out))
            }
            "vpc.load_balancer_pool_members.replace" => {
                Self::require_active(&st.lbs[li])?;
                let v = body_json(req)?;
                let list = v.get("members").and_then(Value::as_array).ok_or_else(|| {
                    err(
                        StatusCode::BAD_REQUEST,
                        "validation_required_field_missing",
                        "members is required",
                    )
                })?;
                let quota = lock(&self.opts).member_quota;
                if list.len() > quota {
                    return Err(over_quota("Members per pool", quota, list.len()));
                }
                let mut members = Vec::new();
                let vpc = lb_vpc(st, &st.lbs[li]);
                for m in list {
                    let mut m = self.parse_member(st, m, vpc)?;
                    if members.iter().any(|o: &Member| o.address == m.address && o.port == m.port) {
                        return Err(err(
                            StatusCode::CONFLICT,
                            "load_balancer_pool_member_duplicate",
                            format!("Member {}:{} is listed twice.", m.address, m.port),
                        ));
                    }
                    m.op = Some(self.ops.start(format!("members/{}", m.id), Action::Create));
                    members.push(m);
                }
                let lb = &mut st.lbs[li];
                lb.pools[pi].members = members;
                lb.pools[pi].op = Some(self.ops.start(format!("pools/{pid}"), Action::Update));
                self.touch(lb);
                let lb = &st.lbs[li];
                let p = &lb.pools[pi];
                let ms: Vec<Value> = p.members.iter().map(|m| ctx.member(lb, p, m)).collect();
                Ok(reply(StatusCode::ACCEPTED, &json!({ "members": ms })))
            }
            "vpc.load_balancer_pool_members.get"
            | "vpc.load_balancer_pool_members.update"
            | "vpc.load_balancer_pool_members.delete" => {
                let Some(mid) = ids.get(2) else {
                    return Err(err(
                        StatusCode::NOT_FOUND,
                        "not_found",
                        "The requested resource cannot be found.",
                    ));
                };
                let Some(mi) = st.lbs[li].pools[pi].members.iter().position(|m| &m.id == mid)
                else {
                    return Err(not_found("Member", mid));
                };
                if op.ends_with(".get") {
                    let lb = &st.lbs[li];
                    let p = &lb.pools[pi];
                    return Ok(reply(StatusCode::OK, &ctx.member(lb, p, &p.members[mi])));
                }
                Self::require_active(&st.lbs[li])?;
                if op.ends_with(".delete") {
                    let lb = &mut st.lbs[li];
                    lb.pools[pi].members[mi].op =
                        Some(self.ops.start(format!("members/{mid}"), Action::Delete));
                    self.touch(lb);
                    return Ok(empty(StatusCode::ACCEPTED));
                }
                let v = body_json(req)?;
                let mut m = st.lbs[li].pools[pi].members[mi].clone();
                if v.get("port").is_some() {
                    m.port = port_of(&v, "port", "member", true)?.unwrap_or_default();
                }
                if let Some(w) = v.get("weight") {
                    m.weight = w
                        .as_u64()
                        .filter(|n| *n <= 100)
                        .ok_or_else(|| bad("member.weight must be from 0 to 100"))?;
                }
                if let Some(t) = v.get("target") {
                    let vpc = lb_vpc(st, &st.lbs[li]);
                    let parsed =
                        self.parse_member(st, &json!({"port": m.port, "target": t}), vpc)?;
                    m.address = parsed.address;
                }
                m.op = Some(self.ops.start(format!("members/{mid}"), Action::Update));
                let lb = &mut st.lbs[li];
                lb.pools[pi].members[mi] = m;
                self.touch(lb);
                let lb = &st.lbs[li];
                let p = &lb.pools[pi];
                Ok(reply(StatusCode::OK, &ctx.member(lb, p, &p.members[mi])))
            }
            _ => Err(err(
                StatusCode::NOT_FOUND,
                "not_found",
                "The requested resource cannot be found.",
            )),
        }
    }

    fn state_json(&self) -> Value {
        let mut st = lock(&self.state);
        Self::settle(&mut st);
        let ctx = Ctx {
            base: "http://emulator".into(),
            region: self.region(),
            account: self.account_id(),
            rg_id: self.resource_group_id(),
            rg_name: lock(&self.opts).resource_group.clone(),
        };
        let lbs: Vec<Value> = st
            .lbs
            .iter()
            .map(|lb| {
                let mut v = ctx.lb(&st, lb);
                v["listeners"] = json!(
                    lb.listeners
                        .iter()
                        .map(|l| {
                            let mut lv = ctx.listener(lb, l);
                            if let Some(p) = l
                                .default_pool
                                .as_ref()
                                .and_then(|id| lb.pools.iter().find(|p| &p.id == id))
                            {
                                lv["default_pool"]["name"] = json!(p.name);
                            }
                            lv
                        })
                        .collect::<Vec<_>>()
                );
                v["tags"] = json!(lb.tags.iter().collect::<Vec<_>>());
                v["pools"] = json!(
                    lb.pools
                        .iter()
                        .map(|p| {
                            let mut pv = ctx.pool(lb, p);
                            pv["members"] = json!(
                                p.members.iter().map(|m| ctx.member(lb, p, m)).collect::<Vec<_>>()
                            );
                            pv
                        })
                        .collect::<Vec<_>>()
                );
                v
            })
            .collect();
        let instances: Vec<Value> = st
            .instances
            .iter()
            .map(|i| {
                let v = ctx.instance(&st, i);
                json!({
                    "name": i.w.name, "id": i.id, "status": v["status"], "zone": i.w.zone,
                    "profile": v["profile"]["name"], "address": i.ip,
                    "subnet": st.subnets[i.subnet].name, "vpc": st.vpcs[st.subnets[i.subnet].vpc].name,
                })
            })
            .collect();
        json!({
            "region": ctx.region,
            "account_id": ctx.account,
            "resource_group": {"id": ctx.rg_id, "name": ctx.rg_name},
            "vpcs": st.vpcs.iter().map(|v| json!({"id": v.id, "name": v.name})).collect::<Vec<_>>(),
            "subnets": st.subnets.iter().map(|s| json!({"id": s.id, "name": s.name, "zone": s.zone,
                "ipv4_cidr_block": s.cidr, "vpc": st.vpcs[s.vpc].name})).collect::<Vec<_>>(),
            "instances": instances,
            "load_balancers": lbs,
            "tokens_issued": st.tokens_issued,
        })
    }
}

/// A Global Tagging user tag: 1-128 letters, digits, spaces, `_`, `-`, `.`, `:`.
fn valid_tag(t: &str) -> bool {
    (1..=128).contains(&t.len())
        && t.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, ' ' | '_' | '-' | '.' | ':'))
}

impl IbmCloud {
    /// Global Tagging: list, attach, detach user tags on load balancers' CRNs.
    fn tagging(&self, op: &str, q: &Query, ctx: &Ctx, req: &Request<Bytes>) -> Res<Resp> {
        if let Some(a) = q.get("account_id")
            && a != ctx.account
        {
            return Err(err(
                StatusCode::FORBIDDEN,
                "forbidden",
                format!("The token is not authorized for account '{a}'."),
            ));
        }
        match q.get("tag_type") {
            None | Some("user") => {}
            Some(t) => {
                return Err(bad(format!(
                    "tag_type {t:?}: only user tags are emulated (user, service, access in IBM Cloud)"
                )));
            }
        }
        let mut st = lock(&self.state);
        Self::settle(&mut st);
        let crn_of = |lb: &Lb| ctx.crn("load-balancer", &lb.id);
        if op == "tagging.tags.list" {
            let number = |key: &str, default: u64, lo: u64, hi: u64| -> Res<u64> {
                match q.get(key) {
                    None => Ok(default),
                    Some(v) => match v.parse::<u64>() {
                        Ok(n) if (lo..=hi).contains(&n) => Ok(n),
                        _ => Err(bad(format!("{key} must be an integer from {lo} to {hi}"))),
                    },
                }
            };
            let offset = number("offset", 0, 0, u64::MAX)?;
            let limit = number("limit", 100, 1, 1000)?;
            let mut names = std::collections::BTreeSet::new();
            for lb in &st.lbs {
                if q.get("attached_to").is_none_or(|c| c == crn_of(lb)) {
                    names.extend(lb.tags.iter().cloned());
                }
            }
            let total = names.len();
            let items: Vec<Value> = names
                .into_iter()
                .skip(offset as usize)
                .take(limit as usize)
                .map(|n| json!({"name": n}))
                .collect();
            return Ok(reply(
                StatusCode::OK,
                &json!({"total_count": total, "offset": offset, "limit": limit, "items": items}),
            ));
        }
        let v = body_json(req)?;
        let resources = v.get("resources").and_then(Value::as_array).filter(|r| !r.is_empty());
        let Some(resources) = resources else {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "validation_required_field_missing",
                "resources is required: a non-empty array of {\"resource_id\": <CRN>}",
            ));
        };
        let mut names: Vec<String> = match (v.get("tag_names"), v.get("tag_name")) {
            (Some(Value::Array(a)), _) => {
                a.iter().map(|t| t.as_str().unwrap_or_default().to_string()).collect()
            }
            (None, Some(Value::String(t))) => vec![t.clone()],
            _ => Vec::new(),
        };
        if names.is_empty() {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "validation_required_field_missing",
                "tag_names (or tag_name) is required",
            ));
        }
        if let Some(bad_tag) = names.iter().find(|t| !valid_tag(t)) {
            return Err(err(
                StatusCode::BAD_REQUEST,
                "invalid_tag_name",
                format!(
                    "The tag {bad_tag:?} is not valid: 1-128 characters, letters, digits, spaces, '_', '-', '.', ':'."
                ),
            ));
        }
        for n in &mut names {
            *n = n.to_ascii_lowercase();
        }
        let attach = op == "tagging.tags.attach";
        let mut results = Vec::new();
        for r in resources {
            let crn = r.get("resource_id").and_then(Value::as_str).unwrap_or_default();
            let found = st.lbs.iter_mut().find(|lb| !crn.is_empty() && crn_of(lb) == crn);
            let is_error = match found {
                Some(lb) => {
                    for n in &names {
                        if attach {
                            lb.tags.insert(n.clone());
                        } else {
                            lb.tags.remove(n);
                        }
                    }
                    false
                }
                None => true,
            };
            results.push(json!({"resource_id": crn, "is_error": is_error}));
        }
        Ok(reply(StatusCode::OK, &json!({ "results": results })))
    }

    /// The user tags attached to the load balancer `id` (tests).
    pub fn load_balancer_tags(&self, id: &str) -> Option<Vec<String>> {
        let st = lock(&self.state);
        st.lbs.iter().find(|l| l.id == id).map(|l| l.tags.iter().cloned().collect())
    }
}

fn empty(status: StatusCode) -> Resp {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = status;
    r
}

impl Cloud for IbmCloud {
    fn name(&self) -> String {
        "ibm".into()
    }

    fn operation(&self, head: &http::request::Parts, _body: &Bytes) -> String {
        route(&head.method, head.uri.path()).0
    }

    fn error(&self, head: &http::request::Parts, _op: &str, kind: ErrorKind) -> ErrorReply {
        let (status, code, message) = match kind {
            ErrorKind::Throttle => (429, "rate_limit_exceeded", "Too many requests, retry later."),
            ErrorKind::Unavailable => {
                (503, "service_unavailable", "The service is temporarily unavailable.")
            }
            ErrorKind::Status(s) => (
                s,
                match s {
                    400 => "bad_request",
                    401 => "not_authorized",
                    403 => "forbidden",
                    404 => "not_found",
                    409 => "conflict",
                    429 => "rate_limit_exceeded",
                    502 => "bad_gateway",
                    503 => "service_unavailable",
                    504 => "gateway_timeout",
                    _ => "internal_error",
                },
                "Injected fault.",
            ),
        };
        let body = if head.uri.path().starts_with("/identity/") {
            let code = match status {
                429 => "BXNIM0438E",
                400..=499 => "BXNIM0400E",
                _ => "BXNIM0500E",
            };
            iam_error(
                StatusCode::from_u16(status).unwrap_or(StatusCode::SERVICE_UNAVAILABLE),
                code,
                message,
            )
        } else {
            error_body(code, message)
        };
        ErrorReply { status, content_type: "application/json", body: body.to_string() }
    }

    fn serve(&self, op: String, req: Request<Bytes>) -> ServeFuture {
        let (_, ids) = route(req.method(), req.uri().path());
        let resp = if op.starts_with("vpc.unknown") || op.starts_with("http.unknown") {
            err(StatusCode::NOT_FOUND, "not_found", "The requested resource cannot be found.")
        } else {
            self.handle(&op, &ids, &req)
        };
        Box::pin(async move { Ok(resp) })
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
