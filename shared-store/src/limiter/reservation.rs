//! Reservations and refunds: the record of what an admission wrote, and how a spend is
//! given back, later for a reservation or at once after a partial all-or-nothing write.

use super::{Admission, LimitError, Limiter, Plan, Read, Request, Slot};
use crate::codec::Record;
use crate::limit::{Limit, State};
use crate::store::{Store, Swap};
use crate::time::Clock;
use smallvec::SmallVec;

/// What an admission spent, to keep ([`Limiter::commit`]) or give back
/// ([`Limiter::refund`]) once the rest of the request is decided (see the [`limiter`](super)
/// docs).
#[must_use = "a reservation is kept (commit) or given back (refund)"]
#[derive(Debug, PartialEq, Eq)]
pub struct Reservation {
    spends: SmallVec<[Spend; INLINE_SPENDS]>,
}

/// Spends a reservation holds without allocating: one, a request's one local policy.
/// A reservation is moved with its request through the filter's stages, so each spend
/// held inline (about a hundred bytes) is copied at every move, whether spent or not;
/// a request with more local policies allocates instead.
const INLINE_SPENDS: usize = 1;

impl Reservation {
    /// A reservation that spent nothing.
    pub fn empty() -> Self {
        Self { spends: SmallVec::new() }
    }

    /// Whether nothing was spent.
    pub fn is_empty(&self) -> bool {
        self.spends.is_empty()
    }

    /// Joins two reservations (both kept or given back together).
    pub fn join(mut self, other: Self) -> Self {
        self.spends.extend(other.spends);
        self
    }

    /// Takes out the concurrency slots it holds ([`Slot`]), to be given back when the
    /// request ends ([`Limiter::release`]) rather than with the rest of the reservation.
    pub fn take_slots(&mut self) -> Vec<Slot> {
        // Most reservations hold none: leave their spends where they are.
        if !self.spends.iter().any(|s| matches!(s.limit, Limit::Concurrency { .. })) {
            return Vec::new();
        }
        let (slots, rest): (SmallVec<[Spend; INLINE_SPENDS]>, SmallVec<[Spend; INLINE_SPENDS]>) =
            std::mem::take(&mut self.spends).into_iter().partition(|s| matches!(s.limit, Limit::Concurrency { .. }));
        self.spends = rest;
        slots.into_iter().map(|s| Slot { key: s.key, owner: s.owner, limit: s.limit, count: s.cost }).collect()
    }

    /// Records the writes an admission made (`plans`, one per request).
    pub(super) fn record(&mut self, requests: &[Request<'_>], plans: &[Plan<'_>]) {
        for (request, plan) in requests.iter().zip(plans) {
            if let Some(written) = &plan.next {
                self.spends.push(Spend {
                    key: plan.key.to_owned(),
                    owner: plan.owner,
                    limit: *request.limit,
                    cost: request.cost,
                    written: written.clone(),
                });
            }
        }
    }
}

/// One write an admission made.
#[derive(Debug, PartialEq, Eq)]
struct Spend {
    key: String,
    owner: u64,
    limit: Limit,
    cost: u64,
    written: State,
}

impl<S: Store, C: Clock> Limiter<S, C> {
    /// [`Limiter::check`], keeping the record of what an admission spent so that it can
    /// be given back later (see the [`limiter`](super) docs). The reservation is empty when the
    /// request was not admitted.
    ///
    /// # Errors
    /// As [`Limiter::check`].
    pub fn reserve(&self, requests: &[Request<'_>]) -> Result<(Admission, Reservation), LimitError> {
        let mut reservation = Reservation::empty();
        let admission = self.decide_all(requests, Some(&mut reservation))?;
        Ok((admission, reservation))
    }

    /// Keeps what a reservation spent.
    pub fn commit(&self, reservation: Reservation) {
        drop(reservation);
    }

    /// Gives back what a reservation spent. Returns how many of its spends could not be
    /// given back (each leaves its limit stricter, never looser).
    pub fn refund(&self, reservation: Reservation) -> u32 {
        let failed = reservation
            .spends
            .iter()
            .filter(|spend| !self.refund_one(&spend.key, spend.owner, &spend.limit, spend.cost, &spend.written))
            .count();
        u32::try_from(failed).unwrap_or(u32::MAX)
    }

    /// Gives back what the writes made before `failed` spent. Returns how many refunds
    /// could not be written.
    pub(super) fn refund_all(&self, requests: &[Request<'_>], plans: &[Plan<'_>], failed: usize) -> u32 {
        let mut unrefunded = 0;
        for (request, plan) in requests.iter().zip(plans).take(failed) {
            if let Some(written) = &plan.next
                && !self.refund_one(plan.key, plan.owner, request.limit, request.cost, written)
            {
                unrefunded += 1;
            }
        }
        unrefunded
    }

    pub(super) fn refund_one(&self, key: &str, owner: u64, limit: &Limit, cost: u64, written: &State) -> bool {
        for _ in 0..self.max_attempts {
            let Ok(Read::Found(cas, record)) = self.read(key, limit) else { return false };
            if record.owner != owner {
                // The slot changed hands: our spend went with the old state.
                return true;
            }
            // Read the clock after the store, so it is not earlier than any write seen.
            let now = self.clock.now();
            let current = limit.adopt(&record.limit, record.state, now);
            let Some(state) = limit.refund_for(&current, written, now, cost, self.holder) else { return false };
            if state == current {
                return true;
            }
            let record = Record { owner, limit: *limit, state };
            match record.encode_with(|bytes| self.store.set(key, bytes, Some(cas))) {
                Ok(Swap::Written) => return true,
                Ok(Swap::Conflict) => continue,
                Err(_) => return false,
            }
        }
        false
    }
}
