//! Tenant safety (issue #29, HIGH 1): a Service's `...-vpc-lb-name` annotation never hands it
//! a load balancer that this cluster did not create for that very Service. The victim's load
//! balancer is compared as the emulator holds it, before and after each attack.

use ccm_core::cloud::LoadBalancer;
use k8s_openapi::api::core::v1::{Node, Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;
use serde_json::{Value, json};

use crate::fixture::{Fixture, iks_labels, node, provider_for, start};

const LB_NAME: &str = "service.kubernetes.io/ibm-load-balancer-cloud-provider-vpc-lb-name";

fn service(namespace: &str, name: &str, uid: &str, lb_name: Option<&str>, port: i32) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            uid: Some(uid.into()),
            annotations: lb_name.map(|n| [(LB_NAME.to_string(), n.to_string())].into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port,
                node_port: Some(30000 + port % 1000),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

fn nodes() -> Vec<Node> {
    let labels = iks_labels("kube-clus1-default-00000101", "10.240.0.4", "us-south-1");
    vec![node("10.240.0.4", &labels, None, None)]
}

/// Every load balancer as the emulator holds it (listeners, pools and members inline).
async fn lbs(f: &Fixture) -> Vec<Value> {
    crate::fixture::settled_lbs(f).await
}

async fn lb_by_id(f: &Fixture, id: &str) -> Option<Value> {
    lbs(f).await.into_iter().find(|l| l["id"] == id)
}

fn listener_ports(lb: &Value) -> Vec<i64> {
    let mut p: Vec<i64> =
        lb["listeners"].as_array().unwrap().iter().map(|l| l["port"].as_i64().unwrap()).collect();
    p.sort();
    p
}

/// What would count as a change to a victim (its tags, as the emulator keeps them, included).
fn fingerprint(lb: &Value) -> Value {
    json!({
        "name": lb["name"], "hostname": lb["hostname"], "listeners": lb["listeners"],
        "pools": lb["pools"], "subnets": lb["subnets"], "tags": lb["tags"],
    })
}

#[tokio::test]
async fn a_service_naming_another_services_load_balancer_gets_an_error_and_changes_nothing() {
    let f = start().await;
    let lb = f.provider.ibm_load_balancer();
    let victim = service("shop", "web", "0a0a0a0a-1111-2222-3333-444444444444", None, 443);
    crate::fixture::converge(lb, &victim, &nodes()).await;
    let all = lbs(&f).await;
    assert_eq!(all.len(), 1);
    let (id, name, hostname) = (
        all[0]["id"].as_str().unwrap().to_string(),
        all[0]["name"].as_str().unwrap().to_string(),
        all[0]["hostname"].as_str().unwrap().to_string(),
    );
    assert_eq!(listener_ports(&all[0]), [443]);
    let before = fingerprint(&all[0]);

    let victims_address = |s: &Option<k8s_openapi::api::core::v1::LoadBalancerStatus>| {
        s.as_ref()
            .and_then(|s| s.ingress.as_ref())
            .is_some_and(|i| i.iter().any(|i| i.hostname.as_deref() == Some(hostname.as_str())))
    };

    // The attacker's Service in namespace `evil`, port 8080, naming the victim's load
    // balancer by hostname, by name and by ID: each an error naming the annotation.
    for (i, named) in [&hostname, &name, &id].into_iter().enumerate() {
        let uid = format!("e0e0e0e{i}-1111-2222-3333-444444444444");
        let attacker = service("evil", "grab", &uid, Some(named), 8080);
        let got = lb.ensure_load_balancer("k", &attacker, &nodes()).await;
        assert!(
            !victims_address(&got.as_ref().ok().cloned()),
            "naming {named}: the attacker got the victim's load balancer: {got:?}"
        );
        let err = got.expect_err("an error").to_string();
        assert!(err.contains(LB_NAME), "naming {named}: {err}");
        // An update (node changes) finds nothing of the victim's, or is refused: either way
        // the victim is unchanged (checked below).
        let _ = lb.update_load_balancer("k", &attacker, &nodes()).await;
        let status = lb.get_load_balancer("k", &attacker).await.unwrap();
        assert!(
            !victims_address(&status),
            "naming {named}: the victim's address is reported as the attacker's"
        );
        // Deleting the attacker's Service deletes nothing of the victim's.
        let _ = lb.ensure_load_balancer_deleted("k", &attacker).await;
        let now = lb_by_id(&f, &id).await;
        assert!(now.is_some(), "naming {named}: the victim's load balancer was deleted");
        assert_eq!(
            fingerprint(&now.unwrap()),
            before,
            "naming {named}: the victim's load balancer was changed"
        );
    }
    assert_eq!(lbs(&f).await.len(), 1, "nothing was created either");
    // The victim still owns and deletes its load balancer.
    crate::fixture::converge(lb, &victim, &nodes()).await;
    crate::fixture::delete_converged(lb, &victim).await;
    assert!(lbs(&f).await.is_empty());
}

#[tokio::test]
async fn a_load_balancer_the_cluster_did_not_create_is_never_adopted_changed_or_deleted() {
    let f = start().await;
    let lb = f.provider.ibm_load_balancer();
    // Made by someone else in the account (here through the same API key, as an operator
    // or another tool would): a listener on 443.
    let subnet = f.cloud.subnet_id("subnet-1").unwrap();
    let rg = f.cloud.resource_group_id();
    let made = f
        .provider
        .client()
        .create_load_balancer(json!({
            "name": "shared-edge", "is_public": true, "subnets": [{"id": subnet}],
            "resource_group": {"id": rg},
            "pools": [{"name": "tcp-443-30443", "algorithm": "round_robin", "protocol": "tcp",
                "health_monitor": {"delay": 5, "max_retries": 2, "timeout": 2, "type": "tcp"},
                "members": [{"port": 30443, "target": {"address": "10.240.0.9"}}]}],
            "listeners": [{"port": 443, "protocol": "tcp", "default_pool": {"name": "tcp-443-30443"}}],
        }))
        .await
        .unwrap();
    f.cloud.complete_pending();
    let before = fingerprint(&lb_by_id(&f, &made.id).await.unwrap());

    let svc =
        service("evil", "grab", "e1e1e1e1-1111-2222-3333-444444444444", Some("shared-edge"), 8080);
    let err = lb.ensure_load_balancer("k", &svc, &nodes()).await;
    assert!(err.is_err(), "adopted: {err:?}");
    assert!(lb.get_load_balancer("k", &svc).await.unwrap().is_none());
    let _ = lb.ensure_load_balancer_deleted("k", &svc).await;
    let now = lb_by_id(&f, &made.id).await.expect("the foreign load balancer was deleted");
    assert_eq!(fingerprint(&now), before, "the foreign load balancer was changed");
    assert_eq!(lbs(&f).await.len(), 1);

    // Nor is it anybody's orphan.
    let listed = lb.list_cloud_load_balancers("k").await.unwrap();
    let entry = listed.iter().find(|l| l.id == made.id).unwrap();
    assert!(!entry.owned, "{entry:?}");
}

#[tokio::test]
async fn another_clusters_load_balancer_is_never_touched() {
    let f = start().await;
    let other = provider_for(&f, "clus2");
    let theirs = service("default", "web", "0b0b0b0b-1111-2222-3333-444444444444", None, 443);
    crate::fixture::converge(other.ibm_load_balancer(), &theirs, &nodes()).await;
    let all = lbs(&f).await;
    let (id, name) =
        (all[0]["id"].as_str().unwrap().to_string(), all[0]["name"].as_str().unwrap().to_string());
    assert!(name.starts_with("kube-clus2-"), "{name}");
    let before = fingerprint(&all[0]);

    // Our cluster's Service naming it.
    let lb = f.provider.ibm_load_balancer();
    let svc = service("default", "web", "e2e2e2e2-1111-2222-3333-444444444444", Some(&name), 8080);
    assert!(lb.ensure_load_balancer("k", &svc, &nodes()).await.is_err());
    let _ = lb.ensure_load_balancer_deleted("k", &svc).await;
    let now = lb_by_id(&f, &id).await.expect("the other cluster's load balancer was deleted");
    assert_eq!(fingerprint(&now), before);
    // Our inventory does not count it as ours.
    let listed = lb.list_cloud_load_balancers("k").await.unwrap();
    assert!(!listed.iter().find(|l| l.id == id).unwrap().owned);
}

#[tokio::test]
async fn a_load_balancer_created_under_an_annotated_name_is_tagged_managed_and_deleted_by_its_service_only()
 {
    let f = start().await;
    let lb = f.provider.ibm_load_balancer();
    let owner =
        service("shop", "web", "0c0c0c0c-1111-2222-3333-444444444444", Some("shop-edge"), 443);
    let status = crate::fixture::converge(lb, &owner, &nodes()).await;
    let all = lbs(&f).await;
    assert_eq!(all.len(), 1);
    assert_eq!(all[0]["name"], "shop-edge");
    let id = all[0]["id"].as_str().unwrap().to_string();
    assert_eq!(
        f.cloud.load_balancer_tags(&id).unwrap(),
        [
            "ccm-cluster:clus1",
            "ccm-service-uid:0c0c0c0c-1111-2222-3333-444444444444",
            "ccm-service:shop.web"
        ]
    );
    assert_eq!(lb.get_load_balancer("k", &owner).await.unwrap(), Some(status));
    // Its own Service keeps managing it: a port change is applied.
    let moved =
        service("shop", "web", "0c0c0c0c-1111-2222-3333-444444444444", Some("shop-edge"), 8443);
    crate::fixture::converge(lb, &moved, &nodes()).await;
    assert_eq!(listener_ports(&lb_by_id(&f, &id).await.unwrap()), [8443]);
    let before = fingerprint(&lb_by_id(&f, &id).await.unwrap());

    // Another Service of the same cluster naming it: an error naming the annotation and the
    // load balancer; nothing changed; its deletion deletes nothing.
    let other =
        service("evil", "grab", "e3e3e3e3-1111-2222-3333-444444444444", Some("shop-edge"), 80);
    let err = lb.ensure_load_balancer("k", &other, &nodes()).await.unwrap_err().to_string();
    assert!(
        err.contains(LB_NAME) && err.contains("shop-edge") && err.contains("0c0c0c0c"),
        "{err}"
    );
    assert!(lb.update_load_balancer("k", &other, &nodes()).await.is_err());
    assert!(lb.get_load_balancer("k", &other).await.unwrap().is_none());
    crate::fixture::delete_converged(lb, &other).await;
    assert_eq!(fingerprint(&lb_by_id(&f, &id).await.unwrap()), before);

    // Another cluster's Service naming it: the same.
    let clus2 = provider_for(&f, "clus2");
    let theirs =
        service("shop", "web", "0c0c0c0c-1111-2222-3333-444444444444", Some("shop-edge"), 80);
    let err = clus2.ibm_load_balancer().ensure_load_balancer("k", &theirs, &nodes()).await;
    assert!(err.unwrap_err().to_string().contains("belongs to cluster clus1"));
    crate::fixture::delete_converged(clus2.ibm_load_balancer(), &theirs).await;
    assert_eq!(fingerprint(&lb_by_id(&f, &id).await.unwrap()), before);

    // The inventory knows it as ours and whose; the other cluster's does not.
    let listed = lb.list_cloud_load_balancers("k").await.unwrap();
    let entry = listed.iter().find(|l| l.id == id).unwrap();
    assert!(entry.owned);
    assert_eq!(entry.service.as_deref(), Some("shop/web"));
    let theirs_listed = clus2.ibm_load_balancer().list_cloud_load_balancers("k").await.unwrap();
    assert!(!theirs_listed.iter().find(|l| l.id == id).unwrap().owned);
    assert!(clus2.ibm_load_balancer().delete_cloud_load_balancer("k", entry).await.is_err());
    assert!(lb_by_id(&f, &id).await.is_some());

    // Its own Service's deletion deletes it.
    crate::fixture::delete_converged(lb, &moved).await;
    assert!(lbs(&f).await.is_empty());
}

#[tokio::test]
async fn names_of_the_generated_form_are_refused_and_a_failed_tagging_is_finished_on_the_next_sync()
{
    use ccm_emulators::faults::{Fault, FaultRule};
    let f = start().await;
    let lb = f.provider.ibm_load_balancer();
    // Another Service's generated name (which may not exist yet), or another cluster's.
    for reserved in ["kube-clus1-0a0a0a0a111122223333444444444444", "kube-clus9-5e5e5e5e12345678"] {
        let svc =
            service("evil", "grab", "e4e4e4e4-1111-2222-3333-444444444444", Some(reserved), 80);
        let err = lb.ensure_load_balancer("k", &svc, &nodes()).await.unwrap_err().to_string();
        assert!(err.contains("reserved"), "{err}");
        crate::fixture::delete_converged(lb, &svc).await;
    }
    assert!(lbs(&f).await.is_empty(), "nothing was created");

    // Tagging fails after the create: the sync fails, the load balancer exists untagged,
    // and the next sync of the same Service attaches the tags (this process recorded the ID).
    f.server
        .inject(
            FaultRule::new("tagging.tags.attach", Fault::Status { status: 403, body: None })
                .times(1),
        )
        .unwrap();
    let svc = service("shop", "api", "0d0d0d0d-1111-2222-3333-444444444444", Some("api-edge"), 443);
    let err = lb.ensure_load_balancer("k", &svc, &nodes()).await.unwrap_err().to_string();
    assert!(err.contains("ownership tags"), "{err}");
    let id = lbs(&f).await[0]["id"].as_str().unwrap().to_string();
    assert!(f.cloud.load_balancer_tags(&id).unwrap().is_empty());
    // Meanwhile another Service cannot take it.
    let other =
        service("evil", "grab", "e5e5e5e5-1111-2222-3333-444444444444", Some("api-edge"), 80);
    assert!(lb.ensure_load_balancer("k", &other, &nodes()).await.is_err());
    crate::fixture::converge(lb, &svc, &nodes()).await;
    assert_eq!(f.cloud.load_balancer_tags(&id).unwrap().len(), 3);
    // A new process (no record) still recognises it by its tags.
    let fresh = provider_for(&f, "clus1");
    crate::fixture::delete_converged(fresh.ibm_load_balancer(), &svc).await;
    assert!(lbs(&f).await.is_empty());

    // A Global Tagging outage: the ownership of an annotated load balancer cannot be proved,
    // so deleting its Service is an error and nothing is deleted.
    crate::fixture::converge(lb, &svc, &nodes()).await;
    f.server
        .inject(FaultRule::new(
            "tagging.tags.list",
            Fault::Status { status: 404, body: Some("<html>404</html>".into()) },
        ))
        .unwrap();
    assert!(lb.ensure_load_balancer_deleted("k", &svc).await.is_err());
    assert_eq!(lbs(&f).await.len(), 1);
    f.server.admin().clear_faults().await.unwrap();
    crate::fixture::delete_converged(lb, &svc).await;
    assert!(lbs(&f).await.is_empty());
}
