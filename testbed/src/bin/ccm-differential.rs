//! `ccm-differential CLOUD... [--pages DIR]`: upstream's CCM as the oracle (issue #31), behind
//! `ci/differential`.
//!
//! For each cloud, upstream's binary and ours run the same scenario on fresh control planes
//! and emulators from the same world (`ccm_testbed::differential`); prints a row per scenario
//! step (identical / documented-difference / unexplained), every unexplained difference, and
//! the run times. With `--pages`, writes `DIR/<cloud>.md`. Exits 1 when any difference is
//! unexplained or a side could not run every step.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context as _;
use ccm_testbed::differential::{self, compare};
use clap::Parser;

#[derive(Parser)]
#[command(name = "ccm-differential", about = "Upstream's CCM as the oracle (issue #31)")]
struct Args {
    /// The clouds (aws, openstack, vsphere, azure).
    #[arg(required = true)]
    clouds: Vec<String>,
    /// Write `<DIR>/<cloud>.md` (e.g. docs/compatibility).
    #[arg(long)]
    pages: Option<PathBuf>,
    /// Write each report's snapshots and rows as JSON under this directory.
    #[arg(long)]
    json: Option<PathBuf>,
}

fn main() -> std::process::ExitCode {
    ccm_testbed::swap::cli_exit("ccm-differential", run())
}

fn run() -> anyhow::Result<bool> {
    let args = Args::parse();
    let rt = ccm_testbed::swap::cli_runtime().context("starting the runtime")?;
    let mut ok = true;
    for cloud in &args.clouds {
        let start = Instant::now();
        let dir = differential::run_dir(cloud);
        let upstream = differential::upstream(cloud, &dir.join("upstream-stand-ins"))?;
        println!(
            "ccm-differential: {cloud}: upstream {} ({})",
            differential::upstream_version(cloud),
            upstream.manager.display()
        );
        let report = rt
            .block_on(differential::run(cloud, upstream, &dir))
            .with_context(|| format!("the {cloud} differential"))?;
        println!("\n### {cloud}\n");
        print!("{}", compare::table(&report.rows));
        for side in [&report.upstream_side, &report.ours_side] {
            println!(
                "ccm-differential: {cloud}: {} side: {} s, logs {}{}",
                side.label,
                side.seconds,
                side.logs,
                side.error.as_ref().map(|e| format!("; FAILED: {e}")).unwrap_or_default()
            );
        }
        for line in compare::unexplained_lines(&report.rows) {
            println!("ccm-differential: {cloud}: unexplained: {line}");
        }
        for i in compare::unused(&report.rows, &report.known) {
            let d = &report.known.differences[i];
            println!(
                "ccm-differential: {cloud}: note: documented difference D{} ({} {}) did not show this run",
                i + 1,
                d.step,
                d.path
            );
        }
        if let Some(dir) = &args.json {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            let path = dir.join(format!("{cloud}.json"));
            let v = serde_json::json!({
                "upstream": report.upstream_side,
                "ours": report.ours_side,
                "rows": report.rows,
            });
            std::fs::write(&path, serde_json::to_string_pretty(&v)?)
                .with_context(|| format!("writing {}", path.display()))?;
            println!("ccm-differential: {cloud}: snapshots in {}", path.display());
        }
        if let Some(dir) = &args.pages {
            let path = dir.join(format!("{cloud}.md"));
            std::fs::write(&path, compare::page(&differential::page_facts(&report), &report.known))
                .with_context(|| format!("writing {}", path.display()))?;
            println!("ccm-differential: {cloud}: wrote {}", path.display());
        }
        let passed = report.passed();
        println!(
            "ccm-differential: {cloud}: {} in {} s",
            if passed { "pass" } else { "FAIL" },
            start.elapsed().as_secs()
        );
        ok &= passed;
    }
    Ok(ok)
}
