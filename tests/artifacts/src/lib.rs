//! Paths of the wasm guests built for `wasm32-wasip1` by this crate's build script.
//!
//! Depend on this crate (as a dev-dependency) to test or benchmark a compiled module:
//! `cargo test` rebuilds the guests whenever their sources change.

include!(concat!(env!("OUT_DIR"), "/artifacts.rs"));
