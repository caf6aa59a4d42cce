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
//!
//! Provider flags (issue #30): every flag of the upstream binary is registered so an
//! upstream command line parses. A flag the provider accepts without acting on it is marked
//! with [`accepted_only`]: it is listed under its own `--help` heading
//! ([`ACCEPTED_ONLY_HEADING`]), the generated flag reference marks it
//! ([`Extensions::provider_flags_markdown`]) and, when it is set, the manager logs one warning
//! naming it ([`Extensions::warn_accepted_only`]). [`flag`] builds args with pflag's value
//! syntax; [`ProviderFlags`] reads their values back.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};

/// The `clap` the manager's command is built with (providers build their flags with it and
/// need no `clap` dependency of their own).
pub use clap;

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
pub struct ProviderFlags(Arc<Parsed>);

#[derive(Debug, Default)]
struct Parsed {
    matches: OnceLock<clap::ArgMatches>,
    /// [`Extensions::warn_accepted_only`] has logged its warning.
    warned: AtomicBool,
}

impl ProviderFlags {
    /// The parsed command line (every flag, the provider's included); `None` before parsing.
    pub fn matches(&self) -> Option<&clap::ArgMatches> {
        self.0.matches.get()
    }

    pub(crate) fn set(&self, matches: clap::ArgMatches) {
        let _ = self.0.matches.set(matches);
    }

    /// Whether `--<id>` was given on the command line (not a default).
    pub fn is_set(&self, id: &str) -> bool {
        self.matches().is_some_and(|m| {
            matches!(m.try_contains_id(id), Ok(true))
                && m.value_source(id) == Some(clap::parser::ValueSource::CommandLine)
        })
    }

    /// The value of a single-valued flag built with `value_parser` type `T` (its default when
    /// not given); `None` before parsing, for an unknown id or another type.
    pub fn get<T: Clone + Send + Sync + 'static>(&self, id: &str) -> Option<T> {
        self.matches()?.try_get_one::<T>(id).ok().flatten().cloned()
    }

    /// A [`flag::boolean`]'s value (`default` before parsing or for an unknown id).
    pub fn bool_or(&self, id: &str, default: bool) -> bool {
        self.get::<bool>(id).unwrap_or(default)
    }

    /// Every value of a [`flag::string_array`] (or any `String` flag), in command-line order.
    pub fn strings(&self, id: &str) -> Vec<String> {
        self.matches()
            .and_then(|m| m.try_get_many::<String>(id).ok().flatten())
            .map(|v| v.cloned().collect())
            .unwrap_or_default()
    }

    /// A [`flag::string_to_string`]'s pairs, every occurrence merged (a later key wins, as
    /// pflag's `StringToString`).
    pub fn string_map(&self, id: &str) -> BTreeMap<String, String> {
        self.matches()
            .and_then(|m| m.try_get_many::<Vec<(String, String)>>(id).ok().flatten())
            .map(|v| v.flatten().cloned().collect())
            .unwrap_or_default()
    }
}

/// Help heading of the provider flags accepted for compatibility and not acted on.
pub const ACCEPTED_ONLY_HEADING: &str = "Accepted for compatibility, no effect";

/// Marks a provider flag as accepted but not acted on (see the module docs): the manager warns
/// when it is set, and `--help` and the flag reference list it as such. State what upstream
/// does with it in its help text.
pub fn accepted_only(arg: clap::Arg) -> clap::Arg {
    arg.help_heading(ACCEPTED_ONLY_HEADING)
}

/// Builders of provider flags with the value syntax of upstream's `pflag` kinds.
pub mod flag {
    use clap::{Arg, ArgAction};

    /// pflag `Bool`: `--name`, `--name=true`, `--name=false` (also `1`/`0`, `t`/`f`, `T`/`F`,
    /// `TRUE`/`FALSE`, `True`/`False`, as Go's `strconv.ParseBool`); repeatable, the last
    /// wins (as pflag).
    pub fn boolean(name: &'static str, default: bool) -> Arg {
        Arg::new(name)
            .long(name)
            .action(ArgAction::Set)
            .num_args(0..=1)
            .require_equals(true)
            .default_missing_value("true")
            .default_value(if default { "true" } else { "false" })
            .value_parser(parse_bool)
            .overrides_with(name)
    }

    /// pflag `StringArray` (and `StringSlice` without splitting): repeatable, each occurrence
    /// one value, as given.
    pub fn string_array(name: &'static str) -> Arg {
        Arg::new(name).long(name).action(ArgAction::Append).value_name("VALUE")
    }

    /// pflag `StringToString`: `--name=k1=v1,k2=v2`, repeatable (occurrences merged; read with
    /// [`super::ProviderFlags::string_map`]). An item without `=` is an error naming it.
    pub fn string_to_string(name: &'static str) -> Arg {
        Arg::new(name)
            .long(name)
            .action(ArgAction::Append)
            .value_name("KEY=VALUE,...")
            .value_parser(parse_pairs)
    }

    /// A single value (the last occurrence wins, as pflag); add a `value_parser` for a typed
    /// value (read with [`super::ProviderFlags::get`]).
    pub fn value(name: &'static str, value_name: &'static str) -> Arg {
        Arg::new(name).long(name).action(ArgAction::Set).value_name(value_name).overrides_with(name)
    }

    /// Go's `strconv.ParseBool`.
    pub fn parse_bool(s: &str) -> Result<bool, String> {
        match s {
            "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
            "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
            _ => Err(format!("invalid boolean {s:?} (want true or false)")),
        }
    }

    /// `k1=v1,k2=v2` (an empty value is no pair).
    pub fn parse_pairs(s: &str) -> Result<Vec<(String, String)>, String> {
        s.split(',')
            .filter(|item| !item.is_empty())
            .map(|item| match item.split_once('=') {
                Some((k, v)) => Ok((k.to_string(), v.to_string())),
                None => Err(format!("{item:?} must be formatted as key=value")),
            })
            .collect()
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

    /// The long names of the provider flags marked [`accepted_only`].
    pub fn accepted_only_flags(&self) -> Vec<&str> {
        self.flags
            .iter()
            .filter(|a| a.get_help_heading() == Some(ACCEPTED_ONLY_HEADING))
            .filter_map(|a| a.get_long())
            .collect()
    }

    /// The [`accepted_only`] flags given on the parsed command line, as `--name`.
    pub fn accepted_only_set(&self) -> Vec<String> {
        self.flags
            .iter()
            .filter(|a| a.get_help_heading() == Some(ACCEPTED_ONLY_HEADING))
            .filter(|a| self.parsed.is_set(a.get_id().as_str()))
            .filter_map(|a| a.get_long().map(|l| format!("--{l}")))
            .collect()
    }

    /// Logs one warning naming every [`accepted_only`] flag that was set (nothing when none
    /// was); only the first call logs. Called once logging is set up, before the cloud is
    /// built.
    pub fn warn_accepted_only(&self) {
        let set = self.accepted_only_set();
        if set.is_empty() || self.parsed.0.warned.swap(true, Ordering::SeqCst) {
            return;
        }
        let flags = set.join(", ");
        tracing::warn!(
            flags = %flags,
            "accepted for compatibility with upstream's command line but not acted on: {flags}"
        );
    }

    /// The provider's flags as a Markdown table (flag, default, whether it is acted on, help
    /// text), in registration order; empty when it has none.
    pub fn provider_flags_markdown(&self) -> String {
        let cell = |s: &str| s.replace('|', "\\|").replace('\n', " ");
        let mut out = String::new();
        for arg in &self.flags {
            let (Some(long), false) = (arg.get_long(), arg.is_hide_set()) else { continue };
            if out.is_empty() {
                out.push_str("| flag | default | acted on | what it does |\n|---|---|---|---|\n");
            }
            let defaults: Vec<String> =
                arg.get_default_values().iter().map(|v| v.to_string_lossy().into_owned()).collect();
            let default = match defaults.join(",") {
                d if d.is_empty() => String::new(),
                d => format!("`{}`", cell(&d)),
            };
            let acted = if arg.get_help_heading() == Some(ACCEPTED_ONLY_HEADING) {
                "**no**: accepted, warned about"
            } else {
                "yes"
            };
            let help =
                arg.get_long_help().or(arg.get_help()).map(|h| h.to_string()).unwrap_or_default();
            out.push_str(&format!("| `--{long}` | {default} | {acted} | {} |\n", cell(&help)));
        }
        out
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

    fn provider_ext() -> Extensions {
        Extensions {
            flags: vec![
                flag::string_to_string("tags").help("Tags to apply."),
                flag::string_array("resources"),
                flag::boolean("batching", false),
                flag::value("rate", "FLOAT").value_parser(clap::value_parser!(f64)),
                accepted_only(flag::boolean("legacy-mode", false).help("Upstream: legacy mode.")),
                accepted_only(flag::string_array("extra")),
            ],
            ..Extensions::default()
        }
    }

    fn parse(ext: &Extensions, args: &[&str]) -> Result<(), String> {
        let argv = ["ccm", "--cloud-provider=test"].iter().chain(args);
        crate::manager::parse_flags(ext, argv.copied()).map(|_| ()).map_err(|e| e.to_string())
    }

    #[test]
    fn provider_flags_take_pflag_syntax_and_their_values_reach_the_provider() {
        let ext = provider_ext();
        parse(
            &ext,
            &["--tags=a=1,b=2", "--tags", "b=3,c=", "--resources=instance", "--resources", "x,y"],
        )
        .unwrap();
        let want: BTreeMap<String, String> =
            [("a", "1"), ("b", "3"), ("c", "")].map(|(k, v)| (k.into(), v.into())).into();
        assert_eq!(ext.parsed.string_map("tags"), want);
        assert_eq!(ext.parsed.strings("resources"), ["instance", "x,y"]);
        assert!(!ext.parsed.bool_or("batching", true), "default false");
        assert!(ext.parsed.is_set("tags") && !ext.parsed.is_set("batching"));

        let ext = provider_ext();
        parse(&ext, &["--batching=false", "--rate=1", "--batching", "--rate=2"]).unwrap();
        assert!(ext.parsed.bool_or("batching", false), "repeated: the last wins, as pflag");
        assert_eq!(ext.parsed.get::<f64>("rate"), Some(2.0));

        for (arg, want) in
            [("--batching", true), ("--batching=false", false), ("--batching=T", true)]
        {
            let ext = provider_ext();
            parse(&ext, &[arg, "--rate=0.5"]).unwrap();
            assert_eq!(ext.parsed.bool_or("batching", !want), want, "{arg}");
            assert_eq!(ext.parsed.get::<f64>("rate"), Some(0.5));
            assert_eq!(ext.parsed.get::<String>("rate"), None, "wrong type is None, no panic");
            assert_eq!(ext.parsed.get::<f64>("no-such-flag"), None);
        }
        let err = parse(&provider_ext(), &["--tags=a=1,oops"]).unwrap_err();
        assert!(err.contains("\"oops\" must be formatted as key=value"), "{err}");
        let err = parse(&provider_ext(), &["--batching=maybe"]).unwrap_err();
        assert!(err.contains("invalid boolean"), "{err}");
    }

    #[test]
    fn accepted_only_flags_are_named_when_set_and_marked_in_the_reference() {
        let ext = provider_ext();
        assert_eq!(ext.accepted_only_flags(), ["legacy-mode", "extra"]);
        parse(&ext, &["--tags=a=1"]).unwrap();
        assert!(ext.accepted_only_set().is_empty(), "defaults are not 'set'");

        let ext = provider_ext();
        parse(&ext, &["--legacy-mode=false", "--extra=x", "--extra=y"]).unwrap();
        assert_eq!(ext.accepted_only_set(), ["--legacy-mode", "--extra"]);

        let md = ext.provider_flags_markdown();
        assert!(md.contains("| `--tags` |  | yes | Tags to apply. |"), "{md}");
        assert!(
            md.contains("| `--legacy-mode` | `false` | **no**: accepted, warned about | Upstream: legacy mode. |"),
            "{md}"
        );
        assert!(Extensions::default().provider_flags_markdown().is_empty());
    }
}
