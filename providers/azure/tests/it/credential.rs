//! `acr-credential-provider` against the emulator: managed identity → AAD token → the
//! registry's challenge → refresh-token exchange; the kubelet's service-account token
//! (workload identity); the service principal; non-ACR images; failures as one line.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::Duration;

use base64::Engine;
use ccm_core::credential::{CacheKeyType, CredentialProviderRequest};
use ccm_emulators::azure::{DEFAULT_CLIENT_ID, DEFAULT_CLIENT_SECRET};
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_provider_azure::config::Config;
use ccm_provider_azure::credential::{
    ACR_TOKEN_USERNAME, AcrProvider, CLIENT_ID_ANNOTATION, Options, REGISTRY_ENDPOINT_ENV,
    TENANT_ID_ANNOTATION, run,
};

use crate::fixture::{self, TENANT};

fn request(image: &str) -> CredentialProviderRequest {
    CredentialProviderRequest {
        kind: "CredentialProviderRequest".into(),
        api_version: "credentialprovider.kubelet.k8s.io/v1".into(),
        image: image.into(),
        service_account_token: None,
        service_account_annotations: None,
    }
}

fn provider(f: &fixture::Fixture, edit: impl FnOnce(&mut Config)) -> AcrProvider {
    let mut config = Config {
        tenant_id: Some(TENANT.into()),
        use_managed_identity_extension: true,
        aad_client_id: Some("msi".into()),
        aad_client_secret: Some("msi".into()),
        ..Config::default()
    };
    edit(&mut config);
    let options = Options {
        config_path: String::new(),
        registry_mirror: Vec::new(),
        client: f.options.clone(),
        registry_endpoint: Some(f.server.url()),
        request_timeout: Duration::from_secs(10),
    };
    AcrProvider::new(config, options).unwrap()
}

/// The `aud` of the emulator's JWT-shaped token.
fn audience(token: &str) -> String {
    let payload = token.split('.').nth(1).unwrap();
    let bytes = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap();
    let v: serde_json::Value = serde_json::from_slice(&bytes).unwrap();
    v["aud"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn managed_identity_gets_an_acr_refresh_token_for_the_registry() {
    let f = fixture::start().await;
    assert!(f.cloud.set_imds_instance("vm-0"));
    let p = provider(&f, |_| {});
    let resp = p.provide(&request("myreg.azurecr.io/team/app:v1")).await.unwrap();
    assert_eq!(resp.cache_key_type, CacheKeyType::Registry);
    assert_eq!(resp.cache_duration, Some(Duration::from_secs(3600)));
    let auth = &resp.auth["myreg.azurecr.io"];
    assert_eq!(auth.username, ACR_TOKEN_USERNAME);
    assert_eq!(
        audience(&auth.password),
        "acr-refresh:myreg.azurecr.io",
        "the registry's refresh token"
    );
    let placeholder = &resp.auth["*.azurecr.*"];
    assert!(placeholder.username.is_empty() && placeholder.password.is_empty());
    assert_eq!(resp.auth.len(), 2);
    let c = f.server.counters();
    assert_eq!((c.get("imds.token"), c.get("acr.challenge"), c.get("acr.exchange")), (1, 1, 1));
}

#[tokio::test]
async fn a_mirrored_image_answers_for_the_source_registry_too() {
    let f = fixture::start().await;
    assert!(f.cloud.set_imds_instance("vm-0"));
    let config = Config {
        tenant_id: Some(TENANT.into()),
        use_managed_identity_extension: true,
        ..Config::default()
    };
    let options = Options {
        config_path: String::new(),
        registry_mirror: vec![("mcr.microsoft.com".into(), "mirror.azurecr.io".into())],
        client: f.options.clone(),
        registry_endpoint: Some(f.server.url()),
        request_timeout: Duration::from_secs(10),
    };
    let p = AcrProvider::new(config, options).unwrap();
    let resp = p.provide(&request("mcr.microsoft.com/oss/nginx:1")).await.unwrap();
    assert_eq!(audience(&resp.auth["mirror.azurecr.io"].password), "acr-refresh:mirror.azurecr.io");
    assert_eq!(resp.auth["mcr.microsoft.com"], resp.auth["mirror.azurecr.io"]);
}

#[tokio::test]
async fn the_kubelets_service_account_token_is_used_when_sent() {
    let f = fixture::start().await;
    let p = provider(&f, |_| {});
    let mut req = request("myreg.azurecr.io/app");
    req.service_account_token = Some("eyJhbGciOiJSUzI1NiJ9.eyJzdWIiOiJzYSJ9.c2lnbmF0dXJl".into());
    req.service_account_annotations = Some(BTreeMap::from([
        (CLIENT_ID_ANNOTATION.to_string(), DEFAULT_CLIENT_ID.to_string()),
        (TENANT_ID_ANNOTATION.to_string(), TENANT.to_string()),
    ]));
    let resp = p.provide(&req).await.unwrap();
    assert_eq!(resp.auth["myreg.azurecr.io"].username, ACR_TOKEN_USERNAME);
    let c = f.server.counters();
    assert_eq!((c.get("aad.token"), c.get("imds.token"), c.get("acr.exchange")), (1, 0, 1));

    // Without the annotations: an error naming the annotation, never the token.
    req.service_account_annotations = None;
    let e = p.provide(&req).await.unwrap_err().to_string();
    assert!(e.contains(CLIENT_ID_ANNOTATION), "{e}");
    assert!(!e.contains("eyJ"), "{e}");
}

#[tokio::test]
async fn a_service_principal_answers_every_acr_glob_without_calls() {
    let f = fixture::start().await;
    let p = provider(&f, |c| {
        c.use_managed_identity_extension = false;
        c.aad_client_id = Some(DEFAULT_CLIENT_ID.into());
        c.aad_client_secret = Some(DEFAULT_CLIENT_SECRET.into());
    });
    let resp = p.provide(&request("myreg.azurecr.cn/app")).await.unwrap();
    for glob in ["*.azurecr.io", "*.azurecr.cn", "*.azurecr.de", "*.azurecr.us"] {
        assert_eq!(resp.auth[glob].username, DEFAULT_CLIENT_ID);
        assert_eq!(resp.auth[glob].password, DEFAULT_CLIENT_SECRET);
    }
    assert_eq!(f.server.counters().matching("*"), 0, "no call at all");

    // Not an ACR image: nothing, and not cached.
    let resp = p.provide(&request("docker.io/library/nginx")).await.unwrap();
    assert!(resp.auth.is_empty());
    assert_eq!(resp.cache_duration, Some(Duration::ZERO));
}

#[tokio::test]
async fn failures_are_one_line_without_the_token() {
    let f = fixture::start().await;
    assert!(f.cloud.set_imds_instance("vm-0"));
    f.server
        .inject(FaultRule::new("acr.exchange", Fault::Status { status: 401, body: None }).times(1))
        .unwrap();
    let p = provider(&f, |_| {});
    let e = p.provide(&request("myreg.azurecr.io/app")).await.unwrap_err().to_string();
    assert_eq!(e, "registry myreg.azurecr.io: token exchange: HTTP 401");

    // The whole command: config file, flags, stdin → exit 1 and one line on stderr.
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("azure.json");
    std::fs::write(
        &path,
        format!("{{\"tenantId\": \"{TENANT}\", \"useManagedIdentityExtension\": true}}"),
    )
    .unwrap();
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, f.server.ca_pem().unwrap()).unwrap();
    let url = f.server.url();
    let env = move |k: &str| match k {
        "SSL_CERT_FILE" => Some(ca.display().to_string()),
        "CCM_AZURE_IMDS_ENDPOINT" => Some(url.clone()),
        k if k == REGISTRY_ENDPOINT_ENV => Some(url.clone()),
        _ => None,
    };
    let args = vec![path.display().to_string()];
    let good = br#"{"kind":"CredentialProviderRequest","apiVersion":"credentialprovider.kubelet.k8s.io/v1","image":"myreg.azurecr.io/app"}"#;
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(&args, &env, &mut &good[..], &mut out, &mut err);
        (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
    })
    .await
    .unwrap();
    assert_eq!(code, ExitCode::SUCCESS, "{err}");
    assert!(out.contains("\"username\":\"00000000-0000-0000-0000-000000000000\""), "{out}");
    assert!(out.contains("\"cacheDuration\":\"1h0m0s\""), "{out}");

    let missing = vec!["/nonexistent/azure.json".to_string()];
    let (code, out, err) = tokio::task::spawn_blocking(move || {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let code = run(&missing, &|_| None, &mut &good[..], &mut out, &mut err);
        (code, String::from_utf8(out).unwrap(), String::from_utf8(err).unwrap())
    })
    .await
    .unwrap();
    assert_eq!(code, ExitCode::FAILURE);
    assert!(out.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("reading config file /nonexistent/azure.json"), "{err}");
}
