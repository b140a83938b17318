//! After the response: what a request spent on an estimate is settled to the cost its
//! response reports (7th stage, reached only by forwarded requests of policies whose
//! cost the response reports).
//!
//! The actual cost is clamped to the policy's `max`. Above the estimate, the difference
//! is charged, and may take the bucket below empty, into debt, by at most
//! [`debt_bound`]: the caller's next requests are rejected until the debt is paid, with
//! a `Retry-After` that says when (a fixed window's debt ends with its window). Below it, the difference is given back. A charge
//! beyond the debt bound, or a credit the algorithm cannot give, is forgiven and counted
//! (`cost.forgiven`). When the response never reports the cost, the estimate stands, or
//! the configured `on_unknown` cost replaces it; `cost.unknown` counts it either way.

use crate::config::{MAX_CONFIGURED_AMOUNT, ResponseCost};
use crate::engine::decision::Owed;
use crate::engine::evidence::count_error;
use crate::engine::setup::Setup;
use crate::host::{Counter, Metrics};
use shared_store::{Clock, Limiter, Store};

/// How many requests' `max` a caller's bucket may owe at once. A bucket below empty
/// admits nothing, so its debt comes only from requests already in flight when it went
/// below: with fewer than this many in flight per caller, nothing is ever forgiven.
pub const MAX_OWING_REQUESTS: u64 = 64;

/// The most a bucket can owe after settling: [`MAX_OWING_REQUESTS`] requests' `max`
/// (within the configurable amounts). Anything charged beyond it is forgiven.
pub(crate) fn debt_bound(rule: &ResponseCost) -> u64 {
    rule.max.saturating_mul(MAX_OWING_REQUESTS).min(MAX_CONFIGURED_AMOUNT)
}

/// Settles one estimate to the cost the response reported (`None`: it reported none).
pub(crate) fn settle<S: Store, C: Clock>(
    setup: &Setup,
    owed: &Owed,
    reported: Option<u64>,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) {
    let Some(compiled) = setup.compiled(owed.policy) else { return };
    let Some(rule) = compiled.policy.cost.settled() else { return };
    let policy = owed.policy;
    let actual = match reported {
        Some(units) => units.min(rule.max),
        None => {
            metrics.add(policy, Counter::CostUnknown, 1);
            match rule.on_unknown {
                Some(units) => units,
                None => return,
            }
        }
    };
    let limit = &compiled.policy.limit;
    match limiter.settle(&owed.place, limit, owed.spent_at, owed.estimate, actual, debt_bound(rule)) {
        Ok(settlement) => {
            for (counter, units) in [
                (Counter::CostCharged, settlement.charged),
                (Counter::CostCredited, settlement.credited),
                (Counter::CostForgiven, settlement.forgiven),
                (Counter::CasConflicts, u64::from(settlement.conflicts)),
                (Counter::Repaired, u64::from(settlement.repaired)),
            ] {
                if units > 0 {
                    metrics.add(policy, counter, i64::try_from(units).unwrap_or(i64::MAX));
                }
            }
        }
        Err(error) => {
            // Nothing was settled: the difference is forgiven, and the error counted.
            count_error(metrics, policy, &error);
            let units = actual.abs_diff(owed.estimate);
            metrics.add(policy, Counter::CostForgiven, i64::try_from(units).unwrap_or(i64::MAX));
        }
    }
}
