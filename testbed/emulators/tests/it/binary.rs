//! The standalone `ccm-emulator proxy` process, as `ci/demo` runs it: prints its URL, proxies,
//! answers the admin API, and exits when its stdin closes.

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::Duration;

use ccm_emulators::admin::Admin;
use ccm_emulators::faults::{Fault, FaultRule};

use crate::example::Example;

#[tokio::test]
async fn the_proxy_binary_prints_its_url_and_proxies() {
    let (upstream, _) = Example::start(ccm_emulators::World::synthetic(3, &["a", "b"])).await;
    let mut child = Command::new(env!("CARGO_BIN_EXE_ccm-emulator"))
        .args(["proxy", "--upstream", &upstream.url(), "--protocol", "aws-query"])
        .args(["--listen", "127.0.0.1:0", "--exit-on-stdin-close"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let url = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line.trim().to_string()
    })
    .await
    .unwrap();
    assert!(url.starts_with("http://127.0.0.1:"), "{url:?}");

    let admin = Admin::new(&url).unwrap();
    admin
        .inject(FaultRule::new("*", Fault::Status { status: 503, body: None }).times(1))
        .await
        .unwrap();
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let get = || http.get(format!("{url}/v1/instances")).send();
    let r = get().await.unwrap();
    assert_eq!(r.status(), 503);
    assert!(r.text().await.unwrap().contains("<Code>ServiceUnavailable</Code>"));
    let v: serde_json::Value = get().await.unwrap().json().await.unwrap();
    assert_eq!(v["instances"].as_array().unwrap().len(), 3);
    let c = admin.counters().await.unwrap();
    assert_eq!(c.get("aws:GET /v1/instances"), 2, "{c:?}");
    assert_eq!(upstream.counters().get("example.instances.list"), 1, "one call reached upstream");

    drop(child.stdin.take());
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    assert!(status.success(), "{status}");
}

/// Starts `ccm-emulator <args>` and returns it with the URL it prints first.
async fn start_emulator(args: &[&str]) -> (std::process::Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ccm-emulator"))
        .args(args)
        .arg("--exit-on-stdin-close")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let stdout = child.stdout.take().unwrap();
    let url = tokio::task::spawn_blocking(move || {
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        line.trim().to_string()
    })
    .await
    .unwrap();
    assert!(url.starts_with("http"), "{args:?}: {url:?}");
    (child, url)
}

#[tokio::test]
async fn the_emulator_binary_takes_its_timing_from_the_flags_over_the_world_file() {
    use ccm_emulators::{TimingProfile, TimingSelection};
    let dir = tempfile::tempdir().unwrap();
    let world = dir.path().join("world.yaml");
    std::fs::write(
        &world,
        "instances:\n  - { name: node-1, zone: us-central1-a }\ntiming: { profile: realistic, scale: 0.1 }\n",
    )
    .unwrap();
    let world = world.to_str().unwrap();

    let (mut a, url) = start_emulator(&["gcp", "--world", world]).await;
    let t = Admin::new(&url).unwrap().timing().await.unwrap();
    assert_eq!(t, TimingSelection::new(TimingProfile::Realistic, 0.1), "the world file's");
    let (mut b, url) =
        start_emulator(&["openstack", "--world", world, "--timing", "fast", "--time-scale", "3"])
            .await;
    let t = Admin::new(&url).unwrap().timing().await.unwrap();
    assert_eq!(t, TimingSelection::new(TimingProfile::Fast, 3.0), "the flags win");
    let (mut c, url) = start_emulator(&["ibm", "--timing", "realistic"]).await;
    let t = Admin::new(&url).unwrap().timing().await.unwrap();
    assert_eq!(t, TimingSelection::new(TimingProfile::Realistic, 1.0));
    for child in [&mut a, &mut b, &mut c] {
        drop(child.stdin.take());
        child.wait().unwrap();
    }

    // A bad scale or profile stops the binary with a message naming it.
    for (args, word) in [
        (&["azure", "--time-scale=-1"][..], "scale"),
        (&["gcp", "--timing", "glacial"][..], "glacial"),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_ccm-emulator")).args(args).output().unwrap();
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(word), "{args:?}: {err}");
    }
}

/// The binary reads the OpenStack-only settings of a world file (`openstack:`), as the
/// library's `openstack::load_world` does: before, it loaded the kit's world only and refused
/// the section.
#[tokio::test]
async fn the_openstack_binary_reads_the_world_files_openstack_section() {
    let dir = tempfile::tempdir().unwrap();
    let world = dir.path().join("world.yaml");
    std::fs::write(
        &world,
        "instances:\n  - { name: node-1, zone: nova }\nopenstack:\n  octavia_max_version: \"2.4\"\n",
    )
    .unwrap();
    let (mut child, url) = start_emulator(&["openstack", "--world", world.to_str().unwrap()]).await;
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let v: serde_json::Value =
        http.get(format!("{url}/load-balancer/")).send().await.unwrap().json().await.unwrap();
    let ids: Vec<&str> =
        v["versions"].as_array().unwrap().iter().filter_map(|v| v["id"].as_str()).collect();
    assert_eq!(ids.last(), Some(&"v2.4"), "{v}");
    drop(child.stdin.take());
    child.wait().unwrap();

    // A bad value stops the binary naming the key.
    std::fs::write(&world, "openstack:\n  octavia_max_version: \"3.1\"\n").unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_ccm-emulator"))
        .args(["openstack", "--world", world.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("octavia_max_version"), "{err}");
}
