//! LoadBalancer behaviours matched to upstream (issue 14), against moto: TLS on NLBs and the
//! classic SSL negotiation policy, target-group health checks, naming and update order,
//! security-group rules, subnet discovery, refusing a type change, settings that follow their
//! annotations both ways, and classic backend protocols without a certificate.

use std::collections::BTreeSet;
use std::sync::Arc;

use aws_sdk_ec2::types::{Filter, ResourceType};
use ccm_core::cloud::{CloudProvider, ProviderError, default_load_balancer_name};
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
use ccm_provider_aws::testing::{self, Network, node_security_group};
use ccm_provider_aws::{ApiMetrics, AwsClients, Cloud, CloudConfig, LazyClients};
use k8s_openapi::api::core::v1::{Node, Service};

use crate::load_balancer::{rules, service, sg_named};
use crate::moto::{Moto, network, node, run_instances, tag, tags_for};

const TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";
/// An IAM server-certificate ARN: moto accepts it on new listeners without an ACM entry.
const CERT: &str = "arn:aws:iam::123456789012:server-certificate/web";
const POLICY: &str = "ELBSecurityPolicy-TLS-1-2-2017-01";

/// A VPC (from the shared fixture), a cluster-tagged node security group, and `n` instances
/// in it registered as Nodes.
async fn world(moto: &Moto, cluster: &str, n: i32) -> (Network, String, Vec<Node>) {
    let ec2 = moto.ec2().await;
    let net = network(&ec2, cluster).await.unwrap();
    let node_sg = node_security_group(&ec2, &net.vpc, cluster).await.unwrap();
    let insts = run_instances(&ec2, &net.subnets[0].0, cluster, n, Some(&node_sg)).await.unwrap();
    let nodes = insts
        .iter()
        .map(|i| {
            node(
                i.private_dns_name().unwrap(),
                Some(format!("aws:///us-east-1a/{}", i.instance_id().unwrap())),
            )
        })
        .collect();
    (net, node_sg, nodes)
}

fn with(svc: &Service, annotations: &[(&str, &str)]) -> Service {
    let mut s = svc.clone();
    let a = s.metadata.annotations.get_or_insert_with(Default::default);
    for (k, v) in annotations {
        a.insert(k.to_string(), v.to_string());
    }
    s
}

fn without(svc: &Service, keys: &[&str]) -> Service {
    let mut s = svc.clone();
    if let Some(a) = s.metadata.annotations.as_mut() {
        for k in keys {
            a.remove(*k);
        }
    }
    s
}

async fn nlb_arn(elbv2: &aws_sdk_elasticloadbalancingv2::Client, name: &str) -> String {
    let d = elbv2.describe_load_balancers().names(name).send().await.unwrap();
    d.load_balancers()[0].load_balancer_arn().unwrap().to_string()
}

async fn nlb_attributes(
    elbv2: &aws_sdk_elasticloadbalancingv2::Client,
    arn: &str,
) -> std::collections::BTreeMap<String, String> {
    let a = elbv2.describe_load_balancer_attributes().load_balancer_arn(arn).send().await.unwrap();
    a.attributes()
        .iter()
        .map(|x| (x.key().unwrap_or_default().into(), x.value().unwrap_or_default().into()))
        .collect()
}

/// Point 1: an NLB with a certificate gets TLS listeners on the ssl ports only, with the
/// negotiation policy as their SslPolicy; the other ports stay TCP.
#[tokio::test]
async fn nlb_ssl_cert_gives_tls_listeners_on_ssl_ports_with_the_negotiation_policy() {
    let moto = Moto::start().await.unwrap();
    let elbv2 = moto.elbv2().await;
    let (_, _, nodes) = world(&moto, "tls", 1).await;
    let (cloud, _) = moto.cloud("tls", "").await.unwrap();
    let lbs = cloud.load_balancer().unwrap();
    let svc = service(
        "tls",
        "5a1b2101-0000-4000-8000-000000000000",
        &[
            (TYPE, "nlb"),
            ("service.beta.kubernetes.io/aws-load-balancer-ssl-cert", CERT),
            ("service.beta.kubernetes.io/aws-load-balancer-ssl-ports", "https"),
            ("service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy", POLICY),
        ],
    );
    lbs.ensure_load_balancer("tls", &svc, &nodes).await.unwrap();
    let arn = nlb_arn(&elbv2, &default_load_balancer_name(&svc)).await;
    let ls = elbv2.describe_listeners().load_balancer_arn(&arn).send().await.unwrap();
    let mut seen: Vec<(i32, String, Option<String>, Option<String>)> = ls
        .listeners()
        .iter()
        .map(|l| {
            (
                l.port().unwrap(),
                l.protocol().unwrap().as_str().to_string(),
                l.certificates().first().and_then(|c| c.certificate_arn()).map(str::to_string),
                l.ssl_policy().filter(|p| !p.is_empty()).map(str::to_string),
            )
        })
        .collect();
    seen.sort();
    println!("NLB listeners: {seen:?}");
    assert_eq!(seen[0].0, 80);
    assert_eq!(seen[0].1, "TCP");
    assert_eq!(seen[0].2, None);
    assert_eq!(seen[1], (443, "TLS".into(), Some(CERT.into()), Some(POLICY.into())));
    // Re-ensuring changes no listener.
    let (cloud2, metrics) = moto.cloud("tls", "").await.unwrap();
    cloud2.load_balancer().unwrap().ensure_load_balancer("tls", &svc, &nodes).await.unwrap();
    assert_eq!(metrics.requests("elbv2", "ModifyListener"), 0);
    assert_eq!(metrics.requests("elbv2", "CreateListener"), 0);
}

/// Point 1 (classic): the negotiation policy becomes upstream's
/// `k8s-SSLNegotiationPolicy-<policy>` on the ELB and is set on its TLS listener only.
#[tokio::test]
async fn classic_ssl_negotiation_policy_is_created_and_set_on_tls_listeners() {
    let moto = Moto::start().await.unwrap();
    let elb = moto.elb().await;
    let (_, _, nodes) = world(&moto, "neg", 1).await;
    let (cloud, _) = moto.cloud("neg", "").await.unwrap();
    let lbs = cloud.load_balancer().unwrap();
    let svc = service(
        "neg",
        "5a1b2102-0000-4000-8000-000000000000",
        &[
            ("service.beta.kubernetes.io/aws-load-balancer-ssl-cert", CERT),
            ("service.beta.kubernetes.io/aws-load-balancer-ssl-ports", "443"),
            ("service.beta.kubernetes.io/aws-load-balancer-ssl-negotiation-policy", POLICY),
        ],
    );
    lbs.ensure_load_balancer("neg", &svc, &nodes).await.unwrap();
    let name = default_load_balancer_name(&svc);
    let policy_name = format!("k8s-SSLNegotiationPolicy-{POLICY}");
    let p = elb
        .describe_load_balancer_policies()
        .load_balancer_name(&name)
        .policy_names(&policy_name)
        .send()
        .await
        .unwrap();
    let d = &p.policy_descriptions()[0];
    assert_eq!(d.policy_type_name(), Some("SSLNegotiationPolicyType"));
    assert!(
        d.policy_attribute_descriptions()
            .iter()
            .any(|a| a.attribute_name() == Some("Reference-Security-Policy")
                && a.attribute_value() == Some(POLICY)),
        "{d:?}"
    );
    let lb = elb.describe_load_balancers().load_balancer_names(&name).send().await.unwrap();
    for l in lb.load_balancer_descriptions()[0].listener_descriptions() {
        let port = l.listener().unwrap().load_balancer_port();
        let has = l.policy_names().contains(&policy_name);
        assert_eq!(has, port == 443, "port {port}: {:?}", l.policy_names());
    }
}

/// Point 2: target groups carry upstream's name; a health-check annotation change updates the
/// existing target group in place (ModifyTargetGroup, same ARN, listener untouched).
#[tokio::test]
async fn nlb_target_group_health_check_is_modified_in_place_under_upstreams_name() {
    let moto = Moto::start().await.unwrap();
    let elbv2 = moto.elbv2().await;
    let (_, _, nodes) = world(&moto, "hc", 2).await;
    let (cloud, metrics) = moto.cloud("hc", "").await.unwrap();
    let lbs = cloud.load_balancer().unwrap();
    let svc = service("hc", "5a1b2103-0000-4000-8000-000000000000", &[(TYPE, "nlb")]);
    lbs.ensure_load_balancer("hc", &svc, &nodes).await.unwrap();
    let arn = nlb_arn(&elbv2, &default_load_balancer_name(&svc)).await;
    let tgs = elbv2.describe_target_groups().load_balancer_arn(&arn).send().await.unwrap();
    let mut names: Vec<String> =
        tgs.target_groups().iter().map(|t| t.target_group_name().unwrap().to_string()).collect();
    names.sort();
    // Upstream's recipe (sha1 of cluster, namespace, name, port, node port, target protocol,
    // target type, health-check protocol and interval, concatenated), computed with sha1sum.
    let expected: Vec<String> = vec![
        format!("k8s-default-hc-{}", upstream_hash("hcdefaulthc8030080TCPinstanceTCP30")),
        format!("k8s-default-hc-{}", upstream_hash("hcdefaulthc44330443TCPinstanceTCP30")),
    ]
    .into_iter()
    .collect::<BTreeSet<_>>()
    .into_iter()
    .collect();
    assert_eq!(names, expected);
    let before: BTreeSet<String> =
        tgs.target_groups().iter().map(|t| t.target_group_arn().unwrap().to_string()).collect();
    for t in tgs.target_groups() {
        assert_eq!(t.healthy_threshold_count(), Some(3));
        assert_eq!(t.health_check_interval_seconds(), Some(30));
    }

    let svc2 = with(
        &svc,
        &[
            ("service.beta.kubernetes.io/aws-load-balancer-healthcheck-healthy-threshold", "5"),
            ("service.beta.kubernetes.io/aws-load-balancer-healthcheck-port", "31000"),
        ],
    );
    lbs.update_load_balancer("hc", &svc2, &nodes).await.unwrap();
    let tgs = elbv2.describe_target_groups().load_balancer_arn(&arn).send().await.unwrap();
    let after: BTreeSet<String> =
        tgs.target_groups().iter().map(|t| t.target_group_arn().unwrap().to_string()).collect();
    assert_eq!(before, after, "the same target groups, modified in place");
    for t in tgs.target_groups() {
        assert_eq!(t.healthy_threshold_count(), Some(5), "{t:?}");
        assert_eq!(t.health_check_port(), Some("31000"), "{t:?}");
    }
    assert_eq!(metrics.requests("elbv2", "ModifyTargetGroup"), 2);
    assert_eq!(metrics.requests("elbv2", "ModifyListener"), 0);
}

/// The first 10 hex digits of SHA-1, for upstream's target-group names (known vectors).
fn upstream_hash(input: &str) -> &'static str {
    match input {
        "hcdefaulthc8030080TCPinstanceTCP30" => "ea031da182",
        "hcdefaulthc44330443TCPinstanceTCP30" => "1e1d44a9c6",
        other => panic!("no vector for {other}"),
    }
}

/// Point 2: a new target group (here: the node port changed) gets its targets before the
/// listener points at it. With RegisterTargets failing, the listener stays on the old target
/// group, which still has its targets: no window where the listener serves an empty group.
#[tokio::test]
async fn nlb_listener_moves_to_a_new_target_group_only_after_its_targets_are_registered() {
    let moto = Moto::start().await.unwrap();
    let proxy =
        FaultProxy::start(Url::parse(&moto.0.url).unwrap(), Protocol::AwsQuery).await.unwrap();
    let admin = proxy.admin();
    let elbv2 = moto.elbv2().await;
    let (_, _, nodes) = world(&moto, "order", 2).await;
    let cfg = CloudConfig::parse(&testing::cloud_config(&proxy.url(), "order", "")).unwrap();
    let clients = AwsClients::from_sdk_config(&cfg, &testing::sdk().await, ApiMetrics::default())
        .await
        .unwrap();
    let cloud = Cloud::with_clients(cfg, Arc::new(LazyClients::ready(clients)));
    let lbs = cloud.load_balancer().unwrap();
    let svc = service("order", "5a1b2104-0000-4000-8000-000000000000", &[(TYPE, "nlb")]);
    lbs.ensure_load_balancer("order", &svc, &nodes).await.unwrap();
    let arn = nlb_arn(&elbv2, &default_load_balancer_name(&svc)).await;
    let listener_tg = |elbv2: aws_sdk_elasticloadbalancingv2::Client, arn: String| async move {
        let ls = elbv2.describe_listeners().load_balancer_arn(&arn).send().await.unwrap();
        let l = ls.listeners().iter().find(|l| l.port() == Some(80)).unwrap().clone();
        l.default_actions()[0].target_group_arn().unwrap().to_string()
    };
    let old_tg = listener_tg(elbv2.clone(), arn.clone()).await;

    let mut moved = svc.clone();
    moved.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(31080);
    admin
        .inject(FaultRule::new(
            "elasticloadbalancing:RegisterTargets",
            Fault::Status { status: 403, body: None },
        ))
        .await
        .unwrap();
    let err = lbs.update_load_balancer("order", &moved, &nodes).await;
    assert!(err.is_err(), "RegisterTargets failed, so must the update: {err:?}");
    let still = listener_tg(elbv2.clone(), arn.clone()).await;
    assert_eq!(still, old_tg, "the listener still serves the old, populated target group");
    let h = elbv2.describe_target_health().target_group_arn(&still).send().await.unwrap();
    assert_eq!(h.target_health_descriptions().len(), 2);

    admin.clear_faults().await.unwrap();
    lbs.update_load_balancer("order", &moved, &nodes).await.unwrap();
    let new_tg = listener_tg(elbv2.clone(), arn.clone()).await;
    assert_ne!(new_tg, old_tg);
    let h = elbv2.describe_target_health().target_group_arn(&new_tg).send().await.unwrap();
    assert_eq!(h.target_health_descriptions().len(), 2);
    assert!(
        h.target_health_descriptions().iter().all(|t| t.target().unwrap().port() == Some(31080))
    );
}

/// Point 3: with `loadBalancerSourceRanges`, the node groups admit the health checks from the
/// load balancer's subnets on the traffic ports (as upstream); without source ranges that rule
/// is redundant and absent.
#[tokio::test]
async fn nlb_with_source_ranges_gets_the_health_check_rule() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let (_, node_sg, nodes) = world(&moto, "hrule", 1).await;
    let (cloud, _) = moto.cloud("hrule", "").await.unwrap();
    let lbs = cloud.load_balancer().unwrap();
    let open = service("open", "5a1b2105-0000-4000-8000-000000000000", &[(TYPE, "nlb")]);
    lbs.ensure_load_balancer("hrule", &open, &nodes).await.unwrap();
    let open_name = default_load_balancer_name(&open);
    let r = rules(&ec2, &node_sg).await;
    assert!(
        !r.iter().any(|x| x.4 == format!("kubernetes.io/rule/nlb/health={open_name}")),
        "{r:?}"
    );

    let mut svc = service("ranged", "5a1b2106-0000-4000-8000-000000000000", &[(TYPE, "nlb")]);
    svc.spec.as_mut().unwrap().load_balancer_source_ranges = Some(vec!["203.0.113.0/24".into()]);
    lbs.ensure_load_balancer("hrule", &svc, &nodes).await.unwrap();
    let name = default_load_balancer_name(&svc);
    let r = rules(&ec2, &node_sg).await;
    let health = format!("kubernetes.io/rule/nlb/health={name}");
    let client = format!("kubernetes.io/rule/nlb/client={name}");
    for np in [30080, 30443] {
        for cidr in ["10.0.0.0/24", "10.0.1.0/24"] {
            assert!(
                r.iter().any(|x| x.0 == "tcp" && x.1 == np && x.3 == cidr && x.4 == health),
                "health rule {np} from {cidr}: {r:?}"
            );
        }
        assert!(r.iter().any(|x| x.1 == np && x.3 == "203.0.113.0/24" && x.4 == client), "{r:?}");
        assert!(!r.iter().any(|x| x.1 == np && x.3 == "0.0.0.0/0" && x.4 == client), "{r:?}");
    }
    lbs.ensure_load_balancer_deleted("hrule", &svc).await.unwrap();
    let r = rules(&ec2, &node_sg).await;
    assert!(!r.iter().any(|x| x.4.ends_with(&format!("={name}"))), "{r:?}");
}

/// Point 3: `ElbSecurityGroup` and the security-groups annotation: the user's group is put on
/// the ELB and the node groups admit it (upstream); deleting the Service revokes that rule
/// from the cluster's node group and never touches the user's group itself.
#[tokio::test]
async fn user_supplied_elb_security_groups_get_node_ingress_rules() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let elb = moto.elb().await;
    let (net, node_sg, nodes) = world(&moto, "usg", 1).await;
    let mk = |name: &'static str| {
        let ec2 = ec2.clone();
        let vpc = net.vpc.clone();
        async move {
            ec2.create_security_group()
                .group_name(name)
                .description(name)
                .vpc_id(vpc)
                .send()
                .await
                .unwrap()
                .group_id()
                .unwrap()
                .to_string()
        }
    };
    let shared = mk("shared-elb").await;
    let annotated = mk("annotated-elb").await;
    let (cloud, _) = moto.cloud("usg", &format!("ElbSecurityGroup = {shared}")).await.unwrap();
    let lbs = cloud.load_balancer().unwrap();

    // ElbSecurityGroup.
    let a = service("a", "5a1b2107-0000-4000-8000-000000000000", &[]);
    lbs.ensure_load_balancer("usg", &a, &nodes).await.unwrap();
    let d = elb
        .describe_load_balancers()
        .load_balancer_names(default_load_balancer_name(&a))
        .send()
        .await
        .unwrap();
    assert_eq!(d.load_balancer_descriptions()[0].security_groups(), std::slice::from_ref(&shared));
    let r = rules(&ec2, &node_sg).await;
    assert!(r.iter().any(|x| x.0 == "-1" && x.3 == shared), "nodes admit ElbSecurityGroup: {r:?}");

    // The annotation (with an extra group): the first annotated group is admitted.
    let b = service(
        "b",
        "5a1b2108-0000-4000-8000-000000000000",
        &[("service.beta.kubernetes.io/aws-load-balancer-security-groups", annotated.as_str())],
    );
    lbs.ensure_load_balancer("usg", &b, &nodes).await.unwrap();
    let r = rules(&ec2, &node_sg).await;
    assert!(r.iter().any(|x| x.0 == "-1" && x.3 == annotated), "{r:?}");

    // Another Service on the shared group: deleting one keeps the rule for the other.
    let c = service("c", "5a1b2109-0000-4000-8000-000000000000", &[]);
    lbs.ensure_load_balancer("usg", &c, &nodes).await.unwrap();
    lbs.ensure_load_balancer_deleted("usg", &a).await.unwrap();
    let r = rules(&ec2, &node_sg).await;
    assert!(r.iter().any(|x| x.3 == shared), "still used by c: {r:?}");
    lbs.ensure_load_balancer_deleted("usg", &c).await.unwrap();
    lbs.ensure_load_balancer_deleted("usg", &b).await.unwrap();
    let r = rules(&ec2, &node_sg).await;
    assert!(!r.iter().any(|x| x.3 == shared || x.3 == annotated), "{r:?}");
    // The user's groups are still there.
    for id in [&shared, &annotated] {
        let d = ec2.describe_security_groups().group_ids(id).send().await.unwrap();
        assert_eq!(d.security_groups().len(), 1);
    }
}

/// Point 3: `NLBSecurityGroupMode = Managed` is refused with an error naming the setting, and
/// nothing is created.
#[tokio::test]
async fn nlb_security_group_mode_managed_is_refused_clearly() {
    let moto = Moto::start().await.unwrap();
    let elbv2 = moto.elbv2().await;
    let (_, _, nodes) = world(&moto, "mng", 1).await;
    let (cloud, _) = moto.cloud("mng", "NLBSecurityGroupMode = Managed").await.unwrap();
    let lbs = cloud.load_balancer().unwrap();
    let svc = service("m", "5a1b2110-0000-4000-8000-000000000000", &[(TYPE, "nlb")]);
    match lbs.ensure_load_balancer("mng", &svc, &nodes).await {
        Err(ProviderError::Invalid { what, message }) => {
            assert_eq!(what, "NLBSecurityGroupMode");
            assert!(message.contains("Managed"), "{message}");
        }
        other => panic!("expected an error naming NLBSecurityGroupMode, got {other:?}"),
    }
    let all = elbv2.describe_load_balancers().send().await.unwrap();
    assert!(all.load_balancers().is_empty());
    // Classic ELBs are unaffected by the NLB setting.
    let classic = service("cl", "5a1b2111-0000-4000-8000-000000000000", &[]);
    lbs.ensure_load_balancer("mng", &classic, &nodes).await.unwrap();
}

/// Point 4: internet-facing load balancers only go into public subnets (internet-gateway route
/// via the subnet's own table, else the main table); untagged subnets count; in a VPC without
/// an internet-gateway route the internet-facing one is refused and nothing is created;
/// internal ones take private subnets.
#[tokio::test]
async fn subnet_discovery_takes_public_subnets_for_internet_facing_and_refuses_without_igw() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let elb = moto.elb().await;
    let cluster = "subnets";
    // A VPC with no internet gateway: subnet A tagged for the cluster (zone a), subnet B
    // untagged (zone b), subnet C tagged for another cluster (zone b).
    let vpc = ec2.create_vpc().cidr_block("10.1.0.0/16").send().await.unwrap();
    let vpc = vpc.vpc().unwrap().vpc_id().unwrap().to_string();
    let subnet = |cidr: &'static str, az: &'static str, tags: Vec<aws_sdk_ec2::types::Tag>| {
        let ec2 = ec2.clone();
        let vpc = vpc.clone();
        async move {
            let mut req = ec2.create_subnet().vpc_id(vpc).cidr_block(cidr).availability_zone(az);
            if !tags.is_empty() {
                req = req.tag_specifications(tags_for(ResourceType::Subnet, tags));
            }
            req.send().await.unwrap().subnet().unwrap().subnet_id().unwrap().to_string()
        }
    };
    let a =
        subnet("10.1.0.0/24", "us-east-1a", vec![tag("kubernetes.io/cluster/subnets", "shared")])
            .await;
    let b = subnet("10.1.1.0/24", "us-east-1b", vec![]).await;
    let _c = subnet("10.1.2.0/24", "us-east-1b", vec![tag("kubernetes.io/cluster/other", "owned")])
        .await;
    let insts = run_instances(&ec2, &a, cluster, 1, None).await.unwrap();
    let nodes = vec![node(
        insts[0].private_dns_name().unwrap(),
        Some(format!("aws:///us-east-1a/{}", insts[0].instance_id().unwrap())),
    )];
    let (cloud, _) = moto.cloud(cluster, &format!("VPC = {vpc}")).await.unwrap();
    let lbs = cloud.load_balancer().unwrap();

    let public = service("pub", "5a1b2112-0000-4000-8000-000000000000", &[]);
    let err = lbs.ensure_load_balancer(cluster, &public, &nodes).await.unwrap_err();
    println!("no internet gateway: {err}");
    assert!(err.to_string().contains("could not find any suitable subnets"), "{err}");
    assert!(lbs.get_load_balancer(cluster, &public).await.unwrap().is_none());
    let n = service("pubnlb", "5a1b2113-0000-4000-8000-000000000000", &[(TYPE, "nlb")]);
    assert!(lbs.ensure_load_balancer(cluster, &n, &nodes).await.is_err());
    assert!(lbs.get_load_balancer(cluster, &n).await.unwrap().is_none());

    // Internal: private subnets are fine; the untagged one counts; the other cluster's not.
    let internal = service(
        "int",
        "5a1b2114-0000-4000-8000-000000000000",
        &[("service.beta.kubernetes.io/aws-load-balancer-internal", "true")],
    );
    lbs.ensure_load_balancer(cluster, &internal, &nodes).await.unwrap();
    let d = elb
        .describe_load_balancers()
        .load_balancer_names(default_load_balancer_name(&internal))
        .send()
        .await
        .unwrap();
    let mut got: Vec<String> = d.load_balancer_descriptions()[0].subnets().to_vec();
    got.sort();
    let mut want = vec![a.clone(), b.clone()];
    want.sort();
    assert_eq!(got, want, "one per zone; the other cluster's subnet is skipped");

    // An internet gateway routed only from a table associated with subnet B: B is public.
    let igw = ec2.create_internet_gateway().send().await.unwrap();
    let igw = igw.internet_gateway().unwrap().internet_gateway_id().unwrap().to_string();
    ec2.attach_internet_gateway().internet_gateway_id(&igw).vpc_id(&vpc).send().await.unwrap();
    let rt = ec2.create_route_table().vpc_id(&vpc).send().await.unwrap();
    let rt = rt.route_table().unwrap().route_table_id().unwrap().to_string();
    ec2.create_route()
        .route_table_id(&rt)
        .destination_cidr_block("0.0.0.0/0")
        .gateway_id(&igw)
        .send()
        .await
        .unwrap();
    ec2.associate_route_table().route_table_id(&rt).subnet_id(&b).send().await.unwrap();
    lbs.ensure_load_balancer(cluster, &public, &nodes).await.unwrap();
    let d = elb
        .describe_load_balancers()
        .load_balancer_names(default_load_balancer_name(&public))
        .send()
        .await
        .unwrap();
    assert_eq!(d.load_balancer_descriptions()[0].subnets(), std::slice::from_ref(&b));

    // The main table gets the route too: A (via the main table) joins.
    let main = ec2
        .describe_route_tables()
        .filters(Filter::builder().name("vpc-id").values(&vpc).build())
        .filters(Filter::builder().name("association.main").values("true").build())
        .send()
        .await
        .unwrap();
    let main = main.route_tables()[0].route_table_id().unwrap().to_string();
    ec2.create_route()
        .route_table_id(&main)
        .destination_cidr_block("0.0.0.0/0")
        .gateway_id(&igw)
        .send()
        .await
        .unwrap();
    lbs.ensure_load_balancer(cluster, &public, &nodes).await.unwrap();
    let d = elb
        .describe_load_balancers()
        .load_balancer_names(default_load_balancer_name(&public))
        .send()
        .await
        .unwrap();
    let mut got: Vec<String> = d.load_balancer_descriptions()[0].subnets().to_vec();
    got.sort();
    assert_eq!(got, want);
}

/// Point 5: changing `aws-load-balancer-type` on an existing Service is refused with upstream's
/// text and the classic ELB keeps serving; deleting the Service still removes everything.
#[tokio::test]
async fn changing_the_load_balancer_type_is_refused_and_delete_still_cleans_up() {
    let moto = Moto::start().await.unwrap();
    let ec2 = moto.ec2().await;
    let elbv2 = moto.elbv2().await;
    let (_, node_sg, nodes) = world(&moto, "kind", 1).await;
    let (cloud, _) = moto.cloud("kind", "").await.unwrap();
    let lbs = cloud.load_balancer().unwrap();
    let svc = service("kind", "5a1b2115-0000-4000-8000-000000000000", &[]);
    let status = lbs.ensure_load_balancer("kind", &svc, &nodes).await.unwrap();
    let name = default_load_balancer_name(&svc);

    let as_nlb = with(&svc, &[(TYPE, "nlb")]);
    let err = lbs.ensure_load_balancer("kind", &as_nlb, &nodes).await.unwrap_err();
    println!("type change: {err}");
    assert!(err.to_string().contains("cannot update Load Balancer Type annotation after creation"));
    assert_eq!(lbs.get_load_balancer("kind", &as_nlb).await.unwrap(), Some(status.clone()));
    assert!(elbv2.describe_load_balancers().send().await.unwrap().load_balancers().is_empty());
    assert!(elbv2.describe_target_groups().send().await.unwrap().target_groups().is_empty());
    assert!(lbs.update_load_balancer("kind", &as_nlb, &nodes).await.is_err());

    // Delete with the changed annotation: the classic ELB, its group and node rule go.
    let elb_sg = sg_named(&ec2, &format!("k8s-elb-{name}")).await.unwrap();
    lbs.ensure_load_balancer_deleted("kind", &as_nlb).await.unwrap();
    assert!(lbs.get_load_balancer("kind", &as_nlb).await.unwrap().is_none());
    assert!(sg_named(&ec2, &format!("k8s-elb-{name}")).await.is_none());
    assert!(!rules(&ec2, &node_sg).await.iter().any(|r| r.3 == elb_sg));

    // And the other way round: an NLB stays an NLB.
    let n = service("kind2", "5a1b2116-0000-4000-8000-000000000000", &[(TYPE, "nlb")]);
    lbs.ensure_load_balancer("kind", &n, &nodes).await.unwrap();
    let back = without(&n, &[TYPE]);
    let err = lbs.ensure_load_balancer("kind", &back, &nodes).await.unwrap_err();
    assert!(err.to_string().contains("cannot update Load Balancer Type annotation after creation"));
    assert!(sg_named(&ec2, &format!("k8s-elb-{}", default_load_balancer_name(&n))).await.is_none());
    lbs.ensure_load_balancer_deleted("kind", &back).await.unwrap();
    assert!(elbv2.describe_load_balancers().send().await.unwrap().load_balancers().is_empty());
    assert!(elbv2.describe_target_groups().send().await.unwrap().target_groups().is_empty());
}

/// Point 6 (classic): proxy protocol, cross-zone, draining, idle timeout and access logs follow
/// their annotations, bucket/prefix changes are applied, and removing them resets the defaults.
#[tokio::test]
async fn classic_settings_follow_their_annotations_both_ways() {
    let moto = Moto::start().await.unwrap();
    let elb = moto.elb().await;
    let (_, _, nodes) = world(&moto, "attrs", 1).await;
    let (cloud, _) = moto.cloud("attrs", "").await.unwrap();
    let lbs = cloud.load_balancer().unwrap();
    let keys = [
        ("service.beta.kubernetes.io/aws-load-balancer-proxy-protocol", "*"),
        ("service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled", "true"),
        ("service.beta.kubernetes.io/aws-load-balancer-connection-draining-enabled", "true"),
        ("service.beta.kubernetes.io/aws-load-balancer-connection-draining-timeout", "120"),
        ("service.beta.kubernetes.io/aws-load-balancer-connection-idle-timeout", "300"),
        ("service.beta.kubernetes.io/aws-load-balancer-access-log-enabled", "true"),
        ("service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name", "logs-a"),
        ("service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-prefix", "web"),
    ];
    let svc = service("attrs", "5a1b2117-0000-4000-8000-000000000000", &keys);
    let name = default_load_balancer_name(&svc);
    lbs.ensure_load_balancer("attrs", &svc, &nodes).await.unwrap();
    let attrs = |elb: aws_sdk_elasticloadbalancing::Client, name: String| async move {
        let a =
            elb.describe_load_balancer_attributes().load_balancer_name(&name).send().await.unwrap();
        let a = a.load_balancer_attributes().unwrap().clone();
        (
            a.cross_zone_load_balancing().map(|x| x.enabled()),
            a.connection_draining().map(|x| x.enabled()),
            a.connection_settings().map(|x| x.idle_timeout()),
            a.access_log().map(|x| {
                (
                    x.enabled(),
                    x.s3_bucket_name().unwrap_or_default().to_string(),
                    x.s3_bucket_prefix().unwrap_or_default().to_string(),
                )
            }),
        )
    };
    let proxied = |elb: aws_sdk_elasticloadbalancing::Client, name: String| async move {
        let d = elb.describe_load_balancers().load_balancer_names(&name).send().await.unwrap();
        let mut ports: Vec<i32> = d.load_balancer_descriptions()[0]
            .backend_server_descriptions()
            .iter()
            .filter(|b| b.policy_names().iter().any(|p| p == "k8s-proxyprotocol-enabled"))
            .filter_map(|b| b.instance_port())
            .collect();
        ports.sort();
        ports
    };
    let got = attrs(elb.clone(), name.clone()).await;
    assert_eq!(got.0, Some(true));
    assert_eq!(got.1, Some(true));
    assert_eq!(got.2, Some(300));
    assert_eq!(got.3, Some((true, "logs-a".into(), "web".into())));
    assert_eq!(proxied(elb.clone(), name.clone()).await, vec![30080, 30443]);

    // A new bucket and prefix are applied.
    let moved = with(
        &svc,
        &[
            ("service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name", "logs-b"),
            ("service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-prefix", "api"),
        ],
    );
    lbs.update_load_balancer("attrs", &moved, &nodes).await.unwrap();
    assert_eq!(
        attrs(elb.clone(), name.clone()).await.3,
        Some((true, "logs-b".into(), "api".into()))
    );

    // Every annotation removed: upstream's defaults.
    let bare = without(&moved, &keys.iter().map(|(k, _)| *k).collect::<Vec<_>>());
    lbs.update_load_balancer("attrs", &bare, &nodes).await.unwrap();
    let got = attrs(elb.clone(), name.clone()).await;
    assert_eq!(got.0, Some(false));
    assert_eq!(got.1, Some(false));
    assert_eq!(got.2, Some(60));
    assert_eq!(got.3.map(|l| l.0), Some(false));
    assert!(proxied(elb.clone(), name.clone()).await.is_empty(), "proxy protocol removed");
}

/// Point 6 (NLB): access logs and cross-zone are load-balancer attributes that follow the
/// annotations, and go back to off when the annotations are removed.
#[tokio::test]
async fn nlb_access_logs_and_cross_zone_follow_their_annotations() {
    let moto = Moto::start().await.unwrap();
    let elbv2 = moto.elbv2().await;
    let (_, _, nodes) = world(&moto, "nlbattrs", 1).await;
    let (cloud, _) = moto.cloud("nlbattrs", "").await.unwrap();
    let lbs = cloud.load_balancer().unwrap();
    let keys = [
        ("service.beta.kubernetes.io/aws-load-balancer-cross-zone-load-balancing-enabled", "true"),
        ("service.beta.kubernetes.io/aws-load-balancer-access-log-enabled", "true"),
        ("service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-name", "nlb-logs"),
        ("service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-prefix", "p1"),
    ];
    let mut all = vec![(TYPE, "nlb")];
    all.extend(keys);
    let svc = service("nlbattrs", "5a1b2118-0000-4000-8000-000000000000", &all);
    lbs.ensure_load_balancer("nlbattrs", &svc, &nodes).await.unwrap();
    let arn = nlb_arn(&elbv2, &default_load_balancer_name(&svc)).await;
    let a = nlb_attributes(&elbv2, &arn).await;
    println!("NLB attributes: {a:?}");
    assert_eq!(a.get("load_balancing.cross_zone.enabled").map(String::as_str), Some("true"));
    assert_eq!(a.get("access_logs.s3.enabled").map(String::as_str), Some("true"));
    assert_eq!(a.get("access_logs.s3.bucket").map(String::as_str), Some("nlb-logs"));
    assert_eq!(a.get("access_logs.s3.prefix").map(String::as_str), Some("p1"));

    let p2 = with(
        &svc,
        &[("service.beta.kubernetes.io/aws-load-balancer-access-log-s3-bucket-prefix", "p2")],
    );
    lbs.update_load_balancer("nlbattrs", &p2, &nodes).await.unwrap();
    let a = nlb_attributes(&elbv2, &arn).await;
    assert_eq!(a.get("access_logs.s3.prefix").map(String::as_str), Some("p2"));

    let bare = without(&p2, &keys.iter().map(|(k, _)| *k).collect::<Vec<_>>());
    lbs.update_load_balancer("nlbattrs", &bare, &nodes).await.unwrap();
    let a = nlb_attributes(&elbv2, &arn).await;
    assert_eq!(a.get("load_balancing.cross_zone.enabled").map(String::as_str), Some("false"));
    assert_eq!(a.get("access_logs.s3.enabled").map(String::as_str), Some("false"));
}

/// Point 7: `backend-protocol: https` or `ssl` on ports without a certificate gives TCP
/// listeners (upstream), not a CreateLoadBalancer that fails for want of a certificate.
#[tokio::test]
async fn classic_https_or_ssl_backend_without_certificate_is_tcp() {
    let moto = Moto::start().await.unwrap();
    let elb = moto.elb().await;
    let (_, _, nodes) = world(&moto, "bp", 1).await;
    let (cloud, _) = moto.cloud("bp", "").await.unwrap();
    let lbs = cloud.load_balancer().unwrap();
    for (i, proto) in ["https", "ssl"].iter().enumerate() {
        let svc = service(
            &format!("bp{i}"),
            &format!("5a1b212{i}-0000-4000-8000-000000000000"),
            &[("service.beta.kubernetes.io/aws-load-balancer-backend-protocol", proto)],
        );
        lbs.ensure_load_balancer("bp", &svc, &nodes).await.unwrap();
        let d = elb
            .describe_load_balancers()
            .load_balancer_names(default_load_balancer_name(&svc))
            .send()
            .await
            .unwrap();
        for l in d.load_balancer_descriptions()[0].listener_descriptions() {
            let l = l.listener().unwrap();
            assert_eq!(l.protocol().to_ascii_uppercase(), "TCP", "{proto}: {l:?}");
            assert_eq!(l.instance_protocol().map(str::to_ascii_uppercase).as_deref(), Some("TCP"));
        }
    }
}
