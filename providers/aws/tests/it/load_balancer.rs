//! LoadBalancer against moto: classic ELB and NLB lifecycles, and annotation errors.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::Filter;
use ccm_core::cloud::{CloudProvider, ProviderError, default_load_balancer_name};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use kube::api::ObjectMeta;

use crate::moto::{Moto, network, node, run_instances};

pub(crate) fn service(name: &str, uid: &str, annotations: &[(&str, &str)]) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some("default".into()),
            uid: Some(uid.into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![
                ServicePort {
                    name: Some("http".into()),
                    port: 80,
                    node_port: Some(30080),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                },
                ServicePort {
                    name: Some("https".into()),
                    port: 443,
                    node_port: Some(30443),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                },
            ]),
            ..Default::default()
        }),
        ..Default::default()
    }
}

/// Ingress rules of a security group as (protocol, from, to, source, description).
pub(crate) async fn rules(
    ec2: &aws_sdk_ec2::Client,
    sg: &str,
) -> Vec<(String, i32, i32, String, String)> {
    let d = ec2.describe_security_groups().group_ids(sg).send().await.unwrap();
    let mut out = Vec::new();
    for p in d.security_groups()[0].ip_permissions() {
        let proto = p.ip_protocol().unwrap_or_default().to_string();
        let (f, t) = (p.from_port().unwrap_or(-1), p.to_port().unwrap_or(-1));
        for r in p.ip_ranges() {
            out.push((
                proto.clone(),
                f,
                t,
                r.cidr_ip().unwrap_or_default().to_string(),
                r.description().unwrap_or_default().to_string(),
            ));
        }
        for g in p.user_id_group_pairs() {
            out.push((
                proto.clone(),
                f,
                t,
                g.group_id().unwrap_or_default().to_string(),
                g.description().unwrap_or_default().to_string(),
            ));
        }
    }
    out
}

pub(crate) async fn sg_named(ec2: &aws_sdk_ec2::Client, name: &str) -> Option<String> {
    let d = ec2
        .describe_security_groups()
        .filters(Filter::builder().name("group-name").values(name).build())
        .send()
        .await
        .unwrap();
    d.security_groups().first().and_then(|g| g.group_id()).map(str::to_string)
}

#[tokio::test]
async fn classic_elb_lifecycle_creates_and_removes_only_its_own_resources() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let elb = moto.elb().await;
    let net = network(&ec2, "lb").await.unwrap();
    // The node security group belongs to the user: rules may be added, the group never deleted.
    let node_sg = ec2
        .create_security_group()
        .group_name("nodes")
        .description("nodes")
        .vpc_id(&net.vpc)
        .send()
        .await
        .unwrap();
    let node_sg = node_sg.group_id().unwrap().to_string();
    let insts = run_instances(&ec2, &net.subnets[0].0, "lb", 3, Some(&node_sg)).await.unwrap();
    let nodes: Vec<_> = insts
        .iter()
        .map(|i| {
            node(
                i.private_dns_name().unwrap(),
                Some(format!("aws:///us-east-1a/{}", i.instance_id().unwrap())),
            )
        })
        .collect();

    let (cloud, metrics) = moto.cloud("lb", "").await.unwrap();
    let lbs = cloud.load_balancer().unwrap();
    let svc = service("web", "1a1b2c3d-0000-4000-8000-000000000001", &[]);
    let name = default_load_balancer_name(&svc);
    assert!(lbs.get_load_balancer("lb", &svc).await.unwrap().is_none());

    let status = lbs.ensure_load_balancer("lb", &svc, &nodes).await.unwrap();
    let hostname = status.ingress.as_ref().unwrap()[0].hostname.clone().unwrap();
    assert!(!hostname.is_empty());
    println!("classic ELB hostname: {hostname}");
    assert_eq!(lbs.get_load_balancer("lb", &svc).await.unwrap(), Some(status.clone()));

    let d = elb.describe_load_balancers().load_balancer_names(&name).send().await.unwrap();
    let lb = &d.load_balancer_descriptions()[0];
    let mut listeners: Vec<(i32, i32, String)> = lb
        .listener_descriptions()
        .iter()
        .filter_map(|l| l.listener())
        .map(|l| (l.load_balancer_port(), l.instance_port(), l.protocol().to_ascii_uppercase()))
        .collect();
    listeners.sort();
    assert_eq!(listeners, vec![(80, 30080, "TCP".into()), (443, 30443, "TCP".into())]);
    assert_eq!(lb.health_check().unwrap().target(), "TCP:30080");
    assert_eq!(lb.instances().len(), 3);
    let elb_sg = sg_named(&ec2, &format!("k8s-elb-{name}")).await.expect("the ELB security group");
    assert_eq!(lb.security_groups(), std::slice::from_ref(&elb_sg));
    let elb_rules = rules(&ec2, &elb_sg).await;
    for port in [80, 443] {
        assert!(
            elb_rules.iter().any(|r| r.0 == "tcp" && r.1 == port && r.3 == "0.0.0.0/0"),
            "{elb_rules:?}"
        );
    }
    assert!(rules(&ec2, &node_sg).await.iter().any(|r| r.3 == elb_sg), "the nodes admit the ELB");

    // Fewer nodes: the dropped instance is deregistered. Ensuring again changes nothing else.
    lbs.update_load_balancer("lb", &svc, &nodes[..2]).await.unwrap();
    let d = elb.describe_load_balancers().load_balancer_names(&name).send().await.unwrap();
    assert_eq!(d.load_balancer_descriptions()[0].instances().len(), 2);
    let creates = metrics.requests("elb", "CreateLoadBalancer");
    lbs.ensure_load_balancer("lb", &svc, &nodes[..2]).await.unwrap();
    assert_eq!(metrics.requests("elb", "CreateLoadBalancer"), creates);

    // A Node joins an unchanged Service (the node sync's update, issue #15): one
    // DescribeLoadBalancers and one RegisterInstances, no other ELB or security-group call
    // (the joining instance's group already admits the ELB).
    let calls = |m: &ccm_provider_aws::ApiMetrics| -> Vec<(&str, &str, u64)> {
        [
            ("elb", "DescribeLoadBalancers"),
            ("elb", "RegisterInstancesWithLoadBalancer"),
            ("elb", "AddTags"),
            ("elb", "ModifyLoadBalancerAttributes"),
            ("ec2", "DescribeSecurityGroups"),
            ("ec2", "DescribeSubnets"),
        ]
        .into_iter()
        .map(|(s, op)| (s, op, m.requests(s, op)))
        .collect()
    };
    let before = calls(&metrics);
    lbs.update_load_balancer("lb", &svc, &nodes).await.unwrap();
    let d = elb.describe_load_balancers().load_balancer_names(&name).send().await.unwrap();
    assert_eq!(d.load_balancer_descriptions()[0].instances().len(), 3);
    let spent: Vec<(&str, &str, u64)> = calls(&metrics)
        .into_iter()
        .zip(&before)
        .map(|((s, op, n), (_, _, b))| (s, op, n - b))
        .filter(|(_, _, n)| *n > 0)
        .collect();
    assert_eq!(
        spent,
        vec![("elb", "DescribeLoadBalancers", 1), ("elb", "RegisterInstancesWithLoadBalancer", 1)]
    );
    // A changed Service is ensured in full by the update (its annotations are applied).
    let idle = service(
        "web",
        "1a1b2c3d-0000-4000-8000-000000000001",
        &[("service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout", "120")],
    );
    let before = metrics.requests("elb", "ModifyLoadBalancerAttributes");
    lbs.update_load_balancer("lb", &idle, &nodes).await.unwrap();
    assert_eq!(metrics.requests("elb", "ModifyLoadBalancerAttributes"), before + 1);
    lbs.ensure_load_balancer("lb", &svc, &nodes[..2]).await.unwrap();

    // A bad annotation: an error naming it, and no cloud change at all.
    let key = "service.beta.kubernetes.io/aws-load-balancer-healthcheck-interval";
    let bad = service("bad", "2a1b2c3d-0000-4000-8000-000000000002", &[(key, "1")]);
    let before: u64 = ["ec2", "elb", "elbv2"]
        .iter()
        .map(|s| {
            metrics.requests(s, "CreateSecurityGroup") + metrics.requests(s, "CreateLoadBalancer")
        })
        .sum();
    match lbs.ensure_load_balancer("lb", &bad, &nodes).await {
        Err(ProviderError::Invalid { what, .. }) => assert_eq!(what, key),
        other => panic!("expected Invalid naming {key}, got {other:?}"),
    }
    let after: u64 = ["ec2", "elb", "elbv2"]
        .iter()
        .map(|s| {
            metrics.requests(s, "CreateSecurityGroup") + metrics.requests(s, "CreateLoadBalancer")
        })
        .sum();
    assert_eq!(before, after);
    assert!(lbs.get_load_balancer("lb", &bad).await.unwrap().is_none());

    // Another controller's Service.
    let ext = service(
        "ext",
        "3a1b2c3d-0000-4000-8000-000000000003",
        &[("service.beta.kubernetes.io/aws-load-balancer-type", "external")],
    );
    assert!(matches!(
        lbs.ensure_load_balancer("lb", &ext, &nodes).await,
        Err(ProviderError::ImplementedElsewhere)
    ));

    // Delete: the ELB, its security group and the node rule go; the node group stays.
    lbs.ensure_load_balancer_deleted("lb", &svc).await.unwrap();
    assert!(lbs.get_load_balancer("lb", &svc).await.unwrap().is_none());
    assert!(sg_named(&ec2, &format!("k8s-elb-{name}")).await.is_none());
    assert!(sg_named(&ec2, "nodes").await.is_some());
    assert!(!rules(&ec2, &node_sg).await.iter().any(|r| r.3 == elb_sg));
    // Deleting again is fine.
    lbs.ensure_load_balancer_deleted("lb", &svc).await.unwrap();
}

#[tokio::test]
async fn nlb_lifecycle_with_target_groups_listeners_and_marked_node_rules() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let elbv2 = moto.elbv2().await;
    let net = network(&ec2, "nlb").await.unwrap();
    let node_sg = ec2
        .create_security_group()
        .group_name("nodes")
        .description("nodes")
        .vpc_id(&net.vpc)
        .send()
        .await
        .unwrap();
    let node_sg = node_sg.group_id().unwrap().to_string();
    let insts = run_instances(&ec2, &net.subnets[0].0, "nlb", 2, Some(&node_sg)).await.unwrap();
    let nodes: Vec<_> = insts
        .iter()
        .map(|i| {
            node(
                i.private_dns_name().unwrap(),
                Some(format!("aws:///us-east-1a/{}", i.instance_id().unwrap())),
            )
        })
        .collect();

    let (cloud, _) = moto.cloud("nlb", "").await.unwrap();
    let lbs = cloud.load_balancer().unwrap();
    let svc = service(
        "api",
        "4a1b2c3d-0000-4000-8000-000000000010",
        &[
            ("service.beta.kubernetes.io/aws-load-balancer-type", "nlb"),
            ("service.beta.kubernetes.io/aws-load-balancer-additional-resource-tags", "team=api"),
        ],
    );
    let name = default_load_balancer_name(&svc);
    let status = lbs.ensure_load_balancer("nlb", &svc, &nodes).await.unwrap();
    let hostname = status.ingress.as_ref().unwrap()[0].hostname.clone().unwrap();
    println!("NLB hostname: {hostname}");

    let d = elbv2.describe_load_balancers().names(&name).send().await.unwrap();
    let lb = &d.load_balancers()[0];
    assert_eq!(lb.r#type().map(|t| t.as_str()), Some("network"));
    let arn = lb.load_balancer_arn().unwrap().to_string();
    let listeners = elbv2.describe_listeners().load_balancer_arn(&arn).send().await.unwrap();
    let mut ports: Vec<i32> = listeners.listeners().iter().filter_map(|l| l.port()).collect();
    ports.sort();
    assert_eq!(ports, vec![80, 443]);
    let tgs = elbv2.describe_target_groups().load_balancer_arn(&arn).send().await.unwrap();
    assert_eq!(tgs.target_groups().len(), 2);
    for tg in tgs.target_groups() {
        assert!(tg.target_group_name().unwrap().starts_with("k8s-default-api-"), "{tg:?}");
        let h = elbv2
            .describe_target_health()
            .target_group_arn(tg.target_group_arn().unwrap())
            .send()
            .await
            .unwrap();
        assert_eq!(h.target_health_descriptions().len(), 2);
    }
    let node_rules = rules(&ec2, &node_sg).await;
    let client = format!("kubernetes.io/rule/nlb/client={name}");
    for np in [30080, 30443] {
        assert!(node_rules.iter().any(|r| r.1 == np && r.4 == client), "{node_rules:?}");
    }

    // A rule the user added to the node group by hand survives everything below.
    ec2.authorize_security_group_ingress()
        .group_id(&node_sg)
        .ip_protocol("tcp")
        .from_port(22)
        .to_port(22)
        .cidr_ip("10.0.0.0/8")
        .send()
        .await
        .unwrap();

    lbs.ensure_load_balancer_deleted("nlb", &svc).await.unwrap();
    assert!(lbs.get_load_balancer("nlb", &svc).await.unwrap().is_none());
    let all_tgs = elbv2.describe_target_groups().send().await.unwrap();
    assert!(all_tgs.target_groups().is_empty(), "{:?}", all_tgs.target_groups());
    let left = rules(&ec2, &node_sg).await;
    assert!(!left.iter().any(|r| r.4.contains(&name)), "{left:?}");
    assert!(left.iter().any(|r| r.1 == 22), "the user's rule stays: {left:?}");
}

/// The controller killed between two calls of a create or a delete (chaos suite, issue #21):
/// what it created without the load balancer is reported by GetLoadBalancer, so the core runs
/// the Service's deletion and nothing is left. A same-named group without our tag is not ours.
#[tokio::test]
async fn resources_left_by_a_create_or_delete_cut_short_are_found_and_deleted() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let elb = moto.elb().await;
    let elbv2 = moto.elbv2().await;
    let net = network(&ec2, "cut").await.unwrap();
    let node_sg = ec2
        .create_security_group()
        .group_name("nodes")
        .description("nodes")
        .vpc_id(&net.vpc)
        .send()
        .await
        .unwrap();
    let node_sg = node_sg.group_id().unwrap().to_string();
    let insts = run_instances(&ec2, &net.subnets[0].0, "cut", 2, Some(&node_sg)).await.unwrap();
    let nodes: Vec<_> = insts
        .iter()
        .map(|i| {
            node(
                i.private_dns_name().unwrap(),
                Some(format!("aws:///us-east-1a/{}", i.instance_id().unwrap())),
            )
        })
        .collect();
    let (cloud, _) = moto.cloud("cut", "").await.unwrap();
    let lbs = cloud.load_balancer().unwrap();

    // Classic: the ELB went, its security group (and the node rule admitting it) did not.
    let svc = service("web", "5a1b2c3d-0000-4000-8000-000000000020", &[]);
    let name = default_load_balancer_name(&svc);
    lbs.ensure_load_balancer("cut", &svc, &nodes).await.unwrap();
    let elb_sg = sg_named(&ec2, &format!("k8s-elb-{name}")).await.unwrap();
    elb.delete_load_balancer().load_balancer_name(&name).send().await.unwrap();
    let found = lbs.get_load_balancer("cut", &svc).await.unwrap();
    assert_eq!(
        found,
        Some(Default::default()),
        "a left-over security group counts as a load balancer without ingress"
    );
    lbs.ensure_load_balancer_deleted("cut", &svc).await.unwrap();
    assert!(sg_named(&ec2, &format!("k8s-elb-{name}")).await.is_none(), "the group is deleted");
    assert!(!rules(&ec2, &node_sg).await.iter().any(|r| r.3 == elb_sg), "and its node rule");
    assert_eq!(lbs.get_load_balancer("cut", &svc).await.unwrap(), None);

    // NLB: the load balancer went, its target groups did not.
    let nlb = service(
        "api",
        "6a1b2c3d-0000-4000-8000-000000000021",
        &[("service.beta.kubernetes.io/aws-load-balancer-type", "nlb")],
    );
    let nlb_name = default_load_balancer_name(&nlb);
    lbs.ensure_load_balancer("cut", &nlb, &nodes).await.unwrap();
    let d = elbv2.describe_load_balancers().names(&nlb_name).send().await.unwrap();
    let arn = d.load_balancers()[0].load_balancer_arn().unwrap().to_string();
    let listeners = elbv2.describe_listeners().load_balancer_arn(&arn).send().await.unwrap();
    for l in listeners.listeners() {
        elbv2.delete_listener().listener_arn(l.listener_arn().unwrap()).send().await.unwrap();
    }
    elbv2.delete_load_balancer().load_balancer_arn(&arn).send().await.unwrap();
    assert_eq!(elbv2.describe_target_groups().send().await.unwrap().target_groups().len(), 2);
    assert_eq!(lbs.get_load_balancer("cut", &nlb).await.unwrap(), Some(Default::default()));
    lbs.ensure_load_balancer_deleted("cut", &nlb).await.unwrap();
    let tgs = elbv2.describe_target_groups().send().await.unwrap();
    assert!(tgs.target_groups().is_empty(), "{:?}", tgs.target_groups());
    assert_eq!(lbs.get_load_balancer("cut", &nlb).await.unwrap(), None);

    // A group with our naming but not our cluster tag: not reported, never deleted.
    let other = service("other", "7a1b2c3d-0000-4000-8000-000000000022", &[]);
    let other_group = format!("k8s-elb-{}", default_load_balancer_name(&other));
    ec2.create_security_group()
        .group_name(&other_group)
        .description("someone else's")
        .vpc_id(&net.vpc)
        .send()
        .await
        .unwrap();
    assert_eq!(lbs.get_load_balancer("cut", &other).await.unwrap(), None);
    lbs.ensure_load_balancer_deleted("cut", &other).await.unwrap();
    assert!(sg_named(&ec2, &other_group).await.is_some());
}

/// Issue #29 (LOW): `orphans` owns only what carries this cluster's `owned` tag AND the
/// Service it was made for; a load balancer of our name shape, or with the cluster tag but no
/// Service, is listed as not owned and `orphans --delete` refuses it.
#[tokio::test]
async fn orphans_own_only_load_balancers_tagged_with_the_cluster_and_a_service() {
    use aws_sdk_elasticloadbalancing::types::{Listener, Tag as ElbTag};
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let elb = moto.elb().await;
    let net = network(&ec2, "inv").await.unwrap();
    let insts = run_instances(&ec2, &net.subnets[0].0, "inv", 1, None).await.unwrap();
    let nodes = vec![node(
        insts[0].private_dns_name().unwrap(),
        Some(format!("aws:///us-east-1a/{}", insts[0].instance_id().unwrap())),
    )];
    let (cloud, _) = moto.cloud("inv", "").await.unwrap();
    let lbs = cloud.load_balancer().unwrap();
    let svc = service("web", "8a1b2c3d-0000-4000-8000-000000000030", &[]);
    let ours = default_load_balancer_name(&svc);
    lbs.ensure_load_balancer("inv", &svc, &nodes).await.unwrap();

    // Hand-made: our name shape without tags, and the cluster's owned tag without a Service.
    let lookalike =
        default_load_balancer_name(&service("x", "9a1b2c3d-0000-4000-8000-000000000031", &[]));
    for (name, tags) in [
        (lookalike.as_str(), vec![]),
        ("cluster-tag-only", vec![("kubernetes.io/cluster/inv", "owned")]),
    ] {
        elb.create_load_balancer()
            .load_balancer_name(name)
            .listeners(
                Listener::builder()
                    .protocol("TCP")
                    .load_balancer_port(80)
                    .instance_port(30080)
                    .build()
                    .unwrap(),
            )
            .subnets(&net.subnets[0].0)
            .set_tags(Some(
                tags.iter()
                    .map(|(k, v)| ElbTag::builder().key(*k).value(*v).build().unwrap())
                    .collect(),
            ))
            .send()
            .await
            .unwrap();
    }

    let listed = lbs.list_cloud_load_balancers("inv").await.unwrap();
    let owned: BTreeMap<&str, bool> = listed.iter().map(|l| (l.name.as_str(), l.owned)).collect();
    assert_eq!(
        owned,
        BTreeMap::from([
            (ours.as_str(), true),
            (lookalike.as_str(), false),
            ("cluster-tag-only", false)
        ])
    );
    for name in [lookalike.as_str(), "cluster-tag-only"] {
        let l = listed.iter().find(|l| l.name == name).unwrap();
        let e = lbs.delete_cloud_load_balancer("inv", l).await.unwrap_err();
        assert!(matches!(e, ProviderError::Invalid { .. }), "{name}: {e}");
    }
    let left = elb.describe_load_balancers().send().await.unwrap();
    let mut names: Vec<&str> =
        left.load_balancer_descriptions().iter().filter_map(|d| d.load_balancer_name()).collect();
    names.sort_unstable();
    let mut want = vec![ours.as_str(), lookalike.as_str(), "cluster-tag-only"];
    want.sort_unstable();
    assert_eq!(names, want);
}
