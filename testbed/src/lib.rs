//! The local testbed: a real etcd + kube-apiserver on loopback, for tests and the demo.
//!
//! Never shipped. It owns:
//! - finding the Kubernetes tools built by `ci/install-tools` ([`tools`]),
//! - generating the CAs and certificates envtest would (serving, service-account signer and a
//!   client CA that mints an identity for any user/groups) ([`pki`]),
//! - starting, health-checking and stopping the two processes ([`ControlPlane`]),
//! - the cloud emulators' processes: vcsim ([`vcsim`]) and moto ([`moto`]),
//! - objects as real components create them ([`fixtures`]) and polling with a deadline
//!   ([`wait_for`]).
//!
//! ```text
//!   test / demo ──kube::Client (client cert)──▶ kube-apiserver :random ──▶ etcd :random
//!        │                                          ▲ RBAC authorizer, real admission
//!        └── stdin pipe ──▶ supervisor (sh) ────────┘ kills both when the pipe closes
//! ```
//!
//! The supervisor is a small `sh` process that owns both servers and reads a pipe from us:
//! when this process ends for any reason (normal exit, a test panic with `panic=abort`,
//! SIGKILL), the pipe closes and the supervisor stops the servers and removes the data
//! directory. Server logs are kept when a test asked for it ([`ControlPlane::keep_logs`],
//! done automatically by [`LogGuard`] on panic) or when a server died on its own.
//!
//! Start-up watches the servers: one that exits while starting is reported at once with the
//! end of its log ([`Error::ServerExited`]), and a start that lost a port race (another
//! process bound a chosen port first: "address already in use") is retried on fresh ports,
//! up to [`START_ATTEMPTS`] times. moto ([`moto::Moto`]) does the same.

pub mod bench;
pub mod chart;
pub mod differential;
pub mod fixtures;
pub mod moto;
pub mod pki;
pub mod swap;
pub mod tools;
pub mod upstream;
pub mod vcsim;

use std::io::Write as _;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};

pub use pki::Identity;

/// Errors of the testbed. Each names what failed and where to look.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The Kubernetes tools were not found or not built.
    #[error("Kubernetes tools not available: {0}")]
    Tools(String),
    /// Certificate generation failed.
    #[error("generating certificates: {0}")]
    Pki(#[from] rcgen::Error),
    /// A file operation in the run directory failed.
    #[error("{what} ({path}): {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The underlying error.
        source: std::io::Error,
    },
    /// A server process exited while the control plane was starting: reported as soon as it
    /// is seen, with how it ended and the end of its log (a start that lost a port race or
    /// whose server was killed by a signal is retried first).
    #[error(
        "{server} exited during start-up ({how}; attempt {attempt} of {attempts}); the end of \
         its log, kept in {logs}:\n{tail}"
    )]
    ServerExited {
        /// `etcd` or `kube-apiserver`.
        server: &'static str,
        /// How it ended: `exit status N` or `killed by signal N (NAME)`.
        how: String,
        /// Whether a signal ended it (something outside it, not its own verdict).
        signalled: bool,
        /// Which start attempt this was (1-based).
        attempt: u32,
        /// How many attempts a lost port race gets.
        attempts: u32,
        /// The last lines of its log.
        tail: String,
        /// Where the logs are.
        logs: PathBuf,
    },
    /// The control plane did not become ready.
    #[error("control plane not ready after {waited:?}: {detail}; server logs kept in {logs}")]
    NotReady {
        /// How long we waited.
        waited: Duration,
        /// The last error seen.
        detail: String,
        /// Where the logs are.
        logs: PathBuf,
    },
    /// Building a client failed.
    #[error("building a client for {user}: {detail}")]
    Client {
        /// The identity.
        user: String,
        /// What failed.
        detail: String,
    },
    /// The supervisor of the servers is gone (the control plane was stopped) or did not
    /// take a command.
    #[error("control plane supervisor: {0}")]
    Supervisor(String),
    /// The shared control plane failed to start (for an earlier test of this binary).
    #[error("the shared control plane failed to start: {0}")]
    Shared(String),
    /// An identity cannot be expressed as a client certificate.
    #[error("identity {user}: {detail}")]
    Identity {
        /// The identity.
        user: String,
        /// What is wrong.
        detail: String,
    },
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> Error + 'a {
    move |source| Error::Io { what, path: path.to_path_buf(), source }
}

impl Error {
    /// Whether this is a server that exited because a port it was given was taken (another
    /// process bound it between our choosing it and the server binding it).
    pub fn lost_port_race(&self) -> bool {
        match self {
            Error::ServerExited { tail, .. } => log_says_port_taken(tail),
            _ => false,
        }
    }

    /// Whether a start that failed this way is worth another attempt on fresh ports: a lost
    /// port race, or a server killed by a signal during start-up (something outside it ended
    /// it; a server that exits with a status of its own, e.g. on a bad flag, would again).
    pub fn worth_retrying(&self) -> bool {
        self.lost_port_race() || matches!(self, Error::ServerExited { signalled: true, .. })
    }
}

impl Error {
    /// One line saying why a start is retried (the port conflict's log line, or the signal).
    fn retry_line(&self) -> String {
        let Error::ServerExited { server, tail, how, .. } = self else { return self.to_string() };
        match tail.lines().rev().find(|l| log_says_port_taken(l)) {
            Some(line) => format!("{server} exited: {}", line.trim()),
            None => format!("{server} {how} during start-up"),
        }
    }
}

/// Whether a server's log says it could not bind its port (Go's and Python's wording).
pub(crate) fn log_says_port_taken(log: &str) -> bool {
    let log = log.to_ascii_lowercase();
    log.contains("address already in use") || log.contains("eaddrinuse")
}

/// The last `n` lines of `text`.
pub(crate) fn tail_lines(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// How a wait status reads (`sh`'s `$?`: above 128 is a signal), and whether a signal it was.
pub(crate) fn describe_wait_status(status: &str) -> (String, bool) {
    match status.trim().parse::<u32>() {
        Ok(code) if code > 128 => {
            let sig = code - 128;
            let name = match sig {
                1 => " (SIGHUP)",
                2 => " (SIGINT)",
                6 => " (SIGABRT)",
                9 => " (SIGKILL)",
                11 => " (SIGSEGV)",
                13 => " (SIGPIPE)",
                15 => " (SIGTERM)",
                _ => "",
            };
            (format!("killed by signal {sig}{name}"), true)
        }
        Ok(code) => (format!("exit status {code}"), false),
        Err(_) => (format!("unknown wait status {:?}", status.trim()), false),
    }
}

/// The text of a log file, lossily decoded; a file that cannot be read says why instead.
pub(crate) fn read_log(path: &Path) -> String {
    match std::fs::read(path) {
        Ok(bytes) => String::from_utf8_lossy(&bytes).into_owned(),
        Err(e) => format!("(the log {} could not be read: {e})", path.display()),
    }
}

/// How many times a control-plane start that lost a port race (or whose server was killed by
/// a signal) is tried, on fresh ports.
pub const START_ATTEMPTS: u32 = 4;

/// Options for [`ControlPlane::start_with_options`]; the default picks free ports.
#[derive(Debug, Clone, Default)]
pub struct StartOptions {
    /// etcd's client port on the first attempt (a test holds it to lose the port race).
    pub etcd_port: Option<u16>,
    /// kube-apiserver's secure port on the first attempt.
    pub api_port: Option<u16>,
    /// `--service-cluster-ip-range` (default `10.0.0.0/24`; ci/bench's thousand
    /// LoadBalancer Services need a larger one).
    pub service_cidr: Option<String>,
    /// Write the apiserver's audit log (Metadata level, every identity but `system:masters`)
    /// to `logs/audit.log`, where [`ControlPlane::forbidden_since`] reads the RBAC denials.
    /// Off by default (every test's control plane would pay for the writes); also turned on
    /// for every control plane by `CCM_TESTBED_AUDIT=1`.
    pub audit: bool,
}

/// The admin identity: in `system:masters`, so it bypasses RBAC (as envtest's default user).
pub const ADMIN_USER: &str = "testbed-admin";
/// The group of the admin identity.
pub const ADMIN_GROUP: &str = "system:masters";

/// How long to wait for `/readyz`. Cold starts on a 2-core machine take ~10 s.
const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// A running etcd + kube-apiserver pair on loopback.
pub struct ControlPlane {
    run_dir: PathBuf,
    server: String,
    ca_pem: String,
    pki: pki::Pki,
    tools: tools::Tools,
    admin_kubeconfig: PathBuf,
    etcd_url: String,
    attempts: u32,
    audit_log: Option<PathBuf>,
    supervisor: Mutex<Option<(Child, ChildStdin)>>,
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ControlPlane")
            .field("server", &self.server)
            .field("run_dir", &self.run_dir)
            .finish_non_exhaustive()
    }
}

static SHARED: tokio::sync::OnceCell<Result<ControlPlane, String>> =
    tokio::sync::OnceCell::const_new();
static RUN_COUNTER: AtomicU64 = AtomicU64::new(0);
static NAME_COUNTER: AtomicU64 = AtomicU64::new(0);

/// A name unique within this process and across concurrent test processes, for isolating
/// tests that share one control plane: `<prefix>-<pid>-<n>`, lowercase and DNS-1123 safe.
pub fn unique_name(prefix: &str) -> String {
    let n = NAME_COUNTER.fetch_add(1, Ordering::Relaxed);
    format!("{prefix}-{}-{n}", std::process::id())
}

/// Polls `f` every 100 ms until it returns `Some`; panics naming `what` after `deadline`.
///
/// A test fixture: the deadline turns a hang into a failure that says what never happened;
/// it is not a claim about how fast anything is.
pub async fn wait_for<T, F, Fut>(what: &str, deadline: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let start = std::time::Instant::now();
    loop {
        if let Some(v) = f().await {
            return v;
        }
        if start.elapsed() >= deadline {
            panic!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A loopback TCP port nobody listens on now, for a server a test starts a moment later.
///
/// The kernel's own choice (`bind(0)`) comes from the ephemeral range, which every outgoing
/// connection on the machine draws its local port from too: between this call and the
/// server's bind, a client of another test (concurrent test binaries make thousands of
/// connections) could take the port, and the server then fails to start. So the port is
/// drawn at random from below the ephemeral range (`/proc/sys/net/ipv4/ip_local_port_range`,
/// default 32768-60999), where the kernel never assigns ports on its own, and checked free
/// on 127.0.0.1 and 0.0.0.0; the kernel's choice only when no such port is found.
pub fn free_port() -> Result<u16, Error> {
    let low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
        .ok()
        .and_then(|s| s.split_whitespace().next().and_then(|v| v.parse::<u16>().ok()))
        .unwrap_or(32768);
    // 20000..low: clear of the ports Kubernetes components default to (10248-10259, 6443,
    // 2379/2380), which a manager started without flags by another test binds.
    if low > 21000 {
        let span = u64::from(low - 20000);
        for attempt in 0..64u64 {
            use std::hash::{BuildHasher, Hasher};
            let mut h = std::collections::hash_map::RandomState::new().build_hasher();
            h.write_u64(attempt);
            h.write_u32(std::process::id());
            let port = 20000 + (h.finish() % span) as u16;
            if TcpListener::bind(("127.0.0.1", port)).is_ok()
                && TcpListener::bind(("0.0.0.0", port)).is_ok()
            {
                return Ok(port);
            }
        }
    }
    let l = TcpListener::bind("127.0.0.1:0")
        .map_err(io_err("binding a free port", Path::new("127.0.0.1:0")))?;
    let port =
        l.local_addr().map_err(io_err("reading the bound port", Path::new("127.0.0.1:0")))?.port();
    Ok(port)
}

/// Creates a new, empty run directory under `base`. The name (`run-<pid>-<n>`) alone is not
/// unique over time: process IDs are reused, and a kept run directory of an earlier process
/// with the same ID once made start-up read that run's pid file and report a live
/// kube-apiserver as exited. So the directory is created exclusively, with a suffix when the
/// name is taken.
fn fresh_run_dir(base: &Path) -> Result<PathBuf, Error> {
    std::fs::create_dir_all(base).map_err(io_err("creating the testbed directory", base))?;
    let stem =
        format!("run-{}-{}", std::process::id(), RUN_COUNTER.fetch_add(1, Ordering::Relaxed));
    let mut suffix = 0u32;
    loop {
        let name = if suffix == 0 { stem.clone() } else { format!("{stem}-{suffix}") };
        let dir = base.join(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists && suffix < 10_000 => {
                suffix += 1;
            }
            Err(e) => return Err(io_err("creating the run directory", &dir)(e)),
        }
    }
}

fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

fn write_file(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(io_err("writing", path))
}

/// The supervisor script: starts both servers, waits for our pipe to close (or a `stop` /
/// `kill` line), then kills them (SIGKILL) and cleans up. A test cluster's data is thrown
/// away, so a graceful shutdown buys nothing and costs a lot: the apiserver drains open
/// watches for up to a minute (every test whose controllers still watched paid it), and
/// without etcd it takes ~20 s. Logs are kept when `KEEP` exists, when `CCM_TESTBED_KEEP` is
/// set, or when a server had died by itself.
///
/// Each server runs under a small waiter (`serve`) that reaps it and writes its wait status
/// to `<server>.exit`: start-up learns that a server ended, and how (an exit code is the
/// server's own verdict; a status above 128 is a signal from outside), from that file rather
/// than from `/proc`, and a server that already ended is never signalled by a pid that may
/// since belong to another process. Stopping sends TERM to the waiter, which SIGKILLs its
/// server.
///
/// The scripts are run by `sh`, not executed: we just wrote them, and another thread of this
/// process forking at that moment can hold the write descriptor until its child execs, which
/// makes executing the file fail with ETXTBSY ("Text file busy").
const SUPERVISOR: &str = r#"
dir=$1
serve() {
  sh "$dir/$1.sh" >"$dir/logs/$1.log" 2>&1 </dev/null & p=$!
  echo "$p" >"$dir/$1.pid"
  trap 'kill -KILL "$p" 2>/dev/null; wait "$p"; exit 0' TERM
  wait "$p"; s=$?
  trap - TERM
  echo "$s" >"$dir/$1.exit.tmp"; mv "$dir/$1.exit.tmp" "$dir/$1.exit"
}
serve etcd & etcd=$!
serve kube-apiserver & api=$!
# One command per line: api-stop / api-start (an outage of the apiserver alone, etcd keeps
# running); anything else, or the end of input, stops both servers.
while read -r line; do
  case "$line" in
  api-stop) kill -TERM $api 2>/dev/null; wait $api 2>/dev/null; rm -f "$dir/kube-apiserver.exit" ;;
  api-start) serve kube-apiserver & api=$! ;;
  *) break ;;
  esac
done
for s in kube-apiserver etcd; do
  [ -e "$dir/$s.exit" ] && echo "$s exited early (status $(cat "$dir/$s.exit"))" >>"$dir/KEEP"
done
kill -TERM $api 2>/dev/null; wait $api 2>/dev/null
kill -TERM $etcd 2>/dev/null; wait $etcd 2>/dev/null
rm -rf "$dir/etcd-data" "$dir/pki"
if [ -e "$dir/KEEP" ] || [ -n "${CCM_TESTBED_KEEP:-}" ]; then exit 0; fi
rm -rf "$dir"
"#;

impl ControlPlane {
    /// The control plane shared by every test of this test binary (started on first use).
    /// Tests isolate themselves with [`unique_name`]; they must not assume an empty cluster.
    /// A failed start is remembered, so the other tests fail at once with the same error.
    pub async fn shared() -> Result<&'static ControlPlane, Error> {
        let started =
            SHARED.get_or_init(|| async { Self::start().await.map_err(|e| e.to_string()) });
        match started.await {
            Ok(cp) => Ok(cp),
            Err(e) => Err(Error::Shared(e.clone())),
        }
    }

    /// Starts a new control plane with the tools from `ci/install-tools`.
    pub async fn start() -> Result<ControlPlane, Error> {
        let tools = tools::Tools::locate()?;
        Self::start_with(tools).await
    }

    /// Starts a new control plane with the given tools.
    pub async fn start_with(tools: tools::Tools) -> Result<ControlPlane, Error> {
        Self::start_with_options(tools, StartOptions::default()).await
    }

    /// Starts a new control plane. A server that exits during start-up is reported at once
    /// with the end of its log; one that exited because its port was taken meanwhile (the
    /// ports are chosen free, but another process may bind one before the server does) is
    /// started again on fresh ports, up to [`START_ATTEMPTS`] times.
    pub async fn start_with_options(
        tools: tools::Tools,
        options: StartOptions,
    ) -> Result<ControlPlane, Error> {
        let mut attempt = 1;
        loop {
            let pinned = if attempt == 1 {
                options.clone()
            } else {
                StartOptions {
                    service_cidr: options.service_cidr.clone(),
                    audit: options.audit,
                    ..Default::default()
                }
            };
            let mut cp = Self::spawn(tools.clone(), &pinned)?;
            cp.attempts = attempt;
            match cp.wait_ready().await {
                Ok(()) => {
                    tracing::info!(server = %cp.server, run_dir = %cp.run_dir.display(), attempt, "control plane ready");
                    return Ok(cp);
                }
                Err(e) if e.worth_retrying() && attempt < START_ATTEMPTS => {
                    let line = e.retry_line();
                    tracing::warn!(attempt, %line, "control plane start failed; retrying on fresh ports");
                    eprintln!("ccm-testbed: attempt {attempt}: {line}; retrying on fresh ports");
                    if e.lost_port_race() {
                        cp.kill();
                        let _ = std::fs::remove_dir_all(&cp.run_dir);
                    } else {
                        // Unexplained: keep this attempt's logs for whoever investigates.
                        cp.keep_logs(&format!("attempt {attempt}: {line}"));
                        cp.kill();
                    }
                    attempt += 1;
                }
                Err(e) => {
                    cp.keep_logs("start-up failed");
                    cp.kill();
                    return Err(e);
                }
            }
        }
    }

    /// Writes the run directory and starts the supervisor with both servers (not waiting).
    fn spawn(tools: tools::Tools, pinned: &StartOptions) -> Result<ControlPlane, Error> {
        let base = std::env::var_os("CCM_TESTBED_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join("ccm-testbed"));
        let run_dir = fresh_run_dir(&base)?;
        for d in ["logs", "pki", "etcd-data"] {
            let p = run_dir.join(d);
            std::fs::create_dir_all(&p).map_err(io_err("creating the run directory", &p))?;
        }
        let pki_dir = run_dir.join("pki");
        let pki = pki::Pki::generate()?;
        pki.write_server_files(&pki_dir)?;

        let etcd_port = match pinned.etcd_port {
            Some(p) => p,
            None => free_port()?,
        };
        let etcd_peer_port = free_port()?;
        let api_port = match pinned.api_port {
            Some(p) => p,
            None => free_port()?,
        };
        let server = format!("https://127.0.0.1:{api_port}");
        let etcd_url = format!("http://127.0.0.1:{etcd_port}");
        let peer_url = format!("http://127.0.0.1:{etcd_peer_port}");

        let etcd_args = [
            "--name=testbed".to_string(),
            format!("--data-dir={}", run_dir.join("etcd-data").display()),
            format!("--listen-client-urls={etcd_url}"),
            format!("--advertise-client-urls={etcd_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=testbed={peer_url}"),
            // Test data is throwaway: skip fsync, which dominates etcd latency on slow disks.
            "--unsafe-no-fsync=true".to_string(),
            "--log-level=warn".to_string(),
        ];
        let p = |f: &str| pki_dir.join(f).display().to_string();
        let api_args = [
            format!("--etcd-servers={etcd_url}"),
            format!("--secure-port={api_port}"),
            "--bind-address=127.0.0.1".to_string(),
            // Needed offline: without it the apiserver looks for a default route and dies.
            "--advertise-address=127.0.0.1".to_string(),
            format!("--cert-dir={}", p("")),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p("client-ca.crt")),
            format!("--service-account-key-file={}", p("sa-signer.pub")),
            format!("--service-account-signing-key-file={}", p("sa-signer.key")),
            format!("--service-account-issuer={server}"),
            format!(
                "--service-cluster-ip-range={}",
                pinned.service_cidr.as_deref().unwrap_or("10.0.0.0/24")
            ),
            // RBAC on, as in production.
            "--authorization-mode=RBAC".to_string(),
            "--allow-privileged=true".to_string(),
            "--enable-priority-and-fairness=false".to_string(),
            "--v=1".to_string(),
        ];
        let audit_log = (pinned.audit || std::env::var_os("CCM_TESTBED_AUDIT").is_some())
            .then(|| run_dir.join("logs").join("audit.log"));
        let mut api_args = api_args.to_vec();
        if let Some(log) = &audit_log {
            let policy = run_dir.join("audit-policy.yaml");
            write_file(&policy, audit::POLICY)?;
            api_args.push(format!("--audit-policy-file={}", policy.display()));
            api_args.push(format!("--audit-log-path={}", log.display()));
            api_args.push("--audit-log-format=json".to_string());
            // No rotation: a mark is a byte offset into this one file.
            api_args.push("--audit-log-maxsize=0".to_string());
        }
        let script = |bin: &Path, args: &[String]| {
            let mut s = String::from("#!/bin/sh\nexec ");
            s.push_str(&sh_quote(&bin.display().to_string()));
            for a in args {
                s.push_str(" \\\n  ");
                s.push_str(&sh_quote(a));
            }
            s.push('\n');
            s
        };
        for (name, bin, args) in [
            ("etcd.sh", &tools.etcd, &etcd_args[..]),
            ("kube-apiserver.sh", &tools.kube_apiserver, &api_args[..]),
        ] {
            let path = run_dir.join(name);
            write_file(&path, &script(bin, args))?;
            set_executable(&path)?;
        }

        let mut child = Command::new("sh")
            .arg("-c")
            .arg(SUPERVISOR)
            .arg("ccm-testbed-supervisor")
            .arg(&run_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io_err("spawning the supervisor (sh)", Path::new("sh")))?;
        let Some(stdin) = child.stdin.take() else {
            return Err(Error::Tools("the supervisor's stdin pipe was not created".into()));
        };

        let admin_kubeconfig = run_dir.join("admin.kubeconfig");
        let cp = ControlPlane {
            ca_pem: pki.server_ca_pem(),
            run_dir,
            server,
            pki,
            tools,
            admin_kubeconfig,
            etcd_url,
            attempts: 1,
            audit_log,
            supervisor: Mutex::new(Some((child, stdin))),
        };
        cp.write_kubeconfig(&cp.admin_kubeconfig, &Identity::admin())?;
        Ok(cp)
    }

    async fn wait_ready(&self) -> Result<(), Error> {
        let start = tokio::time::Instant::now();
        let client = self.client(&Identity::admin()).await?;
        let mut last = String::from("not polled yet");
        while start.elapsed() < READY_TIMEOUT {
            if let Some(exited) = self.dead_server() {
                return Err(exited);
            }
            let req = http::Request::get("/readyz").body(Vec::new()).map_err(|e| {
                Error::Client { user: crate::ADMIN_USER.into(), detail: e.to_string() }
            })?;
            // Bounded: a port held by another process may accept and never answer.
            let probe = tokio::time::timeout(Duration::from_secs(5), client.request_text(req));
            match probe.await {
                Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
                Ok(Ok(body)) => last = body,
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "/readyz did not answer within 5 s".into(),
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        Err(Error::NotReady { waited: start.elapsed(), detail: last, logs: self.log_dir() })
    }

    /// If a server process has exited, says which and how, with the end of its log. (Its
    /// waiter writes `<server>.exit` once it has reaped it; the log is complete by then.)
    fn dead_server(&self) -> Option<Error> {
        for server in ["etcd", "kube-apiserver"] {
            let Ok(status) = std::fs::read_to_string(self.run_dir.join(format!("{server}.exit")))
            else {
                continue;
            };
            let (how, signalled) = describe_wait_status(&status);
            let text = read_log(&self.log_dir().join(format!("{server}.log")));
            return Some(Error::ServerExited {
                server,
                how,
                signalled,
                attempt: self.attempts,
                attempts: START_ATTEMPTS,
                tail: tail_lines(&text, 20),
                logs: self.log_dir(),
            });
        }
        None
    }

    /// The apiserver URL (`https://127.0.0.1:<port>`).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// etcd's client URL (`http://127.0.0.1:<port>`).
    pub fn etcd_url(&self) -> &str {
        &self.etcd_url
    }

    /// On which attempt the control plane came up (1 unless a port race was lost).
    pub fn start_attempts(&self) -> u32 {
        self.attempts
    }

    /// PEM of the CA that signed the apiserver's serving certificate.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The directory with the servers' logs (`etcd.log`, `kube-apiserver.log`).
    pub fn log_dir(&self) -> PathBuf {
        self.run_dir.join("logs")
    }

    /// The tools the control plane runs with (kubectl, kube-controller-manager are there too).
    pub fn tools(&self) -> &tools::Tools {
        &self.tools
    }

    /// A kubeconfig file for the admin identity.
    pub fn admin_kubeconfig_path(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// The apiserver's audit log, when the control plane was started with
    /// [`StartOptions::audit`].
    pub fn audit_log_path(&self) -> Option<&Path> {
        self.audit_log.as_deref()
    }

    /// A point in the audit log: [`ControlPlane::forbidden_since`] reads what was logged after
    /// it. Fails when the control plane has no audit log.
    pub fn audit_mark(&self) -> Result<audit::Mark, Error> {
        let path = self.audit_log_path().ok_or_else(|| {
            Error::Tools("this control plane was started without an audit log".into())
        })?;
        Ok(audit::Mark::of(path))
    }

    /// Every request the apiserver answered 403 Forbidden (RBAC denials included: the
    /// authorizer's refusals are audited, unlike in `apiserver_request_total`) after `mark`,
    /// for users `user` accepts. The audit backend writes an event once the answer is sent:
    /// a request answered in the last moment may not be there yet (wait a second first).
    pub fn forbidden_since(
        &self,
        mark: &audit::Mark,
        user: impl Fn(&str) -> bool,
    ) -> Result<Vec<audit::Denial>, Error> {
        let path = self.audit_log_path().ok_or_else(|| {
            Error::Tools("this control plane was started without an audit log".into())
        })?;
        audit::denials_since(path, mark, user)
    }

    /// Keeps the server logs after this process ends, and says where they are on stderr.
    pub fn keep_logs(&self, why: &str) {
        let marker = self.run_dir.join("KEEP");
        let _ = std::fs::write(&marker, why);
        eprintln!("ccm-testbed: {why}; control plane logs kept in {}", self.log_dir().display());
    }

    /// A guard that keeps the logs if the current test panics while it is alive.
    pub fn log_guard(&self) -> LogGuard<'_> {
        LogGuard { cp: self }
    }

    /// The kubeconfig (as JSON, which is valid YAML) for an identity.
    pub fn kubeconfig_json(&self, id: &Identity) -> Result<serde_json::Value, Error> {
        let (cert, key) = self.pki.client_cert(id)?;
        Ok(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "testbed", "cluster": {
                "server": self.server,
                "certificate-authority-data": b64(self.ca_pem.as_bytes()),
            }}],
            "users": [{"name": id.user, "user": {
                "client-certificate-data": b64(cert.as_bytes()),
                "client-key-data": b64(key.as_bytes()),
            }}],
            "contexts": [{"name": "testbed", "context": {"cluster": "testbed", "user": id.user}}],
            "current-context": "testbed",
        }))
    }

    /// Writes a kubeconfig file for an identity (mode 0600).
    pub fn write_kubeconfig(&self, path: &Path, id: &Identity) -> Result<(), Error> {
        let json = self.kubeconfig_json(id)?;
        let text = serde_json::to_string_pretty(&json)
            .map_err(|e| Error::Client { user: id.user.clone(), detail: e.to_string() })?;
        write_file(path, &text)?;
        set_mode(path, 0o600)
    }

    /// A client authenticated as `id` with a client certificate from the cluster's client CA.
    pub async fn client(&self, id: &Identity) -> Result<kube::Client, Error> {
        let json = self.kubeconfig_json(id)?;
        let err = |detail: String| Error::Client { user: id.user.clone(), detail };
        let kubeconfig: Kubeconfig =
            serde_json::from_value(json).map_err(|e| err(e.to_string()))?;
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .map_err(|e| err(e.to_string()))?;
        kube::Client::try_from(config).map_err(|e| err(e.to_string()))
    }

    /// A client for the admin identity (`system:masters`).
    pub async fn admin_client(&self) -> Result<kube::Client, Error> {
        self.client(&Identity::admin()).await
    }

    /// An outage of the API server alone: kills kube-apiserver (SIGKILL, as a crash or a
    /// lost machine; etcd keeps running) and returns once its port refuses connections.
    /// [`ControlPlane::start_apiserver`] brings it back on the same address.
    pub async fn stop_apiserver(&self) -> Result<(), Error> {
        self.command(b"api-stop\n")?;
        let addr = self.server.trim_start_matches("https://").to_string();
        let start = tokio::time::Instant::now();
        while start.elapsed() < READY_TIMEOUT {
            let refused = std::net::TcpStream::connect_timeout(
                &addr.parse().map_err(|e| Error::Supervisor(format!("address {addr}: {e}")))?,
                Duration::from_millis(200),
            )
            .is_err();
            if refused {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(Error::Supervisor(format!("kube-apiserver still accepts on {addr} after api-stop")))
    }

    /// Starts kube-apiserver again after [`ControlPlane::stop_apiserver`] (same flags, port
    /// and etcd) and waits until it is ready.
    pub async fn start_apiserver(&self) -> Result<(), Error> {
        self.command(b"api-start\n")?;
        self.wait_ready().await
    }

    fn command(&self, line: &[u8]) -> Result<(), Error> {
        let mut guard = self.supervisor.lock().unwrap_or_else(|p| p.into_inner());
        let Some((_, stdin)) = guard.as_mut() else {
            return Err(Error::Supervisor("the control plane is stopped".into()));
        };
        stdin
            .write_all(line)
            .and_then(|()| stdin.flush())
            .map_err(|e| Error::Supervisor(format!("writing a command: {e}")))
    }

    /// Stops both servers and waits for the supervisor; cleans up unless logs are kept.
    /// Idempotent. Dropping the control plane does the same.
    pub fn stop(&self) {
        self.stop_with(b"stop\n");
    }

    /// Stops a control plane that failed to start: SIGKILL, nothing to shut down gracefully.
    fn kill(&self) {
        self.stop_with(b"kill\n");
    }

    fn stop_with(&self, line: &[u8]) {
        let taken = self.supervisor.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some((mut child, mut stdin)) = taken {
            let _ = stdin.write_all(line);
            drop(stdin);
            let _ = child.wait();
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Keeps the control plane logs if the test panics while the guard is alive.
#[derive(Debug)]
pub struct LogGuard<'a> {
    cp: &'a ControlPlane,
}

impl Drop for LogGuard<'_> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.cp.keep_logs("a test failed");
        }
    }
}

/// The apiserver's audit log as the detector of RBAC denials: the authorizer's refusals
/// (`403 Forbidden`) are audited with the user and the request's attributes, where the
/// apiserver's `apiserver_request_total` does not count them.
pub mod audit {
    use std::io::{Read as _, Seek as _, SeekFrom};
    use std::path::Path;

    use super::{Error, io_err};

    /// The audit policy: request metadata (no bodies) of every identity except the admin
    /// (`system:masters`, never refused), once the response is complete.
    pub const POLICY: &str = "apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived, ResponseStarted]
rules:
  - level: None
    userGroups: [\"system:masters\"]
  - level: Metadata
";

    /// A byte offset in the audit log (the log is never rotated).
    #[derive(Debug, Clone, Copy, PartialEq, Eq)]
    pub struct Mark(pub u64);

    impl Mark {
        /// The end of the log now (0 when nothing was logged yet).
        pub fn of(path: &Path) -> Mark {
            Mark(std::fs::metadata(path).map(|m| m.len()).unwrap_or(0))
        }
    }

    /// One request the apiserver refused with 403.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub struct Denial {
        /// Who asked (`system:serviceaccount:<ns>:<name>`, a user name).
        pub user: String,
        /// The verb (`get`, `list`, `create`, ...).
        pub verb: String,
        /// `resource[/subresource]` with `.group` when not core, e.g. `events.events.k8s.io`.
        pub resource: String,
        /// `namespace/name`, `namespace/`, `name` or "" (what the request named).
        pub object: String,
        /// The request URI.
        pub uri: String,
    }

    impl std::fmt::Display for Denial {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{} {} {}", self.user, self.verb, self.resource)?;
            if !self.object.is_empty() {
                write!(f, " {}", self.object)?;
            }
            Ok(())
        }
    }

    /// The 403 answers logged after `mark` in the audit log at `path`, for users `user`
    /// accepts. A missing log has none; a line that is not an audit event is skipped (the
    /// last one may be half written).
    pub fn denials_since(
        path: &Path,
        mark: &Mark,
        user: impl Fn(&str) -> bool,
    ) -> Result<Vec<Denial>, Error> {
        let mut file = match std::fs::File::open(path) {
            Ok(f) => f,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(io_err("opening the audit log", path)(e)),
        };
        file.seek(SeekFrom::Start(mark.0)).map_err(io_err("reading the audit log", path))?;
        let mut bytes = Vec::new();
        file.read_to_end(&mut bytes).map_err(io_err("reading the audit log", path))?;
        Ok(parse(&String::from_utf8_lossy(&bytes), user))
    }

    /// The 403 answers in audit log text (JSON lines), for users `user` accepts.
    pub fn parse(text: &str, user: impl Fn(&str) -> bool) -> Vec<Denial> {
        let mut out = Vec::new();
        for line in text.lines() {
            let Ok(ev) = serde_json::from_str::<serde_json::Value>(line) else { continue };
            if ev["responseStatus"]["code"].as_u64() != Some(403) {
                continue;
            }
            let name = ev["user"]["username"].as_str().unwrap_or_default();
            if !user(name) {
                continue;
            }
            let o = &ev["objectRef"];
            let s = |k: &str| o[k].as_str().unwrap_or_default();
            let mut resource = s("resource").to_string();
            if !s("subresource").is_empty() {
                resource = format!("{resource}/{}", s("subresource"));
            }
            if !s("apiGroup").is_empty() {
                resource = format!("{resource}.{}", s("apiGroup"));
            }
            let object = match (s("namespace"), s("name")) {
                ("", n) => n.to_string(),
                (ns, n) => format!("{ns}/{n}"),
            };
            out.push(Denial {
                user: name.to_string(),
                verb: ev["verb"].as_str().unwrap_or_default().to_string(),
                resource,
                object,
                uri: ev["requestURI"].as_str().unwrap_or_default().to_string(),
            });
        }
        out
    }
}

fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

#[cfg(unix)]
fn set_mode(path: &Path, mode: u32) -> Result<(), Error> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .map_err(io_err("setting permissions", path))
}

fn set_executable(path: &Path) -> Result<(), Error> {
    set_mode(path, 0o755)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shell_quoting_survives_single_quotes() {
        assert_eq!(sh_quote("a'b"), r"'a'\''b'");
    }

    #[test]
    fn a_port_conflict_is_recognised_in_go_and_python_logs() {
        assert!(log_says_port_taken(
            r#"{"level":"fatal","msg":"listen tcp 127.0.0.1:2379: bind: address already in use"}"#
        ));
        assert!(log_says_port_taken("OSError: [Errno 98] Address already in use"));
        assert!(!log_says_port_taken("panic: bad flag"));
    }

    #[test]
    fn wait_statuses_say_exit_code_or_signal() {
        assert_eq!(describe_wait_status("3\n"), ("exit status 3".to_string(), false));
        assert_eq!(describe_wait_status("137"), ("killed by signal 9 (SIGKILL)".to_string(), true));
        assert!(describe_wait_status("143\n").1);
        assert!(!describe_wait_status("").1);
    }

    #[test]
    fn an_unreadable_log_says_so_instead_of_being_empty() {
        let text = read_log(Path::new("/nonexistent/ccm-testbed/kube-apiserver.log"));
        assert!(text.contains("could not be read"), "{text}");
    }

    #[test]
    fn a_run_directory_left_by_an_earlier_process_with_our_pid_is_not_reused() {
        let base = std::env::temp_dir().join(unique_name("ccm-testbed-rundir"));
        let first = fresh_run_dir(&base).unwrap();
        std::fs::write(first.join("kube-apiserver.pid"), "1\n").unwrap();
        // The same name again (as a later process with the same pid would compute it).
        let taken = first.file_name().unwrap().to_string_lossy().into_owned();
        let stem_n = RUN_COUNTER.load(Ordering::Relaxed);
        RUN_COUNTER.store(stem_n - 1, Ordering::Relaxed);
        let second = fresh_run_dir(&base).unwrap();
        assert_ne!(second, first, "{taken} was reused");
        assert!(std::fs::read_dir(&second).unwrap().next().is_none(), "a fresh, empty directory");
        std::fs::remove_dir_all(&base).unwrap();
    }

    #[test]
    fn the_audit_parser_reports_403_answers_of_the_users_asked_for_and_nothing_else() {
        let forbid = r#"{"kind":"Event","stage":"ResponseComplete","requestURI":"/apis/events.k8s.io/v1/namespaces/default/events","verb":"create","user":{"username":"system:serviceaccount:kube-system:ccm"},"objectRef":{"resource":"events","namespace":"default","apiGroup":"events.k8s.io","apiVersion":"v1"},"responseStatus":{"metadata":{},"status":"Failure","reason":"Forbidden","code":403}}"#;
        let ok = forbid.replace("403", "201");
        let other = forbid.replace("kube-system:ccm", "kube-system:other");
        let text = format!("{forbid}\n{ok}\n{other}\n{{\"half");
        let got = audit::parse(&text, |u| u.ends_with(":ccm"));
        assert_eq!(got.len(), 1, "{got:?}");
        assert_eq!(
            got[0].to_string(),
            "system:serviceaccount:kube-system:ccm create events.events.k8s.io default/"
        );
        assert_eq!(audit::parse(&text, |_| true).len(), 2);
    }

    #[test]
    fn tail_keeps_the_last_lines() {
        assert_eq!(tail_lines("a\nb\nc", 2), "b\nc");
        assert_eq!(tail_lines("a", 5), "a");
    }

    #[test]
    fn unique_names_differ() {
        assert_ne!(unique_name("n"), unique_name("n"));
    }
}
