//! Swap day (issue #30): upstream's own deployment artifacts run our binaries.
//!
//! For each cloud, upstream's official chart or manifests at a pinned version (fetched from
//! the Go module proxy by `go mod download` into `~/.cache/ccm-rs/swap/`, never copied into
//! the repository; GCP and IBM, whose modules the proxy does not serve, from fixtures written
//! from the documented facts under `testbed/fixtures/swap/`) are rendered (`helm template`
//! with upstream's default values, or the manifests as they are), upstream's RBAC objects
//! are applied to a real kube-apiserver with its audit log on, a token is minted for
//! upstream's ServiceAccount (TokenRequest), and our binary runs with exactly the container's
//! command, args and env. Only what a pod gets from its node is mapped: the mounted files
//! (the cloud config, written to pointing at the cloud's emulator, in a local directory
//! standing for the mount), the in-cluster connection (`--kubeconfig` with the token), the
//! node's metadata service and the CA bundle (environment variables naming the emulator's),
//! and a host port another process holds. Every mapping and every change to upstream's
//! artifact is printed and recorded.
//!
//! Pass criteria per run ([`Outcome`]): the binary starts and keeps running; the apiserver
//! refused none of the requests of upstream's ServiceAccounts (403 in the audit log, RBAC
//! denials included); every Node is initialised (uninitialized taint gone, providerID,
//! addresses); the LoadBalancer Service gets its address; core/v1 Events are visible with
//! `kubectl get events --field-selector source=<upstream component>`; the Lease is renewed
//! for several periods.

pub mod clouds;

use std::collections::BTreeMap;
use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::PostParams;
use serde_json::Value;

use crate::{ControlPlane, StartOptions, chart, tools};

/// Errors of a swap run; each names the step and what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum SwapError {
    /// Fetching or reading upstream's artifact failed.
    #[error("upstream artifact {what}: {detail}")]
    Artifact {
        /// The module or file.
        what: String,
        /// What failed.
        detail: String,
    },
    /// Rendering or applying it failed.
    #[error(transparent)]
    Chart(#[from] chart::ChartError),
    /// The control plane failed.
    #[error(transparent)]
    Testbed(#[from] crate::Error),
    /// A step of the run failed.
    #[error("{0}")]
    Step(String),
}

fn step(what: impl std::fmt::Display) -> SwapError {
    SwapError::Step(what.to_string())
}

/// Where fetched modules are cached: `$CCM_SWAP_CACHE`, else `~/.cache/ccm-rs/swap`.
pub fn cache_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("CCM_SWAP_CACHE") {
        return PathBuf::from(d);
    }
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache/ccm-rs/swap")
}

/// The directory of Go module `module@version`, downloaded through the Go module proxy with
/// `go mod download` into [`cache_dir`] (a second call reads the cache).
pub fn module_dir(module: &str, version: &str) -> Result<PathBuf, SwapError> {
    let what = format!("{module}@{version}");
    let err = |detail: String| SwapError::Artifact { what: what.clone(), detail };
    let gomodcache = cache_dir().join("gomod");
    std::fs::create_dir_all(&gomodcache).map_err(|e| err(format!("creating the cache: {e}")))?;
    let out = Command::new("go")
        .args(["mod", "download", "-json", &what])
        .env("GOMODCACHE", &gomodcache)
        .env("GOFLAGS", "-modcacherw")
        .env("GO111MODULE", "on")
        .current_dir(&gomodcache)
        .output()
        .map_err(|e| err(format!("running go mod download: {e}")))?;
    let info: Value = serde_json::from_slice(&out.stdout)
        .map_err(|e| err(format!("go mod download printed no JSON ({e}): {}", stderr(&out))))?;
    if let Some(e) = info["Error"].as_str() {
        return Err(err(format!("go mod download: {e}")));
    }
    info["Dir"]
        .as_str()
        .map(PathBuf::from)
        .filter(|d| d.is_dir())
        .ok_or_else(|| err(format!("go mod download gave no directory: {}", stderr(&out))))
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).trim().to_string()
}

/// Renders the chart in `chart_dir` as `release` in `namespace` with its default values and
/// then `values` (`--set`), flattening `List` objects into their items.
pub fn helm_template(
    chart_dir: &Path,
    release: &str,
    namespace: &str,
    values: &[(String, String)],
) -> Result<Vec<Value>, SwapError> {
    let mut cmd = Command::new(chart::helm()?);
    cmd.arg("template").arg(release).arg(chart_dir).arg("--namespace").arg(namespace);
    for (k, v) in values {
        cmd.arg("--set").arg(format!("{k}={v}"));
    }
    let out = cmd.output().map_err(|e| step(format!("running helm: {e}")))?;
    if !out.status.success() {
        return Err(chart::ChartError::Template {
            chart: chart_dir.to_path_buf(),
            status: out.status.to_string(),
            stderr: stderr(&out),
        }
        .into());
    }
    parse_objects(&String::from_utf8_lossy(&out.stdout), &chart_dir.display().to_string())
}

/// The Kubernetes objects in YAML documents (`List`s flattened); `what` names the source.
pub fn parse_objects(text: &str, what: &str) -> Result<Vec<Value>, SwapError> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(text)
        .map_err(|e| SwapError::Artifact { what: what.to_string(), detail: e.to_string() })?;
    let mut out = Vec::new();
    for d in docs.into_iter().filter(|d| !d.is_null()) {
        if d["kind"] == "List" {
            out.extend(d["items"].as_array().cloned().unwrap_or_default());
        } else {
            out.push(d);
        }
    }
    Ok(out)
}

/// The objects of manifest files, in order.
pub fn read_manifests(files: &[PathBuf]) -> Result<Vec<Value>, SwapError> {
    let mut out = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f).map_err(|e| SwapError::Artifact {
            what: f.display().to_string(),
            detail: e.to_string(),
        })?;
        out.extend(parse_objects(&text, &f.display().to_string())?);
    }
    Ok(out)
}

/// The workload `kind/name` among `objects`.
pub fn find_workload<'a>(
    objects: &'a [Value],
    kind: &str,
    name: &str,
) -> Result<&'a Value, SwapError> {
    objects
        .iter()
        .find(|o| chart::kind(o) == kind && chart::name(o) == name)
        .ok_or_else(|| step(format!("the artifact has no {kind} {name}")))
}

/// The same, mutable (for the printed changes upstream documents).
pub fn find_workload_mut<'a>(
    objects: &'a mut [Value],
    kind: &str,
    name: &str,
) -> Result<&'a mut Value, SwapError> {
    objects
        .iter_mut()
        .find(|o| chart::kind(o) == kind && chart::name(o) == name)
        .ok_or_else(|| step(format!("the artifact has no {kind} {name}")))
}

/// The first container of a workload's pod.
pub fn container_mut(workload: &mut Value) -> Result<&mut Value, SwapError> {
    workload
        .pointer_mut("/spec/template/spec/containers/0")
        .ok_or_else(|| step("the workload has no container"))
}

/// One run: a cloud, an artifact rendered one way, the workloads to run.
pub struct Case {
    /// The cloud (`aws`, ...).
    pub cloud: String,
    /// What was rendered: module, version, chart or files, values.
    pub artifact: String,
    /// Upstream's objects as rendered (after [`Case::changes`]).
    pub objects: Vec<Value>,
    /// Changes to upstream's artifact this run needed, printed (each says why).
    pub changes: Vec<String>,
    /// The manager's workload (`Kind`, name).
    pub manager: (String, String),
    /// The per-node workload (Azure's cloud-node-manager DaemonSet), if any.
    pub node_manager: Option<(String, String)>,
}

/// Writes the cloud config, given the directory the config mount stands for.
pub type ConfigWriter = Box<dyn Fn(&Path) -> Result<String, SwapError>>;

/// The cloud's side of a run: emulators, what the pod's mounts and node provide, the Nodes.
pub struct World {
    /// The cloud config, given the directory the config mount stands for (None: the
    /// artifact mounts none, the binary discovers the cloud from the node's metadata).
    pub config: Option<ConfigWriter>,
    /// Environment the node provides (metadata service, CA bundle), each printed.
    pub env: Vec<(String, String)>,
    /// Per-node environment for the per-node workload (its node's metadata service).
    pub node_env: BTreeMap<String, Vec<(String, String)>>,
    /// The Nodes as kubelets register them: name, InternalIP, labels.
    pub nodes: Vec<(String, String, Value)>,
    /// Which ingress field the LoadBalancer gets (`ip`, `hostname`); None: no load balancers.
    pub lb_field: Option<&'static str>,
    /// Objects an operator creates besides the artifact (e.g. a credentials Secret).
    pub extra_objects: Vec<Value>,
    /// How the emulator stands for what upstream's config names (printed with the mappings).
    pub notes: Vec<String>,
    /// Processes and handles kept alive for the run.
    pub keep: Vec<Box<dyn std::any::Any + Send>>,
    /// What `ci/differential` needs of the cloud besides (default: nothing).
    pub access: CloudAccess,
}

/// A future of a cloud action.
pub type CloudFuture =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), SwapError>> + Send>>;

/// Deletes the cloud instance behind a Node name, acting on the cloud directly (not through
/// the fault proxy, so the manager's call counts do not include it).
pub type InstanceDeleter = Box<dyn Fn(String) -> CloudFuture + Send + Sync>;

/// How the differential reads and acts on a world's cloud.
#[derive(Default)]
pub struct CloudAccess {
    /// The admin API (`<url>/__emulator/…`) that counts the manager's calls: the emulator's
    /// own, or the fault proxy's in front of moto or vcsim.
    pub admin_url: Option<String>,
    /// The CA file to trust for `admin_url` when it is HTTPS.
    pub admin_ca: Option<String>,
    /// Whether the cloud-side state is the emulator's (`GET /__emulator/state`).
    pub emulator_state: bool,
    /// moto's URL, whose `/moto-api/data.json` is the cloud-side state.
    pub moto_url: Option<String>,
    /// Deletes an instance (None: the emulator cannot delete one).
    pub delete_instance: Option<InstanceDeleter>,
}

/// One HTTP call with `curl` (120 s deadline: moto answers slowly on a loaded machine): `method` `url`, trusting `ca` when given (the
/// emulators' own CAs), `headers` as `Name: value`, `body` as is. The status and the body.
pub async fn curl(
    method: &str,
    url: &str,
    ca: Option<&str>,
    headers: &[String],
    body: Option<&str>,
) -> Result<(u16, String), SwapError> {
    let mut cmd = tokio::process::Command::new("curl");
    cmd.args(["-sS", "--max-time", "120", "-X", method, "-w", "\n%{http_code}"]);
    if let Some(ca) = ca.filter(|c| !c.is_empty()) {
        cmd.arg("--cacert").arg(ca);
    }
    for h in headers {
        cmd.arg("-H").arg(h);
    }
    if let Some(b) = body {
        cmd.arg("--data-binary").arg(b);
    }
    cmd.arg(url);
    let out =
        cmd.output().await.map_err(|e| step(format!("running curl for {method} {url}: {e}")))?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
    let code: u16 = code.trim().parse().unwrap_or(0);
    if !out.status.success() || code == 0 {
        return Err(step(format!(
            "{method} {url}: curl failed ({}): {}",
            out.status,
            stderr(&out)
        )));
    }
    Ok((code, body.to_string()))
}

/// How a world is built.
#[derive(Debug, Clone, Copy, Default)]
pub struct WorldOptions {
    /// One more instance, the last of [`World::nodes`], for a Node the scenario adds later.
    pub spare: bool,
    /// A fault proxy in front of moto or vcsim, counting the manager's calls.
    pub proxy: bool,
}

/// What a run found.
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub struct Outcome {
    /// The cloud.
    pub cloud: String,
    /// The upstream artifact and version.
    pub artifact: String,
    /// Changes to upstream's artifact (printed).
    pub changes: Vec<String>,
    /// The manager container's command (after its program) and args, verbatim.
    pub upstream_args: Vec<String>,
    /// The manager's command line as run (program first; paths under the run directory
    /// shown as `<run>`).
    pub argv: Vec<String>,
    /// What was mapped (mounts, in-cluster connection, node environment).
    pub mappings: Vec<String>,
    /// The per-node workload's command line (for one node), if any.
    pub node_manager_argv: Vec<String>,
    /// Whether the binaries were still running at the end.
    pub running: bool,
    /// How a binary ended when it did not keep running, with the end of its log.
    pub exited: Option<String>,
    /// The requests the apiserver refused (403 in its audit log) of upstream's ServiceAccounts.
    pub forbidden: Vec<String>,
    /// Nodes initialised, of how many.
    pub nodes: (usize, usize),
    /// The load balancer's address (None: not provisioned; `n/a` when the cloud has none).
    pub lb: Option<String>,
    /// Events per upstream source component.
    pub events: BTreeMap<String, usize>,
    /// Whether Events were expected (a load balancer was provisioned: the service controller
    /// reports it).
    pub events_expected: bool,
    /// Lease renewals seen (distinct renewTimes) and the lease's name.
    pub lease_renewals: usize,
    /// Whether the artifact runs leader election at all.
    pub leader_elect: bool,
    /// Where the logs are.
    pub logs: String,
    /// Seconds the run took.
    pub seconds: u64,
    /// A step that failed outright.
    pub error: Option<String>,
}

/// How many Lease renewals count as "renewed for several periods".
pub const LEASE_RENEWALS: usize = 3;

impl Outcome {
    /// Every criterion met.
    pub fn passed(&self) -> bool {
        self.error.is_none()
            && self.running
            && self.forbidden.is_empty()
            && self.nodes.0 == self.nodes.1
            && self.nodes.1 > 0
            && self.lb.is_some()
            && (!self.events_expected || self.events.values().sum::<usize>() > 0)
            && (!self.leader_elect || self.lease_renewals >= LEASE_RENEWALS)
    }
}

/// The source components upstream's controllers write core/v1 Events as.
pub const EVENT_SOURCES: [&str; 5] = [
    "service-controller",
    "cloud-node-controller",
    "cloud-node-lifecycle-controller",
    "route_controller",
    "cloud-node-manager",
];

/// The start of the `ccm-swap` and `ccm-differential` commands: warnings (or `RUST_LOG`'s
/// filter) logged to stderr, and a two-thread runtime (the machine runs control planes,
/// emulators and managers besides).
pub fn cli_runtime() -> std::io::Result<tokio::runtime::Runtime> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_client=off")),
        )
        .init();
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()
}

/// The exit code of such a command: 0 when `outcome` is `Ok(true)`, 1 for `Ok(false)` (a
/// difference or a failed run), 2 (the error printed, prefixed by `command`) when it could
/// not run.
pub fn cli_exit(command: &str, outcome: anyhow::Result<bool>) -> std::process::ExitCode {
    match outcome {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("{command}: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

/// The directory the workspace's binaries are in (`$CARGO_TARGET_DIR` or `<repo>/target`,
/// `debug`).
pub fn bin_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| tools::repo_root().join("target"))
        .join("debug")
}

/// A child process killed (TERM, then KILL) when dropped; its stdin kept open (emulators
/// exit when it closes).
pub struct Proc {
    /// What it is.
    pub name: String,
    /// The process.
    pub child: Child,
    /// Its stdin, held open.
    pub stdin: Option<ChildStdin>,
    /// Its log.
    pub log: PathBuf,
}

impl Proc {
    /// Spawns `argv` with `env`, output to `log`.
    pub fn spawn(
        name: &str,
        argv: &[String],
        env: &[(String, String)],
        log: &Path,
    ) -> Result<Proc, SwapError> {
        let (program, args) =
            argv.split_first().ok_or_else(|| step(format!("{name}: an empty command line")))?;
        let out = std::fs::File::create(log)
            .map_err(|e| step(format!("creating {}: {e}", log.display())))?;
        let err = out.try_clone().map_err(|e| step(format!("{}: {e}", log.display())))?;
        let mut child = Command::new(program)
            .args(args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdin(Stdio::piped())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(|e| step(format!("starting {name} ({program}): {e}")))?;
        let stdin = child.stdin.take();
        Ok(Proc { name: name.to_string(), child, stdin, log: log.to_path_buf() })
    }

    /// None while running; how it ended and the end of its log otherwise.
    pub fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(Some(status)) => Some(format!(
                "{} ended ({status}); the end of its log {}:\n{}",
                self.name,
                self.log.display(),
                crate::tail_lines(&crate::read_log(&self.log), 15)
            )),
            _ => None,
        }
    }

    /// TERM, up to 10 s, then KILL.
    pub fn stop(&mut self) {
        if self.child.try_wait().ok().flatten().is_some() {
            return;
        }
        let _ = Command::new("kill").arg("-TERM").arg(self.child.id().to_string()).status();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(10) {
            if self.child.try_wait().ok().flatten().is_some() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Starts `ccm-emulator <args>` (with `--exit-on-stdin-close`) and reads the `lines` it
/// prints first (its URL, then for HTTPS its CA file).
pub fn emulator(args: &[&str], lines: usize, log: &Path) -> Result<(Proc, Vec<String>), SwapError> {
    let bin = bin_dir().join("ccm-emulator");
    let mut child = Command::new(&bin)
        .args(args)
        .arg("--exit-on-stdin-close")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(
            std::fs::File::create(log)
                .map_err(|e| step(format!("creating {}: {e}", log.display())))?,
        )
        .spawn()
        .map_err(|e| step(format!("starting {} (cargo build --workspace): {e}", bin.display())))?;
    let stdin = child.stdin.take();
    let mut out = Vec::new();
    if let Some(stdout) = child.stdout.take() {
        let mut reader = BufReader::new(stdout);
        for _ in 0..lines {
            let mut line = String::new();
            reader.read_line(&mut line).map_err(|e| step(format!("ccm-emulator: {e}")))?;
            if line.trim().is_empty() {
                return Err(step(format!(
                    "ccm-emulator {} printed no address; its log {}:\n{}",
                    args.join(" "),
                    log.display(),
                    crate::read_log(log)
                )));
            }
            out.push(line.trim().to_string());
        }
        // Keep draining its stdout so it never blocks on a full pipe.
        std::thread::spawn(move || {
            let mut sink = String::new();
            while reader.read_line(&mut sink).map(|n| n > 0).unwrap_or(false) {
                sink.clear();
            }
        });
    }
    let name = format!("ccm-emulator {}", args.first().copied().unwrap_or_default());
    Ok((Proc { name, child, stdin, log: log.to_path_buf() }, out))
}

/// A TCP port nobody listens on now.
fn free_port() -> u16 {
    crate::free_port().unwrap_or(0)
}

fn port_taken(port: u16) -> bool {
    std::net::TcpListener::bind(("0.0.0.0", port)).is_err()
}

/// Expands `$(VAR)` in `s` from `env`, as the kubelet does (unknown references stay).
pub fn expand(s: &str, env: &[(String, String)]) -> String {
    let mut out = s.to_string();
    for (k, v) in env {
        out = out.replace(&format!("$({k})"), v);
    }
    out
}

/// The pod's command line for our binary: the container's `command` (its program is our
/// binary: the image is what is swapped) and `args`, `$(VAR)` expanded from `env`; then
/// each path under a volume mount mapped to `local_root/<volume>` and a busy host port
/// mapped to a free one (each mapping recorded).
pub fn command_line(
    container: &Value,
    binary: &Path,
    env: &[(String, String)],
    local_root: &Path,
    mappings: &mut Vec<String>,
) -> Result<Vec<String>, SwapError> {
    let strings = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    let command = strings(&container["command"]);
    let mut argv = vec![binary.display().to_string()];
    if let Some((program, rest)) = command.split_first() {
        mappings.push(format!("command {program:?} is our {}", file_name(binary)));
        argv.extend(rest.iter().cloned());
    } else {
        mappings.push(format!("the image's entrypoint is our {}", file_name(binary)));
    }
    argv.extend(strings(&container["args"]));
    let mounts: Vec<(String, String)> = container["volumeMounts"]
        .as_array()
        .map(|ms| {
            ms.iter()
                .filter_map(|m| {
                    Some((m["mountPath"].as_str()?.to_string(), m["name"].as_str()?.to_string()))
                })
                .collect()
        })
        .unwrap_or_default();
    let mut out = vec![argv[0].clone()];
    for arg in &argv[1..] {
        let mut a = expand(arg, env);
        if a != *arg {
            mappings.push(format!("{arg} expanded from the container's env: {a}"));
        }
        if let Some((flag, value)) = a.split_once('=') {
            if let Some((mount, volume)) =
                mounts.iter().find(|(m, _)| value.starts_with(&format!("{m}/")))
            {
                let local = local_root.join(volume).join(&value[mount.len() + 1..]);
                mappings.push(format!(
                    "mount {mount} (volume {volume}) -> {}",
                    local_root.join(volume).display()
                ));
                a = format!("{flag}={}", local.display());
            } else if matches!(flag, "--secure-port" | "--webhook-secure-port")
                && let Ok(port) = value.parse::<u16>()
                && port != 0
                && port_taken(port)
            {
                let free = free_port();
                mappings.push(format!("{flag}={port} is held by another process here: {free}"));
                a = format!("{flag}={free}");
            }
        }
        out.push(a);
    }
    mappings.sort();
    mappings.dedup();
    Ok(out)
}

fn file_name(p: &Path) -> String {
    p.file_name().map(|f| f.to_string_lossy().into_owned()).unwrap_or_default()
}

/// The container's env: literal values and `fieldRef: spec.nodeName` (`node`); other
/// sources are recorded as not mapped.
pub fn container_env(
    container: &Value,
    node: &str,
    mappings: &mut Vec<String>,
) -> Vec<(String, String)> {
    let mut env = Vec::new();
    for e in container["env"].as_array().cloned().unwrap_or_default() {
        let Some(name) = e["name"].as_str() else { continue };
        if let Some(v) = e["value"].as_str() {
            env.push((name.to_string(), v.to_string()));
        } else if e["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName" {
            env.push((name.to_string(), node.to_string()));
        } else {
            mappings.push(format!("env {name}: source {} not mapped", e["valueFrom"]));
        }
    }
    env
}

/// The flag's value in a command line (`--flag=value` or `--flag value`).
pub fn flag_value<'a>(argv: &'a [String], flag: &str) -> Option<&'a str> {
    let eq = format!("{flag}=");
    argv.iter().enumerate().find_map(|(i, a)| {
        if let Some(v) = a.strip_prefix(&eq) {
            Some(v)
        } else if a == flag {
            argv.get(i + 1).map(String::as_str)
        } else {
            None
        }
    })
}

async fn wait_until<T, F, Fut>(deadline: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = Instant::now();
    loop {
        if let Some(v) = f().await {
            return Some(v);
        }
        if start.elapsed() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A kubelet-style Node: the uninitialized taint, InternalIP and Hostname, Ready, `labels`.
pub fn kubelet_node(name: &str, ip: &str, labels: &Value) -> Result<Node, SwapError> {
    let mut node = serde_json::to_value(crate::fixtures::kubelet_node(name, ip, "True"))
        .map_err(|e| step(format!("node {name}: {e}")))?;
    if labels.is_object() {
        node["metadata"]["labels"] = labels.clone();
    }
    serde_json::from_value(node).map_err(|e| step(format!("node {name}: {e}")))
}

/// Whether a Node is initialised: providerID, no uninitialized taint, addresses.
pub fn initialised(node: &Node) -> bool {
    let Some(spec) = &node.spec else { return false };
    let tainted = spec.taints.as_ref().is_some_and(|ts| {
        ts.iter().any(|t| t.key == "node.cloudprovider.kubernetes.io/uninitialized")
    });
    let addresses =
        node.status.as_ref().and_then(|s| s.addresses.as_ref()).is_some_and(|a| !a.is_empty());
    spec.provider_id.as_deref().is_some_and(|p| !p.is_empty()) && !tainted && addresses
}

/// The ServiceAccount (namespace, name) a workload's pod runs as.
pub fn service_account(workload: &Value) -> (String, String) {
    let ns = chart::namespace(workload).unwrap_or("default").to_string();
    let spec = &workload["spec"]["template"]["spec"];
    let name = spec["serviceAccountName"]
        .as_str()
        .or(spec["serviceAccount"].as_str())
        .unwrap_or("default")
        .to_string();
    (ns, name)
}

/// Runs one case against `world` on a control plane of its own; never fails: a failed step
/// is the outcome's `error`.
pub async fn run(case: Case, world: World, dir: &Path) -> Outcome {
    let start = Instant::now();
    let mut outcome = Outcome {
        cloud: case.cloud.clone(),
        artifact: case.artifact.clone(),
        changes: case.changes.clone(),
        logs: dir.display().to_string(),
        ..Default::default()
    };
    if let Err(e) = run_steps(&case, world, dir, &mut outcome).await {
        outcome.error = Some(e.to_string());
    }
    outcome.seconds = start.elapsed().as_secs();
    // The run directory differs per run: `<run>` on the page.
    let here = dir.display().to_string();
    let hide = |s: &mut String| {
        *s = s.replace(&here, "<run>");
        // The emulators' CA files are in temporary directories of their own.
        while let Some(start) = s.find("/tmp/ccm-emulator-tls-") {
            let end = s[start..].find("/ca.crt").map_or(s.len(), |e| start + e + "/ca.crt".len());
            s.replace_range(start..end, "<the emulator's CA>");
        }
    };
    outcome.mappings.iter_mut().for_each(hide);
    outcome.argv.iter_mut().for_each(hide);
    outcome.node_manager_argv.iter_mut().for_each(hide);
    outcome.exited.iter_mut().for_each(hide);
    outcome.error.iter_mut().for_each(hide);
    outcome
}

/// A control plane prepared for a run: upstream's RBAC and the operator's objects applied,
/// tokens for upstream's ServiceAccounts, the manager's command line and environment.
pub struct Prepared {
    /// The control plane (audit log on).
    pub cp: ControlPlane,
    /// An admin client.
    pub admin: kube::Client,
    /// The manager's kubeconfig, then the per-node workload's (if any).
    pub kubeconfigs: Vec<PathBuf>,
    /// The manager's command line (program first).
    pub argv: Vec<String>,
    /// The manager's environment (the container's, then the node's).
    pub env: Vec<(String, String)>,
    /// The directory the volume mounts stand for.
    pub mounts: PathBuf,
    /// The audit log's position once the tokens worked.
    pub mark: crate::audit::Mark,
    /// The users of upstream's ServiceAccounts (`system:serviceaccount:<ns>:<name>`).
    pub users: Vec<String>,
}

/// Starts a control plane for `case` and prepares `binary` to run as upstream's manager
/// container (RBAC, tokens, command line, cloud config written for `world`); records the
/// mappings in `outcome`.
pub async fn prepare(
    case: &Case,
    world: &World,
    dir: &Path,
    binary: &Path,
    outcome: &mut Outcome,
) -> Result<Prepared, SwapError> {
    std::fs::create_dir_all(dir).map_err(|e| step(format!("creating {}: {e}", dir.display())))?;
    let tools = tools::Tools::locate()?;
    let cp =
        ControlPlane::start_with_options(tools, StartOptions { audit: true, ..Default::default() })
            .await?;
    let admin = cp.admin_client().await?;

    // Upstream's RBAC, and what the operator creates besides it.
    chart::apply_rbac(&admin, &case.objects).await?;
    if !world.extra_objects.is_empty() {
        chart::apply(&admin, &world.extra_objects).await?;
    }

    let manager = find_workload(&case.objects, &case.manager.0, &case.manager.1)?;
    let mut workloads = vec![("manager", manager)];
    if let Some((k, n)) = &case.node_manager {
        workloads.push(("node-manager", find_workload(&case.objects, k, n)?));
    }
    // Tokens for upstream's ServiceAccounts, once the authorizer knows their bindings.
    let mut kubeconfigs = Vec::new();
    for (role, w) in &workloads {
        let (ns, sa) = service_account(w);
        let client = chart::service_account_client(&cp, &admin, &ns, &sa).await?;
        let nodes: Api<Node> = Api::all(client);
        wait_until(Duration::from_secs(60), || {
            let nodes = nodes.clone();
            async move { nodes.list(&Default::default()).await.ok().map(drop) }
        })
        .await
        .ok_or_else(|| {
            step(format!("ServiceAccount {ns}/{sa} may not list Nodes under upstream's RBAC"))
        })?;
        let json = chart::service_account_kubeconfig(&cp, &admin, &ns, &sa).await?;
        let path = dir.join(format!("{role}.kubeconfig"));
        std::fs::write(&path, json.to_string())
            .map_err(|e| step(format!("{}: {e}", path.display())))?;
        kubeconfigs.push(path);
        outcome.mappings.push(format!(
            "in-cluster connection of {role}: --kubeconfig with a TokenRequest token of ServiceAccount {ns}/{sa}"
        ));
    }
    let mark = cp.audit_mark()?;
    let users: Vec<String> = workloads
        .iter()
        .map(|(_, w)| service_account(w))
        .map(|(ns, sa)| format!("system:serviceaccount:{ns}:{sa}"))
        .collect();

    // The manager's command line.
    let first_node = world.nodes.first().map(|n| n.0.clone()).unwrap_or_default();
    let container = &manager["spec"]["template"]["spec"]["containers"][0];
    let verbatim = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| a.iter().filter_map(|s| s.as_str().map(str::to_string)).collect())
            .unwrap_or_default()
    };
    outcome.upstream_args = verbatim(&container["command"]).into_iter().skip(1).collect();
    outcome.upstream_args.extend(verbatim(&container["args"]));
    let mut env = container_env(container, &first_node, &mut outcome.mappings);
    let mounts = dir.join("mounts");
    let mut argv = command_line(container, binary, &env, &mounts, &mut outcome.mappings)?;
    if let Some(config) = &world.config {
        let path = flag_value(&argv, "--cloud-config")
            .ok_or_else(|| step("the manager's command line has no --cloud-config"))?
            .to_string();
        let path = PathBuf::from(path);
        let parent = path.parent().unwrap_or(Path::new("."));
        std::fs::create_dir_all(parent).map_err(|e| step(format!("{}: {e}", parent.display())))?;
        let text = config(parent)?;
        std::fs::write(&path, text).map_err(|e| step(format!("{}: {e}", path.display())))?;
        outcome
            .mappings
            .push(format!("cloud config at {}: written for the emulator", path.display()));
    }
    argv.push(format!("--kubeconfig={}", kubeconfigs[0].display()));
    for (k, v) in &world.env {
        outcome.mappings.push(format!("node environment {k}={v}"));
    }
    env.extend(world.env.iter().cloned());
    outcome.argv = argv.clone();
    outcome.leader_elect = flag_value(&argv, "--leader-elect") != Some("false");
    Ok(Prepared { cp, admin, kubeconfigs, argv, env, mounts, mark, users })
}

/// A command line (program first), its environment, and the mappings it needed.
pub type NodeManagerCommand = (Vec<String>, Vec<(String, String)>, Vec<String>);

/// The per-node workload's command line and environment on `node` (a DaemonSet's pod there),
/// running `binary`; the mappings it needed.
pub fn node_manager_command(
    case: &Case,
    world: &World,
    prepared: &Prepared,
    node: &str,
    binary: &Path,
) -> Result<NodeManagerCommand, SwapError> {
    let (k, n) =
        case.node_manager.as_ref().ok_or_else(|| step("the artifact has no per-node workload"))?;
    let w = find_workload(&case.objects, k, n)?;
    let kubeconfig = prepared
        .kubeconfigs
        .get(1)
        .ok_or_else(|| step("no kubeconfig for the per-node workload"))?;
    let container = &w["spec"]["template"]["spec"]["containers"][0];
    let mut maps = Vec::new();
    let mut env = container_env(container, node, &mut maps);
    let mut argv = command_line(container, binary, &env, &prepared.mounts, &mut maps)?;
    argv.push(format!("--kubeconfig={}", kubeconfig.display()));
    env.extend(world.env.iter().cloned());
    for (k, v) in world.node_env.get(node).cloned().unwrap_or_default() {
        maps.push(format!("node {node}'s environment {k}={v}"));
        env.push((k, v));
    }
    Ok((argv, env, maps))
}

async fn run_steps(
    case: &Case,
    mut world: World,
    dir: &Path,
    outcome: &mut Outcome,
) -> Result<(), SwapError> {
    let binary = bin_dir().join(format!("cloud-controller-manager-{}", case.cloud));
    let prepared = prepare(case, &world, dir, &binary, outcome).await?;
    let Prepared { cp, admin, argv, env, mark, users, .. } = &prepared;
    let mut keep = KeepUnlessPassed { cp, passed: false };
    let kubeconfig_admin = cp.admin_kubeconfig_path().to_path_buf();

    let mut procs = vec![Proc::spawn("cloud-controller-manager", argv, env, &dir.join("ccm.log"))?];

    // Nodes as kubelets register them.
    let nodes_api: Api<Node> = Api::all(admin.clone());
    for (name, ip, labels) in &world.nodes {
        nodes_api
            .create(&PostParams::default(), &kubelet_node(name, ip, labels)?)
            .await
            .map_err(|e| step(format!("registering Node {name}: {e}")))?;
    }
    // The per-node workload, one per Node (a DaemonSet's pods).
    if case.node_manager.is_some() {
        let nm_binary = bin_dir().join(format!("cloud-node-manager-{}", case.cloud));
        for (name, _, _) in &world.nodes {
            let (nm_argv, env, maps) =
                node_manager_command(case, &world, &prepared, name, &nm_binary)?;
            if outcome.node_manager_argv.is_empty() {
                outcome.node_manager_argv = nm_argv.clone();
                outcome.mappings.extend(maps);
            }
            procs.push(Proc::spawn(
                &format!("cloud-node-manager on {name}"),
                &nm_argv,
                &env,
                &dir.join(format!("node-manager-{name}.log")),
            )?);
        }
    }
    outcome.mappings.extend(world.notes.iter().cloned());
    outcome.mappings.sort();
    outcome.mappings.dedup();

    // Nodes initialised.
    let total = world.nodes.len();
    let names: Vec<String> = world.nodes.iter().map(|n| n.0.clone()).collect();
    let count = |nodes_api: Api<Node>, names: Vec<String>| async move {
        let mut n = 0;
        for name in &names {
            if nodes_api.get(name).await.ok().is_some_and(|node| initialised(&node)) {
                n += 1;
            }
        }
        n
    };
    let done = wait_until(Duration::from_secs(90), || {
        let (api, names) = (nodes_api.clone(), names.clone());
        let alive = procs.iter_mut().all(|p| p.exited().is_none());
        async move {
            let n = count(api, names).await;
            (n == total || !alive).then_some(n)
        }
    })
    .await;
    outcome.nodes = (done.unwrap_or(count(nodes_api.clone(), names.clone()).await), total);

    // The LoadBalancer Service.
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    match world.lb_field {
        None => outcome.lb = Some("n/a".into()),
        Some(field) => {
            services
                .create(
                    &PostParams::default(),
                    &crate::fixtures::load_balancer_service("default", "web", 80),
                )
                .await
                .map_err(|e| step(format!("creating Service default/web: {e}")))?;
            outcome.events_expected = true;
            outcome.lb = wait_until(Duration::from_secs(90), || {
                let services = services.clone();
                let alive = procs[0].exited().is_none();
                async move {
                    if !alive {
                        return Some(None);
                    }
                    let ingress = services.get("web").await.ok()?.status?.load_balancer?.ingress?;
                    let first = serde_json::to_value(ingress.first()?).ok()?;
                    first[field].as_str().map(|s| Some(s.to_string()))
                }
            })
            .await
            .flatten();
        }
    }

    // The Lease renewed for several periods.
    if outcome.leader_elect {
        let name =
            flag_value(argv, "--leader-elect-resource-name").unwrap_or("cloud-controller-manager");
        let ns = flag_value(argv, "--leader-elect-resource-namespace").unwrap_or("kube-system");
        let leases: Api<Lease> = Api::namespaced(admin.clone(), ns);
        let mut seen = std::collections::BTreeSet::new();
        let start = Instant::now();
        while start.elapsed() < Duration::from_secs(45) && seen.len() < LEASE_RENEWALS + 1 {
            if let Ok(Some(l)) = leases.get_opt(name).await
                && let Some(t) = l.spec.and_then(|s| s.renew_time)
            {
                seen.insert(format!("{:?}", t.0));
            }
            if procs[0].exited().is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        // The first renewTime is the acquisition.
        outcome.lease_renewals = seen.len().saturating_sub(1);
    }

    // Events as `kubectl get events --field-selector source=<component>` lists them.
    for source in EVENT_SOURCES {
        let out = Command::new(&cp.tools().kubectl)
            .arg("--kubeconfig")
            .arg(&kubeconfig_admin)
            .args([
                "get",
                "events",
                "-A",
                "--field-selector",
                &format!("source={source}"),
                "-o",
                "name",
            ])
            .output()
            .map_err(|e| step(format!("running kubectl: {e}")))?;
        let n = String::from_utf8_lossy(&out.stdout).lines().filter(|l| !l.is_empty()).count();
        if n > 0 {
            outcome.events.insert(source.to_string(), n);
        }
    }

    // Still running; then stopped; then every refusal the apiserver audited.
    outcome.running = true;
    for p in &mut procs {
        if let Some(how) = p.exited() {
            outcome.running = false;
            outcome.exited = Some(how);
        }
    }
    for p in &mut procs {
        p.stop();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Upstream's ServiceAccounts, and with --use-service-account-credentials the
    // per-controller accounts the manager mints tokens for.
    let per_controller = flag_value(argv, "--use-service-account-credentials") == Some("true");
    let mut forbidden: Vec<String> = cp
        .forbidden_since(mark, |u| {
            users.iter().any(|x| x == u)
                || (per_controller && u.starts_with("system:serviceaccount:kube-system:"))
        })?
        .iter()
        .map(ToString::to_string)
        .collect();
    // One line per distinct refusal, with its count.
    let mut counted: BTreeMap<String, usize> = BTreeMap::new();
    for f in forbidden.drain(..) {
        *counted.entry(f).or_default() += 1;
    }
    outcome.forbidden = counted.into_iter().map(|(f, n)| format!("{n}× {f}")).collect();
    drop(world.keep.drain(..));
    keep.passed = outcome.passed();
    Ok(())
}

/// Keeps the control plane's logs (the audit log among them) unless the run passed.
struct KeepUnlessPassed<'a> {
    cp: &'a ControlPlane,
    passed: bool,
}

impl Drop for KeepUnlessPassed<'_> {
    fn drop(&mut self) {
        if !self.passed {
            self.cp.keep_logs("ccm-swap: the run did not pass");
        }
    }
}

/// The number of refused requests in an outcome.
pub fn forbidden_count(o: &Outcome) -> usize {
    o.forbidden
        .iter()
        .filter_map(|f| f.split_once('×').and_then(|(n, _)| n.trim().parse::<usize>().ok()))
        .sum()
}

/// The outcome as a Markdown table row: cloud, artifact, flags passed, Forbidden, Nodes, LB,
/// Events, Lease, result.
pub fn table_row(o: &Outcome) -> String {
    let flags: Vec<String> = o.upstream_args.iter().map(|a| format!("`{a}`")).collect();
    let events = if o.events.is_empty() {
        if o.events_expected { "0 ✗".to_string() } else { "0 (none expected)".to_string() }
    } else {
        o.events.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ")
    };
    let lease = if !o.leader_elect {
        "n/a (`--leader-elect=false`)".to_string()
    } else {
        format!(
            "{} renewals{}",
            o.lease_renewals,
            if o.lease_renewals >= LEASE_RENEWALS { "" } else { " ✗" }
        )
    };
    let result = match (&o.error, o.passed()) {
        (Some(_), _) => "**error**",
        (None, true) => "pass",
        (None, false) => "**fail**",
    };
    format!(
        "| {} | {} | {} | {}{} | {}/{}{} | {} | {} | {} | {}{} ({} s) |",
        o.cloud,
        o.artifact,
        flags.join(" "),
        forbidden_count(o),
        if o.forbidden.is_empty() { "" } else { " ✗" },
        o.nodes.0,
        o.nodes.1,
        if o.nodes.0 == o.nodes.1 && o.nodes.1 > 0 { "" } else { " ✗" },
        o.lb.as_deref().unwrap_or("none ✗"),
        events,
        lease,
        if o.running { "" } else { "exited ✗ " },
        result,
        o.seconds
    )
}

/// The table's header.
pub const TABLE_HEADER: &str = "| cloud | upstream artifact | flags passed | Forbidden | Nodes | LB | Events (`source=`) | Lease | result |\n|---|---|---|---|---|---|---|---|---|";

/// The details of an outcome (changes, mappings, refusals, failures) as Markdown.
pub fn details(o: &Outcome) -> String {
    let mut s = format!("#### {} — {}\n\n", o.cloud, o.artifact);
    let list = |title: &str, items: &[String]| -> String {
        if items.is_empty() {
            return String::new();
        }
        let mut t = format!("{title}:\n\n");
        for i in items {
            // `<run>` and the like are text, not HTML.
            t.push_str(&format!("- {}\n", i.replace('\n', " ").replace('<', "&lt;")));
        }
        t.push('\n');
        t
    };
    s.push_str(&list("Changes to upstream's artifact", &o.changes));
    s.push_str(&list("Mapped (a pod gets these from its node)", &o.mappings));
    if !o.node_manager_argv.is_empty() {
        s.push_str(&format!("Per-node workload: `{}`\n\n", o.node_manager_argv.join(" ")));
    }
    s.push_str(&list("Refused by the apiserver (audit log, 403)", &o.forbidden));
    if let Some(e) = &o.error {
        s.push_str(&format!("Error: `{}`\n\n", e.replace('\n', " ")));
    }
    if let Some(e) = &o.exited {
        s.push_str(&format!("Exited:\n\n```text\n{e}\n```\n\n"));
    }
    s
}

/// A fresh directory for a run under `$CCM_TESTBED_DIR` (or the temp dir)/swap.
pub fn run_dir(cloud: &str, n: usize) -> PathBuf {
    let base = std::env::var_os("CCM_TESTBED_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("ccm-testbed"));
    base.join(format!("swap-{}-{cloud}-{n}", std::process::id()))
}
