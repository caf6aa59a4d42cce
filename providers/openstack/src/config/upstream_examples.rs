//! The cloud configs upstream's own module (`k8s.io/cloud-provider-openstack` v1.36.0) ships
//! or documents — its controller-manager manifest's `cloud-config`, its chart's rendered
//! `cloud.conf` (every section header, empty by default, plus the Cinder CSI driver's
//! `[BlockStorage]`), its load-balancer guide's `[LoadBalancerClass]` example and the CSI
//! driver's `cloud.conf` — written here from their keys, sections and syntax (not copied):
//! each parses unchanged.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn parse_clean(text: &str) -> Config {
    let c = Config::parse_with(text, &BTreeMap::new(), &|_: &Path| {
        Err(std::io::ErrorKind::NotFound.into())
    })
    .unwrap_or_else(|e| panic!("{e}\n{text}"));
    assert!(c.config_warnings().is_empty(), "{:?}", c.config_warnings());
    c
}

/// The manifest's file: `key=value` without blanks, commented-out keys (with `=` in the
/// comment), keys set to nothing.
#[test]
fn the_manifests_cloud_config() {
    let c = parse_clean(
        "[Global]\n\
         auth-url=http://192.0.2.15:5000/v3\n\
         #Tip: an application credential works in place of user name and password.\n\
         #application-credential-id=\n\
         #application-credential-secret=\n\
         username=admin\n\
         # user-id=\n\
         password=s3cret\n\
         region=RegionOne\n\
         tenant-id=\n\
         domain-id=\n\
         \n\
         [LoadBalancer]\n\
         subnet-id=0c3b6a4e-9f21-4d1e-8a55-3a1f2b7c9d10\n\
         floating-network-id=7e9d1c2a-5b4f-4a3e-9c8d-1f2e3d4c5b6a\n",
    );
    assert_eq!(c.global.auth_url, "http://192.0.2.15:5000/v3");
    assert_eq!(c.global.username, "admin");
    assert_eq!(c.global.region, "RegionOne");
    assert!(c.global.project_id.is_empty() && c.global.domain_id.is_empty());
    assert_eq!(c.load_balancer.subnet_id, "0c3b6a4e-9f21-4d1e-8a55-3a1f2b7c9d10");
}

/// The chart's `cloud.conf`: every section it renders, with only what the values set (by
/// default nothing), and `[BlockStorage]` for the CSI driver sharing the Secret.
#[test]
fn the_charts_rendered_cloud_conf() {
    let c = parse_clean(
        "[Global]\nauth-url=https://keystone.example.test:5000/v3\nusername=u\npassword=p\n\
         [Networking]\n[LoadBalancer]\n[BlockStorage]\n[Metadata]\n[Route]\n",
    );
    assert_eq!(c.load_balancer, LoadBalancerOpts::default());
    let c = parse_clean(
        "[Global]\nauth-url=https://keystone.example.test:5000/v3\nusername=u\npassword=p\n\
         [Networking]\npublic-network-name=public\n[LoadBalancer]\nlb-provider=ovn\n\
         [BlockStorage]\nbs-version=v3\n[Metadata]\nsearch-order=configDrive,metadataService\n\
         [Route]\nrouter-id=r1\n",
    );
    assert_eq!(c.networking.public_network_names, vec!["public"]);
    assert_eq!(c.route.router_id, "r1");
}

/// The load-balancer guide's example: quoted values, `create-monitor` and Go durations, and
/// three named classes.
#[test]
fn the_load_balancer_guides_classes() {
    let c = parse_clean(
        "[Global]\n\
         auth-url=\"https://keystone.example.test\"\n\
         domain-name=\"mydomain\"\n\
         tenant-name=\"mytenant\"\n\
         username=\"myuser\"\n\
         password=\"mypassword\"\n\
         \n\
         [LoadBalancer]\n\
         floating-network-id=\"11111111-1111-4111-8111-111111111111\"\n\
         floating-subnet-id=\"22222222-2222-4222-8222-222222222222\"\n\
         subnet-id=\"33333333-3333-4333-8333-333333333333\"\n\
         create-monitor=true\n\
         monitor-delay=60s\n\
         monitor-timeout=30s\n\
         monitor-max-retries=1\n\
         monitor-max-retries-down=3\n\
         \n\
         [LoadBalancerClass \"internetFacing\"]\n\
         floating-network-id=\"44444444-4444-4444-8444-444444444444\"\n\
         floating-subnet-id=\"55555555-5555-4555-8555-555555555555\"\n\
         \n\
         [LoadBalancerClass \"dmz\"]\n\
         floating-subnet-id=\"66666666-6666-4666-8666-666666666666\"\n\
         \n\
         [LoadBalancerClass \"office\"]\n\
         floating-subnet-id=\"77777777-7777-4777-8777-777777777777\"\n",
    );
    assert_eq!(c.global.project_name, "mytenant");
    assert!(c.load_balancer.create_monitor);
    let names: Vec<&str> = c.lb_classes.keys().map(String::as_str).collect();
    assert_eq!(names, vec!["dmz", "internetFacing", "office"]);
    assert_eq!(
        c.lb_classes["internetFacing"].floating_network_id.as_deref(),
        Some("44444444-4444-4444-8444-444444444444")
    );
}

/// The Cinder CSI driver's `cloud.conf` (the same file the manager may be given).
#[test]
fn the_csi_drivers_cloud_conf() {
    let c = parse_clean(
        "[Global]\nusername=user\npassword=pass\nauth-url=https://192.0.2.20/identity/v3\n\
         tenant-id=c869168a828847f39f7f06edd7305637\ndomain-id=2a73b8f597c04551a0fdc8e95544be8a\n",
    );
    assert_eq!(c.global.project_id, "c869168a828847f39f7f06edd7305637");
}
