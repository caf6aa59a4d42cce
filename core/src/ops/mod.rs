//! Operator tools, subcommands of every `cloud-controller-manager-<cloud>` binary (issue 20):
//!
//! - `migrate-check`: before switching a cluster from another cloud controller to ours, reads
//!   every Node and Service (list only, nothing is written) and prints what ours would change:
//!   providerID, addresses, labels and taints per Node (asking the provider's instances as the
//!   node controllers would), and per `type: LoadBalancer` Service the load balancer name ours
//!   would use against what serves the Service in the cloud now. Exit code 1 when a change
//!   would disrupt traffic ([`Change::disruptive`]), 3 when something could not be checked,
//!   else 0.
//! - `orphans`: lists the cloud load balancers (with their security groups, target groups and
//!   IPs) tagged as created by this cluster that belong to no existing Service; `--delete`
//!   removes them after a confirmation (`--yes` skips it). A load balancer not tagged as owned
//!   by the cluster is never listed as an orphan and never deleted.
//!
//! Provider-neutral: the cloud side comes from [`InstancesV2`] and the optional
//! [`LoadBalancer::list_cloud_load_balancers`] / [`LoadBalancer::delete_cloud_load_balancer`].

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsString;
use std::io::{BufRead as _, Write as _};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser as _;
use k8s_openapi::api::core::v1::{Node, NodeAddress, Service};
use kube::Api;
use kube::api::ListParams;

use crate::cloud::{CloudLoadBalancer, CloudProvider, InstanceStatus, LoadBalancer, ProviderError};
use crate::cloud_call::Deadline;
use crate::controllers::node_util;
use crate::manager::CloudFactory;
use crate::names;

/// The subcommands.
pub const TOOLS: [&str; 2] = ["migrate-check", "orphans"];

/// Exit code: a change would disrupt traffic.
pub const EXIT_DISRUPTIVE: u8 = 1;
/// Exit code: something could not be checked (or deleted); the answer is incomplete.
pub const EXIT_INCOMPLETE: u8 = 3;

/// Deadline of each cloud call the tools make (a batch counts as one call).
const CLOUD_DEADLINE: Duration = Duration::from_secs(120);

/// Whether the arguments (program name first) run a tool rather than the manager.
pub fn is_tool_invocation(args: &[OsString]) -> bool {
    args.get(1).and_then(|a| a.to_str()).is_some_and(|a| TOOLS.contains(&a))
}

#[derive(clap::Parser, Debug)]
#[command(about = "Operator tools of the cloud-controller-manager")]
struct Cli {
    #[command(subcommand)]
    tool: Tool,
}

#[derive(clap::Subcommand, Debug)]
enum Tool {
    /// Print what this cloud-controller-manager would change in the cluster (read-only);
    /// exit 1 if a change would disrupt traffic, 3 if something could not be checked.
    MigrateCheck(Common),
    /// List (and with --delete remove) cloud load balancers owned by this cluster that
    /// belong to no Service.
    Orphans {
        #[command(flatten)]
        common: Common,
        /// Delete the orphans (after a confirmation prompt).
        #[arg(long)]
        delete: bool,
        /// Do not ask for confirmation.
        #[arg(long, short = 'y')]
        yes: bool,
    },
}

#[derive(clap::Args, Debug)]
struct Common {
    /// Path to a kubeconfig (list access to nodes and services is enough).
    #[arg(long, default_value = "")]
    kubeconfig: String,
    /// The address of the Kubernetes API server (overrides the kubeconfig).
    #[arg(long, default_value = "")]
    master: String,
    /// The cloud provider configuration file, as given to the manager.
    #[arg(long = "cloud-config", default_value = "")]
    cloud_config: String,
    /// The cluster name, as given to the manager.
    #[arg(long = "cluster-name", default_value = "kubernetes")]
    cluster_name: String,
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = Output::Text)]
    output: Output,
    /// Accepted for parity with the manager's flags and ignored.
    #[arg(long = "cloud-provider", default_value = "")]
    cloud_provider: String,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
enum Output {
    Text,
    Json,
}

/// Why a tool could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum OpsError {
    /// The cloud config could not be read.
    #[error("--cloud-config: cannot read {path:?}: {source}")]
    CloudConfig {
        /// The path.
        path: String,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The provider refused its configuration.
    #[error("cloud provider could not be initialized: {0}")]
    CloudInit(#[source] crate::cloud::BoxError),
    /// The Kubernetes client could not be built.
    #[error(transparent)]
    Client(#[from] crate::manager::ManagerError),
    /// Listing Nodes or Services failed.
    #[error("listing {what}: {source}")]
    List {
        /// What was listed.
        what: &'static str,
        /// The API error.
        #[source]
        source: kube::Error,
    },
    /// A cloud call failed where the tool cannot go on without it.
    #[error("{what}: {source}")]
    Cloud {
        /// What was asked.
        what: String,
        /// The provider's error.
        #[source]
        source: ProviderError,
    },
    /// Writing the output failed.
    #[error("writing the output: {0}")]
    Output(#[from] std::io::Error),
}

/// One thing ours would change (or a difference it would leave, see `note`).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Change {
    /// `node/<name>` or `service/<namespace>/<name>`.
    pub object: String,
    /// What changes: `providerID`, `addresses`, `label <key>`, `taint <key>`, `node`,
    /// `load balancer`.
    pub field: String,
    /// The value now (empty when unset).
    pub from: String,
    /// The value ours would give it.
    pub to: String,
    /// Whether the change would disrupt traffic.
    pub disruptive: bool,
    /// Why, or what ours would do, for people.
    pub note: String,
}

/// Something that could not be checked.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Problem {
    /// The object (`node/<name>`, `service/<ns>/<name>`, `load balancers`).
    pub object: String,
    /// The error.
    pub error: String,
}

/// The result of `migrate-check`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct MigrationReport {
    /// The provider.
    pub provider: String,
    /// Nodes read.
    pub nodes: usize,
    /// `type: LoadBalancer` Services read.
    pub load_balancer_services: usize,
    /// Every change, in object order.
    pub changes: Vec<Change>,
    /// What could not be checked.
    pub problems: Vec<Problem>,
}

impl MigrationReport {
    /// How many changes would disrupt traffic.
    pub fn disruptive(&self) -> usize {
        self.changes.iter().filter(|c| c.disruptive).count()
    }

    /// The exit code: 1 disruptive, 3 incomplete, 0 clean.
    pub fn exit_code(&self) -> u8 {
        if self.disruptive() > 0 {
            EXIT_DISRUPTIVE
        } else if !self.problems.is_empty() {
            EXIT_INCOMPLETE
        } else {
            0
        }
    }
}

/// The result of `orphans`.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct OrphanReport {
    /// The provider.
    pub provider: String,
    /// Why nothing was checked (the cloud has no load balancers here), if so.
    pub unsupported: Option<String>,
    /// Owned load balancers that belong to no Service.
    pub orphans: Vec<CloudLoadBalancer>,
    /// Names of the orphans deleted.
    pub deleted: Vec<String>,
    /// Failures.
    pub problems: Vec<Problem>,
}

/// Runs `migrate-check` or `orphans` for `provider` with these arguments (program name first,
/// the tool second) and returns the process exit code.
pub fn main(provider: &str, factory: CloudFactory, args: Vec<OsString>) -> ExitCode {
    let program = format!("cloud-controller-manager-{provider}");
    let mut argv = vec![OsString::from(program)];
    argv.extend(args.into_iter().skip(1));
    let cli = match Cli::try_parse_from(argv) {
        Ok(c) => c,
        Err(e) => {
            let code = if e.use_stderr() { ExitCode::from(2) } else { ExitCode::SUCCESS };
            let _ = e.print();
            return code;
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = runtime.block_on(run(provider, factory, cli));
    match result {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            let _ = writeln!(std::io::stderr(), "error: {e}");
            ExitCode::from(EXIT_INCOMPLETE)
        }
    }
}

async fn run(provider: &str, factory: CloudFactory, cli: Cli) -> Result<u8, OpsError> {
    let common = match &cli.tool {
        Tool::MigrateCheck(c) => c,
        Tool::Orphans { common, .. } => common,
    };
    let cloud = build_cloud(factory, &common.cloud_config)?;
    let config =
        crate::manager::kube_config(&common.kubeconfig, &common.master, "--kubeconfig").await?;
    let client = crate::manager::client_from(config, "operator tool", 20.0, 30)?;
    let stdout = &mut std::io::stdout();
    match cli.tool {
        Tool::MigrateCheck(c) => {
            let report = migrate_check(provider, &cloud, &client, &c.cluster_name).await?;
            match c.output {
                Output::Json => writeln!(stdout, "{}", to_json(&report))?,
                Output::Text => write_migration_text(stdout, &report)?,
            }
            Ok(report.exit_code())
        }
        Tool::Orphans { common, delete, yes } => {
            let mut report = find_orphans(provider, &cloud, &client, &common.cluster_name).await?;
            let text = common.output == Output::Text;
            if text {
                write_orphans_text(stdout, &report, delete)?;
            }
            if delete && !report.orphans.is_empty() {
                let confirmed = yes || confirm(report.orphans.len())?;
                if !confirmed {
                    writeln!(std::io::stderr(), "not confirmed: nothing deleted")?;
                    if !text {
                        writeln!(stdout, "{}", to_json(&report))?;
                    }
                    return Ok(EXIT_DISRUPTIVE);
                }
                delete_orphans(&cloud, &client, &common.cluster_name, &mut report).await?;
                if text {
                    for name in &report.deleted {
                        writeln!(stdout, "deleted {name}")?;
                    }
                    for p in &report.problems {
                        writeln!(stdout, "NOT deleted {}: {}", p.object, p.error)?;
                    }
                }
            }
            if !text {
                writeln!(stdout, "{}", to_json(&report))?;
            }
            Ok(if report.problems.is_empty() { 0 } else { EXIT_INCOMPLETE })
        }
    }
}

fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string_pretty(v).unwrap_or_else(|e| format!("{{\"error\": \"{e}\"}}"))
}

fn build_cloud(factory: CloudFactory, path: &str) -> Result<Arc<dyn CloudProvider>, OpsError> {
    let bytes = if path.is_empty() {
        None
    } else {
        Some(
            std::fs::read(path)
                .map_err(|source| OpsError::CloudConfig { path: path.to_string(), source })?,
        )
    };
    factory(bytes.as_deref()).map_err(OpsError::CloudInit)
}

/// Asks on stderr, reads one line from stdin: only `y` or `yes` confirms (end of input does
/// not).
fn confirm(count: usize) -> Result<bool, OpsError> {
    let mut err = std::io::stderr();
    write!(
        err,
        "Delete the {count} load balancer(s) listed above and their resources? Type 'yes' to continue: "
    )?;
    err.flush()?;
    let mut line = String::new();
    std::io::stdin().lock().read_line(&mut line)?;
    Ok(matches!(line.trim().to_ascii_lowercase().as_str(), "y" | "yes"))
}

fn node_object(node: &Node) -> String {
    format!("node/{}", node.metadata.name.as_deref().unwrap_or_default())
}

fn service_key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

fn format_addresses(a: &[NodeAddress]) -> String {
    a.iter().map(|a| format!("{}={}", a.type_, a.address)).collect::<Vec<_>>().join(",")
}

fn is_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
}

fn load_balancer_class(svc: &Service) -> Option<&str> {
    svc.spec.as_ref().and_then(|s| s.load_balancer_class.as_deref())
}

fn status_ingress(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .map(|is| is.iter().filter_map(|i| i.hostname.clone().or_else(|| i.ip.clone())).collect())
        .unwrap_or_default()
}

async fn list<K>(api: Api<K>, what: &'static str) -> Result<Vec<K>, OpsError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|source| OpsError::List { what, source })
}

/// `migrate-check` on a provider and a client (list access to Nodes and Services is enough).
pub async fn migrate_check(
    provider: &str,
    cloud: &Arc<dyn CloudProvider>,
    client: &kube::Client,
    cluster_name: &str,
) -> Result<MigrationReport, OpsError> {
    let nodes: Vec<Node> = list(Api::all(client.clone()), "nodes").await?;
    let services: Vec<Service> = list(Api::all(client.clone()), "services").await?;
    let mut report = MigrationReport { provider: provider.to_string(), ..Default::default() };
    report.nodes = nodes.len();
    match cloud.instances_v2() {
        Some(instances) if !nodes.is_empty() => {
            let deadline = Deadline::new(CLOUD_DEADLINE);
            let metas = deadline
                .run("instance metadata (batch)", instances.instance_metadata_batch(&nodes))
                .await;
            let statuses = deadline
                .run("instance status (batch)", instances.instance_status_batch(&nodes))
                .await;
            match (metas, statuses) {
                (Ok(metas), Ok(statuses)) => {
                    for ((node, meta), status) in nodes.iter().zip(metas).zip(statuses) {
                        node_changes(node, meta, status, &mut report);
                    }
                }
                (Err(e), _) | (_, Err(e)) => {
                    report.problems.push(Problem { object: "nodes".into(), error: e.to_string() })
                }
            }
        }
        Some(_) => {}
        None => report.problems.push(Problem {
            object: "nodes".into(),
            error: format!("the {provider} provider does not initialise Nodes"),
        }),
    }
    let lb_services: Vec<&Service> = services
        .iter()
        .filter(|s| is_load_balancer(s))
        .filter(|s| s.metadata.deletion_timestamp.is_none())
        .collect();
    report.load_balancer_services = lb_services.len();
    if !lb_services.is_empty() {
        match cloud.load_balancer() {
            Some(lb) => {
                service_changes(lb.as_ref(), cluster_name, &lb_services, &mut report).await;
            }
            None => {
                for svc in lb_services.iter().filter(|s| load_balancer_class(s).is_none()) {
                    report.changes.push(Change {
                        object: format!("service/{}", service_key(svc)),
                        field: "load balancer".into(),
                        from: status_ingress(svc).join(","),
                        to: String::new(),
                        disruptive: false,
                        note: format!(
                            "the {provider} provider has no load balancers: ours leaves this Service to another controller"
                        ),
                    });
                }
            }
        }
    }
    Ok(report)
}

fn node_changes(
    node: &Node,
    meta: Result<crate::cloud::InstanceMetadata, ProviderError>,
    status: Result<InstanceStatus, ProviderError>,
    report: &mut MigrationReport,
) {
    let object = node_object(node);
    let change = |field: &str, from: &str, to: &str, disruptive: bool, note: &str| Change {
        object: object.clone(),
        field: field.to_string(),
        from: from.to_string(),
        to: to.to_string(),
        disruptive,
        note: note.to_string(),
    };
    let existing_id = node_util::provider_id(node);
    match status {
        Ok(InstanceStatus::NotFound) => report.changes.push(change(
            "node",
            "exists",
            "deleted",
            true,
            "the cloud says its instance is gone: the node lifecycle controller would delete this Node",
        )),
        Ok(InstanceStatus::Shutdown) => {
            if !node_util::has_taint(node, names::TAINT_SHUTDOWN) {
                report.changes.push(change(
                    &format!("taint {}", names::TAINT_SHUTDOWN),
                    "",
                    "NoSchedule",
                    false,
                    "the instance is shut down",
                ));
            }
        }
        Ok(InstanceStatus::Running) => {}
        Err(e) => report.problems.push(Problem {
            object: object.clone(),
            error: format!("instance status: {e}"),
        }),
    }
    let meta = match meta {
        Ok(m) => m,
        Err(e) => {
            let error = if existing_id.is_empty() {
                format!("ours cannot find the instance by the Node's name: {e}")
            } else {
                format!("ours cannot find the instance of providerID {existing_id:?}: {e}")
            };
            report.problems.push(Problem { object, error });
            return;
        }
    };
    let uninitialized = node_util::has_taint(node, names::TAINT_UNINITIALIZED);
    if existing_id.is_empty() {
        if !meta.provider_id.is_empty() {
            report.changes.push(change(
                "providerID",
                "",
                &meta.provider_id,
                false,
                "set once, as the node controller does",
            ));
        }
    } else if !meta.provider_id.is_empty() && meta.provider_id != existing_id {
        report.changes.push(change(
            "providerID",
            existing_id,
            &meta.provider_id,
            true,
            "ours names this instance differently; providerID is never rewritten, so tools and load balancers matching it may disagree",
        ));
    }
    let existing: BTreeMap<String, String> = node.metadata.labels.clone().unwrap_or_default();
    let wanted = if uninitialized {
        node_util::labels_with_metadata(&existing, &meta)
    } else {
        let mut l = existing.clone();
        l.extend(node_util::missing_ga_labels(&existing));
        l
    };
    for (k, v) in &wanted {
        if existing.get(k) != Some(v) {
            let from = existing.get(k).map(String::as_str).unwrap_or_default();
            report.changes.push(change(&format!("label {k}"), from, v, false, ""));
        }
    }
    if !uninitialized {
        // Labels are written at initialisation only: report values ours would compute
        // differently, so that new Nodes are not labelled unlike old ones by surprise.
        for (key, value) in [
            (names::LABEL_INSTANCE_TYPE, &meta.instance_type),
            (names::LABEL_ZONE, &meta.zone),
            (names::LABEL_REGION, &meta.region),
        ] {
            if let Some(old) = existing.get(key)
                && !value.is_empty()
                && old != value
            {
                report.changes.push(change(
                    &format!("label {key}"),
                    old,
                    old,
                    false,
                    &format!("kept on this Node; ours would label a new Node {value:?}"),
                ));
            }
        }
    }
    if uninitialized {
        report.changes.push(change(
            &format!("taint {}", names::TAINT_UNINITIALIZED),
            "NoSchedule",
            "",
            false,
            "removed once the Node is initialised",
        ));
    }
    let old = node_util::addresses(node);
    if let Some(new) = node_util::updated_addresses(node, &meta.node_addresses)
        && node_util::addresses_changed(old, &new)
    {
        let kept: BTreeSet<(&str, &str)> =
            new.iter().map(|a| (a.type_.as_str(), a.address.as_str())).collect();
        let lost: Vec<String> = old
            .iter()
            .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
            .filter(|a| !kept.contains(&(a.type_.as_str(), a.address.as_str())))
            .map(|a| format!("{}={}", a.type_, a.address))
            .collect();
        let note = if lost.is_empty() {
            String::new()
        } else {
            format!("address flap: {} would be removed", lost.join(","))
        };
        report.changes.push(change(
            "addresses",
            &format_addresses(old),
            &format_addresses(&new),
            !lost.is_empty(),
            &note,
        ));
    }
}

async fn service_changes(
    lb: &dyn LoadBalancer,
    cluster_name: &str,
    services: &[&Service],
    report: &mut MigrationReport,
) {
    let deadline = Deadline::new(CLOUD_DEADLINE);
    let cloud: Option<Vec<CloudLoadBalancer>> = match deadline
        .try_run("list load balancers", lb.list_cloud_load_balancers(cluster_name))
        .await
    {
        Ok(all) => Some(all),
        Err(ProviderError::NotImplemented) => None,
        Err(e) => {
            report.problems.push(Problem { object: "load balancers".into(), error: e.to_string() });
            return;
        }
    };
    for svc in services {
        let object = format!("service/{}", service_key(svc));
        if let Some(class) = load_balancer_class(svc) {
            report.changes.push(Change {
                object,
                field: "load balancer".into(),
                from: String::new(),
                to: String::new(),
                disruptive: false,
                note: format!("loadBalancerClass {class:?}: not ours, left alone"),
            });
            continue;
        }
        let ours = lb.load_balancer_name(cluster_name, svc);
        let ingress = status_ingress(svc);
        // What ours would find under its name, and what serves the Service's ingress now.
        let (ours_ingress, serving): (Option<Vec<String>>, Option<String>) = match &cloud {
            Some(all) => {
                let mine = all.iter().find(|l| l.name == ours).map(|l| l.ingress.clone());
                let serving = all
                    .iter()
                    .find(|l| l.ingress.iter().any(|i| ingress.contains(i)))
                    .map(|l| format!("{} {}", l.kind, l.name));
                (mine, serving)
            }
            None => {
                match deadline
                    .try_run("get load balancer", lb.get_load_balancer(cluster_name, svc))
                    .await
                {
                    Ok(status) => (
                        status.map(|s| {
                            s.ingress
                                .unwrap_or_default()
                                .into_iter()
                                .filter_map(|i| i.hostname.or(i.ip))
                                .collect()
                        }),
                        None,
                    ),
                    Err(e) => {
                        report.problems.push(Problem { object, error: e.to_string() });
                        continue;
                    }
                }
            }
        };
        let change = |from: String, to: String, disruptive: bool, note: String| Change {
            object: object.clone(),
            field: "load balancer".into(),
            from,
            to,
            disruptive,
            note,
        };
        let now = if ingress.is_empty() { "(no ingress)".to_string() } else { ingress.join(",") };
        let c = match (&ours_ingress, ingress.is_empty()) {
            (Some(mine), _) if !ingress.is_empty() && mine.iter().any(|i| ingress.contains(i)) => {
                continue; // Ours finds the load balancer that serves the Service: no change.
            }
            (None, true) => change(
                now,
                ours.clone(),
                false,
                format!("no load balancer yet: ours would create {ours}"),
            ),
            (Some(mine), true) => change(
                now,
                format!("{ours} ({})", mine.join(",")),
                false,
                format!("ours would adopt the existing {ours}"),
            ),
            (Some(mine), false) => change(
                now,
                format!("{ours} ({})", mine.join(",")),
                true,
                format!(
                    "ours would switch the Service to {ours}, which clients do not use now{}",
                    serving.map(|s| format!("; {s} would be left behind")).unwrap_or_default()
                ),
            ),
            (None, false) => match serving {
                Some(s) => change(
                    now,
                    ours.clone(),
                    true,
                    format!(
                        "renamed: {s} serves the Service now; ours would create {ours} with a new address and leave {s} behind"
                    ),
                ),
                None => change(
                    now,
                    ours.clone(),
                    true,
                    format!(
                        "re-created: no load balancer under ours' name {ours}; ours would create it with a new address"
                    ),
                ),
            },
        };
        report.changes.push(c);
    }
}

/// `orphans` (listing only): owned load balancers whose name no existing Service (of any
/// type) would use.
pub async fn find_orphans(
    provider: &str,
    cloud: &Arc<dyn CloudProvider>,
    client: &kube::Client,
    cluster_name: &str,
) -> Result<OrphanReport, OpsError> {
    let mut report = OrphanReport { provider: provider.to_string(), ..Default::default() };
    let Some(lb) = cloud.load_balancer() else {
        report.unsupported =
            Some(format!("the {provider} provider has no load balancers: nothing to check"));
        return Ok(report);
    };
    // Services first: a Service created after this list could own a load balancer listed
    // below, so the list is taken again right before any deletion.
    let claimed = claimed_names(lb.as_ref(), client, cluster_name).await?;
    let all = match Deadline::new(CLOUD_DEADLINE)
        .try_run("list load balancers", lb.list_cloud_load_balancers(cluster_name))
        .await
    {
        Ok(all) => all,
        Err(ProviderError::NotImplemented) => {
            report.unsupported = Some(format!(
                "the {provider} provider cannot list its load balancers yet: nothing checked"
            ));
            return Ok(report);
        }
        Err(source) => {
            return Err(OpsError::Cloud { what: "listing load balancers".into(), source });
        }
    };
    report.orphans = all.into_iter().filter(|l| l.owned && !claimed.contains(&l.name)).collect();
    Ok(report)
}

async fn claimed_names(
    lb: &dyn LoadBalancer,
    client: &kube::Client,
    cluster_name: &str,
) -> Result<BTreeSet<String>, OpsError> {
    let services: Vec<Service> = list(Api::all(client.clone()), "services").await?;
    Ok(services.iter().map(|s| lb.load_balancer_name(cluster_name, s)).collect())
}

/// Deletes the orphans of `report` that are still unclaimed (Services listed again first),
/// recording what was deleted and what failed.
pub async fn delete_orphans(
    cloud: &Arc<dyn CloudProvider>,
    client: &kube::Client,
    cluster_name: &str,
    report: &mut OrphanReport,
) -> Result<(), OpsError> {
    let Some(lb) = cloud.load_balancer() else { return Ok(()) };
    let claimed = claimed_names(lb.as_ref(), client, cluster_name).await?;
    let deadline = Deadline::new(CLOUD_DEADLINE);
    for orphan in &report.orphans {
        if claimed.contains(&orphan.name) || !orphan.owned {
            report.problems.push(Problem {
                object: orphan.name.clone(),
                error: "a Service now uses it: kept".into(),
            });
            continue;
        }
        match deadline
            .try_run("delete load balancer", lb.delete_cloud_load_balancer(cluster_name, orphan))
            .await
        {
            Ok(()) => report.deleted.push(orphan.name.clone()),
            Err(e) => {
                report.problems.push(Problem { object: orphan.name.clone(), error: e.to_string() })
            }
        }
    }
    Ok(())
}

fn write_migration_text(out: &mut dyn std::io::Write, r: &MigrationReport) -> std::io::Result<()> {
    writeln!(
        out,
        "migrate-check ({}): {} Nodes, {} LoadBalancer Services read; nothing was written.",
        r.provider, r.nodes, r.load_balancer_services
    )?;
    let mut last = "";
    for c in &r.changes {
        if c.object != last {
            writeln!(out, "{}:", c.object)?;
            last = &c.object;
        }
        let mark = if c.disruptive { "DISRUPTIVE " } else { "" };
        let from = if c.from.is_empty() { "(unset)" } else { &c.from };
        let to = if c.to.is_empty() { "(removed)" } else { &c.to };
        write!(out, "  {mark}{}: {from} -> {to}", c.field)?;
        if !c.note.is_empty() {
            write!(out, "  [{}]", c.note)?;
        }
        writeln!(out)?;
    }
    for p in &r.problems {
        writeln!(out, "NOT CHECKED {}: {}", p.object, p.error)?;
    }
    let verdict = match r.exit_code() {
        0 => "no change would disrupt traffic".to_string(),
        EXIT_DISRUPTIVE => format!("{} change(s) would disrupt traffic", r.disruptive()),
        _ => format!("{} object(s) could not be checked", r.problems.len()),
    };
    writeln!(out, "{} change(s); {verdict}.", r.changes.len())
}

fn write_orphans_text(
    out: &mut dyn std::io::Write,
    r: &OrphanReport,
    delete: bool,
) -> std::io::Result<()> {
    if let Some(why) = &r.unsupported {
        return writeln!(out, "{why}");
    }
    if r.orphans.is_empty() {
        return writeln!(out, "no orphaned load balancers ({}).", r.provider);
    }
    writeln!(
        out,
        "orphaned load balancers ({}: tagged as owned by this cluster, used by no Service):",
        r.provider
    )?;
    for lb in &r.orphans {
        let svc = lb.service.as_deref().map(|s| format!(" created for {s}")).unwrap_or_default();
        writeln!(out, "  {} {} [{}]{svc}", lb.kind, lb.name, lb.ingress.join(","))?;
        for res in &lb.resources {
            writeln!(out, "    {} {} {}", res.kind, res.id, res.name)?;
        }
    }
    if !delete {
        writeln!(out, "{} orphan(s). Run with --delete to remove them.", r.orphans.len())?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cloud::InstanceMetadata;
    use k8s_openapi::api::core::v1::{NodeSpec, NodeStatus, Taint};
    use kube::api::ObjectMeta;

    fn addr(t: &str, a: &str) -> NodeAddress {
        NodeAddress { type_: t.into(), address: a.into() }
    }

    fn node(provider_id: Option<&str>, uninit: bool, addrs: Vec<NodeAddress>) -> Node {
        Node {
            metadata: ObjectMeta { name: Some("n1".into()), ..Default::default() },
            spec: Some(NodeSpec {
                provider_id: provider_id.map(str::to_string),
                taints: uninit.then(|| {
                    vec![Taint {
                        key: names::TAINT_UNINITIALIZED.into(),
                        effect: "NoSchedule".into(),
                        ..Default::default()
                    }]
                }),
                ..Default::default()
            }),
            status: Some(NodeStatus { addresses: Some(addrs), ..Default::default() }),
        }
    }

    fn meta(id: &str, ip: &str) -> InstanceMetadata {
        InstanceMetadata {
            provider_id: id.into(),
            instance_type: "m5.large".into(),
            node_addresses: vec![addr("InternalIP", ip)],
            zone: "z1".into(),
            region: "r1".into(),
            additional_labels: BTreeMap::new(),
        }
    }

    #[test]
    fn a_new_node_gets_provider_id_labels_and_loses_the_taint_without_disruption() {
        let mut r = MigrationReport::default();
        let n = node(None, true, vec![addr("InternalIP", "10.0.0.1")]);
        node_changes(&n, Ok(meta("p://i-1", "10.0.0.1")), Ok(InstanceStatus::Running), &mut r);
        let fields: Vec<&str> = r.changes.iter().map(|c| c.field.as_str()).collect();
        assert!(fields.contains(&"providerID"), "{fields:?}");
        assert!(fields.contains(&"label topology.kubernetes.io/zone"), "{fields:?}");
        assert!(fields.iter().any(|f| f.starts_with("taint ")), "{fields:?}");
        assert_eq!(r.exit_code(), 0, "{r:?}");
    }

    #[test]
    fn a_provider_id_change_a_lost_address_and_a_gone_instance_are_disruptive() {
        let mut r = MigrationReport::default();
        let n = node(Some("p://old"), false, vec![addr("InternalIP", "10.0.0.1")]);
        node_changes(&n, Ok(meta("p://new", "10.0.0.2")), Ok(InstanceStatus::NotFound), &mut r);
        let disruptive: Vec<&str> =
            r.changes.iter().filter(|c| c.disruptive).map(|c| c.field.as_str()).collect();
        assert_eq!(disruptive, vec!["node", "providerID", "addresses"], "{r:?}");
        assert_eq!(r.exit_code(), EXIT_DISRUPTIVE);
    }

    #[test]
    fn an_unknown_instance_is_reported_as_not_checked() {
        let mut r = MigrationReport::default();
        let n = node(None, true, vec![]);
        node_changes(
            &n,
            Err(ProviderError::InstanceNotFound),
            Err(ProviderError::other("x")),
            &mut r,
        );
        assert!(r.changes.is_empty());
        assert_eq!(r.problems.len(), 2);
        assert_eq!(r.exit_code(), EXIT_INCOMPLETE);
    }

    #[test]
    fn tools_are_recognised_only_as_the_first_argument() {
        let args = |v: &[&str]| v.iter().map(OsString::from).collect::<Vec<_>>();
        assert!(is_tool_invocation(&args(&["ccm", "orphans", "--yes"])));
        assert!(is_tool_invocation(&args(&["ccm", "migrate-check"])));
        assert!(!is_tool_invocation(&args(&["ccm", "--v=2", "orphans"])));
        assert!(!is_tool_invocation(&args(&["ccm"])));
    }
}
