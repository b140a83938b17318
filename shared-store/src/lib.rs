//! Sluice's admission core: the rate-limit algorithms, the state they keep, and the
//! atomic read–decide–compare-and-swap loop over proxy-wasm shared data.
//!
//! This crate has no proxy-wasm, tokio or Redis dependency. The same code runs natively
//! (tests, the counter service's memory store), inside the filter on `wasm32-wasip1`,
//! and on `wasm32-unknown-unknown` under wasm-bindgen-test.
//!
//! # Layout
//!
//! * [`algorithm`]: the one list of algorithms and what each can do.
//! * [`limit`]: the algorithms as pure functions, `decide(state, now, cost)`, and
//!   `charge(state, now, cost, max_debt)` for admissions made elsewhere.
//! * [`decision`]: what they answer (admitted or not, limit, remaining, reset, retry).
//! * [`codec`]: the versioned binary form of a key's state.
//! * [`store`]: the [`Store`] trait, with Envoy's exact shared-data semantics, and
//!   [`MemoryStore`].
//! * [`limiter`]: the CAS loop, all-or-nothing across limits, key creation.
//! * [`update`]: the same loop for one record under one key (lease records, breaker).
//! * [`words`]: a fixed-width codec for such records.
//! * [`key`]: canonical descriptors, keyed hashing, bounded slot tables.
//! * [`time`]: [`Nanos`], the [`Clock`] trait, [`ManualClock`] for tests.
//!
//! # Example
//!
//! ```
//! use shared_store::{Limit, Limiter, ManualClock, MemoryStore, Nanos, Placement, Rate, Verdict};
//!
//! // 2 requests per second, bursts of 2.
//! let limit = Limit::token_bucket(Rate::new(2, Nanos::from_secs(1)).unwrap(), 2).unwrap();
//! let clock = ManualClock::at(Nanos::from_secs(100));
//! let limiter = Limiter::new(MemoryStore::new(), clock.clone());
//! let alice = Placement::dedicated("per-user/alice");
//!
//! assert!(limiter.check_one(&alice, &limit, 1)?.admitted);
//! assert!(limiter.check_one(&alice, &limit, 1)?.admitted);
//! let third = limiter.check_one(&alice, &limit, 1)?;
//! assert_eq!(third.decisions[0].verdict, Verdict::Rejected { retry_after: Nanos::from_millis(500) });
//!
//! clock.advance(Nanos::from_millis(500));
//! assert!(limiter.check_one(&alice, &limit, 1)?.admitted);
//! # Ok::<(), shared_store::LimitError>(())
//! ```
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing))]
#![deny(missing_docs)]

pub mod algorithm;
pub mod codec;
pub mod decision;
pub mod key;
pub mod limit;
pub mod limiter;
pub mod store;
pub mod time;
pub mod update;
pub mod words;

pub use algorithm::Algorithm;
pub use codec::{DecodeError, Record};
pub use decision::{Decision, Verdict};
pub use key::{HashKey, OVERFLOW_OWNER, Placement, SlotTable, descriptor, push_decimal};
pub use limit::{
    ANONYMOUS_HOLDER, Carried, Holding, InvalidLimit, Limit, LogEntry, MAX_CONCURRENCY, MAX_HOLDERS, MAX_LOG_ENTRIES,
    RENEW_EVERY, Rate, STALE_AFTER, State,
};
pub use limiter::{
    Admission, DEFAULT_ANCHOR_KEY, DEFAULT_MAX_ATTEMPTS, Decisions, LimitError, Limiter, MAX_INLINE_LIMITS, Renewal,
    Request, Reservation, Settlement, Slot,
};
pub use store::{Cas, Entry, MemoryStore, Store, StoreError, Swap, create};
#[cfg(not(all(target_arch = "wasm32", target_os = "unknown")))]
pub use time::MonotonicClock;
pub use time::{Clock, ManualClock, Nanos};
pub use update::{Change, Landed, UpdateError, update};
