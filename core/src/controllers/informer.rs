//! Informers: one list+watch, one cache, and any number of change streams that carry the
//! previous version of each object (what client-go's event handlers get and kube-runtime's
//! reflector does not give).
//!
//! The manager runs ONE Node informer per leadership term ([`SharedNodes`], issue #15) and
//! hands it to every controller through [`super::ControllerContext::nodes`]: one watch and
//! one cache of every Node, instead of one per controller. The cache is a kube-runtime
//! [`Store`], so the cloud-node controller's kube-runtime `Controller` and the lifecycle
//! controller read the very same `Arc`s as the service, route and node-IPAM controllers.
//! Objects are pruned before they are cached ([`prune_node`]): `managedFields`, the image
//! list and the volume lists, which no controller reads and which are most of a Node's bytes.
//! A controller started without a shared informer (tests, a node label selector) runs a
//! private one with the same code.
//!
//! A subscriber ([`Informer::subscribe`]) first gets every cached object as `Added` (and
//! `Synced` if the first list is done), then every change, in order, with nothing lost or
//! repeated: the cache is written and the change sent under one lock. Every change sent is
//! held until its receiver reads it, so only consumers that keep reading subscribe; a
//! controller that only reads the cache (the route and lifecycle controllers) does not.
//! [`Informer::retained_versions`] counts what is held.

use std::collections::HashMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::controllers::backoff::WatchBackoff;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{Node, NodeSystemInfo};
use kube::Resource;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher::{self, Event};
use serde::de::DeserializeOwned;
use tokio::sync::{mpsc, watch};
use tokio_util::sync::CancellationToken;

/// A change seen by the informer.
#[derive(Debug, Clone)]
pub(crate) enum Change<K> {
    /// A new object (also sent for every object of the first list, and to a new subscriber
    /// for every cached object).
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

/// A change stream of an informer ([`Informer::subscribe`]). Every change sent is held until
/// received, so a consumer must keep reading (or drop it).
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

    /// The objects added or updated, as a stream (a kube-runtime `Controller`'s trigger).
    pub(crate) fn applied(self) -> impl futures::Stream<Item = Arc<K>> + Send
    where
        K: Send + Sync + 'static,
    {
        futures::stream::unfold(self, |mut changes| async move {
            loop {
                match changes.recv().await? {
                    Change::Added(obj) | Change::Updated { new: obj, .. } => {
                        return Some((obj, changes));
                    }
                    Change::Deleted(_) | Change::Synced => {}
                }
            }
        })
    }
}

/// The cache of one list+watch, shared by reference (`Arc<Informer<K>>`).
pub(crate) struct Informer<K>
where
    K: Resource + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    reader: Store<K>,
    synced: watch::Sender<bool>,
    /// The change streams; written under this lock together with the cache.
    subscribers: Mutex<Vec<mpsc::UnboundedSender<Change<K>>>>,
    /// Object versions sent as changes and not received yet (all subscribers).
    queued: Arc<AtomicUsize>,
}

impl<K> Debug for Informer<K>
where
    K: Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Informer").field("objects", &self.reader.len()).finish()
    }
}

/// The cache key of an object: `namespace/name`, or `name` for cluster-scoped objects.
pub(crate) fn key_of<K: Resource>(obj: &K) -> String {
    let name = obj.meta().name.clone().unwrap_or_default();
    match obj.meta().namespace.as_deref() {
        Some(ns) if !ns.is_empty() => format!("{ns}/{name}"),
        _ => name,
    }
}

/// Drops what no controller reads from an object before it is cached: `managedFields`
/// (a large share of every object's bytes on a real cluster).
pub(crate) fn prune_meta<K: Resource>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
}

/// [`prune_meta`] and, for Nodes, the status no controller or provider reads: the image
/// and volume lists, capacity, allocatable, the daemon endpoints, runtime handlers,
/// features, config and every `nodeInfo` field but `systemUUID` (vSphere finds a Node's VM by
/// it). A kubelet's Node carries tens of kilobytes of these; at 5000 Nodes what was left
/// after the images and managed fields was still most of the cache (#35). Labels,
/// annotations, spec, addresses and conditions are kept: the controllers read them, and the
/// cloud-node controller's Node update is built from the cached object (a PUT without
/// `managedFields` keeps the server's; a PUT of a Node never writes its status, and the
/// status writes are merge patches of the addresses and conditions alone).
pub(crate) fn prune_node(node: &mut Node) {
    prune_meta(node);
    if let Some(status) = node.status.as_mut() {
        status.images = None;
        status.volumes_attached = None;
        status.volumes_in_use = None;
        status.capacity = None;
        status.allocatable = None;
        status.daemon_endpoints = None;
        status.runtime_handlers = None;
        status.features = None;
        status.config = None;
        if let Some(info) = status.node_info.as_mut() {
            let system_uuid = std::mem::take(&mut info.system_uuid);
            *info = NodeSystemInfo { system_uuid, ..NodeSystemInfo::default() };
        }
    }
}

impl<K> Informer<K>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    /// An empty informer and the writer of its cache.
    fn new() -> (Arc<Self>, reflector::store::Writer<K>) {
        let (reader, writer) = reflector::store::<K>();
        let informer = Arc::new(Informer {
            reader,
            synced: watch::channel(false).0,
            subscribers: Mutex::new(Vec::new()),
            queued: Arc::new(AtomicUsize::new(0)),
        });
        (informer, writer)
    }

    /// The cache as a kube-runtime store (for a kube-runtime `Controller`), once the first
    /// list is complete; `None` if `shutdown` fires first. Never hand out the store before:
    /// kube-runtime's `Store::wait_until_ready` wakes only the last of several tasks waiting
    /// on one store (a oneshot receiver keeps one waker), and a shared store has several
    /// (under load the lifecycle controller waited forever); once ready, every wait returns
    /// at once.
    pub(crate) async fn synced_reader(&self, shutdown: &CancellationToken) -> Option<Store<K>> {
        tokio::select! {
            _ = self.wait_synced() => Some(self.reader.clone()),
            _ = shutdown.cancelled() => None,
        }
    }

    /// How many object versions this informer keeps alive: the cache plus the versions in
    /// changes not received yet. Stays near the number of objects when the consumers keep
    /// up (or there is none).
    pub(crate) fn retained_versions(&self) -> usize {
        self.reader.len() + self.queued.load(Ordering::SeqCst)
    }

    /// A new change stream: every cached object as `Added` (then `Synced` if the first list
    /// is done), then every change from now on.
    pub(crate) fn subscribe(&self) -> Changes<K> {
        let (tx, rx) = mpsc::unbounded_channel();
        let changes = Changes { rx, queued: self.queued.clone() };
        let mut subs = self.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        if *self.synced.borrow() {
            for obj in self.reader.state() {
                self.send_one(&tx, Change::Added(obj));
            }
            self.send_one(&tx, Change::Synced);
        }
        subs.push(tx);
        changes
    }

    fn send_one(&self, tx: &mpsc::UnboundedSender<Change<K>>, change: Change<K>) {
        let n = change.versions();
        self.queued.fetch_add(n, Ordering::SeqCst);
        if tx.send(change).is_err() {
            self.queued.fetch_sub(n, Ordering::SeqCst);
        }
    }

    /// Sends `change` to every subscriber (dropping those that went away).
    fn send(&self, subs: &mut Vec<mpsc::UnboundedSender<Change<K>>>, change: Change<K>) {
        subs.retain(|tx| !tx.is_closed());
        for tx in subs.iter() {
            self.send_one(tx, change.clone());
        }
    }

    fn object_ref(key: &str) -> ObjectRef<K> {
        match key.split_once('/') {
            Some((ns, name)) => ObjectRef::new(name).within(ns),
            None => ObjectRef::new(key),
        }
    }

    /// The cached object with this key.
    pub(crate) fn get(&self, key: &str) -> Option<Arc<K>> {
        self.reader.get(&Self::object_ref(key))
    }

    /// Every cached object.
    pub(crate) fn list(&self) -> Vec<Arc<K>> {
        self.reader.state()
    }

    /// Waits until the first list completed.
    pub(crate) async fn wait_synced(&self) {
        let mut rx = self.synced.subscribe();
        let _ = rx.wait_for(|s| *s).await;
    }

    /// Writes one watch event into the cache and sends the changes it makes, under the
    /// subscribers' lock (so a new subscriber sees each change exactly once).
    fn apply(&self, writer: &mut reflector::store::Writer<K>, ev: &Event<K>) {
        let mut subs = self.subscribers.lock().unwrap_or_else(|p| p.into_inner());
        match ev {
            Event::Init | Event::InitApply(_) => writer.apply_watcher_event(ev),
            Event::InitDone => {
                let old: HashMap<ObjectRef<K>, Arc<K>> = self
                    .reader
                    .state()
                    .into_iter()
                    .map(|o| (ObjectRef::from_obj(&*o), o))
                    .collect();
                writer.apply_watcher_event(ev);
                let mut seen = std::collections::HashSet::with_capacity(old.len());
                for new in self.reader.state() {
                    let key = ObjectRef::from_obj(&*new);
                    let change = match old.get(&key) {
                        Some(old) => Change::Updated { old: old.clone(), new },
                        None => Change::Added(new),
                    };
                    seen.insert(key);
                    self.send(&mut subs, change);
                }
                for (key, obj) in old {
                    if !seen.contains(&key) {
                        self.send(&mut subs, Change::Deleted(obj));
                    }
                }
                self.synced.send_replace(true);
                self.send(&mut subs, Change::Synced);
            }
            Event::Apply(obj) => {
                let key = ObjectRef::from_obj(obj);
                let old = self.reader.get(&key);
                writer.apply_watcher_event(ev);
                if let Some(new) = self.reader.get(&key) {
                    let change = match old {
                        Some(old) => Change::Updated { old, new },
                        None => Change::Added(new),
                    };
                    self.send(&mut subs, change);
                }
            }
            Event::Delete(obj) => {
                let old = self.reader.get(&ObjectRef::from_obj(obj));
                writer.apply_watcher_event(ev);
                if let Some(old) = old {
                    self.send(&mut subs, Change::Deleted(old));
                }
            }
        }
    }

    /// Runs the list+watch until `shutdown`, pruning each object with `prune` and filling
    /// the cache.
    async fn run(
        self: Arc<Self>,
        mut writer: reflector::store::Writer<K>,
        api: Api<K>,
        config: watcher::Config,
        prune: fn(&mut K),
        shutdown: CancellationToken,
    ) {
        let mut stream =
            watcher::watcher(api, config).backoff(WatchBackoff::default()).modify(prune).boxed();
        loop {
            let ev = tokio::select! {
                _ = shutdown.cancelled() => return,
                ev = stream.next() => ev,
            };
            match ev {
                None => return,
                Some(Ok(ev)) => self.apply(&mut writer, &ev),
                Some(Err(e)) => tracing::warn!(error = %e, "watch failed; retrying with backoff"),
            }
        }
    }
}

/// Starts an informer for `api` (objects pruned with `prune`) that runs until `shutdown`.
pub(crate) fn spawn<K>(
    api: Api<K>,
    config: watcher::Config,
    prune: fn(&mut K),
    shutdown: CancellationToken,
) -> Arc<Informer<K>>
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (informer, writer) = Informer::new();
    tokio::spawn(informer.clone().run(writer, api, config, prune, shutdown));
    informer
}

/// The manager's one Node informer, handed to every controller
/// ([`super::ControllerContext::nodes`]).
#[derive(Clone)]
pub struct SharedNodes(pub(crate) Arc<Informer<Node>>);

impl std::fmt::Debug for SharedNodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.0.fmt(f)
    }
}

impl SharedNodes {
    /// Starts the list+watch of every Node with `client`; it runs until `shutdown`.
    pub fn start(client: kube::Client, shutdown: CancellationToken) -> Self {
        SharedNodes(spawn(
            Api::all(client),
            watcher::Config::default().any_semantic(),
            prune_node,
            shutdown,
        ))
    }
}

/// The Node informer a controller uses: the shared one, unless the controller watches only
/// the Nodes with `selector` (then a private one, started here with the controller's client).
pub(crate) fn nodes_for(
    ctx: &super::ControllerContext,
    selector: Option<&str>,
) -> Arc<Informer<Node>> {
    match (&ctx.nodes, selector) {
        (Some(shared), None) => shared.0.clone(),
        _ => {
            let mut cfg = watcher::Config::default().any_semantic();
            if let Some(sel) = selector {
                cfg = cfg.labels(sel);
            }
            spawn(Api::all(ctx.client.clone()), cfg, prune_node, ctx.shutdown.clone())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(name: &str, rv: &str) -> Node {
        let mut n = Node::default();
        n.metadata.name = Some(name.into());
        n.metadata.resource_version = Some(rv.into());
        n
    }

    fn names(changes: &mut Changes<Node>) -> Vec<String> {
        let mut out = Vec::new();
        while let Ok(c) = changes.rx.try_recv() {
            changes.queued.fetch_sub(c.versions(), Ordering::SeqCst);
            out.push(match c {
                Change::Added(n) => format!("+{}", key_of(n.as_ref())),
                Change::Updated { old, new } => format!(
                    "~{}@{}>{}",
                    key_of(new.as_ref()),
                    old.metadata.resource_version.as_deref().unwrap_or_default(),
                    new.metadata.resource_version.as_deref().unwrap_or_default()
                ),
                Change::Deleted(n) => format!("-{}", key_of(n.as_ref())),
                Change::Synced => "synced".into(),
            });
        }
        out.sort();
        out
    }

    #[test]
    fn subscribers_see_the_cache_then_every_change_once_and_a_relist_diffs() {
        let (inf, mut w) = Informer::<Node>::new();
        let mut early = inf.subscribe();
        inf.apply(&mut w, &Event::Init);
        inf.apply(&mut w, &Event::InitApply(node("a", "1")));
        inf.apply(&mut w, &Event::InitApply(node("b", "1")));
        assert!(inf.list().is_empty(), "a list is cached only when complete");
        inf.apply(&mut w, &Event::InitDone);
        assert_eq!(names(&mut early), ["+a", "+b", "synced"]);

        let mut late = inf.subscribe();
        assert_eq!(names(&mut late), ["+a", "+b", "synced"]);
        inf.apply(&mut w, &Event::Apply(node("a", "2")));
        inf.apply(&mut w, &Event::Delete(node("b", "1")));
        for s in [&mut early, &mut late] {
            assert_eq!(names(s), ["-b", "~a@1>2"]);
        }
        // A relist: c appeared, a changed, nothing else.
        inf.apply(&mut w, &Event::Init);
        inf.apply(&mut w, &Event::InitApply(node("a", "3")));
        inf.apply(&mut w, &Event::InitApply(node("c", "1")));
        inf.apply(&mut w, &Event::InitDone);
        assert_eq!(names(&mut late), ["+c", "synced", "~a@2>3"]);
        assert_eq!(
            inf.get("a").and_then(|n| n.metadata.resource_version.clone()).as_deref(),
            Some("3")
        );
        assert!(inf.get("b").is_none());
        drop(late);
        inf.apply(&mut w, &Event::Apply(node("c", "2")));
        // cache (a, c) + unread by `early`: +c, ~a (two versions), ~c (two versions)
        assert_eq!(inf.retained_versions(), 2 + 5);
    }

    #[test]
    fn pruning_drops_managed_fields_and_images_and_keeps_what_controllers_read() {
        use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
        let mut n = node("a", "1");
        n.metadata.managed_fields = Some(vec![Default::default()]);
        n.metadata.labels = Some([("l".to_string(), "v".to_string())].into());
        n.metadata.annotations = Some([("x".to_string(), "y".to_string())].into());
        n.status = Some(k8s_openapi::api::core::v1::NodeStatus {
            images: Some(vec![Default::default()]),
            addresses: Some(vec![Default::default()]),
            conditions: Some(vec![Default::default()]),
            capacity: Some([("cpu".to_string(), Quantity("4".into()))].into()),
            allocatable: Some([("cpu".to_string(), Quantity("4".into()))].into()),
            node_info: Some(NodeSystemInfo {
                system_uuid: "4210-ab".into(),
                kubelet_version: "v1.36.3".into(),
                os_image: "Debian GNU/Linux 12 (bookworm)".into(),
                ..Default::default()
            }),
            ..Default::default()
        });
        prune_node(&mut n);
        assert!(n.metadata.managed_fields.is_none());
        let s = n
            .status
            .as_ref()
            .map(|s| (s.images.is_none(), s.addresses.is_some(), s.conditions.is_some()));
        assert_eq!(s, Some((true, true, true)));
        assert!(n.metadata.labels.is_some() && n.metadata.annotations.is_some());
        let status = n.status.unwrap_or_default();
        assert!(status.capacity.is_none() && status.allocatable.is_none());
        let info = status.node_info.unwrap_or_default();
        assert_eq!(info.system_uuid, "4210-ab", "vSphere's lookup key is kept");
        assert!(info.kubelet_version.is_empty() && info.os_image.is_empty());
    }
}
