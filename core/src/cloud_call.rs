//! Deadlines and stall warnings for cloud calls, shared by every provider.
//!
//! Owns the rule "no cloud call hangs": [`Deadline::run`] (or [`Deadline::try_run`] for calls
//! that return a `Result`) drives a call's future under a deadline, logs a `tracing` warning
//! naming the operation once the call has been running longer than the stall threshold, and
//! gives up with [`DeadlineExceeded`] (naming the operation and the deadline, nothing else:
//! no request bodies, no credentials) when the deadline passes. The future is dropped then,
//! which cancels the request.
//!
//! For SDKs that enforce their own timeouts (e.g. the AWS SDK's `TimeoutConfig`),
//! [`StallWatch`] gives the same warning without a deadline: start it when the call starts
//! and drop it when it ends.
//!
//! [`Retry`] is the shared retry policy for transient cloud faults (throttling, a busy
//! service, a connection reset mid-call): jittered exponential backoff that honours a
//! server-given `Retry-After` hint, retrying only what the caller classifies as
//! [`Classified::Transient`] or [`Classified::Throttled`], all inside one [`Deadline`] (the
//! deadline bounds every attempt and every sleep together). A call the cloud refused
//! (throttled, or answered with a `Retry-After`) was not carried out: it is retried until the
//! deadline. Other transient faults get a bounded number of attempts.
//!
//! [`api_metrics`] records every API call in the cloud's upstream metric families.
//!
//! ```no_run
//! # async fn f() -> Result<(), ccm_core::cloud::ProviderError> {
//! use ccm_core::cloud_call::Deadline;
//! let vm = Deadline::default()
//!     .try_run("FindByUuid", async { Ok::<_, ccm_core::cloud::ProviderError>("vm-1") })
//!     .await?;
//! # Ok(()) }
//! ```

pub mod api_metrics;

use std::borrow::Cow;
use std::fmt::Display;
use std::future::Future;
use std::hash::BuildHasher;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::cloud::ProviderError;

/// The deadline of one cloud call when nothing else is configured: 30 s, as upstream's AWS
/// client.
pub const DEFAULT_DEADLINE: Duration = Duration::from_secs(30);

/// A cloud call did not finish within its deadline.
#[derive(Debug, Clone, thiserror::Error)]
#[error("cloud call {operation} did not finish within its deadline of {deadline:?}")]
pub struct DeadlineExceeded {
    /// The operation, e.g. `DescribeInstances`.
    pub operation: Cow<'static, str>,
    /// The deadline that passed.
    pub deadline: Duration,
}

impl From<DeadlineExceeded> for ProviderError {
    fn from(e: DeadlineExceeded) -> Self {
        ProviderError::with_source(e.to_string(), e)
    }
}

/// How long a cloud call may take, and when it counts as stalled (logged once).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Deadline {
    /// The call fails with [`DeadlineExceeded`] after this long.
    pub timeout: Duration,
    /// A warning naming the operation is logged once the call has run this long.
    pub stall_after: Duration,
}

impl Default for Deadline {
    /// [`DEFAULT_DEADLINE`], stalled at half of it.
    fn default() -> Self {
        Deadline::new(DEFAULT_DEADLINE)
    }
}

impl Deadline {
    /// A deadline of `timeout`, with a stall warning at half of it.
    pub fn new(timeout: Duration) -> Self {
        Deadline { timeout, stall_after: timeout / 2 }
    }

    /// Runs `call` under this deadline: its output, or [`DeadlineExceeded`] naming
    /// `operation` once the deadline passed (the call is dropped, which cancels it).
    pub async fn run<F>(
        &self,
        operation: impl Into<Cow<'static, str>>,
        call: F,
    ) -> Result<F::Output, DeadlineExceeded>
    where
        F: Future,
    {
        let operation = operation.into();
        let _watch = StallWatch::start(operation.clone(), self.stall_after, Some(self.timeout));
        match tokio::time::timeout(self.timeout, call).await {
            Ok(out) => Ok(out),
            Err(_) => {
                tracing::warn!(
                    operation = %operation,
                    deadline = ?self.timeout,
                    "cloud call abandoned: deadline exceeded"
                );
                Err(DeadlineExceeded { operation, deadline: self.timeout })
            }
        }
    }

    /// [`Self::run`] for a call that returns a `Result`: the deadline error becomes the
    /// call's error type (e.g. [`ProviderError`]).
    pub async fn try_run<F, T, E>(
        &self,
        operation: impl Into<Cow<'static, str>>,
        call: F,
    ) -> Result<T, E>
    where
        F: Future<Output = Result<T, E>>,
        E: From<DeadlineExceeded>,
    {
        self.run(operation, call).await?
    }
}

/// How the caller reads a failed attempt.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Classified {
    /// Not worth retrying (a rejected credential, a missing object, a bad request...).
    Permanent,
    /// Worth retrying (busy, connection reset, throttled); `retry_after` is the server's
    /// hint, if it gave one: the next attempt waits at least that long. Without a hint it
    /// counts against [`Retry::attempts`]; with one, the server has said it did not take the
    /// call and when to come back (429, 503, Azure's `AnotherOperationInProgress`), so it is
    /// retried as [`Classified::Throttled`].
    Transient {
        /// The server's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
    /// The cloud refused the call for its rate limit (e.g. GCP's `rateLimitExceeded`, which
    /// carries no `Retry-After`): the call was not carried out, so it is retried, with
    /// backoff (at least `retry_after` when given), until the deadline, not counted against
    /// [`Retry::attempts`]. Giving up after a fixed count made the caller redo its whole
    /// sync, calls already answered included.
    Throttled {
        /// The server's `Retry-After`, if any.
        retry_after: Option<Duration>,
    },
}

impl Classified {
    /// Whether this failed attempt is counted against [`Retry::attempts`] (`None`: not
    /// retried at all), and the server's hint.
    fn retry(self) -> Option<(bool, Option<Duration>)> {
        match self {
            Classified::Permanent => None,
            Classified::Transient { retry_after: None } => Some((true, None)),
            Classified::Transient { retry_after: Some(d) }
            | Classified::Throttled { retry_after: Some(d) } => Some((false, Some(d))),
            Classified::Throttled { retry_after: None } => Some((false, None)),
        }
    }
}

/// The shortest wait before retrying a refused call, so a policy with a zero base never
/// spins on a throttling cloud until the deadline.
pub const MIN_REFUSED_WAIT: Duration = Duration::from_millis(100);

/// Retry policy for transient cloud faults: up to `attempts` attempts that failed with a
/// counted transient fault, the n-th retry waiting a jittered `base * 2^(n-1)` capped at `max`
/// (at least the server's `Retry-After` when it gives one). A refused call (throttled, or
/// answered with a `Retry-After`) is not counted: it is retried until the deadline (see
/// [`Classified`]). Only idempotent calls, or calls the cloud refused before carrying them
/// out, may be retried; the caller decides which errors are which.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Attempts that may fail with a counted transient fault, the first included (1 = no
    /// retry at all, refused calls included).
    pub attempts: u32,
    /// The backoff before the first retry (before jitter).
    pub base: Duration,
    /// The longest backoff between attempts (a `Retry-After` hint may ask for longer).
    pub max: Duration,
}

impl Default for Retry {
    /// 5 attempts, 500 ms base, 8 s cap: about 8 s of backoff at most before the fifth
    /// attempt, well inside [`DEFAULT_DEADLINE`].
    fn default() -> Self {
        Retry { attempts: 5, base: Duration::from_millis(500), max: Duration::from_secs(8) }
    }
}

impl Retry {
    /// No retries: one attempt.
    pub const NONE: Retry = Retry { attempts: 1, base: Duration::ZERO, max: Duration::ZERO };

    /// The backoff before retry number `retry` (1-based), jittered into `[d/2, d]` where
    /// `d = min(max, base * 2^(retry-1))`.
    pub fn backoff(&self, retry: u32) -> Duration {
        let factor = 2u32.saturating_pow(retry.saturating_sub(1));
        let d = self.base.saturating_mul(factor).min(self.max);
        d / 2 + d.mul_f64(jitter() / 2.0)
    }

    /// Runs `call` (a fresh attempt each time it is called) under `deadline`, retrying the
    /// errors `classify` calls transient or throttled. Gives up with the last error after
    /// [`Self::attempts`] counted failures, at once on a permanent error, and when the next
    /// wait and twice the longest attempt so far would reach the deadline (the only bound on
    /// refused calls); an attempt still running at the deadline fails with [`DeadlineExceeded`]. Each retry is logged at
    /// debug level with the error's `Display` (which must never hold credentials or bodies).
    pub async fn run<T, E, F, Fut>(
        &self,
        deadline: &Deadline,
        operation: impl Into<Cow<'static, str>>,
        classify: impl Fn(&E) -> Classified,
        call: F,
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: From<DeadlineExceeded> + Display,
    {
        let operation = operation.into();
        let attempts = self.attempts_within(deadline.timeout, operation.clone(), classify, call);
        deadline.try_run(operation, attempts).await
    }

    /// The retry loop of [`Self::run`] without enforcing the deadline on a running attempt
    /// (for callers that wrap it in [`Deadline::run`] themselves): retries stop once the next
    /// wait would reach `budget` from now.
    pub async fn attempts_within<T, E, F, Fut>(
        &self,
        budget: Duration,
        operation: impl Into<Cow<'static, str>>,
        classify: impl Fn(&E) -> Classified,
        mut call: F,
    ) -> Result<T, E>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Display,
    {
        let operation = operation.into();
        let started = tokio::time::Instant::now();
        // Attempts made, and those that failed with a counted (not refused) fault.
        let (mut attempt, mut counted) = (1, 0);
        // The longest attempt so far: a retry is not started when twice that would not fit
        // before the budget ends (a loaded machine or a slow cloud would have it cut by the
        // deadline, and the caller would see the deadline instead of why the calls failed).
        let mut slowest = Duration::ZERO;
        loop {
            let attempt_started = tokio::time::Instant::now();
            let answer = call().await;
            slowest = slowest.max(attempt_started.elapsed());
            let err = match answer {
                Ok(out) => return Ok(out),
                Err(err) => err,
            };
            let Some((counts, retry_after)) = classify(&err).retry() else {
                return Err(err);
            };
            counted += u32::from(counts);
            if self.attempts <= 1 || counted >= self.attempts {
                tracing::debug!(operation = %operation, attempt, error = %err, "transient cloud error, out of attempts");
                return Err(err);
            }
            let mut wait = self.backoff(attempt).max(retry_after.unwrap_or_default());
            if !counts {
                wait = wait.max(MIN_REFUSED_WAIT);
            }
            if started.elapsed() + wait + slowest * 2 >= budget {
                tracing::debug!(operation = %operation, attempt, ?wait, error = %err, "transient cloud error, no time left to retry");
                return Err(err);
            }
            tracing::debug!(operation = %operation, attempt, ?wait, refused = !counts, error = %err, "transient cloud error, retrying");
            tokio::time::sleep(wait).await;
            attempt += 1;
        }
    }
}

/// Whether `e`'s source chain shows a connection that could not be made or broke mid-call
/// (refused, reset, aborted, broken pipe, early EOF, or hyper's "connection closed before
/// message completed"): a fault an idempotent call may retry. Timeouts and TLS trust errors
/// are not in this list; HTTP clients decide those themselves.
pub fn is_broken_connection(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut source = Some(e);
    while let Some(err) = source {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            use std::io::ErrorKind::*;
            if matches!(
                io.kind(),
                ConnectionRefused
                    | ConnectionReset
                    | ConnectionAborted
                    | BrokenPipe
                    | UnexpectedEof
            ) {
                return true;
            }
        }
        if err.to_string().contains("connection closed before message completed") {
            return true;
        }
        source = err.source();
    }
    false
}

/// A `Retry-After` header value in seconds (the form cloud APIs use), capped at an hour;
/// `None` for anything else (an HTTP date is left to the backoff).
pub fn parse_retry_after(value: &str) -> Option<Duration> {
    let secs: u64 = value.trim().parse().ok()?;
    Some(Duration::from_secs(secs.min(3600)))
}

/// A decoding error's message with every quoted value left out (serde's `invalid type:
/// string "…", expected u64`): what a cloud's reply did not decode is named by its shape,
/// never by a value it carried (a secret in a body must not reach errors or logs).
pub fn strip_quoted_values(message: &str) -> String {
    let mut out = String::new();
    let mut in_quote = false;
    for c in message.chars() {
        if c == '"' {
            if !in_quote {
                out.push_str("\"…\"");
            }
            in_quote = !in_quote;
        } else if !in_quote {
            out.push(c);
        }
    }
    out
}

/// A number in `[0, 1)`, different on each call (std's per-instance random hash keys).
fn jitter() -> f64 {
    let bits = std::collections::hash_map::RandomState::new().hash_one(Instant::now());
    (bits >> 11) as f64 / (1u64 << 53) as f64
}

/// Logs a warning naming an operation if it is still running after a threshold; the watch
/// ends when dropped. Needs a tokio runtime; outside one it does nothing.
///
/// The warning comes from a timer task, and, if that task has not run by the time the watch
/// is dropped although the threshold has passed (a starved runtime runs the call's own
/// timeout first), from the drop: a call that ran past the threshold is always reported,
/// exactly once.
#[derive(Debug)]
pub struct StallWatch {
    task: Option<tokio::task::AbortHandle>,
    stall: Option<Arc<Stall>>,
}

#[derive(Debug)]
struct Stall {
    operation: Cow<'static, str>,
    started: Instant,
    stall_after: Duration,
    deadline: Option<Duration>,
    logged: std::sync::atomic::AtomicBool,
}

impl Stall {
    fn warn_once(&self) {
        if self.logged.swap(true, std::sync::atomic::Ordering::AcqRel) {
            return;
        }
        tracing::warn!(
            operation = %self.operation,
            elapsed = ?self.started.elapsed(),
            deadline = ?self.deadline,
            "cloud call is stalled: still waiting for an answer"
        );
    }
}

impl StallWatch {
    /// Starts watching `operation`: unless dropped first, one `tracing` warning after
    /// `stall_after`, naming the operation, how long it has run, and its `deadline` if known.
    pub fn start(
        operation: impl Into<Cow<'static, str>>,
        stall_after: Duration,
        deadline: Option<Duration>,
    ) -> Self {
        let Ok(rt) = tokio::runtime::Handle::try_current() else {
            return StallWatch { task: None, stall: None };
        };
        let stall = Arc::new(Stall {
            operation: operation.into(),
            started: Instant::now(),
            stall_after,
            deadline,
            logged: Default::default(),
        });
        let timer = stall.clone();
        let task = rt.spawn(async move {
            tokio::time::sleep(timer.stall_after).await;
            timer.warn_once();
        });
        StallWatch { task: Some(task.abort_handle()), stall: Some(stall) }
    }
}

impl Drop for StallWatch {
    fn drop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(stall) = self.stall.take()
            && stall.started.elapsed() >= stall.stall_after
        {
            stall.warn_once();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_decoding_message_keeps_its_shape_and_loses_its_values() {
        #[derive(Debug, serde::Deserialize)]
        #[allow(dead_code)]
        struct Reply {
            count: u64,
        }
        let e = serde_json::from_str::<Reply>(r#"{"count": "hunter2"}"#).unwrap_err();
        let m = strip_quoted_values(&e.to_string());
        assert!(!m.contains("hunter2"), "{m}");
        assert!(m.starts_with("invalid type: string \"…\", expected u64"), "{m}");
        assert_eq!(strip_quoted_values(r#"a "x" b "y""#), r#"a "…" b "…""#);
    }

    #[tokio::test]
    async fn a_call_that_never_answers_fails_naming_the_operation_and_deadline() {
        let d = Deadline::new(Duration::from_millis(200));
        let err = d.run("DescribeInstances", std::future::pending::<()>()).await.unwrap_err();
        assert_eq!(err.operation, "DescribeInstances");
        assert_eq!(err.deadline, Duration::from_millis(200));
        let msg = ProviderError::from(err).to_string();
        assert!(msg.contains("DescribeInstances") && msg.contains("200ms"), "{msg}");
    }

    #[tokio::test]
    async fn a_call_that_answers_in_time_returns_its_output() {
        // Generous: the call answers at once, the deadline is far away.
        let d = Deadline::new(Duration::from_secs(60));
        let out: Result<u8, ProviderError> = d.try_run("GetThing", async { Ok(7) }).await;
        assert_eq!(out.unwrap(), 7);
        let out: Result<u8, ProviderError> =
            d.try_run("GetThing", async { Err(ProviderError::other("boom")) }).await;
        assert_eq!(out.unwrap_err().to_string(), "boom");
    }

    #[test]
    fn the_default_is_upstreams_thirty_seconds_stalled_at_half() {
        let d = Deadline::default();
        assert_eq!(d.timeout, Duration::from_secs(30));
        assert_eq!(d.stall_after, Duration::from_secs(15));
        // Outside a runtime a watch is inert, not a panic.
        drop(StallWatch::start("x", Duration::ZERO, None));
    }

    /// Log lines written through `tracing` on this thread while a guard from `capture` lives.
    #[derive(Clone, Default)]
    struct Captured(Arc<std::sync::Mutex<Vec<u8>>>);
    impl std::io::Write for Captured {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    impl Captured {
        fn stalls(&self) -> usize {
            String::from_utf8_lossy(&self.0.lock().unwrap())
                .matches("cloud call is stalled")
                .count()
        }
    }
    fn capture() -> (Captured, tracing::subscriber::DefaultGuard) {
        let logs = Captured::default();
        let writer = logs.clone();
        let subscriber =
            tracing_subscriber::fmt().with_writer(move || writer.clone()).with_ansi(false).finish();
        let guard = tracing::subscriber::set_default(subscriber);
        crate::testing::anchor_tracing();
        (logs, guard)
    }

    /// CI saw it: on a starved runtime the call's own timeout ran before the watch's timer,
    /// and the stalled call was never reported. The drop reports it, once.
    #[tokio::test(flavor = "current_thread")]
    async fn a_stall_is_reported_even_when_the_timer_never_got_to_run() {
        let (logs, _guard) = capture();
        let watch = StallWatch::start("ec2:DescribeInstances", Duration::from_millis(20), None);
        // Block the only runtime thread past the threshold: the timer task cannot run.
        std::thread::sleep(Duration::from_millis(100));
        drop(watch);
        assert_eq!(logs.stalls(), 1, "reported by the drop");

        // The timer ran first: reported once, not again by the drop.
        let watch = StallWatch::start("ec2:DescribeInstances", Duration::from_millis(1), None);
        let wait = std::time::Instant::now();
        while logs.stalls() < 2 {
            assert!(wait.elapsed() < Duration::from_secs(60), "the timer never reported");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        drop(watch);
        assert_eq!(logs.stalls(), 2, "once per call");

        // A call that ends before the threshold is not reported at all.
        drop(StallWatch::start("ec2:DescribeInstances", Duration::from_secs(3600), None));
        assert_eq!(logs.stalls(), 2);
    }

    #[derive(Debug, PartialEq)]
    enum E {
        Busy(Option<Duration>),
        Throttled,
        Denied,
        Deadline,
    }
    impl std::fmt::Display for E {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "{self:?}")
        }
    }
    impl From<DeadlineExceeded> for E {
        fn from(_: DeadlineExceeded) -> Self {
            E::Deadline
        }
    }
    fn classify(e: &E) -> Classified {
        match e {
            E::Busy(retry_after) => Classified::Transient { retry_after: *retry_after },
            E::Throttled => Classified::Throttled { retry_after: None },
            _ => Classified::Permanent,
        }
    }
    // Real (short) time: tokio's paused clock needs its `test-util` feature, which the
    // workspace does not enable. Only lower bounds and counts are asserted.
    const POLICY: Retry =
        Retry { attempts: 4, base: Duration::from_millis(10), max: Duration::from_millis(40) };

    #[tokio::test]
    async fn retry_gives_up_after_the_configured_attempts_with_the_last_error() {
        let calls = std::cell::Cell::new(0);
        let out: Result<(), E> = POLICY
            .run(&Deadline::new(Duration::from_secs(60)), "op", classify, || {
                calls.set(calls.get() + 1);
                async { Err(E::Busy(None)) }
            })
            .await;
        assert_eq!(out, Err(E::Busy(None)));
        assert_eq!(calls.get(), 4);
        // A transient error that clears is retried to success.
        calls.set(0);
        let out = POLICY
            .run(&Deadline::new(Duration::from_secs(60)), "op", classify, || {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move { if n < 3 { Err(E::Busy(None)) } else { Ok(n) } }
            })
            .await;
        assert_eq!(out, Ok(3));
    }

    #[tokio::test]
    async fn retry_waits_at_least_the_servers_retry_after() {
        let start = tokio::time::Instant::now();
        let calls = std::cell::Cell::new(0);
        let out = POLICY
            .run(&Deadline::new(Duration::from_secs(60)), "op", classify, || {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move {
                    if n == 1 { Err(E::Busy(Some(Duration::from_millis(700)))) } else { Ok(n) }
                }
            })
            .await;
        assert_eq!(out, Ok(2));
        // The hint (700 ms) is longer than the policy's cap (40 ms): the hint wins.
        assert!(start.elapsed() >= Duration::from_millis(700), "{:?}", start.elapsed());
        // Without a hint the wait is the jittered backoff, within [base/2, base].
        for retry in 1..=6 {
            let d = POLICY.backoff(retry);
            let full = (POLICY.base * 2u32.pow(retry - 1)).min(POLICY.max);
            assert!(d >= full / 2 && d <= full, "retry {retry}: {d:?}");
        }
    }

    /// A refused call was not carried out: the GCP storm of the conformance suite gave up on
    /// a call throttled five times in a row and redid the whole sync. It is retried until
    /// the deadline now, whether the cloud says so with a `Retry-After` or the caller
    /// classifies it throttled.
    #[tokio::test]
    async fn a_refused_call_is_retried_past_the_attempts_until_it_is_taken() {
        for refusal in [E::Busy(Some(Duration::from_millis(20))), E::Throttled] {
            let calls = std::cell::Cell::new(0);
            let out = POLICY
                .run(&Deadline::new(Duration::from_secs(60)), "op", classify, || {
                    calls.set(calls.get() + 1);
                    let n = calls.get();
                    let refusal = match &refusal {
                        E::Busy(d) => E::Busy(*d),
                        _ => E::Throttled,
                    };
                    async move { if n <= 9 { Err(refusal) } else { Ok(n) } }
                })
                .await;
            // 9 refusals: more than the policy's 4 attempts.
            assert_eq!(out, Ok(10), "{refusal:?}");
        }
    }

    #[tokio::test]
    async fn a_call_refused_every_time_stops_at_the_deadline() {
        let start = tokio::time::Instant::now();
        let calls = std::cell::Cell::new(0);
        let out: Result<(), E> = POLICY
            .run(&Deadline::new(Duration::from_secs(2)), "op", classify, || {
                calls.set(calls.get() + 1);
                async { Err(E::Throttled) }
            })
            .await;
        assert_eq!(out, Err(E::Throttled), "the last refusal, not the deadline error");
        // Every wait at least MIN_REFUSED_WAIT (the policy's own backoff is 5-40 ms): at most
        // 20 attempts in the 2 s, never a hot loop, and more than the 4 a count allows.
        assert!((5..=20).contains(&calls.get()), "{}", calls.get());
        assert!(start.elapsed() < Duration::from_secs(2), "{:?}", start.elapsed());
    }

    #[tokio::test]
    async fn refusals_do_not_use_up_the_attempts_of_other_transient_faults() {
        // Throttled and busy by turns: the four busy answers are the four attempts.
        let calls = std::cell::Cell::new(0);
        let out: Result<(), E> = POLICY
            .run(&Deadline::new(Duration::from_secs(60)), "op", classify, || {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move { if n % 2 == 1 { Err(E::Throttled) } else { Err(E::Busy(None)) } }
            })
            .await;
        assert_eq!(out, Err(E::Busy(None)));
        assert_eq!(calls.get(), 8);
        // No retry means none, for a refused call too.
        calls.set(0);
        let out: Result<(), E> = Retry::NONE
            .run(&Deadline::new(Duration::from_secs(60)), "op", classify, || {
                calls.set(calls.get() + 1);
                async { Err(E::Throttled) }
            })
            .await;
        assert_eq!(out, Err(E::Throttled));
        assert_eq!(calls.get(), 1);
    }

    #[tokio::test]
    async fn retry_never_repeats_a_permanent_error() {
        let calls = std::cell::Cell::new(0);
        let out: Result<(), E> = POLICY
            .run(&Deadline::new(Duration::from_secs(60)), "op", classify, || {
                calls.set(calls.get() + 1);
                async { Err(E::Denied) }
            })
            .await;
        assert_eq!(out, Err(E::Denied));
        assert_eq!(calls.get(), 1);
    }

    #[tokio::test]
    async fn retry_stops_at_the_deadline() {
        let many = Retry { attempts: 1000, ..POLICY };
        let start = tokio::time::Instant::now();
        let calls = std::cell::Cell::new(0);
        // Always busy, asking for 1 s each time: the 3 s deadline allows 3 attempts (2 if
        // the machine is slow), then gives up with the last error rather than sleeping into
        // the deadline.
        let out: Result<(), E> = many
            .run(&Deadline::new(Duration::from_secs(3)), "op", classify, || {
                calls.set(calls.get() + 1);
                async { Err(E::Busy(Some(Duration::from_secs(1)))) }
            })
            .await;
        assert_eq!(out, Err(E::Busy(Some(Duration::from_secs(1)))));
        assert!((2..=3).contains(&calls.get()), "{}", calls.get());
        assert!(start.elapsed() >= Duration::from_secs(1), "{:?}", start.elapsed());
        // An attempt still running at the deadline is abandoned with DeadlineExceeded.
        calls.set(0);
        let out: Result<(), E> = many
            .run(&Deadline::new(Duration::from_millis(500)), "op", classify, || {
                calls.set(calls.get() + 1);
                let n = calls.get();
                async move {
                    if n == 1 {
                        Err(E::Busy(None))
                    } else {
                        std::future::pending().await
                    }
                }
            })
            .await;
        assert_eq!(out, Err(E::Deadline));
        assert_eq!(calls.get(), 2);
        assert_eq!(parse_retry_after(" 3 "), Some(Duration::from_secs(3)));
        assert_eq!(parse_retry_after("Wed, 21 Oct 2015 07:28:00 GMT"), None);
    }
}
