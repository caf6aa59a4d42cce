//! A moto server per test (or per demo): `moto_server` (the AWS emulator from PyPI, installed
//! in a virtualenv by `ci/install-tools`) on a free loopback port.
//!
//! The server runs under a small `sh` supervisor that reads a pipe from this process: when
//! the test ends, panics, or the process is killed (SIGKILL included), the pipe closes and
//! the supervisor stops moto. [`Moto`]'s `Drop` stops it too.
//!
//! Only the process lives here; fixtures that speak the AWS APIs (VPCs, instances) are in the
//! AWS provider crate (`ccm_provider_aws::testing`), so this crate needs no AWS SDK.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// Kills moto when the pipe from this process closes; exits when moto exits.
const SUPERVISOR: &str = r#"
exec 3<&0
"$1" -H 127.0.0.1 -p "$2" >"$3" 2>&1 </dev/null 3<&- & m=$!
( read -r _line <&3; kill -TERM $m 2>/dev/null ) &
exec 3<&-
wait $m
"#;

/// Starting or talking to moto failed.
#[derive(Debug, thiserror::Error)]
pub enum MotoError {
    /// `moto_server` is not installed.
    #[error("moto_server is not installed at {0}: run ci/install-tools (or set CCM_MOTO_SERVER)")]
    NotInstalled(PathBuf),
    /// The installer could not be asked where moto is.
    #[error("running {path}: {source}")]
    Installer {
        /// The installer script.
        path: PathBuf,
        /// Why it failed.
        source: std::io::Error,
    },
    /// Spawning the server or talking to it failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// Why it failed.
        source: std::io::Error,
    },
    /// The server exited while starting (after the retries a lost port race gets); the end
    /// of its log is included.
    #[error(
        "moto_server exited during start-up on port {port} (attempt {attempt}); the end of its log:\n{tail}"
    )]
    Exited {
        /// The port it was started on.
        port: u16,
        /// Which attempt this was (1-based).
        attempt: u32,
        /// The last lines of its output.
        tail: String,
    },
    /// The server did not answer; its log is included.
    #[error("moto_server did not come up on port {port}; log:\n{log}")]
    NotReady {
        /// The port it was started on.
        port: u16,
        /// The server's output.
        log: String,
    },
    /// A control request (`/moto-api/...`) was refused.
    #[error("moto control request {path} failed: {response}")]
    Control {
        /// The request path.
        path: String,
        /// The raw answer.
        response: String,
    },
}

fn io(what: &'static str) -> impl FnOnce(std::io::Error) -> MotoError {
    move |source| MotoError::Io { what, source }
}

/// Where `moto_server` is: `$CCM_MOTO_SERVER`, or where `ci/install-tools` put it.
pub fn server_path() -> Result<PathBuf, MotoError> {
    if let Some(p) = std::env::var_os("CCM_MOTO_SERVER") {
        return Ok(PathBuf::from(p));
    }
    let installer = Path::new(env!("CARGO_MANIFEST_DIR")).join("../ci/install-tools");
    let out = Command::new(&installer)
        .arg("--print-moto")
        .output()
        .map_err(|source| MotoError::Installer { path: installer.clone(), source })?;
    let path = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    if !path.is_file() || path.file_name().is_none_or(|n| n != "moto_server") {
        return Err(MotoError::NotInstalled(path));
    }
    Ok(path)
}

/// A running moto server; stopped on drop.
#[derive(Debug)]
pub struct Moto {
    /// `http://127.0.0.1:<port>`: the endpoint for every AWS service.
    pub url: String,
    /// The loopback port.
    pub port: u16,
    child: Option<(Child, ChildStdin)>,
    log: PathBuf,
}

fn free_port() -> Result<u16, MotoError> {
    crate::free_port().map_err(|e| MotoError::Io {
        what: "finding a free port",
        source: std::io::Error::other(e.to_string()),
    })
}

async fn http(port: u16, method: &str, path: &str) -> std::io::Result<String> {
    let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
    let req =
        format!("{method} {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 0\r\n\r\n");
    s.write_all(req.as_bytes()).await?;
    let mut out = String::new();
    s.read_to_string(&mut out).await?;
    Ok(out)
}

/// Moto loads a service's backend on that service's first request: seconds of Python imports
/// (13 s measured on a busy 2-core machine), which would land on a test's first EC2 call and
/// could run into the SDK's per-attempt or per-operation timeout (the AWS tests' assume-role
/// and throttling calls did, when ci/test's lanes loaded the machine). One EC2 request
/// (`DescribeRegions`, unsigned: moto reads the service from the credential scope and checks
/// no signature) loads it before the server is handed out. Best effort: a failure here shows
/// again, with its cause, on the test's own first call.
async fn warm_up_ec2(port: u16) {
    let body = "Action=DescribeRegions&Version=2016-11-15";
    let req = format!(
        "POST / HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\n\
         Authorization: AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/ec2/aws4_request, SignedHeaders=host, Signature=0\r\n\
         Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    let call = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(req.as_bytes()).await?;
        let mut out = String::new();
        s.read_to_string(&mut out).await?;
        Ok::<_, std::io::Error>(out)
    };
    match tokio::time::timeout(Duration::from_secs(120), call).await {
        Ok(Ok(r)) if r.contains(" 200 ") => {}
        Ok(Ok(r)) => eprintln!(
            "ccm-testbed: moto's EC2 warm-up was answered {:?}",
            r.lines().next().unwrap_or_default()
        ),
        Ok(Err(e)) => eprintln!("ccm-testbed: moto's EC2 warm-up failed: {e}"),
        Err(_) => eprintln!("ccm-testbed: moto's EC2 warm-up took over 120 s"),
    }
}

impl Moto {
    /// Starts a moto server on a free port and waits until it answers.
    pub async fn start() -> Result<Moto, MotoError> {
        Self::start_with_port(None).await
    }

    /// Like [`Moto::start`], but the first attempt uses `port` when given (a test holds it to
    /// lose the port race). A server that exits during start-up is reported at once with the
    /// end of its log; one that exited because its port was taken meanwhile is started again
    /// on a fresh port, up to [`crate::START_ATTEMPTS`] times.
    pub async fn start_with_port(port: Option<u16>) -> Result<Moto, MotoError> {
        Self::start_with_server(&server_path()?, port).await
    }

    /// Like [`Moto::start_with_port`], with this `moto_server` executable.
    pub async fn start_with_server(bin: &Path, port: Option<u16>) -> Result<Moto, MotoError> {
        let mut attempt = 1;
        loop {
            let port = match port.filter(|_| attempt == 1) {
                Some(p) => p,
                None => free_port()?,
            };
            match Self::start_once(bin, port, attempt).await {
                Err(MotoError::Exited { tail, .. })
                    if crate::log_says_port_taken(&tail) && attempt < crate::START_ATTEMPTS =>
                {
                    eprintln!(
                        "ccm-testbed: moto_server lost port {port} (attempt {attempt}); retrying on a fresh port"
                    );
                    attempt += 1;
                }
                other => return other,
            }
        }
    }

    async fn start_once(bin: &Path, port: u16, attempt: u32) -> Result<Moto, MotoError> {
        let log = std::env::temp_dir().join(format!("ccm-moto-{}-{port}.log", std::process::id()));
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(SUPERVISOR)
            .arg("ccm-moto-supervisor")
            .arg(bin)
            .arg(port.to_string())
            .arg(&log)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(io("spawning the moto supervisor (sh)"))?;
        let stdin = child.stdin.take().ok_or_else(|| MotoError::Io {
            what: "taking the supervisor's stdin",
            source: std::io::Error::other("no pipe"),
        })?;
        let mut moto = Moto {
            url: format!("http://127.0.0.1:{port}"),
            port,
            child: Some((child, stdin)),
            log,
        };
        // Python start-up on a busy machine can take a while; a readiness wait, not a
        // timing claim.
        for _ in 0..600 {
            // The supervisor exits early only when moto did (a crash or a taken port).
            if let Some((c, _)) = moto.child.as_mut()
                && !matches!(c.try_wait(), Ok(None))
            {
                let text = std::fs::read_to_string(&moto.log).unwrap_or_default();
                return Err(MotoError::Exited {
                    port,
                    attempt,
                    tail: crate::tail_lines(&text, 20),
                });
            }
            // Bounded: a port held by another process may accept and never answer.
            let probe = http(port, "GET", "/moto-api/data.json");
            if let Ok(Ok(r)) = tokio::time::timeout(Duration::from_secs(5), probe).await
                && r.starts_with("HTTP/1.")
                && r.contains(" 200 ")
            {
                warm_up_ec2(port).await;
                return Ok(moto);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let log = std::fs::read_to_string(&moto.log).unwrap_or_default();
        Err(MotoError::NotReady { port, log })
    }

    /// Forgets every resource.
    pub async fn reset(&self) -> Result<(), MotoError> {
        let path = "/moto-api/reset";
        let r = http(self.port, "POST", path).await.map_err(io("resetting moto"))?;
        if !r.contains(" 200 ") {
            return Err(MotoError::Control { path: path.into(), response: r });
        }
        Ok(())
    }

    /// The server's log file (requests and errors).
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}

impl Drop for Moto {
    fn drop(&mut self) {
        if let Some((mut child, mut stdin)) = self.child.take() {
            let _ = stdin.write_all(b"stop\n");
            drop(stdin);
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.log);
    }
}
