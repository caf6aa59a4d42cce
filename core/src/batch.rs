//! Coalescing of concurrent cloud lookups into batch calls.
//!
//! Upstream asks the cloud once per node; at 5000 nodes that throttles the cloud account. A
//! [`Coalescer`] sits between the controllers and a provider's batch method: every caller
//! asks for one item and awaits its own answer, while a background task gathers the requests
//! that arrive within a short window (or until the batch is full) and answers them all with
//! one call. Batches run concurrently with each other, so a slow cloud call does not hold up
//! the next window.
//!
//! ```text
//!  reconcile(node-1) ─┐                       ┌─▶ answer 1
//!  reconcile(node-2) ─┼─▶ window (≤ max) ─▶ batch_fn([1,2,3]) ─┼─▶ answer 2
//!  reconcile(node-3) ─┘                       └─▶ answer 3
//! ```

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

/// The coalescer's background task is gone (the runtime is shutting down).
#[derive(Debug, thiserror::Error)]
#[error("the batching task has stopped")]
pub struct Closed;

type Pending<Req, Resp> = (Req, oneshot::Sender<Resp>);

/// Gathers concurrent single requests into batch calls. Cheap to clone.
pub struct Coalescer<Req, Resp> {
    tx: mpsc::UnboundedSender<Pending<Req, Resp>>,
}

impl<Req, Resp> Clone for Coalescer<Req, Resp> {
    fn clone(&self) -> Self {
        Coalescer { tx: self.tx.clone() }
    }
}

impl<Req, Resp> std::fmt::Debug for Coalescer<Req, Resp> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Coalescer")
    }
}

impl<Req: Send + 'static, Resp: Send + 'static> Coalescer<Req, Resp> {
    /// Starts the background task (needs a Tokio runtime). `batch_fn` gets up to `max_batch`
    /// requests gathered for at most `window` after the first one, and must return one
    /// response per request, in order. Missing responses are dropped (their callers get
    /// [`Closed`]); callers must treat that as a retryable failure.
    pub fn new<F, Fut>(window: Duration, max_batch: usize, batch_fn: F) -> Self
    where
        F: Fn(Vec<Req>) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Vec<Resp>> + Send + 'static,
    {
        let (tx, mut rx) = mpsc::unbounded_channel::<Pending<Req, Resp>>();
        let batch_fn = Arc::new(batch_fn);
        let max_batch = max_batch.max(1);
        tokio::spawn(async move {
            while let Some(first) = rx.recv().await {
                let mut batch = vec![first];
                let deadline = tokio::time::sleep(window);
                tokio::pin!(deadline);
                while batch.len() < max_batch {
                    tokio::select! {
                        _ = &mut deadline => break,
                        next = rx.recv() => match next {
                            Some(p) => batch.push(p),
                            None => break,
                        },
                    }
                }
                let batch_fn = Arc::clone(&batch_fn);
                tokio::spawn(async move {
                    let (reqs, waiters): (Vec<Req>, Vec<oneshot::Sender<Resp>>) =
                        batch.into_iter().unzip();
                    let resps = batch_fn(reqs).await;
                    for (waiter, resp) in waiters.into_iter().zip(resps) {
                        let _ = waiter.send(resp);
                    }
                });
            }
        });
        Coalescer { tx }
    }

    /// Asks for one item; resolves when its batch has been answered.
    pub async fn call(&self, req: Req) -> Result<Resp, Closed> {
        let (tx, rx) = oneshot::channel();
        self.tx.send((req, tx)).map_err(|_| Closed)?;
        rx.await.map_err(|_| Closed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[tokio::test]
    async fn concurrent_calls_share_one_batch_and_get_their_own_answers() {
        let calls = Arc::new(AtomicUsize::new(0));
        let c = Arc::clone(&calls);
        let co = Coalescer::new(Duration::from_millis(50), 100, move |reqs: Vec<u32>| {
            c.fetch_add(1, Ordering::SeqCst);
            async move { reqs.into_iter().map(|r| r * 10).collect() }
        });
        let answers = futures::future::join_all((0..20u32).map(|i| {
            let co = co.clone();
            async move { co.call(i).await }
        }))
        .await;
        for (i, a) in answers.into_iter().enumerate() {
            assert_eq!(a.unwrap(), i as u32 * 10);
        }
        assert_eq!(calls.load(Ordering::SeqCst), 1, "20 concurrent lookups, one batch call");
    }

    #[tokio::test]
    async fn batches_are_capped_at_max_batch() {
        let sizes = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = Arc::clone(&sizes);
        let co = Coalescer::new(Duration::from_millis(50), 8, move |reqs: Vec<u32>| {
            s.lock().unwrap().push(reqs.len());
            async move { reqs }
        });
        futures::future::join_all((0..20u32).map(|i| {
            let co = co.clone();
            async move { co.call(i).await }
        }))
        .await;
        let sizes = sizes.lock().unwrap().clone();
        assert!(sizes.iter().all(|s| *s <= 8), "{sizes:?}");
        assert_eq!(sizes.iter().sum::<usize>(), 20);
    }

    #[tokio::test]
    async fn a_short_answer_fails_only_the_unanswered_callers() {
        let co = Coalescer::new(Duration::from_millis(20), 10, |reqs: Vec<u32>| async move {
            reqs.into_iter().take(1).collect::<Vec<_>>()
        });
        let (a, b) = tokio::join!(co.call(1), co.call(2));
        assert_eq!(a.unwrap(), 1);
        assert!(b.is_err());
    }
}
