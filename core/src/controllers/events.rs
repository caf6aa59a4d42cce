//! Recording events on the objects the controllers act on, the same way for every controller:
//! a failure to record is logged, never fatal.
//!
//! [`EventRecorder`] publishes **core/v1 Events**, as upstream's controllers do (client-go's
//! `record` package): `source.component` and `reportingComponent` are the controller's
//! component name (`cloud-node-controller`, `service-controller`, ...; spec §2-§6), so
//! `kubectl get events --field-selector source=service-controller` finds them and the
//! events.k8s.io/v1 view shows them as `deprecatedSource`. Upstream's ClusterRoles grant
//! `events` in the core group only (create, patch, update): that is all this needs (create, and
//! patch for a repeat).
//!
//! Repeats fold the way client-go's event correlator does: the *same* message about the same
//! object, reason and action becomes one event whose `count` grows (a patch of `count` and
//! `lastTimestamp`); a *different* message is a new event. (kube-rs' `Recorder` folds by
//! reason and action only, so a second, different `SyncLoadBalancerFailed` would be hidden
//! behind the first one's text in `kubectl describe`.)
//!
//! What it remembers per series is small (names, the message, a count) and bounded: a series
//! is forgotten 6 minutes after its last use and at most [`MAX_SERIES`] are kept, like
//! client-go's correlator cache. (kube-rs' `Recorder` keeps every published Event whole, and
//! one recorder per series had its own map: about 6 kB per Node while a cluster of thousands
//! registers at once, issue #15.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Event as K8sEvent, EventSource, ObjectReference};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Reporter};

/// How long a message's series is remembered after its last use (client-go and kube-rs: 6
/// minutes).
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// The most series remembered at once (client-go's correlator cache holds 4096): beyond it,
/// the least recently used is forgotten (its next repeat starts a new event).
pub const MAX_SERIES: usize = 4096;

/// How often expired series are swept out (not on every event: thousands are published
/// while a large cluster registers).
const SWEEP_EVERY: Duration = Duration::from_secs(30);

/// One published event, as much as its series needs.
#[derive(Debug, Clone)]
struct Published {
    note: String,
    namespace: String,
    name: String,
    count: i32,
    used: Instant,
}

/// (object, reason, action) → the last event published for it.
#[derive(Default)]
struct Series {
    by_key: HashMap<(String, String, String), Published>,
    swept: Option<Instant>,
}

impl Series {
    /// The event a repeat of `note` would grow, forgetting expired series first (at most
    /// every [`SWEEP_EVERY`], or when full).
    fn repeat_of(
        &mut self,
        key: &(String, String, String),
        note: &str,
        now: Instant,
    ) -> Option<Published> {
        let due = self.swept.is_none_or(|at| now.duration_since(at) >= SWEEP_EVERY);
        if due || self.by_key.len() >= MAX_SERIES {
            self.by_key.retain(|_, p| now.duration_since(p.used) < SERIES_TTL);
            self.swept = Some(now);
        }
        self.by_key
            .get(key)
            .filter(|p| p.note == note && now.duration_since(p.used) < SERIES_TTL)
            .cloned()
    }

    /// Remembers `published` as the key's latest event, forgetting the least recently used
    /// series if [`MAX_SERIES`] are kept already.
    fn remember(&mut self, key: (String, String, String), published: Published) {
        if !self.by_key.contains_key(&key) && self.by_key.len() >= MAX_SERIES {
            let oldest = self.by_key.iter().min_by_key(|(_, p)| p.used).map(|(k, _)| k.clone());
            if let Some(oldest) = oldest {
                self.by_key.remove(&oldest);
            }
        }
        self.by_key.insert(key, published);
    }
}

/// Publishes the events of one controller (one reporting component).
#[derive(Clone)]
pub struct EventRecorder {
    client: kube::Client,
    reporter: Reporter,
    series: Arc<Mutex<Series>>,
}

impl EventRecorder {
    /// A recorder reporting as `reporter`.
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        EventRecorder { client, reporter, series: Arc::default() }
    }

    fn series(&self) -> std::sync::MutexGuard<'_, Series> {
        self.series.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A new core/v1 event about `regarding`, as client-go's recorder writes it: named
    /// `<object>.<hex nanoseconds>`, count 1, first and last timestamps now, `source` and
    /// `reportingComponent`/`reportingInstance` from the reporter.
    fn new_event(&self, ev: &Event, regarding: &ObjectReference, namespace: &str) -> K8sEvent {
        let now = k8s_openapi::jiff::Timestamp::now();
        let name = format!(
            "{}.{:x}",
            regarding.name.as_deref().unwrap_or(&self.reporter.controller),
            now.as_nanosecond()
        );
        let component = self.reporter.controller.clone();
        K8sEvent {
            metadata: ObjectMeta {
                namespace: Some(namespace.to_string()),
                name: Some(name),
                ..Default::default()
            },
            involved_object: regarding.clone(),
            reason: Some(ev.reason.clone()),
            message: ev.note.clone(),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .to_string(),
            ),
            count: Some(1),
            first_timestamp: Some(Time(now)),
            last_timestamp: Some(Time(now)),
            source: Some(EventSource {
                component: Some(component.clone()),
                host: self.reporter.instance.clone(),
            }),
            reporting_component: Some(component),
            reporting_instance: Some(
                self.reporter.instance.clone().unwrap_or_else(|| self.reporter.controller.clone()),
            ),
            action: Some(ev.action.clone()),
            ..Default::default()
        }
    }

    /// Publishes `ev` about `regarding`: a new event, or the event of the same message about
    /// the same object, reason and action with its count grown by one.
    async fn record(
        &self,
        object: String,
        ev: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let note = ev.note.clone().unwrap_or_default();
        let key = (object, ev.reason.clone(), ev.action.clone());
        let repeat = self.series().repeat_of(&key, &note, Instant::now());
        if let Some(mut last) = repeat {
            let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &last.namespace);
            last.count += 1;
            // What client-go's correlator patches on a repeat (a strategic-merge patch there;
            // a merge patch of the same two scalars here).
            let patch = serde_json::json!({
                "count": last.count,
                "lastTimestamp": Time(k8s_openapi::jiff::Timestamp::now()),
            });
            match events.patch(&last.name, &PatchParams::default(), &Patch::Merge(&patch)).await {
                Ok(_) => {
                    last.used = Instant::now();
                    self.series().remember(key, last);
                    return Ok(());
                }
                // Gone meanwhile (events expire on the server): a new event instead.
                Err(kube::Error::Api(s)) if s.code == 404 => {}
                Err(e) => return Err(e),
            }
        }
        // Cluster-scoped objects' events go to "default", as client-go puts them.
        let namespace = regarding.namespace.clone().unwrap_or_else(|| "default".to_string());
        let event = self.new_event(ev, regarding, &namespace);
        let events: Api<K8sEvent> = Api::namespaced(self.client.clone(), &namespace);
        let created = events.create(&PostParams::default(), &event).await?;
        let name = created.metadata.name.or(event.metadata.name).unwrap_or_default();
        let published = Published { note, namespace, name, count: 1, used: Instant::now() };
        self.series().remember(key, published);
        Ok(())
    }
}

/// The longest message kept (events.k8s.io/v1 caps `note` at 1 kB, and the core/v1 view of
/// an event is converted to it: a longer message would be cut there anyway).
pub const MAX_NOTE_BYTES: usize = 1024;

/// A note the API server accepts: one longer than [`MAX_NOTE_BYTES`] is cut on a character
/// boundary and ends in `...` (as client-go does), instead of the whole event being refused
/// (a long cloud error would otherwise leave no event at all).
pub fn truncate_note(note: String) -> String {
    if note.len() <= MAX_NOTE_BYTES {
        return note;
    }
    let mut end = MAX_NOTE_BYTES - 3;
    while !note.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &note[..end])
}

/// Publishes an event about `obj` (reason and message as upstream; `action`, e.g.
/// `InitializeNode`, is the event's `action`, which upstream's controllers leave empty). Errors
/// are logged and swallowed.
pub async fn publish<K: Resource<DynamicType = ()>>(
    recorder: &EventRecorder,
    obj: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let reference = obj.object_ref(&());
    let object = format!(
        "{}/{}/{}/{}",
        reference.kind.as_deref().unwrap_or_default(),
        reference.namespace.as_deref().unwrap_or_default(),
        reference.name.as_deref().unwrap_or_default(),
        reference.uid.as_deref().unwrap_or_default()
    );
    let note = truncate_note(note);
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = recorder.record(object, &ev, &reference).await {
        let name = obj.meta().name.as_deref().unwrap_or_default();
        tracing::warn!(object = name, reason, error = %e, "failed to record event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(object: &str) -> (String, String, String) {
        (object.to_string(), "SyncLoadBalancerFailed".to_string(), "EnsureLoadBalancer".to_string())
    }

    fn published(note: &str, used: Instant) -> Published {
        let (namespace, name) = ("ns".to_string(), format!("ev-{note}"));
        Published { note: note.to_string(), namespace, name, count: 1, used }
    }

    #[test]
    fn the_same_message_within_six_minutes_is_a_repeat_a_different_or_later_one_is_not() {
        let mut series = Series::default();
        let now = Instant::now();
        series.remember(key("svc/a"), published("quota exceeded", now));
        let again = series.repeat_of(&key("svc/a"), "quota exceeded", now);
        assert_eq!(again.map(|p| p.name).as_deref(), Some("ev-quota exceeded"));
        assert!(series.repeat_of(&key("svc/a"), "subnet full", now).is_none());
        assert!(series.repeat_of(&key("svc/b"), "quota exceeded", now).is_none());
        let later = now + SERIES_TTL + Duration::from_secs(1);
        assert!(series.repeat_of(&key("svc/a"), "quota exceeded", later).is_none());
        assert!(series.by_key.is_empty(), "an expired series is forgotten");
    }

    #[test]
    fn at_most_max_series_are_kept_and_the_least_recently_used_goes_first() {
        let mut series = Series::default();
        let start = Instant::now();
        for i in 0..MAX_SERIES + 10 {
            let at = start + Duration::from_millis(i as u64);
            series.remember(key(&format!("node/{i}")), published("x", at));
        }
        assert_eq!(series.by_key.len(), MAX_SERIES);
        assert!(!series.by_key.contains_key(&key("node/0")), "the oldest went");
        assert!(series.by_key.contains_key(&key(&format!("node/{}", MAX_SERIES + 9))));
    }

    #[test]
    fn a_note_longer_than_the_api_allows_is_cut_on_a_character_boundary() {
        let short = "SyncLoadBalancerFailed: boom".to_string();
        assert_eq!(truncate_note(short.clone()), short);
        let long = "é".repeat(700); // 1400 bytes
        let cut = truncate_note(long);
        assert!(cut.len() <= MAX_NOTE_BYTES, "{}", cut.len());
        assert!(cut.ends_with("..."));
        assert!(cut.trim_end_matches("...").chars().all(|c| c == 'é'));
    }
}
