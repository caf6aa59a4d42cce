//! AWS wire protocols as the fault proxy sees them in front of moto: naming each call
//! `<service>:<Action>` and answering injected faults with AWS's own error bodies.
//!
//! - Query protocols (EC2, ELB, ELBv2 and moto's other query services): the action is the
//!   form body's `Action=` (or the query string's), the service is the SigV4 credential
//!   scope's (`Credential=AKID/date/region/<service>/aws4_request`), so classic ELB and ELBv2
//!   are both `elasticloadbalancing:…`, as in IAM.
//! - JSON protocol (ECR): `X-Amz-Target: <Prefix>.<Operation>`.
//! - Anything else (moto's own `/moto-api/…`): `<service>:<METHOD> <path>`.
//!
//! Error bodies: EC2 `<Response><Errors><Error><Code>…`, other query services
//! `<ErrorResponse><Error><Type/><Code/>…`, JSON `{"__type": …, "message": …}`.

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use http::header;

use crate::server::{ErrorKind, ErrorReply};

/// The SigV4 signing service of a request, if signed.
fn signing_service(head: &http::request::Parts) -> Option<String> {
    let auth = head.headers.get(header::AUTHORIZATION)?.to_str().ok()?;
    let cred = auth.split("Credential=").nth(1)?;
    let scope = cred.split([',', ' ']).next()?;
    // AKID/date/region/service/aws4_request
    let mut parts = scope.split('/');
    let service = parts.nth(3)?;
    (!service.is_empty()).then(|| service.to_string())
}

/// The service from a host name like `ec2.us-east-1.amazonaws.com`.
fn host_service(head: &http::request::Parts) -> Option<String> {
    let host = head.headers.get(header::HOST)?.to_str().ok()?;
    host.ends_with(".amazonaws.com").then(|| host.split('.').next().unwrap_or_default().to_string())
}

fn service(head: &http::request::Parts) -> String {
    signing_service(head).or_else(|| host_service(head)).unwrap_or_else(|| "aws".to_string())
}

fn form_action(bytes: &[u8]) -> Option<String> {
    url::form_urlencoded::parse(bytes).find(|(k, _)| k == "Action").map(|(_, v)| v.into_owned())
}

fn json_target(head: &http::request::Parts) -> Option<&str> {
    head.headers.get("x-amz-target")?.to_str().ok()
}

/// `<service>:<Action>` of an AWS call.
pub fn operation(head: &http::request::Parts, body: &Bytes) -> String {
    let service = service(head);
    if let Some(target) = json_target(head) {
        let action = target.rsplit('.').next().unwrap_or(target);
        return format!("{service}:{action}");
    }
    let is_form = head
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/x-www-form-urlencoded"));
    let action = is_form
        .then(|| form_action(body))
        .flatten()
        .or_else(|| head.uri.query().and_then(|q| form_action(q.as_bytes())));
    match action {
        Some(a) => format!("{service}:{a}"),
        None => format!("{service}:{} {}", head.method, head.uri.path()),
    }
}

static REQUEST_ID: AtomicU64 = AtomicU64::new(1);

fn request_id() -> String {
    let n = REQUEST_ID.fetch_add(1, Ordering::Relaxed);
    format!("00000000-0000-4000-8000-{n:012x}")
}

/// `(status, code, message, sender fault)` of an injected error.
fn code(service: &str, kind: ErrorKind) -> (u16, &'static str, &'static str, bool) {
    let ec2 = service == "ec2";
    match kind {
        ErrorKind::Throttle if ec2 => {
            (503, "RequestLimitExceeded", "Request limit exceeded.", true)
        }
        ErrorKind::Throttle => (400, "Throttling", "Rate exceeded", true),
        ErrorKind::Unavailable if ec2 => {
            (503, "Unavailable", "The server is overloaded and can't handle the request.", false)
        }
        ErrorKind::Unavailable => {
            (503, "ServiceUnavailable", "Service is unable to handle request.", false)
        }
        ErrorKind::Status(s) => match s {
            429 if ec2 => (s, "RequestLimitExceeded", "Request limit exceeded.", true),
            429 => (s, "Throttling", "Rate exceeded", true),
            401 | 403 if ec2 => (s, "UnauthorizedOperation", "You are not authorized.", true),
            401 | 403 => (s, "AccessDenied", "Access denied.", true),
            503 if ec2 => (s, "Unavailable", "The service is unavailable.", false),
            503 => (s, "ServiceUnavailable", "Service is unable to handle request.", false),
            500..=599 if ec2 => (s, "InternalError", "An internal error has occurred.", false),
            500..=599 => (s, "InternalFailure", "An internal error has occurred.", false),
            _ if ec2 => (s, "InvalidRequest", "The request is not valid.", true),
            _ => (s, "InvalidParameterValue", "The request is not valid.", true),
        },
    }
}

/// AWS's error answer for an injected fault.
pub fn error(head: &http::request::Parts, kind: ErrorKind) -> ErrorReply {
    let service = service(head);
    let (status, code, message, sender) = code(&service, kind);
    let id = request_id();
    if json_target(head).is_some() {
        let json_code = match code {
            "Throttling" => "ThrottlingException",
            "ServiceUnavailable" => "ServiceUnavailableException",
            "InternalFailure" => "ServerException",
            c => c,
        };
        return ErrorReply {
            status,
            content_type: "application/x-amz-json-1.1",
            body: serde_json::json!({ "__type": json_code, "message": message }).to_string(),
        };
    }
    let body = if service == "ec2" {
        format!(
            "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Response><Errors><Error><Code>{code}</Code>\
             <Message>{message}</Message></Error></Errors><RequestID>{id}</RequestID></Response>"
        )
    } else {
        let kind = if sender { "Sender" } else { "Receiver" };
        format!(
            "<ErrorResponse xmlns=\"https://{service}.amazonaws.com/doc/\"><Error><Type>{kind}</Type>\
             <Code>{code}</Code><Message>{message}</Message></Error><RequestId>{id}</RequestId>\
             </ErrorResponse>"
        )
    };
    ErrorReply { status, content_type: "text/xml", body }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn head(auth_service: &str, target: Option<&str>, query: &str) -> http::request::Parts {
        let mut b = http::Request::builder()
            .method("POST")
            .uri(format!("/{query}"))
            .header(
                "authorization",
                format!(
                    "AWS4-HMAC-SHA256 Credential=testing/20260101/us-east-1/{auth_service}/aws4_request, SignedHeaders=host, Signature=abc"
                ),
            )
            .header("content-type", "application/x-www-form-urlencoded; charset=utf-8");
        if let Some(t) = target {
            b = b.header("x-amz-target", t);
        }
        b.body(()).unwrap().into_parts().0
    }

    #[test]
    fn names_operations() {
        let body = Bytes::from_static(b"Action=DescribeInstances&Version=2016-11-15");
        assert_eq!(operation(&head("ec2", None, ""), &body), "ec2:DescribeInstances");
        let body = Bytes::from_static(b"Action=CreateLoadBalancer&Version=2012-06-01");
        assert_eq!(
            operation(&head("elasticloadbalancing", None, ""), &body),
            "elasticloadbalancing:CreateLoadBalancer"
        );
        let target = Some("AmazonEC2ContainerRegistry_V20150921.GetAuthorizationToken");
        assert_eq!(operation(&head("ecr", target, ""), &Bytes::new()), "ecr:GetAuthorizationToken");
        assert_eq!(
            operation(&head("ec2", None, "?Action=DescribeTags"), &Bytes::new()),
            "ec2:DescribeTags"
        );
        assert_eq!(operation(&head("ec2", None, ""), &Bytes::new()), "ec2:POST /");
    }

    #[test]
    fn error_bodies_are_aws_shaped() {
        let e = error(&head("ec2", None, ""), ErrorKind::Throttle);
        assert_eq!(e.status, 503);
        assert!(e.body.contains("<Response><Errors><Error><Code>RequestLimitExceeded</Code>"));
        let e = error(&head("elasticloadbalancing", None, ""), ErrorKind::Throttle);
        assert_eq!(e.status, 400);
        assert!(e.body.contains("<Code>Throttling</Code>") && e.body.contains("<ErrorResponse"));
        let e = error(&head("ecr", Some("X.GetAuthorizationToken"), ""), ErrorKind::Throttle);
        assert!(e.body.contains("ThrottlingException"), "{}", e.body);
    }
}
