//! `RoleARN` with `SourceARN`: the STS `AssumeRole` call carries upstream's confused-deputy
//! headers, signed. STS is a small kit emulator that records each request's headers and
//! answers `AssumeRole`; EC2 is moto (which accepts the assumed credentials).

use std::sync::{Arc, Mutex};

use bytes::Bytes;
use ccm_core::cloud::CloudProvider;
use ccm_emulators::server::{
    Cloud, ErrorKind, ErrorReply, ServeFuture, Server, ServerOptions, full,
};
use ccm_provider_aws::testing;
use http::{Request, Response, StatusCode};

use crate::moto::{Moto, node};

/// STS answering `AssumeRole` with fixed credentials, keeping every request's headers.
#[derive(Default)]
struct RecordingSts {
    requests: Mutex<Vec<http::HeaderMap>>,
}

const ASSUME_ROLE_RESPONSE: &str = r#"<AssumeRoleResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">
  <AssumeRoleResult>
    <Credentials>
      <AccessKeyId>ASIAEXAMPLEASSUMED</AccessKeyId>
      <SecretAccessKey>assumed-secret</SecretAccessKey>
      <SessionToken>assumed-session</SessionToken>
      <Expiration>2099-01-01T00:00:00Z</Expiration>
    </Credentials>
    <AssumedRoleUser>
      <AssumedRoleId>AROAEXAMPLE:cloud-controller-manager-aws</AssumedRoleId>
      <Arn>arn:aws:sts::123456789012:assumed-role/ccm/cloud-controller-manager-aws</Arn>
    </AssumedRoleUser>
  </AssumeRoleResult>
  <ResponseMetadata><RequestId>1</RequestId></ResponseMetadata>
</AssumeRoleResponse>"#;

impl Cloud for RecordingSts {
    fn name(&self) -> String {
        "recording-sts".into()
    }
    fn operation(&self, _head: &http::request::Parts, body: &Bytes) -> String {
        let body = String::from_utf8_lossy(body);
        if body.contains("Action=AssumeRole") {
            "sts:AssumeRole".into()
        } else {
            "sts:Other".into()
        }
    }
    fn error(&self, _head: &http::request::Parts, _op: &str, kind: ErrorKind) -> ErrorReply {
        let status = if let ErrorKind::Status(s) = kind { s } else { 400 };
        ErrorReply { status, content_type: "text/xml", body: String::new() }
    }
    fn serve(&self, _op: String, req: Request<Bytes>) -> ServeFuture {
        self.requests.lock().unwrap().push(req.headers().clone());
        let mut r = Response::new(full(ASSUME_ROLE_RESPONSE));
        *r.status_mut() = StatusCode::OK;
        Box::pin(async move { Ok(r) })
    }
}

#[tokio::test]
async fn assume_role_with_source_arn_sends_the_signed_source_headers() {
    let moto = Moto::start().await.unwrap();
    let sts = Arc::new(RecordingSts::default());
    let server = Server::start(sts.clone(), ServerOptions::default()).await.unwrap();
    let mut text = testing::cloud_config(
        &moto.0.url,
        "srcarn",
        "RoleARN = arn:aws:iam::123456789012:role/ccm\nSourceARN = arn:aws:eks:us-east-1:111122223333:cluster/prod",
    );
    text.push_str(&format!(
        "\n[ServiceOverride \"sts\"]\nService = sts\nRegion = {}\nURL = {}\nSigningRegion = {}\n",
        testing::REGION,
        server.url(),
        testing::REGION
    ));
    let cfg = ccm_provider_aws::CloudConfig::parse(&text).unwrap();
    let clients = ccm_provider_aws::AwsClients::from_sdk_config(
        &cfg,
        &testing::sdk().await,
        ccm_provider_aws::ApiMetrics::default(),
    )
    .await
    .unwrap();
    let cloud = ccm_provider_aws::Cloud::with_clients(
        cfg,
        Arc::new(ccm_provider_aws::LazyClients::ready(clients)),
    );
    // Any EC2 call needs the role's credentials first.
    let by_id = node("srcarn", Some("aws:///us-east-1a/i-0123456789abcdef0".into()));
    assert!(!cloud.instances_v2().unwrap().instance_exists(&by_id).await.unwrap());

    let requests = sts.requests.lock().unwrap().clone();
    assert_eq!(server.counters().get("sts:AssumeRole"), 1, "{:?}", server.counters());
    let h = &requests[0];
    let get = |k: &str| h.get(k).and_then(|v| v.to_str().ok()).unwrap_or_default().to_string();
    assert_eq!(get("x-amz-source-arn"), "arn:aws:eks:us-east-1:111122223333:cluster/prod");
    assert_eq!(get("x-amz-source-account"), "111122223333");
    let auth = get("authorization");
    assert!(
        auth.contains("x-amz-source-account") && auth.contains("x-amz-source-arn"),
        "the source headers are not signed: {auth}"
    );
}

#[tokio::test]
async fn assume_role_without_source_arn_sends_no_source_headers() {
    let moto = Moto::start().await.unwrap();
    let sts = Arc::new(RecordingSts::default());
    let server = Server::start(sts.clone(), ServerOptions::default()).await.unwrap();
    let mut text =
        testing::cloud_config(&moto.0.url, "nosrc", "RoleARN = arn:aws:iam::123456789012:role/ccm");
    text.push_str(&format!(
        "\n[ServiceOverride \"sts\"]\nService = sts\nRegion = {}\nURL = {}\nSigningRegion = {}\n",
        testing::REGION,
        server.url(),
        testing::REGION
    ));
    let cfg = ccm_provider_aws::CloudConfig::parse(&text).unwrap();
    let clients = ccm_provider_aws::AwsClients::from_sdk_config(
        &cfg,
        &testing::sdk().await,
        ccm_provider_aws::ApiMetrics::default(),
    )
    .await
    .unwrap();
    let cloud = ccm_provider_aws::Cloud::with_clients(
        cfg,
        Arc::new(ccm_provider_aws::LazyClients::ready(clients)),
    );
    let by_id = node("nosrc", Some("aws:///us-east-1a/i-0123456789abcdef0".into()));
    assert!(!cloud.instances_v2().unwrap().instance_exists(&by_id).await.unwrap());
    let requests = sts.requests.lock().unwrap().clone();
    assert!(!requests.is_empty());
    assert!(requests.iter().all(|h| h.get("x-amz-source-arn").is_none()));
}

/// Config points of issue 14 as the provider reads them: any `[ServiceOverride]` service is
/// accepted; `KubernetesClusterTag` and `KubernetesClusterID` that disagree are refused.
#[test]
fn config_accepts_any_override_and_refuses_disagreeing_cluster_ids() {
    let text = "[Global]\nKubernetesClusterID = c1\n[ServiceOverride \"s3\"]\nService = s3\nRegion = us-east-1\nURL = https://s3.internal\nSigningRegion = us-east-1\n";
    let cloud = ccm_provider_aws::Cloud::from_config(Some(text.as_bytes())).unwrap();
    assert!(cloud.config().override_for("s3", "us-east-1").is_some());
    let err = ccm_provider_aws::Cloud::from_config(Some(
        b"[Global]\nKubernetesClusterID = c1\nKubernetesClusterTag = c2\n",
    ))
    .unwrap_err()
    .to_string();
    assert!(err.contains("KubernetesClusterTag") && err.contains("KubernetesClusterID"), "{err}");
}
