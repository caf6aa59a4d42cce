//! `cloud-controller-manager-vsphere`.

use std::sync::Arc;

fn main() -> std::process::ExitCode {
    ccm_cmd::main_with(
        ccm_provider_vsphere::PROVIDER_NAME,
        Box::new(|config| {
            Ok(Arc::new(ccm_provider_vsphere::VsphereProvider::from_cloud_config(config)?))
        }),
    )
}
