//! The chart's RBAC and admission policy, as `helm template` renders them
//! (`ccm_testbed::chart`), applied to a real apiserver and checked with its real RBAC
//! authorizer and admission, as the identities the chart binds: the chart's ServiceAccount
//! (in-cluster, through a TokenRequest token), the `system:cloud-controller-manager` user
//! (static manifests; bound only when `rbac.bindCloudControllerManagerUser` asks for it), the
//! CCM's own per-controller ServiceAccounts (`useServiceAccountCredentials`) and Azure's node
//! manager (`nodeManager.enabled`, with a token bound to a Pod on a Node).
//!
//! - the controllers and the manager (leader election) work under it;
//! - by default nothing mints a token; with per-controller credentials the CCM mints tokens
//!   only for its own per-controller accounts, never for kube-controller-manager's
//!   `node-controller`/`service-controller`/`route-controller` (whose bootstrap roles can
//!   delete any Pod; issue #29 MED 8), and each account can make its controller's calls and
//!   nothing of another's;
//! - it reads no Secret, except the one named by `cloudCredentialSecret` (issue #11.2);
//! - the node manager may write only its own Node and only the fields it writes (issue #29
//!   MED 9).
//!
//! Each test starts its own control plane: the RBAC of one chart rendering must not leak
//! into another's checks.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::{CloudProvider, InstanceMetadata};
use ccm_core::controllers::{ControllerConfig, EventsClient, node, node_lifecycle, service};
use ccm_core::manager::flags::Flags;
use ccm_core::names;
use ccm_core::testing::{ScriptedInstance, TestCloud, TestInstances, TestLoadBalancers};
use ccm_testbed::chart;
use ccm_testbed::fixtures::{kubelet_node, load_balancer_service};
use ccm_testbed::{ControlPlane, Identity};
use clap::Parser;
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    Container, Namespace, Node, Pod, PodSpec, Secret, Service, ServiceAccount,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleBinding, RoleRef, Subject};
use kube::api::{
    DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchParams,
};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::{Value, json};

use crate::support::run;

/// The user the chart binds for kubeadm-style static manifests, when asked.
const CCM_USER: &str = "system:cloud-controller-manager";
/// The value that binds [`CCM_USER`].
const BIND_USER: (&str, &str) = ("rbac.bindCloudControllerManagerUser", "true");
/// The value that turns per-controller credentials on.
const SA_CREDENTIALS: (&str, &str) = ("useServiceAccountCredentials", "true");
/// kube-controller-manager's accounts of the controllers' client names (bootstrap roles
/// `system:controller:<name>`).
const KCM_ACCOUNTS: [&str; 3] = ["node-controller", "service-controller", "route-controller"];

/// A control plane with the chart's RBAC applied, and clients for the identities it binds.
struct Installed {
    cp: ControlPlane,
    admin: Client,
    objects: Vec<Value>,
    /// `(who, client)` for the chart's ServiceAccount and, when bound, the user.
    identities: Vec<(String, Client)>,
}

/// Starts a control plane, renders the chart with `values` and applies its RBAC.
async fn install(values: &[(&str, &str)]) -> Installed {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.admin_client().await.unwrap();
    let objects = chart::render(values).expect("helm template renders the chart");
    let applied = chart::apply_rbac(&admin, &objects).await.expect("the chart's RBAC applies");
    assert!(applied.iter().any(|a| a.starts_with("ClusterRoleBinding ")), "{applied:?}");
    let sa = chart::manager_service_account(&objects).expect("the manager's ServiceAccount");
    let (sa_ns, sa_name) = (chart::namespace(sa).unwrap(), chart::name(sa));
    let sa_client = chart::service_account_client(&cp, &admin, sa_ns, sa_name).await.unwrap();
    let mut identities = vec![(format!("ServiceAccount {sa_ns}/{sa_name}"), sa_client)];
    if values.contains(&BIND_USER) {
        let user = cp.client(&Identity::new(CCM_USER, &[])).await.unwrap();
        identities.push((format!("user {CCM_USER}"), user));
    }
    // The authorizer sees new bindings through informers: wait until the identities have
    // what the chart's ClusterRole grants before checking what it must not grant.
    for (who, c) in &identities {
        wait_allowed(who, "list nodes", || async {
            Api::<Node>::all(c.clone()).list(&ListParams::default().limit(1)).await
        })
        .await
        .unwrap_or_else(|e| panic!("{who}: list nodes: {e}"));
    }
    Installed { cp, admin, objects, identities }
}

fn is_forbidden<T>(r: &Result<T, kube::Error>) -> bool {
    matches!(r, Err(kube::Error::Api(s)) if s.code == 403)
}

/// Asserts that `r` is a 403 from the authorizer. (An allowed answer is not printed: it may
/// hold a token or Secret data.)
fn assert_forbidden<T>(who: &str, what: &str, r: Result<T, kube::Error>) {
    let got = match &r {
        Ok(_) => "it was allowed".to_string(),
        Err(e) => e.to_string(),
    };
    assert!(is_forbidden(&r), "{who}: {what} must be forbidden by the chart's RBAC; {got}");
}

/// Polls `f` until it is not a 403 (RBAC changes reach the authorizer through informers), then
/// returns its result.
async fn wait_allowed<T: Debug, F, Fut>(who: &str, what: &str, mut f: F) -> Result<T, kube::Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, kube::Error>>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let r = f().await;
        if !is_forbidden(&r) {
            return r;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{who}: {what} is still forbidden by the chart's RBAC: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn token_request() -> TokenRequest {
    TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(600),
            ..Default::default()
        },
        ..Default::default()
    }
}

fn service_account(name: &str) -> ServiceAccount {
    ServiceAccount {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        ..Default::default()
    }
}

fn secret(name: &str) -> Secret {
    Secret {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        data: Some([("password".to_string(), ByteString(b"hunter2".to_vec()))].into()),
        ..Default::default()
    }
}

/// A Pod as a controller would create it (not run: no kubelet), on `node` if given.
fn pod(name: &str, sa: &str, node: Option<&str>) -> Pod {
    Pod {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(PodSpec {
            service_account_name: Some(sa.into()),
            node_name: node.map(str::to_string),
            containers: vec![Container {
                name: "c".into(),
                image: Some("registry.example/none:1".into()),
                ..Default::default()
            }],
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Who the apiserver says `token` is (TokenReview), `None` if not authenticated.
async fn token_user(admin: &Client, token: String) -> Option<String> {
    let review = Api::<TokenReview>::all(admin.clone())
        .create(
            &PostParams::default(),
            &TokenReview {
                spec: TokenReviewSpec { token: Some(token), ..Default::default() },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    review.status.and_then(|s| s.user).and_then(|u| u.username)
}

/// The client names the controllers use with `--use-service-account-credentials`.
fn client_names() -> BTreeSet<String> {
    ccm_core::controllers::all().iter().map(|c| c.client_name.to_string()).collect()
}

/// The chart's per-controller ServiceAccount (in kube-system) of each client name: the ones it
/// renders, checked to be one per client name and never kube-controller-manager's.
fn chart_controller_accounts(objects: &[Value]) -> Vec<(String, String)> {
    let rendered: BTreeSet<String> = objects
        .iter()
        .filter(|o| {
            chart::kind(o) == "ServiceAccount" && chart::namespace(o) == Some("kube-system")
        })
        .map(|o| chart::name(o).to_string())
        .collect();
    let mut out = Vec::new();
    for client in client_names() {
        let found: Vec<&String> =
            rendered.iter().filter(|n| n.ends_with(&format!("-{client}"))).collect();
        assert_eq!(found.len(), 1, "one rendered ServiceAccount for {client}: {rendered:?}");
        assert!(!KCM_ACCOUNTS.contains(&found[0].as_str()), "{client}: {}", found[0]);
        out.push((client, found[0].clone()));
    }
    out
}

fn role_binding_subject(sa: &str, ns: &str) -> Subject {
    Subject {
        kind: "ServiceAccount".into(),
        name: sa.into(),
        namespace: Some(ns.into()),
        api_group: None,
    }
}

/// Issue #29 MED 8: by default nothing mints a token, and the user
/// `system:cloud-controller-manager` is bound to nothing (any client certificate with that
/// common name would hold the CCM's roles).
#[tokio::test]
async fn by_default_nothing_mints_tokens_and_the_ccm_user_is_not_bound() {
    let chart = install(&[]).await;
    let _logs = chart.cp.log_guard();
    let admin = &chart.admin;
    let system_sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "kube-system");
    for name in KCM_ACCOUNTS {
        system_sas.create(&PostParams::default(), &service_account(name)).await.unwrap();
    }
    for (who, c) in &chart.identities {
        let sas: Api<ServiceAccount> = Api::namespaced(c.clone(), "kube-system");
        for name in KCM_ACCOUNTS {
            assert_forbidden(
                who,
                &format!("create token for kube-system/{name}"),
                sas.create_token_request(name, &PostParams::default(), &token_request()).await,
            );
        }
        assert_forbidden(
            who,
            "create ServiceAccount kube-system/rbac-new",
            sas.create(&PostParams::default(), &service_account("rbac-new")).await,
        );
    }
    assert!(
        !chart.objects.iter().any(|o| o.to_string().contains("serviceaccounts")),
        "no rule about ServiceAccounts or their tokens by default"
    );
    // The user: no binding names it, and the apiserver refuses it what the chart grants.
    assert!(
        !chart.objects.iter().any(|o| o.to_string().contains(CCM_USER)),
        "the chart binds {CCM_USER} by default"
    );
    let user = chart.cp.client(&Identity::new(CCM_USER, &[])).await.unwrap();
    assert_forbidden(
        CCM_USER,
        "list nodes",
        Api::<Node>::all(user.clone()).list(&ListParams::default().limit(1)).await,
    );
    assert_forbidden(
        CCM_USER,
        "get Lease kube-system/cloud-controller-manager",
        Api::<Lease>::namespaced(user, "kube-system").get("cloud-controller-manager").await,
    );
}

/// Issue #29 MED 8 (and #11.1): with per-controller credentials the CCM's identities mint
/// tokens only for the CCM's own per-controller accounts, which are the chart's and bound to
/// nothing else; never for kube-controller-manager's accounts of the same client names, whose
/// bootstrap roles (shown here on the real apiserver) can delete any Pod.
#[tokio::test]
async fn the_ccm_mints_tokens_only_for_its_own_per_controller_accounts() {
    let chart = install(&[SA_CREDENTIALS, BIND_USER]).await;
    let _logs = chart.cp.log_guard();
    let admin = &chart.admin;
    let accounts = chart_controller_accounts(&chart.objects);

    // A ServiceAccount that is cluster-admin, in default; kube-controller-manager's accounts
    // and another of its accounts in kube-system.
    Api::<ServiceAccount>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &service_account("rbac-admin"))
        .await
        .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: ObjectMeta { name: Some("rbac-admin".into()), ..Default::default() },
                role_ref: RoleRef {
                    api_group: "rbac.authorization.k8s.io".into(),
                    kind: "ClusterRole".into(),
                    name: "cluster-admin".into(),
                },
                subjects: Some(vec![role_binding_subject("rbac-admin", "default")]),
            },
        )
        .await
        .unwrap();
    let admin_sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "kube-system");
    for name in KCM_ACCOUNTS.iter().chain(&["generic-garbage-collector"]) {
        admin_sas.create(&PostParams::default(), &service_account(name)).await.unwrap();
    }
    let chart_sa = chart::name(chart::manager_service_account(&chart.objects).unwrap()).to_string();

    for (who, c) in &chart.identities {
        let default_sas: Api<ServiceAccount> = Api::namespaced(c.clone(), "default");
        let system_sas: Api<ServiceAccount> = Api::namespaced(c.clone(), "kube-system");
        // The per-controller accounts: created when missing (they exist: the chart made them,
        // 409), and a token for each, as manager/credentials.rs does.
        for (_, name) in &accounts {
            let created =
                wait_allowed(who, &format!("create ServiceAccount kube-system/{name}"), || {
                    let (api, name) = (system_sas.clone(), name.clone());
                    async move { api.create(&PostParams::default(), &service_account(&name)).await }
                })
                .await;
            let exists = matches!(&created, Err(kube::Error::Api(s)) if s.code == 409);
            assert!(exists, "{who}: kube-system/{name} is the chart's: {created:?}");
            let token = wait_allowed(who, &format!("create token for kube-system/{name}"), || {
                let (api, name) = (system_sas.clone(), name.clone());
                async move {
                    api.create_token_request(&name, &PostParams::default(), &token_request()).await
                }
            })
            .await
            .unwrap_or_else(|e| panic!("{who}: token for kube-system/{name}: {e}"))
            .status
            .map(|s| s.token)
            .unwrap_or_default();
            assert_eq!(
                token_user(admin, token).await,
                Some(format!("system:serviceaccount:kube-system:{name}")),
                "{who}"
            );
        }
        // Any other account, in any namespace: no token. kube-controller-manager's accounts
        // above all (the chart minted those before issue #29), and the cluster-admin one.
        for (api, ns, name) in [
            (&system_sas, "kube-system", "node-controller"),
            (&system_sas, "kube-system", "service-controller"),
            (&system_sas, "kube-system", "route-controller"),
            (&system_sas, "kube-system", "generic-garbage-collector"),
            (&system_sas, "kube-system", chart_sa.as_str()),
            (&default_sas, "default", "rbac-admin"),
            (&default_sas, "default", "default"),
        ] {
            assert_forbidden(
                who,
                &format!("create token for {ns}/{name}"),
                api.create_token_request(name, &PostParams::default(), &token_request()).await,
            );
        }
        // Nor reading or creating ServiceAccounts outside of that.
        assert_forbidden(
            who,
            "create ServiceAccount default/rbac-new",
            default_sas.create(&PostParams::default(), &service_account("rbac-new")).await,
        );
        assert_forbidden(
            who,
            "get ServiceAccount default/rbac-admin",
            default_sas.get("rbac-admin").await,
        );
        assert_forbidden(
            who,
            "list ServiceAccounts everywhere",
            Api::<ServiceAccount>::all(c.clone()).list(&ListParams::default()).await,
        );
    }

    // The chart names exactly its per-controller accounts, one per client name of the code.
    let named: BTreeSet<String> = chart
        .objects
        .iter()
        .filter(|o| chart::kind(o) == "Role")
        .flat_map(|o| o["rules"].as_array().cloned().unwrap_or_default())
        .filter(|r| {
            r["resources"]
                .as_array()
                .is_some_and(|rs| rs.iter().any(|x| x == "serviceaccounts/token"))
        })
        .flat_map(|r| r["resourceNames"].as_array().cloned().unwrap_or_default())
        .filter_map(|n| n.as_str().map(str::to_string))
        .collect();
    let want: BTreeSet<String> = accounts.iter().map(|(_, a)| a.clone()).collect();
    assert_eq!(named, want, "serviceaccounts/token resourceNames in the chart");
    assert!(
        !chart
            .objects
            .iter()
            .any(|o| chart::kind(o) == "ClusterRole" && o.to_string().contains("serviceaccounts")),
        "no cluster-wide ServiceAccount rule"
    );

    // On the real apiserver, no binding but the chart's names the per-controller accounts
    // (no bootstrap role), while kube-controller-manager's accounts do have bootstrap bindings
    // (which is why the chart must never mint their tokens).
    let chart_bindings: BTreeSet<&str> = chart
        .objects
        .iter()
        .filter(|o| matches!(chart::kind(o), "ClusterRoleBinding" | "RoleBinding"))
        .map(chart::name)
        .collect();
    let crbs =
        Api::<ClusterRoleBinding>::all(admin.clone()).list(&ListParams::default()).await.unwrap();
    let rbs = Api::<RoleBinding>::all(admin.clone()).list(&ListParams::default()).await.unwrap();
    let bound_by = |sa: &str| -> Vec<String> {
        let names = |subjects: &Option<Vec<Subject>>| {
            subjects.iter().flatten().any(|s| {
                s.kind == "ServiceAccount"
                    && s.name == sa
                    && s.namespace.as_deref() == Some("kube-system")
            })
        };
        crbs.items
            .iter()
            .filter(|b| names(&b.subjects))
            .filter_map(|b| b.metadata.name.clone())
            .chain(
                rbs.items
                    .iter()
                    .filter(|b| names(&b.subjects))
                    .filter_map(|b| b.metadata.name.clone()),
            )
            .collect()
    };
    for (_, name) in &accounts {
        let foreign: Vec<String> =
            bound_by(name).into_iter().filter(|b| !chart_bindings.contains(b.as_str())).collect();
        assert!(foreign.is_empty(), "kube-system/{name} is also bound by {foreign:?}");
    }
    assert!(
        bound_by("node-controller").iter().any(|b| b == "system:controller:node-controller"),
        "the apiserver's bootstrap policy binds kube-system/node-controller: {:?}",
        bound_by("node-controller")
    );
}

/// Issue #29 MED 8: with per-controller credentials each of the CCM's accounts (its token
/// minted by the CCM's identity, as the manager does) runs its controllers — cloud-node and
/// cloud-node-lifecycle as the node account, service-lb as the service account, the route
/// controller's one call as the route account — and cannot delete or rewrite Pods, read
/// Secrets, mint tokens or make another controller's calls. kube-controller-manager's
/// `node-controller`, for contrast, can delete any Pod.
#[tokio::test]
async fn each_per_controller_account_makes_its_controllers_calls_and_nothing_else() {
    let chart = install(&[SA_CREDENTIALS]).await;
    let _logs = chart.cp.log_guard();
    let admin = chart.admin.clone();
    let (_, ccm) = &chart.identities[0];
    let accounts = chart_controller_accounts(&chart.objects);
    let account = |client: &str| accounts.iter().find(|(c, _)| c == client).unwrap().1.clone();
    let ccm_rt = CcmRuntime::new();
    let mut clients = std::collections::BTreeMap::new();
    for (client, name) in &accounts {
        let sas: Api<ServiceAccount> = Api::namespaced(ccm.clone(), "kube-system");
        let token = wait_allowed("the CCM", &format!("token for {name}"), || {
            let (sas, name) = (sas.clone(), name.clone());
            async move {
                sas.create_token_request(&name, &PostParams::default(), &token_request()).await
            }
        })
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
        clients.insert(client.clone(), ccm_rt.token_client(&chart.cp, &token).await);
    }
    let node_sa = clients["node-controller"].clone();
    let service_sa = clients["service-controller"].clone();
    let route_sa = clients["route-controller"].clone();
    // Events go through the manager's own client (manager/mod.rs events_client).
    let sa = chart::manager_service_account(&chart.objects).unwrap();
    let events = ccm_rt
        .service_account_client(&chart.cp, &admin, chart::namespace(sa).unwrap(), chart::name(sa))
        .await;

    // Wait for the bindings to reach the authorizer.
    for (who, c) in [("node", &node_sa), ("service", &service_sa), ("route", &route_sa)] {
        wait_allowed(who, "list nodes", || async {
            Api::<Node>::all(c.clone()).list(&ListParams::default().limit(1)).await
        })
        .await
        .unwrap();
    }

    // Their controllers run: a Node initialised, a gone one deleted, a load balancer provisioned.
    let instances = Arc::new(TestInstances::batching());
    instances.set(
        "sa-live",
        ScriptedInstance {
            metadata: InstanceMetadata {
                provider_id: "test://sa-live".into(),
                instance_type: "t.small".into(),
                ..Default::default()
            },
            shutdown: false,
        },
    );
    let cloud = TestCloud {
        instances: Some(instances),
        load_balancers: Some(Arc::new(TestLoadBalancers::new())),
        ..Default::default()
    };
    let config = ControllerConfig {
        node_monitor_period: Duration::from_millis(200),
        events_client: Some(EventsClient(events)),
        ..Default::default()
    };
    let _running = {
        let _on_ccm_runtime = ccm_rt.enter();
        (
            run(&node_sa, cloud.clone(), config.clone(), node::start),
            run(&node_sa, cloud.clone(), config.clone(), node_lifecycle::start),
            run(&service_sa, cloud, config, service::start),
        )
    };
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .create(&PostParams::default(), &kubelet_node("sa-live", "10.9.2.1", "True"))
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &kubelet_node("sa-gone", "10.9.2.2", "False"))
        .await
        .unwrap();
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    services
        .create(&PostParams::default(), &load_balancer_service("default", "sa-lb", 80))
        .await
        .unwrap();
    ccm_testbed::wait_for(
        "as the per-controller accounts: sa-live initialised, sa-gone deleted, sa-lb provisioned",
        Duration::from_secs(60),
        || {
            let (nodes, services) = (nodes.clone(), services.clone());
            async move {
                let live = nodes.get("sa-live").await.ok()?.spec?;
                let tainted = live
                    .taints
                    .unwrap_or_default()
                    .iter()
                    .any(|t| t.key == names::TAINT_UNINITIALIZED);
                let initialised = live.provider_id.as_deref() == Some("test://sa-live") && !tainted;
                let gone = nodes.get_opt("sa-gone").await.ok()?.is_none();
                let ingress = services.get("sa-lb").await.ok()?.status?.load_balancer?.ingress;
                (initialised && gone && ingress.is_some_and(|i| !i.is_empty())).then_some(())
            }
        },
    )
    .await;
    // The route controller's one write: NetworkUnavailable on a Node's status.
    let condition = json!({"status": {"conditions": [{
        "type": "NetworkUnavailable", "status": "False", "reason": "RouteCreated",
        "message": "RouteController created a route",
    }]}});
    Api::<Node>::all(route_sa.clone())
        .patch_status("sa-live", &PatchParams::default(), &Patch::Strategic(&condition))
        .await
        .expect("the route account patches a Node's status");

    // What none of them may do. A Pod and a Secret to aim at.
    Api::<ServiceAccount>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &service_account("victim"))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(admin.clone(), "default");
    let pod = pods.create(&PostParams::default(), &pod("victim", "victim", None)).await.unwrap();
    Api::<Secret>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &secret("rbac-other"))
        .await
        .unwrap();
    for (client, c) in &clients {
        let who = account(client);
        let pods: Api<Pod> = Api::namespaced(c.clone(), "default");
        assert_forbidden(
            &who,
            "delete pod default/victim",
            pods.delete("victim", &DeleteParams::default()).await,
        );
        assert_forbidden(
            &who,
            "update pods/status default/victim",
            pods.replace_status("victim", &PostParams::default(), &pod).await,
        );
        assert_forbidden(
            &who,
            "patch pods/status default/victim",
            pods.patch_status(
                "victim",
                &PatchParams::default(),
                &Patch::Merge(&json!({"status": {"phase": "Failed"}})),
            )
            .await,
        );
        assert_forbidden(
            &who,
            "list pods everywhere",
            Api::<Pod>::all(c.clone()).list(&ListParams::default()).await,
        );
        assert_forbidden(
            &who,
            "list Secrets everywhere",
            Api::<Secret>::all(c.clone()).list(&ListParams::default()).await,
        );
        assert_forbidden(
            &who,
            "get Secret kube-system/rbac-other",
            Api::<Secret>::namespaced(c.clone(), "kube-system").get("rbac-other").await,
        );
        for (_, other) in &accounts {
            assert_forbidden(
                &who,
                &format!("create token for kube-system/{other}"),
                Api::<ServiceAccount>::namespaced(c.clone(), "kube-system")
                    .create_token_request(other, &PostParams::default(), &token_request())
                    .await,
            );
        }
    }
    // Each only its own controller's calls.
    let label = Patch::Merge(json!({"metadata": {"labels": {"rbac": "x"}}}));
    for (client, c) in [("service-controller", &service_sa), ("route-controller", &route_sa)] {
        let who = account(client);
        let nodes: Api<Node> = Api::all(c.clone());
        assert_forbidden(
            &who,
            "patch node sa-live",
            nodes.patch("sa-live", &PatchParams::default(), &label).await,
        );
        assert_forbidden(
            &who,
            "delete node sa-live",
            nodes.delete("sa-live", &DeleteParams::default()).await,
        );
    }
    assert_forbidden(
        &account("service-controller"),
        "patch nodes/status sa-live",
        Api::<Node>::all(service_sa.clone())
            .patch_status("sa-live", &PatchParams::default(), &Patch::Strategic(&condition))
            .await,
    );
    let lb_status =
        Patch::Merge(json!({"status": {"loadBalancer": {"ingress": [{"ip": "192.0.2.1"}]}}}));
    for (client, c) in [("node-controller", &node_sa), ("route-controller", &route_sa)] {
        let who = account(client);
        let services: Api<Service> = Api::namespaced(c.clone(), "default");
        assert_forbidden(
            &who,
            "patch services/status sa-lb",
            services.patch_status("sa-lb", &PatchParams::default(), &lb_status).await,
        );
        assert_forbidden(&who, "list services", services.list(&ListParams::default()).await);
    }

    // For contrast: kube-controller-manager's node-controller, which the chart minted tokens
    // for before issue #29, may delete any Pod (bootstrap role system:controller:node-controller).
    let kcm = Api::<ServiceAccount>::namespaced(admin.clone(), "kube-system");
    kcm.create(&PostParams::default(), &service_account("node-controller")).await.unwrap();
    let token = kcm
        .create_token_request("node-controller", &PostParams::default(), &token_request())
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let kcm_client =
        chart::token_client(&chart.cp, "kube-system/node-controller", &token).await.unwrap();
    Api::<Pod>::namespaced(kcm_client, "default")
        .delete("victim", &DeleteParams::default())
        .await
        .expect("kube-controller-manager's node-controller deletes any Pod");
}

/// Default values (the manager's own credentials for every controller), run as the user
/// `system:cloud-controller-manager` bound on request: cloud-node initialises a Node and
/// cloud-node-lifecycle deletes one whose instance is gone.
#[tokio::test]
async fn node_controllers_work_under_the_chart_cluster_role() {
    let chart = install(&[BIND_USER]).await;
    let _logs = chart.cp.log_guard();
    let admin = chart.admin.clone();
    let ccm_rt = CcmRuntime::new();
    let ccm = ccm_rt.client(&chart.cp, CCM_USER).await;
    let instances = Arc::new(TestInstances::batching());
    instances.set(
        "rbac-live",
        ScriptedInstance {
            metadata: InstanceMetadata {
                provider_id: "test://rbac-live".into(),
                instance_type: "t.small".into(),
                ..Default::default()
            },
            shutdown: false,
        },
    );
    let config =
        ControllerConfig { node_monitor_period: Duration::from_millis(200), ..Default::default() };
    let cloud = TestCloud::with_instances(instances);
    let (_node, _lifecycle) = {
        let _on_ccm_runtime = ccm_rt.enter();
        (
            run(&ccm, cloud.clone(), config.clone(), node::start),
            run(&ccm, cloud, config, node_lifecycle::start),
        )
    };

    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .create(&PostParams::default(), &kubelet_node("rbac-live", "10.9.0.1", "True"))
        .await
        .unwrap();
    nodes
        .create(&PostParams::default(), &kubelet_node("rbac-gone", "10.9.0.2", "False"))
        .await
        .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let live = nodes.get("rbac-live").await.unwrap();
        let initialised = live.spec.as_ref().and_then(|s| s.provider_id.as_deref())
            == Some("test://rbac-live")
            && !live
                .spec
                .as_ref()
                .and_then(|s| s.taints.as_ref())
                .is_some_and(|ts| ts.iter().any(|t| t.key == names::TAINT_UNINITIALIZED));
        let gone_deleted = nodes.get_opt("rbac-gone").await.unwrap().is_none();
        if initialised && gone_deleted {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "under the chart's role: initialised={initialised}, gone node deleted={gone_deleted}; \
             see the apiserver log for 403s"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Issue #11.2, default values: no Secret can be listed, watched or read.
#[tokio::test]
async fn the_chart_identity_reads_no_secret_by_default() {
    let chart = install(&[BIND_USER]).await;
    let _logs = chart.cp.log_guard();
    for ns in ["default", "kube-system"] {
        Api::<Secret>::namespaced(chart.admin.clone(), ns)
            .create(&PostParams::default(), &secret("rbac-other"))
            .await
            .unwrap();
    }
    for (who, c) in &chart.identities {
        assert_forbidden(
            who,
            "list Secrets everywhere",
            Api::<Secret>::all(c.clone()).list(&ListParams::default()).await,
        );
        assert_forbidden(
            who,
            "watch Secrets everywhere",
            Api::<Secret>::all(c.clone()).watch(&WatchParams::default(), "0").await.map(drop),
        );
        for ns in ["default", "kube-system"] {
            let api: Api<Secret> = Api::namespaced(c.clone(), ns);
            assert_forbidden(
                who,
                &format!("list Secrets in {ns}"),
                api.list(&ListParams::default()).await,
            );
            assert_forbidden(
                who,
                &format!("watch Secrets in {ns}"),
                api.watch(&WatchParams::default(), "0").await.map(drop),
            );
            assert_forbidden(
                who,
                &format!("get Secret {ns}/rbac-other"),
                api.get("rbac-other").await,
            );
        }
    }
    // And no rule of the chart mentions them.
    assert!(
        !chart.objects.iter().any(|o| o.to_string().contains("\"secrets\"")),
        "no rule mentions Secrets by default"
    );
}

/// Issue #11.2 with `cloudCredentialSecret` set (vSphere's `secretName`): `get` on exactly that
/// Secret, nothing else.
#[tokio::test]
async fn the_chart_identity_gets_only_the_configured_credential_secret() {
    let chart = install(&[
        BIND_USER,
        ("cloudCredentialSecret.name", "vsphere-creds"),
        ("cloudCredentialSecret.namespace", "vmware-system"),
    ])
    .await;
    let _logs = chart.cp.log_guard();
    let namespaces: Api<Namespace> = Api::all(chart.admin.clone());
    let ns = Namespace {
        metadata: ObjectMeta { name: Some("vmware-system".into()), ..Default::default() },
        ..Default::default()
    };
    match namespaces.create(&PostParams::default(), &ns).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {} // created with the chart's Role
        Err(e) => panic!("creating namespace vmware-system: {e}"),
    }
    for (ns, name) in [
        ("vmware-system", "vsphere-creds"),
        ("vmware-system", "rbac-other"),
        ("kube-system", "vsphere-creds"),
        ("default", "vsphere-creds"),
    ] {
        Api::<Secret>::namespaced(chart.admin.clone(), ns)
            .create(&PostParams::default(), &secret(name))
            .await
            .unwrap();
    }
    for (who, c) in &chart.identities {
        let creds: Api<Secret> = Api::namespaced(c.clone(), "vmware-system");
        let got = wait_allowed(who, "get Secret vmware-system/vsphere-creds", || {
            creds.get("vsphere-creds")
        })
        .await
        .unwrap_or_else(|e| panic!("{who}: get vmware-system/vsphere-creds: {e}"));
        assert_eq!(got.data.unwrap_or_default()["password"].0, b"hunter2");
        assert_forbidden(who, "get Secret vmware-system/rbac-other", creds.get("rbac-other").await);
        assert_forbidden(
            who,
            "list Secrets in vmware-system",
            creds.list(&ListParams::default()).await,
        );
        assert_forbidden(
            who,
            "watch Secrets in vmware-system",
            creds.watch(&WatchParams::default(), "0").await.map(drop),
        );
        for ns in ["kube-system", "default"] {
            assert_forbidden(
                who,
                &format!("get Secret {ns}/vsphere-creds"),
                Api::<Secret>::namespaced(c.clone(), ns).get("vsphere-creds").await,
            );
        }
        assert_forbidden(
            who,
            "list Secrets everywhere",
            Api::<Secret>::all(c.clone()).list(&ListParams::default()).await,
        );
    }
}

/// The manager itself under the chart's RBAC, as the chart runs it by default: as the chart's
/// ServiceAccount, leader election in kube-system, every controller with the manager's own
/// credentials (`--use-service-account-credentials=false`): no per-controller account is
/// created and no token minted (issue #29 MED 8: it minted kube-controller-manager's).
#[tokio::test]
async fn the_manager_runs_under_the_chart_rbac_as_its_own_service_account() {
    let chart = install(&[]).await;
    let _logs = chart.cp.log_guard();
    let admin = chart.admin.clone();
    let dir = std::env::temp_dir().join(ccm_testbed::unique_name("ccm-rbac-manager"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("ccm.kubeconfig");
    let sa = chart::manager_service_account(&chart.objects).unwrap();
    let json = chart::service_account_kubeconfig(
        &chart.cp,
        &admin,
        chart::namespace(sa).unwrap(),
        chart::name(sa),
    )
    .await
    .unwrap();
    std::fs::write(&kubeconfig, serde_json::to_string(&json).unwrap()).unwrap();

    let instances = Arc::new(TestInstances::batching());
    instances.set(
        "rbac-mgr",
        ScriptedInstance {
            metadata: InstanceMetadata {
                provider_id: "test://rbac-mgr".into(),
                instance_type: "t.small".into(),
                ..Default::default()
            },
            shutdown: false,
        },
    );
    let lbs = Arc::new(TestLoadBalancers::new());
    let cloud =
        TestCloud { instances: Some(instances), load_balancers: Some(lbs), ..Default::default() };
    let flags = Flags::try_parse_from([
        "cloud-controller-manager-test".to_string(),
        "--cloud-provider=test".into(),
        format!("--kubeconfig={}", kubeconfig.display()),
        "--use-service-account-credentials=false".into(),
        "--controllers=cloud-node,service".into(),
        "--leader-elect=true".into(),
        "--leader-elect-resource-namespace=kube-system".into(),
        "--leader-elect-resource-name=cloud-controller-manager".into(),
        "--secure-port=0".into(),
        "--webhook-secure-port=0".into(),
    ])
    .expect("flags parse");
    let options = flags.validate("test", &ccm_core::controllers::all()).expect("flags validate");
    let factory: ccm_core::manager::CloudFactory =
        Box::new(move |_| Ok(Arc::new(cloud) as Arc<dyn CloudProvider>));
    // Why the manager ended, if it did: every wait below fails fast with it.
    let exited = Arc::new(std::sync::Mutex::new(None::<String>));
    let record = exited.clone();
    let ccm_rt = CcmRuntime::new();
    ccm_rt.spawn(async move {
        let r = ccm_core::manager::run("test", options, factory).await;
        *record.lock().unwrap() = Some(format!("{r:?}"));
    });
    let alive = move || {
        if let Some(why) = exited.lock().unwrap().clone() {
            panic!("the manager ended under the chart's RBAC: {why}");
        }
    };

    // The Lease is taken in kube-system (leader.rs, under the chart's leader-election Role).
    let leases: Api<Lease> = Api::namespaced(admin.clone(), "kube-system");
    let held = |leases: Api<Lease>| async move {
        let spec = leases.get_opt("cloud-controller-manager").await.ok()??.spec?;
        spec.holder_identity.as_ref().filter(|h| !h.is_empty())?;
        spec.renew_time
    };
    let first =
        ccm_testbed::wait_for("the manager holds its Lease", Duration::from_secs(60), || {
            alive();
            held(leases.clone())
        })
        .await;
    // ... and renews it (an update of that Lease).
    ccm_testbed::wait_for("the manager renews its Lease", Duration::from_secs(60), || {
        alive();
        let (leases, first) = (leases.clone(), first.clone());
        async move { held(leases).await.filter(|t| *t != first) }
    })
    .await;
    // cloud-node, acting as the chart's ServiceAccount, initialises a Node.
    let nodes: Api<Node> = Api::all(admin.clone());
    nodes
        .create(&PostParams::default(), &kubelet_node("rbac-mgr", "10.9.1.1", "True"))
        .await
        .unwrap();
    ccm_testbed::wait_for("cloud-node initialises rbac-mgr", Duration::from_secs(60), || {
        alive();
        let nodes = nodes.clone();
        async move {
            let n = nodes.get("rbac-mgr").await.ok()?;
            let spec = n.spec?;
            let tainted =
                spec.taints.unwrap_or_default().iter().any(|t| t.key == names::TAINT_UNINITIALIZED);
            (spec.provider_id.as_deref() == Some("test://rbac-mgr") && !tainted).then_some(())
        }
    })
    .await;
    // service-lb, acting as the chart's ServiceAccount, provisions a load balancer.
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    services
        .create(&PostParams::default(), &load_balancer_service("default", "rbac-lb", 80))
        .await
        .unwrap();
    ccm_testbed::wait_for(
        "service-lb sets the ingress of rbac-lb",
        Duration::from_secs(60),
        || {
            alive();
            let services = services.clone();
            async move {
                let svc = services.get("rbac-lb").await.ok()?;
                let ingress = svc.status?.load_balancer?.ingress?;
                (!ingress.is_empty()).then_some(())
            }
        },
    )
    .await;
    // No per-controller account was created: kube-controller-manager's least of all.
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "kube-system");
    for name in KCM_ACCOUNTS {
        assert!(sas.get_opt(name).await.unwrap().is_none(), "kube-system/{name} created");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// A write refused by the node manager's ValidatingAdmissionPolicy (not by RBAC): its message
/// names the policy's reason.
fn refused_by_policy<T>(r: &Result<T, kube::Error>) -> Option<String> {
    match r {
        Err(kube::Error::Api(s)) if s.message.contains("ValidatingAdmissionPolicy") => {
            Some(s.message.clone())
        }
        _ => None,
    }
}

fn assert_refused<T>(what: &str, r: Result<T, kube::Error>) {
    let got = match &r {
        Ok(_) => "it was allowed".to_string(),
        Err(e) => e.to_string(),
    };
    assert!(
        refused_by_policy(&r).is_some(),
        "the node manager: {what} must be refused by its admission policy; {got}"
    );
}

/// Issue #29 MED 9: Azure's node manager (`nodeManager.enabled`) holds update/patch on every
/// Node through RBAC, but its ValidatingAdmissionPolicy lets a token bound to a Pod on Node A
/// make exactly node_manager.rs's writes on A (status addresses, the NetworkUnavailable
/// condition, the initialising update: providerID, topology labels, the uninitialized taint
/// lifted; the GA-label patch) and refuses them on Node B, every other field of A, and every
/// Node to a token bound to no Pod.
#[tokio::test]
async fn the_node_managers_token_writes_only_its_own_nodes_fields() {
    let cp = ControlPlane::start().await.expect("control plane");
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let objects = chart::render(&[("provider", "azure"), ("nodeManager.enabled", "true")])
        .expect("helm template renders the chart with the node manager");
    chart::apply_rbac(&admin, &objects).await.expect("the chart's RBAC applies");
    let policy: Vec<Value> = objects
        .iter()
        .filter(|o| chart::kind(o).starts_with("ValidatingAdmissionPolicy"))
        .cloned()
        .collect();
    assert_eq!(policy.len(), 2, "a policy and its binding");
    chart::apply(&admin, &policy).await.expect("the admission policy applies");
    let sa = objects
        .iter()
        .find(|o| chart::kind(o) == "ServiceAccount" && chart::name(o).ends_with("-node-manager"))
        .expect("the node manager's ServiceAccount");
    let (ns, sa) = (chart::namespace(sa).unwrap().to_string(), chart::name(sa).to_string());

    // Nodes A and B as kubelets register them: uninitialized, plus a taint and a label of their own.
    let nodes: Api<Node> = Api::all(admin.clone());
    for (name, ip) in [("vap-a", "10.9.3.1"), ("vap-b", "10.9.3.2")] {
        let mut n = kubelet_node(name, ip, "True");
        n.metadata.labels = Some([("team".to_string(), "a".to_string())].into());
        n.spec.as_mut().unwrap().taints.as_mut().unwrap().push(k8s_openapi::api::core::v1::Taint {
            key: "example.com/dedicated".into(),
            value: Some("db".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        });
        nodes.create(&PostParams::default(), &n).await.unwrap();
    }
    // The node manager's pod on A, and the token the kubelet would project into it.
    let pod = Api::<Pod>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &pod("node-manager-a", &sa, Some("vap-a")))
        .await
        .unwrap();
    let bound = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(600),
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: pod.metadata.name.clone(),
                uid: pod.metadata.uid.clone(),
            }),
        },
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), &ns)
        .create_token_request(&sa, &PostParams::default(), &bound)
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let review = Api::<TokenReview>::all(admin.clone())
        .create(
            &PostParams::default(),
            &TokenReview {
                spec: TokenReviewSpec { token: Some(token.clone()), ..Default::default() },
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let extra = review.status.and_then(|s| s.user).and_then(|u| u.extra).unwrap_or_default();
    assert_eq!(
        extra.get("authentication.kubernetes.io/node-name"),
        Some(&vec!["vap-a".to_string()]),
        "a token bound to a Pod on vap-a names the node: {extra:?}"
    );
    let manager = chart::token_client(&cp, "the node manager on vap-a", &token).await.unwrap();
    let mine: Api<Node> = Api::all(manager.clone());
    let pp = PatchParams::default();

    // Wait until RBAC and the policy are in force (both reach the apiserver through
    // informers): a dry-run write of B's labels (admitted, never stored) is refused by the
    // policy.
    let zone = Patch::Merge(json!({"metadata": {"labels": {(names::LABEL_ZONE): "westeurope-1"}}}));
    let dry_run = PatchParams { dry_run: true, ..Default::default() };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let r = mine.patch("vap-b", &dry_run, &zone).await;
        if let Some(message) = refused_by_policy(&r) {
            assert!(message.contains("only the Node its token is bound to (vap-a)"), "{message}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the node manager's admission policy is not in force: {r:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_refused("a label of vap-b", mine.patch("vap-b", &pp, &zone).await);

    // What node_manager.rs writes, on its own Node: allowed.
    let addresses = json!({"status": {"addresses": [
        {"type": "Hostname", "address": "vap-a"},
        {"type": "InternalIP", "address": "10.9.3.1"},
        {"type": "ExternalIP", "address": "203.0.113.9"},
    ]}});
    mine.patch_status("vap-a", &pp, &Patch::Merge(&addresses))
        .await
        .expect("status.addresses of vap-a");
    let unavailable = json!({"status": {"conditions": [{
        "type": "NetworkUnavailable", "status": "True", "reason": "NoRouteCreated",
        "message": "Node created without a route",
    }]}});
    mine.patch_status("vap-a", &pp, &Patch::Strategic(&unavailable))
        .await
        .expect("NetworkUnavailable of vap-a (--wait-routes)");
    let mut a = mine.get("vap-a").await.unwrap();
    let labels = a.metadata.labels.get_or_insert_with(Default::default);
    for (k, v) in [
        (names::LABEL_INSTANCE_TYPE, "Standard_D2s_v3"),
        (names::LABEL_INSTANCE_TYPE_BETA, "Standard_D2s_v3"),
        (names::LABEL_ZONE, "westeurope-1"),
        (names::LABEL_REGION, "westeurope"),
        ("topology.kubernetes.azure.com/sub-fault-domain", "0"),
    ] {
        labels.insert(k.into(), v.into());
    }
    let spec = a.spec.get_or_insert_with(Default::default);
    spec.provider_id = Some("azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/vap-a".into());
    spec.taints.as_mut().unwrap().retain(|t| t.key != names::TAINT_UNINITIALIZED);
    a.status = None;
    let a = mine
        .replace("vap-a", &PostParams::default(), &a)
        .await
        .expect("initialising vap-a (update)");
    mine.patch("vap-a", &pp, &Patch::Merge(json!({"metadata": {"labels": {(names::LABEL_ZONE_BETA): "westeurope-1", (names::LABEL_REGION_BETA): "westeurope"}}})))
        .await
        .expect("the GA/beta topology labels of vap-a (patch)");
    assert!(a.spec.unwrap().taints.unwrap().iter().any(|t| t.key == "example.com/dedicated"));

    // Node B: nothing.
    assert_refused(
        "status.addresses of vap-b",
        mine.patch_status("vap-b", &pp, &Patch::Merge(&addresses)).await,
    );
    let mut b = mine.get("vap-b").await.unwrap();
    b.spec
        .as_mut()
        .unwrap()
        .taints
        .as_mut()
        .unwrap()
        .retain(|t| t.key != names::TAINT_UNINITIALIZED);
    b.status = None;
    assert_refused(
        "the uninitialized taint of vap-b",
        mine.replace("vap-b", &PostParams::default(), &b).await,
    );

    // Node A, other fields: refused.
    for (what, patch) in [
        (
            "another label",
            json!({"metadata": {"labels": {"node-role.kubernetes.io/control-plane": ""}}}),
        ),
        ("an existing label changed", json!({"metadata": {"labels": {"team": "b"}}})),
        ("a label removed", json!({"metadata": {"labels": {"team": null}}})),
        ("an annotation", json!({"metadata": {"annotations": {"example.com/x": "y"}}})),
        ("unschedulable", json!({"spec": {"unschedulable": true}})),
        (
            "the podCIDR",
            json!({"spec": {"podCIDR": "10.244.9.0/24", "podCIDRs": ["10.244.9.0/24"]}}),
        ),
        ("another taint removed", json!({"spec": {"taints": []}})),
    ] {
        assert_refused(
            &format!("{what} on vap-a"),
            mine.patch("vap-a", &pp, &Patch::Merge(&patch)).await,
        );
    }
    for (what, patch) in [
        (
            "the Ready condition",
            json!({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "Evil"}]}}),
        ),
        ("the capacity", json!({"status": {"capacity": {"pods": "1000"}}})),
        ("a label through status", json!({"metadata": {"labels": {"evil": "x"}}})),
    ] {
        assert_refused(
            &format!("{what} on vap-a"),
            mine.patch_status("vap-a", &pp, &Patch::Strategic(&patch)).await,
        );
    }
    // A taint added (every taint kept, one more).
    let mut a = mine.get("vap-a").await.unwrap();
    a.spec.as_mut().unwrap().taints.as_mut().unwrap().push(k8s_openapi::api::core::v1::Taint {
        key: "example.com/evict".into(),
        value: None,
        effect: "NoExecute".into(),
        time_added: None,
    });
    a.status = None;
    assert_refused(
        "a taint added to vap-a",
        mine.replace("vap-a", &PostParams::default(), &a).await,
    );
    // The providerID once set (the apiserver's own validation refuses it too).
    let other = json!({"spec": {"providerID": "azure:///subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachines/other"}});
    assert!(
        mine.patch("vap-a", &pp, &Patch::Merge(&other)).await.is_err(),
        "the node manager changed vap-a's providerID"
    );
    // RBAC: no delete, no create.
    assert_forbidden(
        "the node manager",
        "delete node vap-b",
        mine.delete("vap-b", &DeleteParams::default()).await,
    );
    assert_forbidden(
        "the node manager",
        "create a Node",
        mine.create(&PostParams::default(), &kubelet_node("vap-new", "10.9.3.3", "True")).await,
    );

    // A token of the same ServiceAccount bound to no Pod names no node: no Node at all.
    let unbound = Api::<ServiceAccount>::namespaced(admin.clone(), &ns)
        .create_token_request(&sa, &PostParams::default(), &token_request())
        .await
        .unwrap()
        .status
        .unwrap()
        .token;
    let unbound =
        chart::token_client(&cp, "the node manager's unbound token", &unbound).await.unwrap();
    assert_refused(
        "status.addresses of vap-a with a token bound to no Pod",
        Api::<Node>::all(unbound).patch_status("vap-a", &pp, &Patch::Merge(&addresses)).await,
    );
}

/// A runtime of its own for what runs as the CCM (controllers, the manager, their clients).
/// Dropped before the control plane (declare it after), it ends every CCM task and
/// connection at once: an apiserver stopped with the CCM's watches still open waits up to a
/// minute for them.
struct CcmRuntime(Option<tokio::runtime::Runtime>);

impl CcmRuntime {
    fn new() -> Self {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .expect("a runtime for the CCM");
        CcmRuntime(Some(rt))
    }

    fn handle(&self) -> &tokio::runtime::Handle {
        self.0.as_ref().expect("runtime present until dropped").handle()
    }

    /// While the guard lives, `tokio::spawn` (and kube clients built) run on this runtime.
    fn enter(&self) -> tokio::runtime::EnterGuard<'_> {
        self.handle().enter()
    }

    fn spawn<F: std::future::Future<Output = ()> + Send + 'static>(&self, f: F) {
        self.handle().spawn(f);
    }

    /// A client for `user` whose connections live on this runtime.
    async fn client(&self, cp: &ControlPlane, user: &str) -> Client {
        let json = cp.kubeconfig_json(&Identity::new(user, &[])).unwrap();
        let kubeconfig: Kubeconfig = serde_json::from_value(json).unwrap();
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .unwrap();
        let _on_ccm_runtime = self.enter();
        Client::try_from(config).unwrap()
    }
}

impl CcmRuntime {
    /// A client whose only credential is `token`, its connections on this runtime.
    async fn token_client(&self, cp: &ControlPlane, token: &str) -> Client {
        let mut json = cp.kubeconfig_json(&Identity::admin()).unwrap();
        json["users"] = json!([{"name": Identity::admin().user, "user": {"token": token}}]);
        self.client_from_json(json).await
    }

    /// A client acting as ServiceAccount `ns/name` (a TokenRequest token), on this runtime.
    async fn service_account_client(
        &self,
        cp: &ControlPlane,
        admin: &Client,
        ns: &str,
        name: &str,
    ) -> Client {
        let json = chart::service_account_kubeconfig(cp, admin, ns, name).await.unwrap();
        self.client_from_json(json).await
    }

    async fn client_from_json(&self, json: Value) -> Client {
        let kubeconfig: Kubeconfig = serde_json::from_value(json).unwrap();
        let config =
            kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .unwrap();
        let _on_ccm_runtime = self.enter();
        Client::try_from(config).unwrap()
    }
}

impl Drop for CcmRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}

/// Azure's multiple standard load balancers match a configuration's
/// `serviceNamespaceSelector` against the labels of the Service's namespace: the chart grants
/// `get` on namespaces for Azure, and nothing more (no list, watch or write); the other clouds'
/// renderings do not mention namespaces.
#[tokio::test]
async fn azure_gets_one_namespace_by_name_and_nothing_more() {
    let chart = install(&[("provider", "azure")]).await;
    let _logs = chart.cp.log_guard();
    for (who, c) in &chart.identities {
        let api: Api<Namespace> = Api::all(c.clone());
        let ns = wait_allowed(who, "get namespace kube-system", || async {
            api.get("kube-system").await
        })
        .await
        .unwrap_or_else(|e| panic!("{who}: get namespace kube-system: {e}"));
        assert_eq!(ns.metadata.name.as_deref(), Some("kube-system"));
        assert_forbidden(who, "list namespaces", api.list(&ListParams::default()).await);
        assert_forbidden(
            who,
            "watch namespaces",
            api.watch(&WatchParams::default(), "0").await.map(drop),
        );
        assert_forbidden(
            who,
            "label a namespace",
            api.patch(
                "default",
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
            )
            .await,
        );
        assert_forbidden(
            who,
            "delete a namespace",
            api.delete("default", &DeleteParams::default()).await.map(drop),
        );
    }
    for provider in ["aws", "gcp", "openstack", "vsphere", "ibm"] {
        let objects = chart::render(&[("provider", provider)]).expect("helm template");
        assert!(
            !objects.iter().any(|o| o.to_string().contains("\"namespaces\"")),
            "{provider}: no rule mentions namespaces"
        );
    }
}

/// Azure's multiple standard load balancers give an `externalTrafficPolicy: Local` Service its
/// own backend pool of the Nodes of its endpoints, read by one list of the Service's
/// EndpointSlices by label: the chart grants `list` on EndpointSlices for Azure and nothing more
/// (no get, watch or write); the other clouds' renderings do not mention them.
#[tokio::test]
async fn azure_lists_endpointslices_and_nothing_more() {
    let chart = install(&[("provider", "azure")]).await;
    let _logs = chart.cp.log_guard();
    let slice: EndpointSlice = serde_json::from_value(json!({
        "metadata": {"name": "web-abc", "namespace": "default",
                     "labels": {"kubernetes.io/service-name": "web"}},
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["10.0.0.5"], "nodeName": "node-1"}],
    }))
    .unwrap();
    Api::<EndpointSlice>::namespaced(chart.admin.clone(), "default")
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
    for (who, c) in &chart.identities {
        let api: Api<EndpointSlice> = Api::namespaced(c.clone(), "default");
        let lp = ListParams::default().labels("kubernetes.io/service-name=web");
        let listed = wait_allowed(who, "list endpointslices", || async { api.list(&lp).await })
            .await
            .unwrap_or_else(|e| panic!("{who}: list endpointslices: {e}"));
        assert_eq!(listed.items.len(), 1, "{who}: the Service's one EndpointSlice");
        assert_forbidden(who, "get an endpointslice", api.get("web-abc").await);
        assert_forbidden(
            who,
            "watch endpointslices",
            api.watch(&WatchParams::default(), "0").await.map(drop),
        );
        assert_forbidden(
            who,
            "delete an endpointslice",
            api.delete("web-abc", &DeleteParams::default()).await.map(drop),
        );
    }
    for provider in ["aws", "gcp", "openstack", "vsphere", "ibm"] {
        let objects = chart::render(&[("provider", provider)]).expect("helm template");
        assert!(
            !objects.iter().any(|o| o.to_string().contains("endpointslices")),
            "{provider}: no rule mentions endpointslices"
        );
    }
}
