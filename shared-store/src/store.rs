//! The [`Store`] trait: proxy-wasm shared data, exactly as Envoy implements it.
//!
//! Envoy (through proxy-wasm-cpp-host, `src/shared_data.cc`) gives a filter one
//! key-value map per `vm_id`, shared by every worker thread of the proxy. Its rules are
//! narrow, and every limiter in this crate is written against them rather than against
//! an idealised store:
//!
//! * [`Store::get`] returns the value and a CAS token, or nothing for a missing key.
//! * [`Store::set`] with a CAS token writes only if the key still carries that token;
//!   otherwise it answers [`Swap::Conflict`].
//! * A `set` on a **missing** key succeeds whatever the CAS token: the host has no atomic
//!   create. Two workers that both read "missing" both succeed, and the last write wins.
//! * A `set` with no CAS token (`cas = 0` in the ABI) overwrites unconditionally.
//! * CAS tokens come from one process-wide counter that every write advances and that
//!   skips 0 when it wraps, so a token is unique to one write (until 2³² later writes).
//! * Nothing is ever deleted or expired: the set of keys only grows.
//!
//! [`MemoryStore`] reproduces these rules exactly; tests use it to stand in for Envoy.
//! (`wasm-host` has its own implementation of the same rules, written from Envoy's
//! source and compared with a real Envoy, so that a mistake in this model cannot pass
//! both this crate's tests and the filter's tests in wasm-host.)

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::{Mutex, PoisonError};

/// A compare-and-swap token: proxy-wasm's `cas` value. Never zero, because the ABI gives
/// zero the meaning "no comparison".
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cas(NonZeroU32);

impl Cas {
    /// The token for a raw ABI value; `None` for 0, which means "no token".
    pub const fn new(raw: u32) -> Option<Self> {
        match NonZeroU32::new(raw) {
            Some(token) => Some(Self(token)),
            None => None,
        }
    }

    /// The raw ABI value.
    pub const fn get(self) -> u32 {
        self.0.get()
    }
}

/// A value read from a [`Store`], with the token of the write that produced it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Entry {
    /// The bytes stored under the key.
    pub value: Vec<u8>,
    /// The token to pass to [`Store::set`] to replace exactly this value.
    pub cas: Cas,
}

/// The outcome of a [`Store::set`] that reached the store.
#[must_use]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Swap {
    /// The value was written.
    Written,
    /// The key carries another token than the one given: someone else wrote first.
    Conflict,
}

/// The store could not answer. Contention is not an error (see [`Swap::Conflict`]); this
/// is the host refusing or failing the call, for example an unexpected proxy-wasm status.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StoreError {
    /// What failed, for logs and metrics.
    pub operation: &'static str,
    /// The raw status the host returned, when there was one.
    pub status: Option<u32>,
}

impl std::fmt::Display for StoreError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.status {
            Some(status) => write!(f, "shared data {} failed with host status {status}", self.operation),
            None => write!(f, "shared data {} failed", self.operation),
        }
    }
}

impl std::error::Error for StoreError {}

/// A key-value store with the semantics of proxy-wasm shared data (see the module docs).
pub trait Store {
    /// Reads `key`: its value and CAS token, or `None` when the key was never written.
    ///
    /// # Errors
    /// [`StoreError`] when the host fails the call.
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError>;

    /// Writes `value` under `key`. With `Some(cas)` the write happens only if the key still
    /// carries `cas`, **or if the key does not exist at all**; with `None` it is
    /// unconditional.
    ///
    /// # Errors
    /// [`StoreError`] when the host fails the call.
    fn set(&self, key: &str, value: &[u8], cas: Option<Cas>) -> Result<Swap, StoreError>;
}

impl<S: Store + ?Sized> Store for &S {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        (**self).get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<Cas>) -> Result<Swap, StoreError> {
        (**self).set(key, value, cas)
    }
}

impl<S: Store + ?Sized> Store for std::sync::Arc<S> {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        (**self).get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<Cas>) -> Result<Swap, StoreError> {
        (**self).set(key, value, cas)
    }
}

/// Creates `key` with `bytes` unless another writer created it first, on a store with no
/// atomic create: writes the `anchor` key and reads back its token `T`, then writes `key`
/// with CAS `T`. A missing key is created whatever the token; a key another writer
/// created in the meantime carries that write's token, which is not `T` (a token belongs
/// to one write), so the write answers [`Swap::Conflict`] and the caller re-reads. The
/// argument and its one gap (a token counter wrap between the two writes) are in
/// `limiter`'s module docs.
///
/// # Errors
/// When the store fails.
pub fn create(store: &impl Store, anchor: &str, key: &str, bytes: &[u8]) -> Result<Swap, StoreError> {
    let _ = store.set(anchor, &[], None)?;
    match store.get(anchor)? {
        Some(entry) => store.set(key, bytes, Some(entry.cas)),
        // A store that loses the anchor: do not guess, let the caller retry.
        None => Ok(Swap::Conflict),
    }
}

/// An in-memory [`Store`] with Envoy's shared-data semantics, including the ones that make
/// a limiter hard to write: no atomic create, and one token counter for all keys.
///
/// Like Envoy's, it is one map behind one mutex. Share it between threads with `Arc`.
#[derive(Debug)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Debug)]
struct Inner {
    map: HashMap<String, (Vec<u8>, Cas)>,
    /// The last token handed out; the next write gets the one after it.
    last_cas: u32,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::with_last_cas(0)
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose token counter stands at `last_cas`, so that tests can reach
    /// the wrap-around at `u32::MAX` quickly.
    pub fn with_last_cas(last_cas: u32) -> Self {
        Self { inner: Mutex::new(Inner { map: HashMap::new(), last_cas }) }
    }

    /// The number of keys ever written (keys are never deleted).
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether no key was ever written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Every key, sorted, with its value: for tests and for reading a host's state.
    pub fn entries(&self) -> Vec<(String, Vec<u8>)> {
        let mut entries: Vec<_> =
            self.lock().map.iter().map(|(key, (value, _))| (key.clone(), value.clone())).collect();
        entries.sort();
        entries
    }

    /// The total size of keys and values, in bytes.
    pub fn bytes(&self) -> usize {
        self.lock().map.iter().map(|(key, (value, _))| key.len() + value.len()).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave the map half-written: every
        // mutation is a single insert. So a poisoned lock is still a consistent map.
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

/// cpp-host's `nextCas()`: one counter for every key, skipping 0 on wrap.
fn next_cas(last_cas: &mut u32) -> Cas {
    *last_cas = last_cas.wrapping_add(1);
    if *last_cas == 0 {
        *last_cas = 1;
    }
    Cas::new(*last_cas).unwrap_or(Cas(NonZeroU32::MIN))
}

impl Store for MemoryStore {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        Ok(self.lock().map.get(key).map(|(value, cas)| Entry { value: value.clone(), cas: *cas }))
    }

    fn set(&self, key: &str, value: &[u8], cas: Option<Cas>) -> Result<Swap, StoreError> {
        let mut inner = self.lock();
        let Inner { map, last_cas } = &mut *inner;
        match map.get_mut(key) {
            Some((_, stored)) if cas.is_some_and(|expected| expected != *stored) => Ok(Swap::Conflict),
            // Overwrite in place: one lookup, no new key allocation for the common case.
            Some((stored_value, stored)) => {
                stored_value.clear();
                stored_value.extend_from_slice(value);
                *stored = next_cas(last_cas);
                Ok(Swap::Written)
            }
            None => {
                let token = next_cas(last_cas);
                map.insert(key.to_owned(), (value.to_vec(), token));
                Ok(Swap::Written)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn token(store: &MemoryStore, key: &str) -> Cas {
        store.get(key).unwrap().unwrap().cas
    }

    #[test]
    fn a_missing_key_reads_as_none() {
        assert_eq!(MemoryStore::new().get("k").unwrap(), None);
    }

    #[test]
    fn a_write_to_a_missing_key_succeeds_whatever_the_cas() {
        let store = MemoryStore::new();

        let swap = store.set("k", b"v", Cas::new(12345)).unwrap();

        assert_eq!(swap, Swap::Written);
        assert_eq!(store.get("k").unwrap().unwrap().value, b"v");
    }

    #[test]
    fn a_stale_cas_is_rejected_and_changes_nothing() {
        let store = MemoryStore::new();
        let _ = store.set("k", b"one", None).unwrap();
        let stale = token(&store, "k");
        let _ = store.set("k", b"two", Some(stale)).unwrap();

        let swap = store.set("k", b"three", Some(stale)).unwrap();

        assert_eq!(swap, Swap::Conflict);
        assert_eq!(store.get("k").unwrap().unwrap().value, b"two");
    }

    #[test]
    fn no_cas_overwrites_unconditionally() {
        let store = MemoryStore::new();
        let _ = store.set("k", b"one", None).unwrap();

        assert_eq!(store.set("k", b"two", None).unwrap(), Swap::Written);
        assert_eq!(store.get("k").unwrap().unwrap().value, b"two");
    }

    #[test]
    fn tokens_come_from_one_counter_for_all_keys() {
        let store = MemoryStore::new();
        let _ = store.set("a", b"", None).unwrap();
        let _ = store.set("b", b"", None).unwrap();
        let _ = store.set("a", b"", None).unwrap();

        assert_eq!(token(&store, "b").get(), 2);
        assert_eq!(token(&store, "a").get(), 3);
    }

    #[test]
    fn the_token_counter_skips_zero_when_it_wraps() {
        let store = MemoryStore::with_last_cas(u32::MAX - 1);
        let _ = store.set("a", b"", None).unwrap();
        let _ = store.set("b", b"", None).unwrap();

        assert_eq!(token(&store, "a").get(), u32::MAX);
        assert_eq!(token(&store, "b").get(), 1);
    }

    #[test]
    fn the_current_token_of_another_key_never_matches_an_existing_key() {
        // This is what the limiter's create protocol relies on (see `limiter`).
        let store = MemoryStore::new();
        let _ = store.set("k", b"mine", None).unwrap();
        let _ = store.set("anchor", b"", None).unwrap();
        let anchor = token(&store, "anchor");

        assert_eq!(store.set("k", b"lost", Some(anchor)).unwrap(), Swap::Conflict);
        assert_eq!(store.set("fresh", b"new", Some(anchor)).unwrap(), Swap::Written);
    }
}
