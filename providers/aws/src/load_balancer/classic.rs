//! Classic ELB: create/update/delete one load balancer per Service.

use std::collections::{BTreeMap, BTreeSet};

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

const PROXY_PROTOCOL_POLICY: &str = "k8s-proxyprotocol-enabled";

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
            match bp {
                Some("http") => ("HTTP", "HTTP", None),
                Some("https") => ("HTTPS", "HTTPS", None),
                Some("ssl") => ("SSL", "SSL", None),
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
        if opts.proxy_protocol {
            self.ensure_proxy_protocol(
                name,
                &lb,
                &ports.iter().filter_map(|p| p.node_port).collect::<Vec<_>>(),
            )
            .await?;
        }

        // Backends.
        let want = instance_ids(&instances);
        let have: BTreeSet<String> =
            lb.instances().iter().filter_map(|i| i.instance_id()).map(str::to_string).collect();
        let add: Vec<ElbInstance> = want
            .difference(&have)
            .map(|id| ElbInstance::builder().instance_id(id).build())
            .collect();
        let remove: Vec<ElbInstance> = have
            .difference(&want)
            .map(|id| ElbInstance::builder().instance_id(id).build())
            .collect();
        if !add.is_empty() {
            c.elb
                .register_instances_with_load_balancer()
                .load_balancer_name(name)
                .set_instances(Some(add))
                .send()
                .await
                .map_err(|e| api_error(format!("RegisterInstancesWithLoadBalancer {name}"), e))?;
        }
        if !remove.is_empty() {
            c.elb
                .deregister_instances_from_load_balancer()
                .load_balancer_name(name)
                .set_instances(Some(remove))
                .send()
                .await
                .map_err(|e| api_error(format!("DeregisterInstancesFromLoadBalancer {name}"), e))?;
        }

        // Node security groups admit the ELB's group (only for a group we created).
        if let Some(sg) = &own_sg {
            let desired = if g.disable_security_group_ingress {
                BTreeSet::new()
            } else {
                self.node_security_groups(&instances).await?
            };
            let rule = Rule {
                protocol: "-1".into(),
                from: -1,
                to: -1,
                source: Source::Group(sg.clone()),
                description: None,
            };
            let sg_id = sg.clone();
            self.sync_node_rules(&vpc, &desired, &[rule], move |r| {
                r.source == Source::Group(sg_id.clone())
            })
            .await?;
        }

        Ok(status_for(lb.dns_name()))
    }

    async fn ensure_classic_attributes(
        &self,
        name: &str,
        opts: &LbOptions,
    ) -> Result<(), ProviderError> {
        if opts.cross_zone.is_none()
            && opts.idle_timeout.is_none()
            && opts.draining_enabled.is_none()
            && opts.draining_timeout.is_none()
            && opts.access_log.is_none()
        {
            return Ok(());
        }
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
        let mut b = LoadBalancerAttributes::builder();
        let mut changed = false;
        if let Some(v) = opts.cross_zone {
            changed |= cur.cross_zone_load_balancing().map(|x| x.enabled()) != Some(v);
            b = b.cross_zone_load_balancing(CrossZoneLoadBalancing::builder().enabled(v).build());
        }
        if let Some(v) = opts.idle_timeout {
            changed |= cur.connection_settings().map(|x| x.idle_timeout()) != Some(v);
            b = b.connection_settings(
                ConnectionSettings::builder()
                    .idle_timeout(v)
                    .build()
                    .map_err(|e| build_err("connection settings", e))?,
            );
        }
        if opts.draining_enabled.is_some() || opts.draining_timeout.is_some() {
            let enabled = opts.draining_enabled.unwrap_or(true);
            let timeout = opts.draining_timeout.unwrap_or(300);
            changed |= cur.connection_draining().map(|x| (x.enabled(), x.timeout()))
                != Some((enabled, Some(timeout)));
            b = b.connection_draining(
                ConnectionDraining::builder().enabled(enabled).timeout(timeout).build(),
            );
        }
        if let Some(a) = &opts.access_log {
            changed |= cur.access_log().map(|x| x.enabled()) != Some(a.enabled);
            b = b.access_log(
                AccessLog::builder()
                    .enabled(a.enabled)
                    .set_emit_interval(a.emit_interval)
                    .set_s3_bucket_name(a.bucket.clone())
                    .set_s3_bucket_prefix(a.prefix.clone())
                    .build(),
            );
        }
        if changed {
            c.elb
                .modify_load_balancer_attributes()
                .load_balancer_name(name)
                .load_balancer_attributes(b.build())
                .send()
                .await
                .map_err(|e| api_error(format!("ModifyLoadBalancerAttributes {name}"), e))?;
        }
        Ok(())
    }

    async fn ensure_proxy_protocol(
        &self,
        name: &str,
        lb: &LoadBalancerDescription,
        instance_ports: &[i32],
    ) -> Result<(), ProviderError> {
        let c = self.clients.get().await?;
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
        for port in instance_ports {
            let set = lb.backend_server_descriptions().iter().any(|b| {
                b.instance_port() == Some(*port)
                    && b.policy_names().iter().any(|n| n == PROXY_PROTOCOL_POLICY)
            });
            if !set {
                c.elb
                    .set_load_balancer_policies_for_backend_server()
                    .load_balancer_name(name)
                    .instance_port(*port)
                    .policy_names(PROXY_PROTOCOL_POLICY)
                    .send()
                    .await
                    .map_err(|e| {
                        api_error(
                            format!("SetLoadBalancerPoliciesForBackendServer {name}:{port}"),
                            e,
                        )
                    })?;
            }
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
}
