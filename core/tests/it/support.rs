//! Helpers shared by the controller tests: run a controller in the background, poll until
//! a condition holds.

use std::sync::Arc;

use ccm_core::controllers::{ControllerConfig, ControllerContext, Started};
use ccm_core::testing::TestCloud;
use kube::Client;
use tokio_util::sync::CancellationToken;

/// A controller running in the background, with its metrics; stops when dropped.
pub struct Running {
    token: CancellationToken,
    pub metrics: Arc<std::sync::Mutex<prometheus_client::registry::Registry>>,
}

impl Drop for Running {
    fn drop(&mut self) {
        self.token.cancel();
    }
}

/// Builds a context and starts a controller with `start`.
pub fn run(
    client: &Client,
    cloud: TestCloud,
    config: ControllerConfig,
    start: impl FnOnce(&ControllerContext) -> Result<Started, ccm_core::controllers::StartError>,
) -> Running {
    let token = CancellationToken::new();
    let ctx = ControllerContext {
        client: client.clone(),
        cloud: Arc::new(cloud),
        config: Arc::new(config),
        metrics: Default::default(),
        shutdown: token.clone(),
        nodes: None,
    };
    match start(&ctx).expect("controller starts") {
        Started::Running(fut) => {
            tokio::spawn(fut);
        }
        Started::Skipped(why) => panic!("controller skipped: {why}"),
    }
    Running { token, metrics: ctx.metrics.clone() }
}

impl Running {
    /// The registry as `/metrics` serves it (Prometheus text).
    pub fn encoded(&self) -> String {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.metrics.lock().unwrap())
            .unwrap();
        text
    }

    /// The value of the sample `series`, written exactly as exposed (name and labels, e.g.
    /// `workqueue_depth{name="service"}`); `None` if it is not exposed.
    pub fn sample(&self, series: &str) -> Option<f64> {
        self.encoded()
            .lines()
            .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse::<f64>().ok())
    }

    /// The value of a metric sample (sum over label sets), 0 if absent.
    pub fn metric(&self, sample: &str) -> f64 {
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &self.metrics.lock().unwrap())
            .unwrap();
        text.lines()
            .filter(|l| l.split([' ', '{']).next() == Some(sample))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum()
    }
}

pub use ccm_testbed::wait_for;
