//! The IMDS client against the emulator's instance metadata service: what a VM and a
//! scale-set VM learn about themselves, and failures as errors within the deadline.

use std::time::{Duration, Instant};

use ccm_emulators::admin::PauseMode;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_provider_azure::imds::{ImdsClient, ImdsError};

use crate::fixture::{self, RESOURCE_GROUP, SUBSCRIPTION, vm_provider_id, vmss_provider_id};

#[tokio::test]
async fn a_vm_and_a_scale_set_vm_read_their_own_metadata() {
    let f = fixture::start().await;
    let imds = ImdsClient::from_arm(&f.client);
    assert!(f.cloud.set_imds_instance("vm-0"));
    let m = imds.metadata().await.unwrap();
    let c = m.compute.unwrap();
    assert_eq!((c.name.as_str(), c.location.as_str(), c.zone.as_str()), ("vm-0", "eastus", "1"));
    assert_eq!(c.vm_size, "Standard_D4s_v3");
    assert_eq!(format!("azure://{}", c.resource_id), vm_provider_id("vm-0"));
    assert_eq!(
        (c.subscription_id.as_str(), c.resource_group_name.as_str()),
        (SUBSCRIPTION, RESOURCE_GROUP)
    );
    assert_eq!(c.vm_scale_set_name, "");
    let nic = &m.network.unwrap().interface[0];
    assert_eq!(nic.ipv4.ip_address[0].private_ip_address, "10.240.0.4");
    assert_eq!(nic.ipv4.ip_address[0].public_ip_address, "20.0.0.4");

    assert!(f.cloud.set_imds_instance("vm-6"));
    let m = imds.instance().await.unwrap();
    assert_eq!(m.network.unwrap().interface[0].ipv6.ip_address[0].private_ip_address, "fd00::8");

    assert!(f.cloud.set_imds_instance("pool-1"));
    let c = imds.instance().await.unwrap().compute.unwrap();
    assert_eq!(c.vm_scale_set_name, "pool");
    assert_eq!(format!("azure://{}", c.resource_id), vmss_provider_id("pool", 1));
    assert_eq!((c.zone.as_str(), c.platform_fault_domain.as_str()), ("2", "0"));

    assert!(f.cloud.set_imds_instance("vm-2"));
    let c = imds.instance().await.unwrap().compute.unwrap();
    assert_eq!((c.zone.as_str(), c.platform_fault_domain.as_str()), ("", "1"));
    assert_eq!(
        imds.load_balancer().await.unwrap().loadbalancer.unwrap().public_ip_addresses.len(),
        0
    );
    let calls = f.server.counters();
    assert!(calls.get("imds.instance") >= 4 && calls.get("imds.loadbalancer") >= 1);
}

#[tokio::test]
async fn imds_failures_are_errors_within_the_deadline() {
    let f = fixture::start().await;
    let imds = ImdsClient::from_arm(&f.client).with_timeout(Duration::from_millis(300));

    f.server
        .inject(FaultRule::new(
            "imds.instance",
            Fault::Status { status: 500, body: Some("boom".into()) },
        ))
        .unwrap();
    match imds.instance().await {
        Err(ImdsError::Status { status: 500, body, .. }) => assert_eq!(body, "boom"),
        other => panic!("{other:?}"),
    }
    f.server.admin().clear_faults().await.unwrap();

    f.server.admin().pause(PauseMode::Hang).await.unwrap();
    let started = Instant::now();
    let e = imds.instance().await.unwrap_err();
    assert!(matches!(e, ImdsError::Timeout { .. }), "{e}");
    assert!(started.elapsed() < Duration::from_secs(3));
    f.server.admin().resume().await.unwrap();

    let nowhere = ImdsClient::new(reqwest::Client::new(), "http://127.0.0.1:9");
    let e = nowhere.instance().await.unwrap_err();
    assert!(matches!(e, ImdsError::Transport { .. }), "{e}");
    assert!(e.to_string().contains("instance metadata instance"), "{e}");
}
