//! Pure decisions of the service controller: which Services it owns, which changes need a
//! load balancer sync, which Nodes are backends, and when a node-set change matters.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Node, Service, ServicePort};

use crate::names;

/// `spec.type == LoadBalancer` and no `spec.loadBalancerClass` (even an empty class means
/// "another controller's").
pub(crate) fn wants_load_balancer(svc: &Service) -> bool {
    svc.spec.as_ref().is_some_and(|s| {
        s.type_.as_deref() == Some("LoadBalancer") && s.load_balancer_class.is_none()
    })
}

/// Whether the Service carries the load-balancer cleanup finalizer.
pub(crate) fn has_finalizer(svc: &Service) -> bool {
    svc.metadata.finalizers.iter().flatten().any(|f| f == names::FINALIZER_LB_CLEANUP)
}

/// Has the finalizer and is being deleted or is no longer `type: LoadBalancer`.
pub(crate) fn needs_cleanup(svc: &Service) -> bool {
    has_finalizer(svc)
        && (svc.metadata.deletion_timestamp.is_some()
            || svc.spec.as_ref().and_then(|s| s.type_.as_deref()) != Some("LoadBalancer"))
}

fn ports_equal(a: &[ServicePort], b: &[ServicePort]) -> bool {
    a.len() == b.len()
        && a.iter().zip(b).all(|(x, y)| {
            x.name == y.name
                && x.protocol == y.protocol
                && x.port == y.port
                && x.node_port == y.node_port
                && x.target_port == y.target_port
                && x.app_protocol == y.app_protocol
        })
}

/// Whether an update from `old` to `new` needs a load balancer sync. Changes the load balancer
/// cannot see (status, labels, finalizers, resync with an identical object) return false.
pub(crate) fn needs_update(old: &Service, new: &Service) -> bool {
    let (old_wants, new_wants) = (wants_load_balancer(old), wants_load_balancer(new));
    if !old_wants && !new_wants {
        return false;
    }
    if old_wants != new_wants {
        return true;
    }
    let default = Default::default();
    let o = old.spec.as_ref().unwrap_or(&default);
    let n = new.spec.as_ref().unwrap_or(&default);
    let empty = Vec::new();
    let len = |v: &Option<Vec<String>>| v.as_ref().map_or(0, Vec::len);
    o.load_balancer_source_ranges != n.load_balancer_source_ranges
        || !ports_equal(o.ports.as_ref().unwrap_or(&empty), n.ports.as_ref().unwrap_or(&empty))
        || o.session_affinity != n.session_affinity
        || o.session_affinity_config != n.session_affinity_config
        || o.load_balancer_ip != n.load_balancer_ip
        || o.external_ips.clone().unwrap_or_default() != n.external_ips.clone().unwrap_or_default()
        || old.metadata.annotations.clone().unwrap_or_default()
            != new.metadata.annotations.clone().unwrap_or_default()
        || old.metadata.uid != new.metadata.uid
        || o.external_traffic_policy != n.external_traffic_policy
        || o.health_check_node_port != n.health_check_node_port
        || len(&o.ip_families) != len(&n.ip_families)
}

/// Go `strconv.ParseBool`.
fn parse_go_bool(s: &str) -> Option<bool> {
    match s {
        "1" | "t" | "T" | "TRUE" | "true" | "True" => Some(true),
        "0" | "f" | "F" | "FALSE" | "false" | "False" => Some(false),
        _ => None,
    }
}

/// Not excluded by `node.kubernetes.io/exclude-from-external-load-balancers`: the label is
/// absent, or parses as false. An unparsable value excludes the node (as upstream today).
pub(crate) fn node_included(node: &Node) -> bool {
    match node.metadata.labels.as_ref().and_then(|l| l.get(names::LABEL_EXCLUDE_FROM_LB)) {
        None => true,
        Some(v) => parse_go_bool(v) == Some(false),
    }
}

fn node_untainted(node: &Node) -> bool {
    !node
        .spec
        .as_ref()
        .and_then(|s| s.taints.as_ref())
        .is_some_and(|t| t.iter().any(|t| t.key == names::TAINT_TO_BE_DELETED))
}

/// Upstream's `stableNodeSetPredicates`: not being deleted, not excluded by label, not
/// tainted by cluster-autoscaler for deletion. Readiness is deliberately not considered, so a
/// flapping node never changes load balancer backends.
pub(crate) fn is_backend(node: &Node) -> bool {
    node.metadata.deletion_timestamp.is_none() && node_included(node) && node_untainted(node)
}

fn provider_id(node: &Node) -> String {
    node.spec.as_ref().and_then(|s| s.provider_id.clone()).unwrap_or_default()
}

/// Whether a Node update should trigger a node sync: the exclusion verdict or the
/// providerID changed. Other changes (taints, readiness, deletion) are picked up by the
/// next sync of any kind.
pub(crate) fn should_sync_updated_node(old: &Node, new: &Node) -> bool {
    node_included(old) != node_included(new) || provider_id(old) != provider_id(new)
}

/// A backend set, as the node sync compares it: node name → providerID.
pub(crate) type NodeSet = BTreeMap<String, String>;

/// The backend set of `nodes`.
pub(crate) fn node_set<'a>(nodes: impl IntoIterator<Item = &'a Node>) -> NodeSet {
    nodes
        .into_iter()
        .map(|n| (n.metadata.name.clone().unwrap_or_default(), provider_id(n)))
        .collect()
}

/// Node names for an event message: sorted, at most 20, then `<N more>`.
pub(crate) fn node_names_for_log(set: &NodeSet) -> String {
    const MAX: usize = 20;
    let mut names: Vec<&str> = set.keys().map(String::as_str).take(MAX).collect();
    let more;
    if set.len() > MAX {
        more = format!("<{} more>", set.len() - MAX);
        names.push(&more);
    }
    format!("[{}]", names.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{NodeSpec, ServiceSpec, Taint};
    use kube::api::ObjectMeta;

    fn svc(type_: &str, class: Option<&str>) -> Service {
        Service {
            metadata: ObjectMeta { uid: Some("u1".into()), ..Default::default() },
            spec: Some(ServiceSpec {
                type_: Some(type_.into()),
                load_balancer_class: class.map(Into::into),
                ports: Some(vec![ServicePort { port: 80, ..Default::default() }]),
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    fn node(labels: &[(&str, &str)]) -> Node {
        Node {
            metadata: ObjectMeta {
                name: Some("n".into()),
                labels: Some(labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[test]
    fn load_balancer_class_even_empty_means_not_ours() {
        assert!(wants_load_balancer(&svc("LoadBalancer", None)));
        assert!(!wants_load_balancer(&svc("LoadBalancer", Some(""))));
        assert!(!wants_load_balancer(&svc("LoadBalancer", Some("example.com/lb"))));
        assert!(!wants_load_balancer(&svc("ClusterIP", None)));
    }

    #[test]
    fn cleanup_needed_when_type_changes_or_deleting_with_finalizer() {
        let mut s = svc("ClusterIP", None);
        assert!(!needs_cleanup(&s));
        s.metadata.finalizers = Some(vec![names::FINALIZER_LB_CLEANUP.into()]);
        assert!(needs_cleanup(&s));
        let mut lb = svc("LoadBalancer", None);
        lb.metadata.finalizers = Some(vec![names::FINALIZER_LB_CLEANUP.into()]);
        assert!(!needs_cleanup(&lb));
        lb.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
        assert!(needs_cleanup(&lb));
    }

    #[test]
    fn only_load_balancer_relevant_changes_need_update() {
        let old = svc("LoadBalancer", None);
        let mut new = old.clone();
        assert!(!needs_update(&old, &new), "identical (resync)");
        new.metadata.labels = Some([("a".to_string(), "b".to_string())].into());
        new.metadata.finalizers = Some(vec![names::FINALIZER_LB_CLEANUP.into()]);
        assert!(!needs_update(&old, &new), "labels and finalizers do not matter");
        let mut ports = new.clone();
        ports.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 81;
        assert!(needs_update(&old, &ports));
        let mut ann = new.clone();
        ann.metadata.annotations = Some([("x".to_string(), "y".to_string())].into());
        assert!(needs_update(&old, &ann));
        assert!(needs_update(&old, &svc("ClusterIP", None)));
        assert!(!needs_update(&svc("ClusterIP", None), &svc("NodePort", None)));
    }

    #[test]
    fn exclusion_label_parses_like_go_and_garbage_excludes() {
        assert!(node_included(&node(&[])));
        assert!(node_included(&node(&[(names::LABEL_EXCLUDE_FROM_LB, "false")])));
        assert!(node_included(&node(&[(names::LABEL_EXCLUDE_FROM_LB, "F")])));
        assert!(!node_included(&node(&[(names::LABEL_EXCLUDE_FROM_LB, "true")])));
        assert!(!node_included(&node(&[(names::LABEL_EXCLUDE_FROM_LB, "")])));
        assert!(!node_included(&node(&[(names::LABEL_EXCLUDE_FROM_LB, "yes")])));
    }

    #[test]
    fn autoscaler_taint_and_deletion_remove_backends_but_readiness_does_not() {
        let mut n = node(&[]);
        assert!(is_backend(&n));
        n.spec = Some(NodeSpec {
            taints: Some(vec![Taint {
                key: names::TAINT_TO_BE_DELETED.into(),
                effect: "NoSchedule".into(),
                ..Default::default()
            }]),
            ..Default::default()
        });
        assert!(!is_backend(&n));
        let mut d = node(&[]);
        d.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()));
        assert!(!is_backend(&d));
    }

    #[test]
    fn node_updates_trigger_only_on_exclusion_or_provider_id() {
        let a = node(&[]);
        let mut b = a.clone();
        b.status = Some(Default::default());
        assert!(!should_sync_updated_node(&a, &b));
        let c = node(&[(names::LABEL_EXCLUDE_FROM_LB, "true")]);
        assert!(should_sync_updated_node(&a, &c));
        let mut d = a.clone();
        d.spec = Some(NodeSpec { provider_id: Some("test://x".into()), ..Default::default() });
        assert!(should_sync_updated_node(&a, &d));
    }

    #[test]
    fn event_node_list_is_sorted_and_limited() {
        let set: NodeSet = (0..25).map(|i| (format!("n{i:02}"), String::new())).collect();
        let s = node_names_for_log(&set);
        assert!(s.starts_with("[n00 n01"));
        assert!(s.ends_with("n19 <5 more>]"));
    }
}
