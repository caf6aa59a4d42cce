//! Routes: pod-CIDR routes in the cluster's VPC route table.
//!
//! Owns finding the route table (`RouteTableID` from the config, else the one table tagged
//! with the cluster tag; anything other than exactly one is an error), listing the routes that
//! point at instances, creating a route (after disabling the instance's source/dest check and
//! removing a blackholed route for the same CIDR), and deleting by CIDR.
//!
//! A route's target is reported as the name of the Node whose providerID names the route's
//! instance, as upstream (its node informer): clusters whose Nodes are named by instance ID
//! (`i-…`) or by a custom hostname get their routes matched to their Nodes, so the route
//! controller keeps them instead of deleting and re-creating them every pass. The Nodes are
//! listed through the client handed over at `initialize` ([`NodeNames`], one list per pass,
//! served from the API server's watch cache); an instance no Node names falls back to its
//! private DNS name. Creating a route finds the instance the same way (the Node's providerID),
//! else by the node name (`i-…` as an ID, anything else as a private DNS name). Listing Nodes
//! failing is an error: the pass is skipped and no route is deleted.

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use async_trait::async_trait;
use aws_sdk_ec2::types::{AttributeBooleanValue, Filter, RouteState, RouteTable};
use ccm_core::cloud::{ProviderError, Route, Routes};
use ccm_core::cloud_call::{DEFAULT_DEADLINE, Deadline};
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};

use crate::client::{Clients, api_error};
use crate::instances::{AwsInstances, InstanceRef, instance_ref_for_name, parse_provider_id};

/// The Nodes' names by instance ID and their instance IDs by name, read from the API server
/// through the client handed over at `initialize`.
#[derive(Default)]
pub struct NodeNames {
    client: OnceLock<kube::Client>,
}

impl std::fmt::Debug for NodeNames {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeNames").field("has_client", &self.client.get().is_some()).finish()
    }
}

/// One listing of the Nodes.
#[derive(Debug, Default)]
struct NodeMap {
    by_instance: HashMap<String, String>,
    by_name: HashMap<String, String>,
}

impl NodeNames {
    /// Uses `client` to list Nodes from now on (the first client handed over wins).
    pub fn set_client(&self, client: kube::Client) {
        let _ = self.client.set(client);
    }

    /// The Nodes with a providerID of this cloud; `None` before `initialize` (no client).
    async fn list(&self) -> Result<Option<NodeMap>, ProviderError> {
        let Some(client) = self.client.get() else { return Ok(None) };
        let api: Api<Node> = Api::all(client.clone());
        let nodes = Deadline::new(DEFAULT_DEADLINE)
            .run("listing Nodes", api.list(&ListParams::default().match_any()))
            .await?
            .map_err(|e| ProviderError::with_source("listing Nodes to name route targets", e))?;
        let mut map = NodeMap::default();
        for node in nodes {
            let Some(name) = node.metadata.name else { continue };
            let pid = node.spec.and_then(|s| s.provider_id).unwrap_or_default();
            let Ok(id) = parse_provider_id(&pid) else { continue };
            if let Some(other) = map.by_instance.get(&id).filter(|o| **o != name) {
                return Err(ProviderError::other(format!(
                    "Nodes {other} and {name} both have instance {id} as providerID; cannot tell which one its routes lead to"
                )));
            }
            map.by_instance.insert(id.clone(), name.clone());
            map.by_name.insert(name, id);
        }
        Ok(Some(map))
    }
}
use crate::tags::ClusterTags;

/// The Routes implementation.
pub struct AwsRoutes {
    clients: Clients,
    instances: Arc<AwsInstances>,
    tags: ClusterTags,
    route_table_id: Option<String>,
    nodes: Arc<NodeNames>,
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
            nodes: Arc::default(),
        }
    }

    /// Where route targets get their Node names (the provider hands it the client).
    pub fn node_names(&self) -> &Arc<NodeNames> {
        &self.nodes
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
        let nodes = if pending.is_empty() { None } else { self.nodes.list().await? };
        let mut routes = Vec::new();
        for ((cidr, instance_id, blackhole), f) in pending.into_iter().zip(found) {
            let target_node = match f? {
                Some(_) if blackhole => String::new(),
                Some(i) => nodes
                    .as_ref()
                    .and_then(|n| n.by_instance.get(&instance_id).cloned())
                    .unwrap_or_else(|| i.private_dns_name().unwrap_or_default().to_string()),
                None => String::new(),
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
        let by_node =
            self.nodes.list().await?.and_then(|mut n| n.by_name.remove(&route.target_node));
        let r = match by_node {
            Some(id) => InstanceRef::Id(id),
            None => instance_ref_for_name(&route.target_node),
        };
        let instance = self
            .instances
            .find(std::slice::from_ref(&r))
            .await
            .into_iter()
            .next()
            .unwrap_or(Ok(None))?
            .ok_or(ProviderError::InstanceNotFound)?;
        let instance_id = instance.id().to_string();

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
