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
    /// Returns the state to store; it equals `state` when there is nothing to give back.
    /// `None` for the algorithms that cannot be credited: a leaky bucket (a shaper's
    /// state is its queue, and the request has left it) and a sliding log (its entries
    /// are not addressable by request). Pure, like [`Limit::decide`].
    ///
    /// | algorithm | after the credit |
    /// |---|---|
    /// | token bucket | `units` more tokens, never more than the burst |
    /// | fixed window | `units` fewer counted, if `spent_at` is in the window of `now` (and of the state) |
    /// | sliding window | `units` fewer counted in the window `spent_at` fell in, if that is the window of `now` or the one before it |
    pub fn credit(&self, state: &State, spent_at: Nanos, now: Nanos, units: u64) -> Option<State> {
        match (*self, state) {
            (Self::TokenBucket { rate, burst }, State::Gcra { tat }) => {
                Some(State::Gcra { tat: Gcra::new(rate, burst).credit(*tat, now, units) })
            }
            (Self::FixedWindow { window, .. }, State::Window { index, count, previous }) => {
                let (spent_in, current) = (spent_at.0 / window.0.max(1), now.0 / window.0.max(1));
                Some(if *index == spent_in && spent_in == current {
                    State::Window { index: *index, count: count.saturating_sub(units), previous: *previous }
                } else {
                    state.clone()
                })
            }
            (Self::SlidingWindow { window, .. }, State::Window { index, count, previous }) => {
                let (spent_in, current) = (spent_at.0 / window.0.max(1), now.0 / window.0.max(1));
                // The trailing window at `now` reaches back into the previous window, no
                // further.
                let counts = spent_in == current || spent_in.checked_add(1) == Some(current);
                Some(if !counts {
                    state.clone()
                } else if *index == spent_in {
                    State::Window { index: *index, count: count.saturating_sub(units), previous: *previous }
                } else if spent_in.checked_add(1) == Some(*index) {
                    State::Window { index: *index, count: *count, previous: previous.saturating_sub(units) }
                } else {
                    state.clone()
                })
            }
            (Self::TokenBucket { .. } | Self::FixedWindow { .. } | Self::SlidingWindow { .. }, _) => {
                Some(state.clone())
            }
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
        let credited = bucket().credit(&spent.unwrap(), T0, T0, 3).expect("a bucket can be credited");
        let overfull = bucket().credit(&credited, T0, T0, 10).expect("a bucket can be credited");

        assert_eq!(bucket().status(Some(&credited), T0).remaining, 4);
        assert_eq!(bucket().status(Some(&overfull), T0).remaining, 5, "never above the burst");
    }

    #[test]
    fn a_bucket_that_refilled_meanwhile_is_credited_only_up_to_full() {
        let (_, spent) = bucket().decide(None, T0, 4);
        // 300 ms later three tokens are back: the credit of 3 tops it up to full.
        let credited = bucket().credit(&spent.unwrap(), T0, at(300 * MS), 3).expect("credited");

        assert_eq!(bucket().status(Some(&credited), at(300 * MS)).remaining, 5);
    }

    #[test]
    fn a_window_is_credited_in_the_window_the_spend_counted_in_and_nowhere_else() {
        let fixed = Limit::fixed_window(10, Nanos(S)).unwrap();
        // The start of a window.
        let start = Nanos(2000 * S);
        let (_, spent) = fixed.decide(None, start, 6);
        let spent = spent.unwrap();

        let same = fixed.credit(&spent, start, Nanos(start.0 + 500 * MS), 4).unwrap();
        let later = fixed.decide(Some(&spent), Nanos(start.0 + S), 1).1.unwrap();
        let next = fixed.credit(&later, start, Nanos(start.0 + S), 4).unwrap();
        let unwritten = fixed.credit(&spent, start, Nanos(start.0 + S), 4).unwrap();

        assert_eq!(fixed.status(Some(&same), Nanos(start.0 + 500 * MS)).remaining, 8);
        assert_eq!(next, later, "the window that counted the spend is gone: nothing to give back");
        assert_eq!(unwritten, spent, "gone too when nothing was written since");
    }

    #[test]
    fn a_sliding_window_is_credited_in_the_previous_window_once_it_has_moved_on() {
        let sliding = Limit::sliding_window(10, Nanos(S)).unwrap();
        let start = Nanos(2000 * S);
        let (_, spent) = sliding.decide(None, start, 6);
        let moved = sliding.decide(spent.as_ref(), Nanos(start.0 + S), 1).1.unwrap();

        let credited = sliding.credit(&moved, start, Nanos(start.0 + S), 4).unwrap();

        assert_eq!(credited, State::Window { index: 2001, count: 1, previous: 2 });
        let unwritten = sliding.credit(&spent.clone().unwrap(), start, Nanos(start.0 + S), 4).unwrap();
        assert_eq!(unwritten, State::Window { index: 2000, count: 2, previous: 0 }, "still in the trailing window");
        let gone = sliding.credit(&spent.unwrap(), start, Nanos(start.0 + 2 * S), 4).unwrap();
        assert_eq!(gone, State::Window { index: 2000, count: 6, previous: 0 }, "two windows on: nothing to give back");
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
