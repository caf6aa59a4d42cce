//! `cloud-controller-manager-aws`.

use std::sync::Arc;

fn main() -> std::process::ExitCode {
    ccm_cmd::main_with(
        ccm_provider_aws::PROVIDER_NAME,
        Box::new(|config| Ok(Arc::new(ccm_provider_aws::Cloud::from_config(config)?))),
    )
}
