//! AWS: moto with N instances (a /24 subnet per 200, over the fixture's zones), reached
//! through the fault proxy (`ccm-emulator proxy --protocol aws-query`), which counts the
//! managers' calls and adds the per-call latency. DescribeInstances pages at 1000 (EC2's
//! largest `MaxResults`).

use anyhow::Context as _;
use ccm_provider_aws::testing;

use super::{Admin, Setup, World};

pub const CLUSTER: &str = "bench";

/// What the load-balancer phase needs: moto itself (not counted), an EC2 client on it and
/// the node security group for the Node it adds.
pub struct Extra {
    pub moto: String,
    pub ec2: aws_sdk_ec2::Client,
    pub sg: String,
}

pub async fn start(s: &Setup<'_>) -> anyhow::Result<World> {
    let err = |what: &'static str| move |e: testing::Error| anyhow::anyhow!("{what}: {e}");
    let moto = ccm_testbed::moto::Moto::start().await.context("starting moto")?;
    let (proxy, lines) = super::emulator(
        s.emulator,
        &["proxy", "--upstream", &moto.url, "--protocol", "aws-query"],
        1,
        &s.dir.join("proxy.log"),
    )
    .await?;
    let url = lines[0].clone();
    let ec2 = testing::ec2(&moto.url).await;
    let net = testing::network(&ec2, CLUSTER).await.map_err(err("creating the VPC"))?;
    let sg = testing::node_security_group(&ec2, &net.vpc, CLUSTER)
        .await
        .map_err(err("creating the node security group"))?;
    let mut nodes: Vec<(String, String)> = Vec::with_capacity(s.nodes);
    while nodes.len() < s.nodes {
        // A /24 per 200 instances (the fixture's subnets hold 251 addresses each).
        let b = nodes.len() / 200;
        let count = (s.nodes - nodes.len()).min(200);
        let zone = &net.subnets[b % net.subnets.len()].1;
        let subnet = ec2
            .create_subnet()
            .vpc_id(&net.vpc)
            .cidr_block(format!("10.0.{}.0/24", 100 + b))
            .availability_zone(zone)
            .send()
            .await
            .context("creating a subnet")?;
        let subnet = subnet
            .subnet()
            .and_then(|s| s.subnet_id())
            .context("CreateSubnet returned no ID")?
            .to_string();
        let batch = testing::run_instances(&ec2, &subnet, CLUSTER, count as i32, Some(&sg))
            .await
            .map_err(err("running instances"))?;
        nodes.extend(batch.iter().filter_map(|i| {
            Some((i.private_dns_name()?.to_string(), i.private_ip_address()?.to_string()))
        }));
        crate::progress(format!("instances: {}/{}", nodes.len(), s.nodes));
    }
    let config = super::write(s.dir, "aws.conf", &cloud_config(&url, &net.vpc, &net.subnets[0].0))?;
    Ok(World {
        nodes,
        admin: Admin { url: url.clone(), ca: None },
        provider: "aws",
        config,
        env: vec![
            ("AWS_ACCESS_KEY_ID".into(), "testing".into()),
            ("AWS_SECRET_ACCESS_KEY".into(), "testing".into()),
            ("AWS_EC2_METADATA_DISABLED".into(), "true".into()),
            ("AWS_REGION".into(), testing::REGION.into()),
        ],
        args: Vec::new(),
        page: Some(1000),
        notes: vec![
            "moto behind the fault proxy; DescribeInstances pages at 1000 (EC2's largest MaxResults); the proxy answers DescribeInstanceTopology (moto has none)".into(),
        ],
        aws: Some(Extra { moto: moto.url.clone(), ec2, sg }),
        spare: None,
        _keep: vec![Box::new(proxy), Box::new(moto)],
        system_uuids: Default::default(),
    })
}

/// The cloud config both managers read, written as for upstream v1.36: VPC and SubnetID (else
/// upstream asks the instance metadata service which instance it runs on, and there is none
/// here) and endpoint overrides named by the SDK's service IDs (`EC2`, `Elastic Load
/// Balancing`), which upstream matches since its move to the Go SDK v2.
fn cloud_config(url: &str, vpc: &str, subnet: &str) -> String {
    let region = testing::REGION;
    let mut text = format!(
        "[Global]\nKubernetesClusterID = {CLUSTER}\nRegion = {region}\nVPC = {vpc}\nSubnetID = {subnet}\n"
    );
    for (i, service) in ["EC2", "Elastic Load Balancing"].iter().enumerate() {
        text.push_str(&format!(
            "\n[ServiceOverride \"{}\"]\nService = {service}\nRegion = {region}\nURL = {url}\nSigningRegion = {region}\n",
            i + 1
        ));
    }
    text
}
