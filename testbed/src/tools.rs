//! Finds the Kubernetes tools built by `ci/install-tools`.
//!
//! The directory comes from `CCM_TOOLS_DIR` when set, otherwise from
//! `ci/install-tools --print-dir` (the cache keyed by the pinned version). Nothing is built
//! here: a missing tool is an error that says which command builds it.

use std::path::{Path, PathBuf};
use std::process::Command;

use crate::Error;

/// Paths of the Kubernetes tools.
#[derive(Debug, Clone)]
pub struct Tools {
    /// The directory holding all of them.
    pub dir: PathBuf,
    /// `etcd`.
    pub etcd: PathBuf,
    /// `kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `kube-controller-manager`.
    pub kube_controller_manager: PathBuf,
    /// `kubectl`.
    pub kubectl: PathBuf,
}

/// The repository root (this crate lives in `<root>/testbed`).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_default()
}

impl Tools {
    /// Locates the tools; fails naming the missing one and the command that builds it.
    pub fn locate() -> Result<Tools, Error> {
        let dir = match std::env::var_os("CCM_TOOLS_DIR") {
            Some(d) => PathBuf::from(d),
            None => {
                let script = repo_root().join("ci/install-tools");
                let out = Command::new(&script).arg("--print-dir").output().map_err(|e| {
                    Error::Tools(format!("running {} --print-dir: {e}", script.display()))
                })?;
                if !out.status.success() {
                    return Err(Error::Tools(format!(
                        "{} --print-dir failed: {}",
                        script.display(),
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
                PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
            }
        };
        Self::in_dir(dir)
    }

    /// The tools in `dir`, checked to exist.
    pub fn in_dir(dir: PathBuf) -> Result<Tools, Error> {
        let tools = Tools {
            etcd: dir.join("etcd"),
            kube_apiserver: dir.join("kube-apiserver"),
            kube_controller_manager: dir.join("kube-controller-manager"),
            kubectl: dir.join("kubectl"),
            dir,
        };
        for p in
            [&tools.etcd, &tools.kube_apiserver, &tools.kube_controller_manager, &tools.kubectl]
        {
            if !p.is_file() {
                return Err(Error::Tools(format!(
                    "{} is missing; build the tools with `ci/install-tools` (or set CCM_TOOLS_DIR)",
                    p.display()
                )));
            }
        }
        Ok(tools)
    }
}

/// The Kubernetes version pinned in `ci/tools/k8s/go.mod` (e.g. `v1.36.3`).
pub fn pinned_kubernetes_version() -> Result<String, Error> {
    let path = repo_root().join("ci/tools/k8s/go.mod");
    let text = std::fs::read_to_string(&path)
        .map_err(|e| Error::Tools(format!("reading {}: {e}", path.display())))?;
    text.lines()
        .filter_map(|l| {
            l.trim().trim_start_matches("require").trim().strip_prefix("k8s.io/kubernetes ")
        })
        .filter_map(|rest| rest.split_whitespace().next())
        .next()
        .map(str::to_string)
        .ok_or_else(|| {
            Error::Tools(format!("no k8s.io/kubernetes requirement in {}", path.display()))
        })
}
