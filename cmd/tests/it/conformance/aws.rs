//! The conformance harness for AWS: moto with a tagged VPC, a node security group, a tagged
//! route table and instances in two zones, behind the fault proxy (`Protocol::AwsQuery`);
//! `cloud-controller-manager-aws` talks to the proxy, the harness reads and changes the
//! world directly in moto.

use ccm_emulators::Admin;
use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
use ccm_provider_aws::testing::aws_sdk_ec2::types::{Filter, ResourceType};
use ccm_provider_aws::testing::{
    self, REGION, aws_sdk_ec2, aws_sdk_elasticloadbalancing, aws_sdk_elasticloadbalancingv2,
    network, node_security_group, run_instances, tag, tags_for,
};
use ccm_testbed::moto::Moto;

use super::{Harness, Instance, LbView};
use crate::support::Binary;

const CLUSTER: &str = "conformance";

pub struct Aws {
    _moto: Moto,
    proxy: FaultProxy,
    ec2: aws_sdk_ec2::Client,
    elb: aws_sdk_elasticloadbalancing::Client,
    elbv2: aws_sdk_elasticloadbalancingv2::Client,
    vpc: String,
    route_table: String,
    instances: Vec<Instance>,
}

impl Harness for Aws {
    const PROVIDER: &'static str = "aws";
    const BINARY: Binary = crate::support::AWS_BIN;
    const LOAD_BALANCERS: bool = true;
    const ROUTES: bool = true;

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
        Aws { _moto: moto, proxy, ec2, elb, elbv2, vpc: net.vpc, route_table, instances }
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

super::scenarios!(Aws);
