//! How the memory store decides: `shared-store`'s algorithms behind a sharded map.
//!
//! * **Atomic across entries.** A check locks the shards its keys live in, always in
//!   ascending shard order (so two checks never wait on each other in a cycle), decides
//!   every entry on the current states, and writes only if all admit.
//! * **Numbers that change.** A key remembers the limit it was decided under; a
//!   decision under other numbers (a policy changed without a version bump) first
//!   carries its state over ([`Limit::adopt`]) and keeps it, even when it then rejects.
//! * **Time never runs backwards for a key.** Each key remembers the latest time it was
//!   decided at, and a decision uses the later of that and the clock. The Redis script
//!   does the same, so the two stores agree even on a clock step.
//! * **Idle keys expire.** A key whose state [`is_idle`](shared_store::Limit::is_idle)
//!   carries no information (a full bucket, an empty window): dropping it and later
//!   starting fresh gives exactly the same answers. [`MemoryCounters::sweep`] drops them; the
//!   server runs it periodically, and a full shard runs it before refusing a key.
//! * **Bounded.** At most `max_keys` keys (split evenly over the shards). When a shard
//!   is full of active keys, a check that needs a *new* key there is refused with
//!   [`CounterStoreError::Full`] (HTTP 503 `store_full`); existing keys keep working, and no
//!   active key is ever evicted, since evicting one would silently reset a client.
//! * **Charge and credit ids.** A charge or a credit with an id is remembered with its
//!   answer for the plan's `id_ttl_ms` (at most [`sluice_protocol::CHARGE_ID_TTL_MS`]),
//!   so that the same charge or credit sent again is answered again instead of applied
//!   again (a credit id under its [`crate::api::credit_key`], so it never meets a charge
//!   id). Ids live in a table of their own, apart from the counters: as many id shards
//!   as counter shards, an id's shard chosen by a hash of its id key, so the ids of one
//!   counter (one hot caller settling every request) spread over all of them instead of
//!   crowding its counter's shard. At most `max_charge_ids` ids of both kinds together
//!   are remembered, split evenly over the id shards (ids spread uniformly, so the first
//!   id shard fills up when the table as a whole is nearly full); expired ones are
//!   dropped by the sweep and by a full id shard before it refuses, and when an id shard
//!   still holds only live ones, charges and credits with a new id there are refused
//!   ([`CounterStoreError::ChargeIdsFull`], 503 `store_full`) rather than forget an id.
//! * **Ids are remembered by a 128-bit hash.** The table holds no id key, only two
//!   64-bit hashes of it under the store's `RandomState` (std's SipHash, keyed with 128
//!   random bits drawn at start; each hash behind its own prefix), with the answer and the
//!   expiry. A new id is taken for a live one only if both hashes match: with n live ids
//!   a chance of n / 2^128 per new id, so a year of 11 000 new ids a second against a
//!   full table of a million makes one mix-up (a charge answered as the duplicate of
//!   another) less likely than 1 in 10^20. The key never leaves the process, so a caller
//!   cannot choose ids that collide, nor ones that crowd one id shard: it can only guess,
//!   at those odds.
//! * **Memory per id.** An entry is 40 bytes (the two hashes; the answer's two amounts
//!   and the expiry) and the hash map adds a control byte a slot, its slots a power of
//!   two at most 7/8 full: 47 to 94 bytes a remembered id, depending on where the id
//!   shards stand between two powers of two (a map keeps the slots of its fullest
//!   moment). At the default bound ([`DEFAULT_MAX_CHARGE_IDS`]: 1 000 000 ids over 64
//!   shards, 15 625 a shard in 32 768 slots) a full table takes 86 MB, 86 bytes an id
//!   (measured with a counting allocator: 85 986 304 bytes). Ids kept for 90 s (the
//!   filter's settlements) fill it at about 11 000 new ids a second; ids kept the
//!   default 10 minutes, at about 1 600.
//! * **Lock order.** Counter shards first (a check's in ascending order), then at most
//!   one id shard (a charge's or a credit's with an id). An id shard is never held while
//!   a counter shard is taken, so the two kinds cannot wait on each other in a cycle. A
//!   charge or a credit holds its id shard from looking the id up to remembering it, so
//!   the bound is never exceeded; two sends of one id are applied once because both hold
//!   their counter's shard (an id key names its counter).

use std::borrow::Cow;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hash, Hasher};
use std::sync::{Mutex, MutexGuard, PoisonError};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use shared_store::{Clock, Decision, Limit, Nanos, State};

use super::{ChargeOutcome, CheckOutcome, CounterStoreError, CreditOutcome, LeaseOutcome, decide_lease, lease_life_of};
use crate::api::{ChargePlan, CheckPlan, CreditPlan, LeasePlan, PlannedEntry};

/// How long a shard that was found full of active keys is not swept again.
const FULL_RECHECK: Nanos = Nanos::from_millis(100);

/// Memory store settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryConfig {
    /// Number of independently locked shards (at least 1).
    pub shards: usize,
    /// Most keys held at once.
    pub max_keys: usize,
    /// Most charge and credit ids remembered at once, together (each for its
    /// `id_ttl_ms`, at most [`sluice_protocol::CHARGE_ID_TTL_MS`]).
    pub max_charge_ids: usize,
}

/// The default bound on remembered charge and credit ids: 86 MB when full (see the
/// module docs).
pub const DEFAULT_MAX_CHARGE_IDS: usize = 1_000_000;

impl Default for MemoryConfig {
    fn default() -> Self {
        Self { shards: 64, max_keys: 1_000_000, max_charge_ids: DEFAULT_MAX_CHARGE_IDS }
    }
}

/// Unix time that never steps: the wall clock read once at start, then a monotonic
/// clock. Fixed windows align to Unix time, as they do on Redis.
#[derive(Clone, Copy, Debug)]
struct UnixClock {
    base: Nanos,
    start: Instant,
}

impl UnixClock {
    fn new() -> Self {
        let base = SystemTime::now().duration_since(UNIX_EPOCH).map(Nanos::from).unwrap_or(Nanos::ZERO);
        Self { base, start: Instant::now() }
    }

    fn now(&self) -> Nanos {
        self.base.saturating_add(Nanos::from(self.start.elapsed()))
    }
}

/// The store's time: Unix time, or a clock the embedder gives (tests).
enum StoreClock {
    Unix(UnixClock),
    Given(std::sync::Arc<dyn Clock + Send + Sync>),
}

impl std::fmt::Debug for StoreClock {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unix(clock) => clock.fmt(f),
            Self::Given(clock) => write!(f, "Given(at {})", clock.now()),
        }
    }
}

impl StoreClock {
    fn now(&self) -> Nanos {
        match self {
            Self::Unix(clock) => clock.now(),
            Self::Given(clock) => clock.now(),
        }
    }
}

#[derive(Debug)]
struct Slot {
    limit: Limit,
    state: State,
    /// The latest time this key was decided at.
    last: Nanos,
    /// When it may be dropped whatever it holds (a clamp's counter: its override's end).
    expires: Option<Nanos>,
}

impl Slot {
    /// Whether dropping it changes no answer: its state carries no information under the
    /// numbers it was written under, or nothing will read it again (its override ended).
    fn is_idle(&self, now: Nanos) -> bool {
        self.expires.is_some_and(|end| end <= now) || self.limit.is_idle(&self.state, now.max(self.last))
    }

    /// The state under `limit` at `at`: as stored, or carried over from the limit it
    /// was decided under ([`Limit::adopt`]) when the policy's numbers changed.
    fn state_under(&self, limit: &Limit, at: Nanos) -> Cow<'_, State> {
        if self.limit == *limit {
            Cow::Borrowed(&self.state)
        } else {
            Cow::Owned(limit.adopt(&self.limit, self.state.clone(), at))
        }
    }
}

/// What a charge or a credit with an id answered, remembered until `until`.
#[derive(Clone, Copy, Debug)]
struct Remembered {
    /// Units charged, or credited.
    applied: u64,
    forgiven: u64,
    until: Nanos,
}

#[derive(Debug, Default)]
struct Shard {
    map: HashMap<String, Slot>,
    /// Until then, the shard is known to be full of active keys.
    full_until: Nanos,
}

impl Shard {
    /// Drops idle keys; returns how many were dropped.
    fn sweep(&mut self, now: Nanos) -> usize {
        let before = self.map.len();
        self.map.retain(|_, slot| !slot.is_idle(now));
        before - self.map.len()
    }

    /// The time a decision on `entry` is made at, `now` or the key's latest time if later,
    /// and the key's state under the entry's limit then (`None` for a key not held).
    fn state_at(&self, entry: &PlannedEntry, now: Nanos) -> (Nanos, Option<Cow<'_, State>>) {
        let slot = self.map.get(&entry.storage_key);
        let at = slot.map_or(now, |s| s.last.max(now));
        (at, slot.map(|s| s.state_under(&entry.limit.limit, at)))
    }
}

/// An id key ([`crate::api::charge_key`], [`crate::api::credit_key`]) as the id table
/// holds it: two 64-bit keyed hashes of it (see the module docs). `shard` picks the id
/// shard; `bucket` alone is what the shard's map hashes, so that the bits which chose the
/// shard (the same in all of its ids) do not choose the map's buckets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct IdHash {
    shard: u64,
    bucket: u64,
}

impl Hash for IdHash {
    fn hash<H: Hasher>(&self, state: &mut H) {
        state.write_u64(self.bucket);
    }
}

/// The hasher of an id shard's map: [`IdHash::bucket`] is already a keyed hash, so it is
/// used as it is.
#[derive(Clone, Copy, Debug, Default)]
struct Given(u64);

impl Hasher for Given {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        // Only `write_u64` is ever called (`IdHash::hash`); fold anything else anyway.
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// One shard of the id table.
#[derive(Debug, Default)]
struct IdShard {
    ids: HashMap<IdHash, Remembered, std::hash::BuildHasherDefault<Given>>,
    /// No id here expires before this time (it is at most the earliest expiry): until
    /// then a sweep would drop nothing, so a full shard refuses without scanning.
    no_expiry_before: Nanos,
}

impl IdShard {
    /// Drops the ids expired at `now`, unless none can be.
    fn forget_expired(&mut self, now: Nanos) {
        if now < self.no_expiry_before {
            return;
        }
        let mut earliest = Nanos::MAX;
        self.ids.retain(|_, remembered| {
            let live = remembered.until > now;
            if live {
                earliest = earliest.min(remembered.until);
            }
            live
        });
        self.no_expiry_before = earliest;
    }

    /// The first answer of `id` if it is still remembered at `now`.
    fn remembered(&self, id: IdHash, now: Nanos) -> Option<Remembered> {
        self.ids.get(&id).copied().filter(|r| r.until > now)
    }

    /// Whether `id` can be remembered at `now` by a shard that holds at most `max` ids:
    /// it is there already (expired), or there is room (once expired ids are dropped,
    /// when the shard holds `max`).
    fn has_room(&mut self, id: IdHash, now: Nanos, max: usize) -> bool {
        if self.ids.len() < max || self.ids.contains_key(&id) {
            return true;
        }
        self.forget_expired(now);
        self.ids.len() < max
    }

    /// Remembers the answer (`applied`, `forgiven`) of `id` from `now` for `ttl_ms`.
    fn remember(&mut self, id: IdHash, (applied, forgiven): (u64, u64), now: Nanos, ttl_ms: u64) {
        let until = now.saturating_add(Nanos::from_millis(ttl_ms));
        self.no_expiry_before = self.no_expiry_before.min(until);
        self.ids.insert(id, Remembered { applied, forgiven, until });
    }
}

/// A charge's or a credit's id, looked up in its locked id shard.
struct IdGuard<'a> {
    id: IdHash,
    shard: MutexGuard<'a, IdShard>,
}

/// `shared-store`'s algorithms behind a sharded, bounded map.
#[derive(Debug)]
pub struct MemoryCounters {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    max_keys: usize,
    /// The id table, apart from the counters (see the module docs).
    id_shards: Box<[Mutex<IdShard>]>,
    ids_per_shard: usize,
    max_charge_ids: usize,
    hasher: std::hash::RandomState,
    clock: StoreClock,
    overrides: super::MemoryOverrides,
}

/// What the decide phase found for one entry.
struct Pending {
    shard: usize,
    decision: Decision,
    next: Option<State>,
    at: Nanos,
}

fn lock<T>(shard: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding a shard cannot leave a half-written slot or id (every write
    // is one insert), so a poisoned lock is safe to use.
    shard.lock().unwrap_or_else(PoisonError::into_inner)
}

impl MemoryCounters {
    /// An empty store on Unix time.
    pub fn new(config: MemoryConfig) -> Self {
        Self::build(config, StoreClock::Unix(UnixClock::new()))
    }

    /// An empty store whose time is `clock` (Unix nanoseconds). For tests that drive
    /// the service over HTTP and need its answers to be exact: a
    /// [`shared_store::ManualClock`] makes every `reset_after_ns` and `retry_after_ns`
    /// predictable.
    pub fn with_clock(config: MemoryConfig, clock: std::sync::Arc<dyn Clock + Send + Sync>) -> Self {
        Self::build(config, StoreClock::Given(clock))
    }

    fn build(config: MemoryConfig, clock: StoreClock) -> Self {
        let shards = config.shards.max(1);
        let max_keys = config.max_keys.max(1);
        let max_charge_ids = config.max_charge_ids.max(1);
        Self {
            shards: (0..shards).map(|_| Mutex::new(Shard::default())).collect(),
            per_shard: max_keys.div_ceil(shards),
            max_keys,
            id_shards: (0..shards).map(|_| Mutex::new(IdShard::default())).collect(),
            ids_per_shard: max_charge_ids.div_ceil(shards),
            max_charge_ids,
            hasher: std::hash::RandomState::new(),
            clock,
            overrides: super::MemoryOverrides::default(),
        }
    }

    /// The operators' overrides (kept in this process only: gone on a restart).
    pub fn overrides(&self) -> &super::MemoryOverrides {
        &self.overrides
    }

    /// The store's current time (Unix ns).
    pub fn now(&self) -> Nanos {
        self.clock.now()
    }

    fn shard_of(&self, key: &str) -> usize {
        // The modulo keeps the index in range; `as usize` of a u64 remainder below
        // `shards.len()` cannot truncate.
        (self.hasher.hash_one(key) % self.shards.len() as u64) as usize
    }

    /// The id key `id_key` as the id table holds it: two hashes under the store's secret
    /// key, each behind its own prefix (so they are two independent 64-bit hashes).
    fn id_hash(&self, id_key: &str) -> IdHash {
        IdHash { shard: self.hasher.hash_one(("id shard", id_key)), bucket: self.hasher.hash_one(("id", id_key)) }
    }

    /// Locks the id shard of `id_key`, when there is one. The caller holds its counter's
    /// shard already (the lock order: counter shards, then one id shard).
    fn lock_id(&self, id_key: Option<&str>) -> Option<IdGuard<'_>> {
        let id = self.id_hash(id_key?);
        // As in `shard_of`: the remainder is below the number of id shards.
        let shard = self.id_shards.get((id.shard % self.id_shards.len() as u64) as usize)?;
        Some(IdGuard { id, shard: lock(shard) })
    }

    /// Number of keys held.
    pub fn len(&self) -> usize {
        self.shards.iter().map(|s| lock(s).map.len()).sum()
    }

    /// Number of charge and credit ids remembered (expired ones included until the next
    /// sweep).
    pub fn charge_ids(&self) -> usize {
        self.id_shards.iter().map(|s| lock(s).ids.len()).sum()
    }

    /// Whether no key is held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Drops every idle key and every expired charge or credit id; returns how many keys
    /// were dropped.
    pub fn sweep(&self, at: Option<Nanos>) -> usize {
        let now = at.unwrap_or_else(|| self.now());
        let dropped = self.shards.iter().map(|s| lock(s).sweep(now)).sum();
        for shard in &self.id_shards {
            lock(shard).forget_expired(now);
        }
        dropped
    }

    /// Locks the shards of `shard_ids` in ascending order.
    fn lock_all(&self, shard_ids: &[usize]) -> Vec<(usize, MutexGuard<'_, Shard>)> {
        let mut order = shard_ids.to_vec();
        order.sort_unstable();
        order.dedup();
        order.into_iter().filter_map(|i| self.shards.get(i).map(|s| (i, lock(s)))).collect()
    }

    fn decide(guards: &[(usize, MutexGuard<'_, Shard>)], shard: usize, entry: &PlannedEntry, now: Nanos) -> Pending {
        let (at, state) = Self::state_in(guards, shard, entry, now);
        let (decision, next) = entry.limit.limit.decide(state.as_deref(), at, entry.cost);
        Pending { shard, decision, next, at }
    }

    /// [`Shard::state_at`] of `entry` in its locked shard `shard`.
    fn state_in<'a>(
        guards: &'a [(usize, MutexGuard<'_, Shard>)],
        shard: usize,
        entry: &PlannedEntry,
        now: Nanos,
    ) -> (Nanos, Option<Cow<'a, State>>) {
        guards.iter().find(|(i, _)| *i == shard).map_or((now, None), |(_, guard)| guard.state_at(entry, now))
    }

    /// Makes room for the new keys `pending` would create, or refuses.
    fn reserve(
        &self,
        guards: &mut [(usize, MutexGuard<'_, Shard>)],
        entries: &[&PlannedEntry],
        pending: &[Pending],
        now: Nanos,
    ) -> Result<(), CounterStoreError> {
        for (i, guard) in guards.iter_mut() {
            let new_keys = entries
                .iter()
                .zip(pending)
                .filter(|(e, p)| p.shard == *i && p.next.is_some() && !guard.map.contains_key(&e.storage_key))
                .count();
            if new_keys == 0 || guard.map.len() + new_keys <= self.per_shard {
                continue;
            }
            if guard.full_until <= now {
                guard.sweep(now);
            }
            if guard.map.len() + new_keys > self.per_shard {
                guard.full_until = now.saturating_add(FULL_RECHECK);
                return Err(CounterStoreError::Full { max_keys: self.max_keys });
            }
        }
        Ok(())
    }

    /// Carries every key of `entries` decided under other numbers over to its entry's
    /// ([`Limit::carry`]) at `now`, and keeps that, whatever the decision that follows:
    /// a key rejected under new numbers (a policy raised or lowered) then refills at the
    /// new rate from now, rather than being carried over again later from its old state,
    /// at the old rate. Returns the units of debt the new numbers could not keep.
    fn carry_over(
        guards: &mut [(usize, MutexGuard<'_, Shard>)],
        entries: &[&PlannedEntry],
        shards: &[usize],
        now: Nanos,
    ) -> u64 {
        let mut forgiven = 0u64;
        for (entry, shard) in entries.iter().zip(shards) {
            let Some((_, guard)) = guards.iter_mut().find(|(i, _)| i == shard) else { continue };
            let Some(slot) = guard.map.get_mut(&entry.storage_key) else { continue };
            let limit = entry.limit.limit;
            if slot.limit != limit {
                let at = slot.last.max(now);
                let carried = limit.carry(&slot.limit, slot.state.clone(), at);
                forgiven = forgiven.saturating_add(carried.forgiven);
                slot.state = carried.state;
                slot.limit = limit;
                slot.last = at;
            }
        }
        forgiven
    }

    fn apply(guards: &mut [(usize, MutexGuard<'_, Shard>)], entries: &[&PlannedEntry], pending: Vec<Pending>) {
        for (entry, p) in entries.iter().zip(pending) {
            let Some(state) = p.next else { continue };
            if let Some((_, guard)) = guards.iter_mut().find(|(i, _)| *i == p.shard) {
                // Update in place when the key exists: no key allocation on the hot path.
                match guard.map.get_mut(&entry.storage_key) {
                    Some(slot) => {
                        slot.limit = entry.limit.limit;
                        slot.state = state;
                        slot.last = p.at;
                        slot.expires = entry.expires;
                    }
                    None => {
                        let slot = Slot { limit: entry.limit.limit, state, last: p.at, expires: entry.expires };
                        guard.map.insert(entry.storage_key.clone(), slot);
                    }
                }
            }
        }
    }

    /// Decides `plan` atomically at `at` (default: the store's clock).
    ///
    /// # Errors
    /// [`CounterStoreError::Full`] when a new key does not fit.
    pub fn check(&self, plan: &CheckPlan, at: Option<Nanos>) -> Result<CheckOutcome, CounterStoreError> {
        let entries: Vec<&PlannedEntry> = plan.entries.iter().collect();
        let shard_ids: Vec<usize> = entries.iter().map(|e| self.shard_of(&e.storage_key)).collect();
        let mut guards = self.lock_all(&shard_ids);
        // Read the clock under the locks, so that decisions on a key are timed in the
        // order they are made (the time in the answer is the time decided at).
        let now = at.unwrap_or_else(|| self.now());
        let carry_forgiven = Self::carry_over(&mut guards, &entries, &shard_ids, now);
        let pending: Vec<Pending> =
            entries.iter().zip(&shard_ids).map(|(e, &s)| Self::decide(&guards, s, e, now)).collect();
        let admitted = pending.iter().all(|p| p.decision.is_admitted());
        let decisions = pending.iter().map(|p| p.decision).collect();
        if admitted {
            self.reserve(&mut guards, &entries, &pending, now)?;
            Self::apply(&mut guards, &entries, pending);
        }
        Ok(CheckOutcome { admitted, at: now, decisions, carry_forgiven })
    }

    /// Grants up to `plan.tokens` at `at` (default: the store's clock), from the entry's
    /// counter and its clamp's together ([`decide_lease`]).
    ///
    /// # Errors
    /// [`CounterStoreError::Full`] when a key is new and does not fit.
    pub fn lease(&self, plan: &LeasePlan, at: Option<Nanos>) -> Result<LeaseOutcome, CounterStoreError> {
        let entries: Vec<&PlannedEntry> = plan.counters().collect();
        let shards: Vec<usize> = entries.iter().map(|e| self.shard_of(&e.storage_key)).collect();
        let mut guards = self.lock_all(&shards);
        let now = at.unwrap_or_else(|| self.now());
        let carry_forgiven = Self::carry_over(&mut guards, &entries, &shards, now);
        let closing = lease_life_of(entries.iter().map(|e| &e.limit.limit), now, plan.ttl_ms).err();
        let states: Vec<(Nanos, Option<Cow<'_, State>>)> =
            entries.iter().zip(&shards).map(|(e, &s)| Self::state_in(&guards, s, e, now)).collect();
        let counters: Vec<(&Limit, Option<&State>, Nanos)> =
            entries.iter().zip(&states).map(|(e, (at, state))| (&e.limit.limit, state.as_deref(), *at)).collect();
        let leased = decide_lease(&counters, (plan.tokens, plan.min_tokens), closing);
        let pending: Vec<Pending> = shards
            .iter()
            .zip(&states)
            .zip(leased.next)
            .map(|((&shard, (at, _)), next)| Pending { shard, decision: leased.decision, next, at: *at })
            .collect();
        drop(states);
        self.reserve(&mut guards, &entries, &pending, now)?;
        Self::apply(&mut guards, &entries, pending);
        Ok(LeaseOutcome::new(plan, (leased.granted, leased.refill_after, carry_forgiven), now, leased.decision))
    }

    /// Charges up to `plan.entry.cost` at `at` (default: the store's clock), leaving the
    /// key at most `plan.max_debt` below empty ([`shared_store::Limit::charge`]); under a
    /// clamp, its counter too, within its own bound, and the answer's `charged` is the
    /// least any counter took (what it says is forgiven, no counter forgave more). A
    /// charge whose id is remembered is not applied again: its first answer is repeated,
    /// with the limit's status now. A new id is remembered for `plan.id_ttl_ms`.
    ///
    /// # Errors
    /// [`CounterStoreError::Full`] when a key is new and does not fit;
    /// [`CounterStoreError::ChargeIdsFull`] when the id is new and its id shard remembers
    /// as many live ids as it may.
    pub fn charge(&self, plan: &ChargePlan, at: Option<Nanos>) -> Result<ChargeOutcome, CounterStoreError> {
        let entries: Vec<&PlannedEntry> = plan.counters().collect();
        let shards: Vec<usize> = entries.iter().map(|e| self.shard_of(&e.storage_key)).collect();
        let mut guards = self.lock_all(&shards);
        let now = at.unwrap_or_else(|| self.now());
        let carry_forgiven = Self::carry_over(&mut guards, &entries, &shards, now);
        let mut id = self.lock_id(plan.charge_key.as_deref());
        if let Some(first) = self.recall(id.as_mut(), now)? {
            let decision = Self::status_of(&guards, &entries, &shards, now);
            let (charged, forgiven) = (first.applied, first.forgiven);
            return Ok(ChargeOutcome { charged, forgiven, duplicate: true, at: now, decision, carry_forgiven });
        }
        let states: Vec<(Nanos, Option<Cow<'_, State>>)> =
            entries.iter().zip(&shards).map(|(e, &s)| Self::state_in(&guards, s, e, now)).collect();
        // Each counter takes what fits its own debt bound (a clamp's is at most its
        // capacity); the answer is what every one of them took.
        let max_debt = |e: &PlannedEntry| plan.max_debt.min(e.limit.capacity());
        let mut charged = u64::MAX;
        let pending: Vec<Pending> = entries
            .iter()
            .zip(&shards)
            .zip(&states)
            .map(|((e, &shard), (at, state))| {
                let (next, took) = e.limit.limit.charge(state.as_deref(), *at, plan.entry.cost, max_debt(e));
                charged = charged.min(took);
                let decision = e.limit.limit.status(Some(&next), *at);
                Pending { shard, decision, next: (took > 0).then_some(next), at: *at }
            })
            .collect();
        drop(states);
        let charged = charged.min(plan.entry.cost);
        let decision = together(&pending);
        self.reserve(&mut guards, &entries, &pending, now)?;
        Self::apply(&mut guards, &entries, pending);
        let forgiven = plan.entry.cost.saturating_sub(charged);
        Self::remember(id, (charged, forgiven), now, plan.id_ttl_ms);
        Ok(ChargeOutcome { charged, forgiven, duplicate: false, at: now, decision, carry_forgiven })
    }

    /// Gives back `plan.entry.cost` units spent at `plan.spent_at`, at `at` (default: the
    /// store's clock), on the key's state as it stands ([`shared_store::Limit::credit`],
    /// after carrying the state over to the plan's numbers if it was decided under others),
    /// and on its clamp's counter when the plan has one: each counter takes back what it
    /// can (nothing when there is nothing to give back to: a full bucket, a window the
    /// spend no longer counts in, a count at zero, a key not held), and the answer's
    /// `credited` is the least any counter took. A credit whose id is remembered is not
    /// applied again: its first
    /// answer is repeated, with the limit's status now. A new id is remembered for
    /// `plan.id_ttl_ms`.
    ///
    /// # Errors
    /// [`CounterStoreError::ChargeIdsFull`] when the id is new and its id shard remembers
    /// as many live ids as it may.
    pub fn credit(&self, plan: &CreditPlan, at: Option<Nanos>) -> Result<CreditOutcome, CounterStoreError> {
        let entries: Vec<&PlannedEntry> = plan.counters().collect();
        let shards: Vec<usize> = entries.iter().map(|e| self.shard_of(&e.storage_key)).collect();
        let mut guards = self.lock_all(&shards);
        let now = at.unwrap_or_else(|| self.now());
        let carry_forgiven = Self::carry_over(&mut guards, &entries, &shards, now);
        let mut id = self.lock_id(plan.credit_key.as_deref());
        if let Some(first) = self.recall(id.as_mut(), now)? {
            let decision = Self::status_of(&guards, &entries, &shards, now);
            let (credited, forgiven) = (first.applied, first.forgiven);
            return Ok(CreditOutcome { credited, forgiven, duplicate: true, at: now, decision, carry_forgiven });
        }
        let states: Vec<(Nanos, Option<Cow<'_, State>>)> =
            entries.iter().zip(&shards).map(|(e, &s)| Self::state_in(&guards, s, e, now)).collect();
        // Each counter takes back what it can; the answer is what every one of them took.
        let mut credited = u64::MAX;
        let pending: Vec<Pending> = entries
            .iter()
            .zip(&shards)
            .zip(&states)
            .map(|((e, &shard), (at, current))| {
                let limit = &e.limit.limit;
                let back = current.as_deref().and_then(|s| limit.credit(s, plan.spent_at, *at, plan.entry.cost));
                let (next, took) = match back {
                    Some((next, took)) if took > 0 => (Some(next), took),
                    _ => (None, 0),
                };
                credited = credited.min(took);
                let decision = limit.status(next.as_ref().or(current.as_deref()), *at);
                Pending { shard, decision, next, at: *at }
            })
            .collect();
        drop(states);
        let credited = credited.min(plan.entry.cost);
        let decision = together(&pending);
        Self::apply(&mut guards, &entries, pending);
        let forgiven = plan.entry.cost - credited;
        Self::remember(id, (credited, forgiven), now, plan.id_ttl_ms);
        Ok(CreditOutcome { credited, forgiven, duplicate: false, at: now, decision, carry_forgiven })
    }

    /// The first answer of the id in `id` (charge or credit), when its locked id shard
    /// remembers it; `None` when there is no id or it is new (and there is room to
    /// remember it).
    fn recall(&self, id: Option<&mut IdGuard<'_>>, now: Nanos) -> Result<Option<Remembered>, CounterStoreError> {
        let Some(IdGuard { id, shard }) = id else { return Ok(None) };
        if let Some(first) = shard.remembered(*id, now) {
            return Ok(Some(first));
        }
        if !shard.has_room(*id, now, self.ids_per_shard) {
            return Err(CounterStoreError::ChargeIdsFull { max_ids: self.max_charge_ids });
        }
        Ok(None)
    }

    /// Remembers the answer of the id in `id`, if there is one, for `ttl_ms` from `now`,
    /// and lets its id shard go.
    fn remember(id: Option<IdGuard<'_>>, answer: (u64, u64), now: Nanos, ttl_ms: u64) {
        if let Some(IdGuard { id, mut shard }) = id {
            shard.remember(id, answer, now, ttl_ms);
        }
    }

    /// Every counter's status now ([`Limit::status`]) together, as a duplicate answers it.
    fn status_of(
        guards: &[(usize, MutexGuard<'_, Shard>)],
        entries: &[&PlannedEntry],
        shards: &[usize],
        now: Nanos,
    ) -> Decision {
        let statuses = entries.iter().zip(shards).map(|(e, &shard)| {
            let (at, state) = Self::state_in(guards, shard, e, now);
            e.limit.limit.status(state.as_deref(), at)
        });
        statuses.reduce(Decision::and).unwrap_or(Decision {
            verdict: shared_store::Verdict::Exceeds,
            limit: 0,
            remaining: 0,
            reset_after: Nanos::ZERO,
        })
    }
}

/// The decisions of `pending` together ([`Decision::and`]): an entry's and its clamp's.
fn together(pending: &[Pending]) -> Decision {
    pending.iter().map(|p| p.decision).reduce(Decision::and).unwrap_or(Decision {
        verdict: shared_store::Verdict::Exceeds,
        limit: 0,
        remaining: 0,
        reset_after: Nanos::ZERO,
    })
}
