//! The operator tools (issue 20), as an operator runs them: the real binary's `orphans` and
//! `migrate-check` subcommands against a real kube-apiserver and moto (AWS) or the IBM
//! emulator, under an identity that may only get and list Nodes and Services (so a write
//! would fail, and the tests also check that no object changed).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ccm_testbed::Identity;
use k8s_openapi::api::core::v1::{Node, NodeSpec, Service};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, PolicyRule, RoleRef, Subject};
use kube::Api;
use kube::api::{ListParams, ObjectMeta, PostParams};
use serde_json::Value;
use tokio::io::AsyncWriteExt as _;

use crate::support::{Binary, Env, assert_output_has_no_secrets, register_kubeconfig_secrets};

/// The read-only identity the tools run as.
const READER: &str = "ops-reader";

/// Grants [`READER`] get/list on Nodes and Services, nothing else, and writes its kubeconfig.
async fn reader_kubeconfig(env: &Env) -> PathBuf {
    let roles: Api<ClusterRole> = Api::all(env.client.clone());
    let role = ClusterRole {
        metadata: ObjectMeta { name: Some(READER.into()), ..Default::default() },
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["nodes".into(), "services".into()]),
            verbs: vec!["get".into(), "list".into()],
            ..Default::default()
        }]),
        ..Default::default()
    };
    roles.create(&PostParams::default(), &role).await.unwrap();
    let bindings: Api<ClusterRoleBinding> = Api::all(env.client.clone());
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta { name: Some(READER.into()), ..Default::default() },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: READER.into(),
        },
        subjects: Some(vec![Subject {
            kind: "User".into(),
            name: READER.into(),
            api_group: Some("rbac.authorization.k8s.io".into()),
            ..Default::default()
        }]),
    };
    bindings.create(&PostParams::default(), &binding).await.unwrap();
    let path = env.dir.join("reader.kubeconfig");
    env.cp.write_kubeconfig(&path, &Identity::new(READER, &[])).unwrap();
    register_kubeconfig_secrets(&path);
    path
}

/// Runs `<binary> <args>` with `stdin` fed in: (exit code, stdout, stderr). Output is scanned
/// for credentials.
async fn run_tool(bin: &Binary, args: &[String], stdin: &str) -> (Option<i32>, String, String) {
    let mut child = bin
        .command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    // A tool that refuses its arguments may exit before reading stdin; that is judged by its
    // exit code and output, not by the broken pipe.
    match input.write_all(stdin.as_bytes()).await {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        other => other.unwrap(),
    }
    drop(input);
    let out = tokio::time::timeout(Duration::from_secs(300), child.wait_with_output())
        .await
        .expect("the tool finishes")
        .unwrap();
    assert_output_has_no_secrets(bin.name(), &out);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    eprintln!("$ {} {}\n{stdout}{stderr}", bin.name(), args.join(" "));
    (out.status.code(), stdout, stderr)
}

fn tool_args(tool: &str, config: &Path, kubeconfig: &Path, extra: &[&str]) -> Vec<String> {
    let mut args = vec![
        tool.to_string(),
        format!("--cloud-config={}", config.display()),
        format!("--kubeconfig={}", kubeconfig.display()),
    ];
    args.extend(extra.iter().map(|s| s.to_string()));
    args
}

/// `resourceVersion` of every Node and Service: equal before and after means nothing was
/// written.
async fn versions(client: &kube::Client) -> Vec<String> {
    let lp = ListParams::default();
    let nodes: Api<Node> = Api::all(client.clone());
    let services: Api<Service> = Api::all(client.clone());
    let mut out: Vec<String> = nodes
        .list(&lp)
        .await
        .unwrap()
        .items
        .iter()
        .map(|n| format!("node/{:?}@{:?}", n.metadata.name, n.metadata.resource_version))
        .collect();
    out.extend(
        services
            .list(&lp)
            .await
            .unwrap()
            .items
            .iter()
            .map(|s| format!("service/{:?}@{:?}", s.metadata.name, s.metadata.resource_version)),
    );
    out
}

fn orphan_names(json: &str) -> Vec<String> {
    let v: Value = serde_json::from_str(json).unwrap_or_else(|e| panic!("{e}: {json}"));
    let mut names: Vec<String> = v["orphans"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["name"].as_str().unwrap().to_string())
        .collect();
    names.sort();
    names
}

#[cfg(all(feature = "provider-aws", feature = "testing"))]
mod aws {
    use super::*;
    use ccm_core::cloud::{CloudProvider as _, default_load_balancer_name};
    use ccm_provider_aws::testing::aws_sdk_elasticloadbalancing::types::{Listener, Tag as ElbTag};
    use ccm_provider_aws::testing::{
        self, aws_sdk_ec2::types::Instance, aws_sdk_elasticloadbalancing, network,
        node_security_group, run_instances,
    };
    use ccm_testbed::fixtures::load_balancer_service;
    use ccm_testbed::moto::Moto;
    use kube::api::{DeleteParams, Patch, PatchParams};

    use crate::support::{initialised, register, wait_for};

    const BIN: Binary = crate::support::AWS_BIN;

    const NLB_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";

    /// A Node as the node controller leaves it (providerID set), in memory: the backends.
    fn backend(i: &Instance) -> Node {
        let az = i.placement().unwrap().availability_zone().unwrap();
        Node {
            metadata: ObjectMeta {
                name: Some(i.private_dns_name().unwrap().to_string()),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                provider_id: Some(format!("aws:///{az}/{}", i.instance_id().unwrap())),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A classic ELB made outside the cluster's controller, with these tags.
    async fn foreign_elb(
        elb: &aws_sdk_elasticloadbalancing::Client,
        name: &str,
        subnet: &str,
        tags: &[(&str, &str)],
    ) -> String {
        let resp = elb
            .create_load_balancer()
            .load_balancer_name(name)
            .listeners(
                Listener::builder()
                    .protocol("TCP")
                    .load_balancer_port(80)
                    .instance_port(30080)
                    .build()
                    .unwrap(),
            )
            .subnets(subnet)
            .set_tags(Some(
                tags.iter()
                    .map(|(k, v)| ElbTag::builder().key(*k).value(*v).build().unwrap())
                    .collect(),
            ))
            .send()
            .await
            .unwrap();
        resp.dns_name().unwrap().to_string()
    }

    async fn classic_names(elb: &aws_sdk_elasticloadbalancing::Client) -> Vec<String> {
        let d = elb.describe_load_balancers().send().await.unwrap();
        let mut names: Vec<String> = d
            .load_balancer_descriptions()
            .iter()
            .filter_map(|l| l.load_balancer_name())
            .map(str::to_string)
            .collect();
        names.sort();
        names
    }

    async fn group_names(ec2: &testing::aws_sdk_ec2::Client) -> Vec<String> {
        let d = ec2.describe_security_groups().send().await.unwrap();
        d.security_groups().iter().filter_map(|g| g.group_name()).map(str::to_string).collect()
    }

    #[tokio::test]
    async fn orphans_finds_and_deletes_only_the_clusters_load_balancers_left_by_deleted_services() {
        const CLUSTER: &str = "ops-orphans";
        let moto = Moto::start().await.unwrap();
        let ec2 = testing::ec2(&moto.url).await;
        let elb = testing::elb(&moto.url).await;
        let elbv2 = testing::elbv2(&moto.url).await;
        let net = network(&ec2, CLUSTER).await.unwrap();
        let node_sg = node_security_group(&ec2, &net.vpc, CLUSTER).await.unwrap();
        let insts =
            run_instances(&ec2, &net.subnets[0].0, CLUSTER, 2, Some(&node_sg)).await.unwrap();
        let nodes: Vec<Node> = insts.iter().map(backend).collect();

        let env = Env::start(BIN).await;
        let _logs = env.cp.log_guard();
        let reader = reader_kubeconfig(&env).await;
        let config = env.dir.join("cloud.conf");
        std::fs::write(&config, testing::cloud_config(&moto.url, CLUSTER, "")).unwrap();

        // Three Services get their load balancers from the provider (as the service
        // controller would); two are then deleted without a finalizer holding them back, so
        // their classic ELB and NLB stay behind.
        let (cloud, _) = testing::cloud(&moto.url, CLUSTER, "").await.unwrap();
        let lbs = cloud.load_balancer().unwrap();
        let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
        let mut names = Vec::new();
        for (name, port, nlb) in
            [("keep", 80, false), ("gone", 81, false), ("gone-nlb", 82, true), ("cut", 83, false)]
        {
            let mut svc = load_balancer_service("default", name, port);
            if nlb {
                svc.metadata.annotations =
                    Some([(NLB_TYPE.to_string(), "nlb".to_string())].into_iter().collect());
            }
            let svc = services.create(&PostParams::default(), &svc).await.unwrap();
            lbs.ensure_load_balancer("kubernetes", &svc, &nodes).await.unwrap();
            names.push(default_load_balancer_name(&svc));
        }
        let (keep, gone, gone_nlb) = (names[0].clone(), names[1].clone(), names[2].clone());
        // "cut": a deletion cut short after its ELB went and before its security group did.
        let cut = names[3].clone();
        elb.delete_load_balancer().load_balancer_name(&cut).send().await.unwrap();
        for name in ["gone", "gone-nlb", "cut"] {
            services.delete(name, &DeleteParams::default()).await.unwrap();
        }
        wait_for("the three Services to be gone", || async {
            let gone = services.get_opt("gone").await.ok()?.is_none()
                && services.get_opt("gone-nlb").await.ok()?.is_none()
                && services.get_opt("cut").await.ok()?.is_none();
            gone.then_some(())
        })
        .await;
        // Not the cluster's: untagged, shared (not created by it), another cluster's.
        let subnet = &net.subnets[0].0;
        foreign_elb(&elb, "untagged-elb", subnet, &[("team", "web")]).await;
        let shared = format!("kubernetes.io/cluster/{CLUSTER}");
        foreign_elb(&elb, "shared-elb", subnet, &[(shared.as_str(), "shared")]).await;
        foreign_elb(&elb, "other-elb", subnet, &[("kubernetes.io/cluster/other", "owned")]).await;
        let before = versions(&env.client).await;

        // Listing: exactly the three, with the security group and target group made for them.
        let (code, json, _) =
            run_tool(&BIN, &tool_args("orphans", &config, &reader, &["--output=json"]), "").await;
        assert_eq!(code, Some(0));
        let mut want = vec![gone.clone(), gone_nlb.clone(), cut.clone()];
        want.sort();
        assert_eq!(orphan_names(&json), want);
        let v: Value = serde_json::from_str(&json).unwrap();
        let orphans = v["orphans"].as_array().unwrap();
        let classic = orphans.iter().find(|o| o["name"] == gone.as_str()).unwrap();
        assert_eq!(classic["service"], "default/gone");
        assert_eq!(classic["resources"][0]["kind"], "security group");
        assert_eq!(classic["resources"][0]["name"], format!("k8s-elb-{gone}"));
        let nlb = orphans.iter().find(|o| o["name"] == gone_nlb.as_str()).unwrap();
        assert_eq!(nlb["kind"], "NLB");
        assert_eq!(nlb["resources"][0]["kind"], "target group");
        let leftover = orphans.iter().find(|o| o["name"] == cut.as_str()).unwrap();
        assert_eq!(leftover["kind"], "classic ELB (gone; security group left)");
        assert_eq!(leftover["service"], "default/cut");
        assert_eq!(leftover["resources"][0]["name"], format!("k8s-elb-{cut}"));
        let (_, text, _) = run_tool(&BIN, &tool_args("orphans", &config, &reader, &[]), "").await;
        assert!(text.contains(&format!("classic ELB {gone}")), "{text}");
        assert!(text.contains("Run with --delete"), "{text}");

        // --delete without confirmation deletes nothing.
        let all = classic_names(&elb).await;
        let (code, _, err) =
            run_tool(&BIN, &tool_args("orphans", &config, &reader, &["--delete"]), "no\n").await;
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("nothing deleted"), "{err}");
        assert_eq!(classic_names(&elb).await, all);

        // Confirmed: both are gone with their security group and target groups; everything
        // else stays.
        let (code, out, err) =
            run_tool(&BIN, &tool_args("orphans", &config, &reader, &["--delete"]), "yes\n").await;
        assert_eq!(code, Some(0), "{out}{err}");
        let mut left = vec![
            keep.clone(),
            "other-elb".to_string(),
            "shared-elb".to_string(),
            "untagged-elb".to_string(),
        ];
        left.sort();
        assert_eq!(classic_names(&elb).await, left);
        let v2 = elbv2.describe_load_balancers().send().await.unwrap();
        assert!(v2.load_balancers().is_empty(), "the NLB is gone: {v2:?}");
        let tgs = elbv2.describe_target_groups().send().await.unwrap();
        assert!(tgs.target_groups().is_empty(), "its target groups are gone: {tgs:?}");
        let groups = group_names(&ec2).await;
        assert!(!groups.contains(&format!("k8s-elb-{gone}")), "{groups:?}");
        assert!(!groups.contains(&format!("k8s-elb-{cut}")), "{groups:?}");
        assert!(groups.contains(&format!("k8s-elb-{keep}")), "{groups:?}");
        assert_eq!(versions(&env.client).await, before, "no Node or Service was written");

        // Nothing left to find, and `--yes` on nothing is fine.
        let (code, json, _) = run_tool(
            &BIN,
            &tool_args("orphans", &config, &reader, &["--delete", "--yes", "--output=json"]),
            "",
        )
        .await;
        assert_eq!(code, Some(0));
        assert!(orphan_names(&json).is_empty());
    }

    #[tokio::test]
    async fn migrate_check_passes_a_clean_cluster_and_fails_on_a_renamed_load_balancer() {
        const CLUSTER: &str = "ops-migrate";
        let moto = Moto::start().await.unwrap();
        let ec2 = testing::ec2(&moto.url).await;
        let elb = testing::elb(&moto.url).await;
        let net = network(&ec2, CLUSTER).await.unwrap();
        let node_sg = node_security_group(&ec2, &net.vpc, CLUSTER).await.unwrap();
        let insts =
            run_instances(&ec2, &net.subnets[0].0, CLUSTER, 2, Some(&node_sg)).await.unwrap();

        // A cluster as a controller left it: ours, here, then stopped.
        let env = Env::start(BIN).await;
        let _logs = env.cp.log_guard();
        let reader = reader_kubeconfig(&env).await;
        let cloud_config = testing::cloud_config(&moto.url, CLUSTER, "");
        let config = env.dir.join("ops-cloud.conf");
        std::fs::write(&config, &cloud_config).unwrap();
        let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
        {
            let ccm = env.spawn_ccm(&cloud_config, &["--configure-cloud-routes=false".into()]);
            let nodes = env.nodes();
            for i in &insts {
                register(
                    &nodes,
                    i.private_dns_name().unwrap(),
                    i.private_ip_address().unwrap(),
                    "True",
                )
                .await;
            }
            for i in &insts {
                initialised(&nodes, i.private_dns_name().unwrap()).await;
            }
            services
                .create(&PostParams::default(), &load_balancer_service("default", "web", 80))
                .await
                .unwrap();
            wait_for("the Service's load-balancer hostname", || async {
                let s = services.get("web").await.ok()?;
                s.status?.load_balancer?.ingress?.first()?.hostname.clone()
            })
            .await;
            // Address refreshes settle before the manager stops.
            drop(ccm);
        }
        let before = versions(&env.client).await;

        let (code, out, err) =
            run_tool(&BIN, &tool_args("migrate-check", &config, &reader, &[]), "").await;
        assert_eq!(code, Some(0), "a clean cluster: {out}{err}");
        assert!(out.contains("no change would disrupt traffic"), "{out}");

        // A Service served by a load balancer under another name (as another controller
        // named it): ours would create its own, with a new hostname.
        let legacy_host = foreign_elb(
            &elb,
            "legacy-web",
            &net.subnets[0].0,
            &[(format!("kubernetes.io/cluster/{CLUSTER}").as_str(), "owned")],
        )
        .await;
        let legacy = services
            .create(&PostParams::default(), &load_balancer_service("default", "legacy", 81))
            .await
            .unwrap();
        let status = serde_json::json!({"status": {"loadBalancer": {"ingress": [{"hostname": legacy_host}]}}});
        services
            .patch_status("legacy", &PatchParams::default(), &Patch::Merge(&status))
            .await
            .unwrap();
        let ours = default_load_balancer_name(&legacy);
        let before_rename = versions(&env.client).await;
        assert_ne!(before, before_rename);

        let (code, out, _) =
            run_tool(&BIN, &tool_args("migrate-check", &config, &reader, &[]), "").await;
        assert_eq!(code, Some(1), "a rename disrupts traffic: {out}");
        assert!(out.contains("service/default/legacy:"), "{out}");
        assert!(out.contains("DISRUPTIVE load balancer"), "{out}");
        assert!(out.contains("legacy-web") && out.contains(&ours), "{out}");
        assert!(!out.contains("service/default/web:"), "web keeps its ELB: {out}");

        let (code, json, _) = run_tool(
            &BIN,
            &tool_args("migrate-check", &config, &reader, &["--output", "json"]),
            "",
        )
        .await;
        assert_eq!(code, Some(1));
        let v: Value = serde_json::from_str(&json).unwrap();
        let disruptive: Vec<&Value> =
            v["changes"].as_array().unwrap().iter().filter(|c| c["disruptive"] == true).collect();
        assert_eq!(disruptive.len(), 1, "{json}");
        assert_eq!(disruptive[0]["object"], "service/default/legacy");
        assert_eq!(disruptive[0]["to"], ours.as_str());
        assert_eq!(v["nodes"], 2);
        assert_eq!(versions(&env.client).await, before_rename, "nothing was written");
    }
}

#[cfg(feature = "provider-ibm")]
mod ibm {
    use super::*;
    use std::collections::BTreeMap;

    use ccm_core::cloud::CloudProvider as _;
    use ccm_provider_ibm::IbmProvider;
    use ccm_provider_ibm::client::ClientOptions;
    use ccm_provider_ibm::config::Config;
    use ccm_provider_ibm::load_balancer::{Timings, annotations};
    use ccm_testbed::fixtures::{kubelet_node, load_balancer_service};
    use kube::api::DeleteParams;

    use crate::ibm::{BIN, CLUSTER, cloud_config, emulator};

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn orphans_deletes_the_clusters_vpc_load_balancers_that_no_service_uses() {
        let (cloud, server) = emulator(Duration::from_millis(300)).await;
        let env = Env::start(BIN).await;
        let _logs = env.cp.log_guard();
        let reader = reader_kubeconfig(&env).await;
        let text = cloud_config(&env.dir, &server.url(), &cloud.account_id());
        let config = env.dir.join("cloud.conf");
        std::fs::write(&config, &text).unwrap();
        let parsed = Config::parse(&text, &BTreeMap::new()).unwrap();
        let timings =
            Timings { poll: Duration::from_millis(200), max_wait: Duration::from_secs(60) };
        let provider = IbmProvider::new(parsed, ClientOptions::default(), timings).unwrap();
        let lbs = provider.load_balancer().unwrap();
        let nodes = vec![kubelet_node("node-a", "10.240.0.4", "True")];

        // "keep" stays; "gone" is deleted without a finalizer; "named" has an annotated name,
        // created and tagged for this cluster and its Service (issue #29: the tags are the
        // ownership proof), and is deleted too: both are provable orphans.
        let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
        let mut names = Vec::new();
        for (name, port) in [("keep", 80), ("gone", 81), ("named", 82)] {
            let mut svc = load_balancer_service("default", name, port);
            if name == "named" {
                svc.metadata.annotations = Some(
                    [(annotations::VPC_LB_NAME.to_string(), "kube-other-web".to_string())]
                        .into_iter()
                        .collect(),
                );
            }
            let svc = services.create(&PostParams::default(), &svc).await.unwrap();
            lbs.ensure_load_balancer("kubernetes", &svc, &nodes).await.unwrap();
            names.push(lbs.load_balancer_name("kubernetes", &svc));
        }
        assert!(names[1].starts_with(&format!("kube-{CLUSTER}-")), "{names:?}");
        for name in ["gone", "named"] {
            services.delete(name, &DeleteParams::default()).await.unwrap();
        }
        crate::support::wait_for("the Services to be gone", || async {
            let gone = services.get_opt("gone").await.ok()?.is_none()
                && services.get_opt("named").await.ok()?.is_none();
            gone.then_some(())
        })
        .await;

        let (code, json, _) =
            run_tool(&BIN, &tool_args("orphans", &config, &reader, &["--output=json"]), "").await;
        assert_eq!(code, Some(0));
        let mut orphans = orphan_names(&json);
        orphans.sort();
        let mut want = vec![names[1].clone(), names[2].clone()];
        want.sort();
        assert_eq!(orphans, want);
        let v: Value = serde_json::from_str(&json).unwrap();
        assert_eq!(v["orphans"][0]["resources"][0]["kind"], "public IP");

        let (code, out, err) =
            run_tool(&BIN, &tool_args("orphans", &config, &reader, &["--delete", "--yes"]), "")
                .await;
        assert_eq!(code, Some(0), "{out}{err}");
        assert!(out.contains(&format!("deleted {}", names[1])), "{out}");
        assert!(out.contains(&format!("deleted {}", names[2])), "{out}");
        let mut left: Vec<String> = provider
            .client()
            .list_load_balancers()
            .await
            .unwrap()
            .into_iter()
            .map(|l| l.name)
            .collect();
        left.sort();
        assert_eq!(left, vec![names[0].clone()], "only the orphans were deleted");
    }
}
