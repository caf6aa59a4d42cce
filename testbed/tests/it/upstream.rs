//! Upstream's own CCMs start on our emulators (issue #31 point 3): each cloud's upstream
//! binaries (built by `ci/install-tools --upstream-ccm <cloud>`, ~10 min per cloud cold,
//! cached) run under swap's set-up for upstream's chart with its defaults, plus what
//! `ccm_testbed::upstream::extra_env` adds (Azure: the AAD/IMDS stand-in). Each must keep
//! running, initialise every Node, give the LoadBalancer Service its address, and delete what
//! it created when the Service is deleted (nothing left behind, nothing else removed).
//!
//! Ignored by default (the upstream builds are too heavy for `ci/test`); run one with
//! `cargo test -p ccm-testbed --all-features --test it -- --ignored upstream::` or through
//! `ci/differential`.

use ccm_testbed::upstream::run::prove;

async fn check(cloud: &str) {
    let dir = std::env::temp_dir().join(ccm_testbed::unique_name(&format!("upstream-{cloud}")));
    let report = prove(cloud, &dir).await;
    eprintln!("{report}");
    assert!(report.passed(), "upstream's {cloud} CCM did not pass on our emulator:\n{report}");
}

#[tokio::test]
#[ignore = "builds upstream's CCM (~10 min cold); run with --ignored"]
async fn upstream_ccm_starts_on_the_emulator_openstack() {
    check("openstack").await;
}

#[tokio::test]
#[ignore = "builds upstream's CCM and cloud-node-manager (~12 min cold); run with --ignored"]
async fn upstream_ccm_starts_on_the_emulator_azure() {
    check("azure").await;
}

#[tokio::test]
#[ignore = "builds upstream's CCM (~10 min cold); run with --ignored"]
async fn upstream_ccm_starts_on_the_emulator_vsphere() {
    check("vsphere").await;
}

#[tokio::test]
#[ignore = "builds upstream's CCM (~10 min cold); needs --all-features (moto world); run with --ignored"]
async fn upstream_ccm_starts_on_the_emulator_aws() {
    check("aws").await;
}
