//! `cloud-controller-manager-azure` (`--cloud-provider=azure`, as upstream).

use std::sync::Arc;

fn main() -> std::process::ExitCode {
    ccm_cmd::main_with(
        ccm_provider_azure::PROVIDER_NAME,
        Box::new(|config| {
            Ok(Arc::new(ccm_provider_azure::AzureProvider::from_cloud_config(config)?))
        }),
    )
}
