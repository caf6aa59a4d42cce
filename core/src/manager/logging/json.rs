//! `--logging-format=json`: component-base's JSON format (zap behind logr), one object a line.
//!
//! ```text
//! {"ts":1732766820123.456,"caller":"manager/mod.rs:492","msg":"Starting controller","v":0,"controller":"cloud-node-controller"}
//! {"ts":1732766821000.002,"caller":"node/mod.rs:406","msg":"cannot sync","node":"n1","err":"timed out"}
//! ```
//!
//! Keys as component-base writes them: `ts` (milliseconds since the epoch as a float, zap's
//! epoch-millis encoding that component-base configures), `caller` (the source file's
//! directory and base name, zap's short caller, and the line), `msg`, `v` (the verbosity the
//! line is shown at, see [`super`]; info, warning, debug and trace lines have it, error lines do
//! not, as logr's `Error` has no level), then the event's fields flattened in the order they
//! were written (strings as JSON strings, numbers and booleans bare), and `err` last (the
//! `error` field, as logr's error key). A warning has no key of its own, as klog's warnings
//! reach the JSON logger as info lines.

use std::fmt::{self, Write as _};

use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::registry::LookupSpan;

use super::Clock;
use super::fields::{Line, Value};

/// The component-base JSON formatter.
#[derive(Debug, Clone)]
pub struct Json {
    pub(super) clock: Clock,
}

impl<S, N> FormatEvent<S, N> for Json
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        _ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        writer.write_str(&self.line(event))
    }
}

impl Json {
    /// The whole line, with its newline.
    pub(super) fn line(&self, event: &Event<'_>) -> String {
        let line = Line::of(event);
        let (file, number) = line.caller(event);
        // Go: float64(UnixNano()) / float64(time.Millisecond), shortest representation.
        let millis = self.clock.now().as_nanosecond() as f64 / 1e6;
        let mut out = String::with_capacity(160);
        let _ = write!(out, "{{\"ts\":{millis},\"caller\":");
        string(&format!("{}:{number}", short_caller(file)), &mut out);
        out.push_str(",\"msg\":");
        string(&line.message, &mut out);
        if !Line::is_error(event)
            && let Some(v) = line.v(event)
        {
            let _ = write!(out, ",\"v\":{v}");
        }
        for (key, value) in &line.fields {
            out.push(',');
            string(key, &mut out);
            out.push(':');
            match value {
                Value::Str(s) => string(s, &mut out),
                other => out.push_str(&other.bare()),
            }
        }
        if let Some(err) = &line.err {
            out.push_str(",\"err\":");
            string(err, &mut out);
        }
        out.push_str("}\n");
        out
    }
}

/// zap's short caller: the last directory and the file name.
fn short_caller(path: &str) -> &str {
    let mut seps = path.rmatch_indices(['/', '\\']);
    match (seps.next(), seps.next()) {
        (Some(_), Some((i, _))) => &path[i + 1..],
        _ => path,
    }
}

fn string(s: &str, out: &mut String) {
    match serde_json::to_string(s) {
        Ok(quoted) => out.push_str(&quoted),
        Err(_) => out.push_str("\"\""),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::logging::testing::{capture, fixed_clock};

    #[test]
    fn lines_carry_component_bases_keys_byte_for_byte() {
        // Each event's line: the line after the `push`.
        let (lines, at) = capture(Json { clock: fixed_clock() }, || {
            let mut at = Vec::new();
            at.push(line!() + 1);
            tracing::info!(
                controller = "cloud-node-controller",
                workers = 1,
                "Starting controller"
            );
            at.push(line!() + 1);
            tracing::warn!(node = %"n1", error = %"timed out", "error syncing node, requeuing");
            at.push(line!() + 1);
            tracing::error!(error = %"connection refused", ok = false, "cannot list \"nodes\"");
            at.push(line!() + 1);
            tracing::debug!(target: "ccm_provider_aws::client", zone = "us-east-1a", "provider debug");
            at.push(line!() + 1);
            tracing::trace!(target: "ccm_core::batch", "core trace");
            at.push(line!() + 1);
            tracing::debug!(target: "hyper::proto", "dependency debug");
            at
        });
        let head = |i: usize| {
            format!(r#"{{"ts":1732766820123.456,"caller":"logging/json.rs:{}","msg":"#, at[i])
        };
        let want = [
            head(0)
                + r#""Starting controller","v":0,"controller":"cloud-node-controller","workers":1}"#,
            head(1) + r#""error syncing node, requeuing","v":0,"node":"n1","err":"timed out"}"#,
            head(2) + r#""cannot list \"nodes\"","ok":false,"err":"connection refused"}"#,
            head(3) + r#""provider debug","v":2,"zone":"us-east-1a"}"#,
            head(4) + r#""core trace","v":4}"#,
            head(5) + r#""dependency debug","v":6}"#,
        ];
        assert_eq!(lines, want.join("\n") + "\n");
        for line in lines.lines() {
            let v: serde_json::Value = serde_json::from_str(line).unwrap();
            assert!(v["ts"].is_f64() && v["caller"].is_string() && v["msg"].is_string(), "{line}");
        }
    }

    #[test]
    fn the_short_caller_is_the_last_directory_and_the_file() {
        assert_eq!(short_caller("core/src/manager/mod.rs"), "manager/mod.rs");
        assert_eq!(
            short_caller("/root/.cargo/registry/src/x/kube-runtime/src/lib.rs"),
            "src/lib.rs"
        );
        assert_eq!(short_caller("src/lib.rs"), "src/lib.rs");
        assert_eq!(short_caller("lib.rs"), "lib.rs");
    }
}
