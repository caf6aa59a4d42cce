//! The fault proxy: the kit's server (admin API, faults, pause, counters, request log) as a
//! reverse proxy in front of an emulator that is not ours — moto for AWS, vcsim for vSphere —
//! so those tests inject the same faults and count calls the same way as every other cloud.
//!
//! ```text
//!  provider ──HTTP(S)──▶ FaultProxy (classify: ec2:DescribeInstances, vim25:RetrievePropertiesEx)
//!                            │ faults / pause / counters
//!                            └──HTTP(S), pooled keep-alive──▶ moto / vcsim
//! ```
//!
//! The proxy serves the upstream's scheme: in front of vcsim (HTTPS with its own certificate)
//! it terminates TLS with a certificate from the testbed's CA ([`FaultProxy::ca_file`] for a
//! provider's `caFile`; `insecureFlag: true` works too) and re-originates TLS to vcsim.
//! Request bodies are read whole (they name the operation and are small); response bodies
//! stream through. The `Host` header is forwarded unchanged (it is part of AWS signatures).
//! An upstream that cannot be reached closes the client's connection unanswered, as an
//! unreachable cloud would.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderName, Request, Response, Uri, header};
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;

pub use url::Url;

use crate::admin::{Admin, Counters};
use crate::server::{
    Body, Cloud, Dropped, ErrorKind, ErrorReply, ServeFuture, Server, ServerError, ServerOptions,
};

/// How the proxy names calls and shapes error bodies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Protocol {
    /// AWS query and JSON protocols (moto): `<service>:<Action>`.
    AwsQuery,
    /// vSphere vim25 SOAP and CIS REST (vcsim): `vim25:<Method>`, `rest:<METHOD> <path>`.
    VimSoap,
}

impl Protocol {
    fn as_str(self) -> &'static str {
        match self {
            Protocol::AwsQuery => "aws-query",
            Protocol::VimSoap => "vim-soap",
        }
    }
}

/// Starting the proxy failed.
#[derive(Debug, thiserror::Error)]
pub enum ProxyError {
    /// The upstream URL is not usable.
    #[error("upstream {url}: {detail}")]
    Upstream {
        /// The URL.
        url: String,
        /// What is wrong.
        detail: String,
    },
    /// TLS set-up failed.
    #[error(transparent)]
    Tls(#[from] crate::tls::TlsError),
    /// The server failed to start.
    #[error(transparent)]
    Server(#[from] ServerError),
}

/// Options of a [`FaultProxy`] beyond upstream and protocol.
#[derive(Debug, Clone)]
pub struct ProxyBuilder {
    upstream: Url,
    protocol: Protocol,
    listen: SocketAddr,
    tls: Option<bool>,
    upstream_ca_pem: Option<String>,
}

impl ProxyBuilder {
    /// Where to listen (default `127.0.0.1:0`).
    pub fn listen(mut self, addr: SocketAddr) -> Self {
        self.listen = addr;
        self
    }

    /// Serve HTTPS (true) or HTTP (false); default: the upstream's scheme.
    pub fn tls(mut self, on: bool) -> Self {
        self.tls = Some(on);
        self
    }

    /// Verify an `https` upstream against this CA (default: accept the upstream's
    /// certificate, a loopback emulator's self-signed one).
    pub fn upstream_ca_pem(mut self, pem: impl Into<String>) -> Self {
        self.upstream_ca_pem = Some(pem.into());
        self
    }

    /// Starts the proxy. Must be called inside a Tokio runtime.
    pub async fn start(self) -> Result<FaultProxy, ProxyError> {
        let url = self.upstream.to_string();
        let bad = |detail: &str| ProxyError::Upstream { url: url.clone(), detail: detail.into() };
        let https = match self.upstream.scheme() {
            "http" => false,
            "https" => true,
            _ => return Err(bad("scheme must be http or https")),
        };
        let host = self.upstream.host_str().ok_or_else(|| bad("no host"))?.to_string();
        let port = self.upstream.port_or_known_default().ok_or_else(|| bad("no port"))?;
        let tls = if https {
            let config = crate::tls::upstream_client_config(self.upstream_ca_pem.as_deref())?;
            let name = rustls::pki_types::ServerName::try_from(
                host.trim_start_matches('[').trim_end_matches(']').to_string(),
            )
            .map_err(|e| bad(&format!("not a TLS server name: {e}")))?;
            Some((tokio_rustls::TlsConnector::from(Arc::new(config)), name))
        } else {
            None
        };
        let prefix = self.upstream.path().trim_end_matches('/').to_string();
        let upstream = Arc::new(Upstream {
            url: url.clone(),
            host,
            port,
            tls,
            prefix,
            idle: Mutex::new(Vec::new()),
        });
        let cloud = Arc::new(ProxyCloud { protocol: self.protocol, upstream });
        let opts = ServerOptions {
            listen: self.listen,
            tls: self.tls.unwrap_or(https),
            ..ServerOptions::default()
        };
        let server = Server::start(cloud, opts).await?;
        tracing::info!(url = %server.url(), upstream = %url, protocol = self.protocol.as_str(), "fault proxy started");
        Ok(FaultProxy { server })
    }
}

/// A running fault proxy; stopped when dropped.
#[derive(Debug)]
pub struct FaultProxy {
    server: Server,
}

impl FaultProxy {
    /// Starts a proxy on a free loopback port in front of `upstream` (e.g. moto's
    /// `http://127.0.0.1:5000` or vcsim's `https://127.0.0.1:8989`), serving the upstream's
    /// scheme.
    pub async fn start(upstream: Url, protocol: Protocol) -> Result<FaultProxy, ProxyError> {
        Self::builder(upstream, protocol).start().await
    }

    /// A proxy with more options.
    pub fn builder(upstream: Url, protocol: Protocol) -> ProxyBuilder {
        ProxyBuilder {
            upstream,
            protocol,
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            tls: None,
            upstream_ca_pem: None,
        }
    }

    /// What the provider is pointed at: `http://127.0.0.1:<port>` or `https://…` (no trailing
    /// slash).
    pub fn url(&self) -> String {
        self.server.url()
    }

    /// The loopback port.
    pub fn port(&self) -> u16 {
        self.server.addr().port()
    }

    /// A client of the proxy's admin API.
    pub fn admin(&self) -> Admin {
        self.server.admin()
    }

    /// The counters, read in-process (same as `admin().counters()`).
    pub fn counters(&self) -> Counters {
        self.server.counters()
    }

    /// PEM of the CA of the proxy's HTTPS certificate (None when serving HTTP).
    pub fn ca_pem(&self) -> Option<&str> {
        self.server.ca_pem()
    }

    /// [`FaultProxy::ca_pem`] as a file, for a provider's `caFile`.
    pub fn ca_file(&self) -> Option<&Path> {
        self.server.ca_file()
    }
}

type Sender = SendRequest<Full<Bytes>>;

/// The upstream and a pool of idle keep-alive connections to it.
struct Upstream {
    url: String,
    host: String,
    port: u16,
    tls: Option<(tokio_rustls::TlsConnector, rustls::pki_types::ServerName<'static>)>,
    prefix: String,
    idle: Mutex<Vec<Sender>>,
}

/// Idle upstream connections kept for reuse.
const MAX_IDLE: usize = 256;
/// Deadline for connecting (TCP and TLS) to the upstream.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(30);
/// Deadline for the upstream's response head (moto answering a 5000-instance describe on a
/// loaded machine can be slow; this only bounds a stuck upstream).
const RESPONSE_TIMEOUT: Duration = Duration::from_secs(300);

impl Upstream {
    async fn connect(&self) -> Result<Sender, String> {
        let tcp = tokio::time::timeout(
            CONNECT_TIMEOUT,
            tokio::net::TcpStream::connect((self.host.as_str(), self.port)),
        )
        .await
        .map_err(|_| format!("connecting to {}: timed out", self.url))?
        .map_err(|e| format!("connecting to {}: {e}", self.url))?;
        let _ = tcp.set_nodelay(true);
        match &self.tls {
            Some((connector, name)) => {
                let tls =
                    tokio::time::timeout(CONNECT_TIMEOUT, connector.connect(name.clone(), tcp))
                        .await
                        .map_err(|_| format!("TLS to {}: timed out", self.url))?
                        .map_err(|e| format!("TLS to {}: {e}", self.url))?;
                handshake(TokioIo::new(tls)).await
            }
            None => handshake(TokioIo::new(tcp)).await,
        }
    }

    fn take_idle(&self) -> Option<Sender> {
        let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
        while let Some(s) = idle.pop() {
            if s.is_ready() {
                return Some(s);
            }
        }
        None
    }

    fn put_idle(self: &Arc<Self>, mut sender: Sender) {
        let this = self.clone();
        // Ready again once the response body has been read to the end.
        tokio::spawn(async move {
            if sender.ready().await.is_ok() {
                let mut idle = this.idle.lock().unwrap_or_else(|p| p.into_inner());
                if idle.len() < MAX_IDLE {
                    idle.push(sender);
                }
            }
        });
    }

    async fn send(
        self: Arc<Self>,
        mut req: Request<Full<Bytes>>,
    ) -> Result<Response<Body>, String> {
        // A pooled connection the upstream closed meanwhile gives the request back: retry it
        // on a fresh connection.
        while let Some(mut sender) = self.take_idle() {
            match sender.try_send_request(req).await {
                Ok(resp) => return Ok(self.finish(sender, resp)),
                Err(mut e) => match e.take_message() {
                    Some(r) => req = r,
                    None => return Err(format!("{}: {}", self.url, e.into_error())),
                },
            }
        }
        let mut sender = self.connect().await?;
        match sender.try_send_request(req).await {
            Ok(resp) => Ok(self.finish(sender, resp)),
            Err(e) => Err(format!("{}: {}", self.url, e.into_error())),
        }
    }

    fn finish(
        self: &Arc<Self>,
        sender: Sender,
        resp: Response<hyper::body::Incoming>,
    ) -> Response<Body> {
        self.put_idle(sender);
        let (mut parts, body) = resp.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        Response::from_parts(
            parts,
            body.map_err(|e| -> crate::server::BoxError { Box::new(e) }).boxed_unsync(),
        )
    }
}

async fn handshake<I>(io: I) -> Result<Sender, String>
where
    I: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    tokio::spawn(async move {
        if let Err(e) = conn.await {
            tracing::debug!(error = %e, "fault proxy upstream connection ended");
        }
    });
    Ok(sender)
}

fn strip_hop_by_hop(headers: &mut http::HeaderMap) {
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::TE,
        header::TRAILER,
        header::UPGRADE,
        header::PROXY_AUTHORIZATION,
        header::PROXY_AUTHENTICATE,
        HeaderName::from_static("keep-alive"),
    ] {
        headers.remove(name);
    }
}

struct ProxyCloud {
    protocol: Protocol,
    upstream: Arc<Upstream>,
}

impl Cloud for ProxyCloud {
    fn name(&self) -> String {
        format!("proxy {}", self.protocol.as_str())
    }

    fn operation(&self, head: &http::request::Parts, body: &Bytes) -> String {
        match self.protocol {
            Protocol::AwsQuery => crate::aws::operation(head, body),
            Protocol::VimSoap => crate::vsphere::operation(head, body),
        }
    }

    fn error(&self, head: &http::request::Parts, _op: &str, kind: ErrorKind) -> ErrorReply {
        match self.protocol {
            Protocol::AwsQuery => crate::aws::error(head, kind),
            Protocol::VimSoap => crate::vsphere::error(head, kind),
        }
    }

    fn serve(&self, _op: String, req: Request<Bytes>) -> ServeFuture {
        let upstream = self.upstream.clone();
        Box::pin(async move {
            let (mut parts, body) = req.into_parts();
            let pq = parts.uri.path_and_query().map(|p| p.as_str()).unwrap_or("/");
            let uri = format!("{}{pq}", upstream.prefix);
            parts.uri = uri.parse::<Uri>().map_err(|e| Dropped(format!("bad URI {uri}: {e}")))?;
            strip_hop_by_hop(&mut parts.headers);
            parts.headers.insert(header::CONTENT_LENGTH, body.len().into());
            parts.version = http::Version::HTTP_11;
            let req = Request::from_parts(parts, Full::new(body));
            match tokio::time::timeout(RESPONSE_TIMEOUT, upstream.clone().send(req)).await {
                Ok(Ok(resp)) => Ok(resp),
                Ok(Err(e)) => {
                    tracing::debug!(error = %e, "fault proxy upstream failed");
                    Err(Dropped(e))
                }
                Err(_) => {
                    Err(Dropped(format!("{}: no answer in {RESPONSE_TIMEOUT:?}", upstream.url)))
                }
            }
        })
    }

    fn state(&self) -> serde_json::Value {
        serde_json::json!({ "upstream": self.upstream.url, "protocol": self.protocol.as_str() })
    }
}
