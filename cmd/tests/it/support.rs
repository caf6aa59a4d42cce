//! What every end-to-end test of a binary needs: a control plane, the manager as a process
//! with its log in a file, polling with a deadline, and readers for the Node fields the
//! cloud-node controller sets.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ccm_core::names;
use ccm_testbed::fixtures::kubelet_node;
use ccm_testbed::{ControlPlane, Identity};
use k8s_openapi::api::core::v1::Node;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::process::{Child, Command};

/// A running manager with its stderr in a file; killed on drop.
pub struct Ccm {
    _child: Child,
    log: PathBuf,
}

impl Ccm {
    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `needle` occurs at least `count` times in the log.
    #[allow(dead_code)]
    pub async fn wait_for_log(&self, needle: &str, count: usize) {
        wait_for(&format!("{count} × {needle:?} in the manager log"), || async {
            (self.logs().matches(needle).count() >= count).then_some(())
        })
        .await;
    }
}

/// The binary of one provider: its path, `--cloud-provider` name and the environment it runs
/// with (nothing of the caller's cloud credentials leaks in).
#[derive(Clone, Copy)]
pub struct Binary {
    pub path: &'static str,
    pub provider: &'static str,
    /// Environment variables removed (by prefix) from the caller's.
    pub clear_prefixes: &'static [&'static str],
    /// Environment variables set.
    pub env: &'static [(&'static str, &'static str)],
}

impl Binary {
    /// The binary with a clean environment and these arguments.
    pub fn command(&self, args: &[String]) -> Command {
        let mut cmd = Command::new(self.path);
        for (k, _) in std::env::vars_os() {
            let k_str = k.to_string_lossy();
            if self.clear_prefixes.iter().any(|p| k_str.starts_with(p)) {
                cmd.env_remove(&k);
            }
        }
        cmd.env_remove("SKIP_NODE_DELETION")
            .env("RUST_LOG", "info")
            .envs(self.env.iter().copied())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
        cmd
    }

    /// Runs the binary with this cloud config until it exits (it must fail at start): (exit
    /// code, stderr).
    pub async fn run_to_exit(&self, dir: &Path, cloud_config: &str) -> (Option<i32>, String) {
        let config = dir.join("cloud.conf");
        std::fs::write(&config, cloud_config).unwrap();
        let child = self
            .command(&[
                format!("--cloud-provider={}", self.provider),
                format!("--cloud-config={}", config.display()),
                format!("--kubeconfig={}", dir.join("no-such.kubeconfig").display()),
                "--leader-elect=false".into(),
                "--secure-port=0".into(),
                "--webhook-secure-port=0".into(),
            ])
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("the manager exits at start")
            .unwrap();
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Everything one test needs: a control plane, an admin client, a scratch directory (the
/// cloud config and the manager log), removed when the test passes and kept when it fails.
pub struct Env {
    pub cp: ControlPlane,
    pub client: Client,
    pub dir: PathBuf,
    bin: Binary,
}

impl Env {
    pub async fn start(bin: Binary) -> Env {
        let cp = ControlPlane::start().await.expect("control plane starts");
        let client = cp.admin_client().await.expect("admin client");
        let dir = std::env::temp_dir()
            .join(format!("ccm-{}-e2e", bin.provider))
            .join(ccm_testbed::unique_name("test"));
        std::fs::create_dir_all(&dir).unwrap();
        Env { cp, client, dir, bin }
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// Starts the manager with this cloud config, the admin kubeconfig, all controllers and
    /// a 1 s node monitor period; no leader election and no serving unless `extra` says so.
    pub fn spawn_ccm(&self, cloud_config: &str, extra: &[String]) -> Ccm {
        let config = self.dir.join("cloud.conf");
        std::fs::write(&config, cloud_config).unwrap();
        let kubeconfig = self.dir.join("admin.kubeconfig");
        self.cp.write_kubeconfig(&kubeconfig, &Identity::admin()).unwrap();
        let log = self.dir.join("ccm.log");
        let mut args = vec![
            format!("--cloud-provider={}", self.bin.provider),
            format!("--cloud-config={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--leader-elect=false".into(),
            "--webhook-secure-port=0".into(),
            "--controllers=*".into(),
            "--node-monitor-period=1s".into(),
        ];
        if !extra.iter().any(|a| a.starts_with("--secure-port")) {
            args.push("--secure-port=0".into());
        }
        args.extend(extra.iter().cloned());
        let child = self
            .bin
            .command(&args)
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("starting the cloud-controller-manager");
        Ccm { _child: child, log }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("manager config and log kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Polls until `f` returns `Some`, with a generous deadline (a failure, not a timing claim).
pub async fn wait_for<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    ccm_testbed::wait_for(what, Duration::from_secs(90), f).await
}

/// Registers a kubelet-style Node.
pub async fn register(nodes: &Api<Node>, name: &str, ip: &str, ready: &str) {
    nodes.create(&PostParams::default(), &kubelet_node(name, ip, ready)).await.unwrap();
}

pub fn has_taint(n: &Node, key: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

pub fn provider_id(n: &Node) -> Option<&str> {
    n.spec.as_ref()?.provider_id.as_deref()
}

pub fn label<'a>(n: &'a Node, key: &str) -> Option<&'a str> {
    n.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

pub fn addresses(n: &Node) -> Vec<(String, String)> {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| a.iter().map(|a| (a.type_.clone(), a.address.clone())).collect())
        .unwrap_or_default()
}

#[allow(dead_code)]
pub fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

/// Waits until the node has lost the uninitialized taint.
pub async fn initialised(nodes: &Api<Node>, name: &str) -> Node {
    wait_for(&format!("node {name} to be initialised"), || async {
        let n = nodes.get(name).await.ok()?;
        (!has_taint(&n, names::TAINT_UNINITIALIZED)).then_some(n)
    })
    .await
}

/// `curl -sk` with an optional bearer token: (HTTP status, body).
#[allow(dead_code)]
pub async fn curl(url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "10", "-w", "\n%{http_code}", url])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// A free loopback port.
#[allow(dead_code)]
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}
