//! The admin API's wire types ([`Counters`], [`RequestRecord`], [`PauseMode`]) and its Rust
//! client [`Admin`], which tests use to inject faults, pause, reset and read counters of an
//! emulator or a fault proxy.
//!
//! Every path is under the reserved prefix [`PREFIX`] (`/__emulator/`), JSON in and out.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub use crate::asyncop::{
    ActionMatch, OperationFailure, TimingMs, TimingProfile, TimingReport, TimingSelection,
};
pub use crate::faults::{Fault, FaultRule};

/// The reserved path prefix of the admin API.
pub const PREFIX: &str = "/__emulator/";

/// How a paused emulator treats calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum PauseMode {
    /// Every call hangs until `resume` (then it is served).
    Hang,
    /// Every call fails with the cloud's "service unavailable" error.
    Fail,
}

/// Per-operation call counters (`GET /__emulator/counters`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Counters {
    /// Calls per operation, faulted or not.
    pub operations: BTreeMap<String, u64>,
    /// Every call (admin calls excluded).
    pub total: u64,
    /// Calls answered by an injected fault or a paused emulator.
    pub faulted: u64,
    /// Of those, per operation.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub faulted_operations: BTreeMap<String, u64>,
}

impl Counters {
    /// Calls of exactly `op`.
    pub fn get(&self, op: &str) -> u64 {
        self.operations.get(op).copied().unwrap_or(0)
    }

    /// Calls of exactly `op` the cloud itself answered (not a fault or a pause).
    pub fn answered(&self, op: &str) -> u64 {
        self.get(op).saturating_sub(self.faulted_operations.get(op).copied().unwrap_or(0))
    }

    /// Calls of every operation matching the glob `pattern` (e.g. `ec2:*`).
    pub fn matching(&self, pattern: &str) -> u64 {
        self.operations
            .iter()
            .filter(|(op, _)| crate::faults::glob_matches(pattern, op))
            .map(|(_, n)| n)
            .sum()
    }
}

/// One entry of the request log (`GET /__emulator/requests`), oldest first.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RequestRecord {
    /// The operation name.
    pub operation: String,
    /// The HTTP method.
    pub method: String,
    /// The path (no query string).
    pub path: String,
    /// The status answered; 0 when the connection was closed without an answer.
    pub status: u16,
    /// Milliseconds until the response head (or the close).
    pub ms: u64,
}

/// An admin call failed.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// Building the HTTP client failed.
    #[error("building the admin client: {0}")]
    Client(#[source] reqwest::Error),
    /// The emulator could not be reached or its answer not read.
    #[error("{what} {url}: {source}")]
    Http {
        /// The call.
        what: &'static str,
        /// Its URL.
        url: String,
        /// Why.
        source: reqwest::Error,
    },
    /// The emulator refused the call.
    #[error("{what} {url}: HTTP {status}: {body}")]
    Refused {
        /// The call.
        what: &'static str,
        /// Its URL.
        url: String,
        /// The status.
        status: u16,
        /// The answer.
        body: String,
    },
}

/// A client of one emulator's admin API.
#[derive(Debug, Clone)]
pub struct Admin {
    base: String,
    http: reqwest::Client,
}

#[derive(Deserialize)]
struct Id {
    id: u64,
}

impl Admin {
    /// A client for the emulator at `base_url` (e.g. `http://127.0.0.1:8080`). For an
    /// `https` emulator the server certificate is not verified: the admin API is a loopback
    /// test interface carrying no secrets. Use [`Admin::with_ca_pem`] to verify it.
    pub fn new(base_url: impl AsRef<str>) -> Result<Admin, AdminError> {
        Self::build(base_url.as_ref(), None)
    }

    /// A client that trusts only the CA in `ca_pem` for an `https` emulator.
    pub fn with_ca_pem(base_url: impl AsRef<str>, ca_pem: &str) -> Result<Admin, AdminError> {
        Self::build(base_url.as_ref(), Some(ca_pem))
    }

    /// [`Admin::with_ca_pem`], presenting the client certificate and key in `identity_pem`
    /// (PEM, certificate then key) to an emulator that requires one
    /// ([`crate::tls::TlsIdentity::generate_requiring_client_certs`]).
    pub fn with_ca_pem_and_identity(
        base_url: impl AsRef<str>,
        ca_pem: &str,
        identity_pem: &str,
    ) -> Result<Admin, AdminError> {
        let identity =
            reqwest::Identity::from_pem(identity_pem.as_bytes()).map_err(AdminError::Client)?;
        Self::build_with(base_url.as_ref(), Some(ca_pem), Some(identity))
    }

    fn build(base: &str, ca_pem: Option<&str>) -> Result<Admin, AdminError> {
        Self::build_with(base, ca_pem, None)
    }

    fn build_with(
        base: &str,
        ca_pem: Option<&str>,
        identity: Option<reqwest::Identity>,
    ) -> Result<Admin, AdminError> {
        let mut b = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .connect_timeout(Duration::from_secs(20))
            .no_proxy();
        if let Some(identity) = identity {
            b = b.identity(identity);
        }
        match ca_pem {
            Some(pem) => {
                let cert =
                    reqwest::Certificate::from_pem(pem.as_bytes()).map_err(AdminError::Client)?;
                b = b.tls_certs_only([cert]);
            }
            None => b = b.tls_danger_accept_invalid_certs(true),
        }
        let http = b.build().map_err(AdminError::Client)?;
        Ok(Admin { base: base.trim_end_matches('/').to_string(), http })
    }

    /// The emulator's base URL.
    pub fn base_url(&self) -> &str {
        &self.base
    }

    fn url(&self, path: &str) -> String {
        format!("{}{PREFIX}{path}", self.base)
    }

    async fn call(
        &self,
        what: &'static str,
        method: reqwest::Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> Result<serde_json::Value, AdminError> {
        let url = self.url(path);
        let mut req = self.http.request(method, &url);
        if let Some(b) = body {
            req = req.json(&b);
        }
        let http = |source| AdminError::Http { what, url: url.clone(), source };
        let resp = req.send().await.map_err(http)?;
        let status = resp.status();
        let text = resp.text().await.map_err(http)?;
        if !status.is_success() {
            return Err(AdminError::Refused { what, url, status: status.as_u16(), body: text });
        }
        if text.trim().is_empty() {
            return Ok(serde_json::Value::Null);
        }
        serde_json::from_str(&text).map_err(|e| AdminError::Refused {
            what,
            url: url.clone(),
            status: status.as_u16(),
            body: format!("not JSON ({e}): {text}"),
        })
    }

    fn decode<T: serde::de::DeserializeOwned>(
        &self,
        what: &'static str,
        path: &str,
        v: serde_json::Value,
    ) -> Result<T, AdminError> {
        serde_json::from_value(v.clone()).map_err(|e| AdminError::Refused {
            what,
            url: self.url(path),
            status: 200,
            body: format!("unexpected answer ({e}): {v}"),
        })
    }

    /// Installs a fault rule and returns its id.
    pub async fn inject(&self, rule: FaultRule) -> Result<u64, AdminError> {
        let body = serde_json::to_value(&rule).unwrap_or_default();
        let v = self.call("injecting a fault", reqwest::Method::POST, "faults", Some(body)).await?;
        Ok(self.decode::<Id>("injecting a fault", "faults", v)?.id)
    }

    /// Removes one fault rule.
    pub async fn remove_fault(&self, id: u64) -> Result<(), AdminError> {
        let path = format!("faults/{id}");
        self.call("removing a fault", reqwest::Method::DELETE, &path, None).await.map(drop)
    }

    /// Removes every fault rule (hung calls are released by closing their connections).
    pub async fn clear_faults(&self) -> Result<(), AdminError> {
        self.call("clearing faults", reqwest::Method::DELETE, "faults", None).await.map(drop)
    }

    /// Arms operation failures (`POST /__emulator/operation-failures`): the next `times`
    /// long-running operations the emulator starts on a target matching `target_glob` with a
    /// matching `action` (`ActionMatch::Any`, or an `asyncop::Action`) end failed with
    /// `message` after their pending time, in the cloud's own shape (ARM `Failed`, a GCE
    /// operation `DONE` with `error.errors[]`, Octavia `ERROR`, IBM `failed`). Returns the
    /// rule's id.
    pub async fn fail_operations(
        &self,
        target_glob: &str,
        action: impl Into<ActionMatch>,
        times: u64,
        message: &str,
    ) -> Result<u64, AdminError> {
        let rule = OperationFailure::new(target_glob, action, times, message);
        let body = serde_json::to_value(&rule).unwrap_or_default();
        let what = "arming operation failures";
        let v = self.call(what, reqwest::Method::POST, "operation-failures", Some(body)).await?;
        Ok(self.decode::<Id>(what, "operation-failures", v)?.id)
    }

    /// Disarms every operation failure (`DELETE /__emulator/operation-failures`); operations
    /// already started keep their fate.
    pub async fn clear_operation_failures(&self) -> Result<(), AdminError> {
        let what = "clearing operation failures";
        self.call(what, reqwest::Method::DELETE, "operation-failures", None).await.map(drop)
    }

    /// The armed operation failures (id, rule) with the failures each has left.
    pub async fn operation_failures(&self) -> Result<Vec<(u64, OperationFailure)>, AdminError> {
        let what = "reading operation failures";
        let v = self.call(what, reqwest::Method::GET, "operation-failures", None).await?;
        let items: Vec<serde_json::Value> = self.decode(what, "operation-failures", v)?;
        items
            .into_iter()
            .map(|mut item| {
                let id = item.get("id").and_then(serde_json::Value::as_u64).unwrap_or_default();
                if let Some(o) = item.as_object_mut() {
                    o.remove("id");
                }
                Ok((id, self.decode(what, "operation-failures", item)?))
            })
            .collect()
    }

    /// Selects the timing profile of long-running operations started from now on
    /// (`POST /__emulator/timing`): `fast` (the emulator's test values) or `realistic` (the
    /// cloud's real durations), every time multiplied by `scale` (0..=1000).
    pub async fn set_timing(&self, profile: TimingProfile, scale: f64) -> Result<(), AdminError> {
        let body = serde_json::json!({ "profile": profile, "scale": scale });
        self.call("setting the timing", reqwest::Method::POST, "timing", Some(body)).await.map(drop)
    }

    /// The timing selection now (`GET /__emulator/timing`).
    pub async fn timing(&self) -> Result<TimingSelection, AdminError> {
        Ok(self.timing_report().await?.selection())
    }

    /// The timing selection and the cloud's unscaled tables (`GET /__emulator/timing`).
    pub async fn timing_report(&self) -> Result<TimingReport, AdminError> {
        let v = self.call("reading the timing", reqwest::Method::GET, "timing", None).await?;
        self.decode("reading the timing", "timing", v)
    }

    /// Pauses the emulator: every call hangs or fails until [`Admin::resume`].
    pub async fn pause(&self, mode: PauseMode) -> Result<(), AdminError> {
        let body = serde_json::json!({ "mode": mode });
        self.call("pausing", reqwest::Method::POST, "pause", Some(body)).await.map(drop)
    }

    /// Ends a pause; calls that were hanging are served.
    pub async fn resume(&self) -> Result<(), AdminError> {
        self.call("resuming", reqwest::Method::POST, "resume", None).await.map(drop)
    }

    /// Clears faults, counters, the request log and a pause; an emulator also reloads its
    /// world.
    pub async fn reset(&self) -> Result<(), AdminError> {
        self.call("resetting", reqwest::Method::POST, "reset", None).await.map(drop)
    }

    /// The call counters.
    pub async fn counters(&self) -> Result<Counters, AdminError> {
        let v = self.call("reading counters", reqwest::Method::GET, "counters", None).await?;
        self.decode("reading counters", "counters", v)
    }

    /// The recent request log, oldest first.
    pub async fn requests(&self) -> Result<Vec<RequestRecord>, AdminError> {
        let v = self.call("reading requests", reqwest::Method::GET, "requests", None).await?;
        self.decode("reading requests", "requests", v)
    }

    /// The emulator's state (for the fault proxy: its rules, counters and pause).
    pub async fn state(&self) -> Result<serde_json::Value, AdminError> {
        self.call("reading state", reqwest::Method::GET, "state", None).await
    }

    /// One call of the cloud's own API on this emulator (not the admin API), as a test
    /// builds the world through it (e.g. a load balancer of "another cluster"): `method` as
    /// `GET`, `path` with the query string, `body` sent as given. Counted and faulted as any
    /// call.
    pub async fn cloud_call(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: Option<String>,
    ) -> Result<CloudReply, AdminError> {
        let url = format!("{}{path}", self.base);
        let method =
            reqwest::Method::from_bytes(method.as_bytes()).map_err(|e| AdminError::Refused {
                what: "calling the cloud API",
                url: url.clone(),
                status: 0,
                body: format!("bad method {method:?}: {e}"),
            })?;
        let mut req = self.http.request(method, &url);
        for (k, v) in headers {
            req = req.header(*k, *v);
        }
        if let Some(b) = body {
            req = req.body(b);
        }
        let http =
            |source| AdminError::Http { what: "calling the cloud API", url: url.clone(), source };
        let resp = req.send().await.map_err(http)?;
        let status = resp.status().as_u16();
        let headers = resp
            .headers()
            .iter()
            .filter_map(|(k, v)| Some((k.as_str().to_string(), v.to_str().ok()?.to_string())))
            .collect();
        let body = resp.text().await.map_err(http)?;
        Ok(CloudReply { status, headers, body })
    }
}

/// The answer of [`Admin::cloud_call`].
#[derive(Debug, Clone)]
pub struct CloudReply {
    /// The HTTP status.
    pub status: u16,
    /// The headers (names in lower case), in order.
    pub headers: Vec<(String, String)>,
    /// The body.
    pub body: String,
}

impl CloudReply {
    /// The first header named `name` (lower case).
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(k, _)| k == name).map(|(_, v)| v.as_str())
    }

    /// The body as JSON (`Null` when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_default()
    }
}
