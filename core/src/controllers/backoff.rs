//! Per-object exponential failure backoff, as client-go's per-item rate limiter: the delay
//! doubles with each consecutive failure of the same object, up to a cap, and resets on
//! success. kube-runtime's `error_policy` has no such memory, so controllers keep one of these.

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

#[cfg(test)]
mod tests {
    use super::*;

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
