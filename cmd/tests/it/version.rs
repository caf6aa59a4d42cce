//! Issue #34 point 3: what `--version` tells an operator, from the real binaries. `--version`
//! is one line in upstream's shape (`Kubernetes <gitVersion>` first) naming the git commit this
//! binary was built from and the Kubernetes release it was built against; `--version=raw` is
//! Go's `%#v` of upstream's `version.Info` with the same commit and the Rust compiler in
//! `GoVersion`; the running manager's `kubernetes_build_info` carries upstream's labels with the
//! same values.

use std::path::{Path, PathBuf};
use std::process::Command;

/// Every manager binary this build has.
fn managers() -> Vec<&'static str> {
    vec![
        #[cfg(feature = "provider-aws")]
        env!("CARGO_BIN_EXE_cloud-controller-manager-aws"),
        #[cfg(feature = "provider-azure")]
        env!("CARGO_BIN_EXE_cloud-controller-manager-azure"),
        #[cfg(feature = "provider-gcp")]
        env!("CARGO_BIN_EXE_cloud-controller-manager-gcp"),
        #[cfg(feature = "provider-ibm")]
        env!("CARGO_BIN_EXE_cloud-controller-manager-ibm"),
        #[cfg(feature = "provider-openstack")]
        env!("CARGO_BIN_EXE_cloud-controller-manager-openstack"),
        #[cfg(feature = "provider-vsphere")]
        env!("CARGO_BIN_EXE_cloud-controller-manager-vsphere"),
    ]
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap().to_path_buf()
}

/// `binary args…`: (exit code, stdout, stderr).
fn run(binary: &str, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(binary).args(args).env_remove("RUST_LOG").output().unwrap();
    let text = |b: Vec<u8>| String::from_utf8(b).unwrap();
    (out.status.code(), text(out.stdout), text(out.stderr))
}

/// The Kubernetes release the repository pins (`ci/tools/k8s/go.mod`: `k8s.io/kubernetes`).
fn pinned_kubernetes() -> String {
    let go_mod = std::fs::read_to_string(repo().join("ci/tools/k8s/go.mod")).unwrap();
    go_mod
        .lines()
        .find_map(|l| l.trim().strip_prefix("k8s.io/kubernetes v"))
        .map(|rest| format!("v{}", rest.split_whitespace().next().unwrap()))
        .expect("k8s.io/kubernetes in ci/tools/k8s/go.mod")
}

/// The oldest Kubernetes API the client is compiled for (the k8s-openapi feature `v1_NN`).
fn k8s_openapi_api() -> String {
    let cargo = std::fs::read_to_string(repo().join("Cargo.toml")).unwrap();
    let line = cargo.lines().find(|l| l.starts_with("k8s-openapi")).unwrap();
    let minor: String =
        line.split("\"v1_").nth(1).unwrap().chars().take_while(char::is_ascii_digit).collect();
    format!("v1.{minor}")
}

/// The commit the repository's git says this source is at, if there is a git repository.
fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").current_dir(repo()).args(args).output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The commit named in a `--version` line: 40 hex digits of a commit of this repository that
/// HEAD contains (another commit may have landed since the build), or `unknown` outside git.
fn assert_commit_of_this_repository(commit: &str, line: &str) {
    if git(&["rev-parse", "--git-dir"]).is_none() {
        assert_eq!(commit, "unknown", "no git repository here: {line}");
        return;
    }
    assert!(
        commit.len() == 40 && commit.bytes().all(|b| b.is_ascii_hexdigit()),
        "not a commit: {commit:?} in {line}"
    );
    assert!(
        git(&["merge-base", "--is-ancestor", commit, "HEAD"]).is_some(),
        "{commit} is not a commit HEAD contains: {line}"
    );
}

/// `--version`: one line, upstream's `Kubernetes <gitVersion>` first, then the commit and the
/// Kubernetes release (and oldest API) it was built against; exit 0, nothing on stderr. Before
/// this change it printed `Kubernetes v0.1.0` alone.
#[test]
fn version_names_the_commit_and_the_kubernetes_release_it_was_built_against() {
    let bins = managers();
    assert!(!bins.is_empty(), "no manager binary in this build (enable a provider feature)");
    let want_prefix = format!("Kubernetes v{} (git commit ", env!("CARGO_PKG_VERSION"));
    let want_k8s =
        format!("; built against Kubernetes {}, API {})", pinned_kubernetes(), k8s_openapi_api());
    let mut lines = Vec::new();
    for bin in bins {
        for flag in ["--version", "--version=true"] {
            let (code, out, err) = run(bin, &[flag]);
            assert_eq!(code, Some(0), "{bin} {flag}: {err}");
            assert!(err.is_empty(), "{bin} {flag} wrote to stderr: {err}");
            let line =
                out.strip_suffix('\n').unwrap_or_else(|| panic!("{bin}: no newline: {out:?}"));
            assert!(!line.contains('\n'), "{bin} {flag}: more than one line: {out:?}");
            assert!(line.starts_with(&want_prefix), "{bin} {flag}: {line}");
            assert!(line.ends_with(&want_k8s), "{bin} {flag}: {line}, want it to end {want_k8s}");
            // `awk '{print $2}'`, as scripts read upstream's output, is the version.
            assert_eq!(
                line.split_whitespace().nth(1),
                Some(format!("v{}", env!("CARGO_PKG_VERSION")).as_str())
            );
            let commit = line[want_prefix.len()..].split([',', ';']).next().unwrap();
            assert_commit_of_this_repository(commit, line);
            lines.push(line.to_string());
        }
    }
    // Every binary of one build says the same (the manager's name is not in upstream's line).
    lines.dedup();
    assert_eq!(lines.len(), 1, "{lines:#?}");
    eprintln!("--version: {}", lines[0]);
}

/// The fields of a `version.Info{Major:"0", ...}` line, in order.
fn raw_fields(line: &str) -> Vec<(String, String)> {
    let body = line
        .strip_prefix("version.Info{")
        .and_then(|b| b.strip_suffix('}'))
        .unwrap_or_else(|| panic!("not version.Info{{...}}: {line}"));
    let mut fields = Vec::new();
    let mut rest = body;
    while !rest.is_empty() {
        let (name, after) = rest.split_once(":\"").unwrap_or_else(|| panic!("at {rest:?}"));
        let mut value = String::new();
        let mut chars = after.char_indices();
        let end = loop {
            match chars.next() {
                Some((_, '\\')) => value.push(chars.next().unwrap().1),
                Some((i, '"')) => break i,
                Some((_, c)) => value.push(c),
                None => panic!("unterminated value in {line}"),
            }
        };
        fields.push((name.to_string(), value));
        rest = after[end + 1..].trim_start_matches(", ");
    }
    fields
}

/// `--version=raw`: upstream's `version.Info` fields in upstream's order; the commit is the
/// one `--version` names; GoVersion holds the Rust compiler's `rustc -V` (before: empty).
#[test]
fn version_raw_is_upstreams_version_info_with_the_commit_and_the_compiler() {
    let bins = managers();
    assert!(!bins.is_empty());
    for bin in bins {
        let (code, out, err) = run(bin, &["--version=raw"]);
        assert_eq!(code, Some(0), "{bin}: {err}");
        let line = out.trim_end();
        let fields = raw_fields(line);
        let names: Vec<&str> = fields.iter().map(|(k, _)| k.as_str()).collect();
        assert_eq!(
            names,
            [
                "Major",
                "Minor",
                "EmulationMajor",
                "EmulationMinor",
                "MinCompatibilityMajor",
                "MinCompatibilityMinor",
                "GitVersion",
                "GitCommit",
                "GitTreeState",
                "BuildDate",
                "GoVersion",
                "Compiler",
                "Platform",
            ],
            "{line}"
        );
        let field = |k: &str| fields.iter().find(|(n, _)| n == k).unwrap().1.clone();
        let mut version = env!("CARGO_PKG_VERSION").split('.');
        assert_eq!(field("Major"), version.next().unwrap(), "{line}");
        assert_eq!(field("Minor"), version.next().unwrap(), "{line}");
        assert_eq!(field("GitVersion"), format!("v{}", env!("CARGO_PKG_VERSION")));
        assert_commit_of_this_repository(&field("GitCommit"), line);
        assert!(["", "clean", "dirty"].contains(&field("GitTreeState").as_str()), "{line}");
        let date = field("BuildDate");
        assert!(date.len() == 20 && date.ends_with('Z') && date.as_bytes()[10] == b'T', "{line}");
        let rustc = field("GoVersion");
        assert!(rustc.starts_with("rustc 1."), "GoVersion is not the Rust compiler: {line}");
        assert_eq!(field("Compiler"), "rustc");
        assert_eq!(field("Platform"), format!("{}/{}", std::env::consts::OS, go_arch()));
        // The short form names the same commit.
        let (_, short, _) = run(bin, &["--version"]);
        let commit = format!("git commit {}", field("GitCommit"));
        assert!(short.contains(&commit), "{short} does not name the commit of {line}");
    }
}

fn go_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The running manager's `kubernetes_build_info` (on its secure port) carries upstream's nine
/// labels with the values `--version=raw` prints: one sample, value 1. Before this change its
/// go_version was empty and its commit the library's (`unknown` unless the builder set one).
#[cfg(feature = "provider-vsphere")]
#[tokio::test]
async fn kubernetes_build_info_reports_what_version_raw_prints() {
    use crate::support::{Env, curl, free_port, wait_for};
    use crate::vsphere::{BIN, one_vcenter};

    let (_, raw, _) = run(BIN.path, &["--version=raw"]);
    let fields = raw_fields(raw.trim_end());
    let field = |k: &str| fields.iter().find(|(n, _)| n == k).unwrap().1.clone();

    let sim = ccm_testbed::vcsim::Vcsim::start();
    let env = Env::start(BIN).await;
    let _logs = env.cp.log_guard();
    let port = free_port();
    let ccm = env.spawn_ccm(
        &one_vcenter(&sim),
        &[
            format!("--secure-port={port}"),
            "--bind-address=127.0.0.1".into(),
            "--authorization-always-allow-paths=/healthz,/metrics".into(),
        ],
    );
    let metrics = wait_for("the manager's /metrics", || async move {
        let (code, body) = curl(&format!("https://127.0.0.1:{port}/metrics")).await;
        (code == 200).then_some(body)
    })
    .await;
    let samples: Vec<&str> =
        metrics.lines().filter(|l| l.starts_with("kubernetes_build_info{")).collect();
    assert_eq!(samples.len(), 1, "{samples:?}\nmanager log:\n{}", ccm.logs());
    let want = format!(
        "kubernetes_build_info{{build_date=\"{}\",compiler=\"{}\",git_commit=\"{}\",\
         git_tree_state=\"{}\",git_version=\"{}\",go_version=\"{}\",major=\"{}\",minor=\"{}\",\
         platform=\"{}\"}} 1",
        field("BuildDate"),
        field("Compiler"),
        field("GitCommit"),
        field("GitTreeState"),
        field("GitVersion"),
        field("GoVersion"),
        field("Major"),
        field("Minor"),
        field("Platform"),
    );
    assert_eq!(samples[0], want);
    eprintln!("{}", samples[0]);
}
