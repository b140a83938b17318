//! Whether one policy is valid: each of its parts in turn, then what holds between them
//! (a lease grant covers the costliest request); every issue found is reported.

use super::cost::validate_cost;
use super::fields::{between, is_name, name_expected};
use super::global::{validate_emergency, validate_global};
use super::issues::Issues;
use super::key::validate_key;
use super::limit::validate_limit;
use super::matcher::validate_match;
use crate::config::model::bounds::{MAX_STATUS, MAX_UNIT_BYTES, MIN_STATUS};
use crate::config::model::global::{Global, Strategy};
use crate::config::model::policy::{DEFAULT_FAILURE_STATUS, DEFAULT_SLOTS, FailureOutcome, MAX_SLOTS, Policy};
use crate::config::model::request::MissingKey;
use crate::config::raw::{RawFailure, RawFailureAction, RawMissingKey, RawPolicy};
use shared_store::Algorithm;
use std::num::NonZeroU32;

/// What a concurrency policy refuses beside `global` (which [`validate_global`] refuses
/// for every algorithm the service cannot decide): it counts this proxy's requests in
/// flight, one slot each, given back when they end, so nothing about it is costed or
/// shadowed.
fn in_flight_only(issues: &mut Issues, path: &str, raw: &RawPolicy) {
    if raw.cost.is_some() {
        issues.add(format!("{path}.cost"), "is not used by algorithm \"concurrency\": each request holds one slot");
    }
    if raw.unit.is_some() {
        issues.add(format!("{path}.unit"), "is not used by algorithm \"concurrency\": it counts requests");
    }
    if raw.shadow {
        issues.add(
            format!("{path}.shadow"),
            "is not supported by algorithm \"concurrency\": a shadow policy would hold slots it never enforces",
        );
    }
}

/// What a policy's failure rule does when it cannot decide: its `on_failure`, or deny
/// with the default status.
fn failure_outcome(issues: &mut Issues, path: &str, raw: Option<&RawFailure>) -> FailureOutcome {
    let Some(failure) = raw else { return FailureOutcome::Deny(DEFAULT_FAILURE_STATUS) };
    match (failure.action, failure.status) {
        (RawFailureAction::Allow, None) => FailureOutcome::Allow,
        (RawFailureAction::Allow, Some(_)) => {
            issues.add(format!("{path}.on_failure.status"), "only applies to action \"deny\"");
            FailureOutcome::Allow
        }
        (RawFailureAction::Deny, status) => {
            let status = status.unwrap_or(DEFAULT_FAILURE_STATUS);
            between(issues, &format!("{path}.on_failure.status"), status, MIN_STATUS, MAX_STATUS);
            FailureOutcome::Deny(status)
        }
    }
}

/// Whether `unit` names a quota unit (`tokens`); when it does not, says so.
fn is_unit(issues: &mut Issues, path: &str, unit: &str) -> bool {
    let valid = (1..=MAX_UNIT_BYTES).contains(&unit.len())
        && unit.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
    if !valid {
        issues.add(
            format!("{path}.unit"),
            format!("must be 1 to {MAX_UNIT_BYTES} characters from a-z 0-9 _ - (such as \"tokens\"), got {unit:?}"),
        );
    }
    valid
}

/// The validated policy at `path` (`policies[i]`), or `None` if it has any issue.
pub(super) fn validate_policy(issues: &mut Issues, path: &str, raw: RawPolicy) -> Option<Policy> {
    let before = issues.count();
    if !is_name(&raw.name) {
        issues.add(format!("{path}.name"), format!("expected {}, got {:?}", name_expected(), raw.name));
    }
    let limit = validate_limit(issues, path, &raw);
    let global = raw.global.as_ref().and_then(|global| validate_global(issues, path, &raw, global, limit.as_ref()));
    match raw.algorithm.0 {
        Algorithm::Concurrency => in_flight_only(issues, path, &raw),
        Algorithm::TokenBucket
        | Algorithm::LeakyBucket
        | Algorithm::FixedWindow
        | Algorithm::SlidingWindow
        | Algorithm::SlidingLog => {}
    }
    let emergency = match raw.on_failure.as_ref().and_then(|f| f.emergency.as_ref()) {
        Some(_) if raw.global.is_none() => {
            issues.add(
                format!("{path}.on_failure.emergency"),
                "only global policies have an emergency cap (a local policy decides in the proxy already)",
            );
            None
        }
        Some(emergency) => validate_emergency(issues, &format!("{path}.on_failure.emergency"), emergency),
        None => None,
    };
    let key = validate_key(issues, &format!("{path}.key"), raw.key, false);
    let matcher = validate_match(issues, &format!("{path}.match"), raw.matcher.unwrap_or_default());
    let cost = limit.and_then(|limit| validate_cost(issues, path, raw.cost.as_ref(), &limit));
    if let (Some(Global { strategy: Strategy::Lease(lease), .. }), Some(cost)) = (&global, &cost)
        && cost.max() > lease.size
    {
        issues.add(
            format!("{path}.global.lease.size"),
            format!(
                "must be at least the most one request can cost ({}), got {}: a request costlier than one grant \
                 could never be admitted",
                cost.max(),
                lease.size
            ),
        );
    }
    let slots = raw.slots.unwrap_or(DEFAULT_SLOTS);
    let slots =
        between(issues, &format!("{path}.slots"), slots, 1, MAX_SLOTS).then(|| NonZeroU32::new(slots)).flatten();
    let on_failure = failure_outcome(issues, path, raw.on_failure.as_ref());
    let on_missing_key = match raw.on_missing_key {
        RawMissingKey::Shared => MissingKey::Shared,
        RawMissingKey::Skip => MissingKey::Skip,
        RawMissingKey::Reject => MissingKey::Reject,
    };
    let unit = raw.unit.filter(|unit| is_unit(issues, path, unit));
    if issues.count() > before {
        return None;
    }
    Some(Policy {
        name: raw.name,
        key,
        matcher,
        limit: limit?,
        cost: cost?,
        unit,
        on_missing_key,
        shadow: raw.shadow,
        version: raw.version,
        slots: slots?,
        on_failure,
        global,
        emergency,
    })
}
