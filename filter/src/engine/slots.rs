//! Concurrency slots after admission: recorded when taken, given back when the request
//! ends (or is rejected after all), and renewed on the worker's tick so that they count
//! while this worker lives and stop counting [`STALE_AFTER`](shared_store::STALE_AFTER)
//! after it dies.
//!
//! A release whose write fails (every CAS attempt lost, a store error) is counted as
//! `unrefunded` and made good at the next renewal, which sets this worker's entry to
//! what it really holds: a slot is never leaked, at worst held one renewal period
//! ([`RENEW_EVERY`](shared_store::RENEW_EVERY)) too long.
//! A renewal that fails is counted (`concurrency.renew_failures`): if none succeeds for
//! `STALE_AFTER`, this worker's slots stop counting while its requests are still in
//! flight (looser), until a renewal succeeds again.

use crate::engine::decision::HeldSlot;
use crate::engine::setup::Setup;
use crate::host::{Counter, Metrics};
use shared_store::{Clock, Limiter, Renewal, Slot, Store};

/// Records the slots an admission took.
pub(crate) fn take(setup: &Setup, slots: &[HeldSlot]) {
    if let Ok(mut held) = setup.held.try_borrow_mut() {
        for s in slots {
            held.take(s.policy, &s.slot);
        }
    }
}

/// Gives back the slots of a request that ended, or that was rejected after it took
/// them.
pub(crate) fn release<S: Store, C: Clock>(
    setup: &Setup,
    slots: Vec<HeldSlot>,
    limiter: &Limiter<S, C>,
    metrics: &mut impl Metrics,
) {
    for HeldSlot { policy, slot } in slots {
        let written = limiter.release(&slot);
        if !written {
            metrics.add(policy, Counter::Unrefunded, 1);
        }
        if let Ok(mut held) = setup.held.try_borrow_mut() {
            held.give_back(&slot, written);
        }
    }
}

/// Renews every key this worker holds slots in, at most once per
/// [`RENEW_EVERY`](shared_store::RENEW_EVERY): its
/// entry says it is alive and exactly how many it holds (zero removes it).
pub(crate) fn renew<S: Store, C: Clock>(setup: &Setup, limiter: &Limiter<S, C>, metrics: &mut impl Metrics) {
    let now = limiter.clock().now();
    let keys = match setup.held.try_borrow_mut() {
        Ok(mut held) => {
            if !held.renewal_due(now) {
                return;
            }
            held.keys()
        }
        Err(_) => return,
    };
    for (key, held) in keys {
        match limiter.renew(&key, held.owner, &held.limit, held.count) {
            Ok(Renewal::Renewed | Renewal::Gone) => {
                if let Ok(mut map) = setup.held.try_borrow_mut() {
                    map.forget_if_empty(&key);
                }
            }
            Ok(Renewal::Full) | Err(_) => metrics.add(held.policy, Counter::ConcurrencyRenewFailures, 1),
        }
    }
}

/// Gives back every slot this worker still holds (its root context is going away).
pub(crate) fn release_all<S: Store, C: Clock>(setup: &Setup, limiter: &Limiter<S, C>, metrics: &mut impl Metrics) {
    let keys = setup.held.try_borrow().map(|held| held.keys()).unwrap_or_default();
    let slots = keys
        .into_iter()
        .filter(|(_, held)| held.count > 0)
        .map(|(key, held)| HeldSlot {
            policy: held.policy,
            slot: Slot { key, owner: held.owner, limit: held.limit, count: held.count },
        })
        .collect();
    release(setup, slots, limiter, metrics);
}
