//! Support for the end-to-end tests in `tests/tests/`: a real Envoy per test
//! ([`envoy`]), an HTTP/1.1 client that sends exact bytes ([`http`]), a small upstream
//! ([`upstream`]), an upstream that holds requests and counts how many it holds at once
//! ([`slow`]), an upstream that echoes the request head ([`echo`]), a language-model-like
//! upstream that reports token usage in JSON or an event stream ([`llm`]), an HTTP/2
//! upstream whose answers end with trailers ([`h2`]), a real
//! `sluice-counter` ([`counter`]), a real Prometheus scraping them ([`prometheus`]), and the deterministic simulation of a fleet of proxies
//! and the counter service under faults ([`fleet`]). What other crates' tests also use
//! comes from `sluice_testkit`: the reference bucket admissions are replayed through,
//! Redis, and loopback peers that misbehave on the wire in one chosen way.

pub mod counter;
pub mod deploy;
pub mod echo;
pub mod envoy;
pub mod fleet;
pub mod h2;
pub mod http;
pub mod llm;
pub mod prometheus;
pub mod slow;
pub mod upstream;
