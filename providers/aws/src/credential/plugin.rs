//! The `ecr-credential-provider` kubelet plugin (feature `ecr-credential-provider`; the
//! binary is built by `cmd/` with `--features provider-aws`).
//!
//! Reads a `CredentialProviderRequest` on stdin, gets an authorization token for the image's
//! registry (`ecr:GetAuthorizationToken` in the registry's region, or
//! `ecr-public:GetAuthorizationToken` in us-east-1 for ECR Public) with the SDK's default
//! credential chain, and answers with registry-scoped credentials cached for half the token's
//! remaining lifetime (not cached when the token has already expired).
//!
//! No call hangs: the ECR clients carry the provider's [`CallTimeouts`] (connect 5 s, attempt
//! 10 s, operation 30 s), and the whole request is bounded by [`PLUGIN_DEADLINE`], so the
//! plugin always answers or exits 1 with a message naming the call before the kubelet's
//! one-minute exec timeout.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use super::{EcrRegistry, PUBLIC_REGION, cache_duration, decode_token, parse_registry};
use crate::client::CallTimeouts;
use aws_config::{BehaviorVersion, Region};
use ccm_core::cloud_call::Deadline;
use ccm_core::credential::{
    self, AuthConfig, CacheKeyType, CredentialProviderRequest, CredentialProviderResponse,
};

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The bound on one request, credential lookup included: above the SDK's 30 s operation
/// timeout (which normally fires first), below the kubelet's one-minute exec timeout.
pub const PLUGIN_DEADLINE: Duration = Duration::from_secs(45);

/// The SDK config for `region` with the call timeouts.
async fn sdk_config(region: String, fips: bool) -> aws_config::SdkConfig {
    aws_config::defaults(BehaviorVersion::latest())
        .region(Region::new(region))
        .use_fips(fips)
        .timeout_config(CallTimeouts::default().timeout_config())
        .load()
        .await
}

async fn token(registry: &EcrRegistry) -> Result<(String, Option<SystemTime>), BoxError> {
    match registry {
        EcrRegistry::Private { region, fips, .. } => {
            let sdk = sdk_config(region.clone(), *fips).await;
            let resp =
                aws_sdk_ecr::Client::new(&sdk).get_authorization_token().send().await.map_err(
                    |e| {
                        format!(
                            "ecr:GetAuthorizationToken in {region}: {}",
                            aws_sdk_ecr::error::DisplayErrorContext(&e)
                        )
                    },
                )?;
            let data = resp
                .authorization_data()
                .first()
                .ok_or("ecr:GetAuthorizationToken returned no authorization data")?;
            let token =
                data.authorization_token().ok_or("ecr:GetAuthorizationToken returned no token")?;
            let expires = data.expires_at().and_then(|t| SystemTime::try_from(*t).ok());
            Ok((token.to_string(), expires))
        }
        EcrRegistry::Public => {
            let sdk = sdk_config(PUBLIC_REGION.to_string(), false).await;
            let resp = aws_sdk_ecrpublic::Client::new(&sdk)
                .get_authorization_token()
                .send()
                .await
                .map_err(|e| {
                    format!(
                        "ecr-public:GetAuthorizationToken: {}",
                        aws_sdk_ecrpublic::error::DisplayErrorContext(&e)
                    )
                })?;
            let data = resp
                .authorization_data()
                .ok_or("ecr-public:GetAuthorizationToken returned no authorization data")?;
            let token = data
                .authorization_token()
                .ok_or("ecr-public:GetAuthorizationToken returned no token")?;
            let expires = data.expires_at().and_then(|t| SystemTime::try_from(*t).ok());
            Ok((token.to_string(), expires))
        }
    }
}

async fn handle(req: &CredentialProviderRequest) -> Result<CredentialProviderResponse, BoxError> {
    let registry = parse_registry(&req.image).ok_or("the image is not in an ECR registry")?;
    let operation = match &registry {
        EcrRegistry::Private { .. } => "ecr:GetAuthorizationToken",
        EcrRegistry::Public => "ecr-public:GetAuthorizationToken",
    };
    let (token, expires) =
        Deadline::new(PLUGIN_DEADLINE).run(operation, token(&registry)).await??;
    let (username, password) = decode_token(&token)?;
    let host = credential::registry_of(&req.image).to_string();
    let auth = BTreeMap::from([(host, AuthConfig { username, password })]);
    let ttl = cache_duration(SystemTime::now(), expires);
    Ok(req.respond(CacheKeyType::Registry, Some(ttl), auth))
}

/// The plugin's `main`: one request on stdin, one response on stdout (exit 0), or a message
/// on stderr (exit 1).
pub fn main() -> ExitCode {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("ecr-credential-provider: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    credential::run(|req| rt.block_on(handle(req)))
}
