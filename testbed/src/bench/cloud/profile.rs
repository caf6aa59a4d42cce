//! Per-cloud latency profiles of `ccm-bench` (issue #35 part 2): how long each class of cloud
//! call takes (reads, writes) and how long the cloud's long-running operations stay pending
//! (load-balancer provisioning, ARM LROs, Compute operations), at three settings:
//!
//! - `fast`: a quick, healthy region: reads 20 ms, writes 50 ms, the emulators' test timings
//!   (operations pending for 0.3–2 s).
//! - `realistic`: typical figures: reads 100–150 ms, writes 200–300 ms, the emulator's
//!   `realistic` table (scaled per cloud, below).
//! - `slow`: the slow end users report: reads 300 ms, writes 600 ms, provisioning in minutes.
//!
//! The per-call latency is the emulator's fault rule `latency` (the first matching rule wins:
//! the read globs first, then `*` for the writes); the operation times are its timing
//! selection (`POST /__emulator/timing`: `fast` or `realistic` times a scale). Each figure
//! names its source, or says it is an assumption ([`Plan::sources`]).

use super::Cloud;

/// A latency profile (`ccm-bench run --profile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    Fast,
    Realistic,
    Slow,
}

impl Profile {
    pub fn name(self) -> &'static str {
        match self {
            Profile::Fast => "fast",
            Profile::Realistic => "realistic",
            Profile::Slow => "slow",
        }
    }
}

/// What a profile means on one cloud.
#[derive(Debug, Clone, PartialEq)]
pub struct Plan {
    /// Added to every read (get, list, describe, token).
    pub reads_ms: u64,
    /// Added to every other call (create, update, delete, insert, member changes).
    pub writes_ms: u64,
    /// The emulator's timing table of long-running operations: `fast` or `realistic`
    /// (None: the cloud has none here, e.g. moto's ELB answers at once).
    pub timing: Option<&'static str>,
    /// The factor the table's times are multiplied by.
    pub scale: f64,
    /// The operation globs counted as reads.
    pub reads: &'static [&'static str],
    /// Where the figures come from (or that they are assumptions).
    pub sources: &'static [&'static str],
}

impl Plan {
    /// The emulator's timing selection (`POST /__emulator/timing` body), if it has one.
    pub fn timing_body(&self) -> Option<serde_json::Value> {
        self.timing.map(|p| serde_json::json!({"profile": p, "scale": self.scale}))
    }

    /// One line for the report.
    pub fn describe(&self) -> String {
        format!(
            "reads {} ms, writes {} ms, operations: {}",
            self.reads_ms,
            self.writes_ms,
            match self.timing {
                Some(t) => format!("{t} ×{}", self.scale),
                None => "none (synchronous API)".into(),
            }
        )
    }
}

/// Reads of the kit's emulators (`<service>.<collection>.<verb>` names) and tokens.
const KIT_READS: &[&str] = &[
    "*.get",
    "*.list",
    "*.list_all",
    "*.aggregatedList",
    "*.versions",
    "*.wait",
    "*.instance_view",
    "*token*",
    "*.list_virtual_machine_scale_set*",
    "*.get_virtual_machine_scale_set*",
    "imds.*",
    "aad.*",
    "metadata.*",
];
/// AWS reads through the fault proxy (`<service>:<Action>`).
const AWS_READS: &[&str] = &["*:Describe*", "*:Get*", "*:List*"];
/// vSphere: no load balancers; every call is a read of the inventory.
const VSPHERE_READS: &[&str] = &["*"];

const ASSUMED_CALLS: &str = "per-call latency: an assumption (a region-local API answering a read in ~100 ms and a write in ~200 ms; fast and slow are ÷5 and ×3)";

/// The plan of `profile` on `cloud`.
pub fn plan(cloud: Cloud, profile: Profile) -> Plan {
    let (reads_ms, writes_ms) = match profile {
        Profile::Fast => (20, 50),
        Profile::Realistic => match cloud {
            // IBM VPC answers through one regional API with IAM; assumed a little slower.
            Cloud::Ibm => (150, 300),
            _ => (100, 200),
        },
        Profile::Slow => (300, 600),
    };
    let reads = match cloud {
        Cloud::Aws => AWS_READS,
        Cloud::Vsphere => VSPHERE_READS,
        _ => KIT_READS,
    };
    let (timing, scale, sources): (Option<&'static str>, f64, &'static [&'static str]) = match (
        cloud, profile,
    ) {
        (Cloud::Aws | Cloud::Vsphere, _) => (
            None,
            1.0,
            &[
                ASSUMED_CALLS,
                "no long-running operations on this emulator (moto's ELB and vcsim answer at once)",
            ],
        ),
        (_, Profile::Fast) => (
            Some("fast"),
            1.0,
            &[
                ASSUMED_CALLS,
                "operations: the emulator's test timings (IBM and OpenStack load balancers pending 2 s, GCE operations 0.3 s, ARM LROs 0.5 s)",
            ],
        ),
        (Cloud::Ibm, Profile::Realistic) => (
            Some("realistic"),
            0.5,
            &[
                ASSUMED_CALLS,
                "IBM VPC load balancer: create 120 s, update 22.5 s, delete 90 s (the emulator's realistic table ×0.5); a create still pending after 1 min 50 s in IBM-Cloud/terraform-provider-ibm#5380",
            ],
        ),
        (Cloud::Ibm, Profile::Slow) => (
            Some("realistic"),
            1.0,
            &[
                ASSUMED_CALLS,
                "IBM VPC load balancer: create 240 s, update 45 s, delete 180 s (the emulator's realistic table); each pool-member change is a full update_pending cycle and 16 of them took 15-25 min in kubernetes-sigs/cluster-api-provider-ibmcloud#2839 (~60-90 s each)",
            ],
        ),
        (Cloud::Openstack, Profile::Realistic) => (
            Some("realistic"),
            1.0,
            &[
                ASSUMED_CALLS,
                "Octavia (amphora): create 45 s, update 10 s, delete 15 s (the emulator's realistic table: a create boots an amphora VM)",
            ],
        ),
        (Cloud::Openstack, Profile::Slow) => (
            Some("realistic"),
            4.0,
            &[
                ASSUMED_CALLS,
                "Octavia (amphora) on a busy cloud: create 180 s, update 40 s, delete 60 s (realistic ×4): creates outlasting a 3-minute wait, raised to 10 min, in osism/testbed#1316",
            ],
        ),
        (Cloud::Gcp, Profile::Realistic) => (
            Some("realistic"),
            1.0,
            &[
                ASSUMED_CALLS,
                "Compute operations: insert 20 s, change 10 s, delete 15 s (the emulator's realistic table; an assumption from operations' insertTime/endTime orders of magnitude)",
            ],
        ),
        (Cloud::Gcp, Profile::Slow) => (
            Some("realistic"),
            3.0,
            &[
                ASSUMED_CALLS,
                "Compute operations ×3: insert 60 s, change 30 s, delete 45 s (an assumption)",
            ],
        ),
        (Cloud::Azure, Profile::Realistic) => (
            Some("realistic"),
            1.0,
            &[
                ASSUMED_CALLS,
                "ARM LROs: load balancer PUT 20 s (15 s update), public IP 6 s, NSG/NIC 8 s, scale-set models 60 s (the emulator's realistic table); a Standard LB rule change ~11.5 s in Azure/azure-libraries-for-net#1021",
            ],
        ),
        (Cloud::Azure, Profile::Slow) => (
            Some("realistic"),
            3.0,
            &[
                ASSUMED_CALLS,
                "ARM LROs ×3 (LB PUT 60 s, public IP 18 s): CAPZ raised its e2e wait for an LB from 30 s to 5 min (kubernetes-sigs/cluster-api-provider-azure#2162); minutes to a usable LB in Azure/AKS#1521",
            ],
        ),
    };
    Plan { reads_ms, writes_ms, timing, scale, reads, sources }
}

/// The fault rules (admin API bodies) that add `plan`'s per-call latency: the reads first,
/// then every other call.
pub fn latency_rules(plan: &Plan) -> Vec<serde_json::Value> {
    let rule =
        |m: &str, ms: u64| serde_json::json!({"match": m, "fault": {"kind": "latency", "ms": ms}});
    let mut rules: Vec<serde_json::Value> = Vec::new();
    if plan.reads_ms > 0 {
        rules.extend(plan.reads.iter().map(|g| rule(g, plan.reads_ms)));
    } else {
        // Reads without latency must still not fall through to the writes' rule.
        rules.extend(plan.reads.iter().map(|g| rule(g, 0)));
    }
    if plan.writes_ms > 0 {
        rules.push(rule("*", plan.writes_ms));
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matches(plan: &Plan, op: &str) -> Option<u64> {
        latency_rules(plan).iter().find_map(|r| {
            let m = r["match"].as_str().unwrap_or_default();
            ccm_core::glob::glob(m, op).then(|| r["fault"]["ms"].as_u64().unwrap_or(0))
        })
    }

    #[test]
    fn reads_and_writes_get_their_own_latency() {
        let p = plan(Cloud::Ibm, Profile::Slow);
        assert_eq!(matches(&p, "vpc.load_balancers.list"), Some(300));
        assert_eq!(matches(&p, "vpc.load_balancers.get"), Some(300));
        assert_eq!(matches(&p, "iam.token"), Some(300));
        assert_eq!(matches(&p, "vpc.load_balancers.create"), Some(600));
        assert_eq!(matches(&p, "vpc.load_balancer_pool_members.replace"), Some(600));
        let p = plan(Cloud::Openstack, Profile::Fast);
        assert_eq!(matches(&p, "nova.servers.list"), Some(20));
        assert_eq!(matches(&p, "keystone.tokens.create"), Some(20));
        assert_eq!(matches(&p, "octavia.members.batch_update"), Some(50));
        let p = plan(Cloud::Gcp, Profile::Realistic);
        assert_eq!(matches(&p, "compute.instances.aggregatedList"), Some(100));
        assert_eq!(matches(&p, "compute.targetPools.addInstance"), Some(200));
        let p = plan(Cloud::Aws, Profile::Realistic);
        assert_eq!(matches(&p, "ec2:DescribeInstances"), Some(100));
        assert_eq!(
            matches(&p, "elasticloadbalancing:RegisterInstancesWithLoadBalancer"),
            Some(200)
        );
    }

    #[test]
    fn provisioning_is_slower_in_the_slow_profile_on_every_cloud_with_operations() {
        for cloud in [Cloud::Ibm, Cloud::Openstack, Cloud::Gcp, Cloud::Azure] {
            let fast = plan(cloud, Profile::Fast);
            let slow = plan(cloud, Profile::Slow);
            assert_eq!(fast.timing, Some("fast"), "{cloud:?}");
            assert_eq!(slow.timing, Some("realistic"), "{cloud:?}");
            assert!(slow.scale >= 1.0, "{cloud:?}");
            assert!(slow.reads_ms > fast.reads_ms && slow.writes_ms > fast.writes_ms);
            assert!(!slow.sources.is_empty());
        }
    }
}
