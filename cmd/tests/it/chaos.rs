//! Chaos suite (issue #21), run by `ci/chaos` (ignored by a plain `cargo test`: each scenario
//! is long and prints a row of the chaos table). Every figure is counted in the emulator's state
//! (moto, through the AWS SDK) and in the API server, never read from the manager's logs.
//!
//! - leader killed mid-write: two replicas with leader election; a loop creates and deletes
//!   LoadBalancer Services (classic and NLB) while the leader is `kill -9`ed at random moments
//!   and restarted; after the loop every Service is deleted and the ELBs, NLBs, target groups
//!   and ELB security groups left in moto are leaks.
//! - cloud faults: moto behind the fault proxy; 5xx, throttling with Retry-After, hung calls,
//!   dropped connections and latency on 50 % of calls for the storm, while Nodes join and
//!   Services are created; counted: Nodes deleted (every instance is running: each deletion is
//!   wrong), Nodes still uninitialised and Services without a load balancer after the storm,
//!   calls per second.
//! - partial answers: DescribeInstances answers with an empty page or with the instance in a
//!   state no API documents; NotReady Nodes whose instances run must all survive.
//! - API server outage: kube-apiserver is killed for the outage (etcd keeps running) while the
//!   manager runs with Nodes (some NotReady) and load balancers; counted: cloud writes while
//!   it is down and after it is back (none is due), load balancer members changed, Nodes
//!   deleted, whether the manager is still running, and how long after the apiserver is back a
//!   new Node is initialised and a new Service gets its load balancer.
//!
//! Sizes come from the environment (`ci/chaos` sets them): `CHAOS_CYCLES` (default 50),
//! `CHAOS_STORM_SECS` (default 30), `CHAOS_NODES` (default 6), `CHAOS_SERVICES` (default 4),
//! `CHAOS_OUTAGE_SECS` (default 40), `CHAOS_CHURN_SECS` (default 0: no churn), `CHAOS_SEED`
//! (default: the clock). Each scenario prints one line
//! `CHAOS|<scenario>|<size>|<figures>|<PASS or FAIL>` that `ci/chaos` turns into the table.

/// What every cloud's scenarios share: sizes from the environment, the seeded random numbers,
/// the table row, polling, and the leader-election flags of the replicas.
#[cfg(any(all(feature = "provider-aws", feature = "testing"), feature = "provider-ibm"))]
mod kit {
    use std::time::{Duration, Instant};

    use k8s_openapi::api::core::v1::Service;
    use kube::Api;
    use kube::api::{DeleteParams, ListParams, PostParams};

    use crate::support::Ccm;

    /// Short leases so that a killed leader is replaced within seconds.
    pub const LEADER_ARGS: [&str; 4] = [
        "--leader-elect=true",
        "--leader-elect-lease-duration=4s",
        "--leader-elect-renew-deadline=3s",
        "--leader-elect-retry-period=1s",
    ];

    pub fn is_leader(ccm: &Ccm) -> bool {
        ccm.logs().contains("successfully acquired lease")
    }

    pub fn env_num(name: &str, default: u64) -> u64 {
        std::env::var(name).ok().and_then(|v| v.parse().ok()).unwrap_or(default)
    }

    /// xorshift64*: reproducible from `CHAOS_SEED` (printed), no dependency.
    pub struct Rng(u64);
    impl Rng {
        pub fn new() -> Rng {
            let seed = env_num(
                "CHAOS_SEED",
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_nanos() as u64)
                    .unwrap_or(1),
            );
            eprintln!("chaos seed {seed} (CHAOS_SEED={seed} repeats this run)");
            Rng(seed | 1)
        }
        fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        pub fn below(&mut self, n: u64) -> u64 {
            self.next_u64() % n.max(1)
        }
    }

    pub fn row(scenario: &str, size: &str, figures: &str, pass: bool) {
        println!("CHAOS|{scenario}|{size}|{figures}|{}", if pass { "PASS" } else { "FAIL" });
    }

    /// Polls `f` until it is true or `deadline` passes; whether it became true.
    pub async fn settle<F, Fut>(deadline: Duration, mut f: F) -> bool
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let start = Instant::now();
        loop {
            if f().await {
                return true;
            }
            if start.elapsed() > deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Whether the Service is a LoadBalancer (the `kubernetes` Service of `default` is not).
    pub fn is_lb(s: &Service) -> bool {
        s.spec.as_ref().and_then(|s| s.type_.as_deref()) == Some("LoadBalancer")
    }

    pub fn lb_services(items: &[Service]) -> usize {
        items.iter().filter(|s| is_lb(s)).count()
    }

    /// Waits (up to 180 s) until no LoadBalancer Service is left in the API (its finalizer
    /// is removed only once its load balancer is deleted); whether that happened.
    pub async fn lb_services_gone(services: &Api<Service>) -> bool {
        settle(Duration::from_secs(180), || async {
            services.list(&ListParams::default()).await.is_ok_and(|l| lb_services(&l.items) == 0)
        })
        .await
    }

    /// LoadBalancer Services still in the API (stuck: their finalizer was never removed).
    pub async fn lb_services_left(services: &Api<Service>) -> usize {
        services.list(&ListParams::default()).await.map(|l| lb_services(&l.items)).unwrap_or(0)
    }

    /// The leader-kill loop: each cycle creates LoadBalancer Service `lb-<cycle>` (from
    /// `service(name, cycle, rng)`), waits 0.2–1.7 s, deletes one of the live Services (often
    /// the one just created: mid-create), and in one cycle of three, at a random moment,
    /// `kill -9`s the current leader and starts a new replica (`spawn`) in its place. Then the
    /// Services still live are deleted. Returns the number of leaders killed.
    pub async fn create_and_delete_while_killing_leaders(
        services: &Api<Service>,
        rng: &mut Rng,
        cycles: u64,
        replicas: &mut Vec<Ccm>,
        spawn: impl Fn() -> Ccm,
        mut service: impl FnMut(&str, u64, &mut Rng) -> Service,
    ) -> usize {
        let mut kills = 0;
        let mut live: Vec<String> = Vec::new();
        for cycle in 0..cycles {
            let name = format!("lb-{cycle}");
            let svc = service(&name, cycle, rng);
            services.create(&PostParams::default(), &svc).await.unwrap();
            live.push(name);
            tokio::time::sleep(Duration::from_millis(200 + rng.below(1500))).await;
            if live.len() > 2 || rng.below(2) == 0 {
                let victim = live.remove(rng.below(live.len() as u64) as usize);
                let _ = services.delete(&victim, &DeleteParams::default()).await;
            }
            if rng.below(3) == 0 {
                tokio::time::sleep(Duration::from_millis(rng.below(1200))).await;
                if let Some(at) = replicas.iter().position(is_leader) {
                    drop(replicas.remove(at)); // SIGKILL, then its output is scanned
                    kills += 1;
                    replicas.push(spawn());
                }
            }
        }
        for name in live.drain(..) {
            let _ = services.delete(&name, &DeleteParams::default()).await;
        }
        kills
    }
}

/// Scenarios written once over the conformance suite's [`Harness`](crate::conformance::Harness)
/// (the emulator, its instances, its load-balancer resources), run for every cloud that has
/// one and load balancers. AWS keeps its own (classic and NLB at random, counted in moto).
#[cfg(feature = "provider-ibm")]
mod harness {
    use std::time::{Duration, Instant};

    use ccm_testbed::fixtures::load_balancer_service;
    use k8s_openapi::api::core::v1::Service;
    use kube::Api;

    use super::kit::{
        LEADER_ARGS, Rng, create_and_delete_while_killing_leaders, env_num, lb_services_gone,
        lb_services_left, row, settle,
    };
    use crate::conformance::Harness;
    use crate::support::{Env, initialised, register};

    /// Leader killed mid-write: two replicas with leader election; a loop creates and deletes
    /// LoadBalancer Services while the leader is `kill -9`ed at random moments and replaced;
    /// then every Service is deleted, and every load-balancer resource of the cluster left in
    /// the emulator's state is a leak.
    pub async fn leader_killed_mid_write<H: Harness>(cloud: &str) {
        let cycles = env_num("CHAOS_CYCLES", 50);
        let mut rng = Rng::new();
        let h = H::start(2).await;
        let env = Env::start(H::BINARY).await;
        let _logs = env.cp.log_guard();
        let config = h.cloud_config();
        let mut args = h.args(false);
        args.extend(LEADER_ARGS.iter().map(|a| a.to_string()));
        let mut replicas = vec![env.spawn_ccm(&config, &args), env.spawn_ccm(&config, &args)];
        let nodes = env.nodes();
        for i in &h.instances()[..2] {
            register(&nodes, &i.node, &i.ip, "True").await;
        }
        for i in &h.instances()[..2] {
            initialised(&nodes, &i.node).await;
        }

        let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
        let start = Instant::now();
        let kills = create_and_delete_while_killing_leaders(
            &services,
            &mut rng,
            cycles,
            &mut replicas,
            || env.spawn_ccm(&config, &args),
            |name, cycle, _| load_balancer_service("default", name, 80 + (cycle % 5) as i32),
        )
        .await;
        let loop_time = start.elapsed();
        // Settle: every Service gone, then nothing of the cluster left in the emulator.
        let gone = lb_services_gone(&services).await;
        let clean = settle(Duration::from_secs(120), || async {
            h.load_balancer_resources().await.is_empty()
        })
        .await;
        let leaked = h.load_balancer_resources().await;
        let left = lb_services_left(&services).await;
        let pass = gone && clean;
        row(
            &format!("leader killed mid-write ({cloud})"),
            &format!("{cycles} cycles, 2 replicas, {kills} kill -9"),
            &format!(
                "leaked: {} load balancers; Services stuck {left}; loop {:.0} s, settled {:.0} s",
                leaked.len(),
                loop_time.as_secs_f64(),
                start.elapsed().as_secs_f64() - loop_time.as_secs_f64()
            ),
            pass,
        );
        drop(replicas);
        assert!(pass, "leaked {leaked:?}; {left} Services stuck");
    }

    mod ibm {
        use crate::conformance::ibm::Ibm;

        #[tokio::test]
        #[ignore = "chaos suite: run by ci/chaos"]
        async fn chaos_leader_killed_mid_write_leaks_no_load_balancer() {
            super::leader_killed_mid_write::<Ibm>("ibm/emulator").await;
        }
    }
}

#[cfg(all(feature = "provider-aws", feature = "testing"))]
mod aws {
    use std::collections::BTreeSet;
    use std::time::{Duration, Instant};

    use ccm_emulators::{Fault, FaultProxy, FaultRule, Protocol};
    use ccm_provider_aws::testing::aws_sdk_ec2::types::Instance;
    use ccm_provider_aws::testing::{self, network, node_security_group, run_instances};
    use ccm_testbed::fixtures::load_balancer_service;
    use ccm_testbed::moto::Moto;
    use k8s_openapi::api::core::v1::{Node, Service};
    use kube::Api;
    use kube::api::{ListParams, PostParams};

    use ccm_core::names::LABEL_EXCLUDE_FROM_LB;
    use kube::api::{Patch, PatchParams};

    use super::kit::{
        LEADER_ARGS, Rng, create_and_delete_while_killing_leaders, env_num, is_lb,
        lb_services_gone, lb_services_left, row, settle,
    };
    use crate::support::{Binary, Env, has_taint, initialised, register};

    const BIN: Binary = crate::support::AWS_BIN;
    const NO_ROUTES: &str = "--configure-cloud-routes=false";
    const NLB_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";

    fn dns(i: &Instance) -> &str {
        i.private_dns_name().unwrap()
    }

    fn ip(i: &Instance) -> &str {
        i.private_ip_address().unwrap()
    }

    /// What moto holds that a load balancer Service creates: (classic ELBs, NLBs, target
    /// groups, ELB security groups `k8s-elb-*`).
    async fn cloud_lbs(moto: &str, vpc: &str) -> (usize, usize, usize, usize) {
        let elb = testing::elb(moto).await;
        let elbv2 = testing::elbv2(moto).await;
        let ec2 = testing::ec2(moto).await;
        let classic = elb.describe_load_balancers().send().await.unwrap();
        let nlbs = elbv2.describe_load_balancers().send().await.unwrap();
        let tgs = elbv2.describe_target_groups().send().await.unwrap();
        let sgs = ec2.describe_security_groups().send().await.unwrap();
        let elb_sgs = sgs
            .security_groups()
            .iter()
            .filter(|g| g.vpc_id() == Some(vpc))
            .filter(|g| g.group_name().is_some_and(|n| n.starts_with("k8s-elb-")))
            .count();
        (
            classic.load_balancer_descriptions().len(),
            nlbs.load_balancers().len(),
            tgs.target_groups().len(),
            elb_sgs,
        )
    }

    fn replica_args() -> Vec<String> {
        let mut args = vec![NO_ROUTES.to_string()];
        args.extend(LEADER_ARGS.iter().map(|a| a.to_string()));
        args
    }

    /// Two replicas, a create/delete loop of LoadBalancer Services, the leader `kill -9`ed at
    /// random moments: after the loop and a settle time, nothing is left in moto.
    #[tokio::test]
    #[ignore = "chaos suite: run by ci/chaos"]
    async fn chaos_leader_killed_mid_write_leaks_no_load_balancer() {
        const CLUSTER: &str = "chaos-leader";
        let cycles = env_num("CHAOS_CYCLES", 50);
        let mut rng = Rng::new();
        let moto = Moto::start().await.unwrap();
        let ec2 = testing::ec2(&moto.url).await;
        let net = network(&ec2, CLUSTER).await.unwrap();
        let node_sg = node_security_group(&ec2, &net.vpc, CLUSTER).await.unwrap();
        let insts =
            run_instances(&ec2, &net.subnets[0].0, CLUSTER, 2, Some(&node_sg)).await.unwrap();

        let env = Env::start(BIN).await;
        let _logs = env.cp.log_guard();
        let config = testing::cloud_config(&moto.url, CLUSTER, "");
        let mut replicas = vec![env.spawn_ccm(&config, &replica_args())];
        replicas.push(env.spawn_ccm(&config, &replica_args()));
        let nodes = env.nodes();
        for i in &insts {
            register(&nodes, dns(i), ip(i), "True").await;
        }
        for i in &insts {
            initialised(&nodes, dns(i)).await;
        }

        let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
        let start = Instant::now();
        let kills = create_and_delete_while_killing_leaders(
            &services,
            &mut rng,
            cycles,
            &mut replicas,
            || env.spawn_ccm(&config, &replica_args()),
            |name, cycle, rng| {
                let mut svc = load_balancer_service("default", name, 80 + (cycle % 5) as i32);
                if rng.below(2) == 0 {
                    svc.metadata.annotations =
                        Some([(NLB_TYPE.to_string(), "nlb".to_string())].into_iter().collect());
                }
                svc
            },
        )
        .await;
        let loop_time = start.elapsed();
        // Settle: every Service gone, then nothing left in moto.
        let gone = lb_services_gone(&services).await;
        let clean = settle(Duration::from_secs(120), || async {
            cloud_lbs(&moto.url, &net.vpc).await == (0, 0, 0, 0)
        })
        .await;
        let (elbs, nlbs, tgs, sgs) = cloud_lbs(&moto.url, &net.vpc).await;
        let left = lb_services_left(&services).await;
        let pass = gone && clean;
        row(
            "leader killed mid-write (aws/moto)",
            &format!("{cycles} cycles, 2 replicas, {kills} kill -9"),
            &format!(
                "leaked: ELB {elbs}, NLB {nlbs}, TG {tgs}, SG {sgs}; Services stuck {left}; loop {:.0} s, settled {:.0} s",
                loop_time.as_secs_f64(),
                start.elapsed().as_secs_f64() - loop_time.as_secs_f64()
            ),
            pass,
        );
        drop(replicas);
        assert!(pass, "leaked ELB {elbs}, NLB {nlbs}, TG {tgs}, SG {sgs}; {left} Services stuck");
    }

    /// The storm's fault mix, 50 % of calls in all: each rule fires with its probability on
    /// the calls the earlier ones let through (0.1 + 0.9·0.12 + … ≈ 0.5).
    fn storm() -> Vec<FaultRule> {
        vec![
            FaultRule::new("*", Fault::Status { status: 500, body: None }).probability(0.10),
            FaultRule::new("*", Fault::Status { status: 503, body: None }).probability(0.12),
            FaultRule::new("*", Fault::Throttle { retry_after_secs: 1 }).probability(0.14),
            FaultRule::new("*", Fault::Drop).probability(0.12),
            FaultRule::new("*", Fault::Latency { ms: 3000 }).probability(0.08),
            FaultRule::new("*", Fault::Hang).probability(0.05),
        ]
    }

    /// 50 % of cloud calls fail for the storm while Nodes join and Services are created: no
    /// Node is deleted, and after the storm every Node is initialised and every Service has
    /// its load balancer.
    #[tokio::test]
    #[ignore = "chaos suite: run by ci/chaos"]
    async fn chaos_cloud_faults_delete_no_node_and_everything_converges() {
        const CLUSTER: &str = "chaos-faults";
        let n_nodes = env_num("CHAOS_NODES", 6) as usize;
        let n_services = env_num("CHAOS_SERVICES", 4);
        let storm_secs = env_num("CHAOS_STORM_SECS", 30);
        let moto = Moto::start().await.unwrap();
        let ec2 = testing::ec2(&moto.url).await;
        let net = network(&ec2, CLUSTER).await.unwrap();
        let node_sg = node_security_group(&ec2, &net.vpc, CLUSTER).await.unwrap();
        let insts = run_instances(&ec2, &net.subnets[0].0, CLUSTER, n_nodes as i32, Some(&node_sg))
            .await
            .unwrap();
        let proxy = FaultProxy::start(moto.url.parse().unwrap(), Protocol::AwsQuery).await.unwrap();

        let env = Env::start(BIN).await;
        let _logs = env.cp.log_guard();
        let ccm =
            env.spawn_ccm(&testing::cloud_config(&proxy.url(), CLUSTER, ""), &[NO_ROUTES.into()]);
        let nodes = env.nodes();
        // Half the Nodes are there before the storm, half join during it; the early ones
        // stop posting Ready (the lifecycle controller asks the cloud about them).
        let (early, late) = insts.split_at(n_nodes / 2);
        for i in early {
            register(&nodes, dns(i), ip(i), "False").await;
        }
        for i in early {
            initialised(&nodes, dns(i)).await;
        }

        let admin = proxy.admin();
        let before = proxy.counters();
        for rule in storm() {
            admin.inject(rule).await.unwrap();
        }
        let storm_start = Instant::now();
        let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
        for i in late {
            register(&nodes, dns(i), ip(i), "True").await;
        }
        for s in 0..n_services {
            let mut svc = load_balancer_service("default", &format!("storm-{s}"), 80);
            if s % 2 == 1 {
                svc.metadata.annotations =
                    Some([(NLB_TYPE.to_string(), "nlb".to_string())].into_iter().collect());
            }
            services.create(&PostParams::default(), &svc).await.unwrap();
        }
        let mut deleted_during = BTreeSet::new();
        // Churn (the long run): every CHAOS_CHURN_SECS a Node leaves or rejoins the load
        // balancers (the exclusion label, as a drain does: every Service's backends change)
        // and one Service changes its port, so the storm hits updates, not only lookups.
        let churn_secs = env_num("CHAOS_CHURN_SECS", 0);
        let mut last_churn = Instant::now();
        let mut churns = 0usize;
        while storm_start.elapsed() < Duration::from_secs(storm_secs) {
            if churn_secs > 0 && last_churn.elapsed() >= Duration::from_secs(churn_secs) {
                last_churn = Instant::now();
                let node = dns(&insts[(churns / 2) % n_nodes]);
                let value = if churns.is_multiple_of(2) {
                    serde_json::json!("true")
                } else {
                    serde_json::Value::Null
                };
                let patch =
                    serde_json::json!({"metadata": {"labels": {LABEL_EXCLUDE_FROM_LB: value}}});
                let _ = nodes.patch(node, &PatchParams::default(), &Patch::Merge(&patch)).await;
                let svc = format!("storm-{}", churns as u64 % n_services.max(1));
                let port = 80 + (churns / n_services.max(1) as usize) % 2;
                // A merge patch replaces the port list (a new node port is allocated too).
                let patch =
                    serde_json::json!({"spec": {"ports": [{"port": port, "protocol": "TCP"}]}});
                let _ = services.patch(&svc, &PatchParams::default(), &Patch::Merge(&patch)).await;
                churns += 1;
            }
            let present: BTreeSet<String> = nodes
                .list(&ListParams::default())
                .await
                .map(|l| l.items.into_iter().filter_map(|n| n.metadata.name).collect())
                .unwrap_or_default();
            for i in insts.iter() {
                if !present.contains(dns(i)) {
                    deleted_during.insert(dns(i).to_string());
                }
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let during = proxy.counters();
        admin.clear_faults().await.unwrap();
        if churns > 0 {
            // Every Node back behind the load balancers before convergence is judged.
            let patch = serde_json::json!({"metadata": {"labels": {LABEL_EXCLUDE_FROM_LB: null}}});
            for i in insts.iter() {
                let _ = nodes.patch(dns(i), &PatchParams::default(), &Patch::Merge(&patch)).await;
            }
        }
        let storm_time = storm_start.elapsed().as_secs_f64();
        let calls = during.total - before.total;
        let faulted = during.faulted - before.faulted;

        // Convergence after the storm: every Node initialised, every Service with its load
        // balancer (generous deadline; the time is reported, not asserted).
        let after = Instant::now();
        let converged = settle(Duration::from_secs(180), || async {
            let Ok(list) = nodes.list(&ListParams::default()).await else { return false };
            let all_init = list.items.len() == n_nodes
                && list
                    .items
                    .iter()
                    .all(|n: &Node| !has_taint(n, ccm_core::names::TAINT_UNINITIALIZED));
            let Ok(svcs) = services.list(&ListParams::default()).await else { return false };
            let all_lb = svcs.items.iter().filter(|s| is_lb(s)).all(|s| {
                s.status
                    .as_ref()
                    .and_then(|st| st.load_balancer.as_ref())
                    .and_then(|lb| lb.ingress.as_ref())
                    .is_some_and(|i| !i.is_empty())
            });
            all_init && all_lb
        })
        .await;
        let converge_secs = after.elapsed().as_secs_f64();
        let list = nodes.list(&ListParams::default()).await.unwrap();
        let uninit = list
            .items
            .iter()
            .filter(|n| has_taint(n, ccm_core::names::TAINT_UNINITIALIZED))
            .count();
        let missing = n_nodes - list.items.len();
        let (elbs, nlbs, _, _) = cloud_lbs(&moto.url, &net.vpc).await;
        let lbs_wrong = (n_services as usize).saturating_sub(elbs + nlbs);
        let pass = deleted_during.is_empty() && missing == 0 && converged;
        row(
            "cloud faults 50% (aws/moto)",
            &format!(
                "{n_nodes} Nodes, {n_services} Services, {storm_secs} s storm{}",
                if churns > 0 {
                    format!(", {churns} churns (LB node set and a port)")
                } else {
                    String::new()
                }
            ),
            &format!(
                "Nodes wrongly deleted {}; uninitialised after {uninit}; LBs missing {lbs_wrong}; faults {faulted} of {calls} calls ({:.1} calls/s, throttle Retry-After 1 s); converged in {converge_secs:.0} s",
                deleted_during.len() + missing,
                calls as f64 / storm_time
            ),
            pass,
        );
        drop(ccm);
        assert!(pass, "deleted {deleted_during:?}, missing {missing}, converged {converged}");
    }

    /// DescribeInstances answers with an empty page, then with the instance in an unknown
    /// state: NotReady Nodes whose instances run are all kept.
    #[tokio::test]
    #[ignore = "chaos suite: run by ci/chaos"]
    async fn chaos_partial_answers_delete_nothing() {
        const CLUSTER: &str = "chaos-partial";
        let secs = env_num("CHAOS_PARTIAL_SECS", 20);
        let moto = Moto::start().await.unwrap();
        let ec2 = testing::ec2(&moto.url).await;
        let net = network(&ec2, CLUSTER).await.unwrap();
        let insts = run_instances(&ec2, &net.subnets[0].0, CLUSTER, 3, None).await.unwrap();
        let proxy = FaultProxy::start(moto.url.parse().unwrap(), Protocol::AwsQuery).await.unwrap();
        let env = Env::start(BIN).await;
        let _logs = env.cp.log_guard();
        let ccm =
            env.spawn_ccm(&testing::cloud_config(&proxy.url(), CLUSTER, ""), &[NO_ROUTES.into()]);
        let nodes = env.nodes();
        for i in &insts {
            register(&nodes, dns(i), ip(i), "False").await;
        }
        for i in &insts {
            initialised(&nodes, dns(i)).await;
        }
        let ns = "http://ec2.amazonaws.com/doc/2016-11-15/";
        let empty = format!(
            r#"<?xml version="1.0" encoding="UTF-8"?><DescribeInstancesResponse xmlns="{ns}"><requestId>chaos-empty</requestId><reservationSet/></DescribeInstancesResponse>"#
        );
        let unknown_state = |i: &Instance| {
            format!(
                r#"<?xml version="1.0" encoding="UTF-8"?><DescribeInstancesResponse xmlns="{ns}"><requestId>chaos-state</requestId><reservationSet><item><reservationId>r-1</reservationId><ownerId>123456789012</ownerId><instancesSet><item><instanceId>{}</instanceId><instanceState><code>99</code><name>hibernating-sideways</name></instanceState><privateDnsName>{}</privateDnsName><privateIpAddress>{}</privateIpAddress><placement><availabilityZone>us-east-1a</availabilityZone></placement><tagSet><item><key>kubernetes.io/cluster/{CLUSTER}</key><value>owned</value></item></tagSet></item></instancesSet></item></reservationSet></DescribeInstancesResponse>"#,
                i.instance_id().unwrap(),
                dns(i),
                ip(i)
            )
        };
        let admin = proxy.admin();
        let mut lost = BTreeSet::new();
        let mut answers = 0;
        for (what, body) in [("empty page", empty), ("unknown state", unknown_state(&insts[0]))] {
            let before = proxy.counters().get("ec2:DescribeInstances");
            let id = admin
                .inject(FaultRule::new(
                    "ec2:DescribeInstances",
                    Fault::Status { status: 200, body: Some(body) },
                ))
                .await
                .unwrap();
            let start = Instant::now();
            while start.elapsed() < Duration::from_secs(secs) {
                for i in &insts {
                    if nodes.get_opt(dns(i)).await.ok().flatten().is_none() {
                        lost.insert(format!("{} ({what})", dns(i)));
                    }
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            admin.remove_fault(id).await.unwrap();
            let n = proxy.counters().get("ec2:DescribeInstances") - before;
            answers += n;
            eprintln!("{what}: {n} DescribeInstances answered so");
        }
        let pass = lost.is_empty() && answers > 0;
        row(
            "partial answers (aws/moto)",
            &format!("3 NotReady Nodes, empty page + unknown state, {secs} s each"),
            &format!("Nodes deleted {}; partial answers served {answers}", lost.len()),
            pass,
        );
        drop(ccm);
        assert!(pass, "Nodes deleted on a partial answer: {lost:?} ({answers} answers served)");
    }

    /// What the Services' load balancers are made of in moto, one line each: every classic
    /// ELB with its instances and listeners, every target group with its targets, every
    /// `k8s-elb-*` security group with its ingress rules.
    async fn lb_members(moto: &str, vpc: &str) -> BTreeSet<String> {
        let elb = testing::elb(moto).await;
        let elbv2 = testing::elbv2(moto).await;
        let ec2 = testing::ec2(moto).await;
        let mut out = BTreeSet::new();
        let classic = elb.describe_load_balancers().send().await.unwrap();
        for lb in classic.load_balancer_descriptions() {
            let mut ids: Vec<&str> =
                lb.instances().iter().filter_map(|i| i.instance_id()).collect();
            ids.sort();
            let ports: Vec<i32> = lb
                .listener_descriptions()
                .iter()
                .filter_map(|l| l.listener().map(|l| l.instance_port()))
                .collect();
            out.insert(format!(
                "elb {}: {ids:?} ports {ports:?}",
                lb.load_balancer_name().unwrap_or("?")
            ));
        }
        let tgs = elbv2.describe_target_groups().send().await.unwrap();
        for tg in tgs.target_groups() {
            let health = elbv2
                .describe_target_health()
                .target_group_arn(tg.target_group_arn().unwrap_or_default())
                .send()
                .await
                .unwrap();
            let mut ids: Vec<String> = health
                .target_health_descriptions()
                .iter()
                .filter_map(|t| {
                    t.target().map(|t| format!("{}:{:?}", t.id().unwrap_or("?"), t.port()))
                })
                .collect();
            ids.sort();
            out.insert(format!("tg {}: {ids:?}", tg.target_group_name().unwrap_or("?")));
        }
        let sgs = ec2.describe_security_groups().send().await.unwrap();
        for g in sgs.security_groups() {
            let name = g.group_name().unwrap_or_default();
            if g.vpc_id() == Some(vpc) && name.starts_with("k8s-") {
                let mut rules: Vec<String> =
                    g.ip_permissions().iter().map(|p| format!("{p:?}")).collect();
                rules.sort();
                out.insert(format!("sg {name}: {rules:?}"));
            }
        }
        out
    }

    /// Cloud calls that change something (every action but Describe*, Get*, List*), by
    /// operation, between two counter readings of the fault proxy.
    fn writes(
        before: &ccm_emulators::Counters,
        after: &ccm_emulators::Counters,
    ) -> Vec<(String, u64)> {
        after
            .operations
            .iter()
            .filter(|(op, _)| {
                let action = op.rsplit(':').next().unwrap_or(op);
                !["Describe", "Get", "List"].iter().any(|p| action.starts_with(p))
            })
            .map(|(op, n)| (op.clone(), n - before.get(op)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }

    fn has_ingress(s: &Service) -> bool {
        s.status
            .as_ref()
            .and_then(|st| st.load_balancer.as_ref())
            .and_then(|lb| lb.ingress.as_ref())
            .is_some_and(|i| !i.is_empty())
    }

    /// kube-apiserver is down for the outage (etcd keeps running) while the manager runs with
    /// initialised Nodes (half of them NotReady) and load balancers: the manager keeps
    /// running, writes nothing to the cloud (nothing changed), deletes no Node, and once the
    /// apiserver is back a new Node is initialised and a new Service gets its load balancer
    /// within 30 s (its watches came back).
    #[tokio::test]
    #[ignore = "chaos suite: run by ci/chaos"]
    async fn chaos_apiserver_outage_changes_nothing_and_everything_reconciles() {
        const CLUSTER: &str = "chaos-outage";
        const RECONCILE_GOAL: Duration = Duration::from_secs(30);
        let n_nodes = env_num("CHAOS_NODES", 6).max(2) as usize;
        let n_services = env_num("CHAOS_SERVICES", 4);
        let outage_secs = env_num("CHAOS_OUTAGE_SECS", 40);
        let moto = Moto::start().await.unwrap();
        let ec2 = testing::ec2(&moto.url).await;
        let net = network(&ec2, CLUSTER).await.unwrap();
        let node_sg = node_security_group(&ec2, &net.vpc, CLUSTER).await.unwrap();
        // One instance more than Nodes: it joins after the outage.
        let insts =
            run_instances(&ec2, &net.subnets[0].0, CLUSTER, n_nodes as i32 + 1, Some(&node_sg))
                .await
                .unwrap();
        let (insts, spare) = insts.split_at(n_nodes);
        let proxy = FaultProxy::start(moto.url.parse().unwrap(), Protocol::AwsQuery).await.unwrap();

        let env = Env::start(BIN).await;
        let _logs = env.cp.log_guard();
        let mut ccm =
            env.spawn_ccm(&testing::cloud_config(&proxy.url(), CLUSTER, ""), &[NO_ROUTES.into()]);
        let nodes = env.nodes();
        for (k, i) in insts.iter().enumerate() {
            register(&nodes, dns(i), ip(i), if k % 2 == 0 { "True" } else { "False" }).await;
        }
        for i in insts {
            initialised(&nodes, dns(i)).await;
        }
        let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
        for s in 0..n_services {
            let mut svc = load_balancer_service("default", &format!("outage-{s}"), 80);
            if s % 2 == 1 {
                svc.metadata.annotations =
                    Some([(NLB_TYPE.to_string(), "nlb".to_string())].into_iter().collect());
            }
            services.create(&PostParams::default(), &svc).await.unwrap();
        }
        let provisioned = settle(Duration::from_secs(180), || async {
            services.list(&ListParams::default()).await.is_ok_and(|l| {
                l.items.iter().filter(|s| is_lb(s)).filter(|s| has_ingress(s)).count()
                    == n_services as usize
            })
        })
        .await;
        assert!(provisioned, "the {n_services} load balancers were provisioned before the outage");
        // Quiet before the outage: no cloud write for 5 s in a row.
        let mut last = proxy.counters();
        let quiet = settle(Duration::from_secs(120), || {
            let now = proxy.counters();
            let calm = writes(&last, &now).is_empty();
            last = now;
            async move {
                tokio::time::sleep(Duration::from_secs(5)).await;
                calm
            }
        })
        .await;
        assert!(quiet, "the manager stopped writing to the cloud before the outage");
        let members_before = lb_members(&moto.url, &net.vpc).await;
        let before = proxy.counters();

        env.cp.stop_apiserver().await.unwrap();
        let down = Instant::now();
        let mut crashed_during = None;
        while down.elapsed() < Duration::from_secs(outage_secs) {
            if let Some(status) = ccm.exited() {
                crashed_during = Some(status);
                break;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
        }
        let at_back = proxy.counters();
        let writes_during = writes(&before, &at_back);
        let calls_during = at_back.total - before.total;
        env.cp.start_apiserver().await.unwrap();
        let back = Instant::now();

        // After it is back: for 10 s nothing is due, then a new Node and a new Service.
        tokio::time::sleep(Duration::from_secs(10)).await;
        let settled = proxy.counters();
        let writes_after = writes(&at_back, &settled);
        let members_after = lb_members(&moto.url, &net.vpc).await;
        let present: BTreeSet<String> = nodes
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .into_iter()
            .filter_map(|n| n.metadata.name)
            .collect();
        let deleted: Vec<&str> = insts.iter().map(dns).filter(|n| !present.contains(*n)).collect();

        let probe = Instant::now();
        register(&nodes, dns(&spare[0]), ip(&spare[0]), "True").await;
        let mut svc = load_balancer_service("default", "after-outage", 8080);
        svc.metadata.annotations = None;
        services.create(&PostParams::default(), &svc).await.unwrap();
        let mut node_secs = None;
        let mut svc_secs = None;
        while probe.elapsed() < Duration::from_secs(120)
            && (node_secs.is_none() || svc_secs.is_none())
        {
            if node_secs.is_none()
                && nodes
                    .get_opt(dns(&spare[0]))
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|n| !has_taint(&n, ccm_core::names::TAINT_UNINITIALIZED))
            {
                node_secs = Some(probe.elapsed().as_secs_f64());
            }
            if svc_secs.is_none()
                && services
                    .get_opt("after-outage")
                    .await
                    .ok()
                    .flatten()
                    .is_some_and(|s| has_ingress(&s))
            {
                svc_secs = Some(probe.elapsed().as_secs_f64());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let alive = crashed_during.is_none() && ccm.exited().is_none();
        let within = |t: Option<f64>| t.is_some_and(|t| t <= RECONCILE_GOAL.as_secs_f64());
        let fmt = |t: Option<f64>| t.map_or("never (120 s)".to_string(), |t| format!("{t:.1} s"));
        let pass = alive
            && writes_during.is_empty()
            && writes_after.is_empty()
            && members_before == members_after
            && deleted.is_empty()
            && within(node_secs)
            && within(svc_secs);
        row(
            "API server outage (aws/moto)",
            &format!(
                "{n_nodes} Nodes ({} NotReady), {n_services} Services, apiserver down {outage_secs} s",
                n_nodes / 2
            ),
            &format!(
                "manager {}; cloud writes during {} ({calls_during} calls), in 10 s after {}; LB members changed {}; Nodes deleted {}; after it was back ({:.0} s to ready): new Node initialised in {}, new LB in {}",
                if alive { "kept running" } else { "EXITED" },
                writes_during.len(),
                writes_after.len(),
                members_before.symmetric_difference(&members_after).count(),
                deleted.len(),
                back.duration_since(down).as_secs_f64() - outage_secs as f64,
                fmt(node_secs),
                fmt(svc_secs),
            ),
            pass,
        );
        drop(ccm);
        assert!(
            pass,
            "alive {alive} ({crashed_during:?}); writes during {writes_during:?}, after {writes_after:?}; \
             members before {members_before:?} after {members_after:?}; deleted {deleted:?}; \
             new Node {node_secs:?} s, new LB {svc_secs:?} s"
        );
    }
}
