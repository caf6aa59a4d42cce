//! Webhook hosting (KEP-2699, spec §9): a TLS listener on `--webhook-secure-port` (no
//! authn/authz, as upstream) serving `admission.k8s.io/v1` AdmissionReviews, on the same
//! hardened server as the secure port ([`serving::Limits::WEBHOOK`]: bodies up to 7 MiB).
//!
//! Served only when the `CloudControllerManagerWebhook` gate is on **and** `--webhooks` enables
//! at least one webhook and the port is not 0.
//!
//! Webhooks: the core's below, then the provider's
//! ([`Extensions::webhooks`](super::extensions::Extensions::webhooks)), selected by
//! `--webhooks` as controllers are (`*` enables all but the provider's disabled-by-default
//! ones; `-name` disables one); each answers at its own path.
//! - `persistentvolumelabel` at `/persistentvolumelabel`: on PersistentVolume CREATE, asks the
//!   provider's [`Zones`](crate::cloud::Zones) for the zone of the volume (by its volume ID:
//!   CSI `volumeHandle` or the in-tree source's ID) and patches the zone/region labels and, when
//!   absent, a matching node affinity. No Zones capability or no volume ID: allowed, no patch.
//!
//! QUIRK fixed: upstream does not record successful requests in
//! `cloud_provider_webhook_request_total`; here every request is recorded with its status code.

use std::sync::{Arc, Mutex};
use std::time::Instant;

use base64::Engine as _;
use futures::future::BoxFuture;
use http::{Request, Response, StatusCode};
use hyper::body::Bytes;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use super::extensions::Extensions;
use super::flags::Options;
use super::{ManagerError, selection, serving};
use crate::cloud::CloudProvider;
use crate::names;

/// The feature gate.
pub const GATE: &str = "CloudControllerManagerWebhook";

/// Known webhooks: (name, alias) pairs for `--webhooks`.
pub const KNOWN: &[(&str, &str)] = &[("persistentvolumelabel", "")];

/// A handler: the AdmissionRequest in, the AdmissionResponse (without `uid`) out.
pub type Handler = fn(Arc<dyn CloudProvider>, Value) -> BoxFuture<'static, Result<Value, String>>;

/// A registered webhook (the core's, or a provider's through
/// [`ExtraWebhook`](super::extensions::ExtraWebhook)).
#[derive(Debug, Clone, Copy)]
pub struct Webhook {
    /// Name in `--webhooks`.
    pub name: &'static str,
    /// URL path.
    pub path: &'static str,
    /// Handler.
    pub handler: Handler,
}

/// All webhooks of this core.
pub fn all() -> Vec<Webhook> {
    vec![Webhook {
        name: "persistentvolumelabel",
        path: "/persistentvolumelabel",
        handler: pv_label,
    }]
}

#[derive(Clone)]
pub(crate) struct WebhookMetrics {
    total: Family<Vec<(String, String)>, Counter>,
    duration: Family<Vec<(String, String)>, Histogram>,
}

impl WebhookMetrics {
    pub(crate) fn register(registry: &Mutex<Registry>) -> Self {
        let m = WebhookMetrics {
            total: Family::default(),
            duration: Family::new_with_constructor(|| {
                Histogram::new([0.25, 0.5, 0.7, 1.0, 1.5, 3.0, 5.0, 10.0])
            }),
        };
        let mut reg = registry.lock().unwrap_or_else(|p| p.into_inner());
        reg.register(
            "cloud_provider_webhook_request",
            "[ALPHA] Number of HTTP requests partitioned by status code.",
            m.total.clone(),
        );
        reg.register(
            "cloud_provider_webhook_request_duration_seconds",
            "[ALPHA] Response latency distribution in seconds for each webhook.",
            m.duration.clone(),
        );
        m
    }

    fn observe(&self, webhook: &str, code: StatusCode, started: Instant) {
        let labels = vec![
            ("code".to_string(), code.as_u16().to_string()),
            ("webhook".into(), webhook.into()),
        ];
        self.total.get_or_create(&labels).inc();
        self.duration.get_or_create(&labels).observe(started.elapsed().as_secs_f64());
    }
}

/// Starts the webhook listener if enabled, serving the core's and the provider's
/// (`extensions`) webhooks that `--webhooks` selects.
pub async fn start(
    options: &Options,
    extensions: &Extensions,
    cloud: Arc<dyn CloudProvider>,
    registry: Arc<Mutex<Registry>>,
    stop: CancellationToken,
) -> Result<(), ManagerError> {
    let flags = &options.flags;
    let off = extensions.webhooks_disabled_by_default();
    let enabled: Vec<Webhook> = extensions
        .all_webhooks()
        .into_iter()
        .filter(|w| selection::is_enabled(w.name, &off, &options.webhooks))
        .collect();
    if enabled.is_empty() || flags.webhook_secure_port == 0 {
        return Ok(());
    }
    if !options.feature_enabled(GATE) {
        tracing::warn!(
            "--webhooks is set but the {GATE} feature gate is off; not serving webhooks"
        );
        return Ok(());
    }
    let tls = serving::tls_config(
        &flags.webhook_tls_cert_file,
        &flags.webhook_tls_private_key_file,
        ("--webhook-tls-cert-file", "--webhook-tls-private-key-file"),
        &options.webhook_tls,
    )?;
    let addr = std::net::SocketAddr::new(flags.webhook_bind_address, flags.webhook_secure_port);
    let listener = serving::bind(addr).await?;
    let metrics = WebhookMetrics::register(&registry);
    let enabled = Arc::new(enabled);
    tracing::info!(%addr, webhooks = ?enabled.iter().map(|w| w.name).collect::<Vec<_>>(), "serving webhooks");
    let handler = move |req: Request<Bytes>, _peer| {
        let enabled = enabled.clone();
        let cloud = cloud.clone();
        let metrics = metrics.clone();
        let fut: BoxFuture<'static, Response<serving::Body>> = Box::pin(async move {
            let Some(w) = enabled.iter().find(|w| w.path == req.uri().path()).copied() else {
                return serving::text(StatusCode::NOT_FOUND, "404 page not found\n");
            };
            let started = Instant::now();
            let resp = handle(w, cloud, req).await;
            metrics.observe(w.name, resp.status(), started);
            resp
        });
        fut
    };
    tokio::spawn(serving::serve(
        listener,
        tls,
        serving::Limits::WEBHOOK,
        serving::admit_all,
        handler,
        stop,
    ));
    Ok(())
}

/// One AdmissionReview round trip (spec §9 request handling).
pub async fn handle(
    w: Webhook,
    cloud: Arc<dyn CloudProvider>,
    req: Request<Bytes>,
) -> Response<serving::Body> {
    let ct =
        req.headers().get(http::header::CONTENT_TYPE).and_then(|v| v.to_str().ok()).unwrap_or("");
    if ct != "application/json" {
        return serving::text(
            StatusCode::BAD_REQUEST,
            format!("Content-Type: {ct:?} should be \"application/json\""),
        );
    }
    if req.body().is_empty() {
        return serving::text(StatusCode::BAD_REQUEST, "admission request HTTP body is empty");
    }
    let review: Value = match serde_json::from_slice(req.body()) {
        Ok(v @ Value::Object(_)) => v,
        Ok(_) => {
            return serving::text(
                StatusCode::BAD_REQUEST,
                "admission review must be a JSON object",
            );
        }
        Err(e) => {
            return serving::text(
                StatusCode::BAD_REQUEST,
                format!("failed to decode admission review: {e}"),
            );
        }
    };
    if review.get("apiVersion").and_then(Value::as_str) != Some("admission.k8s.io/v1")
        || review.get("kind").and_then(Value::as_str) != Some("AdmissionReview")
    {
        return serving::text(
            StatusCode::BAD_REQUEST,
            "failed to decode admission review: expected apiVersion admission.k8s.io/v1, kind AdmissionReview",
        );
    }
    let Some(request) = review.get("request").filter(|r| !r.is_null()).cloned() else {
        return serving::text(
            StatusCode::BAD_REQUEST,
            "admission review can't be used: Request field is nil",
        );
    };
    let uid = request.get("uid").cloned().unwrap_or(Value::String(String::new()));
    let mut response = match (w.handler)(cloud, request).await {
        Ok(Value::Object(r)) => r,
        Ok(_) => {
            return serving::text(
                StatusCode::INTERNAL_SERVER_ERROR,
                "admission response cannot be nil",
            );
        }
        Err(e) => {
            return serving::text(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("error generating admission response: {e}"),
            );
        }
    };
    response.insert("uid".into(), uid);
    serving::json(
        StatusCode::OK,
        &json!({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": Value::Object(response)}),
    )
}

fn volume_id(pv: &Value) -> Option<String> {
    let spec = pv.get("spec")?;
    let pick = |source: &str, field: &str| {
        spec.get(source).and_then(|s| s.get(field)).and_then(Value::as_str).map(str::to_string)
    };
    pick("csi", "volumeHandle")
        .or_else(|| pick("awsElasticBlockStore", "volumeID"))
        .or_else(|| pick("gcePersistentDisk", "pdName"))
        .or_else(|| pick("azureDisk", "diskURI"))
        .or_else(|| pick("cinder", "volumeID"))
        .or_else(|| pick("vsphereVolume", "volumePath"))
        .filter(|s| !s.is_empty())
}

fn escape_pointer(s: &str) -> String {
    s.replace('~', "~0").replace('/', "~1")
}

fn pv_label(
    cloud: Arc<dyn CloudProvider>,
    request: Value,
) -> BoxFuture<'static, Result<Value, String>> {
    Box::pin(async move {
        let allowed = json!({"allowed": true});
        let is_pv =
            request.pointer("/kind/kind").and_then(Value::as_str) == Some("PersistentVolume");
        let is_create = request.get("operation").and_then(Value::as_str) == Some("CREATE");
        if !is_pv || !is_create {
            return Ok(allowed);
        }
        let pv = request.get("object").cloned().unwrap_or(Value::Null);
        let (Some(zones), Some(id)) = (cloud.zones(), volume_id(&pv)) else {
            return Ok(allowed);
        };
        let zone = zones
            .zone_by_provider_id(&id)
            .await
            .map_err(|e| format!("error querying the zone of volume {id:?}: {e}"))?;
        let mut labels = serde_json::Map::new();
        if !zone.failure_domain.is_empty() {
            labels.insert(names::LABEL_ZONE.into(), zone.failure_domain.clone().into());
        }
        if !zone.region.is_empty() {
            labels.insert(names::LABEL_REGION.into(), zone.region.clone().into());
        }
        if labels.is_empty() {
            return Ok(allowed);
        }
        let mut patch = Vec::new();
        match pv.pointer("/metadata/labels") {
            Some(Value::Object(_)) => {
                for (k, v) in &labels {
                    patch.push(json!({"op": "add", "path": format!("/metadata/labels/{}", escape_pointer(k)), "value": v}));
                }
            }
            _ => patch.push(json!({"op": "add", "path": "/metadata/labels", "value": Value::Object(labels.clone())})),
        }
        if pv.pointer("/spec/nodeAffinity/required").is_none() {
            let exprs: Vec<Value> = labels
                .iter()
                .map(|(k, v)| json!({"key": k, "operator": "In", "values": [v]}))
                .collect();
            patch.push(json!({"op": "add", "path": "/spec/nodeAffinity", "value": {"required": {"nodeSelectorTerms": [{"matchExpressions": exprs}]}}}));
        }
        let encoded =
            base64::engine::general_purpose::STANDARD.encode(Value::Array(patch).to_string());
        Ok(json!({"allowed": true, "patchType": "JSONPatch", "patch": encoded}))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::BodyExt;

    #[derive(Default)]
    struct NoCloud;
    impl CloudProvider for NoCloud {
        fn name(&self) -> &str {
            "none"
        }
    }

    async fn call(ct: &str, body: &str) -> (StatusCode, String) {
        let req = Request::builder()
            .uri("/persistentvolumelabel")
            .header("content-type", ct)
            .body(Bytes::from(body.to_string()))
            .unwrap();
        let r = handle(all()[0], Arc::new(NoCloud), req).await;
        let s = r.status();
        (s, String::from_utf8(r.into_body().collect().await.unwrap().to_bytes().to_vec()).unwrap())
    }

    #[tokio::test]
    async fn request_errors_match_upstream() {
        assert_eq!(
            call("text/plain", "{}").await.1,
            "Content-Type: \"text/plain\" should be \"application/json\""
        );
        assert_eq!(call("application/json", "").await.1, "admission request HTTP body is empty");
        let (s, b) = call(
            "application/json",
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview"}"#,
        )
        .await;
        assert_eq!(s, StatusCode::BAD_REQUEST);
        assert_eq!(b, "admission review can't be used: Request field is nil");
        let (s, b) = call(
            "application/json",
            r#"{"apiVersion":"admission.k8s.io/v1","kind":"AdmissionReview","request":{"uid":"u-1","operation":"CREATE","kind":{"group":"","version":"v1","kind":"Pod"}}}"#,
        )
        .await;
        assert_eq!(s, StatusCode::OK);
        let v: Value = serde_json::from_str(&b).unwrap();
        assert_eq!(v["response"]["uid"], "u-1");
        assert_eq!(v["response"]["allowed"], true);
    }
}
