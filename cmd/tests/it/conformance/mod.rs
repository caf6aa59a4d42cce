//! The conformance suite (issue 12): one list of scenarios, written once here, run against
//! every provider's real `cloud-controller-manager-<cloud>` binary through a small
//! per-provider [`Harness`] (`aws.rs`: moto behind the fault proxy; `vsphere.rs`: vcsim
//! behind the fault proxy).
//!
//! A harness starts the emulator with a world (instances), puts the fault proxy
//! (`ccm_emulators`) in front of it, writes that provider's cloud config pointing at the
//! proxy, and acts on the world ("power off instance X", "delete instance X"); the proxy's
//! admin API does "fail every call" and throttling. Each scenario starts its own control
//! plane (the lifecycle controller acts on every Node of a cluster) and asserts only what a
//! cluster user sees: Node fields, Service status, and the emulator's own state.
//!
//! Every scenario records a row (provider, scenario, pass / fail / n/a, seconds) in
//! `$CCM_CONFORMANCE_RESULTS` (when set); `ci/conformance` runs the suite and prints the
//! matrix. A capability upstream's CCM for that cloud also lacks (vSphere load balancers and
//! routes) is "n/a"; anything else missing is a failure.
//!
//! Test names are `conformance::<provider>::<scenario>`: `cargo test -- --skip conformance`
//! leaves the suite to `ci/conformance`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use ccm_core::names;
use ccm_emulators::{Admin, Counters, Fault, FaultRule, PauseMode};
use ccm_testbed::fixtures::{kubelet_node, load_balancer_service};
use k8s_openapi::api::core::v1::{Event, Namespace, Node, Service, ServicePort};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};

use crate::support::{Binary, Ccm, Env, addresses, has_taint, label, provider_id};

#[cfg(all(feature = "provider-aws", feature = "testing"))]
mod aws;
#[cfg(feature = "provider-azure")]
mod azure;
#[cfg(feature = "provider-gcp")]
mod gcp;
#[cfg(feature = "provider-ibm")]
pub(crate) mod ibm;
#[cfg(any(
    feature = "provider-aws",
    feature = "provider-azure",
    feature = "provider-gcp",
    feature = "provider-ibm",
    feature = "provider-openstack",
    feature = "provider-vsphere"
))]
pub(crate) mod metrics;
#[cfg(feature = "provider-openstack")]
mod openstack;
#[cfg(feature = "provider-vsphere")]
mod vsphere;

/// Deadline of every wait: generous, so a loaded machine does not fail a scenario (a
/// failure is "never happened", not "too slow").
const WAIT: Duration = Duration::from_secs(240);

/// How long the cloud is down in the outage scenario: the first half every call hangs, the
/// second half every call fails.
const OUTAGE: Duration = Duration::from_secs(120);

/// One world instance as the provider reports it, and the Node a kubelet registers for it.
#[derive(Debug, Clone)]
pub struct Instance {
    /// The Node name the kubelet registers.
    pub node: String,
    /// The address the kubelet reports (InternalIP).
    pub ip: String,
    /// The cloud's instance ID (as routes and load balancers name it).
    pub id: String,
    /// The providerID the CCM must set.
    pub provider_id: String,
    /// The addresses the CCM must set, in order.
    pub addresses: Vec<(String, String)>,
    pub zone: String,
    pub region: String,
    /// The instance-type label must start with this (vSphere's carries the VM's sizes).
    pub instance_type_prefix: String,
}

/// A load balancer of the cluster as the emulator holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LbView {
    /// Front-end ports, sorted.
    pub ports: Vec<i32>,
    /// Back-end instance IDs, sorted.
    pub instances: Vec<String>,
}

/// One hostile try of the `tenant_isolation` scenario: what a Service in another namespace
/// sets to name a resource that is not its own.
#[derive(Debug, Clone, Default)]
pub struct Attack {
    /// What it tries, for the failure message.
    pub what: String,
    /// Annotations of the attacker's Service.
    pub annotations: Vec<(String, String)>,
    /// Its `spec.loadBalancerIP`.
    pub load_balancer_ip: Option<String>,
}

impl Attack {
    /// An attack setting `annotations` (key, value pairs).
    pub fn annotations(what: impl Into<String>, annotations: &[(&str, &str)]) -> Attack {
        Attack {
            what: what.into(),
            annotations: annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            load_balancer_ip: None,
        }
    }

    /// An attack asking for `ip` as `spec.loadBalancerIP`.
    pub fn load_balancer_ip(what: impl Into<String>, ip: &str) -> Attack {
        Attack { what: what.into(), annotations: Vec::new(), load_balancer_ip: Some(ip.into()) }
    }
}

/// The resources a harness planted for the `tenant_isolation` scenario: what the attacker
/// may name, and the addresses it must never report as its own.
#[derive(Debug, Clone, Default)]
pub struct Foreign {
    /// Addresses (IPs, hostnames) an attacker must never report: those of the foreign load
    /// balancers and of addresses another cluster owns. (An unattached address reserved by
    /// hand is not among them: a Service naming it may use it, never change or delete it.)
    pub addresses: Vec<String>,
    /// Free-form values the harness' attacks use (IDs, names), by key.
    pub ids: BTreeMap<String, String>,
}

impl Foreign {
    /// The value planted under `key` (a harness bug when missing).
    pub fn id(&self, key: &str) -> &str {
        self.ids.get(key).map(String::as_str).unwrap_or_else(|| panic!("no foreign {key}"))
    }
}

/// What a provider's conformance harness does. One value per scenario run: the emulator
/// (with its world), the fault proxy in front of it, and the world's instances.
#[allow(async_fn_in_trait)]
pub trait Harness: Sized {
    /// The provider's name in the matrix.
    const PROVIDER: &'static str;
    /// The manager binary.
    const BINARY: Binary;
    /// Whether upstream's CCM for this cloud has load balancers / routes (else "n/a").
    const LOAD_BALANCERS: bool;
    const ROUTES: bool;

    /// Starts the emulator with a world of at least `count` instances and the proxy.
    async fn start(count: usize) -> Self;
    /// The world's instances.
    fn instances(&self) -> &[Instance];
    /// The cloud config, pointing at the proxy.
    fn cloud_config(&self) -> String;
    /// Extra manager flags (`routes`: the route controller on, with a cluster CIDR).
    fn args(&self, routes: bool) -> Vec<String>;
    /// Environment variables the manager needs that depend on the run (e.g. the emulator's
    /// CA for a cloud served over HTTPS).
    fn env(&self) -> Vec<(String, String)> {
        Vec::new()
    }
    /// The proxy's admin API (faults, pause, counters).
    fn admin(&self) -> Admin;
    /// Stops (powers off) instance `i`, directly in the emulator.
    async fn power_off(&self, i: usize);
    /// Starts (powers on) instance `i` again.
    async fn power_on(&self, i: usize);
    /// Deletes (terminates) instance `i`.
    async fn delete(&self, i: usize);
    /// The load balancer named `name` in the emulator's state.
    async fn load_balancer(&self, _name: &str) -> Option<LbView> {
        None
    }
    /// Every load-balancer resource of the cluster left in the emulator's state (load
    /// balancers, listeners, target groups, their security groups), one line each.
    async fn load_balancer_resources(&self) -> Vec<String> {
        Vec::new()
    }
    /// The routes of the cluster's route table: (destination CIDR, target instance ID).
    async fn routes(&self) -> Vec<(String, String)> {
        Vec::new()
    }

    /// `tenant_isolation`: creates, directly in the cloud (its API, not the manager), the
    /// load-balancer resources of ANOTHER cluster and of NO cluster, as that cluster's
    /// manager or a person would have made them (names, tags, descriptions).
    async fn plant_foreign(&self) -> Foreign {
        Foreign::default()
    }
    /// `tenant_isolation`: every annotation value (and `loadBalancerIP`) naming an existing
    /// resource that is not the attacker's: the victim's (its Service `victim`, with status,
    /// and its load balancer named `victim_lb` by the suite's default name) and `foreign`'s.
    async fn attacks(
        &self,
        _victim: &Service,
        _victim_lb: &str,
        _foreign: &Foreign,
    ) -> Vec<Attack> {
        Vec::new()
    }
    /// `tenant_isolation`: the cloud's load-balancer state, one entry per object (a load
    /// balancer, listener, pool, member, address, security group…), key → canonical text
    /// of the whole object as the emulator holds it. Objects are compared byte for byte.
    async fn lb_snapshot(&self) -> BTreeMap<String, String> {
        BTreeMap::new()
    }

    /// `not_found`: the operation globs of the provider's instance lookups (what the proxy
    /// answers with its 404s).
    const INSTANCE_LOOKUPS: &'static [&'static str];
    /// `not_found`: the 404 answers a proxy or a wrong endpoint in front of the cloud gives
    /// for instance `inst`'s lookups, none of them the cloud's typed not-found answer.
    fn not_found_pages(&self, inst: &Instance) -> Vec<(&'static str, Fault)> {
        proxy_not_found_pages(inst)
    }
    /// `not_found`: rules installed before the 404s, for a provider that asks for one
    /// instance only when a listing lacks it (IBM: the listing is stale, then the by-ID
    /// lookup meets the proxy's 404).
    fn not_found_setup(&self) -> Vec<FaultRule> {
        Vec::new()
    }

    /// `slow_cloud`: makes the cloud as slow as the real one (an async cloud: its emulator's
    /// `realistic` timing profile, [`realistic_profile`]; AWS: the fault proxy's latency) and
    /// returns the longest single cloud-side step it now takes, which bounds the scenario's
    /// waits. None: n/a (no load balancers).
    async fn slow_cloud(&self) -> Option<Duration> {
        None
    }
}

/// How long the slowest cloud-side step (one long-running operation) of the `slow_cloud`
/// scenario takes: the cloud's realistic profile is scaled so its longest action lasts this.
/// The scaling keeps the cloud's proportions (a create minutes long, a change seconds) and the
/// whole scenario within about two minutes.
pub const SLOW_STEP: Duration = Duration::from_secs(8);

/// How many slowest steps one wait of `slow_cloud` allows for on top of [`WAIT`]: a load
/// balancer's create, change or delete is a few operations in sequence, plus the service
/// controller's retries while one is pending.
const SLOW_STEPS_PER_WAIT: u32 = 12;

/// `slow_cloud` for an emulator of the kit: selects its `realistic` timing profile scaled so
/// the longest action takes [`SLOW_STEP`], and returns that. The emulator must report its
/// realistic table (`AsyncOps::set_realistic`, `Cloud::async_ops`).
pub async fn realistic_profile(admin: &Admin, provider: &str) -> Duration {
    let report = admin.timing_report().await.unwrap();
    let table: ccm_emulators::Timing = report
        .realistic
        .unwrap_or_else(|| {
            panic!(
                "{provider} slow_cloud: the emulator reports no realistic timing table \
                 (AsyncOps::set_realistic and Cloud::async_ops): {report:?}"
            )
        })
        .into();
    let longest = table.create.max(table.update).max(table.delete);
    assert!(!longest.is_zero(), "{provider} slow_cloud: a realistic table of zeros: {report:?}");
    let scale = (SLOW_STEP.as_secs_f64() / longest.as_secs_f64()).min(1.0);
    admin.set_timing(ccm_emulators::TimingProfile::Realistic, scale).await.unwrap();
    let t = table.scaled(scale);
    eprintln!(
        "{provider} slow_cloud: realistic timing × {scale:.3}: create {:?}, update {:?}, delete {:?}",
        t.create, t.update, t.delete
    );
    t.create.max(t.update).max(t.delete)
}

/// The 404s of something in front of the cloud: an Apache-style HTML page echoing the
/// instance (its ID and name in the URL it could not find), a gateway's generic JSON, a Go
/// mux's plain text, and an empty body.
pub fn proxy_not_found_pages(inst: &Instance) -> Vec<(&'static str, Fault)> {
    let (id, node) = (&inst.id, &inst.node);
    let html = format!(
        "<!DOCTYPE HTML PUBLIC \"-//IETF//DTD HTML 2.0//EN\">\n<html><head>\n\
         <title>404 Not Found</title>\n</head><body>\n<h1>Not Found</h1>\n\
         <p>The requested URL /instances/{id}?name={node} was not found on this \
         server.</p>\n<hr>\n\
         <address>Apache/2.4.57 (Debian) Server at cloud.example Port 443</address>\n\
         </body></html>\n"
    );
    vec![
        (
            "Apache HTML 404 echoing the instance",
            Fault::Page {
                status: 404,
                content_type: Some("text/html; charset=iso-8859-1".into()),
                body: html,
            },
        ),
        (
            "a wrong endpoint's generic JSON 404",
            Fault::Page {
                status: 404,
                content_type: Some("application/json; charset=utf-8".into()),
                body: format!(
                    "{{\"message\":\"no Route matched with those values\",\
                     \"path\":\"/servers/{id}\",\"code\":404}}"
                ),
            },
        ),
        (
            "a wrong endpoint's plain-text 404",
            Fault::Page {
                status: 404,
                content_type: Some("text/plain; charset=utf-8".into()),
                body: format!("404 page not found: {id}\n"),
            },
        ),
        (
            "a 404 with an empty body",
            Fault::Page { status: 404, content_type: None, body: String::new() },
        ),
    ]
}

/// The outcome of one scenario.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    Pass,
    NotApplicable,
}

/// Records the row of one scenario: pass / n/a when finished, fail when dropped by a panic.
struct Row {
    provider: &'static str,
    scenario: &'static str,
    start: Instant,
}

impl Row {
    fn write(&self, outcome: &str) {
        let secs = self.start.elapsed().as_secs_f64();
        eprintln!("conformance: {} {} {outcome} {secs:.1}s", self.provider, self.scenario);
        if let Some(dir) = std::env::var_os("CCM_CONFORMANCE_RESULTS") {
            let dir = std::path::PathBuf::from(dir);
            let _ = std::fs::create_dir_all(&dir);
            let line = format!("{}\t{}\t{outcome}\t{secs:.1}\n", self.provider, self.scenario);
            let _ = std::fs::write(dir.join(format!("{}.{}", self.provider, self.scenario)), line);
        }
    }
}

impl Drop for Row {
    fn drop(&mut self) {
        if std::thread::panicking() {
            self.write("fail");
        }
    }
}

/// Runs one scenario against provider `H` and records its row.
pub async fn run<H: Harness>(scenario: &'static str) {
    let row = Row { provider: H::PROVIDER, scenario, start: Instant::now() };
    let outcome = match scenario {
        "join" => join::<H>().await,
        "shutdown" => shutdown::<H>().await,
        "terminate" => terminate::<H>().await,
        "outage" => outage::<H>().await,
        "throttling" => throttling::<H>().await,
        "load_balancer" => load_balancer::<H>().await,
        "routes" => routes::<H>().await,
        "tenant_isolation" => tenant_isolation::<H>().await,
        "not_found" => not_found::<H>().await,
        "slow_cloud" => slow_cloud::<H>().await,
        other => panic!("unknown scenario {other}"),
    };
    row.write(match outcome {
        Outcome::Pass => "pass",
        Outcome::NotApplicable => "n/a",
    });
}

/// The scenario list, written once: one test per scenario for the harness `$h`.
macro_rules! scenarios {
    ($h:ty) => {
        $crate::conformance::scenarios!($h; join shutdown terminate outage throttling load_balancer routes tenant_isolation not_found slow_cloud);
    };
    ($h:ty; $($name:ident)*) => {
        $(
            #[tokio::test]
            async fn $name() {
                $crate::conformance::run::<$h>(stringify!($name)).await;
            }
        )*
    };
}
pub(crate) use scenarios;

/// A harness, a control plane and the manager.
struct Cluster<H> {
    // Dropped in this order: the manager (its drop scans its log for secrets) before the
    // environment that holds the log.
    ccm: Ccm,
    env: Env,
    h: H,
}

impl<H: Harness> Cluster<H> {
    async fn start(count: usize, routes: bool) -> Cluster<H> {
        let h = H::start(count).await;
        let env = Env::start(H::BINARY).await;
        let ccm = env.spawn_ccm_with_env(&h.cloud_config(), &h.args(routes), &h.env());
        Cluster { h, env, ccm }
    }

    fn nodes(&self) -> Api<Node> {
        self.env.nodes()
    }

    fn services(&self) -> Api<Service> {
        Api::namespaced(self.env.client.clone(), "default")
    }

    fn inst(&self, i: usize) -> &Instance {
        &self.h.instances()[i]
    }

    /// Registers instance `i`'s Node as its kubelet would, with Ready = `ready`.
    async fn register(&self, i: usize, ready: &str) {
        let inst = self.inst(i);
        self.nodes()
            .create(&PostParams::default(), &kubelet_node(&inst.node, &inst.ip, ready))
            .await
            .unwrap();
    }

    /// Waits until `f` holds, naming `what` (and the manager log) if it never does.
    async fn wait<T, F, Fut>(&self, what: &str, f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        self.wait_up_to(WAIT, what, f).await
    }

    /// [`Cluster::wait`] with its own bound.
    async fn wait_up_to<T, F, Fut>(&self, bound: Duration, what: &str, f: F) -> T
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        let logs = &self.ccm;
        let res = tokio::time::timeout(bound, ccm_testbed::wait_for(what, bound * 2, f)).await;
        match res {
            Ok(v) => v,
            Err(_) => panic!(
                "{} conformance: timed out after {bound:?} waiting for {what}; manager log:\n{}",
                H::PROVIDER,
                tail(&logs.logs(), 60)
            ),
        }
    }

    /// Waits until instance `i`'s Node is initialised and returns it.
    async fn initialised(&self, i: usize) -> Node {
        let name = self.inst(i).node.clone();
        let nodes = self.nodes();
        self.wait(&format!("node {name} to be initialised"), || async {
            let n = nodes.get(&name).await.ok()?;
            (!has_taint(&n, names::TAINT_UNINITIALIZED) && provider_id(&n).is_some()).then_some(n)
        })
        .await
    }

    /// Sets the Node's Ready condition, as its kubelet would.
    async fn set_ready(&self, i: usize, ready: &str) {
        let patch = serde_json::json!({"status": {"conditions": [{
            "type": "Ready", "status": ready,
            "reason": if ready == "True" { "KubeletReady" } else { "KubeletNotReady" },
        }]}});
        self.nodes()
            .patch_status(&self.inst(i).node, &PatchParams::default(), &Patch::Strategic(&patch))
            .await
            .unwrap();
    }

    async fn node_exists(&self, i: usize) -> bool {
        self.nodes().get_opt(&self.inst(i).node).await.unwrap().is_some()
    }

    /// Creates `type: LoadBalancer` Service `name` and waits for its ingress in its status.
    async fn create_lb_service(&self, name: &str, port: i32) -> Service {
        let svc = self
            .services()
            .create(&PostParams::default(), &load_balancer_service("default", name, port))
            .await
            .unwrap();
        let services = self.services();
        self.wait(&format!("Service {name}'s load-balancer ingress"), || ingress(&services, name))
            .await;
        svc
    }

    /// The emulator's counters, read through the proxy's admin API.
    async fn counters(&self) -> Counters {
        self.h.admin().counters().await.unwrap()
    }
}

fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

async fn ingress(services: &Api<Service>, name: &str) -> Option<String> {
    let s = services.get(name).await.ok()?;
    let i = s.status?.load_balancer?.ingress?.into_iter().next()?;
    i.hostname.or(i.ip)
}

/// What the CCM must have set on an initialised Node of `inst`.
fn assert_initialised(n: &Node, inst: &Instance, provider: &str) {
    let name = &inst.node;
    assert_eq!(provider_id(n), Some(inst.provider_id.as_str()), "{provider} {name}: providerID");
    assert_eq!(addresses(n), inst.addresses, "{provider} {name}: addresses");
    for (key, want) in [
        (names::LABEL_ZONE, &inst.zone),
        (names::LABEL_ZONE_BETA, &inst.zone),
        (names::LABEL_REGION, &inst.region),
        (names::LABEL_REGION_BETA, &inst.region),
    ] {
        assert_eq!(label(n, key), Some(want.as_str()), "{provider} {name}: label {key}");
    }
    for key in [names::LABEL_INSTANCE_TYPE, names::LABEL_INSTANCE_TYPE_BETA] {
        let got = label(n, key).unwrap_or_default();
        assert!(
            got.starts_with(&inst.instance_type_prefix),
            "{provider} {name}: label {key} = {got:?}, want {:?}…",
            inst.instance_type_prefix
        );
    }
    assert!(!has_taint(n, names::TAINT_UNINITIALIZED), "{provider} {name}: uninitialized taint");
}

/// join: providerID, addresses, zone/region/instance-type labels (GA and beta), the
/// uninitialized taint removed.
async fn join<H: Harness>() -> Outcome {
    let c = Cluster::<H>::start(2, false).await;
    let _logs = c.env.cp.log_guard();
    for i in 0..2 {
        c.register(i, "True").await;
    }
    for i in 0..2 {
        let n = c.initialised(i).await;
        assert_initialised(&n, c.inst(i), H::PROVIDER);
    }
    Outcome::Pass
}

/// shutdown: a NotReady Node whose instance is powered off gets the shutdown taint; when the
/// instance runs again and its kubelet posts Ready, the taint goes.
async fn shutdown<H: Harness>() -> Outcome {
    let c = Cluster::<H>::start(2, false).await;
    let _logs = c.env.cp.log_guard();
    c.register(0, "True").await;
    c.register(1, "False").await;
    c.initialised(0).await;
    c.initialised(1).await;
    c.h.power_off(1).await;
    let nodes = c.nodes();
    let name = c.inst(1).node.clone();
    let n = c
        .wait("the shutdown taint", || async {
            let n = nodes.get(&name).await.ok()?;
            has_taint(&n, names::TAINT_SHUTDOWN).then_some(n)
        })
        .await;
    let taints = n.spec.and_then(|s| s.taints).unwrap_or_default();
    let taint = taints.iter().find(|t| t.key == names::TAINT_SHUTDOWN).unwrap();
    assert_eq!(taint.effect, "NoSchedule");
    assert!(c.node_exists(1).await, "a shut-down instance's Node is kept");
    assert!(!has_taint(&nodes.get(&c.inst(0).node).await.unwrap(), names::TAINT_SHUTDOWN));

    c.h.power_on(1).await;
    c.set_ready(1, "True").await;
    c.wait("the shutdown taint to be removed", || async {
        let n = nodes.get(&name).await.ok()?;
        (!has_taint(&n, names::TAINT_SHUTDOWN)).then_some(())
    })
    .await;
    assert!(c.node_exists(1).await);
    Outcome::Pass
}

/// terminate: a NotReady Node whose instance is deleted is deleted; the others stay.
async fn terminate<H: Harness>() -> Outcome {
    let c = Cluster::<H>::start(2, false).await;
    let _logs = c.env.cp.log_guard();
    c.register(0, "True").await;
    c.register(1, "False").await;
    c.initialised(0).await;
    c.initialised(1).await;
    c.h.delete(1).await;
    c.wait("the deleted instance's Node to be deleted", || async {
        (!c.node_exists(1).await).then_some(())
    })
    .await;
    assert!(c.node_exists(0).await, "the healthy Node was deleted");
    Outcome::Pass
}

/// outage: every call hangs (first half) or fails (second half) for [`OUTAGE`]: no Node is
/// deleted, no load balancer changes, and a Node registered during the outage is initialised
/// after it.
async fn outage<H: Harness>() -> Outcome {
    let c = Cluster::<H>::start(3, false).await;
    let _logs = c.env.cp.log_guard();
    // NotReady nodes: the lifecycle controller asks the cloud about them every second.
    c.register(0, "False").await;
    c.register(1, "True").await;
    c.initialised(0).await;
    c.initialised(1).await;
    let lb_name = if H::LOAD_BALANCERS {
        let svc = c.create_lb_service("outage", 80).await;
        Some(ccm_core::cloud::default_load_balancer_name(&svc))
    } else {
        None
    };
    let lb_before = match &lb_name {
        Some(n) => {
            let name = n.clone();
            // Wait for the back ends to settle (both Ready nodes known to the LB).
            Some(
                c.wait("the load balancer to settle", || async {
                    c.h.load_balancer(&name).await.filter(|v| !v.instances.is_empty())
                })
                .await,
            )
        }
        None => None,
    };
    let resources_before = c.h.load_balancer_resources().await;

    let admin = c.h.admin();
    let before = c.counters().await;
    admin.pause(PauseMode::Hang).await.unwrap();
    let started = Instant::now();
    c.register(2, "True").await;
    let nodes = c.nodes();
    let mut switched = false;
    while started.elapsed() < OUTAGE {
        if !switched && started.elapsed() >= OUTAGE / 2 {
            admin.pause(PauseMode::Fail).await.unwrap();
            switched = true;
        }
        for i in 0..2 {
            assert!(c.node_exists(i).await, "Node {} deleted during the outage", c.inst(i).node);
        }
        let late = nodes.get(&c.inst(2).node).await.unwrap();
        assert!(has_taint(&late, names::TAINT_UNINITIALIZED), "initialised without a cloud?");
        tokio::time::sleep(Duration::from_secs(2)).await;
    }
    let during = c.counters().await;
    admin.resume().await.unwrap();
    assert!(
        during.faulted > before.faulted,
        "the manager did call the cloud during the outage: {during:?}"
    );

    let n = c.initialised(2).await;
    assert_initialised(&n, c.inst(2), H::PROVIDER);
    for i in 0..2 {
        assert!(c.node_exists(i).await, "Node {} deleted after the outage", c.inst(i).node);
    }
    if let (Some(name), Some(before)) = (&lb_name, &lb_before) {
        // The LB's node set may grow by the late node once the cloud is back; nothing else.
        // That update may be under way (IBM: `update_pending`, not readable as a whole): wait
        // for a settled view. A load balancer deleted by the outage never shows one.
        let after = c
            .wait("the load balancer, settled, after the outage", || async {
                c.h.load_balancer(name).await
            })
            .await;
        assert_eq!(after.ports, before.ports, "load balancer ports changed");
        for id in &before.instances {
            assert!(after.instances.contains(id), "back end {id} removed: {after:?}");
        }
        let resources_after = c.h.load_balancer_resources().await;
        let names = |r: &[String]| {
            r.iter()
                .map(|l| l.split('|').next().unwrap_or_default().to_string())
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names(&resources_after),
            names(&resources_before),
            "load-balancer resources changed"
        );
    }
    eprintln!(
        "{} outage: {} calls during the outage, {} of them failed or hung",
        H::PROVIDER,
        during.total - before.total,
        during.faulted - before.faulted
    );
    Outcome::Pass
}

/// The throttling workload: `count` Nodes join and (where the cloud has them) a LoadBalancer
/// Service gets its load balancer. Returns the cluster, still running, once everything
/// converged, with the counters read at that moment.
async fn converge<H: Harness>(count: usize, storm: bool) -> (Cluster<H>, Counters) {
    let h = H::start(count).await;
    if storm {
        // The first call, then half of all calls at random, answered with the cloud's
        // throttling error and a Retry-After. The first one is certain: IBM's whole workload
        // is six calls, and a coin thrown six times came up "not throttled" every time once
        // in CI (1 in 64), failing the scenario on a storm that never happened.
        let throttle = Fault::Throttle { retry_after_secs: 1 };
        h.admin().inject(FaultRule::new("*", throttle.clone()).times(1)).await.unwrap();
        h.admin().inject(FaultRule::new("*", throttle).probability(0.5)).await.unwrap();
    }
    let env = Env::start(H::BINARY).await;
    let ccm = env.spawn_ccm_with_env(&h.cloud_config(), &h.args(false), &h.env());
    let c = Cluster { h, env, ccm };
    let _logs = c.env.cp.log_guard();
    for i in 0..count {
        c.register(i, "True").await;
    }
    for i in 0..count {
        let n = c.initialised(i).await;
        assert_initialised(&n, c.inst(i), H::PROVIDER);
    }
    if H::LOAD_BALANCERS {
        let svc = c.create_lb_service("storm", 80).await;
        let name = ccm_core::cloud::default_load_balancer_name(&svc);
        let ids: Vec<String> = {
            let mut v: Vec<String> =
                c.h.instances()[..count].iter().map(|i| i.id.clone()).collect();
            v.sort();
            v
        };
        c.wait("every node behind the load balancer", || async {
            c.h.load_balancer(&name).await.filter(|v| v.instances == ids)
        })
        .await;
    }
    drop(_logs);
    let at = c.counters().await;
    (c, at)
}

/// throttling storm: half of all calls throttled; everything converges, and the work the
/// cloud answered is no more than 2× that of a clean run of the same workload plus one redo (measured in the
/// same test, concurrently).
///
/// Work, not time: both runs are counted once the slower (the storm) has converged, and the
/// operations the clean run, already converged, kept calling meanwhile are periodic (node
/// syncs, lifecycle passes, token refreshes): their calls grow with the time the storm took,
/// not with the workload, so they are left out of both counts. What is compared is the calls
/// of the other operations (the workload's instance lookups and load-balancer reads and
/// mutations) that the cloud answered (a throttled attempt is not work done). Under machine
/// load the storm once took 235 s and its periodic calls alone broke a bound on all calls
/// (GCP: 35 `compute.instances.list` vs 4).
///
/// One redo of the workload is allowed on top (the bound is 3× the clean run's work): with
/// half of all calls throttled at random and 5 attempts per call, one call in 32 is throttled
/// on every attempt and fails its sync, which the controllers then redo from the start (GCP's
/// ensure, as upstream's, releases the address it reserved and begins again: about one clean
/// workload of calls). CI saw it once (GCP: 72 answered vs 29, one `forwardingRules.insert`
/// throttled five times); the runs without such a call stay at 1.0-1.3×.
///
/// The bound still catches throttling that multiplies calls: a client that does not retry
/// throttled calls never gets near it (every throttled call a redo), and the scenario prints
/// how many extra answered calls per throttled workload call would break it.
async fn throttling<H: Harness>() -> Outcome {
    const COUNT: usize = 3;
    let ((clean, clean_at), (storm, _)) =
        tokio::join!(converge::<H>(COUNT, false), converge::<H>(COUNT, true));
    let (clean, storm) = tokio::join!(clean.counters(), storm.counters());
    let periodic: BTreeSet<&str> = clean
        .operations
        .iter()
        .filter(|(op, n)| **n > clean_at.get(op))
        .map(|(op, _)| op.as_str())
        .collect();
    let work = |c: &Counters| -> u64 {
        c.operations
            .keys()
            .filter(|op| !periodic.contains(op.as_str()))
            .map(|op| c.answered(op))
            .sum()
    };
    let throttled_work: u64 = storm
        .faulted_operations
        .iter()
        .filter(|(op, _)| !periodic.contains(op.as_str()))
        .map(|(_, n)| n)
        .sum();
    let (clean_work, storm_work) = (work(&clean), work(&storm));
    eprintln!(
        "{} throttling: clean run {} calls ({} of the workload); storm {} calls, {} throttled, \
         {} of the workload answered; periodic operations left out: {periodic:?}",
        H::PROVIDER,
        clean.total,
        clean_work,
        storm.total,
        storm.faulted,
        storm_work
    );
    let ops: BTreeSet<&String> = clean.operations.keys().chain(storm.operations.keys()).collect();
    for op in ops {
        eprintln!(
            "{} throttling: {op}: clean {} storm {} ({} answered)",
            H::PROVIDER,
            clean.get(op),
            storm.get(op),
            storm.answered(op)
        );
    }
    assert!(storm.faulted > 0, "the storm throttled nothing: {storm:?}");
    assert!(clean_work > 0, "no workload calls in the clean run: {clean:?}");
    assert!(
        storm_work <= 3 * clean_work,
        "{storm_work} answered workload calls under throttling vs {clean_work} in a clean run \
         (bound: 2× plus one redo; periodic operations left out: {periodic:?})\nclean: \
         {clean:?}\nstorm: {storm:?}"
    );
    // How many extra answered calls per throttled one a client would need to break the
    // bound: printed, not asserted (a storm that happens to throttle few calls must not fail
    // the scenario).
    let room = (3 * clean_work + 1).saturating_sub(storm_work);
    let needed = if throttled_work == 0 { u64::MAX } else { room.div_ceil(throttled_work) };
    eprintln!(
        "{} throttling: a client answering every throttled workload call with {needed} more \
         answered call(s) would break the bound ({throttled_work} throttled)",
        H::PROVIDER
    );
    Outcome::Pass
}

fn ports(svc: &Service) -> Vec<ServicePort> {
    svc.spec.as_ref().and_then(|s| s.ports.clone()).unwrap_or_default()
}

/// load balancer lifecycle: create, change ports, add and remove a node, delete; afterwards
/// the emulator holds no load-balancer resource of the cluster.
async fn load_balancer<H: Harness>() -> Outcome {
    if !H::LOAD_BALANCERS {
        return Outcome::NotApplicable;
    }
    let c = Cluster::<H>::start(3, false).await;
    let _logs = c.env.cp.log_guard();
    for i in 0..2 {
        c.register(i, "True").await;
    }
    for i in 0..2 {
        c.initialised(i).await;
    }
    let ids = |n: usize| {
        let mut v: Vec<String> = c.h.instances()[..n].iter().map(|i| i.id.clone()).collect();
        v.sort();
        v
    };
    let svc = c.create_lb_service("web", 80).await;
    let name = ccm_core::cloud::default_load_balancer_name(&svc);
    let two = ids(2);
    c.wait("a load balancer on port 80 with both nodes", || async {
        c.h.load_balancer(&name).await.filter(|v| v.ports == [80] && v.instances == two)
    })
    .await;

    // Change ports: 80 → 8080 plus 443.
    let mut new_ports = ports(&svc);
    new_ports[0].port = 8080;
    new_ports[0].name = Some("http".into());
    new_ports.push(ServicePort {
        name: Some("https".into()),
        port: 443,
        protocol: Some("TCP".into()),
        ..Default::default()
    });
    let patch = serde_json::json!({"spec": {"ports": new_ports}});
    c.services().patch("web", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    c.wait("the load balancer's ports to follow the Service", || async {
        c.h.load_balancer(&name).await.filter(|v| v.ports == [443, 8080])
    })
    .await;

    // Add a node.
    c.register(2, "True").await;
    c.initialised(2).await;
    let three = ids(3);
    c.wait("the new node behind the load balancer", || async {
        c.h.load_balancer(&name).await.filter(|v| v.instances == three)
    })
    .await;

    // Remove a node.
    c.nodes().delete(&c.inst(0).node, &DeleteParams::default()).await.unwrap();
    let mut rest = ids(3);
    rest.retain(|id| *id != c.inst(0).id);
    c.wait("the removed node out of the load balancer", || async {
        c.h.load_balancer(&name).await.filter(|v| v.instances == rest)
    })
    .await;

    // Delete: the Service goes once the cloud side is gone, and nothing of it is left.
    c.services().delete("web", &DeleteParams::default()).await.unwrap();
    let services = c.services();
    c.wait("the Service to be gone", || async {
        services.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    let left = c.h.load_balancer_resources().await;
    assert!(left.is_empty(), "load-balancer resources left in the emulator: {left:#?}");
    Outcome::Pass
}

/// slow_cloud: the load-balancer lifecycle (create, change ports, delete) on a cloud as slow
/// as the real one ([`Harness::slow_cloud`]: the emulator's realistic timing profile scaled so
/// its longest operation takes [`SLOW_STEP`]). Passes when the Service gets its address, the
/// port change reaches the cloud and deleting the Service leaves nothing of the cluster's.
/// Every wait is bounded from the profile ([`WAIT`] plus [`SLOW_STEPS_PER_WAIT`] slowest
/// steps); nothing asserts a duration.
async fn slow_cloud<H: Harness>() -> Outcome {
    if !H::LOAD_BALANCERS {
        return Outcome::NotApplicable;
    }
    let c = Cluster::<H>::start(2, false).await;
    let _logs = c.env.cp.log_guard();
    let Some(step) = c.h.slow_cloud().await else {
        return Outcome::NotApplicable;
    };
    let bound = WAIT + step * SLOW_STEPS_PER_WAIT;
    for i in 0..2 {
        c.register(i, "True").await;
    }
    for i in 0..2 {
        c.initialised(i).await;
    }
    let two = {
        let mut v: Vec<String> = c.h.instances()[..2].iter().map(|i| i.id.clone()).collect();
        v.sort();
        v
    };

    let svc = c
        .services()
        .create(&PostParams::default(), &load_balancer_service("default", "slow", 80))
        .await
        .unwrap();
    let name = ccm_core::cloud::default_load_balancer_name(&svc);
    let services = c.services();
    let address = c
        .wait_up_to(bound, "the Service's load-balancer address", || ingress(&services, "slow"))
        .await;
    c.wait_up_to(bound, "a load balancer on port 80 with both nodes", || async {
        c.h.load_balancer(&name).await.filter(|v| v.ports == [80] && v.instances == two)
    })
    .await;

    // Change: 80 → 8080 plus 443.
    let mut new_ports = ports(&svc);
    new_ports[0].port = 8080;
    new_ports[0].name = Some("http".into());
    new_ports.push(ServicePort {
        name: Some("https".into()),
        port: 443,
        protocol: Some("TCP".into()),
        ..Default::default()
    });
    let patch = serde_json::json!({"spec": {"ports": new_ports}});
    c.services().patch("slow", &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
    c.wait_up_to(bound, "the load balancer's ports to follow the Service", || async {
        c.h.load_balancer(&name).await.filter(|v| v.ports == [443, 8080] && v.instances == two)
    })
    .await;
    let kept = ingress(&services, "slow").await;
    assert_eq!(kept.as_deref(), Some(address.as_str()), "the address changed with the ports");

    // Delete: the Service goes, then nothing of the cluster's is left in the cloud (a
    // delete the cloud is still running may take its time: wait for it, bounded).
    c.services().delete("slow", &DeleteParams::default()).await.unwrap();
    c.wait_up_to(bound, "the Service to be gone", || async {
        services.get_opt("slow").await.unwrap().is_none().then_some(())
    })
    .await;
    let left = tokio::time::timeout(bound, async {
        loop {
            let left = c.h.load_balancer_resources().await;
            if left.is_empty() {
                return left;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
    })
    .await;
    if left.is_err() {
        let left = c.h.load_balancer_resources().await;
        panic!(
            "{} slow_cloud: load-balancer resources left {bound:?} after the Service went: \
             {left:#?}\nmanager log:\n{}",
            H::PROVIDER,
            tail(&c.ccm.logs(), 60)
        );
    }
    Outcome::Pass
}

/// routes: a Node's pod CIDR gets a route to its instance; deleting the Node removes it.
async fn routes<H: Harness>() -> Outcome {
    if !H::ROUTES {
        return Outcome::NotApplicable;
    }
    let c = Cluster::<H>::start(2, true).await;
    let _logs = c.env.cp.log_guard();
    for (i, cidr) in [(0, "100.64.1.0/24"), (1, "100.64.2.0/24")] {
        let inst = c.inst(i);
        let mut node = kubelet_node(&inst.node, &inst.ip, "True");
        let spec = node.spec.as_mut().unwrap();
        spec.pod_cidr = Some(cidr.into());
        spec.pod_cidrs = Some(vec![cidr.into()]);
        c.nodes().create(&PostParams::default(), &node).await.unwrap();
    }
    let want: Vec<(String, String)> = vec![
        ("100.64.1.0/24".into(), c.inst(0).id.clone()),
        ("100.64.2.0/24".into(), c.inst(1).id.clone()),
    ];
    c.wait("a route per node", || async {
        let r = c.h.routes().await;
        want.iter().all(|w| r.contains(w)).then_some(())
    })
    .await;
    c.nodes().delete(&c.inst(0).node, &DeleteParams::default()).await.unwrap();
    c.wait("the deleted node's route to go", || async {
        let r = c.h.routes().await;
        (!r.iter().any(|(cidr, _)| cidr == "100.64.1.0/24") && r.contains(&want[1])).then_some(())
    })
    .await;
    Outcome::Pass
}

/// How long the `tenant_isolation` scenario waits for the manager to act on one step of an
/// attack (create, update, delete) before going on: the check is the cloud's state, so a
/// step the manager is slow on only makes the attack weaker, never the scenario fail.
const ATTACK_STEP: Duration = Duration::from_secs(45);

/// Load-balancer Events of the Service with this UID: how many times the manager finished a
/// pass on it (ensured, updated, or failed), counting each Event's repeats (`count`).
async fn lb_passes(events: &Api<Event>, uid: &str) -> u64 {
    let Ok(list) = events.list(&ListParams::default()).await else {
        return 0;
    };
    list.items
        .iter()
        .filter(|e| e.involved_object.uid.as_deref() == Some(uid))
        .filter(|e| {
            matches!(
                e.reason.as_deref(),
                Some(
                    names::reasons::ENSURED_LOAD_BALANCER
                        | names::reasons::SYNC_LOAD_BALANCER_FAILED
                        | names::reasons::UPDATED_LOAD_BALANCER
                        | names::reasons::UPDATE_LOAD_BALANCER_FAILED
                        | names::reasons::DELETED_LOAD_BALANCER
                        | names::reasons::DELETE_LOAD_BALANCER_FAILED
                )
            )
        })
        .map(|e| e.count.map_or(1, |c| c.max(1) as u64))
        .sum()
}

/// Every address a Service's status reports.
fn status_addresses(svc: &Service) -> Vec<String> {
    svc.status
        .as_ref()
        .and_then(|s| s.load_balancer.as_ref())
        .and_then(|l| l.ingress.as_ref())
        .into_iter()
        .flatten()
        .flat_map(|i| i.ip.iter().chain(i.hostname.iter()).cloned())
        .collect()
}

/// The entries of `before` that `after` lost or changed, as a readable list.
fn snapshot_diff(before: &BTreeMap<String, String>, after: &BTreeMap<String, String>) -> String {
    let mut out = String::new();
    for (k, v) in before {
        match after.get(k) {
            None => out.push_str(&format!("  DELETED {k}\n    was: {v}\n")),
            Some(a) if a != v => {
                out.push_str(&format!("  CHANGED {k}\n    was: {v}\n    now: {a}\n"))
            }
            Some(_) => {}
        }
    }
    out
}

async fn create_namespace(env: &Env, name: &str) {
    let ns: Namespace =
        serde_json::from_value(serde_json::json!({"metadata": {"name": name}})).unwrap();
    Api::<Namespace>::all(env.client.clone()).create(&PostParams::default(), &ns).await.unwrap();
}

/// tenant_isolation (issue 29): a Service in another namespace names, by annotation or
/// `loadBalancerIP`, the victim's load-balancer resources and those of another cluster and of
/// no cluster, and is created, updated and deleted once per such value. Afterwards every
/// one of those cloud objects is byte for byte what it was, the victim Service keeps its
/// address, and the attacker never reported the victim's or a foreign address.
async fn tenant_isolation<H: Harness>() -> Outcome {
    if !H::LOAD_BALANCERS {
        return Outcome::NotApplicable;
    }
    let c = Cluster::<H>::start(2, false).await;
    let _logs = c.env.cp.log_guard();
    for i in 0..2 {
        c.register(i, "True").await;
    }
    for i in 0..2 {
        c.initialised(i).await;
    }
    let (victim_ns, attacker_ns) = ("tenant-a", "tenant-b");
    create_namespace(&c.env, victim_ns).await;
    create_namespace(&c.env, attacker_ns).await;
    let victims: Api<Service> = Api::namespaced(c.env.client.clone(), victim_ns);
    let attackers: Api<Service> = Api::namespaced(c.env.client.clone(), attacker_ns);
    let events: Api<Event> = Api::namespaced(c.env.client.clone(), attacker_ns);

    victims
        .create(&PostParams::default(), &load_balancer_service(victim_ns, "victim", 443))
        .await
        .unwrap();
    let victim_addr =
        c.wait("the victim's load-balancer ingress", || ingress(&victims, "victim")).await;
    let victim = victims.get("victim").await.unwrap();
    let victim_lb = ccm_core::cloud::default_load_balancer_name(&victim);
    let mut ids: Vec<String> = c.h.instances()[..2].iter().map(|i| i.id.clone()).collect();
    ids.sort();
    c.wait("the victim's load balancer with both nodes", || async {
        c.h.load_balancer(&victim_lb).await.filter(|v| v.instances == ids)
    })
    .await;
    let foreign = c.h.plant_foreign().await;
    let mut forbidden: BTreeSet<String> = foreign.addresses.iter().cloned().collect();
    forbidden.extend(status_addresses(&victim));
    // A settled view: two snapshots a few seconds apart agree.
    let before = c
        .wait("a settled snapshot of the cloud's load-balancer state", || async {
            let a = c.h.lb_snapshot().await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let b = c.h.lb_snapshot().await;
            (a == b).then_some(b)
        })
        .await;
    assert!(!before.is_empty(), "{}: the load-balancer snapshot is empty", H::PROVIDER);
    let attacks = c.h.attacks(&victim, &victim_lb, &foreign).await;
    assert!(!attacks.is_empty(), "{}: no attacks defined", H::PROVIDER);
    eprintln!(
        "{} tenant_isolation: {} attacks against {} snapshot objects; forbidden addresses {forbidden:?}",
        H::PROVIDER,
        attacks.len(),
        before.len()
    );

    // The attacks run side by side (each its own Service), each create → update → delete.
    let run_attack = |n: usize, attack: Attack| {
        let attackers = attackers.clone();
        let events = events.clone();
        let forbidden = forbidden.clone();
        async move {
            let name = format!("attack-{n}");
            let mut svc = load_balancer_service(attacker_ns, &name, 443);
            svc.metadata.annotations = Some(attack.annotations.iter().cloned().collect());
            if let Some(ip) = &attack.load_balancer_ip {
                svc.spec.as_mut().unwrap().load_balancer_ip = Some(ip.clone());
            }
            let created = attackers.create(&PostParams::default(), &svc).await.unwrap();
            let uid = created.metadata.uid.clone().unwrap_or_default();
            let mut seen: BTreeSet<String> = BTreeSet::new();
            let mut notes = Vec::new();
            // Waits until the manager finished one more pass on the Service (or the step's
            // bound), recording every address the attacker's status reports meanwhile.
            let mut step = async |what: &str, after: u64, seen: &mut BTreeSet<String>| {
                let start = Instant::now();
                loop {
                    if let Ok(s) = attackers.get(&name).await {
                        seen.extend(status_addresses(&s));
                    }
                    let passes = lb_passes(&events, &uid).await;
                    if passes > after {
                        return passes;
                    }
                    if start.elapsed() > ATTACK_STEP {
                        notes
                            .push(format!("{what}: no load-balancer Event within {ATTACK_STEP:?}"));
                        return passes;
                    }
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
            };
            let passes = step("create", 0, &mut seen).await;
            let patch = serde_json::json!({
                "metadata": {"labels": {"conformance-step": "update"}},
                "spec": {"ports": [{"port": 8443, "protocol": "TCP"}]},
            });
            attackers.patch(&name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
            step("update", passes, &mut seen).await;
            attackers.delete(&name, &DeleteParams::default()).await.unwrap();
            let start = Instant::now();
            let mut freed = false;
            loop {
                match attackers.get_opt(&name).await.unwrap() {
                    None => break,
                    Some(s) => seen.extend(status_addresses(&s)),
                }
                if !freed && start.elapsed() > ATTACK_STEP {
                    freed = true;
                    // The manager did not let it go (a deletion it refuses): free it, so the
                    // scenario can end; the cloud's state is the check.
                    notes.push(format!("delete: still there after {ATTACK_STEP:?}"));
                    let p = serde_json::json!({"metadata": {"finalizers": null}});
                    let _ =
                        attackers.patch(&name, &PatchParams::default(), &Patch::Merge(&p)).await;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            let stolen: Vec<&String> = seen.intersection(&forbidden).collect();
            let report = format!(
                "{name} ({}): reported {seen:?}{}",
                attack.what,
                if notes.is_empty() { String::new() } else { format!("; {}", notes.join("; ")) }
            );
            (report, stolen.into_iter().cloned().collect::<Vec<String>>())
        }
    };
    let started = Instant::now();
    let results = futures::future::join_all(
        attacks.iter().cloned().enumerate().map(|(n, a)| run_attack(n, a)),
    )
    .await;
    for (report, _) in &results {
        eprintln!("{} tenant_isolation: {report}", H::PROVIDER);
    }
    eprintln!(
        "{} tenant_isolation: attacks took {:.1}s",
        H::PROVIDER,
        started.elapsed().as_secs_f64()
    );

    let after = c.h.lb_snapshot().await;
    let diff = snapshot_diff(&before, &after);
    let stolen: Vec<&String> =
        results.iter().filter(|(_, s)| !s.is_empty()).map(|(r, _)| r).collect();
    let still = ingress(&victims, "victim").await;
    assert!(
        diff.is_empty() && stolen.is_empty() && still.as_deref() == Some(victim_addr.as_str()),
        "{} tenant_isolation: the attacks reached the victim's or foreign resources\n\
         cloud objects deleted or changed:\n{}\nattackers reporting a victim's or foreign address: {stolen:#?}\n\
         victim's address {victim_addr:?}, now {still:?}\nattacks:\n{}\nmanager log:\n{}",
        H::PROVIDER,
        if diff.is_empty() { "  (none)\n".to_string() } else { diff },
        results.iter().map(|(r, _)| format!("  {r}")).collect::<Vec<_>>().join("\n"),
        tail(&c.ccm.logs(), 80)
    );
    Outcome::Pass
}

/// not_found (issue 29): a NotReady Node whose instance exists, while something in front of
/// the cloud answers its instance lookups with 404s that are not the cloud's typed
/// not-found answer (an HTML page echoing the instance, a wrong endpoint's JSON or text, an
/// empty body), is neither deleted nor changed; once the answers are right again it is
/// still there and initialised.
async fn not_found<H: Harness>() -> Outcome {
    /// Node-monitor periods (1 s each) per kind of 404.
    const PHASE: Duration = Duration::from_secs(8);
    let c = Cluster::<H>::start(2, false).await;
    let _logs = c.env.cp.log_guard();
    c.register(0, "True").await;
    c.register(1, "False").await;
    c.initialised(0).await;
    let before = c.initialised(1).await;
    let fields =
        |n: &Node| (provider_id(n).map(str::to_string), addresses(n), n.metadata.labels.clone());
    let want = fields(&before);
    let admin = c.h.admin();
    let nodes = c.nodes();
    let name = c.inst(1).node.clone();
    for (what, fault) in c.h.not_found_pages(c.inst(1)) {
        let faulted_before = c.counters().await.faulted;
        for rule in c.h.not_found_setup() {
            admin.inject(rule).await.unwrap();
        }
        for op in H::INSTANCE_LOOKUPS {
            admin.inject(FaultRule::new(*op, fault.clone())).await.unwrap();
        }
        let start = Instant::now();
        while start.elapsed() < PHASE {
            let n = nodes.get_opt(&name).await.unwrap();
            let Some(n) = n else {
                panic!(
                    "{} not_found: Node {name} deleted while its instance exists ({what}); manager log:\n{}",
                    H::PROVIDER,
                    tail(&c.ccm.logs(), 60)
                );
            };
            assert_eq!(fields(&n), want, "{} not_found: Node {name} changed ({what})", H::PROVIDER);
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        let faulted = c.counters().await.faulted - faulted_before;
        admin.clear_faults().await.unwrap();
        assert!(
            faulted > 0,
            "{} not_found: the manager made no instance lookup matching {:?} in {PHASE:?} ({what})",
            H::PROVIDER,
            H::INSTANCE_LOOKUPS
        );
        eprintln!("{} not_found: {what}: {faulted} lookups answered 404, Node kept", H::PROVIDER);
    }
    // The cloud answers again: a few periods later the Node is there, as it was.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let n = nodes.get_opt(&name).await.unwrap();
    let n = n
        .unwrap_or_else(|| panic!("{} not_found: Node {name} deleted after the 404s", H::PROVIDER));
    assert_initialised(&n, c.inst(1), H::PROVIDER);
    assert_eq!(fields(&n), want, "{} not_found: Node {name} changed", H::PROVIDER);
    assert!(c.node_exists(0).await);
    Outcome::Pass
}
