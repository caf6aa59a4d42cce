//! Go `time.Duration` strings (`15s`, `1m30s`, `5m0s`, `100ms`), as used by upstream flags and
//! by `metav1.Duration` fields (e.g. `cacheDuration` of the credential-provider protocol).

use std::time::Duration;

/// A string that is not a Go duration.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid duration {input:?}: {reason}")]
pub struct DurationError {
    /// The rejected input.
    pub input: String,
    /// Why it was rejected.
    pub reason: &'static str,
}

/// Parses a Go duration string. Negative durations are rejected (no flag or field here
/// accepts them). `0` alone is accepted, as in Go.
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let err = |reason| DurationError { input: input.to_string(), reason };
    let s = input.trim();
    let s = s.strip_prefix('+').unwrap_or(s);
    if s.starts_with('-') {
        return Err(err("negative durations are not allowed"));
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    if s.is_empty() {
        return Err(err("empty"));
    }
    let mut total: f64 = 0.0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_len = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        if num_len == 0 {
            return Err(err("expected a number"));
        }
        let number: f64 = rest[..num_len].parse().map_err(|_| err("bad number"))?;
        rest = &rest[num_len..];
        let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
        let unit = &rest[..unit_len];
        rest = &rest[unit_len..];
        let seconds = match unit {
            "ns" => 1e-9,
            "us" | "µs" | "μs" => 1e-6,
            "ms" => 1e-3,
            "s" => 1.0,
            "m" => 60.0,
            "h" => 3600.0,
            "" => return Err(err("missing unit (use ns, us, ms, s, m or h)")),
            _ => return Err(err("unknown unit (use ns, us, ms, s, m or h)")),
        };
        total += number * seconds;
    }
    if !total.is_finite() || total > 1e10 {
        return Err(err("too large"));
    }
    Ok(Duration::from_secs_f64(total))
}

/// Formats a duration as Go's `Duration.String()` does (`6h0m0s`, `1m30s`, `500ms`, `0s`).
pub fn format(d: Duration) -> String {
    if d.is_zero() {
        return "0s".into();
    }
    let nanos = d.as_nanos();
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", trim_fraction(nanos, 1_000));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", trim_fraction(nanos, 1_000_000));
    }
    let total_secs = d.as_secs();
    let h = total_secs / 3600;
    let m = (total_secs % 3600) / 60;
    let s_nanos = nanos - u128::from(total_secs - total_secs % 60) * 1_000_000_000;
    let secs = trim_fraction(s_nanos, 1_000_000_000);
    if h > 0 {
        format!("{h}h{m}m{secs}s")
    } else if m > 0 {
        format!("{m}m{secs}s")
    } else {
        format!("{secs}s")
    }
}

fn trim_fraction(value: u128, unit: u128) -> String {
    let whole = value / unit;
    let frac = value % unit;
    if frac == 0 {
        return whole.to_string();
    }
    let width = unit.to_string().len() - 1;
    let frac = format!("{frac:0width$}");
    format!("{whole}.{}", frac.trim_end_matches('0'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse("15s").unwrap(), Duration::from_secs(15));
        assert_eq!(parse("1m30s").unwrap(), Duration::from_secs(90));
        assert_eq!(parse("5m0s").unwrap(), Duration::from_secs(300));
        assert_eq!(parse("100ms").unwrap(), Duration::from_millis(100));
        assert_eq!(parse("1.5h").unwrap(), Duration::from_secs(5400));
        assert_eq!(parse("0").unwrap(), Duration::ZERO);
        assert!(parse("15").unwrap_err().reason.contains("missing unit"));
        assert!(parse("-1s").is_err());
        assert!(parse("abc").is_err());
        assert!(parse("").is_err());
    }

    #[test]
    fn formats_like_go() {
        assert_eq!(format(Duration::from_secs(6 * 3600)), "6h0m0s");
        assert_eq!(format(Duration::from_secs(90)), "1m30s");
        assert_eq!(format(Duration::from_secs(5)), "5s");
        assert_eq!(format(Duration::from_millis(500)), "500ms");
        assert_eq!(format(Duration::from_millis(1500)), "1.5s");
        assert_eq!(format(Duration::ZERO), "0s");
    }
}
