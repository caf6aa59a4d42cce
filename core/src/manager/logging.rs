//! Logging setup: `--logging-format` text or json on stderr, `-v` levels as klog's.
//!
//! The formats are upstream's, so an operator's log pipeline parses our lines as it parses
//! the Go managers': `text` is klog's header and structured form ([`klog`]), `json` is
//! component-base's keys ([`json`]).
//!
//! `-v` raises this project's crates together (core, every provider, the binaries: targets
//! `ccm_*`, `cloud_controller_manager_*`, `cloud_node_manager_*`); the libraries underneath
//! (kube, hyper, rustls, the AWS SDK, ...) stay at info until `-v=6`:
//!
//! | `-v` | this project | libraries |
//! |------|--------------|-----------|
//! | 0–1  | info         | info      |
//! | 2–3  | debug        | info      |
//! | 4–5  | trace        | info      |
//! | 6–7  | trace        | debug     |
//! | 8+   | trace        | trace     |
//!
//! A line's verbosity (component-base's `v`) is the lowest `-v` that shows it: 0 for info and
//! warnings, 2 for this project's debug lines, 4 for its trace lines, 6 for a library's debug
//! lines and 8 for its trace lines; error lines have none. `RUST_LOG`, when set, overrides the
//! mapping (the lines keep their `v`).
//!
//! Writing a log line never fails and never panics: when stderr is gone (its reader exited:
//! EPIPE; a full disk; ...) the line is dropped and counted ([`dropped_lines`]). The
//! subscriber's own fallback (printing the write error with `eprintln!`, which panics when
//! stderr is broken) is turned off: that panic hit every task that logged, including the
//! signal handler, so SIGTERM was ignored.

mod fields;
pub mod json;
pub mod klog;

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

use tracing::Level;
use tracing_subscriber::EnvFilter;

use super::flags::LogFormat;

static DROPPED: AtomicU64 = AtomicU64::new(0);

/// Log lines that could not be written.
pub fn dropped_lines() -> u64 {
    DROPPED.load(Ordering::Relaxed)
}

/// stderr that swallows (and counts) write errors.
#[derive(Debug, Clone, Copy, Default)]
pub struct LossyStderr;

impl Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if io::stderr().write_all(buf).is_err() {
            DROPPED.fetch_add(1, Ordering::Relaxed);
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        let _ = io::stderr().flush();
        Ok(())
    }
}

/// Target prefixes of this project's crates and binaries.
const OURS: [&str; 3] = ["ccm_", "cloud_controller_manager", "cloud_node_manager"];

/// Whether `target` is one of this project's crates.
fn ours(target: &str) -> bool {
    OURS.iter().any(|p| target.starts_with(p))
}

/// The lowest `-v` that shows a line of `level` from `target` (the line's `v`); `None` for
/// errors, which component-base writes without one.
pub fn shown_at(level: &Level, target: &str) -> Option<u8> {
    let ours = ours(target);
    match *level {
        Level::ERROR => None,
        Level::WARN | Level::INFO => Some(0),
        Level::DEBUG => Some(if ours { 2 } else { 6 }),
        _ => Some(if ours { 4 } else { 8 }),
    }
}

/// The filter for a klog verbosity (the table in the module doc).
pub fn filter_for(verbosity: u8) -> String {
    let (ours, libraries) = match verbosity {
        0..=1 => return "info".into(),
        2..=3 => ("debug", "info"),
        4..=5 => ("trace", "info"),
        6..=7 => ("trace", "debug"),
        _ => return "trace".into(),
    };
    let mut filter = libraries.to_string();
    for prefix in OURS {
        filter.push_str(&format!(",{prefix}={ours}"));
    }
    filter
}

/// Time, time zone and process ID of the line headers (fixed in tests).
#[derive(Debug, Clone)]
pub(crate) struct Clock {
    tz: jiff::tz::TimeZone,
    pid: u32,
    fixed: Option<jiff::Timestamp>,
}

impl Clock {
    fn system() -> Clock {
        Clock { tz: jiff::tz::TimeZone::system(), pid: std::process::id(), fixed: None }
    }

    fn now(&self) -> jiff::Timestamp {
        self.fixed.unwrap_or_else(jiff::Timestamp::now)
    }

    fn now_local(&self) -> jiff::civil::DateTime {
        self.tz.to_datetime(self.now())
    }
}

/// Installs the global subscriber (a second call is a no-op).
pub fn init(format: LogFormat, verbosity: u8) {
    let filter = std::env::var("RUST_LOG")
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| filter_for(verbosity));
    let filter = EnvFilter::try_new(&filter).unwrap_or_else(|_| EnvFilter::new("info"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(|| LossyStderr)
        .with_ansi(false)
        .log_internal_errors(false);
    let clock = Clock::system();
    let _ = match format {
        LogFormat::Text => builder.event_format(klog::Klog { clock }).try_init(),
        LogFormat::Json => builder.event_format(json::Json { clock }).try_init(),
    };
}

#[cfg(test)]
pub(crate) mod testing {
    use std::sync::{Arc, Mutex};

    use tracing_subscriber::fmt::format::{DefaultFields, FormatEvent};
    use tracing_subscriber::registry::Registry;

    use super::Clock;

    /// 2024-11-28 04:07:00.123456 UTC, PID 12345.
    pub fn fixed_clock() -> Clock {
        Clock {
            tz: jiff::tz::TimeZone::UTC,
            pid: 12345,
            fixed: jiff::Timestamp::from_nanosecond(1_732_766_820_123_456_000).ok(),
        }
    }

    #[derive(Clone, Default)]
    struct Buf(Arc<Mutex<Vec<u8>>>);

    impl std::io::Write for Buf {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap_or_else(|e| e.into_inner()).extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    /// What `f` logs through `format` (every level), and what `f` returned.
    pub fn capture<E, R>(format: E, f: impl FnOnce() -> R) -> (String, R)
    where
        E: FormatEvent<Registry, DefaultFields> + Send + Sync + 'static,
    {
        let buf = Buf::default();
        let writer = buf.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::TRACE)
            .with_writer(move || writer.clone())
            .event_format(format)
            .finish();
        let r = tracing::subscriber::with_default(subscriber, || {
            crate::testing::anchor_tracing();
            f()
        });
        let bytes = buf.0.lock().unwrap_or_else(|e| e.into_inner()).clone();
        (String::from_utf8_lossy(&bytes).into_owned(), r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Set in the child process of [`run_init`]: `<format>:<verbosity>`.
    const CHILD: &str = "CCM_LOGGING_TEST_CHILD";

    /// The child's body (a no-op in an ordinary run): the real [`init`], then one line of
    /// each kind.
    #[test]
    fn init_child() {
        let Ok(spec) = std::env::var(CHILD) else { return };
        let (format, v) = spec.split_once(':').unwrap();
        let format = if format == "json" { LogFormat::Json } else { LogFormat::Text };
        init(format, v.parse().unwrap());
        tracing::info!(target: "ccm_core::manager", "core info line");
        tracing::debug!(target: "ccm_core::manager", "core debug line");
        tracing::debug!(target: "ccm_provider_aws::instances", node = "n1", "provider debug line");
        tracing::trace!(target: "ccm_provider_aws::instances", "provider trace line");
        tracing::debug!(target: "cloud_node_manager_azure", "binary debug line");
        tracing::info!(target: "hyper_util::client", "library info line");
        tracing::debug!(target: "hyper_util::client", "library debug line");
        tracing::trace!(target: "hyper_util::client", "library trace line");
        tracing::error!(target: "ccm_provider_aws::instances", error = %"denied", "error line");
    }

    /// Runs [`init_child`] in a child process (the global subscriber is once per process)
    /// and returns its process ID and stderr.
    fn run_init(format: &str, verbosity: u8) -> (u32, String) {
        let exe = std::env::current_exe().unwrap();
        let child = std::process::Command::new(exe)
            .args(["--exact", "manager::logging::tests::init_child", "--nocapture"])
            .env(CHILD, format!("{format}:{verbosity}"))
            .env_remove("RUST_LOG")
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{out:?}");
        (pid, String::from_utf8(out.stderr).unwrap())
    }

    fn shown(verbosity: u8) -> Vec<&'static str> {
        let log = run_init("text", verbosity).1;
        LINES.iter().map(|(m, _)| *m).filter(|m| log.contains(m)).collect()
    }

    /// The child's lines and their `v` (`None`: an error).
    const LINES: [(&str, Option<u8>); 9] = [
        ("core info line", Some(0)),
        ("core debug line", Some(2)),
        ("provider debug line", Some(2)),
        ("provider trace line", Some(4)),
        ("binary debug line", Some(2)),
        ("library info line", Some(0)),
        ("library debug line", Some(6)),
        ("library trace line", Some(8)),
        ("error line", None),
    ];

    #[test]
    fn v4_shows_the_providers_debug_lines_and_keeps_libraries_at_info() {
        assert_eq!(
            shown(4),
            [
                "core info line",
                "core debug line",
                "provider debug line",
                "provider trace line",
                "binary debug line",
                "library info line",
                "error line"
            ]
        );
        // At every -v, exactly the lines whose `v` is at most -v (and errors).
        for verbosity in 0..=9 {
            let want: Vec<&str> = LINES
                .iter()
                .filter(|(_, v)| v.is_none_or(|v| v <= verbosity))
                .map(|(m, _)| *m)
                .collect();
            assert_eq!(shown(verbosity), want, "-v={verbosity}");
        }
    }

    /// Every line of the real subscriber has klog's header and the structured form.
    #[test]
    fn init_text_writes_klog_lines() {
        let (child, log) = run_init("text", 4);
        let pid_and_file = |l: &str| {
            // "I1128 04:07:00.123456   12345 logging.rs:123] \"...\""
            let b = l.as_bytes();
            let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
            l.len() > 30
                && b"IWE".contains(&b[0])
                && digits(1..5)
                && b[5] == b' '
                && digits(6..8)
                && b[8] == b':'
                && digits(12..14)
                && b[14] == b'.'
                && digits(15..21)
                && l[21..29].trim_start().parse::<u32>().is_ok()
                && l[29..].starts_with(" logging.rs:")
                && l.contains("] \"")
        };
        let lines: Vec<&str> = log.lines().filter(|l| l.contains(" line\"")).collect();
        assert_eq!(lines.len(), 7, "{log}");
        for line in &lines {
            assert!(pid_and_file(line), "not a klog line: {line:?}");
        }
        let pid = lines[0][21..29].trim_start().parse::<u32>().unwrap();
        assert_eq!(pid, child, "the process ID, right-aligned in 7 columns: {log}");
        assert!(log.contains("] \"provider debug line\" node=\"n1\"\n"), "{log}");
        assert!(
            log.lines()
                .any(|l| l.starts_with('E') && l.ends_with("] \"error line\" err=\"denied\"")),
            "{log}"
        );
    }

    /// Every line of the real subscriber is component-base's JSON with its `v`.
    #[test]
    fn init_json_writes_component_base_lines_with_their_v() {
        let (_, log) = run_init("json", 8);
        let mut v_of = std::collections::BTreeMap::new();
        for line in log.lines().filter(|l| l.contains(" line\"")) {
            let j: serde_json::Value = serde_json::from_str(line).unwrap();
            assert!(j["ts"].as_f64().unwrap() > 1.7e12, "ts is epoch milliseconds: {line}");
            assert!(j["caller"].as_str().unwrap().starts_with("manager/logging.rs:"), "{line}");
            v_of.insert(
                j["msg"].as_str().unwrap().to_string(),
                j.get("v").and_then(|v| v.as_u64()),
            );
        }
        let mut want: Vec<(&str, Option<u64>)> =
            LINES.iter().map(|(m, v)| (*m, v.map(u64::from))).collect();
        want.sort();
        let got: Vec<(&str, Option<u64>)> = v_of.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        assert_eq!(got, want, "{log}");
    }

    #[test]
    fn a_lines_v_depends_on_its_level_and_whose_it_is() {
        assert_eq!(shown_at(&Level::DEBUG, "ccm_provider_gcp::client"), Some(2));
        assert_eq!(shown_at(&Level::TRACE, "cloud_controller_manager_aws"), Some(4));
        assert_eq!(shown_at(&Level::DEBUG, "aws_smithy_runtime"), Some(6));
        assert_eq!(shown_at(&Level::TRACE, "kube_client::client"), Some(8));
        assert_eq!(shown_at(&Level::WARN, "kube_runtime"), Some(0));
        assert_eq!(shown_at(&Level::ERROR, "ccm_core"), None);
        assert_eq!(filter_for(0), "info");
        assert_eq!(
            filter_for(4),
            "info,ccm_=trace,cloud_controller_manager=trace,cloud_node_manager=trace"
        );
    }
}
