//! Logging setup: `--logging-format` text or json on stderr, `-v` levels as klog's.
//!
//! `-v` 0–1: info; 2–3: debug for this manager; 4–5: trace for this manager; 6+: debug for
//! every library as well. `RUST_LOG`, when set, overrides the mapping.
//!
//! Writing a log line never fails and never panics: when stderr is gone (its reader exited:
//! EPIPE; a full disk; ...) the line is dropped and counted ([`dropped_lines`]). The
//! subscriber's own fallback (printing the write error with `eprintln!`, which panics when
//! stderr is broken) is turned off: that panic hit every task that logged, including the
//! signal handler, so SIGTERM was ignored.

use std::io::{self, Write};
use std::sync::atomic::{AtomicU64, Ordering};

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

/// The filter for a klog verbosity.
pub fn filter_for(verbosity: u8) -> String {
    match verbosity {
        0..=1 => "info".into(),
        2..=3 => "info,ccm_core=debug".into(),
        4..=5 => "info,ccm_core=trace".into(),
        _ => "debug,ccm_core=trace".into(),
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
        .log_internal_errors(false);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
