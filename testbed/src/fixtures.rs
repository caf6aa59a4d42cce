//! Kubernetes objects as real components create them, for tests and the demo.

use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeCondition, NodeSpec, NodeStatus, Service, ServicePort, ServiceSpec,
    Taint,
};
use kube::api::ObjectMeta;

/// A node address of the given type (`InternalIP`, `ExternalIP`, `Hostname`, ...).
pub fn node_address(type_: &str, address: &str) -> NodeAddress {
    NodeAddress { type_: type_.into(), address: address.into() }
}

/// A Node as a kubelet started with `--cloud-provider=external` registers it: the
/// `node.cloudprovider.kubernetes.io/uninitialized` taint, its InternalIP and Hostname
/// addresses, and a Ready condition with `ready` (`True`, `False` or `Unknown`).
pub fn kubelet_node(name: &str, internal_ip: &str, ready: &str) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec {
            taints: Some(vec![Taint {
                key: ccm_core::names::TAINT_UNINITIALIZED.into(),
                value: Some("true".into()),
                effect: "NoSchedule".into(),
                time_added: None,
            }]),
            ..Default::default()
        }),
        status: Some(NodeStatus {
            addresses: Some(vec![
                node_address("InternalIP", internal_ip),
                node_address("Hostname", name),
            ]),
            conditions: Some(vec![NodeCondition {
                type_: "Ready".into(),
                status: ready.into(),
                reason: Some(
                    if ready == "True" { "KubeletReady" } else { "KubeletNotReady" }.into(),
                ),
                ..Default::default()
            }]),
            ..Default::default()
        }),
    }
}

/// A Service as `kubectl create service loadbalancer` makes it: `type: LoadBalancer` with one
/// TCP port (the apiserver allocates its node port).
pub fn load_balancer_service(namespace: &str, name: &str, port: i32) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("LoadBalancer".into()),
            ports: Some(vec![ServicePort {
                port,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        ..Default::default()
    }
}
