//! No AWS call hangs: against an endpoint that accepts connections and never answers, the
//! provider's lookups fail within their operation timeout with an error naming the operation,
//! and a warning naming the stalled call is logged first.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_core::cloud::{CloudProvider, ProviderError};
use ccm_provider_aws::client::CallTimeouts;
use ccm_provider_aws::{ApiMetrics, AwsClients, Cloud, CloudConfig, LazyClients, testing};

use crate::moto::node;

/// A loopback TCP listener that accepts every connection and never sends a byte (it keeps
/// the connections open). Stops with the test's runtime.
async fn silent_endpoint() -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    format!("http://{addr}")
}

/// Log lines written through `tracing` while the guard lives (this thread only: the test
/// runs on tokio's current-thread runtime, so spawned tasks log here too).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Captured {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn lookups_against_an_endpoint_that_never_answers_fail_naming_the_operation() {
    // Production keeps upstream's 30 s; the test shortens the operation timeout to 3 s.
    assert_eq!(CallTimeouts::default().operation, Duration::from_secs(30));
    let timeouts = CallTimeouts::with_operation(Duration::from_secs(3));

    let logs = Captured::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::WARN)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);
    ccm_core::testing::anchor_tracing();

    let url = silent_endpoint().await;
    let cfg = CloudConfig::parse(&testing::cloud_config(&url, "hang", "")).unwrap();
    let clients = AwsClients::from_sdk_config_with_timeouts(
        &cfg,
        &testing::sdk().await,
        ApiMetrics::default(),
        timeouts,
    )
    .await
    .unwrap();
    let cloud = Cloud::with_clients(cfg, Arc::new(LazyClients::ready(clients)));
    let iv2 = cloud.instances_v2().unwrap();

    // Generous bound: without timeouts the call never returns at all.
    let bound = Duration::from_secs(60);
    let by_id = node("by-id", Some("aws:///us-east-1a/i-0123456789abcdef0".into()));
    let start = Instant::now();
    let res = tokio::time::timeout(bound, iv2.instance_exists(&by_id))
        .await
        .expect("instance_exists hung against an endpoint that never answers");
    let took = start.elapsed();
    let err = res.expect_err("a lookup that got no answer must fail");
    assert!(!matches!(err, ProviderError::InstanceNotFound), "{err:?}");
    let msg = err.to_string();
    eprintln!("instance_exists failed after {took:?}: {msg}");
    assert!(msg.contains("DescribeInstances"), "{msg}");
    assert!(msg.to_lowercase().contains("timeout"), "{msg}");

    // The stalled call was logged by name before it failed.
    let log = logs.text();
    assert!(
        log.contains("cloud call is stalled") && log.contains("ec2:DescribeInstances"),
        "no stall warning naming the call:\n{log}"
    );

    // Node initialisation (metadata by private DNS name) fails the same way: an error, not
    // "not found" and not a hang.
    let start = Instant::now();
    let res =
        tokio::time::timeout(bound, iv2.instance_metadata(&node("ip-10-0-0-9.ec2.internal", None)))
            .await
            .expect("instance_metadata hung against an endpoint that never answers");
    let err = res.expect_err("a lookup that got no answer must fail");
    eprintln!("instance_metadata failed after {:?}: {err}", start.elapsed());
    assert!(!matches!(err, ProviderError::InstanceNotFound), "{err:?}");
    assert!(err.to_string().contains("DescribeInstances"), "{err}");
}
