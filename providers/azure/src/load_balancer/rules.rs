//! The load-balancing rules and health probes a Service wants (upstream `getExpectedLBRules`,
//! `azure_loadbalancer_healthprobe.go`), and their reconciliation into a load balancer: only
//! the Service's own rules and probes (by name prefix) are replaced or removed; the shared
//! probe stays while any rule uses it.
//!
//! Probes: `externalTrafficPolicy: Local` → one HTTP probe `/healthz` on the health check
//! node port (named like a TCP rule on that port); `shared` probe mode (Cluster policy) →
//! [`naming::SHARED_PROBE`] on 10256 `/healthz`; otherwise one probe per TCP port on its node
//! port (protocol from `port_<port>_health-probe_protocol`, `appProtocol`, the global
//! annotation, else TCP; path `/` for HTTP(S)). UDP and SCTP ports get no probe of their own.

use crate::client::models::{
    LoadBalancer, LoadBalancingRule, Probe, ProbeProperties, Ref, RuleProperties,
};
use crate::config::Config;

use super::annotations::{Family, ProbePort, ProbeProtocol, Protocol, ServiceConfig};
use super::naming;

/// Whether the config asks for the shared kube-proxy probe.
pub fn shared_probe_mode(config: &Config) -> bool {
    config.shared_health_probe()
}

fn probe(
    name: String,
    protocol: ProbeProtocol,
    port: i32,
    path: Option<String>,
    interval: i32,
    num: i32,
) -> Probe {
    Probe {
        name: Some(name),
        properties: ProbeProperties {
            protocol: Some(protocol.arm().to_string()),
            port: Some(port),
            request_path: match protocol {
                ProbeProtocol::Tcp => None,
                _ => path,
            },
            interval_in_seconds: Some(interval),
            probe_threshold: Some(num),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The shared probe as the config sets it.
pub fn shared_probe(config: &Config) -> Probe {
    probe(
        naming::SHARED_PROBE.to_string(),
        ProbeProtocol::Http,
        config.shared_health_probe_port(),
        Some(config.shared_health_probe_path().to_string()),
        super::annotations::DEFAULT_PROBE_INTERVAL,
        super::annotations::DEFAULT_NUM_OF_PROBE,
    )
}

fn port_probe(
    svc: &ServiceConfig,
    p: &super::annotations::PortConfig,
    name: &str,
    have_node_probe: bool,
) -> Option<Probe> {
    if p.protocol != Protocol::Tcp {
        return None;
    }
    let port = match &p.probe.port {
        Some(ProbePort::ServicePort(s)) => svc
            .ports
            .iter()
            .find(|q| q.name.eq_ignore_ascii_case(s) || q.port.to_string() == *s)
            .map(|q| q.node_port)
            .unwrap_or(p.node_port),
        Some(ProbePort::Number(n)) => *n,
        None if have_node_probe => return None,
        None => p.node_port,
    };
    let protocol = p
        .probe
        .protocol
        .or_else(|| {
            // appProtocol values that are not tcp/http/https fall back to TCP, as upstream.
            p.app_protocol.as_ref().map(|a| match a.to_ascii_lowercase().as_str() {
                "http" => ProbeProtocol::Http,
                "https" => ProbeProtocol::Https,
                _ => ProbeProtocol::Tcp,
            })
        })
        .or(svc.probe_protocol)
        .unwrap_or(ProbeProtocol::Tcp);
    let path = p
        .probe
        .request_path
        .clone()
        .or_else(|| svc.probe_request_path.clone())
        .unwrap_or_else(|| super::annotations::DEFAULT_PROBE_PATH.to_string());
    Some(probe(
        name.to_string(),
        protocol,
        port,
        Some(path),
        p.probe.interval,
        p.probe.num_of_probe,
    ))
}

/// The probes and rules the Service wants on one family's frontend.
pub fn expected(
    config: &Config,
    svc: &ServiceConfig,
    family: Family,
    lb_id: &str,
    frontend_id: &str,
    pool_id: &str,
) -> (Vec<Probe>, Vec<LoadBalancingRule>) {
    let mut probes: Vec<Probe> = Vec::new();
    let mut rules = Vec::new();
    let probe_ref = |name: &str| Ref::to(naming::child_id(lb_id, "probes", name));

    // Local: kube-proxy's health check node port; shared mode: the kube-proxy probe.
    let mut node_probe = svc.health_check_node_port.map(|port| {
        probe(
            naming::rule_name(svc, Protocol::Tcp.k8s(), port, family),
            ProbeProtocol::Http,
            port,
            Some("/healthz".to_string()),
            svc.health_check_probe.interval,
            svc.health_check_probe.num_of_probe,
        )
    });
    let shared = shared_probe_mode(config) && !svc.local_traffic;
    if shared {
        node_probe = Some(shared_probe(config));
    }

    let base_props = |protocol: Protocol, port: i32| RuleProperties {
        frontend_ip_configuration: Some(Ref::to(frontend_id)),
        backend_address_pool: Some(Ref::to(pool_id)),
        protocol: Some(protocol.arm().to_string()),
        frontend_port: Some(port),
        backend_port: Some(port),
        idle_timeout_in_minutes: Some(svc.idle_timeout),
        enable_floating_ip: Some(true),
        enable_tcp_reset: matches!(protocol, Protocol::Tcp).then_some(svc.tcp_reset),
        load_distribution: Some(
            if svc.client_ip_affinity { "SourceIP" } else { "Default" }.to_string(),
        ),
        disable_outbound_snat: Some(config.disable_outbound_snat),
        ..Default::default()
    };

    if svc.internal && svc.ha_ports {
        let Some(first) = svc.ports.first() else { return (probes, rules) };
        let name = naming::rule_name(svc, first.protocol.k8s(), first.port, family);
        let mut props = base_props(Protocol::Sctp, 0);
        props.enable_tcp_reset = Some(svc.tcp_reset);
        let chosen = match node_probe {
            Some(p) => Some(p),
            None => svc.ports.iter().find_map(|p| port_probe(svc, p, &name, false)),
        };
        if let Some(p) = chosen {
            props.probe = Some(probe_ref(p.name()));
            probes.push(p);
        }
        rules.push(LoadBalancingRule { name: Some(name), properties: props, ..Default::default() });
        return (probes, rules);
    }

    for p in &svc.ports {
        if p.no_lb_rule {
            continue;
        }
        let name = naming::rule_name(svc, p.protocol.k8s(), p.port, family);
        let mut props = base_props(p.protocol, p.port);
        if !p.no_probe_rule {
            let own = if shared { None } else { port_probe(svc, p, &name, node_probe.is_some()) };
            if let Some(own) = own {
                props.probe = Some(probe_ref(own.name()));
                probes.push(own);
            } else if let Some(np) = &node_probe {
                props.probe = Some(probe_ref(np.name()));
                if !probes.iter().any(|q| q.name() == np.name()) {
                    probes.push(np.clone());
                }
            }
        }
        // Internal IPv6 frontends cannot use floating IP (upstream): node port instead.
        let ipv6_internal = svc.internal && family == Family::V6;
        if !svc.floating_ip || ipv6_internal {
            props.backend_port = Some(p.node_port);
            props.enable_floating_ip = Some(false);
        }
        rules.push(LoadBalancingRule { name: Some(name), properties: props, ..Default::default() });
    }
    (probes, rules)
}

fn ref_eq(a: &Option<Ref>, b: &Option<Ref>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => a.id.eq_ignore_ascii_case(&b.id),
        _ => false,
    }
}

/// Whether an existing rule already is what we want (upstream compares these fields).
fn same_rule(have: &LoadBalancingRule, want: &LoadBalancingRule) -> bool {
    let (h, w) = (&have.properties, &want.properties);
    have.name().eq_ignore_ascii_case(want.name())
        && h.protocol.as_deref().map(str::to_ascii_lowercase)
            == w.protocol.as_deref().map(str::to_ascii_lowercase)
        && (w.protocol.as_deref() != Some("Tcp")
            || h.enable_tcp_reset.unwrap_or(false) == w.enable_tcp_reset.unwrap_or(false))
        && ref_eq(&h.frontend_ip_configuration, &w.frontend_ip_configuration)
        && ref_eq(&h.backend_address_pool, &w.backend_address_pool)
        && ref_eq(&h.probe, &w.probe)
        && h.load_distribution == w.load_distribution
        && h.frontend_port == w.frontend_port
        && h.backend_port == w.backend_port
        && h.enable_floating_ip == w.enable_floating_ip
        && h.disable_outbound_snat.unwrap_or(false) == w.disable_outbound_snat.unwrap_or(false)
        && h.idle_timeout_in_minutes == w.idle_timeout_in_minutes
}

fn same_probe(have: &Probe, want: &Probe) -> bool {
    let (h, w) = (&have.properties, &want.properties);
    have.name().eq_ignore_ascii_case(want.name())
        && h.port == w.port
        && h.protocol.as_deref().map(str::to_ascii_lowercase)
            == w.protocol.as_deref().map(str::to_ascii_lowercase)
        && h.request_path
            .as_deref()
            .unwrap_or_default()
            .eq_ignore_ascii_case(w.request_path.as_deref().unwrap_or_default())
        && h.interval_in_seconds.unwrap_or(0) == w.interval_in_seconds.unwrap_or(0)
        && h.probe_threshold.or(h.number_of_probes).unwrap_or(0) == w.probe_threshold.unwrap_or(0)
}

/// Puts the Service's rules and probes on `lb`: its own (by prefix) that differ from
/// `want_*` are replaced, those not wanted are removed, everything else is left untouched.
/// The shared probe is added when wanted and dropped when no rule uses it any more. Returns
/// whether anything changed.
pub fn reconcile(
    lb: &mut LoadBalancer,
    svc: &ServiceConfig,
    want_probes: Vec<Probe>,
    want_rules: Vec<LoadBalancingRule>,
) -> bool {
    let props = &mut lb.properties;
    let mut changed = false;

    let before = props.load_balancing_rules.len();
    props
        .load_balancing_rules
        .retain(|r| !naming::owns(svc, r.name()) || want_rules.iter().any(|w| same_rule(r, w)));
    changed |= props.load_balancing_rules.len() != before;
    for w in want_rules {
        if !props.load_balancing_rules.iter().any(|r| same_rule(r, &w)) {
            props.load_balancing_rules.push(w);
            changed = true;
        }
    }

    let before = props.probes.len();
    props
        .probes
        .retain(|p| !naming::owns(svc, p.name()) || want_probes.iter().any(|w| same_probe(p, w)));
    changed |= props.probes.len() != before;
    for w in want_probes {
        if let Some(i) = props.probes.iter().position(|p| p.name().eq_ignore_ascii_case(w.name())) {
            // Only the shared probe can be here under another's ownership: keep it as is
            // unless its settings differ.
            if !same_probe(&props.probes[i], &w) {
                props.probes[i] = w;
                changed = true;
            }
        } else {
            props.probes.push(w);
            changed = true;
        }
    }
    changed | drop_unused_shared_probe(lb)
}

/// Removes the shared probe when no rule references it.
pub fn drop_unused_shared_probe(lb: &mut LoadBalancer) -> bool {
    let props = &mut lb.properties;
    let used = props.load_balancing_rules.iter().any(|r| {
        r.properties
            .probe
            .as_ref()
            .is_some_and(|p| naming::last_segment(&p.id).eq_ignore_ascii_case(naming::SHARED_PROBE))
    });
    let before = props.probes.len();
    if !used {
        props.probes.retain(|p| !p.name().eq_ignore_ascii_case(naming::SHARED_PROBE));
    }
    props.probes.len() != before
}

#[cfg(test)]
mod tests {
    use super::super::annotations::{self, parse, port_key};
    use super::*;

    const LB: &str =
        "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Network/loadBalancers/k";
    const P: &str = "a6f7f1b2c123456789abcdef01234567";

    fn fe() -> String {
        format!("{LB}/frontendIPConfigurations/{P}")
    }
    fn pool() -> String {
        format!("{LB}/backendAddressPools/k")
    }

    fn build(
        config: &Config,
        a: &[(&str, &str)],
        ports: &[(i32, &str)],
        tweak: impl FnOnce(&mut k8s_openapi::api::core::v1::Service),
    ) -> (Vec<Probe>, Vec<LoadBalancingRule>) {
        let mut s = annotations::tests::svc(a, ports);
        tweak(&mut s);
        let c = parse(&s).unwrap();
        expected(config, &c, c.families[0], LB, &fe(), &pool())
    }

    #[test]
    fn cluster_policy_tcp_probe_on_the_node_port() {
        let (probes, rules) = build(&Config::default(), &[], &[(80, "TCP"), (53, "UDP")], |_| {});
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0].name(), format!("{P}-TCP-80"));
        assert_eq!(probes[0].properties.protocol.as_deref(), Some("Tcp"));
        assert_eq!(probes[0].properties.port, Some(30080));
        assert_eq!(probes[0].properties.request_path, None);
        assert_eq!(probes[0].properties.interval_in_seconds, Some(5));
        assert_eq!(probes[0].properties.probe_threshold, Some(2));
        let names: Vec<_> = rules.iter().map(|r| r.name()).collect();
        assert_eq!(names, vec![format!("{P}-TCP-80"), format!("{P}-UDP-53")]);
        let r = &rules[0].properties;
        assert_eq!(r.protocol.as_deref(), Some("Tcp"));
        assert_eq!((r.frontend_port, r.backend_port), (Some(80), Some(80)));
        assert_eq!(r.enable_floating_ip, Some(true));
        assert_eq!(r.enable_tcp_reset, Some(true));
        assert_eq!(r.idle_timeout_in_minutes, Some(4));
        assert_eq!(r.load_distribution.as_deref(), Some("Default"));
        assert_eq!(r.probe.as_ref().unwrap().id, format!("{LB}/probes/{P}-TCP-80"));
        assert!(rules[1].properties.probe.is_none());
        assert_eq!(rules[1].properties.enable_tcp_reset, None);
    }

    #[test]
    fn local_policy_http_healthz_on_the_health_check_node_port() {
        let (probes, rules) = build(&Config::default(), &[], &[(80, "TCP"), (53, "UDP")], |s| {
            let spec = s.spec.as_mut().unwrap();
            spec.external_traffic_policy = Some("Local".into());
            spec.health_check_node_port = Some(32000);
        });
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0].name(), format!("{P}-TCP-32000"));
        assert_eq!(probes[0].properties.protocol.as_deref(), Some("Http"));
        assert_eq!(probes[0].properties.request_path.as_deref(), Some("/healthz"));
        // Every rule, UDP too, uses the node's health check.
        for r in &rules {
            assert_eq!(
                r.properties.probe.as_ref().unwrap().id,
                format!("{LB}/probes/{P}-TCP-32000")
            );
        }
    }

    #[test]
    fn shared_mode_one_probe_for_cluster_services() {
        let config = Config {
            cluster_service_load_balancer_health_probe_mode: Some("shared".into()),
            ..Default::default()
        };
        let (probes, rules) = build(&config, &[], &[(80, "TCP"), (443, "TCP")], |_| {});
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0].name(), naming::SHARED_PROBE);
        assert_eq!(probes[0].properties.port, Some(10256));
        assert!(
            rules.iter().all(|r| r
                .properties
                .probe
                .as_ref()
                .unwrap()
                .id
                .ends_with(naming::SHARED_PROBE))
        );
    }

    #[test]
    fn port_annotations() {
        let no_rule = port_key(80, "no_lb_rule");
        let no_probe = port_key(81, "no_probe_rule");
        let proto = port_key(82, "health-probe_protocol");
        let path = port_key(82, "health-probe_request-path");
        let (probes, rules) = build(
            &Config::default(),
            &[
                (no_rule.as_str(), "true"),
                (no_probe.as_str(), "true"),
                (proto.as_str(), "https"),
                (path.as_str(), "/ready"),
            ],
            &[(80, "TCP"), (81, "TCP"), (82, "TCP")],
            |_| {},
        );
        assert_eq!(rules.len(), 2);
        assert!(rules[0].properties.probe.is_none());
        assert_eq!(probes.len(), 1);
        assert_eq!(probes[0].properties.protocol.as_deref(), Some("Https"));
        assert_eq!(probes[0].properties.request_path.as_deref(), Some("/ready"));
    }

    #[test]
    fn floating_ip_idle_timeout_affinity() {
        let (_, rules) = build(
            &Config { disable_outbound_snat: true, ..Default::default() },
            &[
                (annotations::DISABLE_FLOATING_IP, "true"),
                (annotations::TCP_IDLE_TIMEOUT, "30"),
                (annotations::DISABLE_TCP_RESET, "true"),
            ],
            &[(80, "TCP")],
            |s| s.spec.as_mut().unwrap().session_affinity = Some("ClientIP".into()),
        );
        let r = &rules[0].properties;
        assert_eq!((r.backend_port, r.enable_floating_ip), (Some(30080), Some(false)));
        assert_eq!(r.idle_timeout_in_minutes, Some(30));
        assert_eq!(r.enable_tcp_reset, Some(false));
        assert_eq!(r.load_distribution.as_deref(), Some("SourceIP"));
        assert_eq!(r.disable_outbound_snat, Some(true));
    }

    #[test]
    fn ha_ports_is_one_all_protocol_rule_for_internal_only() {
        let a = [(annotations::INTERNAL, "true"), (annotations::HA_PORTS, "true")];
        let (probes, rules) = build(&Config::default(), &a, &[(80, "TCP"), (443, "TCP")], |_| {});
        assert_eq!(rules.len(), 1);
        assert_eq!(rules[0].name(), format!("{P}-TCP-80"));
        let r = &rules[0].properties;
        assert_eq!(
            (r.protocol.as_deref(), r.frontend_port, r.backend_port),
            (Some("All"), Some(0), Some(0))
        );
        assert_eq!(probes.len(), 1);
        // Public: ignored, as upstream.
        let (_, rules) = build(
            &Config::default(),
            &[(annotations::HA_PORTS, "true")],
            &[(80, "TCP"), (443, "TCP")],
            |_| {},
        );
        assert_eq!(rules.len(), 2);
    }

    #[test]
    fn reconcile_touches_only_the_services_own_entries() {
        let s = annotations::tests::svc(&[], &[(80, "TCP")]);
        let c = parse(&s).unwrap();
        let (probes, rules) = expected(&Config::default(), &c, Family::V4, LB, &fe(), &pool());
        let mut lb = LoadBalancer::default();
        let other = LoadBalancingRule { name: Some("a0000-TCP-80".into()), ..Default::default() };
        let stale = LoadBalancingRule { name: Some(format!("{P}-TCP-8080")), ..Default::default() };
        lb.properties.load_balancing_rules = vec![other.clone(), stale];
        assert!(reconcile(&mut lb, &c, probes.clone(), rules.clone()));
        let names: Vec<_> =
            lb.properties.load_balancing_rules.iter().map(|r| r.name().to_string()).collect();
        assert_eq!(names, vec!["a0000-TCP-80".to_string(), format!("{P}-TCP-80")]);
        assert!(!reconcile(&mut lb, &c, probes, rules), "a second pass changes nothing");
        // Unwanted: everything of the Service goes, the other rule stays.
        assert!(reconcile(&mut lb, &c, vec![], vec![]));
        assert_eq!(lb.properties.load_balancing_rules, vec![other]);
        assert!(lb.properties.probes.is_empty());
    }
}
