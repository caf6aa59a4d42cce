//! Availability zones (issue #33 item 3), as upstream: a new public IP and a new internal
//! frontend are made in every zone of the region (zone-redundant), from the region's zones
//! (`Microsoft.Compute`'s `virtualMachines` zone mappings, read once and cached); an existing
//! public IP or frontend keeps the zones it has (ARM refuses a change:
//! `ResourceAvailabilityZonesCannotBeModified`); a region without zones gets none.

// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use ccm_core::cloud::LoadBalancer;
use ccm_emulators::azure::AzureOptions;
use serde_json::{Value, json};

use crate::fixture::{self, CLUSTER};
use crate::load_balancer::{P, P2, UID, UID2, id, lb, nodes, pip, setup, svc};

const INTERNAL: (&str, &str) = ("service.beta.kubernetes.io/azure-load-balancer-internal", "true");
const LOOKUP: &str = "resources.providers.get";

fn zones(v: &Value) -> Option<Vec<String>> {
    v.get("zones")
        .and_then(Value::as_array)
        .map(|a| a.iter().map(|z| z.as_str().unwrap().to_string()).collect::<Vec<_>>())
}

fn frontend<'a>(lb: &'a Value, name: &str) -> &'a Value {
    lb["properties"]["frontendIPConfigurations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["name"] == name)
        .unwrap_or_else(|| panic!("frontend {name} missing in {lb:#}"))
}

#[tokio::test]
async fn new_public_ips_and_internal_frontends_are_zone_redundant() {
    let f = fixture::start().await;
    let all = Some(vec!["1".to_string(), "2".to_string(), "3".to_string()]);
    assert_eq!(f.cloud.region_zones(), vec!["1", "2", "3"]);
    let lbs = setup(&f);
    lbs.ensure_load_balancer(CLUSTER, &svc(UID, "web", &[(80, "TCP")], &[]), &nodes())
        .await
        .unwrap();
    let p = pip(&f, &format!("{CLUSTER}-{P}")).unwrap();
    assert_eq!(zones(&p), all, "{p:#}");
    // The public frontend carries none of its own (its public IP has them).
    assert_eq!(zones(frontend(&lb(&f, CLUSTER).unwrap(), P)), None);

    lbs.ensure_load_balancer(CLUSTER, &svc(UID2, "db", &[(5432, "TCP")], &[INTERNAL]), &nodes())
        .await
        .unwrap();
    let internal = lb(&f, &format!("{CLUSTER}-internal")).unwrap();
    assert_eq!(zones(frontend(&internal, P2)), all, "{internal:#}");

    // Read once for both Services and every later sync (cached, as upstream's 30-minute
    // refresh).
    lbs.ensure_load_balancer(CLUSTER, &svc(UID, "web", &[(80, "TCP")], &[]), &nodes())
        .await
        .unwrap();
    assert_eq!(f.server.counters().get(LOOKUP), 1);
}

#[tokio::test]
async fn an_existing_zoneless_public_ip_and_frontend_are_used_unchanged() {
    let f = fixture::start().await;
    // What a cluster made before zones (or upstream in a region without them) left: a
    // zoneless public IP tagged for the Service, and the Service's zoneless internal frontend.
    let pip_name = format!("{CLUSTER}-{P}");
    let pip_id = id(&f, "Microsoft.Network/publicIPAddresses", &pip_name);
    f.cloud
        .put_resource(
            &pip_id,
            json!({
                "location": fixture::LOCATION,
                "sku": {"name": "Standard", "tier": "Regional"},
                "tags": {"k8s-azure-service": "default/web", "k8s-azure-cluster-name": CLUSTER},
                "properties": {"publicIPAllocationMethod": "Static", "publicIPAddressVersion": "IPv4", "ipAddress": "20.9.9.9"}
            }),
        )
        .unwrap();
    let lbs = setup(&f);
    let web = svc(UID, "web", &[(80, "TCP")], &[]);
    lbs.ensure_load_balancer(CLUSTER, &web, &nodes()).await.unwrap();
    let p = pip(&f, &pip_name).unwrap();
    assert_eq!(zones(&p), None, "an existing public IP is never re-zoned: {p:#}");
    assert_eq!(f.server.counters().get("network.public_ip_addresses.create_or_update"), 0);

    // An internal frontend made without zones stays so when the Service is synced again and
    // when it is rebuilt (a new address asked for: same name, ARM keeps its zones).
    let db = svc(UID2, "db", &[(5432, "TCP")], &[INTERNAL]);
    lbs.ensure_load_balancer(CLUSTER, &db, &nodes()).await.unwrap();
    let internal_name = format!("{CLUSTER}-internal");
    let lb_id = id(&f, "Microsoft.Network/loadBalancers", &internal_name);
    let mut body = lb(&f, &internal_name).unwrap();
    for fe in body["properties"]["frontendIPConfigurations"].as_array_mut().unwrap() {
        fe.as_object_mut().unwrap().remove("zones");
    }
    f.cloud.put_resource(&lb_id, body).unwrap();
    let moved = svc(
        UID2,
        "db",
        &[(5432, "TCP")],
        &[INTERNAL, ("service.beta.kubernetes.io/azure-load-balancer-ipv4", "10.240.0.99")],
    );
    lbs.ensure_load_balancer(CLUSTER, &moved, &nodes()).await.unwrap();
    let fe = frontend(&lb(&f, &internal_name).unwrap(), P2).clone();
    assert_eq!(fe["properties"]["privateIPAddress"], "10.240.0.99");
    assert_eq!(zones(&fe), None, "a rebuilt frontend keeps the zones it had: {fe:#}");
}

#[tokio::test]
async fn a_region_without_zones_gets_none() {
    let world = r#"
region: westcentralus
networks:
  - {name: vnet, cidr: 10.0.0.0/8}
subnets:
  - {name: subnet, network: vnet, zone: none, cidr: 10.240.0.0/16}
instances:
  - {name: vm-0, zone: none, private_ips: [10.240.0.4]}
  - {name: vm-1, zone: none, private_ips: [10.240.0.5]}
"#;
    let opts = AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() };
    let f = fixture::start_with(world, opts, |c| c.location = Some("westcentralus".into())).await;
    assert!(f.cloud.region_zones().is_empty());
    let lbs = setup(&f);
    lbs.ensure_load_balancer(CLUSTER, &svc(UID, "web", &[(80, "TCP")], &[]), &nodes())
        .await
        .unwrap();
    let p = pip(&f, &format!("{CLUSTER}-{P}")).unwrap();
    assert_eq!(zones(&p), None, "{p:#}");
    lbs.ensure_load_balancer(CLUSTER, &svc(UID2, "db", &[(5432, "TCP")], &[INTERNAL]), &nodes())
        .await
        .unwrap();
    let internal = lb(&f, &format!("{CLUSTER}-internal")).unwrap();
    assert_eq!(zones(frontend(&internal, P2)), None, "{internal:#}");
}

#[tokio::test]
async fn the_emulator_refuses_a_zones_change_on_a_public_ip() {
    let f = fixture::start().await;
    let lbs = setup(&f);
    lbs.ensure_load_balancer(CLUSTER, &svc(UID, "web", &[(80, "TCP")], &[]), &nodes())
        .await
        .unwrap();
    let pip_id = id(&f, "Microsoft.Network/publicIPAddresses", &format!("{CLUSTER}-{P}"));
    let mut body: Value = f.client.get("test.get", &pip_id, "2024-05-01", &[]).await.unwrap();
    body["zones"] = json!(["1"]);
    let e = f
        .client
        .put("test.put", &pip_id, "2024-05-01", &body, None)
        .await
        .expect_err("ARM never changes a public IP's zones");
    assert_eq!(e.code(), Some("ResourceAvailabilityZonesCannotBeModified"), "{e}");
}
