//! Settling what a check-mode policy spent on an estimate, at the counter service, once
//! the response has said what the request really cost: the excess is charged
//! (`POST /v1/charge`, into debt up to the policy's debt bound) or the unused part
//! credited (`POST /v1/credit`, in the window the check spent it in). The same path
//! refunds a check's whole spend when a later stage rejects its request ([`refund`]),
//! and gives back leased tokens a proxy will not spend ([`give_back_lease`]).
//!
//! The request that spent the estimate may be gone by then (its stream ends with its
//! response), so its settlement goes to the worker's outbox and the root context sends
//! it, like a lease refill, at most one call at a time per caller and direction: what
//! ends meanwhile is summed and sent when that call is answered (`settle_queue.rs`).
//! Each settlement carries an id: one whose answer did not come
//! (a timeout, a reset, an overloaded service, an open circuit) is held and sent again
//! on a later tick, with the same id, and the service applies it once. A settlement the
//! service cannot apply within `DEBT_LIFE`, one it refuses (a 4xx), or one beyond
//! [`MAX_PENDING_SETTLEMENTS`] held is forgiven and
//! counted (`cost.forgiven`): what the policy admitted is then the estimate, not the
//! actual cost, never silently. The units are counted (`cost.charged`, `cost.credited`,
//! `cost.forgiven`) when the service answers, not when the response ends.
//!
//! A settlement belongs to the root context that queued it. When the filter is
//! configured again, the old root goes on sending until its last stream ends; what it
//! still holds, has in its outbox or waits on then is forgiven and counted as it
//! retires ([`retire`]): a settlement in flight may have been applied, so the count
//! errs towards forgiving.

use super::calls::{Change, ID_TTL_MS, Outgoing, Purpose, Settlement, charge_id, units};
use super::compiled::{Home, debt_bound};
use super::decision::Owed;
use super::lease_record::DEBT_LIFE;
use super::namespace;
use super::settle_queue::Added;
use super::setup::{MAX_PENDING_SETTLEMENTS, Setup};
use super::wire::{self, Failure};
use crate::host::{CalloutAnswer, Counter, Metrics};
use shared_store::Nanos;
use sluice_protocol::{ChargeRequest, CreditRequest};

/// The most settlements one call of the root context sends.
pub(crate) const MAX_SETTLEMENTS_PER_CALL: usize = 64;
const _: () = assert!(MAX_SETTLEMENTS_PER_CALL <= MAX_PENDING_SETTLEMENTS);

/// Queues the settlement of `owed`, which the service spent at `at_ns` for the caller
/// `key` under `tag`, to the `actual` cost (nothing when they are equal).
pub(crate) fn hold(
    setup: &Setup,
    owed: &Owed,
    (key, tag, at_ns): (u128, &str, u64),
    actual: u64,
    now: Nanos,
    metrics: &mut (impl Metrics + ?Sized),
) {
    let change = match actual.cmp(&owed.estimate) {
        std::cmp::Ordering::Equal => return,
        std::cmp::Ordering::Greater => Change::Charge(actual - owed.estimate),
        std::cmp::Ordering::Less => Change::Credit { units: owed.estimate - actual, spent_at_ns: at_ns },
    };
    queue(setup, settlement(setup, owed.policy, (key, tag), change, now, Purpose::Cost), metrics);
}

/// Queues the refund of what a check spent for `policy` (`cost`, at `at_ns` for the
/// caller `key` under `tag`): a later stage rejected the request, so the service is
/// asked to credit it all back. A policy whose algorithm cannot be credited (a leaky
/// bucket, a sliding log) keeps the spend, counted as `unrefunded`.
pub(crate) fn refund(
    setup: &Setup,
    policy: usize,
    (key, tag, at_ns): (u128, &str, u64),
    cost: u64,
    now: Nanos,
    metrics: &mut (impl Metrics + ?Sized),
) {
    // A lease policy's spend at the service (a check its lease could not serve) is not
    // credited back either: kept, stricter, never looser, and counted.
    if setup.leased_home(policy).is_some() || !setup.compiled(policy).is_some_and(|c| c.policy.limit.can_credit()) {
        metrics.add(policy, Counter::Unrefunded, 1);
        return;
    }
    let change = Change::Credit { units: cost, spent_at_ns: at_ns };
    queue(setup, settlement(setup, policy, (key, tag), change, now, Purpose::Refund), metrics);
}

/// Queues the return of `units` leased tokens of lease policy `policy` for the caller
/// `key` under `tag`, granted at `at_ns` (the service's clock): taken out of the lease
/// record already, so no request can spend them, they are credited back at the service
/// with an id (applied once however often it is sent). Counted as `lease.returned` once
/// credited, `lease.expired` when they cannot be.
pub(crate) fn give_back_lease(
    setup: &Setup,
    policy: usize,
    (key, tag, at_ns): (u128, &str, u64),
    units: u64,
    now: Nanos,
    metrics: &mut (impl Metrics + ?Sized),
) {
    let change = Change::Credit { units, spent_at_ns: at_ns };
    queue(setup, settlement(setup, policy, (key, tag), change, now, Purpose::Return), metrics);
}

fn settlement(
    setup: &Setup,
    policy: usize,
    (key, tag): (u128, &str),
    change: Change,
    now: Nanos,
    purpose: Purpose,
) -> Settlement {
    let window = match (change, setup.compiled(policy)) {
        (Change::Credit { spent_at_ns, .. }, Some(compiled)) => {
            spent_at_ns / compiled.policy.limit.period().as_u64().max(1)
        }
        _ => 0,
    };
    Settlement { policy, key, tag: tag.to_owned(), change, id: setup.next_id(), since: now, purpose, window }
}

/// Sends `settlement` now (through the outbox) when nothing of its aim is out, or
/// leaves it waiting (summed with what waits for its aim); forgives it when the queue
/// is full.
fn queue(setup: &Setup, settlement: Settlement, metrics: &mut (impl Metrics + ?Sized)) {
    let Ok(mut queue) = setup.settlements.try_borrow_mut() else { return forgive(&settlement, metrics) };
    match queue.add(settlement) {
        Ok(Added::SendNow(settlement)) => {
            if let Err(Outgoing::Settle(settlement)) = setup.send_later(Outgoing::Settle(settlement)) {
                // Never left: its aim is free again, and it waits for the tick.
                let _ = queue.release(&settlement, false);
                if let Err(settlement) = queue.hold(settlement) {
                    forgive(&settlement, metrics);
                }
            }
        }
        Ok(Added::Waiting) => {}
        Err(settlement) => forgive(&settlement, metrics),
    }
}

/// The settlements to send again now (on the tick): a few, one per aim with nothing
/// out, while the service is `reachable`; while it is not, only those past their life
/// (to be forgiven when dispatched).
pub(crate) fn take(setup: &Setup, reachable: bool, now: Nanos) -> Vec<Settlement> {
    let Ok(mut queue) = setup.settlements.try_borrow_mut() else { return Vec::new() };
    if reachable { queue.take(MAX_SETTLEMENTS_PER_CALL) } else { queue.take_expired(now.saturating_sub(DEBT_LIFE)) }
}

/// The call taken out for `settlement` ended, `answered` by the service or not
/// (`SettleQueue::release`); when it was, the next settlement of its aim goes to the
/// outbox at once.
fn release(setup: &Setup, settlement: &Settlement, answered: bool, metrics: &mut (impl Metrics + ?Sized)) {
    let next = setup.settlements.try_borrow_mut().ok().and_then(|mut q| q.release(settlement, answered));
    if let Some(next) = next
        && let Err(Outgoing::Settle(next)) = setup.send_later(Outgoing::Settle(next))
    {
        // Never left: its aim is free again, and it waits for the tick.
        let held = match setup.settlements.try_borrow_mut() {
            Ok(mut queue) => {
                let _ = queue.release(&next, false);
                queue.hold(next)
            }
            Err(_) => Err(next),
        };
        if let Err(next) = held {
            forgive(&next, metrics);
        }
    }
}

/// The call that applies `settlement`: its path and body. `None` (and it is forgiven)
/// when it is past its life or its policy is no longer of its mode (a check-mode one
/// for a cost or a refund, a lease-mode one for a return).
pub(crate) fn call(
    setup: &Setup,
    settlement: &Settlement,
    now: Nanos,
    metrics: &mut (impl Metrics + ?Sized),
) -> Option<(&'static str, Vec<u8>)> {
    let made = (|| {
        if now >= settlement.since.saturating_add(DEBT_LIFE) {
            return None;
        }
        let compiled = setup.compiled(settlement.policy)?;
        let Home::Global { spec, lease, .. } = &compiled.home else { return None };
        if lease.is_some() != (settlement.purpose == Purpose::Return) {
            return None;
        }
        let (tag, key, id) =
            (Some(settlement.tag.clone()), namespace::hex128(settlement.key), charge_id(settlement.id));
        let (policy, policy_version) = (Some(compiled.policy.name.clone()), compiled.policy.version);
        Some(match settlement.change {
            Change::Charge(cost) => {
                // The service bounds debt by the capacity; the filter by its own rule.
                let max_debt = debt_bound(compiled.policy.cost.settled()?).min(compiled.policy.limit.capacity());
                let id_ttl_ms = Some(ID_TTL_MS);
                let request = ChargeRequest {
                    tag,
                    key,
                    policy,
                    policy_version,
                    limit: *spec,
                    cost,
                    max_debt,
                    charge_id: Some(id),
                    id_ttl_ms,
                };
                (wire::CHARGE_PATH, serde_json::to_vec(&request).ok()?)
            }
            Change::Credit { units, spent_at_ns } => {
                let (credit_id, id_ttl_ms) = (Some(id), Some(ID_TTL_MS));
                let request = CreditRequest {
                    tag,
                    key,
                    policy,
                    policy_version,
                    limit: *spec,
                    units,
                    spent_at_ns,
                    credit_id,
                    id_ttl_ms,
                };
                (wire::CREDIT_PATH, serde_json::to_vec(&request).ok()?)
            }
        })
    })();
    if made.is_none() {
        release(setup, settlement, true, metrics);
        forgive(settlement, metrics);
    }
    made
}

/// Holds a settlement whose call was taken out and not applied, to be sent again with
/// its id on a tick (its aim is released), or forgives it when it is past its life or
/// no more can be held.
pub(crate) fn retry(setup: &Setup, settlement: Settlement, now: Nanos, metrics: &mut (impl Metrics + ?Sized)) {
    release(setup, &settlement, false, metrics);
    if now >= settlement.since.saturating_add(DEBT_LIFE) {
        return forgive(&settlement, metrics);
    }
    let held = match setup.settlements.try_borrow_mut() {
        Ok(mut queue) => queue.hold(settlement),
        Err(_) => Err(settlement),
    };
    if let Err(settlement) = held {
        forgive(&settlement, metrics);
    }
}

/// Applies the service's answer to a settlement; `Err` with the failure (for the circuit
/// breaker) when it was not applied. A refusal (a 4xx other than `408`: sending it again
/// would be refused again) is forgiven; anything else is sent again.
pub(crate) fn answered(
    setup: &Setup,
    settlement: Settlement,
    answer: &CalloutAnswer,
    now: Nanos,
    metrics: &mut (impl Metrics + ?Sized),
) -> Result<(), Failure> {
    let policy = settlement.policy;
    let applied = match (settlement.change, settlement.purpose) {
        (Change::Charge(_), _) => {
            wire::classify_charge(answer).map(|a| (Counter::CostCharged, Counter::CostForgiven, a.charged, a.forgiven))
        }
        (Change::Credit { .. }, Purpose::Return) => wire::classify_credit(answer)
            .map(|a| (Counter::LeaseReturned, Counter::LeaseExpired, a.credited, a.forgiven)),
        (Change::Credit { .. }, _) => wire::classify_credit(answer)
            .map(|a| (Counter::CostCredited, Counter::CostForgiven, a.credited, a.forgiven)),
    };
    let refused =
        matches!(answer, CalloutAnswer::Response { status, .. } if (400..500).contains(status) && *status != 408);
    if applied.is_ok() || refused {
        release(setup, &settlement, true, metrics);
    }
    match applied {
        // A refund's units are not a response's cost: nothing to count once applied.
        Ok((counter, not_moved, moved, forgiven)) if settlement.purpose != Purpose::Refund => {
            add(metrics, policy, counter, moved);
            add(metrics, policy, not_moved, forgiven);
            Ok(())
        }
        Ok(_) => Ok(()),
        Err(failure) => {
            if refused {
                forgive(&settlement, metrics);
            } else {
                retry(setup, settlement, now, metrics);
            }
            Err(failure)
        }
    }
}

/// Forgives every settlement still held, in the outbox, or in flight (`in_flight`):
/// the root context that would send them, or read their answers, is going away.
pub(crate) fn retire(
    setup: &Setup,
    in_flight: impl IntoIterator<Item = Settlement>,
    metrics: &mut (impl Metrics + ?Sized),
) {
    let held: Vec<Settlement> = setup.settlements.try_borrow_mut().map(|mut q| q.drain()).unwrap_or_default();
    let queued: Vec<Settlement> = setup
        .outbox
        .try_borrow_mut()
        .map(|mut outbox| {
            let (settlements, others): (Vec<Outgoing>, Vec<Outgoing>) =
                outbox.drain(..).partition(|call| matches!(call, Outgoing::Settle(_)));
            outbox.extend(others);
            settlements
                .into_iter()
                .filter_map(|call| if let Outgoing::Settle(s) = call { Some(s) } else { None })
                .collect()
        })
        .unwrap_or_default();
    for settlement in held.into_iter().chain(queued).chain(in_flight) {
        forgive(&settlement, metrics);
    }
}

/// Counts a settlement that will not be applied: a response cost's units as
/// `cost.forgiven`, a refund as one `unrefunded` spend, a return's tokens as
/// `lease.expired` (they were taken out of the lease, and no one spends them).
fn forgive(settlement: &Settlement, metrics: &mut (impl Metrics + ?Sized)) {
    match settlement.purpose {
        Purpose::Cost => add(metrics, settlement.policy, Counter::CostForgiven, settlement.change.units()),
        Purpose::Refund => metrics.add(settlement.policy, Counter::Unrefunded, 1),
        Purpose::Return => add(metrics, settlement.policy, Counter::LeaseExpired, settlement.change.units()),
    }
}

fn add(metrics: &mut (impl Metrics + ?Sized), policy: usize, counter: Counter, n: u64) {
    if n > 0 {
        metrics.add(policy, counter, units(n));
    }
}
