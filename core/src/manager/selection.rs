//! `--controllers` (and `--webhooks`) semantics (spec §7.2): `*`, `name`, `-name`, aliases.
//!
//! Validation resolves aliases to canonical names and keeps the `-` prefix; enablement scans in
//! order and the first explicit entry wins, else `*` enables everything not disabled by
//! default (none of the core's controllers is; a provider's extra controller may be).

use super::flags::FlagError;
use crate::controllers::ControllerDescriptor;

/// The validated `--controllers` list, with aliases rewritten to canonical names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerSelection {
    /// Entries in order: `*`, `name` or `-name` (canonical names).
    pub entries: Vec<String>,
}

/// Validates `list` against the known controllers, resolving aliases.
pub fn validate(
    list: &[String],
    known: &[ControllerDescriptor],
) -> Result<ControllerSelection, FlagError> {
    let names: Vec<(&str, &str)> = known.iter().map(|c| (c.name, c.alias)).collect();
    validate_names(list, &names, "controllers").map(|entries| ControllerSelection { entries })
}

/// Validates a `*`/`name`/`-name` list against `(canonical, alias)` pairs; `what` is
/// `controllers` or `webhooks` (used in the error message).
pub fn validate_names(
    list: &[String],
    known: &[(&str, &str)],
    what: &str,
) -> Result<Vec<String>, FlagError> {
    let mut out = Vec::with_capacity(list.len());
    for raw in list.iter().map(|s| s.trim()).filter(|s| !s.is_empty()) {
        if raw == "*" {
            out.push("*".to_string());
            continue;
        }
        let (neg, name) = match raw.strip_prefix('-') {
            Some(n) => (true, n),
            None => (false, raw),
        };
        let canonical = known
            .iter()
            .find(|(c, a)| *c == name || (!a.is_empty() && *a == name))
            .map(|(c, _)| *c)
            .ok_or_else(|| {
                FlagError::Invalid(format!(
                    "--{what}: {name:?} is not in the list of known {what} ({})",
                    known.iter().map(|(c, a)| format!("{c} ({a})")).collect::<Vec<_>>().join(", ")
                ))
            })?;
        out.push(if neg { format!("-{canonical}") } else { canonical.to_string() });
    }
    Ok(out)
}

/// Whether `name` is enabled by `entries` (first explicit entry wins, else `*`).
pub fn is_enabled(name: &str, disabled_by_default: &[&str], entries: &[String]) -> bool {
    let mut has_star = false;
    for e in entries {
        if e == name {
            return true;
        }
        if e.strip_prefix('-') == Some(name) {
            return false;
        }
        if e == "*" {
            has_star = true;
        }
    }
    has_star && !disabled_by_default.contains(&name)
}

impl ControllerSelection {
    /// The enabled controllers among `known`, in `known`'s order.
    pub fn enabled(&self, known: &[ControllerDescriptor]) -> Vec<ControllerDescriptor> {
        self.enabled_with_defaults(known, &[])
    }

    /// [`Self::enabled`] where `*` does not enable `disabled_by_default` (a provider's
    /// opt-in controllers); naming them enables them.
    pub fn enabled_with_defaults(
        &self,
        known: &[ControllerDescriptor],
        disabled_by_default: &[&str],
    ) -> Vec<ControllerDescriptor> {
        known
            .iter()
            .filter(|c| is_enabled(c.name, disabled_by_default, &self.entries))
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::controllers::{ControllerContext, StartError, Started};

    fn start(_: &ControllerContext) -> Result<Started, StartError> {
        Ok(Started::Skipped("test".into()))
    }

    fn known() -> Vec<ControllerDescriptor> {
        [
            ("cloud-node-controller", "cloud-node"),
            ("cloud-node-lifecycle-controller", "cloud-node-lifecycle"),
            ("service-lb-controller", "service"),
            ("node-route-controller", "route"),
            ("node-ipam-controller", "nodeipam"),
        ]
        .into_iter()
        .map(|(name, alias)| ControllerDescriptor { name, alias, client_name: "x", start })
        .collect()
    }

    fn enabled(list: &[&str]) -> Vec<&'static str> {
        let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
        validate(&list, &known()).unwrap().enabled(&known()).iter().map(|c| c.name).collect()
    }

    #[test]
    fn star_minus_alias() {
        assert_eq!(
            enabled(&["*", "-route"]),
            vec![
                "cloud-node-controller",
                "cloud-node-lifecycle-controller",
                "service-lb-controller",
                "node-ipam-controller"
            ]
        );
    }

    #[test]
    fn explicit_names_and_first_match_wins() {
        assert_eq!(
            enabled(&["service", "cloud-node-controller"]),
            vec!["cloud-node-controller", "service-lb-controller"]
        );
        // First match wins: `-service` before `service` disables it.
        assert_eq!(enabled(&["-service", "service", "*"]).len(), 4);
        assert_eq!(enabled(&["route", "-route"]), vec!["node-route-controller"]);
        assert!(enabled(&[]).is_empty());
    }

    #[test]
    fn aliases_rewritten_to_canonical() {
        let list = vec!["*".to_string(), "-route".to_string(), "nodeipam".to_string()];
        assert_eq!(
            validate(&list, &known()).unwrap().entries,
            vec!["*", "-node-route-controller", "node-ipam-controller"]
        );
    }

    #[test]
    fn star_skips_disabled_by_default_but_naming_enables() {
        let sel = |list: &[&str]| {
            let list: Vec<String> = list.iter().map(|s| s.to_string()).collect();
            let names: Vec<&str> = validate(&list, &known())
                .unwrap()
                .enabled_with_defaults(&known(), &["node-ipam-controller"])
                .iter()
                .map(|c| c.name)
                .collect();
            names.contains(&"node-ipam-controller")
        };
        assert!(!sel(&["*"]));
        assert!(sel(&["*", "nodeipam"]));
        assert!(sel(&["node-ipam-controller"]));
    }

    #[test]
    fn unknown_names_rejected() {
        let err = validate(&["-nope".to_string()], &known()).unwrap_err().to_string();
        assert!(err.contains("\"nope\" is not in the list of known controllers"), "{err}");
    }
}
