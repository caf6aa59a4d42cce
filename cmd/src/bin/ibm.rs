//! `cloud-controller-manager-ibm`.

fn main() -> std::process::ExitCode {
    ccm_cmd::main(ccm_provider_ibm::PROVIDER_NAME)
}
