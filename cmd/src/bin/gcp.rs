//! `cloud-controller-manager-gcp` (`--cloud-provider=gce`, as upstream), with GCP's own flags
//! ([`ccm_provider_gcp::extensions`]).

use std::sync::Arc;

fn main() -> std::process::ExitCode {
    let extensions = ccm_provider_gcp::extensions();
    let parsed = extensions.parsed.clone();
    ccm_cmd::main_with_ext(
        ccm_provider_gcp::PROVIDER_NAME,
        Box::new(move |config| {
            Ok(Arc::new(ccm_provider_gcp::GcpProvider::from_command_line(config, &parsed)?))
        }),
        extensions,
    )
}
