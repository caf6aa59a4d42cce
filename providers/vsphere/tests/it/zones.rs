//! Zone and region as upstream looks for them (issue 14), against vcsim: tags on the VM's
//! host and its ancestors, then on its resource pool and ancestors, then on the VM and its
//! folders; a category with no tag anywhere is an error (the Node is retried), never an
//! empty zone.

use std::sync::Arc;

use ccm_core::cloud::{InstancesV2, ProviderError};
use ccm_provider_vsphere::VsphereProvider;
use ccm_provider_vsphere::config::CredentialSources;

use crate::node;
use crate::sim::Vcsim;

fn provider(sim: &Vcsim) -> Arc<dyn InstancesV2> {
    let config = format!(
        "global:\n  user: u\n  password: p\n  insecureFlag: true\nvcenter:\n{}labels:\n  zone: k8s-zone\n  region: k8s-region\n",
        sim.vcenter_yaml("vc1")
    );
    let provider = VsphereProvider::new(config.as_bytes(), &CredentialSources::default())
        .expect("valid config");
    ccm_core::cloud::CloudProvider::instances_v2(&provider).expect("instances")
}

fn zone_region(meta: &ccm_core::cloud::InstanceMetadata) -> (&str, &str) {
    (meta.zone.as_str(), meta.region.as_str())
}

#[tokio::test]
async fn the_zone_comes_from_the_resource_pool_when_the_host_path_has_none() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-rp", &[("VM Network", &["10.0.0.5"])]);
    sim.tag("k8s-region", "region-1", "DC0");
    sim.tag_of("k8s-zone", "zone-pool", "DC0_H0_VM0", "resourcePool");
    let meta = provider(&sim).instance_metadata(&node("node-rp", None)).await.unwrap();
    assert_eq!(zone_region(&meta), ("zone-pool", "region-1"));
}

#[tokio::test]
async fn the_zone_comes_from_the_vm_folder_when_host_and_pool_have_none() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM1", "node-f", &[("VM Network", &["10.0.0.6"])]);
    sim.tag("k8s-region", "region-1", "DC0");
    sim.tag_of("k8s-zone", "zone-folder", "DC0_H0_VM1", "folder");
    let meta = provider(&sim).instance_metadata(&node("node-f", None)).await.unwrap();
    assert_eq!(zone_region(&meta), ("zone-folder", "region-1"));
}

#[tokio::test]
async fn a_host_tag_wins_over_pool_and_folder_tags() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-h", &[("VM Network", &["10.0.0.5"])]);
    sim.tag("k8s-region", "region-1", "DC0");
    sim.tag("k8s-zone", "zone-host", "DC0_H0");
    sim.tag_of("k8s-zone", "zone-pool", "DC0_H0_VM0", "resourcePool");
    sim.tag_of("k8s-zone", "zone-folder", "DC0_H0_VM0", "folder");
    let meta = provider(&sim).instance_metadata(&node("node-h", None)).await.unwrap();
    assert_eq!(zone_region(&meta), ("zone-host", "region-1"));
}

#[tokio::test]
async fn a_missing_zone_tag_is_an_error_and_the_node_is_retried() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-z", &[("VM Network", &["10.0.0.5"])]);
    sim.tag("k8s-region", "region-1", "DC0");
    // The category exists (on another VM's host), but nothing on this VM's paths.
    sim.tag("k8s-zone", "zone-c", "DC0_C0");
    let instances = provider(&sim);
    let err = instances.instance_metadata(&node("node-z", None)).await.unwrap_err();
    assert!(!matches!(err, ProviderError::InstanceNotFound), "{err:?}");
    assert!(err.to_string().contains("k8s-zone"), "names the category: {err}");
    assert!(err.to_string().contains("DC0_H0_VM0"), "names the VM: {err}");

    // Once tagged, the retry succeeds.
    sim.tag("k8s-zone", "zone-h", "DC0_H0");
    let meta = instances.instance_metadata(&node("node-z", None)).await.unwrap();
    assert_eq!(zone_region(&meta), ("zone-h", "region-1"));
}

/// The tags up from a host answer every VM on it (`TOPOLOGY_TTL`): the second VM's lookup
/// reads no tag at all, only its own (ci/bench: 13 calls per Node before, 10 of them tags).
#[tokio::test]
async fn the_tags_up_from_a_host_are_read_once_for_all_its_vms() {
    use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-a", &[("VM Network", &["10.0.0.5"])]);
    sim.guest("DC0_H0_VM1", "node-b", &[("VM Network", &["10.0.0.6"])]);
    sim.tag("k8s-region", "region-1", "DC0");
    sim.tag("k8s-zone", "zone-h", "DC0_H0");
    let upstream = Url::parse(&format!("https://127.0.0.1:{}", sim.port)).unwrap();
    let proxy = FaultProxy::start(upstream, Protocol::VimSoap).await.unwrap();
    let config = format!(
        "global:\n  user: u\n  password: p\n  insecureFlag: true\nvcenter:\n  vc1:\n    server: 127.0.0.1\n    port: {}\nlabels:\n  zone: k8s-zone\n  region: k8s-region\n",
        proxy.port()
    );
    let provider = VsphereProvider::new(config.as_bytes(), &CredentialSources::default())
        .expect("valid config");
    let instances = ccm_core::cloud::CloudProvider::instances_v2(&provider).expect("instances");
    let tag_reads = || async {
        let c = proxy.admin().counters().await.unwrap();
        c.operations.iter().filter(|(op, _)| op.contains("/tagging/")).map(|(_, n)| n).sum::<u64>()
    };
    let a = instances.instance_metadata(&node("node-a", None)).await.unwrap();
    let first = tag_reads().await;
    assert!(first >= 2, "the first VM's lookup read the host's tags: {first}");
    let b = instances.instance_metadata(&node("node-b", None)).await.unwrap();
    assert_eq!(
        (zone_region(&a), zone_region(&b)),
        (("zone-h", "region-1"), ("zone-h", "region-1"))
    );
    assert_eq!(tag_reads().await, first, "the second VM on the host read tags again");
}
