//! Logging setup: `--logging-format` text or json on stderr, `-v` levels as klog's.
//!
//! `-v` 0–1: info; 2–3: debug for this manager; 4–5: trace for this manager; 6+: debug for
//! every library as well. `RUST_LOG`, when set, overrides the mapping.

use tracing_subscriber::EnvFilter;

use super::flags::LogFormat;

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
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => builder.with_ansi(false).try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
