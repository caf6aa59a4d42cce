//! The conformance harness for AWS: moto with a tagged VPC, a node security group, a tagged
//! route table and instances in two zones, behind the fault proxy (`Protocol::AwsQuery`);
//! `cloud-controller-manager-aws` talks to the proxy, the harness reads and changes the
//! world directly in moto.

use std::collections::BTreeMap;

use ccm_emulators::Admin;
use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
use ccm_provider_aws::testing::aws_sdk_ec2::types::{DomainType, Filter, ResourceType};
use ccm_provider_aws::testing::aws_sdk_elasticloadbalancing::types::{Listener, Tag as ElbTag};
use ccm_provider_aws::testing::{
    self, REGION, aws_sdk_ec2, aws_sdk_elasticloadbalancing, aws_sdk_elasticloadbalancingv2,
    network, node_security_group, run_instances, tag, tags_for,
};
use ccm_testbed::moto::Moto;

use k8s_openapi::api::core::v1::Service;

use super::{Attack, Foreign, Harness, Instance, LbView};
use crate::support::Binary;

const CLUSTER: &str = "conformance";

pub struct Aws {
    _moto: Moto,
    proxy: FaultProxy,
    ec2: aws_sdk_ec2::Client,
    elb: aws_sdk_elasticloadbalancing::Client,
    elbv2: aws_sdk_elasticloadbalancingv2::Client,
    vpc: String,
    subnets: Vec<String>,
    node_sg: String,
    route_table: String,
    instances: Vec<Instance>,
}

impl Harness for Aws {
    const PROVIDER: &'static str = "aws";
    const BINARY: Binary = crate::support::AWS_BIN;
    const LOAD_BALANCERS: bool = true;
    const ROUTES: bool = true;
    const INSTANCE_LOOKUPS: &'static [&'static str] = &["ec2:DescribeInstances"];

    async fn start(count: usize) -> Self {
        let moto = Moto::start().await.unwrap();
        let proxy =
            FaultProxy::start(Url::parse(&moto.url).unwrap(), Protocol::AwsQuery).await.unwrap();
        // The world is made and read directly in moto: the proxy counts only the manager.
        let ec2 = testing::ec2(&moto.url).await;
        let elb = testing::elb(&moto.url).await;
        let elbv2 = testing::elbv2(&moto.url).await;
        let net = network(&ec2, CLUSTER).await.unwrap();
        let sg = node_security_group(&ec2, &net.vpc, CLUSTER).await.unwrap();
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
        let route_table = rt.route_table().unwrap().route_table_id().unwrap().to_string();
        // Alternate zones: instance i in zone i % 2.
        let mut per_zone = Vec::new();
        for (z, (subnet, _)) in net.subnets.iter().take(2).enumerate() {
            let n = (count + 1 - z) / 2;
            per_zone.push(if n == 0 {
                Vec::new()
            } else {
                run_instances(&ec2, subnet, CLUSTER, n as i32, Some(&sg)).await.unwrap()
            });
        }
        let mut raw = Vec::new();
        for i in 0..count {
            let zone = &per_zone[i % 2];
            raw.push(zone[i / 2].clone());
        }
        let instances = raw
            .iter()
            .map(|i| {
                let id = i.instance_id().unwrap().to_string();
                let dns = i.private_dns_name().unwrap().to_string();
                let ip = i.private_ip_address().unwrap().to_string();
                let az = i.placement().unwrap().availability_zone().unwrap().to_string();
                let mut addresses = vec![("InternalIP".to_string(), ip.clone())];
                if let Some(p) = i.public_ip_address() {
                    addresses.push(("ExternalIP".into(), p.into()));
                }
                addresses.push(("InternalDNS".into(), dns.clone()));
                addresses.push(("Hostname".into(), dns.clone()));
                if let Some(p) = i.public_dns_name().filter(|p| !p.is_empty()) {
                    addresses.push(("ExternalDNS".into(), p.into()));
                }
                Instance {
                    node: dns,
                    ip,
                    provider_id: format!("aws:///{az}/{id}"),
                    id,
                    addresses,
                    zone: az,
                    region: REGION.into(),
                    instance_type_prefix: "m5.large".into(),
                }
            })
            .collect();
        let subnets = net.subnets.iter().map(|(s, _)| s.clone()).collect();
        Aws {
            _moto: moto,
            proxy,
            ec2,
            elb,
            elbv2,
            vpc: net.vpc,
            subnets,
            node_sg: sg,
            route_table,
            instances,
        }
    }

    fn instances(&self) -> &[Instance] {
        &self.instances
    }

    fn cloud_config(&self) -> String {
        testing::cloud_config(&self.proxy.url(), CLUSTER, "")
    }

    fn args(&self, routes: bool) -> Vec<String> {
        if routes {
            vec!["--cluster-cidr=100.64.0.0/16".into(), "--configure-cloud-routes=true".into()]
        } else {
            // As upstream's AWS manifests: no cloud routes.
            vec!["--configure-cloud-routes=false".into()]
        }
    }

    fn admin(&self) -> Admin {
        self.proxy.admin()
    }

    /// AWS has no long-running operations the manager waits on (ELB and EC2 calls answer
    /// when done; an NLB's `provisioning` state is not waited for): its slowness is the
    /// API's own latency, here 1 s on every ELB call and 300 ms on every EC2 call (the proxy's
    /// `latency` fault), the slow end of what those APIs answer in.
    async fn slow_cloud(&self) -> Option<std::time::Duration> {
        let admin = self.proxy.admin();
        for (ops, ms) in [("elasticloadbalancing:*", 1000), ("ec2:*", 300)] {
            admin
                .inject(ccm_emulators::FaultRule::new(ops, ccm_emulators::Fault::Latency { ms }))
                .await
                .unwrap();
        }
        Some(std::time::Duration::from_secs(1))
    }

    async fn power_off(&self, i: usize) {
        self.ec2.stop_instances().instance_ids(&self.instances[i].id).send().await.unwrap();
    }

    async fn power_on(&self, i: usize) {
        self.ec2.start_instances().instance_ids(&self.instances[i].id).send().await.unwrap();
    }

    async fn delete(&self, i: usize) {
        self.ec2.terminate_instances().instance_ids(&self.instances[i].id).send().await.unwrap();
    }

    async fn load_balancer(&self, name: &str) -> Option<LbView> {
        let d = self.elb.describe_load_balancers().send().await.ok()?;
        if let Some(lb) =
            d.load_balancer_descriptions().iter().find(|l| l.load_balancer_name() == Some(name))
        {
            let mut ports: Vec<i32> = lb
                .listener_descriptions()
                .iter()
                .filter_map(|l| l.listener())
                .map(|l| l.load_balancer_port())
                .collect();
            ports.sort();
            let mut instances: Vec<String> =
                lb.instances().iter().filter_map(|i| i.instance_id()).map(str::to_string).collect();
            instances.sort();
            return Some(LbView { ports, instances });
        }
        None
    }

    async fn load_balancer_resources(&self) -> Vec<String> {
        let mut out = Vec::new();
        let d = self.elb.describe_load_balancers().send().await.unwrap();
        for lb in d.load_balancer_descriptions() {
            let listeners: Vec<String> = lb
                .listener_descriptions()
                .iter()
                .filter_map(|l| l.listener())
                .map(|l| format!("{}->{}", l.load_balancer_port(), l.instance_port()))
                .collect();
            out.push(format!(
                "classic ELB {}|{listeners:?}",
                lb.load_balancer_name().unwrap_or_default()
            ));
        }
        let d = self.elbv2.describe_load_balancers().send().await.unwrap();
        for lb in d.load_balancers() {
            out.push(format!("ELBv2 {}", lb.load_balancer_name().unwrap_or_default()));
        }
        let d = self.elbv2.describe_target_groups().send().await.unwrap();
        for tg in d.target_groups() {
            out.push(format!("target group {}", tg.target_group_name().unwrap_or_default()));
        }
        let d = self
            .ec2
            .describe_security_groups()
            .filters(Filter::builder().name("vpc-id").values(&self.vpc).build())
            .send()
            .await
            .unwrap();
        for g in d.security_groups() {
            let name = g.group_name().unwrap_or_default();
            if name.starts_with("k8s-elb-") {
                out.push(format!("security group {name}"));
            }
        }
        // No node group rule may still admit a load balancer's group.
        for g in d.security_groups() {
            for p in g.ip_permissions() {
                // (A group admitting itself, as VPC default groups do, is not ours.)
                for pair in p.user_id_group_pairs().iter().filter(|x| x.group_id() != g.group_id())
                {
                    out.push(format!(
                        "ingress rule on {} from {}",
                        g.group_name().unwrap_or_default(),
                        pair.group_id().unwrap_or_default()
                    ));
                }
            }
        }
        out
    }

    /// Another cluster's classic ELB and its security group (named and tagged as upstream's
    /// CCM of cluster `othercluster` makes them), a hand-made ELB with its own security
    /// group, and a hand-made Elastic IP.
    async fn plant_foreign(&self) -> Foreign {
        let other = "a0f1e2d3c4b5a69788796a5b4c3d2e1f";
        let owned = "kubernetes.io/cluster/othercluster";
        let other_sg = self.plant_sg(&format!("k8s-elb-{other}"), vec![tag(owned, "owned")]).await;
        let other_dns = self
            .plant_elb(
                other,
                &other_sg,
                &[(owned, "owned"), ("kubernetes.io/service-name", "tenant-a/victim")],
            )
            .await;
        let hand_sg = self.plant_sg("shop-frontend", Vec::new()).await;
        let hand_dns = self.plant_elb("shop-frontend", &hand_sg, &[]).await;
        let eip = self.ec2.allocate_address().domain(DomainType::Vpc).send().await.unwrap();
        let ids = [
            ("other_sg", other_sg),
            ("hand_sg", hand_sg),
            ("eip", eip.allocation_id().unwrap().to_string()),
        ];
        Foreign {
            // The hand-made Elastic IP is unattached: a Service naming it may use it (never
            // change, release or delete it).
            addresses: vec![other_dns, hand_dns],
            ids: ids.into_iter().map(|(k, v)| (k.to_string(), v)).collect(),
        }
    }

    async fn attacks(&self, _victim: &Service, victim_lb: &str, f: &Foreign) -> Vec<Attack> {
        let d =
            self.elb.describe_load_balancers().load_balancer_names(victim_lb).send().await.unwrap();
        let victim_sg = d.load_balancer_descriptions()[0]
            .security_groups()
            .first()
            .cloned()
            .unwrap_or_default();
        let subnet = self.subnets[0].as_str();
        vec![
            Attack::annotations(
                "security-groups: the victim's ELB group",
                &[(SECURITY_GROUPS, victim_sg.as_str())],
            ),
            Attack::annotations(
                "security-groups: another cluster's ELB group",
                &[(SECURITY_GROUPS, f.id("other_sg"))],
            ),
            Attack::annotations(
                "security-groups: a hand-made group",
                &[(SECURITY_GROUPS, f.id("hand_sg"))],
            ),
            Attack::annotations(
                "security-groups: the nodes' group",
                &[(SECURITY_GROUPS, self.node_sg.as_str())],
            ),
            Attack::annotations(
                "extra-security-groups: the victim's and another cluster's",
                &[(EXTRA_SECURITY_GROUPS, format!("{victim_sg},{}", f.id("other_sg")).as_str())],
            ),
            Attack::annotations(
                "extra-security-groups: a hand-made group",
                &[(EXTRA_SECURITY_GROUPS, f.id("hand_sg"))],
            ),
            Attack::annotations(
                "NLB with a hand-made Elastic IP allocation",
                &[(TYPE, "nlb"), (SUBNETS, subnet), (EIP_ALLOCATIONS, f.id("eip"))],
            ),
            Attack::annotations("subnets: the victim's subnet", &[(SUBNETS, subnet)]),
        ]
    }

    /// Every classic ELB (with its tags), ELBv2 load balancer, listener and target group,
    /// every security group of the VPC but the nodes' (whose rules each Service's load
    /// balancer adds to) and every Elastic IP, whole, as moto describes them.
    async fn lb_snapshot(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let d = self.elb.describe_load_balancers().send().await.unwrap();
        for lb in d.load_balancer_descriptions() {
            let name = lb.load_balancer_name().unwrap_or_default();
            let tags = self.elb.describe_tags().load_balancer_names(name).send().await.unwrap();
            out.insert(
                format!("classic ELB {name}"),
                format!("{lb:?} {:?}", tags.tag_descriptions()),
            );
        }
        let d = self.elbv2.describe_load_balancers().send().await.unwrap();
        for lb in d.load_balancers() {
            let arn = lb.load_balancer_arn().unwrap_or_default();
            out.insert(format!("ELBv2 {arn}"), format!("{lb:?}"));
            let l = self.elbv2.describe_listeners().load_balancer_arn(arn).send().await.unwrap();
            for x in l.listeners() {
                out.insert(
                    format!("listener {}", x.listener_arn().unwrap_or_default()),
                    format!("{x:?}"),
                );
            }
        }
        let d = self.elbv2.describe_target_groups().send().await.unwrap();
        for tg in d.target_groups() {
            out.insert(
                format!("target group {}", tg.target_group_arn().unwrap_or_default()),
                format!("{tg:?}"),
            );
        }
        let d = self
            .ec2
            .describe_security_groups()
            .filters(Filter::builder().name("vpc-id").values(&self.vpc).build())
            .send()
            .await
            .unwrap();
        for g in d.security_groups() {
            let id = g.group_id().unwrap_or_default();
            if id != self.node_sg {
                out.insert(format!("security group {id}"), format!("{g:?}"));
                continue;
            }
            // The nodes' group: each rule its own entry (other load balancers add theirs).
            for p in g.ip_permissions() {
                let range = format!(
                    "{} {:?}-{:?}",
                    p.ip_protocol().unwrap_or_default(),
                    p.from_port(),
                    p.to_port()
                );
                for pair in p.user_id_group_pairs() {
                    let from = pair.group_id().unwrap_or_default();
                    out.insert(format!("nodes' group rule {range} from {from}"), String::new());
                }
                for r in p.ip_ranges() {
                    let from = r.cidr_ip().unwrap_or_default();
                    out.insert(format!("nodes' group rule {range} from {from}"), String::new());
                }
            }
        }
        let d = self.ec2.describe_addresses().send().await.unwrap();
        for a in d.addresses() {
            out.insert(
                format!("Elastic IP {}", a.allocation_id().unwrap_or_default()),
                format!("{a:?}"),
            );
        }
        out
    }

    async fn routes(&self) -> Vec<(String, String)> {
        let d = self
            .ec2
            .describe_route_tables()
            .route_table_ids(&self.route_table)
            .send()
            .await
            .unwrap();
        d.route_tables()[0]
            .routes()
            .iter()
            .filter_map(|r| {
                Some((r.destination_cidr_block()?.to_string(), r.instance_id()?.to_string()))
            })
            .collect()
    }
}

/// The annotations of upstream's AWS CCM that name existing resources.
const SECURITY_GROUPS: &str = "service.beta.kubernetes.io/aws-load-balancer-security-groups";
const EXTRA_SECURITY_GROUPS: &str =
    "service.beta.kubernetes.io/aws-load-balancer-extra-security-groups";
const SUBNETS: &str = "service.beta.kubernetes.io/aws-load-balancer-subnets";
const EIP_ALLOCATIONS: &str = "service.beta.kubernetes.io/aws-load-balancer-eip-allocations";
const TYPE: &str = "service.beta.kubernetes.io/aws-load-balancer-type";

impl Aws {
    /// A security group in the cluster's VPC with an ingress rule on 443 from anywhere.
    async fn plant_sg(&self, name: &str, tags: Vec<aws_sdk_ec2::types::Tag>) -> String {
        let mut req =
            self.ec2.create_security_group().group_name(name).description(name).vpc_id(&self.vpc);
        if !tags.is_empty() {
            req = req.tag_specifications(tags_for(ResourceType::SecurityGroup, tags));
        }
        let id = req.send().await.unwrap().group_id().unwrap().to_string();
        self.ec2
            .authorize_security_group_ingress()
            .group_id(&id)
            .ip_protocol("tcp")
            .from_port(443)
            .to_port(443)
            .cidr_ip("0.0.0.0/0")
            .send()
            .await
            .unwrap();
        id
    }

    /// A classic ELB listening on 443 with node 0 behind it; returns its DNS name.
    async fn plant_elb(&self, name: &str, sg: &str, tags: &[(&str, &str)]) -> String {
        let mut req = self
            .elb
            .create_load_balancer()
            .load_balancer_name(name)
            .listeners(
                Listener::builder()
                    .protocol("TCP")
                    .load_balancer_port(443)
                    .instance_protocol("TCP")
                    .instance_port(30443)
                    .build()
                    .unwrap(),
            )
            .subnets(&self.subnets[0])
            .security_groups(sg);
        for (k, v) in tags {
            req = req.tags(ElbTag::builder().key(*k).value(*v).build().unwrap());
        }
        let dns = req.send().await.unwrap().dns_name().unwrap_or_default().to_string();
        self.elb
            .register_instances_with_load_balancer()
            .load_balancer_name(name)
            .instances(
                aws_sdk_elasticloadbalancing::types::Instance::builder()
                    .instance_id(&self.instances[0].id)
                    .build(),
            )
            .send()
            .await
            .unwrap();
        dns
    }
}

super::scenarios!(Aws);
super::metrics::scenario!(Aws);
