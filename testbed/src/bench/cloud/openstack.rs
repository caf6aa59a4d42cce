//! OpenStack: the OpenStack emulator (`ccm-emulator openstack`: Keystone, Nova, Neutron,
//! Octavia on one URL) with N servers over two availability zones in one tenant network;
//! password authentication as the emulator's `admin` in project `demo` (a `cloud.conf` that
//! upstream's v1.36.0 reads too). Nova pages its server list at the emulator's `[api]
//! max_limit` (Nova's default, 1000), so the page is counted as 1000.

use super::{Admin, Setup, World};

const ZONES: [&str; 2] = ["az-1", "az-2"];

pub async fn start(s: &Setup<'_>) -> anyhow::Result<World> {
    let mut world = String::from(
        "region: RegionOne\nzones: [az-1, az-2]\n\
         networks:\n  - { name: private, cidr: 10.0.0.0/16 }\n\
         subnets:\n  - { name: private-subnet, network: private, zone: az-1, cidr: 10.0.0.0/16 }\n\
         openstack:\n  public_subnets: [{ name: public-bench, cidr: 172.25.0.0/16 }]\n  \
         quotas: { floatingip: 5000 }\n\
         instances:\n",
    );
    // With `spare`, one instance more than Nodes: its Node joins in the load-balancer phase.
    let mut nodes = Vec::with_capacity(s.nodes + 1);
    for i in 0..s.nodes + usize::from(s.spare) {
        let node = format!("node-{i}");
        let ip = super::ip("10.0", 0, i);
        world.push_str(&format!(
            "  - {{ name: {node}, zone: {}, type: m1.medium, private_ips: [{ip}] }}\n",
            ZONES[i % 2]
        ));
        nodes.push((node, ip));
    }
    let spare = if s.spare { nodes.pop() } else { None };
    let w = super::write(s.dir, "world.yaml", &world)?;
    let w = w.display().to_string();
    let (emu, lines) = super::emulator(
        s.emulator,
        &["openstack", "--world", &w, "--timing", "realistic"],
        1,
        &s.dir.join("emulator.log"),
    )
    .await?;
    let url = lines[0].clone();
    let config = super::write(
        s.dir,
        "cloud.conf",
        &format!(
            "[Global]\nauth-url = {url}/identity/v3\nusername = admin\npassword = openstack-emulator-password\n\
             tenant-name = demo\ndomain-name = Default\nregion = RegionOne\n"
        ),
    )?;
    Ok(World {
        nodes,
        admin: Admin { url, ca: None },
        provider: "openstack",
        config,
        env: Vec::new(),
        args: Vec::new(),
        page: Some(1000),
        notes: vec![
            "OpenStack emulator (Keystone, Nova, Neutron, Octavia); Nova pages servers at its [api] max_limit (Nova's default, 1000)".into(),
        ],
        aws: None,
        spare,
        _keep: vec![Box::new(emu)],
        system_uuids: Default::default(),
    })
}
