//! Certificates for the local control plane, generated fresh for every run.
//!
//! Three authorities, as envtest uses: one signs the apiserver's serving certificate, one
//! key signs service-account tokens, and one (the client CA) issues a client certificate for
//! any identity, with the user as CN and each group as an O attribute, which is how the
//! apiserver's x509 authenticator reads them.

use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

use crate::Error;

/// A Kubernetes identity: user name and groups, as the apiserver's authenticator sees them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Identity {
    /// The user name (certificate CN).
    pub user: String,
    /// The groups (certificate O attributes). At most two: see [`Identity::new`].
    pub groups: Vec<String>,
}

/// The OID of the X.520 organizationName attribute. rcgen keys distinguished-name entries
/// by type, so a second O attribute is written under its raw OID.
const ORGANIZATION_OID: [u64; 4] = [2, 5, 4, 10];

impl Identity {
    /// An identity with the given user name and groups.
    ///
    /// Client certificates carry groups as O attributes; this harness can write two of them,
    /// which covers every identity the CCM tests use. More than two is refused by
    /// [`Pki::client_cert`] with an error naming the identity.
    pub fn new(user: impl Into<String>, groups: &[&str]) -> Self {
        Identity { user: user.into(), groups: groups.iter().map(|g| (*g).to_string()).collect() }
    }

    /// The admin identity, a member of `system:masters`.
    pub fn admin() -> Self {
        Identity::new(crate::ADMIN_USER, &[crate::ADMIN_GROUP])
    }
}

/// The generated authorities of one control plane.
pub struct Pki {
    server_ca: CertifiedIssuer<'static, KeyPair>,
    serving_cert_pem: String,
    serving_key_pem: String,
    sa_key_pem: String,
    sa_pub_pem: String,
    client_ca: CertifiedIssuer<'static, KeyPair>,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Pki { .. }")
    }
}

fn ca(cn: &str) -> Result<CertifiedIssuer<'static, KeyPair>, rcgen::Error> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.distinguished_name = DistinguishedName::new();
    params.distinguished_name.push(DnType::CommonName, cn);
    params.distinguished_name.push(DnType::OrganizationName, "ccm-testbed");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    CertifiedIssuer::self_signed(params, KeyPair::generate()?)
}

impl Pki {
    /// Generates the authorities and the apiserver's serving certificate
    /// (SANs: localhost, 127.0.0.1, ::1).
    pub fn generate() -> Result<Pki, Error> {
        let server_ca = ca("ccm-testbed-server-ca")?;
        let client_ca = ca("ccm-testbed-client-ca")?;

        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name.push(DnType::CommonName, "localhost");
        params.subject_alt_names = vec![
            SanType::DnsName("localhost".try_into()?),
            SanType::IpAddress(std::net::Ipv4Addr::LOCALHOST.into()),
            SanType::IpAddress(std::net::Ipv6Addr::LOCALHOST.into()),
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages =
            vec![KeyUsagePurpose::DigitalSignature, KeyUsagePurpose::KeyEncipherment];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &server_ca)?;

        let sa_key = KeyPair::generate()?;
        Ok(Pki {
            serving_cert_pem: cert.pem(),
            serving_key_pem: key.serialize_pem(),
            sa_key_pem: sa_key.serialize_pem(),
            sa_pub_pem: sa_key.public_key_pem(),
            server_ca,
            client_ca,
        })
    }

    /// PEM of the CA that signed the serving certificate (goes into kubeconfigs).
    pub fn server_ca_pem(&self) -> String {
        self.server_ca.pem()
    }

    /// PEM of the client CA (the apiserver's `--client-ca-file`).
    pub fn client_ca_pem(&self) -> String {
        self.client_ca.pem()
    }

    /// Writes `apiserver.crt/key`, `client-ca.crt` and `sa-signer.key/pub` into `dir`.
    pub fn write_server_files(&self, dir: &Path) -> Result<(), Error> {
        for (name, contents) in [
            ("apiserver.crt", &self.serving_cert_pem),
            ("apiserver.key", &self.serving_key_pem),
            ("client-ca.crt", &self.client_ca_pem()),
            ("sa-signer.key", &self.sa_key_pem),
            ("sa-signer.pub", &self.sa_pub_pem),
        ] {
            crate::write_file(&dir.join(name), contents)?;
        }
        Ok(())
    }

    /// A client certificate and key (PEM) for `id`, signed by the client CA.
    pub fn client_cert(&self, id: &Identity) -> Result<(String, String), Error> {
        if id.groups.len() > 2 {
            return Err(Error::Identity {
                user: id.user.clone(),
                detail: format!(
                    "{} groups requested; the testbed's client certificates carry at most 2",
                    id.groups.len()
                ),
            });
        }
        let mut params = CertificateParams::new(Vec::<String>::new())?;
        params.distinguished_name = DistinguishedName::new();
        params.distinguished_name.push(DnType::CommonName, id.user.as_str());
        if let Some(g) = id.groups.first() {
            params.distinguished_name.push(DnType::OrganizationName, g.as_str());
        }
        if let Some(g) = id.groups.get(1) {
            params
                .distinguished_name
                .push(DnType::CustomDnType(ORGANIZATION_OID.to_vec()), g.as_str());
        }
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate()?;
        let cert = params.signed_by(&key, &self.client_ca)?;
        Ok((cert.pem(), key.serialize_pem()))
    }
}
