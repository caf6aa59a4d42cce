//! The Helm chart (`charts/cloud-controller-manager`) as a cluster gets it: rendered by the
//! pinned `helm template` (built by `ci/install-tools`, `--print-helm`), so tests exercise the
//! chart's real output and not a copy of it.
//!
//! It owns:
//! - finding `helm` (`CCM_HELM`, else `ci/install-tools --print-helm`) ([`helm`]),
//! - rendering the chart with values into plain JSON objects ([`render`], [`render_with`]),
//! - applying the rendered RBAC (ServiceAccounts, ClusterRoles, ClusterRoleBindings, Roles,
//!   RoleBindings) to a control plane with an admin client ([`apply_rbac`]),
//! - a client acting as a ServiceAccount through a TokenRequest token
//!   ([`service_account_client`]), to act as the chart's in-cluster identity.

use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Api, Client};
use serde_json::Value;

use crate::{ControlPlane, Identity, tools};

/// The chart, relative to the repository root.
pub const CHART_DIR: &str = "charts/cloud-controller-manager";

/// The kinds [`apply_rbac`] applies, in the order it applies them.
pub const RBAC_KINDS: [&str; 5] =
    ["ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"];

/// The field manager of the objects [`apply_rbac`] applies.
const FIELD_MANAGER: &str = "ccm-testbed-chart";

/// Errors of rendering or applying the chart. Each names the step and the object.
#[derive(Debug, thiserror::Error)]
pub enum ChartError {
    /// `helm` was not found or not built.
    #[error("helm not available: {0}")]
    Helm(String),
    /// `helm template` failed.
    #[error("helm template {chart} failed ({status}): {stderr}")]
    Template {
        /// The chart directory.
        chart: PathBuf,
        /// helm's exit status.
        status: String,
        /// helm's error output.
        stderr: String,
    },
    /// The rendered output is not the YAML documents of Kubernetes objects.
    #[error("parsing the rendered chart: {0}")]
    Parse(String),
    /// A rendered object could not be applied.
    #[error("applying {kind} {name}: {source}")]
    Apply {
        /// The object's kind.
        kind: String,
        /// `namespace/name` or `name`.
        name: String,
        /// The API error.
        source: kube::Error,
    },
    /// A client could not be built.
    #[error("building a client for {who}: {detail}")]
    Client {
        /// The identity.
        who: String,
        /// What failed.
        detail: String,
    },
}

/// Where `helm` is: `$CCM_HELM`, or where `ci/install-tools` put it (checked to exist).
pub fn helm() -> Result<PathBuf, ChartError> {
    let path = match std::env::var_os("CCM_HELM") {
        Some(p) => PathBuf::from(p),
        None => {
            let script = tools::repo_root().join("ci/install-tools");
            let out = Command::new(&script).arg("--print-helm").output().map_err(|e| {
                ChartError::Helm(format!("running {} --print-helm: {e}", script.display()))
            })?;
            if !out.status.success() {
                return Err(ChartError::Helm(format!(
                    "{} --print-helm failed: {}",
                    script.display(),
                    String::from_utf8_lossy(&out.stderr).trim()
                )));
            }
            PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())
        }
    };
    if !path.is_file() {
        return Err(ChartError::Helm(format!(
            "{} is missing: run ci/install-tools (or set CCM_HELM)",
            path.display()
        )));
    }
    Ok(path)
}

/// Renders the chart as release `ccm` in `kube-system` with `values` (`--set key=value`).
pub fn render(values: &[(&str, &str)]) -> Result<Vec<Value>, ChartError> {
    render_with("ccm", "kube-system", values)
}

/// Renders the chart as `release` in `namespace` with `values` (`--set key=value`): every
/// rendered object, in helm's order.
pub fn render_with(
    release: &str,
    namespace: &str,
    values: &[(&str, &str)],
) -> Result<Vec<Value>, ChartError> {
    let chart = tools::repo_root().join(CHART_DIR);
    let mut cmd = Command::new(helm()?);
    cmd.arg("template").arg(release).arg(&chart).arg("--namespace").arg(namespace);
    for (k, v) in values {
        cmd.arg("--set").arg(format!("{k}={v}"));
    }
    let out = cmd.output().map_err(|e| ChartError::Helm(format!("running helm: {e}")))?;
    if !out.status.success() {
        return Err(ChartError::Template {
            chart,
            status: out.status.to_string(),
            stderr: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        });
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let docs: Vec<Value> =
        serde_saphyr::from_multiple(&text).map_err(|e| ChartError::Parse(e.to_string()))?;
    let objects: Vec<Value> = docs.into_iter().filter(|d| !d.is_null()).collect();
    if let Some(bad) = objects.iter().find(|o| kind(o).is_empty() || name(o).is_empty()) {
        return Err(ChartError::Parse(format!("a rendered document has no kind or name: {bad}")));
    }
    Ok(objects)
}

/// The object's `kind` ("" if none).
pub fn kind(obj: &Value) -> &str {
    obj["kind"].as_str().unwrap_or_default()
}

/// The object's `metadata.name` ("" if none).
pub fn name(obj: &Value) -> &str {
    obj["metadata"]["name"].as_str().unwrap_or_default()
}

/// The object's `metadata.namespace` (None if cluster-scoped or unset).
pub fn namespace(obj: &Value) -> Option<&str> {
    obj["metadata"]["namespace"].as_str()
}

/// Applies the rendered RBAC objects ([`RBAC_KINDS`], other kinds are skipped) with
/// server-side apply, creating their namespaces when missing. Returns what it applied, as
/// `Kind namespace/name`.
pub async fn apply_rbac(admin: &Client, objects: &[Value]) -> Result<Vec<String>, ChartError> {
    let mut applied = Vec::new();
    for want in RBAC_KINDS {
        for obj in objects.iter().filter(|o| kind(o) == want) {
            let name = name(obj);
            let ns = namespace(obj);
            let what = match ns {
                Some(ns) => format!("{ns}/{name}"),
                None => name.to_string(),
            };
            let err = |source: kube::Error| ChartError::Apply {
                kind: want.to_string(),
                name: what.clone(),
                source,
            };
            let pp = PatchParams::apply(FIELD_MANAGER).force();
            let patch = Patch::Apply(obj);
            match (want, ns) {
                ("ClusterRole", _) => {
                    Api::<ClusterRole>::all(admin.clone()).patch(name, &pp, &patch).await.map(drop)
                }
                ("ClusterRoleBinding", _) => Api::<ClusterRoleBinding>::all(admin.clone())
                    .patch(name, &pp, &patch)
                    .await
                    .map(drop),
                (_, None) => {
                    return Err(ChartError::Parse(format!("{want} {name} has no namespace")));
                }
                (_, Some(ns)) => {
                    ensure_namespace(admin, ns).await.map_err(err)?;
                    match want {
                        "ServiceAccount" => Api::<ServiceAccount>::namespaced(admin.clone(), ns)
                            .patch(name, &pp, &patch)
                            .await
                            .map(drop),
                        "Role" => Api::<Role>::namespaced(admin.clone(), ns)
                            .patch(name, &pp, &patch)
                            .await
                            .map(drop),
                        _ => Api::<RoleBinding>::namespaced(admin.clone(), ns)
                            .patch(name, &pp, &patch)
                            .await
                            .map(drop),
                    }
                }
            }
            .map_err(err)?;
            applied.push(format!("{want} {what}"));
        }
    }
    Ok(applied)
}

async fn ensure_namespace(admin: &Client, ns: &str) -> Result<(), kube::Error> {
    let api = Api::<Namespace>::all(admin.clone());
    let obj = Namespace {
        metadata: ObjectMeta { name: Some(ns.to_string()), ..Default::default() },
        ..Default::default()
    };
    match api.create(&PostParams::default(), &obj).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// A client acting as ServiceAccount `namespace/name`, with a one-hour token the admin client
/// requests through the TokenRequest API (as the kubelet does for a pod).
pub async fn service_account_client(
    cp: &ControlPlane,
    admin: &Client,
    namespace: &str,
    name: &str,
) -> Result<Client, ChartError> {
    let who = format!("system:serviceaccount:{namespace}:{name}");
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(3600),
            ..Default::default()
        },
        ..Default::default()
    };
    let token = Api::<ServiceAccount>::namespaced(admin.clone(), namespace)
        .create_token_request(name, &PostParams::default(), &req)
        .await
        .map_err(|e| ChartError::Client { who: who.clone(), detail: e.to_string() })?
        .status
        .map(|s| s.token)
        .ok_or_else(|| ChartError::Client {
            who: who.clone(),
            detail: "TokenRequest returned no status".into(),
        })?;
    let err = |detail: String| ChartError::Client { who: who.clone(), detail };
    // The control plane's kubeconfig (server, CA) with the token as the only credential.
    let mut json = cp.kubeconfig_json(&Identity::admin()).map_err(|e| err(e.to_string()))?;
    json["users"] = serde_json::json!([{"name": Identity::admin().user, "user": {"token": token}}]);
    let kubeconfig: Kubeconfig = serde_json::from_value(json).map_err(|e| err(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| err(e.to_string()))?;
    Client::try_from(config).map_err(|e| err(e.to_string()))
}
