//! The sliding window counter: how a limit on the trailing window, estimated from the
//! previous window's count (weighted by its overlap) plus the current one, decides and is
//! charged.

use super::{Carried, InvalidLimit, Limit, State, ns};
use crate::decision::{Decision, Verdict};
use crate::time::Nanos;

impl Limit {
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

/// Charges `cost` at `now` to the counters `(index, count, previous)` (see
/// [`Limit::charge`]).
pub(super) fn charge(
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

/// Decides `cost` at `now` on the counters `(index, count, previous)` (see
/// [`Limit::decide`]).
pub(super) fn decide(
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

/// Whether the counters `(index, count, previous)` count nothing in the trailing window at
/// `now` (see [`Limit::is_idle`]).
pub(super) fn is_idle(window: Nanos, (index, count, previous): (u64, u64, u64), now: Nanos) -> bool {
    let current = now.0 / window.0.max(1);
    match current.checked_sub(index) {
        Some(0) => count == 0 && previous == 0,
        Some(1) => count == 0,
        Some(_) => true,
        None => false,
    }
}

/// The counters `(index, count, previous)`, kept under windows of `old_window`, in
/// windows of `window` for a limit of `limit` (see [`Limit::carry`]): both counts are
/// kept, each at most `2 × limit`.
pub(super) fn carry(
    limit: u64,
    window: Nanos,
    old_window: Nanos,
    (index, count, previous): (u64, u64, u64),
    now: Nanos,
) -> Carried {
    let (index, previous, count, _) = slide(old_window.0.max(1), (index, count, previous), now);
    let index = if window == old_window { index } else { now.0 / window.0.max(1) };
    let most = limit.saturating_mul(2);
    let forgiven = count.saturating_sub(most).saturating_add(previous.saturating_sub(most));
    Carried { state: State::Window { index, count: count.min(most), previous: previous.min(most) }, forgiven }
}

/// The whole units the counters count beyond `limit` in the trailing window at `now`
/// (see [`Limit::owed`]).
pub(super) fn owed(limit: u64, window: Nanos, (index, count, previous): (u64, u64, u64), now: Nanos) -> u64 {
    let w = window.0.max(1);
    let (_, previous, count, offset) = slide(w, (index, count, previous), now);
    let used = weighted(w, previous, count, offset).div_ceil(u128::from(w));
    u64::try_from(used.saturating_sub(u128::from(limit))).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::tests::{S, T0};

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
}
