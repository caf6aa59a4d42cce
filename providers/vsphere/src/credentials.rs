//! vCenter credentials from the Kubernetes Secret named by `secretName`/`secretNamespace`
//! (global or per vCenter), read through the client the manager hands the provider at
//! start ([`ccm_core::cloud::CloudProvider::initialize`]).
//!
//! - [`read_secret`]: one namespace-scoped `get` of exactly that Secret (the chart grants
//!   only that), with a deadline.
//! - [`secret_data`]: the Secret's `data`/`stringData` as credential values
//!   (`<vcenter name or server>.username` / `.password`), trimmed.
//! - [`Loader`]: the vCenters still waiting for their Secret; [`Loader::run`] reads the
//!   Secrets, builds the connections and hands them to [`Instances`], retrying with
//!   back-off until all are connected or the manager stops. Until then instance calls fail
//!   (never "gone").
//! - [`SecretRefresh`]: after a rejected login the vCenter's [`LoginGate`] reads its Secret
//!   again (it may have been rotated) and retries once with the new credentials; the
//!   [`Loader`] attaches one to every vCenter that names a Secret, once the client is there.
//!
//! Values are never logged or put in errors: errors name the Secret and the key only.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Secret as KubeSecret;
use kube::Api;
use tokio_util::sync::CancellationToken;

use crate::client::tagging::TaggingClient;
use crate::client::vim25::Vim25Client;
use crate::client::{ClientError, CredentialRefresh, Credentials, LoginGate, Secret};
use crate::config::{Config, ConfigError, CredentialSources, SecretRef, VCenter};
use crate::instances::{Instances, VCenterConn};

/// Deadline of one Secret read.
pub const SECRET_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// Why the credentials of a vCenter could not be taken from its Secret.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    /// The Secret does not exist (yet).
    #[error("credentials Secret {namespace}/{name} not found")]
    NotFound {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
    },
    /// The API call failed (forbidden, unreachable, ...).
    #[error("reading credentials Secret {namespace}/{name}: {source}")]
    Api {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The client error (it carries no Secret data).
        #[source]
        source: kube::Error,
    },
    /// The API did not answer in time.
    #[error("reading credentials Secret {namespace}/{name}: no answer within {secs}s")]
    Timeout {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The deadline.
        secs: u64,
    },
    /// A value is not UTF-8 text.
    #[error("credentials Secret {namespace}/{name}: key {key} is not UTF-8 text")]
    NotText {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// The data key.
        key: String,
    },
    /// The Secret lacks this vCenter's keys (the message names them).
    #[error("credentials Secret {namespace}/{name}: {source}")]
    Credentials {
        /// Namespace.
        namespace: String,
        /// Name.
        name: String,
        /// Which credential is missing.
        #[source]
        source: Box<ConfigError>,
    },
    /// The vCenter clients could not be built.
    #[error(transparent)]
    Client(#[from] ClientError),
}

/// The credential values of a Secret: `data` (base64-decoded by the API types) and
/// `stringData`, trimmed; a non-UTF-8 value fails naming its key.
pub fn secret_data(
    secret: &KubeSecret,
    at: &SecretRef,
) -> Result<BTreeMap<String, Secret>, SecretError> {
    let mut out = BTreeMap::new();
    for (k, v) in secret.data.iter().flatten() {
        let text = std::str::from_utf8(&v.0).map_err(|_| SecretError::NotText {
            namespace: at.namespace.clone(),
            name: at.name.clone(),
            key: k.clone(),
        })?;
        out.insert(k.clone(), Secret::new(text.trim()));
    }
    for (k, v) in secret.string_data.iter().flatten() {
        out.insert(k.clone(), Secret::new(v.trim()));
    }
    Ok(out)
}

/// Reads the Secret `at` (one namespaced `get`, with [`SECRET_READ_TIMEOUT`]).
pub async fn read_secret(
    client: &kube::Client,
    at: &SecretRef,
) -> Result<BTreeMap<String, Secret>, SecretError> {
    let api: Api<KubeSecret> = Api::namespaced(client.clone(), &at.namespace);
    let got = tokio::time::timeout(SECRET_READ_TIMEOUT, api.get_opt(&at.name))
        .await
        .map_err(|_| SecretError::Timeout {
            namespace: at.namespace.clone(),
            name: at.name.clone(),
            secs: SECRET_READ_TIMEOUT.as_secs(),
        })?
        .map_err(|source| SecretError::Api {
            namespace: at.namespace.clone(),
            name: at.name.clone(),
            source,
        })?;
    match got {
        Some(secret) => secret_data(&secret, at),
        None => {
            Err(SecretError::NotFound { namespace: at.namespace.clone(), name: at.name.clone() })
        }
    }
}

/// Builds the connection of one vCenter from its resolved settings; returns it with the
/// login gate its clients share.
pub fn connect(
    config: &Config,
    vc: &VCenter,
    sources: &CredentialSources,
    timeout: Duration,
) -> Result<(Arc<VCenterConn>, LoginGate), crate::Error> {
    let endpoint = config.endpoint(vc, sources, timeout)?;
    let gate = endpoint.login.clone();
    let vim = Vim25Client::new(endpoint.clone())?;
    let tagging = TaggingClient::new(endpoint)?;
    let conn = Arc::new(VCenterConn::new(
        vc.name.clone(),
        vim,
        tagging,
        vc.datacenters.clone(),
        vc.ip_families.clone(),
    ));
    Ok((conn, gate))
}

/// The credentials of one vCenter in its Secret (`<name or server>.username`/`.password`),
/// read again on each call.
pub struct SecretRefresh {
    client: kube::Client,
    at: SecretRef,
    names: [String; 2],
}

impl SecretRefresh {
    /// Reads `vc`'s Secret through `client`; `None` when `vc` names no Secret.
    pub fn new(client: kube::Client, vc: &VCenter) -> Option<Self> {
        let at = vc.secret.clone()?;
        Some(SecretRefresh { client, at, names: [vc.name.clone(), vc.server.clone()] })
    }
}

#[async_trait::async_trait]
impl CredentialRefresh for SecretRefresh {
    async fn refresh(&self) -> Result<Option<Credentials>, String> {
        let data = read_secret(&self.client, &self.at).await.map_err(|e| e.to_string())?;
        let get = |suffix: &str| {
            self.names
                .iter()
                .find_map(|n| data.get(&format!("{n}.{suffix}")))
                .filter(|s| !s.is_empty())
                .cloned()
        };
        Ok(match (get("username"), get("password")) {
            (Some(user), Some(password)) => {
                Some(Credentials { user: user.expose().to_string(), password })
            }
            _ => None,
        })
    }
}

/// The connections the provider made (for logging out at shutdown), by vCenter name.
pub type Connections = Arc<Mutex<Vec<Arc<VCenterConn>>>>;

/// Records a connection, replacing an older one of the same vCenter.
pub fn record(conns: &Connections, conn: &Arc<VCenterConn>) {
    let mut all = conns.lock().unwrap_or_else(|e| e.into_inner());
    all.retain(|c| c.name != conn.name);
    all.push(conn.clone());
}

/// The vCenters whose credentials come from a Secret read at start.
#[derive(Debug)]
pub struct Loader {
    config: Config,
    /// Environment sources (the fallback after the Secret).
    env: BTreeMap<String, String>,
    timeout: Duration,
    pending: Mutex<Vec<VCenter>>,
    instances: Arc<Instances>,
    /// Login gates of connected vCenters naming a Secret, waiting for a refresher.
    gates: Mutex<Vec<(VCenter, LoginGate)>>,
    conns: Connections,
}

impl Loader {
    /// A loader for `pending` (each has a [`VCenter::secret`]); marks them as waiting in
    /// `instances`. `gates` are the login gates of vCenters already connected that name a
    /// Secret: they get a [`SecretRefresh`] once the client is there. Connections made are
    /// recorded in `conns`.
    pub fn new(
        config: Config,
        env: BTreeMap<String, String>,
        timeout: Duration,
        pending: Vec<VCenter>,
        instances: Arc<Instances>,
        gates: Vec<(VCenter, LoginGate)>,
        conns: Connections,
    ) -> Self {
        for vc in &pending {
            let why = match &vc.secret {
                Some(s) => format!(
                    "its credentials are read from Secret {}/{} when the manager starts",
                    s.namespace, s.name
                ),
                None => "its credentials are missing".to_string(),
            };
            instances.await_credentials(&vc.name, why);
        }
        Loader {
            config,
            env,
            timeout,
            pending: Mutex::new(pending),
            instances,
            gates: Mutex::new(gates),
            conns,
        }
    }

    /// Attaches a [`SecretRefresh`] to every recorded gate (once).
    fn attach_refreshers(&self, client: &kube::Client) {
        let gates = std::mem::take(&mut *self.gates.lock().unwrap_or_else(|e| e.into_inner()));
        for (vc, gate) in gates {
            if let Some(refresh) = SecretRefresh::new(client.clone(), &vc) {
                gate.set_refresh(Arc::new(refresh));
            }
        }
    }

    /// Whether any vCenter still waits for its credentials.
    pub fn is_pending(&self) -> bool {
        !self.pending.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// One pass: reads each needed Secret once and connects every vCenter it can. Returns
    /// the first error (the others are recorded in [`Instances`] too).
    pub async fn load_once(&self, client: &kube::Client) -> Result<(), SecretError> {
        self.attach_refreshers(client);
        let pending = self.pending.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut read: BTreeMap<(String, String), Result<BTreeMap<String, Secret>, String>> =
            BTreeMap::new();
        let mut first_error = None;
        let mut still = Vec::new();
        for vc in pending {
            let Some(at) = vc.secret.clone() else { continue };
            let key = (at.namespace.clone(), at.name.clone());
            if !read.contains_key(&key) {
                let got = match read_secret(client, &at).await {
                    Ok(data) => Ok(data),
                    Err(e) => {
                        tracing::warn!(vcenter = %vc.name, error = %e, "vSphere credentials Secret");
                        let why = e.to_string();
                        first_error.get_or_insert(e);
                        Err(why)
                    }
                };
                read.insert(key.clone(), got);
            }
            let result = match read.get(&key) {
                Some(Ok(data)) => {
                    let sources =
                        CredentialSources { secret_data: data.clone(), env: self.env.clone() };
                    connect(&self.config, &vc, &sources, self.timeout).map_err(|e| match e {
                        crate::Error::Config(source) => SecretError::Credentials {
                            namespace: at.namespace.clone(),
                            name: at.name.clone(),
                            source: Box::new(source),
                        },
                        crate::Error::Client(c) => SecretError::Client(c),
                    })
                }
                Some(Err(why)) => {
                    self.instances.await_credentials(&vc.name, why.clone());
                    still.push(vc);
                    continue;
                }
                None => continue,
            };
            match result {
                Ok((conn, gate)) => {
                    if let Some(refresh) = SecretRefresh::new(client.clone(), &vc) {
                        gate.set_refresh(Arc::new(refresh));
                    }
                    record(&self.conns, &conn);
                    tracing::info!(
                        vcenter = %vc.name,
                        secret = %format!("{}/{}", at.namespace, at.name),
                        "vCenter credentials read from Secret"
                    );
                    self.instances.connect(conn);
                }
                Err(e) => {
                    tracing::warn!(vcenter = %vc.name, error = %e, "vSphere credentials Secret");
                    self.instances.await_credentials(&vc.name, e.to_string());
                    first_error.get_or_insert(e);
                    still.push(vc);
                }
            }
        }
        *self.pending.lock().unwrap_or_else(|e| e.into_inner()) = still;
        first_error.map_or(Ok(()), Err)
    }

    /// Loads until every vCenter is connected, retrying with back-off (1s doubling to
    /// 60s), or until `shutdown` fires.
    pub async fn run(self: Arc<Self>, client: kube::Client, shutdown: CancellationToken) {
        let mut delay = Duration::from_secs(1);
        self.attach_refreshers(&client);
        if !self.is_pending() {
            return;
        }
        loop {
            let _ = self.load_once(&client).await;
            if !self.is_pending() {
                return;
            }
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = tokio::time::sleep(delay) => {}
            }
            delay = (delay * 2).min(Duration::from_secs(60));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> SecretRef {
        SecretRef { name: "vsphere-creds".into(), namespace: "kube-system".into() }
    }

    #[test]
    fn data_and_string_data_are_read_and_trimmed() {
        let secret = KubeSecret {
            data: Some(
                [("10.0.0.1.username", "admin\n"), ("10.0.0.1.password", " pw-9f3 \n")]
                    .map(|(k, v)| (k.to_string(), k8s_openapi::ByteString(v.as_bytes().to_vec())))
                    .into(),
            ),
            string_data: Some([("vc2.username".to_string(), "u2".to_string())].into()),
            ..Default::default()
        };
        let data = secret_data(&secret, &at()).unwrap();
        assert_eq!(data["10.0.0.1.username"].expose(), "admin");
        assert_eq!(data["10.0.0.1.password"].expose(), "pw-9f3");
        assert_eq!(data["vc2.username"].expose(), "u2");
    }

    #[test]
    fn non_text_value_names_the_key_not_the_value() {
        let secret = KubeSecret {
            data: Some(
                [("vc.password".to_string(), k8s_openapi::ByteString(vec![0xff, 0xfe, b'x']))]
                    .into(),
            ),
            ..Default::default()
        };
        let e = secret_data(&secret, &at()).unwrap_err().to_string();
        assert!(e.contains("kube-system/vsphere-creds") && e.contains("vc.password"), "{e}");
    }

    #[test]
    fn secret_keys_resolve_by_server_or_name_and_missing_ones_name_the_secret_key() {
        let cfg = Config::parse(
            b"global: {secretName: vsphere-creds, secretNamespace: kube-system}\n\
              vcenter:\n  vc1: {server: 10.0.0.1}\n  vc2: {secretName: other, secretNamespace: ns2}\n",
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(cfg.vcenters[0].secret, Some(at()));
        assert_eq!(
            cfg.vcenters[1].secret,
            Some(SecretRef { name: "other".into(), namespace: "ns2".into() })
        );
        let secret = KubeSecret {
            string_data: Some(
                [("10.0.0.1.username", "u1"), ("10.0.0.1.password", "pw-1a2b")]
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .into(),
            ),
            ..Default::default()
        };
        let sources =
            CredentialSources { secret_data: secret_data(&secret, &at()).unwrap(), env: [].into() };
        let ep = cfg.endpoint(&cfg.vcenters[0], &sources, Duration::from_secs(1)).unwrap();
        assert_eq!((ep.user.as_str(), ep.password.expose()), ("u1", "pw-1a2b"));
        let e = cfg.endpoint(&cfg.vcenters[1], &sources, Duration::from_secs(1)).unwrap_err();
        let e = SecretError::Credentials {
            namespace: "ns2".into(),
            name: "other".into(),
            source: Box::new(e),
        }
        .to_string();
        assert!(e.contains("ns2/other") && e.contains("vc2.username"), "{e}");
        assert!(!e.contains("pw-1a2b"), "{e}");
    }

    #[test]
    fn inline_credentials_win_over_the_secret() {
        let cfg = Config::parse(
            b"global: {secretName: s, secretNamespace: ns, user: inline, password: inline-pw}\n\
              vcenter: {vc1: {}}\n",
            &BTreeMap::new(),
        )
        .unwrap();
        let sources = CredentialSources {
            secret_data: [
                ("vc1.username".to_string(), Secret::new("su")),
                ("vc1.password".to_string(), Secret::new("sp")),
            ]
            .into(),
            env: [].into(),
        };
        let ep = cfg.endpoint(&cfg.vcenters[0], &sources, Duration::from_secs(1)).unwrap();
        assert_eq!((ep.user.as_str(), ep.password.expose()), ("inline", "inline-pw"));
    }

    #[test]
    fn per_vcenter_secret_fields_fall_back_to_global_and_errors_name_the_key() {
        let cfg = Config::parse(
            b"global: {secretName: g, secretNamespace: ns}\nvcenter: {vc1: {secretName: mine}}\n",
            &BTreeMap::new(),
        )
        .unwrap();
        assert_eq!(
            cfg.vcenters[0].secret,
            Some(SecretRef { name: "mine".into(), namespace: "ns".into() })
        );
        let e = Config::parse(b"vcenter: {vc1: {secretName: mine}}\n", &BTreeMap::new())
            .unwrap_err()
            .to_string();
        assert!(e.contains("vcenter.vc1.secretNamespace"), "{e}");
    }
}
