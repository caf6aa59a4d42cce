//! Cluster ownership tags: `kubernetes.io/cluster/<cluster-id>` = `owned` | `shared`, and the
//! legacy `KubernetesCluster` = `<cluster-id>`.
//!
//! Owns the decision "does this AWS resource belong to our cluster" and the tags put on every
//! resource the provider creates.

use aws_sdk_ec2::types::Tag;

/// The tag key prefix of cluster ownership tags.
pub const CLUSTER_TAG_PREFIX: &str = "kubernetes.io/cluster/";
/// The legacy cluster tag key.
pub const LEGACY_CLUSTER_TAG: &str = "KubernetesCluster";
/// Value of the cluster tag on resources this provider created (and so may delete).
pub const OWNED: &str = "owned";
/// The tag naming the Service a load-balancer resource was created for (`<ns>/<name>`).
pub const SERVICE_NAME_TAG: &str = "kubernetes.io/service-name";

/// The cluster this provider serves, for tag checks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ClusterTags {
    cluster_id: Option<String>,
}

impl ClusterTags {
    /// Tags for `cluster_id`; `None` means an untagged cloud (everything counts as ours).
    pub fn new(cluster_id: Option<&str>) -> Self {
        ClusterTags { cluster_id: cluster_id.map(str::to_string) }
    }

    /// The cluster ID.
    pub fn cluster_id(&self) -> Option<&str> {
        self.cluster_id.as_deref()
    }

    /// `kubernetes.io/cluster/<id>`, if there is a cluster ID.
    pub fn key(&self) -> Option<String> {
        self.cluster_id.as_ref().map(|id| format!("{CLUSTER_TAG_PREFIX}{id}"))
    }

    /// Whether tags (key, value) mark a resource of this cluster (always true untagged).
    pub fn owns_kv<'a>(&self, tags: impl IntoIterator<Item = (&'a str, &'a str)>) -> bool {
        let Some(id) = self.cluster_id.as_deref() else { return true };
        let key = format!("{CLUSTER_TAG_PREFIX}{id}");
        tags.into_iter().any(|(k, v)| k == key || (k == LEGACY_CLUSTER_TAG && v == id))
    }

    /// Whether tags mark a resource created by this cluster (`kubernetes.io/cluster/<id>=owned`).
    pub fn created_kv<'a>(&self, tags: impl IntoIterator<Item = (&'a str, &'a str)>) -> bool {
        let Some(key) = self.key() else { return true };
        tags.into_iter().any(|(k, v)| k == key && v == OWNED)
    }

    /// Whether tags belong to a *different* cluster only.
    pub fn foreign_kv<'a>(&self, tags: impl IntoIterator<Item = (&'a str, &'a str)>) -> bool {
        let tags: Vec<(&str, &str)> = tags.into_iter().collect();
        let other = tags.iter().any(|(k, _)| k.starts_with(CLUSTER_TAG_PREFIX));
        other && !self.owns_kv(tags.iter().copied())
    }

    /// [`Self::owns_kv`] for EC2 tags.
    pub fn owns(&self, tags: &[Tag]) -> bool {
        self.owns_kv(ec2_kv(tags))
    }

    /// Ownership tags for a resource this provider creates.
    pub fn owned_tags(&self) -> Vec<(String, String)> {
        self.key().map(|k| vec![(k, OWNED.to_string())]).unwrap_or_default()
    }
}

/// EC2 tags as (key, value) pairs.
pub fn ec2_kv(tags: &[Tag]) -> impl Iterator<Item = (&str, &str)> {
    tags.iter().map(|t| (t.key().unwrap_or_default(), t.value().unwrap_or_default()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ownership() {
        let t = ClusterTags::new(Some("c1"));
        assert!(t.owns_kv([("kubernetes.io/cluster/c1", "shared")]));
        assert!(t.owns_kv([("KubernetesCluster", "c1")]));
        assert!(!t.owns_kv([("kubernetes.io/cluster/c2", "owned")]));
        assert!(!t.created_kv([("kubernetes.io/cluster/c1", "shared")]));
        assert!(t.created_kv([("kubernetes.io/cluster/c1", "owned")]));
        assert!(t.foreign_kv([("kubernetes.io/cluster/c2", "owned")]));
        assert!(!t.foreign_kv([("Name", "x")]));
        assert!(ClusterTags::new(None).owns_kv([]));
    }
}
