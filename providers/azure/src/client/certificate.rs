//! A service principal's client certificate (`aadClientCertPath`, issue #33 item 9), as
//! upstream's `azidentity.ClientCertificateCredential`: the certificate and its RSA private
//! key are read once at start, and each token request carries a fresh JWT client assertion
//! signed with the key (RFC 7523 `private_key_jwt`, as AAD documents it):
//!
//! - header `{"alg": "RS256", "typ": "JWT", "x5t": <base64url SHA-1 of the certificate's DER>}`
//!   (the thumbprint AAD finds the registered certificate by);
//! - claims `aud` = the token endpoint (`<authority>/<tenant>/oauth2/v2.0/token`), `iss` =
//!   `sub` = the client id, `jti` random, `nbf` = `iat` = now, `exp` = now + 10 minutes;
//! - sent as `client_assertion` with `client_assertion_type
//!   urn:ietf:params:oauth:client-assertion-type:jwt-bearer` (`azure_identity`'s
//!   `ClientAssertionCredential`, which also caches the token).
//!
//! The file is PEM: one or more `CERTIFICATE` sections (the first is the one registered in
//! AAD) and an unencrypted RSA key (`PRIVATE KEY` or `RSA PRIVATE KEY`). Upstream also reads
//! PKCS#12 (`.pfx`) with `aadClientCertPassword`; this build has no PKCS#12 reader, so such a
//! file is refused at start naming `aadClientCertPath`, with the `openssl` command that
//! converts it. Every error names the key and what was wrong, never the key material.
//! Signing and hashing are `aws-lc-rs` (no OpenSSL: `azure_identity`'s own certificate
//! credential needs it).

use std::fmt;
use std::sync::Arc;

use aws_lc_rs::rand::{SecureRandom, SystemRandom};
use aws_lc_rs::signature::{RSA_PKCS1_SHA256, RsaKeyPair};
use azure_core::credentials::TokenCredential;
use azure_core::http::ClientMethodOptions;
use azure_identity::{
    ClientAssertion, ClientAssertionCredential, ClientAssertionCredentialOptions,
};
use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use rustls::pki_types::pem::{PemObject, SectionKind};

use super::ClientError;

/// The config key the certificate comes from (every error names it).
pub const KEY: &str = "aadClientCertPath";
/// How long an assertion is valid (AAD: keep it short, 5–10 minutes).
pub const ASSERTION_LIFETIME_SECS: i64 = 600;
/// The largest certificate file read.
const MAX_FILE: u64 = 1 << 20;

/// A certificate and its RSA key, ready to sign assertions.
pub struct ClientCertificate {
    key: RsaKeyPair,
    /// Base64url SHA-1 of the certificate's DER (the JWT's `x5t`).
    thumbprint: String,
    rng: SystemRandom,
}

impl fmt::Debug for ClientCertificate {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClientCertificate").field("x5t", &self.thumbprint).finish_non_exhaustive()
    }
}

fn refuse(message: impl Into<String>) -> ClientError {
    ClientError::Config { key: KEY, message: message.into() }
}

impl ClientCertificate {
    /// Reads the certificate file at `path` (see the module doc). `password` is
    /// `aadClientCertPassword` (only PKCS#12 files use one upstream).
    pub fn load(path: &str, password: Option<&str>) -> Result<ClientCertificate, ClientError> {
        let meta = std::fs::metadata(path)
            .map_err(|e| refuse(format!("cannot read the certificate file {path}: {e}")))?;
        if meta.len() > MAX_FILE {
            return Err(refuse(format!(
                "the certificate file {path} is larger than 1 MiB: not a certificate"
            )));
        }
        let data = std::fs::read(path)
            .map_err(|e| refuse(format!("cannot read the certificate file {path}: {e}")))?;
        ClientCertificate::from_bytes(&data, password)
            .map_err(|m| refuse(format!("certificate file {path}: {m}")))
    }

    /// Parses a certificate file's content. Errors say what is wrong, never quote it.
    pub fn from_bytes(data: &[u8], password: Option<&str>) -> Result<ClientCertificate, String> {
        let text = String::from_utf8_lossy(data);
        if !text.contains("-----BEGIN ") {
            // PKCS#12 is DER: a SEQUENCE.
            let pkcs12 = data.first() == Some(&0x30);
            return Err(if pkcs12 {
                format!(
                    "PKCS#12 (.pfx) certificates are not supported{}; convert it to PEM (certificate and unencrypted key in one file), e.g. `openssl pkcs12 -in sp.pfx -nodes -out sp.pem`",
                    if password.is_some_and(|p| !p.is_empty()) {
                        " (aadClientCertPassword is only used for them)"
                    } else {
                        ""
                    }
                )
            } else {
                "not a PEM file (expected CERTIFICATE and PRIVATE KEY sections)".into()
            });
        }
        if text.contains("ENCRYPTED PRIVATE KEY") || text.contains("Proc-Type: 4,ENCRYPTED") {
            return Err(
                "the private key is encrypted; upstream does not decrypt PEM keys either: store it unencrypted (e.g. `openssl pkey -in key.pem -out key-plain.pem`) and protect the file"
                    .into(),
            );
        }
        let mut certificate: Option<Vec<u8>> = None;
        let mut key: Option<RsaKeyPair> = None;
        let mut other_key = false;
        for section in <(SectionKind, Vec<u8>)>::pem_slice_iter(data) {
            let (kind, der) =
                section.map_err(|e| format!("the PEM does not parse: {}", pem_error(&e)))?;
            match kind {
                SectionKind::Certificate if certificate.is_none() => certificate = Some(der),
                SectionKind::PrivateKey if key.is_none() => match RsaKeyPair::from_pkcs8(&der) {
                    Ok(k) => key = Some(k),
                    Err(_) => other_key = true,
                },
                SectionKind::RsaPrivateKey if key.is_none() => {
                    key = Some(RsaKeyPair::from_der(&der).map_err(|_| {
                        "the RSA PRIVATE KEY section is not a valid RSA key".to_string()
                    })?);
                }
                SectionKind::EcPrivateKey => other_key = true,
                _ => {}
            }
        }
        let certificate = certificate.ok_or("no CERTIFICATE section")?;
        let key = key.ok_or(if other_key {
            "the private key is not an RSA key (AAD's certificate assertions are RS256)"
        } else {
            "no PRIVATE KEY (or RSA PRIVATE KEY) section"
        })?;
        let digest =
            aws_lc_rs::digest::digest(&aws_lc_rs::digest::SHA1_FOR_LEGACY_USE_ONLY, &certificate);
        Ok(ClientCertificate {
            key,
            thumbprint: URL_SAFE_NO_PAD.encode(digest.as_ref()),
            rng: SystemRandom::new(),
        })
    }

    /// The certificate's `x5t` thumbprint (base64url SHA-1 of its DER).
    pub fn thumbprint(&self) -> &str {
        &self.thumbprint
    }

    /// A signed client assertion for `client_id` at the token endpoint `audience`, valid
    /// from `now` (Unix seconds) for [`ASSERTION_LIFETIME_SECS`].
    pub fn assertion(&self, client_id: &str, audience: &str, now: i64) -> Result<String, String> {
        let mut jti = [0u8; 16];
        self.rng.fill(&mut jti).map_err(|_| "no random bytes for the assertion's jti")?;
        let jti: String = jti.iter().map(|b| format!("{b:02x}")).collect();
        let header = serde_json::json!({"alg": "RS256", "typ": "JWT", "x5t": self.thumbprint});
        let claims = serde_json::json!({
            "aud": audience,
            "iss": client_id,
            "sub": client_id,
            "jti": jti,
            "nbf": now,
            "iat": now,
            "exp": now + ASSERTION_LIFETIME_SECS,
        });
        let signing_input = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let mut signature = vec![0u8; self.key.public_modulus_len()];
        self.key
            .sign(&RSA_PKCS1_SHA256, &self.rng, signing_input.as_bytes(), &mut signature)
            .map_err(|_| "signing the client assertion failed")?;
        Ok(format!("{signing_input}.{}", URL_SAFE_NO_PAD.encode(signature)))
    }
}

fn pem_error(e: &rustls::pki_types::pem::Error) -> &'static str {
    use rustls::pki_types::pem::Error as E;
    match e {
        E::MissingSectionEnd { .. } => "a section has no END line",
        E::IllegalSectionStart { .. } => "a BEGIN line is malformed",
        E::Base64Decode(_) => "a section is not valid base64",
        _ => "malformed PEM",
    }
}

/// The assertion source `azure_identity` asks for each token.
struct Assertion {
    certificate: Arc<ClientCertificate>,
    client_id: String,
    audience: String,
}

impl fmt::Debug for Assertion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Assertion")
            .field("client_id", &self.client_id)
            .field("audience", &self.audience)
            .finish_non_exhaustive()
    }
}

#[async_trait::async_trait]
impl ClientAssertion for Assertion {
    async fn secret(
        &self,
        _options: Option<ClientMethodOptions<'_>>,
    ) -> azure_core::Result<String> {
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX - ASSERTION_LIFETIME_SECS))
            .unwrap_or(0);
        self.certificate.assertion(&self.client_id, &self.audience, now).map_err(|m| {
            azure_core::Error::with_message(
                azure_core::error::ErrorKind::Credential,
                format!("{KEY}: {m}"),
            )
        })
    }
}

/// The token endpoint `azure_identity` posts to for `tenant` at `authority_host` (the
/// assertion's audience).
pub fn token_endpoint(authority_host: &str, tenant: &str) -> String {
    format!("{}/{tenant}/oauth2/v2.0/token", authority_host.trim_end_matches('/'))
}

/// The service principal `client_id` of `tenant` signing in with `certificate`.
pub fn credential(
    tenant: &str,
    client_id: &str,
    certificate: Arc<ClientCertificate>,
    authority_host: &str,
    options: ClientAssertionCredentialOptions,
) -> Result<Arc<dyn TokenCredential>, ClientError> {
    let assertion = Assertion {
        certificate,
        client_id: client_id.to_string(),
        audience: token_endpoint(authority_host, tenant),
    };
    let cred = ClientAssertionCredential::new(
        tenant.to_string(),
        client_id.to_string(),
        assertion,
        Some(options),
    )
    .map_err(|e| ClientError::Setup {
        message: format!("client certificate credential: {}", super::cut(&e.to_string())),
    })?;
    Ok(cred)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    #[test]
    fn files_that_are_not_a_pem_certificate_and_rsa_key_are_refused_without_quoting_them() {
        let pfx = [0x30u8, 0x82, 0x0a, 0x1f, 0x02, 0x01, 0x03];
        let e = ClientCertificate::from_bytes(&pfx, Some("pw")).unwrap_err();
        assert!(e.contains("PKCS#12") && e.contains("aadClientCertPassword"), "{e}");
        let e = ClientCertificate::from_bytes(b"hello", None).unwrap_err();
        assert!(e.contains("not a PEM file"), "{e}");
        let secret_looking = "-----BEGIN ENCRYPTED PRIVATE KEY-----\nTUlJRXZRSUJBREFOQmdrcWhr\n-----END ENCRYPTED PRIVATE KEY-----\n";
        let e = ClientCertificate::from_bytes(secret_looking.as_bytes(), None).unwrap_err();
        assert!(e.contains("encrypted") && !e.contains("TUlJ"), "{e}");
        let cert_only = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n";
        let e = ClientCertificate::from_bytes(cert_only.as_bytes(), None).unwrap_err();
        assert!(e.contains("no PRIVATE KEY"), "{e}");
        let bad_key = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n-----BEGIN RSA PRIVATE KEY-----\nMIIBxyz1\n-----END RSA PRIVATE KEY-----\n";
        let e = ClientCertificate::from_bytes(bad_key.as_bytes(), None).unwrap_err();
        assert!(e.contains("not a valid RSA key") && !e.contains("MIIBxyz1"), "{e}");
        let e = ClientCertificate::load("/nonexistent/sp.pem", None).unwrap_err().to_string();
        assert!(e.contains(KEY) && e.contains("/nonexistent/sp.pem"), "{e}");
    }

    #[test]
    fn the_token_endpoint_is_the_authoritys_v2_endpoint() {
        assert_eq!(
            token_endpoint("https://login.microsoftonline.com/", "t1"),
            "https://login.microsoftonline.com/t1/oauth2/v2.0/token"
        );
    }
}
