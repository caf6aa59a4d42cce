//! ARM's naming rules for the resources a Service's annotations or the config name, checked
//! before any call (issue #29): a name that breaks them is never sent, whatever it would do
//! to a URL. The messages name the rule broken and at most the one offending character,
//! never the whole value (it may be long, or crafted to look like something else).
//!
//! - Resource groups: 1–90 characters: letters and digits (Unicode ones included, as ARM),
//!   `_`, `-`, `.`, `(`, `)`; not ending in `.`.
//! - `Microsoft.Network` resources (public IPs, virtual networks, subnets, load balancers,
//!   security groups, route tables): 1–80 characters: ASCII letters and digits, `_`, `.`,
//!   `-`; starting with a letter or digit, ending with a letter, digit or `_`.

/// What kind of ARM name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NameKind {
    /// A resource group.
    ResourceGroup,
    /// A `Microsoft.Network` resource (public IP, virtual network, subnet, …).
    Network,
}

impl NameKind {
    fn what(self) -> &'static str {
        match self {
            NameKind::ResourceGroup => "resource group name",
            NameKind::Network => "network resource name",
        }
    }
}

/// Why `name` is not a valid ARM name of `kind` (`None`: it is valid).
pub fn check(kind: NameKind, name: &str) -> Result<(), String> {
    let what = kind.what();
    let len = name.chars().count();
    let (max, allowed): (usize, fn(char) -> bool) = match kind {
        NameKind::ResourceGroup => {
            (90, |c| c.is_alphanumeric() || matches!(c, '_' | '-' | '.' | '(' | ')'))
        }
        NameKind::Network => (80, |c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')),
    };
    if len == 0 {
        return Err(format!("an empty {what}"));
    }
    if len > max {
        return Err(format!("not a valid {what}: {len} characters (at most {max})"));
    }
    if let Some((i, c)) = name.chars().enumerate().find(|(_, c)| !allowed(*c)) {
        return Err(format!(
            "not a valid {what}: character {} ({}) is not allowed",
            i + 1,
            shown(c)
        ));
    }
    match kind {
        NameKind::ResourceGroup => {
            if name.ends_with('.') {
                return Err(format!("not a valid {what}: it ends with '.'"));
            }
        }
        NameKind::Network => {
            if name.chars().next().is_some_and(|c| !c.is_ascii_alphanumeric()) {
                return Err(format!("not a valid {what}: it must start with a letter or digit"));
            }
            if name.chars().last().is_some_and(|c| !c.is_ascii_alphanumeric() && c != '_') {
                return Err(format!("not a valid {what}: it must end with a letter, digit or '_'"));
            }
        }
    }
    Ok(())
}

/// A character for a message: printable ones quoted, others as their code point.
fn shown(c: char) -> String {
    if c.is_control() || c.is_whitespace() {
        format!("U+{:04X}", c as u32)
    } else {
        format!("{c:?}")
    }
}

/// Whether one path segment of an ARM ID may be sent: not empty, not `.` or `..`, no `/`,
/// `\`, `?`, `#`, `%` or control character. (Names passed [`check`] always are; IDs ARM
/// handed back are checked too, as they are spliced into URLs.)
pub fn check_segment(segment: &str) -> Result<(), String> {
    if segment.is_empty() {
        return Err("an empty path segment".into());
    }
    if segment == "." || segment == ".." {
        return Err("a '.' or '..' path segment".into());
    }
    if let Some(c) =
        segment.chars().find(|c| c.is_control() || matches!(c, '/' | '\\' | '?' | '#' | '%'))
    {
        return Err(format!("character {} in a path segment", shown(c)));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resource_group_rules() {
        for ok in ["rg", "MC_rg_cluster_eastus", "a.b-c_(d)", "ÄÖÜ-grün", &"r".repeat(90)] {
            assert_eq!(check(NameKind::ResourceGroup, ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "rg.",
            "../other",
            "rg/providers/x",
            "rg?api-version=1",
            "rg#",
            "rg%2F",
            "r g",
            "rg\n",
            &"r".repeat(91),
        ] {
            assert!(check(NameKind::ResourceGroup, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn network_name_rules() {
        for ok in ["pip", "my-service.pip_", "a", "A1", &"p".repeat(80)] {
            assert_eq!(check(NameKind::Network, ok), Ok(()), "{ok}");
        }
        for bad in [
            "",
            "-pip",
            "_pip",
            ".pip",
            "pip-",
            "pip.",
            "../networkSecurityGroups/k8s-nsg",
            "pip?api-version=2019-02-01",
            "pip#x",
            "pip(1)",
            "grün",
            &"p".repeat(81),
        ] {
            assert!(check(NameKind::Network, bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn messages_name_one_character_never_the_value() {
        let m = check(NameKind::Network, "x?api-version=2019-02-01&secret=1").unwrap_err();
        assert!(m.contains("character 2 ('?')"), "{m}");
        assert!(!m.contains("api-version"), "{m}");
        let m = check(NameKind::ResourceGroup, "rg\u{7}").unwrap_err();
        assert!(m.contains("U+0007"), "{m}");
    }

    #[test]
    fn segments() {
        assert!(check_segment("pip").is_ok());
        assert!(check_segment("MC_rg_(x)").is_ok());
        for bad in ["", ".", "..", "a/b", "a\\b", "a?b", "a#b", "a%2e", "a\tb"] {
            assert!(check_segment(bad).is_err(), "{bad:?}");
        }
    }
}
