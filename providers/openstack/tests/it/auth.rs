//! Every Keystone authentication method upstream's client accepts, against the emulator's
//! Keystone (domains, projects, application credentials by name and user, trusts, token
//! expiry): what a user of each `[Global]` layout notices is that Nodes can be read, with the
//! project the credential is for; a refused or incomplete credential is an error naming the
//! method or the key, never quoting a secret.

use std::collections::BTreeMap;
use std::time::Duration;

use ccm_emulators::openstack::{
    DEFAULT_APP_CRED_NAME, DEFAULT_APP_CRED_SECRET, DEFAULT_PASSWORD, DEFAULT_TRUST_ID,
    DEFAULT_USER, KeystoneProject, KeystoneUser, MEMBER_PASSWORD, MEMBER_USER, OpenStackOptions,
    keystone_domain_id, keystone_project_id, keystone_user_id,
};
use ccm_emulators::server::ServerOptions;
use ccm_provider_openstack::client::{ClientError, OpenStackClient, Service};
use ccm_provider_openstack::config::{Config, Global, Secret};

use crate::fixture::{Fixture, PROJECT, REGION, WORLD, fast_options, start, start_with};

/// A domain other than `Default`, its user and project (Magnum puts its trustee users in
/// such a domain).
const DOMAIN: &str = "magnum";
const DOMAIN_USER: &str = "kube-ccm";
const DOMAIN_PASSWORD: &str = "domain-user-password-9931";
const DOMAIN_PROJECT: &str = "kube-project";

fn options_with_domain() -> OpenStackOptions {
    let mut o = OpenStackOptions::default();
    o.extra_projects.push(KeystoneProject { name: DOMAIN_PROJECT.into(), domain: DOMAIN.into() });
    o.extra_users.push(KeystoneUser {
        name: DOMAIN_USER.into(),
        password: DOMAIN_PASSWORD.into(),
        domain: DOMAIN.into(),
        projects: vec![PROJECT.into(), DOMAIN_PROJECT.into()],
        roles: vec!["member".into()],
        default_project: None,
    });
    o
}

/// `[Global]` with nothing but the Keystone URL and region.
fn bare(f: &Fixture) -> Global {
    Global {
        auth_url: f.config.global.auth_url.clone(),
        region: REGION.into(),
        ..Global::default()
    }
}

/// The servers the client sees (a Nova listing): proves the token is scoped to `demo`.
async fn servers(c: &OpenStackClient) -> Result<usize, ClientError> {
    let v = c.list::<serde_json::Value>(
        "nova:ListServers",
        Service::Compute,
        &["servers", "detail"],
        &[],
        "servers",
    );
    v.await.map(|s| s.len())
}

#[tokio::test]
async fn password_by_user_id_and_by_name_with_domain_ids() {
    let f =
        start_with(WORLD, options_with_domain(), fast_options(), ServerOptions::default()).await;
    // By user ID; the project by name in a domain given by ID.
    let mut g = bare(&f);
    g.user_id = keystone_user_id(DOMAIN_USER);
    g.password = Secret(DOMAIN_PASSWORD.into());
    g.project_name = PROJECT.into();
    g.project_domain_id = keystone_domain_id("Default");
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    assert_eq!(servers(&c).await.unwrap(), 3);
    assert_eq!(c.project_id().await.unwrap(), Some(keystone_project_id(PROJECT)));
    // By name in a domain other than Default given by ID (user-domain-id), the project of
    // that domain by name and domain ID (tenant-domain-id): a token for that project.
    let mut g = bare(&f);
    g.username = DOMAIN_USER.into();
    g.user_domain_id = keystone_domain_id(DOMAIN);
    g.password = Secret(DOMAIN_PASSWORD.into());
    g.project_name = DOMAIN_PROJECT.into();
    g.project_domain_id = keystone_domain_id(DOMAIN);
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    assert_eq!(c.project_id().await.unwrap(), Some(keystone_project_id(DOMAIN_PROJECT)));
    assert_eq!(servers(&c).await.unwrap(), 0, "another project sees none of demo's servers");
    // `domain-id` alone stands for both the user's and the project's domain.
    let mut g2 = g.clone();
    g2.user_domain_id.clear();
    g2.project_domain_id.clear();
    g2.domain_id = keystone_domain_id(DOMAIN);
    let c = OpenStackClient::new(&g2, fast_options()).unwrap();
    assert_eq!(c.project_id().await.unwrap(), Some(keystone_project_id(DOMAIN_PROJECT)));
    // The same name in the Default domain is another user: refused, the password unquoted.
    g.user_domain_id = keystone_domain_id("Default");
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    let err = servers(&c).await.unwrap_err();
    assert!(matches!(err, ClientError::Unauthorized { .. }), "{err}");
    let text = format!("{err} {err:?} {c:?}");
    assert!(text.contains("Keystone refused the password credentials"), "{text}");
    assert!(!text.contains(DOMAIN_PASSWORD), "{text}");
}

#[tokio::test]
async fn application_credentials_by_id_and_by_name_with_the_user() {
    let f = start().await;
    // By name with the user's ID.
    let mut g = bare(&f);
    g.application_credential_name = DEFAULT_APP_CRED_NAME.into();
    g.application_credential_secret = Secret(DEFAULT_APP_CRED_SECRET.into());
    g.user_id = keystone_user_id(DEFAULT_USER);
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    assert_eq!(servers(&c).await.unwrap(), 3);
    assert_eq!(c.project_id().await.unwrap(), Some(keystone_project_id(PROJECT)));
    // By name with the user's name (and its domain by name).
    let mut g = bare(&f);
    g.application_credential_name = DEFAULT_APP_CRED_NAME.into();
    g.application_credential_secret = Secret(DEFAULT_APP_CRED_SECRET.into());
    g.username = DEFAULT_USER.into();
    g.user_domain_name = "Default".into();
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    assert_eq!(servers(&c).await.unwrap(), 3);
    // The name belongs to that user only: another user naming it is refused.
    g.username = MEMBER_USER.into();
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    let err = servers(&c).await.unwrap_err();
    assert!(err.to_string().contains("application credential"), "{err}");
    assert!(!format!("{err:?}").contains(DEFAULT_APP_CRED_SECRET));
    // Without a user the config names what is missing, before anything is sent.
    let mut g = bare(&f);
    g.application_credential_name = DEFAULT_APP_CRED_NAME.into();
    g.application_credential_secret = Secret(DEFAULT_APP_CRED_SECRET.into());
    let err = OpenStackClient::new(&g, fast_options()).unwrap_err();
    assert!(err.to_string().contains("[Global] application-credential-name"), "{err}");
    assert!(!format!("{err} {err:?}").contains(DEFAULT_APP_CRED_SECRET));
    assert_eq!(f.cloud.tokens_issued(), 2);
}

/// Upstream's `token`: a pre-issued token is exchanged for one scoped to the project.
#[tokio::test]
async fn a_pre_issued_token_is_exchanged_for_a_project_token() {
    let f = start().await;
    let body = serde_json::json!({"auth": {"identity": {"methods": ["password"], "password":
        {"user": {"name": MEMBER_USER, "domain": {"name": "Default"}, "password": MEMBER_PASSWORD}}}}});
    let url = format!("{}/v3/auth/tokens", f.config.global.auth_url);
    let r = reqwest::Client::new().post(url).json(&body).send().await.unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let unscoped = r.headers()["x-subject-token"].to_str().unwrap().to_string();
    let mut g = bare(&f);
    g.token = Secret(unscoped.clone());
    g.project_name = PROJECT.into();
    g.project_domain_name = "Default".into();
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    assert_eq!(servers(&c).await.unwrap(), 3);
    assert!(!format!("{c:?}").contains(&unscoped));
}

/// Magnum's `cloud.conf`: the trustee (`user-id` + `password`, or `trustee-id` +
/// `trustee-password`) with `trust-id` gets the trustor's project; a user who is not the
/// trustee is refused (403), naming the trust method.
#[tokio::test]
async fn a_trust_gives_the_trustee_the_trustors_project() {
    let f = start().await;
    let mut g = bare(&f);
    g.user_id = keystone_user_id(MEMBER_USER);
    g.password = Secret(MEMBER_PASSWORD.into());
    g.trust_id = DEFAULT_TRUST_ID.into();
    g.user_domain_id = "default".into();
    g.project_domain_id = "default".into();
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    assert_eq!(servers(&c).await.unwrap(), 3);
    assert_eq!(c.project_id().await.unwrap(), Some(keystone_project_id(PROJECT)));
    // trustee-id / trustee-password (upstream's keys) do the same.
    let mut g = bare(&f);
    g.trustee_id = keystone_user_id(MEMBER_USER);
    g.trustee_password = Secret(MEMBER_PASSWORD.into());
    g.trust_id = DEFAULT_TRUST_ID.into();
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    assert_eq!(servers(&c).await.unwrap(), 3);
    // The trustor itself is not the trustee: Keystone's 403.
    let mut g = bare(&f);
    g.user_id = keystone_user_id(DEFAULT_USER);
    g.password = Secret(DEFAULT_PASSWORD.into());
    g.trust_id = DEFAULT_TRUST_ID.into();
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    let err = servers(&c).await.unwrap_err();
    assert_eq!(err.status(), Some(403), "{err}");
    assert!(err.to_string().contains("Keystone refused the trust credentials"), "{err}");
    assert!(!format!("{err:?}").contains(DEFAULT_PASSWORD));
    // A trust without the trustee's password: the key is named at construction.
    let mut g = bare(&f);
    g.user_id = keystone_user_id(MEMBER_USER);
    g.trust_id = DEFAULT_TRUST_ID.into();
    let err = OpenStackClient::new(&g, fast_options()).unwrap_err();
    assert!(err.to_string().contains("[Global] trustee-password"), "{err}");
}

/// A token is renewed before it expires: no call is refused on the way (no 401, no resend).
#[tokio::test]
async fn a_token_is_renewed_before_it_expires() {
    let opts = OpenStackOptions { token_lifetime: Duration::from_secs(4), ..Default::default() };
    let f = start_with(WORLD, opts, fast_options(), ServerOptions::default()).await;
    let list = || f.client.get("neutron:ListNetworks", Service::Network, &["networks"], &[]);
    list().await.unwrap();
    assert_eq!(f.cloud.tokens_issued(), 1);
    list().await.unwrap();
    assert_eq!(f.cloud.tokens_issued(), 1, "a fresh token is reused");
    tokio::time::sleep(Duration::from_millis(2500)).await;
    list().await.unwrap();
    assert_eq!(f.cloud.tokens_issued(), 2, "renewed within half its lifetime of expiry");
    assert_eq!(
        f.server.counters().get("neutron.networks.list"),
        3,
        "no call was refused and resent"
    );
}

/// `tls-insecure = true` reaches a server whose CA is not trusted (with a warning); without
/// it, and without `ca-file`, the same server is refused.
#[tokio::test]
async fn tls_insecure_skips_verification_and_ca_file_is_the_trust() {
    let f = start_with(
        WORLD,
        OpenStackOptions::default(),
        fast_options(),
        ServerOptions { tls: true, ..ServerOptions::default() },
    )
    .await;
    let token = || f.client.project_id();
    assert!(token().await.unwrap().is_some(), "ca-file trusted");
    let mut g = f.config.global.clone();
    g.ca_file = None;
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    let err = c.project_id().await.unwrap_err();
    assert!(matches!(err, ClientError::Transport { .. }), "{err}");
    assert!(err.to_string().contains("/identity/v3/auth/tokens"), "{err}");
    g.tls_insecure = true;
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    assert!(c.project_id().await.unwrap().is_some());
    assert_eq!(f.cloud.tokens_issued(), 2);
}

/// A client certificate and key that do not belong together, or are missing their pair, are
/// named at start; secrets in the key file are never quoted.
#[tokio::test]
async fn client_certificate_files_are_checked_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cert = dir.path().join("client.pem");
    let key = dir.path().join("client-key.pem");
    std::fs::write(&cert, "not a certificate").unwrap();
    std::fs::write(
        &key,
        "-----BEGIN PRIVATE KEY-----\nU0VDUkVULUtFWS1CWVRFUw==\n-----END PRIVATE KEY-----\n",
    )
    .unwrap();
    let f = start().await;
    let mut g = f.config.global.clone();
    g.cert_file = Some(cert.clone());
    g.key_file = Some(key.clone());
    let err = OpenStackClient::new(&g, fast_options()).unwrap_err();
    assert!(err.to_string().contains("[Global] cert-file"), "{err}");
    g.key_file = None;
    let err = OpenStackClient::new(&g, fast_options()).unwrap_err();
    assert!(err.to_string().contains("[Global] key-file"), "{err}");
    g.key_file = Some(dir.path().join("missing.pem"));
    g.cert_file = None;
    let err = OpenStackClient::new(&g, fast_options()).unwrap_err();
    assert!(err.to_string().contains("[Global] cert-file"), "{err}");
    assert!(!format!("{err:?}").contains("U0VDUkVU"));
}

/// `use-clouds`: a clouds.yaml entry chosen by `OS_CLOUD` authenticates by application
/// credential; `cloud.conf` keys win over it.
#[tokio::test]
async fn a_clouds_yaml_entry_chosen_by_os_cloud_authenticates() {
    let f = start().await;
    let dir = tempfile::tempdir().unwrap();
    let clouds = dir.path().join("clouds.yaml");
    std::fs::write(
        &clouds,
        format!(
            "clouds:\n  other:\n    auth:\n      auth_url: https://nowhere.example\n  ccm:\n    auth:\n      auth_url: {}\n      application_credential_name: {DEFAULT_APP_CRED_NAME}\n      application_credential_secret: {DEFAULT_APP_CRED_SECRET}\n      user_id: {}\n    region_name: {REGION}\n",
            f.config.global.auth_url,
            keystone_user_id(DEFAULT_USER)
        ),
    )
    .unwrap();
    let conf = format!("[Global]\nuse-clouds = true\nclouds-file = {}\n", clouds.display());
    let env: BTreeMap<String, String> = [("OS_CLOUD".to_string(), "ccm".to_string())].into();
    let config = Config::parse(&conf, &env).unwrap();
    let c = OpenStackClient::new(&config.global, fast_options()).unwrap();
    assert_eq!(servers(&c).await.unwrap(), 3);
    assert_eq!(f.cloud.tokens_issued(), 1);
}

/// `domain-id` (or `domain-name`) without `tenant-id`/`tenant-name`: the token is scoped to
/// that domain, as upstream's gophercloud clientconfig scopes it — not to the user's default
/// project (which a scope-less request would get, and which upstream never touches). Nova
/// refuses a domain-scoped token (403) and the error says the token has no project. A user
/// without a role on the domain is refused by Keystone (401).
#[tokio::test]
async fn a_domain_without_a_project_gets_a_domain_scoped_token() {
    let mut o = options_with_domain();
    // The domain user's default project is demo: a scope-less token would reach its servers.
    if let Some(u) = o.extra_users.iter_mut().find(|u| u.name == DOMAIN_USER) {
        u.default_project = Some(PROJECT.into());
    }
    o.domain_roles.push((DOMAIN_USER.into(), DOMAIN.into()));
    let f = start_with(WORLD, o, fast_options(), ServerOptions::default()).await;
    let mut g = bare(&f);
    g.username = DOMAIN_USER.into();
    g.password = Secret(DOMAIN_PASSWORD.into());
    g.domain_id = keystone_domain_id(DOMAIN);
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    let err = servers(&c).await.unwrap_err();
    assert_eq!(err.status(), Some(403), "{err}");
    let text = err.to_string();
    assert!(
        text.contains(&format!("scoped to the domain {DOMAIN:?}"))
            && text.contains("tenant-id or tenant-name"),
        "{text}"
    );
    assert_eq!(c.project_id().await.unwrap(), None);
    // By name: the same domain scope.
    let mut g = bare(&f);
    g.username = DOMAIN_USER.into();
    g.password = Secret(DOMAIN_PASSWORD.into());
    g.domain_name = DOMAIN.into();
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    let err = servers(&c).await.unwrap_err();
    assert!(err.to_string().contains("scoped to the domain"), "{err}");
    // With a project the token is the project's, as before.
    g.project_name = PROJECT.into();
    g.project_domain_name = "Default".into();
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    assert_eq!(servers(&c).await.unwrap(), 3);
    // A user without a role on the domain: Keystone refuses the domain scope.
    let mut g = bare(&f);
    g.username = MEMBER_USER.into();
    g.password = Secret(MEMBER_PASSWORD.into());
    g.domain_name = "Default".into();
    let c = OpenStackClient::new(&g, fast_options()).unwrap();
    let err = servers(&c).await.unwrap_err();
    assert!(matches!(err, ClientError::Unauthorized { .. }), "{err}");
    assert!(!err.to_string().contains(MEMBER_PASSWORD));
}
