//! `ccm-bench`: node initialisation of two AWS cloud-controller-managers side by side (issue
//! #15). `ci/bench` builds everything and calls it; run `ccm-bench --help` for the knobs.
//!
//! One world per run, identical for every manager: moto with N instances, reached through the
//! fault proxy (`ccm-emulator proxy`, which adds a fixed latency to every cloud call and counts
//! calls by operation), a fresh kube-apiserver + etcd with N kubelet-style Nodes (registered
//! at once, before the manager starts), then the manager under test with the same flags.
//!
//! `ccm-bench run` measures one manager and appends one JSON line to `--results`;
//! `ccm-bench report` turns those lines into `docs/benchmarks.md` (table and SVG chart).

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use ccm_testbed::ControlPlane;
use clap::{Parser, Subcommand};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::PostParams;
use kube::runtime::watcher;
use serde::{Deserialize, Serialize};
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _};
use tokio::time::Instant;

const CLUSTER: &str = "bench";
/// Everything from this line on in docs/benchmarks.md is kept by `report`.
const NOTES_MARKER: &str = "<!-- notes: kept by `ccm-bench report` -->\n";

#[derive(Debug, Parser)]
#[command(name = "ccm-bench", about = "Benchmark AWS cloud-controller-managers side by side")]
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
    /// The `ccm-emulator` binary (its fault proxy sits between the managers and moto).
    #[arg(long)]
    emulator: PathBuf,
    /// Number of instances and Nodes.
    #[arg(long, default_value_t = 1000)]
    nodes: usize,
    /// Latency added to every cloud call, in milliseconds.
    #[arg(long, default_value_t = 200)]
    latency_ms: u64,
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
    /// --concurrent-service-syncs for every manager.
    #[arg(long, default_value = "1")]
    concurrent_service_syncs: String,
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
}

/// One manager's figures.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct RunResult {
    label: String,
    tag: String,
    date: String,
    nodes: usize,
    latency_ms: u64,
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
    /// Cloud calls within 30 s of a Node's Ready flapping False and back to True.
    ready_flap_calls: BTreeMap<String, u64>,
    /// Peak RSS (MB) and CPU seconds of the manager at the end of the phase.
    peak_rss_mb: f64,
    cpu_s: f64,
    /// The limit of each wait (`--lb-timeout-secs`).
    #[serde(default)]
    timeout_secs: u64,
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

/// The fault proxy process: URL and the admin API.
struct Proxy {
    url: String,
    _child: tokio::process::Child,
    _stdin: tokio::process::ChildStdin,
}

async fn start_proxy(emulator: &Path, upstream: &str) -> anyhow::Result<Proxy> {
    let mut child = tokio::process::Command::new(emulator)
        .args(["proxy", "--upstream", upstream, "--protocol", "aws-query"])
        .arg("--exit-on-stdin-close")
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", emulator.display()))?;
    let stdout = child.stdout.take().context("proxy stdout")?;
    let stdin = child.stdin.take().context("proxy stdin")?;
    let mut lines = tokio::io::BufReader::new(stdout).lines();
    let url = lines.next_line().await?.context("the proxy printed no URL")?;
    Ok(Proxy { url: url.trim_end_matches('/').to_string(), _child: child, _stdin: stdin })
}

/// A plain HTTP/1.1 request to the proxy's admin API (no TLS: moto is HTTP).
async fn admin(url: &str, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
    let hostport = url.trim_start_matches("http://");
    let mut s = tokio::net::TcpStream::connect(hostport)
        .await
        .with_context(|| format!("connecting to the proxy at {url}"))?;
    let req = format!(
        "{method} /__emulator/{path} HTTP/1.1\r\nHost: {hostport}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    let (head, rest) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    anyhow::ensure!(head.contains(" 200 ") || head.contains(" 201 "), "admin {path}: {head}");
    // The body may be chunked; the JSON object is between the first '{' and the last '}'.
    let body = match (rest.find(['{', '[']), rest.rfind(['}', ']'])) {
        (Some(a), Some(b)) if b >= a => rest[a..=b].to_string(),
        _ => String::new(),
    };
    Ok(body)
}

async fn cloud_counters(url: &str) -> anyhow::Result<BTreeMap<String, u64>> {
    let v: serde_json::Value = serde_json::from_str(&admin(url, "GET", "counters", "").await?)?;
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
    use ccm_provider_aws::testing;
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let err = |what: &'static str| move |e: testing::Error| anyhow::anyhow!("{what}: {e}");

    progress(format!("starting moto and the fault proxy ({} ms per call)", args.latency_ms));
    let moto = ccm_testbed::moto::Moto::start().await.context("starting moto")?;
    let proxy = start_proxy(&args.emulator, &moto.url).await?;
    let ec2 = testing::ec2(&moto.url).await;
    let net = testing::network(&ec2, CLUSTER).await.map_err(err("creating the VPC"))?;
    let sg = testing::node_security_group(&ec2, &net.vpc, CLUSTER)
        .await
        .map_err(err("creating the node security group"))?;
    let mut nodes: Vec<(String, String)> = Vec::with_capacity(args.nodes);
    let started = Instant::now();
    while nodes.len() < args.nodes {
        // A /24 per 200 instances (the fixture's subnets hold 251 addresses each).
        let b = nodes.len() / 200;
        let count = (args.nodes - nodes.len()).min(200);
        let zone = &net.subnets[b % net.subnets.len()].1;
        let subnet = ec2
            .create_subnet()
            .vpc_id(&net.vpc)
            .cidr_block(format!("10.0.{}.0/24", 100 + b))
            .availability_zone(zone)
            .send()
            .await
            .context("creating a subnet")?;
        let subnet = subnet
            .subnet()
            .and_then(|s| s.subnet_id())
            .context("CreateSubnet returned no ID")?
            .to_string();
        let batch = testing::run_instances(&ec2, &subnet, CLUSTER, count as i32, Some(&sg))
            .await
            .map_err(err("running instances"))?;
        nodes.extend(batch.iter().filter_map(|i| {
            Some((i.private_dns_name()?.to_string(), i.private_ip_address()?.to_string()))
        }));
        progress(format!("instances: {}/{}", nodes.len(), args.nodes));
    }
    progress(format!("{} instances in {:.0} s", nodes.len(), started.elapsed().as_secs_f64()));
    let config = args.dir.join("aws.conf");
    std::fs::write(&config, bench_cloud_config(&proxy.url, &net.vpc, &net.subnets[0].0))?;

    for spec in &args.ccms {
        let (label, path) = spec.split_once('=').context("--ccm wants label=path")?;
        let world = World { proxy: &proxy.url, moto: &moto.url, ec2: &ec2, sg: &sg, nodes: &nodes };
        let result = run_one(&args, label, Path::new(path), &config, &world).await?;
        let line = serde_json::to_string(&result)?;
        let mut f = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&args.results)
            .with_context(|| format!("opening {}", args.results.display()))?;
        std::io::Write::write_all(&mut f, format!("{line}\n").as_bytes())?;
        print_result(&result);
    }
    drop(moto);
    Ok(())
}

/// The cloud config both managers read, written as for upstream v1.36: VPC and SubnetID (else
/// upstream asks the instance metadata service which instance it runs on, and there is none
/// here) and endpoint overrides named by the SDK's service IDs (`EC2`, `Elastic Load
/// Balancing`), which upstream matches since its move to the Go SDK v2.
fn bench_cloud_config(url: &str, vpc: &str, subnet: &str) -> String {
    let region = ccm_provider_aws::testing::REGION;
    let mut text = format!(
        "[Global]\nKubernetesClusterID = {CLUSTER}\nRegion = {region}\nVPC = {vpc}\nSubnetID = {subnet}\n"
    );
    for (i, service) in ["EC2", "Elastic Load Balancing"].iter().enumerate() {
        text.push_str(&format!(
            "\n[ServiceOverride \"{}\"]\nService = {service}\nRegion = {region}\nURL = {url}\nSigningRegion = {region}\n",
            i + 1
        ));
    }
    text
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

/// What every manager of a run shares: the proxy, moto and its instances.
struct World<'a> {
    proxy: &'a str,
    moto: &'a str,
    ec2: &'a aws_sdk_ec2::Client,
    sg: &'a str,
    nodes: &'a [(String, String)],
}

async fn run_one(
    args: &RunArgs,
    label: &str,
    ccm: &Path,
    config: &Path,
    world: &World<'_>,
) -> anyhow::Result<RunResult> {
    let (proxy, nodes) = (world.proxy, world.nodes);
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
    futures::stream::iter(nodes.iter().cloned())
        .map(|(name, ip)| {
            let api = api.clone();
            async move {
                let node = ccm_testbed::fixtures::kubelet_node(&name, &ip, "True");
                api.create(&PostParams::default(), &node)
                    .await
                    .with_context(|| format!("registering {name}"))
            }
        })
        .buffer_unordered(32)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<Result<Vec<_>, _>>()?;
    progress(format!(
        "[{label}] {} Nodes registered in {:.1} s",
        nodes.len(),
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

    admin(proxy, "POST", "reset", "").await?;
    set_latency(proxy, args.latency_ms).await?;
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
    let flags = vec![
        format!("--kube-api-qps={}", args.kube_api_qps),
        format!("--kube-api-burst={}", args.kube_api_burst),
        format!("--concurrent-node-syncs={node_syncs}"),
        format!("--concurrent-service-syncs={}", args.concurrent_service_syncs),
        "--leader-elect=false".to_string(),
        "--configure-cloud-routes=false".to_string(),
    ];
    let kubeconfig = dir.join("ccm.kubeconfig");
    cp.write_kubeconfig(&kubeconfig, &ccm_testbed::Identity::admin())?;
    let log = dir.join("ccm.log");
    let mut child = tokio::process::Command::new(ccm)
        .arg("--cloud-provider=aws")
        .arg(format!("--cloud-config={}", config.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(&flags)
        .args(["--secure-port=0", "--webhook-secure-port=0"])
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_REGION", ccm_provider_aws::testing::REGION)
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
    let cloud_calls_init = cloud_counters(proxy).await?;
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

    let idle_start = cloud_counters(proxy).await?;
    let idle_until = Instant::now() + Duration::from_secs(args.idle_secs);
    while Instant::now() < idle_until {
        tokio::time::sleep(Duration::from_secs(30).min(idle_until - Instant::now())).await;
        let calls: u64 = diff(&cloud_counters(proxy).await?, &idle_start).values().sum();
        progress(format!("[{label}] idle: {calls} cloud calls so far"));
    }
    let idle_cloud_calls = diff(&cloud_counters(proxy).await?, &idle_start);
    let (cpu_s_total, peak_rss_mb) = proc_stats(pid).unwrap_or_default();
    let lb = if args.lb_services > 0 && !args.lb_skip.iter().any(|l| l == label) {
        match lb_phase(args, label, &client, world, pid, &mut child).await {
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
        label: label.to_string(),
        tag: args.tag.clone(),
        date: today_utc(),
        nodes: total,
        latency_ms: args.latency_ms,
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

/// Creates LoadBalancer Services `from..to` in `default`.
async fn create_services(client: &kube::Client, from: usize, to: usize) -> anyhow::Result<()> {
    let api: kube::Api<k8s_openapi::api::core::v1::Service> =
        kube::Api::namespaced(client.clone(), "default");
    futures::stream::iter(from..to)
        .map(|i| {
            let api = api.clone();
            async move {
                let svc =
                    ccm_testbed::fixtures::load_balancer_service("default", &format!("lb-{i}"), 80);
                api.create(&PostParams::default(), &svc)
                    .await
                    .with_context(|| format!("creating Service lb-{i}"))
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

/// The proxy's rules: moto has no DescribeInstanceTopology (upstream asks it for every Node of
/// a supported instance type, and retries moto's 500 three times with backoff, which no real
/// region makes it do), so the proxy answers it with an empty topology, without latency; every
/// other call gets `ms` of latency.
async fn set_latency(proxy: &str, ms: u64) -> anyhow::Result<()> {
    admin(proxy, "DELETE", "faults", "").await?;
    let topology = serde_json::json!({"match": "*DescribeInstanceTopology", "fault": {
        "kind": "status", "status": 200,
        "body": "<DescribeInstanceTopologyResponse xmlns=\"http://ec2.amazonaws.com/doc/2016-11-15/\"><requestId>bench</requestId><instanceSet/></DescribeInstanceTopologyResponse>"
    }});
    admin(proxy, "POST", "faults", &topology.to_string()).await?;
    if ms > 0 {
        let rule = serde_json::json!({"match": "*", "fault": {"kind": "latency", "ms": ms}});
        admin(proxy, "POST", "faults", &rule.to_string()).await?;
    }
    Ok(())
}

/// The load-balancer phase: `--lb-services` created at once; Services brought to
/// `--lb-present`; one Node added; a Ready flap.
async fn lb_phase(
    args: &RunArgs,
    label: &str,
    client: &kube::Client,
    world: &World<'_>,
    pid: u32,
    child: &mut tokio::process::Child,
) -> anyhow::Result<LbResult> {
    let proxy = world.proxy;
    let mut r = LbResult {
        created: args.lb_services,
        timeout_secs: args.lb_timeout_secs,
        ..Default::default()
    };
    let limit = Duration::from_secs(args.lb_timeout_secs);

    progress(format!("[{label}] load balancers: creating {} Services at once", args.lb_services));
    let before = cloud_counters(proxy).await?;
    create_services(client, 0, args.lb_services).await?;
    let want = args.lb_services;
    r.created_all_s = wait_until(label, limit, Duration::from_millis(500), || async move {
        let (done, _) = services_with_address(client).await?;
        Ok((done.len() >= want, format!("{}/{want} Services have an address", done.len())))
    })
    .await?;
    r.created_calls = diff(&cloud_counters(proxy).await?, &before);
    r.created_reached = services_with_address(client).await?.0.len();
    progress(format!("[{label}] {want} load balancers in {} s", fmt_opt(r.created_all_s)));
    if let Ok(Some(status)) = child.try_wait() {
        anyhow::bail!("the manager exited with {status}");
    }

    if args.lb_present > args.lb_services {
        let present = args.lb_present;
        r.present = present;
        progress(format!(
            "[{label}] load balancers: setting up {present} in all (cloud latency off meanwhile)"
        ));
        set_latency(proxy, 0).await?;
        let t = Instant::now();
        create_services(client, args.lb_services, present).await?;
        let setup = wait_until(label, limit * 2, Duration::from_secs(2), || async move {
            let (done, _) = services_with_address(client).await?;
            Ok((
                done.len() >= present,
                format!("{}/{present} Services have an address", done.len()),
            ))
        })
        .await?;
        r.setup_s = setup.map(|_| t.elapsed().as_secs_f64());
        set_latency(proxy, args.latency_ms).await?;
        if r.setup_s.is_some() {
            let (names, _) = services_with_address(client).await?;
            let names: std::collections::HashSet<String> = names.into_iter().collect();
            // A new instance and its Node.
            let subnet = world
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
            let inst = ccm_provider_aws::testing::run_instances(
                world.ec2,
                &subnet,
                CLUSTER,
                1,
                Some(world.sg),
            )
            .await
            .map_err(|e| anyhow::anyhow!("running the new instance: {e}"))?;
            let inst = inst.first().context("RunInstances returned nothing")?;
            let id = inst.instance_id().context("no instance ID")?.to_string();
            let dns = inst.private_dns_name().context("no private DNS name")?.to_string();
            let ip = inst.private_ip_address().context("no private IP")?.to_string();
            let elb = ccm_provider_aws::testing::elb(world.moto).await;
            let before = cloud_counters(proxy).await?;
            let api: kube::Api<Node> = kube::Api::all(client.clone());
            api.create(
                &PostParams::default(),
                &ccm_testbed::fixtures::kubelet_node(&dns, &ip, "True"),
            )
            .await
            .context("registering the new Node")?;
            progress(format!("[{label}] Node {dns} ({id}) added with {present} load balancers"));
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
            r.node_added_calls = diff(&cloud_counters(proxy).await?, &before);
            progress(format!(
                "[{label}] every load balancer has the new Node after {} s",
                fmt_opt(r.node_added_all_s)
            ));

            // A Ready flap of an initialised Node: False, then True again.
            let before = cloud_counters(proxy).await?;
            for status in ["False", "True"] {
                let patch = serde_json::json!({"status": {"conditions": [{
                    "type": "Ready", "status": status,
                    "reason": if status == "True" { "KubeletReady" } else { "KubeletNotReady" },
                    "lastHeartbeatTime": jiff::Timestamp::now().to_string(),
                    "lastTransitionTime": jiff::Timestamp::now().to_string(),
                }]}});
                api.patch_status(
                    &dns,
                    &kube::api::PatchParams::default(),
                    &kube::api::Patch::Strategic(patch),
                )
                .await
                .context("flapping the Node's Ready condition")?;
                tokio::time::sleep(Duration::from_secs(15)).await;
            }
            r.ready_flap_calls = diff(&cloud_counters(proxy).await?, &before)
                .into_iter()
                .filter(|(op, _)| op != "DescribeInstances")
                .collect();
            progress(format!("[{label}] cloud calls after a Ready flap: {:?}", r.ready_flap_calls));
        }
    }
    let (cpu, rss) = proc_stats(pid).unwrap_or_default();
    (r.cpu_s, r.peak_rss_mb) = (cpu, rss);
    Ok(r)
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
        "Generated by `ci/bench` (issue #15) from `{}`. Machine: {machine}.\n",
        results.display()
    );
    let _ = writeln!(
        md,
        "World per run: a fresh kube-apiserver + etcd with N kubelet-style Nodes registered at \
         once (tainted `uninitialized`), moto with N instances behind the fault proxy adding a \
         fixed latency to every cloud call. Times run from the manager's start; per-Node \
         times from the manager's start to the Node's taint being gone (all Nodes exist before \
         the manager starts). Cloud calls are the proxy's counters, API requests the \
         apiserver's `apiserver_request_total` difference over initialisation; CPU seconds \
         (user + system) and peak RSS (VmHWM) from `/proc` of the manager's process.\n"
    );
    let _ = writeln!(
        md,
        "| run | N | manager | all initialised (s) | floor 2·N/QPS (s) | p50 (s) | p99 (s) | cloud calls during init | idle cloud calls/min | CPU s (init) | CPU s per 1000 Nodes | peak RSS (MB) | API writes during init |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|---|");
    for r in &runs {
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
            "| {} | {} | {} | {} | {:.0} | {} | {} | {} | {:.1} | {:.1} | {:.1} | {:.0} | {} |",
            r.tag,
            r.nodes,
            r.label,
            fmt_opt(r.all_initialised_s),
            2.0 * r.nodes as f64 / qps,
            fmt_opt(r.p50_s),
            fmt_opt(r.p99_s),
            calls,
            idle as f64 * 60.0 / r.idle_secs.max(1) as f64,
            r.cpu_s_init,
            r.cpu_s_init * 1000.0 / r.nodes.max(1) as f64,
            r.peak_rss_mb,
            writes
        );
    }
    // Ours against upstream on the same world (same N, flags but --concurrent-node-syncs,
    // latency, tag): upstream / ours, so > 1 means ours is better.
    let _ = writeln!(md, "\n## Ratios: upstream ÷ ours (> 1: ours is better)\n");
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
    let _ = writeln!(md, "\n## Per Node (linear growth: the same at every N)\n");
    let _ = writeln!(
        md,
        "| run | N | manager | QPS | CPU ms per Node (init) | RSS KB per Node | cloud calls per 1000 Nodes (init) | idle cloud calls/min per 500 Nodes |"
    );
    let _ = writeln!(md, "|---|---|---|---|---|---|---|---|");
    for r in &runs {
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
        let _ = writeln!(md, "\n## Load balancers\n");
        let _ = writeln!(
            md,
            "| run | N | manager | QPS | Services created at once | all addresses (s) | cloud calls | Services present | one Node added: every LB has it (s) | cloud calls | LB calls after a Ready flap | peak RSS (MB) |"
        );
        let _ = writeln!(md, "|---|---|---|---|---|---|---|---|---|---|---|---|");
        for r in &runs {
            let Some(lb) = &r.lb else { continue };
            let sum = |m: &BTreeMap<String, u64>| m.values().sum::<u64>();
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.0} |",
                r.tag,
                r.nodes,
                r.label,
                qps_of(r),
                lb.created,
                lb.created_all_s.map(|t| format!("{t:.1}")).unwrap_or_else(|| format!(
                    "> {} ({} done)",
                    lb.timeout_secs, lb.created_reached
                )),
                sum(&lb.created_calls),
                lb.present,
                lb.node_added_all_s.map(|t| format!("{t:.1}")).unwrap_or_else(|| format!(
                    "> {} ({} of {} had it)",
                    lb.timeout_secs, lb.node_added_reached, lb.present
                )),
                sum(&lb.node_added_calls),
                sum(&lb.ready_flap_calls),
                lb.peak_rss_mb,
            );
        }
    }
    let _ = writeln!(md, "\n## Details per run\n");
    for r in &runs {
        let _ = writeln!(md, "### {} {} N={} ({})\n", r.tag, r.label, r.nodes, r.date);
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
    let _ = writeln!(md, "## Chart: time to initialise against N\n");
    md.push_str(&svg(&runs));
    md.push('\n');
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
            let key = format!("{} {} qps={qps}", r.label, r.tag);
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
