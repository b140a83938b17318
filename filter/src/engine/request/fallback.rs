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
use crate::engine::decision::{Decided, Owed, SpentFrom};
use crate::engine::evidence::{count_error, count_evidence, counted};
use crate::engine::headers;
use crate::engine::resolved::{Few, Place, Resolved};
use crate::engine::setup::Setup;
use crate::host::{Counter, Metrics, PluginCounter};
use shared_store::{Clock, Decision, Limiter, Nanos, Placement, Request, Store};

/// Counts each of `failed` under its cause, for a request rejected by another of its
/// policies before the failure rule was needed.
pub(crate) fn count_causes(failed: &[(Resolved, Cause)], metrics: &mut impl Metrics) {
    for (resolved, cause) in failed {
        metrics.add(resolved.policy, cause.counter(), 1);
    }
}

/// Applies the failure rule to each of `failed` (a policy and why it could not be
/// decided; see the module docs). `Ok` with the request when it may go on (what the
/// rule admitted is reserved on the caps, and owed by lease policies); `Err` with
/// the rejection otherwise (everything the request spent given back).
// A decision is 128 bytes, moved once; boxing it would allocate on every rejection.
#[allow(clippy::result_large_err)]
pub(crate) fn apply_failure_rule<S: Store, C: Clock>(
    setup: &Setup,
    failed: Few<(Resolved, Cause)>,
    mut granted: Granted,
    tag: &str,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Result<Granted, Decided> {
    let Some(first) = failed.first().map(|(_, cause)| *cause) else { return Ok(granted) };

    let now = limiter.clock().now();
    count_causes(&failed, metrics);
    // 1. A policy without a cap that fails closed rejects the request.
    let closed = failed.iter().find_map(|(r, cause)| {
        let compiled = setup.compiled(r.policy)?;
        match (&compiled.home, compiled.policy.on_failure) {
            (Home::Global { cap: None, .. }, FailureOutcome::Deny(status)) => Some((status, *cause)),
            _ => None,
        }
    });
    if let Some((status, cause)) = closed {
        return Err(fail_closed(setup, cause, status, &failed, granted, limiter, metrics));
    }
    // 2. The emergency caps decide together.
    let capped: Few<(usize, Placement, u64)> = failed
        .iter()
        .filter_map(|(r, _)| match &r.at {
            Place::Global { cap: Some(place), .. } => Some((r.policy, place.clone(), r.cost)),
            _ => None,
        })
        .collect();
    let mut fallback = Fallback::FailOpen;
    let mut cap_failed = false;
    if !capped.is_empty() {
        let requests: Few<Request<'_>> = capped
            .iter()
            .filter_map(|(policy, place, cost)| {
                let Home::Global { cap: Some(cap), .. } = &setup.compiled(*policy)?.home else { return None };
                Some(Request { place, limit: &cap.limit, cost: *cost })
            })
            .collect();
        match limiter.reserve(&requests) {
            Ok((admission, reservation)) => {
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
                        let counter =
                            if decision.is_admitted() { Counter::EmergencyAllowed } else { Counter::EmergencyRejected };
                        metrics.add(*policy, counter, 1);
                    }
                    log_degraded(setup, first, Fallback::Emergency, now);
                    granted.fallback = Some(Note::merge(granted.fallback, Fallback::Emergency, first, &failed));
                    let strictest = headers::strictest_rejection(&decisions);
                    let status = setup.response.status;
                    let rejected = reject(setup, granted, strictest, status, limiter, metrics);
                    return Err(rejected);
                }
                for (policy, _) in &decisions {
                    metrics.add(*policy, Counter::EmergencyAllowed, 1);
                }
                // Kept with the request's local reservation: committed or given back
                // with it, so a later stage's rejection gives the cap's spend back.
                granted.reservation = granted.reservation.join(reservation);
                // A cost the response reports is settled on the cap too.
                for (policy, place, cost) in &capped {
                    if setup.compiled(*policy).is_some_and(|c| c.policy.cost.settled().is_some()) {
                        let from = SpentFrom::Cap(place.clone());
                        granted.owed.push(Owed { policy: *policy, from, estimate: *cost, spent_at: admission.at });
                    }
                }
                fallback = Fallback::Emergency;
            }
            Err(error) => {
                for (policy, _, _) in &capped {
                    count_error(metrics, *policy, &error);
                }
                cap_failed = true;
            }
        }
    }
    // 3. What is left follows its failure action; a cap that could not decide too.
    let mut deny = None;
    for (r, cause) in &failed {
        let Some(compiled) = setup.compiled(r.policy) else { continue };
        let has_cap = matches!(&compiled.home, Home::Global { cap: Some(_), .. });
        if has_cap && !cap_failed {
            continue;
        }
        match compiled.policy.on_failure {
            FailureOutcome::Deny(status) => deny = deny.or(Some((status, *cause))),
            FailureOutcome::Allow => metrics.add(r.policy, Counter::FailureAllowed, 1),
        }
    }
    if let Some((status, cause)) = deny {
        return Err(fail_closed(setup, cause, status, &failed, granted, limiter, metrics));
    }
    log_degraded(setup, first, fallback, now);
    // Admitted without the service: lease policies owe what they admitted.
    for (r, _) in &failed {
        owe(setup, r, tag, now, limiter, metrics);
        granted.owed.extend(lease_estimate_owed(setup, r, tag, now));
    }
    granted.fallback = Some(Note::merge(granted.fallback, fallback, first, &failed));
    Ok(granted)
}

fn fail_closed<S: Store, C: Clock>(
    setup: &Setup,
    cause: Cause,
    status: u16,
    failed: &[(Resolved, Cause)],
    mut granted: Granted,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Decided {
    for (r, _) in failed {
        if let Some(compiled) = setup.compiled(r.policy)
            && matches!(compiled.policy.on_failure, FailureOutcome::Deny(_))
        {
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
/// worker schedules the charge).
fn owe<S: Store, C: Clock>(
    setup: &Setup,
    resolved: &Resolved,
    tag: &str,
    now: Nanos,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) {
    let (policy, cost) = (resolved.policy, resolved.cost);
    let (Some(leased), Place::Global { key, lease: Some(slot), .. }) = (setup.leased_home(policy), &resolved.at) else {
        return;
    };
    let Some(bits) = tag_bits(tag) else {
        // The request's partition could not be read: its counter cannot be named, and a
        // charge under another tag would go to a counter nobody spends from.
        metrics.add(policy, Counter::LeaseForgiven, units(cost));
        return;
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
        }
        // The slot is another key's, or the record could not be written: nothing is
        // owed anywhere, so what the fallback admitted is forgiven.
        Ok(None) | Err(_) => metrics.add(policy, Counter::LeaseForgiven, units(cost)),
    }
}
