//! `acr-credential-provider`: the kubelet image credential plugin for Azure Container
//! Registry (`ccm_provider_azure::credential`).

fn main() -> std::process::ExitCode {
    ccm_provider_azure::credential::main()
}
