//! Client certificates on the wire (`[Global] cert-file` / `key-file`, mutual TLS): the
//! emulator (Keystone, Nova, Neutron, Octavia on one HTTPS server) requires a client
//! certificate signed by its own client CA. With the files set, Nodes on a real kube-apiserver
//! are initialised by the cloud-node controller; without them, or with a certificate another
//! CA signed, the first call (Keystone) fails naming `cert-file` and the server's TLS alert,
//! and the Node is not initialised. An encrypted or unreadable key is a config error naming
//! `key-file`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ccm_emulators::openstack::{OpenStackCloud, OpenStackOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::tls::TlsIdentity;
use ccm_emulators::world::World;
use ccm_provider_openstack::client::{ClientError, OpenStackClient};
use ccm_provider_openstack::config::{Config, Global};
use ccm_testbed::fixtures::kubelet_node;
use ccm_testbed::{ControlPlane, wait_for};
use k8s_openapi::api::core::v1::Node;
use kube::Api;
use kube::api::PostParams;

use crate::fixture::{WORLD, fast_options, global, run_node_controller};

struct Mtls {
    cloud: Arc<OpenStackCloud>,
    server: Server,
    dir: tempfile::TempDir,
    /// `[Global]` with `ca-file` and no client certificate.
    global: Global,
}

/// The emulator over HTTPS, requiring a client certificate of its client CA.
async fn start() -> Mtls {
    let cloud = OpenStackCloud::new(World::parse(WORLD).unwrap(), OpenStackOptions::default());
    let tls = TlsIdentity::generate_requiring_client_certs().unwrap();
    let server =
        Server::start_with_tls(cloud.clone(), ServerOptions::default(), tls).await.unwrap();
    // The catalog names the server's https:// URL (by default the request's Host, over http).
    cloud.set_catalog_base(Some(server.url()));
    let mut g = global(&server.url());
    g.ca_file = server.ca_file().map(Path::to_path_buf);
    Mtls { cloud, server, dir: tempfile::tempdir().unwrap(), global: g }
}

/// Writes a client certificate and key of `tls`'s client CA; their paths.
fn client_files(tls: &TlsIdentity, dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let (cert, key) = tls.client_cert("kube-ccm").unwrap().expect("client auth is on");
    let (cert_path, key_path) = (dir.join(format!("{name}.crt")), dir.join(format!("{name}.key")));
    std::fs::write(&cert_path, cert).unwrap();
    std::fs::write(&key_path, key).unwrap();
    (cert_path, key_path)
}

/// A client certificate and key from a CA of another name (`other-ca`), unknown to the
/// emulator.
fn other_ca_files(dir: &Path) -> (PathBuf, PathBuf) {
    use rcgen::{
        BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose,
        IsCa, KeyPair, KeyUsagePurpose,
    };
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name.push(DnType::CommonName, "other-ca");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::DigitalSignature];
    let ca = CertifiedIssuer::self_signed(ca, KeyPair::generate().unwrap()).unwrap();
    let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf.distinguished_name.push(DnType::CommonName, "kube-ccm");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &ca).unwrap();
    let (cert_path, key_path) = (dir.join("other-ca.crt"), dir.join("other-ca.key"));
    std::fs::write(&cert_path, cert.pem()).unwrap();
    std::fs::write(&key_path, key.serialize_pem()).unwrap();
    (cert_path, key_path)
}

fn with_cert(g: &Global, (cert, key): (PathBuf, PathBuf)) -> Global {
    Global { cert_file: Some(cert), key_file: Some(key), ..g.clone() }
}

/// Without `cert-file`/`key-file` the kubelet's Node stays uninitialised and the provider's
/// error names `cert-file` and the server's `CertificateRequired` alert; with them the same
/// Node is initialised (providerID, zone) over mutual TLS.
#[tokio::test]
async fn with_cert_file_and_key_file_nodes_initialise_over_mutual_tls() {
    // Its own control plane: the cloud-node controller acts on every Node of the cluster.
    let cp = ControlPlane::start().await.expect("control plane starts");
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let m = start().await;
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(&PostParams::default(), &kubelet_node("node-a", "10.0.0.11", "True"))
        .await
        .unwrap();

    // No client certificate: nothing is initialised, and the error says why.
    let config = Config { global: m.global.clone(), ..Config::default() };
    let (token, provider) = run_node_controller(&client, &config);
    let md = provider
        .instances_v2()
        .unwrap()
        .instance_metadata(&crate::fixture::node("node-a", None))
        .await
        .unwrap_err()
        .to_string();
    println!("without cert-file: {md}");
    assert!(md.contains("[Global] cert-file") && md.contains("CertificateRequired"), "{md}");
    tokio::time::sleep(Duration::from_secs(3)).await;
    let n = nodes.get("node-a").await.unwrap();
    assert_eq!(n.spec.and_then(|s| s.provider_id), None, "initialised without a certificate");
    assert_eq!(m.cloud.tokens_issued(), 0);
    token.cancel();

    // With the emulator CA's client certificate: initialised.
    let tls = m.server.tls_identity().unwrap();
    let files = client_files(tls, m.dir.path(), "ccm");
    let config = Config { global: with_cert(&m.global, files), ..Config::default() };
    let (token, provider) = run_node_controller(&client, &config);
    let md = provider
        .instances_v2()
        .unwrap()
        .instance_metadata(&crate::fixture::node("node-a", None))
        .await;
    assert!(md.is_ok(), "with cert-file: {:?}", md.err().map(|e| e.to_string()));
    let n = wait_for("node-a to be initialised over mutual TLS", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        async move {
            let n = nodes.get("node-a").await.ok()?;
            n.spec.as_ref()?.provider_id.is_some().then_some(n)
        }
    })
    .await;
    let provider_id = n.spec.and_then(|s| s.provider_id).unwrap_or_default();
    assert_eq!(provider_id, format!("openstack:///{}", m.cloud.server_id("node-a").unwrap()));
    let zone = n.metadata.labels.unwrap_or_default().get("topology.kubernetes.io/zone").cloned();
    assert_eq!(zone.as_deref(), Some("az-1"));
    assert!(m.cloud.tokens_issued() >= 1);
    // The server's own admin client presents a certificate too.
    assert!(m.server.admin().counters().await.unwrap().get("nova.servers.list") >= 1);
    token.cancel();
}

/// No client certificate: Keystone's handshake is refused (`CertificateRequired`); a
/// certificate another CA signed: refused (`UnknownCA`). Each is a `ClientCertificate` error
/// naming the endpoint, the alert and `[Global] cert-file`, given at once (not retried as a
/// broken connection: the same handshake is refused again), and no token is issued.
#[tokio::test]
async fn without_a_client_certificate_or_with_another_cas_the_auth_fails_naming_cert_file() {
    let m = start().await;
    let started = Instant::now();
    let c = OpenStackClient::new(&m.global, fast_options()).unwrap();
    let err = c.project_id().await.unwrap_err();
    println!("no certificate: {err}");
    assert!(
        matches!(&err, ClientError::ClientCertificate { alert, .. } if alert == "CertificateRequired"),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(text.contains("/identity/v3/auth/tokens"), "{text}");
    assert!(text.contains("[Global] cert-file") && text.contains("key-file"), "{text}");

    let files = other_ca_files(m.dir.path());
    let c = OpenStackClient::new(&with_cert(&m.global, files), fast_options()).unwrap();
    let err = c.project_id().await.unwrap_err();
    println!("another CA's certificate: {err}");
    assert!(
        matches!(&err, ClientError::ClientCertificate { alert, .. } if alert == "UnknownCA"),
        "{err:?}"
    );
    assert!(err.to_string().contains("[Global] cert-file"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert_eq!(m.cloud.tokens_issued(), 0);

    // The emulator's own certificate works with the same client code.
    let files = client_files(m.server.tls_identity().unwrap(), m.dir.path(), "ccm");
    let c = OpenStackClient::new(&with_cert(&m.global, files), fast_options()).unwrap();
    let got = c.project_id().await;
    assert!(matches!(got, Ok(Some(_))), "{:?}", got.map_err(|e| e.to_string()));
    assert_eq!(m.cloud.tokens_issued(), 1);
}

/// An encrypted key (PKCS#8 or OpenSSL's legacy header) and a key file that cannot be read
/// are config errors naming `[Global] key-file`, at start (no call made), never quoting the
/// key and never a panic.
#[tokio::test]
async fn an_encrypted_or_unreadable_key_file_is_a_config_error_naming_key_file() {
    let m = start().await;
    let (cert, _) = client_files(m.server.tls_identity().unwrap(), m.dir.path(), "ccm");
    let encrypted = m.dir.path().join("encrypted.key");
    let legacy = m.dir.path().join("legacy.key");
    std::fs::write(
        &encrypted,
        "-----BEGIN ENCRYPTED PRIVATE KEY-----\nU0VDUkVULUtFWS1CWVRFUw==\n-----END ENCRYPTED PRIVATE KEY-----\n",
    )
    .unwrap();
    std::fs::write(
        &legacy,
        "-----BEGIN RSA PRIVATE KEY-----\nProc-Type: 4,ENCRYPTED\nDEK-Info: AES-256-CBC,00112233445566778899AABBCCDDEEFF\n\nU0VDUkVULUtFWS1CWVRFUw==\n-----END RSA PRIVATE KEY-----\n",
    )
    .unwrap();
    for key in [&encrypted, &legacy] {
        let g = with_cert(&m.global, (cert.clone(), key.clone()));
        let err = OpenStackClient::new(&g, fast_options()).unwrap_err();
        println!("{}: {err}", key.display());
        assert!(matches!(err, ClientError::Config { .. }), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("[Global] key-file") && text.contains("encrypted"), "{text}");
        assert!(!format!("{err:?}").contains("U0VDUkVU"));
    }
    // A directory where the key should be: unreadable.
    let g = with_cert(&m.global, (cert.clone(), m.dir.path().to_path_buf()));
    let err = OpenStackClient::new(&g, fast_options()).unwrap_err();
    println!("a directory: {err}");
    assert!(
        err.to_string().contains("[Global] key-file") && err.to_string().contains("cannot read")
    );
    // A missing one.
    let g = with_cert(&m.global, (cert, m.dir.path().join("missing.key")));
    let err = OpenStackClient::new(&g, fast_options()).unwrap_err();
    assert!(err.to_string().contains("[Global] key-file"), "{err}");
    assert_eq!(m.cloud.tokens_issued(), 0);
}
