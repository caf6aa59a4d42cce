//! GCP: the Compute Engine emulator (`ccm-emulator gcp`) with N instances over three zones
//! of `us-central1`, on the cluster network `k8s-net` with the node tag `k8s-node`. The
//! manager gets its token from the emulator's `token-url` and everything else from
//! `gce.conf` (no metadata server). Lists page at 500 (Compute's largest `maxResults`).

use super::{Admin, Setup, World};

const PROJECT: &str = "bench-project";
const ZONES: [&str; 3] = ["us-central1-a", "us-central1-b", "us-central1-c"];

pub async fn start(s: &Setup<'_>) -> anyhow::Result<World> {
    let mut world = String::from(
        "region: us-central1\nzones: [us-central1-a, us-central1-b, us-central1-c]\n\
         networks:\n  - { name: k8s-net, cidr: 10.0.0.0/8 }\nsubnets:\n",
    );
    for (z, zone) in ZONES.iter().enumerate() {
        world.push_str(&format!(
            "  - {{ name: subnet-{z}, network: k8s-net, zone: {zone}, cidr: 10.{z}.0.0/16 }}\n"
        ));
    }
    world.push_str("instances:\n");
    // With `spare`, one instance more than Nodes: its Node joins in the load-balancer phase.
    let mut nodes = Vec::with_capacity(s.nodes + 1);
    for i in 0..s.nodes + usize::from(s.spare) {
        let z = i % ZONES.len();
        let node = format!("node-{i}");
        let ip = super::ip(&format!("10.{z}"), 0, i / ZONES.len());
        world.push_str(&format!(
            "  - {{ name: {node}, zone: {}, subnet: subnet-{z}, type: n2-standard-4, \
             private_ips: [{ip}], tags: {{ gce.tags: k8s-node }} }}\n",
            ZONES[z]
        ));
        nodes.push((node, ip));
    }
    let spare = if s.spare { nodes.pop() } else { None };
    // Quotas raised to hold the load-balancer phase (Compute's defaults: 75 forwarding rules,
    // 69 in-use and 21 static addresses, 75 health checks and backend services per region).
    let q = (s.lb_capacity + 50).max(200);
    world.push_str(&format!(
        "gcp:\n  quotas: {{ FORWARDING_RULES: {q}, IN_USE_ADDRESSES: {q}, STATIC_ADDRESSES: {q}, \
         HEALTH_CHECKS: {q}, BACKEND_SERVICES: {q}, FIREWALLS: {} }}\n",
        2 * q
    ));
    let w = super::write(s.dir, "world.yaml", &world)?;
    let w = w.display().to_string();
    let (emu, lines) = super::emulator(
        s.emulator,
        &["gcp", "--world", &w, "--project", PROJECT, "--timing", "realistic"],
        1,
        &s.dir.join("emulator.log"),
    )
    .await?;
    let url = lines[0].clone();
    let config = super::write(
        s.dir,
        "gce.conf",
        &format!(
            "[global]\nproject-id = {PROJECT}\nlocal-zone = us-central1-a\nmultizone = true\n\
             network-name = k8s-net\nnode-tags = k8s-node\napi-endpoint = {url}/compute/v1/\n\
             token-url = {url}/token\ntoken-body = {{\"cluster\":\"bench\"}}\n"
        ),
    )?;
    Ok(World {
        nodes,
        admin: Admin { url, ca: None },
        provider: "gce",
        config,
        env: Vec::new(),
        args: Vec::new(),
        page: Some(500),
        notes: vec![
            "Compute Engine emulator; lists page at 500 (Compute's largest maxResults); token from the emulator's token-url".into(),
            format!("quotas raised to {q} (forwarding rules, addresses, health checks, backend services) and {} firewalls", 2 * q),
        ],
        aws: None,
        spare,
        _keep: vec![Box::new(emu)],
        system_uuids: Default::default(),
    })
}
