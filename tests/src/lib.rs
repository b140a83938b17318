//! Support for the end-to-end tests in `tests/tests/`: a real Envoy per test
//! ([`envoy`]), an HTTP/1.1 client that sends exact bytes ([`http`]), a small upstream
//! ([`upstream`]), a real `sluice-counter` ([`counter`]) and misbehaving peers
//! ([`faults`]), and the reference bucket admissions are replayed through ([`oracle`]).

pub mod counter;
pub mod deploy;
pub mod envoy;
pub mod faults;
pub mod http;
pub mod oracle;
pub mod upstream;
