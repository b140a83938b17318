//! The exact reference every admission is replayed through: a token bucket (GCRA) in
//! integer arithmetic, independent of `shared-store`'s implementation.
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

impl ReferenceBucket {
    /// A full bucket.
    pub fn new(amount: u64, per_ns: u64, burst: u64) -> Self {
        assert!(amount > 0 && per_ns > 0 && burst > 0, "a reference bucket needs positive numbers");
        Self { amount: u128::from(amount), per_ns: u128::from(per_ns), burst: u128::from(burst), tat: 0 }
    }

    /// Whether `cost` is admitted at `now_ns`; records it if so.
    pub fn admit(&mut self, now_ns: u64, cost: u64) -> bool {
        let now = u128::from(now_ns) * self.amount;
        let tat = self.tat.max(now);
        let spend = u128::from(cost) * self.per_ns;
        if tat + spend - now > self.burst * self.per_ns {
            return false;
        }
        self.tat = tat + spend;
        true
    }
}

/// Replays admissions (times in ns, any order) through `bucket`; returns how many it
/// would not have admitted.
pub fn over_admitted(bucket: &mut ReferenceBucket, admits: &mut [u64]) -> u64 {
    admits.sort_unstable();
    admits.iter().map(|&at| u64::from(!bucket.admit(at, 1))).sum()
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

        assert_eq!(over_admitted(&mut ReferenceBucket::new(1, SECOND, 5), &mut admits), 1);
    }

    #[test]
    fn slack_covers_the_refill_during_the_longest_round_trip() {
        assert_eq!(latency_slack(10, SECOND, 50_000_000), 1);
        assert_eq!(latency_slack(10, SECOND, 250_000_000), 3);
        assert_eq!(latency_slack(10, SECOND, 0), 0);
    }
}
