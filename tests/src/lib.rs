//! Support for the end-to-end tests in `tests/tests/`: a real Envoy per test
//! ([`envoy`]), an HTTP/1.1 client that sends exact bytes ([`http`]), a small upstream
//! ([`upstream`]), an upstream that echoes the request head ([`echo`]), loopback servers
//! that misbehave on the wire in one chosen way ([`wire`]) or as a counter service can
//! ([`faults`]), a real `sluice-counter` ([`counter`]), and the deterministic simulation
//! of a fleet of proxies and the counter service under faults ([`fleet`]). The reference
//! bucket admissions are replayed through and Redis come from `sluice_testkit`.

pub mod counter;
pub mod deploy;
pub mod echo;
pub mod envoy;
pub mod faults;
pub mod fleet;
pub mod http;
pub mod upstream;
pub mod wire;
