//! The ARM client against the emulator: credentials, paging, long-running operations,
//! ETags, error bodies, throttling, deadlines.

use std::time::{Duration, Instant};

use ccm_emulators::faults::{Fault, FaultRule};
use ccm_provider_azure::client::api_version::{COMPUTE, NETWORK};
use ccm_provider_azure::client::models::{LoadBalancer, PublicIpAddress, Sku, VirtualMachine};
use ccm_provider_azure::client::{ArmClient, ArmError};
use serde_json::json;

use crate::fixture::{self, RESOURCE_GROUP};

fn vms(f: &fixture::Fixture) -> String {
    format!(
        "/subscriptions/{}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Compute/virtualMachines",
        f.client.subscription_id()
    )
}

#[tokio::test]
async fn lists_follow_next_link_and_gets_read_one_resource() {
    let f = fixture::start().await;
    f.cloud.set_page_size(2);
    let all: Vec<VirtualMachine> =
        f.client.list("compute.virtual_machines.list", &vms(&f), COMPUTE, &[]).await.unwrap();
    let mut names: Vec<_> = all.iter().map(|v| v.name().to_string()).collect();
    names.sort();
    assert_eq!(names, ["vm-0", "vm-1", "vm-2", "vm-3", "vm-6"]);
    let pages = f.server.counters().get("compute.virtual_machines.list");
    assert_eq!(pages, 3, "5 VMs in pages of 2");

    let id =
        f.client.resource_id(RESOURCE_GROUP, "Microsoft.Compute/virtualMachines", "vm-2").unwrap();
    let vm: VirtualMachine = f
        .client
        .get("compute.virtual_machines.get", &id, COMPUTE, &[("$expand", "instanceView")])
        .await
        .unwrap();
    let power = vm.properties.instance_view.as_ref().and_then(|v| v.power_state());
    assert_eq!(power.as_deref(), Some("stopped"));
    assert_eq!(vm.properties.hardware_profile.unwrap().vm_size.as_deref(), Some("Standard_D2s_v3"));
}

#[tokio::test]
async fn a_missing_resource_is_none_but_a_missing_resource_group_is_an_error() {
    let f = fixture::start().await;
    let gone =
        f.client.resource_id(RESOURCE_GROUP, "Microsoft.Compute/virtualMachines", "nope").unwrap();
    let r: Option<VirtualMachine> =
        f.client.get_opt("compute.virtual_machines.get", &gone, COMPUTE, &[]).await.unwrap();
    assert!(r.is_none());
    let other_rg =
        f.client.resource_id("no-such-rg", "Microsoft.Compute/virtualMachines", "vm-0").unwrap();
    let err = f
        .client
        .get_opt::<VirtualMachine>("compute.virtual_machines.get", &other_rg, COMPUTE, &[])
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(404));
    assert!(!err.is_not_found(), "{err}");
    assert!(err.to_string().contains("ResourceGroupNotFound"), "{err}");
}

fn pip(name: &str) -> PublicIpAddress {
    let mut p = PublicIpAddress {
        name: Some(name.into()),
        location: Some(fixture::LOCATION.into()),
        sku: Some(Sku { name: Some("Standard".into()), ..Sku::default() }),
        ..PublicIpAddress::default()
    };
    p.properties.public_ip_allocation_method = Some("Static".into());
    p.properties.extra.insert("operatorSetting".into(), json!({"keep": true}));
    p
}

#[tokio::test]
async fn put_waits_for_the_operation_and_keeps_unknown_fields_and_delete_waits_too() {
    let f = fixture::start().await;
    let id = f
        .client
        .resource_id(RESOURCE_GROUP, "Microsoft.Network/publicIPAddresses", "svc-pip")
        .unwrap();
    let started = Instant::now();
    let made = f
        .client
        .put("network.public_ip_addresses.create_or_update", &id, NETWORK, &pip("svc-pip"), None)
        .await
        .unwrap();
    assert!(started.elapsed() >= Duration::from_millis(50), "waited for the operation");
    assert_eq!(made.properties.provisioning_state.as_deref(), Some("Succeeded"));
    assert!(made.properties.ip_address.is_some(), "ARM allocated an address");
    assert_eq!(made.properties.extra["operatorSetting"], json!({"keep": true}));
    assert!(f.server.counters().get("arm.operations.get") >= 1);

    f.client.delete("network.public_ip_addresses.delete", &id, NETWORK).await.unwrap();
    assert!(f.cloud.resource(&id).is_none(), "deleted once delete returned");
    // Deleting again is fine.
    f.client.delete("network.public_ip_addresses.delete", &id, NETWORK).await.unwrap();
}

#[tokio::test]
async fn a_stale_etag_is_a_precondition_failure_and_arm_errors_keep_code_and_message() {
    let f = fixture::start().await;
    let id = f.client.resource_id(RESOURCE_GROUP, "Microsoft.Network/loadBalancers", "lb").unwrap();
    let mut lb = LoadBalancer {
        name: Some("lb".into()),
        location: Some(fixture::LOCATION.into()),
        sku: Some(Sku { name: Some("Standard".into()), ..Sku::default() }),
        ..LoadBalancer::default()
    };
    let first = f
        .client
        .put("network.load_balancers.create_or_update", &id, NETWORK, &lb, None)
        .await
        .unwrap();
    let etag = first.etag.clone().unwrap();
    let _second = f
        .client
        .put("network.load_balancers.create_or_update", &id, NETWORK, &first, Some(&etag))
        .await
        .unwrap();
    let err = f
        .client
        .put("network.load_balancers.create_or_update", &id, NETWORK, &first, Some(&etag))
        .await
        .unwrap_err();
    assert!(err.is_precondition_failed(), "{err}");

    // A rule naming a probe that does not exist: ARM's 400 with its code.
    lb.properties.load_balancing_rules =
        vec![serde_json::from_value(json!({
        "name": "r", "properties": {"protocol": "Tcp", "frontendPort": 80, "backendPort": 80,
        "probe": {"id": format!("{id}/probes/missing")}}
    }))
    .unwrap()];
    let err = f
        .client
        .put("network.load_balancers.create_or_update", &id, NETWORK, &lb, None)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(400));
    assert_eq!(err.code(), Some("InvalidResourceReference"), "{err}");
    let text = err.to_string();
    assert!(
        text.contains("network.load_balancers.create_or_update")
            && text.contains("/loadBalancers/lb"),
        "{text}"
    );
}

#[tokio::test]
async fn throttled_reads_are_retried_after_retry_after_and_writes_are_not_retried_on_5xx() {
    let f = fixture::start().await;
    f.server
        .inject(
            FaultRule::new(
                "compute.virtual_machines.list",
                Fault::Throttle { retry_after_secs: 1 },
            )
            .times(1),
        )
        .unwrap();
    let started = Instant::now();
    let all: Vec<VirtualMachine> =
        f.client.list("compute.virtual_machines.list", &vms(&f), COMPUTE, &[]).await.unwrap();
    assert_eq!(all.len(), 5);
    assert!(started.elapsed() >= Duration::from_secs(1), "waited for Retry-After");

    f.server
        .inject(
            FaultRule::new(
                "network.public_ip_addresses.create_or_update",
                Fault::Status { status: 500, body: None },
            )
            .times(1),
        )
        .unwrap();
    let id =
        f.client.resource_id(RESOURCE_GROUP, "Microsoft.Network/publicIPAddresses", "p").unwrap();
    let err = f
        .client
        .put("network.public_ip_addresses.create_or_update", &id, NETWORK, &pip("p"), None)
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(500), "{err}");
    assert_eq!(f.server.counters().get("network.public_ip_addresses.create_or_update"), 1);
}

#[tokio::test]
async fn a_hung_arm_is_a_deadline_error_and_tokens_are_renewed_when_they_expire() {
    let f = fixture::start().await;
    f.cloud.set_token_lifetime(Duration::from_secs(2));
    let _: Vec<VirtualMachine> =
        f.client.list("compute.virtual_machines.list", &vms(&f), COMPUTE, &[]).await.unwrap();
    let issued = f.cloud.tokens_issued();
    tokio::time::sleep(Duration::from_millis(2500)).await;
    // The same client: its token has expired (the emulator rejects it); a new one is asked.
    // (Read past the VM listing cache: this call must reach ARM.)
    let _: Vec<VirtualMachine> =
        f.client.list_fresh("compute.virtual_machines.list", &vms(&f), COMPUTE, &[]).await.unwrap();
    assert!(f.cloud.tokens_issued() > issued, "a new token was issued");
    assert_eq!(f.server.counters().faulted, 0);

    let mut options = f.options.clone();
    options.deadline = ccm_core::cloud_call::Deadline::new(Duration::from_secs(2));
    let client = ArmClient::new(&f.config, options).unwrap();
    f.server.inject(FaultRule::new("compute.virtual_machines.list", Fault::Hang)).unwrap();
    let started = Instant::now();
    let err = client
        .list::<VirtualMachine>("compute.virtual_machines.list", &vms(&f), COMPUTE, &[])
        .await
        .unwrap_err();
    assert!(matches!(err, ArmError::Deadline(_)), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
}

#[tokio::test]
async fn urls_arm_hands_back_are_followed_only_on_arms_own_host_and_foreign_bodies_are_not_quoted()
{
    let f = fixture::start().await;
    // A nextLink to another host: the bearer token is not sent there.
    let page = r#"{"value": [], "nextLink": "https://collector.example.net/steal?x=1"}"#;
    f.server
        .inject(
            FaultRule::new(
                "compute.virtual_machines.list",
                Fault::Status { status: 200, body: Some(page.into()) },
            )
            .times(1),
        )
        .unwrap();
    let err = f
        .client
        .list::<VirtualMachine>("compute.virtual_machines.list", &vms(&f), COMPUTE, &[])
        .await
        .unwrap_err();
    assert!(err.to_string().contains("not followed"), "{err}");

    // A proxy's error page (which could echo request headers) is not quoted.
    let page = "<html>Authorization: Bearer eyJ0eXAiOiJKV1QiLCJhbGciOi</html>";
    f.server
        .inject(
            FaultRule::new(
                "compute.virtual_machines.list",
                Fault::Status { status: 403, body: Some(page.into()) },
            )
            .times(1),
        )
        .unwrap();
    let err = f
        .client
        .list::<VirtualMachine>("compute.virtual_machines.list", &vms(&f), COMPUTE, &[])
        .await
        .unwrap_err();
    let text = err.to_string();
    assert_eq!(err.status(), Some(403));
    assert!(!text.contains("Bearer") && text.contains("not an ARM error body"), "{text}");
}
