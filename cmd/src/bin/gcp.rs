//! `cloud-controller-manager-gcp`.

fn main() -> std::process::ExitCode {
    ccm_cmd::main(ccm_provider_gcp::PROVIDER_NAME)
}
