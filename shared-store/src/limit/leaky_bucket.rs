//! The leaky bucket: how a shaper that delays requests so they leave at a rate is built.
//! It decides on the token bucket's GCRA arithmetic (`Gcra::step` in `token_bucket.rs`,
//! given a longest wait) and is never charged.

use super::{InvalidLimit, Limit, Rate};
use crate::time::Nanos;

impl Limit {
    /// A shaper draining at `rate`, queueing at most `max_queue` units and delaying no
    /// request longer than `max_wait`.
    ///
    /// # Errors
    /// [`InvalidLimit::ZeroCapacity`] when `max_queue` is zero.
    pub const fn leaky_bucket(rate: Rate, max_queue: u64, max_wait: Nanos) -> Result<Self, InvalidLimit> {
        if max_queue == 0 {
            Err(InvalidLimit::ZeroCapacity)
        } else {
            Ok(Self::LeakyBucket { rate, max_queue, max_wait })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::tests::{S, T0};

    #[test]
    fn a_leaky_bucket_is_never_charged() {
        let limit = Limit::leaky_bucket(Rate::new(1, Nanos(S)).unwrap(), 3, Nanos(S)).unwrap();

        let (state, charged) = limit.charge(None, T0, 2, 3);

        assert_eq!((state, charged), (limit.fresh(), 0));
    }
}
