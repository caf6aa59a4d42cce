//! The client: scope discovery, credentials from the metadata server (renewed when they
//! expire), `token-url`, Compute's errors, retries, and waiting for operations.

use std::sync::Arc;
use std::time::Duration;

use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::gcp::GcpOptions;
use ccm_emulators::server::ServerOptions;
use ccm_provider_gcp::client::{GceClient, GceError, link, operation_outcome};
use ccm_provider_gcp::config::{Credentials, Global, Secret};
use google_cloud_compute_v1::model::Address;

use crate::fixture::{self, NETWORK, PROJECT, REGION, ZONE_A, ZONE_B};

#[tokio::test]
async fn the_scope_comes_from_the_config_and_the_region_s_zones() {
    let f = fixture::start().await;
    let s = f.client.scope().await.unwrap();
    assert_eq!(s.project, PROJECT);
    assert_eq!(s.network_project, PROJECT);
    assert_eq!(s.region, REGION);
    assert_eq!(s.local_zone, ZONE_A);
    assert_eq!(s.zones, vec![ZONE_A.to_string(), ZONE_B.to_string()]);
    assert_eq!(s.network_url, link(&format!("projects/{PROJECT}/global/networks/{NETWORK}")));
    // Worked out once.
    f.client.scope().await.unwrap();
    assert_eq!(f.server.counters().get("compute.zones.list"), 1);
}

#[tokio::test]
async fn without_a_config_the_metadata_server_names_project_zone_and_network() {
    let f = fixture::start().await;
    let client = GceClient::new(&Global::default(), f.options.clone()).unwrap();
    let s = client.scope().await.unwrap();
    assert_eq!(s.project, PROJECT);
    // The metadata server speaks for the world's first instance (node-a, zone a); without
    // multizone only the local zone is managed.
    assert_eq!(s.local_zone, ZONE_A);
    assert_eq!(s.zones, vec![ZONE_A.to_string()]);
    assert_eq!(s.network_url, link(&format!("projects/{PROJECT}/global/networks/{NETWORK}")));
    assert_eq!(f.server.counters().get("compute.zones.list"), 0);
}

#[tokio::test]
async fn mutations_wait_for_their_operation_and_errors_keep_compute_s_reason() {
    let f = fixture::start().await;
    let c = f.client.compute().await.unwrap();
    let insert = || {
        c.addresses
            .insert()
            .set_project(PROJECT)
            .set_region(REGION)
            .set_body(Address::new().set_name("a1"))
            .send()
    };
    f.client.mutate("compute.addresses.insert", insert).await.unwrap();
    // The operation was polled to DONE: the address is there, with an IP.
    let got = f
        .client
        .call("compute.addresses.get", || {
            c.addresses.get().set_project(PROJECT).set_region(REGION).set_address("a1").send()
        })
        .await
        .unwrap();
    assert!(got.address.is_some_and(|a| !a.is_empty()));
    assert!(f.server.counters().get("compute.regionOperations.get") >= 1);

    let e = f.client.mutate("compute.addresses.insert", insert).await.unwrap_err();
    assert!(e.is_already_exists(), "{e}");
    assert!(e.to_string().contains("compute.addresses.insert: 409 alreadyExists"), "{e}");

    let e = f
        .client
        .call("compute.addresses.get", || {
            c.addresses.get().set_project(PROJECT).set_region(REGION).set_address("nope").send()
        })
        .await
        .unwrap_err();
    assert!(e.is_not_found(), "{e}");
    assert!(!e.is_already_exists());
}

/// `start` sends a mutation without waiting for its operation (issue #35 (b): the groundwork
/// for syncs that requeue instead of holding a worker): while the operation runs the address
/// is not there and an insert of the same name is Compute's 409 `alreadyExists`; reads of the
/// operation then show it `DONE`, and a failed operation's outcome names Compute's code.
#[tokio::test]
async fn a_started_mutation_is_not_waited_for_and_its_operation_is_read_to_its_outcome() {
    let f = fixture::start().await;
    f.cloud.set_pending(Duration::from_millis(800));
    let c = f.client.compute().await.unwrap();
    let insert = |name: &'static str| {
        move || {
            c.addresses
                .insert()
                .set_project(PROJECT)
                .set_region(REGION)
                .set_body(Address::new().set_name(name))
                .send()
        }
    };
    let get = |name: &'static str| {
        let f = &f;
        async move {
            f.client
                .call("compute.addresses.get", || {
                    c.addresses
                        .get()
                        .set_project(PROJECT)
                        .set_region(REGION)
                        .set_address(name)
                        .send()
                })
                .await
        }
    };
    let sent = std::time::Instant::now();
    let mut op = f.client.start("compute.addresses.insert", insert("a1")).await.unwrap();
    assert!(sent.elapsed() < Duration::from_millis(800), "start waited for the operation");
    assert!(operation_outcome("compute.addresses.insert", &op).is_none(), "{op:?}");
    // Before DONE, Compute shows an inserted address RESERVING (other resources: 404).
    let reserving = get("a1").await.unwrap();
    assert_eq!(reserving.status.as_ref().and_then(|s| s.name()), Some("RESERVING"));
    let again = f.client.start("compute.addresses.insert", insert("a1")).await.unwrap_err();
    assert!(again.is_already_exists(), "{again}");

    let outcome = loop {
        if let Some(outcome) = operation_outcome("compute.addresses.insert", &op) {
            break outcome;
        }
        assert!(sent.elapsed() < Duration::from_secs(10), "the operation never ended: {op:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        op = f.client.operation("compute.addresses.insert", &op).await.unwrap();
    };
    outcome.unwrap();
    let done = get("a1").await.unwrap();
    assert_eq!(done.status.as_ref().and_then(|s| s.name()), Some("RESERVED"));
    assert!(done.address.is_some_and(|a| !a.is_empty()));

    f.server
        .admin()
        .fail_operations(
            "*/addresses/a2",
            ccm_emulators::asyncop::Action::Create,
            1,
            "QUOTA_EXCEEDED: Quota 'STATIC_ADDRESSES' exceeded.",
        )
        .await
        .unwrap();
    let mut op = f.client.start("compute.addresses.insert", insert("a2")).await.unwrap();
    let e = loop {
        if let Some(outcome) = operation_outcome("compute.addresses.insert", &op) {
            break outcome.unwrap_err();
        }
        assert!(sent.elapsed() < Duration::from_secs(20), "the operation never ended: {op:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
        op = f.client.operation("compute.addresses.insert", &op).await.unwrap();
    };
    assert!(e.to_string().contains("QUOTA_EXCEEDED"), "{e}");
    assert!(get("a2").await.is_err_and(|e| e.is_not_found()), "the failed insert made it");
}

#[tokio::test]
async fn reads_are_retried_when_throttled_and_5xx_mutations_are_not() {
    let f = fixture::start().await;
    let c = f.client.compute().await.unwrap();
    f.server
        .inject(
            FaultRule::new("compute.zones.get", Fault::Throttle { retry_after_secs: 0 }).times(2),
        )
        .unwrap();
    let z = f
        .client
        .call("compute.zones.get", || c.zones.get().set_project(PROJECT).set_zone(ZONE_B).send())
        .await
        .unwrap();
    assert_eq!(z.name.as_deref(), Some(ZONE_B));
    assert_eq!(f.server.counters().get("compute.zones.get"), 3);

    f.server
        .inject(
            FaultRule::new("compute.addresses.insert", Fault::Status { status: 503, body: None })
                .times(1),
        )
        .unwrap();
    let e = f
        .client
        .mutate("compute.addresses.insert", || {
            c.addresses
                .insert()
                .set_project(PROJECT)
                .set_region(REGION)
                .set_body(Address::new().set_name("a2"))
                .send()
        })
        .await
        .unwrap_err();
    assert!(matches!(e, GceError::Api { status: 503, .. }), "{e}");
    assert_eq!(f.server.counters().get("compute.addresses.insert"), 1);
}

#[tokio::test]
async fn an_expiring_metadata_token_is_renewed_and_a_dead_compute_is_an_error_in_time() {
    let opts = GcpOptions {
        pending: Duration::from_millis(50),
        token_lifetime: Duration::from_secs(2),
        ..GcpOptions::default()
    };
    let f = fixture::start_with(fixture::WORLD, opts, ServerOptions::default()).await;
    let c = f.client.compute().await.unwrap();
    let get = || c.zones.get().set_project(PROJECT).set_zone(ZONE_A).send();
    f.client.call("compute.zones.get", get).await.unwrap();
    let tokens = || f.server.counters().get("metadata.get");
    let before = tokens();
    tokio::time::sleep(Duration::from_secs(3)).await;
    // The token the SDK holds has expired: a new one is fetched, and no call fails.
    f.client.call("compute.zones.get", get).await.unwrap();
    assert!(tokens() > before, "no new token was fetched");

    f.server.inject(FaultRule::new("compute.*", Fault::Hang)).unwrap();
    let started = std::time::Instant::now();
    let e = f.client.call("compute.zones.get", get).await.unwrap_err();
    assert!(matches!(e, GceError::Deadline(_)), "{e}");
    assert!(started.elapsed() < Duration::from_secs(40));
}

#[tokio::test]
async fn token_url_credentials_post_the_body_and_never_leak_the_token() {
    let f = fixture::start().await;
    let mut g = fixture::global();
    g.credentials = Credentials::TokenUrl {
        url: format!("{}/token", f.server.url()).parse().unwrap(),
        body: Some(Secret("{\"cluster\":\"x\"}".into())),
    };
    let client = Arc::new(GceClient::new(&g, f.options.clone()).unwrap());
    let c = client.compute().await.unwrap();
    client
        .call("compute.zones.get", || c.zones.get().set_project(PROJECT).set_zone(ZONE_A).send())
        .await
        .unwrap();
    assert_eq!(f.server.counters().get("token.alt"), 1);
    assert!(!format!("{client:?}").contains("cluster"));
}

/// What `tracing` logs on this thread while the returned guard lives.
fn capture_logs() -> (Arc<std::sync::Mutex<Vec<u8>>>, tracing::subscriber::DefaultGuard) {
    #[derive(Clone)]
    struct Buf(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let buf = Arc::new(std::sync::Mutex::new(Vec::new()));
    let writer = Buf(buf.clone());
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    ccm_core::testing::anchor_tracing();
    (buf, guard)
}

/// A loopback HTTP server answering every request `200` with a JSON body of `size` bytes
/// (`Metadata-Flavor: Google`, as the metadata server); its root URL.
async fn oversized_server(size: usize) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut req = [0u8; 4096];
                let _ = conn.read(&mut req).await;
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\
                     metadata-flavor: Google\r\ncontent-length: {size}\r\n\r\n"
                );
                let _ = conn.write_all(head.as_bytes()).await;
                let chunk = vec![b' '; 64 << 10];
                let mut left = size;
                while left > 0 {
                    let n = left.min(chunk.len());
                    if conn.write_all(&chunk[..n]).await.is_err() {
                        return;
                    }
                    left -= n;
                }
            });
        }
    });
    url
}

/// Issue #29 (LOW): a `token-url`'s query string (a signature, say) never reaches an error
/// (so no event) or a log: the URL is shown as `scheme://host/path?<redacted>`.
#[tokio::test]
async fn a_token_url_s_query_string_never_reaches_errors_or_logs() {
    const SIG: &str = "Zq7signature";
    let f = fixture::start().await;
    // Nothing listens on port 1: reqwest's error names the full URL, ours must not.
    let mut g = fixture::global();
    g.credentials = Credentials::TokenUrl {
        url: format!("http://127.0.0.1:1/token?sig={SIG}").parse().unwrap(),
        body: None,
    };
    let (logs, guard) = capture_logs();
    let client = GceClient::new(&g, f.options.clone()).unwrap();
    let c = client.compute().await.unwrap();
    let e = client
        .call("compute.zones.get", || c.zones.get().set_project(PROJECT).set_zone(ZONE_A).send())
        .await
        .unwrap_err();
    drop(guard);
    let logs = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
    let shown = format!("{e} {e:?} {client:?}");
    eprintln!("{e}");
    assert!(!shown.contains(SIG), "{shown}");
    assert!(!logs.contains(SIG), "{logs}");
    assert!(shown.contains("token-url http://127.0.0.1:1/token?<redacted>"), "{shown}");
}

/// Issue #29 (LOW): replies the client reads itself are capped (`MAX_REPLY`): an endless
/// token or metadata reply is a clear error, not memory.
#[tokio::test]
async fn oversized_token_and_metadata_replies_are_refused() {
    use ccm_provider_gcp::client::{ClientOptions, MAX_REPLY};
    let big = oversized_server(MAX_REPLY + 1).await;
    let f = fixture::start().await;
    let mut g = fixture::global();
    g.credentials =
        Credentials::TokenUrl { url: format!("{big}/token").parse().unwrap(), body: None };
    let client = GceClient::new(&g, f.options.clone()).unwrap();
    let c = client.compute().await.unwrap();
    let e = client
        .call("compute.zones.get", || c.zones.get().set_project(PROJECT).set_zone(ZONE_A).send())
        .await
        .unwrap_err();
    assert!(e.to_string().contains(&format!("larger than {MAX_REPLY} bytes")), "{e}");

    let options = ClientOptions { metadata_endpoint: Some(big), ..f.options.clone() };
    let client = GceClient::new(&Global::default(), options).unwrap();
    let e = client.metadata("project/project-id").await.unwrap_err();
    assert!(
        matches!(&e, GceError::Metadata { message, .. } if message.contains("larger than")),
        "{e}"
    );
}
