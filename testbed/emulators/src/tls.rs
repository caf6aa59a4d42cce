//! The HTTPS identity of an emulator: a serving certificate for `localhost`, `127.0.0.1` and
//! `::1` from a fresh testbed CA (`ccm_testbed::pki`), and that CA as PEM and as a file for a
//! provider's `caFile`. Also the upstream TLS client of the fault proxy.
//!
//! Optionally ([`TlsIdentity::generate_requiring_client_certs`], started with
//! [`crate::server::Server::start_with_tls`]) the server requires a client certificate (mutual
//! TLS) signed by a client CA of its own, and issues such certificates
//! ([`TlsIdentity::client_cert`]): a handshake without one, or with one from another CA, is
//! refused with rustls' alert (`CertificateRequired`, `UnknownCA`...). The default
//! ([`TlsIdentity::generate`]) asks for no client certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Making or using TLS material failed.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The testbed PKI failed.
    #[error("generating the emulator's certificate: {0}")]
    Pki(#[from] ccm_testbed::Error),
    /// A file could not be written or read.
    #[error("{what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The file.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// PEM material did not parse.
    #[error("{what}: {detail}")]
    Pem {
        /// Which material.
        what: &'static str,
        /// Why.
        detail: String,
    },
    /// rustls refused the configuration.
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    /// The client-certificate verifier could not be built.
    #[error("client-certificate verifier: {0}")]
    ClientVerifier(String),
}

/// A serving certificate and the CA that signed it.
pub struct TlsIdentity {
    /// PEM of the CA (what clients trust).
    pub ca_pem: String,
    config: Arc<rustls::ServerConfig>,
    ca_path: PathBuf,
    /// The PKI whose client CA signs the client certificates the server requires (None: no
    /// client certificate asked for).
    client_auth: Option<ccm_testbed::pki::Pki>,
    _dir: tempfile::TempDir,
}

impl std::fmt::Debug for TlsIdentity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsIdentity").field("ca_file", &self.ca_file()).finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

impl TlsIdentity {
    /// A fresh CA and serving certificate (SANs `localhost`, `127.0.0.1`, `::1`).
    pub fn generate() -> Result<TlsIdentity, TlsError> {
        Self::generate_with(false)
    }

    /// As [`TlsIdentity::generate`], and the server requires a client certificate signed by
    /// its own client CA ([`TlsIdentity::client_cert`] issues them): a client without one, or
    /// with one another CA signed, fails the handshake.
    pub fn generate_requiring_client_certs() -> Result<TlsIdentity, TlsError> {
        Self::generate_with(true)
    }

    /// Whether the server requires a client certificate.
    pub fn requires_client_certs(&self) -> bool {
        self.client_auth.is_some()
    }

    /// PEM of the CA that signs the client certificates the server accepts (None when it asks
    /// for none).
    pub fn client_ca_pem(&self) -> Option<String> {
        self.client_auth.as_ref().map(ccm_testbed::pki::Pki::client_ca_pem)
    }

    /// A client certificate and its PKCS#8 private key (both PEM) for `common_name`, signed by
    /// the client CA the server trusts; None when the server asks for no client certificate.
    pub fn client_cert(&self, common_name: &str) -> Result<Option<(String, String)>, TlsError> {
        let Some(pki) = &self.client_auth else { return Ok(None) };
        let id = ccm_testbed::pki::Identity::new(common_name, &[]);
        Ok(Some(pki.client_cert(&id)?))
    }

    fn generate_with(client_auth: bool) -> Result<TlsIdentity, TlsError> {
        let dir =
            tempfile::Builder::new().prefix("ccm-emulator-tls-").tempdir().map_err(|source| {
                TlsError::Io { what: "creating", path: std::env::temp_dir(), source }
            })?;
        let pki = ccm_testbed::pki::Pki::generate()?;
        pki.write_server_files(dir.path())?;
        let read = |name: &str| {
            let path = dir.path().join(name);
            std::fs::read(&path).map_err(|source| TlsError::Io { what: "reading", path, source })
        };
        let (cert, key) = (read("apiserver.crt")?, read("apiserver.key")?);
        // Only the CA file is kept on disk.
        for name in ["apiserver.key", "sa-signer.key", "sa-signer.pub", "client-ca.crt"] {
            let _ = std::fs::remove_file(dir.path().join(name));
        }
        let ca_pem = pki.server_ca_pem();
        let ca_path = dir.path().join("ca.crt");
        std::fs::write(&ca_path, &ca_pem).map_err(|source| TlsError::Io {
            what: "writing",
            path: ca_path.clone(),
            source,
        })?;
        let chain = CertificateDer::pem_slice_iter(&cert)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::Pem { what: "serving certificate", detail: e.to_string() })?;
        let key = PrivateKeyDer::from_pem_slice(&key)
            .map_err(|e| TlsError::Pem { what: "serving key", detail: e.to_string() })?;
        let builder = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()?;
        let config = if client_auth {
            let mut roots = rustls::RootCertStore::empty();
            for cert in CertificateDer::pem_slice_iter(pki.client_ca_pem().as_bytes()) {
                let cert =
                    cert.map_err(|e| TlsError::Pem { what: "client CA", detail: e.to_string() })?;
                roots.add(cert)?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider(),
            )
            .build()
            .map_err(|e| TlsError::ClientVerifier(e.to_string()))?;
            builder.with_client_cert_verifier(verifier).with_single_cert(chain, key)?
        } else {
            builder.with_no_client_auth().with_single_cert(chain, key)?
        };
        Ok(TlsIdentity {
            ca_pem,
            config: Arc::new(config),
            ca_path,
            client_auth: client_auth.then_some(pki),
            _dir: dir,
        })
    }

    /// The rustls server configuration.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.config.clone()
    }

    /// The CA as a PEM file (lives as long as this identity).
    pub fn ca_file(&self) -> &Path {
        &self.ca_path
    }
}

/// A TLS client configuration for the proxy's upstream: trusting only `ca_pem`, or (None)
/// accepting any certificate — the upstream is a loopback emulator with its own self-signed
/// certificate (vcsim), and the proxy carries no trust decision of the provider under test
/// (the testbed's one loopback client, `ccm_testbed::upstream::proxy::loopback_client_config`).
pub fn upstream_client_config(ca_pem: Option<&str>) -> Result<rustls::ClientConfig, TlsError> {
    let Some(pem) = ca_pem else {
        return Ok(ccm_testbed::upstream::proxy::loopback_client_config()?);
    };
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(pem.as_bytes()) {
        let cert =
            cert.map_err(|e| TlsError::Pem { what: "upstream CA", detail: e.to_string() })?;
        roots.add(cert)?;
    }
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()?
        .with_root_certificates(roots)
        .with_no_client_auth())
}
