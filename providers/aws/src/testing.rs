//! Fixtures for tests and the demo against moto (feature `testing`): SDK clients pointed at a
//! moto endpoint, the `[ServiceOverride]` cloud config that sends the provider there, and a
//! tagged VPC with subnets and instances. The moto process itself is `ccm_testbed::moto`.

use std::sync::Arc;

use aws_config::{BehaviorVersion, Region};
use aws_credential_types::Credentials;
use aws_sdk_ec2::types::{Filter, Instance, InstanceType, ResourceType, Tag, TagSpecification};

use crate::{ApiMetrics, AwsClients, Cloud, CloudConfig, LazyClients};

// The SDKs, for tests that inspect what the provider did (without depending on them).
pub use aws_sdk_ec2;
pub use aws_sdk_elasticloadbalancing;
pub use aws_sdk_elasticloadbalancingv2;

/// The region every fixture uses.
pub const REGION: &str = "us-east-1";

/// The zones [`network`] creates subnets in.
pub const ZONES: [&str; 2] = ["us-east-1a", "us-east-1b"];

/// Any fixture failure.
pub type Error = Box<dyn std::error::Error + Send + Sync>;

/// The SDK config for moto: static test credentials, [`REGION`].
pub async fn sdk() -> aws_config::SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(REGION))
        .credentials_provider(Credentials::new("testing", "testing", None, None, "moto"))
        .load()
        .await
}

/// A plain EC2 client on `url`, for fixtures and checks.
pub async fn ec2(url: &str) -> aws_sdk_ec2::Client {
    let sdk = sdk().await;
    aws_sdk_ec2::Client::from_conf(
        aws_sdk_ec2::config::Builder::from(&sdk).endpoint_url(url).build(),
    )
}

/// A plain classic ELB client on `url`.
pub async fn elb(url: &str) -> aws_sdk_elasticloadbalancing::Client {
    let sdk = sdk().await;
    aws_sdk_elasticloadbalancing::Client::from_conf(
        aws_sdk_elasticloadbalancing::config::Builder::from(&sdk).endpoint_url(url).build(),
    )
}

/// A plain ELBv2 client on `url`.
pub async fn elbv2(url: &str) -> aws_sdk_elasticloadbalancingv2::Client {
    let sdk = sdk().await;
    aws_sdk_elasticloadbalancingv2::Client::from_conf(
        aws_sdk_elasticloadbalancingv2::config::Builder::from(&sdk).endpoint_url(url).build(),
    )
}

/// The cloud config for `cluster` that reaches moto at `url` through `[ServiceOverride]`
/// sections (as an operator would for a private endpoint), with `extra` lines appended to
/// `[Global]`.
pub fn cloud_config(url: &str, cluster: &str, extra: &str) -> String {
    let mut text = format!("[Global]\nKubernetesClusterID = {cluster}\nRegion = {REGION}\n");
    if !extra.is_empty() {
        text.push_str(extra.trim_end());
        text.push('\n');
    }
    for (i, service) in ["ec2", "elasticloadbalancing"].iter().enumerate() {
        text.push_str(&format!(
            "\n[ServiceOverride \"{}\"]\nService = {service}\nRegion = {REGION}\nURL = {url}\nSigningRegion = {REGION}\n",
            i + 1
        ));
    }
    text
}

/// The provider for `cluster` on moto at `url`, and its API call counters.
pub async fn cloud(url: &str, cluster: &str, extra: &str) -> Result<(Cloud, ApiMetrics), Error> {
    let cfg = CloudConfig::parse(&cloud_config(url, cluster, extra))?;
    let metrics = ApiMetrics::default();
    let clients = AwsClients::from_sdk_config(&cfg, &sdk().await, metrics.clone()).await?;
    Ok((Cloud::with_clients(cfg, Arc::new(LazyClients::ready(clients))), metrics))
}

/// An EC2 tag.
pub fn tag(k: &str, v: &str) -> Tag {
    Tag::builder().key(k).value(v).build()
}

/// Tags to set on a resource at creation.
pub fn tags_for(rt: ResourceType, tags: Vec<Tag>) -> TagSpecification {
    TagSpecification::builder().resource_type(rt).set_tags(Some(tags)).build()
}

/// A VPC with one subnet per zone of [`ZONES`].
#[derive(Debug, Clone)]
pub struct Network {
    /// The VPC ID.
    pub vpc: String,
    /// `(subnet ID, zone)`, in [`ZONES`] order.
    pub subnets: Vec<(String, String)>,
}

/// Creates a VPC (10.0.0.0/16) with one subnet per zone (10.0.<i>.0/24), each tagged for
/// `cluster` and the public ELB role, and an internet gateway routed from the VPC's main
/// route table (so the subnets are public).
pub async fn network(ec2: &aws_sdk_ec2::Client, cluster: &str) -> Result<Network, Error> {
    let vpc = ec2.create_vpc().cidr_block("10.0.0.0/16").send().await?;
    let vpc = vpc.vpc().and_then(|v| v.vpc_id()).ok_or("CreateVpc returned no VPC ID")?.to_string();
    let mut subnets = Vec::new();
    for (i, az) in ZONES.iter().enumerate() {
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
        let id = s.subnet().and_then(|s| s.subnet_id()).ok_or("CreateSubnet returned no ID")?;
        subnets.push((id.to_string(), az.to_string()));
    }
    // An internet gateway routed from the main route table makes the subnets public, which
    // internet-facing load balancers need (subnet discovery takes only public subnets).
    let igw = ec2.create_internet_gateway().send().await?;
    let igw = igw
        .internet_gateway()
        .and_then(|g| g.internet_gateway_id())
        .ok_or("CreateInternetGateway returned no ID")?
        .to_string();
    ec2.attach_internet_gateway().internet_gateway_id(&igw).vpc_id(&vpc).send().await?;
    let tables = ec2
        .describe_route_tables()
        .filters(Filter::builder().name("vpc-id").values(&vpc).build())
        .filters(Filter::builder().name("association.main").values("true").build())
        .send()
        .await?;
    let main = tables
        .route_tables()
        .first()
        .and_then(|t| t.route_table_id())
        .ok_or("the VPC has no main route table")?;
    ec2.create_route()
        .route_table_id(main)
        .destination_cidr_block("0.0.0.0/0")
        .gateway_id(&igw)
        .send()
        .await?;
    Ok(Network { vpc, subnets })
}

/// Creates the nodes' security group `<cluster>-nodes` in `vpc`, tagged as owned by `cluster`
/// (load balancers add their ingress rules there), and returns its ID.
pub async fn node_security_group(
    ec2: &aws_sdk_ec2::Client,
    vpc: &str,
    cluster: &str,
) -> Result<String, Error> {
    let sg = ec2
        .create_security_group()
        .group_name(format!("{cluster}-nodes"))
        .description("cluster nodes")
        .vpc_id(vpc)
        .tag_specifications(tags_for(
            ResourceType::SecurityGroup,
            vec![tag(&format!("kubernetes.io/cluster/{cluster}"), "owned")],
        ))
        .send()
        .await?;
    Ok(sg.group_id().ok_or("CreateSecurityGroup returned no ID")?.to_string())
}

/// The demo's world (also `ci/swap`'s): the [`network`], a [`node_security_group`] and three
/// instances owned by `cluster`, two in the first zone and one in the second.
pub async fn demo_world(
    ec2: &aws_sdk_ec2::Client,
    cluster: &str,
) -> Result<(Network, Vec<Instance>), Error> {
    let net = network(ec2, cluster).await.map_err(|e| format!("creating the VPC: {e}"))?;
    let sg = node_security_group(ec2, &net.vpc, cluster)
        .await
        .map_err(|e| format!("creating the node security group: {e}"))?;
    let mut instances = Vec::new();
    for (subnet, count) in [(&net.subnets[0].0, 2), (&net.subnets[1].0, 1)] {
        instances.extend(
            run_instances(ec2, subnet, cluster, count, Some(&sg))
                .await
                .map_err(|e| format!("running instances: {e}"))?,
        );
    }
    Ok((net, instances))
}

/// Runs `count` m5.large instances in `subnet`, tagged as owned by `cluster`, optionally in
/// security group `sg`, and returns them as DescribeInstances sees them.
pub async fn run_instances(
    ec2: &aws_sdk_ec2::Client,
    subnet: &str,
    cluster: &str,
    count: i32,
    sg: Option<&str>,
) -> Result<Vec<Instance>, Error> {
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
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(200) {
        let d = ec2
            .describe_instances()
            .filters(Filter::builder().name("instance-id").set_values(Some(chunk.to_vec())).build())
            .send()
            .await?;
        out.extend(d.reservations().iter().flat_map(|r| r.instances().iter().cloned()));
    }
    Ok(out)
}
