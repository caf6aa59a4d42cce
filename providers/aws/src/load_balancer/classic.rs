//! Classic ELB: create/update/delete one load balancer per Service.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aws_sdk_elasticloadbalancing::types::{
    AccessLog, ConnectionDraining, ConnectionSettings, CrossZoneLoadBalancing, HealthCheck,
    Instance as ElbInstance, Listener, LoadBalancerAttributes, LoadBalancerDescription,
    PolicyAttribute, Tag as ElbTag,
};
use ccm_core::cloud::ProviderError;
use k8s_openapi::api::core::v1::{LoadBalancerStatus, Node, Service};

use super::annotations::{self, HcPort, LbOptions};
use super::security_groups::{Rule, Source};
use super::{AwsLoadBalancer, instance_ids, service_name, status_for};
use crate::client::{api_error, error_code};
use crate::config::HealthProbeMode;
use crate::instances::Ec2Instance;

const PROXY_PROTOCOL_POLICY: &str = "k8s-proxyprotocol-enabled";

/// Upstream's name for the policy carrying a predefined SSL negotiation policy.
pub fn ssl_negotiation_policy_name(policy: &str) -> String {
    format!("k8s-SSLNegotiationPolicy-{policy}")
}

/// The classic ELB attributes the annotations ask for, with upstream's defaults.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ClassicAttributes {
    pub cross_zone: bool,
    pub idle_timeout: i32,
    pub draining_enabled: bool,
    pub draining_timeout: Option<i32>,
    pub log: annotations::AccessLog,
}

pub(crate) fn desired_classic_attributes(opts: &LbOptions) -> ClassicAttributes {
    ClassicAttributes {
        cross_zone: opts.cross_zone.unwrap_or(false),
        idle_timeout: opts.idle_timeout.unwrap_or(60),
        draining_enabled: opts.draining_enabled.unwrap_or(false),
        draining_timeout: opts.draining_timeout,
        log: opts.access_log.clone().unwrap_or_default(),
    }
}

/// The name of the security group created for classic ELB `lb_name`.
pub fn elb_security_group_name(lb_name: &str) -> String {
    format!("k8s-elb-{lb_name}")
}

fn build_err(what: &str, e: impl std::fmt::Display) -> ProviderError {
    ProviderError::other(format!("building {what}: {e}"))
}

/// Listeners for the Service's ports (protocols per the ssl-cert/ssl-ports/backend-protocol
/// annotations: a TLS port terminates as HTTPS towards an http backend, else SSL).
pub(crate) fn listeners(
    service: &Service,
    opts: &LbOptions,
) -> Result<Vec<Listener>, ProviderError> {
    let mut out = Vec::new();
    for p in annotations::ports(service)? {
        let bp = opts.backend_protocol.as_deref();
        let (proto, inst, cert) = if opts.is_ssl_port(p) {
            let (proto, inst) = match bp {
                Some("http") => ("HTTPS", "HTTP"),
                Some("https") => ("HTTPS", "HTTPS"),
                Some("ssl") => ("SSL", "SSL"),
                _ => ("SSL", "TCP"),
            };
            (proto, inst, opts.ssl_cert.clone())
        } else {
            // As upstream: without a certificate only `http` changes the protocol; `https` and
            // `ssl` backends on such a port are plain TCP (an HTTPS/SSL listener needs a
            // certificate, and CreateLoadBalancer would fail).
            match bp {
                Some("http") => ("HTTP", "HTTP", None),
                _ => ("TCP", "TCP", None),
            }
        };
        out.push(
            Listener::builder()
                .protocol(proto)
                .load_balancer_port(p.port)
                .instance_protocol(inst)
                .instance_port(p.node_port.unwrap_or_default())
                .set_ssl_certificate_id(cert)
                .build()
                .map_err(|e| build_err("listener", e))?,
        );
    }
    Ok(out)
}

fn listener_key(l: &Listener) -> (i32, String, String, i32, String) {
    (
        l.load_balancer_port(),
        l.protocol().to_ascii_uppercase(),
        l.instance_protocol().unwrap_or_default().to_ascii_uppercase(),
        l.instance_port(),
        l.ssl_certificate_id().unwrap_or_default().to_string(),
    )
}

/// The health check: `Local` traffic policy → HTTP on the health-check node port at
/// `/healthz`; `Cluster` → TCP on the first node port (or the shared kube-proxy probe when
/// configured); annotations override each part.
pub(crate) fn health_check(
    service: &Service,
    opts: &LbOptions,
    mode: HealthProbeMode,
    shared_port: u16,
    shared_path: &str,
) -> Result<HealthCheck, ProviderError> {
    let spec = service.spec.clone().unwrap_or_default();
    let traffic_port =
        annotations::ports(service)?.first().and_then(|p| p.node_port).unwrap_or_default();
    let local = spec.external_traffic_policy.as_deref() == Some("Local")
        && spec.health_check_node_port.unwrap_or(0) > 0;
    let (mut proto, mut port, mut path) = if local {
        (
            "HTTP".to_string(),
            spec.health_check_node_port.unwrap_or_default(),
            "/healthz".to_string(),
        )
    } else if mode == HealthProbeMode::Shared {
        ("HTTP".to_string(), i32::from(shared_port), shared_path.to_string())
    } else {
        ("TCP".to_string(), traffic_port, String::new())
    };
    let hc = &opts.health_check;
    if let Some(p) = &hc.protocol {
        proto = p.clone();
    }
    match hc.port {
        Some(HcPort::TrafficPort) => port = traffic_port,
        Some(HcPort::Port(p)) => port = i32::from(p),
        None => {}
    }
    if let Some(p) = &hc.path {
        path = p.clone();
    }
    let target = match proto.as_str() {
        "HTTP" | "HTTPS" => format!("{proto}:{port}{}", if path.is_empty() { "/" } else { &path }),
        _ => format!("{proto}:{port}"),
    };
    HealthCheck::builder()
        .target(target)
        .interval(hc.interval.unwrap_or(10))
        .timeout(hc.timeout.unwrap_or(5))
        .healthy_threshold(hc.healthy.unwrap_or(2))
        .unhealthy_threshold(hc.unhealthy.unwrap_or(6))
        .build()
        .map_err(|e| build_err("health check", e))
}

/// A classic ELB's backends against the instances it should have.
struct Backends {
    /// Registered now.
    have: BTreeSet<String>,
    /// To register.
    add: Vec<String>,
    /// To deregister.
    remove: Vec<String>,
}

impl Backends {
    fn of(lb: &LoadBalancerDescription, instances: &[Arc<Ec2Instance>]) -> Self {
        let want = instance_ids(instances);
        let have: BTreeSet<String> =
            lb.instances().iter().filter_map(|i| i.instance_id()).map(str::to_string).collect();
        let add = want.difference(&have).cloned().collect();
        let remove = have.difference(&want).cloned().collect();
        Backends { have, add, remove }
    }
}

impl AwsLoadBalancer {
    pub(crate) async fn describe_classic(
        &self,
        name: &str,
    ) -> Result<Option<LoadBalancerDescription>, ProviderError> {
        let elb = &self.clients.get().await?.elb;
        match elb.describe_load_balancers().load_balancer_names(name).send().await {
            Ok(resp) => Ok(resp.load_balancer_descriptions().first().cloned()),
            Err(e)
                if matches!(
                    error_code(&e),
                    Some("LoadBalancerNotFound") | Some("AccessPointNotFound")
                ) =>
            {
                Ok(None)
            }
            Err(e) => Err(api_error(format!("DescribeLoadBalancers {name}"), e)),
        }
    }

    pub(crate) async fn ensure_classic(
        &self,
        service: &Service,
        name: &str,
        opts: &LbOptions,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        // Everything that can be computed without the cloud first.
        let listeners = listeners(service, opts)?;
        let g = &self.cfg.global;
        let hc = health_check(
            service,
            opts,
            g.health_probe_mode,
            g.shared_health_probe_port,
            &g.shared_health_probe_path,
        )?;
        let ports = annotations::ports(service)?.to_vec();

        let instances = self.backend_instances(nodes, opts).await?;
        let vpc = self.vpc_id(&instances)?;
        let subnets = self.subnets(&vpc, opts).await?;
        let tags = self.resource_tags(service, Some(opts));

        // Security groups: annotation, else config, else our own k8s-elb-<name>.
        let mut own_sg: Option<String> = None;
        let mut sgs: Vec<String> = match (&opts.security_groups, g.elb_security_group.as_str()) {
            (Some(list), _) => list.clone(),
            (None, sg) if !sg.is_empty() => vec![sg.to_string()],
            _ => {
                let sg_name = elb_security_group_name(name);
                let desc =
                    format!("Security group for Kubernetes ELB {name} ({})", service_name(service));
                let sg = self.ensure_sg(&sg_name, &desc, &vpc, &tags).await?;
                let id = sg.group_id().unwrap_or_default().to_string();
                if self.sg_is_ours(&sg) {
                    let mut rules = Vec::new();
                    for net in &opts.source_ranges {
                        let cidr = net.to_string();
                        for p in &ports {
                            rules.push(Rule {
                                protocol: "tcp".into(),
                                from: p.port,
                                to: p.port,
                                source: Source::Cidr(cidr.clone()),
                                description: None,
                            });
                        }
                        // Path MTU discovery (ICMP "fragmentation needed").
                        if net.addr().is_ipv4() {
                            rules.push(Rule {
                                protocol: "icmp".into(),
                                from: 3,
                                to: 4,
                                source: Source::Cidr(cidr),
                                description: None,
                            });
                        }
                    }
                    self.sync_ingress(&sg, &rules).await?;
                    own_sg = Some(id.clone());
                }
                vec![id]
            }
        };
        for extra in &opts.extra_security_groups {
            if !sgs.contains(extra) {
                sgs.push(extra.clone());
            }
        }

        let c = self.clients.get().await?;
        let scheme = if opts.internal { "internal" } else { "internet-facing" };
        let mut existing = self.describe_classic(name).await?;
        if let Some(lb) = &existing
            && lb.scheme().is_some_and(|s| s != scheme)
        {
            tracing::info!(lb = name, "scheme changed; recreating the load balancer");
            c.elb
                .delete_load_balancer()
                .load_balancer_name(name)
                .send()
                .await
                .map_err(|e| api_error(format!("DeleteLoadBalancer {name} (scheme change)"), e))?;
            existing = None;
        }
        let elb_tags = || -> Result<Vec<ElbTag>, ProviderError> {
            tags.iter()
                .map(|(k, v)| {
                    ElbTag::builder().key(k).value(v).build().map_err(|e| build_err("tag", e))
                })
                .collect()
        };
        let lb = match existing {
            None => {
                let mut req = c
                    .elb
                    .create_load_balancer()
                    .load_balancer_name(name)
                    .set_listeners(Some(listeners.clone()))
                    .set_subnets(Some(subnets.clone()))
                    .set_security_groups(Some(sgs.clone()))
                    .set_tags(Some(elb_tags()?));
                if opts.internal {
                    req = req.scheme("internal");
                }
                req.send().await.map_err(|e| api_error(format!("CreateLoadBalancer {name}"), e))?;
                tracing::info!(lb = name, service = %service_name(service), "created classic load balancer");
                self.describe_classic(name).await?.ok_or_else(|| {
                    ProviderError::other(format!("load balancer {name} not found after creation"))
                })?
            }
            Some(lb) => {
                // Listeners: delete changed/removed ports, create new/changed ones.
                let want: BTreeMap<i32, &Listener> =
                    listeners.iter().map(|l| (l.load_balancer_port(), l)).collect();
                let have: Vec<&Listener> =
                    lb.listener_descriptions().iter().filter_map(|d| d.listener()).collect();
                let stale: Vec<i32> = have
                    .iter()
                    .filter(|h| {
                        want.get(&h.load_balancer_port())
                            .is_none_or(|w| listener_key(w) != listener_key(h))
                    })
                    .map(|h| h.load_balancer_port())
                    .collect();
                let have_keys: BTreeSet<_> = have.iter().map(|h| listener_key(h)).collect();
                let new: Vec<Listener> = listeners
                    .iter()
                    .filter(|l| !have_keys.contains(&listener_key(l)))
                    .cloned()
                    .collect();
                if !stale.is_empty() {
                    c.elb
                        .delete_load_balancer_listeners()
                        .load_balancer_name(name)
                        .set_load_balancer_ports(Some(stale))
                        .send()
                        .await
                        .map_err(|e| api_error(format!("DeleteLoadBalancerListeners {name}"), e))?;
                }
                if !new.is_empty() {
                    c.elb
                        .create_load_balancer_listeners()
                        .load_balancer_name(name)
                        .set_listeners(Some(new))
                        .send()
                        .await
                        .map_err(|e| api_error(format!("CreateLoadBalancerListeners {name}"), e))?;
                }
                // Subnets.
                let have: BTreeSet<&str> = lb.subnets().iter().map(String::as_str).collect();
                let want: BTreeSet<&str> = subnets.iter().map(String::as_str).collect();
                let attach: Vec<String> = want.difference(&have).map(|s| s.to_string()).collect();
                let detach: Vec<String> = have.difference(&want).map(|s| s.to_string()).collect();
                if !attach.is_empty() {
                    c.elb
                        .attach_load_balancer_to_subnets()
                        .load_balancer_name(name)
                        .set_subnets(Some(attach))
                        .send()
                        .await
                        .map_err(|e| api_error(format!("AttachLoadBalancerToSubnets {name}"), e))?;
                }
                if !detach.is_empty() {
                    c.elb
                        .detach_load_balancer_from_subnets()
                        .load_balancer_name(name)
                        .set_subnets(Some(detach))
                        .send()
                        .await
                        .map_err(|e| {
                            api_error(format!("DetachLoadBalancerFromSubnets {name}"), e)
                        })?;
                }
                // Security groups.
                let have: BTreeSet<&str> =
                    lb.security_groups().iter().map(String::as_str).collect();
                let want: BTreeSet<&str> = sgs.iter().map(String::as_str).collect();
                if have != want {
                    c.elb
                        .apply_security_groups_to_load_balancer()
                        .load_balancer_name(name)
                        .set_security_groups(Some(sgs.clone()))
                        .send()
                        .await
                        .map_err(|e| {
                            api_error(format!("ApplySecurityGroupsToLoadBalancer {name}"), e)
                        })?;
                }
                // Tags (added, never removed: a user may have tagged it too).
                c.elb
                    .add_tags()
                    .load_balancer_names(name)
                    .set_tags(Some(elb_tags()?))
                    .send()
                    .await
                    .map_err(|e| api_error(format!("AddTags {name}"), e))?;
                lb
            }
        };

        // Health check.
        let same_hc = lb.health_check().is_some_and(|h| {
            (h.target(), h.interval(), h.timeout(), h.healthy_threshold(), h.unhealthy_threshold())
                == (
                    hc.target(),
                    hc.interval(),
                    hc.timeout(),
                    hc.healthy_threshold(),
                    hc.unhealthy_threshold(),
                )
        });
        if !same_hc {
            c.elb
                .configure_health_check()
                .load_balancer_name(name)
                .health_check(hc)
                .send()
                .await
                .map_err(|e| api_error(format!("ConfigureHealthCheck {name}"), e))?;
        }

        self.ensure_classic_attributes(name, opts).await?;
        self.ensure_proxy_protocol(
            name,
            &lb,
            opts.proxy_protocol,
            &ports.iter().filter_map(|p| p.node_port).collect::<Vec<_>>(),
        )
        .await?;
        if let Some(policy) = &opts.ssl_negotiation_policy {
            self.ensure_ssl_negotiation_policy(name, &lb, &listeners, policy).await?;
        }

        // Backends.
        let backends = Backends::of(&lb, &instances);
        self.register(name, &backends.add).await?;
        if !backends.remove.is_empty() {
            let remove =
                backends.remove.iter().map(|id| ElbInstance::builder().instance_id(id).build());
            c.elb
                .deregister_instances_from_load_balancer()
                .load_balancer_name(name)
                .set_instances(Some(remove.collect()))
                .send()
                .await
                .map_err(|e| api_error(format!("DeregisterInstancesFromLoadBalancer {name}"), e))?;
        }

        // Node security groups admit the load balancer's primary group (as upstream: the first
        // of the security-groups annotation, else ElbSecurityGroup, else our own group) —
        // whoever created that group. Rules for nodes no longer behind the ELB are revoked
        // from any group when the ELB group is ours, else only from groups tagged for the
        // cluster (a hand-made rule on a user's group is left alone).
        if !g.disable_security_group_ingress
            && let Some(primary) = sgs.first()
        {
            let desired = self.node_security_groups(&instances).await?;
            let primary_is_ours = own_sg.as_deref() == Some(primary.as_str());
            self.sync_lb_group_rule(&vpc, &desired, primary, primary_is_ours).await?;
        }

        Ok(status_for(lb.dns_name()))
    }

    /// A node-set update of a classic ELB (upstream's `UpdateLoadBalancer`): only the
    /// backends, without re-checking listeners, health check, attributes and groups, which the
    /// Service's own sync keeps. One DescribeLoadBalancers and the register call when a Node
    /// joins; nothing else when the node groups already admit the load balancer. `Ok(false)`:
    /// done nothing, a full ensure is needed — the load balancer is missing, instances leave
    /// it (their groups may lose the rule), or a joining instance brings a node security
    /// group the others do not have (the rule must be added to it first).
    pub(crate) async fn update_classic(
        &self,
        name: &str,
        opts: &LbOptions,
        nodes: &[Node],
    ) -> Result<bool, ProviderError> {
        let Some(lb) = self.describe_classic(name).await? else {
            return Ok(false);
        };
        let instances = self.backend_instances(nodes, opts).await?;
        let Backends { have, add, remove } = Backends::of(&lb, &instances);
        if !remove.is_empty() {
            return Ok(false);
        }
        if add.is_empty() {
            return Ok(true);
        }
        if !self.cfg.global.disable_security_group_ingress {
            let staying: Vec<_> =
                instances.iter().filter(|i| have.contains(i.id())).cloned().collect();
            if self.node_security_groups(&instances).await?
                != self.node_security_groups(&staying).await?
            {
                return Ok(false);
            }
        }
        self.register(name, &add).await?;
        Ok(true)
    }

    /// Registers instances with a classic ELB (nothing to do for none).
    async fn register(&self, name: &str, ids: &[String]) -> Result<(), ProviderError> {
        if ids.is_empty() {
            return Ok(());
        }
        let add = ids.iter().map(|id| ElbInstance::builder().instance_id(id).build());
        self.clients
            .get()
            .await?
            .elb
            .register_instances_with_load_balancer()
            .load_balancer_name(name)
            .set_instances(Some(add.collect()))
            .send()
            .await
            .map_err(|e| api_error(format!("RegisterInstancesWithLoadBalancer {name}"), e))?;
        Ok(())
    }

    /// Makes the attributes exactly what the annotations say, with upstream's defaults for
    /// every annotation that is absent (so removing one resets it): cross-zone off, idle
    /// timeout 60 s, connection draining off, access logs off.
    async fn ensure_classic_attributes(
        &self,
        name: &str,
        opts: &LbOptions,
    ) -> Result<(), ProviderError> {
        let c = self.clients.get().await?;
        let current = c
            .elb
            .describe_load_balancer_attributes()
            .load_balancer_name(name)
            .send()
            .await
            .map_err(|e| api_error(format!("DescribeLoadBalancerAttributes {name}"), e))?;
        let cur = current
            .load_balancer_attributes()
            .cloned()
            .unwrap_or_else(|| LoadBalancerAttributes::builder().build());
        let want = desired_classic_attributes(opts);
        let cross_zone = want.cross_zone;
        let idle = want.idle_timeout;
        let mut changed = false;
        changed |=
            cur.cross_zone_load_balancing().map(|x| x.enabled()).unwrap_or(false) != cross_zone;
        changed |= cur.connection_settings().map(|x| x.idle_timeout()) != Some(idle);
        let draining = cur.connection_draining();
        changed |= draining.map(|x| x.enabled()).unwrap_or(false) != want.draining_enabled;
        if let Some(t) = want.draining_timeout {
            changed |= draining.and_then(|x| x.timeout()) != Some(t);
        }
        let log = cur.access_log();
        let log_enabled = log.map(|x| x.enabled()).unwrap_or(false);
        changed |= log_enabled != want.log.enabled;
        if want.log.enabled {
            changed |= log.and_then(|x| x.s3_bucket_name()).filter(|b| !b.is_empty())
                != want.log.bucket.as_deref();
            changed |= log.and_then(|x| x.s3_bucket_prefix()).unwrap_or_default()
                != want.log.prefix.as_deref().unwrap_or_default();
            if let Some(i) = want.log.emit_interval {
                changed |= log.and_then(|x| x.emit_interval()) != Some(i);
            }
        }
        if !changed {
            return Ok(());
        }
        let mut draining = ConnectionDraining::builder().enabled(want.draining_enabled);
        if let Some(t) = want.draining_timeout {
            draining = draining.timeout(t);
        }
        let mut log = AccessLog::builder().enabled(want.log.enabled);
        if want.log.enabled {
            log = log
                .set_emit_interval(want.log.emit_interval)
                .set_s3_bucket_name(want.log.bucket.clone())
                .s3_bucket_prefix(want.log.prefix.clone().unwrap_or_default());
        }
        let attrs = LoadBalancerAttributes::builder()
            .cross_zone_load_balancing(
                CrossZoneLoadBalancing::builder().enabled(cross_zone).build(),
            )
            .connection_settings(
                ConnectionSettings::builder()
                    .idle_timeout(idle)
                    .build()
                    .map_err(|e| build_err("connection settings", e))?,
            )
            .connection_draining(draining.build())
            .access_log(log.build())
            .build();
        c.elb
            .modify_load_balancer_attributes()
            .load_balancer_name(name)
            .load_balancer_attributes(attrs)
            .send()
            .await
            .map_err(|e| api_error(format!("ModifyLoadBalancerAttributes {name}"), e))?;
        tracing::info!(lb = name, "updated load balancer attributes");
        Ok(())
    }

    /// Creates upstream's `k8s-SSLNegotiationPolicy-<policy>` on the ELB if missing and sets it
    /// on every TLS (SSL/HTTPS) listener that does not carry it yet.
    async fn ensure_ssl_negotiation_policy(
        &self,
        name: &str,
        lb: &LoadBalancerDescription,
        listeners: &[Listener],
        policy: &str,
    ) -> Result<(), ProviderError> {
        let c = self.clients.get().await?;
        let policy_name = ssl_negotiation_policy_name(policy);
        let exists = lb.policies().is_some_and(|p| p.other_policies().contains(&policy_name));
        let exists = exists
            || match c
                .elb
                .describe_load_balancer_policies()
                .load_balancer_name(name)
                .policy_names(&policy_name)
                .send()
                .await
            {
                Ok(r) => !r.policy_descriptions().is_empty(),
                Err(e) if error_code(&e) == Some("PolicyNotFound") => false,
                Err(e) => {
                    return Err(api_error(format!("DescribeLoadBalancerPolicies {name}"), e));
                }
            };
        if !exists {
            c.elb
                .create_load_balancer_policy()
                .load_balancer_name(name)
                .policy_name(&policy_name)
                .policy_type_name("SSLNegotiationPolicyType")
                .policy_attributes(
                    PolicyAttribute::builder()
                        .attribute_name("Reference-Security-Policy")
                        .attribute_value(policy)
                        .build(),
                )
                .send()
                .await
                .map_err(|e| {
                    api_error(format!("CreateLoadBalancerPolicy {policy_name} on {name}"), e)
                })?;
            tracing::info!(lb = name, policy = %policy_name, "created SSL negotiation policy");
        }
        for l in listeners {
            let proto = l.protocol().to_ascii_uppercase();
            if proto != "SSL" && proto != "HTTPS" {
                continue;
            }
            let port = l.load_balancer_port();
            let set = lb.listener_descriptions().iter().any(|d| {
                d.listener().is_some_and(|h| listener_key(h) == listener_key(l))
                    && d.policy_names().contains(&policy_name)
            });
            if !set {
                c.elb
                    .set_load_balancer_policies_of_listener()
                    .load_balancer_name(name)
                    .load_balancer_port(port)
                    .policy_names(&policy_name)
                    .send()
                    .await
                    .map_err(|e| {
                        api_error(format!("SetLoadBalancerPoliciesOfListener {name}:{port}"), e)
                    })?;
            }
        }
        Ok(())
    }

    /// Proxy protocol follows the annotation both ways: with it every backend port carries
    /// upstream's policy, without it (or for a port no listener uses any more) the backend's
    /// policies are cleared.
    async fn ensure_proxy_protocol(
        &self,
        name: &str,
        lb: &LoadBalancerDescription,
        enabled: bool,
        instance_ports: &[i32],
    ) -> Result<(), ProviderError> {
        let c = self.clients.get().await?;
        let has = |b: &aws_sdk_elasticloadbalancing::types::BackendServerDescription| {
            b.policy_names().iter().any(|n| n == PROXY_PROTOCOL_POLICY)
        };
        if enabled {
            let has_policy = lb
                .policies()
                .is_some_and(|p| p.other_policies().iter().any(|n| n == PROXY_PROTOCOL_POLICY));
            if !has_policy {
                c.elb
                    .create_load_balancer_policy()
                    .load_balancer_name(name)
                    .policy_name(PROXY_PROTOCOL_POLICY)
                    .policy_type_name("ProxyProtocolPolicyType")
                    .policy_attributes(
                        PolicyAttribute::builder()
                            .attribute_name("ProxyProtocol")
                            .attribute_value("true")
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(|e| api_error(format!("CreateLoadBalancerPolicy {name}"), e))?;
            }
        }
        let mut set: Vec<(i32, bool)> = Vec::new();
        if enabled {
            for port in instance_ports {
                let on = lb
                    .backend_server_descriptions()
                    .iter()
                    .any(|b| b.instance_port() == Some(*port) && has(b));
                if !on {
                    set.push((*port, true));
                }
            }
        }
        for b in lb.backend_server_descriptions() {
            let Some(port) = b.instance_port() else { continue };
            if has(b) && (!enabled || !instance_ports.contains(&port)) {
                set.push((port, false));
            }
        }
        for (port, on) in set {
            c.elb
                .set_load_balancer_policies_for_backend_server()
                .load_balancer_name(name)
                .instance_port(port)
                .set_policy_names(Some(if on {
                    vec![PROXY_PROTOCOL_POLICY.to_string()]
                } else {
                    Vec::new()
                }))
                .send()
                .await
                .map_err(|e| {
                    api_error(format!("SetLoadBalancerPoliciesForBackendServer {name}:{port}"), e)
                })?;
            tracing::info!(lb = name, port, enabled = on, "set proxy protocol on backend port");
        }
        Ok(())
    }

    /// Deletes the classic ELB and the security group created for it, with the node rules
    /// that reference that group. A group we did not create is left alone.
    pub(crate) async fn delete_classic(
        &self,
        service: &Service,
        name: &str,
    ) -> Result<(), ProviderError> {
        let c = self.clients.get().await?;
        let lb = self.describe_classic(name).await?;
        let vpc = lb
            .as_ref()
            .and_then(|l| l.vpc_id())
            .map(str::to_string)
            .or_else(|| Some(self.cfg.global.vpc.clone()).filter(|v| !v.is_empty()));
        let own = self
            .find_sg(&elb_security_group_name(name), vpc.as_deref())
            .await?
            .filter(|sg| self.sg_is_ours(sg));
        if let Some(sg) = &own {
            let id = sg.group_id().unwrap_or_default().to_string();
            let sg_vpc = sg.vpc_id().map(str::to_string);
            let holders = self
                .groups_with_rules(sg_vpc.as_deref(), |r| r.source == Source::Group(id.clone()))
                .await?;
            for (holder, rules) in holders {
                if holder != id {
                    self.revoke(&holder, &rules).await?;
                }
            }
        }
        // A user-supplied primary group (annotation or ElbSecurityGroup): its rule goes from the
        // cluster's node groups, as upstream, unless another classic ELB still uses the group
        // (upstream would cut that ELB off; we keep its rule).
        if let Some(lb) = &lb
            && let Some(primary) = self.user_primary_group(service, lb)
            && own.as_ref().and_then(|o| o.group_id()) != Some(primary.as_str())
            && let Some(lb_vpc) = lb.vpc_id()
        {
            if self.classic_group_shared(name, &primary).await? {
                tracing::info!(lb = name, group = %primary, "security group still used by another load balancer; node rules kept");
            } else {
                self.sync_lb_group_rule(lb_vpc, &BTreeSet::new(), &primary, false).await?;
            }
        }
        if lb.is_some() {
            c.elb
                .delete_load_balancer()
                .load_balancer_name(name)
                .send()
                .await
                .map_err(|e| api_error(format!("DeleteLoadBalancer {name}"), e))?;
            tracing::info!(lb = name, service = %service_name(service), "deleted classic load balancer");
        }
        if let Some(sg) = own {
            self.delete_sg(sg.group_id().unwrap_or_default()).await?;
        }
        Ok(())
    }

    /// The primary security group of `lb` when the user supplied it: the first group of the
    /// security-groups annotation, else `ElbSecurityGroup`, if the ELB carries it.
    fn user_primary_group(
        &self,
        service: &Service,
        lb: &LoadBalancerDescription,
    ) -> Option<String> {
        let annotated = service
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::keys::SECURITY_GROUPS))
            .and_then(|v| v.split(',').map(str::trim).find(|s| !s.is_empty()))
            .map(str::to_string);
        let configured = Some(self.cfg.global.elb_security_group.clone()).filter(|s| !s.is_empty());
        annotated.or(configured).filter(|g| lb.security_groups().iter().any(|s| s == g))
    }

    /// Whether a classic ELB other than `name` uses security group `sg`.
    async fn classic_group_shared(&self, name: &str, sg: &str) -> Result<bool, ProviderError> {
        let elb = &self.clients.get().await?.elb;
        let mut marker: Option<String> = None;
        loop {
            let resp = elb
                .describe_load_balancers()
                .set_marker(marker.take())
                .send()
                .await
                .map_err(|e| api_error("DescribeLoadBalancers (security group users)", e))?;
            if resp.load_balancer_descriptions().iter().any(|d| {
                d.load_balancer_name() != Some(name) && d.security_groups().iter().any(|g| g == sg)
            }) {
                return Ok(true);
            }
            match resp.next_marker() {
                Some(m) if !m.is_empty() => marker = Some(m.to_string()),
                _ => return Ok(false),
            }
        }
    }
}
