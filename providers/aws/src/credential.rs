//! `ecr-credential-provider`: which registries are ECR, how an authorization token decodes,
//! and how long the kubelet may cache it; the plugin itself is [`plugin`] (feature
//! `ecr-credential-provider`).
//!
//! Private registries are `<12-digit account>.dkr.ecr[-fips].<region>.<domain>` (also with
//! `dkr-ecr`), the domain one of upstream's: `amazonaws.com`, `amazonaws.com.cn`,
//! `amazonaws.eu`, the dual-stack `on.aws` and `on.amazonwebservices.com.cn`, and the isolated
//! partitions'; public ones are `public.ecr.aws` and `ecr-public.aws.com`, served by
//! `ecr-public` in `us-east-1`. Any other host is asked of private ECR in the default region
//! (the SDK's: `AWS_REGION`, the profile, instance metadata), as upstream: the kubelet only
//! calls the plugin for images its `matchImages` list sends here. The cache duration is half
//! the token's remaining lifetime; a token that has already expired (moto returns one from
//! 2015) is not cached at all.

use std::time::{Duration, SystemTime};

use base64::Engine;

#[cfg(feature = "ecr-credential-provider")]
pub mod plugin;

/// Partition domains of private ECR registries.
const PRIVATE_DOMAINS: &[&str] = &[
    "amazonaws.com",
    "amazonaws.com.cn",
    "amazonaws.eu",
    "on.aws",
    "on.amazonwebservices.com.cn",
    "sc2s.sgov.gov",
    "c2s.ic.gov",
    "cloud.adc-e.uk",
    "csp.hci.ic.gov",
];
/// Hosts of ECR Public.
pub const PUBLIC_HOSTS: &[&str] = &["public.ecr.aws", "ecr-public.aws.com"];
/// The region ECR Public tokens come from.
pub const PUBLIC_REGION: &str = "us-east-1";

/// An ECR registry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EcrRegistry {
    /// A private registry.
    Private {
        /// The 12-digit account ID.
        account: String,
        /// The region.
        region: String,
        /// A FIPS endpoint.
        fips: bool,
    },
    /// ECR Public.
    Public,
    /// A host that is not a known ECR name: private ECR in the default region, as upstream.
    DefaultRegion,
}

/// The ECR registry of an image or registry host (`host[:port]/path...`), if it is one.
pub fn parse_registry(image: &str) -> Option<EcrRegistry> {
    let image = image.split_once("://").map(|(_, r)| r).unwrap_or(image);
    let host = image.split('/').next().unwrap_or(image);
    let host = host.split(':').next().unwrap_or(host).to_ascii_lowercase();
    if PUBLIC_HOSTS.contains(&host.as_str()) {
        return Some(EcrRegistry::Public);
    }
    let (account, rest) = host.split_once('.')?;
    if account.len() != 12 || !account.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let (fips, rest) = if let Some(r) =
        rest.strip_prefix("dkr.ecr-fips.").or(rest.strip_prefix("dkr-ecr-fips."))
    {
        (true, r)
    } else if let Some(r) = rest.strip_prefix("dkr.ecr.").or(rest.strip_prefix("dkr-ecr.")) {
        (false, r)
    } else {
        return None;
    };
    let (region, domain) = rest.split_once('.')?;
    // Upstream's region pattern: an alphanumeric, then alphanumerics, '-' and '_'.
    let region_ok = region.bytes().next().is_some_and(|b| b.is_ascii_alphanumeric())
        && region.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    (region_ok && PRIVATE_DOMAINS.contains(&domain)).then(|| EcrRegistry::Private {
        account: account.to_string(),
        region: region.to_string(),
        fips,
    })
}

/// A token that could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum TokenError {
    /// Not base64.
    #[error("the ECR authorization token is not valid base64")]
    NotBase64,
    /// Not `user:password`.
    #[error("the ECR authorization token is not of the form user:password")]
    NoSeparator,
}

/// Decodes an ECR authorization token (`base64("AWS:<password>")`) into user and password.
pub fn decode_token(token: &str) -> Result<(String, String), TokenError> {
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .map_err(|_| TokenError::NotBase64)?;
    let text = String::from_utf8(raw).map_err(|_| TokenError::NotBase64)?;
    let (user, password) = text.split_once(':').ok_or(TokenError::NoSeparator)?;
    Ok((user.to_string(), password.to_string()))
}

/// How long the kubelet may cache a token expiring at `expires_at`: half the remaining
/// lifetime, or zero (do not cache) when it has expired or the expiry is unknown.
pub fn cache_duration(now: SystemTime, expires_at: Option<SystemTime>) -> Duration {
    match expires_at.and_then(|e| e.duration_since(now).ok()) {
        Some(left) => left / 2,
        None => Duration::ZERO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn private_and_public_registries() {
        assert_eq!(
            parse_registry("123456789012.dkr.ecr.us-west-2.amazonaws.com/app:v1"),
            Some(EcrRegistry::Private {
                account: "123456789012".into(),
                region: "us-west-2".into(),
                fips: false
            })
        );
        assert_eq!(
            parse_registry("123456789012.dkr.ecr-fips.us-gov-west-1.amazonaws.com"),
            Some(EcrRegistry::Private {
                account: "123456789012".into(),
                region: "us-gov-west-1".into(),
                fips: true
            })
        );
        assert_eq!(
            parse_registry("123456789012.dkr-ecr.cn-north-1.amazonaws.com.cn:443/x"),
            Some(EcrRegistry::Private {
                account: "123456789012".into(),
                region: "cn-north-1".into(),
                fips: false
            })
        );
        for (host, region) in [
            ("123456789012.dkr-ecr.us-east-1.on.aws", "us-east-1"),
            ("123456789012.dkr.ecr.eu-central-1.on.aws", "eu-central-1"),
            ("123456789012.dkr-ecr.cn-north-1.on.amazonwebservices.com.cn", "cn-north-1"),
            ("123456789012.dkr.ecr.eusc-de-east-1.amazonaws.eu", "eusc-de-east-1"),
        ] {
            assert_eq!(
                parse_registry(&format!("{host}/app:v1")),
                Some(EcrRegistry::Private {
                    account: "123456789012".into(),
                    region: region.into(),
                    fips: false
                }),
                "{host}"
            );
        }
        assert_eq!(
            parse_registry("123456789012.dkr-ecr-fips.us-east-1.on.aws/app"),
            Some(EcrRegistry::Private {
                account: "123456789012".into(),
                region: "us-east-1".into(),
                fips: true
            })
        );
        assert_eq!(parse_registry("public.ecr.aws/nginx/nginx:latest"), Some(EcrRegistry::Public));
        assert_eq!(parse_registry("ecr-public.aws.com/x"), Some(EcrRegistry::Public));
        for not in [
            "docker.io/library/nginx",
            "12345678901.dkr.ecr.us-east-1.amazonaws.com/x",
            "123456789012.dkr.ecr.us-east-1.example.com/x",
            "123456789012.ecr.us-east-1.amazonaws.com/x",
            "123456789012.dkr.ecr.-east.amazonaws.com/x",
            "123456789012.dkr-ecr.us-east-1.on.aws.example.com/x",
        ] {
            assert_eq!(parse_registry(not), None, "{not}");
        }
    }

    #[test]
    fn tokens_decode_to_user_and_password() {
        let t = base64::engine::general_purpose::STANDARD.encode("AWS:123456789012-auth-token");
        assert_eq!(decode_token(&t).unwrap(), ("AWS".into(), "123456789012-auth-token".into()));
        assert!(matches!(decode_token("!!"), Err(TokenError::NotBase64)));
        let t = base64::engine::general_purpose::STANDARD.encode("nocolon");
        assert!(matches!(decode_token(&t), Err(TokenError::NoSeparator)));
    }

    #[test]
    fn cache_duration_is_half_the_remaining_lifetime_and_zero_when_expired() {
        let now = SystemTime::UNIX_EPOCH + Duration::from_secs(2_000_000_000);
        let in_12h = now + Duration::from_secs(12 * 3600);
        assert_eq!(cache_duration(now, Some(in_12h)), Duration::from_secs(6 * 3600));
        // moto's fixed 2015-01-01 expiry.
        let moto = SystemTime::UNIX_EPOCH + Duration::from_secs(1_420_070_400);
        assert_eq!(cache_duration(now, Some(moto)), Duration::ZERO);
        assert_eq!(cache_duration(now, None), Duration::ZERO);
    }
}
