//! Throttling as Compute answers it (403 `rateLimitExceeded` / `userRateLimitExceeded`, or a
//! 429), told apart from a quota (403 `quotaExceeded`) by the JSON error body's reason: a
//! throttled call was not carried out and is retried until the call's deadline (the shared
//! retry's `Classified::Throttled`, not a fixed number of attempts); a quota error fails at
//! once, naming the quota.

use std::time::{Duration, Instant};

use ccm_core::cloud::ProviderError;
use ccm_core::cloud_call::Deadline;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_provider_gcp::client::{GceClient, GceError};
use google_cloud_compute_v1::model::Address;

use crate::fixture::{self, PROJECT, REGION, ZONE_A};

/// Compute's own throttling reply for a user's rate (the emulator's throttle fault is the
/// project-rate `rateLimitExceeded`).
const USER_RATE_LIMIT: &str = r#"{"error":{"code":403,"message":"User Rate Limit Exceeded","errors":[{"message":"User Rate Limit Exceeded","domain":"usageLimits","reason":"userRateLimitExceeded"}]}}"#;

/// A 403 that is not a throttle although its message says "rateLimitExceeded": the reason
/// decides, never the text.
const FORBIDDEN_MENTIONING_RATE: &str = r#"{"error":{"code":403,"message":"Required 'compute.addresses.create' permission (rateLimitExceeded is not the problem)","errors":[{"message":"Required 'compute.addresses.create' permission","domain":"global","reason":"forbidden"}]}}"#;

fn json_page(status: u16, body: &str) -> Fault {
    Fault::Page {
        status,
        content_type: Some("application/json; charset=UTF-8".into()),
        body: body.into(),
    }
}

async fn insert_address(client: &GceClient, name: &str) -> Result<(), GceError> {
    let c = client.compute().await.unwrap();
    client
        .mutate("compute.addresses.insert", || {
            c.addresses
                .insert()
                .set_project(PROJECT)
                .set_region(REGION)
                .set_body(Address::new().set_name(name))
                .send()
        })
        .await
}

/// Six throttles in a row (more than the 4 attempts the fixture's retry counts) and the
/// address is still created, within the call's 20 s deadline; each throttle is the emulator's
/// Compute-shaped 403 `rateLimitExceeded`, and a throttled insert was not applied (one
/// address). Before: the fourth throttle was the error.
#[tokio::test]
async fn a_mutation_throttled_six_times_in_a_row_succeeds_within_its_deadline() {
    let f = fixture::start().await;
    f.server
        .inject(
            FaultRule::new("compute.addresses.insert", Fault::Throttle { retry_after_secs: 0 })
                .times(6),
        )
        .unwrap();
    let started = Instant::now();
    insert_address(&f.client, "throttled").await.unwrap();
    let took = started.elapsed();
    assert!(took < Duration::from_secs(20), "took {took:?}");
    let c = f.server.counters();
    assert_eq!(c.get("compute.addresses.insert"), 7, "6 throttled + 1 served");
    let c = f.client.compute().await.unwrap();
    let got = f
        .client
        .call("compute.addresses.get", || {
            c.addresses
                .get()
                .set_project(PROJECT)
                .set_region(REGION)
                .set_address("throttled")
                .send()
        })
        .await
        .unwrap();
    assert!(got.address.is_some_and(|a| !a.is_empty()));
}

/// A read throttled without end: retried until its deadline (far more than 4 attempts, at
/// least 100 ms apart), then the last throttle is the error, typed as a throttle (Compute's
/// 403 `rateLimitExceeded`), which the controllers see as `ProviderError::Throttled`.
#[tokio::test]
async fn a_read_throttled_until_its_deadline_ends_with_the_throttle() {
    let f = fixture::start().await;
    let mut options = f.options.clone();
    options.deadline = Deadline::new(Duration::from_secs(2));
    let client = GceClient::new(&fixture::global(), options).unwrap();
    let c = client.compute().await.unwrap();
    f.server
        .inject(FaultRule::new("compute.zones.get", Fault::Throttle { retry_after_secs: 0 }))
        .unwrap();
    let started = Instant::now();
    let e = client
        .call("compute.zones.get", || c.zones.get().set_project(PROJECT).set_zone(ZONE_A).send())
        .await
        .unwrap_err();
    let took = started.elapsed();
    assert!(
        matches!(&e, GceError::Api { status: 403, reason, .. } if reason == "rateLimitExceeded"),
        "{e}"
    );
    assert!(e.is_throttled());
    assert!(took >= Duration::from_millis(1500) && took < Duration::from_secs(6), "{took:?}");
    let calls = f.server.counters().get("compute.zones.get");
    assert!((5..=25).contains(&calls), "{calls} calls in {took:?}");
    assert!(matches!(ProviderError::from(e), ProviderError::Throttled(_)));
}

/// `userRateLimitExceeded` (403) is a throttle as well: five of them, then the read is served.
#[tokio::test]
async fn user_rate_limit_exceeded_is_retried_as_a_throttle() {
    let f = fixture::start().await;
    let c = f.client.compute().await.unwrap();
    f.server
        .inject(FaultRule::new("compute.zones.get", json_page(403, USER_RATE_LIMIT)).times(5))
        .unwrap();
    let z = f
        .client
        .call("compute.zones.get", || c.zones.get().set_project(PROJECT).set_zone(ZONE_A).send())
        .await
        .unwrap();
    assert_eq!(z.name.as_deref(), Some(ZONE_A));
    assert_eq!(f.server.counters().get("compute.zones.get"), 6);
}

/// A 403 `quotaExceeded` (the emulator's own quota check, as Compute words it) fails the insert
/// at once, one call, naming the quota; so does a 403 whose reason is `forbidden` even though
/// its message mentions "rateLimitExceeded".
#[tokio::test]
async fn a_quota_exceeded_fails_at_once_with_a_clear_error() {
    let f = fixture::start().await;
    f.cloud.set_quota("STATIC_ADDRESSES", 0);
    // The client's token and scope first, so the clock below times the insert alone.
    let c = f.client.compute().await.unwrap();
    f.client
        .call("compute.zones.get", || c.zones.get().set_project(PROJECT).set_zone(ZONE_A).send())
        .await
        .unwrap();
    let started = Instant::now();
    let e = insert_address(&f.client, "over-quota").await.unwrap_err();
    // One answer, no backoff (a retried throttle would wait at least 100 ms per attempt).
    assert!(started.elapsed() < Duration::from_secs(2), "{:?}", started.elapsed());
    assert!(
        matches!(&e, GceError::Api { status: 403, reason, .. } if reason == "quotaExceeded"),
        "{e}"
    );
    assert!(!e.is_throttled());
    let text = e.to_string();
    assert!(text.contains("compute.addresses.insert: 403 quotaExceeded"), "{text}");
    assert!(text.contains("Quota 'STATIC_ADDRESSES' exceeded"), "{text}");
    assert_eq!(f.server.counters().get("compute.addresses.insert"), 1, "not retried");
    assert!(!matches!(ProviderError::from(e), ProviderError::Throttled(_)));

    f.cloud.set_quota("STATIC_ADDRESSES", 100);
    f.server
        .inject(
            FaultRule::new("compute.addresses.insert", json_page(403, FORBIDDEN_MENTIONING_RATE))
                .times(1),
        )
        .unwrap();
    let e = insert_address(&f.client, "forbidden").await.unwrap_err();
    assert!(
        matches!(&e, GceError::Api { status: 403, reason, .. } if reason == "forbidden"),
        "{e}"
    );
    assert_eq!(f.server.counters().get("compute.addresses.insert"), 2, "not retried");
}
