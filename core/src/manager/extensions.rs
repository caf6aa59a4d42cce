//! What a provider adds to the manager (issue #13 point 8): its own controllers, its own
//! admission webhooks and its own flags, as upstream's `NewCloudControllerManagerCommand`
//! takes a provider's controller initializers and flag sets next to the cloud initializer
//! (and its `CommandBuilder.RegisterWebhook` the webhooks). The default adds nothing.
//!
//! Extensions are static (known before the cloud is built) because `--controllers`,
//! `--webhooks` and the provider's flags are validated when the command line is parsed
//! ([`Extensions::validate`]). A provider controller
//! reaches its provider through [`crate::cloud::downcast_provider`] on
//! [`ControllerContext::cloud`](crate::controllers::ControllerContext::cloud); the
//! Kubernetes client hand-off at start is [`crate::cloud::CloudProvider::initialize`].

use std::sync::{Arc, OnceLock};

use super::flags::{FlagError, Flags, Options};
use super::webhooks::Webhook;
use crate::controllers::ControllerDescriptor;

/// A controller the provider adds (e.g. AWS tagging, a node-IPAM variant).
#[derive(Debug, Clone, Copy)]
pub struct ExtraController {
    /// Names, client name and start function; started like the core's controllers (own
    /// API client and rate-limit bucket, `running_managed_controllers`, `/healthz` check,
    /// supervision, leader election and migration).
    pub descriptor: ControllerDescriptor,
    /// Not enabled by `*` in `--controllers`, only by its name or alias (as upstream's
    /// disabled-by-default controllers).
    pub disabled_by_default: bool,
}

/// An admission webhook the provider adds, served on the webhook port next to the core's
/// (spec §9: gate `CloudControllerManagerWebhook`, selected by `--webhooks`).
#[derive(Debug, Clone, Copy)]
pub struct ExtraWebhook {
    /// Name in `--webhooks`, URL path and handler; the handler reaches its provider through
    /// [`crate::cloud::downcast_provider`]. Name and path must not be the core's.
    pub webhook: Webhook,
    /// Not enabled by `*` in `--webhooks`, only by its name (as upstream's
    /// `WebhooksDisabledByDefault`).
    pub disabled_by_default: bool,
}

/// The values of the provider's flags, filled in when the command line is parsed (before
/// the cloud factory runs, so the factory can read them).
#[derive(Debug, Clone, Default)]
pub struct ProviderFlags(Arc<OnceLock<clap::ArgMatches>>);

impl ProviderFlags {
    /// The parsed command line (every flag, the provider's included); `None` before parsing.
    pub fn matches(&self) -> Option<&clap::ArgMatches> {
        self.0.get()
    }

    pub(crate) fn set(&self, matches: clap::ArgMatches) {
        let _ = self.0.set(matches);
    }
}

/// The provider's additions to the manager; [`Extensions::default`] adds nothing.
#[derive(Debug, Clone, Default)]
pub struct Extensions {
    /// Extra controllers, started after the core's, in this order.
    pub controllers: Vec<ExtraController>,
    /// Extra flags, parsed with the manager's and shown in `--help` (names must not clash
    /// with the manager's flags).
    pub flags: Vec<clap::Arg>,
    /// Extra admission webhooks, served after the core's.
    pub webhooks: Vec<ExtraWebhook>,
    /// Where the parsed values of [`Self::flags`] are handed to the provider: keep a clone
    /// in the cloud factory.
    pub parsed: ProviderFlags,
}

impl Extensions {
    /// Every known controller: the core's, then the provider's.
    pub fn all_controllers(&self) -> Vec<ControllerDescriptor> {
        let mut all = crate::controllers::all();
        all.extend(self.controllers.iter().map(|c| c.descriptor));
        all
    }

    /// Names of the provider's controllers that `*` does not enable.
    pub fn disabled_by_default(&self) -> Vec<&'static str> {
        self.controllers
            .iter()
            .filter(|c| c.disabled_by_default)
            .map(|c| c.descriptor.name)
            .collect()
    }

    /// Every known webhook: the core's, then the provider's.
    pub fn all_webhooks(&self) -> Vec<Webhook> {
        let mut all = super::webhooks::all();
        all.extend(self.webhooks.iter().map(|w| w.webhook));
        all
    }

    /// Names of the provider's webhooks that `*` does not enable.
    pub fn webhooks_disabled_by_default(&self) -> Vec<&'static str> {
        self.webhooks.iter().filter(|w| w.disabled_by_default).map(|w| w.webhook.name).collect()
    }

    /// Validates `flags` for the binary of `provider`, with `--controllers` and `--webhooks`
    /// checked against the core's and these extensions' names.
    pub fn validate(&self, flags: Flags, provider: &str) -> Result<Options, FlagError> {
        let webhooks: Vec<(&str, &str)> =
            self.all_webhooks().iter().map(|w| (w.name, "")).collect();
        flags.validate_with_webhooks(provider, &self.all_controllers(), &webhooks)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::manager::webhooks;

    #[test]
    fn default_adds_no_webhooks_and_provider_webhooks_follow_the_core_s() {
        let none = Extensions::default();
        let core: Vec<&str> = webhooks::all().iter().map(|w| w.name).collect();
        assert_eq!(none.all_webhooks().iter().map(|w| w.name).collect::<Vec<_>>(), core);
        assert!(none.webhooks_disabled_by_default().is_empty());

        let extra = |name, disabled_by_default| ExtraWebhook {
            webhook: Webhook { name, path: "/x", handler: webhooks::all()[0].handler },
            disabled_by_default,
        };
        let ext = Extensions {
            webhooks: vec![extra("p-on", false), extra("p-off", true)],
            ..Extensions::default()
        };
        let names: Vec<&str> = ext.all_webhooks().iter().map(|w| w.name).collect();
        assert_eq!(names, [core, vec!["p-on", "p-off"]].concat());
        assert_eq!(ext.webhooks_disabled_by_default(), vec!["p-off"]);
    }
}
