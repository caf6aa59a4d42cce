//! HTTPS serving: TLS (from files or self-signed), a tiny HTTP/1.1 server, `/healthz` checks
//! and `/metrics` (spec §7.4).

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};

use http::{Request, Response, StatusCode, header};
use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper_util::rt::TokioIo;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

/// A response body.
pub type Body = Full<Bytes>;

/// Serving errors (fatal at start).
#[derive(Debug, thiserror::Error)]
pub enum ServingError {
    /// A certificate or key file could not be read.
    #[error("{flag}: cannot load {path:?}: {message}")]
    Pem {
        /// The flag that named the file.
        flag: &'static str,
        /// The file.
        path: String,
        /// What failed.
        message: String,
    },
    /// Building the TLS configuration failed.
    #[error("TLS configuration: {0}")]
    Tls(String),
    /// Binding the listener failed.
    #[error("failed to listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The error.
        #[source]
        source: std::io::Error,
    },
}

/// Builds a TLS server config from PEM files, or a self-signed certificate for `localhost` and
/// `127.0.0.1` when no files are given. `flags` names the cert and key flags for messages.
pub fn tls_config(
    cert_file: &str,
    key_file: &str,
    flags: (&'static str, &'static str),
) -> Result<Arc<rustls::ServerConfig>, ServingError> {
    let (certs, key) = if cert_file.is_empty() {
        let ck = rcgen::generate_simple_self_signed(vec![
            "localhost".to_string(),
            "127.0.0.1".to_string(),
        ])
        .map_err(|e| ServingError::Tls(format!("generating a self-signed certificate: {e}")))?;
        let key = PrivateKeyDer::try_from(ck.signing_key.serialize_der())
            .map_err(|e| ServingError::Tls(format!("self-signed key: {e}")))?;
        (vec![ck.cert.der().clone()], key)
    } else {
        let pem_err = |flag, path: &str, e: &dyn std::fmt::Display| ServingError::Pem {
            flag,
            path: path.to_string(),
            message: e.to_string(),
        };
        let certs: Vec<CertificateDer<'static>> =
            CertificateDer::pem_file_iter(Path::new(cert_file))
                .map_err(|e| pem_err(flags.0, cert_file, &e))?
                .collect::<Result<_, _>>()
                .map_err(|e| pem_err(flags.0, cert_file, &e))?;
        if certs.is_empty() {
            return Err(pem_err(flags.0, cert_file, &"no CERTIFICATE block found"));
        }
        let key = PrivateKeyDer::from_pem_file(Path::new(key_file))
            .map_err(|e| pem_err(flags.1, key_file, &e))?;
        (certs, key)
    };
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ServingError::Tls(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| ServingError::Tls(format!("certificate and key do not match: {e}")))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(cfg))
}

/// Binds `addr`.
pub async fn bind(addr: SocketAddr) -> Result<TcpListener, ServingError> {
    TcpListener::bind(addr).await.map_err(|source| ServingError::Bind { addr, source })
}

/// Serves HTTPS on `listener` with `handler` until `shutdown` fires.
pub async fn serve<H, F>(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    handler: H,
    shutdown: CancellationToken,
) where
    H: Fn(Request<Bytes>, SocketAddr) -> F + Clone + Send + Sync + 'static,
    F: Future<Output = Response<Body>> + Send + 'static,
{
    let acceptor = tokio_rustls::TlsAcceptor::from(tls);
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = listener.accept() => match r {
                Ok(x) => x,
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let handler = handler.clone();
        let shutdown = shutdown.clone();
        tokio::spawn(async move {
            let tls = match tokio::time::timeout(
                std::time::Duration::from_secs(10),
                acceptor.accept(stream),
            )
            .await
            {
                Ok(Ok(s)) => s,
                Ok(Err(e)) => {
                    tracing::debug!(%peer, error = %e, "TLS handshake failed");
                    return;
                }
                Err(_) => return,
            };
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let handler = handler.clone();
                async move {
                    let (parts, body) = req.into_parts();
                    let body = match http_body_util::Limited::new(body, 8 << 20).collect().await {
                        Ok(b) => b.to_bytes(),
                        Err(_) => {
                            return Ok::<_, Infallible>(text(
                                StatusCode::PAYLOAD_TOO_LARGE,
                                "request body too large\n",
                            ));
                        }
                    };
                    Ok(handler(Request::from_parts(parts, body), peer).await)
                }
            });
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(tls), service);
            futures::pin_mut!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = shutdown.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = tokio::time::timeout(std::time::Duration::from_secs(2), conn).await;
                }
            }
        });
    }
}

/// A plain-text response.
pub fn text(status: StatusCode, body: impl Into<String>) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.into())));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    r.headers_mut()
        .insert(header::X_CONTENT_TYPE_OPTIONS, header::HeaderValue::from_static("nosniff"));
    r
}

/// A JSON response.
pub fn json(status: StatusCode, body: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(body.to_string())));
    *r.status_mut() = status;
    r.headers_mut()
        .insert(header::CONTENT_TYPE, header::HeaderValue::from_static("application/json"));
    r
}

/// A named health check.
pub type Check = Arc<dyn Fn() -> Result<(), String> + Send + Sync>;

/// The `/healthz` checks (leader election, one ping per started controller).
#[derive(Clone, Default)]
pub struct Health {
    checks: Arc<Mutex<Vec<(String, Check)>>>,
}

impl Health {
    /// Adds (or replaces) a check.
    pub fn add(&self, name: &str, check: Check) {
        let mut checks = self.checks.lock().unwrap_or_else(|p| p.into_inner());
        checks.retain(|(n, _)| n != name);
        checks.push((name.to_string(), check));
    }

    /// Adds a check that always passes.
    pub fn add_ping(&self, name: &str) {
        self.add(name, Arc::new(|| Ok(())));
    }

    /// Names of the registered checks.
    pub fn names(&self) -> Vec<String> {
        self.checks
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(n, _)| n.clone())
            .collect()
    }

    /// Answers `/healthz` (all checks; `?verbose`, `?exclude=`) or `/healthz/<name>`.
    pub fn respond(&self, path: &str, query: Option<&str>) -> Response<Body> {
        let checks = self.checks.lock().unwrap_or_else(|p| p.into_inner()).clone();
        if let Some(name) = path.strip_prefix("/healthz/") {
            return match checks.iter().find(|(n, _)| n == name) {
                None => text(StatusCode::NOT_FOUND, "404 page not found\n"),
                Some((_, c)) => match c() {
                    Ok(()) => text(StatusCode::OK, "ok"),
                    Err(_) => text(
                        StatusCode::INTERNAL_SERVER_ERROR,
                        "internal server error: reason withheld\n",
                    ),
                },
            };
        }
        let mut verbose = false;
        let mut exclude = Vec::new();
        for pair in query.unwrap_or("").split('&').filter(|p| !p.is_empty()) {
            let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
            match k {
                "verbose" => verbose = true,
                "exclude" => exclude.extend(v.split(',').map(str::to_string)),
                _ => {}
            }
        }
        let mut lines = String::new();
        let mut failed = false;
        for (name, check) in &checks {
            if exclude.contains(name) {
                lines.push_str(&format!("[+]{name} excluded: ok\n"));
                continue;
            }
            match check() {
                Ok(()) => lines.push_str(&format!("[+]{name} ok\n")),
                Err(reason) => {
                    tracing::info!(check = %name, %reason, "healthz check failed");
                    failed = true;
                    lines.push_str(&format!("[-]{name} failed: reason withheld\n"));
                }
            }
        }
        if failed {
            lines.push_str("healthz check failed\n");
            return text(StatusCode::INTERNAL_SERVER_ERROR, lines);
        }
        if verbose {
            lines.push_str("healthz check passed\n");
            return text(StatusCode::OK, lines);
        }
        text(StatusCode::OK, "ok")
    }
}

/// Encodes the registry as text (OpenMetrics text, which Prometheus scrapes).
pub fn metrics_response(registry: &Mutex<prometheus_client::registry::Registry>) -> Response<Body> {
    let mut out = String::new();
    let reg = registry.lock().unwrap_or_else(|p| p.into_inner());
    if let Err(e) = prometheus_client::encoding::text::encode(&mut out, &reg) {
        return text(StatusCode::INTERNAL_SERVER_ERROR, format!("encoding metrics: {e}\n"));
    }
    let mut r = Response::new(Full::new(Bytes::from(out)));
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static(
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        ),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    async fn body(r: Response<Body>) -> (StatusCode, String) {
        let status = r.status();
        let b = r.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8(b.to_vec()).unwrap())
    }

    #[tokio::test]
    async fn healthz_formats_like_the_apiserver() {
        let h = Health::default();
        h.add_ping("cloud-node-controller");
        assert_eq!(body(h.respond("/healthz", None)).await, (StatusCode::OK, "ok".into()));
        let (s, b) = body(h.respond("/healthz", Some("verbose"))).await;
        assert_eq!(s, StatusCode::OK);
        assert_eq!(b, "[+]cloud-node-controller ok\nhealthz check passed\n");
        h.add("leaderElection", Arc::new(|| Err("lease expired".into())));
        let (s, b) = body(h.respond("/healthz", None)).await;
        assert_eq!(s, StatusCode::INTERNAL_SERVER_ERROR);
        assert!(b.contains("[-]leaderElection failed: reason withheld\n"), "{b}");
        assert!(!b.contains("lease expired"), "reasons are withheld");
        let (s, _) = body(h.respond("/healthz", Some("exclude=leaderElection"))).await;
        assert_eq!(s, StatusCode::OK);
        let (s, _) = body(h.respond("/healthz/cloud-node-controller", None)).await;
        assert_eq!(s, StatusCode::OK);
        let (s, _) = body(h.respond("/healthz/nope", None)).await;
        assert_eq!(s, StatusCode::NOT_FOUND);
    }

    #[test]
    fn self_signed_and_bad_files() {
        assert!(tls_config("", "", ("--tls-cert-file", "--tls-private-key-file")).is_ok());
        let err = tls_config(
            "/nonexistent/cert.pem",
            "/nonexistent/key.pem",
            ("--tls-cert-file", "--tls-private-key-file"),
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("--tls-cert-file") && err.contains("/nonexistent/cert.pem"), "{err}");
    }
}
