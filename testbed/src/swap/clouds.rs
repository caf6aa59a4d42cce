//! The six clouds' upstream artifacts (pinned) and worlds (emulators, Nodes, configs).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::{Value, json};

use super::{Case, CloudAccess, SwapError, World, WorldOptions, emulator, step};
use crate::{chart, tools};

/// The clouds, in the order `ccm-swap` runs them.
pub const CLOUDS: [&str; 6] = ["aws", "vsphere", "openstack", "azure", "gcp", "ibm"];

/// AWS: module and version.
pub const AWS: (&str, &str) = ("k8s.io/cloud-provider-aws", "v1.36.2");
/// OpenStack: module and version.
pub const OPENSTACK: (&str, &str) = ("k8s.io/cloud-provider-openstack", "v1.36.0");
/// vSphere: module and version.
pub const VSPHERE: (&str, &str) = ("k8s.io/cloud-provider-vsphere", "v1.36.0");
/// Azure: module and version.
pub const AZURE: (&str, &str) = ("sigs.k8s.io/cloud-provider-azure", "v1.36.5");

fn module((m, v): (&str, &str)) -> Result<PathBuf, SwapError> {
    super::module_dir(m, v)
}

fn s(v: &str) -> String {
    v.to_string()
}

fn values(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
    pairs.iter().map(|(k, v)| (s(k), s(v))).collect()
}

fn describe_values(v: &[(String, String)]) -> String {
    if v.is_empty() {
        "default values".into()
    } else {
        v.iter().map(|(k, v)| format!("`{k}={v}`")).collect::<Vec<_>>().join(", ")
    }
}

/// The chart's version (`Chart.yaml`).
fn chart_version(dir: &Path) -> String {
    std::fs::read_to_string(dir.join("Chart.yaml"))
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| {
                l.strip_prefix("version:").map(|v| v.trim().trim_matches('"').to_string())
            })
        })
        .unwrap_or_default()
}

/// The cases of `cloud`: upstream's artifact rendered with its defaults, and with the values
/// operators commonly set (and the manifests, where upstream ships them besides the chart).
pub fn cases(cloud: &str) -> Result<Vec<Case>, SwapError> {
    match cloud {
        "aws" => aws_cases(),
        "vsphere" => vsphere_cases(),
        "openstack" => openstack_cases(),
        "azure" => azure_cases(),
        "gcp" => fixture_case("gcp", "Deployment", "cloud-controller-manager"),
        "ibm" => fixture_case("ibm", "Deployment", "ibm-cloud-controller-manager"),
        other => Err(step(format!("unknown cloud {other:?} (one of {})", CLOUDS.join(", ")))),
    }
}

fn aws_cases() -> Result<Vec<Case>, SwapError> {
    let root = module(AWS)?;
    let chart_dir = root.join("charts/aws-cloud-controller-manager");
    let version = chart_version(&chart_dir);
    let mut out = Vec::new();
    // The chart's `args` value, as an operator sets it: upstream's defaults plus what its
    // issue tracker documents (no --cluster-cidr in the chart: routes off), and the common
    // per-controller credentials.
    for (extra, why) in
        [(None, "defaults"), (Some("--use-service-account-credentials=true"), "operator values")]
    {
        let mut args = vec!["--v=2", "--cloud-provider=aws", "--configure-cloud-routes=false"];
        args.extend(extra);
        let set = vec![(s("args"), format!("{{{}}}", args.join(",")))];
        let objects =
            super::helm_template(&chart_dir, "aws-cloud-controller-manager", "kube-system", &set)?;
        out.push(Case {
            cloud: s("aws"),
            artifact: format!(
                "chart aws-cloud-controller-manager {version} ({} {}), {why}: {}",
                AWS.0,
                AWS.1,
                describe_values(&set)
            ),
            objects,
            changes: vec![s(
                "args value adds --configure-cloud-routes=false: the chart passes no --cluster-cidr and \
                 upstream's route controller then fails to start (upstream's documented fix)",
            )],
            manager: (s("DaemonSet"), s("aws-cloud-controller-manager")),
            node_manager: None,
        });
    }
    // The example manifests (kustomize base; its resources applied as they are).
    let dir = root.join("examples/existing-cluster/base");
    let files = [
        "service-account.yaml",
        "cluster-role.yaml",
        "cluster-role-binding.yaml",
        "apiserver-authentication-reader-role-binding.yaml",
        "aws-cloud-controller-manager-daemonset.yaml",
    ];
    out.push(Case {
        cloud: s("aws"),
        artifact: format!(
            "examples/existing-cluster/base ({} {}): {}",
            AWS.0,
            AWS.1,
            files.join(", ")
        ),
        objects: super::read_manifests(&files.map(|f| dir.join(f)))?,
        changes: Vec::new(),
        manager: (s("DaemonSet"), s("aws-cloud-controller-manager")),
        node_manager: None,
    });
    Ok(out)
}

fn vsphere_cases() -> Result<Vec<Case>, SwapError> {
    let root = module(VSPHERE)?;
    let chart_dir = root.join("charts/vsphere-cpi");
    let version = chart_version(&chart_dir);
    let mut out = Vec::new();
    for set in [
        Vec::new(),
        values(&[
            ("config.enabled", "true"),
            ("config.vcenter", "127.0.0.1"),
            ("config.username", VSPHERE_USER),
            ("config.password", VSPHERE_PASSWORD),
            ("config.datacenter", "DC0"),
        ]),
    ] {
        let objects = super::helm_template(&chart_dir, "vsphere-cpi", "kube-system", &set)?;
        out.push(Case {
            cloud: s("vsphere"),
            artifact: format!(
                "chart vsphere-cpi {version} ({} {}), {}",
                VSPHERE.0,
                VSPHERE.1,
                describe_values(&set).replace(VSPHERE_PASSWORD, "<password>")
            ),
            objects,
            changes: Vec::new(),
            manager: (s("DaemonSet"), s("vsphere-cpi")),
            node_manager: None,
        });
    }
    let dir = root.join("manifests/controller-manager");
    let files = [
        "cloud-controller-manager-roles.yaml",
        "cloud-controller-manager-role-bindings.yaml",
        "vsphere-cloud-controller-manager-ds.yaml",
    ];
    out.push(Case {
        cloud: s("vsphere"),
        artifact: format!(
            "manifests/controller-manager ({} {}): {}",
            VSPHERE.0,
            VSPHERE.1,
            files.join(", ")
        ),
        objects: super::read_manifests(&files.map(|f| dir.join(f)))?,
        changes: Vec::new(),
        manager: (s("DaemonSet"), s("vsphere-cloud-controller-manager")),
        node_manager: None,
    });
    Ok(out)
}

/// OpenStack's chart with a labels-only stand-in for the `common` chart it depends on
/// (Bitnami's, not served by the Go module proxy): a copy of the chart in the cache with
/// `charts/common` defining `common.labels.standard`, the only template it includes.
fn openstack_chart(root: &Path) -> Result<PathBuf, SwapError> {
    let src = root.join("charts/openstack-cloud-controller-manager");
    let dst = super::cache_dir()
        .join(format!("standin/openstack-cloud-controller-manager-{}", OPENSTACK.1));
    if !dst.join("charts/common/templates/_labels.tpl").is_file() {
        let _ = std::fs::remove_dir_all(&dst);
        std::fs::create_dir_all(dst.parent().unwrap_or(Path::new(".")))
            .map_err(|e| step(format!("{}: {e}", dst.display())))?;
        let ok = Command::new("cp")
            .arg("-r")
            .arg(&src)
            .arg(&dst)
            .status()
            .map(|s| s.success())
            .unwrap_or(false);
        if !ok {
            return Err(step(format!("copying {} to {}", src.display(), dst.display())));
        }
        let common = dst.join("charts/common/templates");
        std::fs::create_dir_all(&common).map_err(|e| step(format!("{}: {e}", common.display())))?;
        let write = |p: PathBuf, t: &str| {
            std::fs::write(&p, t).map_err(|e| step(format!("{}: {e}", p.display())))
        };
        write(
            dst.join("charts/common/Chart.yaml"),
            "apiVersion: v2\nname: common\nversion: 2.14.1\ntype: library\ndescription: ccm-swap's labels-only stand-in for the common chart\n",
        )?;
        write(
            common.join("_labels.tpl"),
            "{{- define \"common.labels.standard\" -}}\napp.kubernetes.io/name: {{ .Chart.Name }}\nhelm.sh/chart: {{ printf \"%s-%s\" .Chart.Name .Chart.Version }}\napp.kubernetes.io/instance: {{ .Release.Name }}\napp.kubernetes.io/managed-by: {{ .Release.Service }}\n{{- end -}}\n",
        )?;
    }
    Ok(dst)
}

fn openstack_cases() -> Result<Vec<Case>, SwapError> {
    let root = module(OPENSTACK)?;
    let chart_dir = openstack_chart(&root)?;
    let version = chart_version(&chart_dir);
    let standin = s(
        "the chart's dependency `common` (Bitnami, not served by the Go module proxy) is a labels-only \
         stand-in defining common.labels.standard",
    );
    let mut out = Vec::new();
    for set in [
        Vec::new(),
        values(&[
            ("enabledControllers", "{cloud-node,cloud-node-lifecycle,service}"),
            ("logVerbosityLevel", "4"),
        ]),
    ] {
        let objects = super::helm_template(&chart_dir, "openstack-ccm", "kube-system", &set)?;
        out.push(Case {
            cloud: s("openstack"),
            artifact: format!(
                "chart openstack-cloud-controller-manager {version} ({} {}), {}",
                OPENSTACK.0,
                OPENSTACK.1,
                describe_values(&set)
            ),
            objects,
            changes: vec![standin.clone()],
            manager: (s("DaemonSet"), s("openstack-cloud-controller-manager")),
            node_manager: None,
        });
    }
    let dir = root.join("manifests/controller-manager");
    let files = [
        "cloud-controller-manager-roles.yaml",
        "cloud-controller-manager-role-bindings.yaml",
        "openstack-cloud-controller-manager-ds.yaml",
    ];
    out.push(Case {
        cloud: s("openstack"),
        artifact: format!(
            "manifests/controller-manager ({} {}): {}",
            OPENSTACK.0,
            OPENSTACK.1,
            files.join(", ")
        ),
        objects: super::read_manifests(&files.map(|f| dir.join(f)))?,
        changes: Vec::new(),
        manager: (s("DaemonSet"), s("openstack-cloud-controller-manager")),
        node_manager: None,
    });
    Ok(out)
}

fn azure_cases() -> Result<Vec<Case>, SwapError> {
    let root = module(AZURE)?;
    let chart_dir = root.join("helm/cloud-provider-azure");
    let version = chart_version(&chart_dir);
    let mut out = Vec::new();
    for set in [
        Vec::new(),
        values(&[
            ("cloudControllerManager.cloudConfigSecretName", AZURE_SECRET),
            ("cloudControllerManager.enableDynamicReloading", "true"),
        ]),
    ] {
        let objects =
            super::helm_template(&chart_dir, "cloud-provider-azure", "kube-system", &set)?;
        out.push(Case {
            cloud: s("azure"),
            artifact: format!(
                "chart cloud-provider-azure {version} ({} {}), {}",
                AZURE.0,
                AZURE.1,
                describe_values(&set)
            ),
            objects,
            changes: Vec::new(),
            manager: (s("Deployment"), s("cloud-controller-manager")),
            node_manager: Some((s("DaemonSet"), s("cloud-node-manager"))),
        });
    }
    Ok(out)
}

/// The GCP and IBM fixtures (`testbed/fixtures/swap/<cloud>.yaml`): their modules are not
/// served by the Go module proxy, so each describes the documented manifest (flags, mounts,
/// RBAC) and says so in its header.
fn fixture_case(cloud: &str, kind: &str, name: &str) -> Result<Vec<Case>, SwapError> {
    let file = tools::repo_root().join(format!("testbed/fixtures/swap/{cloud}.yaml"));
    Ok(vec![Case {
        cloud: s(cloud),
        artifact: format!(
            "fixture testbed/fixtures/swap/{cloud}.yaml (written from upstream's documented manifest; module not served by the proxy)"
        ),
        objects: super::read_manifests(&[file])?,
        changes: Vec::new(),
        manager: (s(kind), s(name)),
        node_manager: None,
    }])
}

const VSPHERE_USER: &str = "k8s-ccm@vsphere.local";
const VSPHERE_PASSWORD: &str = "swap-vsphere-Pa55w0rd";
const AZURE_SECRET: &str = "azure-cloud-provider";

fn write_world(dir: &Path, text: &str) -> Result<PathBuf, SwapError> {
    let p = dir.join("world.yaml");
    std::fs::write(&p, text).map_err(|e| step(format!("{}: {e}", p.display())))?;
    Ok(p)
}

fn nodes(list: &[(&str, &str)]) -> Vec<(String, String, Value)> {
    list.iter().map(|(n, ip)| (s(n), s(ip), Value::Null)).collect()
}

/// The world of `case` (its cloud's emulator and Nodes), with files under `dir`.
pub async fn world(case: &Case, dir: &Path) -> Result<World, SwapError> {
    world_with(case, dir, WorldOptions::default()).await
}

/// The same, built as `options` say (a spare instance, a fault proxy in front of moto or
/// vcsim); [`World::access`] filled in for the differential where the cloud allows.
pub async fn world_with(
    case: &Case,
    dir: &Path,
    options: WorldOptions,
) -> Result<World, SwapError> {
    std::fs::create_dir_all(dir).map_err(|e| step(format!("{}: {e}", dir.display())))?;
    match case.cloud.as_str() {
        "aws" => aws_world(dir, options).await,
        "vsphere" => vsphere_world(case, dir, options).await,
        "openstack" => openstack_world(dir, options),
        "azure" => azure_world(case, dir, options),
        "gcp" => gcp_world(dir),
        "ibm" => ibm_world(dir),
        other => Err(step(format!("no world for {other}"))),
    }
}

/// A fault proxy (`ccm-emulator proxy`) in front of `upstream`: its URL, and its CA file when
/// it serves HTTPS.
pub fn proxy(
    upstream: &str,
    protocol: &str,
    upstream_ca: Option<&str>,
    log: &Path,
) -> Result<(super::Proc, String, Option<String>), SwapError> {
    let https = upstream.starts_with("https://");
    let mut args = vec!["proxy", "--upstream", upstream, "--protocol", protocol];
    if let Some(ca) = upstream_ca {
        args.extend(["--upstream-ca", ca]);
    }
    let (p, lines) = emulator(&args, if https { 2 } else { 1 }, log)?;
    let url = lines[0].trim_end_matches('/').to_string();
    Ok((p, url, lines.get(1).cloned()))
}

#[cfg(not(feature = "aws"))]
async fn aws_world(_dir: &Path, _options: WorldOptions) -> Result<World, SwapError> {
    Err(step("AWS needs ccm-testbed's `aws` feature (cargo build --workspace --all-features)"))
}

/// moto with a tagged VPC and three instances in two zones; the control-plane node's
/// metadata service (the first instance's) from `ccm-emulator aws-imds`. The chart mounts no
/// cloud config: the binary finds region, zone, VPC and cluster ID from metadata and tags,
/// as upstream's does on EC2.
#[cfg(feature = "aws")]
async fn aws_world(dir: &Path, options: WorldOptions) -> Result<World, SwapError> {
    use ccm_provider_aws::testing;
    const CLUSTER: &str = "swap";
    let err = |what: &'static str| move |e: testing::Error| step(format!("{what}: {e}"));
    let moto = crate::moto::Moto::start().await.map_err(|e| step(format!("moto: {e}")))?;
    let ec2 = testing::ec2(&moto.url).await;
    let (net, instances) =
        testing::demo_world(&ec2, CLUSTER).await.map_err(err("the AWS world"))?;
    let first = instances.first().ok_or_else(|| step("moto ran no instance"))?;
    let get = |v: Option<&str>| v.unwrap_or_default().to_string();
    let zone = get(first.placement().and_then(|p| p.availability_zone()));
    let args = [
        "aws-imds".to_string(),
        "--instance-id".into(),
        get(first.instance_id()),
        "--region".into(),
        testing::REGION.into(),
        "--availability-zone".into(),
        zone,
        "--vpc-id".into(),
        net.vpc.clone(),
        "--subnet-id".into(),
        net.subnets[0].0.clone(),
        "--local-ipv4".into(),
        get(first.private_ip_address()),
    ];
    let refs: Vec<&str> = args.iter().map(String::as_str).collect();
    let (imds, lines) = emulator(&refs, 1, &dir.join("imds.log"))?;
    // The demo world's third instance is the spare (it has 2 + 1).
    let nodes = instances
        .iter()
        .map(|i| (get(i.private_dns_name()), get(i.private_ip_address()), Value::Null))
        .collect();
    let ids: BTreeMap<String, String> =
        instances.iter().map(|i| (get(i.private_dns_name()), get(i.instance_id()))).collect();
    let mut keep: Vec<Box<dyn std::any::Any + Send>> = vec![Box::new(imds)];
    let mut access = CloudAccess { moto_url: Some(moto.url.clone()), ..Default::default() };
    let mut endpoint = moto.url.clone();
    if options.proxy {
        let (p, url, _) = proxy(&moto.url, "aws-query", None, &dir.join("proxy.log"))?;
        keep.push(Box::new(p));
        endpoint = url.clone();
        access.admin_url = Some(url);
    }
    access.delete_instance = Some(Box::new(move |node: String| {
        let (ec2, id) = (ec2.clone(), ids.get(&node).cloned());
        Box::pin(async move {
            let id = id.ok_or_else(|| step(format!("no instance for Node {node}")))?;
            ec2.terminate_instances()
                .instance_ids(&id)
                .send()
                .await
                .map(drop)
                .map_err(|e| step(format!("terminating {id}: {e}")))
        })
    }));
    keep.insert(0, Box::new(moto));
    Ok(World {
        config: None,
        env: vec![
            (s("AWS_EC2_METADATA_SERVICE_ENDPOINT"), lines[0].clone()),
            (s("AWS_ENDPOINT_URL"), endpoint),
            (s("AWS_ACCESS_KEY_ID"), s("testing")),
            (s("AWS_SECRET_ACCESS_KEY"), s("testing")),
        ],
        node_env: BTreeMap::new(),
        nodes,
        lb_field: Some("hostname"),
        extra_objects: Vec::new(),
        notes: Vec::new(),
        keep,
        access,
    })
}

/// vcsim with two VMs and zone/region tags; credentials only in the Secret the config names
/// (created by the operator, or by the chart with `config.enabled`).
async fn vsphere_world(case: &Case, dir: &Path, options: WorldOptions) -> Result<World, SwapError> {
    let sim = tokio::task::spawn_blocking(move || {
        let sim = crate::vcsim::Vcsim::start_with_login(VSPHERE_USER, VSPHERE_PASSWORD);
        sim.guest("DC0_H0_VM0", "node-a", &[("VM Network", &["10.0.0.10"])]);
        sim.guest("DC0_C0_RP0_VM0", "node-b", &[("VM Network", &["10.0.1.10"])]);
        if options.spare {
            sim.guest("DC0_H0_VM1", "node-c", &[("VM Network", &["10.0.0.11"])]);
        }
        sim.tag("k8s-region", "region-1", "DC0");
        sim.tag("k8s-zone", "zone-standalone", "DC0_H0");
        sim.tag("k8s-zone", "zone-cluster", "DC0_C0");
        sim
    })
    .await
    .map_err(|e| step(format!("vcsim (ci/install-tools builds ccm-vcsim): {e}")))?;
    let sim = std::sync::Arc::new(sim);
    let mut port = sim.port;
    let mut access = CloudAccess::default();
    let mut keep: Vec<Box<dyn std::any::Any + Send>> = vec![Box::new(sim.clone())];
    if options.proxy {
        let (p, url, ca) = proxy(
            &format!("https://127.0.0.1:{port}"),
            "vim-soap",
            Some(&sim.ca_file),
            &dir.join("proxy.log"),
        )?;
        port = url
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| step(format!("no port in the proxy's URL {url}")))?;
        keep.push(Box::new(p));
        access.admin_ca = ca;
        access.admin_url = Some(url);
        let vms: BTreeMap<&str, &str> =
            [("node-a", "DC0_H0_VM0"), ("node-b", "DC0_C0_RP0_VM0"), ("node-c", "DC0_H0_VM1")]
                .into_iter()
                .collect();
        let sim = sim.clone();
        access.delete_instance = Some(Box::new(move |node: String| {
            let (sim, vm) = (sim.clone(), vms.get(node.as_str()).map(|v| v.to_string()));
            Box::pin(async move {
                let vm = vm.ok_or_else(|| step(format!("no VM for Node {node}")))?;
                tokio::task::spawn_blocking(move || {
                    sim.power_off(&vm);
                    sim.destroy(&vm)
                })
                .await
                .map_err(|e| step(format!("destroying the VM of {node}: {e}")))
            })
        }));
    }
    // The chart's own ConfigMap and Secret when it renders them (config.enabled).
    let chart_config = case
        .objects
        .iter()
        .find(|o| chart::kind(o) == "ConfigMap")
        .and_then(|o| o["data"]["vsphere.conf"].as_str().map(str::to_string));
    let mut extra: Vec<Value> =
        case.objects.iter().filter(|o| chart::kind(o) == "Secret").cloned().collect();
    let mut notes = Vec::new();
    let config: super::ConfigWriter = match chart_config {
        Some(text) => {
            notes.push(format!(
                "the chart's ConfigMap vsphere.conf as rendered, its `port: 443` mapped to the simulator's {port}"
            ));
            Box::new(move |_: &Path| Ok(text.replace("port: 443", &format!("port: {port}"))))
        }
        None => {
            extra.push(json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": "vsphere-cloud-secret", "namespace": "kube-system"},
                "stringData": {"127.0.0.1.username": VSPHERE_USER, "127.0.0.1.password": VSPHERE_PASSWORD},
            }));
            Box::new(move |_: &Path| {
                Ok(format!(
                    "[Global]\nsecret-name = \"vsphere-cloud-secret\"\nsecret-namespace = \"kube-system\"\n\
                     insecure-flag = \"1\"\nport = \"{port}\"\n\n[VirtualCenter \"127.0.0.1\"]\ndatacenters = \"DC0\"\n\n\
                     [Labels]\nregion = k8s-region\nzone = k8s-zone\n"
                ))
            })
        }
    };
    let mut list = vec![("node-a", "10.0.0.10"), ("node-b", "10.0.1.10")];
    if options.spare {
        list.push(("node-c", "10.0.0.11"));
    }
    Ok(World {
        config: Some(config),
        env: Vec::new(),
        node_env: BTreeMap::new(),
        nodes: nodes(&list),
        lb_field: None,
        extra_objects: extra,
        notes,
        keep,
        access,
    })
}

fn openstack_world(dir: &Path, options: WorldOptions) -> Result<World, SwapError> {
    let mut text = s(
        "region: RegionOne\nzones: [az-1, az-2]\nnetworks:\n  - { name: private, cidr: 10.0.0.0/24 }\n\
         subnets:\n  - { name: private-subnet, network: private, zone: az-1, cidr: 10.0.0.0/24 }\n\
         instances:\n  - { name: node-a, zone: az-1, type: m1.medium, private_ips: [10.0.0.11], public_ips: [172.24.4.11] }\n\
         \x20 - { name: node-b, zone: az-2, type: m1.large, private_ips: [10.0.0.12] }\n",
    );
    let mut list = vec![("node-a", "10.0.0.11"), ("node-b", "10.0.0.12")];
    if options.spare {
        text.push_str(
            "  - { name: node-c, zone: az-2, type: m1.large, private_ips: [10.0.0.13] }\n",
        );
        list.push(("node-c", "10.0.0.13"));
    }
    let world = write_world(dir, &text)?;
    let w = world.display().to_string();
    let (emu, lines) = emulator(
        &["openstack", "--world", &w, "--lb-pending-ms", "1000"],
        1,
        &dir.join("emulator.log"),
    )?;
    let url = lines[0].clone();
    let access = CloudAccess {
        admin_url: Some(url.trim_end_matches('/').to_string()),
        emulator_state: true,
        ..Default::default()
    };
    Ok(World {
        config: Some(Box::new(move |_: &Path| {
            Ok(format!(
                "[Global]\nauth-url = {url}/identity/v3\nusername = admin\npassword = openstack-emulator-password\n\
                 tenant-name = demo\ndomain-name = Default\nregion = RegionOne\n[LoadBalancer]\ncreate-monitor = true\n"
            ))
        })),
        env: Vec::new(),
        node_env: BTreeMap::new(),
        nodes: nodes(&list),
        lb_field: Some("ip"),
        extra_objects: Vec::new(),
        notes: Vec::new(),
        keep: vec![Box::new(emu)],
        access,
    })
}

const AZURE_WORLD_HEAD: &str = "region: eastus\nnetworks:\n  - { name: vnet, cidr: 10.0.0.0/8 }\n\
     subnets:\n  - { name: subnet, network: vnet, zone: \"1\", cidr: 10.240.0.0/16 }\ninstances:\n";
const AZURE_VMS: [(&str, &str, &str); 3] = [
    (
        "node-a",
        "10.240.0.4",
        "  - { name: node-a, zone: \"1\", type: Standard_D4s_v3, private_ips: [10.240.0.4], public_ips: [20.1.2.3] }\n",
    ),
    ("node-b", "10.240.0.5", "  - { name: node-b, zone: \"2\", private_ips: [10.240.0.5] }\n"),
    // The spare (WorldOptions::spare).
    ("node-c", "10.240.0.6", "  - { name: node-c, zone: \"2\", private_ips: [10.240.0.6] }\n"),
];

fn azure_config(url: &str) -> String {
    json!({
        "cloud": "AzureStackCloud",
        "resourceManagerEndpoint": url,
        "tenantId": "72f988bf-0000-0000-0000-00000000e0a1",
        "subscriptionId": "8ecadfc9-0000-0000-0000-00000000abcd",
        "aadClientId": "00000000-0000-0000-0000-0000000c1e47",
        "aadClientSecret": "azure-emulator-secret",
        "resourceGroup": "rg",
        "location": "eastus",
        "vnetName": "vnet",
        "subnetName": "subnet",
        "securityGroupName": "k8s-nsg",
        "routeTableName": "kubernetes-routetable",
        "vmType": "vmss",
        "loadBalancerSku": "standard",
    })
    .to_string()
}

/// The Azure emulator (ARM over HTTPS, AAD); each node's own instance metadata service (one
/// emulator per node whose world is that VM alone, as IMDS answers only for its own VM).
fn azure_world(case: &Case, dir: &Path, options: WorldOptions) -> Result<World, SwapError> {
    let vms = &AZURE_VMS[..if options.spare { 3 } else { 2 }];
    let mut text = AZURE_WORLD_HEAD.to_string();
    for (_, _, vm) in vms {
        text.push_str(vm);
    }
    let w = write_world(dir, &text)?.display().to_string();
    let (emu, lines) =
        emulator(&["azure", "--world", &w, "--lro-ms", "500"], 2, &dir.join("emulator.log"))?;
    let (url, ca) = (lines[0].clone(), lines.get(1).cloned().unwrap_or_default());
    let mut keep: Vec<Box<dyn std::any::Any + Send>> = vec![Box::new(emu)];
    let mut node_env = BTreeMap::new();
    for (name, _, vm) in vms {
        let d = dir.join(format!("imds-{name}"));
        std::fs::create_dir_all(&d).map_err(|e| step(format!("{}: {e}", d.display())))?;
        let w = write_world(&d, &format!("{AZURE_WORLD_HEAD}{vm}"))?.display().to_string();
        let (imds, l) = emulator(&["azure", "--world", &w], 2, &d.join("emulator.log"))?;
        // IMDS is plain HTTP on the link-local address; the emulator serves it over HTTPS
        // with a CA of its own, which the node's bundle trusts.
        let imds_ca = l.get(1).cloned().unwrap_or_default();
        node_env.insert(
            s(name),
            vec![(s("CCM_AZURE_IMDS_ENDPOINT"), l[0].clone()), (s("SSL_CERT_FILE"), imds_ca)],
        );
        keep.push(Box::new(imds));
    }
    let config = azure_config(&url);
    // With cloudConfigSecretName the operator keeps azure.json in that Secret too.
    let mut extra = Vec::new();
    if case.artifact.contains(AZURE_SECRET) {
        extra.push(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": AZURE_SECRET, "namespace": "kube-system"},
            "stringData": {"cloud-config": config},
        }));
    }
    let base = url.trim_end_matches('/').to_string();
    let (arm, arm_ca) = (base.clone(), ca.clone());
    let access = CloudAccess {
        admin_url: Some(base),
        admin_ca: Some(ca.clone()),
        emulator_state: true,
        // ARM's DELETE of the VM, with a token from the emulator's AAD.
        delete_instance: Some(Box::new(move |node: String| {
            let (arm, ca) = (arm.clone(), arm_ca.clone());
            Box::pin(async move { azure_delete_vm(&arm, &ca, &node).await })
        })),
        moto_url: None,
    };
    let list: Vec<(&str, &str)> = vms.iter().map(|(n, ip, _)| (*n, *ip)).collect();
    Ok(World {
        config: Some(Box::new(move |_: &Path| Ok(config.clone()))),
        env: vec![(s("SSL_CERT_FILE"), ca)],
        node_env,
        nodes: nodes(&list),
        lb_field: Some("ip"),
        extra_objects: extra,
        notes: Vec::new(),
        keep,
        access,
    })
}

/// Deletes VM `name` through ARM (a client-credentials token from the emulator's AAD first).
async fn azure_delete_vm(arm: &str, ca: &str, name: &str) -> Result<(), SwapError> {
    let config: Value = serde_json::from_str(&azure_config(arm))
        .map_err(|e| step(format!("the Azure config: {e}")))?;
    let get = |k: &str| config[k].as_str().unwrap_or_default().to_string();
    let form = format!(
        "grant_type=client_credentials&client_id={}&client_secret={}&scope={}%2F.default",
        get("aadClientId"),
        get("aadClientSecret"),
        "https%3A%2F%2Fmanagement.azure.com"
    );
    let (code, body) = super::curl(
        "POST",
        &format!("{arm}/{}/oauth2/v2.0/token", get("tenantId")),
        Some(ca),
        &[s("Content-Type: application/x-www-form-urlencoded")],
        Some(&form),
    )
    .await?;
    let token: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let token = token["access_token"]
        .as_str()
        .filter(|_| code == 200)
        .ok_or_else(|| step(format!("the emulator's AAD gave no token ({code})")))?;
    let url = format!(
        "{arm}/subscriptions/{}/resourceGroups/{}/providers/Microsoft.Compute/virtualMachines/{name}?api-version=2024-07-01",
        get("subscriptionId"),
        get("resourceGroup")
    );
    let (code, body) =
        super::curl("DELETE", &url, Some(ca), &[format!("Authorization: Bearer {token}")], None)
            .await?;
    if !(200..300).contains(&code) {
        return Err(step(format!("deleting VM {name}: {code} {body}")));
    }
    Ok(())
}

fn gcp_world(dir: &Path) -> Result<World, SwapError> {
    let w = write_world(
        dir,
        "region: us-central1\nzones: [us-central1-a, us-central1-b]\nnetworks:\n  - { name: k8s-net, cidr: 10.0.0.0/8 }\n\
         subnets:\n  - { name: subnet-a, network: k8s-net, zone: us-central1-a, cidr: 10.0.0.0/20 }\n\
         \x20 - { name: subnet-b, network: k8s-net, zone: us-central1-b, cidr: 10.0.16.0/20 }\n\
         instances:\n  - { name: node-a, zone: us-central1-a, subnet: subnet-a, type: n2-standard-4, private_ips: [10.0.0.11], public_ips: [34.1.2.3], tags: { gce.tags: k8s-node } }\n\
         \x20 - { name: node-b, zone: us-central1-b, subnet: subnet-b, private_ips: [10.0.16.12], tags: { gce.tags: k8s-node } }\n",
    )?
    .display()
    .to_string();
    let (emu, lines) = emulator(
        &["gcp", "--world", &w, "--project", "swap-project", "--pending-ms", "500"],
        1,
        &dir.join("emulator.log"),
    )?;
    let url = lines[0].clone();
    let host = url.trim_start_matches("http://").to_string();
    Ok(World {
        config: Some(Box::new(move |_: &Path| {
            Ok(format!(
                "[global]\nproject-id = swap-project\nnetwork-name = k8s-net\nnode-tags = k8s-node\nmultizone = true\n\
                 api-endpoint = {url}/compute/v1/\n"
            ))
        })),
        env: vec![(s("GCE_METADATA_HOST"), host)],
        node_env: BTreeMap::new(),
        nodes: nodes(&[("node-a", "10.0.0.11"), ("node-b", "10.0.16.12")]),
        lb_field: Some("ip"),
        extra_objects: Vec::new(),
        notes: Vec::new(),
        keep: vec![Box::new(emu)],
        access: CloudAccess::default(),
    })
}

fn ibm_world(dir: &Path) -> Result<World, SwapError> {
    let w = write_world(
        dir,
        "region: us-south\nzones: [us-south-1, us-south-2]\nnetworks:\n  - { name: vpc-1, cidr: 10.240.0.0/16 }\n\
         subnets:\n  - { name: subnet-1, network: vpc-1, zone: us-south-1, cidr: 10.240.0.0/24 }\n\
         \x20 - { name: subnet-2, network: vpc-1, zone: us-south-2, cidr: 10.240.1.0/24 }\n\
         instances:\n  - { name: node-a, zone: us-south-1, type: bx2-4x16, subnet: subnet-1, private_ips: [10.240.0.4] }\n\
         \x20 - { name: node-b, zone: us-south-2, type: bx2-2x8, subnet: subnet-2, private_ips: [10.240.1.4] }\n",
    )?
    .display()
    .to_string();
    let (emu, lines) =
        emulator(&["ibm", "--world", &w, "--lb-pending-ms", "1000"], 1, &dir.join("emulator.log"))?;
    let url = lines[0].clone();
    Ok(World {
        // The Secret the fixture mounts holds the config and the API key it names.
        config: Some(Box::new(move |mount: &Path| {
            let key = mount.join("api-key");
            std::fs::write(&key, "ibm-emulator-api-key\n")
                .map_err(|e| step(format!("{}: {e}", key.display())))?;
            Ok(format!(
                "[global]\nversion = 1.1.0\n[provider]\ncluster-default-provider = g2\naccountID = emulator-account-0001\n\
                 clusterID = swap\nregion = us-south\ng2VpcName = vpc-1\ng2Credentials = {}\ng2ResourceGroupName = default\n\
                 g2VpcSubnetNames = subnet-1,subnet-2\ng2EndpointOverride = {url}\niamEndpointOverride = {url}\n\
                 rmEndpointOverride = {url}\ntaggingEndpointOverride = {url}\n",
                key.display()
            ))
        })),
        env: Vec::new(),
        node_env: BTreeMap::new(),
        nodes: nodes(&[("node-a", "10.240.0.4"), ("node-b", "10.240.1.4")]),
        lb_field: Some("hostname"),
        extra_objects: Vec::new(),
        notes: Vec::new(),
        keep: vec![Box::new(emu)],
        access: CloudAccess::default(),
    })
}
