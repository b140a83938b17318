//! Sluice: a rate-limit filter for Envoy and Istio, compiled to `sluice.wasm`
//! (proxy-wasm ABI 0.2.1, `wasm32-wasip1`).
//!
//! # Layout
//!
//! Modules import only downwards (`tests/layers.rs` checks it, and holds this list to
//! its table), from the bottom:
//!
//! 1. the configuration, the ports and their metric names, the due queue and the usage
//!    reader: `config`, `host`, `series`, `due`, `usage`;
//! 2. fakes of the ports: `testing`;
//! 3. policy matching: `policy`;
//! 4. the engine: `engine`;
//! 5. the worker, holding requests behind a port: `worker`;
//! 6. host calls: `abi`;
//! 7. the worker's ports on the host: `adapters`;
//! 8. the proxy-wasm glue: `wasm`;
//! 9. this root.
//!
//! Inside `config` and `engine`, the same holds for their submodules (see their docs).
//!
//! * [`config`]: the JSON configuration, parsed strictly and validated.
//! * [`host`]: the ports the engine works through: request facts, metrics, callouts.
//! * [`policy`]: request → does a policy apply, the caller's key, the cost.
//! * [`engine`]: one decision across every matching policy, local and global, in two
//!   phases when the counter service is consulted; the response plan; the failure rule.
//! * [`due`]: requests a worker holds, ordered by when they are due.
//! * [`usage`]: the cost a response reports in its body, read as the body passes.
//! * `testing` (this crate's tests, and the `testing` feature its bench and integration
//!   tests turn on; never in `sluice.wasm`): fakes of the ports.
//! * `wasm` (wasm32 only): the proxy-wasm glue, and `abi`, the raw host calls wrapped so
//!   that no host status can panic the VM.
//!
//! The core is host-agnostic and tested natively; the glue is thin.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing))]
#![deny(missing_docs)]

pub mod config;
pub mod due;
pub mod engine;
pub mod host;
pub mod policy;
pub mod series;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
pub mod usage;
pub mod worker;

#[cfg(target_arch = "wasm32")]
mod abi;
#[cfg(target_arch = "wasm32")]
mod adapters;
#[cfg(target_arch = "wasm32")]
mod wasm;

pub use config::{Config, ConfigError};
pub use engine::{Begun, Decided, Disposition, Engine, LocalResponse, Outcome, Pending, Tally};
