//! `cloud-controller-manager-vsphere`, with vSphere's own flags
//! ([`ccm_provider_vsphere::extensions`]: `--node-labels`, the paravirtual-mode flags).

use std::sync::Arc;

fn main() -> std::process::ExitCode {
    let extensions = ccm_provider_vsphere::extensions();
    let parsed = extensions.parsed.clone();
    ccm_cmd::main_with_ext(
        ccm_provider_vsphere::PROVIDER_NAME,
        Box::new(move |config| {
            Ok(Arc::new(ccm_provider_vsphere::VsphereProvider::from_command_line(config, &parsed)?))
        }),
        extensions,
    )
}
