//! What the workspace's tests share, so that each mechanism is written once: the
//! reference token bucket admissions are replayed through ([`bucket`]), a seeded
//! generator ([`rng`]), polling until something holds ([`wait`]), and behind features
//! the module-layer checker (`layers`), loopback peers (`peers`) and Redis (`redis`).
//!
//! # Layout
//!
//! Modules import only downwards (`layers::tests` checks it), from the bottom: `bucket`,
//! `rng` and `wait` (std only: they build for `wasm32-unknown-unknown`, where
//! shared-store's scenarios run); `layers`; `peers`; `redis`, which starts its servers on
//! the peers' free ports.
//!
//! Nothing here depends on a workspace crate: the reference bucket in particular is
//! independent of `shared-store`, the code it judges.

pub mod bucket;
pub mod rng;
pub mod wait;

#[cfg(feature = "layers")]
pub mod layers;
#[cfg(feature = "peers")]
pub mod peers;
#[cfg(feature = "redis")]
pub mod redis;
