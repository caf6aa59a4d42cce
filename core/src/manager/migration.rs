//! Leader migration (KEP-2436, spec §8): the `LeaderMigrationConfiguration` file and the split
//! of controllers between the main lock and the migration lock.
//!
//! QUIRK kept: controllers are matched by their **canonical** names with no alias resolution,
//! so the default configuration (`route-controller`, `service-controller`,
//! `cloud-node-lifecycle-controller`) migrates only `cloud-node-lifecycle-controller`. The
//! kube-controller-manager applies the same filter; resolving aliases on one side only would
//! make both managers run the same controller at once.

use serde::Deserialize;

use crate::controllers::ControllerDescriptor;

/// The API group of the configuration.
pub const GROUP: &str = "controllermanager.config.k8s.io";
/// The kind of the configuration.
pub const KIND: &str = "LeaderMigrationConfiguration";

/// An invalid configuration.
#[derive(Debug, thiserror::Error)]
pub enum MigrationError {
    /// The file could not be read.
    #[error("--leader-migration-config: cannot read {path:?}: {source}")]
    Read {
        /// The path.
        path: String,
        /// The IO error.
        #[source]
        source: std::io::Error,
    },
    /// The content is not a valid configuration.
    #[error("--leader-migration-config: failed to parse leader migration configuration: {0}")]
    Parse(String),
}

/// One `controllerLeaders` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerLeader {
    /// Controller name.
    #[serde(default)]
    pub name: String,
    /// `kube-controller-manager`, `cloud-controller-manager` or `*`.
    #[serde(default)]
    pub component: String,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct Raw {
    #[serde(default)]
    api_version: String,
    #[serde(default)]
    kind: String,
    #[serde(default)]
    leader_name: String,
    #[serde(default)]
    resource_lock: Option<String>,
    #[serde(default)]
    controller_leaders: Vec<ControllerLeader>,
}

/// A validated configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaderMigrationConfig {
    /// The migration lock's name.
    pub leader_name: String,
    /// Always `leases` here.
    pub resource_lock: String,
    /// Which component owns which controller during migration.
    pub controller_leaders: Vec<ControllerLeader>,
}

/// The default configuration (used when `--leader-migration-config` is empty).
pub fn default_config() -> LeaderMigrationConfig {
    let leader = |name: &str| ControllerLeader { name: name.into(), component: "*".into() };
    LeaderMigrationConfig {
        leader_name: "cloud-provider-extraction-migration".into(),
        resource_lock: "leases".into(),
        controller_leaders: vec![
            leader("route-controller"),
            leader("service-controller"),
            leader("cloud-node-lifecycle-controller"),
        ],
    }
}

/// Parses and validates a configuration file's contents.
pub fn parse(content: &str) -> Result<LeaderMigrationConfig, MigrationError> {
    let perr = |m: String| MigrationError::Parse(m);
    let raw: Raw = serde_saphyr::from_str(content).map_err(|e| perr(e.to_string()))?;
    let version = match raw.api_version.split_once('/') {
        Some((GROUP, v @ ("v1" | "v1beta1" | "v1alpha1"))) => v.to_string(),
        _ => {
            return Err(perr(format!(
                "unsupported apiVersion {:?} (want {GROUP}/v1, v1beta1 or v1alpha1)",
                raw.api_version
            )));
        }
    };
    if raw.kind != KIND {
        return Err(perr(format!("unsupported kind {:?} (want {KIND})", raw.kind)));
    }
    let resource_lock = match (version.as_str(), raw.resource_lock) {
        ("v1", Some(_)) => {
            return Err(perr(format!("unknown field \"resourceLock\" in {GROUP}/v1 {KIND}")));
        }
        ("v1", None) => "leases".to_string(),
        (_, lock) => lock.unwrap_or_default(),
    };
    if raw.leader_name.is_empty() {
        return Err(perr("leaderName must be set for LeaderMigrationConfiguration".into()));
    }
    match resource_lock.as_str() {
        "leases" => {}
        "endpoints" => {
            return Err(perr(
                "resourceLock \"endpoints\" is not supported by this manager; use \"leases\""
                    .into(),
            ));
        }
        _ => return Err(perr("resource Lock must be one of 'leases' or 'endpoints'".into())),
    }
    for (i, l) in raw.controller_leaders.iter().enumerate() {
        if l.name.is_empty() {
            return Err(perr(format!("controllerLeaders[{i}].name must be set")));
        }
        if l.component.is_empty() {
            return Err(perr(format!("controllerLeaders[{i}].component must be set")));
        }
    }
    Ok(LeaderMigrationConfig {
        leader_name: raw.leader_name,
        resource_lock,
        controller_leaders: raw.controller_leaders,
    })
}

/// Loads `--leader-migration-config` (empty: the default configuration).
pub fn load(path: &str) -> Result<LeaderMigrationConfig, MigrationError> {
    if path.is_empty() {
        tracing::info!("no leader migration configuration given; using the default");
        return Ok(default_config());
    }
    let content = std::fs::read_to_string(path)
        .map_err(|source| MigrationError::Read { path: path.to_string(), source })?;
    parse(&content)
}

impl LeaderMigrationConfig {
    /// Splits `enabled` into (non-migrated: main lock, migrated: migration lock) for
    /// `component`; controllers owned by another component are dropped (never run here).
    pub fn split(
        &self,
        enabled: &[ControllerDescriptor],
        component: &str,
    ) -> (Vec<ControllerDescriptor>, Vec<ControllerDescriptor>) {
        let mut main = Vec::new();
        let mut migrated = Vec::new();
        for c in enabled {
            match self.controller_leaders.iter().find(|l| l.name == c.name) {
                None => main.push(*c),
                Some(l) if l.component == component || l.component == "*" => migrated.push(*c),
                Some(l) => tracing::info!(
                    controller = c.name,
                    owner = %l.component,
                    "controller is owned by another component during migration; not starting it"
                ),
            }
        }
        (main, migrated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers;

    #[test]
    fn parses_v1_and_rejects_unknown_fields() {
        let c = parse(
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: mig\ncontrollerLeaders:\n  - name: cloud-node-lifecycle-controller\n    component: kube-controller-manager\n",
        )
        .unwrap();
        assert_eq!(c.leader_name, "mig");
        assert_eq!(c.resource_lock, "leases");
        let err = parse("apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: x\nbogus: 1\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("failed to parse leader migration configuration") && err.contains("bogus"),
            "{err}"
        );
        let err = parse(
            "apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\n",
        )
        .unwrap_err()
        .to_string();
        assert!(err.contains("leaderName must be set"), "{err}");
        let err = parse("apiVersion: controllermanager.config.k8s.io/v1\nkind: LeaderMigrationConfiguration\nleaderName: x\nresourceLock: leases\n")
            .unwrap_err()
            .to_string();
        assert!(err.contains("resourceLock"), "{err}");
        let c = parse("apiVersion: controllermanager.config.k8s.io/v1beta1\nkind: LeaderMigrationConfiguration\nleaderName: x\nresourceLock: leases\n").unwrap();
        assert_eq!(c.resource_lock, "leases");
    }

    #[test]
    fn default_config_migrates_only_canonical_names() {
        let all = controllers::all();
        let (main, migrated) = default_config().split(&all, "cloud-controller-manager");
        let migrated: Vec<_> = migrated.iter().map(|c| c.name).collect();
        assert_eq!(migrated, vec!["cloud-node-lifecycle-controller"]);
        assert!(main.iter().all(|c| c.name != "cloud-node-lifecycle-controller"));
        let owned_by_kcm = LeaderMigrationConfig {
            controller_leaders: vec![ControllerLeader {
                name: "cloud-node-lifecycle-controller".into(),
                component: "kube-controller-manager".into(),
            }],
            ..default_config()
        };
        let (main, migrated) = owned_by_kcm.split(&all, "cloud-controller-manager");
        assert!(migrated.is_empty());
        assert!(main.iter().all(|c| c.name != "cloud-node-lifecycle-controller"));
    }
}
