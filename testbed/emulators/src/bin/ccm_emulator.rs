//! `ccm-emulator`: the kit's fault proxy (and later the clouds' emulators) as a standalone
//! process, for `ci/demo` and manual runs.
//!
//! ```text
//! ccm-emulator proxy --upstream http://127.0.0.1:5000 --protocol aws-query --listen 127.0.0.1:0
//! ccm-emulator world path/to/world.yaml
//! ccm-emulator ibm --world path/to/world.yaml [--lb-pending-ms 2000] [--token-lifetime-secs 3600]
//! ccm-emulator openstack --world path/to/world.yaml [--lb-pending-ms 2000] [--token-lifetime-secs 3600]
//! ccm-emulator azure --world path/to/world.yaml [--lro-ms 500] [--page-size 50]
//! ccm-emulator gcp --world path/to/world.yaml [--project p] [--pending-ms 300]
//! ccm-emulator aws-imds [--instance-id i-0123456789abcdef0 --region us-east-1 ...]
//! ```
//!
//! `ibm`, `openstack`, `azure` and `gcp` also take `--timing fast|realistic` and
//! `--time-scale <factor>`: the timing profile of their long-running operations (default: the
//! world file's `timing:` key, else `fast` at scale 1).
//!
//! `ibm` serves the IBM Cloud emulator (IAM, Resource Manager, VPC `/v1` on one URL) and prints
//! its URL as the first line of stdout.
//!
//! `proxy` prints its URL as the first line of stdout (then, when serving HTTPS, the path of
//! its CA file on the second) and runs until SIGINT/SIGTERM or until its stdin closes when
//! started with `--exit-on-stdin-close`.

use std::net::SocketAddr;
use std::path::PathBuf;

use anyhow::Context as _;
use ccm_emulators::asyncop::{TimingProfile, TimingSelection};
use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
use ccm_emulators::world::World;
use clap::{Parser, Subcommand};
use tokio::io::AsyncReadExt as _;

#[derive(Parser)]
#[command(
    name = "ccm-emulator",
    about = "Cloud emulators and the fault proxy for tests and the demo"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

/// The timing profile of an emulator's long-running operations.
#[derive(clap::Args, Clone, Copy)]
struct TimingArgs {
    /// The timing profile: fast (test values) or realistic (the cloud's real durations).
    /// Default: the world file's `timing:`, else fast.
    #[arg(long, value_parser = parse_profile)]
    timing: Option<TimingProfile>,
    /// Multiplies every operation time (e.g. 0.1 with realistic). Default: the world file's,
    /// else 1.
    #[arg(long)]
    time_scale: Option<f64>,
}

fn parse_profile(s: &str) -> Result<TimingProfile, String> {
    s.parse()
}

impl TimingArgs {
    /// The selection: the flags over the world file's over fast at scale 1.
    fn selection(&self, world: &World) -> anyhow::Result<TimingSelection> {
        let base = world.timing.unwrap_or_default();
        let sel = TimingSelection {
            profile: self.timing.unwrap_or(base.profile),
            scale: self.time_scale.unwrap_or(base.scale),
        };
        sel.validate().map_err(|e| anyhow::anyhow!("--time-scale: {e}"))?;
        Ok(sel)
    }
}

#[derive(Subcommand)]
enum Cmd {
    /// A fault proxy in front of moto or vcsim.
    Proxy {
        /// The upstream's base URL, e.g. http://127.0.0.1:5000 or https://127.0.0.1:8989.
        #[arg(long)]
        upstream: Url,
        /// How to name calls and shape error bodies.
        #[arg(long, value_enum)]
        protocol: Protocol,
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// Serve HTTPS (default: the upstream's scheme).
        #[arg(long)]
        tls: Option<bool>,
        /// PEM CA to verify an https upstream with (default: accept its certificate).
        #[arg(long)]
        upstream_ca: Option<PathBuf>,
        /// Exit when stdin reaches end of file (so a parent's death stops the proxy).
        #[arg(long)]
        exit_on_stdin_close: bool,
    },
    /// The IBM Cloud emulator (IAM, Resource Manager and VPC on one URL).
    Ibm {
        /// The world file (YAML or JSON); default: an empty world.
        #[arg(long)]
        world: Option<PathBuf>,
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// API keys IAM accepts (repeatable; default: the emulator's default key).
        #[arg(long = "api-key")]
        api_keys: Vec<String>,
        /// The account ID.
        #[arg(long)]
        account_id: Option<String>,
        /// How long load balancers stay pending after a change, in milliseconds.
        #[arg(long, default_value_t = 2000)]
        lb_pending_ms: u64,
        /// How long issued access tokens live, in seconds.
        #[arg(long, default_value_t = 3600)]
        token_lifetime_secs: u64,
        #[command(flatten)]
        timing: TimingArgs,
        /// Exit when stdin reaches end of file (so a parent's death stops the emulator).
        #[arg(long)]
        exit_on_stdin_close: bool,
    },
    /// The OpenStack emulator (Keystone v3, Nova, Neutron and Octavia on one URL).
    Openstack {
        /// The world file (YAML or JSON); default: an empty world.
        #[arg(long)]
        world: Option<PathBuf>,
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// How long load balancers stay PENDING_* after a change, in milliseconds.
        #[arg(long, default_value_t = 2000)]
        lb_pending_ms: u64,
        /// How long issued tokens live, in seconds.
        #[arg(long, default_value_t = 3600)]
        token_lifetime_secs: u64,
        #[command(flatten)]
        timing: TimingArgs,
        /// Exit when stdin reaches end of file (so a parent's death stops the emulator).
        #[arg(long)]
        exit_on_stdin_close: bool,
    },
    /// The Azure emulator (ARM, AAD and IMDS on one HTTPS URL; prints the URL, then the CA
    /// file).
    Azure {
        /// The world file (YAML or JSON); default: an empty world.
        #[arg(long)]
        world: Option<PathBuf>,
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// How long long-running operations stay `InProgress`, in milliseconds.
        #[arg(long, default_value_t = 500)]
        lro_ms: u64,
        /// How many items a list page holds.
        #[arg(long, default_value_t = 50)]
        page_size: usize,
        #[command(flatten)]
        timing: TimingArgs,
        /// Exit when stdin reaches end of file (so a parent's death stops the emulator).
        #[arg(long)]
        exit_on_stdin_close: bool,
    },
    /// The GCP emulator (Compute v1 subset and the metadata server on one URL).
    Gcp {
        /// The world file (YAML or JSON); default: an empty world.
        #[arg(long)]
        world: Option<PathBuf>,
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// The project id.
        #[arg(long)]
        project: Option<String>,
        /// How long operations stay PENDING/RUNNING, in milliseconds.
        #[arg(long, default_value_t = 300)]
        pending_ms: u64,
        /// The instance the metadata server speaks for (default: the world's first).
        #[arg(long)]
        metadata_instance: Option<String>,
        /// Instance attributes of the metadata server (`key=value`, repeatable).
        #[arg(long = "attribute")]
        attributes: Vec<String>,
        #[command(flatten)]
        timing: TimingArgs,
        /// Exit when stdin reaches end of file (so a parent's death stops the emulator).
        #[arg(long)]
        exit_on_stdin_close: bool,
    },
    /// The EC2 instance metadata service (IMDSv2) of one instance.
    AwsImds {
        /// Where to listen.
        #[arg(long, default_value = "127.0.0.1:0")]
        listen: SocketAddr,
        /// `instance-id`.
        #[arg(long, default_value = "i-0123456789abcdef0")]
        instance_id: String,
        /// `placement/region`.
        #[arg(long, default_value = "us-east-1")]
        region: String,
        /// `placement/availability-zone`.
        #[arg(long, default_value = "us-east-1a")]
        availability_zone: String,
        /// `instance-type`.
        #[arg(long, default_value = "m5.large")]
        instance_type: String,
        /// `mac` of the primary interface.
        #[arg(long, default_value = "0e:12:34:56:78:9a")]
        mac: String,
        /// The primary interface's VPC.
        #[arg(long, default_value = "vpc-0a1b2c3d")]
        vpc_id: String,
        /// The primary interface's subnet.
        #[arg(long, default_value = "subnet-0a1b2c3d")]
        subnet_id: String,
        /// `local-ipv4`.
        #[arg(long, default_value = "10.0.0.4")]
        local_ipv4: String,
        /// `local-hostname`.
        #[arg(long, default_value = "ip-10-0-0-4.ec2.internal")]
        local_hostname: String,
        /// Exit when stdin reaches end of file (so a parent's death stops the emulator).
        #[arg(long)]
        exit_on_stdin_close: bool,
    },
    /// Checks a world file and prints a summary.
    World {
        /// The YAML or JSON file.
        file: PathBuf,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match Cli::parse().cmd {
        Cmd::Proxy { upstream, protocol, listen, tls, upstream_ca, exit_on_stdin_close } => {
            let mut b = FaultProxy::builder(upstream, protocol).listen(listen);
            if let Some(on) = tls {
                b = b.tls(on);
            }
            if let Some(path) = upstream_ca {
                let pem = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading --upstream-ca {}", path.display()))?;
                b = b.upstream_ca_pem(pem);
            }
            let proxy = b.start().await.context("starting the fault proxy")?;
            println!("{}", proxy.url());
            if let Some(ca) = proxy.ca_file() {
                println!("{}", ca.display());
            }
            wait_for_exit(exit_on_stdin_close).await;
            drop(proxy);
            Ok(())
        }
        Cmd::Ibm {
            world,
            listen,
            api_keys,
            account_id,
            lb_pending_ms,
            token_lifetime_secs,
            timing,
            exit_on_stdin_close,
        } => {
            // The world's `ibm:` section (quotas) is read with it.
            let (world, ibm_world) = match world {
                Some(path) => ccm_emulators::ibm::load_world(&path)?,
                None => (World::default(), Default::default()),
            };
            let timing = timing.selection(&world)?;
            let mut opts = ccm_emulators::ibm::IbmOptions {
                lb_pending: std::time::Duration::from_millis(lb_pending_ms),
                token_lifetime: std::time::Duration::from_secs(token_lifetime_secs),
                ..Default::default()
            }
            .with_world(&ibm_world);
            if !api_keys.is_empty() {
                opts.api_keys = api_keys;
            }
            if let Some(a) = account_id {
                opts.account_id = a;
            }
            let cloud = ccm_emulators::ibm::IbmCloud::new(world, opts);
            let server = ccm_emulators::server::Server::start(
                cloud,
                ccm_emulators::server::ServerOptions { listen, tls: false, timing },
            )
            .await
            .context("starting the IBM emulator")?;
            println!("{}", server.url());
            wait_for_exit(exit_on_stdin_close).await;
            drop(server);
            Ok(())
        }
        Cmd::Openstack {
            world,
            listen,
            lb_pending_ms,
            token_lifetime_secs,
            timing,
            exit_on_stdin_close,
        } => {
            // The kit's world plus the OpenStack-only settings under its `openstack:` key
            // (octavia_max_version, max_routes, quotas, users, projects, trusts, ...).
            let (world, os) = match world {
                Some(path) => ccm_emulators::openstack::load_world(&path)?,
                None => (World::default(), Default::default()),
            };
            let timing = timing.selection(&world)?;
            let opts = ccm_emulators::openstack::OpenStackOptions {
                lb_pending: std::time::Duration::from_millis(lb_pending_ms),
                token_lifetime: std::time::Duration::from_secs(token_lifetime_secs),
                ..Default::default()
            }
            .with_world(&os)?;
            let cloud = ccm_emulators::openstack::OpenStackCloud::new(world, opts);
            let server = ccm_emulators::server::Server::start(
                cloud,
                ccm_emulators::server::ServerOptions { listen, tls: false, timing },
            )
            .await
            .context("starting the OpenStack emulator")?;
            println!("{}", server.url());
            wait_for_exit(exit_on_stdin_close).await;
            drop(server);
            Ok(())
        }
        Cmd::Azure { world, listen, lro_ms, page_size, timing, exit_on_stdin_close } => {
            let world = match world {
                Some(path) => World::load(&path)?,
                None => World::default(),
            };
            let timing = timing.selection(&world)?;
            let opts = ccm_emulators::azure::AzureOptions {
                lro: std::time::Duration::from_millis(lro_ms),
                page_size,
                ..Default::default()
            };
            let cloud = ccm_emulators::azure::AzureCloud::new(world, opts);
            let server = ccm_emulators::server::Server::start(
                cloud,
                ccm_emulators::server::ServerOptions { listen, tls: true, timing },
            )
            .await
            .context("starting the Azure emulator")?;
            println!("{}", server.url());
            if let Some(ca) = server.ca_file() {
                println!("{}", ca.display());
            }
            wait_for_exit(exit_on_stdin_close).await;
            drop(server);
            Ok(())
        }
        Cmd::AwsImds {
            listen,
            instance_id,
            region,
            availability_zone,
            instance_type,
            mac,
            vpc_id,
            subnet_id,
            local_ipv4,
            local_hostname,
            exit_on_stdin_close,
        } => {
            let instance = ccm_emulators::aws_imds::ImdsInstance {
                instance_id,
                region,
                availability_zone,
                instance_type,
                mac,
                vpc_id,
                subnet_id,
                local_ipv4,
                local_hostname,
            };
            let server = ccm_emulators::server::Server::start(
                ccm_emulators::aws_imds::AwsImds::new(instance),
                ccm_emulators::server::ServerOptions { listen, tls: false, ..Default::default() },
            )
            .await
            .context("starting the instance metadata service")?;
            println!("{}", server.url());
            wait_for_exit(exit_on_stdin_close).await;
            drop(server);
            Ok(())
        }
        Cmd::Gcp {
            world,
            listen,
            project,
            pending_ms,
            metadata_instance,
            attributes,
            timing,
            exit_on_stdin_close,
        } => {
            // The world's `gcp:` section (quotas, auto-mode networks) is read with it.
            let (world, gcp_world) = match world {
                Some(path) => ccm_emulators::gcp::load_world(&path)?,
                None => (World::default(), Default::default()),
            };
            let timing = timing.selection(&world)?;
            let mut opts = ccm_emulators::gcp::GcpOptions {
                pending: std::time::Duration::from_millis(pending_ms),
                metadata_instance,
                ..Default::default()
            };
            gcp_world.apply(&mut opts);
            if let Some(p) = project {
                opts.project = p;
            }
            let cloud = ccm_emulators::gcp::GcpCloud::new(world, opts);
            for a in &attributes {
                let (k, v) = a.split_once('=').context("--attribute wants key=value")?;
                cloud.set_attribute(k, Some(v));
            }
            let server = ccm_emulators::server::Server::start(
                cloud,
                ccm_emulators::server::ServerOptions { listen, tls: false, timing },
            )
            .await
            .context("starting the GCP emulator")?;
            println!("{}", server.url());
            wait_for_exit(exit_on_stdin_close).await;
            drop(server);
            Ok(())
        }
        Cmd::World { file } => {
            let w = World::load(&file)?;
            let zones = w.zones();
            println!(
                "{} instances in {} zones ({}), {} networks, {} subnets",
                w.instances.len(),
                zones.len(),
                zones.into_iter().collect::<Vec<_>>().join(", "),
                w.networks.len(),
                w.subnets.len()
            );
            Ok(())
        }
    }
}

async fn wait_for_exit(on_stdin_close: bool) {
    let stdin_closed = async {
        if !on_stdin_close {
            return std::future::pending::<()>().await;
        }
        let mut buf = [0u8; 256];
        let mut stdin = tokio::io::stdin();
        while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term => {}
        _ = stdin_closed => {}
    }
}
