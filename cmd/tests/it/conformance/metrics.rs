//! The `metrics` scenario (issue #30 point 6): after a short run (a Node initialised and,
//! where the provider has load balancers, a LoadBalancer Service with its address), the
//! manager's `/metrics` serves the cloud's upstream API families with samples under
//! upstream's exact names and labels, the ones without samples yet described, and Go's
//! `process_*` families.
//!
//! Each provider's file calls `super::metrics::scenario!(<Harness>)`, which adds the test
//! `conformance::<provider>::metrics` and its row in the matrix.

use std::time::Instant;

use ccm_core::cloud_call::api_metrics::{CLOUDS, Kind};

use super::{Cluster, Harness, Row};
use crate::support::{Env, curl, free_port};

/// The samples of `family` (exact sample name, or histogram base name + `_count`) in the
/// exposition, with their label names.
fn samples<'t>(text: &'t str, name: &str) -> Vec<&'t str> {
    text.lines().filter(|l| l.starts_with(name) && l[name.len()..].starts_with('{')).collect()
}

/// Label names of a sample line `name{a="x",b="y"} 1`.
fn label_names(line: &str) -> Vec<String> {
    let Some((_, rest)) = line.split_once('{') else { return Vec::new() };
    let Some((labels, _)) = rest.rsplit_once('}') else { return Vec::new() };
    labels
        .split("\",")
        .filter_map(|kv| kv.split_once("=\"").map(|(k, _)| k.to_string()))
        .filter(|k| k != "le")
        .collect()
}

pub async fn metrics<H: Harness>() {
    let row = Row { provider: H::PROVIDER, scenario: "metrics", start: Instant::now() };
    let h = H::start(1).await;
    let env = Env::start(H::BINARY).await;
    // Picked just before the manager binds it (the control plane takes seconds to start).
    let port = free_port();
    let mut args = h.args(false);
    args.push(format!("--secure-port={port}"));
    args.push("--authorization-always-allow-paths=/healthz,/metrics".into());
    let ccm = env.spawn_ccm_with_env(&h.cloud_config(), &args, &h.env());
    let c = Cluster { h, env, ccm };
    let _logs = c.env.cp.log_guard();
    c.register(0, "True").await;
    c.initialised(0).await;
    if H::LOAD_BALANCERS {
        c.create_lb_service("metrics", 80).await;
    }
    let url = format!("https://127.0.0.1:{port}/metrics");
    let (code, text) = curl(&url).await;
    assert_eq!(code, 200, "GET /metrics: {text}");

    for name in [
        "process_cpu_seconds_total",
        "process_open_fds",
        "process_max_fds",
        "process_virtual_memory_bytes",
        "process_virtual_memory_max_bytes",
        "process_resident_memory_bytes",
        "process_start_time_seconds",
    ] {
        assert!(
            text.lines().any(|l| l.starts_with(&format!("{name} "))),
            "{}: no {name} sample in /metrics:\n{text}",
            H::PROVIDER
        );
    }

    let Some(cloud) = CLOUDS.iter().find(|c| c.cloud == H::PROVIDER) else {
        // vSphere's and IBM's upstream providers have no API families: none is served.
        for other in CLOUDS {
            for f in other.families {
                assert!(!text.contains(f.name), "{} serves {}", H::PROVIDER, f.name);
            }
        }
        row.write("pass");
        return;
    };
    // Every family is described, with or without samples.
    for f in cloud.families.iter().filter(|f| !f.external) {
        let described = f.name.strip_suffix("_total").unwrap_or(f.name);
        assert!(
            text.contains(&format!("# TYPE {described} {}\n", f.exposed_type())),
            "{}: family {} not served as {}:\n{text}",
            H::PROVIDER,
            f.name,
            f.exposed_type()
        );
    }
    // The call families have samples, with upstream's label names in order.
    let mut fed = vec![cloud.call.duration];
    fed.extend(cloud.call.total);
    for name in fed {
        let Some(f) = cloud.families.iter().find(|f| f.name == name) else {
            panic!("{name} is not one of {}'s families", cloud.cloud)
        };
        let sample_name = match f.kind {
            Kind::Histogram => format!("{name}_count"),
            Kind::Counter => name.to_string(),
        };
        let lines = samples(&text, &sample_name);
        assert!(
            !lines.is_empty(),
            "{}: no {sample_name} sample after the run:\n{text}",
            H::PROVIDER
        );
        for l in &lines {
            assert_eq!(label_names(l), f.labels, "{l}");
        }
        eprintln!("{}: {} series of {sample_name}, e.g. {}", H::PROVIDER, lines.len(), lines[0]);
    }
    // The samples upstream records beyond the API calls, with its label values: OpenStack's
    // reconcile of the Service's load balancer, Azure's service operation (resource group,
    // subscription, `<namespace>/<name>`), GCE's zonal instance calls with their zone.
    let wanted: &[(&str, &[&str], &[&str])] = match H::PROVIDER {
        "openstack" => &[
            (
                "cloudprovider_openstack_reconcile_duration_seconds_count",
                &["operation=\"loadbalancer_ensure\""],
                &[],
            ),
            (
                "cloudprovider_openstack_reconcile_total",
                &["operation=\"loadbalancer_ensure\""],
                &[],
            ),
        ],
        "azure" => &[(
            "cloudprovider_azure_op_duration_seconds_count",
            &["request=\"services_ensure_loadbalancer\"", "source=\"default/metrics\""],
            &["resource_group=\"\"", "subscription_id=\"\""],
        )],
        "gcp" => &[(
            "cloudprovider_gce_api_request_duration_seconds_count",
            &["request=\"instances_"],
            &["zone=\"<n/a>\"", "zone=\"\""],
        )],
        _ => &[],
    };
    for (name, has, lacks) in wanted {
        let found = samples(&text, name)
            .into_iter()
            .find(|l| has.iter().all(|h| l.contains(h)) && !lacks.iter().any(|x| l.contains(x)));
        let Some(line) = found else {
            panic!("{}: no {name} sample with {has:?} and none of {lacks:?}:\n{text}", H::PROVIDER)
        };
        eprintln!("{}: {line}", H::PROVIDER);
    }
    row.write("pass");
}

/// Adds `conformance::<provider>::metrics` for the harness `$h`.
macro_rules! scenario {
    ($h:ty) => {
        #[tokio::test]
        async fn metrics() {
            $crate::conformance::metrics::metrics::<$h>().await;
        }
    };
}
pub(crate) use scenario;
