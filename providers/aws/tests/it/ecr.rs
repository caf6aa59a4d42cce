//! `ecr-credential-provider` as the kubelet runs it, against moto's ECR.

use std::io::Write;
use std::process::{Command, Stdio};

use crate::moto::Moto;

#[tokio::test]
async fn the_plugin_answers_a_kubelet_request_for_a_private_registry() {
    let moto = Moto::start().await.unwrap();
    let image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/app:v1";
    let request = serde_json::json!({
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "kind": "CredentialProviderRequest",
        "image": image,
    });
    let mut child = Command::new(env!("CARGO_BIN_EXE_ecr-credential-provider"))
        .env("AWS_ENDPOINT_URL", moto.url())
        .env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let resp: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(resp["kind"], "CredentialProviderResponse");
    assert_eq!(resp["apiVersion"], "credentialprovider.kubelet.k8s.io/v1");
    assert_eq!(resp["cacheKeyType"], "Registry");
    // moto's token expired in 2015: the kubelet must not cache it.
    assert!(resp["cacheDuration"].as_str().is_none_or(|d| d == "0s"), "{resp}");
    let auth = &resp["auth"]["123456789012.dkr.ecr.us-east-1.amazonaws.com"];
    assert_eq!(auth["username"], "AWS");
    assert!(auth["password"].as_str().is_some_and(|p| !p.is_empty()), "{resp}");

    // Not an ECR image: exit 1, nothing on stdout.
    let mut child = Command::new(env!("CARGO_BIN_EXE_ecr-credential-provider"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let req = serde_json::json!({"apiVersion": "credentialprovider.kubelet.k8s.io/v1", "kind": "CredentialProviderRequest", "image": "docker.io/library/nginx"});
    child.stdin.take().unwrap().write_all(req.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(!out.status.success());
    assert!(out.stdout.is_empty());
    assert!(String::from_utf8_lossy(&out.stderr).contains("not in an ECR registry"));
}
