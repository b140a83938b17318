//! Where the tests' randomness comes from: SplitMix64, seeded by the test.
//!
//! Hand-written rather than a crate's: the fleet simulation needs a generator whose
//! sequence is fixed forever (a seed printed today must replay the same run after any
//! dependency upgrade), and SplitMix64 is ten lines with a published reference sequence
//! (checked below). It builds for every target, `wasm32-unknown-unknown` included.

/// A deterministic pseudo-random sequence.
#[derive(Clone, Debug)]
pub struct Rng(u64);

impl Rng {
    /// The sequence of `seed` (any value, 0 included).
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (0 when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 { 0 } else { self.next_u64() % n }
    }

    /// A number in `lo..=hi`.
    pub fn between(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.below(hi.saturating_sub(lo) + 1)
    }

    /// True with probability `percent` / 100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    /// One of `items`.
    ///
    /// # Panics
    /// When `items` is empty.
    pub fn pick<T: Clone>(&mut self, items: &[T]) -> T {
        let index = usize::try_from(self.below(items.len() as u64)).expect("an index below a slice's length");
        items[index].clone()
    }

    /// A generator of its own, derived from this one (so that adding draws to one part
    /// of a simulation does not shift another's).
    pub fn fork(&mut self) -> Self {
        Self(self.next_u64())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sequence_is_splitmix64s_reference_sequence() {
        // From the reference implementation (Vigna), seed 1234567.
        let mut rng = Rng::new(1_234_567);
        let first: Vec<u64> = (0..3).map(|_| rng.next_u64()).collect();

        assert_eq!(first, [6_457_827_717_110_365_317, 3_203_168_211_198_807_973, 9_817_491_932_198_370_423]);
    }
}
