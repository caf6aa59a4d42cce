//! The cloud configs upstream's own module (`k8s.io/cloud-provider-aws` v1.36.2) shows or
//! writes — its development guide, its NLB security-group guide, its local-up script, the
//! `[ServiceOverride]` example of its `CloudConfig` and the layouts its tests read — written
//! here from their keys, sections and syntax (not copied): each parses unchanged.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn parse_clean(text: &str) -> CloudConfig {
    let cfg = CloudConfig::parse(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(cfg.config_warnings().is_empty(), "{:?}", cfg.config_warnings());
    cfg
}

/// The development guide's file: keys aligned in a column, and a shared probe port of 0,
/// which upstream reads as "not set" (the default port).
#[test]
fn the_development_guides_config_with_a_zero_probe_port() {
    let cfg = parse_clean(
        "[Global]\n\
         Region                                          = eu-central-1\n\
         VPC                                             = vpc-0a1b2c3d\n\
         SubnetID                                        = subnet-0a1b2c3d\n\
         KubernetesClusterTag                            = dev-cluster\n\
         DisableSecurityGroupIngress                     = false\n\
         ClusterServiceLoadBalancerHealthProbeMode       = Shared\n\
         ClusterServiceSharedLoadBalancerHealthProbePort = 0\n",
    );
    let g = &cfg.global;
    assert_eq!(g.region, "eu-central-1");
    assert_eq!(g.subnet_id, "subnet-0a1b2c3d");
    assert_eq!(cfg.cluster_id(), Some("dev-cluster"));
    assert!(!g.disable_security_group_ingress);
    assert_eq!(g.health_probe_mode, HealthProbeMode::Shared);
    assert_eq!(g.shared_health_probe_port, DEFAULT_SHARED_HEALTH_PROBE_PORT);
}

/// The NLB security-group guide's one key, and the local-up script's `key=value` lines with
/// a quoted ARN.
#[test]
fn the_nlb_guides_and_the_local_up_scripts_configs() {
    let cfg = parse_clean("[Global]\nNLBSecurityGroupMode = Managed\n");
    assert_eq!(cfg.global.nlb_security_group_mode, "Managed");
    let cfg =
        parse_clean("[Global]\nZone=us-west-2c\nRoleARN=\"arn:aws:iam::111122223333:role/ccm\"\n");
    assert_eq!(cfg.configured_region().as_deref(), Some("us-west-2"));
    assert_eq!(cfg.global.role_arn, "arn:aws:iam::111122223333:role/ccm");
}

/// `CloudConfig`'s documented `[ServiceOverride]` blocks: indented keys, and a
/// `SigningMethod` upstream reads but never uses (accepted with a warning naming it).
#[test]
fn the_documented_service_override_blocks_with_indented_keys() {
    let cfg = CloudConfig::parse(
        "[ServiceOverride \"1\"]\n\
         \x20Service = s3\n\
         \x20Region = region-a\n\
         \x20URL = https://s3.example.test\n\
         \x20SigningRegion = signing-region\n\
         \x20SigningMethod = some-method\n\
         \n\
         \x20   [ServiceOverride \"2\"]\n\
         \x20    Service = ec2\n\
         \x20    Region = region-b\n\
         \x20    URL = https://ec2.example.test\n\
         \x20    SigningRegion = signing-region\n\
         \x20    SigningMethod = some-method\n",
    )
    .unwrap();
    assert_eq!(cfg.override_for("s3", "region-a").unwrap().url, "https://s3.example.test");
    assert_eq!(cfg.override_for("ec2", "region-b").unwrap().signing_region, "signing-region");
    let w = cfg.config_warnings();
    assert_eq!(w.len(), 2, "{w:?}");
    assert!(w[0].contains("[ServiceOverride \"1\"] SigningMethod"), "{w:?}");
    assert!(!w.join(" ").contains("some-method"), "{w:?}");
}

/// The layouts upstream's tests read: a lower-case `[global]`, one family per line, a
/// lower-case key, a quoted service name with trailing blanks (trimmed, as upstream trims it).
#[test]
fn the_layouts_upstreams_tests_read() {
    let cfg = parse_clean("[global]\nNodeIPFamilies = ipv6\nNodeIPFamilies = ipv4");
    assert_eq!(cfg.global.node_ip_families, vec![IpFamily::Ipv6, IpFamily::Ipv4]);
    let cfg = parse_clean("[global]\nzone = eu-west-1a");
    assert_eq!(cfg.global.zone, "eu-west-1a");
    let cfg = parse_clean(
        "\n                [Global]\n                [ServiceOverride \"1\"]\n                 \
         Service = \"s3      \"\n                 Region = sregion\n                 \
         URL = https://s3.foo.bar\n                 SigningRegion = sregion\n                 \
         SigningMethod = v4\n                ",
    );
    assert_eq!(cfg.service_overrides[0].service, "s3");
    // Upstream's test: an override without a URL is refused.
    let e = CloudConfig::parse("[ServiceOverride \"1\"]\nService=s3\nRegion=r\nSigningRegion=r\n")
        .unwrap_err();
    assert!(e.to_string().contains("[ServiceOverride \"1\"] URL"), "{e}");
}
