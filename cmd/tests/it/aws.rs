//! `cloud-controller-manager-aws` end to end (issue 6 acceptance): the real binary against a
//! real kube-apiserver and moto. EC2 instances become initialised Nodes (named by private DNS
//! name or by instance ID); stopped and terminated instances as the lifecycle controller sees
//! them; 500 Nodes joining at once, with the DescribeInstances count read from the manager's
//! own `/metrics`; a LoadBalancer Service whose type change to NLB is refused, then deleted; pod
//! CIDR routes; start-up failures; and `ecr-credential-provider` as the kubelet runs it.
//! Issue 11: Nodes without providerID that are not found by name survive the lifecycle
//! controller; `ecr-credential-provider` gives up on an endpoint that never answers.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ccm_core::cloud::default_load_balancer_name;
use ccm_core::names;
use ccm_provider_aws::testing::aws_sdk_ec2::types::{Filter, Instance, ResourceType};
use ccm_provider_aws::testing::{
    self, REGION, aws_sdk_ec2, aws_sdk_elasticloadbalancing, network, node_security_group,
    run_instances, tag, tags_for,
};
use ccm_testbed::fixtures::{kubelet_node, load_balancer_service};
use ccm_testbed::moto::Moto;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Event, Service};
use kube::Api;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};

use crate::support::{
    Binary, Env, addresses, curl, free_port, has_taint, initialised, label, provider_id, register,
    wait_for,
};

const BIN: Binary = crate::support::AWS_BIN;

/// The kubelet plugin built next to the manager by `--features provider-aws`.
const ECR_PLUGIN: &str = env!("CARGO_BIN_EXE_ecr-credential-provider");

/// Upstream's AWS manifests run without cloud routes (no `--cluster-cidr`): the route
/// controller would refuse to start. Only the route test turns them on.
const NO_ROUTES: &str = "--configure-cloud-routes=false";

const NLB_TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";

fn id(i: &Instance) -> &str {
    i.instance_id().unwrap()
}

fn dns(i: &Instance) -> &str {
    i.private_dns_name().unwrap()
}

fn ip(i: &Instance) -> &str {
    i.private_ip_address().unwrap()
}

fn zone(i: &Instance) -> &str {
    i.placement().unwrap().availability_zone().unwrap()
}

/// The addresses upstream's AWS provider reports for a one-ENI instance, in its order.
fn expected_addresses(i: &Instance) -> Vec<(String, String)> {
    let mut out = vec![("InternalIP".to_string(), ip(i).to_string())];
    if let Some(p) = i.public_ip_address() {
        out.push(("ExternalIP".into(), p.into()));
    }
    out.push(("InternalDNS".into(), dns(i).into()));
    out.push(("Hostname".into(), dns(i).into()));
    if let Some(p) = i.public_dns_name().filter(|p| !p.is_empty()) {
        out.push(("ExternalDNS".into(), p.into()));
    }
    out
}

async fn instance_state(ec2: &aws_sdk_ec2::Client, instance: &str) -> String {
    let d = ec2.describe_instances().instance_ids(instance).send().await.unwrap();
    let i = &d.reservations()[0].instances()[0];
    i.state().and_then(|s| s.name()).map(|n| n.as_str().to_string()).unwrap_or_default()
}

#[tokio::test]
async fn instances_by_dns_name_and_id_become_nodes_and_follow_their_instances() {
    const CLUSTER: &str = "e2e-nodes";
    let moto = Moto::start().await.unwrap();
    let ec2 = testing::ec2(&moto.url).await;
    let net = network(&ec2, CLUSTER).await.unwrap();
    // Two instances per zone: the first of each is healthy, the second will stop (zone a)
    // or be terminated (zone b).
    let a = run_instances(&ec2, &net.subnets[0].0, CLUSTER, 2, None).await.unwrap();
    let b = run_instances(&ec2, &net.subnets[1].0, CLUSTER, 2, None).await.unwrap();
    let zone_ids: BTreeMap<String, String> = ec2
        .describe_availability_zones()
        .send()
        .await
        .unwrap()
        .availability_zones()
        .iter()
        .map(|z| (z.zone_name().unwrap().to_string(), z.zone_id().unwrap().to_string()))
        .collect();

    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm(&testing::cloud_config(&moto.url, CLUSTER, ""), &[NO_ROUTES.into()]);
    let nodes = env.nodes();

    // Named as kubelets name them on AWS: by private DNS name (the default), or by instance
    // ID (`--hostname-override`). The two that will go away have stopped posting Ready.
    let cases = [
        (dns(&a[0]).to_string(), &a[0], "True"),
        (dns(&a[1]).to_string(), &a[1], "False"),
        (id(&b[0]).to_string(), &b[0], "True"),
        (id(&b[1]).to_string(), &b[1], "False"),
    ];
    let start = Instant::now();
    for (name, inst, ready) in &cases {
        register(&nodes, name, ip(inst), ready).await;
    }
    for (name, inst, _) in &cases {
        let n = initialised(&nodes, name).await;
        let az = zone(inst);
        assert_eq!(
            provider_id(&n),
            Some(format!("aws:///{az}/{}", id(inst)).as_str()),
            "{name}; manager log:\n{}",
            ccm.logs()
        );
        assert_eq!(addresses(&n), expected_addresses(inst), "{name}");
        for (key, want) in [
            (names::LABEL_ZONE, az),
            (names::LABEL_ZONE_BETA, az),
            (names::LABEL_REGION, REGION),
            (names::LABEL_REGION_BETA, REGION),
            (names::LABEL_INSTANCE_TYPE, "m5.large"),
            (names::LABEL_INSTANCE_TYPE_BETA, "m5.large"),
            (ccm_provider_aws::instances::ZONE_ID_LABEL, zone_ids[az].as_str()),
        ] {
            assert_eq!(label(&n, key), Some(want), "{name}: label {key}");
        }
    }
    eprintln!("4 nodes initialised {:?} after registration", start.elapsed());

    // Stopped: the NotReady node gets the shutdown taint and is kept.
    let (stopped, terminated) = (&cases[1], &cases[3]);
    ec2.stop_instances().instance_ids(id(stopped.1)).send().await.unwrap();
    assert_eq!(instance_state(&ec2, id(stopped.1)).await, "stopped");
    let start = Instant::now();
    let n = wait_for("the shutdown taint", || async {
        let n = nodes.get(&stopped.0).await.ok()?;
        has_taint(&n, names::TAINT_SHUTDOWN).then_some(n)
    })
    .await;
    eprintln!("shutdown taint {:?} after StopInstances", start.elapsed());
    let taints = n.spec.unwrap().taints.unwrap();
    assert_eq!(
        taints.iter().find(|t| t.key == names::TAINT_SHUTDOWN).unwrap().effect,
        "NoSchedule"
    );

    // Terminated: the NotReady node is deleted.
    ec2.terminate_instances().instance_ids(id(terminated.1)).send().await.unwrap();
    assert_eq!(instance_state(&ec2, id(terminated.1)).await, "terminated");
    let start = Instant::now();
    wait_for("the terminated instance's node to be deleted", || async {
        nodes.get_opt(&terminated.0).await.unwrap().is_none().then_some(())
    })
    .await;
    eprintln!("node deleted {:?} after TerminateInstances", start.elapsed());

    // The healthy nodes and the stopped one are still there, untouched.
    for (name, _, _) in [&cases[0], &cases[1], &cases[2]] {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} was deleted");
    }
    assert!(!has_taint(&nodes.get(&cases[0].0).await.unwrap(), names::TAINT_SHUTDOWN));
}

/// The sum of the samples of `metric` whose labels include all of `labels` (`k="v"` each).
fn sample(body: &str, metric: &str, labels: &[&str]) -> u64 {
    body.lines()
        .filter(|l| l.split(['{', ' ']).next() == Some(metric))
        .filter(|l| labels.iter().all(|kv| l.contains(kv)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// The manager's `/metrics` text (`None` until it serves them).
async fn metrics(port: u16) -> Option<String> {
    let (code, body) = curl(&format!("https://127.0.0.1:{port}/metrics")).await;
    (code == 200).then_some(body)
}

/// The manager's count of DescribeInstances calls, from its `/metrics`.
async fn describe_instances_calls(port: u16) -> Option<u64> {
    let body = metrics(port).await?;
    let labels = [r#"service="ec2""#, r#"operation="DescribeInstances""#];
    Some(sample(&body, "cloudprovider_aws_api_request_total", &labels))
}

#[tokio::test]
async fn five_hundred_nodes_joining_at_once_take_a_handful_of_describe_instances_calls() {
    const CLUSTER: &str = "e2e-scale";
    const COUNT: usize = 500;
    let moto = Moto::start().await.unwrap();
    let ec2 = testing::ec2(&moto.url).await;
    let net = network(&ec2, CLUSTER).await.unwrap();
    // A /20: room for 500 instances.
    let subnet = ec2
        .create_subnet()
        .vpc_id(&net.vpc)
        .cidr_block("10.0.16.0/20")
        .availability_zone("us-east-1a")
        .send()
        .await
        .unwrap();
    let subnet = subnet.subnet().unwrap().subnet_id().unwrap().to_string();
    let instances = run_instances(&ec2, &subnet, CLUSTER, COUNT as i32, None).await.unwrap();
    assert_eq!(instances.len(), COUNT);

    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let port = free_port();
    // A cluster this size raises the manager's API client limits, as an operator would
    // (upstream's defaults, 20 QPS / burst 30, would make the test measure the limiter).
    let ccm = env.spawn_ccm(
        &testing::cloud_config(&moto.url, CLUSTER, ""),
        &[
            NO_ROUTES.into(),
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--authorization-always-allow-paths=/healthz,/metrics".into(),
            "--kube-api-qps=1000".into(),
            "--kube-api-burst=2000".into(),
        ],
    );
    let before = wait_for("the manager's /metrics", || describe_instances_calls(port)).await;
    assert_eq!(before, 0, "no lookups before any node exists");

    // All at once, as after a cluster-wide restart: 50 registrations in flight.
    let nodes = env.nodes();
    let start = Instant::now();
    futures::stream::iter(&instances)
        .for_each_concurrent(50, |i| {
            let nodes = nodes.clone();
            async move {
                nodes
                    .create(&PostParams::default(), &kubelet_node(dns(i), ip(i), "True"))
                    .await
                    .unwrap();
            }
        })
        .await;
    let registered = start.elapsed();
    ccm_testbed::wait_for("500 nodes to be initialised", Duration::from_secs(600), || async {
        let list = nodes.list(&ListParams::default()).await.ok()?;
        let done = list
            .items
            .iter()
            .filter(|n| !has_taint(n, names::TAINT_UNINITIALIZED) && provider_id(n).is_some())
            .count();
        (done == COUNT).then_some(())
    })
    .await;
    let initialised_after = start.elapsed();
    let calls = describe_instances_calls(port).await.unwrap();
    eprintln!(
        "{COUNT} nodes: registered in {:.1} s, all initialised {:.1} s after the first \
         registration, with {calls} DescribeInstances calls",
        registered.as_secs_f64(),
        initialised_after.as_secs_f64()
    );
    // One call answers up to 200 private-DNS names (AWS's filter limit): 3 is the floor.
    assert!(calls >= 3, "{calls} DescribeInstances calls cannot answer 500 names");
    // Batched: each call answers many Nodes. How many calls depends on how the registrations
    // spread in time (31 when a loaded machine spread them over 6 s), so the bound is on the
    // work per call, not on the machine's speed: unbatched lookups take one call per Node
    // (500+); batched ones answer at least 5 Nodes per call on average even on a slow machine.
    assert!(
        calls * 5 <= COUNT as u64,
        "{calls} DescribeInstances calls for {COUNT} nodes (registered over {:.1} s): lookups \
         are not batched\n{}",
        registered.as_secs_f64(),
        ccm.logs()
    );
    // Upstream's latency histogram counts the same calls (moto does not throttle: no retries).
    let body = metrics(port).await.unwrap();
    let histogram_count = sample(
        &body,
        "cloudprovider_aws_api_request_duration_seconds_count",
        &[r#"request="describe_instance""#],
    );
    assert_eq!(histogram_count, calls, "{body}");
    // Spot-check the answers.
    for i in instances.iter().step_by(97) {
        let n = nodes.get(dns(i)).await.unwrap();
        assert_eq!(provider_id(&n), Some(format!("aws:///us-east-1a/{}", id(i)).as_str()));
        assert_eq!(addresses(&n), expected_addresses(i));
    }
}

/// Classic ELBs in moto with `name`: (DNS name, listeners (lb port, instance port,
/// protocol), health-check target, instance IDs, security groups).
type ClassicView = (String, Vec<(i32, i32, String)>, String, Vec<String>, Vec<String>);

async fn classic(elb: &aws_sdk_elasticloadbalancing::Client, name: &str) -> Option<ClassicView> {
    let d = elb.describe_load_balancers().send().await.unwrap();
    let lb =
        d.load_balancer_descriptions().iter().find(|l| l.load_balancer_name() == Some(name))?;
    let mut listeners: Vec<(i32, i32, String)> = lb
        .listener_descriptions()
        .iter()
        .filter_map(|l| l.listener())
        .map(|l| (l.load_balancer_port(), l.instance_port(), l.protocol().to_string()))
        .collect();
    listeners.sort();
    let mut instances: Vec<String> =
        lb.instances().iter().filter_map(|i| i.instance_id()).map(str::to_string).collect();
    instances.sort();
    Some((
        lb.dns_name().unwrap_or_default().to_string(),
        listeners,
        lb.health_check().map(|h| h.target().to_string()).unwrap_or_default(),
        instances,
        lb.security_groups().to_vec(),
    ))
}

async fn hostname(services: &Api<Service>, name: &str) -> Option<String> {
    let s = services.get(name).await.ok()?;
    s.status?.load_balancer?.ingress?.first()?.hostname.clone()
}

/// Security groups in `vpc` whose name starts with `k8s-elb-`.
async fn elb_security_groups(ec2: &aws_sdk_ec2::Client, vpc: &str) -> Vec<String> {
    let d = ec2
        .describe_security_groups()
        .filters(Filter::builder().name("vpc-id").values(vpc).build())
        .send()
        .await
        .unwrap();
    d.security_groups()
        .iter()
        .filter_map(|g| g.group_name())
        .filter(|n| n.starts_with("k8s-elb-"))
        .map(str::to_string)
        .collect()
}

/// Source security groups of the ingress rules of `sg`.
async fn rule_sources(ec2: &aws_sdk_ec2::Client, sg: &str) -> Vec<String> {
    let d = ec2.describe_security_groups().group_ids(sg).send().await.unwrap();
    d.security_groups()[0]
        .ip_permissions()
        .iter()
        .flat_map(|p| p.user_id_group_pairs())
        .filter_map(|p| p.group_id())
        .map(str::to_string)
        .collect()
}

#[tokio::test]
async fn a_load_balancer_service_keeps_its_classic_elb_when_the_type_changes_and_leaves_nothing() {
    const CLUSTER: &str = "e2e-lb";
    let moto = Moto::start().await.unwrap();
    let ec2 = testing::ec2(&moto.url).await;
    let elb = testing::elb(&moto.url).await;
    let elbv2 = testing::elbv2(&moto.url).await;
    let net = network(&ec2, CLUSTER).await.unwrap();
    let node_sg = node_security_group(&ec2, &net.vpc, CLUSTER).await.unwrap();
    let mut insts =
        run_instances(&ec2, &net.subnets[0].0, CLUSTER, 1, Some(&node_sg)).await.unwrap();
    insts.extend(run_instances(&ec2, &net.subnets[1].0, CLUSTER, 1, Some(&node_sg)).await.unwrap());
    let mut ids: Vec<String> = insts.iter().map(|i| id(i).to_string()).collect();
    ids.sort();
    let sgs_before = ec2.describe_security_groups().send().await.unwrap().security_groups().len();

    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm(&testing::cloud_config(&moto.url, CLUSTER, ""), &[NO_ROUTES.into()]);
    let nodes = env.nodes();
    for i in &insts {
        register(&nodes, dns(i), ip(i), "True").await;
    }
    for i in &insts {
        initialised(&nodes, dns(i)).await;
    }

    let services: Api<Service> = Api::namespaced(env.client.clone(), "default");
    let svc = load_balancer_service("default", "web", 80);
    let svc = services.create(&PostParams::default(), &svc).await.unwrap();
    let node_port = svc.spec.as_ref().unwrap().ports.as_ref().unwrap()[0].node_port.unwrap();
    let lb_name = default_load_balancer_name(&svc);

    // Classic ELB: listener to the node port, TCP health check on it, both instances, our
    // own security group, admitted by the nodes' group; the Service shows its DNS name.
    let start = Instant::now();
    let host =
        wait_for("the Service's load-balancer hostname", || hostname(&services, "web")).await;
    eprintln!("classic ELB hostname {host} {:?} after the Service was created", start.elapsed());
    let (dns_name, listeners, health, registered, lb_sgs) =
        classic(&elb, &lb_name).await.expect("a classic ELB named after the Service");
    assert_eq!(host, dns_name);
    assert_eq!(listeners, vec![(80, node_port, "TCP".to_string())]);
    assert_eq!(health, format!("TCP:{node_port}"));
    assert_eq!(registered, ids);
    let elb_sgs = elb_security_groups(&ec2, &net.vpc).await;
    assert_eq!(elb_sgs, vec![format!("k8s-elb-{lb_name}")]);
    assert_eq!(lb_sgs.len(), 1, "{lb_sgs:?}");
    assert!(rule_sources(&ec2, &node_sg).await.contains(&lb_sgs[0]), "node SG admits the ELB");

    // A bad annotation: a Warning event naming it, and the ELB is left as it was.
    let bad = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
    annotate(&services, "web", bad, Some("often")).await;
    let events: Api<Event> = Api::namespaced(env.client.clone(), "default");
    let warning = wait_for("a Warning event naming the bad annotation", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.type_.as_deref() == Some("Warning")
                && e.message.as_deref().is_some_and(|m| m.contains(bad))
        })
    })
    .await;
    eprintln!(
        "bad annotation event: {}: {}",
        warning.reason.unwrap_or_default(),
        warning.message.unwrap_or_default()
    );
    let after = classic(&elb, &lb_name).await.unwrap();
    assert_eq!((after.1, after.2), (listeners, health), "nothing changed in the cloud");
    annotate(&services, "web", bad, None).await;

    // Switch a Service to NLB: refused as upstream does (issue 14), with a
    // SyncLoadBalancerFailed Warning event; its classic ELB keeps serving under the same
    // hostname, no NLB appears; deleting it with the changed annotation removes everything.
    // (A second Service, so its event is not folded into the one above by event series.)
    let kind = load_balancer_service("default", "kind", 81);
    let kind = services.create(&PostParams::default(), &kind).await.unwrap();
    let kind_lb = default_load_balancer_name(&kind);
    let kind_host = wait_for("the second Service's hostname", || hostname(&services, "kind")).await;
    annotate(&services, "kind", NLB_TYPE, Some("nlb")).await;
    let refused = wait_for("a SyncLoadBalancerFailed event refusing the type change", || async {
        let list = events.list(&ListParams::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.involved_object.name.as_deref() == Some("kind")
                && e.type_.as_deref() == Some("Warning")
                && e.reason.as_deref() == Some("SyncLoadBalancerFailed")
                && e.message.as_deref().is_some_and(|m| {
                    m.contains("cannot update Load Balancer Type annotation after creation")
                })
        })
    })
    .await;
    eprintln!("type change refused: {}", refused.message.unwrap_or_default());
    assert_eq!(hostname(&services, "kind").await.as_deref(), Some(kind_host.as_str()));
    assert_eq!(classic(&elb, &kind_lb).await.unwrap().3, ids, "the classic ELB still serves");
    let v2 = elbv2.describe_load_balancers().send().await.unwrap();
    assert!(v2.load_balancers().is_empty(), "no NLB: {v2:?}");
    services.delete("kind", &DeleteParams::default()).await.unwrap();
    wait_for("the second Service and its classic ELB to be gone", || async {
        (services.get_opt("kind").await.unwrap().is_none()
            && classic(&elb, &kind_lb).await.is_none())
        .then_some(())
    })
    .await;

    // Delete the first Service: the finalizer holds it until the cloud side is gone.
    services.delete("web", &DeleteParams::default()).await.unwrap();
    let start = Instant::now();
    wait_for("the Service to be gone", || async {
        services.get_opt("web").await.unwrap().is_none().then_some(())
    })
    .await;
    eprintln!("Service deleted {:?} after the delete call", start.elapsed());
    let left_classic = elb.describe_load_balancers().send().await.unwrap();
    assert!(left_classic.load_balancer_descriptions().is_empty(), "{left_classic:?}");
    let left_v2 = elbv2.describe_load_balancers().send().await.unwrap();
    assert!(left_v2.load_balancers().is_empty(), "{left_v2:?}");
    let left_tgs = elbv2.describe_target_groups().send().await.unwrap();
    assert!(left_tgs.target_groups().is_empty(), "{left_tgs:?}");
    assert!(elb_security_groups(&ec2, &net.vpc).await.is_empty());
    // Nothing the CCM did not create is gone: the same groups as before, and the nodes'
    // group no longer admits any load balancer.
    let sgs_after = ec2.describe_security_groups().send().await.unwrap().security_groups().len();
    assert_eq!(sgs_after, sgs_before, "security groups before and after differ");
    assert!(rule_sources(&ec2, &node_sg).await.is_empty(), "rules left on the node group");
    drop(ccm);
}

/// Sets (or with `None` removes) one annotation of a Service.
async fn annotate(services: &Api<Service>, name: &str, key: &str, value: Option<&str>) {
    let patch = serde_json::json!({"metadata": {"annotations": {key: value}}});
    services.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.unwrap();
}

#[tokio::test]
async fn a_node_pod_cidr_gets_a_route_to_its_instance_until_the_node_is_deleted() {
    const CLUSTER: &str = "e2e-routes";
    let moto = Moto::start().await.unwrap();
    let ec2 = testing::ec2(&moto.url).await;
    let net = network(&ec2, CLUSTER).await.unwrap();
    let rt = ec2
        .create_route_table()
        .vpc_id(&net.vpc)
        .tag_specifications(tags_for(
            ResourceType::RouteTable,
            vec![tag(&format!("kubernetes.io/cluster/{CLUSTER}"), "owned")],
        ))
        .send()
        .await
        .unwrap();
    let rt = rt.route_table().unwrap().route_table_id().unwrap().to_string();
    let insts = run_instances(&ec2, &net.subnets[0].0, CLUSTER, 1, None).await.unwrap();
    let inst = &insts[0];

    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let _ccm = env.spawn_ccm(
        &testing::cloud_config(&moto.url, CLUSTER, ""),
        &["--cluster-cidr=100.64.0.0/16".into(), "--configure-cloud-routes=true".into()],
    );
    let nodes = env.nodes();
    let mut node = kubelet_node(dns(inst), ip(inst), "True");
    let spec = node.spec.as_mut().unwrap();
    spec.pod_cidr = Some("100.64.3.0/24".into());
    spec.pod_cidrs = Some(vec!["100.64.3.0/24".into()]);
    nodes.create(&PostParams::default(), &node).await.unwrap();
    initialised(&nodes, dns(inst)).await;

    let routes = || async {
        let d = ec2.describe_route_tables().route_table_ids(&rt).send().await.unwrap();
        d.route_tables()[0]
            .routes()
            .iter()
            .filter_map(|r| {
                Some((r.destination_cidr_block()?.to_string(), r.instance_id()?.to_string()))
            })
            .collect::<Vec<_>>()
    };
    let start = Instant::now();
    wait_for("the pod CIDR route", || async {
        routes().await.contains(&("100.64.3.0/24".to_string(), id(inst).to_string())).then_some(())
    })
    .await;
    eprintln!("route created {:?} after the node registered", start.elapsed());
    let d = ec2.describe_instances().instance_ids(id(inst)).send().await.unwrap();
    assert_eq!(d.reservations()[0].instances()[0].source_dest_check(), Some(false));
    // The route controller also tells the node its network is ready (a write after the
    // route's, so wait for it).
    wait_for("NetworkUnavailable=False on the node", || async {
        let n = nodes.get(dns(inst)).await.ok()?;
        let c = n.status?.conditions?;
        c.iter()
            .any(|c| c.type_ == names::CONDITION_NETWORK_UNAVAILABLE && c.status == "False")
            .then_some(())
    })
    .await;

    nodes.delete(dns(inst), &DeleteParams::default()).await.unwrap();
    let start = Instant::now();
    wait_for("the route to be removed", || async {
        (!routes().await.iter().any(|(cidr, _)| cidr == "100.64.3.0/24")).then_some(())
    })
    .await;
    eprintln!("route removed {:?} after the node was deleted", start.elapsed());
}

#[tokio::test]
async fn a_bad_cloud_config_or_no_cluster_id_fails_at_start_naming_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();

    // A line that is neither a section, a key = value, nor a comment.
    let (code, stderr) =
        BIN.run_to_exit(dir.path(), "[Global]\nKubernetesClusterID = c1\nZone us-east-1a\n").await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("cloud provider could not be initialized"), "{stderr}");
    assert!(stderr.contains("cloud config line 3"), "{stderr}");

    // A misspelt [Global] key is skipped with a warning naming it and its line, as upstream's
    // gcfg (FatalOnly) skips it (issue #30: upstream's config files start unchanged); here the
    // start then fails for the missing cluster ID, which the misspelt key did not set.
    let (code, stderr) = BIN.run_to_exit(dir.path(), "[Global]\nRegoin = us-east-1\n").await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.lines().any(|l| l.starts_with('W')
            && l.contains("unknown key [Global] Regoin (line 2)")
            && !l.contains("us-east-1")),
        "{stderr}"
    );
    assert!(stderr.contains("ClusterID"), "{stderr}");

    // A bad value names the key.
    let (code, stderr) = BIN
        .run_to_exit(
            dir.path(),
            "[Global]\nKubernetesClusterID = c1\nDisableSecurityGroupIngress = maybe\n",
        )
        .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("DisableSecurityGroupIngress"), "{stderr}");

    // No cluster ID and no --allow-untagged-cloud: refused, as upstream.
    let (code, stderr) = BIN.run_to_exit(dir.path(), "[Global]\nRegion = us-east-1\n").await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no ClusterID found"), "{stderr}");
}

/// Runs `ecr-credential-provider` as the kubelet does: one request for `image` on stdin, with
/// moto's endpoint and static keys and nothing else of the caller's AWS environment.
fn run_ecr_plugin(moto_url: &str, image: &str) -> std::process::Output {
    let request = serde_json::json!({
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "kind": "CredentialProviderRequest",
        "image": image,
    });
    let mut cmd = Command::new(ECR_PLUGIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("AWS_") {
            cmd.env_remove(&k);
        }
    }
    let mut child = cmd
        .env("AWS_ENDPOINT_URL", moto_url)
        .envs(crate::support::aws_test_credentials())
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(request.to_string().as_bytes()).unwrap();
    let out = child.wait_with_output().unwrap();
    crate::support::assert_output_has_no_secrets("ecr-credential-provider", &out);
    out
}

/// `ecr-credential-provider` as the kubelet runs it, against moto's ECR.
#[tokio::test]
async fn ecr_credential_provider_answers_for_an_ecr_image_and_rejects_others() {
    let moto = Moto::start().await.unwrap();
    let out = run_ecr_plugin(&moto.url, "123456789012.dkr.ecr.us-east-1.amazonaws.com/app:v1");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let resp: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(resp["kind"], "CredentialProviderResponse");
    assert_eq!(resp["apiVersion"], "credentialprovider.kubelet.k8s.io/v1");
    assert_eq!(resp["cacheKeyType"], "Registry");
    // moto's token expired in 2015: the kubelet must not cache it.
    assert!(resp["cacheDuration"].as_str().is_none_or(|d| d == "0s"), "{resp}");
    let auth = &resp["auth"]["123456789012.dkr.ecr.us-east-1.amazonaws.com"];
    assert_eq!(auth["username"], "AWS");
    assert!(auth["password"].as_str().is_some_and(|p| !p.is_empty()), "{resp}");

    // Not a known ECR host: asked of ECR in the default region, as upstream; with no default
    // region here that fails: exit 1, nothing on stdout, the error names the call.
    let out = run_ecr_plugin(&moto.url, "docker.io/library/nginx");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(stderr.contains("ecr:GetAuthorizationToken"), "{stderr}");
}

/// Runs one m5.large instance in `subnet` with no tags at all, as DescribeInstances sees it.
async fn run_untagged_instance(ec2: &aws_sdk_ec2::Client, subnet: &str) -> Instance {
    let r = ec2
        .run_instances()
        .image_id("ami-12c6146b")
        .instance_type(aws_sdk_ec2::types::InstanceType::M5Large)
        .min_count(1)
        .max_count(1)
        .subnet_id(subnet)
        .send()
        .await
        .unwrap();
    let id = r.instances()[0].instance_id().unwrap().to_string();
    let d = ec2.describe_instances().instance_ids(&id).send().await.unwrap();
    d.reservations()[0].instances()[0].clone()
}

/// Issue 11 point 5: a NotReady Node without providerID named `kept` (with address `kept_ip`)
/// is never deleted because its instance was "not found by name". In the same run a
/// terminated, tagged instance's NotReady Node is deleted (the positive control: the lifecycle
/// controller was running and deleting), and `kept` then survives at least 10 more passes
/// (`--node-monitor-period=1s`), each logged as an error for it.
async fn a_node_without_provider_id_survives_the_lifecycle_controller(
    moto: &Moto,
    cluster: &str,
    control_subnet: &str,
    kept: &str,
    kept_ip: &str,
) {
    const PASSES: usize = 10;
    let ec2 = testing::ec2(&moto.url).await;
    let control = run_instances(&ec2, control_subnet, cluster, 1, None).await.unwrap().remove(0);

    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm(&testing::cloud_config(&moto.url, cluster, ""), &[NO_ROUTES.into()]);
    let nodes = env.nodes();
    let start = Instant::now();
    register(&nodes, kept, kept_ip, "False").await;
    register(&nodes, dns(&control), ip(&control), "False").await;

    // The control is initialised (it gets its providerID), then its instance is terminated.
    let n = initialised(&nodes, dns(&control)).await;
    assert!(provider_id(&n).is_some_and(|p| p.ends_with(id(&control))));
    ec2.terminate_instances().instance_ids(id(&control)).send().await.unwrap();
    wait_for("the terminated instance's node to be deleted", || async {
        nodes.get_opt(dns(&control)).await.unwrap().is_none().then_some(())
    })
    .await;
    eprintln!("control node deleted {:?} after the nodes registered", start.elapsed());

    // The node without providerID is still there, and stays through PASSES more passes.
    let errors_for_kept = |log: &str| {
        log.lines()
            .filter(|l| l.contains("error checking if node exists") && l.contains(kept))
            .count()
    };
    let seen = errors_for_kept(&ccm.logs());
    let passes = wait_for(&format!("{PASSES} more lifecycle passes over {kept}"), || async {
        let exists = nodes.get_opt(kept).await.unwrap().is_some();
        assert!(
            exists,
            "node {kept} (no providerID) was deleted {:?} after it registered; manager log:\n{}",
            start.elapsed(),
            ccm.logs()
        );
        let n = errors_for_kept(&ccm.logs());
        (n >= seen + PASSES).then_some(n)
    })
    .await;
    let n = nodes.get(kept).await.unwrap();
    assert_eq!(provider_id(&n), None);
    assert!(has_taint(&n, names::TAINT_UNINITIALIZED), "still waiting for its instance");
    eprintln!(
        "node {kept} kept through {passes} lifecycle passes ({:?} after it registered)",
        start.elapsed()
    );
    let deleting: Api<Event> = Api::all(env.client.clone());
    let events = deleting.list(&ListParams::default()).await.unwrap();
    assert!(
        !events.items.iter().any(|e| e.involved_object.name.as_deref() == Some(kept)
            && e.reason.as_deref() == Some("DeletingNode")),
        "a DeletingNode event was recorded for {kept}"
    );
}

#[tokio::test]
async fn a_running_instance_without_the_cluster_tag_keeps_its_node() {
    const CLUSTER: &str = "e2e-untagged";
    let moto = Moto::start().await.unwrap();
    let ec2 = testing::ec2(&moto.url).await;
    let net = network(&ec2, CLUSTER).await.unwrap();
    // Running, but nobody tagged it for the cluster: the lookup by private DNS name (which
    // filters on the tag) does not find it.
    let untagged = run_untagged_instance(&ec2, &net.subnets[0].0).await;
    assert_eq!(instance_state(&ec2, id(&untagged)).await, "running");
    a_node_without_provider_id_survives_the_lifecycle_controller(
        &moto,
        CLUSTER,
        &net.subnets[1].0,
        dns(&untagged),
        ip(&untagged),
    )
    .await;
}

#[tokio::test]
async fn a_node_whose_name_matches_no_instance_is_kept() {
    const CLUSTER: &str = "e2e-noname";
    let moto = Moto::start().await.unwrap();
    let ec2 = testing::ec2(&moto.url).await;
    let net = network(&ec2, CLUSTER).await.unwrap();
    // A private DNS name no instance has (upstream keeps such a Node too).
    a_node_without_provider_id_survives_the_lifecycle_controller(
        &moto,
        CLUSTER,
        &net.subnets[0].0,
        "ip-10-0-9-99.ec2.internal",
        "10.0.9.99",
    )
    .await;
}

/// Issue 11 point 4: `ecr-credential-provider` against an endpoint that accepts connections and
/// never answers exits 1 with a message naming the call, before the kubelet's one-minute exec
/// timeout would kill it (the real 30 s operation timeout: no test knob).
#[tokio::test]
async fn ecr_credential_provider_gives_up_on_an_endpoint_that_never_answers() {
    // The kubelet kills an exec plugin after one minute.
    const KUBELET_EXEC_TIMEOUT: Duration = Duration::from_secs(60);
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((conn, _)) = listener.accept().await {
            held.push(conn);
        }
    });

    let request = serde_json::json!({
        "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
        "kind": "CredentialProviderRequest",
        "image": "123456789012.dkr.ecr.us-east-1.amazonaws.com/app:v1",
    });
    let mut cmd = tokio::process::Command::new(ECR_PLUGIN);
    for (k, _) in std::env::vars_os() {
        if k.to_string_lossy().starts_with("AWS_") {
            cmd.env_remove(&k);
        }
    }
    let mut child = cmd
        .env("AWS_ENDPOINT_URL", &url)
        .envs(crate::support::aws_test_credentials())
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    tokio::io::AsyncWriteExt::write_all(&mut stdin, request.to_string().as_bytes()).await.unwrap();
    drop(stdin);
    let start = Instant::now();
    let out = tokio::time::timeout(KUBELET_EXEC_TIMEOUT, child.wait_with_output())
        .await
        .expect("ecr-credential-provider still running after the kubelet's exec timeout")
        .unwrap();
    let took = start.elapsed();
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("ecr-credential-provider exited {:?} after {took:?}: {stderr}", out.status.code());
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(out.stdout.is_empty());
    assert!(stderr.contains("GetAuthorizationToken"), "{stderr}");
    assert!(stderr.to_lowercase().contains("timeout"), "{stderr}");
    crate::support::assert_output_has_no_secrets("ecr-credential-provider", &out);
}
