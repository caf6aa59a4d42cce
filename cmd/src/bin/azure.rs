//! `cloud-controller-manager-azure`.

fn main() -> std::process::ExitCode {
    ccm_cmd::main(ccm_provider_azure::PROVIDER_NAME)
}
