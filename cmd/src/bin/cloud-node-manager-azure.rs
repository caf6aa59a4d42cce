//! `cloud-node-manager-azure`: upstream's per-node `cloud-node-manager` DaemonSet — this
//! machine's Node initialised from the Azure instance metadata service
//! (`ccm_provider_azure::node_manager`).

fn main() -> std::process::ExitCode {
    ccm_provider_azure::node_manager::main()
}
