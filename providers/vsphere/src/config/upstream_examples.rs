//! The INI configs upstream's own module (`k8s.io/cloud-provider-vsphere` v1.36.0) ships or
//! documents — its controller-manager manifest's `vsphere.conf`, its integration test's file
//! and the configuration guide's full example — written here from their keys, sections and
//! syntax (not copied): each parses unchanged.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::*;

fn parse(text: &str) -> Config {
    Config::parse(text.as_bytes(), &BTreeMap::new()).unwrap_or_else(|e| panic!("{e}\n{text}"))
}

/// The manifest's file: comment lines, quoted values with trailing comments, indented keys
/// in `[VirtualCenter]` blocks, a commented-out `[Labels]`, and `service-account`.
#[test]
fn the_manifests_vsphere_conf() {
    let c = parse(
        "[Global]\n\
         # used for every vCenter below unless a VirtualCenter section overrides it.\n\
         \n\
         # credentials in a Kubernetes Secret:\n\
         secret-name = \"vsphere-creds\"\n\
         secret-namespace = \"kube-system\"\n\
         service-account = \"cloud-controller-manager\" #Default: cloud-controller-manager\n\
         # or here, for every vCenter:\n\
         user = \"administrator@vsphere.local\"\n\
         password = \"pa55word\"\n\
         \n\
         port = \"443\" #Optional\n\
         insecure-flag = \"1\" #1 for a self-signed certificate\n\
         datacenters = \"dc-1\"\n\
         \n\
         [VirtualCenter \"192.0.2.4\"]\n\
         # overrides for this vCenter.\n\
         \x20       user = \"other@vsphere.local\"\n\
         \x20       password = \"pa55word2\"\n\
         \x20       # port, insecure-flag, datacenters come from Global.\n\
         \n\
         [VirtualCenter \"192.0.2.5\"]\n\
         \x20       port = \"448\"\n\
         \x20       insecure-flag = \"0\"\n\
         \n\
         # [Labels]\n\
         #  region = k8s-region\n\
         #  zone = k8s-zone\n",
    );
    assert!(c.config_warnings().is_empty(), "{:?}", c.config_warnings());
    let servers: Vec<&str> = c.vcenters.iter().map(|v| v.server.as_str()).collect();
    assert_eq!(servers, vec!["192.0.2.4", "192.0.2.5"]);
    assert_eq!(c.vcenters[0].port, 443);
    assert!(c.vcenters[0].insecure);
    assert_eq!(c.vcenters[1].port, 448);
    assert!(!c.vcenters[1].insecure);
    assert_eq!(c.vcenters[1].datacenters, vec!["dc-1"]);
}

/// The integration test's file: credentials from the Secret only, a vCenter block with no
/// keys.
#[test]
fn the_integration_tests_vsphere_conf() {
    let c = parse(
        "[Global]\nsecret-name = \"vsphere-cloud-secret\"\nsecret-namespace = \"kube-system\"\n\
         service-account = \"cloud-controller-manager\"\n\nport = \"443\"\ninsecure-flag = \"1\"\n\
         datacenters = \"DC0\"\n\n[VirtualCenter \"198.51.100.96\"]\n",
    );
    assert!(c.config_warnings().is_empty(), "{:?}", c.config_warnings());
    assert_eq!(c.vcenters.len(), 1);
    assert_eq!(c.secret.as_ref().map(|s| s.name.as_str()), Some("vsphere-cloud-secret"));
}

/// The configuration guide's full example: every `[Global]` key (some set to `""`), a
/// vCenter overriding them, `[Labels]` and `[Nodes]`, keys indented.
#[test]
fn the_configuration_guides_full_example() {
    let c = parse(
        "[Global]\n\
         \x20 datacenters = \"dc-1\"\n\
         \x20 insecure-flag = \"1\" # self-signed\n\
         \x20 user = \"global@vsphere.local\"\n\
         \x20 password = \"global-pa55\"\n\
         \x20 server = \"192.0.2.1\"\n\
         \x20 port = \"443\"\n\
         \x20 ca-file = \"/etc/kubernetes/vcenter-ca.crt\"\n\
         \x20 thumbprint = \"AA:BB:CC:DD:EE:FF:00:11:22:33:44:55:66:77:88:99:AA:BB:CC:DD\"\n\
         \x20 soap-roundtrip-count = \"\"\n\
         \x20 secret-name = \"\"\n\
         \x20 secret-namespace = \"\"\n\
         \x20 ip-family = \"ipv4\"\n\
         \n\
         [VirtualCenter \"192.0.2.1\"]\n\
         \x20 user = \"vc@vsphere.local\"\n\
         \x20 password = \"vc-pa55\"\n\
         \x20 port = \"443\"\n\
         \x20 datacenters = \"dc-1\"\n\
         \x20 soap-roundtrip-count = \"1\"\n\
         \x20 thumbprint = \"\"\n\
         \x20 secret-name = \"\"\n\
         \x20 secret-namespace = \"\"\n\
         \n\
         [Labels]\n\
         \x20 region = k8s-region\n\
         \x20 zone = k8s-zone\n\
         \n\
         [Nodes]\n\
         \x20 internal-network-subnet-cidr = \"192.0.2.0/24\"\n\
         \x20 external-network-subnet-cidr = \"198.51.100.0/24\"\n",
    );
    assert!(c.config_warnings().is_empty(), "{:?}", c.config_warnings());
    assert_eq!(c.vcenters.len(), 1);
    assert_eq!(c.labels.zone.as_deref(), Some("k8s-zone"));
}

/// What upstream's gcfg skips, this reader skips with a warning naming it, never the value.
#[test]
fn unknown_keys_and_sections_are_skipped_with_a_warning_naming_them_as_upstream() {
    let c = parse(
        "[Global]\nuser = u\npassword = \"Zq7secret\"\nprot = 443\nZq7bare\n\
         [Bogus]\nkey = Zq7x\n[Global \"x\"]\nport = 1\n[VirtualCenter \"192.0.2.9\"]\n\
         pasword = Zq7secret\n",
    );
    assert_eq!(c.vcenters[0].port, 443);
    let w = c.config_warnings();
    assert_eq!(w.len(), 5, "{w:?}");
    assert!(w[0].contains("unknown key [Global] prot (line 4)"), "{w:?}");
    assert!(w[1].contains("[Global] on line 5"), "{w:?}");
    assert!(w[2].contains("unknown section [Bogus] (line 6)"), "{w:?}");
    assert!(w[3].contains("[Global \"x\"] (line 8)"), "{w:?}");
    assert!(w[4].contains("unknown key [VirtualCenter \"192.0.2.9\"] pasword (line 11)"), "{w:?}");
    assert!(!w.join(" ").contains("Zq7"), "a value is shown: {w:?}");
    // Malformed syntax stays fatal, naming the line and not its text.
    let e = Config::parse(b"[Global]\nuser = u\npassword: Zq7secret\n", &BTreeMap::new())
        .unwrap_err()
        .to_string();
    assert!(e.contains("line 3") && !e.contains("Zq7"), "{e}");
}
