//! The differential (issue #31 point 3): upstream's CCM as the oracle.
//!
//! For a cloud, the same swap case (`crate::swap`: upstream's chart at its pinned version,
//! rendered with its defaults) runs twice: once with upstream's binary (built by
//! `ci/install-tools --upstream-ccm <cloud>` into the tool cache), once with ours. Each side
//! gets its own fresh kube-apiserver and its own emulator started from the same world
//! (`swap::clouds::world_with`, with a spare instance and a fault proxy counting the calls in
//! front of moto or vcsim), the same command line, RBAC identity and cloud config, and the
//! same scenario ([`STEPS`]) with the same bounded waits. After each step both sides are
//! snapshotted and normalised ([`compare`]), then diffed step by step; each difference is
//! matched against the cloud's documented ones (`testbed/fixtures/differential/<cloud>.yaml`).
//!
//! ```text
//!   world ─┬─▶ emulator A ◀── upstream's CCM ──▶ kube-apiserver A ─┐
//!          └─▶ emulator B ◀── our CCM ─────────▶ kube-apiserver B ─┼─▶ snapshots ─▶ diff
//!   scenario steps (join, instance-gone, …) driven on both ───────┘
//! ```

pub mod compare;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event, Node, Service};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::swap::{self, Case, Outcome, Proc, SwapError, World, WorldOptions};
use compare::Renames;

/// The clouds with a differential run (upstream's source is served by the Go module proxy).
pub const CLOUDS: [&str; 4] = ["aws", "openstack", "vsphere", "azure"];

/// The scenario's steps, in order, with what each does.
pub const STEPS: [(&str, &str); 7] = [
    (
        "join",
        "kubelet-like Nodes (uninitialized taint, InternalIP and Hostname, Ready) register for every instance but the spare; settled once all are initialised",
    ),
    (
        "instance-gone",
        "the last joined Node turns NotReady (Ready Unknown) and its instance is deleted in the cloud (where the emulator cannot delete an instance: a NotReady Node for a name no instance has); settled once the Node is deleted",
    ),
    (
        "service-created",
        "a LoadBalancer Service `default/web` (port 80) with the cloud's common annotations; settled once it has an ingress address (clouds without load balancers: a fixed wait)",
    ),
    ("annotation-removed", "one of those annotations removed; a fixed wait"),
    ("node-added", "a Node for the spare instance registers; settled once it is initialised"),
    ("node-removed", "that Node is deleted; settled once it is gone"),
    ("service-deleted", "the Service is deleted; settled once it is gone (its finalizer removed)"),
];

/// After a step's condition, a side is settled when its cloud calls stop for this long...
const QUIET: Duration = Duration::from_secs(6);
/// ... or after this long at most.
const QUIET_MAX: Duration = Duration::from_secs(40);

/// Errors of a differential run; each names what failed.
#[derive(Debug, thiserror::Error)]
pub enum DiffError {
    /// A swap building block failed.
    #[error(transparent)]
    Swap(#[from] SwapError),
    /// Upstream's binary is not available.
    #[error("upstream's {cloud} CCM: {detail}")]
    Upstream {
        /// The cloud.
        cloud: String,
        /// What is missing.
        detail: String,
    },
    /// The documented differences could not be read.
    #[error(transparent)]
    Known(#[from] compare::KnownError),
    /// A step of the scenario failed.
    #[error("{0}")]
    Step(String),
}

fn fail(what: impl std::fmt::Display) -> DiffError {
    DiffError::Step(what.to_string())
}

/// The binaries one side runs: the manager, and Azure's per-node manager.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `upstream` or `ours`.
    pub label: String,
    /// The manager.
    pub manager: PathBuf,
    /// The per-node manager (Azure's cloud-node-manager), if the cloud has one.
    pub node_manager: Option<PathBuf>,
    /// Environment the binary needs beyond swap's mappings (upstream's Azure: the AAD
    /// stand-in's proxy and CA).
    pub env: Vec<(String, String)>,
    /// What keeps upstream's stand-ins running (`crate::upstream::extra_env`), and gives a
    /// node's per-node manager its environment.
    pub guard: Option<std::sync::Arc<crate::upstream::UpstreamGuard>>,
}

/// Our binaries (`target/debug`).
pub fn ours(cloud: &str) -> Binaries {
    let dir = swap::bin_dir();
    Binaries {
        label: "ours".into(),
        manager: dir.join(format!("cloud-controller-manager-{cloud}")),
        node_manager: (cloud == "azure").then(|| dir.join("cloud-node-manager-azure")),
        env: Vec::new(),
        guard: None,
    }
}

/// The names upstream's binaries may have in the directory `ci/install-tools` built them in.
const UPSTREAM_NAMES: [(&str, &[&str]); 4] = [
    ("aws", &["aws-cloud-controller-manager"]),
    ("openstack", &["openstack-cloud-controller-manager"]),
    ("vsphere", &["vsphere-cloud-controller-manager"]),
    ("azure", &["cloud-controller-manager", "azure-cloud-controller-manager"]),
];

/// Upstream's binaries: the directory `ci/install-tools --print-upstream-ccm <cloud>` names
/// (`$CCM_UPSTREAM_CCM_DIR` overrides), for AWS also `--print-aws-ccm`.
pub fn upstream(cloud: &str) -> Result<Binaries, DiffError> {
    let err = |detail: String| DiffError::Upstream { cloud: cloud.into(), detail };
    let installer = crate::tools::repo_root().join("ci/install-tools");
    let print = |flag: &[&str]| -> Option<PathBuf> {
        let out = Command::new(&installer).args(flag).output().ok()?;
        let last = String::from_utf8_lossy(&out.stdout).lines().last()?.trim().to_string();
        (out.status.success() && !last.is_empty()).then(|| PathBuf::from(last))
    };
    let mut candidates: Vec<PathBuf> = Vec::new();
    if let Some(d) = std::env::var_os("CCM_UPSTREAM_CCM_DIR") {
        candidates.push(PathBuf::from(d));
    }
    candidates.extend(print(&["--print-upstream-ccm", cloud]));
    if cloud == "aws"
        && let Some(bin) = print(&["--print-aws-ccm"])
        && let Some(parent) = bin.parent()
    {
        candidates.push(parent.to_path_buf());
    }
    let names =
        UPSTREAM_NAMES.iter().find(|(c, _)| *c == cloud).map(|(_, n)| *n).ok_or_else(|| {
            err(format!("no differential for {cloud} (one of {})", CLOUDS.join(", ")))
        })?;
    for dir in &candidates {
        if let Some(manager) = names.iter().map(|n| dir.join(n)).find(|p| p.is_file()) {
            let node_manager = Some(dir.join("cloud-node-manager")).filter(|p| p.is_file());
            if cloud == "azure" && node_manager.is_none() {
                return Err(err(format!("no cloud-node-manager in {}", dir.display())));
            }
            return Ok(Binaries {
                label: "upstream".into(),
                manager,
                node_manager,
                env: Vec::new(),
                guard: None,
            });
        }
    }
    Err(err(format!(
        "not built (looked in {}); run ci/install-tools --upstream-ccm {cloud}",
        if candidates.is_empty() {
            "no directory: ci/install-tools printed none".to_string()
        } else {
            candidates.iter().map(|c| c.display().to_string()).collect::<Vec<_>>().join(", ")
        }
    )))
}

/// The annotations of the scenario's Service per cloud (the ones operators commonly set), and
/// the one `annotation-removed` removes.
pub fn annotations(cloud: &str) -> (Vec<(&'static str, &'static str)>, &'static str) {
    match cloud {
        // An NLB: upstream v1.36.2 panics on moto's classic ELB (moto's DescribeLoadBalancers
        // has no HealthCheck for a new ELB, which AWS always returns; docs/benchmarks.md).
        "aws" => (
            vec![
                ("service.beta.kubernetes.io/aws-load-balancer-type", "nlb"),
                (
                    "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled",
                    "true",
                ),
                (
                    "service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags",
                    "team=web,env=differential",
                ),
                ("service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval", "10"),
            ],
            "service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled",
        ),
        "openstack" => (
            vec![
                ("loadbalancer.openstack.org/timeout-client-data", "60000"),
                ("loadbalancer.openstack.org/timeout-member-data", "60000"),
                ("loadbalancer.openstack.org/connection-limit", "1000"),
                ("loadbalancer.openstack.org/enable-health-monitor", "true"),
            ],
            "loadbalancer.openstack.org/timeout-client-data",
        ),
        "azure" => (
            vec![
                ("service.beta.kubernetes.io/azure-load-balancer-tcp-idle-timeout", "10"),
                ("service.beta.kubernetes.io/azure-dns-label-name", "web-differential"),
                ("service.beta.kubernetes.io/azure-load-balancer-disable-tcp-reset", "false"),
            ],
            "service.beta.kubernetes.io/azure-dns-label-name",
        ),
        _ => (vec![("example.com/team", "web")], "example.com/team"),
    }
}

/// What one side left: a normalised snapshot per step, and how it went.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct SideResult {
    /// `upstream` or `ours`.
    pub label: String,
    /// Step → normalised snapshot.
    pub snapshots: BTreeMap<String, Value>,
    /// A step that failed (the later steps did not run).
    pub error: Option<String>,
    /// Where its logs are.
    pub logs: String,
    /// Seconds it took (control plane, emulator, scenario).
    pub seconds: u64,
}

/// Runs `case` with `bins` against a fresh control plane and emulator; never fails: a failed
/// step is the result's `error`.
pub async fn run_side(case: &Case, bins: &Binaries, dir: &Path) -> SideResult {
    let start = Instant::now();
    let mut result = SideResult {
        label: bins.label.clone(),
        logs: dir.display().to_string(),
        ..Default::default()
    };
    if let Err(e) = side_steps(case, bins, dir, &mut result).await {
        result.error = Some(e.to_string());
    }
    result.seconds = start.elapsed().as_secs();
    result
}

/// A side's running state.
struct Ctx<'a> {
    cloud: String,
    admin: kube::Client,
    world: &'a World,
    case: &'a Case,
    prepared: &'a swap::Prepared,
    bins: &'a Binaries,
    dir: PathBuf,
    procs: Vec<Proc>,
    renames: Renames,
    counters: BTreeMap<String, u64>,
    events: BTreeSet<String>,
}

impl Ctx<'_> {
    fn nodes(&self) -> Api<Node> {
        Api::all(self.admin.clone())
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.admin.clone(), "default")
    }

    /// The manager (and node managers) still running, else how one ended.
    fn alive(&mut self) -> Result<(), DiffError> {
        for p in &mut self.procs {
            if let Some(how) = p.exited() {
                return Err(fail(how));
            }
        }
        Ok(())
    }

    async fn admin_get(&self, what: &str) -> Result<Value, DiffError> {
        let Some(url) = &self.world.access.admin_url else { return Ok(Value::Null) };
        let (code, body) = swap::curl(
            "GET",
            &format!("{url}/__emulator/{what}"),
            self.world.access.admin_ca.as_deref(),
            &[],
            None,
        )
        .await?;
        if code != 200 {
            return Err(fail(format!("the emulator's admin {what}: {code} {body}")));
        }
        serde_json::from_str(&body).map_err(|e| fail(format!("the emulator's admin {what}: {e}")))
    }

    async fn read_counters(&self) -> Result<BTreeMap<String, u64>, DiffError> {
        let v = self.admin_get("counters").await?;
        Ok(v["operations"]
            .as_object()
            .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0))).collect())
            .unwrap_or_default())
    }

    /// Registers a kubelet-like Node, and its node manager where the cloud has one.
    async fn register(&mut self, name: &str, ip: &str, labels: &Value) -> Result<(), DiffError> {
        self.nodes()
            .create(&PostParams::default(), &swap::kubelet_node(name, ip, labels)?)
            .await
            .map_err(|e| fail(format!("registering Node {name}: {e}")))?;
        if let (Some(_), Some(nm)) = (&self.case.node_manager, &self.bins.node_manager) {
            let (argv, mut env, _) =
                swap::node_manager_command(self.case, self.world, self.prepared, name, nm)?;
            env.extend(self.bins.env.iter().cloned());
            if let Some(guard) = &self.bins.guard {
                let node_env = self.world.node_env.get(name).cloned().unwrap_or_default();
                env.extend(
                    guard
                        .node_env(name, &node_env)
                        .map_err(|e| fail(format!("upstream's environment on {name}: {e}")))?,
                );
            }
            self.procs.push(Proc::spawn(
                &format!("cloud-node-manager on {name}"),
                &argv,
                &env,
                &self.dir.join(format!("node-manager-{name}.log")),
            )?);
        }
        Ok(())
    }

    /// Waits until `cond` holds (up to `max`), then until the cloud calls stop for [`QUIET`]
    /// (up to [`QUIET_MAX`]; without call counters, [`QUIET`]). Whether `cond` held.
    async fn settle<F, Fut>(&mut self, max: Duration, mut cond: F) -> Result<bool, DiffError>
    where
        F: FnMut(kube::Client) -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = Instant::now();
        let mut held = false;
        while start.elapsed() < max {
            self.alive()?;
            if cond(self.admin.clone()).await {
                held = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let quiet_start = Instant::now();
        if self.world.access.admin_url.is_none() {
            tokio::time::sleep(QUIET).await;
        } else {
            let mut last = self.read_counters().await?;
            let mut since = Instant::now();
            while quiet_start.elapsed() < QUIET_MAX && since.elapsed() < QUIET {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let now = self.read_counters().await?;
                if now != last {
                    last = now;
                    since = Instant::now();
                }
            }
        }
        self.alive()?;
        Ok(held)
    }

    /// The normalised snapshot after a step: Nodes, Services, new Events, the cloud's state,
    /// the step's calls.
    async fn snapshot(&mut self) -> Result<Value, DiffError> {
        let nodes = self
            .nodes()
            .list(&ListParams::default())
            .await
            .map_err(|e| fail(format!("listing Nodes: {e}")))?;
        for n in &nodes.items {
            if let (Some(name), Some(pid)) =
                (&n.metadata.name, n.spec.as_ref().and_then(|s| s.provider_id.as_ref()))
            {
                // The instance's ID, the providerID's last segment (`aws:///zone/i-…`,
                // `openstack:///<uuid>`, `vsphere://<uuid>`, Azure's resource ID).
                if let Some(id) = pid.rsplit('/').next().filter(|id| id.len() >= 8) {
                    self.renames.add(id, format!("<instance:{name}>"));
                }
            }
        }
        let services = self
            .services()
            .list(&ListParams::default())
            .await
            .map_err(|e| fail(format!("listing Services: {e}")))?;
        for s in &services.items {
            if let (Some(name), Some(uid)) = (&s.metadata.name, &s.metadata.uid) {
                self.renames.add_service_uid(uid, &format!("default/{name}"));
            }
            // The node ports the apiserver allocated (each side its own).
            for p in s.spec.iter().flat_map(|s| s.ports.iter().flatten()) {
                if let Some(np) = p.node_port {
                    let name = s.metadata.name.as_deref().unwrap_or_default();
                    self.renames
                        .add_token(np.to_string(), format!("<nodeport:default/{name}:{}>", p.port));
                }
            }
        }
        let mut snap = json!({"nodes": {}, "services": {}, "events": {}, "calls": {}});
        for n in &nodes.items {
            let v = serde_json::to_value(n).map_err(|e| fail(format!("a Node: {e}")))?;
            let name = n.metadata.name.clone().unwrap_or_default();
            snap["nodes"][name] = compare::normalise_node(&v, &self.renames);
        }
        for s in &services.items {
            let name = s.metadata.name.clone().unwrap_or_default();
            if name == "kubernetes" {
                continue;
            }
            let v = serde_json::to_value(s).map_err(|e| fail(format!("a Service: {e}")))?;
            snap["services"][name] = compare::normalise_service(&v, &self.renames);
        }
        let events: Api<Event> = Api::all(self.admin.clone());
        let list = events
            .list(&ListParams::default())
            .await
            .map_err(|e| fail(format!("listing Events: {e}")))?;
        let values: Vec<Value> =
            list.items.iter().filter_map(|e| serde_json::to_value(e).ok()).collect();
        for (k, source) in compare::normalise_events(&values, &self.renames) {
            if self.events.insert(k.clone()) {
                snap["events"][k] = Value::String(source);
            }
        }
        snap["cloud"] = self.cloud_state().await?;
        let now = self.read_counters().await?;
        let delta = compare::call_delta(&now, &self.counters);
        self.counters = now;
        snap["calls"] = json!(delta);
        Ok(snap)
    }

    /// The cloud's state, normalised: the emulator's state dump, or moto's load balancers,
    /// target groups, security groups and instances.
    async fn cloud_state(&self) -> Result<Value, DiffError> {
        let access = &self.world.access;
        let raw = if access.emulator_state {
            let mut v = self.admin_get("state").await?["cloud"].take();
            if let Some(o) = v.as_object_mut() {
                // Tokens are the emulator's bookkeeping of the sides' logins, not cloud state.
                o.remove("tokens_issued");
                o.remove("tokens");
            }
            v
        } else if let Some(moto) = &access.moto_url {
            let (code, body) =
                swap::curl("GET", &format!("{moto}/moto-api/data.json"), None, &[], None).await?;
            if code != 200 {
                return Err(fail(format!("moto's data.json: {code}")));
            }
            let all: Value =
                serde_json::from_str(&body).map_err(|e| fail(format!("moto's data.json: {e}")))?;
            moto_state(&all)
        } else {
            Value::Null
        };
        Ok(compare::scrub(&raw, &self.renames, true))
    }
}

/// The parts of moto's `data.json` the CCMs change: ELB and ELBv2 (every model), EC2 security
/// groups and their rules, instances' IDs, states and tags. Left out: what moto changes on a
/// read (its `FakeHealthStatus` records of DescribeTargetHealth calls, a load balancer's
/// `provisioning` → `active` on the first describe), which would count the sides' reads.
pub fn moto_state(all: &Value) -> Value {
    let mut out = json!({});
    for backend in ["elb", "elbv2"] {
        if let Some(b) = all.get(backend) {
            let mut b = b.clone();
            if let Some(o) = b.as_object_mut() {
                o.remove("FakeHealthStatus");
            }
            for lb in b["FakeLoadBalancer"].as_array_mut().into_iter().flatten() {
                if let Some(o) = lb.as_object_mut() {
                    o.remove("state");
                    o.remove("load_balancer_state");
                }
            }
            out[backend] = b;
        }
    }
    let ec2 = &all["ec2"];
    for model in ["SecurityGroup", "SecurityRule"] {
        if let Some(m) = ec2.get(model) {
            out["ec2"][model] = m.clone();
        }
    }
    if let Some(instances) = ec2.get("Instance").and_then(Value::as_array) {
        out["ec2"]["Instance"] = Value::Array(
            instances
                .iter()
                .map(|i| json!({"id": i["id"], "state": i["_state"]["name"], "tags": i["tags"]}))
                .collect(),
        );
    }
    out
}

async fn side_steps(
    case: &Case,
    bins: &Binaries,
    dir: &Path,
    result: &mut SideResult,
) -> Result<(), DiffError> {
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("creating {}: {e}", dir.display())))?;
    let world = swap::clouds::world_with(
        case,
        &dir.join("world"),
        WorldOptions { spare: true, proxy: true },
    )
    .await?;
    if case.cloud == "aws"
        && let Some(proxy) = &world.access.admin_url
    {
        // moto has no DescribeInstanceTopology: the proxy answers it with an empty topology
        // (as a region answers for instance types it has none for).
        let rule = json!({"match": "*DescribeInstanceTopology", "fault": {
            "kind": "status", "status": 200,
            "body": "<DescribeInstanceTopologyResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>differential</requestId><instanceSet/></DescribeInstanceTopologyResponse>"
        }});
        let (code, body) = swap::curl(
            "POST",
            &format!("{proxy}/__emulator/faults"),
            None,
            &["Content-Type: application/json".to_string()],
            Some(&rule.to_string()),
        )
        .await?;
        if code != 200 {
            return Err(fail(format!("the proxy's DescribeInstanceTopology rule: {code} {body}")));
        }
    }
    let mut outcome = Outcome::default();
    let prepared = swap::prepare(case, &world, dir, &bins.manager, &mut outcome).await?;
    let mut env = prepared.env.clone();
    env.extend(bins.env.iter().cloned());
    let mut argv = prepared.argv.clone();
    // Upstream's image has no entrypoint where the chart's args start with the binary's path
    // (OpenStack's): that path is the program there, not an argument (ours skips it itself).
    if bins.label == "upstream"
        && argv.get(1).is_some_and(|a| {
            a.starts_with('/') && Path::new(a).file_name() == bins.manager.file_name()
        })
    {
        argv.remove(1);
    }
    // A pod has a network namespace of its own; here the default secure port (10258) may be
    // held by another manager on this machine: both sides get one nobody holds when the args
    // name none (swap maps a busy port the args name the same way).
    if swap::flag_value(&argv, "--secure-port").is_none() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| fail(format!("choosing a free secure port: {e}")))?;
        argv.push(format!("--secure-port={port}"));
    }
    let manager = Proc::spawn("cloud-controller-manager", &argv, &env, &dir.join("ccm.log"))?;
    let mut ctx = Ctx {
        cloud: case.cloud.clone(),
        admin: prepared.admin.clone(),
        world: &world,
        case,
        prepared: &prepared,
        bins,
        dir: dir.to_path_buf(),
        procs: vec![manager],
        renames: Renames::default(),
        counters: BTreeMap::new(),
        events: BTreeSet::new(),
    };
    let outcome = scenario(&mut ctx, result).await;
    for p in &mut ctx.procs {
        p.stop();
    }
    if outcome.is_err() {
        prepared.cp.keep_logs("ccm-differential: a step failed");
    }
    outcome
}

fn initialised_all(
    names: Vec<String>,
) -> impl FnMut(kube::Client) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> {
    move |client| {
        let names = names.clone();
        Box::pin(async move {
            let api: Api<Node> = Api::all(client);
            for n in &names {
                match api.get_opt(n).await {
                    Ok(Some(node)) if swap::initialised(&node) => {}
                    _ => return false,
                }
            }
            true
        })
    }
}

fn node_gone(
    name: String,
) -> impl FnMut(kube::Client) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> {
    move |client| {
        let name = name.clone();
        Box::pin(async move {
            let api: Api<Node> = Api::all(client);
            matches!(api.get_opt(&name).await, Ok(None))
        })
    }
}

async fn scenario(ctx: &mut Ctx<'_>, result: &mut SideResult) -> Result<(), DiffError> {
    let all = ctx.world.nodes.clone();
    let (spare, joined) = all.split_last().ok_or_else(|| fail("the world has no instance"))?;
    let (spare, joined) = (spare.clone(), joined.to_vec());
    let victim = joined.last().cloned().ok_or_else(|| fail("the world has one instance only"))?;
    ctx.counters = ctx.read_counters().await?;

    // join
    for (name, ip, labels) in &joined {
        ctx.register(name, ip, labels).await?;
    }
    let names: Vec<String> = joined.iter().map(|n| n.0.clone()).collect();
    ctx.settle(Duration::from_secs(120), initialised_all(names)).await?;
    result.snapshots.insert("join".into(), ctx.snapshot().await?);

    // instance-gone
    // The instance is deleted first; where the emulator refuses (Azure's answers 405 to a VM
    // DELETE), the step falls back to a NotReady Node no instance stands behind, on both
    // sides alike.
    let deleted = match &ctx.world.access.delete_instance {
        Some(delete) => match delete(victim.0.clone()).await {
            Ok(()) => true,
            Err(e) => {
                tracing::warn!(instance = %victim.0, error = %e, "the emulator cannot delete the instance: a NotReady Node for a name no instance has instead");
                false
            }
        },
        None => false,
    };
    let gone = if deleted {
        victim.0.clone()
    } else {
        let name = "node-gone".to_string();
        ctx.register(&name, "10.255.0.99", &Value::Null).await?;
        name
    };
    let status = json!({"status": {"conditions": [{
        "type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
        "message": "Kubelet stopped posting node status.",
    }]}});
    ctx.nodes()
        .patch_status(&gone, &PatchParams::default(), &Patch::Strategic(&status))
        .await
        .map_err(|e| fail(format!("Node {gone} NotReady: {e}")))?;
    ctx.settle(Duration::from_secs(90), node_gone(gone.clone())).await?;
    result.snapshots.insert("instance-gone".into(), ctx.snapshot().await?);

    // service-created
    let (annotations, removed) = annotations(&ctx.cloud);
    let mut svc =
        serde_json::to_value(crate::fixtures::load_balancer_service("default", "web", 80))
            .map_err(|e| fail(format!("the Service: {e}")))?;
    svc["metadata"]["annotations"] =
        Value::Object(annotations.iter().map(|(k, v)| (k.to_string(), json!(v))).collect());
    let svc: Service =
        serde_json::from_value(svc).map_err(|e| fail(format!("the Service: {e}")))?;
    ctx.services()
        .create(&PostParams::default(), &svc)
        .await
        .map_err(|e| fail(format!("creating Service default/web: {e}")))?;
    let has_lb = ctx.world.lb_field.is_some();
    let wait = if has_lb { Duration::from_secs(150) } else { Duration::from_secs(10) };
    ctx.settle(wait, move |client| async move {
        if !has_lb {
            return false;
        }
        let api: Api<Service> = Api::namespaced(client, "default");
        api.get_opt("web")
            .await
            .ok()
            .flatten()
            .and_then(|s| s.status?.load_balancer?.ingress)
            .is_some_and(|i| !i.is_empty())
    })
    .await?;
    result.snapshots.insert("service-created".into(), ctx.snapshot().await?);

    // annotation-removed
    let patch = json!({"metadata": {"annotations": {removed: null}}});
    ctx.services()
        .patch("web", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| fail(format!("removing {removed}: {e}")))?;
    ctx.settle(Duration::from_secs(10), |_| async { false }).await?;
    result.snapshots.insert("annotation-removed".into(), ctx.snapshot().await?);

    // node-added
    ctx.register(&spare.0, &spare.1, &spare.2).await?;
    ctx.settle(Duration::from_secs(120), initialised_all(vec![spare.0.clone()])).await?;
    result.snapshots.insert("node-added".into(), ctx.snapshot().await?);

    // node-removed
    ctx.nodes()
        .delete(&spare.0, &DeleteParams::default())
        .await
        .map_err(|e| fail(format!("deleting Node {}: {e}", spare.0)))?;
    ctx.settle(Duration::from_secs(30), node_gone(spare.0.clone())).await?;
    // The load balancer's members follow the Node set on the next sync.
    result.snapshots.insert("node-removed".into(), ctx.snapshot().await?);

    // service-deleted
    ctx.services()
        .delete("web", &DeleteParams::default())
        .await
        .map_err(|e| fail(format!("deleting Service default/web: {e}")))?;
    ctx.settle(Duration::from_secs(150), |client| async move {
        let api: Api<Service> = Api::namespaced(client, "default");
        matches!(api.get_opt("web").await, Ok(None))
    })
    .await?;
    result.snapshots.insert("service-deleted".into(), ctx.snapshot().await?);
    Ok(())
}

/// The whole run of a cloud: both sides, then the rows.
#[derive(Debug, Clone)]
pub struct Report {
    /// The cloud.
    pub cloud: String,
    /// Upstream's module and version.
    pub upstream: String,
    /// The swap case both ran with.
    pub artifact: String,
    /// Upstream's side.
    pub upstream_side: SideResult,
    /// Ours.
    pub ours_side: SideResult,
    /// The table's rows.
    pub rows: Vec<compare::StepRow>,
    /// The documented differences.
    pub known: compare::Known,
}

impl Report {
    /// No unexplained difference and both sides ran every step.
    pub fn passed(&self) -> bool {
        self.upstream_side.error.is_none()
            && self.ours_side.error.is_none()
            && self.rows.iter().all(|r| r.verdict() != compare::Verdict::Unexplained)
    }
}

/// Upstream's module and version for `cloud`.
pub fn upstream_version(cloud: &str) -> String {
    let (m, v) = match cloud {
        "aws" => swap::clouds::AWS,
        "openstack" => swap::clouds::OPENSTACK,
        "vsphere" => swap::clouds::VSPHERE,
        "azure" => swap::clouds::AZURE,
        other => (other, "?"),
    };
    format!("{m} {v}")
}

/// The documented differences' file of `cloud`.
pub fn known_path(cloud: &str) -> PathBuf {
    crate::tools::repo_root().join(format!("testbed/fixtures/differential/{cloud}.yaml"))
}

/// Runs `cloud`'s differential: upstream's side, then ours, under `dir`.
pub async fn run(cloud: &str, upstream_bins: Binaries, dir: &Path) -> Result<Report, DiffError> {
    let known = compare::Known::load(&known_path(cloud))?;
    let case = swap::clouds::cases(cloud)?
        .into_iter()
        .next()
        .ok_or_else(|| fail(format!("no swap case for {cloud}")))?;
    let mut upstream_bins = upstream_bins;
    // What upstream's binary needs beyond swap's mappings (Azure: AAD discovery and IMDS
    // stand-ins); kept running for the upstream side.
    let (env, guard) = crate::upstream::extra_env(cloud, &dir.join("upstream-stand-ins"))
        .map_err(|e| DiffError::Upstream { cloud: cloud.into(), detail: e.to_string() })?;
    upstream_bins.env.extend(env);
    upstream_bins.guard = guard.map(std::sync::Arc::new);
    let upstream_side = run_side(&case, &upstream_bins, &dir.join("upstream")).await;
    if let Some(g) = &upstream_bins.guard {
        for u in g.unserved() {
            tracing::warn!(request = %u, "upstream made a request nothing stands in for");
        }
    }
    let ours_side = run_side(&case, &ours(cloud), &dir.join("ours")).await;
    let steps: Vec<String> = STEPS.iter().map(|(s, _)| s.to_string()).collect();
    let rows = compare::rows(&steps, &upstream_side.snapshots, &ours_side.snapshots, &known);
    Ok(Report {
        cloud: cloud.into(),
        upstream: upstream_version(cloud),
        artifact: case.artifact.clone(),
        upstream_side,
        ours_side,
        rows,
        known,
    })
}

/// The page facts of a report.
pub fn page_facts(r: &Report) -> compare::PageFacts {
    compare::PageFacts {
        cloud: r.cloud.clone(),
        upstream: r.upstream.clone(),
        artifact: r.artifact.clone(),
        steps: STEPS.iter().map(|(s, w)| (s.to_string(), w.to_string())).collect(),
        rows: Some(r.rows.clone()),
        not_run: None,
    }
}

/// A fresh directory for a differential run.
pub fn run_dir(cloud: &str) -> PathBuf {
    let base = std::env::var_os("CCM_TESTBED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("ccm-testbed"));
    base.join(format!("differential-{}-{cloud}", std::process::id()))
}
