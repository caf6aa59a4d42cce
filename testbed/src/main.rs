//! `ccm-testbed`: the README's main job. Starts the local testbed and keeps it up until
//! Ctrl-C (or SIGTERM), printing how to reach it.
//!
//! Without arguments the testbed is a real etcd + kube-apiserver on loopback. With a provider
//! (`ccm-testbed vsphere`, `ccm-testbed aws`) it also runs that cloud's emulator and our
//! cloud-controller-manager against it, registers Nodes as kubelets would and prints them once
//! initialised (for AWS also a LoadBalancer Service and its load-balancer hostname).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;
use ccm_testbed::{ControlPlane, tools::Tools};
use clap::Parser;

/// Run the local testbed (control plane on loopback) until interrupted.
#[derive(Debug, Parser)]
#[command(name = "ccm-testbed", version)]
struct Args {
    /// Also run this cloud's emulator and cloud-controller-manager (`vsphere`: vcsim; `aws`:
    /// moto).
    provider: Option<Provider>,
    /// Where to write the admin kubeconfig.
    #[arg(long, env = "CCM_TESTBED_KUBECONFIG", default_value_os_t = default_kubeconfig())]
    kubeconfig: PathBuf,
    /// The cloud-controller-manager binary for the provider (`ci/demo <provider>` builds it).
    #[arg(long, env = "CCM_TESTBED_CCM")]
    ccm: Option<PathBuf>,
}

/// Providers the testbed can emulate.
#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum Provider {
    /// govmomi's vCenter simulator (`ccm-vcsim`) and `cloud-controller-manager-vsphere`.
    Vsphere,
    /// moto (EC2, ELB, ELBv2) and `cloud-controller-manager-aws` (needs the `aws` feature).
    Aws,
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
    // Held until Ctrl-C: dropping them stops the manager and the simulator.
    let cloud: Option<Box<dyn std::any::Any>> = match args.provider {
        None => None,
        Some(Provider::Vsphere) => {
            let ccm = args.ccm.as_deref().context(
                "`ccm-testbed vsphere` needs --ccm <cloud-controller-manager-vsphere> (ci/demo vsphere builds it)",
            )?;
            let dir = args.kubeconfig.parent().unwrap_or(Path::new(".")).join("vsphere");
            Some(Box::new(vsphere(&cp, ccm, &dir).await?))
        }
        Some(Provider::Aws) => {
            let ccm = args.ccm.as_deref().context(
                "`ccm-testbed aws` needs --ccm <cloud-controller-manager-aws> (ci/demo aws builds it)",
            )?;
            let dir = args.kubeconfig.parent().unwrap_or(Path::new(".")).join("aws");
            Some(aws_demo(&cp, ccm, &dir).await?)
        }
    };
    println!("press Ctrl-C to stop");

    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::select! {
        r = tokio::signal::ctrl_c() => r.context("waiting for Ctrl-C")?,
        _ = term.recv() => {}
    }
    println!("stopping");
    drop(cloud);
    cp.stop();
    let _ = std::fs::remove_file(&args.kubeconfig);
    Ok(())
}

/// What keeps the vSphere demo running: the simulator and the manager process.
struct VsphereDemo {
    _vcsim: ccm_testbed::vcsim::Vcsim,
    _ccm: tokio::process::Child,
}

/// vcsim with two VMs (guest host names and IPs, zone/region tags on a host, a cluster and
/// the datacenter), `cloud-controller-manager-vsphere` against it, and the two kubelet-style
/// Nodes; prints the Nodes once initialised.
async fn vsphere(cp: &ControlPlane, ccm: &Path, dir: &Path) -> anyhow::Result<VsphereDemo> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    // The simulator fixture panics on failure (it is a test fixture); run it off the runtime.
    let vcsim = tokio::task::spawn_blocking(|| {
        let sim = ccm_testbed::vcsim::Vcsim::start();
        sim.guest("DC0_H0_VM0", "node-a", &[("VM Network", &["10.0.0.10"])]);
        sim.guest("DC0_C0_RP0_VM0", "node-b", &[("VM Network", &["10.0.1.10"])]);
        sim.tag("k8s-region", "region-1", "DC0");
        sim.tag("k8s-zone", "zone-standalone", "DC0_H0");
        sim.tag("k8s-zone", "zone-cluster", "DC0_C0");
        sim
    })
    .await
    .context("starting vcsim (ci/install-tools builds ccm-vcsim)")?;
    let config = dir.join("vsphere.yaml");
    std::fs::write(
        &config,
        format!(
            "global:\n  user: administrator@vsphere.local\n  password: pass\n  insecureFlag: true\n\
             vcenter:\n{}labels:\n  zone: k8s-zone\n  region: k8s-region\n",
            vcsim.vcenter_yaml("vcsim")
        ),
    )
    .with_context(|| format!("writing {}", config.display()))?;
    let log = dir.join("cloud-controller-manager.log");
    let child = spawn_ccm(cp, ccm, "vsphere", &config, dir, &log, &[])?;
    println!(
        "vcsim:      https://127.0.0.1:{}/sdk (cloud config {})",
        vcsim.port,
        config.display()
    );
    println!("ccm log:    {}", log.display());

    let nodes = [("node-a", "10.0.0.10"), ("node-b", "10.0.1.10")];
    register_and_print_nodes(cp, &nodes, &log).await?;
    Ok(VsphereDemo { _vcsim: vcsim, _ccm: child })
}

/// Polls `f` every 200 ms until it returns `Some`; gives up after 2 minutes pointing at the
/// manager's log.
async fn poll<T, F, Fut>(what: &str, log: &Path, mut f: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<Option<T>>>,
{
    let started = tokio::time::Instant::now();
    loop {
        if let Some(v) = f().await? {
            return Ok(v);
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(120),
            "gave up waiting for {what} after 2 minutes; see {}",
            log.display()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Registers kubelet-style Nodes `(name, InternalIP)`, waits until the manager initialised
/// them and prints providerID, topology labels and addresses of each.
async fn register_and_print_nodes(
    cp: &ControlPlane,
    to_register: &[(&str, &str)],
    log: &Path,
) -> anyhow::Result<()> {
    use ccm_core::names;
    use k8s_openapi::api::core::v1::Node;
    use kube::api::PostParams;

    let client = cp.admin_client().await.context("admin client")?;
    let nodes: kube::Api<Node> = kube::Api::all(client);
    for (name, ip) in to_register {
        let node = ccm_testbed::fixtures::kubelet_node(name, ip, "True");
        nodes
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("registering node {name}"))?;
    }
    for (name, _) in to_register {
        let node = poll(&format!("node {name} to be initialised"), log, || async {
            let node = nodes.get(name).await.with_context(|| format!("reading node {name}"))?;
            let tainted = node
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|t| t.key == names::TAINT_UNINITIALIZED));
            Ok((!tainted).then_some(node))
        })
        .await?;
        let labels = node.metadata.labels.unwrap_or_default();
        let label = |k: &str| labels.get(k).map(String::as_str).unwrap_or("-").to_string();
        let addresses: Vec<String> = node
            .status
            .and_then(|s| s.addresses)
            .unwrap_or_default()
            .into_iter()
            .map(|a| format!("{}={}", a.type_, a.address))
            .collect();
        println!(
            "node {name}: providerID={} zone={} region={} instance-type={} addresses={}",
            node.spec.and_then(|s| s.provider_id).unwrap_or_default(),
            label(names::LABEL_ZONE),
            label(names::LABEL_REGION),
            label(names::LABEL_INSTANCE_TYPE),
            addresses.join(",")
        );
    }
    Ok(())
}

/// Starts a cloud-controller-manager binary with the admin kubeconfig, all controllers and
/// no serving; its stderr goes to `log`.
fn spawn_ccm(
    cp: &ControlPlane,
    ccm: &Path,
    provider: &str,
    config: &Path,
    dir: &Path,
    log: &Path,
    envs: &[(&str, &str)],
) -> anyhow::Result<tokio::process::Child> {
    let kubeconfig = dir.join("ccm.kubeconfig");
    cp.write_kubeconfig(&kubeconfig, &ccm_testbed::Identity::admin())
        .context("writing the manager's kubeconfig")?;
    tokio::process::Command::new(ccm)
        .arg(format!("--cloud-provider={provider}"))
        .arg(format!("--cloud-config={}", config.display()))
        .arg(format!("--kubeconfig={}", kubeconfig.display()))
        .args(["--leader-elect=false", "--secure-port=0", "--webhook-secure-port=0"])
        .args(["--controllers=*", "--node-monitor-period=5s"])
        // No pod-CIDR routes in the demo (no --cluster-cidr), as in upstream's manifests.
        .arg("--configure-cloud-routes=false")
        .envs(envs.iter().copied())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting {}", ccm.display()))
}

#[cfg(not(feature = "aws"))]
async fn aws_demo(
    _cp: &ControlPlane,
    _ccm: &Path,
    _dir: &Path,
) -> anyhow::Result<Box<dyn std::any::Any>> {
    anyhow::bail!("this ccm-testbed was built without the `aws` feature: run `ci/demo aws`")
}

/// moto with a tagged VPC, a node security group and three EC2 instances in two zones,
/// `cloud-controller-manager-aws` against it, the three Nodes registered by private DNS name
/// (as kubelets on AWS name themselves), and a LoadBalancer Service; prints the initialised
/// Nodes and the Service's load-balancer hostname.
#[cfg(feature = "aws")]
async fn aws_demo(
    cp: &ControlPlane,
    ccm: &Path,
    dir: &Path,
) -> anyhow::Result<Box<dyn std::any::Any>> {
    use ccm_provider_aws::testing;
    use k8s_openapi::api::core::v1::Service;
    use kube::api::PostParams;

    const CLUSTER: &str = "demo";
    let err = |what: &'static str| move |e: testing::Error| anyhow::anyhow!("{what}: {e}");
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let moto = ccm_testbed::moto::Moto::start()
        .await
        .context("starting moto (ci/install-tools installs it)")?;
    let ec2 = testing::ec2(&moto.url).await;
    let (_net, instances) =
        testing::demo_world(&ec2, CLUSTER).await.map_err(err("the AWS world"))?;
    let config = dir.join("aws.conf");
    std::fs::write(&config, testing::cloud_config(&moto.url, CLUSTER, ""))
        .with_context(|| format!("writing {}", config.display()))?;
    let log = dir.join("cloud-controller-manager.log");
    let child = spawn_ccm(
        cp,
        ccm,
        "aws",
        &config,
        dir,
        &log,
        &[
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_EC2_METADATA_DISABLED", "true"),
        ],
    )?;
    println!("moto:       {} (cloud config {})", moto.url, config.display());
    println!("ccm log:    {}", log.display());

    let names: Vec<(String, String)> = instances
        .iter()
        .filter_map(|i| {
            Some((i.private_dns_name()?.to_string(), i.private_ip_address()?.to_string()))
        })
        .collect();
    let refs: Vec<(&str, &str)> = names.iter().map(|(n, i)| (n.as_str(), i.as_str())).collect();
    register_and_print_nodes(cp, &refs, &log).await?;

    let client = cp.admin_client().await.context("admin client")?;
    let services: kube::Api<Service> = kube::Api::namespaced(client, "default");
    let svc = ccm_testbed::fixtures::load_balancer_service("default", "web", 80);
    services.create(&PostParams::default(), &svc).await.context("creating Service default/web")?;
    let hostname = poll("a load balancer for Service default/web", &log, || async {
        let s = services.get("web").await.context("reading Service default/web")?;
        Ok(s.status
            .and_then(|s| s.load_balancer)
            .and_then(|lb| lb.ingress)
            .and_then(|i| i.into_iter().next())
            .and_then(|i| i.hostname))
    })
    .await?;
    println!("service default/web: type=LoadBalancer hostname={hostname}");
    Ok(Box::new((moto, child)))
}
