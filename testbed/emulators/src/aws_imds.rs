//! An EC2 instance metadata service (IMDSv2) for one instance, on the kit's server: what a
//! provider running on that instance reads at start (instance ID, region, zone, MAC, VPC,
//! addresses). Tests build the [`ImdsInstance`] from a moto instance.
//!
//! Only IMDSv2: `PUT /latest/api/token` with `X-aws-ec2-metadata-token-ttl-seconds` (1–21600)
//! returns a session token; every `GET` under `/latest/` must carry it in
//! `X-aws-ec2-metadata-token`, else `401`, as on EC2 with `HttpTokens=required`. Unknown paths
//! are `404`. Operation names (for faults and counters): `imds:GetToken` (the token `PUT`),
//! `imds:GetMetadata` (`GET /latest/meta-data/...`), `imds:GetDynamic`
//! (`GET /latest/dynamic/...`), `imds:Unknown` (anything else). Throttling is `429`, as EC2's
//! metadata service answers.
//!
//! Point the AWS SDK at it with `AWS_EC2_METADATA_SERVICE_ENDPOINT=<url>`.

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use serde::{Deserialize, Serialize};

use crate::server::{
    Cloud, ErrorKind, ErrorReply, ServeFuture, Server, ServerError, ServerOptions, full,
};

/// The token request header (its TTL in seconds).
pub const TTL_HEADER: &str = "x-aws-ec2-metadata-token-ttl-seconds";
/// The header carrying the session token on metadata requests.
pub const TOKEN_HEADER: &str = "x-aws-ec2-metadata-token";

/// The instance the metadata describes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImdsInstance {
    /// `instance-id`, e.g. `i-0123456789abcdef0`.
    pub instance_id: String,
    /// `placement/region`.
    pub region: String,
    /// `placement/availability-zone`.
    pub availability_zone: String,
    /// `instance-type`.
    pub instance_type: String,
    /// `mac` of the primary interface.
    pub mac: String,
    /// `network/interfaces/macs/<mac>/vpc-id`.
    pub vpc_id: String,
    /// `network/interfaces/macs/<mac>/subnet-id`.
    pub subnet_id: String,
    /// `local-ipv4`.
    pub local_ipv4: String,
    /// `local-hostname` (and `hostname`), the private DNS name.
    pub local_hostname: String,
}

impl ImdsInstance {
    /// The metadata tree: path under `/latest/meta-data/` → value.
    fn tree(&self) -> BTreeMap<String, String> {
        let mac = &self.mac;
        let mut t = BTreeMap::new();
        let mut put = |k: String, v: &str| {
            t.insert(k, v.to_string());
        };
        put("instance-id".into(), &self.instance_id);
        put("instance-type".into(), &self.instance_type);
        put("placement/region".into(), &self.region);
        put("placement/availability-zone".into(), &self.availability_zone);
        put("mac".into(), mac);
        put("local-ipv4".into(), &self.local_ipv4);
        put("local-hostname".into(), &self.local_hostname);
        put("hostname".into(), &self.local_hostname);
        put("network/interfaces/macs".into(), &format!("{mac}/"));
        put(format!("network/interfaces/macs/{mac}/vpc-id"), &self.vpc_id);
        put(format!("network/interfaces/macs/{mac}/subnet-id"), &self.subnet_id);
        put(format!("network/interfaces/macs/{mac}/local-ipv4s"), &self.local_ipv4);
        put(format!("network/interfaces/macs/{mac}/device-number"), "0");
        put(format!("network/interfaces/macs/{mac}/mac"), mac);
        t
    }

    /// The instance identity document (`/latest/dynamic/instance-identity/document`).
    fn identity_document(&self) -> String {
        serde_json::json!({
            "instanceId": self.instance_id,
            "region": self.region,
            "availabilityZone": self.availability_zone,
            "instanceType": self.instance_type,
            "privateIp": self.local_ipv4,
        })
        .to_string()
    }
}

/// The metadata service of one instance.
pub struct AwsImds {
    instance: ImdsInstance,
    tokens: Mutex<HashSet<String>>,
    issued: AtomicU64,
    rejected: AtomicU64,
}

impl std::fmt::Debug for AwsImds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsImds").field("instance", &self.instance.instance_id).finish()
    }
}

impl AwsImds {
    /// The service for `instance`.
    pub fn new(instance: ImdsInstance) -> Arc<AwsImds> {
        Arc::new(AwsImds {
            instance,
            tokens: Mutex::new(HashSet::new()),
            issued: AtomicU64::new(0),
            rejected: AtomicU64::new(0),
        })
    }

    /// Starts it on a free loopback port (plain HTTP, as EC2's).
    pub async fn start(instance: ImdsInstance) -> Result<(Server, Arc<AwsImds>), ServerError> {
        let imds = AwsImds::new(instance);
        let server = Server::start(imds.clone(), ServerOptions::default()).await?;
        Ok((server, imds))
    }

    /// Session tokens issued so far.
    pub fn tokens_issued(&self) -> u64 {
        self.issued.load(Ordering::Relaxed)
    }

    /// Metadata requests refused for a missing or unknown token so far.
    pub fn rejected(&self) -> u64 {
        self.rejected.load(Ordering::Relaxed)
    }

    fn tokens(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.tokens.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn issue(&self, req: &Request<Bytes>) -> Response<crate::server::Body> {
        let ttl = req
            .headers()
            .get(TTL_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u32>().ok())
            .filter(|t| (1..=21600).contains(t));
        let Some(ttl) = ttl else {
            return text(StatusCode::BAD_REQUEST, "");
        };
        let n = self.issued.fetch_add(1, Ordering::Relaxed) + 1;
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let token = format!("AQAEA-imds-emulator-{n}-{nanos:08x}");
        self.tokens().insert(token.clone());
        let mut r = text(StatusCode::OK, &token);
        r.headers_mut().insert(TTL_HEADER, HeaderValue::from(ttl));
        r
    }

    fn authorized(&self, req: &Request<Bytes>) -> bool {
        let token = req.headers().get(TOKEN_HEADER).and_then(|v| v.to_str().ok());
        token.is_some_and(|t| self.tokens().contains(t))
    }
}

fn text(status: StatusCode, body: &str) -> Response<crate::server::Body> {
    let mut r = Response::new(full(body.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("text/plain"));
    r
}

impl Cloud for AwsImds {
    fn name(&self) -> String {
        "aws-imds".into()
    }

    fn operation(&self, head: &http::request::Parts, _body: &Bytes) -> String {
        let path = head.uri.path();
        match head.method {
            Method::PUT if path == "/latest/api/token" => "imds:GetToken".into(),
            Method::GET if path.starts_with("/latest/meta-data") => "imds:GetMetadata".into(),
            Method::GET if path.starts_with("/latest/dynamic") => "imds:GetDynamic".into(),
            _ => "imds:Unknown".into(),
        }
    }

    fn error(&self, _head: &http::request::Parts, _op: &str, kind: ErrorKind) -> ErrorReply {
        let status = match kind {
            ErrorKind::Status(s) => s,
            ErrorKind::Throttle => 429,
            ErrorKind::Unavailable => 503,
        };
        ErrorReply { status, content_type: "text/plain", body: String::new() }
    }

    fn serve(&self, op: String, req: Request<Bytes>) -> ServeFuture {
        let resp = match op.as_str() {
            "imds:GetToken" => self.issue(&req),
            "imds:GetMetadata" | "imds:GetDynamic" if !self.authorized(&req) => {
                self.rejected.fetch_add(1, Ordering::Relaxed);
                text(StatusCode::UNAUTHORIZED, "")
            }
            "imds:GetMetadata" => {
                let key = req
                    .uri()
                    .path()
                    .trim_start_matches("/latest/meta-data")
                    .trim_matches('/')
                    .to_string();
                match self.instance.tree().get(&key) {
                    Some(v) => text(StatusCode::OK, v),
                    None => text(StatusCode::NOT_FOUND, ""),
                }
            }
            "imds:GetDynamic"
                if req.uri().path() == "/latest/dynamic/instance-identity/document" =>
            {
                let mut r = text(StatusCode::OK, &self.instance.identity_document());
                r.headers_mut()
                    .insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
                r
            }
            _ => text(StatusCode::NOT_FOUND, ""),
        };
        Box::pin(async move { Ok(resp) })
    }

    fn reset(&self) {
        self.tokens().clear();
    }

    fn state(&self) -> serde_json::Value {
        serde_json::json!({
            "instance": self.instance,
            "tokens_issued": self.tokens_issued(),
            "rejected": self.rejected(),
        })
    }
}
