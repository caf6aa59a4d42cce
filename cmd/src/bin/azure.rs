//! `cloud-controller-manager-azure` (`--cloud-provider=azure`, as upstream), with Azure's own
//! flags ([`ccm_provider_azure::extensions`]).

use std::sync::Arc;

fn main() -> std::process::ExitCode {
    let extensions = ccm_provider_azure::extensions();
    let parsed = extensions.parsed.clone();
    ccm_cmd::main_with_ext(
        ccm_provider_azure::PROVIDER_NAME,
        Box::new(move |config| {
            Ok(Arc::new(ccm_provider_azure::AzureProvider::from_command_line(config, &parsed)?))
        }),
        extensions,
    )
}
