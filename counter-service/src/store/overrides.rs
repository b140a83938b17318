//! Where operator overrides are kept: beside the counters, in the same store.
//!
//! * **Memory**: a map in this process. Overrides do not survive a restart.
//! * **Redis**: one key per override, `sluice:{overrides}:<id>`, holding its JSON with
//!   the override's expiry as TTL, and one sorted set, `sluice:{overrides}:index`, of the
//!   same JSON scored by expiry (Unix ms), which lists them in one call. Both share the
//!   hash tag `{overrides}`: on Redis Cluster they live in one slot, so each change is one
//!   script on one node. The index's own TTL outlasts its latest override by
//!   [`INDEX_GRACE_MS`], so that every key the service writes has a TTL and an expired
//!   override stays in the index until a sweep claims it (and audits it).
//!
//! On Redis a third key, `sluice:{overrides}:version`, changes with every set and removal
//! (the later of its value plus one and the time in ms, so a version lost with its key
//! never comes back lower): an instance reads it every sweep and lists the overrides only
//! when it changed.
//!
//! Each override is claimed once when it ends: removed by the operator, or found expired
//! by one sweep ([`CounterStore::expire_overrides`]); with several service instances on
//! one Redis, the script that removes it from the index decides which one audits it.

use std::collections::BTreeMap;
use std::sync::{Mutex, PoisonError};

use super::{CounterStore, CounterStoreError};
use crate::overrides::Override;

/// How long the Redis index outlives its latest override: a service down for longer
/// than this when an override expires never audits that expiry.
pub const INDEX_GRACE_MS: u64 = 3_600_000;

/// What setting an override did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stored {
    /// It is stored; `active` overrides are live now, it included.
    Set {
        /// Live overrides.
        active: usize,
    },
    /// Refused: `active` overrides are live already, the most allowed.
    Full {
        /// Live overrides.
        active: usize,
    },
    /// Refused: an override with its id exists (the caller makes a new id).
    Exists,
}

/// What a sweep found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Expired {
    /// The overrides that ended since the last sweep, claimed by this one.
    pub overrides: Vec<Override>,
    /// The live ones left.
    pub active: usize,
}

/// The memory store's overrides: a map, by id.
#[derive(Debug, Default)]
pub struct MemoryOverrides {
    map: Mutex<BTreeMap<String, Override>>,
}

impl MemoryOverrides {
    fn map(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Override>> {
        // Every change is one insert or remove: a poisoned lock holds a whole map.
        self.map.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stores `item` unless `max` are live at `now_ms` or its id is taken.
    pub fn set(&self, item: Override, now_ms: u64, max: usize) -> Stored {
        let mut map = self.map();
        let active = map.values().filter(|o| o.is_live(now_ms)).count();
        if active >= max {
            return Stored::Full { active };
        }
        if map.contains_key(&item.id) {
            return Stored::Exists;
        }
        map.insert(item.id.clone(), item);
        Stored::Set { active: active + 1 }
    }

    /// The live overrides at `now_ms`, by expiry then id.
    pub fn list(&self, now_ms: u64) -> Vec<Override> {
        let mut live: Vec<Override> = self.map().values().filter(|o| o.is_live(now_ms)).cloned().collect();
        sort(&mut live);
        live
    }

    /// Removes the live override `id`; `None` when there is none (an expired one is left
    /// to the sweep, which audits it).
    pub fn remove(&self, id: &str, now_ms: u64) -> Option<Override> {
        let mut map = self.map();
        if !map.get(id).is_some_and(|o| o.is_live(now_ms)) {
            return None;
        }
        map.remove(id)
    }

    /// Removes and returns every override ended at `now_ms`.
    pub fn expire(&self, now_ms: u64) -> Expired {
        let mut map = self.map();
        let ended: Vec<String> = map.values().filter(|o| !o.is_live(now_ms)).map(|o| o.id.clone()).collect();
        let mut overrides: Vec<Override> = ended.iter().filter_map(|id| map.remove(id)).collect();
        sort(&mut overrides);
        Expired { overrides, active: map.len() }
    }
}

fn sort(overrides: &mut [Override]) {
    overrides.sort_by(|a, b| (a.expires_at_ms, &a.id).cmp(&(b.expires_at_ms, &b.id)));
}

impl CounterStore {
    /// The store's time: the memory store's clock (a test's, when given), the service's
    /// wall clock for Redis (whose own `TIME` decides counters; this one stamps overrides
    /// and the answers no counter decided, those of bypassed entries).
    pub fn now(&self) -> shared_store::Nanos {
        match self {
            Self::Memory(m) => m.now(),
            Self::Redis(_) => shared_store::Nanos(
                std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)),
            ),
        }
    }

    /// [`CounterStore::now`] in Unix milliseconds.
    pub fn now_ms(&self) -> u64 {
        self.now().as_u64() / 1_000_000
    }

    /// Stores `item` unless `max` overrides are live at `now_ms` or its id is taken.
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn set_override(&self, item: &Override, now_ms: u64, max: usize) -> Result<Stored, CounterStoreError> {
        match self {
            Self::Memory(m) => Ok(m.overrides().set(item.clone(), now_ms, max)),
            Self::Redis(r) => r.set_override(item, now_ms, max).await,
        }
    }

    /// The overrides live at `now_ms`, by expiry then id.
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn list_overrides(&self, now_ms: u64) -> Result<Vec<Override>, CounterStoreError> {
        match self {
            Self::Memory(m) => Ok(m.overrides().list(now_ms)),
            Self::Redis(r) => r.list_overrides(now_ms).await,
        }
    }

    /// Removes the live override `id` and returns it; `None` when there is none.
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn remove_override(&self, id: &str, now_ms: u64) -> Result<Option<Override>, CounterStoreError> {
        match self {
            Self::Memory(m) => Ok(m.overrides().remove(id, now_ms)),
            Self::Redis(r) => r.remove_override(id, now_ms).await,
        }
    }

    /// The version of the overrides: a number that changes whenever one is set or removed
    /// (`None` on the memory store, whose changes all go through this instance).
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn overrides_version(&self) -> Result<Option<u64>, CounterStoreError> {
        match self {
            Self::Memory(_) => Ok(None),
            Self::Redis(r) => r.overrides_version().await.map(Some),
        }
    }

    /// Claims every override ended at `now_ms` (each is claimed by one sweep only, even
    /// with several service instances on one Redis).
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn expire_overrides(&self, now_ms: u64) -> Result<Expired, CounterStoreError> {
        match self {
            Self::Memory(m) => Ok(m.overrides().expire(now_ms)),
            Self::Redis(r) => r.expire_overrides(now_ms).await,
        }
    }
}
