//! What the integration tests share: Redis servers and clusters they start themselves
//! ([`servers`], on `sluice_testkit::redis`), stores and plans ([`stores`]), scenario
//! targets ([`served`]), an HTTP client ([`http`]), free ports and polling (from
//! `sluice_testkit`), and the lock that keeps the heavy tests apart.
//!
//! Every `redis-server` runs on a free loopback port, in its own temporary directory,
//! with persistence off, under a small shell watchdog that kills it when the test
//! process exits (so even a server kept in a `static` never outlives the tests). Guards
//! kill their server when dropped. A missing `redis-server` is a loud failure, never a
//! skip: CI installs Debian's `redis-server` package. Every Redis test ends with the
//! hygiene check, [`RedisServer::assert_every_key_has_a_ttl`].

#![allow(dead_code)]

mod http;
mod served;
mod servers;
mod stores;

pub use http::*;
pub use served::*;
pub use servers::*;
pub use stores::*;

pub use sluice_testkit::peers::free_port;
pub use sluice_testkit::wait::until as wait_until;

/// The load and fault tests take this exclusively (`HEAVY.write()`): each loads both
/// cores, and their latency bounds assume nothing else in this binary runs beside them.
/// Other tests that start Redis take it shared (`HEAVY.read()`).
pub static HEAVY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());
