//! The cloud-controller-manager command (spec §7–§9): flags, controller selection, leader
//! election and migration, secure serving, per-controller credentials and webhooks.
//!
//! ```text
//! main(provider, factory) / main_with_extensions(provider, factory, extensions)
//!   ├─ flags ─▶ Options (validated; bad input exits 1 with a message naming the flag)
//!   ├─ cloud = factory(--cloud-config bytes)
//!   ├─ secure port: /healthz, /livez, /readyz (leaderElection + one check per controller),
//!   │    /metrics, /configz (request-header, client-certificate or delegated TokenReview
//!   │    authentication; SubjectAccessReview; limits checked before any body is read)
//!   ├─ health-only listener (--healthz-bind-address, plain HTTP): /healthz, /livez, /readyz
//!   ├─ webhook port (gate CloudControllerManagerWebhook and --webhooks; core + provider webhooks)
//!   └─ leader election (main lock; migration lock for migrated controllers)
//!        ├─ cloud.initialize(Kubernetes client)
//!        └─ start enabled controllers, core + provider (each its own client and rate-limit
//!             bucket; own ServiceAccount with --use-service-account-credentials)
//! ```
//!
//! Exit codes: 0 after SIGTERM/SIGINT (controllers stopped, leases released; a second signal
//! exits 1 at once), 1 on any start error, when leadership is lost (controllers are cancelled
//! first) or when a controller dies (its `/healthz` check turns red, the other controllers are
//! stopped and the leases released first).
//!
//! Logging never panics or blocks the process: if stderr goes away, log lines are dropped
//! (see [`logging`]).

pub mod authn;
pub mod duration;
pub mod extensions;
pub mod flags;
pub mod leader;
pub mod logging;
pub mod metrics;
pub mod migration;
pub mod ratelimit;
pub mod selection;
pub mod serving;
pub mod supervise;
pub mod tls;
pub mod webhooks;

mod credentials;

use std::io::Write as _;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{CommandFactory as _, FromArgMatches as _};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use tokio::task::JoinHandle;
/// The shutdown token of [`run_until`] (re-exported so callers need no `tokio-util`).
pub use tokio_util::sync::CancellationToken;

use crate::cloud::{BoxError, CloudProvider};
use crate::controllers::events::EventRecorder;
use crate::controllers::{
    self, ControllerConfig, ControllerContext, ControllerDescriptor, Started,
};
use flags::{Flags, Options};
use kube::runtime::events::Reporter;
use leader::{Elector, ElectorConfig, HoldOutcome};

/// The component name (event source, user agent, migration component identity).
pub const COMPONENT: &str = "cloud-controller-manager";

/// Builds the provider from the `--cloud-config` contents (`None` without the flag).
pub type CloudFactory =
    Box<dyn FnOnce(Option<&[u8]>) -> Result<Arc<dyn CloudProvider>, BoxError> + Send>;

/// Why the manager stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ManagerError {
    /// `--cloud-config` could not be read.
    #[error("--cloud-config: couldn't open cloud provider configuration {path:?}: {source}")]
    CloudConfig {
        /// The path.
        path: String,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The provider refused its configuration.
    #[error("cloud provider could not be initialized: {0}")]
    CloudInit(#[source] BoxError),
    /// The provider has no cluster ID and `--allow-untagged-cloud` is not set.
    #[error(
        "no ClusterID found. A ClusterID is required for the cloud provider to function properly. This check can be bypassed by setting the allow-untagged-cloud option"
    )]
    NoClusterId,
    /// The API client could not be configured.
    #[error("{what}: {message}")]
    Client {
        /// Which flag or configuration.
        what: String,
        /// What failed.
        message: String,
    },
    /// The apiserver did not become healthy.
    #[error("failed to wait for apiserver being healthy: {0}")]
    ApiserverUnhealthy(String),
    /// A controller could not be configured (fatal, as upstream).
    #[error("error starting controller {0}")]
    ControllerStart(#[from] controllers::StartError),
    /// Serving failed to start.
    #[error(transparent)]
    Serving(#[from] serving::ServingError),
    /// The leader migration configuration is invalid.
    #[error(transparent)]
    Migration(#[from] migration::MigrationError),
    /// Per-controller credentials could not be set up.
    #[error("--use-service-account-credentials: {0}")]
    Credentials(String),
    /// Leadership of a lock was lost.
    #[error("leaderelection lost ({0})")]
    LeaderElectionLost(String),
    /// A controller's task died (panicked or returned before shutdown).
    #[error("controller {controller} died: {reason}")]
    ControllerDied {
        /// Canonical controller name.
        controller: String,
        /// What happened.
        reason: String,
    },
}

impl From<supervise::Death> for ManagerError {
    fn from(d: supervise::Death) -> Self {
        ManagerError::ControllerDied { controller: d.controller, reason: d.reason }
    }
}

/// Writes a line to stderr, ignoring failures (stderr may be closed; this must not panic).
fn print_error(msg: &dyn std::fmt::Display) {
    let _ = writeln!(std::io::stderr(), "error: {msg}");
}

/// Runs the manager for the binary of `provider` with the process arguments and exits.
///
/// Each provider's `main` is `ccm_core::manager::main(PROVIDER_NAME, Box::new(|cfg| ...))`.
pub fn main(provider: &str, factory: CloudFactory) -> ExitCode {
    main_with_args(provider, factory, std::env::args_os())
}

/// [`main`] with explicit arguments (the first is the program name).
pub fn main_with_args<I, T>(provider: &str, factory: CloudFactory, args: I) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    main_with_extensions(provider, factory, extensions::Extensions::default(), args)
}

/// Parses the manager's flags plus the provider's ([`extensions::Extensions::flags`]; their
/// values go to [`extensions::Extensions::parsed`]).
pub fn parse_flags<I, T>(extensions: &extensions::Extensions, args: I) -> Result<Flags, clap::Error>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches =
        Flags::command().args(extensions.flags.iter().cloned()).try_get_matches_from(args)?;
    let flags = Flags::from_arg_matches(&matches)?;
    extensions.parsed.set(matches);
    Ok(flags)
}

/// [`main_with_args`] for a provider that adds controllers, webhooks or flags to the manager.
pub fn main_with_extensions<I, T>(
    provider: &str,
    factory: CloudFactory,
    extensions: extensions::Extensions,
    args: I,
) -> ExitCode
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let args: Vec<std::ffi::OsString> = args.into_iter().map(Into::into).collect();
    // Operator tools (`migrate-check`, `orphans`): subcommands, not the manager.
    if crate::ops::is_tool_invocation(&args) {
        return crate::ops::main(provider, factory, args);
    }
    let flags = match parse_flags(&extensions, args) {
        Ok(f) => f,
        Err(e) => {
            let code = if e.use_stderr() { ExitCode::FAILURE } else { ExitCode::SUCCESS };
            let _ = e.print();
            return code;
        }
    };
    // component-base's verflag: `Kubernetes v<version>`, or the whole version info with =raw.
    if flags.version.prints() {
        let info = flags::VersionInfo::get(&flags.version);
        let line = match flags.version {
            flags::VersionFlag::Raw => info.raw(),
            _ => info.short(),
        };
        let _ = writeln!(std::io::stdout(), "{line}");
        return ExitCode::SUCCESS;
    }
    let options = match extensions.validate(flags, provider) {
        Ok(o) => o,
        Err(e) => {
            print_error(&e);
            return ExitCode::FAILURE;
        }
    };
    logging::init(options.log_format, options.flags.verbosity);
    // One warning naming the provider's accepted-only flags that were set (it logs only on its
    // first call, so a caller that also calls it does not repeat it).
    extensions.warn_accepted_only();
    if let Some(command) = &options.skipped_command {
        tracing::info!(
            argument = %command,
            "skipping the first argument: it names an upstream cloud-controller-manager command (the container's args start with it)"
        );
    }
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            print_error(&format_args!("cannot start the async runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(async {
        let shutdown = CancellationToken::new();
        spawn_signal_handler(shutdown.clone());
        run_until(provider, options, factory, &extensions, shutdown).await
    });
    match result {
        Ok(()) => {
            tracing::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            tracing::error!(error = %e, "cloud-controller-manager failed");
            print_error(&e);
            // Leave at once: no controller task gets to run again.
            std::process::exit(1)
        }
    }
}

pub(crate) async fn kube_config(
    kubeconfig: &str,
    master: &str,
    what: &str,
) -> Result<kube::Config, ManagerError> {
    let err = |message: String| ManagerError::Client { what: what.to_string(), message };
    let mut config = if !kubeconfig.is_empty() {
        let kc = kube::config::Kubeconfig::read_from(kubeconfig)
            .map_err(|e| err(format!("cannot read kubeconfig {kubeconfig:?}: {e}")))?;
        kube::Config::from_custom_kubeconfig(kc, &kube::config::KubeConfigOptions::default())
            .await
            .map_err(|e| err(format!("invalid kubeconfig {kubeconfig:?}: {e}")))?
    } else if !master.is_empty() {
        let url: http::Uri =
            master.parse().map_err(|e| err(format!("invalid --master {master:?}: {e}")))?;
        kube::Config::new(url)
    } else {
        tracing::warn!(
            "Neither --kubeconfig nor --master was specified. Using the inClusterConfig."
        );
        kube::Config::incluster().map_err(|e| err(format!("in-cluster configuration: {e}")))?
    };
    if !master.is_empty() {
        config.cluster_url =
            master.parse().map_err(|e| err(format!("invalid --master {master:?}: {e}")))?;
    }
    config.disable_compression = true;
    set_user_agent(&mut config, None);
    Ok(config)
}

/// Sets `User-Agent: cloud-controller-manager/v<version> (<os>/<arch>)[/<client name>]`, as
/// upstream's `rest.AddUserAgent` (with the controller's client name for per-controller
/// clients).
pub(crate) fn set_user_agent(config: &mut kube::Config, client_name: Option<&str>) {
    let mut ua = format!(
        "{COMPONENT}/v{} ({}/{})",
        env!("CARGO_PKG_VERSION"),
        std::env::consts::OS,
        std::env::consts::ARCH
    );
    if let Some(name) = client_name {
        ua.push('/');
        ua.push_str(name);
    }
    config.headers.retain(|(k, _)| k != http::header::USER_AGENT);
    if let Ok(v) = http::HeaderValue::from_str(&ua) {
        config.headers.push((http::header::USER_AGENT, v));
    }
}

/// A client with client-go's token-bucket rate limit (`qps`, `burst`).
pub(crate) fn client_from(
    config: kube::Config,
    what: &str,
    qps: f32,
    burst: u32,
) -> Result<kube::Client, ManagerError> {
    let host = config.cluster_url.authority().map(|a| a.to_string()).unwrap_or_default();
    let builder = kube::client::ClientBuilder::try_from(config)
        .map_err(|e| ManagerError::Client { what: what.to_string(), message: e.to_string() })?;
    // The metrics layer sits inside the rate limiter: it times the request, not the wait.
    Ok(builder
        .with_layer(&metrics::RestClientMetricsLayer::new(host))
        .with_layer(&ratelimit::RateLimitLayer::new(qps, burst))
        .build())
}

/// Builds each controller's API client, as upstream's controller client builder: every
/// controller gets a client of its own, named by its client name in the `User-Agent`, with
/// its own `--kube-api-qps` / `--kube-api-burst` token bucket, so one busy controller never
/// delays another's writes. Events go through one more client with a bucket of its own
/// ([`ControllerClients::events_client`], issue #15). With
/// `--use-service-account-credentials` the client acts as the controller's ServiceAccount,
/// still one bucket per controller.
pub struct ControllerClients {
    base: kube::Config,
    qps: f32,
    burst: u32,
    service_accounts: Option<credentials::ServiceAccountClients>,
}

impl ControllerClients {
    /// Clients from `base` (the `--kubeconfig`/`--master` configuration), each limited to
    /// `qps` requests per second with bursts of `burst`.
    pub fn new(base: kube::Config, qps: f32, burst: u32) -> Self {
        ControllerClients { base, qps, burst, service_accounts: None }
    }

    /// The client handed to the provider ([`CloudProvider::initialize`]): the manager's own
    /// credentials, user agent `.../cloud-provider`, a bucket of its own.
    pub fn provider_client(&self) -> Result<kube::Client, ManagerError> {
        let mut config = self.base.clone();
        set_user_agent(&mut config, Some("cloud-provider"));
        client_from(config, "cloud-provider", self.qps, self.burst)
    }

    /// The client every controller records events through (the manager's credentials,
    /// user agent `.../event-broadcaster`) with one bucket of its own, so events never take
    /// a controller's tokens (issue #15: a Node's `Synced` event cost a third of the node
    /// controller's budget; upstream's controllers write events asynchronously, through the
    /// controller's own clientset).
    pub fn events_client(&self) -> Result<kube::Client, ManagerError> {
        let mut config = self.base.clone();
        set_user_agent(&mut config, Some("event-broadcaster"));
        client_from(config, "event-broadcaster", self.qps, self.burst)
    }

    /// The client of the shared informers (the one Node watch every controller reads;
    /// upstream's `shared-informers` client): the manager's own credentials, a bucket of its
    /// own.
    pub fn informer_client(&self) -> Result<kube::Client, ManagerError> {
        let mut config = self.base.clone();
        set_user_agent(&mut config, Some("shared-informers"));
        client_from(config, "shared-informers", self.qps, self.burst)
    }

    /// A new client for the controller `controller` acting as `client_name` (e.g.
    /// `node-controller`), with a rate-limit bucket of its own.
    pub async fn controller_client(
        &self,
        controller: &str,
        client_name: &str,
    ) -> Result<kube::Client, ManagerError> {
        match &self.service_accounts {
            Some(sa) => sa
                .client_for(client_name)
                .await
                .map_err(|e| ManagerError::Credentials(format!("{controller}: {e}"))),
            None => {
                let mut config = self.base.clone();
                set_user_agent(&mut config, Some(client_name));
                client_from(config, controller, self.qps, self.burst)
            }
        }
    }
}

/// The events client of the controllers ([`ControllerClients::events_client`]).
fn ccm_events_client(
    clients: &ControllerClients,
) -> Result<crate::controllers::EventsClient, ManagerError> {
    clients.events_client().map(crate::controllers::EventsClient)
}

/// A delegated-auth client: the given kubeconfig, else in-cluster, else none (logged).
async fn delegated_client(kubeconfig: &str, what: &str) -> Option<kube::Client> {
    let config = if kubeconfig.is_empty() {
        kube::Config::incluster().ok()
    } else {
        match kube_config(kubeconfig, "", what).await {
            Ok(c) => Some(c),
            Err(e) => {
                tracing::warn!(error = %e, "delegated client unavailable");
                None
            }
        }
    };
    // The delegated clients use QPS 200 / burst 400, as upstream.
    config.and_then(|c| client_from(c, what, 200.0, 400).ok())
}

/// Registers the manager's own families (process-level and webhook metrics) in `registry`;
/// used by the generated metrics reference (`crate::reference`, issue #20 docs).
#[cfg(feature = "testing")]
pub(crate) fn register_manager_metrics(registry: &Mutex<Registry>) {
    let _ = ManagerMetrics::register(registry);
    let _ = webhooks::WebhookMetrics::register(registry);
}

struct ManagerMetrics {
    running: Family<Vec<(String, String)>, Gauge>,
    leader: Family<Vec<(String, String)>, Gauge>,
}

impl ManagerMetrics {
    fn register(registry: &Mutex<Registry>) -> Self {
        let m = ManagerMetrics { running: Family::default(), leader: Family::default() };
        let mut reg = registry.lock().unwrap_or_else(|p| p.into_inner());
        reg.register(
            "running_managed_controllers",
            "[BETA] Indicates where instances of a controller are currently running",
            m.running.clone(),
        );
        reg.register(
            "leader_election_master_status",
            "[ALPHA] Gauge of if the reporting system is master of the relevant lease, 0 indicates backup, 1 indicates master. 'name' is the string used to identify the lease. Please make sure to group by name.",
            m.leader.clone(),
        );
        m
    }

    fn set_running(&self, alias: &str, v: i64) {
        self.running
            .get_or_create(&vec![
                ("name".into(), alias.into()),
                ("manager".into(), COMPONENT.into()),
            ])
            .set(v);
    }

    fn set_leader(&self, lock: &str, v: i64) {
        self.leader.get_or_create(&vec![("name".into(), lock.into())]).set(v);
    }
}

/// Sets `running_managed_controllers` of a controller to 0 when dropped.
struct RunningGuard(Arc<ManagerMetrics>, &'static str);

impl Drop for RunningGuard {
    fn drop(&mut self) {
        self.0.set_running(self.1, 0);
    }
}

/// The tasks of started controllers.
type Handles = tokio::sync::Mutex<Vec<JoinHandle<()>>>;

/// Starts controllers and tracks them.
struct Runner {
    clients: ControllerClients,
    cloud: Arc<dyn CloudProvider>,
    config: Arc<ControllerConfig>,
    registry: Arc<Mutex<Registry>>,
    metrics: Arc<ManagerMetrics>,
    health: serving::Health,
    start_interval: Duration,
    supervisor: supervise::Supervisor,
    /// Whether [`CloudProvider::initialize`] was called.
    initialized: std::sync::atomic::AtomicBool,
}

impl Runner {
    async fn start(
        &self,
        list: &[ControllerDescriptor],
        stop: &CancellationToken,
        handles: &Handles,
    ) -> Result<(), ManagerError> {
        if !self.initialized.swap(true, std::sync::atomic::Ordering::SeqCst) {
            // Upstream calls the cloud's Initialize when it starts the controllers.
            let client = self.clients.provider_client()?;
            let init = crate::cloud::ProviderInit::new(client, stop.child_token());
            self.cloud.initialize(init).map_err(ManagerError::CloudInit)?;
        }
        if list.is_empty() {
            return Ok(());
        }
        // One Node watch for every controller of this start (issue #15: was one per
        // controller, each with a full cache of every Node).
        let nodes = crate::controllers::informer::SharedNodes::start(
            self.clients.informer_client()?,
            stop.child_token(),
        );
        for c in list {
            if stop.is_cancelled() {
                break;
            }
            tracing::info!(controller = c.name, "Starting {:?}", c.name);
            let client = self.clients.controller_client(c.name, c.client_name).await?;
            let ctx = ControllerContext {
                client,
                cloud: self.cloud.clone(),
                config: self.config.clone(),
                metrics: self.registry.clone(),
                shutdown: stop.child_token(),
                nodes: Some(nodes.clone()),
            };
            match (c.start)(&ctx)? {
                Started::Skipped(reason) => {
                    tracing::warn!(controller = c.name, %reason, "Skipping {:?}", c.name);
                }
                Started::Running(fut) => {
                    tracing::info!(controller = c.name, "Started {:?}", c.name);
                    self.metrics.set_running(c.alias, 1);
                    let metrics = self.metrics.clone();
                    let alias = c.alias;
                    let name = c.name;
                    let fut = Box::pin(async move {
                        // Back to 0 however the controller ends (also when it panics).
                        let _running = RunningGuard(metrics, alias);
                        fut.await;
                        tracing::info!(controller = name, "Stopped {name:?}");
                    });
                    let task = self.supervisor.spawn(name, fut, ctx.shutdown.clone(), &self.health);
                    handles.lock().await.push(task);
                }
            }
            if !self.start_interval.is_zero() {
                tokio::time::sleep(leader::jitter(self.start_interval, 1.0)).await;
            }
        }
        Ok(())
    }
}

/// Cancels `token` and waits (bounded) for the controllers to end; `true` if all ended.
async fn stop_controllers(token: &CancellationToken, handles: Vec<JoinHandle<()>>) -> bool {
    token.cancel();
    let all = futures::future::join_all(handles);
    tokio::time::timeout(Duration::from_secs(10), all).await.is_ok()
}

async fn wait_for_apiserver(client: &kube::Client) -> Result<(), ManagerError> {
    let mut last = String::new();
    for _ in 0..10 {
        let req = http::Request::get("/healthz").body(Vec::new());
        match req {
            Ok(req) => match client.request_text(req).await {
                Ok(body) if body.trim() == "ok" => return Ok(()),
                Ok(body) => last = format!("apiserver /healthz said {:?}", body.trim()),
                Err(e) => last = e.to_string(),
            },
            Err(e) => return Err(ManagerError::ApiserverUnhealthy(e.to_string())),
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Err(ManagerError::ApiserverUnhealthy(last))
}

fn spawn_signal_handler(shutdown: CancellationToken) {
    tokio::spawn(async move {
        #[cfg(unix)]
        {
            use tokio::signal::unix::{SignalKind, signal};
            let (Ok(mut term), Ok(mut int)) =
                (signal(SignalKind::terminate()), signal(SignalKind::interrupt()))
            else {
                tracing::error!("cannot install signal handlers");
                return;
            };
            let which = tokio::select! {
                _ = term.recv() => "SIGTERM",
                _ = int.recv() => "SIGINT",
            };
            // Cancel before logging: nothing may stand between a signal and the shutdown.
            shutdown.cancel();
            tracing::info!(signal = which, "received signal, shutting down");
            // A second signal leaves at once (as upstream's signal handler).
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
            tracing::warn!("second signal, exiting now");
            std::process::exit(1);
        }
        #[cfg(not(unix))]
        {
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
            tracing::info!("received interrupt, shutting down");
        }
    });
}

/// Runs the manager until a signal (Ok) or a fatal error (Err).
pub async fn run(
    provider: &str,
    options: Options,
    factory: CloudFactory,
) -> Result<(), ManagerError> {
    let shutdown = CancellationToken::new();
    spawn_signal_handler(shutdown.clone());
    run_until(provider, options, factory, &extensions::Extensions::default(), shutdown).await
}

/// Runs the manager with the provider's `extensions` until `shutdown` is cancelled (Ok) or a
/// fatal error (Err). Installs no signal handler.
pub async fn run_until(
    provider: &str,
    options: Options,
    factory: CloudFactory,
    extensions: &extensions::Extensions,
    shutdown: CancellationToken,
) -> Result<(), ManagerError> {
    let flags = &options.flags;
    tracing::info!(
        version = env!("CARGO_PKG_VERSION"),
        provider,
        "cloud-controller-manager starting"
    );

    let cloud_config = match options.cloud_config_path() {
        Some(path) => Some(std::fs::read(&path).map_err(|source| ManagerError::CloudConfig {
            path: path.display().to_string(),
            source,
        })?),
        None => None,
    };
    let cloud = factory(cloud_config.as_deref()).map_err(ManagerError::CloudInit)?;
    if !cloud.has_cluster_id() {
        if flags.allow_untagged_cloud {
            tracing::warn!(
                "detected a cluster without a ClusterID. A ClusterID will be required in the future. Please tag your cluster to avoid any future issues"
            );
        } else {
            return Err(ManagerError::NoClusterId);
        }
    }
    let caps = [
        ("InstancesV2", cloud.instances_v2().is_some()),
        ("LoadBalancer", cloud.load_balancer().is_some()),
        ("Routes", cloud.routes().is_some()),
        ("Zones", cloud.zones().is_some()),
    ];
    let supported: Vec<&str> = caps.iter().filter(|(_, s)| *s).map(|(n, _)| *n).collect();
    if supported.is_empty() {
        tracing::warn!(
            provider = cloud.name(),
            "the cloud provider supports no capability yet: every controller that needs the cloud will be skipped"
        );
    } else {
        tracing::info!(provider = cloud.name(), capabilities = ?supported, "cloud provider initialized");
    }

    warn_on_default_cluster_name(cloud.as_ref(), &flags.cluster_name);

    let kconfig = kube_config(&flags.kubeconfig, &flags.master, "--kubeconfig").await?;
    let (qps, burst) = (flags.kube_api_qps, flags.kube_api_burst);
    let client = client_from(kconfig.clone(), "--kubeconfig", qps, burst)?;

    let registry = Arc::new(Mutex::new(Registry::default()));
    let metrics = Arc::new(ManagerMetrics::register(&registry));
    {
        let mut reg = registry.lock().unwrap_or_else(|p| p.into_inner());
        metrics::register(&mut reg);
        cloud.register_metrics(&mut reg);
    }
    let health = serving::Health::default();
    let serving_stop = CancellationToken::new();
    let _stop_serving = serving_stop.clone().drop_guard();

    let known = extensions.all_controllers();
    let enabled =
        options.controllers.enabled_with_defaults(&known, &extensions.disabled_by_default());
    let migration = if options.leader_election.is_some() && flags.enable_leader_migration {
        Some(migration::load(&flags.leader_migration_config)?)
    } else {
        None
    };

    let elector_state = options.leader_election.as_ref().map(|le| {
        let state = leader::LeaderState::default();
        let grace = le.lease_duration + Duration::from_secs(20);
        let s = state.clone();
        health.add(
            "leaderElection",
            Arc::new(move || match s.last_renewal() {
                Some(t) if t.elapsed() > grace => {
                    Err(format!("lease not renewed for {:?}", t.elapsed()))
                }
                _ => Ok(()),
            }),
        );
        state
    });

    if flags.secure_port != 0 {
        let x509 = authn::X509Auth::from_flags(flags)?;
        let tls = serving::tls_config_with_client_auth(
            &flags.tls_cert_file,
            &flags.tls_private_key_file,
            ("--tls-cert-file", "--tls-private-key-file"),
            &options.tls,
            x509.as_ref().map(|x| x.tls_verifier()),
        )?;
        let addr = std::net::SocketAddr::new(flags.bind_address, flags.secure_port);
        let listener = serving::bind_shared(addr, flags.permit_port_sharing).await?;
        let authn =
            delegated_client(&flags.authentication_kubeconfig, "--authentication-kubeconfig").await;
        let authz =
            delegated_client(&flags.authorization_kubeconfig, "--authorization-kubeconfig").await;
        if authn.is_none() {
            tracing::warn!(
                "No authentication-kubeconfig provided in order to lookup client-ca-file in configmap/extension-apiserver-authentication in kube-system, so client certificate authentication won't work."
            );
        }
        if authz.is_none() {
            tracing::warn!(
                "No authorization-kubeconfig provided, so SubjectAccessReview of authorization tokens won't work."
            );
        }
        let delegation = Arc::new(
            authn::Delegation::new(
                authn,
                authz,
                flags.authorization_always_allow_paths.clone(),
                flags.authentication_token_webhook_cache_ttl,
                flags.authorization_webhook_cache_authorized_ttl,
                flags.authorization_webhook_cache_unauthorized_ttl,
            )
            .with_x509(x509),
        );
        let gate = secure_gate(delegation);
        let handler = secure_handler(health.clone(), registry.clone(), options.configz());
        tracing::info!(%addr, "serving securely");
        tokio::spawn(serving::serve(
            listener,
            tls,
            serving::Limits::SECURE,
            gate,
            handler,
            serving_stop.clone(),
        ));
    }

    if let Some(addr) = options.healthz_bind_address {
        let listener = serving::bind_shared(addr, flags.permit_port_sharing).await?;
        tracing::info!(%addr, "serving /healthz, /livez and /readyz over plain HTTP");
        tokio::spawn(serving::serve_plain(
            listener,
            serving::Limits::HEALTHZ,
            health_only_gate,
            health_only_handler(health.clone()),
            serving_stop.clone(),
        ));
    }

    webhooks::start(&options, extensions, cloud.clone(), registry.clone(), serving_stop.clone())
        .await?;

    wait_for_apiserver(&client).await?;

    let mut clients = ControllerClients::new(kconfig.clone(), qps, burst);
    if flags.use_service_account_credentials {
        clients.service_accounts = Some(credentials::ServiceAccountClients::new(
            client.clone(),
            kconfig.clone(),
            &flags.controller_service_account_prefix,
            qps,
            burst,
        ));
    }
    // Events through a client and bucket of their own (issue #15), acting as the manager
    // itself also with --use-service-account-credentials: the per-controller accounts then
    // need no events rule (issue #29: the chart's per-controller roles hold only their
    // controller's calls), and upstream's manager role grants events.
    let mut controller_config = options.controller_config.clone();
    controller_config.events_client = Some(ccm_events_client(&clients)?);
    record_config_warnings(cloud.as_ref(), controller_config.events_client.as_ref(), flags);
    let runner = Arc::new(Runner {
        clients,
        cloud,
        config: Arc::new(controller_config),
        registry: registry.clone(),
        metrics: metrics.clone(),
        health,
        start_interval: flags.controller_start_interval,
        supervisor: supervise::Supervisor::default(),
        initialized: Default::default(),
    });

    // Leader election has its own client and bucket too (upstream: user agent
    // `leader-election`), so busy controllers never delay lease renewals.
    let mut le_config = kconfig.clone();
    set_user_agent(&mut le_config, Some("leader-election"));
    let le_client = client_from(le_config, "leader-election", qps, burst)?;
    let result = run_controllers(
        &options,
        &le_client,
        &runner,
        &enabled,
        migration,
        elector_state,
        &shutdown,
    )
    .await;
    if let Some(c) = &runner.clients.service_accounts {
        c.cleanup();
    }
    result
}

/// The reason of the Events [`record_config_warnings`] records.
pub const CONFIG_WARNING_REASON: &str = "CloudConfigWarning";

/// Logs each of the cloud's [`CloudProvider::config_warnings`] and records each once, at start
/// (leader or standby), as a core/v1 `Warning` Event with reason [`CONFIG_WARNING_REASON`]
/// from component `cloud-controller-manager`, through the manager's events client. The Event is
/// about the manager's Pod when the downward API names it (`POD_NAME` and `POD_NAMESPACE`, as
/// the chart sets them), else about the leader-election Lease
/// (`--leader-elect-resource-namespace`/`--leader-elect-resource-name`; it is only named, it
/// need not exist yet). Recorded in the background: an Event never holds up the start.
fn record_config_warnings(
    cloud: &dyn CloudProvider,
    events: Option<&crate::controllers::EventsClient>,
    flags: &flags::Flags,
) {
    let warnings = cloud.config_warnings();
    if warnings.is_empty() {
        return;
    }
    for warning in &warnings {
        tracing::warn!(provider = cloud.name(), %warning, "cloud config warning");
    }
    let Some(events) = events else {
        return;
    };
    let recorder = EventRecorder::new(events.0.clone(), Reporter::from(COMPONENT));
    let env = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let meta = |name: String, namespace: String| kube::api::ObjectMeta {
        name: Some(name),
        namespace: Some(namespace),
        ..Default::default()
    };
    let pod = match (env("POD_NAME"), env("POD_NAMESPACE")) {
        (Some(name), Some(namespace)) => Some(k8s_openapi::api::core::v1::Pod {
            metadata: meta(name, namespace),
            ..Default::default()
        }),
        _ => None,
    };
    let lease = k8s_openapi::api::coordination::v1::Lease {
        metadata: meta(
            flags.leader_elect_resource_name.clone(),
            flags.leader_elect_resource_namespace.clone(),
        ),
        ..Default::default()
    };
    tokio::spawn(async move {
        use crate::controllers::events::publish;
        use kube::runtime::events::EventType::Warning;
        const REASON: &str = CONFIG_WARNING_REASON;
        for note in warnings {
            match &pod {
                Some(pod) => publish(&recorder, pod, Warning, REASON, REASON, note).await,
                None => publish(&recorder, &lease, Warning, REASON, REASON, note).await,
            }
        }
    });
}

/// Runs the controllers, under leader election when enabled, until shutdown or a lost lock.
async fn run_controllers(
    options: &Options,
    client: &kube::Client,
    runner: &Arc<Runner>,
    enabled: &[ControllerDescriptor],
    migration: Option<migration::LeaderMigrationConfig>,
    elector_state: Option<leader::LeaderState>,
    shutdown: &CancellationToken,
) -> Result<(), ManagerError> {
    let metrics = &runner.metrics;
    let Some(le) = options.leader_election.clone() else {
        let token = CancellationToken::new();
        let handles = Handles::default();
        let died = tokio::select! {
            r = runner.start(enabled, &token, &handles) => {
                r?;
                tokio::select! {
                    _ = shutdown.cancelled() => None,
                    d = runner.supervisor.died() => Some(d),
                }
            }
            d = runner.supervisor.died() => Some(d),
            _ = shutdown.cancelled() => None,
        };
        stop_controllers(&token, handles.into_inner()).await;
        return match died {
            Some(d) => Err(d.into()),
            None => Ok(()),
        };
    };

    let identity = leader::identity();
    let lock = |name: &str| ElectorConfig {
        namespace: le.namespace.clone(),
        name: name.to_string(),
        identity: identity.clone(),
        lease_duration: le.lease_duration,
        renew_deadline: le.renew_deadline,
        retry_period: le.retry_period,
    };
    let (main_list, migrated_list) = match &migration {
        Some(m) => m.split(enabled, COMPONENT),
        None => (enabled.to_vec(), Vec::new()),
    };
    // "became leader" Events about the Lease, as upstream's recorder (component
    // cloud-controller-manager) writes them, through the manager's events client.
    let recorder = runner
        .config
        .events_client
        .as_ref()
        .map(|c| EventRecorder::new(c.0.clone(), Reporter::from(COMPONENT)));
    let elector = |name: &str| {
        let e = Elector::new(client.clone(), lock(name));
        match &recorder {
            Some(r) => e.with_events(r.clone()),
            None => e,
        }
    };
    let mut main_elector = elector(&le.name);
    if let Some(state) = &elector_state {
        main_elector.state = state.clone();
    }
    metrics.set_leader(&le.name, 0);
    if !main_elector.acquire(shutdown).await {
        return Ok(());
    }
    metrics.set_leader(&le.name, 1);

    // Controllers start while the locks keep being renewed (a long --controller-start-interval
    // must not let a lease lapse).
    let main_token = CancellationToken::new();
    let handles = Handles::default();

    // Migration lock (after the main lock: MigrationReady).
    let migration_name = migration.as_ref().map(|m| m.leader_name.clone());
    let mig_token = CancellationToken::new();
    let mut mig_elector = migration_name.as_ref().map(|n| elector(n));

    let outcome = {
        let main_hold = main_elector.hold(shutdown);
        let main_start = async {
            runner.start(&main_list, &main_token, &handles).await?;
            futures::future::pending::<Result<HoldOutcome, ManagerError>>().await
        };
        let mig = async {
            let Some(elector) = mig_elector.as_mut() else {
                shutdown.cancelled().await;
                return Ok(HoldOutcome::Cancelled);
            };
            metrics.set_leader(&elector.config().name, 0);
            if !elector.acquire(shutdown).await {
                return Ok(HoldOutcome::Cancelled);
            }
            metrics.set_leader(&elector.config().name, 1);
            let mig_start = async {
                runner.start(&migrated_list, &mig_token, &handles).await?;
                futures::future::pending::<Result<HoldOutcome, ManagerError>>().await
            };
            tokio::select! {
                o = elector.hold(shutdown) => Ok(o),
                e = mig_start => e,
            }
        };
        tokio::select! {
            o = main_hold => Ok((o, le.name.clone())),
            e = main_start => e.map(|o| (o, le.name.clone())),
            o = mig => o.map(|o| (o, migration_name.clone().unwrap_or_default())),
            d = runner.supervisor.died() => Err(ManagerError::from(d)),
        }
    };
    let (outcome, lock_name) = match outcome {
        Ok(x) => x,
        Err(e @ ManagerError::ControllerDied { .. }) => {
            // Its check is red already; stop the others, then release the locks so a standby
            // takes over at once, and exit 1.
            let handles = handles.into_inner();
            mig_token.cancel();
            if stop_controllers(&main_token, handles).await {
                if let Some(el) = mig_elector.as_mut() {
                    el.release().await;
                }
                main_elector.release().await;
            }
            return Err(e);
        }
        Err(e) => {
            main_token.cancel();
            mig_token.cancel();
            return Err(e);
        }
    };
    if outcome == HoldOutcome::Lost {
        // Stop every controller before anything else, then exit non-zero.
        main_token.cancel();
        mig_token.cancel();
        metrics.set_leader(&lock_name, 0);
        let which = if Some(&lock_name) == migration_name.as_ref() {
            "migration leaderelection lost"
        } else {
            "leaderelection lost"
        };
        tracing::error!(lock = %lock_name, "{which}");
        return Err(ManagerError::LeaderElectionLost(lock_name));
    }

    // Orderly shutdown: stop controllers, then release the locks so a standby leads at once.
    let handles = handles.into_inner();
    mig_token.cancel();
    let stopped = stop_controllers(&main_token, handles).await;
    if stopped {
        if let Some(e) = mig_elector.as_mut() {
            e.release().await;
        }
        main_elector.release().await;
    } else {
        tracing::warn!(
            "controllers did not stop within 10s; not releasing the lease (it expires instead)"
        );
    }
    Ok(())
}

/// The secure port's gate: authentication and authorization on the request head, then the
/// method (every endpoint is GET), all before any body is read.
fn secure_gate(
    delegation: Arc<authn::Delegation>,
) -> impl Fn(
    http::request::Parts,
    std::net::SocketAddr,
) -> futures::future::BoxFuture<
    'static,
    Result<http::request::Parts, http::Response<serving::Body>>,
> + Clone
+ Send
+ Sync
+ 'static {
    move |parts, _peer| {
        let delegation = delegation.clone();
        Box::pin(async move {
            match delegation.check_request(&parts).await {
                authn::Decision::Allow => {}
                authn::Decision::Unauthorized => {
                    return Err(serving::text(http::StatusCode::UNAUTHORIZED, "Unauthorized\n"));
                }
                authn::Decision::Forbidden(msg) => {
                    return Err(serving::text(http::StatusCode::FORBIDDEN, format!("{msg}\n")));
                }
            }
            if parts.method != http::Method::GET && parts.method != http::Method::HEAD {
                return Err(serving::text(
                    http::StatusCode::METHOD_NOT_ALLOWED,
                    "method not allowed\n",
                ));
            }
            Ok(parts)
        })
    }
}

/// `--cluster-name`'s default.
pub const DEFAULT_CLUSTER_NAME: &str = "kubernetes";

/// Warns (one line) when the provider names or tags cloud resources by cluster name and
/// `--cluster-name` is the default every cluster shares.
fn warn_on_default_cluster_name(cloud: &dyn CloudProvider, cluster_name: &str) {
    if !(cloud.names_resources_by_cluster() && cluster_name == DEFAULT_CLUSTER_NAME) {
        return;
    }
    tracing::warn!(
        provider = cloud.name(),
        "--cluster-name is {DEFAULT_CLUSTER_NAME:?}, the default every cluster shares, and this provider names or tags cloud resources by cluster name: another cluster left at the default in the same account could claim this cluster's load balancers and routes, and this one theirs. Set --cluster-name to a name unique in the account"
    );
}

/// The health-only listener's gate: `GET`/`HEAD` of `/healthz`, `/livez` or `/readyz`,
/// nothing else (no credentials: these are the secure port's always-allowed paths).
fn health_only_gate(
    parts: http::request::Parts,
    _peer: std::net::SocketAddr,
) -> futures::future::Ready<Result<http::request::Parts, http::Response<serving::Body>>> {
    let verdict = if !matches!(parts.uri.path(), "/healthz" | "/livez" | "/readyz") {
        Err(serving::text(http::StatusCode::NOT_FOUND, "404 page not found\n"))
    } else if parts.method != http::Method::GET && parts.method != http::Method::HEAD {
        Err(serving::text(http::StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"))
    } else {
        Ok(parts)
    };
    futures::future::ready(verdict)
}

fn health_only_handler(
    health: serving::Health,
) -> impl Fn(
    http::Request<hyper::body::Bytes>,
    std::net::SocketAddr,
) -> futures::future::Ready<http::Response<serving::Body>>
+ Clone
+ Send
+ Sync
+ 'static {
    move |req, _peer| futures::future::ready(health.respond(req.uri().path(), req.uri().query()))
}

fn secure_handler(
    health: serving::Health,
    registry: Arc<Mutex<Registry>>,
    configz: serde_json::Value,
) -> impl Fn(
    http::Request<hyper::body::Bytes>,
    std::net::SocketAddr,
) -> futures::future::BoxFuture<'static, http::Response<serving::Body>>
+ Clone
+ Send
+ Sync
+ 'static {
    move |req, _peer| {
        let health = health.clone();
        let registry = registry.clone();
        let configz = configz.clone();
        Box::pin(async move {
            let path = req.uri().path().to_string();
            let query = req.uri().query().map(str::to_string);
            if serving::Health::serves(&path) {
                health.respond(&path, query.as_deref())
            } else if path == "/configz" {
                serving::json(http::StatusCode::OK, &configz)
            } else if path == "/metrics" {
                serving::metrics_response(&registry)
            } else {
                serving::text(http::StatusCode::NOT_FOUND, "404 page not found\n")
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{ClusterNamedCloud, TestCloud};

    /// Log lines written through `tracing` on this thread while the guard lives.
    #[derive(Clone, Default)]
    struct Captured(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// Starts the manager in-process with `cloud` and `extra` flags up to its first API
    /// call (a kubeconfig that does not exist ends it there); returns what it logged.
    async fn start_up_log(cloud: Arc<dyn CloudProvider>, extra: &[&str]) -> String {
        let logs = Captured::default();
        let writer = logs.clone();
        let subscriber =
            tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
        let _guard = tracing::subscriber::set_default(subscriber);
        crate::testing::anchor_tracing();
        let mut args = vec![
            "ccm",
            "--cloud-provider=test",
            "--kubeconfig=/nonexistent/ccm-test/kubeconfig",
            "--secure-port=0",
            "--webhook-secure-port=0",
        ];
        args.extend_from_slice(extra);
        let ext = extensions::Extensions::default();
        let options = parse_flags(&ext, args)
            .unwrap()
            .validate(crate::testing::PROVIDER_NAME, &crate::controllers::all())
            .unwrap();
        let factory: CloudFactory = Box::new(move |_| Ok(cloud));
        let err =
            run_until("test", options, factory, &ext, CancellationToken::new()).await.unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ccm-test/kubeconfig"), "{err}");
        String::from_utf8(logs.0.lock().unwrap().clone()).unwrap()
    }

    #[tokio::test(flavor = "current_thread")]
    async fn the_default_cluster_name_is_warned_about_when_the_provider_names_resources_by_it() {
        let named: Arc<dyn CloudProvider> = Arc::new(ClusterNamedCloud::default());
        let log = start_up_log(named.clone(), &[]).await;
        let warnings: Vec<&str> =
            log.lines().filter(|l| l.contains("WARN") && l.contains("--cluster-name")).collect();
        assert_eq!(warnings.len(), 1, "one warning line:\n{log}");
        assert!(
            warnings[0].contains("\"kubernetes\"") && warnings[0].contains("names or tags"),
            "it says why: {}",
            warnings[0]
        );
        // A chosen name, or a provider that does not name resources by cluster: no warning.
        let log = start_up_log(named, &["--cluster-name=prod-eu-1"]).await;
        assert!(!log.contains("--cluster-name"), "{log}");
        let log = start_up_log(Arc::new(TestCloud::default()), &[]).await;
        assert!(!log.contains("--cluster-name"), "{log}");
    }
}
