//! Key tables for the generated reference pages (issue #20, docs site).
//!
//! Each provider's cloud-config parser and Service-annotation parser owns a table of the keys
//! it accepts ([`KeyDoc`]) and looks keys up in it while parsing, so the table is the parser's
//! own list and cannot drift from it. `ccm-docgen` renders the tables into `docs/reference/`.
//! Nothing here is provider-specific.

/// One key a parser accepts: a cloud-config key (`section` set) or an annotation (`section`
/// empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyDoc {
    /// The INI section (`Global`, `VirtualCenter "<server>"`, ...); empty for annotations.
    pub section: &'static str,
    /// The key as documented (parsers compare case-insensitively where upstream does).
    pub key: &'static str,
    /// The value's type and default, e.g. `bool, default false`.
    pub value: &'static str,
    /// A value the parser accepts (the parsers' tests feed every example back in).
    pub example: &'static str,
    /// What the key does, one or two sentences.
    pub doc: &'static str,
}

/// A Service annotation's entry (annotations have no INI section).
pub const fn annotation(
    key: &'static str,
    value: &'static str,
    example: &'static str,
    doc: &'static str,
) -> KeyDoc {
    KeyDoc { section: "", key, value, example, doc }
}

/// The entry for `key` in `section` (both case-insensitive; `section` compared up to its first
/// space, so `VirtualCenter "vc1"` finds `VirtualCenter "<server>"`).
pub fn lookup<'t>(table: &'t [KeyDoc], section: &str, key: &str) -> Option<&'t KeyDoc> {
    let head = |s: &str| s.split_whitespace().next().unwrap_or_default().to_ascii_lowercase();
    table.iter().find(|k| k.key.eq_ignore_ascii_case(key) && head(k.section) == head(section))
}

/// Whether `table` has `key` (any section).
pub fn has_key(table: &[KeyDoc], key: &str) -> bool {
    table.iter().any(|k| k.key.eq_ignore_ascii_case(key))
}

/// The table as a Markdown table (one row per key, grouped by section in table order).
pub fn markdown(table: &[KeyDoc]) -> String {
    let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let mut out = String::new();
    let mut section = None;
    for k in table {
        if section != Some(k.section) {
            section = Some(k.section);
            if !k.section.is_empty() {
                out.push_str(&format!("\n### `[{}]`\n", k.section));
            }
            out.push_str("\n| key | value | example | what it does |\n|---|---|---|---|\n");
        }
        out.push_str(&format!(
            "| `{}` | {} | `{}` | {} |\n",
            k.key,
            cell(k.value),
            cell(k.example),
            cell(k.doc)
        ));
    }
    out
}

/// The manager's command line (`Flags`, the clap command itself) as Markdown: one table per help
/// heading, in clap's order, with each flag's default and help text.
pub fn flags_markdown() -> String {
    use clap::CommandFactory;
    let cmd = crate::manager::flags::Flags::command();
    let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
    let mut out = String::new();
    let mut heading: Option<String> = None;
    for arg in cmd.get_arguments() {
        let Some(long) = arg.get_long() else { continue };
        if arg.is_hide_set() {
            continue;
        }
        let h = arg.get_help_heading().unwrap_or("Other flags").to_string();
        if heading.as_deref() != Some(h.as_str()) {
            out.push_str(&format!(
                "\n## {h}\n\n| flag | default | what it does |\n|---|---|---|\n"
            ));
            heading = Some(h);
        }
        let defaults: Vec<String> =
            arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
        let default = match defaults.join(",") {
            d if d.is_empty() => String::new(),
            d => format!("`{}`", cell(&d)),
        };
        let help =
            arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default();
        out.push_str(&format!("| `--{long}` | {default} | {} |\n", cell(&help)));
    }
    out
}

/// One metric family as the manager exposes it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct MetricDoc {
    /// The exposed name (counters with `_total`).
    pub name: String,
    /// `counter`, `gauge`, `histogram`, ...
    pub kind: String,
    /// The help text.
    pub help: String,
    /// The label names of the samples seen (empty when no sample exists yet).
    pub labels: Vec<String>,
}

/// Parses the `# HELP` / `# TYPE` lines and sample label names of a Prometheus text exposition,
/// sorted by name.
pub fn metric_docs(exposition: &str) -> Vec<MetricDoc> {
    let mut out: std::collections::BTreeMap<String, MetricDoc> = Default::default();
    let mut current = String::new();
    for line in exposition.lines() {
        if let Some(rest) = line.strip_prefix("# HELP ") {
            let (name, help) = rest.split_once(' ').unwrap_or((rest, ""));
            current = name.to_string();
            out.entry(current.clone())
                .or_insert_with(|| MetricDoc {
                    name: current.clone(),
                    kind: String::new(),
                    help: String::new(),
                    labels: Vec::new(),
                })
                .help = help.to_string();
        } else if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (_, kind) = rest.split_once(' ').unwrap_or((rest, ""));
            if let Some(m) = out.get_mut(&current) {
                m.kind = kind.to_string();
            }
        } else if !line.starts_with('#')
            && let (Some(m), Some(labels)) = (out.get_mut(&current), line.split_once('{'))
        {
            for pair in labels.1.split("\",") {
                if let Some((k, _)) = pair.split_once("=\"") {
                    let k = k.trim_start_matches(',').to_string();
                    if k != "le" && k != "quantile" && !m.labels.contains(&k) {
                        m.labels.push(k);
                    }
                }
            }
            m.labels.sort();
        }
    }
    out.into_values().collect()
}

/// The families as a Markdown table.
pub fn metrics_table(metrics: &[MetricDoc]) -> String {
    let mut out = String::from("| metric | type | labels | help |\n|---|---|---|---|\n");
    for m in metrics {
        let labels = m.labels.iter().map(|l| format!("`{l}`")).collect::<Vec<_>>().join(", ");
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            m.name,
            m.kind,
            labels,
            m.help.replace('|', "\\|")
        ));
    }
    out
}

/// Every metric family the manager registers, read from a real registry: the manager's own
/// families, `cloud`'s, and every controller's, each controller started (against an apiserver
/// that never answers) just long enough to register its families, then stopped.
#[cfg(feature = "testing")]
pub async fn registered_metrics(
    cloud: std::sync::Arc<dyn crate::cloud::CloudProvider>,
) -> Result<Vec<MetricDoc>, String> {
    use std::sync::{Arc, Mutex};

    use crate::controllers::{ControllerConfig, ControllerContext, Started};

    let registry = Arc::new(Mutex::new(prometheus_client::registry::Registry::default()));
    crate::manager::register_manager_metrics(&registry);
    {
        let mut reg = registry.lock().unwrap_or_else(|p| p.into_inner());
        crate::manager::metrics::register(&mut reg);
        cloud.register_metrics(&mut reg);
    }
    // Nothing listens on port 1: every API call fails fast; the controllers only register.
    let url: http::Uri = "http://127.0.0.1:1".parse().map_err(|e| format!("{e}"))?;
    let client = kube::Client::try_from(kube::Config::new(url)).map_err(|e| e.to_string())?;
    let config = ControllerConfig {
        allocate_node_cidrs: true,
        cluster_cidrs: vec!["10.244.0.0/16".parse().map_err(|e| format!("{e}"))?],
        configure_cloud_routes: true,
        ..Default::default()
    };
    let shutdown = tokio_util::sync::CancellationToken::new();
    let ctx = ControllerContext {
        client,
        cloud,
        config: Arc::new(config),
        metrics: registry.clone(),
        shutdown: shutdown.clone(),
        nodes: None,
    };
    for c in crate::controllers::all() {
        match (c.start)(&ctx) {
            Ok(Started::Running(fut)) => {
                // Each controller registers its families before its first API call, which
                // cannot complete at once: one poll registers them, on any machine load (a
                // spawned task given "a moment" could miss it and make the page flap).
                let mut fut = Box::pin(fut);
                let _ = futures::poll!(fut.as_mut());
            }
            Ok(Started::Skipped(why)) => return Err(format!("{}: skipped: {why}", c.name)),
            Err(e) => return Err(e.to_string()),
        }
    }
    shutdown.cancel();
    let mut text = String::new();
    prometheus_client::encoding::text::encode(
        &mut text,
        &registry.lock().unwrap_or_else(|p| p.into_inner()),
    )
    .map_err(|e| e.to_string())?;
    let mut docs = metric_docs(&text);
    // Labelled families without a sample yet are not encoded: add them from their description.
    for (name, kind, labels, help) in crate::manager::metrics::DESCRIBED {
        match docs.iter_mut().find(|d| d.name == *name) {
            Some(d) if d.labels.is_empty() => {
                d.labels = labels.iter().map(|l| l.to_string()).collect()
            }
            Some(_) => {}
            None => docs.push(MetricDoc {
                name: name.to_string(),
                kind: kind.to_string(),
                help: help.to_string(),
                labels: labels.iter().map(|l| l.to_string()).collect(),
            }),
        }
    }
    // Cloud families are listed per cloud ([`all_cloud_metric_families`]).
    let cloud: Vec<&str> = crate::cloud_call::api_metrics::CLOUDS
        .iter()
        .flat_map(|c| c.families.iter().map(|f| f.name))
        .collect();
    docs.retain(|d| !cloud.iter().any(|c| c.strip_suffix("_total").unwrap_or(c) == d.name));
    docs.sort();
    Ok(docs)
}

/// Every cloud's API metric families, from the descriptors the clients record through
/// ([`crate::cloud_call::api_metrics::CLOUDS`]): (cloud title, upstream source, families),
/// each family under its exact sample name with its label names, whether or not it has a
/// sample. Clouds without any (vSphere, IBM Cloud) are not listed.
pub fn all_cloud_metric_families() -> Vec<(&'static str, &'static str, Vec<MetricDoc>)> {
    crate::cloud_call::api_metrics::CLOUDS
        .iter()
        .map(|c| {
            let docs = c
                .families
                .iter()
                .map(|f| MetricDoc {
                    name: f.name.to_string(),
                    kind: f.exposed_type().to_string(),
                    help: f.help.to_string(),
                    labels: f.labels.iter().map(|l| l.to_string()).collect(),
                })
                .collect();
            (c.title, c.source, docs)
        })
        .collect()
}

/// The per-cloud sections of the metrics reference, Markdown (`## <cloud>` and a table per
/// cloud, then a line for the clouds that have no API families).
pub fn cloud_metrics_markdown() -> String {
    let mut out = String::new();
    for (title, source, docs) in all_cloud_metric_families() {
        out.push_str(&format!(
            "## {title}\n\nUpstream's names, labels and buckets ({source}). Counters whose \
             upstream name has no `_total` are served under that exact name with type \
             `unknown` (OpenMetrics reserves `counter` for `_total` names).\n\n{}\n",
            metrics_table(&docs)
        ));
    }
    out.push_str(
        "## vSphere, IBM Cloud\n\nNo API metric families (their upstream providers register \
         none).\n",
    );
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const T: &[KeyDoc] = &[
        KeyDoc { section: "Global", key: "Zone", value: "string", example: "a", doc: "z" },
        KeyDoc {
            section: "VirtualCenter \"<server>\"",
            key: "user",
            value: "s",
            example: "u",
            doc: "a|b",
        },
    ];

    #[test]
    fn lookup_ignores_case_and_the_section_argument() {
        assert_eq!(lookup(T, "global", "zone").map(|k| k.key), Some("Zone"));
        assert_eq!(lookup(T, "VirtualCenter \"vc1\"", "USER").map(|k| k.key), Some("user"));
        assert!(lookup(T, "Global", "user").is_none());
        assert!(has_key(T, "ZONE") && !has_key(T, "nope"));
    }

    #[test]
    fn exposition_is_read_into_sorted_families_with_label_names() {
        let text = "# HELP b_total B.\n# TYPE b_total counter\nb_total{name=\"x\",code=\"200\"} 1\n# HELP a A.\n# TYPE a histogram\na_bucket{le=\"1\",verb=\"GET\"} 0\n# EOF\n";
        let m = metric_docs(text);
        assert_eq!(m.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(), ["a", "b_total"]);
        assert_eq!(m[0].labels, ["verb"]);
        assert_eq!(m[1].labels, ["code", "name"]);
        assert_eq!(m[1].kind, "counter");
        assert!(metrics_table(&m).contains("| `b_total` | counter | `code`, `name` | B. |"));
    }

    #[test]
    fn every_cloud_family_is_listed_with_its_labels() {
        let all = all_cloud_metric_families();
        let titles: Vec<&str> = all.iter().map(|(t, _, _)| *t).collect();
        assert_eq!(titles, ["AWS", "Azure", "GCP", "OpenStack"]);
        let find =
            |name: &str| all.iter().flat_map(|(_, _, d)| d).find(|d| d.name == name).cloned();
        let gce = find("cloudprovider_gce_api_request_errors").expect("gce errors");
        assert_eq!(gce.labels, ["request", "region", "zone", "version"]);
        assert_eq!(gce.kind, "unknown");
        let os = find("openstack_api_requests_total").expect("openstack total");
        assert_eq!(
            (os.kind.as_str(), os.labels.as_slice()),
            ("counter", &["request".to_string()][..])
        );
        assert!(find("cloudprovider_azure_op_failure_count").is_some());
        assert!(find("cloudprovider_aws_api_request_duration_seconds").is_some());
        let md = cloud_metrics_markdown();
        assert!(md.contains("| `cloudprovider_azure_api_request_errors` | unknown | `request`, `resource_group`, `subscription_id`, `source`, `code` |"), "{md}");
    }

    #[test]
    fn flags_are_rendered_from_the_clap_command() {
        let md = flags_markdown();
        assert!(md.contains("## Generic flags"), "{md}");
        assert!(md.contains("| `--cloud-config` |"), "{md}");
    }

    #[test]
    fn markdown_groups_sections_and_escapes_pipes() {
        let md = markdown(T);
        assert!(md.contains("### `[Global]`"), "{md}");
        assert!(md.contains("| `user` | s | `u` | a\\|b |"), "{md}");
    }
}
