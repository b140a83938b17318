//! `sluice.wasm` (the release build) in the official Envoy release (V8): what the
//! project claims about the filter, checked in the reference host. Each test starts its
//! own Envoy (see `sluice_tests::envoy`).

mod accuracy;
mod callouts;
mod concurrency;
mod configs;
mod contract;
mod costs;
mod differential;
mod global;
mod hostile;
mod lease;
mod memory;
mod overrides;
mod prometheus;
mod reconfigure;
mod rls;
mod shaping;
mod shared_data;

use sluice_tests::envoy::{Envoy, sluice};
use sluice_tests::http::{Request, Response};

/// Sends `request` on a fresh connection.
pub fn send(envoy: &Envoy, request: &Request) -> Response {
    envoy.send(request)
}
