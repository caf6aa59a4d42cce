//! Whole-string glob matching, shared by the providers (OpenStack's subnet and network name
//! selectors), the emulators' fault rules and the differential comparison's known
//! differences.
//!
//! `*` matches any run of characters (none included, `/` included), `?` exactly one
//! character; every other character matches itself. There is no escaping and no character
//! class: a pattern is a name with wildcards, nothing more. Matching is linear in practice
//! (the greedy star with one back-tracking point), never recursive, so a hostile pattern
//! cannot blow the stack.
//!
//! ```
//! use ccm_core::glob::glob;
//! assert!(glob("public-*", "public-subnet"));
//! assert!(glob("ec2:Describe*", "ec2:DescribeInstances"));
//! assert!(!glob("p?blic", "pblic"));
//! ```

/// Whether the whole of `text` matches `pattern` (`*` any run, `?` one character).
pub fn glob(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    // `pi`/`ti`: the next pattern and text characters. `star`: the last `*` seen and the text
    // position it was tried at; on a mismatch that star takes one more character.
    let (mut pi, mut ti) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while ti < t.len() {
        match p.get(pi) {
            Some('*') => {
                star = Some((pi, ti));
                pi += 1;
            }
            Some(&c) if c == '?' || c == t[ti] => {
                pi += 1;
                ti += 1;
            }
            _ => match star {
                Some((sp, st)) => {
                    pi = sp + 1;
                    ti = st + 1;
                    star = Some((sp, st + 1));
                }
                None => return false,
            },
        }
    }
    p[pi..].iter().all(|&c| c == '*')
}

#[cfg(test)]
mod tests {
    use super::glob;

    #[test]
    fn literals_match_only_themselves_whole() {
        assert!(glob("", ""));
        assert!(!glob("", "a"));
        assert!(!glob("a", ""));
        assert!(glob("ec2:DescribeInstances", "ec2:DescribeInstances"));
        assert!(!glob("ec2:DescribeInstances", "ec2:DescribeInstancesX"));
        assert!(!glob("public", "public-subnet"));
        assert!(!glob("ec2:DescribeInstancesX", "ec2:DescribeInstances"));
    }

    #[test]
    fn a_star_matches_any_run_slashes_and_nothing_included() {
        assert!(glob("*", ""));
        assert!(glob("*", "ec2:DescribeInstances"));
        assert!(glob("**", "x"));
        assert!(glob("ec2:*", "ec2:DescribeInstances"));
        assert!(glob("ec2:*", "ec2:"));
        assert!(!glob("ec2:*", "elasticloadbalancing:DescribeLoadBalancers"));
        assert!(glob("*:Describe*", "ec2:DescribeTags"));
        assert!(glob("*Instances", "ec2:DescribeInstances"));
        assert!(!glob("*Instances", "ec2:DescribeInstancesX"));
        assert!(glob("a*b*c", "abc"));
        assert!(glob("a*b*c", "aXbYbZc"));
        assert!(!glob("a*b*c", "acb"));
        assert!(glob("*/load-balancers/*", "GET /v2/lbaas/load-balancers/42"));
        // The star has to give back what a later literal needs.
        assert!(glob("*ab", "aab"));
        assert!(glob("*aab", "aaab"));
        assert!(!glob("*ab*", "ba"));
    }

    #[test]
    fn a_question_mark_is_exactly_one_character() {
        assert!(glob("p?blic", "public"));
        assert!(!glob("p?blic", "pblic"));
        assert!(!glob("p?blic", "puublic"));
        assert!(glob("?", "é"), "one character, not one byte");
        assert!(!glob("?", ""));
        assert!(glob("*?", "x"));
        assert!(!glob("*??", "x"));
    }

    #[test]
    fn long_hostile_patterns_end_quickly() {
        let text = "a".repeat(2_000);
        let pattern = format!("{}b", "*a".repeat(50));
        let start = std::time::Instant::now();
        assert!(!glob(&pattern, &text));
        assert!(glob(&"*a".repeat(50), &text));
        assert!(start.elapsed() < std::time::Duration::from_secs(5), "{:?}", start.elapsed());
    }
}
