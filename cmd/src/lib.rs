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

use std::ffi::OsString;
use std::io::Write as _;
use std::process::ExitCode;
use std::sync::Arc;

use ccm_core::cloud::CloudProvider;
pub use ccm_core::manager::CloudFactory;
pub use ccm_core::manager::extensions::Extensions;
use ccm_core::manager::flags::{VersionFlag, VersionInfo};

/// Runs the cloud-controller-manager for `provider`, building the cloud with `factory` from
/// the `--cloud-config` contents.
pub fn main_with(provider: &str, factory: CloudFactory) -> ExitCode {
    run(provider, factory, Extensions::default())
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
    run(provider, factory, extensions)
}

/// The manager with this build's facts: `--version` prints them ([`print_version`]) and
/// `kubernetes_build_info` reports them; everything else is [`ccm_core::manager`]'s.
fn run(provider: &str, factory: CloudFactory, extensions: Extensions) -> ExitCode {
    let args: Vec<OsString> = std::env::args_os().collect();
    if let Some(code) = print_version(&extensions, &args) {
        return code;
    }
    let build = BuildInfo::get(&VersionFlag::Off);
    ccm_core::manager::metrics::set_build_info(&build.version, &build.rustc);
    ccm_core::manager::main_with_extensions(provider, factory, extensions, args)
}

/// `--version` (component-base's verflag, with this build's facts): prints
/// [`BuildInfo::short`], or [`BuildInfo::raw`] for `--version=raw`, and returns the exit code;
/// `None` when the command line asks for no version (or does not parse: the manager then
/// reports why) or is an operator tool's (`migrate-check`, `orphans`).
pub fn print_version(extensions: &Extensions, args: &[OsString]) -> Option<ExitCode> {
    if ccm_core::ops::is_tool_invocation(args) {
        return None;
    }
    // The same parse the manager makes next (the provider's flags included, so a command line
    // with them asks for the version as well); its values are identical the second time.
    let flags = ccm_core::manager::parse_flags(extensions, args.iter().cloned()).ok()?;
    if !flags.version.prints() {
        return None;
    }
    let info = BuildInfo::get(&flags.version);
    let line = match flags.version {
        VersionFlag::Raw => info.raw(),
        _ => info.short(),
    };
    let _ = writeln!(std::io::stdout(), "{line}");
    Some(ExitCode::SUCCESS)
}

/// This binary's build: upstream's `version.Info` fields with the commit, tree state and date
/// `build.rs` recorded (`CCM_GIT_COMMIT`, `CCM_GIT_TREE_STATE`, `CCM_BUILD_DATE` from the
/// builder, else `git rev-parse HEAD`), the Rust compiler's version, and the Kubernetes
/// release the code tracks and is tested against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildInfo {
    /// Upstream's `version.Info`: major, minor, gitVersion (`v<crate version>`), gitCommit
    /// (`unknown` when no commit was recorded), gitTreeState (`clean`, `dirty` or empty),
    /// buildDate (the epoch when none was given: builds stay reproducible), compiler
    /// (`rustc`), platform (`linux/amd64`).
    pub version: VersionInfo,
    /// `rustc -V` of the compiler that built this binary: what `--version=raw` puts in
    /// `GoVersion` and `kubernetes_build_info` in `go_version` (upstream's Go toolchain).
    pub rustc: String,
    /// The Kubernetes release this build tracks and is tested against (`v1.36.3`: the
    /// `k8s.io/kubernetes` version `ci/tools/k8s/go.mod` pins; `CCM_KUBERNETES_VERSION`
    /// overrides it at build time), empty if unknown.
    pub kubernetes: String,
    /// The oldest Kubernetes API the client is compiled for (`v1.33`: the workspace's
    /// `k8s-openapi` version feature), empty if unknown.
    pub kubernetes_api: String,
}

impl BuildInfo {
    /// This build; `flag` may override the reported version (`--version=vX.Y.Z`).
    pub fn get(flag: &VersionFlag) -> BuildInfo {
        let mut version = VersionInfo::get(flag);
        let recorded = |v: &'static str| Some(v.trim()).filter(|v| !v.is_empty());
        if let Some(commit) = recorded(env!("CCM_BUILD_GIT_COMMIT")) {
            version.git_commit = commit.to_string();
        }
        if let Some(state) = recorded(env!("CCM_BUILD_GIT_TREE_STATE")) {
            version.git_tree_state = state.to_string();
        }
        if let Some(date) = recorded(env!("CCM_BUILD_DATE")) {
            version.build_date = date.to_string();
        }
        BuildInfo {
            version,
            rustc: env!("CCM_BUILD_RUSTC").to_string(),
            kubernetes: env!("CCM_BUILD_KUBERNETES").to_string(),
            kubernetes_api: env!("CCM_BUILD_KUBERNETES_API").to_string(),
        }
    }

    /// What `--version` prints, on one line that starts as upstream's (`Kubernetes
    /// <gitVersion>`, so `awk '{print $2}'` still gets the version): `Kubernetes v0.1.0 (git
    /// commit <sha>, tree clean, built <date>; built against Kubernetes v1.36.3, API v1.33)`.
    /// The tree state and date appear when the build recorded them.
    pub fn short(&self) -> String {
        let v = &self.version;
        let mut build = vec![format!("git commit {}", v.git_commit)];
        if !v.git_tree_state.is_empty() {
            build.push(format!("tree {}", v.git_tree_state));
        }
        if v.build_date != EPOCH {
            build.push(format!("built {}", v.build_date));
        }
        let or_unknown = |s: &str| if s.is_empty() { "unknown".to_string() } else { s.to_string() };
        format!(
            "Kubernetes {} ({}; built against Kubernetes {}, API {})",
            v.git_version,
            build.join(", "),
            or_unknown(&self.kubernetes),
            or_unknown(&self.kubernetes_api)
        )
    }

    /// What `--version=raw` prints: Go's `%#v` of upstream's `version.Info` (every field in
    /// its order), `GoVersion` holding the Rust compiler's version.
    pub fn raw(&self) -> String {
        let raw = self.version.raw();
        let go_version = format!("GoVersion:{}", go_quote(&self.rustc));
        // The library leaves GoVersion empty: this binary knows its compiler.
        raw.replacen("GoVersion:\"\"", &go_version, 1)
    }
}

/// Upstream's default build date (no date given).
const EPOCH: &str = "1970-01-01T00:00:00Z";

/// A string as Go's `%#v` writes it (`rustc -V` is printable ASCII; anything else escaped).
fn go_quote(s: &str) -> String {
    let mut out = String::from('"');
    for c in s.chars() {
        match c {
            '"' | '\\' => {
                out.push('\\');
                out.push(c);
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
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
