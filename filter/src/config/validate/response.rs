//! Whether the rejection response, the rate-limit headers and the shaping settings are
//! valid: statuses, body size, header names and values, headers Sluice sets itself.

use super::fields::{between, header_name, is_header_value};
use super::issues::Issues;
use crate::config::model::bounds::{MAX_MAX_PAUSED, MAX_STATUS, MAX_TICK_MS, MIN_STATUS, MIN_TICK_MS};
use crate::config::model::response::{
    DEFAULT_MAX_PAUSED, DEFAULT_STATUS, DEFAULT_TICK_MS, HeaderSets, MAX_BODY, Response, Shaping,
};
use crate::config::raw::{RawHeaderSet, RawResponse, RawShaping};

/// The header names Sluice sets itself on a rejection; configuring them would duplicate.
const RESERVED_HEADERS: &[&str] = &[
    "content-type",
    "content-length",
    "retry-after",
    "ratelimit",
    "ratelimit-policy",
    "x-ratelimit-limit",
    "x-ratelimit-remaining",
    "x-ratelimit-reset",
    "cache-control",
];

fn header_sets(issues: &mut Issues, path: &str, sets: &[RawHeaderSet], rejection: bool) -> HeaderSets {
    let mut out = HeaderSets::default();
    for (i, set) in sets.iter().enumerate() {
        let flag = match set {
            RawHeaderSet::RetryAfter => {
                if !rejection {
                    issues.add(format!("{path}[{i}]"), "\"retry_after\" is only sent on rejections");
                }
                &mut out.retry_after
            }
            RawHeaderSet::Ratelimit => &mut out.ratelimit,
            RawHeaderSet::XRatelimit => &mut out.legacy,
        };
        if *flag {
            issues.add(format!("{path}[{i}]"), "is listed twice");
        }
        *flag = true;
    }
    out
}

/// Validates the `response` block.
pub(super) fn validate_response(issues: &mut Issues, raw: RawResponse) -> Response {
    let status = raw.status.unwrap_or(DEFAULT_STATUS);
    between(issues, "response.status", status, MIN_STATUS, MAX_STATUS);
    let body = raw.body.unwrap_or_default();
    if body.len() > MAX_BODY {
        issues.add("response.body", format!("must be at most {MAX_BODY} bytes, got {}", body.len()));
    }
    let mut headers = Vec::new();
    match raw.content_type {
        Some(content_type) => {
            if !is_header_value(&content_type) || content_type.is_empty() {
                issues.add(
                    "response.content_type",
                    format!("expected a media type such as \"application/json\", got {content_type:?}"),
                );
            }
            headers.push(("content-type".to_owned(), content_type));
        }
        None if !body.is_empty() => headers.push(("content-type".to_owned(), "text/plain; charset=utf-8".to_owned())),
        None => {}
    }
    for (name, value) in raw.headers {
        let at = format!("response.headers.{name}");
        header_name(issues, &at, &name);
        if RESERVED_HEADERS.contains(&name.as_str()) {
            issues.add(&at, "is set by Sluice itself (use content_type and headers_on_rejected)");
        }
        if !is_header_value(&value) {
            issues.add(&at, "expected a value of visible ASCII characters, spaces and tabs");
        }
        headers.push((name, value));
    }
    let default_rejected = [RawHeaderSet::RetryAfter, RawHeaderSet::Ratelimit];
    let on_rejected = header_sets(
        issues,
        "response.headers_on_rejected",
        raw.headers_on_rejected.as_deref().unwrap_or(&default_rejected),
        true,
    );
    let on_allowed =
        header_sets(issues, "response.headers_on_allowed", raw.headers_on_allowed.as_deref().unwrap_or(&[]), false);
    if let Some(name) = &raw.fallback_header {
        header_name(issues, "response.fallback_header", name);
        if RESERVED_HEADERS.contains(&name.as_str()) || headers.iter().any(|(n, _)| n == name) {
            issues.add("response.fallback_header", format!("{name:?} is already a header of the response"));
        }
    }
    if let Some(name) = &raw.override_header {
        header_name(issues, "response.override_header", name);
        let taken = RESERVED_HEADERS.contains(&name.as_str())
            || headers.iter().any(|(n, _)| n == name)
            || raw.fallback_header.as_ref() == Some(name);
        if taken {
            issues.add("response.override_header", format!("{name:?} is already a header of the response"));
        }
    }
    Response {
        status,
        body,
        headers,
        on_rejected,
        on_allowed,
        fallback_header: raw.fallback_header,
        override_header: raw.override_header,
    }
}

/// Validates the `shaping` block.
pub(super) fn validate_shaping(issues: &mut Issues, raw: RawShaping) -> Shaping {
    let max_paused = raw.max_paused.unwrap_or(DEFAULT_MAX_PAUSED);
    between(issues, "shaping.max_paused", max_paused, 1, MAX_MAX_PAUSED);
    let tick_ms = raw.tick_ms.unwrap_or(DEFAULT_TICK_MS);
    between(issues, "shaping.tick_ms", tick_ms, MIN_TICK_MS, MAX_TICK_MS);
    Shaping { max_paused, tick_ms }
}
