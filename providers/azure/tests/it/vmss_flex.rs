//! Flexible scale sets (issue #33 item 8), with the core service controller on the testbed's
//! real kube-apiserver: Nodes on a flexible scale set's VMs join the backend pool through
//! their NICs and the scale set's model lists the pool, so an instance the scale set adds
//! later is in the pool at once (before any Node or sync); a Node that goes leaves the pool;
//! when the Service goes, the pool is taken out of every scale-set model that lists it —
//! flexible and uniform alike, whatever `vmType` says — so ARM lets the load balancer go.

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::CloudProvider;
use ccm_core::manager::CancellationToken;
use ccm_emulators::azure::AzureOptions;
use ccm_emulators::world::World;
use ccm_provider_azure::AzureProvider;
use ccm_testbed::fixtures::load_balancer_service;
use ccm_testbed::{ControlPlane, unique_name, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Node, NodeSpec, Service};
use kube::api::{DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::fixture::{self, CLUSTER, Fixture, RESOURCE_GROUP};

/// Label that gives this test its own Nodes on the shared control plane.
const GROUP_LABEL: &str = "ccm-test.example.com/group";

/// A flexible scale set `flex` of two VMs and a uniform scale set `pool` of one.
const WORLD: &str = r#"
region: eastus
networks:
  - {name: vnet, cidr: 10.0.0.0/8}
subnets:
  - {name: subnet, network: vnet, zone: "1", cidr: 10.240.0.0/16}
instances:
  - {name: flex-a, zone: "1", private_ips: [10.240.2.4], tags: {azure.vmss-flex: flex}}
  - {name: flex-b, zone: "2", private_ips: [10.240.2.5], tags: {azure.vmss-flex: flex}}
  - {name: pool-0, zone: "1", private_ips: [10.240.1.4], tags: {azure.vmss: pool}}
"#;

/// `azure.json` for the emulator with `vmType`.
fn azure_json(url: &str, vm_type: &str) -> String {
    crate::support::azure_json(url, json!({ "vmType": vm_type }))
}

fn id(f: &Fixture, ty: &str, name: &str) -> String {
    f.client.resource_id(RESOURCE_GROUP, ty, name).unwrap()
}

fn lb_id(f: &Fixture) -> String {
    id(f, "Microsoft.Network/loadBalancers", CLUSTER)
}

fn pool_id(f: &Fixture) -> String {
    format!("{}/backendAddressPools/{CLUSTER}", lb_id(f))
}

/// The pool's members as ARM lists them, as the tails after `/providers/`, sorted; `None`
/// while the load balancer does not exist.
fn members(f: &Fixture) -> Option<Vec<String>> {
    let lb = f.cloud.resource(&lb_id(f))?;
    let want = pool_id(f).to_ascii_lowercase();
    let pool = lb["properties"]["backendAddressPools"]
        .as_array()?
        .iter()
        .find(|p| p["id"].as_str().is_some_and(|i| i.to_ascii_lowercase() == want))?
        .clone();
    let mut out: Vec<String> = pool["properties"]["backendIPConfigurations"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .map(|c| c["id"].as_str().unwrap().split("/providers/").nth(1).unwrap().to_string())
        .collect();
    out.sort();
    Some(out)
}

fn nic_member(vm: &str) -> String {
    format!("Microsoft.Network/networkInterfaces/{vm}-nic/ipConfigurations/ipconfig1")
}

/// The pools a scale set's model lists on its primary IP configuration.
fn model_pools(f: &Fixture, set: &str) -> Value {
    let ss = f.cloud.resource(&id(f, "Microsoft.Compute/virtualMachineScaleSets", set)).unwrap();
    ss["properties"]["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"][0]
        ["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"]
        .clone()
}

fn lists(pools: &Value, pool: &str) -> bool {
    pools
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["id"].as_str().is_some_and(|i| i.eq_ignore_ascii_case(pool)))
}

/// The service controller on `provider`, scoped to `ns` and to Nodes labelled `group`.
fn start_controller(
    client: &Client,
    provider: Arc<dyn CloudProvider>,
    ns: &str,
    group: &str,
) -> CancellationToken {
    crate::support::start_service_controller(
        client,
        provider,
        ns,
        Some(format!("{GROUP_LABEL}={group}")),
    )
}

/// A Node of the VM `vm` (its providerID), in `group`.
async fn vm_node(client: &Client, group: &str, vm: &str) -> String {
    let name = unique_name(vm);
    let node = Node {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            labels: Some([(GROUP_LABEL.to_string(), group.to_string())].into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(fixture::vm_provider_id(vm)),
            ..Default::default()
        }),
        ..Default::default()
    };
    Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap();
    name
}

fn ingress_ip(svc: &Service) -> Option<String> {
    svc.status.as_ref()?.load_balancer.as_ref()?.ingress.as_ref()?.first()?.ip.clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flex_nodes_join_through_their_nics_new_instances_join_at_once_and_both_models_are_cleaned()
{
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let opts = AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() };
    let f = fixture::start_with(WORLD, opts, |_| {}).await;
    let provider = AzureProvider::new(
        Some(azure_json(&f.server.url(), "vmssflex").as_bytes()),
        f.options.clone(),
    )
    .unwrap();

    let ns = unique_name("azure-flex");
    let namespace = Namespace {
        metadata: ObjectMeta { name: Some(ns.clone()), ..Default::default() },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.unwrap();
    let group = unique_name("flex");
    let node_a = vm_node(&client, &group, "flex-a").await;
    let node_b = vm_node(&client, &group, "flex-b").await;
    let stop = start_controller(&client, Arc::new(provider), &ns, &group);

    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    services.create(&PostParams::default(), &load_balancer_service(&ns, "web", 80)).await.unwrap();
    wait_for("the Service's address", Duration::from_secs(60), || async {
        ingress_ip(&services.get("web").await.ok()?)
    })
    .await;
    let pool = pool_id(&f);
    // The Nodes' NICs are in the pool; the flexible scale set's model lists it.
    assert_eq!(members(&f).unwrap(), [nic_member("flex-a"), nic_member("flex-b")]);
    assert!(lists(&model_pools(&f, "flex"), &pool), "{}", model_pools(&f, "flex"));
    let c = f.server.counters();
    assert_eq!(c.get("compute.virtual_machine_scale_sets.create_or_update"), 1, "one model PUT");
    assert_eq!(
        model_pools(&f, "pool"),
        Value::Null,
        "the uniform scale set has no Node: its model is not touched"
    );

    // The scale set adds an instance: in the pool at once, before it is a Node.
    let w = World::parse(
        "instances:\n- {name: flex-c, zone: '1', private_ips: [10.240.2.6], tags: {azure.vmss-flex: flex}}\n",
    )
    .unwrap();
    f.cloud.add_instance(w.instances[0].clone()).unwrap();
    assert_eq!(
        members(&f).unwrap(),
        [nic_member("flex-a"), nic_member("flex-b"), nic_member("flex-c")]
    );

    // flex-b's Node goes: its NIC leaves the pool; flex-c (no Node, not the cluster's to
    // take out) stays.
    Api::<Node>::all(client.clone()).delete(&node_b, &DeleteParams::default()).await.unwrap();
    wait_for("flex-b's NIC out of the pool", Duration::from_secs(60), || async {
        (members(&f)? == [nic_member("flex-a"), nic_member("flex-c")]).then_some(())
    })
    .await;
    assert!(lists(&model_pools(&f, "flex"), &pool), "the model keeps the pool");

    // Upstream, running with vmType vmss before, left the pool in the uniform scale set's
    // model too: ARM refuses to delete a pool any model lists.
    let uniform = id(&f, "Microsoft.Compute/virtualMachineScaleSets", "pool");
    let mut ss = f.cloud.resource(&uniform).unwrap();
    ss["properties"]["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"]
        [0]["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"] =
        json!([{"id": pool}]);
    f.cloud.put_resource(&uniform, ss).unwrap();

    // The Service goes: both models are cleaned, the members taken out, the load balancer
    // deleted, and the finalizer released.
    services.delete("web", &DeleteParams::default()).await.unwrap();
    wait_for("the Service gone with its load balancer", Duration::from_secs(60), || async {
        (services.get_opt("web").await.ok()?.is_none() && f.cloud.resource(&lb_id(&f)).is_none())
            .then_some(())
    })
    .await;
    for set in ["flex", "pool"] {
        assert!(!lists(&model_pools(&f, set), &pool), "{set}: {}", model_pools(&f, set));
    }
    for vm in ["flex-a", "flex-b", "flex-c"] {
        let nic = f
            .cloud
            .resource(&id(&f, "Microsoft.Network/networkInterfaces", &format!("{vm}-nic")))
            .unwrap();
        assert!(
            !lists(
                &nic["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"],
                &pool
            ),
            "{vm}: {nic}"
        );
    }

    stop.cancel();
    let _ = services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await;
    let _ = Api::<Node>::all(client.clone()).delete(&node_a, &DeleteParams::default()).await;
}
