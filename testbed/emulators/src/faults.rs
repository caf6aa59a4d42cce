//! Fault rules: which operations a fault applies to (a glob on the operation name), what the
//! fault is, and how often it fires (`times`, `probability` with a seeded generator so a test
//! gets the same sequence on every run).
//!
//! The wire format is the admin API's (`POST /__emulator/faults`); the same types are the Rust
//! client's builders ([`FaultRule::new`]).

use serde::{Deserialize, Serialize};

/// What an injected fault does to a call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Fault {
    /// Answer with this HTTP status and the cloud's own error body (or `body` verbatim).
    Status {
        /// The HTTP status code (100..=599).
        status: u16,
        /// A body replacing the cloud's error body.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        body: Option<String>,
    },
    /// Answer with this HTTP status, `Content-Type` and body verbatim: what something other
    /// than the cloud in front of it says (a proxy's HTML 404 page, a gateway's plain-text or
    /// generic JSON error, an empty body). `content_type` absent: no `Content-Type` header.
    Page {
        /// The HTTP status code (100..=599).
        status: u16,
        /// The `Content-Type` header, e.g. `text/html; charset=iso-8859-1`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content_type: Option<String>,
        /// The body, verbatim (default: empty).
        #[serde(default)]
        body: String,
    },
    /// Answer with the cloud's throttling error and a `Retry-After` header.
    Throttle {
        /// The `Retry-After` value, in seconds.
        retry_after_secs: u64,
    },
    /// Wait this long, then serve the call normally.
    Latency {
        /// The added delay in milliseconds.
        ms: u64,
    },
    /// Never answer (until the faults are cleared or the emulator is reset, which closes the
    /// connection): the client's own deadline is what ends the call.
    Hang,
    /// Close the connection without an answer.
    Drop,
}

/// One rule: a matcher, a fault, and how often it fires.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FaultRule {
    /// Operation glob: an exact name, `*`, or a pattern with `*` wildcards such as `ec2:*`.
    #[serde(rename = "match")]
    pub matcher: String,
    /// The fault.
    pub fault: Fault,
    /// Fire at most this many times (default: unlimited).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub times: Option<u64>,
    /// Fire with this probability, 0..=1 (default 1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub probability: Option<f64>,
    /// Seed of the rule's random generator (default: from the clock). With a seed the
    /// sequence of fire/skip decisions is the same on every run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
}

impl FaultRule {
    /// A rule firing `fault` on every call whose operation matches `matcher`.
    pub fn new(matcher: impl Into<String>, fault: Fault) -> Self {
        FaultRule { matcher: matcher.into(), fault, times: None, probability: None, seed: None }
    }

    /// Fire at most `n` times.
    pub fn times(mut self, n: u64) -> Self {
        self.times = Some(n);
        self
    }

    /// Fire with probability `p` (0..=1).
    pub fn probability(mut self, p: f64) -> Self {
        self.probability = Some(p);
        self
    }

    /// Seed the rule's random generator (for [`FaultRule::probability`]).
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Checks the rule; the message says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.matcher.is_empty() {
            return Err("\"match\" is empty (use \"*\" for every operation)".into());
        }
        if let Some(p) = self.probability
            && !(0.0..=1.0).contains(&p)
        {
            return Err(format!("\"probability\" {p} is not within 0..=1"));
        }
        if let Fault::Status { status, .. } | Fault::Page { status, .. } = &self.fault
            && !(100..=599).contains(status)
        {
            return Err(format!("\"status\" {status} is not an HTTP status code"));
        }
        if let Fault::Page { content_type: Some(ct), .. } = &self.fault
            && http::HeaderValue::from_str(ct).is_err()
        {
            return Err(format!("\"content_type\" {ct:?} is not a valid header value"));
        }
        Ok(())
    }
}

/// Whether `op` matches `glob`: `*` matches any run of characters (none included), `?` one
/// character (ccm-core's shared matcher, as the providers' name selectors use).
pub fn glob_matches(glob: &str, op: &str) -> bool {
    ccm_core::glob::glob(glob, op)
}

/// SplitMix64: small, fast and good enough to decide "fire or not" reproducibly.
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A rule installed in an emulator, with its firing state.
#[derive(Debug, Clone, Serialize)]
pub struct ActiveRule {
    /// The id returned by `POST /__emulator/faults`.
    pub id: u64,
    /// The rule as given.
    #[serde(flatten)]
    pub rule: FaultRule,
    /// How many times it fired.
    pub fired: u64,
    #[serde(skip)]
    rng: Rng,
}

/// The installed rules of one emulator, in insertion order (the first rule that fires wins).
#[derive(Debug, Default)]
pub struct FaultSet {
    rules: Vec<ActiveRule>,
    next_id: u64,
}

impl FaultSet {
    /// Installs a rule and returns its id.
    pub fn add(&mut self, rule: FaultRule) -> u64 {
        self.next_id += 1;
        let id = self.next_id;
        let seed = rule.seed.unwrap_or_else(|| {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or_default();
            nanos ^ id.rotate_left(32)
        });
        self.rules.push(ActiveRule { id, rule, fired: 0, rng: Rng(seed) });
        id
    }

    /// Removes one rule; false if there was none with that id.
    pub fn remove(&mut self, id: u64) -> bool {
        let before = self.rules.len();
        self.rules.retain(|r| r.id != id);
        self.rules.len() != before
    }

    /// Removes every rule (ids keep increasing).
    pub fn clear(&mut self) {
        self.rules.clear();
    }

    /// The installed rules.
    pub fn rules(&self) -> &[ActiveRule] {
        &self.rules
    }

    /// The fault to inject into a call of `op`, if a rule fires. A rule whose `times` are
    /// used up never fires again; a rule that matches but does not fire (probability) lets
    /// the next rule decide.
    pub fn pick(&mut self, op: &str) -> Option<(u64, Fault)> {
        for r in &mut self.rules {
            if !glob_matches(&r.rule.matcher, op) {
                continue;
            }
            if r.rule.times.is_some_and(|n| r.fired >= n) {
                continue;
            }
            let p = r.rule.probability.unwrap_or(1.0);
            if p < 1.0 && r.rng.next_f64() >= p {
                continue;
            }
            r.fired += 1;
            return Some((r.id, r.rule.fault.clone()));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_matches("*", "ec2:DescribeInstances"));
        assert!(glob_matches("ec2:*", "ec2:DescribeInstances"));
        assert!(!glob_matches("ec2:*", "elasticloadbalancing:DescribeLoadBalancers"));
        assert!(glob_matches("ec2:DescribeInstances", "ec2:DescribeInstances"));
        assert!(!glob_matches("ec2:DescribeInstances", "ec2:DescribeInstancesX"));
        assert!(glob_matches("*:Describe*", "ec2:DescribeTags"));
        assert!(glob_matches("*Instances", "ec2:DescribeInstances"));
        assert!(!glob_matches("*Instances", "ec2:DescribeInstancesX"));
        assert!(glob_matches("a*b*c", "abc"));
        assert!(!glob_matches("a*b*c", "acb"));
        assert!(glob_matches("compute.*.get", "compute.instances.get"));
        assert!(glob_matches("ec2:Describe?ags", "ec2:DescribeTags"));
    }

    #[test]
    fn times_limit_and_fall_through() {
        let mut set = FaultSet::default();
        let a = set.add(FaultRule::new("ec2:*", Fault::Hang).times(2));
        let b = set.add(FaultRule::new("*", Fault::Drop));
        assert_eq!(set.pick("ec2:X").map(|f| f.0), Some(a));
        assert_eq!(set.pick("ec2:X").map(|f| f.0), Some(a));
        assert_eq!(set.pick("ec2:X").map(|f| f.0), Some(b));
        assert_eq!(set.pick("elb:X").map(|f| f.0), Some(b));
        assert!(set.remove(b));
        assert_eq!(set.pick("ec2:X"), None);
    }

    #[test]
    fn seeded_probability_is_reproducible() {
        let run = || {
            let mut set = FaultSet::default();
            set.add(FaultRule::new("*", Fault::Drop).probability(0.3).seed(7));
            (0..1000).map(|_| set.pick("op").is_some()).collect::<Vec<_>>()
        };
        let (a, b) = (run(), run());
        assert_eq!(a, b);
        let fired = a.iter().filter(|f| **f).count();
        assert!((200..400).contains(&fired), "{fired} of 1000 at p=0.3");
    }

    #[test]
    fn wire_format() {
        let r: FaultRule = serde_json::from_str(
            r#"{"match":"ec2:*","fault":{"kind":"throttle","retry_after_secs":1},"times":3}"#,
        )
        .unwrap();
        assert_eq!(r, FaultRule::new("ec2:*", Fault::Throttle { retry_after_secs: 1 }).times(3));
        let r: FaultRule =
            serde_json::from_str(r#"{"match":"*","fault":{"kind":"status","status":503}}"#)
                .unwrap();
        assert_eq!(r.fault, Fault::Status { status: 503, body: None });
        assert!(FaultRule::new("*", Fault::Hang).probability(1.5).validate().is_err());
        assert!(FaultRule::new("*", Fault::Status { status: 42, body: None }).validate().is_err());
        // A page: status, content type and body verbatim; content type and body optional.
        let r: FaultRule = serde_json::from_str(
            r#"{"match":"*","fault":{"kind":"page","status":404,"content_type":"text/html","body":"<h1>Not Found</h1>"}}"#,
        )
        .unwrap();
        let page = Fault::Page {
            status: 404,
            content_type: Some("text/html".into()),
            body: "<h1>Not Found</h1>".into(),
        };
        assert_eq!(r.fault, page);
        let r: FaultRule =
            serde_json::from_str(r#"{"match":"*","fault":{"kind":"page","status":404}}"#).unwrap();
        assert_eq!(r.fault, Fault::Page { status: 404, content_type: None, body: String::new() });
        let bad =
            Fault::Page { status: 404, content_type: Some("a\nb".into()), body: String::new() };
        assert!(FaultRule::new("*", bad).validate().is_err());
    }
}
