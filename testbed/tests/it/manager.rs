//! The cloud-controller-manager command as real processes against the real apiserver:
//! flags and exit codes, controller selection, secure serving with delegated auth, leader
//! election (takeover on kill -9 and SIGTERM, exit on lost lease), service-account
//! credentials, webhooks, and leader migration with a real kube-controller-manager; upstream
//! manifests' arguments, /livez, /readyz, /configz, serving-certificate reload and SNI, and
//! client-certificate and request-header authentication (issue #13 points 5 and 6).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use base64::Engine as _;
use ccm_testbed::{ControlPlane, Identity, unique_name};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::process::{Child, Command};

const BUILT_BIN: &str = env!("CARGO_BIN_EXE_cloud-controller-manager-test");

/// The manager binary: the one cargo built, or `CCM_MANAGER_TEST_BIN` (to run these tests
/// against another build, e.g. the code before a fix).
static BIN: std::sync::LazyLock<String> = std::sync::LazyLock::new(|| {
    std::env::var("CCM_MANAGER_TEST_BIN").unwrap_or_else(|_| BUILT_BIN.to_string())
});

fn free_port() -> u16 {
    ccm_testbed::free_port().unwrap()
}

/// A per-test directory (logs, kubeconfigs), removed when the test passes and kept (its path
/// is in the failure message) when it fails.
struct Scratch(PathBuf);

impl std::ops::Deref for Scratch {
    type Target = Path;
    fn deref(&self) -> &Path {
        &self.0
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

fn scratch_dir(prefix: &str) -> Scratch {
    let dir = std::env::temp_dir().join("ccm-manager-tests").join(unique_name(prefix));
    std::fs::create_dir_all(&dir).unwrap();
    Scratch(dir)
}

/// A running manager process with its stderr in a file.
struct Ccm {
    child: Child,
    log: PathBuf,
    port: u16,
}

impl Ccm {
    fn spawn(dir: &Path, name: &str, args: &[String]) -> Ccm {
        Self::spawn_with_env(dir, name, args, &[])
    }

    fn spawn_with_env(dir: &Path, name: &str, args: &[String], env: &[(&str, &str)]) -> Ccm {
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let port = args
            .iter()
            .find_map(|a| a.strip_prefix("--secure-port="))
            .map(|p| p.parse().unwrap())
            .unwrap_or(0);
        let child = Command::new(&*BIN)
            .args(args)
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(file)
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        Ccm { child, log, port }
    }

    fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until the log contains `needle`; returns how long it took.
    async fn wait_for_log(&self, needle: &str, timeout: Duration) -> Duration {
        let start = Instant::now();
        loop {
            if self.logs().contains(needle) {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < timeout,
                "{:?} not logged within {timeout:?}; log {}:\n{}",
                needle,
                self.log.display(),
                self.logs()
            );
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
    }

    fn signal(&self, sig: &str) {
        let pid = self.child.id().unwrap();
        let status =
            std::process::Command::new("kill").args([sig, &pid.to_string()]).status().unwrap();
        assert!(status.success());
    }

    async fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        tokio::time::timeout(timeout, self.child.wait())
            .await
            .unwrap_or_else(|_| panic!("manager did not exit within {timeout:?}:\n{}", self.logs()))
            .unwrap()
    }
}

/// `curl -sk` against a local HTTPS port: (status, body).
async fn curl(url: &str, token: Option<&str>, extra: &[&str]) -> (u16, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "--max-time", "10", "-w", "\n%{http_code}"]);
    if let Some(t) = token {
        cmd.arg("-H").arg(format!("Authorization: Bearer {t}"));
    }
    cmd.args(extra).arg(url);
    let out = cmd.output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

async fn wait_healthz(port: u16) {
    let start = Instant::now();
    loop {
        let (code, _) = curl(&format!("https://127.0.0.1:{port}/healthz"), None, &[]).await;
        if code == 200 {
            return;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "healthz not 200 in 60s (last {code})");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn setup() -> (&'static ControlPlane, Client, Scratch, PathBuf) {
    let cp = ControlPlane::shared().await.expect("control plane starts");
    let client = cp.admin_client().await.expect("admin client");
    let dir = scratch_dir("ccm");
    let kubeconfig = dir.join("admin.kubeconfig");
    cp.write_kubeconfig(&kubeconfig, &Identity::admin()).unwrap();
    (cp, client, dir, kubeconfig)
}

fn base_args(kubeconfig: &Path) -> Vec<String> {
    vec!["--cloud-provider=test".into(), format!("--kubeconfig={}", kubeconfig.display())]
}

/// A ServiceAccount in `ns` with a token; `allow_metrics` binds `get /metrics` to it.
async fn service_account_token(client: &Client, ns: &str, allow_metrics: bool) -> String {
    let name = unique_name("scraper");
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let sa = ServiceAccount {
        metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
        ..Default::default()
    };
    sas.create(&PostParams::default(), &sa).await.unwrap();
    if allow_metrics {
        let role = ClusterRole {
            metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
            rules: Some(vec![PolicyRule {
                non_resource_urls: Some(vec!["/metrics".into()]),
                verbs: vec!["get".into()],
                ..Default::default()
            }]),
            ..Default::default()
        };
        Api::<ClusterRole>::all(client.clone())
            .create(&PostParams::default(), &role)
            .await
            .unwrap();
        let binding = ClusterRoleBinding {
            metadata: ObjectMeta { name: Some(name.clone()), ..Default::default() },
            role_ref: RoleRef {
                api_group: "rbac.authorization.k8s.io".into(),
                kind: "ClusterRole".into(),
                name: name.clone(),
            },
            subjects: Some(vec![Subject {
                kind: "ServiceAccount".into(),
                name: name.clone(),
                namespace: Some(ns.into()),
                ..Default::default()
            }]),
        };
        Api::<ClusterRoleBinding>::all(client.clone())
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
    }
    let tr = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    sas.create_token_request(&name, &PostParams::default(), &tr)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

// ---------------------------------------------------------------- flags and exit codes

async fn run_to_exit(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(&*BIN).args(args).stdin(Stdio::null()).output().await.unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).to_string(),
        String::from_utf8_lossy(&out.stderr).to_string(),
    )
}

#[tokio::test]
async fn bad_start_up_input_fails_with_a_message_naming_the_problem() {
    let cases: &[(&[&str], &str)] = &[
        (
            &["--cloud-provider=test", "--controllers=*,-cloud-node,bogus"],
            "\"bogus\" is not in the list of known controllers",
        ),
        (&["--cloud-provider=test", "--no-such-flag"], "--no-such-flag"),
        (
            &["--cloud-provider=test", "--cloud-config=/nonexistent/cloud.conf"],
            "--cloud-config: couldn't open cloud provider configuration \"/nonexistent/cloud.conf\"",
        ),
        (&["--cloud-provider=aws"], "--cloud-provider: unknown cloud provider \"aws\""),
        (&[], "--cloud-provider cannot be empty"),
        (&["--cloud-provider=test", "--node-monitor-period=5"], "--node-monitor-period"),
        (&["--cloud-provider=test", "--concurrent-service-syncs=-1"], "--concurrent-service-syncs"),
        (
            &["--cloud-provider=test", "--leader-elect-resource-lock=endpoints"],
            "resourceLock value must be \"leases\"",
        ),
        (&["--cloud-provider=test", "--logging-format=xml"], "--logging-format"),
    ];
    for (args, want) in cases {
        let (code, stdout, stderr) = run_to_exit(args).await;
        assert_eq!(code, 1, "{args:?} exits 1; stderr: {stderr}");
        assert!(stderr.contains(want), "{args:?}: stderr {stderr:?} should contain {want:?}");
        assert!(stdout.is_empty(), "{args:?}: nothing on stdout");
    }
    // A cloud-config the provider rejects.
    let dir = scratch_dir("badcfg");
    let cfg = dir.join("cloud.json");
    std::fs::write(&cfg, "{\"zone\": 5}").unwrap();
    let (code, _, stderr) =
        run_to_exit(&["--cloud-provider=test", &format!("--cloud-config={}", cfg.display())]).await;
    assert_eq!(code, 1);
    assert!(
        stderr.contains("cloud provider could not be initialized: invalid test cloud config"),
        "{stderr}"
    );

    let (code, stdout, _) = run_to_exit(&["--help"]).await;
    assert_eq!(code, 0);
    for flag in [
        "--cloud-provider",
        "--controllers",
        "--leader-elect-lease-duration",
        "--secure-port",
        "--webhook-secure-port",
        "--use-service-account-credentials",
    ] {
        assert!(stdout.contains(flag), "--help lists {flag}");
    }
    let (code, stdout, _) = run_to_exit(&["--version"]).await;
    assert_eq!(code, 0);
    // As upstream's component-base verflag (issue #30).
    assert!(stdout.starts_with("Kubernetes v"), "{stdout}");
}

// ---------------------------------------------------------------- controllers, serving, auth

#[tokio::test]
async fn controller_selection_metrics_and_delegated_auth() {
    let (cp, client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let port = free_port();
    // The acceptance case is `*,-route`; while the route controller is not registered yet,
    // the same check runs with the lifecycle controller disabled instead.
    let known = ccm_core::controllers::all();
    let lease = unique_name("ccm-selection");
    let (disabled, disabled_name) = match known.iter().find(|c| c.alias == "route") {
        Some(c) => ("route", c.name),
        None => ("cloud-node-lifecycle", "cloud-node-lifecycle-controller"),
    };
    let mut args = base_args(&kubeconfig);
    args.extend([
        format!("--controllers=*,-{disabled}"),
        format!("--leader-elect-resource-name={lease}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--authentication-kubeconfig={}", kubeconfig.display()),
        format!("--authorization-kubeconfig={}", kubeconfig.display()),
        "--webhook-secure-port=0".into(),
    ]);
    let ccm = Ccm::spawn(&dir, "selection", &args);
    wait_healthz(ccm.port).await;

    // Every known controller but the disabled one is attempted (started or skipped).
    let expected = known.iter().filter(|c| c.name != disabled_name).collect::<Vec<_>>();
    for c in &expected {
        ccm.wait_for_log(&starting(c.name), Duration::from_secs(30)).await;
    }
    let logs = ccm.logs();
    assert!(!logs.contains(disabled_name), "{disabled_name} is never started:\n{logs}");

    let url = format!("https://127.0.0.1:{port}");
    // /healthz needs no credentials.
    let (code, body) = curl(&format!("{url}/healthz"), None, &[]).await;
    assert_eq!((code, body.as_str()), (200, "ok"));

    // A ServiceAccount allowed to get /metrics gets them.
    let allowed = service_account_token(&client, "default", true).await;
    let (code, metrics) = curl(&format!("{url}/metrics"), Some(&allowed), &[]).await;
    assert_eq!(code, 200, "{metrics}");
    assert!(
        metrics.contains(&format!("leader_election_master_status{{name=\"{lease}\"}} 1")),
        "{metrics}"
    );
    for c in &expected {
        let started = logs.contains(&started(c.name));
        let line = format!(
            "running_managed_controllers{{name=\"{}\",manager=\"cloud-controller-manager\"}} 1",
            c.alias
        );
        assert_eq!(
            metrics.contains(&line),
            started,
            "{}: metrics agree with the logs:\n{metrics}",
            c.name
        );
    }
    assert!(!metrics.contains(&format!("name=\"{disabled}\"")), "no {disabled} in metrics");

    // Without the permission, or without a token: 403. A bad token: 401.
    let denied = service_account_token(&client, "default", false).await;
    let (code, body) = curl(&format!("{url}/metrics"), Some(&denied), &[]).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("cannot get path \"/metrics\""), "{body}");
    let (code, _) = curl(&format!("{url}/metrics"), None, &[]).await;
    assert_eq!(code, 403);
    let (code, _) = curl(&format!("{url}/metrics"), Some("not-a-token"), &[]).await;
    assert_eq!(code, 401);

    ccm.signal("-TERM");
    let mut ccm = ccm;
    let status = ccm.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "SIGTERM is an orderly stop:\n{}", ccm.logs());
}

// ---------------------------------------------------------------- leader election

async fn lease_holder(client: &Client, name: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    leases.get_opt(name).await.unwrap().and_then(|l| l.spec).and_then(|s| s.holder_identity)
}

/// The lease's last renewal and duration (seconds), as the apiserver holds them.
async fn lease_renewal(client: &Client, name: &str) -> (k8s_openapi::jiff::Timestamp, i64) {
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let spec = leases.get(name).await.unwrap().spec.unwrap();
    (spec.renew_time.unwrap().0, i64::from(spec.lease_duration_seconds.unwrap()))
}

const ACQUIRED: &str = "successfully acquired lease";

/// How the manager logs a controller starting: the message `Starting "<name>"`, quoted in the
/// log line (klog's `%q`, or a JSON string), so its inner quotes appear escaped.
fn starting(name: &str) -> String {
    format!("Starting \\\"{name}\\\"")
}

/// The same for `Started "<name>"`.
fn started(name: &str) -> String {
    format!("Started \\\"{name}\\\"")
}

#[tokio::test]
async fn leader_election_takeover_on_kill_and_on_sigterm() {
    let (cp, client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let lease = unique_name("ccm-lease");
    // Upstream defaults: 15s / 10s / 2s.
    let spawn = |name: &str| {
        let mut args = base_args(&kubeconfig);
        args.extend([
            format!("--leader-elect-resource-name={lease}"),
            "--secure-port=0".into(),
            "--webhook-secure-port=0".into(),
        ]);
        Ccm::spawn(&dir, name, &args)
    };

    let mut a = spawn("a");
    a.wait_for_log(ACQUIRED, Duration::from_secs(60)).await;
    a.wait_for_log(&starting("cloud-node-controller"), Duration::from_secs(30)).await;
    let b = spawn("b");
    b.wait_for_log("attempting to acquire leader lease", Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!b.logs().contains(ACQUIRED), "the standby does not lead while A renews");
    assert!(!b.logs().contains("Starting \\\""), "the standby runs no controller:\n{}", b.logs());
    let holder_a = lease_holder(&client, &lease).await.unwrap();
    assert!(holder_a.contains('_'), "identity is hostname_uuid: {holder_a}");

    // SIGTERM: A stops its controllers, releases the lease and exits 0; B leads at once.
    let t0 = Instant::now();
    a.signal("-TERM");
    let sigterm_takeover = b.wait_for_log(ACQUIRED, Duration::from_secs(30)).await;
    let sigterm_takeover = sigterm_takeover.min(t0.elapsed());
    let status = a.wait_exit(Duration::from_secs(20)).await;
    assert_eq!(status.code(), Some(0), "{}", a.logs());
    assert!(a.logs().contains("released leader lease"), "{}", a.logs());
    b.wait_for_log(&starting("cloud-node-controller"), Duration::from_secs(10)).await;
    let holder_b = lease_holder(&client, &lease).await.unwrap();
    assert_ne!(holder_a, holder_b);

    // kill -9: no release; C waits for the lease to expire (lease duration + retry period).
    let c = spawn("c");
    c.wait_for_log("attempting to acquire leader lease", Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!c.logs().contains(ACQUIRED));
    let mut b = b;
    let t1 = Instant::now();
    b.signal("-KILL");
    let _ = b.wait_exit(Duration::from_secs(10)).await;
    // B is dead: its last renewal is final. C may take the lease only once it has expired.
    let (renewed, duration) = lease_renewal(&client, &lease).await;
    c.wait_for_log(ACQUIRED, Duration::from_secs(60)).await;
    let kill_takeover = t1.elapsed();
    let expiry = renewed + k8s_openapi::jiff::SignedDuration::from_secs(duration);
    eprintln!(
        "MEASURED leader takeover: after SIGTERM {:.2}s; after kill -9 {:.2}s (lease 15s + retry 2s = 17s)",
        sigterm_takeover.as_secs_f64(),
        kill_takeover.as_secs_f64()
    );
    // No upper bounds on a loaded machine (the waits above bound them). The point after
    // kill -9: nobody released the lease, so C took it only after it expired (B's last
    // renewal + the lease duration), not at once. (After SIGTERM, A's "released leader
    // lease" above is what let B in without that wait.)
    let seen = k8s_openapi::jiff::Timestamp::now();
    assert!(
        seen >= expiry,
        "C led at {seen} (seen), before the lease renewed at {renewed} expired at {expiry}"
    );
    let (c_renewed, _) = lease_renewal(&client, &lease).await;
    assert!(c_renewed >= expiry, "C's renewal {c_renewed} precedes the expiry {expiry}");
    c.signal("-TERM");
    let mut c = c;
    assert_eq!(c.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

#[tokio::test]
async fn losing_the_lease_stops_controllers_and_exits_non_zero() {
    let (cp, client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let lease = unique_name("ccm-lost");
    let mut args = base_args(&kubeconfig);
    args.extend([
        format!("--leader-elect-resource-name={lease}"),
        "--leader-elect-lease-duration=4s".into(),
        "--leader-elect-renew-deadline=3s".into(),
        "--leader-elect-retry-period=1s".into(),
        "--secure-port=0".into(),
        "--webhook-secure-port=0".into(),
    ]);
    let mut ccm = Ccm::spawn(&dir, "lost", &args);
    ccm.wait_for_log(ACQUIRED, Duration::from_secs(60)).await;

    // Another holder takes the Lease (as after a partition).
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let mut l = leases.get(&lease).await.unwrap();
    let spec = l.spec.as_mut().unwrap();
    spec.holder_identity = Some("thief".into());
    spec.lease_duration_seconds = Some(60);
    spec.renew_time = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime(
        k8s_openapi::jiff::Timestamp::now(),
    ));
    leases.replace(&lease, &PostParams::default(), &l).await.unwrap();

    let status = ccm.wait_exit(Duration::from_secs(30)).await;
    let logs = ccm.logs();
    assert_eq!(status.code(), Some(1), "{logs}");
    assert!(logs.contains("leaderelection lost"), "{logs}");
    assert_eq!(
        lease_holder(&client, &lease).await.as_deref(),
        Some("thief"),
        "the loser does not release"
    );
}

// ---------------------------------------------------------------- service-account credentials

#[tokio::test]
async fn use_service_account_credentials_creates_per_controller_accounts() {
    let (cp, client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let mut args = base_args(&kubeconfig);
    args.extend([
        "--use-service-account-credentials".to_string(),
        "--controllers=cloud-node".into(),
        "--leader-elect=false".into(),
        "--secure-port=0".into(),
        "--webhook-secure-port=0".into(),
    ]);
    let mut ccm = Ccm::spawn(&dir, "sa", &args);
    ccm.wait_for_log(&starting("cloud-node-controller"), Duration::from_secs(60)).await;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), "kube-system");
    let start = Instant::now();
    while sas.get_opt("node-controller").await.unwrap().is_none() {
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "kube-system/node-controller created:\n{}",
            ccm.logs()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // The controller's client authenticates as the ServiceAccount (checked by the manager with
    // a SelfSubjectReview through that client).
    ccm.wait_for_log(
        "user=\"system:serviceaccount:kube-system:node-controller\"",
        Duration::from_secs(30),
    )
    .await;
    assert!(!ccm.logs().contains("--use-service-account-credentials:"), "{}", ccm.logs());
    ccm.signal("-TERM");
    assert_eq!(ccm.wait_exit(Duration::from_secs(20)).await.code(), Some(0), "{}", ccm.logs());
}

// ---------------------------------------------------------------- webhooks

#[tokio::test]
async fn admission_review_round_trip_on_the_webhook_port() {
    let (cp, _client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let wport = free_port();
    let port = free_port();
    let cfg = dir.join("cloud.json");
    std::fs::write(&cfg, r#"{"zone": "zone-x", "region": "region-y"}"#).unwrap();
    let mut args = base_args(&kubeconfig);
    args.extend([
        format!("--cloud-config={}", cfg.display()),
        "--controllers=".to_string(),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        "--webhook-bind-address=127.0.0.1".into(),
        format!("--webhook-secure-port={wport}"),
        "--webhooks=persistentvolumelabel".into(),
        "--feature-gates=CloudControllerManagerWebhook=true".into(),
        "--logging-format=json".into(),
        "-v=2".into(),
    ]);
    let mut ccm = Ccm::spawn(&dir, "webhook", &args);
    wait_healthz(port).await;
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": "705ab4f5-6393-11e8-b7cc-42010a800002",
            "kind": {"group": "", "version": "v1", "kind": "PersistentVolume"},
            "resource": {"group": "", "version": "v1", "resource": "persistentvolumes"},
            "operation": "CREATE",
            "object": {
                "apiVersion": "v1", "kind": "PersistentVolume",
                "metadata": {"name": "pv-1"},
                "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                         "csi": {"driver": "test.csi", "volumeHandle": "vol-123"}}
            }
        }
    });
    let body_file = dir.join("review.json");
    std::fs::write(&body_file, review.to_string()).unwrap();
    let data = format!("@{}", body_file.display());
    let url = format!("https://127.0.0.1:{wport}/persistentvolumelabel");
    let (code, body) =
        curl(&url, None, &["-H", "Content-Type: application/json", "--data-binary", &data]).await;
    assert_eq!(code, 200, "{body}");
    let resp: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(resp["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(resp["kind"], "AdmissionReview");
    assert_eq!(resp["response"]["uid"], "705ab4f5-6393-11e8-b7cc-42010a800002");
    assert_eq!(resp["response"]["allowed"], true);
    assert_eq!(resp["response"]["patchType"], "JSONPatch");
    let patch = base64::engine::general_purpose::STANDARD
        .decode(resp["response"]["patch"].as_str().unwrap())
        .unwrap();
    let patch: serde_json::Value = serde_json::from_slice(&patch).unwrap();
    assert_eq!(patch[0]["path"], "/metadata/labels");
    assert_eq!(patch[0]["value"]["topology.kubernetes.io/zone"], "zone-x");
    assert_eq!(patch[0]["value"]["topology.kubernetes.io/region"], "region-y");

    // Wrong content type: 400 with upstream's message.
    let (code, body) =
        curl(&url, None, &["-H", "Content-Type: text/plain", "--data-binary", &data]).await;
    assert_eq!(code, 400);
    assert_eq!(body, "Content-Type: \"text/plain\" should be \"application/json\"");

    ccm.signal("-TERM");
    assert_eq!(ccm.wait_exit(Duration::from_secs(20)).await.code(), Some(0), "{}", ccm.logs());
    // --logging-format=json: one JSON object per line.
    let logs = ccm.logs();
    assert!(logs.contains("serving webhooks"), "{logs}");
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("log line is not JSON ({e}): {line}"));
        // `ts`: epoch milliseconds, printed in the shortest form as Go's zap prints a float:
        // a timestamp on a whole millisecond has no fraction (a JSON integer), about one
        // line in a thousand with a microsecond clock.
        assert!(v["msg"].is_string() && v["ts"].is_number(), "{line}");
    }
}

// ---------------------------------------------------------------- leader migration

#[tokio::test]
async fn leader_migration_hands_a_controller_over_from_a_real_kube_controller_manager() {
    let (cp, client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let migration_lock = unique_name("migration");
    let config = dir.join("migration.yaml");
    std::fs::write(
        &config,
        format!(
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: {migration_lock}\ncontrollerLeaders:\n  - name: cloud-node-lifecycle-controller\n    component: \"*\"\n"
        ),
    )
    .unwrap();
    let timings = [
        "--leader-elect-lease-duration=6s".to_string(),
        "--leader-elect-renew-deadline=4s".into(),
        "--leader-elect-retry-period=1s".into(),
    ];

    // The real kube-controller-manager holds the migration lock first. (It needs a
    // ServiceAccount signing key: without one, v1.36.3 crashes when leader migration is on.)
    let sa_key = dir.join("sa.key");
    std::fs::write(&sa_key, rcgen::KeyPair::generate().unwrap().serialize_pem()).unwrap();
    let kcm_log = dir.join("kcm.log");
    let mut kcm = Command::new(&cp.tools().kube_controller_manager)
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .arg(format!("--leader-elect-resource-name={}", unique_name("kcm")))
        .arg("--enable-leader-migration")
        .arg(format!("--leader-migration-config={}", config.display()))
        .arg("--controllers=cloud-node-lifecycle-controller")
        .arg(format!("--service-account-private-key-file={}", sa_key.display()))
        .arg("--bind-address=127.0.0.1")
        .arg(format!("--secure-port={}", free_port()))
        .args(&timings)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&kcm_log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let start = Instant::now();
    let kcm_identity = loop {
        if let Some(h) = lease_holder(&client, &migration_lock).await.filter(|h| !h.is_empty()) {
            break h;
        }
        assert!(
            start.elapsed() < Duration::from_secs(90),
            "the kube-controller-manager takes the migration lock:\n{}",
            std::fs::read_to_string(&kcm_log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };

    // Our CCM leads its main lock; it may start the migrated controller only once it holds
    // the migration lock, i.e. after the KCM's lease on it expired.
    //
    // Note: kube-controller-manager v1.36.3 cannot run migrated controllers itself: building
    // the second controller context fails with `informer name "kube-controller-manager" is
    // already registered` and it exits right after taking the migration lock (without
    // releasing it). The lock is what keeps the two managers apart, so the test checks the
    // lock timeline: the CCM starts the controller only after the KCM's lease expired.
    let mut args = base_args(&kubeconfig);
    args.extend([
        format!("--leader-elect-resource-name={}", unique_name("ccm-main")),
        "--enable-leader-migration".into(),
        format!("--leader-migration-config={}", config.display()),
        "--controllers=cloud-node-lifecycle".into(),
        "--secure-port=0".into(),
        "--webhook-secure-port=0".into(),
        "--logging-format=json".into(),
    ]);
    args.extend(timings.iter().cloned());
    let t0 = Instant::now();
    let ccm = Ccm::spawn(&dir, "migration-ccm", &args);

    // Follow the migration lock until it changes hands, noting when the KCM's lease expires.
    let leases: Api<Lease> = Api::namespaced(client.clone(), "kube-system");
    let mut kcm_lease_expiry = None;
    let ccm_acquire = loop {
        let spec = leases.get(&migration_lock).await.unwrap().spec.unwrap_or_default();
        let holder = spec.holder_identity.clone().unwrap_or_default();
        if holder == kcm_identity {
            let renew = spec.renew_time.clone().unwrap().0;
            let dur = i64::from(spec.lease_duration_seconds.unwrap_or(0));
            kcm_lease_expiry = Some(renew + k8s_openapi::jiff::SignedDuration::from_secs(dur));
        } else if !holder.is_empty() {
            break spec.acquire_time.unwrap().0;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(90),
            "the CCM takes the migration lock:\n{}",
            ccm.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let kcm_lease_expiry = kcm_lease_expiry.expect("the KCM's lease was observed");
    let started_line = starting("cloud-node-lifecycle-controller");
    ccm.wait_for_log(&started_line, Duration::from_secs(30)).await;
    let logs = ccm.logs();
    let line = logs.lines().find(|l| l.contains(&started_line)).unwrap();
    // --logging-format=json: `ts` is the time in milliseconds since the epoch.
    let line: serde_json::Value = serde_json::from_str(line).unwrap();
    let started_at = k8s_openapi::jiff::Timestamp::from_microsecond(
        (line["ts"].as_f64().unwrap() * 1000.0).round() as i64,
    )
    .unwrap();
    let kcm_log_text = std::fs::read_to_string(&kcm_log).unwrap_or_default();
    assert!(
        kcm_log_text.contains("leader migration: starting migrated controllers"),
        "the KCM took the migration lock and started its migrated controllers"
    );
    assert!(
        ccm_acquire >= kcm_lease_expiry && started_at >= kcm_lease_expiry,
        "the CCM acquired ({ccm_acquire}) and started the controller ({started_at}) only after the KCM's lease expired ({kcm_lease_expiry})"
    );
    let holder = lease_holder(&client, &migration_lock).await.unwrap();
    assert_ne!(holder, kcm_identity, "the CCM holds the migration lock now");
    assert!(
        logs.find(ACQUIRED).unwrap() < logs.find(&started_line).unwrap(),
        "the CCM led its main lock before the migrated controller started"
    );
    eprintln!(
        "MEASURED leader migration: KCM lease expired at {kcm_lease_expiry}; CCM acquired the migration lock at {ccm_acquire} ({:.3}s later) and started cloud-node-lifecycle-controller at {started_at}",
        ccm_acquire.duration_since(kcm_lease_expiry).as_secs_f64()
    );
    let _ = kcm.start_kill();
    let _ = kcm.wait().await;

    ccm.signal("-TERM");
    let mut ccm = ccm;
    assert_eq!(ccm.wait_exit(Duration::from_secs(20)).await.code(), Some(0), "{}", ccm.logs());
}

// ---------------------------------------------------------------- hardening (issues #11, #13)

/// A `/proc/<pid>/status` field in its unit (kB for VmRSS), or 0.
fn proc_status(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| {
            l.strip_prefix(key).and_then(|v| v.trim_start_matches(':').split_whitespace().next())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn open_fds(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map(|d| d.count()).unwrap_or(0)
}

/// A manager that only serves the secure port (no controllers, no leader election), with
/// delegated auth against the shared apiserver.
async fn serving_only(dir: &Path, kubeconfig: &Path, name: &str, extra: &[&str]) -> Ccm {
    let port = free_port();
    let mut args = base_args(kubeconfig);
    args.extend([
        "--controllers=".to_string(),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        format!("--authentication-kubeconfig={}", kubeconfig.display()),
        format!("--authorization-kubeconfig={}", kubeconfig.display()),
        "--webhook-secure-port=0".into(),
    ]);
    args.extend(extra.iter().map(|s| s.to_string()));
    let ccm = Ccm::spawn(dir, name, &args);
    wait_healthz(ccm.port).await;
    ccm
}

#[tokio::test]
async fn zero_periods_and_tls_flags_rustls_cannot_honour_are_refused_at_start() {
    let cases: &[(&str, &str)] = &[
        ("--node-monitor-period=0s", "--node-monitor-period must be greater than 0"),
        (
            "--node-status-update-frequency=0s",
            "--node-status-update-frequency must be greater than 0",
        ),
        (
            "--route-reconciliation-period=0s",
            "--route-reconciliation-period must be greater than 0",
        ),
        (
            "--tls-min-version=VersionTLS10",
            "--tls-min-version: VersionTLS10 is not supported: rustls",
        ),
        ("--tls-min-version=VersionTLS99", "--tls-min-version: unknown tls version"),
        (
            "--tls-cipher-suites=TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,TLS_RSA_WITH_AES_128_CBC_SHA",
            "--tls-cipher-suites: cipher suite TLS_RSA_WITH_AES_128_CBC_SHA is not supported by rustls",
        ),
        ("--tls-cipher-suites=TLS_BOGUS", "Cipher suite TLS_BOGUS not supported or doesn't exist"),
        ("--webhook-tls-min-version=VersionTLS11", "--webhook-tls-min-version"),
    ];
    for (flag, want) in cases {
        let (code, _, stderr) = run_to_exit(&["--cloud-provider=test", flag]).await;
        assert_eq!(code, 1, "{flag} exits 1; stderr: {stderr}");
        assert!(stderr.contains(want), "{flag}: stderr {stderr:?} should contain {want:?}");
    }
}

#[tokio::test]
async fn a_controller_that_dies_turns_healthz_red_and_ends_the_process_non_zero() {
    let (cp, client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let port = free_port();
    let lease = unique_name("ccm-dies");
    let cfg = dir.join("cloud.json");
    // Every instances call of the scripted cloud panics (a provider bug).
    std::fs::write(&cfg, r#"{"panic": true}"#).unwrap();
    let mut args = base_args(&kubeconfig);
    args.extend([
        format!("--cloud-config={}", cfg.display()),
        "--controllers=cloud-node-lifecycle".to_string(),
        format!("--leader-elect-resource-name={lease}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        "--webhook-secure-port=0".into(),
        "--node-monitor-period=1s".into(),
    ]);
    let mut ccm = Ccm::spawn(&dir, "dies", &args);
    // (A NotReady node of another test may kill it even sooner: that is fine.)
    ccm.wait_for_log(&started("cloud-node-lifecycle-controller"), Duration::from_secs(60)).await;

    // A NotReady node makes the lifecycle controller ask the cloud, which panics.
    let node_name = unique_name("dies-node");
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(client.clone());
    let node = k8s_openapi::api::core::v1::Node {
        metadata: ObjectMeta { name: Some(node_name.clone()), ..Default::default() },
        spec: Some(k8s_openapi::api::core::v1::NodeSpec {
            provider_id: Some(format!("test://{node_name}")),
            ..Default::default()
        }),
        ..Default::default()
    };
    nodes.create(&PostParams::default(), &node).await.unwrap();

    // From the moment the death is logged, /healthz is never green again; the process exits 1.
    let url = format!("https://127.0.0.1:{port}/healthz?verbose");
    let start = Instant::now();
    let mut seen_red = None;
    let mut died_logged_at = None;
    let status = loop {
        if let Some(status) = ccm.child.try_wait().unwrap() {
            break status;
        }
        let logged = ccm.logs().contains("controller died");
        let (code, body) = curl(&url, None, &["--max-time", "5"]).await;
        if logged {
            died_logged_at.get_or_insert(start.elapsed());
            assert_ne!(
                code,
                200,
                "/healthz green after the controller died:\n{body}\n{}",
                ccm.logs()
            );
        }
        if code == 500 {
            seen_red.get_or_insert(body);
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "the manager did not exit within 60s of the controller's death:\n{}",
            ccm.logs()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let logs = ccm.logs();
    let _ = nodes.delete(&node_name, &Default::default()).await;
    assert_eq!(status.code(), Some(1), "{logs}");
    assert!(
        logs.contains(
            "controller cloud-node-lifecycle-controller died: panicked: test cloud: scripted panic"
        ),
        "{logs}"
    );
    assert!(
        logs.contains("released leader lease"),
        "the lease is released on the way out:\n{logs}"
    );
    assert_eq!(lease_holder(&client, &lease).await.as_deref(), Some(""));
    if let Some(body) = &seen_red {
        assert!(body.contains("[-]cloud-node-lifecycle-controller failed"), "{body}");
    }
    eprintln!(
        "MEASURED controller death: exit code 1 {:.2}s after the node was created; red /healthz observed while going down: {}",
        start.elapsed().as_secs_f64(),
        seen_red.is_some()
    );
}

#[tokio::test]
async fn closing_stderr_neither_panics_the_manager_nor_keeps_sigterm_from_stopping_it() {
    let (cp, _client, _dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let port = free_port();
    let lease = unique_name("ccm-stderr");
    let mut args = base_args(&kubeconfig);
    args.extend([
        "--controllers=cloud-node,cloud-node-lifecycle".to_string(),
        format!("--leader-elect-resource-name={lease}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        "--webhook-secure-port=0".into(),
        "--node-monitor-period=1s".into(),
        // Chatty: every pass and every lease renewal logs.
        "-v=6".into(),
    ]);
    let mut child = Command::new(&*BIN)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // The log reader goes away: from now on every write to stderr fails with EPIPE.
    drop(child.stderr.take());
    wait_healthz(port).await;
    // The controllers run and log for a few passes; they must stay alive and /healthz green.
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(5) {
        let (code, body) =
            curl(&format!("https://127.0.0.1:{port}/healthz?verbose"), None, &[]).await;
        assert_eq!(code, 200, "{body}");
        assert!(child.try_wait().unwrap().is_none(), "the manager is still running");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let (_, body) = curl(&format!("https://127.0.0.1:{port}/healthz?verbose"), None, &[]).await;
    assert!(body.contains("[+]cloud-node-lifecycle-controller ok"), "{body}");
    let pid = child.id().unwrap();
    let t0 = Instant::now();
    let status = std::process::Command::new("kill").args(["-TERM", &pid.to_string()]).status();
    assert!(status.unwrap().success());
    let status = tokio::time::timeout(Duration::from_secs(30), child.wait())
        .await
        .expect("SIGTERM stops the manager although stderr is gone")
        .unwrap();
    assert_eq!(status.code(), Some(0));
    eprintln!(
        "MEASURED stderr closed: SIGTERM to exit {:.2}s, exit code 0",
        t0.elapsed().as_secs_f64()
    );
}

/// Sends a request head one line every half second over TLS (`openssl s_client`) until the
/// server closes the connection; returns how long the server kept it open. With `idle`, sends
/// one complete keep-alive request instead and then nothing.
async fn slow_header_client(port: u16, give_up: Duration, idle: bool) -> Option<Duration> {
    use tokio::io::AsyncWriteExt;
    let mut child = Command::new("openssl")
        .args(["s_client", "-quiet", "-connect", &format!("127.0.0.1:{port}")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let start = Instant::now();
    let _ = stdin.write_all(b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n").await;
    if idle {
        let _ = stdin.write_all(b"\r\n").await;
    }
    let mut n = 0;
    while start.elapsed() < give_up {
        if child.try_wait().unwrap().is_some() {
            return Some(start.elapsed());
        }
        if !idle {
            let _ = stdin.write_all(format!("X-Slow-{n}: 1\r\n").as_bytes()).await;
        }
        let _ = stdin.flush().await;
        n += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let _ = child.start_kill();
    None
}

#[tokio::test]
async fn a_slow_header_client_is_cut_off() {
    let (cp, _client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let mut ccm = serving_only(&dir, &kubeconfig, "slow-header", &[]).await;
    // The header deadline is 10s; give a loaded machine plenty of room.
    let held = slow_header_client(ccm.port, Duration::from_secs(45), false).await;
    let held = held
        .unwrap_or_else(|| panic!("a client trickling its headers kept the connection for 45s"));
    eprintln!(
        "MEASURED slow header client cut off after {:.2}s (header deadline 10s)",
        held.as_secs_f64()
    );
    // An idle keep-alive connection is closed as well.
    let idle = slow_header_client(ccm.port, Duration::from_secs(45), true).await;
    let idle = idle.unwrap_or_else(|| panic!("an idle keep-alive connection was kept for 45s"));
    eprintln!("MEASURED idle keep-alive connection closed after {:.2}s", idle.as_secs_f64());
    let (code, _) = curl(&format!("https://127.0.0.1:{}/healthz", ccm.port), None, &[]).await;
    assert_eq!(code, 200);
    ccm.signal("-TERM");
    assert_eq!(ccm.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

/// POSTs `body_file` to `url` `n` times in parallel (one curl); returns the status codes (0:
/// no response).
async fn parallel_posts(url: &str, body_file: &Path, n: usize, extra: &[&str]) -> Vec<u16> {
    let mut cmd = Command::new("curl");
    cmd.args(["-sk", "-Z", "--parallel-max", &n.to_string(), "--max-time", "60"])
        .args(["-w", "CODE:%{http_code}\n"])
        .args(extra)
        .arg("--data-binary")
        .arg(format!("@{}", body_file.display()));
    for _ in 0..n {
        cmd.args(["-o", "/dev/null", url]);
    }
    let out = cmd.output().await.unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .filter_map(|l| l.strip_prefix("CODE:"))
        .map(|c| c.trim().parse().unwrap_or(0))
        .collect()
}

#[tokio::test]
async fn unauthenticated_large_posts_are_refused_without_reading_the_body() {
    let (cp, _client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let mut ccm = serving_only(&dir, &kubeconfig, "big-post", &[]).await;
    let pid = ccm.child.id().unwrap();
    let body = dir.join("8mib.bin");
    std::fs::write(&body, vec![b'x'; 8 << 20]).unwrap();
    let url = format!("https://127.0.0.1:{}/metrics", ccm.port);
    let rss_before = proc_status(pid, "VmRSS");
    // As curl sends large bodies (Expect: 100-continue): the 403 comes before the body.
    let codes = parallel_posts(&url, &body, 40, &[]).await;
    assert_eq!(codes.len(), 40);
    assert!(codes.iter().all(|c| *c == 403), "anonymous POSTs are refused: {codes:?}");
    let rss_expect = proc_status(pid, "VmRSS");
    // Without Expect the body is on its way; the server answers and closes without reading it.
    let codes = parallel_posts(&url, &body, 40, &["-H", "Expect:"]).await;
    assert!(codes.iter().all(|c| *c == 403 || *c == 0), "never served: {codes:?}");
    let rss_after = proc_status(pid, "VmRSS");
    eprintln!(
        "MEASURED 2x40 anonymous 8 MiB POSTs: VmRSS {} kB before, {} kB after the Expect round, {} kB after the no-Expect round (403s in the second round: {})",
        rss_before,
        rss_expect,
        rss_after,
        codes.iter().filter(|c| **c == 403).count()
    );
    assert!(
        rss_after.saturating_sub(rss_before) < 64 * 1024,
        "RSS grew from {rss_before} kB to {rss_after} kB: bodies were buffered"
    );
    // The port still serves.
    let (code, _) = curl(&format!("https://127.0.0.1:{}/healthz", ccm.port), None, &[]).await;
    assert_eq!(code, 200);
    ccm.signal("-TERM");
    assert_eq!(ccm.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

#[tokio::test]
async fn a_connection_flood_is_bounded_and_the_port_still_answers_afterwards() {
    let (cp, _client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let mut ccm = serving_only(&dir, &kubeconfig, "flood", &[]).await;
    let pid = ccm.child.id().unwrap();
    let (fds_before, threads_before, rss_before) =
        (open_fds(pid), proc_status(pid, "Threads"), proc_status(pid, "VmRSS"));
    // 600 connections that never start TLS (the limit is 256 per port).
    let mut flood = Vec::new();
    for _ in 0..600 {
        match tokio::net::TcpStream::connect(("127.0.0.1", ccm.port)).await {
            Ok(s) => flood.push(s),
            Err(_) => break,
        }
    }
    // Let the server accept what it will.
    let mut fds_peak = open_fds(pid);
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(3) {
        fds_peak = fds_peak.max(open_fds(pid));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (threads_peak, rss_peak) = (proc_status(pid, "Threads"), proc_status(pid, "VmRSS"));
    eprintln!(
        "MEASURED flood of {} idle connections: server fds {fds_before} -> {fds_peak}, threads {threads_before} -> {threads_peak}, VmRSS {rss_before} kB -> {rss_peak} kB",
        flood.len()
    );
    assert!(flood.len() > 300, "the kernel queued the flood ({} connections)", flood.len());
    assert!(
        fds_peak <= fds_before + 256 + 16,
        "open fds grew from {fds_before} to {fds_peak} for {} connections",
        flood.len()
    );
    assert!(threads_peak <= threads_before + 16, "threads {threads_before} -> {threads_peak}");
    drop(flood);
    // Afterwards a legitimate client is served (poll: the server drains the queued ones).
    let start = Instant::now();
    loop {
        let (code, _) = curl(&format!("https://127.0.0.1:{}/healthz", ccm.port), None, &[]).await;
        if code == 200 {
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "the port answers again (last {code})");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eprintln!(
        "MEASURED port answered {:.2}s after the flood closed",
        start.elapsed().as_secs_f64()
    );
    ccm.signal("-TERM");
    assert_eq!(ccm.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

#[tokio::test]
async fn tls_min_version_and_cipher_suites_are_honoured() {
    let (cp, _client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    // The self-signed certificate is ECDSA P-256, so ECDSA suites are the usable TLS 1.2 ones.
    let mut tls13 =
        serving_only(&dir, &kubeconfig, "tls13", &["--tls-min-version=VersionTLS13"]).await;
    let url = format!("https://127.0.0.1:{}/healthz", tls13.port);
    let (code, _) = curl(&url, None, &["--tls-max", "1.2"]).await;
    assert_eq!(
        code, 0,
        "a TLS 1.2-only client cannot handshake with --tls-min-version=VersionTLS13"
    );
    let (code, _) = curl(&url, None, &["--tlsv1.3"]).await;
    assert_eq!(code, 200);
    tls13.signal("-TERM");
    assert_eq!(tls13.wait_exit(Duration::from_secs(20)).await.code(), Some(0));

    let mut suites = serving_only(
        &dir,
        &kubeconfig,
        "suites",
        &["--tls-cipher-suites=TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384"],
    )
    .await;
    let url = format!("https://127.0.0.1:{}/healthz", suites.port);
    let (code, _) =
        curl(&url, None, &["--tls-max", "1.2", "--ciphers", "ECDHE-ECDSA-AES128-GCM-SHA256"]).await;
    assert_eq!(code, 0, "a suite outside --tls-cipher-suites is refused");
    let (code, _) =
        curl(&url, None, &["--tls-max", "1.2", "--ciphers", "ECDHE-ECDSA-CHACHA20-POLY1305"]).await;
    assert_eq!(code, 0, "a suite outside --tls-cipher-suites is refused");
    let (code, _) =
        curl(&url, None, &["--tls-max", "1.2", "--ciphers", "ECDHE-ECDSA-AES256-GCM-SHA384"]).await;
    assert_eq!(code, 200, "the listed suite is served");
    // TLS 1.3 suites are not configurable (as in Go).
    let (code, _) = curl(&url, None, &["--tlsv1.3"]).await;
    assert_eq!(code, 200);
    suites.signal("-TERM");
    assert_eq!(suites.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

#[tokio::test]
async fn the_webhook_port_caps_bodies_at_7_mib() {
    let (cp, _client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let (port, wport) = (free_port(), free_port());
    let mut args = base_args(&kubeconfig);
    args.extend([
        "--controllers=".to_string(),
        "--leader-elect=false".into(),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        "--webhook-bind-address=127.0.0.1".into(),
        format!("--webhook-secure-port={wport}"),
        "--webhooks=persistentvolumelabel".into(),
        "--feature-gates=CloudControllerManagerWebhook=true".into(),
    ]);
    let mut ccm = Ccm::spawn(&dir, "webhook-cap", &args);
    wait_healthz(port).await;
    let url = format!("https://127.0.0.1:{wport}/persistentvolumelabel");
    let json = ["-H", "Content-Type: application/json"];
    // Over the cap: 413 (from Content-Length, before the body is read).
    let big = dir.join("big.json");
    std::fs::write(&big, vec![b' '; 8 << 20]).unwrap();
    let (code, body) =
        curl(&url, None, &[json[0], json[1], "--data-binary", &format!("@{}", big.display())])
            .await;
    assert_eq!(code, 413, "{body}");
    // Just under it: read and handled (here: not a valid review, 400).
    let under = dir.join("under.json");
    std::fs::write(&under, vec![b' '; (7 << 20) - 1]).unwrap();
    let (code, body) =
        curl(&url, None, &[json[0], json[1], "--data-binary", &format!("@{}", under.display())])
            .await;
    assert_eq!(code, 400, "{body}");
    assert!(body.starts_with("failed to decode admission review"), "{body}");
    ccm.signal("-TERM");
    assert_eq!(ccm.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

// ---- issue #13 points 5 and 6

/// The subject of the certificate the port serves for `server_name` (`openssl s_client`).
async fn served_subject(port: u16, server_name: &str) -> String {
    let script = format!(
        "openssl s_client -connect 127.0.0.1:{port} -servername {server_name} </dev/null 2>/dev/null | openssl x509 -noout -subject"
    );
    let out = Command::new("sh").arg("-c").arg(script).output().await.unwrap();
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

/// A self-signed serving certificate and key (PEM) with CommonName `cn`, for `names`.
fn serving_pair(cn: &str, names: &[&str]) -> (String, String) {
    let mut params =
        rcgen::CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .unwrap();
    params.distinguished_name.push(rcgen::DnType::CommonName, cn);
    let key = rcgen::KeyPair::generate().unwrap();
    let cert = params.self_signed(&key).unwrap();
    (cert.pem(), key.serialize_pem())
}

/// Writes `contents` to `path` atomically (as a kubelet secret volume update does).
fn replace_file(path: &Path, contents: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, contents).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

/// The argument list of upstream's AWS manifests, unchanged: the example DaemonSet of
/// kubernetes/cloud-provider-aws (`--v=2 --cloud-provider=aws
/// --use-service-account-credentials=true --configure-cloud-routes=false`), the chart's, and the
/// flags kubeadm-style control planes add (delegated authn/authz kubeconfigs, request-header and
/// client CAs, bind address, profiling, JSON logs, leader-election settings). Only paths, the
/// port and the lease name are this test's.
#[tokio::test]
async fn an_upstream_aws_manifest_argument_list_starts_the_binary_unchanged() {
    let (cp, client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let front = ccm_testbed::pki::Pki::generate().unwrap();
    let clients = ccm_testbed::pki::Pki::generate().unwrap();
    let (front_ca, client_ca) = (dir.join("front-proxy-ca.crt"), dir.join("ca.crt"));
    std::fs::write(&front_ca, front.client_ca_pem()).unwrap();
    std::fs::write(&client_ca, clients.client_ca_pem()).unwrap();
    let port = free_port();
    let lease = unique_name("aws-manifest");
    let k = kubeconfig.display().to_string();
    let args: Vec<String> = [
        "--v=2".to_string(),
        "--cloud-provider=aws".into(),
        "--use-service-account-credentials=true".into(),
        "--configure-cloud-routes=false".into(),
        "--allocate-node-cidrs=false".into(),
        "--cluster-name=upstream-manifest".into(),
        "--controllers=*,-cloud-node-lifecycle".into(),
        "--leader-elect=true".into(),
        format!("--leader-elect-resource-name={lease}"),
        "--leader-elect-lease-duration=15s".into(),
        "--leader-elect-renew-deadline=10s".into(),
        "--leader-elect-retry-period=2s".into(),
        format!("--kubeconfig={k}"),
        format!("--authentication-kubeconfig={k}"),
        format!("--authorization-kubeconfig={k}"),
        "--bind-address=127.0.0.1".into(),
        format!("--secure-port={port}"),
        "--webhook-secure-port=0".into(),
        format!("--client-ca-file={}", client_ca.display()),
        format!("--requestheader-client-ca-file={}", front_ca.display()),
        "--requestheader-allowed-names=front-proxy-client".into(),
        "--requestheader-extra-headers-prefix=X-Remote-Extra-".into(),
        "--requestheader-group-headers=X-Remote-Group".into(),
        "--requestheader-username-headers=X-Remote-User".into(),
        "--profiling=false".into(),
        "--permit-address-sharing=true".into(),
        "--disable-http2-serving=true".into(),
        "--tls-min-version=VersionTLS12".into(),
        "--tls-curve-preferences=X25519,CurveP256".into(),
        "--logging-format=json".into(),
        "--log-json-split-stream=false".into(),
        "--vmodule=controller*=4".into(),
        "--feature-gates=CloudControllerManagerWebhook=false".into(),
    ]
    .into();
    let mut ccm =
        Ccm::spawn_with_env(&dir, "aws-manifest", &args, &[("CCM_TEST_PROVIDER_NAME", "aws")]);
    wait_healthz(port).await;
    // Ready once it leads: /readyz carries the leader-election check, as upstream's healthz.
    let start = Instant::now();
    loop {
        let (code, body) =
            curl(&format!("https://127.0.0.1:{port}/readyz?verbose"), None, &[]).await;
        if code == 200 && lease_holder(&client, &lease).await.is_some() {
            assert!(body.contains("[+]leaderElection ok"), "{body}");
            assert!(body.ends_with("readyz check passed\n"), "{body}");
            break;
        }
        assert!(start.elapsed() < Duration::from_secs(60), "not ready in 60s: {code} {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (code, _) = curl(&format!("https://127.0.0.1:{port}/livez"), None, &[]).await;
    assert_eq!(code, 200);
    // --logging-format=json: every stderr line is one JSON object.
    ccm.wait_for_log("\"msg\"", Duration::from_secs(30)).await;
    let logs = ccm.logs();
    for line in logs.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {line}\n{logs}"));
        // `ts`: epoch milliseconds, printed in the shortest form as Go's zap prints a float:
        // a timestamp on a whole millisecond has no fraction (a JSON integer), about one
        // line in a thousand with a microsecond clock.
        assert!(v["msg"].is_string() && v["ts"].is_number(), "{line}");
    }
    ccm.signal("-TERM");
    assert_eq!(ccm.wait_exit(Duration::from_secs(30)).await.code(), Some(0), "{}", ccm.logs());
}

/// `/livez` and `/readyz` are always allowed (as upstream's defaults); `/configz` is the
/// effective configuration in upstream's shape and needs authorization: a client certificate
/// from `--client-ca-file` in `system:masters` gets it, one without rights gets 403 after a
/// SubjectAccessReview, and anonymous gets 403.
#[tokio::test]
async fn livez_readyz_and_configz_with_client_certificate_authentication() {
    let (cp, _client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let pki = ccm_testbed::pki::Pki::generate().unwrap();
    let ca = dir.join("client-ca.crt");
    std::fs::write(&ca, pki.client_ca_pem()).unwrap();
    let write_id = |name: &str, id: &Identity| {
        let (cert, key) = pki.client_cert(id).unwrap();
        let (c, k) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
        std::fs::write(&c, cert).unwrap();
        std::fs::write(&k, key).unwrap();
        (c.display().to_string(), k.display().to_string())
    };
    let admin = write_id("admin", &Identity::new("cert-admin", &["system:masters"]));
    let nobody = write_id("nobody", &Identity::new(unique_name("nobody"), &[]));
    let mut ccm = serving_only(
        &dir,
        &kubeconfig,
        "configz",
        &[&format!("--client-ca-file={}", ca.display()), "--cluster-name=configz-cluster"],
    )
    .await;
    let base = format!("https://127.0.0.1:{}", ccm.port);
    for path in ["/livez", "/readyz", "/healthz", "/readyz?verbose", "/livez?verbose"] {
        let (code, body) = curl(&format!("{base}{path}"), None, &[]).await;
        assert_eq!(code, 200, "{path}: {body}");
    }
    let (code, body) = curl(&format!("{base}/configz"), None, &[]).await;
    assert_eq!(code, 403, "anonymous: {body}");
    let (code, body) =
        curl(&format!("{base}/configz"), None, &["--cert", &nobody.0, "--key", &nobody.1]).await;
    assert_eq!(code, 403, "{body}");
    assert!(body.contains("nobody-"), "the certificate's CN is the user: {body}");
    let (code, body) =
        curl(&format!("{base}/configz"), None, &["--cert", &admin.0, "--key", &admin.1]).await;
    assert_eq!(code, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    let c = &v["cloudcontrollermanager.config.k8s.io"];
    assert_eq!(c["kind"], "CloudControllerManagerConfiguration");
    assert_eq!(c["KubeCloudShared"]["ClusterName"], "configz-cluster");
    assert_eq!(c["Generic"]["Port"], ccm.port);
    // A certificate from another CA is refused (the handshake fails).
    let other = ccm_testbed::pki::Pki::generate().unwrap();
    let (cert, key) = other.client_cert(&Identity::new("stranger", &["system:masters"])).unwrap();
    let (oc, ok) = (dir.join("other.crt"), dir.join("other.key"));
    std::fs::write(&oc, cert).unwrap();
    std::fs::write(&ok, key).unwrap();
    let (code, _) = curl(
        &format!("{base}/configz"),
        None,
        &["--cert", &oc.display().to_string(), "--key", &ok.display().to_string()],
    )
    .await;
    assert_ne!(code, 200);
    ccm.signal("-TERM");
    assert_eq!(ccm.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

/// Request-header authentication: only a client certificate from
/// `--requestheader-client-ca-file` whose CN is allowed may name the user in headers.
#[tokio::test]
async fn request_headers_are_trusted_only_from_the_front_proxy_certificate() {
    let (cp, _client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let front = ccm_testbed::pki::Pki::generate().unwrap();
    let clients = ccm_testbed::pki::Pki::generate().unwrap();
    let write = |name: &str, contents: String| {
        let p = dir.join(name);
        std::fs::write(&p, contents).unwrap();
        p.display().to_string()
    };
    let front_ca = write("front-ca.crt", front.client_ca_pem());
    let client_ca = write("client-ca.crt", clients.client_ca_pem());
    let pair = |pki: &ccm_testbed::pki::Pki, name: &str, cn: &str| {
        let (c, k) = pki.client_cert(&Identity::new(cn, &[])).unwrap();
        (write(&format!("{name}.crt"), c), write(&format!("{name}.key"), k))
    };
    let proxy = pair(&front, "proxy", "front-proxy-client");
    let rogue_proxy = pair(&front, "rogue", "some-other-proxy");
    let mallory = pair(&clients, "mallory", "mallory");
    let mut ccm = serving_only(
        &dir,
        &kubeconfig,
        "requestheader",
        &[
            &format!("--client-ca-file={client_ca}"),
            &format!("--requestheader-client-ca-file={front_ca}"),
            "--requestheader-allowed-names=front-proxy-client",
            "--requestheader-username-headers=X-Remote-User",
            "--requestheader-group-headers=X-Remote-Group",
            "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        ],
    )
    .await;
    let url = format!("https://127.0.0.1:{}/configz", ccm.port);
    let as_masters = ["-H", "X-Remote-User: alice", "-H", "X-Remote-Group: system:masters"];
    let with = |pair: &(String, String)| -> Vec<String> {
        let mut v: Vec<String> =
            vec!["--cert".into(), pair.0.clone(), "--key".into(), pair.1.clone()];
        v.extend(as_masters.iter().map(|s| s.to_string()));
        v
    };
    let run = |extra: Vec<String>| {
        let url = url.clone();
        async move {
            let refs: Vec<&str> = extra.iter().map(String::as_str).collect();
            curl(&url, None, &refs).await
        }
    };
    // The front proxy names alice in system:masters: served.
    let (code, body) = run(with(&proxy)).await;
    assert_eq!(code, 200, "front proxy: {body}");
    // A front-proxy CA certificate whose CN is not allowed: 401.
    let (code, body) = run(with(&rogue_proxy)).await;
    assert_eq!(code, 401, "CN not in --requestheader-allowed-names: {body}");
    // A certificate from --client-ca-file: the headers are ignored, the user is mallory.
    let (code, body) = run(with(&mallory)).await;
    assert_eq!(code, 403, "client CA certificate with headers: {body}");
    assert!(body.contains("mallory"), "{body}");
    // No certificate: the headers are ignored, anonymous.
    let (code, body) = run(as_masters.iter().map(|s| s.to_string()).collect()).await;
    assert_eq!(code, 403, "headers without a certificate: {body}");
    assert!(body.contains("system:anonymous"), "{body}");
    ccm.signal("-TERM");
    assert_eq!(ccm.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

/// `--tls-cert-file`/`--tls-private-key-file` are re-read when they change: new connections
/// get the new certificate without a restart. `--tls-sni-cert-key` serves its certificate for
/// its names.
#[tokio::test]
async fn the_serving_certificate_is_reloaded_when_its_files_change_and_sni_picks_certificates() {
    let (cp, _client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let (cert, key) = (dir.join("serving.crt"), dir.join("serving.key"));
    let (c1, k1) = serving_pair("serving-one", &["localhost", "127.0.0.1"]);
    std::fs::write(&cert, &c1).unwrap();
    std::fs::write(&key, &k1).unwrap();
    let (sc, sk) = serving_pair("sni-cert", &["sni.example.com"]);
    let (sni_cert, sni_key) = (dir.join("sni.crt"), dir.join("sni.key"));
    std::fs::write(&sni_cert, sc).unwrap();
    std::fs::write(&sni_key, sk).unwrap();
    let mut ccm = serving_only(
        &dir,
        &kubeconfig,
        "reload",
        &[
            &format!("--tls-cert-file={}", cert.display()),
            &format!("--tls-private-key-file={}", key.display()),
            &format!("--tls-sni-cert-key={},{}", sni_cert.display(), sni_key.display()),
        ],
    )
    .await;
    assert!(served_subject(ccm.port, "localhost").await.contains("serving-one"));
    assert!(served_subject(ccm.port, "sni.example.com").await.contains("sni-cert"));
    // Replace both files (key first, then certificate: a half-updated pair keeps the old one).
    let (c2, k2) = serving_pair("serving-two", &["localhost", "127.0.0.1"]);
    replace_file(&key, &k2);
    replace_file(&cert, &c2);
    let start = Instant::now();
    loop {
        let subject = served_subject(ccm.port, "localhost").await;
        if subject.contains("serving-two") {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "still serving {subject:?} 60s after the files changed; log:\n{}",
            ccm.logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(served_subject(ccm.port, "sni.example.com").await.contains("sni-cert"));
    let (code, _) = curl(&format!("https://127.0.0.1:{}/healthz", ccm.port), None, &[]).await;
    assert_eq!(code, 200);
    ccm.signal("-TERM");
    assert_eq!(ccm.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

// ---------------------------------------------------------------- probe starvation (#29 MED 4)

/// An unauthenticated peer holding `n` idle TCP connections to a port from `sources` (round
/// robin): each connection sends nothing; when the server closes one, it is opened again
/// after `reconnect` (as an attacker keeping the count up would). Stopped when dropped.
struct IdleFlood {
    tasks: tokio::task::JoinSet<()>,
    open: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    opened: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl IdleFlood {
    fn start(port: u16, n: usize, sources: &[std::net::Ipv4Addr], reconnect: Duration) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        let open = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let opened = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..n {
            let source = sources[i % sources.len()];
            let (open, opened) = (open.clone(), opened.clone());
            tasks.spawn(async move {
                use tokio::io::AsyncReadExt as _;
                loop {
                    let Ok(socket) = tokio::net::TcpSocket::new_v4() else {
                        tokio::time::sleep(reconnect).await;
                        continue;
                    };
                    let connect = async {
                        socket.bind((source, 0).into())?;
                        socket.connect(([127, 0, 0, 1], port).into()).await
                    };
                    if let Ok(Ok(mut s)) =
                        tokio::time::timeout(Duration::from_secs(5), connect).await
                    {
                        opened.fetch_add(1, Relaxed);
                        open.fetch_add(1, Relaxed);
                        // Idle until the server closes it.
                        let mut buf = [0u8; 64];
                        while matches!(s.read(&mut buf).await, Ok(n) if n > 0) {}
                        open.fetch_sub(1, Relaxed);
                    }
                    tokio::time::sleep(reconnect).await;
                }
            });
        }
        IdleFlood { tasks, open, opened }
    }

    /// Connections the peer holds now (queued in the server's backlog included) and opened
    /// in all.
    fn counts(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.open.load(Relaxed), self.opened.load(Relaxed))
    }

    fn stop(mut self) {
        self.tasks.abort_all();
    }
}

/// `127.0.0.<first>` .. : loopback aliases (all of 127/8 reaches loopback on Linux).
fn loopback_sources(first: u8, count: usize) -> Vec<std::net::Ipv4Addr> {
    (0..count)
        .map(|i| {
            let i = usize::from(first) + i;
            std::net::Ipv4Addr::new(127, 0, (i / 250) as u8, (1 + i % 250) as u8)
        })
        .collect()
}

/// `n` probes as kubelet sends them (a new connection each, `timeout` in all, no keep-alive),
/// one every `every`; the status codes (0: no answer in time).
async fn probes(url: &str, n: usize, timeout: Duration, every: Duration) -> Vec<u16> {
    let mut codes = Vec::new();
    for _ in 0..n {
        let started = Instant::now();
        let out = Command::new("curl")
            .args(["-sk", "-o", "/dev/null", "-w", "%{http_code}", "--max-time"])
            .arg(format!("{:.3}", timeout.as_secs_f64()))
            .arg(url)
            .output()
            .await
            .unwrap();
        codes.push(String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(0));
        tokio::time::sleep(every.saturating_sub(started.elapsed())).await;
    }
    codes
}

/// Regression (issue #29 MED 4): one source holding 1200 idle connections kept every probe
/// out: 256 connections were served per port, each idle one for 10 s, and the probe waited
/// in the kernel's backlog behind the rest. Now the peer gets 64, the rest are closed as
/// they arrive, and the probe (another source) is accepted at once. No timing is asserted:
/// each probe has 10 s, far more than a kubelet gives, and still longer than the old code
/// needed to reach a probe queued behind ~940 idle connections (~37 s).
#[tokio::test]
async fn probes_are_answered_while_one_source_holds_1200_idle_connections() {
    let (cp, _client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let mut ccm = serving_only(&dir, &kubeconfig, "starve", &[]).await;
    let flood = IdleFlood::start(
        ccm.port,
        1200,
        &[std::net::Ipv4Addr::new(127, 0, 0, 2)],
        Duration::from_millis(200),
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    let url = format!("https://127.0.0.1:{}/healthz", ccm.port);
    let codes = probes(&url, 10, Duration::from_secs(10), Duration::from_millis(500)).await;
    let (held, opened) = flood.counts();
    eprintln!(
        "MEASURED 1200 idle connections from 127.0.0.2 (held {held}, opened {opened}): probes {codes:?}"
    );
    assert!(opened >= 1200, "the flood connected ({opened})");
    assert_eq!(codes, vec![200; 10], "every probe is answered during the flood");
    flood.stop();
    ccm.signal("-TERM");
    assert_eq!(ccm.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

#[tokio::test]
async fn the_healthz_listener_serves_only_the_health_checks_over_plain_http() {
    let (cp, _client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let hport = free_port();
    let flag = format!("--healthz-bind-address=127.0.0.1:{hport}");
    let mut ccm = serving_only(&dir, &kubeconfig, "healthz-listener", &[&flag]).await;
    let base = format!("http://127.0.0.1:{hport}");
    for path in ["/healthz", "/livez", "/readyz"] {
        assert_eq!(curl(&format!("{base}{path}"), None, &[]).await, (200, "ok".into()), "{path}");
    }
    let (code, body) = curl(&format!("{base}/readyz?verbose"), None, &[]).await;
    assert_eq!(code, 200);
    assert!(body.ends_with("readyz check passed\n"), "the secure port's checks: {body}");
    // Nothing else: not the metrics, the configuration or one check's page; GET only.
    for path in ["/metrics", "/configz", "/healthz/ping", "/", "/debug/pprof/"] {
        let (code, _) = curl(&format!("{base}{path}"), None, &[]).await;
        assert_eq!(code, 404, "{path}");
    }
    let (code, _) = curl(&format!("{base}/healthz"), None, &["-X", "POST", "-d", "x"]).await;
    assert_eq!(code, 405);
    let (code, _) = curl(&format!("https://127.0.0.1:{hport}/healthz"), None, &[]).await;
    assert_eq!(code, 0, "plain HTTP only");
    // Flooded itself from its own (the kubelet's) source, it still answers every probe.
    let flood =
        IdleFlood::start(hport, 300, &[std::net::Ipv4Addr::LOCALHOST], Duration::from_millis(200));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let codes =
        probes(&format!("{base}/healthz"), 10, Duration::from_secs(10), Duration::from_millis(200))
            .await;
    eprintln!("MEASURED healthz listener, 300 idle connections from 127.0.0.1: probes {codes:?}");
    // What the kubelet acts on: a restart after `failureThreshold` (3 in the chart) probes
    // failed in a row. Every probe is answered on an idle machine; under CI's load one probe
    // in ten has been lost: the flood from the probe's own source evicts the newest opening
    // connection only after the 63 older ones, about 50 ms at its churn, and a loaded machine
    // can read the probe's request later than that (left: see the listener's ConnTable).
    let missed = codes.iter().filter(|c| **c != 200).count();
    let in_a_row = codes.windows(2).any(|w| w.iter().all(|c| *c != 200));
    assert!(missed <= 1 && !in_a_row, "probes during the flood: {codes:?}");
    flood.stop();
    ccm.signal("-TERM");
    assert_eq!(ccm.wait_exit(Duration::from_secs(20)).await.code(), Some(0));
}

/// The figures of issue #29 MED 4, before and after (not a pass/fail test):
/// `cargo test -p ccm-testbed --test it manager::probe_starvation_figures -- --ignored
/// --nocapture`; `CCM_MANAGER_TEST_BIN=<binary>` measures another build (e.g. the code
/// before the fix). For each flood (N idle connections from one source or spread over
/// loopback aliases, each reopened 200 ms after the server closes it), 12 probes as kubelet
/// sends them (HTTPS GET /healthz, 1 s timeout, one a second) from 127.0.0.1, and the same on
/// the health-only listener when the binary has it.
#[tokio::test]
#[ignore = "measurement; prints figures (about 2 minutes)"]
async fn probe_starvation_figures() {
    let (cp, _client, dir, kubeconfig) = setup().await;
    let _logs = cp.log_guard();
    let (_, help, _) = run_to_exit(&["--help"]).await;
    let hport = help.contains("--healthz-bind-address").then(free_port);
    let flag = hport.map(|p| format!("--healthz-bind-address=127.0.0.1:{p}"));
    let extra: Vec<&str> = flag.iter().map(String::as_str).collect();
    let mut ccm = serving_only(&dir, &kubeconfig, "starve-figures", &extra).await;
    let pid = ccm.child.id().unwrap();
    let url = format!("https://127.0.0.1:{}/healthz", ccm.port);
    let hurl = hport.map(|p| format!("http://127.0.0.1:{p}/healthz"));
    let one = |ip: [u8; 4]| vec![std::net::Ipv4Addr::from(ip)];
    let scenarios: Vec<(usize, Vec<std::net::Ipv4Addr>, &str)> = vec![
        (300, one([127, 0, 0, 1]), "one source, the prober's own (127.0.0.1)"),
        (300, one([127, 0, 0, 2]), "one source (127.0.0.2)"),
        (1200, one([127, 0, 0, 1]), "one source, the prober's own (127.0.0.1)"),
        (1200, one([127, 0, 0, 2]), "one source (127.0.0.2)"),
        (1200, loopback_sources(1, 40), "40 sources, 30 each"),
        (6000, loopback_sources(1, 200), "200 sources, 30 each: past the global cap"),
    ];
    println!("binary: {}", &*BIN);
    for (n, sources, what) in scenarios {
        let flood = IdleFlood::start(ccm.port, n, &sources, Duration::from_millis(200));
        tokio::time::sleep(Duration::from_secs(3)).await;
        let fds_during = open_fds(pid);
        let secure = probes(&url, 12, Duration::from_secs(1), Duration::from_secs(1)).await;
        let health = match &hurl {
            Some(h) => {
                let codes = probes(h, 12, Duration::from_secs(1), Duration::from_secs(1)).await;
                format!("{}/12", codes.iter().filter(|c| **c == 200).count())
            }
            None => "-".into(),
        };
        let (held, opened) = flood.counts();
        let ok = secure.iter().filter(|c| **c == 200).count();
        println!(
            "MEASURED N={n:>4} {what:<45} secure-port probes ok {ok:>2}/12 (failed {:>2}), healthz-listener probes ok {health}; peer holds {held}, opened {opened}; server fds {fds_during}",
            12 - ok
        );
        flood.stop();
        // Let the server shed the flood before the next one.
        let start = Instant::now();
        while curl(&url, None, &[]).await.0 != 200 && start.elapsed() < Duration::from_secs(120) {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    ccm.signal("-TERM");
    let _ = ccm.wait_exit(Duration::from_secs(20)).await;
}
