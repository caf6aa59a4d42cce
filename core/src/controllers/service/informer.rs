//! A small informer: one list+watch, a local cache keyed by object key, and a stream of
//! changes with the previous version of each object (what client-go's event handlers get and
//! kube-runtime's reflector does not give).
//!
//! The service, route and node-IPAM controllers each run one for Nodes today. The cache is
//! behind an `Arc`, so a later change can run one Node informer per process and hand the same
//! [`Informer`] to every controller.

use std::collections::{HashMap, HashSet};
use std::fmt::Debug;
use std::sync::{Arc, RwLock};

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

/// The cache of one list+watch.
#[derive(Debug)]
pub(crate) struct Informer<K> {
    items: RwLock<HashMap<String, Arc<K>>>,
    synced: watch::Sender<bool>,
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
        Arc::new(Informer { items: RwLock::new(HashMap::new()), synced: watch::channel(false).0 })
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
    /// `changes` (closed receivers are fine: the cache is still kept).
    pub(crate) async fn run(
        self: Arc<Self>,
        api: Api<K>,
        config: watcher::Config,
        changes: mpsc::UnboundedSender<Change<K>>,
        shutdown: CancellationToken,
    ) {
        let mut stream = watcher::watcher(api, config).default_backoff().boxed();
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
                    let _ = changes.send(self.apply(obj));
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
                            let _ = changes.send(c);
                        }
                    }
                    listed.clear();
                    self.synced.send_replace(true);
                    let _ = changes.send(Change::Synced);
                }
                Event::Apply(obj) => {
                    let _ = changes.send(self.apply(obj));
                }
                Event::Delete(obj) => {
                    if let Some(c) = self.delete(&key_of(&obj)) {
                        let _ = changes.send(c);
                    }
                }
            }
        }
    }
}

/// Starts an informer for `api` and returns it with its change stream.
pub(crate) fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    shutdown: CancellationToken,
) -> (Arc<Informer<K>>, mpsc::UnboundedReceiver<Change<K>>)
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default,
{
    let informer = Informer::new();
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(informer.clone().run(api, config, tx, shutdown));
    (informer, rx)
}
