//! AAD's certificate credentials (`private_key_jwt`) for the Azure emulator: a client may
//! have certificates registered ([`super::AzureCloud::register_client_certificate`]), and a
//! `client_assertion` whose JOSE header carries a certificate thumbprint (`x5t` or
//! `x5t#S256`) is checked as AAD checks it:
//!
//! - the RS256 signature must verify with one of the client's registered certificates, else
//!   401 `invalid_client` `AADSTS700027` (AAD's code and wording, seen in public replies:
//!   "…is not registered on application. [Reason - The key was not found.…]" when the client
//!   has no certificate, "Client assertion contains an invalid signature." otherwise);
//! - `exp` in the past (or `nbf` in the future, 5 minutes' skew allowed): `AADSTS700024`
//!   (ours: the code as commonly reported, wording ours);
//! - `aud` must be the tenant's token endpoint (v2 `…/<tenant>/oauth2/v2.0/token` or v1
//!   `…/<tenant>/oauth2/token`, any host): `AADSTS50013` (AAD's "Assertion audience claim
//!   does not match the required value"; wording ours);
//! - `iss` and `sub` must be the `client_id`: `AADSTS700021` (ours).
//!
//! An assertion without a thumbprint is a federated token (workload identity) and is
//! accepted as before (any JWT-shaped assertion): the emulator does not model federation
//! policies.

use rustls::SignatureScheme;
use serde_json::{Value, json};

/// How far `nbf`/`exp` may be off (AAD allows clock skew of about 5 minutes).
const SKEW_SECS: i64 = 300;

/// Base64url (or standard base64) without padding → bytes.
pub(super) fn b64url_decode(text: &str) -> Option<Vec<u8>> {
    let mut bits = 0u32;
    let mut n = 0u32;
    let mut out = Vec::with_capacity(text.len() * 3 / 4);
    for c in text.bytes() {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'-' | b'+' => 62,
            b'_' | b'/' => 63,
            b'=' => break,
            _ => return None,
        };
        bits = (bits << 6) | u32::from(v);
        n += 6;
        if n >= 8 {
            n -= 8;
            out.push(((bits >> n) & 0xff) as u8);
        }
    }
    Some(out)
}

/// One DER element: (tag, content, what follows).
fn tlv(data: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = data.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n].iter().fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// The `subjectPublicKey` of an X.509 certificate (DER): for RSA, the `RSAPublicKey`.
pub(super) fn certificate_public_key(der: &[u8]) -> Option<Vec<u8>> {
    let (0x30, cert, _) = tlv(der)? else { return None };
    let (0x30, mut tbs, _) = tlv(cert)? else { return None };
    let mut fields = Vec::new();
    while !tbs.is_empty() {
        let (tag, content, rest) = tlv(tbs)?;
        fields.push((tag, content));
        tbs = rest;
    }
    // [0] version is optional; then serial, signature, issuer, validity, subject, SPKI.
    let skip = usize::from(fields.first()?.0 == 0xa0);
    let &(0x30, spki) = fields.get(skip + 5)? else { return None };
    let (0x30, _algorithm, rest) = tlv(spki)? else { return None };
    let (0x03, bits, _) = tlv(rest)? else { return None };
    let (&0, key) = bits.split_first()? else { return None };
    Some(key.to_vec())
}

/// Whether `assertion` is a certificate assertion (its header names a thumbprint).
pub(super) fn is_certificate_assertion(assertion: &str) -> bool {
    header(assertion).is_some_and(|h| h.get("x5t").is_some() || h.get("x5t#S256").is_some())
}

fn header(assertion: &str) -> Option<Value> {
    let h = assertion.split('.').next()?;
    serde_json::from_slice(&b64url_decode(h)?).ok()
}

/// AAD's 401 `invalid_client` reply body for `code` with `description`.
pub(super) fn rejection(code: u32, description: &str, trace: &str) -> Value {
    json!({
        "error": "invalid_client",
        "error_description": format!("AADSTS{code}: {description} Trace ID: {trace} Correlation ID: {trace} Timestamp: {}", crate::kit::rfc3339(crate::kit::unix_now())),
        "error_codes": [code],
        "timestamp": crate::kit::rfc3339(crate::kit::unix_now()),
        "trace_id": trace,
        "correlation_id": trace,
        "error_uri": format!("https://login.microsoftonline.com/error?code={code}"),
    })
}

/// Checks a certificate assertion of `client_id` posted to tenant `tenant` against the
/// client's registered certificates (DER). `Err((code, description))` as AAD answers.
pub(super) fn check(
    assertion: &str,
    client_id: &str,
    tenant: &str,
    certificates: &[Vec<u8>],
    now: i64,
) -> Result<(), (u32, String)> {
    let malformed = || (50027, "JWT token is invalid or malformed.".to_string());
    let parts: Vec<&str> = assertion.split('.').collect();
    let [h, c, s] = parts.as_slice() else { return Err(malformed()) };
    let head = header(assertion).ok_or_else(malformed)?;
    let claims: Value = serde_json::from_slice(&b64url_decode(c).ok_or_else(malformed)?)
        .map_err(|_| malformed())?;
    let signature = b64url_decode(s).ok_or_else(malformed)?;
    let thumbprint = head
        .get("x5t")
        .or_else(|| head.get("x5t#S256"))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string();
    if certificates.is_empty() {
        return Err((
            700027,
            format!(
                "The certificate with identifier used to sign the client assertion is not registered on application. [Reason - The key was not found., Thumbprint of key used by client: '{thumbprint}', Please visit the Azure Portal to see configured keys for app Id '{client_id}'.]"
            ),
        ));
    }
    if head.get("alg").and_then(Value::as_str) != Some("RS256") {
        return Err((700027, "Client assertion contains an invalid signature. [Reason - The provided signature algorithm is not supported.]".into()));
    }
    let provider = rustls::crypto::aws_lc_rs::default_provider();
    let Some(alg) = provider
        .signature_verification_algorithms
        .mapping
        .iter()
        .find(|(scheme, _)| *scheme == SignatureScheme::RSA_PKCS1_SHA256)
        .and_then(|(_, algs)| algs.first().copied())
    else {
        return Err((700027, "Client assertion contains an invalid signature.".into()));
    };
    let message = format!("{h}.{c}");
    let verified = certificates
        .iter()
        .filter_map(|der| certificate_public_key(der))
        .any(|key| alg.verify_signature(&key, message.as_bytes(), &signature).is_ok());
    if !verified {
        return Err((
            700027,
            format!(
                "Client assertion contains an invalid signature. [Reason - The key was not found., Thumbprint of key used by client: '{thumbprint}', Please visit the Azure Portal to see configured keys for app Id '{client_id}'.]"
            ),
        ));
    }
    let int = |k: &str| claims.get(k).and_then(Value::as_i64);
    match (int("exp"), int("nbf")) {
        (Some(exp), nbf) if exp + SKEW_SECS >= now && nbf.is_none_or(|n| n - SKEW_SECS <= now) => {}
        _ => {
            return Err((700024, "Client assertion is not within its valid time range.".into()));
        }
    }
    let aud = claims.get("aud").and_then(Value::as_str).unwrap_or_default();
    let path = url::Url::parse(aud).map(|u| u.path().to_ascii_lowercase()).unwrap_or_default();
    let t = tenant.to_ascii_lowercase();
    if path != format!("/{t}/oauth2/v2.0/token") && path != format!("/{t}/oauth2/token") {
        return Err((
            50013,
            format!(
                "Assertion audience claim does not match the required value. The audience in the assertion was '{aud}'."
            ),
        ));
    }
    let is_client = |k: &str| claims.get(k).and_then(Value::as_str) == Some(client_id);
    if !is_client("iss") || !is_client("sub") {
        return Err((
            700021,
            "Client assertion application identifier doesn't match 'client_id' parameter.".into(),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn der_lengths_and_truncation() {
        assert_eq!(tlv(&[0x30, 0x02, 1, 2, 9]), Some((0x30, &[1u8, 2][..], &[9u8][..])));
        assert_eq!(tlv(&[0x30, 0x81, 0x02, 1, 2]), Some((0x30, &[1u8, 2][..], &[][..])));
        assert_eq!(tlv(&[0x30, 0x05, 1]), None);
        assert_eq!(tlv(&[0x30, 0x85, 1, 1, 1, 1, 1]), None);
        assert!(certificate_public_key(b"not a certificate").is_none());
    }

    #[test]
    fn assertions_without_a_registered_certificate_are_aads_700027() {
        let h = "eyJhbGciOiJSUzI1NiIsInR5cCI6IkpXVCIsIng1dCI6ImFiYyJ9"; // {"alg":"RS256","typ":"JWT","x5t":"abc"}
        let a = format!("{h}.e30.c2ln");
        assert!(is_certificate_assertion(&a));
        let (code, d) = check(&a, "client", "tenant", &[], 0).unwrap_err();
        assert_eq!(code, 700027);
        assert!(d.contains("The key was not found") && d.contains("'abc'"), "{d}");
        assert!(!is_certificate_assertion("eyJhbGciOiJSUzI1NiJ9.e30.c2ln"));
    }
}
