//! The provider as the manager builds it: config → vCenters, several vCenters, start-up
//! failures.

use std::collections::BTreeMap;

use ccm_core::cloud::{CloudProvider, InstancesV2};
use ccm_provider_vsphere::VsphereProvider;
use ccm_provider_vsphere::client::Secret;
use ccm_provider_vsphere::config::CredentialSources;

use crate::node;
use crate::sim::Vcsim;

#[tokio::test]
async fn two_vcenters_in_one_config_both_serve_nodes() {
    let (a, b) = (Vcsim::start(), Vcsim::start());
    a.guest("DC0_H0_VM0", "node-in-a", &[("VM Network", &["10.1.0.1"])]);
    b.guest("DC0_C0_RP0_VM1", "node-in-b", &[("VM Network", &["10.2.0.1"])]);
    a.tag("k8s-zone", "zone-a", "DC0_H0");
    a.tag("k8s-region", "region-a", "DC0");
    b.tag("k8s-zone", "zone-b", "DC0_C0");
    b.tag("k8s-region", "region-b", "DC0");
    // Credentials per vCenter from the Secret (`<vc>.username` / `<vc>.password`).
    let config = format!(
        "global:\n  insecureFlag: true\n  secretName: vsphere-creds\n  secretNamespace: kube-system\n\
         vcenter:\n{}{}labels:\n  zone: k8s-zone\n  region: k8s-region\n",
        a.vcenter_yaml("vc-a"),
        b.vcenter_yaml("vc-b")
    );
    let mut sources = CredentialSources::default();
    for vc in ["vc-a", "vc-b"] {
        sources.secret_data.insert(format!("{vc}.username"), Secret::new("admin"));
        sources.secret_data.insert(format!("{vc}.password"), Secret::new("pw"));
    }
    let provider = VsphereProvider::new(config.as_bytes(), &sources).unwrap();
    assert_eq!(provider.name(), "vsphere");
    assert!(provider.load_balancer().is_none() && provider.routes().is_none());
    let instances = provider.instances_v2().unwrap();

    let in_a = instances.instance_metadata(&node("node-in-a", None)).await.unwrap();
    assert_eq!(in_a.provider_id, format!("vsphere://{}", a.vm("DC0_H0_VM0").uuid));
    assert_eq!((in_a.zone.as_str(), in_a.region.as_str()), ("zone-a", "region-a"));
    let in_b = instances.instance_metadata(&node("node-in-b", None)).await.unwrap();
    assert_eq!(in_b.provider_id, format!("vsphere://{}", b.vm("DC0_C0_RP0_VM1").uuid));
    assert_eq!((in_b.zone.as_str(), in_b.region.as_str()), ("zone-b", "region-b"));

    // One vCenter down: nodes of the other are still answered; an instance found nowhere is
    // an error (it could be on the unreachable vCenter), never "gone".
    b.pause();
    let uuid_only_in_a = format!("vsphere://{}", a.vm("DC0_H0_VM0").uuid);
    assert!(instances.instance_exists(&node("x", Some(&uuid_only_in_a))).await.unwrap());
    assert!(instances.instance_metadata(&node("node-in-a", None)).await.is_ok());
    let nowhere = node("nowhere", Some("vsphere://00000000-0000-0000-0000-000000000000"));
    let err = instances.instance_exists(&nowhere).await.unwrap_err();
    assert!(err.to_string().contains("vc-b"), "{err}");
    b.resume();
    assert!(!instances.instance_exists(&nowhere).await.unwrap());
}

#[test]
fn bad_configs_and_missing_credentials_fail_at_start_with_the_key_named() {
    let sources = CredentialSources::default();
    let err = |config: &str, sources: &CredentialSources| {
        VsphereProvider::new(config.as_bytes(), sources).expect_err("must fail").to_string()
    };
    let e = err("global:\n  server: vc\n  user: u\n  password: p\n  insecure: true\n", &sources);
    assert!(e.contains("YAML") && e.contains("insecure"), "{e}");
    let e =
        err("[Global]\nserver = vc\nuser = u\npassword = p\ninsecure-flag = perhaps\n", &sources);
    assert!(e.contains("[Global] insecure-flag"), "{e}");
    // An unknown INI section is skipped with a warning naming it, as upstream's gcfg
    // (FatalOnly) skips it (issue #30); the provider still starts and reports the warning for
    // the manager's CloudConfigWarning Event.
    let p = VsphereProvider::new(
        b"[Global]\nserver = vc\nuser = u\npassword = p\n[Labls]\nzone = z\n",
        &sources,
    )
    .expect("an unknown section is not fatal");
    let warnings = p.config_warnings();
    assert!(warnings.len() == 1 && warnings[0].contains("Labls"), "{warnings:?}");
    let e = err("vcenter:\n  vc1:\n    server: 10.0.0.1\n", &sources);
    assert!(e.contains("no user name for vCenter vc1") && e.contains("vc1.username"), "{e}");
    let e = err("[VirtualCenter \"10.0.0.1\"]\nuser = u\n", &sources);
    assert!(e.contains("no password for vCenter 10.0.0.1"), "{e}");

    // Without any cloud config (and no VSPHERE_VCENTER) there is nothing to connect to.
    let e = VsphereProvider::new(b"", &sources).expect_err("must fail").to_string();
    assert!(e.contains("no vCenter configured"), "{e}");

    // Environment credentials are enough, and never printed.
    let env: BTreeMap<String, String> = [("VSPHERE_USER", "u"), ("VSPHERE_PASSWORD", "hunter2")]
        .map(|(k, v)| (k.into(), v.into()))
        .into();
    let sources = CredentialSources { env, ..Default::default() };
    let provider = VsphereProvider::new(b"global:\n  server: 10.0.0.1\n", &sources).unwrap();
    assert!(!format!("{provider:?}").contains("hunter2"));
}

#[tokio::test]
async fn a_missing_tag_category_is_reported_not_silently_ignored() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-a", &[("VM Network", &["10.0.0.5"])]);
    sim.tag("k8s-zone", "zone-a", "DC0_H0");
    let config = format!(
        "global:\n  user: u\n  password: p\n  insecureFlag: true\nvcenter:\n{}labels:\n  zone: k8s-zone\n  region: no-such-category\n",
        sim.vcenter_yaml("vc1")
    );
    let provider = VsphereProvider::new(config.as_bytes(), &CredentialSources::default()).unwrap();
    let instances: std::sync::Arc<dyn InstancesV2> = provider.instances_v2().unwrap();
    let err = instances.instance_metadata(&node("node-a", None)).await.unwrap_err();
    assert!(err.to_string().contains("no-such-category"), "{err}");
}

#[tokio::test]
async fn skip_node_deletion_keeps_nodes_whose_vm_is_gone() {
    let sim = Vcsim::start();
    let config = format!(
        "global:\n  user: u\n  password: p\n  insecureFlag: true\nvcenter:\n{}",
        sim.vcenter_yaml("vc1")
    );
    let env: BTreeMap<String, String> =
        [("SKIP_NODE_DELETION".to_string(), "true".to_string())].into();
    let sources = CredentialSources { env, ..Default::default() };
    let instances =
        VsphereProvider::new(config.as_bytes(), &sources).unwrap().instances_v2().unwrap();
    let gone = node("gone", Some("vsphere://00000000-0000-0000-0000-000000000000"));
    assert!(instances.instance_exists(&gone).await.unwrap());
    assert_eq!(
        instances.instance_status_batch(std::slice::from_ref(&gone)).await[0].as_ref().unwrap(),
        &ccm_core::cloud::InstanceStatus::Running
    );
}
