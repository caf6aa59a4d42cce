//! The Helm chart (`charts/cloud-controller-manager`) as a cluster gets it: rendered by the
//! pinned `helm template` (built by `ci/install-tools`, `--print-helm`), so tests exercise the
//! chart's real output and not a copy of it.
//!
//! It owns:
//! - finding `helm` (`CCM_HELM`, else `ci/install-tools --print-helm`) ([`helm`]),
//! - rendering the chart with values into plain JSON objects ([`render`], [`render_with`]),
//!   and with a cloud's preset `values-<cloud>.yaml` ([`presets`], [`render_preset`]),
//! - a server-side dry-run apply of every rendered object, whatever its kind, through API
//!   discovery ([`dry_run_apply`]): the apiserver validates and admits each as it would on
//!   install, and stores nothing,
//! - the manager's command line as the chart runs it ([`workload`], [`container_args`]),
//! - applying the rendered RBAC (ServiceAccounts, ClusterRoles, ClusterRoleBindings, Roles,
//!   RoleBindings) to a control plane with an admin client ([`apply_rbac`]),
//! - applying any rendered objects for real, e.g. the node manager's admission policy
//!   ([`apply`]),
//! - the manager's ServiceAccount ([`manager_service_account`]),
//! - a client acting as a ServiceAccount through a TokenRequest token
//!   ([`service_account_client`]), to act as the chart's in-cluster identity, or with any
//!   bearer token ([`token_client`]).

use std::path::PathBuf;
use std::process::Command;

use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use kube::api::{DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::core::GroupVersionKind;
use kube::discovery::{Discovery, Scope};
use kube::{Api, Client};
use serde_json::Value;

use crate::{ControlPlane, Identity, tools};

/// The chart, relative to the repository root.
pub const CHART_DIR: &str = "charts/cloud-controller-manager";

/// Every optional value of the chart at once (relative to [`CHART_DIR`]): what `ci/check-chart`
/// lints on top of each preset.
pub const ALL_OPTIONAL_VALUES: &str = "ci/all-optional-values.yaml";

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
    /// A rendered object's kind is not served by the apiserver.
    #[error("the apiserver serves no {api_version} {kind} (object {name})")]
    UnknownKind {
        /// The object's apiVersion.
        api_version: String,
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
    },
    /// API discovery failed.
    #[error("API discovery: {0}")]
    Discovery(kube::Error),
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
    template(release, namespace, &[], values)
}

/// The clouds the chart has a preset for: every `values-<cloud>.yaml` next to its
/// `values.yaml`, sorted. Adding a cloud's preset file adds it here (and to every test that
/// iterates over the presets).
pub fn presets() -> Result<Vec<String>, ChartError> {
    let dir = tools::repo_root().join(CHART_DIR);
    let entries = std::fs::read_dir(&dir)
        .map_err(|e| ChartError::Parse(format!("listing {}: {e}", dir.display())))?;
    let mut clouds: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            name.strip_prefix("values-")?.strip_suffix(".yaml").map(str::to_string)
        })
        .collect();
    clouds.sort();
    Ok(clouds)
}

/// Renders the chart as `release` in `namespace` with the preset `values-<cloud>.yaml` and
/// then `values` (`--set key=value`).
pub fn render_preset(
    cloud: &str,
    release: &str,
    namespace: &str,
    values: &[(&str, &str)],
) -> Result<Vec<Value>, ChartError> {
    let file = tools::repo_root().join(CHART_DIR).join(format!("values-{cloud}.yaml"));
    if !file.is_file() {
        return Err(ChartError::Helm(format!("the chart has no preset {}", file.display())));
    }
    template(release, namespace, &[file], values)
}

/// [`render_preset`] with more values files after the preset (paths relative to
/// [`CHART_DIR`], e.g. [`ALL_OPTIONAL_VALUES`]), then `values`.
pub fn render_preset_with_files(
    cloud: &str,
    release: &str,
    namespace: &str,
    files: &[&str],
    values: &[(&str, &str)],
) -> Result<Vec<Value>, ChartError> {
    let dir = tools::repo_root().join(CHART_DIR);
    let mut paths = vec![dir.join(format!("values-{cloud}.yaml"))];
    paths.extend(files.iter().map(|f| dir.join(f)));
    if let Some(missing) = paths.iter().find(|p| !p.is_file()) {
        return Err(ChartError::Helm(format!("no values file {}", missing.display())));
    }
    template(release, namespace, &paths, values)
}

fn template(
    release: &str,
    namespace: &str,
    values_files: &[PathBuf],
    values: &[(&str, &str)],
) -> Result<Vec<Value>, ChartError> {
    let chart = tools::repo_root().join(CHART_DIR);
    let mut cmd = Command::new(helm()?);
    cmd.arg("template").arg(release).arg(&chart).arg("--namespace").arg(namespace);
    for f in values_files {
        cmd.arg("--values").arg(f);
    }
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

/// The rendered workload running the manager (the DaemonSet or Deployment whose pod has the
/// container `cloud-controller-manager`; other workloads, such as Azure's node manager
/// DaemonSet, are not it).
pub fn workload(objects: &[Value]) -> Result<&Value, ChartError> {
    objects
        .iter()
        .filter(|o| matches!(kind(o), "DaemonSet" | "Deployment"))
        .find(|o| {
            o["spec"]["template"]["spec"]["containers"]
                .as_array()
                .is_some_and(|cs| cs.iter().any(|c| c["name"] == "cloud-controller-manager"))
        })
        .ok_or_else(|| ChartError::Parse("the chart renders no DaemonSet or Deployment".into()))
}

/// The rendered ServiceAccount the manager's pod runs as (its workload's
/// `serviceAccountName`).
pub fn manager_service_account(objects: &[Value]) -> Result<&Value, ChartError> {
    let w = workload(objects)?;
    let want = w["spec"]["template"]["spec"]["serviceAccountName"].as_str().unwrap_or_default();
    objects.iter().find(|o| kind(o) == "ServiceAccount" && name(o) == want).ok_or_else(|| {
        ChartError::Parse(format!("the chart renders no ServiceAccount {want:?} for its workload"))
    })
}

/// The manager container's `command` followed by its `args`, as the kubelet would run them.
pub fn container_args(workload: &Value) -> Result<Vec<String>, ChartError> {
    let container = workload["spec"]["template"]["spec"]["containers"]
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["name"] == "cloud-controller-manager"))
        .ok_or_else(|| {
            ChartError::Parse(format!(
                "{} {} has no container cloud-controller-manager",
                kind(workload),
                name(workload)
            ))
        })?;
    let strings = |v: &Value| -> Result<Vec<String>, ChartError> {
        v.as_array()
            .map(|a| a.iter().map(|s| s.as_str().map(str::to_string)).collect::<Option<Vec<_>>>())
            .unwrap_or(Some(Vec::new()))
            .ok_or_else(|| ChartError::Parse(format!("a non-string command or arg: {v}")))
    };
    let mut argv = strings(&container["command"])?;
    argv.extend(strings(&container["args"])?);
    Ok(argv)
}

/// Applies every rendered object with server-side apply and `dryRun=All`: the apiserver
/// decodes, defaults, validates and admits each one (schema, field validation `Strict`, the
/// RBAC escalation checks; what is only checked when a pod is created, such as the priority
/// class, is not) as on install, and persists nothing. Namespaces
/// the objects name are not created: they must exist. Returns what it applied, as
/// `Kind namespace/name`; the first rejected object is the error.
pub async fn dry_run_apply(admin: &Client, objects: &[Value]) -> Result<Vec<String>, ChartError> {
    server_side_apply(admin, objects, true).await
}

/// Applies `objects` for real (server-side apply, strict field validation), whatever their
/// kinds, through API discovery; their namespaces must exist. Returns what it applied, as
/// `Kind namespace/name`; the first rejected object is the error.
pub async fn apply(admin: &Client, objects: &[Value]) -> Result<Vec<String>, ChartError> {
    server_side_apply(admin, objects, false).await
}

async fn server_side_apply(
    admin: &Client,
    objects: &[Value],
    dry_run: bool,
) -> Result<Vec<String>, ChartError> {
    let discovery = Discovery::new(admin.clone()).run().await.map_err(ChartError::Discovery)?;
    let mut pp = PatchParams::apply(FIELD_MANAGER).force();
    pp.dry_run = dry_run;
    pp = pp.validation_strict();
    let mut applied = Vec::new();
    for obj in objects {
        let (kind, name) = (kind(obj), name(obj));
        let api_version = obj["apiVersion"].as_str().unwrap_or_default();
        let (group, version) = api_version.split_once('/').unwrap_or(("", api_version));
        let gvk = GroupVersionKind::gvk(group, version, kind);
        let unknown = || ChartError::UnknownKind {
            api_version: api_version.to_string(),
            kind: kind.to_string(),
            name: name.to_string(),
        };
        let (resource, caps) = discovery.resolve_gvk(&gvk).ok_or_else(unknown)?;
        let (api, what): (Api<DynamicObject>, String) = match (&caps.scope, namespace(obj)) {
            (Scope::Cluster, _) => (Api::all_with(admin.clone(), &resource), name.to_string()),
            (Scope::Namespaced, Some(ns)) => {
                (Api::namespaced_with(admin.clone(), ns, &resource), format!("{ns}/{name}"))
            }
            (Scope::Namespaced, None) => {
                return Err(ChartError::Parse(format!(
                    "namespaced {kind} {name} has no namespace"
                )));
            }
        };
        api.patch(name, &pp, &Patch::Apply(obj)).await.map_err(|source| ChartError::Apply {
            kind: kind.to_string(),
            name: what.clone(),
            source,
        })?;
        applied.push(format!("{kind} {what}"));
    }
    Ok(applied)
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

/// A kubeconfig (as JSON) for ServiceAccount `namespace/name`: the control plane's server and
/// CA, and a one-hour token the admin client requests through the TokenRequest API (as the
/// kubelet does for a pod) as the only credential.
pub async fn service_account_kubeconfig(
    cp: &ControlPlane,
    admin: &Client,
    namespace: &str,
    name: &str,
) -> Result<Value, ChartError> {
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
    let mut json = cp
        .kubeconfig_json(&Identity::admin())
        .map_err(|e| ChartError::Client { who: who.clone(), detail: e.to_string() })?;
    json["users"] = serde_json::json!([{"name": Identity::admin().user, "user": {"token": token}}]);
    Ok(json)
}

/// A client whose only credential is the bearer `token` (e.g. a TokenRequest token bound to a
/// Pod); `who` names it in errors.
pub async fn token_client(cp: &ControlPlane, who: &str, token: &str) -> Result<Client, ChartError> {
    let err = |detail: String| ChartError::Client { who: who.to_string(), detail };
    let mut json = cp.kubeconfig_json(&Identity::admin()).map_err(|e| err(e.to_string()))?;
    json["users"] = serde_json::json!([{"name": Identity::admin().user, "user": {"token": token}}]);
    let kubeconfig: Kubeconfig = serde_json::from_value(json).map_err(|e| err(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| err(e.to_string()))?;
    Client::try_from(config).map_err(|e| err(e.to_string()))
}

/// A client acting as ServiceAccount `namespace/name` ([`service_account_kubeconfig`]).
pub async fn service_account_client(
    cp: &ControlPlane,
    admin: &Client,
    namespace: &str,
    name: &str,
) -> Result<Client, ChartError> {
    let who = format!("system:serviceaccount:{namespace}:{name}");
    let err = |detail: String| ChartError::Client { who: who.clone(), detail };
    let json = service_account_kubeconfig(cp, admin, namespace, name).await?;
    let kubeconfig: Kubeconfig = serde_json::from_value(json).map_err(|e| err(e.to_string()))?;
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .map_err(|e| err(e.to_string()))?;
    Client::try_from(config).map_err(|e| err(e.to_string()))
}
