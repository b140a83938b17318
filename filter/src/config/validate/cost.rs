//! Whether a policy's cost is valid: a constant or a request header's value, never zero
//! and never more than the policy's capacity (no request could pass); or a cost the
//! response reports, whose estimate obeys the same rules and whose spend the policy's
//! algorithm can give back.

use super::fields::{algorithms, header_name};
use super::issues::Issues;
use crate::config::model::policy::MAX_CONFIGURED_AMOUNT;
use crate::config::model::request::{Cost, ResponseCost, Usage};
use crate::config::raw::{RawCost, RawOnUnknown, RawResponseCost};
use shared_store::{Algorithm, Limit};

/// Most segments in a `response_json` path, and most bytes in one.
pub const MAX_JSON_PATH_SEGMENTS: usize = 8;
const MAX_JSON_SEGMENT_BYTES: usize = 64;

/// The cost of one request under `limit`.
pub(super) fn validate_cost(issues: &mut Issues, path: &str, raw: Option<&RawCost>, limit: &Limit) -> Option<Cost> {
    let at = format!("{path}.cost");
    match raw {
        None => Some(Cost::Constant(1)),
        Some(RawCost::Response(response)) => validate_response(issues, &at, response, limit),
        Some(known) => validate_known(issues, &at, known, limit.capacity()),
    }
}

/// A cost known at admission (a constant or a request header), at `at`.
fn validate_known(issues: &mut Issues, at: &str, raw: &RawCost, capacity: u64) -> Option<Cost> {
    match raw {
        RawCost::Constant(cost) => {
            if *cost == 0 {
                issues.add(at, "must be at least 1");
                None
            } else if *cost > capacity {
                issues.add(
                    at,
                    format!(
                        "must not exceed the policy's capacity ({capacity}), got {cost}: no request could ever pass"
                    ),
                );
                None
            } else {
                Some(Cost::Constant(*cost))
            }
        }
        RawCost::Header(header) => {
            let before = issues.count();
            header_name(issues, &format!("{at}.header"), &header.header);
            let min = header.min.unwrap_or(1);
            if min == 0 {
                issues.add(format!("{at}.min"), "must be at least 1 (a zero cost would let a caller spend nothing)");
            }
            if header.max < min {
                issues.add(format!("{at}.max"), format!("must be at least min ({min}), got {}", header.max));
            } else if header.max > capacity {
                issues.add(
                    format!("{at}.max"),
                    format!("must not exceed the policy's capacity ({capacity}), got {}", header.max),
                );
            }
            let default = header.default.unwrap_or(min);
            if default < min || default > header.max {
                issues.add(
                    format!("{at}.default"),
                    format!("must be between min ({min}) and max ({}), got {default}", header.max),
                );
            }
            (issues.count() == before).then(|| Cost::Header {
                name: header.header.clone(),
                default,
                min,
                max: header.max,
            })
        }
        RawCost::Response(_) => {
            issues.add(at, "must be a constant or a request header: an estimate is spent before the response");
            None
        }
    }
}

/// A cost the response reports, at `at`.
fn validate_response(issues: &mut Issues, at: &str, raw: &RawResponseCost, limit: &Limit) -> Option<Cost> {
    let before = issues.count();
    if !Algorithm::of(limit).creditable() {
        // Of the algorithms that count over time, those whose spend cannot be given back.
        let refused = algorithms(|a| a.global() && !a.creditable(), |name| format!("a {name}'s"));
        issues.add(
            at,
            format!(
                "a cost read from the response needs a {} policy: {refused} spend cannot be given back",
                algorithms(Algorithm::creditable, str::to_owned)
            ),
        );
    }
    let usage = match (&raw.response_header, &raw.response_json) {
        (Some(name), None) => {
            header_name(issues, &format!("{at}.response_header"), name);
            Some(Usage::Header(name.clone()))
        }
        (None, Some(path)) => json_path(issues, &format!("{at}.response_json"), path).map(Usage::Json),
        _ => {
            issues.add(at, "takes exactly one of response_header and response_json");
            None
        }
    };
    let estimate = validate_known(issues, &format!("{at}.estimate"), &raw.estimate, limit.capacity());
    let largest_estimate = estimate.as_ref().map_or(1, Cost::max);
    if raw.max < largest_estimate || raw.max > MAX_CONFIGURED_AMOUNT {
        issues.add(
            format!("{at}.max"),
            format!(
                "must be between the largest estimate ({largest_estimate}) and {MAX_CONFIGURED_AMOUNT}, got {}",
                raw.max
            ),
        );
    }
    let on_unknown = match raw.on_unknown {
        None | Some(RawOnUnknown::Estimate(_)) => None,
        Some(RawOnUnknown::Cost(cost)) if cost <= raw.max => Some(cost),
        Some(RawOnUnknown::Cost(cost)) => {
            issues.add(format!("{at}.on_unknown"), format!("must be at most max ({}), got {cost}", raw.max));
            None
        }
    };
    if issues.count() > before {
        return None;
    }
    Some(Cost::Response(ResponseCost { usage: usage?, estimate: Box::new(estimate?), max: raw.max, on_unknown }))
}

/// A dotted path of object keys (`usage.total_tokens`).
fn json_path(issues: &mut Issues, at: &str, path: &str) -> Option<Vec<String>> {
    let segments: Vec<String> = path.split('.').map(str::to_owned).collect();
    let well_formed = segments.len() <= MAX_JSON_PATH_SEGMENTS
        && segments.iter().all(|s| !s.is_empty() && s.len() <= MAX_JSON_SEGMENT_BYTES && !s.contains('"'));
    if well_formed {
        Some(segments)
    } else {
        issues.add(
            at,
            format!(
                "expected object keys joined by dots, such as \"usage.total_tokens\" (1 to {MAX_JSON_PATH_SEGMENTS} \
                 keys of 1 to {MAX_JSON_SEGMENT_BYTES} bytes), got {path:?}"
            ),
        );
        None
    }
}
