//! The `tagging` controller, as upstream `cloud-provider-aws` (v1.36) registers it next to the
//! core's controllers: disabled by default (`--controllers=*,tagging` enables it), it puts the
//! `--tags` on the EC2 instance of every Node (`--resources=instance`, the only resource
//! upstream supports) with `ec2:CreateTags`, then records the MD5 of the sorted `key=value`
//! list in the Node label `k8s.io/cloud-provider-aws`; a Node whose label holds the checksum
//! of the current tags is not tagged again (so changing `--tags` re-tags every Node, and a Node
//! tagged by upstream's controller with the same tags is left alone). When a Node is deleted,
//! the same tags (keys and values) are removed from its instance with `ec2:DeleteTags`.
//!
//! As upstream: invalid tagging flags stop the manager when the controller is enabled (and
//! are ignored otherwise); a Node without an EC2 providerID (none yet, Fargate, another cloud)
//! is skipped; an instance EC2 reports unknown (`InvalidInstanceID.NotFound`) is retried for
//! five minutes after the Node's creation (EC2's eventual consistency), then skipped; any
//! other failure is retried with a per-Node exponential backoff (5 ms doubling, at most 1000 s)
//! up to 9 times, then logged as an error; `--tagging-controller-rate-limit` and
//! `--tagging-controller-burst-limit` (both above 0) pace the work queue with a token bucket,
//! `--tagging-controller-concurrent-node-syncs` workers process it.
//!
//! Differences: `--tagging-controller-enable-batching` is accepted and not acted on (each
//! instance is tagged by its own call; the tags are the same); untagging the instance of a
//! deleted Node that EC2 reports unknown is done (nothing is left to untag) rather than
//! retried; the controller watches Nodes with its own client (the core's shared informer is
//! internal to the core); upstream's work-item metrics are not exported.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ccm_core::cloud::{ProviderError, downcast_provider};
use ccm_core::cloud_call::Deadline;
use ccm_core::controllers::{ControllerContext, ControllerDescriptor, StartError, Started};
use ccm_core::manager::CancellationToken;
use ccm_core::manager::extensions::{ExtraController, ProviderFlags, accepted_only, clap, flag};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::WatchStreamExt as _;
use kube::runtime::watcher::{self, Event};
use tokio::sync::Notify;

use crate::Cloud;
use crate::client::{CallTimeouts, api_error, error_code};

/// The controller's name in `--controllers` (upstream `TaggingControllerKey`; also its alias).
pub const CONTROLLER: &str = "tagging";
/// The ServiceAccount it acts as with `--use-service-account-credentials`.
pub const CLIENT_NAME: &str = "tagging-controller";
/// The Node label holding the checksum of the tags put on the Node's instance.
pub const CHECKSUM_LABEL: &str = "k8s.io/cloud-provider-aws";
/// The only `--resources` value (upstream's `SupportedResources`).
pub const RESOURCE_INSTANCE: &str = "instance";

/// Retries of one Node's work after the first failure (upstream `maxRequeuingCount`).
const MAX_REQUEUES: u32 = 9;
/// How long after a Node's creation "no such instance" is retried, not skipped.
const NEW_NODE_GRACE: Duration = Duration::from_secs(5 * 60);
/// Per-Node retry backoff: 5 ms doubling per failure, at most 1000 s (client-go's default).
const BACKOFF_BASE: Duration = Duration::from_millis(5);
const BACKOFF_MAX: Duration = Duration::from_secs(1000);

/// The flags' names.
const TAGS: &str = "tags";
const RESOURCES: &str = "resources";
const RATE_LIMIT: &str = "tagging-controller-rate-limit";
const BURST_LIMIT: &str = "tagging-controller-burst-limit";
const WORKERS: &str = "tagging-controller-concurrent-node-syncs";
const BATCHING: &str = "tagging-controller-enable-batching";

/// The tagging controller's settings (its flags' values).
#[derive(Debug, Clone, PartialEq)]
pub struct TaggingOptions {
    /// `--tags`: the tags to put on each Node's instance.
    pub tags: BTreeMap<String, String>,
    /// `--resources`: what to tag (`instance`).
    pub resources: Vec<String>,
    /// `--tagging-controller-rate-limit`: queue items per second (0: no limit).
    pub rate_limit: f64,
    /// `--tagging-controller-burst-limit`: the bucket size (0: no limit).
    pub burst_limit: i64,
    /// `--tagging-controller-concurrent-node-syncs`: workers.
    pub workers: i64,
    /// `--tagging-controller-enable-batching` (accepted, not acted on).
    pub batching: bool,
}

impl Default for TaggingOptions {
    fn default() -> Self {
        TaggingOptions {
            tags: BTreeMap::new(),
            resources: Vec::new(),
            rate_limit: 0.0,
            burst_limit: 0,
            workers: 1,
            batching: false,
        }
    }
}

/// The tagging flags cannot be used (the controller is enabled).
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum TaggingError {
    /// `--tags` is empty.
    #[error("--tags must not be empty and must be a form of key=value")]
    NoTags,
    /// `--resources` is empty.
    #[error("--resources must not be empty (supported: instance)")]
    NoResources,
    /// A `--resources` value other than `instance`.
    #[error("--resources: {0:?} is not a supported resource (supported: instance)")]
    Resource(String),
    /// A negative rate or burst, or no workers.
    #[error("--{flag} {message}")]
    Limit {
        /// The flag.
        flag: &'static str,
        /// What is wrong.
        message: &'static str,
    },
}

impl TaggingOptions {
    /// The values of [`flags`] on the parsed command line (defaults before parsing).
    pub fn from_flags(flags: &ProviderFlags) -> Self {
        let d = TaggingOptions::default();
        TaggingOptions {
            tags: flags.string_map(TAGS),
            resources: flags.strings(RESOURCES),
            rate_limit: flags.get(RATE_LIMIT).unwrap_or(d.rate_limit),
            burst_limit: flags.get(BURST_LIMIT).unwrap_or(d.burst_limit),
            workers: flags.get(WORKERS).unwrap_or(d.workers),
            batching: flags.bool_or(BATCHING, d.batching),
        }
    }

    /// Upstream's checks, made when the controller starts.
    pub fn validate(&self) -> Result<(), TaggingError> {
        if self.tags.is_empty() {
            return Err(TaggingError::NoTags);
        }
        if self.resources.is_empty() {
            return Err(TaggingError::NoResources);
        }
        if let Some(r) = self.resources.iter().find(|r| r.as_str() != RESOURCE_INSTANCE) {
            return Err(TaggingError::Resource(r.clone()));
        }
        let limit = |flag, message| Err(TaggingError::Limit { flag, message });
        if self.rate_limit.is_nan() || self.rate_limit < 0.0 {
            return limit(RATE_LIMIT, "should not be less than zero");
        }
        if self.burst_limit < 0 {
            return limit(BURST_LIMIT, "should not be less than zero");
        }
        if self.workers <= 0 {
            return limit(WORKERS, "must be a positive number");
        }
        Ok(())
    }

    /// The value of [`CHECKSUM_LABEL`] for these tags: the hex MD5 of the `key=value` pairs,
    /// sorted and joined by `,` (upstream's `getChecksumOfTags`, so both agree on a Node).
    pub fn checksum(&self) -> String {
        let mut pairs: Vec<String> = self.tags.iter().map(|(k, v)| format!("{k}={v}")).collect();
        pairs.sort();
        md5_hex(pairs.join(",").as_bytes())
    }
}

/// Upstream's tagging flags (`pkg/controllers/options/tagging_controller.go`), under the
/// heading `Tagging controller flags`.
pub fn flags() -> Vec<clap::Arg> {
    let heading = "Tagging controller flags";
    vec![
        flag::string_to_string(TAGS)
            .help("Tags to put on the AWS resources of each Node (the tagging controller), as key=value pairs.")
            .help_heading(heading),
        flag::string_array(RESOURCES)
            .help("AWS resources the tagging controller tags: instance (repeat the flag for more).")
            .help_heading(heading),
        flag::value(RATE_LIMIT, "FLOAT")
            .value_parser(clap::value_parser!(f64))
            .default_value("0")
            .help("Steady-state rate (items per second) of the tagging controller's queue; 0 (default) disables rate limiting.")
            .help_heading(heading),
        flag::value(BURST_LIMIT, "INT")
            .value_parser(clap::value_parser!(i64))
            .default_value("0")
            .help("Burst of the tagging controller's queue; 0 (default) disables rate limiting.")
            .help_heading(heading),
        flag::value(WORKERS, "INT")
            .value_parser(clap::value_parser!(i64))
            .default_value("1")
            .help("Workers of the tagging controller (Nodes tagged concurrently).")
            .help_heading(heading),
        accepted_only(flag::boolean(BATCHING, false).help(
            "Upstream: batch the tagging controller's CreateTags/DeleteTags calls. Here each \
             instance is tagged by its own call (same tags).",
        )),
    ]
}

/// The controller, disabled by default as upstream.
pub fn controller() -> ExtraController {
    ExtraController {
        descriptor: ControllerDescriptor {
            name: CONTROLLER,
            alias: CONTROLLER,
            client_name: CLIENT_NAME,
            start,
        },
        disabled_by_default: true,
    }
}

fn start(ctx: &ControllerContext) -> Result<Started, StartError> {
    let Some(cloud) = downcast_provider::<Cloud>(&ctx.cloud) else {
        return Ok(Started::Skipped(format!(
            "the tagging controller does not support the {} provider",
            ctx.cloud.name()
        )));
    };
    let options = cloud.tagging.clone();
    options
        .validate()
        .map_err(|e| StartError { controller: CONTROLLER, message: e.to_string() })?;
    let tagger = Arc::new(Tagger {
        checksum: options.checksum(),
        queue: Queue::new(RateLimit::new(options.rate_limit, options.burst_limit)),
        options,
        cloud,
        nodes: Api::all(ctx.client.clone()),
        latest: Mutex::default(),
        shutdown: ctx.shutdown.clone(),
    });
    Ok(Started::Running(Box::pin(run(tagger))))
}

/// What to do for a Node.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Action {
    /// Tag the Node's instance (if its label does not hold the current checksum).
    Tag,
    /// Untag the instance of a deleted Node (its providerID).
    Untag(String),
}

struct Tagger {
    options: TaggingOptions,
    checksum: String,
    cloud: Arc<Cloud>,
    nodes: Api<Node>,
    /// The last version of every Node seen (the work reads the current one).
    latest: Mutex<HashMap<String, Arc<Node>>>,
    queue: Queue,
    shutdown: CancellationToken,
}

async fn run(tagger: Arc<Tagger>) {
    let workers = usize::try_from(tagger.options.workers).unwrap_or(1).max(1);
    tracing::info!(
        tags = ?tagger.options.tags,
        checksum = %tagger.checksum,
        workers,
        "starting the tagging controller"
    );
    let mut all = vec![Box::pin(watch(tagger.clone())) as futures::future::BoxFuture<'_, ()>];
    for _ in 0..workers {
        all.push(Box::pin(work(tagger.clone())));
    }
    tokio::select! {
        _ = futures::future::join_all(all) => {}
        _ = tagger.shutdown.cancelled() => {}
    }
    tracing::info!("tagging controller stopped");
}

/// Watches Nodes: queues a Node that needs tagging, and the untagging of a deleted Node's
/// instance (also for Nodes deleted while the watch was re-listing).
async fn watch(tagger: Arc<Tagger>) {
    let mut events =
        watcher::watcher(tagger.nodes.clone(), watcher::Config::default().any_semantic())
            .default_backoff()
            .boxed();
    let mut listing: Option<HashSet<String>> = None;
    while let Some(event) = events.next().await {
        match event {
            Ok(Event::Init) => listing = Some(HashSet::new()),
            Ok(Event::InitApply(node)) => {
                if let (Some(seen), Some(name)) = (listing.as_mut(), node.metadata.name.clone()) {
                    seen.insert(name);
                }
                tagger.applied(node);
            }
            Ok(Event::Apply(node)) => tagger.applied(node),
            Ok(Event::InitDone) => {
                let Some(seen) = listing.take() else { continue };
                let gone: Vec<Arc<Node>> = {
                    let latest = tagger.latest.lock().unwrap_or_else(|p| p.into_inner());
                    latest
                        .iter()
                        .filter(|(n, _)| !seen.contains(*n))
                        .map(|(_, n)| n.clone())
                        .collect()
                };
                for node in gone {
                    tagger.deleted(&node);
                }
            }
            Ok(Event::Delete(node)) => tagger.deleted(&node),
            Err(e) => tracing::warn!(error = %e, "tagging controller: watching Nodes"),
        }
    }
}

fn provider_id(node: &Node) -> &str {
    node.spec.as_ref().and_then(|s| s.provider_id.as_deref()).unwrap_or_default()
}

impl Tagger {
    fn applied(&self, node: Node) {
        let Some(name) = node.metadata.name.clone() else { return };
        let required = self.tagging_required(&node);
        self.latest.lock().unwrap_or_else(|p| p.into_inner()).insert(name.clone(), Arc::new(node));
        if required {
            self.enqueue(name, Action::Tag);
        } else {
            tracing::debug!(node = %name, "tagging controller: already tagged");
        }
    }

    fn deleted(&self, node: &Node) {
        let Some(name) = node.metadata.name.clone() else { return };
        self.latest.lock().unwrap_or_else(|p| p.into_inner()).remove(&name);
        let pid = provider_id(node);
        if !pid.is_empty() {
            self.enqueue(name, Action::Untag(pid.to_string()));
        }
    }

    fn tagging_required(&self, node: &Node) -> bool {
        let label = node.metadata.labels.as_ref().and_then(|l| l.get(CHECKSUM_LABEL));
        label != Some(&self.checksum)
    }

    fn enqueue(&self, name: String, action: Action) {
        match self.queue.rate.delay() {
            None => self.queue.add(name, action),
            Some(delay) => self.add_after(name, action, delay, false),
        }
    }

    /// Adds the work after `delay` (a retry only if no newer work for the Node is queued).
    fn add_after(&self, name: String, action: Action, delay: Duration, retry: bool) {
        let (queue, shutdown) = (self.queue.clone(), self.shutdown.clone());
        tokio::spawn(async move {
            tokio::select! {
                _ = tokio::time::sleep(delay) => {
                    if retry { queue.add_if_absent(name, action) } else { queue.add(name, action) }
                }
                _ = shutdown.cancelled() => {}
            }
        });
    }

    async fn process(&self, name: &str, action: &Action) -> Result<(), ProviderError> {
        match action {
            Action::Tag => {
                let node = self.latest.lock().unwrap_or_else(|p| p.into_inner()).get(name).cloned();
                match node {
                    Some(node) if self.tagging_required(&node) => self.tag(&node).await,
                    _ => Ok(()),
                }
            }
            Action::Untag(pid) => self.untag(name, pid).await,
        }
    }

    /// The instance ID of a providerID, `None` (logged) when it names no EC2 instance.
    fn instance_id(&self, node: &str, provider_id: &str) -> Option<String> {
        match crate::instances::parse_provider_id(provider_id) {
            Ok(id) => Some(id),
            Err(e) => {
                tracing::info!(node, error = %e, "tagging controller: skipping a Node without an EC2 instance");
                None
            }
        }
    }

    fn deadline() -> Deadline {
        Deadline::new(CallTimeouts::default().operation)
    }

    async fn tag(&self, node: &Node) -> Result<(), ProviderError> {
        let name = node.metadata.name.as_deref().unwrap_or_default();
        let Some(id) = self.instance_id(name, provider_id(node)) else { return Ok(()) };
        let ec2 = &self.cloud.clients.get().await?.ec2;
        let mut call = ec2.create_tags().resources(&id);
        for (k, v) in &self.options.tags {
            call = call.tags(aws_sdk_ec2::types::Tag::builder().key(k).value(v).build());
        }
        let result = Self::deadline().run("CreateTags", call.send()).await?;
        match result {
            Ok(_) => {}
            Err(e) if error_code(&e) == Some(INSTANCE_NOT_FOUND) => {
                if within_grace(node) {
                    return Err(ProviderError::other(format!(
                        "EC2 instance {id} of Node {name} does not exist yet (the Node is new: \
                         retried for EC2's eventual consistency)"
                    )));
                }
                tracing::info!(node = name, instance = %id, "tagging controller: the instance does not exist; not tagged");
                return Ok(());
            }
            Err(e) => return Err(api_error(format!("CreateTags on {id} (Node {name})"), e)),
        }
        tracing::info!(node = name, instance = %id, tags = ?self.options.tags, "tagged the Node's instance");
        let mut patch = Node::default();
        patch.metadata.labels = Some([(CHECKSUM_LABEL.to_string(), self.checksum.clone())].into());
        Self::deadline()
            .run(
                "patching the Node's label",
                self.nodes.patch(name, &PatchParams::default(), &Patch::Merge(&patch)),
            )
            .await?
            .map_err(|e| {
                ProviderError::with_source(
                    format!("labelling Node {name} with {CHECKSUM_LABEL}"),
                    e,
                )
            })?;
        Ok(())
    }

    async fn untag(&self, name: &str, provider_id: &str) -> Result<(), ProviderError> {
        let Some(id) = self.instance_id(name, provider_id) else { return Ok(()) };
        let ec2 = &self.cloud.clients.get().await?.ec2;
        let mut call = ec2.delete_tags().resources(&id);
        for (k, v) in &self.options.tags {
            call = call.tags(aws_sdk_ec2::types::Tag::builder().key(k).value(v).build());
        }
        match Self::deadline().run("DeleteTags", call.send()).await? {
            Ok(_) => {
                tracing::info!(node = name, instance = %id, "untagged the deleted Node's instance");
                Ok(())
            }
            Err(e) if error_code(&e) == Some(INSTANCE_NOT_FOUND) => Ok(()),
            Err(e) => Err(api_error(format!("DeleteTags on {id} (deleted Node {name})"), e)),
        }
    }
}

/// The EC2 error code naming an unknown instance ID.
const INSTANCE_NOT_FOUND: &str = "InvalidInstanceID.NotFound";

fn within_grace(node: &Node) -> bool {
    let Some(created) = node.metadata.creation_timestamp.as_ref() else { return false };
    let age = k8s_openapi::jiff::Timestamp::now().as_second() - created.0.as_second();
    age < NEW_NODE_GRACE.as_secs() as i64
}

async fn work(tagger: Arc<Tagger>) {
    loop {
        let (name, action) = tagger.queue.take().await;
        let result = tagger.process(&name, &action).await;
        let retry = tagger.queue.done(&name, result.is_ok());
        if let Err(e) = result {
            match retry {
                Some(n) => {
                    tracing::warn!(node = %name, action = ?action, error = %e, retry = n, "tagging controller: failed, retrying");
                    tagger.add_after(name, action, backoff(n), true);
                }
                None => {
                    tracing::error!(node = %name, action = ?action, error = %e, "tagging controller: failed, retries exhausted")
                }
            }
        }
    }
}

fn backoff(retry: u32) -> Duration {
    BACKOFF_BASE.saturating_mul(1u32 << retry.min(30)).min(BACKOFF_MAX)
}

/// The token bucket of `--tagging-controller-rate-limit`/`-burst-limit` (none unless both
/// are above 0).
#[derive(Debug)]
struct RateLimit(Option<Mutex<Bucket>>);

#[derive(Debug)]
struct Bucket {
    rate: f64,
    burst: f64,
    tokens: f64,
    at: tokio::time::Instant,
}

impl RateLimit {
    fn new(rate: f64, burst: i64) -> Self {
        RateLimit((rate > 0.0 && burst > 0).then(|| {
            Mutex::new(Bucket {
                rate,
                burst: burst as f64,
                tokens: burst as f64,
                at: tokio::time::Instant::now(),
            })
        }))
    }

    /// Takes a token: how long to wait for it (`None`: now, or no limit).
    fn delay(&self) -> Option<Duration> {
        let mut b = self.0.as_ref()?.lock().unwrap_or_else(|p| p.into_inner());
        let now = tokio::time::Instant::now();
        b.tokens = (b.tokens + now.duration_since(b.at).as_secs_f64() * b.rate).min(b.burst);
        b.at = now;
        b.tokens -= 1.0;
        (b.tokens < 0.0).then(|| Duration::from_secs_f64(-b.tokens / b.rate))
    }
}

/// The work queue: one pending action per Node (the latest), a Node processed by one worker
/// at a time, retries counted per Node.
#[derive(Clone)]
struct Queue {
    state: Arc<Mutex<QueueState>>,
    ready: Arc<Notify>,
    rate: Arc<RateLimit>,
}

#[derive(Default)]
struct QueueState {
    order: VecDeque<String>,
    pending: HashMap<String, Action>,
    active: HashSet<String>,
    retries: HashMap<String, u32>,
}

impl Queue {
    fn new(rate: RateLimit) -> Self {
        Queue { state: Arc::default(), ready: Arc::default(), rate: Arc::new(rate) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, QueueState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn add(&self, name: String, action: Action) {
        let mut s = self.lock();
        let new = s.pending.insert(name.clone(), action).is_none();
        if new && !s.active.contains(&name) {
            s.order.push_back(name);
            self.ready.notify_one();
        }
    }

    fn add_if_absent(&self, name: String, action: Action) {
        if !self.lock().pending.contains_key(&name) {
            self.add(name, action);
        }
    }

    async fn take(&self) -> (String, Action) {
        loop {
            let notified = self.ready.notified();
            {
                let mut s = self.lock();
                while let Some(name) = s.order.pop_front() {
                    if let Some(action) = s.pending.remove(&name) {
                        s.active.insert(name.clone());
                        return (name, action);
                    }
                }
            }
            notified.await;
        }
    }

    /// Marks the Node's work done: its retry number if it failed and may be retried.
    fn done(&self, name: &str, ok: bool) -> Option<u32> {
        let mut s = self.lock();
        s.active.remove(name);
        if s.pending.contains_key(name) {
            s.order.push_back(name.to_string());
            self.ready.notify_one();
        }
        if ok {
            s.retries.remove(name);
            return None;
        }
        let n = s.retries.entry(name.to_string()).or_default();
        if *n < MAX_REQUEUES {
            *n += 1;
            Some(*n)
        } else {
            s.retries.remove(name);
            None
        }
    }
}

/// MD5 (RFC 1321) as lowercase hex: only for the checksum label upstream defines with it.
fn md5_hex(input: &[u8]) -> String {
    const S: [u32; 64] = [
        7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 5, 9, 14, 20, 5, 9, 14, 20, 5,
        9, 14, 20, 5, 9, 14, 20, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 6, 10,
        15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21,
    ];
    // K[i] = floor(|sin(i + 1)| * 2^32).
    let k: Vec<u32> =
        (0..64).map(|i| (((i as f64) + 1.0).sin().abs() * 4_294_967_296.0) as u32).collect();
    let mut msg = input.to_vec();
    let bits = (input.len() as u64).wrapping_mul(8);
    msg.push(0x80);
    while msg.len() % 64 != 56 {
        msg.push(0);
    }
    msg.extend_from_slice(&bits.to_le_bytes());
    let mut h: [u32; 4] = [0x6745_2301, 0xefcd_ab89, 0x98ba_dcfe, 0x1032_5476];
    for chunk in msg.chunks_exact(64) {
        let m: Vec<u32> =
            chunk.chunks_exact(4).map(|w| u32::from_le_bytes([w[0], w[1], w[2], w[3]])).collect();
        let [mut a, mut b, mut c, mut d] = h;
        for i in 0..64 {
            let (f, g) = match i / 16 {
                0 => ((b & c) | (!b & d), i),
                1 => ((d & b) | (!d & c), (5 * i + 1) % 16),
                2 => (b ^ c ^ d, (3 * i + 5) % 16),
                _ => (c ^ (b | !d), (7 * i) % 16),
            };
            let f = f.wrapping_add(a).wrapping_add(k[i]).wrapping_add(m[g]);
            a = d;
            d = c;
            c = b;
            b = b.wrapping_add(f.rotate_left(S[i]));
        }
        for (x, y) in h.iter_mut().zip([a, b, c, d]) {
            *x = x.wrapping_add(y);
        }
    }
    h.iter().flat_map(|x| x.to_le_bytes()).map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn md5_matches_rfc_1321_vectors() {
        assert_eq!(md5_hex(b""), "d41d8cd98f00b204e9800998ecf8427e");
        assert_eq!(
            md5_hex(b"The quick brown fox jumps over the lazy dog"),
            "9e107d9d372bb6826bd81d3542a419d6"
        );
        assert_eq!(md5_hex(&[b'x'; 200]), "30a83621ce5422fbdfdd539777458c78");
    }

    #[test]
    fn the_checksum_label_is_upstream_s_for_the_same_tags() {
        let o = TaggingOptions {
            tags: [("c", "d"), ("a", "b")].map(|(k, v)| (k.into(), v.into())).into(),
            ..TaggingOptions::default()
        };
        // md5("a=b,c=d"), as upstream's getChecksumOfTags.
        assert_eq!(o.checksum(), "e30e3a205763e9bbed1be52623d6bb19");
    }

    #[test]
    fn invalid_tagging_flags_are_named() {
        let ok = TaggingOptions {
            tags: [("team".to_string(), "a".to_string())].into(),
            resources: vec!["instance".into()],
            ..TaggingOptions::default()
        };
        assert_eq!(ok.validate(), Ok(()));
        let err = |o: TaggingOptions| o.validate().unwrap_err().to_string();
        assert!(err(TaggingOptions { tags: BTreeMap::new(), ..ok.clone() }).starts_with("--tags"));
        assert!(err(TaggingOptions { resources: vec![], ..ok.clone() }).starts_with("--resources"));
        assert!(
            err(TaggingOptions { resources: vec!["volume".into()], ..ok.clone() })
                .contains("\"volume\" is not a supported resource")
        );
        assert!(
            err(TaggingOptions { rate_limit: -1.0, ..ok.clone() })
                .starts_with("--tagging-controller-rate-limit")
        );
        assert!(
            err(TaggingOptions { burst_limit: -1, ..ok.clone() })
                .starts_with("--tagging-controller-burst-limit")
        );
        assert!(
            err(TaggingOptions { workers: 0, ..ok })
                .starts_with("--tagging-controller-concurrent-node-syncs")
        );
    }

    #[test]
    fn a_node_is_processed_by_one_worker_at_a_time_with_its_latest_action() {
        let q = Queue::new(RateLimit::new(0.0, 0));
        q.add("n1".into(), Action::Tag);
        q.add("n1".into(), Action::Untag("aws:///z/i-1".into()));
        q.add("n2".into(), Action::Tag);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            assert_eq!(q.take().await, ("n1".into(), Action::Untag("aws:///z/i-1".into())));
            q.add("n1".into(), Action::Tag);
            assert_eq!(q.take().await, ("n2".into(), Action::Tag), "n1 is active");
            assert_eq!(q.done("n1", false), Some(1), "first retry");
            assert_eq!(q.take().await, ("n1".into(), Action::Tag), "queued again when done");
            for n in 2..=MAX_REQUEUES {
                assert_eq!(q.done("n1", false), Some(n));
            }
            assert_eq!(q.done("n1", false), None, "retries exhausted");
        });
    }

    #[test]
    fn the_rate_limit_paces_only_beyond_the_burst() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        rt.block_on(async {
            assert_eq!(RateLimit::new(0.0, 5).delay(), None, "0 rate: no limit");
            let r = RateLimit::new(2.0, 2);
            assert_eq!((r.delay(), r.delay()), (None, None), "the burst");
            let d = r.delay().unwrap();
            assert!(d > Duration::from_millis(400) && d <= Duration::from_millis(500), "{d:?}");
        });
        assert!(backoff(1) == Duration::from_millis(10) && backoff(30) == BACKOFF_MAX);
    }
}
