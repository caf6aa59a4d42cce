//! The cluster ID in the shared names (`k8s-<clusterID>-node`, `k8s-ig--<clusterID>`), as
//! upstream's `gce_clusterid.go`: the ConfigMap `kube-system/ingress-uid`, key `provider-uid`
//! when present, else `uid`. When the ConfigMap does not exist it is created with a random
//! 16-hex-digit ID under both keys (ingress-gce reads the same ConfigMap, so both controllers
//! agree). Watched, as upstream's informer watches it: after the first read a background
//! watch (the same `list`/`watch` with the name's field selector) follows the ConfigMap, so
//! a cluster ID written or changed later (by ingress-gce, or by hand) is used from the next
//! load-balancer sync on, and logged as a warning (the shared resources named with the old ID
//! stay as they are, as upstream's). A deleted ConfigMap keeps the last ID, as upstream.
//!
//! Read as upstream's informer reads it: a `list` of `kube-system` ConfigMaps with the field
//! selector `metadata.name=ingress-uid`, never a `get` (issue #30: upstream's role grants
//! `list`/`watch` on ConfigMaps and no `get`, so a `get` was Forbidden on every retry).
//! Creating it needs `create`, as upstream.

use std::collections::BTreeMap;
use std::io::Read;
use std::sync::{Arc, Mutex, OnceLock};

use ccm_core::cloud::ProviderError;
use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};

/// The ConfigMap's namespace.
pub const NAMESPACE: &str = "kube-system";
/// The ConfigMap's name.
pub const CONFIG_MAP: &str = "ingress-uid";
/// The cluster's UID key.
pub const KEY_UID: &str = "uid";
/// The provider's UID key (wins when present).
pub const KEY_PROVIDER_UID: &str = "provider-uid";

/// How long one API request about the ConfigMap may take.
const API_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// The ID a ConfigMap's data gives: `provider-uid`, else `uid`.
pub fn id_from_data(data: &BTreeMap<String, String>) -> Option<String> {
    data.get(KEY_PROVIDER_UID).or_else(|| data.get(KEY_UID)).cloned()
}

/// 8 random bytes as 16 hex digits (upstream's `makeUID`).
pub fn make_uid() -> String {
    let mut b = [0u8; 8];
    let random = std::fs::File::open("/dev/urandom").and_then(|mut f| f.read_exact(&mut b));
    if random.is_err() {
        // No /dev/urandom: the std hasher's random keys and the time.
        use std::hash::{BuildHasher, Hasher};
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or_default(),
        );
        b = h.finish().to_be_bytes();
    }
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Where the cluster ID comes from.
#[derive(Default)]
pub struct ClusterId {
    fixed: OnceLock<String>,
    kube: OnceLock<kube::Client>,
    cached: Arc<Mutex<Option<String>>>,
    /// The background watch, started with the first read through the ConfigMap.
    watch: OnceLock<tokio::task::JoinHandle<()>>,
}

impl Drop for ClusterId {
    fn drop(&mut self) {
        if let Some(w) = self.watch.get() {
            w.abort();
        }
    }
}

impl std::fmt::Debug for ClusterId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterId").field("fixed", &self.fixed.get()).finish_non_exhaustive()
    }
}

impl ClusterId {
    /// Uses `id` (tests, or a deployment that names it) instead of the ConfigMap.
    pub fn set_fixed(&self, id: String) {
        let _ = self.fixed.set(id);
    }

    /// The Kubernetes client the ConfigMap is read (and created) with.
    pub fn set_kube(&self, client: kube::Client) {
        let _ = self.kube.set(client);
    }

    /// The cluster ID.
    pub async fn get(&self) -> Result<String, ProviderError> {
        if let Some(id) = self.fixed.get() {
            return Ok(id.clone());
        }
        if let Some(id) = self.cached.lock().map(|c| c.clone()).unwrap_or_default() {
            return Ok(id);
        }
        let Some(kube) = self.kube.get() else {
            return Err(ProviderError::other(
                "GCE cluster ID unknown: the load balancer has no Kubernetes client to read ConfigMap kube-system/ingress-uid (the provider was not initialised)",
            ));
        };
        let id = read_or_create(kube).await?;
        tracing::info!(cluster_id = %id, "GCE: cluster ID from ConfigMap kube-system/ingress-uid");
        if let Ok(mut c) = self.cached.lock() {
            *c = Some(id.clone());
        }
        let cached = Arc::downgrade(&self.cached);
        let client = kube.clone();
        let _ = self.watch.get_or_init(|| tokio::spawn(follow(client, cached)));
        Ok(id)
    }
}

/// Follows the ConfigMap (upstream's informer): every version seen with an ID replaces the
/// cached one; ends when the [`ClusterId`] is gone. Watch failures are retried with the
/// watcher's backoff (logged), the last ID kept meanwhile.
async fn follow(client: kube::Client, cached: std::sync::Weak<Mutex<Option<String>>>) {
    use futures::StreamExt;
    use kube::runtime::WatchStreamExt;
    use kube::runtime::watcher::{self, Event};
    let api: Api<ConfigMap> = Api::namespaced(client, NAMESPACE);
    let config = watcher::Config::default().fields(&format!("metadata.name={CONFIG_MAP}"));
    let mut stream = watcher::watcher(api, config).default_backoff().boxed();
    while let Some(event) = stream.next().await {
        let Some(cell) = cached.upgrade() else { return };
        let cm = match event {
            Ok(Event::Apply(cm) | Event::InitApply(cm)) => cm,
            Ok(_) => continue,
            Err(
                watcher::Error::InitialListFailed(kube::Error::Api(s))
                | watcher::Error::WatchStartFailed(kube::Error::Api(s)),
            ) if s.code == 403 => {
                // A role granting list but not watch (upstream's grants both): the ID read
                // first is kept, as before; said once, not on every retry.
                tracing::warn!(
                    "GCE cluster ID: no permission to watch ConfigMap kube-system/ingress-uid (grant list and watch, as upstream's role); a later change takes effect at restart"
                );
                return;
            }
            Err(e) => {
                tracing::warn!(error = %e, "GCE cluster ID: watching ConfigMap kube-system/ingress-uid failed; retrying");
                continue;
            }
        };
        if cm.metadata.name.as_deref() != Some(CONFIG_MAP) {
            continue;
        }
        let Some(id) = id_from_data(&cm.data.unwrap_or_default()) else { continue };
        if let Ok(mut c) = cell.lock()
            && c.as_deref() != Some(id.as_str())
        {
            tracing::warn!(old = ?c.as_deref(), new = %id, "GCE: the cluster ID in ConfigMap kube-system/ingress-uid changed; new shared resources are named with the new ID");
            *c = Some(id);
        }
    }
}

/// The ConfigMap through a `list` with the field selector `metadata.name=ingress-uid` (what
/// upstream's single-object informer sends); `None` when it does not exist.
async fn find(api: &Api<ConfigMap>) -> Result<Option<ConfigMap>, kube::Error> {
    let params = ListParams::default().fields(&format!("metadata.name={CONFIG_MAP}"));
    let list = api.list(&params).await?;
    Ok(list.items.into_iter().find(|cm| cm.metadata.name.as_deref() == Some(CONFIG_MAP)))
}

fn id_of(cm: ConfigMap) -> Result<String, ProviderError> {
    id_from_data(&cm.data.unwrap_or_default()).ok_or_else(|| {
        ProviderError::other(format!(
            "GCE cluster ID: ConfigMap {NAMESPACE}/{CONFIG_MAP} has neither `{KEY_PROVIDER_UID}` nor `{KEY_UID}`"
        ))
    })
}

async fn read_or_create(kube: &kube::Client) -> Result<String, ProviderError> {
    let api: Api<ConfigMap> = Api::namespaced(kube.clone(), NAMESPACE);
    let fail = |what: &str, e: kube::Error| {
        ProviderError::with_source(
            format!("GCE cluster ID: {what} ConfigMap {NAMESPACE}/{CONFIG_MAP}: {e}"),
            e,
        )
    };
    let timeout = || {
        ProviderError::other(format!(
            "GCE cluster ID: the API server did not answer about ConfigMap {NAMESPACE}/{CONFIG_MAP} within {}s",
            API_TIMEOUT.as_secs()
        ))
    };
    let existing = tokio::time::timeout(API_TIMEOUT, find(&api))
        .await
        .map_err(|_| timeout())?
        .map_err(|e| fail("listing", e))?;
    if let Some(cm) = existing {
        return id_of(cm);
    }
    let id = make_uid();
    let cm = ConfigMap {
        metadata: ObjectMeta {
            name: Some(CONFIG_MAP.into()),
            namespace: Some(NAMESPACE.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([
            (KEY_UID.to_string(), id.clone()),
            (KEY_PROVIDER_UID.to_string(), id.clone()),
        ])),
        ..Default::default()
    };
    let created = tokio::time::timeout(API_TIMEOUT, api.create(&PostParams::default(), &cm))
        .await
        .map_err(|_| timeout())?;
    match created {
        Ok(_) => {
            tracing::info!(cluster_id = %id, "GCE: created ConfigMap kube-system/ingress-uid with a new cluster ID");
            Ok(id)
        }
        // Created meanwhile (ingress-gce, another replica): read theirs.
        Err(kube::Error::Api(s)) if s.code == 409 => {
            let cm = tokio::time::timeout(API_TIMEOUT, find(&api))
                .await
                .map_err(|_| timeout())?
                .map_err(|e| fail("listing", e))?;
            match cm {
                Some(cm) => id_of(cm),
                None => Err(ProviderError::other(format!(
                    "GCE cluster ID: creating ConfigMap {NAMESPACE}/{CONFIG_MAP} said it exists, but listing it found none"
                ))),
            }
        }
        Err(e) => Err(fail("creating", e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn provider_uid_wins() {
        let d =
            |kv: &[(&str, &str)]| kv.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
        assert_eq!(id_from_data(&d(&[("uid", "a"), ("provider-uid", "b")])), Some("b".into()));
        assert_eq!(id_from_data(&d(&[("uid", "a")])), Some("a".into()));
        assert_eq!(id_from_data(&d(&[])), None);
    }

    #[test]
    fn uids_are_16_hex_digits_and_differ() {
        let (a, b) = (make_uid(), make_uid());
        assert_eq!(a.len(), 16);
        assert!(a.bytes().all(|c| c.is_ascii_hexdigit()));
        assert_ne!(a, b);
    }

    #[tokio::test]
    async fn a_fixed_id_needs_no_client_and_none_is_an_error() {
        let c = ClusterId::default();
        let e = c.get().await.unwrap_err().to_string();
        assert!(e.contains("kube-system/ingress-uid"), "{e}");
        c.set_fixed("c0ffee".into());
        assert_eq!(c.get().await.unwrap(), "c0ffee");
    }
}
