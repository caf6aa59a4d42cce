//! `gce.conf` as operators write it, parsed and handed to the client against the emulator:
//! the file decides the credentials and the cluster's scope.

// Test helpers panic on failure by design (the lead's main.rs may allow it crate-wide).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use ccm_emulators::gcp::GcpOptions;
use ccm_emulators::server::ServerOptions;
use ccm_provider_gcp::client::{GceClient, link};
use ccm_provider_gcp::config::{CONFIG_KEYS, Config, Credentials, StackType};

use crate::fixture::{self, NETWORK, PROJECT, REGION, WORLD, ZONE_A, ZONE_B};

#[tokio::test]
async fn a_kube_up_style_file_with_a_token_url_drives_the_client() {
    let f = fixture::start_with(WORLD, GcpOptions::default(), ServerOptions::default()).await;
    let text = format!(
        "[Global]\n\
         token-url = {url}/token\n\
         token-body = \"{{\\\"projectNumber\\\": 123456789012}}\"\n\
         project-id = {PROJECT}\n\
         network-name = {NETWORK}\n\
         node-tags = k8s-node\n\
         node-tags = web\n\
         node-instance-prefix = node\n\
         multizone = true\n\
         local-zone = {ZONE_A}\n\
         stack-type = IPV4_IPV6\n",
        url = f.server.url()
    );
    let config = Config::parse(&text).unwrap();
    assert!(matches!(config.global.credentials, Credentials::TokenUrl { .. }));
    let client = GceClient::new(&config.global, f.options.clone()).unwrap();
    let scope = client.scope().await.unwrap();
    assert_eq!(scope.project, PROJECT);
    assert_eq!(scope.region, REGION);
    assert_eq!(scope.zones, vec![ZONE_A.to_string(), ZONE_B.to_string()]);
    assert_eq!(scope.network_url, link(&format!("projects/{PROJECT}/global/networks/{NETWORK}")));
    assert_eq!(scope.node_tags, vec!["k8s-node", "web"]);
    assert_eq!(scope.stack_type, StackType::DualStack);
    // Compute was called with a token from the token URL, not the metadata server's.
    let counters = f.server.counters();
    assert!(counters.get("token.alt") >= 1, "{counters:?}");
    assert_eq!(counters.get("compute.zones.list"), 1);
}

#[tokio::test]
async fn no_file_is_the_metadata_server_default() {
    let f = fixture::start().await;
    let config = Config::default();
    assert_eq!(config.global.credentials, Credentials::Metadata);
    let client = GceClient::new(&config.global, f.options.clone()).unwrap();
    let scope = client.scope().await.unwrap();
    assert_eq!(scope.project, PROJECT);
    assert_eq!(scope.local_zone, ZONE_A);
    assert_eq!(f.server.counters().get("token.alt"), 0);
}

#[test]
fn a_typo_in_a_key_is_skipped_with_a_warning_naming_it_as_upstream() {
    // Upstream's gcfg (FatalOnly) skips `node-tag`; so do we, with a warning the manager shows.
    let c = Config::parse("[global]\nproject-id = p\nnode-tag = k8s-node\n").unwrap();
    assert!(c.global.node_tags.is_empty());
    assert_eq!(c.config_warnings().len(), 1, "{:?}", c.config_warnings());
    assert!(c.config_warnings()[0].contains("[global] node-tag (line 3)"));
    assert!(!c.config_warnings()[0].contains("k8s-node"));
    // `a,b` is not two tags.
    let e = Config::parse("[global]\nnode-tags = k8s-node,web\n").unwrap_err();
    assert!(e.to_string().contains("[global] node-tags"), "{e}");
}

#[test]
fn the_key_table_documents_every_upstream_key() {
    for key in [
        "token-url",
        "token-body",
        "project-id",
        "network-project-id",
        "network-name",
        "subnetwork-name",
        "stack-type",
        "secondary-range-name",
        "node-tags",
        "node-instance-prefix",
        "regional",
        "multizone",
        "api-endpoint",
        "container-api-endpoint",
        "local-zone",
        "alpha-features",
    ] {
        assert!(CONFIG_KEYS.iter().any(|k| k.key == key && k.section == "global"), "{key}");
    }
}
