//! A moto server per test (`ccm_testbed::moto`) and the crate's moto fixtures
//! (`ccm_provider_aws::testing`), with short methods for the tests.

use ccm_provider_aws::testing;
pub use ccm_provider_aws::testing::{network, run_instances, tag, tags_for};
use ccm_provider_aws::{ApiMetrics, Cloud};
use k8s_openapi::api::core::v1::{Node, NodeSpec};
use kube::api::ObjectMeta;

/// A moto server, stopped on drop.
pub struct Moto(pub ccm_testbed::moto::Moto);

impl Moto {
    pub async fn start() -> anyhow::Result<Moto> {
        Ok(Moto(ccm_testbed::moto::Moto::start().await?))
    }

    pub async fn ec2(&self) -> aws_sdk_ec2::Client {
        testing::ec2(&self.0.url).await
    }

    pub async fn elb(&self) -> aws_sdk_elasticloadbalancing::Client {
        testing::elb(&self.0.url).await
    }

    pub async fn elbv2(&self) -> aws_sdk_elasticloadbalancingv2::Client {
        testing::elbv2(&self.0.url).await
    }

    /// The provider for `cluster` on this server, with `extra` appended to `[Global]`.
    pub async fn cloud(&self, cluster: &str, extra: &str) -> anyhow::Result<(Cloud, ApiMetrics)> {
        testing::cloud(&self.0.url, cluster, extra).await.map_err(|e| anyhow::anyhow!(e))
    }
}

/// A Node named `name` with an optional providerID.
pub fn node(name: &str, provider_id: Option<String>) -> Node {
    Node {
        metadata: ObjectMeta { name: Some(name.into()), ..Default::default() },
        spec: Some(NodeSpec { provider_id, ..Default::default() }),
        ..Default::default()
    }
}
