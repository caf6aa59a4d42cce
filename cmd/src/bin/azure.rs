//! `cloud-controller-manager-azure` (`--cloud-provider=azure`, as upstream), with Azure's own
//! flags ([`ccm_provider_azure::extensions`]).

use std::sync::Arc;

fn main() -> std::process::ExitCode {
    let extensions = ccm_provider_azure::extensions();
    let parsed = extensions.parsed.clone();
    ccm_core::manager::main_with_extensions(
        ccm_provider_azure::PROVIDER_NAME,
        Box::new(move |config| {
            Ok(Arc::new(ccm_provider_azure::AzureProvider::from_command_line(config, &parsed)?))
        }),
        extensions,
        std::env::args_os(),
    )
}
