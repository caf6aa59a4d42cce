//! NLB: one network load balancer per Service, one instance target group and listener per
//! port, and node security-group rules for client, health-check and path-MTU traffic marked
//! `kubernetes.io/rule/nlb/{client,health,mtu}=<lb name>`.

use std::collections::{BTreeMap, BTreeSet};

use aws_lc_rs::digest;
use aws_sdk_elasticloadbalancingv2::types::{
    Action, ActionTypeEnum, Certificate, LoadBalancer as Nlb, LoadBalancerAttribute,
    LoadBalancerSchemeEnum, LoadBalancerTypeEnum, ProtocolEnum, SubnetMapping, Tag as ElbTag,
    TargetDescription, TargetGroup, TargetGroupAttribute, TargetTypeEnum,
};
use ccm_core::cloud::ProviderError;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service, ServicePort};

use super::annotations::{self, HcPort, L4, LbOptions};
use super::security_groups::{Rule, Source};
use super::{AwsLoadBalancer, instance_ids, service_name, status_for};
use crate::client::{api_error, error_code};
use crate::config::HealthProbeMode;
use crate::tags::SERVICE_NAME_TAG;

/// Prefix of the descriptions marking NLB node rules.
pub const NLB_RULE_PREFIX: &str = "kubernetes.io/rule/nlb/";

fn sanitize(s: &str) -> String {
    s.chars().filter(|c| c.is_ascii_alphanumeric()).collect()
}

fn prefix8(s: &str) -> String {
    sanitize(s).chars().take(8).collect()
}

/// The name prefix of every target group of a Service: `k8s-<ns:8>-<svc:8>-`.
pub fn target_group_prefix(service: &Service) -> String {
    format!(
        "k8s-{}-{}-",
        prefix8(service.metadata.namespace.as_deref().unwrap_or("default")),
        prefix8(service.metadata.name.as_deref().unwrap_or_default())
    )
}

/// Upstream's target-group name, so a cluster migrating from upstream reuses its target
/// groups: `k8s-<ns:8>-<svc:8>-<sha1:10>` (namespace and name stripped to alphanumerics), the
/// SHA-1 taken over the concatenation of the cluster ID, namespace, name, service port, node
/// port, target protocol, target type (`instance`), health-check protocol and interval. Any
/// of those changing gives a new target group.
pub fn target_group_name(
    service: &Service,
    cluster: &str,
    port: &ServicePort,
    target_protocol: &str,
    health_protocol: &str,
    health_interval: i32,
) -> String {
    let input = format!(
        "{cluster}{}{}{}{}{target_protocol}instance{health_protocol}{health_interval}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default(),
        port.port,
        port.node_port.unwrap_or_default()
    );
    let d = digest::digest(&digest::SHA1_FOR_LEGACY_USE_ONLY, input.as_bytes());
    let hex: String = d.as_ref().iter().map(|b| format!("{b:02x}")).collect();
    format!("{}{}", target_group_prefix(service), &hex[..10])
}

/// What one Service port becomes on the NLB.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PortMapping {
    /// Listener port.
    pub port: i32,
    /// Listener protocol: `TCP`, `UDP` or `TLS` (certificate on an ssl port).
    pub frontend: &'static str,
    /// Target-group protocol: `TLS` when the backend protocol is `ssl` on a TLS port.
    pub target: &'static str,
    /// Node port.
    pub node_port: i32,
    /// Certificate ARN (TLS).
    pub certificate: Option<String>,
    /// SSL policy (TLS, from the negotiation-policy annotation).
    pub ssl_policy: Option<String>,
}

/// Listener and target protocols per port, as upstream: a TCP port named by `ssl-ports` (or
/// every TCP port without it) gets a TLS listener with the certificate and the
/// `ssl-negotiation-policy` as its SslPolicy; `backend-protocol: ssl` makes the target TLS.
pub(crate) fn port_mappings(
    service: &Service,
    opts: &LbOptions,
) -> Result<Vec<PortMapping>, ProviderError> {
    let base = match opts.protocol {
        L4::Tcp => "TCP",
        L4::Udp => "UDP",
    };
    let mut out = Vec::new();
    for p in annotations::ports(service)? {
        let tls = base == "TCP" && opts.is_ssl_port(p);
        out.push(PortMapping {
            port: p.port,
            frontend: if tls { "TLS" } else { base },
            target: if tls && opts.backend_protocol.as_deref() == Some("ssl") {
                "TLS"
            } else {
                base
            },
            node_port: p.node_port.unwrap_or_default(),
            certificate: if tls { opts.ssl_cert.clone() } else { None },
            ssl_policy: if tls { opts.ssl_negotiation_policy.clone() } else { None },
        });
    }
    Ok(out)
}

struct TgHealth {
    protocol: String,
    port: String,
    path: Option<String>,
    interval: i32,
    timeout: i32,
    healthy: i32,
    unhealthy: i32,
}

fn tg_health(
    service: &Service,
    opts: &LbOptions,
    mode: HealthProbeMode,
    shared_port: u16,
    shared_path: &str,
) -> TgHealth {
    let spec = service.spec.clone().unwrap_or_default();
    let local = spec.external_traffic_policy.as_deref() == Some("Local")
        && spec.health_check_node_port.unwrap_or(0) > 0;
    // Upstream's defaults: 30 s / 10 s / 3 / 3 for the traffic port, 10 s / 10 s / 2 / 2 for
    // the kube-proxy health-check node port of a `Local` Service.
    let (d_interval, d_timeout, d_threshold) = if local { (10, 10, 2) } else { (30, 10, 3) };
    let (mut protocol, mut port, mut path) = if local {
        (
            "HTTP".to_string(),
            spec.health_check_node_port.unwrap_or_default().to_string(),
            Some("/healthz".to_string()),
        )
    } else if mode == HealthProbeMode::Shared {
        ("HTTP".to_string(), shared_port.to_string(), Some(shared_path.to_string()))
    } else {
        ("TCP".to_string(), "traffic-port".to_string(), None)
    };
    let hc = &opts.health_check;
    if let Some(p) = &hc.protocol {
        protocol = p.clone();
    }
    match hc.port {
        Some(HcPort::TrafficPort) => port = "traffic-port".into(),
        Some(HcPort::Port(p)) => port = p.to_string(),
        None => {}
    }
    if hc.path.is_some() {
        path = hc.path.clone();
    }
    if protocol == "TCP" {
        path = None;
    } else if path.is_none() {
        path = Some("/".into());
    }
    TgHealth {
        protocol,
        port,
        path,
        interval: hc.interval.unwrap_or(d_interval),
        timeout: hc.timeout.unwrap_or(d_timeout),
        healthy: hc.healthy.unwrap_or(d_threshold),
        unhealthy: hc.unhealthy.unwrap_or(d_threshold),
    }
}

impl AwsLoadBalancer {
    pub(crate) async fn describe_nlb(&self, name: &str) -> Result<Option<Nlb>, ProviderError> {
        let elbv2 = &self.clients.get().await?.elbv2;
        match elbv2.describe_load_balancers().names(name).send().await {
            Ok(resp) => Ok(resp.load_balancers().first().cloned()),
            Err(e) if error_code(&e) == Some("LoadBalancerNotFound") => Ok(None),
            Err(e) => Err(api_error(format!("DescribeLoadBalancers (v2) {name}"), e)),
        }
    }

    pub(crate) async fn ensure_nlb(
        &self,
        service: &Service,
        name: &str,
        opts: &LbOptions,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        let g = &self.cfg.global;
        if g.nlb_security_group_mode.eq_ignore_ascii_case("managed") {
            return Err(ProviderError::Invalid {
                what: "NLBSecurityGroupMode".into(),
                message: "Managed is not supported: NLBs are created without security groups and the node security groups admit clients directly; remove NLBSecurityGroupMode from the cloud config".into(),
            });
        }
        let ports = annotations::ports(service)?.to_vec();
        let mappings = port_mappings(service, opts)?;
        let protocol = match opts.protocol {
            L4::Tcp => "TCP",
            L4::Udp => "UDP",
        };
        let health = tg_health(
            service,
            opts,
            g.health_probe_mode,
            g.shared_health_probe_port,
            &g.shared_health_probe_path,
        );
        let instances = self.backend_instances(nodes, opts).await?;
        let vpc = self.vpc_id(&instances)?;
        let subnets = self.subnets(&vpc, opts).await?;
        let addresses = opts.eip_allocations.as_ref().or(opts.private_ipv4.as_ref());
        if let Some(a) = addresses
            && a.len() != subnets.len()
        {
            return Err(ProviderError::Invalid {
                what: annotations::keys::EIP_ALLOCATIONS.into(),
                message: format!(
                    "{} addresses for {} subnets: give one per subnet",
                    a.len(),
                    subnets.len()
                ),
            });
        }
        let tags = self.resource_tags(service, Some(opts));
        let elb_tags: Vec<ElbTag> =
            tags.iter().map(|(k, v)| ElbTag::builder().key(k).value(v).build()).collect();
        let c = self.clients.get().await?;
        let scheme = if opts.internal {
            LoadBalancerSchemeEnum::Internal
        } else {
            LoadBalancerSchemeEnum::InternetFacing
        };

        let mut lb = self.describe_nlb(name).await?;
        if lb.as_ref().is_some_and(|l| l.scheme() != Some(&scheme)) {
            tracing::info!(lb = name, "scheme changed; recreating the NLB");
            self.delete_nlb(service, name).await?;
            lb = None;
        }
        let lb = match lb {
            Some(lb) => {
                c.elbv2
                    .add_tags()
                    .resource_arns(lb.load_balancer_arn().unwrap_or_default())
                    .set_tags(Some(elb_tags.clone()))
                    .send()
                    .await
                    .map_err(|e| api_error(format!("AddTags {name}"), e))?;
                lb
            }
            None => {
                let mut req = c
                    .elbv2
                    .create_load_balancer()
                    .name(name)
                    .r#type(LoadBalancerTypeEnum::Network)
                    .scheme(scheme)
                    .set_tags(Some(elb_tags.clone()));
                req = match addresses {
                    Some(a) => {
                        let mut maps = Vec::new();
                        for (subnet, addr) in subnets.iter().zip(a) {
                            let m = SubnetMapping::builder().subnet_id(subnet);
                            maps.push(
                                if opts.internal {
                                    m.private_ipv4_address(addr)
                                } else {
                                    m.allocation_id(addr)
                                }
                                .build(),
                            );
                        }
                        req.set_subnet_mappings(Some(maps))
                    }
                    None => req.set_subnets(Some(subnets.clone())),
                };
                let resp = req
                    .send()
                    .await
                    .map_err(|e| api_error(format!("CreateLoadBalancer (NLB) {name}"), e))?;
                tracing::info!(lb = name, service = %service_name(service), "created NLB");
                resp.load_balancers().first().cloned().ok_or_else(|| {
                    ProviderError::other(format!(
                        "CreateLoadBalancer {name} returned no load balancer"
                    ))
                })?
            }
        };
        let lb_arn = lb.load_balancer_arn().unwrap_or_default().to_string();

        // Per port: the target group (health check kept in step), its targets, then the
        // listener — so a listener only ever points at a target group that has its targets.
        let cluster = self.tags.cluster_id().unwrap_or_default();
        let listeners = c
            .elbv2
            .describe_listeners()
            .load_balancer_arn(&lb_arn)
            .send()
            .await
            .map_err(|e| api_error(format!("DescribeListeners {name}"), e))?;
        let listeners = listeners.listeners().to_vec();
        let want = instance_ids(&instances);
        let mut desired_tgs: BTreeSet<String> = BTreeSet::new();
        for (p, m) in ports.iter().zip(&mappings) {
            let tg_name =
                target_group_name(service, cluster, p, m.target, &health.protocol, health.interval);
            let tg = self
                .ensure_target_group(&tg_name, m.target, m.node_port, &vpc, &health, &elb_tags)
                .await?;
            let tg_arn = tg.target_group_arn().unwrap_or_default().to_string();
            self.sync_targets(&tg_arn, &tg_name, &want, m.node_port).await?;
            if !opts.target_group_attributes.is_empty() {
                let attrs: Vec<TargetGroupAttribute> = opts
                    .target_group_attributes
                    .iter()
                    .map(|(k, v)| TargetGroupAttribute::builder().key(k).value(v).build())
                    .collect();
                c.elbv2
                    .modify_target_group_attributes()
                    .target_group_arn(&tg_arn)
                    .set_attributes(Some(attrs))
                    .send()
                    .await
                    .map_err(|e| api_error(format!("ModifyTargetGroupAttributes {tg_name}"), e))?;
            }
            let action =
                Action::builder().r#type(ActionTypeEnum::Forward).target_group_arn(&tg_arn).build();
            let certs = m
                .certificate
                .as_ref()
                .map(|arn| vec![Certificate::builder().certificate_arn(arn).build()]);
            match listeners.iter().find(|l| l.port() == Some(p.port)) {
                None => {
                    c.elbv2
                        .create_listener()
                        .load_balancer_arn(&lb_arn)
                        .protocol(ProtocolEnum::from(m.frontend))
                        .port(p.port)
                        .set_certificates(certs)
                        .set_ssl_policy(m.ssl_policy.clone())
                        .default_actions(action)
                        .send()
                        .await
                        .map_err(|e| api_error(format!("CreateListener {name}:{}", p.port), e))?;
                }
                Some(l) => {
                    let have_cert = l.certificates().first().and_then(|c| c.certificate_arn());
                    let same = l.protocol().map(|x| x.as_str()) == Some(m.frontend)
                        && have_cert == m.certificate.as_deref()
                        && (m.frontend != "TLS"
                            || m.ssl_policy.is_none()
                            || l.ssl_policy() == m.ssl_policy.as_deref())
                        && l.default_actions()
                            .iter()
                            .any(|a| a.target_group_arn() == Some(tg_arn.as_str()));
                    if !same {
                        c.elbv2
                            .modify_listener()
                            .listener_arn(l.listener_arn().unwrap_or_default())
                            .protocol(ProtocolEnum::from(m.frontend))
                            .port(p.port)
                            .set_certificates(certs)
                            .set_ssl_policy(m.ssl_policy.clone())
                            .default_actions(action)
                            .send()
                            .await
                            .map_err(|e| {
                                api_error(format!("ModifyListener {name}:{}", p.port), e)
                            })?;
                        tracing::info!(
                            lb = name,
                            port = p.port,
                            protocol = m.frontend,
                            "updated NLB listener"
                        );
                    }
                }
            }
            desired_tgs.insert(tg_arn);
        }
        let desired_ports: BTreeSet<i32> = ports.iter().map(|p| p.port).collect();
        for l in &listeners {
            if l.port().is_some_and(|p| !desired_ports.contains(&p)) {
                c.elbv2
                    .delete_listener()
                    .listener_arn(l.listener_arn().unwrap_or_default())
                    .send()
                    .await
                    .map_err(|e| api_error(format!("DeleteListener {name}:{:?}", l.port()), e))?;
            }
        }
        // Target groups of this Service that no listener uses any more.
        for (arn, tg) in self.service_target_groups(service).await? {
            if !desired_tgs.contains(&arn) {
                self.delete_target_group(&arn, tg.target_group_name().unwrap_or_default()).await?;
            }
        }

        self.ensure_nlb_attributes(name, &lb_arn, opts).await?;

        // Node security groups: clients on the node ports, health checks from the load
        // balancer's subnets, MTU discovery.
        if g.disable_security_group_ingress {
            return Ok(status_for(lb.dns_name()));
        }
        let desired_sgs = self.node_security_groups(&instances).await?;
        let mut rules = Vec::new();
        let proto_lower = protocol.to_ascii_lowercase();
        for net in &opts.source_ranges {
            for p in &ports {
                let np = p.node_port.unwrap_or_default();
                rules.push(Rule {
                    protocol: proto_lower.clone(),
                    from: np,
                    to: np,
                    source: Source::Cidr(net.to_string()),
                    description: Some(format!("{NLB_RULE_PREFIX}client={name}")),
                });
            }
            if net.addr().is_ipv4() {
                rules.push(Rule {
                    protocol: "icmp".into(),
                    from: 3,
                    to: 4,
                    source: Source::Cidr(net.to_string()),
                    description: Some(format!("{NLB_RULE_PREFIX}mtu={name}")),
                });
            }
        }
        let client_ports: BTreeSet<i32> = ports.iter().filter_map(|p| p.node_port).collect();
        let hc_ports: BTreeSet<i32> = if health.port == "traffic-port" {
            client_ports.clone()
        } else {
            health.port.parse().into_iter().collect()
        };
        // As upstream: the health-check rule is only redundant when the client rule already
        // admits everyone over TCP on exactly the health-check ports.
        let open_to_all =
            opts.source_ranges.len() == 1 && opts.source_ranges[0].to_string() == "0.0.0.0/0";
        let needs_health_rule = !(open_to_all && protocol == "TCP" && hc_ports == client_ports);
        if needs_health_rule && !desired_sgs.is_empty() {
            let lb_subnets: Vec<String> = {
                let from_lb: Vec<String> = lb
                    .availability_zones()
                    .iter()
                    .filter_map(|z| z.subnet_id())
                    .map(str::to_string)
                    .collect();
                if from_lb.is_empty() { subnets.clone() } else { from_lb }
            };
            for cidr in self.subnet_cidrs(&lb_subnets).await? {
                for p in &hc_ports {
                    rules.push(Rule {
                        protocol: "tcp".into(),
                        from: *p,
                        to: *p,
                        source: Source::Cidr(cidr.clone()),
                        description: Some(format!("{NLB_RULE_PREFIX}health={name}")),
                    });
                }
            }
        }
        let suffix = format!("={name}");
        self.sync_node_rules(&vpc, &desired_sgs, &rules, move |r| {
            r.description
                .as_deref()
                .is_some_and(|d| d.starts_with(NLB_RULE_PREFIX) && d.ends_with(&suffix))
        })
        .await?;

        Ok(status_for(lb.dns_name()))
    }

    /// The IPv4 CIDRs of `subnets`.
    async fn subnet_cidrs(&self, subnets: &[String]) -> Result<Vec<String>, ProviderError> {
        if subnets.is_empty() {
            return Ok(Vec::new());
        }
        let ec2 = &self.clients.get().await?.ec2;
        let resp = ec2
            .describe_subnets()
            .set_subnet_ids(Some(subnets.to_vec()))
            .send()
            .await
            .map_err(|e| api_error("DescribeSubnets (load balancer subnet CIDRs)", e))?;
        let mut out: Vec<String> =
            resp.subnets().iter().filter_map(|s| s.cidr_block()).map(str::to_string).collect();
        out.sort();
        out.dedup();
        Ok(out)
    }

    /// Registers the missing targets and deregisters the extra ones (registering first, so
    /// a replaced node never leaves the group empty).
    async fn sync_targets(
        &self,
        arn: &str,
        tg_name: &str,
        want: &BTreeSet<String>,
        node_port: i32,
    ) -> Result<(), ProviderError> {
        let c = self.clients.get().await?;
        let health = c
            .elbv2
            .describe_target_health()
            .target_group_arn(arn)
            .send()
            .await
            .map_err(|e| api_error(format!("DescribeTargetHealth {tg_name}"), e))?;
        let have: BTreeSet<(String, i32)> = health
            .target_health_descriptions()
            .iter()
            .filter(|t| {
                t.target_health().and_then(|h| h.reason()).map(|r| r.as_str())
                    != Some("Target.DeregistrationInProgress")
            })
            .filter_map(|t| t.target())
            .filter_map(|t| t.id().map(|id| (id.to_string(), t.port().unwrap_or(node_port))))
            .collect();
        let want: BTreeSet<(String, i32)> = want.iter().map(|id| (id.clone(), node_port)).collect();
        let target =
            |(id, port): &(String, i32)| TargetDescription::builder().id(id).port(*port).build();
        let add: Vec<TargetDescription> = want.difference(&have).map(target).collect();
        let remove: Vec<TargetDescription> = have.difference(&want).map(target).collect();
        for chunk in add.chunks(1000) {
            c.elbv2
                .register_targets()
                .target_group_arn(arn)
                .set_targets(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(|e| api_error(format!("RegisterTargets {tg_name}"), e))?;
        }
        for chunk in remove.chunks(1000) {
            c.elbv2
                .deregister_targets()
                .target_group_arn(arn)
                .set_targets(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(|e| api_error(format!("DeregisterTargets {tg_name}"), e))?;
        }
        Ok(())
    }

    /// NLB attributes as upstream: cross-zone load balancing and S3 access logs follow the
    /// annotations, absent ones reset to off; bucket and prefix are only sent while access
    /// logs are on (the API refuses an empty bucket).
    async fn ensure_nlb_attributes(
        &self,
        name: &str,
        arn: &str,
        opts: &LbOptions,
    ) -> Result<(), ProviderError> {
        let c = self.clients.get().await?;
        let current = c
            .elbv2
            .describe_load_balancer_attributes()
            .load_balancer_arn(arn)
            .send()
            .await
            .map_err(|e| api_error(format!("DescribeLoadBalancerAttributes {name}"), e))?;
        let cur: BTreeMap<&str, &str> = current
            .attributes()
            .iter()
            .filter_map(|a| Some((a.key()?, a.value().unwrap_or_default())))
            .collect();
        let log = opts.access_log.clone().unwrap_or_default();
        let mut want: Vec<(&str, String)> = vec![
            ("load_balancing.cross_zone.enabled", opts.cross_zone.unwrap_or(false).to_string()),
            ("access_logs.s3.enabled", log.enabled.to_string()),
        ];
        if log.enabled {
            want.push(("access_logs.s3.bucket", log.bucket.clone().unwrap_or_default()));
            want.push(("access_logs.s3.prefix", log.prefix.clone().unwrap_or_default()));
        }
        let changed: Vec<LoadBalancerAttribute> = want
            .iter()
            .filter(|(k, v)| {
                let have = cur.get(k).copied().unwrap_or_default();
                // An unset boolean reads as false.
                !(have == v.as_str() || (have.is_empty() && v == "false"))
            })
            .map(|(k, v)| LoadBalancerAttribute::builder().key(*k).value(v).build())
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        c.elbv2
            .modify_load_balancer_attributes()
            .load_balancer_arn(arn)
            .set_attributes(Some(changed))
            .send()
            .await
            .map_err(|e| api_error(format!("ModifyLoadBalancerAttributes {name}"), e))?;
        tracing::info!(lb = name, "updated NLB attributes");
        Ok(())
    }

    /// The target group `tg_name`: created with the health check, or, when it exists, its
    /// health check brought in line (ModifyTargetGroup) — protocol and interval are part of
    /// the name, so only port, path, timeout and thresholds can differ.
    async fn ensure_target_group(
        &self,
        tg_name: &str,
        protocol: &str,
        node_port: i32,
        vpc: &str,
        health: &TgHealth,
        tags: &[ElbTag],
    ) -> Result<TargetGroup, ProviderError> {
        let c = self.clients.get().await?;
        match c.elbv2.describe_target_groups().names(tg_name).send().await {
            Ok(resp) => {
                if let Some(tg) = resp.target_groups().first() {
                    let path_differs =
                        health.path.is_some() && tg.health_check_path() != health.path.as_deref();
                    let differs = tg.health_check_port() != Some(health.port.as_str())
                        || path_differs
                        || tg.health_check_timeout_seconds() != Some(health.timeout)
                        || tg.healthy_threshold_count() != Some(health.healthy)
                        || tg.unhealthy_threshold_count() != Some(health.unhealthy);
                    if !differs {
                        return Ok(tg.clone());
                    }
                    let resp = c
                        .elbv2
                        .modify_target_group()
                        .target_group_arn(tg.target_group_arn().unwrap_or_default())
                        .health_check_port(&health.port)
                        .set_health_check_path(health.path.clone())
                        .health_check_timeout_seconds(health.timeout)
                        .healthy_threshold_count(health.healthy)
                        .unhealthy_threshold_count(health.unhealthy)
                        .send()
                        .await
                        .map_err(|e| api_error(format!("ModifyTargetGroup {tg_name}"), e))?;
                    tracing::info!(target_group = tg_name, "updated target group health check");
                    return Ok(resp.target_groups().first().cloned().unwrap_or_else(|| tg.clone()));
                }
            }
            Err(e) if error_code(&e) == Some("TargetGroupNotFound") => {}
            Err(e) => return Err(api_error(format!("DescribeTargetGroups {tg_name}"), e)),
        }
        let resp = c
            .elbv2
            .create_target_group()
            .name(tg_name)
            .protocol(ProtocolEnum::from(protocol))
            .port(node_port)
            .vpc_id(vpc)
            .target_type(TargetTypeEnum::Instance)
            .health_check_protocol(ProtocolEnum::from(health.protocol.as_str()))
            .health_check_port(&health.port)
            .set_health_check_path(health.path.clone())
            .health_check_interval_seconds(health.interval)
            .health_check_timeout_seconds(health.timeout)
            .healthy_threshold_count(health.healthy)
            .unhealthy_threshold_count(health.unhealthy)
            .set_tags(Some(tags.to_vec()))
            .send()
            .await
            .map_err(|e| api_error(format!("CreateTargetGroup {tg_name}"), e))?;
        tracing::info!(target_group = tg_name, "created target group");
        resp.target_groups().first().cloned().ok_or_else(|| {
            ProviderError::other(format!("CreateTargetGroup {tg_name} returned nothing"))
        })
    }

    /// Target groups created for this Service by this cluster (by name prefix and tags).
    pub(crate) async fn service_target_groups(
        &self,
        service: &Service,
    ) -> Result<Vec<(String, TargetGroup)>, ProviderError> {
        let c = self.clients.get().await?;
        let prefix = target_group_prefix(service);
        let mut candidates = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let resp = c
                .elbv2
                .describe_target_groups()
                .set_marker(marker.take())
                .send()
                .await
                .map_err(|e| api_error("DescribeTargetGroups", e))?;
            for tg in resp.target_groups() {
                if tg.target_group_name().is_some_and(|n| n.starts_with(&prefix))
                    && let Some(arn) = tg.target_group_arn()
                {
                    candidates.push((arn.to_string(), tg.clone()));
                }
            }
            match resp.next_marker() {
                Some(m) if !m.is_empty() => marker = Some(m.to_string()),
                _ => break,
            }
        }
        if candidates.is_empty() {
            return Ok(candidates);
        }
        let svc = service_name(service);
        let mut out = Vec::new();
        for chunk in candidates.chunks(20) {
            let arns: Vec<String> = chunk.iter().map(|(a, _)| a.clone()).collect();
            let tags = c
                .elbv2
                .describe_tags()
                .set_resource_arns(Some(arns))
                .send()
                .await
                .map_err(|e| api_error("DescribeTags (target groups)", e))?;
            for d in tags.tag_descriptions() {
                let kv: Vec<(&str, &str)> = d
                    .tags()
                    .iter()
                    .map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default()))
                    .collect();
                let ours = self.tags.created_kv(kv.iter().copied())
                    && kv.iter().any(|(k, v)| *k == SERVICE_NAME_TAG && *v == svc);
                if ours
                    && let Some(found) =
                        chunk.iter().find(|(a, _)| Some(a.as_str()) == d.resource_arn())
                {
                    out.push(found.clone());
                }
            }
        }
        Ok(out)
    }

    async fn delete_target_group(&self, arn: &str, name: &str) -> Result<(), ProviderError> {
        let c = self.clients.get().await?;
        match c.elbv2.delete_target_group().target_group_arn(arn).send().await {
            Ok(_) => {
                tracing::info!(target_group = name, "deleted target group");
                Ok(())
            }
            Err(e) if error_code(&e) == Some("ResourceInUse") => Err(ProviderError::RetryAfter {
                message: format!("target group {name} is still in use"),
                delay: std::time::Duration::from_secs(10),
            }),
            Err(e) => Err(api_error(format!("DeleteTargetGroup {name}"), e)),
        }
    }

    /// Deletes the NLB, its listeners, the Service's target groups and the node rules marked
    /// with its name.
    pub(crate) async fn delete_nlb(
        &self,
        service: &Service,
        name: &str,
    ) -> Result<(), ProviderError> {
        let c = self.clients.get().await?;
        let lb = self.describe_nlb(name).await?;
        if let Some(lb) = &lb {
            let suffix = format!("={name}");
            let holders = self
                .groups_with_rules(lb.vpc_id(), |r| {
                    r.description
                        .as_deref()
                        .is_some_and(|d| d.starts_with(NLB_RULE_PREFIX) && d.ends_with(&suffix))
                })
                .await?;
            for (sg, rules) in holders {
                self.revoke(&sg, &rules).await?;
            }
            let arn = lb.load_balancer_arn().unwrap_or_default();
            let listeners = c
                .elbv2
                .describe_listeners()
                .load_balancer_arn(arn)
                .send()
                .await
                .map_err(|e| api_error(format!("DescribeListeners {name}"), e))?;
            for l in listeners.listeners() {
                c.elbv2
                    .delete_listener()
                    .listener_arn(l.listener_arn().unwrap_or_default())
                    .send()
                    .await
                    .map_err(|e| api_error(format!("DeleteListener {name}"), e))?;
            }
            c.elbv2
                .delete_load_balancer()
                .load_balancer_arn(arn)
                .send()
                .await
                .map_err(|e| api_error(format!("DeleteLoadBalancer (NLB) {name}"), e))?;
            tracing::info!(lb = name, service = %service_name(service), "deleted NLB");
        }
        for (arn, tg) in self.service_target_groups(service).await? {
            self.delete_target_group(&arn, tg.target_group_name().unwrap_or_default()).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    #[test]
    fn target_group_names_fit_and_are_stable() {
        let svc = Service {
            metadata: ObjectMeta {
                name: Some("my-very-long-service-name".into()),
                namespace: Some("kube-system".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let port = ServicePort { port: 80, node_port: Some(30080), ..Default::default() };
        let a = target_group_name(&svc, "c1", &port, "TCP", "TCP", 30);
        assert!(a.starts_with("k8s-kubesyst-myverylo-"), "{a}");
        assert_eq!(a.len(), "k8s-kubesyst-myverylo-".len() + 10);
        assert!(a.len() <= 32);
        assert_eq!(a, target_group_name(&svc, "c1", &port, "TCP", "TCP", 30));
        let other = ServicePort { node_port: Some(30081), ..port.clone() };
        assert_ne!(a, target_group_name(&svc, "c1", &other, "TCP", "TCP", 30));
        // Health-check protocol and interval are part of the name, as upstream.
        assert_ne!(a, target_group_name(&svc, "c1", &port, "TCP", "HTTP", 30));
        assert_ne!(a, target_group_name(&svc, "c1", &port, "TCP", "TCP", 10));
    }

    #[test]
    fn target_group_name_is_upstreams() {
        // SHA-1 of "c1" "default" "web" "80" "30080" "TCP" "instance" "TCP" "30", concatenated,
        // computed independently (sha1sum) from upstream's recipe.
        let svc = Service {
            metadata: ObjectMeta {
                name: Some("web".into()),
                namespace: Some("default".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        let port = ServicePort { port: 80, node_port: Some(30080), ..Default::default() };
        assert_eq!(
            target_group_name(&svc, "c1", &port, "TCP", "TCP", 30),
            "k8s-default-web-2e7f1b24e2"
        );
    }
}
