//! [`update`]: the read–change–CAS-write loop for one record under one shared-data key,
//! written once for every record that is not a limiter's bucket (the filter's lease
//! records, its circuit breaker, its hash secret).
//!
//! The contract: `change` is shown the bytes under the key as they are now (`None` when
//! the key was never written) and answers [`Change::Keep`] or [`Change::Write`]. A write is
//! conditional on exactly the value `change` saw: it replaces that value by CAS, or, for a
//! missing key, creates it through [`create`] (the anchor protocol: a second creator
//! conflicts instead of overwriting, see `limiter`'s module docs). A lost race re-reads
//! and asks `change` again, up to `attempts` times. So whatever `change` answers was
//! decided on the value its write replaced, which is what makes a read–decide–write on
//! shared data one atomic step.
//!
//! Decoding is the caller's: what damaged bytes mean differs by record (a lease record
//! reads them as idle, the breaker as closed, the hash secret replaces them), so `change`
//! gets raw bytes, and the fixed-width codec in [`crate::words`] is there to decode them.

use crate::store::{Store, StoreError, Swap, create};

/// What `change` decided about the value it was shown.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change<B, T> {
    /// Leave the value as it is; the update answers `T`.
    Keep(T),
    /// Replace the value by these bytes; once the write lands, the update answers `T`.
    Write(B, T),
}

/// A landed update: `change`'s answer, and how many races it lost before that.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Landed<T> {
    /// What `change` answered on the attempt that landed (or kept).
    pub result: T,
    /// Attempts whose write another writer beat.
    pub conflicts: u32,
}

/// Why an update did not land.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UpdateError {
    /// Every attempt lost its race to another writer.
    Contended {
        /// How many were made.
        attempts: u32,
    },
    /// The host failed a shared-data call.
    Store(StoreError),
}

impl From<StoreError> for UpdateError {
    fn from(error: StoreError) -> Self {
        Self::Store(error)
    }
}

impl std::fmt::Display for UpdateError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Contended { attempts } => write!(f, "every one of {attempts} CAS attempts lost its race"),
            Self::Store(error) => error.fmt(f),
        }
    }
}

impl std::error::Error for UpdateError {}

/// Runs `change` on the value under `key` until its answer lands (see the module docs).
///
/// # Errors
/// [`UpdateError::Contended`] when all `attempts` lost their race (nothing was written),
/// [`UpdateError::Store`] when the store fails.
pub fn update<S, B, T>(
    store: &S,
    anchor: &str,
    key: &str,
    attempts: u32,
    mut change: impl FnMut(Option<&[u8]>) -> Change<B, T>,
) -> Result<Landed<T>, UpdateError>
where
    S: Store,
    B: AsRef<[u8]>,
{
    for conflicts in 0..attempts {
        let current = store.get(key)?;
        let (bytes, result) = match change(current.as_ref().map(|entry| entry.value.as_slice())) {
            Change::Keep(result) => return Ok(Landed { result, conflicts }),
            Change::Write(bytes, result) => (bytes, result),
        };
        let swap = match &current {
            Some(entry) => store.set(key, bytes.as_ref(), Some(entry.cas))?,
            None => create(store, anchor, key, bytes.as_ref())?,
        };
        if swap == Swap::Written {
            return Ok(Landed { result, conflicts });
        }
    }
    Err(UpdateError::Contended { attempts })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Cas, Entry, MemoryStore};
    use std::cell::Cell;

    fn add_one(current: Option<&[u8]>) -> Change<Vec<u8>, u8> {
        let next = current.and_then(|bytes| bytes.first().copied()).unwrap_or(0) + 1;
        Change::Write(vec![next], next)
    }

    #[test]
    fn a_missing_key_is_created_with_what_change_answers() {
        let store = MemoryStore::new();

        let landed = update(&store, "anchor", "k", 4, add_one).unwrap();

        assert_eq!(landed, Landed { result: 1, conflicts: 0 });
        assert_eq!(store.get("k").unwrap().unwrap().value, [1]);
    }

    #[test]
    fn keep_writes_nothing() {
        let store = MemoryStore::new();
        let _ = store.set("k", b"v", None).unwrap();
        let before = store.get("k").unwrap().unwrap().cas;

        let landed =
            update(&store, "anchor", "k", 4, |current| Change::<Vec<u8>, _>::Keep(current.map(<[u8]>::to_vec)));

        assert_eq!(landed.unwrap().result, Some(b"v".to_vec()));
        assert_eq!(store.get("k").unwrap().unwrap().cas, before);
    }

    /// A store where another writer changes the key between every read and write, for
    /// the first `races` reads.
    struct Racing {
        inner: MemoryStore,
        races: Cell<u32>,
    }

    impl Store for Racing {
        fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
            let entry = self.inner.get(key);
            if self.races.get() > 0 {
                self.races.set(self.races.get() - 1);
                let _ = self.inner.set(key, &[100], None)?;
            }
            entry
        }
        fn set(&self, key: &str, value: &[u8], cas: Option<Cas>) -> Result<Swap, StoreError> {
            self.inner.set(key, value, cas)
        }
    }

    #[test]
    fn a_lost_race_is_decided_again_on_the_value_that_won_it() {
        let store = Racing { inner: MemoryStore::new(), races: Cell::new(2) };
        let _ = store.inner.set("k", &[5], None).unwrap();

        let landed = update(&store, "anchor", "k", 4, add_one).unwrap();

        // The two writes on 5 and on the first 100 lost; the third decided on 100.
        assert_eq!(landed, Landed { result: 101, conflicts: 2 });
        assert_eq!(store.inner.get("k").unwrap().unwrap().value, [101]);
    }

    #[test]
    fn a_second_creator_conflicts_instead_of_overwriting() {
        // Both see the key missing; the racer creates it first.
        let store = Racing { inner: MemoryStore::new(), races: Cell::new(1) };

        let landed = update(&store, "anchor", "k", 4, add_one).unwrap();

        assert_eq!(landed, Landed { result: 101, conflicts: 1 });
    }

    #[test]
    fn every_attempt_lost_is_contended_and_writes_nothing_of_its_own() {
        let store = Racing { inner: MemoryStore::new(), races: Cell::new(u32::MAX) };
        let _ = store.inner.set("k", &[5], None).unwrap();

        let failed = update(&store, "anchor", "k", 3, add_one);

        assert_eq!(failed, Err(UpdateError::Contended { attempts: 3 }));
        assert_eq!(store.inner.get("k").unwrap().unwrap().value, [100]);
    }

    struct Failing;

    impl Store for Failing {
        fn get(&self, _: &str) -> Result<Option<Entry>, StoreError> {
            Err(StoreError { operation: "get", status: Some(1) })
        }
        fn set(&self, _: &str, _: &[u8], _: Option<Cas>) -> Result<Swap, StoreError> {
            Err(StoreError { operation: "set", status: Some(1) })
        }
    }

    #[test]
    fn a_failing_store_is_a_store_error() {
        let failed = update(&Failing, "anchor", "k", 3, add_one);

        assert_eq!(failed, Err(UpdateError::Store(StoreError { operation: "get", status: Some(1) })));
    }
}
