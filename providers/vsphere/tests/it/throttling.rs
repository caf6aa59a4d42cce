//! Retries of transient faults (issue #12, throttling storm): with vcsim behind the fault
//! proxy answering half of all calls with vCenter's "busy, retry later" (HTTP 503 with
//! `Retry-After`) and dropping connections mid-call, the clients' lookups still succeed; a
//! rejected login is never retried (it could lock an SSO account), even after busy answers,
//! and after a rejection further logins of that vCenter are throttled (issue 14).

use std::time::Duration;

use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
use ccm_provider_vsphere::client::tagging::TaggingClient;
use ccm_provider_vsphere::client::vim25::Vim25Client;
use ccm_provider_vsphere::client::{ClientError, Endpoint, FaultKind, LoginGate, MoRef, Secret};

use crate::sim::Vcsim;

async fn proxy(sim: &Vcsim) -> FaultProxy {
    let upstream = Url::parse(&format!("https://127.0.0.1:{}", sim.port)).unwrap();
    FaultProxy::start(upstream, Protocol::VimSoap).await.unwrap()
}

fn endpoint(proxy: &FaultProxy, user: &str, password: &str) -> Endpoint {
    Endpoint {
        name: "vc1".into(),
        server: "127.0.0.1".into(),
        port: proxy.port(),
        user: user.into(),
        password: Secret::new(password),
        insecure: true,
        ca_file: None,
        thumbprint: None,
        login: Default::default(),
        // Generous: the deadline bounds the retries' waits too (1 s Retry-After each).
        timeout: Duration::from_secs(60),
    }
}

#[tokio::test]
async fn lookups_succeed_when_half_the_calls_are_throttled_or_dropped() {
    let sim = Vcsim::start();
    sim.tag("k8s-zone", "zone-a", &sim.vm("DC0_H0_VM0").moref);
    let proxy = proxy(&sim).await;
    let admin = proxy.admin();
    // Two connections closed mid-call, then half of everything busy (seeded: the same
    // sequence every run).
    admin.inject(FaultRule::new("vim25:FindByUuid", Fault::Drop).times(2)).await.unwrap();
    admin
        .inject(
            FaultRule::new("*", Fault::Throttle { retry_after_secs: 1 }).probability(0.5).seed(12),
        )
        .await
        .unwrap();

    // A node's start-up, call by call: service content, login, datacenters, search, read.
    let vim = Vim25Client::new(endpoint(&proxy, "u", "p")).unwrap();
    let dcs = vim.datacenters().await.expect("datacenters under throttling");
    let dc = dcs.get("DC0").expect("DC0").clone();
    let vm = sim.vm("DC0_H0_VM0");
    let expected = MoRef::new("VirtualMachine", vm.moref.clone());
    let found = vim.find_vm_by_uuid(Some(&dc), &vm.uuid).await.expect("FindByUuid under faults");
    assert_eq!(found, Some(expected.clone()));
    let info = vim.vm_info(&expected).await.expect("vm_info under throttling").expect("VM exists");
    assert_eq!(info.name, "DC0_H0_VM0");
    let host = info.host.clone().expect("runtime.host");
    assert!(vim.parent(&host).await.expect("parent under throttling").is_some());

    // The tagging REST calls too: session, attached tags, tag, category.
    let tagging = TaggingClient::new(endpoint(&proxy, "u", "p")).unwrap();
    let ids = tagging.attached_tags(&expected).await.expect("attached tags under throttling");
    assert_eq!(ids.len(), 1, "{ids:?}");
    let tag = tagging.tag(&ids[0]).await.expect("tag under throttling");
    assert_eq!(tag.name, "zone-a");
    let category = tagging.category(&tag.category_id).await.expect("category under throttling");
    assert_eq!(category.name, "k8s-zone");

    let c = admin.counters().await.unwrap();
    eprintln!("calls under throttling: {c:?}");
    assert!(c.faulted >= 4, "the storm throttled too little to show anything: {c:?}");
    assert!(c.get("vim25:FindByUuid") >= 3, "two dropped connections, then an answer: {c:?}");
}

#[tokio::test]
async fn a_rejected_login_is_not_retried_even_after_busy_answers() {
    let sim = Vcsim::start_with_login("admin", "right");
    let proxy = proxy(&sim).await;
    let admin = proxy.admin();
    // The first two logins are answered "busy": retried. The third reaches vcsim, which
    // rejects the password: that answer is final.
    admin
        .inject(FaultRule::new("vim25:Login", Fault::Throttle { retry_after_secs: 1 }).times(2))
        .await
        .unwrap();
    admin
        .inject(
            FaultRule::new(
                "rest:POST /rest/com/vmware/cis/session",
                Fault::Throttle { retry_after_secs: 1 },
            )
            .times(1),
        )
        .await
        .unwrap();

    let vim = Vim25Client::new(endpoint(&proxy, "admin", "wrong")).unwrap();
    let err = vim.datacenters().await.unwrap_err();
    assert!(
        matches!(err.fault().map(|f| &f.kind), Some(FaultKind::InvalidLogin)),
        "expected the InvalidLogin fault, got {err:?}"
    );
    assert!(!err.to_string().contains("wrong"), "the password leaked: {err}");
    let tagging = TaggingClient::new(endpoint(&proxy, "admin", "wrong")).unwrap();
    let err = tagging.category_ids().await.unwrap_err();
    assert!(matches!(err, ClientError::Unauthorized { .. }), "{err:?}");

    let c = admin.counters().await.unwrap();
    eprintln!("calls with a rejected password: {c:?}");
    assert_eq!(c.get("vim25:Login"), 3, "2 busy + 1 rejected, never again: {c:?}");
    assert_eq!(c.get("rest:POST /rest/com/vmware/cis/session"), 2, "1 busy + 1 rejected: {c:?}");
    assert_eq!(c.get("rest:GET /rest/com/vmware/cis/tagging/category"), 0, "{c:?}");
}

/// Issue 14 (SSO lockout): after a rejected login, no login of that vCenter (SOAP or REST)
/// is sent until the throttle window has passed; calls fail at once with an error saying
/// logins are throttled. After the window exactly one attempt is made.
#[tokio::test]
async fn a_rejected_login_throttles_every_login_of_that_vcenter() {
    let sim = Vcsim::start_with_login("admin", "right");
    let proxy = proxy(&sim).await;
    let admin = proxy.admin();
    let mut ep = endpoint(&proxy, "admin", "wrong-8e2f");
    ep.login = LoginGate::new(Duration::from_secs(3));
    let vim = Vim25Client::new(ep.clone()).unwrap();
    let tagging = TaggingClient::new(ep).unwrap();

    let err = vim.datacenters().await.unwrap_err();
    assert!(matches!(err.fault().map(|f| &f.kind), Some(FaultKind::InvalidLogin)), "{err:?}");
    for _ in 0..3 {
        let err = vim.datacenters().await.unwrap_err();
        assert!(matches!(err, ClientError::LoginThrottled { .. }), "{err:?}");
        let shown = err.to_string();
        assert!(shown.contains("vc1") && shown.contains("throttled"), "{shown}");
        let err = tagging.category_ids().await.unwrap_err();
        assert!(matches!(err, ClientError::LoginThrottled { .. }), "{err:?}");
    }
    let c = admin.counters().await.unwrap();
    eprintln!("calls while throttled: {c:?}");
    assert_eq!(c.get("vim25:Login"), 1, "one rejected login, then none: {c:?}");
    assert_eq!(c.get("rest:POST /rest/com/vmware/cis/session"), 0, "{c:?}");

    // After the window: one attempt (rejected again), then throttled again.
    let err = ccm_testbed::wait_for(
        "a login after the throttle window",
        Duration::from_secs(60),
        || async {
            match vim.datacenters().await {
                Err(ClientError::LoginThrottled { .. }) => None,
                other => Some(other),
            }
        },
    )
    .await
    .unwrap_err();
    assert!(matches!(err.fault().map(|f| &f.kind), Some(FaultKind::InvalidLogin)), "{err:?}");
    assert!(matches!(vim.datacenters().await, Err(ClientError::LoginThrottled { .. })));
    assert_eq!(admin.counters().await.unwrap().get("vim25:Login"), 2);
    assert!(!format!("{err:?}").contains("wrong-8e2f"));
}
