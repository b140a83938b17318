//! Whether a policy's `match` is well formed: its path, methods and header conditions.

use super::fields::header_name;
use super::issues::Issues;
use crate::config::model::request::{HeaderCondition, Matcher};
use crate::config::raw::RawMatch;

/// Validates the conditions under which a policy applies.
pub(super) fn validate_match(issues: &mut Issues, path: &str, raw: RawMatch) -> Matcher {
    for (field, value) in [("path_exact", &raw.path_exact), ("path_prefix", &raw.path_prefix)] {
        if let Some(value) = value
            && !value.starts_with('/')
        {
            issues.add(format!("{path}.{field}"), format!("expected a path starting with \"/\", got {value:?}"));
        }
    }
    if raw.path_exact.is_some() && raw.path_prefix.is_some() {
        issues.add(format!("{path}.path_prefix"), "cannot be combined with path_exact");
    }
    if let Some(methods) = &raw.methods {
        if methods.is_empty() {
            issues.add(format!("{path}.methods"), "expected at least one method");
        }
        for (i, method) in methods.iter().enumerate() {
            if method.is_empty() || !method.bytes().all(|b| b.is_ascii_uppercase()) {
                issues.add(
                    format!("{path}.methods[{i}]"),
                    format!("expected an upper-case method such as \"GET\", got {method:?}"),
                );
            }
        }
    }
    let mut headers = Vec::with_capacity(raw.headers.len());
    for (i, header) in raw.headers.into_iter().enumerate() {
        let at = format!("{path}.headers[{i}]");
        header_name(issues, &format!("{at}.name"), &header.name);
        match (header.present, header.equals) {
            (Some(present), None) => headers.push(HeaderCondition::Present(header.name, present)),
            (None, Some(value)) => headers.push(HeaderCondition::Equals(header.name, value)),
            _ => issues.add(at, "expected exactly one of \"present\" or \"equals\""),
        }
    }
    Matcher { path_exact: raw.path_exact, path_prefix: raw.path_prefix, methods: raw.methods, headers }
}
