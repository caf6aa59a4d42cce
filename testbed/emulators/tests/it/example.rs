//! A minimal cloud built on the kit, as `docs/emulators.md` describes: a router, an operation
//! classifier, an error-body formatter, state loaded from a world file, and an ARM-style
//! long-running "stop instance" operation. The kit's own tests run against it.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use ccm_emulators::asyncop::{Action, AsyncOps, arm_status};
use ccm_emulators::server::{
    Cloud, ErrorKind, ErrorReply, ServeFuture, Server, ServerOptions, json_response,
};
use ccm_emulators::world::{PowerState, World};
use http::{HeaderValue, Method, Request, StatusCode};
use serde_json::json;

/// The example cloud: `GET /v1/instances`, `POST /v1/instances/<name>/stop` (202 +
/// `Azure-AsyncOperation`), `GET /v1/operations/<id>`.
pub struct Example {
    world: World,
    instances: Mutex<World>,
    pub ops: AsyncOps,
}

impl Example {
    pub fn new(world: World) -> Arc<Example> {
        Arc::new(Example {
            instances: Mutex::new(world.clone()),
            world,
            ops: AsyncOps::new(Duration::from_secs(120)),
        })
    }

    /// Starts a server for `world`; the cloud is returned too for in-process control.
    pub async fn start(world: World) -> (Server, Arc<Example>) {
        let cloud = Example::new(world);
        let server = Server::start(cloud.clone(), ServerOptions::default()).await.unwrap();
        (server, cloud)
    }

    fn instances(&self) -> std::sync::MutexGuard<'_, World> {
        self.instances.lock().unwrap()
    }

    /// Applies finished stop operations to the instances (the cloud's side effect).
    fn settle(&self) {
        let state = self.ops.state();
        for op in state.as_array().into_iter().flatten() {
            if op["phase"] == "done" {
                let name = op["target"].as_str().unwrap_or_default();
                if let Some(i) = self.instances().instances.iter_mut().find(|i| i.name == name) {
                    i.power = PowerState::Stopped;
                }
            }
        }
    }
}

fn segments(path: &str) -> Vec<&str> {
    path.trim_matches('/').split('/').collect()
}

impl Cloud for Example {
    fn name(&self) -> String {
        "example".into()
    }

    fn operation(&self, head: &http::request::Parts, _body: &Bytes) -> String {
        match (head.method.clone(), segments(head.uri.path()).as_slice()) {
            (Method::GET, ["v1", "instances"]) => "example.instances.list".into(),
            (Method::POST, ["v1", "instances", _, "stop"]) => "example.instances.stop".into(),
            (Method::GET, ["v1", "operations", _]) => "example.operations.get".into(),
            (m, _) => format!("example.unknown.{m}"),
        }
    }

    fn error(&self, _head: &http::request::Parts, op: &str, kind: ErrorKind) -> ErrorReply {
        let (status, code) = match kind {
            ErrorKind::Status(s) => (s, "InjectedFault"),
            ErrorKind::Throttle => (429, "TooManyRequests"),
            ErrorKind::Unavailable => (503, "ServiceUnavailable"),
        };
        ErrorReply {
            status,
            content_type: "application/json",
            body: json!({"error": {"code": code, "message": format!("{op} failed")}}).to_string(),
        }
    }

    fn serve(&self, op: String, req: Request<Bytes>) -> ServeFuture {
        self.settle();
        let path = req.uri().path().to_string();
        let seg = segments(&path);
        let resp = match op.as_str() {
            "example.instances.list" => {
                let list: Vec<_> = self
                    .instances()
                    .instances
                    .iter()
                    .map(|i| json!({"name": i.name, "zone": i.zone, "power": i.power}))
                    .collect();
                json_response(StatusCode::OK, &json!({ "instances": list }))
            }
            "example.instances.stop" => {
                let name = seg[2];
                if self.instances().instance(name).is_none() {
                    json_response(StatusCode::NOT_FOUND, &json!({"error": {"code": "NotFound"}}))
                } else {
                    let op = self.ops.start(name, Action::Update);
                    let mut r = json_response(StatusCode::ACCEPTED, &json!({}));
                    let url = format!("/v1/operations/{}", op.id);
                    r.headers_mut()
                        .insert("azure-asyncoperation", HeaderValue::from_str(&url).unwrap());
                    r
                }
            }
            "example.operations.get" => match self.ops.phase(seg[2]) {
                Some(p) => json_response(StatusCode::OK, &arm_status(&p)),
                None => {
                    json_response(StatusCode::NOT_FOUND, &json!({"error": {"code": "NotFound"}}))
                }
            },
            _ => json_response(StatusCode::NOT_FOUND, &json!({"error": {"code": "NoRoute"}})),
        };
        Box::pin(async move { Ok(resp) })
    }

    fn reset(&self) {
        *self.instances() = self.world.clone();
        self.ops.reset();
    }

    fn state(&self) -> serde_json::Value {
        self.settle();
        json!({ "world": *self.instances(), "operations": self.ops.state() })
    }

    fn async_ops(&self) -> Option<&AsyncOps> {
        Some(&self.ops)
    }
}
