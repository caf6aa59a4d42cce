//! The AWS Service annotation parser: a LoadBalancer Service whose ports and annotations come
//! from the input (one `key=value` per line; a key without `/` is an
//! `service.beta.kubernetes.io/aws-load-balancer-` annotation; `port=<n>/<protocol>` adds a
//! port, `spec.<field>=<value>` sets a spec field). Never a panic.
#![no_main]
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use libfuzzer_sys::fuzz_target;

const PREFIX: &str = "service.beta.kubernetes.io/aws-load-balancer-";

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else { return };
    let mut annotations = BTreeMap::new();
    let mut spec = ServiceSpec { type_: Some("LoadBalancer".into()), ..Default::default() };
    let mut ports = Vec::new();
    for line in text.lines() {
        let (key, value) = line.split_once('=').unwrap_or((line, ""));
        match key {
            "port" => {
                let (port, protocol) = value.split_once('/').unwrap_or((value, "TCP"));
                ports.push(ServicePort {
                    port: port.parse().unwrap_or(80),
                    protocol: Some(protocol.to_string()),
                    name: Some(format!("p{}", ports.len())),
                    node_port: Some(30000 + ports.len() as i32),
                    ..Default::default()
                });
            }
            "spec.sessionAffinity" => spec.session_affinity = Some(value.into()),
            "spec.externalTrafficPolicy" => spec.external_traffic_policy = Some(value.into()),
            "spec.loadBalancerSourceRanges" => {
                spec.load_balancer_source_ranges =
                    Some(value.split(',').map(str::to_string).collect())
            }
            "spec.loadBalancerClass" => spec.load_balancer_class = Some(value.into()),
            "spec.ipFamilies" => {
                spec.ip_families = Some(value.split(',').map(str::to_string).collect())
            }
            k if k.contains('/') => {
                annotations.insert(k.to_string(), value.to_string());
            }
            k => {
                annotations.insert(format!("{PREFIX}{k}"), value.to_string());
            }
        }
    }
    spec.ports = Some(ports);
    let mut service = Service { spec: Some(spec), ..Default::default() };
    service.metadata.name = Some("fuzz".into());
    service.metadata.namespace = Some("default".into());
    service.metadata.uid = Some("0d7f4f5e-9a8b-4c3d-8e2f-1a2b3c4d5e6f".into());
    service.metadata.annotations = Some(annotations);
    let _ = ccm_provider_aws::load_balancer::annotations::is_external(&service);
    let _ = ccm_provider_aws::load_balancer::annotations::parse(&service);
});
