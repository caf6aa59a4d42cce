//! Issue #32 OpenStack item 2 on the emulator (Octavia and Barbican) and the testbed's real
//! kube-apiserver: TLS termination with `loadbalancer.openstack.org/default-tls-container-ref`
//! (or `[LoadBalancer] default-tls-container-ref`): `TERMINATED_HTTPS` listeners naming the
//! Barbican container, HTTP pools, the reference changed in place, TLS removed; the container
//! is read from Barbican first (as upstream): one the user may not read (Barbican ACL, 403) or
//! that does not exist (404) fails the sync with an error naming the annotation and the
//! reference, before any Octavia call; `container-store = external` takes any text.

use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::LoadBalancer;
use ccm_emulators::openstack::OpenStackOptions;
use ccm_emulators::openstack_barbican::{Acl, Barbican};
use ccm_emulators::server::ServerOptions;
use ccm_provider_openstack::config::{Config, LoadBalancerOpts};
use ccm_provider_openstack::load_balancer::{OctaviaLoadBalancer, Timings};
use ccm_testbed::{ControlPlane, unique_name};
use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec,
};
use kube::Api;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

use crate::fixture::{Fixture, fast_options, provider_id, start_with};

const TLS: &str = "loadbalancer.openstack.org/default-tls-container-ref";

const WORLD: &str = r#"
region: RegionOne
zones: [az-1]
networks:
  - { name: private, cidr: 10.0.0.0/16 }
subnets:
  - { name: private-subnet, network: private, zone: az-1, cidr: 10.0.0.0/24 }
instances:
  - { name: node-a, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.11] }
  - { name: node-b, zone: az-1, subnet: private-subnet, private_ips: [10.0.0.12] }
"#;

pub async fn start() -> Fixture {
    let opts = OpenStackOptions { lb_pending: Duration::from_millis(30), ..Default::default() };
    start_with(WORLD, opts, fast_options(), ServerOptions::default()).await
}

pub fn lb_with(f: &Fixture, opts: LoadBalancerOpts) -> OctaviaLoadBalancer {
    let config = Config { load_balancer: opts, ..f.config.clone() };
    let timings = Timings { poll: Duration::from_millis(20), max_wait: Duration::from_secs(20) };
    OctaviaLoadBalancer::new(Arc::clone(&f.client), Arc::new(config), timings)
}

pub fn nodes(f: &Fixture) -> Vec<Node> {
    [("node-a", "10.0.0.11"), ("node-b", "10.0.0.12")]
        .into_iter()
        .map(|(name, ip)| Node {
            metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
            spec: Some(NodeSpec { provider_id: Some(provider_id(f, name)), ..Default::default() }),
            status: Some(NodeStatus {
                addresses: Some(vec![NodeAddress {
                    type_: "InternalIP".into(),
                    address: ip.into(),
                }]),
                ..Default::default()
            }),
        })
        .collect()
}

/// A `type: LoadBalancer` Service `default/<name>` in the real API server, port 443/TCP.
pub async fn api_service(
    client: &kube::Client,
    name: &str,
    annotations: &[(&str, &str)],
) -> Service {
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let s = Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            annotations: Some(
                annotations.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
            ),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port: 443,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    };
    api.create(&PostParams::default(), &s).await.unwrap()
}

async fn annotate(client: &kube::Client, name: &str, value: Option<&str>) -> Service {
    let api: Api<Service> = Api::namespaced(client.clone(), "default");
    let patch = json!({"metadata": {"annotations": {TLS: value}}});
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap()
}

fn listeners(f: &Fixture) -> Vec<Value> {
    f.cloud.objects("listeners")
}

/// A TLS Service gets a `TERMINATED_HTTPS` listener with the Barbican container and an HTTP
/// pool (members on the node port); a new container is set on the same listener; without
/// the annotation the listener is TCP again (re-created: Octavia cannot change a protocol).
#[tokio::test]
async fn a_tls_service_gets_a_terminated_https_listener_with_the_barbican_container() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = start().await;
    let project = f.cloud.project_id();
    let base = f.server.url();
    let first = f.cloud.barbican.add_certificate_container(&project, "u-1", "web", Acl::default());
    let first = Barbican::container_ref(&base, &first);
    let second =
        f.cloud.barbican.add_certificate_container(&project, "u-1", "web-2027", Acl::default());
    let second = Barbican::container_ref(&base, &second);
    let lb = lb_with(&f, LoadBalancerOpts::default());
    lb.set_kube_client(client.clone());
    let ns = nodes(&f);
    let name = unique_name("tls");
    let svc = api_service(&client, &name, &[(TLS, &first)]).await;

    let status = lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    assert!(status.ingress.unwrap()[0].ip.is_some());
    let l = listeners(&f);
    assert_eq!(l.len(), 1, "{l:?}");
    assert_eq!(l[0]["protocol"], "TERMINATED_HTTPS");
    assert_eq!(l[0]["protocol_port"], 443);
    assert_eq!(l[0]["default_tls_container_ref"], first.as_str());
    let pools = f.cloud.objects("pools");
    assert_eq!(pools.len(), 1);
    assert_eq!(pools[0]["protocol"], "HTTP", "TLS ends at the load balancer");
    let node_port = svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port.unwrap();
    let members = f.cloud.objects("members");
    assert_eq!(members.len(), 2);
    assert!(members.iter().all(|m| m["protocol_port"] == node_port));
    // Again: nothing to change.
    let before = f.server.counters();
    lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    let after = f.server.counters();
    assert_eq!(after.get("octavia.listeners.update"), before.get("octavia.listeners.update"));
    assert_eq!(after.get("octavia.listeners.create"), before.get("octavia.listeners.create"));

    // A renewed certificate: the same listener names the new container.
    let svc = annotate(&client, &name, Some(&second)).await;
    lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    let l2 = listeners(&f);
    assert_eq!(l2.len(), 1);
    assert_eq!(l2[0]["id"], l[0]["id"], "updated in place");
    assert_eq!(l2[0]["default_tls_container_ref"], second.as_str());

    // TLS removed: a TCP listener and pool.
    let svc = annotate(&client, &name, None).await;
    lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    let l3 = listeners(&f);
    assert_eq!(l3.len(), 1);
    assert_eq!(l3[0]["protocol"], "TCP");
    assert!(l3[0]["default_tls_container_ref"].is_null(), "{}", l3[0]);
    assert_eq!(f.cloud.objects("pools")[0]["protocol"], "TCP");

    lb.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();
    assert!(f.cloud.objects("loadbalancers").is_empty());
}

/// `[LoadBalancer] default-tls-container-ref` applies to every Service; a secret reference
/// works as a container's does; a container the user may not read (another project's,
/// its ACL naming someone else) is refused by Barbican's read, the error names the
/// annotation and the reference, and nothing is created; with `container-store = external`
/// the reference is not checked by the provider (Octavia still reads it).
#[tokio::test]
async fn the_configured_reference_an_unreadable_container_and_an_external_store() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = start().await;
    let project = f.cloud.project_id();
    let base = f.server.url();
    let secret = f.cloud.barbican.add_secret(&project, "u-1", "web-p12", "opaque", Acl::default());
    let secret = Barbican::secret_ref(&base, &secret);
    let opts = LoadBalancerOpts {
        default_tls_container_ref: secret.clone(),
        ..LoadBalancerOpts::default()
    };
    let lb = lb_with(&f, opts);
    lb.set_kube_client(client.clone());
    let ns = nodes(&f);
    let name = unique_name("tls-cfg");
    let svc = api_service(&client, &name, &[]).await;
    lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    let l = listeners(&f);
    assert_eq!(l[0]["protocol"], "TERMINATED_HTTPS");
    assert_eq!(l[0]["default_tls_container_ref"], secret.as_str());
    lb.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();

    // Another project's container whose ACL does not name our user: Barbican answers 403
    // (our user is an admin of its own project only); the sync fails before Octavia.
    let private = f.cloud.barbican.add_certificate_container(
        "another-project",
        "someone-else",
        "private",
        Acl { project_access: false, users: vec!["a-third-user".into()] },
    );
    let private = Barbican::container_ref(&base, &private);
    let name = unique_name("tls-acl");
    let svc = api_service(&client, &name, &[(TLS, &private)]).await;
    let lbs = f.server.counters().get("octavia.loadbalancers.create");
    let e = lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap_err().to_string();
    assert!(e.contains(TLS) && e.contains(&private), "{e}");
    assert!(e.contains("HTTP 403") && e.contains("Container retrieval attempt not allowed"), "{e}");
    assert!(listeners(&f).is_empty(), "no listener without its certificate");
    assert_eq!(f.server.counters().get("octavia.loadbalancers.create"), lbs, "nothing created");
    // A malformed reference is refused before any cloud call.
    let calls = f.server.counters().get("octavia.loadbalancers.list");
    let bad =
        api_service(&client, &unique_name("tls-bad"), &[(TLS, "https://kms/v1/orders/1")]).await;
    let e = lb.ensure_load_balancer("k8s", &bad, &ns).await.unwrap_err().to_string();
    assert!(e.contains(TLS) && e.contains("orders"), "{e}");
    assert_eq!(f.server.counters().get("octavia.loadbalancers.list"), calls);
    lb.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();
    lb.ensure_load_balancer_deleted("k8s", &bad).await.unwrap();

    // container-store = external: any text passes the provider; Octavia decides.
    let ext = lb_with(
        &f,
        LoadBalancerOpts { container_store: "external".into(), ..LoadBalancerOpts::default() },
    );
    let name = unique_name("tls-ext");
    let svc = api_service(&client, &name, &[(TLS, "vault:tls/web")]).await;
    let e = ext.ensure_load_balancer("k8s", &svc, &ns).await.unwrap_err().to_string();
    assert!(e.contains("Could not retrieve certificate: vault:tls/web"), "{e}");
    ext.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();
    assert!(f.cloud.objects("loadbalancers").is_empty());
}

/// Upstream reads the TLS container before anything else: a reference naming no container
/// (404) or one the CCM's user may not read (ACL, 403) fails the sync with an error naming
/// the annotation and the reference and Barbican's answer (no secret payload is ever read:
/// only the container's metadata), before any Octavia call; a readable container is read
/// once per sync; a container shared with the CCM's user through its ACL is readable.
#[tokio::test]
async fn the_container_is_read_from_barbican_before_any_octavia_call() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let client = cp.admin_client().await.unwrap();
    let f = start().await;
    let base = f.server.url();
    let lb = lb_with(&f, LoadBalancerOpts::default());
    lb.set_kube_client(client.clone());
    let ns = nodes(&f);
    let octavia_calls = |f: &Fixture| -> u64 {
        let c = f.server.counters();
        ["loadbalancers.list", "loadbalancers.create", "listeners.create"]
            .iter()
            .map(|op| c.get(&format!("octavia.{op}")))
            .sum()
    };

    // Missing: a well-formed reference to no container.
    let missing = Barbican::container_ref(&base, "0b5e3c3a-1111-4222-8333-444455556666");
    let svc = api_service(&client, &unique_name("tls-missing"), &[(TLS, &missing)]).await;
    let before = octavia_calls(&f);
    let e = lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap_err().to_string();
    assert!(e.contains(TLS) && e.contains(&missing), "{e}");
    assert!(e.contains("HTTP 404") && e.contains("Secrets container not found"), "{e}");
    assert_eq!(octavia_calls(&f), before, "no Octavia call before the container is read");
    assert!(f.cloud.objects("loadbalancers").is_empty());
    lb.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();

    // Unreadable: another project's container, its ACL naming another user.
    let other = f.cloud.barbican.add_certificate_container(
        "another-project",
        "someone-else",
        "theirs",
        Acl { project_access: false, users: vec!["a-third-user".into()] },
    );
    let other_ref = Barbican::container_ref(&base, &other);
    let svc = api_service(&client, &unique_name("tls-403"), &[(TLS, &other_ref)]).await;
    let e = lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap_err().to_string();
    assert!(e.contains(TLS) && e.contains(&other_ref) && e.contains("HTTP 403"), "{e}");
    assert!(f.cloud.objects("loadbalancers").is_empty());
    lb.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();

    // Shared with the CCM's user through the ACL: read, and the listener names it.
    let me = f.client.project_id().await.unwrap().unwrap_or_default();
    let user = ccm_emulators::openstack::keystone_user_id(ccm_emulators::openstack::DEFAULT_USER);
    let shared = f.cloud.barbican.add_certificate_container(
        "another-project",
        "someone-else",
        "shared",
        Acl { project_access: false, users: vec![user] },
    );
    let shared_ref = Barbican::container_ref(&base, &shared);
    assert_ne!(me, "another-project");
    let svc = api_service(&client, &unique_name("tls-acl-ok"), &[(TLS, &shared_ref)]).await;
    let reads = f.server.counters().get("barbican.containers.get");
    lb.ensure_load_balancer("k8s", &svc, &ns).await.unwrap();
    assert_eq!(f.server.counters().get("barbican.containers.get"), reads + 1, "one read per sync");
    let l = listeners(&f);
    assert_eq!(l.len(), 1);
    assert_eq!(l[0]["default_tls_container_ref"], shared_ref.as_str());
    lb.ensure_load_balancer_deleted("k8s", &svc).await.unwrap();
    assert!(f.cloud.objects("loadbalancers").is_empty());
}
