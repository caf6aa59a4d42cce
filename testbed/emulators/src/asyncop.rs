//! Long-running operations as clouds report them: an operation is pending for a configurable
//! time, then done (or failed), so providers are tested polling as in production.
//!
//! [`AsyncOps`] keeps the operations and their clock; the `*_status`/`*_operation` helpers
//! render a phase in each cloud's shape:
//! - ARM `Azure-AsyncOperation` body: `{"status": "InProgress" | "Succeeded" | "Failed"}`,
//! - GCE `compute#operation`: `status` `PENDING` → `RUNNING` → `DONE` (with `error` on failure),
//! - Octavia `provisioning_status`: `PENDING_CREATE|PENDING_UPDATE|PENDING_DELETE` →
//!   `ACTIVE` (`DELETED` after a delete) or `ERROR`,
//! - IBM VPC `status`/`provisioning_status`: `create_pending|update_pending|delete_pending` →
//!   `active` (`deleted`) or `failed`.
//!
//! How long an operation stays pending comes from a timing profile ([`TimingProfile`]): `fast`
//! (the cloud's test values, [`AsyncOps::new`] / [`AsyncOps::set_fast`]) or `realistic` (the
//! table the cloud registers with [`AsyncOps::set_realistic`]), each per action ([`Timing`])
//! and multiplied by a scale. Which profile, and which operations fail
//! ([`OperationFailure`]), is the server's [`OpControls`] (admin API `timing` and
//! `operation-failures`): the server makes them current while it serves a call, so the
//! cloud's own [`AsyncOps::start`] calls pick them up without any wiring.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

/// Where an operation is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Phase {
    /// Still running.
    Pending,
    /// Finished successfully.
    Done,
    /// Finished with this error message.
    Failed(String),
}

/// What an operation does to its target (for the shapes that distinguish it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Creating the target.
    Create,
    /// Changing it.
    Update,
    /// Deleting it.
    Delete,
}

/// How long operations stay pending, per action.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// Creating a resource.
    pub create: Duration,
    /// Changing it.
    pub update: Duration,
    /// Deleting it.
    pub delete: Duration,
}

impl Timing {
    /// The same time for every action.
    pub const fn uniform(d: Duration) -> Timing {
        Timing { create: d, update: d, delete: d }
    }

    /// The time of `action`.
    pub fn of(&self, action: Action) -> Duration {
        match action {
            Action::Create => self.create,
            Action::Update => self.update,
            Action::Delete => self.delete,
        }
    }

    /// Every time multiplied by `scale` (saturating; `scale` is checked by
    /// [`TimingSelection::validate`], a bad one leaves the times as they are).
    pub fn scaled(&self, scale: f64) -> Timing {
        let f = |d: Duration| {
            Duration::try_from_secs_f64(d.as_secs_f64() * scale).unwrap_or(if scale > 1.0 {
                Duration::MAX
            } else {
                d
            })
        };
        Timing { create: f(self.create), update: f(self.update), delete: f(self.delete) }
    }
}

/// Which timing table operations use.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimingProfile {
    /// The cloud's test values (the default).
    #[default]
    Fast,
    /// The cloud's realistic table ([`AsyncOps::set_realistic`]); a cloud that registered none
    /// uses its fast values.
    Realistic,
}

impl std::fmt::Display for TimingProfile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            TimingProfile::Fast => "fast",
            TimingProfile::Realistic => "realistic",
        })
    }
}

impl std::str::FromStr for TimingProfile {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "fast" => Ok(TimingProfile::Fast),
            "realistic" => Ok(TimingProfile::Realistic),
            other => Err(format!("unknown timing profile {other:?} (fast or realistic)")),
        }
    }
}

/// The largest accepted [`TimingSelection::scale`].
pub const MAX_SCALE: f64 = 1000.0;

fn one() -> f64 {
    1.0
}

/// A timing profile and the factor its times are multiplied by: the admin API's
/// `POST /__emulator/timing` body and the world file's `timing:` key.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimingSelection {
    /// The profile.
    pub profile: TimingProfile,
    /// The factor (default 1; `0.1` makes a 60 s realistic create last 6 s).
    #[serde(default = "one")]
    pub scale: f64,
}

// `scale` is finite (checked by `validate` wherever a selection is accepted).
impl Eq for TimingSelection {}

impl Default for TimingSelection {
    fn default() -> Self {
        TimingSelection { profile: TimingProfile::Fast, scale: 1.0 }
    }
}

impl TimingSelection {
    /// `profile` with times multiplied by `scale`.
    pub fn new(profile: TimingProfile, scale: f64) -> Self {
        TimingSelection { profile, scale }
    }

    /// Checks the scale; the message says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if !self.scale.is_finite() || !(0.0..=MAX_SCALE).contains(&self.scale) {
            return Err(format!("\"scale\" {} is not within 0..={MAX_SCALE}", self.scale));
        }
        Ok(())
    }
}

/// A [`Timing`] in milliseconds, as the admin API shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimingMs {
    /// Creating, in milliseconds.
    pub create_ms: u64,
    /// Updating.
    pub update_ms: u64,
    /// Deleting.
    pub delete_ms: u64,
}

impl From<Timing> for TimingMs {
    fn from(t: Timing) -> Self {
        let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        TimingMs { create_ms: ms(t.create), update_ms: ms(t.update), delete_ms: ms(t.delete) }
    }
}

impl From<TimingMs> for Timing {
    fn from(t: TimingMs) -> Self {
        Timing {
            create: Duration::from_millis(t.create_ms),
            update: Duration::from_millis(t.update_ms),
            delete: Duration::from_millis(t.delete_ms),
        }
    }
}

/// `GET /__emulator/timing`: the selection, and the cloud's tables (unscaled) when the cloud
/// reports its operations (`Cloud::async_ops`).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct TimingReport {
    /// The selected profile.
    pub profile: TimingProfile,
    /// Its scale.
    pub scale: f64,
    /// The fast table (None: the cloud does not report it).
    #[serde(default)]
    pub fast: Option<TimingMs>,
    /// The realistic table (None: not reported or not registered).
    #[serde(default)]
    pub realistic: Option<TimingMs>,
}

impl TimingReport {
    /// The selection part.
    pub fn selection(&self) -> TimingSelection {
        TimingSelection { profile: self.profile, scale: self.scale }
    }
}

/// Which actions an [`OperationFailure`] applies to.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ActionMatch {
    /// Creates only.
    Create,
    /// Updates only.
    Update,
    /// Deletes only.
    Delete,
    /// Every action (the default).
    #[default]
    Any,
}

impl ActionMatch {
    /// Whether `action` is one of these.
    pub fn matches(self, action: Action) -> bool {
        matches!(
            (self, action),
            (ActionMatch::Any, _)
                | (ActionMatch::Create, Action::Create)
                | (ActionMatch::Update, Action::Update)
                | (ActionMatch::Delete, Action::Delete)
        )
    }
}

impl From<Action> for ActionMatch {
    fn from(a: Action) -> Self {
        match a {
            Action::Create => ActionMatch::Create,
            Action::Update => ActionMatch::Update,
            Action::Delete => ActionMatch::Delete,
        }
    }
}

fn one_time() -> u64 {
    1
}

fn default_failure_message() -> String {
    "the operation failed (injected by the emulator)".into()
}

/// Arms failures of long-running operations (`POST /__emulator/operation-failures`): the next
/// `times` operations [`AsyncOps::start`]ed on a target matching `target` with a matching
/// `action` end [`Phase::Failed`] with `message` after their pending time instead of
/// [`Phase::Done`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OperationFailure {
    /// Glob on the operation's target (`*` wildcards; `*` for every operation). What a target
    /// is depends on the cloud (docs/emulators.md: a resource ID, a self link, …).
    pub target: String,
    /// Which actions (default `any`).
    #[serde(default)]
    pub action: ActionMatch,
    /// How many operations fail (default 1).
    #[serde(default = "one_time")]
    pub times: u64,
    /// The failure's message, as the cloud's operation error reports it.
    #[serde(default = "default_failure_message")]
    pub message: String,
}

impl OperationFailure {
    /// `times` failures of `action` operations on targets matching `target`.
    pub fn new(
        target: impl Into<String>,
        action: impl Into<ActionMatch>,
        times: u64,
        message: impl Into<String>,
    ) -> Self {
        OperationFailure {
            target: target.into(),
            action: action.into(),
            times,
            message: message.into(),
        }
    }

    /// Checks the rule; the message says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.target.is_empty() {
            return Err("\"target\" is empty (use \"*\" for every operation)".into());
        }
        if self.times == 0 {
            return Err("\"times\" is 0 (at least 1)".into());
        }
        if self.message.is_empty() {
            return Err("\"message\" is empty".into());
        }
        Ok(())
    }
}

/// The server's controls of long-running operations: the timing selection and the armed
/// operation failures. The server makes its controls current while serving a call
/// ([`OpControls::scope`]); [`AsyncOps::start`] reads them.
#[derive(Debug, Default)]
pub struct OpControls {
    initial: TimingSelection,
    selection: Mutex<TimingSelection>,
    failures: Mutex<Vec<(u64, OperationFailure)>>,
    next_id: Mutex<u64>,
}

tokio::task_local! {
    static CONTROLS: Arc<OpControls>;
}

impl OpControls {
    /// Controls starting (and reset to) `initial` with no failures armed.
    pub fn new(initial: TimingSelection) -> Self {
        OpControls { initial, selection: Mutex::new(initial), ..Default::default() }
    }

    /// The timing selection now.
    pub fn timing(&self) -> TimingSelection {
        *lock(&self.selection)
    }

    /// Selects a timing profile for operations started from now on.
    pub fn set_timing(&self, sel: TimingSelection) -> Result<(), String> {
        sel.validate()?;
        *lock(&self.selection) = sel;
        Ok(())
    }

    /// Arms a failure rule; returns its id.
    pub fn add_failure(&self, rule: OperationFailure) -> Result<u64, String> {
        rule.validate()?;
        let id = {
            let mut n = lock(&self.next_id);
            *n += 1;
            *n
        };
        lock(&self.failures).push((id, rule));
        Ok(id)
    }

    /// The armed rules with the failures each has left.
    pub fn failures(&self) -> Vec<(u64, OperationFailure)> {
        lock(&self.failures).clone()
    }

    /// Disarms every failure rule.
    pub fn clear_failures(&self) {
        lock(&self.failures).clear();
    }

    /// Disarms every failure rule and restores the initial timing.
    pub fn reset(&self) {
        self.clear_failures();
        *lock(&self.selection) = self.initial;
    }

    /// The message of the first armed rule matching, which loses one of its `times`.
    fn take_failure(&self, target: &str, action: Action) -> Option<String> {
        let mut rules = lock(&self.failures);
        let at = rules.iter().position(|(_, r)| {
            r.action.matches(action) && crate::faults::glob_matches(&r.target, target)
        })?;
        let msg = rules[at].1.message.clone();
        rules[at].1.times -= 1;
        if rules[at].1.times == 0 {
            rules.remove(at);
        }
        Some(msg)
    }

    /// The admin API's view: `{"timing": …, "operation_failures": [...]}`.
    pub fn state(&self) -> serde_json::Value {
        let failures: Vec<serde_json::Value> = self
            .failures()
            .into_iter()
            .map(|(id, r)| {
                let mut v = serde_json::to_value(&r).unwrap_or_default();
                v["id"] = serde_json::json!(id);
                v
            })
            .collect();
        serde_json::json!({ "timing": self.timing(), "operation_failures": failures })
    }

    /// Runs `fut` with `controls` current (what [`AsyncOps::start`] reads).
    pub async fn scope<F: Future>(controls: Arc<OpControls>, fut: F) -> F::Output {
        CONTROLS.scope(controls, fut).await
    }

    /// Runs `f` with `controls` current.
    pub fn sync_scope<R>(controls: Arc<OpControls>, f: impl FnOnce() -> R) -> R {
        CONTROLS.sync_scope(controls, f)
    }

    fn current() -> Option<Arc<OpControls>> {
        CONTROLS.try_with(Arc::clone).ok()
    }
}

/// One operation.
#[derive(Debug, Clone)]
pub struct Operation {
    /// Its id (`op-<n>`).
    pub id: String,
    /// What it acts on (a resource path or name).
    pub target: String,
    /// What it does.
    pub action: Action,
    started: Instant,
    pending_for: Duration,
    failure: Option<String>,
    canceled: bool,
}

impl Operation {
    /// The phase now.
    pub fn phase(&self) -> Phase {
        if self.started.elapsed() < self.pending_for {
            Phase::Pending
        } else if let Some(msg) = &self.failure {
            Phase::Failed(msg.clone())
        } else {
            Phase::Done
        }
    }

    /// How long it is pending in all (from its timing profile when it started).
    pub fn pending_for(&self) -> Duration {
        self.pending_for
    }

    /// How long until it finishes (zero when finished).
    pub fn remaining(&self) -> Duration {
        self.pending_for.saturating_sub(self.started.elapsed())
    }

    /// Whether it ended because it was canceled ([`AsyncOps::cancel`]); its phase is then
    /// [`Phase::Failed`] with the cancellation's message.
    pub fn canceled(&self) -> bool {
        self.canceled
    }
}

/// The long-running operations of one emulator.
#[derive(Debug)]
pub struct AsyncOps {
    fast: Mutex<Timing>,
    realistic: Mutex<Option<Timing>>,
    warned_no_realistic: AtomicBool,
    ops: Mutex<BTreeMap<String, Operation>>,
    next: Mutex<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AsyncOps {
    /// Operations that stay pending for `pending_for` (every action) in the `fast` profile.
    pub fn new(pending_for: Duration) -> Self {
        AsyncOps {
            fast: Mutex::new(Timing::uniform(pending_for)),
            realistic: Mutex::new(None),
            warned_no_realistic: AtomicBool::new(false),
            ops: Mutex::new(BTreeMap::new()),
            next: Mutex::new(0),
        }
    }

    /// Changes how long operations started from now on stay pending in the `fast` profile
    /// (every action).
    pub fn set_pending_for(&self, d: Duration) {
        *lock(&self.fast) = Timing::uniform(d);
    }

    /// Sets the `fast` profile's times per action.
    pub fn set_fast(&self, t: Timing) {
        *lock(&self.fast) = t;
    }

    /// The `fast` profile's times.
    pub fn fast(&self) -> Timing {
        *lock(&self.fast)
    }

    /// Registers the cloud's `realistic` profile (docs/emulators.md cites each cloud's source).
    pub fn set_realistic(&self, t: Timing) {
        *lock(&self.realistic) = Some(t);
    }

    /// The `realistic` profile's times, when the cloud registered them.
    pub fn realistic(&self) -> Option<Timing> {
        *lock(&self.realistic)
    }

    /// The times, per action, of operations started now under `sel`: the profile's table
    /// (the fast one when the cloud registered no realistic table) multiplied by its scale.
    pub fn timing(&self, sel: TimingSelection) -> Timing {
        let table = match sel.profile {
            TimingProfile::Fast => self.fast(),
            TimingProfile::Realistic => match self.realistic() {
                Some(t) => t,
                None => {
                    if !self.warned_no_realistic.swap(true, Ordering::Relaxed) {
                        tracing::warn!(
                            "timing profile realistic selected but this emulator registered no \
                             realistic table; its operations use the fast times"
                        );
                    }
                    self.fast()
                }
            },
        };
        table.scaled(sel.scale)
    }

    /// Starts an operation that succeeds — unless a failure armed in the current
    /// [`OpControls`] matches its target and action; then it fails with that rule's message
    /// once it finishes. Its pending time is that of the current timing selection.
    pub fn start(&self, target: impl Into<String>, action: Action) -> Operation {
        self.start_timed(target, action, action)
    }

    /// [`Self::start`], pending as long as a `timed_as` operation (an Octavia listener
    /// created on a load balancer is an update of the load balancer, not a second create).
    pub fn start_timed(
        &self,
        target: impl Into<String>,
        action: Action,
        timed_as: Action,
    ) -> Operation {
        let target = target.into();
        let failure = OpControls::current().and_then(|c| c.take_failure(&target, action));
        if let Some(m) = &failure {
            tracing::info!(%target, ?action, message = %m, "emulator operation will fail (armed)");
        }
        self.start_inner(target, action, timed_as, failure)
    }

    /// Starts an operation that fails with `message` once it finishes.
    pub fn start_failing(
        &self,
        target: impl Into<String>,
        action: Action,
        message: impl Into<String>,
    ) -> Operation {
        self.start_inner(target.into(), action, action, Some(message.into()))
    }

    fn start_inner(
        &self,
        target: String,
        action: Action,
        timed_as: Action,
        failure: Option<String>,
    ) -> Operation {
        let id = {
            let mut n = lock(&self.next);
            *n += 1;
            format!("op-{n}")
        };
        let sel = OpControls::current().map(|c| c.timing()).unwrap_or_default();
        let op = Operation {
            id: id.clone(),
            target,
            action,
            started: Instant::now(),
            pending_for: self.timing(sel).of(timed_as),
            failure,
            canceled: false,
        };
        lock(&self.ops).insert(id, op.clone());
        op
    }

    /// Ends a pending operation now as canceled, with `message` (e.g. ARM's
    /// `CanceledAndSupersededDueToAnotherOperation`); false when it is unknown or already over.
    pub fn cancel(&self, id: &str, message: impl Into<String>) -> bool {
        let mut ops = lock(&self.ops);
        match ops.get_mut(id) {
            Some(op) if op.phase() == Phase::Pending => {
                op.pending_for = op.started.elapsed();
                op.failure = Some(message.into());
                op.canceled = true;
                true
            }
            _ => false,
        }
    }

    /// Ends every pending operation now, as it would have ended (a test holds operations
    /// with a long pending time, looks at what a client does meanwhile, then lets them end).
    pub fn finish_pending(&self) {
        for op in lock(&self.ops).values_mut() {
            if op.phase() == Phase::Pending {
                op.pending_for = op.started.elapsed();
            }
        }
    }

    /// The operation with this id.
    pub fn get(&self, id: &str) -> Option<Operation> {
        lock(&self.ops).get(id).cloned()
    }

    /// The operation's phase now (None: unknown id).
    pub fn phase(&self, id: &str) -> Option<Phase> {
        self.get(id).map(|o| o.phase())
    }

    /// Forgets every operation.
    pub fn reset(&self) {
        lock(&self.ops).clear();
    }

    /// Every operation and its phase, for `GET /__emulator/state`.
    pub fn state(&self) -> serde_json::Value {
        let ops = lock(&self.ops);
        serde_json::Value::Array(
            ops.values()
                .map(|o| {
                    serde_json::json!({
                        "id": o.id,
                        "target": o.target,
                        "phase": match o.phase() {
                            Phase::Pending => "pending".to_string(),
                            Phase::Done => "done".to_string(),
                            Phase::Failed(m) => format!("failed: {m}"),
                        },
                    })
                })
                .collect(),
        )
    }
}

/// ARM `Azure-AsyncOperation` status body of an operation: [`arm_status`] of its phase, or
/// `Canceled` with `CanceledAndSupersededDueToAnotherOperation` when it was canceled.
pub fn arm_operation_status(op: &Operation) -> serde_json::Value {
    match op.phase() {
        Phase::Failed(m) if op.canceled() => serde_json::json!({
            "status": "Canceled",
            "error": { "code": "CanceledAndSupersededDueToAnotherOperation", "message": m },
        }),
        phase => arm_status(&phase),
    }
}

/// ARM `Azure-AsyncOperation` status body.
pub fn arm_status(phase: &Phase) -> serde_json::Value {
    match phase {
        Phase::Pending => serde_json::json!({ "status": "InProgress" }),
        Phase::Done => serde_json::json!({ "status": "Succeeded" }),
        Phase::Failed(m) => serde_json::json!({
            "status": "Failed",
            "error": { "code": "OperationFailed", "message": m },
        }),
    }
}

/// A GCE `compute#operation` (zonal when `zone` is given). `base` is the self-link prefix,
/// e.g. `https://compute.googleapis.com/compute/v1/projects/p`.
pub fn gce_operation(op: &Operation, base: &str, zone: Option<&str>) -> serde_json::Value {
    let scope = zone.map(|z| format!("/zones/{z}")).unwrap_or_else(|| "/global".into());
    let phase = op.phase();
    let status = match (&phase, op.started.elapsed() < op.pending_for / 2) {
        (Phase::Pending, true) => "PENDING",
        (Phase::Pending, false) => "RUNNING",
        _ => "DONE",
    };
    let op_type = match op.action {
        Action::Create => "insert",
        Action::Update => "patch",
        Action::Delete => "delete",
    };
    let mut v = serde_json::json!({
        "kind": "compute#operation",
        "id": op.id.trim_start_matches("op-"),
        "name": op.id,
        "operationType": op_type,
        "status": status,
        "targetLink": op.target,
        "selfLink": format!("{base}{scope}/operations/{}", op.id),
        "progress": if status == "DONE" { 100 } else { 0 },
    });
    if let Some(z) = zone {
        v["zone"] = serde_json::json!(format!("{base}/zones/{z}"));
    }
    if let Phase::Failed(m) = phase {
        v["error"] =
            serde_json::json!({ "errors": [{ "code": "OPERATION_FAILED", "message": m }] });
    }
    v
}

/// Octavia `provisioning_status` of the operation's target.
pub fn octavia_provisioning_status(op: &Operation) -> &'static str {
    match (op.phase(), op.action) {
        (Phase::Pending, Action::Create) => "PENDING_CREATE",
        (Phase::Pending, Action::Update) => "PENDING_UPDATE",
        (Phase::Pending, Action::Delete) => "PENDING_DELETE",
        (Phase::Done, Action::Delete) => "DELETED",
        (Phase::Done, _) => "ACTIVE",
        (Phase::Failed(_), _) => "ERROR",
    }
}

/// IBM VPC `provisioning_status` / `status` of the operation's target.
pub fn ibm_status(op: &Operation) -> &'static str {
    match (op.phase(), op.action) {
        (Phase::Pending, Action::Create) => "create_pending",
        (Phase::Pending, Action::Update) => "update_pending",
        (Phase::Pending, Action::Delete) => "delete_pending",
        (Phase::Done, Action::Delete) => "deleted",
        (Phase::Done, _) => "active",
        (Phase::Failed(_), _) => "failed",
    }
}
