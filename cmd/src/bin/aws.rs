//! `cloud-controller-manager-aws`, with AWS's own controller and flags
//! ([`ccm_provider_aws::extensions`]: the `tagging` controller).

use std::sync::Arc;

fn main() -> std::process::ExitCode {
    let extensions = ccm_provider_aws::extensions();
    let parsed = extensions.parsed.clone();
    ccm_cmd::main_with_ext(
        ccm_provider_aws::PROVIDER_NAME,
        Box::new(move |config| {
            Ok(Arc::new(ccm_provider_aws::Cloud::from_command_line(config, &parsed)?))
        }),
        extensions,
    )
}
