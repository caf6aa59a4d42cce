//! Lease-based leader election with client-go's semantics (`coordination.k8s.io/v1` Lease,
//! compatible with Go controller-managers holding the same lock).
//!
//! - Acquire: try every retry period (not jittered: a released lock is taken within one period;
//!   two standbys racing for it are settled by the update's resourceVersion). A Lease held by
//!   another identity is free once its record has not changed for its `leaseDurationSeconds`
//!   (measured on our clock from when we first observed that record) or once its holder is
//!   empty.
//! - Only `get`, `create` and `update` on the Lease, as client-go's LeaseLock: upstream's
//!   roles (OpenStack's, Azure's) grant nothing more. A standby polls the Lease with `get`
//!   every retry period (no list/watch): a released lock (empty holder) is taken at the first
//!   poll that sees it, and an unrenewed one as soon as it expires, measured from the poll that
//!   first saw its last record (so at most one retry period later than a watch would have).
//! - Renew: every retry period. If no renewal succeeded within the renew deadline, or another
//!   identity took the Lease, leadership is lost.
//! - On acquiring, an Event about the Lease, `Normal` `LeaderElection` `<identity> became
//!   leader`, as client-go's LeaseLock records it with the manager's recorder (component
//!   `cloud-controller-manager`), when [`Elector::with_events`] gave one. Recorded in the
//!   background: the lock never waits on it.
//! - Release (on orderly shutdown): holder emptied, `leaseDurationSeconds: 1`.
//!   Upstream's CCM does not release on exit (QUIRK, fixed here: a standby takes over at once).

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::runtime::events::EventType;
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

use crate::controllers::events::{EventRecorder, publish};

/// Shared view of whether we lead and when we last renewed (for `/healthz` and metrics).
#[derive(Debug, Clone, Default)]
pub struct LeaderState {
    inner: Arc<Mutex<Option<Instant>>>,
}

impl LeaderState {
    fn set(&self, v: Option<Instant>) {
        *self.inner.lock().unwrap_or_else(|p| p.into_inner()) = v;
    }

    /// `Some(last renewal)` while leading.
    pub fn last_renewal(&self) -> Option<Instant> {
        *self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Settings of one lock.
#[derive(Debug, Clone)]
pub struct ElectorConfig {
    /// Lease namespace.
    pub namespace: String,
    /// Lease name.
    pub name: String,
    /// Our identity (`hostname_uuid`).
    pub identity: String,
    /// Lease duration.
    pub lease_duration: Duration,
    /// Renew deadline.
    pub renew_deadline: Duration,
    /// Retry period.
    pub retry_period: Duration,
}

/// Why [`Elector::hold`] returned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldOutcome {
    /// Leadership was lost (renew deadline passed or another holder took over).
    Lost,
    /// The cancellation token fired while leading.
    Cancelled,
}

/// One attempt's failure.
#[derive(Debug)]
enum AttemptError {
    /// Another identity holds an unexpired lease.
    HeldBy(String),
    /// API error.
    Api(kube::Error),
}

/// A Lease-based elector for one lock.
pub struct Elector {
    api: Api<Lease>,
    cfg: ElectorConfig,
    observed: Option<(LeaseSpec, Instant)>,
    /// The Lease as we last wrote it, while we lead: renewals update it directly (client-go's
    /// fast path) and fall back to read-then-update when that fails (the slow path, counted
    /// in `leader_election_slowpath_total`).
    cached: Option<Lease>,
    /// Shared state for health checks.
    pub state: LeaderState,
    /// Where "became leader" is recorded.
    events: Option<EventRecorder>,
}

/// A fresh identity: `hostname_uuid`, as upstream.
pub fn identity() -> String {
    let host = hostname::get()
        .ok()
        .and_then(|h| h.into_string().ok())
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "localhost".into());
    format!("{host}_{}", uuid_v4())
}

fn uuid_v4() -> String {
    if let Ok(s) = std::fs::read_to_string("/proc/sys/kernel/random/uuid") {
        let s = s.trim();
        if s.len() == 36 {
            return s.to_string();
        }
    }
    let mut x = seed();
    let mut bytes = [0u8; 16];
    for b in &mut bytes {
        x = xorshift(x);
        *b = (x >> 24) as u8;
    }
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let h: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{}-{}-{}-{}-{}", &h[0..8], &h[8..12], &h[12..16], &h[16..20], &h[20..32])
}

fn seed() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    nanos ^ (u64::from(std::process::id()) << 32) | 1
}

fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// `base * (1 + rand[0, factor))`, as `wait.Jitter`.
pub fn jitter(base: Duration, factor: f64) -> Duration {
    let r = (xorshift(seed()) % 1_000_000) as f64 / 1_000_000.0;
    base.mul_f64(1.0 + r * factor)
}

fn now() -> MicroTime {
    MicroTime(k8s_openapi::jiff::Timestamp::now())
}

fn secs(d: Duration) -> i32 {
    i32::try_from(d.as_secs().max(1)).unwrap_or(i32::MAX)
}

impl Elector {
    /// An elector for `cfg` using `client`.
    pub fn new(client: Client, cfg: ElectorConfig) -> Self {
        Elector {
            api: Api::namespaced(client, &cfg.namespace),
            cfg,
            observed: None,
            cached: None,
            state: LeaderState::default(),
            events: None,
        }
    }

    /// Records `<identity> became leader` about the Lease with `recorder` on each acquisition.
    pub fn with_events(mut self, recorder: EventRecorder) -> Self {
        self.events = Some(recorder);
        self
    }

    /// Records the acquisition (in the background: an Event never holds up the lock).
    fn record_acquired(&self) {
        let (Some(recorder), Some(lease)) = (self.events.clone(), self.cached.clone()) else {
            return;
        };
        let note = format!("{} became leader", self.cfg.identity);
        tokio::spawn(async move {
            let reason = "LeaderElection";
            publish(&recorder, &lease, EventType::Normal, reason, reason, note).await;
        });
    }

    /// The lock's settings.
    pub fn config(&self) -> &ElectorConfig {
        &self.cfg
    }

    async fn try_acquire_or_renew(&mut self) -> Result<(), AttemptError> {
        let me = self.cfg.identity.clone();
        // Fast path: we lead and our record is still valid; update it without reading it.
        if let (Some(mut lease), Some((spec, at))) = (self.cached.take(), self.observed.clone()) {
            let duration = Duration::from_secs(
                u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
            );
            if spec.holder_identity.as_deref() == Some(me.as_str())
                && at + duration > Instant::now()
            {
                let renewed = LeaseSpec { renew_time: Some(now()), ..spec };
                lease.spec = Some(renewed.clone());
                match self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await {
                    Ok(written) => {
                        self.cached = Some(written);
                        self.observed = Some((renewed, Instant::now()));
                        return Ok(());
                    }
                    Err(e) => {
                        tracing::warn!(lock = %self.cfg.name, error = %e, "Failed to update lock optimistically, falling back to slow path");
                        super::metrics::leader_election_slowpath(&self.cfg.name);
                    }
                }
            }
        }
        let current = self.api.get_opt(&self.cfg.name).await.map_err(AttemptError::Api)?;
        let Some(lease) = current else {
            let spec = LeaseSpec {
                holder_identity: Some(me),
                lease_duration_seconds: Some(secs(self.cfg.lease_duration)),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                lease_transitions: Some(0),
                ..Default::default()
            };
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(self.cfg.name.clone()),
                    namespace: Some(self.cfg.namespace.clone()),
                    ..Default::default()
                },
                spec: Some(spec.clone()),
            };
            let written =
                self.api.create(&PostParams::default(), &lease).await.map_err(AttemptError::Api)?;
            self.cached = Some(written);
            self.observed = Some((spec, Instant::now()));
            return Ok(());
        };
        let old = lease.spec.clone().unwrap_or_default();
        match &self.observed {
            Some((spec, _)) if *spec == old => {}
            _ => self.observed = Some((old.clone(), Instant::now())),
        }
        let holder = old.holder_identity.clone().unwrap_or_default();
        let observed_at = self.observed.as_ref().map(|(_, t)| *t).unwrap_or_else(Instant::now);
        let duration = Duration::from_secs(
            u64::try_from(old.lease_duration_seconds.unwrap_or(0)).unwrap_or(0),
        );
        if !holder.is_empty() && holder != me && observed_at + duration > Instant::now() {
            return Err(AttemptError::HeldBy(holder));
        }
        let was_me = holder == me;
        let spec = LeaseSpec {
            holder_identity: Some(me),
            lease_duration_seconds: Some(secs(self.cfg.lease_duration)),
            acquire_time: if was_me { old.acquire_time.clone() } else { Some(now()) },
            renew_time: Some(now()),
            lease_transitions: Some(if was_me {
                old.lease_transitions.unwrap_or(0)
            } else {
                old.lease_transitions.unwrap_or(0) + 1
            }),
            ..old
        };
        let mut updated = lease;
        updated.spec = Some(spec.clone());
        let written = self
            .api
            .replace(&self.cfg.name, &PostParams::default(), &updated)
            .await
            .map_err(AttemptError::Api)?;
        self.cached = Some(written);
        self.observed = Some((spec, Instant::now()));
        Ok(())
    }

    /// Blocks until this process holds the lock (`true`) or `cancel` fires (`false`). Polls the
    /// Lease every retry period (a `get`, then a `create` or `update` when it is free).
    pub async fn acquire(&mut self, cancel: &CancellationToken) -> bool {
        tracing::info!(lock = %format!("{}/{}", self.cfg.namespace, self.cfg.name), identity = %self.cfg.identity, "attempting to acquire leader lease");
        let mut last_holder = String::new();
        loop {
            if cancel.is_cancelled() {
                return false;
            }
            let attempt =
                tokio::time::timeout(self.cfg.renew_deadline, self.try_acquire_or_renew());
            match attempt.await {
                Ok(Ok(())) => {
                    tracing::info!(lock = %format!("{}/{}", self.cfg.namespace, self.cfg.name), identity = %self.cfg.identity, "successfully acquired lease");
                    self.state.set(Some(Instant::now()));
                    self.record_acquired();
                    return true;
                }
                Ok(Err(AttemptError::HeldBy(holder))) => {
                    if holder != last_holder {
                        tracing::info!(lock = %self.cfg.name, %holder, "new leader elected");
                        last_holder = holder;
                    }
                }
                Ok(Err(AttemptError::Api(e))) => {
                    tracing::warn!(lock = %self.cfg.name, error = %e, "error retrieving or updating lease")
                }
                Err(_) => tracing::warn!(lock = %self.cfg.name, "lease request timed out"),
            }
            let wait = self.next_poll(Instant::now());
            tokio::select! {
                _ = cancel.cancelled() => return false,
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// How long a standby waits before its next poll at `now`: the retry period, or less when
    /// the record it observed expires sooner (then it polls just after the expiry).
    fn next_poll(&self, now: Instant) -> Duration {
        let mut wait = self.cfg.retry_period;
        if let Some((spec, at)) = &self.observed {
            let dur = u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0);
            let expiry = *at + Duration::from_secs(dur) + Duration::from_millis(20);
            wait = wait.min(expiry.saturating_duration_since(now));
        }
        wait
    }

    /// Renews until leadership is lost or `cancel` fires.
    pub async fn hold(&mut self, cancel: &CancellationToken) -> HoldOutcome {
        let mut last_success = Instant::now();
        loop {
            tokio::select! {
                _ = cancel.cancelled() => return HoldOutcome::Cancelled,
                _ = tokio::time::sleep(self.cfg.retry_period) => {}
            }
            let deadline = last_success + self.cfg.renew_deadline;
            let remaining = deadline.saturating_duration_since(Instant::now());
            let result = tokio::select! {
                _ = cancel.cancelled() => return HoldOutcome::Cancelled,
                r = tokio::time::timeout(remaining, self.try_acquire_or_renew()) => r,
            };
            match result {
                Ok(Ok(())) => {
                    last_success = Instant::now();
                    self.state.set(Some(last_success));
                }
                Ok(Err(AttemptError::HeldBy(holder))) => {
                    tracing::error!(lock = %self.cfg.name, %holder, "lease taken over by another holder");
                    self.state.set(None);
                    return HoldOutcome::Lost;
                }
                Ok(Err(AttemptError::Api(e))) => {
                    tracing::warn!(lock = %self.cfg.name, error = %e, "failed to renew lease")
                }
                Err(_) => tracing::warn!(lock = %self.cfg.name, "lease renewal timed out"),
            }
            if last_success + self.cfg.renew_deadline <= Instant::now() {
                tracing::error!(lock = %self.cfg.name, "failed to renew lease within the renew deadline");
                self.state.set(None);
                return HoldOutcome::Lost;
            }
        }
    }

    /// Gives the lock up if we still hold it (holder emptied, duration 1 s).
    pub async fn release(&mut self) {
        self.state.set(None);
        self.cached = None;
        let result = async {
            let Some(mut lease) = self.api.get_opt(&self.cfg.name).await? else {
                return Ok(false);
            };
            let spec = lease.spec.clone().unwrap_or_default();
            if spec.holder_identity.as_deref() != Some(self.cfg.identity.as_str()) {
                return Ok(false);
            }
            lease.spec = Some(LeaseSpec {
                holder_identity: Some(String::new()),
                lease_duration_seconds: Some(1),
                acquire_time: Some(now()),
                renew_time: Some(now()),
                ..spec
            });
            self.api.replace(&self.cfg.name, &PostParams::default(), &lease).await?;
            Ok::<bool, kube::Error>(true)
        };
        match tokio::time::timeout(Duration::from_secs(5), result).await {
            Ok(Ok(true)) => tracing::info!(lock = %self.cfg.name, "released leader lease"),
            Ok(Ok(false)) => {}
            Ok(Err(e)) => {
                tracing::warn!(lock = %self.cfg.name, error = %e, "failed to release lease")
            }
            Err(_) => tracing::warn!(lock = %self.cfg.name, "releasing the lease timed out"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn identity_is_hostname_underscore_uuid() {
        let id = identity();
        let (host, uuid) = id.rsplit_once('_').unwrap();
        assert!(!host.is_empty());
        assert_eq!(uuid.len(), 36);
        assert_eq!(uuid.matches('-').count(), 4);
        assert_ne!(identity(), id, "a fresh uuid per process start");
    }

    fn elector(retry: Duration) -> Elector {
        // A client that is never called: next_poll only reads the observed record.
        let config = kube::Config::new("http://127.0.0.1:9".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let cfg = ElectorConfig {
            namespace: "kube-system".into(),
            name: "cloud-controller-manager".into(),
            identity: "me_1".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: retry,
        };
        Elector::new(client, cfg)
    }

    #[tokio::test]
    async fn a_standby_polls_every_retry_period_and_just_after_the_observed_record_expires() {
        let mut e = elector(Duration::from_secs(2));
        let now = Instant::now();
        assert_eq!(e.next_poll(now), Duration::from_secs(2), "nothing observed yet");
        let held = LeaseSpec {
            holder_identity: Some("other_1".into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        };
        e.observed = Some((held.clone(), now));
        assert_eq!(e.next_poll(now), Duration::from_secs(2), "far from expiry: the period");
        let near = now + Duration::from_secs(14);
        assert_eq!(e.next_poll(near), Duration::from_millis(1020), "just after the expiry");
        let past = now + Duration::from_secs(20);
        assert_eq!(e.next_poll(past), Duration::ZERO, "expired: at once");
    }

    #[test]
    fn jitter_stays_in_range() {
        for _ in 0..100 {
            let j = jitter(Duration::from_secs(2), 1.2);
            assert!(j >= Duration::from_secs(2) && j <= Duration::from_millis(4400));
        }
    }
}
