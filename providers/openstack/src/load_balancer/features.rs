//! Octavia API version discovery and the features gated on it, as upstream's
//! `IsOctaviaFeatureSupported` (cloud-provider-openstack v1.36.0) gates them:
//!
//! | feature | Octavia API | not with `lb-provider = ovn` | below it |
//! |---|---|---|---|
//! | tags (load balancers, listeners) | ≥ 2.5 | | no tags written, no sharing by `load-balancer-id` |
//! | `timeout_*` on listeners | ≥ 2.1 | ✓ | Octavia's defaults |
//! | flavors | ≥ 2.6 | ✓ | `flavor-id` ignored |
//! | `allowed_cidrs` (listener ACL) | ≥ 2.12 | ✓ | source ranges only through the security group with `ovn` and `manage-security-groups`, else a `LoadBalancerSourceRangesIgnored` Warning |
//! | availability zones | ≥ 2.14 | ✓ | `availability-zone` ignored, a `LoadBalancerAvailabilityZonesIgnored` Warning |
//! | HTTP monitors on UDP pools | ≥ 2.16 | ✓ | `UDP-CONNECT` monitor |
//!
//! The version is the highest `v2.N` that `GET /` on the load-balancer endpoint lists; it is
//! asked once and cached, under the client's deadline. *Changed from upstream*: a failed
//! discovery is an error (the reconcile is retried) where upstream takes every feature as
//! unsupported for that reconcile; and the cache is dropped whenever a reconcile fails, so
//! an Octavia upgraded or rolled back is discovered again (upstream caches for the process's
//! life).

use std::sync::Mutex;

use ccm_core::cloud::ProviderError;
use k8s_openapi::api::core::v1::Service;

use super::annotations::{ServiceConfig, keys, str_annotation};
use crate::config::LoadBalancerOpts;

/// Upstream's Warning reason when the listener ACL is unavailable.
pub const EVENT_SOURCE_RANGES_IGNORED: &str = "LoadBalancerSourceRangesIgnored";
/// Upstream's Warning reason when availability zones are unavailable.
pub const EVENT_AZ_IGNORED: &str = "LoadBalancerAvailabilityZonesIgnored";

/// What the deployed Octavia (and `lb-provider`) supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Features {
    /// The highest API version listed, `(2, N)`.
    pub version: (u32, u32),
    /// Tags on load balancers and listeners (≥ 2.5).
    pub tags: bool,
    /// Listener `timeout_*` (≥ 2.1, not `ovn`).
    pub timeouts: bool,
    /// Flavors (≥ 2.6, not `ovn`).
    pub flavors: bool,
    /// Listener `allowed_cidrs` (≥ 2.12, not `ovn`).
    pub vip_acl: bool,
    /// Availability zones (≥ 2.14, not `ovn`).
    pub availability_zones: bool,
    /// HTTP monitors on UDP pools (≥ 2.16, not `ovn`).
    pub http_monitors_on_udp: bool,
}

impl Features {
    /// The features of API `version` with provider `lb_provider`, as upstream decides them.
    pub fn of(version: (u32, u32), lb_provider: &str) -> Features {
        let ovn = lb_provider.eq_ignore_ascii_case("ovn");
        let at_least = |minor: u32| version >= (2, minor);
        Features {
            version,
            tags: at_least(5),
            timeouts: !ovn && at_least(1),
            flavors: !ovn && at_least(6),
            vip_acl: !ovn && at_least(12),
            availability_zones: !ovn && at_least(14),
            http_monitors_on_udp: !ovn && at_least(16),
        }
    }
}

/// The discovered version, asked once and kept until [`VersionCache::forget`].
#[derive(Debug, Default)]
pub struct VersionCache {
    known: Mutex<Option<(u32, u32)>>,
}

impl VersionCache {
    /// The cached version, if any.
    pub fn get(&self) -> Option<(u32, u32)> {
        self.known.lock().ok().and_then(|g| *g)
    }

    /// Remembers `version`.
    pub fn set(&self, version: (u32, u32)) {
        if let Ok(mut g) = self.known.lock() {
            *g = Some(version);
        }
    }

    /// Drops the cached version: the next reconcile asks Octavia again.
    pub fn forget(&self) {
        if let Ok(mut g) = self.known.lock() {
            *g = None;
        }
    }
}

/// A Warning to raise on the Service: `(reason, message)`.
pub type Warning = (&'static str, String);

/// Restricts `conf` to what `features` allows, as upstream; returns the Warnings upstream
/// raises on the Service for what it had to ignore.
pub fn apply(
    conf: &mut ServiceConfig,
    features: &Features,
    opts: &LoadBalancerOpts,
    service: &Service,
) -> Vec<Warning> {
    let mut warnings = Vec::new();
    let (major, minor) = features.version;
    conf.tags = features.tags;
    conf.http_monitors_on_udp = features.http_monitors_on_udp;
    if !features.timeouts {
        conf.timeouts = None;
    }
    if !features.flavors {
        conf.flavor_id.clear();
    }
    if !features.vip_acl {
        conf.allowed_cidrs = None;
        let ovn = opts.lb_provider.eq_ignore_ascii_case("ovn");
        // With ovn and managed security groups the source ranges are the group's rules.
        if !(ovn && opts.manage_security_groups) {
            warnings.push((
                EVENT_SOURCE_RANGES_IGNORED,
                format!(
                    "LoadBalancerSourceRanges of Service {} are not enforced: listener allowed_cidrs need Octavia API 2.12 (found v{major}.{minor}) and a provider other than ovn",
                    conf.service
                ),
            ));
        }
    }
    let az = str_annotation(service, keys::AVAILABILITY_ZONE, &opts.availability_zone);
    if !features.availability_zones {
        conf.availability_zone.clear();
        if !az.is_empty() {
            warnings.push((
                EVENT_AZ_IGNORED,
                format!(
                    "availability zone {az:?} of Service {} is ignored: Octavia availability zones need API 2.14 (found v{major}.{minor}) and a provider other than ovn",
                    conf.service
                ),
            ));
        }
    }
    warnings
}

/// An error for a failed discovery.
pub fn discovery_error(e: crate::client::ClientError) -> ProviderError {
    ProviderError::with_source(
        format!("Octavia API version discovery (GET / on the load-balancer endpoint): {e}"),
        e,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn features_follow_upstreams_version_gates() {
        let f = Features::of((2, 0), "amphora");
        assert!(!f.tags && !f.timeouts && !f.vip_acl && !f.http_monitors_on_udp);
        let f = Features::of((2, 4), "amphora");
        assert!(f.timeouts && !f.tags);
        let f = Features::of((2, 5), "amphora");
        assert!(f.tags && !f.flavors);
        let f = Features::of((2, 11), "amphora");
        assert!(f.flavors && !f.vip_acl);
        let f = Features::of((2, 12), "amphora");
        assert!(f.vip_acl && !f.availability_zones);
        let f = Features::of((2, 15), "amphora");
        assert!(f.availability_zones && !f.http_monitors_on_udp);
        let f = Features::of((2, 16), "amphora");
        assert!(f.http_monitors_on_udp);
        // ovn: only tags.
        let f = Features::of((2, 27), "ovn");
        assert!(f.tags && !f.timeouts && !f.flavors && !f.vip_acl);
        assert!(!f.availability_zones && !f.http_monitors_on_udp);
        let cache = VersionCache::default();
        assert_eq!(cache.get(), None);
        cache.set((2, 27));
        assert_eq!(cache.get(), Some((2, 27)));
        cache.forget();
        assert_eq!(cache.get(), None);
    }
}
