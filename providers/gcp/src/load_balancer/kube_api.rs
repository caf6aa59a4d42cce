//! What the load balancers write to Kubernetes besides the status the service controller
//! writes, through the client the manager hands the provider at start (upstream's
//! `Initialize(clientBuilder)`):
//!
//! - Events on the Service from upstream's event source `g-cloudprovider`:
//!   `LoadBalancerMixedProtocolNotSupported` (Warning) and `LoadBalancerManualChange`
//!   (Normal, the `gcloud` command a Shared VPC's network administrator must run);
//! - the `LoadBalancerPortsError` condition of a Service whose ports mix protocols, applied
//!   to the `status` subresource by server-side apply as field manager
//!   `gce-cloud-controller` (upstream's), and removed by the same manager once the ports agree
//!   again (upstream leaves it set).
//!
//! Without a client (the provider used on its own, before `initialize`) nothing is written.
//! Every call runs under [`KUBE_DEADLINE`]; a failure to record an Event is logged, never an
//! error.

use std::time::Duration;

use ccm_core::cloud::ProviderError;
use ccm_core::controllers::events::{EventRecorder, publish};
use k8s_openapi::api::core::v1::Service;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::events::{EventType, Reporter};
use serde_json::json;

use super::annotations::service_key;

/// The event source upstream's GCE provider records as.
pub const EVENT_COMPONENT: &str = "g-cloudprovider";
/// The field manager of the condition (upstream's).
pub const FIELD_MANAGER: &str = "gce-cloud-controller";
/// The Service condition of unusable ports (`v1.LoadBalancerPortsError`).
pub const PORTS_ERROR: &str = "LoadBalancerPortsError";
/// Its reason, also the Event's (`v1.LoadBalancerPortsErrorReason`).
pub const MIXED_PROTOCOL_REASON: &str = "LoadBalancerMixedProtocolNotSupported";
/// The Event reason of a firewall change only the network administrator can make.
pub const MANUAL_CHANGE_REASON: &str = "LoadBalancerManualChange";
/// The longest a Service patch or an Event may take.
pub const KUBE_DEADLINE: Duration = Duration::from_secs(30);

/// The provider's Kubernetes client and event recorder.
#[derive(Clone)]
pub(crate) struct Events {
    client: kube::Client,
    recorder: EventRecorder,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

/// The Service's `LoadBalancerPortsError` condition is `True`.
pub fn has_ports_error(service: &Service) -> bool {
    service
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == PORTS_ERROR && c.status == "True"))
}

/// The Service's `LoadBalancerPortsError` condition was set for mixed protocols.
fn has_mixed_protocol_condition(service: &Service) -> bool {
    service.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
        c.iter().any(|c| c.type_ == PORTS_ERROR && c.reason == MIXED_PROTOCOL_REASON)
    })
}

impl Events {
    /// Events and condition writes on `client`, recording as `g-cloudprovider`.
    pub fn new(client: kube::Client) -> Self {
        let reporter = Reporter { controller: EVENT_COMPONENT.into(), instance: None };
        Events { recorder: EventRecorder::new(client.clone(), reporter), client }
    }

    /// An Event on `service` (a failure to record is logged, never fatal).
    pub async fn event(&self, service: &Service, type_: EventType, reason: &str, message: String) {
        let sent = publish(&self.recorder, service, type_, reason, "", message);
        if tokio::time::timeout(KUBE_DEADLINE, sent).await.is_err() {
            tracing::warn!(service = %service_key(service), reason, "GCE: recording an event timed out");
        }
    }

    async fn apply_status(
        &self,
        service: &Service,
        status: serde_json::Value,
    ) -> Result<(), ProviderError> {
        let key = service_key(service);
        let (Some(ns), Some(name)) =
            (service.metadata.namespace.as_deref(), service.metadata.name.as_deref())
        else {
            return Ok(());
        };
        let api: Api<Service> = Api::namespaced(self.client.clone(), ns);
        let body = json!({
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": { "name": name, "namespace": ns },
            "status": status,
        });
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let patch = Patch::Apply(&body);
        match tokio::time::timeout(KUBE_DEADLINE, api.patch_status(name, &params, &patch)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(ProviderError::with_source(
                format!("failed to apply the {PORTS_ERROR} condition of Service {key}: {e}"),
                e,
            )),
            Err(_) => Err(ProviderError::other(format!(
                "applying the {PORTS_ERROR} condition of Service {key}: no answer from the API server within {}s",
                KUBE_DEADLINE.as_secs()
            ))),
        }
    }

    /// Upstream's `processMixedProtocolCheck` side effects, once (when the Service does not
    /// show the condition yet): a Warning Event and the condition `LoadBalancerPortsError`
    /// `True`.
    pub async fn mixed_protocols(&self, service: &Service) -> Result<(), ProviderError> {
        if has_ports_error(service) {
            return Ok(());
        }
        tracing::warn!(service = %service_key(service), "GCE: the Service's ports use different protocols");
        self.event(
            service,
            EventType::Warning,
            MIXED_PROTOCOL_REASON,
            "LoadBalancer with multiple protocols are not supported.".into(),
        )
        .await;
        let now = k8s_openapi::jiff::Timestamp::now();
        self.apply_status(
            service,
            json!({ "conditions": [{
                "type": PORTS_ERROR,
                "status": "True",
                "reason": MIXED_PROTOCOL_REASON,
                "message": "LoadBalancer with multiple protocols are not supported",
                "lastTransitionTime": k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(now),
            }]}),
        )
        .await
    }

    /// The ports agree again: the condition this provider applied goes (only ours: the
    /// apply removes what field manager `gce-cloud-controller` owns, nothing else).
    pub async fn ports_agree(&self, service: &Service) -> Result<(), ProviderError> {
        if !has_mixed_protocol_condition(service) {
            return Ok(());
        }
        self.apply_status(service, json!({})).await?;
        tracing::info!(service = %service_key(service), "GCE: the Service's ports agree again; removed the {PORTS_ERROR} condition");
        Ok(())
    }
}
