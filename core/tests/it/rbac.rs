//! The chart's RBAC, as `helm template` renders it (`ccm_testbed::chart`), applied to a real
//! apiserver and checked with its real RBAC authorizer, as both identities the chart binds:
//! the `system:cloud-controller-manager` user (static manifests) and the chart's
//! ServiceAccount (in-cluster, through a TokenRequest token).
//!
//! - the controllers and the manager (leader election, `--use-service-account-credentials`)
//!   work under it;
//! - it cannot mint a token for any ServiceAccount but the per-controller ones (issue #11.1);
//! - it reads no Secret, except the one named by `cloudCredentialSecret` (issue #11.2).
//!
//! Each test starts its own control plane: the RBAC of one chart rendering must not leak
//! into another's checks.

use std::collections::BTreeSet;
use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use ccm_core::cloud::{CloudProvider, InstanceMetadata};
use ccm_core::controllers::{ControllerConfig, node, node_lifecycle};
use ccm_core::manager::flags::Flags;
use ccm_core::names;
use ccm_core::testing::{ScriptedInstance, TestCloud, TestInstances, TestLoadBalancers};
use ccm_testbed::chart;
use ccm_testbed::fixtures::{kubelet_node, load_balancer_service};
use ccm_testbed::{ControlPlane, Identity};
use clap::Parser;
use k8s_openapi::ByteString;
use k8s_openapi::api::authentication::v1::{
    TokenRequest, TokenRequestSpec, TokenReview, TokenReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Secret, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{ListParams, ObjectMeta, PostParams, WatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::Value;

use crate::support::run;

/// The user the chart binds for kubeadm-style static manifests.
const CCM_USER: &str = "system:cloud-controller-manager";

/// A control plane with the chart's RBAC applied, and clients for both of its identities.
struct Installed {
    cp: ControlPlane,
    admin: Client,
    objects: Vec<Value>,
    /// `(who, client)` for the user and the chart's ServiceAccount.
    identities: Vec<(String, Client)>,
}

/// Starts a control plane, renders the chart with `values` and applies its RBAC.
async fn install(values: &[(&str, &str)]) -> Installed {
    let cp = ControlPlane::start().await.expect("control plane");
    let admin = cp.admin_client().await.unwrap();
    let objects = chart::render(values).expect("helm template renders the chart");
    let applied = chart::apply_rbac(&admin, &objects).await.expect("the chart's RBAC applies");
    assert!(applied.iter().any(|a| a.starts_with("ClusterRoleBinding ")), "{applied:?}");
    let sa = objects
        .iter()
        .find(|o| chart::kind(o) == "ServiceAccount")
        .expect("the chart renders a ServiceAccount");
    let (sa_ns, sa_name) = (chart::namespace(sa).unwrap(), chart::name(sa));
    let user = cp.client(&Identity::new(CCM_USER, &[])).await.unwrap();
    let sa_client = chart::service_account_client(&cp, &admin, sa_ns, sa_name).await.unwrap();
    let identities = vec![
        (format!("user {CCM_USER}"), user),
        (format!("ServiceAccount {sa_ns}/{sa_name}"), sa_client),
    ];
    // The authorizer sees new bindings through informers: wait until both identities have
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

/// The ServiceAccount names the controllers use with `--use-service-account-credentials`.
fn controller_accounts() -> BTreeSet<String> {
    ccm_core::controllers::all().iter().map(|c| c.client_name.to_string()).collect()
}

#[tokio::test]
async fn node_controllers_work_under_the_chart_cluster_role() {
    let chart = install(&[]).await;
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

/// Issue #11.1: as the CCM, `kubectl create token` works only for the per-controller accounts.
#[tokio::test]
async fn the_chart_identity_creates_tokens_only_for_the_per_controller_accounts() {
    let chart = install(&[]).await;
    let _logs = chart.cp.log_guard();
    let admin = &chart.admin;

    // A ServiceAccount that is cluster-admin, in default, and another account in kube-system.
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
                subjects: Some(vec![Subject {
                    kind: "ServiceAccount".into(),
                    name: "rbac-admin".into(),
                    namespace: Some("default".into()),
                    api_group: None,
                }]),
            },
        )
        .await
        .unwrap();
    Api::<ServiceAccount>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &service_account("generic-garbage-collector"))
        .await
        .unwrap();
    let chart_sa = chart
        .objects
        .iter()
        .find(|o| chart::kind(o) == "ServiceAccount")
        .map(|o| chart::name(o).to_string())
        .unwrap();

    for (who, c) in &chart.identities {
        let default_sas: Api<ServiceAccount> = Api::namespaced(c.clone(), "default");
        let system_sas: Api<ServiceAccount> = Api::namespaced(c.clone(), "kube-system");
        // The per-controller accounts: created when missing, and a token for each (as
        // manager/credentials.rs does), so --use-service-account-credentials keeps working.
        for name in controller_accounts() {
            let created =
                wait_allowed(who, &format!("create ServiceAccount kube-system/{name}"), || {
                    let (api, name) = (system_sas.clone(), name.clone());
                    async move { api.create(&PostParams::default(), &service_account(&name)).await }
                })
                .await;
            let exists = matches!(&created, Err(kube::Error::Api(s)) if s.code == 409);
            assert!(created.is_ok() || exists, "{who}: creating kube-system/{name}: {created:?}");
            let tr = wait_allowed(who, &format!("create token for kube-system/{name}"), || {
                let (api, name) = (system_sas.clone(), name.clone());
                async move {
                    api.create_token_request(&name, &PostParams::default(), &token_request()).await
                }
            })
            .await
            .unwrap_or_else(|e| panic!("{who}: token for kube-system/{name}: {e}"));
            let token = tr.status.map(|s| s.token).unwrap_or_default();
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
            let user = review.status.and_then(|s| s.user).and_then(|u| u.username);
            assert_eq!(user, Some(format!("system:serviceaccount:kube-system:{name}")), "{who}");
        }
        // Any other account, in any namespace: no token (the cluster-admin one above would
        // make the CCM cluster-admin).
        for (api, ns, name) in [
            (&default_sas, "default", "rbac-admin"),
            (&default_sas, "default", "default"),
            (&system_sas, "kube-system", "generic-garbage-collector"),
            (&system_sas, "kube-system", chart_sa.as_str()),
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

    // The chart names exactly the accounts the code uses, no more.
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
    assert_eq!(named, controller_accounts(), "serviceaccounts/token resourceNames in the chart");
    assert!(
        !chart
            .objects
            .iter()
            .any(|o| chart::kind(o) == "ClusterRole" && o.to_string().contains("serviceaccounts")),
        "no cluster-wide ServiceAccount rule"
    );
}

/// Issue #11.2, default values: no Secret can be listed, watched or read.
#[tokio::test]
async fn the_chart_identity_reads_no_secret_by_default() {
    let chart = install(&[]).await;
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

/// The manager itself under the chart's RBAC, as the chart runs it: leader election in
/// kube-system and `--use-service-account-credentials` (its controllers then act as the
/// per-controller accounts, whose permissions are the apiserver's bootstrap controller roles).
#[tokio::test]
async fn the_manager_runs_under_the_chart_rbac_with_service_account_credentials() {
    let chart = install(&[]).await;
    let _logs = chart.cp.log_guard();
    let admin = chart.admin.clone();
    let dir = std::env::temp_dir().join(ccm_testbed::unique_name("ccm-rbac-manager"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("ccm.kubeconfig");
    chart.cp.write_kubeconfig(&kubeconfig, &Identity::new(CCM_USER, &[])).unwrap();

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
        "--use-service-account-credentials=true".into(),
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
    // cloud-node, acting as kube-system/node-controller, initialises a Node.
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
    // service-lb, acting as kube-system/service-controller, provisions a load balancer.
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
    // Both per-controller accounts exist; the CCM's own identity got them and their tokens.
    let sas: Api<ServiceAccount> = Api::namespaced(admin.clone(), "kube-system");
    for name in ["node-controller", "service-controller"] {
        assert!(sas.get_opt(name).await.unwrap().is_some(), "kube-system/{name} created");
    }
    let _ = std::fs::remove_dir_all(&dir);
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

impl Drop for CcmRuntime {
    fn drop(&mut self) {
        if let Some(rt) = self.0.take() {
            rt.shutdown_background();
        }
    }
}
