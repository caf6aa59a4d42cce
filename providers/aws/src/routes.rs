//! Routes: pod-CIDR routes in the cluster's VPC route table.
//!
//! Owns finding the route table (`RouteTableID` from the config, else the one table tagged
//! with the cluster tag; anything other than exactly one is an error), listing the routes that
//! point at instances, creating a route (after disabling the instance's source/dest check and
//! removing a blackholed route for the same CIDR), and deleting by CIDR.
//!
//! A route's target node is the instance's private DNS name, as upstream: clusters whose node
//! names are not the private DNS names do not get their routes matched to nodes.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_ec2::types::{AttributeBooleanValue, Filter, RouteState, RouteTable};
use ccm_core::cloud::{ProviderError, Route, Routes};

use crate::client::{Clients, api_error};
use crate::instances::{AwsInstances, InstanceRef, instance_ref_for_name};
use crate::tags::ClusterTags;

/// The Routes implementation.
pub struct AwsRoutes {
    clients: Clients,
    instances: Arc<AwsInstances>,
    tags: ClusterTags,
    route_table_id: Option<String>,
}

impl std::fmt::Debug for AwsRoutes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AwsRoutes")
            .field("route_table_id", &self.route_table_id)
            .finish_non_exhaustive()
    }
}

fn is_ipv6(cidr: &str) -> bool {
    cidr.contains(':')
}

impl AwsRoutes {
    /// Routes in the table `route_table_id`, or the one tagged for the cluster when `None`.
    pub fn new(
        clients: Clients,
        instances: Arc<AwsInstances>,
        tags: ClusterTags,
        route_table_id: Option<String>,
    ) -> Self {
        AwsRoutes {
            clients,
            instances,
            tags,
            route_table_id: route_table_id.filter(|s| !s.is_empty()),
        }
    }

    async fn route_table(&self) -> Result<RouteTable, ProviderError> {
        let filter = match (&self.route_table_id, self.tags.key()) {
            (Some(id), _) => Filter::builder().name("route-table-id").values(id).build(),
            (None, Some(key)) => Filter::builder().name("tag-key").values(key).build(),
            (None, None) => {
                return Err(ProviderError::Invalid {
                    what: "RouteTableID".into(),
                    message: "no RouteTableID in the cloud config and no cluster ID to find the route table by tag".into(),
                });
            }
        };
        let resp = self
            .clients
            .get()
            .await?
            .ec2
            .describe_route_tables()
            .filters(filter)
            .send()
            .await
            .map_err(|e| api_error("DescribeRouteTables", e))?;
        let tables = resp.route_tables();
        match tables {
            [one] => Ok(one.clone()),
            [] => Err(ProviderError::other(match &self.route_table_id {
                Some(id) => format!("route table {id} (RouteTableID) not found"),
                None => format!(
                    "no route table is tagged {}; tag the cluster's route table or set RouteTableID",
                    self.tags.key().unwrap_or_default()
                ),
            })),
            many => Err(ProviderError::other(format!(
                "found {} route tables tagged {} ({}); set RouteTableID to choose one",
                many.len(),
                self.tags.key().unwrap_or_default(),
                many.iter().filter_map(|t| t.route_table_id()).collect::<Vec<_>>().join(", ")
            ))),
        }
    }
}

#[async_trait]
impl Routes for AwsRoutes {
    async fn list_routes(&self, cluster_name: &str) -> Result<Vec<Route>, ProviderError> {
        let table = self.route_table().await?;
        let mut pending: Vec<(String, String, bool)> = Vec::new();
        for r in table.routes() {
            let Some(cidr) = r.destination_cidr_block().or(r.destination_ipv6_cidr_block()) else {
                continue;
            };
            // Only routes to instances are ours; a blackholed route to a NAT gateway or a
            // peering connection is left alone.
            let Some(instance_id) = r.instance_id() else { continue };
            let blackhole = matches!(r.state(), Some(RouteState::Blackhole));
            pending.push((cidr.to_string(), instance_id.to_string(), blackhole));
        }
        let refs: Vec<InstanceRef> =
            pending.iter().map(|(_, id, _)| InstanceRef::Id(id.clone())).collect();
        let found = self.instances.find(&refs).await;
        let mut routes = Vec::new();
        for ((cidr, _, blackhole), f) in pending.into_iter().zip(found) {
            let target_node = match f? {
                Some(i) if !blackhole => i.private_dns_name().unwrap_or_default().to_string(),
                _ => String::new(),
            };
            routes.push(Route {
                name: format!("{cluster_name}-{cidr}"),
                target_node,
                target_node_addresses: Vec::new(),
                enable_node_addresses: false,
                destination_cidr: cidr,
                blackhole,
            });
        }
        Ok(routes)
    }

    async fn create_route(
        &self,
        _cluster_name: &str,
        _name_hint: &str,
        route: &Route,
    ) -> Result<(), ProviderError> {
        let r = instance_ref_for_name(&route.target_node);
        let instance = self
            .instances
            .find(std::slice::from_ref(&r))
            .await
            .into_iter()
            .next()
            .unwrap_or(Ok(None))?
            .ok_or(ProviderError::InstanceNotFound)?;
        let instance_id = instance.instance_id().unwrap_or_default().to_string();

        if instance.source_dest_check() != Some(false) {
            self.clients
                .get()
                .await?
                .ec2
                .modify_instance_attribute()
                .instance_id(&instance_id)
                .source_dest_check(AttributeBooleanValue::builder().value(false).build())
                .send()
                .await
                .map_err(|e| {
                    api_error(format!("disabling source/dest check on {instance_id}"), e)
                })?;
        }

        let table = self.route_table().await?;
        let table_id = table.route_table_id().unwrap_or_default().to_string();
        let cidr = route.destination_cidr.as_str();
        for existing in table.routes() {
            let dest = existing.destination_cidr_block().or(existing.destination_ipv6_cidr_block());
            if dest != Some(cidr) {
                continue;
            }
            if matches!(existing.state(), Some(RouteState::Blackhole)) {
                self.delete_cidr(&table_id, cidr).await?;
            } else if existing.instance_id() == Some(instance_id.as_str()) {
                return Ok(()); // Already there.
            }
        }
        let mut req = self
            .clients
            .get()
            .await?
            .ec2
            .create_route()
            .route_table_id(&table_id)
            .instance_id(&instance_id);
        req = if is_ipv6(cidr) {
            req.destination_ipv6_cidr_block(cidr)
        } else {
            req.destination_cidr_block(cidr)
        };
        req.send().await.map_err(|e| {
            api_error(format!("CreateRoute {cidr} → {instance_id} in {table_id}"), e)
        })?;
        Ok(())
    }

    async fn delete_route(&self, _cluster_name: &str, route: &Route) -> Result<(), ProviderError> {
        let table = self.route_table().await?;
        let table_id = table.route_table_id().unwrap_or_default().to_string();
        self.delete_cidr(&table_id, &route.destination_cidr).await
    }
}

impl AwsRoutes {
    async fn delete_cidr(&self, table_id: &str, cidr: &str) -> Result<(), ProviderError> {
        let mut req = self.clients.get().await?.ec2.delete_route().route_table_id(table_id);
        req = if is_ipv6(cidr) {
            req.destination_ipv6_cidr_block(cidr)
        } else {
            req.destination_cidr_block(cidr)
        };
        req.send().await.map_err(|e| api_error(format!("DeleteRoute {cidr} in {table_id}"), e))?;
        Ok(())
    }
}
