//! The IBM Cloud emulator (`ccm_emulators::ibm`) over HTTP as a provider sees it: IAM tokens
//! required and expiring, the `version`/`generation` parameters, `start`/`limit` paging and
//! filters, load balancers pending then active with 409s meanwhile, listeners, pools, members
//! (replace), IBM's error bodies, faults in IBM's shape and the state dump.

use std::sync::Arc;
use std::time::Duration;

use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::ibm::{DEFAULT_API_KEY, IbmCloud, IbmOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::{PowerState, World};
use serde_json::{Value, json};

const V: &str = "version=2024-04-30&generation=2";

struct Ibm {
    server: Server,
    cloud: Arc<IbmCloud>,
    http: reqwest::Client,
    token: String,
}

fn world() -> World {
    World::parse(
        r#"
region: us-south
zones: [us-south-1, us-south-2]
networks:
  - { name: vpc-1, cidr: 10.0.0.0/16 }
  - { name: vpc-other }
subnets:
  - { name: subnet-a, network: vpc-1, zone: us-south-1, cidr: 10.0.0.0/24 }
  - { name: subnet-b, network: vpc-1, zone: us-south-2, cidr: 10.0.1.0/24 }
  - { name: subnet-x, network: vpc-other, zone: us-south-1, cidr: 10.9.0.0/24 }
instances:
  - { name: node-0, zone: us-south-1, subnet: subnet-a, private_ips: [10.0.0.10] }
  - { name: node-1, zone: us-south-1, subnet: subnet-a, private_ips: [10.0.0.11], type: cx2-2x4 }
  - { name: node-2, zone: us-south-2, subnet: subnet-b, private_ips: [10.0.1.12] }
  - { name: node-3, zone: us-south-2, subnet: subnet-b, private_ips: [10.0.1.13] }
  - { name: node-4, zone: us-south-1, subnet: subnet-a, private_ips: [10.0.0.14], power: stopped }
  - { name: node-5, zone: us-south-2, subnet: subnet-b, private_ips: [10.0.1.15] }
  - { name: node-6, zone: us-south-1, subnet: subnet-a, private_ips: [10.0.0.16] }
  - { name: other, zone: us-south-1, subnet: subnet-x, private_ips: [10.9.0.10] }
"#,
    )
    .unwrap()
}

impl Ibm {
    async fn start(opts: IbmOptions) -> Ibm {
        let cloud = IbmCloud::new(world(), opts);
        let server = Server::start(cloud.clone(), ServerOptions::default()).await.unwrap();
        let http = reqwest::Client::new();
        let mut ibm = Ibm { server, cloud, http, token: String::new() };
        let (status, body) = ibm.iam(DEFAULT_API_KEY).await;
        assert_eq!(status, 200, "{body}");
        ibm.token = body["access_token"].as_str().unwrap().to_string();
        ibm
    }

    /// Load balancers stay pending until `complete_pending` (no race with the clock).
    async fn start_held() -> Ibm {
        Ibm::start(IbmOptions { lb_pending: Duration::from_secs(3600), ..Default::default() }).await
    }

    async fn iam(&self, key: &str) -> (u16, Value) {
        let r = self
            .http
            .post(format!("{}/identity/token", self.server.url()))
            .header("content-type", "application/x-www-form-urlencoded")
            .body(format!(
                "grant_type=urn%3Aibm%3Aparams%3Aoauth%3Agrant-type%3Aapikey&apikey={key}"
            ))
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap())
    }

    async fn call_with(
        &self,
        method: reqwest::Method,
        path_query: &str,
        token: Option<&str>,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self.http.request(method, format!("{}{path_query}", self.server.url()));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        let text = r.text().await.unwrap();
        let v = if text.is_empty() { Value::Null } else { serde_json::from_str(&text).unwrap() };
        (status, v)
    }

    /// A VPC call with the token and the version parameters.
    async fn vpc(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> (u16, Value) {
        let sep = if path.contains('?') { '&' } else { '?' };
        self.call_with(method, &format!("/v1/{path}{sep}{V}"), Some(&self.token), body).await
    }

    async fn get(&self, path: &str) -> Value {
        let (s, v) = self.vpc(reqwest::Method::GET, path, None).await;
        assert_eq!(s, 200, "GET {path}: {v}");
        v
    }

    async fn subnet_id(&self, name: &str) -> String {
        self.cloud.subnet_id(name).unwrap()
    }
}

/// An IBM error body: `errors[0].code` is `code`, with a message and a trace.
fn assert_ibm_error(v: &Value, code: &str) {
    assert_eq!(v["errors"][0]["code"], code, "{v}");
    assert!(v["errors"][0]["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(v["trace"].as_str().is_some_and(|t| !t.is_empty()), "{v}");
}

fn b64url_decode(s: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'-' => 62,
        b'_' => 63,
        _ => panic!("not base64url: {c}"),
    };
    let bits: Vec<u8> = s.bytes().map(val).collect();
    let mut out = Vec::new();
    for chunk in bits.chunks(4) {
        let n =
            chunk.iter().enumerate().fold(0u32, |n, (i, &b)| n | (u32::from(b) << (18 - 6 * i)));
        let bytes = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
        out.extend_from_slice(&bytes[..chunk.len() - 1]);
    }
    out
}

#[tokio::test]
async fn ibm_iam_tokens_are_required_and_expire() {
    let ibm = Ibm::start(IbmOptions::default()).await;
    let url = "/v1/instances?version=2024-04-30&generation=2";

    // No token, a made-up token: 401 with IBM's error body.
    let (s, v) = ibm.call_with(reqwest::Method::GET, url, None, None).await;
    assert_eq!(s, 401, "{v}");
    assert_ibm_error(&v, "not_authorized");
    let (s, v) = ibm.call_with(reqwest::Method::GET, url, Some("a.b.c"), None).await;
    assert_eq!(s, 401, "{v}");

    // A wrong key: IAM's 400 and error shape, the key is not quoted back.
    let (s, v) = ibm.iam("wrong-key").await;
    assert_eq!(s, 400, "{v}");
    assert_eq!(v["errorCode"], "BXNIM0415E", "{v}");
    assert!(!v.to_string().contains("wrong-key"), "{v}");

    // The right key: a JWT-shaped token whose claims agree with expires_in/expiration.
    let (s, v) = ibm.iam(DEFAULT_API_KEY).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["token_type"], "Bearer");
    let token = v["access_token"].as_str().unwrap();
    let parts: Vec<&str> = token.split('.').collect();
    assert_eq!(parts.len(), 3, "{token}");
    let claims: Value = serde_json::from_slice(&b64url_decode(parts[1])).unwrap();
    assert_eq!(claims["exp"], v["expiration"], "{claims}");
    assert_eq!(
        claims["exp"].as_u64().unwrap() - claims["iat"].as_u64().unwrap(),
        v["expires_in"].as_u64().unwrap()
    );
    assert_eq!(v["expires_in"], 3600);
    assert_eq!(claims["account"]["bss"], ibm.cloud.account_id());
    let (s, _) = ibm.call_with(reqwest::Method::GET, url, Some(token), None).await;
    assert_eq!(s, 200);

    // A short lifetime: the token stops working once expired; a new one works.
    ibm.cloud.set_token_lifetime(Duration::from_secs(1));
    let (_, v) = ibm.iam(DEFAULT_API_KEY).await;
    assert_eq!(v["expires_in"], 1);
    let short = v["access_token"].as_str().unwrap().to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (s, v) = ibm.call_with(reqwest::Method::GET, url, Some(&short), None).await;
        if s == 401 {
            assert_ibm_error(&v, "not_authorized");
            break;
        }
        assert_eq!(s, 200, "{v}");
        assert!(tokio::time::Instant::now() < deadline, "a 1 s token never expired");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    ibm.cloud.set_token_lifetime(Duration::from_secs(3600));
    let (_, v) = ibm.iam(DEFAULT_API_KEY).await;
    let fresh = v["access_token"].as_str().unwrap().to_string();
    assert_eq!(ibm.call_with(reqwest::Method::GET, url, Some(&fresh), None).await.0, 200);

    // expire_tokens: every issued token is refused.
    ibm.cloud.expire_tokens();
    assert_eq!(ibm.call_with(reqwest::Method::GET, url, Some(&fresh), None).await.0, 401);
    assert_eq!(ibm.server.counters().get("iam.token"), 5);
}

#[tokio::test]
async fn ibm_version_and_generation_are_required() {
    let ibm = Ibm::start(IbmOptions::default()).await;
    let t = Some(ibm.token.as_str());
    let (s, v) = ibm.call_with(reqwest::Method::GET, "/v1/vpcs?generation=2", t, None).await;
    assert_eq!(s, 400, "{v}");
    assert_ibm_error(&v, "missing_version");
    let (s, v) = ibm
        .call_with(reqwest::Method::GET, "/v1/vpcs?version=yesterday&generation=2", t, None)
        .await;
    assert_eq!(s, 400, "{v}");
    assert_ibm_error(&v, "invalid_version");
    let (s, v) = ibm.call_with(reqwest::Method::GET, "/v1/vpcs?version=2024-04-30", t, None).await;
    assert_eq!(s, 400, "{v}");
    assert_ibm_error(&v, "missing_generation");
    let (s, v) = ibm.vpc(reqwest::Method::GET, "vpcs", None).await;
    assert_eq!(s, 200, "{v}");
    let names: Vec<&str> =
        v["vpcs"].as_array().unwrap().iter().map(|v| v["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["vpc-1", "vpc-other"]);

    // Resource groups by name (a token is required there too).
    let (s, _) =
        ibm.call_with(reqwest::Method::GET, "/v2/resource_groups?name=default", None, None).await;
    assert_eq!(s, 401);
    let (s, v) =
        ibm.call_with(reqwest::Method::GET, "/v2/resource_groups?name=default", t, None).await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["resources"][0]["id"], ibm.cloud.resource_group_id());
    let (_, v) =
        ibm.call_with(reqwest::Method::GET, "/v2/resource_groups?name=nope", t, None).await;
    assert_eq!(v["resources"], json!([]));

    // Unknown routes and ids: IBM's 404.
    let (s, v) = ibm.vpc(reqwest::Method::GET, "floating_ips", None).await;
    assert_eq!(s, 404, "{v}");
    assert_ibm_error(&v, "not_found");
    let (s, v) = ibm.vpc(reqwest::Method::GET, "subnets/0717-nope", None).await;
    assert_eq!(s, 404, "{v}");
    assert_ibm_error(&v, "not_found");
}

#[tokio::test]
async fn ibm_instances_page_and_filter_as_vpc_does() {
    let ibm = Ibm::start(IbmOptions::default()).await;
    // The whole VPC in pages of 3, following `next` (it carries start and the filters, and
    // the version parameters are the client's to add).
    let mut names = Vec::new();
    let mut path = "instances?vpc.name=vpc-1&limit=3".to_string();
    let mut pages = 0;
    loop {
        let v = ibm.get(&path).await;
        pages += 1;
        assert_eq!(v["limit"], 3);
        assert_eq!(v["total_count"], 7, "{v}");
        assert!(v["first"]["href"].as_str().unwrap().contains("limit=3"), "{v}");
        for i in v["instances"].as_array().unwrap() {
            names.push(i["name"].as_str().unwrap().to_string());
        }
        let Some(next) = v["next"]["href"].as_str() else { break };
        assert!(!next.contains("version="), "{next}");
        assert!(next.contains("vpc.name=vpc-1"), "{next}");
        path = next.split("/v1/").nth(1).unwrap().to_string();
    }
    assert_eq!(pages, 3);
    names.sort();
    assert_eq!(names, ["node-0", "node-1", "node-2", "node-3", "node-4", "node-5", "node-6"]);

    // By name, with the VPC: primary IP, zone, profile, status.
    let v = ibm.get("instances?name=node-1&vpc.name=vpc-1").await;
    let list = v["instances"].as_array().unwrap();
    assert_eq!(list.len(), 1, "{v}");
    let i = &list[0];
    assert_eq!(i["primary_network_interface"]["primary_ip"]["address"], "10.0.0.11");
    assert_eq!(i["primary_network_interface"]["subnet"]["name"], "subnet-a");
    assert_eq!(i["zone"]["name"], "us-south-1");
    assert_eq!(i["profile"]["name"], "cx2-2x4");
    assert_eq!(i["status"], "running");
    assert_eq!(i["vpc"]["name"], "vpc-1");
    let id = i["id"].as_str().unwrap();
    assert_eq!(ibm.get(&format!("instances/{id}")).await["name"], "node-1");
    assert_eq!(ibm.get("instances?name=other&vpc.name=vpc-1").await["instances"], json!([]));
    assert_eq!(ibm.get("instances?name=node-4").await["instances"][0]["status"], "stopped");

    // Power changes and deletion made in-process show up.
    assert!(ibm.cloud.set_power("node-1", PowerState::Stopped));
    assert_eq!(ibm.get(&format!("instances/{id}")).await["status"], "stopped");
    assert!(ibm.cloud.delete_instance("node-1"));
    let (s, v) = ibm.vpc(reqwest::Method::GET, &format!("instances/{id}"), None).await;
    assert_eq!(s, 404, "{v}");
    assert_ibm_error(&v, "not_found");

    // Bad paging parameters.
    let (s, v) = ibm.vpc(reqwest::Method::GET, "instances?limit=0", None).await;
    assert_eq!(s, 400, "{v}");
    let (s, _) = ibm.vpc(reqwest::Method::GET, "instances?start=bogus", None).await;
    assert_eq!(s, 400);

    // Subnets: list and get.
    let v = ibm.get("subnets").await;
    assert_eq!(v["subnets"].as_array().unwrap().len(), 3);
    let sid = ibm.subnet_id("subnet-b").await;
    let s = ibm.get(&format!("subnets/{sid}")).await;
    assert_eq!(s["zone"]["name"], "us-south-2");
    assert_eq!(s["ipv4_cidr_block"], "10.0.1.0/24");
    assert_eq!(s["vpc"]["name"], "vpc-1");
    let c = ibm.server.counters();
    assert_eq!(c.get("vpc.instances.list"), 8);
    assert_eq!(c.get("vpc.subnets.get"), 1);
}

fn lb_body(name: &str, subnet: &str) -> Value {
    json!({
        "name": name,
        "is_public": true,
        "subnets": [{"id": subnet}],
        "pools": [{
            "name": "tcp-80-30080", "algorithm": "round_robin", "protocol": "tcp",
            "health_monitor": {"delay": 5, "max_retries": 2, "timeout": 2, "type": "tcp", "port": 30080},
            "members": [{"port": 30080, "target": {"address": "10.0.0.10"}}],
        }],
        "listeners": [{"port": 80, "protocol": "tcp", "default_pool": {"name": "tcp-80-30080"}}],
    })
}

#[tokio::test]
async fn ibm_load_balancers_are_pending_then_active_and_refuse_changes_meanwhile() {
    let ibm = Ibm::start_held().await;
    let subnet = ibm.subnet_id("subnet-a").await;
    let (s, lb) = ibm
        .vpc(reqwest::Method::POST, "load_balancers", Some(lb_body("kube-c1-abc", &subnet)))
        .await;
    assert_eq!(s, 201, "{lb}");
    assert_eq!(lb["provisioning_status"], "create_pending");
    assert_eq!(lb["operating_status"], "offline");
    assert!(lb["hostname"].as_str().unwrap().ends_with(".lb.appdomain.cloud"), "{lb}");
    assert_eq!(lb["listeners"].as_array().unwrap().len(), 1);
    assert_eq!(lb["pools"][0]["name"], "tcp-80-30080");
    let id = lb["id"].as_str().unwrap().to_string();

    // Duplicate names are refused.
    let (s, v) = ibm
        .vpc(reqwest::Method::POST, "load_balancers", Some(lb_body("kube-c1-abc", &subnet)))
        .await;
    assert_eq!(s, 400, "{v}");
    assert_ibm_error(&v, "validation_unique_failed");

    // While create_pending every change is a 409 in IBM's shape.
    let pool_id = lb["pools"][0]["id"].as_str().unwrap().to_string();
    for (method, path, body) in [
        (
            reqwest::Method::POST,
            format!("load_balancers/{id}/listeners"),
            Some(json!({"port": 443, "protocol": "tcp"})),
        ),
        (reqwest::Method::DELETE, format!("load_balancers/{id}"), None),
        (
            reqwest::Method::PUT,
            format!("load_balancers/{id}/pools/{pool_id}/members"),
            Some(json!({"members": []})),
        ),
        (
            reqwest::Method::PATCH,
            format!("load_balancers/{id}/pools/{pool_id}"),
            Some(json!({"algorithm": "least_connections"})),
        ),
    ] {
        let (s, v) = ibm.vpc(method.clone(), &path, body).await;
        assert_eq!(s, 409, "{method} {path}: {v}");
        assert_ibm_error(&v, "load_balancer_update_conflict");
    }
    // Reads are fine.
    assert_eq!(
        ibm.get(&format!("load_balancers/{id}")).await["provisioning_status"],
        "create_pending"
    );

    ibm.cloud.complete_pending();
    let lb = ibm.get(&format!("load_balancers/{id}")).await;
    assert_eq!(lb["provisioning_status"], "active");
    assert_eq!(lb["operating_status"], "online");
    assert_eq!(lb["is_public"], true);
    assert!(!lb["public_ips"].as_array().unwrap().is_empty());

    // A change: update_pending, then active again.
    let (s, l) = ibm
        .vpc(
            reqwest::Method::POST,
            &format!("load_balancers/{id}/listeners"),
            Some(json!({"port": 443, "protocol": "tcp", "default_pool": {"id": pool_id}})),
        )
        .await;
    assert_eq!(s, 201, "{l}");
    assert_eq!(l["provisioning_status"], "create_pending");
    assert_eq!(l["default_pool"]["name"], "tcp-80-30080");
    assert_eq!(
        ibm.get(&format!("load_balancers/{id}")).await["provisioning_status"],
        "update_pending"
    );
    ibm.cloud.complete_pending();
    // Same port twice: 409.
    let (s, v) = ibm
        .vpc(
            reqwest::Method::POST,
            &format!("load_balancers/{id}/listeners"),
            Some(json!({"port": 443, "protocol": "tcp"})),
        )
        .await;
    assert_eq!(s, 409, "{v}");

    // A pool that is a listener's default pool cannot be deleted.
    let (s, v) = ibm
        .vpc(reqwest::Method::DELETE, &format!("load_balancers/{id}/pools/{pool_id}"), None)
        .await;
    assert_eq!(s, 409, "{v}");
    assert_ibm_error(&v, "load_balancer_pool_in_use");

    // Delete: delete_pending, then gone (404).
    let (s, _) = ibm.vpc(reqwest::Method::DELETE, &format!("load_balancers/{id}"), None).await;
    assert_eq!(s, 202);
    assert_eq!(
        ibm.get(&format!("load_balancers/{id}")).await["provisioning_status"],
        "delete_pending"
    );
    assert_eq!(ibm.get("load_balancers").await["load_balancers"].as_array().unwrap().len(), 1);
    ibm.cloud.complete_pending();
    let (s, v) = ibm.vpc(reqwest::Method::GET, &format!("load_balancers/{id}"), None).await;
    assert_eq!(s, 404, "{v}");
    assert_ibm_error(&v, "not_found");
    assert_eq!(ibm.get("load_balancers").await["load_balancers"], json!([]));
    let c = ibm.server.counters();
    assert_eq!(c.get("vpc.load_balancers.create"), 2);
    assert_eq!(c.get("vpc.load_balancers.delete"), 2);
    assert_eq!(c.get("vpc.load_balancer_listeners.create"), 3);
}

#[tokio::test]
async fn ibm_load_balancers_become_active_on_their_own() {
    let ibm =
        Ibm::start(IbmOptions { lb_pending: Duration::from_millis(200), ..Default::default() })
            .await;
    let subnet = ibm.subnet_id("subnet-b").await;
    let (s, lb) = ibm
        .vpc(reqwest::Method::POST, "load_balancers", Some(lb_body("kube-c1-self", &subnet)))
        .await;
    assert_eq!(s, 201, "{lb}");
    let id = lb["id"].as_str().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let v = ibm.get(&format!("load_balancers/{id}")).await;
        match v["provisioning_status"].as_str().unwrap() {
            "active" => break,
            "create_pending" => {}
            other => panic!("unexpected status {other}"),
        }
        assert!(tokio::time::Instant::now() < deadline, "never active");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn ibm_pools_members_and_health_monitors_are_kept_and_replaced() {
    let ibm = Ibm::start_held().await;
    let subnet = ibm.subnet_id("subnet-a").await;
    let (_, lb) = ibm
        .vpc(reqwest::Method::POST, "load_balancers", Some(lb_body("kube-c1-pools", &subnet)))
        .await;
    let id = lb["id"].as_str().unwrap().to_string();
    ibm.cloud.complete_pending();

    // A second pool (HTTP health check for Local, proxy protocol), then its members.
    let (s, p) = ibm
        .vpc(
            reqwest::Method::POST,
            &format!("load_balancers/{id}/pools"),
            Some(json!({
                "name": "tcp-443-30443", "algorithm": "round_robin", "protocol": "tcp",
                "proxy_protocol": "v1",
                "health_monitor": {"delay": 5, "max_retries": 2, "timeout": 2, "type": "http", "port": 31000, "url_path": "/healthz"},
            })),
        )
        .await;
    assert_eq!(s, 201, "{p}");
    let pid = p["id"].as_str().unwrap().to_string();
    ibm.cloud.complete_pending();
    // Bad health monitors name the field.
    let (s, v) = ibm
        .vpc(
            reqwest::Method::PATCH,
            &format!("load_balancers/{id}/pools/{pid}"),
            Some(json!({"health_monitor": {"timeout": 10}})),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    assert!(v["errors"][0]["message"].as_str().unwrap().contains("timeout"), "{v}");

    let members = format!("load_balancers/{id}/pools/{pid}/members");
    let (s, m) = ibm
        .vpc(
            reqwest::Method::POST,
            &members,
            Some(json!({"port": 30443, "target": {"address": "10.0.0.10"}})),
        )
        .await;
    assert_eq!(s, 201, "{m}");
    assert_eq!(m["weight"], 50);
    ibm.cloud.complete_pending();

    // Replace: the new set exactly, 202, the LB update_pending.
    let (s, v) = ibm
        .vpc(
            reqwest::Method::PUT,
            &members,
            Some(json!({"members": [
                {"port": 30443, "target": {"address": "10.0.0.11"}},
                {"port": 30443, "target": {"address": "10.0.1.12"}, "weight": 10},
            ]})),
        )
        .await;
    assert_eq!(s, 202, "{v}");
    assert_eq!(v["members"].as_array().unwrap().len(), 2);
    assert_eq!(
        ibm.get(&format!("load_balancers/{id}")).await["provisioning_status"],
        "update_pending"
    );
    ibm.cloud.complete_pending();
    let list = ibm.get(&members).await;
    let mut addrs: Vec<&str> = list["members"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["target"]["address"].as_str().unwrap())
        .collect();
    addrs.sort();
    assert_eq!(addrs, ["10.0.0.11", "10.0.1.12"]);

    // Delete one member.
    let mid = list["members"][0]["id"].as_str().unwrap();
    let (s, _) = ibm.vpc(reqwest::Method::DELETE, &format!("{members}/{mid}"), None).await;
    assert_eq!(s, 202);
    ibm.cloud.complete_pending();
    assert_eq!(ibm.get(&members).await["members"].as_array().unwrap().len(), 1);

    // Switch the health monitor to TCP on the node port (merge patch).
    let (s, v) = ibm
        .vpc(
            reqwest::Method::PATCH,
            &format!("load_balancers/{id}/pools/{pid}"),
            Some(json!({"health_monitor": {"delay": 5, "max_retries": 2, "timeout": 2, "type": "tcp", "port": 30443}})),
        )
        .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(
        v["health_monitor"],
        json!({"delay": 5, "max_retries": 2, "timeout": 2, "type": "tcp", "port": 30443})
    );
    ibm.cloud.complete_pending();

    // The state dump shows the whole tree.
    let state = ibm.server.admin().state().await.unwrap();
    let lbs = state["cloud"]["load_balancers"].as_array().unwrap();
    assert_eq!(lbs.len(), 1);
    let pools = lbs[0]["pools"].as_array().unwrap();
    let p2 = pools.iter().find(|p| p["name"] == "tcp-443-30443").unwrap();
    assert_eq!(p2["proxy_protocol"], "v1");
    assert_eq!(p2["health_monitor"]["type"], "tcp");
    assert_eq!(p2["members"].as_array().unwrap().len(), 1);
    assert!(p2["members"][0]["target"]["address"].is_string());
    assert_eq!(lbs[0]["listeners"][0]["default_pool"]["name"], "tcp-80-30080");
    assert_eq!(state["cloud"]["instances"].as_array().unwrap().len(), 8);
}

async fn post(ibm: &Ibm, path: &str, body: Value) -> (u16, Value) {
    ibm.call_with(reqwest::Method::POST, path, Some(&ibm.token), Some(body)).await
}

/// The user tags attached to `crn`, as Global Tagging lists them.
async fn tags_of(ibm: &Ibm, crn: &str) -> Vec<String> {
    let q = url::form_urlencoded::Serializer::new(String::new())
        .append_pair("attached_to", crn)
        .append_pair("tag_type", "user")
        .finish();
    let (s, v) =
        ibm.call_with(reqwest::Method::GET, &format!("/v3/tags?{q}"), Some(&ibm.token), None).await;
    assert_eq!(s, 200, "{v}");
    let names: Vec<String> =
        v["items"].as_array().unwrap().iter().map(|i| i["name"].as_str().unwrap().into()).collect();
    assert_eq!(v["total_count"], names.len(), "{v}");
    names
}

#[tokio::test]
async fn ibm_global_tagging_attaches_lists_and_refuses_as_ibm_does() {
    let ibm = Ibm::start_held().await;
    let subnet = ibm.subnet_id("subnet-a").await;
    let (s, lb) =
        ibm.vpc(reqwest::Method::POST, "load_balancers", Some(lb_body("tagged", &subnet))).await;
    assert_eq!(s, 201, "{lb}");
    let crn = lb["crn"].as_str().unwrap().to_string();
    let account = ibm.cloud.account_id();
    assert!(crn.starts_with("crn:v1:bluemix:public:is:us-south:a/") && crn.contains(&account));
    assert!(tags_of(&ibm, &crn).await.is_empty());

    // Attach (case-insensitive, kept lower-cased), idempotent; tags on a pending load
    // balancer are fine (tags are not load balancer changes).
    let body =
        json!({"resources": [{"resource_id": crn}], "tag_names": ["ccm-cluster:C1", "env:test"]});
    let (s, v) =
        post(&ibm, &format!("/v3/tags/attach?tag_type=user&account_id={account}"), body.clone())
            .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["results"], json!([{"resource_id": crn, "is_error": false}]));
    let (s, _) = post(&ibm, "/v3/tags/attach", body).await;
    assert_eq!(s, 200);
    assert_eq!(tags_of(&ibm, &crn).await, ["ccm-cluster:c1", "env:test"]);
    // Another resource's CRN, or one of no resource: is_error, nothing attached.
    let other =
        crn.replace(lb["id"].as_str().unwrap(), "r006-00000000-0000-4000-8000-000000000000");
    let (s, v) = post(
        &ibm,
        "/v3/tags/attach",
        json!({"resources": [{"resource_id": other}], "tag_name": "x"}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(v["results"][0]["is_error"], true, "{v}");
    assert!(tags_of(&ibm, &other).await.is_empty());
    // Rejections.
    for (body, code) in [
        (
            json!({"resources": [{"resource_id": crn}], "tag_names": ["no/slash"]}),
            "invalid_tag_name",
        ),
        (
            json!({"resources": [{"resource_id": crn}], "tag_names": ["x".repeat(129)]}),
            "invalid_tag_name",
        ),
        (
            json!({"resources": [{"resource_id": crn}], "tag_names": []}),
            "validation_required_field_missing",
        ),
        (json!({"resources": [], "tag_names": ["a"]}), "validation_required_field_missing"),
    ] {
        let (s, v) = post(&ibm, "/v3/tags/attach", body).await;
        assert_eq!(s, 400, "{v}");
        assert_ibm_error(&v, code);
    }
    let (s, v) = post(
        &ibm,
        "/v3/tags/attach?account_id=someone-else",
        json!({"resources": [{"resource_id": crn}], "tag_names": ["a"]}),
    )
    .await;
    assert_eq!(s, 403, "{v}");
    let (s, _) = post(
        &ibm,
        "/v3/tags/attach?tag_type=access",
        json!({"resources": [{"resource_id": crn}], "tag_names": ["a:b"]}),
    )
    .await;
    assert_eq!(s, 400);
    let (s, _) =
        ibm.call_with(reqwest::Method::GET, "/v3/tags?limit=1001", Some(&ibm.token), None).await;
    assert_eq!(s, 400);
    let (s, _) = ibm.call_with(reqwest::Method::GET, "/v3/tags", None, None).await;
    assert_eq!(s, 401, "a token is required");
    // Paging, detach, the state dump, and deletion takes the tags along.
    let (s, v) = ibm
        .call_with(reqwest::Method::GET, "/v3/tags?offset=1&limit=1", Some(&ibm.token), None)
        .await;
    assert_eq!(s, 200);
    assert_eq!(
        (v["total_count"].as_u64(), v["items"][0]["name"].as_str()),
        (Some(2), Some("env:test"))
    );
    let (s, _) = post(
        &ibm,
        "/v3/tags/detach",
        json!({"resources": [{"resource_id": crn}], "tag_names": ["env:test"]}),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(tags_of(&ibm, &crn).await, ["ccm-cluster:c1"]);
    let state = ibm.server.admin().state().await.unwrap();
    assert_eq!(state["cloud"]["load_balancers"][0]["tags"], json!(["ccm-cluster:c1"]));
    ibm.cloud.complete_pending();
    let id = lb["id"].as_str().unwrap();
    let (s, _) = ibm.vpc(reqwest::Method::DELETE, &format!("load_balancers/{id}"), None).await;
    assert_eq!(s, 202);
    ibm.cloud.complete_pending();
    assert!(tags_of(&ibm, &crn).await.is_empty());
}

#[tokio::test]
async fn ibm_faults_answer_in_ibm_shapes() {
    let ibm = Ibm::start(IbmOptions::default()).await;
    ibm.server
        .inject(
            FaultRule::new("vpc.instances.list", Fault::Throttle { retry_after_secs: 2 }).times(1),
        )
        .unwrap();
    let r = ibm
        .http
        .get(format!("{}/v1/instances?{V}", ibm.server.url()))
        .bearer_auth(&ibm.token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 429);
    assert_eq!(r.headers()["retry-after"], "2");
    let v: Value = r.json().await.unwrap();
    assert_ibm_error(&v, "rate_limit_exceeded");
    assert_eq!(ibm.get("instances").await["total_count"], 8);

    ibm.server
        .inject(FaultRule::new("iam.token", Fault::Status { status: 503, body: None }).times(1))
        .unwrap();
    let (s, v) = ibm.iam(DEFAULT_API_KEY).await;
    assert_eq!(s, 503);
    assert!(v["errorCode"].is_string() && v["errorMessage"].is_string(), "{v}");

    // Reset reloads the world: deleted instances come back, load balancers are gone.
    assert!(ibm.cloud.delete_instance("node-0"));
    ibm.server.admin().reset().await.unwrap();
    assert!(ibm.cloud.instance_id("node-0").is_some());
}

#[tokio::test]
async fn ibm_standalone_binary_serves_the_world_file() {
    use std::io::{BufRead, BufReader};
    use std::process::{Command, Stdio};
    let dir = tempfile::tempdir().unwrap();
    let world = dir.path().join("world.yaml");
    std::fs::write(
        &world,
        "instances:\n  - { name: node-a, zone: us-south-1, private_ips: [10.1.0.5] }\n",
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_ccm-emulator"))
        .args(["ibm", "--world", world.to_str().unwrap(), "--api-key", "k-1"])
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
    let http = reqwest::Client::builder().timeout(Duration::from_secs(60)).build().unwrap();
    let token = |key: &'static str| {
        http.post(format!("{url}/identity/token"))
            .body(format!(
                "grant_type=urn%3Aibm%3Aparams%3Aoauth%3Agrant-type%3Aapikey&apikey={key}"
            ))
            .send()
    };
    assert_eq!(token(DEFAULT_API_KEY).await.unwrap().status(), 400, "only --api-key keys");
    let v: Value = token("k-1").await.unwrap().json().await.unwrap();
    let t = v["access_token"].as_str().unwrap();
    let v: Value = http
        .get(format!("{url}/v1/instances?{V}&name=node-a"))
        .bearer_auth(t)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(v["instances"][0]["primary_network_interface"]["primary_ip"]["address"], "10.1.0.5");
    drop(child.stdin.take());
    let status = tokio::task::spawn_blocking(move || child.wait().unwrap()).await.unwrap();
    assert!(status.success(), "{status}");
}

/// Quotas from the world file's `ibm:` section (issue #31): load balancers per region,
/// listeners and pools per load balancer and members per pool, each a 400 `over_quota` (IBM's
/// documented error code) past its limit, inline in a create or one at a time; absent keys keep
/// IBM's defaults; an unknown key is refused naming it.
#[tokio::test]
async fn ibm_quotas_come_from_the_world_file() {
    use ccm_emulators::ibm::{IbmQuotas, IbmWorld, parse_world};
    let mut text = serde_json::to_value(world()).unwrap();
    text["ibm"] = json!({"quotas": {"load_balancers": 2, "listeners_per_load_balancer": 2,
        "pools_per_load_balancer": 2, "members_per_pool": 2}});
    let (w, ibm_world) = parse_world(&text.to_string()).unwrap();
    assert_eq!(w, world());
    let q = ibm_world.quotas.clone().unwrap();
    assert_eq!(
        q,
        IbmQuotas {
            load_balancers: Some(2),
            listeners_per_load_balancer: Some(2),
            pools_per_load_balancer: Some(2),
            members_per_pool: Some(2),
        }
    );
    let defaults = IbmOptions::default().with_world(&IbmWorld::default());
    assert_eq!(
        (defaults.lb_quota, defaults.listener_quota, defaults.pool_quota, defaults.member_quota),
        (50, 10, 10, 50)
    );
    let (_, yaml) =
        parse_world("region: us-south\nibm:\n  quotas: { load_balancers: 3 }\n").unwrap();
    assert_eq!(IbmOptions::default().with_world(&yaml).lb_quota, 3);
    let e = parse_world("ibm:\n  quotas: { routers: 1 }\n").unwrap_err().to_string();
    assert!(e.contains("ibm:") && e.contains("routers"), "{e}");

    let opts = IbmOptions { lb_pending: Duration::from_millis(50), ..Default::default() }
        .with_world(&ibm_world);
    let ibm = Ibm::start(opts).await;
    let subnet = ibm.subnet_id("subnet-a").await;
    let post = |path: String, body: Value| {
        let ibm = &ibm;
        async move { ibm.vpc(reqwest::Method::POST, &path, Some(body)).await }
    };
    let settle = || tokio::time::sleep(Duration::from_millis(150));

    // Inline: three members in a pool of the create.
    let mut three = lb_body("lb-members", &subnet);
    three["pools"][0]["members"] = json!([
        {"port": 30080, "target": {"address": "10.0.0.10"}},
        {"port": 30080, "target": {"address": "10.0.0.11"}},
        {"port": 30080, "target": {"address": "10.0.0.14"}},
    ]);
    let (s, v) = post("load_balancers".into(), three).await;
    assert_eq!(s, 400, "{v}");
    assert_ibm_error(&v, "over_quota");

    let (s, lb) = post("load_balancers".into(), lb_body("lb-1", &subnet)).await;
    assert_eq!(s, 201, "{lb}");
    let id = lb["id"].as_str().unwrap().to_string();
    settle().await;
    // One more listener (2 of 2), then the third is over.
    let pool = ibm.get(&format!("load_balancers/{id}/pools")).await["pools"][0]["id"]
        .as_str()
        .unwrap()
        .to_string();
    let (s, v) = post(
        format!("load_balancers/{id}/listeners"),
        json!({"port": 81, "protocol": "tcp", "default_pool": {"id": pool}}),
    )
    .await;
    assert_eq!(s, 201, "{v}");
    settle().await;
    let (s, v) = post(
        format!("load_balancers/{id}/listeners"),
        json!({"port": 82, "protocol": "tcp", "default_pool": {"id": pool}}),
    )
    .await;
    assert_eq!(s, 400, "{v}");
    assert_ibm_error(&v, "over_quota");
    // Pools: a second, then the third is over.
    let pool_body = |name: &str| {
        json!({"name": name, "algorithm": "round_robin", "protocol": "tcp",
            "health_monitor": {"delay": 5, "max_retries": 2, "timeout": 2, "type": "tcp"}})
    };
    let (s, v) = post(format!("load_balancers/{id}/pools"), pool_body("tcp-90-30090")).await;
    assert_eq!(s, 201, "{v}");
    settle().await;
    let (s, v) = post(format!("load_balancers/{id}/pools"), pool_body("tcp-91-30091")).await;
    assert_eq!(s, 400, "{v}");
    assert_ibm_error(&v, "over_quota");
    // Members: a second, then the third is over; a replace with three too.
    let member = |ip: &str| json!({"port": 30080, "target": {"address": ip}});
    let (s, v) =
        post(format!("load_balancers/{id}/pools/{pool}/members"), member("10.0.0.11")).await;
    assert_eq!(s, 201, "{v}");
    settle().await;
    let (s, v) =
        post(format!("load_balancers/{id}/pools/{pool}/members"), member("10.0.0.14")).await;
    assert_eq!(s, 400, "{v}");
    assert_ibm_error(&v, "over_quota");
    let (s, v) = ibm
        .vpc(
            reqwest::Method::PUT,
            &format!("load_balancers/{id}/pools/{pool}/members"),
            Some(
                json!({"members": [member("10.0.0.10"), member("10.0.0.11"), member("10.0.0.14")]}),
            ),
        )
        .await;
    assert_eq!(s, 400, "{v}");
    assert_ibm_error(&v, "over_quota");
    // Load balancers: a second, then the third is over.
    let (s, v) = post("load_balancers".into(), lb_body("lb-2", &subnet)).await;
    assert_eq!(s, 201, "{v}");
    let (s, v) = post("load_balancers".into(), lb_body("lb-3", &subnet)).await;
    assert_eq!(s, 400, "{v}");
    assert_ibm_error(&v, "over_quota");
    assert!(v["errors"][0]["message"].as_str().unwrap().contains("quota"), "{v}");
}
