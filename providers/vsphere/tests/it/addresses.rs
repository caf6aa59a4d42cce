//! Node addresses as upstream chooses them (issue 14), against vcsim: the Hostname first,
//! non-vNIC interfaces skipped, static addresses from `guestinfo.metadata` preferred,
//! network names compared case-insensitively, a subnet that matches nothing backed up by
//! the network name, and no ExternalIP when only an internal selector is configured.

use std::sync::Arc;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use ccm_core::cloud::InstancesV2;
use ccm_provider_vsphere::VsphereProvider;
use ccm_provider_vsphere::config::CredentialSources;

use crate::sim::Vcsim;
use crate::{addresses, node, pairs};

fn provider(sim: &Vcsim, nodes: &str) -> Arc<dyn InstancesV2> {
    let config = format!(
        "global:\n  user: u\n  password: p\n  insecureFlag: true\nvcenter:\n{}{nodes}",
        sim.vcenter_yaml("vc1")
    );
    let provider = VsphereProvider::new(config.as_bytes(), &CredentialSources::default())
        .expect("valid config");
    ccm_core::cloud::CloudProvider::instances_v2(&provider).expect("instances")
}

#[tokio::test]
async fn interfaces_that_are_not_vnics_are_skipped() {
    let sim = Vcsim::start();
    // docker0 and a CNI bridge come first in the guest's list, as they often do.
    sim.guest_with_devices(
        "DC0_H0_VM0",
        "node-a",
        &[
            ("", &["172.17.0.1"], -1),
            ("", &["10.244.0.1"], -1),
            ("VM Network", &["192.168.20.5"], 4000),
        ],
    );
    let instances = provider(&sim, "");
    let meta = instances.instance_metadata(&node("node-a", None)).await.unwrap();
    assert_eq!(
        addresses(&meta),
        pairs(&[
            ("Hostname", "node-a"),
            ("InternalIP", "192.168.20.5"),
            ("ExternalIP", "192.168.20.5")
        ])
    );
}

#[tokio::test]
async fn static_addresses_from_guestinfo_metadata_beat_a_vip_listed_first() {
    let sim = Vcsim::start();
    // kube-vip's VIP shows up first on the vNIC; cloud-init configured 192.168.20.5.
    sim.guest("DC0_H0_VM0", "cp-0", &[("VM Network", &["192.168.20.100", "192.168.20.5"])]);
    let network = "version: 2\nethernets:\n  id0:\n    match: {macaddress: \"00:50:56:00:00:00\"}\n    addresses: [192.168.20.5/24]\n";
    let metadata = format!(
        "instance-id: cp-0\nlocal-hostname: cp-0\nnetwork.encoding: base64\nnetwork: {}\n",
        STANDARD.encode(network)
    );
    sim.extra_config("DC0_H0_VM0", "guestinfo.metadata", &STANDARD.encode(metadata));
    sim.extra_config("DC0_H0_VM0", "guestinfo.metadata.encoding", "base64");
    let instances = provider(&sim, "");
    let meta = instances.instance_metadata(&node("cp-0", None)).await.unwrap();
    assert_eq!(
        addresses(&meta),
        pairs(&[
            ("Hostname", "cp-0"),
            ("InternalIP", "192.168.20.5"),
            ("ExternalIP", "192.168.20.5")
        ])
    );

    // Unreadable metadata is an error naming it (upstream fails the same way), not a
    // silent VIP.
    sim.extra_config("DC0_H0_VM0", "guestinfo.metadata", "%%% not base64");
    let err = instances.instance_metadata(&node("cp-0", None)).await.unwrap_err();
    assert!(err.to_string().contains("guestinfo.metadata"), "{err}");
}

#[tokio::test]
async fn network_names_ignore_case_and_back_up_a_subnet_that_matches_nothing() {
    let sim = Vcsim::start();
    sim.guest(
        "DC0_H0_VM0",
        "node-a",
        &[("VM Network", &["192.168.20.5"]), ("K8s Nodes", &["10.20.0.5"])],
    );
    let instances = provider(
        &sim,
        "nodes:\n  internalNetworkSubnetCidr: 172.16.0.0/12\n  internalVmNetworkName: k8s nodes\n",
    );
    let meta = instances.instance_metadata(&node("node-a", None)).await.unwrap();
    assert_eq!(
        addresses(&meta),
        pairs(&[("Hostname", "node-a"), ("InternalIP", "10.20.0.5")]),
        "only an internal selector: no ExternalIP"
    );
}

#[tokio::test]
async fn only_an_internal_subnet_gives_no_external_ip() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-a", &[("VM Network", &["192.168.20.5", "10.20.0.5"])]);
    let instances = provider(&sim, "nodes:\n  internalNetworkSubnetCidr: 10.20.0.0/16\n");
    let meta = instances.instance_metadata(&node("node-a", None)).await.unwrap();
    assert_eq!(addresses(&meta), pairs(&[("Hostname", "node-a"), ("InternalIP", "10.20.0.5")]));
}
