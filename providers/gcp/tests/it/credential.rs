//! `auth-provider-gcp` end to end against the emulator's metadata server: the whole command
//! (`credential::run`: arguments, environment, stdin, stdout, stderr, exit code) for each
//! flow, the scope refusal, faults of the metadata server, and malformed input.

// Test helpers panic on failure by design (the lead's main.rs may allow it crate-wide).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_core::cloud_call::Retry;
use ccm_core::credential::{
    CacheKeyType, CredentialProviderRequest, CredentialProviderResponse, image_matches,
};
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::gcp::{GcpCloud, GcpOptions};
use ccm_emulators::server::{Server, ServerOptions};
use ccm_emulators::world::World;
use ccm_provider_gcp::credential::{
    self, AuthError, AuthFlow, Options, Provider, REGISTRY_PATTERNS,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::fixture::WORLD;

const V1: &str = "credentialprovider.kubelet.k8s.io/v1";

fn request(image: &str) -> String {
    format!(r#"{{"kind":"CredentialProviderRequest","apiVersion":"{V1}","image":"{image}"}}"#)
}

/// The emulator on its own runtime, so that the plugin's `run` (which starts its own) is
/// called as the binary's `main` calls it.
struct Plugin {
    rt: tokio::runtime::Runtime,
    cloud: Arc<GcpCloud>,
    server: Server,
}

struct Outcome {
    code: ExitCode,
    stdout: String,
    stderr: String,
}

impl Outcome {
    fn response(&self) -> CredentialProviderResponse {
        assert_eq!(self.code, ExitCode::SUCCESS, "stderr: {}", self.stderr);
        assert!(self.stderr.is_empty(), "{}", self.stderr);
        serde_json::from_str(&self.stdout).unwrap()
    }

    /// Exit 1, one line on stderr holding `expected`, nothing on stdout.
    fn failure(&self, expected: &str) -> &str {
        assert_eq!(self.code, ExitCode::FAILURE, "stdout: {}", self.stdout);
        assert!(self.stdout.is_empty(), "{}", self.stdout);
        assert_eq!(self.stderr.lines().count(), 1, "{}", self.stderr);
        assert!(self.stderr.contains(expected), "expected {expected:?} in {}", self.stderr);
        &self.stderr
    }
}

impl Plugin {
    fn start() -> Plugin {
        Self::start_with(GcpOptions::default())
    }

    fn start_with(opts: GcpOptions) -> Plugin {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .unwrap();
        let cloud = GcpCloud::new(World::parse(WORLD).unwrap(), opts);
        let server = rt.block_on(Server::start(cloud.clone(), ServerOptions::default())).unwrap();
        Plugin { rt, cloud, server }
    }

    fn invoke_env(&self, args: &str, env: &[(&str, &str)], stdin: &str) -> Outcome {
        let host = self.server.addr().to_string();
        let mut vars: BTreeMap<String, String> =
            env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        vars.entry("GCE_METADATA_HOST".into()).or_insert(host);
        let args: Vec<String> = args.split_whitespace().map(str::to_string).collect();
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = credential::run(
            &args,
            &|k| vars.get(k).cloned(),
            &mut stdin.as_bytes(),
            &mut out,
            &mut err,
        );
        let outcome = Outcome {
            code,
            stdout: String::from_utf8(out).unwrap(),
            stderr: String::from_utf8(err).unwrap(),
        };
        // Tokens never reach stderr.
        for token in self.cloud.tokens() {
            assert!(!outcome.stderr.contains(&token), "{}", outcome.stderr);
        }
        assert!(!outcome.stderr.contains("ya29"), "{}", outcome.stderr);
        outcome
    }

    fn invoke(&self, args: &str, stdin: &str) -> Outcome {
        self.invoke_env(args, &[], stdin)
    }
}

#[test]
fn gcr_answers_the_metadata_token_for_google_registries_and_the_images_own() {
    let p = Plugin::start();
    let out = p.invoke(
        "get-credentials --authFlow=gcr --v=3",
        &request("europe-docker.pkg.dev/p/r/app:1"),
    );
    let resp = out.response();
    assert_eq!(resp.kind, "CredentialProviderResponse");
    assert_eq!(resp.api_version, V1);
    // Upstream's defaults: keyed per image, not cached.
    assert_eq!(resp.cache_key_type, CacheKeyType::Image);
    assert_eq!(resp.cache_duration, Some(Duration::ZERO));
    let mut keys: Vec<&str> = resp.auth.keys().map(String::as_str).collect();
    keys.sort_unstable();
    assert_eq!(
        keys,
        ["*.gcr.io", "*.pkg.dev", "container.cloud.google.com", "europe-docker.pkg.dev", "gcr.io"]
    );
    // The password is a token the metadata server issued (so the emulator's registries, were
    // they real, would take it), under the username meaning "OAuth token".
    let tokens = p.cloud.tokens();
    for a in resp.auth.values() {
        assert_eq!(a.username, "_token");
        assert!(tokens.contains(&a.password), "{}", a.password);
    }
    // The kubelet would use it for the usual Google image names.
    for image in ["gcr.io/p/a:1", "eu.gcr.io/p/a", "us-docker.pkg.dev/p/r/a"] {
        assert!(resp.auth.keys().any(|k| image_matches(k, image)), "{image}");
    }
    // The scope check and the token: two metadata reads.
    assert_eq!(p.server.counters().get("metadata.get"), 2);
    // gcr is the default flow, as upstream.
    let again = p.invoke("get-credentials", &request("gcr.io/p/a")).response();
    assert_eq!(again.auth.len(), REGISTRY_PATTERNS.len());
}

/// Issue #29 (LOW): an image on a host that is not Google's (a look-alike, or a Google name in
/// the path) gets the node's token for Google's registries only: no auth entry the kubelet
/// would use for the image's own host.
#[test]
fn gcr_never_answers_the_token_for_the_image_s_host_when_it_is_not_google_s() {
    let p = Plugin::start();
    for image in ["gcr.io.example.com/p/app:1", "example.com/gcr.io/p/app", "library/nginx"] {
        let resp = p.invoke("get-credentials", &request(image)).response();
        let mut keys: Vec<&str> = resp.auth.keys().map(String::as_str).collect();
        keys.sort_unstable();
        assert_eq!(
            keys,
            ["*.gcr.io", "*.pkg.dev", "container.cloud.google.com", "gcr.io"],
            "{image}"
        );
        assert!(!resp.auth.keys().any(|k| image_matches(k, image)), "{image}");
    }
}

#[test]
fn the_response_speaks_the_requests_version_and_caches_as_the_environment_says() {
    let p = Plugin::start_with(GcpOptions {
        token_lifetime: Duration::from_secs(1800),
        ..GcpOptions::default()
    });
    let req = request("gcr.io/p/a").replace("/v1\"", "/v1beta1\"");
    let resp = p
        .invoke_env(
            "get-credentials",
            &[("KUBE_SIDECAR_CACHE_DURATION", "10m"), ("KUBE_SIDECAR_CACHE_TYPE", "registry")],
            &req,
        )
        .response();
    assert_eq!(resp.api_version, "credentialprovider.kubelet.k8s.io/v1beta1");
    assert_eq!(resp.cache_key_type, CacheKeyType::Registry);
    assert_eq!(resp.cache_duration, Some(Duration::from_secs(600)));
    // Never cached beyond the token's lifetime.
    let resp = p
        .invoke_env(
            "get-credentials",
            &[("KUBE_SIDECAR_CACHE_DURATION", "2h")],
            &request("gcr.io/p/a"),
        )
        .response();
    assert_eq!(resp.cache_duration, Some(Duration::from_secs(1800)));
    // A bad variable is an error naming it.
    p.invoke_env("get-credentials", &[("KUBE_SIDECAR_CACHE_TYPE", "images")], &request("gcr.io/a"))
        .failure("KUBE_SIDECAR_CACHE_TYPE");
}

#[test]
fn gcr_refuses_an_account_without_a_storage_scope() {
    let p = Plugin::start();
    p.cloud.set_scopes(vec![
        "https://www.googleapis.com/auth/compute".into(),
        "https://www.googleapis.com/auth/logging.write".into(),
    ]);
    let out = p.invoke("get-credentials --authFlow=gcr", &request("gcr.io/p/a"));
    let line = out.failure("no storage scope");
    assert!(line.contains("https://www.googleapis.com/auth/compute"), "{line}");
    // No token was asked for.
    assert!(p.cloud.tokens().is_empty());

    // Each of upstream's accepted scopes is enough on its own.
    for scope in [
        "https://www.googleapis.com/auth/devstorage.read_only",
        "https://www.googleapis.com/auth/devstorage.read_write",
        "https://www.googleapis.com/auth/devstorage.full_control",
        "https://www.googleapis.com/auth/cloud-platform",
    ] {
        p.cloud.set_scopes(vec!["https://www.googleapis.com/auth/compute".into(), scope.into()]);
        let resp = p.invoke("get-credentials", &request("gcr.io/p/a")).response();
        assert_eq!(resp.auth.len(), 4, "{scope}");
    }
    p.cloud.set_scopes(vec![]);
    p.invoke("get-credentials", &request("gcr.io/p/a")).failure("it has: none");
}

const DOCKERCFG: &str = r#"{
  "https://registry.example.com": {"auth": "cHVsbGVyOnMzY3JldDpwYXNz", "email": "ops@example.com"},
  "mirror.example.com:5000": {"username": "m", "password": "mpass"}
}"#;

#[test]
fn dockercfg_answers_the_instance_attributes_registries() {
    let p = Plugin::start();
    p.cloud.set_attribute("google-dockercfg", Some(DOCKERCFG));
    let resp = p
        .invoke("get-credentials --authFlow=dockercfg", &request("registry.example.com/app"))
        .response();
    assert_eq!(resp.auth.len(), 2);
    let a = &resp.auth["https://registry.example.com"];
    assert_eq!((a.username.as_str(), a.password.as_str()), ("puller", "s3cret:pass"));
    let m = &resp.auth["mirror.example.com:5000"];
    assert_eq!((m.username.as_str(), m.password.as_str()), ("m", "mpass"));
    // No token is involved.
    assert!(p.cloud.tokens().is_empty());

    // Not set, or not a dockercfg: exit 1 naming the attribute, never its content.
    p.cloud.set_attribute("google-dockercfg", None);
    p.invoke("get-credentials --authFlow=dockercfg", &request("r.io/a"))
        .failure("instance attribute google-dockercfg is not set");
    p.cloud.set_attribute("google-dockercfg", Some(r#"{"r.io": {"password": "Zq7secret"#));
    let line = p
        .invoke("get-credentials --authFlow=dockercfg", &request("r.io/a"))
        .failure("instance attribute google-dockercfg: not a .dockercfg")
        .to_string();
    assert!(!line.contains("Zq7"), "{line}");
}

/// A one-route HTTP server answering every GET with `status` and `body`; records the
/// request heads it saw.
async fn file_server(status: u16, body: &'static str) -> (String, Arc<Mutex<Vec<String>>>) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut conn, _)) = listener.accept().await {
            let mut head = Vec::new();
            let mut buf = [0u8; 1024];
            while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                match conn.read(&mut buf).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&buf[..n]),
                }
            }
            log.lock().unwrap().push(String::from_utf8_lossy(&head).to_string());
            let reply = format!(
                "HTTP/1.1 {status} X\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = conn.write_all(reply.as_bytes()).await;
        }
    });
    (url, seen)
}

#[test]
fn dockercfg_url_fetches_the_dockercfg_the_attribute_points_at() {
    let p = Plugin::start();
    let (url, seen) = p.rt.block_on(file_server(200, DOCKERCFG));
    p.cloud.set_attribute("google-dockercfg-url", Some(&format!("{url}/cfg?sig=Zq7signature\n")));
    let resp = p
        .invoke("get-credentials --authFlow=dockercfg-url", &request("registry.example.com/app"))
        .response();
    assert_eq!(resp.auth["https://registry.example.com"].password, "s3cret:pass");
    // The URL is fetched as given, without the metadata server's header.
    let heads = seen.lock().unwrap().clone();
    assert_eq!(heads.len(), 1);
    assert!(heads[0].starts_with("GET /cfg?sig=Zq7signature HTTP/1.1"), "{}", heads[0]);
    assert!(!heads[0].to_ascii_lowercase().contains("metadata-flavor"), "{}", heads[0]);

    // A refusal names the URL's origin only (its query may be a signature).
    let (denied, _) = p.rt.block_on(file_server(403, "denied"));
    p.cloud.set_attribute("google-dockercfg-url", Some(&format!("{denied}/cfg?sig=Zq7signature")));
    let line = p
        .invoke("get-credentials --authFlow=dockercfg-url", &request("r.io/a"))
        .failure("403")
        .to_string();
    assert!(line.contains(&denied), "{line}");
    assert!(!line.contains("Zq7") && !line.contains("/cfg"), "{line}");

    // Only http(s), as upstream; an unset attribute is named.
    p.cloud.set_attribute("google-dockercfg-url", Some("gs://bucket/dockercfg"));
    p.invoke("get-credentials --authFlow=dockercfg-url", &request("r.io/a"))
        .failure("unsupported URL scheme \"gs\"");
    p.cloud.set_attribute("google-dockercfg-url", None);
    p.invoke("get-credentials --authFlow=dockercfg-url", &request("r.io/a"))
        .failure("instance attribute google-dockercfg-url is not set");
}

#[test]
fn malformed_input_and_command_lines_exit_1_with_one_line() {
    let p = Plugin::start();
    let ok = request("gcr.io/p/a");
    for (args, stdin, expected) in [
        ("get-credentials", "", "empty input"),
        ("get-credentials", "{\"kind\": ", "error decoding CredentialProviderRequest"),
        ("get-credentials", "not json", "invalid JSON"),
        (
            "get-credentials",
            r#"{"kind":"CredentialProviderResponse","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"a/b"}"#,
            "unsupported kind",
        ),
        (
            "get-credentials",
            r#"{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1"}"#,
            "image is required",
        ),
        ("get-credentials --authFlow=ecr", ok.as_str(), "invalid value \"ecr\" for --authFlow"),
        ("get-credentials --authFlow", ok.as_str(), "--authFlow needs a value"),
        ("--authFlow=gcr", ok.as_str(), "no command"),
        ("credentials", ok.as_str(), "unknown command"),
        ("get-credentials --region=x", ok.as_str(), "unknown flag \"--region\""),
    ] {
        let out = p.invoke(args, stdin);
        out.failure(expected);
    }
    // Nothing asked of the metadata server by any of them.
    assert_eq!(p.server.counters().get("metadata.get"), 0);
    // --help answers on stdout.
    let out = p.invoke("get-credentials --help", "");
    assert_eq!(out.code, ExitCode::SUCCESS);
    assert!(out.stdout.starts_with("usage: auth-provider-gcp get-credentials"), "{}", out.stdout);
}

/// Issue #32 (GCP 7): Workload Identity image pulls as upstream's plugin: an opted-in Service
/// Account's token is traded at STS for a federated token, answered as `_token` for Google's
/// registries (the node's account is not asked); a refused exchange or a missing token is an
/// error, never the node's token; no token reaches stderr.
#[test]
fn workload_identity_trades_the_pod_s_token_at_sts_and_never_falls_back() {
    let p = Plugin::start();
    let sts = format!("{}/v1/token", p.server.url());
    let env = [("AUTH_PROVIDER_GCP_STS_ENDPOINT", sts.as_str())];
    let idp =
        "https://container.googleapis.com/v1/projects/emulated-project/locations/l/clusters/c";
    let args = format!("get-credentials --identity-provider={idp} --project-id=emulated-project");
    let annotated = r#"{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"gcr.io/p/a","serviceAccountToken":"eyJ.ksa.token","serviceAccountAnnotations":{"iam.gke.io/enable-wi-image-pull":"true"}}"#;
    let resp = p.invoke_env(&args, &env, annotated).response();
    let issued = p.cloud.tokens();
    assert_eq!(issued.len(), 1, "one federated token");
    assert_eq!(resp.auth["gcr.io"].username, "_token");
    assert_eq!(resp.auth["gcr.io"].password, issued[0]);
    assert_eq!(resp.auth["*.pkg.dev"].password, issued[0]);
    assert_eq!(p.cloud.sts_subjects(), vec!["eyJ.ksa.token".to_string()]);
    assert_eq!(p.server.counters().get("metadata.get"), 0, "the node's account is not asked");

    // STS refuses (another project's audience): an error naming the OAuth code, no fallback.
    let other = format!("get-credentials --identity-provider={idp} --project-id=other-project");
    let line = p.invoke_env(&other, &env, annotated).failure("refused").to_string();
    assert!(line.contains("invalid_target") && line.contains("Workload Identity"), "{line}");
    assert!(!line.contains("eyJ.ksa.token"), "{line}");
    assert_eq!(p.cloud.tokens().len(), 1, "nothing else issued");

    // Opted in, but the kubelet sent no token: an error, no fallback.
    let no_token = r#"{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"gcr.io/p/a","serviceAccountAnnotations":{"iam.gke.io/enable-wi-image-pull":"true"}}"#;
    p.invoke_env(&args, &env, no_token).failure("no Service Account token");
    assert_eq!(p.server.counters().get("metadata.get"), 0);

    // Not opted in: the node's service account, as upstream.
    let resp = p.invoke_env(&args, &env, &request("gcr.io/p/a")).response();
    assert_eq!(resp.auth["gcr.io"].username, "_token");
    assert!(p.server.counters().get("metadata.get") > 0);

    // The endpoint override takes https, or http on loopback only.
    p.invoke_env(
        &args,
        &[("AUTH_PROVIDER_GCP_STS_ENDPOINT", "http://sts.example.com/v1/token")],
        annotated,
    )
    .failure("AUTH_PROVIDER_GCP_STS_ENDPOINT");
}

fn options(p: &Plugin, flow: AuthFlow, deadline: Duration) -> Options {
    Options {
        flow,
        identity_provider: None,
        project_id: None,
        sts_endpoint: credential::STS_ENDPOINT.to_string(),
        metadata_root: p.server.url(),
        request_timeout: Duration::from_millis(500),
        deadline,
        retry: Retry {
            attempts: 4,
            base: Duration::from_millis(20),
            max: Duration::from_millis(50),
        },
        cache_duration: Duration::ZERO,
        cache_key_type: CacheKeyType::Image,
    }
}

fn req(image: &str) -> CredentialProviderRequest {
    ccm_core::credential::decode_request(request(image).as_bytes()).unwrap()
}

#[test]
fn metadata_faults_are_retried_and_a_hang_ends_at_the_deadline() {
    let p = Plugin::start();
    // Two 503s, then the answer.
    p.server
        .inject(FaultRule::new("metadata.get", Fault::Status { status: 503, body: None }).times(2))
        .unwrap();
    let provider = Provider::new(options(&p, AuthFlow::Gcr, Duration::from_secs(10))).unwrap();
    let resp = p.rt.block_on(provider.provide(&req("gcr.io/p/a"))).unwrap();
    assert_eq!(resp.auth.len(), 4);
    assert_eq!(p.server.counters().get("metadata.get"), 4);

    // A 403 is not retried.
    p.server
        .inject(FaultRule::new("metadata.get", Fault::Status { status: 403, body: None }).times(1))
        .unwrap();
    let before = p.server.counters().get("metadata.get");
    let e = p.rt.block_on(provider.provide(&req("gcr.io/p/a"))).unwrap_err();
    assert!(matches!(e, AuthError::Read { transient: false, .. }), "{e}");
    assert!(e.to_string().contains("403"), "{e}");
    assert_eq!(p.server.counters().get("metadata.get"), before + 1);

    // A metadata server that never answers: each request times out (and is retried), and
    // the error names the read.
    p.server.inject(FaultRule::new("metadata.get", Fault::Hang)).unwrap();
    let provider =
        Provider::new(options(&p, AuthFlow::DockerCfg, Duration::from_secs(10))).unwrap();
    let started = std::time::Instant::now();
    let e = p.rt.block_on(provider.provide(&req("gcr.io/p/a"))).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(5), "{:?}", started.elapsed());
    assert!(matches!(e, AuthError::Read { transient: true, .. }), "{e}");
    assert!(e.to_string().contains("instance/attributes/google-dockercfg: timed out"), "{e}");
    // And the whole answer ends at the deadline, whatever the retries.
    let mut o = options(&p, AuthFlow::DockerCfg, Duration::from_secs(1));
    o.request_timeout = Duration::from_secs(30);
    let provider = Provider::new(o).unwrap();
    let started = std::time::Instant::now();
    let e = p.rt.block_on(provider.provide(&req("gcr.io/p/a"))).unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(3), "{:?}", started.elapsed());
    assert!(matches!(e, AuthError::Deadline(_)), "{e}");
}
