//! Finding a Node's VM (issue 14, deletion safety first): datacenters listed again instead
//! of cached forever, lookups by `status.nodeInfo.systemUUID` and by the byte-swapped UUID,
//! several VMs with one guest host name refused, bounded concurrent searches, and property
//! reads that follow `RetrievePropertiesEx` continuation tokens.
//!
//! The simulator's `SearchIndex` honours the datacenter argument here (the `ccm-vcsim`
//! wrapper scopes it as vCenter does), so a stale datacenter list really misses VMs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_core::cloud::{InstanceStatus, InstancesV2, ProviderError};
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
use ccm_provider_vsphere::VsphereProvider;
use ccm_provider_vsphere::client::vim25::Vim25Client;
use ccm_provider_vsphere::client::{Endpoint, Secret};
use ccm_provider_vsphere::config::CredentialSources;
use ccm_provider_vsphere::instances::{SEARCH_CONCURRENCY, swap_uuid_bytes};
use k8s_openapi::api::core::v1::{NodeStatus, NodeSystemInfo};

use crate::sim::Vcsim;
use crate::{node, pairs};

fn provider(config: &str) -> Arc<dyn InstancesV2> {
    let provider = VsphereProvider::new(config.as_bytes(), &CredentialSources::default())
        .expect("valid config");
    ccm_core::cloud::CloudProvider::instances_v2(&provider).expect("instances")
}

fn config(port: u16, extra_vcenter: &str) -> String {
    format!(
        "global:\n  user: u\n  password: p\n  insecureFlag: true\nvcenter:\n  vc1:\n    server: 127.0.0.1\n    port: {port}\n{extra_vcenter}"
    )
}

fn by_uuid(name: &str, uuid: &str) -> k8s_openapi::api::core::v1::Node {
    node(name, Some(&format!("vsphere://{uuid}")))
}

#[tokio::test]
async fn a_vm_moved_into_a_datacenter_created_after_start_is_found_not_gone() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-m", &[("VM Network", &["10.0.0.5"])]);
    let vm = sim.vm("DC0_H0_VM0").clone();
    let n = by_uuid("node-m", &vm.uuid);
    let instances = provider(&config(sim.port, ""));
    assert!(instances.instance_exists(&n).await.unwrap(), "found in DC0");

    sim.create_datacenter("DC1");
    sim.move_vm(&vm.name, "DC1");
    assert!(
        instances.instance_exists(&n).await.unwrap(),
        "a VM in a datacenter created after the first lookup must not read as gone"
    );
    assert_eq!(
        instances.instance_status_batch(std::slice::from_ref(&n)).await[0].as_ref().unwrap(),
        &InstanceStatus::Running
    );
    let meta = instances.instance_metadata(&node("node-m", None)).await.unwrap();
    assert_eq!(meta.provider_id, format!("vsphere://{}", vm.uuid));
}

#[tokio::test]
async fn a_deleted_datacenter_does_not_fail_every_lookup() {
    let sim = Vcsim::start();
    sim.create_datacenter("DCX");
    let vm = sim.vm("DC0_H0_VM1").clone();
    let present = by_uuid("present", &vm.uuid);
    let gone = by_uuid("gone", "00000000-0000-0000-0000-000000000001");
    let instances = provider(&config(sim.port, ""));
    // Lists DC0 and DCX.
    assert!(instances.instance_exists(&present).await.unwrap());
    assert!(!instances.instance_exists(&gone).await.unwrap());

    sim.destroy_datacenter("DCX");
    assert!(
        !instances.instance_exists(&gone).await.unwrap(),
        "the deleted datacenter is dropped from the list, not an error for every lookup"
    );
    assert!(instances.instance_exists(&present).await.unwrap());
}

#[tokio::test]
async fn a_configured_datacenter_that_does_not_exist_yet_blocks_only_gone_answers() {
    let sim = Vcsim::start();
    let vm = sim.vm("DC0_H0_VM0").clone();
    let present = by_uuid("present", &vm.uuid);
    let gone = by_uuid("gone", "00000000-0000-0000-0000-000000000002");
    let instances = provider(&config(sim.port, "    datacenters: [DC0, DC2]\n"));

    assert!(instances.instance_exists(&present).await.unwrap(), "DC0 is searched");
    let err = instances.instance_exists(&gone).await.unwrap_err();
    assert!(err.to_string().contains("DC2"), "the error names the missing datacenter: {err}");
    assert!(instances.instance_status_batch(std::slice::from_ref(&gone)).await[0].is_err());

    sim.create_datacenter("DC2");
    assert!(
        !instances.instance_exists(&gone).await.unwrap(),
        "with every configured datacenter listed, a missing VM is gone"
    );
}

#[tokio::test]
async fn nodes_are_found_by_system_uuid_and_by_the_byte_swapped_uuid() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "guest-name", &[("VM Network", &["10.0.0.5"])]);
    let vm = sim.vm("DC0_H0_VM0").clone();
    let swapped = swap_uuid_bytes(&vm.uuid).unwrap();
    assert_ne!(swapped, vm.uuid);
    let instances = provider(&config(sim.port, ""));

    // A providerID written from a byte-swapped product_uuid.
    let n = by_uuid("whatever", &swapped);
    assert!(instances.instance_exists(&n).await.unwrap(), "swapped providerID reads as gone");
    assert!(!instances.instance_shutdown(&n).await.unwrap());
    let meta = instances.instance_metadata(&n).await.unwrap();
    assert_eq!(meta.provider_id, format!("vsphere://{}", vm.uuid));

    // No providerID, a node name that is not the guest host name: the systemUUID the
    // kubelet reported (swapped and upper case, as /sys/class/dmi/id/product_uuid reads).
    let mut n = node("k8s-name-differs", None);
    n.status = Some(NodeStatus {
        node_info: Some(NodeSystemInfo {
            system_uuid: swapped.to_uppercase(),
            ..Default::default()
        }),
        ..Default::default()
    });
    let meta = instances.instance_metadata(&n).await.unwrap();
    assert_eq!(meta.provider_id, format!("vsphere://{}", vm.uuid));
    assert_eq!(
        crate::addresses(&meta),
        pairs(&[
            ("Hostname", "guest-name"),
            ("InternalIP", "10.0.0.5"),
            ("ExternalIP", "10.0.0.5")
        ])
    );
    assert!(instances.instance_exists(&n).await.unwrap());
}

#[tokio::test]
async fn several_vms_with_the_same_guest_host_name_are_an_error_not_a_pick() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "twin", &[("VM Network", &["10.0.0.5"])]);
    sim.guest("DC0_H0_VM1", "twin", &[("VM Network", &["10.0.0.6"])]);
    let instances = provider(&config(sim.port, ""));
    let twin = node("twin", None);
    let err = instances.instance_metadata(&twin).await.unwrap_err();
    assert!(!matches!(err, ProviderError::InstanceNotFound), "{err:?}");
    assert!(err.to_string().contains("2 VMs"), "{err}");
    assert!(err.to_string().contains(&sim.vm("DC0_H0_VM0").moref), "names both VMs: {err}");
    assert!(err.to_string().contains(&sim.vm("DC0_H0_VM1").moref), "names both VMs: {err}");
    assert!(instances.instance_exists(&twin).await.is_err(), "never gone, never a pick");

    // Renaming one resolves it.
    sim.guest("DC0_H0_VM1", "twin-2", &[("VM Network", &["10.0.0.6"])]);
    let meta = instances.instance_metadata(&twin).await.unwrap();
    assert_eq!(meta.provider_id, format!("vsphere://{}", sim.vm("DC0_H0_VM0").uuid));
}

async fn proxy(sim: &Vcsim) -> FaultProxy {
    let upstream = Url::parse(&format!("https://127.0.0.1:{}", sim.port)).unwrap();
    FaultProxy::start(upstream, Protocol::VimSoap).await.unwrap()
}

/// Waits (generously) until `cond` holds for the proxy's counters.
async fn wait_for_calls(proxy: &FaultProxy, op: &str, at_least: u64) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let n = proxy.admin().counters().await.unwrap().get(op);
        if n >= at_least {
            return n;
        }
        assert!(Instant::now() < deadline, "only {n} {op} calls arrived, waited for {at_least}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_searches_are_bounded_per_vcenter() {
    let sim = Vcsim::start();
    let proxy = proxy(&sim).await;
    let instances = provider(&config(proxy.port(), ""));
    // Warm up: session and datacenter list.
    assert!(!instances.instance_exists(&node("warm-up", None)).await.unwrap());
    let before = proxy.admin().counters().await.unwrap().get("vim25:FindAllByDnsName");

    // Every name search hangs: what arrives at vCenter is what the provider lets through.
    proxy.admin().inject(FaultRule::new("vim25:FindAllByDnsName", Fault::Hang)).await.unwrap();
    let nodes: Vec<_> = (0..30).map(|i| node(&format!("node-{i}"), None)).collect();
    let batch = {
        let instances = instances.clone();
        tokio::spawn(async move { instances.instance_status_batch(&nodes).await })
    };
    let limit = SEARCH_CONCURRENCY as u64;
    wait_for_calls(&proxy, "vim25:FindAllByDnsName", before + limit).await;
    // Give a provider without a bound ample time to send more (30 were asked for).
    tokio::time::sleep(Duration::from_secs(2)).await;
    let in_flight = proxy.admin().counters().await.unwrap().get("vim25:FindAllByDnsName") - before;
    assert_eq!(in_flight, limit, "searches in flight at once");
    batch.abort();
}

fn endpoint(port: u16) -> Endpoint {
    Endpoint {
        name: "vc1".into(),
        server: "127.0.0.1".into(),
        port,
        user: "u".into(),
        password: Secret::new("p"),
        insecure: true,
        ca_file: None,
        thumbprint: None,
        login: Default::default(),
        timeout: Duration::from_secs(30),
    }
}

#[tokio::test]
async fn property_reads_follow_continuation_tokens() {
    let sim = Vcsim::start();
    sim.create_datacenter("DC1");
    sim.create_datacenter("DC2");
    let proxy = proxy(&sim).await;
    let vim = Vim25Client::new(endpoint(proxy.port())).unwrap().with_page_size(1);
    let dcs = vim.datacenters().await.unwrap();
    assert_eq!(dcs.keys().cloned().collect::<Vec<_>>(), ["DC0", "DC1", "DC2"]);
    let c = proxy.admin().counters().await.unwrap();
    assert_eq!(c.get("vim25:RetrievePropertiesEx"), 1, "{c:?}");
    assert!(
        c.get("vim25:ContinueRetrievePropertiesEx") >= 3,
        "one object per page: the later pages come through the token: {c:?}"
    );
    // One-object reads work with any page size too.
    let vm = ccm_provider_vsphere::client::MoRef::new(
        "VirtualMachine",
        sim.vm("DC0_H0_VM0").moref.clone(),
    );
    assert_eq!(vim.vm_info(&vm).await.unwrap().unwrap().name, "DC0_H0_VM0");
}

fn by_system_uuid(name: &str, uuid: &str) -> k8s_openapi::api::core::v1::Node {
    let mut n = node(name, None);
    n.status = Some(NodeStatus {
        node_info: Some(NodeSystemInfo { system_uuid: uuid.to_uppercase(), ..Default::default() }),
        ..Default::default()
    });
    n
}

/// Issue #35: a batch of Nodes whose kubelets reported their VMs' UUIDs is answered from
/// one listing of every VM's UUID and one property read, not a `FindByUuid` search and a
/// read per Node; a Node the listing does not have is searched for as before (and is not
/// found), and a VM deleted after the listing is not answered from it.
#[tokio::test]
async fn a_batch_is_found_in_one_uuid_listing_and_one_property_read() {
    let sim = Vcsim::start();
    let proxy = proxy(&sim).await;
    let names: Vec<String> = sim.vms.iter().map(|vm| vm.name.clone()).collect();
    assert!(names.len() >= 4, "{names:?}");
    for (i, vm) in names.iter().enumerate() {
        sim.guest(vm, &format!("node-{i}"), &[("VM Network", &[&format!("10.0.0.{}", 10 + i)])]);
    }
    let instances = provider(&config(proxy.port(), ""));
    let nodes: Vec<_> = names
        .iter()
        .enumerate()
        .map(|(i, vm)| by_system_uuid(&format!("node-{i}"), &sim.vm(vm).uuid))
        .collect();
    let meta = instances.instance_metadata_batch(&nodes).await;
    for (i, vm) in names.iter().enumerate() {
        let m = meta[i].as_ref().unwrap();
        assert_eq!(m.provider_id, format!("vsphere://{}", sim.vm(vm).uuid));
        let ip = format!("10.0.0.{}", 10 + i);
        assert!(crate::addresses(m).contains(&("InternalIP".to_string(), ip)), "{m:?}");
    }
    let c = proxy.admin().counters().await.unwrap();
    assert_eq!(c.get("vim25:FindByUuid"), 0, "no Node of the batch is searched for: {c:?}");
    assert_eq!(
        c.get("vim25:RetrievePropertiesEx"),
        3,
        "the datacenters, the UUID listing, one read of the batch's VMs: {c:?}"
    );

    // A Node the listing lacks is searched for as before (its UUID, then swapped): not found.
    let stranger = by_system_uuid("stranger", "4223d7e4-0000-0000-0000-000000000001");
    let meta = instances.instance_metadata_batch(&[stranger, nodes[0].clone()]).await;
    assert!(matches!(meta[0], Err(ProviderError::InstanceNotFound)), "{meta:?}");
    assert_eq!(
        meta[1].as_ref().unwrap().provider_id,
        format!("vsphere://{}", sim.vm(&names[0]).uuid)
    );
    let c = proxy.admin().counters().await.unwrap();
    assert_eq!(c.get("vim25:FindByUuid"), 2, "{c:?}");

    // A VM deleted after the listing: the listing is still used for the others, but the
    // deleted one is not answered from it (its read fails, it is searched for: not found).
    let gone = names[1].clone();
    sim.destroy(&gone);
    let meta = instances.instance_metadata_batch(&nodes).await;
    assert!(matches!(meta[1], Err(ProviderError::InstanceNotFound)), "{:?}", meta[1]);
    for (i, vm) in names.iter().enumerate().filter(|(i, _)| *i != 1) {
        assert_eq!(meta[i].as_ref().unwrap().provider_id, format!("vsphere://{}", sim.vm(vm).uuid));
    }
}
