//! Recording events on the objects the controllers act on, the same way for every controller:
//! a failure to record is logged, never fatal.
//!
//! [`EventRecorder`] folds repeats the way client-go's event correlator does: the *same*
//! message about the same object, reason and action becomes one event whose series count
//! grows; a *different* message is a new event. (kube-rs' `Recorder` alone folds by reason
//! and action only, so a second, different `SyncLoadBalancerFailed` would be hidden behind
//! the first one's text in `kubectl describe`.)

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// How long a message's series is remembered after its last use (kube-rs keeps a series
/// for 6 minutes).
const SERIES_TTL: Duration = Duration::from_secs(6 * 60);

/// (object, reason, action) → (the last message, the recorder holding its series, last use).
type Series = HashMap<(String, String, String), (String, Recorder, Instant)>;

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

    /// The kube-rs recorder that folds `note` about this object, reason and action.
    fn recorder_for(&self, object: String, reason: &str, action: &str, note: &str) -> Recorder {
        let now = Instant::now();
        let mut series = self.series.lock().unwrap_or_else(PoisonError::into_inner);
        series.retain(|_, (_, _, used)| now.duration_since(*used) < SERIES_TTL);
        let key = (object, reason.to_string(), action.to_string());
        match series.get_mut(&key) {
            Some((last, recorder, used)) if last == note => {
                *used = now;
                recorder.clone()
            }
            _ => {
                let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
                series.insert(key, (note.to_string(), recorder.clone(), now));
                recorder
            }
        }
    }
}

/// The longest note the API server accepts (events.k8s.io/v1 `note`: at most 1 kB).
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

/// Publishes an event about `obj` (reason and message as upstream; `action` is the
/// events.k8s.io action, e.g. `InitializeNode`). Errors are logged and swallowed.
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
    let kube_recorder = recorder.recorder_for(object, reason, action, &note);
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = kube_recorder.publish(&ev, &reference).await {
        let name = obj.meta().name.as_deref().unwrap_or_default();
        tracing::warn!(object = name, reason, error = %e, "failed to record event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
