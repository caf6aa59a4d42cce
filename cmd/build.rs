//! Build facts for `--version` and `kubernetes_build_info` (issue #34 point 3), handed to the
//! crate as compile-time environment variables (`CCM_BUILD_*`, read by `src/lib.rs`):
//!
//! - `CCM_BUILD_GIT_COMMIT`: `CCM_GIT_COMMIT` when the builder sets it (`ci/release`,
//!   `ci/image`), else `git rev-parse HEAD` of the source tree, else empty (no git, no `.git`:
//!   a source tarball or a container build context).
//! - `CCM_BUILD_GIT_TREE_STATE`: `CCM_GIT_TREE_STATE` (`clean` or `dirty`), else empty: whether
//!   the work tree differs from the commit is not tracked here, since doing so would rerun this
//!   script (and relink every binary) on every edit.
//! - `CCM_BUILD_DATE`: `CCM_BUILD_DATE` (RFC 3339), else empty (the binary reports upstream's
//!   default, the epoch: no clock in the build, so builds stay reproducible).
//! - `CCM_BUILD_RUSTC`: the compiler's `rustc -V`.
//! - `CCM_BUILD_KUBERNETES`: the Kubernetes release this code tracks and is tested against (the
//!   `k8s.io/kubernetes` version `ci/tools/k8s/go.mod` pins), `CCM_KUBERNETES_VERSION` overriding.
//! - `CCM_BUILD_KUBERNETES_API`: the oldest Kubernetes API the client is compiled for (the
//!   `k8s-openapi` version feature in the workspace `Cargo.toml`, `v1_33` -> `v1.33`).
//!
//! Reruns only when one of those inputs changes: the environment variables, the files the
//! Kubernetes versions are read from, and git's `HEAD` and the ref it points at (a commit or
//! a checkout), never on every build. Nothing here fails the build: a missing input is empty.

use std::path::{Path, PathBuf};
use std::process::Command;

fn main() {
    for var in ["CCM_GIT_COMMIT", "CCM_GIT_TREE_STATE", "CCM_BUILD_DATE", "CCM_KUBERNETES_VERSION"]
    {
        println!("cargo:rerun-if-env-changed={var}");
    }
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap_or_default());
    let root = manifest.parent().map(Path::to_path_buf).unwrap_or_default();

    let commit = match env_nonempty("CCM_GIT_COMMIT") {
        Some(c) => c,
        None => git_commit(&manifest).unwrap_or_default(),
    };
    let tree_state = env_nonempty("CCM_GIT_TREE_STATE").unwrap_or_default();
    let date = env_nonempty("CCM_BUILD_DATE").unwrap_or_default();
    let rustc = std::env::var_os("RUSTC")
        .and_then(|rustc| output(Command::new(rustc).arg("-V")))
        .unwrap_or_default();

    let go_mod = root.join("ci/tools/k8s/go.mod");
    let kubernetes = match env_nonempty("CCM_KUBERNETES_VERSION") {
        Some(v) => v,
        None => {
            watch(&go_mod);
            std::fs::read_to_string(&go_mod)
                .ok()
                .and_then(|text| go_mod_version(&text, "k8s.io/kubernetes"))
                .unwrap_or_default()
        }
    };
    let cargo_toml = root.join("Cargo.toml");
    watch(&cargo_toml);
    let api = std::fs::read_to_string(&cargo_toml)
        .ok()
        .and_then(|text| k8s_openapi_feature(&text))
        .unwrap_or_default();

    for (name, value) in [
        ("CCM_BUILD_GIT_COMMIT", commit),
        ("CCM_BUILD_GIT_TREE_STATE", tree_state),
        ("CCM_BUILD_DATE", date),
        ("CCM_BUILD_RUSTC", rustc),
        ("CCM_BUILD_KUBERNETES", kubernetes),
        ("CCM_BUILD_KUBERNETES_API", api),
    ] {
        // One line each: a value with a newline would end the instruction.
        let value = value.lines().next().unwrap_or_default().trim().to_string();
        println!("cargo:rustc-env={name}={value}");
    }
}

fn env_nonempty(name: &str) -> Option<String> {
    std::env::var(name).ok().map(|v| v.trim().to_string()).filter(|v| !v.is_empty())
}

/// A command's first line of stdout, if it ran and succeeded.
fn output(cmd: &mut Command) -> Option<String> {
    let out = cmd.output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?;
    Some(text.lines().next()?.trim().to_string()).filter(|s| !s.is_empty())
}

fn watch(path: &Path) {
    // A path that does not exist would make cargo rerun the script on every build.
    if path.exists() {
        println!("cargo:rerun-if-changed={}", path.display());
    }
}

/// `git rev-parse HEAD` in `dir`, watching `HEAD` and the ref it names (or `packed-refs` when
/// the ref has no file of its own) so a commit or checkout reruns this script.
fn git_commit(dir: &Path) -> Option<String> {
    let git = |args: &[&str]| output(Command::new("git").current_dir(dir).args(args));
    let commit = git(&["rev-parse", "--verify", "-q", "HEAD"])?;
    if !(commit.len() == 40 || commit.len() == 64) || !commit.bytes().all(|b| b.is_ascii_hexdigit())
    {
        return None;
    }
    let git_path = |name: &str| {
        git(&["rev-parse", "--path-format=absolute", "--git-path", name]).map(PathBuf::from)
    };
    if let Some(head) = git_path("HEAD") {
        watch(&head);
    }
    if let Some(reference) = git(&["symbolic-ref", "-q", "HEAD"]) {
        match git_path(&reference) {
            Some(file) if file.exists() => watch(&file),
            _ => {
                if let Some(packed) = git_path("packed-refs") {
                    watch(&packed);
                }
            }
        }
    }
    Some(commit)
}

/// The version `module` is required at in a go.mod (`\tk8s.io/kubernetes v1.36.3 // indirect`).
fn go_mod_version(text: &str, module: &str) -> Option<String> {
    text.lines().find_map(|line| {
        let mut words = line.trim().trim_start_matches("require").split_whitespace();
        if words.next()? != module {
            return None;
        }
        let version = words.next()?;
        version.starts_with('v').then(|| version.to_string())
    })
}

/// `v1.33` from the workspace's `k8s-openapi = { ..., features = ["v1_33"] }`.
fn k8s_openapi_feature(text: &str) -> Option<String> {
    let line = text.lines().find(|l| l.trim_start().starts_with("k8s-openapi"))?;
    let at = line.find("\"v1_")?;
    let feature: String =
        line[at + 1..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
    let minor = feature.strip_prefix("v1_")?;
    minor.bytes().all(|b| b.is_ascii_digit()).then(|| format!("v1.{minor}"))
}
