//! A key's demand on this proxy, kept in its lease record: the units its requests asked
//! for over the last lease life, counted in two whole intervals of one life each (the
//! current and the one before) and read as a sliding window over them. It decides how
//! the key is served: a cold key is checked per request, a warm one gets a lease sized
//! to what it is expected to spend (see the filter README, "Lease mode adapts to
//! demand").

use shared_store::Nanos;

/// A key with nothing in the interval before and at least this many units in this one is
/// expected to go on at the rate it has shown (see [`Demand::expected`]): fewer are too
/// few to read a rate from.
pub(crate) const PROJECTED_FROM: u64 = 4;

/// A key's rate is read over at least this fraction of a lease life (1/100): four
/// requests in a few microseconds are not taken for millions a second.
pub(crate) const RATE_SPAN: u128 = 100;

/// Units asked for in the current interval and the one before.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Demand {
    /// When the current interval began (0: nothing known).
    pub(crate) since: Nanos,
    /// Units asked for since then.
    pub(crate) current: u64,
    /// Units asked for in the interval before.
    pub(crate) previous: u64,
}

impl Demand {
    /// Whether anything is known of the key's demand (a fresh record knows nothing).
    pub(crate) fn is_known(&self) -> bool {
        self.since > Nanos::ZERO
    }

    /// The intervals as they stand at `now`, each `life` long.
    fn rolled(self, now: Nanos, life: Nanos) -> Self {
        let life = life.0.max(1);
        if !self.is_known() {
            return Self { since: now.max(Nanos(1)), ..Self::default() };
        }
        if now < self.since {
            return self;
        }
        let passed = (now.0 - self.since.0) / life;
        let since = Nanos(self.since.0.saturating_add(passed.saturating_mul(life)));
        match passed {
            0 => self,
            1 => Self { since, current: 0, previous: self.current },
            _ => Self { since, current: 0, previous: 0 },
        }
    }

    /// Counts `units` asked for at `now`.
    pub(crate) fn note(&mut self, units: u64, now: Nanos, life: Nanos) {
        *self = self.rolled(now, life);
        self.current = self.current.saturating_add(units);
    }

    /// The units the key is expected to ask for over the next lease life: what it asked
    /// for over the last one (the current interval, and the part of the one before that
    /// the last life still covers, rounded up). A key with nothing in the interval before
    /// and at least [`PROJECTED_FROM`] units in this one (it just arrived, or came back) is
    /// expected to go on at the rate it has shown since the interval began, over at least
    /// [`RATE_SPAN`] of a life: so a busy key's grants reach its demand in a few refills
    /// rather than growing from one unit.
    pub(crate) fn expected(&self, now: Nanos, life: Nanos) -> u64 {
        let rolled = self.rolled(now, life);
        let life = u128::from(life.0.max(1));
        let into = u128::from(now.0.saturating_sub(rolled.since.0)).min(life);
        let from_previous = (u128::from(rolled.previous) * (life - into)).div_ceil(life);
        let last_life = rolled.current.saturating_add(u64::try_from(from_previous).unwrap_or(u64::MAX));
        if rolled.previous > 0 || rolled.current < PROJECTED_FROM {
            return last_life;
        }
        let span = into.max(life / RATE_SPAN).max(1);
        let at_its_rate = (u128::from(rolled.current) * life).div_ceil(span);
        last_life.max(u64::try_from(at_its_rate).unwrap_or(u64::MAX))
    }

    /// Whether the key is cold at `now`: expected to ask for fewer than `cold_below` units
    /// over the next lease life (`0`: no key is). A key nothing is known of is not (its
    /// requests are counted before this is asked).
    pub(crate) fn is_cold(&self, now: Nanos, life: Nanos, cold_below: u64) -> bool {
        self.is_known() && self.expected(now, life) < cold_below
    }

    /// The tokens to ask for in a refill: what the key is expected to spend over the
    /// lease's life, at least `min_tokens` and at most the policy's `size` (a key
    /// nothing is known of asks for `size`).
    pub(crate) fn ask(&self, now: Nanos, life: Nanos, min_tokens: u64, size: u64) -> u64 {
        if !self.is_known() {
            return size;
        }
        self.expected(now, life).clamp(min_tokens.min(size), size)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIFE: Nanos = Nanos(1000);
    /// The default bound.
    const COLD_BELOW: u64 = 4;

    fn at(n: u64) -> Nanos {
        Nanos(1_000_000 + n)
    }

    #[test]
    fn nothing_known_is_neither_cold_nor_sized() {
        let demand = Demand::default();
        assert!(!demand.is_cold(at(0), LIFE, COLD_BELOW));
        assert_eq!(demand.ask(at(0), LIFE, 1, 50), 50);
    }

    #[test]
    fn fewer_units_per_life_than_the_bound_are_cold_and_the_bound_is_not() {
        let mut demand = Demand::default();
        demand.note(COLD_BELOW - 1, at(0), LIFE);
        assert!(demand.is_cold(at(10), LIFE, COLD_BELOW), "one unit short over the last life");
        demand.note(1, at(500), LIFE);
        assert!(!demand.is_cold(at(600), LIFE, COLD_BELOW), "the bound");
    }

    #[test]
    fn demand_slides_out_over_one_life_and_is_gone_after_two() {
        let mut demand = Demand::default();
        demand.note(10, at(0), LIFE);
        assert_eq!(demand.expected(at(999), LIFE), 11, "in its first life, at its rate: ten in 0.999 of one");
        assert_eq!(demand.expected(at(1000), LIFE), 10, "the whole previous interval still counts");
        assert_eq!(demand.expected(at(1500), LIFE), 5, "half of it");
        assert_eq!(demand.expected(at(1999), LIFE), 1, "rounded up");
        assert_eq!(demand.expected(at(2000), LIFE), 0);
        assert!(demand.is_cold(at(5000), LIFE, COLD_BELOW), "a key that went quiet is cold");
    }

    #[test]
    fn a_refill_asks_for_the_expected_demand_between_the_waiters_cost_and_the_size() {
        let mut demand = Demand::default();
        demand.note(7, at(0), LIFE);
        // A life later: seven over the last life.
        assert_eq!(demand.ask(at(1000), LIFE, 1, 50), 7);
        assert_eq!(demand.ask(at(1000), LIFE, 9, 50), 9, "at least what a waiter costs");
        assert_eq!(demand.ask(at(1000), LIFE, 1, 5), 5, "at most the policy's size");
        assert_eq!(demand.ask(at(1000), LIFE, 9, 5), 5, "a waiter above the size gets the size");
    }

    #[test]
    fn a_key_that_just_arrived_busy_is_expected_to_go_on_at_its_rate() {
        let mut demand = Demand::default();
        demand.note(PROJECTED_FROM, at(0), LIFE);
        assert_eq!(demand.expected(at(0), LIFE), 400, "four units within a hundredth of a life");
        assert_eq!(demand.expected(at(500), LIFE), 8, "four in half a life");
        let mut quiet = Demand::default();
        quiet.note(PROJECTED_FROM - 1, at(0), LIFE);
        assert_eq!(quiet.expected(at(0), LIFE), PROJECTED_FROM - 1, "too few units to read a rate from");
    }

    #[test]
    fn a_bound_of_zero_makes_no_key_cold() {
        let mut demand = Demand::default();
        demand.note(1, at(0), LIFE);
        assert!(demand.is_cold(at(0), LIFE, 2), "one unit under a bound of two");
        assert!(!demand.is_cold(at(0), LIFE, 0));
        assert!(!demand.is_cold(at(5000), LIFE, 0), "not even once it went quiet");
    }

    #[test]
    fn a_clock_that_steps_back_keeps_what_was_counted() {
        let mut demand = Demand::default();
        demand.note(2, at(500), LIFE);
        demand.note(1, at(100), LIFE);
        assert_eq!(demand.expected(at(500), LIFE), 3);
    }
}
