//! Upstream's own cloud-controller-managers (issue #31): built from the Go module proxy at
//! pinned versions by `ci/install-tools --upstream-ccm <cloud>` (wrapper modules
//! `ci/tools/upstream-<cloud>/`), and what they need to run against our emulators beyond what
//! [`crate::swap`] maps for our binaries. `ci/differential` runs them as the oracle.
//!
//! | cloud | upstream module | binaries (as upstream's images name them) |
//! |---|---|---|
//! | `openstack` | `k8s.io/cloud-provider-openstack` | `openstack-cloud-controller-manager` |
//! | `azure` | `sigs.k8s.io/cloud-provider-azure` | `cloud-controller-manager`, `cloud-node-manager` |
//! | `vsphere` | `k8s.io/cloud-provider-vsphere` | `vsphere-cloud-controller-manager` |
//! | `aws` | `k8s.io/cloud-provider-aws` | `aws-cloud-controller-manager` |
//!
//! Azure's binaries reach two things offline nothing answers: msal-go's AAD instance
//! discovery on `login.microsoftonline.com` (for an authority it does not know, as the
//! emulator's is), and the instance metadata service at `169.254.169.254` (cloud-node-manager).
//! [`extra_env`] starts a stand-in ([`proxy::StandIn`]) and names it in `HTTPS_PROXY` /
//! `HTTP_PROXY`, with its CA in `SSL_CERT_DIR` (Go reads `SSL_CERT_DIR` besides the
//! `SSL_CERT_FILE` swap sets to the emulator's CA, so the process trusts both);
//! [`UpstreamGuard::node_env`] routes one node's IMDS requests to that node's IMDS emulator.

pub mod proxy;
pub mod run;

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The clouds whose upstream CCMs are built, in the order they were first needed.
pub const CLOUDS: [&str; 4] = ["openstack", "azure", "vsphere", "aws"];

/// Errors of building or preparing upstream's binaries; each names what was wrong.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamError {
    /// Not one of [`CLOUDS`].
    #[error("no upstream CCM for cloud {0:?} (one of openstack, azure, vsphere, aws)")]
    UnknownCloud(String),
    /// `ci/install-tools` could not be run.
    #[error("running {command}: {source}")]
    Spawn {
        /// The command line.
        command: String,
        /// Why.
        source: std::io::Error,
    },
    /// `ci/install-tools` failed or printed no usable directory.
    #[error("{command}: {detail}; the end of its output:\n{tail}")]
    Build {
        /// The command line.
        command: String,
        /// What went wrong (exit status, a missing binary).
        detail: String,
        /// The last lines it printed on stderr.
        tail: String,
    },
    /// The stand-in proxy could not start or was given a bad route.
    #[error("the upstream stand-in proxy: {detail}")]
    Proxy {
        /// What was wrong.
        detail: String,
    },
    /// A file operation failed.
    #[error("{what} ({path}): {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
}

/// Upstream's binaries for `cloud`: the manager, then the per-node manager if it has one.
pub fn binaries(cloud: &str) -> Result<&'static [&'static str], UpstreamError> {
    Ok(match cloud {
        "openstack" => &["openstack-cloud-controller-manager"],
        "azure" => &["cloud-controller-manager", "cloud-node-manager"],
        "vsphere" => &["vsphere-cloud-controller-manager"],
        "aws" => &["aws-cloud-controller-manager"],
        other => return Err(UpstreamError::UnknownCloud(other.to_string())),
    })
}

/// Upstream's manager binary for `cloud` in `dir` (from [`binary_dir`]).
pub fn manager_binary(cloud: &str, dir: &Path) -> Result<PathBuf, UpstreamError> {
    Ok(dir.join(binaries(cloud)?[0]))
}

/// Upstream's per-node manager binary for `cloud` in `dir`, if the cloud has one (Azure's
/// cloud-node-manager).
pub fn node_manager_binary(cloud: &str, dir: &Path) -> Result<Option<PathBuf>, UpstreamError> {
    Ok(binaries(cloud)?.get(1).map(|b| dir.join(b)))
}

fn install_tools() -> PathBuf {
    crate::tools::repo_root().join("ci/install-tools")
}

/// The directory holding upstream's binaries for `cloud`, building them first when they are
/// not cached (`ci/install-tools --upstream-ccm <cloud>`: several minutes per cloud cold, well
/// under a second warm). Its progress goes to stderr as it happens.
pub fn binary_dir(cloud: &str) -> Result<PathBuf, UpstreamError> {
    run_install_tools("--upstream-ccm", cloud, true)
}

/// The same directory if it is built already (`--print-upstream-ccm`), else None.
pub fn cached_binary_dir(cloud: &str) -> Result<Option<PathBuf>, UpstreamError> {
    match run_install_tools("--print-upstream-ccm", cloud, false) {
        Ok(d) => Ok(Some(d)),
        Err(UpstreamError::Build { .. }) => Ok(None),
        Err(e) => Err(e),
    }
}

fn run_install_tools(flag: &str, cloud: &str, echo: bool) -> Result<PathBuf, UpstreamError> {
    let names = binaries(cloud)?;
    let script = install_tools();
    let command = format!("{} {flag} {cloud}", script.display());
    let mut child = Command::new(&script)
        .arg(flag)
        .arg(cloud)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|source| UpstreamError::Spawn { command: command.clone(), source })?;
    // Its progress as it happens (a cold build takes minutes); the tail kept for errors.
    let stderr = child.stderr.take();
    let echo_thread = std::thread::spawn(move || {
        let mut tail = std::collections::VecDeque::new();
        if let Some(e) = stderr {
            for line in BufReader::new(e).lines().map_while(Result::ok) {
                if echo {
                    eprintln!("{line}");
                }
                tail.push_back(line);
                if tail.len() > 20 {
                    tail.pop_front();
                }
            }
        }
        Vec::from(tail).join("\n")
    });
    let out = child
        .wait_with_output()
        .map_err(|source| UpstreamError::Spawn { command: command.clone(), source })?;
    let tail = echo_thread.join().unwrap_or_default();
    let fail = |detail: String| UpstreamError::Build {
        command: command.clone(),
        detail,
        tail: tail.clone(),
    };
    if !out.status.success() {
        return Err(fail(format!("exited with {}", out.status)));
    }
    let stdout = String::from_utf8_lossy(&out.stdout);
    let last = stdout.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or_default().trim();
    let dir = PathBuf::from(last);
    for name in names {
        if !dir.join(name).is_file() {
            return Err(fail(format!("its last line {last:?} is not a directory holding {name}")));
        }
    }
    Ok(dir)
}

/// What keeps [`extra_env`]'s stand-ins running; they stop when it is dropped.
#[derive(Debug)]
pub struct UpstreamGuard {
    stand_in: proxy::StandIn,
}

impl UpstreamGuard {
    /// The environment of the per-node process on `node` (Azure's cloud-node-manager), given
    /// that node's environment as swap maps it for our binary: its IMDS emulator
    /// (`CCM_AZURE_IMDS_ENDPOINT`) answers the node's `http://169.254.169.254` requests
    /// through the stand-in. Append it after [`extra_env`]'s (it overrides `HTTP_PROXY`).
    /// A node environment without an IMDS endpoint needs nothing: empty.
    pub fn node_env(
        &self,
        node: &str,
        node_env: &[(String, String)],
    ) -> Result<Vec<(String, String)>, UpstreamError> {
        match node_env.iter().rev().find(|(k, _)| k == "CCM_AZURE_IMDS_ENDPOINT") {
            Some((_, url)) => self.stand_in.node_env(node, url),
            None => Ok(Vec::new()),
        }
    }

    /// Where AAD requests go when their authority is not on loopback (the Azure emulator's
    /// URL; not needed when azure.json's `cloud` is discovered from the emulator).
    pub fn set_aad_target(&self, emulator_url: &str) -> Result<(), UpstreamError> {
        self.stand_in.set_aad_target(emulator_url)
    }

    /// The requests the stand-in forwarded: `<request> -> <emulator> <status>`.
    pub fn served(&self) -> Vec<String> {
        self.stand_in.served()
    }

    /// The requests upstream made that nothing stands in for (each an emulator gap or a host
    /// upstream reaches offline), with method, host and path.
    pub fn unserved(&self) -> Vec<String> {
        self.stand_in.unserved()
    }

    /// The stand-in proxy's URL.
    pub fn proxy_url(&self) -> String {
        self.stand_in.url()
    }
}

/// [`extra_env`]'s answer: the environment to append, and the guard of its stand-ins.
pub type ExtraEnv = (Vec<(String, String)>, Option<UpstreamGuard>);

/// What upstream's binary for `cloud` needs beyond what swap maps for ours (environment to
/// append after swap's), and the guard keeping any stand-in running; files go under `dir`.
///
/// - Azure: the stand-in proxy for AAD instance discovery and IMDS: `HTTPS_PROXY`,
///   `HTTP_PROXY` (and lower-case), `NO_PROXY` for loopback (the emulator and the apiserver
///   are reached directly), `SSL_CERT_DIR` with the stand-in's CA. For the cloud-node-manager
///   on a node also [`UpstreamGuard::node_env`].
/// - OpenStack, vSphere, AWS: nothing (their cloud config and SDK environment, as swap writes
///   them, reach the emulators).
pub fn extra_env(cloud: &str, dir: &Path) -> Result<ExtraEnv, UpstreamError> {
    binaries(cloud)?;
    if cloud != "azure" {
        return Ok((Vec::new(), None));
    }
    std::fs::create_dir_all(dir).map_err(|source| UpstreamError::Io {
        what: "creating the directory for upstream's stand-ins",
        path: dir.to_path_buf(),
        source,
    })?;
    let stand_in = proxy::StandIn::start(dir)?;
    let url = stand_in.url();
    let no_proxy = "localhost,127.0.0.1,::1".to_string();
    let env = vec![
        ("HTTPS_PROXY".to_string(), url.clone()),
        ("https_proxy".to_string(), url.clone()),
        ("HTTP_PROXY".to_string(), url.clone()),
        ("http_proxy".to_string(), url),
        ("NO_PROXY".to_string(), no_proxy.clone()),
        ("no_proxy".to_string(), no_proxy),
        ("SSL_CERT_DIR".to_string(), stand_in.ca_dir().display().to_string()),
    ];
    Ok((env, Some(UpstreamGuard { stand_in })))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_cloud_names_its_binaries_and_others_are_refused() {
        for c in CLOUDS {
            assert!(!binaries(c).unwrap().is_empty(), "{c}");
        }
        assert_eq!(
            node_manager_binary("azure", Path::new("/d")).unwrap(),
            Some(PathBuf::from("/d/cloud-node-manager"))
        );
        let e = binaries("gcp").unwrap_err().to_string();
        assert!(e.contains("\"gcp\"") && e.contains("openstack"), "{e}");
        assert!(extra_env("ibm", Path::new("/nonexistent")).is_err());
    }

    #[test]
    fn only_azure_needs_a_stand_in() {
        let dir = std::env::temp_dir().join(crate::unique_name("ccm-upstream-env"));
        for c in ["openstack", "vsphere", "aws"] {
            let (env, guard) = extra_env(c, &dir).unwrap();
            assert!(env.is_empty() && guard.is_none(), "{c}");
        }
        let (env, guard) = extra_env("azure", &dir).unwrap();
        let guard = guard.expect("azure runs a stand-in");
        let get = |k: &str| env.iter().find(|(n, _)| n == k).map(|(_, v)| v.clone());
        assert_eq!(get("HTTPS_PROXY"), Some(guard.proxy_url()));
        assert!(get("NO_PROXY").unwrap().contains("127.0.0.1"));
        let ca_dir = PathBuf::from(get("SSL_CERT_DIR").unwrap());
        assert!(ca_dir.join("ca.crt").is_file());
        drop(guard);
        assert!(!ca_dir.exists(), "the stand-in's CA goes with it");
        let _ = std::fs::remove_dir_all(&dir);
    }
}
