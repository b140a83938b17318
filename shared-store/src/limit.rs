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

use crate::decision::{Decision, Verdict};
use crate::time::Nanos;

/// The largest `limit` a sliding log may have: its state holds one entry per admitted
/// request in the window, and the whole state is copied on every shared-data read.
pub const MAX_LOG_ENTRIES: u64 = 256;

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
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Limit {
    /// Token bucket (GCRA form): refills at `rate`, holds at most `burst`.
    TokenBucket {
        /// Sustained refill rate.
        rate: Rate,
        /// Capacity: the largest burst an idle caller may spend at once.
        burst: u64,
    },
    /// At most `limit` per clock-aligned window.
    FixedWindow {
        /// Units per window.
        limit: u64,
        /// Window length.
        window: Nanos,
    },
    /// Sliding window counter: the previous window's count, weighted by how much of it
    /// still overlaps the trailing window, plus the current count.
    SlidingWindow {
        /// Units per trailing window.
        limit: u64,
        /// Window length.
        window: Nanos,
    },
    /// Sliding window log: exact count over the trailing window.
    SlidingLog {
        /// Units per trailing window, at most [`MAX_LOG_ENTRIES`].
        limit: u64,
        /// Window length.
        window: Nanos,
    },
    /// Leaky bucket as a shaper: admitted requests are delayed so they leave at `rate`.
    LeakyBucket {
        /// Drain rate.
        rate: Rate,
        /// Most units waiting at once (including the one being decided).
        max_queue: u64,
        /// Longest delay handed out.
        max_wait: Nanos,
    },
}

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
}

/// One admitted request in a sliding log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogEntry {
    /// When it was admitted (ns).
    pub at: u64,
    /// What it cost.
    pub cost: u64,
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
    /// A token bucket refilling at `rate` and holding at most `burst`.
    ///
    /// # Errors
    /// [`InvalidLimit::ZeroCapacity`] when `burst` is zero.
    pub const fn token_bucket(rate: Rate, burst: u64) -> Result<Self, InvalidLimit> {
        if burst == 0 { Err(InvalidLimit::ZeroCapacity) } else { Ok(Self::TokenBucket { rate, burst }) }
    }

    /// At most `limit` units per aligned `window`.
    ///
    /// # Errors
    /// When `limit` or `window` is zero.
    pub const fn fixed_window(limit: u64, window: Nanos) -> Result<Self, InvalidLimit> {
        match Self::check_window(limit, window) {
            Ok(()) => Ok(Self::FixedWindow { limit, window }),
            Err(e) => Err(e),
        }
    }

    /// At most `limit` units in the trailing `window`, estimated from two counters.
    ///
    /// # Errors
    /// When `limit` or `window` is zero.
    pub const fn sliding_window(limit: u64, window: Nanos) -> Result<Self, InvalidLimit> {
        match Self::check_window(limit, window) {
            Ok(()) => Ok(Self::SlidingWindow { limit, window }),
            Err(e) => Err(e),
        }
    }

    /// At most `limit` units in the trailing `window`, exactly.
    ///
    /// # Errors
    /// When `limit` or `window` is zero, or `limit` exceeds [`MAX_LOG_ENTRIES`].
    pub const fn sliding_log(limit: u64, window: Nanos) -> Result<Self, InvalidLimit> {
        if limit > MAX_LOG_ENTRIES {
            return Err(InvalidLimit::LogTooLong);
        }
        match Self::check_window(limit, window) {
            Ok(()) => Ok(Self::SlidingLog { limit, window }),
            Err(e) => Err(e),
        }
    }

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
        }
    }

    /// The state of a key never seen: a full bucket, an empty window or log.
    pub fn fresh(&self) -> State {
        match self {
            Self::TokenBucket { .. } | Self::LeakyBucket { .. } => State::Gcra { tat: 0 },
            Self::FixedWindow { .. } | Self::SlidingWindow { .. } => State::Window { index: 0, count: 0, previous: 0 },
            Self::SlidingLog { .. } => State::Log { entries: Vec::new() },
        }
    }

    /// The most conservative state at `now`: nothing left to spend. Used in place of
    /// state that cannot be decoded, so that garbage never becomes a fresh full bucket.
    pub fn exhausted(&self, now: Nanos) -> State {
        match *self {
            Self::TokenBucket { rate, burst } => {
                let g = Gcra::new(rate, burst);
                State::Gcra { tat: g.now(now).saturating_add(g.capacity) }
            }
            Self::LeakyBucket { rate, max_queue, .. } => {
                let g = Gcra::new(rate, max_queue);
                State::Gcra { tat: g.now(now).saturating_add(g.capacity) }
            }
            Self::FixedWindow { limit, window } | Self::SlidingWindow { limit, window } => {
                State::Window { index: now.0 / window.0.max(1), count: limit, previous: limit }
            }
            Self::SlidingLog { limit, .. } => State::Log { entries: vec![LogEntry { at: now.0, cost: limit }] },
        }
    }

    /// Whether `state` carries no information at `now`: a full bucket, windows with
    /// nothing counted. Only such state may be given to another key (see `key`), so that
    /// flooding a slot table cannot reset anyone's bucket.
    pub fn is_idle(&self, state: &State, now: Nanos) -> bool {
        match (*self, state) {
            (Self::TokenBucket { rate, .. } | Self::LeakyBucket { rate, .. }, State::Gcra { tat }) => {
                *tat <= u128::from(now.0) * u128::from(rate.amount)
            }
            (Self::FixedWindow { window, .. }, State::Window { index, count, .. }) => {
                *count == 0 || *index < now.0 / window.0.max(1)
            }
            (Self::SlidingWindow { window, .. }, State::Window { index, count, previous }) => {
                let current = now.0 / window.0.max(1);
                match current.checked_sub(*index) {
                    Some(0) => *count == 0 && *previous == 0,
                    Some(1) => *count == 0,
                    Some(_) => true,
                    None => false,
                }
            }
            (Self::SlidingLog { window, .. }, State::Log { entries }) => {
                entries.iter().all(|e| e.at.saturating_add(window.0) <= now.0)
            }
            _ => false,
        }
    }

    /// Decides whether `cost` may be spent at `now`, given the key's `state` (`None` for
    /// a key never seen). Returns the decision and, when the request is admitted, the
    /// state to store. Pure: no clock, no store.
    ///
    /// A cost of zero is a query: it is admitted and changes nothing.
    pub fn decide(&self, state: Option<&State>, now: Nanos, cost: u64) -> (Decision, Option<State>) {
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
        match (*self, state) {
            (Self::TokenBucket { rate, burst }, State::Gcra { tat }) => {
                Gcra::new(rate, burst).step(*tat, now, cost, None)
            }
            (Self::LeakyBucket { rate, max_queue, max_wait }, State::Gcra { tat }) => {
                Gcra::new(rate, max_queue).step(*tat, now, cost, Some(max_wait))
            }
            (Self::FixedWindow { limit, window }, State::Window { index, count, .. }) => {
                fixed_window(limit, window, (*index, *count), now, cost)
            }
            (Self::SlidingWindow { limit, window }, State::Window { index, count, previous }) => {
                sliding_window(limit, window, (*index, *count, *previous), now, cost)
            }
            (Self::SlidingLog { limit, window }, State::Log { entries }) => {
                sliding_log(limit, window, entries, now, cost)
            }
            // `accepts` guarantees the kinds match; this arm only satisfies the compiler.
            _ => (self.rejected_forever(), None),
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
        let charged = match (*self, &current) {
            (Self::TokenBucket { rate, burst }, State::Gcra { tat }) => {
                Gcra::new(rate, burst).charge(*tat, now, cost, max_debt).map(|(tat, c)| (State::Gcra { tat }, c))
            }
            (Self::FixedWindow { limit, window }, State::Window { index, count, .. }) => {
                Some(charge_fixed_window(limit, window, (*index, *count), now, cost, max_debt))
            }
            (Self::SlidingWindow { limit, window }, State::Window { index, count, previous }) => {
                Some(charge_sliding_window(limit, window, (*index, *count, *previous), now, cost, max_debt))
            }
            (Self::SlidingLog { limit, window }, State::Log { entries }) => {
                charge_sliding_log(limit, window, entries, now, cost, max_debt)
            }
            _ => None,
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
        let _ = now;
        Some(match (*self, current, written) {
            (
                Self::TokenBucket { rate, .. } | Self::LeakyBucket { rate, .. },
                State::Gcra { tat: current },
                State::Gcra { tat: written },
            ) => {
                if current != written {
                    return None;
                }
                let increment = u128::from(cost).saturating_mul(u128::from(rate.per.0));
                State::Gcra { tat: current.saturating_sub(increment) }
            }
            (
                Self::FixedWindow { .. } | Self::SlidingWindow { .. },
                State::Window { index, count, previous },
                State::Window { index: ours, .. },
            ) => {
                if index == ours {
                    State::Window { index: *index, count: count.saturating_sub(cost), previous: *previous }
                } else if Some(*index) == ours.checked_add(1) {
                    State::Window { index: *index, count: *count, previous: previous.saturating_sub(cost) }
                } else {
                    current.clone()
                }
            }
            (Self::SlidingLog { .. }, State::Log { entries }, State::Log { entries: ours }) => {
                let mut entries = entries.clone();
                if let Some(mine) = ours.last()
                    && let Some(position) = entries.iter().position(|e| e == mine)
                {
                    entries.remove(position);
                }
                State::Log { entries }
            }
            _ => current.clone(),
        })
    }

    /// Converts `state`, kept under the limit `old`, to this limit at `now`: what a key
    /// decided under other numbers (a policy changed without a version bump) holds
    /// under these. Never looser than the old state (what it counted stays counted), and
    /// never looser than a fresh state of this limit. The rule is integer-exact, so the
    /// counter service's Redis script computes the same state:
    ///
    /// * **Buckets** (token to token, leaky to leaky): the units spent are rounded up to
    ///   whole units, `spent = ceil(debt / per_old)` with `debt = tat − now` (scaled, 0
    ///   when negative); then `spent_new = min(max(spent + burst_new − burst_old, 0),
    ///   burst_new)`, stored as `tat = now × amount_new + spent_new × per_new`. That is,
    ///   the whole units available are kept, capped at the new capacity: a smaller
    ///   burst takes effect at once, a larger one fills up at the new rate (a raise does
    ///   not refill), and a debt below empty is capped at an empty bucket.
    /// * **Windows** (fixed to fixed, sliding to sliding): the state is first brought to
    ///   `now` under the old limit (a fixed window older than the current one counts 0;
    ///   a sliding window's counts shift as its decision would shift them); then, if the
    ///   window length is unchanged, it is kept, and otherwise its counts are carried
    ///   into the current window of the new length. The counts are kept, so a larger
    ///   limit leaves more room in the same window.
    /// * **Sliding log** to sliding log: the entries are kept.
    /// * **Another algorithm**: [`Limit::exhausted`] (stricter, never looser).
    pub fn adopt(&self, old: &Self, state: State, now: Nanos) -> State {
        if old == self {
            return state;
        }
        match (*self, *old, state) {
            (
                Self::TokenBucket { rate, burst },
                Self::TokenBucket { rate: old_rate, burst: old_burst },
                State::Gcra { tat },
            ) => Gcra::new(rate, burst)
                .adopt(&Gcra::new(old_rate, old_burst), tat, now)
                .unwrap_or_else(|| self.exhausted(now)),
            (
                Self::LeakyBucket { rate, max_queue, .. },
                Self::LeakyBucket { rate: old_rate, max_queue: old_queue, .. },
                State::Gcra { tat },
            ) => Gcra::new(rate, max_queue)
                .adopt(&Gcra::new(old_rate, old_queue), tat, now)
                .unwrap_or_else(|| self.exhausted(now)),
            (
                Self::FixedWindow { window, .. },
                Self::FixedWindow { window: old_window, .. },
                State::Window { index, count, .. },
            ) => {
                let current = now.0 / old_window.0.max(1);
                let (index, count) = if index >= current { (index, count) } else { (current, 0) };
                let index = if window == old_window { index } else { now.0 / window.0.max(1) };
                State::Window { index, count, previous: 0 }
            }
            (
                Self::SlidingWindow { window, .. },
                Self::SlidingWindow { window: old_window, .. },
                State::Window { index, count, previous },
            ) => {
                let (index, previous, count, _) = slide(old_window.0.max(1), (index, count, previous), now);
                let index = if window == old_window { index } else { now.0 / window.0.max(1) };
                State::Window { index, count, previous }
            }
            (Self::SlidingLog { .. }, Self::SlidingLog { .. }, state @ State::Log { .. }) => state,
            _ => self.exhausted(now),
        }
    }
}

/// GCRA arithmetic for one bucket, in units of `1 / amount` nanoseconds.
struct Gcra {
    amount: u128,
    per: u128,
    /// Capacity in scaled time: `burst × per`.
    capacity: u128,
    /// Capacity in cost units: the burst.
    burst: u64,
}

impl Gcra {
    fn new(rate: Rate, burst: u64) -> Self {
        let per = u128::from(rate.per.0);
        Self { amount: u128::from(rate.amount), per, capacity: u128::from(burst) * per, burst }
    }

    fn now(&self, now: Nanos) -> u128 {
        u128::from(now.0) * self.amount
    }

    /// Time (ns) for `scaled` to drain.
    fn drain(&self, scaled: u128) -> Nanos {
        if self.amount == 1 { ns(scaled) } else { ns(ceil_div(scaled, self.amount)) }
    }

    fn units(&self, scaled: u128) -> u64 {
        u64::try_from(floor_div(scaled, self.per)).unwrap_or(u64::MAX)
    }

    /// The decision that leaves the bucket as it is (queries, rejections).
    fn unchanged(&self, verdict: Verdict, debt: u128) -> Decision {
        Decision {
            verdict,
            limit: self.burst,
            remaining: self.units(self.capacity.saturating_sub(debt)),
            reset_after: self.drain(debt),
        }
    }

    /// One GCRA step. Without `max_wait` this is a token bucket: debt is credit already
    /// spent, and a request fits if the debt it adds stays within the burst. With
    /// `max_wait` it is a shaper: debt is the queue ahead, which the request waits out,
    /// and it must also not wait longer than `max_wait`.
    fn step(&self, tat: u128, now: Nanos, cost: u64, max_wait: Option<Nanos>) -> (Decision, Option<State>) {
        let now = self.now(now);
        let base = tat.max(now);
        let debt = base - now;
        if cost == 0 {
            return (self.unchanged(Verdict::Allowed, debt), None);
        }
        if cost > self.burst {
            return (self.unchanged(Verdict::Exceeds, debt), None);
        }
        let increment = u128::from(cost) * self.per;
        let delay = if max_wait.is_some() { self.drain(debt) } else { Nanos::ZERO };
        match (debt.checked_add(increment), base.checked_add(increment)) {
            (Some(need), Some(next)) if need <= self.capacity && max_wait.is_none_or(|wait| delay <= wait) => {
                let verdict = if delay == Nanos::ZERO { Verdict::Allowed } else { Verdict::Delayed(delay) };
                (
                    Decision {
                        verdict,
                        limit: self.burst,
                        remaining: self.units(self.capacity - need),
                        reset_after: self.drain(need),
                    },
                    Some(State::Gcra { tat: next }),
                )
            }
            _ => {
                let room_wait = debt.saturating_add(increment).saturating_sub(self.capacity);
                let delay_wait =
                    max_wait.map_or(0, |wait| debt.saturating_sub(u128::from(wait.0).saturating_mul(self.amount)));
                let retry_after = self.drain(room_wait.max(delay_wait));
                (self.unchanged(Verdict::Rejected { retry_after }, debt), None)
            }
        }
    }

    /// Spends up to `cost` whole units, keeping the debt within `burst + max_debt`
    /// units' worth of scaled time. `None` when the arithmetic overflows (nothing is
    /// charged then).
    fn charge(&self, tat: u128, now: Nanos, cost: u64, max_debt: u64) -> Option<(u128, u64)> {
        let now = self.now(now);
        let base = tat.max(now);
        let debt = base - now;
        let ceiling = u128::from(self.burst).checked_add(u128::from(max_debt))?.checked_mul(self.per)?;
        let room = floor_div(ceiling.saturating_sub(debt), self.per);
        let charged = u64::try_from(room.min(u128::from(cost))).ok()?;
        let next = base.checked_add(u128::from(charged).checked_mul(self.per)?)?;
        Some((next, charged))
    }

    /// Re-expresses a bucket kept under `old` in this bucket's units (see
    /// [`Limit::adopt`]): the whole units available are kept, capped at this capacity.
    /// `None` when the arithmetic overflows.
    fn adopt(&self, old: &Self, tat: u128, now: Nanos) -> Option<State> {
        let debt = tat.saturating_sub(old.now(now));
        let spent = ceil_div(debt, old.per.max(1));
        let burst = u128::from(self.burst);
        let spent = spent.saturating_add(burst).saturating_sub(u128::from(old.burst)).min(burst);
        Some(State::Gcra { tat: self.now(now).checked_add(spent.checked_mul(self.per)?)? })
    }
}

fn fixed_window(
    limit: u64,
    window: Nanos,
    (index, count): (u64, u64),
    now: Nanos,
    cost: u64,
) -> (Decision, Option<State>) {
    let current = now.0 / window.0.max(1);
    let (index, count) = if index >= current { (index, count) } else { (current, 0) };
    let window_end = Nanos(u64::try_from((u128::from(index) + 1) * u128::from(window.0)).unwrap_or(u64::MAX));
    let until_end = window_end.saturating_sub(now);
    let idle = Decision {
        verdict: Verdict::Allowed,
        limit,
        remaining: limit.saturating_sub(count),
        reset_after: if count == 0 { Nanos::ZERO } else { until_end },
    };
    if cost == 0 {
        return (idle, None);
    }
    if cost > limit {
        return (Decision { verdict: Verdict::Exceeds, ..idle }, None);
    }
    match count.checked_add(cost) {
        Some(spent) if spent <= limit => (
            Decision { verdict: Verdict::Allowed, limit, remaining: limit - spent, reset_after: until_end },
            Some(State::Window { index, count: spent, previous: 0 }),
        ),
        _ => (Decision { verdict: Verdict::Rejected { retry_after: until_end }, ..idle }, None),
    }
}

/// A sliding window's counters as they stand at `now` (window length `w`, not zero):
/// `(index, previous, count, offset into window index)`. A clock that went back is
/// treated as the start of the stored window.
fn slide(w: u64, (index, count, previous): (u64, u64, u64), now: Nanos) -> (u64, u64, u64, u64) {
    let (current, offset) = (now.0 / w, now.0 % w);
    if index > current {
        (index, previous, count, 0)
    } else if index == current {
        (index, previous, count, offset)
    } else if index.checked_add(1) == Some(current) {
        (current, count, 0, offset)
    } else {
        (current, 0, 0, offset)
    }
}

/// The trailing window's weighted count, scaled by the window length `w` so that the
/// weighting is exact: `previous × (w − offset) + count × w`.
fn weighted(w: u64, previous: u64, count: u64, offset: u64) -> u128 {
    let w128 = u128::from(w);
    (u128::from(previous) * (w128 - u128::from(offset.min(w)))).saturating_add(u128::from(count) * w128)
}

fn charge_fixed_window(
    limit: u64,
    window: Nanos,
    (index, count): (u64, u64),
    now: Nanos,
    cost: u64,
    max_debt: u64,
) -> (State, u64) {
    let current = now.0 / window.0.max(1);
    let (index, count) = if index >= current { (index, count) } else { (current, 0) };
    let charged = cost.min(limit.saturating_add(max_debt).saturating_sub(count));
    (State::Window { index, count: count.saturating_add(charged), previous: 0 }, charged)
}

fn charge_sliding_window(
    limit: u64,
    window: Nanos,
    (index, count, previous): (u64, u64, u64),
    now: Nanos,
    cost: u64,
    max_debt: u64,
) -> (State, u64) {
    let w = window.0.max(1);
    let (index, previous, count, offset) = slide(w, (index, count, previous), now);
    let ceiling = u128::from(limit.saturating_add(max_debt)) * u128::from(w);
    let room = ceiling.saturating_sub(weighted(w, previous, count, offset)) / u128::from(w);
    let charged = u64::try_from(room.min(u128::from(cost))).unwrap_or(0);
    (State::Window { index, count: count.saturating_add(charged), previous }, charged)
}

/// `None` when nothing can be charged (the log is full, or already `max_debt` below
/// empty), so that the log is left exactly as it is.
fn charge_sliding_log(
    limit: u64,
    window: Nanos,
    entries: &[LogEntry],
    now: Nanos,
    cost: u64,
    max_debt: u64,
) -> Option<(State, u64)> {
    let mut live: Vec<LogEntry> = entries.iter().copied().filter(|e| e.at.saturating_add(window.0) > now.0).collect();
    if u64::try_from(live.len()).unwrap_or(u64::MAX) >= MAX_LOG_ENTRIES {
        return None;
    }
    let used: u64 = live.iter().fold(0u64, |sum, e| sum.saturating_add(e.cost));
    let charged = cost.min(limit.saturating_add(max_debt).saturating_sub(used));
    if charged == 0 {
        return None;
    }
    // Entries stay sorted, as in `sliding_log`.
    let at = live.last().map_or(now.0, |last| last.at.max(now.0));
    live.push(LogEntry { at, cost: charged });
    Some((State::Log { entries: live }, charged))
}

fn sliding_window(
    limit: u64,
    window: Nanos,
    (index, count, previous): (u64, u64, u64),
    now: Nanos,
    cost: u64,
) -> (Decision, Option<State>) {
    let w = window.0.max(1);
    let (index, previous, count, offset) = slide(w, (index, count, previous), now);
    let (w128, limit128) = (u128::from(w), u128::from(limit));
    let at =
        |window_index: u64, offset: u128| -> Nanos { ns((u128::from(window_index) * w128).saturating_add(offset)) };
    // Every count below is scaled by the window length, so the weighting is exact.
    let used = weighted(w, previous, count, offset);
    let allowance = limit128 * w128;
    let reset_after = |count: u64| -> Nanos {
        if count > 0 {
            at(index.saturating_add(2), 0).saturating_sub(now)
        } else if previous > 0 {
            at(index.saturating_add(1), 0).saturating_sub(now)
        } else {
            Nanos::ZERO
        }
    };
    let idle = Decision {
        verdict: Verdict::Allowed,
        limit,
        remaining: u64::try_from(allowance.saturating_sub(used) / w128).unwrap_or(u64::MAX),
        reset_after: reset_after(count),
    };
    if cost == 0 {
        return (idle, None);
    }
    if cost > limit {
        return (Decision { verdict: Verdict::Exceeds, ..idle }, None);
    }
    let spend = u128::from(cost) * w128;
    if let Some(total) = used.checked_add(spend).filter(|total| *total <= allowance) {
        let count = count.saturating_add(cost);
        return (
            Decision {
                verdict: Verdict::Allowed,
                limit,
                remaining: u64::try_from((allowance - total) / w128).unwrap_or(u64::MAX),
                reset_after: reset_after(count),
            },
            Some(State::Window { index, count, previous }),
        );
    }
    // Earliest admission inside this window: previous × (w − e) ≤ (limit − count − cost) × w.
    let in_this_window = limit
        .checked_sub(count)
        .and_then(|left| left.checked_sub(cost))
        .filter(|_| previous > 0)
        .map(|room| w128 - (u128::from(room) * w128 / u128::from(previous)).min(w128))
        .filter(|offset| *offset < w128);
    let target = match in_this_window {
        Some(offset) => at(index, offset),
        // Otherwise in the next window, where this window's count becomes `previous`.
        None => {
            let offset =
                if count == 0 { 0 } else { w128 - (u128::from(limit - cost) * w128 / u128::from(count)).min(w128) };
            at(index.saturating_add(1), offset)
        }
    };
    (Decision { verdict: Verdict::Rejected { retry_after: target.saturating_sub(now) }, ..idle }, None)
}

fn sliding_log(limit: u64, window: Nanos, entries: &[LogEntry], now: Nanos, cost: u64) -> (Decision, Option<State>) {
    let live: Vec<LogEntry> = entries.iter().copied().filter(|e| e.at.saturating_add(window.0) > now.0).collect();
    let used: u64 = live.iter().fold(0u64, |sum, e| sum.saturating_add(e.cost));
    let expiry = |entry: Option<&LogEntry>| -> Nanos {
        entry.map_or(Nanos::ZERO, |e| Nanos(e.at.saturating_add(window.0)).saturating_sub(now))
    };
    let idle = Decision {
        verdict: Verdict::Allowed,
        limit,
        remaining: limit.saturating_sub(used),
        reset_after: expiry(live.last()),
    };
    if cost == 0 {
        return (idle, None);
    }
    if cost > limit {
        return (Decision { verdict: Verdict::Exceeds, ..idle }, None);
    }
    match used.checked_add(cost) {
        Some(spent) if spent <= limit => {
            // Entries stay sorted even if this worker's clock reads earlier than the last.
            let at = live.last().map_or(now.0, |last| last.at.max(now.0));
            let mut next = live;
            next.push(LogEntry { at, cost });
            let reset_after = expiry(next.last());
            (
                Decision { verdict: Verdict::Allowed, limit, remaining: limit - spent, reset_after },
                Some(State::Log { entries: next }),
            )
        }
        _ => {
            // Oldest entries expire first; find the one whose expiry frees enough.
            let excess = used.saturating_add(cost).saturating_sub(limit);
            let mut freed = 0u64;
            let retry_after = live
                .iter()
                .find(|e| {
                    freed = freed.saturating_add(e.cost);
                    freed >= excess
                })
                .map_or(Nanos::MAX, |e| expiry(Some(e)));
            (Decision { verdict: Verdict::Rejected { retry_after }, ..idle }, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = 1_000_000_000;
    const MS: u64 = 1_000_000;
    const T0: Nanos = Nanos(1 << 40);

    fn at(offset: u64) -> Nanos {
        Nanos(T0.0 + offset)
    }

    fn bucket() -> Limit {
        // One token every 100 ms, bursts of 5.
        Limit::token_bucket(Rate::new(10, Nanos(S)).unwrap(), 5).unwrap()
    }

    #[test]
    fn a_charge_within_what_is_left_stores_what_a_check_of_that_cost_would() {
        let limits = [
            bucket(),
            Limit::fixed_window(5, Nanos(S)).unwrap(),
            Limit::sliding_window(5, Nanos(S)).unwrap(),
            Limit::sliding_log(5, Nanos(S)).unwrap(),
        ];
        for limit in limits {
            let (_, spent) = limit.decide(None, T0, 2);

            let (charged_state, charged) = limit.charge(spent.as_ref(), at(MS), 3, 0);
            let (_, checked_state) = limit.decide(spent.as_ref(), at(MS), 3);

            assert_eq!(charged, 3, "{limit:?}");
            assert_eq!(Some(charged_state), checked_state, "{limit:?}");
        }
    }

    #[test]
    fn a_token_bucket_is_charged_down_to_its_debt_bound_and_forgives_the_rest() {
        let (state, charged) = bucket().charge(None, T0, 20, 3);

        let status = bucket().status(Some(&state), T0);
        assert_eq!(charged, 8, "5 in the bucket and 3 of debt");
        assert_eq!(status.remaining, 0);
        // 8 tokens at 100 ms each: full again in 800 ms, one token admitted after 400 ms.
        assert_eq!(status.reset_after, Nanos(800 * MS));
        assert_eq!(status.verdict, Verdict::Rejected { retry_after: Nanos(400 * MS) });
    }

    #[test]
    fn a_bucket_in_debt_admits_nothing_until_the_debt_is_repaid_and_then_exactly_on_time() {
        let (state, _) = bucket().charge(None, T0, 8, 3);

        let early = bucket().decide(Some(&state), at(400 * MS - 1), 1);
        let on_time = bucket().decide(Some(&state), at(400 * MS), 1);

        assert!(matches!(early.0.verdict, Verdict::Rejected { retry_after: Nanos(1) }), "{early:?}");
        assert!(on_time.0.is_admitted());
    }

    #[test]
    fn a_bucket_already_at_its_debt_bound_is_charged_nothing_more() {
        let (state, _) = bucket().charge(None, T0, 8, 3);

        let (again, charged) = bucket().charge(Some(&state), T0, 5, 3);
        let (deeper, more) = bucket().charge(Some(&state), T0, 5, 4);

        assert_eq!((again, charged), (state, 0));
        assert_eq!(more, 1, "a larger bound lets one more unit in");
        assert_eq!(bucket().status(Some(&deeper), T0).reset_after, Nanos(900 * MS));
    }

    #[test]
    fn a_fixed_window_carries_its_debt_only_until_the_window_ends() {
        let limit = Limit::fixed_window(4, Nanos(S)).unwrap();

        let (state, charged) = limit.charge(None, at(0), 10, 2);
        let in_window = limit.decide(Some(&state), at(S - (T0.0 % S) - 1), 1).0;
        let next_window = limit.decide(Some(&state), at(S - (T0.0 % S)), 1).0;

        assert_eq!(charged, 6);
        assert!(matches!(in_window.verdict, Verdict::Rejected { .. }));
        assert_eq!((next_window.verdict, next_window.remaining), (Verdict::Allowed, 3));
    }

    #[test]
    fn a_sliding_window_in_debt_weighs_it_into_the_next_window() {
        let limit = Limit::sliding_window(4, Nanos(S)).unwrap();
        let start = Nanos((T0.0 / S + 1) * S);

        let (state, charged) = limit.charge(None, start, 6, 2);
        // Half into the next window, half of the 6 still counts: 3 of 4, one left.
        let half = limit.status(Some(&state), Nanos(start.0 + S + S / 2));
        let before = limit.decide(Some(&state), Nanos(start.0 + S + S / 4), 1).0;

        assert_eq!(charged, 6);
        assert_eq!(half.remaining, 1);
        assert_eq!(before.verdict, Verdict::Rejected { retry_after: Nanos(S / 4) });
    }

    #[test]
    fn a_sliding_log_records_a_charge_as_one_entry_and_never_grows_past_its_bound() {
        let limit = Limit::sliding_log(MAX_LOG_ENTRIES, Nanos(S)).unwrap();
        let mut state = None;
        for i in 0..MAX_LOG_ENTRIES {
            let (next, charged) = limit.charge(state.as_ref(), at(i), 1, MAX_LOG_ENTRIES);
            assert_eq!(charged, 1);
            state = Some(next);
        }

        let (full, charged) = limit.charge(state.as_ref(), at(MAX_LOG_ENTRIES), 5, MAX_LOG_ENTRIES);

        assert_eq!(charged, 0, "a full log forgives what it cannot record");
        let State::Log { entries } = full else { unreachable!() };
        assert_eq!(entries.len() as u64, MAX_LOG_ENTRIES);
    }

    #[test]
    fn a_sliding_log_charge_expires_with_its_entry() {
        let limit = Limit::sliding_log(3, Nanos(S)).unwrap();

        let (state, charged) = limit.charge(None, T0, 9, 2);
        let status = limit.status(Some(&state), T0);
        let after = limit.decide(Some(&state), at(S), 3).0;

        assert_eq!(charged, 5);
        assert_eq!(status.verdict, Verdict::Rejected { retry_after: Nanos(S) });
        assert!(after.is_admitted());
    }

    #[test]
    fn a_leaky_bucket_is_never_charged() {
        let limit = Limit::leaky_bucket(Rate::new(1, Nanos(S)).unwrap(), 3, Nanos(S)).unwrap();

        let (state, charged) = limit.charge(None, T0, 2, 3);

        assert_eq!((state, charged), (limit.fresh(), 0));
    }

    #[test]
    fn state_of_another_algorithm_is_charged_as_the_exhausted_limit() {
        let window = State::Window { index: 0, count: 0, previous: 0 };

        let (state, charged) = bucket().charge(Some(&window), T0, 10, 2);

        assert_eq!(charged, 2, "only the debt: the unreadable state counts as empty");
        assert_eq!(bucket().status(Some(&state), T0).reset_after, Nanos(700 * MS));
    }

    #[test]
    fn adopting_other_bucket_numbers_keeps_the_whole_units_left_and_never_refills() {
        let raised = Limit::token_bucket(Rate::new(10, Nanos(S)).unwrap(), 8).unwrap();
        let lowered = Limit::token_bucket(Rate::new(10, Nanos(S)).unwrap(), 2).unwrap();
        // 3 of 5 spent, and 50 ms of the next token refilled: 2.5 left, 3 spent rounded up.
        let (_, spent) = bucket().decide(None, T0, 3);
        let spent = spent.unwrap();

        let up = raised.adopt(&bucket(), spent.clone(), at(50 * MS));
        let down = lowered.adopt(&bucket(), spent, at(50 * MS));

        assert_eq!(raised.status(Some(&up), at(50 * MS)).remaining, 2, "2 whole units kept, none added");
        assert_eq!(up, State::Gcra { tat: u128::from(at(50 * MS).0) + 6 * 100 * u128::from(MS) });
        assert_eq!(lowered.status(Some(&down), at(50 * MS)).remaining, 2, "capped at the new burst");
    }

    #[test]
    fn adopting_a_new_window_length_carries_this_windows_count_and_forgets_a_past_one() {
        let old = Limit::fixed_window(5, Nanos(S)).unwrap();
        let longer = Limit::fixed_window(5, Nanos(2 * S)).unwrap();
        let now = Nanos(10 * S + S / 2);
        let current = State::Window { index: 10, count: 4, previous: 0 };
        let past = State::Window { index: 9, count: 4, previous: 0 };

        assert_eq!(longer.adopt(&old, current, now), State::Window { index: 5, count: 4, previous: 0 });
        assert_eq!(longer.adopt(&old, past, now), State::Window { index: 5, count: 0, previous: 0 });
    }

    #[test]
    fn adopting_another_algorithms_state_starts_exhausted() {
        let window = Limit::sliding_window(5, Nanos(S)).unwrap();
        let (_, spent) = bucket().decide(None, T0, 1);

        let adopted = window.adopt(&bucket(), spent.unwrap(), T0);

        assert_eq!(adopted, window.exhausted(T0));
    }

    #[test]
    fn the_status_of_a_limit_with_something_left_is_the_query() {
        let (_, state) = bucket().decide(None, T0, 2);

        let status = bucket().status(state.as_ref(), T0);

        assert_eq!(status, bucket().decide(state.as_ref(), T0, 0).0);
        assert_eq!((status.verdict, status.remaining), (Verdict::Allowed, 3));
    }
}
