//! The Compute calls of the load balancers, one function per call: every read through
//! [`GceClient::call`] (a 404 is `None`), every mutation through [`GceClient::mutate`] (its
//! `Operation` awaited) — except, while parking is on, a mutation of the Service's own
//! resources, whose operation is parked when still running after a moment (`parked`). Regional resources live in the cluster's project and region;
//! firewalls, networks and subnetworks in the network project (upstream's project router);
//! health checks, legacy HTTP health checks and firewalls are global.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use google_cloud_compute_v1::model::{
    Address, BackendService, Firewall, ForwardingRule, HealthCheck, HttpHealthCheck, Instance,
    InstanceGroup, InstanceGroupsAddInstancesRequest, InstanceGroupsListInstancesRequest,
    InstanceGroupsRemoveInstancesRequest, InstanceReference, Network, Subnetwork, TargetPool,
    TargetPoolsAddInstanceRequest, TargetPoolsRemoveInstanceRequest,
    instance_groups_list_instances_request::InstanceState,
};

use super::parked::Parked;
use crate::client::{Compute, GceClient, GceError, ListPage, Scope, link};

/// A `…/regions/<r>/…` link (a regional resource).
pub fn is_regional_link(link: &str) -> bool {
    link.contains("/regions/")
}

/// `Ok(None)` for a 404.
fn found<T>(r: Result<T, GceError>) -> Result<Option<T>, GceError> {
    match r {
        Ok(v) => Ok(Some(v)),
        Err(e) if e.is_not_found() => Ok(None),
        Err(e) => Err(e),
    }
}

/// `Ok(false)` for a 404 (the resource was already gone), `Ok(true)` when deleted.
fn gone(r: Result<(), GceError>) -> Result<bool, GceError> {
    match r {
        Ok(()) => Ok(true),
        Err(e) if e.is_not_found() => Ok(false),
        Err(e) => Err(e),
    }
}

fn refs(links: &[String]) -> Vec<InstanceReference> {
    links
        .iter()
        .map(|l| {
            let mut r = InstanceReference::default();
            r.instance = Some(l.clone());
            r
        })
        .collect()
}

/// The calls, bound to a client and the cluster's scope.
pub struct Api<'a> {
    client: &'a GceClient,
    c: &'a Compute,
    /// The cluster's scope.
    pub scope: Arc<Scope>,
    /// `gcloud` commands for firewall changes Compute refused on a Shared VPC, for the
    /// Service's `LoadBalancerManualChange` Events.
    manual_changes: std::sync::Mutex<Vec<String>>,
    /// Where the Service's own mutations park a running operation ([`Self::parking`]).
    park: Option<Park>,
    /// Whether they do now (the external load balancer's code turns it on).
    parking: AtomicBool,
}

/// Where [`Api::write_owned`] parks an operation still running after `inline`.
struct Park {
    parked: Arc<Parked>,
    /// The load balancer's name: a resource whose name contains it is the Service's own.
    lb: String,
    inline: Duration,
}

/// Parking on while it lives ([`Api::parking`]).
pub struct ParkingOn<'b>(&'b AtomicBool);

impl Drop for ParkingOn<'_> {
    fn drop(&mut self) {
        self.0.store(false, Ordering::Relaxed);
    }
}

impl<'a> Api<'a> {
    /// The calls of `client` (its scope is worked out on first use).
    pub async fn new(client: &'a GceClient) -> Result<Api<'a>, GceError> {
        let scope = client.scope().await?;
        let c = client.compute().await?;
        Ok(Api {
            client,
            c,
            scope,
            manual_changes: std::sync::Mutex::new(Vec::new()),
            park: None,
            parking: AtomicBool::new(false),
        })
    }

    /// The calls of one Service's load balancer `lb`: while [`Self::parking`] is on, a
    /// mutation of its own resources waits at most `inline` for its operation and parks it
    /// in `parked` when it is still running ([`GceError::Running`]).
    pub fn with_parking(mut self, parked: Arc<Parked>, lb: &str, inline: Duration) -> Self {
        self.park = Some(Park { parked, lb: lb.to_string(), inline });
        self
    }

    /// Turns parking on until the guard is dropped (the external load balancer's syncs; the
    /// internal one's still wait, as their address holds span the whole sync).
    pub fn parking(&self) -> ParkingOn<'_> {
        self.parking.store(true, Ordering::Relaxed);
        ParkingOn(&self.parking)
    }

    /// Remembers a firewall change only the network project's administrators can make.
    pub fn manual_change(&self, command: String) {
        if let Ok(mut v) = self.manual_changes.lock() {
            v.push(command);
        }
    }

    /// The firewall changes remembered so far (cleared).
    pub fn take_manual_changes(&self) -> Vec<String> {
        self.manual_changes.lock().map(|mut v| std::mem::take(&mut *v)).unwrap_or_default()
    }

    /// A read, its future on the heap (the SDK's request futures are large).
    async fn read<T, F, Fut>(&self, operation: &'static str, f: F) -> Result<T, GceError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = google_cloud_gax::Result<T>>,
    {
        Box::pin(self.client.call(operation, f)).await
    }

    /// Every item of a paged list ([`GceClient::list_all`]: each page a read), its future
    /// on the heap.
    async fn list<P, F, Fut>(
        &self,
        operation: &'static str,
        zone: Option<&str>,
        page: F,
    ) -> Result<Vec<P::Item>, GceError>
    where
        P: ListPage,
        F: FnMut(Option<String>) -> Fut,
        Fut: std::future::Future<Output = google_cloud_gax::Result<P>>,
    {
        Box::pin(self.client.list_all(operation, zone, page)).await
    }

    /// A mutation, awaited to its operation's end, its future on the heap.
    async fn write<F, Fut>(&self, operation: &'static str, f: F) -> Result<(), GceError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<
                Output = google_cloud_gax::Result<google_cloud_compute_v1::model::Operation>,
            >,
    {
        Box::pin(self.client.mutate(operation, f)).await
    }

    /// A mutation of resource `name`: when it is the Service's own and parking is on,
    /// [`GceClient::mutate_within`] (a still-running operation parked, the error
    /// [`GceError::Running`]); otherwise [`Self::write`] (waited for).
    async fn write_owned<F, Fut>(
        &self,
        name: &str,
        operation: &'static str,
        f: F,
    ) -> Result<(), GceError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<
                Output = google_cloud_gax::Result<google_cloud_compute_v1::model::Operation>,
            >,
    {
        let park = self
            .park
            .as_ref()
            .filter(|p| self.parking.load(Ordering::Relaxed) && name.contains(p.lb.as_str()));
        let Some(p) = park else { return self.write(operation, f).await };
        let started = Instant::now();
        match Box::pin(self.client.mutate_within(operation, p.inline, f)).await {
            Err(GceError::Running { operation, name, op }) => {
                p.parked.park(&p.lb, operation, (*op).clone(), started);
                Err(GceError::Running { operation, name, op })
            }
            other => other,
        }
    }

    fn project(&self) -> String {
        self.scope.project.clone()
    }

    fn region(&self) -> String {
        self.scope.region.clone()
    }

    fn net_project(&self) -> String {
        self.scope.network_project.clone()
    }

    /// `…/projects/<p>/regions/<r>/<coll>/<name>`.
    pub fn regional_link(&self, coll: &str, name: &str) -> String {
        link(&format!(
            "projects/{}/regions/{}/{coll}/{name}",
            self.scope.project, self.scope.region
        ))
    }

    /// `…/projects/<p>/zones/<z>/instances/<name>`.
    pub fn instance_link(&self, zone: &str, name: &str) -> String {
        link(&format!("projects/{}/zones/{zone}/instances/{name}", self.scope.project))
    }

    /// `…/projects/<network project>/regions/<r>/subnetworks/<name>`.
    pub fn subnetwork_link(&self, name: &str) -> String {
        link(&format!(
            "projects/{}/regions/{}/subnetworks/{name}",
            self.scope.network_project, self.scope.region
        ))
    }

    // Forwarding rules (regional).

    pub async fn forwarding_rule(&self, name: &str) -> Result<Option<ForwardingRule>, GceError> {
        found(
            self.read("compute.forwardingRules.get", || {
                self.c
                    .forwarding_rules
                    .get()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_forwarding_rule(name)
                    .send()
            })
            .await,
        )
    }

    pub async fn forwarding_rules(&self) -> Result<Vec<ForwardingRule>, GceError> {
        self.list("compute.forwardingRules.list", None, |token| {
            self.c
                .forwarding_rules
                .list()
                .set_project(self.project())
                .set_region(self.region())
                .set_or_clear_page_token(token)
                .send()
        })
        .await
    }

    pub async fn insert_forwarding_rule(&self, fr: &ForwardingRule) -> Result<(), GceError> {
        self.write_owned(
            fr.name.as_deref().unwrap_or_default(),
            "compute.forwardingRules.insert",
            || {
                self.c
                    .forwarding_rules
                    .insert()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_body(fr.clone())
                    .send()
            },
        )
        .await
    }

    pub async fn delete_forwarding_rule(&self, name: &str) -> Result<bool, GceError> {
        gone(
            self.write_owned(name, "compute.forwardingRules.delete", || {
                self.c
                    .forwarding_rules
                    .delete()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_forwarding_rule(name)
                    .send()
            })
            .await,
        )
    }

    // Addresses (regional).

    pub async fn address(&self, name: &str) -> Result<Option<Address>, GceError> {
        found(
            self.read("compute.addresses.get", || {
                self.c
                    .addresses
                    .get()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_address(name)
                    .send()
            })
            .await,
        )
    }

    /// The region's address holding `ip` (upstream's `GetRegionAddressByIP`).
    pub async fn address_by_ip(&self, ip: &str) -> Result<Option<Address>, GceError> {
        let filter = format!("address eq {}", ip.replace('.', "\\."));
        let all = self
            .list("compute.addresses.list", None, |token| {
                self.c
                    .addresses
                    .list()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_filter(filter.clone())
                    .set_or_clear_page_token(token)
                    .send()
            })
            .await?;
        Ok(all.into_iter().find(|a| a.address.as_deref() == Some(ip)))
    }

    pub async fn insert_address(&self, a: &Address) -> Result<(), GceError> {
        self.write_owned(a.name.as_deref().unwrap_or_default(), "compute.addresses.insert", || {
            self.c
                .addresses
                .insert()
                .set_project(self.project())
                .set_region(self.region())
                .set_body(a.clone())
                .send()
        })
        .await
    }

    /// Deletes the load balancer's own address `name`, and only when it carries the proof
    /// written when it was reserved for a Service (a `{"kubernetes.io/service-name":…}`
    /// description): an address of that name without it (someone else's) is kept, with a
    /// warning. `Ok(false)` when there is nothing (of ours) to delete.
    pub async fn delete_address(&self, name: &str) -> Result<bool, GceError> {
        let Some(a) = self.address(name).await? else { return Ok(false) };
        let description = a.description.as_deref().unwrap_or_default();
        if super::naming::service_of_description(description).is_none() {
            tracing::warn!(
                address = name,
                "GCE: the address has this load balancer's name but no Service's description \
                 (it was not reserved by a cloud provider for a Service); it is kept"
            );
            return Ok(false);
        }
        gone(
            self.write_owned(name, "compute.addresses.delete", || {
                self.c
                    .addresses
                    .delete()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_address(name)
                    .send()
            })
            .await,
        )
    }

    // Target pools (regional).

    pub async fn target_pool(&self, name: &str) -> Result<Option<TargetPool>, GceError> {
        found(
            self.read("compute.targetPools.get", || {
                self.c
                    .target_pools
                    .get()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_target_pool(name)
                    .send()
            })
            .await,
        )
    }

    pub async fn insert_target_pool(&self, tp: &TargetPool) -> Result<(), GceError> {
        self.write_owned(
            tp.name.as_deref().unwrap_or_default(),
            "compute.targetPools.insert",
            || {
                self.c
                    .target_pools
                    .insert()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_body(tp.clone())
                    .send()
            },
        )
        .await
    }

    pub async fn delete_target_pool(&self, name: &str) -> Result<bool, GceError> {
        gone(
            self.write_owned(name, "compute.targetPools.delete", || {
                self.c
                    .target_pools
                    .delete()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_target_pool(name)
                    .send()
            })
            .await,
        )
    }

    pub async fn add_to_target_pool(&self, name: &str, links: &[String]) -> Result<(), GceError> {
        let mut body = TargetPoolsAddInstanceRequest::default();
        body.instances = refs(links);
        self.write_owned(name, "compute.targetPools.addInstance", || {
            self.c
                .target_pools
                .add_instance()
                .set_project(self.project())
                .set_region(self.region())
                .set_target_pool(name)
                .set_body(body.clone())
                .send()
        })
        .await
    }

    pub async fn remove_from_target_pool(
        &self,
        name: &str,
        links: &[String],
    ) -> Result<(), GceError> {
        let mut body = TargetPoolsRemoveInstanceRequest::default();
        body.instances = refs(links);
        self.write_owned(name, "compute.targetPools.removeInstance", || {
            self.c
                .target_pools
                .remove_instance()
                .set_project(self.project())
                .set_region(self.region())
                .set_target_pool(name)
                .set_body(body.clone())
                .send()
        })
        .await
    }

    // Legacy HTTP health checks (global).

    pub async fn http_health_check(&self, name: &str) -> Result<Option<HttpHealthCheck>, GceError> {
        found(
            self.read("compute.httpHealthChecks.get", || {
                self.c
                    .http_health_checks
                    .get()
                    .set_project(self.project())
                    .set_http_health_check(name)
                    .send()
            })
            .await,
        )
    }

    pub async fn insert_http_health_check(&self, hc: &HttpHealthCheck) -> Result<(), GceError> {
        self.write_owned(
            hc.name.as_deref().unwrap_or_default(),
            "compute.httpHealthChecks.insert",
            || {
                self.c
                    .http_health_checks
                    .insert()
                    .set_project(self.project())
                    .set_body(hc.clone())
                    .send()
            },
        )
        .await
    }

    pub async fn update_http_health_check(&self, hc: &HttpHealthCheck) -> Result<(), GceError> {
        let name = hc.name.clone().unwrap_or_default();
        self.write_owned(&name, "compute.httpHealthChecks.update", || {
            self.c
                .http_health_checks
                .update()
                .set_project(self.project())
                .set_http_health_check(name.clone())
                .set_body(hc.clone())
                .send()
        })
        .await
    }

    pub async fn delete_http_health_check(&self, name: &str) -> Result<bool, GceError> {
        gone(
            self.write("compute.httpHealthChecks.delete", || {
                self.c
                    .http_health_checks
                    .delete()
                    .set_project(self.project())
                    .set_http_health_check(name)
                    .send()
            })
            .await,
        )
    }

    // Health checks of the internal load balancer: global (`compute.healthChecks`), as
    // upstream's, so a cluster moving from upstream keeps and updates its checks. Before,
    // this provider made regional ones (`compute.regionHealthChecks`): a backend service
    // still naming one is moved to the global check on its next sync and the regional one
    // deleted ([`Self::delete_health_check_link`]).

    pub async fn health_check(&self, name: &str) -> Result<Option<HealthCheck>, GceError> {
        found(
            self.read("compute.healthChecks.get", || {
                self.c.health_checks.get().set_project(self.project()).set_health_check(name).send()
            })
            .await,
        )
    }

    pub async fn insert_health_check(&self, hc: &HealthCheck) -> Result<(), GceError> {
        self.write("compute.healthChecks.insert", || {
            self.c.health_checks.insert().set_project(self.project()).set_body(hc.clone()).send()
        })
        .await
    }

    pub async fn update_health_check(&self, hc: &HealthCheck) -> Result<(), GceError> {
        let name = hc.name.clone().unwrap_or_default();
        self.write("compute.healthChecks.update", || {
            self.c
                .health_checks
                .update()
                .set_project(self.project())
                .set_health_check(name.clone())
                .set_body(hc.clone())
                .send()
        })
        .await
    }

    pub async fn delete_health_check(&self, name: &str) -> Result<bool, GceError> {
        gone(
            self.write("compute.healthChecks.delete", || {
                self.c
                    .health_checks
                    .delete()
                    .set_project(self.project())
                    .set_health_check(name)
                    .send()
            })
            .await,
        )
    }

    /// Deletes the regional health check `name` (this provider's earlier internal load
    /// balancers made regional ones).
    pub async fn delete_region_health_check(&self, name: &str) -> Result<bool, GceError> {
        gone(
            self.write("compute.regionHealthChecks.delete", || {
                self.c
                    .region_health_checks
                    .delete()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_health_check(name)
                    .send()
            })
            .await,
        )
    }

    /// Deletes the health check a backend service's `healthChecks[]` entry names: the
    /// regional one for a `…/regions/<r>/healthChecks/<name>` link, else the global one.
    pub async fn delete_health_check_link(&self, link: &str) -> Result<bool, GceError> {
        let name = crate::client::last_segment(link);
        if is_regional_link(link) {
            self.delete_region_health_check(name).await
        } else {
            self.delete_health_check(name).await
        }
    }

    // Networks and subnetworks (reads, in the network project).

    /// The cluster network (`None` when Compute says it does not exist).
    pub async fn network(&self) -> Result<Option<Network>, GceError> {
        let name = crate::client::last_segment(&self.scope.network_url).to_string();
        found(
            self.read("compute.networks.get", || {
                self.c
                    .networks
                    .get()
                    .set_project(self.net_project())
                    .set_network(name.clone())
                    .send()
            })
            .await,
        )
    }

    /// The region's subnetworks of the cluster network (upstream's
    /// `listSubnetworksOfNetwork`: filter `network eq .*/<network>$`).
    pub async fn network_subnetworks(&self) -> Result<Vec<Subnetwork>, GceError> {
        let name = crate::client::last_segment(&self.scope.network_url).to_string();
        let filter = format!("network eq .*/{name}$");
        self.list("compute.subnetworks.list", None, |token| {
            self.c
                .subnetworks
                .list()
                .set_project(self.net_project())
                .set_region(self.region())
                .set_filter(filter.clone())
                .set_or_clear_page_token(token)
                .send()
        })
        .await
    }

    // Backend services (regional).

    pub async fn backend_service(&self, name: &str) -> Result<Option<BackendService>, GceError> {
        found(
            self.read("compute.regionBackendServices.get", || {
                self.c
                    .region_backend_services
                    .get()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_backend_service(name)
                    .send()
            })
            .await,
        )
    }

    pub async fn insert_backend_service(&self, bs: &BackendService) -> Result<(), GceError> {
        self.write("compute.regionBackendServices.insert", || {
            self.c
                .region_backend_services
                .insert()
                .set_project(self.project())
                .set_region(self.region())
                .set_body(bs.clone())
                .send()
        })
        .await
    }

    /// `PUT` with the fingerprint `bs` carries (a stale one is a 412).
    pub async fn update_backend_service(&self, bs: &BackendService) -> Result<(), GceError> {
        let name = bs.name.clone().unwrap_or_default();
        self.write("compute.regionBackendServices.update", || {
            self.c
                .region_backend_services
                .update()
                .set_project(self.project())
                .set_region(self.region())
                .set_backend_service(name.clone())
                .set_body(bs.clone())
                .send()
        })
        .await
    }

    pub async fn delete_backend_service(&self, name: &str) -> Result<bool, GceError> {
        gone(
            self.write("compute.regionBackendServices.delete", || {
                self.c
                    .region_backend_services
                    .delete()
                    .set_project(self.project())
                    .set_region(self.region())
                    .set_backend_service(name)
                    .send()
            })
            .await,
        )
    }

    // Unmanaged instance groups (zonal).

    pub async fn instance_group(
        &self,
        zone: &str,
        name: &str,
    ) -> Result<Option<InstanceGroup>, GceError> {
        found(
            self.read("compute.instanceGroups.get", || {
                self.c
                    .instance_groups
                    .get()
                    .set_project(self.project())
                    .set_zone(zone)
                    .set_instance_group(name)
                    .send()
            })
            .await,
        )
    }

    pub async fn insert_instance_group(
        &self,
        zone: &str,
        ig: &InstanceGroup,
    ) -> Result<(), GceError> {
        self.write("compute.instanceGroups.insert", || {
            self.c
                .instance_groups
                .insert()
                .set_project(self.project())
                .set_zone(zone)
                .set_body(ig.clone())
                .send()
        })
        .await
    }

    pub async fn delete_instance_group(&self, zone: &str, name: &str) -> Result<bool, GceError> {
        gone(
            self.write("compute.instanceGroups.delete", || {
                self.c
                    .instance_groups
                    .delete()
                    .set_project(self.project())
                    .set_zone(zone)
                    .set_instance_group(name)
                    .send()
            })
            .await,
        )
    }

    /// The zone's instance groups whose names start with `prefix` (upstream's
    /// `FilterInstanceGroupsByNamePrefix`: filter `name eq <prefix>.*`).
    pub async fn instance_groups_with_prefix(
        &self,
        zone: &str,
        prefix: &str,
    ) -> Result<Vec<InstanceGroup>, GceError> {
        let filter = format!("name eq {prefix}.*");
        let all = self
            .list("compute.instanceGroups.list", None, |token| {
                self.c
                    .instance_groups
                    .list()
                    .set_project(self.project())
                    .set_zone(zone)
                    .set_filter(filter.clone())
                    .set_or_clear_page_token(token)
                    .send()
            })
            .await?;
        Ok(all
            .into_iter()
            .filter(|g| g.name.as_deref().is_some_and(|n| n.starts_with(prefix)))
            .collect())
    }

    /// The names of the group's instances (any state).
    pub async fn instance_group_members(
        &self,
        zone: &str,
        name: &str,
    ) -> Result<Vec<String>, GceError> {
        let mut body = InstanceGroupsListInstancesRequest::default();
        body.instance_state = Some(InstanceState::All);
        let all = self
            .list("compute.instanceGroups.listInstances", None, |token| {
                self.c
                    .instance_groups
                    .list_instances()
                    .set_project(self.project())
                    .set_zone(zone)
                    .set_instance_group(name)
                    .set_body(body.clone())
                    .set_or_clear_page_token(token)
                    .send()
            })
            .await?;
        Ok(all
            .into_iter()
            .filter_map(|i| i.instance)
            .map(|l| crate::client::last_segment(&l).to_string())
            .collect())
    }

    pub async fn add_to_instance_group(
        &self,
        zone: &str,
        name: &str,
        links: &[String],
    ) -> Result<(), GceError> {
        let mut body = InstanceGroupsAddInstancesRequest::default();
        body.instances = refs(links);
        self.write("compute.instanceGroups.addInstances", || {
            self.c
                .instance_groups
                .add_instances()
                .set_project(self.project())
                .set_zone(zone)
                .set_instance_group(name)
                .set_body(body.clone())
                .send()
        })
        .await
    }

    pub async fn remove_from_instance_group(
        &self,
        zone: &str,
        name: &str,
        links: &[String],
    ) -> Result<(), GceError> {
        let mut body = InstanceGroupsRemoveInstancesRequest::default();
        body.instances = refs(links);
        self.write("compute.instanceGroups.removeInstances", || {
            self.c
                .instance_groups
                .remove_instances()
                .set_project(self.project())
                .set_zone(zone)
                .set_instance_group(name)
                .set_body(body.clone())
                .send()
        })
        .await
    }

    // Firewalls (global, in the network project).

    pub async fn firewall(&self, name: &str) -> Result<Option<Firewall>, GceError> {
        found(
            self.read("compute.firewalls.get", || {
                self.c.firewalls.get().set_project(self.net_project()).set_firewall(name).send()
            })
            .await,
        )
    }

    pub async fn insert_firewall(&self, fw: &Firewall) -> Result<(), GceError> {
        self.write_owned(fw.name.as_deref().unwrap_or_default(), "compute.firewalls.insert", || {
            self.c.firewalls.insert().set_project(self.net_project()).set_body(fw.clone()).send()
        })
        .await
    }

    pub async fn patch_firewall(&self, fw: &Firewall) -> Result<(), GceError> {
        let name = fw.name.clone().unwrap_or_default();
        self.write_owned(&name, "compute.firewalls.patch", || {
            self.c
                .firewalls
                .patch()
                .set_project(self.net_project())
                .set_firewall(name.clone())
                .set_body(fw.clone())
                .send()
        })
        .await
    }

    pub async fn delete_firewall(&self, name: &str) -> Result<bool, GceError> {
        gone(
            self.write_owned(name, "compute.firewalls.delete", || {
                self.c.firewalls.delete().set_project(self.net_project()).set_firewall(name).send()
            })
            .await,
        )
    }

    // Instances and zones (reads).

    /// The instances of `zone` whose names match `filter` (a Compute filter, may be empty).
    pub async fn instances(&self, zone: &str, filter: &str) -> Result<Vec<Instance>, GceError> {
        self.list("compute.instances.list", None, |token| {
            let req = self
                .c
                .instances
                .list()
                .set_project(self.project())
                .set_zone(zone)
                .set_or_clear_page_token(token);
            let req = if filter.is_empty() { req } else { req.set_filter(filter) };
            req.send()
        })
        .await
    }

    /// Every zone of the region (upstream's `ListZonesInRegion`).
    pub async fn region_zones(&self) -> Result<Vec<String>, GceError> {
        let region = self.region();
        let filter = format!("region eq .*/regions/{region}");
        let all = self
            .list("compute.zones.list", None, |token| {
                self.c
                    .zones
                    .list()
                    .set_project(self.project())
                    .set_filter(filter.clone())
                    .set_or_clear_page_token(token)
                    .send()
            })
            .await?;
        let mut zones: Vec<String> = all
            .into_iter()
            .filter(|z| {
                z.region.as_deref().map(crate::client::last_segment) == Some(region.as_str())
            })
            .filter_map(|z| z.name)
            .collect();
        zones.sort();
        Ok(zones)
    }
}
