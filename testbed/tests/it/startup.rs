//! Start-up robustness of the testbed's servers: a port taken by another process between
//! our choosing it and the server binding it is retried on fresh ports, and a server that
//! exits during start-up is reported at once with how it ended and the end of its log (not
//! after the full readiness timeout); one killed by a signal is retried.

use std::net::TcpListener;
use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use ccm_testbed::moto::{Moto, MotoError};
use ccm_testbed::tools::Tools;
use ccm_testbed::{ControlPlane, Error, StartOptions, unique_name};
use k8s_openapi::api::core::v1::Namespace;
use kube::Api;
use kube::api::ListParams;

/// Holds a loopback port, as the other process of the incident did.
fn hold_a_port() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// An executable shell script `name` with this body, in a fresh directory.
fn script(name: &str, body: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(unique_name("ccm-testbed-startup"));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
    path
}

async fn assert_serves(cp: &ControlPlane) {
    let client = cp.admin_client().await.unwrap();
    let namespaces: Api<Namespace> = Api::all(client);
    let list = namespaces.list(&ListParams::default()).await.unwrap();
    assert!(list.items.iter().any(|n| n.metadata.name.as_deref() == Some("default")));
}

#[tokio::test]
async fn a_taken_etcd_port_is_retried_on_fresh_ports_and_the_control_plane_serves() {
    let (_held, port) = hold_a_port();
    let options = StartOptions { etcd_port: Some(port), ..Default::default() };
    let cp = ControlPlane::start_with_options(Tools::locate().unwrap(), options)
        .await
        .expect("the start is retried on fresh ports");
    assert!(cp.start_attempts() >= 2, "the first attempt cannot have had port {port}");
    assert!(!cp.etcd_url().ends_with(&format!(":{port}")), "{}", cp.etcd_url());
    assert_serves(&cp).await;
    eprintln!("etcd port {port} held: ready on attempt {}", cp.start_attempts());
}

#[tokio::test]
async fn a_taken_apiserver_port_is_retried_on_fresh_ports_and_the_control_plane_serves() {
    let (_held, port) = hold_a_port();
    let options = StartOptions { api_port: Some(port), ..Default::default() };
    let cp = ControlPlane::start_with_options(Tools::locate().unwrap(), options)
        .await
        .expect("the start is retried on fresh ports");
    assert!(cp.start_attempts() >= 2, "the first attempt cannot have had port {port}");
    assert!(!cp.server().ends_with(&format!(":{port}")), "{}", cp.server());
    assert_serves(&cp).await;
    eprintln!("apiserver port {port} held: ready on attempt {}", cp.start_attempts());
}

#[tokio::test]
async fn a_server_that_exits_at_once_is_reported_at_once_with_the_end_of_its_log() {
    // The real tools, but an etcd that fails as a broken binary would.
    let real = Tools::locate().unwrap();
    let fake = script(
        "etcd",
        // Dies a moment after starting, as etcd does on a bad flag or a taken port: by then
        // the supervisor is waiting on our pipe and does not reap it (a zombie).
        "echo 'starting etcd'\nsleep 2\necho 'fatal: simulated failure: no such member' >&2\nexit 3",
    );
    let tools = Tools { etcd: fake, ..real };

    let start = Instant::now();
    let err = ControlPlane::start_with_options(tools, StartOptions::default())
        .await
        .expect_err("a control plane without etcd cannot start");
    let took = start.elapsed();
    let text = err.to_string();
    eprintln!("reported after {took:?}: {text}");
    assert!(
        matches!(err, Error::ServerExited { server: "etcd", attempt: 1, .. }),
        "not retried (no port involved), names etcd: {err:?}"
    );
    assert!(text.contains("simulated failure: no such member"), "the log tail: {text}");
    // The readiness timeout is 120 s; an exit must not wait for it. (A generous bound: this
    // asserts "did not wait for the timeout", not a start-up speed.)
    assert!(took < Duration::from_secs(60), "reported only after {took:?}");
}

/// CI once saw kube-apiserver end during start-up with an empty log: something outside it
/// ended it. A server killed by a signal is retried (with that attempt's logs kept and the
/// signal named); the control plane then serves.
#[tokio::test]
async fn a_server_killed_by_a_signal_during_start_up_is_retried_and_the_control_plane_serves() {
    let real = Tools::locate().unwrap();
    let marker = std::env::temp_dir().join(unique_name("ccm-testbed-killed-once"));
    let fake = script(
        "kube-apiserver",
        &format!(
            "if [ ! -e '{m}' ]; then : >'{m}'; kill -KILL $$; fi\nexec '{real}' \"$@\"",
            m = marker.display(),
            real = real.kube_apiserver.display()
        ),
    );
    let tools = Tools { kube_apiserver: fake, ..real };
    let cp = ControlPlane::start_with_options(tools, StartOptions::default())
        .await
        .expect("a start whose apiserver was killed is retried");
    assert!(marker.exists(), "the first attempt ran the killing script");
    assert_eq!(cp.start_attempts(), 2, "killed once, then started");
    assert_serves(&cp).await;
    let _ = std::fs::remove_file(&marker);
}

#[tokio::test]
async fn a_server_that_exits_at_once_reports_its_exit_status() {
    let real = Tools::locate().unwrap();
    let fake = script("kube-apiserver", "echo 'Error: unknown flag: --simulated' >&2\nexit 1");
    let tools = Tools { kube_apiserver: fake, ..real };
    let err = ControlPlane::start_with_options(tools, StartOptions::default())
        .await
        .expect_err("an apiserver that refuses its flags cannot start");
    let text = err.to_string();
    assert!(
        matches!(
            err,
            Error::ServerExited { server: "kube-apiserver", attempt: 1, signalled: false, .. }
        ),
        "an exit of its own is not retried: {err:?}"
    );
    assert!(text.contains("exit status 1") && text.contains("unknown flag"), "{text}");
}

#[tokio::test]
async fn a_taken_moto_port_is_retried_on_a_fresh_port() {
    let (_held, port) = hold_a_port();
    let moto = Moto::start_with_port(Some(port)).await.expect("moto starts on a fresh port");
    assert_ne!(moto.port, port);
    moto.reset().await.expect("moto answers");
}

#[tokio::test]
async fn moto_exiting_at_once_is_reported_with_the_end_of_its_log() {
    let fake = script("moto_server", "echo 'ImportError: simulated broken moto' >&2\nexit 1");
    let start = Instant::now();
    let err = Moto::start_with_server(&fake, None).await.expect_err("a broken moto");
    let took = start.elapsed();
    assert!(matches!(err, MotoError::Exited { attempt: 1, .. }), "{err:?}");
    assert!(err.to_string().contains("simulated broken moto"), "{err}");
    assert!(took < Duration::from_secs(60), "reported only after {took:?}");
}
