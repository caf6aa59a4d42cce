//! Issue #32 OpenStack item 6 (trunk sub-port addresses): the fixed IPs of a server's trunk
//! sub-ports (Neutron's `trunk_details` on the parent port) are node addresses under their
//! network's name, as upstream's `instances_addresses.go` adds them. On the emulator (Neutron
//! trunks) with the cloud-node controller against a real kube-apiserver, and the provider's
//! own batches (calls counted, network rules applied).

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::{InstanceMetadata, InstancesV2};
use ccm_emulators::openstack::OpenStackOptions;
use ccm_emulators::server::ServerOptions;
use ccm_provider_openstack::config::{Config, Networking};
use ccm_provider_openstack::instances::OpenStackInstances;
use ccm_testbed::fixtures::kubelet_node;
use ccm_testbed::{ControlPlane, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;

use crate::fixture::{Fixture, fast_options, run_node_controller, start_with};

/// Three servers on `private`; VLAN networks `vlan-100` and `vlan-200` for sub-ports.
const WORLD: &str = r#"
region: RegionOne
zones: [az-1]
networks:
  - { name: private, cidr: 10.0.0.0/16 }
  - { name: vlan-100, cidr: 10.100.0.0/16 }
  - { name: vlan-200, cidr: 10.200.0.0/16 }
subnets:
  - { name: private-subnet, network: private, zone: az-1, cidr: 10.0.0.0/24 }
  - { name: vlan-100-subnet, network: vlan-100, zone: az-1, cidr: 10.100.0.0/24 }
  - { name: vlan-200-subnet, network: vlan-200, zone: az-1, cidr: 10.200.0.0/24 }
instances:
  - { name: node-a, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.11] }
  - { name: node-b, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.12] }
  - { name: node-c, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.13] }
"#;

async fn start() -> Fixture {
    start_with(WORLD, OpenStackOptions::default(), fast_options(), ServerOptions::default()).await
}

fn addrs(md: &InstanceMetadata) -> Vec<(String, String)> {
    md.node_addresses.iter().map(|a| (a.type_.clone(), a.address.clone())).collect()
}

fn pair(a: &str, b: &str) -> (String, String) {
    (a.to_string(), b.to_string())
}

fn bare(name: &str) -> Node {
    crate::fixture::node(name, None)
}

/// A kubelet-registered Node on a server with a trunk is initialised by the cloud-node
/// controller with the sub-ports' addresses as InternalIPs (the API server's Node shows
/// them), after the server's own port address.
#[tokio::test]
async fn a_node_on_a_server_with_a_trunk_gets_the_sub_port_addresses() {
    // Its own control plane: the cloud-node controller acts on every Node of the cluster.
    let cp = ControlPlane::start().await.expect("control plane starts");
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = start().await;
    f.cloud.add_trunk("node-a", &[("vlan-100-subnet", "10.100.0.5", 100)]).unwrap();
    let (token, _provider) = run_node_controller(&client, &f.config);
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &kubelet_node("node-a", "10.0.0.11", "True"))
        .await
        .unwrap();
    let n = wait_for("node-a to get the sub-port address", Duration::from_secs(60), || async {
        let n = nodes.get("node-a").await.ok()?;
        let addrs = n.status.as_ref()?.addresses.clone()?;
        addrs.iter().any(|a| a.address == "10.100.0.5").then_some(n)
    })
    .await;
    let got: Vec<(String, String)> = n
        .status
        .and_then(|s| s.addresses)
        .unwrap_or_default()
        .into_iter()
        .filter(|a| a.type_ != "Hostname")
        .map(|a| (a.type_, a.address))
        .collect();
    assert_eq!(got, vec![pair("InternalIP", "10.0.0.11"), pair("InternalIP", "10.100.0.5")]);
    let provider_id = n.spec.and_then(|s| s.provider_id).unwrap_or_default();
    assert_eq!(provider_id, crate::fixture::provider_id(&f, "node-a"));
    token.cancel();
}

/// The provider's own answers: one node (upstream's targeted calls) lists its sub-ports and
/// their networks with one call each, a node without a trunk costs nothing more; a batch
/// finds the sub-ports in its port listing and lists the networks once. The sub-ports'
/// addresses follow the network rules: `internal-network-name` drops them, a network in
/// `public-network-name` makes them ExternalIPs.
#[tokio::test]
async fn sub_port_addresses_follow_the_network_rules_in_small_and_large_batches() {
    let f = start().await;
    f.cloud
        .add_trunk(
            "node-a",
            &[("vlan-100-subnet", "10.100.0.5", 100), ("vlan-200-subnet", "10.200.0.5", 200)],
        )
        .unwrap();
    f.cloud.add_trunk("node-b", &[("vlan-100-subnet", "10.100.0.6", 100)]).unwrap();
    let inst = OpenStackInstances::new(Arc::clone(&f.client), &f.config);

    // One node: its ports, then its sub-ports and their networks (one listing each).
    let before = f.server.counters();
    let md = inst.instance_metadata(&bare("node-a")).await.unwrap();
    assert_eq!(
        addrs(&md),
        vec![
            pair("InternalIP", "10.0.0.11"),
            pair("InternalIP", "10.100.0.5"),
            pair("InternalIP", "10.200.0.5"),
        ]
    );
    let after = f.server.counters();
    let delta = |op: &str| after.get(op) - before.get(op);
    assert_eq!((delta("neutron.ports.list"), delta("neutron.networks.list")), (2, 1));
    // A node without a trunk: no sub-port calls.
    let before = f.server.counters();
    let md = inst.instance_metadata(&bare("node-c")).await.unwrap();
    assert_eq!(addrs(&md), vec![pair("InternalIP", "10.0.0.13")]);
    let after = f.server.counters();
    let delta = |op: &str| after.get(op) - before.get(op);
    assert_eq!((delta("neutron.ports.list"), delta("neutron.networks.list")), (1, 0));

    // A batch of three: one server listing, one port listing, one network listing.
    let before = f.server.counters();
    let out = inst.instance_metadata_batch(&[bare("node-a"), bare("node-b"), bare("node-c")]).await;
    let after = f.server.counters();
    let delta = |op: &str| after.get(op) - before.get(op);
    assert_eq!(
        (delta("nova.servers.list"), delta("neutron.ports.list"), delta("neutron.networks.list")),
        (1, 1, 1)
    );
    assert_eq!(
        addrs(out[0].as_ref().unwrap()),
        vec![
            pair("InternalIP", "10.0.0.11"),
            pair("InternalIP", "10.100.0.5"),
            pair("InternalIP", "10.200.0.5"),
        ]
    );
    assert_eq!(
        addrs(out[1].as_ref().unwrap()),
        vec![pair("InternalIP", "10.0.0.12"), pair("InternalIP", "10.100.0.6")]
    );
    assert_eq!(addrs(out[2].as_ref().unwrap()), vec![pair("InternalIP", "10.0.0.13")]);

    // internal-network-name = private: the VLAN addresses are dropped; vlan-200 as a public
    // network: its sub-port address is an ExternalIP.
    let config = Config {
        networking: Networking {
            internal_network_names: vec!["private".into()],
            public_network_names: vec!["vlan-200".into()],
            ..Networking::default()
        },
        ..f.config.clone()
    };
    let inst = OpenStackInstances::new(Arc::clone(&f.client), &config);
    let md = inst.instance_metadata(&bare("node-a")).await.unwrap();
    assert_eq!(addrs(&md), vec![pair("InternalIP", "10.0.0.11"), pair("ExternalIP", "10.200.0.5")]);
}
