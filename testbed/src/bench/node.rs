//! A Node as a kubelet registers and reports it (issue #35): labels and annotations, the
//! `uninitialized` taint of `--cloud-provider=external`, capacity and allocatable of a 4-CPU,
//! 16 GiB machine, five conditions with messages, `nodeInfo`, `daemonEndpoints`, the node's
//! images (a kubelet reports up to `--node-status-max-images`, 50 by default; a busy node
//! has dozens), runtime handlers, and — from registering as the `kubelet` field manager and
//! then patching `status` — the two `managedFields` entries a kubelet leaves. Such a
//! Node is 9.3 KB of JSON as sent (before the apiserver adds metadata and managedFields),
//! where the old minimal Node ([`crate::fixtures::kubelet_node`]) is 0.4 KB.
//!
//! Registration is two calls, as a kubelet's: [`kubelet_node`] is created (`POST`, field
//! manager `kubelet`), then [`kubelet_status_patch`] is applied to `nodes/status` (field
//! manager `kubelet`), so the status fields a kubelet keeps updating are owned by its status
//! entry.

use k8s_openapi::api::core::v1::Node;
use serde_json::{Value, json};

/// The field manager a kubelet writes as.
pub const FIELD_MANAGER: &str = "kubelet";

/// Images every node of the benchmark carries (repository, tag, size in bytes): a system
/// set (CNI, kube-proxy, CSI, monitoring) and application images, as a node of a busy
/// cluster shows them.
const IMAGES: [(&str, &str, i64); 36] = [
    ("registry.k8s.io/kube-proxy", "v1.36.3", 30_624_841),
    ("registry.k8s.io/pause", "3.10", 320_368),
    ("registry.k8s.io/coredns/coredns", "v1.12.1", 22_384_805),
    ("registry.k8s.io/metrics-server/metrics-server", "v0.7.2", 19_494_617),
    ("registry.k8s.io/sig-storage/csi-node-driver-registrar", "v2.13.0", 14_107_862),
    ("registry.k8s.io/sig-storage/livenessprobe", "v2.15.0", 13_519_221),
    ("registry.k8s.io/sig-storage/csi-provisioner", "v5.2.0", 31_874_190),
    ("registry.k8s.io/sig-storage/csi-attacher", "v4.8.1", 30_225_364),
    ("registry.k8s.io/sig-storage/csi-resizer", "v1.13.2", 30_102_751),
    ("registry.k8s.io/sig-storage/csi-snapshotter", "v8.2.1", 29_330_487),
    ("quay.io/cilium/cilium", "v1.17.4", 259_404_013),
    ("quay.io/cilium/operator-generic", "v1.17.4", 33_810_271),
    ("docker.io/calico/node", "v3.30.1", 155_237_502),
    ("docker.io/calico/cni", "v3.30.1", 98_745_311),
    ("quay.io/prometheus/node-exporter", "v1.9.1", 11_810_229),
    ("quay.io/prometheus-operator/prometheus-config-reloader", "v0.82.2", 13_120_447),
    ("docker.io/grafana/promtail", "3.5.1", 88_403_120),
    ("docker.io/fluent/fluent-bit", "4.0.3", 40_117_802),
    ("registry.k8s.io/ingress-nginx/controller", "v1.12.3", 105_337_716),
    ("quay.io/jetstack/cert-manager-controller", "v1.17.2", 20_801_394),
    ("quay.io/jetstack/cert-manager-webhook", "v1.17.2", 18_224_060),
    ("docker.io/library/nginx", "1.27.5", 72_195_292),
    ("docker.io/library/redis", "7.4.4", 45_911_027),
    ("docker.io/library/postgres", "17.5", 158_393_102),
    ("docker.io/bitnami/kafka", "3.9.0", 310_422_973),
    ("docker.io/library/busybox", "1.37.0", 2_155_271),
    ("gcr.io/distroless/static-debian12", "nonroot", 1_004_217),
    ("ghcr.io/example/payments-api", "2026.11.3", 61_028_443),
    ("ghcr.io/example/orders-worker", "2026.11.2", 57_300_019),
    ("ghcr.io/example/web-frontend", "2026.11.5", 39_114_882),
    ("ghcr.io/example/search-indexer", "2026.10.9", 121_845_106),
    ("docker.io/istio/proxyv2", "1.26.1", 95_663_710),
    ("docker.io/istio/pilot", "1.26.1", 77_301_554),
    ("docker.io/library/python", "3.13-slim", 44_712_930),
    ("docker.io/library/node", "22-alpine", 55_613_208),
    ("docker.io/library/golang", "1.24", 293_001_722),
];

/// A deterministic 64-hex-digit digest for `(seed, i)` (FNV-1a, stretched): realistic
/// length and spread, stable across runs.
fn digest(seed: &str, i: usize) -> String {
    let mut out = String::with_capacity(64);
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in seed.bytes().chain(i.to_le_bytes()) {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    while out.len() < 64 {
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 29;
        out.push_str(&format!("{h:016x}"));
    }
    out.truncate(64);
    out
}

fn heartbeat() -> &'static str {
    "2026-11-28T12:00:00Z"
}

/// The Node a kubelet registers (`POST /api/v1/nodes`): metadata, spec and the status it
/// sends with it (addresses, capacity, allocatable, nodeInfo, daemonEndpoints; conditions
/// and images come with the first status update, [`kubelet_status_patch`]).
pub fn kubelet_node(name: &str, internal_ip: &str) -> Node {
    let v = json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "beta.kubernetes.io/arch": "amd64",
                "beta.kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "node.kubernetes.io/pool": "workers",
            },
            "annotations": {
                "node.alpha.kubernetes.io/ttl": "0",
                "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                "kubeadm.alpha.kubernetes.io/cri-socket": "unix:///run/containerd/containerd.sock",
                "csi.volume.kubernetes.io/nodeid": format!("{{\"ebs.csi.aws.com\":\"{name}\"}}"),
            },
        },
        "spec": {
            "taints": [{
                "key": ccm_core::names::TAINT_UNINITIALIZED,
                "value": "true",
                "effect": "NoSchedule",
            }],
        },
        "status": {
            "addresses": [
                {"type": "InternalIP", "address": internal_ip},
                {"type": "Hostname", "address": name},
            ],
            "capacity": {
                "cpu": "4", "ephemeral-storage": "101430960Ki", "hugepages-1Gi": "0",
                "hugepages-2Mi": "0", "memory": "16203796Ki", "pods": "110",
            },
            "allocatable": {
                "cpu": "3920m", "ephemeral-storage": "92391443316", "hugepages-1Gi": "0",
                "hugepages-2Mi": "0", "memory": "15186964Ki", "pods": "110",
            },
            "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
            "nodeInfo": {
                "machineID": &digest(name, 1001)[..32],
                "systemUUID": uuid(name),
                "bootID": uuid(&format!("{name}-boot")),
                "kernelVersion": "6.8.0-1021-aws",
                "osImage": "Ubuntu 24.04.2 LTS",
                "containerRuntimeVersion": "containerd://2.0.5",
                "kubeletVersion": "v1.36.3",
                "kubeProxyVersion": "",
                "operatingSystem": "linux",
                "architecture": "amd64",
            },
        },
    });
    // The JSON above is a valid Node by construction; a failure here is a bug in this file,
    // and the unit test below exercises it.
    serde_json::from_value(v).unwrap_or_default()
}

fn uuid(seed: &str) -> String {
    let d = digest(seed, 7);
    format!("{}-{}-{}-{}-{}", &d[..8], &d[8..12], &d[12..16], &d[16..20], &d[20..32])
}

/// The kubelet's first status update (strategic merge patch of `nodes/status`): the five
/// conditions, the images, runtime handlers, features and config.
pub fn kubelet_status_patch(name: &str) -> Value {
    let cond = |t: &str, status: &str, reason: &str, message: &str| {
        json!({
            "type": t, "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": heartbeat(), "lastTransitionTime": heartbeat(),
        })
    };
    let images: Vec<Value> = IMAGES
        .iter()
        .enumerate()
        .map(|(i, (repo, tag, size))| {
            json!({
                "names": [
                    format!("{repo}@sha256:{}", digest(repo, i)),
                    format!("{repo}:{tag}"),
                ],
                // A few bytes' difference per node, as layers and runtimes report them.
                "sizeBytes": size + (digest(name, i).len() as i64 % 7),
            })
        })
        .collect();
    json!({
        "status": {
            "conditions": [
                cond("MemoryPressure", "False", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
                cond("DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
                cond("PIDPressure", "False", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
                cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
                cond("NetworkUnavailable", "False", "CiliumIsUp", "Cilium is running on this node"),
            ],
            "images": images,
            "runtimeHandlers": [
                {"name": "runc", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
                {"name": "", "features": {"recursiveReadOnlyMounts": true, "userNamespaces": true}},
            ],
            "features": {"supplementalGroupsPolicy": true},
            "config": {"extendedResources": null},
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_realistic_node_is_a_kubelets_node() {
        let node = kubelet_node("ip-10-0-0-4.ec2.internal", "10.0.0.4");
        let status = node.status.as_ref().expect("status");
        assert_eq!(
            status.capacity.as_ref().and_then(|c| c.get("cpu")).map(|q| q.0.as_str()),
            Some("4")
        );
        assert!(status.allocatable.as_ref().is_some_and(|a| a.contains_key("memory")));
        assert_eq!(status.node_info.as_ref().map(|i| i.kubelet_version.as_str()), Some("v1.36.3"));
        let taints = node.spec.as_ref().and_then(|s| s.taints.clone()).unwrap_or_default();
        assert_eq!(taints[0].key, ccm_core::names::TAINT_UNINITIALIZED);
        // The status patch is a valid NodeStatus with the kubelet's conditions and images.
        let patch = kubelet_status_patch("ip-10-0-0-4.ec2.internal");
        let st: k8s_openapi::api::core::v1::NodeStatus =
            serde_json::from_value(patch["status"].clone()).expect("a NodeStatus");
        let types: Vec<_> =
            st.conditions.unwrap_or_default().into_iter().map(|c| c.type_).collect();
        assert!(types.iter().any(|t| t == "Ready") && types.len() == 5, "{types:?}");
        assert_eq!(st.images.map(|i| i.len()), Some(IMAGES.len()));
    }

    #[test]
    fn the_realistic_node_weighs_what_a_kubelets_does() {
        // Without managedFields (the apiserver adds them on top) the object the
        // kubelet sends is 7-12 KB; the minimal Node of the old benchmark is under 1 KB.
        let mut node = serde_json::to_value(kubelet_node("node-123", "10.0.3.17")).expect("json");
        node["status"]
            .as_object_mut()
            .expect("status")
            .extend(kubelet_status_patch("node-123")["status"].as_object().cloned().expect("s"));
        let bytes = serde_json::to_vec(&node).expect("json").len();
        assert!((7_000..12_000).contains(&bytes), "realistic Node is {bytes} bytes");
        let minimal =
            serde_json::to_vec(&crate::fixtures::kubelet_node("node-123", "10.0.3.17", "True"))
                .expect("json")
                .len();
        assert!(minimal < 1_000, "minimal Node is {minimal} bytes");
        // Distinct nodes have distinct identities (machine ID, system UUID).
        let a = kubelet_node("node-1", "10.0.0.1").status.and_then(|s| s.node_info);
        let b = kubelet_node("node-2", "10.0.0.2").status.and_then(|s| s.node_info);
        assert_ne!(a.map(|i| i.system_uuid), b.map(|i| i.system_uuid));
    }
}
