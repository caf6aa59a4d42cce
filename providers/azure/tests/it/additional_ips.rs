//! `azure-additional-public-ips` in the security rules (issue #33 item 9), with the core
//! service controller on the testbed's real kube-apiserver: with `allowAdditionalPublicIPs`,
//! an operator's public IP (a firewall's) is a destination of the Service's own allow rule
//! next to its frontend IP, and in its status; taken out of the annotation, it leaves the
//! rule and the status; a value that is not an IP address is a Warning event naming the
//! annotation, and the rules stay as they were. An operator's rule is never touched.

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::CloudProvider;
use ccm_core::manager::CancellationToken;
use ccm_emulators::azure::AzureOptions;
use ccm_provider_azure::AzureProvider;
use ccm_testbed::fixtures::load_balancer_service;
use ccm_testbed::{ControlPlane, unique_name, wait_for};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, NodeSpec, Service};
use kube::api::{DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Api, Client};
use serde_json::json;

use crate::fixture::{self, NSG, RESOURCE_GROUP};

const ADDITIONAL: &str = "service.beta.kubernetes.io/azure-additional-public-ips";
const GROUP_LABEL: &str = "ccm-test.example.com/group";
const FIREWALL_IP: &str = "20.1.2.3";

fn azure_json(url: &str) -> String {
    crate::support::azure_json(
        url,
        json!({ "vmType": "standard", "allowAdditionalPublicIPs": true }),
    )
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

fn status_ips(svc: &Service) -> Vec<String> {
    let ingress = svc.status.as_ref().and_then(|s| s.load_balancer.as_ref());
    ingress
        .and_then(|l| l.ingress.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|i| i.ip.clone())
        .collect()
}

/// Every inbound rule of the security group: name → destination addresses.
fn rules(f: &fixture::Fixture) -> Vec<(String, Vec<String>)> {
    let id = f.client.resource_id(RESOURCE_GROUP, "Microsoft.Network/networkSecurityGroups", NSG);
    let nsg = f.cloud.resource(&id.unwrap()).unwrap();
    nsg["properties"]["securityRules"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let p = &r["properties"];
            let mut dst: Vec<String> = p["destinationAddressPrefixes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|d| d.as_str().map(str::to_string))
                .collect();
            dst.extend(p["destinationAddressPrefix"].as_str().map(str::to_string));
            dst.sort();
            (r["name"].as_str().unwrap_or_default().to_string(), dst)
        })
        .collect()
}

/// The destinations of the Service's allow rule (the only managed one here).
fn allow_rule_destinations(f: &fixture::Fixture) -> Option<Vec<String>> {
    rules(f).into_iter().find(|(n, _)| n.starts_with("k8s-azure-lb_allow_IPv4_")).map(|(_, d)| d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn additional_public_ips_are_rule_destinations_leave_with_the_annotation_and_a_bad_one_is_an_event()
 {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let opts = AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() };
    let f = fixture::start_with(fixture::WORLD, opts, |_| {}).await;
    // The firewall's public IP, the operator's (untagged, unattached), and an operator's own
    // rule that must stay as it is.
    f.cloud
        .put_resource(
            &f.client
                .resource_id(RESOURCE_GROUP, "Microsoft.Network/publicIPAddresses", "firewall-ip")
                .unwrap(),
            json!({"sku": {"name": "Standard"}, "properties": {"ipAddress": FIREWALL_IP, "publicIPAllocationMethod": "Static"}}),
        )
        .unwrap();
    let nsg_id = f
        .client
        .resource_id(RESOURCE_GROUP, "Microsoft.Network/networkSecurityGroups", NSG)
        .unwrap();
    let mut nsg = f.cloud.resource(&nsg_id).unwrap();
    nsg["properties"]["securityRules"] = json!([{
        "name": "operator-ssh",
        "properties": {"priority": 300, "direction": "Inbound", "access": "Allow", "protocol": "Tcp",
            "sourceAddressPrefix": "203.0.113.0/24", "sourcePortRange": "*",
            "destinationAddressPrefix": "20.9.9.9", "destinationPortRange": "22"},
    }]);
    f.cloud.put_resource(&nsg_id, nsg).unwrap();
    let operator_rule = || rules(&f).into_iter().find(|(n, _)| n == "operator-ssh");
    let operator_before = operator_rule();

    let provider =
        AzureProvider::new(Some(azure_json(&f.server.url()).as_bytes()), f.options.clone())
            .unwrap();
    let ns = unique_name("azure-extra-ips");
    let namespace = Namespace {
        metadata: ObjectMeta { name: Some(ns.clone()), ..Default::default() },
        ..Default::default()
    };
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.unwrap();
    let group = unique_name("extra-ips");
    let node = Node {
        metadata: ObjectMeta {
            name: Some(unique_name("vm-1")),
            labels: Some([(GROUP_LABEL.to_string(), group.clone())].into()),
            ..Default::default()
        },
        spec: Some(NodeSpec {
            provider_id: Some(fixture::vm_provider_id("vm-1")),
            ..Default::default()
        }),
        ..Default::default()
    };
    let node =
        Api::<Node>::all(client.clone()).create(&PostParams::default(), &node).await.unwrap();
    let stop = start_controller(&client, Arc::new(provider), &ns, &group);

    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let mut svc = load_balancer_service(&ns, "web", 80);
    svc.metadata.annotations = Some([(ADDITIONAL.to_string(), FIREWALL_IP.to_string())].into());
    services.create(&PostParams::default(), &svc).await.unwrap();
    let ips = wait_for("the Service's addresses", Duration::from_secs(60), || async {
        let ips = status_ips(&services.get("web").await.ok()?);
        (ips.len() == 2).then_some(ips)
    })
    .await;
    let frontend = ips.iter().find(|ip| *ip != FIREWALL_IP).unwrap().clone();
    assert!(ips.contains(&FIREWALL_IP.to_string()), "{ips:?}");
    let mut want = vec![frontend.clone(), FIREWALL_IP.to_string()];
    want.sort();
    assert_eq!(allow_rule_destinations(&f), Some(want), "{:?}", rules(&f));

    // The annotation goes: the address leaves the status and the rule.
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ADDITIONAL: null}}})),
        )
        .await
        .unwrap();
    wait_for("the firewall's address out of the rule", Duration::from_secs(60), || async {
        (allow_rule_destinations(&f)? == [frontend.clone()]).then_some(())
    })
    .await;
    wait_for("the firewall's address out of the status", Duration::from_secs(60), || async {
        (status_ips(&services.get("web").await.ok()?) == [frontend.clone()]).then_some(())
    })
    .await;

    // A value that is not an address: a Warning naming the annotation; nothing changes.
    let writes = f.server.counters().matching("network.*.create_or_update");
    services
        .patch(
            "web",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {ADDITIONAL: "20.1.2.3,not-an-ip"}}})),
        )
        .await
        .unwrap();
    let events: Api<Event> = Api::namespaced(client.clone(), &ns);
    // (An earlier sync may have left another Warning naming the annotation: the one looked
    // for names the bad value too.)
    wait_for(
        "a Warning naming the annotation and the bad value",
        Duration::from_secs(60),
        || async {
            let list = events.list(&ListParams::default()).await.ok()?;
            list.items.into_iter().find_map(|e| {
                let m = e.message.unwrap_or_default();
                (e.type_.as_deref() == Some("Warning")
                    && e.involved_object.name.as_deref() == Some("web")
                    && m.contains(ADDITIONAL)
                    && m.contains("not-an-ip"))
                .then_some(m)
            })
        },
    )
    .await;
    assert_eq!(allow_rule_destinations(&f), Some(vec![frontend.clone()]));
    assert_eq!(
        f.server.counters().matching("network.*.create_or_update"),
        writes,
        "refused before any write"
    );
    assert_eq!(operator_rule(), operator_before, "the operator's rule is untouched");

    // The Service goes: its rule goes, the operator's stays.
    services.delete("web", &DeleteParams::default()).await.unwrap();
    wait_for("the Service gone", Duration::from_secs(60), || async {
        services.get_opt("web").await.ok()?.is_none().then_some(())
    })
    .await;
    assert_eq!(allow_rule_destinations(&f), None, "{:?}", rules(&f));
    assert_eq!(operator_rule(), operator_before, "the operator's rule is untouched");
    assert!(
        rules(&f).iter().all(|(_, d)| !d.contains(&FIREWALL_IP.to_string())),
        "{:?}",
        rules(&f)
    );

    stop.cancel();
    let _ = Api::<Node>::all(client.clone())
        .delete(node.metadata.name.as_deref().unwrap(), &DeleteParams::default())
        .await;
    let _ = Api::<Namespace>::all(client.clone()).delete(&ns, &DeleteParams::default()).await;
}
