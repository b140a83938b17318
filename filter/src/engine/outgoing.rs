//! The calls a worker's root context sends for the lease stage, and their answers:
//! refills (`POST /v1/lease`) and charges of debt (`POST /v1/charge`), taken from the
//! outbox and from the keys this worker owes for; the sweep that finds debt this worker
//! does not know of. Check-mode settlements go the same way (`settlement.rs`).
//!
//! # Who calls the service
//!
//! A refill or a charge must outlive the request that asked for it: the request goes on
//! with its token, and its stream may end before the answer comes back (the SDK then
//! drops an answer addressed to it, and the tokens granted would be lost). So requests
//! only *elect* a refill in the lease record and put it in the outbox; the glue wakes
//! its root context at once (a shared queue of its own worker), which sends it and
//! receives the answer; the tick sends whatever a wake missed.
//!
//! # Reconciliation
//!
//! Units a fallback admits (emergency cap, fail open) while the service cannot decide
//! are recorded as debt in the caller's lease record, at most `max_debt`, the rest
//! forgiven. The worker that owed it schedules a charge of its own, sent by its root
//! once the circuit is closed, whatever else happens to the key; a charge carries an
//! id, so one sent again after a timeout is applied once. Debt that cannot be charged
//! within `DEBT_LIFE` (`lease_record/record.rs`) is forgiven and counted. So an
//! outage's overshoot is paid back, not forgotten, and one-off identities never hold
//! slots.

use super::breaker::Admit;
use super::calls::{Asker, ID_TTL_MS, Outgoing, Sent, SentOutgoing, Target, charge_id, units};
use super::compiled::{Home, Leased};
use super::evidence::counted;
use super::lease_record::Updated;
use super::lease_return;
use super::namespace;
use super::settlement;
use super::setup::Setup;
use super::wire::{self, Failure};
use crate::host::{CalloutAnswer, Callouts, Counter, Metrics, PluginCounter, Reason};
use shared_store::{Clock, Limiter, Nanos, Placement, Store, UpdateError};
use sluice_protocol::{ChargeRequest, ChargeResponse, LeaseRequest, LeaseResponse};

/// The most charges one worker sends per tick.
const MAX_CHARGES_PER_TICK: usize = 16;
/// Lease records one worker reads per tick, round the tables, for debt it does not know
/// of (owed by a worker that restarted, or by an earlier configuration): every debt is
/// charged within `slots / SWEEP_PER_TICK` ticks of the service answering again.
pub(crate) const SWEEP_PER_TICK: u32 = 16;

/// Reads the next few lease records round this worker's lease tables, and schedules
/// a charge for any that owes (see [`SWEEP_PER_TICK`]).
pub(crate) fn sweep_debts<S: Store, C: Clock>(setup: &Setup, limiter: &Limiter<S, C>) {
    let tables: Vec<(usize, &Leased)> = setup
        .policies
        .iter()
        .filter_map(|c| match &c.home {
            Home::Global { lease: Some(leased), .. } => Some((c.index, leased)),
            _ => None,
        })
        .collect();
    let total: u64 = tables.iter().map(|(_, l)| u64::from(l.table.slots())).sum();
    if total == 0 {
        return;
    }
    let leases = setup.leases(limiter.store());
    for _ in 0..SWEEP_PER_TICK {
        let mut at = setup.sweep.get() % total;
        setup.sweep.set(setup.sweep.get().wrapping_add(1));
        for (policy, leased) in &tables {
            let slots = u64::from(leased.table.slots());
            if at >= slots {
                at -= slots;
                continue;
            }
            let key = leased.table.slot_key(u32::try_from(at).unwrap_or(0));
            if let Ok(Some(record)) = leases.read_slot(&key)
                && record.debt > 0
                && setup.charges.try_borrow().is_ok_and(|c| !c.contains_key(&key))
            {
                let slot = Placement { key, owner: record.owner, overflow: None };
                let tag = record.tag.map_or_else(|| "none".to_owned(), namespace::hex128);
                setup.schedule_charge(Target { policy: *policy, slot, key: record.counter, tag });
            }
            break;
        }
    }
}

/// The calls waiting in this worker's outbox, to be sent by the root context; with
/// `charges`, also the charges this worker owes (at most a few per call, and not
/// while the circuit is open).
pub(crate) fn take_outgoing<S: Store, C: Clock>(
    setup: &Setup,
    limiter: &Limiter<S, C>,
    charges: bool,
) -> Vec<Outgoing> {
    let mut out = setup.outbox.try_borrow_mut().map(|mut outbox| std::mem::take(&mut *outbox)).unwrap_or_default();
    // The breaker is read only when charges are due: it is a shared-data read, and
    // this runs after every callback that may have filled the outbox.
    if !charges {
        return out;
    }
    // While the circuit is open, charges wait; once its cooldown has passed, the first
    // charge may be the probe that closes it (a quiet proxy has no other call to probe
    // with).
    let reachable = setup
        .service
        .as_ref()
        .is_some_and(|s| s.breaker.admit_quietly(limiter.store(), limiter.clock().now()) != Admit::Open);
    // Settlements to send again go on the tick (those past their life too, to be
    // forgiven).
    out.extend(settlement::take(setup, reachable, limiter.clock().now()).into_iter().map(Outgoing::Settle));
    if reachable && let Ok(mut pending) = setup.charges.try_borrow_mut() {
        let keys: Vec<String> = pending.keys().take(MAX_CHARGES_PER_TICK).cloned().collect();
        for key in keys {
            if let Some(target) = pending.remove(&key) {
                out.push(Outgoing::Charge(target));
            }
        }
    }
    out
}

/// Whether the outbox holds calls to send (the glue then wakes its root context).
pub(crate) fn has_outgoing(setup: &Setup) -> bool {
    setup.outbox.try_borrow().is_ok_and(|outbox| !outbox.is_empty())
}

/// Sends a call from the outbox; `None` when it was decided without the service (the
/// circuit is open, the proxy would not send it, nothing is left to charge).
pub(crate) fn dispatch_outgoing<S: Store, C: Clock>(
    setup: &Setup,
    call: Outgoing,
    callouts: &mut impl Callouts,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Option<SentOutgoing> {
    let service = setup.service.as_ref()?;
    let now = limiter.clock().now();
    let (sent, path, body) = match call {
        Outgoing::Refill(target, asker) => {
            let body = refill_body(setup, &target, asker, limiter.store(), now)?;
            (Sent::Refill(target, asker), wire::LEASE_PATH, body)
        }
        Outgoing::Charge(target) => {
            let (sent, body) = claim_charge(setup, target, limiter, metrics)?;
            (sent, wire::CHARGE_PATH, body)
        }
        Outgoing::Settle(held) => {
            let (path, body) = settlement::call(setup, &held, now, metrics)?;
            (Sent::Settle(held), path, body)
        }
    };
    if service.breaker.admit(limiter.store(), now) == Admit::Open {
        unsent(setup, Reason::CircuitOpen, sent, limiter, metrics);
        return None;
    }
    match service.dispatch(path, &body, callouts) {
        Ok(token) => {
            metrics.add_plugin(PluginCounter::Callouts, 1);
            if let Sent::Refill(target, _) = &sent {
                metrics.add(target.policy, Counter::LeaseRefills, 1);
            }
            Some(SentOutgoing { token, deadline: now.saturating_add(setup.refill_window()), sent_at: now, call: sent })
        }
        Err(_) => {
            service.record_health(limiter.store(), now, Some(false), now, metrics);
            unsent(setup, Reason::DispatchFailed, sent, limiter, metrics);
            None
        }
    }
}

/// The body of a refill of `target`'s lease: a grant of what the key is expected to
/// spend over the lease's life (its demand, read from its record), at least what a
/// waiter costs and at most the lease's size (the size when the record cannot be read).
fn refill_body(setup: &Setup, target: &Target, asker: Asker, store: &impl Store, now: Nanos) -> Option<Vec<u8>> {
    let (compiled, leased) = (setup.compiled(target.policy)?, setup.leased_home(target.policy)?);
    let Home::Global { spec, .. } = &compiled.home else { return None };
    let size = leased.config.size;
    let min_tokens = match asker {
        Asker::LowWater => 1,
        Asker::Waiter { cost, .. } => cost.clamp(1, size),
    };
    let demand = setup.leases(store).peek(&target.slot, now).ok().flatten().map(|record| record.demand);
    let tokens = demand.map_or(size, |demand| demand.ask(now, leased.config.duration(), min_tokens, size));
    let request = LeaseRequest {
        tag: Some(target.tag.clone()),
        key: namespace::hex128(target.key),
        policy: Some(compiled.policy.name.clone()),
        policy_version: compiled.policy.version,
        limit: *spec,
        tokens,
        min_tokens,
        ttl_ms: leased.config.duration_ms,
    };
    Some(serde_json::to_vec(&request).unwrap_or_default())
}

/// Claims what `target`'s lease record owes for a charge, and the charge's body; `None`
/// when there is nothing to send now (in flight elsewhere, nothing owed, or the record
/// could not be written: then it is scheduled again while debt is left).
fn claim_charge<S: Store, C: Clock>(
    setup: &Setup,
    target: Target,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) -> Option<(Sent, Vec<u8>)> {
    let (compiled, leased) = (setup.compiled(target.policy)?, setup.leased_home(target.policy)?);
    let Home::Global { spec, .. } = &compiled.home else { return None };
    let (leases, now) = (setup.leases(limiter.store()), limiter.clock().now());
    let claimed = leases.claim_charge(&target.slot, setup.next_id(), setup.refill_window(), now);
    let charge = match counted(target.policy, claimed.map(|(c, aged)| Updated { result: c, forgiven: aged }), metrics) {
        Ok(Some(charge)) => charge,
        Ok(None) => {
            // In flight elsewhere (retried after its window), or nothing owed.
            if let Ok(Some(record)) = leases.peek(&target.slot, now)
                && record.debt > 0
            {
                setup.schedule_charge(target);
            }
            return None;
        }
        Err(_) => {
            setup.schedule_charge(target);
            return None;
        }
    };
    let request = ChargeRequest {
        tag: Some(target.tag.clone()),
        key: namespace::hex128(target.key),
        policy: Some(compiled.policy.name.clone()),
        policy_version: compiled.policy.version,
        limit: *spec,
        cost: charge.units,
        max_debt: leased.config.max_debt,
        charge_id: Some(charge_id(charge.id)),
        id_ttl_ms: Some(ID_TTL_MS),
    };
    let body = serde_json::to_vec(&request).unwrap_or_default();
    Some((Sent::Charge(target, charge), body))
}

/// A call that was not sent, for `reason`: a refill is recorded as failed (its waiters
/// take the failure rule), a charge stays owed, a settlement is sent again later.
fn unsent<S: Store, C: Clock>(
    setup: &Setup,
    reason: Reason,
    sent: Sent,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) {
    let now = limiter.clock().now();
    match sent {
        Sent::Refill(target, _) => {
            let failed = setup.leases(limiter.store()).refill_failed(&target.slot, reason_index(reason), now);
            if let Err(UpdateError::Contended { attempts }) = failed {
                metrics.add(target.policy, Counter::CasConflicts, i64::from(attempts));
            }
        }
        // Still owed: sent again once the circuit closes.
        Sent::Charge(target, _) => setup.schedule_charge(target),
        Sent::Settle(held) => settlement::retry(setup, held, now, metrics),
    }
}

/// A reason as a lease record keeps it.
fn reason_index(reason: Reason) -> u64 {
    u64::try_from(reason.index()).unwrap_or(0)
}

/// Applies the answer to a call the root sent (or its absence: `TimedOut`), after the
/// circuit breaker has recorded what it says of the service's health.
/// `is_waiting` says whether a waiter (by id) still waits on this worker: a grant is
/// held only for a request that can still spend it.
pub(crate) fn outgoing_answered<S: Store, C: Clock, M: Metrics>(
    setup: &Setup,
    sent: SentOutgoing,
    answer: &CalloutAnswer,
    limiter: &Limiter<S, C>,
    metrics: &mut M,
    is_waiting: impl Fn(u64) -> bool,
) {
    let now = limiter.clock().now();
    let record = |health: Option<bool>, metrics: &mut M| {
        if let Some(service) = &setup.service {
            service.record_health(limiter.store(), now, health, sent.sent_at, metrics);
        }
    };
    match &sent.call {
        Sent::Refill(target, asker) => {
            let answer = wire::classify_lease(answer);
            record(answer.as_ref().map_or_else(Failure::health, |_| Some(true)), metrics);
            let hold = match asker {
                Asker::Waiter { waiter, cost } if is_waiting(*waiter) => Some((*waiter, *cost)),
                _ => None,
            };
            refill_answered(setup, target, hold, sent.sent_at, answer, limiter, metrics);
        }
        Sent::Charge(target, charge) => {
            let answer = wire::classify_charge(answer);
            record(answer.as_ref().map_or_else(Failure::health, |_| Some(true)), metrics);
            charge_answered(setup, target, charge.id, answer, limiter, metrics);
        }
        Sent::Settle(held) => {
            let health = match settlement::answered(setup, held.clone(), answer, now, metrics) {
                Ok(()) => Some(true),
                Err(failure) => failure.health(),
            };
            record(health, metrics);
        }
    }
}

/// Applies a refill's answer to `target`'s lease record: a grant (held for `hold`, the
/// waiter and its cost, when it still waits; paying debt first, and the debt left
/// charged), or the failure its waiters take.
fn refill_answered<S: Store, C: Clock>(
    setup: &Setup,
    target: &Target,
    hold: Option<(u64, u64)>,
    sent_at: Nanos,
    answer: Result<LeaseResponse, Failure>,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) {
    let (leases, now) = (setup.leases(limiter.store()), limiter.clock().now());
    let granted = match answer {
        Ok(granted) => granted,
        Err(failure) => {
            let failed = leases.refill_failed(&target.slot, reason_index(failure.reason), now);
            let _ = counted(target.policy, failed.map(|()| Updated { result: Some(()), forgiven: 0 }), metrics);
            return;
        }
    };
    let expires_in = Nanos::from_millis(granted.expires_in_ms);
    // The service's waits; "never" (u64::MAX) is held to a minute, after which the lease
    // asks again.
    let wait = |ns: u64| Nanos(ns).min(Nanos::from_secs(60));
    let retry = (wait(granted.entry.retry_after_ns), wait(granted.refill_after_ns));
    if let Some(applied) = granted.applied {
        super::overridden::log_once(setup, target.policy, applied, now);
    }
    let under = granted.applied;
    let applied = leases.grant(&target.slot, granted.granted, hold, sent_at, expires_in, retry, under, now);
    let mut owes = None;
    if let Ok(Some(applied)) = counted(target.policy, applied, metrics) {
        metrics.add(target.policy, Counter::LeaseGranted, units(granted.granted));
        let scarce = granted.entry.remaining < granted.granted;
        if granted.granted > applied.repaid && under.is_none() && scarce {
            lease_return::schedule(setup, target, now, sent_at.saturating_add(expires_in), granted.at_ns);
        }
        if applied.expired > 0 {
            metrics.add(target.policy, Counter::LeaseExpired, units(applied.expired));
        }
        if applied.repaid > 0 {
            metrics.add(target.policy, Counter::LeaseRepaid, units(applied.repaid));
        }
        owes = applied.owes;
    }
    // The service answers again: charge what was admitted without it. The record the
    // grant was written to says (read again only when the grant could not be applied).
    let owes =
        owes.unwrap_or_else(|| leases.peek(&target.slot, now).ok().flatten().is_some_and(|r| r.debt > r.charging));
    if owes {
        setup.schedule_charge(target.clone());
    }
}

/// Applies a charge's answer to `target`'s lease record: the debt it carried is settled
/// (counted once, by the answer that settles it: a duplicate answers for an earlier
/// attempt whose own answer never came), or stays owed and reserved for this charge, sent
/// again with the same id once its window has passed (the service may have applied it).
fn charge_answered<S: Store, C: Clock>(
    setup: &Setup,
    target: &Target,
    id: u64,
    answer: Result<ChargeResponse, Failure>,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) {
    let Ok(charged) = answer else {
        setup.schedule_charge(target.clone());
        return;
    };
    let Ok(settled) = setup.leases(limiter.store()).settle_charge(&target.slot, id, limiter.clock().now()) else {
        return;
    };
    if settled.settled {
        metrics.add(target.policy, Counter::LeaseReconciled, units(charged.charged));
        if charged.forgiven > 0 {
            metrics.add(target.policy, Counter::LeaseForgiven, units(charged.forgiven));
        }
    }
    if settled.left > 0 {
        setup.schedule_charge(target.clone());
    }
}
