//! `InstancesV2` against vcsim: metadata, zones from tags, power state, deletion, outages.

use ccm_core::cloud::{InstanceStatus, InstancesV2, ProviderError};
use ccm_provider_vsphere::VsphereProvider;
use ccm_provider_vsphere::config::CredentialSources;

use crate::sim::Vcsim;
use crate::{addresses, node, pairs};

const LABELS: &str = "labels:\n  zone: k8s-zone\n  region: k8s-region\n";

fn provider(config: &str) -> std::sync::Arc<dyn InstancesV2> {
    let provider = VsphereProvider::new(config.as_bytes(), &CredentialSources::default())
        .expect("valid config");
    ccm_core::cloud::CloudProvider::instances_v2(&provider).expect("instances")
}

fn one_vcenter(sim: &Vcsim, extra: &str) -> String {
    format!(
        "global:\n  user: u\n  password: p\n  insecureFlag: true\nvcenter:\n{}{LABELS}{extra}",
        sim.vcenter_yaml("vc1")
    )
}

#[tokio::test]
async fn nodes_get_provider_id_addresses_type_and_zone_from_host_or_cluster_tags() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-h", &[("VM Network", &["10.0.0.10"])]);
    sim.guest("DC0_C0_RP0_VM0", "node-c0", &[("VM Network", &["10.0.1.10"])]);
    sim.guest("DC0_C0_RP0_VM1", "node-c1", &[("VM Network", &["10.0.1.11"])]);
    sim.tag("k8s-region", "region-1", "DC0");
    sim.tag("k8s-zone", "zone-standalone", "DC0_H0");
    sim.tag("k8s-zone", "zone-cluster", "DC0_C0");
    let instances = provider(&one_vcenter(&sim, ""));

    // By name (guest host name), before the node has a providerID.
    let meta = instances.instance_metadata(&node("node-h", None)).await.unwrap();
    let vm = sim.vm("DC0_H0_VM0");
    assert_eq!(meta.provider_id, format!("vsphere://{}", vm.uuid));
    assert_eq!(
        addresses(&meta),
        pairs(&[("Hostname", "node-h"), ("InternalIP", "10.0.0.10"), ("ExternalIP", "10.0.0.10")])
    );
    // Upstream's instance type: the guest ID mapped to its short OS name (vcsim's VMs are
    // `otherGuest`, upstream's `other`), not the raw guest ID.
    assert!(meta.instance_type.starts_with("vsphere-vm.cpu-"), "{}", meta.instance_type);
    assert!(meta.instance_type.ends_with("gb.os-other"), "{}", meta.instance_type);
    assert_eq!((meta.zone.as_str(), meta.region.as_str()), ("zone-standalone", "region-1"));

    // By providerID (upper case is accepted); the zone comes from the cluster.
    let pid = format!("vsphere://{}", sim.vm("DC0_C0_RP0_VM0").uuid.to_uppercase());
    let meta = instances.instance_metadata(&node("whatever", Some(&pid))).await.unwrap();
    assert_eq!(meta.provider_id, format!("vsphere://{}", sim.vm("DC0_C0_RP0_VM0").uuid));
    assert_eq!((meta.zone.as_str(), meta.region.as_str()), ("zone-cluster", "region-1"));

    // A host-level tag beats the cluster's for VMs on that host, once the walks up from
    // the host that earlier lookups cached are over (TOPOLOGY_TTL).
    let host_of_c0 = sim.vm("DC0_C0_RP0_VM0").host.clone();
    sim.tag("k8s-zone", "zone-host", &host_of_c0);
    tokio::time::sleep(ccm_provider_vsphere::instances::TOPOLOGY_TTL).await;
    let meta = instances.instance_metadata(&node("node-c0", None)).await.unwrap();
    assert_eq!((meta.zone.as_str(), meta.region.as_str()), ("zone-host", "region-1"));
    // vcsim places cluster VMs on random hosts: the other VM sees the host tag only if it
    // shares the host.
    let expected =
        if sim.vm("DC0_C0_RP0_VM1").host == host_of_c0 { "zone-host" } else { "zone-cluster" };
    let meta = instances.instance_metadata(&node("node-c1", None)).await.unwrap();
    assert_eq!(meta.zone, expected);

    // By IP when the node is named by its address.
    let meta = instances.instance_metadata(&node("10.0.1.11", None)).await.unwrap();
    assert_eq!(meta.provider_id, format!("vsphere://{}", sim.vm("DC0_C0_RP0_VM1").uuid));

    // Unknown nodes: "not found" for metadata, "gone" for existence.
    let unknown = node("no-such-node", None);
    assert!(matches!(
        instances.instance_metadata(&unknown).await,
        Err(ProviderError::InstanceNotFound)
    ));
    assert!(!instances.instance_exists(&unknown).await.unwrap());

    // Batch answers keep the order.
    let batch = instances
        .instance_metadata_batch(&[node("node-c1", None), unknown, node("node-h", None)])
        .await;
    assert_eq!(batch[0].as_ref().unwrap().zone, expected);
    assert!(matches!(batch[1], Err(ProviderError::InstanceNotFound)));
    assert_eq!(batch[2].as_ref().unwrap().zone, "zone-standalone");
}

#[tokio::test]
async fn addresses_follow_the_nodes_selection_and_ip_families() {
    let sim = Vcsim::start();
    sim.guest(
        "DC0_H0_VM0",
        "node-a",
        &[
            ("VM Network", &["192.168.10.5", "10.20.0.5", "fd00:20::5"]),
            ("public", &["203.0.113.5", "2001:db8::5"]),
        ],
    );
    let config = one_vcenter(
        &sim,
        "nodes:\n  internalNetworkSubnetCidr: 10.20.0.0/16,fd00:20::/64\n  externalVmNetworkName: public\n",
    )
    .replace("  insecureFlag: true\n", "  insecureFlag: true\n  ipFamily: [ipv4, ipv6]\n")
    .replace(LABELS, "");
    let instances = provider(&config);
    let meta = instances.instance_metadata(&node("node-a", None)).await.unwrap();
    assert_eq!(
        addresses(&meta),
        pairs(&[
            ("Hostname", "node-a"),
            ("InternalIP", "10.20.0.5"),
            ("ExternalIP", "203.0.113.5"),
            ("InternalIP", "fd00:20::5"),
            ("ExternalIP", "2001:db8::5"),
        ])
    );

    // A VM whose tools report no NIC cannot be initialised yet: an error, not a bare node.
    sim.guest("DC0_H0_VM1", "node-b", &[]);
    let err = instances.instance_metadata(&node("node-b", None)).await.unwrap_err();
    assert!(err.to_string().contains("no network interfaces"), "{err}");
}

#[tokio::test]
async fn power_off_means_shutdown_and_destroy_means_gone() {
    let sim = Vcsim::start();
    let vm = sim.vm("DC0_H0_VM1").clone();
    let n = node("n1", Some(&format!("vsphere://{}", vm.uuid)));
    let instances = provider(&one_vcenter(&sim, ""));

    assert!(instances.instance_exists(&n).await.unwrap());
    assert!(!instances.instance_shutdown(&n).await.unwrap());
    assert_eq!(
        instances.instance_status_batch(std::slice::from_ref(&n)).await[0].as_ref().unwrap(),
        &InstanceStatus::Running
    );

    sim.power_off(&vm.name);
    assert!(instances.instance_exists(&n).await.unwrap(), "a powered-off VM still exists");
    assert!(instances.instance_shutdown(&n).await.unwrap());
    assert_eq!(
        instances.instance_status_batch(std::slice::from_ref(&n)).await[0].as_ref().unwrap(),
        &InstanceStatus::Shutdown
    );

    sim.destroy(&vm.name);
    assert!(!instances.instance_exists(&n).await.unwrap());
    assert_eq!(
        instances.instance_status_batch(std::slice::from_ref(&n)).await[0].as_ref().unwrap(),
        &InstanceStatus::NotFound
    );
    assert!(matches!(instances.instance_metadata(&n).await, Err(ProviderError::InstanceNotFound)));
}

#[tokio::test]
async fn an_unreachable_vcenter_is_an_error_never_a_missing_instance() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-a", &[("VM Network", &["10.0.0.5"])]);
    sim.tag("k8s-zone", "zone-a", "DC0_H0");
    sim.tag("k8s-region", "region-a", "DC0");
    let n = node("n", Some(&format!("vsphere://{}", sim.vm("DC0_H0_VM0").uuid)));
    let gone = node("gone", Some("vsphere://00000000-0000-0000-0000-000000000000"));
    let instances = provider(&one_vcenter(&sim, ""));
    assert!(instances.instance_exists(&n).await.unwrap());

    sim.pause();
    for probe in [&n, &gone] {
        assert!(
            instances.instance_exists(probe).await.is_err(),
            "exists must fail while vCenter is unreachable"
        );
        assert!(instances.instance_status_batch(std::slice::from_ref(probe)).await[0].is_err());
        let err = instances.instance_metadata(probe).await.unwrap_err();
        assert!(!matches!(err, ProviderError::InstanceNotFound), "{err:?}");
        assert!(err.to_string().contains("vc1"), "the error names the vCenter: {err}");
    }

    sim.resume();
    assert!(instances.instance_exists(&n).await.unwrap(), "recovers when vCenter is back");
    assert!(!instances.instance_exists(&gone).await.unwrap());

    // Sessions dropped (expiry, vCenter restart): a new login, no error.
    sim.drop_sessions();
    let meta = instances.instance_metadata(&node("node-a", None)).await.unwrap();
    assert_eq!((meta.zone.as_str(), meta.region.as_str()), ("zone-a", "region-a"));

    // The simulator process gone entirely: still an error, never "gone".
    drop(sim);
    assert!(instances.instance_exists(&n).await.is_err());
    assert!(instances.instance_exists(&gone).await.is_err());
}
