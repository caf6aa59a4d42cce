//! Shared cloud listings for Node lookups, used by every provider that answers a batch of
//! Nodes from a listing (all VMs of a resource group, all servers of a project, …).
//!
//! Owns three rules:
//! - **One fetch per scope at a time.** Concurrent lookups (the node controller runs batches
//!   side by side) wait for the listing in flight and share its answer instead of starting
//!   their own.
//! - **A fetch outlives the lookup that started it.** It runs as a task of its own: when the
//!   lookup's deadline ends (the node controller gives a whole batch one), the listing is
//!   still finished and stored, and the retry takes it. When every attempt started the
//!   listing over, a listing longer than the deadline was never finished and no Node was
//!   ever initialised (Azure at 5000 VMs, ci/bench, #35).
//! - **Reuse.** A listing answers later lookups ([`Wanted::Recent`]) for the provider's TTL
//!   after it ended, or for as long as it took to fetch when that is longer: a listing that
//!   took 40 s is no staler for the batch that waited for it than for the next one, and the
//!   cloud is asked for it at most half the time. A lookup that missed (a Node newer than the
//!   listing) asks for one started after its pass began ([`Wanted::StartedAfter`]), which is
//!   also the only kind a "gone" answer may rest on.

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A listing as fetched.
#[derive(Debug)]
pub struct Fetched<T> {
    /// When its fetch started: nothing the cloud had before this is missing from it.
    pub started: Instant,
    /// When its fetch ended.
    pub done: Instant,
    /// What was listed (indexed as the provider likes).
    pub value: T,
}

impl<T> std::ops::Deref for Fetched<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

/// Which listing a lookup accepts.
#[derive(Clone, Copy, Debug)]
pub enum Wanted {
    /// One whose fetch started at or after this instant (after a miss; for "gone").
    StartedAfter(Instant),
    /// One the lookup's pass started (its fetch began at or after `pass_started`), or one
    /// whose fetch ended less than the longer of `ttl` and the fetch's own duration before
    /// `now` (a zero `ttl`: none but the pass's own).
    Recent {
        /// When the lookup's pass (batch) began.
        pass_started: Instant,
        /// Now.
        now: Instant,
        /// The provider's reuse time.
        ttl: Duration,
    },
}

impl Wanted {
    /// [`Wanted::Recent`] as of now.
    pub fn recent(pass_started: Instant, ttl: Duration) -> Wanted {
        Wanted::Recent { pass_started, now: Instant::now(), ttl }
    }

    /// Whether `listing` is one the lookup takes.
    pub fn accepts<T>(&self, listing: &Fetched<T>) -> bool {
        match *self {
            Wanted::StartedAfter(t) => listing.started >= t,
            Wanted::Recent { pass_started, now, ttl } => {
                // TTL zero: no reuse at all (the cache is off).
                let took = listing.done.saturating_duration_since(listing.started);
                let keep = if ttl.is_zero() { ttl } else { ttl.max(took) };
                listing.started >= pass_started
                    || now.saturating_duration_since(listing.done) < keep
            }
        }
    }
}

type Slot<T> = Arc<tokio::sync::Mutex<Option<Arc<Fetched<T>>>>>;

/// The listings of one kind, by scope (a resource group, a project, …; compared
/// case-insensitively).
pub struct Listings<T> {
    slots: std::sync::Mutex<HashMap<String, Slot<T>>>,
}

impl<T> Default for Listings<T> {
    fn default() -> Self {
        Listings { slots: std::sync::Mutex::new(HashMap::new()) }
    }
}

impl<T> std::fmt::Debug for Listings<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let scopes = self.slots.lock().map(|s| s.len()).unwrap_or_default();
        f.debug_struct("Listings").field("scopes", &scopes).finish()
    }
}

impl<T: Send + Sync + 'static> Listings<T> {
    /// The listing of `scope` that `wanted` accepts: the stored one, or the one in flight
    /// (waited for), else the future `fetch` makes, run now as a task of its own, which
    /// stores its answer even when this caller is gone by then. A failed fetch stores
    /// nothing; `abandoned` makes the error for a fetch task that ended without an answer
    /// (it panicked).
    ///
    /// `fetch` is a maker, called only by the caller that fetches: a listing future (pages,
    /// HTTP, decoding) weighs kilobytes, and every waiting lookup holding one of its own
    /// made a batch of 500 Nodes weigh megabytes (Azure at 5000 Nodes: 142 MB of waiting
    /// lookups, #35).
    pub async fn get<E, F, Fut>(
        &self,
        scope: &str,
        wanted: Wanted,
        fetch: F,
        abandoned: impl FnOnce(String) -> E,
    ) -> Result<Arc<Fetched<T>>, E>
    where
        E: Send + 'static,
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<T, E>> + Send + 'static,
    {
        let slot = {
            let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            Arc::clone(slots.entry(scope.to_ascii_lowercase()).or_default())
        };
        let mut held = slot.lock_owned().await;
        if let Some(listing) = held.as_ref()
            && wanted.accepts(listing)
        {
            return Ok(Arc::clone(listing));
        }
        let fetch = fetch();
        let task = tokio::spawn(async move {
            let started = Instant::now();
            let value = fetch.await?;
            let listing = Arc::new(Fetched { started, done: Instant::now(), value });
            *held = Some(Arc::clone(&listing));
            Ok(listing)
        });
        match task.await {
            Ok(answer) => answer,
            Err(e) => {
                Err(abandoned(format!("the listing of {scope} ended without an answer: {e}")))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn fetched(started: Instant, took: Duration) -> Fetched<()> {
        Fetched { started, done: started + took, value: () }
    }

    #[test]
    fn a_listing_is_reused_for_the_ttl_or_as_long_as_it_took_to_fetch() {
        let t0 = Instant::now();
        let at = |secs: u64| t0 + Duration::from_secs(secs);
        let recent = |pass: u64, now: u64| Wanted::Recent {
            pass_started: at(pass),
            now: at(now),
            ttl: Duration::from_secs(5),
        };
        // Fetched in 1 s: reused for the TTL after it ended, not after.
        let quick = fetched(t0, Duration::from_secs(1));
        assert!(recent(3, 5).accepts(&quick));
        assert!(!recent(3, 7).accepts(&quick), "6 s after it ended, TTL 5 s");
        // Fetched in 40 s (thousands of VMs): reused for 40 s after it ended.
        let slow = fetched(t0, Duration::from_secs(40));
        assert!(recent(30, 75).accepts(&slow));
        assert!(!recent(30, 81).accepts(&slow));
        // Whatever its age, a listing this pass started is accepted; after a miss only a
        // listing started after the pass began.
        assert!(recent(0, 500).accepts(&slow));
        // TTL zero turns reuse off, however long the fetch took.
        let off = Wanted::Recent { pass_started: at(50), now: at(41), ttl: Duration::ZERO };
        assert!(!off.accepts(&slow));
        let own = Wanted::Recent { pass_started: t0, now: at(500), ttl: Duration::ZERO };
        assert!(own.accepts(&slow));
        assert!(Wanted::StartedAfter(t0).accepts(&slow));
        assert!(!Wanted::StartedAfter(at(1)).accepts(&slow));
    }

    #[tokio::test]
    async fn a_listing_outlives_the_lookup_that_gave_up_on_it_and_the_retry_uses_it() {
        let listings: Listings<Vec<&'static str>> = Listings::default();
        let started = Arc::new(AtomicUsize::new(0));
        let (finished_tx, finished_rx) = tokio::sync::oneshot::channel::<()>();
        let fetch = |finished: Option<tokio::sync::oneshot::Sender<()>>| {
            let started = Arc::clone(&started);
            move || async move {
                started.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_secs(2)).await;
                if let Some(tx) = finished {
                    let _ = tx.send(());
                }
                Ok::<_, String>(vec!["vm-a"])
            }
        };
        let recent = || Wanted::recent(Instant::now(), Duration::from_millis(1));
        // The first lookup's deadline ends while the listing is being fetched.
        let gave_up = tokio::time::timeout(
            Duration::from_millis(20),
            listings.get("RG", recent(), fetch(Some(finished_tx)), |e| e),
        )
        .await;
        assert!(gave_up.is_err(), "the first lookup should have timed out");
        // The fetch goes on and stores its listing; the retry (its pass started after that
        // fetch did; the listing ended moments ago, within the 2 s it took) takes it.
        finished_rx.await.expect("the listing's fetch was cancelled with the lookup");
        let listing = listings.get("rg", recent(), fetch(None), |e| e).await.unwrap();
        assert_eq!(listing.value, vec!["vm-a"]);
        assert_eq!(started.load(Ordering::SeqCst), 1, "the retry fetched the listing again");
        // A lookup that missed wants a listing started after its pass: fetched again.
        let after_miss = Wanted::StartedAfter(Instant::now());
        listings.get("rg", after_miss, fetch(None), |e| e).await.unwrap();
        assert_eq!(started.load(Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn concurrent_lookups_share_one_fetch_and_a_failure_stores_nothing() {
        let listings: Listings<u32> = Listings::default();
        let calls = Arc::new(AtomicUsize::new(0));
        let fetch = |answer: Result<u32, String>| {
            let calls = Arc::clone(&calls);
            move || async move {
                calls.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(200)).await;
                answer
            }
        };
        let pass = Instant::now();
        let wanted = Wanted::recent(pass, Duration::ZERO);
        let (a, b) = tokio::join!(
            listings.get("p", wanted, fetch(Ok(7)), |e| e),
            listings.get("p", wanted, fetch(Ok(8)), |e| e),
        );
        assert_eq!((a.unwrap().value, b.unwrap().value), (7, 7));
        assert_eq!(calls.load(Ordering::SeqCst), 1);
        let failed = listings
            .get("q", Wanted::StartedAfter(Instant::now()), fetch(Err("503".into())), |e| e)
            .await;
        assert_eq!(failed.unwrap_err(), "503");
        let next = listings.get("q", Wanted::recent(pass, Duration::ZERO), fetch(Ok(9)), |e| e);
        assert_eq!(next.await.unwrap().value, 9, "a failed fetch left a listing behind");
    }
}
