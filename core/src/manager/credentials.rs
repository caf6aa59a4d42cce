//! `--use-service-account-credentials`: each controller acts as its own ServiceAccount in
//! `kube-system` (named by its client name: `node-controller`, `service-controller`,
//! `route-controller`, ...), as upstream's dynamic client builder, or by
//! `--controller-service-account-prefix` + client name (issue #29: upstream's names are
//! kube-controller-manager's own accounts, bound to its bootstrap roles).
//!
//! The ServiceAccount is created when missing. Tokens come from the TokenRequest API (one
//! hour), are written to a private file (mode 0600, never logged) that the client re-reads,
//! and are refreshed at 80% of their lifetime. The files live in a directory this process
//! creates itself (mode 0700, an unpredictable name under the temp dir): a directory that
//! already existed — left by an earlier process with the same pid, or planted by someone
//! else — is never written into.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::ServiceAccount;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

const NAMESPACE: &str = "kube-system";
const TOKEN_SECONDS: i64 = 3600;

/// Builds and caches one client per ServiceAccount.
pub(crate) struct ServiceAccountClients {
    root: Client,
    base: kube::Config,
    dir: PathBuf,
    /// Whether this process has created `dir` (exclusively, mode 0700).
    dir_created: std::sync::atomic::AtomicBool,
    /// The per-ServiceAccount configurations (token file set up and refreshed); every
    /// [`Self::client_for`] builds a new client from one, with its own rate-limit bucket.
    configs: tokio::sync::Mutex<HashMap<String, kube::Config>>,
    /// `--controller-service-account-prefix`: the accounts are `<prefix><client name>`.
    prefix: String,
    qps: f32,
    burst: u32,
}

impl ServiceAccountClients {
    pub(crate) fn new(
        root: Client,
        base: kube::Config,
        prefix: &str,
        qps: f32,
        burst: u32,
    ) -> Self {
        let dir = std::env::temp_dir().join(token_dir_name());
        ServiceAccountClients {
            root,
            base,
            dir,
            dir_created: Default::default(),
            configs: Default::default(),
            prefix: prefix.to_string(),
            qps,
            burst,
        }
    }

    /// Creates the token directory on first use: exclusively (an existing directory is an
    /// error, never reused) and private to this user.
    fn ensure_private_dir(&self) -> Result<(), String> {
        use std::sync::atomic::Ordering;
        if self.dir_created.load(Ordering::Acquire) {
            return Ok(());
        }
        create_private_dir(&self.dir)?;
        self.dir_created.store(true, Ordering::Release);
        Ok(())
    }

    /// Removes the token files (on orderly shutdown).
    pub(crate) fn cleanup(&self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }

    /// A new client acting as `kube-system/<name>`, with its own `--kube-api-qps` /
    /// `--kube-api-burst` bucket (two controllers sharing a ServiceAccount, like
    /// cloud-node and cloud-node-lifecycle, still get one bucket each, as upstream's
    /// `ClientOrDie` builds a new client per call).
    pub(crate) async fn client_for(&self, client_name: &str) -> Result<Client, String> {
        let name = &format!("{}{client_name}", self.prefix);
        let name = name.as_str();
        let mut configs = self.configs.lock().await;
        if let Some(c) = configs.get(name) {
            return super::client_from(c.clone(), name, self.qps, self.burst)
                .map_err(|e| format!("client for {name}: {e}"));
        }
        let sas: Api<ServiceAccount> = Api::namespaced(self.root.clone(), NAMESPACE);
        let sa = ServiceAccount {
            metadata: ObjectMeta { name: Some(name.to_string()), ..Default::default() },
            ..Default::default()
        };
        match sas.create(&PostParams::default(), &sa).await {
            Ok(_) => {
                tracing::info!(serviceaccount = %format!("{NAMESPACE}/{name}"), "created ServiceAccount")
            }
            Err(kube::Error::Api(s)) if s.code == 409 => {}
            Err(e) => return Err(format!("creating ServiceAccount {NAMESPACE}/{name}: {e}")),
        }
        self.ensure_private_dir()?;
        let path = self.dir.join(name);
        let lifetime = write_token(&sas, name, &path, &self.dir).await?;
        let mut config = self.base.clone();
        config.auth_info = kube::config::AuthInfo {
            token_file: Some(path.display().to_string()),
            ..Default::default()
        };
        super::set_user_agent(&mut config, Some(name));
        // Each controller's client has its own --kube-api-qps/--kube-api-burst bucket, as
        // each client-go client built from the rest config has.
        let client = super::client_from(config.clone(), name, self.qps, self.burst)
            .map_err(|e| format!("client for {name}: {e}"))?;
        // Check that the credentials work, and say who the controller acts as.
        let review = Api::<SelfSubjectReview>::all(client.clone())
            .create(&PostParams::default(), &SelfSubjectReview::default())
            .await
            .map_err(|e| {
                format!("the token of ServiceAccount {NAMESPACE}/{name} does not work: {e}")
            })?;
        let user =
            review.status.and_then(|s| s.user_info).and_then(|u| u.username).unwrap_or_default();
        tracing::info!(serviceaccount = %format!("{NAMESPACE}/{name}"), user = %user, "controller client acts as its own ServiceAccount");
        tokio::spawn(refresh(sas, name.to_string(), path, self.dir.clone(), lifetime));
        configs.insert(name.to_string(), config);
        Ok(client)
    }
}

/// `ccm-sa-tokens-<pid>-<random>`: not guessable in advance by another local user.
fn token_dir_name() -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    format!("ccm-sa-tokens-{}-{:016x}", std::process::id(), h.finish())
}

/// Creates `dir` (not its parents) with mode 0700; fails if it exists.
fn create_private_dir(dir: &std::path::Path) -> Result<(), String> {
    let mut builder = std::fs::DirBuilder::new();
    #[cfg(unix)]
    {
        use std::os::unix::fs::DirBuilderExt;
        builder.mode(0o700);
    }
    builder.create(dir).map_err(|e| {
        if e.kind() == std::io::ErrorKind::AlreadyExists {
            format!(
                "refusing to write ServiceAccount tokens into {}: it already existed (not created by this process)",
                dir.display()
            )
        } else {
            format!("creating {}: {e}", dir.display())
        }
    })
}

async fn write_token(
    sas: &Api<ServiceAccount>,
    name: &str,
    path: &std::path::Path,
    dir: &std::path::Path,
) -> Result<Duration, String> {
    let req = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(TOKEN_SECONDS),
            ..Default::default()
        },
        ..Default::default()
    };
    let tr = sas
        .create_token_request(name, &PostParams::default(), &req)
        .await
        .map_err(|e| format!("requesting a token for ServiceAccount {NAMESPACE}/{name}: {e}"))?;
    let status = tr.status.ok_or_else(|| format!("TokenRequest for {name} returned no status"))?;
    let lifetime = {
        let now = k8s_openapi::jiff::Timestamp::now();
        let secs = status.expiration_timestamp.0.as_second() - now.as_second();
        Duration::from_secs(u64::try_from(secs).unwrap_or(60).max(60))
    };
    if !dir.is_dir() {
        // Removed since (shutdown cleanup racing a refresh): created again, privately.
        create_private_dir(dir)?;
    }
    let tmp = path.with_extension("tmp");
    {
        use std::io::Write;
        let mut opts = std::fs::OpenOptions::new();
        opts.write(true).create(true).truncate(true);
        #[cfg(unix)]
        {
            use std::os::unix::fs::OpenOptionsExt;
            opts.mode(0o600);
        }
        let mut f = opts.open(&tmp).map_err(|e| format!("writing {}: {e}", tmp.display()))?;
        f.write_all(status.token.as_bytes())
            .map_err(|e| format!("writing {}: {e}", tmp.display()))?;
    }
    std::fs::rename(&tmp, path).map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(lifetime)
}

async fn refresh(
    sas: Api<ServiceAccount>,
    name: String,
    path: PathBuf,
    dir: PathBuf,
    mut lifetime: Duration,
) {
    loop {
        tokio::time::sleep(lifetime.mul_f64(0.8)).await;
        match write_token(&sas, &name, &path, &dir).await {
            Ok(l) => lifetime = l,
            Err(e) => {
                tracing::warn!(serviceaccount = %name, error = %e, "token refresh failed; retrying");
                lifetime = Duration::from_secs(50);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_token_directory_is_private_unguessable_and_never_an_existing_one() {
        assert_ne!(token_dir_name(), token_dir_name());
        let dir = std::env::temp_dir().join(token_dir_name());
        create_private_dir(&dir).unwrap();
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o700, "{mode:o}");
        }
        // Planted (or left over) before us: refused, not written into.
        let err = create_private_dir(&dir).unwrap_err();
        assert!(err.contains("already existed"), "{err}");
        std::fs::remove_dir(&dir).unwrap();
    }
}
