//! TLS policy of the serving ports: `--tls-min-version` and `--tls-cipher-suites` (and their
//! `--webhook-` twins) mapped from upstream's Go names onto rustls, and refused at start when
//! rustls cannot honour them.
//!
//! - Versions: `VersionTLS12` (TLS 1.2 and 1.3) and `VersionTLS13` (1.3 only). Go's
//!   `VersionTLS10` / `VersionTLS11` exist upstream but rustls implements only TLS 1.2+, so they
//!   are refused with a message saying so. Unknown names get upstream's `unknown tls version`.
//! - Cipher suites: the TLS 1.2 ECDHE AEAD suites (AES-GCM, ChaCha20-Poly1305) are honoured.
//!   Go names rustls does not implement (RSA key exchange, CBC, 3DES, RC4) are refused naming
//!   the suite; unknown names get upstream's `Cipher suite %s not supported or doesn't exist`.
//!   As in Go, TLS 1.3 suites are not configurable: TLS 1.3 names are accepted and every TLS 1.3
//!   suite stays enabled; a list without any TLS 1.2 suite therefore serves TLS 1.3 only.
//! - Curves (`--tls-curve-preferences`): Go names (`X25519`, `CurveP256`, `CurveP384`,
//!   `X25519MLKEM768`) or decimal curve IDs, offered in the given order. `CurveP521` is refused
//!   (rustls does not implement it).
//! - SNI certificates (`--tls-sni-cert-key`): `cert,key` or `cert,key:name1,name2`, parsed and
//!   checked here; loaded and served by `serving`.

use std::sync::Arc;

use rustls::{CipherSuite, NamedGroup, SupportedProtocolVersion};

/// A validated TLS policy (default: TLS 1.2+ with rustls' default suites).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsPolicy {
    /// Only TLS 1.3 (`VersionTLS13`).
    pub tls13_only: bool,
    /// The TLS 1.2 suites allowed; `None` keeps rustls' defaults.
    pub tls12_suites: Option<Vec<CipherSuite>>,
    /// Key-exchange groups in preference order; `None` keeps rustls' defaults.
    pub kx_groups: Option<Vec<NamedGroup>>,
    /// Certificates chosen by SNI (`--tls-sni-cert-key`).
    pub sni: Vec<SniCertKey>,
}

/// One `--tls-sni-cert-key` value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SniCertKey {
    /// PEM certificate (chain) file.
    pub cert_file: String,
    /// PEM key file.
    pub key_file: String,
    /// Explicit names (lower-case; `*.` prefix for wildcards); empty: the certificate's names.
    pub names: Vec<String>,
}

/// Go curve names and IDs rustls (aws-lc-rs) implements.
const CURVES: &[(&str, u16, NamedGroup)] = &[
    ("CurveP256", 23, NamedGroup::secp256r1),
    ("CurveP384", 24, NamedGroup::secp384r1),
    ("X25519", 29, NamedGroup::X25519),
    ("X25519MLKEM768", 4588, NamedGroup::X25519MLKEM768),
];

/// Go's TLS 1.2 suite names rustls implements (k8s also accepts the two legacy ChaCha20 names).
const HONOURED: &[(&str, CipherSuite)] = &[
    (
        "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    ("TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256", CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256),
    ("TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384", CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
    (
        "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305",
        CipherSuite::TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
    ),
];

/// Go's TLS 1.3 suite names: accepted, not configurable (as in Go).
const TLS13_NAMES: &[&str] =
    &["TLS_AES_128_GCM_SHA256", "TLS_AES_256_GCM_SHA384", "TLS_CHACHA20_POLY1305_SHA256"];

/// Go suite names rustls does not implement.
const NOT_HONOURED: &[&str] = &[
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_256_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
    "TLS_ECDHE_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_RC4_128_SHA",
    "TLS_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA",
    "TLS_RSA_WITH_AES_256_CBC_SHA",
    "TLS_RSA_WITH_AES_128_CBC_SHA256",
    "TLS_RSA_WITH_AES_128_GCM_SHA256",
    "TLS_RSA_WITH_AES_256_GCM_SHA384",
    "TLS_ECDHE_ECDSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_RC4_128_SHA",
    "TLS_ECDHE_RSA_WITH_3DES_EDE_CBC_SHA",
    "TLS_ECDHE_ECDSA_WITH_AES_128_CBC_SHA256",
    "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA256",
];

impl TlsPolicy {
    /// Validates `--<prefix>tls-min-version` and `--<prefix>tls-cipher-suites`; errors name the
    /// flag.
    pub fn from_flags(
        prefix: &str,
        min_version: &str,
        cipher_suites: &[String],
    ) -> Result<TlsPolicy, String> {
        let tls13_only = match min_version.trim() {
            "" | "VersionTLS12" => false,
            "VersionTLS13" => true,
            v @ ("VersionTLS10" | "VersionTLS11") => {
                return Err(format!(
                    "--{prefix}tls-min-version: {v} is not supported: rustls implements only TLS 1.2 and 1.3 (use VersionTLS12 or VersionTLS13)"
                ));
            }
            other => {
                return Err(format!("--{prefix}tls-min-version: unknown tls version {other:?}"));
            }
        };
        let names: Vec<&str> =
            cipher_suites.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).collect();
        if names.is_empty() {
            return Ok(TlsPolicy { tls13_only, ..TlsPolicy::default() });
        }
        let mut suites = Vec::new();
        for name in names {
            if let Some((_, s)) = HONOURED.iter().find(|(n, _)| *n == name) {
                if !suites.contains(s) {
                    suites.push(*s);
                }
            } else if TLS13_NAMES.contains(&name) {
                continue;
            } else if NOT_HONOURED.contains(&name) {
                return Err(format!(
                    "--{prefix}tls-cipher-suites: cipher suite {name} is not supported by rustls (supported TLS 1.2 suites: {})",
                    HONOURED.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
                ));
            } else {
                return Err(format!(
                    "--{prefix}tls-cipher-suites: Cipher suite {name} not supported or doesn't exist"
                ));
            }
        }
        // Without any TLS 1.2 suite only TLS 1.3 can be negotiated (as Go).
        let tls13_only = tls13_only || suites.is_empty();
        Ok(TlsPolicy { tls13_only, tls12_suites: Some(suites), ..TlsPolicy::default() })
    }

    /// Adds `--<prefix>tls-curve-preferences` and `--<prefix>tls-sni-cert-key`; errors name
    /// the flag.
    pub fn with_curves_and_sni(
        mut self,
        prefix: &str,
        curves: &[String],
        sni: &[String],
    ) -> Result<TlsPolicy, String> {
        let names: Vec<&str> = curves.iter().map(|s| s.trim()).filter(|s| !s.is_empty()).collect();
        if !names.is_empty() {
            let mut groups = Vec::new();
            for name in names {
                let known = CURVES
                    .iter()
                    .find(|(n, id, _)| *n == name || name.parse::<u16>().ok() == Some(*id));
                match known {
                    Some((_, _, g)) => {
                        if !groups.contains(g) {
                            groups.push(*g);
                        }
                    }
                    None if name == "CurveP521" || name == "25" => {
                        return Err(format!(
                            "--{prefix}tls-curve-preferences: {name} is not supported by rustls (supported: CurveP256, CurveP384, X25519, X25519MLKEM768)"
                        ));
                    }
                    None => {
                        return Err(format!(
                            "--{prefix}tls-curve-preferences: unknown curve {name:?}"
                        ));
                    }
                }
            }
            self.kx_groups = Some(groups);
        }
        for value in sni.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
            let (files, names) = match value.split_once(':') {
                Some((f, n)) => (f, n),
                None => (value, ""),
            };
            let Some((cert, key)) = files.split_once(',') else {
                return Err(format!(
                    "--{prefix}tls-sni-cert-key: expected \"cert,key\" or \"cert,key:name,...\", got {value:?}"
                ));
            };
            if cert.trim().is_empty() || key.trim().is_empty() {
                return Err(format!(
                    "--{prefix}tls-sni-cert-key: empty certificate or key path in {value:?}"
                ));
            }
            self.sni.push(SniCertKey {
                cert_file: cert.trim().to_string(),
                key_file: key.trim().to_string(),
                names: names
                    .split(',')
                    .map(|n| n.trim().to_ascii_lowercase())
                    .filter(|n| !n.is_empty())
                    .collect(),
            });
        }
        Ok(self)
    }

    /// The crypto provider (aws-lc-rs) restricted to this policy's suites and curves.
    pub fn provider(&self) -> Arc<rustls::crypto::CryptoProvider> {
        let mut provider = rustls::crypto::aws_lc_rs::default_provider();
        if let Some(groups) = &self.kx_groups {
            provider.kx_groups = groups
                .iter()
                .filter_map(|g| {
                    rustls::crypto::aws_lc_rs::ALL_KX_GROUPS
                        .iter()
                        .find(|k| k.name() == *g)
                        .copied()
                })
                .collect();
        }
        provider.cipher_suites.retain(|s| match s {
            rustls::SupportedCipherSuite::Tls13(_) => true,
            rustls::SupportedCipherSuite::Tls12(_) => {
                !self.tls13_only
                    && self.tls12_suites.as_ref().is_none_or(|allowed| allowed.contains(&s.suite()))
            }
        });
        Arc::new(provider)
    }

    /// The protocol versions served.
    pub fn versions(&self) -> &'static [&'static SupportedProtocolVersion] {
        static TLS13_ONLY: &[&SupportedProtocolVersion] = &[&rustls::version::TLS13];
        if self.tls13_only { TLS13_ONLY } else { rustls::DEFAULT_VERSIONS }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn suites(s: &[&str]) -> Vec<String> {
        s.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn curves_and_sni_values_parse_like_upstream() {
        let p = TlsPolicy::default()
            .with_curves_and_sni(
                "",
                &suites(&["X25519", "23"]),
                &suites(&["a.crt,a.key", "b.crt,b.key:*.Foo.com,foo.com"]),
            )
            .unwrap();
        assert_eq!(p.kx_groups, Some(vec![NamedGroup::X25519, NamedGroup::secp256r1]));
        let groups: Vec<NamedGroup> = p.provider().kx_groups.iter().map(|k| k.name()).collect();
        assert_eq!(groups, vec![NamedGroup::X25519, NamedGroup::secp256r1]);
        assert_eq!(p.sni.len(), 2);
        assert!(p.sni[0].names.is_empty());
        assert_eq!(p.sni[1].names, vec!["*.foo.com", "foo.com"]);
        let e = TlsPolicy::default().with_curves_and_sni("", &suites(&["CurveP521"]), &[]);
        assert!(e.unwrap_err().contains("CurveP521 is not supported by rustls"));
        let e = TlsPolicy::default().with_curves_and_sni("webhook-", &[], &suites(&["only.crt"]));
        assert!(e.unwrap_err().starts_with("--webhook-tls-sni-cert-key"));
    }

    #[test]
    fn versions_map_and_old_ones_are_refused() {
        assert_eq!(TlsPolicy::from_flags("", "", &[]).unwrap(), TlsPolicy::default());
        assert!(!TlsPolicy::from_flags("", "VersionTLS12", &[]).unwrap().tls13_only);
        let p = TlsPolicy::from_flags("", "VersionTLS13", &[]).unwrap();
        assert!(p.tls13_only);
        assert_eq!(p.versions().len(), 1);
        let e = TlsPolicy::from_flags("", "VersionTLS10", &[]).unwrap_err();
        assert!(e.starts_with("--tls-min-version: VersionTLS10") && e.contains("rustls"), "{e}");
        let e = TlsPolicy::from_flags("webhook-", "VersionTLS11", &[]).unwrap_err();
        assert!(e.starts_with("--webhook-tls-min-version"), "{e}");
        let e = TlsPolicy::from_flags("", "TLS1.2", &[]).unwrap_err();
        assert_eq!(e, "--tls-min-version: unknown tls version \"TLS1.2\"");
    }

    #[test]
    fn suites_map_to_rustls_and_unsupported_ones_are_named() {
        let p = TlsPolicy::from_flags(
            "",
            "",
            &suites(&[
                "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256",
                "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305",
                "TLS_AES_128_GCM_SHA256",
            ]),
        )
        .unwrap();
        let provider = p.provider();
        let tls12: Vec<CipherSuite> = provider
            .cipher_suites
            .iter()
            .filter(|s| matches!(s, rustls::SupportedCipherSuite::Tls12(_)))
            .map(|s| s.suite())
            .collect();
        assert!(tls12.contains(&CipherSuite::TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256));
        assert!(tls12.contains(&CipherSuite::TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256));
        assert_eq!(tls12.len(), 2);
        assert_eq!(provider.cipher_suites.len(), 2 + 3, "all three TLS 1.3 suites stay");

        let e = TlsPolicy::from_flags("", "", &suites(&["TLS_RSA_WITH_AES_128_GCM_SHA256"]))
            .unwrap_err();
        assert!(
            e.starts_with("--tls-cipher-suites: cipher suite TLS_RSA_WITH_AES_128_GCM_SHA256 is not supported by rustls"),
            "{e}"
        );
        let e = TlsPolicy::from_flags("", "", &suites(&["TLS_NOPE"])).unwrap_err();
        assert_eq!(e, "--tls-cipher-suites: Cipher suite TLS_NOPE not supported or doesn't exist");
        // Only TLS 1.3 names: TLS 1.3 only.
        let p = TlsPolicy::from_flags("", "", &suites(&["TLS_AES_256_GCM_SHA384"])).unwrap();
        assert!(p.tls13_only);
    }
}
