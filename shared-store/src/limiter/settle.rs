//! Settling a spend to its actual cost, once it is known: a request admitted on an
//! estimate (a language model's `max_tokens`) is charged the difference when it cost
//! more, going into debt up to a bound, or given the difference back when it cost less
//! ([`Limit::charge`], [`Limit::credit`]). One CAS loop, like a decision, on the key a
//! decision at this moment would use: the caller's slot, or the overflow bucket while
//! the slot is held by another active caller. A credit is given only to the caller's own
//! slot: an estimate spent on the slot that another caller took over since (the slot
//! went idle, so the estimate had refilled anyway) is not given to the overflow bucket.

use super::Limiter;
use crate::LimitError;
use crate::codec::Record;
use crate::key::Placement;
use crate::limit::Limit;
use crate::store::{Store, Swap};
use crate::time::{Clock, Nanos};

/// What settling one spend did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Settlement {
    /// Units charged beyond the estimate.
    pub charged: u64,
    /// Units given back.
    pub credited: u64,
    /// Units that were not settled: a charge beyond the debt bound, or a credit that
    /// could not be given (an algorithm without credit, a slot that changed hands, a
    /// full bucket, a window the spend no longer counts in).
    pub forgiven: u64,
    /// Writes that lost a CAS race and were retried.
    pub conflicts: u32,
    /// Whether a damaged state was replaced by an exhausted one on the way.
    pub repaired: bool,
}

impl<S: Store, C: Clock> Limiter<S, C> {
    /// Settles `estimate` units spent at `spent_at` on `place` to `actual`: charges
    /// `actual - estimate` (never leaving the limit more than `max_debt` below empty), or
    /// credits `estimate - actual`. Nothing is written when they are equal.
    ///
    /// # Errors
    /// [`LimitError`] when every attempt lost its race or the store failed: nothing was
    /// settled then.
    pub fn settle(
        &self,
        place: &Placement,
        limit: &Limit,
        spent_at: Nanos,
        estimate: u64,
        actual: u64,
        max_debt: u64,
    ) -> Result<Settlement, LimitError> {
        let mut settlement = Settlement::default();
        if actual == estimate {
            return Ok(settlement);
        }
        let request = super::Request { place, limit, cost: 0 };
        for _ in 0..self.max_attempts {
            let now = self.clock.now();
            let plan = match self.plan(&request, now)? {
                Ok(plan) => plan,
                Err((key, cas)) => {
                    let record = Record { owner: place.owner, limit: *limit, state: limit.exhausted(now) };
                    if self.store.set(key, &record.encode(), Some(cas))? == Swap::Written {
                        settlement.repaired = true;
                    } else {
                        settlement.conflicts += 1;
                    }
                    continue;
                }
            };
            let (next, charged, credited) = if actual > estimate {
                let (next, charged) = limit.charge(plan.state.as_ref(), now, actual - estimate, max_debt);
                (next, charged, 0)
            } else {
                let units = estimate - actual;
                let credited = match (&plan.state, plan.overflowed) {
                    (Some(state), false) => limit.credit(state, spent_at, now, units),
                    _ => None,
                };
                match credited {
                    // A credit that changes nothing (a full bucket, a window gone) gives nothing.
                    Some((next, credited)) if credited > 0 && plan.state.as_ref() != Some(&next) => (next, 0, credited),
                    _ => {
                        settlement.forgiven = units;
                        return Ok(settlement);
                    }
                }
            };
            settlement.charged = charged;
            settlement.credited = credited;
            settlement.forgiven = actual.abs_diff(estimate).saturating_sub(charged.max(credited));
            if plan.state.as_ref() == Some(&next) || charged.max(credited) == 0 {
                return Ok(settlement);
            }
            let record = Record { owner: plan.owner, limit: *limit, state: next };
            let swap = record.encode_with(|bytes| match plan.cas {
                Some(cas) => self.store.set(plan.key, bytes, Some(cas)),
                None => self.create(plan.key, bytes),
            })?;
            match swap {
                Swap::Written => return Ok(settlement),
                Swap::Conflict => settlement.conflicts += 1,
            }
        }
        Err(LimitError::Contended { attempts: self.max_attempts })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Rate;
    use crate::store::MemoryStore;
    use crate::time::ManualClock;
    use crate::{Request, Verdict};

    const S: u64 = 1_000_000_000;

    fn setup() -> (Limiter<MemoryStore, ManualClock>, ManualClock, Limit, Placement) {
        let clock = ManualClock::at(Nanos(1000 * S));
        // 10 tokens, one a second.
        let limit = Limit::token_bucket(Rate::new(1, Nanos(S)).unwrap(), 10).unwrap();
        (Limiter::new(MemoryStore::new(), clock.clone()), clock, limit, Placement::dedicated("k"))
    }

    fn spend(limiter: &Limiter<MemoryStore, ManualClock>, place: &Placement, limit: &Limit, cost: u64) -> bool {
        limiter.check(&[Request { place, limit, cost }]).unwrap().admitted
    }

    #[test]
    fn a_cost_above_its_estimate_is_charged_into_debt_and_the_next_request_waits_exactly_for_it() {
        let (limiter, clock, limit, place) = setup();
        let at = clock.now();
        assert!(spend(&limiter, &place, &limit, 4));

        let settled = limiter.settle(&place, &limit, at, 4, 13, 5).unwrap();
        let deeper = limiter.settle(&place, &limit, at, 0, 5, 5).unwrap();

        assert_eq!((settled.charged, settled.forgiven), (9, 0), "the 6 left, and 3 of the 5 allowed in debt");
        assert_eq!((deeper.charged, deeper.forgiven), (2, 3), "2 more reach the debt bound; the rest is forgiven");
        let next = limiter.check(&[Request { place: &place, limit: &limit, cost: 1 }]).unwrap();
        // 5 below empty: one token back needs 6 s.
        assert_eq!(next.decisions[0].verdict, Verdict::Rejected { retry_after: Nanos(6 * S) });
        clock.advance(Nanos(6 * S - 1));
        assert!(!spend(&limiter, &place, &limit, 1), "not a nanosecond earlier");
        clock.advance(Nanos(1));
        assert!(spend(&limiter, &place, &limit, 1), "admitted once the debt is repaid");
    }

    #[test]
    fn a_cost_below_its_estimate_gives_the_difference_back() {
        let (limiter, clock, limit, place) = setup();
        let at = clock.now();
        assert!(spend(&limiter, &place, &limit, 10));
        assert!(!spend(&limiter, &place, &limit, 1));

        let settled = limiter.settle(&place, &limit, at, 10, 3, 5).unwrap();

        assert_eq!(settled.credited, 7);
        assert!(spend(&limiter, &place, &limit, 7), "the seven unused tokens are back");
        assert!(!spend(&limiter, &place, &limit, 1));
    }

    #[test]
    fn an_exact_estimate_writes_nothing() {
        let (limiter, clock, limit, place) = setup();
        assert!(spend(&limiter, &place, &limit, 4));
        let before = limiter.store().get("k").unwrap().unwrap().cas;

        assert_eq!(limiter.settle(&place, &limit, clock.now(), 4, 4, 5).unwrap(), Settlement::default());
        assert_eq!(limiter.store().get("k").unwrap().unwrap().cas, before);
    }
}
