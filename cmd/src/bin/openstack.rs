//! `cloud-controller-manager-openstack`.

use std::sync::Arc;

fn main() -> std::process::ExitCode {
    ccm_cmd::main_with(
        ccm_provider_openstack::PROVIDER_NAME,
        Box::new(|config| {
            Ok(Arc::new(ccm_provider_openstack::OpenStackProvider::from_cloud_config(config)?))
        }),
    )
}
