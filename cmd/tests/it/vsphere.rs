//! `cloud-controller-manager-vsphere` end to end (issue 7 acceptance): vcsim VMs become
//! initialised Nodes; power-off, destroy and a vCenter outage as the lifecycle controller
//! sees them; two vCenters in one config; start-up failures. Every manager's output is
//! scanned for the vCenter passwords (`crate::support`'s secret scanner).

use std::time::Instant;

use ccm_core::names;
use ccm_testbed::vcsim::Vcsim;

use crate::support::{
    Binary, Env, SecretKind, addresses, has_taint, initialised, label, pairs, provider_id,
    register, register_secret, wait_for,
};

pub const BIN: Binary = Binary {
    path: env!("CARGO_BIN_EXE_cloud-controller-manager-vsphere"),
    provider: "vsphere",
    clear_prefixes: &["VSPHERE_"],
    env: &[],
};

/// The tag categories the configs below map to zone and region.
pub const LABELS: &str = "labels:\n  zone: k8s-zone\n  region: k8s-region\n";

/// The vCenter password of these tests: distinctive, so that the secret scanner finds it
/// wherever it is printed.
pub const PASSWORD: &str = "vc-e2e-Pa55w0rd/never-logged";

/// The lifecycle controller's log line for a node whose instance could not be checked.
const CHECK_ERROR: &str = "error checking if node exists";

pub fn one_vcenter(sim: &Vcsim) -> String {
    format!(
        "global:\n  user: administrator@vsphere.local\n  password: \"{PASSWORD}\"\n  insecureFlag: true\nvcenter:\n{}{LABELS}",
        sim.vcenter_yaml("vc1")
    )
}

#[tokio::test]
async fn vcsim_vms_become_nodes_with_provider_id_addresses_and_zone_labels() {
    let sim = Vcsim::start();
    // A VM on a standalone host (zone tagged on the host) and one in a cluster (zone tagged
    // on the cluster); the region is tagged on the datacenter.
    sim.guest("DC0_H0_VM0", "node-host", &[("VM Network", &["10.0.0.10"])]);
    sim.guest("DC0_C0_RP0_VM0", "node-cluster", &[("VM Network", &["10.0.1.10"])]);
    sim.tag("k8s-region", "region-1", "DC0");
    sim.tag("k8s-zone", "zone-host", "DC0_H0");
    sim.tag("k8s-zone", "zone-cluster", "DC0_C0");
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm(&one_vcenter(&sim), &[]);
    let nodes = env.nodes();

    let start = Instant::now();
    register(&nodes, "node-host", "10.0.0.10", "True").await;
    register(&nodes, "node-cluster", "10.0.1.10", "True").await;
    let host = initialised(&nodes, "node-host").await;
    let cluster = initialised(&nodes, "node-cluster").await;
    eprintln!("2 nodes initialised {:?} after registration", start.elapsed());

    for (n, vm, ip, zone) in [
        (&host, "DC0_H0_VM0", "10.0.0.10", "zone-host"),
        (&cluster, "DC0_C0_RP0_VM0", "10.0.1.10", "zone-cluster"),
    ] {
        let name = n.metadata.name.as_deref().unwrap();
        let log = ccm.logs();
        assert_eq!(
            provider_id(n),
            Some(format!("vsphere://{}", sim.vm(vm).uuid).as_str()),
            "{name}; manager log:\n{log}"
        );
        assert_eq!(
            addresses(n),
            pairs(&[("Hostname", name), ("InternalIP", ip), ("ExternalIP", ip)]),
            "{name}"
        );
        assert_eq!(label(n, names::LABEL_ZONE), Some(zone), "{name}");
        assert_eq!(label(n, names::LABEL_REGION), Some("region-1"), "{name}");
        let instance_type = label(n, names::LABEL_INSTANCE_TYPE).unwrap_or_default();
        assert!(instance_type.starts_with("vsphere-vm.cpu-"), "{name}: {instance_type:?}");
        // Upstream's guest-OS short name (vcsim's VMs are `otherGuest`).
        assert!(instance_type.ends_with("gb.os-other"), "{name}: {instance_type:?}");
    }
}

#[tokio::test]
async fn power_off_taints_destroy_deletes_and_a_vcenter_outage_deletes_nothing() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-off", &[("VM Network", &["10.0.0.10"])]);
    sim.guest("DC0_H0_VM1", "node-gone", &[("VM Network", &["10.0.0.11"])]);
    sim.guest("DC0_C0_RP0_VM0", "node-kept", &[("VM Network", &["10.0.1.10"])]);
    sim.guest("DC0_C0_RP0_VM1", "node-late", &[("VM Network", &["10.0.1.11"])]);
    sim.tag("k8s-region", "region-1", "DC0");
    sim.tag("k8s-zone", "zone-a", "DC0_H0");
    sim.tag("k8s-zone", "zone-b", "DC0_C0");
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm(&one_vcenter(&sim), &[]);
    let nodes = env.nodes();
    // The kubelets have stopped posting Ready: the lifecycle controller checks these nodes.
    for (name, ip) in
        [("node-off", "10.0.0.10"), ("node-gone", "10.0.0.11"), ("node-kept", "10.0.1.10")]
    {
        register(&nodes, name, ip, "False").await;
    }
    for name in ["node-off", "node-gone", "node-kept"] {
        initialised(&nodes, name).await;
    }

    // Powered off: the NotReady node gets the shutdown taint (and is kept).
    let start = Instant::now();
    sim.power_off("DC0_H0_VM0");
    let off = wait_for("the shutdown taint on node-off", || async {
        let n = nodes.get("node-off").await.ok()?;
        has_taint(&n, names::TAINT_SHUTDOWN).then_some(n)
    })
    .await;
    eprintln!("shutdown taint {:?} after power-off", start.elapsed());
    let taint = off.spec.unwrap().taints.unwrap();
    let taint = taint.iter().find(|t| t.key == names::TAINT_SHUTDOWN).unwrap();
    assert_eq!(taint.effect, "NoSchedule");

    // Destroyed: the node is deleted.
    let start = Instant::now();
    sim.destroy("DC0_H0_VM1");
    wait_for("node-gone to be deleted", || async {
        nodes.get_opt("node-gone").await.unwrap().is_none().then_some(())
    })
    .await;
    eprintln!("node deleted {:?} after its VM was destroyed", start.elapsed());

    // vCenter unreachable: every pass logs errors and deletes nothing; a node registered
    // meanwhile waits, uninitialised.
    let errors_before = ccm.logs().matches(CHECK_ERROR).count();
    sim.pause();
    register(&nodes, "node-late", "10.0.1.11", "True").await;
    ccm.wait_for_log(CHECK_ERROR, errors_before + 6).await;
    let log = ccm.logs();
    let outage_errors: Vec<&str> =
        log.lines().filter(|l| l.contains(CHECK_ERROR)).skip(errors_before).collect();
    assert!(
        outage_errors.iter().all(|l| l.contains("vc1")),
        "the errors name the unreachable vCenter: {outage_errors:#?}"
    );
    for name in ["node-off", "node-kept"] {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} deleted during the outage");
    }
    let late = nodes.get("node-late").await.unwrap();
    assert!(has_taint(&late, names::TAINT_UNINITIALIZED), "initialised without a vCenter?");
    assert!(provider_id(&late).is_none());

    // vCenter back: the waiting node is initialised, nothing was lost.
    let start = Instant::now();
    sim.resume();
    let late = initialised(&nodes, "node-late").await;
    eprintln!("node registered during the outage initialised {:?} after resume", start.elapsed());
    assert_eq!(
        provider_id(&late),
        Some(format!("vsphere://{}", sim.vm("DC0_C0_RP0_VM1").uuid).as_str())
    );
    assert_eq!(label(&late, names::LABEL_ZONE), Some("zone-b"));
    for name in ["node-off", "node-kept"] {
        assert!(nodes.get_opt(name).await.unwrap().is_some(), "{name} deleted after the outage");
    }
    assert!(has_taint(&nodes.get("node-off").await.unwrap(), names::TAINT_SHUTDOWN));
}

#[tokio::test]
async fn two_vcenters_in_one_config_both_serve_nodes() {
    let (a, b) = (Vcsim::start(), Vcsim::start());
    a.guest("DC0_H0_VM0", "node-in-a", &[("VM Network", &["10.1.0.1"])]);
    b.guest("DC0_C0_RP0_VM1", "node-in-b", &[("VM Network", &["10.2.0.1"])]);
    a.tag("k8s-region", "region-a", "DC0");
    a.tag("k8s-zone", "zone-a", "DC0_H0");
    b.tag("k8s-region", "region-b", "DC0");
    b.tag("k8s-zone", "zone-b", "DC0_C0");
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    // Credentials per vCenter as files in secretsDirectory (`<vc>.username`/`<vc>.password`).
    let secrets = env.dir.join("secrets");
    std::fs::create_dir(&secrets).unwrap();
    for vc in ["vc-a", "vc-b"] {
        std::fs::write(secrets.join(format!("{vc}.username")), "admin\n").unwrap();
        let password = format!("pw-{vc}-e2e-never-logged");
        register_secret(SecretKind::VspherePassword, &password);
        std::fs::write(secrets.join(format!("{vc}.password")), format!("{password}\n")).unwrap();
    }
    let config = format!(
        "global:\n  insecureFlag: true\n  secretsDirectory: {}\nvcenter:\n{}{}{LABELS}",
        secrets.display(),
        a.vcenter_yaml("vc-a"),
        b.vcenter_yaml("vc-b")
    );
    let _ccm = env.spawn_ccm(&config, &[]);
    let nodes = env.nodes();
    register(&nodes, "node-in-a", "10.1.0.1", "True").await;
    register(&nodes, "node-in-b", "10.2.0.1", "True").await;

    for (name, sim, vm, ip, zone, region) in [
        ("node-in-a", &a, "DC0_H0_VM0", "10.1.0.1", "zone-a", "region-a"),
        ("node-in-b", &b, "DC0_C0_RP0_VM1", "10.2.0.1", "zone-b", "region-b"),
    ] {
        let n = initialised(&nodes, name).await;
        assert_eq!(provider_id(&n), Some(format!("vsphere://{}", sim.vm(vm).uuid).as_str()));
        assert_eq!(addresses(&n)[1], ("InternalIP".to_string(), ip.to_string()), "{name}");
        assert_eq!(label(&n, names::LABEL_ZONE), Some(zone), "{name}");
        assert_eq!(label(&n, names::LABEL_REGION), Some(region), "{name}");
    }
}

#[tokio::test]
async fn bad_config_and_missing_credentials_fail_at_start_with_a_clear_message() {
    let dir = tempfile::tempdir().unwrap();

    // Not YAML (a mis-indented key): the message names the format and the line.
    let (code, stderr) =
        BIN.run_to_exit(dir.path(), &format!("global:\n  user: u\n password: {PASSWORD}\n")).await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("error: cloud provider could not be initialized"), "{stderr}");
    assert!(
        stderr.contains("vSphere cloud config (YAML)") && stderr.contains("line 3"),
        "{stderr}"
    );

    // A misspelt key (upstream's `insecureFlag`) is an error naming the key, not ignored.
    let (code, stderr) = BIN.run_to_exit(
        dir.path(),
        &format!("global:\n  user: u\n  password: {PASSWORD}\n  insecure: true\nvcenter:\n  vc1:\n    server: 127.0.0.1\n"),
    )
    .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("YAML") && stderr.contains("insecure"), "{stderr}");

    // No credentials anywhere: the message says which vCenter and where they may come from.
    let (code, stderr) = BIN
        .run_to_exit(
            dir.path(),
            "global:\n  insecureFlag: true\nvcenter:\n  vc1:\n    server: 127.0.0.1\n",
        )
        .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no user name for vCenter vc1"), "{stderr}");
    assert!(stderr.contains("vc1.username") && stderr.contains("VSPHERE_USER"), "{stderr}");

    // A user but no password.
    let (code, stderr) = BIN
        .run_to_exit(
            dir.path(),
            "global:\n  user: u\n  insecureFlag: true\nvcenter:\n  vc1:\n    server: 127.0.0.1\n",
        )
        .await;
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("no password for vCenter vc1"), "{stderr}");
}

/// Issue #13/#14: credentials only in the Secret named by `secretName`/`secretNamespace`
/// (upstream's release manifest): the manager starts, reads the Secret through the API
/// (keys `<vcenter server>.username`/`.password`) and initialises the Node.
#[tokio::test]
async fn credentials_from_the_secret_named_in_the_config_are_read_through_the_api() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-secret", &[("VM Network", &["10.0.0.10"])]);
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    create_credentials_secret(&env, "pw-from-secret-e2e/never-logged").await;
    let config = secret_only_config(&sim);
    let ccm = env.spawn_ccm(&config, &[]);
    let nodes = env.nodes();

    let start = Instant::now();
    register(&nodes, "node-secret", "10.0.0.10", "True").await;
    let n = initialised(&nodes, "node-secret").await;
    eprintln!("node initialised {:?} after registration", start.elapsed());
    assert_eq!(
        provider_id(&n),
        Some(format!("vsphere://{}", sim.vm("DC0_H0_VM0").uuid).as_str()),
        "manager log:\n{}",
        ccm.logs()
    );
    assert!(!ccm.logs().contains("MissingCredentials"));
}

/// The Secret `kube-system/vsphere-creds` in upstream's format, for the vcsim at 127.0.0.1;
/// the password is registered with the secret scanner.
async fn create_credentials_secret(env: &Env, password: &str) {
    use k8s_openapi::api::core::v1::Secret;
    use kube::Api;
    use kube::api::PostParams;

    register_secret(SecretKind::VspherePassword, password);
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "vsphere-creds", "namespace": "kube-system"},
        "stringData": {
            "127.0.0.1.username": "administrator@vsphere.local",
            "127.0.0.1.password": password,
        },
    }))
    .unwrap();
    Api::<Secret>::namespaced(env.client.clone(), "kube-system")
        .create(&PostParams::default(), &secret)
        .await
        .unwrap();
}

/// A config whose only credentials source is the Secret `kube-system/vsphere-creds`.
fn secret_only_config(sim: &Vcsim) -> String {
    format!(
        "global:\n  insecureFlag: true\n  secretName: vsphere-creds\n  secretNamespace: kube-system\nvcenter:\n{}",
        sim.vcenter_yaml("vc1")
    )
}

/// Until the Secret can be read every instance call is an error naming it: a NotReady Node
/// is neither initialised nor deleted. Once the Secret exists the manager reads it (it
/// keeps retrying) and the Node is initialised.
#[tokio::test]
async fn a_missing_credentials_secret_deletes_nothing_and_is_read_once_created() {
    let sim = Vcsim::start();
    sim.guest("DC0_H0_VM0", "node-early", &[("VM Network", &["10.0.0.10"])]);
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let ccm = env.spawn_ccm(&secret_only_config(&sim), &[]);
    let nodes = env.nodes();
    register(&nodes, "node-early", "10.0.0.10", "False").await;

    ccm.wait_for_log("Secret kube-system/vsphere-creds not found", 5).await;
    let n = nodes.get("node-early").await.unwrap();
    assert!(has_taint(&n, names::TAINT_UNINITIALIZED), "initialised without credentials?");
    assert!(provider_id(&n).is_none());

    let start = Instant::now();
    create_credentials_secret(&env, "pw-late-secret-e2e/never-logged").await;
    let n = initialised(&nodes, "node-early").await;
    eprintln!("node initialised {:?} after the Secret was created", start.elapsed());
    assert_eq!(
        provider_id(&n),
        Some(format!("vsphere://{}", sim.vm("DC0_H0_VM0").uuid).as_str()),
        "manager log:\n{}",
        ccm.logs()
    );
}
