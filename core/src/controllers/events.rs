//! Recording events on the objects the controllers act on, the same way for every controller:
//! a failure to record is logged, never fatal.

use kube::Resource;
use kube::runtime::events::{Event, EventType, Recorder};

/// Publishes an event about `obj` (reason and message as upstream; `action` is the
/// events.k8s.io action, e.g. `InitializeNode`). Errors are logged and swallowed.
pub async fn publish<K: Resource<DynamicType = ()>>(
    recorder: &Recorder,
    obj: &K,
    type_: EventType,
    reason: &str,
    action: &str,
    note: String,
) {
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &obj.object_ref(&())).await {
        let name = obj.meta().name.as_deref().unwrap_or_default();
        tracing::warn!(object = name, reason, error = %e, "failed to record event");
    }
}
