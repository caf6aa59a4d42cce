//! The manager's API clients and provider extension points against the real apiserver:
//! one `--kube-api-qps`/`--kube-api-burst` bucket per controller (issue #13 point 4), and a
//! provider's own controllers, admission webhooks, flags and Kubernetes client hand-off
//! (point 8); the manager's
//! upstream metrics `rest_client_*`, `leader_election_slowpath_total` and
//! `kubernetes_build_info` on `/metrics` (point 7).

use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use ccm_core::cloud::{CloudProvider, ProviderInit, downcast_provider};
use ccm_core::controllers::{ControllerContext, ControllerDescriptor, StartError, Started};
use ccm_core::manager::ControllerClients;
use ccm_core::manager::extensions::{Extensions, ExtraController, ExtraWebhook, ProviderFlags};
use ccm_core::manager::webhooks::Webhook;
use ccm_testbed::{ControlPlane, Identity, unique_name};
use k8s_openapi::api::core::v1::ConfigMap;
use kube::Api;
use kube::api::{ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};

async fn admin_config(cp: &ControlPlane) -> kube::Config {
    let json = cp.kubeconfig_json(&Identity::admin()).unwrap();
    let kc: Kubeconfig = serde_json::from_value(json).unwrap();
    kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default()).await.unwrap()
}

async fn write_config_map(client: kube::Client, name: &str) -> Result<(), kube::Error> {
    let cm = ConfigMap {
        metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
        ..Default::default()
    };
    Api::<ConfigMap>::namespaced(client, "default").create(&PostParams::default(), &cm).await?;
    Ok(())
}

/// With `--kube-api-qps` so low that a second request of one client waits two minutes, a
/// controller that used up its bucket does not hold back the writes of the other
/// controllers (each has a bucket of its own, as upstream's per-controller clients).
/// Against one shared client the other controllers' writes would wait those two minutes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_busy_controller_does_not_delay_another_controllers_writes() {
    let cp = ControlPlane::shared().await.expect("control plane starts");
    let clients = ControllerClients::new(admin_config(cp).await, 1.0 / 120.0, 1);
    let service =
        clients.controller_client("service-lb-controller", "service-controller").await.unwrap();
    let node = clients.controller_client("cloud-node-controller", "node-controller").await.unwrap();
    let lifecycle = clients
        .controller_client("cloud-node-lifecycle-controller", "node-controller")
        .await
        .unwrap();

    // The service controller uses its only token, then waits for the next one.
    write_config_map(service.clone(), &unique_name("svc-first")).await.unwrap();
    let pending =
        tokio::spawn(async move { write_config_map(service, &unique_name("svc-second")).await });

    // The node controllers' writes go through at once (the deadline only turns a hang into
    // a failure: their buckets are full; a shared bucket would make them wait 120 s).
    let writes = async {
        write_config_map(node, &unique_name("node")).await.unwrap();
        write_config_map(lifecycle, &unique_name("lifecycle")).await.unwrap();
    };
    tokio::time::timeout(Duration::from_secs(40), writes)
        .await
        .expect("node controllers' writes held back by the service controller's rate limit");
    assert!(!pending.is_finished(), "the service controller's bucket was not exhausted");
    pending.abort();
}

/// A provider with two controllers of its own (`test-extra-controller`, on by default, and
/// `test-optin-controller`, disabled by default) and a flag `--test-extra-prefix`.
struct ExtCloud {
    prefix: String,
    started: Arc<Mutex<Vec<&'static str>>>,
    handed: Arc<OnceLock<kube::Client>>,
}

impl CloudProvider for ExtCloud {
    fn name(&self) -> &str {
        "test"
    }

    fn initialize(&self, init: ProviderInit) -> Result<(), ccm_core::cloud::BoxError> {
        let _ = self.handed.set(init.client.clone());
        let name = format!("{}-init", self.prefix);
        tokio::spawn(async move { write_config_map(init.client, &name).await });
        Ok(())
    }
}

fn start_ext(ctx: &ControllerContext, controller: &'static str) -> Result<Started, StartError> {
    let cloud = downcast_provider::<ExtCloud>(&ctx.cloud)
        .ok_or(StartError { controller, message: "not the ExtCloud provider".into() })?;
    cloud.started.lock().unwrap().push(controller);
    let (client, stop) = (ctx.client.clone(), ctx.shutdown.clone());
    let name = format!("{}-{controller}", cloud.prefix);
    Ok(Started::Running(Box::pin(async move {
        let _ = write_config_map(client, &name).await;
        stop.cancelled().await;
    })))
}

fn start_extra(ctx: &ControllerContext) -> Result<Started, StartError> {
    start_ext(ctx, "test-extra-controller")
}

fn start_optin(ctx: &ControllerContext) -> Result<Started, StartError> {
    start_ext(ctx, "test-optin-controller")
}

/// The provider's validating webhook `test-deny` (on by default): denies everything, naming
/// its provider's `--test-extra-prefix` (so it reached its provider).
fn deny_review(
    cloud: Arc<dyn CloudProvider>,
    request: serde_json::Value,
) -> std::pin::Pin<Box<dyn Future<Output = Result<serde_json::Value, String>> + Send>> {
    Box::pin(async move {
        let cloud = downcast_provider::<ExtCloud>(&cloud).ok_or("not the ExtCloud provider")?;
        let op = request.get("operation").and_then(|o| o.as_str()).unwrap_or_default();
        Ok(serde_json::json!({
            "allowed": false,
            "status": {"code": 403, "message": format!("{}: {op} denied by test-deny", cloud.prefix)},
        }))
    })
}

/// The provider's webhook `test-optin` (disabled by default): allows everything.
fn allow_review(
    _cloud: Arc<dyn CloudProvider>,
    _request: serde_json::Value,
) -> std::pin::Pin<Box<dyn Future<Output = Result<serde_json::Value, String>> + Send>> {
    Box::pin(async { Ok(serde_json::json!({"allowed": true})) })
}

fn extensions() -> Extensions {
    Extensions {
        controllers: vec![
            ExtraController {
                descriptor: ControllerDescriptor {
                    name: "test-optin-controller",
                    alias: "test-optin",
                    client_name: "test-optin-controller",
                    start: start_optin,
                },
                disabled_by_default: true,
            },
            ExtraController {
                descriptor: ControllerDescriptor {
                    name: "test-extra-controller",
                    alias: "test-extra",
                    client_name: "test-extra-controller",
                    start: start_extra,
                },
                disabled_by_default: false,
            },
        ],
        flags: vec![clap::Arg::new("test-extra-prefix").long("test-extra-prefix").required(true)],
        webhooks: vec![
            ExtraWebhook {
                webhook: Webhook { name: "test-deny", path: "/test-deny", handler: deny_review },
                disabled_by_default: false,
            },
            ExtraWebhook {
                webhook: Webhook { name: "test-optin", path: "/test-optin", handler: allow_review },
                disabled_by_default: true,
            },
        ],
        parsed: ProviderFlags::default(),
    }
}

/// Parses and validates the manager's command line with [`extensions`] (program name,
/// `--cloud-provider=test` and `--test-extra-prefix` added).
fn validate_with_extensions(
    ext: &Extensions,
    prefix: &str,
    args: &[String],
) -> Result<ccm_core::manager::flags::Options, String> {
    let mut argv = vec![
        "cloud-controller-manager-test".to_string(),
        "--cloud-provider=test".into(),
        format!("--test-extra-prefix={prefix}"),
    ];
    argv.extend(args.iter().cloned());
    let flags = ccm_core::manager::parse_flags(ext, argv).map_err(|e| e.to_string())?;
    ext.validate(flags, "test").map_err(|e| e.to_string())
}

/// Runs the manager in-process with [`extensions`] and `--controllers=<controllers>` (no
/// webhook port) until `until` returns; returns the provider controllers that were started,
/// and the client handed to the provider.
async fn run_with_extensions(
    kubeconfig: &std::path::Path,
    controllers: &str,
    prefix: &str,
    until: impl AsyncFnOnce(),
) -> (Vec<&'static str>, Option<kube::Client>) {
    let args = [format!("--controllers={controllers}"), "--webhook-secure-port=0".into()];
    run_with_args(kubeconfig, &args, prefix, until).await
}

/// [`run_with_extensions`] with `args` added to the manager's command line.
async fn run_with_args(
    kubeconfig: &std::path::Path,
    args: &[String],
    prefix: &str,
    until: impl AsyncFnOnce(),
) -> (Vec<&'static str>, Option<kube::Client>) {
    let ext = extensions();
    let mut all = vec![
        format!("--kubeconfig={}", kubeconfig.display()),
        "--leader-elect=false".into(),
        "--secure-port=0".into(),
    ];
    all.extend(args.iter().cloned());
    let options = validate_with_extensions(&ext, prefix, &all).expect("flags validate");
    let started = Arc::new(Mutex::new(Vec::new()));
    let handed = Arc::new(OnceLock::new());
    let (s, h, parsed) = (started.clone(), handed.clone(), ext.parsed.clone());
    let factory: ccm_core::manager::CloudFactory = Box::new(move |_| {
        // The provider reads its own flag, parsed with the manager's.
        let prefix = parsed
            .matches()
            .and_then(|m| m.get_one::<String>("test-extra-prefix").cloned())
            .ok_or("--test-extra-prefix not parsed")?;
        Ok(Arc::new(ExtCloud { prefix, started: s, handed: h }) as Arc<dyn CloudProvider>)
    });
    let shutdown = ccm_core::manager::CancellationToken::new();
    let stop = shutdown.clone();
    let manager = tokio::spawn(async move {
        ccm_core::manager::run_until("test", options, factory, &ext, stop).await
    });
    until().await;
    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(60), manager).await;
    assert!(matches!(result, Ok(Ok(Ok(())))), "manager did not stop cleanly: {result:?}");
    let started = started.lock().unwrap().clone();
    (started, handed.get().cloned())
}

async fn wait_config_map(admin: &kube::Client, name: &str) {
    let api = Api::<ConfigMap>::namespaced(admin.clone(), "default");
    ccm_testbed::wait_for(&format!("ConfigMap {name}"), Duration::from_secs(60), || {
        let api = api.clone();
        async move { api.get_opt(name).await.ok().flatten() }
    })
    .await;
}

/// A provider's controllers run like the manager's own: `*` starts the on-by-default one
/// (and not the opt-in one), its flag reaches the provider, it writes through its own
/// client, and the provider gets a working Kubernetes client before controllers start.
/// `--controllers` selects them by name or alias.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_controllers_flags_and_client_hand_off() {
    let cp = ControlPlane::shared().await.expect("control plane starts");
    let admin = cp.admin_client().await.unwrap();
    let dir = std::env::temp_dir().join(unique_name("ccm-ext"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("admin.kubeconfig");
    cp.write_kubeconfig(&kubeconfig, &Identity::admin()).unwrap();

    // `*`: the provider's on-by-default controller runs, the opt-in one does not.
    let prefix = unique_name("ext");
    let (started, handed) = run_with_extensions(&kubeconfig, "*", &prefix, async || {
        wait_config_map(&admin, &format!("{prefix}-init")).await;
        wait_config_map(&admin, &format!("{prefix}-test-extra-controller")).await;
    })
    .await;
    assert_eq!(started, vec!["test-extra-controller"]);
    let handed = handed.expect("the provider was handed a client");
    handed.apiserver_version().await.expect("the handed client works");

    // Selection by alias: opt in to one, switch the other off.
    let prefix = unique_name("ext");
    let (started, _) =
        run_with_extensions(&kubeconfig, "*,test-optin,-test-extra", &prefix, async || {
            wait_config_map(&admin, &format!("{prefix}-test-optin-controller")).await;
        })
        .await;
    assert_eq!(started, vec!["test-optin-controller"]);
    let _ = std::fs::remove_dir_all(&dir);
}

/// POSTs an AdmissionReview (uid `uid`, a ConfigMap CREATE) to `url` with `curl -sk` (TLS,
/// no credentials): the status code (0 when there was no HTTP answer) and the body.
async fn post_review(url: &str, uid: &str) -> (u16, String) {
    let review = serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {
            "uid": uid,
            "kind": {"group": "", "version": "v1", "kind": "ConfigMap"},
            "resource": {"group": "", "version": "v1", "resource": "configmaps"},
            "operation": "CREATE",
            "object": {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cm-1"}}
        }
    });
    let out = tokio::process::Command::new("curl")
        .args(["-sk", "--max-time", "10", "-w", "\n%{http_code}", "-X", "POST"])
        .args(["-H", "Content-Type: application/json", "--data-binary", &review.to_string(), url])
        .output()
        .await
        .expect("curl runs");
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// A provider's webhooks are served on the webhook port next to the core's (TLS, no
/// credentials needed, as the core's): `--webhooks=*` serves its on-by-default webhook,
/// which answers AdmissionReviews through its provider, but not its opt-in one;
/// `*,test-optin,-test-deny` serves the opt-in one and not the switched-off one. An unknown
/// name in `--webhooks` is still refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_webhooks_are_served_when_selected() {
    let cp = ControlPlane::shared().await.expect("control plane starts");
    let dir = std::env::temp_dir().join(unique_name("ccm-ext-webhooks"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("admin.kubeconfig");
    cp.write_kubeconfig(&kubeconfig, &Identity::admin()).unwrap();
    let args = |webhooks: &str, port: u16| {
        vec![
            "--controllers=".to_string(),
            "--feature-gates=CloudControllerManagerWebhook=true".into(),
            "--webhook-bind-address=127.0.0.1".into(),
            format!("--webhook-secure-port={port}"),
            format!("--webhooks={webhooks}"),
        ]
    };
    let free_port =
        || std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();

    // Validation: the provider's names are known, an unknown one is still refused.
    let ext = extensions();
    validate_with_extensions(&ext, "p", &args("test-deny,-test-optin", 1)).unwrap();
    let err = validate_with_extensions(&ext, "p", &args("test-deny,nope", 1)).unwrap_err();
    assert!(err.contains("\"nope\" is not in the list of known webhooks"), "{err}");

    // `*`: the on-by-default provider webhook answers, through its provider.
    let prefix = unique_name("ext");
    let port = free_port();
    run_with_args(&kubeconfig, &args("*", port), &prefix, async || {
        let deny = format!("https://127.0.0.1:{port}/test-deny");
        let (code, body) =
            ccm_testbed::wait_for("the webhook port answers", Duration::from_secs(60), || {
                let deny = deny.clone();
                async move { Some(post_review(&deny, "uid-1").await).filter(|(c, _)| *c != 0) }
            })
            .await;
        assert_eq!(code, 200, "{body}");
        let review: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(review["apiVersion"], "admission.k8s.io/v1");
        assert_eq!(review["kind"], "AdmissionReview");
        assert_eq!(review["response"]["uid"], "uid-1");
        assert_eq!(review["response"]["allowed"], false);
        assert_eq!(
            review["response"]["status"]["message"],
            format!("{prefix}: CREATE denied by test-deny")
        );
        // The core's webhook is served next to it; the opt-in one is not enabled by `*`.
        let (code, body) =
            post_review(&format!("https://127.0.0.1:{port}/persistentvolumelabel"), "uid-2").await;
        assert_eq!(code, 200, "{body}");
        let (code, _) = post_review(&format!("https://127.0.0.1:{port}/test-optin"), "uid-3").await;
        assert_eq!(code, 404);
        // TLS only: plain HTTP gets no AdmissionReview.
        let (code, body) =
            post_review(&format!("http://127.0.0.1:{port}/test-deny"), "uid-4").await;
        assert!(!body.contains("AdmissionReview"), "plain HTTP answered: {code} {body}");
    })
    .await;

    // `*,test-optin,-test-deny`: the opt-in webhook is served, the switched-off one is not.
    let port = free_port();
    run_with_args(&kubeconfig, &args("*,test-optin,-test-deny", port), &prefix, async || {
        let optin = format!("https://127.0.0.1:{port}/test-optin");
        let (code, body) =
            ccm_testbed::wait_for("the webhook port answers", Duration::from_secs(60), || {
                let optin = optin.clone();
                async move { Some(post_review(&optin, "uid-5").await).filter(|(c, _)| *c != 0) }
            })
            .await;
        assert_eq!(code, 200, "{body}");
        let review: serde_json::Value = serde_json::from_str(&body).unwrap();
        assert_eq!(review["response"]["uid"], "uid-5");
        assert_eq!(review["response"]["allowed"], true);
        let (code, _) = post_review(&format!("https://127.0.0.1:{port}/test-deny"), "uid-6").await;
        assert_eq!(code, 404);
    })
    .await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// `curl -sk` a URL without credentials: the body when the status is 200.
async fn get_ok(url: &str) -> Option<String> {
    let out = tokio::process::Command::new("curl")
        .args(["-sk", "--max-time", "10", "-f", url])
        .output()
        .await
        .ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).to_string())
}

/// The manager process serves upstream's client-go / component-base metrics: API requests
/// by code, host and method, their latency by host and verb with client-go's buckets, the
/// slow-path lease renewals after someone else changed the Lease, and the build info.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn manager_serves_rest_client_leader_election_and_build_info_metrics() {
    let cp = ControlPlane::shared().await.expect("control plane starts");
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let dir = std::env::temp_dir().join(unique_name("ccm-metrics"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("admin.kubeconfig");
    cp.write_kubeconfig(&kubeconfig, &Identity::admin()).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let lease = unique_name("ccm-metrics");
    let log = dir.join("ccm.log");
    let mut ccm = tokio::process::Command::new(env!("CARGO_BIN_EXE_cloud-controller-manager-test"))
        .args([
            "--cloud-provider=test".to_string(),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--controllers=cloud-node".into(),
            "--leader-elect-resource-namespace=kube-system".into(),
            format!("--leader-elect-resource-name={lease}"),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={port}"),
            "--authorization-always-allow-paths=/healthz,/metrics".into(),
            "--webhook-secure-port=0".into(),
        ])
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .kill_on_drop(true)
        .spawn()
        .unwrap();

    // Leading: the Lease is ours.
    let leases =
        Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(admin.clone(), "kube-system");
    ccm_testbed::wait_for("the manager holds its Lease", Duration::from_secs(60), || {
        let leases = leases.clone();
        let lease = lease.clone();
        async move {
            let l = leases.get_opt(&lease).await.ok()??;
            l.spec?.holder_identity.filter(|h| !h.is_empty())
        }
    })
    .await;
    // Someone else writes the Lease: our next optimistic renewal conflicts and takes the
    // slow path (read, then update).
    let patch = serde_json::json!({"metadata": {"annotations": {"test/touched": "yes"}}});
    leases
        .patch(&lease, &kube::api::PatchParams::default(), &kube::api::Patch::Merge(&patch))
        .await
        .unwrap();

    let url = format!("https://127.0.0.1:{port}/metrics");
    let slowpath = format!("leader_election_slowpath_total{{name=\"{lease}\"}} ");
    let metrics = ccm_testbed::wait_for(
        "leader_election_slowpath_total of the lease on /metrics",
        Duration::from_secs(90),
        || async {
            let body = get_ok(&url).await?;
            body.lines().any(|l| l.starts_with(&slowpath) && !l.ends_with(" 0")).then_some(body)
        },
    )
    .await;
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let host = cp.server().trim_start_matches("https://").trim_end_matches('/').to_string();
    for (name, labels) in [
        ("rest_client_requests_total", vec![("code", "200"), ("host", &*host), ("method", "GET")]),
        // The conflicting optimistic renewal.
        ("rest_client_requests_total", vec![("code", "409"), ("host", &*host), ("method", "PUT")]),
        (
            "rest_client_request_duration_seconds_bucket",
            vec![("host", &*host), ("verb", "PUT"), ("le", "0.005")],
        ),
        (
            "rest_client_request_duration_seconds_bucket",
            vec![("host", &*host), ("verb", "GET"), ("le", "60.0")],
        ),
        ("rest_client_request_duration_seconds_count", vec![("host", &*host), ("verb", "GET")]),
    ] {
        assert!(
            has_sample(&metrics, name, &labels),
            "{name}{labels:?} missing from /metrics:\n{metrics}\nlog:\n{}",
            log_text()
        );
    }
    for needle in [
        "# TYPE rest_client_request_duration_seconds histogram",
        "# TYPE kubernetes_build_info gauge",
        "# HELP rest_client_requests [ALPHA] Number of HTTP requests, partitioned by status code, method, and host.\n",
    ] {
        assert!(metrics.contains(needle), "{needle:?} missing from /metrics:\n{metrics}");
    }
    let build_info =
        metrics.lines().find(|l| l.starts_with("kubernetes_build_info{")).unwrap_or_default();
    for label in [
        "build_date",
        "compiler",
        "git_commit",
        "git_tree_state",
        "git_version",
        "go_version",
        "major",
        "minor",
        "platform",
    ] {
        assert!(build_info.contains(&format!("{label}=\"")), "{label} in {build_info}");
    }
    assert!(build_info.ends_with(" 1"), "{build_info}");
    ccm.start_kill().unwrap();
    let _ = ccm.wait().await;
    let _ = std::fs::remove_dir_all(&dir);
}

/// Whether `metrics` has a sample of `name` with (at least) these labels, in any order.
fn has_sample(metrics: &str, name: &str, labels: &[(&str, &str)]) -> bool {
    metrics.lines().any(|l| {
        l.strip_prefix(name).and_then(|r| r.strip_prefix('{')).is_some_and(|rest| {
            let set = rest.split('}').next().unwrap_or_default();
            let pairs: Vec<&str> = set.split(',').collect();
            labels.iter().all(|(k, v)| pairs.contains(&format!("{k}=\"{v}\"").as_str()))
        })
    })
}
