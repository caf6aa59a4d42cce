//! The operator tools' view of the cloud (issue 20, `orphans` and `migrate-check`): every
//! classic ELB and NLB in the region with its ownership tags, the security group created for
//! a classic ELB (`k8s-elb-<name>`) and the target groups of an NLB; and deletion of one that
//! is tagged `kubernetes.io/cluster/<id>=owned` through the same code as a Service's deletion.
//!
//! Ownership is decided only by the tags written at creation, never by a name: this
//! cluster's `kubernetes.io/cluster/<id>=owned` AND a `kubernetes.io/service-name=<ns>/<name>`
//! naming the Service it was made for (`shared`, the legacy `KubernetesCluster` tag, another
//! cluster's tag, no tag, or the cluster tag without a Service: not ours; a name of our shape,
//! `a<uid>` or `k8s-elb-<name>`, proves nothing). Without a cluster ID (an untagged cloud)
//! nothing counts as owned, so nothing can be deleted.

use std::collections::BTreeMap;

use aws_sdk_ec2::types::Filter;
use ccm_core::cloud::{CloudLoadBalancer, CloudResource, ProviderError};
use k8s_openapi::api::core::v1::Service;
use kube::api::ObjectMeta;

use super::AwsLoadBalancer;
use super::classic::elb_security_group_name;
use crate::client::{api_error, error_code};
use crate::tags::{OWNED, SERVICE_NAME_TAG};

/// `kind` of classic ELBs.
pub const CLASSIC: &str = "classic ELB";
/// `kind` of NLBs.
pub const NLB: &str = "NLB";
/// `kind` of a classic ELB that is gone while its own security group is left (a create or
/// delete cut short): listed so `orphans --delete` removes the group.
pub const CLASSIC_LEFTOVER: &str = "classic ELB (gone; security group left)";

/// Tags as a map.
type Tags = BTreeMap<String, String>;

/// Whether a `kubernetes.io/service-name` value names a Service (`<namespace>/<name>`).
fn names_service(value: &str) -> bool {
    value.split_once('/').is_some_and(|(ns, name)| !ns.is_empty() && !name.is_empty())
}

impl AwsLoadBalancer {
    /// Whether these tags mark a resource created by this cluster (never without a cluster ID).
    fn owned_by_cluster(&self, tags: &Tags) -> bool {
        self.tags.key().is_some_and(|k| tags.get(&k).map(String::as_str) == Some(OWNED))
    }

    /// Whether these tags mark a load balancer this cluster created for a Service: its owned
    /// tag and a Service name (`<ns>/<name>`).
    fn owned_for_service(&self, tags: &Tags) -> bool {
        self.owned_by_cluster(tags) && tags.get(SERVICE_NAME_TAG).is_some_and(|s| names_service(s))
    }

    /// Classic ELBs and NLBs with their resources, and whether this cluster owns them.
    pub(crate) async fn inventory(&self) -> Result<Vec<CloudLoadBalancer>, ProviderError> {
        let mut out = self.classic_inventory().await?;
        out.extend(self.nlb_inventory().await?);
        let left = self.leftover_classic_groups(&out).await?;
        out.extend(left);
        Ok(out)
    }

    async fn classic_inventory(&self) -> Result<Vec<CloudLoadBalancer>, ProviderError> {
        let elb = &self.clients.get().await?.elb;
        let mut all = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let resp = elb
                .describe_load_balancers()
                .set_marker(marker.take())
                .send()
                .await
                .map_err(|e| api_error("DescribeLoadBalancers (inventory)", e))?;
            all.extend(resp.load_balancer_descriptions().iter().cloned());
            match resp.next_marker() {
                Some(m) if !m.is_empty() => marker = Some(m.to_string()),
                _ => break,
            }
        }
        let mut tags: BTreeMap<String, Tags> = BTreeMap::new();
        let names: Vec<String> =
            all.iter().filter_map(|d| d.load_balancer_name()).map(str::to_string).collect();
        for chunk in names.chunks(20) {
            let resp = elb
                .describe_tags()
                .set_load_balancer_names(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(|e| api_error("DescribeTags (classic ELBs)", e))?;
            for d in resp.tag_descriptions() {
                let kv = d
                    .tags()
                    .iter()
                    .map(|t| (t.key().to_string(), t.value().unwrap_or_default().to_string()))
                    .collect();
                tags.insert(d.load_balancer_name().unwrap_or_default().to_string(), kv);
            }
        }
        let mut out = Vec::new();
        for d in &all {
            let name = d.load_balancer_name().unwrap_or_default().to_string();
            let t = tags.remove(&name).unwrap_or_default();
            let owned = self.owned_for_service(&t);
            let mut resources = Vec::new();
            if owned && !d.security_groups().is_empty() {
                let groups = self
                    .describe_sgs(vec![
                        Filter::builder()
                            .name("group-id")
                            .set_values(Some(d.security_groups().to_vec()))
                            .build(),
                    ])
                    .await?;
                let own_name = elb_security_group_name(&name);
                for sg in groups {
                    if sg.group_name() == Some(own_name.as_str()) && self.sg_is_ours(&sg) {
                        resources.push(CloudResource {
                            kind: "security group".into(),
                            id: sg.group_id().unwrap_or_default().to_string(),
                            name: own_name.clone(),
                        });
                    }
                }
            }
            out.push(CloudLoadBalancer {
                name,
                kind: CLASSIC.into(),
                id: d.load_balancer_name().unwrap_or_default().to_string(),
                ingress: d.dns_name().map(|h| vec![h.to_string()]).unwrap_or_default(),
                owned,
                service: t.get(SERVICE_NAME_TAG).cloned(),
                resources,
            });
        }
        Ok(out)
    }

    /// Owned `k8s-elb-<name>` security groups whose classic ELB `<name>` is not in `lbs`.
    async fn leftover_classic_groups(
        &self,
        lbs: &[CloudLoadBalancer],
    ) -> Result<Vec<CloudLoadBalancer>, ProviderError> {
        let Some(key) = self.tags.key() else { return Ok(Vec::new()) };
        let groups = self
            .describe_sgs(vec![Filter::builder().name(format!("tag:{key}")).values(OWNED).build()])
            .await?;
        let mut out = Vec::new();
        for sg in groups {
            let group_name = sg.group_name().unwrap_or_default();
            let Some(lb_name) = group_name.strip_prefix(elb_security_group_name("").as_str())
            else {
                continue;
            };
            let listed = lbs.iter().any(|l| l.kind == CLASSIC && l.name == lb_name);
            let service = sg
                .tags()
                .iter()
                .find(|t| t.key() == Some(SERVICE_NAME_TAG))
                .and_then(|t| t.value())
                .filter(|s| names_service(s))
                .map(str::to_string);
            // The group's own tags must prove it: this cluster's owned tag and a Service.
            if lb_name.is_empty() || listed || !self.sg_is_ours(&sg) || service.is_none() {
                continue;
            }
            out.push(CloudLoadBalancer {
                name: lb_name.to_string(),
                kind: CLASSIC_LEFTOVER.into(),
                id: lb_name.to_string(),
                ingress: Vec::new(),
                owned: true,
                service,
                resources: vec![CloudResource {
                    kind: "security group".into(),
                    id: sg.group_id().unwrap_or_default().to_string(),
                    name: group_name.to_string(),
                }],
            });
        }
        Ok(out)
    }

    async fn nlb_inventory(&self) -> Result<Vec<CloudLoadBalancer>, ProviderError> {
        let elbv2 = &self.clients.get().await?.elbv2;
        let mut all = Vec::new();
        let mut marker: Option<String> = None;
        loop {
            let resp = elbv2
                .describe_load_balancers()
                .set_marker(marker.take())
                .send()
                .await
                .map_err(|e| api_error("DescribeLoadBalancers (v2, inventory)", e))?;
            all.extend(
                resp.load_balancers()
                    .iter()
                    .filter(|l| l.r#type().is_some_and(|t| t.as_str() == "network"))
                    .cloned(),
            );
            match resp.next_marker() {
                Some(m) if !m.is_empty() => marker = Some(m.to_string()),
                _ => break,
            }
        }
        let arns: Vec<String> =
            all.iter().filter_map(|l| l.load_balancer_arn()).map(str::to_string).collect();
        let tags = self.v2_tags(&arns).await?;
        let mut out = Vec::new();
        for lb in &all {
            let arn = lb.load_balancer_arn().unwrap_or_default().to_string();
            let t = tags.get(&arn).cloned().unwrap_or_default();
            let owned = self.owned_for_service(&t);
            let mut resources = Vec::new();
            if owned {
                let groups = elbv2
                    .describe_target_groups()
                    .load_balancer_arn(&arn)
                    .send()
                    .await
                    .map_err(|e| api_error("DescribeTargetGroups (inventory)", e))?;
                let tg_arns: Vec<String> = groups
                    .target_groups()
                    .iter()
                    .filter_map(|g| g.target_group_arn())
                    .map(str::to_string)
                    .collect();
                let tg_tags = self.v2_tags(&tg_arns).await?;
                for g in groups.target_groups() {
                    let garn = g.target_group_arn().unwrap_or_default();
                    if tg_tags.get(garn).is_some_and(|t| self.owned_by_cluster(t)) {
                        resources.push(CloudResource {
                            kind: "target group".into(),
                            id: garn.to_string(),
                            name: g.target_group_name().unwrap_or_default().to_string(),
                        });
                    }
                }
            }
            out.push(CloudLoadBalancer {
                name: lb.load_balancer_name().unwrap_or_default().to_string(),
                kind: NLB.into(),
                id: arn,
                ingress: lb.dns_name().map(|h| vec![h.to_string()]).unwrap_or_default(),
                owned,
                service: t.get(SERVICE_NAME_TAG).cloned(),
                resources,
            });
        }
        Ok(out)
    }

    /// Tags of ELBv2 resources by ARN (20 per call).
    async fn v2_tags(&self, arns: &[String]) -> Result<BTreeMap<String, Tags>, ProviderError> {
        let elbv2 = &self.clients.get().await?.elbv2;
        let mut out = BTreeMap::new();
        for chunk in arns.chunks(20) {
            let resp = elbv2
                .describe_tags()
                .set_resource_arns(Some(chunk.to_vec()))
                .send()
                .await
                .map_err(|e| api_error("DescribeTags (v2, inventory)", e))?;
            for d in resp.tag_descriptions() {
                let kv = d
                    .tags()
                    .iter()
                    .map(|t| {
                        (
                            t.key().unwrap_or_default().to_string(),
                            t.value().unwrap_or_default().to_string(),
                        )
                    })
                    .collect();
                out.insert(d.resource_arn().unwrap_or_default().to_string(), kv);
            }
        }
        Ok(out)
    }

    /// Deletes `lb` and what was created for it, after checking again in the cloud that it
    /// exists and is owned by this cluster (gone already: `Ok`).
    pub(crate) async fn delete_from_inventory(
        &self,
        lb: &CloudLoadBalancer,
    ) -> Result<(), ProviderError> {
        let fresh = self
            .inventory()
            .await?
            .into_iter()
            .find(|l| l.name == lb.name && l.kind == lb.kind && l.id == lb.id);
        let Some(fresh) = fresh else { return Ok(()) };
        if !fresh.owned {
            return Err(ProviderError::Invalid {
                what: format!("load balancer {}", fresh.name),
                message: "not tagged as owned by this cluster: refusing to delete it".into(),
            });
        }
        // The Service it was made for, as far as its tags tell: the deletion code uses its
        // namespace and name (and nothing else) to find what belongs to it.
        let (ns, name) = fresh
            .service
            .as_deref()
            .and_then(|s| s.split_once('/'))
            .map(|(a, b)| (a.to_string(), b.to_string()))
            .unwrap_or_default();
        let service = Service {
            metadata: ObjectMeta { namespace: Some(ns), name: Some(name), ..Default::default() },
            ..Default::default()
        };
        tracing::info!(lb = %fresh.name, kind = %fresh.kind, service = ?fresh.service, "deleting orphaned load balancer");
        if fresh.kind == CLASSIC || fresh.kind == CLASSIC_LEFTOVER {
            return self.delete_classic(&service, &fresh.name).await;
        }
        self.delete_nlb(&service, &fresh.name).await?;
        // Target groups the Service-name lookup did not find (e.g. no service tag).
        let elbv2 = &self.clients.get().await?.elbv2;
        for tg in &fresh.resources {
            match elbv2.delete_target_group().target_group_arn(&tg.id).send().await {
                Ok(_) => tracing::info!(target_group = %tg.name, "deleted target group"),
                Err(e) if error_code(&e) == Some("TargetGroupNotFound") => {}
                Err(e) => return Err(api_error(format!("DeleteTargetGroup {}", tg.name), e)),
            }
        }
        Ok(())
    }
}
