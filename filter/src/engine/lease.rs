//! Leases: a proxy's share of a global budget, kept in shared data and spent by every
//! worker with compare-and-swap, like a local bucket.
//!
//! One record per caller key and proxy (in a slot table, like local buckets):
//!
//! * `tokens`, spendable until `expires_at` (the filter's monotonic clock, anchored at the
//!   moment the refill was sent, so never later than the service said);
//! * `refill_until`: a refill is in flight, elected through this record; past this
//!   deadline the election is void, so a worker that died or whose callout never returns
//!   cannot block refills for longer than one callout's deadline;
//! * `empty_until`: the service granted nothing (the global budget is spent); until then
//!   requests are rejected with the time left, without asking again;
//! * `failed_at`: the last refill that failed: requests waiting for it apply the failure
//!   rule at once;
//! * `debt`: units admitted under the failure rule while the service was unreachable, to
//!   be charged to the global budget once it answers again (bounded by `max_debt`).
//!
//! Every change is one CAS write of the whole record, retried a bounded number of times.
//! A record another key holds (the slot is taken by an active lease) is not shared: the
//! request is then decided by a check instead, never on someone else's tokens.

use shared_store::{Cas, Nanos, Placement, Store, StoreError, Swap};

/// Attempts at one record update before giving up (the failure rule then decides).
const MAX_ATTEMPTS: u32 = 16;
/// The record's format version.
const VERSION: u8 = 1;
/// Encoded size: version, then eight u64.
const SIZE: usize = 1 + 8 * 8;

/// A lease record.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) owner: u64,
    pub(crate) tokens: u64,
    pub(crate) expires_at: Nanos,
    pub(crate) refill_until: Nanos,
    pub(crate) empty_until: Nanos,
    pub(crate) failed_at: Nanos,
    /// Why the last refill failed ([`super::wire::Reason::index`]).
    pub(crate) failed_reason: u64,
    pub(crate) debt: u64,
}

impl Record {
    fn encode(&self) -> [u8; SIZE] {
        let fields = [
            self.owner,
            self.tokens,
            self.expires_at.0,
            self.refill_until.0,
            self.empty_until.0,
            self.failed_at.0,
            self.failed_reason,
            self.debt,
        ];
        let mut out = [0u8; SIZE];
        let mut iter = out.iter_mut();
        if let Some(first) = iter.next() {
            *first = VERSION;
        }
        for (slot, byte) in iter.zip(fields.iter().flat_map(|f| f.to_le_bytes())) {
            *slot = byte;
        }
        out
    }

    /// `None` for bytes that are not a record of this version.
    fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != SIZE || bytes.first() != Some(&VERSION) {
            return None;
        }
        let field = |i: usize| -> Option<u64> {
            let start = 1 + i * 8;
            bytes.get(start..start + 8).and_then(|b| <[u8; 8]>::try_from(b).ok()).map(u64::from_le_bytes)
        };
        Some(Self {
            owner: field(0)?,
            tokens: field(1)?,
            expires_at: Nanos(field(2)?),
            refill_until: Nanos(field(3)?),
            empty_until: Nanos(field(4)?),
            failed_at: Nanos(field(5)?),
            failed_reason: field(6)?,
            debt: field(7)?,
        })
    }

    /// The tokens spendable at `now`.
    pub(crate) fn live_tokens(&self, now: Nanos) -> u64 {
        if now < self.expires_at { self.tokens } else { 0 }
    }

    /// Whether the record carries nothing (a slot another key may take).
    fn is_idle(&self, now: Nanos) -> bool {
        self.live_tokens(now) == 0 && now >= self.refill_until && self.debt == 0 && now >= self.empty_until
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
    /// Spent; `refill` when this request was elected to ask for more.
    Spent { refill: bool },
    /// Not enough tokens; a refill is in flight (`elected`: this request started it).
    Wait { elected: bool },
    /// The service granted nothing until then (the global budget is spent).
    Empty { until: Nanos },
    /// The last refill failed (for this reason index) after the request began waiting:
    /// apply the failure rule.
    Failed { reason: u64 },
    /// The slot is held by another key's active lease: decide this request by a check.
    Taken,
}

/// Reads and updates lease records over a [`Store`].
pub(crate) struct Leases<'a, S> {
    pub(crate) store: &'a S,
    pub(crate) anchor: &'a str,
}

impl<S: Store> Leases<'_, S> {
    fn read(&self, key: &str) -> Result<(Option<Record>, Option<Cas>), StoreError> {
        Ok(match self.store.get(key)? {
            Some(entry) => (Some(Record::decode(&entry.value).unwrap_or_default()), Some(entry.cas)),
            None => (None, None),
        })
    }

    fn write(&self, key: &str, record: &Record, cas: Option<Cas>) -> Result<Swap, StoreError> {
        let bytes = record.encode();
        match cas {
            Some(cas) => self.store.set(key, &bytes, Some(cas)),
            None => shared_store::create(self.store, self.anchor, key, &bytes),
        }
    }

    /// Runs `change` on the caller's record until its write lands. `change` answers the
    /// record to write (or `None` to write nothing) and a result.
    fn update<T>(
        &self,
        place: &Placement,
        now: Nanos,
        mut change: impl FnMut(&mut Record) -> (bool, T),
    ) -> Result<Option<T>, StoreError> {
        for _ in 0..MAX_ATTEMPTS {
            let (found, cas) = self.read(&place.key)?;
            let mut record = match found {
                Some(record) if record.owner == place.owner => record,
                Some(record) if !record.is_idle(now) => return Ok(None),
                _ => Record { owner: place.owner, ..Record::default() },
            };
            let (write, result) = change(&mut record);
            if !write {
                return Ok(Some(result));
            }
            match self.write(&place.key, &record, cas)? {
                Swap::Written => return Ok(Some(result)),
                Swap::Conflict => {}
            }
        }
        Err(StoreError { operation: "lease update", status: None })
    }

    /// Spends `cost` from the caller's lease, electing this request to refill when it
    /// runs low (or out).
    pub(crate) fn spend(&self, place: &Placement, cost: u64, now: Nanos, rules: Rules) -> Result<Spend, StoreError> {
        let outcome = self.update(place, now, |record| {
            let live = record.live_tokens(now);
            let refill_free = now >= record.refill_until;
            if live >= cost {
                record.tokens = live.saturating_sub(cost);
                let refill = refill_free && record.tokens < rules.low_water && now >= record.empty_until;
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
        Ok(outcome.unwrap_or(Spend::Taken))
    }

    /// Tries again for a waiting request: spends if the lease has the tokens now.
    /// `since` is when the request started waiting.
    pub(crate) fn retry(&self, place: &Placement, cost: u64, now: Nanos, since: Nanos) -> Result<Spend, StoreError> {
        let outcome = self.update(place, now, |record| {
            let live = record.live_tokens(now);
            if live >= cost {
                record.tokens = live.saturating_sub(cost);
                return (true, Spend::Spent { refill: false });
            }
            if now < record.empty_until {
                return (false, Spend::Empty { until: record.empty_until });
            }
            if record.failed_at >= since && record.failed_at > Nanos::ZERO {
                return (false, Spend::Failed { reason: record.failed_reason });
            }
            (false, Spend::Wait { elected: false })
        })?;
        Ok(outcome.unwrap_or(Spend::Taken))
    }

    /// Gives back what a spend took (another policy of the request rejected it). Tokens
    /// commute, so this is exact while the lease lives; an expired lease keeps nothing.
    pub(crate) fn give_back(&self, place: &Placement, cost: u64, now: Nanos) -> Result<(), StoreError> {
        let _ = self.update(place, now, |record| {
            if now >= record.expires_at {
                return (false, ());
            }
            record.tokens = record.tokens.saturating_add(cost);
            (true, ())
        })?;
        Ok(())
    }

    /// Records units admitted under the failure rule, up to `max_debt` owed; returns what
    /// did not fit (forgiven at once).
    pub(crate) fn owe(&self, place: &Placement, cost: u64, max_debt: u64, now: Nanos) -> Result<u64, StoreError> {
        Ok(self
            .update(place, now, |record| {
                let room = max_debt.saturating_sub(record.debt);
                let owed = cost.min(room);
                record.debt = record.debt.saturating_add(owed);
                (owed > 0, cost - owed)
            })?
            .unwrap_or(cost))
    }

    /// Applies a grant answered to a refill sent at `sent_at`: adds the tokens, which
    /// live until `sent_at + expires_in` (never later than the service said); returns the
    /// tokens that had expired unspent (forfeited).
    pub(crate) fn grant(
        &self,
        place: &Placement,
        granted: u64,
        sent_at: Nanos,
        expires_in: Nanos,
        retry_after: Nanos,
        now: Nanos,
    ) -> Result<u64, StoreError> {
        Ok(self
            .update(place, now, |record| {
                let expired = if now >= record.expires_at { record.tokens } else { 0 };
                let live = record.live_tokens(now);
                record.refill_until = Nanos::ZERO;
                record.failed_at = Nanos::ZERO;
                if granted == 0 {
                    record.tokens = live;
                    record.empty_until = now.saturating_add(retry_after);
                } else {
                    record.tokens = live.saturating_add(granted);
                    record.expires_at = sent_at.saturating_add(expires_in);
                    record.empty_until = Nanos::ZERO;
                }
                (true, expired)
            })?
            .unwrap_or(0))
    }

    /// Records that a refill failed: waiting requests apply the failure rule, and the
    /// election is free again.
    pub(crate) fn refill_failed(&self, place: &Placement, reason: u64, now: Nanos) -> Result<(), StoreError> {
        let _ = self.update(place, now, |record| {
            record.refill_until = Nanos::ZERO;
            record.failed_at = now.max(Nanos(1));
            record.failed_reason = reason;
            (true, ())
        })?;
        Ok(())
    }

    /// The debt to report, if any.
    pub(crate) fn debt(&self, place: &Placement, now: Nanos) -> Result<u64, StoreError> {
        Ok(self.update(place, now, |record| (false, record.debt))?.unwrap_or(0))
    }

    /// Takes `settled` off the debt once the service has charged (or forgiven) it.
    pub(crate) fn settle_debt(&self, place: &Placement, settled: u64, now: Nanos) -> Result<(), StoreError> {
        let _ = self.update(place, now, |record| {
            record.debt = record.debt.saturating_sub(settled);
            (true, ())
        })?;
        Ok(())
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

    #[test]
    fn the_first_request_elects_a_refill_and_waits_and_others_wait_without_electing() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };

        assert_eq!(leases.spend(&place(), 1, T, RULES).unwrap(), Spend::Wait { elected: true });
        assert_eq!(leases.spend(&place(), 1, T, RULES).unwrap(), Spend::Wait { elected: false });
        // The election expires with its window: a dead refiller blocks nobody for long.
        assert_eq!(
            leases.spend(&place(), 1, T.saturating_add(Nanos(100)), RULES).unwrap(),
            Spend::Wait { elected: true }
        );
    }

    #[test]
    fn a_grant_is_spent_until_it_runs_low_then_one_refill_is_elected() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        let _ = leases.spend(&place(), 1, T, RULES).unwrap();
        leases.grant(&place(), 4, T, Nanos(1000), Nanos::ZERO, T).unwrap();

        let spends: Vec<Spend> = (0..5).map(|_| leases.spend(&place(), 1, T, RULES).unwrap()).collect();

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
        leases.grant(&place(), 5, T, Nanos(1000), Nanos::ZERO, T).unwrap();

        let later = T.saturating_add(Nanos(1000));
        let retry = leases.retry(&place(), 1, later, later).unwrap();
        let forfeited = leases.grant(&place(), 3, later, Nanos(1000), Nanos::ZERO, later).unwrap();

        assert_eq!(retry, Spend::Wait { elected: false });
        assert_eq!(forfeited, 5);
        assert_eq!(leases.retry(&place(), 3, later, later).unwrap(), Spend::Spent { refill: false });
    }

    #[test]
    fn an_empty_global_budget_rejects_until_the_service_said_without_asking_again() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        let _ = leases.spend(&place(), 1, T, RULES).unwrap();
        leases.grant(&place(), 0, T, Nanos(1000), Nanos(500), T).unwrap();

        assert_eq!(leases.spend(&place(), 1, T, RULES).unwrap(), Spend::Empty { until: T.saturating_add(Nanos(500)) });
        assert_eq!(
            leases.spend(&place(), 1, T.saturating_add(Nanos(500)), RULES).unwrap(),
            Spend::Wait { elected: true }
        );
    }

    #[test]
    fn a_failed_refill_sends_its_waiters_to_the_failure_rule() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        let _ = leases.spend(&place(), 1, T, RULES).unwrap();

        leases.refill_failed(&place(), 1, T.saturating_add(Nanos(10))).unwrap();

        assert_eq!(leases.retry(&place(), 1, T.saturating_add(Nanos(20)), T).unwrap(), Spend::Failed { reason: 1 });
        assert_eq!(
            leases.spend(&place(), 1, T.saturating_add(Nanos(20)), RULES).unwrap(),
            Spend::Wait { elected: true }
        );
    }

    #[test]
    fn debt_is_bounded_and_settled() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };

        let forgiven: Vec<u64> = (0..4).map(|_| leases.owe(&place(), 2, 5, T).unwrap()).collect();
        leases.settle_debt(&place(), 3, T).unwrap();

        assert_eq!(forgiven, [0, 0, 1, 2]);
        assert_eq!(leases.debt(&place(), T).unwrap(), 2);
    }

    #[test]
    fn a_slot_held_by_another_keys_active_lease_is_never_shared() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        leases.grant(&place(), 5, T, Nanos(1000), Nanos::ZERO, T).unwrap();
        let other = Placement { key: "l/0".into(), owner: 9, overflow: None };

        assert_eq!(leases.spend(&other, 1, T, RULES).unwrap(), Spend::Taken);
        // Once the lease is idle (expired, nothing owed), the slot changes hands.
        let later = T.saturating_add(Nanos(1000));
        assert_eq!(leases.spend(&other, 1, later, RULES).unwrap(), Spend::Wait { elected: true });
    }

    #[test]
    fn a_given_back_spend_is_exact_while_the_lease_lives() {
        let store = MemoryStore::new();
        let leases = Leases { store: &store, anchor: "a" };
        leases.grant(&place(), 2, T, Nanos(1000), Nanos::ZERO, T).unwrap();
        let _ = leases.spend(&place(), 2, T, RULES).unwrap();

        leases.give_back(&place(), 2, T).unwrap();

        // Spendable again; the refill the first spend elected is still in flight.
        assert_eq!(leases.spend(&place(), 2, T, RULES).unwrap(), Spend::Spent { refill: false });
    }
}
