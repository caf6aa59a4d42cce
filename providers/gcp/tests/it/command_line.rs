//! GCP's own flags (issue #30) through the manager's parser, on the emulator:
//! `--cloud-provider-gce-lb-src-cidrs` sets the health-check firewalls' source ranges (external
//! Cluster and Local, internal); `--enable-l4-lb-annotations` annotates the Service on a real
//! API server with the resource carrying its traffic; a bad CIDR is refused naming the flag.

use std::sync::Arc;

use ccm_core::cloud::LoadBalancer;
use ccm_core::manager::parse_flags;
use ccm_provider_gcp::client::GceClient;
use ccm_provider_gcp::command_line;
use ccm_provider_gcp::load_balancer::{GceLoadBalancer, L4_HEALTH_CHECK_RANGES, LbOptions, naming};
use ccm_testbed::{ControlPlane, unique_name};
use k8s_openapi::api::core::v1::{Node, Service, ServicePort, ServiceSpec};
use kube::Api;
use kube::api::{DeleteParams, ObjectMeta, PostParams};
use serde_json::Value;

use crate::fixture::{self, Fixture, ZONE_A, ZONE_B};

const CLUSTER_ID: &str = "f1a9f1a9f1a9f1a9";

/// `args` after the program name and `--cloud-provider=gce`, parsed as the binary parses them.
fn options(args: &[&str]) -> Result<LbOptions, String> {
    let ext = ccm_provider_gcp::extensions();
    let argv = ["cloud-controller-manager-gcp", "--cloud-provider=gce"].iter().chain(args);
    parse_flags(&ext, argv).map_err(|e| e.to_string())?;
    command_line::lb_options(ext.parsed.matches().unwrap()).map_err(|e| e.to_string())
}

async fn lbs(f: &Fixture, options: LbOptions) -> GceLoadBalancer {
    let mut g = fixture::global();
    g.node_tags = vec!["k8s-node".into()];
    g.subnetwork_name = Some("subnet-a".into());
    let client = Arc::new(GceClient::new(&g, f.options.clone()).unwrap());
    let lb = GceLoadBalancer::new(client, crate::fixture::timings()).with_options(options);
    lb.set_cluster_id(CLUSTER_ID);
    lb
}

fn service(name: &str, uid: &str, annotations: &[(&str, &str)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            annotations: Some(
                annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port: 80,
                node_port: Some(30080),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

fn nodes() -> Vec<Node> {
    vec![
        fixture::node("node-a", Some(&fixture::provider_id(ZONE_A, "node-a"))),
        fixture::node("node-b", Some(&fixture::provider_id(ZONE_B, "node-b"))),
    ]
}

fn sources(f: &Fixture, firewall: &str) -> Vec<String> {
    let fw = f
        .cloud
        .resources("firewalls")
        .into_iter()
        .find(|r| r["name"] == firewall)
        .unwrap_or_else(|| panic!("no firewall {firewall}"));
    let mut v: Vec<String> = fw["sourceRanges"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    v.sort();
    v
}

#[test]
fn the_defaults_are_upstream_s_and_a_bad_cidr_is_refused_naming_the_flag() {
    let o = options(&[]).unwrap();
    assert_eq!(o.health_check_sources, L4_HEALTH_CHECK_RANGES.map(str::to_string).to_vec());
    assert!(!o.resource_annotations);
    assert!(options(&["--enable-l4-lb-annotations"]).unwrap().resource_annotations);
    assert!(options(&["--enable-l4-lb-annotations=true"]).unwrap().resource_annotations);
    assert!(!options(&["--enable-l4-lb-annotations=false"]).unwrap().resource_annotations);

    let e =
        options(&["--cloud-provider-gce-lb-src-cidrs=10.0.0.0/8,s3cret-not-a-cidr"]).unwrap_err();
    assert!(e.contains("cloud-provider-gce-lb-src-cidrs"), "{e}");
    assert!(e.contains("entry 2 is not a CIDR"), "{e}");
    let e = options(&["--cloud-provider-gce-l7lb-src-cidrs=nope"]).unwrap_err();
    assert!(e.contains("cloud-provider-gce-l7lb-src-cidrs"), "{e}");
    // Upstream refuses the deny firewall without its rollback cleanup.
    let e = options(&["--enable-l4-deny-firewall"]).unwrap_err();
    assert!(e.contains("--enable-l4-deny-firewall-rollback-cleanup"), "{e}");
    options(&["--enable-l4-deny-firewall", "--enable-l4-deny-firewall-rollback-cleanup"]).unwrap();
}

#[tokio::test]
async fn lb_src_cidrs_are_the_health_check_firewalls_sources() {
    let f = fixture::start().await;
    // Host bits are cleared and duplicates folded, as upstream's IPNet set does.
    let o = options(&["--cloud-provider-gce-lb-src-cidrs=192.168.7.9/24,10.9.0.0/16,10.9.1.0/16"])
        .unwrap();
    let want = vec!["10.9.0.0/16".to_string(), "192.168.7.0/24".to_string()];
    assert_eq!(o.health_check_sources, want);
    let lb = lbs(&f, o).await;

    // External, Cluster policy: the shared nodes health check's firewall.
    let web = service("web", "6f7f1b2c-1234-5678-9abc-def012345678", &[]);
    lb.ensure_load_balancer("kubernetes", &web, &nodes()).await.unwrap();
    assert_eq!(sources(&f, &format!("k8s-{CLUSTER_ID}-node-http-hc")), want);
    // The traffic firewall keeps the Service's sources.
    assert_eq!(sources(&f, &naming::firewall("a6f7f1b2c123456789abcdef01234567")), ["0.0.0.0/0"]);

    // External, Local policy: the Service's own health check's firewall.
    let mut local = service("local", "0a0b0c0d-1111-2222-3333-444455556666", &[]);
    let spec = local.spec.as_mut().unwrap();
    spec.external_traffic_policy = Some("Local".into());
    spec.health_check_node_port = Some(31500);
    lb.ensure_load_balancer("kubernetes", &local, &nodes()).await.unwrap();
    assert_eq!(sources(&f, "k8s-a0a0b0c0d11112222333344445555666-http-hc"), want);

    // Internal: the health check's firewall.
    let ilb = service(
        "ilb",
        "7e7e7e7e-0000-1111-2222-333344445555",
        &[("networking.gke.io/load-balancer-type", "Internal")],
    );
    lb.ensure_load_balancer("kubernetes", &ilb, &nodes()).await.unwrap();
    assert_eq!(sources(&f, &format!("k8s-{CLUSTER_ID}-node-hc")), want);
}

fn annotation(s: &Service, key: &str) -> Option<String> {
    s.metadata.annotations.as_ref().and_then(|a| a.get(key)).cloned()
}

#[tokio::test]
async fn l4_lb_annotations_name_the_target_pool_then_the_backend_service() {
    let f = fixture::start().await;
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    let name = unique_name("annotated");
    let mut want = service(&name, "", &[]);
    want.metadata.uid = None;
    let created = services.create(&PostParams::default(), &want).await.unwrap();
    let lb_name = ccm_core::cloud::default_load_balancer_name(&created);

    // Off (upstream's default): nothing written.
    let plain = lbs(&f, options(&[]).unwrap()).await;
    plain.set_kube_client(admin.clone());
    plain.ensure_load_balancer("kubernetes", &created, &nodes()).await.unwrap();
    let s = services.get(&name).await.unwrap();
    assert_eq!(annotation(&s, "networking.gke.io/target-pool"), None);

    // On: the external load balancer's target pool.
    let lb = lbs(&f, options(&["--enable-l4-lb-annotations"]).unwrap()).await;
    lb.set_kube_client(admin.clone());
    lb.ensure_load_balancer("kubernetes", &s, &nodes()).await.unwrap();
    let s = services.get(&name).await.unwrap();
    assert_eq!(annotation(&s, "networking.gke.io/target-pool"), Some(lb_name.clone()));
    assert_eq!(annotation(&s, "networking.gke.io/backend-service"), None);

    // Switched to internal: the backend service, and the target pool's key gone.
    let mut s = s;
    s.metadata
        .annotations
        .get_or_insert_default()
        .insert("networking.gke.io/load-balancer-type".into(), "Internal".into());
    s.metadata.managed_fields = None;
    let s = services.replace(&name, &PostParams::default(), &s).await.unwrap();
    lb.ensure_load_balancer("kubernetes", &s, &nodes()).await.unwrap();
    let s = services.get(&name).await.unwrap();
    let backend: Vec<String> = f
        .cloud
        .resources("backendServices")
        .iter()
        .filter_map(|b| b["name"].as_str().map(str::to_string))
        .collect();
    assert_eq!(backend.len(), 1, "{backend:?}");
    assert_eq!(annotation(&s, "networking.gke.io/backend-service"), Some(backend[0].clone()));
    assert_eq!(annotation(&s, "networking.gke.io/target-pool"), None);

    lb.ensure_load_balancer_deleted("kubernetes", &s).await.unwrap();
    services.delete(&name, &DeleteParams::default()).await.unwrap();
}
