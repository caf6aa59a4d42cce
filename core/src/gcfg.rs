//! A reader for gcfg, the INI dialect of Go's `gopkg.in/gcfg.v1` that upstream cloud providers
//! read their cloud config with (`cloud.conf`, `gce.conf`), and typed reads of its values.
//! Provider-neutral: each provider maps sections and keys to its own types and its own key
//! table ([`KeyDoc`]).
//!
//! **Syntax** (gcfg's): `[section]` or `[section "subsection"]` headers; `key = value` lines;
//! section and key names are a letter then letters, digits and `-`, and match
//! case-insensitively (the caller lower-cases or looks them up so); subsection names are
//! case-sensitive, double-quoted, with escapes `\"` and `\\`. A value may be double-quoted in
//! whole or in part (escapes `\"` `\\` `\n` `\t`); unquoted blanks around it are dropped; an
//! unquoted `;` or `#` starts a comment; a `\` at the end of a line continues the value on the
//! next. A bare `key` (no `=`) is gcfg's "blank" value: `true` for a boolean, clears a
//! multi-valued key, and is an error for anything else. A leading UTF-8 BOM is skipped, CRLF
//! line ends are accepted, NUL is refused.
//!
//! **Errors never quote a value** (values may be secrets): syntax errors give the line, value
//! errors name `[section] key` ([`ValueError`]), and an unknown bare word is not shown
//! ([`unknown_key`]), since it may be a secret pasted on a line of its own.

use std::collections::BTreeMap;
use std::fmt;
use std::ops::RangeInclusive;

use crate::reference::{KeyDoc, lookup};

/// A line the reader cannot read. The message never quotes the line's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("line {line}: {message}")]
pub struct SyntaxError {
    /// The 1-based line.
    pub line: usize,
    /// What is wrong.
    pub message: &'static str,
}

/// A value that cannot be used, named by `[section] key`. The message never quotes the value.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cloud configuration setting {key}: {message}")]
pub struct ValueError {
    /// `[section] key`.
    pub key: String,
    /// Why (never the value itself).
    pub message: String,
}

/// One statement of a gcfg file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Statement {
    /// `[name]` or `[name "subsection"]`.
    Section {
        /// The name as written.
        name: String,
        /// The subsection, unescaped.
        sub: Option<String>,
        /// Its line.
        line: usize,
    },
    /// `key = value` (`Some`, unquoted and unescaped) or a bare `key` (`None`).
    Var {
        /// The key as written.
        key: String,
        /// The value.
        value: Option<String>,
        /// Its line.
        line: usize,
    },
}

/// The statements of a gcfg text, in order.
pub fn statements(text: &str) -> Result<Vec<Statement>, SyntaxError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if let Some(i) = text.find('\0') {
        let line = text[..i].matches('\n').count() + 1;
        return Err(SyntaxError { line, message: "illegal character NUL" });
    }
    let mut lexer = Lexer { chars: text.chars().peekable(), line: 1 };
    let mut out = Vec::new();
    while let Some(s) = lexer.next_statement()? {
        out.push(s);
    }
    Ok(out)
}

/// gcfg's scanner, statement by statement.
struct Lexer<'a> {
    chars: std::iter::Peekable<std::str::Chars<'a>>,
    line: usize,
}

impl Lexer<'_> {
    fn peek(&mut self) -> Option<char> {
        self.chars.peek().copied()
    }

    fn bump(&mut self) -> Option<char> {
        let c = self.chars.next();
        if c == Some('\n') {
            self.line += 1;
        }
        c
    }

    fn skip_blanks(&mut self) {
        while matches!(self.peek(), Some(' ' | '\t' | '\r')) {
            self.bump();
        }
    }

    fn skip_comment(&mut self) {
        while !matches!(self.peek(), None | Some('\n')) {
            self.bump();
        }
    }

    fn error(&self, message: &'static str) -> SyntaxError {
        SyntaxError { line: self.line, message }
    }

    /// A section or variable name: a letter, then letters, digits and `-`.
    fn ident(&mut self) -> String {
        let mut out = String::new();
        while let Some(c) = self.peek().filter(|c| c.is_alphanumeric() || *c == '-') {
            out.push(c);
            self.bump();
        }
        out
    }

    /// After a statement: blanks, then a comment, a line end or the end.
    fn end_of_statement(&mut self) -> Result<(), SyntaxError> {
        self.skip_blanks();
        match self.peek() {
            None | Some('\n') => Ok(()),
            Some(';' | '#') => {
                self.skip_comment();
                Ok(())
            }
            Some(_) => Err(self.error("expected the end of the line or a comment")),
        }
    }

    /// `[name]` or `[name "sub"]` (the `[` consumed).
    fn header(&mut self) -> Result<Statement, SyntaxError> {
        let line = self.line;
        self.skip_blanks();
        if !self.peek().is_some_and(char::is_alphabetic) {
            return Err(self.error("expected a section name after '['"));
        }
        let name = self.ident();
        self.skip_blanks();
        let mut sub = None;
        if self.peek() == Some('"') {
            self.bump();
            let mut s = String::new();
            loop {
                if matches!(self.peek(), None | Some('\n')) {
                    return Err(self.error("subsection name not terminated"));
                }
                match self.bump() {
                    Some('"') => break,
                    Some('\\') => match self.peek() {
                        Some(c @ ('"' | '\\')) => {
                            self.bump();
                            s.push(c);
                        }
                        _ => return Err(self.error("unknown escape sequence in subsection name")),
                    },
                    Some(c) => s.push(c),
                    None => {}
                }
            }
            if s.is_empty() {
                return Err(self.error("empty subsection name"));
            }
            sub = Some(s);
            self.skip_blanks();
        }
        if self.peek() != Some(']') {
            return Err(self.error("expected ']' to close the section header"));
        }
        self.bump();
        self.end_of_statement()?;
        Ok(Statement::Section { name, sub, line })
    }

    /// The value after `=` (blanks skipped): gcfg's `scanValString` and `unquote`.
    fn value(&mut self) -> Result<String, SyntaxError> {
        let mut out = String::new();
        // Unquoted blanks are kept only when more of the value follows them.
        let mut pending = String::new();
        let mut quoted = false;
        loop {
            let c = self.peek();
            if !quoted && matches!(c, None | Some('\n' | ';' | '#')) {
                return Ok(out);
            }
            if quoted && matches!(c, None | Some('\n')) {
                return Err(self.error("quoted value not terminated"));
            }
            self.bump();
            match c {
                Some('\\') if quoted => {
                    let escaped = match self.peek() {
                        Some('\\') => '\\',
                        Some('"') => '"',
                        Some('n') => '\n',
                        Some('t') => '\t',
                        _ => return Err(self.error("unknown escape sequence in quoted value")),
                    };
                    self.bump();
                    out.push_str(&pending);
                    pending.clear();
                    out.push(escaped);
                }
                Some('\\') => {
                    if self.peek() == Some('\r') {
                        self.bump();
                    }
                    match self.peek() {
                        // A line continuation: nothing is added.
                        Some('\n') => {}
                        Some('"') => {
                            out.push_str(&pending);
                            pending.clear();
                            out.push('"');
                        }
                        _ => {
                            return Err(self
                                .error("an unquoted '\\' must be followed by a line end or '\"'"));
                        }
                    }
                    self.bump();
                }
                Some('"') => {
                    out.push_str(&pending);
                    pending.clear();
                    quoted = !quoted;
                }
                // gcfg drops carriage returns (CRLF files).
                Some('\r') => {}
                Some(c @ (' ' | '\t')) if !quoted => pending.push(c),
                Some(c) => {
                    out.push_str(&pending);
                    pending.clear();
                    out.push(c);
                }
                None => return Ok(out),
            }
        }
    }

    fn next_statement(&mut self) -> Result<Option<Statement>, SyntaxError> {
        loop {
            self.skip_blanks();
            match self.peek() {
                None => return Ok(None),
                Some('\n') => {
                    self.bump();
                }
                Some(';' | '#') => self.skip_comment(),
                Some('[') => {
                    self.bump();
                    return self.header().map(Some);
                }
                Some(c) if c.is_alphabetic() => {
                    let line = self.line;
                    let key = self.ident();
                    self.skip_blanks();
                    let value = match self.peek() {
                        None | Some('\n' | ';' | '#') => None,
                        Some('=') => {
                            self.bump();
                            self.skip_blanks();
                            Some(self.value()?)
                        }
                        Some(_) => {
                            return Err(self.error(
                                "expected `key = value`, with a key of letters, digits and '-'",
                            ));
                        }
                    };
                    self.end_of_statement()?;
                    return Ok(Some(Statement::Var { key, value, line }));
                }
                Some(_) => return Err(self.error("expected a section header or `key = value`")),
            }
        }
    }
}

/// How an unknown key is named in an error: `[label] key`, or, for a bare word (no `=`), only
/// its line, since it may be a secret pasted on a line of its own.
pub fn unknown_key(label: &str, key: &str, bare: bool, line: usize) -> String {
    if bare {
        format!(
            "{label} on line {line} (a word without '=' that is no known key; not shown, it may \
             be a secret)"
        )
    } else {
        format!("{label} {key}")
    }
}

/// A value read from a config file and the warnings reading it gave: keys and sections
/// upstream's gcfg (`FatalOnly`) would skip, which are skipped here too. Each warning names
/// the section and key (never a value) and was also logged (`tracing` warn) when read; the
/// manager may show them to the operator (an Event on the first start).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed<T> {
    /// What was read.
    pub value: T,
    /// One line per skipped key or section, in file order; never quotes a value.
    pub warnings: Vec<String>,
}

impl<T> Parsed<T> {
    /// The same warnings with `f` applied to the value.
    pub fn map<U>(self, f: impl FnOnce(T) -> U) -> Parsed<U> {
        Parsed { value: f(self.value), warnings: self.warnings }
    }
}

/// How a section is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SectionKind {
    /// `[name]`: one block (repeated headers merge). `[name "sub"]` is what gcfg cannot store
    /// for such a section: a warning, and its keys are skipped.
    Plain,
    /// `[name "sub"]`: one block per subsection name (gcfg's map sections). `[name]` alone is
    /// the block with no name ([`Block::sub`] `None`); the provider decides what it means.
    Named,
    /// Known but not read by this provider (another component's section of a shared file):
    /// skipped with its keys, without a warning.
    Ignored,
}

/// A section a provider knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SectionSpec {
    /// The name as documented (`Global`, `LoadBalancerClass`); matched case-insensitively.
    pub name: &'static str,
    /// Its section in the key table (`VirtualCenter` blocks read `Global`'s keys).
    pub keys: &'static str,
    /// How it is read.
    pub kind: SectionKind,
}

impl SectionSpec {
    /// A plain section whose keys are under its own name in the key table.
    pub const fn plain(name: &'static str) -> Self {
        SectionSpec { name, keys: name, kind: SectionKind::Plain }
    }

    /// A section of named blocks whose keys are under its own name in the key table.
    pub const fn named(name: &'static str) -> Self {
        SectionSpec { name, keys: name, kind: SectionKind::Named }
    }

    /// A section skipped without a warning.
    pub const fn ignored(name: &'static str) -> Self {
        SectionSpec { name, keys: name, kind: SectionKind::Ignored }
    }
}

/// A provider's file layout: its sections and key table. Anything else in a file is skipped
/// with a warning, as upstream's gcfg `FatalOnly` skips it.
#[derive(Debug)]
pub struct Schema {
    /// Every key the provider reads, by section ([`KeyDoc::section`] compared up to its first
    /// blank, so `ServiceOverride "<name>"` names the `ServiceOverride` section).
    pub table: &'static [KeyDoc],
    /// The sections.
    pub sections: &'static [SectionSpec],
    /// Maps a key, as the table spells it, to the key its values are stored under: an alias
    /// and its key then share one list, in file order (the last of either wins).
    pub canonical: fn(&'static str) -> &'static str,
}

/// The identity for [`Schema::canonical`]: no aliases.
pub fn no_aliases(key: &'static str) -> &'static str {
    key
}

/// One block of a file: a plain section (every header of it merged) or one named block of a
/// [`SectionKind::Named`] section (every header with that name merged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Block {
    /// The section's name as the schema spells it.
    pub name: &'static str,
    /// The subsection name of a named block.
    pub sub: Option<String>,
    /// The line of its first header.
    pub line: usize,
    /// Its values, by key as the table spells it (after [`Schema::canonical`]).
    pub values: Values,
}

impl Block {
    /// `[Global]`, `[LoadBalancerClass "gold"]`.
    pub fn label(&self) -> String {
        match &self.sub {
            Some(sub) => format!("[{} {sub:?}]", self.name),
            None => format!("[{}]", self.name),
        }
    }
}

/// A file read against a [`Schema`]: the blocks of its known sections, in file order.
#[derive(Debug, Clone)]
pub struct Document {
    schema: &'static Schema,
    blocks: Vec<Block>,
}

static NO_VALUES: Values = BTreeMap::new();

impl Document {
    /// The blocks, in the order their first headers appear.
    pub fn blocks(&self) -> &[Block] {
        &self.blocks
    }

    /// Whether a header of section `name` (any subsection) appeared.
    pub fn has(&self, name: &str) -> bool {
        self.blocks.iter().any(|b| b.name.eq_ignore_ascii_case(name))
    }

    fn spec(&self, name: &str) -> Option<&'static SectionSpec> {
        self.schema.sections.iter().find(|s| s.name.eq_ignore_ascii_case(name))
    }

    /// Typed reads of the plain section `name` (empty when the file has none). In debug
    /// builds, a name the schema does not have panics.
    pub fn section(&self, name: &str) -> Section<'_> {
        let spec = self.spec(name);
        debug_assert!(spec.is_some(), "section [{name}] is not in the schema");
        let keys = spec.map_or("", |s| s.keys);
        let label = spec.map_or(name, |s| s.name);
        let values = self
            .blocks
            .iter()
            .find(|b| b.sub.is_none() && b.name.eq_ignore_ascii_case(name))
            .map_or(&NO_VALUES, |b| &b.values);
        Section::new(format!("[{label}]"), self.schema.table, keys, values)
    }

    /// Typed reads of each block of section `name` (named or not), in file order.
    pub fn blocks_of<'d>(
        &'d self,
        name: &'d str,
    ) -> impl Iterator<Item = (&'d Block, Section<'d>)> + 'd {
        let keys = self.spec(name).map_or("", |s| s.keys);
        self.blocks
            .iter()
            .filter(move |b| b.name.eq_ignore_ascii_case(name))
            .map(move |b| (b, Section::new(b.label(), self.schema.table, keys, &b.values)))
    }
}

/// Reads `text` against `schema`, as upstream's `gcfg.FatalOnly(gcfg.ReadInto(..))` does:
/// a syntax error (or a key before any section header) is fatal and names the line; an
/// unknown section, a subsection on a section that takes none, and an unknown key are
/// skipped with a warning naming them (never a value, and a bare word not even by name).
/// Each warning is also logged.
pub fn read(text: &str, schema: &'static Schema) -> Result<Parsed<Document>, SyntaxError> {
    let mut blocks: Vec<Block> = Vec::new();
    let mut warnings = Vec::new();
    let mut warn = |section: &str, key: Option<&str>, line: usize, message: String| {
        tracing::warn!(section, key = key.unwrap_or_default(), line, "cloud config: {message}");
        warnings.push(message);
    };
    // `None` before the first header; `Some(None)` in a skipped section; else the block.
    let mut current: Option<Option<usize>> = None;
    for statement in statements(text)? {
        match statement {
            Statement::Section { name, sub, line } => {
                let spec = schema.sections.iter().find(|s| s.name.eq_ignore_ascii_case(&name));
                let shown = match &sub {
                    Some(s) => format!("[{name} {s:?}]"),
                    None => format!("[{name}]"),
                };
                current = Some(match spec {
                    None => {
                        warn(
                            &shown,
                            None,
                            line,
                            format!(
                                "unknown section {shown} (line {line}) skipped with its keys, as \
                                 upstream does"
                            ),
                        );
                        None
                    }
                    Some(spec) if spec.kind == SectionKind::Ignored => None,
                    Some(spec) if spec.kind == SectionKind::Plain && sub.is_some() => {
                        warn(
                            &shown,
                            None,
                            line,
                            format!(
                                "section {shown} (line {line}) skipped with its keys, as upstream \
                                 does: [{}] takes no subsection name",
                                spec.name
                            ),
                        );
                        None
                    }
                    Some(spec) => {
                        let i =
                            match blocks.iter().position(|b| b.name == spec.name && b.sub == sub) {
                                Some(i) => i,
                                None => {
                                    blocks.push(Block {
                                        name: spec.name,
                                        sub,
                                        line,
                                        values: Values::new(),
                                    });
                                    blocks.len() - 1
                                }
                            };
                        Some(i)
                    }
                });
            }
            Statement::Var { key, value, line } => {
                let Some(current) = current else {
                    return Err(SyntaxError { line, message: "expected a section header" });
                };
                let Some(block) = current.and_then(|i| blocks.get_mut(i)) else { continue };
                let keys = schema
                    .sections
                    .iter()
                    .find(|s| s.name == block.name)
                    .map_or(block.name, |s| s.keys);
                match lookup(schema.table, keys, &key) {
                    Some(doc) => {
                        block.values.entry((schema.canonical)(doc.key)).or_default().push(value);
                    }
                    None => {
                        let label = block.label();
                        let bare = value.is_none();
                        let message = if bare {
                            format!(
                                "a word without '=' in {label} on line {line} (no known key; \
                                 not shown, it may be a secret) skipped, as upstream does"
                            )
                        } else {
                            format!(
                                "unknown key {label} {key} (line {line}) skipped, as upstream \
                                 does"
                            )
                        };
                        warn(&label, (!bare).then_some(key.as_str()), line, message);
                    }
                }
            }
        }
    }
    Ok(Parsed { value: Document { schema, blocks }, warnings })
}

/// A gcfg boolean: `true`/`yes`/`on`/`1` or `false`/`no`/`off`/`0`, any case.
pub fn parse_bool(value: &str) -> Option<bool> {
    match value.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Some(true),
        "false" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

/// A gcfg integer: decimal or `0x` hexadecimal, optionally signed.
pub fn parse_int(value: &str) -> Option<i64> {
    let (negative, body) = match value.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, value.strip_prefix('+').unwrap_or(value)),
    };
    let n = match body.strip_prefix("0x").or_else(|| body.strip_prefix("0X")) {
        Some(hex) if !hex.is_empty() && hex.chars().all(|c| c.is_ascii_hexdigit()) => {
            i64::from_str_radix(hex, 16).ok()?
        }
        Some(_) => return None,
        None if !body.is_empty() && body.chars().all(|c| c.is_ascii_digit()) => {
            body.parse().ok()?
        }
        None => return None,
    };
    Some(if negative { -n } else { n })
}

/// The values of one section: key (as the key table spells it) → every occurrence in file
/// order (`None`: a bare key). Sections that repeat in the file merge into one, as in gcfg.
pub type Values = BTreeMap<&'static str, Vec<Option<String>>>;

/// Typed reads of one section's [`Values`]; errors name `[label] key`. In debug builds (so in
/// every test) reading a key that is not in the key table panics, so the table documents
/// every key the parser reads.
pub struct Section<'a> {
    label: String,
    table: &'static [KeyDoc],
    doc_section: &'static str,
    values: &'a Values,
}

impl fmt::Debug for Section<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Values may be secrets: only the keys.
        f.debug_struct("Section")
            .field("label", &self.label)
            .field("keys", &self.values.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl<'a> Section<'a> {
    /// `label` names the section in errors (`[Global]`, `[LoadBalancerClass "gold"]`);
    /// `doc_section` is its section in `table`.
    pub fn new(
        label: impl Into<String>,
        table: &'static [KeyDoc],
        doc_section: &'static str,
        values: &'a Values,
    ) -> Self {
        Section { label: label.into(), table, doc_section, values }
    }

    /// The section's label.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// `[label] key`, to name the key in an error.
    pub fn key(&self, key: &str) -> String {
        format!("{} {key}", self.label)
    }

    /// A [`ValueError`] for `key`.
    pub fn invalid(&self, key: &str, message: impl Into<String>) -> ValueError {
        ValueError { key: self.key(key), message: message.into() }
    }

    /// Every occurrence of `key`, in file order (`None`: a bare key).
    pub fn all(&self, key: &'static str) -> &'a [Option<String>] {
        debug_assert!(
            lookup(self.table, self.doc_section, key).is_some(),
            "config key [{}] {key} is not in the key table",
            self.doc_section
        );
        self.values.get(key).map(Vec::as_slice).unwrap_or_default()
    }

    /// Whether `key` occurs at all.
    pub fn is_set(&self, key: &'static str) -> bool {
        !self.all(key).is_empty()
    }

    /// The last occurrence of `key` (a repeated single-valued key: the last wins): `None`
    /// when absent, `Some(None)` when bare.
    pub fn last(&self, key: &'static str) -> Option<Option<&'a str>> {
        self.all(key).last().map(Option::as_deref)
    }

    /// A string (`None` when absent); a bare key is an error.
    pub fn opt_string(&self, key: &'static str) -> Result<Option<String>, ValueError> {
        match self.last(key) {
            None => Ok(None),
            Some(None) => Err(self.invalid(key, "needs a value (`key = value`)")),
            Some(Some(v)) => Ok(Some(v.to_string())),
        }
    }

    /// A string, empty when absent.
    pub fn string(&self, key: &'static str) -> Result<String, ValueError> {
        Ok(self.opt_string(key)?.unwrap_or_default())
    }

    /// A string, `default` when absent.
    pub fn string_or(&self, key: &'static str, default: &str) -> Result<String, ValueError> {
        Ok(self.opt_string(key)?.unwrap_or_else(|| default.to_string()))
    }

    /// A string that is not blank (`None` when absent, empty or only blanks).
    pub fn non_empty(&self, key: &'static str) -> Result<Option<String>, ValueError> {
        Ok(self.opt_string(key)?.filter(|v| !v.trim().is_empty()))
    }

    /// A gcfg boolean; a bare key is true.
    pub fn boolean(&self, key: &'static str, default: bool) -> Result<bool, ValueError> {
        match self.last(key) {
            None => Ok(default),
            Some(None) => Ok(true),
            Some(Some(v)) => parse_bool(v).ok_or_else(|| {
                self.invalid(key, "not a boolean (true/false, yes/no, on/off, 1/0)")
            }),
        }
    }

    /// A gcfg integer in `range`, `default` when absent.
    pub fn integer(
        &self,
        key: &'static str,
        default: i64,
        range: RangeInclusive<i64>,
    ) -> Result<i64, ValueError> {
        let Some(v) = self.opt_string(key)? else { return Ok(default) };
        let what = if *range.end() == i64::MAX {
            format!("not an integer of at least {}", range.start())
        } else {
            format!("not an integer from {} to {}", range.start(), range.end())
        };
        parse_int(v.trim()).filter(|n| range.contains(n)).ok_or_else(|| self.invalid(key, what))
    }

    /// A multi-valued key: each occurrence adds its value (blank ones skipped), a bare key
    /// clears what came before (gcfg's blank value).
    pub fn list(&self, key: &'static str) -> Vec<String> {
        let mut out = Vec::new();
        for v in self.all(key) {
            match v {
                None => out.clear(),
                Some(v) if !v.trim().is_empty() => out.push(v.clone()),
                Some(_) => {}
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const TABLE: &[KeyDoc] = &[
        KeyDoc { section: "Global", key: "name", value: "", example: "x", doc: "" },
        KeyDoc { section: "Global", key: "flag", value: "", example: "true", doc: "" },
        KeyDoc { section: "Global", key: "count", value: "", example: "1", doc: "" },
        KeyDoc { section: "Global", key: "tag", value: "", example: "a", doc: "" },
    ];

    fn vars(text: &str) -> Vec<(String, Option<String>, usize)> {
        statements(text)
            .unwrap()
            .into_iter()
            .filter_map(|s| match s {
                Statement::Var { key, value, line } => Some((key, value, line)),
                Statement::Section { .. } => None,
            })
            .collect()
    }

    fn value_of(line: &str) -> String {
        let v = vars(&format!("[s]\nk = {line}\n"));
        v[0].1.clone().unwrap()
    }

    fn values(text: &str) -> Values {
        let mut out = Values::new();
        for (key, value, _) in vars(text) {
            let doc = lookup(TABLE, "Global", &key).unwrap();
            out.entry(doc.key).or_default().push(value);
        }
        out
    }

    #[test]
    fn sections_subsections_and_lines() {
        let s = statements(
            "; comment\n# comment\n[Global]\n  [Class \"Gold \\\"x\\\" \\\\\"] ; c\n\nkey\nk2 = v\n",
        )
        .unwrap();
        assert_eq!(
            s,
            vec![
                Statement::Section { name: "Global".into(), sub: None, line: 3 },
                Statement::Section {
                    name: "Class".into(),
                    sub: Some("Gold \"x\" \\".into()),
                    line: 4
                },
                Statement::Var { key: "key".into(), value: None, line: 6 },
                Statement::Var { key: "k2".into(), value: Some("v".into()), line: 7 },
            ]
        );
    }

    #[test]
    fn quoted_values_comments_and_continuations() {
        assert_eq!(value_of("\"https://k:5000/v3\" ; comment"), "https://k:5000/v3");
        assert_eq!(value_of("\"a \\\"quoted\\\" name\""), "a \"quoted\" name");
        assert_eq!(value_of("pa\"ss; #\"word   # trailing"), "pass; #word");
        assert_eq!(value_of("Region  One\t"), "Region  One");
        assert_eq!(value_of("\"\\ttab\\nnewline\\\\\""), "\ttab\nnewline\\");
        assert_eq!(value_of("unquoted \\\" quote"), "unquoted \" quote");
        assert_eq!(value_of("\"  padded  \""), "  padded  ");
        assert_eq!(value_of(""), "");
        let v = vars("[s]\nk = line\\\n  continued\nk2 = x\n");
        assert_eq!(v[0], ("k".into(), Some("line  continued".into()), 2));
        assert_eq!(v[1].2, 4);
        // CRLF and a BOM.
        let v = vars("\u{feff}[s]\r\nk = v\r\nb\r\n");
        assert_eq!(v, vec![("k".into(), Some("v".into()), 2), ("b".into(), None, 3)]);
    }

    #[test]
    fn syntax_errors_give_the_line_and_never_the_text() {
        const SECRET: &str = "Zq7secret";
        for (text, line) in [
            ("[Global\n", 1),
            ("[s]\n\n[Global\n", 3),
            ("[s]\nauth_url = x\n", 2),
            ("[s]\nauth-url: x\n", 2),
            ("[s]\n= x\n", 2),
            ("[Global] extra\n", 1),
            ("[s]\nregion = \"open\n", 2),
            ("[C \"\"]\n", 1),
            ("[C \"a\\nb\"]\n", 1),
            ("[C \"open]\n", 1),
            ("[s]\nregion = a\0b\n", 2),
            ("[s]\nk = \"a\\qb\"\n", 2),
            ("[s]\nk = a\\b\n", 2),
            ("[s]\n[1]\n", 2),
        ] {
            let text = text.replace('x', SECRET).replace("open", SECRET);
            let e = statements(&text).unwrap_err();
            assert_eq!(e.line, line, "{text:?}: {e}");
            let shown = format!("{e} {e:?}");
            assert!(shown.contains(&format!("line {line}")), "{shown}");
            assert!(!shown.contains(SECRET), "{shown}");
        }
    }

    #[test]
    fn booleans_and_integers() {
        for (v, b) in [("true", true), ("YES", true), ("On", true), ("1", true), ("off", false)] {
            assert_eq!(parse_bool(v), Some(b), "{v}");
        }
        assert_eq!(parse_bool("maybe"), None);
        assert_eq!(parse_bool(""), None);
        for (v, n) in [("12", Some(12)), ("-3", Some(-3)), ("+0x1F", Some(31)), ("0X10", Some(16))]
        {
            assert_eq!(parse_int(v), n, "{v}");
        }
        for v in ["", "0x", "1.5", "12a", "-", "99999999999999999999"] {
            assert_eq!(parse_int(v), None, "{v}");
        }
    }

    #[test]
    fn typed_reads_name_the_key_and_never_the_value() {
        let vals =
            values("[Global]\nname = a\nNAME = b\nflag\ncount = 0x10\ntag = x\ntag =\ntag = y\n");
        let s = Section::new("[Global]", TABLE, "Global", &vals);
        // The last of a repeated single-valued key wins.
        assert_eq!(s.string("name").unwrap(), "b");
        assert!(s.boolean("flag", false).unwrap());
        assert_eq!(s.integer("count", 0, 0..=20).unwrap(), 16);
        assert_eq!(s.list("tag"), vec!["x", "y"]);

        let vals = values("[Global]\ntag = x\ntag\ntag = y\nname\n");
        let s = Section::new("[Global]", TABLE, "Global", &vals);
        // A bare key clears a list, and is an error for a string.
        assert_eq!(s.list("tag"), vec!["y"]);
        assert_eq!(s.opt_string("name").unwrap_err().key, "[Global] name");
        assert!(!s.is_set("count"));
        assert_eq!(s.integer("count", 7, 0..=20).unwrap(), 7);

        let vals = values("[Global]\nflag = Zq7secret\ncount = 21\n");
        let s = Section::new("[Global]", TABLE, "Global", &vals);
        for e in [s.boolean("flag", false).unwrap_err(), s.integer("count", 0, 0..=20).unwrap_err()]
        {
            assert!(e.to_string().starts_with("invalid cloud configuration setting [Global] "));
            assert!(!e.to_string().contains("Zq7"), "{e}");
        }
        assert!(s.integer("count", 0, 0..=20).unwrap_err().message.contains("from 0 to 20"));
        assert!(!format!("{s:?}").contains("Zq7"));
    }

    const SCHEMA_TABLE: &[KeyDoc] = &[
        KeyDoc { section: "Global", key: "name", value: "", example: "x", doc: "" },
        KeyDoc { section: "Global", key: "alias", value: "", example: "x", doc: "" },
        KeyDoc { section: "Class \"<name>\"", key: "size", value: "", example: "1", doc: "" },
    ];

    static SCHEMA: Schema = Schema {
        table: SCHEMA_TABLE,
        sections: &[
            SectionSpec::plain("Global"),
            SectionSpec::named("Class"),
            SectionSpec::ignored("Other-Tool"),
        ],
        canonical: |k| if k == "alias" { "name" } else { k },
    };

    #[test]
    fn unknown_sections_and_keys_are_skipped_with_a_warning_naming_them_never_the_value() {
        let text = "[global]\nNAME = a\nnmae = Zq7secret\nZq7bare\n[Nope \"n\"]\nname = Zq7x\n\
                    [Global \"sub\"]\nname = Zq7y\n[other-tool]\nanything = Zq7z\n\
                    [Class \"gold\"]\nsize = 1\nsise = 2\n[class \"gold\"]\nsize = 3\n\
                    [Class]\nsize = 4\n[GLOBAL]\nalias = b\n";
        let parsed = read(text, &SCHEMA).unwrap();
        let all = parsed.warnings.join("\n");
        assert!(!all.contains("Zq7"), "{all}");
        assert_eq!(parsed.warnings.len(), 5, "{all}");
        assert!(parsed.warnings[0].contains("[Global] nmae (line 3)"), "{all}");
        assert!(parsed.warnings[1].contains("[Global] on line 4"), "{all}");
        assert!(parsed.warnings[2].contains("unknown section [Nope \"n\"] (line 5)"), "{all}");
        assert!(parsed.warnings[3].contains("[Global \"sub\"] (line 7)"), "{all}");
        assert!(parsed.warnings[4].contains("[Class \"gold\"] sise (line 13)"), "{all}");

        let doc = parsed.value;
        // An alias shares its key's list: the last of either wins.
        assert_eq!(doc.section("Global").string("name").unwrap(), "b");
        assert_eq!(doc.section("global").label(), "[Global]");
        let classes: Vec<_> = doc
            .blocks_of("Class")
            .map(|(b, s)| (b.sub.clone(), b.line, s.list("size"), s.label().to_string()))
            .collect();
        assert_eq!(
            classes,
            vec![
                (
                    Some("gold".into()),
                    11,
                    vec!["1".to_string(), "3".into()],
                    "[Class \"gold\"]".into()
                ),
                (None, 16, vec!["4".to_string()], "[Class]".into()),
            ]
        );
        assert!(!doc.has("other-tool") && doc.has("CLASS"));
    }

    #[test]
    fn a_key_before_any_header_and_bad_syntax_are_fatal_with_the_line() {
        assert_eq!(read("\n; c\nname = Zq7\n", &SCHEMA).unwrap_err().line, 3);
        let e = read("[Global]\nname = a\n[Nope\n", &SCHEMA).unwrap_err();
        assert_eq!(e.line, 3);
        // Even inside a skipped section.
        assert_eq!(read("[Nope]\nk = \"Zq7\n", &SCHEMA).unwrap_err().line, 2);
        let empty = read("", &SCHEMA).unwrap();
        assert!(empty.warnings.is_empty() && empty.value.blocks().is_empty());
        assert_eq!(empty.value.section("Global").string("name").unwrap(), "");
    }

    #[test]
    fn unknown_bare_words_are_not_shown() {
        assert_eq!(unknown_key("[Global]", "nme", false, 3), "[Global] nme");
        let shown = unknown_key("[Global]", "Zq7secret", true, 3);
        assert!(!shown.contains("Zq7") && shown.contains("line 3"), "{shown}");
    }
}
