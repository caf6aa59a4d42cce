//! Read-only views into a running controller's in-memory state, for tests and debugging.
//!
//! A controller started with a [`Probe`] in its options registers named gauges there (e.g.
//! how many Node versions its cache retains, which Nodes have a retry backoff). Nothing is
//! registered, and nothing costs anything, when no probe is given. Readers poll the gauges:
//! they are computed on demand from the controller's own structures.

use std::collections::BTreeMap;
use std::fmt;
use std::sync::{Arc, Mutex};

#[derive(Clone)]
enum Gauge {
    Count(Arc<dyn Fn() -> usize + Send + Sync>),
    Keys(Arc<dyn Fn() -> Vec<String> + Send + Sync>),
}

/// A set of named gauges a controller fills in when it starts. Cheap to clone (shared).
#[derive(Clone, Default)]
pub struct Probe {
    gauges: Arc<Mutex<BTreeMap<&'static str, Gauge>>>,
}

impl fmt::Debug for Probe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = self.lock().keys().copied().collect();
        f.debug_struct("Probe").field("gauges", &names).finish()
    }
}

impl Probe {
    /// An empty probe.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<&'static str, Gauge>> {
        self.gauges.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Registers (or replaces) the gauge `name`, a number.
    pub fn register_count(
        &self,
        name: &'static str,
        gauge: impl Fn() -> usize + Send + Sync + 'static,
    ) {
        self.lock().insert(name, Gauge::Count(Arc::new(gauge)));
    }

    /// Registers (or replaces) the gauge `name`, which lists the keys it currently holds.
    pub fn register_keys(
        &self,
        name: &'static str,
        gauge: impl Fn() -> Vec<String> + Send + Sync + 'static,
    ) {
        self.lock().insert(name, Gauge::Keys(Arc::new(gauge)));
    }

    /// The keys the gauge `name` holds now; `None` until the controller registered it (or
    /// when it is a count).
    pub fn keys(&self, name: &str) -> Option<Vec<String>> {
        match self.lock().get(name).cloned()? {
            Gauge::Keys(g) => Some(g()),
            Gauge::Count(_) => None,
        }
    }

    /// The value of the gauge `name` now (the number of keys for a key gauge); `None` until
    /// the controller registered it.
    pub fn count(&self, name: &str) -> Option<usize> {
        match self.lock().get(name).cloned()? {
            Gauge::Keys(g) => Some(g().len()),
            Gauge::Count(g) => Some(g()),
        }
    }
}
