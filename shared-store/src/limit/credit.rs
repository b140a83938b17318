//! Giving back what an admission spent but did not use: a request admitted on an
//! estimate of its cost (a language model's `max_tokens`) whose actual cost, known only
//! after the response, was smaller. The other direction, an actual cost above the
//! estimate, is [`Limit::charge`] of the difference.
//!
//! A credit never makes a limit hold more than it can (a full bucket, an empty window),
//! and never reaches a window the spend no longer counts in. It is exact for windows,
//! whose counters commute. A bucket does not record when its tokens were spent: if it
//! filled up to its burst while the request ran, refill that a bucket charged only the
//! actual cost would have lost to the burst cap is, in this one, still owed, and the
//! credit pays it back. So a bucket's credit can exceed what an exact replay would hold
//! by at most the credit itself, and only when the bucket was full at some moment of
//! the request's life: summed over time, a token bucket with costs settled this way
//! admits at most `burst + rate × T` plus the unused estimates of the requests in flight
//! at any one moment (the bound the filter states for response costs).

use super::token_bucket::Gcra;
use super::{Limit, State};
use crate::time::Nanos;

impl Limit {
    /// Gives back `units` that were spent at `spent_at` and turned out unused, at `now`.
    /// Returns the state to store, which equals `state` when there is nothing to give
    /// back, and the units given back: all of them, or fewer when the limit could take
    /// fewer (a bucket that refilled meanwhile, a count lower than `units`); whole units,
    /// a bucket's partly refilled token counting as one. `None` for the algorithms that
    /// cannot be credited: a leaky bucket (a shaper's state is its queue, and the request
    /// has left it) and a sliding log (its entries are not addressable by request). Pure,
    /// like [`Limit::decide`].
    ///
    /// | algorithm | after the credit |
    /// |---|---|
    /// | token bucket | `units` more tokens, never more than the burst |
    /// | fixed window | `units` fewer counted, if `spent_at` is in the window of `now` (and of the state) |
    /// | sliding window | `units` fewer counted in the window `spent_at` fell in, if that is the window of `now` or the one before it |
    pub fn credit(&self, state: &State, spent_at: Nanos, now: Nanos, units: u64) -> Option<(State, u64)> {
        let nothing = || (state.clone(), 0);
        match (*self, state) {
            (Self::TokenBucket { rate, burst }, State::Gcra { tat }) => {
                let (tat, credited) = Gcra::new(rate, burst).credit(*tat, now, units);
                Some((State::Gcra { tat }, credited))
            }
            (Self::FixedWindow { window, .. }, State::Window { index, count, previous }) => {
                let (spent_in, current) = (spent_at.0 / window.0.max(1), now.0 / window.0.max(1));
                Some(if *index == spent_in && spent_in == current {
                    let credited = units.min(*count);
                    (State::Window { index: *index, count: count - credited, previous: *previous }, credited)
                } else {
                    nothing()
                })
            }
            (Self::SlidingWindow { window, .. }, State::Window { index, count, previous }) => {
                let (spent_in, current) = (spent_at.0 / window.0.max(1), now.0 / window.0.max(1));
                // The trailing window at `now` reaches back into the previous window, no
                // further.
                let counts = spent_in == current || spent_in.checked_add(1) == Some(current);
                Some(if !counts {
                    nothing()
                } else if *index == spent_in {
                    let credited = units.min(*count);
                    (State::Window { index: *index, count: count - credited, previous: *previous }, credited)
                } else if spent_in.checked_add(1) == Some(*index) {
                    let credited = units.min(*previous);
                    (State::Window { index: *index, count: *count, previous: previous - credited }, credited)
                } else {
                    nothing()
                })
            }
            (Self::TokenBucket { .. } | Self::FixedWindow { .. } | Self::SlidingWindow { .. }, _) => Some(nothing()),
            (Self::LeakyBucket { .. } | Self::SlidingLog { .. } | Self::Concurrency { .. }, _) => None,
        }
    }

    /// Whether [`Limit::credit`] can give back to this algorithm.
    pub const fn can_credit(&self) -> bool {
        matches!(self, Self::TokenBucket { .. } | Self::FixedWindow { .. } | Self::SlidingWindow { .. })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::Rate;
    use crate::limit::tests::{MS, S, T0, at, bucket};

    #[test]
    fn a_bucket_credited_gets_its_unused_tokens_back_and_never_more_than_its_burst() {
        // 5 tokens, 100 ms each: 4 spent on an estimate, 1 of them used.
        let (_, spent) = bucket().decide(None, T0, 4);
        let (credited, back) = bucket().credit(&spent.unwrap(), T0, T0, 3).expect("a bucket can be credited");
        let (overfull, more) = bucket().credit(&credited, T0, T0, 10).expect("a bucket can be credited");

        assert_eq!((bucket().status(Some(&credited), T0).remaining, back), (4, 3));
        assert_eq!(bucket().status(Some(&overfull), T0).remaining, 5, "never above the burst");
        assert_eq!(more, 1, "only the one token missing was given back, not 10");
    }

    #[test]
    fn a_bucket_that_refilled_meanwhile_is_credited_only_up_to_full_and_says_how_much() {
        let (_, spent) = bucket().decide(None, T0, 4);
        // 250 ms later two and a half tokens are back: a credit of 3 tops it up to full,
        // giving back the one and a half missing (two whole tokens, the partial one counted).
        let (credited, back) = bucket().credit(&spent.unwrap(), T0, at(250 * MS), 3).expect("credited");

        assert_eq!(bucket().status(Some(&credited), at(250 * MS)).remaining, 5);
        assert_eq!(back, 2);
    }

    #[test]
    fn a_window_is_credited_in_the_window_the_spend_counted_in_and_nowhere_else() {
        let fixed = Limit::fixed_window(10, Nanos(S)).unwrap();
        // The start of a window.
        let start = Nanos(2000 * S);
        let (_, spent) = fixed.decide(None, start, 6);
        let spent = spent.unwrap();

        let (same, back) = fixed.credit(&spent, start, Nanos(start.0 + 500 * MS), 4).unwrap();
        let later = fixed.decide(Some(&spent), Nanos(start.0 + S), 1).1.unwrap();
        let next = fixed.credit(&later, start, Nanos(start.0 + S), 4).unwrap();
        let unwritten = fixed.credit(&spent, start, Nanos(start.0 + S), 4).unwrap();
        let beyond = fixed.credit(&same, start, Nanos(start.0 + 500 * MS), 9).unwrap();

        assert_eq!((fixed.status(Some(&same), Nanos(start.0 + 500 * MS)).remaining, back), (8, 4));
        assert_eq!(next, (later, 0), "the window that counted the spend is gone: nothing to give back");
        assert_eq!(unwritten, (spent, 0), "gone too when nothing was written since");
        assert_eq!(beyond.1, 2, "a count of 2 gives back 2 of the 9 asked");
    }

    #[test]
    fn a_sliding_window_is_credited_in_the_previous_window_once_it_has_moved_on() {
        let sliding = Limit::sliding_window(10, Nanos(S)).unwrap();
        let start = Nanos(2000 * S);
        let (_, spent) = sliding.decide(None, start, 6);
        let moved = sliding.decide(spent.as_ref(), Nanos(start.0 + S), 1).1.unwrap();

        let credited = sliding.credit(&moved, start, Nanos(start.0 + S), 4).unwrap();

        assert_eq!(credited, (State::Window { index: 2001, count: 1, previous: 2 }, 4));
        let unwritten = sliding.credit(&spent.clone().unwrap(), start, Nanos(start.0 + S), 4).unwrap();
        assert_eq!(unwritten.0, State::Window { index: 2000, count: 2, previous: 0 }, "still in the trailing window");
        let gone = sliding.credit(&spent.unwrap(), start, Nanos(start.0 + 2 * S), 4).unwrap();
        assert_eq!(gone, (State::Window { index: 2000, count: 6, previous: 0 }, 0), "two windows on: nothing back");
    }

    #[test]
    fn shapers_and_logs_cannot_be_credited() {
        let leaky = Limit::leaky_bucket(Rate::new(10, Nanos(S)).unwrap(), 5, Nanos(S)).unwrap();
        let log = Limit::sliding_log(10, Nanos(S)).unwrap();

        assert_eq!(leaky.credit(&leaky.fresh(), T0, T0, 1), None);
        assert_eq!(log.credit(&log.fresh(), T0, T0, 1), None);
        assert!(!leaky.can_credit() && !log.can_credit() && bucket().can_credit());
    }
}
