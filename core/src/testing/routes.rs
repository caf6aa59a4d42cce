//! A scripted cloud route table with call counts, observed parallelism, fault injection and
//! latency.

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use async_trait::async_trait;

use crate::cloud::{ProviderError, Route, Routes};

/// Counts of route calls, by method.
#[derive(Debug, Default)]
pub struct RouteCalls {
    /// `list_routes`.
    pub list: AtomicUsize,
    /// `create_route`.
    pub create: AtomicUsize,
    /// `delete_route`.
    pub delete: AtomicUsize,
    /// Calls in progress now.
    pub in_flight: AtomicUsize,
    /// Most calls ever in progress at once.
    pub max_in_flight: AtomicUsize,
}

/// How route calls fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RouteFault {
    /// Every call fails.
    Unavailable,
    /// Only `create_route` fails.
    CreateFails,
}

/// The scripted route table.
#[derive(Debug, Default)]
pub struct TestRoutes {
    routes: Mutex<Vec<Route>>,
    fault: Mutex<Option<RouteFault>>,
    latency: Mutex<Duration>,
    next: AtomicUsize,
    /// Call counts.
    pub calls: RouteCalls,
}

struct InFlight<'a>(&'a RouteCalls);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl TestRoutes {
    /// An empty route table.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a route as if someone else created it (its name is kept).
    pub fn insert(&self, route: Route) {
        self.lock().push(route);
    }

    /// The current route table.
    pub fn routes(&self) -> Vec<Route> {
        self.lock().clone()
    }

    /// Makes calls fail (or succeed again with `None`).
    pub fn set_fault(&self, fault: Option<RouteFault>) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = fault;
    }

    /// Adds latency to every call.
    pub fn set_latency(&self, latency: Duration) {
        *self.latency.lock().unwrap_or_else(|p| p.into_inner()) = latency;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Route>> {
        self.routes.lock().unwrap_or_else(|p| p.into_inner())
    }

    async fn request(&self, creating: bool) -> Result<InFlight<'_>, ProviderError> {
        let now = self.calls.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let guard = InFlight(&self.calls);
        self.calls.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let latency = *self.latency.lock().unwrap_or_else(|p| p.into_inner());
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match *self.fault.lock().unwrap_or_else(|p| p.into_inner()) {
            Some(RouteFault::Unavailable) => {
                Err(ProviderError::other("test cloud: routes unavailable"))
            }
            Some(RouteFault::CreateFails) if creating => {
                Err(ProviderError::other("test cloud: route quota exceeded"))
            }
            _ => Ok(guard),
        }
    }
}

#[async_trait]
impl Routes for TestRoutes {
    async fn list_routes(&self, _cluster_name: &str) -> Result<Vec<Route>, ProviderError> {
        self.calls.list.fetch_add(1, Ordering::SeqCst);
        let _g = self.request(false).await?;
        Ok(self.routes())
    }

    async fn create_route(
        &self,
        _cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<(), ProviderError> {
        self.calls.create.fetch_add(1, Ordering::SeqCst);
        let _g = self.request(true).await?;
        let n = self.next.fetch_add(1, Ordering::SeqCst);
        let mut r = route.clone();
        r.name = format!("{name_hint}-{n}");
        r.blackhole = false;
        self.lock().push(r);
        Ok(())
    }

    async fn delete_route(&self, _cluster_name: &str, route: &Route) -> Result<(), ProviderError> {
        self.calls.delete.fetch_add(1, Ordering::SeqCst);
        let _g = self.request(false).await?;
        self.lock().retain(|r| r.name != route.name);
        Ok(())
    }
}
