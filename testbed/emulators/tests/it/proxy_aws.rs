//! The fault proxy in front of real moto, driven by the AWS SDK: operation names from the
//! query protocol, AWS-shaped errors the SDK understands, throttling the SDK retries, pause.

use ccm_emulators::admin::PauseMode;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::proxy::{FaultProxy, Protocol, Url};
use ccm_provider_aws::testing;
use ccm_provider_aws::testing::aws_sdk_ec2::error::ProvideErrorMetadata;
use ccm_testbed::moto::Moto;

#[tokio::test]
async fn counts_and_faults_the_aws_sdks_calls_through_moto() {
    let moto = Moto::start().await.unwrap();
    let proxy =
        FaultProxy::start(Url::parse(&moto.url).unwrap(), Protocol::AwsQuery).await.unwrap();
    assert!(proxy.url().starts_with("http://127.0.0.1:"), "{}", proxy.url());
    let admin = proxy.admin();
    let ec2 = testing::ec2(&proxy.url()).await;

    // Fixtures go through the proxy too: it is transparent.
    let net = testing::network(&ec2, "proxied").await.unwrap();
    let instances =
        testing::run_instances(&ec2, &net.subnets[0].0, "proxied", 3, None).await.unwrap();
    assert_eq!(instances.len(), 3);
    let c = admin.counters().await.unwrap();
    assert_eq!(c.get("ec2:CreateVpc"), 1);
    assert_eq!(c.get("ec2:CreateSubnet"), 2);
    assert_eq!(c.get("ec2:RunInstances"), 1);
    assert_eq!(c.get("ec2:DescribeInstances"), 1);
    assert_eq!(c.faulted, 0);

    admin.reset().await.unwrap();
    for _ in 0..3 {
        let d = ec2.describe_instances().send().await.unwrap();
        assert_eq!(d.reservations().iter().map(|r| r.instances().len()).sum::<usize>(), 3);
    }
    assert_eq!(admin.counters().await.unwrap().get("ec2:DescribeInstances"), 3);

    // Throttling: the SDK sees RequestLimitExceeded, retries, and succeeds.
    admin
        .inject(
            FaultRule::new("ec2:DescribeInstances", Fault::Throttle { retry_after_secs: 0 })
                .times(1),
        )
        .await
        .unwrap();
    ec2.describe_instances().send().await.unwrap();
    let c = admin.counters().await.unwrap();
    assert_eq!(c.get("ec2:DescribeInstances"), 5, "one throttled call and its retry");
    assert_eq!(c.faulted, 1);

    // A status fault carries EC2's own error body: the SDK parses its code.
    admin
        .inject(FaultRule::new("ec2:*", Fault::Status { status: 403, body: None }).times(1))
        .await
        .unwrap();
    let e = ec2.describe_vpcs().send().await.unwrap_err();
    assert_eq!(e.code(), Some("UnauthorizedOperation"), "{e:?}");

    // ELB: another service of the same endpoint, named by the signing scope.
    let elb = testing::elb(&proxy.url()).await;
    admin
        .inject(
            FaultRule::new("elasticloadbalancing:*", Fault::Status { status: 400, body: None })
                .times(1),
        )
        .await
        .unwrap();
    let e = elb.describe_load_balancers().send().await.unwrap_err();
    assert_eq!(
        ccm_provider_aws::testing::aws_sdk_elasticloadbalancing::error::ProvideErrorMetadata::code(
            &e
        ),
        Some("InvalidParameterValue"),
        "{e:?}"
    );
    elb.describe_load_balancers().send().await.unwrap();
    assert_eq!(
        admin.counters().await.unwrap().get("elasticloadbalancing:DescribeLoadBalancers"),
        2
    );

    // Paused in fail mode every call fails; resumed, it works again.
    admin.pause(PauseMode::Fail).await.unwrap();
    let e = ec2.describe_instances().send().await.unwrap_err();
    assert_eq!(e.code(), Some("Unavailable"), "{e:?}");
    admin.resume().await.unwrap();
    ec2.describe_instances().send().await.unwrap();

    let state = admin.state().await.unwrap();
    assert_eq!(state["cloud"]["protocol"], "aws-query");
    assert!(state["counters"]["total"].as_u64().unwrap() > 0, "{state}");
}
