//! Issue #30 point 2: every flag of each upstream cloud-controller-manager binary (pinned
//! version) is accepted by ours. The flag lists are fixtures written from upstream's source
//! (`cmd/tests/fixtures/upstream-flags/`: `generic.txt`, the k8s.io/cloud-provider command every
//! upstream binary is built on, and one file per cloud with its own flags; each file names its
//! version and source files).
//!
//! Shared helpers for every cloud's test: [`upstream_flags`] reads the fixtures,
//! [`assert_each_flag_parses`] parses and validates each flag on its own with the provider's
//! [`Extensions`] (the command the binary builds), and [`assert_binary_takes_every_flag`] runs
//! the real binary once with every flag and `--help`.

use std::process::Command;

use ccm_core::manager::extensions::{Extensions, clap};

/// The generic flags (k8s.io/cloud-provider v0.36.0 and what it builds on).
pub const GENERIC: &str = include_str!("../fixtures/upstream-flags/generic.txt");

/// One upstream flag: name (`--x`), pflag value type, and the value to pass if the type's
/// sample would not do.
#[derive(Debug, Clone)]
pub struct UpstreamFlag {
    /// `--name`.
    pub name: String,
    /// pflag's type name (`bool`, `duration`, `stringSlice`, ...).
    pub kind: String,
    /// The value the fixture gives, if any.
    pub value: Option<String>,
    /// Arguments the flag needs next to it (the fixture's `+` words).
    pub with: Vec<String>,
}

/// The flags of `texts` (fixture files: `--name type [value]` lines, `#` comments), in order;
/// a `!--name` line removes a flag an earlier text listed (a binary without it).
pub fn upstream_flags(texts: &[&str]) -> Vec<UpstreamFlag> {
    let mut flags: Vec<UpstreamFlag> = Vec::new();
    for text in texts {
        for line in text.lines() {
            let line = line.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            if let Some(name) = line.strip_prefix('!') {
                let before = flags.len();
                flags.retain(|f| f.name != name);
                assert_eq!(flags.len() + 1, before, "fixture removes {name}, which is not listed");
                continue;
            }
            let mut words = line.split_whitespace();
            let (Some(name), Some(kind)) = (words.next(), words.next()) else {
                panic!("fixture line {line:?}: want `--name type [value]`");
            };
            assert!(name.starts_with("--"), "fixture line {line:?}");
            let rest: Vec<&str> = words.collect();
            flags.push(UpstreamFlag {
                name: name.to_string(),
                kind: kind.to_string(),
                value: rest.iter().find(|w| !w.starts_with('+')).map(|w| w.to_string()),
                with: rest.iter().filter_map(|w| w.strip_prefix('+')).map(str::to_string).collect(),
            });
        }
    }
    flags
}

/// The command-line argument for `flag` (`--name=value`, a value of its upstream type).
fn argument(flag: &UpstreamFlag, provider: &str) -> String {
    let value = match (flag.name.as_str(), flag.value.as_deref(), flag.kind.as_str()) {
        ("--cloud-provider", _, _) => provider,
        (_, Some(v), _) => v,
        (_, None, "bool" | "version") => "true",
        (_, None, "duration") => "10s",
        (_, None, "int" | "int32" | "Level") => "2",
        (_, None, "float32" | "float64") => "1.5",
        (_, None, "ip") => "127.0.0.1",
        (_, None, "int32Slice") => "23",
        (_, None, "quantity") => "0",
        (_, None, "namedCertKey") => "/etc/ccm/tls.crt,/etc/ccm/tls.key",
        (_, None, "pattern=N,...") => "controller*=4",
        (_, None, "stringToString") => "key=value",
        (_, None, _) => "value",
    };
    format!("{}={value}", flag.name)
}

/// Each flag on its own (with `--cloud-provider=<provider>`) parses with the manager's
/// command plus `extensions()`'s flags, and the command line validates. Lists every flag that
/// does not.
pub fn assert_each_flag_parses(
    provider: &str,
    extensions: impl Fn() -> Extensions,
    flags: &[UpstreamFlag],
) {
    assert!(flags.len() > 80, "only {} upstream flags read", flags.len());
    let mut failed = Vec::new();
    for flag in flags {
        let arg = argument(flag, provider);
        let ext = extensions();
        let mut argv = vec![format!("cloud-controller-manager-{provider}"), arg.clone()];
        if flag.name != "--cloud-provider" {
            argv.push(format!("--cloud-provider={provider}"));
        }
        argv.extend(flag.with.iter().cloned());
        let result = ccm_core::manager::parse_flags(&ext, argv)
            .map_err(|e| e.to_string())
            .and_then(|f| ext.validate(f, provider).map(|_| ()).map_err(|e| e.to_string()));
        if let Err(e) = result {
            failed.push(format!("{arg}: {}", e.lines().next().unwrap_or_default()));
        }
    }
    assert!(
        failed.is_empty(),
        "upstream flags refused by {provider}'s command:\n{}",
        failed.join("\n")
    );
}

/// The binary itself takes every flag at once (then `--help`: exits 0 without running), and
/// its `--help` names every flag its command does not hide.
pub fn assert_binary_takes_every_flag(
    binary: &str,
    provider: &str,
    extensions: impl Fn() -> Extensions,
    flags: &[UpstreamFlag],
) {
    let mut args: Vec<String> =
        flags.iter().filter(|f| f.name != "--version").map(|f| argument(f, provider)).collect();
    // A flag's companions (`with`) are in the list themselves.
    args.push("--help".into());
    let out = Command::new(binary).args(&args).output().expect("run the binary");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{binary} refused upstream's flags: {}{stdout}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ext = extensions();
    let cmd = <ccm_core::manager::flags::Flags as clap::CommandFactory>::command()
        .args(ext.flags.iter().cloned());
    let hidden: Vec<String> = cmd
        .get_arguments()
        .filter(|a| a.is_hide_set())
        .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
        .collect();
    let missing: Vec<&str> = flags
        .iter()
        .map(|f| f.name.as_str())
        .filter(|n| !hidden.iter().any(|h| h == n))
        .filter(|n| !names_flag(&stdout, n))
        .collect();
    assert!(missing.is_empty(), "{binary} --help does not list {missing:?}");
}

/// Whether `help` shows the flag `name` (`--name` not followed by more of a flag name).
fn names_flag(help: &str, name: &str) -> bool {
    help.match_indices(name).any(|(i, _)| {
        let next = help[i + name.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}

/// Runs `binary` with `args` (no kubeconfig that works, no cloud config): it stops at the
/// cloud or the API; returns its stderr.
fn stderr_of(binary: &str, args: &[&str]) -> String {
    let out = Command::new(binary)
        .args(args)
        .args(["--kubeconfig=/nonexistent/kubeconfig", "--secure-port=0", "--leader-elect=false"])
        .output()
        .expect("run the binary");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// The warning [`Extensions::warn_accepted_only`] logs.
const UNACTED: &str = "accepted for compatibility with upstream's command line but not acted on";

#[cfg(feature = "provider-aws")]
mod aws {
    use super::*;

    const BINARY: &str = env!("CARGO_BIN_EXE_cloud-controller-manager-aws");

    fn flags() -> Vec<UpstreamFlag> {
        upstream_flags(&[GENERIC, include_str!("../fixtures/upstream-flags/aws.txt")])
    }

    #[test]
    fn every_upstream_aws_flag_parses() {
        assert_each_flag_parses("aws", ccm_provider_aws::extensions, &flags());
        assert_binary_takes_every_flag(BINARY, "aws", ccm_provider_aws::extensions, &flags());
    }

    #[test]
    fn batching_is_accepted_with_one_warning_naming_it() {
        let ext = ccm_provider_aws::extensions();
        assert_eq!(ext.accepted_only_flags(), ["tagging-controller-enable-batching"]);
        // A cluster ID in the config: no instance metadata discovery.
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("cloud.conf");
        std::fs::write(&config, "[Global]\nKubernetesClusterID=c1\nRegion=us-east-1\n").unwrap();
        let config = format!("--cloud-config={}", config.display());
        let stderr = stderr_of(
            BINARY,
            &[
                "--cloud-provider=aws",
                &config,
                "--tagging-controller-enable-batching",
                "--tags=a=b",
            ],
        );
        let warned: Vec<&str> = stderr.lines().filter(|l| l.contains(UNACTED)).collect();
        assert_eq!(warned.len(), 1, "{stderr}");
        assert!(warned[0].contains("--tagging-controller-enable-batching"), "{stderr}");
        assert!(!warned[0].contains("--tags"), "--tags is acted on: {stderr}");
    }
}

#[cfg(feature = "provider-openstack")]
mod openstack {
    use super::*;

    #[test]
    fn every_upstream_openstack_flag_parses() {
        let flags =
            upstream_flags(&[GENERIC, include_str!("../fixtures/upstream-flags/openstack.txt")]);
        assert_each_flag_parses("openstack", ccm_provider_openstack::extensions, &flags);
        assert_binary_takes_every_flag(
            env!("CARGO_BIN_EXE_cloud-controller-manager-openstack"),
            "openstack",
            ccm_provider_openstack::extensions,
            &flags,
        );
        assert!(ccm_provider_openstack::extensions().accepted_only_flags().is_empty());
    }
}

#[cfg(feature = "provider-vsphere")]
mod vsphere {
    use super::*;

    const BINARY: &str = env!("CARGO_BIN_EXE_cloud-controller-manager-vsphere");

    #[test]
    fn every_upstream_vsphere_flag_parses() {
        let flags =
            upstream_flags(&[GENERIC, include_str!("../fixtures/upstream-flags/vsphere.txt")]);
        assert_each_flag_parses("vsphere", ccm_provider_vsphere::extensions, &flags);
        assert_binary_takes_every_flag(BINARY, "vsphere", ccm_provider_vsphere::extensions, &flags);
    }

    #[test]
    fn paravirtual_flags_are_accepted_with_one_warning_naming_those_set() {
        let quiet = stderr_of(BINARY, &["--cloud-provider=vsphere", "--node-labels=a=b"]);
        assert!(!quiet.contains(UNACTED), "no unacted flag set, yet: {quiet}");

        let stderr = stderr_of(
            BINARY,
            &[
                "--cloud-provider=vsphere",
                "--is-legacy-paravirtual",
                "--enable-vpc-mode=false",
                "--node-labels=a=b",
            ],
        );
        let warned: Vec<&str> = stderr.lines().filter(|l| l.contains(UNACTED)).collect();
        assert_eq!(warned.len(), 1, "{stderr}");
        for flag in ["--is-legacy-paravirtual", "--enable-vpc-mode"] {
            assert!(warned[0].contains(flag), "{flag} not named: {stderr}");
        }
        for flag in ["--node-labels", "--pod-ip-pool-type"] {
            assert!(!warned[0].contains(flag), "{flag} named: {stderr}");
        }
    }

    #[test]
    fn a_node_labels_key_that_is_no_label_key_is_refused_naming_it() {
        let stderr = stderr_of(BINARY, &["--cloud-provider=vsphere", "--node-labels=Bad Key=x"]);
        assert!(stderr.contains("invalid --node-labels key \"Bad Key\""), "{stderr}");
    }
}

#[cfg(feature = "provider-ibm")]
mod ibm {
    use super::*;

    #[test]
    fn every_upstream_ibm_flag_parses() {
        let flags = upstream_flags(&[GENERIC, include_str!("../fixtures/upstream-flags/ibm.txt")]);
        assert_each_flag_parses("ibm", ccm_provider_ibm::extensions, &flags);
        assert_binary_takes_every_flag(
            env!("CARGO_BIN_EXE_cloud-controller-manager-ibm"),
            "ibm",
            ccm_provider_ibm::extensions,
            &flags,
        );
    }
}
