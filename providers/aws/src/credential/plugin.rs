//! The `ecr-credential-provider` kubelet plugin (feature `ecr-credential-provider`; the
//! binary is built by `cmd/` with `--features provider-aws`).
//!
//! Reads a `CredentialProviderRequest` on stdin, gets an authorization token for the image's
//! registry (`ecr:GetAuthorizationToken` in the registry's region — the default region for a
//! host that is not a known ECR name, as upstream — or `ecr-public:GetAuthorizationToken` in
//! us-east-1 for ECR Public) and answers with registry-scoped credentials cached for half the
//! token's remaining lifetime (not cached when the token has already expired).
//!
//! Credentials: the SDK's default chain; or, when the kubelet sends a service-account token
//! (KEP-4412, `tokenAttributes` in its credential-provider config), the role named by the
//! service account's `eks.amazonaws.com/ecr-role-arn` annotation (else `AWS_ECR_ROLE_ARN`),
//! assumed with STS `AssumeRoleWithWebIdentity` and that token, as upstream (session name
//! `ecr-credential-provider`, STS in the registry's region). A token without a role uses the
//! default chain.
//!
//! No call hangs: the ECR and STS clients carry the provider's [`CallTimeouts`] (connect 5 s,
//! attempt 10 s, operation 30 s), and the whole request is bounded by [`PLUGIN_DEADLINE`], so
//! the plugin always answers or exits 1 with a message naming the call before the kubelet's
//! one-minute exec timeout.

use std::collections::BTreeMap;
use std::process::ExitCode;
use std::time::{Duration, SystemTime};

use super::{EcrRegistry, PUBLIC_REGION, cache_duration, decode_token, parse_registry};
use crate::client::CallTimeouts;
use aws_config::{BehaviorVersion, Region};
use aws_credential_types::Credentials;
use aws_credential_types::provider::SharedCredentialsProvider;
use ccm_core::cloud_call::Deadline;
use ccm_core::credential::{
    self, AuthConfig, CacheKeyType, CredentialProviderRequest, CredentialProviderResponse,
};

type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// The bound on one request, credential lookup included: above the SDK's 30 s operation
/// timeout (which normally fires first), below the kubelet's one-minute exec timeout.
pub const PLUGIN_DEADLINE: Duration = Duration::from_secs(45);

/// The service-account annotation naming the role to assume with the kubelet's token.
pub const ROLE_ANNOTATION: &str = "eks.amazonaws.com/ecr-role-arn";
/// The environment variable naming that role when the annotation is absent.
pub const ROLE_ENV: &str = "AWS_ECR_ROLE_ARN";
/// The STS session name of those sessions.
pub const SESSION_NAME: &str = "ecr-credential-provider";

/// The SDK config for `region` (`None`: the default chain's) with the call timeouts, from
/// `base` when given (tests: moto's endpoint and static keys), else the default chain.
async fn sdk_config(
    base: Option<&aws_config::SdkConfig>,
    region: Option<String>,
    fips: bool,
) -> aws_config::SdkConfig {
    let timeouts = CallTimeouts::default().timeout_config();
    match base {
        Some(base) => {
            let mut b = base.to_builder().use_fips(fips).timeout_config(timeouts);
            if let Some(region) = region {
                b = b.region(Region::new(region));
            }
            b.build()
        }
        None => {
            let mut loader = aws_config::defaults(BehaviorVersion::latest())
                .use_fips(fips)
                .timeout_config(timeouts);
            if let Some(region) = region {
                loader = loader.region(Region::new(region));
            }
            loader.load().await
        }
    }
}

/// The role to assume with the kubelet's service-account token, if it sent one and a role is
/// named.
fn web_identity_role(req: &CredentialProviderRequest) -> Option<(String, String)> {
    let token = req.service_account_token.as_deref().filter(|t| !t.is_empty())?;
    let role = req
        .service_account_annotations
        .as_ref()
        .and_then(|a| a.get(ROLE_ANNOTATION).cloned())
        .or_else(|| std::env::var(ROLE_ENV).ok())
        .filter(|r| !r.trim().is_empty());
    match role {
        Some(role) => Some((role, token.to_string())),
        None => {
            tracing::info!(
                "a service-account token was sent but no role is named ({ROLE_ANNOTATION} or {ROLE_ENV}); using the default credentials"
            );
            None
        }
    }
}

/// Credentials for `role` from STS `AssumeRoleWithWebIdentity` with `token`.
async fn assume_with_token(
    sdk: &aws_config::SdkConfig,
    role: &str,
    token: &str,
) -> Result<Credentials, BoxError> {
    let resp = aws_sdk_sts::Client::new(sdk)
        .assume_role_with_web_identity()
        .role_arn(role)
        .role_session_name(SESSION_NAME)
        .web_identity_token(token)
        .send()
        .await
        .map_err(|e| {
            format!(
                "sts:AssumeRoleWithWebIdentity {role}: {}",
                aws_sdk_sts::error::DisplayErrorContext(&e)
            )
        })?;
    let c = resp.credentials().ok_or("sts:AssumeRoleWithWebIdentity returned no credentials")?;
    Ok(Credentials::new(
        c.access_key_id(),
        c.secret_access_key(),
        Some(c.session_token().to_string()),
        SystemTime::try_from(*c.expiration()).ok(),
        "AssumeRoleWithWebIdentity",
    ))
}

async fn token(
    req: &CredentialProviderRequest,
    registry: &EcrRegistry,
    base: Option<&aws_config::SdkConfig>,
) -> Result<(String, Option<SystemTime>), BoxError> {
    let (region, fips) = match registry {
        EcrRegistry::Private { region, fips, .. } => (Some(region.clone()), *fips),
        EcrRegistry::Public => (Some(PUBLIC_REGION.to_string()), false),
        EcrRegistry::DefaultRegion => {
            tracing::warn!(
                "the image's host is not a known ECR registry name; asking ECR in the default region"
            );
            (None, false)
        }
    };
    let mut sdk = sdk_config(base, region.clone(), fips).await;
    if let Some((role, sa_token)) = web_identity_role(req) {
        // STS in the registry's region (the default one for ECR Public), as upstream.
        let sts_region = match registry {
            EcrRegistry::Public => None,
            _ => region,
        };
        let sts_sdk = sdk_config(base, sts_region, false).await;
        let creds = assume_with_token(&sts_sdk, &role, &sa_token).await?;
        sdk = sdk.to_builder().credentials_provider(SharedCredentialsProvider::new(creds)).build();
    }
    match registry {
        EcrRegistry::Private { .. } | EcrRegistry::DefaultRegion => {
            let where_ = sdk.region().map(|r| r.to_string()).unwrap_or_else(|| "?".into());
            let resp =
                aws_sdk_ecr::Client::new(&sdk).get_authorization_token().send().await.map_err(
                    |e| {
                        format!(
                            "ecr:GetAuthorizationToken in {where_}: {}",
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
    handle_with(req, None).await
}

/// Answers one request; `base` replaces the SDK's default chain (tests: moto's endpoint and
/// static keys), `None` is production.
pub async fn handle_with(
    req: &CredentialProviderRequest,
    base: Option<&aws_config::SdkConfig>,
) -> Result<CredentialProviderResponse, BoxError> {
    if req.image.trim().is_empty() {
        return Err("the request names no image".into());
    }
    let registry = parse_registry(&req.image).unwrap_or(EcrRegistry::DefaultRegion);
    let operation = match &registry {
        EcrRegistry::Private { .. } | EcrRegistry::DefaultRegion => "ecr:GetAuthorizationToken",
        EcrRegistry::Public => "ecr-public:GetAuthorizationToken",
    };
    let (token, expires) =
        Deadline::new(PLUGIN_DEADLINE).run(operation, token(req, &registry, base)).await??;
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
