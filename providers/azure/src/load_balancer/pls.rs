//! Private Link Service on a Service's internal frontend (upstream
//! `azure_privatelinkservice.go`, the ten `azure-pls-*` annotations), issue #33 item 2.
//!
//! - **Create**: `azure-pls-create: "true"` on an internal Service (or one with floating IP
//!   disabled, as upstream allows) makes a PLS `azure-pls-name` (default `pls-<frontend>`) in
//!   `azure-pls-resource-group` (default the cluster's resource group; a group the Service
//!   names must be one `serviceResourceGroups` allows) on the Service's IPv4 frontend, tagged
//!   `k8s-azure-cluster-name: <cluster>` and `k8s-azure-owner-service: <namespace>/<name>`
//!   (upstream's tags), with `azure-pls-ip-configuration-ip-address-count` NAT IP
//!   configurations (1–8, default 1) in `azure-pls-ip-configuration-subnet` (else the
//!   internal-subnet annotation, else `subnetName`): the static ones of
//!   `azure-pls-ip-configuration-ip-address` first (IPv4, the first one primary), then
//!   dynamic ones; visibility and auto-approval subscriptions, FQDNs, proxy protocol.
//! - **Update**: any annotation change is one `PUT` (with `If-Match`) of what changed; the
//!   name cannot change (an error, as upstream).
//! - **Delete**: when the Service goes, when `azure-pls-create` is removed or `false`, and
//!   before any of the Service's frontends is removed (ARM refuses to remove a frontend a PLS
//!   uses): a PLS is deleted only when this cluster made it (its cluster tag is this
//!   cluster's and it names an owner Service). Another's PLS on a frontend the Service would
//!   remove is an error (the frontend stays); a PLS of another Service of this cluster on a
//!   shared frontend is used as is (upstream's sharing) unless the Service asks for settings
//!   of its own (an error).
//! - **Subnet**: ARM puts a PLS only in a subnet whose `privateLinkServiceNetworkPolicies`
//!   is `Disabled`. The config's own subnet (`subnetName`) is switched to `Disabled` as
//!   upstream does (only that property, with `If-Match`); a subnet a Service's annotation
//!   names is never rewritten: an error says what to set.
//! - **Names**: an existing PLS of that name that is not on the Service's frontend (someone
//!   else's) is an error, never adopted.

use std::collections::BTreeMap;
use std::net::Ipv4Addr;
use std::sync::Arc;

use ccm_core::cloud::ProviderError;
use ccm_core::reference::{KeyDoc, annotation as kd};
use k8s_openapi::api::core::v1::Service;
use serde::{Deserialize, Serialize};
use tracing::{info, warn};

use crate::client::ArmClient;
use crate::client::api_version::NETWORK;
use crate::client::models::{Extra, FrontendIpProperties, Ref, Resource, SubResource, Subnet};
use crate::client::names::{self, NameKind};
use crate::config::Config;

use super::annotations::ServiceConfig;
use super::naming::{self, CLUSTER_TAG};
use super::{Action, Ops, rmw};

/// `true` → a Private Link Service on the Service's frontend.
pub const CREATE: &str = "service.beta.kubernetes.io/azure-pls-create";
/// The PLS's name (default `pls-<frontend name>`).
pub const NAME: &str = "service.beta.kubernetes.io/azure-pls-name";
/// The PLS's resource group (default the cluster's).
pub const RESOURCE_GROUP: &str = "service.beta.kubernetes.io/azure-pls-resource-group";
/// The subnet of the NAT IP configurations.
pub const IP_CONFIGURATION_SUBNET: &str =
    "service.beta.kubernetes.io/azure-pls-ip-configuration-subnet";
/// How many NAT IP configurations (1–8, default 1).
pub const IP_CONFIGURATION_IP_ADDRESS_COUNT: &str =
    "service.beta.kubernetes.io/azure-pls-ip-configuration-ip-address-count";
/// Space-separated static NAT IPs (IPv4; the first is primary).
pub const IP_CONFIGURATION_IP_ADDRESS: &str =
    "service.beta.kubernetes.io/azure-pls-ip-configuration-ip-address";
/// Space-separated FQDNs.
pub const FQDNS: &str = "service.beta.kubernetes.io/azure-pls-fqdns";
/// `true` → TCP proxy protocol v2.
pub const PROXY_PROTOCOL: &str = "service.beta.kubernetes.io/azure-pls-proxy-protocol";
/// Space-separated subscription IDs the PLS is visible to, or `*`.
pub const VISIBILITY: &str = "service.beta.kubernetes.io/azure-pls-visibility";
/// Space-separated subscription IDs whose connections are approved automatically.
pub const AUTO_APPROVAL: &str = "service.beta.kubernetes.io/azure-pls-auto-approval";

/// Upstream's tag naming the Service a PLS was made for.
pub const OWNER_SERVICE_TAG: &str = "k8s-azure-owner-service";

/// `Microsoft.Network/privateLinkServices`.
pub const PLS_TYPE: &str = "Microsoft.Network/privateLinkServices";

const PLS_OPS: Ops = Ops {
    get: "network.private_link_services.get",
    put: "network.private_link_services.create_or_update",
    delete: "network.private_link_services.delete",
};

const SUBNET_OPS: Ops = Ops {
    get: "network.subnets.get",
    put: "network.subnets.create_or_update",
    delete: "network.subnets.delete",
};

/// ARM's longest frontend/IP configuration name (upstream `FrontendIPConfigNameMaxLength`).
const IP_CONFIG_NAME_MAX: usize = 80;

/// The ten annotations, documented (for the annotation reference).
pub static PLS_ANNOTATIONS: &[KeyDoc] = &[
    kd(
        CREATE,
        "`true`/`false` (any case), default `false`",
        "true",
        "A Private Link Service on the Service's IPv4 frontend (internal Services, or floating IP disabled). `false` or removing it deletes the PLS the cluster made for the Service.",
    ),
    kd(
        NAME,
        "ARM network resource name",
        "my-pls",
        "The PLS's name, default `pls-<frontend name>`. It cannot change once the PLS exists (an error). A PLS of that name that is not on the Service's frontend is an error, never adopted.",
    ),
    kd(
        RESOURCE_GROUP,
        "resource group name",
        "rg-pls",
        "Where the PLS is made, default the cluster's `resourceGroup`; must be a group `serviceResourceGroups` allows.",
    ),
    kd(
        IP_CONFIGURATION_SUBNET,
        "subnet name in `vnetName`",
        "pls-subnet",
        "The subnet of the PLS's NAT IP configurations, default the internal-subnet annotation, else `subnetName`. Its `privateLinkServiceNetworkPolicies` must be `Disabled` (the config's own subnet is switched as upstream does; a subnet named here is never rewritten: an error says so).",
    ),
    kd(
        IP_CONFIGURATION_IP_ADDRESS_COUNT,
        "whole number 1 to 8, default 1",
        "2",
        "How many NAT IP configurations; at least the number of static addresses.",
    ),
    kd(
        IP_CONFIGURATION_IP_ADDRESS,
        "space-separated IPv4 addresses",
        "10.240.0.60 10.240.0.61",
        "Static NAT addresses (the first is primary); the rest of the count is dynamic.",
    ),
    kd(FQDNS, "space-separated FQDNs", "pls.example.com", "The PLS's FQDNs."),
    kd(
        PROXY_PROTOCOL,
        "`true`/`false` (any case), default `false`",
        "true",
        "TCP proxy protocol v2 on the PLS.",
    ),
    kd(
        VISIBILITY,
        "space-separated subscription IDs, or `*`",
        "*",
        "Subscriptions that can see the PLS (`*`: every subscription).",
    ),
    kd(
        AUTO_APPROVAL,
        "space-separated subscription IDs",
        "8ecadfc9-0000-0000-0000-00000000abcd",
        "Subscriptions whose private endpoint connections are approved automatically.",
    ),
];

/// A PLS's subscription list (`visibility`, `autoApproval`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Subscriptions {
    /// Subscription IDs (or `*`).
    #[serde(default)]
    pub subscriptions: Vec<String>,
    /// Everything else.
    #[serde(flatten)]
    pub extra: Extra,
}

/// A PLS NAT IP configuration's properties: a private address in a subnet, as a frontend's
/// ([`FrontendIpProperties`]: address, allocation, version, subnet; never a public IP), and
/// whether it is the primary one.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct IpConfigProperties {
    /// The address, its allocation (`Static`/`Dynamic`), version (`IPv4`) and subnet.
    #[serde(flatten)]
    pub address: FrontendIpProperties,
    /// The primary one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub primary: Option<bool>,
}

/// A PLS's properties.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PlsProperties {
    /// The load balancer frontends it serves.
    #[serde(default, rename = "loadBalancerFrontendIpConfigurations")]
    pub frontends: Vec<Ref>,
    /// NAT IP configurations.
    #[serde(default)]
    pub ip_configurations: Vec<SubResource<IpConfigProperties>>,
    /// Who can see it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub visibility: Option<Subscriptions>,
    /// Whose connections are approved automatically.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auto_approval: Option<Subscriptions>,
    /// FQDNs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fqdns: Option<Vec<String>>,
    /// TCP proxy protocol.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enable_proxy_protocol: Option<bool>,
    /// `Succeeded`, `Failed`, … (read-only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub provisioning_state: Option<String>,
    /// Everything else (alias, private endpoint connections, network interfaces, …).
    #[serde(flatten)]
    pub extra: Extra,
}

/// `Microsoft.Network/privateLinkServices`.
pub type PrivateLinkService = Resource<PlsProperties>;

/// What the Service's annotations ask for.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Want {
    /// `azure-pls-create`.
    pub create: bool,
    /// `azure-pls-name`.
    pub name: Option<String>,
    /// `azure-pls-resource-group`.
    pub resource_group: Option<String>,
    /// The NAT subnet named by an annotation (`azure-pls-ip-configuration-subnet`, else the
    /// internal-subnet annotation of an internal Service), and which annotation named it.
    pub subnet: Option<(String, &'static str)>,
    /// NAT IP configurations.
    pub count: usize,
    /// Static NAT IPs, in order (the first is primary).
    pub static_ips: Vec<Ipv4Addr>,
    /// FQDNs.
    pub fqdns: Vec<String>,
    /// Proxy protocol.
    pub proxy_protocol: bool,
    /// Visibility subscriptions.
    pub visibility: Vec<String>,
    /// Auto-approval subscriptions.
    pub auto_approval: Vec<String>,
    /// Any setting beyond `azure-pls-create` (upstream's `serviceHasAdditionalConfigs`).
    pub additional: bool,
}

fn invalid(what: &str, message: impl Into<String>) -> ProviderError {
    ProviderError::Invalid { what: what.into(), message: message.into() }
}

fn words(v: &str) -> Vec<String> {
    v.split_whitespace().map(str::to_string).collect()
}

fn is_subscription_id(s: &str) -> bool {
    let parts: Vec<&str> = s.split('-').collect();
    parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && parts.iter().all(|p| p.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// Reads the ten annotations, each checked (an error names the annotation).
pub fn parse(service: &Service) -> Result<Want, ProviderError> {
    let empty = BTreeMap::new();
    let a = service.metadata.annotations.as_ref().unwrap_or(&empty);
    let get = |k: &str| a.get(k).map(|v| v.trim()).filter(|v| !v.is_empty());
    let flag = |k: &str| -> Result<bool, ProviderError> {
        match get(k) {
            None => Ok(false),
            Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
            Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
            Some(v) => Err(invalid(k, format!("{v:?} is not true or false"))),
        }
    };
    let mut w = Want { create: flag(CREATE)?, count: 1, ..Want::default() };
    if let Some(n) = get(NAME) {
        names::check(NameKind::Network, n).map_err(|m| invalid(NAME, m))?;
        w.name = Some(n.to_string());
    }
    if let Some(rg) = get(RESOURCE_GROUP) {
        names::check(NameKind::ResourceGroup, rg).map_err(|m| invalid(RESOURCE_GROUP, m))?;
        w.resource_group = Some(rg.to_string());
    }
    let internal =
        get(super::annotations::INTERNAL).is_some_and(|v| v.eq_ignore_ascii_case("true"));
    let subnet = get(IP_CONFIGURATION_SUBNET).map(|s| (s, IP_CONFIGURATION_SUBNET)).or_else(|| {
        get(super::annotations::INTERNAL_SUBNET)
            .filter(|_| internal)
            .map(|s| (s, super::annotations::INTERNAL_SUBNET))
    });
    if let Some((s, key)) = subnet {
        names::check(NameKind::Network, s).map_err(|m| invalid(key, m))?;
        w.subnet = Some((s.to_string(), key));
    }
    if let Some(c) = get(IP_CONFIGURATION_IP_ADDRESS_COUNT) {
        w.count = c.parse::<usize>().ok().filter(|n| (1..=8).contains(n)).ok_or_else(|| {
            invalid(
                IP_CONFIGURATION_IP_ADDRESS_COUNT,
                format!("{c:?} is not a whole number from 1 to 8"),
            )
        })?;
    }
    for ip in get(IP_CONFIGURATION_IP_ADDRESS).map(words).unwrap_or_default() {
        let parsed: std::net::IpAddr = ip.parse().map_err(|_| {
            invalid(IP_CONFIGURATION_IP_ADDRESS, format!("{ip:?} is not an IP address"))
        })?;
        let std::net::IpAddr::V4(v4) = parsed else {
            return Err(invalid(
                IP_CONFIGURATION_IP_ADDRESS,
                format!("{ip}: a private link service's NAT addresses are IPv4 only"),
            ));
        };
        if !w.static_ips.contains(&v4) {
            w.static_ips.push(v4);
        }
    }
    if w.static_ips.len() > w.count {
        return Err(invalid(
            IP_CONFIGURATION_IP_ADDRESS,
            format!(
                "{} static addresses but {IP_CONFIGURATION_IP_ADDRESS_COUNT} is {}",
                w.static_ips.len(),
                w.count
            ),
        ));
    }
    w.fqdns = get(FQDNS).map(words).unwrap_or_default();
    w.proxy_protocol = flag(PROXY_PROTOCOL)?;
    let vis = get(VISIBILITY).map(words).unwrap_or_default();
    w.visibility = if vis.iter().any(|v| v == "*") { vec!["*".to_string()] } else { vis };
    for s in w.visibility.iter().filter(|s| *s != "*") {
        if !is_subscription_id(s) {
            return Err(invalid(VISIBILITY, format!("{s:?} is not a subscription ID or *")));
        }
    }
    w.auto_approval = get(AUTO_APPROVAL).map(words).unwrap_or_default();
    for s in &w.auto_approval {
        if !is_subscription_id(s) {
            return Err(invalid(AUTO_APPROVAL, format!("{s:?} is not a subscription ID")));
        }
    }
    w.additional = [
        NAME,
        IP_CONFIGURATION_SUBNET,
        IP_CONFIGURATION_IP_ADDRESS_COUNT,
        IP_CONFIGURATION_IP_ADDRESS,
        FQDNS,
        PROXY_PROTOCOL,
        VISIBILITY,
        AUTO_APPROVAL,
    ]
    .iter()
    .any(|k| a.contains_key(*k));
    Ok(w)
}

/// The Service's load balancer annotations ([`super::annotations::parse`], which checks its PLS
/// annotations with [`parse`]), before any ARM call: a PLS asked for on a public
/// Service with floating IP is an error naming `azure-pls-create` (nothing is written).
pub fn parse_service(service: &Service) -> Result<ServiceConfig, ProviderError> {
    super::annotations::parse(service)
}

/// Made by this cluster for some Service: the cluster tag is `cluster`'s and an owner
/// Service is named.
pub fn made_by(pls: &PrivateLinkService, cluster: &str) -> bool {
    pls.tag(CLUSTER_TAG).is_some_and(|c| c.trim().eq_ignore_ascii_case(cluster))
        && pls.tag(OWNER_SERVICE_TAG).is_some_and(|o| !o.trim().is_empty())
}

/// The frontends the Service uses on `lb` (its own and shared ones): name, ARM ID, IPv6.
pub fn frontends_of(
    svc: &ServiceConfig,
    lb: &crate::client::models::LoadBalancer,
) -> Vec<(String, String, bool)> {
    super::frontend::used(svc, lb)
        .map(|f| {
            let v6 = super::frontend::family_of(svc, f) == super::annotations::Family::V6;
            (f.name().to_string(), f.id().to_string(), v6)
        })
        .collect()
}

/// Whether `pls` serves the frontend `fe_id`.
fn serves(pls: &PrivateLinkService, fe_id: &str) -> bool {
    pls.properties.frontends.iter().any(|r| r.is(fe_id))
}

/// The cluster's Private Link Services.
pub struct PrivateLinks {
    client: Arc<ArmClient>,
    config: Arc<Config>,
}

impl PrivateLinks {
    /// A manager for the Services' Private Link Services.
    pub fn new(client: Arc<ArmClient>, config: Arc<Config>) -> Self {
        PrivateLinks { client, config }
    }

    /// The PLS resource group of the Service (annotation or the cluster's).
    fn resource_group(&self, want: &Want) -> Result<String, ProviderError> {
        match &want.resource_group {
            Some(rg) if !self.config.service_resource_groups().allows(rg) => Err(invalid(
                RESOURCE_GROUP,
                format!(
                    "resource group {rg} is not one this cluster's Services may name (the config's serviceResourceGroups)"
                ),
            )),
            Some(rg) => Ok(rg.clone()),
            None => Ok(self.config.resource_group().to_string()),
        }
    }

    /// The groups a Service's PLS may be in (deletion looks in each).
    fn groups(&self, service: &Service) -> Vec<String> {
        let mut out = vec![self.config.resource_group().to_string()];
        if let Ok(w) = parse(service)
            && let Some(rg) = w.resource_group
            && self.config.service_resource_groups().allows(&rg)
            && !out.iter().any(|g| g.eq_ignore_ascii_case(&rg))
        {
            out.push(rg);
        }
        out
    }

    async fn list(&self, rg: &str) -> Result<Vec<PrivateLinkService>, ProviderError> {
        let collection = self.client.collection_id(rg, PLS_TYPE)?;
        Ok(self
            .client
            .list("network.private_link_services.list", &collection, NETWORK, &[])
            .await?)
    }

    /// The PLS on frontend `fe_id` in `rg`, if any.
    async fn on_frontend(
        &self,
        rg: &str,
        fe_id: &str,
    ) -> Result<Option<PrivateLinkService>, ProviderError> {
        Ok(self.list(rg).await?.into_iter().find(|p| serves(p, fe_id)))
    }

    /// Before the Service is taken off `lb` (as read): the PLS of each frontend the removal
    /// takes (the Service's own, or a shared one it was the last user of) is deleted when
    /// this cluster made it; another's is an error (the frontend stays).
    pub async fn release_removed(
        &self,
        cluster: &str,
        service: &Service,
        svc: &ServiceConfig,
        lb: &crate::client::models::LoadBalancer,
    ) -> Result<(), ProviderError> {
        let mut lb = lb.clone();
        let going: Vec<String> =
            super::frontend::remove(&mut lb, svc).iter().map(|f| f.id().to_string()).collect();
        self.release(cluster, service, &svc.key, &going, false).await
    }

    /// After the Service's load balancer is ensured: the PLS of each of its IPv4 frontends
    /// (`frontends`: name, ARM ID, IPv6) as its annotations say — made, updated, or deleted
    /// when no longer asked for.
    pub async fn ensure(
        &self,
        cluster: &str,
        service: &Service,
        svc: &ServiceConfig,
        frontends: &[(String, String, bool)],
    ) -> Result<(), ProviderError> {
        let want = parse(service)?;
        if !want.create && !svc.internal && svc.floating_ip {
            // A public Service with floating IP never has a PLS of its own (no call).
            return Ok(());
        }
        if !want.create {
            // Not (or no longer) asked for: the Service's own PLS goes.
            let ids: Vec<String> = frontends.iter().map(|(_, id, _)| id.clone()).collect();
            return self.release(cluster, service, &svc.key, &ids, true).await;
        }
        if !svc.internal && svc.floating_ip {
            return Err(invalid(
                CREATE,
                "a private link service needs an internal Service (azure-load-balancer-internal) or floating IP disabled",
            ));
        }
        let v4: Vec<_> = frontends.iter().filter(|(_, _, v6)| !v6).collect();
        if v4.is_empty() {
            return Err(invalid(
                CREATE,
                "a private link service needs an IPv4 frontend (IPv6 is not supported)",
            ));
        }
        let rg = self.resource_group(&want)?;
        for (fe_name, fe_id, _) in v4 {
            self.ensure_one(cluster, svc, &want, &rg, fe_name, fe_id).await?;
        }
        Ok(())
    }

    async fn ensure_one(
        &self,
        cluster: &str,
        svc: &ServiceConfig,
        want: &Want,
        rg: &str,
        fe_name: &str,
        fe_id: &str,
    ) -> Result<(), ProviderError> {
        let existing = self.on_frontend(rg, fe_id).await?;
        if let Some(pls) = &existing {
            if !made_by(pls, cluster) {
                return Err(invalid(
                    CREATE,
                    format!(
                        "frontend {fe_name} already has private link service {} that this cluster did not make: not changed",
                        pls.name()
                    ),
                ));
            }
            let owner = pls.tag(OWNER_SERVICE_TAG).unwrap_or_default().trim().to_string();
            if !owner.eq_ignore_ascii_case(&svc.key) {
                if want.additional {
                    return Err(invalid(
                        CREATE,
                        format!(
                            "frontend {fe_name} already has private link service {} of Service {owner}; a Service sharing it cannot set its own azure-pls-* settings",
                            pls.name()
                        ),
                    ));
                }
                return Ok(());
            }
        }
        let name = match (&want.name, &existing) {
            (Some(n), Some(p)) if !p.name().eq_ignore_ascii_case(n) => {
                return Err(invalid(
                    NAME,
                    format!("the private link service {} cannot be renamed to {n}", p.name()),
                ));
            }
            (Some(n), _) => n.clone(),
            (None, Some(p)) => p.name().to_string(),
            (None, None) => format!("pls-{fe_name}"),
        };
        names::check(NameKind::Network, &name).map_err(|m| invalid(NAME, m))?;
        let subnet = self.nat_subnet(want).await?;
        let id = self.client.resource_id(rg, PLS_TYPE, &name)?;
        let location = self.config.location.clone().unwrap_or_default();
        let config_tags = super::public_ip::config_tags(&self.config)?;
        let fe_id = fe_id.to_string();
        let had = existing.is_some();
        rmw::<PlsProperties>(&self.client, PLS_OPS, &id, &mut |current| {
            let mut pls = match current {
                // A PLS of that name not on this frontend: someone else's (or another
                // frontend's): never adopted.
                Some(p) if !had || !serves(&p, &fe_id) || !made_by(&p, cluster) => {
                    return Err(invalid(
                        NAME,
                        format!(
                            "private link service {name} already exists in resource group {rg} and is not the one on frontend {fe_name}: not adopted"
                        ),
                    ));
                }
                Some(p) => p,
                None => PrivateLinkService {
                    name: Some(name.clone()),
                    location: Some(location.clone()),
                    ..Default::default()
                },
            };
            let changed = expected(&mut pls, want, &subnet, &fe_id, cluster, &svc.key, &config_tags);
            let failed = super::provisioning_failed(pls.properties.provisioning_state.as_deref());
            Ok(if changed || failed { Action::Put(pls) } else { Action::Keep(pls) })
        })
        .await?;
        Ok(())
    }

    /// The NAT subnet (ID, name), its network policies disabled (the config's subnet is
    /// switched; one an annotation names must already be).
    async fn nat_subnet(&self, want: &Want) -> Result<(String, String), ProviderError> {
        let (name, named_by) = match &want.subnet {
            Some((n, key)) => (n.clone(), Some(*key)),
            None => (
                self.config.subnet_name.clone().filter(|s| !s.is_empty()).ok_or_else(|| {
                    invalid("subnetName", "a private link service needs subnetName in the cloud config or the azure-pls-ip-configuration-subnet annotation")
                })?,
                None,
            ),
        };
        let vnet = self.config.vnet_name.clone().filter(|s| !s.is_empty()).ok_or_else(|| {
            invalid("vnetName", "a private link service needs vnetName in the cloud config")
        })?;
        let id = format!(
            "{}/subnets/{name}",
            self.client.resource_id(
                self.config.vnet_resource_group(),
                "Microsoft.Network/virtualNetworks",
                &vnet
            )?
        );
        let policies = |s: &Subnet| {
            s.properties
                .extra
                .get("privateLinkServiceNetworkPolicies")
                .and_then(|v| v.as_str())
                .map(str::to_string)
        };
        let subnet: Option<Subnet> = self.client.get_opt(SUBNET_OPS.get, &id, NETWORK, &[]).await?;
        let Some(mut subnet) = subnet else {
            return Err(ProviderError::other(format!(
                "private link service subnet {name} of virtual network {vnet} does not exist"
            )));
        };
        if !policies(&subnet).is_some_and(|p| p.eq_ignore_ascii_case("Disabled")) {
            if let Some(key) = named_by {
                return Err(invalid(
                    key,
                    format!(
                        "subnet {name} has privateLinkServiceNetworkPolicies enabled; a subnet a Service names is not changed: set it to Disabled"
                    ),
                ));
            }
            info!(subnet = %name, "disabling privateLinkServiceNetworkPolicies for a private link service (as upstream)");
            subnet
                .properties
                .extra
                .insert("privateLinkServiceNetworkPolicies".into(), "Disabled".into());
            let etag = subnet.etag.clone();
            subnet =
                self.client.put(SUBNET_OPS.put, &id, NETWORK, &subnet, etag.as_deref()).await?;
        }
        let out = Some(subnet);
        let id = out.and_then(|s| s.id).unwrap_or(id);
        Ok((id, name))
    }

    /// Deletes the PLS of each frontend of `fe_ids` that this cluster made (for the
    /// Service `service_key` only when `own_only`: a frontend that stays keeps another
    /// Service's PLS). Another's PLS on a frontend about to go is an error: ARM would refuse
    /// the frontend's removal, and the cluster never deletes what it did not make.
    pub async fn release(
        &self,
        cluster: &str,
        service: &Service,
        service_key: &str,
        fe_ids: &[String],
        own_only: bool,
    ) -> Result<(), ProviderError> {
        if fe_ids.is_empty() {
            return Ok(());
        }
        for rg in self.groups(service) {
            for pls in self.list(&rg).await? {
                let Some(fe) = fe_ids.iter().find(|id| serves(&pls, id)) else { continue };
                let owner = pls.tag(OWNER_SERVICE_TAG).unwrap_or_default().trim().to_string();
                if !made_by(&pls, cluster) {
                    if own_only {
                        continue;
                    }
                    return Err(ProviderError::other(format!(
                        "frontend {} is used by private link service {} that this cluster did not make: it is not deleted, so the frontend stays (remove the private link service first)",
                        naming::last_segment(fe),
                        pls.name()
                    )));
                }
                if own_only && !owner.eq_ignore_ascii_case(service_key) {
                    continue;
                }
                let connections = pls
                    .properties
                    .extra
                    .get("privateEndpointConnections")
                    .and_then(|v| v.as_array())
                    .map_or(0, Vec::len);
                if connections > 0 {
                    warn!(
                        private_link_service = pls.name(),
                        connections,
                        "deleting a private link service with private endpoint connections"
                    );
                }
                self.client.delete(PLS_OPS.delete, pls.id(), NETWORK).await?;
                info!(
                    private_link_service = pls.name(),
                    service = service_key,
                    "deleted the Service's private link service"
                );
            }
        }
        Ok(())
    }
}

/// Makes `pls` what the Service wants (upstream's `getExpectedPrivateLinkService`): its
/// frontend, NAT IP configurations, proxy protocol, FQDNs, visibility, auto-approval, tags.
/// Returns whether it changed.
fn expected(
    pls: &mut PrivateLinkService,
    want: &Want,
    subnet: &(String, String),
    fe_id: &str,
    cluster: &str,
    service_key: &str,
    config_tags: &BTreeMap<String, String>,
) -> bool {
    let mut changed = false;
    let p = &mut pls.properties;
    if p.frontends.is_empty() {
        p.frontends = vec![Ref::to(fe_id)];
        changed = true;
    }
    changed |= ip_configurations(p, want, subnet, pls.name.as_deref().unwrap_or_default());
    if p.enable_proxy_protocol.unwrap_or(false) != want.proxy_protocol {
        p.enable_proxy_protocol = Some(want.proxy_protocol);
        changed = true;
    }
    let same = |a: &[String], b: &[String]| {
        let mut x: Vec<String> = a.iter().map(|s| s.to_ascii_lowercase()).collect();
        let mut y: Vec<String> = b.iter().map(|s| s.to_ascii_lowercase()).collect();
        x.sort();
        y.sort();
        x == y
    };
    if !same(p.fqdns.as_deref().unwrap_or_default(), &want.fqdns) {
        p.fqdns = Some(want.fqdns.clone());
        changed = true;
    }
    let subs =
        |s: &Option<Subscriptions>| s.as_ref().map(|s| s.subscriptions.clone()).unwrap_or_default();
    if !same(&subs(&p.visibility), &want.visibility)
        || !same(&subs(&p.auto_approval), &want.auto_approval)
    {
        p.visibility =
            Some(Subscriptions { subscriptions: want.visibility.clone(), ..Default::default() });
        p.auto_approval =
            Some(Subscriptions { subscriptions: want.auto_approval.clone(), ..Default::default() });
        changed = true;
    }
    let tags = pls.tags.get_or_insert_with(BTreeMap::new);
    let mut wanted = config_tags.clone();
    if !tags.contains_key(CLUSTER_TAG) {
        wanted.insert(CLUSTER_TAG.into(), cluster.to_string());
    }
    if !tags.contains_key(OWNER_SERVICE_TAG) {
        wanted.insert(OWNER_SERVICE_TAG.into(), service_key.to_string());
    }
    changed |= super::public_ip::merge_tags(tags, &wanted);
    changed
}

/// The NAT IP configurations as upstream's `reconcilePLSIpConfigs`: when the count, subnet,
/// static addresses or primary differ, all are rebuilt — the static ones first
/// (`<subnet>-<pls>-static-<ip>`, the first primary), then dynamic ones
/// (`<subnet>-<pls>-dynamic-<n>`; the first primary when no static one).
fn ip_configurations(
    p: &mut PlsProperties,
    want: &Want,
    (subnet_id, subnet_name): &(String, String),
    pls_name: &str,
) -> bool {
    let primary = want.static_ips.first().map(|ip| ip.to_string());
    let statics: Vec<String> = want.static_ips.iter().map(|ip| ip.to_string()).collect();
    let have = &p.ip_configurations;
    let mut changed = have.len() != want.count;
    let mut have_static = 0;
    for c in have {
        let primary_config = c.properties.primary == Some(true);
        let q = &c.properties.address;
        if !q.subnet.as_ref().is_some_and(|s| s.is(subnet_id)) {
            changed = true;
        }
        let is_static = q
            .private_ip_allocation_method
            .as_deref()
            .is_some_and(|m| m.eq_ignore_ascii_case("Static"));
        if is_static {
            have_static += 1;
            if !q.private_ip_address.as_ref().is_some_and(|a| statics.contains(a)) {
                changed = true;
            }
        }
        if primary_config {
            let ok = if is_static { q.private_ip_address == primary } else { primary.is_none() };
            changed |= !ok;
        }
    }
    changed |= have_static != statics.len();
    if !changed {
        return false;
    }
    let config_name = |suffix: String| {
        let max = IP_CONFIG_NAME_MAX.saturating_sub(suffix.len());
        let prefix: String = format!("{subnet_name}-{pls_name}").chars().take(max).collect();
        prefix + &suffix
    };
    let one = |name: String, ip: Option<String>, primary: bool| SubResource {
        name: Some(name),
        properties: IpConfigProperties {
            address: FrontendIpProperties {
                private_ip_allocation_method: Some(
                    if ip.is_some() { "Static" } else { "Dynamic" }.into(),
                ),
                private_ip_address: ip,
                private_ip_address_version: Some("IPv4".into()),
                subnet: Some(Ref::to(subnet_id.clone())),
                ..Default::default()
            },
            primary: Some(primary),
        },
        ..Default::default()
    };
    let mut out = Vec::new();
    for (i, ip) in statics.iter().enumerate() {
        out.push(one(config_name(format!("-static-{ip}")), Some(ip.clone()), i == 0));
    }
    for i in 0..want.count.saturating_sub(statics.len()) {
        out.push(one(config_name(format!("-dynamic-{i}")), None, statics.is_empty() && i == 0));
    }
    p.ip_configurations = out;
    true
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::api::ObjectMeta;

    fn svc(a: &[(&str, &str)]) -> Service {
        Service {
            metadata: ObjectMeta {
                annotations: Some(a.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    fn err_what(r: Result<Want, ProviderError>) -> String {
        match r {
            Err(ProviderError::Invalid { what, .. }) => what,
            other => panic!("expected an invalid-input error, got {other:?}"),
        }
    }

    #[test]
    fn bad_values_name_their_annotation() {
        assert_eq!(err_what(parse(&svc(&[(CREATE, "yes")]))), CREATE);
        assert_eq!(
            err_what(parse(&svc(&[(IP_CONFIGURATION_IP_ADDRESS_COUNT, "9")]))),
            IP_CONFIGURATION_IP_ADDRESS_COUNT
        );
        assert_eq!(
            err_what(parse(&svc(&[(IP_CONFIGURATION_IP_ADDRESS_COUNT, "0")]))),
            IP_CONFIGURATION_IP_ADDRESS_COUNT
        );
        assert_eq!(
            err_what(parse(&svc(&[(IP_CONFIGURATION_IP_ADDRESS, "fd00::1")]))),
            IP_CONFIGURATION_IP_ADDRESS
        );
        assert_eq!(
            err_what(parse(&svc(&[(IP_CONFIGURATION_IP_ADDRESS, "10.0.0.1 10.0.0.2")]))),
            IP_CONFIGURATION_IP_ADDRESS
        );
        assert_eq!(err_what(parse(&svc(&[(VISIBILITY, "not-a-sub")]))), VISIBILITY);
        assert_eq!(err_what(parse(&svc(&[(AUTO_APPROVAL, "*")]))), AUTO_APPROVAL);
        assert_eq!(err_what(parse(&svc(&[(NAME, "a/b")]))), NAME);
        assert_eq!(err_what(parse(&svc(&[(PROXY_PROTOCOL, "1")]))), PROXY_PROTOCOL);
    }

    #[test]
    fn values_as_upstream_reads_them() {
        let w = parse(&svc(&[
            (CREATE, "True"),
            (IP_CONFIGURATION_IP_ADDRESS_COUNT, "3"),
            (IP_CONFIGURATION_IP_ADDRESS, " 10.0.0.9  10.0.0.8 "),
            (VISIBILITY, "8ecadfc9-0000-0000-0000-00000000abcd *"),
            (FQDNS, "a.example b.example"),
        ]))
        .unwrap();
        assert!(w.create && w.additional);
        assert_eq!(w.count, 3);
        assert_eq!(w.static_ips, vec![Ipv4Addr::new(10, 0, 0, 9), Ipv4Addr::new(10, 0, 0, 8)]);
        assert_eq!(w.visibility, vec!["*"]);
        assert_eq!(w.fqdns, vec!["a.example", "b.example"]);
        let plain = parse(&svc(&[(CREATE, "true")])).unwrap();
        assert!(!plain.additional);
        assert_eq!(plain.count, 1);
    }

    #[test]
    fn nat_ip_configurations_static_first_then_dynamic() {
        let w = parse(&svc(&[
            (CREATE, "true"),
            (IP_CONFIGURATION_IP_ADDRESS_COUNT, "3"),
            (IP_CONFIGURATION_IP_ADDRESS, "10.0.0.9"),
        ]))
        .unwrap();
        let sn = ("/s/subnets/sn".to_string(), "sn".to_string());
        let mut p = PlsProperties::default();
        assert!(ip_configurations(&mut p, &w, &sn, "pls-x"));
        let names: Vec<&str> = p.ip_configurations.iter().map(|c| c.name()).collect();
        assert_eq!(names, ["sn-pls-x-static-10.0.0.9", "sn-pls-x-dynamic-0", "sn-pls-x-dynamic-1"]);
        let primaries: Vec<bool> =
            p.ip_configurations.iter().map(|c| c.properties.primary == Some(true)).collect();
        assert_eq!(primaries, [true, false, false]);
        // The same again: nothing changes.
        assert!(!ip_configurations(&mut p, &w, &sn, "pls-x"));
        // A long subnet and name: cut so the name stays within ARM's 80 characters.
        let long = ("/s".to_string(), "s".repeat(70));
        let mut q = PlsProperties::default();
        ip_configurations(&mut q, &w, &long, "pls-x");
        assert!(q.ip_configurations.iter().all(|c| c.name().len() <= IP_CONFIG_NAME_MAX));
    }
}
