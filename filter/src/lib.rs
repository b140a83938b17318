//! Sluice: a rate-limit filter for Envoy and Istio, compiled to `sluice.wasm`
//! (proxy-wasm ABI 0.2.1, `wasm32-wasip1`).
//!
//! # Layout
//!
//! * [`config`]: the JSON configuration, parsed strictly and validated.
//! * [`policy`]: request → does a policy apply, the caller's key, the cost.
//! * [`engine`]: one atomic decision across all matching policies, and the response plan.
//! * [`host`]: the port the engine reads requests through and reports metrics to, with
//!   fakes for tests.
//! * `wasm` (wasm32 only): the proxy-wasm glue, and `abi`, the raw host calls wrapped so
//!   that no host status can panic the VM.
//!
//! The core is host-agnostic and tested natively; the glue is thin.
#![cfg_attr(not(test), deny(clippy::unwrap_used, clippy::expect_used, clippy::panic, clippy::indexing_slicing))]
#![deny(missing_docs)]

pub mod config;
pub mod engine;
pub mod host;
pub mod policy;

#[cfg(target_arch = "wasm32")]
mod abi;
#[cfg(target_arch = "wasm32")]
mod wasm;

pub use config::{Config, ConfigError};
pub use engine::{Engine, LocalResponse, Outcome};
