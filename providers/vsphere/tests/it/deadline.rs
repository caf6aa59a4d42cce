//! Per-request deadlines of the vim25 and tagging clients (issue #11 point 4): a vCenter that
//! accepts the connection and never answers makes each call log a stall warning naming the
//! vCenter and the call, then fail with `ClientError::Deadline` instead of hanging.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ccm_provider_vsphere::client::tagging::TaggingClient;
use ccm_provider_vsphere::client::vim25::Vim25Client;
use ccm_provider_vsphere::client::{ClientError, Endpoint, Secret};

const PASSWORD: &str = "deadline-s3cr3t-pw";

/// A loopback TCP listener that accepts every connection and never sends a byte.
async fn silent_server() -> u16 {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });
    port
}

fn endpoint(port: u16, timeout: Duration) -> Endpoint {
    Endpoint {
        name: "vc-stalled".into(),
        server: "127.0.0.1".into(),
        port,
        user: "administrator@vsphere.local".into(),
        password: Secret::new(PASSWORD),
        insecure: true,
        ca_file: None,
        thumbprint: None,
        login: Default::default(),
        timeout,
    }
}

/// Captures this thread's `tracing` output (the test runtime is single-threaded, so the
/// stall watch's task logs here too).
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

fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
    let captured = Captured::default();
    let writer = captured.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_ansi(false)
        .with_max_level(tracing::Level::TRACE)
        .with_writer(move || writer.clone())
        .finish();
    let guard = tracing::subscriber::set_default(subscriber);
    ccm_core::testing::anchor_tracing();
    (captured, guard)
}

#[tokio::test]
async fn a_vcenter_that_never_answers_is_logged_as_stalled_and_each_call_fails_at_its_deadline() {
    let (logs, _guard) = capture();
    let port = silent_server().await;
    let deadline = Duration::from_secs(2);

    let vim = Vim25Client::new(endpoint(port, deadline)).unwrap();
    let start = Instant::now();
    let err = vim.login().await.unwrap_err();
    let vim_elapsed = start.elapsed();
    let tagging = TaggingClient::new(endpoint(port, deadline)).unwrap();
    let start = Instant::now();
    let tag_err = tagging.category_ids().await.unwrap_err();
    let tagging_elapsed = start.elapsed();
    eprintln!("vim25 failed after {vim_elapsed:?}: {err}");
    eprintln!("tagging failed after {tagging_elapsed:?}: {tag_err}");
    let logs = logs.text();
    eprintln!("captured log:\n{logs}");

    // The first vim25 call (RetrieveServiceContent) is the one that stalls.
    match &err {
        ClientError::Deadline { vcenter, call, deadline: d } => {
            assert_eq!((vcenter.as_str(), call.as_str()), ("vc-stalled", "RetrieveServiceContent"));
            assert_eq!(*d, deadline);
        }
        other => panic!("expected a deadline error, got {other:?}"),
    }
    match &tag_err {
        ClientError::Deadline { vcenter, call, .. } => {
            assert_eq!((vcenter.as_str(), call.as_str()), ("vc-stalled", "create tagging session"));
        }
        other => panic!("expected a deadline error, got {other:?}"),
    }
    let message = err.to_string();
    assert!(
        message.contains("vc-stalled")
            && message.contains("RetrieveServiceContent")
            && message.contains("deadline"),
        "{message}"
    );
    // Bounded by the deadline, not by the 30 s default or a TCP timeout (generous margin).
    for elapsed in [vim_elapsed, tagging_elapsed] {
        assert!(elapsed >= deadline && elapsed < Duration::from_secs(25), "{elapsed:?}");
    }
    // Each stalled call was logged while it stalled, naming the vCenter and the call.
    for call in ["RetrieveServiceContent", "create tagging session"] {
        assert!(
            logs.lines()
                .any(|l| l.contains("stalled") && l.contains("vc-stalled") && l.contains(call)),
            "no stall warning for {call}:\n{logs}"
        );
    }
    assert!(!logs.contains(PASSWORD) && !format!("{err:?}{tag_err:?}").contains(PASSWORD));
}
