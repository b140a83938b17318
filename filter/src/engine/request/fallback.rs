//! The fallback stage: the failure rule of global policies, applied to each policy the
//! counter service (or the policy's lease record) could not decide: first the policy's
//! local emergency cap, if it has one; then its failure action, `allow` (fail open) or
//! `deny` (fail closed, with its status). Every such decision is counted by policy and
//! by its own cause, logged at most once per interval per cause, and named by the
//! fallback header when one is configured (`cause.rs`).
//!
//! The rule is applied to exactly the policies that could not be decided, each with its
//! cause; the request's other policies are decided as usual before and after (a check
//! that failed leaves the lease policies to spend, a lease whose slot is taken leaves
//! the other leases to spend). All or nothing still holds: a request that a fallback
//! rejects gives back everything it had spent, and the emergency caps of a request are
//! decided together.

use super::admit::{lease_estimate_owed, reject};
use super::state::Granted;
use crate::config::FailureOutcome;
use crate::engine::calls::{Target, tag_bits, units};
use crate::engine::cause::{Cause, Fallback, Note};
use crate::engine::compiled::Home;
use crate::engine::decision::{Decided, LeasePaid, Owed, SpentFrom};
use crate::engine::evidence::{count_error, count_evidence, counted};
use crate::engine::headers;
use crate::engine::resolved::{Few, Place, Resolved};
use crate::engine::setup::Setup;
use crate::host::{Counter, Metrics, PluginCounter};
use shared_store::{Clock, Decision, Limiter, Nanos, Placement, Request, Store};

/// Counts each of `failed` under its cause (a degraded decision at `now`, which the
/// policy's fallback spell notes), also for a request rejected by another of its
/// policies before the failure rule was needed.
pub(crate) fn count_causes(setup: &Setup, failed: &[(Resolved, Cause)], now: Nanos, metrics: &mut impl Metrics) {
    let mut spells = setup.spells.try_borrow_mut();
    for (resolved, cause) in failed {
        metrics.add(resolved.policy, cause.counter(), 1);
        if let Ok(spells) = spells.as_mut() {
            spells.degraded(resolved.policy, now, metrics);
        }
    }
}

/// What the failure rule of one failed policy comes to: its cause's [`Rule`] read
/// against the policy's configuration.
#[derive(Debug, Clone)]
struct Step {
    /// The policy's emergency cap decides first: where its bucket for this caller is.
    cap: Option<Placement>,
    /// What decides without a cap, or when the cap cannot: allow, or deny with a status.
    action: FailureOutcome,
}

/// The step of each of `failed`, in order (`None` for a policy not configured).
fn steps(setup: &Setup, failed: &[(Resolved, Cause)]) -> Few<Option<Step>> {
    failed
        .iter()
        .map(|(r, cause)| {
            let rule = cause.rule();
            let compiled = setup.compiled(r.policy)?;
            let cap = match &r.at {
                Place::Global { cap: Some(place), .. } if rule.emergency_cap => Some(place.clone()),
                _ => None,
            };
            Some(Step { cap, action: rule.action(compiled.policy.on_failure) })
        })
        .collect()
}

/// What the emergency caps of a request decided, together, when none rejected it.
enum Caps {
    /// No failed policy had a cap to ask.
    NotAsked,
    /// Every cap admitted: the request may go on (what they spent is in its reservation).
    Admitted,
    /// The caps could not decide (contention, a store error): their policies' actions
    /// decide instead.
    Failed,
}

/// Applies the failure rule to each of `failed` (a policy and why it could not be
/// decided; see the module docs): the one place every failure class is decided, by the
/// row of its cause ([`Cause::rule`]). `Ok` with the request when it may go on (what the
/// rule admitted is reserved on the caps, and owed by lease policies); `Err` with the
/// rejection otherwise (everything the request spent given back).
// A decision is 128 bytes, moved once; boxing it would allocate on every rejection.
#[allow(clippy::result_large_err)]
pub(crate) fn apply_failure_rule<S: Store, C: Clock>(
    setup: &Setup,
    failed: Few<(Resolved, Cause)>,
    granted: Granted,
    tag: &str,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Result<Granted, Decided> {
    let Some(first) = failed.first().map(|(_, cause)| *cause) else { return Ok(granted) };

    let now = limiter.clock().now();
    count_causes(setup, &failed, now, metrics);
    let steps = steps(setup, &failed);
    // 1. A policy that fails closed without a cap to ask rejects the request.
    let closed = failed.iter().zip(&steps).find_map(|((_, cause), step)| match step {
        Some(Step { cap: None, action: FailureOutcome::Deny(status) }) => Some((*status, *cause)),
        _ => None,
    });
    if let Some((status, cause)) = closed {
        return Err(fail_closed(setup, cause, status, &failed, &steps, granted, limiter, metrics));
    }
    // 2. The emergency caps decide together.
    let (mut granted, caps) = decide_caps(setup, &failed, &steps, first, granted, limiter, metrics)?;
    let (fallback, cap_failed) = match caps {
        Caps::NotAsked => (Fallback::FailOpen, false),
        Caps::Admitted => (Fallback::Emergency, false),
        Caps::Failed => (Fallback::FailOpen, true),
    };
    // 3. What is left follows its action; a cap that could not decide too.
    let mut deny = None;
    for ((r, cause), step) in failed.iter().zip(&steps) {
        let Some(step) = step else { continue };
        if step.cap.is_some() && !cap_failed {
            continue;
        }
        match step.action {
            FailureOutcome::Deny(status) => deny = deny.or(Some((status, *cause))),
            FailureOutcome::Allow => metrics.add(r.policy, Counter::FailureAllowed, 1),
        }
    }
    if let Some((status, cause)) = deny {
        return Err(fail_closed(setup, cause, status, &failed, &steps, granted, limiter, metrics));
    }
    log_degraded(setup, first, fallback, now);
    // Admitted without the service: lease policies owe what they admitted.
    for (r, _) in &failed {
        let owed = owe(setup, r, tag, now, limiter, metrics);
        granted.owed.extend(lease_estimate_owed(setup, r, tag, now, LeasePaid::Owed(owed)));
    }
    granted.fallback = Some(Note::merge(granted.fallback, fallback, first, &failed));
    Ok(granted)
}

/// Asks the emergency caps of the failed policies whose step starts with one, all or
/// nothing; an admission joins the request's reservation (committed or given back with
/// it) and owes what a cost the response reports will settle on the cap. `Err` with the
/// rejection when a cap rejects (everything the request spent given back).
// As `apply_failure_rule`: the decision is moved once.
#[allow(clippy::result_large_err)]
fn decide_caps<S: Store, C: Clock>(
    setup: &Setup,
    failed: &[(Resolved, Cause)],
    steps: &[Option<Step>],
    first: Cause,
    mut granted: Granted,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Result<(Granted, Caps), Decided> {
    let capped: Few<(usize, &Placement, u64)> = failed
        .iter()
        .zip(steps)
        .filter_map(|((r, _), step)| Some((r.policy, step.as_ref()?.cap.as_ref()?, r.cost)))
        .collect();
    if capped.is_empty() {
        return Ok((granted, Caps::NotAsked));
    }
    let requests: Few<Request<'_>> = capped
        .iter()
        .filter_map(|(policy, place, cost)| {
            let Home::Global { cap: Some(cap), .. } = &setup.compiled(*policy)?.home else { return None };
            Some(Request { place, limit: &cap.limit, cost: *cost })
        })
        .collect();
    let (admission, reservation) = match limiter.reserve(&requests) {
        Ok(decided) => decided,
        Err(error) => {
            for (policy, _, _) in &capped {
                count_error(metrics, *policy, &error);
            }
            return Ok((granted, Caps::Failed));
        }
    };
    let decisions: Few<(usize, Decision)> =
        capped.iter().map(|(p, _, _)| *p).zip(admission.decisions.iter().copied()).collect();
    for (policy, _) in &decisions {
        count_evidence(metrics, *policy, &admission);
    }
    if admission.created > 0 {
        metrics.add_plugin(PluginCounter::KeysCreated, i64::from(admission.created));
    }
    if !admission.admitted {
        for (policy, decision) in &decisions {
            let counter = if decision.is_admitted() { Counter::EmergencyAllowed } else { Counter::EmergencyRejected };
            metrics.add(*policy, counter, 1);
        }
        log_degraded(setup, first, Fallback::Emergency, limiter.clock().now());
        granted.fallback = Some(Note::merge(granted.fallback, Fallback::Emergency, first, failed));
        let strictest = headers::strictest_rejection(&decisions);
        return Err(reject(setup, granted, strictest, setup.response.status, limiter, metrics));
    }
    for (policy, _) in &decisions {
        metrics.add(*policy, Counter::EmergencyAllowed, 1);
    }
    // Kept with the request's local reservation: committed or given back with it, so a
    // later stage's rejection gives the cap's spend back.
    granted.reservation = granted.reservation.join(reservation);
    // A cost the response reports is settled on the cap too.
    for (policy, place, cost) in &capped {
        if setup.compiled(*policy).is_some_and(|c| c.policy.cost.settled().is_some()) {
            let from = SpentFrom::Cap((*place).clone());
            granted.owed.push(Owed { policy: *policy, from, estimate: *cost, spent_at: admission.at });
        }
    }
    Ok((granted, Caps::Admitted))
}

// The rejection, what it says and what it counts, as the caller had them.
#[allow(clippy::too_many_arguments)]
fn fail_closed<S: Store, C: Clock>(
    setup: &Setup,
    cause: Cause,
    status: u16,
    failed: &[(Resolved, Cause)],
    steps: &[Option<Step>],
    mut granted: Granted,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Decided {
    for ((r, _), step) in failed.iter().zip(steps) {
        if let Some(Step { action: FailureOutcome::Deny(_), .. }) = step {
            metrics.add(r.policy, Counter::FailureDenied, 1);
        }
    }
    log_degraded(setup, cause, Fallback::FailClosed, limiter.clock().now());
    granted.fallback = Some(Note::merge(granted.fallback, Fallback::FailClosed, cause, failed));
    reject(setup, granted, None, status, limiter, metrics)
}

fn log_degraded(setup: &Setup, cause: Cause, fallback: Fallback, now: Nanos) {
    let Ok(mut limiter) = setup.degraded.try_borrow_mut() else { return };
    if let Some(suppressed) = limiter.admit(cause, now) {
        log::warn!(
            "sluice: a global policy could not be decided ({}); fallback {} decided \
             ({suppressed} more since the last line about this cause)",
            cause.name(),
            fallback.name()
        );
    }
}

/// Records what a fallback admitted for a lease policy, to be charged later (this
/// worker schedules the charge). Returns the units the record owes for it (what did not
/// fit under `max_debt` is forgiven at once).
fn owe<S: Store, C: Clock>(
    setup: &Setup,
    resolved: &Resolved,
    tag: &str,
    now: Nanos,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> u64 {
    let (policy, cost) = (resolved.policy, resolved.cost);
    let Some(leased) = setup.leased_home(policy) else { return 0 };
    let Place::Global { key, lease: Some(slot), .. } = &resolved.at else {
        // A lease policy its lease could not serve, decided by a check (`lease.rs`):
        // what the failure rule admits when that check is not answered is not owed, as
        // for a check-mode policy (a check that timed out may have been counted).
        metrics.add(policy, Counter::LeaseForgiven, units(cost));
        return 0;
    };
    let Some(bits) = tag_bits(tag) else {
        // The request's partition could not be read: its counter cannot be named, and a
        // charge under another tag would go to a counter nobody spends from.
        metrics.add(policy, Counter::LeaseForgiven, units(cost));
        return 0;
    };
    let whose = (*key, bits);
    let owed = setup.leases(limiter.store()).owe(slot, cost, leased.config.max_debt, whose, now);
    match counted(policy, owed, metrics) {
        Ok(Some((forgiven, owes))) => {
            if forgiven > 0 {
                metrics.add(policy, Counter::LeaseForgiven, units(forgiven));
            }
            if owes {
                setup.schedule_charge(Target { policy, slot: slot.clone(), key: *key, tag: tag.to_owned() });
            }
            cost - forgiven
        }
        // The slot is another key's, or the record could not be written: nothing is
        // owed anywhere, so what the fallback admitted is forgiven.
        Ok(None) | Err(_) => {
            metrics.add(policy, Counter::LeaseForgiven, units(cost));
            0
        }
    }
}
