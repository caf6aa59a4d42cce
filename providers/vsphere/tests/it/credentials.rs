//! Credentials and connection settings (issue 14, vSphere): the credentials Secret read
//! again after a rejected login, upstream's `VSPHERE_*`/`VCENTER_*` environment, the global
//! `server` next to `vcenter` entries, `thumbprint` pinning, and logging out of every
//! session when the manager shuts down.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_core::cloud::{CloudProvider, InstancesV2, ProviderInit};
use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
use ccm_provider_vsphere::VsphereProvider;
use ccm_provider_vsphere::config::CredentialSources;
use ccm_testbed::{ControlPlane, unique_name, wait_for};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams, PostParams};
use tokio_util::sync::CancellationToken;

use crate::node;
use crate::sim::Vcsim;

const WAIT: Duration = Duration::from_secs(60);

/// A namespace of its own with the Secret `creds` holding `vc1.username`/`vc1.password`.
async fn secret_namespace(client: &kube::Client, password: &str) -> String {
    let ns = unique_name("vsphere-creds");
    let namespace: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    Api::<Namespace>::all(client.clone()).create(&PostParams::default(), &namespace).await.unwrap();
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "creds", "namespace": ns},
        "stringData": {"vc1.username": "admin", "vc1.password": password},
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), &ns)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    ns
}

async fn rotate(client: &kube::Client, ns: &str, password: &str) {
    let patch = serde_json::json!({"stringData": {"vc1.password": password}});
    Api::<Secret>::namespaced(client.clone(), ns)
        .patch("creds", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// Issue 14: the Secret was rotated after the manager read it. The first login (old
/// password) is rejected; the provider reads the Secret again and logs in with the new
/// password at once, so the Node is answered instead of failing until a restart.
#[tokio::test]
async fn a_rotated_secret_is_read_again_when_the_login_is_rejected() {
    let cp = ControlPlane::shared().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    let sim = Vcsim::start_with_login("admin", "pw-new-7c1d");
    sim.guest("DC0_H0_VM0", "node-rotated", &[("VM Network", &["10.0.0.7"])]);
    let ns = secret_namespace(&client, "pw-old-3b9e").await;
    let config = format!(
        "global:\n  insecureFlag: true\n  secretName: creds\n  secretNamespace: {ns}\nvcenter:\n{}",
        sim.vcenter_yaml("vc1")
    );
    let provider = VsphereProvider::new(config.as_bytes(), &CredentialSources::default()).unwrap();
    let stop = CancellationToken::new();
    provider.initialize(ProviderInit::new(client.clone(), stop.clone())).unwrap();
    // The Secret (old password) was read and the vCenter connected (no login yet).
    wait_for("the credentials Secret to be read", WAIT, || async {
        (!provider.awaits_credentials()).then_some(())
    })
    .await;
    rotate(&client, &ns, "pw-new-7c1d").await;

    let instances = provider.instances_v2().unwrap();
    let meta = instances.instance_metadata(&node("node-rotated", None)).await;
    stop.cancel();
    let meta = meta.expect("the login with the rotated password succeeds");
    assert_eq!(meta.provider_id, format!("vsphere://{}", sim.vm("DC0_H0_VM0").uuid));
}

/// A login rejected with the Secret unchanged: the Secret is read again, nothing new, and
/// further logins are refused (throttled) instead of hammering SSO; the error says so.
#[tokio::test]
async fn a_wrong_password_in_an_unchanged_secret_throttles_logins() {
    let cp = ControlPlane::shared().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    let sim = Vcsim::start_with_login("admin", "right-pw");
    let ns = secret_namespace(&client, "wrong-pw-5d2a").await;
    let config = format!(
        "global:\n  insecureFlag: true\n  secretName: creds\n  secretNamespace: {ns}\nvcenter:\n{}",
        sim.vcenter_yaml("vc1")
    );
    let provider = VsphereProvider::new(config.as_bytes(), &CredentialSources::default()).unwrap();
    let stop = CancellationToken::new();
    provider.initialize(ProviderInit::new(client.clone(), stop.clone())).unwrap();
    wait_for("the credentials Secret to be read", WAIT, || async {
        (!provider.awaits_credentials()).then_some(())
    })
    .await;
    let instances = provider.instances_v2().unwrap();
    let nobody = node("n", Some("vsphere://00000000-0000-0000-0000-000000000001"));
    let first = instances.instance_exists(&nobody).await.unwrap_err().to_string();
    let second = instances.instance_exists(&nobody).await.unwrap_err().to_string();
    stop.cancel();
    eprintln!("first: {first}\nsecond: {second}");
    assert!(first.contains("not authorized") || first.contains("InvalidLogin"), "{first}");
    assert!(second.contains("throttled") && second.contains("vc1"), "{second}");
    for e in [&first, &second] {
        assert!(!e.contains("wrong-pw-5d2a"), "the password leaked: {e}");
    }
}

/// Upstream's environment: `VSPHERE_VCENTER_<ID>` + `VCENTER_<ID>_*` define a vCenter,
/// `VSPHERE_USER`/`VSPHERE_PASSWORD` fill its credentials, and `VSPHERE_LABEL_ZONE`
/// overrides the file's zone category (environment wins over the file, as upstream).
#[tokio::test]
async fn upstreams_environment_defines_vcenters_and_overrides_the_file() {
    let sim = Vcsim::start_with_login("env-user", "env-pw-9a1f");
    sim.guest("DC0_H0_VM0", "node-env", &[("VM Network", &["10.0.0.8"])]);
    sim.tag("env-zone", "zone-from-env", "DC0_H0");
    sim.tag("file-zone", "zone-from-file", "DC0_H0");
    let env: BTreeMap<String, String> = [
        ("VSPHERE_VCENTER_A", "vc-env".to_string()),
        ("VCENTER_A_SERVER", "127.0.0.1".to_string()),
        ("VCENTER_A_PORT", sim.port.to_string()),
        ("VCENTER_A_INSECURE", "true".to_string()),
        ("VSPHERE_USER", "env-user".to_string()),
        ("VSPHERE_PASSWORD", "env-pw-9a1f".to_string()),
        ("VSPHERE_LABEL_ZONE", "env-zone".to_string()),
    ]
    .map(|(k, v)| (k.to_string(), v))
    .into();
    let sources = CredentialSources { env, ..Default::default() };
    let provider =
        VsphereProvider::new(b"labels:\n  zone: file-zone\n", &sources).expect("env vCenter");
    assert_eq!(provider.config().vcenters[0].name, "vc-env");
    let meta = provider
        .instances_v2()
        .unwrap()
        .instance_metadata(&node("node-env", None))
        .await
        .expect("the vCenter from the environment answers");
    assert_eq!(meta.provider_id, format!("vsphere://{}", sim.vm("DC0_H0_VM0").uuid));
    assert_eq!(meta.zone, "zone-from-env");
}

/// Upstream: the global `server` is a vCenter of its own next to the `vcenter` entries.
#[tokio::test]
async fn the_global_server_is_a_vcenter_next_to_the_vcenter_entries() {
    let (a, b) = (Vcsim::start(), Vcsim::start());
    a.guest("DC0_H0_VM0", "node-in-global", &[("VM Network", &["10.1.0.1"])]);
    b.guest("DC0_H0_VM0", "node-in-entry", &[("VM Network", &["10.2.0.1"])]);
    let config = format!(
        "global:\n  server: 127.0.0.1\n  port: {}\n  user: u\n  password: p\n  insecureFlag: true\nvcenter:\n{}",
        a.port,
        b.vcenter_yaml("vc-b")
    );
    let provider = VsphereProvider::new(config.as_bytes(), &CredentialSources::default()).unwrap();
    let names: Vec<&str> = provider.config().vcenters.iter().map(|v| v.name.as_str()).collect();
    assert_eq!(names, ["127.0.0.1", "vc-b"]);
    let instances = provider.instances_v2().unwrap();
    let in_global = instances.instance_metadata(&node("node-in-global", None)).await.unwrap();
    assert_eq!(in_global.provider_id, format!("vsphere://{}", a.vm("DC0_H0_VM0").uuid));
    let in_entry = instances.instance_metadata(&node("node-in-entry", None)).await.unwrap();
    assert_eq!(in_entry.provider_id, format!("vsphere://{}", b.vm("DC0_H0_VM0").uuid));
}

/// Records the leaf certificate a TLS server presents (accepting anything).
#[derive(Debug)]
struct Capture(Mutex<Option<Vec<u8>>>, Arc<rustls::crypto::CryptoProvider>);

impl rustls::client::danger::ServerCertVerifier for Capture {
    fn verify_server_cert(
        &self,
        end_entity: &rustls::pki_types::CertificateDer<'_>,
        _: &[rustls::pki_types::CertificateDer<'_>],
        _: &rustls::pki_types::ServerName<'_>,
        _: &[u8],
        _: rustls::pki_types::UnixTime,
    ) -> Result<rustls::client::danger::ServerCertVerified, rustls::Error> {
        *self.0.lock().unwrap() = Some(end_entity.as_ref().to_vec());
        Ok(rustls::client::danger::ServerCertVerified::assertion())
    }
    fn verify_tls12_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(m, c, d, &self.1.signature_verification_algorithms)
    }
    fn verify_tls13_signature(
        &self,
        m: &[u8],
        c: &rustls::pki_types::CertificateDer<'_>,
        d: &rustls::DigitallySignedStruct,
    ) -> Result<rustls::client::danger::HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(m, c, d, &self.1.signature_verification_algorithms)
    }
    fn supported_verify_schemes(&self) -> Vec<rustls::SignatureScheme> {
        self.1.signature_verification_algorithms.supported_schemes()
    }
}

/// The SHA-1 thumbprint of the certificate served on 127.0.0.1:`port`, as govc prints it
/// (`AA:BB:...`), computed here independently of the provider.
fn served_thumbprint(port: u16) -> String {
    use std::io::Write;
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let capture = Arc::new(Capture(Mutex::new(None), provider.clone()));
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .dangerous()
        .with_custom_certificate_verifier(capture.clone())
        .with_no_client_auth();
    let name = rustls::pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let mut conn = rustls::ClientConnection::new(Arc::new(config), name).unwrap();
    let mut sock = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    let mut tls = rustls::Stream::new(&mut conn, &mut sock);
    tls.write_all(b"GET / HTTP/1.0\r\n\r\n").unwrap();
    let der = capture.0.lock().unwrap().clone().expect("a certificate");
    let digest = aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, &der);
    digest.as_ref().iter().map(|b| format!("{b:02X}")).collect::<Vec<_>>().join(":")
}

/// `thumbprint` pins the server certificate: the matching thumbprint is enough to connect
/// (no CA, no insecureFlag); any other is refused naming the vCenter and both thumbprints,
/// even with insecureFlag or a trusted caFile (never a fall-back to no verification).
#[tokio::test]
async fn a_thumbprint_pins_the_vcenter_certificate() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-pinned", &[("VM Network", &["10.0.0.9"])]);
    let actual = served_thumbprint(sim.port);
    assert_eq!(actual.len(), 59, "{actual}");
    let provider = |extra: &str| {
        let config = format!(
            "global:\n  user: u\n  password: p\n{extra}vcenter:\n{}",
            sim.vcenter_yaml("vc1")
        );
        VsphereProvider::new(config.as_bytes(), &CredentialSources::default()).unwrap()
    };
    let lookup = |p: VsphereProvider| async move {
        p.instances_v2().unwrap().instance_metadata(&node("node-pinned", None)).await
    };

    // The matching thumbprint (also written in lower case) is trusted by itself.
    for written in [actual.clone(), actual.to_ascii_lowercase()] {
        let meta = lookup(provider(&format!("  thumbprint: \"{written}\"\n")))
            .await
            .expect("the pinned certificate is accepted");
        assert_eq!(meta.provider_id, format!("vsphere://{}", sim.vm("DC0_H0_VM0").uuid));
    }

    // Another thumbprint is refused, with insecureFlag or a CA that trusts the server.
    let wrong = "00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD:EE:FF:00:11:22:33";
    for extra in [
        format!("  thumbprint: \"{wrong}\"\n"),
        format!("  thumbprint: \"{wrong}\"\n  insecureFlag: true\n"),
        format!("  thumbprint: \"{wrong}\"\n  caFile: {}\n", sim.ca_file),
    ] {
        let err = lookup(provider(&extra)).await.expect_err("a wrong thumbprint is refused");
        let err = format!("{err:#}");
        let chain = {
            let mut s = err.clone();
            s.push_str(&format!("{:?}", err));
            s
        };
        eprintln!("{extra}: {err}");
        assert!(
            chain.contains("vc1")
                && chain.contains("thumbprint mismatch")
                && chain.contains(wrong)
                && chain.contains(&actual),
            "{extra}: {err}"
        );
    }

    // A malformed thumbprint fails at start, naming the key.
    let config = format!(
        "global:\n  user: u\n  password: p\nvcenter:\n{}    thumbprint: \"AB:CD\"\n",
        sim.vcenter_yaml("vc1")
    );
    let err = VsphereProvider::new(config.as_bytes(), &CredentialSources::default())
        .expect_err("a malformed thumbprint")
        .to_string();
    assert!(err.contains("vcenter.vc1.thumbprint"), "{err}");
}

/// When the manager stops, every vCenter session (SOAP and tagging) is logged out.
#[tokio::test]
async fn shutdown_logs_out_of_every_vcenter_session() {
    let cp = ControlPlane::shared().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-logout", &[("VM Network", &["10.0.0.11"])]);
    sim.tag("k8s-zone", "zone-a", "DC0_H0");
    let upstream = Url::parse(&format!("https://127.0.0.1:{}", sim.port)).unwrap();
    let proxy = FaultProxy::start(upstream, Protocol::VimSoap).await.unwrap();
    let config = format!(
        "global:\n  user: u\n  password: p\n  insecureFlag: true\nvcenter:\n  vc1:\n    server: 127.0.0.1\n    port: {}\nlabels:\n  zone: k8s-zone\n",
        proxy.port()
    );
    let provider = VsphereProvider::new(config.as_bytes(), &CredentialSources::default()).unwrap();
    let stop = CancellationToken::new();
    provider.initialize(ProviderInit::new(client, stop.clone())).unwrap();
    let instances: Arc<dyn InstancesV2> = provider.instances_v2().unwrap();
    let meta = instances.instance_metadata(&node("node-logout", None)).await.unwrap();
    assert_eq!(meta.zone, "zone-a");
    let admin = proxy.admin();
    let c = admin.counters().await.unwrap();
    assert_eq!((c.get("vim25:Login"), c.get("vim25:Logout")), (1, 0), "{c:?}");

    stop.cancel();
    let c = wait_for("both sessions logged out", WAIT, || async {
        let c = admin.counters().await.unwrap();
        (c.get("vim25:Logout") == 1 && c.get("rest:DELETE /rest/com/vmware/cis/session") == 1)
            .then_some(c)
    })
    .await;
    eprintln!("calls: {c:?}");
    // The sessions are gone on our side too: a later call logs in again.
    instances.instance_metadata(&node("node-logout", None)).await.unwrap();
    assert_eq!(admin.counters().await.unwrap().get("vim25:Login"), 2);
}
