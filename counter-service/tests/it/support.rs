//! What the integration tests share: Redis servers and clusters they start themselves
//! ([`servers`]), stores and plans ([`stores`]), scenario targets ([`served`]), an HTTP
//! client ([`http`]), and the lock that keeps the heavy tests apart.
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

use std::time::{Duration, Instant};

pub use http::*;
pub use served::*;
pub use servers::*;
pub use stores::*;

/// Polls `ready` every 20 ms until it holds or `within` passes.
pub fn wait_until(within: Duration, what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !ready() {
        assert!(Instant::now() < deadline, "timed out after {within:?} waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A free loopback port (bound then released; good enough for tests).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port")
}

/// The load and fault tests take this exclusively (`HEAVY.write()`): each loads both
/// cores, and their latency bounds assume nothing else in this binary runs beside them.
/// Other tests that start Redis take it shared (`HEAVY.read()`).
pub static HEAVY: tokio::sync::RwLock<()> = tokio::sync::RwLock::const_new(());
