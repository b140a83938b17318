//! Whether a sequence of admissions stayed within a token bucket: the exact reference
//! they are replayed through, a token bucket (GCRA) in integer arithmetic, written
//! independently of `shared-store`'s implementation (this crate depends on no workspace
//! crate), so that a bug there cannot hide itself here.
//!
//! A bucket of `amount` tokens per `per_ns` nanoseconds holding `burst` starts full; a
//! sequence of admissions is within the limit exactly when this bucket, fed them in time
//! order, accepts every one.
//!
//! # Real time
//!
//! In a real Envoy the moment of a decision is not observable: it lies between the
//! request's send and its response's receipt. Replaying admissions at their receipt
//! times shifts each by at most `ε`, the longest round trip seen, and a token bucket of
//! burst `b` and rate `r` admits a shifted sequence only if a bucket of burst
//! `b + r·ε` admits the original one: any interval of the shifted sequence holds events
//! of an interval `ε` longer of the original. [`latency_slack`] gives that allowance
//! (whole tokens, rounded up), so the oracle never blames the filter for the test's
//! own timing, and stays exact when the rate is small against `1/ε`.

/// A token bucket with `amount` tokens per `per_ns` nanoseconds and capacity `burst`.
#[derive(Clone, Debug)]
pub struct ReferenceBucket {
    amount: u128,
    per_ns: u128,
    burst: u128,
    /// Theoretical arrival time, in units of `1 / amount` ns.
    tat: u128,
}

/// One admission to replay: a time in nanoseconds (cost 1), or a time and a cost.
pub trait Admission: Ord + Copy {
    /// When it was admitted (ns) and what it cost.
    fn at_and_cost(self) -> (u64, u64);
}

impl Admission for u64 {
    fn at_and_cost(self) -> (u64, u64) {
        (self, 1)
    }
}

impl Admission for (u64, u64) {
    fn at_and_cost(self) -> (u64, u64) {
        self
    }
}

impl ReferenceBucket {
    /// A full bucket.
    ///
    /// # Panics
    /// When a number is zero.
    pub fn new(amount: u64, per_ns: u64, burst: u64) -> Self {
        assert!(amount > 0 && per_ns > 0 && burst > 0, "a reference bucket needs positive numbers");
        Self { amount: u128::from(amount), per_ns: u128::from(per_ns), burst: u128::from(burst), tat: 0 }
    }

    /// The debt at `now_ns` (credit already spent, in units of `1 / amount` ns) and the
    /// time the debt counts from.
    fn debt(&self, now_ns: u64) -> (u128, u128) {
        let now = u128::from(now_ns) * self.amount;
        (self.tat.max(now) - now, self.tat.max(now))
    }

    /// Whether `cost` is admitted at `now_ns`; records it if so.
    pub fn admit(&mut self, now_ns: u64, cost: u64) -> bool {
        let (debt, base) = self.debt(now_ns);
        let spend = u128::from(cost) * self.per_ns;
        if debt + spend > self.burst * self.per_ns {
            return false;
        }
        self.tat = base + spend;
        true
    }

    /// Records `cost` spent at `now_ns` whether or not it fits (an admission the code
    /// under test made anyway: the replay goes on from what really happened).
    pub fn charge(&mut self, now_ns: u64, cost: u64) {
        let (_, base) = self.debt(now_ns);
        self.tat = base + u128::from(cost) * self.per_ns;
    }

    /// Gives back `units` spent earlier, at `now_ns`: never more than a full bucket.
    pub fn credit(&mut self, now_ns: u64, units: u64) {
        let now = u128::from(now_ns) * self.amount;
        if self.tat > now {
            self.tat = self.tat.saturating_sub(u128::from(units) * self.per_ns).max(now);
        }
    }

    /// Whole units by which the bucket is past empty at `now_ns` (rounded up), after
    /// [`ReferenceBucket::charge`]s that did not fit: how far the admissions replayed so
    /// far went past `burst + rate × T` over the worst interval that ends now (0 when
    /// every one of them fitted).
    pub fn overdraft(&self, now_ns: u64) -> u64 {
        let (debt, _) = self.debt(now_ns);
        let over = debt.saturating_sub(self.burst * self.per_ns);
        u64::try_from(over.div_ceil(self.per_ns)).unwrap_or(u64::MAX)
    }

    /// Whole tokens left at `now_ns`.
    pub fn remaining(&self, now_ns: u64) -> u64 {
        let (debt, _) = self.debt(now_ns);
        u64::try_from((self.burst * self.per_ns).saturating_sub(debt) / self.per_ns).unwrap_or(u64::MAX)
    }

    /// Nanoseconds from `now_ns` until the bucket is full again (rounded up).
    pub fn reset_after_ns(&self, now_ns: u64) -> u64 {
        let (debt, _) = self.debt(now_ns);
        u64::try_from(debt.div_ceil(self.amount)).unwrap_or(u64::MAX)
    }

    /// Replays `admits` (in any order: they are sorted first) through this bucket;
    /// returns how many it would not have admitted.
    pub fn over_admitted<A: Admission>(&mut self, admits: &mut [A]) -> u64 {
        admits.sort_unstable();
        admits
            .iter()
            .map(|admission| {
                let (at, cost) = admission.at_and_cost();
                u64::from(!self.admit(at, cost))
            })
            .sum()
    }
}

/// The burst allowance for replaying at receipt times: `⌈amount · ε / per⌉` tokens for
/// a longest round trip of `max_latency_ns` (see the module docs).
pub fn latency_slack(amount: u64, per_ns: u64, max_latency_ns: u64) -> u64 {
    let tokens = u128::from(amount) * u128::from(max_latency_ns);
    u64::try_from(tokens.div_ceil(u128::from(per_ns))).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const SECOND: u64 = 1_000_000_000;

    #[test]
    fn a_full_bucket_admits_its_burst_then_one_per_interval() {
        let mut bucket = ReferenceBucket::new(2, SECOND, 3);
        let at_once: Vec<bool> = (0..4).map(|_| bucket.admit(10 * SECOND, 1)).collect();

        assert_eq!(at_once, [true, true, true, false]);
        assert!(!bucket.admit(10 * SECOND + SECOND / 2 - 1, 1));
        assert!(bucket.admit(10 * SECOND + SECOND / 2, 1));
    }

    #[test]
    fn one_admission_too_many_is_caught() {
        let mut admits: Vec<u64> = (0..6).map(|i| 5 * SECOND + i).collect();

        assert_eq!(ReferenceBucket::new(1, SECOND, 5).over_admitted(&mut admits), 1);
    }

    #[test]
    fn costs_count_as_that_many_tokens_and_a_cost_above_the_burst_never_fits() {
        let mut admits = vec![(SECOND, 3), (SECOND, 2), (SECOND, 1), (3 * SECOND, 6)];

        assert_eq!(ReferenceBucket::new(1, SECOND, 5).over_admitted(&mut admits), 2);
    }

    #[test]
    fn a_charge_spends_beyond_the_burst_and_the_bucket_refills_from_there() {
        let mut bucket = ReferenceBucket::new(1, SECOND, 2);
        bucket.charge(SECOND, 3);

        assert_eq!((bucket.remaining(SECOND), bucket.reset_after_ns(SECOND)), (0, 3 * SECOND));
        assert!(!bucket.admit(2 * SECOND, 1), "a second later it is still empty");
        assert_eq!((bucket.remaining(3 * SECOND), bucket.reset_after_ns(3 * SECOND)), (1, SECOND));
        assert!(bucket.admit(3 * SECOND, 1));
    }

    #[test]
    fn the_overdraft_is_what_charges_took_past_empty_and_it_refills_at_the_rate() {
        let mut bucket = ReferenceBucket::new(2, SECOND, 4);
        bucket.charge(SECOND, 4);
        assert_eq!(bucket.overdraft(SECOND), 0, "empty, not past it");

        bucket.charge(SECOND, 3);

        assert_eq!(bucket.overdraft(SECOND), 3);
        assert_eq!(bucket.overdraft(SECOND + SECOND / 2), 2, "one token refilled");
        assert_eq!(bucket.overdraft(SECOND + SECOND / 2 + 1), 2, "a part of a token past empty counts whole");
        assert_eq!(bucket.overdraft(3 * SECOND), 0);
    }

    #[test]
    fn remaining_is_whole_tokens_and_the_reset_rounds_up() {
        let mut bucket = ReferenceBucket::new(3, SECOND, 4);
        assert!(bucket.admit(SECOND, 2));

        assert_eq!(bucket.remaining(SECOND), 2);
        assert_eq!(bucket.reset_after_ns(SECOND), 666_666_667, "2 tokens at 3 per second");
        assert_eq!(bucket.remaining(SECOND + 333_333_333), 2, "a third of a token short of 3");
        assert_eq!(bucket.remaining(SECOND + 333_333_334), 3);
    }

    #[test]
    fn slack_covers_the_refill_during_the_longest_round_trip() {
        assert_eq!(latency_slack(10, SECOND, 50_000_000), 1);
        assert_eq!(latency_slack(10, SECOND, 250_000_000), 3);
        assert_eq!(latency_slack(10, SECOND, 0), 0);
    }
}
