//! `ecr-credential-provider` against moto behind the fault proxy: the dual-stack registry
//! hosts, hosts that are no known ECR name (default region, as upstream), and KEP-4412
//! service-account tokens (STS `AssumeRoleWithWebIdentity` with the role of the service
//! account's `eks.amazonaws.com/ecr-role-arn` annotation, then ECR with those credentials).

use ccm_core::credential::CredentialProviderRequest;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
use ccm_provider_aws::credential::plugin::{ROLE_ANNOTATION, handle_with};
use ccm_provider_aws::testing;
use ccm_testbed::moto::Moto;

fn request(image: &str, token: Option<&str>, role: Option<&str>) -> CredentialProviderRequest {
    let mut v = serde_json::json!({
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "kind": "CredentialProviderRequest",
        "image": image,
    });
    if let Some(t) = token {
        v["serviceAccountToken"] = t.into();
        v["serviceAccountAnnotations"] = serde_json::json!({});
    }
    if let Some(r) = role {
        v["serviceAccountAnnotations"] = serde_json::json!({ ROLE_ANNOTATION: r });
    }
    serde_json::from_value(v).unwrap()
}

#[tokio::test]
async fn service_account_tokens_dual_stack_hosts_and_unknown_hosts() {
    let moto = Moto::start().await.unwrap();
    let proxy =
        FaultProxy::start(Url::parse(&moto.url).unwrap(), Protocol::AwsQuery).await.unwrap();
    let admin = proxy.admin();
    let base = testing::sdk().await.to_builder().endpoint_url(proxy.url()).build();

    // A dual-stack host with a service-account token and a role: the role is assumed with
    // the token first, then ECR is asked with those credentials.
    let host = "123456789012.dkr-ecr.us-east-1.on.aws";
    let req = request(
        &format!("{host}/app:v1"),
        Some("eyJhbGciOiJSUzI1NiJ9.e30.sig"),
        Some("arn:aws:iam::123456789012:role/ecr-pull"),
    );
    let resp = handle_with(&req, Some(&base)).await.unwrap();
    let v = serde_json::to_value(&resp).unwrap();
    assert_eq!(v["auth"][host]["username"], "AWS", "{v}");
    let c = admin.counters().await.unwrap();
    eprintln!("counters: {c:?}");
    assert_eq!(c.matching("*AssumeRoleWithWebIdentity"), 1, "{c:?}");
    assert_eq!(c.matching("ecr*GetAuthorizationToken"), 1, "{c:?}");
    let log = admin.requests().await.unwrap();
    let sts_at = log.iter().position(|r| r.operation.ends_with("AssumeRoleWithWebIdentity"));
    let ecr_at = log.iter().position(|r| r.operation.ends_with("GetAuthorizationToken"));
    assert!(sts_at < ecr_at, "{log:?}");

    // STS refusing the token fails the request: no ECR call with other credentials.
    admin
        .inject(FaultRule::new(
            "*AssumeRoleWithWebIdentity",
            Fault::Status { status: 403, body: None },
        ))
        .await
        .unwrap();
    let err = handle_with(&req, Some(&base)).await.unwrap_err().to_string();
    assert!(err.contains("AssumeRoleWithWebIdentity"), "{err}");
    let c = admin.counters().await.unwrap();
    assert_eq!(c.matching("ecr*GetAuthorizationToken"), 1, "{c:?}");
    admin.clear_faults().await.unwrap();

    // A token without a role: the default credentials, no STS call.
    let req = request(&format!("{host}/app:v1"), Some("eyJ.e30.sig"), None);
    handle_with(&req, Some(&base)).await.unwrap();
    let c = admin.counters().await.unwrap();
    assert_eq!(c.matching("*AssumeRoleWithWebIdentity"), 2, "only the refused one: {c:?}");
    assert_eq!(c.matching("ecr*GetAuthorizationToken"), 2, "{c:?}");

    // The other new host forms and an unknown host (the default region) are answered.
    for image in [
        "123456789012.dkr.ecr.eu-west-1.amazonaws.eu/app",
        "123456789012.dkr-ecr.cn-north-1.on.amazonwebservices.com.cn/app",
        "registry.internal.example/app:v1",
    ] {
        let resp = handle_with(&request(image, None, None), Some(&base)).await;
        let resp = resp.unwrap_or_else(|e| panic!("{image}: {e}"));
        let v = serde_json::to_value(&resp).unwrap();
        let host = image.split('/').next().unwrap();
        assert_eq!(v["auth"][host]["username"], "AWS", "{image}: {v}");
    }
}
