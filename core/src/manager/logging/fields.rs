//! An event's fields as klog sees them: the message, the error (`err`), the other key/value
//! pairs in the order they were written, and where the line came from.

use std::fmt::{self, Write as _};

use tracing::field::{Field, Visit};
use tracing::{Event, Level};

use super::shown_at;

/// One field's value: strings (also `%display` and `?debug` values, as klog writes a
/// `fmt.Stringer`) or a number or boolean (written bare, as klog's JSON fallback does).
#[derive(Debug, Clone, PartialEq)]
pub(super) enum Value {
    Str(String),
    I64(i64),
    U64(u64),
    I128(i128),
    U128(u128),
    F64(f64),
    Bool(bool),
}

impl Value {
    /// The value as a string (for the message and `err`, which are always strings).
    fn into_string(self) -> String {
        match self {
            Value::Str(s) => s,
            other => other.bare(),
        }
    }

    /// A number or boolean as Go's JSON encoder writes it (non-finite floats as strings).
    pub(super) fn bare(&self) -> String {
        match self {
            Value::Str(s) => s.clone(),
            Value::I64(v) => v.to_string(),
            Value::U64(v) => v.to_string(),
            Value::I128(v) => v.to_string(),
            Value::U128(v) => v.to_string(),
            Value::F64(v) if v.is_finite() => v.to_string(),
            Value::F64(v) if v.is_nan() => "\"NaN\"".into(),
            Value::F64(v) if *v > 0.0 => "\"+Inf\"".into(),
            Value::F64(_) => "\"-Inf\"".into(),
            Value::Bool(v) => v.to_string(),
        }
    }
}

/// What a formatter needs of one event.
#[derive(Debug, Default)]
pub(super) struct Line {
    pub message: String,
    /// The `error` (or `err`) field: klog's `err`.
    pub err: Option<String>,
    pub fields: Vec<(&'static str, Value)>,
    /// Events bridged from the `log` crate carry their origin as fields.
    log_file: Option<String>,
    log_line: Option<u64>,
    log_target: Option<String>,
}

impl Line {
    pub fn of(event: &Event<'_>) -> Line {
        let mut line = Line::default();
        event.record(&mut line);
        line
    }

    /// Source file and line of the call (of the `log` call for bridged events).
    pub fn caller<'a>(&'a self, event: &'a Event<'_>) -> (&'a str, u64) {
        let meta = event.metadata();
        match (&self.log_file, self.log_line) {
            (Some(file), line) => (file, line.unwrap_or(0)),
            (None, _) => (meta.file().unwrap_or("???"), meta.line().map_or(1, u64::from)),
        }
    }

    /// The verbosity the line is shown at (`None` for errors, which have no `v`).
    pub fn v(&self, event: &Event<'_>) -> Option<u8> {
        let meta = event.metadata();
        let target = self.log_target.as_deref().unwrap_or(meta.target());
        shown_at(meta.level(), target)
    }

    /// Whether the line is an error (klog's `E`; component-base's JSON: no `v`).
    pub fn is_error(event: &Event<'_>) -> bool {
        *event.metadata().level() == Level::ERROR
    }

    fn put(&mut self, field: &Field, value: Value) {
        match field.name() {
            "message" => self.message = value.into_string(),
            "error" | "err" if self.err.is_none() => self.err = Some(value.into_string()),
            "log.file" => self.log_file = Some(value.into_string()),
            "log.line" => {
                self.log_line = match value {
                    Value::U64(n) => Some(n),
                    Value::I64(n) => u64::try_from(n).ok(),
                    _ => None,
                }
            }
            "log.target" => self.log_target = Some(value.into_string()),
            "log.module_path" => {}
            name => self.fields.push((name, value)),
        }
    }
}

impl Visit for Line {
    fn record_str(&mut self, field: &Field, value: &str) {
        self.put(field, Value::Str(value.to_owned()));
    }
    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::I64(value));
    }
    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::U64(value));
    }
    fn record_i128(&mut self, field: &Field, value: i128) {
        self.put(field, Value::I128(value));
    }
    fn record_u128(&mut self, field: &Field, value: u128) {
        self.put(field, Value::U128(value));
    }
    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::F64(value));
    }
    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }
    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.put(field, Value::Str(value.to_string()));
    }
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let mut s = String::new();
        let _ = write!(s, "{value:?}");
        self.put(field, Value::Str(s));
    }
}

/// `s` quoted as Go's `strconv.Quote` (`%q`) writes it: `"` and `\` escaped, `\a \b \f \n
/// \r \t \v`, other ASCII controls as `\xNN`, other non-printable characters as `\uNNNN` or
/// `\UNNNNNNNN`; printable Unicode as is.
pub(super) fn go_quote(s: &str, out: &mut String) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{07}' => out.push_str("\\a"),
            '\u{08}' => out.push_str("\\b"),
            '\u{0c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{0b}' => out.push_str("\\v"),
            c if c < ' ' || c == '\u{7f}' => {
                let _ = write!(out, "\\x{:02x}", u32::from(c));
            }
            c if !printable(c) => {
                let n = u32::from(c);
                if n < 0x10000 {
                    let _ = write!(out, "\\u{n:04x}");
                } else {
                    let _ = write!(out, "\\U{n:08x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Go's `unicode.IsPrint` for what logs carry: not a control, not a space other than
/// U+0020, not an invisible format character, not private use.
fn printable(c: char) -> bool {
    if c == ' ' {
        return true;
    }
    if c.is_control() || c.is_whitespace() {
        return false;
    }
    !matches!(
        u32::from(c),
        0xad | 0x600..=0x605
            | 0x61c
            | 0x6dd
            | 0x70f
            | 0x180e
            | 0x200b..=0x200f
            | 0x202a..=0x202e
            | 0x2060..=0x206f
            | 0xd800..=0xdfff
            | 0xe000..=0xf8ff
            | 0xfeff
            | 0xfff9..=0xfffb
            | 0xf0000..
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn q(s: &str) -> String {
        let mut out = String::new();
        go_quote(s, &mut out);
        out
    }

    #[test]
    fn strings_are_quoted_as_gos_percent_q() {
        // Expected values as Go's strconv.Quote writes them.
        assert_eq!(q("plain"), r#""plain""#);
        assert_eq!(q(r#"say "hi" \o/"#), r#""say \"hi\" \\o/""#);
        assert_eq!(q("a\nb\tc\rd"), r#""a\nb\tc\rd""#);
        assert_eq!(q("\u{7}\u{8}\u{c}\u{b}"), r#""\a\b\f\v""#);
        assert_eq!(q("\u{1b}[31m\u{0}\u{7f}"), r#""\x1b[31m\x00\x7f""#);
        assert_eq!(q("zoné 東京 ✓"), "\"zoné 東京 ✓\"");
        assert_eq!(q("nb\u{a0}sp zw\u{200b} bom\u{feff}"), r#""nb\u00a0sp zw\u200b bom\ufeff""#);
        assert_eq!(q("\u{85}\u{2028}"), r#""\u0085\u2028""#);
        assert_eq!(q("\u{f0000}"), r#""\U000f0000""#);
        assert_eq!(q(""), r#""""#);
    }
}
