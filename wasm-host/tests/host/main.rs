//! wasm-host driven through the test guest (and a few inline WAT modules): what the host
//! observed for every host-call family, Envoy's semantics, callouts, traps,
//! reconfiguration, and `serve` end to end.

mod callouts;
mod common;
mod deferred;
mod faults;
mod headers;
mod layers;
mod lifecycle;
mod metrics;
mod properties;
mod queues;
mod reconfigure;
mod serve;
mod shared_data;
mod traps;
mod wasi;
mod wat;
