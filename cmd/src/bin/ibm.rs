//! `cloud-controller-manager-ibm` ([`ccm_provider_ibm::extensions`]: IBM registers no flags of
//! its own).

use std::sync::Arc;

fn main() -> std::process::ExitCode {
    ccm_cmd::main_with_ext(
        ccm_provider_ibm::PROVIDER_NAME,
        Box::new(|config| Ok(Arc::new(ccm_provider_ibm::IbmProvider::from_cloud_config(config)?))),
        ccm_provider_ibm::extensions(),
    )
}
