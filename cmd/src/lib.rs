//! Shared entry point of the `cloud-controller-manager-<provider>` binaries.
//!
//! Each binary's `main` is one line that names its provider. The manager (flags, leader
//! election, controllers) is wired in here as it lands in `ccm-core`.

use std::process::ExitCode;

/// Runs the cloud-controller-manager for `provider`.
pub fn main(provider: &str) -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "--version") {
        println!("cloud-controller-manager-{provider} {}", env!("CARGO_PKG_VERSION"));
        return ExitCode::SUCCESS;
    }
    eprintln!(
        "cloud-controller-manager-{provider}: the manager is not wired in yet; only --version works"
    );
    ExitCode::from(2)
}
