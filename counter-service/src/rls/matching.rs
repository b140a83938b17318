//! Which rule a request's descriptor falls under: envoyproxy/ratelimit's `GetLimit`,
//! rule for rule.
//!
//! For each entry of the descriptor, level by level: the node whose key and value are
//! the entry's; else the first wildcard node of that level (file order) whose pattern
//! the value matches (`*` stands for any run of characters, anywhere); else the node
//! with the key alone. Nothing found ends the walk with no limit. A rule counts only
//! when it is found at the descriptor's last entry (a request deeper or shallower than
//! the configuration has no limit); a node without children ends the walk.

use super::config::{Node, RlsConfig, Rule};
use super::identity;

/// What a descriptor falls under.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Found<'a> {
    /// The domain is not configured: allowed, not counted (`domain_not_found`).
    NoDomain,
    /// No rule at the descriptor's last entry: allowed, not counted.
    NoRule,
    /// A rule, its counter, and the name its metrics go by.
    Rule {
        /// The rule.
        rule: &'a Rule,
        /// The counter's identity ([`identity::counter`]).
        counter: String,
        /// The metrics' rule label: the rule's path, or with `detailed_metric` the
        /// request's own `key_value` path.
        stat: String,
    },
}

/// Whether `value` matches `pattern`, where each `*` stands for any run of characters
/// (none included).
pub fn wildcard_matches(pattern: &str, value: &str) -> bool {
    let mut parts = pattern.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = value.strip_prefix(first) else { return false };
    let parts: Vec<&str> = parts.collect();
    let Some((last, middle)) = parts.split_last() else { return rest.is_empty() };
    for part in middle {
        match rest.find(part) {
            Some(at) => rest = &rest[at + part.len()..],
            None => return false,
        }
    }
    rest.len() >= last.len() && rest.ends_with(last)
}

fn find_node<'a>(level: &'a [Node], key: &str, value: &str) -> Option<&'a Node> {
    let exact = level.iter().find(|n| n.key == key && n.value.as_deref() == Some(value) && !value.is_empty());
    let wildcard = || {
        level
            .iter()
            .find(|n| n.key == key && n.is_wildcard() && wildcard_matches(n.value.as_deref().unwrap_or(""), value))
    };
    let key_only = || level.iter().find(|n| n.key == key && n.value.is_none());
    exact.or_else(wildcard).or_else(key_only)
}

impl RlsConfig {
    /// The rule `entries` of a descriptor in `domain` fall under.
    pub fn find<'a>(&'a self, domain: &str, entries: &[(&str, &str)]) -> Found<'a> {
        let Some(mut level) = self.domains.get(domain).map(Vec::as_slice) else { return Found::NoDomain };
        let mut counted: Vec<(&str, &str)> = Vec::with_capacity(entries.len());
        for (index, (key, value)) in entries.iter().enumerate() {
            let Some(node) = find_node(level, key, value) else { return Found::NoRule };
            counted.push((key, if node.share_threshold { node.value.as_deref().unwrap_or(value) } else { value }));
            if index + 1 == entries.len() {
                let Some(rule) = &node.rule else { return Found::NoRule };
                let stat = if rule.detailed_metric { detailed(domain, entries) } else { rule.path.clone() };
                return Found::Rule { rule, counter: identity::counter(domain, &counted), stat };
            }
            if node.children.is_empty() {
                return Found::NoRule;
            }
            level = &node.children;
        }
        Found::NoRule
    }
}

/// `domain.k1_v1.k2_v2`: envoyproxy/ratelimit's detailed statistics name.
pub fn detailed(domain: &str, entries: &[(&str, &str)]) -> String {
    let mut out = domain.to_owned();
    for (key, value) in entries {
        out.push('.');
        out.push_str(key);
        if !value.is_empty() {
            out.push('_');
            out.push_str(value);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_star_stands_for_any_run_of_characters_anywhere() {
        assert!(wildcard_matches("foo*", "foobar"));
        assert!(wildcard_matches("foo*", "foo"));
        assert!(wildcard_matches("*bar", "foobar"));
        assert!(wildcard_matches("f*o*r", "foobar"));
        assert!(wildcard_matches("*", ""));
        assert!(!wildcard_matches("foo*", "fo"));
        assert!(!wildcard_matches("*bar", "barn"));
        assert!(!wildcard_matches("a*a", "a"));
    }
}
