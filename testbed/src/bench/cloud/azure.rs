//! Azure: the ARM emulator (`ccm-emulator azure`, HTTPS with its own CA, trusted through
//! `SSL_CERT_FILE`) with N availability-set VMs over zones 1–3 of `eastus` in one subnet,
//! the cluster security group `k8s-nsg`; the manager signs in as the emulator's service
//! principal. List pages hold the emulator's default 50 items (`--page-size`).

use super::{Admin, Setup, World};

/// The emulator's default identity (`AzureOptions::default()`).
const TENANT: &str = "72f988bf-0000-0000-0000-00000000e0a1";
const SUBSCRIPTION: &str = "8ecadfc9-0000-0000-0000-00000000abcd";
const CLIENT_ID: &str = "00000000-0000-0000-0000-0000000c1e47";
const CLIENT_SECRET: &str = "azure-emulator-secret";
const PAGE: usize = 50;

pub async fn start(s: &Setup<'_>) -> anyhow::Result<World> {
    let mut world = String::from(
        "region: eastus\nnetworks:\n  - {name: vnet, cidr: 10.0.0.0/8}\n\
         subnets:\n  - {name: subnet, network: vnet, zone: \"1\", cidr: 10.240.0.0/16}\n\
         instances:\n",
    );
    let mut nodes = Vec::with_capacity(s.nodes);
    for i in 0..s.nodes {
        let node = format!("node-{i}");
        let ip = super::ip("10.240", 0, i);
        world.push_str(&format!(
            "  - {{name: {node}, zone: \"{}\", type: Standard_D4s_v3, private_ips: [{ip}]}}\n",
            i % 3 + 1
        ));
        nodes.push((node, ip));
    }
    let w = super::write(s.dir, "world.yaml", &world)?;
    let w = w.display().to_string();
    let page = PAGE.to_string();
    let (emu, lines) = super::emulator(
        s.emulator,
        &["azure", "--world", &w, "--page-size", &page, "--timing", "realistic"],
        2,
        &s.dir.join("emulator.log"),
    )
    .await?;
    let (url, ca) = (lines[0].clone(), lines.get(1).cloned().unwrap_or_default());
    let config = serde_json::json!({
        "cloud": "AzureStackCloud",
        "resourceManagerEndpoint": url,
        "tenantId": TENANT,
        "subscriptionId": SUBSCRIPTION,
        "aadClientId": CLIENT_ID,
        "aadClientSecret": CLIENT_SECRET,
        "resourceGroup": "rg",
        "location": "eastus",
        "vnetName": "vnet",
        "subnetName": "subnet",
        "securityGroupName": "k8s-nsg",
        "routeTableName": "kubernetes-routetable",
        "vmType": "standard",
        "loadBalancerSku": "standard",
        "cloudConfigType": "file",
    });
    let config = super::write(s.dir, "azure.json", &config.to_string())?;
    Ok(World {
        nodes,
        admin: Admin { url, ca: Some(ca.clone()) },
        provider: "azure",
        config,
        env: vec![("SSL_CERT_FILE".into(), ca)],
        args: Vec::new(),
        page: Some(PAGE),
        notes: vec![format!(
            "ARM emulator over HTTPS; list pages of {PAGE} (the emulator's default page size, not checked against ARM's); availability-set VMs (vmType standard)"
        )],
        aws: None,
        spare: None,
        _keep: vec![Box::new(emu)],
        system_uuids: Default::default(),
    })
}
