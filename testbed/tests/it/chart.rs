//! The Helm chart installed for real, per cloud preset (`values-<cloud>.yaml`, found by
//! `ccm_testbed::chart::presets`, so a new cloud's preset file is tested without touching this
//! file): `helm template` output applied to the shared kube-apiserver with a server-side
//! dry run (`dryRun=All`, strict field validation), and what an operator relies on in the
//! rendered workload (non-root, read-only root filesystem with `/tmp` on an emptyDir, the
//! tolerations, the per-cloud image and command).

use std::collections::BTreeSet;

use ccm_testbed::chart;
use ccm_testbed::{ControlPlane, unique_name};
use k8s_openapi::api::core::v1::ServiceAccount;
use k8s_openapi::api::rbac::v1::ClusterRole;
use kube::Api;
use serde_json::Value;

/// The clouds that have landed; each must have a preset.
const LANDED: [&str; 6] = ["aws", "azure", "gcp", "ibm", "openstack", "vsphere"];

/// The manager's `--cloud-provider` for a preset: upstream's names (`gce` for GCP).
fn provider_flag(cloud: &str) -> &str {
    if cloud == "gcp" { "gce" } else { cloud }
}

fn presets() -> Vec<String> {
    let presets = chart::presets().expect("listing the chart's presets");
    for cloud in LANDED {
        assert!(presets.iter().any(|p| p == cloud), "no values-{cloud}.yaml in {presets:?}");
    }
    presets
}

/// Every preset, as a DaemonSet (the default), as a Deployment with its PodDisruptionBudget, and
/// with every optional value the testbed's apiserver serves the kinds of
/// (`ci/all-optional-values.yaml` without the Prometheus Operator's ServiceMonitor and
/// PrometheusRule, whose CRDs it does not serve), is accepted object by object by the real
/// apiserver, and the dry run stores nothing.
#[tokio::test]
async fn every_cloud_preset_passes_a_server_side_dry_run_apply() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let admin = cp.admin_client().await.unwrap();
    let deployment: &[(&str, &str)] =
        &[("workload.kind", "Deployment"), ("workload.replicas", "2")];
    let optional: &[(&str, &str)] =
        &[("serviceMonitor.enabled", "false"), ("prometheusRule.enabled", "false")];
    for cloud in presets() {
        for (variant, files) in [
            (&[][..], &[][..]),
            (deployment, &[][..]),
            (optional, &[chart::ALL_OPTIONAL_VALUES][..]),
        ] {
            let release = unique_name(&format!("dry-{cloud}"));
            let objects =
                chart::render_preset_with_files(&cloud, &release, "kube-system", files, variant)
                    .unwrap_or_else(|e| panic!("{cloud} {variant:?}: {e}"));
            let applied = chart::dry_run_apply(&admin, &objects)
                .await
                .unwrap_or_else(|e| panic!("{cloud} {variant:?}: the apiserver rejects {e}"));
            assert_eq!(applied.len(), objects.len(), "{cloud}: {applied:?}");
            let kinds: BTreeSet<&str> = objects.iter().map(chart::kind).collect();
            let is_deployment = variant == deployment;
            let want_workload = if is_deployment { "Deployment" } else { "DaemonSet" };
            for want in [want_workload, "ServiceAccount", "ClusterRole", "ClusterRoleBinding"] {
                assert!(kinds.contains(want), "{cloud} {variant:?}: no {want} in {kinds:?}");
            }
            if !files.is_empty() {
                // The cloud config from values, and the dashboard.
                for want in ["Secret", "ConfigMap"] {
                    assert!(kinds.contains(want), "{cloud} every optional value: no {want}");
                }
            }
            assert_eq!(
                kinds.contains("PodDisruptionBudget"),
                is_deployment,
                "{cloud} {variant:?}: a PDB exactly with the Deployment: {kinds:?}"
            );
            // A dry run persists nothing.
            let role = chart::name(
                objects.iter().find(|o| chart::kind(o) == "ClusterRole").expect("a ClusterRole"),
            );
            assert!(
                Api::<ClusterRole>::all(admin.clone()).get_opt(role).await.unwrap().is_none(),
                "{cloud}: the dry run created ClusterRole {role}"
            );
            let sa = chart::manager_service_account(&objects).unwrap();
            assert!(
                Api::<ServiceAccount>::namespaced(admin.clone(), "kube-system")
                    .get_opt(chart::name(sa))
                    .await
                    .unwrap()
                    .is_none(),
                "{cloud}: the dry run created ServiceAccount {}",
                chart::name(sa)
            );
        }
    }
}

/// The dry run is a real check: a field the API does not know, or a value it does not accept,
/// in a rendered object fails it, naming the object.
#[tokio::test]
async fn the_dry_run_rejects_what_the_apiserver_would_reject() {
    let cp = ControlPlane::shared().await.expect("control plane");
    let admin = cp.admin_client().await.unwrap();
    let release = unique_name("dry-bad");
    let objects = chart::render_preset("aws", &release, "kube-system", &[]).unwrap();

    let mut unknown_field = objects.clone();
    let w = unknown_field.iter_mut().find(|o| chart::kind(o) == "DaemonSet").unwrap();
    w["spec"]["template"]["spec"]["containers"][0]["imagePullPolcy"] = "Always".into();
    let err = chart::dry_run_apply(&admin, &unknown_field).await.unwrap_err().to_string();
    assert!(err.contains("DaemonSet") && err.contains("imagePullPolcy"), "{err}");

    let mut bad_value = objects.clone();
    let w = bad_value.iter_mut().find(|o| chart::kind(o) == "DaemonSet").unwrap();
    w["spec"]["template"]["spec"]["restartPolicy"] = "Never".into();
    let err = chart::dry_run_apply(&admin, &bad_value).await.unwrap_err().to_string();
    assert!(err.contains("DaemonSet") && err.contains("restartPolicy"), "{err}");
}

fn pod_spec(objects: &[Value]) -> &Value {
    &chart::workload(objects).expect("a workload")["spec"]["template"]["spec"]
}

/// What every preset promises an operator: the cloud's own image and binary, non-root with a
/// read-only root filesystem and `/tmp` (where the per-controller ServiceAccount tokens go) on
/// an emptyDir, system-cluster-critical, scheduled on control-plane nodes through the
/// control-plane, uninitialized and not-ready taints, leader election on.
#[test]
fn every_preset_runs_the_clouds_image_non_root_read_only_with_tmp_on_an_empty_dir() {
    for cloud in presets() {
        let objects = chart::render_preset(&cloud, "ccm", "kube-system", &[]).unwrap();
        let spec = pod_spec(&objects);
        let c = &spec["containers"][0];
        let image = c["image"].as_str().unwrap();
        assert!(
            image.contains(&format!("/cloud-controller-manager-{cloud}:")),
            "{cloud}: image {image}"
        );
        let argv = chart::container_args(chart::workload(&objects).unwrap()).unwrap();
        assert_eq!(argv[0], format!("/usr/local/bin/cloud-controller-manager-{cloud}"));
        let flag = provider_flag(&cloud);
        assert!(argv.contains(&format!("--cloud-provider={flag}")), "{cloud}: {argv:?}");
        // Upstream's log verbosity.
        assert!(argv.contains(&"--v=2".to_string()), "{cloud}: {argv:?}");
        // The pod's identity for its Events, from the downward API.
        for (env, field) in [("POD_NAME", "metadata.name"), ("POD_NAMESPACE", "metadata.namespace")]
        {
            let var = c["env"].as_array().and_then(|e| e.iter().find(|v| v["name"] == env));
            assert_eq!(
                var.map(|v| &v["valueFrom"]["fieldRef"]["fieldPath"]),
                Some(&Value::from(field)),
                "{cloud}: {env}"
            );
        }
        assert!(argv.contains(&"--leader-elect=true".to_string()), "{cloud}: {argv:?}");
        // Issue #29 MED 8: every controller as the chart's own ServiceAccount by default;
        // nothing mints tokens for kube-controller-manager's accounts.
        assert!(
            argv.contains(&"--use-service-account-credentials=false".to_string()),
            "{cloud}: {argv:?}"
        );
        // Issue #29 MED 4: the probes go to plain HTTP on the node's loopback (hostNetwork).
        assert_eq!(spec["hostNetwork"], true, "{cloud}");
        assert!(
            argv.contains(&"--healthz-bind-address=127.0.0.1:10268".to_string()),
            "{cloud}: {argv:?}"
        );
        for probe in ["livenessProbe", "readinessProbe"] {
            let get = &c[probe]["httpGet"];
            assert_eq!(
                (&get["host"], &get["port"], &get["scheme"]),
                (&Value::from("127.0.0.1"), &Value::from(10268), &Value::from("HTTP")),
                "{cloud}: {probe}"
            );
        }
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true, "{cloud}");
        assert_eq!(spec["securityContext"]["runAsUser"], 65532, "{cloud}");
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true, "{cloud}");
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false, "{cloud}");
        let tmp = c["volumeMounts"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["mountPath"] == "/tmp")
            .unwrap_or_else(|| panic!("{cloud}: nothing mounted on /tmp"));
        let volume = spec["volumes"].as_array().unwrap().iter().find(|v| v["name"] == tmp["name"]);
        assert!(
            volume.is_some_and(|v| v["emptyDir"].is_object()),
            "{cloud}: /tmp is not an emptyDir: {volume:?}"
        );
        // As upstream's manifests: Azure's and GCE's run system-node-critical.
        let priority = if matches!(cloud.as_str(), "azure" | "gcp") {
            "system-node-critical"
        } else {
            "system-cluster-critical"
        };
        assert_eq!(spec["priorityClassName"], priority, "{cloud}");
        let tolerated: BTreeSet<&str> = spec["tolerations"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|t| t["key"].as_str())
            .collect();
        for key in [
            "node-role.kubernetes.io/control-plane",
            "node.cloudprovider.kubernetes.io/uninitialized",
            "node.kubernetes.io/not-ready",
        ] {
            assert!(tolerated.contains(key), "{cloud}: no toleration for {key}: {tolerated:?}");
        }
    }
}

/// vSphere's preset mounts its cloud config from the ConfigMap upstream uses and may read
/// exactly its credential Secret; AWS's reads no Secret at all.
#[test]
fn the_vsphere_preset_reads_its_config_map_and_only_its_credential_secret() {
    let objects = chart::render_preset("vsphere", "ccm", "kube-system", &[]).unwrap();
    let argv = chart::container_args(chart::workload(&objects).unwrap()).unwrap();
    assert!(
        argv.contains(&"--cloud-config=/etc/kubernetes/cloud-config/vsphere.conf".to_string()),
        "{argv:?}"
    );
    let spec = pod_spec(&objects);
    let volume = spec["volumes"].as_array().unwrap().iter().find(|v| v["name"] == "cloud-config");
    assert_eq!(volume.map(|v| &v["configMap"]["name"]), Some(&Value::from("vsphere-cloud-config")));
    let secret_rules: Vec<&Value> = objects
        .iter()
        .flat_map(|o| o["rules"].as_array().into_iter().flatten())
        .filter(|r| r["resources"].as_array().is_some_and(|rs| rs.iter().any(|x| x == "secrets")))
        .collect();
    assert_eq!(secret_rules.len(), 1, "{secret_rules:?}");
    assert_eq!(secret_rules[0]["verbs"], serde_json::json!(["get"]));
    assert_eq!(secret_rules[0]["resourceNames"], serde_json::json!(["vsphere-cloud-secret"]));

    let aws = chart::render_preset("aws", "ccm", "kube-system", &[]).unwrap();
    assert!(!aws.iter().any(|o| o.to_string().contains("\"secrets\"")), "AWS reads no Secret");
}

/// `GET path` over plain HTTP/1.0 on 127.0.0.1:`port`: the status code and the body (as the
/// kubelet's httpGet probe asks).
fn plain_http_get(port: u16, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port))
        .unwrap_or_else(|e| panic!("connecting to the healthz port {port}: {e}"));
    stream.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let status = reply.split(' ').nth(1).unwrap_or_default().to_string();
    let body = reply.split_once("\r\n\r\n").map(|(_, b)| b.trim().to_string()).unwrap_or_default();
    (status, body)
}

/// Without the host network the probes stay where they were: the HTTPS liveness probe on the
/// secure port, no healthz bind address (issue #29 MED 4).
#[test]
fn without_the_host_network_the_probes_stay_on_the_secure_port() {
    let objects =
        chart::render_preset("aws", "ccm", "kube-system", &[("hostNetwork", "false")]).unwrap();
    let argv = chart::container_args(chart::workload(&objects).unwrap()).unwrap();
    assert!(!argv.iter().any(|a| a.starts_with("--healthz-bind-address")), "{argv:?}");
    let c = &pod_spec(&objects)["containers"][0];
    let get = &c["livenessProbe"]["httpGet"];
    assert_eq!((&get["port"], &get["scheme"]), (&Value::from(10258), &Value::from("HTTPS")));
    assert!(get["host"].is_null(), "{get}");
    assert!(c["readinessProbe"].is_null(), "{c}");
}

/// A control plane of its own with the audit log on: the detector of RBAC denials.
async fn audited_control_plane() -> ControlPlane {
    let tools = ccm_testbed::tools::Tools::locate().expect("the tools (ci/install-tools)");
    let options = ccm_testbed::StartOptions { audit: true, ..Default::default() };
    ControlPlane::start_with_options(tools, options).await.expect("control plane")
}

/// The requests of ServiceAccounts the apiserver refused (403, RBAC denials included) since
/// `mark`, from its audit log (after a second for the last answers to be written).
async fn forbidden_since(cp: &ControlPlane, mark: &ccm_testbed::audit::Mark) -> Vec<String> {
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    cp.forbidden_since(mark, |u| u.starts_with("system:serviceaccount:"))
        .expect("the audit log")
        .iter()
        .map(ToString::to_string)
        .collect()
}

/// The sum of the apiserver's `apiserver_request_total` for answers with `code`: what this
/// file used to count as "Forbidden answers", shown by the test below to miss RBAC denials.
async fn requests_answered(admin: &kube::Client, code: &str) -> u64 {
    let req = http::Request::get("/metrics").body(Vec::new()).unwrap();
    let text = admin.request_text(req).await.expect("the apiserver's /metrics");
    text.lines()
        .filter(|l| l.starts_with("apiserver_request_total{"))
        .filter(|l| l.contains(&format!("code=\"{code}\"")))
        .filter_map(|l| l.rsplit(' ').next().and_then(|v| v.parse::<u64>().ok()))
        .sum()
}

/// The Forbidden detector catches a planted RBAC denial: a ServiceAccount without any
/// binding lists Nodes and creates an `events.k8s.io` Event (both refused by the RBAC
/// authorizer), and the detector reports exactly those two requests, with their user, verb,
/// resource and namespace, and nothing for the admin's allowed requests in between.
#[tokio::test]
async fn the_forbidden_detector_catches_a_planted_rbac_denial() {
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::events::v1::Event;
    use kube::api::PostParams;

    let cp = audited_control_plane().await;
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let sa_name = unique_name("unbound");
    let sa: ServiceAccount = serde_json::from_value(serde_json::json!({
        "metadata": {"name": sa_name, "namespace": "default"}
    }))
    .unwrap();
    Api::<ServiceAccount>::namespaced(admin.clone(), "default")
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
    let client = chart::service_account_client(&cp, &admin, "default", &sa_name).await.unwrap();
    let mark = cp.audit_mark().unwrap();
    let metric_before = requests_answered(&admin, "403").await;

    let listed = Api::<Node>::all(client.clone()).list(&Default::default()).await;
    assert!(matches!(&listed, Err(kube::Error::Api(s)) if s.code == 403), "{listed:?}");
    let event: Event = serde_json::from_value(serde_json::json!({
        "metadata": {"generateName": "planted-"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "planted", "reportingInstance": "planted",
        "action": "Planted", "reason": "Planted", "type": "Normal",
    }))
    .unwrap();
    let events = Api::<Event>::namespaced(client.clone(), "default");
    let created = events.create(&PostParams::default(), &event).await;
    assert!(matches!(&created, Err(kube::Error::Api(s)) if s.code == 403), "{created:?}");
    // Allowed requests of the admin in between are not denials.
    Api::<Node>::all(admin.clone()).list(&Default::default()).await.unwrap();

    let user = format!("system:serviceaccount:default:{sa_name}");
    let got = forbidden_since(&cp, &mark).await;
    assert_eq!(
        got,
        vec![format!("{user} list nodes"), format!("{user} create events.events.k8s.io default/")],
        "the detector's denials"
    );
    // Another user's filter sees none of them; a mark taken now sees none either.
    assert!(cp.forbidden_since(&mark, |u| u == "someone-else").unwrap().is_empty());
    let now = cp.audit_mark().unwrap();
    assert!(forbidden_since(&cp, &now).await.is_empty());
    // What the old check counted: printed for the record (the apiserver's request metric is
    // not where RBAC denials are reported).
    let metric_after = requests_answered(&admin, "403").await;
    eprintln!(
        "apiserver_request_total{{code=\"403\"}}: {metric_before} before, {metric_after} after \
         two RBAC denials"
    );
}

/// The AWS demo's cloud-controller-manager as the chart runs it: the rendered DaemonSet's
/// exact flags (only the mounted cloud-config path and the host ports are local), acting as the
/// rendered ServiceAccount (a TokenRequest token, as the kubelet mounts it) for every
/// controller under exactly the chart's RBAC, with leader election, the secure port and the
/// probes' plain-HTTP healthz port on. It initialises the Nodes and provisions the
/// LoadBalancer, `/healthz` and `/readyz` answer on the healthz port, and the apiserver
/// refused none of its requests (403 in the audit log: RBAC denials included).
#[cfg(feature = "aws")]
#[tokio::test]
async fn the_aws_demo_runs_with_the_charts_args_under_the_charts_service_account() {
    use ccm_core::names;
    use ccm_provider_aws::testing;
    use k8s_openapi::api::core::v1::{Node, Service};
    use kube::api::PostParams;
    use std::sync::Arc;
    use std::time::Duration;

    const CLUSTER: &str = "demo";
    // The manager's log, shown when this test fails.
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .try_init();
    let cp = audited_control_plane().await;
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let moto = ccm_testbed::moto::Moto::start().await.expect("moto (ci/install-tools)");
    let ec2 = testing::ec2(&moto.url).await;
    let net = testing::network(&ec2, CLUSTER).await.unwrap();
    let sg = testing::node_security_group(&ec2, &net.vpc, CLUSTER).await.unwrap();
    let instances =
        testing::run_instances(&ec2, &net.subnets[0].0, CLUSTER, 2, Some(&sg)).await.unwrap();

    // The chart, as an operator installs it with a cloud config in a ConfigMap.
    let objects = chart::render_preset(
        "aws",
        "aws-ccm",
        "kube-system",
        &[("cloudConfig.configMapName", "aws-cloud-config"), ("clusterName", CLUSTER)],
    )
    .unwrap();
    chart::apply_rbac(&admin, &objects).await.expect("the chart's RBAC applies");
    let sa = chart::manager_service_account(&objects).unwrap();
    let (sa_ns, sa_name) = (chart::namespace(sa).unwrap(), chart::name(sa));
    // The authorizer learns new bindings through informers: wait until the ServiceAccount has
    // what the chart grants, so no 403 below comes from that delay.
    let sa_client = chart::service_account_client(&cp, &admin, sa_ns, sa_name).await.unwrap();
    ccm_testbed::wait_for(
        "the chart's ServiceAccount may list Nodes",
        Duration::from_secs(60),
        || {
            let nodes: Api<Node> = Api::all(sa_client.clone());
            async move { nodes.list(&Default::default()).await.ok().map(drop) }
        },
    )
    .await;

    let dir = std::env::temp_dir().join(unique_name("chart-aws"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let json = chart::service_account_kubeconfig(&cp, &admin, sa_ns, sa_name).await.unwrap();
    std::fs::write(&kubeconfig, serde_json::to_string(&json).unwrap()).unwrap();
    let cloud_config = dir.join("cloud.conf");
    let config_text = testing::cloud_config(&moto.url, CLUSTER, "");
    std::fs::write(&cloud_config, &config_text).unwrap();

    // The rendered command line; what the pod's mounts and host network make local.
    let argv = chart::container_args(chart::workload(&objects).unwrap()).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let healthz_port =
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut args: Vec<String> = argv
        .iter()
        .map(|a| {
            if a.starts_with("--cloud-config=/etc/kubernetes/cloud-config/") {
                format!("--cloud-config={}", cloud_config.display())
            } else if a.starts_with("--secure-port=") {
                format!("--secure-port={port}")
            } else if a.starts_with("--healthz-bind-address=127.0.0.1:") {
                format!("--healthz-bind-address=127.0.0.1:{healthz_port}")
            } else {
                a.clone()
            }
        })
        .collect();
    assert!(args.iter().any(|a| a.starts_with("--cloud-config=") && a.contains("cloud.conf")));
    // In a pod this is the in-cluster config from the mounted token.
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    // From here on, any request of the chart's ServiceAccounts the apiserver refuses counts.
    let mark = cp.audit_mark().unwrap();

    let extensions = ccm_core::manager::extensions::Extensions::default();
    let flags =
        ccm_core::manager::parse_flags(&extensions, &args).expect("the chart's flags parse");
    let options = extensions.validate(flags, "aws").expect("the chart's flags validate");
    let shutdown = ccm_core::manager::CancellationToken::new();
    let stop = shutdown.clone();
    let url = moto.url.clone();
    let manager = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let (cloud, _) = testing::cloud(&url, CLUSTER, "").await.unwrap();
            let factory: ccm_core::manager::CloudFactory = Box::new(move |config| {
                // The manager read the file the rendered --cloud-config names.
                assert_eq!(config.map(<[u8]>::to_vec), Some(config_text.into_bytes()));
                Ok(Arc::new(cloud) as Arc<dyn ccm_core::cloud::CloudProvider>)
            });
            ccm_core::manager::run_until("aws", options, factory, &extensions, stop)
                .await
                .map_err(|e| e.to_string())
        })
    });

    let nodes: Api<Node> = Api::all(admin.clone());
    for i in &instances {
        let (name, ip) = (i.private_dns_name().unwrap(), i.private_ip_address().unwrap());
        nodes
            .create(&PostParams::default(), &ccm_testbed::fixtures::kubelet_node(name, ip, "True"))
            .await
            .unwrap();
    }
    for i in &instances {
        let name = i.private_dns_name().unwrap().to_string();
        let nodes = nodes.clone();
        ccm_testbed::wait_for(
            &format!("the chart's CCM initialises {name}"),
            Duration::from_secs(120),
            || {
                assert!(
                    !manager.is_finished(),
                    "the manager ended under the chart's args and RBAC"
                );
                let (nodes, name) = (nodes.clone(), name.clone());
                async move {
                    let spec = nodes.get(&name).await.ok()?.spec?;
                    let tainted = spec
                        .taints
                        .unwrap_or_default()
                        .iter()
                        .any(|t| t.key == names::TAINT_UNINITIALIZED);
                    (spec.provider_id?.starts_with("aws:///") && !tainted).then_some(())
                }
            },
        )
        .await;
    }
    let services: Api<Service> = Api::namespaced(admin.clone(), "default");
    services
        .create(
            &PostParams::default(),
            &ccm_testbed::fixtures::load_balancer_service("default", "chart-web", 80),
        )
        .await
        .unwrap();
    let hostname = ccm_testbed::wait_for(
        "the chart's CCM provisions a load balancer for default/chart-web",
        Duration::from_secs(120),
        || {
            assert!(!manager.is_finished(), "the manager ended under the chart's args and RBAC");
            let services = services.clone();
            async move {
                services
                    .get("chart-web")
                    .await
                    .ok()?
                    .status?
                    .load_balancer?
                    .ingress?
                    .into_iter()
                    .next()?
                    .hostname
            }
        },
    )
    .await;
    assert!(hostname.ends_with(".elb.amazonaws.com"), "{hostname}");
    // The probes' endpoint: plain HTTP on loopback, where the rendered probes point.
    let (status, body) = plain_http_get(healthz_port, "/healthz");
    assert_eq!((status.as_str(), body.as_str()), ("200", "ok"), "GET /healthz on the healthz port");
    let (status, _) = plain_http_get(healthz_port, "/readyz");
    assert_eq!(status, "200", "GET /readyz on the healthz port");

    // It holds the chart's Lease and renews it (an update of exactly that Lease).
    let leases: Api<k8s_openapi::api::coordination::v1::Lease> =
        Api::namespaced(admin.clone(), "kube-system");
    let renewed = |leases: Api<k8s_openapi::api::coordination::v1::Lease>| async move {
        leases.get_opt("cloud-controller-manager").await.ok()??.spec?.renew_time
    };
    let first =
        ccm_testbed::wait_for("the manager holds its Lease", Duration::from_secs(60), || {
            renewed(leases.clone())
        })
        .await;
    ccm_testbed::wait_for("the manager renews its Lease", Duration::from_secs(60), || {
        assert!(!manager.is_finished(), "the manager ended under the chart's args and RBAC");
        let (leases, first) = (leases.clone(), first.clone());
        async move { renewed(leases).await.filter(|t| *t != first) }
    })
    .await;

    // Stopped (it releases the Lease), nothing the manager did was refused.
    shutdown.cancel();
    let ended = manager.join().expect("the manager thread");
    assert!(ended.is_ok(), "the manager ended with {ended:?}");
    let denied = forbidden_since(&cp, &mark).await;
    assert!(
        denied.is_empty(),
        "the apiserver refused requests of the CCM running under the chart's RBAC: {denied:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// The vSphere demo's cloud-controller-manager as the chart runs it, like the AWS one above:
/// the rendered DaemonSet's exact flags, acting as the rendered ServiceAccount under exactly
/// the chart's RBAC. The preset's credentials path is exercised for real: the vCenter
/// credentials are only in the Secret `kube-system/vsphere-cloud-secret`, which the manager
/// reads through the API with the chart's namespaced Role (`get` on that one Secret). It
/// initialises a Node from vcsim, and the apiserver refused none of its requests (audit log).
#[tokio::test]
async fn the_vsphere_demo_runs_with_the_charts_args_under_the_charts_service_account() {
    use ccm_core::names;
    use ccm_testbed::vcsim::Vcsim;
    use k8s_openapi::api::core::v1::{Node, Secret};
    use kube::api::PostParams;
    use std::sync::Arc;
    use std::time::Duration;

    const PASSWORD: &str = "chart-vsphere-Pa55w0rd";
    let _ = tracing_subscriber::fmt()
        .with_test_writer()
        .with_env_filter(tracing_subscriber::EnvFilter::new("info"))
        .try_init();
    let cp = audited_control_plane().await;
    let _logs = cp.log_guard();
    let admin = cp.admin_client().await.unwrap();
    let sim = Vcsim::start_with_login("k8s-ccm@vsphere.local", PASSWORD);
    sim.guest("DC0_H0_VM0", "vs-node-a", &[("VM Network", &["10.0.0.10"])]);
    sim.guest("DC0_H0_VM1", "vs-node-b", &[("VM Network", &["10.0.0.11"])]);

    // The chart as the preset installs it: config in the ConfigMap, credentials in the Secret.
    let objects = chart::render_preset("vsphere", "vsphere-ccm", "kube-system", &[]).unwrap();
    chart::apply_rbac(&admin, &objects).await.expect("the chart's RBAC applies");
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "vsphere-cloud-secret", "namespace": "kube-system"},
        "stringData": {
            "127.0.0.1.username": "k8s-ccm@vsphere.local",
            "127.0.0.1.password": PASSWORD,
        },
    }))
    .unwrap();
    Api::<Secret>::namespaced(admin.clone(), "kube-system")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
    let sa = chart::manager_service_account(&objects).unwrap();
    let (sa_ns, sa_name) = (chart::namespace(sa).unwrap(), chart::name(sa));
    let sa_client = chart::service_account_client(&cp, &admin, sa_ns, sa_name).await.unwrap();
    // Wait until the authorizer knows both grants (bindings reach it through informers).
    ccm_testbed::wait_for(
        "the chart's ServiceAccount may list Nodes and get its Secret",
        Duration::from_secs(60),
        || {
            let nodes: Api<Node> = Api::all(sa_client.clone());
            let secrets: Api<Secret> = Api::namespaced(sa_client.clone(), "kube-system");
            async move {
                nodes.list(&Default::default()).await.ok()?;
                secrets.get("vsphere-cloud-secret").await.ok().map(drop)
            }
        },
    )
    .await;

    let dir = std::env::temp_dir().join(unique_name("chart-vsphere"));
    std::fs::create_dir_all(&dir).unwrap();
    let kubeconfig = dir.join("kubeconfig");
    let json = chart::service_account_kubeconfig(&cp, &admin, sa_ns, sa_name).await.unwrap();
    std::fs::write(&kubeconfig, serde_json::to_string(&json).unwrap()).unwrap();
    // The operator's vsphere.conf: no credentials in it, only where the Secret is.
    let config_text = format!(
        "[Global]\nsecret-name = vsphere-cloud-secret\nsecret-namespace = kube-system\n\
         insecure-flag = true\nport = {}\n\n[VirtualCenter \"127.0.0.1\"]\ndatacenters = DC0\n",
        sim.port
    );
    let cloud_config = dir.join("vsphere.conf");
    std::fs::write(&cloud_config, &config_text).unwrap();

    let argv = chart::container_args(chart::workload(&objects).unwrap()).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let healthz_port =
        std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let mut args: Vec<String> = argv
        .iter()
        .map(|a| {
            if a.starts_with("--cloud-config=/etc/kubernetes/cloud-config/") {
                format!("--cloud-config={}", cloud_config.display())
            } else if a.starts_with("--secure-port=") {
                format!("--secure-port={port}")
            } else if a.starts_with("--healthz-bind-address=127.0.0.1:") {
                format!("--healthz-bind-address=127.0.0.1:{healthz_port}")
            } else {
                a.clone()
            }
        })
        .collect();
    assert!(args.iter().any(|a| a.starts_with("--cloud-config=") && a.ends_with("vsphere.conf")));
    args.push(format!("--kubeconfig={}", kubeconfig.display()));
    // From here on, any request of the chart's ServiceAccounts the apiserver refuses counts.
    let mark = cp.audit_mark().unwrap();

    let extensions = ccm_core::manager::extensions::Extensions::default();
    let flags =
        ccm_core::manager::parse_flags(&extensions, &args).expect("the chart's flags parse");
    let options = extensions.validate(flags, "vsphere").expect("the chart's flags validate");
    let shutdown = ccm_core::manager::CancellationToken::new();
    let stop = shutdown.clone();
    let manager = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async move {
            let factory: ccm_core::manager::CloudFactory = Box::new(move |config| {
                assert_eq!(config.map(<[u8]>::to_vec), Some(config_text.into_bytes()));
                let sources = ccm_provider_vsphere::config::CredentialSources::default();
                let cloud = ccm_provider_vsphere::VsphereProvider::new(
                    config.unwrap_or_default(),
                    &sources,
                )?;
                Ok(Arc::new(cloud) as Arc<dyn ccm_core::cloud::CloudProvider>)
            });
            ccm_core::manager::run_until("vsphere", options, factory, &extensions, stop)
                .await
                .map_err(|e| e.to_string())
        })
    });

    let nodes: Api<Node> = Api::all(admin.clone());
    for (name, ip) in [("vs-node-a", "10.0.0.10"), ("vs-node-b", "10.0.0.11")] {
        nodes
            .create(&PostParams::default(), &ccm_testbed::fixtures::kubelet_node(name, ip, "True"))
            .await
            .unwrap();
    }
    for (name, vm) in [("vs-node-a", "DC0_H0_VM0"), ("vs-node-b", "DC0_H0_VM1")] {
        let want = format!("vsphere://{}", sim.vm(vm).uuid);
        let nodes = nodes.clone();
        ccm_testbed::wait_for(
            &format!("the chart's CCM initialises {name}"),
            Duration::from_secs(120),
            || {
                assert!(
                    !manager.is_finished(),
                    "the manager ended under the chart's args and RBAC"
                );
                let (nodes, want) = (nodes.clone(), want.clone());
                async move {
                    let spec = nodes.get(name).await.ok()?.spec?;
                    let tainted = spec
                        .taints
                        .unwrap_or_default()
                        .iter()
                        .any(|t| t.key == names::TAINT_UNINITIALIZED);
                    (spec.provider_id? == want && !tainted).then_some(())
                }
            },
        )
        .await;
    }

    shutdown.cancel();
    let ended = manager.join().expect("the manager thread");
    assert!(ended.is_ok(), "the manager ended with {ended:?}");
    let denied = forbidden_since(&cp, &mark).await;
    assert!(
        denied.is_empty(),
        "the apiserver refused requests of the CCM running under the chart's RBAC: {denied:#?}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}

/// What a cloud's own code calls, allowed by exactly its preset's RBAC on the real apiserver,
/// acting as the chart's ServiceAccount: GCP lists ConfigMap `kube-system/ingress-uid` the way
/// `providers/gcp/src/load_balancer/cluster_id.rs` does (a list with the field selector
/// `metadata.name=ingress-uid`) and may create it, but lists no other ConfigMap and reads no
/// Secret; GCP and OpenStack patch Services (finalizers, annotations written back); AWS, whose
/// code writes no Service, may not.
#[tokio::test]
async fn each_clouds_own_kubernetes_calls_are_allowed_by_its_preset_and_no_more() {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret, Service};
    use kube::api::{ListParams, Patch, PatchParams, PostParams};
    use std::time::Duration;

    let cp = ControlPlane::shared().await.expect("control plane");
    let admin = cp.admin_client().await.unwrap();
    // A Service to patch, in a namespace of its own.
    let ns = unique_name("chart-rbac");
    let ns_obj = serde_json::from_value(serde_json::json!({"metadata": {"name": ns}})).unwrap();
    Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
        .create(&PostParams::default(), &ns_obj)
        .await
        .unwrap();
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "lb"},
        "spec": {"type": "LoadBalancer", "ports": [{"port": 80}]},
    }))
    .unwrap();
    Api::<Service>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();

    let forbidden =
        |r: &Result<(), kube::Error>| matches!(r, Err(kube::Error::Api(s)) if s.code == 403);
    for (cloud, patches_services) in [("gcp", true), ("openstack", true), ("aws", false)] {
        let release = unique_name(&format!("rbac-{cloud}"));
        let objects = chart::render_preset(cloud, &release, "kube-system", &[]).unwrap();
        chart::apply_rbac(&admin, &objects).await.expect("the chart's RBAC applies");
        let sa = chart::manager_service_account(&objects).unwrap();
        let client = chart::service_account_client(cp, &admin, "kube-system", chart::name(sa))
            .await
            .unwrap();
        // The authorizer learns new bindings through informers: wait until every grant this
        // cloud should have is in place (so no 403 below comes from that delay).
        let (wait_client, wait_ns) = (client.clone(), ns.clone());
        ccm_testbed::wait_for(
            &format!("{cloud}: the chart's ServiceAccount has its grants"),
            Duration::from_secs(60),
            || {
                let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(wait_client.clone());
                let services = Api::<Service>::namespaced(wait_client.clone(), &wait_ns);
                let config_maps = Api::<ConfigMap>::namespaced(wait_client.clone(), "kube-system");
                async move {
                    nodes.list(&Default::default()).await.ok()?;
                    if patches_services {
                        let dry = PatchParams { dry_run: true, ..Default::default() };
                        let patch = serde_json::json!({"metadata": {"annotations": {}}});
                        services.patch("lb", &dry, &Patch::Merge(&patch)).await.ok()?;
                    }
                    if cloud == "gcp" {
                        let by_name = ListParams::default().fields("metadata.name=ingress-uid");
                        config_maps.list(&by_name).await.ok()?;
                    }
                    Some(())
                }
            },
        )
        .await;

        let services = Api::<Service>::namespaced(client.clone(), &ns);
        let dry = PatchParams { dry_run: true, ..Default::default() };
        let patch =
            serde_json::json!({"metadata": {"annotations": {"example.com/chart-test": "x"}}});
        let patched = services.patch("lb", &dry, &Patch::Merge(&patch)).await.map(drop);
        if patches_services {
            assert!(patched.is_ok(), "{cloud}: services patch: {patched:?}");
        } else {
            assert!(forbidden(&patched), "{cloud}: services patch allowed: {patched:?}");
        }

        let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
        let by_name = ListParams::default().fields("metadata.name=ingress-uid");
        let listed = config_maps.list(&by_name).await.map(drop);
        let all = config_maps.list(&ListParams::default()).await.map(drop);
        assert!(forbidden(&all), "{cloud}: lists every ConfigMap in kube-system: {all:?}");
        let cm: ConfigMap =
            serde_json::from_value(serde_json::json!({"metadata": {"name": "ingress-uid"}}))
                .unwrap();
        let created = config_maps
            .create(&PostParams { dry_run: true, ..Default::default() }, &cm)
            .await
            .map(drop);
        if cloud == "gcp" {
            assert!(listed.is_ok(), "{cloud}: list ingress-uid by name: {listed:?}");
            assert!(!forbidden(&created), "{cloud}: create ingress-uid (dry run): {created:?}");
        } else {
            assert!(forbidden(&listed), "{cloud}: lists ingress-uid: {listed:?}");
            assert!(forbidden(&created), "{cloud}: creates ConfigMaps: {created:?}");
        }
        let secret = Api::<Secret>::namespaced(client.clone(), "kube-system")
            .get_opt("ingress-uid")
            .await
            .map(drop);
        assert!(forbidden(&secret), "{cloud}: reads a Secret: {secret:?}");
    }
}
