//! The GCP emulator (`ccm_emulators::gcp`) over HTTP as a provider sees it: bearer tokens from
//! the metadata server, `Metadata-Flavor` required, zones/regions, instance lists with filters,
//! `maxResults`/`pageToken` paging and aggregated lists (one list call per page, counted),
//! operations PENDING/RUNNING then DONE, 409/404/412/400 Google error bodies, throttling in
//! Google's shape and the state dump. The Go clients' view is `ci/fidelity/run gcp`.

use std::sync::Arc;
use std::time::Duration;

use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::gcp::{GcpCloud, GcpOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::World;
use serde_json::{Value, json};

struct Gcp {
    server: Server,
    cloud: Arc<GcpCloud>,
    http: reqwest::Client,
    token: String,
}

impl Gcp {
    async fn start(world: World, opts: GcpOptions) -> Gcp {
        let cloud = GcpCloud::new(world, opts);
        let server = Server::start(cloud.clone(), ServerOptions::default()).await.unwrap();
        let http = reqwest::Client::new();
        let r = http
            .get(format!(
                "{}/computeMetadata/v1/instance/service-accounts/default/token",
                server.url()
            ))
            .header("Metadata-Flavor", "Google")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let v: Value = r.json().await.unwrap();
        let token = v["access_token"].as_str().unwrap().to_string();
        Gcp { server, cloud, http, token }
    }

    fn url(&self, path: &str) -> String {
        format!("{}/compute/v1/projects/emulated-project/{path}", self.server.url())
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let mut r = self.http.request(method, self.url(path)).bearer_auth(&self.token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let r = r.send().await.unwrap();
        let s = r.status().as_u16();
        (s, r.json().await.unwrap_or(Value::Null))
    }

    /// A mutation, then its operation waited for until `DONE` (Compute applies the change
    /// then); the operation (or the error) is returned.
    async fn done(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let (s, op) = self.call(method, path, body).await;
        if s != 200 || op["kind"] != "compute#operation" {
            return (s, op);
        }
        let link = op["selfLink"].as_str().unwrap();
        let rel = link.split_once("projects/emulated-project/").unwrap().1;
        let (s, v) = self.call(reqwest::Method::POST, &format!("{rel}/wait"), None).await;
        assert_eq!((s, v["status"].as_str()), (200, Some("DONE")), "{v}");
        (s, v)
    }

    async fn get(&self, path: &str) -> Value {
        let (s, v) = self.call(reqwest::Method::GET, path, None).await;
        assert_eq!(s, 200, "GET {path}: {v}");
        v
    }
}

fn world() -> World {
    World::parse(
        r#"
zones: [europe-west1-b, europe-west1-c]
instances:
  - { name: n-0, zone: europe-west1-b, private_ips: [10.0.0.2], public_ips: [34.0.0.2], type: n2-standard-2 }
  - { name: n-1, zone: europe-west1-b, private_ips: [10.0.0.3] }
  - { name: n-2, zone: europe-west1-c, private_ips: [10.0.0.4], power: stopped }
"#,
    )
    .unwrap()
}

#[tokio::test]
async fn metadata_server_requires_the_flavor_header_and_speaks_for_the_first_instance() {
    let g = Gcp::start(world(), GcpOptions::default()).await;
    let url = |p: &str| format!("{}/computeMetadata/v1/{p}", g.server.url());
    let r = g.http.get(url("instance/zone")).send().await.unwrap();
    assert_eq!(r.status(), 403);
    let get = |p: &'static str| {
        let req = g.http.get(url(p)).header("Metadata-Flavor", "Google");
        async move {
            let r = req.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(
        get("instance/zone").await,
        (200, "projects/123456789012/zones/europe-west1-b".into())
    );
    assert_eq!(get("instance/name").await.1, "n-0");
    assert_eq!(
        get("instance/network-interfaces/0/access-configs/0/external-ip").await.1,
        "34.0.0.2"
    );
    assert_eq!(get("instance/attributes/google-dockercfg").await.0, 404);
    g.cloud.set_attribute("google-dockercfg", Some("{}"));
    assert_eq!(get("instance/attributes/google-dockercfg").await, (200, "{}".into()));
}

#[tokio::test]
async fn compute_needs_an_issued_token_and_answers_google_errors() {
    let g = Gcp::start(world(), GcpOptions::default()).await;
    let r = g.http.get(g.url("zones")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["errors"][0]["reason"], "authError");
    let (s, v) = g.call(reqwest::Method::GET, "zones/europe-west1-b/instances/nope", None).await;
    assert_eq!(s, 404);
    assert_eq!(v["error"]["code"], 404);
    assert_eq!(v["error"]["errors"][0]["reason"], "notFound");
    let z = g.get("zones").await;
    assert_eq!(z["items"].as_array().unwrap().len(), 2);
    assert_eq!(g.get("regions/europe-west1").await["zones"].as_array().unwrap().len(), 2);
    let n2 = g.get("zones/europe-west1-c/instances/n-2").await;
    assert_eq!(n2["status"], "TERMINATED");
    // Throttling in Compute's shape: 403 with reason rateLimitExceeded (661c3e8).
    g.server
        .admin()
        .inject(
            FaultRule::new("compute.instances.list", Fault::Throttle { retry_after_secs: 1 })
                .times(1),
        )
        .await
        .unwrap();
    let (s, v) = g.call(reqwest::Method::GET, "zones/europe-west1-b/instances", None).await;
    assert_eq!(s, 403);
    assert_eq!(v["error"]["errors"][0]["reason"], "rateLimitExceeded");
}

#[tokio::test]
async fn lists_filter_and_page_and_one_call_serves_a_page() {
    let opts = GcpOptions { max_results: 100, ..Default::default() };
    let g = Gcp::start(World::synthetic(1000, &["us-east1-b", "us-east1-c"]), opts).await;
    let mut names = Vec::new();
    let mut token: Option<String> = None;
    loop {
        let mut path = "aggregated/instances?maxResults=500".to_string();
        if let Some(t) = &token {
            path.push_str(&format!("&pageToken={t}"));
        }
        let v = g.get(&path).await;
        for (_, scope) in v["items"].as_object().unwrap() {
            for i in scope["instances"].as_array().into_iter().flatten() {
                names.push(i["name"].as_str().unwrap().to_string());
            }
        }
        match v["nextPageToken"].as_str() {
            Some(t) => token = Some(t.to_string()),
            None => break,
        }
    }
    assert_eq!(names.len(), 1000);
    // maxResults above the cap is capped: 1000 / 100 pages.
    assert_eq!(g.server.counters().get("compute.instances.aggregatedList"), 10);
    let v = g.get("zones/us-east1-b/instances?filter=name%20eq%20%22node-(0%7C2%7C3)%22").await;
    let got: Vec<&str> =
        v["items"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap()).collect();
    assert_eq!(got, vec!["node-0", "node-2"], "node-3 is in the other zone");
    let (s, _) =
        g.call(reqwest::Method::GET, "zones/us-east1-b/instances?filter=name%20OR", None).await;
    assert_eq!(s, 400);
}

#[tokio::test]
async fn mutations_are_operations_and_references_are_checked() {
    let opts = GcpOptions { pending: Duration::from_millis(400), ..Default::default() };
    let g = Gcp::start(world(), opts).await;
    let r = "regions/europe-west1";
    let (s, op) = g
        .call(reqwest::Method::POST, &format!("{r}/addresses"), Some(json!({"name": "lb-1"})))
        .await;
    assert_eq!(s, 200, "{op}");
    assert!(["PENDING", "RUNNING"].contains(&op["status"].as_str().unwrap()), "{op}");
    let name = op["name"].as_str().unwrap().to_string();
    // wait answers once DONE.
    let (s, done) =
        g.call(reqwest::Method::POST, &format!("{r}/operations/{name}/wait"), None).await;
    assert_eq!((s, done["status"].as_str()), (200, Some("DONE")), "{done}");
    let (s, v) = g
        .done(reqwest::Method::POST, &format!("{r}/addresses"), Some(json!({"name": "lb-1"})))
        .await;
    assert_eq!((s, v["error"]["errors"][0]["reason"].as_str()), (409, Some("alreadyExists")));
    let (s, _) = g
        .done(
            reqwest::Method::POST,
            &format!("{r}/targetPools"),
            Some(json!({"name": "tp", "instances": ["zones/europe-west1-b/instances/ghost"]})),
        )
        .await;
    assert_eq!(s, 404, "a target pool naming a missing instance");
    let (s, _) = g
        .done(
            reqwest::Method::POST,
            &format!("{r}/targetPools"),
            Some(json!({"name": "tp", "instances": ["zones/europe-west1-b/instances/n-0"]})),
        )
        .await;
    assert_eq!(s, 200);
    let addr = g.get(&format!("{r}/addresses/lb-1")).await["address"].as_str().unwrap().to_string();
    let fr = json!({"name": "fr", "IPAddress": addr, "target": format!("{r}/targetPools/tp"), "portRange": "80-80"});
    assert_eq!(
        g.done(reqwest::Method::POST, &format!("{r}/forwardingRules"), Some(fr)).await.0,
        200
    );
    assert_eq!(g.get(&format!("{r}/addresses/lb-1")).await["status"], "IN_USE");
    let (s, v) = g.call(reqwest::Method::DELETE, &format!("{r}/targetPools/tp"), None).await;
    assert_eq!(
        (s, v["error"]["errors"][0]["reason"].as_str()),
        (400, Some("resourceInUseByAnotherResource"))
    );
    // Fingerprints.
    let (s, _) = g
        .done(
            reqwest::Method::POST,
            "global/firewalls",
            Some(json!({"name": "fw", "allowed": [{"IPProtocol": "tcp"}]})),
        )
        .await;
    assert_eq!(s, 200);
    let (s, _) = g
        .done(reqwest::Method::POST, &format!("{r}/backendServices"), Some(json!({"name": "bs"})))
        .await;
    assert_eq!(s, 200);
    let bs = g.get(&format!("{r}/backendServices/bs")).await;
    let fp = bs["fingerprint"].clone();
    let (s, _) = g
        .done(
            reqwest::Method::PATCH,
            &format!("{r}/backendServices/bs"),
            Some(json!({"description": "x", "fingerprint": fp})),
        )
        .await;
    assert_eq!(s, 200);
    let (s, v) = g
        .done(
            reqwest::Method::PATCH,
            &format!("{r}/backendServices/bs"),
            Some(json!({"description": "y", "fingerprint": fp})),
        )
        .await;
    assert_eq!((s, v["error"]["errors"][0]["reason"].as_str()), (412, Some("conditionNotMet")));
    let state = g.server.admin().state().await.unwrap();
    assert_eq!(state["cloud"]["resources"]["forwardingRules"][0]["name"], "fr", "{state}");
}

/// Compute's refusals of an IP another resource holds or a subnetwork does not contain: the
/// `tenant_isolation` attacks (a second forwarding rule on another cluster's IP and port, an
/// internal load balancer on someone's external IP) fail here as they fail in Compute.
#[tokio::test]
async fn ips_in_use_or_outside_the_subnetwork_are_refused() {
    let world = World::parse(
        r#"
zones: [europe-west1-b]
networks:
  - { name: net, cidr: 10.0.0.0/8 }
subnets:
  - { name: sub, network: net, zone: europe-west1-b, cidr: 10.1.0.0/16 }
instances:
  - { name: n-0, zone: europe-west1-b, subnet: sub, private_ips: [10.1.0.2] }
"#,
    )
    .unwrap();
    let g = Gcp::start(world, GcpOptions::default()).await;
    let r = "regions/europe-west1";
    let post = |coll: &str, body: Value| {
        let path = format!("{r}/{coll}");
        let g = &g;
        async move { g.done(reqwest::Method::POST, &path, Some(body)).await }
    };
    let reason = |v: &Value| v["error"]["errors"][0]["reason"].as_str().map(String::from);
    let message = |v: &Value| v["error"]["message"].as_str().unwrap_or_default().to_string();
    assert_eq!(post("addresses", json!({"name": "victim"})).await.0, 200);
    let ip = g.get(&format!("{r}/addresses/victim")).await["address"].as_str().unwrap().to_string();
    assert_eq!(
        post(
            "targetPools",
            json!({"name": "tp", "instances": ["zones/europe-west1-b/instances/n-0"]})
        )
        .await
        .0,
        200
    );
    let rule = |name: &str, ports: &str, proto: &str| {
        json!({"name": name, "IPAddress": ip, "IPProtocol": proto, "portRange": ports,
            "target": format!("{r}/targetPools/tp")})
    };
    assert_eq!(post("forwardingRules", rule("victim", "443-443", "TCP")).await.0, 200);

    // A second rule on the same IP, protocol and port: 400 invalid, nothing created.
    let (s, v) = post("forwardingRules", rule("attacker", "443-443", "TCP")).await;
    assert_eq!((s, reason(&v).as_deref()), (400, Some("invalid")), "{v}");
    assert!(message(&v).contains("Specified IP address is in-use"), "{v}");
    let (s, v) = post("forwardingRules", rule("attacker", "400-500", "TCP")).await;
    assert_eq!(s, 400, "an overlapping port range: {v}");
    let (s, _) = g.call(reqwest::Method::GET, &format!("{r}/forwardingRules/attacker"), None).await;
    assert_eq!(s, 404, "the refused rule does not exist");
    // Another port or protocol on the same IP is allowed (as in Compute).
    assert_eq!(post("forwardingRules", rule("other-port", "80-80", "TCP")).await.0, 200);
    assert_eq!(post("forwardingRules", rule("other-proto", "443-443", "UDP")).await.0, 200);

    // Reserving an IP another address holds: 409 IP_IN_USE_BY_ANOTHER_RESOURCE.
    let (s, v) = post("addresses", json!({"name": "steal", "address": ip})).await;
    assert_eq!(s, 409, "{v}");
    assert!(message(&v).starts_with("IP_IN_USE_BY_ANOTHER_RESOURCE"), "{v}");
    let (s, _) = g.call(reqwest::Method::GET, &format!("{r}/addresses/steal"), None).await;
    assert_eq!(s, 404);

    // Internal addresses and rules: only IPs of their subnetwork.
    let sub = format!("{r}/subnetworks/sub");
    let (s, v) = post(
        "addresses",
        json!({"name": "ilb", "address": ip, "addressType": "INTERNAL", "subnetwork": sub}),
    )
    .await;
    assert_eq!((s, reason(&v).as_deref()), (400, Some("invalid")), "{v}");
    assert!(message(&v).contains("outside the subnetwork CIDR range"), "{v}");
    let (s, v) = post(
        "forwardingRules",
        json!({"name": "ilb", "IPAddress": ip, "loadBalancingScheme": "INTERNAL",
            "subnetwork": sub, "ports": ["8443"]}),
    )
    .await;
    assert_eq!((s, reason(&v).as_deref()), (400, Some("invalid")), "{v}");
    assert!(message(&v).contains("outside the subnetwork CIDR range"), "{v}");
    let (s, v) = post(
        "addresses",
        json!({"name": "ilb", "address": "10.1.200.7", "addressType": "INTERNAL", "subnetwork": sub}),
    )
    .await;
    assert_eq!(s, 200, "an IP of the subnetwork: {v}");
}

/// Compute applies a change when its operation is `DONE`: before, a GET shows the resource as
/// it was (an insert: 404, an address `RESERVING`), and a change to it or a reference to it is
/// a 400 `resourceNotReady`.
#[tokio::test]
async fn changes_apply_when_the_operation_is_done_and_busy_resources_are_not_ready() {
    let opts = GcpOptions { pending: Duration::from_millis(600), ..Default::default() };
    let g = Gcp::start(world(), opts).await;
    let r = "regions/europe-west1";
    let reason = |v: &Value| v["error"]["errors"][0]["reason"].as_str().map(String::from);
    let (s, _) = g
        .call(
            reqwest::Method::POST,
            &format!("{r}/targetPools"),
            Some(json!({"name": "tp", "instances": ["zones/europe-west1-b/instances/n-0"]})),
        )
        .await;
    assert_eq!(s, 200);
    let (s, _) = g.call(reqwest::Method::GET, &format!("{r}/targetPools/tp"), None).await;
    assert_eq!(s, 404, "not there before its insert is DONE");
    let (s, v) = g
        .call(
            reqwest::Method::POST,
            &format!("{r}/forwardingRules"),
            Some(json!({"name": "fr", "portRange": "80", "target": format!("{r}/targetPools/tp")})),
        )
        .await;
    assert_eq!((s, reason(&v).as_deref()), (400, Some("resourceNotReady")), "{v}");
    let (s, v) = g.call(reqwest::Method::DELETE, &format!("{r}/targetPools/tp"), None).await;
    assert_eq!((s, reason(&v).as_deref()), (400, Some("resourceNotReady")), "{v}");
    let (s, op) =
        g.call(reqwest::Method::POST, &format!("{r}/addresses"), Some(json!({"name": "a"}))).await;
    assert_eq!(s, 200);
    assert_eq!(g.get(&format!("{r}/addresses/a")).await["status"], "RESERVING");
    let (s, _) =
        g.call(reqwest::Method::POST, &format!("{r}/addresses"), Some(json!({"name": "a"}))).await;
    assert_eq!(s, 409, "a second insert of a name being inserted");
    let rel = op["selfLink"].as_str().unwrap().split_once("projects/emulated-project/").unwrap().1;
    g.call(reqwest::Method::POST, &format!("{rel}/wait"), None).await;
    assert_eq!(g.get(&format!("{r}/addresses/a")).await["status"], "RESERVED");
    assert_eq!(
        g.get(&format!("{r}/targetPools/tp")).await["instances"].as_array().unwrap().len(),
        1
    );

    // An action applies at DONE too; a second change meanwhile is not ready.
    let (s, _) = g
        .call(
            reqwest::Method::POST,
            &format!("{r}/targetPools/tp/removeInstance"),
            Some(json!({"instances": [{"instance": "zones/europe-west1-b/instances/n-0"}]})),
        )
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        g.get(&format!("{r}/targetPools/tp")).await["instances"].as_array().unwrap().len(),
        1
    );
    let (s, v) = g
        .call(
            reqwest::Method::POST,
            &format!("{r}/targetPools/tp/addInstance"),
            Some(json!({"instances": [{"instance": "zones/europe-west1-b/instances/n-1"}]})),
        )
        .await;
    assert_eq!((s, reason(&v).as_deref()), (400, Some("resourceNotReady")), "{v}");
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert!(
        g.get(&format!("{r}/targetPools/tp")).await["instances"].as_array().unwrap().is_empty()
    );

    // A delete: still there until DONE.
    let (s, _) = g.call(reqwest::Method::DELETE, &format!("{r}/addresses/a"), None).await;
    assert_eq!(s, 200);
    assert_eq!(g.get(&format!("{r}/addresses/a")).await["name"], "a");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let (s, _) = g.call(reqwest::Method::GET, &format!("{r}/addresses/a"), None).await;
    assert_eq!(s, 404);
}

/// Quotas: an insert past a metric's limit is a 403 `quotaExceeded` naming the metric; the
/// region's and the project's `quotas[]` report limit and usage.
#[tokio::test]
async fn inserts_past_a_quota_are_refused_naming_the_metric() {
    let g = Gcp::start(world(), GcpOptions::default()).await;
    g.cloud.set_quota("IN_USE_ADDRESSES", 2);
    g.cloud.set_quota("FIREWALLS", 1);
    let r = "regions/europe-west1";
    let (s, _) =
        g.done(reqwest::Method::POST, &format!("{r}/addresses"), Some(json!({"name": "a"}))).await;
    assert_eq!(s, 200);
    assert_eq!(
        g.done(reqwest::Method::POST, &format!("{r}/targetPools"), Some(json!({"name": "tp"})))
            .await
            .0,
        200
    );
    // An external rule on an ephemeral IP holds a second external IP.
    let rule = |name: &str| json!({"name": name, "portRange": "80", "target": format!("{r}/targetPools/tp")});
    assert_eq!(
        g.call(reqwest::Method::POST, &format!("{r}/forwardingRules"), Some(rule("e1"))).await.0,
        200
    );
    let (s, v) =
        g.call(reqwest::Method::POST, &format!("{r}/forwardingRules"), Some(rule("e2"))).await;
    assert_eq!(
        (s, v["error"]["errors"][0]["reason"].as_str()),
        (403, Some("quotaExceeded")),
        "{v}"
    );
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("'IN_USE_ADDRESSES'") && msg.contains("Limit: 2.0 in region europe-west1"),
        "{msg}"
    );
    let region = g.get(r).await;
    let q = region["quotas"].as_array().unwrap();
    let in_use = q.iter().find(|m| m["metric"] == "IN_USE_ADDRESSES").unwrap();
    assert_eq!((in_use["limit"].as_f64(), in_use["usage"].as_f64()), (Some(2.0), Some(2.0)));

    let fw = |name: &str| json!({"name": name, "allowed": [{"IPProtocol": "tcp"}]});
    assert_eq!(g.call(reqwest::Method::POST, "global/firewalls", Some(fw("f1"))).await.0, 200);
    let (s, v) = g.call(reqwest::Method::POST, "global/firewalls", Some(fw("f2"))).await;
    assert_eq!(s, 403, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("'FIREWALLS' exceeded.  Limit: 1.0 globally"),
        "{v}"
    );
    let project = g.get("").await;
    let fws =
        project["quotas"].as_array().unwrap().iter().find(|m| m["metric"] == "FIREWALLS").cloned();
    assert_eq!(fws.map(|m| m["usage"].clone()), Some(json!(1.0)));
}

/// The world file's `gcp:` section (#31 leftover): quota limits set there are enforced as
/// [`GcpCloud::set_quota`]'s, with Compute's `quotaExceeded` error naming the metric, and
/// reported by `regions.get`; a mistyped metric or an unknown auto-mode network is refused
/// naming it. An auto-mode network has a subnetwork named like it in every region (Google's
/// auto-mode range), listed by Compute's network filter.
#[tokio::test]
async fn the_world_file_sets_quotas_and_auto_mode_networks() {
    let text = r#"
region: us-central1
zones: [us-central1-a]
instances:
  - { name: n1, zone: us-central1-a }
gcp:
  quotas: { FORWARDING_RULES: 1 }
  auto_mode_networks: [default]
"#;
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("world.yaml");
    std::fs::write(&path, text).unwrap();
    let (world, gcp) = ccm_emulators::gcp::load_world(&path).unwrap();
    assert_eq!(gcp.quotas.get("FORWARDING_RULES"), Some(&1));
    let mut opts = GcpOptions::default();
    gcp.apply(&mut opts);
    let g = Gcp::start(world, opts).await;
    let r = "regions/us-central1";

    let (s, _) = g
        .done(reqwest::Method::POST, &format!("{r}/targetPools"), Some(json!({"name": "tp"})))
        .await;
    assert_eq!(s, 200);
    let rule = |name: &str| json!({"name": name, "portRange": "80", "target": format!("{r}/targetPools/tp")});
    assert_eq!(
        g.call(reqwest::Method::POST, &format!("{r}/forwardingRules"), Some(rule("f1"))).await.0,
        200
    );
    let (s, v) =
        g.call(reqwest::Method::POST, &format!("{r}/forwardingRules"), Some(rule("f2"))).await;
    assert_eq!(
        (s, v["error"]["errors"][0]["reason"].as_str()),
        (403, Some("quotaExceeded")),
        "{v}"
    );
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(
        msg.contains("Quota 'FORWARDING_RULES' exceeded.  Limit: 1.0 in region us-central1"),
        "{msg}"
    );
    let region = g.get(r).await;
    let fr = region["quotas"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["metric"] == "FORWARDING_RULES")
        .cloned()
        .unwrap();
    assert_eq!((fr["limit"].as_f64(), fr["usage"].as_f64()), (Some(1.0), Some(1.0)));

    // The auto-mode network and its subnetwork of the region.
    let net = g.get("global/networks/default").await;
    assert_eq!(net["autoCreateSubnetworks"], true);
    let (s, list) = g
        .call(
            reqwest::Method::GET,
            &format!("{r}/subnetworks?filter={}", "network%20eq%20.*%2Fdefault%24"),
            None,
        )
        .await;
    assert_eq!(s, 200, "{list}");
    let items = list["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{list}");
    assert_eq!(items[0]["ipCidrRange"], "10.128.0.0/20");
    assert_eq!(items[0]["name"], "default");

    // Mistakes are named.
    for (bad, named) in [
        ("gcp: { quotas: { FORWARDING_RULE: 1 } }", "FORWARDING_RULE"),
        ("gcp: { auto_mode_networks: [nope] }", "nope"),
        ("gcp: { quota: {} }", "quota"),
    ] {
        let e = ccm_emulators::gcp::parse_world(bad).unwrap_err().to_string();
        assert!(e.contains(named), "{bad}: {e}");
    }
}

/// Issue #32 GCP 8: a NIC's IPv6 as Compute shows it: internal (`ipv6Address`,
/// `ipv6AccessType: INTERNAL`, a /96) or external (a `DIRECT_IPV6` access config,
/// `ipv6AccessType: EXTERNAL`, no `ipv6Address`); the stack type follows (`IPV6_ONLY` without
/// IPv4).
#[tokio::test]
async fn ipv6_nics_are_internal_or_external_as_compute_shows_them() {
    let world = World::parse(
        r#"
zones: [europe-west1-b]
instances:
  - { name: v4, zone: europe-west1-b, private_ips: [10.0.0.2] }
  - { name: internal, zone: europe-west1-b, private_ips: [10.0.0.3, "fd20:0:0:3::"] }
  - { name: external, zone: europe-west1-b, private_ips: [10.0.0.4], public_ips: ["2600:1900:4001:4::"] }
  - { name: only6, zone: europe-west1-b, private_ips: ["fd20:0:0:5::"] }
"#,
    )
    .unwrap();
    let g = Gcp::start(world, GcpOptions::default()).await;
    let nic = |v: &Value| v["networkInterfaces"][0].clone();
    let v4 = nic(&g.get("zones/europe-west1-b/instances/v4").await);
    assert_eq!(v4["stackType"], "IPV4_ONLY");
    assert!(v4.get("ipv6AccessType").is_none() && v4.get("ipv6Address").is_none(), "{v4}");

    let internal = nic(&g.get("zones/europe-west1-b/instances/internal").await);
    assert_eq!(
        (&internal["stackType"], &internal["ipv6AccessType"], &internal["ipv6Address"]),
        (&json!("IPV4_IPV6"), &json!("INTERNAL"), &json!("fd20:0:0:3::"))
    );
    assert_eq!(internal["internalIpv6PrefixLength"], 96);
    assert!(internal.get("ipv6AccessConfigs").is_none(), "{internal}");

    let external = nic(&g.get("zones/europe-west1-b/instances/external").await);
    assert_eq!(
        (&external["stackType"], &external["ipv6AccessType"]),
        (&json!("IPV4_IPV6"), &json!("EXTERNAL"))
    );
    assert!(external.get("ipv6Address").is_none(), "{external}");
    let ac = &external["ipv6AccessConfigs"][0];
    assert_eq!(
        (&ac["type"], &ac["externalIpv6"]),
        (&json!("DIRECT_IPV6"), &json!("2600:1900:4001:4::"))
    );
    assert_eq!(ac["externalIpv6PrefixLength"], 96);
    assert!(external["accessConfigs"].is_null(), "no IPv4 NAT for an IPv6 address: {external}");

    let only6 = nic(&g.get("zones/europe-west1-b/instances/only6").await);
    assert_eq!(
        (&only6["stackType"], &only6["ipv6Address"]),
        (&json!("IPV6_ONLY"), &json!("fd20:0:0:5::"))
    );
    assert!(only6.get("networkIP").is_none(), "{only6}");
}
