//! Shared entry point of the `cloud-controller-manager-<provider>` binaries.
//!
//! A provider's `main` is one call:
//!
//! ```ignore
//! fn main() -> std::process::ExitCode {
//!     ccm_cmd::main_with(ccm_provider_aws::PROVIDER_NAME, Box::new(|config| {
//!         Ok(std::sync::Arc::new(ccm_provider_aws::Cloud::from_config(config)?))
//!     }))
//! }
//! ```
//!
//! A provider with its own flags or controllers passes its extensions:
//! `ccm_cmd::main_with_ext(NAME, factory, ccm_provider_x::extensions())` ([`main_with_ext`]).
//!
//! Everything else (flags, leader election, serving, controllers) is
//! [`ccm_core::manager`].

use std::process::ExitCode;
use std::sync::Arc;

use ccm_core::cloud::CloudProvider;
pub use ccm_core::manager::CloudFactory;
pub use ccm_core::manager::extensions::Extensions;

/// Runs the cloud-controller-manager for `provider`, building the cloud with `factory` from
/// the `--cloud-config` contents.
pub fn main_with(provider: &str, factory: CloudFactory) -> ExitCode {
    ccm_core::manager::main(provider, factory)
}

/// Runs the cloud-controller-manager for `provider` with its own controllers, webhooks and
/// flags (`extensions`; its factory reads the parsed flag values through a clone of
/// [`Extensions::parsed`]). Before the cloud is built, one warning names every flag that was
/// set and that the provider accepts without acting on it
/// ([`Extensions::warn_accepted_only`]).
pub fn main_with_ext(provider: &str, factory: CloudFactory, extensions: Extensions) -> ExitCode {
    let warn = extensions.clone();
    let factory: CloudFactory = Box::new(move |config| {
        warn.warn_accepted_only();
        factory(config)
    });
    ccm_core::manager::main_with_extensions(provider, factory, extensions, std::env::args_os())
}

/// Runs the cloud-controller-manager for a provider whose cloud is not implemented yet: the
/// manager runs (flags, leader election, serving) and logs that every cloud controller is
/// skipped for lack of capabilities.
pub fn main(provider: &str) -> ExitCode {
    let name = provider.to_string();
    main_with(
        provider,
        Box::new(move |_config| Ok(Arc::new(Unimplemented(name)) as Arc<dyn CloudProvider>)),
    )
}

/// A provider with no capabilities (the provider crate is still a shell).
struct Unimplemented(String);

impl CloudProvider for Unimplemented {
    fn name(&self) -> &str {
        &self.0
    }
}
