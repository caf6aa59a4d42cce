//! A service principal's client certificate (`aadClientCertPath`, issue #33 item 9) against
//! the emulator's AAD, which checks each RS256 client assertion against the certificates
//! registered for the client: a certificate-only `azure.json` (no secret) initialises Nodes
//! on the real kube-apiserver; a certificate AAD does not know is AAD's `AADSTS700027` and
//! the error quotes no key material; a missing, unreadable or PKCS#12 file stops the start
//! naming `aadClientCertPath`.

use std::time::Duration;

use ccm_emulators::azure::{AzureOptions, DEFAULT_CLIENT_ID};
use ccm_provider_azure::client::ArmClient;
use ccm_provider_azure::client::api_version::COMPUTE;
use ccm_provider_azure::client::models::VirtualMachine;
use ccm_testbed::fixtures::kubelet_node;
use ccm_testbed::{ControlPlane, unique_name, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;

use crate::fixture::{self, RESOURCE_GROUP};

/// A self-signed RSA certificate: (the PEM file with certificate and key, the DER, the key's
/// PEM body lines).
pub(crate) fn certificate(name: &str) -> (String, Vec<u8>, Vec<String>) {
    let key = rcgen::KeyPair::generate_for(&rcgen::PKCS_RSA_SHA256).unwrap();
    let cert = rcgen::CertificateParams::new(vec![name.to_string()]).unwrap();
    let cert = cert.self_signed(&key).unwrap();
    let key_pem = key.serialize_pem();
    let body = key_pem.lines().filter(|l| !l.starts_with("-----")).map(str::to_string).collect();
    (format!("{}{key_pem}", cert.pem()), cert.der().to_vec(), body)
}

pub(crate) fn write(dir: &tempfile::TempDir, name: &str, content: &[u8]) -> String {
    let path = dir.path().join(name);
    std::fs::write(&path, content).unwrap();
    path.display().to_string()
}

fn vms() -> String {
    format!(
        "/subscriptions/{}/resourceGroups/{RESOURCE_GROUP}/providers/Microsoft.Compute/virtualMachines",
        fixture::SUBSCRIPTION
    )
}

#[tokio::test]
async fn a_certificate_aad_does_not_know_is_aadsts700027_and_no_key_material_is_quoted() {
    let f = fixture::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (registered_pem, registered_der, _) = certificate("ccm-sp");
    let (other_pem, _, other_key_lines) = certificate("ccm-sp");
    assert!(f.cloud.register_client_certificate(DEFAULT_CLIENT_ID, &registered_der));

    let mut config = (*f.config).clone();
    config.aad_client_secret = None;
    // The registered certificate: ARM answers.
    config.aad_client_cert_path = Some(write(&dir, "good.pem", registered_pem.as_bytes()));
    let client = ArmClient::new(&config, f.options.clone()).unwrap();
    let listed: Vec<VirtualMachine> =
        client.list("compute.virtual_machines.list", &vms(), COMPUTE, &[]).await.unwrap();
    assert!(!listed.is_empty());

    // Another certificate with the same subject: AAD refuses the assertion.
    config.aad_client_cert_path = Some(write(&dir, "other.pem", other_pem.as_bytes()));
    let client = ArmClient::new(&config, f.options.clone()).unwrap();
    let tokens = f.cloud.tokens_issued();
    let e = client
        .list::<VirtualMachine>("compute.virtual_machines.list", &vms(), COMPUTE, &[])
        .await
        .unwrap_err()
        .to_string();
    eprintln!("an unknown certificate: {e}");
    assert!(e.contains("700027"), "AAD's code is in the error: {e}");
    for line in &other_key_lines {
        assert!(!e.contains(line.as_str()), "the error quotes the private key: {e}");
    }
    assert!(!e.contains("eyJ"), "the error quotes a JWT (the assertion): {e}");
    assert_eq!(f.cloud.tokens_issued(), tokens, "no token for an unknown certificate");
}

#[tokio::test]
async fn a_missing_unreadable_or_pkcs12_certificate_file_stops_the_start_naming_the_key() {
    let f = fixture::start().await;
    let dir = tempfile::tempdir().unwrap();
    let (_, der, key_lines) = certificate("ccm-sp");
    let (pem, _, _) = certificate("ccm-sp");
    let key_only = pem.split("-----END CERTIFICATE-----").nth(1).unwrap().to_string();
    let cases: [(String, &str); 5] = [
        (dir.path().join("absent.pem").display().to_string(), "cannot read"),
        // A directory cannot be read as a file.
        (dir.path().display().to_string(), "cannot read"),
        // PKCS#12 is DER (the certificate's DER stands in: a SEQUENCE, not PEM).
        (write(&dir, "sp.pfx", &der), "PKCS#12"),
        (write(&dir, "key-only.pem", key_only.as_bytes()), "no CERTIFICATE"),
        (
            write(
                &dir,
                "encrypted.pem",
                format!(
                    "{}-----BEGIN ENCRYPTED PRIVATE KEY-----\n{}\n-----END ENCRYPTED PRIVATE KEY-----\n",
                    pem.split("-----BEGIN PRIVATE KEY-----").next().unwrap(),
                    key_lines[0]
                )
                .as_bytes(),
            ),
            "encrypted",
        ),
    ];
    for (path, why) in cases {
        let mut config = (*f.config).clone();
        config.aad_client_secret = None;
        config.aad_client_cert_path = Some(path.clone());
        config.aad_client_cert_password = Some("pfx-password".into());
        let e = ArmClient::new(&config, f.options.clone()).unwrap_err().to_string();
        eprintln!("{e}");
        assert!(e.contains("aadClientCertPath") && e.contains(why), "{path}: {e}");
        assert!(!e.contains("pfx-password"), "{path}: the password is quoted: {e}");
        for line in &key_lines {
            assert!(!e.contains(line.as_str()), "{path}: the key is quoted: {e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_only_config_initialises_nodes() {
    // VMs of their own names: Nodes on the shared control plane are this test's alone.
    let vm = unique_name("certvm");
    let world = format!(
        r#"
region: eastus
networks:
  - {{name: vnet, cidr: 10.0.0.0/8}}
subnets:
  - {{name: subnet, network: vnet, zone: "1", cidr: 10.240.0.0/16}}
instances:
  - {{name: {vm}, zone: "1", private_ips: [10.240.0.4]}}
"#
    );
    let opts = AzureOptions { lro: Duration::from_millis(50), ..AzureOptions::default() };
    let f = fixture::start_with(&world, opts, |_| {}).await;
    let dir = tempfile::tempdir().unwrap();
    let (pem, der, _) = certificate("ccm-sp");
    assert!(f.cloud.register_client_certificate(DEFAULT_CLIENT_ID, &der));
    let cert_path = write(&dir, "sp.pem", pem.as_bytes());

    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    // Upstream's keys, with a certificate and no secret.
    let azure_json = crate::support::azure_json(
        &f.server.url(),
        json!({ "aadClientCertPath": cert_path, "aadClientSecret": null }),
    );
    let manager =
        crate::support::Manager::start(cp, azure_json, f.options.clone(), "cloud-node", &[]);

    let nodes: Api<Node> = Api::all(admin.clone());
    nodes.create(&PostParams::default(), &kubelet_node(&vm, "10.240.0.4", "True")).await.unwrap();
    let n = wait_for(&format!("{vm} initialised"), Duration::from_secs(60), || async {
        let n = nodes.get(&vm).await.ok()?;
        let tainted = n
            .spec
            .as_ref()?
            .taints
            .iter()
            .flatten()
            .any(|t| t.key == ccm_core::names::TAINT_UNINITIALIZED);
        (!tainted && n.spec.as_ref()?.provider_id.is_some()).then_some(n)
    })
    .await;
    assert_eq!(n.spec.unwrap().provider_id, Some(fixture::vm_provider_id(&vm)));
    assert!(f.cloud.tokens_issued() > 0, "AAD issued a token for the certificate");

    manager.stop().await;
    let _ = nodes.delete(&vm, &DeleteParams::default()).await;
}
