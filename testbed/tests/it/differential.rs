//! The differential's pure half (`ccm_testbed::differential::compare`): normalising what the
//! two sides left, diffing, matching the documented differences, the table and the page. The
//! runs themselves (`ci/differential <cloud>`) need upstream's builds and are not part of the
//! test suite.

use std::collections::BTreeMap;

use ccm_testbed::differential::{self, compare};
use compare::{Decision, Known, Renames, Verdict};
use serde_json::{Value, json};

/// A Node as the apiserver returns it after a CCM initialised it, with this side's volatile
/// parts (uid, resourceVersion, times, managedFields) and instance ID.
fn node(uid: &str, rv: &str, instance: &str, time: &str, zone: &str) -> Value {
    json!({
        "metadata": {
            "name": "ip-10-0-0-4.ec2.internal", "uid": uid, "resourceVersion": rv,
            "creationTimestamp": time,
            "managedFields": [{"manager": "aws-cloud-controller-manager", "time": time}],
            "labels": {"topology.kubernetes.io/zone": zone, "node.kubernetes.io/instance-type": "m5.large"},
        },
        "spec": {
            "providerID": format!("aws:///{zone}/{instance}"),
            "taints": [{"key": "node.kubernetes.io/not-ready", "effect": "NoSchedule", "timeAdded": time}],
        },
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": "10.0.0.4"},
                {"type": "Hostname", "address": "ip-10-0-0-4.ec2.internal"},
            ],
            "conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
                            "lastHeartbeatTime": time, "lastTransitionTime": time}],
        },
    })
}

fn renames_for(instance: &str) -> Renames {
    let mut r = Renames::default();
    r.add(instance, "<instance:ip-10-0-0-4.ec2.internal>");
    r
}

#[test]
fn the_same_node_on_two_runs_normalises_to_the_same_snapshot_and_a_zone_change_shows() {
    let a = node("uid-1111", "101", "i-0aaaaaaaaaaaaaaa1", "2026-11-28T13:00:00Z", "us-east-1a");
    let b = node("uid-2222", "977", "i-0bbbbbbbbbbbbbbb2", "2026-11-28T14:12:59Z", "us-east-1a");
    let na = compare::normalise_node(&a, &renames_for("i-0aaaaaaaaaaaaaaa1"));
    let nb = compare::normalise_node(&b, &renames_for("i-0bbbbbbbbbbbbbbb2"));
    assert_eq!(na, nb, "uids, resourceVersions, times and instance IDs must not differ");
    assert_eq!(na["providerID"], "aws:///us-east-1a/<instance:ip-10-0-0-4.ec2.internal>");
    assert_eq!(
        na["addresses"],
        json!(["InternalIP=10.0.0.4", "Hostname=ip-10-0-0-4.ec2.internal"])
    );
    assert_eq!(na["conditions"]["Ready"]["status"], "True");
    assert!(compare::diff("join", &na, &nb).is_empty());

    // A different zone label is a difference at its path (label keys with '/' bracketed).
    let c = node("uid-3333", "5", "i-0ccccccccccccccc3", "2026-11-28T15:00:00Z", "us-east-1b");
    let nc = compare::normalise_node(&c, &renames_for("i-0ccccccccccccccc3"));
    let d = compare::diff("join", &na, &nc);
    let paths: Vec<&str> = d.iter().map(|d| d.path.as_str()).collect();
    assert_eq!(paths, ["labels/[topology.kubernetes.io/zone]", "providerID"], "{d:?}");
    assert_eq!(d[0].upstream.as_deref(), Some("us-east-1a"));
    assert_eq!(d[0].ours.as_deref(), Some("us-east-1b"));
}

#[test]
fn generated_ids_and_times_are_scrubbed_but_names_ports_and_addresses_are_not() {
    assert_eq!(compare::scrub_ids("sg-0123456789abcdef0"), "sg-<id>");
    assert_eq!(
        compare::scrub_ids(
            "arn:aws:ec2:us-east-1:123456789012:security-group/sg-54144f20e418f489f"
        ),
        "arn:aws:ec2:us-east-1:123456789012:security-group/sg-<id>"
    );
    assert_eq!(compare::scrub_ids("8c0e5d0a-3b8e-4b8f-9d7e-0a1b2c3d4e5f"), "<uuid>");
    assert_eq!(compare::scrub_ids("2026-11-28T13:00:00.123Z"), "<time>");
    for kept in [
        "node-a",
        "ip-10-0-0-4.ec2.internal",
        "10.0.0.4",
        "web-differential",
        "us-east-1a",
        "kube_service_kubernetes_default_web",
        "Standard_D4s_v3",
        "80",
        "TCP",
    ] {
        assert_eq!(compare::scrub_ids(kept), kept);
    }
    // A Service's UID in the forms clouds name things with.
    let mut r = Renames::default();
    r.add_service_uid("0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0", "default/web");
    assert_eq!(r.apply("a0f1e2d3c4b5a69788796a5b4c3d2e1f"), "<lb-name:default/web>");
    assert_eq!(r.apply("k8s-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0"), "k8s-<uid:default/web>");
    // Keys that collide once renamed keep both values; volatile keys go.
    let v = json!({"lb-1a2b3c4d5e": {"name": "x", "created_at": "2026-01-01T00:00:00Z"},
                   "lb-9f8e7d6c5b": {"name": "y", "updated_at": "2026-01-01T00:00:00Z"}});
    let s = compare::scrub(&v, &Renames::default(), true);
    assert_eq!(s, json!({"lb-<id>": {"name": "x"}, "lb-<id>#2": {"name": "y"}}));
}

fn known(text: &str) -> Known {
    Known::parse(text, "test.yaml").unwrap()
}

#[test]
fn differences_are_identical_documented_or_unexplained_per_step() {
    let upstream: BTreeMap<String, Value> = [
        ("join".to_string(), json!({"nodes": {"a": {"labels": {"zone": "1"}}}, "calls": {"ec2:DescribeInstances": 3}})),
        ("service-created".to_string(), json!({"services": {"web": {"ingress": [{"ip": "1.2.3.4"}]}}})),
        ("service-deleted".to_string(), json!({"services": {}})),
    ]
    .into_iter()
    .collect();
    let ours: BTreeMap<String, Value> = [
        ("join".to_string(), json!({"nodes": {"a": {"labels": {"zone": "1", "topology.openstack.org/host-id": "h"}}}, "calls": {"ec2:DescribeInstances": 1}})),
        ("service-created".to_string(), json!({"services": {"web": {"ingress": [{"ip": "1.2.3.4"}]}}})),
    ]
    .into_iter()
    .collect();
    let steps: Vec<String> =
        ["join", "service-created", "service-deleted"].map(String::from).to_vec();

    // Nothing documented: the label and the count are unexplained, the missing step too.
    let none = known("cloud: test\n");
    let rows = compare::rows(&steps, &upstream, &ours, &none);
    assert_eq!(
        rows.iter().map(|r| r.verdict()).collect::<Vec<_>>(),
        [Verdict::Unexplained, Verdict::Identical, Verdict::Unexplained]
    );
    let lines = compare::unexplained_lines(&rows);
    assert!(
        lines.contains(
            &"join: nodes/a/labels/[topology.openstack.org/host-id]: upstream (absent) / ours h"
                .to_string()
        ),
        "{lines:?}"
    );
    assert!(
        lines.contains(&"join: calls/ec2:DescribeInstances: upstream 3 / ours 1".to_string()),
        "{lines:?}"
    );
    assert!(
        lines.iter().any(|l| l.starts_with("service-deleted: step: upstream ran / ours (absent)")),
        "{lines:?}"
    );
    let table = compare::table(&rows);
    assert!(table.contains("| join | 2 | 0 | 2 | unexplained |"), "{table}");
    assert!(table.contains("| service-created | 0 | 0 | 0 | identical |"), "{table}");

    // Documented (the label only when ours has it and upstream does not): documented.
    let k = known(
        "cloud: test\ndifferences:\n\
         - path: 'nodes/*/labels/[topology.openstack.org/host-id]'\n  upstream: '~'\n  decision: to-fix\n  why: no upstream release sets it\n\
         - step: join\n  path: 'calls/ec2:*'\n  decision: timing\n  why: periodic syncs\n\
         - step: never\n  path: '*'\n  decision: emulator-limit\n  why: stale entry\n",
    );
    assert_eq!(k.differences[0].decision, Decision::ToFix);
    let rows = compare::rows(&steps[..2], &upstream, &ours, &k);
    assert_eq!(rows[0].verdict(), Verdict::Documented);
    assert_eq!(compare::unused(&rows, &k), [2], "the entry matching nothing is reported as unused");

    // The value globs are strict: upstream having the label is not what the entry documents.
    let mut both = upstream.clone();
    both.insert("join".into(), json!({"nodes": {"a": {"labels": {"zone": "1", "topology.openstack.org/host-id": "x"}}}, "calls": {"ec2:DescribeInstances": 1}}));
    let rows = compare::rows(&steps[..1], &both, &ours, &k);
    assert_eq!(rows[0].verdict(), Verdict::Unexplained);
}

#[test]
fn a_documented_difference_without_a_reason_or_with_an_unknown_decision_is_refused() {
    let err = Known::parse(
        "cloud: x\ndifferences:\n- path: a\n  decision: timing\n  why: ''\n",
        "x.yaml",
    )
    .unwrap_err();
    assert!(err.to_string().contains("x.yaml") && err.to_string().contains("why"), "{err}");
    let err =
        Known::parse("cloud: x\ndifferences:\n- path: a\n  decision: fine\n  why: w\n", "x.yaml")
            .unwrap_err();
    assert!(err.to_string().contains("x.yaml"), "{err}");
    let err = Known::parse(
        "cloud: x\ndifferences:\n- path: a\n  decision: timing\n  why: w\n  typo: 1\n",
        "x.yaml",
    )
    .unwrap_err();
    assert!(err.to_string().contains("typo"), "{err}");
}

#[test]
fn every_cloud_s_documented_differences_parse_and_its_page_is_stable() {
    for cloud in differential::CLOUDS {
        let k = Known::load(&differential::known_path(cloud)).unwrap();
        assert_eq!(k.cloud, cloud);
        let facts = compare::PageFacts {
            cloud: cloud.to_string(),
            upstream: differential::upstream_version(cloud),
            artifact: "chart x".into(),
            steps: differential::STEPS
                .iter()
                .map(|(s, w)| (s.to_string(), w.to_string()))
                .collect(),
            rows: Some(Vec::new()),
            not_run: None,
        };
        let page = compare::page(&facts, &k);
        assert_eq!(page, compare::page(&facts, &k), "the page is a function of its inputs");
        assert!(page.contains(&differential::upstream_version(cloud)), "{cloud}: version");
        for (i, d) in k.differences.iter().enumerate() {
            assert!(
                page.contains(&format!("| D{} |", i + 1)) && page.contains(d.decision.as_str()),
                "{cloud}: D{}",
                i + 1
            );
        }
        assert!(
            page.contains("## GCP and IBM Cloud")
                && page.contains("not served by the Go module proxy")
        );
        for (step, _) in differential::STEPS {
            assert!(page.contains(&format!("`{step}`")), "{cloud}: step {step}");
        }
    }
}

#[test]
fn moto_state_keeps_what_the_ccms_change_and_drops_the_rest() {
    let all = json!({
        "ec2": {"Ami": [{"id": "ami-1"}], "SecurityGroup": [{"id": "sg-1", "name": "k8s-elb-a1"}],
                "Instance": [{"id": "i-1", "_state": {"name": "terminated"}, "tags": {"Name": "n"}, "launch_time": "x"}]},
        "elb": {"FakeLoadBalancer": [{"name": "a1"}]},
        "iam": {"Role": []},
    });
    let s = differential::moto_state(&all);
    assert_eq!(
        s,
        json!({
            "ec2": {"SecurityGroup": [{"id": "sg-1", "name": "k8s-elb-a1"}],
                    "Instance": [{"id": "i-1", "state": "terminated", "tags": {"Name": "n"}}]},
            "elb": {"FakeLoadBalancer": [{"name": "a1"}]},
        })
    );
}

#[test]
fn a_step_waits_for_pod_cidrs_and_routes_only_where_the_managers_args_ask_for_them() {
    use k8s_openapi::api::core::v1::Node;
    let argv = |args: &[&str]| -> Vec<String> {
        std::iter::once("ccm").chain(args.iter().copied()).map(str::to_string).collect()
    };
    let node = |cidrs: bool, network: Option<&str>| -> Node {
        let mut v = json!({
            "metadata": {"name": "node-a"},
            "spec": {"providerID": "azure:///subscriptions/s/virtualMachines/node-a"},
            "status": {"addresses": [{"type": "InternalIP", "address": "10.240.0.4"}],
                       "conditions": [{"type": "Ready", "status": "True"}]},
        });
        if cidrs {
            v["spec"]["podCIDRs"] = json!(["10.244.1.0/24"]);
        }
        if let Some(s) = network {
            v["status"]["conditions"]
                .as_array_mut()
                .unwrap()
                .push(json!({"type": "NetworkUnavailable", "status": s, "reason": "RouteCreated"}));
        }
        serde_json::from_value(v).unwrap()
    };
    // Upstream Azure's chart: allocate, routes on by default.
    let azure = differential::NodeWork::from_argv(&argv(&[
        "--allocate-node-cidrs=true",
        "--cluster-cidr=10.244.0.0/16",
    ]));
    assert_eq!(azure, differential::NodeWork { pod_cidrs: true, routes: true });
    assert!(!azure.done(&node(false, None)), "initialised but no podCIDRs yet");
    assert!(!azure.done(&node(true, None)), "podCIDRs but not routed yet");
    assert!(!azure.done(&node(true, Some("True"))), "the route is not created yet");
    assert!(azure.done(&node(true, Some("False"))));
    // Routes off: podCIDRs suffice.
    let no_routes = differential::NodeWork::from_argv(&argv(&[
        "--allocate-node-cidrs",
        "true",
        "--configure-cloud-routes=false",
    ]));
    assert_eq!(no_routes, differential::NodeWork { pod_cidrs: true, routes: false });
    assert!(no_routes.done(&node(true, None)));
    // The AWS, OpenStack and vSphere charts allocate nothing: initialised is enough.
    for args in [&["--allocate-node-cidrs=false", "--configure-cloud-routes=true"][..], &[][..]] {
        let w = differential::NodeWork::from_argv(&argv(args));
        assert_eq!(w, differential::NodeWork::default(), "{args:?}");
        assert!(w.done(&node(false, None)));
    }
}
