//! `cloud-controller-manager-aws`.

fn main() -> std::process::ExitCode {
    ccm_cmd::main(ccm_provider_aws::PROVIDER_NAME)
}
