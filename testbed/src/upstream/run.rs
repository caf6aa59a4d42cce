//! The proof that upstream's binaries start on our emulators (issue #31 point 3): one cloud's
//! swap case (upstream's own chart at its pinned version, rendered with its defaults:
//! `crate::swap::clouds`) run with upstream's binaries instead of ours, plus what
//! [`super::extra_env`] adds. Nodes register as kubelets do; then a LoadBalancer Service is
//! created and deleted. The report says whether the binaries kept running, how each Node was
//! initialised, the Service's address, whether its deletion finished (the service controller
//! removes its cleanup finalizer only once the cloud says the load balancer is gone), which
//! cloud resources the run left behind or removed (the emulator's state before the Service
//! and after its deletion), and every request the emulator refused (its request log) or the
//! stand-in had nothing for: each a candidate emulator gap.
//!
//! Upstream's binaries are found, prepared and started exactly as for the differential's
//! upstream side (`crate::differential::{upstream, start_manager, start_node_manager}`, on
//! `crate::swap::prepare`'s control plane, RBAC, tokens and command line).
//!
//! `ccm_testbed::upstream::run::prove(cloud, dir)`; the integration test
//! `upstream::upstream_ccm_starts_on_the_emulator_<cloud>` (ignored by default: it builds
//! upstream's CCM, ~10 min per cloud cold) runs it.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Node, Service};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::Value;

use super::proxy;
use crate::differential;
use crate::swap::{self, SwapError, clouds};

/// Errors of a proof run.
#[derive(Debug, thiserror::Error)]
pub enum RunError {
    /// Finding, preparing or starting upstream's binaries failed.
    #[error(transparent)]
    Differential(#[from] differential::DiffError),
    /// Reading the emulator through the stand-in's loopback client failed.
    #[error(transparent)]
    Upstream(#[from] super::UpstreamError),
    /// Swap's case or world failed.
    #[error(transparent)]
    Swap(#[from] SwapError),
    /// A step failed.
    #[error("{0}")]
    Step(String),
}

fn step(what: impl std::fmt::Display) -> RunError {
    RunError::Step(what.to_string())
}

/// What upstream's binaries did on our emulator.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct Report {
    /// The cloud.
    pub cloud: String,
    /// Upstream's artifact the command line came from.
    pub artifact: String,
    /// The manager's command line (program first).
    pub argv: Vec<String>,
    /// Whether every binary was still running after the Service was deleted.
    pub running: bool,
    /// How a binary ended, with the end of its log, when one did not keep running.
    pub exited: Vec<String>,
    /// Nodes initialised, of how many.
    pub nodes: (usize, usize),
    /// Each Node as initialised: name, providerID, zone, region, instance type, addresses.
    pub node_lines: Vec<String>,
    /// The Service's load-balancer address (`n/a`: the cloud has none).
    pub lb: Option<String>,
    /// Whether the Service's deletion finished (its cleanup finalizer removed).
    pub deleted: Option<bool>,
    /// Cloud resources the Service made (present once it had its address, not before).
    pub created: Vec<String>,
    /// Whether the emulator's state was read (false: no cloud-side check, as on vcsim).
    pub state_read: bool,
    /// Cloud resources present after the deletion that were not there before the Service.
    pub left_behind: Vec<String>,
    /// Cloud resources present before the Service that are gone after its deletion.
    pub removed: Vec<String>,
    /// Requests the emulator answered with an error (`<status> <method> <path> (<operation>)`
    /// and how many times).
    pub emulator_errors: Vec<String>,
    /// Requests the stand-in proxy had nothing for.
    pub unserved: Vec<String>,
    /// Requests the stand-in proxy forwarded.
    pub served: Vec<String>,
    /// Warning and error lines of the binaries' logs (`E`/`W` klog lines), first few.
    pub log_errors: Vec<String>,
    /// Where the logs are.
    pub logs: PathBuf,
    /// Seconds the run took.
    pub seconds: u64,
    /// A step that failed outright.
    pub error: Option<String>,
}

impl Report {
    /// Started, every Node initialised, the Service served (where the cloud has load
    /// balancers) and its deletion finished with nothing left behind and nothing else removed.
    pub fn passed(&self) -> bool {
        self.error.is_none()
            && self.running
            && self.nodes.1 > 0
            && self.nodes.0 == self.nodes.1
            && self.lb.is_some()
            && self.deleted != Some(false)
            && (!self.state_read || self.lb.as_deref() == Some("n/a") || !self.created.is_empty())
            && self.left_behind.is_empty()
            && self.removed.is_empty()
    }
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        writeln!(f, "upstream {} CCM on our emulator ({})", self.cloud, self.artifact)?;
        writeln!(f, "  command: {}", self.argv.join(" "))?;
        writeln!(f, "  running at the end: {}", self.running)?;
        for e in &self.exited {
            writeln!(f, "  exited: {e}")?;
        }
        writeln!(f, "  Nodes initialised: {}/{}", self.nodes.0, self.nodes.1)?;
        for n in &self.node_lines {
            writeln!(f, "    {n}")?;
        }
        writeln!(f, "  LoadBalancer address: {}", self.lb.as_deref().unwrap_or("none"))?;
        let deleted = match self.deleted {
            None => "n/a",
            Some(true) => "finished",
            Some(false) => "NOT finished",
        };
        writeln!(f, "  Service deletion: {deleted}")?;
        for (what, items) in [
            ("cloud resources the Service made", &self.created),
            ("left behind", &self.left_behind),
            ("removed (existed before)", &self.removed),
            ("emulator error answers", &self.emulator_errors),
            ("stand-in had nothing for", &self.unserved),
            ("stand-in forwarded", &self.served),
            ("log warnings/errors", &self.log_errors),
        ] {
            if !items.is_empty() {
                writeln!(f, "  {what}:")?;
                for i in items {
                    writeln!(f, "    {i}")?;
                }
            }
        }
        if let Some(e) = &self.error {
            writeln!(f, "  error: {e}")?;
        }
        write!(f, "  logs: {} ({} s)", self.logs.display(), self.seconds)
    }
}

/// Where the emulator's state and request log are read, and how.
enum CloudState {
    /// A `ccm-emulator` (admin API under `/__emulator/`).
    Emulator(String),
    /// moto (`/moto-api/data.json`).
    Moto(String),
    /// Nothing to read (vcsim: no load balancers).
    None,
}

impl CloudState {
    fn snapshot(&self) -> Result<BTreeSet<String>, RunError> {
        let url = match self {
            CloudState::Emulator(u) => format!("{u}/__emulator/state"),
            CloudState::Moto(u) => format!("{u}/moto-api/data.json"),
            CloudState::None => return Ok(BTreeSet::new()),
        };
        let (status, body) = proxy::loopback_get(&url)?;
        if status != 200 {
            return Err(step(format!("GET {url}: {status}")));
        }
        let v: Value =
            serde_json::from_str(&body).map_err(|e| step(format!("GET {url}: not JSON: {e}")))?;
        let mut out = BTreeSet::new();
        resource_ids(&v, "", &mut out);
        Ok(out)
    }

    fn errors(&self) -> Result<Vec<String>, RunError> {
        let CloudState::Emulator(u) = self else { return Ok(Vec::new()) };
        let url = format!("{u}/__emulator/requests");
        let (status, body) = proxy::loopback_get(&url)?;
        if status != 200 {
            return Err(step(format!("GET {url}: {status}")));
        }
        let v: Value =
            serde_json::from_str(&body).map_err(|e| step(format!("GET {url}: not JSON: {e}")))?;
        let list = v.as_array().cloned().or_else(|| v["requests"].as_array().cloned());
        let mut counted = std::collections::BTreeMap::<String, usize>::new();
        for r in list.unwrap_or_default() {
            let status = r["status"].as_u64().unwrap_or(0);
            if status >= 400 || status == 0 {
                let line = format!(
                    "{status} {} {} ({})",
                    r["method"].as_str().unwrap_or_default(),
                    r["path"].as_str().unwrap_or_default(),
                    r["operation"].as_str().unwrap_or_default()
                );
                *counted.entry(line).or_default() += 1;
            }
        }
        Ok(counted.into_iter().map(|(l, n)| format!("{n}× {l}")).collect())
    }
}

/// Every string under an `id`/`Id`/`ID` key (ARM IDs, Octavia/Neutron UUIDs, moto's ARNs and
/// IDs), with where it sits, as a set.
fn resource_ids(v: &Value, path: &str, out: &mut BTreeSet<String>) {
    // The emulators' records of long-running operations are not cloud resources.
    if path.rsplit('/').next() == Some("operations") {
        return;
    }
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let lk = k.to_ascii_lowercase();
                let is_id = lk == "id" || (lk.ends_with("arn") && lk.contains("loadbalancer"));
                if is_id && let Some(s) = x.as_str() {
                    out.insert(format!("{} {s}", top(path)));
                }
                resource_ids(x, &format!("{path}/{k}"), out);
            }
        }
        Value::Array(a) => {
            for x in a {
                resource_ids(x, path, out);
            }
        }
        _ => {}
    }
}

/// The first two segments of a state path (the collection a resource sits in).
fn top(path: &str) -> String {
    path.split('/').filter(|s| !s.is_empty()).take(2).collect::<Vec<_>>().join("/")
}

/// The emulator behind a swap world, read from the cloud config it wrote or its environment.
fn cloud_state(cloud: &str, config: Option<&str>, env: &[(String, String)]) -> CloudState {
    let origin = |url: &str| -> String {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let scheme = url.split_once("://").map_or("http", |(s, _)| s);
        format!("{scheme}://{}", rest.split('/').next().unwrap_or_default())
    };
    match cloud {
        "azure" => config
            .and_then(|c| serde_json::from_str::<Value>(c).ok())
            .and_then(|v| v["resourceManagerEndpoint"].as_str().map(origin))
            .map_or(CloudState::None, CloudState::Emulator),
        "openstack" => config
            .and_then(|c| {
                c.lines().find_map(|l| {
                    let (k, v) = l.split_once('=')?;
                    (k.trim() == "auth-url").then(|| origin(v.trim()))
                })
            })
            .map_or(CloudState::None, CloudState::Emulator),
        "aws" => env
            .iter()
            .find(|(k, _)| k == "AWS_ENDPOINT_URL")
            .map_or(CloudState::None, |(_, v)| CloudState::Moto(origin(v))),
        _ => CloudState::None,
    }
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
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

fn node_line(n: &Node) -> String {
    let labels = n.metadata.labels.clone().unwrap_or_default();
    let l = |k: &str| labels.get(k).cloned().unwrap_or_default();
    let addresses: Vec<String> = n
        .status
        .as_ref()
        .and_then(|s| s.addresses.clone())
        .unwrap_or_default()
        .iter()
        .map(|a| format!("{}={}", a.type_, a.address))
        .collect();
    format!(
        "{}: providerID={} zone={} region={} instance-type={} addresses={}",
        n.metadata.name.as_deref().unwrap_or_default(),
        n.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default(),
        l("topology.kubernetes.io/zone"),
        l("topology.kubernetes.io/region"),
        l("node.kubernetes.io/instance-type"),
        addresses.join(",")
    )
}

/// Runs upstream's binaries for `cloud` under swap's set-up for its first case (upstream's
/// chart with default values), files under `dir`; never fails: a failed step is the report's
/// `error`.
pub async fn prove(cloud: &str, dir: &Path) -> Report {
    let start = Instant::now();
    let mut report =
        Report { cloud: cloud.to_string(), logs: dir.to_path_buf(), ..Default::default() };
    if let Err(e) = prove_steps(cloud, dir, &mut report).await {
        report.error = Some(e.to_string());
    }
    report.seconds = start.elapsed().as_secs();
    report
}

async fn prove_steps(cloud: &str, dir: &Path, report: &mut Report) -> Result<(), RunError> {
    std::fs::create_dir_all(dir).map_err(|e| step(format!("creating {}: {e}", dir.display())))?;
    let case = clouds::cases(cloud)?
        .into_iter()
        .next()
        .ok_or_else(|| step(format!("swap has no case for {cloud}")))?;
    report.artifact = case.artifact.clone();
    // Upstream's binaries found, prepared and started as the differential's upstream side.
    let bins = differential::upstream(cloud, dir)?;
    let world = clouds::world(&case, &dir.join("world")).await?;
    let mut outcome = swap::Outcome::default();
    let prepared = swap::prepare(&case, &world, dir, &bins.manager, &mut outcome).await?;
    let _logs = prepared.cp.log_guard();
    let admin = prepared.admin.clone();
    let (manager, argv) = differential::start_manager(&prepared, &bins, &dir.join("ccm.log"))?;
    let config_text = swap::flag_value(&argv, "--cloud-config")
        .filter(|_| world.config.is_some())
        .and_then(|p| std::fs::read_to_string(p).ok());
    let mut env = prepared.env.clone();
    env.extend(bins.env.iter().cloned());
    let state = cloud_state(cloud, config_text.as_deref(), &env);
    report.argv = argv;
    let mut procs = vec![manager];

    // Nodes as kubelets register them, and the per-node workload on each.
    let nodes_api: Api<Node> = Api::all(admin.clone());
    for (name, ip, labels) in &world.nodes {
        nodes_api
            .create(&PostParams::default(), &swap::kubelet_node(name, ip, labels)?)
            .await
            .map_err(|e| step(format!("registering Node {name}: {e}")))?;
        let log = dir.join(format!("node-manager-{name}.log"));
        if let Some(p) =
            differential::start_node_manager(&case, &world, &prepared, &bins, name, &log)?
        {
            procs.push(p);
        }
    }

    // Nodes initialised.
    let total = world.nodes.len();
    let names: Vec<String> = world.nodes.iter().map(|n| n.0.clone()).collect();
    wait_until(Duration::from_secs(120), || {
        let (api, names) = (nodes_api.clone(), names.clone());
        let alive = procs.iter_mut().all(|p| p.exited().is_none());
        async move {
            let mut n = 0;
            for name in &names {
                if api.get(name).await.ok().is_some_and(|node| swap::initialised(&node)) {
                    n += 1;
                }
            }
            (n == total || !alive).then_some(())
        }
    })
    .await;
    let mut initialised = 0;
    for name in &names {
        if let Ok(node) = nodes_api.get(name).await {
            if swap::initialised(&node) {
                initialised += 1;
            }
            report.node_lines.push(node_line(&node));
        }
    }
    report.nodes = (initialised, total);

    // The LoadBalancer Service: address, then deletion.
    let before = state.snapshot()?;
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    match world.lb_field {
        None => report.lb = Some("n/a".into()),
        Some(field) => {
            let mut svc = crate::fixtures::load_balancer_service("default", "web", 80);
            // AWS: an NLB. Upstream v1.36.2 panics (nil HealthCheck in
            // ensureLoadBalancerHealthCheck) on moto's classic ELB: moto's
            // DescribeLoadBalancers has no HealthCheck for a new ELB, which AWS always returns.
            if cloud == "aws" {
                svc.metadata.annotations = Some(
                    [(
                        "service.beta.kubernetes.io/aws-load-balancer-type".to_string(),
                        "nlb".to_string(),
                    )]
                    .into(),
                );
            }
            services
                .create(&PostParams::default(), &svc)
                .await
                .map_err(|e| step(format!("creating Service default/web: {e}")))?;
            report.lb = wait_until(Duration::from_secs(180), || {
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
            let during = state.snapshot()?;
            report.created = during.difference(&before).cloned().collect();
            services
                .delete("web", &DeleteParams::default())
                .await
                .map_err(|e| step(format!("deleting Service default/web: {e}")))?;
            let gone = wait_until(Duration::from_secs(180), || {
                let services = services.clone();
                async move { matches!(services.get_opt("web").await, Ok(None)).then_some(()) }
            })
            .await;
            report.deleted = Some(gone.is_some());
            // The cloud settles (a delete operation still pending).
            tokio::time::sleep(Duration::from_secs(3)).await;
        }
    }
    let after = state.snapshot()?;
    report.state_read = !matches!(state, CloudState::None);
    report.left_behind = after.difference(&before).cloned().collect();
    report.removed = before.difference(&after).cloned().collect();
    report.emulator_errors = state.errors()?;

    report.running = true;
    for p in &mut procs {
        if let Some(how) = p.exited() {
            report.running = false;
            report.exited.push(how);
        }
    }
    for p in &mut procs {
        p.stop();
        let log = crate::read_log(&p.log);
        report.log_errors.extend(
            log.lines()
                .filter(|l| l.starts_with('E') || l.starts_with('W'))
                .take(8)
                .map(|l| format!("{}: {}", p.name, l.chars().take(300).collect::<String>())),
        );
    }
    if let Some(g) = &bins.guard {
        report.unserved = g.unserved();
        report.served = g.served();
    }
    if !report.passed() {
        prepared.cp.keep_logs("upstream's CCM did not pass on the emulator");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_ids_are_collected_with_their_collection() {
        let state = serde_json::json!({"cloud": {"loadBalancers": [{"id": "/s/1/lb/a", "name": "a"}],
            "publicIPs": {"x": {"id": "/s/1/pip/x"}}, "operations": [{"id": "lb.op-1"}]}});
        let mut ids = BTreeSet::new();
        resource_ids(&state, "", &mut ids);
        assert_eq!(
            ids.into_iter().collect::<Vec<_>>(),
            vec![
                "cloud/loadBalancers /s/1/lb/a".to_string(),
                "cloud/publicIPs /s/1/pip/x".to_string()
            ]
        );
    }

    #[test]
    fn the_emulator_is_found_from_the_cloud_config() {
        let azure = r#"{"resourceManagerEndpoint": "https://127.0.0.1:4443/"}"#;
        assert!(
            matches!(cloud_state("azure", Some(azure), &[]), CloudState::Emulator(u) if u == "https://127.0.0.1:4443")
        );
        let os = "[Global]\nauth-url = http://127.0.0.1:5000/identity/v3\n";
        assert!(
            matches!(cloud_state("openstack", Some(os), &[]), CloudState::Emulator(u) if u == "http://127.0.0.1:5000")
        );
        let env = vec![("AWS_ENDPOINT_URL".to_string(), "http://127.0.0.1:7000".to_string())];
        assert!(
            matches!(cloud_state("aws", None, &env), CloudState::Moto(u) if u == "http://127.0.0.1:7000")
        );
        assert!(matches!(cloud_state("vsphere", None, &[]), CloudState::None));
    }
}
