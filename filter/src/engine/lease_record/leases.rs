//! Every change made to a lease record, each one CAS loop through
//! `shared_store::update`: spend, retry a waiter, give back, take a surplus out to
//! return it, owe, grant, fail a refill, claim and settle a charge, and read one.

use super::record::{DEBT_LIFE, MAX_ATTEMPTS, Pool, Record};
use shared_store::{Change, Nanos, Placement, Store, UpdateError};
use sluice_protocol::AppliedOverride;

/// The settings a spend needs.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rules {
    /// Ask for a refill below this many tokens.
    pub(crate) low_water: u64,
    /// How long an election holds (the callout's deadline and a margin).
    pub(crate) refill_window: Nanos,
    /// While the service says the budget is empty, how often a request asks again
    /// anyway (the lease's duration): an operator's bypass, or the end of a clamp, may
    /// have changed the answer since, and the READMEs promise it is obeyed within the
    /// service's sweep and one lease duration.
    pub(crate) probe_every: Nanos,
    /// A grant's life: the interval the key's demand is counted over.
    pub(crate) life: Nanos,
    /// A key expected to ask for fewer units than this over a lease life is cold: its
    /// request is checked at the service ([`Spend::Cold`]). `0` for a policy whose cost
    /// the response reports (its spend would have to be settled as a check's), which is
    /// always leased, and for one configured so.
    pub(crate) cold_below: u64,
}

impl Rules {
    /// Elects a refill in `record` at `now`.
    fn elect(self, record: &mut Record, now: Nanos) {
        record.refill_until = now.saturating_add(self.refill_window);
        record.asked_at = now;
    }
}

/// What a spend found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spend {
    /// Spent; `refill` when this request was elected to ask for more (low water); `under`
    /// the operator's override the lease's latest grant was decided under; `until` the
    /// expiry of the grant it was spent from, past which it cannot be given back.
    Spent { refill: bool, under: Option<AppliedOverride>, until: Nanos },
    /// Not enough tokens; a refill is in flight (`elected`: this request started it, for
    /// itself: the grant will be held for it).
    Wait { elected: bool },
    /// The service granted nothing until then (the global budget is spent), `under` an
    /// operator's override when its answer said so.
    Empty { until: Nanos, under: Option<AppliedOverride> },
    /// As `Empty`, but a lease duration has passed since the last refill: this request
    /// was elected to ask again (a probe, which it waits for, as for `Wait { elected:
    /// true }`); when no refill can be sent, the empty budget stands.
    Probe { until: Nanos, under: Option<AppliedOverride> },
    /// The last refill failed (for this reason index) after the request began waiting:
    /// apply the failure rule.
    Failed { reason: u64 },
    /// The slot is held by another key's lease: the failure rule (`lease_slot_taken`).
    Taken,
    /// The lease holds too little, and the key is cold (expected to ask for fewer than
    /// [`Rules::cold_below`] units over a lease's life, a key seen for the first time
    /// included): no refill is elected, the request is checked at the service instead.
    Cold,
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

/// What applying a grant did besides adding its tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Granted {
    /// Tokens of earlier grants that had expired unspent (forfeited), and of this one
    /// when it came too late to spend.
    pub(crate) expired: u64,
    /// Debt paid from this grant.
    pub(crate) repaid: u64,
    /// Whether the record owes debt no charge is carrying, once the grant is applied
    /// (`None`: the grant was not applied here, so this is not known).
    pub(crate) owes: Option<bool>,
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
                record.demand.note(cost, now, rules.life);
                let until = record.take(cost, now);
                let left = record.live_tokens(now);
                // A cold key's last tokens are spent without asking for more.
                let warm = !record.demand.is_cold(now, rules.life, rules.cold_below);
                let refill = refill_free && left < rules.low_water && now >= record.empty_until && warm;
                if refill {
                    rules.elect(record, now);
                }
                return (true, Spend::Spent { refill, under: record.under(), until });
            }
            if now < record.empty_until {
                // The service said the budget is empty until then. Once a lease duration
                // has passed since the last refill, one request asks again (a probe, which
                // it waits for); the others are rejected with the service's wait.
                if refill_free && now >= record.asked_at.saturating_add(rules.probe_every) {
                    rules.elect(record, now);
                    return (true, Spend::Probe { until: record.empty_until, under: record.under() });
                }
                return (false, Spend::Empty { until: record.empty_until, under: record.under() });
            }
            if !refill_free {
                // It waits for a refill in flight, and counts toward the demand that sizes
                // the next one: a key whose requests mostly wait would otherwise look
                // quieter than it is, and get grants too small to stop the waiting.
                record.demand.note(cost, now, rules.life);
                return (true, Spend::Wait { elected: false });
            }
            // A key seen for the first time is cold until its demand says otherwise (its
            // first request is checked, exact; a lease would strand what one request does
            // not spend). A key that asked for a refill within the last lease life is not:
            // it is being leased, and a refill that failed or never came is a failure,
            // not coldness.
            let leasing = record.asked_at > Nanos::ZERO && now < record.asked_at.saturating_add(rules.life);
            record.demand.note(cost, now, rules.life);
            if !leasing && record.demand.is_cold(now, rules.life, rules.cold_below) {
                return (true, Spend::Cold);
            }
            rules.elect(record, now);
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
                return (true, Spend::Spent { refill: false, under: record.under(), until: held.expires_at });
            }
            if record.live_tokens(now) >= cost {
                let until = record.take(cost, now);
                return (true, Spend::Spent { refill: false, under: record.under(), until });
            }
            // While a refill is in flight on an empty budget (a probe), its waiters wait
            // for its answer rather than for the wait it may change.
            if now < record.empty_until && now >= record.refill_until {
                return (false, Spend::Empty { until: record.empty_until, under: record.under() });
            }
            if record.failed_at >= since && record.failed_at > Nanos::ZERO {
                return (false, Spend::Failed { reason: record.failed_reason });
            }
            if may_elect && now >= record.refill_until {
                rules.elect(record, now);
                return (true, Spend::Wait { elected: true });
            }
            (false, Spend::Wait { elected: false })
        })?;
        Ok(taken_if_none(outcome))
    }

    /// Gives back what a spend took (another policy of the request rejected it), as a
    /// pool that expires when the grant it was spent from does (`until`; merged with
    /// the others under the earlier expiry, never a later one). Tokens commute, so this
    /// is exact while that grant lives; after it, they have expired and nothing takes
    /// them back. Returns what was not given back (expired).
    pub(crate) fn give_back(&self, place: &Placement, cost: u64, until: Nanos, now: Nanos) -> Result<u64, UpdateError> {
        let updated = self.update(place, now, |record| {
            if now >= until {
                return (false, cost);
            }
            add_pool(record, Pool { tokens: cost, expires_at: until }, now);
            (true, 0)
        })?;
        Ok(updated.result.unwrap_or(cost))
    }

    /// Takes out of the pool of the grant that expires at `expires_at` the tokens this
    /// proxy is not expected to spend before then: the key's demand over the last life
    /// (`life`), scaled to the time left, less what the pools that expire earlier hold
    /// (spent first). Once taken, no worker can spend them: they are the caller's to
    /// return. Nothing is taken from a grant decided under an operator's override (a
    /// bypass spent nothing at the service; a clamp's counter may have moved since), nor
    /// from a pool merged away under an earlier grant's expiry (that grant's review
    /// takes it). Returns the tokens taken.
    pub(crate) fn take_surplus(
        &self,
        place: &Placement,
        expires_at: Nanos,
        life: Nanos,
        now: Nanos,
    ) -> Result<Updated<u64>, UpdateError> {
        let updated = self.update(place, now, |record| {
            if now >= expires_at || record.override_kind != 0 {
                return (false, 0);
            }
            let earlier: u64 =
                [record.first, record.second].iter().filter(|p| p.expires_at < expires_at).map(|p| p.live(now)).sum();
            let expected = record.demand.expected(now, life);
            let left = u128::from(expires_at.0 - now.0);
            let wanted = (u128::from(expected) * left).div_ceil(u128::from(life.0.max(1)));
            let keep = u64::try_from(wanted).unwrap_or(u64::MAX).saturating_sub(earlier);
            let Some(pool) = [&mut record.first, &mut record.second]
                .into_iter()
                .find(|p| p.expires_at == expires_at && p.live(now) > 0)
            else {
                return (false, 0);
            };
            let surplus = pool.tokens.saturating_sub(keep);
            // The test-only mutant (see Cargo.toml) returns the surplus and keeps it too.
            #[cfg(not(feature = "mutant-return-keeps-tokens"))]
            {
                pool.tokens -= surplus;
            }
            (surplus > 0, surplus)
        })?;
        Ok(Updated { result: Some(updated.result.unwrap_or(0)), forgiven: updated.forgiven })
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
            let owed = record.owe(cost, max_debt, (counter, tag), now);
            (owed > 0, (cost - owed, record.debt > 0))
        })?;
        Ok(Updated { result: Some(updated.result.unwrap_or((cost, false))), forgiven: updated.forgiven })
    }

    /// Settles a response's cost above its estimate (`excess` units, already served):
    /// what the lease's live tokens hold is taken from them; the rest is owed like a
    /// fallback's admissions, up to `max_debt`, on the global counter `whose` names, and
    /// charged to the service later (`None`: no counter can be named, the request's
    /// partition could not be read, so nothing is owed). Returns what was forgiven
    /// (beyond `max_debt`, or owed nowhere) and whether the record now owes something.
    pub(crate) fn overspend(
        &self,
        place: &Placement,
        excess: u64,
        max_debt: u64,
        whose: Option<(u128, Option<u128>)>,
        now: Nanos,
    ) -> Result<Updated<(u64, bool)>, UpdateError> {
        let updated = self.update(place, now, |record| {
            let taken = excess.min(record.live_tokens(now));
            let _ = record.take(taken, now);
            let owed = whose.map_or(0, |whose| record.owe(excess - taken, max_debt, whose, now));
            (taken > 0 || owed > 0, (excess - taken - owed, record.debt > 0))
        })?;
        Ok(Updated { result: Some(updated.result.unwrap_or((excess, false))), forgiven: updated.forgiven })
    }

    /// Gives back `units` of an estimate the response did not use, spent from a grant
    /// that expires at `until`: to the lease while that grant lives (as
    /// [`Leases::give_back`]), or else off the debt no charge carries yet. Returns what
    /// could not be given back: an expired grant keeps nothing, and those units stay
    /// spent.
    pub(crate) fn unspend(
        &self,
        place: &Placement,
        units: u64,
        until: Nanos,
        now: Nanos,
    ) -> Result<Updated<u64>, UpdateError> {
        let updated = self.update(place, now, |record| {
            if now < until {
                add_pool(record, Pool { tokens: units, expires_at: until }, now);
                return (true, 0);
            }
            lower_debt(record, units)
        })?;
        Ok(Updated { result: Some(updated.result.unwrap_or(units)), forgiven: updated.forgiven })
    }

    /// Gives back `units` of an estimate the failure rule admitted and the record owes
    /// (never more than it owes for it): off the debt no charge carries yet, never into a
    /// pool, whose tokens are the service's grants and none of these. Returns what
    /// could not be given back: debt a charge already carries, or a grant paid, stays
    /// spent.
    pub(crate) fn forgo(&self, place: &Placement, units: u64, now: Nanos) -> Result<Updated<u64>, UpdateError> {
        let updated = self.update(place, now, |record| lower_debt(record, units))?;
        Ok(Updated { result: Some(updated.result.unwrap_or(units)), forgiven: updated.forgiven })
    }

    /// Applies a grant answered to a refill sent at `sent_at`: the tokens live until
    /// `sent_at + expires_in` (never later than the service said). When the refill was
    /// elected by a waiting request (`for_waiter`) and the grant covers `min_tokens`,
    /// those are held for it. With nothing granted, the budget is empty for
    /// `retry_after`; when the grant left the budget short of what was asked,
    /// requests the tokens cannot cover are rejected for `empty_after` (the service's
    /// wait until it could grant again) rather than each asking in turn.
    ///
    /// Debt that no charge carries yet is paid from the grant first: the service counted
    /// those tokens when it granted them, so the units the proxy served beyond its
    /// earlier grants are accounted for without a charge, and the caller spends only
    /// what is left. (Otherwise a proxy that owes would go on spending fresh grants
    /// while its debt waits for a charge, and past `max_debt` its excess is forgiven.)
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn grant(
        &self,
        place: &Placement,
        granted: u64,
        for_waiter: Option<(u64, u64)>,
        sent_at: Nanos,
        expires_in: Nanos,
        (retry_after, empty_after): (Nanos, Nanos),
        under: Option<AppliedOverride>,
        now: Nanos,
    ) -> Result<Updated<Granted>, UpdateError> {
        self.update(place, now, |record| {
            let expired = record.drop_expired(now);
            record.set_under(under);
            record.refill_until = Nanos::ZERO;
            record.failed_at = Nanos::ZERO;
            let expires_at = sent_at.saturating_add(expires_in);
            if granted == 0 || expires_at <= now {
                record.empty_until = now.saturating_add(retry_after.max(Nanos(1)));
                let expired = expired.saturating_add(if granted > 0 { granted } else { 0 });
                let owes = Some(record.debt > record.charging);
                return (true, Granted { expired, repaid: 0, owes });
            }
            record.empty_until = if empty_after > Nanos::ZERO { now.saturating_add(empty_after) } else { Nanos::ZERO };
            record.granted_at = now;
            let repaid = granted.min(record.debt.saturating_sub(record.charging));
            record.debt -= repaid;
            let mut pool = Pool { tokens: granted - repaid, expires_at };
            if let Some((waiter, min_tokens)) = for_waiter
                && pool.tokens >= min_tokens
                && record.held.live(now) == 0
            {
                record.held = Pool { tokens: min_tokens, expires_at };
                record.held_for = waiter;
                pool.tokens -= min_tokens;
            }
            if pool.tokens > 0 {
                add_pool(record, pool, now);
            }
            let owes = Some(record.debt > record.charging);
            (true, Granted { expired, repaid, owes })
        })
        .map(|u| Updated { result: Some(u.result.unwrap_or_default()), forgiven: u.forgiven })
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
    /// same charge again (same units, same id: the service applies an id once) while it
    /// was first claimed less than [`DEBT_LIFE`] ago. `None` when nothing is owed or a
    /// charge is in flight. Debt older than [`DEBT_LIFE`], and a charge claimed that long
    /// ago, are forgiven instead (returned as the second value, to be counted).
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
            // A charge first claimed `DEBT_LIFE` ago is not sent again: the service may
            // have forgotten its id, and would apply it twice. Forgiven (it may have been
            // applied); the rest of the debt gets a charge of its own.
            let mut stale = 0;
            if record.charging > 0 && now >= record.charge_since.saturating_add(DEBT_LIFE) {
                stale = std::mem::take(&mut record.charging);
                record.debt = record.debt.saturating_sub(stale);
                if record.debt == 0 {
                    record.charge_until = Nanos::ZERO;
                    return (true, (None, stale));
                }
            }
            if record.charging == 0 {
                record.charging = record.debt;
                record.charge_id = id;
                record.charge_since = now;
            }
            record.charge_until = now.saturating_add(window);
            (true, (Some(Charge { units: record.charging, id: record.charge_id }), stale))
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

/// Lowers the debt no charge carries yet by up to `units`: whether the record changed,
/// and what was left over.
fn lower_debt(record: &mut Record, units: u64) -> (bool, u64) {
    let off = units.min(record.debt.saturating_sub(record.charging));
    record.debt -= off;
    (off > 0, units - off)
}

/// Adds a live pool: to a live pool that expires at the same moment, else as the second
/// pool; if both are live, the first two merge under the earlier expiry.
fn add_pool(record: &mut Record, pool: Pool, now: Nanos) {
    if let Some(same) = [&mut record.first, &mut record.second]
        .into_iter()
        .find(|p| p.expires_at == pool.expires_at && now < p.expires_at)
    {
        same.tokens = same.tokens.saturating_add(pool.tokens);
        return;
    }
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
