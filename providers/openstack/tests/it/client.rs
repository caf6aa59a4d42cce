//! The OpenStack client against the emulator: Keystone tokens, OpenStack errors, token
//! expiry, retries, deadlines, paging.

use std::time::Duration;

use ccm_core::cloud_call::Retry;
use ccm_emulators::faults::{Fault, FaultRule};
use ccm_emulators::openstack::{
    DEFAULT_APP_CRED_ID, DEFAULT_APP_CRED_SECRET, DEFAULT_PASSWORD, OpenStackOptions,
};
use ccm_emulators::server::ServerOptions;
use ccm_provider_openstack::client::{
    ClientError, ClientOptions, MAX_BODY, OpenStackClient, Service,
};
use ccm_provider_openstack::config::Secret;
use serde_json::json;

use crate::fixture::{WORLD, fast_options, global, instance, start, start_with};

#[tokio::test]
async fn nothing_is_sent_before_the_first_call_and_one_token_serves_many_calls() {
    let f = start().await;
    assert_eq!(f.server.counters().total, 0, "new() sends nothing");
    for _ in 0..3 {
        f.client.get("neutron:ListNetworks", Service::Network, &["networks"], &[]).await.unwrap();
    }
    f.client.get("nova:ListFlavors", Service::Compute, &["flavors", "detail"], &[]).await.unwrap();
    let lbs = f
        .client
        .get("octavia:ListLoadBalancers", Service::LoadBalancer, &["lbaas", "loadbalancers"], &[])
        .await
        .unwrap();
    assert_eq!(lbs["loadbalancers"], json!([]));
    assert_eq!(f.cloud.tokens_issued(), 1);
    assert_eq!(f.server.counters().get("neutron.networks.list"), 3);
    // Debug never shows a credential.
    let debug = format!("{:?}", f.client);
    assert!(!debug.contains(DEFAULT_PASSWORD) && debug.contains("auth_url"), "{debug}");
}

#[tokio::test]
async fn openstack_error_bodies_name_the_call_the_status_and_the_message() {
    let f = start().await;
    let c = &f.client;
    let err = c.get("nova:GetServer", Service::Compute, &["servers", "no-such-id"], &[]).await;
    let err = err.unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert_eq!(
        err.to_string(),
        "OpenStack nova:GetServer: HTTP 404 itemNotFound: Instance no-such-id could not be found."
    );
    let err = c.get("neutron:GetPort", Service::Network, &["ports", "p-1"], &[]).await.unwrap_err();
    assert!(
        err.to_string().contains("HTTP 404 PortNotFound: port p-1 could not be found"),
        "{err}"
    );
    let err = c
        .get(
            "octavia:GetLoadBalancer",
            Service::LoadBalancer,
            &["lbaas", "loadbalancers", "x"],
            &[],
        )
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(404), "{err}");
    assert!(err.to_string().starts_with("OpenStack octavia:GetLoadBalancer: HTTP 404 Client: "));
    // A 404 is not retried.
    assert_eq!(f.server.counters().get("nova.servers.get"), 1);
    // Neutron's 400 for a next hop off every subnet names it.
    let router = f.cloud.neutron_id("routers", "router1").unwrap();
    let body =
        json!({"router": {"routes": [{"destination": "10.244.0.0/24", "nexthop": "192.168.9.9"}]}});
    let err = c
        .put(
            "neutron:AddExtraRoutes",
            Service::Network,
            &["routers", &router, "add_extraroutes"],
            &body,
        )
        .await
        .unwrap_err();
    assert_eq!(err.status(), Some(400));
    assert!(err.to_string().contains("192.168.9.9"), "{err}");
}

#[tokio::test]
async fn an_expired_token_is_renewed_without_an_error_surfacing() {
    let f = start().await;
    let c = &f.client;
    c.get("neutron:ListNetworks", Service::Network, &["networks"], &[]).await.unwrap();
    assert_eq!(f.server.counters().get("keystone.tokens.create"), 1);
    // Keystone revokes every token: the next call gets a 401, re-authenticates, resends.
    f.cloud.expire_tokens();
    let v = c.get("neutron:ListNetworks", Service::Network, &["networks"], &[]).await.unwrap();
    assert!(v["networks"].as_array().unwrap().len() >= 3);
    assert_eq!(f.server.counters().get("keystone.tokens.create"), 2);
    assert_eq!(f.server.counters().get("neutron.networks.list"), 3, "one refused, resent once");
    // Many concurrent calls refused with the same token share one re-authentication.
    f.cloud.expire_tokens();
    let calls =
        (0..10).map(|_| c.get("nova:ListFlavors", Service::Compute, &["flavors", "detail"], &[]));
    for r in futures::future::join_all(calls).await {
        r.unwrap();
    }
    assert_eq!(f.server.counters().get("keystone.tokens.create"), 3);
}

#[tokio::test]
async fn throttling_and_5xx_are_retried_on_reads_but_a_create_is_sent_once() {
    let f = start().await;
    let c = &f.client;
    f.server
        .inject(
            FaultRule::new("neutron.networks.list", Fault::Throttle { retry_after_secs: 1 })
                .times(1),
        )
        .unwrap();
    f.server
        .inject(
            FaultRule::new("neutron.networks.list", Fault::Status { status: 503, body: None })
                .times(1),
        )
        .unwrap();
    let started = std::time::Instant::now();
    c.get("neutron:ListNetworks", Service::Network, &["networks"], &[]).await.unwrap();
    assert_eq!(f.server.counters().get("neutron.networks.list"), 3);
    assert!(started.elapsed() >= Duration::from_secs(1), "Retry-After honoured");
    // A create answered 503 may have been carried out: not sent again.
    f.server
        .inject(
            FaultRule::new(
                "neutron.security_groups.create",
                Fault::Status { status: 503, body: None },
            )
            .times(1),
        )
        .unwrap();
    let body = json!({"security_group": {"name": "sg-x"}});
    let err =
        c.post("neutron:CreateSecurityGroup", Service::Network, &["security-groups"], &body).await;
    assert_eq!(err.unwrap_err().status(), Some(503));
    assert_eq!(f.server.counters().get("neutron.security_groups.create"), 1);
    // A throttled create was refused before it was processed: retried.
    f.server
        .inject(
            FaultRule::new(
                "neutron.security_groups.create",
                Fault::Throttle { retry_after_secs: 0 },
            )
            .times(1),
        )
        .unwrap();
    let sg =
        c.post("neutron:CreateSecurityGroup", Service::Network, &["security-groups"], &body).await;
    assert_eq!(sg.unwrap()["security_group"]["name"], "sg-x");
    assert_eq!(f.server.counters().get("neutron.security_groups.create"), 3);
    // A 403 is not retried.
    f.server
        .inject(
            FaultRule::new("nova.flavors.list", Fault::Status { status: 403, body: None }).times(1),
        )
        .unwrap();
    let err = c.get("nova:ListFlavors", Service::Compute, &["flavors", "detail"], &[]).await;
    assert_eq!(err.unwrap_err().status(), Some(403));
    assert_eq!(f.server.counters().get("nova.flavors.list"), 1);
}

#[tokio::test]
async fn a_hung_call_ends_at_its_deadline_naming_the_call() {
    let f = start_with(
        WORLD,
        OpenStackOptions::default(),
        ClientOptions { timeout: Duration::from_secs(2), retry: Retry::NONE },
        ServerOptions::default(),
    )
    .await;
    f.client.get("neutron:ListNetworks", Service::Network, &["networks"], &[]).await.unwrap();
    f.server.inject(FaultRule::new("nova.servers.list", Fault::Hang)).unwrap();
    let started = std::time::Instant::now();
    let err = f
        .client
        .list::<serde_json::Value>(
            "nova:ListServers",
            Service::Compute,
            &["servers", "detail"],
            &[],
            "servers",
        )
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::Deadline { .. }), "{err}");
    assert!(err.to_string().contains("nova:ListServers"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    // Keystone is bounded the same way (a fresh client's first call).
    f.server.inject(FaultRule::new("keystone.tokens.create", Fault::Hang)).unwrap();
    let c = OpenStackClient::new(
        &f.config.global,
        ClientOptions { timeout: Duration::from_secs(2), retry: Retry::NONE },
    )
    .unwrap();
    let err =
        c.get("neutron:ListNetworks", Service::Network, &["networks"], &[]).await.unwrap_err();
    assert!(matches!(err, ClientError::Deadline { .. }), "{err}");
}

#[tokio::test]
async fn lists_follow_the_next_links_to_the_end() {
    let f = start().await;
    for i in 0..25 {
        f.cloud
            .add_server(instance(&format!("bulk-{i:02}"), "az-1", &format!("10.0.0.{}", 100 + i)))
            .unwrap();
    }
    let all: Vec<serde_json::Value> = f
        .client
        .list(
            "nova:ListServers",
            Service::Compute,
            &["servers", "detail"],
            &[("limit", "10".into())],
            "servers",
        )
        .await
        .unwrap();
    assert_eq!(all.len(), 28);
    assert_eq!(f.server.counters().get("nova.servers.list"), 3, "pages of 10");
    let ports: Vec<serde_json::Value> = f
        .client
        .list("neutron:ListPorts", Service::Network, &["ports"], &[("limit", "7".into())], "ports")
        .await
        .unwrap();
    assert_eq!(ports.len(), 28);
    assert_eq!(f.server.counters().get("neutron.ports.list"), 4);
    // Microversion 2.47: the flavor is embedded with its original name.
    assert!(all.iter().any(|s| s["flavor"]["original_name"] == "m1.medium"));
}

#[tokio::test]
async fn extensions_are_asked_once() {
    let f = start().await;
    assert!(f.client.has_extension("extraroute-atomic").await.unwrap());
    assert!(f.client.has_extension("allowed-address-pairs").await.unwrap());
    assert!(!f.client.has_extension("no-such-extension").await.unwrap());
    assert_eq!(f.server.counters().get("neutron.extensions.list"), 1);
}

#[tokio::test]
async fn a_wrong_password_is_unauthorized_and_never_quoted() {
    let f = start().await;
    let mut g = global(&f.server.url());
    g.password = Secret("not-the-password-4711".into());
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    let err =
        c.get("neutron:ListNetworks", Service::Network, &["networks"], &[]).await.unwrap_err();
    assert!(matches!(err, ClientError::Unauthorized { .. }), "{err}");
    let text = format!("{err} {err:?} {c:?}");
    assert!(!text.contains("not-the-password-4711"), "{text}");
    assert!(text.contains("Keystone refused the password credentials"), "{text}");
    assert_eq!(f.server.counters().get("keystone.tokens.create"), 1, "a refusal is not retried");
}

#[tokio::test]
async fn application_credentials_and_tokens_authenticate() {
    let f = start().await;
    let mut g = global(&f.server.url());
    g.username.clear();
    g.password = Secret::default();
    g.application_credential_id = DEFAULT_APP_CRED_ID.into();
    g.application_credential_secret = Secret(DEFAULT_APP_CRED_SECRET.into());
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    c.get("neutron:ListNetworks", Service::Network, &["networks"], &[]).await.unwrap();
    assert_eq!(f.cloud.tokens_issued(), 1);
}

#[tokio::test]
async fn the_ca_file_is_trusted_and_an_unusable_one_is_named() {
    let f = start_with(
        WORLD,
        OpenStackOptions::default(),
        fast_options(),
        ServerOptions { tls: true, ..ServerOptions::default() },
    )
    .await;
    assert!(f.server.url().starts_with("https://"));
    // Keystone answers over HTTPS with a certificate of the testbed's CA: the token is
    // issued. (The emulator's catalog names plain-HTTP endpoints even when it serves HTTPS,
    // so the service call itself is not checked here.)
    let _ = f.client.get("neutron:ListNetworks", Service::Network, &["networks"], &[]).await;
    assert_eq!(f.cloud.tokens_issued(), 1);
    // Without the CA the server is not trusted: no token.
    let mut g = f.config.global.clone();
    g.ca_file = None;
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    let err =
        c.get("neutron:ListNetworks", Service::Network, &["networks"], &[]).await.unwrap_err();
    assert!(matches!(err, ClientError::Transport { .. }), "{err}");
    assert_eq!(f.cloud.tokens_issued(), 1);
    // A CA file that cannot be read is refused at construction, naming the key.
    g.ca_file = Some("/no/such/ca.pem".into());
    let err = OpenStackClient::new(&g, fast_options()).unwrap_err();
    assert!(err.to_string().contains("[Global] ca-file"), "{err}");
}

#[tokio::test]
async fn unusable_settings_are_refused_naming_the_key() {
    // Before: trusts (and tls-insecure) were refused as unsupported; now a trust without
    // the trustee's password is what is named.
    let mut g = global("http://127.0.0.1:9");
    g.trust_id = "t-1".into();
    g.trustee_id = "u-1".into();
    g.password = Secret::default();
    let err = OpenStackClient::new(&g, ClientOptions::default()).unwrap_err();
    assert!(err.to_string().contains("[Global] trustee-password"), "{err}");
    g.trustee_password = Secret("trustee-secret".into());
    let c = OpenStackClient::new(&g, ClientOptions::default()).unwrap();
    assert!(!format!("{c:?}").contains("trustee-secret"));
    let mut g = global("http://127.0.0.1:9");
    g.tls_insecure = true;
    OpenStackClient::new(&g, ClientOptions::default()).unwrap();
    let mut g = global("http://127.0.0.1:9");
    g.auth_url = "http://127.0.0.1:9/v2.0".into();
    let err = OpenStackClient::new(&g, ClientOptions::default()).unwrap_err();
    assert!(err.to_string().contains("[Global] auth-url"), "{err}");
    let mut g = global("http://127.0.0.1:9");
    g.endpoint_type = "private".into();
    let err = OpenStackClient::new(&g, ClientOptions::default()).unwrap_err();
    assert!(err.to_string().contains("[Global] os-endpoint-type"), "{err}");
    let mut g = global("http://127.0.0.1:9");
    g.password = Secret::default();
    assert!(
        OpenStackClient::new(&g, ClientOptions::default())
            .unwrap_err()
            .to_string()
            .contains("[Global] password")
    );
    // Credentials in the URL (it is logged): refused, naming the key, never quoting it.
    let g = global("http://ccm:url-Secret-Never-Quoted@127.0.0.1:9/v3");
    let err = OpenStackClient::new(&g, ClientOptions::default()).unwrap_err();
    assert!(err.to_string().contains("[Global] auth-url"), "{err}");
    assert!(!format!("{err} {err:?}").contains("url-Secret-Never-Quoted"), "{err:?}");
}

/// `os-endpoint-type` and `region` choose the catalog's endpoint: the emulator's internal
/// endpoints are the same server; a region the catalog lacks is an error naming it and what
/// the catalog has.
#[tokio::test]
async fn the_catalog_endpoint_follows_region_and_interface() {
    let f = start().await;
    let mut g = f.config.global.clone();
    g.endpoint_type = "internal".into();
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    assert_eq!(c.region(), "RegionOne");
    c.get("neutron:ListNetworks", Service::Network, &["networks"], &[]).await.unwrap();
    g.region = "RegionTwo".into();
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    let err =
        c.get("neutron:ListNetworks", Service::Network, &["networks"], &[]).await.unwrap_err();
    assert!(matches!(err, ClientError::Catalog { .. }), "{err}");
    let text = err.to_string();
    assert!(text.contains("\"RegionTwo\"") && text.contains("RegionOne/internal"), "{text}");
}

/// LOW (issue #29): plain `http://` only on loopback or with `[Global] allow-insecure-http`;
/// a catalog endpoint on another host over plain HTTP is refused before anything is sent to it.
#[tokio::test]
async fn plain_http_needs_loopback_or_the_opt_in() {
    let g = global("http://keystone.example.com:5000");
    let err = OpenStackClient::new(&g, ClientOptions::default()).unwrap_err();
    assert!(err.to_string().contains("[Global] auth-url"), "{err}");
    assert!(err.to_string().contains("allow-insecure-http"), "{err}");
    let mut g = global("http://keystone.example.com:5000");
    g.allow_insecure_http = true;
    OpenStackClient::new(&g, ClientOptions::default()).unwrap();
    OpenStackClient::new(&global("https://keystone.example.com:5000"), ClientOptions::default())
        .unwrap();
    OpenStackClient::new(&global("http://localhost:5000"), ClientOptions::default()).unwrap();
    OpenStackClient::new(&global("http://[::1]:5000"), ClientOptions::default()).unwrap();

    // Keystone on loopback, its catalog naming plain-HTTP services elsewhere: refused.
    let opts = OpenStackOptions {
        catalog_base: Some("http://203.0.113.7:8774".into()),
        ..OpenStackOptions::default()
    };
    let f = start_with(WORLD, opts, fast_options(), ServerOptions::default()).await;
    let err =
        f.client.get("nova:GetServer", Service::Compute, &["servers", "x"], &[]).await.unwrap_err();
    assert!(matches!(err, ClientError::InsecureEndpoint { .. }), "{err}");
    assert!(err.to_string().contains("http://203.0.113.7:8774/compute/v2.1"), "{err}");
    assert!(!err.is_not_found());
    assert_eq!(f.cloud.tokens_issued(), 1, "authenticated, then refused before sending");
}

/// LOW (issue #29): a reply body larger than the cap is an error naming the call.
#[tokio::test]
async fn an_oversized_reply_is_an_error() {
    let f = start().await;
    let big = format!("{{\"networks\": [], \"pad\": \"{}\"}}", "x".repeat(MAX_BODY));
    let page =
        Fault::Page { status: 200, content_type: Some("application/json".into()), body: big };
    f.server.inject(FaultRule::new("neutron.networks.list", page).times(1)).unwrap();
    let err = f
        .client
        .get("neutron:ListNetworks", Service::Network, &["networks"], &[])
        .await
        .unwrap_err();
    assert!(matches!(err, ClientError::TooLarge { .. }), "{err}");
    assert!(err.to_string().contains("neutron:ListNetworks"), "{err}");
    // The next answer is normal.
    f.client.get("neutron:ListNetworks", Service::Network, &["networks"], &[]).await.unwrap();
}
