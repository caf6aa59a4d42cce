//! The ARM read budget (issue #33 item 10): a sync that changes nothing reads a bounded
//! number of ARM resources whatever the number of Nodes (the pool's own
//! `backendIPConfigurations` and the cached VM listing decide membership; a NIC is read only
//! when it must change); listings are kept across Service syncs with upstream's TTL keys
//! (`vmCacheTTLInSeconds`, `publicIPCacheTTLInSeconds`, `loadBalancerCacheTTLInSeconds`,
//! `nsgCacheTTLInSeconds`; `disableAPICallCache`) and dropped by our own writes; and the
//! benchmark behind `ci/bench-azure-reads` (an ignored test) printing ARM reads per hour at
//! 1000 Nodes × 100 Services against ARM's documented limits.

use std::time::{Duration, Instant};

use ccm_core::cloud::{InstancesV2, LoadBalancer, Routes};
use ccm_emulators::azure::AzureOptions;
use ccm_provider_azure::config::Config;
use ccm_provider_azure::instances::AzureInstances;
use ccm_provider_azure::load_balancer::AzureLoadBalancer;
use ccm_provider_azure::routes::AzureRoutes;
use k8s_openapi::api::core::v1::{Node, Service};

use crate::fixture::{self, CLUSTER, Fixture, node};
use crate::load_balancer::svc;

/// Whether an emulator operation is an ARM read as ARM counts them (a GET under a
/// subscription: resources, listings and their pages, instance views, operation polls).
fn is_read(op: &str) -> bool {
    let arm = op.starts_with("compute.")
        || op.starts_with("network.")
        || op.starts_with("resources.")
        || op.starts_with("arm.operation");
    let get = [".get", ".list", ".list_all", ".instance_view"].iter().any(|v| op.ends_with(v))
        || op.contains(".list_")
        || op.contains(".get_");
    arm && get
}

/// Whether an emulator operation is an ARM write (PUT, PATCH or DELETE).
fn is_write(op: &str) -> bool {
    (op.starts_with("compute.") || op.starts_with("network."))
        && [".create_or_update", ".update", ".delete"].iter().any(|v| op.ends_with(v))
}

/// ARM reads so far.
fn reads(f: &Fixture) -> u64 {
    f.server.counters().operations.iter().filter(|(op, _)| is_read(op)).map(|(_, n)| n).sum()
}

/// ARM writes so far.
fn writes(f: &Fixture) -> u64 {
    f.server.counters().operations.iter().filter(|(op, _)| is_write(op)).map(|(_, n)| n).sum()
}

/// Reads of what the caches keep (load balancer, public IP and security group GETs, VM and
/// public IP listings).
fn cached_reads(f: &Fixture) -> u64 {
    let c = f.server.counters();
    [
        "network.load_balancers.get",
        "network.public_ip_addresses.get",
        "network.public_ip_addresses.list",
        "network.network_security_groups.get",
        "compute.virtual_machines.list",
    ]
    .iter()
    .map(|op| c.get(op))
    .sum()
}

/// Upstream's TTL keys as an operator sets them to cache everything.
fn upstream_ttls(c: &mut Config) {
    c.vm_cache_ttl_in_seconds = Some(60);
    c.public_ip_cache_ttl_in_seconds = Some(120);
    c.load_balancer_cache_ttl_in_seconds = Some(120);
    c.nsg_cache_ttl_in_seconds = Some(120);
}

async fn start(edit: impl FnOnce(&mut Config)) -> Fixture {
    let opts = AzureOptions { lro: Duration::from_millis(20), ..AzureOptions::default() };
    fixture::start_with(fixture::WORLD, opts, edit).await
}

fn two_nodes() -> Vec<Node> {
    ["vm-0", "vm-1"].iter().map(|n| node(n, Some(&fixture::vm_provider_id(n)))).collect()
}

const UID: &str = "3a9b1c2d-1111-4222-8333-944455556666";

/// A world of `n` availability-set VMs `node-<i>` (one NIC each) in one subnet.
fn world(n: usize) -> String {
    let mut w = String::from(
        "region: eastus\nnetworks:\n  - {name: vnet, cidr: 10.0.0.0/8}\nsubnets:\n  - {name: subnet, network: vnet, zone: \"1\", cidr: 10.240.0.0/16}\ninstances:\n",
    );
    for i in 0..n {
        w.push_str(&format!(
            "  - {{name: node-{i}, zone: \"1\", private_ips: [10.240.{}.{}]}}\n",
            i / 250,
            4 + i % 250
        ));
    }
    w
}

/// The Nodes of [`world`]'s VMs `0..n`.
fn world_nodes(n: usize) -> Vec<Node> {
    (0..n)
        .map(|i| {
            let name = format!("node-{i}");
            node(&name, Some(&fixture::vm_provider_id(&name)))
        })
        .collect()
}

/// `k` Services of one TCP port each.
fn services(k: usize) -> Vec<Service> {
    (0..k)
        .map(|i| {
            svc(
                &format!("0000{i:04}-1111-4222-8333-944455556666"),
                &format!("s{i}"),
                &[(80, "TCP")],
                &[],
            )
        })
        .collect()
}

/// Reads and writes of a re-sync of every Service (the service controller's node sync:
/// `UpdateLoadBalancer` for each, then `EnsureLoadBalancer` for each as on a Service
/// change) with unchanged `nodes`, and the NIC GETs among the reads.
async fn resync(
    f: &Fixture,
    lbs: &AzureLoadBalancer,
    svcs: &[Service],
    nodes: &[Node],
) -> (u64, u64, u64) {
    let (r, w, nic) =
        (reads(f), writes(f), f.server.counters().get("network.network_interfaces.get"));
    for s in svcs {
        lbs.update_load_balancer(CLUSTER, s, nodes).await.unwrap();
    }
    for s in svcs {
        lbs.ensure_load_balancer(CLUSTER, s, nodes).await.unwrap();
    }
    (reads(f) - r, writes(f) - w, f.server.counters().get("network.network_interfaces.get") - nic)
}

#[tokio::test]
async fn a_resync_that_changes_nothing_reads_the_same_for_5_or_60_nodes_and_no_nic() {
    let svcs = services(3);
    let mut seen = Vec::new();
    for m in [5usize, 60] {
        let opts = AzureOptions { lro: Duration::from_millis(5), ..AzureOptions::default() };
        let f = fixture::start_with(&world(m), opts, |_| {}).await;
        let lbs = AzureLoadBalancer::new(f.client.clone(), f.config.clone());
        let nodes = world_nodes(m);
        for s in &svcs {
            lbs.ensure_load_balancer(CLUSTER, s, &nodes).await.unwrap();
        }
        let joined = f.server.counters().get("network.network_interfaces.create_or_update");
        assert_eq!(joined, m as u64, "each Node's NIC joined the pool once");
        let (r, w, nic) = resync(&f, &lbs, &svcs, &nodes).await;
        eprintln!("{m} nodes x {} services: a no-change resync read {r}, wrote {w}", svcs.len());
        assert_eq!(w, 0, "a re-sync with nothing to change writes nothing");
        assert_eq!(nic, 0, "a re-sync with nothing to change reads no Node's NIC");
        seen.push(r);
    }
    assert_eq!(seen[0], seen[1], "a no-change re-sync reads as much for 60 Nodes as for 5");
    // Bounded per Service: its load balancer (read before any write), the security group
    // and, for a public Service, its public IP; nothing per Node.
    assert!(seen[0] <= 8 * 3 * 2, "reads per no-change re-sync of 3 Services: {}", seen[0]);
}

/// `UpdateLoadBalancer` of every Service with `nodes` (the service controller's node sync):
/// the NIC GETs and PUTs it cost.
async fn update_all(
    f: &Fixture,
    lbs: &AzureLoadBalancer,
    svcs: &[Service],
    nodes: &[Node],
) -> (u64, u64) {
    let (get, put) =
        ("network.network_interfaces.get", "network.network_interfaces.create_or_update");
    let c0 = f.server.counters();
    for s in svcs {
        lbs.update_load_balancer(CLUSTER, s, nodes).await.unwrap();
    }
    let c1 = f.server.counters();
    eprintln!("counters after a node sync: {:?}", c1.operations);
    (c1.get(get) - c0.get(get), c1.get(put) - c0.get(put))
}

#[tokio::test]
async fn a_node_joining_reads_and_writes_only_its_own_nic() {
    let m = 40;
    let opts = AzureOptions { lro: Duration::from_millis(5), ..AzureOptions::default() };
    let f = fixture::start_with(&world(m + 1), opts, |_| {}).await;
    let lbs = AzureLoadBalancer::new(f.client.clone(), f.config.clone());
    let svcs = services(2);
    let mut nodes = world_nodes(m);
    for s in &svcs {
        lbs.ensure_load_balancer(CLUSTER, s, &nodes).await.unwrap();
    }
    // A Node joins (its VM is in the cached listing): membership costs its own NIC's PUT
    // once for all Services (they share the pool) and at most one read of it per Service
    // sync, whatever the number of Nodes.
    nodes = world_nodes(m + 1);
    let (gets, puts) = update_all(&f, &lbs, &svcs, &nodes).await;
    assert!((1..=svcs.len() as u64).contains(&gets), "only the joining Node's NIC is read");
    assert_eq!(puts, 1, "only the joining Node's NIC is written");
    let joined = f
        .cloud
        .resource(&f.cloud.id("Microsoft.Network/networkInterfaces", &format!("node-{m}-nic")))
        .unwrap();
    let pools = &joined["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"];
    assert_eq!(pools.as_array().map(Vec::len), Some(1), "the node joined the pool: {joined}");
    // A Node leaves: only its NIC is read and rewritten.
    let left = nodes.remove(m - 1);
    assert_eq!(left.metadata.name.as_deref(), Some(format!("node-{}", m - 1).as_str()));
    let (gets, puts) = update_all(&f, &lbs, &svcs, &nodes).await;
    // (A Service synced before ARM's back-reference caught up may read it once more.)
    assert!((1..=svcs.len() as u64).contains(&gets), "only the leaving Node's NIC is read");
    assert_eq!(puts, 1, "only the leaving Node's NIC is written");
    let nic = f
        .cloud
        .resource(
            &f.cloud.id("Microsoft.Network/networkInterfaces", &format!("node-{}-nic", m - 1)),
        )
        .unwrap();
    let pools =
        &nic["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"];
    assert!(pools.as_array().is_none_or(|p| p.is_empty()), "the node left the pool: {nic}");
}

/// ARM reads of one Node leaving, then joining again, with `k` Services on the shared load
/// balancer (the service controller's node sync: `UpdateLoadBalancer` for each), by
/// operation (operation polls left out: their number follows timing); and whether the pool held the right NICs after each.
async fn reads_per_node_change(k: usize) -> Vec<(String, u64)> {
    let m = 12;
    let opts = AzureOptions { lro: Duration::from_millis(5), ..AzureOptions::default() };
    // The VM listing's TTL out of the way (wall time on a loaded machine): what is counted
    // is what each Service's sync reads.
    let f = fixture::start_with(&world(m), opts, |c| c.vm_cache_ttl_in_seconds = Some(3600)).await;
    let lbs = AzureLoadBalancer::new(f.client.clone(), f.config.clone());
    let svcs = services(k);
    let mut nodes = world_nodes(m);
    for s in &svcs {
        lbs.ensure_load_balancer(CLUSTER, s, &nodes).await.unwrap();
    }
    let in_pool = |i: usize| {
        let nic = f
            .cloud
            .resource(&f.cloud.id("Microsoft.Network/networkInterfaces", &format!("node-{i}-nic")))
            .unwrap();
        nic["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"]
            .as_array()
            .is_some_and(|p| !p.is_empty())
    };
    assert!(in_pool(m - 1));
    let c0 = f.server.counters();
    let left = nodes.pop().unwrap();
    for s in &svcs {
        lbs.update_load_balancer(CLUSTER, s, &nodes).await.unwrap();
    }
    assert!(!in_pool(m - 1), "the Node that left is out of the pool");
    nodes.push(left);
    for s in &svcs {
        lbs.update_load_balancer(CLUSTER, s, &nodes).await.unwrap();
    }
    assert!(in_pool(m - 1), "the Node that came back is in the pool again");
    let c1 = f.server.counters();
    let mut by_op: Vec<(String, u64)> = c1
        .operations
        .iter()
        .filter(|(op, _)| is_read(op) && !op.starts_with("arm.operation"))
        .map(|(op, n)| (op.clone(), n - c0.get(op)))
        .filter(|(_, n)| *n > 0)
        .collect();
    by_op.sort();
    by_op
}

#[tokio::test]
async fn reads_per_node_change_do_not_grow_with_the_number_of_services() {
    let two = reads_per_node_change(2).await;
    let eight = reads_per_node_change(8).await;
    let total = |v: &[(String, u64)]| v.iter().map(|(_, n)| n).sum::<u64>();
    eprintln!("a Node leaving and joining again, 2 Services: {two:?}; 8 Services: {eight:?}");
    // Per change: the shared load balancer read once after each of our NIC writes (its
    // pools' back-references changed), the changed Node's NIC read before its write; the
    // other Services' syncs are answered from the read cache.
    assert_eq!(two, eight, "reads per Node change are the same for 2 or 8 Services");
    assert!(total(&eight) <= 6, "reads for two Node changes: {eight:?}");
}

/// A world of `m` VMs whose last VM's NIC is in the pool of another cluster's load balancer
/// `othercluster` (ARM refuses one IP configuration in two Standard load balancers' pools):
/// the fixture, and that NIC's ID.
async fn world_with_a_foreign_member(
    m: usize,
    edit: impl FnOnce(&mut Config),
) -> (Fixture, String) {
    let opts = AzureOptions { lro: Duration::from_millis(5), ..AzureOptions::default() };
    let f = fixture::start_with(&world(m), opts, edit).await;
    let other_lb = f.cloud.id("Microsoft.Network/loadBalancers", "othercluster");
    let other_pool = format!("{other_lb}/backendAddressPools/othercluster");
    f.cloud
        .put_resource(
            &other_lb,
            serde_json::json!({
                "location": "eastus",
                "sku": {"name": "Standard"},
                "properties": {"backendAddressPools": [{"name": "othercluster", "id": other_pool}]},
            }),
        )
        .unwrap();
    let nic_id = f.cloud.id("Microsoft.Network/networkInterfaces", &format!("node-{}-nic", m - 1));
    let mut nic = f.cloud.resource(&nic_id).unwrap();
    nic["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"] =
        serde_json::json!([{"id": other_pool}]);
    f.cloud.put_resource(&nic_id, nic).unwrap();
    (f, nic_id)
}

#[tokio::test]
async fn a_node_arm_keeps_out_of_the_pool_is_read_once_per_ttl_not_once_per_sync() {
    let m = 6;
    let svcs = services(3);
    let nodes = world_nodes(m);
    let (f, nic_id) = world_with_a_foreign_member(m, |_| {}).await;
    let lbs = AzureLoadBalancer::new(f.client.clone(), f.config.clone());
    for s in &svcs {
        lbs.ensure_load_balancer(CLUSTER, s, &nodes).await.unwrap();
    }
    let nic_get = "network.network_interfaces.get";
    let before = f.server.counters().get(nic_get);
    for _ in 0..3 {
        let (_, w, _) = resync(&f, &lbs, &svcs, &nodes).await;
        assert_eq!(w, 0, "nothing to write");
    }
    assert_eq!(
        f.server.counters().get(nic_get) - before,
        0,
        "the NIC in another load balancer's pool is not read again by every Service's sync"
    );
    // It stayed where it was: in the other cluster's pool only.
    let nic = f.cloud.resource(&nic_id).unwrap();
    let pools =
        nic["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"]
            .as_array()
            .cloned()
            .unwrap_or_default();
    assert_eq!(pools.len(), 1, "{nic}");
    assert!(pools[0]["id"].as_str().unwrap().contains("/othercluster/"), "{nic}");

    // With caching off (disableAPICallCache) nothing is remembered: each sync reads it.
    let (g, _) = world_with_a_foreign_member(m, |c| c.disable_api_call_cache = true).await;
    let lbs = AzureLoadBalancer::new(g.client.clone(), g.config.clone());
    for s in &svcs {
        lbs.ensure_load_balancer(CLUSTER, s, &nodes).await.unwrap();
    }
    let (_, _, nic_reads) = resync(&g, &lbs, &svcs, &nodes).await;
    assert_eq!(nic_reads, 2 * svcs.len() as u64, "uncached: one read per Service sync");
}

/// Reads of what the caches keep, and of everything, in `n` syncs of an unchanged Service
/// after its first.
async fn idle_reads(f: &Fixture, lbs: &AzureLoadBalancer, s: &Service, n: usize) -> (u64, u64) {
    let (cached, all) = (cached_reads(f), reads(f));
    for _ in 0..n {
        lbs.ensure_load_balancer(CLUSTER, s, &two_nodes()).await.unwrap();
    }
    (cached_reads(f) - cached, reads(f) - all)
}

#[tokio::test]
async fn reads_do_not_grow_with_syncs_within_the_ttl_and_our_writes_invalidate() {
    let f = start(upstream_ttls).await;
    let lbs = AzureLoadBalancer::new(f.client.clone(), f.config.clone());
    let s = svc(UID, "web", &[(80, "TCP")], &[]);
    lbs.ensure_load_balancer(CLUSTER, &s, &two_nodes()).await.unwrap();

    let (one, one_all) = idle_reads(&f, &lbs, &s, 1).await;
    let ops0 = f.server.counters();
    let (ten, ten_all) = idle_reads(&f, &lbs, &s, 10).await;
    let ops1 = f.server.counters();
    let lb_gets = ops1.get("network.load_balancers.get") - ops0.get("network.load_balancers.get");
    eprintln!(
        "TTL caches: cached kinds read {one} by 1 idle sync, {ten} by 10 more ({lb_gets} load balancer GETs); all reads {one_all}, {ten_all}"
    );
    // What is left is the load balancer's read before its write (ETag, `If-Match`): one per
    // sync; no public IP, NSG or VM listing read within the TTL.
    assert_eq!(lb_gets, 10, "one load balancer read per sync");
    assert_eq!(ten, lb_gets, "within the TTL, idle syncs read no public IP, NSG or VM list");
    assert_eq!(ten_all % 10, 0, "each idle sync reads the same: {ten_all}");

    // Our own write (a port change) drops what it changed: the next sync reads again and
    // sees the new rule; after it, idle syncs read nothing cached again.
    let changed = svc(UID, "web", &[(80, "TCP"), (443, "TCP")], &[]);
    let before = reads(&f);
    lbs.ensure_load_balancer(CLUSTER, &changed, &two_nodes()).await.unwrap();
    assert!(reads(&f) > before, "the write's sync read the load balancer again");
    let (after_write, _) = idle_reads(&f, &lbs, &changed, 1).await;
    let lb = crate::load_balancer::lb(&f, CLUSTER).unwrap();
    let rules: Vec<&str> = lb["properties"]["loadBalancingRules"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|r| r["name"].as_str())
        .collect();
    assert!(rules.iter().any(|r| r.ends_with("-TCP-443")), "{rules:?}");
    assert_eq!(idle_reads(&f, &lbs, &changed, 5).await.0, 5, "after {after_write}");
    assert!(f.client.cache_hits() > 0);

    // The same without caches (disableAPICallCache): every sync reads again.
    let g = start(|c| {
        upstream_ttls(c);
        c.disable_api_call_cache = true;
    })
    .await;
    let lbs = AzureLoadBalancer::new(g.client.clone(), g.config.clone());
    lbs.ensure_load_balancer(CLUSTER, &s, &two_nodes()).await.unwrap();
    let (uncached_one, _) = idle_reads(&g, &lbs, &s, 1).await;
    let (uncached_ten, _) = idle_reads(&g, &lbs, &s, 10).await;
    eprintln!(
        "no caches: cached kinds read {uncached_one} by 1 idle sync, {uncached_ten} by 10 more"
    );
    assert!(uncached_one > 0 && uncached_ten == 10 * uncached_one);
}

#[tokio::test]
async fn listings_are_cached_by_default_and_node_lifecycle_reads_afresh() {
    let f = start(|_| {}).await;
    let c = &f.client;
    let ttls = c.cache_ttls();
    assert_eq!((ttls.vm, ttls.public_ip_list), (Duration::from_secs(60), Duration::from_secs(120)));
    assert_eq!(ttls.load_balancer, Duration::ZERO, "load balancers read before every write");
    let vms =
        c.collection_id(fixture::RESOURCE_GROUP, "Microsoft.Compute/virtualMachines").unwrap();
    let op = "compute.virtual_machines.list";
    let v = ccm_provider_azure::client::api_version::COMPUTE;
    let n0 = f.server.counters().get(op);
    let a: Vec<serde_json::Value> = c.list(op, &vms, v, &[]).await.unwrap();
    let b: Vec<serde_json::Value> = c.list(op, &vms, v, &[]).await.unwrap();
    assert_eq!(a, b);
    assert_eq!(f.server.counters().get(op) - n0, 1, "the second listing came from the cache");
    // A fresh listing (what decides that a VM is gone) always asks ARM, and refreshes the
    // cache: a plain listing after it is answered from it.
    let _: Vec<serde_json::Value> =
        c.list_fresh(op, &vms, v, &[("$expand", "instanceView")]).await.unwrap();
    let _: Vec<serde_json::Value> = c.list(op, &vms, v, &[]).await.unwrap();
    assert_eq!(f.server.counters().get(op) - n0, 2);
}

/// ARM's documented subscription read limit in the classic model: 12,000 reads per hour
/// per subscription and security principal.
const ARM_READS_PER_HOUR: f64 = 12_000.0;
/// ARM's regional token bucket (since 2024): per subscription, principal and operation
/// type, 250 reads at once, refilled at 25 per second (90,000 per hour sustained).
const ARM_BUCKET_READS_PER_HOUR: f64 = 25.0 * 3600.0;

fn env_or(var: &str, default: u64) -> u64 {
    std::env::var(var).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// What one measured window did.
struct Window {
    secs: f64,
    reads: u64,
    writes: u64,
    nic_gets: u64,
    by_op: Vec<(String, u64)>,
}

impl Window {
    fn per_hour(&self, n: u64) -> f64 {
        n as f64 * 3600.0 / self.secs
    }

    fn print(&self, label: &str) {
        let (r, w) = (self.per_hour(self.reads), self.per_hour(self.writes));
        println!(
            "  {label}: {:.0} s, {} reads ({} NIC GETs), {} writes -> {r:.0} reads/h = {:.1} % of {ARM_READS_PER_HOUR:.0}/h ({:.2} % of the bucket's {ARM_BUCKET_READS_PER_HOUR:.0}/h), {w:.0} writes/h",
            self.secs,
            self.reads,
            self.nic_gets,
            self.writes,
            100.0 * r / ARM_READS_PER_HOUR,
            100.0 * r / ARM_BUCKET_READS_PER_HOUR,
        );
        let ops: Vec<String> = self.by_op.iter().map(|(op, n)| format!("{op} {n}")).collect();
        println!("    reads by operation: {}", ops.join(", "));
    }
}

/// The controllers' periodic cloud calls over `secs` seconds of real time (the TTL caches
/// run on real time): the route controller lists routes every 10 s, the cloud-node
/// controller refreshes every Node's addresses every 5 min (one batched pass), the
/// lifecycle controller asks nothing about Ready Nodes; every `churn` seconds (0: never) a
/// Node leaves or joins again, and the service controller updates every Service's load
/// balancer with the new node set (and a joining Node's first sync looks it up).
async fn window(
    f: &Fixture,
    p: (&AzureLoadBalancer, &AzureInstances, &AzureRoutes),
    svcs: &[Service],
    all_nodes: &[Node],
    secs: u64,
    churn: u64,
) -> Window {
    let (lbs, instances, routes) = p;
    let c0 = f.server.counters();
    let started = Instant::now();
    let mut nodes = all_nodes.to_vec();
    let mut leaving = true;
    for t in 0..secs {
        let tick = started + Duration::from_secs(t);
        tokio::time::sleep_until(tick.into()).await;
        if t % 10 == 0 {
            routes.list_routes(CLUSTER).await.unwrap();
        }
        if t % 300 == 0 {
            for r in instances.instance_metadata_batch(&nodes).await {
                r.unwrap();
            }
        }
        if churn > 0 && t > 0 && t % churn == 0 {
            if leaving {
                nodes.pop();
            } else {
                let back = all_nodes[all_nodes.len() - 1].clone();
                instances.instance_metadata(&back).await.unwrap();
                nodes.push(back);
            }
            leaving = !leaving;
            for s in svcs {
                lbs.update_load_balancer(CLUSTER, s, &nodes).await.unwrap();
            }
        }
    }
    tokio::time::sleep_until((started + Duration::from_secs(secs)).into()).await;
    let c1 = f.server.counters();
    let mut by_op: Vec<(String, u64)> = c1
        .operations
        .iter()
        .filter(|(op, _)| is_read(op))
        .map(|(op, n)| (op.clone(), n - c0.get(op)))
        .filter(|(_, n)| *n > 0)
        .collect();
    by_op.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
    let sum = |pred: fn(&str) -> bool| -> u64 {
        c1.operations.iter().filter(|(op, _)| pred(op)).map(|(op, n)| n - c0.get(op)).sum()
    };
    Window {
        secs: started.elapsed().as_secs_f64(),
        reads: sum(is_read),
        writes: sum(is_write),
        nic_gets: c1.get("network.network_interfaces.get")
            - c0.get("network.network_interfaces.get"),
        by_op,
    }
}

/// `ci/bench-azure-reads`: `AZURE_BENCH_NODES` VMs (1000), `AZURE_BENCH_SERVICES` public
/// Services (100) on the shared load balancer, the emulator's list pages of
/// `AZURE_BENCH_PAGE` (50); Nodes initialised and every Service created, then an idle
/// window and a churn window (a Node leaving or joining every `AZURE_BENCH_CHURN_SECS`, 60)
/// of `AZURE_BENCH_WINDOW_SECS` (300) each, with the default caches and with
/// `disableAPICallCache` (`AZURE_BENCH_CACHES`: `default` or `off` for one of them); reads
/// and writes per hour against ARM's limits.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "benchmark: ci/bench-azure-reads"]
async fn bench_arm_reads_per_hour_at_1000_nodes_and_100_services() {
    let n_nodes = env_or("AZURE_BENCH_NODES", 1000) as usize;
    let n_services = env_or("AZURE_BENCH_SERVICES", 100) as usize;
    let page = env_or("AZURE_BENCH_PAGE", 50) as usize;
    let secs = env_or("AZURE_BENCH_WINDOW_SECS", 300);
    let churn = env_or("AZURE_BENCH_CHURN_SECS", 60);
    let w = world(n_nodes);
    let nodes = world_nodes(n_nodes);
    let svcs = services(n_services);
    println!(
        "ARM reads: {n_nodes} Nodes x {n_services} Services, list pages of {page}, windows of {secs} s, churn every {churn} s"
    );
    // `AZURE_BENCH_CACHES`: `default`, `off` (disableAPICallCache) or both (unset).
    let which = std::env::var("AZURE_BENCH_CACHES").unwrap_or_default();
    for (label, no_cache) in [("default caches", false), ("disableAPICallCache", true)] {
        if (which == "default" && no_cache) || (which == "off" && !no_cache) {
            continue;
        }
        let opts = AzureOptions {
            lro: Duration::from_millis(1),
            page_size: page,
            ..AzureOptions::default()
        };
        let f = fixture::start_with(&w, opts, |c| c.disable_api_call_cache = no_cache).await;
        let lbs = AzureLoadBalancer::new(f.client.clone(), f.config.clone());
        let instances = AzureInstances::new(f.client.clone(), f.config.clone());
        let routes = AzureRoutes::new(f.client.clone(), f.config.clone());
        let started = Instant::now();
        for r in instances.instance_metadata_batch(&nodes).await {
            r.unwrap();
        }
        let init = (reads(&f), started.elapsed().as_secs_f64());
        for s in &svcs {
            lbs.ensure_load_balancer(CLUSTER, s, &nodes).await.unwrap();
        }
        println!(
            "{label}: Nodes initialised in {:.1} s ({} reads); {n_services} Services created in {:.1} s ({} reads, {} writes in all)",
            init.1,
            init.0,
            started.elapsed().as_secs_f64() - init.1,
            reads(&f) - init.0,
            writes(&f)
        );
        let (r, wr, nic) = resync(&f, &lbs, &svcs, &nodes).await;
        println!(
            "  a no-change resync of every Service (update + ensure): {r} reads ({nic} NIC GETs), {wr} writes"
        );
        let p = (&lbs, &instances, &routes);
        window(&f, p, &svcs, &nodes, secs, 0).await.print("idle");
        let churned = window(&f, p, &svcs, &nodes, secs, churn).await;
        churned.print(&format!("churn (a Node leaves or joins every {churn} s)"));
    }
}
