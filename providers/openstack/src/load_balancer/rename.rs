//! Renaming a load balancer when `--cluster-name` changes, as upstream's
//! `loadbalancer_rename.go` (v1.36.0): a Service whose `load-balancer-id` names a load
//! balancer called `kube_service_<old cluster>_<ns>_<name>` has it renamed to the current
//! cluster's name, children first (monitor, pool, listener, then the load balancer), so an
//! interrupted rename is finished by the next sync.
//!
//! Within the ownership proof of issue #29, and so stricter than upstream (which renames any
//! `kube_service_*` load balancer a Service's `load-balancer-id` names):
//! - the load balancer's name and description agree and name **this** Service under another
//!   cluster ([`super::creator`]);
//! - no other Service's tag is on it (not shared);
//! - the Service's own status already reports it (its VIP, or the floating IP on its VIP
//!   port, as the IP or as the `<ip>.` start of a hostname): this cluster served the Service
//!   from that load balancer before the name changed. Another cluster's load balancer for a
//!   Service of the same namespace and name is never taken over by pointing
//!   `load-balancer-id` at it (the status is written by the service controller only).
//!
//! What is rewritten: the names (`listener_<i>_…`, `pool_<i>_…`, `monitor_<i>_…`, the load
//! balancer's), the old name in tags, and the ownership records that name the cluster —
//! the load balancer's description (upstream leaves it; here it is the proof), the floating
//! IP's description when it is exactly the one written for this Service and the old cluster,
//! and the managed security group's. A Warning `LoadBalancerRename` is raised on the
//! Service, as upstream.

use ccm_core::cloud::ProviderError;
use k8s_openapi::api::core::v1::Service;
use serde_json::json;

use super::annotations::{ServiceConfig, keys, service_key};
use super::{
    OctaviaLoadBalancer, SERVICE_PREFIX, creator, cut255, fip_description, invalid, lb_description,
    load_balancer_name, other_services, security_group_name, sg_description,
};
use crate::load_balancer::octavia;

/// Upstream's Warning reason for a rename.
pub const EVENT_RENAME: &str = "LoadBalancerRename";

/// `<prefix><i>_<old…>` → `<prefix><i>_<new>` (cut to 255 bytes), when the part after the
/// index is `old` or the start of it (a cut name).
pub fn renamed(name: &str, prefix: &str, old: &str, new: &str) -> Option<String> {
    let rest = name.strip_prefix(prefix)?;
    let (index, tail) = rest.split_once('_')?;
    if index.is_empty() || !index.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    if tail.is_empty() || tail == new || !old.starts_with(tail) {
        return None;
    }
    Some(cut255(format!("{prefix}{index}_{new}")))
}

impl OctaviaLoadBalancer {
    /// Whether the Service's status reports `lb` (its VIP or its floating IP).
    async fn status_reports(
        &self,
        service: &Service,
        lb: &octavia::LoadBalancer,
    ) -> Result<bool, ProviderError> {
        let ingress = service
            .status
            .as_ref()
            .and_then(|s| s.load_balancer.as_ref())
            .and_then(|l| l.ingress.clone())
            .unwrap_or_default();
        if ingress.is_empty() {
            return Ok(false);
        }
        let mut addresses = vec![lb.vip_address.clone()];
        if !lb.vip_port_id.is_empty() {
            for f in self.api().list_floating_ips(&[("port_id", lb.vip_port_id.clone())]).await? {
                addresses.push(f.floating_ip_address);
            }
        }
        addresses.retain(|a| !a.is_empty());
        Ok(ingress.iter().any(|i| {
            addresses.iter().any(|a| {
                i.ip.as_deref() == Some(a.as_str())
                    || i.hostname.as_deref().is_some_and(|h| h.starts_with(&format!("{a}.")))
            })
        }))
    }

    /// Renames `lb` (named by the Service's `load-balancer-id`) when it is this Service's
    /// own load balancer under another cluster name; `None` when it is not such a load
    /// balancer. A load balancer of this Service and another cluster that cannot be proven
    /// ours is an error naming the annotation.
    pub(super) async fn rename_if_old_cluster(
        &self,
        cluster: &str,
        service: &Service,
        conf: &ServiceConfig,
        lb: &octavia::LoadBalancer,
    ) -> Result<Option<octavia::LoadBalancer>, ProviderError> {
        let Some(c) = creator(lb) else { return Ok(None) };
        let namespace = service.metadata.namespace.as_deref().unwrap_or_default();
        let svc_name = service.metadata.name.as_deref().unwrap_or_default();
        if cluster.is_empty()
            || c.cluster == cluster
            || c.namespace != namespace
            || c.name != svc_name
        {
            return Ok(None);
        }
        let key = service_key(service);
        let refuse = |why: &str| {
            invalid(
                keys::LOAD_BALANCER_ID,
                format!(
                    "load balancer {} ({}) was created for Service {key} by cluster {}: not renamed to cluster {cluster} because {why}",
                    lb.id, lb.name, c.cluster
                ),
            )
        };
        if other_services(lb, &lb.name) > 0 {
            return Err(refuse("other Services share it"));
        }
        if !self.status_reports(service, lb).await? {
            return Err(refuse(
                "the Service's status does not report its address (only a load balancer this cluster served the Service from is renamed)",
            ));
        }
        let lb = match lb.provisioning_status.as_str() {
            "ACTIVE" => lb.clone(),
            "ERROR" => return Err(refuse("it is in ERROR state")),
            _ if lb.is_deleting() => return Err(refuse("it is being deleted")),
            _ => self.until_active(lb).await?,
        };
        let old = lb.name.clone();
        let new = load_balancer_name(cluster, service);
        let message = format!(
            "Loadbalancer {} has a name of {old} with incorrect cluster-name component. Renaming it to {new}.",
            lb.id
        );
        self.warn(service, EVENT_RENAME, message).await;
        let api = self.api();
        let retag = |tags: &[String]| -> Vec<String> {
            tags.iter().map(|t| if *t == old { new.clone() } else { t.clone() }).collect()
        };
        let listeners = api.list_listeners(&lb.id).await?;
        let pools = api.list_pools(&lb.id).await?;
        for l in listeners.iter().filter(|l| l.tags.is_empty() || l.tags.contains(&old)) {
            for p in pools
                .iter()
                .filter(|p| p.listeners.iter().any(|x| x.id == l.id) || p.id == l.default_pool_id)
            {
                if !p.healthmonitor_id.is_empty()
                    && let Some(hm) = api.get_health_monitor(&p.healthmonitor_id).await?
                    && let Some(n) = renamed(&hm.name, "monitor_", &old, &new)
                {
                    let body = json!({ "name": n });
                    self.mutate(&lb.id, &old, "renaming a health monitor", || {
                        api.update_health_monitor(&hm.id, body.clone())
                    })
                    .await?;
                }
                if let Some(n) = renamed(&p.name, "pool_", &old, &new) {
                    let body = json!({ "name": n });
                    self.mutate(&lb.id, &old, "renaming a pool", || {
                        api.update_pool(&p.id, body.clone())
                    })
                    .await?;
                }
            }
            let mut body = serde_json::Map::new();
            if let Some(n) = renamed(&l.name, "listener_", &old, &new) {
                body.insert("name".into(), json!(n));
            }
            if conf.tags && l.tags.contains(&old) {
                body.insert("tags".into(), json!(retag(&l.tags)));
            }
            if !body.is_empty() {
                let body = serde_json::Value::Object(body);
                self.mutate(&lb.id, &old, "renaming a listener", || {
                    api.update_listener(&l.id, body.clone())
                })
                .await?;
            }
        }
        // The ownership records naming the old cluster.
        if !lb.vip_port_id.is_empty() {
            let was = fip_description(&key, &c.cluster);
            for f in api.list_floating_ips(&[("port_id", lb.vip_port_id.clone())]).await? {
                if f.description == was {
                    api.set_floating_ip_description(&f.id, &fip_description(&key, cluster)).await?;
                }
            }
        }
        let was = sg_description(&key, &c.cluster);
        for g in api.list_security_groups(Some(&security_group_name(service))).await? {
            if g.description == was {
                api.set_security_group_description(&g.id, &sg_description(&key, cluster)).await?;
            }
        }
        // The load balancer last: until then the next sync finds the old name and goes on.
        let mut body = json!({ "name": new, "description": lb_description(&key, cluster) });
        if conf.tags {
            body["tags"] = json!(retag(&lb.tags));
        }
        tracing::info!(service = %key, load_balancer = %lb.id, from = %old, to = %new, "OpenStack: renaming load balancer after a cluster-name change");
        self.mutate(&lb.id, &old, "renaming", || api.update_load_balancer(&lb.id, body.clone()))
            .await?;
        let renamed = api.get_load_balancer(&lb.id).await?.ok_or_else(|| {
            ProviderError::other(format!("load balancer {} disappeared while renaming it", lb.id))
        })?;
        debug_assert!(renamed.name.starts_with(SERVICE_PREFIX));
        Ok(Some(renamed))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_names_move_to_the_new_cluster() {
        let old = "kube_service_old_default_web";
        let new = "kube_service_new_default_web";
        assert_eq!(
            renamed("listener_0_kube_service_old_default_web", "listener_", old, new).as_deref(),
            Some("listener_0_kube_service_new_default_web")
        );
        assert_eq!(
            renamed("pool_12_kube_service_old_default_web", "pool_", old, new).as_deref(),
            Some("pool_12_kube_service_new_default_web")
        );
        // Already renamed, another Service's, not ours: untouched.
        assert_eq!(renamed("pool_0_kube_service_new_default_web", "pool_", old, new), None);
        assert_eq!(renamed("pool_0_kube_service_old_default_api", "pool_", old, new), None);
        assert_eq!(renamed("my-pool", "pool_", old, new), None);
        assert_eq!(renamed("pool_x_kube_service_old_default_web", "pool_", old, new), None);
    }
}
