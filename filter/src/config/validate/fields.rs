//! Whether one value is well formed, wherever it appears: a name, a header name or
//! value, an amount, a duration.

use super::issues::Issues;
use crate::config::model::bounds::{MAX_CONFIGURED_AMOUNT, Written};
use crate::config::raw::DurationSpec;
use shared_store::{Algorithm, Nanos};
use sluice_protocol::{MAX_POLICY_BYTES, is_policy_name};
use std::fmt;

/// A policy name or metric prefix: the policy-name rule the counter service applies too
/// ([`is_policy_name`]: 1 to [`MAX_POLICY_BYTES`] characters from `A-Z a-z 0-9 _ . -`).
pub(super) fn is_name(name: &str) -> bool {
    is_policy_name(name)
}

/// What [`is_name`] expects, for a message.
pub(super) fn name_expected() -> String {
    format!("1 to {MAX_POLICY_BYTES} characters from A-Z a-z 0-9 _ . -")
}

/// The algorithms `which` picks, in [`Algorithm::ALL`] order, each written by `each`
/// from its name: `a, b or c`.
pub(super) fn algorithms(which: impl Fn(Algorithm) -> bool, each: impl Fn(&str) -> String) -> String {
    let names: Vec<String> = Algorithm::ALL.iter().filter(|a| which(**a)).map(|a| each(a.name())).collect();
    match names.split_last() {
        Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
        Some((last, _)) => last.clone(),
        None => String::new(),
    }
}

/// Whether `value` is between `min` and `max`; when it is not, an issue names them.
pub(super) fn between<T: PartialOrd + fmt::Display>(issues: &mut Issues, path: &str, value: T, min: T, max: T) -> bool {
    let within = min <= value && value <= max;
    if !within {
        issues.add(path, format!("must be between {min} and {max}, got {value}"));
    }
    within
}

/// The length of `spec` in milliseconds when it is between `min` and `max`; `None`, with
/// an issue that names them as the documentation writes them, when it is not.
pub(super) fn duration_between(
    issues: &mut Issues,
    path: &str,
    spec: DurationSpec,
    min: Written,
    max: Written,
) -> Option<u64> {
    let millis = u64::try_from(spec.millis).ok().filter(|ms| (min.millis()..=max.millis()).contains(ms));
    if millis.is_none() {
        issues.add(path, format!("must be between {min} and {max}, got \"{}{}\"", spec.amount, spec.unit));
    }
    millis
}

/// An HTTP field name as Envoy stores it: a lower-case token.
fn is_header_name(name: &str) -> bool {
    !name.is_empty()
        && name.bytes().all(|b| {
            b.is_ascii_lowercase()
                || b.is_ascii_digit()
                || matches!(b, b'!' | b'#' | b'$' | b'%' | b'&' | b'\'' | b'*' | b'+' | b'-' | b'.' | b'^' | b'_')
                || matches!(b, b'`' | b'|' | b'~')
        })
}

/// A header value Envoy sends as it is: visible ASCII, spaces and tabs.
pub(super) fn is_header_value(value: &str) -> bool {
    value.bytes().all(|b| b == b'\t' || (b' '..=b'~').contains(&b))
}

/// Checks that `name` is a header name ([`is_header_name`]).
pub(super) fn header_name(issues: &mut Issues, path: &str, name: &str) {
    if !is_header_name(name) {
        issues.add(path, format!("expected a lower-case header name, got {name:?}"));
    }
}

/// An amount (rate, burst, limit, queue, cost): from 1 to [`MAX_CONFIGURED_AMOUNT`].
pub(super) fn amount(issues: &mut Issues, path: &str, value: u64) -> Option<u64> {
    if value == 0 {
        issues.add(path, "must be at least 1");
        None
    } else if value > MAX_CONFIGURED_AMOUNT {
        issues.add(path, format!("must be at most {MAX_CONFIGURED_AMOUNT}, got {value}"));
        None
    } else {
        Some(value)
    }
}

/// A window or wait: longer than zero, and short enough for a `u64` of nanoseconds.
pub(super) fn window_nanos(issues: &mut Issues, path: &str, spec: DurationSpec) -> Option<Nanos> {
    if spec.millis == 0 {
        issues.add(path, "must be longer than zero");
        return None;
    }
    match u64::try_from(spec.millis.saturating_mul(1_000_000)) {
        Ok(ns) => Some(Nanos(ns)),
        Err(_) => {
            issues.add(
                path,
                format!(
                    "must be at most 213503d (the longest time a u64 of nanoseconds holds), got \"{}{}\"",
                    spec.amount, spec.unit
                ),
            );
            None
        }
    }
}
