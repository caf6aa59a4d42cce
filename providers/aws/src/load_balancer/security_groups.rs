//! Security groups for load balancers: the per-LB group, its ingress rules, and the rules on
//! node security groups. Rules are handled one (protocol, ports, source) at a time so that
//! adding or revoking ours never touches a rule someone else added.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use aws_sdk_ec2::types::{
    Filter, IpPermission, IpRange, Ipv6Range, ResourceType, SecurityGroup, Tag, TagSpecification,
    UserIdGroupPair,
};
use ccm_core::cloud::ProviderError;

use super::AwsLoadBalancer;
use crate::client::{api_error, error_code};
use crate::instances::Ec2Instance;
use crate::tags::ec2_kv;

/// Where a rule lets traffic in from.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Source {
    /// A CIDR (v4 or v6).
    Cidr(String),
    /// Another security group.
    Group(String),
}

/// One ingress rule.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Rule {
    /// `tcp`, `udp`, `icmp` or `-1`.
    pub protocol: String,
    /// First port (ICMP type), -1 for all.
    pub from: i32,
    /// Last port (ICMP code), -1 for all.
    pub to: i32,
    /// Source.
    pub source: Source,
    /// Description (used to mark NLB node rules).
    pub description: Option<String>,
}

impl Rule {
    /// The rule without its description, for comparisons.
    fn key(&self) -> (String, i32, i32, Source) {
        (self.protocol.clone(), self.from, self.to, self.source.clone())
    }

    fn permission(&self) -> IpPermission {
        let mut p = IpPermission::builder().ip_protocol(&self.protocol);
        if self.protocol != "-1" {
            p = p.from_port(self.from).to_port(self.to);
        }
        p = match &self.source {
            Source::Cidr(c) if c.contains(':') => p.ipv6_ranges(
                Ipv6Range::builder().cidr_ipv6(c).set_description(self.description.clone()).build(),
            ),
            Source::Cidr(c) => p.ip_ranges(
                IpRange::builder().cidr_ip(c).set_description(self.description.clone()).build(),
            ),
            Source::Group(g) => p.user_id_group_pairs(
                UserIdGroupPair::builder()
                    .group_id(g)
                    .set_description(self.description.clone())
                    .build(),
            ),
        };
        p.build()
    }
}

/// The ingress rules of a security group, one per source.
pub(crate) fn rules_of(sg: &SecurityGroup) -> Vec<Rule> {
    let mut out = Vec::new();
    for p in sg.ip_permissions() {
        let protocol = p.ip_protocol().unwrap_or("-1").to_string();
        let (from, to) = if protocol == "-1" {
            (-1, -1)
        } else {
            (p.from_port().unwrap_or(-1), p.to_port().unwrap_or(-1))
        };
        let rule = |source, description: Option<&str>| Rule {
            protocol: protocol.clone(),
            from,
            to,
            source,
            description: description.map(str::to_string),
        };
        for r in p.ip_ranges() {
            if let Some(c) = r.cidr_ip() {
                out.push(rule(Source::Cidr(c.to_string()), r.description()));
            }
        }
        for r in p.ipv6_ranges() {
            if let Some(c) = r.cidr_ipv6() {
                out.push(rule(Source::Cidr(c.to_string()), r.description()));
            }
        }
        for g in p.user_id_group_pairs() {
            if let Some(id) = g.group_id() {
                out.push(rule(Source::Group(id.to_string()), g.description()));
            }
        }
    }
    out
}

impl AwsLoadBalancer {
    pub(crate) async fn describe_sgs(
        &self,
        filters: Vec<Filter>,
    ) -> Result<Vec<SecurityGroup>, ProviderError> {
        let ec2 = &self.clients.get().await?.ec2;
        let mut out = Vec::new();
        let mut token: Option<String> = None;
        loop {
            let resp = ec2
                .describe_security_groups()
                .set_filters(Some(filters.clone()))
                .set_next_token(token.take())
                .send()
                .await
                .map_err(|e| api_error("DescribeSecurityGroups", e))?;
            out.extend(resp.security_groups().iter().cloned());
            match resp.next_token() {
                Some(t) if !t.is_empty() => token = Some(t.to_string()),
                _ => break,
            }
        }
        Ok(out)
    }

    /// The security group named `name` (in `vpc` when given).
    pub(crate) async fn find_sg(
        &self,
        name: &str,
        vpc: Option<&str>,
    ) -> Result<Option<SecurityGroup>, ProviderError> {
        let mut filters = vec![Filter::builder().name("group-name").values(name).build()];
        if let Some(v) = vpc {
            filters.push(Filter::builder().name("vpc-id").values(v).build());
        }
        let mut found = self.describe_sgs(filters).await?;
        Ok(if found.is_empty() { None } else { Some(found.swap_remove(0)) })
    }

    /// Whether we created this security group.
    pub(crate) fn sg_is_ours(&self, sg: &SecurityGroup) -> bool {
        self.tags.created_kv(ec2_kv(sg.tags()))
    }

    /// Finds or creates the security group `name` in `vpc`, tagged with `tags`.
    pub(crate) async fn ensure_sg(
        &self,
        name: &str,
        description: &str,
        vpc: &str,
        tags: &BTreeMap<String, String>,
    ) -> Result<SecurityGroup, ProviderError> {
        if let Some(sg) = self.find_sg(name, Some(vpc)).await? {
            return Ok(sg);
        }
        let ec2 = &self.clients.get().await?.ec2;
        let ec2_tags: Vec<Tag> =
            tags.iter().map(|(k, v)| Tag::builder().key(k).value(v).build()).collect();
        let resp = ec2
            .create_security_group()
            .group_name(name)
            .description(description)
            .vpc_id(vpc)
            .tag_specifications(
                TagSpecification::builder()
                    .resource_type(ResourceType::SecurityGroup)
                    .set_tags(Some(ec2_tags.clone()))
                    .build(),
            )
            .send()
            .await
            .map_err(|e| api_error(format!("CreateSecurityGroup {name} in {vpc}"), e))?;
        let id = resp.group_id().unwrap_or_default().to_string();
        // Tag again in case the endpoint ignored the tag specification; idempotent.
        ec2.create_tags()
            .resources(&id)
            .set_tags(Some(ec2_tags))
            .send()
            .await
            .map_err(|e| api_error(format!("CreateTags on {id}"), e))?;
        tracing::info!(group = %id, name, "created security group");
        self.find_sg(name, Some(vpc)).await?.ok_or_else(|| {
            ProviderError::other(format!("security group {name} ({id}) vanished after creation"))
        })
    }

    pub(crate) async fn authorize(&self, sg: &str, rules: &[Rule]) -> Result<(), ProviderError> {
        if rules.is_empty() {
            return Ok(());
        }
        let ec2 = &self.clients.get().await?.ec2;
        for r in rules {
            match ec2
                .authorize_security_group_ingress()
                .group_id(sg)
                .ip_permissions(r.permission())
                .send()
                .await
            {
                Ok(_) => {}
                Err(e) if error_code(&e) == Some("InvalidPermission.Duplicate") => {}
                Err(e) => {
                    return Err(api_error(format!("AuthorizeSecurityGroupIngress on {sg}"), e));
                }
            }
        }
        Ok(())
    }

    pub(crate) async fn revoke(&self, sg: &str, rules: &[Rule]) -> Result<(), ProviderError> {
        if rules.is_empty() {
            return Ok(());
        }
        let ec2 = &self.clients.get().await?.ec2;
        for r in rules {
            match ec2
                .revoke_security_group_ingress()
                .group_id(sg)
                .ip_permissions(r.permission())
                .send()
                .await
            {
                Ok(_) => {}
                Err(e) if error_code(&e) == Some("InvalidPermission.NotFound") => {}
                Err(e) => return Err(api_error(format!("RevokeSecurityGroupIngress on {sg}"), e)),
            }
        }
        Ok(())
    }

    /// Makes the ingress rules of a security group we own exactly `desired`.
    pub(crate) async fn sync_ingress(
        &self,
        sg: &SecurityGroup,
        desired: &[Rule],
    ) -> Result<(), ProviderError> {
        let id = sg.group_id().unwrap_or_default();
        let existing = rules_of(sg);
        let want: BTreeSet<_> = desired.iter().map(Rule::key).collect();
        let have: BTreeSet<_> = existing.iter().map(Rule::key).collect();
        let extra: Vec<Rule> = existing.into_iter().filter(|r| !want.contains(&r.key())).collect();
        let missing: Vec<Rule> =
            desired.iter().filter(|r| !have.contains(&r.key())).cloned().collect();
        self.revoke(id, &extra).await?;
        self.authorize(id, &missing).await
    }

    /// One security group per instance, as upstream chooses it: the only one, else the only
    /// one tagged for the cluster. Instances where that is ambiguous are skipped with a warning.
    pub(crate) async fn node_security_groups(
        &self,
        instances: &[Arc<Ec2Instance>],
    ) -> Result<BTreeSet<String>, ProviderError> {
        let all: BTreeSet<String> =
            instances.iter().flat_map(|i| i.security_group_ids().iter().cloned()).collect();
        let multi = instances.iter().any(|i| i.security_group_ids().len() > 1);
        let tagged: BTreeSet<String> = if multi && !all.is_empty() {
            let groups = self
                .describe_sgs(vec![
                    Filter::builder()
                        .name("group-id")
                        .set_values(Some(all.iter().cloned().collect()))
                        .build(),
                ])
                .await?;
            groups
                .iter()
                .filter(|g| self.tags.cluster_id().is_some() && self.tags.owns(g.tags()))
                .filter_map(|g| g.group_id())
                .map(str::to_string)
                .collect()
        } else {
            BTreeSet::new()
        };
        let mut out = BTreeSet::new();
        for i in instances {
            let ids: Vec<&str> = i.security_group_ids().iter().map(String::as_str).collect();
            let chosen = match ids.as_slice() {
                [] => None,
                [one] => Some(one.to_string()),
                many => {
                    let t: Vec<&&str> = many.iter().filter(|g| tagged.contains(**g)).collect();
                    match t.as_slice() {
                        [one] => Some(one.to_string()),
                        _ => {
                            tracing::warn!(
                                instance = i.id(),
                                "instance has several security groups and not exactly one tagged for the cluster; no load-balancer rule added"
                            );
                            None
                        }
                    }
                }
            };
            out.extend(chosen);
        }
        Ok(out)
    }

    /// Security groups in `vpc` with an ingress rule matching `pred`, with those rules.
    pub(crate) async fn groups_with_rules(
        &self,
        vpc: Option<&str>,
        pred: impl Fn(&Rule) -> bool,
    ) -> Result<BTreeMap<String, Vec<Rule>>, ProviderError> {
        let filters = vpc
            .map(|v| vec![Filter::builder().name("vpc-id").values(v).build()])
            .unwrap_or_default();
        let mut out = BTreeMap::new();
        for sg in self.describe_sgs(filters).await? {
            let rules: Vec<Rule> = rules_of(&sg).into_iter().filter(|r| pred(r)).collect();
            if !rules.is_empty() {
                out.insert(sg.group_id().unwrap_or_default().to_string(), rules);
            }
        }
        Ok(out)
    }

    /// Makes node security groups `desired` (and only those, in `vpc`) carry `rules`, where
    /// `ours` recognises rules this load balancer owns.
    pub(crate) async fn sync_node_rules(
        &self,
        vpc: &str,
        desired: &BTreeSet<String>,
        rules: &[Rule],
        ours: impl Fn(&Rule) -> bool,
    ) -> Result<(), ProviderError> {
        let existing = self.groups_with_rules(Some(vpc), &ours).await?;
        let want: BTreeSet<_> = rules.iter().map(Rule::key).collect();
        for (sg, have) in &existing {
            let extra: Vec<Rule> = if desired.contains(sg) {
                have.iter().filter(|r| !want.contains(&r.key())).cloned().collect()
            } else {
                have.clone()
            };
            self.revoke(sg, &extra).await?;
        }
        for sg in desired {
            let have: BTreeSet<_> =
                existing.get(sg).map(|h| h.iter().map(Rule::key).collect()).unwrap_or_default();
            let missing: Vec<Rule> =
                rules.iter().filter(|r| !have.contains(&r.key())).cloned().collect();
            self.authorize(sg, &missing).await?;
        }
        Ok(())
    }

    /// Makes the node security groups `desired` admit all traffic from the load balancer's
    /// group `lb_sg`. Groups in `vpc` that admit `lb_sg` but are not desired lose that rule
    /// when `revoke_anywhere` (the group is ours), else only when they are tagged for the
    /// cluster, as upstream.
    pub(crate) async fn sync_lb_group_rule(
        &self,
        vpc: &str,
        desired: &BTreeSet<String>,
        lb_sg: &str,
        revoke_anywhere: bool,
    ) -> Result<(), ProviderError> {
        let rule = Rule {
            protocol: "-1".into(),
            from: -1,
            to: -1,
            source: Source::Group(lb_sg.to_string()),
            description: None,
        };
        let groups =
            self.describe_sgs(vec![Filter::builder().name("vpc-id").values(vpc).build()]).await?;
        for sg in &groups {
            let id = sg.group_id().unwrap_or_default();
            if id == lb_sg || desired.contains(id) {
                continue;
            }
            let tagged = self.tags.cluster_id().is_some() && self.tags.owns(sg.tags());
            if !(revoke_anywhere || tagged) {
                continue;
            }
            let stale: Vec<Rule> = rules_of(sg)
                .into_iter()
                .filter(|r| r.source == Source::Group(lb_sg.to_string()))
                .collect();
            if !stale.is_empty() {
                tracing::info!(group = %id, lb_group = %lb_sg, "revoking load-balancer rule from a node group no longer behind it");
                self.revoke(id, &stale).await?;
            }
        }
        for id in desired {
            let has = groups.iter().any(|sg| {
                sg.group_id() == Some(id.as_str())
                    && rules_of(sg).iter().any(|r| r.key() == rule.key())
            });
            if !has {
                self.authorize(id, std::slice::from_ref(&rule)).await?;
            }
        }
        Ok(())
    }

    /// Deletes a security group we created; `RetryAfter` while something still uses it.
    pub(crate) async fn delete_sg(&self, id: &str) -> Result<(), ProviderError> {
        let ec2 = &self.clients.get().await?.ec2;
        match ec2.delete_security_group().group_id(id).send().await {
            Ok(_) => {
                tracing::info!(group = %id, "deleted security group");
                Ok(())
            }
            Err(e) if error_code(&e) == Some("InvalidGroup.NotFound") => Ok(()),
            Err(e) if error_code(&e) == Some("DependencyViolation") => {
                Err(ProviderError::RetryAfter {
                    message: format!(
                        "security group {id} is still in use (load balancer network interfaces are being released)"
                    ),
                    delay: std::time::Duration::from_secs(15),
                })
            }
            Err(e) => Err(api_error(format!("DeleteSecurityGroup {id}"), e)),
        }
    }
}
