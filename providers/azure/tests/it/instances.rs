//! InstancesV2 and Zones against the emulator: upstream's providerIDs, addresses, zones,
//! instance types and power states for availability-set, scale-set and flexible-scale-set
//! VMs; a pass costs a handful of list calls; "gone" only from a positive answer about the
//! providerID's VM.

use std::collections::BTreeMap;
use std::time::Duration;

use ccm_core::cloud::{InstanceStatus, InstancesV2, ProviderError, Zones};
use ccm_emulators::admin::PauseMode;
use ccm_emulators::azure::AzureOptions;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::world::PowerState;
use ccm_provider_azure::config::VmType;
use ccm_provider_azure::instances::{AzureInstances, LABEL_MANAGED};
use k8s_openapi::api::core::v1::{Node, NodeAddress};

use crate::fixture::{
    self, LOCATION, RESOURCE_GROUP, SUBSCRIPTION, WORLD, node, vm_provider_id, vmss_provider_id,
};

fn addrs(a: &[NodeAddress]) -> Vec<(&str, &str)> {
    a.iter().map(|a| (a.type_.as_str(), a.address.as_str())).collect()
}

fn instances(f: &fixture::Fixture) -> AzureInstances {
    AzureInstances::new(f.client.clone(), f.config.clone())
}

/// The calls of `op` between two counter snapshots.
fn delta(
    before: &ccm_emulators::admin::Counters,
    after: &ccm_emulators::admin::Counters,
    op: &str,
) -> u64 {
    after.get(op) - before.get(op)
}

const VM_LIST: &str = "compute.virtual_machines.list";
const VMSS_LIST: &str = "compute.virtual_machine_scale_sets.list";
const VMSS_VM_LIST: &str = "compute.virtual_machine_scale_set_vms.list";
const VMSS_NIC_LIST: &str =
    "network.network_interfaces.list_virtual_machine_scale_set_network_interfaces";
const NIC_LIST: &str = "network.network_interfaces.list";
const PIP_LIST: &str = "network.public_ip_addresses.list";

/// Every per-resource read the provider could make instead of listing.
fn gets(c: &ccm_emulators::admin::Counters) -> u64 {
    [
        "compute.virtual_machines.get",
        "compute.virtual_machines.instance_view",
        "compute.virtual_machine_scale_set_vms.get",
        "compute.virtual_machine_scale_set_vms.instance_view",
        "network.network_interfaces.get",
        "network.network_interfaces.get_virtual_machine_scale_set_network_interface",
        "network.public_ip_addresses.get",
    ]
    .iter()
    .map(|op| c.get(op))
    .sum()
}

#[tokio::test]
async fn availability_set_vms_get_upstreams_metadata_from_three_listings() {
    let f = fixture::start().await;
    let inst = instances(&f);
    let nodes = [
        node("vm-0", None),
        node("vm-2", Some(&vm_provider_id("vm-2"))),
        node("vm-6", None),
        node("vm-3", None),
    ];
    let before = f.server.counters();
    let got = inst.instance_metadata_batch(&nodes).await;
    let after = f.server.counters();

    let a = got[0].as_ref().unwrap();
    assert_eq!(a.provider_id, vm_provider_id("vm-0"));
    assert_eq!(a.instance_type, "Standard_D4s_v3");
    assert_eq!((a.zone.as_str(), a.region.as_str()), ("eastus-1", LOCATION));
    // Upstream's order: InternalIP, Hostname, ExternalIP.
    assert_eq!(
        addrs(&a.node_addresses),
        [("InternalIP", "10.240.0.4"), ("Hostname", "vm-0"), ("ExternalIP", "20.0.0.4")]
    );
    assert!(a.additional_labels.is_empty());
    // A stopped VM without zones: its fault domain.
    let b = got[1].as_ref().unwrap();
    assert_eq!((b.zone.as_str(), b.instance_type.as_str()), ("1", "Standard_D2s_v3"));
    assert_eq!(addrs(&b.node_addresses), [("InternalIP", "10.240.0.6"), ("Hostname", "vm-2")]);
    // Dual stack: the IPv6 private address after upstream's list.
    let c = got[2].as_ref().unwrap();
    assert_eq!(
        addrs(&c.node_addresses),
        [("InternalIP", "10.240.0.8"), ("Hostname", "vm-6"), ("InternalIP", "fd00::8")]
    );
    assert_eq!(got[3].as_ref().unwrap().zone, "0");

    assert_eq!(delta(&before, &after, VM_LIST), 1, "one VM listing for the resource group");
    assert_eq!(delta(&before, &after, NIC_LIST), 1);
    assert_eq!(delta(&before, &after, PIP_LIST), 1);
    assert_eq!(gets(&after) - gets(&before), 0, "no per-node reads");

    // vmType standard looks no further than VMs by name; a scale-set VM's providerID still
    // answers.
    let got = inst
        .instance_metadata_batch(&[
            node("pool-0", None),
            node("pool-0", Some(&vmss_provider_id("pool", 0))),
        ])
        .await;
    assert!(matches!(got[0], Err(ProviderError::InstanceNotFound)), "{:?}", got[0]);
    assert_eq!(got[1].as_ref().unwrap().zone, "eastus-1");

    // Zones: by providerID and by name.
    let z = inst.zone_by_provider_id(&vm_provider_id("vm-1")).await.unwrap();
    assert_eq!((z.failure_domain.as_str(), z.region.as_str()), ("eastus-2", "eastus"));
    assert_eq!(inst.zone_by_node_name("vm-2").await.unwrap().failure_domain, "1");
    assert!(inst.zone_by_provider_id("aws:///us-east-1a/i-1").await.is_err());
}

#[tokio::test]
async fn scale_set_vms_are_found_by_computer_name_and_report_their_sku() {
    let f = fixture::start_with(
        WORLD,
        AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() },
        |c| c.vm_type = VmType::Vmss,
    )
    .await;
    let inst = instances(&f);
    let nodes = [
        node("pool-1", None),
        node("pool-2", Some(&vmss_provider_id("pool", 2))),
        // Standalone VMs are still found with vmType vmss.
        node("vm-1", None),
    ];
    let before = f.server.counters();
    let got = inst.instance_metadata_batch(&nodes).await;
    let after = f.server.counters();
    let a = got[0].as_ref().unwrap();
    assert_eq!(a.provider_id, vmss_provider_id("pool", 1));
    assert_eq!(a.instance_type, "Standard_D2s_v3");
    assert_eq!((a.zone.as_str(), a.region.as_str()), ("eastus-2", "eastus"));
    assert_eq!(addrs(&a.node_addresses), [("InternalIP", "10.240.1.5"), ("Hostname", "pool-1")]);
    let b = got[1].as_ref().unwrap();
    assert_eq!(
        (b.provider_id.as_str(), b.zone.as_str()),
        (vmss_provider_id("pool", 2).as_str(), "eastus-3")
    );
    assert_eq!(addrs(&b.node_addresses)[0], ("InternalIP", "10.240.1.6"));
    assert_eq!(got[2].as_ref().unwrap().provider_id, vm_provider_id("vm-1"));

    assert_eq!(delta(&before, &after, VMSS_VM_LIST), 1, "one listing of the scale set's VMs");
    assert_eq!(delta(&before, &after, VMSS_NIC_LIST), 1, "one listing of the scale set's NICs");
    assert_eq!(delta(&before, &after, VMSS_LIST), 1);
    assert_eq!(delta(&before, &after, VM_LIST), 1);
    assert_eq!(gets(&after) - gets(&before), 0, "no per-node reads");

    // A name no VM has: "not yet", never anything else.
    let got = inst.instance_metadata_batch(&[node("pool-9", None)]).await;
    assert!(matches!(got[0], Err(ProviderError::InstanceNotFound)), "{:?}", got[0]);
}

#[tokio::test]
async fn flexible_scale_set_vms_are_standalone_vms_found_by_computer_name() {
    let f = fixture::start_with(
        WORLD,
        AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() },
        |c| c.vm_type = VmType::VmssFlex,
    )
    .await;
    // vm-1 becomes an instance of the flexible scale set `flex`, host name flex000001.
    let id = f.cloud.instance_resource_id("vm-1").unwrap();
    let mut vm = f.cloud.resource(&id).unwrap();
    vm["properties"]["virtualMachineScaleSet"] = serde_json::json!({
        "id": format!("/subscriptions/{SUBSCRIPTION}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Compute/virtualMachineScaleSets/flex")
    });
    vm["properties"]["osProfile"]["computerName"] = "flex000001".into();
    f.cloud.put_resource(&id, vm).unwrap();
    let inst = instances(&f);
    let got = inst.instance_metadata_batch(&[node("flex000001", None)]).await;
    let m = got[0].as_ref().unwrap();
    assert_eq!(m.provider_id, vm_provider_id("vm-1"), "a flexible scale set's VM is a VM");
    assert_eq!(
        addrs(&m.node_addresses),
        [("InternalIP", "10.240.0.5"), ("Hostname", "flex000001")]
    );
    assert_eq!(m.zone, "eastus-2");
    let s = inst.instance_status_batch(&[node("flex000001", Some(&vm_provider_id("vm-1")))]).await;
    assert!(matches!(s[0], Ok(InstanceStatus::Running)), "{s:?}");
}

#[tokio::test]
async fn power_states_unmanaged_nodes_and_deletions() {
    let f = fixture::start_with(
        WORLD,
        AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() },
        |c| c.vm_type = VmType::Vmss,
    )
    .await;
    let inst = instances(&f);
    let mut unmanaged = node("on-prem-1", None);
    unmanaged.metadata.labels =
        Some(BTreeMap::from([(LABEL_MANAGED.to_string(), "false".to_string())]));
    let nodes = vec![
        node("vm-0", Some(&vm_provider_id("vm-0"))),
        node("vm-2", Some(&vm_provider_id("vm-2"))),
        node("vm-3", Some(&vm_provider_id("vm-3"))),
        node("pool-0", Some(&vmss_provider_id("pool", 0))),
        node("vm-1", None),
        unmanaged.clone(),
    ];
    let got: Vec<InstanceStatus> =
        inst.instance_status_batch(&nodes).await.into_iter().map(Result::unwrap).collect();
    use InstanceStatus::*;
    // vm-2 stopped, vm-3 deallocated: shut down; the unmanaged node exists and runs.
    assert_eq!(got, [Running, Shutdown, Shutdown, Running, Running, Running]);
    assert!(inst.instance_exists(&unmanaged).await.unwrap());
    assert!(!inst.instance_shutdown(&unmanaged).await.unwrap());
    assert_eq!(inst.instance_metadata(&unmanaged).await.unwrap(), Default::default());

    // Deallocating a scale-set VM shuts it down; the next pass sees it (cached listings
    // are short-lived).
    assert!(f.cloud.set_power("pool-0", PowerState::Terminated));
    let inst = instances(&f).with_cache_ttl(Duration::ZERO);
    assert!(inst.instance_shutdown(&nodes[3]).await.unwrap());

    // A VM made after a listing was cached: the stale listing's miss is checked against a
    // fresh one, never taken as "gone".
    let cached = instances(&f);
    assert_eq!(cached.instance_status_batch(&nodes[..4]).await.len(), 4);
    let mut new_vm = ccm_emulators::world::Instance {
        name: "vm-new".into(),
        id: None,
        zone: "1".into(),
        instance_type: None,
        power: PowerState::Running,
        subnet: None,
        private_ips: vec!["10.240.0.99".parse().unwrap()],
        public_ips: Vec::new(),
        tags: BTreeMap::new(),
    };
    f.cloud.add_instance(new_vm.clone()).unwrap();
    new_vm.name = "pool-new".into();
    new_vm.private_ips = vec!["10.240.1.99".parse().unwrap()];
    new_vm.tags.insert("azure.vmss".into(), "pool".into());
    f.cloud.add_instance(new_vm).unwrap();
    let fresh = [
        node("vm-new", Some(&vm_provider_id("vm-new"))),
        node("pool-new", Some(&vmss_provider_id("pool", 3))),
    ];
    let got = cached.instance_status_batch(&fresh).await;
    assert!(got.iter().all(|s| matches!(s, Ok(Running))), "{got:?}");

    // Deleted VMs: gone once a listing made after the deletion lacks them.
    assert!(f.cloud.delete_instance("vm-0"));
    assert!(f.cloud.delete_instance("pool-2"));
    let pool2 = node("pool-2", Some(&vmss_provider_id("pool", 2)));
    let got = inst.instance_status_batch(&[nodes[0].clone(), pool2, nodes[1].clone()]).await;
    assert!(matches!(got[0], Ok(NotFound)), "{:?}", got[0]);
    assert!(matches!(got[1], Ok(NotFound)), "{:?}", got[1]);
    assert!(matches!(got[2], Ok(Shutdown)), "{:?}", got[2]);
    assert!(!inst.instance_exists(&nodes[0]).await.unwrap());

    // A whole scale set gone: the GET of exactly that VM is a 404.
    let gone_set = node("x", Some(&vmss_provider_id("no-such-set", 0)));
    assert!(matches!(inst.instance_status_batch(&[gone_set]).await[0], Ok(NotFound)));
}

#[tokio::test]
async fn only_a_positive_answer_about_the_providerids_vm_says_gone() {
    let f = fixture::start_with(
        WORLD,
        AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() },
        |c| c.vm_type = VmType::Vmss,
    )
    .await;
    let inst = instances(&f).with_cache_ttl(Duration::ZERO);
    let is_err = |r: &Result<InstanceStatus, ProviderError>| r.is_err();

    // Found by no name: an error (a Node without providerID is never deleted).
    let got = inst.instance_status_batch(&[node("ghost", None)]).await;
    assert!(is_err(&got[0]), "{got:?}");
    assert!(inst.instance_exists(&node("ghost", None)).await.is_err());
    // Another subscription, another cloud, a missing resource group: errors.
    let other_sub =
        vm_provider_id("vm-0").replace(SUBSCRIPTION, "00000000-0000-0000-0000-000000000000");
    let missing_rg =
        vm_provider_id("vm-0").replace("/resourceGroups/rg/", "/resourceGroups/no-such-rg/");
    let odd: Vec<Node> = [other_sub.as_str(), "aws:///us-east-1a/i-0123", missing_rg.as_str()]
        .iter()
        .map(|p| node("vm-0", Some(p)))
        .collect();
    let got = inst.instance_status_batch(&odd).await;
    assert!(got.iter().all(is_err), "{got:?}");
    assert!(got[2].as_ref().unwrap_err().to_string().contains("ResourceGroupNotFound"), "{got:?}");

    let nodes = [
        node("vm-0", Some(&vm_provider_id("vm-0"))),
        node("pool-1", Some(&vmss_provider_id("pool", 1))),
        node("vm-1", None),
    ];
    // ARM down: every node errs.
    f.server.admin().pause(PauseMode::Fail).await.unwrap();
    let got = inst.instance_status_batch(&nodes).await;
    assert!(got.iter().all(is_err), "{got:?}");
    assert!(
        inst.instance_metadata_batch(&nodes)
            .await
            .iter()
            .all(|r| !matches!(r, Ok(_) | Err(ProviderError::InstanceNotFound)))
    );
    f.server.admin().resume().await.unwrap();

    // The listings fail: errors, and no GET per node instead.
    for op in [VM_LIST, VMSS_VM_LIST, VMSS_LIST] {
        f.server
            .inject(FaultRule::new(op, Fault::Status { status: 503, body: None }).times(1000))
            .unwrap();
    }
    let before = f.server.counters();
    let got = inst.instance_status_batch(&nodes).await;
    assert!(got.iter().all(is_err), "{got:?}");
    assert_eq!(gets(&f.server.counters()) - gets(&before), 0, "no get per node in an outage");
    f.server.admin().clear_faults().await.unwrap();

    // A later page failing makes the listing incomplete: an error, not "absent".
    f.cloud.set_page_size(1);
    f.server
        .inject(
            FaultRule::new(VM_LIST, Fault::Status { status: 500, body: None })
                .probability(0.5)
                .seed(7)
                .times(1000),
        )
        .unwrap();
    let mut errors = 0;
    for _ in 0..5 {
        match inst.instance_status_batch(&nodes[..1]).await.remove(0) {
            Ok(InstanceStatus::Running) => {}
            Ok(other) => panic!("a partial listing answered {other:?}"),
            Err(_) => errors += 1,
        }
    }
    assert!(errors > 0, "the fault never fired");
    f.server.admin().clear_faults().await.unwrap();
    f.cloud.set_page_size(50);

    // A 200 whose body is not a listing (a proxy's or a misrouted reply, no `value`): an
    // error, not an empty resource group.
    for body in ["{}", r#"{"id": "/subscriptions/s/resourceGroups/rg", "name": "rg"}"#] {
        f.server
            .inject(
                FaultRule::new(VM_LIST, Fault::Status { status: 200, body: Some(body.into()) })
                    .times(1000),
            )
            .unwrap();
        let got = inst.instance_status_batch(&nodes[..1]).await;
        assert!(got[0].is_err(), "{body}: {got:?}");
        f.server.admin().clear_faults().await.unwrap();
    }

    // Throttling is "throttled".
    f.server
        .inject(FaultRule::new(VM_LIST, Fault::Throttle { retry_after_secs: 0 }).times(1000))
        .unwrap();
    let e = inst.instance_status_batch(&nodes[..1]).await.remove(0).unwrap_err();
    assert!(matches!(e, ProviderError::Throttled(_)), "{e}");
    f.server.admin().clear_faults().await.unwrap();

    // A 404 for exactly the VM (its scale set's listing is a 404 too): gone.
    let got =
        inst.instance_status_batch(&[node("x", Some(&vmss_provider_id("no-such-set", 4)))]).await;
    assert!(matches!(got[0], Ok(InstanceStatus::NotFound)), "{got:?}");
    // A proxy's 404 page for that GET: not ARM's answer about the VM, an error.
    f.server
        .inject(
            FaultRule::new(
                "compute.virtual_machine_scale_set_vms.get",
                Fault::Status { status: 404, body: Some("<html>Not Found</html>".into()) },
            )
            .times(1000),
        )
        .unwrap();
    let got =
        inst.instance_status_batch(&[node("x", Some(&vmss_provider_id("no-such-set", 4)))]).await;
    assert!(got[0].is_err(), "{got:?}");
}

#[tokio::test]
async fn a_thousand_scale_set_instances_join_with_a_few_list_calls() {
    let mut world = String::from(
        "region: eastus\nnetworks:\n  - {name: vnet, cidr: 10.0.0.0/8}\nsubnets:\n  - {name: subnet, network: vnet, zone: \"1\", cidr: 10.240.0.0/12}\ninstances:\n",
    );
    for i in 0..1000u32 {
        world.push_str(&format!(
            "  - {{name: big-{i:04}, zone: \"{}\", private_ips: [10.241.{}.{}], tags: {{azure.vmss: big}}}}\n",
            i % 3 + 1,
            i / 250,
            i % 250 + 4
        ));
    }
    let f = fixture::start_with(
        &world,
        AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() },
        |c| c.vm_type = VmType::Vmss,
    )
    .await;
    let page = AzureOptions::default().page_size as u64;
    let bound = 1000u64.div_ceil(page) + 10;
    let nodes: Vec<Node> = (0..1000).map(|i| node(&format!("big-{i:04}"), None)).collect();
    let vm_lists = |b: &ccm_emulators::admin::Counters, a: &ccm_emulators::admin::Counters| {
        delta(b, a, VM_LIST) + delta(b, a, VMSS_LIST) + delta(b, a, VMSS_VM_LIST)
    };

    // One metadata batch for all 1000 joining nodes (by name).
    let inst = instances(&f);
    let before = f.server.counters();
    let started = std::time::Instant::now();
    let got = inst.instance_metadata_batch(&nodes).await;
    let took = started.elapsed();
    let after = f.server.counters();
    for (i, r) in got.iter().enumerate() {
        let m = r.as_ref().unwrap_or_else(|e| panic!("node {i}: {e}"));
        assert_eq!(m.provider_id, vmss_provider_id("big", i as u32));
        assert_eq!(m.node_addresses[0].address, format!("10.241.{}.{}", i / 250, i % 250 + 4));
        assert_eq!(m.zone, format!("eastus-{}", i % 3 + 1));
    }
    let lists = vm_lists(&before, &after);
    eprintln!(
        "1000 scale-set nodes join (one metadata batch, by name, page size {page}): {lists} VM list calls \
         ({} virtual_machines.list, {} virtual_machine_scale_sets.list, {} virtual_machine_scale_set_vms.list; bound {bound}), \
         {} scale-set NIC list calls, {} per-node reads, {took:?}",
        delta(&before, &after, VM_LIST),
        delta(&before, &after, VMSS_LIST),
        delta(&before, &after, VMSS_VM_LIST),
        delta(&before, &after, VMSS_NIC_LIST),
        gets(&after) - gets(&before),
    );
    assert!(lists <= bound, "{lists} VM list calls > {bound}");
    assert_eq!(delta(&before, &after, VMSS_VM_LIST), 1000 / page);
    assert_eq!(delta(&before, &after, VMSS_NIC_LIST), 1000 / page);
    assert_eq!(gets(&after) - gets(&before), 0);

    // Two concurrent batches of 500 (as core's coalescer sends them) share the listings.
    let inst = instances(&f);
    let before = f.server.counters();
    let (a, b) = tokio::join!(
        inst.instance_metadata_batch(&nodes[..500]),
        inst.instance_metadata_batch(&nodes[500..])
    );
    let after = f.server.counters();
    assert!(a.iter().chain(b.iter()).all(Result::is_ok));
    let lists = vm_lists(&before, &after);
    eprintln!(
        "1000 scale-set nodes join (two concurrent batches of 500): {lists} VM list calls, {} NIC list calls",
        delta(&before, &after, VMSS_NIC_LIST)
    );
    assert!(lists <= bound, "{lists} VM list calls > {bound}");

    // The lifecycle pass by providerID, two batches of 500: one listing of the scale set.
    let by_pid: Vec<Node> = (0..1000)
        .map(|i| node(&format!("big-{i:04}"), Some(&vmss_provider_id("big", i))))
        .collect();
    let inst = instances(&f);
    let before = f.server.counters();
    let mut statuses = Vec::new();
    for chunk in by_pid.chunks(500) {
        statuses.extend(inst.instance_status_batch(chunk).await);
    }
    let after = f.server.counters();
    assert!(statuses.iter().all(|s| matches!(s, Ok(InstanceStatus::Running))));
    let lists = vm_lists(&before, &after);
    eprintln!(
        "1000 scale-set nodes' status (by providerID, 2 batches of 500): {lists} VM list calls"
    );
    assert!(lists <= 2 * (1000 / page), "{lists}");
    assert_eq!(gets(&after) - gets(&before), 0);
}

/// Issue #29: a proxy's HTML 404 page, a wrong endpoint's 404 and ARM's 404 about something
/// else than the VM never say "gone", even when the page echoes the VM's name and ARM's code
/// word; only ARM's typed answer about exactly that VM does.
#[tokio::test]
async fn an_html_404_page_echoing_the_vm_name_keeps_the_node() {
    let f = fixture::start().await;
    let inst = instances(&f).with_cache_ttl(Duration::ZERO);
    let vm = node("vm-1", Some(&vm_provider_id("vm-1")));
    let vmss_vm = node("pool-4", Some(&vmss_provider_id("pool", 4)));
    let echo = format!(
        "<html><head><title>404 Not Found</title></head><body><h1>Not Found</h1><p>The requested URL {} was not found on this server: ResourceNotFound NotFound</p></body></html>",
        vm_provider_id("vm-1").trim_start_matches("azure://")
    );
    let html = Fault::Page {
        status: 404,
        content_type: Some("text/html; charset=iso-8859-1".into()),
        body: echo.clone(),
    };
    let not_the_vm = [
        html.clone(),
        // The same page without a content type, and as plain text.
        Fault::Page { status: 404, content_type: None, body: echo.clone() },
        Fault::Page { status: 404, content_type: Some("text/plain".into()), body: echo },
        // A wrong endpoint (an API version or resource type ARM does not serve there).
        Fault::Status {
            status: 404,
            body: Some(r#"{"error":{"code":"InvalidResourceType","message":"The resource type 'virtualMachines' could not be found in the namespace 'Microsoft.Compute' for api version '2024-07-01'. vm-1"}}"#.into()),
        },
        // ARM's 404 about the resource group, not the VM.
        Fault::Status {
            status: 404,
            body: Some(r#"{"error":{"code":"ResourceGroupNotFound","message":"Resource group 'rg' could not be found. vm-1"}}"#.into()),
        },
        // A generic JSON 404 from a gateway.
        Fault::Page {
            status: 404,
            content_type: Some("application/json".into()),
            body: r#"{"message":"Resource not found: vm-1","statusCode":404}"#.into(),
        },
    ];
    for fault in not_the_vm {
        for op in [VM_LIST, VMSS_VM_LIST, "compute.virtual_machine_scale_set_vms.get"] {
            f.server.inject(FaultRule::new(op, fault.clone()).times(1000)).unwrap();
        }
        let got = inst.instance_status_batch(&[vm.clone(), vmss_vm.clone()]).await;
        for (n, r) in ["vm-1", "pool-4"].iter().zip(&got) {
            assert!(r.is_err(), "{fault:?}: node {n} answered {r:?}");
        }
        assert!(inst.instance_exists(&vm).await.is_err(), "{fault:?}");
        f.server.admin().clear_faults().await.unwrap();
    }
    // Without faults: vm-1 runs, and scale-set instance 4 (the set has three) is gone.
    let got = inst.instance_status_batch(&[vm, vmss_vm]).await;
    assert!(matches!(got[0], Ok(InstanceStatus::Running)), "{got:?}");
    assert!(matches!(got[1], Ok(InstanceStatus::NotFound)), "{got:?}");
}
