//! A keyed work queue with client-go semantics: a key is queued at most once, a key that is
//! re-added while being processed is processed again after [`WorkQueue::done`], and failures
//! back off per key (`min · 2^failures`, capped at `max`) until [`WorkQueue::forget`].
//! Every queue records client-go's `workqueue_*` metrics under its name
//! ([`crate::controllers::workqueue_metrics`]).

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::controllers::workqueue_metrics::QueueMetrics;

#[derive(Debug, Default)]
struct State {
    queue: VecDeque<String>,
    dirty: HashSet<String>,
    processing: HashSet<String>,
    failures: HashMap<String, u32>,
    /// Keys waiting for a delayed add, with when they become ready.
    waiting: HashMap<String, Instant>,
}

/// The queue. Cheap to share behind an `Arc`.
#[derive(Debug)]
pub(crate) struct WorkQueue {
    state: Mutex<State>,
    notify: Notify,
    min_delay: Duration,
    max_delay: Duration,
    shutdown: CancellationToken,
    metrics: QueueMetrics,
}

impl WorkQueue {
    /// A queue whose per-key backoff runs from `min_delay` doubling to `max_delay`,
    /// recording its `workqueue_*` metrics through `metrics`.
    pub(crate) fn new(
        min_delay: Duration,
        max_delay: Duration,
        shutdown: CancellationToken,
        metrics: QueueMetrics,
    ) -> Arc<Self> {
        Arc::new(WorkQueue {
            state: Mutex::new(State::default()),
            notify: Notify::new(),
            min_delay,
            max_delay,
            shutdown,
            metrics,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `key` now (no-op if it is already queued).
    pub(crate) fn add(&self, key: &str) {
        let mut s = self.lock();
        if !s.dirty.insert(key.to_string()) {
            return;
        }
        self.metrics.added(key);
        if !s.processing.contains(key) {
            s.queue.push_back(key.to_string());
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Queues `key` after `delay`. A key waits at most once: an earlier ready time wins.
    pub(crate) fn add_after(self: &Arc<Self>, key: &str, delay: Duration) {
        // client-go counts every delayed add as a retry, even one without delay.
        self.metrics.retried();
        if delay.is_zero() {
            return self.add(key);
        }
        let ready = Instant::now() + delay;
        {
            let mut s = self.lock();
            match s.waiting.get(key) {
                Some(at) if *at <= ready => return,
                _ => {
                    s.waiting.insert(key.to_string(), ready);
                }
            }
        }
        let this = self.clone();
        let key = key.to_string();
        tokio::spawn(async move {
            tokio::select! {
                _ = this.shutdown.cancelled() => {}
                _ = tokio::time::sleep_until(ready) => {
                    let mine = {
                        let mut s = this.lock();
                        let mine = s.waiting.get(&key) == Some(&ready);
                        if mine {
                            s.waiting.remove(&key);
                        }
                        mine
                    };
                    if mine {
                        this.add(&key);
                    }
                }
            }
        });
    }

    /// The next backoff delay for `key` (and counts one more failure).
    pub(crate) fn next_backoff(&self, key: &str) -> Duration {
        let mut s = self.lock();
        let n = s.failures.entry(key.to_string()).or_insert(0);
        let delay = self.min_delay.saturating_mul(1u32 << (*n).min(20)).min(self.max_delay);
        *n = n.saturating_add(1);
        delay
    }

    /// Queues `key` after its backoff delay, which doubles on every call until [`Self::forget`].
    pub(crate) fn add_rate_limited(self: &Arc<Self>, key: &str) -> Duration {
        let delay = self.next_backoff(key);
        self.add_after(key, delay);
        delay
    }

    /// How many failures `key` had since its last [`Self::forget`].
    pub(crate) fn failures(&self, key: &str) -> u32 {
        self.lock().failures.get(key).copied().unwrap_or(0)
    }

    /// Resets the backoff of `key`.
    pub(crate) fn forget(&self, key: &str) {
        self.lock().failures.remove(key);
    }

    /// The next key to process; `None` once shut down. Call [`Self::done`] afterwards.
    pub(crate) async fn get(&self) -> Option<String> {
        loop {
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.lock();
                if let Some(key) = s.queue.pop_front() {
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone());
                    self.metrics.taken(&key);
                    if !s.queue.is_empty() {
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
            }
            tokio::select! {
                _ = self.shutdown.cancelled() => return None,
                _ = notified => {}
            }
        }
    }

    /// Marks `key` as processed; it is queued again if it was added meanwhile.
    pub(crate) fn done(&self, key: &str) {
        self.metrics.done(key);
        let mut s = self.lock();
        s.processing.remove(key);
        if s.dirty.contains(key) {
            s.queue.push_back(key.to_string());
            drop(s);
            self.notify.notify_one();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dedups_and_requeues_keys_added_while_processing() {
        let q = WorkQueue::new(
            Duration::from_secs(5),
            Duration::from_secs(300),
            CancellationToken::new(),
            QueueMetrics::unregistered("test"),
        );
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.get().await.as_deref(), Some("a"));
        q.add("a"); // while processing
        assert_eq!(q.get().await.as_deref(), Some("b"));
        q.done("b");
        q.done("a");
        assert_eq!(q.get().await.as_deref(), Some("a"));
        q.done("a");
        assert!(q.lock().queue.is_empty());
    }

    #[tokio::test]
    async fn delayed_adds_of_one_key_collapse_to_the_earliest() {
        let q = WorkQueue::new(
            Duration::from_secs(5),
            Duration::from_secs(300),
            CancellationToken::new(),
            QueueMetrics::unregistered("test"),
        );
        q.add_after("a", Duration::from_millis(300));
        q.add_after("a", Duration::from_millis(50));
        q.add_after("a", Duration::from_millis(600));
        assert_eq!(q.lock().waiting.len(), 1);
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert_eq!(q.lock().queue.len(), 1);
        assert_eq!(q.get().await.as_deref(), Some("a"));
        q.done("a");
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert!(q.lock().queue.is_empty(), "the later timers were superseded");
        assert!(q.lock().waiting.is_empty());
    }

    #[test]
    fn backoff_doubles_to_the_cap_and_forget_resets_it() {
        let q = WorkQueue::new(
            Duration::from_secs(5),
            Duration::from_secs(300),
            CancellationToken::new(),
            QueueMetrics::unregistered("test"),
        );
        let delays: Vec<u64> = (0..8).map(|_| q.next_backoff("k").as_secs()).collect();
        assert_eq!(delays, vec![5, 10, 20, 40, 80, 160, 300, 300]);
        q.forget("k");
        assert_eq!(q.next_backoff("k"), Duration::from_secs(5));
    }
}
