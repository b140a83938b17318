//! Whether a policy's algorithm and its numbers make a limit: the fields each algorithm
//! needs and uses, their bounds, and times that must fit the clock.

use super::fields::{amount, window_nanos};
use super::issues::Issues;
use crate::config::model::policy::MAX_WAIT_MS;
use crate::config::raw::{RawAlgorithm, RawOverflow, RawPolicy};
use shared_store::{Limit, MAX_CONCURRENCY, MAX_LOG_ENTRIES, Nanos, Rate};

/// The limit a policy's fields describe, if they make one.
pub(super) fn validate_limit(issues: &mut Issues, path: &str, raw: &RawPolicy) -> Option<Limit> {
    let algorithm = raw.algorithm;
    let name = match algorithm {
        RawAlgorithm::TokenBucket => "token_bucket",
        RawAlgorithm::FixedWindow => "fixed_window",
        RawAlgorithm::SlidingWindow => "sliding_window",
        RawAlgorithm::SlidingLog => "sliding_log",
        RawAlgorithm::LeakyBucket => "leaky_bucket",
        RawAlgorithm::Concurrency => "concurrency",
    };
    let concurrency = algorithm == RawAlgorithm::Concurrency;
    let windowed =
        matches!(algorithm, RawAlgorithm::FixedWindow | RawAlgorithm::SlidingWindow | RawAlgorithm::SlidingLog);
    let fields: [(&str, bool, bool); 7] = [
        ("rate", raw.rate.is_some(), !windowed && !concurrency),
        ("burst", raw.burst.is_some(), algorithm == RawAlgorithm::TokenBucket),
        ("limit", raw.limit.is_some(), windowed || concurrency),
        ("window", raw.window.is_some(), windowed),
        ("queue", raw.queue.is_some(), algorithm == RawAlgorithm::LeakyBucket),
        ("max_wait", raw.max_wait.is_some(), algorithm == RawAlgorithm::LeakyBucket),
        ("overflow", raw.overflow.is_some(), algorithm == RawAlgorithm::LeakyBucket),
    ];
    let mut ok = true;
    for (field, present, allowed) in fields {
        if present && !allowed {
            issues.add(format!("{path}.{field}"), format!("is not used by algorithm \"{name}\""));
            ok = false;
        }
    }
    let required = |issues: &mut Issues, field: &str, present: bool| {
        if !present {
            issues.add(format!("{path}.{field}"), format!("is required by algorithm \"{name}\""));
        }
        present
    };
    let rate = if windowed || concurrency {
        None
    } else if required(issues, "rate", raw.rate.is_some()) {
        raw.rate.and_then(|spec| {
            let amount = amount(issues, &format!("{path}.rate"), spec.amount)?;
            Rate::new(amount, Nanos::from_secs(spec.per_secs))
        })
    } else {
        None
    };
    let limit = match algorithm {
        RawAlgorithm::Concurrency => {
            if !required(issues, "limit", raw.limit.is_some()) {
                return None;
            }
            let limit = raw.limit.and_then(|l| amount(issues, &format!("{path}.limit"), l))?;
            if limit > MAX_CONCURRENCY {
                issues.add(
                    format!("{path}.limit"),
                    format!("must be at most {MAX_CONCURRENCY} for algorithm \"concurrency\", got {limit}"),
                );
                return None;
            }
            Limit::concurrency(limit).ok()
        }
        RawAlgorithm::TokenBucket => {
            let rate = rate?;
            let burst = match raw.burst {
                Some(burst) => amount(issues, &format!("{path}.burst"), burst)?,
                // The `<n>` as written: `Rate` keeps its fraction in lowest terms.
                None => raw.rate.map_or(1, |spec| spec.amount),
            };
            // The time to refill from empty must fit the clock: it becomes reset values.
            let refill = u128::from(burst) * u128::from(rate.per().0) / u128::from(rate.amount());
            if refill > u128::from(u64::MAX) {
                issues.add(format!("{path}.burst"), "takes longer than 584 years to refill at this rate");
                return None;
            }
            Limit::token_bucket(rate, burst).ok()
        }
        RawAlgorithm::FixedWindow | RawAlgorithm::SlidingWindow | RawAlgorithm::SlidingLog => {
            let limit = if required(issues, "limit", raw.limit.is_some()) {
                raw.limit.and_then(|l| amount(issues, &format!("{path}.limit"), l))
            } else {
                None
            };
            let window = if required(issues, "window", raw.window.is_some()) {
                raw.window.and_then(|w| window_nanos(issues, &format!("{path}.window"), w))
            } else {
                None
            };
            let (limit, window) = (limit?, window?);
            match algorithm {
                RawAlgorithm::FixedWindow => Limit::fixed_window(limit, window).ok(),
                RawAlgorithm::SlidingWindow => Limit::sliding_window(limit, window).ok(),
                _ => {
                    if limit > MAX_LOG_ENTRIES {
                        issues.add(format!("{path}.limit"), format!("must be at most {MAX_LOG_ENTRIES} for algorithm \"sliding_log\" (its state keeps one entry per request), got {limit}"));
                        return None;
                    }
                    Limit::sliding_log(limit, window).ok()
                }
            }
        }
        RawAlgorithm::LeakyBucket => {
            let queue_mode = raw.overflow.unwrap_or(RawOverflow::Queue) == RawOverflow::Queue;
            let queue = if required(issues, "queue", raw.queue.is_some()) {
                raw.queue.and_then(|q| amount(issues, &format!("{path}.queue"), q))
            } else {
                None
            };
            let max_wait = if queue_mode {
                if required(issues, "max_wait", raw.max_wait.is_some()) {
                    raw.max_wait.and_then(|w| {
                        if w.millis > MAX_WAIT_MS {
                            issues.add(
                                format!("{path}.max_wait"),
                                format!("must be at most 5m, got \"{}{}\"", w.amount, w.unit),
                            );
                            None
                        } else {
                            window_nanos(issues, &format!("{path}.max_wait"), w)
                        }
                    })
                } else {
                    None
                }
            } else {
                if raw.max_wait.is_some() {
                    issues.add(format!("{path}.max_wait"), "is not used with overflow \"reject\" (nothing waits)");
                }
                // Nothing waits: a request is admitted only when it would leave now.
                Some(Nanos::ZERO)
            };
            let (rate, queue, max_wait) = (rate?, queue?, max_wait?);
            let drain = u128::from(queue) * u128::from(rate.per().0) / u128::from(rate.amount());
            if drain > u128::from(u64::MAX) {
                issues.add(format!("{path}.queue"), "takes longer than 584 years to drain at this rate");
                return None;
            }
            Limit::leaky_bucket(rate, queue, max_wait).ok()
        }
    };
    if ok { limit } else { None }
}
