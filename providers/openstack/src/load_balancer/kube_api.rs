//! What the load balancer writes to Kubernetes, through the client the manager hands the
//! provider at start ([`ccm_core::cloud::CloudProvider::initialize`], upstream's
//! `Initialize(clientBuilder)`):
//!
//! - the Service annotations upstream writes back, `loadbalancer.openstack.org/load-balancer-id`
//!   (once the load balancer is found or created, even when a later step fails) and
//!   `loadbalancer.openstack.org/load-balancer-address` (after a successful ensure): one merge
//!   patch of `metadata.annotations`, only when a value differs (upstream's `servicePatcher`);
//! - Warning Events on the Service from component `cloud-provider-openstack`, with upstream's
//!   reasons (`LoadBalancerSourceRangesIgnored`, `LoadBalancerAvailabilityZonesIgnored`,
//!   `LoadBalancerRename`).
//!
//! Without a client (the provider used on its own, before `initialize`) nothing is written.
//! Every call runs under [`KUBE_DEADLINE`].

use std::collections::BTreeMap;
use std::time::Duration;

use ccm_core::cloud::ProviderError;
use ccm_core::controllers::events::{EventRecorder, publish};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{EventType, Reporter};
use serde_json::json;

use super::annotations::service_key;

/// The event source upstream's OpenStack provider records as.
pub const EVENT_COMPONENT: &str = "cloud-provider-openstack";
/// The longest a Service patch or an Event may take.
pub const KUBE_DEADLINE: Duration = Duration::from_secs(30);

/// The provider's Kubernetes client and event recorder.
#[derive(Clone)]
pub struct KubeHandle {
    client: kube::Client,
    recorder: EventRecorder,
}

impl std::fmt::Debug for KubeHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeHandle").finish_non_exhaustive()
    }
}

impl KubeHandle {
    /// A handle on `client`, recording Events as `cloud-provider-openstack`.
    pub fn new(client: kube::Client) -> Self {
        let reporter = Reporter { controller: EVENT_COMPONENT.into(), instance: None };
        KubeHandle { recorder: EventRecorder::new(client.clone(), reporter), client }
    }

    /// A Warning Event on `service` (a failure to record is logged, never fatal).
    pub async fn warn(&self, service: &Service, reason: &str, message: String) {
        tracing::warn!(service = %service_key(service), reason, "OpenStack: {message}");
        let sent = publish(&self.recorder, service, EventType::Warning, reason, "", message);
        if tokio::time::timeout(KUBE_DEADLINE, sent).await.is_err() {
            tracing::warn!(service = %service_key(service), reason, "OpenStack: recording an event timed out");
        }
    }

    /// Sets `wanted` annotations on `service` with one merge patch, when any differs from
    /// the Service's own. A 403 (the manager's role lacks `services` `patch`) is logged as
    /// a warning naming the missing permission and not an error, so a Service still gets its
    /// load balancer under a narrower role; any other failure is an error naming the Service.
    pub async fn set_annotations(
        &self,
        service: &Service,
        wanted: &BTreeMap<&'static str, String>,
    ) -> Result<(), ProviderError> {
        let have = service.metadata.annotations.clone().unwrap_or_default();
        let changed: BTreeMap<&str, &String> = wanted
            .iter()
            .filter(|(k, v)| have.get(**k) != Some(*v))
            .map(|(k, v)| (*k, v))
            .collect();
        if changed.is_empty() {
            return Ok(());
        }
        let key = service_key(service);
        let (Some(ns), Some(name)) =
            (service.metadata.namespace.as_deref(), service.metadata.name.as_deref())
        else {
            return Ok(());
        };
        let api: Api<Service> = Api::namespaced(self.client.clone(), ns);
        let patch = json!({ "metadata": { "annotations": changed } });
        let params = PatchParams::default();
        let merge = Patch::Merge(&patch);
        let sent = api.patch(name, &params, &merge);
        match tokio::time::timeout(KUBE_DEADLINE, sent).await {
            Ok(Ok(_)) => {
                tracing::info!(service = %key, annotations = ?changed.keys().collect::<Vec<_>>(), "OpenStack: annotations written back to the Service");
                Ok(())
            }
            Ok(Err(kube::Error::Api(s))) if s.code == 403 => {
                tracing::warn!(service = %key, "OpenStack: cannot write the load-balancer-id/-address annotations back: the manager's role lacks services patch ({})", s.message);
                Ok(())
            }
            Ok(Err(e)) => Err(ProviderError::other(format!(
                "failed to patch the annotations of Service {key}: {e}"
            ))),
            Err(_) => Err(ProviderError::other(format!(
                "patching the annotations of Service {key} timed out after {}s",
                KUBE_DEADLINE.as_secs()
            ))),
        }
    }
}
