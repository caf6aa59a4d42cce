//! A small informer: one list+watch, a local cache keyed by object key, and a stream of
//! changes with the previous version of each object (what client-go's event handlers get and
//! kube-runtime's reflector does not give).
//!
//! The service, route and node-IPAM controllers each run one for Nodes today. The cache is
//! behind an `Arc`, so a later change can run one Node informer per process and hand the same
//! [`Informer`] to every controller.
//!
//! Memory: every change sent is held until its receiver reads it, so [`spawn`] is for
//! consumers that keep reading; a controller that only reads the cache (the route
//! controller) uses [`spawn_cache`], which sends no changes at all.
//! [`Informer::retained_versions`] counts what is held.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};

use crate::controllers::backoff::WatchBackoff;
use futures::StreamExt;
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// A change seen by the informer.
#[derive(Debug, Clone)]
pub(crate) enum Change<K> {
    /// A new object (also sent for every object of the first list).
    Added(Arc<K>),
    /// An object changed (also sent on re-lists, possibly with `old == new`).
    Updated {
        /// What the cache held before.
        old: Arc<K>,
        /// The new version.
        new: Arc<K>,
    },
    /// An object is gone (last known version).
    Deleted(Arc<K>),
    /// A (re-)list completed: the cache is complete.
    Synced,
}

impl<K> Change<K> {
    /// How many object versions this change carries.
    fn versions(&self) -> usize {
        match self {
            Change::Added(_) | Change::Deleted(_) => 1,
            Change::Updated { .. } => 2,
            Change::Synced => 0,
        }
    }
}

/// The change stream of an informer started with [`spawn`]. Every change sent is held until
/// received, so a consumer must keep reading; a controller that only needs the cache uses
/// [`spawn_cache`] instead.
#[derive(Debug)]
pub(crate) struct Changes<K> {
    rx: mpsc::UnboundedReceiver<Change<K>>,
    queued: Arc<AtomicUsize>,
}

impl<K> Changes<K> {
    /// The next change; `None` once the informer stopped.
    pub(crate) async fn recv(&mut self) -> Option<Change<K>> {
        let change = self.rx.recv().await?;
        self.queued.fetch_sub(change.versions(), Ordering::SeqCst);
        Some(change)
    }
}

/// The cache of one list+watch.
#[derive(Debug)]
pub(crate) struct Informer<K> {
    items: RwLock<HashMap<String, Arc<K>>>,
    synced: watch::Sender<bool>,
    /// Object versions sent as changes and not received yet.
    queued: Arc<AtomicUsize>,
}

/// The cache key of an object: `namespace/name`, or `name` for cluster-scoped objects.
pub(crate) fn key_of<K: Resource>(obj: &K) -> String {
    let name = obj.meta().name.clone().unwrap_or_default();
    match obj.meta().namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name,
    }
}

impl<K> Informer<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
{
    /// An empty informer.
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(Informer {
            items: RwLock::new(HashMap::new()),
            synced: watch::channel(false).0,
            queued: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// How many object versions this informer keeps alive: the cache plus the versions in
    /// changes not received yet. Stays near the number of objects when the consumer keeps
    /// up (or there is none).
    pub(crate) fn retained_versions(&self) -> usize {
        self.items.read().unwrap_or_else(|p| p.into_inner()).len()
            + self.queued.load(Ordering::SeqCst)
    }

    fn send(&self, changes: Option<&mpsc::UnboundedSender<Change<K>>>, change: Change<K>) {
        let Some(tx) = changes else { return };
        let n = change.versions();
        self.queued.fetch_add(n, Ordering::SeqCst);
        if tx.send(change).is_err() {
            self.queued.fetch_sub(n, Ordering::SeqCst);
        }
    }

    /// The cached object with this key.
    pub(crate) fn get(&self, key: &str) -> Option<Arc<K>> {
        self.items.read().unwrap_or_else(|p| p.into_inner()).get(key).cloned()
    }

    /// Every cached object.
    pub(crate) fn list(&self) -> Vec<Arc<K>> {
        self.items.read().unwrap_or_else(|p| p.into_inner()).values().cloned().collect()
    }

    /// Waits until the first list completed.
    pub(crate) async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    fn apply(&self, obj: K) -> Change<K> {
        let key = key_of(&obj);
        let new = Arc::new(obj);
        let old = self.items.write().unwrap_or_else(|p| p.into_inner()).insert(key, new.clone());
        match old {
            Some(old) => Change::Updated { old, new },
            None => Change::Added(new),
        }
    }

    fn delete(&self, key: &str) -> Option<Change<K>> {
        self.items.write().unwrap_or_else(|p| p.into_inner()).remove(key).map(Change::Deleted)
    }

    /// Runs the list+watch until `shutdown`, filling the cache and sending every change to
    /// `changes` if given (closed receivers are fine: the cache is still kept).
    async fn run(
        self: Arc<Self>,
        api: Api<K>,
        config: watcher::Config,
        changes: Option<mpsc::UnboundedSender<Change<K>>>,
        shutdown: CancellationToken,
    ) {
        let changes = changes.as_ref();
        let mut stream = watcher::watcher(api, config).backoff(WatchBackoff::default()).boxed();
        let mut listed: HashSet<String> = HashSet::new();
        loop {
            let ev = tokio::select! {
                _ = shutdown.cancelled() => return,
                ev = stream.next() => ev,
            };
            let Some(ev) = ev else { return };
            let ev = match ev {
                Ok(ev) => ev,
                Err(e) => {
                    tracing::warn!(error = %e, "watch failed; retrying with backoff");
                    continue;
                }
            };
            match ev {
                Event::Init => listed.clear(),
                Event::InitApply(obj) => {
                    listed.insert(key_of(&obj));
                    self.send(changes, self.apply(obj));
                }
                Event::InitDone => {
                    let gone: Vec<String> = self
                        .items
                        .read()
                        .unwrap_or_else(|p| p.into_inner())
                        .keys()
                        .filter(|k| !listed.contains(*k))
                        .cloned()
                        .collect();
                    for key in gone {
                        if let Some(c) = self.delete(&key) {
                            self.send(changes, c);
                        }
                    }
                    listed.clear();
                    self.synced.send_replace(true);
                    self.send(changes, Change::Synced);
                }
                Event::Apply(obj) => {
                    self.send(changes, self.apply(obj));
                }
                Event::Delete(obj) => {
                    if let Some(c) = self.delete(&key_of(&obj)) {
                        self.send(changes, c);
                    }
                }
            }
        }
    }
}

/// Starts an informer for `api` and returns it with its change stream, which the caller
/// must keep reading (or drop).
pub(crate) fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    shutdown: CancellationToken,
) -> (Arc<Informer<K>>, Changes<K>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let informer = Informer::new();
    let (tx, rx) = mpsc::unbounded_channel();
    let changes = Changes { rx, queued: informer.queued.clone() };
    tokio::spawn(informer.clone().run(api, config, Some(tx), shutdown));
    (informer, changes)
}

/// Starts an informer for `api` that only keeps its cache: no change stream, so nothing
/// but the current version of each object is retained.
pub(crate) fn spawn_cache<K>(
    api: Api<K>,
    config: watcher::Config,
    shutdown: CancellationToken,
) -> Arc<Informer<K>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let informer = Informer::new();
    tokio::spawn(informer.clone().run(api, config, None, shutdown));
    informer
}
