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

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Duration;

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
    pending_for: Mutex<Duration>,
    ops: Mutex<BTreeMap<String, Operation>>,
    next: Mutex<u64>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl AsyncOps {
    /// Operations that stay pending for `pending_for`.
    pub fn new(pending_for: Duration) -> Self {
        AsyncOps {
            pending_for: Mutex::new(pending_for),
            ops: Mutex::new(BTreeMap::new()),
            next: Mutex::new(0),
        }
    }

    /// Changes how long operations started from now on stay pending.
    pub fn set_pending_for(&self, d: Duration) {
        *lock(&self.pending_for) = d;
    }

    /// Starts an operation that succeeds.
    pub fn start(&self, target: impl Into<String>, action: Action) -> Operation {
        self.start_inner(target.into(), action, None)
    }

    /// Starts an operation that fails with `message` once it finishes.
    pub fn start_failing(
        &self,
        target: impl Into<String>,
        action: Action,
        message: impl Into<String>,
    ) -> Operation {
        self.start_inner(target.into(), action, Some(message.into()))
    }

    fn start_inner(&self, target: String, action: Action, failure: Option<String>) -> Operation {
        let id = {
            let mut n = lock(&self.next);
            *n += 1;
            format!("op-{n}")
        };
        let op = Operation {
            id: id.clone(),
            target,
            action,
            started: Instant::now(),
            pending_for: *lock(&self.pending_for),
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
