//! Credentials: which AAD identity the CCM (and `acr-credential-provider`) uses, as upstream
//! chooses it from `azure.json`:
//!
//! 1. workload identity (`useFederatedWorkloadIdentityExtension`, or `aadFederatedTokenFile`
//!    set): `azure_identity`'s `WorkloadIdentityCredential` (the projected service-account
//!    token exchanged at AAD);
//! 2. managed identity (`useManagedIdentityExtension`, `userAssignedIdentityID` for a
//!    user-assigned one): [`ImdsCredential`], IMDS's `/metadata/identity/oauth2/token`;
//! 3. a service principal's secret (`aadClientId` + `aadClientSecret`): `azure_identity`'s
//!    `ClientSecretCredential`;
//! 4. a service principal's certificate (`aadClientId` + `aadClientCertPath`):
//!    [`super::certificate`]'s signed client assertions (`azure_identity` 1.x signs them only
//!    through OpenSSL, which this project does not link).
//!
//! Managed identity is our own small credential because
//! `azure_identity` 1.x pins IMDS to `169.254.169.254`, which tests and node-local proxies
//! cannot reach; the protocol is the same. Every credential talks through the client's
//! HTTP client (so a private cloud's CA is trusted) and caches its token until five minutes
//! before it expires.

use std::sync::Arc;
use std::time::Duration;

use azure_core::cloud::{CloudConfiguration, CustomConfiguration};
use azure_core::credentials::{AccessToken, Secret, TokenCredential, TokenRequestOptions};
use azure_core::http::{ClientOptions as CoreOptions, RetryOptions};
use azure_core::time::OffsetDateTime;
use azure_identity::{
    ClientAssertionCredentialOptions, ClientSecretCredential, ClientSecretCredentialOptions,
    WorkloadIdentityCredential, WorkloadIdentityCredentialOptions,
};
use tokio::sync::Mutex;

use super::{ClientError, CloudEndpoints};
use crate::config::Config;

/// The identity `config` names, as an `azure_core` token credential.
pub fn token_credential(
    config: &Config,
    endpoints: &CloudEndpoints,
    http: &reqwest::Client,
    imds: &str,
) -> Result<Arc<dyn TokenCredential>, ClientError> {
    let setup = |what: &str, e: azure_core::Error| ClientError::Setup {
        message: format!("{what}: {}", super::cut(&e.to_string())),
    };
    let core_options = || {
        let mut custom = CustomConfiguration::default();
        custom.authority_host = endpoints.authority_host.clone();
        CoreOptions {
            retry: RetryOptions::none(),
            transport: Some(super::CappedTransport::transport(http, super::MAX_ARM_REPLY)),
            cloud: Some(Arc::new(CloudConfiguration::Custom(custom))),
            ..CoreOptions::default()
        }
    };
    let tenant = config.tenant_id.clone().filter(|t| !t.trim().is_empty());
    let client_id = config.aad_client_id.clone().filter(|t| !t.trim().is_empty());
    if config.use_federated_workload_identity_extension || config.aad_federated_token_file.is_some()
    {
        let token_file = config.aad_federated_token_file.clone().ok_or(ClientError::Config {
            key: "aadFederatedTokenFile",
            message:
                "workload identity needs the federated token file (or AZURE_FEDERATED_TOKEN_FILE)"
                    .into(),
        })?;
        let options = WorkloadIdentityCredentialOptions {
            credential_options: ClientAssertionCredentialOptions { client_options: core_options() },
            client_id: Some(client_id.ok_or(ClientError::Config {
                key: "aadClientId",
                message: "workload identity needs the client id (or AZURE_CLIENT_ID)".into(),
            })?),
            tenant_id: Some(tenant.ok_or(ClientError::Config {
                key: "tenantId",
                message: "required for workload identity".into(),
            })?),
            token_file_path: Some(token_file.into()),
        };
        let cred = WorkloadIdentityCredential::new(Some(options))
            .map_err(|e| setup("workload identity", e))?;
        return Ok(cred);
    }
    if config.use_managed_identity_extension {
        return Ok(Arc::new(ImdsCredential::new(
            http.clone(),
            imds,
            config.user_assigned_identity_id.clone().filter(|s| !s.trim().is_empty()),
        )));
    }
    if let Some(secret) = config.aad_client_secret.clone().filter(|s| !s.is_empty()) {
        let tenant = tenant.ok_or(ClientError::Config {
            key: "tenantId",
            message: "required with aadClientSecret".into(),
        })?;
        let client_id = client_id.ok_or(ClientError::Config {
            key: "aadClientId",
            message: "required with aadClientSecret".into(),
        })?;
        let options = ClientSecretCredentialOptions { client_options: core_options() };
        let cred =
            ClientSecretCredential::new(&tenant, client_id, Secret::new(secret), Some(options))
                .map_err(|e| setup("client secret credential", e))?;
        return Ok(cred);
    }
    if let Some(path) = config.aad_client_cert_path.as_deref().filter(|p| !p.trim().is_empty()) {
        let tenant = tenant.ok_or(ClientError::Config {
            key: "tenantId",
            message: "required with aadClientCertPath".into(),
        })?;
        let client_id = client_id.ok_or(ClientError::Config {
            key: "aadClientId",
            message: "required with aadClientCertPath".into(),
        })?;
        let certificate = super::certificate::ClientCertificate::load(
            path,
            config.aad_client_cert_password.as_deref(),
        )?;
        return super::certificate::credential(
            &tenant,
            &client_id,
            Arc::new(certificate),
            &endpoints.authority_host,
            ClientAssertionCredentialOptions { client_options: core_options() },
        );
    }
    Err(ClientError::Config {
        key: "aadClientSecret",
        message: "no credentials: set useManagedIdentityExtension, useFederatedWorkloadIdentityExtension, or aadClientId with aadClientSecret or aadClientCertPath".into(),
    })
}

/// The identity's credential in the network tenant (`networkResourceTenantID`, another
/// tenant than `tenantId`), as upstream builds it: the same service principal asked of that
/// tenant, with what logs it in to `tenantId` — its secret (`aadClientSecret`), else its
/// certificate (`aadClientCertPath`, a client assertion signed with the same key). Managed
/// and workload identity cannot get another tenant's token (upstream needs a Key Vault
/// `auxiliaryTokenProvider` for managed identity, and ignores the network tenant with
/// workload identity): refused naming the key.
pub fn network_credential(
    config: &Config,
    tenant: &str,
    endpoints: &CloudEndpoints,
    http: &reqwest::Client,
) -> Result<Arc<dyn TokenCredential>, ClientError> {
    let refuse = |message: &str| ClientError::Config {
        key: "networkResourceTenantID",
        message: message.to_string(),
    };
    if config.use_federated_workload_identity_extension || config.aad_federated_token_file.is_some()
    {
        return Err(refuse(
            "another network tenant needs a service principal (aadClientId with aadClientSecret or aadClientCertPath): workload identity gets tokens of tenantId only",
        ));
    }
    if config.use_managed_identity_extension {
        return Err(refuse(
            "another network tenant needs a service principal (aadClientId with aadClientSecret or aadClientCertPath): a managed identity gets tokens of its own tenant only (upstream's Key Vault auxiliaryTokenProvider is not supported)",
        ));
    }
    let mut custom = CustomConfiguration::default();
    custom.authority_host = endpoints.authority_host.clone();
    let client_options = CoreOptions {
        retry: RetryOptions::none(),
        transport: Some(super::CappedTransport::transport(http, super::MAX_ARM_REPLY)),
        cloud: Some(Arc::new(CloudConfiguration::Custom(custom))),
        ..CoreOptions::default()
    };
    let client_id = |with: &str| {
        config.aad_client_id.clone().filter(|t| !t.trim().is_empty()).ok_or(ClientError::Config {
            key: "aadClientId",
            message: format!("required with {with}"),
        })
    };
    // The same order as the primary credential: the secret first, else the certificate.
    if let Some(secret) = config.aad_client_secret.clone().filter(|s| !s.is_empty()) {
        let client_id = client_id("aadClientSecret")?;
        let options = ClientSecretCredentialOptions { client_options };
        let cred =
            ClientSecretCredential::new(tenant, client_id, Secret::new(secret), Some(options))
                .map_err(|e| ClientError::Setup {
                    message: format!(
                        "client secret credential for the network tenant: {}",
                        super::cut(&e.to_string())
                    ),
                })?;
        return Ok(cred);
    }
    if let Some(path) = config.aad_client_cert_path.as_deref().filter(|p| !p.trim().is_empty()) {
        let client_id = client_id("aadClientCertPath")?;
        let certificate = super::certificate::ClientCertificate::load(
            path,
            config.aad_client_cert_password.as_deref(),
        )?;
        return super::certificate::credential(
            tenant,
            &client_id,
            Arc::new(certificate),
            &endpoints.authority_host,
            ClientAssertionCredentialOptions { client_options },
        );
    }
    Err(refuse(
        "another network tenant needs a service principal: aadClientId with aadClientSecret or aadClientCertPath",
    ))
}

/// Managed identity through IMDS (`GET {imds}/metadata/identity/oauth2/token` with
/// `Metadata: true`), token cached per resource until five minutes before it expires.
pub struct ImdsCredential {
    http: reqwest::Client,
    endpoint: String,
    client_id: Option<String>,
    cache: Mutex<Vec<(String, AccessToken)>>,
}

impl std::fmt::Debug for ImdsCredential {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImdsCredential").field("endpoint", &self.endpoint).finish_non_exhaustive()
    }
}

impl ImdsCredential {
    /// A credential asking IMDS at `imds` (base URL) for the system-assigned identity, or the
    /// user-assigned one with `client_id`.
    pub fn new(http: reqwest::Client, imds: &str, client_id: Option<String>) -> ImdsCredential {
        ImdsCredential {
            http,
            endpoint: format!("{}/metadata/identity/oauth2/token", imds.trim_end_matches('/')),
            client_id,
            cache: Mutex::new(Vec::new()),
        }
    }

    async fn fetch(&self, resource: &str) -> Result<AccessToken, String> {
        #[derive(serde::Deserialize)]
        struct Reply {
            access_token: String,
            #[serde(default)]
            expires_in: Option<serde_json::Value>,
            #[serde(default)]
            expires_on: Option<serde_json::Value>,
        }
        let mut query = vec![("api-version", "2018-02-01"), ("resource", resource)];
        if let Some(id) = &self.client_id {
            // A user-assigned identity named by its ARM resource ID goes as `msi_res_id`, by
            // its client id as `client_id` (as upstream).
            if id.starts_with("/subscriptions/") {
                query.push(("msi_res_id", id));
            } else {
                query.push(("client_id", id));
            }
        }
        let reply = tokio::time::timeout(
            Duration::from_secs(30),
            self.http.get(&self.endpoint).header("Metadata", "true").query(&query).send(),
        )
        .await
        .map_err(|_| "managed identity: IMDS did not answer within 30s".to_string())?
        .map_err(|e| format!("managed identity: IMDS token request failed: {}", e.without_url()))?;
        let status = reply.status();
        let body = super::read_capped(reply, super::MAX_IMDS_REPLY)
            .await
            .map_err(|e| format!("managed identity: IMDS's reply: {e}"))?;
        if !status.is_success() {
            #[derive(serde::Deserialize)]
            struct Err {
                #[serde(default)]
                error: String,
                #[serde(default)]
                error_description: String,
            }
            let detail = serde_json::from_slice::<Err>(&body)
                .map(|e| format!("{}: {}", e.error, super::cut(&e.error_description)))
                .unwrap_or_default();
            return Err(format!("managed identity: IMDS answered HTTP {status} {detail}"));
        }
        let r: Reply = serde_json::from_slice(&body)
            .map_err(|e| format!("managed identity: IMDS's token reply does not parse: {e}"))?;
        let num = |v: &Option<serde_json::Value>| -> Option<i64> {
            match v {
                Some(serde_json::Value::String(s)) => s.parse().ok(),
                Some(serde_json::Value::Number(n)) => n.as_i64(),
                _ => None,
            }
        };
        let now = OffsetDateTime::now_utc();
        let expires_on = num(&r.expires_on)
            .and_then(|t| OffsetDateTime::from_unix_timestamp(t).ok())
            .or_else(|| num(&r.expires_in).map(|s| now + azure_core::time::Duration::seconds(s)))
            .unwrap_or(now + azure_core::time::Duration::minutes(10));
        Ok(AccessToken::new(r.access_token, expires_on))
    }
}

#[async_trait::async_trait]
impl TokenCredential for ImdsCredential {
    async fn get_token(
        &self,
        scopes: &[&str],
        _options: Option<TokenRequestOptions<'_>>,
    ) -> azure_core::Result<AccessToken> {
        let scope = scopes.first().copied().unwrap_or_default();
        let resource = scope.strip_suffix("/.default").unwrap_or(scope).to_string();
        let mut cache = self.cache.lock().await;
        let fresh = OffsetDateTime::now_utc() + azure_core::time::Duration::minutes(5);
        if let Some((_, t)) = cache.iter().find(|(r, t)| *r == resource && t.expires_on > fresh) {
            return Ok(t.clone());
        }
        let token = self.fetch(&resource).await.map_err(|m| {
            azure_core::Error::with_message(azure_core::error::ErrorKind::Credential, m)
        })?;
        cache.retain(|(r, _)| *r != resource);
        cache.push((resource, token.clone()));
        Ok(token)
    }
}
