//! LoadBalancer: classic ELB (default) and NLB (`aws-load-balancer-type: nlb`) for
//! `type: LoadBalancer` Services.
//!
//! Owns, per Service: the load balancer (named `a<uid>`, cut to 32 characters), its
//! listeners, health check, attributes and backend instances; for a classic ELB the security
//! group `k8s-elb-<name>` and the node security-group rules granting it access; for an NLB one
//! target group per port and node security-group rules for client and health-check traffic,
//! marked by their descriptions. Subnets come from the annotation or from tag discovery (one
//! per zone). Annotations are parsed first ([`annotations`]); a bad one is an
//! [`ProviderError::Invalid`] naming it, and nothing is changed in the cloud.
//!
//! Deletion removes exactly what this module creates: resources are recognised by name *and*
//! the `kubernetes.io/cluster/<id>=owned` tag, and node rules by their reference to our
//! security group or by their description; user-supplied security groups are never modified.

pub mod annotations;
mod classic;
mod nlb;
mod security_groups;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_ec2::types::{Filter, Instance};
use ccm_core::cloud::{LoadBalancer, ProviderError, default_load_balancer_name};
use k8s_openapi::api::core::v1::{LoadBalancerIngress, LoadBalancerStatus, Node, Service};

use crate::client::{Clients, api_error};
use crate::config::CloudConfig;
use crate::instances::{AwsInstances, InstanceRef, instance_ref};
use crate::tags::{ClusterTags, SERVICE_NAME_TAG, ec2_kv};
use annotations::{LbKind, LbOptions};

/// Role tag of subnets for internet-facing load balancers.
pub const ROLE_ELB_TAG: &str = "kubernetes.io/role/elb";
/// Role tag of subnets for internal load balancers.
pub const ROLE_INTERNAL_ELB_TAG: &str = "kubernetes.io/role/internal-elb";
/// The label that excludes a node from load balancers (the core filters it too).
const EXCLUDE_LABEL: &str = "node.kubernetes.io/exclude-from-external-load-balancers";

/// The LoadBalancer implementation.
pub struct AwsLoadBalancer {
    clients: Clients,
    instances: Arc<AwsInstances>,
    tags: ClusterTags,
    cfg: CloudConfig,
}

impl std::fmt::Debug for AwsLoadBalancer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsLoadBalancer")
            .field("cluster", &self.tags.cluster_id())
            .finish_non_exhaustive()
    }
}

/// `<namespace>/<name>` of a Service.
pub(crate) fn service_name(service: &Service) -> String {
    format!(
        "{}/{}",
        service.metadata.namespace.as_deref().unwrap_or("default"),
        service.metadata.name.as_deref().unwrap_or_default()
    )
}

pub(crate) fn status_for(hostname: Option<&str>) -> LoadBalancerStatus {
    LoadBalancerStatus {
        ingress: hostname.filter(|h| !h.is_empty()).map(|h| {
            vec![LoadBalancerIngress { hostname: Some(h.to_string()), ..Default::default() }]
        }),
    }
}

impl AwsLoadBalancer {
    /// A LoadBalancer for `cfg`'s cluster.
    pub fn new(
        clients: Clients,
        instances: Arc<AwsInstances>,
        tags: ClusterTags,
        cfg: CloudConfig,
    ) -> Self {
        AwsLoadBalancer { clients, instances, tags, cfg }
    }

    /// Tags put on everything created for `service`: cluster ownership, the Service name, and
    /// the additional-resource-tags annotation.
    fn resource_tags(
        &self,
        service: &Service,
        opts: Option<&LbOptions>,
    ) -> BTreeMap<String, String> {
        let mut tags: BTreeMap<String, String> = BTreeMap::new();
        if let Some(o) = opts {
            tags.extend(o.additional_tags.clone());
        }
        tags.insert(SERVICE_NAME_TAG.to_string(), service_name(service));
        tags.extend(self.tags.owned_tags());
        tags
    }

    /// The EC2 instances behind the backend nodes (label-selected, excluded nodes dropped).
    /// Nodes whose instance is unknown are skipped; lookup failures are errors.
    async fn backend_instances(
        &self,
        nodes: &[Node],
        opts: &LbOptions,
    ) -> Result<Vec<Instance>, ProviderError> {
        let selected: Vec<&Node> = nodes
            .iter()
            .filter(|n| {
                let labels = n.metadata.labels.clone().unwrap_or_default();
                !labels.contains_key(EXCLUDE_LABEL)
                    && opts.target_node_labels.iter().all(|(k, v)| labels.get(k) == Some(v))
            })
            .collect();
        let mut refs: Vec<InstanceRef> = Vec::new();
        for n in selected {
            match instance_ref(n) {
                Ok(r) => refs.push(r),
                Err(e) => {
                    tracing::warn!(node = ?n.metadata.name, error = %e, "skipping node without a usable instance reference")
                }
            }
        }
        let mut out: Vec<Instance> = Vec::new();
        for (r, found) in refs.iter().zip(self.instances.find(&refs).await) {
            match found? {
                Some(i)
                    if i.state()
                        .and_then(|s| s.name())
                        .is_some_and(|s| s.as_str() != "terminated") =>
                {
                    if !out.iter().any(|o| o.instance_id() == i.instance_id()) {
                        out.push(i);
                    }
                }
                _ => tracing::warn!(instance = ?r, "backend node has no running instance; skipped"),
            }
        }
        out.sort_by(|a, b| a.instance_id().cmp(&b.instance_id()));
        Ok(out)
    }

    /// The VPC: from the config, else from the backend instances.
    fn vpc_id(&self, instances: &[Instance]) -> Result<String, ProviderError> {
        if !self.cfg.global.vpc.is_empty() {
            return Ok(self.cfg.global.vpc.clone());
        }
        instances
            .iter()
            .find_map(|i| i.vpc_id().filter(|v| !v.is_empty()))
            .map(str::to_string)
            .ok_or_else(|| {
                ProviderError::other(
                    "cannot tell the VPC: set VPC in the cloud config or add backend nodes with EC2 instances",
                )
            })
    }

    /// Subnets for the load balancer: the annotation's (IDs, or Name tags), else one per zone
    /// among the VPC's subnets tagged for this cluster or for the load balancer's role.
    async fn subnets(&self, vpc: &str, opts: &LbOptions) -> Result<Vec<String>, ProviderError> {
        let ec2 = &self.clients.get().await?.ec2;
        if let Some(list) = &opts.subnets {
            let (ids, names): (Vec<&String>, Vec<&String>) =
                list.iter().partition(|s| s.starts_with("subnet-"));
            let mut out: Vec<String> = ids.into_iter().cloned().collect();
            if !names.is_empty() {
                let resp = ec2
                    .describe_subnets()
                    .filters(Filter::builder().name("vpc-id").values(vpc).build())
                    .filters(
                        Filter::builder()
                            .name("tag:Name")
                            .set_values(Some(names.iter().map(|s| s.to_string()).collect()))
                            .build(),
                    )
                    .send()
                    .await
                    .map_err(|e| api_error("DescribeSubnets by Name tag", e))?;
                for name in names {
                    let found = resp
                        .subnets()
                        .iter()
                        .find(|s| ec2_kv(s.tags()).any(|(k, v)| k == "Name" && v == name.as_str()))
                        .and_then(|s| s.subnet_id());
                    match found {
                        Some(id) => out.push(id.to_string()),
                        None => {
                            return Err(ProviderError::Invalid {
                                what: annotations::keys::SUBNETS.into(),
                                message: format!("no subnet named {name:?} in {vpc}"),
                            });
                        }
                    }
                }
            }
            return Ok(out);
        }

        let resp = ec2
            .describe_subnets()
            .filters(Filter::builder().name("vpc-id").values(vpc).build())
            .send()
            .await
            .map_err(|e| api_error(format!("DescribeSubnets in {vpc}"), e))?;
        let role = if opts.internal { ROLE_INTERNAL_ELB_TAG } else { ROLE_ELB_TAG };
        // Per zone, the best candidate: role tag first, then our cluster tag, then lowest ID.
        let mut best: BTreeMap<String, (u8, String)> = BTreeMap::new();
        for s in resp.subnets() {
            let (Some(id), Some(az)) = (s.subnet_id(), s.availability_zone()) else { continue };
            if self.tags.foreign_kv(ec2_kv(s.tags())) {
                continue;
            }
            let has_role = ec2_kv(s.tags())
                .any(|(k, v)| k == role && (v.is_empty() || v == "1" || v == "true"));
            let has_cluster = self.tags.cluster_id().is_some() && self.tags.owns(s.tags());
            if !has_role && !has_cluster {
                continue;
            }
            let rank = if has_role { 0 } else { 1 };
            let better = match best.get(az) {
                None => true,
                Some((r, cur)) => (rank, id) < (*r, cur.as_str()),
            };
            if better {
                best.insert(az.to_string(), (rank, id.to_string()));
            }
        }
        if best.is_empty() {
            return Err(ProviderError::other(format!(
                "could not find any suitable subnets for creating the load balancer in {vpc}: tag subnets with {role}=1 or {}",
                self.tags
                    .key()
                    .map(|k| format!("{k}=owned|shared"))
                    .unwrap_or_else(|| "the cluster tag".into())
            )));
        }
        Ok(best.into_values().map(|(_, id)| id).collect())
    }
}

#[async_trait]
impl LoadBalancer for AwsLoadBalancer {
    async fn get_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<Option<LoadBalancerStatus>, ProviderError> {
        let name = default_load_balancer_name(service);
        if let Some(lb) = self.describe_classic(&name).await? {
            return Ok(Some(status_for(lb.dns_name())));
        }
        if let Some(lb) = self.describe_nlb(&name).await? {
            return Ok(Some(status_for(lb.dns_name())));
        }
        Ok(None)
    }

    async fn ensure_load_balancer(
        &self,
        _cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<LoadBalancerStatus, ProviderError> {
        let opts = annotations::parse(service)?;
        let name = default_load_balancer_name(service);
        match opts.kind {
            LbKind::Classic => {
                if self.describe_nlb(&name).await?.is_some() {
                    self.delete_nlb(service, &name).await?;
                }
                self.ensure_classic(service, &name, &opts, nodes).await
            }
            LbKind::Nlb => {
                if self.describe_classic(&name).await?.is_some() {
                    self.delete_classic(service, &name).await?;
                }
                self.ensure_nlb(service, &name, &opts, nodes).await
            }
        }
    }

    async fn update_load_balancer(
        &self,
        cluster_name: &str,
        service: &Service,
        nodes: &[Node],
    ) -> Result<(), ProviderError> {
        self.ensure_load_balancer(cluster_name, service, nodes).await.map(|_| ())
    }

    async fn ensure_load_balancer_deleted(
        &self,
        _cluster_name: &str,
        service: &Service,
    ) -> Result<(), ProviderError> {
        let name = default_load_balancer_name(service);
        self.delete_classic(service, &name).await?;
        self.delete_nlb(service, &name).await
    }
}

/// Instance IDs as a set.
pub(crate) fn instance_ids(instances: &[Instance]) -> BTreeSet<String> {
    instances.iter().filter_map(|i| i.instance_id()).map(str::to_string).collect()
}
