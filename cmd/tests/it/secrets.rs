//! No credential in any log, at the most verbose level (issue #11 point 3): each binary runs
//! at `-v=10` through the paths most likely to print one (start-up, node initialisation,
//! rejected credentials, config errors next to the password; for AWS also
//! `ecr-credential-provider`), and every process's stdout, stderr and log is scanned for the
//! credentials the test gave it (`crate::support`'s secret scanner: the scan runs when each
//! manager's guard is dropped and before `run_to_exit` returns, so a leak fails the test).

/// The most verbose level: debug for every library, trace for the manager.
const V10: &str = "-v=10";

/// `-v=10` with JSON logs: each line carries its verbosity (`"v"`), which klog's text format
/// does not show (the scanner also looks for each secret JSON-escaped).
fn v10() -> Vec<String> {
    vec![V10.to_string(), "--logging-format=json".to_string()]
}

/// The manager really ran at high verbosity (otherwise the scan proves little): some JSON log
/// line has `"v"` of 2 (our crates' debug) or more.
fn assert_verbose(log: &str) {
    let verbose = log
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("v").and_then(serde_json::Value::as_u64))
        .filter(|&v| v >= 2)
        .count();
    assert!(verbose > 0, "no debug output (\"v\" >= 2) at {V10}:\n{log}");
}

/// The scanner itself: a registered credential in a process's output fails the check, and
/// the failure names the process and the kind, never the value.
#[test]
fn the_scanner_names_the_process_and_kind_of_a_leak_but_never_the_value() {
    use crate::support::{SecretKind, assert_no_secrets, register_secret, secrets_in};
    const TOKEN: &str = "scanner-self-test-bearer-9f3c2e";
    register_secret(SecretKind::BearerToken, TOKEN);
    assert_eq!(
        secrets_in(&format!("GET / Authorization: Bearer {TOKEN}")),
        [SecretKind::BearerToken]
    );
    assert_no_secrets("clean-process", "nothing to see");
    let failure = std::panic::catch_unwind(|| {
        assert_no_secrets("leaky-process", &format!("token={TOKEN}"));
    })
    .expect_err("a leak fails the check");
    let message = failure.downcast_ref::<String>().cloned().unwrap_or_default();
    assert!(message.contains("leaky-process") && message.contains("BearerToken"), "{message}");
    assert!(!message.contains(TOKEN), "the failure prints the secret: {message}");

    // A secret with a quote and a backslash is found as klog's text format (Go's %q) and the
    // JSON format write it, escaped, inside a longer value.
    const QUOTED: &str = "scanner-self-test-pa\"ss\\word-7d1e";
    register_secret(SecretKind::VspherePassword, QUOTED);
    let escaped = r#"scanner-self-test-pa\"ss\\word-7d1e"#;
    assert!(!escaped.contains(QUOTED));
    assert_eq!(
        secrets_in(&format!(
            r#"I1128 10:30:33.407016   20912 x.rs:1] "login" url="{escaped}@host""#
        )),
        [SecretKind::VspherePassword]
    );
    assert_eq!(
        secrets_in(&format!(r#"{{"ts":1.0,"msg":"login","url":"{escaped}@host"}}"#)),
        [SecretKind::VspherePassword]
    );
}

#[cfg(feature = "provider-vsphere")]
mod vsphere {
    use ccm_testbed::vcsim::Vcsim;

    use super::{assert_verbose, v10};
    use crate::support::{Env, SecretKind, initialised, register, register_secret};
    use crate::vsphere::{BIN, LABELS, PASSWORD, one_vcenter};

    const USER: &str = "administrator@vsphere.local";

    /// Config errors next to the password (wrong-typed value, syntax error, unknown key, in
    /// YAML and legacy INI): the manager exits naming the line and key, and its output holds
    /// no password.
    #[tokio::test]
    async fn config_errors_at_v10_name_the_key_and_never_print_the_password() {
        let dir = tempfile::tempdir().unwrap();
        let vc = "vcenter:\n  vc1:\n    server: 127.0.0.1\n";
        let cases = [
            (
                "wrong-typed value",
                format!("global:\n  user: {USER}\n  password: \"{PASSWORD}\"\n  port: [443]\n{vc}"),
                &["YAML", "line 4", "global.port"][..],
            ),
            (
                "syntax error",
                format!("global:\n  user: {USER}\n password: \"{PASSWORD}\"\n{vc}"),
                &["YAML", "line 3", "global.password"][..],
            ),
            (
                "unknown key",
                format!(
                    "global:\n  user: {USER}\n  password: \"{PASSWORD}\"\n  insecure: true\n{vc}"
                ),
                &["YAML", "line 4", "global.insecure", "unknown field"][..],
            ),
            (
                "unclosed quote in the password",
                format!("global:\n  user: {USER}\n  password: \"{PASSWORD}\n{vc}"),
                &["YAML", "line 3"][..],
            ),
            (
                // An unknown key is only a warning now (as upstream's gcfg): a header left
                // unterminated is the INI error here.
                "legacy INI, malformed section header",
                format!(
                    "[Global]\nuser = \"{USER}\"\npassword = \"{PASSWORD}\"\nprot = 443\n\n[VirtualCenter \"127.0.0.1\"\n"
                ),
                &["INI", "line 6"][..],
            ),
        ];
        for (what, config, wanted) in cases {
            // The scan of stdout and stderr happens inside run_to_exit_with.
            let (code, stderr) = BIN.run_to_exit_with(dir.path(), &config, &v10()).await;
            assert_eq!(code, Some(1), "{what}: {stderr}");
            for w in wanted {
                assert!(stderr.contains(w), "{what}: {w:?} missing in:\n{stderr}");
            }
            eprintln!("{what}: {}", stderr.lines().last().unwrap_or_default());
        }
    }

    /// Start, node initialisation (login, searches, tags) with the right password, then a
    /// manager with a wrong password that vCenter rejects: nothing prints either password.
    #[tokio::test]
    async fn start_node_init_and_rejected_login_at_v10_never_print_the_password() {
        let sim = Vcsim::start_with_login(USER, PASSWORD);
        sim.guest("DC0_H0_VM0", "node-ok", &[("VM Network", &["10.0.0.10"])]);
        sim.guest("DC0_H0_VM1", "node-refused", &[("VM Network", &["10.0.0.11"])]);
        sim.tag("k8s-region", "region-1", "DC0");
        sim.tag("k8s-zone", "zone-1", "DC0_H0");
        let env = Env::start(BIN).await;
        let _logs = env.cp.log_guard();
        let nodes = env.nodes();

        let ccm = env.spawn_ccm(&one_vcenter(&sim), &v10());
        register(&nodes, "node-ok", "10.0.0.10", "True").await;
        initialised(&nodes, "node-ok").await;
        ccm.wait_for_log("logged in to vCenter", 1).await;
        let log = ccm.logs();
        assert_verbose(&log);
        eprintln!("right password: {} log lines scanned", log.lines().count());
        drop(ccm); // scans its output

        const WRONG: &str = "vc-e2e-WrongPa55/never-logged";
        register_secret(SecretKind::VspherePassword, WRONG);
        let config = format!(
            "global:\n  user: {USER}\n  password: \"{WRONG}\"\n  insecureFlag: true\nvcenter:\n{}{LABELS}",
            sim.vcenter_yaml("vc1")
        );
        let ccm = env.spawn_ccm(&config, &v10());
        register(&nodes, "node-refused", "10.0.0.11", "True").await;
        ccm.wait_for_log("InvalidLogin", 2).await;
        let log = ccm.logs();
        assert_verbose(&log);
        eprintln!("wrong password: {} log lines scanned", log.lines().count());
        drop(ccm);

        // Controllers acting as their own ServiceAccounts: the manager mints bearer tokens
        // (registered and scanned for when the guard is dropped).
        let ccm = env.spawn_ccm(
            &one_vcenter(&sim),
            &[v10(), vec!["--use-service-account-credentials".to_string()]].concat(),
        );
        ccm.wait_for_log("acts as its own ServiceAccount", 2).await;
        let log = ccm.logs();
        assert_verbose(&log);
        eprintln!("service account credentials: {} log lines scanned", log.lines().count());
        drop(ccm);
    }
}

#[cfg(all(feature = "provider-aws", feature = "testing"))]
mod aws {
    use std::io::Write as _;
    use std::process::{Command, Stdio};

    use ccm_provider_aws::testing::{self, network, run_instances};
    use ccm_testbed::moto::Moto;

    use super::{V10, assert_verbose, v10};
    use crate::support::{
        Binary, Env, assert_no_secrets, aws_test_credentials, initialised, register,
    };

    const BIN: Binary = crate::support::AWS_BIN;

    const ECR_PLUGIN: &str = env!("CARGO_BIN_EXE_ecr-credential-provider");

    /// Runs `ecr-credential-provider` at `-v=10` (and `RUST_LOG=trace`) with one request on
    /// stdin, as the kubelet does; its stderr is scanned here, its stdout by the caller.
    fn run_ecr_plugin(moto_url: &str, request: &str) -> std::process::Output {
        let mut cmd = Command::new(ECR_PLUGIN);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("AWS_") {
                cmd.env_remove(&k);
            }
        }
        let mut child = cmd
            .arg(V10)
            .env("RUST_LOG", "trace")
            .env("AWS_ENDPOINT_URL", moto_url)
            .envs(aws_test_credentials())
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        child.stdin.take().unwrap().write_all(request.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        assert_no_secrets(
            "ecr-credential-provider (stderr)",
            &String::from_utf8_lossy(&out.stderr),
        );
        out
    }

    fn request(image: &str) -> String {
        serde_json::json!({
            "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
            "kind": "CredentialProviderRequest",
            "image": image,
        })
        .to_string()
    }

    /// The manager at `-v=10` through start and node initialisation, then the kubelet plugin
    /// through a token answer, a refused image and a malformed request carrying a token:
    /// neither prints the AWS secret key, the session token, the kubeconfig's client key or
    /// a registry/bearer token (except the answer itself, on stdout).
    #[tokio::test]
    async fn manager_and_ecr_credential_provider_at_v10_never_print_credentials() {
        const CLUSTER: &str = "e2e-secrets";
        let moto = Moto::start().await.unwrap();
        let ec2 = testing::ec2(&moto.url).await;
        let net = network(&ec2, CLUSTER).await.unwrap();
        let vm = run_instances(&ec2, &net.subnets[0].0, CLUSTER, 1, None).await.unwrap().remove(0);
        let name = vm.private_dns_name().unwrap().to_string();
        let ip = vm.private_ip_address().unwrap().to_string();

        let env = Env::start(BIN).await;
        let _logs = env.cp.log_guard();
        let mut args = v10();
        args.push("--configure-cloud-routes=false".into());
        let ccm = env.spawn_ccm(&testing::cloud_config(&moto.url, CLUSTER, ""), &args);
        let nodes = env.nodes();
        register(&nodes, &name, &ip, "True").await;
        initialised(&nodes, &name).await;
        let log = ccm.logs();
        assert_verbose(&log);
        eprintln!("aws manager: {} log lines scanned", log.lines().count());
        drop(ccm); // scans its output

        let image = "123456789012.dkr.ecr.us-east-1.amazonaws.com/app:v1";
        let out = run_ecr_plugin(&moto.url, &request(image));
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        // stdout is the answer: the registry password is meant to be there, nothing else.
        assert_no_secrets(
            "ecr-credential-provider (stdout)",
            &String::from_utf8_lossy(&out.stdout),
        );
        let resp: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let token = resp["auth"]["123456789012.dkr.ecr.us-east-1.amazonaws.com"]["password"]
            .as_str()
            .unwrap()
            .to_string();
        // The registry token it minted is the answer, on stdout only. (Checked here, not
        // registered: other tests legitimately receive moto's token on stdout.)
        assert!(token.len() >= 12, "{resp}");
        assert!(
            !String::from_utf8_lossy(&out.stderr).contains(&token),
            "ecr-credential-provider wrote the registry token (BearerToken) to stderr"
        );

        for (what, req) in [
            (
                "not an ECR image, with a service account token",
                serde_json::json!({
                    "apiVersion": "credentialprovider.kubelet.k8s.io/v1",
                    "kind": "CredentialProviderRequest",
                    "image": "docker.io/library/nginx",
                    "serviceAccountToken": token,
                })
                .to_string(),
            ),
            (
                "malformed request",
                format!("{{\"image\": 7, \"serviceAccountToken\": \"{token}\"}}"),
            ),
        ] {
            let out = run_ecr_plugin(&moto.url, &req);
            assert!(!out.status.success(), "{what}");
            let output = format!(
                "{}{}",
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
            assert_no_secrets(&format!("ecr-credential-provider ({what})"), &output);
            assert!(
                !output.contains(&token),
                "{what}: the request's token is echoed (BearerToken)"
            );
            eprintln!("{what}: {}", String::from_utf8_lossy(&out.stderr).trim());
        }
    }
}

#[cfg(feature = "provider-ibm")]
mod ibm {
    use std::time::Duration;

    use super::{assert_verbose, v10};
    use crate::ibm::{BIN, cloud_config, emulator};
    use crate::support::{Env, SecretKind, initialised, register, register_secret};

    /// Start-up, a node looked up in the VPC (token exchange, VPC calls) and a rejected API
    /// key, all at `-v=10`: the manager's output never holds the API key (scanned when each
    /// manager's guard is dropped).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn start_node_init_and_a_rejected_key_at_v10_never_print_the_api_key() {
        let (cloud, server) = emulator(Duration::from_millis(300)).await;
        let env = Env::start(BIN).await;
        let _logs = env.cp.log_guard();
        let config = cloud_config(&env.dir, &server.url(), &cloud.account_id());
        let nodes = env.nodes();
        {
            let ccm = env.spawn_ccm(&config, &v10());
            register(&nodes, "node-a", "10.240.0.4", "True").await;
            initialised(&nodes, "node-a").await;
            assert_verbose(&ccm.logs());
        }
        // IAM refuses the key now in the file: the node waits, the error is logged, and
        // neither key is printed.
        const WRONG: &str = "ibm-e2e-Wrong-ApiKey-never-logged-3Vd8";
        register_secret(SecretKind::IbmApiKey, WRONG);
        std::fs::write(env.dir.join("api-key"), WRONG).unwrap();
        let ccm = env.spawn_ccm(&config, &v10());
        register(&nodes, "node-b", "10.240.1.4", "True").await;
        ccm.wait_for_log("not authorized", 1).await;
        assert_verbose(&ccm.logs());
    }
}
