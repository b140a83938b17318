//! The lease record (the lease-mode stage that uses it is `leased.rs`): a proxy's share
//! of a global budget, kept in shared data and spent by every worker with compare-and-swap,
//! like a local bucket.
//!
//! One record per caller key and proxy (in a slot table, like local buckets):
//!
//! * two **pools** of tokens, each spendable until its own expiry (the filter's monotonic
//!   clock, anchored at the moment the refill was sent, so never later than the service
//!   said). The pool that expires first is spent first. A grant never extends the life
//!   of tokens already held: it becomes the second pool; if both pools are still live,
//!   the older two are merged under the *earlier* expiry (stricter, never looser);
//! * a **hold**: the tokens of a grant that a waiting request elected and asked for, kept
//!   for that request alone (`held_for`), so that a grant a waiter paid a round trip for
//!   is not spent by requests that arrived meanwhile;
//! * `refill_until`: a refill is in flight, elected through this record; past this
//!   deadline the election is void, so a worker that died or whose callout never returns
//!   cannot block refills for longer than one callout's deadline;
//! * `empty_until`: the service granted nothing (the global budget is spent); until then
//!   requests the live tokens cannot cover are rejected with the time left, without
//!   asking again;
//! * `failed_at`: the last refill that failed: requests waiting for it apply the failure
//!   rule at once;
//! * `debt`: units admitted under the failure rule while the service could not decide,
//!   to be charged to the global budget once it answers again (bounded by `max_debt`),
//!   with `owed_at` (debt older than [`DEBT_LIFE`] no longer holds the slot) and the
//!   charge in flight (`charging` units under `charge_id` until `charge_until`), so one
//!   debt is never charged twice: a charge that timed out is sent again with the same id,
//!   which the service recognises.
//!
//! Every change is one CAS write of the whole record, retried a bounded number of times.
//! A record another key holds (the slot is taken by a lease that still carries something)
//! is not shared: the request takes its policy's failure rule (`lease_slot_taken`), never
//! someone else's tokens. A slot changes hands only when its record is idle; stale debt
//! is forgiven then, and counted.

use shared_store::{Change, Nanos, Placement, Store, UpdateError, words};

/// Attempts at one record update before giving up (the failure rule then decides).
pub(crate) const MAX_ATTEMPTS: u32 = 16;
/// How long unpaid debt keeps its slot: after this, another key may take the slot and
/// the debt is forgiven (counted as `lease.forgiven`). Charges are retried meanwhile.
pub(crate) const DEBT_LIFE: Nanos = Nanos::from_secs(60);
/// The record's format version.
const VERSION: u8 = 2;
/// Encoded fields, each a little-endian u64.
const FIELDS: usize = 22;
/// Encoded size: version, then the fields.
const SIZE: usize = words::width(FIELDS);

/// Tokens spendable until a moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pool {
    pub(crate) tokens: u64,
    pub(crate) expires_at: Nanos,
}

impl Pool {
    fn live(&self, now: Nanos) -> u64 {
        if now < self.expires_at { self.tokens } else { 0 }
    }

    /// Takes up to `want`; returns what it took.
    fn take(&mut self, want: u64, now: Nanos) -> u64 {
        let taken = self.live(now).min(want);
        self.tokens -= taken;
        taken
    }
}

/// A lease record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) owner: u64,
    /// Spent first: the pool that expires first.
    pub(crate) first: Pool,
    /// Spent second: a later grant.
    pub(crate) second: Pool,
    /// Tokens kept for one waiting request.
    pub(crate) held: Pool,
    /// The waiter they are kept for.
    pub(crate) held_for: u64,
    pub(crate) refill_until: Nanos,
    pub(crate) empty_until: Nanos,
    pub(crate) failed_at: Nanos,
    /// Why the last refill failed ([`super::wire::Reason::index`]).
    pub(crate) failed_reason: u64,
    pub(crate) debt: u64,
    pub(crate) owed_at: Nanos,
    /// Of `debt`, the units a charge in flight carries.
    pub(crate) charging: u64,
    pub(crate) charge_id: u64,
    pub(crate) charge_until: Nanos,
    /// Whose debt it is, for a charge sent without its caller: the global counter's key
    /// and the check tag it lives under (kept once debt is owed).
    pub(crate) counter: u128,
    pub(crate) tag: Option<u128>,
}

impl Record {
    fn fields(&self) -> [u64; FIELDS] {
        [
            self.owner,
            self.first.tokens,
            self.first.expires_at.0,
            self.second.tokens,
            self.second.expires_at.0,
            self.held.tokens,
            self.held.expires_at.0,
            self.held_for,
            self.refill_until.0,
            self.empty_until.0,
            self.failed_at.0,
            self.failed_reason,
            self.debt,
            self.owed_at.0,
            self.charging,
            self.charge_id,
            self.charge_until.0,
            self.counter as u64,
            (self.counter >> 64) as u64,
            u64::from(self.tag.is_some()),
            self.tag.unwrap_or(0) as u64,
            (self.tag.unwrap_or(0) >> 64) as u64,
        ]
    }

    pub(crate) fn encode(&self) -> [u8; SIZE] {
        words::encode(VERSION, &self.fields())
    }

    /// `None` for bytes that are not a record of this version.
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        let (VERSION, fields) = words::decode::<FIELDS>(bytes)? else { return None };
        let [
            owner,
            first_tokens,
            first_expires_at,
            second_tokens,
            second_expires_at,
            held_tokens,
            held_expires_at,
            held_for,
            refill_until,
            empty_until,
            failed_at,
            failed_reason,
            debt,
            owed_at,
            charging,
            charge_id,
            charge_until,
            counter_low,
            counter_high,
            has_tag,
            tag_low,
            tag_high,
        ] = fields;
        let wide = |low: u64, high: u64| u128::from(low) | (u128::from(high) << 64);
        Some(Self {
            owner,
            first: Pool { tokens: first_tokens, expires_at: Nanos(first_expires_at) },
            second: Pool { tokens: second_tokens, expires_at: Nanos(second_expires_at) },
            held: Pool { tokens: held_tokens, expires_at: Nanos(held_expires_at) },
            held_for,
            refill_until: Nanos(refill_until),
            empty_until: Nanos(empty_until),
            failed_at: Nanos(failed_at),
            failed_reason,
            debt,
            owed_at: Nanos(owed_at),
            charging,
            charge_id,
            charge_until: Nanos(charge_until),
            counter: wide(counter_low, counter_high),
            tag: (has_tag != 0).then(|| wide(tag_low, tag_high)),
        })
    }

    /// The tokens any request may spend at `now` (not the held ones).
    pub(crate) fn live_tokens(&self, now: Nanos) -> u64 {
        self.first.live(now).saturating_add(self.second.live(now))
    }

    /// Takes `cost` from the pools, the earlier expiry first. The caller checked that
    /// they hold it.
    fn take(&mut self, cost: u64, now: Nanos) {
        let from_first = self.first.take(cost, now);
        let _ = self.second.take(cost - from_first, now);
    }

    /// Whether the record carries nothing that another key could lose by taking the
    /// slot: no live tokens (held or not), no refill or charge in flight, no empty
    /// budget to remember, and no debt younger than [`DEBT_LIFE`].
    fn is_idle(&self, now: Nanos) -> bool {
        self.live_tokens(now) == 0
            && self.held.live(now) == 0
            && now >= self.refill_until
            && now >= self.empty_until
            && now >= self.charge_until
            && (self.debt == 0 || now >= self.owed_at.saturating_add(DEBT_LIFE))
    }

    /// Drops pools that have expired, keeping the live ones in expiry order; returns the
    /// tokens that expired unspent.
    fn drop_expired(&mut self, now: Nanos) -> u64 {
        let mut expired = 0u64;
        for pool in [&mut self.first, &mut self.second] {
            if pool.live(now) == 0 {
                expired = expired.saturating_add(pool.tokens);
                *pool = Pool::default();
            }
        }
        if self.held.live(now) == 0 {
            expired = expired.saturating_add(self.held.tokens);
            self.held = Pool::default();
            self.held_for = 0;
        }
        if self.first.tokens == 0 {
            self.first = std::mem::take(&mut self.second);
        }
        expired
    }
}

/// The settings a spend needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// Ask for a refill below this many tokens.
    pub(crate) low_water: u64,
    /// How long an election holds (the callout's deadline and a margin).
    pub(crate) refill_window: Nanos,
}

/// What a spend found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spend {
    /// Spent; `refill` when this request was elected to ask for more (low water).
    Spent { refill: bool },
    /// Not enough tokens; a refill is in flight (`elected`: this request started it, for
    /// itself: the grant will be held for it).
    Wait { elected: bool },
    /// The service granted nothing until then (the global budget is spent).
    Empty { until: Nanos },
    /// The last refill failed (for this reason index) after the request began waiting:
    /// apply the failure rule.
    Failed { reason: u64 },
    /// The slot is held by another key's lease: the failure rule (`lease_slot_taken`).
    Taken,
}

/// What an update did, besides its result: debt it forgave by taking a slot whose
/// holder's debt had aged out (to be counted as `lease.forgiven`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Updated<T> {
    /// The change's result; `None` when the slot is held by another key.
    pub(crate) result: Option<T>,
    /// Debt forgiven by taking the slot over.
    pub(crate) forgiven: u64,
}

/// A charge to send: `units` under `id`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Charge {
    pub(crate) units: u64,
    pub(crate) id: u64,
}

/// What a settled charge leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Settled {
    /// Whether the record still carried this charge (and now no longer does).
    pub(crate) settled: bool,
    /// Debt still owed (added while the charge was in flight).
    pub(crate) left: u64,
}

/// Reads and updates lease records over a [`Store`].
pub(crate) struct Leases<'a, S> {
    pub(crate) store: &'a S,
    pub(crate) anchor: &'a str,
}

impl<S: Store> Leases<'_, S> {
    /// Runs `change` on the caller's record until its write lands. `change` answers
    /// whether to write the record and a result. Undecodable bytes read as an idle
    /// record (nothing owed, nothing to spend): the slot is reused, never someone's fresh
    /// budget (tokens come from grants).
    fn update<T>(
        &self,
        place: &Placement,
        now: Nanos,
        mut change: impl FnMut(&mut Record) -> (bool, T),
    ) -> Result<Updated<T>, UpdateError> {
        #[cfg(feature = "mutant-lease-no-cas")]
        let store = &mutant::Unconditional(self.store);
        #[cfg(not(feature = "mutant-lease-no-cas"))]
        let store = self.store;
        let landed = shared_store::update(store, self.anchor, &place.key, MAX_ATTEMPTS, |current| {
            let fresh = Record { owner: place.owner, ..Record::default() };
            let (mut record, forgiven) = match current.map(|bytes| Record::decode(bytes).unwrap_or_default()) {
                Some(record) if record.owner == place.owner => (record, 0),
                Some(record) if !record.is_idle(now) => return Change::Keep(Updated { result: None, forgiven: 0 }),
                Some(record) => (fresh, record.debt),
                None => (fresh, 0),
            };
            let (write, result) = change(&mut record);
            let updated = Updated { result: Some(result), forgiven };
            // Taking a slot over is a change of owner even when `change` writes nothing.
            if write || forgiven > 0 { Change::Write(record.encode(), updated) } else { Change::Keep(updated) }
        })?;
        Ok(landed.result)
    }

    /// Spends `cost` from the caller's lease, electing this request to refill when it
    /// runs low (or out). `waiter` is the request's id, for a grant it elects.
    pub(crate) fn spend(
        &self,
        place: &Placement,
        cost: u64,
        now: Nanos,
        rules: Rules,
    ) -> Result<Updated<Spend>, UpdateError> {
        let outcome = self.update(place, now, |record| {
            let live = record.live_tokens(now);
            let refill_free = now >= record.refill_until;
            if live >= cost {
                record.take(cost, now);
                let left = record.live_tokens(now);
                let refill = refill_free && left < rules.low_water && now >= record.empty_until;
                if refill {
                    record.refill_until = now.saturating_add(rules.refill_window);
                }
                return (true, Spend::Spent { refill });
            }
            if now < record.empty_until {
                return (false, Spend::Empty { until: record.empty_until });
            }
            if !refill_free {
                return (false, Spend::Wait { elected: false });
            }
            record.refill_until = now.saturating_add(rules.refill_window);
            (true, Spend::Wait { elected: true })
        })?;
        Ok(taken_if_none(outcome))
    }

    /// Tries again for a request waiting since `since`: spends what is held for it
    /// (`waiter`) or what the pools have; rejects when the service granted nothing;
    /// applies the failure rule when the refill failed; otherwise, while `may_elect`
    /// (its deadline has not passed), elects a refill for itself if none is in flight,
    /// or keeps waiting.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn retry(
        &self,
        place: &Placement,
        cost: u64,
        now: Nanos,
        since: Nanos,
        waiter: u64,
        may_elect: bool,
        rules: Rules,
    ) -> Result<Updated<Spend>, UpdateError> {
        let outcome = self.update(place, now, |record| {
            if record.held_for == waiter && record.held.live(now) >= cost {
                // What was kept for this request; any excess goes to the pools.
                let extra = record.held.live(now) - cost;
                let held = std::mem::take(&mut record.held);
                record.held_for = 0;
                if extra > 0 {
                    add_pool(record, Pool { tokens: extra, expires_at: held.expires_at }, now);
                }
                return (true, Spend::Spent { refill: false });
            }
            if record.live_tokens(now) >= cost {
                record.take(cost, now);
                return (true, Spend::Spent { refill: false });
            }
            if now < record.empty_until {
                return (false, Spend::Empty { until: record.empty_until });
            }
            if record.failed_at >= since && record.failed_at > Nanos::ZERO {
                return (false, Spend::Failed { reason: record.failed_reason });
            }
            if may_elect && now >= record.refill_until {
                record.refill_until = now.saturating_add(rules.refill_window);
                return (true, Spend::Wait { elected: true });
            }
            (false, Spend::Wait { elected: false })
        })?;
        Ok(taken_if_none(outcome))
    }

    /// Gives back what a spend took (another policy of the request rejected it). Tokens
    /// commute, so this is exact while the pool lives; an expired lease keeps nothing.
    pub(crate) fn give_back(&self, place: &Placement, cost: u64, now: Nanos) -> Result<(), UpdateError> {
        let _ = self.update(place, now, |record| {
            let pool = if now < record.first.expires_at {
                &mut record.first
            } else if now < record.second.expires_at {
                &mut record.second
            } else {
                return (false, ());
            };
            pool.tokens = pool.tokens.saturating_add(cost);
            (true, ())
        })?;
        Ok(())
    }

    /// Records units admitted under the failure rule, up to `max_debt` owed, on the
    /// global counter `counter` under check tag `tag`. Returns what did not fit
    /// (forgiven at once) and whether the record now owes something (a charge is to be
    /// scheduled).
    pub(crate) fn owe(
        &self,
        place: &Placement,
        cost: u64,
        max_debt: u64,
        (counter, tag): (u128, Option<u128>),
        now: Nanos,
    ) -> Result<Updated<(u64, bool)>, UpdateError> {
        let updated = self.update(place, now, |record| {
            let room = max_debt.saturating_sub(record.debt);
            let owed = cost.min(room);
            record.debt = record.debt.saturating_add(owed);
            if owed > 0 {
                record.owed_at = now;
                record.counter = counter;
                record.tag = tag;
            }
            (owed > 0, (cost - owed, record.debt > 0))
        })?;
        Ok(Updated { result: Some(updated.result.unwrap_or((cost, false))), forgiven: updated.forgiven })
    }

    /// Applies a grant answered to a refill sent at `sent_at`: the tokens live until
    /// `sent_at + expires_in` (never later than the service said). When the refill was
    /// elected by a waiting request (`for_waiter`) and the grant covers `min_tokens`,
    /// those are held for it. With nothing granted, the budget is empty for
    /// `retry_after`; when the grant left the budget short of what was asked,
    /// requests the tokens cannot cover are rejected for `empty_after` (the service's
    /// wait until it could grant again) rather than each asking in turn. Returns the
    /// tokens that had expired unspent (forfeited).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn grant(
        &self,
        place: &Placement,
        granted: u64,
        for_waiter: Option<(u64, u64)>,
        sent_at: Nanos,
        expires_in: Nanos,
        (retry_after, empty_after): (Nanos, Nanos),
        now: Nanos,
    ) -> Result<Updated<u64>, UpdateError> {
        self.update(place, now, |record| {
            let expired = record.drop_expired(now);
            record.refill_until = Nanos::ZERO;
            record.failed_at = Nanos::ZERO;
            let expires_at = sent_at.saturating_add(expires_in);
            if granted == 0 || expires_at <= now {
                record.empty_until = now.saturating_add(retry_after.max(Nanos(1)));
                return (true, expired.saturating_add(if granted > 0 { granted } else { 0 }));
            }
            record.empty_until = if empty_after > Nanos::ZERO { now.saturating_add(empty_after) } else { Nanos::ZERO };
            let mut pool = Pool { tokens: granted, expires_at };
            if let Some((waiter, min_tokens)) = for_waiter
                && granted >= min_tokens
                && record.held.live(now) == 0
            {
                record.held = Pool { tokens: min_tokens, expires_at };
                record.held_for = waiter;
                pool.tokens -= min_tokens;
            }
            if pool.tokens > 0 {
                add_pool(record, pool, now);
            }
            (true, expired)
        })
        .map(|u| Updated { result: Some(u.result.unwrap_or(0)), forgiven: u.forgiven })
    }

    /// Records that a refill failed: waiting requests apply the failure rule, and the
    /// election is free again.
    pub(crate) fn refill_failed(&self, place: &Placement, reason: u64, now: Nanos) -> Result<(), UpdateError> {
        let _ = self.update(place, now, |record| {
            record.refill_until = Nanos::ZERO;
            record.failed_at = now.max(Nanos(1));
            record.failed_reason = reason;
            (true, ())
        })?;
        Ok(())
    }

    /// Claims the record's debt for a charge: a fresh charge of what is owed under a new
    /// `id`, or, when an earlier charge's answer never came (`charge_until` passed), that
    /// same charge again (same units, same id: the service applies an id once). `None`
    /// when nothing is owed or a charge is in flight. Debt older than [`DEBT_LIFE`] is
    /// forgiven instead (returned as the second value, to be counted).
    pub(crate) fn claim_charge(
        &self,
        place: &Placement,
        id: u64,
        window: Nanos,
        now: Nanos,
    ) -> Result<(Option<Charge>, u64), UpdateError> {
        let updated = self.update(place, now, |record| {
            if record.debt == 0 {
                return (false, (None, 0));
            }
            if now >= record.owed_at.saturating_add(DEBT_LIFE) && now >= record.charge_until {
                let forgiven = std::mem::take(&mut record.debt);
                record.charging = 0;
                record.charge_until = Nanos::ZERO;
                return (true, (None, forgiven));
            }
            if now < record.charge_until {
                return (false, (None, 0));
            }
            if record.charging == 0 {
                record.charging = record.debt;
                record.charge_id = id;
            }
            record.charge_until = now.saturating_add(window);
            (true, (Some(Charge { units: record.charging, id: record.charge_id }), 0))
        })?;
        let (charge, aged) = updated.result.unwrap_or((None, 0));
        Ok((charge, aged.saturating_add(updated.forgiven)))
    }

    /// Takes a charge's units off the debt once the service has answered it (charged or
    /// forgiven), if it is still this record's charge.
    pub(crate) fn settle_charge(&self, place: &Placement, id: u64, now: Nanos) -> Result<Settled, UpdateError> {
        let updated = self.update(place, now, |record| {
            if record.charge_id != id || record.charging == 0 {
                return (false, Settled { settled: false, left: record.debt });
            }
            record.debt = record.debt.saturating_sub(record.charging);
            record.charging = 0;
            record.charge_until = Nanos::ZERO;
            (true, Settled { settled: true, left: record.debt })
        })?;
        Ok(updated.result.unwrap_or(Settled { settled: false, left: 0 }))
    }

    /// The caller's record as it stands (`None` when the slot is another key's).
    pub(crate) fn peek(&self, place: &Placement, now: Nanos) -> Result<Option<Record>, UpdateError> {
        Ok(self.update(place, now, |record| (false, *record))?.result)
    }

    /// The record in `key`, whoever holds it (a sweep over a table); `None` when there is
    /// none, or it is not a record.
    pub(crate) fn read_slot(&self, key: &str) -> Result<Option<Record>, UpdateError> {
        Ok(self.store.get(key)?.and_then(|entry| Record::decode(&entry.value)))
    }
}

/// Adds a live pool: it becomes the second pool; if both are live, the first two merge
/// under the earlier expiry.
fn add_pool(record: &mut Record, pool: Pool, now: Nanos) {
    if record.first.live(now) == 0 {
        record.first = std::mem::take(&mut record.second);
    }
    if record.first.live(now) == 0 {
        record.first = pool;
        return;
    }
    if record.second.live(now) > 0 {
        let merged = Pool {
            tokens: record.first.tokens.saturating_add(record.second.tokens),
            expires_at: record.first.expires_at.min(record.second.expires_at),
        };
        record.first = merged;
    }
    // Keep the pool that expires first in front.
    if pool.expires_at < record.first.expires_at {
        record.second = std::mem::replace(&mut record.first, pool);
    } else {
        record.second = pool;
    }
}

fn taken_if_none(updated: Updated<Spend>) -> Updated<Spend> {
    Updated { result: Some(updated.result.unwrap_or(Spend::Taken)), forgiven: updated.forgiven }
}

/// A lease record as tests and the fleet simulation see it (decoded from shared data).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LeaseView {
    /// Whose it is (the slot owner tag).
    pub owner: u64,
    /// Tokens any request may spend, and when each pool expires.
    pub pools: [(u64, Nanos); 2],
    /// Tokens held for one waiting request, and when they expire.
    pub held: (u64, Nanos),
    /// Units owed to the global budget.
    pub debt: u64,
    /// When debt was last added.
    pub owed_at: Nanos,
    /// Of the debt, the units a charge in flight carries.
    pub charging: u64,
    /// Until when the budget is known to be empty.
    pub empty_until: Nanos,
    /// Until when a refill election holds.
    pub refill_until: Nanos,
}

/// Decodes a lease record's bytes (`None` when they are not one).
pub fn inspect_lease_record(bytes: &[u8]) -> Option<LeaseView> {
    let r = Record::decode(bytes)?;
    Some(LeaseView {
        owner: r.owner,
        pools: [(r.first.tokens, r.first.expires_at), (r.second.tokens, r.second.expires_at)],
        held: (r.held.tokens, r.held.expires_at),
        debt: r.debt,
        owed_at: r.owed_at,
        charging: r.charging,
        empty_until: r.empty_until,
        refill_until: r.refill_until,
    })
}

/// The test-only mutant (see Cargo.toml): lease records written without CAS, to show
/// that the fleet simulation catches a lost update.
#[cfg(feature = "mutant-lease-no-cas")]
mod mutant {
    use shared_store::{Cas, Entry, Store, StoreError, Swap};

    /// A store whose conditional writes are unconditional.
    pub(super) struct Unconditional<'a, S>(pub(super) &'a S);

    impl<S: Store> Store for Unconditional<'_, S> {
        fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
            self.0.get(key)
        }
        fn set(&self, key: &str, value: &[u8], _: Option<Cas>) -> Result<Swap, StoreError> {
            self.0.set(key, value, None)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use shared_store::MemoryStore;

    const RULES: Rules = Rules { low_water: 2, refill_window: Nanos(100) };
    const T: Nanos = Nanos(1_000_000);

    fn place() -> Placement {
        Placement { key: "l/0".into(), owner: 7, overflow: None }
    }

    fn at(n: u64) -> Nanos {
        T.saturating_add(Nanos(n))
    }

    fn spend(leases: &Leases<'_, MemoryStore>, cost: u64, now: Nanos) -> Spend {
        leases.spend(&place(), cost, now, RULES).unwrap().result.unwrap()
    }

    fn retry(leases: &Leases<'_, MemoryStore>, cost: u64, now: Nanos, since: Nanos, waiter: u64) -> Spend {
        leases.retry(&place(), cost, now, since, waiter, true, RULES).unwrap().result.unwrap()
    }

    fn grant(leases: &Leases<'_, MemoryStore>, n: u64, sent: Nanos, life: u64, now: Nanos) -> u64 {
        leases.grant(&place(), n, None, sent, Nanos(life), (Nanos::ZERO, Nanos::ZERO), now).unwrap().result.unwrap()
    }

    fn record(store: &MemoryStore) -> Record {
        Record::decode(&store.get("l/0").unwrap().unwrap().value).unwrap()
    }

    #[test]
    fn the_first_request_elects_a_refill_and_waits_and_others_wait_without_electing() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };

        assert_eq!(spend(&leases, 1, T), Spend::Wait { elected: true });
        assert_eq!(spend(&leases, 1, T), Spend::Wait { elected: false });
        // The election expires with its window: a dead refiller blocks nobody for long.
        assert_eq!(spend(&leases, 1, at(100)), Spend::Wait { elected: true });
    }

    #[test]
    fn a_grant_is_spent_until_it_runs_low_then_one_refill_is_elected() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        let _ = spend(&leases, 1, T);
        grant(&leases, 4, T, 1000, T);

        let spends: Vec<Spend> = (0..5).map(|_| spend(&leases, 1, T)).collect();

        assert_eq!(
            spends,
            [
                Spend::Spent { refill: false },
                Spend::Spent { refill: false },
                Spend::Spent { refill: true },
                Spend::Spent { refill: false },
                Spend::Wait { elected: false },
            ]
        );
    }

    #[test]
    fn tokens_expire_at_the_anchor_plus_the_lease_and_are_counted_as_forfeited() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        grant(&leases, 5, T, 1000, T);

        let later = at(1000);
        let retried = retry(&leases, 1, later, later, 1);
        let forfeited = grant(&leases, 3, later, 1000, later);

        assert_eq!(retried, Spend::Wait { elected: true });
        assert_eq!(forfeited, 5);
        assert_eq!(retry(&leases, 3, later, later, 1), Spend::Spent { refill: false });
    }

    #[test]
    fn a_new_grant_never_extends_the_life_of_tokens_already_held() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        grant(&leases, 5, T, 1000, T);
        // A second grant arrives while three of the first are left: they keep their expiry.
        for _ in 0..2 {
            let _ = spend(&leases, 1, at(10));
        }
        grant(&leases, 4, at(500), 1000, at(510));

        let before_first_expiry = record(&store).live_tokens(at(999));
        let after_first_expiry = record(&store).live_tokens(at(1000));

        assert_eq!(before_first_expiry, 7);
        assert_eq!(after_first_expiry, 4, "the first grant's 3 expired with it");
        // The pool that expires first is spent first.
        let _ = spend(&leases, 3, at(600));
        assert_eq!(record(&store).first.tokens, 0);
        assert_eq!(record(&store).live_tokens(at(1000)), 4);
    }

    #[test]
    fn three_live_grants_merge_under_the_earliest_expiry() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        grant(&leases, 2, T, 1000, T);
        grant(&leases, 2, at(100), 1000, at(100));
        grant(&leases, 2, at(200), 1000, at(200));

        let r = record(&store);

        assert_eq!((r.first.tokens, r.first.expires_at), (4, at(1000)));
        assert_eq!((r.second.tokens, r.second.expires_at), (2, at(1200)));
    }

    #[test]
    fn a_grant_a_waiter_elected_is_held_for_it_and_spent_by_no_one_else() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        assert_eq!(spend(&leases, 3, T), Spend::Wait { elected: true });
        leases.grant(&place(), 4, Some((42, 3)), T, Nanos(1000), (Nanos::ZERO, Nanos::ZERO), at(5)).unwrap();

        let newcomer = spend(&leases, 3, at(6));
        let waiter = retry(&leases, 3, at(7), T, 42);

        assert_eq!(newcomer, Spend::Wait { elected: true }, "only the unheld token was there");
        assert_eq!(waiter, Spend::Spent { refill: false });
        assert_eq!(record(&store).live_tokens(at(7)), 1);
    }

    #[test]
    fn an_empty_global_budget_rejects_until_the_service_said_without_asking_again() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        let _ = spend(&leases, 1, T);
        leases.grant(&place(), 0, None, T, Nanos(1000), (Nanos(500), Nanos::ZERO), T).unwrap();

        assert_eq!(spend(&leases, 1, T), Spend::Empty { until: at(500) });
        assert_eq!(spend(&leases, 1, at(500)), Spend::Wait { elected: true });
    }

    #[test]
    fn a_waiter_whose_grant_was_spent_by_others_elects_again_rather_than_waiting_for_nothing() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        let rules = Rules { low_water: 0, ..RULES };
        let _ = leases.spend(&place(), 1, T, rules).unwrap();
        let _ = leases.spend(&place(), 2, T, rules).unwrap();
        grant(&leases, 2, T, 1000, at(10));
        // A request that arrived meanwhile takes the two tokens (no low-water refill).
        let _ = leases.spend(&place(), 2, at(11), rules).unwrap();

        let retried = leases.retry(&place(), 2, at(12), T, 9, true, rules).unwrap().result.unwrap();

        assert_eq!(retried, Spend::Wait { elected: true });
    }

    #[test]
    fn a_failed_refill_sends_its_waiters_to_the_failure_rule() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        let _ = spend(&leases, 1, T);

        leases.refill_failed(&place(), 1, at(10)).unwrap();

        assert_eq!(retry(&leases, 1, at(20), T, 1), Spend::Failed { reason: 1 });
        assert_eq!(spend(&leases, 1, at(20)), Spend::Wait { elected: true });
    }

    #[test]
    fn debt_is_bounded() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };

        let forgiven: Vec<u64> =
            (0..4).map(|_| leases.owe(&place(), 2, 5, (0, None), T).unwrap().result.unwrap().0).collect();

        assert_eq!(forgiven, [0, 0, 1, 2]);
        assert_eq!(record(&store).debt, 5);
    }

    #[test]
    fn a_charge_claims_the_debt_once_and_a_timed_out_one_is_sent_again_under_the_same_id() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        leases.owe(&place(), 3, 10, (0, None), T).unwrap();

        let first = leases.claim_charge(&place(), 11, Nanos(100), T).unwrap().0;
        let while_in_flight = leases.claim_charge(&place(), 12, Nanos(100), at(50)).unwrap().0;
        leases.owe(&place(), 2, 10, (0, None), at(60)).unwrap();
        let after_timeout = leases.claim_charge(&place(), 13, Nanos(100), at(100)).unwrap().0;
        let settled = leases.settle_charge(&place(), 11, at(120)).unwrap();

        assert_eq!(first, Some(Charge { units: 3, id: 11 }));
        assert_eq!(while_in_flight, None, "the debt a charge carries is reserved");
        assert_eq!(after_timeout, Some(Charge { units: 3, id: 11 }), "same units, same id");
        assert_eq!(settled, Settled { settled: true, left: 2 }, "what was owed meanwhile is still owed");
        assert_eq!(
            leases.claim_charge(&place(), 14, Nanos(100), at(130)).unwrap().0,
            Some(Charge { units: 2, id: 14 })
        );
    }

    #[test]
    fn debt_keeps_its_slot_for_its_life_then_the_slot_changes_hands_and_the_debt_is_forgiven() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        leases.owe(&place(), 3, 10, (0, None), T).unwrap();
        let other = Placement { key: "l/0".into(), owner: 9, overflow: None };

        let before = leases.spend(&other, 1, at(DEBT_LIFE.0 - 1), RULES).unwrap();
        let after = leases.spend(&other, 1, at(DEBT_LIFE.0), RULES).unwrap();

        assert_eq!(before.result, Some(Spend::Taken));
        assert_eq!(after, Updated { result: Some(Spend::Wait { elected: true }), forgiven: 3 });
    }

    #[test]
    fn debt_that_cannot_be_charged_within_its_life_is_forgiven_by_the_next_claim() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        leases.owe(&place(), 3, 10, (0, None), T).unwrap();

        let claimed = leases.claim_charge(&place(), 1, Nanos(100), at(DEBT_LIFE.0)).unwrap();

        assert_eq!(claimed, (None, 3));
        assert_eq!(record(&store).debt, 0);
    }

    #[test]
    fn a_slot_held_by_another_keys_active_lease_is_never_shared() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        grant(&leases, 5, T, 1000, T);
        let other = Placement { key: "l/0".into(), owner: 9, overflow: None };

        assert_eq!(leases.spend(&other, 1, T, RULES).unwrap().result, Some(Spend::Taken));
        // Once the lease is idle (expired, nothing owed), the slot changes hands.
        assert_eq!(leases.spend(&other, 1, at(1000), RULES).unwrap().result, Some(Spend::Wait { elected: true }));
    }

    #[test]
    fn a_given_back_spend_is_exact_while_the_lease_lives() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        grant(&leases, 2, T, 1000, T);
        let _ = spend(&leases, 2, T);

        leases.give_back(&place(), 2, T).unwrap();

        // Spendable again; the refill the first spend elected is still in flight.
        assert_eq!(spend(&leases, 2, T), Spend::Spent { refill: false });
    }

    #[test]
    fn a_record_survives_its_encoding() {
        let r = Record {
            owner: 1,
            first: Pool { tokens: 2, expires_at: Nanos(3) },
            second: Pool { tokens: 4, expires_at: Nanos(5) },
            held: Pool { tokens: 6, expires_at: Nanos(7) },
            held_for: 8,
            refill_until: Nanos(9),
            empty_until: Nanos(10),
            failed_at: Nanos(11),
            failed_reason: 12,
            debt: 13,
            owed_at: Nanos(14),
            charging: 15,
            charge_id: 16,
            charge_until: Nanos(17),
            counter: (18 << 64) | 19,
            tag: Some((20 << 64) | 21),
        };

        assert_eq!(Record::decode(&r.encode()), Some(r));
        assert_eq!(Record::decode(&r.encode()[1..]), None);
    }
}
