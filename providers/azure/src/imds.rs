//! The instance metadata service (IMDS): what the VM a process runs on knows about itself,
//! at `http://169.254.169.254/metadata/…` (header `Metadata: true`, no credentials).
//!
//! - `GET /metadata/instance?api-version=2021-10-01&format=json`: compute (name, location,
//!   zone, size, fault domain, resource ID, scale set, subscription, resource group) and
//!   network (each NIC's IPv4/IPv6 private and public addresses);
//! - `GET /metadata/loadbalancer?api-version=2020-10-01&format=json`: the public frontends of
//!   the standard load balancers the VM is behind (IMDS shows a VM's public IP only when it
//!   has an instance-level one; upstream fills the NIC's public IP from here otherwise).
//!
//! Upstream (`pkg/provider/azure_instance_metadata.go`) uses these API versions; so do we.
//! Every call has a deadline ([`ImdsClient::with_timeout`], default 10 s); errors say which
//! call failed and why, and never contain more than a short cut of the reply.

use std::time::Duration;

use ccm_core::cloud::ProviderError;
use serde::Deserialize;

use crate::client::ArmClient;

/// The instance call's API version (upstream `ImdsInstanceAPIVersion`).
pub const INSTANCE_API_VERSION: &str = "2021-10-01";
/// The load balancer call's API version (upstream `ImdsLoadBalancerAPIVersion`).
pub const LOAD_BALANCER_API_VERSION: &str = "2020-10-01";
/// The default deadline of one IMDS call.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);

/// `/metadata/instance`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct InstanceMetadata {
    /// The VM.
    #[serde(default)]
    pub compute: Option<Compute>,
    /// Its NICs.
    #[serde(default)]
    pub network: Option<Network>,
}

/// `compute` of `/metadata/instance` (the fields the node manager uses).
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Compute {
    /// The VM name (a scale-set VM's is `<set>_<id>`).
    #[serde(default)]
    pub name: String,
    /// The location, e.g. `eastus`.
    #[serde(default)]
    pub location: String,
    /// The availability zone (`"1"`), empty when the VM has none.
    #[serde(default)]
    pub zone: String,
    /// The size, e.g. `Standard_D2s_v3`.
    #[serde(default)]
    pub vm_size: String,
    /// The platform fault domain (a number, as a string).
    #[serde(default)]
    pub platform_fault_domain: String,
    /// The platform sub-fault domain (newer VM families), empty when none.
    #[serde(default)]
    pub platform_sub_fault_domain: String,
    /// The resource group.
    #[serde(default)]
    pub resource_group_name: String,
    /// The scale set, empty for a VM outside one.
    #[serde(default)]
    pub vm_scale_set_name: String,
    /// The subscription.
    #[serde(default)]
    pub subscription_id: String,
    /// The VM's ARM ID.
    #[serde(default)]
    pub resource_id: String,
    /// The VM's tags (`tagsList`).
    #[serde(default)]
    pub tags_list: Vec<Tag>,
}

/// One tag of `tagsList`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Tag {
    /// The tag's name.
    #[serde(default)]
    pub name: String,
    /// Its value.
    #[serde(default)]
    pub value: String,
}

/// `network` of `/metadata/instance`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct Network {
    /// The NICs, primary first.
    #[serde(default)]
    pub interface: Vec<Interface>,
}

/// One NIC.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Interface {
    /// IPv4 addresses (primary first).
    #[serde(default)]
    pub ipv4: NetworkData,
    /// IPv6 addresses.
    #[serde(default)]
    pub ipv6: NetworkData,
    /// The MAC address.
    #[serde(default)]
    pub mac_address: String,
}

/// The addresses of one family.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NetworkData {
    /// The addresses.
    #[serde(default)]
    pub ip_address: Vec<IpAddress>,
}

/// A private address and the public one mapped to it.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct IpAddress {
    /// The private address.
    #[serde(default)]
    pub private_ip_address: String,
    /// The instance-level public address (empty when none).
    #[serde(default)]
    pub public_ip_address: String,
}

/// `/metadata/loadbalancer`.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
pub struct LoadBalancerMetadata {
    /// The load balancer profile.
    #[serde(default)]
    pub loadbalancer: Option<LoadBalancerProfile>,
}

/// The public frontends mapped to this VM.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LoadBalancerProfile {
    /// Frontend → private address pairs.
    #[serde(default)]
    pub public_ip_addresses: Vec<PublicIpMapping>,
}

/// A public frontend and the VM's private address it maps to.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublicIpMapping {
    /// The frontend address (IPv6 ones in brackets).
    #[serde(default)]
    pub frontend_ip_address: String,
    /// The VM's private address (IPv6 ones in brackets).
    #[serde(default)]
    pub private_ip_address: String,
}

/// An IMDS call failed.
#[derive(Debug, thiserror::Error)]
pub enum ImdsError {
    /// No answer (connection refused: not on an Azure VM, or IMDS unreachable).
    #[error("instance metadata {call}: {message}")]
    Transport {
        /// `instance` or `loadbalancer`.
        call: &'static str,
        /// What failed.
        message: String,
    },
    /// IMDS answered with an error status.
    #[error("instance metadata {call}: HTTP {status}: {body}")]
    Status {
        /// `instance` or `loadbalancer`.
        call: &'static str,
        /// The status.
        status: u16,
        /// The reply, cut to 200 characters.
        body: String,
    },
    /// The reply did not parse.
    #[error("instance metadata {call}: unexpected reply: {message}")]
    Decode {
        /// `instance` or `loadbalancer`.
        call: &'static str,
        /// The parse error.
        message: String,
    },
    /// The call did not finish in time.
    #[error("instance metadata {call}: no answer within {timeout:?}")]
    Timeout {
        /// `instance` or `loadbalancer`.
        call: &'static str,
        /// The deadline.
        timeout: Duration,
    },
    /// The reply lacks what the caller needs.
    #[error("instance metadata: {0}")]
    Incomplete(String),
}

impl From<ImdsError> for ProviderError {
    fn from(e: ImdsError) -> Self {
        ProviderError::with_source(e.to_string(), e)
    }
}

/// An IMDS client.
#[derive(Debug, Clone)]
pub struct ImdsClient {
    http: reqwest::Client,
    base: String,
    timeout: Duration,
}

impl ImdsClient {
    /// A client of the IMDS at `base` (e.g. [`crate::client::DEFAULT_IMDS_ENDPOINT`]).
    pub fn new(http: reqwest::Client, base: impl Into<String>) -> Self {
        let base = base.into().trim_end_matches('/').to_string();
        ImdsClient { http, base, timeout: DEFAULT_TIMEOUT }
    }

    /// A client of the ARM client's IMDS endpoint, with its HTTP client.
    pub fn from_arm(client: &ArmClient) -> Self {
        ImdsClient::new(client.http().clone(), client.imds_endpoint())
    }

    /// The deadline of each call.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// The IMDS base URL.
    pub fn endpoint(&self) -> &str {
        &self.base
    }

    async fn call<T: serde::de::DeserializeOwned>(
        &self,
        call: &'static str,
        path: &str,
        api_version: &str,
    ) -> Result<T, ImdsError> {
        let url = format!("{}{path}", self.base);
        let request = async {
            let resp = self
                .http
                .get(&url)
                .header("Metadata", "true")
                .query(&[("api-version", api_version), ("format", "json")])
                .send()
                .await
                .map_err(|e| ImdsError::Transport { call, message: e.without_url().to_string() })?;
            let status = resp.status().as_u16();
            let body = crate::client::read_capped(resp, crate::client::MAX_IMDS_REPLY)
                .await
                .map_err(|message| ImdsError::Transport { call, message })?;
            if status != 200 {
                let body: String = String::from_utf8_lossy(&body).chars().take(200).collect();
                return Err(ImdsError::Status { call, status, body });
            }
            serde_json::from_slice(&body)
                .map_err(|e| ImdsError::Decode { call, message: e.to_string() })
        };
        tokio::time::timeout(self.timeout, request)
            .await
            .map_err(|_| ImdsError::Timeout { call, timeout: self.timeout })?
    }

    /// `/metadata/instance`, as IMDS says it.
    pub async fn instance(&self) -> Result<InstanceMetadata, ImdsError> {
        self.call("instance", "/metadata/instance", INSTANCE_API_VERSION).await
    }

    /// `/metadata/loadbalancer`.
    pub async fn load_balancer(&self) -> Result<LoadBalancerMetadata, ImdsError> {
        self.call("loadbalancer", "/metadata/loadbalancer", LOAD_BALANCER_API_VERSION).await
    }

    /// `/metadata/instance` with the first NIC's public addresses filled in from
    /// `/metadata/loadbalancer` when IMDS shows none (upstream `getMetadata`). The load
    /// balancer call is best effort: a VM in no standard load balancer has no answer there.
    pub async fn metadata(&self) -> Result<InstanceMetadata, ImdsError> {
        let mut meta = self.instance().await?;
        let Some(nic) = meta.network.as_mut().and_then(|n| n.interface.first_mut()) else {
            return Ok(meta);
        };
        let has_public =
            |d: &NetworkData| d.ip_address.first().is_some_and(|a| !a.public_ip_address.is_empty());
        if has_public(&nic.ipv4) || has_public(&nic.ipv6) {
            return Ok(meta);
        }
        match self.load_balancer().await {
            Ok(lb) => {
                if let Some(profile) = lb.loadbalancer {
                    fill_public_ips(&profile.public_ip_addresses, nic);
                }
            }
            Err(e) => tracing::debug!(error = %e, "no load balancer metadata"),
        }
        Ok(meta)
    }
}

/// Upstream `fillNetInterfacePublicIPs`: the first IPv4 (and IPv6) address gets the frontend
/// mapped to its private address (IPv6 addresses there come in brackets).
fn fill_public_ips(mappings: &[PublicIpMapping], nic: &mut Interface) {
    let trim = |s: &str| s.trim_start_matches('[').trim_end_matches(']').to_string();
    for data in [&mut nic.ipv4, &mut nic.ipv6] {
        let Some(first) = data.ip_address.first_mut() else { continue };
        if first.private_ip_address.is_empty() {
            continue;
        }
        if let Some(m) =
            mappings.iter().find(|m| trim(&m.private_ip_address) == first.private_ip_address)
        {
            first.public_ip_address = trim(&m.frontend_ip_address);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn load_balancer_frontends_fill_the_first_addresses_of_each_family() {
        let mut nic = Interface {
            ipv4: NetworkData {
                ip_address: vec![IpAddress {
                    private_ip_address: "10.0.0.4".into(),
                    ..Default::default()
                }],
            },
            ipv6: NetworkData {
                ip_address: vec![IpAddress {
                    private_ip_address: "fd00::4".into(),
                    ..Default::default()
                }],
            },
            mac_address: String::new(),
        };
        let maps = vec![
            PublicIpMapping {
                frontend_ip_address: "20.1.1.1".into(),
                private_ip_address: "10.0.0.4".into(),
            },
            PublicIpMapping {
                frontend_ip_address: "[2001:db8::1]".into(),
                private_ip_address: "[fd00::4]".into(),
            },
        ];
        fill_public_ips(&maps, &mut nic);
        assert_eq!(nic.ipv4.ip_address[0].public_ip_address, "20.1.1.1");
        assert_eq!(nic.ipv6.ip_address[0].public_ip_address, "2001:db8::1");
    }

    #[test]
    fn a_reply_with_unknown_and_missing_fields_parses() {
        let m: InstanceMetadata = serde_json::from_str(
            r#"{"compute":{"name":"vm","location":"eastus","zone":"","osType":"Linux","tagsList":[]},"network":{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"10.0.0.4","publicIpAddress":""}],"subnet":[]},"ipv6":{"ipAddress":[]},"macAddress":"000D3A"}]}}"#,
        )
        .unwrap();
        assert_eq!(m.compute.unwrap().name, "vm");
        assert_eq!(
            m.network.unwrap().interface[0].ipv4.ip_address[0].private_ip_address,
            "10.0.0.4"
        );
    }
}
