//! Concurrency slots: what a holder took, given back when the request ends, and renewed
//! while it lasts (see the [`limiter`](super) docs, "Concurrency").

use super::{LimitError, Limiter, Read};
use crate::codec::Record;
use crate::limit::{Limit, State, concurrency};
use crate::store::{Store, Swap};
use crate::time::Clock;

/// Concurrency slots a request holds in one key: given back with [`Limiter::release`].
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Slot {
    /// The key the slots were taken in (the caller's slot, or the overflow bucket).
    pub key: String,
    /// The key's owner when they were taken.
    pub owner: u64,
    /// The concurrency limit.
    pub limit: Limit,
    /// How many slots.
    pub count: u64,
}

/// What a renewal found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Renewal {
    /// The holder's entry now says what it holds, renewed now.
    Renewed,
    /// Nothing to renew: the key is missing, undecodable, or held by another owner (the
    /// slot changed hands after the holder's entry went stale: what it held went with
    /// it).
    Gone,
    /// No room: the key records [`MAX_HOLDERS`](crate::MAX_HOLDERS) other live holders,
    /// so this holder's lost entry cannot come back until one leaves (the key counts
    /// fewer requests in flight than there are meanwhile).
    Full,
}

impl<S: Store, C: Clock> Limiter<S, C> {
    /// Gives back the slots of a request that ended. Returns false when the write could
    /// not be made (every attempt conflicted, or the store failed): the slots then stay
    /// taken until this holder's next [`Limiter::renew`] of the key sets its entry to
    /// what it really holds.
    pub fn release(&self, slot: &Slot) -> bool {
        // `written` is unused by a concurrency refund: the holder's entry says it all.
        let written = State::Holders { entries: Vec::new() };
        self.refund_one(&slot.key, slot.owner, &slot.limit, slot.count, &written)
    }

    /// Renews this holder's entry in `key` (owned by `owner`, under `limit`) and sets it
    /// to `count` slots, what the holder knows it holds there; stale entries of other
    /// holders are pruned in the same write. `count` of zero removes the entry.
    ///
    /// # Errors
    /// [`LimitError::Contended`] when every attempt conflicted, [`LimitError::Store`]
    /// when the store failed; the entry then goes stale at
    /// [`STALE_AFTER`](crate::STALE_AFTER) unless a later renewal succeeds.
    pub fn renew(&self, key: &str, owner: u64, limit: &Limit, count: u64) -> Result<Renewal, LimitError> {
        for _ in 0..self.max_attempts {
            let (cas, record) = match self.read(key, limit)? {
                Read::Found(cas, record) if record.owner == owner => (cas, record),
                _ => return Ok(Renewal::Gone),
            };
            let now = self.clock.now();
            let State::Holders { entries } = limit.adopt(&record.limit, record.state, now) else {
                return Ok(Renewal::Gone);
            };
            let Some(state) = concurrency::renew(&entries, self.holder, count, now) else {
                return Ok(Renewal::Full);
            };
            let record = Record { owner, limit: *limit, state };
            match record.encode_with(|bytes| self.store.set(key, bytes, Some(cas)))? {
                Swap::Written => return Ok(Renewal::Renewed),
                Swap::Conflict => continue,
            }
        }
        Err(LimitError::Contended { attempts: self.max_attempts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::key::Placement;
    use crate::limiter::Request;
    use crate::store::MemoryStore;
    use crate::time::{ManualClock, Nanos};
    use crate::{RENEW_EVERY, STALE_AFTER};
    use std::sync::Arc as Rc;

    type Worker = Limiter<Rc<MemoryStore>, ManualClock>;

    /// Two workers (holders) over one store and one clock.
    fn workers() -> (Worker, Worker, ManualClock) {
        let store = Rc::new(MemoryStore::new());
        let clock = ManualClock::at(Nanos::from_secs(100));
        (
            Limiter::new(store.clone(), clock.clone()).with_holder(1),
            Limiter::new(store, clock.clone()).with_holder(2),
            clock,
        )
    }

    fn take(limiter: &Worker, place: &Placement, limit: &Limit) -> Option<Slot> {
        let (admission, mut reservation) = limiter.reserve(&[Request { place, limit, cost: 1 }]).unwrap();
        admission.admitted.then(|| reservation.take_slots().pop()).flatten()
    }

    #[test]
    fn slots_are_shared_by_every_holder_and_come_back_on_release() {
        let (a, b, _) = workers();
        let place = Placement::dedicated("k");
        let limit = Limit::concurrency(2).unwrap();

        let first = take(&a, &place, &limit).unwrap();
        let _second = take(&b, &place, &limit).unwrap();
        let refused = take(&a, &place, &limit);
        assert!(a.release(&first));
        let again = take(&b, &place, &limit);

        assert!(refused.is_none());
        assert!(again.is_some());
    }

    #[test]
    fn a_holder_that_stops_renewing_frees_its_slots_after_the_stale_bound_and_a_live_one_keeps_them() {
        let (dead, live, clock) = workers();
        let place = Placement::dedicated("k");
        let limit = Limit::concurrency(2).unwrap();
        let _lost = take(&dead, &place, &limit).unwrap();
        let kept = take(&live, &place, &limit).unwrap();

        let mut waited = Nanos::ZERO;
        while waited < STALE_AFTER {
            clock.advance(RENEW_EVERY);
            waited = waited.saturating_add(RENEW_EVERY);
            assert_eq!(live.renew(&kept.key, kept.owner, &limit, 1), Ok(Renewal::Renewed));
        }
        let freed = take(&live, &place, &limit);
        let full = take(&dead, &place, &limit);

        assert!(freed.is_some(), "the dead holder's slot came back after {STALE_AFTER:?}");
        assert!(full.is_none(), "the live holder's two slots still count");
    }

    #[test]
    fn a_renewal_makes_good_a_release_that_was_never_written() {
        let (a, _, _) = workers();
        let place = Placement::dedicated("k");
        let limit = Limit::concurrency(1).unwrap();
        let _unreleased = take(&a, &place, &limit).unwrap();

        let blocked = take(&a, &place, &limit);
        assert_eq!(a.renew("k", place.owner, &limit, 0), Ok(Renewal::Renewed));
        let freed = take(&a, &place, &limit);

        assert!(blocked.is_none());
        assert!(freed.is_some());
    }
}
