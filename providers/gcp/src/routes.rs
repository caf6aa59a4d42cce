//! Routes: GCE routes that send each node's pod CIDR to its instance, as upstream
//! (`providers/gce/gce_routes.go`).
//!
//! - **Name**: `<cluster name, first 26 characters>-<name hint>` (the hint is the node UID), as
//!   upstream. A dual-stack node's IPv6 route, which upstream would give the same name (its
//!   insert then answers "already exists" and the route is never made), is
//!   `<cluster[:26]>-<hint without dashes>-v6` (at most 63 characters, Compute's limit).
//! - **Body**: `destRange` = the pod CIDR, `network` = the cluster network
//!   ([`Scope::network_url`]), `nextHopInstance` =
//!   `projects/<project>/zones/<zone>/instances/<instance>` (upstream writes
//!   `zones/<zone>/instances/<instance>`, which Compute resolves in the route's project: wrong
//!   with a shared VPC), `priority` 1000, `description` `k8s-node-route`. Routes live in the
//!   network's project (`network-project-id`), as upstream's project router puts them.
//! - **Target zone**: the node's instance (the node name up to its first `.`) is found in the
//!   managed zones. Upstream asks `instances.get` in each zone, then once more for the
//!   interface's network, for every route; here one shared listing of the managed zones
//!   (refreshed when older than [`INDEX_TTL`], or when a name is missing from it, at most
//!   every [`INDEX_MIN_AGE`]) answers a whole burst of creations, and a name it does not hold
//!   is asked for by `instances.get` per zone as upstream. With a single managed zone no
//!   lookup is needed (Compute checks the next hop on insert).
//! - **Already exists** (409): upstream takes it as success. Here the existing route is read
//!   and must have the same destination and next-hop instance; otherwise it is an error, so a
//!   stale route of that name is not mistaken for the node's.
//! - **List**: `routes.list` filtered as upstream (name `<cluster[:26]>-.*`, the cluster
//!   network, description `k8s-node-route`; regular expressions quoted), checked again here.
//!   `targetNode` = the last path segment of `nextHopInstance` (the instance name, upstream's
//!   assumption that node name = instance name). A route whose next-hop instance no longer
//!   exists (Compute's warning `NEXT_HOP_INSTANCE_NOT_FOUND`) is reported as a blackhole, so
//!   the route controller deletes it (upstream never sets `Blackhole`).
//! - **Delete**: `routes.delete`, waited for; a route already gone (404) is deleted. A name
//!   outside the cluster's prefix is refused.
//!
//! Every mutation waits for its `Operation`. Concurrency is the route controller's (at most
//! 200 operations in flight).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ccm_core::cloud::{ProviderError, Route, Routes};
use google_cloud_compute_v1::model::Route as GceRoute;
use ipnet::IpNet;
use tokio::sync::Mutex;

use crate::client::{GceClient, GceError, Scope, last_segment, link};
use crate::instances::{self, get_instance, instance_name, list_instances, quote_regex};

/// The description upstream gives its routes (`k8sNodeRouteTag`).
pub const ROUTE_DESCRIPTION: &str = "k8s-node-route";
/// The priority of node routes.
pub const ROUTE_PRIORITY: u32 = 1000;
/// How much of the cluster name prefixes route names (upstream's `truncateClusterName`).
pub const CLUSTER_PREFIX_LEN: usize = 26;
/// Compute's longest resource name.
pub const MAX_NAME_LEN: usize = 63;
/// Routes per page of `routes.list`.
pub const PAGE_SIZE: u32 = 500;
/// How long the listing of the managed zones' instances answers target lookups.
pub const INDEX_TTL: Duration = Duration::from_secs(30);
/// The listing is not redone for a missing name more often than this.
pub const INDEX_MIN_AGE: Duration = Duration::from_secs(2);
/// Compute's warning on a route whose `nextHopInstance` does not exist.
pub const WARNING_NEXT_HOP_GONE: &str = "NEXT_HOP_INSTANCE_NOT_FOUND";

/// The cluster name as route names start with it: its first 26 characters.
pub fn route_prefix(cluster_name: &str) -> String {
    cluster_name.chars().take(CLUSTER_PREFIX_LEN).collect()
}

/// The name of the route for a pod CIDR of the node with UID `name_hint`: upstream's
/// `<prefix>-<hint>` for IPv4, `<prefix>-<hint without dashes>-v6` (cut to 63 characters)
/// for IPv6.
pub fn route_name(cluster_name: &str, name_hint: &str, destination: &IpNet) -> String {
    let prefix = route_prefix(cluster_name);
    match destination {
        IpNet::V4(_) => format!("{prefix}-{name_hint}"),
        IpNet::V6(_) => {
            let hint: String = name_hint.chars().filter(|c| *c != '-').collect();
            let room = MAX_NAME_LEN.saturating_sub(prefix.len() + 1 + 3);
            let hint: String = hint.chars().take(room).collect();
            format!("{prefix}-{hint}-v6")
        }
    }
}

/// The `routes.list` filter: upstream's name prefix, network and description terms.
pub fn list_filter(cluster_name: &str, network_url: &str) -> String {
    // The network as `…/projects/<p>/global/networks/<n>` whatever host the link names.
    let network = match network_url.find("projects/") {
        Some(i) => format!(".*/{}", quote_regex(&network_url[i..])),
        None => quote_regex(network_url),
    };
    format!(
        "(name eq \"{}-.*\") (network eq \"{network}\") (description eq \"{}\")",
        quote_regex(&route_prefix(cluster_name)),
        quote_regex(ROUTE_DESCRIPTION)
    )
}

/// The cluster's route as the route controller sees it.
pub fn to_route(r: &GceRoute) -> Route {
    let blackhole = r
        .warnings
        .iter()
        .any(|w| w.code.as_ref().and_then(|c| c.name()) == Some(WARNING_NEXT_HOP_GONE));
    Route {
        name: r.name.clone().unwrap_or_default(),
        target_node: r.next_hop_instance.as_deref().map(last_segment).unwrap_or_default().into(),
        target_node_addresses: vec![],
        enable_node_addresses: false,
        destination_cidr: r.dest_range.clone().unwrap_or_default(),
        blackhole,
    }
}

fn same_network(a: &str, b: &str) -> bool {
    let rel = |s: &str| s.find("projects/").map_or(s.to_string(), |i| s[i..].to_string());
    rel(a) == rel(b)
}

/// Where the managed zones' instances are: instance name → zone.
#[derive(Debug)]
struct ZoneIndex {
    at: Instant,
    zones: HashMap<String, String>,
}

/// Routes for GCE.
#[derive(Debug)]
pub struct GceRoutes {
    client: Arc<GceClient>,
    index: Mutex<Option<ZoneIndex>>,
}

impl GceRoutes {
    /// Routes made through `client` (the cluster name comes with each call).
    pub fn new(client: Arc<GceClient>) -> Self {
        GceRoutes { client, index: Mutex::new(None) }
    }

    /// The zone of instance `name` in the managed zones.
    async fn zone_of(&self, scope: &Scope, name: &str) -> Result<String, ProviderError> {
        if let [only] = scope.zones.as_slice() {
            return Ok(only.clone());
        }
        let conforming = scope.node_instance_prefix.as_deref().is_none_or(|p| name.starts_with(p));
        if conforming {
            // Held while listing: concurrent creations wait for one listing.
            let mut index = self.index.lock().await;
            let fresh = index.as_ref().filter(|i| i.at.elapsed() < INDEX_TTL);
            if let Some(z) = fresh.and_then(|i| i.zones.get(name)) {
                return Ok(z.clone());
            }
            let recent = index.as_ref().is_some_and(|i| i.at.elapsed() < INDEX_MIN_AGE);
            if !recent {
                *index = Some(self.list_zones(scope).await?);
            }
            if let Some(z) = index.as_ref().and_then(|i| i.zones.get(name)) {
                return Ok(z.clone());
            }
        }
        // Upstream's lookup: `instances.get` in each managed zone.
        for zone in &scope.zones {
            if get_instance(&self.client, &scope.project, zone, name).await?.is_some() {
                return Ok(zone.clone());
            }
        }
        Err(ProviderError::other(format!(
            "no instance named {name:?} in zones {:?}: cannot route to it",
            scope.zones
        )))
    }

    async fn list_zones(&self, scope: &Scope) -> Result<ZoneIndex, GceError> {
        let filter =
            instances::prefix_filter(scope.node_instance_prefix.as_deref(), [].into_iter());
        let lists = scope.zones.iter().map(|z| {
            let filter = filter.as_deref();
            async move { list_instances(&self.client, &scope.project, z, filter).await }
        });
        let mut zones = HashMap::new();
        // Zones in reverse so the first managed zone wins a name held twice (upstream's order).
        let lists = futures::future::try_join_all(lists).await?;
        for (zone, items) in scope.zones.iter().zip(lists).rev() {
            for i in items {
                if let Some(n) = i.name {
                    zones.insert(n, zone.clone());
                }
            }
        }
        Ok(ZoneIndex { at: Instant::now(), zones })
    }

    async fn forget_index(&self) {
        *self.index.lock().await = None;
    }

    /// After a 409: the route named so must be this one.
    async fn check_existing(&self, scope: &Scope, want: &GceRoute) -> Result<(), ProviderError> {
        let name = want.name.clone().unwrap_or_default();
        let c = self.client.compute().await?;
        let have = self
            .client
            .call("compute.routes.get", || {
                c.routes.get().set_project(&scope.network_project).set_route(&name).send()
            })
            .await?;
        let dest = |r: &GceRoute| r.dest_range.as_deref().and_then(|d| d.parse::<IpNet>().ok());
        let hop = |r: &GceRoute| {
            r.next_hop_instance.as_deref().map(|h| {
                let i = h.find("zones/").unwrap_or(0);
                h[i..].to_string()
            })
        };
        if dest(&have).is_some() && dest(&have) == dest(want) && hop(&have) == hop(want) {
            tracing::info!(route = %name, "GCE: route already exists");
            return Ok(());
        }
        Err(ProviderError::other(format!(
            "route {name} already exists with destination {} and next hop {}, not {} via {}",
            have.dest_range.as_deref().unwrap_or_default(),
            have.next_hop_instance.as_deref().unwrap_or_default(),
            want.dest_range.as_deref().unwrap_or_default(),
            want.next_hop_instance.as_deref().unwrap_or_default(),
        )))
    }
}

#[async_trait]
impl Routes for GceRoutes {
    async fn list_routes(&self, cluster_name: &str) -> Result<Vec<Route>, ProviderError> {
        let scope = self.client.scope().await?;
        let c = self.client.compute().await?;
        let filter = list_filter(cluster_name, &scope.network_url);
        let prefix = format!("{}-", route_prefix(cluster_name));
        let all = self
            .client
            .list_all("compute.routes.list", None, |token| {
                c.routes
                    .list()
                    .set_project(&scope.network_project)
                    .set_filter(filter.clone())
                    .set_max_results(PAGE_SIZE)
                    .set_or_clear_page_token(token)
                    .send()
            })
            .await?;
        // The filter again, here: the controller deletes routes it does not know.
        Ok(all
            .iter()
            .filter(|r| {
                r.name.as_deref().is_some_and(|n| n.starts_with(&prefix))
                    && r.description.as_deref() == Some(ROUTE_DESCRIPTION)
                    && r.network.as_deref().is_some_and(|n| same_network(n, &scope.network_url))
            })
            .map(to_route)
            .collect())
    }

    async fn create_route(
        &self,
        cluster_name: &str,
        name_hint: &str,
        route: &Route,
    ) -> Result<(), ProviderError> {
        let destination: IpNet =
            route.destination_cidr.parse().map_err(|_| ProviderError::Invalid {
                what: "route destination".into(),
                message: format!("{:?} is not a CIDR", route.destination_cidr),
            })?;
        let instance = instance_name(&route.target_node);
        if instance.is_empty() {
            return Err(ProviderError::Invalid {
                what: "route target".into(),
                message: format!("node name {:?} names no instance", route.target_node),
            });
        }
        let scope = self.client.scope().await?;
        let zone = self.zone_of(&scope, instance).await?;
        let name = route_name(cluster_name, name_hint, &destination);
        let body = GceRoute::new()
            .set_name(&name)
            .set_dest_range(&route.destination_cidr)
            .set_next_hop_instance(link(&format!(
                "projects/{}/zones/{zone}/instances/{instance}",
                scope.project
            )))
            .set_network(&scope.network_url)
            .set_priority(ROUTE_PRIORITY)
            .set_description(ROUTE_DESCRIPTION);
        let c = self.client.compute().await?;
        let inserted = self
            .client
            .mutate("compute.routes.insert", || {
                c.routes.insert().set_project(&scope.network_project).set_body(body.clone()).send()
            })
            .await;
        match inserted {
            Ok(()) => {
                tracing::info!(route = %name, cidr = %route.destination_cidr, instance, zone = %zone, "GCE: created route");
                Ok(())
            }
            Err(e) if e.is_already_exists() => self.check_existing(&scope, &body).await,
            Err(e) => {
                if e.is_not_found() {
                    // The next hop may have moved or gone: look again next time.
                    self.forget_index().await;
                }
                Err(e.into())
            }
        }
    }

    async fn delete_route(&self, cluster_name: &str, route: &Route) -> Result<(), ProviderError> {
        let prefix = format!("{}-", route_prefix(cluster_name));
        if !route.name.starts_with(&prefix) {
            return Err(ProviderError::Invalid {
                what: format!("route {:?}", route.name),
                message: format!(
                    "is not a route of cluster {cluster_name:?} (names start with {prefix:?})"
                ),
            });
        }
        let scope = self.client.scope().await?;
        let c = self.client.compute().await?;
        let deleted = self
            .client
            .mutate("compute.routes.delete", || {
                c.routes.delete().set_project(&scope.network_project).set_route(&route.name).send()
            })
            .await;
        match deleted {
            Ok(()) => Ok(()),
            Err(e) if e.is_not_found() => {
                tracing::info!(route = %route.name, "GCE: route already deleted");
                Ok(())
            }
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use google_cloud_compute_v1::model::route::{Warnings, warnings::Code};

    #[test]
    fn names_are_upstreams_and_fit_compute() {
        let uid = "0f8a1b2c-3d4e-5f60-7182-93a4b5c6d7e8";
        let long = "a-very-long-cluster-name-that-goes-on";
        let v4: IpNet = "10.64.1.0/24".parse().unwrap();
        let v6: IpNet = "fd00:10:64:1::/64".parse().unwrap();
        assert_eq!(route_name(long, uid, &v4), format!("a-very-long-cluster-name-t-{uid}"));
        assert_eq!(route_name(long, uid, &v4).len(), 63);
        let n6 = route_name(long, uid, &v6);
        assert_eq!(n6, "a-very-long-cluster-name-t-0f8a1b2c3d4e5f60718293a4b5c6d7e8-v6");
        assert!(n6.len() <= MAX_NAME_LEN);
        assert_ne!(n6, route_name(long, uid, &v4));
        assert_eq!(route_name("k", "x", &v4), "k-x");
        assert!(route_name("k", &"x".repeat(80), &v6).len() <= MAX_NAME_LEN);
    }

    #[test]
    fn the_list_filter_is_upstreams_with_quoted_regexes() {
        let f = list_filter(
            "kubernetes.io",
            "https://www.googleapis.com/compute/v1/projects/p/global/networks/k8s",
        );
        assert_eq!(
            f,
            "(name eq \"kubernetes\\.io-.*\") (network eq \".*/projects/p/global/networks/k8s\") \
             (description eq \"k8s-node-route\")"
        );
    }

    #[test]
    fn a_route_to_a_missing_instance_is_a_blackhole() {
        let r =
            GceRoute::new().set_name("k-uid").set_dest_range("10.64.1.0/24").set_next_hop_instance(
                "https://www.googleapis.com/compute/v1/projects/p/zones/z/instances/node-1",
            );
        let got = to_route(&r);
        assert_eq!(got.target_node, "node-1");
        assert_eq!(got.destination_cidr, "10.64.1.0/24");
        assert!(!got.blackhole);
        let r = r.set_warnings([Warnings::new().set_code(Code::NextHopInstanceNotFound)]);
        assert!(to_route(&r).blackhole);
        assert!(same_network(
            "https://x/compute/v1/projects/p/global/networks/n",
            "projects/p/global/networks/n"
        ));
    }
}
