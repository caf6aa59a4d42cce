//! Every name and description the load balancers write, byte for byte as upstream's
//! `gce_loadbalancer_naming.go` makes them, so an operator swapping the upstream image for
//! ours finds (and keeps) the resources upstream created.
//!
//! | resource | name |
//! |---|---|
//! | forwarding rule, target pool, address, non-shared backend service | `a<uid>`[:32] (core's `default_load_balancer_name`) |
//! | traffic firewall | `k8s-fw-<lb>` (an internal one's legacy name `<lb>` is deleted when found) |
//! | nodes health check (Cluster traffic policy, shared) | `k8s-<clusterID>-node` |
//! | its firewall | external `k8s-<clusterID>-node-http-hc`, internal `k8s-<clusterID>-node-hc` |
//! | per-service health check (Local traffic policy) | `<lb>` |
//! | its firewall | external `k8s-<lb>-http-hc`, internal `<lb>-hc` |
//! | instance groups (internal) | `k8s-ig--<clusterID>` in each zone with nodes |
//! | shared backend service (internal, `load-balancer-backend-share`) | `k8s-<clusterID>-internal-<tcp\|udp>-nmv1-<sha1(affinity)[:16]>` |

/// The health check path kube-proxy serves for the nodes (`lbNodesHealthCheckPort`).
pub const NODES_HEALTH_CHECK_PATH: &str = "/healthz";
/// kube-proxy's health check port.
pub const NODES_HEALTH_CHECK_PORT: i32 = 10256;

/// `k8s-ig--<clusterID>` (`k8s-ig` without a cluster ID, as upstream's legacy clusters).
pub fn instance_group(cluster_id: &str) -> String {
    if cluster_id.is_empty() { "k8s-ig".to_string() } else { format!("k8s-ig--{cluster_id}") }
}

/// `k8s-<clusterID>-node`: the health check shared by every Cluster-policy load balancer.
pub fn nodes_health_check(cluster_id: &str) -> String {
    format!("k8s-{cluster_id}-node")
}

/// The firewall letting Google's probers reach an external load balancer's health check:
/// `k8s-<clusterID>-node-http-hc` for the shared one, else `k8s-<hc>-http-hc`.
pub fn external_health_check_firewall(cluster_id: &str, hc: &str, nodes: bool) -> String {
    if nodes {
        format!("{}-http-hc", nodes_health_check(cluster_id))
    } else {
        format!("k8s-{hc}-http-hc")
    }
}

/// The internal load balancer's health check: the shared `k8s-<clusterID>-node`, or `<lb>`.
pub fn internal_health_check(lb: &str, cluster_id: &str, shared: bool) -> String {
    if shared { nodes_health_check(cluster_id) } else { lb.to_string() }
}

/// The firewall of an internal health check: `<hc>-hc`.
pub fn internal_health_check_firewall(hc: &str) -> String {
    format!("{hc}-hc")
}

/// Whether `name` is the cluster's shared health check.
pub fn is_shared_health_check(name: &str, cluster_id: &str) -> bool {
    name == nodes_health_check(cluster_id)
}

/// `k8s-fw-<lb>`: the firewall for the load balancer's traffic.
pub fn firewall(lb: &str) -> String {
    format!("k8s-fw-{lb}")
}

/// The internal backend service: `<lb>`, or when shared
/// `k8s-<clusterID>-internal-<protocol>-nmv1-<first 16 hex of sha1(sessionAffinity)>`.
pub fn backend_service(
    lb: &str,
    cluster_id: &str,
    shared: bool,
    protocol: &str,
    affinity: &str,
) -> String {
    if !shared {
        return lb.to_string();
    }
    let hash = hex(&sha1(affinity.as_bytes()));
    format!("k8s-{cluster_id}-internal-{}-nmv1-{}", protocol.to_ascii_lowercase(), &hash[..16])
}

/// `{"kubernetes.io/service-name":"<ns>/<name>"}`: forwarding rules, addresses, target pools,
/// per-service backend services and internal health checks.
pub fn service_description(service: &str) -> String {
    format!(r#"{{"kubernetes.io/service-name":"{service}"}}"#)
}

/// A legacy HTTP health check's description: upstream puts the *health check's* name in the
/// service-name field (kept).
pub fn http_health_check_description(hc: &str) -> String {
    service_description(hc)
}

/// A firewall's description: `{"kubernetes.io/service-name":"<ns>/<name>", "kubernetes.io/service-ip":"<ip>"}`
/// (with upstream's space after the comma).
pub fn firewall_description(service: &str, ip: &str) -> String {
    format!(r#"{{"kubernetes.io/service-name":"{service}", "kubernetes.io/service-ip":"{ip}"}}"#)
}

/// The shared nodes health-check firewall's description: `{"kubernetes.io/cluster-id":"<id>"}`.
pub fn cluster_description(cluster_id: &str) -> String {
    format!(r#"{{"kubernetes.io/cluster-id":"{cluster_id}"}}"#)
}

/// The `<ns>/<name>` a description written by [`service_description`] or
/// [`firewall_description`] names.
pub fn service_of_description(d: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(d).ok()?;
    v.get("kubernetes.io/service-name")?.as_str().map(str::to_string)
}

/// Whether `name` has the shape of core's legacy load balancer name (`a` + 31 hex digits of a
/// UID), the only names this provider gives forwarding rules.
pub fn is_load_balancer_name(name: &str) -> bool {
    name.len() == 32
        && name.starts_with('a')
        && name[1..].bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// SHA-1 (FIPS 180-4), for the shared backend service's name only (upstream hashes the
/// session affinity with it; no security property is relied on).
pub fn sha1(data: &[u8]) -> [u8; 20] {
    let mut h: [u32; 5] = [0x6745_2301, 0xEFCD_AB89, 0x98BA_DCFE, 0x1032_5476, 0xC3D2_E1F0];
    let mut msg = data.to_vec();
    let bit_len = (data.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bit_len.to_be_bytes());
    for chunk in msg.chunks_exact(64) {
        let mut w = [0u32; 80];
        for (i, word) in chunk.chunks_exact(4).enumerate() {
            w[i] = u32::from_be_bytes([word[0], word[1], word[2], word[3]]);
        }
        for i in 16..80 {
            w[i] = (w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16]).rotate_left(1);
        }
        let [mut a, mut b, mut c, mut d, mut e] = h;
        for (i, wi) in w.iter().enumerate() {
            let (f, k) = match i {
                0..=19 => ((b & c) | (!b & d), 0x5A82_7999),
                20..=39 => (b ^ c ^ d, 0x6ED9_EBA1),
                40..=59 => ((b & c) | (b & d) | (c & d), 0x8F1B_BCDC),
                _ => (b ^ c ^ d, 0xCA62_C1D6),
            };
            let t =
                a.rotate_left(5).wrapping_add(f).wrapping_add(e).wrapping_add(k).wrapping_add(*wi);
            e = d;
            d = c;
            c = b.rotate_left(30);
            b = a;
            a = t;
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d, e]) {
            *x = x.wrapping_add(y);
        }
    }
    let mut out = [0u8; 20];
    for (i, x) in h.iter().enumerate() {
        out[i * 4..i * 4 + 4].copy_from_slice(&x.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sha1_matches_the_standard_vectors() {
        assert_eq!(hex(&sha1(b"")), "da39a3ee5e6b4b0d3255bfef95601890afd80709");
        assert_eq!(hex(&sha1(b"abc")), "a9993e364706816aba3e25717850c26c9cd0d89d");
        let long = b"abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq";
        assert_eq!(hex(&sha1(long)), "84983e441c3bd26ebaae4aa1f95129e5e54670f1");
    }

    #[test]
    fn names_are_upstream_s() {
        assert_eq!(instance_group("c0ffee"), "k8s-ig--c0ffee");
        assert_eq!(instance_group(""), "k8s-ig");
        assert_eq!(nodes_health_check("c0ffee"), "k8s-c0ffee-node");
        assert_eq!(
            external_health_check_firewall("c0ffee", "k8s-c0ffee-node", true),
            "k8s-c0ffee-node-http-hc"
        );
        assert_eq!(external_health_check_firewall("c0ffee", "a123", false), "k8s-a123-http-hc");
        assert_eq!(internal_health_check("a123", "c0ffee", true), "k8s-c0ffee-node");
        assert_eq!(internal_health_check("a123", "c0ffee", false), "a123");
        assert_eq!(internal_health_check_firewall("k8s-c0ffee-node"), "k8s-c0ffee-node-hc");
        assert_eq!(internal_health_check_firewall("a123"), "a123-hc");
        assert_eq!(firewall("a123"), "k8s-fw-a123");
        assert_eq!(backend_service("a123", "c0ffee", false, "TCP", "None"), "a123");
        // sha1("None") = 6eef6648406c333a4035cd5e60d0bf2ecf2606d7.
        assert_eq!(
            backend_service("a123", "c0ffee", true, "TCP", "None"),
            "k8s-c0ffee-internal-tcp-nmv1-6eef6648406c333a"
        );
        assert!(is_shared_health_check("k8s-c0ffee-node", "c0ffee"));
        assert!(!is_shared_health_check("a123", "c0ffee"));
    }

    #[test]
    fn descriptions_are_upstream_s() {
        assert_eq!(
            service_description("default/web"),
            r#"{"kubernetes.io/service-name":"default/web"}"#
        );
        assert_eq!(
            firewall_description("default/web", "35.1.2.3"),
            r#"{"kubernetes.io/service-name":"default/web", "kubernetes.io/service-ip":"35.1.2.3"}"#
        );
        assert_eq!(cluster_description("c0ffee"), r#"{"kubernetes.io/cluster-id":"c0ffee"}"#);
        assert_eq!(service_of_description(&service_description("ns/x")), Some("ns/x".into()));
        assert_eq!(
            service_of_description(&firewall_description("ns/x", "1.2.3.4")),
            Some("ns/x".into())
        );
        assert_eq!(service_of_description("hand made"), None);
    }

    #[test]
    fn load_balancer_names_are_recognised() {
        assert!(is_load_balancer_name("a6f7f1b2c123456789abcdef01234567"));
        assert!(!is_load_balancer_name("a6f7f1b2c123456789abcdef0123456"));
        assert!(!is_load_balancer_name("b6f7f1b2c123456789abcdef01234567"));
        assert!(!is_load_balancer_name("a6f7f1b2c123456789abcdef0123456Z"));
    }
}
