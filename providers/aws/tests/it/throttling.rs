//! A throttled account: the provider's calls ride out throttling inside the call (the SDK's
//! standard retry, `client::MAX_ATTEMPTS` attempts) instead of failing the whole sync. Moto
//! behind the emulator kit's fault proxy, which answers EC2's own `RequestLimitExceeded`.

use std::sync::Arc;

use ccm_core::cloud::CloudProvider;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
use ccm_provider_aws::client::MAX_ATTEMPTS;
use ccm_provider_aws::{ApiMetrics, AwsClients, Cloud, CloudConfig, LazyClients, testing};
use ccm_testbed::moto::Moto;

use crate::moto::node;

#[tokio::test]
async fn a_call_throttled_four_times_in_a_row_still_succeeds() {
    let moto = Moto::start().await.unwrap();
    let proxy =
        FaultProxy::start(Url::parse(&moto.url).unwrap(), Protocol::AwsQuery).await.unwrap();
    let admin = proxy.admin();
    let cfg = CloudConfig::parse(&testing::cloud_config(&proxy.url(), "throttled", "")).unwrap();
    let clients = AwsClients::from_sdk_config(&cfg, &testing::sdk().await, ApiMetrics::default())
        .await
        .unwrap();
    let cloud = Cloud::with_clients(cfg, Arc::new(LazyClients::ready(clients)));
    let iv2 = cloud.instances_v2().unwrap();
    let by_id = node("throttled", Some("aws:///us-east-1a/i-0123456789abcdef0".into()));

    // Four throttled answers, then moto answers: the fifth attempt gets through. With the
    // SDK's default of 3 attempts this lookup failed with RequestLimitExceeded.
    // Fixed at 4 (not derived from MAX_ATTEMPTS) so a lower attempt count fails this test.
    let throttled: u32 = 4;
    assert!(MAX_ATTEMPTS > throttled);
    admin
        .inject(
            FaultRule::new("ec2:DescribeInstances", Fault::Throttle { retry_after_secs: 0 })
                .times(throttled.into()),
        )
        .await
        .unwrap();
    let exists = iv2.instance_exists(&by_id).await;
    let c = admin.counters().await.unwrap();
    eprintln!("throttled {throttled} times: {exists:?}; counters {c:?}");
    assert_eq!(c.faulted, u64::from(throttled), "{c:?}");
    assert_eq!(c.get("ec2:DescribeInstances"), u64::from(throttled) + 1, "{c:?}");
    // Moto has no such instance: a positive "gone" by ID, which is what got through.
    assert!(!exists.expect("the lookup rode out the throttling"), "no such instance in moto");
}
