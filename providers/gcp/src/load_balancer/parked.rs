//! Compute operations an external load balancer's sync started and did not wait for (issue
//! #35 (b)): Compute takes seconds to minutes per operation (an address, a firewall, a target
//! pool, a forwarding rule: four in a row for one load balancer), and a sync that waited for
//! each held its worker meanwhile, so with upstream's one worker 100 Services created at once
//! took 100 times as long as one.
//!
//! A mutation of the Service's own resources ([`super::api::Api`] with parking on) waits for
//! its operation at most [`super::Timings::operation_inline`]; one still running then is
//! parked here under the load balancer's name and the sync ends with
//! [`ccm_core::cloud::ProviderError::RetryAfter`] ([`super::Timings::operation_retry`]). The
//! next call for that load balancer (ensure, update or delete: the service controller never
//! runs two at once for one Service) first reads its parked operations: any still running is
//! another retry, without a call beyond those reads; a failed one is the sync's error; when
//! all are done the sync runs from fresh reads, so it resumes from what exists. Shared
//! resources (the nodes' health check and its firewall, instance groups) and the internal load
//! balancers are still waited for, under their locks.
//!
//! Also kept per load balancer: that a sync of the chain reserved the static address `<lb>`
//! (upstream releases it once the forwarding rule holds the IP, within one sync; here the rule
//! may exist only some syncs later, and the later sync finds the address "already existing").
//! Lost on restart, as a sync cut short by a restart leaves it upstream.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Instant;

use google_cloud_compute_v1::model::Operation;

use crate::client::{GceClient, GceError};

/// One parked operation.
struct ParkedOp {
    /// The mutation (`compute.forwardingRules.insert`, …).
    operation: &'static str,
    op: Operation,
    /// When the mutation was sent.
    started: Instant,
}

#[derive(Default)]
struct Entry {
    ops: Vec<ParkedOp>,
    /// A sync of this chain reserved the static address `<lb>` and it is not released yet.
    reserved_address: bool,
}

/// The parked operations of every external load balancer, by name.
#[derive(Default)]
pub(crate) struct Parked {
    by_lb: Mutex<HashMap<String, Entry>>,
}

impl Parked {
    fn with<R>(&self, lb: &str, f: impl FnOnce(&mut Entry) -> R) -> R {
        let mut map = self.by_lb.lock().unwrap_or_else(|p| p.into_inner());
        let entry = map.entry(lb.to_string()).or_default();
        let out = f(entry);
        if entry.ops.is_empty() && !entry.reserved_address {
            map.remove(lb);
        }
        out
    }

    /// Parks `op` of mutation `operation` (sent at `started`) for `lb`.
    pub fn park(&self, lb: &str, operation: &'static str, op: Operation, started: Instant) {
        tracing::debug!(load_balancer = lb, operation, name = ?op.name, "GCE: operation still running; parked until the next sync");
        self.with(lb, |e| e.ops.push(ParkedOp { operation, op, started }));
    }

    /// Whether a sync of this chain reserved `<lb>` and it is not released yet.
    pub fn reserved_address(&self, lb: &str) -> bool {
        self.with(lb, |e| e.reserved_address)
    }

    /// Records whether `<lb>` is reserved by this chain (`false`: released, or never ours).
    pub fn set_reserved_address(&self, lb: &str, reserved: bool) {
        self.with(lb, |e| e.reserved_address = reserved);
    }

    /// Forgets everything of `lb` (its load balancer was deleted).
    pub fn forget(&self, lb: &str) {
        self.by_lb.lock().unwrap_or_else(|p| p.into_inner()).remove(lb);
    }

    /// Reads `lb`'s parked operations again: `Ok` when there are none left (all finished
    /// well), [`GceError::Running`] (the first still running) when any is, else the first
    /// failure. An operation older than the client's operation timeout is given up on (an
    /// error, as a wait would have ended). A failed read keeps every operation for the
    /// next sync.
    pub async fn resume(&self, client: &GceClient, lb: &str) -> Result<(), GceError> {
        let ops = self.with(lb, |e| std::mem::take(&mut e.ops));
        if ops.is_empty() {
            return Ok(());
        }
        let timeout = client.operation_timeout();
        let mut running = Vec::new();
        let mut failure = None;
        let mut pending = ops.into_iter();
        while let Some(p) = pending.next() {
            let read = match client.operation(p.operation, &p.op).await {
                Ok(op) => op,
                Err(e) => {
                    // Keep this one and the rest for the next sync.
                    running.push(p);
                    running.extend(pending);
                    self.with(lb, |e| e.ops.extend(running));
                    return Err(e);
                }
            };
            match crate::client::operation_outcome(p.operation, &read) {
                Some(result) => {
                    client.record_finished(p.operation, p.started, &result);
                    if let Err(e) = result {
                        tracing::info!(load_balancer = lb, operation = p.operation, error = %e, "GCE: a parked operation failed");
                        failure.get_or_insert(e);
                    }
                }
                None if p.started.elapsed() >= timeout => {
                    let name = read.name.clone().unwrap_or_default();
                    let result = Err(GceError::Transport {
                        operation: p.operation,
                        message: format!(
                            "operation {name} did not finish within {}s; given up on (the next sync reads the resources again)",
                            timeout.as_secs()
                        ),
                    });
                    client.record_finished(p.operation, p.started, &result);
                    if let Err(e) = result {
                        failure.get_or_insert(e);
                    }
                }
                None => running.push(ParkedOp { op: read, ..p }),
            }
        }
        let first_running = running.first().map(|p| (p.operation, p.op.clone()));
        self.with(lb, |e| e.ops.extend(running));
        match (first_running, failure) {
            (Some((operation, op)), _) => Err(GceError::running(operation, op)),
            (None, Some(e)) => Err(e),
            (None, None) => Ok(()),
        }
    }
}
