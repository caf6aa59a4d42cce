//! `--logging-format=text`: klog's text format, line for line.
//!
//! ```text
//! I1128 04:07:00.123456   12345 mod.rs:492] "Starting controller" controller="cloud-node-controller" workers=1
//! E1128 04:07:01.000002   12345 node.rs:406] "error syncing node" err="timed out" node="n1"
//! ```
//!
//! The header is klog's: severity (`I` for info, debug and trace, as klog writes its V-levels;
//! `W`; `E`), month and day, local time with microseconds (the process's time zone, as Go's
//! `time.Local`: UTC in an image without zone data), the process ID right-aligned in seven
//! columns, the source file's base name and line, `] `. The rest is klog's structured form
//! (`InfoS`/`ErrorS`): the message quoted as Go's `%q`, then `err="…"` (the `error` field),
//! then every other field as ` key=value`: strings, `%display` and `?debug` values quoted,
//! a value with a line break as klog's indented block (`key=<` … ` >`), numbers and booleans
//! bare.

use std::fmt::{self, Write as _};

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::FmtContext;
use tracing_subscriber::fmt::format::{FormatEvent, FormatFields, Writer};
use tracing_subscriber::registry::LookupSpan;

use super::Clock;
use super::fields::{Line, Value, go_quote};

/// The klog text formatter.
#[derive(Debug, Clone)]
pub struct Klog {
    pub(super) clock: Clock,
}

impl<S, N> FormatEvent<S, N> for Klog
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

impl Klog {
    /// The whole line, with its newline.
    pub(super) fn line(&self, event: &Event<'_>) -> String {
        let line = Line::of(event);
        let (file, number) = line.caller(event);
        let severity = match *event.metadata().level() {
            Level::ERROR => 'E',
            Level::WARN => 'W',
            _ => 'I',
        };
        let t = self.clock.now_local();
        let mut out = String::with_capacity(128);
        let _ = write!(
            out,
            "{severity}{:02}{:02} {:02}:{:02}:{:02}.{:06} {:>7} {}:{number}] ",
            t.month(),
            t.day(),
            t.hour(),
            t.minute(),
            t.second(),
            t.subsec_nanosecond() / 1000,
            self.clock.pid % 10_000_000,
            base_name(file),
        );
        go_quote(&line.message, &mut out);
        if let Some(err) = &line.err {
            out.push_str(" err");
            string_value(err, &mut out);
        }
        for (key, value) in &line.fields {
            out.push(' ');
            out.push_str(key);
            match value {
                Value::Str(s) => string_value(s, &mut out),
                other => {
                    out.push('=');
                    out.push_str(&other.bare());
                }
            }
        }
        out.push('\n');
        out
    }
}

fn base_name(path: &str) -> &str {
    path.rsplit(['/', '\\']).next().unwrap_or(path)
}

/// `=` and a string value as klog writes it: quoted; with a line break, an indented block
/// (each line after a tab, closed by ` >` on a line of its own).
fn string_value(s: &str, out: &mut String) {
    if !s.contains('\n') {
        out.push('=');
        go_quote(s, out);
        return;
    }
    out.push_str("=<\n");
    let mut rest = s;
    while let Some(i) = rest.find('\n') {
        out.push('\t');
        out.push_str(&rest[..=i]);
        rest = &rest[i + 1..];
    }
    if !rest.is_empty() {
        out.push('\t');
        out.push_str(rest);
        out.push('\n');
    }
    out.push_str(" >");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::logging::testing::{capture, fixed_clock};

    #[derive(Debug)]
    struct Refused;
    impl fmt::Display for Refused {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("connection refused")
        }
    }
    impl std::error::Error for Refused {}

    #[test]
    fn lines_are_klogs_text_format_byte_for_byte() {
        let formatter = Klog { clock: fixed_clock() };
        // Each event's line: the line after the `push`.
        let (lines, at) = capture(formatter, || {
            let mut at = Vec::new();
            at.push(line!() + 1);
            tracing::info!(
                controller = "cloud-node-controller",
                workers = 1,
                "Starting controller"
            );
            at.push(line!() + 1);
            tracing::warn!(node = %"n1", error = %"timed out", retry_in = ?std::time::Duration::from_millis(1500), "error syncing node, requeuing");
            at.push(line!() + 1);
            tracing::error!(
                error = &Refused as &(dyn std::error::Error + 'static),
                ok = false,
                ratio = 0.5,
                "cannot list \"nodes\""
            );
            at.push(line!() + 1);
            tracing::debug!(target: "ccm_provider_aws::client", "debug is written as I");
            at.push(line!() + 1);
            tracing::info!(body = "line one\nline two", tail = "a\nb\n", "multi-line values");
            at
        });
        let header = |i: usize, severity: char| {
            format!("{severity}1128 04:07:00.123456   12345 klog.rs:{}] ", at[i])
        };
        let want = [
            header(0, 'I')
                + r#""Starting controller" controller="cloud-node-controller" workers=1"#,
            header(1, 'W')
                + r#""error syncing node, requeuing" err="timed out" node="n1" retry_in="1.5s""#,
            header(2, 'E')
                + r#""cannot list \"nodes\"" err="connection refused" ok=false ratio=0.5"#,
            header(3, 'I') + r#""debug is written as I""#,
            header(4, 'I')
                + "\"multi-line values\" body=<\n\tline one\n\tline two\n > tail=<\n\ta\n\tb\n >",
        ];
        assert_eq!(lines, want.join("\n") + "\n");
    }

    #[test]
    fn the_header_pads_the_pid_and_zero_pads_the_clock_as_klog() {
        let mut clock = fixed_clock();
        clock.pid = 7;
        clock.fixed = Some(jiff::Timestamp::from_second(1_704_067_201).unwrap()); // 2024-01-01 00:00:01 UTC
        let (lines, _) = capture(Klog { clock }, || tracing::info!("x"));
        assert!(lines.starts_with("I0101 00:00:01.000000       7 klog.rs:"), "{lines}");
        assert!(lines.ends_with("] \"x\"\n"), "{lines}");
    }
}
