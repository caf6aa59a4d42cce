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
        "kubelet-like Nodes (uninitialized taint, InternalIP and Hostname, Ready) register for every instance but the spare; settled once all are initialised (and, where the manager's args allocate node CIDRs, have `podCIDRs` and, with cloud routes, `NetworkUnavailable=False`)",
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
    (
        "node-added",
        "a Node for the spare instance registers; settled once it is initialised (as in `join`)",
    ),
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

/// Upstream's binaries for `cloud`, and what they need beyond swap's mappings: the one way
/// the differential and the proof (`crate::upstream::run`) find and prepare them. The
/// binaries are in [`crate::upstream::binary_dir`] (`ci/install-tools --upstream-ccm
/// <cloud>`: built when not cached, several minutes cold); [`crate::upstream::extra_env`]
/// adds the environment (Azure: the AAD discovery and IMDS stand-ins, their files under
/// `dir`, kept running by the returned [`Binaries::guard`]).
pub fn upstream(cloud: &str, dir: &Path) -> Result<Binaries, DiffError> {
    let err = |e: crate::upstream::UpstreamError| DiffError::Upstream {
        cloud: cloud.into(),
        detail: e.to_string(),
    };
    if !CLOUDS.contains(&cloud) {
        return Err(DiffError::Upstream {
            cloud: cloud.into(),
            detail: format!("no differential for {cloud} (one of {})", CLOUDS.join(", ")),
        });
    }
    let bin_dir = crate::upstream::binary_dir(cloud).map_err(err)?;
    let manager = crate::upstream::manager_binary(cloud, &bin_dir).map_err(err)?;
    let node_manager = crate::upstream::node_manager_binary(cloud, &bin_dir).map_err(err)?;
    let (env, guard) = crate::upstream::extra_env(cloud, dir).map_err(err)?;
    Ok(Binaries {
        label: "upstream".into(),
        manager,
        node_manager,
        env,
        guard: guard.map(std::sync::Arc::new),
    })
}

/// Upstream's image has no entrypoint where the chart's args start with the binary's path
/// (OpenStack's: `args: [/bin/openstack-cloud-controller-manager, --v=2, …]`): that path is
/// the program there, not an argument, and goes (upstream's cobra command refuses positional
/// arguments; ours skips it itself).
fn drop_program_arg(bins: &Binaries, binary: &Path, argv: &mut Vec<String>) {
    if bins.label == "upstream"
        && argv
            .get(1)
            .is_some_and(|a| a.starts_with('/') && Path::new(a).file_name() == binary.file_name())
    {
        argv.remove(1);
    }
}

/// Starts `bins`' manager with the command line and environment `prepared` made from
/// upstream's chart (then `bins.env`), output to `log`: the one way both sides of the
/// differential and the proof start a manager. A pod has a network namespace of its own;
/// here the default secure port (10258) may be held by another manager on this machine: the
/// manager gets one nobody holds when the args name none (swap maps a busy port the args name
/// the same way). Returns the process and its command line.
pub fn start_manager(
    prepared: &swap::Prepared,
    bins: &Binaries,
    log: &Path,
) -> Result<(Proc, Vec<String>), DiffError> {
    let mut env = prepared.env.clone();
    env.extend(bins.env.iter().cloned());
    let mut argv = prepared.argv.clone();
    drop_program_arg(bins, &bins.manager, &mut argv);
    if swap::flag_value(&argv, "--secure-port").is_none() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| fail(format!("choosing a free secure port: {e}")))?;
        argv.push(format!("--secure-port={port}"));
    }
    let proc = Proc::spawn(&format!("{} cloud-controller-manager", bins.label), &argv, &env, log)?;
    Ok((proc, argv))
}

/// Starts `bins`' per-node manager (Azure's cloud-node-manager) as the case's per-node
/// workload's pod on `node` would run, output to `log`; None where the case or `bins` has
/// none.
pub fn start_node_manager(
    case: &Case,
    world: &World,
    prepared: &swap::Prepared,
    bins: &Binaries,
    node: &str,
    log: &Path,
) -> Result<Option<Proc>, DiffError> {
    let (Some(_), Some(nm)) = (&case.node_manager, &bins.node_manager) else { return Ok(None) };
    let (mut argv, mut env, _) = swap::node_manager_command(case, world, prepared, node, nm)?;
    drop_program_arg(bins, nm, &mut argv);
    env.extend(bins.env.iter().cloned());
    if let Some(guard) = &bins.guard {
        let node_env = world.node_env.get(node).cloned().unwrap_or_default();
        env.extend(
            guard
                .node_env(node, &node_env)
                .map_err(|e| fail(format!("upstream's environment on {node}: {e}")))?,
        );
    }
    let name = format!("{} node manager on {node}", bins.label);
    Ok(Some(Proc::spawn(&name, &argv, &env, log)?))
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
        let log = self.dir.join(format!("node-manager-{name}.log"));
        if let Some(p) =
            start_node_manager(self.case, self.world, self.prepared, self.bins, name, &log)?
        {
            self.procs.push(p);
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
                // Tokens are the emulator's bookkeeping of the sides' logins, and operations
                // its records of long-running operations (numbered in the order the side
                // started them; what they did is in the resources): not cloud state.
                o.remove("tokens_issued");
                o.remove("tokens");
                o.remove("operations");
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
    let (manager, _) = start_manager(&prepared, bins, &dir.join("ccm.log"))?;
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

/// What the manager's command line has it do for a joining Node besides initialising it, as
/// upstream's `k8s.io/cloud-provider` decides it: the node-ipam controller allocates pod CIDRs
/// with `--allocate-node-cidrs=true`, and the route controller then routes them unless
/// `--configure-cloud-routes=false`. A step waits for that too, so that both sides are
/// compared once converged: upstream's Azure manager starts node-ipam ~15 s after it starts
/// (its allocator lists the Nodes only after a first 10 s poll interval), later than the
/// cloud-node-manager initialises the Nodes, where ours allocates at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct NodeWork {
    /// `spec.podCIDRs` set.
    pub pod_cidrs: bool,
    /// `NetworkUnavailable` written (`RouteCreated`, by the route controller).
    pub routes: bool,
}

impl NodeWork {
    /// What `argv` (the manager's command line) has the manager do.
    pub fn from_argv(argv: &[String]) -> NodeWork {
        let pod_cidrs = swap::flag_value(argv, "--allocate-node-cidrs") == Some("true");
        let routes =
            pod_cidrs && swap::flag_value(argv, "--configure-cloud-routes") != Some("false");
        NodeWork { pod_cidrs, routes }
    }

    /// Whether `node` is initialised and has what this work gives it.
    pub fn done(&self, node: &Node) -> bool {
        let cidrs =
            || node.spec.as_ref().and_then(|s| s.pod_cidrs.as_ref()).is_some_and(|c| !c.is_empty());
        let routed = || {
            node.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
                cs.iter().any(|c| c.type_ == "NetworkUnavailable" && c.status == "False")
            })
        };
        swap::initialised(node) && (!self.pod_cidrs || cidrs()) && (!self.routes || routed())
    }
}

fn initialised_all(
    names: Vec<String>,
    work: NodeWork,
) -> impl FnMut(kube::Client) -> std::pin::Pin<Box<dyn std::future::Future<Output = bool> + Send>> {
    move |client| {
        let names = names.clone();
        Box::pin(async move {
            let api: Api<Node> = Api::all(client);
            for n in &names {
                match api.get_opt(n).await {
                    Ok(Some(node)) if work.done(&node) => {}
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
    let work = NodeWork::from_argv(&ctx.prepared.argv);
    ctx.settle(Duration::from_secs(180), initialised_all(names, work)).await?;
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
    ctx.settle(Duration::from_secs(180), initialised_all(vec![spare.0.clone()], work)).await?;
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

/// Runs `cloud`'s differential: upstream's side (`upstream_bins`, from [`upstream`]), then
/// ours, under `dir`.
pub async fn run(cloud: &str, upstream_bins: Binaries, dir: &Path) -> Result<Report, DiffError> {
    let known = compare::Known::load(&known_path(cloud))?;
    let case = swap::clouds::cases(cloud)?
        .into_iter()
        .next()
        .ok_or_else(|| fail(format!("no swap case for {cloud}")))?;
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
