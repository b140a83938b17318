//! Shared data (`proxy_{get,set}_shared_data`) with Envoy's semantics.
//!
//! Envoy (proxy-wasm-cpp-host `src/shared_data.cc`) keeps one process-wide map, behind
//! one mutex, with one key space per `vm_id`, and one CAS token counter for every key of
//! every `vm_id`. This host stores everything in one [`MemoryStore`], which has exactly
//! those rules, and namespaces each guest key by its `vm_id` inside it. Several hosts
//! built on the same store (see [`crate::HostBuilder::shared_store`]) behave like several
//! plugins of one Envoy process.
//!
//! Guest keys are bytes. A key that is valid UTF-8 is stored as `"<n>:<vm_id>u<key>"`
//! (where `<n>` is the byte length of the vm_id); any other key as
//! `"<n>:<vm_id>x<hex>"`. The mapping is injective, so distinct guest keys never collide.

use std::cell::RefCell;
use std::sync::Arc;

use shared_store::store::{Cas, MemoryStore, Store, Swap};

/// The shared data one `vm_id` sees.
#[derive(Clone, Debug)]
pub struct SharedData {
    store: Arc<MemoryStore>,
    prefix: String,
    /// Where store keys are built, reused so that a shared-data call does not allocate
    /// for its key (one `SharedData` per VM, used by one thread at a time).
    scratch: RefCell<String>,
}

/// The outcome of a write, in proxy-wasm terms.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SetOutcome {
    /// `OK`.
    Written,
    /// `CAS_MISMATCH`: the key exists and carries another token.
    CasMismatch,
}

impl SharedData {
    pub(crate) fn new(store: Arc<MemoryStore>, vm_id: &str) -> Self {
        Self { store, prefix: format!("{}:{vm_id}", vm_id.len()), scratch: RefCell::default() }
    }

    /// Runs `f` on the store key of a guest key.
    fn with_store_key<R>(&self, key: &[u8], f: impl FnOnce(&str) -> R) -> R {
        match self.scratch.try_borrow_mut() {
            Ok(mut out) => {
                out.clear();
                self.push_store_key(&mut out, key);
                f(&out)
            }
            // Not reachable (nothing re-enters while a key is in use); correct anyway.
            Err(_) => {
                let mut out = String::new();
                self.push_store_key(&mut out, key);
                f(&out)
            }
        }
    }

    fn push_store_key(&self, out: &mut String, key: &[u8]) {
        out.push_str(&self.prefix);
        match std::str::from_utf8(key) {
            Ok(text) => {
                out.push('u');
                out.push_str(text);
            }
            Err(_) => {
                const HEX: &[u8; 16] = b"0123456789abcdef";
                out.push('x');
                for byte in key {
                    out.push(char::from(HEX[usize::from(byte >> 4)]));
                    out.push(char::from(HEX[usize::from(byte & 0xf)]));
                }
            }
        }
    }

    fn guest_key(&self, store_key: &str) -> Option<Vec<u8>> {
        let rest = store_key.strip_prefix(&self.prefix)?;
        if let Some(text) = rest.strip_prefix('u') {
            return Some(text.as_bytes().to_vec());
        }
        let hex = rest.strip_prefix('x')?;
        (0..hex.len())
            .step_by(2)
            .map(|i| hex.get(i..i + 2).and_then(|pair| u8::from_str_radix(pair, 16).ok()))
            .collect()
    }

    /// The value of `key` and its CAS token, as `proxy_get_shared_data` returns them.
    pub fn get(&self, key: impl AsRef<[u8]>) -> Option<(Vec<u8>, u32)> {
        // MemoryStore never fails; an error would mean a different Store, not a missing key.
        let entry = self.with_store_key(key.as_ref(), |key| self.store.get(key));
        entry.ok().flatten().map(|entry| (entry.value, entry.cas.get()))
    }

    /// Writes `value` under `key` as `proxy_set_shared_data` does: a non-zero `cas` must
    /// match the key's token, unless the key does not exist yet.
    pub fn set(&self, key: impl AsRef<[u8]>, value: impl AsRef<[u8]>, cas: u32) -> SetOutcome {
        match self.with_store_key(key.as_ref(), |key| self.store.set(key, value.as_ref(), Cas::new(cas))) {
            Ok(Swap::Written) => SetOutcome::Written,
            Ok(Swap::Conflict) | Err(_) => SetOutcome::CasMismatch,
        }
    }

    /// Every key of this `vm_id` with its value, sorted by key.
    pub fn entries(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut entries: Vec<_> = self
            .store
            .entries()
            .into_iter()
            .filter_map(|(key, value)| self.guest_key(&key).map(|key| (key, value)))
            .collect();
        entries.sort();
        entries
    }

    /// The process-wide store behind every `vm_id`.
    pub fn store(&self) -> &Arc<MemoryStore> {
        &self.store
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_key_of_one_vm_id_is_not_visible_under_another() {
        let store = Arc::new(MemoryStore::new());
        let a = SharedData::new(Arc::clone(&store), "a");
        let ab = SharedData::new(Arc::clone(&store), "ab");

        a.set("bk", "1", 0);

        assert_eq!(ab.get("k"), None);
        assert_eq!(ab.get("bk"), None);
        assert_eq!(a.get("bk").map(|(v, _)| v), Some(b"1".to_vec()));
    }

    #[test]
    fn keys_that_are_not_utf8_round_trip() {
        let data = SharedData::new(Arc::new(MemoryStore::new()), "vm");

        data.set([0xff, b'k'], "v", 0);

        assert_eq!(data.entries(), vec![(vec![0xff, b'k'], b"v".to_vec())]);
        assert_eq!(data.get([0xff, b'k']).map(|(v, _)| v), Some(b"v".to_vec()));
    }

    #[test]
    fn tokens_are_shared_by_every_vm_id() {
        let store = Arc::new(MemoryStore::new());
        let a = SharedData::new(Arc::clone(&store), "a");
        let b = SharedData::new(Arc::clone(&store), "b");

        a.set("k", "", 0);
        b.set("k", "", 0);

        assert_eq!(a.get("k").map(|(_, cas)| cas), Some(1));
        assert_eq!(b.get("k").map(|(_, cas)| cas), Some(2));
    }
}
