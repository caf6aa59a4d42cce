//! IBM Cloud (VPC): the IBM Cloud emulator (`ccm-emulator ibm`: IAM, Resource Manager, VPC
//! on one URL) with one VPC, a subnet per zone and N instances named like their Nodes,
//! which carry no IKS labels (so every Node is looked up in the VPC). VPC lists page at 100
//! at most (IBM's documented `limit` range, 1–100).

use super::{Admin, Setup, World};

const CLUSTER: &str = "bench";
const ZONES: [&str; 2] = ["us-south-1", "us-south-2"];

pub async fn start(s: &Setup<'_>) -> anyhow::Result<World> {
    let mut world = String::from(
        "region: us-south\nzones: [us-south-1, us-south-2]\n\
         networks:\n  - { name: vpc-1, cidr: 10.240.0.0/12 }\n\
         subnets:\n  - { name: subnet-1, network: vpc-1, zone: us-south-1, cidr: 10.240.0.0/16 }\n\
         \x20 - { name: subnet-2, network: vpc-1, zone: us-south-2, cidr: 10.241.0.0/16 }\n\
         instances:\n",
    );
    // With `spare`, one instance more than Nodes: its Node joins in the load-balancer phase.
    let mut nodes = Vec::with_capacity(s.nodes + 1);
    for i in 0..s.nodes + usize::from(s.spare) {
        let z = i % 2;
        let node = format!("node-{i}");
        let ip = super::ip(&format!("10.{}", 240 + z), 0, i / 2);
        world.push_str(&format!(
            "  - {{ name: {node}, zone: {}, type: bx2-4x16, subnet: subnet-{}, private_ips: [{ip}] }}\n",
            ZONES[z],
            z + 1
        ));
        nodes.push((node, ip));
    }
    let spare = if s.spare { nodes.pop() } else { None };
    // Quotas raised to hold the load-balancer phase: IBM's defaults are 50 load balancers per
    // region and 50 members per pool.
    world.push_str(&format!(
        "ibm:\n  quotas: {{ load_balancers: {}, members_per_pool: {} }}\n",
        (s.lb_capacity + 10).max(50),
        (s.nodes + 10).max(50)
    ));
    let w = super::write(s.dir, "world.yaml", &world)?;
    let w = w.display().to_string();
    let (emu, lines) = super::emulator(
        s.emulator,
        &["ibm", "--world", &w, "--timing", "realistic"],
        1,
        &s.dir.join("emulator.log"),
    )
    .await?;
    let url = lines[0].clone();
    let key = super::write(s.dir, "api-key", "ibm-emulator-api-key\n")?;
    let config = super::write(
        s.dir,
        "ibm.conf",
        &format!(
            "[global]\nversion = 1.1.0\n[provider]\ncluster-default-provider = g2\n\
             accountID = emulator-account-0001\nclusterID = {CLUSTER}\nregion = us-south\n\
             g2VpcName = vpc-1\ng2Credentials = {}\ng2ResourceGroupName = default\n\
             g2VpcSubnetNames = subnet-1,subnet-2\ng2EndpointOverride = {url}\n\
             iamEndpointOverride = {url}\nrmEndpointOverride = {url}\ntaggingEndpointOverride = {url}\n",
            key.display()
        ),
    )?;
    Ok(World {
        nodes,
        admin: Admin { url, ca: None },
        provider: "ibm",
        config,
        env: Vec::new(),
        args: Vec::new(),
        page: Some(100),
        notes: vec![
            "IBM Cloud emulator (IAM, Resource Manager, VPC); VPC lists page at 100 at most (IBM's documented limit)".into(),
            format!(
                "quotas raised: load balancers {} (IBM's default 50), members per pool {} (default 50)",
                (s.lb_capacity + 10).max(50),
                (s.nodes + 10).max(50)
            ),
        ],
        aws: None,
        spare,
        _keep: vec![Box::new(emu)],
        system_uuids: Default::default(),
    })
}
