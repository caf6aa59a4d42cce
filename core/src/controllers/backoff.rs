//! Backoffs: per-object exponential failure backoff, as client-go's per-item rate limiter (the
//! delay doubles with each consecutive failure of the same object, up to a cap, and resets on
//! success; kube-runtime's `error_policy` has no such memory, so controllers keep one of
//! these), and the reconnect backoff of every watch ([`WatchBackoff`]).

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::Duration;

/// Failure counts per key, turned into delays `base * 2^failures`, capped at `max`.
#[derive(Debug)]
pub struct FailureBackoff<K> {
    base: Duration,
    max: Duration,
    failures: Mutex<HashMap<K, u32>>,
}

impl<K: Eq + Hash + Clone> FailureBackoff<K> {
    /// A backoff starting at `base` and capped at `max`.
    pub fn new(base: Duration, max: Duration) -> Self {
        FailureBackoff { base, max, failures: Mutex::new(HashMap::new()) }
    }

    /// Records a failure of `key` and returns how long to wait before retrying it.
    pub fn failed(&self, key: &K) -> Duration {
        let mut f = self.failures.lock().unwrap_or_else(|p| p.into_inner());
        let n = f.entry(key.clone()).or_insert(0);
        let delay = self.base.saturating_mul(2u32.saturating_pow(*n)).min(self.max);
        *n = n.saturating_add(1);
        delay
    }

    /// Forgets the failures of `key` (after a success).
    pub fn succeeded(&self, key: &K) {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
    }

    /// Keeps only the keys for which `keep` is true.
    pub fn retain(&self, mut keep: impl FnMut(&K) -> bool) {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).retain(|k, _| keep(k));
    }

    /// The keys with failures now.
    pub fn keys(&self) -> Vec<K> {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).keys().cloned().collect()
    }

    /// How many consecutive failures `key` has had.
    pub fn failures(&self, key: &K) -> u32 {
        self.failures.lock().unwrap_or_else(|p| p.into_inner()).get(key).copied().unwrap_or(0)
    }
}

/// The reconnect backoff of every watch the controllers keep: 500 ms doubling to 4 s, each
/// delay plus up to half of it at random (replicas and watches do not reconnect in step);
/// kube-runtime resets it on the first event after a reconnect.
///
/// kube-runtime's default, like client-go's reflector, doubles from 800 ms to 30 s with up to
/// 100 % added at random: after a 40 s apiserver outage a new Node waited 69 s and a new
/// Service 78 s (chaos suite) before the watches were back. This one is back within 6 s of the
/// apiserver; a handful of watches retrying every 4–6 s is no load for an apiserver.
#[derive(Debug, Clone)]
pub struct WatchBackoff {
    next: Duration,
}

impl WatchBackoff {
    /// The first delay after a failure.
    pub const MIN: Duration = Duration::from_millis(500);
    /// The longest delay before random spread.
    pub const MAX: Duration = Duration::from_secs(4);
}

impl Default for WatchBackoff {
    fn default() -> Self {
        WatchBackoff { next: Self::MIN }
    }
}

impl Iterator for WatchBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        use std::hash::BuildHasher;
        let delay = self.next;
        self.next = self.next.saturating_mul(2).min(Self::MAX);
        // Up to half the delay again, from the process's random hash keys (no RNG crate).
        let r = std::collections::hash_map::RandomState::new().hash_one(delay.as_nanos());
        let spread = delay.as_millis() as u64 / 2;
        Some(delay + Duration::from_millis(if spread == 0 { 0 } else { r % (spread + 1) }))
    }
}

impl kube::runtime::utils::Backoff for WatchBackoff {
    fn reset(&mut self) {
        self.next = Self::MIN;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_watch_retries_within_six_seconds_however_long_the_outage_and_resets() {
        use kube::runtime::utils::Backoff;
        let mut b = WatchBackoff::default();
        let delays: Vec<Duration> = (0..50).map(|_| b.next().unwrap_or_default()).collect();
        assert!(delays[0] >= WatchBackoff::MIN && delays[0] <= Duration::from_millis(750));
        assert!(delays[1] >= Duration::from_secs(1), "it backs off: {delays:?}");
        for d in &delays[3..] {
            assert!(
                *d >= WatchBackoff::MAX && *d <= Duration::from_secs(6),
                "capped at 4–6 s: {delays:?}"
            );
        }
        assert!(
            delays[3..].iter().collect::<std::collections::HashSet<_>>().len() > 1,
            "spread at random: {delays:?}"
        );
        b.reset();
        assert!(b.next().unwrap_or_default() <= Duration::from_millis(750), "reset to the start");
    }

    #[test]
    fn doubles_caps_and_resets() {
        let b = FailureBackoff::new(Duration::from_secs(5), Duration::from_secs(300));
        let delays: Vec<u64> = (0..8).map(|_| b.failed(&"svc").as_secs()).collect();
        assert_eq!(delays, vec![5, 10, 20, 40, 80, 160, 300, 300]);
        b.succeeded(&"svc");
        assert_eq!(b.failed(&"svc").as_secs(), 5);
        assert_eq!(b.failed(&"other").as_secs(), 5, "keys are independent");
    }
}
