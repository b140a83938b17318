//! The bound a counter's numbers state, replayed exactly: every unit admitted (a check's
//! cost, a grant, a charge of a cost reported above its estimate, a local bucket's
//! spend) is spent in a replay of the numbers, whether or not they had room for it, and
//! the replay says by how many units the counter has gone past what the READMEs promise
//! for those numbers:
//!
//! | algorithm | the promise | past it |
//! |---|---|---|
//! | token bucket | any interval `T` admits at most `burst + rate × T` | the reference bucket's debt beyond its burst ([`ReferenceBucket::overdraft`]) |
//! | leaky bucket | requests leave at `rate`, at most `queue` units waiting | the same, with `queue` as the burst |
//! | fixed window | at most `limit` per aligned window | the window's count beyond `limit` |
//! | sliding window | the count of each aligned window is at most `limit` | the same |
//! | sliding log | at most `limit` in any trailing window | the trailing window's count beyond `limit` |
//!
//! A counter may owe a bounded debt (charges of costs reported above the estimates, or of
//! admissions made without the service): the caller of [`Replay::spend`] compares what it
//! returns with that bound plus what was counted as forgiven. A credit gives units back
//! as the READMEs say the service and the filter do: to a bucket never above full, to the
//! window the units were spent in.

use crate::fleet::scenario::Algorithm;
use sluice_testkit::bucket::ReferenceBucket;
use std::collections::{BTreeMap, VecDeque};

const MS: u64 = 1_000_000;

/// One counter's numbers, replayed.
#[derive(Clone, Debug)]
pub(super) struct Replay {
    numbers: Algorithm,
    bucket: Option<ReferenceBucket>,
    /// Windows: units per window index.
    windows: BTreeMap<u64, u64>,
    /// Sliding log: (when, units), oldest first.
    log: VecDeque<(u64, u64)>,
    /// The latest time seen: a replay's time never runs backwards (nor does a store's).
    last: u64,
}

impl Replay {
    /// A fresh counter under `numbers` (a full bucket, empty windows).
    pub(super) fn new(numbers: Algorithm) -> Self {
        let bucket = match numbers {
            Algorithm::TokenBucket { rate, burst } => Some(ReferenceBucket::new(rate, 1_000_000_000, burst)),
            Algorithm::LeakyBucket { rate, queue, .. } => Some(ReferenceBucket::new(rate, 1_000_000_000, queue)),
            _ => None,
        };
        Self { numbers, bucket, windows: BTreeMap::new(), log: VecDeque::new(), last: 0 }
    }

    /// The numbers replayed.
    pub(super) const fn numbers(&self) -> Algorithm {
        self.numbers
    }

    /// Spends `units` at `at` (ns, the counter's own clock), and returns by how many units
    /// the counter is now past its numbers' bound (0 within it).
    pub(super) fn spend(&mut self, at: u64, units: u64) -> u64 {
        let at = at.max(self.last);
        self.last = at;
        match self.numbers {
            Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => self.bucket.as_mut().map_or(0, |b| {
                b.charge(at, units);
                b.overdraft(at)
            }),
            Algorithm::FixedWindow { limit, window_ms } | Algorithm::SlidingWindow { limit, window_ms } => {
                let index = at / (window_ms * MS);
                // Windows two back count for nothing any more.
                self.windows.retain(|i, _| i.saturating_add(2) > index);
                let count = self.windows.entry(index).or_insert(0);
                *count += units;
                count.saturating_sub(limit)
            }
            Algorithm::SlidingLog { limit, window_ms } => {
                while self.log.front().is_some_and(|(t, _)| t + window_ms * MS <= at) {
                    self.log.pop_front();
                }
                self.log.push_back((at, units));
                self.log.iter().map(|(_, u)| u).sum::<u64>().saturating_sub(limit)
            }
            Algorithm::Concurrency { .. } => 0,
        }
    }

    /// Whether the counter carries nothing at `at` (a full bucket, nothing counted in a
    /// window that still counts): a store may forget it then, and so may its replay.
    pub(super) fn is_idle(&self, at: u64) -> bool {
        let at = at.max(self.last);
        match self.numbers {
            Algorithm::TokenBucket { .. } | Algorithm::LeakyBucket { .. } => {
                self.bucket.as_ref().is_none_or(|b| b.reset_after_ns(at) == 0)
            }
            // A fixed window carries nothing once it has ended (the store's rule,
            // `shared_store`'s `fixed_window::is_idle`); a sliding window's previous
            // window still counts for one more.
            Algorithm::FixedWindow { window_ms, .. } => {
                let index = at / (window_ms * MS);
                self.windows.iter().all(|(i, count)| *count == 0 || *i < index)
            }
            Algorithm::SlidingWindow { window_ms, .. } => {
                let index = at / (window_ms * MS);
                self.windows.iter().all(|(i, count)| *count == 0 || i.saturating_add(1) < index)
            }
            Algorithm::SlidingLog { window_ms, .. } => self.log.iter().all(|(t, _)| t + window_ms * MS <= at),
            Algorithm::Concurrency { .. } => true,
        }
    }

    /// Gives back `units` spent at `spent_at` (the window they count in), at `at`.
    pub(super) fn credit(&mut self, at: u64, spent_at: u64, units: u64) {
        let at = at.max(self.last);
        self.last = at;
        match self.numbers {
            Algorithm::TokenBucket { .. } => {
                if let Some(bucket) = self.bucket.as_mut() {
                    bucket.credit(at, units);
                }
            }
            Algorithm::FixedWindow { window_ms, .. } | Algorithm::SlidingWindow { window_ms, .. } => {
                if let Some(count) = self.windows.get_mut(&(spent_at / (window_ms * MS))) {
                    *count = count.saturating_sub(units);
                }
            }
            // Not creditable: nothing is given back.
            Algorithm::LeakyBucket { .. } | Algorithm::SlidingLog { .. } | Algorithm::Concurrency { .. } => {}
        }
    }
}

/// A counter's replay under the loosest numbers in force, with the debt it may owe.
#[derive(Clone, Debug)]
pub(super) struct Watched {
    pub(super) replay: Replay,
    /// The debt the numbers allow (`max_debt`).
    pub(super) allowance: u64,
    /// The last things that happened to it, for findings.
    pub(super) history: VecDeque<String>,
}

impl Watched {
    pub(super) fn new(numbers: Algorithm, allowance: u64) -> Self {
        Self { replay: Replay::new(numbers), allowance, history: VecDeque::new() }
    }

    pub(super) fn note(&mut self, line: String) {
        if self.history.len() >= 40 {
            self.history.pop_front();
        }
        self.history.push_back(line);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;

    #[test]
    fn a_bucket_replay_says_how_far_admissions_went_past_burst_plus_rate_times_t() {
        let mut replay = Replay::new(Algorithm::TokenBucket { rate: 10, burst: 5 });

        assert_eq!(replay.spend(S, 5), 0);
        assert_eq!(replay.spend(S, 3), 3, "3 past a burst of 5 at once");
        assert_eq!(replay.spend(S + S / 2, 1), 0, "half a second refilled 5: 8 + 1 - 5 = 4 owed, within the burst");
    }

    #[test]
    fn a_window_replay_counts_per_aligned_window_and_a_credit_reaches_the_window_spent_in() {
        let mut replay = Replay::new(Algorithm::FixedWindow { limit: 4, window_ms: 1000 });

        assert_eq!(replay.spend(10 * S, 4), 0);
        assert_eq!(replay.spend(10 * S + S / 2, 2), 2);
        replay.credit(10 * S + S / 2, 10 * S, 2);
        assert_eq!(replay.spend(10 * S + S / 2, 0), 0);
        assert_eq!(replay.spend(11 * S, 4), 0, "a new window");
    }

    #[test]
    fn a_log_replay_counts_the_trailing_window() {
        let mut replay = Replay::new(Algorithm::SlidingLog { limit: 2, window_ms: 1000 });

        assert_eq!(replay.spend(S, 2), 0);
        assert_eq!(replay.spend(S + S / 2, 1), 1);
        assert_eq!(replay.spend(2 * S, 2), 1, "the first entry left the window; the second is still in it");
        assert_eq!(replay.spend(2 * S + S / 2, 0), 0, "and now only the third is");
    }
}
