//! `ibm-lb` benchmark (issue #33 item 11), run by `ci/bench-ibm-lb` (ignored in normal test
//! runs; it prints figures and asserts nothing about time).
//!
//! World: the testbed's real kube-apiserver, the IBM emulator on its `realistic` timing
//! profile (create 240 s, update 45 s, delete 180 s) scaled by `IBM_BENCH_SCALE` (default
//! 0.05: create 12 s), the core service controller with `IBM_BENCH_WORKERS` workers (default
//! 1, upstream's `--concurrent-service-syncs`) on this provider, and `IBM_BENCH_N` (default
//! 10) `type: LoadBalancer` Services created at once. Measured from the creation: when each
//! Service got its hostname, when every load balancer is `active`, then, after deleting them
//! all, when every Service is gone (finalizer removed) and every load balancer is gone; the
//! VPC calls of the whole run.
//!
//! Two managers on identical worlds: `ours` (this provider) and `before` (the same provider
//! behind a wrapper that waits inside each call until the load balancer is `active`, or gone,
//! as the provider did before this change; only the waiting differs).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ccm_core::cloud::{CloudProvider, LoadBalancer, ProviderError};
use ccm_emulators::asyncop::TimingProfile;
use ccm_emulators::ibm::IbmOptions;
use ccm_provider_ibm::load_balancer::{IbmLoadBalancer, Timings};
use ccm_testbed::fixtures::load_balancer_service;
use ccm_testbed::{ControlPlane, unique_name};
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use tokio::time::Instant;

use crate::controller::{delete_nodes, group_nodes, hostname, lbs, namespace, start_controller};
use crate::fixture::start_with;

fn env<T: std::str::FromStr>(key: &str, default: T) -> T {
    std::env::var(key).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
}

/// The provider as it was: every call waits until its load balancer is settled.
struct Blocking(Arc<IbmLoadBalancer>);

impl Blocking {
    /// Polls every 5 s (the former provider's interval) until the load balancer is not
    /// pending: `active`, `failed` or gone.
    async fn settled(&self, name: &str) -> Result<(), ProviderError> {
        loop {
            let all = self.0.client().list_load_balancers().await?;
            match all.iter().find(|l| l.name == name) {
                None => return Ok(()),
                Some(l) if l.is_active() || l.provisioning_status == "failed" => return Ok(()),
                Some(_) => tokio::time::sleep(Duration::from_secs(5)).await,
            }
        }
    }
}

#[async_trait]
impl LoadBalancer for Blocking {
    async fn get_load_balancer(
        &self,
        c: &str,
        s: &Service,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        self.0.get_load_balancer(c, s).await
    }
    fn load_balancer_name(&self, c: &str, s: &Service) -> String {
        self.0.load_balancer_name(c, s)
    }
    async fn ensure_load_balancer(
        &self,
        c: &str,
        s: &Service,
        n: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        let name = self.0.load_balancer_name(c, s);
        loop {
            match self.0.ensure_load_balancer(c, s, n).await {
                Ok(status) => {
                    self.settled(&name).await?;
                    return Ok(status);
                }
                Err(ProviderError::RetryAfter { .. }) => self.settled(&name).await?,
                Err(e) => return Err(e),
            }
        }
    }
    async fn update_load_balancer(
        &self,
        c: &str,
        s: &Service,
        n: &[Node],
    ) -> Result<(), ProviderError> {
        self.ensure_load_balancer(c, s, n).await.map(|_| ())
    }
    async fn ensure_load_balancer_deleted(
        &self,
        c: &str,
        s: &Service,
    ) -> Result<(), ProviderError> {
        let name = self.0.load_balancer_name(c, s);
        loop {
            match self.0.ensure_load_balancer_deleted(c, s).await {
                Ok(()) => return Ok(()),
                Err(ProviderError::RetryAfter { .. }) => self.settled(&name).await?,
                Err(e) => return Err(e),
            }
        }
    }
}

struct BlockingCloud(Arc<Blocking>);

impl CloudProvider for BlockingCloud {
    fn name(&self) -> &str {
        "ibm"
    }
    fn load_balancer(&self) -> Option<Arc<dyn LoadBalancer>> {
        Some(self.0.clone())
    }
}

fn secs(d: Duration) -> String {
    format!("{:.1}", d.as_secs_f64())
}

async fn run(label: &str, n: usize, scale: f64, workers: usize) -> BTreeMap<String, String> {
    let cp = ControlPlane::shared().await.unwrap();
    let client = cp.admin_client().await.unwrap();
    let f =
        start_with(IbmOptions::default(), ccm_provider_ibm::client::ClientOptions::default()).await;
    f.server.admin().set_timing(TimingProfile::Realistic, scale).await.unwrap();
    let provider = crate::fixture::provider_with_timings(&f, Timings::default());
    let cloud: Arc<dyn CloudProvider> = if label == "before" {
        Arc::new(BlockingCloud(Arc::new(Blocking(provider.ibm_load_balancer().clone()))))
    } else {
        Arc::new(provider)
    };
    let ns = namespace(&client, "ibm-bench").await;
    let group = unique_name("bench");
    let nodes = group_nodes(&client, &group, &[("10.240.0.4", "us-south-1")]).await;
    let stop = start_controller(&client, cloud, &ns, &group, workers);
    let services: Api<Service> = Api::namespaced(client.clone(), &ns);
    let before = f.server.counters();

    let t0 = Instant::now();
    for i in 0..n {
        let svc = load_balancer_service(&ns, &format!("web-{i}"), 8000 + i as i32);
        services.create(&PostParams::default(), &svc).await.unwrap();
    }
    let mut got: BTreeMap<String, Duration> = BTreeMap::new();
    let mut all_active = None;
    let limit = Duration::from_secs_f64(240.0 * scale * n as f64 * 2.0 + 120.0);
    while (got.len() < n || all_active.is_none()) && t0.elapsed() < limit {
        for s in services.list(&Default::default()).await.unwrap().items {
            let name = s.metadata.name.clone().unwrap_or_default();
            if hostname(&s).is_some() {
                got.entry(name).or_insert_with(|| t0.elapsed());
            }
        }
        if all_active.is_none() {
            let l = lbs(&f).await;
            if l.len() == n && l.iter().all(|l| l["provisioning_status"] == "active") {
                all_active = Some(t0.elapsed());
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let mut times: Vec<Duration> = got.values().copied().collect();
    times.sort();
    let created_calls = f.server.counters().get("vpc.load_balancers.create");

    let t1 = Instant::now();
    for i in 0..n {
        services.delete(&format!("web-{i}"), &DeleteParams::default()).await.unwrap();
    }
    let mut services_gone = None;
    let mut lbs_gone = None;
    while (services_gone.is_none() || lbs_gone.is_none()) && t1.elapsed() < limit {
        if services_gone.is_none()
            && services.list(&Default::default()).await.unwrap().items.is_empty()
        {
            services_gone = Some(t1.elapsed());
        }
        if lbs_gone.is_none() && lbs(&f).await.is_empty() {
            lbs_gone = Some(t1.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.cancel();
    delete_nodes(&client, &nodes).await;
    let after = f.server.counters();
    let calls: u64 = after
        .operations
        .iter()
        .filter(|(op, _)| op.starts_with("vpc."))
        .map(|(op, c)| c - before.get(op))
        .sum();
    let report = f.server.admin().timing_report().await.unwrap();
    let create_s = report.realistic.map(|r| r.create_ms as f64 * scale / 1000.0).unwrap_or(0.0);
    let opt = |d: Option<Duration>| d.map(secs).unwrap_or_else(|| "not reached".into());
    BTreeMap::from([
        ("manager".into(), label.into()),
        ("N".into(), n.to_string()),
        ("workers".into(), workers.to_string()),
        ("scale".into(), scale.to_string()),
        ("one create (s)".into(), format!("{create_s:.1}")),
        ("hostnames".into(), format!("{}/{n}", times.len())),
        ("first hostname (s)".into(), opt(times.first().copied())),
        ("p50 hostname (s)".into(), opt(times.get(times.len() / 2).copied())),
        ("all hostnames (s)".into(), opt((times.len() == n).then(|| times[n - 1]))),
        ("all active (s)".into(), opt(all_active)),
        ("all Services gone after delete (s)".into(), opt(services_gone)),
        ("all load balancers gone (s)".into(), opt(lbs_gone)),
        ("creates".into(), created_calls.to_string()),
        ("VPC calls".into(), calls.to_string()),
    ])
}

/// `IBM_BENCH_MANAGERS=ours,before IBM_BENCH_N=10 IBM_BENCH_SCALE=0.05 IBM_BENCH_WORKERS=1`.
#[tokio::test]
#[ignore = "benchmark: run by ci/bench-ibm-lb"]
async fn ibm_lb_bench() {
    let n: usize = env("IBM_BENCH_N", 10);
    let scale: f64 = env("IBM_BENCH_SCALE", 0.05);
    let workers: usize = env("IBM_BENCH_WORKERS", 1);
    let managers: String = env("IBM_BENCH_MANAGERS", "ours,before".to_string());
    for label in managers.split(',').filter(|m| !m.is_empty()) {
        let r = run(label, n, scale, workers).await;
        println!("IBM-LB-BENCH {}", serde_json::to_string(&r).unwrap());
        for (k, v) in &r {
            println!("  {k}: {v}");
        }
    }
}
