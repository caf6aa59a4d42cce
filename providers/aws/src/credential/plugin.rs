//! The `ecr-credential-provider` kubelet plugin (feature `ecr-credential-provider`; the
//! binary is built by `cmd/` with `--features provider-aws`).
//!
//! Reads a `CredentialProviderRequest` on stdin, gets an authorization token for the image's
//! registry (`ecr:GetAuthorizationToken` in the registry's region, or
//! `ecr-public:GetAuthorizationToken` in us-east-1 for ECR Public) with the SDK's default
//! credential chain, and answers with registry-scoped credentials cached for half the token's
//! remaining lifetime (not cached when the token has already expired).

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::SystemTime;

use super::{EcrRegistry, PUBLIC_REGION, cache_duration, decode_token, parse_registry};
use aws_config::{BehaviorVersion, Region};
use ccm_core::credential::{
    self, AuthConfig, CacheKeyType, CredentialProviderRequest, CredentialProviderResponse,
};

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

async fn token(registry: &EcrRegistry) -> Result<(String, Option<SystemTime>), BoxError> {
    match registry {
        EcrRegistry::Private { region, fips, .. } => {
            let sdk = aws_config::defaults(BehaviorVersion::latest())
                .region(Region::new(region.clone()))
                .use_fips(*fips)
                .load()
                .await;
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
            let sdk = aws_config::defaults(BehaviorVersion::latest())
                .region(Region::new(PUBLIC_REGION))
                .load()
                .await;
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
    let (token, expires) = token(&registry).await?;
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
