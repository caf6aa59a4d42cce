//! Backend pool membership against the emulator: availability-set NICs and scale-set VMs
//! join and leave the pool, a re-sync writes nothing, a stale ETag is redone, and after
//! `remove_all_members` ARM lets the load balancer go.
// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::Arc;

use ccm_core::cloud::ProviderError;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_provider_azure::client::api_version::NETWORK;
use ccm_provider_azure::config::BackendPoolType;
use ccm_provider_azure::load_balancer::backend::Backends;
use k8s_openapi::api::core::v1::{Node, NodeAddress, NodeStatus};
use serde_json::{Value, json};

use crate::fixture::{
    self, CLUSTER, Fixture, RESOURCE_GROUP, node, vm_provider_id, vmss_provider_id,
};

const NIC_PUT: &str = "network.network_interfaces.create_or_update";
const VMSS_VM_PUT: &str = "compute.virtual_machine_scale_set_vms.update";
const VMSS_PUT: &str = "compute.virtual_machine_scale_sets.create_or_update";

fn lb_id(f: &Fixture) -> String {
    f.client.resource_id(RESOURCE_GROUP, "Microsoft.Network/loadBalancers", CLUSTER).unwrap()
}

fn pool_id(f: &Fixture, ipv6: bool) -> String {
    format!("{}/backendAddressPools/{CLUSTER}{}", lb_id(f), if ipv6 { "-IPv6" } else { "" })
}

/// The cluster's load balancer with its two pools, as helper C's code leaves it.
fn make_lb(f: &Fixture) {
    f.cloud
        .put_resource(
            &lb_id(f),
            json!({
                "sku": {"name": "Standard"},
                "properties": {"backendAddressPools": [
                    {"name": CLUSTER, "id": pool_id(f, false), "properties": {}},
                    {"name": format!("{CLUSTER}-IPv6"), "id": pool_id(f, true), "properties": {}},
                ]}
            }),
        )
        .unwrap();
}

/// The pool's members as ARM lists them (`backendIPConfigurations`), sorted, as the suffix
/// after the resource group's providers path.
fn members(f: &Fixture, ipv6: bool) -> Vec<String> {
    let lb = f.cloud.resource(&lb_id(f)).unwrap();
    let want = pool_id(f, ipv6).to_ascii_lowercase();
    let pool = lb["properties"]["backendAddressPools"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["id"].as_str().unwrap().to_ascii_lowercase() == want)
        .unwrap()
        .clone();
    let mut out: Vec<String> = pool["properties"]["backendIPConfigurations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| {
            let id = c["id"].as_str().unwrap();
            id.split("/providers/").nth(1).unwrap().to_string()
        })
        .collect();
    out.sort();
    out
}

fn vmas(name: &str) -> Node {
    node(name, Some(&vm_provider_id(name)))
}

fn vmss(name: &str, instance: u32) -> Node {
    node(name, Some(&vmss_provider_id("pool", instance)))
}

fn scale_set_model_pools(f: &Fixture) -> Value {
    let id = f
        .client
        .resource_id(RESOURCE_GROUP, "Microsoft.Compute/virtualMachineScaleSets", "pool")
        .unwrap();
    let ss = f.cloud.resource(&id).unwrap();
    ss["properties"]["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"][0]
        ["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"]
        .clone()
}

fn writes(f: &Fixture) -> u64 {
    let c = f.server.counters();
    c.get(NIC_PUT) + c.get(VMSS_VM_PUT) + c.get(VMSS_PUT)
}

#[tokio::test]
async fn vmas_nics_and_scale_set_vms_join_and_leave_and_a_resync_writes_nothing() {
    let f = fixture::start().await;
    make_lb(&f);
    let backends = Backends::new(f.client.clone(), f.config.clone());
    let pool = pool_id(&f, false);
    let nodes = [
        vmas("vm-0"),
        vmas("vm-1"),
        vmss("pool-0", 0),
        vmss("pool-1", 1),
        node("no-provider-id", None),
        node("elsewhere", Some("aws:///us-east-1a/i-0123")),
        vmas("vm-gone"),
    ];
    backends.ensure_members(&pool, &nodes).await.unwrap();
    assert_eq!(
        members(&f, false),
        [
            "Microsoft.Compute/virtualMachineScaleSets/pool/virtualMachines/0/networkInterfaces/pool/ipConfigurations/ipconfig1",
            "Microsoft.Compute/virtualMachineScaleSets/pool/virtualMachines/1/networkInterfaces/pool/ipConfigurations/ipconfig1",
            "Microsoft.Network/networkInterfaces/vm-0-nic/ipConfigurations/ipconfig1",
            "Microsoft.Network/networkInterfaces/vm-1-nic/ipConfigurations/ipconfig1",
        ]
    );
    assert_eq!(
        scale_set_model_pools(&f),
        json!([{"id": pool}]),
        "the scale set's model lists the pool"
    );
    assert!(members(&f, true).is_empty(), "the IPv6 pool is untouched");
    assert_eq!(writes(&f), 5, "2 NICs, 2 scale-set VMs, 1 scale-set model");

    // The same nodes again: reads only.
    let before = writes(&f);
    let calls = f.server.counters().total;
    backends.ensure_members(&pool, &nodes).await.unwrap();
    assert_eq!(writes(&f), before, "a re-sync with no change writes nothing");
    let c = f.server.counters();
    assert_eq!(
        c.total - calls,
        2,
        "a re-sync reads the load balancer and the scale set; the VM listing is the read \
         cache's (vmCacheTTLInSeconds, 60 s by default): {:?}",
        c.operations
    );

    // vm-1 and pool-0 leave.
    backends.ensure_members(&pool, &[vmas("vm-0"), vmss("pool-1", 1)]).await.unwrap();
    assert_eq!(
        members(&f, false),
        [
            "Microsoft.Compute/virtualMachineScaleSets/pool/virtualMachines/1/networkInterfaces/pool/ipConfigurations/ipconfig1",
            "Microsoft.Network/networkInterfaces/vm-0-nic/ipConfigurations/ipconfig1",
        ]
    );
    assert_eq!(writes(&f), before + 2);
    // The NIC kept what it had besides the pool.
    let nic1 = f
        .cloud
        .resource(
            &f.client
                .resource_id(RESOURCE_GROUP, "Microsoft.Network/networkInterfaces", "vm-1-nic")
                .unwrap(),
        )
        .unwrap();
    assert!(nic1["properties"]["macAddress"].is_string());
    assert_eq!(nic1["properties"]["enableIPForwarding"], json!(false));
    assert_eq!(
        nic1["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"],
        "10.240.0.5"
    );
}

#[tokio::test]
async fn the_ipv6_pool_takes_the_ipv6_ip_configuration() {
    let f = fixture::start().await;
    make_lb(&f);
    let backends = Backends::new(f.client.clone(), f.config.clone());
    backends.ensure_members(&pool_id(&f, true), &[vmas("vm-6")]).await.unwrap();
    assert_eq!(
        members(&f, true),
        ["Microsoft.Network/networkInterfaces/vm-6-nic/ipConfigurations/ipconfig-v6-1"]
    );
    assert!(members(&f, false).is_empty());
    // A node without IPv6 cannot join the IPv6 pool: an error naming it, nothing written.
    let before = writes(&f);
    let err = backends
        .ensure_members(&pool_id(&f, true), &[vmas("vm-6"), vmas("vm-0")])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("vm-0"), "{err}");
    assert!(err.to_string().contains("IPv6"), "{err}");
    assert_eq!(writes(&f), before);
}

#[tokio::test]
async fn remove_all_members_empties_the_pool_so_the_load_balancer_can_go() {
    let f = fixture::start().await;
    make_lb(&f);
    let backends = Backends::new(f.client.clone(), f.config.clone());
    let pool = pool_id(&f, false);
    backends
        .ensure_members(&pool, &[vmas("vm-0"), vmss("pool-0", 0), vmss("pool-2", 2)])
        .await
        .unwrap();
    assert_eq!(members(&f, false).len(), 3);

    // ARM refuses while the pool is in use.
    let err =
        f.client.delete("network.load_balancers.delete", &lb_id(&f), NETWORK).await.unwrap_err();
    assert_eq!(err.code(), Some("InUseBackendAddressPoolCannotBeDeleted"), "{err}");

    backends.remove_all_members(&pool).await.unwrap();
    assert!(members(&f, false).is_empty());
    assert_eq!(scale_set_model_pools(&f), json!([]), "the model no longer lists the pool");
    f.client.delete("network.load_balancers.delete", &lb_id(&f), NETWORK).await.unwrap();
    assert!(f.cloud.resource(&lb_id(&f)).is_none());
    // Nothing left to do: fine.
    backends.remove_all_members(&pool).await.unwrap();
}

#[tokio::test]
async fn a_stale_etag_is_read_again_and_redone() {
    let f = fixture::start().await;
    make_lb(&f);
    f.server
        .inject(FaultRule::new(NIC_PUT, Fault::Status { status: 412, body: None }).times(1))
        .unwrap();
    let backends = Backends::new(f.client.clone(), f.config.clone());
    backends.ensure_members(&pool_id(&f, false), &[vmas("vm-0")]).await.unwrap();
    assert_eq!(
        members(&f, false),
        ["Microsoft.Network/networkInterfaces/vm-0-nic/ipConfigurations/ipconfig1"]
    );
    let c = f.server.counters();
    assert_eq!(c.get(NIC_PUT), 2, "the 412 is redone once");
    // Read, (412), read again, and the client's read of the result after the operation.
    assert_eq!(c.get("network.network_interfaces.get"), 3, "the NIC is read again after the 412");
}

#[tokio::test]
async fn a_missing_pool_is_an_error_and_pod_ip_pools_are_refused() {
    let f = fixture::start().await;
    let backends = Backends::new(f.client.clone(), f.config.clone());
    let err = backends.ensure_members(&pool_id(&f, false), &[vmas("vm-0")]).await.unwrap_err();
    assert!(err.to_string().contains("does not exist"), "{err}");
    assert_eq!(writes(&f), 0);

    let mut config = (*f.config).clone();
    config.load_balancer_backend_pool_configuration_type = BackendPoolType::PodIp;
    let backends = Backends::new(f.client.clone(), Arc::new(config));
    match backends.ensure_members(&pool_id(&f, false), &[vmas("vm-0")]).await {
        Err(ProviderError::Invalid { what, .. }) => {
            assert_eq!(what, "loadBalancerBackendPoolConfigurationType")
        }
        other => panic!("{other:?}"),
    }
}

fn with_ips(mut n: Node, ips: &[&str]) -> Node {
    n.status = Some(NodeStatus {
        addresses: Some(
            ips.iter()
                .map(|a| NodeAddress { type_: "InternalIP".into(), address: a.to_string() })
                .collect(),
        ),
        ..Default::default()
    });
    n
}

fn addresses(f: &Fixture, ipv6: bool) -> Vec<(String, String)> {
    let lb = f.cloud.resource(&lb_id(f)).unwrap();
    let want = pool_id(f, ipv6).to_ascii_lowercase();
    let pools = lb["properties"]["backendAddressPools"].as_array().unwrap().clone();
    let pool =
        pools.iter().find(|p| p["id"].as_str().unwrap().to_ascii_lowercase() == want).unwrap();
    pool["properties"]["loadBalancerBackendAddresses"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|a| {
            assert!(
                a["properties"]["virtualNetwork"]["id"]
                    .as_str()
                    .unwrap()
                    .ends_with("/virtualNetworks/vnet")
            );
            (
                a["name"].as_str().unwrap().to_string(),
                a["properties"]["ipAddress"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

#[tokio::test]
async fn node_ip_pools_list_the_nodes_addresses() {
    let f = fixture::start().await;
    make_lb(&f);
    let mut config = (*f.config).clone();
    config.load_balancer_backend_pool_configuration_type = BackendPoolType::NodeIp;
    let backends = Backends::new(f.client.clone(), Arc::new(config));
    let nodes = [
        with_ips(vmas("vm-0"), &["10.240.0.4"]),
        with_ips(vmas("vm-6"), &["10.240.0.8", "fd00::8"]),
        vmas("no-addresses"),
    ];
    backends.ensure_members(&pool_id(&f, false), &nodes).await.unwrap();
    backends.ensure_members(&pool_id(&f, true), &nodes).await.unwrap();
    assert_eq!(
        addresses(&f, false),
        [
            ("vm-0".to_string(), "10.240.0.4".to_string()),
            ("vm-6".to_string(), "10.240.0.8".to_string())
        ]
    );
    assert_eq!(addresses(&f, true), [("vm-6-ipv6".to_string(), "fd00::8".to_string())]);
    assert_eq!(writes(&f), 0, "no NIC or scale-set writes");
    let lb_puts = || f.server.counters().get("network.load_balancers.create_or_update");
    assert_eq!(lb_puts(), 2);
    backends.ensure_members(&pool_id(&f, false), &nodes).await.unwrap();
    assert_eq!(lb_puts(), 2, "a re-sync with no change writes nothing");
    backends.ensure_members(&pool_id(&f, false), &nodes[1..]).await.unwrap();
    assert_eq!(addresses(&f, false), [("vm-6".to_string(), "10.240.0.8".to_string())]);
}

#[tokio::test]
async fn scale_set_vms_join_eight_at_a_time() {
    // The emulator asks for a 1 s Retry-After before polling each write's operation, so N
    // writes one at a time take at least N seconds.
    const N: u32 = 48;
    let mut world = String::from("region: eastus\ninstances:\n");
    for i in 0..N {
        world.push_str(&format!("  - {{name: big-{i}, zone: \"1\", tags: {{azure.vmss: big}}}}\n"));
    }
    let opts = ccm_emulators::azure::AzureOptions {
        lro: std::time::Duration::from_millis(50),
        ..Default::default()
    };
    let f = fixture::start_with(&world, opts, |_| {}).await;
    make_lb(&f);
    let backends = Backends::new(f.client.clone(), f.config.clone());
    let nodes: Vec<Node> = (0..N)
        .map(|i| node(&format!("big-{i}"), Some(&fixture::vmss_provider_id("big", i))))
        .collect();
    let started = std::time::Instant::now();
    backends.ensure_members(&pool_id(&f, false), &nodes).await.unwrap();
    let took = started.elapsed();
    assert_eq!(members(&f, false).len(), N as usize);
    let c = f.server.counters();
    assert_eq!(c.get(VMSS_VM_PUT), u64::from(N));
    assert_eq!(c.get(VMSS_PUT), 1);
    // Not a speed target: one write at a time cannot finish in under N seconds (the Retry-After
    // floor above), whatever the machine, so finishing below it proves the writes overlapped.
    // (The bound was N/3 s once and failed at 16.6 s on a machine loaded ~10× its cores.)
    assert!(
        took < std::time::Duration::from_secs(u64::from(N)),
        "took {took:?}: no faster than {N} writes one at a time"
    );
    eprintln!("{N} scale-set VMs joined in {took:?} ({} calls)", c.total);
    let writes_before = writes(&f);
    backends.ensure_members(&pool_id(&f, false), &nodes).await.unwrap();
    assert_eq!(writes(&f), writes_before);
}

/// Issue #29 (LOW): the shared pool may hold the operator's own members (a VM that is not a
/// Node, an appliance's address); only members the cluster can prove are its Nodes' leave.
#[tokio::test]
async fn an_operators_own_members_of_the_shared_pool_are_kept() {
    let f = fixture::start().await;
    make_lb(&f);
    let backends = Backends::new(f.client.clone(), f.config.clone());
    let pool = pool_id(&f, false);
    backends.ensure_members(&pool, &[vmas("vm-0"), vmas("vm-1")]).await.unwrap();
    // The operator puts vm-2 (not a Node: a bastion, an appliance) into the cluster's pool.
    let nic_id = f
        .client
        .resource_id(RESOURCE_GROUP, "Microsoft.Network/networkInterfaces", "vm-2-nic")
        .unwrap();
    let mut nic = f.cloud.resource(&nic_id).unwrap();
    nic["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"] =
        json!([{"id": pool}]);
    f.cloud.put_resource(&nic_id, nic).unwrap();
    let operators = "Microsoft.Network/networkInterfaces/vm-2-nic/ipConfigurations/ipconfig1";
    assert_eq!(members(&f, false).len(), 3);

    // vm-1 (a Node this process put in) leaves; the operator's member stays.
    backends.ensure_members(&pool, &[vmas("vm-0")]).await.unwrap();
    assert_eq!(
        members(&f, false),
        ["Microsoft.Network/networkInterfaces/vm-0-nic/ipConfigurations/ipconfig1", operators]
    );
    // After a restart (nothing remembered) too.
    let restarted = Backends::new(f.client.clone(), f.config.clone());
    restarted.ensure_members(&pool, &[vmas("vm-0")]).await.unwrap();
    assert!(members(&f, false).contains(&operators.to_string()), "{:?}", members(&f, false));

    // nodeIP pools: the operator's own address stays, a Node's that left goes.
    let mut config = (*f.config).clone();
    config.load_balancer_backend_pool_configuration_type = BackendPoolType::NodeIp;
    let by_ip = Backends::new(f.client.clone(), Arc::new(config));
    let v6 = pool_id(&f, true);
    let nodes = [with_ips(vmas("vm-0"), &["fd00::4"]), with_ips(vmas("vm-6"), &["fd00::8"])];
    by_ip.ensure_members(&v6, &nodes).await.unwrap();
    let mut lb = f.cloud.resource(&lb_id(&f)).unwrap();
    for p in lb["properties"]["backendAddressPools"].as_array_mut().unwrap() {
        if p["id"].as_str().unwrap().eq_ignore_ascii_case(&v6) {
            p["properties"]["loadBalancerBackendAddresses"].as_array_mut().unwrap().push(json!({
                "name": "appliance",
                "properties": {"ipAddress": "fd00::99", "virtualNetwork": {"id": format!("/subscriptions/{}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Network/virtualNetworks/vnet", fixture::SUBSCRIPTION)}},
            }));
        }
    }
    f.cloud.put_resource(&lb_id(&f), lb).unwrap();
    by_ip.ensure_members(&v6, &nodes[1..]).await.unwrap();
    assert_eq!(
        addresses(&f, true),
        [
            ("vm-6-ipv6".to_string(), "fd00::8".to_string()),
            ("appliance".to_string(), "fd00::99".to_string())
        ]
    );
}
