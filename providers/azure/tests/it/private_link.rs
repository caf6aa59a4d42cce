//! Private Link Service (issue #33 item 2): the ten `azure-pls-*` annotations make, change
//! and remove a PLS on the Service's internal frontend, as upstream; the PLS goes before its
//! frontend (the emulator refuses a frontend's removal while a PLS uses it, as ARM does); only
//! a PLS this cluster made (tagged with the cluster and the owner Service) is changed or
//! deleted; a name or frontend someone else's PLS holds is an error, never an adoption; a
//! subnet a Service names is never rewritten.

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ccm_core::cloud::{LoadBalancer, ProviderError};
use ccm_emulators::azure::AzureOptions;
use ccm_provider_azure::load_balancer::pls;
use serde_json::{Value, json};

use crate::fixture::{self, CLUSTER, Fixture, RESOURCE_GROUP, SUBNET, VNET};
use crate::load_balancer::{P, UID, id, lb, nodes, setup, svc};

const INTERNAL: (&str, &str) = ("service.beta.kubernetes.io/azure-load-balancer-internal", "true");
const PLS_TYPE: &str = "Microsoft.Network/privateLinkServices";
const PLS_PUT: &str = "network.private_link_services.create_or_update";
const PLS_DELETE: &str = "network.private_link_services.delete";
const OTHER_SUB: &str = "11111111-2222-3333-4444-555555555555";

fn pls_of(f: &Fixture, name: &str) -> Option<Value> {
    f.cloud.resource(&id(f, PLS_TYPE, name))
}

fn subnet_id(f: &Fixture, name: &str) -> String {
    format!("{}/subnets/{name}", id(f, "Microsoft.Network/virtualNetworks", VNET))
}

fn frontend_id(f: &Fixture) -> String {
    format!(
        "{}/frontendIPConfigurations/{P}",
        id(f, "Microsoft.Network/loadBalancers", &format!("{CLUSTER}-internal"))
    )
}

fn ip_configs(v: &Value) -> Vec<(String, String, bool, String)> {
    v["properties"]["ipConfigurations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| {
            let p = &c["properties"];
            (
                c["name"].as_str().unwrap().to_string(),
                p["privateIPAllocationMethod"].as_str().unwrap().to_string(),
                p["primary"] == json!(true),
                p["privateIPAddress"].as_str().unwrap_or_default().to_string(),
            )
        })
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array().into_iter().flatten().map(|s| s.as_str().unwrap().to_string()).collect()
}

fn what(e: ProviderError) -> String {
    match e {
        ProviderError::Invalid { what, .. } => what,
        other => panic!("expected an invalid-input error, got {other}"),
    }
}

async fn start_with_pls_subnet() -> Fixture {
    let world = fixture::WORLD.replace(
        "subnets:\n",
        "subnets:\n  - {name: pls-subnet, network: vnet, zone: \"1\", cidr: 10.241.0.0/16}\n",
    );
    let opts = AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() };
    fixture::start_with(&world, opts, |_| {}).await
}

#[tokio::test]
async fn a_private_link_service_follows_the_services_annotations() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let name = format!("pls-{P}");
    // Created: on the internal frontend, one dynamic NAT address in the config's subnet
    // (its network policies switched off as upstream does), tagged for cluster and Service.
    let web = svc(UID, "web", &[(80, "TCP")], &[INTERNAL, (pls::CREATE, "true")]);
    lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    let p = pls_of(&f, &name).expect("the PLS is made");
    assert_eq!(
        strings(&json!([p["properties"]["loadBalancerFrontendIpConfigurations"][0]["id"]])),
        vec![frontend_id(&f)]
    );
    let cfgs = ip_configs(&p);
    assert_eq!(cfgs.len(), 1);
    assert_eq!(
        (cfgs[0].0.as_str(), cfgs[0].1.as_str(), cfgs[0].2),
        (format!("{SUBNET}-{name}-dynamic-0").as_str(), "Dynamic", true)
    );
    assert_eq!(p["tags"]["k8s-azure-cluster-name"], CLUSTER);
    assert_eq!(p["tags"]["k8s-azure-owner-service"], "default/web");
    assert!(p["properties"]["alias"].as_str().unwrap().starts_with(&format!("{name}.")));
    let sn = f.cloud.resource(&subnet_id(&f, SUBNET)).unwrap();
    assert_eq!(sn["properties"]["privateLinkServiceNetworkPolicies"], "Disabled");

    // Nothing changed: nothing written.
    let puts = || f.server.counters().get(PLS_PUT);
    assert_eq!(puts(), 1);
    lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    assert_eq!(puts(), 1, "a second sync writes nothing");

    // Every setting changed: one PUT with all of them.
    let changed = svc(
        UID,
        "web",
        &[(80, "TCP")],
        &[
            INTERNAL,
            (pls::CREATE, "true"),
            (pls::IP_CONFIGURATION_IP_ADDRESS_COUNT, "3"),
            (pls::IP_CONFIGURATION_IP_ADDRESS, "10.240.0.60 10.240.0.61"),
            (pls::PROXY_PROTOCOL, "true"),
            (pls::FQDNS, "web.example.com api.example.com"),
            (pls::VISIBILITY, "*"),
            (pls::AUTO_APPROVAL, OTHER_SUB),
        ],
    );
    lbs.ensure_load_balancer(CLUSTER, &changed, &nodes()).await.unwrap();
    assert_eq!(puts(), 2);
    let p = pls_of(&f, &name).unwrap();
    let cfgs = ip_configs(&p);
    let summary: Vec<(&str, bool, &str)> = cfgs
        .iter()
        .map(|c| (c.1.as_str(), c.2, if c.1 == "Static" { c.3.as_str() } else { "" }))
        .collect();
    assert_eq!(
        summary,
        vec![
            ("Static", true, "10.240.0.60"),
            ("Static", false, "10.240.0.61"),
            ("Dynamic", false, "")
        ]
    );
    assert_eq!(p["properties"]["enableProxyProtocol"], true);
    let mut fqdns = strings(&p["properties"]["fqdns"]);
    fqdns.sort();
    assert_eq!(fqdns, ["api.example.com", "web.example.com"]);
    assert_eq!(strings(&p["properties"]["visibility"]["subscriptions"]), ["*"]);
    assert_eq!(strings(&p["properties"]["autoApproval"]["subscriptions"]), [OTHER_SUB]);
    lbs.ensure_load_balancer(CLUSTER, &changed, &nodes()).await.unwrap();
    assert_eq!(puts(), 2, "converged");

    // The annotation removed: the PLS goes, the Service's frontend stays.
    let plain = svc(UID, "web", &[(80, "TCP")], &[INTERNAL]);
    lbs.ensure_load_balancer(CLUSTER, &plain, &nodes()).await.unwrap();
    assert!(pls_of(&f, &name).is_none(), "the PLS is deleted when no longer asked for");
    let internal = lb(&f, &format!("{CLUSTER}-internal")).unwrap();
    assert!(internal.to_string().contains(P), "the frontend stays");
}

#[tokio::test]
async fn deleting_the_service_deletes_its_pls_before_the_frontend() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let web =
        svc(UID, "web", &[(80, "TCP")], &[INTERNAL, (pls::CREATE, "true"), (pls::NAME, "web-pls")]);
    lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    assert!(pls_of(&f, "web-pls").is_some());
    // ARM refuses to remove a frontend a PLS uses: the emulator too.
    let lb_id = id(&f, "Microsoft.Network/loadBalancers", &format!("{CLUSTER}-internal"));
    let mut body: Value = f.client.get("test.get", &lb_id, "2024-05-01", &[]).await.unwrap();
    body["properties"]["frontendIPConfigurations"] = json!([]);
    body["properties"]["loadBalancingRules"] = json!([]);
    body["properties"]["probes"] = json!([]);
    let etag = body["etag"].as_str().map(str::to_string);
    let e =
        f.client.put("test.put", &lb_id, "2024-05-01", &body, etag.as_deref()).await.unwrap_err();
    assert_eq!(
        e.code(),
        Some("LoadBalancerFrontendIpConfigurationInUseByPrivateLinkService"),
        "{e}"
    );

    lbs.ensure_load_balancer_deleted(CLUSTER, &web).await.unwrap();
    assert!(pls_of(&f, "web-pls").is_none());
    assert!(
        lb(&f, &format!("{CLUSTER}-internal")).is_none(),
        "the emptied load balancer is deleted"
    );
    assert_eq!(f.server.counters().get(PLS_DELETE), 1);
}

#[tokio::test]
async fn a_pls_the_cluster_did_not_make_is_never_changed_or_deleted() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let plain = svc(UID, "web", &[(80, "TCP")], &[INTERNAL]);
    lbs.ensure_load_balancer(CLUSTER, &plain, &nodes()).await.unwrap();
    // An operator attaches their own PLS (no cluster tags) to the Service's frontend.
    let theirs = id(&f, PLS_TYPE, "operators-pls");
    let sn = subnet_id(&f, SUBNET);
    let mut subnet = f.cloud.resource(&sn).unwrap();
    subnet["properties"]["privateLinkServiceNetworkPolicies"] = json!("Disabled");
    f.cloud.put_resource(&sn, subnet).unwrap();
    let body = json!({
        "location": fixture::LOCATION,
        "tags": {"team": "net"},
        "properties": {
            "loadBalancerFrontendIpConfigurations": [{"id": frontend_id(&f)}],
            "ipConfigurations": [{"name": "nat", "properties": {"primary": true, "privateIPAllocationMethod": "Dynamic", "subnet": {"id": sn}}}]
        }
    });
    let _: Value = f.client.put("test.put", &theirs, "2024-05-01", &body, None).await.unwrap();
    let before = f.cloud.resource(&theirs).unwrap();

    // Asking for a PLS on that frontend: an error naming the annotation, theirs unchanged.
    let web = svc(UID, "web", &[(80, "TCP")], &[INTERNAL, (pls::CREATE, "true")]);
    let e = lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap_err();
    assert!(e.to_string().contains("operators-pls"), "{e}");
    assert_eq!(what(e), pls::CREATE);
    // Removing the annotation: theirs is not the Service's, it stays.
    lbs.ensure_load_balancer(CLUSTER, &plain, &nodes()).await.unwrap();
    // Deleting the Service: an error (the frontend cannot go while their PLS uses it), and
    // nothing of theirs deleted.
    let e = lbs.ensure_load_balancer_deleted(CLUSTER, &plain).await.unwrap_err();
    assert!(e.to_string().contains("did not make"), "{e}");
    assert_eq!(f.server.counters().get(PLS_DELETE), 0);
    assert_eq!(f.cloud.resource(&theirs).unwrap()["tags"], before["tags"]);
    assert!(lb(&f, &format!("{CLUSTER}-internal")).unwrap().to_string().contains(P));
}

#[tokio::test]
async fn a_name_another_pls_holds_is_an_error_not_an_adoption() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    // Someone else's PLS named "taken" on an operator's frontend of another load balancer.
    let sn = subnet_id(&f, SUBNET);
    let mut subnet = f.cloud.resource(&sn).unwrap();
    subnet["properties"]["privateLinkServiceNetworkPolicies"] = json!("Disabled");
    f.cloud.put_resource(&sn, subnet).unwrap();
    let ops_lb = id(&f, "Microsoft.Network/loadBalancers", "ops");
    let _: Value = f
        .client
        .put(
            "test.put",
            &ops_lb,
            "2024-05-01",
            &json!({"location": fixture::LOCATION, "sku": {"name": "Standard"}, "properties": {
                "frontendIPConfigurations": [{"name": "fe", "properties": {"subnet": {"id": sn}}}]}}),
            None,
        )
        .await
        .unwrap();
    let taken = id(&f, PLS_TYPE, "taken");
    let _: Value = f
        .client
        .put(
            "test.put",
            &taken,
            "2024-05-01",
            &json!({"location": fixture::LOCATION, "properties": {
                "loadBalancerFrontendIpConfigurations": [{"id": format!("{ops_lb}/frontendIPConfigurations/fe")}],
                "ipConfigurations": [{"name": "nat", "properties": {"primary": true, "subnet": {"id": sn}}}]}}),
            None,
        )
        .await
        .unwrap();
    let before = f.cloud.resource(&taken).unwrap();
    let web =
        svc(UID, "web", &[(80, "TCP")], &[INTERNAL, (pls::CREATE, "true"), (pls::NAME, "taken")]);
    let e = lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap_err();
    assert_eq!(what(e), pls::NAME);
    let after = f.cloud.resource(&taken).unwrap();
    assert_eq!(after["tags"], before["tags"], "not adopted");
    assert_eq!(
        after["properties"]["loadBalancerFrontendIpConfigurations"],
        before["properties"]["loadBalancerFrontendIpConfigurations"]
    );
}

#[tokio::test]
async fn a_subnet_a_service_names_is_never_rewritten() {
    let f = start_with_pls_subnet().await;
    let lbs = setup(&f);
    let web = svc(
        UID,
        "web",
        &[(80, "TCP")],
        &[INTERNAL, (pls::CREATE, "true"), (pls::IP_CONFIGURATION_SUBNET, "pls-subnet")],
    );
    let e = lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap_err();
    assert_eq!(what(e), pls::IP_CONFIGURATION_SUBNET);
    assert_eq!(f.server.counters().get("network.subnets.create_or_update"), 0);
    assert_eq!(f.server.counters().get(PLS_PUT), 0);
    // Once the operator disables the policies, the PLS's NAT addresses go in that subnet.
    let sn = subnet_id(&f, "pls-subnet");
    let mut subnet = f.cloud.resource(&sn).unwrap();
    subnet["properties"]["privateLinkServiceNetworkPolicies"] = json!("Disabled");
    f.cloud.put_resource(&sn, subnet).unwrap();
    lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    let p = pls_of(&f, &format!("pls-{P}")).unwrap();
    let cfg = &p["properties"]["ipConfigurations"][0]["properties"];
    assert_eq!(cfg["subnet"]["id"].as_str().unwrap().to_ascii_lowercase(), sn.to_ascii_lowercase());
    assert!(cfg["privateIPAddress"].as_str().unwrap().starts_with("10.241."), "{cfg}");
}

#[tokio::test]
async fn a_public_service_with_floating_ip_cannot_have_one() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    let web = svc(UID, "web", &[(80, "TCP")], &[(pls::CREATE, "true")]);
    let e = lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap_err();
    assert_eq!(what(e), pls::CREATE);
    assert_eq!(f.server.counters().get(PLS_PUT), 0);
    let _ = RESOURCE_GROUP;
}

#[tokio::test]
async fn the_emulator_enforces_arms_private_link_service_rules() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    // A public frontend and an internal one.
    lbs.ensure_load_balancer(CLUSTER, &svc(UID, "web", &[(80, "TCP")], &[]), &nodes())
        .await
        .unwrap();
    let public_fe = format!(
        "{}/frontendIPConfigurations/{P}",
        id(&f, "Microsoft.Network/loadBalancers", CLUSTER)
    );
    let sn = subnet_id(&f, SUBNET);
    let put = |fe: String, subnet: String, version: &'static str| {
        json!({"location": fixture::LOCATION, "properties": {
            "loadBalancerFrontendIpConfigurations": [{"id": fe}],
            "ipConfigurations": [{"name": "nat", "properties": {"primary": true, "privateIPAddressVersion": version, "subnet": {"id": subnet}}}]}})
    };
    let pls_id = id(&f, PLS_TYPE, "p");
    let code = |r: Result<Value, ccm_provider_azure::client::ArmError>| {
        r.unwrap_err().code().map(str::to_string)
    };
    // Subnet policies still on.
    let internal = svc(crate::load_balancer::UID2, "db", &[(5432, "TCP")], &[INTERNAL]);
    lbs.ensure_load_balancer(CLUSTER, &internal, &nodes()).await.unwrap();
    let internal_fe = format!(
        "{}/frontendIPConfigurations/{}",
        id(&f, "Microsoft.Network/loadBalancers", &format!("{CLUSTER}-internal")),
        crate::load_balancer::P2
    );
    assert_eq!(
        code(
            f.client
                .put(
                    "t",
                    &pls_id,
                    "2024-05-01",
                    &put(internal_fe.clone(), sn.clone(), "IPv4"),
                    None
                )
                .await
        )
        .as_deref(),
        Some("PrivateLinkServiceCannotBeCreatedInSubnetThatHasNetworkPoliciesEnabled")
    );
    let mut subnet = f.cloud.resource(&sn).unwrap();
    subnet["properties"]["privateLinkServiceNetworkPolicies"] = json!("Disabled");
    f.cloud.put_resource(&sn, subnet).unwrap();
    assert_eq!(
        code(
            f.client
                .put("t", &pls_id, "2024-05-01", &put(public_fe, sn.clone(), "IPv4"), None)
                .await
        )
        .as_deref(),
        Some("PrivateLinkServiceFrontendIpConfigurationIsNotInternal")
    );
    assert_eq!(
        code(
            f.client
                .put(
                    "t",
                    &pls_id,
                    "2024-05-01",
                    &put(format!("{internal_fe}x"), sn.clone(), "IPv4"),
                    None
                )
                .await
        )
        .as_deref(),
        Some("InvalidResourceReference")
    );
    assert_eq!(
        code(
            f.client
                .put(
                    "t",
                    &pls_id,
                    "2024-05-01",
                    &put(internal_fe.clone(), sn.clone(), "IPv6"),
                    None
                )
                .await
        )
        .as_deref(),
        Some("PrivateLinkServiceIpConfigurationIPv6NotSupported")
    );
    let made: Value = f
        .client
        .put("t", &pls_id, "2024-05-01", &put(internal_fe.clone(), sn.clone(), "IPv4"), None)
        .await
        .unwrap();
    assert_eq!(made["properties"]["provisioningState"], "Succeeded");
    // A second PLS on the same frontend; the subnet's policies turned back on.
    assert_eq!(
        code(
            f.client
                .put(
                    "t",
                    &id(&f, PLS_TYPE, "q"),
                    "2024-05-01",
                    &put(internal_fe, sn.clone(), "IPv4"),
                    None
                )
                .await
        )
        .as_deref(),
        Some("LoadBalancerFrontendIpConfigurationAlreadyUsedByPrivateLinkService")
    );
    let mut subnet: Value = f.client.get("t", &sn, "2024-05-01", &[]).await.unwrap();
    subnet["properties"]["privateLinkServiceNetworkPolicies"] = json!("Enabled");
    assert_eq!(
        code(f.client.put("t", &sn, "2024-05-01", &subnet, None).await).as_deref(),
        Some("PrivateLinkServiceNetworkPoliciesCannotBeEnabledOnPrivateLinkServiceSubnet")
    );
    // The load balancer cannot be deleted while the PLS uses its frontend.
    let lb_id = id(&f, "Microsoft.Network/loadBalancers", &format!("{CLUSTER}-internal"));
    let e = f.client.delete("t", &lb_id, "2024-05-01").await.unwrap_err();
    assert_eq!(e.code(), Some("LoadBalancerFrontendIpConfigurationInUseByPrivateLinkService"));
}
