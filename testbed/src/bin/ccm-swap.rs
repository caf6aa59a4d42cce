//! `ccm-swap [CLOUD...] [--page PATH]`: swap day (issue #30), behind `ci/swap`.
//!
//! For each cloud (all six when none is named), upstream's deployment artifacts at their pinned
//! versions run our binaries against the cloud's emulator on a real kube-apiserver
//! (`ccm_testbed::swap`): one run per rendering (upstream's defaults, the values operators
//! commonly set, the plain manifests). Prints a table row per run as it ends; with `--page`,
//! rewrites that Markdown page's table and details for the clouds run, keeping the other
//! clouds' last results (kept as JSON comments in the page). Exits non-zero when a run failed.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context as _;
use ccm_testbed::swap::{self, Outcome, clouds};
use clap::Parser;

#[derive(Parser)]
#[command(
    name = "ccm-swap",
    about = "Upstream's deployment artifacts run our binaries (issue #30)"
)]
struct Args {
    /// The clouds to run (default: all six).
    clouds: Vec<String>,
    /// The Markdown page to update (e.g. docs/compatibility/swap.md).
    #[arg(long)]
    page: Option<PathBuf>,
}

const DATA: &str = "<!-- swap-data ";

fn main() -> std::process::ExitCode {
    match run() {
        Ok(true) => std::process::ExitCode::SUCCESS,
        Ok(false) => std::process::ExitCode::FAILURE,
        Err(e) => {
            eprintln!("ccm-swap: {e:#}");
            std::process::ExitCode::from(2)
        }
    }
}

fn run() -> anyhow::Result<bool> {
    let args = Args::parse();
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn,kube_client=off")),
        )
        .init();
    let chosen: Vec<String> = if args.clouds.is_empty() {
        clouds::CLOUDS.iter().map(|c| c.to_string()).collect()
    } else {
        args.clouds.clone()
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let total = Instant::now();
    let mut outcomes: Vec<Outcome> = Vec::new();
    let mut timings = Vec::new();
    println!("{}", swap::TABLE_HEADER);
    for cloud in &chosen {
        let start = Instant::now();
        let cases = swap::clouds::cases(cloud)
            .with_context(|| format!("upstream's artifacts for {cloud}"))?;
        for (i, case) in cases.into_iter().enumerate() {
            for c in &case.changes {
                eprintln!("ccm-swap: {cloud}: change to upstream's artifact: {c}");
            }
            let dir = swap::run_dir(cloud, i);
            let outcome = rt.block_on(async {
                match clouds::world(&case, &dir.join("world")).await {
                    Ok(world) => swap::run(case, world, &dir).await,
                    Err(e) => Outcome {
                        cloud: case.cloud.clone(),
                        artifact: case.artifact.clone(),
                        changes: case.changes.clone(),
                        error: Some(format!("starting the cloud's emulator: {e}")),
                        logs: dir.display().to_string(),
                        ..Default::default()
                    },
                }
            });
            for m in &outcome.mappings {
                eprintln!("ccm-swap: {cloud}: mapped: {m}");
            }
            println!("{}", swap::table_row(&outcome));
            if !outcome.passed() {
                eprintln!("{}", swap::details(&outcome));
                eprintln!("ccm-swap: logs in {}", outcome.logs);
            }
            outcomes.push(outcome);
        }
        timings.push((cloud.clone(), start.elapsed().as_secs()));
    }
    let seconds = total.elapsed().as_secs();
    for (cloud, s) in &timings {
        println!("ccm-swap: {cloud}: {s} s");
    }
    println!("ccm-swap: total {seconds} s");
    if let Some(page) = &args.page {
        write_page(page, &outcomes, &timings)?;
        println!("ccm-swap: wrote {}", page.display());
    }
    Ok(outcomes.iter().all(Outcome::passed))
}

/// The kept results of clouds not run now, from the page's data comments.
fn previous(page: &Path) -> Vec<(Outcome, u64)> {
    let text = std::fs::read_to_string(page).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.strip_prefix(DATA)?.strip_suffix(" -->"))
        .filter_map(|j| serde_json::from_str::<(Outcome, u64)>(j).ok())
        .collect()
}

fn write_page(page: &Path, now: &[Outcome], timings: &[(String, u64)]) -> anyhow::Result<()> {
    let run_now: Vec<&str> = timings.iter().map(|(c, _)| c.as_str()).collect();
    let mut all: Vec<(Outcome, u64)> =
        previous(page).into_iter().filter(|(o, _)| !run_now.contains(&o.cloud.as_str())).collect();
    for o in now {
        let t = timings.iter().find(|(c, _)| *c == o.cloud).map(|(_, t)| *t).unwrap_or(0);
        all.push((o.clone(), t));
    }
    let order = |c: &str| clouds::CLOUDS.iter().position(|x| *x == c).unwrap_or(usize::MAX);
    all.sort_by_key(|(o, _)| order(&o.cloud));
    let mut s = String::from(
        "# Swap day: upstream's deployment artifacts run our binaries\n\n\
         <!-- Generated by `ci/swap` (testbed/src/bin/ccm-swap.rs, testbed/src/swap/): do not edit. -->\n\n\
         Each upstream cloud-controller-manager's official deployment artifact at a pinned version \
         (from the Go module proxy, cached under `~/.cache/ccm-rs/swap/`, never copied into this \
         repository; GCP and IBM, whose modules the proxy does not serve, from fixtures written from \
         the documented facts in `testbed/fixtures/swap/`) is rendered (`helm template` with upstream's \
         default values, then with the values operators commonly set; or the manifests as they are). \
         Upstream's RBAC objects are applied to a real kube-apiserver, a token is minted for upstream's \
         ServiceAccount (TokenRequest), and our binary runs with exactly the container's command, args \
         and env against the cloud's emulator. Only what a pod gets from its node is mapped: mounted \
         files (the cloud config, pointing at the emulator), the in-cluster connection \
         (`--kubeconfig` with the token), the node's metadata service and CA bundle, a host port \
         another process holds. Every mapping and every change to upstream's artifact is listed \
         below.\n\n\
         Pass: the binaries start and keep running; **Forbidden**: requests of upstream's \
         ServiceAccounts the apiserver refused with 403, counted in its audit log (RBAC denials \
         included; `apiserver_request_total` does not count them); **Nodes**: initialised \
         (uninitialized taint removed, providerID, addresses); **LB**: the LoadBalancer Service's \
         address; **Events**: `kubectl get events -A --field-selector source=<upstream component>`; \
         **Lease**: renewals of the leader-election Lease seen (3 needed).\n\n\
         Run `ci/swap` (all clouds) or `ci/swap <cloud>...`; it is a separate command, not part of \
         `ci/test` (see the timings).\n\n## Results\n\n",
    );
    s.push_str(swap::TABLE_HEADER);
    s.push('\n');
    for (o, _) in &all {
        s.push_str(&swap::table_row(o));
        s.push('\n');
    }
    s.push_str("\n## Timings\n\n| cloud | seconds (all its runs, incl. emulator and control-plane start) |\n|---|---|\n");
    let mut seen = Vec::new();
    let mut total = 0;
    for (o, t) in &all {
        if !seen.contains(&o.cloud) {
            seen.push(o.cloud.clone());
            total += t;
            s.push_str(&format!("| {} | {t} |\n", o.cloud));
        }
    }
    s.push_str(&format!("| total | {total} |\n\n## Details\n\n"));
    for (o, _) in &all {
        s.push_str(&swap::details(o));
    }
    for (o, t) in &all {
        let json = serde_json::to_string(&(o, t)).context("serialising a result")?;
        s.push_str(&format!("{DATA}{} -->\n", json.replace("-->", "--\\u003e")));
    }
    if let Some(dir) = page.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    std::fs::write(page, s).with_context(|| format!("writing {}", page.display()))
}
