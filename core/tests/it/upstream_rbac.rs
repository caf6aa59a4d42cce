//! The manager's own API calls under upstream's RBAC (issue #30): upstream's ClusterRoles grant
//! `events` in the core group only (create, patch, update) and, for the leader-election Lease,
//! only get/create/update (client-go's LeaseLock; OpenStack's and Azure's roles). Each test
//! binds a user to exactly those rules and counts every 403 answer its client receives.

use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ccm_core::controllers::events::{EventRecorder, publish};
use ccm_core::manager::leader::{Elector, ElectorConfig, HoldOutcome};
use ccm_testbed::fixtures::kubelet_node;
use ccm_testbed::{ControlPlane, Identity, unique_name, wait_for};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event, Node};
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, PolicyRule, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::{ListParams, ObjectMeta, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::events::{EventType, Reporter};
use kube::{Api, Client};
use tokio_util::sync::CancellationToken;

/// The requests a client got 403 for (`METHOD path`).
#[derive(Clone, Default)]
struct Forbidden(Arc<Mutex<Vec<String>>>);

impl Forbidden {
    fn seen(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

impl<S> tower::Layer<S> for Forbidden {
    type Service = CountForbidden<S>;
    fn layer(&self, inner: S) -> CountForbidden<S> {
        CountForbidden { inner, seen: self.clone() }
    }
}

/// Records every 403 answer of the wrapped client service.
#[derive(Clone)]
struct CountForbidden<S> {
    inner: S,
    seen: Forbidden,
}

impl<S, B, R> tower::Service<http::Request<B>> for CountForbidden<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    R: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let what = format!("{} {}", req.method(), req.uri().path());
        let seen = self.seen.clone();
        let answer = self.inner.call(req);
        Box::pin(async move {
            let res = answer.await?;
            if res.status() == http::StatusCode::FORBIDDEN {
                seen.0.lock().unwrap().push(what);
            }
            Ok(res)
        })
    }
}

/// A client authenticated as `user` that records its 403 answers in `forbidden`.
async fn counting_client(cp: &ControlPlane, user: &str, forbidden: &Forbidden) -> Client {
    let json = cp.kubeconfig_json(&Identity::new(user, &[])).unwrap();
    let kubeconfig: Kubeconfig = serde_json::from_value(json).unwrap();
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap();
    kube::client::ClientBuilder::try_from(config).unwrap().with_layer(forbidden).build()
}

fn rule(group: &str, resource: &str, verbs: &[&str]) -> PolicyRule {
    PolicyRule {
        api_groups: Some(vec![group.to_string()]),
        resources: Some(vec![resource.to_string()]),
        verbs: verbs.iter().map(|v| v.to_string()).collect(),
        ..Default::default()
    }
}

fn user_subject(user: &str) -> Subject {
    Subject {
        kind: "User".into(),
        name: user.into(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Default::default()
    }
}

/// Binds `user` cluster-wide to a ClusterRole holding only `rules`.
async fn bind_cluster_role(admin: &Client, user: &str, rules: Vec<PolicyRule>) {
    let name = unique_name("upstream-rbac");
    let meta = ObjectMeta { name: Some(name.clone()), ..Default::default() };
    let role = ClusterRole { metadata: meta.clone(), rules: Some(rules), ..Default::default() };
    Api::<ClusterRole>::all(admin.clone()).create(&PostParams::default(), &role).await.unwrap();
    let binding = ClusterRoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name,
        },
        subjects: Some(vec![user_subject(user)]),
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// Binds `user` in `namespace` to a Role holding only `rules`.
async fn bind_role(admin: &Client, namespace: &str, user: &str, rules: Vec<PolicyRule>) {
    let name = unique_name("upstream-rbac");
    let meta = ObjectMeta {
        name: Some(name.clone()),
        namespace: Some(namespace.into()),
        ..Default::default()
    };
    let role = Role { metadata: meta.clone(), rules: Some(rules) };
    Api::<Role>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let binding = RoleBinding {
        metadata: meta,
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "Role".into(),
            name,
        },
        subjects: Some(vec![user_subject(user)]),
    };
    Api::<RoleBinding>::namespaced(admin.clone(), namespace)
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
}

/// Waits until the authorizer (which sees new bindings through informers) lets `user` do
/// `verb` on `resource` in `namespace`, without making that request as `user` (a 403 there
/// would be counted).
async fn wait_authorized(admin: &Client, user: &str, verb: &str, resource: &str, group: &str) {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let reviews = Api::<SubjectAccessReview>::all(admin.clone());
    let review = SubjectAccessReview {
        spec: SubjectAccessReviewSpec {
            user: Some(user.into()),
            resource_attributes: Some(ResourceAttributes {
                verb: Some(verb.into()),
                resource: Some(resource.into()),
                group: Some(group.into()),
                namespace: Some("kube-system".into()),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    wait_for(&format!("{user} may {verb} {resource}"), Duration::from_secs(30), || async {
        let r = reviews.create(&PostParams::default(), &review).await.ok()?;
        r.status.filter(|s| s.allowed).map(|_| ())
    })
    .await;
}

/// Upstream's roles grant `events` in the core group only: the recorder's events are recorded
/// as core/v1 Events under exactly that grant (no 403), carry the component as
/// `source.component` (so `kubectl get events --field-selector source=<component>` lists
/// them) and `reportingComponent`, show as `deprecatedSource` in the events.k8s.io/v1 view,
/// and a repeat increments `count` on the same Event.
#[tokio::test]
async fn events_are_core_v1_and_recorded_under_a_core_only_events_role() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let user = unique_name("events-only");
    bind_cluster_role(&admin, &user, vec![rule("", "events", &["create", "patch", "update"])])
        .await;
    wait_authorized(&admin, &user, "create", "events", "").await;
    wait_authorized(&admin, &user, "patch", "events", "").await;
    let forbidden = Forbidden::default();
    let client = counting_client(cp, &user, &forbidden).await;

    // An object to report about (cluster-scoped: its events go to "default", as upstream's).
    let node_name = unique_name("events-node");
    let node = Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &kubelet_node(&node_name, "10.0.0.1", "True"))
        .await
        .unwrap();
    // A component name of this run's own, so the field selector finds this test's events only.
    let component = unique_name("service-controller");
    let recorder = EventRecorder::new(
        client.clone(),
        Reporter { controller: component.clone(), instance: Some("host-a".into()) },
    );
    let message = "Ensuring load balancer".to_string();
    let reason = "EnsuringLoadBalancer";
    publish(&recorder, &node, EventType::Normal, reason, "EnsureLoadBalancer", message.clone())
        .await;

    // `kubectl get events -n default --field-selector source=<component>`.
    let events = Api::<Event>::namespaced(admin.clone(), "default");
    let by_source = ListParams::default().fields(&format!("source={component}"));
    let listed = events.list(&by_source).await.unwrap().items;
    assert_eq!(listed.len(), 1, "one event from {component}: {listed:?}");
    let ev = &listed[0];
    assert_eq!(ev.involved_object.name.as_deref(), Some(node_name.as_str()));
    assert_eq!(ev.involved_object.kind.as_deref(), Some("Node"));
    assert_eq!(ev.reason.as_deref(), Some(reason));
    assert_eq!(ev.message.as_deref(), Some(message.as_str()));
    assert_eq!(ev.type_.as_deref(), Some("Normal"));
    assert_eq!(ev.count, Some(1));
    let source = ev.source.clone().unwrap_or_default();
    assert_eq!(source.component.as_deref(), Some(component.as_str()));
    assert_eq!(source.host.as_deref(), Some("host-a"));
    assert_eq!(ev.reporting_component.as_deref(), Some(component.as_str()));
    assert_eq!(ev.reporting_instance.as_deref(), Some("host-a"));
    assert!(ev.first_timestamp.is_some() && ev.last_timestamp.is_some());

    // The events.k8s.io/v1 view of the same Event: deprecatedSource is the core source.
    let name = ev.metadata.name.clone().unwrap();
    let v1: k8s_openapi::api::events::v1::Event =
        Api::namespaced(admin.clone(), "default").get(&name).await.unwrap();
    let deprecated = v1.deprecated_source.and_then(|s| s.component);
    assert_eq!(deprecated.as_deref(), Some(component.as_str()));
    assert_eq!(v1.reporting_controller.as_deref(), Some(component.as_str()));

    // The same message again: the same Event, count 2 (a patch, which the role grants).
    publish(&recorder, &node, EventType::Normal, reason, "EnsureLoadBalancer", message.clone())
        .await;
    let listed = events.list(&by_source).await.unwrap().items;
    assert_eq!(listed.len(), 1, "a repeat is folded into the first Event: {listed:?}");
    assert_eq!(listed[0].metadata.name.as_deref(), Some(name.as_str()));
    assert_eq!(listed[0].count, Some(2), "a repeat increments count");
    // A different message is a new Event.
    publish(&recorder, &node, EventType::Warning, reason, "EnsureLoadBalancer", "other".into())
        .await;
    assert_eq!(events.list(&by_source).await.unwrap().items.len(), 2);

    assert_eq!(forbidden.seen(), Vec::<String>::new(), "403 answers under the core-only role");
    Api::<Node>::all(admin).delete(&node_name, &Default::default()).await.unwrap();
}

/// Upstream's LeaseLock uses only get, create and update, and that is all OpenStack's and
/// Azure's roles grant: under a Role with exactly those verbs, a manager acquires the Lease,
/// renews it for several retry periods and a standby polling it takes it over once it is
/// released, with zero 403 answers (no list or watch).
#[tokio::test]
async fn leader_election_needs_only_get_create_update_on_leases() {
    let cp = ControlPlane::shared().await.unwrap();
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let user = unique_name("lease-only");
    let verbs = ["get", "create", "update"];
    bind_role(&admin, "kube-system", &user, vec![rule("coordination.k8s.io", "leases", &verbs)])
        .await;
    for verb in verbs {
        wait_authorized(&admin, &user, verb, "leases", "coordination.k8s.io").await;
    }
    let forbidden = Forbidden::default();
    let client = counting_client(cp, &user, &forbidden).await;

    let lease_name = unique_name("ccm-lease");
    let retry = Duration::from_millis(500);
    let cfg = |identity: &str| ElectorConfig {
        namespace: "kube-system".into(),
        name: lease_name.clone(),
        identity: identity.into(),
        lease_duration: Duration::from_secs(4),
        renew_deadline: Duration::from_secs(3),
        retry_period: retry,
    };
    let leases = Api::<Lease>::namespaced(admin.clone(), "kube-system");
    let spec = || async { leases.get(&lease_name).await.unwrap().spec.unwrap() };

    let stop = CancellationToken::new();
    // "became leader" is recorded as upstream's LeaseLock does (through the manager's events
    // client, which upstream's roles let create events: here the admin's).
    let recorder = EventRecorder::new(admin.clone(), Reporter::from("cloud-controller-manager"));
    let mut leader = Elector::new(client.clone(), cfg("leader_1")).with_events(recorder);
    assert!(leader.acquire(&stop).await, "the Lease is created and acquired");
    assert_eq!(spec().await.holder_identity.as_deref(), Some("leader_1"));
    let events = Api::<Event>::namespaced(admin.clone(), "kube-system");
    let selector = format!("source=cloud-controller-manager,involvedObject.name={lease_name}");
    let became = wait_for("the LeaderElection event", Duration::from_secs(10), || async {
        let listed = events.list(&ListParams::default().fields(&selector)).await.ok()?;
        listed.items.into_iter().find(|e| e.reason.as_deref() == Some("LeaderElection"))
    })
    .await;
    assert_eq!(became.message.as_deref(), Some("leader_1 became leader"));
    assert_eq!(became.involved_object.kind.as_deref(), Some("Lease"));

    // A standby polls the Lease while the leader renews it.
    let mut standby = Elector::new(client.clone(), cfg("standby_1"));
    let standby_stop = CancellationToken::new();
    let standby_task = {
        let stop = standby_stop.clone();
        tokio::spawn(async move {
            let acquired = standby.acquire(&stop).await;
            (acquired, Instant::now(), standby)
        })
    };

    let hold_stop = CancellationToken::new();
    let holding = {
        let stop = hold_stop.clone();
        tokio::spawn(async move {
            let outcome = leader.hold(&stop).await;
            (outcome, leader)
        })
    };
    // Several periods of renewals: every renewTime seen is newer than the one before.
    let mut renewals = Vec::new();
    let started = Instant::now();
    while renewals.len() < 6 {
        assert!(started.elapsed() < Duration::from_secs(30), "renewals so far: {renewals:?}");
        let s = spec().await;
        assert_eq!(s.holder_identity.as_deref(), Some("leader_1"), "the leader keeps it");
        let renewed = s.renew_time.unwrap().0;
        if renewals.last() != Some(&renewed) {
            renewals.push(renewed);
        }
        tokio::time::sleep(retry / 2).await;
    }
    assert!(!standby_task.is_finished(), "the standby does not lead while the leader renews");

    // An orderly stop releases the Lease; the polling standby takes it at its next poll.
    hold_stop.cancel();
    let (outcome, mut leader) = holding.await.unwrap();
    assert_eq!(outcome, HoldOutcome::Cancelled);
    let released = Instant::now();
    leader.release().await;
    let (acquired, at, _standby) = tokio::time::timeout(Duration::from_secs(10), standby_task)
        .await
        .expect("the standby takes the released Lease")
        .unwrap();
    assert!(acquired);
    let takeover = at.duration_since(released);
    assert!(takeover < retry * 4, "released lock taken within a poll or so: {takeover:?}");
    assert_eq!(spec().await.holder_identity.as_deref(), Some("standby_1"));
    standby_stop.cancel();
    stop.cancel();

    eprintln!(
        "MEASURED lease under get/create/update only: {} renewals seen, released lock taken \
         over after {:.2}s (retry {:?})",
        renewals.len(),
        takeover.as_secs_f64(),
        retry
    );
    assert_eq!(forbidden.seen(), Vec::<String>::new(), "403 answers under the Lease role");
}
