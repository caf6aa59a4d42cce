//! `ccm-testbed`: the README's main job. Starts the local testbed and keeps it up until
//! Ctrl-C (or SIGTERM), printing how to reach it.
//!
//! Today the testbed is a real etcd + kube-apiserver on loopback; the provider issues grow it
//! into control plane + emulated cloud + our cloud-controller-manager.

use std::path::PathBuf;

use anyhow::Context as _;
use ccm_testbed::{ControlPlane, tools::Tools};
use clap::Parser;

/// Run the local testbed (control plane on loopback) until interrupted.
#[derive(Debug, Parser)]
#[command(name = "ccm-testbed", version)]
struct Args {
    /// Where to write the admin kubeconfig.
    #[arg(long, env = "CCM_TESTBED_KUBECONFIG", default_value_os_t = default_kubeconfig())]
    kubeconfig: PathBuf,
}

fn default_kubeconfig() -> PathBuf {
    let home = std::env::var_os("HOME").map(PathBuf::from).unwrap_or_else(std::env::temp_dir);
    home.join(".cache/ccm-rs/testbed/kubeconfig")
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();

    let tools = Tools::locate().context("locating the Kubernetes tools")?;
    let kubectl = tools.kubectl.clone();
    let started = tokio::time::Instant::now();
    let cp = ControlPlane::start_with(tools).await.context("starting the control plane")?;
    if let Some(parent) = args.kubeconfig.parent() {
        std::fs::create_dir_all(parent)
            .with_context(|| format!("creating {}", parent.display()))?;
    }
    cp.write_kubeconfig(&args.kubeconfig, &ccm_testbed::Identity::admin())
        .context("writing the kubeconfig")?;

    println!("control plane ready in {:.1} s at {}", started.elapsed().as_secs_f64(), cp.server());
    println!("kubeconfig: {}", args.kubeconfig.display());
    println!("server logs: {}", cp.log_dir().display());
    println!(
        "try:        {} --kubeconfig {} get --raw /version",
        kubectl.display(),
        args.kubeconfig.display()
    );
    println!("press Ctrl-C to stop");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
        _ = term.recv() => {}
    }
    println!("stopping");
    cp.stop();
    let _ = std::fs::remove_file(&args.kubeconfig);
    Ok(())
}
