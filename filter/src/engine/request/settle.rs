//! After the response: what a request spent on an estimate is settled to the cost its
//! response reports (7th stage, reached only by forwarded requests of policies whose
//! cost the response reports).
//!
//! The actual cost is clamped to the policy's `max`. Above the estimate, the difference
//! is charged, and may take the bucket below empty, into debt, by at most
//! [`debt_bound`](crate::engine::compiled::debt_bound): the caller's next requests are rejected until the debt is paid, with
//! a `Retry-After` that says when (a fixed window's debt ends with its window). Below it, the difference is given back. A charge
//! beyond the debt bound, or a credit the algorithm cannot give, is forgiven and counted
//! (`cost.forgiven`). When the response never reports the cost, the estimate stands, or
//! the configured `on_unknown` cost replaces it; `cost.unknown` counts it either way.

use crate::config::ResponseCost;
use crate::engine::calls::{Target, tag_bits};
use crate::engine::compiled::{Home, debt_bound};
use crate::engine::decision::{LeasePaid, Owed, SpentFrom};
use crate::engine::evidence::{count_error, counted};
use crate::engine::setup::Setup;
use crate::host::{Counter, Metrics, Scope};
use shared_store::{Clock, Limit, Limiter, Placement, Store};

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
    // A lease policy's cap settles beside its lease record, which is what the `cost.*`
    // counters count; a check-mode policy's cap is its only settlement.
    let second = matches!(owed.from, SpentFrom::Cap(_)) && setup.leased_home(policy).is_some();
    let actual = match reported {
        Some(units) => units.min(rule.max),
        None => {
            // Once per response.
            if !second {
                metrics.add(policy, Counter::CostUnknown, 1);
            }
            match rule.on_unknown {
                Some(units) => units,
                None => return,
            }
        }
    };
    match &owed.from {
        SpentFrom::Local(place) => settle_local(&compiled.policy.limit, rule, place, owed, actual, limiter, metrics),
        SpentFrom::Cap(place) => {
            if let Home::Global { cap: Some(cap), .. } = &compiled.home {
                if second {
                    // Counted nowhere but in its errors: the lease's settlement counts.
                    let mut quiet = Quiet(metrics);
                    settle_local(&cap.limit, rule, place, owed, actual, limiter, &mut quiet);
                } else {
                    settle_local(&cap.limit, rule, place, owed, actual, limiter, metrics);
                }
            }
        }
        SpentFrom::Check { key, tag, at_ns } => {
            let now = limiter.clock().now();
            crate::engine::settlement::hold(setup, owed, (*key, tag, *at_ns), actual, now, metrics);
        }
        SpentFrom::Lease { slot, key, tag, paid } => {
            let Some(leased) = setup.leased_home(policy) else { return };
            let leases = setup.leases(limiter.store());
            let now = limiter.clock().now();
            // `None` when the request's partition could not be read: its estimate was
            // owed nowhere (forgiven when the failure rule admitted it), and so is any
            // excess beyond what the lease's live tokens hold.
            let whose = tag_bits(tag).map(|bits| (*key, bits));
            let forgiven = if actual > owed.estimate {
                let excess = actual - owed.estimate;
                match counted(policy, leases.overspend(slot, excess, leased.config.max_debt, whose, now), metrics) {
                    Ok(Some((forgiven, owes))) => {
                        // Debt of this key owed under its known tag is charged by that
                        // request's schedule, or the sweep: never under an unread tag.
                        if owes && whose.is_some() {
                            setup.schedule_charge(Target { policy, slot: slot.clone(), key: *key, tag: tag.clone() });
                        }
                        add(metrics, policy, Counter::CostCharged, excess - forgiven);
                        forgiven
                    }
                    // The slot is another key's, or the record could not be written.
                    Ok(None) | Err(_) => excess,
                }
            } else if whose.is_none() {
                // Nothing was spent or owed for the estimate: nothing to give back.
                0
            } else {
                // What the failure rule admitted was owed, not spent from a pool: what
                // the response left of it comes off the debt, as far as it was owed (the
                // rest was forgiven at once: owed nowhere, so given back nowhere).
                let unused = owed.estimate - actual;
                let (givable, given) = match paid {
                    LeasePaid::Tokens { until } => (unused, leases.unspend(slot, unused, *until, now)),
                    LeasePaid::Owed(debt) => (unused.min(*debt), leases.forgo(slot, unused.min(*debt), now)),
                };
                let credited = match counted(policy, given, metrics) {
                    Ok(Some(kept)) => givable - kept,
                    Ok(None) | Err(_) => 0,
                };
                add(metrics, policy, Counter::CostCredited, credited);
                unused - credited
            };
            add(metrics, policy, Counter::CostForgiven, forgiven);
        }
    }
}

fn add(metrics: &mut impl Metrics, policy: usize, counter: Counter, units: u64) {
    if units > 0 {
        metrics.add(policy, counter, i64::try_from(units).unwrap_or(i64::MAX));
    }
}

/// Settles an estimate a local policy spent, through the limiter: the bucket may go into
/// debt up to [`debt_bound`](crate::engine::compiled::debt_bound).
fn settle_local<S: Store, C: Clock>(
    limit: &Limit,
    rule: &ResponseCost,
    place: &Placement,
    owed: &Owed,
    actual: u64,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) {
    let policy = owed.policy;
    match limiter.settle(place, limit, owed.spent_at, owed.estimate, actual, debt_bound(rule)) {
        Ok(settlement) => {
            for (counter, units) in [
                (Counter::CostCharged, settlement.charged),
                (Counter::CostCredited, settlement.credited),
                (Counter::CostForgiven, settlement.forgiven),
                (Counter::CasConflicts, u64::from(settlement.conflicts)),
                (Counter::Repaired, u64::from(settlement.repaired)),
            ] {
                add(metrics, policy, counter, units);
            }
        }
        Err(error) => {
            // Nothing was settled: the difference is forgiven, and the error counted.
            count_error(metrics, policy, &error);
            add(metrics, policy, Counter::CostForgiven, actual.abs_diff(owed.estimate));
        }
    }
}

/// Metrics that keep only the counters of failures (CAS conflicts, store errors): the
/// units a cap's settlement moves are not the policy's.
struct Quiet<'a, M>(&'a mut M);

impl<M: Metrics> Metrics for Quiet<'_, M> {
    fn add(&mut self, policy: usize, counter: Counter, delta: i64) {
        if counter.scope() != Scope::ResponseCost {
            self.0.add(policy, counter, delta);
        }
    }

    fn add_plugin(&mut self, counter: crate::host::PluginCounter, delta: i64) {
        self.0.add_plugin(counter, delta);
    }

    fn record_wait(&mut self, wait: crate::host::Wait, ms: u64) {
        self.0.record_wait(wait, ms);
    }
}
