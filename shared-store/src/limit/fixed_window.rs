//! The fixed window: how at most `limit` units per clock-aligned window are decided and
//! charged.

use super::{Carried, InvalidLimit, Limit, State};
use crate::decision::{Decision, Verdict};
use crate::time::Nanos;

impl Limit {
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
}

/// Decides `cost` at `now` on the window `(index, count)` (see [`Limit::decide`]).
pub(super) fn decide(
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

/// Charges `cost` at `now` to the window `(index, count)` (see [`Limit::charge`]).
pub(super) fn charge(
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

/// Whether the window `(index, count)` has nothing counted at `now` (see [`Limit::is_idle`]).
pub(super) fn is_idle(window: Nanos, (index, count): (u64, u64), now: Nanos) -> bool {
    count == 0 || index < now.0 / window.0.max(1)
}

/// The window `(index, count)`, kept under windows of `old_window`, in windows of `window`
/// for a limit of `limit` (see [`Limit::carry`]): the count is kept, at most `2 × limit`.
pub(super) fn carry(limit: u64, window: Nanos, old_window: Nanos, (index, count): (u64, u64), now: Nanos) -> Carried {
    let current = now.0 / old_window.0.max(1);
    let (index, count) = if index >= current { (index, count) } else { (current, 0) };
    let index = if window == old_window { index } else { now.0 / window.0.max(1) };
    let most = limit.saturating_mul(2);
    Carried {
        state: State::Window { index, count: count.min(most), previous: 0 },
        forgiven: count.saturating_sub(most),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::tests::{S, T0, at};

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
    fn adopting_a_new_window_length_carries_this_windows_count_and_forgets_a_past_one() {
        let old = Limit::fixed_window(5, Nanos(S)).unwrap();
        let longer = Limit::fixed_window(5, Nanos(2 * S)).unwrap();
        let now = Nanos(10 * S + S / 2);
        let current = State::Window { index: 10, count: 4, previous: 0 };
        let past = State::Window { index: 9, count: 4, previous: 0 };

        assert_eq!(longer.adopt(&old, current, now), State::Window { index: 5, count: 4, previous: 0 });
        assert_eq!(longer.adopt(&old, past, now), State::Window { index: 5, count: 0, previous: 0 });
    }
}
