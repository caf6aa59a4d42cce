//! The fault proxy in front of real vcsim, driven by the vSphere provider's own clients: it
//! terminates TLS with a testbed-CA certificate (the client's `caFile` trusts it; the
//! `insecureFlag` works too), re-originates TLS to vcsim, names vim25 and CIS REST calls, and a
//! paused proxy makes the vSphere calls fail.

use std::time::Duration;

use ccm_emulators::admin::PauseMode;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
use ccm_provider_vsphere::client::tagging::TaggingClient;
use ccm_provider_vsphere::client::vim25::Vim25Client;
use ccm_provider_vsphere::client::{Endpoint, Secret};
use ccm_testbed::vcsim::Vcsim;

fn endpoint(proxy: &FaultProxy, ca_file: bool) -> Endpoint {
    Endpoint {
        name: "vc1".into(),
        server: "127.0.0.1".into(),
        port: proxy.port(),
        user: "u".into(),
        password: Secret::new("p"),
        insecure: !ca_file,
        ca_file: ca_file.then(|| proxy.ca_file().unwrap().to_path_buf()),
        thumbprint: None,
        login: Default::default(),
        timeout: Duration::from_secs(20),
    }
}

#[tokio::test]
async fn counts_and_faults_the_vsphere_clients_calls_through_vcsim() {
    let sim = Vcsim::start();
    let upstream = Url::parse(&format!("https://127.0.0.1:{}", sim.port)).unwrap();
    let proxy = FaultProxy::start(upstream, Protocol::VimSoap).await.unwrap();
    assert!(proxy.url().starts_with("https://127.0.0.1:"), "{}", proxy.url());
    let admin = proxy.admin();

    let vim = Vim25Client::new(endpoint(&proxy, true)).unwrap();
    let dcs = vim.datacenters().await.unwrap();
    assert!(dcs.contains_key("DC0"), "{dcs:?}");
    let c = admin.counters().await.unwrap();
    eprintln!("vSphere calls for datacenters(): {c:?}");
    assert_eq!(c.get("vim25:RetrieveServiceContent"), 1, "{c:?}");
    assert_eq!(c.get("vim25:Login"), 1, "{c:?}");
    let reads = c.get("vim25:RetrievePropertiesEx") + c.get("vim25:RetrieveProperties");
    assert!(reads >= 1, "{c:?}");

    // The insecure flag works through the proxy too.
    let insecure = Vim25Client::new(endpoint(&proxy, false)).unwrap();
    insecure.datacenters().await.unwrap();

    // CIS REST (tagging) calls are named by method and path template.
    let tags = TaggingClient::new(endpoint(&proxy, true)).unwrap();
    tags.category_ids().await.unwrap();
    let c = admin.counters().await.unwrap();
    assert_eq!(c.get("rest:POST /rest/com/vmware/cis/session"), 1, "{c:?}");
    assert_eq!(c.get("rest:GET /rest/com/vmware/cis/tagging/category"), 1, "{c:?}");

    // A SOAP fault the client reads as a vim25 fault.
    admin
        .inject(
            FaultRule::new("vim25:Retrieve*", Fault::Status { status: 500, body: None }).times(1),
        )
        .await
        .unwrap();
    let e = vim.datacenters().await.unwrap_err();
    assert!(
        e.to_string().contains("SystemError") || e.to_string().contains("injected fault"),
        "{e}"
    );

    // Paused: the vSphere call fails; resumed: it works again.
    admin.pause(PauseMode::Fail).await.unwrap();
    assert!(vim.datacenters().await.is_err(), "a paused proxy fails the call");
    let faulted = admin.counters().await.unwrap().faulted;
    assert!(faulted >= 2, "{faulted}");
    admin.resume().await.unwrap();
    assert!(vim.datacenters().await.unwrap().contains_key("DC0"));
}
