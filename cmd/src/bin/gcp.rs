//! `cloud-controller-manager-gcp` (`--cloud-provider=gce`, as upstream).

use std::sync::Arc;

fn main() -> std::process::ExitCode {
    ccm_cmd::main_with(
        ccm_provider_gcp::PROVIDER_NAME,
        Box::new(|config| Ok(Arc::new(ccm_provider_gcp::GcpProvider::from_cloud_config(config)?))),
    )
}
