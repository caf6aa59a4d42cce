//! Drop-in without a cloud config: what the config lacks is read, as upstream, from the EC2
//! instance metadata service (IMDSv2, the SDK's client: a session token from
//! `PUT /latest/api/token`, then `GET`s carrying it) and from the tags of the instance the
//! manager runs on.
//!
//! Runs only when the config has no cluster ID (`KubernetesClusterID`/`KubernetesClusterTag`):
//! the instance ID, zone, region and primary interface's VPC come from metadata; the cluster
//! ID from the instance's `kubernetes.io/cluster/<id>` tag (any value) or its legacy
//! `KubernetesCluster=<id>` tag, read with EC2 `DescribeInstances`. Config values always win
//! over discovered ones. The metadata endpoint is the SDK's: `AWS_EC2_METADATA_SERVICE_ENDPOINT`
//! (and `AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE`), else `http://169.254.169.254`;
//! `AWS_EC2_METADATA_DISABLED=true` turns discovery off, as it turns off the SDK's use of it.
//!
//! Outcomes: several different cluster IDs on the instance is an error (which one is meant
//! cannot be guessed); no metadata service (not on EC2) or an instance without a cluster tag
//! leaves the cluster ID unset, and the manager then refuses to start without
//! `--allow-untagged-cloud`, as before. The whole discovery is bounded by
//! [`DISCOVERY_DEADLINE`].

use std::collections::BTreeSet;
use std::time::Duration;

use aws_config::{BehaviorVersion, Region, SdkConfig};
use ccm_core::cloud_call::Deadline;

use crate::client::{ApiMetrics, AwsClients};
use crate::config::{CloudConfig, region_of_zone};
use crate::tags::{CLUSTER_TAG_PREFIX, LEGACY_CLUSTER_TAG};

/// The bound on the whole discovery (metadata reads and the instance's tags).
pub const DISCOVERY_DEADLINE: Duration = Duration::from_secs(30);

/// Discovery failed in a way that must stop the provider.
#[derive(Debug, thiserror::Error)]
pub enum MetadataError {
    /// The instance carries tags of more than one cluster.
    #[error(
        "instance {instance} is tagged for several clusters ({}); set KubernetesClusterID in the cloud config to choose one",
        .clusters.join(", ")
    )]
    SeveralClusters {
        /// The instance ID.
        instance: String,
        /// The cluster IDs found.
        clusters: Vec<String>,
    },
}

/// Where discovery reads from. The default is production: the SDK's metadata endpoint and
/// default credential chain; tests point both at emulators.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// The metadata endpoint (default: the SDK's, see the module docs).
    pub imds_endpoint: Option<String>,
    /// The SDK config for the `DescribeInstances` of the instance's tags (default: the SDK's
    /// default chain in the discovered region).
    pub sdk: Option<SdkConfig>,
}

/// What discovery found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Discovered {
    /// The instance the manager runs on.
    pub instance_id: String,
    /// Its availability zone.
    pub zone: String,
    /// Its region.
    pub region: String,
    /// The VPC of its primary interface.
    pub vpc: String,
    /// The cluster ID from its tags, if it has one.
    pub cluster_id: Option<String>,
}

impl Discovered {
    /// Fills what `cfg` lacks (region, VPC, cluster ID); set values are kept.
    pub fn apply(&self, cfg: &mut CloudConfig) {
        let g = &mut cfg.global;
        if g.region.is_empty() && g.zone.is_empty() && !self.region.is_empty() {
            g.region = self.region.clone();
        }
        if g.vpc.is_empty() {
            g.vpc = self.vpc.clone();
        }
        if cfg.cluster_id().is_none()
            && let Some(id) = &self.cluster_id
        {
            cfg.global.kubernetes_cluster_id = id.clone();
        }
    }
}

/// The cluster IDs the tags name: `kubernetes.io/cluster/<id>` keys and `KubernetesCluster`
/// values, deduplicated and sorted.
pub fn cluster_ids<'a>(tags: impl IntoIterator<Item = (&'a str, &'a str)>) -> Vec<String> {
    let mut ids = BTreeSet::new();
    for (k, v) in tags {
        if let Some(id) = k.strip_prefix(CLUSTER_TAG_PREFIX).filter(|id| !id.is_empty()) {
            ids.insert(id.to_string());
        } else if k == LEGACY_CLUSTER_TAG && !v.trim().is_empty() {
            ids.insert(v.trim().to_string());
        }
    }
    ids.into_iter().collect()
}

/// Reads the instance's metadata and tags for a config without cluster ID. `Ok(None)` when
/// there is nothing to discover from (no metadata service, or it or EC2 failed: logged).
pub async fn discover(
    cfg: &CloudConfig,
    sources: &Sources,
) -> Result<Option<Discovered>, MetadataError> {
    let run = Deadline::new(DISCOVERY_DEADLINE)
        .run("discovering the cluster from instance metadata", discover_inner(cfg, sources))
        .await;
    match run {
        Ok(Ok(found)) => Ok(Some(found)),
        Ok(Err(Failure::Fatal(e))) => Err(e),
        Ok(Err(Failure::Unavailable(why))) => {
            tracing::warn!(
                "no cluster ID in the cloud config, and it could not be read from instance metadata: {why}"
            );
            Ok(None)
        }
        Err(e) => {
            tracing::warn!("no cluster ID in the cloud config, and instance metadata: {e}");
            Ok(None)
        }
    }
}

enum Failure {
    Fatal(MetadataError),
    Unavailable(String),
}

async fn discover_inner(cfg: &CloudConfig, sources: &Sources) -> Result<Discovered, Failure> {
    if sources.imds_endpoint.is_none()
        && std::env::var("AWS_EC2_METADATA_DISABLED").is_ok_and(|v| v.eq_ignore_ascii_case("true"))
    {
        return Err(Failure::Unavailable("AWS_EC2_METADATA_DISABLED is true".into()));
    }
    let mut builder = aws_config::imds::Client::builder();
    if let Some(url) = &sources.imds_endpoint {
        builder = builder
            .endpoint(url)
            .map_err(|e| Failure::Unavailable(format!("invalid metadata endpoint {url:?}: {e}")))?;
    }
    let imds = builder.build();
    let get = |path: String| {
        let imds = &imds;
        async move {
            imds.get(path.clone())
                .await
                .map(|v| v.as_ref().trim().to_string())
                .map_err(|e| Failure::Unavailable(format!("GET {path}: {e}")))
        }
    };
    let instance_id = get("/latest/meta-data/instance-id".into()).await?;
    let zone = get("/latest/meta-data/placement/availability-zone".into()).await?;
    let region = match cfg.configured_region() {
        Some(r) => r,
        None => match get("/latest/meta-data/placement/region".into()).await {
            Ok(r) if !r.is_empty() => r,
            _ => region_of_zone(&zone).ok_or_else(|| {
                Failure::Unavailable(format!("no region in metadata and zone {zone:?}"))
            })?,
        },
    };
    let mac = get("/latest/meta-data/mac".into()).await?;
    let vpc = get(format!("/latest/meta-data/network/interfaces/macs/{mac}/vpc-id")).await?;
    tracing::info!(instance = %instance_id, %zone, %region, %vpc, "read instance metadata");

    let mut with_region = cfg.clone();
    with_region.global.region = region.clone();
    let sdk = match &sources.sdk {
        Some(sdk) => sdk.clone(),
        None => {
            aws_config::defaults(BehaviorVersion::latest())
                .region(Region::new(region.clone()))
                .load()
                .await
        }
    };
    let clients = AwsClients::from_sdk_config(&with_region, &sdk, ApiMetrics::default())
        .await
        .map_err(|e| Failure::Unavailable(format!("building the EC2 client: {e}")))?;
    let resp =
        clients.ec2.describe_instances().instance_ids(&instance_id).send().await.map_err(|e| {
            Failure::Unavailable(format!(
                "DescribeInstances {instance_id}: {}",
                aws_sdk_ec2::error::DisplayErrorContext(&e)
            ))
        })?;
    let instance = resp
        .reservations()
        .iter()
        .flat_map(|r| r.instances())
        .find(|i| i.instance_id() == Some(instance_id.as_str()))
        .ok_or_else(|| {
            Failure::Unavailable(format!("DescribeInstances did not return {instance_id}"))
        })?;
    let ids = cluster_ids(crate::tags::ec2_kv(instance.tags()));
    let cluster_id = match ids.as_slice() {
        [] => {
            tracing::warn!(instance = %instance_id, "this instance has no cluster tag");
            None
        }
        [one] => {
            tracing::info!(instance = %instance_id, cluster = %one, "cluster ID from this instance's tags");
            Some(one.clone())
        }
        _ => {
            return Err(Failure::Fatal(MetadataError::SeveralClusters {
                instance: instance_id,
                clusters: ids,
            }));
        }
    };
    Ok(Discovered { instance_id, zone, region, vpc, cluster_id })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cluster_ids_come_from_both_tag_forms() {
        assert_eq!(cluster_ids([("kubernetes.io/cluster/c1", "owned"), ("Name", "x")]), vec!["c1"]);
        assert_eq!(cluster_ids([("KubernetesCluster", "c2")]), vec!["c2"]);
        assert_eq!(
            cluster_ids([("KubernetesCluster", "c1"), ("kubernetes.io/cluster/c1", "shared")]),
            vec!["c1"]
        );
        assert_eq!(
            cluster_ids([("KubernetesCluster", "a"), ("kubernetes.io/cluster/b", "owned")]),
            vec!["a", "b"]
        );
        assert!(cluster_ids([("kubernetes.io/cluster/", "owned")]).is_empty());
    }

    #[test]
    fn discovered_values_fill_only_what_the_config_lacks() {
        let d = Discovered {
            instance_id: "i-1".into(),
            zone: "eu-west-1b".into(),
            region: "eu-west-1".into(),
            vpc: "vpc-1".into(),
            cluster_id: Some("found".into()),
        };
        let mut empty = CloudConfig::default();
        d.apply(&mut empty);
        assert_eq!(empty.global.region, "eu-west-1");
        assert_eq!(empty.global.vpc, "vpc-1");
        assert_eq!(empty.cluster_id(), Some("found"));
        let mut set = CloudConfig::parse(
            "[Global]\nRegion = us-east-2\nVPC = vpc-mine\nKubernetesClusterTag = mine\n",
        )
        .unwrap();
        d.apply(&mut set);
        assert_eq!(set.global.region, "us-east-2");
        assert_eq!(set.global.vpc, "vpc-mine");
        assert_eq!(set.cluster_id(), Some("mine"));
    }
}
