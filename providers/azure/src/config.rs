//! The cloud config: upstream's `azure.json` (JSON or YAML, the keys of
//! `cloud-provider-azure`'s `Config`), from the `--cloud-config` file, the Secret
//! `kube-system/azure-cloud-provider` (key `cloud-config`), or both merged
//! (`cloudConfigType: file | secret | merge`), with the `AZURE_*` environment overrides.
//! Unknown or mistyped keys are errors naming the key; secrets are never quoted back.
//!
//! Parsing goes through a generic map first, so that:
//! - keys match case-insensitively, as Go's `encoding/json` (behind upstream's
//!   `sigs.k8s.io/yaml`) matches them (`subscriptionID` is `subscriptionId`);
//! - a number or boolean given for a string key is taken as its text, as upstream's YAML
//!   decoding does for string fields;
//! - upstream keys this provider does not implement are accepted and listed in
//!   [`Config::ignored_keys`] (so an upstream `azure.json` works unchanged), while anything
//!   else is an error naming the key (with the nearest known key as a hint);
//! - error messages are our own: neither serde's nor the YAML parser's text (which quotes
//!   values and source lines) is passed on.
//!
//! [`Config::validate`] checks what the cloud-controller-manager needs (the
//! credential plugin and the node manager need less, so [`Config::parse`] does not).

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use ccm_core::reference::KeyDoc;
use serde::Deserialize;
use serde_json::{Map, Value};

/// The Secret upstream reads the config from: namespace, name and key.
pub const SECRET_NAMESPACE: &str = "kube-system";
/// The Secret's name.
pub const SECRET_NAME: &str = "azure-cloud-provider";
/// The Secret's key holding the config.
pub const SECRET_KEY: &str = "cloud-config";

/// How long reading the Secret may take.
const SECRET_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Upstream's default for `routeUpdateIntervalInSeconds`.
pub const DEFAULT_ROUTE_UPDATE_INTERVAL: Duration = Duration::from_secs(30);

/// `vmType`: how the cluster's nodes are deployed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum VmType {
    /// Availability-set (or standalone) VMs.
    #[default]
    #[serde(rename = "standard")]
    Standard,
    /// Uniform virtual machine scale sets (upstream's default on AKS); standalone VMs are
    /// still found.
    #[serde(rename = "vmss")]
    Vmss,
    /// Flexible-orchestration scale sets: their VMs are standalone VMs.
    #[serde(rename = "vmssflex")]
    VmssFlex,
}

/// `loadBalancerBackendPoolConfigurationType`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum BackendPoolType {
    /// Nodes' NIC (or scale-set) IP configurations reference the pool (upstream default).
    #[default]
    #[serde(rename = "nodeIPConfiguration")]
    NodeIpConfiguration,
    /// The pool lists node IPs.
    #[serde(rename = "nodeIP")]
    NodeIp,
    /// The pool lists pod IPs.
    #[serde(rename = "podIP")]
    PodIp,
}

/// `cloudConfigType`: where the config comes from.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
pub enum CloudConfigType {
    /// The `--cloud-config` file only.
    #[serde(rename = "file")]
    File,
    /// The Secret only.
    #[serde(rename = "secret")]
    Secret,
    /// The Secret's keys over the file's (upstream default).
    #[default]
    #[serde(rename = "merge")]
    Merge,
}

/// The resource groups Services may name ([`Config::service_resource_groups`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ServiceGroups {
    /// Any resource group of the subscription (`serviceResourceGroups: "*"`).
    Any,
    /// Only these.
    Only(Vec<String>),
}

impl ServiceGroups {
    /// Whether `rg` is allowed (ignoring case, as ARM).
    pub fn allows(&self, rg: &str) -> bool {
        match self {
            ServiceGroups::Any => true,
            ServiceGroups::Only(list) => list.iter().any(|g| g.eq_ignore_ascii_case(rg)),
        }
    }
}

/// `azure.json`. Field names are upstream's keys in snake case; absent keys are `None` (or
/// the default upstream uses, noted on the field).
#[derive(Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Config {
    /// `AzurePublicCloud` (default), `AzureChinaCloud`, `AzureUSGovernmentCloud`.
    pub cloud: Option<String>,
    /// The ARM endpoint for a cloud not in that list (upstream `resourceManagerEndpoint`).
    pub resource_manager_endpoint: Option<String>,
    /// The AAD tenant.
    pub tenant_id: Option<String>,
    /// The subscription of the cluster's resources.
    pub subscription_id: Option<String>,
    /// The subscription of the network resources (load balancers, public IPs, the security
    /// group, the virtual network and the route table) when not `subscriptionId`.
    #[serde(rename = "networkResourceSubscriptionID")]
    pub network_resource_subscription_id: Option<String>,
    /// The AAD tenant of the network subscription when not `tenantId`: network calls carry
    /// that tenant's token, and every call an auxiliary token of it.
    #[serde(rename = "networkResourceTenantID")]
    pub network_resource_tenant_id: Option<String>,
    /// Service principal client id.
    pub aad_client_id: Option<String>,
    /// Service principal secret.
    pub aad_client_secret: Option<String>,
    /// Service principal certificate: a PEM file with the certificate and its RSA key
    /// ([`crate::client::certificate`]; PKCS#12 is refused).
    pub aad_client_cert_path: Option<String>,
    /// The certificate's password (upstream's, for PKCS#12 files; named in the refusal).
    pub aad_client_cert_password: Option<String>,
    /// Use the VM's managed identity.
    #[serde(default)]
    pub use_managed_identity_extension: bool,
    /// The user-assigned identity's client id (managed identity).
    #[serde(rename = "userAssignedIdentityID")]
    pub user_assigned_identity_id: Option<String>,
    /// Workload identity: the federated token file.
    pub aad_federated_token_file: Option<String>,
    /// Use workload identity.
    #[serde(default)]
    pub use_federated_workload_identity_extension: bool,
    /// The cluster's resource group.
    pub resource_group: Option<String>,
    /// The location (region).
    pub location: Option<String>,
    /// The cluster's virtual network.
    pub vnet_name: Option<String>,
    /// The virtual network's resource group (default `resourceGroup`).
    pub vnet_resource_group: Option<String>,
    /// The nodes' subnet (internal load balancers' default).
    pub subnet_name: Option<String>,
    /// The cluster's network security group.
    pub security_group_name: Option<String>,
    /// Its resource group (default `resourceGroup`).
    pub security_group_resource_group: Option<String>,
    /// The route table for pod routes.
    pub route_table_name: Option<String>,
    /// Its resource group (default `resourceGroup`).
    pub route_table_resource_group: Option<String>,
    /// `standard`, `vmss`, `vmssflex` (case-insensitive). A parsed file without the key gets
    /// `vmss`, as upstream (its VMSS mode also finds standalone VMs); `Config::default()` has
    /// `standard`.
    #[serde(default)]
    pub vm_type: VmType,
    /// The primary availability set (basic load balancers).
    pub primary_availability_set_name: Option<String>,
    /// The primary scale set (basic load balancers).
    pub primary_scale_set_name: Option<String>,
    /// `standard` (default) or `basic`.
    pub load_balancer_sku: Option<String>,
    /// The shared load balancer's name (default: the cluster name).
    pub load_balancer_name: Option<String>,
    /// The load balancers' resource group (default `resourceGroup`).
    pub load_balancer_resource_group: Option<String>,
    /// Keep control-plane nodes out of the standard load balancer (default true).
    #[serde(rename = "excludeMasterFromStandardLB")]
    pub exclude_master_from_standard_lb: Option<bool>,
    /// The load balancers whose backend pools the operator fills (`all`, `internal`,
    /// `external`; default none): their members are neither added nor removed here.
    pub pre_configured_backend_pool_load_balancer_types: Option<String>,
    /// Rules disable outbound SNAT.
    #[serde(default, rename = "disableOutboundSNAT")]
    pub disable_outbound_snat: bool,
    /// The most rules one load balancer may have (default 250).
    pub maximum_load_balancer_rule_count: Option<u32>,
    /// How backend pools are filled.
    #[serde(default)]
    pub load_balancer_backend_pool_configuration_type: BackendPoolType,
    /// Multiple standard load balancers (see [`crate::load_balancer::multi_slb`]; checked by
    /// [`Config::validate`]).
    pub multiple_standard_load_balancer_configurations: Option<serde_json::Value>,
    /// Read the local node's metadata from IMDS.
    #[serde(default)]
    pub use_instance_metadata: bool,
    /// Upstream's retry switches (our retries are always on; accepted for compatibility).
    pub cloud_provider_backoff: Option<bool>,
    /// Upstream's retry count.
    pub cloud_provider_backoff_retries: Option<u32>,
    /// Upstream's backoff exponent.
    pub cloud_provider_backoff_exponent: Option<f64>,
    /// Upstream's backoff duration (seconds).
    pub cloud_provider_backoff_duration: Option<u32>,
    /// Upstream's backoff jitter.
    pub cloud_provider_backoff_jitter: Option<f64>,
    /// Upstream's client-side rate limit switch.
    pub cloud_provider_rate_limit: Option<bool>,
    /// Read QPS.
    #[serde(rename = "cloudProviderRateLimitQPS")]
    pub cloud_provider_rate_limit_qps: Option<f64>,
    /// Read bucket.
    pub cloud_provider_rate_limit_bucket: Option<u32>,
    /// Write QPS.
    #[serde(rename = "cloudProviderRateLimitQPSWrite")]
    pub cloud_provider_rate_limit_qps_write: Option<f64>,
    /// Write bucket.
    pub cloud_provider_rate_limit_bucket_write: Option<u32>,
    /// Tags on every resource the CCM creates: `k1=v1,k2=v2`.
    pub tags: Option<String>,
    /// Tags as a map (wins over `tags`).
    pub tags_map: Option<BTreeMap<String, String>>,
    /// Tag keys the CCM owns on shared resources: `k1,k2`.
    pub system_tags: Option<String>,
    /// `servicenodeport` (default) or `shared` (one kube-proxy probe for Cluster services).
    pub cluster_service_load_balancer_health_probe_mode: Option<String>,
    /// The shared probe's port (default 10256).
    pub cluster_service_shared_load_balancer_health_probe_port: Option<i32>,
    /// The shared probe's path (default `/healthz`).
    pub cluster_service_shared_load_balancer_health_probe_path: Option<String>,
    /// Seconds between batched route-table writes (default 30).
    pub route_update_interval_in_seconds: Option<u64>,
    /// `file`, `secret`, `merge` (default).
    #[serde(default)]
    pub cloud_config_type: CloudConfigType,
    /// The resource groups a Service may name (`azure-load-balancer-resource-group`): comma
    /// separated, `*` for any of the subscription (default: the cluster's own, see
    /// [`Config::service_resource_groups`]). Not upstream's (issue #29).
    pub service_resource_groups: Option<String>,
    /// Honour `azure-additional-public-ips` (default false: refused). Not upstream's (issue
    /// #29).
    #[serde(default, rename = "allowAdditionalPublicIPs")]
    pub allow_additional_public_ips: bool,
    /// Seconds VM listings are reused across syncs (default 60, upstream's; 0: not cached).
    #[serde(rename = "vmCacheTTLInSeconds")]
    pub vm_cache_ttl_in_seconds: Option<u64>,
    /// Seconds public IP listings (and, when set, GETs) are reused (default 120 for
    /// listings; GETs not cached unless set).
    #[serde(rename = "publicIPCacheTTLInSeconds")]
    pub public_ip_cache_ttl_in_seconds: Option<u64>,
    /// Seconds a load balancer's GET is reused (not cached unless set).
    #[serde(rename = "loadBalancerCacheTTLInSeconds")]
    pub load_balancer_cache_ttl_in_seconds: Option<u64>,
    /// Seconds a security group's GET is reused (not cached unless set).
    #[serde(rename = "nsgCacheTTLInSeconds")]
    pub nsg_cache_ttl_in_seconds: Option<u64>,
    /// Seconds a route listing reuses the route table read (default 120, upstream's; 0: read
    /// at every listing).
    #[serde(rename = "routeTableCacheTTLInSeconds")]
    pub route_table_cache_ttl_in_seconds: Option<u64>,
    /// Seconds between passes of the backend pool updater of `externalTrafficPolicy: Local`
    /// Services' own pools (several standard load balancers only; default 30, upstream's).
    #[serde(rename = "loadBalancerBackendPoolUpdateIntervalInSeconds")]
    pub load_balancer_backend_pool_update_interval_in_seconds: Option<u64>,
    /// No read is cached.
    #[serde(default, rename = "disableAPICallCache")]
    pub disable_api_call_cache: bool,
    /// Upstream keys this provider accepts but does not implement (logged when loaded).
    #[serde(skip)]
    pub ignored_keys: Vec<String>,
}

/// Why the config is unusable.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// Not JSON or YAML, or not a mapping (position only: the text is never quoted).
    #[error("azure cloud config: {0}")]
    Parse(String),
    /// A key no version of upstream knows (typo?).
    #[error("azure cloud config: unknown key {key:?}{}", hint.map(|h| format!(" (did you mean {h:?}?)")).unwrap_or_default())]
    Unknown {
        /// The key as written.
        key: String,
        /// The nearest known key.
        hint: Option<&'static str>,
    },
    /// A key has a value that is not allowed (wrong type, unknown value, unsupported).
    #[error("azure cloud config: {key}: {message}")]
    Invalid {
        /// The key.
        key: &'static str,
        /// Why.
        message: String,
    },
    /// The Secret could not be read, or lacks the config.
    #[error("azure cloud config: Secret {namespace}/{name}: {message}")]
    Secret {
        /// The Secret's namespace.
        namespace: String,
        /// The Secret's name.
        name: String,
        /// What went wrong.
        message: String,
    },
}

/// What a key's value must be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// Text (numbers and booleans are taken as their text).
    Str,
    /// Text that is never quoted back.
    SecretStr,
    Bool,
    /// A non-negative integer up to `u32::MAX`.
    U32,
    /// A non-negative integer.
    U64,
    /// A TCP/UDP port (1-65535).
    Port,
    Float,
    /// A map of text to text.
    StrMap,
    /// Anything (checked by [`Config::validate`]).
    Any,
    /// One of these values (case-insensitive; stored as spelled here).
    OneOf(&'static [&'static str]),
}

/// Every key [`Config`] has, with its kind.
const KEYS: &[(&str, Kind)] = &[
    ("cloud", Kind::Str),
    ("resourceManagerEndpoint", Kind::Str),
    ("tenantId", Kind::Str),
    ("subscriptionId", Kind::Str),
    ("networkResourceSubscriptionID", Kind::Str),
    ("networkResourceTenantID", Kind::Str),
    ("aadClientId", Kind::Str),
    ("aadClientSecret", Kind::SecretStr),
    ("aadClientCertPath", Kind::Str),
    ("aadClientCertPassword", Kind::SecretStr),
    ("useManagedIdentityExtension", Kind::Bool),
    ("userAssignedIdentityID", Kind::Str),
    ("aadFederatedTokenFile", Kind::Str),
    ("useFederatedWorkloadIdentityExtension", Kind::Bool),
    ("resourceGroup", Kind::Str),
    ("location", Kind::Str),
    ("vnetName", Kind::Str),
    ("vnetResourceGroup", Kind::Str),
    ("subnetName", Kind::Str),
    ("securityGroupName", Kind::Str),
    ("securityGroupResourceGroup", Kind::Str),
    ("routeTableName", Kind::Str),
    ("routeTableResourceGroup", Kind::Str),
    ("vmType", Kind::OneOf(&["standard", "vmss", "vmssflex"])),
    ("primaryAvailabilitySetName", Kind::Str),
    ("primaryScaleSetName", Kind::Str),
    ("loadBalancerSku", Kind::Str),
    ("loadBalancerName", Kind::Str),
    ("loadBalancerResourceGroup", Kind::Str),
    ("excludeMasterFromStandardLB", Kind::Bool),
    (
        "preConfiguredBackendPoolLoadBalancerTypes",
        Kind::OneOf(&["all", "internal", "external", ""]),
    ),
    ("disableOutboundSNAT", Kind::Bool),
    ("maximumLoadBalancerRuleCount", Kind::U32),
    (
        "loadBalancerBackendPoolConfigurationType",
        Kind::OneOf(&["nodeIPConfiguration", "nodeIP", "podIP"]),
    ),
    ("multipleStandardLoadBalancerConfigurations", Kind::Any),
    ("useInstanceMetadata", Kind::Bool),
    ("cloudProviderBackoff", Kind::Bool),
    ("cloudProviderBackoffRetries", Kind::U32),
    ("cloudProviderBackoffExponent", Kind::Float),
    ("cloudProviderBackoffDuration", Kind::U32),
    ("cloudProviderBackoffJitter", Kind::Float),
    ("cloudProviderRateLimit", Kind::Bool),
    ("cloudProviderRateLimitQPS", Kind::Float),
    ("cloudProviderRateLimitBucket", Kind::U32),
    ("cloudProviderRateLimitQPSWrite", Kind::Float),
    ("cloudProviderRateLimitBucketWrite", Kind::U32),
    ("tags", Kind::Str),
    ("tagsMap", Kind::StrMap),
    ("systemTags", Kind::Str),
    ("clusterServiceLoadBalancerHealthProbeMode", Kind::Str),
    ("clusterServiceSharedLoadBalancerHealthProbePort", Kind::Port),
    ("clusterServiceSharedLoadBalancerHealthProbePath", Kind::Str),
    ("routeUpdateIntervalInSeconds", Kind::U64),
    ("cloudConfigType", Kind::OneOf(&["file", "secret", "merge"])),
    ("serviceResourceGroups", Kind::Str),
    ("allowAdditionalPublicIPs", Kind::Bool),
    ("vmCacheTTLInSeconds", Kind::U64),
    ("publicIPCacheTTLInSeconds", Kind::U64),
    ("loadBalancerCacheTTLInSeconds", Kind::U64),
    ("nsgCacheTTLInSeconds", Kind::U64),
    ("routeTableCacheTTLInSeconds", Kind::U64),
    ("loadBalancerBackendPoolUpdateIntervalInSeconds", Kind::U64),
    ("disableAPICallCache", Kind::Bool),
];

/// Upstream keys accepted and ignored: caches, client tuning, and features this provider
/// does not implement (listed in the README). Per-client rate limits (`<client>RateLimit`
/// objects) are accepted too.
const IGNORED_KEYS: &[&str] = &[
    "aadMSIDataPlaneIdentityPath",
    "auxiliaryTokenProvider",
    "availabilitySetNodesCacheTTLInSeconds",
    "availabilitySetsCacheTTLInSeconds",
    "cloudProviderBackoffMode",
    "disableAvailabilitySetNodes",
    "disableAzureStackCloud",
    "enableIPTagMutationForExistingPublicIP",
    "enableMigrateToIPBasedBackendPoolAPI",
    "enableMinimumRetryAfter",
    "enableMultipleStandardLoadBalancers",
    "enableVmssFlexNodes",
    "extendedLocationName",
    "extendedLocationType",
    "identitySystem",
    "listVmssVirtualMachinesWithoutInstanceView",
    "nodeInstanceNotFoundGracePeriodInSeconds",
    "nodePoolsWithoutDedicatedSLB",
    "nonVmssUniformNodesCacheTTLInSeconds",
    "plsCacheTTLInSeconds",
    "privateLinkServiceResourceGroup",
    "providerKeyName",
    "providerKeyVersion",
    "providerVaultName",
    "putVMSSVMBatchSize",
    "routeUpdateWaitingInSeconds",
    "serviceGatewayEnabled",
    "userAgent",
    "vmssCacheTTLInSeconds",
    "vmssFlexCacheTTLInSeconds",
    "vmssFlexVMCacheTTLInSeconds",
    "vmssVirtualMachinesCacheTTLInSeconds",
];

/// The `doc` of every cache-TTL key in [`IGNORED_KEYS`].
const CACHE_TTL_IGNORED: &str = "accepted for compatibility, ignored: this provider keeps no such cache (the caches it keeps: `vmCacheTTLInSeconds`, `publicIPCacheTTLInSeconds`, `loadBalancerCacheTTLInSeconds`, `nsgCacheTTLInSeconds`). Scale-set and NIC reads are not reused across syncs; listings for Nodes are reused for 5 seconds (or as long as one took to fetch); the route table is listed from its own cache (`routeTableCacheTTLInSeconds`, 120 s by default).";
/// The `doc` of the keys tuning upstream's retries.
const RETRY_IGNORED: &str = "accepted for compatibility, ignored: retries are the client's own (throttling, 5xx and broken connections, honouring ARM's `Retry-After`), within each call's deadline.";
/// The `doc` of the keys of multiple standard load balancers.
const MULTI_SLB_IGNORED: &str = "accepted for compatibility, ignored: several standard load balancers are used when `multipleStandardLoadBalancerConfigurations` is non-empty, as upstream.";
/// The `doc` of the Key Vault keys.
const KEY_VAULT_IGNORED: &str =
    "accepted for compatibility, ignored: this provider does not use Key Vault.";
/// The `doc` of the extended-location keys.
const EXTENDED_LOCATION_IGNORED: &str =
    "accepted for compatibility, ignored: extended locations (edge zones) are not implemented.";
/// The `value` of every key in [`IGNORED_KEYS`].
const ANY_VALUE: &str = "any value (not checked)";

/// Every `azure.json` key the parser accepts, with its documentation: the keys of [`KEYS`]
/// (checked as their kind says), then the upstream keys of [`IGNORED_KEYS`] (any value, listed
/// in [`Config::ignored_keys`] and logged), then upstream's per-client rate limits
/// (`<client>RateLimit`). The tests check that it names exactly those keys and feed every
/// example back in; `ccm-docgen` renders it as the configuration reference. `azure.json` has
/// no sections: every `section` is empty.
pub static CONFIG_KEYS: &[KeyDoc] = &[
    KeyDoc {
        section: "",
        key: "cloud",
        value: "`AzurePublicCloud` (default), `AzureChinaCloud` or `AzureUSGovernmentCloud`, any case",
        example: "AzurePublicCloud",
        doc: "The Azure cloud: its ARM and AAD endpoints. `AzureCloud` and `AzureUSGovernment` are taken as the public and US Government clouds; another name needs `resourceManagerEndpoint`, else start-up fails naming this key.",
    },
    KeyDoc {
        section: "",
        key: "resourceManagerEndpoint",
        value: "URL",
        example: "https://management.azure.com/",
        doc: "The ARM endpoint instead of the cloud's (a cloud not in `cloud`'s list); tokens are then asked for `<endpoint>/.default`, and for an unknown cloud the endpoint is also the AAD authority host. Not a URL: start-up fails naming the key.",
    },
    KeyDoc {
        section: "",
        key: "tenantId",
        value: "string",
        example: "4a3b2c1d-0e9f-4a8b-8c7d-6e5f4a3b2c1d",
        doc: "The AAD tenant of the credentials. Required unless `useManagedIdentityExtension`. `AZURE_TENANT_ID` overrides it.",
    },
    KeyDoc {
        section: "",
        key: "subscriptionId",
        value: "string",
        example: "2fbf2a4e-8e1c-4e3c-9c0e-2d2f1c7a9b10",
        doc: "The subscription of the cluster's resources. Required.",
    },
    KeyDoc {
        section: "",
        key: "networkResourceSubscriptionID",
        value: "string",
        example: "3c2b1a09-8f7e-4d6c-b5a4-938271605f4e",
        doc: "The subscription of the network resources when it is not `subscriptionId` (as upstream): load balancers, public IPs, the security group, the virtual network and its subnets and the route table are read and written there (in the resource groups the other keys name); VMs, scale sets, their NICs and private link services stay in `subscriptionId`. The credential needs the network permissions of docs/install-azure.md on this subscription.",
    },
    KeyDoc {
        section: "",
        key: "networkResourceTenantID",
        value: "string",
        example: "0f1e2d3c-4b5a-4978-8695-a4b3c2d1e0f9",
        doc: "The AAD tenant of `networkResourceSubscriptionID` when it is not `tenantId` (as upstream): the service principal (secret or certificate) gets a token from each tenant; calls to the network subscription carry the network tenant's token, and every ARM call carries the network tenant's token in `x-ms-authorization-auxiliary` (ARM's cross-tenant linked authorization: a NIC joining a load balancer's pool in the other tenant). The application must be registered in both tenants. Not with managed or workload identity: start-up fails naming this key.",
    },
    KeyDoc {
        section: "",
        key: "aadClientId",
        value: "string",
        example: "5d8f3c1a-6b7e-4f2d-9a0c-1e2b3c4d5e6f",
        doc: "The client id of the service principal (with `aadClientSecret`) or of the workload identity. `AZURE_CLIENT_ID` overrides it.",
    },
    KeyDoc {
        section: "",
        key: "aadClientSecret",
        value: "secret",
        example: "s3cr3t",
        doc: "The service principal's secret: with `aadClientId` and `tenantId`, the credential used when neither workload nor managed identity is configured. Never logged nor shown in errors. `AZURE_CLIENT_SECRET` overrides it.",
    },
    KeyDoc {
        section: "",
        key: "aadClientCertPath",
        value: "path",
        example: "/etc/kubernetes/sp.pem",
        doc: "The service principal's certificate, used with `aadClientId` and `tenantId` when `aadClientSecret` is empty and neither workload nor managed identity is configured: a PEM file with the certificate registered on the app (the first `CERTIFICATE` section) and its unencrypted RSA key (`PRIVATE KEY` or `RSA PRIVATE KEY`); each token request sends an RS256 client assertion with the certificate's thumbprint. A missing or unreadable file, a PKCS#12 (`.pfx`) file (upstream's other format: convert it with `openssl pkcs12 -nodes`), an encrypted key, or a file without a certificate or an RSA key stops the start naming this key, never quoting the file.",
    },
    KeyDoc {
        section: "",
        key: "aadClientCertPassword",
        value: "secret",
        example: "s3cr3t",
        doc: "Upstream's password of a PKCS#12 `aadClientCertPath`. PKCS#12 files are refused (PEM keys are unencrypted), so it is not used. Never logged nor shown in errors.",
    },
    KeyDoc {
        section: "",
        key: "useManagedIdentityExtension",
        value: "bool, default false",
        example: "true",
        doc: "Authenticate with the VM's managed identity (IMDS), unless workload identity is configured. `tenantId` is then optional.",
    },
    KeyDoc {
        section: "",
        key: "userAssignedIdentityID",
        value: "string",
        example: "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d",
        doc: "Managed identity: the client id of the user-assigned identity to use. Default: the system-assigned identity.",
    },
    KeyDoc {
        section: "",
        key: "aadFederatedTokenFile",
        value: "path",
        example: "/var/run/secrets/azure/tokens/azure-identity-token",
        doc: "Workload identity: the federated token file. Setting it (or `AZURE_FEDERATED_TOKEN_FILE`, which overrides it) turns workload identity on; it needs `aadClientId` and `tenantId`.",
    },
    KeyDoc {
        section: "",
        key: "useFederatedWorkloadIdentityExtension",
        value: "bool, default false",
        example: "true",
        doc: "Authenticate with workload identity (needs `aadFederatedTokenFile`, `aadClientId`, `tenantId`). Workload identity wins over every other credential.",
    },
    KeyDoc {
        section: "",
        key: "resourceGroup",
        value: "string",
        example: "mc_rg_cluster_eastus",
        doc: "The resource group of the cluster's resources, and the default of every other resource group key. Required. Lower-cased, as upstream.",
    },
    KeyDoc {
        section: "",
        key: "location",
        value: "string",
        example: "eastus",
        doc: "The region, where load balancers, public IPs and a missing route table are created. Required unless `useInstanceMetadata`.",
    },
    KeyDoc {
        section: "",
        key: "vnetName",
        value: "string",
        example: "k8s-vnet",
        doc: "The cluster's virtual network. Needed by internal load balancers and by `nodeIP` backend pools.",
    },
    KeyDoc {
        section: "",
        key: "vnetResourceGroup",
        value: "string, default `resourceGroup`",
        example: "network-rg",
        doc: "The virtual network's resource group.",
    },
    KeyDoc {
        section: "",
        key: "subnetName",
        value: "string",
        example: "k8s-subnet",
        doc: "The subnet (in `vnetName`) of internal load balancers' frontends, unless the Service names one (`azure-load-balancer-internal-subnet`); an internal Service without either fails naming this key.",
    },
    KeyDoc {
        section: "",
        key: "securityGroupName",
        value: "string",
        example: "k8s-nsg",
        doc: "The cluster's network security group, where the Services' allow and deny rules go. Never created: a LoadBalancer Service's sync fails without it (or when it does not exist).",
    },
    KeyDoc {
        section: "",
        key: "securityGroupResourceGroup",
        value: "string, default `resourceGroup`",
        example: "network-rg",
        doc: "The security group's resource group.",
    },
    KeyDoc {
        section: "",
        key: "routeTableName",
        value: "string",
        example: "k8s-routetable",
        doc: "The route table of the pod CIDR routes (created in `location` when missing). Without it the provider offers no routes and the route controller does not run.",
    },
    KeyDoc {
        section: "",
        key: "routeTableResourceGroup",
        value: "string, default `resourceGroup`",
        example: "network-rg",
        doc: "The route table's resource group. The config's tags are kept on the table only when it is in `resourceGroup`, as upstream.",
    },
    KeyDoc {
        section: "",
        key: "vmType",
        value: "`standard`, `vmss` or `vmssflex`, any case; default `vmss`",
        example: "vmss",
        doc: "How the nodes are deployed. Nodes are found by `spec.providerID` whatever the type; a node without one is looked up by name among the resource group's VMs (availability-set, standalone and flexible scale-set VMs) and, with `vmss`, among the uniform scale sets' VMs too. Before a backend pool is deleted, `vmss` also takes it out of the models of `resourceGroup`'s scale sets that list it. Absent: `vmss`, as upstream.",
    },
    KeyDoc {
        section: "",
        key: "primaryAvailabilitySetName",
        value: "string",
        example: "k8s-avset",
        doc: "Not used: it selects the nodes of Basic load balancers, which are not supported.",
    },
    KeyDoc {
        section: "",
        key: "primaryScaleSetName",
        value: "string",
        example: "k8s-vmss",
        doc: "Not used: it selects the nodes of Basic load balancers, which are not supported.",
    },
    KeyDoc {
        section: "",
        key: "loadBalancerSku",
        value: "`standard` (default), any case",
        example: "standard",
        doc: "Load balancers and public IPs are always Standard SKU. `basic` is refused at start-up (Azure retired Basic load balancers and public IPs), as is any other value.",
    },
    KeyDoc {
        section: "",
        key: "loadBalancerName",
        value: "string, default the cluster name (`--cluster-name`)",
        example: "kubernetes",
        doc: "The shared load balancer of public Services; internal Services use `<loadBalancerName>-internal`.",
    },
    KeyDoc {
        section: "",
        key: "loadBalancerResourceGroup",
        value: "string, default `resourceGroup`",
        example: "lb-rg",
        doc: "The load balancers' resource group.",
    },
    KeyDoc {
        section: "",
        key: "excludeMasterFromStandardLB",
        value: "bool, default true",
        example: "false",
        doc: "Keep control-plane nodes (`node-role.kubernetes.io/control-plane`, `node-role.kubernetes.io/master`, `kubernetes.io/role: master`) out of the backend pools. Nodes labelled `kubernetes.azure.com/managed: \"false\"` are always left out.",
    },
    KeyDoc {
        section: "",
        key: "disableOutboundSNAT",
        value: "bool, default false",
        example: "true",
        doc: "Load-balancing rules are written with outbound SNAT disabled (the nodes then need another way out).",
    },
    KeyDoc {
        section: "",
        key: "maximumLoadBalancerRuleCount",
        value: "whole number 0 to 4294967295, default 250 (0: 250)",
        example: "250",
        doc: "Checked and not enforced by this provider: ARM's own limit on a load balancer's rules applies.",
    },
    KeyDoc {
        section: "",
        key: "loadBalancerBackendPoolConfigurationType",
        value: "`nodeIPConfiguration` (default) or `nodeIP`, any case",
        example: "nodeIP",
        doc: "`nodeIPConfiguration`: the nodes' NIC (or scale-set) IP configurations reference the backend pool. `nodeIP`: the pool lists the nodes' private IPs in `vnetName`. `podIP` is refused at start-up (service gateways only, upstream).",
    },
    KeyDoc {
        section: "",
        key: "multipleStandardLoadBalancerConfigurations",
        value: "list of `{name, primaryVMSet, allowServicePlacement, serviceLabelSelector, serviceNamespaceSelector, nodeSelector}` (selectors: Kubernetes label selectors), or empty",
        example: r#"[{"name": "kubernetes", "primaryVMSet": "pool-main"}, {"name": "lb-apps", "primaryVMSet": "pool-apps", "serviceNamespaceSelector": {"matchLabels": {"team": "apps"}}}]"#,
        doc: "Several standard load balancers, as upstream: one entry per public load balancer (`<name>-internal` for internal Services); one must be named after the cluster; names and primary VM sets unique; needs `loadBalancerBackendPoolConfigurationType: nodeIP`. A Service goes on an eligible load balancer (the `azure-load-balancer-configurations` annotation, `allowServicePlacement`, the selectors on its labels and its namespace's) and stays there while eligible, else moves; each Node is in one load balancer's pool (its `primaryVMSet`'s, else by `nodeSelector`, fewest Nodes first). An `externalTrafficPolicy: Local` Service gets a pool of its own, `<namespace>-<name>` (`-ipv6`), holding the Nodes with its endpoints (its EndpointSlices), kept in step every `loadBalancerBackendPoolUpdateIntervalInSeconds`. A bad entry is refused at start-up naming the entry and field.",
    },
    KeyDoc {
        section: "",
        key: "useInstanceMetadata",
        value: "bool, default false",
        example: "true",
        doc: "Lets `location` be left out at start-up. The cloud-controller-manager does not read IMDS itself, so load balancers and a missing route table still need `location`; `cloud-node-manager-azure` has its own `--use-instance-metadata` flag.",
    },
    KeyDoc {
        section: "",
        key: "cloudProviderBackoff",
        value: "bool",
        example: "true",
        doc: "Upstream's retry switch. Checked and not used: retries are always on (throttling, 5xx and broken connections, honouring ARM's `Retry-After`), within each call's deadline.",
    },
    KeyDoc {
        section: "",
        key: "cloudProviderBackoffRetries",
        value: "whole number 0 to 4294967295",
        example: "6",
        doc: "Upstream's retry count. Checked and not used (see `cloudProviderBackoff`).",
    },
    KeyDoc {
        section: "",
        key: "cloudProviderBackoffExponent",
        value: "number",
        example: "1.5",
        doc: "Upstream's backoff exponent. Checked and not used (see `cloudProviderBackoff`).",
    },
    KeyDoc {
        section: "",
        key: "cloudProviderBackoffDuration",
        value: "whole number of seconds 0 to 4294967295",
        example: "5",
        doc: "Upstream's backoff duration. Checked and not used (see `cloudProviderBackoff`).",
    },
    KeyDoc {
        section: "",
        key: "cloudProviderBackoffJitter",
        value: "number",
        example: "1.0",
        doc: "Upstream's backoff jitter. Checked and not used (see `cloudProviderBackoff`).",
    },
    KeyDoc {
        section: "",
        key: "cloudProviderRateLimit",
        value: "bool",
        example: "true",
        doc: "Upstream's client-side rate limit switch. Checked and not used: there is no client-side rate limit; ARM's throttling (429) is retried after its `Retry-After`.",
    },
    KeyDoc {
        section: "",
        key: "cloudProviderRateLimitQPS",
        value: "number",
        example: "10",
        doc: "Upstream's read QPS. Checked and not used (see `cloudProviderRateLimit`).",
    },
    KeyDoc {
        section: "",
        key: "cloudProviderRateLimitBucket",
        value: "whole number 0 to 4294967295",
        example: "100",
        doc: "Upstream's read bucket. Checked and not used (see `cloudProviderRateLimit`).",
    },
    KeyDoc {
        section: "",
        key: "cloudProviderRateLimitQPSWrite",
        value: "number",
        example: "10",
        doc: "Upstream's write QPS. Checked and not used (see `cloudProviderRateLimit`).",
    },
    KeyDoc {
        section: "",
        key: "cloudProviderRateLimitBucketWrite",
        value: "whole number 0 to 4294967295",
        example: "100",
        doc: "Upstream's write bucket. Checked and not used (see `cloudProviderRateLimit`).",
    },
    KeyDoc {
        section: "",
        key: "tags",
        value: "`k1=v1,k2=v2`",
        example: "team=web,env=prod",
        doc: "Tags added to (never removed from) the load balancers and the Services' public IPs this provider writes, and kept on the route table when it is in `resourceGroup`. Keys and values are trimmed; `tagsMap` wins over a key equal ignoring case. A pair that is not `key=value` is an error at start naming `tags` (upstream skips it).",
    },
    KeyDoc {
        section: "",
        key: "tagsMap",
        value: "mapping of strings",
        example: "{\"team\": \"web\"}",
        doc: "Tags as a mapping (numbers and booleans are taken as text); a key wins over a `tags` key equal to it ignoring case.",
    },
    KeyDoc {
        section: "",
        key: "systemTags",
        value: "`k1,k2`",
        example: "aks-managed,k8s-azure",
        doc: "Route table only: when set with `tags` or `tagsMap`, the table's other tags are removed unless their key starts with one of these (ignoring case); without it, other tags stay.",
    },
    KeyDoc {
        section: "",
        key: "clusterServiceLoadBalancerHealthProbeMode",
        value: "`servicenodeport` (default) or `shared`, any case",
        example: "shared",
        doc: "`servicenodeport`: each TCP port of a Service is probed on its node port. `shared`: the rules of `externalTrafficPolicy: Cluster` Services all use one HTTP probe (kube-proxy's health endpoint). `externalTrafficPolicy: Local` Services are always probed on their health check node port. Other values are refused at start-up.",
    },
    KeyDoc {
        section: "",
        key: "clusterServiceSharedLoadBalancerHealthProbePort",
        value: "port 1 to 65535, default 10256",
        example: "10256",
        doc: "The shared probe's port (`shared` mode).",
    },
    KeyDoc {
        section: "",
        key: "clusterServiceSharedLoadBalancerHealthProbePath",
        value: "string, default `/healthz`",
        example: "/healthz",
        doc: "The shared probe's path (`shared` mode).",
    },
    KeyDoc {
        section: "",
        key: "routeUpdateIntervalInSeconds",
        value: "whole number of seconds, default 30 (0: 30)",
        example: "30",
        doc: "How long route changes are collected before one write of the route table.",
    },
    KeyDoc {
        section: "",
        key: "cloudConfigType",
        value: "`file`, `secret` or `merge` (default), any case",
        example: "file",
        doc: "Where the config comes from (read from the `--cloud-config` file): `file` the file alone; `secret` the Secret `kube-system/azure-cloud-provider` (key `cloud-config`) alone; `merge` the Secret's keys over the file's (no Secret: the file alone). Without a file: the Secret.",
    },
    KeyDoc {
        section: "",
        key: "serviceResourceGroups",
        value: "comma-separated resource group names, or `*`; default the cluster's own",
        example: "rg,shared-ips-rg",
        doc: "Not upstream's (tenant safety): the resource groups a Service may name with `azure-load-balancer-resource-group` (its public IPs are looked up, created and deleted there) and where `azure-additional-public-ips` addresses are looked up. Default: `resourceGroup`, `loadBalancerResourceGroup` and `vnetResourceGroup`. `*`: any resource group of the subscription. Another resource group in the annotation is an error on the Service naming it, before any ARM call. A name breaking ARM's rules is an error at start.",
    },
    KeyDoc {
        section: "",
        key: "allowAdditionalPublicIPs",
        value: "bool, default false",
        example: "true",
        doc: "Not upstream's (tenant safety): honour `azure-additional-public-ips`. Off, the annotation is an error on the Service (kube-proxy would capture in-cluster traffic to any address written into the status). On, each address must be that of a public IP resource in the resource groups of `serviceResourceGroups`, not used by a network interface, another Service or another cluster, and never a private, loopback, link-local, unspecified or multicast address.",
    },
    KeyDoc {
        section: "",
        key: "aadMSIDataPlaneIdentityPath",
        value: ANY_VALUE,
        example: "/var/run/msi/credentials.json",
        doc: "accepted for compatibility, ignored: managed identity is IMDS's (`useManagedIdentityExtension`, `userAssignedIdentityID`); MSI data-plane identities are not implemented.",
    },
    KeyDoc {
        section: "",
        key: "auxiliaryTokenProvider",
        value: ANY_VALUE,
        example: "{}",
        doc: "accepted for compatibility, ignored: auxiliary tokens for another tenant are not implemented.",
    },
    KeyDoc {
        section: "",
        key: "availabilitySetNodesCacheTTLInSeconds",
        value: ANY_VALUE,
        example: "900",
        doc: CACHE_TTL_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "availabilitySetsCacheTTLInSeconds",
        value: ANY_VALUE,
        example: "600",
        doc: CACHE_TTL_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "cloudProviderBackoffMode",
        value: ANY_VALUE,
        example: "v2",
        doc: RETRY_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "disableAPICallCache",
        value: "bool, default false",
        example: "true",
        doc: "No ARM read is reused across syncs (upstream's switch for its caches): VM and public IP listings are read every time.",
    },
    KeyDoc {
        section: "",
        key: "disableAvailabilitySetNodes",
        value: ANY_VALUE,
        example: "true",
        doc: "accepted for compatibility, ignored: availability-set and standalone VMs are always looked up (`vmType` only adds uniform scale sets).",
    },
    KeyDoc {
        section: "",
        key: "disableAzureStackCloud",
        value: ANY_VALUE,
        example: "true",
        doc: "accepted for compatibility, ignored: Azure Stack Hub is not implemented.",
    },
    KeyDoc {
        section: "",
        key: "enableIPTagMutationForExistingPublicIP",
        value: ANY_VALUE,
        example: "true",
        doc: "accepted for compatibility, ignored: `azure-pip-ip-tags` are set only on public IPs this provider creates.",
    },
    KeyDoc {
        section: "",
        key: "enableMigrateToIPBasedBackendPoolAPI",
        value: ANY_VALUE,
        example: "true",
        doc: "accepted for compatibility, ignored: backend pools are not migrated between kinds; `loadBalancerBackendPoolConfigurationType` applies as written.",
    },
    KeyDoc {
        section: "",
        key: "enableMinimumRetryAfter",
        value: ANY_VALUE,
        example: "true",
        doc: RETRY_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "enableMultipleStandardLoadBalancers",
        value: ANY_VALUE,
        example: "true",
        doc: MULTI_SLB_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "enableVmssFlexNodes",
        value: ANY_VALUE,
        example: "true",
        doc: "accepted for compatibility, ignored: flexible scale-set VMs are always found, as standalone VMs.",
    },
    KeyDoc {
        section: "",
        key: "extendedLocationName",
        value: ANY_VALUE,
        example: "losangeles",
        doc: EXTENDED_LOCATION_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "extendedLocationType",
        value: ANY_VALUE,
        example: "EdgeZone",
        doc: EXTENDED_LOCATION_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "identitySystem",
        value: ANY_VALUE,
        example: "azure_ad",
        doc: "accepted for compatibility, ignored: only Azure AD (Entra ID) credentials are implemented.",
    },
    KeyDoc {
        section: "",
        key: "listVmssVirtualMachinesWithoutInstanceView",
        value: ANY_VALUE,
        example: "true",
        doc: "accepted for compatibility, ignored: client tuning; scale-set VMs are listed as this provider needs.",
    },
    KeyDoc {
        section: "",
        key: "loadBalancerBackendPoolUpdateIntervalInSeconds",
        value: "seconds",
        example: "30",
        doc: "With several standard load balancers: how often the pools of `externalTrafficPolicy: Local` Services are brought in line with the Nodes holding their endpoints (their EndpointSlices; default 30, upstream's; 0 is taken as 1). Each Service sync and node sync also sets them; the shared pools follow every sync, with no periodic updater.",
    },
    KeyDoc {
        section: "",
        key: "loadBalancerCacheTTLInSeconds",
        value: "seconds",
        example: "120",
        doc: "When set, a load balancer's GET is reused for this long across syncs (upstream's load balancer cache; 0: not cached); our own writes drop it. Unset (default): read before every write, so a change made outside the cluster is repaired at the next sync. The node sync (a Node joining or leaving), which writes no load balancer, reuses its read for this long, 120 s when unset (upstream's default); our writes of the load balancer, NICs and scale sets drop it.",
    },
    KeyDoc {
        section: "",
        key: "nodeInstanceNotFoundGracePeriodInSeconds",
        value: ANY_VALUE,
        example: "60",
        doc: "accepted for compatibility, ignored: a node's VM is reported gone only when a complete listing of its resource group (or scale set) lacks it or a GET of it answers 404, with no grace period.",
    },
    KeyDoc {
        section: "",
        key: "nodePoolsWithoutDedicatedSLB",
        value: ANY_VALUE,
        example: "[\"pool1\"]",
        doc: MULTI_SLB_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "nonVmssUniformNodesCacheTTLInSeconds",
        value: ANY_VALUE,
        example: "900",
        doc: CACHE_TTL_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "nsgCacheTTLInSeconds",
        value: "seconds",
        example: "120",
        doc: "When set, the security group's GET is reused for this long across syncs (0: not cached); our own writes drop it. Unset (default): read before every write.",
    },
    KeyDoc {
        section: "",
        key: "plsCacheTTLInSeconds",
        value: ANY_VALUE,
        example: "120",
        doc: CACHE_TTL_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "preConfiguredBackendPoolLoadBalancerTypes",
        value: "`all`, `internal`, `external` or empty (default)",
        example: "all",
        doc: "The load balancers (all, the internal ones, the public ones) whose backend pools the operator fills, as upstream: nodes are neither added to nor removed from their pools, and such a load balancer is not deleted when its last frontend goes (its pool is in use). Other values are an error.",
    },
    KeyDoc {
        section: "",
        key: "privateLinkServiceResourceGroup",
        value: ANY_VALUE,
        example: "pls-rg",
        doc: "accepted for compatibility, ignored: Private Link Service is not supported (`azure-pls-create: \"true\"` is refused).",
    },
    KeyDoc {
        section: "",
        key: "providerKeyName",
        value: ANY_VALUE,
        example: "k8s",
        doc: KEY_VAULT_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "providerKeyVersion",
        value: ANY_VALUE,
        example: "1",
        doc: KEY_VAULT_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "providerVaultName",
        value: ANY_VALUE,
        example: "k8s-vault",
        doc: KEY_VAULT_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "publicIPCacheTTLInSeconds",
        value: "seconds, default 120",
        example: "120",
        doc: "How long a resource group's public IP listing is reused across syncs (upstream's public IP cache; 0: not cached); when set, GETs of one public IP too. Our own public IP writes and deletes drop every cached public IP read.",
    },
    KeyDoc {
        section: "",
        key: "putVMSSVMBatchSize",
        value: ANY_VALUE,
        example: "10",
        doc: "accepted for compatibility, ignored: client tuning; scale-set VM updates are not batched by size.",
    },
    KeyDoc {
        section: "",
        key: "routeTableCacheTTLInSeconds",
        value: "seconds",
        example: "120",
        doc: "How long a route listing may reuse the route table read (upstream's route table cache; default 120; 0: read at every listing). Our writes of the table drop it, and a route is deleted only when the table read afresh still holds it.",
    },
    KeyDoc {
        section: "",
        key: "routeUpdateWaitingInSeconds",
        value: ANY_VALUE,
        example: "30",
        doc: "accepted for compatibility, ignored: route writes are batched by `routeUpdateIntervalInSeconds` alone.",
    },
    KeyDoc {
        section: "",
        key: "serviceGatewayEnabled",
        value: ANY_VALUE,
        example: "true",
        doc: "accepted for compatibility, ignored: service gateways are not implemented (`podIP` backend pools are refused).",
    },
    KeyDoc {
        section: "",
        key: "userAgent",
        value: ANY_VALUE,
        example: "my-ccm",
        doc: "accepted for compatibility, ignored: the user agent is `ccm-rs-azure/<version>`.",
    },
    KeyDoc {
        section: "",
        key: "vmCacheTTLInSeconds",
        value: "seconds, default 60",
        example: "60",
        doc: "How long a resource group's VM listing is reused across load-balancer syncs (upstream's VM cache; 0: not cached). Node lifecycle decisions (is a VM gone, shut down) always read ARM afresh, and each fresh listing refreshes the cache, so a new node's VM is in it once the node is initialised.",
    },
    KeyDoc {
        section: "",
        key: "vmssCacheTTLInSeconds",
        value: ANY_VALUE,
        example: "600",
        doc: CACHE_TTL_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "vmssFlexCacheTTLInSeconds",
        value: ANY_VALUE,
        example: "600",
        doc: CACHE_TTL_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "vmssFlexVMCacheTTLInSeconds",
        value: ANY_VALUE,
        example: "60",
        doc: CACHE_TTL_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "vmssVirtualMachinesCacheTTLInSeconds",
        value: ANY_VALUE,
        example: "600",
        doc: CACHE_TTL_IGNORED,
    },
    KeyDoc {
        section: "",
        key: "<client>RateLimit",
        value: "mapping (any other value: an unknown key)",
        example: "{\"cloudProviderRateLimit\": true, \"cloudProviderRateLimitQPS\": 10}",
        doc: "accepted for compatibility, ignored: upstream's per-client rate limits (`loadBalancerRateLimit`, `virtualMachineScaleSetRateLimit`, ...: any key ending in `RateLimit` whose value is a mapping); there is no client-side rate limit.",
    },
];

fn kind_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "a mapping",
    }
}

/// Edit distance (case-insensitive), for "did you mean".
fn distance(a: &str, b: &str) -> usize {
    let a: Vec<char> = a.to_lowercase().chars().collect();
    let b: Vec<char> = b.to_lowercase().chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.iter().enumerate() {
        let mut cur = vec![i + 1];
        for (j, cb) in b.iter().enumerate() {
            let sub = prev[j] + usize::from(ca != cb);
            cur.push(sub.min(prev[j + 1] + 1).min(cur[j] + 1));
        }
        prev = cur;
    }
    prev[b.len()]
}

fn hint_for(key: &str) -> Option<&'static str> {
    KEYS.iter()
        .map(|(k, _)| *k)
        .chain(IGNORED_KEYS.iter().copied())
        .map(|k| (distance(key, k), k))
        .filter(|(d, _)| *d <= 3)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

/// Checks one value against its kind and normalises it (text for numbers given to string
/// keys, canonical spelling for enumerations). `None`: drop the key (null is "unset").
fn check(key: &'static str, kind: Kind, value: Value) -> Result<Option<Value>, ConfigError> {
    let wrong = |expected: &str, v: &Value| ConfigError::Invalid {
        key,
        message: format!("expected {expected}, got {}", kind_name(v)),
    };
    if value.is_null() {
        return Ok(None);
    }
    let out = match kind {
        Kind::Str | Kind::SecretStr => match value {
            Value::String(_) => value,
            Value::Number(n) => Value::String(n.to_string()),
            Value::Bool(b) => Value::String(b.to_string()),
            other => return Err(wrong("a string", &other)),
        },
        Kind::Bool => match value {
            Value::Bool(_) => value,
            other => return Err(wrong("true or false", &other)),
        },
        Kind::U32 | Kind::U64 | Kind::Port => {
            let (max, what) = match kind {
                Kind::U32 => (u64::from(u32::MAX), "a whole number from 0 to 4294967295"),
                Kind::Port => (65535, "a port from 1 to 65535"),
                _ => (u64::MAX, "a whole number from 0"),
            };
            match value.as_u64() {
                Some(n) if n <= max && !(kind == Kind::Port && n == 0) => value,
                _ if value.is_number() => {
                    return Err(ConfigError::Invalid {
                        key,
                        message: format!("expected {what}, got {value}"),
                    });
                }
                _ => return Err(wrong(what, &value)),
            }
        }
        Kind::Float => match value {
            Value::Number(_) => value,
            other => return Err(wrong("a number", &other)),
        },
        Kind::StrMap => match value {
            Value::Object(map) => {
                let mut out = Map::new();
                for (k, v) in map {
                    let v = match v {
                        Value::String(_) => v,
                        Value::Number(n) => Value::String(n.to_string()),
                        Value::Bool(b) => Value::String(b.to_string()),
                        Value::Null => Value::String(String::new()),
                        other => {
                            return Err(ConfigError::Invalid {
                                key,
                                message: format!(
                                    "the value of {k:?} must be a string, got {}",
                                    kind_name(&other)
                                ),
                            });
                        }
                    };
                    out.insert(k, v);
                }
                Value::Object(out)
            }
            other => return Err(wrong("a mapping of strings", &other)),
        },
        Kind::Any => value,
        Kind::OneOf(allowed) => match &value {
            Value::String(s) => match allowed.iter().find(|a| a.eq_ignore_ascii_case(s.trim())) {
                Some(a) => Value::String((*a).to_string()),
                None => {
                    return Err(ConfigError::Invalid {
                        key,
                        message: format!(
                            "unsupported value {s:?}; expected one of {}",
                            allowed.join(", ")
                        ),
                    });
                }
            },
            other => return Err(wrong(&format!("one of {}", allowed.join(", ")), other)),
        },
    };
    Ok(Some(out))
}

/// A parsed document: canonical keys with checked values, and the ignored upstream keys.
#[derive(Debug, Default, Clone)]
struct Document {
    keys: Map<String, Value>,
    ignored: Vec<String>,
}

impl Document {
    fn parse(text: &str) -> Result<Document, ConfigError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let trimmed = text.trim_start();
        if trimmed.is_empty() {
            return Ok(Document::default());
        }
        let value: Value = if trimmed.starts_with('{') {
            serde_json::from_str(text).map_err(|e| {
                use serde_json::error::Category;
                let what = match e.classify() {
                    Category::Eof => "unexpected end of input",
                    Category::Syntax | Category::Io | Category::Data => "invalid JSON",
                };
                ConfigError::Parse(format!("{what} at line {} column {}", e.line(), e.column()))
            })?
        } else {
            serde_saphyr::from_str(text).map_err(|e| {
                // The parser's own text may quote the source (snippets, scalars): position only.
                let at = e
                    .location()
                    .map(|l| format!(" at line {} column {}", l.line(), l.column()))
                    .unwrap_or_default();
                ConfigError::Parse(format!("neither valid JSON nor valid YAML{at}"))
            })?
        };
        let map = match value {
            Value::Object(map) => map,
            Value::Null => return Ok(Document::default()),
            other => {
                return Err(ConfigError::Parse(format!(
                    "expected a mapping of keys to values, got {}",
                    kind_name(&other)
                )));
            }
        };
        let mut doc = Document::default();
        for (key, value) in map {
            if let Some((canonical, kind)) = KEYS.iter().find(|(k, _)| k.eq_ignore_ascii_case(&key))
            {
                if doc.keys.contains_key(*canonical) {
                    return Err(ConfigError::Invalid {
                        key: canonical,
                        message: "given more than once (keys match case-insensitively)".into(),
                    });
                }
                if let Some(v) = check(canonical, *kind, value)? {
                    doc.keys.insert((*canonical).to_string(), v);
                }
            } else if let Some(k) = IGNORED_KEYS.iter().find(|k| k.eq_ignore_ascii_case(&key)) {
                doc.ignored.push((*k).to_string());
            } else if key.ends_with("RateLimit") && value.is_object() {
                doc.ignored.push(key);
            } else {
                return Err(ConfigError::Unknown { hint: hint_for(&key), key });
            }
        }
        Ok(doc)
    }

    /// `other`'s keys over this document's.
    fn overlay(mut self, other: Document) -> Document {
        for (k, v) in other.keys {
            self.keys.insert(k, v);
        }
        for k in other.ignored {
            if !self.ignored.contains(&k) {
                self.ignored.push(k);
            }
        }
        self
    }

    fn into_config(self) -> Result<Config, ConfigError> {
        let has_vm_type = self.keys.contains_key("vmType");
        let mut config: Config = match serde_json::from_value(Value::Object(self.keys.clone())) {
            Ok(c) => c,
            Err(_) => {
                // Every value was checked; find the key anyway rather than echo serde's text.
                for (k, v) in &self.keys {
                    let one: Map<String, Value> = [(k.clone(), v.clone())].into_iter().collect();
                    if serde_json::from_value::<Config>(Value::Object(one)).is_err() {
                        let key = KEYS.iter().find(|(c, _)| c == k).map_or("?", |(c, _)| *c);
                        return Err(ConfigError::Invalid {
                            key,
                            message: "value of the wrong type".into(),
                        });
                    }
                }
                return Err(ConfigError::Parse("the keys do not fit together".into()));
            }
        };
        if !has_vm_type {
            // Upstream: an unset vmType is vmss (whose lookups also find standalone VMs).
            config.vm_type = VmType::Vmss;
        }
        // Upstream lower-cases the resource group (ARM returns it in varying case).
        if let Some(rg) = &mut config.resource_group {
            *rg = rg.to_lowercase();
        }
        config.ignored_keys = self.ignored;
        Ok(config)
    }
}

impl fmt::Debug for Config {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let redacted = |s: &Option<String>| s.as_ref().map(|_| "<redacted>");
        let mut d = f.debug_struct("Config");
        d.field("cloud", &self.cloud)
            .field("resource_manager_endpoint", &self.resource_manager_endpoint)
            .field("tenant_id", &self.tenant_id)
            .field("subscription_id", &self.subscription_id)
            .field("network_resource_subscription_id", &self.network_resource_subscription_id)
            .field("network_resource_tenant_id", &self.network_resource_tenant_id)
            .field("aad_client_id", &self.aad_client_id)
            .field("aad_client_secret", &redacted(&self.aad_client_secret))
            .field("aad_client_cert_path", &self.aad_client_cert_path)
            .field("aad_client_cert_password", &redacted(&self.aad_client_cert_password))
            .field("use_managed_identity_extension", &self.use_managed_identity_extension)
            .field("user_assigned_identity_id", &self.user_assigned_identity_id)
            .field("aad_federated_token_file", &self.aad_federated_token_file)
            .field(
                "use_federated_workload_identity_extension",
                &self.use_federated_workload_identity_extension,
            )
            .field("resource_group", &self.resource_group)
            .field("location", &self.location)
            .field("vnet_name", &self.vnet_name)
            .field("vnet_resource_group", &self.vnet_resource_group)
            .field("subnet_name", &self.subnet_name)
            .field("security_group_name", &self.security_group_name)
            .field("security_group_resource_group", &self.security_group_resource_group)
            .field("route_table_name", &self.route_table_name)
            .field("route_table_resource_group", &self.route_table_resource_group)
            .field("vm_type", &self.vm_type)
            .field("primary_availability_set_name", &self.primary_availability_set_name)
            .field("primary_scale_set_name", &self.primary_scale_set_name)
            .field("load_balancer_sku", &self.load_balancer_sku)
            .field("load_balancer_name", &self.load_balancer_name)
            .field("load_balancer_resource_group", &self.load_balancer_resource_group)
            .field("exclude_master_from_standard_lb", &self.exclude_master_from_standard_lb)
            .field(
                "pre_configured_backend_pool_load_balancer_types",
                &self.pre_configured_backend_pool_load_balancer_types,
            )
            .field("disable_outbound_snat", &self.disable_outbound_snat)
            .field("maximum_load_balancer_rule_count", &self.maximum_load_balancer_rule_count)
            .field(
                "load_balancer_backend_pool_configuration_type",
                &self.load_balancer_backend_pool_configuration_type,
            )
            .field(
                "multiple_standard_load_balancer_configurations",
                &self.multiple_standard_load_balancer_configurations,
            )
            .field("use_instance_metadata", &self.use_instance_metadata)
            .field("cloud_provider_backoff", &self.cloud_provider_backoff)
            .field("cloud_provider_backoff_retries", &self.cloud_provider_backoff_retries)
            .field("cloud_provider_backoff_exponent", &self.cloud_provider_backoff_exponent)
            .field("cloud_provider_backoff_duration", &self.cloud_provider_backoff_duration)
            .field("cloud_provider_backoff_jitter", &self.cloud_provider_backoff_jitter)
            .field("cloud_provider_rate_limit", &self.cloud_provider_rate_limit)
            .field("cloud_provider_rate_limit_qps", &self.cloud_provider_rate_limit_qps)
            .field("cloud_provider_rate_limit_bucket", &self.cloud_provider_rate_limit_bucket)
            .field("cloud_provider_rate_limit_qps_write", &self.cloud_provider_rate_limit_qps_write)
            .field(
                "cloud_provider_rate_limit_bucket_write",
                &self.cloud_provider_rate_limit_bucket_write,
            )
            .field("tags", &self.tags)
            .field("tags_map", &self.tags_map)
            .field("system_tags", &self.system_tags)
            .field(
                "cluster_service_load_balancer_health_probe_mode",
                &self.cluster_service_load_balancer_health_probe_mode,
            )
            .field(
                "cluster_service_shared_load_balancer_health_probe_port",
                &self.cluster_service_shared_load_balancer_health_probe_port,
            )
            .field(
                "cluster_service_shared_load_balancer_health_probe_path",
                &self.cluster_service_shared_load_balancer_health_probe_path,
            )
            .field("route_update_interval_in_seconds", &self.route_update_interval_in_seconds)
            .field("cloud_config_type", &self.cloud_config_type)
            .field("ignored_keys", &self.ignored_keys)
            .finish()
    }
}

/// The environment variables upstream reads over the config (injected by the workload
/// identity webhook): `AZURE_TENANT_ID`, `AZURE_CLIENT_ID`, `AZURE_CLIENT_SECRET`,
/// `AZURE_FEDERATED_TOKEN_FILE` (which also turns workload identity on).
pub const ENV_OVERRIDES: &[&str] =
    &["AZURE_TENANT_ID", "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_FEDERATED_TOKEN_FILE"];

impl Config {
    /// Parses `azure.json` (JSON, or YAML when it is not JSON). No environment overrides,
    /// no CCM checks (see [`Config::apply_env`], [`Config::validate`]).
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        Document::parse(text)?.into_config()
    }

    /// [`Config::parse`] of a file's bytes, then the process environment's overrides.
    pub fn from_bytes(bytes: &[u8]) -> Result<Config, ConfigError> {
        let text = std::str::from_utf8(bytes).map_err(|e| {
            ConfigError::Parse(format!("not UTF-8 text (byte {})", e.valid_up_to()))
        })?;
        let mut config = Config::parse(text)?;
        config.apply_env(&|k| std::env::var(k).ok());
        Ok(config)
    }

    /// Upstream's environment overrides ([`ENV_OVERRIDES`]); empty values are ignored.
    pub fn apply_env(&mut self, env: &dyn Fn(&str) -> Option<String>) {
        let var = |k: &str| env(k).filter(|v| !v.is_empty());
        if let Some(v) = var("AZURE_TENANT_ID") {
            self.tenant_id = Some(v);
        }
        if let Some(v) = var("AZURE_CLIENT_ID") {
            self.aad_client_id = Some(v);
        }
        if let Some(v) = var("AZURE_CLIENT_SECRET") {
            self.aad_client_secret = Some(v);
        }
        if let Some(v) = var("AZURE_FEDERATED_TOKEN_FILE") {
            self.aad_federated_token_file = Some(v);
            self.use_federated_workload_identity_extension = true;
        }
    }

    /// What the cloud-controller-manager needs: `subscriptionId`, `resourceGroup`,
    /// `location` (unless `useInstanceMetadata`), `tenantId` (unless managed identity),
    /// and only what this provider implements (standard SKU, one standard load balancer,
    /// no pod-IP backend pools, a known health-probe mode).
    pub fn validate(&self) -> Result<(), ConfigError> {
        let missing = |v: &Option<String>| v.as_deref().is_none_or(|s| s.trim().is_empty());
        if missing(&self.subscription_id) {
            return Err(ConfigError::Invalid { key: "subscriptionId", message: "required".into() });
        }
        if missing(&self.resource_group) {
            return Err(ConfigError::Invalid { key: "resourceGroup", message: "required".into() });
        }
        if missing(&self.location) && !self.use_instance_metadata {
            return Err(ConfigError::Invalid {
                key: "location",
                message: "required (or set useInstanceMetadata to read it from IMDS)".into(),
            });
        }
        if missing(&self.tenant_id) && !self.use_managed_identity_extension {
            return Err(ConfigError::Invalid {
                key: "tenantId",
                message: "required (except with useManagedIdentityExtension)".into(),
            });
        }
        if let Some(sub) = self.network_resource_subscription_id.as_deref() {
            crate::client::names::check_segment(sub.trim()).map_err(|message| {
                ConfigError::Invalid { key: "networkResourceSubscriptionID", message }
            })?;
        }
        if let Some(tenant) = self.network_resource_tenant_id.as_deref().map(str::trim)
            && !tenant.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        {
            return Err(ConfigError::Invalid {
                key: "networkResourceTenantID",
                message: "not a tenant ID (letters, digits, '-' and '.' only)".into(),
            });
        }
        if let Some(tags) = self.tags.as_deref().filter(|t| !t.trim().is_empty()) {
            for pair in tags.split(',') {
                let parts: Vec<&str> = pair.split('=').collect();
                if parts.len() != 2 || parts[0].trim().is_empty() {
                    return Err(ConfigError::Invalid {
                        key: "tags",
                        message: format!(
                            "{:?} is not key=value (pairs are comma-separated)",
                            pair.trim()
                        ),
                    });
                }
            }
        }
        match self.load_balancer_sku.as_deref().map(str::trim) {
            None | Some("") => {}
            Some(s) if s.eq_ignore_ascii_case("standard") => {}
            Some(s) if s.eq_ignore_ascii_case("basic") => {
                return Err(ConfigError::Invalid {
                    key: "loadBalancerSku",
                    message: "the Basic SKU is not supported by this provider (Azure retired Basic load balancers and public IPs on 30 September 2025); use standard".into(),
                });
            }
            Some(s) => {
                return Err(ConfigError::Invalid {
                    key: "loadBalancerSku",
                    message: format!("unsupported value {s:?}; expected standard"),
                });
            }
        }
        match self.cluster_service_load_balancer_health_probe_mode.as_deref().map(str::trim) {
            None | Some("") => {}
            Some(m)
                if m.eq_ignore_ascii_case("servicenodeport")
                    || m.eq_ignore_ascii_case("shared") => {}
            Some(m) => {
                return Err(ConfigError::Invalid {
                    key: "clusterServiceLoadBalancerHealthProbeMode",
                    message: format!("unsupported value {m:?}; expected servicenodeport or shared"),
                });
            }
        }
        if let Some(v) = &self.multiple_standard_load_balancer_configurations {
            let configs =
                crate::load_balancer::multi_slb::parse(v).map_err(|e| ConfigError::Invalid {
                    key: "multipleStandardLoadBalancerConfigurations",
                    message: e.to_string(),
                })?;
            if !configs.is_empty()
                && self.load_balancer_backend_pool_configuration_type != BackendPoolType::NodeIp
            {
                return Err(ConfigError::Invalid {
                    key: "multipleStandardLoadBalancerConfigurations",
                    message: "several load balancers need loadBalancerBackendPoolConfigurationType: nodeIP (as upstream)".into(),
                });
            }
        }
        if self.load_balancer_backend_pool_configuration_type == BackendPoolType::PodIp {
            return Err(ConfigError::Invalid {
                key: "loadBalancerBackendPoolConfigurationType",
                message: "podIP is not supported by this provider (upstream: service gateways only); use nodeIPConfiguration or nodeIP".into(),
            });
        }
        self.validate_names()
    }

    /// Every value naming an ARM resource follows ARM's rules for its type (it goes into
    /// ARM URLs).
    pub fn validate_names(&self) -> Result<(), ConfigError> {
        use crate::client::names::{NameKind, check};
        let named: [(&'static str, &Option<String>, NameKind); 10] = [
            ("resourceGroup", &self.resource_group, NameKind::ResourceGroup),
            ("vnetResourceGroup", &self.vnet_resource_group, NameKind::ResourceGroup),
            (
                "securityGroupResourceGroup",
                &self.security_group_resource_group,
                NameKind::ResourceGroup,
            ),
            ("routeTableResourceGroup", &self.route_table_resource_group, NameKind::ResourceGroup),
            (
                "loadBalancerResourceGroup",
                &self.load_balancer_resource_group,
                NameKind::ResourceGroup,
            ),
            ("vnetName", &self.vnet_name, NameKind::Network),
            ("subnetName", &self.subnet_name, NameKind::Network),
            ("securityGroupName", &self.security_group_name, NameKind::Network),
            ("routeTableName", &self.route_table_name, NameKind::Network),
            ("loadBalancerName", &self.load_balancer_name, NameKind::Network),
        ];
        for (key, value, kind) in named {
            if let Some(v) = value.as_deref().filter(|v| !v.is_empty()) {
                check(kind, v).map_err(|message| ConfigError::Invalid { key, message })?;
            }
        }
        if let Some(list) = &self.service_resource_groups {
            for rg in list.split(',').map(str::trim).filter(|g| !g.is_empty() && *g != "*") {
                check(NameKind::ResourceGroup, rg).map_err(|message| ConfigError::Invalid {
                    key: "serviceResourceGroups",
                    message,
                })?;
            }
        }
        Ok(())
    }

    /// The resource groups a Service may name ([`ServiceGroups::Any`] for `*`): the
    /// `serviceResourceGroups` list, else the cluster's own — `resourceGroup`,
    /// `loadBalancerResourceGroup`, `vnetResourceGroup` (without repeats, ignoring case).
    pub fn service_resource_groups(&self) -> ServiceGroups {
        let mut out: Vec<String> = Vec::new();
        let mut add = |g: &str| {
            let g = g.trim();
            if !g.is_empty() && !out.iter().any(|o| o.eq_ignore_ascii_case(g)) {
                out.push(g.to_string());
            }
        };
        match self.service_resource_groups.as_deref().filter(|l| !l.trim().is_empty()) {
            Some(list) => {
                if list.split(',').any(|g| g.trim() == "*") {
                    return ServiceGroups::Any;
                }
                list.split(',').for_each(&mut add);
            }
            None => {
                add(self.resource_group());
                add(self.load_balancer_resource_group());
                add(self.vnet_resource_group());
            }
        }
        ServiceGroups::Only(out)
    }

    /// The resource group of the cluster's resources (`""` when unset).
    pub fn resource_group(&self) -> &str {
        self.resource_group.as_deref().unwrap_or_default()
    }

    /// The virtual network's resource group.
    pub fn vnet_resource_group(&self) -> &str {
        self.vnet_resource_group.as_deref().unwrap_or(self.resource_group())
    }

    /// The security group's resource group.
    pub fn security_group_resource_group(&self) -> &str {
        self.security_group_resource_group.as_deref().unwrap_or(self.resource_group())
    }

    /// The route table's resource group.
    pub fn route_table_resource_group(&self) -> &str {
        self.route_table_resource_group.as_deref().unwrap_or(self.resource_group())
    }

    /// The load balancers' resource group.
    pub fn load_balancer_resource_group(&self) -> &str {
        self.load_balancer_resource_group.as_deref().unwrap_or(self.resource_group())
    }

    /// The subscription of the network resources: `networkResourceSubscriptionID` when set
    /// (and not blank), else `subscriptionId` (upstream's `getNetworkResourceSubscriptionID`).
    pub fn network_subscription_id(&self) -> Option<&str> {
        self.network_resource_subscription_id
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .or(self.subscription_id.as_deref())
    }

    /// The network tenant when it differs from `tenantId` (upstream's `IsMultiTenant`):
    /// then network calls need that tenant's token, and every call an auxiliary one.
    pub fn network_tenant_id(&self) -> Option<&str> {
        let net = self.network_resource_tenant_id.as_deref().map(str::trim)?;
        let home = self.tenant_id.as_deref().map(str::trim).unwrap_or_default();
        (!net.is_empty() && !net.eq_ignore_ascii_case(home)).then_some(net)
    }

    /// Seconds between batched route-table writes (`routeUpdateIntervalInSeconds`; unset or
    /// 0: upstream's 30).
    pub fn route_update_interval(&self) -> Duration {
        match self.route_update_interval_in_seconds {
            Some(s) if s > 0 => Duration::from_secs(s),
            _ => DEFAULT_ROUTE_UPDATE_INTERVAL,
        }
    }

    /// `clusterServiceLoadBalancerHealthProbeMode` is `shared`.
    pub fn shared_health_probe(&self) -> bool {
        self.cluster_service_load_balancer_health_probe_mode
            .as_deref()
            .is_some_and(|m| m.trim().eq_ignore_ascii_case("shared"))
    }

    /// The shared probe's port (default 10256, kube-proxy's health port).
    pub fn shared_health_probe_port(&self) -> i32 {
        self.cluster_service_shared_load_balancer_health_probe_port.unwrap_or(10256)
    }

    /// The shared probe's path (default `/healthz`).
    pub fn shared_health_probe_path(&self) -> &str {
        self.cluster_service_shared_load_balancer_health_probe_path
            .as_deref()
            .filter(|p| !p.trim().is_empty())
            .unwrap_or("/healthz")
    }

    /// Whether the operator fills the backend pools of the internal (or public) load
    /// balancer (`preConfiguredBackendPoolLoadBalancerTypes`, upstream's
    /// `isBackendPoolPreConfigured`).
    pub fn backend_pool_pre_configured(&self, internal: bool) -> bool {
        match self.pre_configured_backend_pool_load_balancer_types.as_deref().map(str::trim) {
            Some(t) if t.eq_ignore_ascii_case("all") => true,
            Some(t) if t.eq_ignore_ascii_case("internal") => internal,
            Some(t) if t.eq_ignore_ascii_case("external") => !internal,
            _ => false,
        }
    }

    /// `excludeMasterFromStandardLB` (default true).
    pub fn exclude_master_from_standard_lb(&self) -> bool {
        self.exclude_master_from_standard_lb.unwrap_or(true)
    }

    /// `maximumLoadBalancerRuleCount` (unset or 0: 250).
    pub fn maximum_load_balancer_rule_count(&self) -> u32 {
        self.maximum_load_balancer_rule_count.filter(|n| *n > 0).unwrap_or(250)
    }

    /// The tags for resources the CCM creates, from `tags` (`k1=v1,k2=v2`) and `tagsMap`,
    /// as upstream: keys and values trimmed (a value spelled `null` in any case keeps its
    /// spaces: ARM reserves `null`), pairs without exactly one `=` or with an empty key
    /// skipped with a warning, and a `tagsMap` key replacing a `tags` key equal to it
    /// ignoring case.
    pub fn resource_tags(&self) -> BTreeMap<String, String> {
        let mut out = BTreeMap::new();
        let trim_value = |v: &str| {
            let t = v.trim();
            if t.eq_ignore_ascii_case("null") { v.to_string() } else { t.to_string() }
        };
        if let Some(tags) = self.tags.as_deref().filter(|t| !t.is_empty()) {
            for pair in tags.split(',') {
                let parts: Vec<&str> = pair.split('=').collect();
                let [k, v] = parts.as_slice() else {
                    tracing::warn!(pair, "azure cloud config: tags: not key=value, ignored");
                    continue;
                };
                let k = k.trim();
                if k.is_empty() {
                    tracing::warn!("azure cloud config: tags: empty key, ignored");
                    continue;
                }
                out.insert(k.to_string(), trim_value(v));
            }
        }
        for (k, v) in self.tags_map.iter().flatten() {
            let key = k.trim();
            if key.is_empty() {
                tracing::warn!("azure cloud config: tagsMap: empty key, ignored");
                continue;
            }
            let same: Vec<String> =
                out.keys().filter(|o| o.eq_ignore_ascii_case(key) && *o != key).cloned().collect();
            for o in same {
                out.remove(&o);
            }
            out.insert(key.to_string(), trim_value(v));
        }
        out
    }

    /// `systemTags`: tag keys the CCM owns (comma-separated, trimmed, empty ones dropped).
    pub fn system_tag_keys(&self) -> Vec<String> {
        self.system_tags
            .iter()
            .flat_map(|s| s.split(','))
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_string)
            .collect()
    }
}

/// Where [`load_from`] finds the Secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretLocation {
    /// Namespace.
    pub namespace: String,
    /// Name.
    pub name: String,
    /// The data key holding the config.
    pub key: String,
}

impl Default for SecretLocation {
    fn default() -> Self {
        SecretLocation {
            namespace: SECRET_NAMESPACE.into(),
            name: SECRET_NAME.into(),
            key: SECRET_KEY.into(),
        }
    }
}

/// The config the CCM runs on: the `--cloud-config` file and/or the Secret
/// `kube-system/azure-cloud-provider` (key `cloud-config`) as the file's `cloudConfigType`
/// says, then the environment's overrides.
///
/// - no file: the Secret alone;
/// - `file`: the file alone (the Secret is not read);
/// - `secret`: the Secret alone;
/// - `merge` (default): the keys the Secret sets over the file's. A Secret that does not
///   exist (or no API client) leaves the file alone, so upstream's usual setup (a file and
///   no Secret) works; any other failure to read it is an error.
///
/// Reads at most that one Secret by name (`get`, never `list`).
pub async fn load(file: Option<&[u8]>, kube: Option<kube::Client>) -> Result<Config, ConfigError> {
    load_from(file, kube, &SecretLocation::default(), &|k| std::env::var(k).ok()).await
}

/// [`load`] with the Secret's location and the environment given (tests).
pub async fn load_from(
    file: Option<&[u8]>,
    kube: Option<kube::Client>,
    at: &SecretLocation,
    env: &(dyn Fn(&str) -> Option<String> + Sync),
) -> Result<Config, ConfigError> {
    let file_doc = match file {
        Some(bytes) => Some(Document::parse(std::str::from_utf8(bytes).map_err(|e| {
            ConfigError::Parse(format!("not UTF-8 text (byte {})", e.valid_up_to()))
        })?)?),
        None => None,
    };
    let kind = match &file_doc {
        None => CloudConfigType::Secret,
        Some(doc) => match doc.keys.get("cloudConfigType").and_then(Value::as_str) {
            Some("file") => CloudConfigType::File,
            Some("secret") => CloudConfigType::Secret,
            _ => CloudConfigType::Merge,
        },
    };
    let doc = match (kind, file_doc) {
        (CloudConfigType::File, Some(doc)) => doc,
        (CloudConfigType::Merge, Some(doc)) => match kube {
            Some(client) => match read_secret(client, at).await? {
                Some(secret) => doc.overlay(secret),
                None => {
                    tracing::info!(
                        secret = %format!("{}/{}", at.namespace, at.name),
                        "azure cloud config: no Secret to merge; using the file alone"
                    );
                    doc
                }
            },
            None => doc,
        },
        (_, _) => {
            let client = kube.ok_or_else(|| ConfigError::Secret {
                namespace: at.namespace.clone(),
                name: at.name.clone(),
                message: "cloudConfigType secret (or no --cloud-config file) needs the API server"
                    .into(),
            })?;
            read_secret(client, at).await?.ok_or_else(|| ConfigError::Secret {
                namespace: at.namespace.clone(),
                name: at.name.clone(),
                message: "not found".into(),
            })?
        }
    };
    let mut config = doc.into_config()?;
    config.apply_env(env);
    if !config.ignored_keys.is_empty() {
        tracing::warn!(
            keys = %config.ignored_keys.join(", "),
            "azure cloud config: upstream keys accepted but not implemented by this provider"
        );
    }
    Ok(config)
}

/// One `get` of the Secret: the bytes of its key `at.key`; `None` when the Secret does not
/// exist (a Secret without the key is an error naming the key).
pub async fn read_secret_bytes(
    client: kube::Client,
    at: &SecretLocation,
) -> Result<Option<Vec<u8>>, ConfigError> {
    use k8s_openapi::api::core::v1::Secret;
    let fail = |message: String| ConfigError::Secret {
        namespace: at.namespace.clone(),
        name: at.name.clone(),
        message,
    };
    let api: kube::Api<Secret> = kube::Api::namespaced(client, &at.namespace);
    let secret = tokio::time::timeout(SECRET_READ_TIMEOUT, api.get_opt(&at.name))
        .await
        .map_err(|_| fail(format!("no answer within {}s", SECRET_READ_TIMEOUT.as_secs())))?
        .map_err(|e| fail(format!("reading it: {e}")))?;
    let Some(secret) = secret else { return Ok(None) };
    secret
        .data
        .as_ref()
        .and_then(|d| d.get(&at.key))
        .map(|b| b.0.clone())
        .or_else(|| {
            secret.string_data.as_ref().and_then(|d| d.get(&at.key)).map(|s| s.clone().into_bytes())
        })
        .map(Some)
        .ok_or_else(|| fail(format!("has no key {:?}", at.key)))
}

/// One `get` of the Secret, its key parsed; `None` when it does not exist.
async fn read_secret(
    client: kube::Client,
    at: &SecretLocation,
) -> Result<Option<Document>, ConfigError> {
    let fail = |message: String| ConfigError::Secret {
        namespace: at.namespace.clone(),
        name: at.name.clone(),
        message,
    };
    let Some(bytes) = read_secret_bytes(client, at).await? else { return Ok(None) };
    let text = std::str::from_utf8(&bytes)
        .map_err(|_| fail(format!("key {:?} is not UTF-8 text", at.key)))?;
    Document::parse(text).map(Some).map_err(|e| {
        fail(format!(
            "key {:?}: {}",
            at.key,
            e.to_string().trim_start_matches("azure cloud config: ")
        ))
    })
}

/// The fuzz target's entry: parses `bytes` (as `--cloud-config` contents), checks the
/// result and renders it as the manager would log it.
#[cfg(feature = "fuzzing")]
pub fn fuzz_parse(bytes: &[u8]) {
    if let Ok(text) = std::str::from_utf8(bytes) {
        match Config::parse(text) {
            Ok(c) => {
                let _ = c.validate();
                drop(format!("{c:?}"));
                drop(c.resource_tags());
                drop(c.system_tag_keys());
            }
            Err(e) => drop(format!("{e} {e:?}")),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    fn err(text: &str) -> String {
        match Config::parse(text) {
            Ok(c) => panic!("expected an error for {text}, got {c:?}"),
            Err(e) => e.to_string(),
        }
    }

    const AKS: &str = r#"{
        "cloud": "AzurePublicCloud",
        "tenantId": "t-1",
        "subscriptionID": "s-1",
        "aadClientId": "msi",
        "aadClientSecret": "msi",
        "resourceGroup": "MC_RG_Cluster",
        "location": "eastus",
        "vmType": "VMSS",
        "subnetName": "aks-subnet",
        "securityGroupName": "aks-agentpool-nsg",
        "vnetName": "aks-vnet",
        "routeTableName": "aks-agentpool-routetable",
        "loadBalancerSku": "Standard",
        "cloudProviderBackoff": true,
        "cloudProviderBackoffMode": "v2",
        "cloudProviderBackoffRetries": 6,
        "cloudProviderRateLimitQPS": 10.5,
        "useManagedIdentityExtension": false,
        "useInstanceMetadata": true,
        "excludeMasterFromStandardLB": true,
        "providerVaultName": "",
        "loadBalancerRateLimit": {"cloudProviderRateLimit": true},
        "maximumLoadBalancerRuleCount": 250
    }"#;

    #[test]
    fn an_upstream_json_parses_with_keys_matched_ignoring_case() {
        let c = Config::parse(AKS).unwrap();
        assert_eq!(c.subscription_id.as_deref(), Some("s-1"));
        assert_eq!(c.resource_group(), "mc_rg_cluster", "lower-cased as upstream");
        assert_eq!(c.vm_type, VmType::Vmss);
        assert_eq!(c.cloud_provider_rate_limit_qps, Some(10.5));
        assert_eq!(
            c.ignored_keys,
            ["cloudProviderBackoffMode", "loadBalancerRateLimit", "providerVaultName"]
        );
        c.validate().unwrap();
    }

    #[test]
    fn yaml_parses_and_numbers_become_text_for_string_keys() {
        let c = Config::parse("tenantId: 1234\nsubscriptionId: s\nresourceGroup: rg\nlocation: westeurope\nvmType: standard\ntagsMap:\n  a: 1\n").unwrap();
        assert_eq!(c.tenant_id.as_deref(), Some("1234"));
        assert_eq!(c.vm_type, VmType::Standard);
        assert_eq!(c.resource_tags().get("a").map(String::as_str), Some("1"));
        // No vmType: upstream's vmss.
        assert_eq!(Config::parse("location: x").unwrap().vm_type, VmType::Vmss);
        assert_eq!(Config::parse("").unwrap().vm_type, VmType::Vmss);
        assert_eq!(Config::default().vm_type, VmType::Standard);
    }

    #[test]
    fn unknown_and_mistyped_keys_are_named() {
        let e = err(r#"{"aadClientSecert": "x"}"#);
        assert!(
            e.contains("unknown key \"aadClientSecert\"") && e.contains("aadClientSecret"),
            "{e}"
        );
        let e = err("useInstanceMetadata: \"yes\"");
        assert_eq!(
            e,
            "azure cloud config: useInstanceMetadata: expected true or false, got a string"
        );
        let e = err(r#"{"vmType": "vmas"}"#);
        assert!(
            e.contains(
                "vmType: unsupported value \"vmas\"; expected one of standard, vmss, vmssflex"
            ),
            "{e}"
        );
        let e = err(r#"{"maximumLoadBalancerRuleCount": -1}"#);
        assert!(
            e.starts_with(
                "azure cloud config: maximumLoadBalancerRuleCount: expected a whole number"
            ),
            "{e}"
        );
        let e = err(r#"{"clusterServiceSharedLoadBalancerHealthProbePort": 70000}"#);
        assert!(e.contains("clusterServiceSharedLoadBalancerHealthProbePort"), "{e}");
        let e = err(r#"{"cloudConfigType": "both"}"#);
        assert!(e.contains("cloudConfigType"), "{e}");
        let e = err(r#"{"tenantId": "a", "TENANTID": "b"}"#);
        assert!(e.contains("tenantId: given more than once"), "{e}");
        let e = err("- a\n- b\n");
        assert!(e.contains("expected a mapping"), "{e}");
    }

    #[test]
    fn secrets_are_never_quoted() {
        for text in [
            r#"{"aadClientSecret": ["s3cr3t-value"]}"#,
            r#"{"aadClientCertPassword": {"p": "s3cr3t-value"}}"#,
            "aadClientSecret: s3cr3t-value\n  bad: [indent",
            "{\"aadClientSecret\": \"s3cr3t-value\", }",
            "aadClientSecret: s3cr3t-value\nvmType: [s3cr3t-value]",
        ] {
            let e = err(text);
            assert!(!e.contains("s3cr3t"), "{text}: {e}");
        }
        let c = Config::parse("aadClientSecret: s3cr3t-value\naadClientCertPassword: s3cr3t-value")
            .unwrap();
        assert!(!format!("{c:?}").contains("s3cr3t"), "Debug redacts");
    }

    #[test]
    fn validate_names_what_the_ccm_lacks_or_does_not_support() {
        let base = "tenantId: t\nsubscriptionId: s\nresourceGroup: rg\nlocation: eastus\n";
        Config::parse(base).unwrap().validate().unwrap();
        let invalid = |extra: &str| {
            Config::parse(&format!("{base}{extra}")).unwrap().validate().unwrap_err().to_string()
        };
        assert!(invalid("loadBalancerSku: basic").contains("Basic SKU is not supported"));
        assert!(invalid("loadBalancerSku: premium").contains("loadBalancerSku: unsupported value"));
        assert!(
            invalid("clusterServiceLoadBalancerHealthProbeMode: local")
                .contains("expected servicenodeport or shared")
        );
        assert!(invalid("multipleStandardLoadBalancerConfigurations: [{name: a}]").contains(
            "multipleStandardLoadBalancerConfigurations: entry 0 (\"a\"): primaryVMSet: required"
        ));
        assert!(
            invalid("multipleStandardLoadBalancerConfigurations: [{name: a, primaryVMSet: s}]")
                .contains("need loadBalancerBackendPoolConfigurationType: nodeIP")
        );
        Config::parse(&format!("{base}loadBalancerBackendPoolConfigurationType: nodeIP\nmultipleStandardLoadBalancerConfigurations: [{{name: a, primaryVMSet: s}}]")).unwrap().validate().unwrap();
        assert!(
            invalid("loadBalancerBackendPoolConfigurationType: podip")
                .contains("podIP is not supported")
        );
        Config::parse(&format!("{base}multipleStandardLoadBalancerConfigurations: []\nclusterServiceLoadBalancerHealthProbeMode: Shared")).unwrap().validate().unwrap();
        let e = Config::parse("tenantId: t\nresourceGroup: rg\nlocation: l")
            .unwrap()
            .validate()
            .unwrap_err();
        assert_eq!(e.to_string(), "azure cloud config: subscriptionId: required");
        let e = Config::parse("tenantId: t\nsubscriptionId: s\nresourceGroup: rg")
            .unwrap()
            .validate()
            .unwrap_err();
        assert!(e.to_string().contains("location: required"));
        Config::parse(
            "tenantId: t\nsubscriptionId: s\nresourceGroup: rg\nuseInstanceMetadata: true",
        )
        .unwrap()
        .validate()
        .unwrap();
        Config::parse(
            "subscriptionId: s\nresourceGroup: rg\nlocation: l\nuseManagedIdentityExtension: true",
        )
        .unwrap()
        .validate()
        .unwrap();
    }

    #[test]
    fn env_overrides_as_upstream() {
        let mut c = Config::parse("tenantId: file\naadClientId: file").unwrap();
        let env = |k: &str| match k {
            "AZURE_TENANT_ID" => Some("env-tenant".to_string()),
            "AZURE_CLIENT_SECRET" => Some("env-secret".to_string()),
            "AZURE_CLIENT_ID" => Some(String::new()),
            "AZURE_FEDERATED_TOKEN_FILE" => Some("/var/run/token".to_string()),
            _ => None,
        };
        c.apply_env(&env);
        assert_eq!(c.tenant_id.as_deref(), Some("env-tenant"));
        assert_eq!(c.aad_client_id.as_deref(), Some("file"), "empty values are ignored");
        assert_eq!(c.aad_client_secret.as_deref(), Some("env-secret"));
        assert_eq!(c.aad_federated_token_file.as_deref(), Some("/var/run/token"));
        assert!(c.use_federated_workload_identity_extension);
    }

    #[test]
    fn tags_as_upstream() {
        let c = Config::parse("tags: \"a=1, B = 2 ,bad, =x, n= null ,c=d=e\"\ntagsMap: {b: three, z: \" 9 \"}\nsystemTags: \" a , ,k8s \"").unwrap();
        let tags = c.resource_tags();
        let want: BTreeMap<String, String> =
            [("a", "1"), ("b", "three"), ("n", " null "), ("z", "9")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect();
        assert_eq!(tags, want);
        assert_eq!(c.system_tag_keys(), ["a", "k8s"]);
    }

    #[test]
    fn defaults() {
        let c = Config::parse("{}").unwrap();
        assert_eq!(c.route_update_interval(), Duration::from_secs(30));
        assert_eq!(
            Config::parse("routeUpdateIntervalInSeconds: 5").unwrap().route_update_interval(),
            Duration::from_secs(5)
        );
        assert!(c.exclude_master_from_standard_lb());
        assert_eq!(c.maximum_load_balancer_rule_count(), 250);
        assert_eq!(
            (c.shared_health_probe_port(), c.shared_health_probe_path()),
            (10256, "/healthz")
        );
        assert!(!c.shared_health_probe());
        assert_eq!(c.cloud_config_type, CloudConfigType::Merge);
    }

    #[test]
    fn every_key_parses_alone() {
        for (key, kind) in KEYS {
            let value = match kind {
                Kind::Str | Kind::SecretStr => "\"x\"".to_string(),
                Kind::Bool => "true".into(),
                Kind::U32 | Kind::U64 | Kind::Port => "1".into(),
                Kind::Float => "1.5".into(),
                Kind::StrMap => "{\"k\": \"v\"}".into(),
                Kind::Any => "[]".into(),
                Kind::OneOf(v) => format!("\"{}\"", v[0]),
            };
            Config::parse(&format!("{{\"{key}\": {value}}}"))
                .unwrap_or_else(|e| panic!("{key}: {e}"));
        }
    }

    /// The documented spelling of upstream's per-client rate limits, and a real one.
    const RATE_LIMIT_DOC: (&str, &str) = ("<client>RateLimit", "loadBalancerRateLimit");

    #[test]
    fn config_keys_name_exactly_the_keys_the_parser_accepts() {
        let documented: Vec<&str> = CONFIG_KEYS.iter().map(|k| k.key).collect();
        let unique: std::collections::BTreeSet<&str> = documented.iter().copied().collect();
        assert_eq!(unique.len(), documented.len(), "a key is documented twice");
        let accepted: std::collections::BTreeSet<&str> = KEYS
            .iter()
            .map(|(k, _)| *k)
            .chain(IGNORED_KEYS.iter().copied())
            .chain([RATE_LIMIT_DOC.0])
            .collect();
        assert_eq!(unique, accepted);
        for k in CONFIG_KEYS {
            assert!(k.section.is_empty(), "{}: azure.json has no sections", k.key);
            let ignored = IGNORED_KEYS.contains(&k.key) || k.key == RATE_LIMIT_DOC.0;
            assert_eq!(
                k.doc.starts_with("accepted for compatibility, ignored: "),
                ignored,
                "{}: only the ignored keys say so",
                k.key
            );
        }
    }

    #[test]
    fn every_documented_example_is_accepted() {
        let base: Map<String, Value> = serde_json::from_str(
            r#"{"tenantId": "t", "subscriptionId": "s", "resourceGroup": "rg", "location": "l"}"#,
        )
        .unwrap();
        for k in CONFIG_KEYS {
            let key = if k.key == RATE_LIMIT_DOC.0 { RATE_LIMIT_DOC.1 } else { k.key };
            let ignored = IGNORED_KEYS.contains(&key) || key == RATE_LIMIT_DOC.1;
            // The example as a JSON value (text when it is not JSON).
            let value: Value = serde_json::from_str(k.example)
                .unwrap_or_else(|_| Value::String(k.example.to_string()));
            let one: Map<String, Value> = [(key.to_string(), value.clone())].into_iter().collect();
            let json = Value::Object(one).to_string();
            let c = Config::parse(&json).unwrap_or_else(|e| panic!("{json}: {e}"));
            let want: &[&str] = if ignored { &[key] } else { &[] };
            assert_eq!(c.ignored_keys, want, "{json}");
            // As YAML, the other format upstream reads.
            let yaml = format!("{key}: {}\n", k.example);
            Config::parse(&yaml).unwrap_or_else(|e| panic!("{yaml}: {e}"));
            // And what the cloud-controller-manager accepts on top of its required keys.
            let mut full = base.clone();
            full.insert(key.to_string(), value);
            // Several standard load balancers need node-IP pools (as upstream).
            if key == "multipleStandardLoadBalancerConfigurations" {
                full.insert("loadBalancerBackendPoolConfigurationType".into(), "nodeIP".into());
            }
            let json = Value::Object(full).to_string();
            Config::parse(&json)
                .and_then(|c| c.validate())
                .unwrap_or_else(|e| panic!("{json}: {e}"));
        }
    }

    #[test]
    fn merge_overlays_the_secrets_keys() {
        let file = Document::parse("tenantId: f\nlocation: l\nroutes: x").err();
        assert!(file.is_some(), "unknown key in a file");
        let file = Document::parse("tenantId: f\nlocation: l\n").unwrap();
        let secret = Document::parse("{\"tenantId\": \"s\", \"vmType\": \"vmssflex\"}").unwrap();
        let c = file.overlay(secret).into_config().unwrap();
        assert_eq!((c.tenant_id.as_deref(), c.location.as_deref()), (Some("s"), Some("l")));
        assert_eq!(c.vm_type, VmType::VmssFlex);
    }

    #[tokio::test]
    async fn load_without_an_api_server() {
        let at = SecretLocation::default();
        let none = |_: &str| None;
        let c =
            load_from(Some(b"cloudConfigType: file\nlocation: l"), None, &at, &none).await.unwrap();
        assert_eq!(c.location.as_deref(), Some("l"));
        // merge without a client: the file alone.
        let c = load_from(Some(b"location: m"), None, &at, &none).await.unwrap();
        assert_eq!(c.location.as_deref(), Some("m"));
        let e = load_from(Some(b"cloudConfigType: secret"), None, &at, &none).await.unwrap_err();
        assert!(e.to_string().contains("Secret kube-system/azure-cloud-provider"), "{e}");
        let e = load_from(None, None, &at, &none).await.unwrap_err();
        assert!(e.to_string().contains("needs the API server"), "{e}");
    }
}
