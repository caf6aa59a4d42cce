//! The vim25 and tagging clients against vcsim: lookups, typed faults, TLS, re-login.

use std::time::Duration;

use ccm_provider_vsphere::client::tagging::TaggingClient;
use ccm_provider_vsphere::client::vim25::{PowerState, Vim25Client};
use ccm_provider_vsphere::client::{ClientError, Endpoint, FaultKind, MoRef, Secret};

use crate::sim::Vcsim;

fn endpoint(sim: &Vcsim, user: &str, password: &str) -> Endpoint {
    Endpoint {
        name: "vc1".into(),
        server: "127.0.0.1".into(),
        port: sim.port,
        user: user.into(),
        password: Secret::new(password),
        insecure: true,
        ca_file: None,
        thumbprint: None,
        login: Default::default(),
        timeout: Duration::from_secs(20),
    }
}

#[tokio::test]
async fn finds_vms_by_uuid_ip_and_dns_name_and_reads_their_properties() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-a", &[("VM Network", &["10.0.0.5", "fd00::5"])]);
    let vim = Vim25Client::new(endpoint(&sim, "u", "p")).unwrap();

    let dcs = vim.datacenters().await.unwrap();
    let dc = dcs.get("DC0").expect("DC0 found by traversal").clone();
    assert_eq!(dcs.len(), 1);

    let expected = MoRef::new("VirtualMachine", sim.vm("DC0_H0_VM0").moref.clone());
    let uuid = &sim.vm("DC0_H0_VM0").uuid;
    assert_eq!(vim.find_vm_by_uuid(Some(&dc), uuid).await.unwrap(), Some(expected.clone()));
    assert_eq!(vim.find_vm_by_ip(Some(&dc), "10.0.0.5").await.unwrap(), Some(expected.clone()));
    assert_eq!(
        vim.find_vms_by_dns_name(Some(&dc), "node-a").await.unwrap(),
        vec![expected.clone()]
    );
    assert_eq!(
        vim.find_vm_by_uuid(Some(&dc), "00000000-0000-0000-0000-000000000000").await.unwrap(),
        None
    );
    assert!(vim.find_vms_by_dns_name(None, "nobody").await.unwrap().is_empty());

    let info = vim.vm_info(&expected).await.unwrap().expect("VM exists");
    assert_eq!(info.name, "DC0_H0_VM0");
    assert_eq!(&info.uuid, uuid);
    assert_eq!(info.power_state, PowerState::PoweredOn);
    assert_eq!(info.guest_host_name, "node-a");
    assert_eq!(info.nics.len(), 1);
    assert_eq!(info.nics[0].network, "VM Network");
    assert_eq!(info.nics[0].ip_addresses, vec!["10.0.0.5", "fd00::5"]);
    assert!(info.num_cpu > 0 && info.memory_mb > 0, "{info:?}");
    assert_eq!(info.host.as_ref().map(|h| h.kind.as_str()), Some("HostSystem"));

    // Walking up: host → compute resource → host folder → datacenter.
    let mut object = info.host.clone().unwrap();
    let mut kinds = vec![];
    while let Some(parent) = vim.parent(&object).await.unwrap() {
        kinds.push(parent.kind.clone());
        object = parent;
    }
    assert!(kinds.contains(&"Datacenter".to_string()), "{kinds:?}");

    // A destroyed VM's properties read as "gone", not as an error.
    sim.destroy("DC0_H0_VM0");
    assert_eq!(vim.vm_info(&expected).await.unwrap(), None);
}

#[tokio::test]
async fn bad_credentials_are_typed_errors() {
    let sim = Vcsim::start_with_login("admin", "right");
    let vim = Vim25Client::new(endpoint(&sim, "admin", "wrong")).unwrap();
    let err = vim.datacenters().await.unwrap_err();
    assert!(
        matches!(err.fault().map(|f| &f.kind), Some(FaultKind::InvalidLogin)),
        "expected an InvalidLogin fault, got {err:?}"
    );
    assert!(err.to_string().contains("vCenter vc1") && err.to_string().contains("Login"), "{err}");
    assert!(!err.to_string().contains("wrong"), "the password leaked: {err}");

    let tagging = TaggingClient::new(endpoint(&sim, "admin", "wrong")).unwrap();
    let err = tagging.category_ids().await.unwrap_err();
    assert!(matches!(err, ClientError::Unauthorized { .. }), "{err:?}");

    let vim = Vim25Client::new(endpoint(&sim, "admin", "right")).unwrap();
    vim.login().await.unwrap();
    assert!(vim.datacenters().await.unwrap().contains_key("DC0"));
}

#[tokio::test]
async fn tls_is_verified_against_the_ca_file() {
    let sim = Vcsim::start();
    let mut ep = endpoint(&sim, "u", "p");
    ep.insecure = false;
    let err = Vim25Client::new(ep.clone()).unwrap().datacenters().await.unwrap_err();
    assert!(matches!(err, ClientError::Transport { .. }), "an unknown CA must be refused: {err:?}");

    ep.ca_file = Some(sim.ca_file.clone().into());
    let vim = Vim25Client::new(ep.clone()).unwrap();
    assert!(vim.datacenters().await.unwrap().contains_key("DC0"));

    ep.ca_file = Some("/nonexistent/ca.pem".into());
    let err = Vim25Client::new(ep).unwrap_err();
    assert!(err.to_string().contains("caFile /nonexistent/ca.pem"), "{err}");
}

#[tokio::test]
async fn expired_sessions_are_replaced_by_a_new_login() {
    let sim = Vcsim::start();
    sim.tag("k8s-zone", "zone-a", "DC0_H0");
    let vim = Vim25Client::new(endpoint(&sim, "u", "p")).unwrap();
    let tagging = TaggingClient::new(endpoint(&sim, "u", "p")).unwrap();
    let vm = MoRef::new("VirtualMachine", sim.vm("DC0_H0_VM0").moref.clone());
    let host = vim.vm_info(&vm).await.unwrap().unwrap().host.unwrap();
    assert!(vim.datacenters().await.unwrap().contains_key("DC0"));
    let before = tagging.category_ids().await.unwrap();

    for _ in 0..2 {
        sim.drop_sessions();
        let dcs = vim.datacenters().await.expect("SOAP call after the session was dropped");
        assert!(dcs.contains_key("DC0"));
        assert_eq!(
            tagging.category_ids().await.unwrap(),
            before,
            "REST call after the session was dropped"
        );
    }
    assert_eq!(tagging.attached_tags(&host).await.unwrap().len(), 1);
}
