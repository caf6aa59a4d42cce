//! The pure half of the differential: normalising what each side left (Nodes, Services,
//! Events, the cloud's state, call counts), diffing the two sides step by step, matching each
//! difference against the documented ones (`testbed/fixtures/differential/<cloud>.yaml`),
//! and rendering the table and the compatibility page. No I/O here but reading the fixture.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

use serde_json::{Map, Value, json};

/// Reading the documented differences failed.
#[derive(Debug, thiserror::Error)]
pub enum KnownError {
    /// The file could not be read.
    #[error("reading {path}: {source}")]
    Read {
        /// The file.
        path: String,
        /// Why.
        source: std::io::Error,
    },
    /// The file is not valid.
    #[error("{path}: {detail}")]
    Invalid {
        /// The file.
        path: String,
        /// What is wrong (the entry and field).
        detail: String,
    },
}

/// What was decided about a documented difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Deserialize, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Decision {
    /// Ours behaves differently on purpose, and keeps doing so.
    OursKept,
    /// Upstream has a quirk (or a bug) ours does not reproduce.
    UpstreamQuirkFixed,
    /// The emulator cannot show what the real cloud would (the difference is not the CCMs').
    EmulatorLimit,
    /// The two sides' timing differs (periodic calls, retries within a settle window).
    Timing,
    /// A difference of ours to fix (reported; not fixed here).
    ToFix,
}

impl Decision {
    /// The decision as written in the fixture.
    pub fn as_str(self) -> &'static str {
        match self {
            Decision::OursKept => "ours-kept",
            Decision::UpstreamQuirkFixed => "upstream-quirk-fixed",
            Decision::EmulatorLimit => "emulator-limit",
            Decision::Timing => "timing",
            Decision::ToFix => "to-fix",
        }
    }
}

/// One documented difference: where it shows (step and path globs, `*` any run of
/// characters), optionally the values each side shows, the decision and why.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct KnownDifference {
    /// The scenario steps it shows in (glob; default every step).
    #[serde(default = "any")]
    pub step: String,
    /// The path of the difference (glob), e.g. `nodes/*/labels/[topology.openstack.org/host-id]`.
    pub path: String,
    /// Upstream's value there (glob; absent: any, `~`: the path is absent upstream).
    #[serde(default)]
    pub upstream: Option<String>,
    /// Ours (glob; absent: any, `~`: the path is absent in ours).
    #[serde(default)]
    pub ours: Option<String>,
    /// The decision.
    pub decision: Decision,
    /// Why, in a sentence or two (shown on the page).
    pub why: String,
}

fn any() -> String {
    "*".into()
}

/// A cloud's documented differences (`testbed/fixtures/differential/<cloud>.yaml`).
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize)]
#[serde(deny_unknown_fields)]
pub struct Known {
    /// The cloud.
    pub cloud: String,
    /// The differences.
    #[serde(default)]
    pub differences: Vec<KnownDifference>,
}

impl Known {
    /// Parses the fixture's text; `what` names it in errors.
    pub fn parse(text: &str, what: &str) -> Result<Known, KnownError> {
        let known: Known = serde_saphyr::from_str(text)
            .map_err(|e| KnownError::Invalid { path: what.into(), detail: e.to_string() })?;
        for (i, d) in known.differences.iter().enumerate() {
            if d.path.trim().is_empty() || d.why.trim().is_empty() {
                return Err(KnownError::Invalid {
                    path: what.into(),
                    detail: format!(
                        "difference {} (path {:?}): path and why are required",
                        i + 1,
                        d.path
                    ),
                });
            }
        }
        Ok(known)
    }

    /// Reads the fixture file.
    pub fn load(path: &Path) -> Result<Known, KnownError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| KnownError::Read { path: path.display().to_string(), source })?;
        Known::parse(&text, &path.display().to_string())
    }
}

/// `*` matches any run of characters (`/` included), `?` one character; the rest literally
/// (ccm-core's shared matcher).
pub use ccm_core::glob::glob;

// ---------------------------------------------------------------------------------------------
// Normalising.

/// Replacements of one side's volatile tokens (a Service's UID, an instance's ID, ...) by
/// names both sides share (`<uid:default/web>`, `<instance:node-b>`), longest first.
#[derive(Debug, Clone, Default)]
pub struct Renames(Vec<(String, String)>, BTreeMap<String, String>);

impl Renames {
    /// Adds a replacement of a whole token (a run of letters, digits and `-`) or a whole
    /// number, e.g. a node port the apiserver allocated: `32378` → `<nodeport:default/web:80>`.
    pub fn add_token(&mut self, from: impl Into<String>, to: impl Into<String>) {
        self.1.insert(from.into(), to.into());
    }

    /// The replacement of a whole number, if any.
    pub fn number(&self, n: &serde_json::Number) -> Option<&String> {
        self.1.get(&n.to_string())
    }

    /// Adds one replacement (ignored when `from` is empty).
    pub fn add(&mut self, from: impl Into<String>, to: impl Into<String>) {
        let from = from.into();
        if !from.is_empty() {
            self.0.push((from, to.into()));
            self.0.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        }
    }

    /// A Service's UID and the forms clouds derive names from: without dashes, and AWS's
    /// load-balancer name (`a` + the first 31 of those).
    pub fn add_service_uid(&mut self, uid: &str, service: &str) {
        let nodash: String = uid.chars().filter(|c| *c != '-').collect();
        let aws: String = format!("a{}", nodash.chars().take(31).collect::<String>());
        self.add(aws, format!("<lb-name:{service}>"));
        self.add(uid, format!("<uid:{service}>"));
        self.add(nodash, format!("<uid:{service}>"));
    }

    /// `s` with every replacement applied, then [`scrub_ids`] (whole tokens replaced as
    /// [`Renames::add_token`] says).
    pub fn apply(&self, s: &str) -> String {
        let mut out = s.to_string();
        for (from, to) in &self.0 {
            if out.contains(from.as_str()) {
                out = out.replace(from.as_str(), to);
            }
        }
        scrub_tokens(&out, &self.1)
    }
}

fn is_hex(s: &str) -> bool {
    !s.is_empty() && s.chars().all(|c| c.is_ascii_hexdigit())
}

fn is_uuid(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.len() == 5
        && parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && parts.iter().all(|p| is_hex(p))
}

/// Whether a token is a generated ID: a UUID, a cloud ID like `sg-0a1b2c3d4e` or a hashed
/// name like `k8s-default-web-79f1b5431f` (a lower-case prefix, a dash, 8 or more hex digits
/// with at least one digit), 16+ hex digits with a digit and a letter, or 13+ digits (an
/// emulator's object numbers).
fn id_kind(token: &str) -> Option<String> {
    if is_uuid(token) {
        return Some("<uuid>".into());
    }
    // A name ending in a UUID (`lb-<uuid>`, `octavia-lb-<uuid>`).
    if token.len() > 37
        && let Some(split) = token.len().checked_sub(37)
        && token.is_char_boundary(split)
        && token[split..].starts_with('-')
        && is_uuid(&token[split + 1..])
    {
        return Some(format!("{}-<uuid>", &token[..split]));
    }
    if token.len() >= 13 && token.chars().all(|c| c.is_ascii_digit()) {
        return Some("<n>".into());
    }
    if let Some((prefix, rest)) = token.rsplit_once('-')
        && prefix.starts_with(|c: char| c.is_ascii_lowercase())
        && prefix.chars().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        && rest.len() >= 8
        && is_hex(rest)
        && rest.chars().any(|c| c.is_ascii_digit())
    {
        return Some(format!("{prefix}-<id>"));
    }
    if token.len() >= 16
        && is_hex(token)
        && token.chars().any(|c| c.is_ascii_digit())
        && token.chars().any(|c| c.is_ascii_alphabetic())
    {
        return Some("<hex>".into());
    }
    None
}

/// `s` with generated IDs replaced (see `id_kind`) and RFC 3339 timestamps replaced by
/// `<time>`.
pub fn scrub_ids(s: &str) -> String {
    scrub_tokens(s, &BTreeMap::new())
}

fn scrub_tokens(s: &str, tokens: &BTreeMap<String, String>) -> String {
    if looks_like_time(s) {
        return "<time>".into();
    }
    let mut out = String::with_capacity(s.len());
    let mut token = String::new();
    let flush = |token: &mut String, out: &mut String| {
        match (tokens.get(token.as_str()), id_kind(token)) {
            (Some(t), _) => out.push_str(t),
            (None, Some(k)) => out.push_str(&k),
            (None, None) => out.push_str(token),
        }
        token.clear();
    };
    for c in s.chars() {
        if c.is_ascii_alphanumeric() || c == '-' {
            token.push(c);
        } else {
            flush(&mut token, &mut out);
            out.push(c);
        }
    }
    flush(&mut token, &mut out);
    out
}

fn looks_like_time(s: &str) -> bool {
    let b = s.as_bytes();
    b.len() >= 19
        && b[..4].iter().all(u8::is_ascii_digit)
        && b[4] == b'-'
        && b[7] == b'-'
        && (b[10] == b'T' || b[10] == b' ')
        && b[13] == b':'
}

/// Keys whose values vary run to run whatever the CCM does (timestamps, revisions, ETags).
fn volatile_key(k: &str) -> bool {
    let l = k.to_ascii_lowercase();
    l.ends_with("_at")
        || l.ends_with("time")
        || l.ends_with("timestamp")
        || l.contains("heartbeat")
        || matches!(
            l.as_str(),
            "etag"
                | "resourceversion"
                | "uid"
                | "managedfields"
                | "generation"
                | "requestid"
                | "mac_address"
                | "macaddress"
        )
}

/// Recursively: volatile keys dropped, strings and keys renamed (`renames`) and scrubbed,
/// arrays sorted when `sort_arrays` (the cloud's lists, whose order follows generated IDs).
/// Keys that collide once renamed get `#2`, `#3`, … in the order of their values.
pub fn scrub(v: &Value, renames: &Renames, sort_arrays: bool) -> Value {
    match v {
        Value::String(s) => Value::String(renames.apply(s)),
        Value::Number(n) => match renames.number(n) {
            Some(to) => Value::String(to.clone()),
            None => v.clone(),
        },
        Value::Array(a) => {
            let mut items: Vec<Value> = a.iter().map(|x| scrub(x, renames, sort_arrays)).collect();
            if sort_arrays {
                items.sort_by_key(|x| x.to_string());
            }
            Value::Array(items)
        }
        Value::Object(o) => {
            let mut groups: BTreeMap<String, Vec<Value>> = BTreeMap::new();
            for (k, x) in o {
                if volatile_key(k) {
                    continue;
                }
                groups.entry(renames.apply(k)).or_default().push(scrub(x, renames, sort_arrays));
            }
            let mut out = Map::new();
            for (k, mut values) in groups {
                values.sort_by_key(|x| x.to_string());
                for (i, x) in values.into_iter().enumerate() {
                    let key = if i == 0 { k.clone() } else { format!("{k}#{}", i + 1) };
                    out.insert(key, x);
                }
            }
            Value::Object(out)
        }
        other => other.clone(),
    }
}

fn strings_map(v: &Value) -> Value {
    match v.as_object() {
        Some(o) => Value::Object(o.iter().map(|(k, v)| (k.clone(), v.clone())).collect()),
        None => json!({}),
    }
}

/// Annotations that clients, not the CCMs, write (`kubectl`'s last applied configuration).
fn foreign_annotation(k: &str) -> bool {
    k == "kubectl.kubernetes.io/last-applied-configuration"
}

/// A Node as the CCMs leave it: labels, annotations, taints (key, value, effect), addresses
/// in order, providerID, conditions (type → status and reason); timestamps, UIDs,
/// resourceVersions and managedFields dropped.
pub fn normalise_node(node: &Value, renames: &Renames) -> Value {
    let mut annotations = strings_map(&node["metadata"]["annotations"]);
    if let Some(o) = annotations.as_object_mut() {
        o.retain(|k, _| !foreign_annotation(k));
    }
    let mut taints: Vec<Value> = node["spec"]["taints"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|t| json!({"key": t["key"], "value": t["value"], "effect": t["effect"]}))
        .collect();
    taints.sort_by_key(|t| t.to_string());
    let addresses: Vec<Value> = node["status"]["addresses"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|a| {
            Value::String(format!(
                "{}={}",
                a["type"].as_str().unwrap_or(""),
                a["address"].as_str().unwrap_or("")
            ))
        })
        .collect();
    let conditions: Map<String, Value> = node["status"]["conditions"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some((
                c["type"].as_str()?.to_string(),
                json!({"status": c["status"], "reason": c["reason"]}),
            ))
        })
        .collect();
    let v = json!({
        "labels": strings_map(&node["metadata"]["labels"]),
        "annotations": annotations,
        "taints": taints,
        "addresses": addresses,
        "providerID": node["spec"]["providerID"],
        "podCIDRs": node["spec"]["podCIDRs"],
        "conditions": conditions,
    });
    scrub(&v, renames, false)
}

/// A Service as the CCMs leave it: annotations, finalizers, the load balancer's ingress and
/// the status conditions.
pub fn normalise_service(svc: &Value, renames: &Renames) -> Value {
    let mut annotations = strings_map(&svc["metadata"]["annotations"]);
    if let Some(o) = annotations.as_object_mut() {
        o.retain(|k, _| !foreign_annotation(k));
    }
    let mut finalizers: Vec<Value> =
        svc["metadata"]["finalizers"].as_array().cloned().unwrap_or_default();
    finalizers.sort_by_key(|f| f.to_string());
    let v = json!({
        "annotations": annotations,
        "finalizers": finalizers,
        "ingress": svc["status"]["loadBalancer"]["ingress"],
        "conditions": svc["status"]["conditions"],
    });
    scrub(&v, renames, false)
}

/// Events as a set: `<Kind>/<name> <type> <reason>` → the source component (the reporting
/// controller when the source is empty); counts, messages, hosts and times dropped.
pub fn normalise_events(events: &[Value], renames: &Renames) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in events {
        let kind = e["involvedObject"]["kind"].as_str().or(e["regarding"]["kind"].as_str());
        let name = e["involvedObject"]["name"].as_str().or(e["regarding"]["name"].as_str());
        let source = e["source"]["component"]
            .as_str()
            .filter(|s| !s.is_empty())
            .or(e["reportingComponent"].as_str())
            .or(e["reportingController"].as_str())
            .unwrap_or("");
        let key = format!(
            "{}/{} {} {}",
            kind.unwrap_or("?"),
            name.unwrap_or("?"),
            e["type"].as_str().unwrap_or("?"),
            e["reason"].as_str().unwrap_or("?")
        );
        out.insert(renames.apply(&key), source.to_string());
    }
    out
}

/// The calls made between two counter readings (`{"op": n}`), zeros left out.
pub fn call_delta(
    after: &BTreeMap<String, u64>,
    before: &BTreeMap<String, u64>,
) -> BTreeMap<String, u64> {
    after
        .iter()
        .map(|(k, v)| (k.clone(), v.saturating_sub(before.get(k).copied().unwrap_or(0))))
        .filter(|(_, v)| *v > 0)
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Diffing.

/// One path segment as written in a difference's path: as is, or in brackets when it holds a
/// `/` (label keys).
fn segment(k: &str) -> String {
    if k.contains('/') { format!("[{k}]") } else { k.to_string() }
}

/// Every leaf of `v` by path (`a/b/[c/d]/0`); an empty object or array is a leaf (`{}`, `[]`).
pub fn flatten(v: &Value) -> BTreeMap<String, String> {
    fn walk(v: &Value, path: &str, out: &mut BTreeMap<String, String>) {
        let join =
            |k: &str| if path.is_empty() { segment(k) } else { format!("{path}/{}", segment(k)) };
        match v {
            Value::Object(o) if !o.is_empty() => {
                for (k, x) in o {
                    walk(x, &join(k), out);
                }
            }
            Value::Array(a) if !a.is_empty() => {
                for (i, x) in a.iter().enumerate() {
                    walk(x, &join(&i.to_string()), out);
                }
            }
            Value::Null => {}
            Value::String(s) => {
                out.insert(path.to_string(), s.clone());
            }
            other => {
                out.insert(path.to_string(), other.to_string());
            }
        }
    }
    let mut out = BTreeMap::new();
    walk(v, "", &mut out);
    out
}

/// A difference between the two sides at one step.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Difference {
    /// The scenario step.
    pub step: String,
    /// Where (see [`flatten`]).
    pub path: String,
    /// Upstream's value (None: absent upstream).
    pub upstream: Option<String>,
    /// Ours.
    pub ours: Option<String>,
}

/// The differences of two normalised snapshots of one step.
pub fn diff(step: &str, upstream: &Value, ours: &Value) -> Vec<Difference> {
    let (u, o) = (flatten(upstream), flatten(ours));
    let paths: BTreeSet<&String> = u.keys().chain(o.keys()).collect();
    paths
        .into_iter()
        .filter(|p| u.get(*p) != o.get(*p))
        .map(|p| Difference {
            step: step.to_string(),
            path: p.clone(),
            upstream: u.get(p).cloned(),
            ours: o.get(p).cloned(),
        })
        .collect()
}

fn value_matches(pattern: &Option<String>, value: &Option<String>) -> bool {
    match (pattern.as_deref(), value) {
        (None, _) => true,
        (Some("~"), None) => true,
        (Some("~"), Some(_)) | (Some(_), None) => false,
        (Some(p), Some(v)) => glob(p, v),
    }
}

impl KnownDifference {
    /// Whether this entry documents `d`.
    pub fn matches(&self, d: &Difference) -> bool {
        glob(&self.step, &d.step)
            && glob(&self.path, &d.path)
            && value_matches(&self.upstream, &d.upstream)
            && value_matches(&self.ours, &d.ours)
    }
}

/// A difference and the documented entry (its index) that explains it, if any.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct Classified {
    /// The difference.
    pub difference: Difference,
    /// The first documented entry matching it.
    pub known: Option<usize>,
}

/// Each difference matched against the documented ones (first match wins).
pub fn classify(diffs: Vec<Difference>, known: &Known) -> Vec<Classified> {
    diffs
        .into_iter()
        .map(|d| {
            let k = known.differences.iter().position(|k| k.matches(&d));
            Classified { difference: d, known: k }
        })
        .collect()
}

/// A step's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Verdict {
    /// No difference.
    Identical,
    /// Every difference documented.
    Documented,
    /// Some difference not documented.
    Unexplained,
}

impl Verdict {
    /// As shown in the table.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Identical => "identical",
            Verdict::Documented => "documented-difference",
            Verdict::Unexplained => "unexplained",
        }
    }
}

/// One row of the table: a step, how many differences, how many documented, the verdict.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
pub struct StepRow {
    /// The step.
    pub step: String,
    /// Its differences.
    pub differences: Vec<Classified>,
}

impl StepRow {
    /// The step's verdict.
    pub fn verdict(&self) -> Verdict {
        if self.differences.is_empty() {
            Verdict::Identical
        } else if self.differences.iter().all(|c| c.known.is_some()) {
            Verdict::Documented
        } else {
            Verdict::Unexplained
        }
    }

    /// The unexplained differences.
    pub fn unexplained(&self) -> impl Iterator<Item = &Difference> {
        self.differences.iter().filter(|c| c.known.is_none()).map(|c| &c.difference)
    }
}

/// The rows of a run: each step's two snapshots diffed and classified. Steps missing on one
/// side (a run that stopped early) are one unexplained difference `step` (absent there).
pub fn rows(
    steps: &[String],
    upstream: &BTreeMap<String, Value>,
    ours: &BTreeMap<String, Value>,
    known: &Known,
) -> Vec<StepRow> {
    steps
        .iter()
        .map(|s| {
            let diffs = match (upstream.get(s), ours.get(s)) {
                (Some(u), Some(o)) => diff(s, u, o),
                (u, o) => vec![Difference {
                    step: s.clone(),
                    path: "step".into(),
                    upstream: u.map(|_| "ran".to_string()),
                    ours: o.map(|_| "ran".to_string()),
                }],
            };
            StepRow { step: s.clone(), differences: classify(diffs, known) }
        })
        .collect()
}

/// The table printed by `ci/differential`: step, differences, documented, unexplained,
/// verdict.
pub fn table(rows: &[StepRow]) -> String {
    let mut s = String::from(
        "| step | differences | documented | unexplained | verdict |\n|---|---|---|---|---|\n",
    );
    for r in rows {
        let n = r.differences.len();
        let u = r.unexplained().count();
        s.push_str(&format!("| {} | {n} | {} | {u} | {} |\n", r.step, n - u, r.verdict().as_str()));
    }
    s
}

/// The unexplained differences, one line each (for the terminal).
pub fn unexplained_lines(rows: &[StepRow]) -> Vec<String> {
    let show = |v: &Option<String>| v.clone().unwrap_or_else(|| "(absent)".into());
    rows.iter()
        .flat_map(|r| r.unexplained())
        .map(|d| {
            format!(
                "{}: {}: upstream {} / ours {}",
                d.step,
                d.path,
                show(&d.upstream),
                show(&d.ours)
            )
        })
        .collect()
}

/// Which documented entries matched nothing in `rows` (stale; reported, not a failure).
pub fn unused(rows: &[StepRow], known: &Known) -> Vec<usize> {
    let used: BTreeSet<usize> =
        rows.iter().flat_map(|r| r.differences.iter().filter_map(|c| c.known)).collect();
    (0..known.differences.len()).filter(|i| !used.contains(i)).collect()
}

// ---------------------------------------------------------------------------------------------
// The page.

/// What the page says of the run besides the documented differences.
#[derive(Debug, Clone)]
pub struct PageFacts {
    /// The cloud.
    pub cloud: String,
    /// Upstream's module and version (`k8s.io/cloud-provider-aws v1.36.2`).
    pub upstream: String,
    /// Upstream's artifact whose command line both binaries run with.
    pub artifact: String,
    /// The scenario's steps with what each does.
    pub steps: Vec<(String, String)>,
    /// The last run's rows (None: not run; the page then says so).
    pub rows: Option<Vec<StepRow>>,
    /// Why the cloud did not run, when it did not.
    pub not_run: Option<String>,
}

fn cell(s: &str) -> String {
    s.replace('|', "\\|").replace('\n', " ").replace('<', "&lt;")
}

/// `docs/compatibility/<cloud>.md`: no timestamps, durations or counts that vary, so
/// regenerating it after an equal run changes nothing.
pub fn page(facts: &PageFacts, known: &Known) -> String {
    let mut s = format!(
        "# Differential: upstream's {cloud} CCM as the oracle\n\n\
         <!-- Generated by `ci/differential {cloud}` (testbed/src/differential/, \
         testbed/fixtures/differential/{cloud}.yaml): do not edit. -->\n\n\
         `ci/differential {cloud}` runs upstream's cloud-controller-manager **{upstream}** (built from \
         the Go module proxy by `ci/install-tools`, cached in the tool cache) and ours, each on its own \
         fresh kube-apiserver and its own emulator started from the same world, with the same command \
         line (upstream's {artifact}), RBAC identity and cloud config, drives both through the same \
         scenario with the same bounded waits, and diffs, normalised, after every step: the Nodes \
         (labels, annotations, taints, addresses, providerID, conditions), the Services (annotations, \
         finalizers, ingress, conditions), new Events (kind/name, type, reason, source component), the \
         cloud's state (the emulator's state dump; generated IDs and times replaced) and the calls each \
         side made in the step (the emulator's or the fault proxy's per-operation counters). Every \
         difference is either listed below with its decision or the run fails.\n\n",
        cloud = facts.cloud,
        upstream = facts.upstream,
        artifact = cell(&facts.artifact),
    );
    s.push_str("## Scenario\n\n| step | what happens |\n|---|---|\n");
    for (step, what) in &facts.steps {
        s.push_str(&format!("| `{step}` | {} |\n", cell(what)));
    }
    s.push_str("\n## Result\n\n");
    match (&facts.rows, &facts.not_run) {
        (_, Some(why)) => s.push_str(&format!("Not run: {}\n\n", cell(why))),
        (Some(rows), None) => {
            s.push_str(
                "| step | verdict | documented differences (entries below) |\n|---|---|---|\n",
            );
            for r in rows {
                let used: BTreeSet<usize> = r.differences.iter().filter_map(|c| c.known).collect();
                let list: Vec<String> = used.iter().map(|i| format!("D{}", i + 1)).collect();
                s.push_str(&format!(
                    "| `{}` | {} | {} |\n",
                    r.step,
                    r.verdict().as_str(),
                    list.join(", ")
                ));
            }
            s.push('\n');
        }
        (None, None) => s.push_str("Not run yet.\n\n"),
    }
    s.push_str("## Documented differences\n\n");
    if known.differences.is_empty() {
        s.push_str("None.\n\n");
    } else {
        s.push_str("| # | steps | path | upstream | ours | decision | why |\n|---|---|---|---|---|---|---|\n");
        for (i, d) in known.differences.iter().enumerate() {
            let v = |x: &Option<String>| match x.as_deref() {
                None => "any".to_string(),
                Some("~") => "(absent)".to_string(),
                Some(x) => format!("`{}`", cell(x)),
            };
            s.push_str(&format!(
                "| D{} | `{}` | `{}` | {} | {} | {} | {} |\n",
                i + 1,
                cell(&d.step),
                cell(&d.path),
                v(&d.upstream),
                v(&d.ours),
                d.decision.as_str(),
                cell(&d.why)
            ));
        }
        s.push('\n');
    }
    s.push_str(
        "Decisions: **ours-kept** ours differs on purpose; **upstream-quirk-fixed** upstream's \
         behaviour is a quirk ours does not reproduce; **emulator-limit** the emulator cannot show \
         what the cloud would; **timing** the sides' periodic calls or retries fall differently in a \
         settle window; **to-fix** a difference of ours, reported for fixing.\n\n\
         ## GCP and IBM Cloud\n\n\
         No differential runs for GCP and IBM Cloud: upstream's source is not served by the Go \
         module proxy (`k8s.io/cloud-provider-gcp` and IBM's `cloud-provider-ibm` are not published as \
         modules the proxy can fetch), so upstream's CCM cannot be built here at a pinned version. \
         Their upstream compatibility rests on `ci/swap` (upstream's documented manifests as \
         fixtures) and the conformance suite.\n",
    );
    s
}
