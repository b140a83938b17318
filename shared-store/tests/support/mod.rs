//! Oracles shared by the property and concurrency tests.
#![allow(dead_code)]

/// An exact token bucket, written independently of the crate's GCRA: tokens are kept as
/// an integer count of `1 / per` token units and refill by `amount` units per
/// nanosecond. It starts full. A sequence of admissions is within the limit exactly when
/// this bucket, fed the admissions in time order, accepts every one of them.
pub struct ReferenceBucket {
    amount: u128,
    per: u128,
    capacity: u128,
    units: u128,
    last: u64,
}

impl ReferenceBucket {
    pub fn new(amount: u64, per: u64, burst: u64) -> Self {
        let capacity = u128::from(burst) * u128::from(per);
        Self { amount: u128::from(amount), per: u128::from(per), capacity, units: capacity, last: 0 }
    }

    /// Offers `cost` at `at` (which must not go backwards). True if the bucket accepts it.
    pub fn offer(&mut self, at: u64, cost: u64) -> bool {
        assert!(at >= self.last, "the reference is fed in time order");
        let refill = u128::from(at - self.last).saturating_mul(self.amount);
        self.units = self.units.saturating_add(refill).min(self.capacity);
        self.last = at;
        let need = u128::from(cost) * self.per;
        if self.units >= need {
            self.units -= need;
            true
        } else {
            false
        }
    }
}

/// Replays admissions `(at, cost)` in time order through a [`ReferenceBucket`] and
/// returns how many it rejects: the over-admission.
pub fn over_admission(amount: u64, per: u64, burst: u64, admits: &mut [(u64, u64)]) -> usize {
    admits.sort_unstable();
    let mut reference = ReferenceBucket::new(amount, per, burst);
    admits.iter().filter(|(at, cost)| !reference.offer(*at, *cost)).count()
}

/// A small deterministic generator (xorshift64*), so stress tests need no dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    pub fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}
