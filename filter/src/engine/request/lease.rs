//! The lease stage: a request's lease-mode policies are spent from this proxy's leases
//! (the records of `lease_record/`), without a callout while a lease has tokens.
//!
//! A request spends every lease policy it matches. One that spent and left its lease
//! low elects a refill; one whose lease is empty waits for a refill (electing it, when
//! none is in flight, for itself: the grant is then held for it); one whose service
//! granted nothing rejects the request with the service's wait, except that once per
//! lease duration one request asks again and waits (a probe: an operator's override may
//! have changed the answer); one that cannot be
//! decided (its refill failed, its record cannot be written, the circuit is open, the
//! wait ran out with no grant, the worker holds `max_waiting` already) takes its own
//! failure rule, counted under its own cause, and the others are still spent. One that
//! its lease cannot serve while the service is healthy (its slot is another key's, its
//! wait was outrun by other requests) is set aside, and once none of the request's
//! lease policies waits, decided by a check of its cost at the service (`check.rs`'s
//! call: exact, with its 429; the failure rule only when the service cannot answer).
//!
//! A waiting request is retried when a refill's answer reaches its worker and on every
//! tick, at most one refill window (the callout's deadline and a margin) in time. The
//! refills and charges it elects go in the outbox; the root context sends them
//! (`outgoing.rs`), so their answers outlive the request.

use super::admit::{lease_estimate_owed, reject};
use super::check;
use super::fallback::{apply_failure_rule, count_causes};
use super::state::{Global, Granted, LeaseSpend, LeaseWait, Next, Pending, ToLease};
use crate::engine::breaker::Admit;
use crate::engine::calls::{Asker, Outgoing, Target};
use crate::engine::cause::Cause;
use crate::engine::decision::LeasePaid;
use crate::engine::evidence::counted;
use crate::engine::lease_record::{Rules, Spend, Updated};
use crate::engine::overridden;
use crate::engine::resolved::{Few, Place, Rare, Resolved};
use crate::engine::setup::Setup;
use crate::host::{Callouts, Counter, Metrics, PluginCounter, Reason};
use shared_store::{Clock, Decision, Limiter, Nanos, Placement, Store, UpdateError, Verdict};
use sluice_protocol::AppliedOverride;

/// How one policy's spend went.
enum Spent {
    Done(Spend),
    Failed(Cause),
}

fn spent(policy: usize, updated: Result<Updated<Spend>, UpdateError>, metrics: &mut impl Metrics) -> Spent {
    match counted(policy, updated, metrics) {
        Ok(spend) => Spent::Done(spend.unwrap_or(Spend::Taken)),
        Err(cause) => Spent::Failed(cause),
    }
}

/// A lease spent (or found empty) under an operator's override: counted, logged, and
/// named in the override header like a check decided under it.
fn note_under(
    setup: &Setup,
    granted: &mut Granted,
    policy: usize,
    under: Option<AppliedOverride>,
    now: Nanos,
    metrics: &mut impl Metrics,
) {
    if let Some(under) = under {
        overridden::note(setup, policy, under, now, metrics);
        granted.overrides.push((policy, under));
    }
}

/// Spends the request's lease policies: admits, waits, or rejects.
pub(crate) fn spend<S: Store, C: Clock>(
    setup: &Setup,
    to_lease: ToLease,
    limiter: &Limiter<S, C>,
    callouts: Option<&mut dyn Callouts>,
    metrics: &mut impl Metrics,
) -> Next {
    let ToLease { mut granted, leased, tag, mut to_check } = to_lease;
    let now = limiter.clock().now();
    let leases = setup.leases(limiter.store());
    let window = setup.refill_window();
    let waiter = setup.next_id();
    let mut waiting = Rare::new();
    let mut failed: Few<(Resolved, Cause)> = Few::new();
    for resolved in leased {
        let Some((slot, rules)) = lease_of(setup, &resolved, window) else { continue };
        match spent(resolved.policy, leases.spend(slot, resolved.cost, now, rules), metrics) {
            Spent::Done(Spend::Spent { refill, under, until }) => {
                if refill {
                    elect(setup, &tag, &resolved, Asker::LowWater);
                }
                note_under(setup, &mut granted, resolved.policy, under, now, metrics);
                let paid = LeasePaid::Tokens { until };
                granted.owed.extend(lease_estimate_owed(setup, &resolved, &tag, now, paid));
                let (policy, slot, cost) = (resolved.policy, slot.clone(), resolved.cost);
                granted.spent.push(LeaseSpend { policy, slot, cost, until });
            }
            Spent::Done(Spend::Wait { elected: mine }) => {
                if mine {
                    elect(setup, &tag, &resolved, Asker::Waiter { waiter, cost: resolved.cost });
                }
                waiting.push(resolved);
            }
            Spent::Done(Spend::Probe { .. }) if !circuit_open(setup, limiter) => {
                // Asks again whether the budget is still empty, and waits for the answer.
                elect(setup, &tag, &resolved, Asker::Waiter { waiter, cost: resolved.cost });
                waiting.push(resolved);
            }
            // No probe can leave while the circuit is open: the budget the service said
            // is empty stands (the election expires with its window).
            Spent::Done(Spend::Empty { until, under } | Spend::Probe { until, under }) => {
                // The request is rejected; the policies that could not be decided
                // before this one are still counted under their causes.
                // (Those set aside for a check were not decided: nothing degraded.)
                count_causes(setup, &set_aside_checks(setup, failed, &mut Rare::new()), now, metrics);
                note_under(setup, &mut granted, resolved.policy, under, now, metrics);
                return Next::Decided(empty(setup, granted, &resolved, until, now, limiter, metrics));
            }
            Spent::Done(Spend::Failed { reason }) => {
                failed.push((resolved, Cause::Service(Reason::from_index(reason))));
            }
            Spent::Done(Spend::Taken) => failed.push((resolved, Cause::Service(Reason::LeaseSlotTaken))),
            Spent::Done(Spend::Cold) => failed.push((resolved, Cause::Service(Reason::LeaseCold))),
            Spent::Failed(cause) => failed.push((resolved, cause)),
        }
    }
    open_circuit_decides(setup, &mut waiting, &mut failed, limiter);
    let failed = set_aside_checks(setup, failed, &mut to_check);
    if !failed.is_empty() {
        granted = match apply_failure_rule(setup, failed, granted, &tag, limiter, metrics) {
            Ok(granted) => granted,
            Err(decided) => return Next::Decided(decided),
        };
    }
    if waiting.is_empty() {
        return check_instead(setup, ToLease { granted, leased: waiting, tag, to_check }, limiter, callouts, metrics);
    }
    metrics.add_plugin(PluginCounter::Waiting, 1);
    let rest = ToLease { granted, leased: waiting, tag, to_check };
    Next::Wait(Box::new(Pending::Lease(LeaseWait { waiter, since: now, deadline: now.saturating_add(window), rest })))
}

/// Tries a request waiting for a refill again. Policies that can now spend, spend; one
/// whose refill failed, or whose wait ran out, takes the failure rule; the others go on
/// waiting (electing a refill of their own when the one they waited for is gone).
pub(crate) fn retry<S: Store, C: Clock>(
    setup: &Setup,
    wait: LeaseWait,
    limiter: &Limiter<S, C>,
    callouts: Option<&mut dyn Callouts>,
    metrics: &mut impl Metrics,
) -> Next {
    let LeaseWait { waiter, since, mut deadline, rest } = wait;
    let ToLease { mut granted, leased, tag, mut to_check } = rest;
    let now = limiter.clock().now();
    let leases = setup.leases(limiter.store());
    let window = setup.refill_window();
    let mut waiting = Rare::new();
    let mut failed: Few<(Resolved, Cause)> = Few::new();
    for resolved in leased {
        let Some((slot, rules)) = lease_of(setup, &resolved, window) else { continue };
        let may_elect = now < deadline;
        let retried = leases.retry(slot, resolved.cost, now, since, waiter, may_elect, rules);
        match spent(resolved.policy, retried, metrics) {
            Spent::Done(Spend::Spent { under, until, .. }) => {
                note_under(setup, &mut granted, resolved.policy, under, now, metrics);
                let paid = LeasePaid::Tokens { until };
                granted.owed.extend(lease_estimate_owed(setup, &resolved, &tag, now, paid));
                let (policy, slot, cost) = (resolved.policy, slot.clone(), resolved.cost);
                granted.spent.push(LeaseSpend { policy, slot, cost, until });
            }
            // (A retry never probes: it waited for the refill that found the budget empty.)
            Spent::Done(Spend::Empty { until, under } | Spend::Probe { until, under }) => {
                metrics.add_plugin(PluginCounter::Waiting, -1);
                // (Those set aside for a check were not decided: nothing degraded.)
                count_causes(setup, &set_aside_checks(setup, failed, &mut Rare::new()), now, metrics);
                note_under(setup, &mut granted, resolved.policy, under, now, metrics);
                return Next::Decided(empty(setup, granted, &resolved, until, now, limiter, metrics));
            }
            Spent::Done(Spend::Failed { reason }) => {
                failed.push((resolved, Cause::Service(Reason::from_index(reason))));
            }
            Spent::Done(Spend::Taken) => failed.push((resolved, Cause::Service(Reason::LeaseSlotTaken))),
            // (A retry is never cold: its key asked already.)
            Spent::Done(Spend::Cold) => failed.push((resolved, Cause::Service(Reason::LeaseCold))),
            Spent::Done(Spend::Wait { .. }) if now >= deadline => {
                // Outrun, when grants came while it waited; otherwise no answer came.
                let outrun = leases.peek(slot, now).ok().flatten().is_some_and(|r| r.granted_at >= since);
                let reason = if outrun { Reason::LeaseContended } else { Reason::Timeout };
                failed.push((resolved, Cause::Service(reason)));
            }
            Spent::Done(Spend::Wait { elected }) => {
                if elected {
                    elect(setup, &tag, &resolved, Asker::Waiter { waiter, cost: resolved.cost });
                    // Its own refill: it may wait for that one's whole window.
                    deadline = deadline.max(now.saturating_add(window));
                }
                waiting.push(resolved);
            }
            Spent::Failed(cause) => failed.push((resolved, cause)),
        }
    }
    open_circuit_decides(setup, &mut waiting, &mut failed, limiter);
    let failed = set_aside_checks(setup, failed, &mut to_check);
    if !failed.is_empty() {
        granted = match apply_failure_rule(setup, failed, granted, &tag, limiter, metrics) {
            Ok(granted) => granted,
            Err(decided) => {
                metrics.add_plugin(PluginCounter::Waiting, -1);
                return Next::Decided(decided);
            }
        };
    }
    if waiting.is_empty() {
        metrics.add_plugin(PluginCounter::Waiting, -1);
        return check_instead(setup, ToLease { granted, leased: waiting, tag, to_check }, limiter, callouts, metrics);
    }
    let rest = ToLease { granted, leased: waiting, tag, to_check };
    Next::Wait(Box::new(Pending::Lease(LeaseWait { waiter, since, deadline, rest })))
}

/// A request that cannot wait for a refill (the worker holds `max_waiting` already):
/// its waiting lease policies take the failure rule (`lease_queue_full`).
pub(crate) fn overflow<S: Store, C: Clock>(
    setup: &Setup,
    wait: LeaseWait,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Next {
    metrics.add_plugin(PluginCounter::Waiting, -1);
    let ToLease { granted, leased, tag, to_check } = wait.rest;
    // No check can be held for this request either: the lease policies set aside for
    // one take the failure rule with their own cause.
    let failed: Few<(Resolved, Cause)> = leased
        .into_iter()
        .map(|r| (r, Cause::Service(Reason::LeaseQueueFull)))
        .chain(to_check.into_iter().map(|(r, reason)| (r, Cause::Service(reason))))
        .collect();
    match apply_failure_rule(setup, failed, granted, &tag, limiter, metrics) {
        Err(decided) => Next::Decided(decided),
        Ok(granted) => Next::Admit(granted),
    }
}

/// Whether a lease policy that could not be served from its lease for `cause` is
/// decided by a check at the service instead of its failure rule: the service is
/// healthy, only the lease could not serve it (its slot holds another key's lease, or
/// its wait was outrun by other requests). `None` for a cause that takes the failure
/// rule (the service could not answer, the record could not be written, or the worker
/// cannot hold another waiting request: `lease_queue_full`, see the filter README).
fn checked_for(cause: Cause) -> Option<Reason> {
    match cause {
        Cause::Service(reason @ (Reason::LeaseSlotTaken | Reason::LeaseContended | Reason::LeaseCold)) => Some(reason),
        _ => None,
    }
}

/// Moves the failed policies that a check decides instead ([`checked_for`]) to
/// `to_check`; returns the others, which take the failure rule.
///
/// A policy whose cost the response reports keeps the failure rule: what a check spent
/// for it would have to be settled at the service as a check-mode policy's, which its
/// lease-mode debt bound does not cover yet (see the filter README).
fn set_aside_checks(
    setup: &Setup,
    failed: Few<(Resolved, Cause)>,
    to_check: &mut Rare<(Resolved, Reason)>,
) -> Few<(Resolved, Cause)> {
    let mut rest = Few::new();
    for (resolved, cause) in failed {
        let settled = setup.compiled(resolved.policy).is_some_and(|c| c.policy.cost.settled().is_some());
        match checked_for(cause) {
            Some(reason) if !settled => to_check.push((resolved, reason)),
            _ => rest.push((resolved, cause)),
        }
    }
    rest
}

/// Once no lease policy of the request waits: the policies its leases could not serve
/// are decided by the service, in one check of their costs on their global counters
/// (the check stage's call: exact, its 429 and `Retry-After`; when the service cannot
/// answer, their failure rule, as a check's). Counted under `lease.checked.<cause>`.
/// Without a way to send it now (`callouts` is `None`: a request that must be decided
/// at once), they take their failure rule under their own cause.
fn check_instead<S: Store, C: Clock>(
    setup: &Setup,
    to_lease: ToLease,
    limiter: &Limiter<S, C>,
    callouts: Option<&mut dyn Callouts>,
    metrics: &mut impl Metrics,
) -> Next {
    let ToLease { granted, tag, to_check, .. } = to_lease;
    if to_check.is_empty() {
        return Next::Admit(granted);
    }
    let Some(callouts) = callouts else {
        let failed: Few<(Resolved, Cause)> =
            to_check.into_iter().map(|(r, reason)| (r, Cause::Service(reason))).collect();
        return match apply_failure_rule(setup, failed, granted, &tag, limiter, metrics) {
            Ok(granted) => Next::Admit(granted),
            Err(decided) => Next::Decided(decided),
        };
    };
    let mut checked = Rare::new();
    for (mut resolved, reason) in to_check {
        // Decided as a check-mode policy is, its failure too: what the failure rule admits
        // when this check cannot be answered is not owed to the lease (counted as
        // `lease.forgiven`). A check that timed out may have been counted at the service
        // already; a charge on top would count the request twice (fleet seed 155).
        if let Place::Global { lease, .. } = &mut resolved.at {
            *lease = None;
        }
        let counter = match reason {
            Reason::LeaseContended => Counter::LeaseCheckedContended,
            Reason::LeaseCold => Counter::LeaseCheckedCold,
            _ => Counter::LeaseCheckedSlotTaken,
        };
        metrics.add(resolved.policy, counter, 1);
        checked.push(resolved);
    }
    let global = Global { granted, checked, leased: Rare::new(), tag };
    check::send_for_leases(setup, global, callouts, limiter, metrics)
}

/// The most requests a worker should hold waiting for this request's refills.
pub(crate) fn max_waiting(setup: &Setup, wait: &LeaseWait) -> usize {
    wait.rest
        .leased
        .iter()
        .filter_map(|r| setup.leased_home(r.policy))
        .map(|l| usize::try_from(l.config.max_waiting).unwrap_or(usize::MAX))
        .min()
        .unwrap_or(usize::MAX)
}

/// The lease record a resolved policy spends from, and the rules it spends under.
fn lease_of<'a>(setup: &Setup, resolved: &'a Resolved, window: Nanos) -> Option<(&'a Placement, Rules)> {
    let (Place::Global { lease: Some(slot), .. }, Some(home)) = (&resolved.at, setup.leased_home(resolved.policy))
    else {
        return None;
    };
    let life = home.config.duration();
    // A policy whose cost the response reports is always leased: a check's spend would
    // have to be settled as a check-mode policy's (see `set_aside_checks`).
    let may_check = setup.compiled(resolved.policy).is_some_and(|c| c.policy.cost.settled().is_none());
    let cold_below = if may_check { u64::from(home.config.cold_below) } else { 0 };
    let rules = Rules { low_water: home.config.low_water, refill_window: window, probe_every: life, life, cold_below };
    Some((slot, rules))
}

/// Puts a refill of `resolved`'s lease in the outbox.
fn elect(setup: &Setup, tag: &str, resolved: &Resolved, asker: Asker) {
    let Place::Global { key, lease: Some(slot), .. } = &resolved.at else { return };
    let target = Target { policy: resolved.policy, slot: slot.clone(), key: *key, tag: tag.to_owned() };
    // Not in the outbox: the election expires after its window, and the next request
    // elects again.
    let _ = setup.send_later(Outgoing::Refill(target, asker));
}

/// While the circuit is open no refill can be sent: lease policies that would wait
/// for one take the failure rule at once (`circuit_open`), and their elections are
/// given up, rather than waiting for a refill that will not leave.
fn open_circuit_decides<S: Store, C: Clock>(
    setup: &Setup,
    waiting: &mut Rare<Resolved>,
    failed: &mut Few<(Resolved, Cause)>,
    limiter: &Limiter<S, C>,
) {
    // Nothing waits: no need to read the breaker (a shared-data read per request).
    if waiting.is_empty() {
        return;
    }
    if !circuit_open(setup, limiter) {
        return;
    }
    let now = limiter.clock().now();
    let leases = setup.leases(limiter.store());
    let mut given_up = Vec::new();
    for resolved in std::mem::take(waiting) {
        if let Place::Global { lease: Some(slot), .. } = &resolved.at {
            let _ = leases.refill_failed(slot, u64::try_from(Reason::CircuitOpen.index()).unwrap_or(0), now);
            given_up.push(slot.key.clone());
        }
        failed.push((resolved, Cause::Service(Reason::CircuitOpen)));
    }
    // The elections just given up: nothing to send for them.
    if let Ok(mut outbox) = setup.outbox.try_borrow_mut() {
        outbox.retain(|call| !matches!(call, Outgoing::Refill(target, _) if given_up.contains(&target.slot.key)));
    }
}

/// Whether the circuit breaker is open: no refill can be sent (a shared-data read).
fn circuit_open<S: Store, C: Clock>(setup: &Setup, limiter: &Limiter<S, C>) -> bool {
    let now = limiter.clock().now();
    setup.service.as_ref().is_some_and(|s| s.breaker.admit_quietly(limiter.store(), now) == Admit::Open)
}

/// The service granted nothing to this caller: reject with the time it said.
fn empty<S: Store, C: Clock>(
    setup: &Setup,
    granted: Granted,
    resolved: &Resolved,
    until: Nanos,
    now: Nanos,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> crate::engine::decision::Decided {
    metrics.add(resolved.policy, Counter::OverLimit, 1);
    let limit = setup.compiled(resolved.policy).map_or(0, |c| c.policy.limit.capacity());
    let wait = until.saturating_sub(now).max(Nanos(1));
    let decision =
        Decision { verdict: Verdict::Rejected { retry_after: wait }, limit, remaining: 0, reset_after: wait };
    reject(setup, granted, Some((resolved.policy, decision)), setup.response.status, limiter, metrics)
}
