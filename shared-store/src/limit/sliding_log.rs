//! The sliding window log: how an exact count over the trailing window, one entry per
//! admitted request, is kept, decided and charged.

use super::{InvalidLimit, Limit, State};
use crate::decision::{Decision, Verdict};
use crate::time::Nanos;

/// The largest `limit` a sliding log may have: its state holds one entry per admitted
/// request in the window, and the whole state is copied on every shared-data read.
pub const MAX_LOG_ENTRIES: u64 = 256;

/// One admitted request in a sliding log.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct LogEntry {
    /// When it was admitted (ns).
    pub at: u64,
    /// What it cost.
    pub cost: u64,
}

impl Limit {
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
}

/// Charges `cost` at `now` to the log `entries` (see [`Limit::charge`]).
///
/// `None` when nothing can be charged (the log is full, or already `max_debt` below
/// empty), so that the log is left exactly as it is.
pub(super) fn charge(
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
    // Entries stay sorted, as in `decide`.
    let at = live.last().map_or(now.0, |last| last.at.max(now.0));
    live.push(LogEntry { at, cost: charged });
    Some((State::Log { entries: live }, charged))
}

/// Decides `cost` at `now` on the log `entries` (see [`Limit::decide`]).
pub(super) fn decide(
    limit: u64,
    window: Nanos,
    entries: &[LogEntry],
    now: Nanos,
    cost: u64,
) -> (Decision, Option<State>) {
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

/// Whether every entry of the log has left the window at `now` (see [`Limit::is_idle`]).
pub(super) fn is_idle(window: Nanos, entries: &[LogEntry], now: Nanos) -> bool {
    entries.iter().all(|e| e.at.saturating_add(window.0) <= now.0)
}

/// The log `entries` without the entry an admission wrote last into `ours` (see
/// [`Limit::refund`]).
pub(super) fn refund(entries: &[LogEntry], ours: &[LogEntry]) -> State {
    let mut entries = entries.to_vec();
    if let Some(mine) = ours.last()
        && let Some(position) = entries.iter().position(|e| e == mine)
    {
        entries.remove(position);
    }
    State::Log { entries }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::tests::{S, T0, at};

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
}
