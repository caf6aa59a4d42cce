//! `ecr-credential-provider`: the kubelet image credential plugin for Amazon ECR
//! (`ccm_provider_aws::credential::plugin`).

fn main() -> std::process::ExitCode {
    ccm_provider_aws::credential::plugin::main()
}
