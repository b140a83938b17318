//! The token bucket, as GCRA: how a bucket refilling at a rate and holding a burst
//! decides, is charged and adopts other numbers. The leaky bucket runs on the same
//! arithmetic ([`Gcra`]), as a shaper.

use super::{Carried, InvalidLimit, Limit, Rate, State, ceil_div, floor_div, ns};
use crate::decision::{Decision, Verdict};
use crate::time::Nanos;

impl Limit {
    /// A token bucket refilling at `rate` and holding at most `burst`.
    ///
    /// # Errors
    /// [`InvalidLimit::ZeroCapacity`] when `burst` is zero.
    pub const fn token_bucket(rate: Rate, burst: u64) -> Result<Self, InvalidLimit> {
        if burst == 0 { Err(InvalidLimit::ZeroCapacity) } else { Ok(Self::TokenBucket { rate, burst }) }
    }
}

/// GCRA arithmetic for one bucket, in units of `1 / amount` nanoseconds.
pub(super) struct Gcra {
    amount: u128,
    per: u128,
    /// Capacity in scaled time: `burst × per`.
    capacity: u128,
    /// Capacity in cost units: the burst.
    burst: u64,
}

impl Gcra {
    pub(super) fn new(rate: Rate, burst: u64) -> Self {
        let per = u128::from(rate.per.0);
        Self { amount: u128::from(rate.amount), per, capacity: u128::from(burst) * per, burst }
    }

    fn now(&self, now: Nanos) -> u128 {
        u128::from(now.0) * self.amount
    }

    /// The bucket with nothing left to spend at `now` (see [`Limit::exhausted`]).
    pub(super) fn exhausted(&self, now: Nanos) -> State {
        State::Gcra { tat: self.now(now).saturating_add(self.capacity) }
    }

    /// Time (ns) for `scaled` to drain.
    fn drain(&self, scaled: u128) -> Nanos {
        if self.amount == 1 { ns(scaled) } else { ns(ceil_div(scaled, self.amount)) }
    }

    fn units(&self, scaled: u128) -> u64 {
        u64::try_from(floor_div(scaled, self.per)).unwrap_or(u64::MAX)
    }

    /// The decision that leaves the bucket as it is (queries, rejections).
    fn unchanged(&self, verdict: Verdict, debt: u128) -> Decision {
        Decision {
            verdict,
            limit: self.burst,
            remaining: self.units(self.capacity.saturating_sub(debt)),
            reset_after: self.drain(debt),
        }
    }

    /// One GCRA step. Without `max_wait` this is a token bucket: debt is credit already
    /// spent, and a request fits if the debt it adds stays within the burst. With
    /// `max_wait` it is a shaper: debt is the queue ahead, which the request waits out,
    /// and it must also not wait longer than `max_wait`.
    pub(super) fn step(&self, tat: u128, now: Nanos, cost: u64, max_wait: Option<Nanos>) -> (Decision, Option<State>) {
        let now = self.now(now);
        let base = tat.max(now);
        let debt = base - now;
        if cost == 0 {
            return (self.unchanged(Verdict::Allowed, debt), None);
        }
        if cost > self.burst {
            return (self.unchanged(Verdict::Exceeds, debt), None);
        }
        let increment = u128::from(cost) * self.per;
        let delay = if max_wait.is_some() { self.drain(debt) } else { Nanos::ZERO };
        match (debt.checked_add(increment), base.checked_add(increment)) {
            (Some(need), Some(next)) if need <= self.capacity && max_wait.is_none_or(|wait| delay <= wait) => {
                let verdict = if delay == Nanos::ZERO { Verdict::Allowed } else { Verdict::Delayed(delay) };
                (
                    Decision {
                        verdict,
                        limit: self.burst,
                        remaining: self.units(self.capacity - need),
                        reset_after: self.drain(need),
                    },
                    Some(State::Gcra { tat: next }),
                )
            }
            _ => {
                let room_wait = debt.saturating_add(increment).saturating_sub(self.capacity);
                let delay_wait =
                    max_wait.map_or(0, |wait| debt.saturating_sub(u128::from(wait.0).saturating_mul(self.amount)));
                let retry_after = self.drain(room_wait.max(delay_wait));
                (self.unchanged(Verdict::Rejected { retry_after }, debt), None)
            }
        }
    }

    /// Spends up to `cost` whole units, keeping the debt within `burst + max_debt`
    /// units' worth of scaled time. `None` when the arithmetic overflows (nothing is
    /// charged then).
    pub(super) fn charge(&self, tat: u128, now: Nanos, cost: u64, max_debt: u64) -> Option<(u128, u64)> {
        let now = self.now(now);
        let base = tat.max(now);
        let debt = base - now;
        let ceiling = u128::from(self.burst).checked_add(u128::from(max_debt))?.checked_mul(self.per)?;
        let room = floor_div(ceiling.saturating_sub(debt), self.per);
        let charged = u64::try_from(room.min(u128::from(cost))).ok()?;
        let next = base.checked_add(u128::from(charged).checked_mul(self.per)?)?;
        Some((next, charged))
    }

    /// Gives back `units` tokens, never past a full bucket at `now` (see
    /// [`Limit::credit`]): the state, and the whole tokens given back (a partly refilled
    /// token counts as one).
    pub(super) fn credit(&self, tat: u128, now: Nanos, units: u64) -> (u128, u64) {
        let now = self.now(now);
        if tat <= now {
            return (tat, 0);
        }
        let missing = ceil_div(tat - now, self.per.max(1));
        let credited = u64::try_from(missing.min(u128::from(units))).unwrap_or(units);
        (tat.saturating_sub(u128::from(units).saturating_mul(self.per)).max(now), credited)
    }

    /// Re-expresses a bucket kept under `old` in this bucket's units (see
    /// [`Limit::carry`]): the whole units available are kept (negative in debt), capped at
    /// this capacity above and at this capacity below empty; what the lower cap drops is
    /// forgiven. `None` when the arithmetic overflows.
    pub(super) fn carry(&self, old: &Self, tat: u128, now: Nanos) -> Option<Carried> {
        let debt = tat.saturating_sub(old.now(now));
        let spent = ceil_div(debt, old.per.max(1));
        let burst = u128::from(self.burst);
        let spent = spent.saturating_add(burst).saturating_sub(u128::from(old.burst));
        let most = burst.saturating_mul(2);
        let forgiven = u64::try_from(spent.saturating_sub(most)).unwrap_or(u64::MAX);
        let spent = spent.min(most);
        Some(Carried { state: State::Gcra { tat: self.now(now).checked_add(spent.checked_mul(self.per)?)? }, forgiven })
    }

    /// The whole units spent beyond the burst at `now` (see [`Limit::owed`]).
    pub(super) fn owed(&self, tat: u128, now: Nanos) -> u64 {
        let spent = ceil_div(tat.saturating_sub(self.now(now)), self.per.max(1));
        u64::try_from(spent.saturating_sub(u128::from(self.burst))).unwrap_or(u64::MAX)
    }
}

/// Gives back `cost` from a bucket that still holds exactly what the admission wrote, and
/// nothing (`None`) from one written since (see [`Limit::refund`]).
pub(super) fn refund(rate: Rate, current: u128, written: u128, cost: u64) -> Option<State> {
    if current != written {
        return None;
    }
    let increment = u128::from(cost).saturating_mul(u128::from(rate.per.0));
    Some(State::Gcra { tat: current.saturating_sub(increment) })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::tests::{MS, S, T0, at, bucket};

    #[test]
    fn a_token_bucket_is_charged_down_to_its_debt_bound_and_forgives_the_rest() {
        let (state, charged) = bucket().charge(None, T0, 20, 3);

        let status = bucket().status(Some(&state), T0);
        assert_eq!(charged, 8, "5 in the bucket and 3 of debt");
        assert_eq!(status.remaining, 0);
        // 8 tokens at 100 ms each: full again in 800 ms, one token admitted after 400 ms.
        assert_eq!(status.reset_after, Nanos(800 * MS));
        assert_eq!(status.verdict, Verdict::Rejected { retry_after: Nanos(400 * MS) });
    }

    #[test]
    fn a_bucket_in_debt_admits_nothing_until_the_debt_is_repaid_and_then_exactly_on_time() {
        let (state, _) = bucket().charge(None, T0, 8, 3);

        let early = bucket().decide(Some(&state), at(400 * MS - 1), 1);
        let on_time = bucket().decide(Some(&state), at(400 * MS), 1);

        assert!(matches!(early.0.verdict, Verdict::Rejected { retry_after: Nanos(1) }), "{early:?}");
        assert!(on_time.0.is_admitted());
    }

    #[test]
    fn a_bucket_already_at_its_debt_bound_is_charged_nothing_more() {
        let (state, _) = bucket().charge(None, T0, 8, 3);

        let (again, charged) = bucket().charge(Some(&state), T0, 5, 3);
        let (deeper, more) = bucket().charge(Some(&state), T0, 5, 4);

        assert_eq!((again, charged), (state, 0));
        assert_eq!(more, 1, "a larger bound lets one more unit in");
        assert_eq!(bucket().status(Some(&deeper), T0).reset_after, Nanos(900 * MS));
    }

    #[test]
    fn a_bucket_in_debt_carried_to_other_numbers_stays_in_debt() {
        // 5 tokens, 100 ms each: spent whole and charged 3 more (3 below empty).
        let (in_debt, _) = bucket().charge(None, T0, 8, 3);
        let raised = Limit::token_bucket(Rate::new(10, Nanos(S)).unwrap(), 6).unwrap();

        let carried = raised.carry(&bucket(), in_debt, T0);
        let early = raised.decide(Some(&carried.state), at(400 * MS - 1), 1).0;
        let on_time = raised.decide(Some(&carried.state), at(400 * MS), 1).0;

        // Still 3 below empty: the first token is back after 400 ms, as before the change.
        assert_eq!(carried.forgiven, 0);
        assert!(matches!(early.verdict, Verdict::Rejected { retry_after: Nanos(1) }), "{early:?}");
        assert!(on_time.is_admitted());
    }

    #[test]
    fn a_debt_deeper_than_the_new_capacity_is_kept_up_to_it_and_the_rest_is_counted_as_forgiven() {
        // 5 below empty under a burst of 5; carried to a burst of 2: at most 2 below empty.
        let (in_debt, _) = bucket().charge(None, T0, 10, 5);
        let lowered = Limit::token_bucket(Rate::new(10, Nanos(S)).unwrap(), 2).unwrap();

        let carried = lowered.carry(&bucket(), in_debt, T0);

        assert_eq!(carried.forgiven, 3);
        assert_eq!(lowered.status(Some(&carried.state), T0).reset_after, Nanos(400 * MS), "2 + 2 tokens to refill");
    }

    #[test]
    fn adopting_other_bucket_numbers_keeps_the_whole_units_left_and_never_refills() {
        let raised = Limit::token_bucket(Rate::new(10, Nanos(S)).unwrap(), 8).unwrap();
        let lowered = Limit::token_bucket(Rate::new(10, Nanos(S)).unwrap(), 2).unwrap();
        // 3 of 5 spent, and 50 ms of the next token refilled: 2.5 left, 3 spent rounded up.
        let (_, spent) = bucket().decide(None, T0, 3);
        let spent = spent.unwrap();

        let up = raised.adopt(&bucket(), spent.clone(), at(50 * MS));
        let down = lowered.adopt(&bucket(), spent, at(50 * MS));

        assert_eq!(raised.status(Some(&up), at(50 * MS)).remaining, 2, "2 whole units kept, none added");
        assert_eq!(up, State::Gcra { tat: u128::from(at(50 * MS).0) + 6 * 100 * u128::from(MS) });
        assert_eq!(lowered.status(Some(&down), at(50 * MS)).remaining, 2, "capped at the new burst");
    }
}
