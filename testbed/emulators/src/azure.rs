//! Azure emulator: Azure Resource Manager (`management.azure.com` shape) for the resources the
//! Azure provider calls, the AAD token endpoint and the instance metadata service (IMDS), with
//! ARM's paths, status codes, long-running operations, ETags, paging and error bodies, so the
//! official `azure-sdk-for-go` `armcompute`/`armnetwork`/`azidentity` modules parse every reply
//! (`ci/fidelity/run azure` checks that). Serve it over HTTPS ([`crate::server::ServerOptions`]
//! `tls: true`): Azure SDKs refuse bearer tokens over plain HTTP.
//!
//! | call | operation (faults and counters key on it) |
//! |---|---|
//! | `POST /{tenant}/oauth2/v2.0/token` (client credentials: secret or `client_assertion`) | `aad.token` |
//! | `GET /{tenant}/v2.0/.well-known/openid-configuration` | `aad.openid_configuration` |
//! | `GET /common/discovery/instance?api-version=1.1&authorization_endpoint=…` | `aad.instance_discovery` |
//! | `GET /metadata/endpoints?api-version=…` (no token) | `arm.metadata_endpoints` |
//! | any host: `GET /v2/` (a container registry's AAD challenge: 401, `WWW-Authenticate: Bearer realm="https://<Host>/oauth2/token",service="<Host>"`) | `acr.challenge` |
//! | any host: `POST /oauth2/exchange` (an issued, unexpired AAD token for `https://containerregistry.azure.net` → an ACR `refresh_token`) | `acr.exchange` |
//! | `GET /metadata/instance`, `/metadata/loadbalancer` (`Metadata: true`) | `imds.instance`, `imds.loadbalancer` |
//! | `GET /metadata/identity/oauth2/token` (`Metadata: true`) | `imds.token` |
//! | `…/providers/{ns}/locations/{loc}/operations/{id}` | `arm.operations.get` |
//! | `…/providers/{ns}/locations/{loc}/operationResults/{id}` | `arm.operation_results.get` |
//! | `…/Microsoft.Compute/virtualMachines[/{vm}[/instanceView]]` | `compute.virtual_machines.{list,list_all,get,instance_view}` |
//! | `…/Microsoft.Compute/virtualMachineScaleSets[/{ss}]` | `compute.virtual_machine_scale_sets.{list,list_all,get,create_or_update}` |
//! | `…/virtualMachineScaleSets/{ss}/virtualMachines[/{id}[/instanceView]]` | `compute.virtual_machine_scale_set_vms.{list,get,update,instance_view}` |
//! | `…/virtualMachineScaleSets/{ss}[/virtualMachines/{id}]/networkInterfaces[/{nic}]` (uniform scale sets' NICs) | `network.network_interfaces.{list_virtual_machine_scale_set_network_interfaces,list_virtual_machine_scale_set_vm_network_interfaces,get_virtual_machine_scale_set_network_interface}` |
//! | `…/Microsoft.Network/{loadBalancers,publicIPAddresses,networkSecurityGroups,routeTables,networkInterfaces}[/{name}]` | `network.<type>.{list,list_all,get,create_or_update,delete}` |
//! | `…/Microsoft.Network/virtualNetworks/{vnet}[/subnets/{name}]` | `network.virtual_networks.get`, `network.subnets.{list,get,create_or_update}` |
//! | `…/Microsoft.Network/privateLinkServices[/{name}]` (lists: resource group or subscription) | `network.private_link_services.{list,list_all,get,create_or_update,delete}` (ARM's rules: [`pls`]) |
//! | `GET /subscriptions/{sub}/providers/{ns}` (the region's zones: `Microsoft.Compute`'s `virtualMachines` `zoneMappings`, the world's numeric zones) | `resources.providers.get` |
//!
//! Rules enforced as ARM does: every ARM call needs `api-version` (400
//! `MissingApiVersionParameter`) and a bearer token this emulator issued (401
//! `AuthenticationFailed` with `WWW-Authenticate`); `PUT` creates (201) or replaces (200) a
//! whole Network resource, while Compute's `PUT` of a scale set or scale-set VM keeps what the
//! body omits and ignores read-only properties (`provisioningState`, `instanceView`, `vmId`,
//! `instanceId`, …) as Compute does; a `PUT` answers with `provisioningState: Updating` and an
//! `Azure-AsyncOperation` header, and the resource reads `Succeeded` once the operation is done
//! (`DELETE` answers 202 with `Azure-AsyncOperation` and `Location`, the resource reads
//! `Deleting` until then); a second `PUT` of a Network resource while the first runs cancels
//! the first (its operation ends `Canceled`, `CanceledAndSupersededDueToAnotherOperation`) and
//! proceeds, any other change while an operation on the resource runs is a 409
//! `AnotherOperationInProgress`; `If-Match` with a stale ETag is a 412 `PreconditionFailed`;
//! lists page through `nextLink` (`$skiptoken`); references are checked (a load-balancing rule
//! naming a missing probe, frontend or backend pool, a NIC naming a missing backend pool, a
//! frontend naming a missing public IP or subnet: 400 `InvalidResourceReference`); a public IP
//! in use cannot be deleted (400 `PublicIPAddressCannotBeDeleted`), nor a backend pool a NIC or
//! scale-set VM still references (400 `InUseBackendAddressPoolCannotBeDeleted`); NSG rule
//! priorities are 100–4096 and unique per direction (400 `SecurityRuleInvalidPriority`,
//! `SecurityRuleConflict`); a load balancer's or public IP's `sku` without a `tier` reads
//! `tier: Regional`. Load balancers and public IPs follow ARM's cross-resource rules (each
//! code and its source: docs/emulators.md, Azure): a frontend's public IP must be `Succeeded`
//! (`ReferencedResourceNotProvisioned`), of the load balancer's SKU (`PublicIPAndLBSkuDoNotMatch`)
//! and location (`InvalidResourceReference`), on one frontend only
//! (`PublicIPReferencedByMultipleIPConfigs`); a load balancer is public or internal; static
//! private IPs lie in their subnet (`PrivateIPAddressNotInSubnet`) and are free
//! (`PrivateIPAddressIsAllocated`); `zones` need the Standard SKU and never change
//! (`ResourceAvailabilityZonesCannotBeModified`); rules do not collide on a frontend port or a
//! backend port and pool (`RulesUseSameBackendPortProtocolAndPool`), HA ports are internal only,
//! idle timeouts and probe intervals are in ARM's ranges; an `api-version` not of ARM's form is
//! `InvalidApiVersionParameter`, one the resource provider does not serve
//! `NoRegisteredProviderFound`. Long-running operations come in groups (public IPs, load
//! balancers, other Network resources, Compute), each with its `realistic` timing; an operation
//! the kit fails (`operation-failures`) ends `Failed` and leaves its resource `Failed` (a
//! `PUT` that creates is the action `create`, one that replaces `update`). Read-only back-references (`backendIPConfigurations`, a public IP's
//! `ipConfiguration`) are computed on every read. Unknown fields a client sends are kept and
//! returned unchanged.
//!
//! Discovery, as upstream's CCM does it before building any client: `GET
//! /metadata/endpoints?api-version=2019-05-01` (no token) answers ARM's JSON array of cloud
//! environments, one per [`ARM_CLOUD_NAMES`] entry, each with this emulator as
//! `resourceManager` and `authentication.loginEndpoint` and the management `audiences`;
//! `GET /common/discovery/instance` (MSAL's AAD instance discovery, whatever `Host` it is
//! addressed to) answers `tenant_discovery_endpoint` and `metadata` for an authority on this
//! emulator or one of Microsoft's AAD hosts, AAD's 400 `invalid_instance` (AADSTS50049) for any
//! other.
//! Errors: `{"error":{"code","message"}}`.
//!
//! Network elsewhere ([`AzureOptions::network`], upstream's `networkResourceSubscriptionID` /
//! `networkResourceTenantID`): the world's virtual networks, subnets and security group live
//! in a second subscription (same resource group name), AAD issues tokens of its tenant too,
//! and ARM enforces its cross-tenant rules: a call to a subscription with a token of another
//! tenant is 401 `InvalidAuthenticationTokenTenant`; a `PUT` linking a resource of a
//! subscription in another tenant (a NIC joining the other subscription's pool or subnet)
//! without a token of that tenant in `x-ms-authorization-auxiliary` is 403
//! `LinkedAuthorizationFailed` (read-only back-references are not links).
//! [`AzureCloud::calls_to_subscription`] counts the ARM calls each subscription got.
//!
//! World mapping: instances are VMs in resource group [`AzureOptions::resource_group`]
//! (`Standard_D2s_v3` unless `type`), each with a NIC `<vm>-nic` (private IPs, IPv4 and IPv6)
//! and, for public IPs, a public IP `<vm>-pip`. An instance tagged `azure.vmss: <set>` is an
//! instance of the uniform scale set `<set>` instead, its computer name the instance's name: a
//! name of Azure's form, `<set>` and 6 base-36 digits (`pool000000`, `pool00000a`; see
//! [`vmss_computer_name`]), is the instance ID it encodes (0, 10); any other name (the
//! shorthand `pool-0`, which Azure never makes) takes the lowest free ID from the number of
//! instances so far. The VMSS VM's own name is `<set>_<id>`. An instance tagged
//! `azure.vmss-flex: <set>` is a VM of the flexible scale set `<set>` (made `Flexible` with
//! its first instance, a model with one NIC configuration `<set>-nic`): a standalone VM with
//! its NIC `<vm>-nic`, its `virtualMachineScaleSet` naming the set, as ARM shows flexible
//! orchestration. A scale-set instance added later (either mode) starts in the backend pools
//! its scale set's model lists, as Compute builds it from the latest model. A numeric
//! `zone` (`1`) is an availability zone; any other zone means "no zones", and the fault domain
//! is the tag `azure.fault-domain` (default 0). Power: running, stopped (`PowerState/stopped`)
//! and terminated (`PowerState/deallocated`). `networks` are virtual networks (one
//! [`AzureOptions::vnet`] when none), `subnets` their subnets. The cluster's network security
//! group [`AzureOptions::security_group`] exists from the start; route tables do not.

// Handlers return the ARM error reply itself as their error.
#![allow(clippy::result_large_err)]

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http::{HeaderValue, Method, Request, Response, StatusCode, header};
use serde_json::{Map, Value, json};

use crate::asyncop::{Action, AsyncOps, Operation, Phase, Timing, arm_operation_status};
use crate::server::{Body, Cloud, ErrorKind, ErrorReply, ServeFuture, full};
use crate::world::{Instance, PowerState, World};

#[path = "azure_aad_cert.rs"]
mod aad_cert;
#[path = "azure_pls.rs"]
mod pls;

/// The client secret [`AzureOptions::default`] accepts.
pub const DEFAULT_CLIENT_SECRET: &str = "azure-emulator-secret";
/// The client id [`AzureOptions::default`] accepts.
pub const DEFAULT_CLIENT_ID: &str = "00000000-0000-0000-0000-0000000c1e47";

/// How the emulator is set up beyond its world.
#[derive(Debug, Clone)]
pub struct AzureOptions {
    /// The tenant id.
    pub tenant_id: String,
    /// The subscription id.
    pub subscription_id: String,
    /// The resource group of the world's resources.
    pub resource_group: String,
    /// The location (default: the world's region, else `eastus`).
    pub location: Option<String>,
    /// Service principals: client id → secret (client credentials).
    pub clients: BTreeMap<String, String>,
    /// The virtual network made when the world has no `networks`.
    pub vnet: String,
    /// The cluster's network security group (exists from the start).
    pub security_group: String,
    /// How long long-running operations stay `InProgress`.
    pub lro: Duration,
    /// How many items a list page holds.
    pub page_size: usize,
    /// How long issued tokens live.
    pub token_lifetime: Duration,
    /// A second subscription holding the world's network (virtual networks, subnets, the
    /// security group) and every network resource clients create there, in its own AAD
    /// tenant (or the same): upstream's `networkResourceSubscriptionID`/`TenantID`.
    pub network: Option<NetworkSubscription>,
}

/// The network subscription of [`AzureOptions::network`] and its tenant. AAD issues tokens
/// of either tenant (same client ids and secrets); a call to a subscription needs a token
/// of its tenant (401 `InvalidAuthenticationTokenTenant`), and a write referencing a
/// resource of a subscription in another tenant needs that tenant's token in
/// `x-ms-authorization-auxiliary` (403 `LinkedAuthorizationFailed`), as ARM's cross-tenant
/// rules.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetworkSubscription {
    /// The subscription id.
    pub subscription_id: String,
    /// Its tenant id (may be [`AzureOptions::tenant_id`]).
    pub tenant_id: String,
}

impl Default for AzureOptions {
    fn default() -> Self {
        AzureOptions {
            tenant_id: "72f988bf-0000-0000-0000-00000000e0a1".into(),
            subscription_id: "8ecadfc9-0000-0000-0000-00000000abcd".into(),
            resource_group: "rg".into(),
            location: None,
            clients: BTreeMap::from([(DEFAULT_CLIENT_ID.into(), DEFAULT_CLIENT_SECRET.into())]),
            vnet: "vnet".into(),
            security_group: "k8s-nsg".into(),
            lro: Duration::from_millis(500),
            page_size: 50,
            token_lifetime: Duration::from_secs(3600),
            network: None,
        }
    }
}

type Resp = Response<Body>;
type Res<T> = Result<T, Resp>;

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn now_secs() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3))
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A UUID-shaped id derived from `seed`.
fn uuid(seed: &str) -> String {
    let a = splitmix(fnv(seed));
    let b = splitmix(a ^ 0x5555);
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        b >> 52,
        b & 0xffff_ffff_ffff
    )
}

fn b64url(data: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";
    let mut out = String::with_capacity(data.len() * 4 / 3 + 3);
    for chunk in data.chunks(3) {
        let b = [chunk[0], *chunk.get(1).unwrap_or(&0), *chunk.get(2).unwrap_or(&0)];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for i in 0..chunk.len() + 1 {
            out.push(A[((n >> (18 - 6 * i)) & 63) as usize] as char);
        }
    }
    out
}

/// The ARM error body.
pub fn error_body(code: &str, message: &str) -> Value {
    json!({ "error": { "code": code, "message": message } })
}

fn reply(status: StatusCode, v: &Value) -> Resp {
    let mut r = Response::new(full(v.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/json"));
    r
}

fn err(status: StatusCode, code: &str, message: impl AsRef<str>) -> Resp {
    reply(status, &error_body(code, message.as_ref()))
}

fn bad(code: &str, message: impl AsRef<str>) -> Resp {
    err(StatusCode::BAD_REQUEST, code, message)
}

fn empty(status: StatusCode) -> Resp {
    let mut r = Response::new(full(Bytes::new()));
    *r.status_mut() = status;
    r
}

fn query(req: &Request<Bytes>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(req.uri().query().unwrap_or_default().as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn q<'a>(qs: &'a [(String, String)], key: &str) -> Option<&'a str> {
    qs.iter().find(|(k, _)| k.eq_ignore_ascii_case(key)).map(|(_, v)| v.as_str())
}

/// The kinds of ARM resources the emulator keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Kind {
    Vm,
    Vmss,
    VmssVm,
    Lb,
    Pip,
    Nsg,
    RouteTable,
    Nic,
    Vnet,
    Subnet,
    /// Private link services (rules in [`pls`]).
    Pls,
}

impl Kind {
    fn arm_type(self) -> &'static str {
        match self {
            Kind::Vm => "Microsoft.Compute/virtualMachines",
            Kind::Vmss => "Microsoft.Compute/virtualMachineScaleSets",
            Kind::VmssVm => "Microsoft.Compute/virtualMachineScaleSets/virtualMachines",
            Kind::Lb => "Microsoft.Network/loadBalancers",
            Kind::Pip => "Microsoft.Network/publicIPAddresses",
            Kind::Nsg => "Microsoft.Network/networkSecurityGroups",
            Kind::RouteTable => "Microsoft.Network/routeTables",
            Kind::Nic => "Microsoft.Network/networkInterfaces",
            Kind::Vnet => "Microsoft.Network/virtualNetworks",
            Kind::Subnet => "Microsoft.Network/virtualNetworks/subnets",
            Kind::Pls => "Microsoft.Network/privateLinkServices",
        }
    }

    fn op_name(self) -> &'static str {
        match self {
            Kind::Vm => "compute.virtual_machines",
            Kind::Vmss => "compute.virtual_machine_scale_sets",
            Kind::VmssVm => "compute.virtual_machine_scale_set_vms",
            Kind::Lb => "network.load_balancers",
            Kind::Pip => "network.public_ip_addresses",
            Kind::Nsg => "network.network_security_groups",
            Kind::RouteTable => "network.route_tables",
            Kind::Nic => "network.network_interfaces",
            Kind::Vnet => "network.virtual_networks",
            Kind::Subnet => "network.subnets",
            Kind::Pls => "network.private_link_services",
        }
    }

    fn namespace(self) -> &'static str {
        match self {
            Kind::Vm | Kind::Vmss | Kind::VmssVm => "Microsoft.Compute",
            _ => "Microsoft.Network",
        }
    }

    fn top(ns: &str, ty: &str) -> Option<Kind> {
        let ns = ns.to_ascii_lowercase();
        let ty = ty.to_ascii_lowercase();
        Some(match (ns.as_str(), ty.as_str()) {
            ("microsoft.compute", "virtualmachines") => Kind::Vm,
            ("microsoft.compute", "virtualmachinescalesets") => Kind::Vmss,
            ("microsoft.network", "loadbalancers") => Kind::Lb,
            ("microsoft.network", "publicipaddresses") => Kind::Pip,
            ("microsoft.network", "networksecuritygroups") => Kind::Nsg,
            ("microsoft.network", "routetables") => Kind::RouteTable,
            ("microsoft.network", "networkinterfaces") => Kind::Nic,
            ("microsoft.network", "virtualnetworks") => Kind::Vnet,
            ("microsoft.network", "privatelinkservices") => Kind::Pls,
            _ => return None,
        })
    }

    /// Whether PUT/DELETE are served (the world's compute and vnets are read-only, apart from
    /// scale sets and their VMs, which take model updates).
    fn writable(self) -> bool {
        !matches!(self, Kind::Vm | Kind::Vnet)
    }
}

/// What a call addresses.
#[derive(Debug, Clone)]
enum Target {
    AadToken,
    AadOpenId,
    /// AAD instance discovery (`/common/discovery/instance`, as MSAL calls it).
    AadInstanceDiscovery,
    /// ARM's cloud environments (`/metadata/endpoints`).
    ArmMetadata,
    /// A container registry's `GET /v2/` (the AAD challenge).
    AcrChallenge,
    /// A container registry's `POST /oauth2/exchange`.
    AcrExchange,
    ImdsInstance,
    ImdsLoadBalancer,
    ImdsToken,
    /// The emulator's own Azure switches (`POST /__azure/<switch>?on=true|false`).
    AzureSwitch(String),
    Operation {
        id: String,
        result: bool,
    },
    /// A list: in a resource group (Some) or the subscription; `parent` for child lists.
    List {
        kind: Kind,
        rg: Option<String>,
        parent: Option<String>,
    },
    /// One resource by id (canonical case as requested).
    One {
        kind: Kind,
        id: String,
        instance_view: bool,
    },
    /// A resource provider's registration (`GET /subscriptions/{sub}/providers/{ns}`): its
    /// resource types, with `Microsoft.Compute`'s `virtualMachines` zone mappings (the
    /// region's availability zones, as upstream reads them).
    ResourceProvider(String),
    /// A uniform scale set's NICs: all of the set's (`vm: None`), one VM's, or one NIC.
    VmssNics {
        /// The scale set's ARM ID.
        set: String,
        /// The VM's instance ID.
        vm: Option<String>,
        /// The NIC name.
        nic: Option<String>,
    },
    Unknown,
}

fn parse_target(method: &Method, path: &str) -> Target {
    let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
    let lower: Vec<String> = segs.iter().map(|s| s.to_ascii_lowercase()).collect();
    let l: Vec<&str> = lower.iter().map(String::as_str).collect();
    match l.as_slice() {
        [_, "oauth2", "v2.0", "token"] | [_, "oauth2", "token"] if method == Method::POST => {
            return Target::AadToken;
        }
        [_, "v2.0", ".well-known", "openid-configuration"] => return Target::AadOpenId,
        [_, "discovery", "instance"] if method == Method::GET => {
            return Target::AadInstanceDiscovery;
        }
        ["metadata", "endpoints"] if method == Method::GET => return Target::ArmMetadata,
        ["v2"] if method == Method::GET => return Target::AcrChallenge,
        ["oauth2", "exchange"] if method == Method::POST => return Target::AcrExchange,
        ["metadata", "instance", ..] => return Target::ImdsInstance,
        ["metadata", "loadbalancer"] => return Target::ImdsLoadBalancer,
        ["metadata", "identity", "oauth2", "token"] => return Target::ImdsToken,
        ["__azure", switch] if method == Method::POST => {
            return Target::AzureSwitch(switch.to_string());
        }
        ["subscriptions", _, "providers", _, "locations", _, "operations", _] => {
            return Target::Operation { id: segs[7].to_string(), result: false };
        }
        ["subscriptions", _, "providers", _, "locations", _, "operationresults", _] => {
            return Target::Operation { id: segs[7].to_string(), result: true };
        }
        ["subscriptions", _, "providers", _] if method == Method::GET => {
            return Target::ResourceProvider(segs[3].to_string());
        }
        ["subscriptions", _, "providers", ns, ty] => {
            if let Some(kind) = Kind::top(ns, ty) {
                return Target::List { kind, rg: None, parent: None };
            }
        }
        ["subscriptions", _, "resourcegroups", _, "providers", ns, ty, rest @ ..] => {
            let Some(kind) = Kind::top(ns, ty) else { return Target::Unknown };
            let rg = segs[3].to_string();
            let base = |n: usize| format!("/{}", segs[..n].join("/"));
            return match (kind, rest) {
                (_, []) => Target::List { kind, rg: Some(rg), parent: None },
                (_, [_]) => Target::One { kind, id: base(8), instance_view: false },
                (Kind::Vm, [_, "instanceview"]) => {
                    Target::One { kind, id: base(8), instance_view: true }
                }
                (Kind::Vmss, [_, "virtualmachines"]) => {
                    Target::List { kind: Kind::VmssVm, rg: Some(rg), parent: Some(base(8)) }
                }
                (Kind::Vmss, [_, "virtualmachines", _]) => {
                    Target::One { kind: Kind::VmssVm, id: base(10), instance_view: false }
                }
                (Kind::Vmss, [_, "virtualmachines", _, "instanceview"]) => {
                    Target::One { kind: Kind::VmssVm, id: base(10), instance_view: true }
                }
                (Kind::Vmss, [_, "networkinterfaces"]) => {
                    Target::VmssNics { set: base(8), vm: None, nic: None }
                }
                (Kind::Vmss, [_, "virtualmachines", _, "networkinterfaces", nic @ ..])
                    if nic.len() <= 1 =>
                {
                    Target::VmssNics {
                        set: base(8),
                        vm: Some(segs[9].to_string()),
                        nic: nic.first().map(|_| segs[11].to_string()),
                    }
                }
                (Kind::Vnet, [_, "subnets"]) => {
                    Target::List { kind: Kind::Subnet, rg: Some(rg), parent: Some(base(8)) }
                }
                (Kind::Vnet, [_, "subnets", _]) => {
                    Target::One { kind: Kind::Subnet, id: base(10), instance_view: false }
                }
                _ => Target::Unknown,
            };
        }
        _ => {}
    }
    Target::Unknown
}

fn operation_name(method: &Method, t: &Target) -> String {
    match t {
        Target::AadToken => "aad.token".into(),
        Target::AadOpenId => "aad.openid_configuration".into(),
        Target::AadInstanceDiscovery => "aad.instance_discovery".into(),
        Target::ArmMetadata => "arm.metadata_endpoints".into(),
        Target::AcrChallenge => "acr.challenge".into(),
        Target::AcrExchange => "acr.exchange".into(),
        Target::ImdsInstance => "imds.instance".into(),
        Target::ImdsLoadBalancer => "imds.loadbalancer".into(),
        Target::ImdsToken => "imds.token".into(),
        Target::AzureSwitch(_) => "emulator.azure_switch".into(),
        Target::ResourceProvider(_) => "resources.providers.get".into(),
        Target::Operation { result: false, .. } => "arm.operations.get".into(),
        Target::Operation { result: true, .. } => "arm.operation_results.get".into(),
        Target::List { kind, rg, .. } => {
            let suffix = if rg.is_none() { "list_all" } else { "list" };
            format!("{}.{suffix}", kind.op_name())
        }
        Target::One { kind, instance_view: true, .. } => {
            format!("{}.instance_view", kind.op_name())
        }
        Target::One { kind, .. } => {
            let verb = match *method {
                Method::GET => "get",
                Method::PUT if *kind == Kind::VmssVm => "update",
                Method::PUT => "create_or_update",
                Method::PATCH => "update",
                Method::DELETE => "delete",
                _ => "unsupported",
            };
            format!("{}.{verb}", kind.op_name())
        }
        Target::VmssNics { vm: None, .. } => {
            "network.network_interfaces.list_virtual_machine_scale_set_network_interfaces".into()
        }
        Target::VmssNics { nic: None, .. } => {
            "network.network_interfaces.list_virtual_machine_scale_set_vm_network_interfaces".into()
        }
        Target::VmssNics { .. } => {
            "network.network_interfaces.get_virtual_machine_scale_set_network_interface".into()
        }
        Target::Unknown => "arm.unknown".into(),
    }
}

/// The groups of ARM resources whose long-running operations take alike times (each its own
/// [`AsyncOps`], so each registers its own `realistic` table).
const OP_GROUPS: [&str; 4] = ["pip", "lb", "net", "compute"];

/// ARM's long-running operations, per group ([`OP_GROUPS`]); an operation's ID is
/// `<group>.<op-n>`.
#[derive(Debug)]
struct Ops {
    groups: [AsyncOps; 4],
}

impl Ops {
    fn new(fast: Duration) -> Ops {
        let ops = Ops { groups: std::array::from_fn(|_| AsyncOps::new(fast)) };
        for (g, t) in OP_GROUPS.iter().zip(ops.groups.iter()) {
            t.set_realistic(realistic_timing(g));
        }
        ops
    }

    fn group(kind: Kind) -> usize {
        match kind {
            Kind::Pip => 0,
            Kind::Lb => 1,
            Kind::Vm | Kind::Vmss | Kind::VmssVm => 3,
            _ => 2,
        }
    }

    /// Starts an operation on `target` (the kit's operation-failure rules match the ARM ID).
    fn start(&self, kind: Kind, target: &str, action: Action) -> Operation {
        let g = Self::group(kind);
        let mut op = self.groups[g].start(target, action);
        op.id = format!("{}.{}", OP_GROUPS[g], op.id);
        op
    }

    /// The group's operations and the kit's ID of operation `id`.
    fn split<'a>(&self, id: &'a str) -> Option<(usize, &'a str)> {
        let (g, inner) = id.split_once('.')?;
        Some((OP_GROUPS.iter().position(|x| *x == g)?, inner))
    }

    fn get(&self, id: &str) -> Option<Operation> {
        let (g, inner) = self.split(id)?;
        let mut op = self.groups[g].get(inner)?;
        op.id = id.to_string();
        Some(op)
    }

    fn phase(&self, id: &str) -> Option<Phase> {
        self.get(id).map(|o| o.phase())
    }

    fn cancel(&self, id: &str, message: String) -> bool {
        self.split(id).is_some_and(|(g, inner)| self.groups[g].cancel(inner, message))
    }

    fn set_pending_for(&self, d: Duration) {
        self.groups.iter().for_each(|g| g.set_pending_for(d));
    }

    fn reset(&self) {
        self.groups.iter().for_each(AsyncOps::reset);
    }

    fn state(&self) -> Value {
        let mut all = Vec::new();
        for (name, g) in OP_GROUPS.iter().zip(self.groups.iter()) {
            if let Value::Array(a) = g.state() {
                for mut o in a {
                    if let Some(id) = o["id"].as_str() {
                        o["id"] = json!(format!("{name}.{id}"));
                    }
                    all.push(o);
                }
            }
        }
        Value::Array(all)
    }
}

/// The `realistic` timing profile of each group of ARM resources: how long ARM's
/// long-running operations typically run (docs/emulators.md, Azure: timing).
fn realistic_timing(group: &str) -> Timing {
    let s = Duration::from_secs;
    match group {
        // Public IPs: a few seconds.
        "pip" => Timing { create: s(6), update: s(5), delete: s(8) },
        // Load balancers: tens of seconds (each change reprograms the data path).
        "lb" => Timing { create: s(20), update: s(15), delete: s(15) },
        // NSGs, route tables, NICs, subnets.
        "net" => Timing { create: s(8), update: s(6), delete: s(6) },
        // Scale-set models and scale-set VM updates.
        _ => Timing { create: s(60), update: s(45), delete: s(60) },
    }
}

/// One stored resource.
#[derive(Debug, Clone)]
struct Stored {
    kind: Kind,
    /// The resource as clients see it (read-only parts computed on read).
    body: Value,
    etag: u64,
    /// The running operation on it and whether it deletes it.
    op: Option<(String, Action)>,
    /// Emulator-only: power state (VMs and scale-set VMs) and fault domain.
    power: PowerState,
    fault_domain: u64,
}

#[derive(Debug, Default)]
struct State {
    /// Lower-case ARM id → resource.
    res: BTreeMap<String, Stored>,
    /// Issued tokens → expiry (UNIX seconds).
    tokens: BTreeMap<String, u64>,
    /// Issued tokens → their tenant (lower case).
    token_tenants: BTreeMap<String, String>,
    /// Certificates (DER) registered per client id (AAD's certificate credentials).
    client_certificates: BTreeMap<String, Vec<Vec<u8>>>,
    /// ARM calls per subscription (lower case), authorised or not.
    calls_by_subscription: BTreeMap<String, u64>,
    /// The VM IMDS speaks for (lower-case id).
    imds_vm: Option<String>,
    /// Next public IP host number.
    next_pip: u32,
    /// Next private IP per subnet id.
    next_private: BTreeMap<String, u32>,
    /// Creates (PUT answered 201) carry no `Azure-AsyncOperation`/`Location`: the client
    /// reads the resource until its provisioning state settles (`POST
    /// /__azure/put-without-operation-header?on=true|false`).
    put_without_operation_header: bool,
}

/// The Azure emulator (see the module docs).
pub struct AzureCloud {
    world: World,
    opts: Mutex<AzureOptions>,
    state: Mutex<State>,
    ops: Ops,
    tokens_issued: AtomicU64,
}

impl std::fmt::Debug for AzureCloud {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AzureCloud").finish_non_exhaustive()
    }
}

fn etag_str(n: u64, id: &str) -> String {
    format!("W/\"{}\"", uuid(&format!("{id}#{n}")))
}

fn ids_eq(a: &str, b: &str) -> bool {
    a.eq_ignore_ascii_case(b)
}

/// Every `"id"` string under `v` at key `key` (e.g. all `loadBalancerBackendAddressPools[].id`).
fn collect_refs(v: &Value, key: &str, out: &mut Vec<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                if k == key {
                    match x {
                        Value::Array(a) => {
                            for e in a {
                                if let Some(id) = e.get("id").and_then(Value::as_str) {
                                    out.push(id.to_string());
                                }
                            }
                        }
                        Value::Object(_) => {
                            if let Some(id) = x.get("id").and_then(Value::as_str) {
                                out.push(id.to_string());
                            }
                        }
                        _ => {}
                    }
                }
                collect_refs(x, key, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| collect_refs(x, key, out)),
        _ => {}
    }
}

fn props_mut(v: &mut Value) -> &mut Map<String, Value> {
    if !v.get("properties").is_some_and(Value::is_object) {
        v["properties"] = json!({});
    }
    match v.get_mut("properties") {
        Some(Value::Object(m)) => m,
        _ => unreachable_props(),
    }
}

#[allow(clippy::panic)]
fn unreachable_props() -> ! {
    // `properties` was just made an object.
    panic!("properties is an object")
}

fn children_mut<'a>(v: &'a mut Value, key: &str) -> Vec<&'a mut Value> {
    match v.get_mut("properties").and_then(|p| p.get_mut(key)) {
        Some(Value::Array(a)) => a.iter_mut().collect(),
        _ => Vec::new(),
    }
}

/// ARM's checks on one child `c` of `key` in resource `id` (a frontend, a pool, a PLS IP
/// configuration …): it has a name (400 `InvalidRequestFormat`), unique in `seen` ignoring
/// case (400 `DuplicateResourceName`); its `id` is set to `<id>/<key>/<name>`. The name.
fn name_child(
    c: &mut Value,
    id: &str,
    key: &str,
    seen: &mut std::collections::BTreeSet<String>,
) -> Res<String> {
    let Some(n) = c.get("name").and_then(Value::as_str).map(str::to_string) else {
        return Err(bad("InvalidRequestFormat", format!("{key} entry of {id} has no name.")));
    };
    if !seen.insert(n.to_ascii_lowercase()) {
        return Err(bad("DuplicateResourceName", format!("{id} has two {key} named {n}.")));
    }
    c["id"] = json!(format!("{id}/{key}/{n}"));
    Ok(n)
}

fn child_names(v: &Value, key: &str) -> Vec<String> {
    v.get("properties")
        .and_then(|p| p.get(key))
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|c| c.get("name").and_then(Value::as_str).map(str::to_string))
                .collect()
        })
        .unwrap_or_default()
}

/// The resource IDs a write's body links to (every `/subscriptions/…` string), without
/// the read-only back-references ARM ignores on a write (`backendIPConfigurations`, a
/// public IP's `ipConfiguration`, `loadBalancingRules` of a pool, a NIC's
/// `virtualMachine`, a security group's `networkInterfaces` and `subnets`).
fn linked_refs(v: &Value, out: &mut Vec<String>) {
    const READ_ONLY: [&str; 6] = [
        "backendIPConfigurations",
        "ipConfiguration",
        "loadBalancingRules",
        "virtualMachine",
        "networkInterfaces",
        "subnets",
    ];
    match v {
        Value::String(s) if s.starts_with("/subscriptions/") => out.push(s.clone()),
        Value::Array(a) => a.iter().for_each(|x| linked_refs(x, out)),
        Value::Object(m) => {
            for (k, x) in m {
                if !READ_ONLY.contains(&k.as_str()) {
                    linked_refs(x, out);
                }
            }
        }
        _ => {}
    }
}

fn name_of(id: &str) -> &str {
    id.rsplit('/').next().unwrap_or(id)
}

/// `a.b.c.d` of a 32-bit host number in 10.x or 20.x.
fn ipv4(n: u32) -> String {
    format!("{}.{}.{}.{}", n >> 24, (n >> 16) & 255, (n >> 8) & 255, n & 255)
}

impl AzureCloud {
    /// An emulator of `world`.
    pub fn new(world: World, opts: AzureOptions) -> Arc<AzureCloud> {
        let lro = opts.lro;
        let cloud = AzureCloud {
            world,
            opts: Mutex::new(opts),
            state: Mutex::new(State::default()),
            ops: Ops::new(lro),
            tokens_issued: AtomicU64::new(0),
        };
        cloud.load();
        Arc::new(cloud)
    }

    fn o(&self) -> AzureOptions {
        lock(&self.opts).clone()
    }

    /// The location.
    pub fn location(&self) -> String {
        let o = self.o();
        o.location.or_else(|| self.world.region.clone()).unwrap_or_else(|| "eastus".into())
    }

    /// The subscription id.
    pub fn subscription_id(&self) -> String {
        self.o().subscription_id
    }

    /// The tenant id.
    pub fn tenant_id(&self) -> String {
        self.o().tenant_id
    }

    /// The resource group of the world's resources.
    pub fn resource_group(&self) -> String {
        self.o().resource_group
    }

    fn rg_id(&self, rg: &str) -> String {
        format!("/subscriptions/{}/resourceGroups/{rg}", self.subscription_id())
    }

    /// The subscription of the world's network ([`AzureOptions::network`], else the one).
    pub fn network_subscription_id(&self) -> String {
        self.o().network.map_or_else(|| self.subscription_id(), |n| n.subscription_id)
    }

    /// The ARM id of a network resource of the world's resource group in the network
    /// subscription (the world's virtual networks, subnets and security group).
    pub fn network_id(&self, arm_type: &str, name: &str) -> String {
        format!(
            "/subscriptions/{}/resourceGroups/{}/providers/{arm_type}/{name}",
            self.network_subscription_id(),
            self.resource_group()
        )
    }

    /// ARM calls addressed to `subscription` so far (token requests and operation polls
    /// not included).
    pub fn calls_to_subscription(&self, subscription: &str) -> u64 {
        let st = lock(&self.state);
        st.calls_by_subscription.get(&subscription.to_ascii_lowercase()).copied().unwrap_or(0)
    }

    /// The tenant of `subscription`; None when the emulator has no such subscription.
    fn tenant_of(&self, subscription: &str) -> Option<String> {
        let o = self.o();
        if ids_eq(subscription, &o.subscription_id) {
            return Some(o.tenant_id);
        }
        o.network.filter(|n| ids_eq(subscription, &n.subscription_id)).map(|n| n.tenant_id)
    }

    /// The tenant of an issued, unexpired token.
    fn token_tenant(&self, token: &str) -> Option<String> {
        let st = lock(&self.state);
        let live = st.tokens.get(token).is_some_and(|exp| *exp > now_secs());
        if !live {
            return None;
        }
        st.token_tenants
            .get(token)
            .cloned()
            .or_else(|| Some(self.o().tenant_id.to_ascii_lowercase()))
    }

    /// ARM's cross-tenant rules for a call to `sub` (see [`NetworkSubscription`]).
    fn check_tenants(&self, req: &Request<Bytes>, sub: &str) -> Res<()> {
        let Some(want) = self.tenant_of(sub) else { return Ok(()) };
        let bearer = |v: &str| v.trim().strip_prefix("Bearer ").map(|t| t.trim().to_string());
        let primary = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(bearer)
            .and_then(|t| self.token_tenant(&t))
            .unwrap_or_default();
        if !ids_eq(&primary, &want) {
            return Err(err(
                StatusCode::UNAUTHORIZED,
                "InvalidAuthenticationTokenTenant",
                format!(
                    "The access token is from the wrong issuer 'https://sts.windows.net/{primary}/'. It must match the tenant 'https://sts.windows.net/{want}/' associated with this subscription. Please use the authority (URL) 'https://login.windows.net/{want}' to get the token. Note, if the subscription is transferred to another tenant there is no impact to the services, but information about new tenant could take time to propagate (up to an hour). If you just transferred your subscription and see this error message, please try back later."
                ),
            ));
        }
        if !matches!(*req.method(), Method::PUT | Method::PATCH) {
            return Ok(());
        }
        // Linked resources in another tenant's subscription need that tenant's token.
        let aux: Vec<String> = req
            .headers()
            .get("x-ms-authorization-auxiliary")
            .and_then(|v| v.to_str().ok())
            .map(|v| {
                v.split(',').filter_map(bearer).filter_map(|t| self.token_tenant(&t)).collect()
            })
            .unwrap_or_default();
        let body: Value = serde_json::from_slice(req.body()).unwrap_or(Value::Null);
        let mut refs = Vec::new();
        linked_refs(&body, &mut refs);
        let mut linked: Vec<String> = Vec::new();
        for r in refs {
            let Some(s) = r.split('/').nth(2).map(str::to_string) else { continue };
            if !ids_eq(&s, sub) && !linked.iter().any(|l| ids_eq(l, &s)) {
                linked.push(s);
            }
        }
        for s in linked {
            let Some(tenant) = self.tenant_of(&s) else { continue };
            if ids_eq(&tenant, &primary) || aux.iter().any(|a| ids_eq(a, &tenant)) {
                continue;
            }
            return Err(err(
                StatusCode::FORBIDDEN,
                "LinkedAuthorizationFailed",
                format!(
                    "The client has permission to perform action on scope '{}'; however, the current tenant '{primary}' is not authorized to access linked subscription '{s}'.",
                    req.uri().path()
                ),
            ));
        }
        Ok(())
    }

    /// The ARM id of a resource of the world's resource group, e.g.
    /// `id("Microsoft.Network/loadBalancers", "kubernetes")`.
    pub fn id(&self, arm_type: &str, name: &str) -> String {
        format!("{}/providers/{arm_type}/{name}", self.rg_id(&self.resource_group()))
    }

    /// The ARM id of the VM or scale-set VM of a world instance.
    pub fn instance_resource_id(&self, name: &str) -> Option<String> {
        let st = lock(&self.state);
        st.res
            .values()
            .find(|r| {
                matches!(r.kind, Kind::Vm | Kind::VmssVm) && computer_name(&r.body) == Some(name)
            })
            .and_then(|r| r.body.get("id").and_then(Value::as_str).map(str::to_string))
    }

    /// Sets a world instance's power state; false when unknown.
    pub fn set_power(&self, name: &str, power: PowerState) -> bool {
        let mut st = lock(&self.state);
        let mut found = false;
        for r in st.res.values_mut() {
            if matches!(r.kind, Kind::Vm | Kind::VmssVm) && computer_name(&r.body) == Some(name) {
                r.power = power;
                found = true;
            }
        }
        found
    }

    /// Deletes a world instance's VM (and its NIC and public IP); false when unknown.
    pub fn delete_instance(&self, name: &str) -> bool {
        let mut st = lock(&self.state);
        let Some(key) = st
            .res
            .iter()
            .find(|(_, r)| {
                matches!(r.kind, Kind::Vm | Kind::VmssVm) && computer_name(&r.body) == Some(name)
            })
            .map(|(k, _)| k.clone())
        else {
            return false;
        };
        if let Some(vm) = st.res.remove(&key) {
            let mut nics = Vec::new();
            collect_refs(&vm.body, "networkInterfaces", &mut nics);
            for nic in nics {
                if let Some(n) = st.res.remove(&nic.to_ascii_lowercase()) {
                    let mut pips = Vec::new();
                    collect_refs(&n.body, "publicIPAddress", &mut pips);
                    for p in pips {
                        st.res.remove(&p.to_ascii_lowercase());
                    }
                }
            }
        }
        true
    }

    /// Adds a world instance (a VM, or a scale-set VM when tagged `azure.vmss`).
    pub fn add_instance(&self, inst: Instance) -> Result<String, String> {
        let index = lock(&self.state).res.len();
        let mut st = lock(&self.state);
        self.add_instance_locked(&mut st, &inst, index)
    }

    /// Makes the VM `name` the one IMDS answers for.
    pub fn set_imds_instance(&self, name: &str) -> bool {
        let id = self.instance_resource_id(name);
        let mut st = lock(&self.state);
        st.imds_vm = id.map(|i| i.to_ascii_lowercase());
        st.imds_vm.is_some()
    }

    /// Changes how long long-running operations stay `InProgress` from now on.
    pub fn set_lro(&self, d: Duration) {
        lock(&self.opts).lro = d;
        self.ops.set_pending_for(d);
    }

    /// Creates (PUT answered 201) without `Azure-AsyncOperation`/`Location` headers from now
    /// on (`on`), as some ARM resource providers answer: the resource reads `Updating` until
    /// its operation ends.
    pub fn set_put_without_operation_header(&self, on: bool) {
        lock(&self.state).put_without_operation_header = on;
    }

    /// Changes the list page size.
    pub fn set_page_size(&self, n: usize) {
        lock(&self.opts).page_size = n.max(1);
    }

    /// Changes the lifetime of tokens issued from now on.
    pub fn set_token_lifetime(&self, d: Duration) {
        lock(&self.opts).token_lifetime = d;
    }

    /// Makes every issued token expired (clients must get a new one).
    pub fn expire_tokens(&self) {
        lock(&self.state).tokens.clear();
    }

    /// Registers an X.509 certificate (DER) for the service principal `client_id` (AAD's
    /// certificate credentials): its certificate assertions must be signed by the key of one
    /// of its certificates. `false` when `der` is not a certificate with a public key.
    pub fn register_client_certificate(&self, client_id: &str, der: &[u8]) -> bool {
        if aad_cert::certificate_public_key(der).is_none() {
            return false;
        }
        lock(&self.state)
            .client_certificates
            .entry(client_id.to_string())
            .or_default()
            .push(der.to_vec());
        true
    }

    /// How many tokens AAD and the managed-identity endpoint issued.
    pub fn tokens_issued(&self) -> u64 {
        self.tokens_issued.load(Ordering::Relaxed)
    }

    /// A resource as clients read it (None: absent).
    pub fn resource(&self, id: &str) -> Option<Value> {
        self.settle();
        let st = lock(&self.state);
        st.res.get(&id.to_ascii_lowercase()).map(|r| self.render(&st, r, false))
    }

    /// Every resource of an ARM type (e.g. `Microsoft.Network/publicIPAddresses`) as read.
    pub fn resources(&self, arm_type: &str) -> Vec<Value> {
        self.settle();
        let st = lock(&self.state);
        st.res
            .values()
            .filter(|r| r.kind.arm_type().eq_ignore_ascii_case(arm_type))
            .map(|r| self.render(&st, r, false))
            .collect()
    }

    /// Sets a resource's `provisioningState` with no operation behind it (a resource ARM left
    /// stuck `Updating`, or `Failed`); false when absent.
    pub fn set_provisioning_state(&self, id: &str, state: &str) -> bool {
        let mut st = lock(&self.state);
        let Some(r) = st.res.get_mut(&id.to_ascii_lowercase()) else { return false };
        r.op = None;
        props_mut(&mut r.body).insert("provisioningState".into(), json!(state));
        true
    }

    /// Writes a resource as an operator would (no operation, no checks), e.g. to pre-create a
    /// load balancer or a public IP.
    pub fn put_resource(&self, id: &str, mut body: Value) -> Result<(), String> {
        let kind = match parse_target(&Method::GET, id) {
            Target::One { kind, .. } => kind,
            _ => return Err(format!("{id} is not a resource id the emulator keeps")),
        };
        body["id"] = json!(id);
        body["name"] = json!(name_of(id));
        body["type"] = json!(kind.arm_type());
        if body.get("location").is_none() {
            body["location"] = json!(self.location());
        }
        props_mut(&mut body).insert("provisioningState".into(), json!("Succeeded"));
        let mut st = lock(&self.state);
        let etag = st.res.get(&id.to_ascii_lowercase()).map(|r| r.etag + 1).unwrap_or(1);
        st.res.insert(
            id.to_ascii_lowercase(),
            Stored { kind, body, etag, op: None, power: PowerState::Running, fault_domain: 0 },
        );
        Ok(())
    }

    fn load(&self) {
        let o = self.o();
        let loc = self.location();
        let mut st = State { next_pip: (20 << 24) | (1 << 16), ..Default::default() };
        // Virtual networks and subnets.
        let mut vnets: Vec<(String, String)> = self
            .world
            .networks
            .iter()
            .map(|n| (n.name.clone(), n.cidr.clone().unwrap_or_else(|| "10.0.0.0/8".into())))
            .collect();
        if vnets.is_empty() {
            vnets.push((o.vnet.clone(), "10.0.0.0/8".into()));
        }
        let mut subnets: Vec<(String, String, String)> = self
            .world
            .subnets
            .iter()
            .enumerate()
            .map(|(i, s)| {
                (
                    s.network.clone().unwrap_or_else(|| vnets[0].0.clone()),
                    s.name.clone(),
                    s.cidr.clone().unwrap_or_else(|| format!("10.{}.0.0/16", 240 + i)),
                )
            })
            .collect();
        if subnets.is_empty() {
            subnets.push((vnets[0].0.clone(), "subnet".into(), "10.240.0.0/16".into()));
        }
        for (name, cidr) in &vnets {
            let id = self.network_id("Microsoft.Network/virtualNetworks", name);
            let body = json!({
                "id": id, "name": name, "type": Kind::Vnet.arm_type(), "location": loc,
                "etag": "", "properties": {
                    "provisioningState": "Succeeded",
                    "addressSpace": { "addressPrefixes": [cidr] },
                }
            });
            st.res.insert(id.to_ascii_lowercase(), stored(Kind::Vnet, body));
        }
        for (vnet, name, cidr) in &subnets {
            let id = format!(
                "{}/subnets/{name}",
                self.network_id("Microsoft.Network/virtualNetworks", vnet)
            );
            let body = json!({
                "id": id, "name": name, "type": Kind::Subnet.arm_type(),
                "properties": { "provisioningState": "Succeeded", "addressPrefix": cidr }
            });
            st.res.insert(id.to_ascii_lowercase(), stored(Kind::Subnet, body));
        }
        // The cluster's NSG.
        let nsg = self.network_id("Microsoft.Network/networkSecurityGroups", &o.security_group);
        let defaults: Vec<Value> = [
            ("AllowVnetInBound", 65000, "Inbound", "VirtualNetwork", "VirtualNetwork", "Allow"),
            ("AllowAzureLoadBalancerInBound", 65001, "Inbound", "AzureLoadBalancer", "*", "Allow"),
            ("DenyAllInBound", 65500, "Inbound", "*", "*", "Deny"),
            ("AllowVnetOutBound", 65000, "Outbound", "VirtualNetwork", "VirtualNetwork", "Allow"),
            ("AllowInternetOutBound", 65001, "Outbound", "*", "Internet", "Allow"),
            ("DenyAllOutBound", 65500, "Outbound", "*", "*", "Deny"),
        ]
        .iter()
        .map(|(n, p, d, s, t, a)| {
            json!({
                "id": format!("{nsg}/defaultSecurityRules/{n}"), "name": n,
                "type": "Microsoft.Network/networkSecurityGroups/defaultSecurityRules",
                "properties": {
                    "provisioningState": "Succeeded", "protocol": "*", "sourcePortRange": "*",
                    "destinationPortRange": "*", "sourceAddressPrefix": s,
                    "destinationAddressPrefix": t, "access": a, "priority": p, "direction": d,
                }
            })
        })
        .collect();
        st.res.insert(
            nsg.to_ascii_lowercase(),
            stored(
                Kind::Nsg,
                json!({
                    "id": nsg, "name": o.security_group, "type": Kind::Nsg.arm_type(),
                    "location": loc,
                    "properties": {
                        "provisioningState": "Succeeded", "securityRules": [],
                        "defaultSecurityRules": defaults,
                    }
                }),
            ),
        );
        for (i, inst) in self.world.instances.iter().enumerate() {
            if let Err(e) = self.add_instance_locked(&mut st, inst, i) {
                tracing::warn!(instance = %inst.name, "azure emulator: {e}");
            }
        }
        if let Some(first) = st
            .res
            .values()
            .find(|r| matches!(r.kind, Kind::Vm | Kind::VmssVm))
            .and_then(|r| r.body.get("id").and_then(Value::as_str))
        {
            st.imds_vm = Some(first.to_ascii_lowercase());
        }
        *lock(&self.state) = st;
    }

    fn add_instance_locked(
        &self,
        st: &mut State,
        inst: &Instance,
        index: usize,
    ) -> Result<String, String> {
        let loc = self.location();
        let subnet_id = {
            let want = inst.subnet.as_deref();
            st.res
                .values()
                .filter(|r| r.kind == Kind::Subnet)
                .find(|r| want.is_none_or(|w| r.body["name"].as_str() == Some(w)))
                .and_then(|r| r.body["id"].as_str().map(str::to_string))
                .ok_or_else(|| format!("no subnet {:?}", inst.subnet))?
        };
        let zones: Vec<String> =
            if !inst.zone.is_empty() && inst.zone.bytes().all(|b| b.is_ascii_digit()) {
                vec![inst.zone.clone()]
            } else {
                Vec::new()
            };
        let fault_domain =
            inst.tags.get("azure.fault-domain").and_then(|v| v.parse().ok()).unwrap_or(0);
        let size = inst.instance_type.clone().unwrap_or_else(|| "Standard_D2s_v3".into());
        let tags: Map<String, Value> = inst
            .tags
            .iter()
            .filter(|(k, _)| !k.starts_with("azure."))
            .map(|(k, v)| (k.clone(), json!(v)))
            .collect();
        // The NIC (or, for scale-set VMs, the network profile's IP configuration).
        let mut ipconfigs = Vec::new();
        let mut pip_id = None;
        if !inst.public_ips.is_empty() {
            let id = self.id("Microsoft.Network/publicIPAddresses", &format!("{}-pip", inst.name));
            let body = json!({
                "id": id, "name": format!("{}-pip", inst.name), "type": Kind::Pip.arm_type(),
                "location": loc, "sku": { "name": "Standard", "tier": "Regional" },
                "properties": {
                    "provisioningState": "Succeeded", "publicIPAllocationMethod": "Static",
                    "publicIPAddressVersion": if inst.public_ips[0].is_ipv6() { "IPv6" } else { "IPv4" },
                    "ipAddress": inst.public_ips[0].to_string(),
                }
            });
            st.res.insert(id.to_ascii_lowercase(), stored(Kind::Pip, body));
            pip_id = Some(id);
        }
        let v4: Vec<_> = inst.private_ips.iter().filter(|i| i.is_ipv4()).collect();
        let v6: Vec<_> = inst.private_ips.iter().filter(|i| i.is_ipv6()).collect();
        let primary_v4 = match v4.first() {
            Some(ip) => ip.to_string(),
            None => {
                let n = st.next_private.entry(subnet_id.to_ascii_lowercase()).or_insert(4);
                *n += 1;
                format!("10.240.{}.{}", (*n >> 8) & 255, *n & 255)
            }
        };
        let mut cfg = json!({
            "name": "ipconfig1",
            "properties": {
                "primary": true, "privateIPAddress": primary_v4,
                "privateIPAllocationMethod": "Dynamic", "privateIPAddressVersion": "IPv4",
                "subnet": { "id": subnet_id },
            }
        });
        if let Some(p) = &pip_id {
            cfg["properties"]["publicIPAddress"] = json!({ "id": p });
        }
        ipconfigs.push(cfg);
        for (i, ip) in v4.iter().skip(1).enumerate() {
            ipconfigs.push(json!({ "name": format!("ipconfig{}", i + 2), "properties": {
                "primary": false, "privateIPAddress": ip.to_string(),
                "privateIPAllocationMethod": "Static", "privateIPAddressVersion": "IPv4",
                "subnet": { "id": subnet_id } } }));
        }
        for (i, ip) in v6.iter().enumerate() {
            ipconfigs.push(json!({ "name": format!("ipconfig-v6-{}", i + 1), "properties": {
                "primary": false, "privateIPAddress": ip.to_string(),
                "privateIPAllocationMethod": "Dynamic", "privateIPAddressVersion": "IPv6",
                "subnet": { "id": subnet_id } } }));
        }
        let vm_id_guid = uuid(&format!("vm:{}", inst.name));
        // A flexible scale set's instance is a standalone VM with its own NIC that names the
        // scale set; the scale set is made (Flexible) with its first instance.
        let flex = inst.tags.get("azure.vmss-flex").map(|set| {
            let vmss_id = self.id("Microsoft.Compute/virtualMachineScaleSets", set);
            let key = vmss_id.to_ascii_lowercase();
            if !st.res.contains_key(&key) {
                let body = json!({
                    "id": vmss_id, "name": set, "type": Kind::Vmss.arm_type(), "location": loc,
                    "properties": {
                        "provisioningState": "Succeeded", "orchestrationMode": "Flexible",
                        "platformFaultDomainCount": 1, "singlePlacementGroup": false,
                        "uniqueId": uuid(&format!("vmss:{set}")),
                        "virtualMachineProfile": {
                            "osProfile": { "computerNamePrefix": set, "adminUsername": "azureuser" },
                            "networkProfile": {
                                "networkApiVersion": "2020-11-01",
                                "networkInterfaceConfigurations": [{
                                    "name": format!("{set}-nic"), "properties": { "primary": true,
                                    "ipConfigurations": [{ "name": "ipconfig1", "properties": {
                                        "primary": true, "privateIPAddressVersion": "IPv4",
                                        "subnet": { "id": subnet_id } } }] } }] },
                        },
                    }
                });
                st.res.insert(key.clone(), stored(Kind::Vmss, body));
            }
            // Compute builds the instance from the current model: its IP configurations
            // join the model's backend pools at once.
            (vmss_id, model_pools(st, &key))
        });
        if let Some((_, pools)) = &flex
            && let Some(primary) = ipconfigs.first_mut()
            && !pools.is_empty()
        {
            primary["properties"]["loadBalancerBackendAddressPools"] = json!(pools);
        }
        if let Some(set) = inst.tags.get("azure.vmss") {
            let vmss_id = self.id("Microsoft.Compute/virtualMachineScaleSets", set);
            let key = vmss_id.to_ascii_lowercase();
            if !st.res.contains_key(&key) {
                let body = json!({
                    "id": vmss_id, "name": set, "type": Kind::Vmss.arm_type(), "location": loc,
                    "sku": { "name": size, "tier": "Standard", "capacity": 0 },
                    "properties": {
                        "provisioningState": "Succeeded", "orchestrationMode": "Uniform",
                        "upgradePolicy": { "mode": "Manual" },
                        "virtualMachineProfile": {
                            "osProfile": { "computerNamePrefix": set, "adminUsername": "azureuser" },
                            "networkProfile": { "networkInterfaceConfigurations": [{
                                "name": set, "properties": { "primary": true, "ipConfigurations": [{
                                    "name": "ipconfig1", "properties": { "primary": true,
                                    "subnet": { "id": subnet_id } } }] } }] },
                        },
                    }
                });
                st.res.insert(key.clone(), stored(Kind::Vmss, body));
            }
            let taken: std::collections::BTreeSet<u64> = st
                .res
                .values()
                .filter(|r| {
                    r.kind == Kind::VmssVm
                        && r.body["id"]
                            .as_str()
                            .is_some_and(|i| i.to_ascii_lowercase().starts_with(&format!("{key}/")))
                })
                .filter_map(|r| r.body["instanceId"].as_str().and_then(|i| i.parse().ok()))
                .collect();
            // A name of Azure's form (`<set>` + 6 base-36 digits) is the instance ID it
            // encodes; any other name (a world's shorthand such as `pool-0`) takes the next
            // free ID and stays the computer name as written.
            let instance_id = match vmss_instance_id(set, &inst.name) {
                Some(n) if taken.contains(&n) => {
                    return Err(format!(
                        "instance {}: scale set {set} already has instance ID {n}",
                        inst.name
                    ));
                }
                Some(n) => n,
                None => (taken.len() as u64..).find(|n| !taken.contains(n)).unwrap_or_default(),
            };
            if let Some(ss) = st.res.get_mut(&key) {
                ss.body["sku"]["capacity"] = json!(taken.len() + 1);
            }
            let id = format!("{vmss_id}/virtualMachines/{instance_id}");
            // A new instance gets the latest model: the model's backend pools included.
            let pools = model_pools(st, &key);
            let nic_cfg: Vec<Value> = ipconfigs
                .iter()
                .map(|c| {
                    let mut cfg = json!({ "name": c["name"], "properties": {
                    "primary": c["properties"]["primary"], "subnet": c["properties"]["subnet"],
                    "privateIPAddressVersion": c["properties"]["privateIPAddressVersion"] } });
                    if c["properties"]["primary"] == json!(true) && !pools.is_empty() {
                        cfg["properties"]["loadBalancerBackendAddressPools"] = json!(pools);
                    }
                    cfg
                })
                .collect();
            let mut body = json!({
                "id": id, "name": format!("{set}_{instance_id}"), "type": Kind::VmssVm.arm_type(),
                "location": loc, "instanceId": instance_id.to_string(),
                "sku": { "name": size, "tier": "Standard" },
                "properties": {
                    "provisioningState": "Succeeded", "vmId": vm_id_guid,
                    "latestModelApplied": true,
                    "hardwareProfile": { "vmSize": size },
                    "osProfile": { "computerName": inst.name, "adminUsername": "azureuser" },
                    "networkProfileConfiguration": { "networkInterfaceConfigurations": [{
                        "name": set, "properties": { "primary": true, "ipConfigurations": nic_cfg } }] },
                    "networkProfile": { "networkInterfaces": [{
                        "id": format!("{id}/networkInterfaces/{set}"), "properties": { "primary": true } }] },
                }
            });
            if !zones.is_empty() {
                body["zones"] = json!(zones);
            }
            if !tags.is_empty() {
                body["tags"] = Value::Object(tags);
            }
            // The scale-set VM's NIC lives under the VM in ARM; private IPs are kept in the
            // body the emulator returns for `instanceView`-independent reads.
            body["properties"]["__privateIPs"] = json!(ipconfigs);
            st.res.insert(
                id.to_ascii_lowercase(),
                Stored {
                    kind: Kind::VmssVm,
                    body,
                    etag: 1,
                    op: None,
                    power: inst.power,
                    fault_domain,
                },
            );
            let _ = index;
            return Ok(id);
        }
        let nic_id = self.id("Microsoft.Network/networkInterfaces", &format!("{}-nic", inst.name));
        let vm_id = self.id("Microsoft.Compute/virtualMachines", &inst.name);
        let mut ipc = ipconfigs;
        for c in &mut ipc {
            let n = c["name"].as_str().unwrap_or("ipconfig").to_string();
            c["id"] = json!(format!("{nic_id}/ipConfigurations/{n}"));
            c["properties"]["provisioningState"] = json!("Succeeded");
        }
        let nic = json!({
            "id": nic_id, "name": format!("{}-nic", inst.name), "type": Kind::Nic.arm_type(),
            "location": loc,
            "properties": {
                "provisioningState": "Succeeded", "primary": true,
                "macAddress": format!("00-0D-3A-{:02X}-{:02X}-{:02X}", (fnv(&inst.name) >> 16) & 255, (fnv(&inst.name) >> 8) & 255, fnv(&inst.name) & 255),
                "ipConfigurations": ipc, "virtualMachine": { "id": vm_id },
                "enableIPForwarding": false,
            }
        });
        st.res.insert(nic_id.to_ascii_lowercase(), stored(Kind::Nic, nic));
        let mut body = json!({
            "id": vm_id, "name": inst.name, "type": Kind::Vm.arm_type(), "location": loc,
            "properties": {
                "provisioningState": "Succeeded", "vmId": vm_id_guid,
                "hardwareProfile": { "vmSize": size },
                "osProfile": { "computerName": inst.name, "adminUsername": "azureuser" },
                "networkProfile": { "networkInterfaces": [{ "id": nic_id, "properties": { "primary": true } }] },
            }
        });
        if let Some((vmss_id, _)) = &flex {
            body["properties"]["virtualMachineScaleSet"] = json!({ "id": vmss_id });
            if let Some(ss) = st.res.get_mut(&vmss_id.to_ascii_lowercase()) {
                let n = ss.body["sku"]["capacity"].as_u64().unwrap_or(0);
                if ss.body.get("sku").is_some() {
                    ss.body["sku"]["capacity"] = json!(n + 1);
                }
            }
        }
        if !zones.is_empty() {
            body["zones"] = json!(zones);
        }
        if !tags.is_empty() {
            body["tags"] = Value::Object(tags);
        }
        st.res.insert(
            vm_id.to_ascii_lowercase(),
            Stored { kind: Kind::Vm, body, etag: 1, op: None, power: inst.power, fault_domain },
        );
        Ok(vm_id)
    }

    /// Applies finished operations: `Succeeded`, or the resource's removal after a delete.
    fn settle(&self) {
        let mut st = lock(&self.state);
        let mut remove = Vec::new();
        for (k, r) in st.res.iter_mut() {
            let Some((op, action)) = r.op.clone() else { continue };
            match self.ops.phase(&op) {
                Some(Phase::Pending) => {}
                Some(Phase::Failed(_)) => {
                    r.op = None;
                    props_mut(&mut r.body).insert("provisioningState".into(), json!("Failed"));
                }
                _ => {
                    r.op = None;
                    if action == Action::Delete {
                        remove.push(k.clone());
                    } else {
                        props_mut(&mut r.body)
                            .insert("provisioningState".into(), json!("Succeeded"));
                    }
                }
            }
        }
        for k in remove {
            if let Some(gone) = st.res.remove(&k) {
                after_compute_delete(&mut st, &gone);
            }
        }
    }

    /// A resource as clients see it: etag, computed back-references, instance view.
    fn render(&self, st: &State, r: &Stored, expand_iv: bool) -> Value {
        let mut b = r.body.clone();
        let id = b["id"].as_str().unwrap_or_default().to_string();
        if !matches!(r.kind, Kind::Vm | Kind::Vmss | Kind::VmssVm) {
            b["etag"] = json!(etag_str(r.etag, &id));
        }
        match r.kind {
            Kind::Lb => {
                // backendIPConfigurations of each pool; loadBalancingRules back-references.
                let mut pools: BTreeMap<String, Vec<Value>> = BTreeMap::new();
                for other in st.res.values() {
                    match other.kind {
                        Kind::Nic => {
                            for c in other.body["properties"]["ipConfigurations"]
                                .as_array()
                                .into_iter()
                                .flatten()
                            {
                                let mut refs = Vec::new();
                                collect_refs(c, "loadBalancerBackendAddressPools", &mut refs);
                                for p in refs {
                                    pools
                                        .entry(p.to_ascii_lowercase())
                                        .or_default()
                                        .push(json!({ "id": c["id"] }));
                                }
                            }
                        }
                        Kind::VmssVm => {
                            for (ipconfig, p) in vmss_vm_pool_refs(&other.body) {
                                pools
                                    .entry(p.to_ascii_lowercase())
                                    .or_default()
                                    .push(json!({ "id": ipconfig }));
                            }
                        }
                        _ => {}
                    }
                }
                for p in children_mut(&mut b, "backendAddressPools") {
                    let pid = p["id"].as_str().unwrap_or_default().to_ascii_lowercase();
                    let list = pools.remove(&pid).unwrap_or_default();
                    if !list.is_empty() {
                        p["properties"]["backendIPConfigurations"] = json!(list);
                    }
                }
            }
            Kind::Pip => {
                let lower = id.to_ascii_lowercase();
                for other in st.res.values() {
                    let key = match other.kind {
                        Kind::Lb => "frontendIPConfigurations",
                        Kind::Nic => "ipConfigurations",
                        _ => continue,
                    };
                    for c in other.body["properties"][key].as_array().into_iter().flatten() {
                        if c["properties"]["publicIPAddress"]["id"]
                            .as_str()
                            .is_some_and(|p| p.to_ascii_lowercase() == lower)
                        {
                            b["properties"]["ipConfiguration"] = json!({ "id": c["id"] });
                        }
                    }
                }
            }
            Kind::VmssVm => {
                if let Some(p) = b.get_mut("properties").and_then(Value::as_object_mut) {
                    p.remove("__privateIPs");
                }
            }
            _ => {}
        }
        if matches!(r.kind, Kind::Vm | Kind::VmssVm) && expand_iv {
            b["properties"]["instanceView"] = self.instance_view(r);
        }
        b
    }

    fn instance_view(&self, r: &Stored) -> Value {
        let (code, display) = match r.power {
            PowerState::Running => ("PowerState/running", "VM running"),
            PowerState::Stopped => ("PowerState/stopped", "VM stopped"),
            PowerState::Terminated => ("PowerState/deallocated", "VM deallocated"),
        };
        let prov = r.body["properties"]["provisioningState"].as_str().unwrap_or("Succeeded");
        let mut iv = json!({
            "computerName": computer_name(&r.body),
            "osName": "ubuntu", "osVersion": "22.04",
            "statuses": [
                { "code": format!("ProvisioningState/{}", prov.to_ascii_lowercase()), "level": "Info",
                  "displayStatus": format!("Provisioning {}", prov.to_ascii_lowercase()) },
                { "code": code, "level": "Info", "displayStatus": display },
            ],
        });
        if r.body.get("zones").is_none() {
            iv["platformFaultDomain"] = json!(r.fault_domain);
            iv["platformUpdateDomain"] = json!(0);
        }
        iv
    }

    fn handle(&self, op: &str, target: Target, req: &Request<Bytes>) -> Resp {
        let qs = query(req);
        match target {
            Target::AadToken => return self.aad_token(req),
            Target::AadOpenId => return self.openid(req),
            Target::AadInstanceDiscovery => return self.instance_discovery(req, &qs),
            Target::ArmMetadata => return arm_metadata(req, &qs),
            Target::AcrChallenge => return acr_challenge(req),
            Target::AcrExchange => return self.acr_exchange(req),
            Target::AzureSwitch(switch) => {
                let on = q(&qs, "on").is_none_or(|v| v.eq_ignore_ascii_case("true"));
                return match switch.as_str() {
                    "put-without-operation-header" => {
                        self.set_put_without_operation_header(on);
                        reply(StatusCode::OK, &json!({ switch: on }))
                    }
                    _ => err(StatusCode::NOT_FOUND, "NotFound", format!("no switch {switch}")),
                };
            }
            Target::ImdsInstance | Target::ImdsLoadBalancer | Target::ImdsToken => {
                let meta = req.headers().get("metadata").and_then(|v| v.to_str().ok());
                if !meta.is_some_and(|v| v.eq_ignore_ascii_case("true")) {
                    return reply(
                        StatusCode::BAD_REQUEST,
                        &json!({
                        "error": "Bad request. Required metadata header not specified" }),
                    );
                }
                if req.headers().contains_key("x-forwarded-for") {
                    return reply(
                        StatusCode::BAD_REQUEST,
                        &json!({
                        "error": "Bad request. Request was forwarded" }),
                    );
                }
                if q(&qs, "api-version").is_none() {
                    return reply(
                        StatusCode::BAD_REQUEST,
                        &json!({
                        "error": "Bad request. api-version was not specified in the request. For more information refer to aka.ms/azureimds",
                        "newest-versions": ["2023-07-01", "2021-12-13", "2021-02-01"] }),
                    );
                }
                return match target {
                    Target::ImdsInstance => self.imds_instance(),
                    Target::ImdsLoadBalancer => self.imds_lb(),
                    _ => self.imds_token(&qs),
                };
            }
            Target::Unknown => {
                return err(
                    StatusCode::NOT_FOUND,
                    "InvalidResourceType",
                    format!(
                        "The resource type could not be found in the namespace for api version (operation {op})."
                    ),
                );
            }
            _ => {}
        }
        if q(&qs, "api-version").is_none() {
            return bad(
                "MissingApiVersionParameter",
                "The api-version query parameter (?api-version=) is required for all requests.",
            );
        }
        if let Some(v) = q(&qs, "api-version")
            && let Err(r) = check_api_version(&target, v, &self.location())
        {
            return r;
        }
        if let Err(r) = self.authorise(req) {
            return r;
        }
        // The subscription must be ours.
        let sub =
            req.uri().path().trim_matches('/').split('/').nth(1).unwrap_or_default().to_string();
        if !matches!(target, Target::Operation { .. }) {
            *lock(&self.state)
                .calls_by_subscription
                .entry(sub.to_ascii_lowercase())
                .or_insert(0) += 1;
        }
        if !matches!(target, Target::Operation { .. }) && self.tenant_of(&sub).is_none() {
            return err(
                StatusCode::NOT_FOUND,
                "SubscriptionNotFound",
                format!("The subscription '{sub}' could not be found."),
            );
        }
        if !matches!(target, Target::Operation { .. })
            && let Err(r) = self.check_tenants(req, &sub)
        {
            return r;
        }
        self.settle();
        match target {
            Target::Operation { id, result } => self.operation_status(&id, result),
            Target::ResourceProvider(ns) => self.resource_provider(&ns),
            Target::List { kind, rg, parent } => self.list(req, &qs, kind, rg, parent),
            Target::VmssNics { set, vm, nic } => self.vmss_nics(req, &qs, &set, vm, nic),
            Target::One { kind, id, instance_view } => {
                if let Some(rg) = id.split('/').nth(4)
                    && !ids_eq(rg, &self.resource_group())
                    && !self.rg_exists(rg)
                {
                    return err(
                        StatusCode::NOT_FOUND,
                        "ResourceGroupNotFound",
                        format!("Resource group '{rg}' could not be found."),
                    );
                }
                match *req.method() {
                    Method::GET => self.get(&qs, kind, &id, instance_view),
                    Method::PUT | Method::PATCH if kind.writable() && !instance_view => {
                        self.put(req, kind, &id)
                    }
                    // Compute deletes VMs and scale-set VMs (a VM's NICs stay, detached,
                    // unless its network profile says `deleteOption: Delete`).
                    Method::DELETE
                        if !instance_view
                            && (matches!(kind, Kind::Vm | Kind::VmssVm)
                                || (kind.writable() && kind != Kind::Subnet)) =>
                    {
                        self.delete(req, kind, &id)
                    }
                    _ => err(
                        StatusCode::METHOD_NOT_ALLOWED,
                        "MethodNotAllowed",
                        format!(
                            "The method {} is not allowed on {}.",
                            req.method(),
                            kind.arm_type()
                        ),
                    ),
                }
            }
            _ => err(StatusCode::NOT_FOUND, "NotFound", "Not found."),
        }
    }

    /// The region's availability zones: the world's numeric zones (`1`–`3`); none when it
    /// has only zoneless instances and subnets.
    pub fn region_zones(&self) -> Vec<String> {
        self.world.zones().into_iter().filter(|z| matches!(z.as_str(), "1" | "2" | "3")).collect()
    }

    /// `GET /subscriptions/{sub}/providers/{ns}`: ARM's provider registration. For
    /// `Microsoft.Compute`, the `virtualMachines` resource type lists the location by its
    /// display name (`East US`) with the region's zones in `zoneMappings`.
    fn resource_provider(&self, ns: &str) -> Resp {
        let known = ["Microsoft.Compute", "Microsoft.Network"];
        let Some(ns) = known.iter().find(|k| k.eq_ignore_ascii_case(ns)) else {
            return err(
                StatusCode::NOT_FOUND,
                "InvalidResourceNamespace",
                format!("The resource namespace '{ns}' is invalid."),
            );
        };
        let location = display_location(&self.location());
        let types: Vec<Value> = if *ns == "Microsoft.Compute" {
            ["virtualMachines", "virtualMachineScaleSets", "availabilitySets"]
                .iter()
                .map(|t| {
                    let zones = if *t == "availabilitySets" { Vec::new() } else { self.region_zones() };
                    json!({
                        "resourceType": t,
                        "locations": [location],
                        "zoneMappings": [{"location": location, "zones": zones}],
                        "apiVersions": [NEWEST_API_VERSION.iter().find(|(n, _)| *n == "Microsoft.Compute").map_or("2024-07-01", |(_, v)| *v)],
                        "capabilities": "SupportsTags, SupportsLocation",
                    })
                })
                .collect()
        } else {
            ["loadBalancers", "publicIPAddresses", "privateLinkServices"]
                .iter()
                .map(|t| json!({"resourceType": t, "locations": [location], "apiVersions": ["2024-05-01"]}))
                .collect()
        };
        reply(
            StatusCode::OK,
            &json!({
                "id": format!("/subscriptions/{}/providers/{ns}", self.subscription_id()),
                "namespace": ns,
                "registrationState": "Registered",
                "registrationPolicy": "RegistrationRequired",
                "resourceTypes": types,
            }),
        )
    }

    fn rg_exists(&self, rg: &str) -> bool {
        let prefix = format!("{}/", self.rg_id(rg)).to_ascii_lowercase();
        let net = format!("/subscriptions/{}/resourcegroups/{rg}/", self.network_subscription_id())
            .to_ascii_lowercase();
        lock(&self.state).res.keys().any(|k| k.starts_with(&prefix) || k.starts_with(&net))
    }

    fn authorise(&self, req: &Request<Bytes>) -> Res<()> {
        let tok = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let now = now_secs();
        let ok = tok.is_some_and(|t| lock(&self.state).tokens.get(t).is_some_and(|exp| *exp > now));
        if ok {
            return Ok(());
        }
        let (code, msg) = match tok {
            None => (
                "AuthenticationFailed",
                "Authentication failed. The 'Authorization' header is missing.",
            ),
            Some(_) => (
                "ExpiredAuthenticationToken",
                "The access token expiry UTC time is earlier than current UTC time, or the token is not valid.",
            ),
        };
        let mut r = err(StatusCode::UNAUTHORIZED, code, msg);
        let chal = format!(
            "Bearer authorization_uri=\"https://login.microsoftonline.com/{}\", error=\"invalid_token\", error_description=\"{msg}\"",
            self.tenant_id()
        );
        if let Ok(v) = HeaderValue::from_str(&chal) {
            r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
        }
        Err(r)
    }

    fn issue_token(&self, audience: &str) -> (String, u64) {
        self.issue_token_in(audience, &self.tenant_id())
    }

    /// A token of `tenant` for `audience`.
    fn issue_token_in(&self, audience: &str, tenant: &str) -> (String, u64) {
        let life = self.o().token_lifetime.as_secs().max(1);
        let n = self.tokens_issued.fetch_add(1, Ordering::Relaxed);
        let exp = now_secs() + life;
        let header = b64url(br#"{"typ":"JWT","alg":"RS256"}"#);
        let payload = b64url(
            json!({ "aud": audience, "iss": format!("https://sts.windows.net/{tenant}/"),
                    "exp": exp, "tid": tenant, "n": n, "uti": uuid(&format!("tok{n}{exp}")) })
            .to_string()
            .as_bytes(),
        );
        let sig = b64url(uuid(&format!("sig{n}{exp}")).as_bytes());
        let t = format!("{header}.{payload}.{sig}");
        let mut st = lock(&self.state);
        st.tokens.insert(t.clone(), exp);
        st.token_tenants.insert(t.clone(), tenant.to_ascii_lowercase());
        drop(st);
        (t, life)
    }

    fn aad_token(&self, req: &Request<Bytes>) -> Resp {
        let form: BTreeMap<String, String> = url::form_urlencoded::parse(req.body())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let tenant = req.uri().path().trim_matches('/').split('/').next().unwrap_or_default();
        let aad_err = |status: StatusCode, e: &str, d: &str| {
            reply(
                status,
                &json!({ "error": e, "error_description": d, "error_codes": [7000215],
                "timestamp": "", "trace_id": uuid(d), "correlation_id": uuid(e) }),
            )
        };
        let network_tenant = self.o().network.map(|n| n.tenant_id);
        if !ids_eq(tenant, &self.tenant_id()) && !network_tenant.is_some_and(|n| ids_eq(tenant, &n))
        {
            return aad_err(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                &format!("AADSTS90002: Tenant '{tenant}' not found."),
            );
        }
        let tenant = tenant.to_string();
        if form.get("grant_type").map(String::as_str) != Some("client_credentials") {
            return aad_err(
                StatusCode::BAD_REQUEST,
                "unsupported_grant_type",
                "AADSTS70003: The app requested an unsupported grant type.",
            );
        }
        let Some(client) = form.get("client_id") else {
            return aad_err(
                StatusCode::BAD_REQUEST,
                "invalid_request",
                "AADSTS900144: The request body must contain the following parameter: 'client_id'.",
            );
        };
        let o = self.o();
        let Some(secret) = o.clients.get(client) else {
            return aad_err(
                StatusCode::BAD_REQUEST,
                "unauthorized_client",
                &format!(
                    "AADSTS700016: Application with identifier '{client}' was not found in the directory."
                ),
            );
        };
        let authenticated = if let Some(s) = form.get("client_secret") {
            s == secret
        } else if let Some(a) = form.get("client_assertion") {
            let typed = form.get("client_assertion_type").map(String::as_str)
                == Some("urn:ietf:params:oauth:client-assertion-type:jwt-bearer")
                && a.split('.').count() == 3;
            if typed && aad_cert::is_certificate_assertion(a) {
                // A certificate assertion: checked against the client's certificates.
                let certs =
                    lock(&self.state).client_certificates.get(client).cloned().unwrap_or_default();
                let now = i64::try_from(now_secs()).unwrap_or(i64::MAX);
                if let Err((code, d)) = aad_cert::check(a, client, &tenant, &certs, now) {
                    return reply(
                        StatusCode::UNAUTHORIZED,
                        &aad_cert::rejection(code, &d, &uuid(a)),
                    );
                }
                true
            } else {
                // A federated token (workload identity): any JWT-shaped assertion of the
                // right type.
                typed
            }
        } else {
            false
        };
        if !authenticated {
            return aad_err(
                StatusCode::UNAUTHORIZED,
                "invalid_client",
                "AADSTS7000215: Invalid client secret provided.",
            );
        }
        let scope = form.get("scope").cloned().unwrap_or_default();
        let (t, life) = self.issue_token_in(scope.trim_end_matches("/.default"), &tenant);
        reply(
            StatusCode::OK,
            &json!({ "token_type": "Bearer", "expires_in": life, "ext_expires_in": life, "access_token": t }),
        )
    }

    fn openid(&self, req: &Request<Bytes>) -> Resp {
        let tenant =
            req.uri().path().trim_matches('/').split('/').next().unwrap_or_default().to_string();
        let host =
            req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost");
        let base = format!("https://{host}/{tenant}");
        reply(
            StatusCode::OK,
            &json!({
                "token_endpoint": format!("{base}/oauth2/v2.0/token"),
                "token_endpoint_auth_methods_supported": ["client_secret_post", "private_key_jwt", "client_secret_basic"],
                "jwks_uri": format!("{base}/discovery/v2.0/keys"),
                "response_modes_supported": ["query", "fragment", "form_post"],
                "subject_types_supported": ["pairwise"],
                "id_token_signing_alg_values_supported": ["RS256"],
                "response_types_supported": ["code", "id_token", "code id_token", "id_token token"],
                "scopes_supported": ["openid", "profile", "email", "offline_access"],
                "issuer": format!("https://login.microsoftonline.com/{}/v2.0", self.tenant_id()),
                "authorization_endpoint": format!("{base}/oauth2/v2.0/authorize"),
                "device_authorization_endpoint": format!("{base}/oauth2/v2.0/devicecode"),
                "end_session_endpoint": format!("{base}/oauth2/v2.0/logout"),
                "tenant_region_scope": "NA",
                "cloud_instance_name": "microsoftonline.com",
            }),
        )
    }

    /// AAD instance discovery: for an authority on this emulator (its own host, a loopback
    /// address, `localhost`) or one of Microsoft's AAD hosts, the tenant's OpenID
    /// configuration URL and the host's aliases (the shape MSAL parses); any other authority
    /// is AAD's `invalid_instance` (AADSTS50049).
    fn instance_discovery(&self, req: &Request<Bytes>, qs: &[(String, String)]) -> Resp {
        let host = req_host(req);
        let auth = q(qs, "authorization_endpoint").unwrap_or_default();
        let parsed = url::Url::parse(auth).ok();
        let auth_host = parsed.as_ref().and_then(|u| {
            u.host_str().map(|h| match u.port() {
                Some(p) => format!("{h}:{p}"),
                None => h.to_string(),
            })
        });
        let tenant = parsed
            .as_ref()
            .and_then(|u| u.path_segments().and_then(|mut s| s.next()).map(str::to_string))
            .filter(|t| !t.is_empty());
        let known = |h: &str| {
            let name = h.rsplit_once(':').map_or(h, |(n, _)| n);
            h.eq_ignore_ascii_case(&host)
                || matches!(name, "localhost" | "127.0.0.1" | "[::1]")
                || AAD_HOSTS.contains(&name)
        };
        let (Some(auth_host), Some(tenant)) = (auth_host.filter(|h| known(h)), tenant) else {
            return reply(
                StatusCode::BAD_REQUEST,
                &json!({ "error": "invalid_instance",
                    "error_description": "AADSTS50049: Unknown or invalid instance.",
                    "error_codes": [50049], "timestamp": "",
                    "trace_id": uuid(auth), "correlation_id": uuid("invalid_instance") }),
            );
        };
        reply(
            StatusCode::OK,
            &json!({
                "tenant_discovery_endpoint": format!("https://{auth_host}/{tenant}/v2.0/.well-known/openid-configuration"),
                "api-version": "1.1",
                "metadata": [{ "preferred_network": auth_host, "preferred_cache": auth_host,
                    "aliases": [auth_host] }],
            }),
        )
    }

    fn imds_vm(&self) -> Option<Stored> {
        let st = lock(&self.state);
        st.imds_vm.as_ref().and_then(|k| st.res.get(k)).cloned()
    }

    fn imds_instance(&self) -> Resp {
        let Some(vm) = self.imds_vm() else {
            return reply(StatusCode::NOT_FOUND, &json!({ "error": "Not found" }));
        };
        let b = &vm.body;
        let id = b["id"].as_str().unwrap_or_default();
        let vmss =
            if vm.kind == Kind::VmssVm { id.split('/').nth(8).unwrap_or_default() } else { "" };
        let (v4, v6, mac) = self.addresses_of(&vm);
        let mut iface = json!({
            "ipv4": { "ipAddress": v4.iter().map(|(p, public)| json!({ "privateIpAddress": p, "publicIpAddress": public })).collect::<Vec<_>>(),
                      "subnet": [{ "address": "10.240.0.0", "prefix": "16" }] },
            "ipv6": { "ipAddress": v6.iter().map(|p| json!({ "privateIpAddress": p })).collect::<Vec<_>>() },
            "macAddress": mac,
        });
        if v6.is_empty() {
            iface["ipv6"] = json!({ "ipAddress": [] });
        }
        // The VM's tags, as IMDS serves them: `tags` "k:v;k2:v2" and `tagsList`.
        let vm_tags: Vec<(String, String)> = b["tags"]
            .as_object()
            .map(|m| {
                m.iter()
                    .map(|(k, v)| (k.clone(), v.as_str().unwrap_or_default().to_string()))
                    .collect()
            })
            .unwrap_or_default();
        let tags_text =
            vm_tags.iter().map(|(k, v)| format!("{k}:{v}")).collect::<Vec<_>>().join(";");
        let tags_list: Vec<Value> =
            vm_tags.iter().map(|(k, v)| json!({ "name": k, "value": v })).collect();
        reply(
            StatusCode::OK,
            &json!({
                "compute": {
                    "azEnvironment": "AzurePublicCloud",
                    "location": self.location(),
                    "name": b["name"],
                    "osProfile": { "computerName": computer_name(b), "adminUsername": "azureuser" },
                    "osType": "Linux",
                    "platformFaultDomain": vm.fault_domain.to_string(),
                    "platformUpdateDomain": "0",
                    "resourceGroupName": id.split('/').nth(4).unwrap_or_default(),
                    "resourceId": id,
                    "subscriptionId": self.subscription_id(),
                    "tags": tags_text,
                    "tagsList": tags_list,
                    "vmId": b["properties"]["vmId"],
                    "vmScaleSetName": vmss,
                    "vmSize": b["properties"]["hardwareProfile"]["vmSize"].as_str().or_else(|| b["sku"]["name"].as_str()).unwrap_or_default(),
                    "zone": b["zones"][0].as_str().unwrap_or_default(),
                },
                "network": { "interface": [iface] },
            }),
        )
    }

    /// IPv4 (private, public) pairs, IPv6 privates and the MAC of a VM's primary NIC.
    fn addresses_of(&self, vm: &Stored) -> (Vec<(String, String)>, Vec<String>, String) {
        let st = lock(&self.state);
        let (cfgs, mac) = if vm.kind == Kind::VmssVm {
            (
                vm.body["properties"]["__privateIPs"].as_array().cloned().unwrap_or_default(),
                "000D3A000000".to_string(),
            )
        } else {
            let mut nics = Vec::new();
            collect_refs(&vm.body["properties"]["networkProfile"], "networkInterfaces", &mut nics);
            let nic = nics.first().and_then(|n| st.res.get(&n.to_ascii_lowercase()));
            (
                nic.and_then(|n| n.body["properties"]["ipConfigurations"].as_array().cloned())
                    .unwrap_or_default(),
                nic.and_then(|n| n.body["properties"]["macAddress"].as_str())
                    .unwrap_or_default()
                    .replace('-', ""),
            )
        };
        let mut v4 = Vec::new();
        let mut v6 = Vec::new();
        for c in cfgs {
            let p = &c["properties"];
            let ip = p["privateIPAddress"].as_str().unwrap_or_default().to_string();
            if p["privateIPAddressVersion"].as_str() == Some("IPv6") {
                v6.push(ip);
            } else {
                let public = p["publicIPAddress"]["id"]
                    .as_str()
                    .and_then(|id| st.res.get(&id.to_ascii_lowercase()))
                    .and_then(|r| r.body["properties"]["ipAddress"].as_str())
                    .unwrap_or_default()
                    .to_string();
                v4.push((ip, public));
            }
        }
        (v4, v6, mac)
    }

    fn imds_lb(&self) -> Resp {
        // The public frontends of load balancers whose pools hold this VM.
        let Some(vm) = self.imds_vm() else {
            return reply(StatusCode::NOT_FOUND, &json!({ "error": "Not found" }));
        };
        let (v4, _, _) = self.addresses_of(&vm);
        let private = v4.first().map(|p| p.0.clone()).unwrap_or_default();
        let mut pubs = Vec::new();
        for lb in self.resources(Kind::Lb.arm_type()) {
            for fe in lb["properties"]["frontendIPConfigurations"].as_array().into_iter().flatten()
            {
                if let Some(pip) = fe["properties"]["publicIPAddress"]["id"]
                    .as_str()
                    .and_then(|p| self.resource(p))
                    && let Some(ip) = pip["properties"]["ipAddress"].as_str()
                {
                    pubs.push(json!({ "frontendIpAddress": ip, "privateIpAddress": private }));
                }
            }
        }
        reply(
            StatusCode::OK,
            &json!({ "loadbalancer": { "publicIpAddresses": pubs, "inboundRules": [], "outboundRules": [] } }),
        )
    }

    fn imds_token(&self, qs: &[(String, String)]) -> Resp {
        let Some(resource) = q(qs, "resource") else {
            return reply(
                StatusCode::BAD_REQUEST,
                &json!({ "error": "invalid_request", "error_description": "Required query variable 'resource' is missing" }),
            );
        };
        if self.imds_vm().is_none() {
            return reply(
                StatusCode::BAD_REQUEST,
                &json!({ "error": "invalid_request", "error_description": "Identity not found" }),
            );
        }
        let (t, life) = self.issue_token(resource);
        let client =
            q(qs, "client_id").map(str::to_string).unwrap_or_else(|| uuid("system-assigned"));
        reply(
            StatusCode::OK,
            &json!({
                "access_token": t, "client_id": client, "expires_in": life.to_string(),
                "expires_on": (now_secs() + life).to_string(), "ext_expires_in": life.to_string(),
                "not_before": now_secs().to_string(), "resource": resource, "token_type": "Bearer",
            }),
        )
    }

    /// ACR's `POST /oauth2/exchange`: an AAD access token this emulator issued for ACR
    /// (`https://containerregistry.azure.net`), unexpired, of this tenant, for this registry
    /// (`service` = the `Host`) → `{"refresh_token"}`.
    fn acr_exchange(&self, req: &Request<Bytes>) -> Resp {
        let form: BTreeMap<String, String> = url::form_urlencoded::parse(req.body())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect();
        let registry = acr_host(req);
        let field = |k: &str| form.get(k).map(String::as_str).unwrap_or_default();
        if !matches!(field("grant_type"), "access_token_refresh_token" | "access_token") {
            return acr_error(StatusCode::BAD_REQUEST, "UNSUPPORTED", "grant_type not supported");
        }
        if !field("service").eq_ignore_ascii_case(&registry) {
            return acr_error(
                StatusCode::BAD_REQUEST,
                "BAD_REQUEST",
                "service does not match this registry",
            );
        }
        let tenant = field("tenant");
        if !tenant.is_empty() && !ids_eq(tenant, &self.tenant_id()) {
            return acr_error(
                StatusCode::UNAUTHORIZED,
                "UNAUTHORIZED",
                "tenant does not match the token",
            );
        }
        let token = field("access_token");
        let now = now_secs();
        let issued = lock(&self.state).tokens.get(token).is_some_and(|exp| *exp > now);
        if !issued || jwt_audience(token).as_deref() != Some("https://containerregistry.azure.net")
        {
            return acr_error(
                StatusCode::UNAUTHORIZED,
                "UNAUTHORIZED",
                "the access token is not valid for this registry",
            );
        }
        let (refresh, _) = self.issue_token(&format!("acr-refresh:{registry}"));
        reply(StatusCode::OK, &json!({ "refresh_token": refresh }))
    }

    fn operation_status(&self, id: &str, result: bool) -> Resp {
        let Some(op) = self.ops.get(id) else {
            return err(
                StatusCode::NOT_FOUND,
                "OperationNotFound",
                format!("The operation '{id}' could not be found."),
            );
        };
        if result {
            return match op.phase() {
                Phase::Pending => empty(StatusCode::ACCEPTED),
                Phase::Done => empty(StatusCode::NO_CONTENT),
                Phase::Failed(m) if op.canceled() => {
                    err(StatusCode::CONFLICT, "CanceledAndSupersededDueToAnotherOperation", m)
                }
                Phase::Failed(m) => err(StatusCode::BAD_REQUEST, "OperationFailed", m),
            };
        }
        reply(StatusCode::OK, &arm_operation_status(&op))
    }

    fn list(
        &self,
        req: &Request<Bytes>,
        qs: &[(String, String)],
        kind: Kind,
        rg: Option<String>,
        parent: Option<String>,
    ) -> Resp {
        let sub =
            req.uri().path().trim_matches('/').split('/').nth(1).unwrap_or_default().to_string();
        if let Some(rg) = &rg
            && !ids_eq(rg, &self.resource_group())
            && !self.rg_exists(rg)
        {
            return err(
                StatusCode::NOT_FOUND,
                "ResourceGroupNotFound",
                format!("Resource group '{rg}' could not be found."),
            );
        }
        let expand = q(qs, "$expand").is_some_and(|e| e.eq_ignore_ascii_case("instanceView"));
        let st = lock(&self.state);
        if let Some(p) = &parent
            && !st.res.contains_key(&p.to_ascii_lowercase())
        {
            return err(
                StatusCode::NOT_FOUND,
                "ResourceNotFound",
                format!(
                    "The Resource '{}' under resource group '{}' was not found.",
                    name_of(p),
                    rg.clone().unwrap_or_default()
                ),
            );
        }
        let prefix = match (&parent, &rg) {
            (Some(p), _) => format!("{}/", p.to_ascii_lowercase()),
            (None, Some(rg)) => {
                format!("/subscriptions/{sub}/resourcegroups/{rg}/").to_ascii_lowercase()
            }
            (None, None) => format!("/subscriptions/{sub}/").to_ascii_lowercase(),
        };
        // Only the page's resources are rendered: rendering all 10 000 VMs for each page of 50
        // made a listing take minutes (ci/bench #35).
        let items: Vec<&Stored> = st
            .res
            .iter()
            .filter(|(k, r)| r.kind == kind && k.starts_with(&prefix))
            .map(|(_, r)| r)
            .collect();
        self.paged_with(req, qs, &items, |r| self.render(&st, r, expand))
    }

    /// One page of `items` (`$skiptoken` = offset), with a `nextLink` when more follow.
    fn paged(&self, req: &Request<Bytes>, qs: &[(String, String)], items: &[Value]) -> Resp {
        self.paged_with(req, qs, items, Value::clone)
    }

    /// [`Self::paged`] rendering only the page's items.
    fn paged_with<T>(
        &self,
        req: &Request<Bytes>,
        qs: &[(String, String)],
        items: &[T],
        render: impl Fn(&T) -> Value,
    ) -> Resp {
        let size = self.o().page_size.max(1);
        let skip: usize = q(qs, "$skiptoken").and_then(|s| s.parse().ok()).unwrap_or(0);
        let page: Vec<Value> = items.iter().skip(skip).take(size).map(render).collect();
        let mut body = json!({ "value": page });
        if skip + size < items.len() {
            let host = req
                .headers()
                .get(header::HOST)
                .and_then(|h| h.to_str().ok())
                .unwrap_or("localhost");
            let mut ser = url::form_urlencoded::Serializer::new(String::new());
            for (k, v) in qs.iter().filter(|(k, _)| k != "$skiptoken") {
                ser.append_pair(k, v);
            }
            ser.append_pair("$skiptoken", &(skip + size).to_string());
            body["nextLink"] =
                json!(format!("https://{host}{}?{}", req.uri().path(), ser.finish()));
        }
        reply(StatusCode::OK, &body)
    }

    /// A uniform scale set's NICs (ARM serves them under `Microsoft.Compute`, at network API
    /// version 2018-10-01): all of the set's (paged), one VM's, or one NIC. The NICs are the
    /// VMs' network profile made concrete: IDs
    /// `<vm>/networkInterfaces/<nic configuration>`, private IPs as allocated, and each IP
    /// configuration's backend pools as the VM's network profile configuration sets them.
    fn vmss_nics(
        &self,
        req: &Request<Bytes>,
        qs: &[(String, String)],
        set: &str,
        vm: Option<String>,
        nic: Option<String>,
    ) -> Resp {
        let rg = set.split('/').nth(4).unwrap_or_default().to_string();
        if !ids_eq(&rg, &self.resource_group()) && !self.rg_exists(&rg) {
            return err(
                StatusCode::NOT_FOUND,
                "ResourceGroupNotFound",
                format!("Resource group '{rg}' could not be found."),
            );
        }
        let st = lock(&self.state);
        let parent = match &vm {
            Some(i) => format!("{set}/virtualMachines/{i}"),
            None => set.to_string(),
        };
        if !st.res.contains_key(&parent.to_ascii_lowercase()) {
            drop(st);
            let kind = if vm.is_some() { Kind::VmssVm } else { Kind::Vmss };
            return self.not_found(kind, &parent);
        }
        let prefix = format!("{}/", set.to_ascii_lowercase());
        let vms: Vec<&Stored> = st
            .res
            .iter()
            .filter(|(k, r)| r.kind == Kind::VmssVm && k.starts_with(&prefix))
            .filter(|(k, _)| vm.is_none() || **k == parent.to_ascii_lowercase())
            .map(|(_, r)| r)
            .collect();
        let nics: Vec<Value> = vms.iter().map(|r| vmss_vm_nic(r)).collect();
        drop(st);
        match nic {
            Some(name) => {
                match nics.iter().find(|n| n["name"].as_str().is_some_and(|x| ids_eq(x, &name))) {
                    Some(n) => reply(StatusCode::OK, n),
                    None => err(
                        StatusCode::NOT_FOUND,
                        "ResourceNotFound",
                        format!(
                            "The Resource 'Microsoft.Network/networkInterfaces/{name}' under resource group '{rg}' was not found."
                        ),
                    ),
                }
            }
            None => self.paged(req, qs, &nics),
        }
    }

    fn not_found(&self, kind: Kind, id: &str) -> Resp {
        let rg = id.split('/').nth(4).unwrap_or_default();
        if kind == Kind::Subnet {
            return err(StatusCode::NOT_FOUND, "NotFound", format!("Resource {id} not found."));
        }
        let ty = kind.arm_type();
        let ty = if kind == Kind::VmssVm {
            "Microsoft.Compute/virtualMachineScaleSets/virtualMachines"
        } else {
            ty
        };
        err(
            StatusCode::NOT_FOUND,
            "ResourceNotFound",
            format!(
                "The Resource '{ty}/{}' under resource group '{rg}' was not found. For more details please go to https://aka.ms/ARMResourceNotFoundFix",
                name_of(id)
            ),
        )
    }

    fn get(&self, qs: &[(String, String)], kind: Kind, id: &str, instance_view: bool) -> Resp {
        let st = lock(&self.state);
        let Some(r) = st.res.get(&id.to_ascii_lowercase()) else {
            drop(st);
            return self.not_found(kind, id);
        };
        if instance_view {
            return reply(StatusCode::OK, &self.instance_view(r));
        }
        let expand = q(qs, "$expand").is_some_and(|e| e.eq_ignore_ascii_case("instanceView"));
        let body = self.render(&st, r, expand);
        let mut resp = reply(StatusCode::OK, &body);
        if let Some(e) = body.get("etag").and_then(Value::as_str)
            && let Ok(v) = HeaderValue::from_str(e)
        {
            resp.headers_mut().insert(header::ETAG, v);
        }
        resp
    }

    fn start_op(
        &self,
        req: &Request<Bytes>,
        id: &str,
        action: Action,
        kind: Kind,
    ) -> (String, Vec<(&'static str, String)>) {
        let op = self.ops.start(kind, id, action);
        let host = req
            .headers()
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or("localhost")
            .to_string();
        let sub = id.split('/').nth(2).map_or_else(|| self.subscription_id(), str::to_string);
        let base = format!(
            "https://{host}/subscriptions/{sub}/providers/{}/locations/{}",
            kind.namespace(),
            self.location()
        );
        let av = query(req)
            .into_iter()
            .find(|(k, _)| k == "api-version")
            .map(|(_, v)| v)
            .unwrap_or_default();
        let mut h =
            vec![("azure-asyncoperation", format!("{base}/operations/{}?api-version={av}", op.id))];
        if action == Action::Delete {
            h.push(("location", format!("{base}/operationResults/{}?api-version={av}", op.id)));
        }
        h.push(("retry-after", "1".into()));
        (op.id, h)
    }

    fn check_precondition(
        &self,
        req: &Request<Bytes>,
        current: Option<&Stored>,
        id: &str,
    ) -> Res<()> {
        let Some(want) = req.headers().get(header::IF_MATCH).and_then(|v| v.to_str().ok()) else {
            return Ok(());
        };
        if want == "*" && current.is_some() {
            return Ok(());
        }
        let have = current.map(|c| etag_str(c.etag, c.body["id"].as_str().unwrap_or(id)));
        let strip = |s: &str| s.trim_start_matches("W/").trim_matches('"').to_string();
        if have.is_some_and(|h| strip(&h) == strip(want)) {
            return Ok(());
        }
        Err(err(
            StatusCode::PRECONDITION_FAILED,
            "PreconditionFailed",
            format!(
                "Operation failed because the etag '{want}' given in the If-Match header does not match the resource's current etag."
            ),
        ))
    }

    fn put(&self, req: &Request<Bytes>, kind: Kind, id: &str) -> Resp {
        let mut body: Value = match serde_json::from_slice(req.body()) {
            Ok(v @ Value::Object(_)) => v,
            Ok(_) | Err(_) => {
                return bad(
                    "InvalidRequestContent",
                    "The request content was invalid and could not be deserialized.",
                );
            }
        };
        let key = id.to_ascii_lowercase();
        let mut st = lock(&self.state);
        let current = st.res.get(&key).cloned();
        if let Err(r) = self.check_precondition(req, current.as_ref(), id) {
            return r;
        }
        if let Some((running, action)) = current.as_ref().and_then(|c| c.op.clone()) {
            // Network (NRP) cancels a running PUT when another PUT of the resource arrives: the
            // first operation ends `Canceled` (`CanceledAndSupersededDueToAnotherOperation`) and
            // the second one proceeds. Anything else (a delete running, Compute) is a 409.
            let supersede = kind.namespace() == "Microsoft.Network"
                && action != Action::Delete
                && req.method() == Method::PUT
                && self.ops.cancel(
                    &running,
                    format!(
                        "Operation PutOperation ({running}) was canceled and superseded by another PUT of {id}."
                    ),
                );
            if !supersede {
                return err(
                    StatusCode::CONFLICT,
                    "AnotherOperationInProgress",
                    format!(
                        "Another operation on this or dependent resource is in progress. To retry later, please use the Retry-After header. Resource: {id}"
                    ),
                );
            }
        }
        if req.method() == Method::PATCH {
            let Some(c) = &current else { return self_not_found(self, kind, id) };
            let mut merged = c.body.clone();
            merge(&mut merged, &body);
            body = merged;
        }
        // Compute's PUT of a scale set or a scale-set VM keeps what the body omits and ignores
        // read-only properties (upstream's partial bodies rely on it: a VM's `networkProfile`
        // survives a body that only sets `networkProfileConfiguration`).
        if req.method() == Method::PUT
            && matches!(kind, Kind::Vmss | Kind::VmssVm)
            && let Some(c) = &current
        {
            strip_compute_read_only(&mut body);
            let mut merged = c.body.clone();
            merge(&mut merged, &body);
            body = merged;
        }
        if matches!(kind, Kind::VmssVm) && current.is_none() {
            drop(st);
            return self.not_found(kind, id);
        }
        // Canonical identity fields; read-only ones dropped.
        let canonical_id = current
            .as_ref()
            .and_then(|c| c.body["id"].as_str().map(str::to_string))
            .unwrap_or_else(|| id.to_string());
        body["id"] = json!(canonical_id);
        body["name"] = json!(name_of(&canonical_id));
        body["type"] = json!(kind.arm_type());
        if let Some(m) = body.as_object_mut() {
            m.remove("etag");
        }
        if kind != Kind::Subnet && body.get("location").is_none() {
            if let Some(c) = &current {
                body["location"] = c.body["location"].clone();
            } else {
                return bad(
                    "LocationRequired",
                    "The location property is required for this definition.",
                );
            }
        }
        if let Err(r) = self.validate(&mut st, kind, &canonical_id, &mut body, current.as_ref()) {
            return r;
        }
        drop(st);
        let action = if current.is_some() { Action::Update } else { Action::Create };
        let (op, headers) = self.start_op(req, &canonical_id, action, kind);
        props_mut(&mut body).insert("provisioningState".into(), json!("Updating"));
        let mut st = lock(&self.state);
        let (etag, power, fd) = current
            .as_ref()
            .map(|c| (c.etag + 1, c.power, c.fault_domain))
            .unwrap_or((1, PowerState::Running, 0));
        // Emulator-only fields survive a client's PUT.
        if let Some(c) = &current
            && let Some(p) = c.body["properties"].get("__privateIPs")
        {
            props_mut(&mut body).insert("__privateIPs".into(), p.clone());
        }
        let s = Stored { kind, body, etag, op: Some((op, action)), power, fault_domain: fd };
        let out = self.render(&st, &s, false);
        st.res.insert(key, s);
        let bare = current.is_none() && st.put_without_operation_header;
        drop(st);
        let mut resp =
            reply(if current.is_some() { StatusCode::OK } else { StatusCode::CREATED }, &out);
        for (k, v) in headers.into_iter().filter(|_| !bare) {
            if let Ok(v) = HeaderValue::from_str(&v) {
                resp.headers_mut().insert(k, v);
            }
        }
        resp
    }

    fn delete(&self, req: &Request<Bytes>, kind: Kind, id: &str) -> Resp {
        let key = id.to_ascii_lowercase();
        let st = lock(&self.state);
        // A scale-set VM of a scale set that does not exist: the parent is not found.
        if kind == Kind::VmssVm
            && let Some(i) = key.rfind("/virtualmachines/")
            && !st.res.contains_key(&key[..i])
        {
            drop(st);
            return self.not_found(Kind::Vmss, &id[..i]);
        }
        // ARM's contract: deleting what does not exist (in a resource group that does) is a
        // 204 with nothing to poll.
        let Some(cur) = st.res.get(&key).cloned() else {
            return empty(StatusCode::NO_CONTENT);
        };
        if let Err(r) = self.check_precondition(req, Some(&cur), id) {
            return r;
        }
        if cur.op.is_some() {
            return err(
                StatusCode::CONFLICT,
                "AnotherOperationInProgress",
                format!(
                    "Another operation on this or dependent resource is in progress. Resource: {id}"
                ),
            );
        }
        match kind {
            Kind::Pip => {
                for other in st.res.values() {
                    let k = match other.kind {
                        Kind::Lb => "frontendIPConfigurations",
                        Kind::Nic => "ipConfigurations",
                        _ => continue,
                    };
                    for c in other.body["properties"][k].as_array().into_iter().flatten() {
                        if c["properties"]["publicIPAddress"]["id"]
                            .as_str()
                            .is_some_and(|p| ids_eq(p, id))
                        {
                            return bad(
                                "PublicIPAddressCannotBeDeleted",
                                format!(
                                    "Public IP address {id} can not be deleted since it is still allocated to resource {}. In order to delete the public IP, disassociate/detach the Public IP address from the resource.",
                                    c["id"].as_str().unwrap_or_default()
                                ),
                            );
                        }
                    }
                }
            }
            Kind::Lb => {
                if let Err(r) = pls::check_lb_delete(&st, &cur.body) {
                    return r;
                }
                for pool in child_names(&cur.body, "backendAddressPools") {
                    let pid = format!(
                        "{}/backendAddressPools/{pool}",
                        cur.body["id"].as_str().unwrap_or(id)
                    );
                    if let Some(user) = pool_user(&st, &pid) {
                        return bad(
                            "InUseBackendAddressPoolCannotBeDeleted",
                            format!(
                                "Backend address pool {pid} is in use by {user} and cannot be deleted."
                            ),
                        );
                    }
                }
            }
            Kind::Nic => {
                if let Some(vm) = cur.body["properties"]["virtualMachine"]["id"].as_str()
                    && st.res.contains_key(&vm.to_ascii_lowercase())
                {
                    return bad(
                        "NicInUse",
                        format!("Network Interface {id} is used by existing resource {vm}."),
                    );
                }
            }
            _ => {}
        }
        drop(st);
        let (op, headers) = self.start_op(req, id, Action::Delete, kind);
        let mut st = lock(&self.state);
        if let Some(r) = st.res.get_mut(&key) {
            r.op = Some((op, Action::Delete));
            props_mut(&mut r.body).insert("provisioningState".into(), json!("Deleting"));
        }
        drop(st);
        let mut resp = empty(StatusCode::ACCEPTED);
        for (k, v) in headers {
            if let Ok(v) = HeaderValue::from_str(&v) {
                resp.headers_mut().insert(k, v);
            }
        }
        resp
    }

    /// Checks a PUT body as ARM does and fills in ids and allocated addresses.
    fn validate(
        &self,
        st: &mut State,
        kind: Kind,
        id: &str,
        body: &mut Value,
        current: Option<&Stored>,
    ) -> Res<()> {
        let invalid_ref = |what: &str, r: &str| {
            bad(
                "InvalidResourceReference",
                format!(
                    "Resource {r} referenced by resource {id} was not found. Please make sure that the referenced resource exists, and that both resources are in the same region. ({what})"
                ),
            )
        };
        match kind {
            Kind::Lb => {
                pls::check_frontends_kept(st, body, current.map(|c| &c.body))?;
                default_sku_tier(body);
                for key in [
                    "frontendIPConfigurations",
                    "backendAddressPools",
                    "probes",
                    "loadBalancingRules",
                    "inboundNatRules",
                    "outboundRules",
                ] {
                    let mut seen = std::collections::BTreeSet::new();
                    for c in children_mut(body, key) {
                        name_child(c, id, key, &mut seen)?;
                        if let Some(p) = c.get_mut("properties").and_then(Value::as_object_mut) {
                            p.insert("provisioningState".into(), json!("Succeeded"));
                            // Read-only back-references are computed by ARM.
                            let ro: &[&str] = match key {
                                "frontendIPConfigurations" => &[
                                    "loadBalancingRules",
                                    "inboundNatRules",
                                    "outboundRules",
                                    "inboundNatPools",
                                ],
                                "backendAddressPools" => &[
                                    "backendIPConfigurations",
                                    "loadBalancingRules",
                                    "outboundRule",
                                    "outboundRules",
                                    "inboundNatRules",
                                ],
                                "probes" => &["loadBalancingRules"],
                                _ => &[],
                            };
                            for k in ro {
                                p.remove(*k);
                            }
                        }
                    }
                }
                let names = |k: &str| -> Vec<String> {
                    child_names(body, k)
                        .iter()
                        .map(|n| format!("{id}/{k}/{n}").to_ascii_lowercase())
                        .collect()
                };
                let (fes, pools, probes) = (
                    names("frontendIPConfigurations"),
                    names("backendAddressPools"),
                    names("probes"),
                );
                // What the frontends' static private IPs were before this PUT: only an address
                // the PUT sets or changes is checked (an allocation ARM made stays valid).
                let before = current
                    .map(|c| config_addresses(&c.body, "frontendIPConfigurations"))
                    .unwrap_or_default();
                for fe in children_mut(body, "frontendIPConfigurations") {
                    let fe_id = fe["id"].as_str().unwrap_or_default().to_string();
                    let p = &mut fe["properties"];
                    if p["publicIPAddress"]["id"].is_string() && p["subnet"]["id"].is_string() {
                        return Err(bad(
                            "FrontendIPConfigHasBothSubnetAndPublicIP",
                            format!(
                                "Frontend IP Configuration {fe_id} must not reference both a Subnet and a Public IP Address."
                            ),
                        ));
                    }
                    if let Some(pip) = p["publicIPAddress"]["id"].as_str() {
                        if st.res.get(&pip.to_ascii_lowercase()).is_none_or(|r| r.kind != Kind::Pip)
                        {
                            return Err(invalid_ref("publicIPAddress", pip));
                        }
                    } else if let Some(sn) = p["subnet"]["id"].as_str().map(str::to_string) {
                        if st
                            .res
                            .get(&sn.to_ascii_lowercase())
                            .is_none_or(|r| r.kind != Kind::Subnet)
                        {
                            return Err(invalid_ref("subnet", &sn));
                        }
                        if p["privateIPAddress"].as_str().is_none_or(str::is_empty) {
                            let n = st.next_private.entry(sn.to_ascii_lowercase()).or_insert(4);
                            *n += 1;
                            let prefix = st
                                .res
                                .get(&sn.to_ascii_lowercase())
                                .and_then(|r| r.body["properties"]["addressPrefix"].as_str())
                                .unwrap_or("10.240.0.0/16")
                                .to_string();
                            let octs: Vec<&str> = prefix.split(['.', '/']).collect();
                            let addr = format!(
                                "{}.{}.{}.{}",
                                octs.first().unwrap_or(&"10"),
                                octs.get(1).unwrap_or(&"240"),
                                200 + (*n >> 8).min(50),
                                *n & 255
                            );
                            p["privateIPAddress"] = json!(addr);
                            if p["privateIPAllocationMethod"].is_null() {
                                p["privateIPAllocationMethod"] = json!("Dynamic");
                            }
                        } else if let Some(addr) = p["privateIPAddress"].as_str()
                            && before.get(&fe_id.to_ascii_lowercase()).map(String::as_str)
                                != Some(addr)
                        {
                            check_private_ip(st, id, &fe_id, &sn, addr)?;
                        }
                    } else {
                        return Err(bad(
                            "FrontendIPConfigHasNoSubnetOrPublicIP",
                            format!(
                                "Frontend IP Configuration {fe_id} must reference either a Subnet or a Public IP Address."
                            ),
                        ));
                    }
                }
                for rule in children_mut(body, "loadBalancingRules") {
                    let p = &rule["properties"];
                    let fe = p["frontendIPConfiguration"]["id"].as_str().unwrap_or_default();
                    if !fes.contains(&fe.to_ascii_lowercase()) {
                        return Err(invalid_ref("frontendIPConfiguration", fe));
                    }
                    let mut rp = Vec::new();
                    collect_refs(p, "backendAddressPool", &mut rp);
                    collect_refs(p, "backendAddressPools", &mut rp);
                    for pl in rp {
                        if !pools.contains(&pl.to_ascii_lowercase()) {
                            return Err(invalid_ref("backendAddressPool", &pl));
                        }
                    }
                    if let Some(pr) = p["probe"]["id"].as_str()
                        && !probes.contains(&pr.to_ascii_lowercase())
                    {
                        return Err(invalid_ref("probe", pr));
                    }
                    for f in ["protocol", "frontendPort", "backendPort"] {
                        if p[f].is_null() {
                            return Err(bad(
                                "InvalidRequestFormat",
                                format!("Load balancing rule {} of {id} has no {f}.", rule["name"]),
                            ));
                        }
                    }
                }
                for pr in children_mut(body, "probes") {
                    let p = &pr["properties"];
                    if p["protocol"].is_null() || p["port"].is_null() {
                        return Err(bad(
                            "InvalidRequestFormat",
                            format!("Probe {} of {id} needs protocol and port.", pr["name"]),
                        ));
                    }
                    if p["protocol"].as_str().is_some_and(|x| !x.eq_ignore_ascii_case("tcp"))
                        && p["requestPath"].as_str().is_none_or(str::is_empty)
                    {
                        return Err(bad(
                            "InvalidRequestFormat",
                            format!(
                                "Probe {} of {id} with protocol {} needs a requestPath.",
                                pr["name"], p["protocol"]
                            ),
                        ));
                    }
                }
                // A pool removed while still in use.
                if let Some(c) = current {
                    for pool in child_names(&c.body, "backendAddressPools") {
                        let pid = format!("{id}/backendAddressPools/{pool}");
                        if !pools.contains(&pid.to_ascii_lowercase())
                            && let Some(user) = pool_user(st, &pid)
                        {
                            return Err(bad(
                                "InUseBackendAddressPoolCannotBeDeleted",
                                format!(
                                    "Backend address pool {pid} is in use by {user} and cannot be deleted."
                                ),
                            ));
                        }
                    }
                }
                check_load_balancer(st, id, body, current)?;
            }
            Kind::Pip => {
                check_public_ip(id, body, current)?;
                let p = props_mut(body);
                if !p.contains_key("publicIPAllocationMethod") {
                    p.insert("publicIPAllocationMethod".into(), json!("Static"));
                }
                let version = p
                    .get("publicIPAddressVersion")
                    .and_then(Value::as_str)
                    .unwrap_or("IPv4")
                    .to_string();
                if !p.contains_key("publicIPAddressVersion") {
                    p.insert("publicIPAddressVersion".into(), json!("IPv4"));
                }
                let existing = current
                    .and_then(|c| c.body["properties"]["ipAddress"].as_str().map(str::to_string));
                match existing {
                    Some(ip) => {
                        p.insert("ipAddress".into(), json!(ip));
                    }
                    None if p
                        .get("ipAddress")
                        .and_then(Value::as_str)
                        .is_none_or(str::is_empty) =>
                    {
                        st.next_pip += 1;
                        let n = st.next_pip;
                        let ip = if version.eq_ignore_ascii_case("IPv6") {
                            format!("2603:1030:{:x}::{:x}", n >> 16, n & 0xffff)
                        } else {
                            ipv4(n)
                        };
                        p.insert("ipAddress".into(), json!(ip));
                    }
                    None => {}
                }
                p.remove("ipConfiguration");
                if body.get("sku").is_none() {
                    body["sku"] = json!({ "name": "Standard", "tier": "Regional" });
                }
                default_sku_tier(body);
            }
            Kind::Nsg => {
                let mut seen: BTreeMap<(String, i64), String> = BTreeMap::new();
                for r in children_mut(body, "securityRules") {
                    let n = r["name"].as_str().unwrap_or_default().to_string();
                    r["id"] = json!(format!("{id}/securityRules/{n}"));
                    let p = &mut r["properties"];
                    let prio = p["priority"].as_i64().unwrap_or(-1);
                    if !(100..=4096).contains(&prio) {
                        return Err(bad(
                            "SecurityRuleInvalidPriority",
                            format!(
                                "Security rule {n} has invalid Priority. Value provided: {prio} Allowed range 100-4096."
                            ),
                        ));
                    }
                    let dir = p["direction"].as_str().unwrap_or("Inbound").to_string();
                    if let Some(other) = seen.insert((dir.clone(), prio), n.clone()) {
                        return Err(bad(
                            "SecurityRuleConflict",
                            format!(
                                "Security rule {n} conflicts with rule {other}. Rules cannot have the same Priority and Direction."
                            ),
                        ));
                    }
                    if p["access"].is_null() || p["protocol"].is_null() {
                        return Err(bad(
                            "SecurityRuleParameterContainsUnsupportedValue",
                            format!("Security rule {n} needs access and protocol."),
                        ));
                    }
                    p["provisioningState"] = json!("Succeeded");
                }
                if let Some(c) = current {
                    props_mut(body).insert(
                        "defaultSecurityRules".into(),
                        c.body["properties"]["defaultSecurityRules"].clone(),
                    );
                }
            }
            Kind::RouteTable => {
                for r in children_mut(body, "routes") {
                    let n = r["name"].as_str().unwrap_or_default().to_string();
                    r["id"] = json!(format!("{id}/routes/{n}"));
                    let p = &mut r["properties"];
                    if p["addressPrefix"].as_str().is_none_or(str::is_empty) {
                        return Err(bad(
                            "InvalidRequestFormat",
                            format!("Route {n} has no addressPrefix."),
                        ));
                    }
                    if p["nextHopType"].as_str() == Some("VirtualAppliance")
                        && p["nextHopIpAddress"].as_str().is_none_or(str::is_empty)
                    {
                        return Err(bad(
                            "NextHopIpAddressRequiredForVirtualAppliance",
                            format!(
                                "Route {n} with next hop type VirtualAppliance must have a next hop IP address."
                            ),
                        ));
                    }
                    p["provisioningState"] = json!("Succeeded");
                }
            }
            Kind::Nic => {
                let before: BTreeMap<String, String> = current
                    .map(|c| config_addresses(&c.body, "ipConfigurations"))
                    .unwrap_or_default();
                for c in children_mut(body, "ipConfigurations") {
                    let n = c["name"].as_str().unwrap_or_default().to_string();
                    c["id"] = json!(format!("{id}/ipConfigurations/{n}"));
                    let cid = format!("{id}/ipConfigurations/{n}");
                    if let (Some(addr), Some(sn)) = (
                        c["properties"]["privateIPAddress"].as_str().filter(|a| !a.is_empty()),
                        c["properties"]["subnet"]["id"].as_str(),
                    ) && before.get(&cid.to_ascii_lowercase()).map(String::as_str) != Some(addr)
                    {
                        check_private_ip(st, id, &cid, sn, addr)?;
                    }
                    let mut refs = Vec::new();
                    collect_refs(&c["properties"], "loadBalancerBackendAddressPools", &mut refs);
                    for r in refs {
                        if !pool_exists(st, &r) {
                            return Err(invalid_ref("loadBalancerBackendAddressPools", &r));
                        }
                    }
                }
                if let Some(c) = current {
                    // A NIC keeps its VM and MAC (read-only).
                    for ro in ["virtualMachine", "macAddress"] {
                        if let Some(v) = c.body["properties"].get(ro) {
                            props_mut(body).insert(ro.into(), v.clone());
                        }
                    }
                }
            }
            Kind::VmssVm | Kind::Vmss => {
                let mut refs = Vec::new();
                collect_refs(&body["properties"], "loadBalancerBackendAddressPools", &mut refs);
                for r in refs {
                    if !pool_exists(st, &r) {
                        return Err(invalid_ref("loadBalancerBackendAddressPools", &r));
                    }
                }
                if let Some(c) = current {
                    for ro in ["vmId", "osProfile", "instanceView"] {
                        if let Some(v) = c.body["properties"].get(ro) {
                            props_mut(body).insert(ro.into(), v.clone());
                        }
                    }
                    for ro in ["instanceId", "sku", "zones"] {
                        if let Some(v) = c.body.get(ro) {
                            body[ro] = v.clone();
                        }
                    }
                }
            }
            Kind::Subnet => pls::check_subnet(st, id, body)?,
            Kind::Pls => {
                pls::validate(st, id, body, current.map(|c| &c.body), &self.location())?;
            }
            Kind::Vm | Kind::Vnet => {}
        }
        Ok(())
    }

    fn state_json(&self) -> Value {
        self.settle();
        let st = lock(&self.state);
        let res: Vec<Value> = st.res.values().map(|r| self.render(&st, r, true)).collect();
        json!({ "resources": res, "operations": self.ops.state(), "tokens_issued": self.tokens_issued() })
    }
}

/// A uniform scale-set VM's NIC as ARM shows it: its network profile's NIC reference, with
/// the private IPs the VM was given (`__privateIPs`) and the backend pools its network
/// profile configuration sets on each IP configuration.
/// The hosts of Microsoft's own AAD instances (instance discovery vouches for them).
const AAD_HOSTS: &[&str] = &[
    "login.microsoftonline.com",
    "login.windows.net",
    "login.microsoft.com",
    "sts.windows.net",
    "login.chinacloudapi.cn",
    "login.microsoftonline.us",
    "login-us.microsoftonline.com",
];

/// The names ARM's metadata lists this emulator's environment under: ARM's own name for the
/// public cloud and the names `azure.json`'s `cloud` takes (upstream matches it, any case).
pub const ARM_CLOUD_NAMES: &[&str] = &["AzureCloud", "AzurePublicCloud", "AzureStackCloud"];

/// The request's `Host` (the emulator serves every name on one port).
fn req_host(req: &Request<Bytes>) -> String {
    req.headers().get(header::HOST).and_then(|h| h.to_str().ok()).unwrap_or("localhost").to_string()
}

/// ARM's `GET /metadata/endpoints`: with `api-version` 2019-05-01 or later, the JSON array of
/// cloud environments (one per [`ARM_CLOUD_NAMES`] entry, each pointing the resource manager
/// and the AAD login endpoint at this emulator, with the management audiences); without
/// one (or an older one), the legacy single object (`galleryEndpoint`, `graphEndpoint`,
/// `portalEndpoint`, `authentication`). Needs no token, as ARM's does not.
fn arm_metadata(req: &Request<Bytes>, qs: &[(String, String)]) -> Resp {
    let base = format!("https://{}/", req_host(req));
    let audiences =
        json!(["https://management.core.windows.net/", "https://management.azure.com/"]);
    let modern = q(qs, "api-version").is_some_and(|v| v >= "2019-05-01");
    if !modern {
        return reply(
            StatusCode::OK,
            &json!({
                "galleryEndpoint": "https://gallery.azure.com/",
                "graphEndpoint": "https://graph.windows.net/",
                "portalEndpoint": "https://portal.azure.com/",
                "authentication": { "loginEndpoint": base, "audiences": audiences },
            }),
        );
    }
    let envs: Vec<Value> = ARM_CLOUD_NAMES
        .iter()
        .map(|name| {
            json!({
                "portal": "https://portal.azure.com",
                "authentication": { "loginEndpoint": base, "audiences": audiences,
                    "tenant": "common", "identityProvider": "AAD" },
                "media": "https://rest.media.azure.net",
                "graphAudience": "https://graph.windows.net/",
                "graph": "https://graph.windows.net/",
                "name": name,
                "suffixes": { "azureDataLakeStoreFileSystem": "azuredatalakestore.net",
                    "acrLoginServer": "azurecr.io", "sqlServerHostname": "database.windows.net",
                    "azureDataLakeAnalyticsCatalogAndJob": "azuredatalakeanalytics.net",
                    "keyVaultDns": "vault.azure.net", "storage": "core.windows.net",
                    "azureFrontDoorEndpointSuffix": "azurefd.net" },
                "batch": "https://batch.core.windows.net/",
                "resourceManager": base,
                "vmImageAliasDoc": "https://raw.githubusercontent.com/Azure/azure-rest-api-specs/master/arm-compute/quickstart-templates/aliases.json",
                "activeDirectoryDataLake": "https://datalake.azure.net/",
                "sqlManagement": "https://management.core.windows.net:8443/",
                "microsoftGraphResourceId": "https://graph.microsoft.com/",
                "appInsightsResourceId": "https://api.applicationinsights.io",
                "appInsightsTelemetryChannelResourceId": "https://dc.applicationinsights.azure.com/v2/track",
                "attestationResourceId": "https://attest.azure.net",
                "synapseAnalyticsResourceId": "https://dev.azuresynapse.net",
                "logAnalyticsResourceId": "https://api.loganalytics.io",
                "ossrDbmsResourceId": "https://ossrdbms-aad.database.windows.net",
            })
        })
        .collect();
    reply(StatusCode::OK, &Value::Array(envs))
}

/// The registry a request is for: its `Host` (the emulator serves every host on one port).
fn acr_host(req: &Request<Bytes>) -> String {
    req.headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .or_else(|| req.uri().authority().map(|a| a.to_string()))
        .unwrap_or_default()
}

/// A registry's error reply (Docker registry API shape).
fn acr_error(status: StatusCode, code: &str, message: &str) -> Resp {
    let mut r =
        reply(status, &json!({ "errors": [{ "code": code, "message": message, "detail": null }] }));
    r.headers_mut()
        .insert("docker-distribution-api-version", HeaderValue::from_static("registry/2.0"));
    r
}

/// ACR's `GET /v2/` without credentials: 401 with the AAD challenge naming this registry.
fn acr_challenge(req: &Request<Bytes>) -> Resp {
    let host = acr_host(req);
    let mut r = acr_error(
        StatusCode::UNAUTHORIZED,
        "UNAUTHORIZED",
        "authentication required, visit https://aka.ms/acr/authorization for more information.",
    );
    let chal = format!("Bearer realm=\"https://{host}/oauth2/token\",service=\"{host}\"");
    if let Ok(v) = HeaderValue::from_str(&chal) {
        r.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    r
}

/// The `aud` claim of a JWT-shaped token (no signature check).
fn jwt_audience(token: &str) -> Option<String> {
    let payload = token.split('.').nth(1)?;
    let out = aad_cert::b64url_decode(payload)?;
    let claims: Value = serde_json::from_slice(&out).ok()?;
    claims.get("aud")?.as_str().map(str::to_string)
}

fn vmss_vm_nic(r: &Stored) -> Value {
    let vm_id = r.body["id"].as_str().unwrap_or_default();
    let nic_id = r.body["properties"]["networkProfile"]["networkInterfaces"][0]["id"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| format!("{vm_id}/networkInterfaces/{}", name_of(vm_id)));
    let nic_name = name_of(&nic_id).to_string();
    let profile =
        r.body["properties"]["networkProfileConfiguration"]["networkInterfaceConfigurations"]
            .as_array()
            .and_then(|a| a.iter().find(|c| c["name"].as_str() == Some(nic_name.as_str())))
            .cloned()
            .unwrap_or(Value::Null);
    let configs: Vec<Value> = r.body["properties"]["__privateIPs"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|c| {
            let name = c["name"].as_str().unwrap_or("ipconfig1");
            let mut props = c["properties"].clone();
            props["provisioningState"] = json!("Succeeded");
            let pools = profile["properties"]["ipConfigurations"]
                .as_array()
                .and_then(|a| a.iter().find(|p| p["name"].as_str() == Some(name)))
                .map(|p| p["properties"]["loadBalancerBackendAddressPools"].clone())
                .filter(|p| p.is_array());
            if let Some(p) = pools {
                props["loadBalancerBackendAddressPools"] = p;
            }
            json!({ "id": format!("{nic_id}/ipConfigurations/{name}"), "name": name, "properties": props })
        })
        .collect();
    let mac = fnv(vm_id);
    json!({
        "id": nic_id, "name": nic_name, "location": r.body["location"],
        "properties": {
            "provisioningState": "Succeeded", "primary": true,
            "macAddress": format!("00-0D-3A-{:02X}-{:02X}-{:02X}", (mac >> 16) & 255, (mac >> 8) & 255, mac & 255),
            "enableAcceleratedNetworking": false, "enableIPForwarding": false,
            "ipConfigurations": configs, "virtualMachine": { "id": vm_id },
        }
    })
}

/// What Compute does when a VM's or a scale-set VM's delete completes. A VM's NICs stay
/// (detached: no `virtualMachine`, pool memberships and public IPs kept) unless the VM's
/// reference to them says `deleteOption: Delete`; a scale-set VM's NIC is part of it, and the
/// scale set's capacity drops by one.
fn after_compute_delete(st: &mut State, gone: &Stored) {
    match gone.kind {
        Kind::Vm => {
            let refs: Vec<(String, bool)> =
                gone.body["properties"]["networkProfile"]["networkInterfaces"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|n| {
                        let id = n["id"].as_str()?.to_ascii_lowercase();
                        let delete = n["properties"]["deleteOption"]
                            .as_str()
                            .is_some_and(|d| d.eq_ignore_ascii_case("Delete"));
                        Some((id, delete))
                    })
                    .collect();
            for (nic, delete) in refs {
                if delete {
                    st.res.remove(&nic);
                } else if let Some(n) = st.res.get_mut(&nic) {
                    props_mut(&mut n.body).remove("virtualMachine");
                    n.etag += 1;
                }
            }
        }
        Kind::VmssVm => {
            let id = gone.body["id"].as_str().unwrap_or_default().to_ascii_lowercase();
            if let Some(i) = id.rfind("/virtualmachines/")
                && let Some(ss) = st.res.get_mut(&id[..i])
            {
                let n = ss.body["sku"]["capacity"].as_u64().unwrap_or(1);
                ss.body["sku"]["capacity"] = json!(n.saturating_sub(1));
            }
        }
        _ => {}
    }
}

fn self_not_found(c: &AzureCloud, kind: Kind, id: &str) -> Resp {
    c.not_found(kind, id)
}

fn stored(kind: Kind, body: Value) -> Stored {
    Stored { kind, body, etag: 1, op: None, power: PowerState::Running, fault_domain: 0 }
}

fn computer_name(b: &Value) -> Option<&str> {
    b["properties"]["osProfile"]["computerName"].as_str()
}

fn pool_exists(st: &State, pool_id: &str) -> bool {
    let lower = pool_id.to_ascii_lowercase();
    let Some((lb, _)) = lower.split_once("/backendaddresspools/") else { return false };
    st.res.get(lb).is_some_and(|r| {
        r.kind == Kind::Lb
            && child_names(&r.body, "backendAddressPools").iter().any(|n| {
                lower.ends_with(&format!("/backendaddresspools/{}", n.to_ascii_lowercase()))
            })
    })
}

/// The backend pools a scale set's model (`key`: its lower-case ID) lists on its primary
/// NIC configuration's primary IP configuration: what Compute gives a new instance.
fn model_pools(st: &State, key: &str) -> Vec<Value> {
    let Some(ss) = st.res.get(key) else { return Vec::new() };
    let nics = ss.body["properties"]["virtualMachineProfile"]["networkProfile"]
        ["networkInterfaceConfigurations"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let primary = |v: &Value| v["properties"]["primary"] == json!(true);
    let nic = if nics.len() == 1 { nics.first() } else { nics.iter().find(|n| primary(n)) };
    let configs = nic
        .and_then(|n| n["properties"]["ipConfigurations"].as_array().cloned())
        .unwrap_or_default();
    let cfg =
        if configs.len() == 1 { configs.first() } else { configs.iter().find(|c| primary(c)) };
    cfg.and_then(|c| c["properties"]["loadBalancerBackendAddressPools"].as_array().cloned())
        .unwrap_or_default()
        .into_iter()
        .filter(|p| p["id"].as_str().is_some_and(|id| pool_exists(st, id)))
        .map(|p| json!({ "id": p["id"] }))
        .collect()
}

/// The backend pools a scale-set VM's IP configurations reference, with each IP
/// configuration's ARM ID as ARM lists it in a pool's `backendIPConfigurations`:
/// `<vm>/networkInterfaces/<nic configuration>/ipConfigurations/<ip configuration>`.
fn vmss_vm_pool_refs(vm: &Value) -> Vec<(String, String)> {
    let id = vm["id"].as_str().unwrap_or_default();
    let mut out = Vec::new();
    let nics = vm["properties"]["networkProfileConfiguration"]["networkInterfaceConfigurations"]
        .as_array()
        .into_iter()
        .flatten();
    for nic in nics {
        let nic_name = nic["name"].as_str().unwrap_or_default();
        for c in nic["properties"]["ipConfigurations"].as_array().into_iter().flatten() {
            let mut refs = Vec::new();
            collect_refs(&c["properties"], "loadBalancerBackendAddressPools", &mut refs);
            let cfg = c["name"].as_str().unwrap_or_default();
            for p in refs {
                out.push((format!("{id}/networkInterfaces/{nic_name}/ipConfigurations/{cfg}"), p));
            }
        }
    }
    out
}

/// The newest `api-version` the emulator serves per namespace (the versions of the official
/// SDKs it is checked with, `armnetwork/v9` and `armcompute/v7`; anything the provider and
/// upstream's CCM use is older).
const NEWEST_API_VERSION: &[(&str, &str)] =
    &[("Microsoft.Network", "2025-05-01"), ("Microsoft.Compute", "2025-04-01")];
/// The oldest `api-version` of either namespace.
const OLDEST_API_VERSION: &str = "2015-05-01";

/// Whether `v` has ARM's form of an API version: `YYYY-MM-DD`, optionally `-preview` (or
/// another lower-case suffix).
fn api_version_well_formed(v: &str) -> bool {
    let (date, suffix) = match v.get(10..) {
        Some("") => (v, None),
        Some(rest) => (&v[..10], Some(rest)),
        None => return false,
    };
    let b = date.as_bytes();
    let digits = |r: std::ops::Range<usize>| b[r].iter().all(u8::is_ascii_digit);
    let ok_date = b.len() == 10
        && b[4] == b'-'
        && b[7] == b'-'
        && digits(0..4)
        && digits(5..7)
        && digits(8..10)
        && (1..=12).contains(&date[5..7].parse::<u8>().unwrap_or(0))
        && (1..=31).contains(&date[8..10].parse::<u8>().unwrap_or(0));
    ok_date
        && suffix.is_none_or(|s| {
            s.len() > 1
                && s.starts_with('-')
                && s[1..].bytes().all(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        })
}

/// ARM's checks of a resource call's `api-version`: not of ARM's form, 400
/// `InvalidApiVersionParameter`; of the form but not one the resource provider serves (older
/// than its first, newer than its latest), 400 `NoRegisteredProviderFound`.
fn check_api_version(target: &Target, v: &str, location: &str) -> Res<()> {
    let (ns, ty) = match target {
        Target::List { kind, .. } | Target::One { kind, .. } => {
            (kind.namespace(), kind.arm_type().rsplit('/').next().unwrap_or_default())
        }
        Target::VmssNics { .. } => ("Microsoft.Compute", "virtualMachineScaleSets"),
        _ => return Ok(()),
    };
    let newest = NEWEST_API_VERSION.iter().find(|(n, _)| *n == ns).map_or("2025-05-01", |(_, v)| v);
    let supported = format!("{OLDEST_API_VERSION} … {newest}");
    if !api_version_well_formed(v) {
        return Err(bad(
            "InvalidApiVersionParameter",
            format!("The api-version '{v}' is invalid. The supported versions are '{supported}'."),
        ));
    }
    let date = &v[..10];
    if date < OLDEST_API_VERSION || date > newest {
        return Err(bad(
            "NoRegisteredProviderFound",
            format!(
                "No registered resource provider found for location '{location}' and API version '{v}' for type '{ty}'. The supported api-versions are '{supported}'. The supported locations are '{location}'."
            ),
        ));
    }
    Ok(())
}

/// IP configuration ID (lower case) → its private IP, of a NIC's `ipConfigurations` or a load
/// balancer's `frontendIPConfigurations`.
fn config_addresses(body: &Value, key: &str) -> BTreeMap<String, String> {
    body["properties"][key]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|c| {
            let id = c["id"].as_str()?.to_ascii_lowercase();
            let addr = c["properties"]["privateIPAddress"].as_str()?.to_string();
            Some((id, addr))
        })
        .collect()
}

/// Every private IP held in a subnet by a resource other than `except` (a load balancer's
/// frontends, NICs' IP configurations, scale-set VMs): (subnet ID, address, holder).
fn private_ip_holders(st: &State, except: &str) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for r in st.res.values() {
        let rid = r.body["id"].as_str().unwrap_or_default();
        if ids_eq(rid, except) {
            continue;
        }
        let configs: Vec<(&Value, String)> = match r.kind {
            Kind::Lb => r.body["properties"]["frontendIPConfigurations"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| (c, c["id"].as_str().unwrap_or(rid).to_string()))
                .collect(),
            Kind::Nic | Kind::Pls => r.body["properties"]["ipConfigurations"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| (c, c["id"].as_str().unwrap_or(rid).to_string()))
                .collect(),
            Kind::VmssVm => r.body["properties"]["__privateIPs"]
                .as_array()
                .into_iter()
                .flatten()
                .map(|c| (c, rid.to_string()))
                .collect(),
            _ => continue,
        };
        for (c, holder) in configs {
            if let (Some(sn), Some(addr)) = (
                c["properties"]["subnet"]["id"].as_str(),
                c["properties"]["privateIPAddress"].as_str(),
            ) {
                out.push((sn.to_string(), addr.to_string(), holder));
            }
        }
    }
    out
}

fn same_ip(a: &str, b: &str) -> bool {
    match (a.parse::<std::net::IpAddr>(), b.parse::<std::net::IpAddr>()) {
        (Ok(x), Ok(y)) => x == y,
        _ => a.eq_ignore_ascii_case(b),
    }
}

/// A private IP a client asks for (IP configuration `config` of resource `owner`, in
/// `subnet`): inside one of the subnet's prefixes of its family (400
/// `PrivateIPAddressNotInSubnet`) and held by no other resource in the subnet (400
/// `PrivateIPAddressIsAllocated`).
fn check_private_ip(st: &State, owner: &str, config: &str, subnet: &str, addr: &str) -> Res<()> {
    let Ok(ip) = addr.parse::<std::net::IpAddr>() else {
        return Err(bad(
            "PrivateIPAddressInvalid",
            format!("IP configuration {config} has an invalid private IP address '{addr}'."),
        ));
    };
    let sn = st.res.get(&subnet.to_ascii_lowercase()).map(|r| &r.body["properties"]);
    let mut prefixes: Vec<String> = Vec::new();
    if let Some(p) = sn {
        prefixes.extend(p["addressPrefix"].as_str().map(str::to_string));
        prefixes.extend(
            p["addressPrefixes"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .map(str::to_string),
        );
    }
    let nets: Vec<ipnet::IpNet> = prefixes
        .iter()
        .filter_map(|p| p.parse::<ipnet::IpNet>().ok())
        .filter(|n| n.addr().is_ipv4() == ip.is_ipv4())
        .collect();
    if !nets.is_empty() && !nets.iter().any(|n| n.contains(&ip)) {
        return Err(bad(
            "PrivateIPAddressNotInSubnet",
            format!(
                "Private static IP address {addr} does not belong to the range of subnet prefix {} of subnet {subnet}.",
                nets.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
            ),
        ));
    }
    if let Some((_, _, holder)) = private_ip_holders(st, owner)
        .into_iter()
        .find(|(s, a, _)| ids_eq(s, subnet) && same_ip(a, addr))
    {
        return Err(bad(
            "PrivateIPAddressIsAllocated",
            format!(
                "IP configuration {config} is using the private IP address {addr} which is already allocated to resource {holder}."
            ),
        ));
    }
    Ok(())
}

/// The availability zones of a resource or frontend (`zones`), sorted.
fn zone_set(v: &Value) -> Vec<String> {
    let mut z: Vec<String> = v["zones"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .map(str::to_string)
        .collect();
    z.sort();
    z.dedup();
    z
}

fn zones_text(z: &[String]) -> String {
    if z.is_empty() { "none".into() } else { z.join(", ") }
}

/// Zones on a resource (or frontend) `what`: Standard SKU only, `1`–`3`, and never changed
/// once the resource exists (400 `ResourceAvailabilityZonesCannotBeModified`).
fn check_zones(what: &str, sku: &str, want: &[String], had: Option<Vec<String>>) -> Res<()> {
    if !want.is_empty() && sku.eq_ignore_ascii_case("Basic") {
        return Err(bad(
            "AvailabilityZonesNotSupportedForBasicSku",
            format!("{what}: availability zones need the Standard SKU; its SKU is {sku}."),
        ));
    }
    if let Some(z) = want.iter().find(|z| !matches!(z.as_str(), "1" | "2" | "3")) {
        return Err(bad(
            "InvalidAvailabilityZone",
            format!("{what}: '{z}' is not an availability zone of this location (1, 2, 3)."),
        ));
    }
    if let Some(had) = had
        && had != want
    {
        return Err(bad(
            "ResourceAvailabilityZonesCannotBeModified",
            format!(
                "Resource {what} has an existing availability zone constraint {} and the request has availability zone constraint {}, which do not match. Zones cannot be added, updated or removed once the resource is created.",
                zones_text(&had),
                zones_text(want)
            ),
        ));
    }
    Ok(())
}

/// A location's display name as ARM's provider registrations list it (`eastus` → `East
/// US`); an unknown one as it is.
fn display_location(l: &str) -> String {
    const NAMES: &[(&str, &str)] = &[
        ("eastus", "East US"),
        ("eastus2", "East US 2"),
        ("westus", "West US"),
        ("westus2", "West US 2"),
        ("westus3", "West US 3"),
        ("centralus", "Central US"),
        ("northcentralus", "North Central US"),
        ("westcentralus", "West Central US"),
        ("westeurope", "West Europe"),
        ("northeurope", "North Europe"),
        ("uksouth", "UK South"),
        ("japaneast", "Japan East"),
        ("southeastasia", "Southeast Asia"),
        ("australiaeast", "Australia East"),
    ];
    let n = norm_location(l);
    NAMES.iter().find(|(k, _)| *k == n).map_or_else(|| l.to_string(), |(_, v)| v.to_string())
}

fn norm_location(l: &str) -> String {
    l.chars().filter(|c| !c.is_whitespace()).collect::<String>().to_ascii_lowercase()
}

/// A public IP's own rules: zones (Standard only, immutable), idle timeout 4–30 minutes.
fn check_public_ip(id: &str, body: &Value, current: Option<&Stored>) -> Res<()> {
    let sku = body["sku"]["name"].as_str().unwrap_or("Standard");
    check_zones(id, sku, &zone_set(body), current.map(|c| zone_set(&c.body)))?;
    if let Some(t) = body["properties"]["idleTimeoutInMinutes"].as_i64()
        && !(4..=30).contains(&t)
    {
        return Err(bad(
            "PublicIPAddressIdleTimeoutIsOutOfRange",
            format!(
                "Public IP address {id}: idleTimeoutInMinutes {t} is out of range; the allowed range is 4 to 30 minutes."
            ),
        ));
    }
    Ok(())
}

/// The rules ARM checks across a load balancer's parts (after references are resolved).
fn check_load_balancer(st: &State, id: &str, body: &Value, current: Option<&Stored>) -> Res<()> {
    let sku = body["sku"]["name"].as_str().unwrap_or("Basic").to_string();
    let standard = !sku.eq_ignore_ascii_case("Basic");
    let location = norm_location(body["location"].as_str().unwrap_or_default());
    let arr = |v: &'_ Value, k: &str| -> Vec<Value> {
        v["properties"][k].as_array().cloned().unwrap_or_default()
    };
    let had_zones: BTreeMap<String, Vec<String>> = current
        .map(|c| {
            arr(&c.body, "frontendIPConfigurations")
                .iter()
                .map(|f| (f["id"].as_str().unwrap_or_default().to_ascii_lowercase(), zone_set(f)))
                .collect()
        })
        .unwrap_or_default();
    let (mut public, mut private) = (Vec::new(), Vec::new());
    let mut pips: BTreeMap<String, String> = BTreeMap::new();
    let mut addrs: BTreeMap<(String, String), String> = BTreeMap::new();
    for fe in arr(body, "frontendIPConfigurations") {
        let fe_id = fe["id"].as_str().unwrap_or_default().to_string();
        let p = &fe["properties"];
        check_zones(
            &fe_id,
            &sku,
            &zone_set(&fe),
            had_zones.get(&fe_id.to_ascii_lowercase()).cloned(),
        )?;
        if let Some(pip) = p["publicIPAddress"]["id"].as_str() {
            public.push(fe_id.to_ascii_lowercase());
            if let Some(other) = pips.insert(pip.to_ascii_lowercase(), fe_id.clone()) {
                return Err(bad(
                    "PublicIPReferencedByMultipleIPConfigs",
                    format!(
                        "Public ip address {pip} is referenced by multiple ipconfigs in resource {id}: {other} and {fe_id}."
                    ),
                ));
            }
            if let Some(user) = public_ip_user(st, pip, id) {
                return Err(bad(
                    "PublicIPReferencedByMultipleIPConfigs",
                    format!(
                        "Public ip address {pip} is referenced by multiple ipconfigs: {user} and {fe_id}."
                    ),
                ));
            }
            let Some(r) = st.res.get(&pip.to_ascii_lowercase()) else { continue };
            let state = r.body["properties"]["provisioningState"].as_str().unwrap_or("Succeeded");
            if !state.eq_ignore_ascii_case("Succeeded") {
                return Err(bad(
                    "ReferencedResourceNotProvisioned",
                    format!(
                        "Cannot proceed with operation because resource {pip} used by resource {id} is not in Succeeded state. Resource is in {state} state and the last operation that updated/is updating the resource is PutPublicIpAddressOperation."
                    ),
                ));
            }
            if norm_location(r.body["location"].as_str().unwrap_or_default()) != location {
                return Err(bad(
                    "InvalidResourceReference",
                    format!(
                        "Resource {pip} referenced by resource {id} was not found. Please make sure that the referenced resource exists, and that both resources are in the same region."
                    ),
                ));
            }
            let pip_sku = r.body["sku"]["name"].as_str().unwrap_or("Basic");
            if !pip_sku.eq_ignore_ascii_case(&sku) {
                return Err(bad(
                    "PublicIPAndLBSkuDoNotMatch",
                    format!(
                        "{sku} sku load balancer {id} cannot reference {pip_sku} sku publicIP {pip}."
                    ),
                ));
            }
        } else {
            private.push(fe_id.to_ascii_lowercase());
            if let (Some(sn), Some(addr)) =
                (p["subnet"]["id"].as_str(), p["privateIPAddress"].as_str())
                && let Some(other) = addrs
                    .insert((sn.to_ascii_lowercase(), addr.to_ascii_lowercase()), fe_id.clone())
            {
                return Err(bad(
                    "PrivateIPAddressIsAllocated",
                    format!(
                        "IP configuration {fe_id} is using the private IP address {addr} which is already allocated to resource {other}."
                    ),
                ));
            }
        }
    }
    if let (Some(pu), Some(pr)) = (public.first(), private.first()) {
        return Err(bad(
            "LoadBalancerCannotHavePublicAndPrivateFrontendIPConfigurations",
            format!(
                "Load balancer {id} cannot have both public frontend IP configurations ({pu}) and private ones ({pr}): a load balancer is either public or internal."
            ),
        ));
    }
    let mut by_frontend: BTreeMap<(String, String, i64), String> = BTreeMap::new();
    let mut by_backend: BTreeMap<(String, i64, String, String), String> = BTreeMap::new();
    for rule in arr(body, "loadBalancingRules") {
        let rid = rule["id"].as_str().unwrap_or_default().to_string();
        let p = &rule["properties"];
        let proto = p["protocol"].as_str().unwrap_or_default().to_ascii_lowercase();
        let fport = p["frontendPort"].as_i64().unwrap_or(-1);
        let bport = p["backendPort"].as_i64().unwrap_or(-1);
        let fe =
            p["frontendIPConfiguration"]["id"].as_str().unwrap_or_default().to_ascii_lowercase();
        let floating = p["enableFloatingIP"].as_bool().unwrap_or(false);
        if let Some(t) = p["idleTimeoutInMinutes"].as_i64()
            && !(4..=100).contains(&t)
        {
            return Err(bad(
                "LoadBalancingRuleIdleTimeoutIsOutOfRange",
                format!(
                    "Load balancing rule {rid}: idleTimeoutInMinutes {t} is out of range; the allowed range is 4 to 100 minutes."
                ),
            ));
        }
        if proto == "all" && (public.contains(&fe) || !standard) {
            return Err(bad(
                "HaPortsRuleNotSupportedOnPublicLoadBalancer",
                format!(
                    "Load balancing rule {rid} with protocol All (HA ports) is supported only on an internal Standard load balancer; {id} is {}.",
                    if standard { "public" } else { "Basic" }
                ),
            ));
        }
        if let Some(other) = by_frontend.insert((fe.clone(), proto.clone(), fport), rid.clone()) {
            return Err(bad(
                "LoadBalancingRulesUseSameFrontendIPConfigurationProtocolAndPort",
                format!(
                    "Load balancing rules {other} and {rid} of load balancer {id} use the same frontend IP configuration, protocol {proto} and frontend port {fport}."
                ),
            ));
        }
        let mut pools = Vec::new();
        collect_refs(p, "backendAddressPool", &mut pools);
        collect_refs(p, "backendAddressPools", &mut pools);
        pools.sort();
        pools.dedup();
        for pool in pools {
            let key = (
                proto.clone(),
                bport,
                pool.to_ascii_lowercase(),
                if floating { fe.clone() } else { String::new() },
            );
            if let Some(other) = by_backend.insert(key, rid.clone()) {
                let code = if floating {
                    "RulesUseSameBackendPortProtocolAndPoolAndFrontendIPWithFloatingIPEnabled"
                } else {
                    "RulesUseSameBackendPortProtocolAndPool"
                };
                return Err(bad(
                    code,
                    format!(
                        "Load balancing rules {other} and {rid} with floating IP {} use the same protocol {proto} and backend port {bport}, and must not be used with the same backend address pool {pool}.",
                        if floating { "enabled" } else { "disabled" }
                    ),
                ));
            }
        }
    }
    for probe in arr(body, "probes") {
        let pid = probe["id"].as_str().unwrap_or_default().to_string();
        let p = &probe["properties"];
        let interval = p["intervalInSeconds"].as_i64().unwrap_or(15);
        let count =
            p["probeThreshold"].as_i64().or_else(|| p["numberOfProbes"].as_i64()).unwrap_or(2);
        if interval < 5 || count < 1 || interval * count > 120 {
            return Err(bad(
                "InvalidProbeIntervalOrNumberOfProbes",
                format!(
                    "Probe {pid}: intervalInSeconds {interval} and number of probes {count} are out of range: the interval is at least 5 seconds, at least 1 probe, and interval × probes at most 120 seconds."
                ),
            ));
        }
    }
    Ok(())
}

/// An IP configuration other than `except`'s (another load balancer's frontend or a NIC's)
/// that uses the public IP `pip`.
fn public_ip_user(st: &State, pip: &str, except: &str) -> Option<String> {
    st.res.values().find_map(|r| {
        let key = match r.kind {
            Kind::Lb => "frontendIPConfigurations",
            Kind::Nic => "ipConfigurations",
            _ => return None,
        };
        if ids_eq(r.body["id"].as_str().unwrap_or_default(), except) {
            return None;
        }
        r.body["properties"][key].as_array().into_iter().flatten().find_map(|c| {
            c["properties"]["publicIPAddress"]["id"]
                .as_str()
                .is_some_and(|p| ids_eq(p, pip))
                .then(|| c["id"].as_str().unwrap_or_default().to_string())
        })
    })
}

/// Who (a NIC or a scale-set VM) references the backend pool `pool_id`.
fn pool_user(st: &State, pool_id: &str) -> Option<String> {
    st.res.values().find_map(|r| {
        if !matches!(r.kind, Kind::Nic | Kind::VmssVm | Kind::Vmss) {
            return None;
        }
        let mut refs = Vec::new();
        collect_refs(&r.body["properties"], "loadBalancerBackendAddressPools", &mut refs);
        refs.iter()
            .any(|x| ids_eq(x, pool_id))
            .then(|| r.body["id"].as_str().unwrap_or_default().to_string())
    })
}

/// ARM's default `sku.tier` (`Regional`) on a load balancer or public IP whose `sku` names no
/// tier.
fn default_sku_tier(body: &mut Value) {
    if let Some(sku) = body.get_mut("sku").and_then(Value::as_object_mut)
        && !sku.get("tier").is_some_and(Value::is_string)
    {
        sku.insert("tier".into(), json!("Regional"));
    }
}

/// Drops the read-only properties of a Compute PUT body (Compute ignores them).
fn strip_compute_read_only(body: &mut Value) {
    if let Some(m) = body.as_object_mut() {
        for k in ["instanceId", "resources", "etag"] {
            m.remove(k);
        }
    }
    if let Some(p) = body.get_mut("properties").and_then(Value::as_object_mut) {
        for k in [
            "provisioningState",
            "instanceView",
            "latestModelApplied",
            "modelDefinitionApplied",
            "vmId",
            "uniqueId",
            "timeCreated",
        ] {
            p.remove(k);
        }
    }
}

/// A uniform scale-set instance's computer name as Azure makes it: the scale set's
/// `computerNamePrefix` and the instance ID in 6 base-36 digits (`pool000000`, `pool00000a`).
pub fn vmss_computer_name(prefix: &str, instance_id: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut d = [b'0'; 6];
    let mut n = instance_id;
    for slot in d.iter_mut().rev() {
        *slot = DIGITS[(n % 36) as usize];
        n /= 36;
    }
    format!("{prefix}{}", String::from_utf8_lossy(&d))
}

/// The instance ID a computer name of Azure's form (`prefix` + 6 base-36 digits) encodes.
fn vmss_instance_id(prefix: &str, name: &str) -> Option<u64> {
    let lower = name.to_ascii_lowercase();
    let digits = lower.strip_prefix(&prefix.to_ascii_lowercase())?;
    if digits.len() != 6 {
        return None;
    }
    u64::from_str_radix(digits, 36).ok()
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                match t.get_mut(k) {
                    Some(tv) if v.is_object() => merge(tv, v),
                    _ => {
                        t.insert(k.clone(), v.clone());
                    }
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl Cloud for AzureCloud {
    fn name(&self) -> String {
        "azure".into()
    }

    fn operation(&self, head: &http::request::Parts, _body: &Bytes) -> String {
        operation_name(&head.method, &parse_target(&head.method, head.uri.path()))
    }

    fn error(&self, head: &http::request::Parts, _op: &str, kind: ErrorKind) -> ErrorReply {
        let (status, code, message) = match kind {
            ErrorKind::Throttle => (429, "TooManyRequests", "The request is being throttled."),
            ErrorKind::Unavailable => {
                (503, "ServiceUnavailable", "The service is temporarily unavailable.")
            }
            ErrorKind::Status(s) => (
                s,
                match s {
                    400 => "BadRequest",
                    401 => "AuthenticationFailed",
                    403 => "AuthorizationFailed",
                    404 => "ResourceNotFound",
                    409 => "Conflict",
                    412 => "PreconditionFailed",
                    429 => "TooManyRequests",
                    502 => "BadGateway",
                    503 => "ServiceUnavailable",
                    504 => "GatewayTimeout",
                    _ => "InternalServerError",
                },
                "Injected fault.",
            ),
        };
        let path = head.uri.path();
        let body = if path.contains("/oauth2/") {
            json!({ "error": if status == 429 { "temporarily_unavailable" } else { "invalid_request" }, "error_description": message })
        } else {
            error_body(code, message)
        };
        ErrorReply { status, content_type: "application/json", body: body.to_string() }
    }

    fn serve(&self, op: String, req: Request<Bytes>) -> ServeFuture {
        let target = parse_target(req.method(), req.uri().path());
        let resp = self.handle(&op, target, &req);
        Box::pin(async move { Ok(resp) })
    }

    fn reset(&self) {
        self.ops.reset();
        self.load();
    }

    fn state(&self) -> Value {
        self.state_json()
    }

    /// The load balancers' operations (`GET /__emulator/timing` reports their tables; each
    /// group's `realistic` table is in docs/emulators.md).
    fn async_ops(&self) -> Option<&AsyncOps> {
        Some(&self.ops.groups[Ops::group(Kind::Lb)])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scale_set_computer_names_are_the_prefix_and_six_base36_digits() {
        assert_eq!(vmss_computer_name("pool", 0), "pool000000");
        assert_eq!(vmss_computer_name("pool", 10), "pool00000a");
        assert_eq!(vmss_computer_name("pool", 36), "pool000010");
        assert_eq!(vmss_instance_id("pool", "pool00000a"), Some(10));
        assert_eq!(vmss_instance_id("pool", "POOL000010"), Some(36));
        assert_eq!(vmss_instance_id("pool", "pool-0"), None);
        assert_eq!(vmss_instance_id("pool", "pool0000001"), None);
    }

    #[test]
    fn a_world_names_scale_set_instances_as_azure_does_or_freely() {
        let world = World::parse(
            "instances:\n  - {name: pool00000a, zone: \"1\", tags: {azure.vmss: pool}}\n  - {name: pool-x, zone: \"1\", tags: {azure.vmss: pool}}\n  - {name: pool000000, zone: \"1\", tags: {azure.vmss: pool}}\n",
        )
        .unwrap();
        let c = AzureCloud::new(world, AzureOptions::default());
        let vms = c.resources("Microsoft.Compute/virtualMachineScaleSets/virtualMachines");
        let mut got: Vec<(String, String)> = vms
            .iter()
            .map(|v| {
                (
                    v["instanceId"].as_str().unwrap_or_default().to_string(),
                    v["properties"]["osProfile"]["computerName"]
                        .as_str()
                        .unwrap_or_default()
                        .to_string(),
                )
            })
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                ("0".to_string(), "pool000000".to_string()),
                ("1".to_string(), "pool-x".to_string()),
                ("10".to_string(), "pool00000a".to_string())
            ]
        );
        let dup = World::parse(
            "instances:\n  - {name: pool000001, zone: \"1\", tags: {azure.vmss: pool}}\n  - {name: pool000001x, zone: \"1\", tags: {azure.vmss: pool}}\n",
        )
        .unwrap();
        let c = AzureCloud::new(dup, AzureOptions::default());
        let mut inst = c.world.instances[0].clone();
        inst.name = "POOL000001".into();
        assert!(c.add_instance(inst).unwrap_err().contains("already has instance ID 1"));
    }

    #[test]
    fn targets_and_operation_names() {
        let sub = "/subscriptions/s/resourceGroups/rg/providers";
        let cases = [
            (
                Method::GET,
                format!("{sub}/Microsoft.Compute/virtualMachines"),
                "compute.virtual_machines.list",
            ),
            (
                Method::GET,
                "/subscriptions/s/providers/Microsoft.Compute/virtualMachines".into(),
                "compute.virtual_machines.list_all",
            ),
            (
                Method::GET,
                format!("{sub}/Microsoft.Compute/virtualMachines/vm/instanceView"),
                "compute.virtual_machines.instance_view",
            ),
            (
                Method::GET,
                format!("{sub}/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines"),
                "compute.virtual_machine_scale_set_vms.list",
            ),
            (
                Method::PUT,
                format!("{sub}/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines/3"),
                "compute.virtual_machine_scale_set_vms.update",
            ),
            (
                Method::PUT,
                format!("{sub}/Microsoft.Network/loadBalancers/k"),
                "network.load_balancers.create_or_update",
            ),
            (
                Method::DELETE,
                format!("{sub}/Microsoft.Network/publicIPAddresses/p"),
                "network.public_ip_addresses.delete",
            ),
            (
                Method::GET,
                format!("{sub}/Microsoft.Network/virtualNetworks/v/subnets/s"),
                "network.subnets.get",
            ),
            (Method::POST, "/t/oauth2/v2.0/token".into(), "aad.token"),
            (Method::GET, "/v2/".into(), "acr.challenge"),
            (Method::POST, "/oauth2/exchange".into(), "acr.exchange"),
            (Method::GET, "/metadata/instance/compute".into(), "imds.instance"),
            (
                Method::GET,
                "/subscriptions/s/providers/Microsoft.Network/locations/eastus/operations/op-1"
                    .into(),
                "arm.operations.get",
            ),
            (Method::GET, "/nothing".into(), "arm.unknown"),
        ];
        for (m, p, want) in cases {
            assert_eq!(operation_name(&m, &parse_target(&m, &p)), want, "{m} {p}");
        }
    }

    #[test]
    fn a_scale_set_vms_pool_members_are_its_ip_configurations() {
        let vm = json!({
            "id": "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines/3",
            "properties": { "networkProfileConfiguration": { "networkInterfaceConfigurations": [{
                "name": "ss-nic", "properties": { "ipConfigurations": [
                    { "name": "v4", "properties": { "loadBalancerBackendAddressPools": [{ "id": "P4" }] } },
                    { "name": "v6", "properties": { "loadBalancerBackendAddressPools": [{ "id": "P6" }] } },
                    { "name": "none", "properties": {} },
                ] } }] } }
        });
        let refs = vmss_vm_pool_refs(&vm);
        let base = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute/virtualMachineScaleSets/ss/virtualMachines/3/networkInterfaces/ss-nic/ipConfigurations";
        assert_eq!(
            refs,
            vec![
                (format!("{base}/v4"), "P4".to_string()),
                (format!("{base}/v6"), "P6".to_string())
            ]
        );
    }

    #[test]
    fn world_maps_to_vms_scale_sets_nics_and_ips() {
        let w = World::parse(
            "region: westeurope\ninstances:\n- {name: a, zone: '1', private_ips: [10.240.0.5], public_ips: [20.1.2.3]}\n- {name: b, zone: x, tags: {azure.fault-domain: '2'}}\n- {name: ss-0, zone: '2', tags: {azure.vmss: pool}}\n",
        )
        .unwrap();
        let c = AzureCloud::new(w, AzureOptions::default());
        let a = c.resource(&c.id("Microsoft.Compute/virtualMachines", "a")).unwrap();
        assert_eq!(a["zones"], json!(["1"]));
        assert_eq!(a["location"], "westeurope");
        let nic = c.resource(&c.id("Microsoft.Network/networkInterfaces", "a-nic")).unwrap();
        assert_eq!(
            nic["properties"]["ipConfigurations"][0]["properties"]["privateIPAddress"],
            "10.240.0.5"
        );
        let pip = c.resource(&c.id("Microsoft.Network/publicIPAddresses", "a-pip")).unwrap();
        assert_eq!(pip["properties"]["ipAddress"], "20.1.2.3");
        assert!(
            pip["properties"]["ipConfiguration"]["id"]
                .as_str()
                .unwrap()
                .ends_with("a-nic/ipConfigurations/ipconfig1")
        );
        let ss = c.instance_resource_id("ss-0").unwrap();
        assert!(ss.ends_with("/virtualMachineScaleSets/pool/virtualMachines/0"), "{ss}");
        let st = lock(&c.state);
        let b = st
            .res
            .get(&c.id("Microsoft.Compute/virtualMachines", "b").to_ascii_lowercase())
            .unwrap();
        assert_eq!(c.instance_view(b)["platformFaultDomain"], 2);
    }

    #[test]
    fn deleting_a_vm_detaches_its_nic_unless_delete_option_says_delete() {
        let w = World::parse(
            "instances:\n- {name: a, zone: '1', public_ips: [20.1.2.3]}\n- {name: b, zone: '1'}\n- {name: ss-0, zone: '1', tags: {azure.vmss: pool}}\n- {name: ss-1, zone: '1', tags: {azure.vmss: pool}}\n",
        )
        .unwrap();
        let c = AzureCloud::new(w, AzureOptions { lro: Duration::ZERO, ..Default::default() });
        let del = |id: &str| {
            let req = Request::builder()
                .method(Method::DELETE)
                .uri(format!("{id}?api-version=2024-07-01"))
                .header(header::HOST, "localhost")
                .body(Bytes::new())
                .unwrap();
            let kind = match parse_target(&Method::DELETE, id) {
                Target::One { kind, .. } => kind,
                t => panic!("{t:?}"),
            };
            c.delete(&req, kind, id)
        };
        // b's NIC is made to go with it.
        let b = c.id("Microsoft.Compute/virtualMachines", "b");
        let mut bvm = c.resource(&b).unwrap();
        bvm["properties"]["networkProfile"]["networkInterfaces"][0]["properties"]["deleteOption"] =
            json!("Delete");
        lock(&c.state).res.get_mut(&b.to_ascii_lowercase()).unwrap().body = bvm;
        let a = c.id("Microsoft.Compute/virtualMachines", "a");
        for id in [&a, &b] {
            let r = del(id);
            assert_eq!(r.status(), StatusCode::ACCEPTED, "{id}");
            assert!(r.headers().contains_key("azure-asyncoperation"));
            assert!(r.headers().contains_key("location"));
        }
        std::thread::sleep(Duration::from_millis(20));
        assert!(c.resource(&a).is_none() && c.resource(&b).is_none());
        let nic = c.resource(&c.id("Microsoft.Network/networkInterfaces", "a-nic")).unwrap();
        assert!(nic["properties"].get("virtualMachine").is_none(), "{nic}");
        assert!(c.resource(&c.id("Microsoft.Network/publicIPAddresses", "a-pip")).is_some());
        assert!(c.resource(&c.id("Microsoft.Network/networkInterfaces", "b-nic")).is_none());
        // Again: nothing to delete, 204.
        assert_eq!(del(&a).status(), StatusCode::NO_CONTENT);
        // A scale-set VM: gone, the set's capacity one less; a missing set is 404.
        let ss0 = c.instance_resource_id("ss-0").unwrap();
        assert_eq!(del(&ss0).status(), StatusCode::ACCEPTED);
        std::thread::sleep(Duration::from_millis(20));
        assert!(c.resource(&ss0).is_none());
        let set = c.resource(&c.id("Microsoft.Compute/virtualMachineScaleSets", "pool")).unwrap();
        assert_eq!(set["sku"]["capacity"], 1);
        let other =
            c.id("Microsoft.Compute/virtualMachineScaleSets", "nope") + "/virtualMachines/0";
        assert_eq!(del(&other).status(), StatusCode::NOT_FOUND);
    }

    #[test]
    fn scale_set_nics_are_served_under_compute_with_the_vms_ips_and_pools() {
        let sub = "/subscriptions/s/resourceGroups/rg/providers/Microsoft.Compute";
        for (p, want) in [
            (
                format!("{sub}/virtualMachineScaleSets/ss/networkInterfaces"),
                "network.network_interfaces.list_virtual_machine_scale_set_network_interfaces",
            ),
            (
                format!("{sub}/virtualMachineScaleSets/ss/virtualMachines/3/networkInterfaces"),
                "network.network_interfaces.list_virtual_machine_scale_set_vm_network_interfaces",
            ),
            (
                format!("{sub}/virtualMachineScaleSets/ss/virtualMachines/3/networkInterfaces/n"),
                "network.network_interfaces.get_virtual_machine_scale_set_network_interface",
            ),
        ] {
            assert_eq!(operation_name(&Method::GET, &parse_target(&Method::GET, &p)), want, "{p}");
        }
        let w = World::parse(
            "instances:\n- {name: ss-0, zone: '1', private_ips: [10.240.1.4, 'fd00::4'], tags: {azure.vmss: pool}}\n",
        )
        .unwrap();
        let c = AzureCloud::new(w, AzureOptions::default());
        let id = c.instance_resource_id("ss-0").unwrap();
        let mut vm = c.resource(&id).unwrap();
        vm["properties"]["networkProfileConfiguration"]["networkInterfaceConfigurations"][0]["properties"]
            ["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"] =
            json!([{ "id": "P" }]);
        let st = lock(&c.state);
        let mut stored = st.res.get(&id.to_ascii_lowercase()).unwrap().clone();
        drop(st);
        stored.body["properties"]["networkProfileConfiguration"] =
            vm["properties"]["networkProfileConfiguration"].clone();
        let nic = vmss_vm_nic(&stored);
        assert_eq!(nic["id"], format!("{id}/networkInterfaces/pool"));
        assert_eq!(nic["properties"]["virtualMachine"]["id"], id);
        let cfgs = nic["properties"]["ipConfigurations"].as_array().unwrap();
        assert_eq!(cfgs[0]["properties"]["privateIPAddress"], "10.240.1.4");
        assert_eq!(cfgs[0]["properties"]["primary"], true);
        assert_eq!(
            cfgs[0]["properties"]["loadBalancerBackendAddressPools"],
            json!([{ "id": "P" }])
        );
        assert_eq!(
            cfgs[0]["id"],
            format!("{id}/networkInterfaces/pool/ipConfigurations/ipconfig1")
        );
        assert_eq!(cfgs[1]["properties"]["privateIPAddressVersion"], "IPv6");
    }

    #[test]
    fn flexible_scale_set_instances_are_vms_and_new_instances_get_the_models_pools() {
        let w = World::parse(
            "instances:\n- {name: flex-a, zone: '1', private_ips: [10.240.2.4], tags: {azure.vmss-flex: flex}}\n- {name: ss-0, zone: '1', tags: {azure.vmss: pool}}\n",
        )
        .unwrap();
        let c = AzureCloud::new(w, AzureOptions::default());
        let flex_id = c.id("Microsoft.Compute/virtualMachineScaleSets", "flex");
        let ss = c.resource(&flex_id).unwrap();
        assert_eq!(ss["properties"]["orchestrationMode"], "Flexible");
        let vm_id = c.instance_resource_id("flex-a").unwrap();
        assert_eq!(vm_id, c.id("Microsoft.Compute/virtualMachines", "flex-a"));
        let vm = c.resource(&vm_id).unwrap();
        assert_eq!(vm["properties"]["virtualMachineScaleSet"]["id"], json!(flex_id));
        let nic_id = c.id("Microsoft.Network/networkInterfaces", "flex-a-nic");
        let nic = c.resource(&nic_id).unwrap();
        assert!(
            nic["properties"]["ipConfigurations"][0]["properties"]
                .get("loadBalancerBackendAddressPools")
                .is_none()
        );

        // A load balancer with a pool; both models list it (as a CCM writes them).
        let lb = c.id("Microsoft.Network/loadBalancers", "kubernetes");
        let pool = format!("{lb}/backendAddressPools/kubernetes");
        c.put_resource(
            &lb,
            json!({"sku": {"name": "Standard"}, "properties": {"backendAddressPools": [{"name": "kubernetes", "id": pool}]}}),
        )
        .unwrap();
        for set in ["flex", "pool"] {
            let id = c.id("Microsoft.Compute/virtualMachineScaleSets", set);
            let mut ss = c.resource(&id).unwrap();
            ss["properties"]["virtualMachineProfile"]["networkProfile"]["networkInterfaceConfigurations"]
                [0]["properties"]["ipConfigurations"][0]["properties"]["loadBalancerBackendAddressPools"] =
                json!([{ "id": pool }]);
            c.put_resource(&id, ss).unwrap();
        }
        // New instances of either mode start in the pool.
        for (name, tag) in [("flex-b", "azure.vmss-flex: flex"), ("ss-1", "azure.vmss: pool")] {
            let w = World::parse(&format!(
                "instances:\n- {{name: {name}, zone: '1', tags: {{{tag}}}}}\n"
            ))
            .unwrap();
            c.add_instance(w.instances[0].clone()).unwrap();
        }
        let lb = c.resource(&lb).unwrap();
        let mut members: Vec<String> =
            lb["properties"]["backendAddressPools"][0]["properties"]["backendIPConfigurations"]
                .as_array()
                .unwrap()
                .iter()
                .map(|r| r["id"].as_str().unwrap().split("/providers/").nth(1).unwrap().to_string())
                .collect();
        members.sort();
        assert_eq!(
            members,
            [
                "Microsoft.Compute/virtualMachineScaleSets/pool/virtualMachines/1/networkInterfaces/pool/ipConfigurations/ipconfig1",
                "Microsoft.Network/networkInterfaces/flex-b-nic/ipConfigurations/ipconfig1",
            ]
        );
    }
}
