//! `cloud-controller-manager-ibm`.

use std::sync::Arc;

fn main() -> std::process::ExitCode {
    ccm_cmd::main_with(
        ccm_provider_ibm::PROVIDER_NAME,
        Box::new(|config| Ok(Arc::new(ccm_provider_ibm::IbmProvider::from_cloud_config(config)?))),
    )
}
