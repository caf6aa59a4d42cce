//! `ccm-bench`'s clouds (issue #35): one module per cloud sets up its world — the emulator
//! (ours, or moto / vcsim behind the fault proxy) with N instances, the manager's cloud
//! config, environment and flags — and hands back a [`World`] the cloud-neutral driver in
//! `src/bin/ccm_bench.rs` runs every manager against. The load-balancer phase (part 2) hangs
//! per-cloud extras off the same [`World`]: AWS's [`aws::Extra`] (moto, to add an instance);
//! on the kit's emulators a spare instance whose Node joins later ([`World::spare`]) and the
//! load balancers read from the emulator's state ([`lb_coverage`]). Per-cloud latency
//! profiles: [`profile`].
//!
//! Compiled into the `ccm-bench` binary only (`#[path]` from the binary).

pub mod aws;
pub mod azure;
pub mod gcp;
pub mod ibm;
pub mod openstack;
pub mod profile;
pub mod vsphere;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use tokio::io::AsyncBufReadExt as _;

/// The clouds `ccm-bench run --cloud` knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Cloud {
    Aws,
    Azure,
    Gcp,
    Openstack,
    Vsphere,
    Ibm,
}

impl Cloud {
    pub fn name(self) -> &'static str {
        match self {
            Cloud::Aws => "aws",
            Cloud::Azure => "azure",
            Cloud::Gcp => "gcp",
            Cloud::Openstack => "openstack",
            Cloud::Vsphere => "vsphere",
            Cloud::Ibm => "ibm",
        }
    }
}

/// What a cloud module needs to build its world.
pub struct Setup<'a> {
    /// Instances (and Nodes).
    pub nodes: usize,
    /// The run's working directory (world file, cloud config, emulator logs).
    pub dir: &'a Path,
    /// The `ccm-emulator` binary.
    pub emulator: &'a Path,
    /// Load balancers the load-balancer phase may create (cloud quotas raised to hold them).
    pub lb_capacity: usize,
    /// Whether the world needs a spare instance for a Node that joins later (the
    /// load-balancer phase's (a)); without it the world is part 1's, N instances.
    pub spare: bool,
}

/// One cloud's world, the same for every manager of a run.
pub struct World {
    /// The Nodes to register: name and internal IP, as the kubelet on each instance names
    /// itself.
    pub nodes: Vec<(String, String)>,
    /// The admin API (`/__emulator/`) counting the managers' cloud calls: the emulator's
    /// own, or the fault proxy's in front of moto / vcsim.
    pub admin: Admin,
    /// `--cloud-provider` (ours and upstream's name it alike).
    pub provider: &'static str,
    /// The cloud config file every manager reads.
    pub config: PathBuf,
    /// Environment of the managers (credentials, CA bundles).
    pub env: Vec<(String, String)>,
    /// Flags beyond the benchmark's own.
    pub args: Vec<String>,
    /// The largest page of the cloud's instance list (the call-count target is
    /// ⌈N/page⌉ + 5), or None where instances are looked up one by one (vSphere).
    pub page: Option<usize>,
    /// Facts about the world for the report (paging, what the emulator does not model).
    pub notes: Vec<String>,
    /// Processes and fixtures that live as long as the world.
    pub _keep: Vec<Box<dyn std::any::Any + Send>>,
    /// AWS only: what the load-balancer phase needs.
    pub aws: Option<aws::Extra>,
    /// An instance the cloud has from the start whose Node is registered only in the
    /// load-balancer phase (the Node that joins): name and internal IP. None on AWS (the
    /// phase runs a new instance) and where the phase does not run.
    pub spare: Option<(String, String)>,
    /// Node name → the `systemUUID` its kubelet reports, where the world knows the
    /// instance's (vSphere: the VM's BIOS UUID, which a kubelet on a VM with
    /// `disk.EnableUUID` reports and the managers look the VM up by). Other Nodes report a
    /// made-up one ([`crate::bench::node::kubelet_node`]).
    pub system_uuids: std::collections::HashMap<String, String>,
}

/// The kit's admin API at `url` (HTTPS when `ca` names the CA to trust).
#[derive(Debug, Clone)]
pub struct Admin {
    pub url: String,
    pub ca: Option<String>,
}

impl Admin {
    /// One admin call; the answer's body. Spoken through `curl` (TLS for the Azure emulator
    /// without a TLS client in this binary).
    pub async fn call(&self, method: &str, path: &str, body: &str) -> anyhow::Result<String> {
        let url = format!("{}/__emulator/{path}", self.url.trim_end_matches('/'));
        let mut cmd = tokio::process::Command::new("curl");
        cmd.args(["-sS", "--max-time", "60", "-X", method, "-w", "\n%{http_code}"]);
        if let Some(ca) = &self.ca {
            cmd.args(["--cacert", ca]);
        }
        if !body.is_empty() {
            cmd.args(["-H", "Content-Type: application/json", "--data-binary", body]);
        }
        let out = cmd.arg(&url).output().await.context("running curl for the admin API")?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        let (body, code) = text.rsplit_once('\n').unwrap_or(("", text.as_str()));
        anyhow::ensure!(
            out.status.success() && (code == "200" || code == "201"),
            "admin {method} {path}: HTTP {code} {} {}",
            body.chars().take(300).collect::<String>(),
            String::from_utf8_lossy(&out.stderr).trim()
        );
        Ok(body.to_string())
    }
}

/// A `ccm-emulator` process: killed when dropped, and it exits when its stdin closes.
pub struct Process {
    _child: tokio::process::Child,
    _stdin: tokio::process::ChildStdin,
}

/// Starts `ccm-emulator <args…> --exit-on-stdin-close` and reads the `lines` lines it prints
/// first (URL, then the CA file when it serves HTTPS); its stderr goes to `log`.
pub async fn emulator(
    bin: &Path,
    args: &[&str],
    lines: usize,
    log: &Path,
) -> anyhow::Result<(Process, Vec<String>)> {
    let mut child = tokio::process::Command::new(bin)
        .args(args)
        .arg("--exit-on-stdin-close")
        .env("RUST_LOG", "warn")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::fs::File::create(log).with_context(|| format!("{}", log.display()))?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {} {}", bin.display(), args.join(" ")))?;
    let stdout = child.stdout.take().context("emulator stdout")?;
    let stdin = child.stdin.take().context("emulator stdin")?;
    let mut out = tokio::io::BufReader::new(stdout).lines();
    let mut got = Vec::new();
    while got.len() < lines {
        let line = tokio::time::timeout(Duration::from_secs(600), out.next_line())
            .await
            .with_context(|| format!("{} {}: no URL within 600 s", bin.display(), args[0]))??
            .with_context(|| {
                format!(
                    "{} {} exited before printing its URL; see {}",
                    bin.display(),
                    args[0],
                    log.display()
                )
            })?;
        got.push(line.trim().trim_end_matches('/').to_string());
    }
    // Keep draining stdout so the emulator never blocks on a full pipe.
    tokio::spawn(async move { while let Ok(Some(_)) = out.next_line().await {} });
    Ok((Process { _child: child, _stdin: stdin }, got))
}

/// Writes `text` to `dir/name` and returns the path.
pub fn write(dir: &Path, name: &str, text: &str) -> anyhow::Result<PathBuf> {
    let p = dir.join(name);
    std::fs::write(&p, text).with_context(|| format!("writing {}", p.display()))?;
    Ok(p)
}

/// The `i`-th of `n` addresses spread over /24s from `a.b.c0.0` (`10 + i % 200` in each):
/// unique for up to 200·(256-c0) instances.
pub fn ip(prefix: &str, c0: usize, i: usize) -> String {
    format!("{prefix}.{}.{}", c0 + i / 200, 10 + i % 200)
}

/// Sets up `cloud`'s world.
pub async fn start(cloud: Cloud, s: &Setup<'_>) -> anyhow::Result<World> {
    match cloud {
        Cloud::Aws => aws::start(s).await,
        Cloud::Azure => azure::start(s).await,
        Cloud::Gcp => gcp::start(s).await,
        Cloud::Openstack => openstack::start(s).await,
        Cloud::Vsphere => vsphere::start(s).await,
        Cloud::Ibm => ibm::start(s).await,
    }
}

/// How many of the cloud's load balancers there are and how many have the Node `name` (IP
/// `ip`) as a member, read from the emulator's state (`GET /__emulator/state`); None where
/// the bench cannot tell (AWS reads moto instead; Azure's one shared load balancer; vSphere).
/// Each benchmark Service has one port, so one pool per load balancer.
pub fn lb_coverage(
    cloud: Cloud,
    state: &serde_json::Value,
    name: &str,
    ip: &str,
) -> Option<(usize, usize)> {
    fn arr(v: &serde_json::Value) -> &[serde_json::Value] {
        v.as_array().map_or(&[], Vec::as_slice)
    }
    match cloud {
        Cloud::Ibm => {
            let lbs = arr(&state["cloud"]["load_balancers"]);
            let with = lbs
                .iter()
                .filter(|lb| {
                    arr(&lb["pools"]).iter().any(|p| {
                        arr(&p["members"])
                            .iter()
                            .any(|m| m["target"]["address"].as_str() == Some(ip))
                    })
                })
                .count();
            Some((lbs.len(), with))
        }
        Cloud::Openstack => {
            let o = &state["cloud"]["octavia"];
            let pools = arr(&o["pools"]);
            let with: std::collections::BTreeSet<String> = arr(&o["members"])
                .iter()
                .filter(|m| m["address"].as_str() == Some(ip))
                .filter_map(|m| m["pool_id"].as_str().map(str::to_string))
                .collect();
            Some((pools.len(), with.len()))
        }
        Cloud::Gcp => {
            let pools = arr(&state["cloud"]["resources"]["targetPools"]);
            let suffix = format!("/instances/{name}");
            let with = pools
                .iter()
                .filter(|p| {
                    arr(&p["instances"])
                        .iter()
                        .any(|i| i.as_str().is_some_and(|s| s.ends_with(&suffix)))
                })
                .count();
            Some((pools.len(), with))
        }
        Cloud::Aws | Cloud::Azure | Cloud::Vsphere => None,
    }
}

/// Whether cloud operation `op` is a load-balancer call (what a Ready flap must not cause).
pub fn is_lb_op(cloud: Cloud, op: &str) -> bool {
    match cloud {
        Cloud::Aws => op.starts_with("elasticloadbalancing:"),
        Cloud::Ibm => op.starts_with("vpc.load_balancer"),
        Cloud::Openstack => op.starts_with("octavia.") || op.starts_with("neutron.floatingips"),
        Cloud::Gcp => [
            "compute.targetPools.",
            "compute.forwardingRules.",
            "compute.addresses.",
            "compute.firewalls.",
            "compute.httpHealthChecks.",
            "compute.healthChecks.",
            "compute.regionHealthChecks.",
            "compute.regionBackendServices.",
            "compute.backendServices.",
            "compute.instanceGroups.",
        ]
        .iter()
        .any(|p| op.starts_with(p)),
        Cloud::Azure => {
            op.starts_with("network.load_balancers.")
                || op.starts_with("network.public_ip_addresses.")
                || op.starts_with("network.network_security_groups.")
                || op.starts_with("network.network_interfaces.")
                || op.contains("virtual_machine_scale_set")
        }
        Cloud::Vsphere => false,
    }
}

/// How many of the cloud's load balancers there are and how many are provisioned (no longer
/// pending), from the emulator's state; None where the address already means provisioned
/// (OpenStack: the provider waits for `ACTIVE` before it answers) or the bench cannot tell.
/// On IBM a Service gets its hostname while its load balancer is still `create_pending`.
pub fn lbs_active(cloud: Cloud, state: &serde_json::Value) -> Option<(usize, usize)> {
    match cloud {
        Cloud::Ibm => {
            let lbs = state["cloud"]["load_balancers"].as_array().map_or(&[][..], Vec::as_slice);
            let active =
                lbs.iter().filter(|l| l["provisioning_status"].as_str() == Some("active")).count();
            Some((lbs.len(), active))
        }
        _ => None,
    }
}
