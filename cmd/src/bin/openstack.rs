//! `cloud-controller-manager-openstack`, with OpenStack's own flag
//! ([`ccm_provider_openstack::extensions`]: `--user-agent`).

use std::sync::Arc;

fn main() -> std::process::ExitCode {
    let extensions = ccm_provider_openstack::extensions();
    let parsed = extensions.parsed.clone();
    ccm_cmd::main_with_ext(
        ccm_provider_openstack::PROVIDER_NAME,
        Box::new(move |config| {
            Ok(Arc::new(ccm_provider_openstack::OpenStackProvider::from_command_line(
                config, &parsed,
            )?))
        }),
        extensions,
    )
}
