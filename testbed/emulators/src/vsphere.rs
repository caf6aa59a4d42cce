//! vSphere wire protocols as the fault proxy sees them in front of vcsim: naming each call and
//! answering injected faults with vCenter's own error bodies.
//!
//! - vim25 SOAP (`POST /sdk`): `vim25:<Method>`, the first element inside the SOAP `Body`
//!   (e.g. `vim25:RetrievePropertiesEx`). Faults answer a SOAP fault (`ServerFaultCode`
//!   with a `SystemError` detail).
//! - CIS REST (`/rest/…`, `/api/…`, the tagging calls): `rest:<METHOD> <path-template>`, object
//!   ids replaced by `{id}` and the `~action` query kept, e.g.
//!   `rest:POST /rest/com/vmware/cis/tagging/tag-association?~action=list-attached-tags`,
//!   `rest:GET /rest/com/vmware/cis/tagging/tag/{id}`. Faults answer a vAPI error JSON.

use bytes::Bytes;
use quick_xml::events::Event;

use crate::server::{ErrorKind, ErrorReply};

/// The first element inside the SOAP `Body`.
fn soap_method(body: &[u8]) -> Option<String> {
    let mut reader = quick_xml::Reader::from_reader(body);
    let mut buf = Vec::new();
    let mut in_body = false;
    loop {
        match reader.read_event_into(&mut buf) {
            Ok(Event::Start(e)) | Ok(Event::Empty(e)) => {
                let local = e.local_name();
                let name: &str = local.as_ref();
                let name = name.to_string();
                if in_body {
                    return Some(name);
                }
                in_body = name == "Body";
            }
            Ok(Event::Eof) | Err(_) => return None,
            _ => {}
        }
        buf.clear();
    }
}

fn is_id_segment(seg: &str) -> bool {
    seg.starts_with("id:")
        || seg.starts_with("urn:")
        || seg.contains("%3A")
        || (seg.len() >= 8 && seg.chars().any(|c| c.is_ascii_digit()) && seg.contains('-'))
        || (!seg.is_empty() && seg.chars().all(|c| c.is_ascii_digit()))
}

/// `rest:<METHOD> <path-template>` of a CIS REST call.
fn rest_operation(head: &http::request::Parts) -> String {
    let template: Vec<&str> =
        head.uri.path().split('/').map(|s| if is_id_segment(s) { "{id}" } else { s }).collect();
    let action = head.uri.query().and_then(|q| {
        url::form_urlencoded::parse(q.as_bytes())
            .find(|(k, _)| k == "~action")
            .map(|(_, v)| v.into_owned())
    });
    match action {
        Some(a) => format!("rest:{} {}?~action={a}", head.method, template.join("/")),
        None => format!("rest:{} {}", head.method, template.join("/")),
    }
}

fn is_rest(head: &http::request::Parts) -> bool {
    let p = head.uri.path();
    p.starts_with("/rest/") || p.starts_with("/api/")
}

/// The operation name of a vSphere call.
pub fn operation(head: &http::request::Parts, body: &Bytes) -> String {
    if is_rest(head) {
        return rest_operation(head);
    }
    match soap_method(body) {
        Some(m) => format!("vim25:{m}"),
        None => format!("http:{} {}", head.method, head.uri.path()),
    }
}

fn xml_escape(s: &str) -> String {
    s.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

/// vCenter's error answer for an injected fault.
pub fn error(head: &http::request::Parts, kind: ErrorKind) -> ErrorReply {
    let (status, message, vapi) = match kind {
        ErrorKind::Throttle => (
            503,
            "the service is busy, retry later",
            "com.vmware.vapi.std.errors.service_unavailable",
        ),
        ErrorKind::Unavailable => {
            (503, "the service is unavailable", "com.vmware.vapi.std.errors.service_unavailable")
        }
        ErrorKind::Status(s) => (
            s,
            "injected fault",
            match s {
                401 => "com.vmware.vapi.std.errors.unauthenticated",
                403 => "com.vmware.vapi.std.errors.unauthorized",
                404 => "com.vmware.vapi.std.errors.not_found",
                503 => "com.vmware.vapi.std.errors.service_unavailable",
                400..=499 => "com.vmware.vapi.std.errors.invalid_argument",
                _ => "com.vmware.vapi.std.errors.internal_server_error",
            },
        ),
    };
    if is_rest(head) {
        let body = serde_json::json!({
            "type": vapi,
            "value": { "messages": [{
                "id": "ccm.emulator.fault",
                "default_message": message,
                "args": [],
            }]},
        });
        return ErrorReply { status, content_type: "application/json", body: body.to_string() };
    }
    let message = xml_escape(message);
    let body = format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<soapenv:Envelope \
         xmlns:soapenc=\"http://schemas.xmlsoap.org/soap/encoding/\" \
         xmlns:soapenv=\"http://schemas.xmlsoap.org/soap/envelope/\" \
         xmlns:xsd=\"http://www.w3.org/2001/XMLSchema\" \
         xmlns:xsi=\"http://www.w3.org/2001/XMLSchema-instance\"><soapenv:Body><soapenv:Fault>\
         <faultcode>ServerFaultCode</faultcode><faultstring>{message}</faultstring><detail>\
         <SystemErrorFault xmlns=\"urn:vim25\" xsi:type=\"SystemError\"><reason>{message}</reason>\
         </SystemErrorFault></detail></soapenv:Fault></soapenv:Body></soapenv:Envelope>"
    );
    ErrorReply { status, content_type: "text/xml; charset=utf-8", body }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn head(method: &str, uri: &str) -> http::request::Parts {
        http::Request::builder().method(method).uri(uri).body(()).unwrap().into_parts().0
    }

    #[test]
    fn names_soap_and_rest_calls() {
        let body = Bytes::from_static(
            b"<?xml version=\"1.0\"?><soapenv:Envelope xmlns:soapenv=\"x\"><soapenv:Body>\
              <RetrievePropertiesEx xmlns=\"urn:vim25\"><_this>pc</_this></RetrievePropertiesEx>\
              </soapenv:Body></soapenv:Envelope>",
        );
        assert_eq!(operation(&head("POST", "/sdk"), &body), "vim25:RetrievePropertiesEx");
        assert_eq!(
            operation(
                &head(
                    "POST",
                    "/rest/com/vmware/cis/tagging/tag-association?~action=list-attached-tags"
                ),
                &Bytes::new()
            ),
            "rest:POST /rest/com/vmware/cis/tagging/tag-association?~action=list-attached-tags"
        );
        assert_eq!(
            operation(
                &head(
                    "GET",
                    "/rest/com/vmware/cis/tagging/tag/id:urn:vmomi:InventoryServiceTag:1234-5678:GLOBAL"
                ),
                &Bytes::new()
            ),
            "rest:GET /rest/com/vmware/cis/tagging/tag/{id}"
        );
    }

    #[test]
    fn soap_fault_body() {
        let e = error(&head("POST", "/sdk"), ErrorKind::Status(500));
        assert_eq!(e.status, 500);
        assert!(e.body.contains("<faultcode>ServerFaultCode</faultcode>"), "{}", e.body);
        let e = error(&head("GET", "/rest/com/vmware/cis/session"), ErrorKind::Unavailable);
        assert!(e.body.contains("service_unavailable"), "{}", e.body);
    }
}
