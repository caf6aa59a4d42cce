//! The kit against the example cloud: every fault kind, times/probability, counters, the
//! request log, pause/resume, reset, a world file, and an async operation.

use std::time::{Duration, Instant};

use ccm_emulators::admin::{Admin, PauseMode};
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::world::World;
use serde_json::Value;

use crate::example::Example;

const WORLD: &str = "\
zones: [zone-a, zone-b]
networks:
  - { name: net-1, cidr: 10.0.0.0/16 }
subnets:
  - { name: subnet-a, network: net-1, zone: zone-a, cidr: 10.0.0.0/24 }
  - { name: subnet-b, network: net-1, zone: zone-b, cidr: 10.0.1.0/24 }
instances:
  - { name: node-1, zone: zone-a, type: m5.large, subnet: subnet-a, private_ips: [10.0.0.4], tags: { role: worker } }
  - { name: node-2, zone: zone-a, subnet: subnet-a, private_ips: [10.0.0.5], power: stopped }
  - { name: node-3, zone: zone-b, subnet: subnet-b, private_ips: [10.0.1.4], public_ips: [203.0.113.7] }
";

fn world() -> World {
    World::parse(WORLD).unwrap()
}

fn http() -> reqwest::Client {
    reqwest::Client::builder().timeout(Duration::from_secs(60)).no_proxy().build().unwrap()
}

async fn list(base: &str) -> reqwest::Response {
    http().get(format!("{base}/v1/instances")).send().await.unwrap()
}

async fn list_names(base: &str) -> Vec<(String, String, String)> {
    let v: Value = list(base).await.json().await.unwrap();
    v["instances"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| {
            let s = |k: &str| i[k].as_str().unwrap().to_string();
            (s("name"), s("zone"), s("power"))
        })
        .collect()
}

#[tokio::test]
async fn status_fault_answers_the_clouds_error_body_then_stops_after_times() {
    let (server, _) = Example::start(world()).await;
    let admin = server.admin();
    let id = admin
        .inject(
            FaultRule::new("example.instances.list", Fault::Status { status: 503, body: None })
                .times(1),
        )
        .await
        .unwrap();
    assert!(id > 0);

    let r = list(&server.url()).await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "InjectedFault", "{body}");
    assert_eq!(list(&server.url()).await.status(), 200, "times(1) fires once");

    // A body override is sent verbatim.
    admin
        .inject(
            FaultRule::new("example.*", Fault::Status { status: 500, body: Some("boom".into()) })
                .times(1),
        )
        .await
        .unwrap();
    let r = list(&server.url()).await;
    assert_eq!(r.status(), 500);
    assert_eq!(r.text().await.unwrap(), "boom");

    let c = admin.counters().await.unwrap();
    assert_eq!(c.get("example.instances.list"), 3);
    assert_eq!((c.total, c.faulted), (3, 2));

    let log = admin.requests().await.unwrap();
    let statuses: Vec<u16> = log.iter().map(|r| r.status).collect();
    assert_eq!(statuses, vec![503, 200, 500]);
    assert!(log.iter().all(|r| r.operation == "example.instances.list" && r.method == "GET"));
    assert_eq!(log[0].path, "/v1/instances");
}

#[tokio::test]
async fn throttle_answers_retry_after() {
    let (server, _) = Example::start(world()).await;
    server
        .admin()
        .inject(FaultRule::new("*", Fault::Throttle { retry_after_secs: 7 }).times(2))
        .await
        .unwrap();
    for _ in 0..2 {
        let r = list(&server.url()).await;
        assert_eq!(r.status(), 429);
        assert_eq!(r.headers()["retry-after"], "7");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "TooManyRequests");
    }
    assert_eq!(list(&server.url()).await.status(), 200);
    let c = server.admin().counters().await.unwrap();
    assert_eq!((c.get("example.instances.list"), c.faulted), (3, 2), "{c:?}");
    assert_eq!(c.answered("example.instances.list"), 1, "faulted calls per operation: {c:?}");
}

#[tokio::test]
async fn latency_delays_then_serves() {
    let (server, _) = Example::start(world()).await;
    server.admin().inject(FaultRule::new("*", Fault::Latency { ms: 400 })).await.unwrap();
    let t = Instant::now();
    let r = list(&server.url()).await;
    // A lower bound only: the call cannot be answered before the injected delay.
    assert!(t.elapsed() >= Duration::from_millis(400), "{:?}", t.elapsed());
    assert_eq!(r.status(), 200, "a latency fault still serves the call");
    assert_eq!(server.admin().counters().await.unwrap().faulted, 1);
}

#[tokio::test]
async fn hang_makes_the_client_time_out_until_faults_are_cleared() {
    let (server, _) = Example::start(world()).await;
    let admin = server.admin();
    admin.inject(FaultRule::new("example.instances.list", Fault::Hang)).await.unwrap();
    let client =
        reqwest::Client::builder().timeout(Duration::from_secs(1)).no_proxy().build().unwrap();
    let e = client.get(format!("{}/v1/instances", server.url())).send().await.unwrap_err();
    assert!(e.is_timeout(), "the client's deadline ends a hung call: {e}");

    // Clearing the faults releases a call still hanging: its connection is closed.
    let url = server.url();
    let hung = tokio::spawn(async move { http().get(format!("{url}/v1/instances")).send().await });
    let deadline = Instant::now() + Duration::from_secs(60);
    while admin.counters().await.unwrap().total < 2 {
        assert!(Instant::now() < deadline, "the call never reached the emulator");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    admin.clear_faults().await.unwrap();
    let e = hung.await.unwrap().unwrap_err();
    assert!(!e.is_timeout() && e.status().is_none(), "released by closing: {e:?}");
    assert_eq!(list(&server.url()).await.status(), 200);
}

#[tokio::test]
async fn drop_closes_the_connection_without_an_answer() {
    let (server, _) = Example::start(world()).await;
    server.admin().inject(FaultRule::new("*", Fault::Drop).times(1)).await.unwrap();
    let e = http().get(format!("{}/v1/instances", server.url())).send().await.unwrap_err();
    assert!(!e.is_timeout() && e.status().is_none(), "connection closed: {e:?}");
    assert_eq!(list(&server.url()).await.status(), 200);
    let log = server.admin().requests().await.unwrap();
    assert_eq!(log.iter().map(|r| r.status).collect::<Vec<_>>(), vec![0, 200]);
}

async fn fault_pattern(admin: &Admin, base: &str) -> Vec<bool> {
    admin
        .inject(
            FaultRule::new("*", Fault::Status { status: 500, body: None })
                .probability(0.5)
                .seed(42),
        )
        .await
        .unwrap();
    let mut out = Vec::new();
    for _ in 0..100 {
        out.push(list(base).await.status() == 500);
    }
    out
}

#[tokio::test]
async fn seeded_probability_repeats_exactly() {
    let (server, _) = Example::start(world()).await;
    let admin = server.admin();
    let first = fault_pattern(&admin, &server.url()).await;
    let faulted = first.iter().filter(|f| **f).count() as u64;
    assert!((25..=75).contains(&faulted), "{faulted} of 100 at p=0.5");
    let c = admin.counters().await.unwrap();
    assert_eq!((c.total, c.faulted), (100, faulted));

    admin.reset().await.unwrap();
    let second = fault_pattern(&admin, &server.url()).await;
    assert_eq!(first, second, "the same seed fires on the same calls");
}

#[tokio::test]
async fn pause_fail_and_pause_hang_then_resume() {
    let (server, _) = Example::start(world()).await;
    let admin = server.admin();

    admin.pause(PauseMode::Fail).await.unwrap();
    let r = list(&server.url()).await;
    assert_eq!(r.status(), 503);
    let body: Value = r.json().await.unwrap();
    assert_eq!(body["error"]["code"], "ServiceUnavailable");
    admin.resume().await.unwrap();
    assert_eq!(list(&server.url()).await.status(), 200);

    admin.pause(PauseMode::Hang).await.unwrap();
    let url = server.url();
    let call = tokio::spawn(async move { list(&url).await.status() });
    // Wait until the paused call has arrived (counted), then check it is still waiting.
    let deadline = Instant::now() + Duration::from_secs(60);
    while admin.counters().await.unwrap().total < 3 {
        assert!(Instant::now() < deadline, "the call never reached the emulator");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!call.is_finished(), "a call hangs while paused");
    assert_eq!(admin.state().await.unwrap()["paused"], "hang");
    admin.resume().await.unwrap();
    assert_eq!(call.await.unwrap(), 200, "a hung call is served after resume");
    let c = admin.counters().await.unwrap();
    assert_eq!((c.total, c.faulted), (3, 1));
}

#[tokio::test]
async fn reset_clears_faults_counters_log_and_reloads_the_world() {
    let (server, cloud) = Example::start(world()).await;
    let admin = server.admin();
    cloud.ops.set_pending_for(Duration::ZERO);
    let r = http().post(format!("{}/v1/instances/node-1/stop", server.url())).send().await.unwrap();
    assert_eq!(r.status(), 202);
    assert!(list_names(&server.url()).await.contains(&(
        "node-1".into(),
        "zone-a".into(),
        "stopped".into()
    )));
    admin.inject(FaultRule::new("*", Fault::Drop)).await.unwrap();
    admin.pause(PauseMode::Fail).await.unwrap();

    admin.reset().await.unwrap();
    let state = admin.state().await.unwrap();
    assert_eq!(state["faults"], serde_json::json!([]));
    assert_eq!(state["paused"], Value::Null);
    assert_eq!(admin.counters().await.unwrap(), Default::default());
    assert!(admin.requests().await.unwrap().is_empty());
    assert!(
        list_names(&server.url()).await.contains(&(
            "node-1".into(),
            "zone-a".into(),
            "running".into()
        )),
        "the world is reloaded"
    );
}

#[tokio::test]
async fn a_world_file_with_three_instances_in_two_zones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("world.yaml");
    std::fs::write(&path, WORLD).unwrap();
    let w = World::load(&path).unwrap();
    assert_eq!(w.instances.len(), 3);
    assert_eq!(w.zones().into_iter().collect::<Vec<_>>(), vec!["zone-a", "zone-b"]);
    let n1 = w.instance("node-1").unwrap();
    assert_eq!(n1.instance_type.as_deref(), Some("m5.large"));
    assert_eq!(n1.tags["role"], "worker");
    assert_eq!(w.instance("node-3").unwrap().public_ips[0].to_string(), "203.0.113.7");

    // The same world as JSON.
    let json = serde_json::to_string(&w).unwrap();
    assert_eq!(World::parse(&json).unwrap(), w);

    // What the emulator serves from it.
    let (server, _) = Example::start(w).await;
    let names = list_names(&server.url()).await;
    assert_eq!(
        names,
        vec![
            ("node-1".into(), "zone-a".into(), "running".into()),
            ("node-2".into(), "zone-a".into(), "stopped".into()),
            ("node-3".into(), "zone-b".into(), "running".into()),
        ]
    );

    // The standalone binary reads the same file.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_ccm-emulator"))
        .arg("world")
        .arg(&path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.starts_with("3 instances in 2 zones (zone-a, zone-b)"), "{text}");
}

#[tokio::test]
async fn an_async_operation_is_pending_then_done_after_the_configured_time() {
    let (server, cloud) = Example::start(world()).await;
    let base = server.url();
    let stop = |name: &'static str| {
        let base = base.clone();
        async move {
            let r = http().post(format!("{base}/v1/instances/{name}/stop")).send().await.unwrap();
            assert_eq!(r.status(), 202);
            r.headers()["azure-asyncoperation"].to_str().unwrap().to_string()
        }
    };
    let poll = |op: String| {
        let base = base.clone();
        async move {
            let v: Value =
                http().get(format!("{base}{op}")).send().await.unwrap().json().await.unwrap();
            v["status"].as_str().unwrap().to_string()
        }
    };

    // Long enough that no stall of the test can see it finish.
    cloud.ops.set_pending_for(Duration::from_secs(600));
    let slow = stop("node-1").await;
    assert_eq!(poll(slow.clone()).await, "InProgress");

    cloud.ops.set_pending_for(Duration::from_millis(500));
    let started = Instant::now();
    let fast = stop("node-3").await;
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = poll(fast.clone()).await;
        if s == "Succeeded" {
            break;
        }
        assert_eq!(s, "InProgress");
        assert!(Instant::now() < deadline, "the operation never finished");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started.elapsed() >= Duration::from_millis(500), "not done before its time");
    assert_eq!(poll(slow).await, "InProgress");
    let names = list_names(&server.url()).await;
    assert!(names.contains(&("node-3".into(), "zone-b".into(), "stopped".into())), "{names:?}");
    assert!(names.contains(&("node-1".into(), "zone-a".into(), "running".into())), "{names:?}");
    let c = server.admin().counters().await.unwrap();
    assert_eq!(c.get("example.instances.stop"), 2);
    assert!(c.get("example.operations.get") >= 3);
}

#[tokio::test]
async fn the_admin_api_refuses_bad_rules_and_unknown_paths() {
    let (server, _) = Example::start(world()).await;
    let c = http();
    let r = c
        .post(format!("{}/__emulator/faults", server.url()))
        .json(&serde_json::json!({"match": "*", "fault": {"kind": "status", "status": 503}, "probability": 2}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    assert!(r.text().await.unwrap().contains("probability"));
    let r = c
        .post(format!("{}/__emulator/faults", server.url()))
        .json(&serde_json::json!({"match": "*", "fault": {"kind": "explode"}}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = c.get(format!("{}/__emulator/nope", server.url())).send().await.unwrap();
    assert_eq!(r.status(), 404);
    // Raw HTTP as the contract says: {"id": n}, and counters exclude admin calls.
    let r: Value = c
        .post(format!("{}/__emulator/faults", server.url()))
        .json(&serde_json::json!({"match": "ec2:*", "fault": {"kind": "throttle", "retry_after_secs": 1}, "times": 3}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(r["id"].as_u64().is_some(), "{r}");
    let counters: Value = c
        .get(format!("{}/__emulator/counters", server.url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(counters, serde_json::json!({"operations": {}, "total": 0, "faulted": 0}));
}

/// Stops `name` on the example cloud; returns the operation's id.
async fn stop_op(base: &str, name: &str) -> String {
    let r = http().post(format!("{base}/v1/instances/{name}/stop")).send().await.unwrap();
    assert_eq!(r.status(), 202);
    let url = r.headers()["azure-asyncoperation"].to_str().unwrap().to_string();
    url.rsplit('/').next().unwrap().to_string()
}

async fn op_status(base: &str, id: &str) -> Value {
    http().get(format!("{base}/v1/operations/{id}")).send().await.unwrap().json().await.unwrap()
}

/// Polls the operation until it is no longer InProgress (bounded: 60 s).
async fn op_outcome(base: &str, id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let v = op_status(base, id).await;
        if v["status"] != "InProgress" {
            return v;
        }
        assert!(Instant::now() < deadline, "operation {id} never finished: {v}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

#[tokio::test]
async fn armed_operation_failures_fail_the_next_matching_operations_then_stop() {
    use ccm_emulators::asyncop::{Action, ActionMatch};
    let (server, cloud) = Example::start(world()).await;
    let base = server.url();
    let admin = server.admin();
    // A failing operation is pending like any other first: its failure shows at its end.
    cloud.ops.set_pending_for(Duration::from_secs(600));
    admin.fail_operations("node-2", ActionMatch::Any, 1, "later").await.unwrap();
    let op = stop_op(&base, "node-2").await;
    assert_eq!(op_status(&base, &op).await["status"], "InProgress");
    assert!(admin.operation_failures().await.unwrap().is_empty(), "the rule was used up");

    cloud.ops.set_pending_for(Duration::from_millis(100));
    // Two failures of updates on node-1; a create rule on every target never fires here.
    let id = admin.fail_operations("node-1", Action::Update, 2, "disk on fire").await.unwrap();
    admin.fail_operations("*", ActionMatch::Create, 1, "never").await.unwrap();
    assert!(id > 0);

    // Another target is not affected.
    let other = stop_op(&base, "node-3").await;
    assert_eq!(op_outcome(&base, &other).await["status"], "Succeeded");

    // The next two stops of node-1 fail with the armed message.
    for _ in 0..2 {
        let op = stop_op(&base, "node-1").await;
        let v = op_outcome(&base, &op).await;
        assert_eq!(v["status"], "Failed", "{v}");
        assert_eq!(v["error"]["message"], "disk on fire", "{v}");
    }
    // A failed operation leaves the resource as it was.
    let names = list_names(&base).await;
    assert!(names.contains(&("node-1".into(), "zone-a".into(), "running".into())), "{names:?}");

    // Used up: only the create rule is left, and the third stop succeeds.
    let left = admin.operation_failures().await.unwrap();
    assert_eq!(left.len(), 1, "{left:?}");
    assert_eq!(left[0].1.action, ActionMatch::Create);
    let op = stop_op(&base, "node-1").await;
    assert_eq!(op_outcome(&base, &op).await["status"], "Succeeded");

    // Clearing disarms; a glob arms every matching target; reset disarms too.
    admin.clear_operation_failures().await.unwrap();
    assert!(admin.operation_failures().await.unwrap().is_empty());
    admin.fail_operations("node-*", ActionMatch::Any, 5, "glob").await.unwrap();
    let op = stop_op(&base, "node-3").await;
    assert_eq!(op_outcome(&base, &op).await["error"]["message"], "glob");
    let state = admin.state().await.unwrap();
    assert_eq!(state["operation_failures"][0]["times"], 4, "{state}");
    admin.reset().await.unwrap();
    assert!(admin.operation_failures().await.unwrap().is_empty());
    let op = stop_op(&base, "node-3").await;
    assert_eq!(op_outcome(&base, &op).await["status"], "Succeeded");
}

#[tokio::test]
async fn operation_failure_rules_are_checked() {
    let (server, _) = Example::start(world()).await;
    let c = http();
    let post = |body: Value| {
        c.post(format!("{}/__emulator/operation-failures", server.url())).json(&body).send()
    };
    for (body, word) in [
        (serde_json::json!({"target": "", "action": "any", "times": 1, "message": "m"}), "target"),
        (serde_json::json!({"target": "*", "action": "any", "times": 0, "message": "m"}), "times"),
        (serde_json::json!({"target": "*", "action": "explode", "times": 1}), "explode"),
        (serde_json::json!({"target": "*", "colour": "red"}), "colour"),
    ] {
        let r = post(body.clone()).await.unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let text = r.text().await.unwrap();
        assert!(text.contains(word), "{body}: {text}");
    }
    // The wire format of the contract, defaults included.
    let r: Value = post(serde_json::json!({"target": "x"})).await.unwrap().json().await.unwrap();
    assert!(r["id"].as_u64().is_some(), "{r}");
    let rules = server.admin().operation_failures().await.unwrap();
    assert_eq!((rules[0].1.times, rules[0].1.action), (1, ccm_emulators::ActionMatch::Any));
    assert_eq!(rules[0].0, r["id"].as_u64().unwrap());
}

#[tokio::test]
async fn timing_profiles_select_per_action_times_scaled() {
    use ccm_emulators::asyncop::Timing;
    use ccm_emulators::{TimingProfile, TimingSelection};
    let cloud = Example::new(world());
    cloud.ops.set_pending_for(Duration::from_millis(200));
    cloud.ops.set_realistic(Timing {
        create: Duration::from_secs(30),
        update: Duration::from_secs(600),
        delete: Duration::from_secs(90),
    });
    let server = ccm_emulators::server::Server::start(
        cloud.clone(),
        ccm_emulators::server::ServerOptions::default(),
    )
    .await
    .unwrap();
    let base = server.url();
    let admin = server.admin();
    let pending = |id: &str| cloud.ops.get(id).unwrap().pending_for();

    assert_eq!(admin.timing().await.unwrap(), TimingSelection::default(), "fast by default");
    // The cloud's tables, unscaled, as the admin API reports them.
    let report = admin.timing_report().await.unwrap();
    assert_eq!(report.fast.map(Timing::from), Some(Timing::uniform(Duration::from_millis(200))));
    assert_eq!(report.realistic.map(|t| t.update_ms), Some(600_000), "{report:?}");
    let op = stop_op(&base, "node-1").await;
    assert_eq!(pending(&op), Duration::from_millis(200), "fast: the cloud's test value");

    admin.set_timing(TimingProfile::Realistic, 1.0).await.unwrap();
    let op = stop_op(&base, "node-1").await;
    assert_eq!(pending(&op), Duration::from_secs(600), "realistic update");
    assert_eq!(op_status(&base, &op).await["status"], "InProgress");

    // Scaled: 600 s × 0.001 = 600 ms, and it does finish.
    admin.set_timing(TimingProfile::Realistic, 0.001).await.unwrap();
    assert_eq!(
        admin.timing().await.unwrap(),
        TimingSelection::new(TimingProfile::Realistic, 0.001)
    );
    let op = stop_op(&base, "node-3").await;
    assert_eq!(pending(&op), Duration::from_millis(600));
    assert_eq!(op_outcome(&base, &op).await["status"], "Succeeded");
    // The per-action table as the cloud registered it, scaled.
    let t = cloud.ops.timing(TimingSelection::new(TimingProfile::Realistic, 0.5));
    assert_eq!((t.create, t.delete), (Duration::from_secs(15), Duration::from_secs(45)));

    // Fast, scaled.
    admin.set_timing(TimingProfile::Fast, 2.0).await.unwrap();
    let op = stop_op(&base, "node-3").await;
    assert_eq!(pending(&op), Duration::from_millis(400));

    // Bad selections say what is wrong; reset restores the initial profile.
    let c = http();
    for (body, word) in [
        (serde_json::json!({"profile": "glacial"}), "glacial"),
        (serde_json::json!({"profile": "fast", "scale": -1.0}), "scale"),
        (serde_json::json!({"profile": "fast", "scale": 1e9}), "scale"),
    ] {
        let r = c.post(format!("{base}/__emulator/timing")).json(&body).send().await.unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let text = r.text().await.unwrap();
        assert!(text.contains(word), "{body}: {text}");
    }
    admin.reset().await.unwrap();
    assert_eq!(admin.timing().await.unwrap(), TimingSelection::default());
}

#[tokio::test]
async fn a_realistic_selection_without_a_realistic_table_uses_the_fast_times() {
    use ccm_emulators::TimingProfile;
    let (server, cloud) = Example::start(world()).await;
    cloud.ops.set_pending_for(Duration::from_millis(300));
    server.admin().set_timing(TimingProfile::Realistic, 0.5).await.unwrap();
    let op = stop_op(&server.url(), "node-1").await;
    assert_eq!(cloud.ops.get(&op).unwrap().pending_for(), Duration::from_millis(150));
}

#[tokio::test]
async fn the_world_files_timing_key_is_the_servers_initial_and_reset_timing() {
    use ccm_emulators::asyncop::Timing;
    use ccm_emulators::{TimingProfile, TimingSelection};
    let w =
        World::parse(&format!("{WORLD}timing: {{ profile: realistic, scale: 0.01 }}\n")).unwrap();
    assert_eq!(w.timing, Some(TimingSelection::new(TimingProfile::Realistic, 0.01)));
    let d = World::parse("timing: { profile: realistic }\n").unwrap();
    assert_eq!(d.timing.unwrap().scale, 1.0, "scale defaults to 1");
    for (text, word) in [
        ("timing: { profile: realistic, scale: -2 }\n", "scale"),
        ("timing: { profile: slow }\n", "slow"),
        ("timing: { profile: fast, jitter: 1 }\n", "jitter"),
    ] {
        let e = World::parse(text).unwrap_err().to_string();
        assert!(e.contains(word), "{text}: {e}");
    }

    let cloud = Example::new(w.clone());
    cloud.ops.set_realistic(Timing::uniform(Duration::from_secs(60)));
    let opts = ccm_emulators::server::ServerOptions {
        timing: w.timing.unwrap_or_default(),
        ..Default::default()
    };
    let server = ccm_emulators::server::Server::start(cloud.clone(), opts).await.unwrap();
    let admin = server.admin();
    let op = stop_op(&server.url(), "node-1").await;
    assert_eq!(cloud.ops.get(&op).unwrap().pending_for(), Duration::from_millis(600));
    admin.set_timing(TimingProfile::Fast, 1.0).await.unwrap();
    admin.reset().await.unwrap();
    assert_eq!(admin.timing().await.unwrap(), w.timing.unwrap(), "reset restores the world's");
}
