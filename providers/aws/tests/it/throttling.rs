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
    // Moto loads its EC2 backend on the first EC2 request: seconds on a busy machine, which
    // would land on the attempt that gets through and could run into the SDK's per-attempt
    // timeout (the attempt the test counts on). One direct call first, not through the proxy.
    testing::ec2(&moto.url).await.describe_instances().send().await.unwrap();

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
    // The filtered lookup that got through does not list the instance; "gone" needs EC2's own
    // InvalidInstanceID.NotFound, from one more lookup by instance ID (an empty page is not
    // an answer about an instance).
    assert_eq!(c.get("ec2:DescribeInstances"), u64::from(throttled) + 2, "{c:?}");
    // Moto has no such instance: a positive "gone" by ID, which is what got through.
    assert!(!exists.expect("the lookup rode out the throttling"), "no such instance in moto");
}

/// Throttling is remembered across calls, as upstream: after `DescribeInstances` is throttled,
/// the next request of a *different* EC2 operation waits too (held back by the shared
/// back-off before it is sent), and once answered requests have brought the delay down, later
/// requests are sent at once. Counted by the provider's `delayed`/`throttled` counters and
/// checked against the proxy's request log (no timing).
#[tokio::test]
async fn a_throttle_delays_the_next_call_of_another_operation_of_the_service() {
    let moto = Moto::start().await.unwrap();
    let proxy =
        FaultProxy::start(Url::parse(&moto.url).unwrap(), Protocol::AwsQuery).await.unwrap();
    let admin = proxy.admin();
    // A route table ID that does not exist: DescribeRouteTables is answered (empty).
    let cfg = CloudConfig::parse(&testing::cloud_config(
        &proxy.url(),
        "backoff",
        "RouteTableID = rtb-0123456789abcdef0",
    ))
    .unwrap();
    let metrics = ApiMetrics::default();
    let clients =
        AwsClients::from_sdk_config(&cfg, &testing::sdk().await, metrics.clone()).await.unwrap();
    let cloud = Cloud::with_clients(cfg, Arc::new(LazyClients::ready(clients)));
    let iv2 = cloud.instances_v2().unwrap();
    let routes = cloud.routes().unwrap();
    // An instance that exists (created directly in moto, not through the proxy): one answered
    // DescribeInstances per lookup (a missing one takes a second, confirming lookup by ID,
    // which would itself bring the back-off down before the routes call).
    let ec2 = testing::ec2(&moto.url).await;
    let net = testing::network(&ec2, "backoff").await.unwrap();
    let inst = testing::run_instances(&ec2, &net.subnets[0].0, "backoff", 1, None)
        .await
        .unwrap()
        .remove(0);
    let id = inst.instance_id().unwrap().to_string();
    let by_id = node("backoff", Some(format!("aws:///{}/{id}", net.subnets[0].1)));

    // Nothing throttled yet: nothing is held back.
    assert!(iv2.instance_exists(&by_id).await.unwrap());
    assert_eq!(metrics.delayed("ec2"), 0);

    admin
        .inject(
            FaultRule::new("ec2:DescribeInstances", Fault::Throttle { retry_after_secs: 0 })
                .times(2),
        )
        .await
        .unwrap();
    assert!(iv2.instance_exists(&by_id).await.unwrap(), "rode out two throttles");
    assert_eq!(metrics.throttled("DescribeInstances"), 2);
    let after_throttles = metrics.delayed("ec2");
    assert!(after_throttles >= 1, "the retries after a throttle wait for the back-off");

    // The next call is another operation: it waits too, before it is sent.
    let err = routes.list_routes("backoff").await.unwrap_err();
    assert!(err.to_string().contains("not found"), "{err}");
    assert_eq!(
        metrics.delayed("ec2"),
        after_throttles + 1,
        "DescribeRouteTables after a throttled DescribeInstances was not held back"
    );

    // Answered requests shrink the delay back to nothing: a few calls later nothing waits.
    let mut calm = None;
    for i in 0..10 {
        let before = metrics.delayed("ec2");
        let _ = routes.list_routes("backoff").await;
        if metrics.delayed("ec2") == before {
            calm = Some(i);
            break;
        }
    }
    assert!(calm.is_some(), "the back-off never decayed: {} delayed", metrics.delayed("ec2"));
    let settled = metrics.delayed("ec2");
    let _ = routes.list_routes("backoff").await;
    assert_eq!(metrics.delayed("ec2"), settled, "a calm service delays nothing");
    // Other services have their own back-off.
    assert_eq!(metrics.delayed("elb"), 0);

    // The proxy saw the throttled calls first, then the routes call.
    let log = admin.requests().await.unwrap();
    let ops: Vec<(&str, u16)> = log.iter().map(|r| (r.operation.as_str(), r.status)).collect();
    eprintln!("requests: {ops:?}; delayed {settled}");
    let first_route = ops.iter().position(|(op, _)| *op == "ec2:DescribeRouteTables").unwrap();
    let throttled: Vec<usize> = ops
        .iter()
        .enumerate()
        .filter(|(_, (op, s))| *op == "ec2:DescribeInstances" && *s != 200)
        .map(|(i, _)| i)
        .collect();
    assert_eq!(throttled.len(), 2, "{ops:?}");
    assert!(throttled.iter().all(|i| *i < first_route), "{ops:?}");
}
