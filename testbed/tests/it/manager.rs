//! The cloud-controller-manager command as real processes against the real apiserver:
//! flags and exit codes, controller selection, secure serving with delegated auth, leader
//! election (takeover on kill -9 and SIGTERM, exit on lost lease), service-account
//! credentials, webhooks, and leader migration with a real kube-controller-manager.

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

const BIN: &str = env!("CARGO_BIN_EXE_cloud-controller-manager-test");

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
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
        let log = dir.join(format!("{name}.log"));
        let file = std::fs::File::create(&log).unwrap();
        let port = args
            .iter()
            .find_map(|a| a.strip_prefix("--secure-port="))
            .map(|p| p.parse().unwrap())
            .unwrap_or(0);
        let child = Command::new(BIN)
            .args(args)
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
    let out = Command::new(BIN).args(args).stdin(Stdio::null()).output().await.unwrap();
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
    assert!(stdout.starts_with("cloud-controller-manager-test "), "{stdout}");
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
        ccm.wait_for_log(&format!("Starting \"{}\"", c.name), Duration::from_secs(30)).await;
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
        let started = logs.contains(&format!("Started \"{}\"", c.name));
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

const ACQUIRED: &str = "successfully acquired lease";

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
    a.wait_for_log("Starting \"cloud-node-controller\"", Duration::from_secs(30)).await;
    let b = spawn("b");
    b.wait_for_log("attempting to acquire leader lease", Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!b.logs().contains(ACQUIRED), "the standby does not lead while A renews");
    assert!(!b.logs().contains("Starting \""), "the standby runs no controller:\n{}", b.logs());
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
    b.wait_for_log("Starting \"cloud-node-controller\"", Duration::from_secs(10)).await;
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
    c.wait_for_log(ACQUIRED, Duration::from_secs(60)).await;
    let kill_takeover = t1.elapsed();
    eprintln!(
        "MEASURED leader takeover: after SIGTERM {:.2}s; after kill -9 {:.2}s (lease 15s + retry 2s = 17s)",
        sigterm_takeover.as_secs_f64(),
        kill_takeover.as_secs_f64()
    );
    assert!(
        sigterm_takeover < Duration::from_secs(10),
        "SIGTERM takeover took {sigterm_takeover:?}"
    );
    assert!(kill_takeover < Duration::from_secs(40), "kill -9 takeover took {kill_takeover:?}");
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
    ccm.wait_for_log("Starting \"cloud-node-controller\"", Duration::from_secs(60)).await;
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
        "user=system:serviceaccount:kube-system:node-controller",
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
        assert!(v["level"].is_string() && v["message"].is_string(), "{line}");
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
    let started_line = "Starting \"cloud-node-lifecycle-controller\"";
    ccm.wait_for_log(started_line, Duration::from_secs(30)).await;
    let logs = ccm.logs();
    let line = logs.lines().find(|l| l.contains(started_line)).unwrap();
    let started_at: k8s_openapi::jiff::Timestamp =
        line.split_whitespace().next().unwrap().parse().unwrap();
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
        logs.find(ACQUIRED).unwrap() < logs.find(started_line).unwrap(),
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
