//! What every end-to-end test of a binary needs: a control plane, the manager as a process
//! with its log in a file, polling with a deadline, readers for the Node fields the
//! cloud-node controller sets, and the secret scanner.
//!
//! Secret scanner (issue #11): every credential a test gives a process is registered
//! ([`register_secret`]) and every process's output is scanned for all of them; a match fails
//! the test naming the process and the kind of credential, never the value. Registration and
//! scanning are built into the helpers so a test cannot forget them: [`Env::spawn_ccm`] and
//! [`Binary::run_to_exit`] register the cloud config's passwords and the kubeconfig's client
//! key; [`Binary::command`] replaces the AWS secret key with a distinctive one and adds a
//! session token (both registered; moto accepts any); the manager's stdout and stderr are
//! scanned when its [`Ccm`] guard is dropped, `run_to_exit`'s before it returns. Processes
//! run by other means call [`assert_no_secrets`] on their output. `CCM_E2E_V=10` runs every
//! manager of every end-to-end test at `-v=10` (and so scans the most verbose output).

use std::future::Future;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Mutex;
use std::time::Duration;

use ccm_core::names;
use ccm_testbed::fixtures::kubelet_node;
use ccm_testbed::{ControlPlane, Identity};
use k8s_openapi::api::core::v1::Node;
use kube::api::PostParams;
use kube::{Api, Client};
use tokio::process::{Child, Command};

// ---- secret scanner ------------------------------------------------------------------------

/// A kind of credential given to a process under test (named in failures; values never are).
// A build with one provider's feature uses only that provider's kinds.
#[allow(dead_code)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SecretKind {
    /// `AWS_SECRET_ACCESS_KEY`.
    AwsSecretAccessKey,
    /// `AWS_SESSION_TOKEN`.
    AwsSessionToken,
    /// A vCenter password (cloud config, Secret files, `VSPHERE_PASSWORD`).
    VspherePassword,
    /// A bearer token (a kubeconfig token, a registry token a plugin minted).
    BearerToken,
    /// The private key of a kubeconfig client certificate.
    ClientKey,
    /// An IBM Cloud API key (the `g2Credentials` file).
    IbmApiKey,
    /// An OpenStack password or application-credential secret (`cloud.conf`).
    OpenStackPassword,
    /// A Google OAuth access token (metadata server, `token-url`) or a `token-body`.
    GoogleToken,
    /// An Azure service principal's client secret (`aadClientSecret`) or an AAD / ACR token.
    AzureSecret,
}

static SECRETS: Mutex<Vec<(SecretKind, String)>> = Mutex::new(Vec::new());

/// The distinctive AWS secret key every AWS process under test gets (moto accepts any).
pub const AWS_SECRET_ACCESS_KEY: &str = "e2eAwsSecretKey/NeverLogged+7Hq2ZpR4";
/// The AWS session token every AWS process under test gets (moto accepts any).
pub const AWS_SESSION_TOKEN: &str = "e2eAwsSessionToken/NeverLogged+Xk93LwQ8";

/// Registers a credential given to a process under test: every scan from now on fails on
/// it. Short values are refused: they would match by chance (use a distinctive value).
pub fn register_secret(kind: SecretKind, value: &str) {
    let value = value.trim();
    assert!(
        value.len() >= 12,
        "test credential ({kind:?}) is too short to scan for: use a distinctive value of at least 12 characters"
    );
    let mut secrets = SECRETS.lock().unwrap_or_else(|e| e.into_inner());
    if !secrets.iter().any(|(_, v)| v == value) {
        secrets.push((kind, value.to_string()));
    }
}

/// The kinds of registered credentials that occur in `text`.
pub fn secrets_in(text: &str) -> Vec<SecretKind> {
    let secrets = SECRETS.lock().unwrap_or_else(|e| e.into_inner());
    let mut found: Vec<SecretKind> = Vec::new();
    for (kind, value) in secrets.iter() {
        if written_forms(value).iter().any(|form| text.contains(form.as_str()))
            && !found.contains(kind)
        {
            found.push(*kind);
        }
    }
    found
}

/// The ways a log can write `value`: as is, quoted Go-style (klog's text format quotes values
/// as `%q`) and JSON-escaped (`--logging-format=json`). The escaped forms differ from the
/// value only when it holds a quote, a backslash or a control character; each is searched for
/// without its surrounding quotes, so a secret inside a longer logged value is found too.
fn written_forms(value: &str) -> Vec<String> {
    let json = serde_json::to_string(value).unwrap_or_default();
    let json = json.trim_start_matches('"').trim_end_matches('"').to_string();
    let go = go_quote(value);
    let mut forms = vec![value.to_string()];
    for form in [json, go] {
        if !form.is_empty() && !forms.contains(&form) {
            forms.push(form);
        }
    }
    forms
}

/// `value` as Go's `strconv.Quote` writes it, without the surrounding quotes.
fn go_quote(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\u{b}' => out.push_str("\\v"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c => out.push(c),
        }
    }
    out
}

/// The kind of every registered credential, in registration order.
pub fn registered_kinds() -> Vec<SecretKind> {
    SECRETS.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(k, _)| *k).collect()
}

/// Fails (naming `process` and the kinds, never the values) if `output` holds a registered
/// credential.
pub fn assert_no_secrets(process: &str, output: &str) {
    let found = secrets_in(output);
    assert!(
        found.is_empty(),
        "{process} wrote test credentials to its output or log: {found:?} (values not shown)"
    );
}

/// [`assert_no_secrets`] on a finished process's stdout and stderr.
#[allow(dead_code)]
pub fn assert_output_has_no_secrets(process: &str, out: &std::process::Output) {
    assert_no_secrets(&format!("{process} (stdout)"), &String::from_utf8_lossy(&out.stdout));
    assert_no_secrets(&format!("{process} (stderr)"), &String::from_utf8_lossy(&out.stderr));
}

/// Registers the passwords a cloud config holds (`password: x`, `password = x`, any case).
pub fn register_config_secrets(cloud_config: &str) {
    for line in cloud_config.lines() {
        let line = line.trim_start().trim_start_matches(['{', ' ']);
        let Some((key, value)) = line.split_once([':', '=']) else { continue };
        if !key.trim().eq_ignore_ascii_case("password") {
            continue;
        }
        let value = value.split(['}', ',']).next().unwrap_or_default().trim();
        let value = value.trim_matches(|c| c == '"' || c == '\'');
        if !value.is_empty() {
            register_secret(SecretKind::VspherePassword, value);
        }
    }
}

/// Registers the credentials of a kubeconfig written for a process: client key (as written
/// and a line of the decoded PEM) and bearer tokens.
pub fn register_kubeconfig_secrets(path: &Path) {
    let text = std::fs::read_to_string(path).unwrap();
    let doc: serde_json::Value = serde_json::from_str(&text).unwrap();
    for user in doc["users"].as_array().into_iter().flatten() {
        let user = &user["user"];
        if let Some(token) = user["token"].as_str() {
            register_secret(SecretKind::BearerToken, token);
        }
        if let Some(key) = user["client-key-data"].as_str() {
            register_secret(SecretKind::ClientKey, key);
            let pem = String::from_utf8_lossy(&base64_decode(key)).into_owned();
            if let Some(line) =
                pem.lines().filter(|l| !l.starts_with("-----")).max_by_key(|l| l.len())
                && line.len() >= 12
            {
                register_secret(SecretKind::ClientKey, line);
            }
        }
    }
}

/// Standard base64 (padding and whitespace ignored).
fn base64_decode(text: &str) -> Vec<u8> {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = Vec::new();
    let (mut acc, mut bits) = (0u32, 0);
    for c in text.bytes() {
        let Some(v) = ALPHABET.iter().position(|&a| a == c) else { continue };
        acc = (acc << 6) | v as u32;
        bits += 6;
        if bits >= 8 {
            bits -= 8;
            out.push((acc >> bits) as u8);
            acc &= (1 << bits) - 1;
        }
    }
    out
}

/// A running manager with its stdout and stderr in a file; killed on drop, and then its
/// output is scanned for every registered credential (the test fails on a match).
pub struct Ccm {
    child: Child,
    log: PathBuf,
    name: String,
}

impl Drop for Ccm {
    fn drop(&mut self) {
        // Bearer tokens the manager minted for itself (`--use-service-account-credentials`
        // writes them to `$TMPDIR/ccm-sa-tokens-<pid>/`) are credentials too.
        if let Some(pid) = self.child.id() {
            let dir = std::env::temp_dir().join(format!("ccm-sa-tokens-{pid}"));
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                if let Ok(token) = std::fs::read_to_string(entry.path())
                    && token.trim().len() >= 12
                {
                    register_secret(SecretKind::BearerToken, &token);
                }
            }
        }
        let _ = self.child.start_kill();
        if !std::thread::panicking() {
            // A missing log file (its directory removed first) would make the scan pass
            // on nothing: that is a defect of the test, not a clean log.
            let logs = match std::fs::read_to_string(&self.log) {
                Ok(logs) => logs,
                Err(e) => {
                    panic!("secret scan of {}: cannot read {}: {e}", self.name, self.log.display())
                }
            };
            let kinds = registered_kinds();
            eprintln!(
                "secret scan: {} output, {} bytes, {} credentials registered ({kinds:?})",
                self.name,
                logs.len(),
                kinds.len()
            );
            assert_no_secrets(&self.name, &logs);
        }
    }
}

impl Ccm {
    /// How the manager ended, if it has (a crash, an exit on its own).
    #[allow(dead_code)]
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    pub fn logs(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until `needle` occurs at least `count` times in the log.
    #[allow(dead_code)]
    pub async fn wait_for_log(&self, needle: &str, count: usize) {
        wait_for(&format!("{count} × {needle:?} in the manager log"), || async {
            (self.logs().matches(needle).count() >= count).then_some(())
        })
        .await;
    }
}

/// The binary of one provider: its path, `--cloud-provider` name and the environment it runs
/// with (nothing of the caller's cloud credentials leaks in).
#[derive(Clone, Copy)]
pub struct Binary {
    pub path: &'static str,
    pub provider: &'static str,
    /// Environment variables removed (by prefix) from the caller's.
    pub clear_prefixes: &'static [&'static str],
    /// Environment variables set.
    pub env: &'static [(&'static str, &'static str)],
}

/// `cloud-controller-manager-aws` against moto. The default credential chain finds moto's
/// static keys in the environment; nothing of the caller's AWS setup (profiles, roles,
/// endpoints) leaks in. The secret key is replaced by the scanner's distinctive one (and a
/// session token added) by [`Binary::command`].
#[cfg(all(feature = "provider-aws", feature = "testing"))]
pub const AWS_BIN: Binary = Binary {
    path: env!("CARGO_BIN_EXE_cloud-controller-manager-aws"),
    provider: "aws",
    clear_prefixes: &["AWS_"],
    env: &[
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", "testing"),
        ("AWS_EC2_METADATA_DISABLED", "true"),
        ("AWS_CONFIG_FILE", "/dev/null"),
        ("AWS_SHARED_CREDENTIALS_FILE", "/dev/null"),
    ],
};

impl Binary {
    /// The binary with a clean environment and these arguments.
    pub fn command(&self, args: &[String]) -> Command {
        let mut cmd = Command::new(self.path);
        for (k, _) in std::env::vars_os() {
            let k_str = k.to_string_lossy();
            if self.clear_prefixes.iter().any(|p| k_str.starts_with(p)) {
                cmd.env_remove(&k);
            }
        }
        // `-v` given: the verbosity decides (RUST_LOG would override it). `CCM_E2E_V=<n>`
        // runs every manager of every end-to-end test at `-v=<n>` (issue #21: the secret scan
        // at the most verbose level, `CCM_E2E_V=10`).
        let forced = std::env::var("CCM_E2E_V").ok().filter(|v| !v.is_empty());
        if args.iter().any(|a| a.starts_with("-v=") || a.starts_with("--v=")) {
            cmd.env_remove("RUST_LOG");
        } else if let Some(v) = forced {
            cmd.env_remove("RUST_LOG").arg(format!("-v={v}"));
        } else {
            cmd.env("RUST_LOG", "info");
        }
        cmd.env_remove("SKIP_NODE_DELETION")
            .envs(self.env.iter().copied())
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
        if self.env.iter().any(|(k, _)| *k == "AWS_SECRET_ACCESS_KEY") {
            cmd.envs(aws_test_credentials());
        }
        cmd
    }

    /// The process name used in scanner failures.
    pub fn name(&self) -> &'static str {
        Path::new(self.path).file_name().and_then(|n| n.to_str()).unwrap_or(self.path)
    }

    /// Runs the binary with this cloud config until it exits (it must fail at start): (exit
    /// code, stderr). Its output is scanned for the config's passwords.
    pub async fn run_to_exit(&self, dir: &Path, cloud_config: &str) -> (Option<i32>, String) {
        self.run_to_exit_with(dir, cloud_config, &[]).await
    }

    /// [`Self::run_to_exit`] with extra arguments (e.g. `-v=10`).
    pub async fn run_to_exit_with(
        &self,
        dir: &Path,
        cloud_config: &str,
        extra: &[String],
    ) -> (Option<i32>, String) {
        register_config_secrets(cloud_config);
        let config = dir.join("cloud.conf");
        std::fs::write(&config, cloud_config).unwrap();
        let mut args = vec![
            format!("--cloud-provider={}", self.provider),
            format!("--cloud-config={}", config.display()),
            format!("--kubeconfig={}", dir.join("no-such.kubeconfig").display()),
            "--leader-elect=false".into(),
            "--secure-port=0".into(),
            "--webhook-secure-port=0".into(),
        ];
        args.extend(extra.iter().cloned());
        let child =
            self.command(&args).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let out = tokio::time::timeout(Duration::from_secs(60), child.wait_with_output())
            .await
            .expect("the manager exits at start")
            .unwrap();
        assert_output_has_no_secrets(self.name(), &out);
        (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// The AWS credentials of every AWS process under test (registered with the scanner): moto's
/// access key ID `testing`, a distinctive secret key and a session token.
pub fn aws_test_credentials() -> [(&'static str, &'static str); 3] {
    register_secret(SecretKind::AwsSecretAccessKey, AWS_SECRET_ACCESS_KEY);
    register_secret(SecretKind::AwsSessionToken, AWS_SESSION_TOKEN);
    [
        ("AWS_ACCESS_KEY_ID", "testing"),
        ("AWS_SECRET_ACCESS_KEY", AWS_SECRET_ACCESS_KEY),
        ("AWS_SESSION_TOKEN", AWS_SESSION_TOKEN),
    ]
}

/// Everything one test needs: a control plane, an admin client, a scratch directory (the
/// cloud config and the manager log), removed when the test passes and kept when it fails.
pub struct Env {
    pub cp: ControlPlane,
    pub client: Client,
    pub dir: PathBuf,
    bin: Binary,
}

impl Env {
    pub async fn start(bin: Binary) -> Env {
        let cp = ControlPlane::start().await.expect("control plane starts");
        let client = cp.admin_client().await.expect("admin client");
        let dir = std::env::temp_dir()
            .join(format!("ccm-{}-e2e", bin.provider))
            .join(ccm_testbed::unique_name("test"));
        std::fs::create_dir_all(&dir).unwrap();
        Env { cp, client, dir, bin }
    }

    pub fn nodes(&self) -> Api<Node> {
        Api::all(self.client.clone())
    }

    /// Starts the manager with this cloud config, the admin kubeconfig, all controllers and
    /// a 1 s node monitor period; no leader election and no serving unless `extra` says so.
    pub fn spawn_ccm(&self, cloud_config: &str, extra: &[String]) -> Ccm {
        self.spawn_ccm_with_env(cloud_config, extra, &[])
    }

    /// [`Self::spawn_ccm`] with environment variables that depend on the test (e.g. the
    /// emulated GCE metadata server's `GCE_METADATA_HOST`).
    pub fn spawn_ccm_with_env(
        &self,
        cloud_config: &str,
        extra: &[String],
        env: &[(String, String)],
    ) -> Ccm {
        register_config_secrets(cloud_config);
        let config = self.dir.join("cloud.conf");
        std::fs::write(&config, cloud_config).unwrap();
        let kubeconfig = self.dir.join("admin.kubeconfig");
        self.cp.write_kubeconfig(&kubeconfig, &Identity::admin()).unwrap();
        register_kubeconfig_secrets(&kubeconfig);
        let log = self.dir.join(format!("ccm-{}.log", ccm_testbed::unique_name("run")));
        let mut args = vec![
            format!("--cloud-provider={}", self.bin.provider),
            format!("--cloud-config={}", config.display()),
            format!("--kubeconfig={}", kubeconfig.display()),
            "--webhook-secure-port=0".into(),
            "--controllers=*".into(),
            "--node-monitor-period=1s".into(),
        ];
        // Replicas with leader election (the chaos suite) say so in `extra`.
        if !extra.iter().any(|a| a.starts_with("--leader-elect=")) {
            args.push("--leader-elect=false".into());
        }
        if !extra.iter().any(|a| a.starts_with("--secure-port")) {
            args.push("--secure-port=0".into());
        }
        args.extend(extra.iter().cloned());
        let out = std::fs::File::create(&log).unwrap();
        let child = self
            .bin
            .command(&args)
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("starting the cloud-controller-manager");
        Ccm { child, log, name: self.bin.name().to_string() }
    }
}

impl Drop for Env {
    fn drop(&mut self) {
        if std::thread::panicking() {
            eprintln!("manager config and log kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// Polls until `f` returns `Some`, with a generous deadline (a failure, not a timing claim).
pub async fn wait_for<T, F, Fut>(what: &str, f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    ccm_testbed::wait_for(what, Duration::from_secs(90), f).await
}

/// Registers a kubelet-style Node.
pub async fn register(nodes: &Api<Node>, name: &str, ip: &str, ready: &str) {
    nodes.create(&PostParams::default(), &kubelet_node(name, ip, ready)).await.unwrap();
}

pub fn has_taint(n: &Node, key: &str) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|ts| ts.iter().any(|t| t.key == key))
}

pub fn provider_id(n: &Node) -> Option<&str> {
    n.spec.as_ref()?.provider_id.as_deref()
}

pub fn label<'a>(n: &'a Node, key: &str) -> Option<&'a str> {
    n.metadata.labels.as_ref()?.get(key).map(String::as_str)
}

pub fn addresses(n: &Node) -> Vec<(String, String)> {
    n.status
        .as_ref()
        .and_then(|s| s.addresses.as_ref())
        .map(|a| a.iter().map(|a| (a.type_.clone(), a.address.clone())).collect())
        .unwrap_or_default()
}

#[allow(dead_code)]
pub fn pairs(v: &[(&str, &str)]) -> Vec<(String, String)> {
    v.iter().map(|(a, b)| (a.to_string(), b.to_string())).collect()
}

/// Waits until the node has lost the uninitialized taint.
pub async fn initialised(nodes: &Api<Node>, name: &str) -> Node {
    wait_for(&format!("node {name} to be initialised"), || async {
        let n = nodes.get(name).await.ok()?;
        (!has_taint(&n, names::TAINT_UNINITIALIZED)).then_some(n)
    })
    .await
}

/// `curl -sk` with an optional bearer token: (HTTP status, body).
#[allow(dead_code)]
pub async fn curl(url: &str) -> (u16, String) {
    let out = Command::new("curl")
        .args(["-sk", "--max-time", "10", "-w", "\n%{http_code}", url])
        .output()
        .await
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", "0"));
    (code.trim().parse().unwrap_or(0), body.to_string())
}

/// A free loopback port.
#[allow(dead_code)]
pub fn free_port() -> u16 {
    ccm_testbed::free_port().unwrap()
}
