//! Where sluice-counter's integration tests run: in one binary (one link, shared helpers).
//!
//! Tests that need Redis start their own `redis-server` instances on loopback ports
//! (see `support`), and fail loudly when it is not installed.

mod api;
mod auth;
mod bad_input;
mod batch;
mod behaviour;
mod binary;
mod clamps;
mod concurrency;
mod differential;
mod docs;
mod enforced;
mod faults;
mod handle_now;
mod layers;
mod load;
mod overrides;
mod protocols;
mod rls;
mod stores;
mod support;
