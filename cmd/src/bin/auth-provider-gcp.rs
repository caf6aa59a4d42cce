//! `auth-provider-gcp`: the kubelet image credential plugin for Google registries
//! (`ccm_provider_gcp::credential`).

fn main() -> std::process::ExitCode {
    ccm_provider_gcp::credential::main()
}
