//! Concurrency: how many of a key's requests may be in flight at once, across every
//! worker (holder) that shares the key.
//!
//! Unlike the rate algorithms, a concurrency limit is given back: a request takes a slot
//! when admitted and releases it when its stream ends. The state records, per holder (a
//! worker's limiter, [`Limiter::with_holder`](crate::Limiter::with_holder)), how many
//! slots it holds and when it last said it was alive. A holder that stops renewing (its
//! VM was killed or replaced without ending its streams) cannot release what it holds;
//! its entry counts for [`STALE_AFTER`] after its last renewal and is then ignored, and
//! pruned by the next write. That is the leak bound: a dead holder's slots come back at
//! most `STALE_AFTER` after it last renewed.

use super::{InvalidLimit, Limit, State};
use crate::decision::{Decision, Verdict};
use crate::time::Nanos;

/// How long a holder's entry counts after its last renewal. A live worker renews every
/// [`RENEW_EVERY`]; this leaves room for four missed renewals (a worker busy for seconds)
/// before its slots are taken for leaked.
pub const STALE_AFTER: Nanos = Nanos::from_secs(5);

/// How often a live holder should renew its entries: a fifth of [`STALE_AFTER`].
pub const RENEW_EVERY: Nanos = Nanos::from_secs(1);

const _: () = assert!(RENEW_EVERY.as_u64() * 4 < STALE_AFTER.as_u64());

/// The most holders one key records. A proxy has one live holder per worker (plus, for
/// [`STALE_AFTER`], those of VMs just replaced); a key that would need more rejects the
/// newcomer (stricter, never looser).
pub const MAX_HOLDERS: usize = 128;

/// The largest concurrency limit: requests in flight per key.
pub const MAX_CONCURRENCY: u64 = 1_000_000;

/// One holder's slots in one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Holding {
    /// Who holds them ([`Limiter::with_holder`](crate::Limiter::with_holder)).
    pub holder: u64,
    /// How many.
    pub count: u64,
    /// When the holder last wrote or renewed this entry, on the shared monotonic clock.
    pub renewed_at: u64,
}

impl Holding {
    /// Whether the entry still counts at `now`.
    pub const fn is_live(&self, now: Nanos) -> bool {
        self.renewed_at.saturating_add(STALE_AFTER.as_u64()) > now.as_u64()
    }
}

impl Limit {
    /// At most `limit` requests in flight at once per key.
    ///
    /// # Errors
    /// When `limit` is zero.
    pub const fn concurrency(limit: u64) -> Result<Self, InvalidLimit> {
        if limit == 0 { Err(InvalidLimit::ZeroCapacity) } else { Ok(Self::Concurrency { limit }) }
    }
}

/// Requests in flight at `now`: the sum of live entries.
pub fn in_flight(entries: &[Holding], now: Nanos) -> u64 {
    entries.iter().filter(|h| h.is_live(now)).fold(0u64, |sum, h| sum.saturating_add(h.count))
}

/// The live entries of holders other than `holder` that hold something, and what
/// `holder` itself holds: its own entry counts even when stale, since the holder is alive
/// to ask (it missed renewals, and its next renewal sets the count right).
fn split(entries: &[Holding], holder: u64, now: Nanos) -> (Vec<Holding>, u64) {
    let own = entries.iter().find(|h| h.holder == holder).map_or(0, |h| h.count);
    let others = entries.iter().filter(|h| h.holder != holder && h.is_live(now) && h.count > 0).copied().collect();
    (others, own)
}

/// `entries` with `holder`'s entry set to `count` slots renewed at `now`, stale and empty
/// entries pruned; `None` when a new entry would exceed [`MAX_HOLDERS`].
fn with_count(entries: &[Holding], holder: u64, count: u64, now: Nanos) -> Option<Vec<Holding>> {
    let (mut next, _) = split(entries, holder, now);
    if count > 0 {
        if next.len() >= MAX_HOLDERS {
            return None;
        }
        next.push(Holding { holder, count, renewed_at: now.as_u64() });
    }
    Some(next)
}

/// Decides one request of `cost` slots for `holder` at `now` (see [`Limit::decide`]).
/// Admitted when the live entries plus `cost` stay within `limit`; never a `Retry-After`:
/// a rejection is [`Verdict::Exceeds`], since no one can say when a request in flight
/// ends.
pub(super) fn decide(limit: u64, entries: &[Holding], holder: u64, now: Nanos, cost: u64) -> (Decision, Option<State>) {
    let (others, own) = split(entries, holder, now);
    let busy = in_flight(&others, now).saturating_add(own);
    let idle =
        Decision { verdict: Verdict::Allowed, limit, remaining: limit.saturating_sub(busy), reset_after: Nanos::ZERO };
    if cost == 0 {
        return (idle, None);
    }
    let rejected = (Decision { verdict: Verdict::Exceeds, ..idle }, None);
    let Some(total) = busy.checked_add(cost).filter(|t| *t <= limit) else { return rejected };
    let Some(next) = with_count(entries, holder, own.saturating_add(cost), now) else { return rejected };
    (Decision { remaining: limit - total, ..idle }, Some(State::Holders { entries: next }))
}

/// `holder` gives back `cost` slots at `now` (a request that ended, or was rejected after
/// its slot was taken): exact, whatever other holders did in between.
pub(super) fn release(entries: &[Holding], holder: u64, now: Nanos, cost: u64) -> State {
    let (_, own) = split(entries, holder, now);
    let count = own.saturating_sub(cost);
    // Removing an entry never needs room, so this is always `Some`.
    State::Holders { entries: with_count(entries, holder, count, now).unwrap_or_default() }
}

/// `holder` says at `now` that it holds exactly `count` slots: its entry is renewed and
/// set to what it knows it holds (so a release whose write failed is made good here), and
/// stale entries are pruned. `None` when a new entry would exceed [`MAX_HOLDERS`].
pub fn renew(entries: &[Holding], holder: u64, count: u64, now: Nanos) -> Option<State> {
    with_count(entries, holder, count, now).map(|entries| State::Holders { entries })
}

/// Whether nothing is in flight at `now` (see [`Limit::is_idle`]): only then may the
/// key's slot change hands.
pub(super) fn is_idle(entries: &[Holding], now: Nanos) -> bool {
    in_flight(entries, now) == 0
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: u64 = 1;
    const B: u64 = 2;

    fn entries(state: Option<State>) -> Vec<Holding> {
        match state {
            Some(State::Holders { entries }) => entries,
            other => panic!("expected holders, got {other:?}"),
        }
    }

    #[test]
    fn admits_up_to_the_limit_across_holders_then_rejects_without_a_wait() {
        let now = Nanos::from_secs(10);
        let (first, state) = decide(2, &[], A, now, 1);
        let state = entries(state);
        let (second, state) = decide(2, &state, B, now, 1);
        let state = entries(state);
        let (third, none) = decide(2, &state, A, now, 1);

        assert_eq!((first.remaining, second.remaining), (1, 0));
        assert_eq!(third.verdict, Verdict::Exceeds);
        assert_eq!(third.retry_after(), None);
        assert!(none.is_none());
    }

    #[test]
    fn a_release_frees_exactly_the_holders_slot() {
        let now = Nanos::from_secs(10);
        let state = vec![
            Holding { holder: A, count: 2, renewed_at: now.as_u64() },
            Holding { holder: B, count: 1, renewed_at: now.as_u64() },
        ];

        let State::Holders { entries: after } = release(&state, A, now, 1) else { panic!() };

        assert_eq!(in_flight(&after, now), 2);
        assert_eq!(after.iter().find(|h| h.holder == A).map(|h| h.count), Some(1));
        let State::Holders { entries: empty } = release(&release_all(&after, A, now), B, now, 1) else { panic!() };
        assert!(empty.is_empty(), "released entries are pruned: {empty:?}");
    }

    fn release_all(entries: &[Holding], holder: u64, now: Nanos) -> Vec<Holding> {
        let State::Holders { entries } = release(entries, holder, now, u64::MAX) else { panic!() };
        entries
    }

    #[test]
    fn a_holder_that_stops_renewing_stops_counting_after_the_stale_bound() {
        let died = Nanos::from_secs(10);
        let dead = [Holding { holder: A, count: 3, renewed_at: died.as_u64() }];

        let just_before = died.saturating_add(STALE_AFTER).saturating_sub(Nanos(1));
        let (before, _) = decide(3, &dead, B, just_before, 1);
        let (after, state) = decide(3, &dead, B, died.saturating_add(STALE_AFTER), 1);

        assert_eq!(before.verdict, Verdict::Exceeds);
        assert_eq!(after.verdict, Verdict::Allowed);
        assert_eq!(
            entries(state),
            vec![Holding { holder: B, count: 1, renewed_at: (died.saturating_add(STALE_AFTER)).as_u64() }]
        );
    }

    #[test]
    fn renewal_sets_the_holders_count_to_what_it_knows_and_keeps_it_live() {
        let now = Nanos::from_secs(10);
        let drifted = [Holding { holder: A, count: 5, renewed_at: 0 }];

        let later = now.saturating_add(STALE_AFTER);
        let Some(State::Holders { entries: renewed }) = renew(&drifted, A, 2, now) else { panic!() };

        assert_eq!(in_flight(&renewed, now), 2);
        assert_eq!(in_flight(&renewed, later.saturating_sub(Nanos(1))), 2);
        assert_eq!(in_flight(&renewed, later), 0);
    }

    #[test]
    fn a_key_with_every_holder_slot_taken_rejects_a_new_holder() {
        let now = Nanos::from_secs(10);
        let full: Vec<Holding> =
            (0..MAX_HOLDERS as u64).map(|holder| Holding { holder, count: 1, renewed_at: now.as_u64() }).collect();

        let (decision, _) = decide(u64::MAX, &full, u64::MAX, now, 1);

        assert_eq!(decision.verdict, Verdict::Exceeds);
    }
}
