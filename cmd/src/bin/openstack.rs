//! `cloud-controller-manager-openstack`.

fn main() -> std::process::ExitCode {
    ccm_cmd::main(ccm_provider_openstack::PROVIDER_NAME)
}
