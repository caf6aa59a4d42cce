//! `cloud-controller-manager-vsphere`.

fn main() -> std::process::ExitCode {
    ccm_cmd::main(ccm_provider_vsphere::PROVIDER_NAME)
}
