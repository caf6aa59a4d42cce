//! Scripted load balancers: an in-memory cloud LB table keyed by load balancer name, with
//! call counts, observed parallelism, injectable faults (including calls that never answer)
//! and latency.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};

use crate::cloud::{LoadBalancer, ProviderError, default_load_balancer_name};

/// One load balancer as the test cloud holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct ScriptedLoadBalancer {
    /// `namespace/name` of the Service it was created for.
    pub service: String,
    /// What `ensure` returned.
    pub status: LoadBalancerStatus,
    /// Backend node names, sorted.
    pub nodes: Vec<String>,
    /// Service ports (`spec.ports[*].port`), in order.
    pub ports: Vec<i32>,
    /// `ensure_load_balancer` calls that reached this load balancer.
    pub ensures: usize,
    /// `update_load_balancer` calls that reached this load balancer.
    pub updates: usize,
}

/// Counts of load balancer calls, by method.
#[derive(Debug, Default)]
pub struct LbCalls {
    /// `get_load_balancer`.
    pub get: AtomicUsize,
    /// `ensure_load_balancer`.
    pub ensure: AtomicUsize,
    /// `update_load_balancer`.
    pub update: AtomicUsize,
    /// `ensure_load_balancer_deleted`.
    pub delete: AtomicUsize,
    /// Calls in progress now.
    pub in_flight: AtomicUsize,
    /// Most calls ever in progress at once.
    pub max_in_flight: AtomicUsize,
    /// Calls that started hanging ([`LbFault::HangEnsure`]), in total.
    pub hung: AtomicUsize,
    /// Calls hanging now (a hanging call ends when the caller drops it, e.g. on its deadline).
    pub hanging: AtomicUsize,
}

/// How calls fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LbFault {
    /// Every call fails with a generic cloud error.
    Unavailable,
    /// Every call asks to be retried after this delay.
    RetryAfter(Duration),
    /// `ensure`/`update` say another controller owns the load balancer (other calls work).
    ImplementedElsewhere,
    /// `ensure` never answers: it waits until the caller gives up (other calls work).
    HangEnsure,
    /// Every call fails with this message.
    Failing(String),
}

/// The scripted load balancer capability.
#[derive(Debug, Default)]
pub struct TestLoadBalancers {
    lbs: Mutex<HashMap<String, ScriptedLoadBalancer>>,
    fault: Mutex<Option<LbFault>>,
    service_faults: Mutex<HashMap<String, LbFault>>,
    ensure_times: Mutex<Vec<Instant>>,
    latency: Mutex<Duration>,
    next_ip: AtomicUsize,
    /// Call counts.
    pub calls: LbCalls,
}

fn service_key(svc: &Service) -> String {
    format!(
        "{}/{}",
        svc.metadata.namespace.as_deref().unwrap_or_default(),
        svc.metadata.name.as_deref().unwrap_or_default()
    )
}

fn node_names(nodes: &[Node]) -> Vec<String> {
    let mut names: Vec<String> = nodes.iter().filter_map(|n| n.metadata.name.clone()).collect();
    names.sort();
    names
}

struct InFlight<'a>(&'a LbCalls);

struct Hanging<'a>(&'a LbCalls);

impl Drop for Hanging<'_> {
    fn drop(&mut self) {
        self.0.hanging.fetch_sub(1, Ordering::SeqCst);
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::SeqCst);
    }
}

impl TestLoadBalancers {
    /// An empty cloud.
    pub fn new() -> Self {
        Self::default()
    }

    /// Makes calls fail (or succeed again with `None`).
    pub fn set_fault(&self, fault: Option<LbFault>) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = fault;
    }

    /// Makes calls for the Service `namespace/name` fail (or succeed again with `None`); a
    /// fault set with [`Self::set_fault`] wins.
    pub fn set_service_fault(&self, namespace: &str, name: &str, fault: Option<LbFault>) {
        let key = format!("{namespace}/{name}");
        let mut faults = self.service_faults.lock().unwrap_or_else(|p| p.into_inner());
        match fault {
            Some(f) => faults.insert(key, f),
            None => faults.remove(&key),
        };
    }

    /// When each `ensure_load_balancer` call arrived, in order.
    pub fn ensure_times(&self) -> Vec<Instant> {
        self.ensure_times.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Adds latency to every call.
    pub fn set_latency(&self, latency: Duration) {
        *self.latency.lock().unwrap_or_else(|p| p.into_inner()) = latency;
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, ScriptedLoadBalancer>> {
        self.lbs.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The load balancer of the Service `namespace/name`, if one exists.
    pub fn for_service(&self, namespace: &str, name: &str) -> Option<ScriptedLoadBalancer> {
        let key = format!("{namespace}/{name}");
        self.lock().values().find(|lb| lb.service == key).cloned()
    }

    /// Every load balancer, by name.
    pub fn all(&self) -> HashMap<String, ScriptedLoadBalancer> {
        self.lock().clone()
    }

    fn fault_for(&self, svc: &Service) -> Option<LbFault> {
        self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone().or_else(|| {
            let faults = self.service_faults.lock().unwrap_or_else(|p| p.into_inner());
            faults.get(&service_key(svc)).cloned()
        })
    }

    /// One cloud request: tracks parallelism, waits the latency, applies the fault.
    async fn request(&self, svc: &Service, mutating: bool) -> Result<InFlight<'_>, ProviderError> {
        let now = self.calls.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        let guard = InFlight(&self.calls);
        self.calls.max_in_flight.fetch_max(now, Ordering::SeqCst);
        let latency = *self.latency.lock().unwrap_or_else(|p| p.into_inner());
        if !latency.is_zero() {
            tokio::time::sleep(latency).await;
        }
        match self.fault_for(svc) {
            None | Some(LbFault::HangEnsure) => Ok(guard),
            Some(LbFault::Unavailable) => {
                Err(ProviderError::other("test cloud: load balancer service unavailable"))
            }
            Some(LbFault::Failing(message)) => Err(ProviderError::other(message)),
            Some(LbFault::RetryAfter(delay)) => Err(ProviderError::RetryAfter {
                message: "test cloud: load balancer is still provisioning".into(),
                delay,
            }),
            Some(LbFault::ImplementedElsewhere) if mutating => {
                Err(ProviderError::ImplementedElsewhere)
            }
            Some(LbFault::ImplementedElsewhere) => Ok(guard),
        }
    }
}

#[async_trait]
impl LoadBalancer for TestLoadBalancers {
    async fn get_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        self.calls.get.fetch_add(1, Ordering::SeqCst);
        let _g = self.request(service, false).await?;
        Ok(self.lock().get(&default_load_balancer_name(service)).map(|lb| lb.status.clone()))
    }

    async fn ensure_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        self.calls.ensure.fetch_add(1, Ordering::SeqCst);
        self.ensure_times.lock().unwrap_or_else(|p| p.into_inner()).push(Instant::now());
        if self.fault_for(service) == Some(LbFault::HangEnsure) {
            self.calls.hung.fetch_add(1, Ordering::SeqCst);
            self.calls.hanging.fetch_add(1, Ordering::SeqCst);
            let _hanging = Hanging(&self.calls);
            std::future::pending::<()>().await;
        }
        let _g = self.request(service, true).await?;
        let ports = service
            .spec
            .as_ref()
            .and_then(|s| s.ports.as_ref())
            .map(|p| p.iter().map(|p| p.port).collect())
            .unwrap_or_default();
        let mut lbs = self.lock();
        let lb = lbs.entry(default_load_balancer_name(service)).or_insert_with(|| {
            let n = self.next_ip.fetch_add(1, Ordering::SeqCst);
            ScriptedLoadBalancer {
                service: service_key(service),
                status: LoadBalancerStatus {
                    ingress: Some(vec![LoadBalancerIngress {
                        ip: Some(format!("198.18.{}.{}", (n / 250) % 250, n % 250 + 1)),
                        ..Default::default()
                    }]),
                },
                nodes: Vec::new(),
                ports: Vec::new(),
                ensures: 0,
                updates: 0,
            }
        });
        lb.nodes = node_names(nodes);
        lb.ports = ports;
        lb.ensures += 1;
        Ok(lb.status.clone())
    }

    async fn update_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<(), ProviderError> {
        self.calls.update.fetch_add(1, Ordering::SeqCst);
        let _g = self.request(service, true).await?;
        match self.lock().get_mut(&default_load_balancer_name(service)) {
            Some(lb) => {
                lb.nodes = node_names(nodes);
                lb.updates += 1;
                Ok(())
            }
            None => Err(ProviderError::other(format!(
                "test cloud: no load balancer for service {}",
                service_key(service)
            ))),
        }
    }

    async fn ensure_load_balancer_deleted(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<(), ProviderError> {
        self.calls.delete.fetch_add(1, Ordering::SeqCst);
        let _g = self.request(service, false).await?;
        self.lock().remove(&default_load_balancer_name(service));
        Ok(())
    }
}
