//! Shared data (`proxy_{get,set}_shared_data`), written from Envoy's own implementation
//! rather than borrowed from the code the host tests.
//!
//! Envoy does not implement shared data itself: every `Context` inherits
//! proxy-wasm-cpp-host's `ContextBase::getSharedData` / `setSharedData`
//! (`src/context.cc`), which call one process-wide `SharedData` object
//! (`src/shared_data.cc`, `src/shared_data.h`; read at proxy-wasm-cpp-host 52a02917, the
//! same code as 2684bc36). [`SharedDataStore`] follows it rule by rule:
//!
//! | Envoy (`SharedData`) | here |
//! |---|---|
//! | one `std::map<vm_id, unordered_map<key, (value, cas)>>` behind one mutex | one `HashMap<vm_id, HashMap<key, Entry>>` behind one mutex |
//! | `get`: no map for the `vm_id`, or no such key in it → `NotFound`; else the value and its cas | [`SharedDataStore::get`] returns `None` or `(value, cas)` |
//! | `set` on an existing key: `cas != 0 && cas != stored` → `CasMismatch`, nothing changes (the counter does not move) | [`SetOutcome::CasMismatch`] |
//! | `set` on an existing key otherwise (cas 0, or the stored one): new value, cas = `nextCas()` | [`SetOutcome::Written`] |
//! | `set` on a missing key: created with cas = `nextCas()`, **whatever the cas passed** (it is never compared) | [`SetOutcome::Written`] |
//! | `nextCas()`: one `uint32_t cas_` for every key of every `vm_id`, starting at 1; returns it and increments, skipping 0 on wrap-around | `next_cas` |
//! | keys and values are byte strings (`std::string`), the empty key and empty values included | `Vec<u8>` |
//!
//! Two rules of Envoy's are not modelled, because no ABI call reaches them:
//! `SharedData::remove` and `keys` (no host function in ABI 0.2.1; the Rust SDK's
//! `remove_shared_data` writes an empty value instead), and `deleteByVmId`, which drops a
//! `vm_id`'s data when the last VM with that `vm_id` is destroyed (a host here keeps its
//! data for its whole life, across `FAIL_RELOAD` and reconfiguration, as Envoy does while
//! the old and new VMs overlap).
//!
//! The differential test `tests/tests/envoy/shared_data.rs` (package `sluice-tests`)
//! runs the same get / set / CAS sequences from the test guest in real Envoy and in
//! wasm-host and compares every status, value and cas.
//!
//! Several hosts built on one store ([`crate::HostBuilder::shared_store`]) behave like
//! several plugins of one Envoy process: keys scoped by `vm_id`, one cas counter.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

/// Called before every shared-data host call a guest makes, with the index of the
/// worker making it ([`crate::HostBuilder::before_shared_data`]). A test that runs
/// workers on threads can use it to interleave their callbacks at each shared-data
/// access, deterministically (one worker runs at a time; the hook chooses which), and so
/// exercise the races a compare-and-swap protocol must survive.
pub type BeforeSharedData = Arc<dyn Fn(usize) + Send + Sync>;

/// The shared data of one proxy process: every `vm_id`'s keys and the one cas counter
/// (Envoy's process-wide `SharedData`). See the module docs for the rules.
pub struct SharedDataStore {
    inner: Mutex<Inner>,
}

struct Inner {
    /// The cas the next successful write gets (Envoy's `cas_`): never 0.
    next_cas: u32,
    by_vm_id: HashMap<String, Keys, Hasher>,
}

/// foldhash rather than std's SipHash: every request looks keys up several times, and
/// the keys are the guest's own, so hash flooding is no concern here.
type Hasher = foldhash::fast::RandomState;

/// One `vm_id`'s keys.
type Keys = HashMap<Vec<u8>, Entry, Hasher>;

struct Entry {
    value: Vec<u8>,
    cas: u32,
}

/// The outcome of a write, in proxy-wasm terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetOutcome {
    /// `OK`.
    Written,
    /// `CAS_MISMATCH`: the key exists and carries another token.
    CasMismatch,
}

impl Default for SharedDataStore {
    fn default() -> Self {
        Self::with_next_cas(1)
    }
}

impl fmt::Debug for SharedDataStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let inner = self.lock();
        f.debug_struct("SharedDataStore")
            .field("vm_ids", &inner.by_vm_id.len())
            .field("keys", &inner.by_vm_id.values().map(HashMap::len).sum::<usize>())
            .field("next_cas", &inner.next_cas)
            .finish()
    }
}

/// Envoy's `nextCas()`: the current token, then the counter moves on, skipping 0.
fn next_cas(counter: &mut u32) -> u32 {
    let token = *counter;
    *counter = counter.wrapping_add(1);
    if *counter == 0 {
        *counter = 1;
    }
    token
}

/// Envoy's `SharedData::set` within one `vm_id`'s map.
fn write(map: &mut Keys, counter: &mut u32, key: &[u8], value: &[u8], cas: u32) -> SetOutcome {
    match map.get_mut(key) {
        Some(entry) if cas != 0 && cas != entry.cas => SetOutcome::CasMismatch,
        Some(entry) => {
            // Overwrite in place: the value's allocation is reused.
            entry.value.clear();
            entry.value.extend_from_slice(value);
            entry.cas = next_cas(counter);
            SetOutcome::Written
        }
        None => {
            let cas = next_cas(counter);
            map.insert(key.to_vec(), Entry { value: value.to_vec(), cas });
            SetOutcome::Written
        }
    }
}

impl SharedDataStore {
    /// An empty store; the first write gets cas 1, as in a fresh Envoy process.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose next write gets `next_cas` (0 is taken as 1), so that tests
    /// reach the wrap-around at `u32::MAX` quickly.
    pub fn with_next_cas(next_cas: u32) -> Self {
        Self { inner: Mutex::new(Inner { next_cas: next_cas.max(1), by_vm_id: HashMap::default() }) }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The value of `key` under `vm_id` and its cas (Envoy's `SharedData::get`): `None`
    /// is `NOT_FOUND`.
    pub fn get(&self, vm_id: &str, key: &[u8]) -> Option<(Vec<u8>, u32)> {
        let inner = self.lock();
        let entry = inner.by_vm_id.get(vm_id)?.get(key)?;
        Some((entry.value.clone(), entry.cas))
    }

    /// Writes `value` under `key` of `vm_id` (Envoy's `SharedData::set`): a non-zero
    /// `cas` must match the stored one if the key exists; a missing key is created
    /// whatever `cas` is. A write that succeeds takes the next token.
    pub fn set(&self, vm_id: &str, key: &[u8], value: &[u8], cas: u32) -> SetOutcome {
        let mut inner = self.lock();
        let Inner { next_cas: counter, by_vm_id } = &mut *inner;
        // Looked up first: no allocation for the `vm_id` once its map exists.
        if let Some(map) = by_vm_id.get_mut(vm_id) {
            return write(map, counter, key, value, cas);
        }
        let map = by_vm_id.entry(vm_id.to_owned()).or_default();
        write(map, counter, key, value, cas)
    }

    /// Every key of `vm_id` with its value, sorted by key.
    pub fn entries(&self, vm_id: &str) -> Vec<(Vec<u8>, Vec<u8>)> {
        let inner = self.lock();
        let mut entries: Vec<_> = inner
            .by_vm_id
            .get(vm_id)
            .map(|map| map.iter().map(|(key, entry)| (key.clone(), entry.value.clone())).collect())
            .unwrap_or_default();
        entries.sort();
        entries
    }

    /// How many keys there are, over every `vm_id` (keys are never deleted).
    pub fn len(&self) -> usize {
        self.lock().by_vm_id.values().map(HashMap::len).sum()
    }

    /// Whether no key was ever written.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The shared data one `vm_id` sees: a view of a [`SharedDataStore`].
#[derive(Clone, Debug)]
pub struct SharedData {
    store: Arc<SharedDataStore>,
    vm_id: String,
}

impl SharedData {
    /// The view of `vm_id` on `store`.
    pub fn new(store: Arc<SharedDataStore>, vm_id: &str) -> Self {
        Self { store, vm_id: vm_id.to_owned() }
    }

    /// The value of `key` and its CAS token, as `proxy_get_shared_data` returns them.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Option<(Vec<u8>, u32)> {
        self.store.get(&self.vm_id, key.as_ref())
    }

    /// Writes `value` under `key` as `proxy_set_shared_data` does: a non-zero `cas` must
    /// match the key's token, unless the key does not exist yet.
    pub fn set(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>, cas: u32) -> SetOutcome {
        self.store.set(&self.vm_id, key.as_ref(), value.as_ref(), cas)
    }

    /// Every key of this `vm_id` with its value, sorted by key.
    pub fn entries(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        self.store.entries(&self.vm_id)
    }

    /// The process-wide store behind every `vm_id`.
    pub fn store(&self) -> &Arc<SharedDataStore> {
        &self.store
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_of_one_vm_id_is_not_visible_under_another() {
        let store = Arc::new(SharedDataStore::new());
        let a = SharedData::new(Arc::clone(&store), "a");
        let ab = SharedData::new(Arc::clone(&store), "ab");

        a.set("bk", "1", 0);

        assert_eq!(ab.get("k"), None);
        assert_eq!(ab.get("bk"), None);
        assert_eq!(a.get("bk").map(|(v, _)| v), Some(b"1".to_vec()));
    }

    #[test]
    fn keys_that_are_not_utf8_round_trip() {
        let data = SharedData::new(Arc::new(SharedDataStore::new()), "vm");

        data.set([0xff, b'k'], "v", 0);

        assert_eq!(data.entries(), vec![(vec![0xff, b'k'], b"v".to_vec())]);
        assert_eq!(data.get([0xff, b'k']).map(|(v, _)| v), Some(b"v".to_vec()));
    }

    #[test]
    fn tokens_are_shared_by_every_vm_id() {
        let store = Arc::new(SharedDataStore::new());
        let a = SharedData::new(Arc::clone(&store), "a");
        let b = SharedData::new(Arc::clone(&store), "b");

        a.set("k", "", 0);
        b.set("k", "", 0);

        assert_eq!(a.get("k").map(|(_, cas)| cas), Some(1));
        assert_eq!(b.get("k").map(|(_, cas)| cas), Some(2));
    }

    #[test]
    fn a_missing_key_is_created_whatever_the_cas() {
        let store = SharedDataStore::new();

        let outcome = store.set("vm", b"k", b"v", 12345);

        assert_eq!(outcome, SetOutcome::Written);
        assert_eq!(store.get("vm", b"k"), Some((b"v".to_vec(), 1)));
    }

    #[test]
    fn a_mismatch_changes_nothing_and_does_not_use_up_a_token() {
        let store = SharedDataStore::new();
        store.set("vm", b"k", b"first", 0);

        let stale = store.set("vm", b"k", b"second", 7);
        let matching = store.set("vm", b"k", b"third", 1);

        assert_eq!((stale, matching), (SetOutcome::CasMismatch, SetOutcome::Written));
        assert_eq!(store.get("vm", b"k"), Some((b"third".to_vec(), 2)));
    }

    #[test]
    fn a_zero_cas_overwrites_and_takes_a_new_token() {
        let store = SharedDataStore::new();
        store.set("vm", b"k", b"first", 0);

        assert_eq!(store.set("vm", b"k", b"second", 0), SetOutcome::Written);
        assert_eq!(store.get("vm", b"k"), Some((b"second".to_vec(), 2)));
    }

    #[test]
    fn the_token_counter_skips_zero_when_it_wraps() {
        let store = SharedDataStore::with_next_cas(u32::MAX);

        store.set("vm", b"a", b"", 0);
        store.set("vm", b"b", b"", 0);

        assert_eq!(store.get("vm", b"a").map(|(_, cas)| cas), Some(u32::MAX));
        assert_eq!(store.get("vm", b"b").map(|(_, cas)| cas), Some(1));
    }

    #[test]
    fn the_empty_key_and_empty_values_are_ordinary() {
        let store = SharedDataStore::new();

        store.set("vm", b"", b"", 0);

        assert_eq!(store.get("vm", b""), Some((Vec::new(), 1)));
        assert_eq!(store.get("", b""), None);
        assert_eq!(store.len(), 1);
    }
}
