//! The local stage: a request's local policies are decided together, in one atomic step
//! on this proxy's shared data. When a later stage (the counter service, a lease) may
//! still reject the request, the spend is *reserved*, to be committed on admission or
//! given back (`shared_store::limiter`, "Reservations"); otherwise it is final at once.
//! Concurrency slots are taken out of the reservation: the request holds them until its
//! stream ends.

use super::admit::{due_after, estimates_owed, rejection};
use super::resolve::Resolution;
use super::state::Granted;
use crate::config::FailureOutcome;
use crate::engine::decision::{Decided, Outcome, Tally};
use crate::engine::decision::{HeldSlot, HeldSlots};
use crate::engine::evidence::{count_error, count_evidence};
use crate::engine::headers;
use crate::engine::resolved::{Few, Place, Rare, Resolved};
use crate::engine::setup::Setup;
use crate::engine::slots;
use crate::host::{Counter, Metrics, PluginCounter};
use shared_store::{Clock, Decision, Limit, LimitError, Limiter, Nanos, Request, Reservation, Store};

/// A request its local policies admitted (or let through on a failure that allows),
/// with its global policies left to decide.
#[derive(Debug)]
pub(crate) struct Admitted {
    pub(crate) granted: Granted,
    pub(crate) checked: Rare<Resolved>,
    pub(crate) leased: Rare<Resolved>,
}

/// Decides the local policies of a resolved request: `Err` with the decision when they
/// reject it (or their failure rule denies).
// A decision is 128 bytes, moved once; boxing it would allocate on every rejection.
#[allow(clippy::result_large_err)]
pub(crate) fn decide<S: Store, C: Clock>(
    setup: &Setup,
    resolution: Resolution,
    tally: Tally,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Result<Admitted, Decided> {
    let Resolution { local, checked, leased, shadows, .. } = resolution;
    let mut granted = Granted {
        tally,
        reservation: Reservation::empty(),
        local: Few::new(),
        checked: Rare::new(),
        due: None,
        owed: Vec::new(),
        spent: Rare::new(),
        checked_spent: Vec::new(),
        fallback: None,
        overrides: Vec::new(),
        shadows,
        slots: HeldSlots::default(),
    };
    if !local.is_empty() {
        // A reservation is only worth keeping when a later stage may give it back, or when
        // it holds concurrency slots, given back when the request ends.
        let holds = local.iter().any(|r| limits_concurrency(setup, r));
        let keep = !(checked.is_empty() && leased.is_empty()) || holds;
        match reserve(setup, &local, keep, limiter, metrics) {
            Ok(Some((decisions, mut reservation, due, at))) => {
                if holds {
                    let held = local.iter().filter(|r| limits_concurrency(setup, r)).map(|r| r.policy);
                    let taken: Vec<HeldSlot> =
                        held.zip(reservation.take_slots()).map(|(policy, slot)| HeldSlot { policy, slot }).collect();
                    slots::take(setup, &taken);
                    granted.slots = HeldSlots::new(taken);
                }
                granted.local = decisions;
                granted.reservation = reservation;
                granted.due = due;
                granted.owed = estimates_owed(setup, &local, at);
            }
            Ok(None) => {}
            Err(outcome) => return Err(Decided::new(outcome, granted.tally)),
        }
    }
    Ok(Admitted { granted, checked, leased })
}

/// Whether `r`'s policy limits requests in flight.
fn limits_concurrency(setup: &Setup, r: &Resolved) -> bool {
    setup.compiled(r.policy).is_some_and(|c| matches!(c.policy.limit, Limit::Concurrency { .. }))
}

/// What the local policies decided: `Ok(Some)` admitted (decisions, spend, when due),
/// `Ok(None)` no decision but the failure rule allows, `Err` the rejection.
type Reserved = Result<Option<(Few<(usize, Decision)>, Reservation, Option<Nanos>, Nanos)>, Outcome>;

fn reserve<S: Store, C: Clock>(
    setup: &Setup,
    local: &[Resolved],
    keep: bool,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Reserved {
    let requests: Few<Request<'_>> = local
        .iter()
        .filter_map(|r| match (&r.at, setup.compiled(r.policy)) {
            (Place::Local(place), Some(compiled)) => {
                Some(Request { place, limit: &compiled.policy.limit, cost: r.cost })
            }
            _ => None,
        })
        .collect();
    let decided = if keep {
        limiter.reserve(&requests)
    } else {
        limiter.check(&requests).map(|admission| (admission, Reservation::empty()))
    };
    match decided {
        Ok((admission, reservation)) => {
            for r in local {
                count_evidence(metrics, r.policy, &admission);
            }
            if admission.created > 0 {
                metrics.add_plugin(PluginCounter::KeysCreated, i64::from(admission.created));
            }
            let decisions: Few<(usize, Decision)> =
                local.iter().map(|r| r.policy).zip(admission.decisions.iter().copied()).collect();
            if !admission.admitted {
                for (policy, decision) in &decisions {
                    if !decision.is_admitted() {
                        metrics.add(*policy, Counter::OverLimit, 1);
                    }
                }
                let strictest = headers::strictest_rejection(&decisions);
                return Err(Outcome::Reject(rejection(setup, strictest, setup.response.status, None)));
            }
            let due = due_after(admission.at, admission.delay());
            Ok(Some((decisions, reservation, due, admission.at)))
        }
        Err(error) => match failure(setup, local, &error, metrics) {
            Some(outcome) => Err(outcome),
            None => Ok(None),
        },
    }
}

/// No local decision could be made: any `deny` among the local policies denies
/// (`Some`); otherwise they are allowed and the request goes on (`None`).
fn failure(setup: &Setup, local: &[Resolved], error: &LimitError, metrics: &mut impl Metrics) -> Option<Outcome> {
    let deny = local.iter().find_map(|r| match setup.compiled(r.policy)?.policy.on_failure {
        FailureOutcome::Deny(status) => Some(status),
        FailureOutcome::Allow => None,
    });
    for r in local {
        count_error(metrics, r.policy, error);
        metrics.add(r.policy, if deny.is_some() { Counter::FailureDenied } else { Counter::FailureAllowed }, 1);
    }
    log::debug!("sluice: no decision ({error}); failure outcome {}", if deny.is_some() { "deny" } else { "allow" });
    deny.map(|status| Outcome::Reject(rejection(setup, None, status, None)))
}
