//! One lease record and its fixed-width encoding: two pools of tokens with their
//! expiries, the hold for a waiter, the refill in flight, the debt and the charge that
//! carries it.

use super::demand::Demand;
use shared_store::{Nanos, words};
use sluice_protocol::{AppliedOverride, OverrideId, OverrideKind};

/// Attempts at one record update before giving up (the failure rule then decides).
pub(crate) const MAX_ATTEMPTS: u32 = 16;
/// How long unpaid debt keeps its slot: after this, another key may take the slot and
/// the debt is forgiven (counted as `lease.forgiven`). Charges are retried meanwhile.
pub(crate) const DEBT_LIFE: Nanos = Nanos::from_secs(60);
/// The record's format version.
pub(crate) const VERSION: u8 = 6;
/// Encoded fields, each a little-endian u64.
pub(crate) const FIELDS: usize = 30;
/// Version 5, a record without the key's demand (written by an earlier build), is still
/// read.
const VERSION_5: u8 = 5;
/// The fields of a version-5 record.
const FIELDS_V5: usize = 27;
/// Version 4, a record without `asked_at` (written by an earlier build), is still read.
const VERSION_4: u8 = 4;
/// The fields of a version-4 record.
const FIELDS_V4: usize = 26;
/// Version 3, a record without the override of its latest grant (written by an earlier
/// build), is still read.
const VERSION_3: u8 = 3;
/// The fields of a version-3 record.
const FIELDS_V3: usize = 24;
/// Version 2, a record without `charge_since` and `granted_at` (written by an earlier build: shared data
/// outlives a VM), is still read.
const VERSION_2: u8 = 2;
/// The fields of a version-2 record.
const FIELDS_V2: usize = 22;
/// Encoded size: version, then the fields.
pub(crate) const SIZE: usize = words::width(FIELDS);

/// Tokens spendable until a moment.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Pool {
    pub(crate) tokens: u64,
    pub(crate) expires_at: Nanos,
}

impl Pool {
    pub(crate) fn live(&self, now: Nanos) -> u64 {
        if now < self.expires_at { self.tokens } else { 0 }
    }

    /// Takes up to `want`; returns what it took.
    pub(crate) fn take(&mut self, want: u64, now: Nanos) -> u64 {
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
    /// When the charge in flight (`charge_id`) was first claimed: it is sent again with
    /// its id only within `DEBT_LIFE` of this, while the service still remembers the id.
    pub(crate) charge_since: Nanos,
    /// When tokens were last granted (0: never): a request that waited past its deadline
    /// while grants arrived was outrun by others, not failed by the service.
    pub(crate) granted_at: Nanos,
    /// Whose debt it is, for a charge sent without its caller: the global counter's key
    /// and the check tag it lives under (kept once debt is owed).
    pub(crate) counter: u128,
    pub(crate) tag: Option<u128>,
    /// The operator's override the latest grant was decided under (the counter
    /// service's id, and its kind: 0 none, 1 bypass, 2 clamp): what the requests
    /// spending this lease are decided under.
    pub(crate) override_id: u64,
    pub(crate) override_kind: u64,
    /// When a refill was last elected (0: never, or not known): while the service says
    /// the budget is empty, the next is elected no sooner than a lease duration later.
    pub(crate) asked_at: Nanos,
    /// The key's demand on this proxy: how it is served, and what a refill asks for.
    pub(crate) demand: Demand,
}

impl Record {
    pub(crate) fn fields(&self) -> [u64; FIELDS] {
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
            self.charge_since.0,
            self.granted_at.0,
            self.override_id,
            self.override_kind,
            self.asked_at.0,
            self.demand.since.0,
            self.demand.current,
            self.demand.previous,
        ]
    }

    pub(crate) fn encode(&self) -> [u8; SIZE] {
        words::encode(VERSION, &self.fields())
    }

    /// `None` for bytes that are not a record of this version (or of version 5, whose
    /// demand is not known; 4, whose last election is not known; 3, granted under no override; or 2, whose charge in
    /// flight is taken as first claimed when its last send's window ended).
    pub(crate) fn decode(bytes: &[u8]) -> Option<Self> {
        if let Some((VERSION, fields)) = words::decode::<FIELDS>(bytes) {
            return Some(Self::from_fields(fields));
        }
        let mut fields = [0; FIELDS];
        if let Some((VERSION_5, old)) = words::decode::<FIELDS_V5>(bytes) {
            // No demand known: served by a lease, as before.
            for (field, value) in fields.iter_mut().zip(old) {
                *field = value;
            }
            return Some(Self::from_fields(fields));
        }
        if let Some((VERSION_4, old)) = words::decode::<FIELDS_V4>(bytes) {
            // No election known: the next may be elected at once.
            for (field, value) in fields.iter_mut().zip(old) {
                *field = value;
            }
            return Some(Self::from_fields(fields));
        }
        if let Some((VERSION_3, old)) = words::decode::<FIELDS_V3>(bytes) {
            // No override known: none.
            for (field, value) in fields.iter_mut().zip(old) {
                *field = value;
            }
            return Some(Self::from_fields(fields));
        }
        let (VERSION_2, old) = words::decode::<FIELDS_V2>(bytes)? else { return None };
        for (field, value) in fields.iter_mut().zip(old) {
            *field = value;
        }
        // charge_since: charge_until, the 17th field; granted_at: unknown (0).
        fields[FIELDS_V3 - 2] = old[16];
        Some(Self::from_fields(fields))
    }

    fn from_fields(fields: [u64; FIELDS]) -> Self {
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
            charge_since,
            granted_at,
            override_id,
            override_kind,
            asked_at,
            demand_since,
            demand_current,
            demand_previous,
        ] = fields;
        let wide = |low: u64, high: u64| u128::from(low) | (u128::from(high) << 64);
        Self {
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
            charge_since: Nanos(charge_since),
            granted_at: Nanos(granted_at),
            counter: wide(counter_low, counter_high),
            tag: (has_tag != 0).then(|| wide(tag_low, tag_high)),
            override_id,
            override_kind,
            asked_at: Nanos(asked_at),
            demand: Demand { since: Nanos(demand_since), current: demand_current, previous: demand_previous },
        }
    }

    /// The override its latest grant was decided under, if any.
    pub(crate) fn under(&self) -> Option<AppliedOverride> {
        let kind = match self.override_kind {
            1 => OverrideKind::Bypass,
            2 => OverrideKind::Clamp,
            _ => return None,
        };
        Some(AppliedOverride { id: OverrideId(self.override_id), kind })
    }

    /// Remembers the override a grant was decided under (`None`: none).
    pub(crate) fn set_under(&mut self, under: Option<AppliedOverride>) {
        (self.override_id, self.override_kind) = match under {
            None => (0, 0),
            Some(AppliedOverride { id, kind: OverrideKind::Bypass }) => (id.0, 1),
            Some(AppliedOverride { id, kind: OverrideKind::Clamp }) => (id.0, 2),
        };
    }

    /// The tokens any request may spend at `now` (not the held ones).
    pub(crate) fn live_tokens(&self, now: Nanos) -> u64 {
        self.first.live(now).saturating_add(self.second.live(now))
    }

    /// Owes up to `units` more, never more than `max_debt` in all, on the global counter
    /// `counter` under check tag `tag`; returns what it owes of them (the rest is forgiven
    /// by the caller).
    pub(crate) fn owe(&mut self, units: u64, max_debt: u64, (counter, tag): (u128, Option<u128>), now: Nanos) -> u64 {
        let owed = units.min(max_debt.saturating_sub(self.debt));
        if owed > 0 {
            self.debt = self.debt.saturating_add(owed);
            self.owed_at = now;
            self.counter = counter;
            self.tag = tag;
        }
        owed
    }

    /// Takes `cost` from the pools, the earlier expiry first, and answers the expiry of
    /// the earliest pool it took from (what a spend given back may live until). The
    /// caller checked that they hold it.
    pub(crate) fn take(&mut self, cost: u64, now: Nanos) -> Nanos {
        let until = if self.first.live(now) > 0 { self.first.expires_at } else { self.second.expires_at };
        let from_first = self.first.take(cost, now);
        let _ = self.second.take(cost - from_first, now);
        until
    }

    /// Whether the record carries nothing that another key could lose by taking the
    /// slot: no live tokens (held or not), no refill or charge in flight, no empty
    /// budget to remember, and no debt younger than [`DEBT_LIFE`].
    pub(crate) fn is_idle(&self, now: Nanos) -> bool {
        self.live_tokens(now) == 0
            && self.held.live(now) == 0
            && now >= self.refill_until
            && now >= self.empty_until
            && now >= self.charge_until
            && (self.debt == 0 || now >= self.owed_at.saturating_add(DEBT_LIFE))
    }

    /// Drops pools that have expired, keeping the live ones in expiry order; returns the
    /// tokens that expired unspent.
    pub(crate) fn drop_expired(&mut self, now: Nanos) -> u64 {
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
