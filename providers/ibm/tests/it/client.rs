//! The IBM Cloud client against the emulator: tokens, errors, retries, deadlines, paging.

use std::time::Duration;

use ccm_core::cloud_call::Retry;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::ibm::IbmOptions;
use ccm_emulators::world::{Instance, PowerState};
use ccm_provider_ibm::client::{ClientError, ClientOptions};

use crate::fixture::{start, start_with};

#[tokio::test]
async fn an_expired_token_is_renewed_and_one_token_serves_many_calls() {
    let f = start().await;
    let c = f.provider.client();
    for _ in 0..3 {
        c.list_subnets().await.unwrap();
    }
    assert_eq!(f.cloud.tokens_issued(), 1, "the token is reused while valid");
    // The server expires every token: the next call gets a 401, fetches a fresh token and
    // succeeds.
    f.cloud.expire_tokens();
    assert_eq!(c.list_subnets().await.unwrap().len(), 4);
    assert_eq!(f.cloud.tokens_issued(), 2);
    assert_eq!(f.server.counters().get("vpc.subnets.list"), 5, "one refused call, resent once");
}

#[tokio::test]
async fn a_short_lived_token_is_refreshed_before_it_expires() {
    let f = start_with(
        IbmOptions { token_lifetime: Duration::from_secs(2), ..IbmOptions::default() },
        ClientOptions::default(),
    )
    .await;
    let c = f.provider.client();
    c.list_subnets().await.unwrap();
    // 80 % of 2 s: after 1.6 s the client fetches a new token before using the old one.
    tokio::time::sleep(Duration::from_millis(1700)).await;
    c.list_subnets().await.unwrap();
    assert_eq!(f.cloud.tokens_issued(), 2);
    assert_eq!(f.server.counters().get("vpc.subnets.list"), 2, "no call was refused");
}

#[tokio::test]
async fn a_wrong_api_key_is_an_unauthorized_error_that_never_quotes_the_key() {
    let f = start().await;
    let key_file = f._dir.path().join("api-key");
    std::fs::write(&key_file, "not-the-right-key-4711").unwrap();
    let c = f.provider.client();
    let err = c.list_subnets().await.unwrap_err();
    assert!(matches!(err, ClientError::Unauthorized { .. }), "{err}");
    let text = format!("{err} {err:?}");
    assert!(!text.contains("not-the-right-key-4711"), "{text}");
    // Rotating the key file is picked up without a restart.
    std::fs::write(&key_file, ccm_emulators::ibm::DEFAULT_API_KEY).unwrap();
    c.list_subnets().await.unwrap();
}

#[tokio::test]
async fn throttling_and_5xx_are_retried_on_reads_and_ibm_errors_are_parsed() {
    let f = start().await;
    let c = f.provider.client();
    f.server
        .inject(
            FaultRule::new("vpc.subnets.list", Fault::Throttle { retry_after_secs: 1 }).times(1),
        )
        .unwrap();
    f.server
        .inject(
            FaultRule::new("vpc.subnets.list", Fault::Status { status: 503, body: None }).times(1),
        )
        .unwrap();
    assert_eq!(c.list_subnets().await.unwrap().len(), 4);
    assert_eq!(f.server.counters().get("vpc.subnets.list"), 3);
    // A 404 with IBM's error body: typed, with IBM's code.
    let err = c.get_load_balancer("r006-no-such-lb").await.unwrap();
    assert!(err.is_none());
    f.server
        .inject(FaultRule::new("vpc.instances.get", Fault::Status { status: 403, body: None }))
        .unwrap();
    let err = c.get_instance("0717_x").await.unwrap_err();
    match &err {
        ClientError::Api { status: 403, code, .. } => assert!(!code.is_empty(), "{err}"),
        other => panic!("{other}"),
    }
    assert_eq!(f.server.counters().get("vpc.instances.get"), 1, "a 403 is not retried");
}

#[tokio::test]
async fn a_hung_call_ends_at_its_deadline_naming_the_call() {
    let f = start_with(
        IbmOptions::default(),
        ClientOptions { timeout: Duration::from_secs(2), retry: Retry::NONE },
    )
    .await;
    let c = f.provider.client();
    c.list_subnets().await.unwrap();
    f.server.inject(FaultRule::new("vpc.instances.list", Fault::Hang)).unwrap();
    let err = c.list_instances("vpc-1", None).await.unwrap_err();
    assert!(matches!(err, ClientError::Deadline { .. }), "{err}");
    assert!(err.to_string().contains("is.instance.list"), "{err}");
}

#[tokio::test]
async fn lists_follow_next_pages() {
    let f = start().await;
    for i in 0..230 {
        f.cloud
            .add_instance(Instance {
                name: format!("bulk-{i:03}"),
                id: None,
                zone: "us-south-1".into(),
                instance_type: None,
                power: PowerState::Running,
                subnet: Some("subnet-1".into()),
                private_ips: vec![format!("10.240.0.{}", 10 + i % 200).parse().unwrap()],
                public_ips: vec![],
                tags: Default::default(),
            })
            .unwrap();
    }
    let all = f.provider.client().list_instances("vpc-1", None).await.unwrap();
    assert_eq!(all.len(), 233);
    assert_eq!(f.server.counters().get("vpc.instances.list"), 3, "pages of 100");
}

#[tokio::test]
async fn a_reply_larger_than_the_cap_is_refused_naming_the_call() {
    let f = start().await;
    let c = f.provider.client();
    let huge = format!(r#"{{"subnets":[],"padding":"{}"}}"#, "x".repeat(5 * 1024 * 1024));
    f.server
        .inject(
            FaultRule::new("vpc.subnets.list", Fault::Status { status: 200, body: Some(huge) })
                .times(1),
        )
        .unwrap();
    let err = c.list_subnets().await.unwrap_err();
    assert!(matches!(err, ClientError::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("is.subnet.list"), "{err}");
    // An error reply is capped too.
    let page = format!("<html>{}</html>", "y".repeat(5 * 1024 * 1024));
    f.server
        .inject(
            FaultRule::new("vpc.instances.get", Fault::Status { status: 404, body: Some(page) })
                .times(1),
        )
        .unwrap();
    let err = c.get_instance("0717_x").await.unwrap_err();
    assert!(matches!(err, ClientError::TooLarge { .. }), "{err}");
    // The next reply of normal size is read as usual.
    assert_eq!(c.list_subnets().await.unwrap().len(), 4);
}
