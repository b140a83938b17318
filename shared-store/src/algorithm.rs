//! The one list of algorithms: every [`Limit`] variant has exactly one [`Algorithm`], and
//! [`Algorithm::ALL`] lists each once. What each can do (be decided by the counter
//! service, leased, charged, credited) is declared here, so the layers that offer an
//! algorithm (the filter's configuration, the wire protocol, the Redis script, the test
//! generators) derive their lists from this one instead of writing their own: a new
//! algorithm fails to compile in [`Algorithm::of`] and fails every test that iterates
//! [`Algorithm::ALL`] until each layer covers it.

use crate::limit::{Limit, Rate};
use crate::time::Nanos;

/// An algorithm, without its numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Algorithm {
    /// [`Limit::TokenBucket`].
    TokenBucket,
    /// [`Limit::LeakyBucket`].
    LeakyBucket,
    /// [`Limit::FixedWindow`].
    FixedWindow,
    /// [`Limit::SlidingWindow`].
    SlidingWindow,
    /// [`Limit::SlidingLog`].
    SlidingLog,
    /// [`Limit::Concurrency`].
    Concurrency,
}

impl Algorithm {
    /// Every algorithm, once, in declaration order.
    pub const ALL: [Self; 6] = [
        Self::TokenBucket,
        Self::LeakyBucket,
        Self::FixedWindow,
        Self::SlidingWindow,
        Self::SlidingLog,
        Self::Concurrency,
    ];

    /// The algorithm of `limit`.
    pub const fn of(limit: &Limit) -> Self {
        match limit {
            Limit::TokenBucket { .. } => Self::TokenBucket,
            Limit::LeakyBucket { .. } => Self::LeakyBucket,
            Limit::FixedWindow { .. } => Self::FixedWindow,
            Limit::SlidingWindow { .. } => Self::SlidingWindow,
            Limit::SlidingLog { .. } => Self::SlidingLog,
            Limit::Concurrency { .. } => Self::Concurrency,
        }
    }

    /// Its name in the filter's configuration and on the wire (`token_bucket`, …).
    pub const fn name(self) -> &'static str {
        match self {
            Self::TokenBucket => "token_bucket",
            Self::LeakyBucket => "leaky_bucket",
            Self::FixedWindow => "fixed_window",
            Self::SlidingWindow => "sliding_window",
            Self::SlidingLog => "sliding_log",
            Self::Concurrency => "concurrency",
        }
    }

    /// The algorithm named `name`, if any.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|a| a.name() == name)
    }

    /// Whether the counter service can decide it (a global policy, and an operator's
    /// clamp): every algorithm whose state is a count over time. A concurrency limit
    /// counts requests in flight on one proxy, which the service never sees end.
    pub const fn global(self) -> bool {
        match self {
            Self::TokenBucket | Self::LeakyBucket | Self::FixedWindow | Self::SlidingWindow | Self::SlidingLog => true,
            Self::Concurrency => false,
        }
    }

    /// Whether leased shares of it make sense: a count that a proxy can spend locally.
    /// A leaky bucket answers with delays, not a count.
    pub const fn leasable(self) -> bool {
        match self {
            Self::TokenBucket | Self::FixedWindow | Self::SlidingWindow | Self::SlidingLog => true,
            Self::LeakyBucket | Self::Concurrency => false,
        }
    }

    /// Whether it can be charged afterwards ([`Limit::charge`]): a cost reported by the
    /// response, or admissions made while the service could not be asked. A shaper's
    /// state is its queue, which requests never delayed cannot join afterwards.
    pub const fn chargeable(self) -> bool {
        match self {
            Self::TokenBucket | Self::FixedWindow | Self::SlidingWindow | Self::SlidingLog => true,
            Self::LeakyBucket | Self::Concurrency => false,
        }
    }

    /// Whether unused units can be given back ([`Limit::credit`]). A sliding log's
    /// entries are not addressable by request.
    pub const fn creditable(self) -> bool {
        match self {
            Self::TokenBucket | Self::FixedWindow | Self::SlidingWindow => true,
            Self::LeakyBucket | Self::SlidingLog | Self::Concurrency => false,
        }
    }
}

impl Algorithm {
    /// A limit of this algorithm with small numbers (2 units a second, bursts, windows and
    /// queues of 2, waits of a second): what a test that must cover every algorithm starts
    /// from.
    pub const fn example(self) -> Limit {
        // 2 a second, in lowest terms, as `Rate::new` keeps it.
        let rate = Rate::HALF_SECOND_EACH;
        let second = Nanos::from_secs(1);
        match self {
            Self::TokenBucket => Limit::TokenBucket { rate, burst: 2 },
            Self::LeakyBucket => Limit::LeakyBucket { rate, max_queue: 2, max_wait: second },
            Self::FixedWindow => Limit::FixedWindow { limit: 2, window: second },
            Self::SlidingWindow => Limit::SlidingWindow { limit: 2, window: second },
            Self::SlidingLog => Limit::SlidingLog { limit: 2, window: second },
            Self::Concurrency => Limit::Concurrency { limit: 2 },
        }
    }
}

impl std::fmt::Display for Algorithm {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One limit of each algorithm.
    fn one_of_each() -> Vec<Limit> {
        Algorithm::ALL.into_iter().map(Algorithm::example).collect()
    }

    #[test]
    fn the_list_holds_every_algorithm_once_and_each_is_named_once() {
        let of: Vec<Algorithm> = one_of_each().iter().map(Algorithm::of).collect();

        assert_eq!(of, Algorithm::ALL);
        for a in Algorithm::ALL {
            assert_eq!(Algorithm::from_name(a.name()), Some(a));
        }
        let mut names: Vec<&str> = Algorithm::ALL.iter().map(|a| a.name()).collect();
        names.dedup();
        assert_eq!(names.len(), Algorithm::ALL.len());
    }

    #[test]
    fn what_an_algorithm_can_do_is_what_its_limit_does() {
        for limit in one_of_each() {
            let algorithm = Algorithm::of(&limit);
            assert_eq!(algorithm.creditable(), limit.can_credit(), "{algorithm}");
            // A chargeable limit is charged something from a fresh state; the others never.
            let (_, charged) = limit.charge(None, Nanos::from_secs(10), 1, 0);
            assert_eq!(algorithm.chargeable(), charged == 1, "{algorithm}");
        }
    }
}
