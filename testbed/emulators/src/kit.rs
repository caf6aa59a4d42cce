//! Small pieces every cloud emulator needs, written once: the time of day as the clouds
//! print it, and the JSON answer. Each cloud's own error body shape stays in its module
//! (their shapes differ); the reply that carries it is [`json_reply`].

use std::time::{SystemTime, UNIX_EPOCH};

/// A JSON answer: `status`, `Content-Type: application/json`, `v` as the body.
pub use crate::server::json_response as json_reply;

/// Seconds since the UNIX epoch now (0 if the clock is before it).
pub fn unix_now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// `YYYY-MM-DDTHH:MM:SS`, the UTC date and time of `secs` after the UNIX epoch, without a
/// zone suffix (callers add the one their cloud prints: `Z`, `.000-00:00`, `.000000Z`).
pub fn utc_datetime(secs: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    // The civil date of a day count (days since 1970-01-01), in 400-year eras of 146 097
    // days that start on 1 March, so the leap day ends each year.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// RFC 3339 in UTC with a `Z`: `YYYY-MM-DDTHH:MM:SSZ`.
pub fn rfc3339(secs: u64) -> String {
    format!("{}Z", utc_datetime(secs))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use http::StatusCode;

    #[test]
    fn dates_are_the_calendars() {
        assert_eq!(utc_datetime(0), "1970-01-01T00:00:00");
        assert_eq!(rfc3339(1_700_000_000), "2023-11-14T22:13:20Z");
        // Leap days, the end of a year, a century that is not a leap year and one that is.
        assert_eq!(utc_datetime(951_782_400), "2000-02-29T00:00:00");
        assert_eq!(utc_datetime(1_709_164_799), "2024-02-28T23:59:59");
        assert_eq!(utc_datetime(1_709_164_800), "2024-02-29T00:00:00");
        assert_eq!(utc_datetime(1_735_689_599), "2024-12-31T23:59:59");
        assert_eq!(utc_datetime(4_107_542_400), "2100-03-01T00:00:00");
        assert!(unix_now() > 1_700_000_000);
    }

    #[test]
    fn a_json_reply_says_it_is_json() {
        let r = json_reply(StatusCode::NOT_FOUND, &serde_json::json!({"error": "x"}));
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        assert_eq!(r.headers()[http::header::CONTENT_TYPE], "application/json");
    }
}
