//! The algorithms: pure functions from (state, now, cost) to a [`Decision`] and the next
//! [`State`].
//!
//! Every algorithm works in integer nanoseconds with checked or saturating arithmetic,
//! so no input (any `u64` rate, period, burst, cost or time) can panic or wrap. Where the
//! arithmetic cannot represent a result, the answer is the conservative one (reject).
//!
//! | algorithm | state | what it guarantees |
//! |---|---|---|
//! | [`Limit::token_bucket`] | one `u128` (GCRA's theoretical arrival time) | at most `burst + rate × t` in any span `t` |
//! | [`Limit::fixed_window`] | window index, count | at most `limit` per aligned window; up to `2 × limit` across a boundary |
//! | [`Limit::sliding_window`] | window index, count, previous count | weighted estimate of the trailing window ≤ `limit` |
//! | [`Limit::sliding_log`] | one entry per admitted request (≤ [`MAX_LOG_ENTRIES`]) | at most `limit` in any trailing window, exactly |
//! | [`Limit::leaky_bucket`] | one `u128` (when the queue drains) | output spaced at `rate`; queue ≤ `max_queue`, wait ≤ `max_wait` |
//! | [`Limit::concurrency`] | per holder: slots held, last renewal (≤ [`MAX_HOLDERS`]) | at most `limit` in flight, counting holders renewed within [`STALE_AFTER`] |
//!
//! The token bucket is GCRA: the state is the time at which the bucket would be full
//! again, kept in units of `1 / rate.amount` nanoseconds so that every quantity is an
//! exact integer. That makes `retry_after` exact: waiting exactly that long admits the
//! request, one nanosecond less does not.
//!
//! Time may step backwards (another worker's clock read, a host clock step): no
//! algorithm refills on it, and a step forward refills at most to capacity.
//!
//! Besides deciding, a limit can be **charged** ([`Limit::charge`]): spent without
//! asking, for requests already admitted elsewhere, down to a bounded debt below empty.

pub mod concurrency;
mod credit;
mod fixed_window;
mod leaky_bucket;
mod sliding_log;
mod sliding_window;
#[cfg(test)]
mod tests;
mod token_bucket;

use crate::decision::{Decision, Verdict};
use crate::time::Nanos;
pub use concurrency::{Holding, MAX_CONCURRENCY, MAX_HOLDERS, RENEW_EVERY, STALE_AFTER};
pub use sliding_log::{LogEntry, MAX_LOG_ENTRIES};
use token_bucket::Gcra;

/// A sustained rate: `amount` cost units every `per`.
///
/// Equal rates compare equal however they are written (`2/2s` is `1/s`): the rate is
/// kept in lowest terms, which also keeps the buckets' scaled arithmetic small and
/// spares a division on the hot path whenever `amount` divides `per`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Rate {
    amount: u64,
    per: Nanos,
}

const fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        let t = a % b;
        a = b;
        b = t;
    }
    a
}

impl Rate {
    /// One unit every 500 ms (2 a second), in lowest terms.
    pub(crate) const HALF_SECOND_EACH: Self = Self { amount: 1, per: Nanos::from_millis(500) };

    /// `amount` units every `per`; `None` if either is zero.
    pub const fn new(amount: u64, per: Nanos) -> Option<Self> {
        if amount == 0 || per.0 == 0 {
            return None;
        }
        let divisor = gcd(amount, per.0);
        Some(Self { amount: amount / divisor, per: Nanos(per.0 / divisor) })
    }

    /// Units per period, in lowest terms.
    pub const fn amount(self) -> u64 {
        self.amount
    }

    /// The period, in lowest terms.
    pub const fn per(self) -> Nanos {
        self.per
    }
}

/// Parameters a limit cannot be built from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum InvalidLimit {
    /// Burst, window limit or queue depth of zero: nothing could ever be admitted.
    ZeroCapacity,
    /// A window of zero length.
    ZeroWindow,
    /// A sliding log longer than [`MAX_LOG_ENTRIES`].
    LogTooLong,
}

impl std::fmt::Display for InvalidLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::ZeroCapacity => f.write_str("capacity must be at least 1"),
            Self::ZeroWindow => f.write_str("window must be longer than zero"),
            Self::LogTooLong => write!(f, "a sliding log holds at most {MAX_LOG_ENTRIES} requests per window"),
        }
    }
}

impl std::error::Error for InvalidLimit {}

/// One limit: an algorithm and its validated numbers.
///
/// Outside this crate a limit is built only by its constructors ([`Limit::token_bucket`],
/// …), which refuse numbers that mean nothing (a zero burst or window): every variant is
/// `#[non_exhaustive]`, so its fields can be read in a pattern (`{ rate, .. }`) but a
/// literal cannot build one. Every match on a limit in this crate names each variant, so
/// a new algorithm fails to compile wherever it must be handled ([`crate::Algorithm`] is
/// the list the other layers derive theirs from).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// Token bucket (GCRA form): refills at `rate`, holds at most `burst`.
    #[non_exhaustive]
    TokenBucket {
        /// Sustained refill rate.
        rate: Rate,
        /// Capacity: the largest burst an idle caller may spend at once.
        burst: u64,
    },
    /// At most `limit` per clock-aligned window.
    #[non_exhaustive]
    FixedWindow {
        /// Units per window.
        limit: u64,
        /// Window length.
        window: Nanos,
    },
    /// Sliding window counter: the previous window's count, weighted by how much of it
    /// still overlaps the trailing window, plus the current count.
    #[non_exhaustive]
    SlidingWindow {
        /// Units per trailing window.
        limit: u64,
        /// Window length.
        window: Nanos,
    },
    /// Sliding window log: exact count over the trailing window.
    #[non_exhaustive]
    SlidingLog {
        /// Units per trailing window, at most [`MAX_LOG_ENTRIES`].
        limit: u64,
        /// Window length.
        window: Nanos,
    },
    /// Leaky bucket as a shaper: admitted requests are delayed so they leave at `rate`.
    #[non_exhaustive]
    LeakyBucket {
        /// Drain rate.
        rate: Rate,
        /// Most units waiting at once (including the one being decided).
        max_queue: u64,
        /// Longest delay handed out.
        max_wait: Nanos,
    },
    /// At most `limit` requests in flight at once, taken on admission and given back
    /// when the request ends ([`concurrency`]).
    #[non_exhaustive]
    Concurrency {
        /// Requests in flight, at most [`MAX_CONCURRENCY`].
        limit: u64,
    },
}

/// The holder of a [`Limiter`](crate::Limiter) that was given none, and of decisions made
/// without one ([`Limit::decide`]).
pub const ANONYMOUS_HOLDER: u64 = 0;

/// The holder of the slots an exhausted concurrency state holds (in place of state that
/// could not be decoded): no limiter renews them, so they free themselves after
/// [`STALE_AFTER`].
pub const REPAIR_HOLDER: u64 = u64::MAX;

/// The state one limit keeps per key.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum State {
    /// Token and leaky bucket: the (scaled) time at which the bucket is full / the queue
    /// is empty, in units of `1 / rate.amount` ns.
    Gcra {
        /// Theoretical arrival time, scaled.
        tat: u128,
    },
    /// Fixed and sliding windows.
    Window {
        /// Index of the current window (`now / window`).
        index: u64,
        /// Units admitted in window `index`.
        count: u64,
        /// Units admitted in window `index - 1` (sliding window only).
        previous: u64,
    },
    /// Sliding log: admitted requests, oldest first.
    Log {
        /// The entries still in (or newer than) the window.
        entries: Vec<LogEntry>,
    },
    /// Concurrency: the slots each holder holds.
    Holders {
        /// One entry per holder, at most [`MAX_HOLDERS`].
        entries: Vec<Holding>,
    },
}

impl State {
    /// A bucket's theoretical arrival time, if this is a bucket's state.
    pub const fn gcra(&self) -> Option<u128> {
        match self {
            Self::Gcra { tat } => Some(*tat),
            Self::Window { .. } | Self::Log { .. } | Self::Holders { .. } => None,
        }
    }

    /// A window's `(index, count, previous)`, if this is a window's state.
    pub const fn window(&self) -> Option<(u64, u64, u64)> {
        match self {
            Self::Window { index, count, previous } => Some((*index, *count, *previous)),
            Self::Gcra { .. } | Self::Log { .. } | Self::Holders { .. } => None,
        }
    }

    /// A sliding log's entries, if this is a log's state.
    pub fn log(&self) -> Option<&[LogEntry]> {
        match self {
            Self::Log { entries } => Some(entries),
            Self::Gcra { .. } | Self::Window { .. } | Self::Holders { .. } => None,
        }
    }

    /// A concurrency limit's holders, if this is its state.
    pub fn holders(&self) -> Option<&[Holding]> {
        match self {
            Self::Holders { entries } => Some(entries),
            Self::Gcra { .. } | Self::Window { .. } | Self::Log { .. } => None,
        }
    }
}

fn ns(value: u128) -> Nanos {
    Nanos(u64::try_from(value).unwrap_or(u64::MAX))
}

/// `n / d` rounded up, with a fast path when both fit in 64 bits (the common case:
/// 128-bit division is a slow library call).
fn ceil_div(n: u128, d: u128) -> u128 {
    match (u64::try_from(n), u64::try_from(d)) {
        (_, Ok(0)) => u128::MAX,
        (Ok(n), Ok(d)) => u128::from(n.div_ceil(d)),
        _ => n.div_ceil(d),
    }
}

/// `n / d` rounded down, with the same fast path.
fn floor_div(n: u128, d: u128) -> u128 {
    match (u64::try_from(n), u64::try_from(d)) {
        (_, Ok(0)) => u128::MAX,
        (Ok(n), Ok(d)) => u128::from(n / d),
        _ => n / d,
    }
}

impl Limit {
    const fn check_window(limit: u64, window: Nanos) -> Result<(), InvalidLimit> {
        if limit == 0 {
            Err(InvalidLimit::ZeroCapacity)
        } else if window.0 == 0 {
            Err(InvalidLimit::ZeroWindow)
        } else {
            Ok(())
        }
    }

    /// The capacity reported as `limit` in decisions.
    pub const fn capacity(&self) -> u64 {
        match *self {
            Self::TokenBucket { burst, .. } => burst,
            Self::FixedWindow { limit, .. } | Self::SlidingWindow { limit, .. } | Self::SlidingLog { limit, .. } => {
                limit
            }
            Self::LeakyBucket { max_queue, .. } => max_queue,
            Self::Concurrency { limit } => limit,
        }
    }

    /// The period over which [`Limit::capacity`] is granted: the window, or the time a
    /// bucket takes to refill from empty. Used for `RateLimit-Policy`'s `w`.
    pub fn period(&self) -> Nanos {
        match *self {
            Self::TokenBucket { rate, burst } => {
                ns(ceil_div(u128::from(burst) * u128::from(rate.per.0), u128::from(rate.amount)))
            }
            Self::FixedWindow { window, .. } | Self::SlidingWindow { window, .. } | Self::SlidingLog { window, .. } => {
                window
            }
            Self::LeakyBucket { rate, max_queue, .. } => {
                ns(ceil_div(u128::from(max_queue) * u128::from(rate.per.0), u128::from(rate.amount)))
            }
            // Slots are not granted over time: they come back when requests end.
            Self::Concurrency { .. } => Nanos::ZERO,
        }
    }

    /// The state of a key never seen: a full bucket, an empty window or log.
    pub fn fresh(&self) -> State {
        match self {
            Self::TokenBucket { .. } | Self::LeakyBucket { .. } => State::Gcra { tat: 0 },
            Self::FixedWindow { .. } | Self::SlidingWindow { .. } => State::Window { index: 0, count: 0, previous: 0 },
            Self::SlidingLog { .. } => State::Log { entries: Vec::new() },
            Self::Concurrency { .. } => State::Holders { entries: Vec::new() },
        }
    }

    /// The most conservative state at `now`: nothing left to spend. Used in place of
    /// state that cannot be decoded, so that garbage never becomes a fresh full bucket.
    pub fn exhausted(&self, now: Nanos) -> State {
        match *self {
            Self::TokenBucket { rate, burst } => Gcra::new(rate, burst).exhausted(now),
            Self::LeakyBucket { rate, max_queue, .. } => Gcra::new(rate, max_queue).exhausted(now),
            Self::FixedWindow { limit, window } | Self::SlidingWindow { limit, window } => {
                State::Window { index: now.0 / window.0.max(1), count: limit, previous: limit }
            }
            Self::SlidingLog { limit, .. } => State::Log { entries: vec![LogEntry { at: now.0, cost: limit }] },
            Self::Concurrency { limit } => {
                State::Holders { entries: vec![Holding { holder: REPAIR_HOLDER, count: limit, renewed_at: now.0 }] }
            }
        }
    }

    /// Whether `state` carries no information at `now`: a full bucket, windows with
    /// nothing counted. Only such state may be given to another key (see `key`), so that
    /// flooding a slot table cannot reset anyone's bucket.
    pub fn is_idle(&self, state: &State, now: Nanos) -> bool {
        // A state of another algorithm carries what this one cannot read: never idle.
        match *self {
            Self::TokenBucket { rate, .. } | Self::LeakyBucket { rate, .. } => {
                state.gcra().is_some_and(|tat| tat <= u128::from(now.0) * u128::from(rate.amount))
            }
            Self::FixedWindow { window, .. } => {
                state.window().is_some_and(|(index, count, _)| fixed_window::is_idle(window, (index, count), now))
            }
            Self::SlidingWindow { window, .. } => {
                state.window().is_some_and(|counters| sliding_window::is_idle(window, counters, now))
            }
            Self::SlidingLog { window, .. } => {
                state.log().is_some_and(|entries| sliding_log::is_idle(window, entries, now))
            }
            Self::Concurrency { .. } => state.holders().is_some_and(|entries| concurrency::is_idle(entries, now)),
        }
    }

    /// Decides whether `cost` may be spent at `now`, given the key's `state` (`None` for
    /// a key never seen). Returns the decision and, when the request is admitted, the
    /// state to store. Pure: no clock, no store.
    ///
    /// A cost of zero is a query: it is admitted and changes nothing. A concurrency
    /// limit decides for [`ANONYMOUS_HOLDER`]; see [`Limit::decide_for`].
    pub fn decide(&self, state: Option<&State>, now: Nanos, cost: u64) -> (Decision, Option<State>) {
        self.decide_for(state, now, cost, ANONYMOUS_HOLDER)
    }

    /// [`Limit::decide`] on behalf of `holder`: a concurrency limit records the slots it
    /// grants under the holder that will give them back. Every other algorithm ignores
    /// `holder`.
    pub fn decide_for(&self, state: Option<&State>, now: Nanos, cost: u64, holder: u64) -> (Decision, Option<State>) {
        let owned;
        let state = match state {
            Some(s) if self.accepts(s) => s,
            Some(_) => {
                owned = self.exhausted(now);
                &owned
            }
            None => {
                owned = self.fresh();
                &owned
            }
        };
        // `accepts` made the state this algorithm's kind; a mismatch is unreachable, and
        // would admit nothing.
        let mismatch = || (self.rejected_forever(), None);
        match *self {
            Self::TokenBucket { rate, burst } => {
                state.gcra().map_or_else(mismatch, |tat| Gcra::new(rate, burst).step(tat, now, cost, None))
            }
            Self::LeakyBucket { rate, max_queue, max_wait } => state
                .gcra()
                .map_or_else(mismatch, |tat| Gcra::new(rate, max_queue).step(tat, now, cost, Some(max_wait))),
            Self::FixedWindow { limit, window } => state.window().map_or_else(mismatch, |(index, count, _)| {
                fixed_window::decide(limit, window, (index, count), now, cost)
            }),
            Self::SlidingWindow { limit, window } => state
                .window()
                .map_or_else(mismatch, |counters| sliding_window::decide(limit, window, counters, now, cost)),
            Self::SlidingLog { limit, window } => {
                state.log().map_or_else(mismatch, |entries| sliding_log::decide(limit, window, entries, now, cost))
            }
            Self::Concurrency { limit } => {
                state.holders().map_or_else(mismatch, |entries| concurrency::decide(limit, entries, holder, now, cost))
            }
        }
    }

    /// Spends up to `cost` at `now` unconditionally, for requests that were already
    /// admitted (by a proxy that could not reach the counter service and reports them
    /// afterwards), without ever leaving the limit more than `max_debt` units below
    /// empty. Returns the state to store and the units charged; `cost - charged` is
    /// forgiven. Pure, like [`Limit::decide`]; `state` is `None` for a key never seen.
    ///
    /// | algorithm | after the charge |
    /// |---|---|
    /// | token bucket | the theoretical arrival time is at most `burst + max_debt` emission intervals past `now` |
    /// | fixed window | this window's count is at most `limit + max_debt` (the debt ends with the window) |
    /// | sliding window | the weighted count of the trailing window is at most `limit + max_debt` |
    /// | sliding log | the live entries cost at most `limit + max_debt`, and there are at most [`MAX_LOG_ENTRIES`] of them: a charge that needs another entry when the log is full is forgiven |
    /// | leaky bucket | nothing: a shaper's state is its queue, and requests it never delayed cannot join it afterwards |
    ///
    /// Charges are in whole units, and maximal: when `charged < cost`, one more unit
    /// would have crossed the bound. A charge that fits in what is left stores exactly
    /// what a check of the same cost would. A limit below empty admits nothing until it
    /// has refilled past empty: a decision on it rejects, with the exact wait that
    /// includes the debt. When nothing is charged, the state is returned as it stands
    /// (and need not be written).
    pub fn charge(&self, state: Option<&State>, now: Nanos, cost: u64, max_debt: u64) -> (State, u64) {
        let current = match state {
            Some(s) if self.accepts(s) => s.clone(),
            Some(_) => self.exhausted(now),
            None => self.fresh(),
        };
        let charged = match *self {
            Self::TokenBucket { rate, burst } => current.gcra().and_then(|tat| {
                Gcra::new(rate, burst).charge(tat, now, cost, max_debt).map(|(tat, c)| (State::Gcra { tat }, c))
            }),
            Self::FixedWindow { limit, window } => current
                .window()
                .map(|(index, count, _)| fixed_window::charge(limit, window, (index, count), now, cost, max_debt)),
            Self::SlidingWindow { limit, window } => {
                current.window().map(|counters| sliding_window::charge(limit, window, counters, now, cost, max_debt))
            }
            Self::SlidingLog { limit, window } => {
                current.log().and_then(|entries| sliding_log::charge(limit, window, entries, now, cost, max_debt))
            }
            // A shaper's state is its queue, which requests never delayed cannot join; a
            // concurrency limit counts requests in flight, not units over time.
            Self::LeakyBucket { .. } | Self::Concurrency { .. } => None,
        };
        match charged {
            Some((next, charged)) if charged > 0 => (next, charged),
            _ => (current, 0),
        }
    }

    /// Where the limit stands at `now`, without spending: a query's answer (capacity,
    /// remaining, time until full), except that when nothing is left the verdict is
    /// [`Verdict::Rejected`] with the exact wait until one unit is admitted again. This
    /// is what a charge answers with, so that a proxy learns when a limit in debt
    /// admits again.
    pub fn status(&self, state: Option<&State>, now: Nanos) -> Decision {
        let (query, _) = self.decide(state, now, 0);
        if query.remaining > 0 {
            return query;
        }
        match self.decide(state, now, 1).0.verdict {
            verdict @ Verdict::Rejected { .. } => Decision { verdict, ..query },
            _ => query,
        }
    }

    /// Whether `state` is the kind of state this algorithm keeps.
    pub const fn accepts(&self, state: &State) -> bool {
        matches!(
            (self, state),
            (Self::TokenBucket { .. } | Self::LeakyBucket { .. }, State::Gcra { .. })
                | (Self::FixedWindow { .. } | Self::SlidingWindow { .. }, State::Window { .. })
                | (Self::SlidingLog { .. }, State::Log { .. })
                | (Self::Concurrency { .. }, State::Holders { .. })
        )
    }

    fn rejected_forever(&self) -> Decision {
        Decision { verdict: Verdict::Exceeds, limit: self.capacity(), remaining: 0, reset_after: Nanos::ZERO }
    }

    /// Gives back `cost` that an admission spent, after the request was rejected by
    /// another limit (all-or-nothing across limits) or by the counter service.
    ///
    /// `written` is the state that admission stored, `current` what the key holds now
    /// (other requests may have spent or given back since). The result is never more
    /// generous than the state the key would hold had the refunded request never been
    /// admitted:
    ///
    /// * counters (windows, logs) commute, so the refund is exact whatever happened in
    ///   between (in the same window; a window that has passed keeps its count);
    /// * a bucket (GCRA) gives back exactly when it still holds what the admission
    ///   wrote, and otherwise gives back nothing. A bucket's state does not record how
    ///   it got there: once other spends and refunds interleave, no refund computed from
    ///   the current state alone is safe (a refund of an older spend can lower the state
    ///   under a younger one, whose own refund would then count the spends in between
    ///   short: a property test found exactly that). Stricter, never looser.
    ///
    /// `None` means "cannot be given back safely" (a bucket written by someone else);
    /// `Some` is the state to write, which may equal `current` when there is nothing
    /// left to give back (the window has passed). `now` is unused by buckets and
    /// counters today; it stays in the signature so that a refund is always decided at a
    /// clock reading not earlier than the writes seen.
    pub fn refund(&self, current: &State, written: &State, now: Nanos, cost: u64) -> Option<State> {
        self.refund_for(current, written, now, cost, ANONYMOUS_HOLDER)
    }

    /// [`Limit::refund`] on behalf of `holder`: a concurrency limit gives back `cost` of
    /// the slots `holder` holds (exact, whatever other holders did in between; `now`
    /// prunes stale holders). Every other algorithm ignores `holder`.
    pub fn refund_for(&self, current: &State, written: &State, now: Nanos, cost: u64, holder: u64) -> Option<State> {
        // Either state of another kind: nothing can be given back safely, so nothing is.
        Some(match *self {
            Self::Concurrency { .. } => match current.holders() {
                Some(entries) => concurrency::release(entries, holder, now, cost),
                None => current.clone(),
            },
            Self::TokenBucket { rate, .. } | Self::LeakyBucket { rate, .. } => match (current.gcra(), written.gcra()) {
                (Some(current), Some(written)) => token_bucket::refund(rate, current, written, cost)?,
                _ => current.clone(),
            },
            Self::FixedWindow { .. } | Self::SlidingWindow { .. } => match (current.window(), written.window()) {
                (Some((index, count, previous)), Some((ours, ..))) => {
                    if index == ours {
                        State::Window { index, count: count.saturating_sub(cost), previous }
                    } else if Some(index) == ours.checked_add(1) {
                        State::Window { index, count, previous: previous.saturating_sub(cost) }
                    } else {
                        current.clone()
                    }
                }
                _ => current.clone(),
            },
            Self::SlidingLog { .. } => match (current.log(), written.log()) {
                (Some(entries), Some(ours)) => sliding_log::refund(entries, ours),
                _ => current.clone(),
            },
        })
    }

    /// Converts `state`, kept under the limit `old`, to this limit at `now`: what a key
    /// decided under other numbers (a policy changed without a version bump) holds
    /// under these. [`Limit::carry`] without what it forgave.
    pub fn adopt(&self, old: &Self, state: State, now: Nanos) -> State {
        self.carry(old, state, now).state
    }

    /// Converts `state`, kept under the limit `old`, to this limit at `now`, keeping what
    /// was spent, debt included: never looser than the old state (what it counted stays
    /// counted, what it owed stays owed), and never looser than a fresh state of this
    /// limit. Debt is kept up to this limit's capacity below empty (the most any charge
    /// may leave, `max_debt ≤ capacity`); what that drops is [`Carried::forgiven`], which
    /// the caller counts. The rule is integer-exact, so the counter service's Redis script
    /// computes the same state:
    ///
    /// * **Buckets** (token to token, leaky to leaky): the units spent are rounded up to
    ///   whole units, `spent = ceil(debt / per_old)` with `debt = tat − now` (scaled, 0
    ///   when negative); then `spent_new = max(spent + burst_new − burst_old, 0)`, at most
    ///   `2 × burst_new`, stored as `tat = now × amount_new + spent_new × per_new`. That
    ///   is, the whole units available (negative in debt) are kept, capped at the new
    ///   capacity: a smaller burst takes effect at once, a larger one fills up at the new
    ///   rate (a raise does not refill), and a debt stays owed.
    /// * **Windows** (fixed to fixed, sliding to sliding): the state is first brought to
    ///   `now` under the old limit (a fixed window older than the current one counts 0;
    ///   a sliding window's counts shift as its decision would shift them); then, if the
    ///   window length is unchanged, it is kept, and otherwise its counts are carried
    ///   into the current window of the new length. The counts are kept (each at most
    ///   `2 × limit_new`), so a larger limit leaves more room in the same window and a
    ///   count in debt stays in debt.
    /// * **Sliding log** to sliding log: the entries are kept.
    /// * **Concurrency**: the slots held stay held.
    /// * **Another algorithm**: [`Limit::exhausted`], owing what the old state owed
    ///   ([`Limit::owed`], at most the capacity): stricter, never looser.
    pub fn carry(&self, old: &Self, state: State, now: Nanos) -> Carried {
        if old == self {
            return Carried { state, forgiven: 0 };
        }
        let kept = |state| Carried { state, forgiven: 0 };
        match (*self, *old, state) {
            (
                Self::TokenBucket { rate, burst },
                Self::TokenBucket { rate: old_rate, burst: old_burst },
                State::Gcra { tat },
            ) => Gcra::new(rate, burst)
                .carry(&Gcra::new(old_rate, old_burst), tat, now)
                .unwrap_or_else(|| kept(self.exhausted(now))),
            (
                Self::LeakyBucket { rate, max_queue, .. },
                Self::LeakyBucket { rate: old_rate, max_queue: old_queue, .. },
                State::Gcra { tat },
            ) => Gcra::new(rate, max_queue)
                .carry(&Gcra::new(old_rate, old_queue), tat, now)
                .unwrap_or_else(|| kept(self.exhausted(now))),
            (
                Self::FixedWindow { limit, window },
                Self::FixedWindow { window: old_window, .. },
                State::Window { index, count, .. },
            ) => fixed_window::carry(limit, window, old_window, (index, count), now),
            (
                Self::SlidingWindow { limit, window },
                Self::SlidingWindow { window: old_window, .. },
                State::Window { index, count, previous },
            ) => sliding_window::carry(limit, window, old_window, (index, count, previous), now),
            (Self::SlidingLog { .. }, Self::SlidingLog { .. }, state @ State::Log { .. }) => kept(state),
            // What is in flight stays in flight: a new limit applies to the next request.
            (Self::Concurrency { .. }, Self::Concurrency { .. }, state @ State::Holders { .. }) => kept(state),
            (
                Self::TokenBucket { .. }
                | Self::LeakyBucket { .. }
                | Self::FixedWindow { .. }
                | Self::SlidingWindow { .. }
                | Self::SlidingLog { .. }
                | Self::Concurrency { .. },
                _,
                state,
            ) => {
                let owed = if old.accepts(&state) { old.owed(&state, now) } else { 0 };
                let (state, kept) = self.exhausted_owing(now, owed);
                Carried { state, forgiven: owed - kept }
            }
        }
    }

    /// The units `state` owes below empty at `now`: spent beyond the capacity by charges
    /// (0 for a state within its capacity, and for a shaper or a concurrency limit,
    /// which are never charged).
    pub fn owed(&self, state: &State, now: Nanos) -> u64 {
        match (*self, state) {
            (Self::TokenBucket { rate, burst }, State::Gcra { tat }) => Gcra::new(rate, burst).owed(*tat, now),
            (Self::FixedWindow { limit, window }, State::Window { index, count, .. }) => {
                if *index == now.0 / window.0.max(1) { count.saturating_sub(limit) } else { 0 }
            }
            (Self::SlidingWindow { limit, window }, State::Window { index, count, previous }) => {
                sliding_window::owed(limit, window, (*index, *count, *previous), now)
            }
            (Self::SlidingLog { limit, window }, State::Log { entries }) => entries
                .iter()
                .filter(|e| e.at.saturating_add(window.0) > now.0)
                .fold(0u64, |sum, e| sum.saturating_add(e.cost))
                .saturating_sub(limit),
            (
                Self::TokenBucket { .. }
                | Self::FixedWindow { .. }
                | Self::SlidingWindow { .. }
                | Self::SlidingLog { .. }
                | Self::LeakyBucket { .. }
                | Self::Concurrency { .. },
                _,
            ) => 0,
        }
    }

    /// [`Limit::exhausted`] at `now`, owing up to `owed` more units (at most the
    /// capacity; a concurrency limit owes nothing), and the units it owes.
    fn exhausted_owing(&self, now: Nanos, owed: u64) -> (State, u64) {
        let owed = owed.min(self.capacity());
        let exhausted = self.exhausted(now);
        match *self {
            Self::TokenBucket { rate, .. } | Self::LeakyBucket { rate, .. } => match exhausted.gcra() {
                Some(tat) => (State::Gcra { tat: tat.saturating_add(u128::from(owed) * u128::from(rate.per.0)) }, owed),
                None => (exhausted, 0),
            },
            Self::FixedWindow { .. } | Self::SlidingWindow { .. } => match exhausted.window() {
                Some((index, count, previous)) => {
                    (State::Window { index, count: count.saturating_add(owed), previous }, owed)
                }
                None => (exhausted, 0),
            },
            Self::SlidingLog { .. } => match exhausted {
                State::Log { mut entries } => {
                    if let Some(entry) = entries.first_mut() {
                        entry.cost = entry.cost.saturating_add(owed);
                    }
                    (State::Log { entries }, owed)
                }
                other => (other, 0),
            },
            // Slots come back when requests end: there is nothing to owe.
            Self::Concurrency { .. } => (exhausted, 0),
        }
    }
}

/// A state carried over to other numbers ([`Limit::carry`]).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Carried {
    /// The state under the new numbers.
    pub state: State,
    /// Units of debt the new numbers could not hold (more than their capacity below
    /// empty): dropped, and to be counted by whoever carried the state over.
    pub forgiven: u64,
}
