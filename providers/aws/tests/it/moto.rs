//! A moto server per test, plus fixtures (VPC, subnets, instances) and a provider pointed at it.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use aws_config::{BehaviorVersion, Region};
use aws_credential_types::Credentials;
use aws_sdk_ec2::types::{Filter, Instance, InstanceType, ResourceType, Tag, TagSpecification};
use ccm_provider_aws::{ApiMetrics, AwsClients, Cloud, CloudConfig, LazyClients};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::ObjectMeta;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

pub const REGION: &str = "us-east-1";

/// Kills moto when the pipe from this process closes; exits when moto exits.
const SUPERVISOR: &str = r#"
exec 3<&0
"$1" -H 127.0.0.1 -p "$2" >"$3" 2>&1 </dev/null 3<&- & m=$!
( read -r _line <&3; kill -TERM $m 2>/dev/null ) &
exec 3<&-
wait $m
"#;

/// A running moto server; stopped on drop.
pub struct Moto {
    pub url: String,
    port: u16,
    child: Option<(Child, ChildStdin)>,
    log: PathBuf,
}

fn moto_server_path() -> Result<PathBuf> {
    if let Some(p) = std::env::var_os("CCM_MOTO_SERVER") {
        return Ok(PathBuf::from(p));
    }
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../ci/install-tools");
    let out = Command::new(&script)
        .arg("--print-moto")
        .output()
        .with_context(|| format!("running {}", script.display()))?;
    let path = PathBuf::from(String::from_utf8(out.stdout)?.trim());
    if !path.is_file() || path.file_name().is_none_or(|n| n != "moto_server") {
        bail!("moto_server is not installed at {:?}: run ci/install-tools", path.display());
    }
    Ok(path)
}

async fn http(port: u16, method: &str, path: &str) -> Result<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let req =
        format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

impl Moto {
    /// Starts a moto server and waits until it answers.
    pub async fn start() -> Result<Moto> {
        let bin = moto_server_path()?;
        let port = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let log =
            std::env::temp_dir().join(format!("ccm-aws-moto-{}-{port}.log", std::process::id()));
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(SUPERVISOR)
            .arg("ccm-moto-supervisor")
            .arg(&bin)
            .arg(port.to_string())
            .arg(&log)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .context("spawning the moto supervisor (sh)")?;
        let stdin = child.stdin.take().context("supervisor stdin")?;
        let mut moto = Moto {
            url: format!("http://127.0.0.1:{port}"),
            port,
            child: Some((child, stdin)),
            log,
        };
        // Python start-up on a busy machine can take a while; this is a readiness wait, not
        // an assertion on timing.
        for _ in 0..600 {
            // The supervisor exits early only when moto did (a crash or a taken port).
            if let Some((c, _)) = moto.child.as_mut()
                && !matches!(c.try_wait(), Ok(None))
            {
                break;
            }
            if let Ok(r) = http(port, "GET", "/moto-api/data.json").await
                && r.starts_with("HTTP/1.")
                && r.contains(" 200 ")
            {
                return Ok(moto);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let log = std::fs::read_to_string(&moto.log).unwrap_or_default();
        bail!("moto_server did not come up on port {port}; log:\n{log}")
    }

    /// Forgets every resource.
    #[allow(dead_code)]
    pub async fn reset(&self) -> Result<()> {
        let r = http(self.port, "POST", "/moto-api/reset").await?;
        anyhow::ensure!(r.contains(" 200 "), "reset failed: {r}");
        Ok(())
    }

    /// The SDK config for moto (static test credentials).
    pub async fn sdk(&self) -> aws_config::SdkConfig {
        aws_config::defaults(BehaviorVersion::latest())
            .region(Region::new(REGION))
            .credentials_provider(Credentials::new("testing", "testing", None, None, "moto"))
            .load()
            .await
    }

    /// A plain EC2 client on moto, for fixtures and checks.
    pub async fn ec2(&self) -> aws_sdk_ec2::Client {
        let sdk = self.sdk().await;
        aws_sdk_ec2::Client::from_conf(
            aws_sdk_ec2::config::Builder::from(&sdk).endpoint_url(&self.url).build(),
        )
    }

    /// A plain classic ELB client on moto.
    pub async fn elb(&self) -> aws_sdk_elasticloadbalancing::Client {
        let sdk = self.sdk().await;
        aws_sdk_elasticloadbalancing::Client::from_conf(
            aws_sdk_elasticloadbalancing::config::Builder::from(&sdk)
                .endpoint_url(&self.url)
                .build(),
        )
    }

    /// A plain ELBv2 client on moto.
    pub async fn elbv2(&self) -> aws_sdk_elasticloadbalancingv2::Client {
        let sdk = self.sdk().await;
        aws_sdk_elasticloadbalancingv2::Client::from_conf(
            aws_sdk_elasticloadbalancingv2::config::Builder::from(&sdk)
                .endpoint_url(&self.url)
                .build(),
        )
    }

    /// The provider for `cluster`, reaching moto through `[ServiceOverride]` sections, with
    /// `extra` appended to `[Global]`.
    pub async fn cloud(&self, cluster: &str, extra: &str) -> Result<(Cloud, ApiMetrics)> {
        let url = &self.url;
        let text = format!(
            "[Global]\nKubernetesClusterID = {cluster}\nRegion = {REGION}\n{extra}\n\
             [ServiceOverride \"1\"]\nService = ec2\nRegion = {REGION}\nURL = {url}\nSigningRegion = {REGION}\n\
             [ServiceOverride \"2\"]\nService = elasticloadbalancing\nRegion = {REGION}\nURL = {url}\nSigningRegion = {REGION}\n"
        );
        let cfg = CloudConfig::parse(&text)?;
        let metrics = ApiMetrics::default();
        let clients = AwsClients::from_sdk_config(&cfg, &self.sdk().await, metrics.clone()).await?;
        Ok((Cloud::with_clients(cfg, Arc::new(LazyClients::ready(clients))), metrics))
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some((mut child, mut stdin)) = self.child.take() {
            let _ = stdin.write_all(b"stop\n");
            drop(stdin);
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}

pub fn tag(k: &str, v: &str) -> Tag {
    Tag::builder().key(k).value(v).build()
}

pub fn tags_for(rt: ResourceType, tags: Vec<Tag>) -> TagSpecification {
    TagSpecification::builder().resource_type(rt).set_tags(Some(tags)).build()
}

/// A VPC with one subnet per zone, tagged for `cluster` and the public ELB role.
pub struct Network {
    pub vpc: String,
    pub subnets: Vec<(String, String)>,
}

pub async fn network(ec2: &aws_sdk_ec2::Client, cluster: &str) -> Result<Network> {
    let vpc = ec2.create_vpc().cidr_block("10.0.0.0/16").send().await?;
    let vpc = vpc.vpc().and_then(|v| v.vpc_id()).context("vpc id")?.to_string();
    let mut subnets = Vec::new();
    for (i, az) in ["us-east-1a", "us-east-1b"].iter().enumerate() {
        let s = ec2
            .create_subnet()
            .vpc_id(&vpc)
            .cidr_block(format!("10.0.{i}.0/24"))
            .availability_zone(*az)
            .tag_specifications(tags_for(
                ResourceType::Subnet,
                vec![
                    tag(&format!("kubernetes.io/cluster/{cluster}"), "shared"),
                    tag("kubernetes.io/role/elb", "1"),
                ],
            ))
            .send()
            .await?;
        subnets.push((
            s.subnet().and_then(|s| s.subnet_id()).context("subnet id")?.to_string(),
            az.to_string(),
        ));
    }
    Ok(Network { vpc, subnets })
}

/// Runs `count` instances in `subnet`, tagged for `cluster`, in security group `sg`.
pub async fn run_instances(
    ec2: &aws_sdk_ec2::Client,
    subnet: &str,
    cluster: &str,
    count: i32,
    sg: Option<&str>,
) -> Result<Vec<Instance>> {
    let resp = ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .instance_type(InstanceType::M5Large)
        .min_count(count)
        .max_count(count)
        .subnet_id(subnet)
        .set_security_group_ids(sg.map(|s| vec![s.to_string()]))
        .tag_specifications(tags_for(
            ResourceType::Instance,
            vec![tag(&format!("kubernetes.io/cluster/{cluster}"), "owned")],
        ))
        .send()
        .await?;
    let ids: Vec<String> =
        resp.instances().iter().filter_map(|i| i.instance_id()).map(str::to_string).collect();
    // Re-read: RunInstances' answer does not carry everything DescribeInstances does.
    let d = ec2
        .describe_instances()
        .filters(Filter::builder().name("instance-id").set_values(Some(ids)).build())
        .send()
        .await?;
    Ok(d.reservations().iter().flat_map(|r| r.instances().iter().cloned()).collect())
}

/// A Node named `name` with an optional providerID.
pub fn node(name: &str, provider_id: Option<String>) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec { provider_id, ..Default::default() }),
        ..Default::default()
    }
}
