//! Controller supervision: runs each started controller in its own task, turns its `/healthz`
//! check red when the task dies (panics, or ends before it was told to stop), and tells the
//! manager, which then stops the other controllers, releases its leases and exits 1 (upstream
//! crashes the whole process on a controller panic; a silently dead controller behind a green
//! `/healthz` is what this prevents).

use std::panic::AssertUnwindSafe;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use futures::FutureExt;
use futures::future::BoxFuture;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::serving::Health;

/// The first controller that died, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Death {
    /// Canonical controller name.
    pub controller: String,
    /// What happened (the panic message, or that it returned early).
    pub reason: String,
}

/// Watches controller tasks.
#[derive(Clone, Default)]
pub struct Supervisor {
    died: CancellationToken,
    first: Arc<Mutex<Option<Death>>>,
}

impl Supervisor {
    /// Spawns controller `name` running `fut`; `stop` is the token that tells it to stop (its
    /// end after `stop` fired is normal). Registers the controller's `/healthz` check.
    pub fn spawn(
        &self,
        name: &'static str,
        fut: BoxFuture<'static, ()>,
        stop: CancellationToken,
        health: &Health,
    ) -> JoinHandle<()> {
        let dead = Arc::new(AtomicBool::new(false));
        let flag = dead.clone();
        health.add(
            name,
            Arc::new(move || {
                if flag.load(Ordering::SeqCst) {
                    Err(format!("controller {name} is not running"))
                } else {
                    Ok(())
                }
            }),
        );
        let this = self.clone();
        tokio::spawn(async move {
            let outcome = AssertUnwindSafe(fut).catch_unwind().await;
            let reason = match outcome {
                Ok(()) if stop.is_cancelled() => return,
                Ok(()) => "returned before it was told to stop".to_string(),
                Err(panic) => format!("panicked: {}", panic_message(panic.as_ref())),
            };
            dead.store(true, Ordering::SeqCst);
            tracing::error!(controller = name, %reason, "controller died");
            this.report(Death { controller: name.to_string(), reason });
        })
    }

    fn report(&self, death: Death) {
        let mut first = self.first.lock().unwrap_or_else(|p| p.into_inner());
        if first.is_none() {
            *first = Some(death);
        }
        self.died.cancel();
    }

    /// Waits until a controller died; returns the first death.
    pub async fn died(&self) -> Death {
        self.died.cancelled().await;
        self.first
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .unwrap_or(Death { controller: "unknown".into(), reason: "unknown".into() })
    }
}

fn panic_message(panic: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "non-string panic payload".to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_dead_controller_turns_its_check_red_and_is_reported() {
        let health = Health::default();
        let sup = Supervisor::default();
        let stop = CancellationToken::new();
        let ok = sup.spawn(
            "steady-controller",
            Box::pin({
                let stop = stop.clone();
                async move { stop.cancelled().await }
            }),
            stop.clone(),
            &health,
        );
        let bad = sup.spawn(
            "bad-controller",
            Box::pin(async {
                tokio::time::sleep(Duration::from_millis(10)).await;
                panic!("period must be non-zero");
            }),
            stop.clone(),
            &health,
        );
        let death = tokio::time::timeout(Duration::from_secs(30), sup.died()).await.unwrap();
        assert_eq!(death.controller, "bad-controller");
        assert!(death.reason.contains("period must be non-zero"), "{death:?}");
        bad.await.unwrap();
        let r = health.respond("/healthz", None);
        assert_eq!(r.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
        let r = health.respond("/healthz/bad-controller", None);
        assert_eq!(r.status(), http::StatusCode::INTERNAL_SERVER_ERROR);
        let r = health.respond("/healthz/steady-controller", None);
        assert_eq!(r.status(), http::StatusCode::OK);
        // Stopping on request is not a death.
        stop.cancel();
        ok.await.unwrap();
        assert_eq!(
            health.respond("/healthz/steady-controller", None).status(),
            http::StatusCode::OK
        );
    }

    #[tokio::test]
    async fn returning_before_stop_is_a_death() {
        let health = Health::default();
        let sup = Supervisor::default();
        let stop = CancellationToken::new();
        sup.spawn("quitter", Box::pin(async {}), stop, &health).await.unwrap();
        let death = tokio::time::timeout(Duration::from_secs(30), sup.died()).await.unwrap();
        assert_eq!(death.reason, "returned before it was told to stop");
        assert_eq!(
            health.respond("/healthz", None).status(),
            http::StatusCode::INTERNAL_SERVER_ERROR
        );
    }
}
