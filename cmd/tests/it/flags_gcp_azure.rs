//! Issue #30 point 2 for GCP and Azure: every flag of the pinned upstream binary parses (the
//! fixtures `cmd/tests/fixtures/upstream-flags/{gcp,azure}.txt` on top of `generic.txt`, with
//! the shared helpers of [`crate::flags`]), and the flags accepted without effect are named in
//! one warning when given, those acted on never.

use std::process::Command;

use crate::flags::{
    GENERIC, assert_binary_takes_every_flag, assert_each_flag_parses, upstream_flags,
};

/// The warning `Extensions::warn_accepted_only` logs.
const UNACTED: &str = "accepted for compatibility with upstream's command line but not acted on";

/// Runs `binary` with `args` (no API server reachable); its stderr.
fn stderr_of(binary: &str, args: &[&str]) -> String {
    let out = Command::new(binary)
        .args(args)
        .args(["--kubeconfig=/nonexistent/kubeconfig", "--secure-port=0", "--leader-elect=false"])
        .output()
        .expect("run the binary");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn warned(stderr: &str) -> Vec<&str> {
    stderr.lines().filter(|l| l.contains(UNACTED)).collect()
}

#[cfg(feature = "provider-gcp")]
mod gcp {
    use super::*;

    const BINARY: &str = env!("CARGO_BIN_EXE_cloud-controller-manager-gcp");

    #[test]
    fn every_upstream_gcp_flag_parses() {
        let flags = upstream_flags(&[GENERIC, include_str!("../fixtures/upstream-flags/gcp.txt")]);
        assert_each_flag_parses("gce", ccm_provider_gcp::extensions, &flags);
        assert_binary_takes_every_flag(BINARY, "gce", ccm_provider_gcp::extensions, &flags);
    }

    #[test]
    fn gke_only_flags_are_named_in_one_warning_and_acted_on_flags_never() {
        let quiet = stderr_of(
            BINARY,
            &[
                "--cloud-provider=gce",
                "--enable-l4-lb-annotations",
                "--cloud-provider-gce-lb-src-cidrs=10.0.0.0/8",
            ],
        );
        assert!(warned(&quiet).is_empty(), "only acted-on flags given, yet: {quiet}");

        let stderr = stderr_of(
            BINARY,
            &[
                "--cloud-provider=gce",
                "--enable-multi-project",
                "--enable-gke-tenant-controller=false",
                "--enable-l4-lb-annotations",
                "--cloud-provider-gce-l7lb-src-cidrs=10.0.0.0/8",
            ],
        );
        let lines = warned(&stderr);
        assert_eq!(lines.len(), 1, "{stderr}");
        for flag in [
            "--enable-multi-project",
            "--enable-gke-tenant-controller",
            "--cloud-provider-gce-l7lb-src-cidrs",
        ] {
            assert!(lines[0].contains(flag), "{flag} not named: {stderr}");
        }
        assert!(!lines[0].contains("--enable-l4-lb-annotations"), "acted on: {stderr}");
    }

    #[test]
    fn a_bad_lb_src_cidr_stops_the_binary_naming_the_flag() {
        let stderr = stderr_of(
            BINARY,
            &["--cloud-provider=gce", "--cloud-provider-gce-lb-src-cidrs=10.0.0.0/8,x"],
        );
        assert!(stderr.contains("--cloud-provider-gce-lb-src-cidrs"), "{stderr}");
        assert!(stderr.contains("entry 2 is not a CIDR"), "{stderr}");
    }
}

#[cfg(feature = "provider-azure")]
mod azure {
    use super::*;

    const BINARY: &str = env!("CARGO_BIN_EXE_cloud-controller-manager-azure");

    #[test]
    fn every_upstream_azure_flag_parses() {
        let flags =
            upstream_flags(&[GENERIC, include_str!("../fixtures/upstream-flags/azure.txt")]);
        assert_each_flag_parses("azure", ccm_provider_azure::extensions, &flags);
        assert_binary_takes_every_flag(BINARY, "azure", ccm_provider_azure::extensions, &flags);
        assert_eq!(
            ccm_provider_azure::extensions().accepted_only_flags(),
            ["node-filter-requirements", "log-format"]
        );
    }

    #[test]
    fn node_filter_requirements_is_named_in_one_warning_the_secret_flags_never() {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("azure.json");
        std::fs::write(&config, r#"{"cloudConfigType": "file", "cloud": "AzurePublicCloud", "tenantId": "t", "subscriptionId": "s", "resourceGroup": "rg", "location": "eastus", "useManagedIdentityExtension": true}"#).unwrap();
        let config = format!("--cloud-config={}", config.display());
        let stderr = stderr_of(
            BINARY,
            &[
                "--cloud-provider=azure",
                &config,
                "--node-filter-requirements=pool=a",
                "--enable-dynamic-reloading",
                "--cloud-config-secret-namespace=infra",
            ],
        );
        let lines = warned(&stderr);
        assert_eq!(lines.len(), 1, "{stderr}");
        assert!(lines[0].contains("--node-filter-requirements"), "{stderr}");
        for flag in ["--enable-dynamic-reloading", "--cloud-config-secret-namespace"] {
            assert!(!lines[0].contains(flag), "{flag} is acted on: {stderr}");
        }
    }
}
