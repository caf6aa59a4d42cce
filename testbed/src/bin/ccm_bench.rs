//! `ccm-bench`: node initialisation of cloud-controller-managers, ours and upstream's side by
//! side (issues #15, #35). `ci/bench` builds everything and calls it; run `ccm-bench --help`
//! for the knobs.
//!
//! One world per run, identical for every manager: the cloud's emulator with N instances
//! (`--cloud`: moto behind the fault proxy for AWS, vcsim behind it for vSphere, the kit's own
//! emulators for Azure, GCP, OpenStack and IBM; set up by one module per cloud,
//! `src/bench/cloud/`), whose admin API adds a fixed latency to every cloud call and counts
//! calls by operation; a fresh kube-apiserver + etcd with N kubelet-realistic Nodes
//! (`ccm_testbed::bench::node`, registered at once, before the manager starts; `--minimal-nodes`
//! for the old minimal ones); then the manager under test with the same flags.
//!
//! `ccm-bench run` measures one manager and appends one JSON line to `--results`;
//! `ccm-bench report` turns those lines into `docs/benchmarks.md` (table and SVG chart).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

#[path = "../bench/cloud/mod.rs"]
mod cloud;

use anyhow::Context as _;
use ccm_testbed::ControlPlane;
use clap::{Parser, Subcommand};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::PostParams;
use kube::runtime::watcher;
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use cloud::aws::CLUSTER;
/// Everything from this line on in docs/benchmarks.md is kept by `report`.
const NOTES_MARKER: &str = "<!-- notes: kept by `ccm-bench report` -->\n";

#[derive(Debug, Parser)]
#[command(name = "ccm-bench", about = "Benchmark cloud-controller-managers side by side")]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Measure managers on identical worlds; one JSON line per manager into --results.
    Run(Box<RunArgs>),
    /// Render docs/benchmarks.md from the JSON lines.
    Report {
        /// The JSON lines written by `run`.
        #[arg(long)]
        results: PathBuf,
        /// Where to write the Markdown.
        #[arg(long)]
        out: PathBuf,
        /// A line about the machine (printed in the page).
        #[arg(long, default_value = "")]
        machine: String,
    },
}

#[derive(Debug, clap::Args)]
struct RunArgs {
    /// Managers to run one after the other, as `label=path` (e.g. `ours=target/release/...`).
    #[arg(long = "ccm", required = true)]
    ccms: Vec<String>,
    /// The cloud whose emulator the managers run against.
    #[arg(long, value_enum, default_value = "aws")]
    cloud: cloud::Cloud,
    /// The `ccm-emulator` binary (the clouds' emulators, and the fault proxy in front of moto
    /// and vcsim).
    #[arg(long)]
    emulator: PathBuf,
    /// Register the old minimal Nodes (name, InternalIP, Ready, the taint: ~0.5 KB) instead
    /// of kubelet-realistic ones (~10 KB).
    #[arg(long)]
    minimal_nodes: bool,
    /// Number of instances and Nodes.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Latency added to every cloud call, in milliseconds (without --profile).
    #[arg(long, default_value_t = 200)]
    latency_ms: u64,
    /// The cloud's latency profile: per-call latency of reads and writes and the times of
    /// its long-running operations (`src/bench/cloud/profile.rs`); replaces --latency-ms.
    #[arg(long, value_enum)]
    profile: Option<cloud::profile::Profile>,
    /// Idle window after initialisation in which cloud calls are counted, in seconds.
    #[arg(long, default_value_t = 300)]
    idle_secs: u64,
    /// Give up on initialisation after this many seconds.
    #[arg(long, default_value_t = 1800)]
    timeout_secs: u64,
    /// --kube-api-qps for every manager.
    #[arg(long, default_value = "20")]
    kube_api_qps: String,
    /// --kube-api-burst for every manager.
    #[arg(long, default_value = "30")]
    kube_api_burst: String,
    /// --concurrent-node-syncs for every manager (`label=value` overrides one manager).
    #[arg(long, default_value = "1")]
    concurrent_node_syncs: Vec<String>,
    /// --concurrent-service-syncs for every manager (`label=value` overrides one manager).
    #[arg(long, default_value = "1")]
    concurrent_service_syncs: Vec<String>,
    /// Where the JSON lines go (appended).
    #[arg(long)]
    results: PathBuf,
    /// Working directory (configs, logs).
    #[arg(long)]
    dir: PathBuf,
    /// A tag stored with each result (e.g. `before`, `after`).
    #[arg(long, default_value = "")]
    tag: String,
    /// Profile each manager's initialisation with `perf record` (written next to its log,
    /// with the top entries of `perf report` in `<label>.perf.txt`).
    #[arg(long)]
    perf: bool,
    /// Load-balancer phase: this many LoadBalancer Services created at once, timed until
    /// every one has an address (0: no load-balancer phase).
    #[arg(long, default_value_t = 100)]
    lb_services: usize,
    /// Load-balancer phase: Services brought to this total (cloud latency off while they
    /// are set up), then one Node added and timed until every load balancer has it, then a
    /// Ready flap of a Node whose load-balancer calls are counted (0: skip this part).
    #[arg(long, default_value_t = 1000)]
    lb_present: usize,
    /// Managers (labels) that skip the load-balancer phase.
    #[arg(long)]
    lb_skip: Vec<String>,
    /// Give up on each load-balancer wait after this many seconds (what was reached by then
    /// is recorded).
    #[arg(long, default_value_t = 900)]
    lb_timeout_secs: u64,
    /// Load-balancer phase: Ready flaps (False, then True) of a Node in every load balancer,
    /// whose load-balancer calls are counted (0: none).
    #[arg(long, default_value_t = 10)]
    lb_flaps: usize,
}

/// One manager's figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RunResult {
    /// The cloud (absent in the AWS-only lines before issue #35).
    #[serde(default = "aws")]
    cloud: String,
    /// `kubelet` (realistic Nodes) or `minimal` (the lines before issue #35).
    #[serde(default = "minimal")]
    node_kind: String,
    /// Bytes of one stored Node as the apiserver returns it (JSON, managedFields included).
    #[serde(default)]
    node_bytes: Option<u64>,
    /// The largest page of the cloud's instance list (None: per-Node lookups).
    #[serde(default)]
    page: Option<usize>,
    label: String,
    tag: String,
    date: String,
    nodes: usize,
    latency_ms: u64,
    /// The latency profile (absent: a uniform `latency_ms` on every call).
    #[serde(default)]
    profile: Option<String>,
    /// What the profile meant on this cloud, and its sources.
    #[serde(default)]
    profile_plan: Option<String>,
    #[serde(default)]
    profile_sources: Vec<String>,
    flags: Vec<String>,
    initialised: usize,
    all_initialised_s: Option<f64>,
    p50_s: Option<f64>,
    p99_s: Option<f64>,
    cloud_calls_init: BTreeMap<String, u64>,
    api_requests_init: BTreeMap<String, u64>,
    idle_secs: u64,
    idle_cloud_calls: BTreeMap<String, u64>,
    cpu_s_init: f64,
    cpu_s_total: f64,
    peak_rss_mb: f64,
    /// The load-balancer phase (absent when not run).
    #[serde(default)]
    lb: Option<LbResult>,
}

/// Figures of the load-balancer phase.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct LbResult {
    /// Seconds until ONE Service created alone had an address (the yardstick of `created`).
    #[serde(default)]
    one_create_s: Option<f64>,
    #[serde(default)]
    one_create_calls: BTreeMap<String, u64>,
    /// Seconds from the one create until its load balancer was provisioned, and from the
    /// creation of the many until all were (IBM: the hostname comes before; None elsewhere).
    #[serde(default)]
    one_active_s: Option<f64>,
    #[serde(default)]
    created_active_s: Option<f64>,
    /// Services created at once, and seconds until all had an address (`None`: timed out).
    created: usize,
    created_all_s: Option<f64>,
    created_calls: BTreeMap<String, u64>,
    /// Services present when the Node was added.
    present: usize,
    /// Seconds to set up the Services present (cloud latency off; not a figure of merit).
    setup_s: Option<f64>,
    /// Seconds from the new Node's registration until every load balancer had its instance.
    node_added_all_s: Option<f64>,
    /// Load balancers that had the new Node when the wait ended.
    #[serde(default)]
    node_added_reached: usize,
    /// Services with an address when the creation wait ended.
    #[serde(default)]
    created_reached: usize,
    node_added_calls: BTreeMap<String, u64>,
    /// Cloud calls during `flaps` Ready flaps of a Node (False, then True, 2 s apart) and
    /// 20 s after.
    ready_flap_calls: BTreeMap<String, u64>,
    /// Ready flaps.
    #[serde(default)]
    flaps: usize,
    /// Load-balancer calls among `ready_flap_calls` (target 0).
    #[serde(default)]
    ready_flap_lb_calls: u64,
    /// Seconds waited before the flaps for the load-balancer calls to stop (10 s quiet).
    #[serde(default)]
    flap_settle_s: Option<f64>,
    /// Peak RSS (MB) and CPU seconds of the manager at the end of the phase.
    peak_rss_mb: f64,
    cpu_s: f64,
    /// The limit of each wait (`--lb-timeout-secs`).
    #[serde(default)]
    timeout_secs: u64,
}

fn aws() -> String {
    "aws".into()
}

fn minimal() -> String {
    "minimal".into()
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().cmd {
        Cmd::Run(args) => run(*args).await,
        Cmd::Report { results, out, machine } => report(&results, &out, &machine),
    }
}

fn progress(msg: impl AsRef<str>) {
    eprintln!("[{}] {}", now_utc(), msg.as_ref());
}

fn now_utc() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%H:%M:%S"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn today_utc() -> String {
    std::process::Command::new("date")
        .args(["-u", "+%Y-%m-%d %H:%M UTC"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

async fn cloud_counters(admin: &cloud::Admin) -> anyhow::Result<BTreeMap<String, u64>> {
    let v: serde_json::Value = serde_json::from_str(&admin.call("GET", "counters", "").await?)?;
    Ok(v.get("operations")
        .and_then(|o| o.as_object())
        .map(|o| o.iter().map(|(k, v)| (k.clone(), v.as_u64().unwrap_or(0))).collect())
        .unwrap_or_default())
}

fn diff(after: &BTreeMap<String, u64>, before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(before.get(k).copied().unwrap_or(0))))
        .filter(|(_, v)| *v > 0)
        .collect()
}

/// `apiserver_request_total` summed by `VERB resource[/subresource]`.
async fn api_requests(client: &kube::Client) -> anyhow::Result<BTreeMap<String, u64>> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = client.request_text(req).await.context("reading the apiserver's /metrics")?;
    let mut out = BTreeMap::new();
    for line in text.lines() {
        let Some(rest) = line.strip_prefix("apiserver_request_total{") else { continue };
        let Some((labels, value)) = rest.rsplit_once("} ") else { continue };
        let label = |name: &str| {
            labels
                .split(',')
                .find_map(|kv| kv.strip_prefix(&format!("{name}=\"")))
                .map(|v| v.trim_end_matches('"').to_string())
                .unwrap_or_default()
        };
        let resource = label("resource");
        if resource.is_empty() {
            continue;
        }
        let sub = label("subresource");
        let key = if sub.is_empty() {
            format!("{} {resource}", label("verb"))
        } else {
            format!("{} {resource}/{sub}", label("verb"))
        };
        *out.entry(key).or_insert(0) += value.trim().parse::<f64>().unwrap_or(0.0) as u64;
    }
    Ok(out)
}

/// CPU seconds (user + system) and peak RSS in MB of a process, from /proc.
fn proc_stats(pid: u32) -> Option<(f64, f64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after = stat.rsplit_once(") ")?.1;
    let f: Vec<&str> = after.split_whitespace().collect();
    let ticks = f.get(11)?.parse::<f64>().ok()? + f.get(12)?.parse::<f64>().ok()?;
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let hwm_kb = status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())?;
    Some((ticks / 100.0, hwm_kb / 1024.0))
}

fn percentile(sorted: &[f64], p: f64) -> Option<f64> {
    if sorted.is_empty() {
        return None;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted.get(i).copied()
}

fn tainted(node: &Node) -> bool {
    node.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == ccm_core::names::TAINT_UNINITIALIZED))
}

async fn run(args: RunArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    progress(format!(
        "setting up {} with {} instances ({})",
        args.cloud.name(),
        args.nodes,
        match args.profile {
            Some(p) =>
                format!("profile {}: {}", p.name(), cloud::profile::plan(args.cloud, p).describe()),
            None => format!("{} ms per cloud call", args.latency_ms),
        }
    ));
    let started = Instant::now();
    let setup = cloud::Setup {
        nodes: args.nodes,
        dir: &args.dir,
        emulator: &args.emulator,
        lb_capacity: args.lb_present.max(args.lb_services + 1),
        spare: args.lb_services > 0 && args.lb_present > args.lb_services + 1,
    };
    let world = cloud::start(args.cloud, &setup).await?;
    for note in &world.notes {
        progress(format!("world: {note}"));
    }
    progress(format!(
        "{} instances in {:.0} s",
        world.nodes.len(),
        started.elapsed().as_secs_f64()
    ));
    for spec in &args.ccms {
        let (label, path) = spec.split_once('=').context("--ccm wants label=path")?;
        let result = run_one(&args, label, Path::new(path), &world).await?;
        let line = serde_json::to_string(&result)?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&args.results)
            .with_context(|| format!("opening {}", args.results.display()))?;
        std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes())?;
        print_result(&result);
    }
    drop(world);
    Ok(())
}

fn print_result(r: &RunResult) {
    let calls: u64 = r.cloud_calls_init.values().sum();
    let idle: u64 = r.idle_cloud_calls.values().sum();
    println!(
        "{} [{}] N={} all initialised {} s, p50 {} s, p99 {} s, cloud calls {} {:?}, idle {:.1}/min, CPU {:.1} s (init {:.1} s), peak RSS {:.0} MB",
        r.label,
        r.tag,
        r.nodes,
        fmt_opt(r.all_initialised_s),
        fmt_opt(r.p50_s),
        fmt_opt(r.p99_s),
        calls,
        r.cloud_calls_init,
        idle as f64 * 60.0 / r.idle_secs.max(1) as f64,
        r.cpu_s_total,
        r.cpu_s_init,
        r.peak_rss_mb
    );
    println!("  apiserver requests during init: {:?}", r.api_requests_init);
    println!("  flags: {}", r.flags.join(" "));
    if let Some(p) = &r.profile {
        println!("  profile {p}: {}", r.profile_plan.as_deref().unwrap_or_default());
    }
    if let Some(lb) = &r.lb {
        let sum = |m: &BTreeMap<String, u64>| m.values().sum::<u64>();
        let ratio = match (lb.created_all_s, lb.one_create_s) {
            (Some(a), Some(o)) if o > 0.0 => format!("{:.2}", a / o),
            _ => "—".into(),
        };
        println!(
            "  (b) one Service alone: address in {} s ({} cloud calls); {} at once: all in {} s ({} of {} reached, {} cloud calls); ratio {ratio} (target ≤ 2)",
            fmt_opt(lb.one_create_s),
            sum(&lb.one_create_calls),
            lb.created,
            fmt_opt(lb.created_all_s),
            lb.created_reached,
            lb.created,
            sum(&lb.created_calls)
        );
        if lb.one_active_s.is_some() || lb.created_active_s.is_some() {
            println!(
                "  (b) provisioned in the cloud: one alone {} s, {} at once {} s",
                fmt_opt(lb.one_active_s),
                lb.created,
                fmt_opt(lb.created_active_s)
            );
        }
        if r.cloud == "ibm" {
            println!(
                "  #33 item 11 (IBM): {} Services created at once got their hostnames in {} s, one alone in {} s: {ratio}× the time of one create",
                lb.created,
                fmt_opt(lb.created_all_s),
                fmt_opt(lb.one_create_s)
            );
        }
        if lb.present > 0 {
            println!(
                "  (a) one Node joins {} load balancers: all have it in {} s ({} had it), {} cloud calls {:?}",
                lb.present,
                fmt_opt(lb.node_added_all_s),
                lb.node_added_reached,
                sum(&lb.node_added_calls),
                lb.node_added_calls
            );
        }
        if lb.flaps > 0 {
            println!(
                "  (c) {} Ready flaps: {} load-balancer calls (target 0), all cloud calls {:?}",
                lb.flaps, lb.ready_flap_lb_calls, lb.ready_flap_calls
            );
        }
    }
}

/// `--kube-api-qps` of a run (20 when absent).
fn qps_of(r: &RunResult) -> f64 {
    r.flags
        .iter()
        .find_map(|f| f.strip_prefix("--kube-api-qps="))
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(20.0)
}

fn fmt_opt(v: Option<f64>) -> String {
    v.map(|v| format!("{v:.1}")).unwrap_or_else(|| "—".into())
}

async fn run_one(
    args: &RunArgs,
    label: &str,
    ccm: &Path,
    world: &cloud::World,
) -> anyhow::Result<RunResult> {
    let (admin, nodes) = (&world.admin, &world.nodes);
    let config = &world.config;
    let dir = args.dir.join(label);
    std::fs::create_dir_all(&dir)?;
    progress(format!("[{label}] starting a fresh control plane"));
    // A /16 of Service IPs: the load-balancer phase creates a thousand Services.
    let options = ccm_testbed::StartOptions {
        service_cidr: Some("10.96.0.0/16".into()),
        ..Default::default()
    };
    let tools = ccm_testbed::tools::Tools::locate().context("locating the tools")?;
    let cp = ControlPlane::start_with_options(tools, options)
        .await
        .context("starting the control plane")?;
    let client = cp.admin_client().await?;
    let api: kube::Api<Node> = kube::Api::all(client.clone());
    let t = Instant::now();
    let minimal = args.minimal_nodes;
    futures::stream::iter(nodes.iter().cloned())
        .map(|(name, ip)| {
            let api = api.clone();
            async move { register(&api, &name, &ip, world.system_uuids.get(&name), minimal).await }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    // One stored Node as a client reads it (JSON, managedFields included).
    let node_bytes = match nodes.first() {
        Some((name, _)) => {
            let req = http::Request::get(format!("/api/v1/nodes/{name}")).body(Vec::new())?;
            Some(client.request_text(req).await.context("reading a Node")?.len() as u64)
        }
        None => None,
    };
    progress(format!(
        "[{label}] {} {} Nodes ({} bytes each as stored) registered in {:.1} s",
        nodes.len(),
        if minimal { "minimal" } else { "kubelet-realistic" },
        node_bytes.unwrap_or(0),
        t.elapsed().as_secs_f64()
    ));

    // Watch the Nodes (the watch is open before the manager starts and before the first
    // metrics snapshot, so its LIST is not counted).
    let done: std::sync::Arc<std::sync::Mutex<HashMap<String, f64>>> = Default::default();
    let start_cell: std::sync::Arc<std::sync::Mutex<Option<Instant>>> = Default::default();
    let watch = {
        let done = done.clone();
        let start_cell = start_cell.clone();
        let api = api.clone();
        tokio::spawn(async move {
            let stream = watcher(api, watcher::Config::default());
            futures::pin_mut!(stream);
            while let Some(ev) = stream.next().await {
                let objs: Vec<Node> = match ev {
                    Ok(watcher::Event::Apply(n)) | Ok(watcher::Event::InitApply(n)) => vec![n],
                    _ => continue,
                };
                let started = *start_cell.lock().unwrap_or_else(|p| p.into_inner());
                let Some(started) = started else { continue };
                for n in objs {
                    if !tainted(&n) {
                        let name = n.metadata.name.clone().unwrap_or_default();
                        done.lock()
                            .unwrap_or_else(|p| p.into_inner())
                            .entry(name)
                            .or_insert_with(|| started.elapsed().as_secs_f64());
                    }
                }
            }
        })
    };
    tokio::time::sleep(Duration::from_secs(2)).await;

    admin.call("POST", "reset", "").await?;
    let plan = args.profile.map(|p| cloud::profile::plan(args.cloud, p));
    let lat = match &plan {
        Some(p) => Latency::Plan(p),
        None => Latency::Uniform(args.latency_ms),
    };
    set_latency(world, args.cloud, lat).await?;
    let api_before = api_requests(&client).await?;

    let node_syncs = args
        .concurrent_node_syncs
        .iter()
        .rev()
        .find_map(|v| match v.split_once('=') {
            Some((l, v)) if l == label => Some(v.to_string()),
            None => Some(v.clone()),
            _ => None,
        })
        .unwrap_or_else(|| "1".into());
    let service_syncs = args
        .concurrent_service_syncs
        .iter()
        .rev()
        .find_map(|v| match v.split_once('=') {
            Some((l, v)) if l == label => Some(v.to_string()),
            None => Some(v.clone()),
            _ => None,
        })
        .unwrap_or_else(|| "1".into());
    let flags = vec![
        format!("--kube-api-qps={}", args.kube_api_qps),
        format!("--kube-api-burst={}", args.kube_api_burst),
        format!("--concurrent-node-syncs={node_syncs}"),
        format!("--concurrent-service-syncs={service_syncs}"),
        "--leader-elect=false".to_string(),
        "--configure-cloud-routes=false".to_string(),
    ];
    let kubeconfig = dir.join("ccm.kubeconfig");
    cp.write_kubeconfig(&kubeconfig, &ccm_testbed::Identity::admin())?;
    let log = dir.join("ccm.log");
    let mut child = tokio::process::Command::new(ccm)
        .arg(format!("--cloud-provider={}", world.provider))
        .arg(format!("--cloud-config={}", config.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(&flags)
        .args(&world.args)
        .args(["--secure-port=0", "--webhook-secure-port=0"])
        .envs(world.env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
        .stdin(std::process::Stdio::null())
        .stdout(std::fs::File::create(dir.join("ccm.stdout"))?)
        .stderr(std::fs::File::create(&log)?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", ccm.display()))?;
    let pid = child.id().context("the manager has no pid")?;
    let started = Instant::now();
    *start_cell.lock().unwrap_or_else(|p| p.into_inner()) = Some(started);
    progress(format!("[{label}] started {} (pid {pid}), log {}", ccm.display(), log.display()));

    let perf = if args.perf {
        let data = dir.join(format!("{label}.perf.data"));
        tokio::process::Command::new("perf")
            .args(["record", "-F", "499", "-g", "-o"])
            .arg(&data)
            .args(["-p", &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| progress(format!("[{label}] perf not started: {e}")))
            .ok()
            .map(|c| (c, data))
    } else {
        None
    };
    let total = nodes.len();
    let mut last_print = Instant::now();
    let all_initialised_s = loop {
        let n = done.lock().unwrap_or_else(|p| p.into_inner()).len();
        if n >= total {
            break Some(started.elapsed().as_secs_f64());
        }
        if let Ok(Some(status)) = child.try_wait() {
            anyhow::bail!("[{label}] the manager exited with {status}; see {}", log.display());
        }
        if started.elapsed() > Duration::from_secs(args.timeout_secs) {
            progress(format!("[{label}] gave up after {} s with {n}/{total}", args.timeout_secs));
            break None;
        }
        if last_print.elapsed() >= Duration::from_secs(5) {
            progress(format!(
                "[{label}] initialising: {n}/{total} after {:.0} s",
                started.elapsed().as_secs_f64()
            ));
            last_print = Instant::now();
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    if let Some((mut perf, data)) = perf {
        if let Some(id) = perf.id() {
            let _ = std::process::Command::new("kill").args(["-INT", &id.to_string()]).status();
        }
        let _ = perf.wait().await;
        let report = std::process::Command::new("perf")
            .args([
                "report",
                "--stdio",
                "--no-children",
                "--sort",
                "dso,symbol",
                "--percent-limit",
                "0.7",
                "-g",
                "none",
                "-i",
            ])
            .arg(&data)
            .output();
        if let Ok(out) = report {
            let txt = dir.join(format!("{label}.perf.txt"));
            let text: String = String::from_utf8_lossy(&out.stdout)
                .lines()
                .map(|l| format!("{}\n", l.trim_end()))
                .collect();
            let _ = std::fs::write(&txt, text);
            progress(format!("[{label}] profile of the initialisation: {}", txt.display()));
        }
    }
    let cloud_calls_init = cloud_counters(admin).await?;
    let api_requests_init = diff(&api_requests(&client).await?, &api_before);
    let (cpu_s_init, _) = proc_stats(pid).unwrap_or_default();
    let mut times: Vec<f64> =
        done.lock().unwrap_or_else(|p| p.into_inner()).values().copied().collect();
    times.sort_by(f64::total_cmp);
    progress(format!(
        "[{label}] all initialised after {} s; idle window {} s",
        fmt_opt(all_initialised_s),
        args.idle_secs
    ));

    let idle_start = cloud_counters(admin).await?;
    let idle_until = Instant::now() + Duration::from_secs(args.idle_secs);
    while Instant::now() < idle_until {
        tokio::time::sleep(Duration::from_secs(30).min(idle_until - Instant::now())).await;
        let calls: u64 = diff(&cloud_counters(admin).await?, &idle_start).values().sum();
        progress(format!("[{label}] idle: {calls} cloud calls so far"));
    }
    let idle_cloud_calls = diff(&cloud_counters(admin).await?, &idle_start);
    let (cpu_s_total, peak_rss_mb) = proc_stats(pid).unwrap_or_default();
    // The load-balancer phase: every cloud with load balancers (not vSphere).
    let lb = if args.lb_services > 0
        && args.cloud != cloud::Cloud::Vsphere
        && !args.lb_skip.iter().any(|l| l == label)
    {
        match lb_phase(args, label, &client, world, pid, &mut child, lat).await {
            Ok(r) => Some(r),
            Err(e) => {
                progress(format!("[{label}] load-balancer phase failed: {e:#}"));
                None
            }
        }
    } else {
        None
    };
    let _ = child.kill().await;
    watch.abort();
    drop(cp);

    Ok(RunResult {
        cloud: args.cloud.name().to_string(),
        node_kind: if minimal { "minimal" } else { "kubelet" }.to_string(),
        node_bytes,
        page: world.page,
        label: label.to_string(),
        tag: args.tag.clone(),
        date: today_utc(),
        nodes: total,
        latency_ms: plan.as_ref().map_or(args.latency_ms, |p| p.reads_ms),
        profile: args.profile.map(|p| p.name().to_string()),
        profile_plan: plan.as_ref().map(|p| p.describe()),
        profile_sources: plan
            .as_ref()
            .map(|p| p.sources.iter().map(|s| s.to_string()).collect())
            .unwrap_or_default(),
        flags,
        initialised: times.len(),
        all_initialised_s,
        p50_s: percentile(&times, 0.50),
        p99_s: percentile(&times, 0.99),
        cloud_calls_init,
        api_requests_init,
        idle_secs: args.idle_secs,
        idle_cloud_calls,
        cpu_s_init,
        cpu_s_total,
        peak_rss_mb,
        lb,
    })
}

/// Seconds until `done()` (polled every `every`) is true, or `None` after `timeout`; prints
/// progress from `what()` every 10 s.
async fn wait_until<F, Fut>(
    label: &str,
    timeout: Duration,
    every: Duration,
    mut done: F,
) -> anyhow::Result<Option<f64>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<(bool, String)>>,
{
    let t = Instant::now();
    let mut last = Instant::now();
    loop {
        let (ok, what) = done().await?;
        if ok {
            return Ok(Some(t.elapsed().as_secs_f64()));
        }
        if t.elapsed() > timeout {
            progress(format!("[{label}] gave up after {} s: {what}", timeout.as_secs()));
            return Ok(None);
        }
        if last.elapsed() >= Duration::from_secs(10) {
            progress(format!("[{label}] {what} after {:.0} s", t.elapsed().as_secs_f64()));
            last = Instant::now();
        }
        tokio::time::sleep(every).await;
    }
}

/// Creates LoadBalancer Services named `names` in `default`, 32 at a time.
async fn create_services(client: &kube::Client, names: &[String]) -> anyhow::Result<()> {
    let api: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), "default");
    futures::stream::iter(names)
        .map(|name| {
            let api = api.clone();
            async move {
                let svc = ccm_testbed::fixtures::load_balancer_service("default", name, 80);
                api.create(&PostParams::default(), &svc)
                    .await
                    .with_context(|| format!("creating Service {name}"))
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    Ok(())
}

/// The load balancer names of the Services with an address, and how many Services there are.
async fn services_with_address(client: &kube::Client) -> anyhow::Result<(Vec<String>, usize)> {
    let api: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), "default");
    let list = api.list(&Default::default()).await.context("listing Services")?;
    let lbs: Vec<_> = list
        .items
        .iter()
        .filter(|s| s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer"))
        .collect();
    let with_address = lbs
        .iter()
        .filter(|s| {
            s.status
                .as_ref()
                .and_then(|s| s.load_balancer.as_ref())
                .and_then(|l| l.ingress.as_ref())
                .is_some_and(|i| !i.is_empty())
        })
        .map(|s| ccm_core::cloud::default_load_balancer_name(s))
        .collect();
    Ok((with_address, lbs.len()))
}

/// The cloud's timing in a phase of the benchmark.
#[derive(Clone, Copy)]
enum Latency<'a> {
    /// No added latency and every long-running operation done at once (setting up).
    Off,
    /// `ms` on every call, operations on the emulator's realistic table (part 1's setting).
    Uniform(u64),
    /// A per-cloud profile: reads and writes apart, the profile's operation times.
    Plan(&'a cloud::profile::Plan),
}

/// The per-call latency rules and the operation timing on the cloud's admin API. On AWS also
/// the proxy's answer to DescribeInstanceTopology: moto has none (upstream asks it for every
/// Node of a supported instance type, and retries moto's 500 three times with backoff, which
/// no real region makes it do), so the proxy answers it with an empty topology, without
/// latency.
async fn set_latency(
    world: &cloud::World,
    cloud: cloud::Cloud,
    lat: Latency<'_>,
) -> anyhow::Result<()> {
    let admin = &world.admin;
    admin.call("DELETE", "faults", "").await?;
    if world.aws.is_some() {
        let topology = serde_json::json!({"match": "*DescribeInstanceTopology", "fault": {
            "kind": "status", "status": 200,
            "body": "<DescribeInstanceTopologyResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>bench</requestId><instanceSet/></DescribeInstanceTopologyResponse>"
        }});
        admin.call("POST", "faults", &topology.to_string()).await?;
    }
    // Whether this cloud's emulator has long-running operations (the kit's, not moto/vcsim).
    let has_timing = cloud::profile::plan(cloud, cloud::profile::Profile::Fast).timing.is_some();
    let (rules, timing) = match lat {
        Latency::Off => (Vec::new(), Some(serde_json::json!({"profile": "fast", "scale": 0.0}))),
        Latency::Uniform(ms) => (
            if ms > 0 {
                vec![serde_json::json!({"match": "*", "fault": {"kind": "latency", "ms": ms}})]
            } else {
                Vec::new()
            },
            Some(serde_json::json!({"profile": "realistic", "scale": 1.0})),
        ),
        Latency::Plan(plan) => (cloud::profile::latency_rules(plan), plan.timing_body()),
    };
    for rule in rules {
        admin.call("POST", "faults", &rule.to_string()).await?;
    }
    if has_timing && let Some(t) = timing {
        admin.call("POST", "timing", &t.to_string()).await?;
    }
    Ok(())
}

/// Registers one Node as a kubelet does: created as the `kubelet` field manager, then its
/// first status update (conditions, images) patched into `nodes/status`; or the old minimal
/// Node in one create. `system_uuid`: what its kubelet reports, where the world knows it
/// ([`cloud::World::system_uuids`]).
async fn register(
    api: &kube::Api<Node>,
    name: &str,
    ip: &str,
    system_uuid: Option<&String>,
    minimal: bool,
) -> anyhow::Result<()> {
    use ccm_testbed::bench::node;
    let with_uuid = |mut n: Node| {
        if let Some(uuid) = system_uuid {
            let status = n.status.get_or_insert_with(Default::default);
            status.node_info.get_or_insert_with(Default::default).system_uuid = uuid.clone();
        }
        n
    };
    if minimal {
        let n = with_uuid(ccm_testbed::fixtures::kubelet_node(name, ip, "True"));
        api.create(&PostParams::default(), &n)
            .await
            .with_context(|| format!("registering {name}"))?;
        return Ok(());
    }
    let pp = PostParams { field_manager: Some(node::FIELD_MANAGER.into()), ..Default::default() };
    api.create(&pp, &with_uuid(node::kubelet_node(name, ip)))
        .await
        .with_context(|| format!("registering {name}"))?;
    let patch = kube::api::PatchParams {
        field_manager: Some(node::FIELD_MANAGER.into()),
        ..Default::default()
    };
    api.patch_status(name, &patch, &kube::api::Patch::Strategic(node::kubelet_status_patch(name)))
        .await
        .with_context(|| format!("the first status update of {name}"))?;
    Ok(())
}

/// Seconds until `want` Services have an address (None after `limit`), and how many had one
/// when the wait ended.
async fn wait_addresses(
    label: &str,
    client: &kube::Client,
    want: usize,
    limit: Duration,
    every: Duration,
) -> anyhow::Result<(Option<f64>, usize)> {
    let t = wait_until(label, limit, every, || async move {
        let (done, _) = services_with_address(client).await?;
        Ok((done.len() >= want, format!("{}/{want} Services have an address", done.len())))
    })
    .await?;
    Ok((t, services_with_address(client).await?.0.len()))
}

/// Seconds from `t0` until `want` of the cloud's load balancers are provisioned (polled from
/// the emulator's state every 2 s; None after `limit` or where the bench cannot tell).
async fn wait_active(
    label: &str,
    cloud: cloud::Cloud,
    admin: &cloud::Admin,
    want: usize,
    limit: Duration,
    t0: Instant,
) -> anyhow::Result<Option<f64>> {
    let state: serde_json::Value = serde_json::from_str(&admin.call("GET", "state", "").await?)?;
    if cloud::lbs_active(cloud, &state).is_none() {
        return Ok(None);
    }
    let done = wait_until(label, limit, Duration::from_secs(2), || async move {
        let state: serde_json::Value =
            serde_json::from_str(&admin.call("GET", "state", "").await?)?;
        let (_, active) = cloud::lbs_active(cloud, &state).unwrap_or_default();
        Ok((active >= want, format!("{active}/{want} load balancers provisioned")))
    })
    .await?;
    Ok(done.map(|_| t0.elapsed().as_secs_f64()))
}

/// The load-balancer phase (issue #35 part 2):
/// - (b) one Service created alone, timed until it has an address; then `--lb-services`
///   created at once, timed until all have one (target: within 2× the one create);
/// - (a) Services brought to `--lb-present` (cloud latency and operation times off
///   meanwhile), one Node joins (AWS: a new instance; the kit's clouds: the spare instance),
///   timed until every load balancer has it, with the cloud calls;
/// - (c) `--lb-flaps` Ready flaps of that Node (False, then True): the cloud calls, and the
///   load-balancer calls among them (target 0).
#[allow(clippy::too_many_arguments)]
async fn lb_phase(
    args: &RunArgs,
    label: &str,
    client: &kube::Client,
    world: &cloud::World,
    pid: u32,
    child: &mut tokio::process::Child,
    lat: Latency<'_>,
) -> anyhow::Result<LbResult> {
    let admin = &world.admin;
    let mut r = LbResult {
        created: args.lb_services,
        timeout_secs: args.lb_timeout_secs,
        ..Default::default()
    };
    let limit = Duration::from_secs(args.lb_timeout_secs);

    // (b) One create alone, then many at once, on the same profile.
    progress(format!("[{label}] load balancers: one Service alone"));
    let before = cloud_counters(admin).await?;
    let t0 = Instant::now();
    create_services(client, &["lb-one".to_string()]).await?;
    (r.one_create_s, _) =
        wait_addresses(label, client, 1, limit, Duration::from_millis(250)).await?;
    r.one_active_s = wait_active(label, args.cloud, admin, 1, limit, t0).await?;
    r.one_create_calls = diff(&cloud_counters(admin).await?, &before);
    progress(format!(
        "[{label}] one load balancer in {} s ({} cloud calls)",
        fmt_opt(r.one_create_s),
        r.one_create_calls.values().sum::<u64>()
    ));
    progress(format!("[{label}] load balancers: creating {} Services at once", args.lb_services));
    let before = cloud_counters(admin).await?;
    let names: Vec<String> = (0..args.lb_services).map(|i| format!("lb-{i}")).collect();
    let t0 = Instant::now();
    create_services(client, &names).await?;
    let want = args.lb_services + 1;
    let (t, reached) =
        wait_addresses(label, client, want, limit, Duration::from_millis(500)).await?;
    r.created_all_s = t;
    r.created_reached = reached.saturating_sub(1);
    r.created_active_s = wait_active(label, args.cloud, admin, want, limit, t0).await?;
    if r.one_active_s.is_some() || r.created_active_s.is_some() {
        progress(format!(
            "[{label}] provisioned: one alone {} s, {} at once {} s",
            fmt_opt(r.one_active_s),
            args.lb_services,
            fmt_opt(r.created_active_s)
        ));
    }
    r.created_calls = diff(&cloud_counters(admin).await?, &before);
    progress(format!(
        "[{label}] {} load balancers at once in {} s; one alone took {} s (ratio {})",
        args.lb_services,
        fmt_opt(r.created_all_s),
        fmt_opt(r.one_create_s),
        match (r.created_all_s, r.one_create_s) {
            (Some(a), Some(o)) if o > 0.0 => format!("{:.2}, target ≤ 2", a / o),
            _ => "—".into(),
        }
    ));
    if let Ok(Some(status)) = child.try_wait() {
        anyhow::bail!("the manager exited with {status}");
    }

    // (a) Many load balancers, one Node joins.
    let api: kube::Api<Node> = kube::Api::all(client.clone());
    let mut flap_node = world.nodes.first().map(|n| n.0.clone());
    if args.lb_present > args.lb_services + 1 {
        let present = args.lb_present;
        progress(format!(
            "[{label}] load balancers: setting up {present} in all (cloud latency and operation times off meanwhile)"
        ));
        set_latency(world, args.cloud, Latency::Off).await?;
        let t = Instant::now();
        let names: Vec<String> =
            (args.lb_services..present.saturating_sub(1)).map(|i| format!("lb-{i}")).collect();
        create_services(client, &names).await?;
        let (setup, _) =
            wait_addresses(label, client, present, limit * 2, Duration::from_secs(2)).await?;
        r.setup_s = setup.map(|_| t.elapsed().as_secs_f64());
        set_latency(world, args.cloud, lat).await?;
        if r.setup_s.is_some() {
            let (names, _) = services_with_address(client).await?;
            r.present = names.len();
            if let Some(aws) = &world.aws {
                let dns =
                    node_joins_aws(args, label, client, admin, aws, &names, limit, &mut r).await?;
                flap_node = Some(dns);
            } else if let Some((name, ip)) = &world.spare {
                let state: serde_json::Value =
                    serde_json::from_str(&admin.call("GET", "state", "").await?)?;
                if cloud::lb_coverage(args.cloud, &state, name, ip).is_none() {
                    progress(format!(
                        "[{label}] {}: the bench cannot read which load balancers have a Node; the joining-Node part is skipped",
                        args.cloud.name()
                    ));
                } else {
                    let before = cloud_counters(admin).await?;
                    register(&api, name, ip, world.system_uuids.get(name), args.minimal_nodes)
                        .await
                        .context("registering the joining Node")?;
                    progress(format!(
                        "[{label}] Node {name} ({ip}) joins with {} load balancers",
                        r.present
                    ));
                    let reached = std::sync::atomic::AtomicUsize::new(0);
                    let (seen, want, cloud) = (&reached, r.present, args.cloud);
                    r.node_added_all_s =
                        wait_until(label, limit, Duration::from_secs(3), || async move {
                            let state: serde_json::Value =
                                serde_json::from_str(&admin.call("GET", "state", "").await?)?;
                            let (total, with) =
                                cloud::lb_coverage(cloud, &state, name, ip).unwrap_or_default();
                            seen.store(with, std::sync::atomic::Ordering::SeqCst);
                            Ok((
                                with >= want && with >= total,
                                format!("{with}/{want} load balancers have the new Node"),
                            ))
                        })
                        .await?;
                    r.node_added_reached = reached.load(std::sync::atomic::Ordering::SeqCst);
                    r.node_added_calls = diff(&cloud_counters(admin).await?, &before);
                    flap_node = Some(name.clone());
                    progress(format!(
                        "[{label}] every load balancer has the new Node after {} s ({} cloud calls)",
                        fmt_opt(r.node_added_all_s),
                        r.node_added_calls.values().sum::<u64>()
                    ));
                }
            }
        }
    }

    // (c) Ready flaps of a Node that is in every load balancer, once the load-balancer calls
    // of what came before (a join's later passes) have stopped: none for 10 s, at most
    // --lb-timeout-secs.
    if let Some(node) = flap_node.filter(|_| args.lb_flaps > 0) {
        let t = Instant::now();
        let mut last = cloud_counters(admin).await?;
        let mut quiet = Instant::now();
        while quiet.elapsed() < Duration::from_secs(10) && t.elapsed() < limit {
            tokio::time::sleep(Duration::from_secs(2)).await;
            let now = cloud_counters(admin).await?;
            if diff(&now, &last).keys().any(|op| cloud::is_lb_op(args.cloud, op)) {
                quiet = Instant::now();
            }
            last = now;
        }
        r.flap_settle_s = Some(t.elapsed().as_secs_f64());
        progress(format!(
            "[{label}] no load-balancer calls for 10 s after {:.0} s; flapping {node}",
            t.elapsed().as_secs_f64()
        ));
        let before = cloud_counters(admin).await?;
        for _ in 0..args.lb_flaps {
            for status in ["False", "True"] {
                let patch = serde_json::json!({"status": {"conditions": [{
                    "type": "Ready", "status": status,
                    "reason": if status == "True" { "KubeletReady" } else { "KubeletNotReady" },
                    "lastHeartbeatTime": jiff::Timestamp::now().to_string(),
                    "lastTransitionTime": jiff::Timestamp::now().to_string(),
                }]}});
                api.patch_status(
                    &node,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Strategic(patch),
                )
                .await
                .context("flapping the Node's Ready condition")?;
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
        }
        // What the flaps may still cause arrives within this settling time.
        tokio::time::sleep(Duration::from_secs(20)).await;
        r.flaps = args.lb_flaps;
        r.ready_flap_calls = diff(&cloud_counters(admin).await?, &before);
        r.ready_flap_lb_calls = r
            .ready_flap_calls
            .iter()
            .filter(|(op, _)| cloud::is_lb_op(args.cloud, op))
            .map(|(_, n)| n)
            .sum();
        progress(format!(
            "[{label}] {} Ready flaps of {node}: {} load-balancer calls (target 0); all cloud calls {:?}",
            args.lb_flaps, r.ready_flap_lb_calls, r.ready_flap_calls
        ));
    }
    let (cpu, rss) = proc_stats(pid).unwrap_or_default();
    (r.cpu_s, r.peak_rss_mb) = (cpu, rss);
    Ok(r)
}

/// (a) on AWS: a new instance in moto, its Node registered, timed until every classic ELB
/// lists it (read from moto directly, not counted). Returns the Node's name.
#[allow(clippy::too_many_arguments)]
async fn node_joins_aws(
    args: &RunArgs,
    label: &str,
    client: &kube::Client,
    admin: &cloud::Admin,
    aws: &cloud::aws::Extra,
    names: &[String],
    limit: Duration,
    r: &mut LbResult,
) -> anyhow::Result<String> {
    let names: std::collections::HashSet<String> = names.iter().cloned().collect();
    let subnet = aws
        .ec2
        .describe_subnets()
        .send()
        .await
        .context("DescribeSubnets")?
        .subnets()
        .iter()
        .find(|s| s.cidr_block() == Some("10.0.100.0/24"))
        .and_then(|s| s.subnet_id().map(str::to_string))
        .context("the first node subnet is missing")?;
    let inst =
        ccm_provider_aws::testing::run_instances(&aws.ec2, &subnet, CLUSTER, 1, Some(&aws.sg))
            .await
            .map_err(|e| anyhow::anyhow!("running the new instance: {e}"))?;
    let inst = inst.first().context("RunInstances returned nothing")?;
    let id = inst.instance_id().context("no instance ID")?.to_string();
    let dns = inst.private_dns_name().context("no private DNS name")?.to_string();
    let ip = inst.private_ip_address().context("no private IP")?.to_string();
    let elb = ccm_provider_aws::testing::elb(&aws.moto).await;
    let before = cloud_counters(admin).await?;
    let api: kube::Api<Node> = kube::Api::all(client.clone());
    register(&api, &dns, &ip, None, args.minimal_nodes)
        .await
        .context("registering the new Node")?;
    progress(format!("[{label}] Node {dns} ({id}) added with {} load balancers", names.len()));
    let (elb, names, id) = (&elb, &names, &id);
    let reached = std::sync::atomic::AtomicUsize::new(0);
    let seen = &reached;
    r.node_added_all_s = wait_until(label, limit, Duration::from_secs(2), || async move {
        let mut have = 0;
        let mut pages = elb.describe_load_balancers().into_paginator().send();
        while let Some(page) = pages.next().await {
            let page = page.context("DescribeLoadBalancers (moto, not counted)")?;
            for lb in page.load_balancer_descriptions() {
                if lb.load_balancer_name().is_some_and(|n| names.contains(n))
                    && lb.instances().iter().any(|i| i.instance_id() == Some(id.as_str()))
                {
                    have += 1;
                }
            }
        }
        seen.store(have, std::sync::atomic::Ordering::SeqCst);
        Ok((
            have >= names.len(),
            format!("{have}/{} load balancers have the new Node", names.len()),
        ))
    })
    .await?;
    r.node_added_reached = reached.load(std::sync::atomic::Ordering::SeqCst);
    r.node_added_calls = diff(&cloud_counters(admin).await?, &before);
    progress(format!(
        "[{label}] every load balancer has the new Node after {} s",
        fmt_opt(r.node_added_all_s)
    ));
    Ok(dns)
}

/// One cloud's tables: every run, ours against upstream, per Node, load balancers.
fn cloud_tables(md: &mut String, cloud: &str, runs: &[&RunResult]) {
    let title = match cloud {
        "aws" => "AWS",
        "azure" => "Azure",
        "gcp" => "GCP",
        "openstack" => "OpenStack",
        "vsphere" => "vSphere",
        "ibm" => "IBM Cloud",
        other => other,
    };
    let _ = writeln!(md, "## {title}\n");
    let _ = writeln!(
        md,
        "| run | N | Nodes (size) | manager | all initialised (s) | floor 2·N/QPS (s) | ÷ floor | p50 (s) | p99 (s) | cloud calls during init | target ⌈N/page⌉+5 | idle cloud calls/min | CPU s (init) | CPU s per 1000 Nodes | peak RSS (MB) | API writes during init |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in runs {
        let calls: u64 = r.cloud_calls_init.values().sum();
        let idle: u64 = r.idle_cloud_calls.values().sum();
        let qps = r
            .flags
            .iter()
            .find_map(|f| f.strip_prefix("--kube-api-qps="))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(20.0);
        let writes: u64 = r
            .api_requests_init
            .iter()
            .filter(|(k, _)| {
                !k.starts_with("GET") && !k.starts_with("LIST") && !k.starts_with("WATCH")
            })
            .map(|(_, v)| v)
            .sum();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {:.0} | {} | {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.0} | {} |",
            r.tag,
            r.nodes,
            match r.node_bytes {
                Some(b) => format!("{} ({:.1} KB)", r.node_kind, b as f64 / 1024.0),
                None => r.node_kind.clone(),
            },
            r.label,
            fmt_opt(r.all_initialised_s),
            2.0 * r.nodes as f64 / qps,
            r.all_initialised_s
                .map(|t| format!("{:.2}", t / (2.0 * r.nodes as f64 / qps)))
                .unwrap_or_else(|| "—".into()),
            fmt_opt(r.p50_s),
            fmt_opt(r.p99_s),
            calls,
            match r.page {
                Some(p) => format!("{}", r.nodes.div_ceil(p.max(1)) + 5),
                None => "— (per Node)".into(),
            },
            idle as f64 * 60.0 / r.idle_secs.max(1) as f64,
            r.cpu_s_init,
            r.cpu_s_init * 1000.0 / r.nodes.max(1) as f64,
            r.peak_rss_mb,
            writes
        );
    }
    // Ours against upstream on the same world (same N, flags but --concurrent-node-syncs,
    // latency, tag): upstream / ours, so > 1 means ours is better.
    let _ = writeln!(md, "\n### {title}: ratios, upstream ÷ ours (> 1: ours is better)\n");
    let _ = writeln!(
        md,
        "| run | N | QPS | all initialised | p50 | p99 | cloud calls during init | CPU s (init) | peak RSS |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|");
    let ratio = |u: Option<f64>, o: Option<f64>| match (u, o) {
        (Some(u), Some(o)) if o > 0.0 => format!("{:.2}", u / o),
        _ => "—".into(),
    };
    for o in runs.iter().filter(|r| r.label == "ours") {
        let Some(u) = runs.iter().rev().find(|u| {
            u.label == "upstream"
                && u.nodes == o.nodes
                && u.tag == o.tag
                && u.latency_ms == o.latency_ms
                && u.node_kind == o.node_kind
                && qps_of(u) == qps_of(o)
        }) else {
            continue;
        };
        let calls = |r: &RunResult| Some(r.cloud_calls_init.values().sum::<u64>() as f64);
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {} | {} | {} | {} | {} |",
            o.tag,
            o.nodes,
            qps_of(o),
            ratio(u.all_initialised_s, o.all_initialised_s),
            ratio(u.p50_s, o.p50_s),
            ratio(u.p99_s, o.p99_s),
            ratio(calls(u), calls(o)),
            ratio(Some(u.cpu_s_init), Some(o.cpu_s_init)),
            ratio(Some(u.peak_rss_mb), Some(o.peak_rss_mb)),
        );
    }
    let _ = writeln!(md, "\n### {title}: per Node (linear growth: the same at every N)\n");
    let _ = writeln!(
        md,
        "| run | N | manager | QPS | CPU ms per Node (init) | RSS KB per Node | cloud calls per 1000 Nodes (init) | idle cloud calls/min per 500 Nodes |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for r in runs {
        let n = r.nodes.max(1) as f64;
        let calls: u64 = r.cloud_calls_init.values().sum();
        let idle: u64 = r.idle_cloud_calls.values().sum();
        let _ = writeln!(
            md,
            "| {} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.2} |",
            r.tag,
            r.nodes,
            r.label,
            qps_of(r),
            r.cpu_s_init * 1000.0 / n,
            r.peak_rss_mb * 1024.0 / n,
            calls as f64 * 1000.0 / n,
            idle as f64 * 60.0 / r.idle_secs.max(1) as f64 * 500.0 / n,
        );
    }
    if runs.iter().any(|r| r.lb.is_some()) {
        let _ = writeln!(md, "\n### {title}: load balancers\n");
        let _ = writeln!(
            md,
            "| run | N | manager | profile | service syncs | one create alone (s) | Services created at once | all addresses (s) | ÷ one create (target ≤ 2) | provisioned in the cloud: one / all at once (s) | cloud calls | Services present | one Node joins: every LB has it (s) | cloud calls | Ready flaps | LB calls on flaps (target 0) | peak RSS (MB) |"
        );
        let _ =
            writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|");
        for r in runs {
            let Some(lb) = &r.lb else { continue };
            let sum = |m: &BTreeMap<String, u64>| m.values().sum::<u64>();
            let syncs = r
                .flags
                .iter()
                .find_map(|f| f.strip_prefix("--concurrent-service-syncs="))
                .unwrap_or("1");
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |",
                r.tag,
                r.nodes,
                r.label,
                r.profile.as_deref().unwrap_or("uniform"),
                syncs,
                fmt_opt(lb.one_create_s),
                lb.created,
                lb.created_all_s.map(|t| format!("{t:.1}")).unwrap_or_else(|| format!(
                    "> {} ({} done)",
                    lb.timeout_secs, lb.created_reached
                )),
                match (lb.created_all_s, lb.one_create_s) {
                    (Some(a), Some(o)) if o > 0.0 => format!("{:.2}", a / o),
                    _ => "—".into(),
                },
                if lb.one_active_s.is_some() || lb.created_active_s.is_some() {
                    format!("{} / {}", fmt_opt(lb.one_active_s), fmt_opt(lb.created_active_s))
                } else {
                    "— (address = provisioned)".to_string()
                },
                sum(&lb.created_calls),
                lb.present,
                if lb.present == 0 {
                    "—".to_string()
                } else {
                    lb.node_added_all_s.map(|t| format!("{t:.1}")).unwrap_or_else(|| {
                        format!(
                            "> {} ({} of {} had it)",
                            lb.timeout_secs, lb.node_added_reached, lb.present
                        )
                    })
                },
                sum(&lb.node_added_calls),
                lb.flaps,
                if lb.flaps > 0 {
                    lb.ready_flap_lb_calls.to_string()
                } else {
                    sum(&lb.ready_flap_calls).to_string()
                },
                lb.peak_rss_mb,
            );
        }
    }
}

fn report(results: &Path, out: &Path, machine: &str) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(results)
        .with_context(|| format!("reading {}", results.display()))?;
    let runs: Vec<RunResult> = text
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("parsing the results")?;
    let mut md = String::new();
    let _ = writeln!(md, "# Benchmarks: node initialisation, ours against upstream\n");
    let _ = writeln!(
        md,
        "Generated by `ci/bench` (issues #15, #35) from `{}`. Machine: {machine}.\n",
        results.display()
    );
    let _ = writeln!(
        md,
        "World per run: a fresh kube-apiserver + etcd with N Nodes registered at once (tainted \
         `uninitialized`) and the cloud's emulator with N instances, whose admin API adds a fixed \
         latency to every cloud call and counts the calls (moto and vcsim behind the fault \
         proxy; the kit's own emulators for Azure, GCP, OpenStack and IBM, on their realistic \
         timing profile). Nodes are kubelet-realistic (labels, annotations, capacity, \
         allocatable, nodeInfo, five conditions, 36 images, two managedFields entries: the \
         `Node size` column, bytes of one stored Node) unless `minimal` (the runs before issue \
         #35: name, InternalIP, Ready and the taint). Times run from the manager's start; \
         per-Node times from the manager's start to the Node's taint being gone (all Nodes \
         exist before the manager starts). Cloud calls are the emulator's counters, API requests \
         the apiserver's `apiserver_request_total` difference over initialisation; CPU seconds \
         (user + system) and peak RSS (VmHWM) from `/proc` of the manager's process. The call \
         target is ⌈N/page⌉ + 5 (page: the cloud's largest instance-list page).\n"
    );
    for cloud in ["aws", "azure", "gcp", "openstack", "vsphere", "ibm"] {
        let these: Vec<&RunResult> = runs.iter().filter(|r| r.cloud == cloud).collect();
        if !these.is_empty() {
            cloud_tables(&mut md, cloud, &these);
        }
    }
    let _ = writeln!(md, "\n## Details per run\n");
    for r in &runs {
        let _ = writeln!(
            md,
            "### {} {} {} N={} ({}, {} Nodes)\n",
            r.cloud, r.tag, r.label, r.nodes, r.date, r.node_kind
        );
        let _ =
            writeln!(md, "- flags: `{}` (cloud latency {} ms)", r.flags.join(" "), r.latency_ms);
        let _ = writeln!(md, "- Nodes initialised: {}/{}", r.initialised, r.nodes);
        let _ = writeln!(md, "- cloud calls during init: {:?}", r.cloud_calls_init);
        let _ = writeln!(
            md,
            "- cloud calls in the {} s idle window: {:?}",
            r.idle_secs, r.idle_cloud_calls
        );
        let _ = writeln!(md, "- apiserver requests during init: {:?}", r.api_requests_init);
        let _ = writeln!(
            md,
            "- CPU seconds: {:.1} at init, {:.1} after idle",
            r.cpu_s_init, r.cpu_s_total
        );
        if let Some(lb) = &r.lb {
            let _ = writeln!(
                md,
                "- {} Services at once: cloud calls {:?}",
                lb.created, lb.created_calls
            );
            let _ = writeln!(
                md,
                "- one Node added with {} Services (set up in {} s): cloud calls {:?}",
                lb.present,
                fmt_opt(lb.setup_s),
                lb.node_added_calls
            );
            let _ = writeln!(md, "- after a Ready flap: cloud calls {:?}", lb.ready_flap_calls);
            let _ = writeln!(
                md,
                "- after the load-balancer phase: CPU {:.1} s, peak RSS {:.0} MB",
                lb.cpu_s, lb.peak_rss_mb
            );
        }
        md.push('\n');
    }
    let _ = writeln!(md, "## Charts: time to initialise against N, per cloud\n");
    for cloud in ["aws", "azure", "gcp", "openstack", "vsphere", "ibm"] {
        let these: Vec<RunResult> = runs.iter().filter(|r| r.cloud == cloud).cloned().collect();
        if !these.is_empty() {
            let _ = writeln!(md, "### {cloud}\n");
            md.push_str(&svg(&these));
            md.push('\n');
        }
    }
    // Hand-written notes (analysis, profiles) after the marker survive a re-render.
    let kept = std::fs::read_to_string(out)
        .ok()
        .and_then(|old| old.find(NOTES_MARKER).map(|i| old[i..].to_string()));
    md.push_str(kept.as_deref().unwrap_or(NOTES_MARKER));
    std::fs::write(out, md).with_context(|| format!("writing {}", out.display()))?;
    println!("wrote {}", out.display());
    Ok(())
}

/// A small SVG line chart: time to all initialised against N, one series per (tag, manager),
/// and the floor 2·N/QPS.
fn svg(runs: &[RunResult]) -> String {
    let mut series: BTreeMap<String, Vec<(f64, f64)>> = BTreeMap::new();
    let mut floor: BTreeMap<u64, f64> = BTreeMap::new();
    for r in runs {
        let qps = r
            .flags
            .iter()
            .find_map(|f| f.strip_prefix("--kube-api-qps="))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or(20.0);
        if let Some(t) = r.all_initialised_s {
            let key = format!("{} {} {} qps={qps}", r.cloud, r.label, r.tag);
            series.entry(key).or_default().push((r.nodes as f64, t));
        }
        floor.insert(r.nodes as u64, 2.0 * r.nodes as f64 / qps);
    }
    let max_n = runs.iter().map(|r| r.nodes as f64).fold(1.0, f64::max);
    let max_t =
        series.values().flatten().map(|p| p.1).chain(floor.values().copied()).fold(1.0, f64::max);
    let (w, h, m) = (640.0, 360.0, 50.0);
    let x = |n: f64| m + n / max_n * (w - 2.0 * m);
    let y = |t: f64| h - m - t / max_t * (h - 2.0 * m);
    let colours = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b"];
    let mut s = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{w}\" height=\"{h}\" font-family=\"sans-serif\" font-size=\"11\">\n\
         <line x1=\"{m}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"black\"/>\n\
         <line x1=\"{m}\" y1=\"{m}\" x2=\"{m}\" y2=\"{}\" stroke=\"black\"/>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"middle\">Nodes (N)</text>\n\
         <text x=\"12\" y=\"{}\" transform=\"rotate(-90 12 {})\" text-anchor=\"middle\">seconds to all initialised (max {max_t:.0})</text>\n\
         <text x=\"{}\" y=\"{}\" text-anchor=\"end\">{max_n:.0}</text>\n",
        h - m,
        w - m,
        h - m,
        h - m,
        w / 2.0,
        h - 12.0,
        h / 2.0,
        h / 2.0,
        w - m,
        h - m + 14.0
    );
    let mut legend = 0.0;
    let mut add = |name: &str, pts: &[(f64, f64)], colour: &str, dash: &str| {
        let mut pts = pts.to_vec();
        pts.sort_by(|a, b| a.0.total_cmp(&b.0));
        let path: Vec<String> =
            pts.iter().map(|(n, t)| format!("{:.1},{:.1}", x(*n), y(*t))).collect();
        let _ = writeln!(
            s,
            "<polyline fill=\"none\" stroke=\"{colour}\" stroke-width=\"2\" stroke-dasharray=\"{dash}\" points=\"{} {}\"/>",
            format_args!("{:.1},{:.1}", x(0.0), y(0.0)),
            path.join(" ")
        );
        for (n, t) in &pts {
            let _ = writeln!(
                s,
                "<circle cx=\"{:.1}\" cy=\"{:.1}\" r=\"3\" fill=\"{colour}\"/>",
                x(*n),
                y(*t)
            );
        }
        let _ = writeln!(
            s,
            "<text x=\"{}\" y=\"{:.0}\" fill=\"{colour}\">{name}</text>",
            m + 10.0,
            m + legend * 14.0
        );
        legend += 1.0;
    };
    for (i, (name, pts)) in series.iter().enumerate() {
        add(name, pts, colours[i % colours.len()], "");
    }
    let fl: Vec<(f64, f64)> = floor.iter().map(|(n, t)| (*n as f64, *t)).collect();
    add("floor 2·N/QPS", &fl, "#777777", "4 3");
    s.push_str("</svg>\n");
    s
}
