//! Metrics: process-wide, with Envoy's rules per type.

use wasm_host::Histogram;

use crate::common::{forward, guest, ops, text};

#[test]
fn metrics_are_shared_by_workers_and_follow_envoys_rules() {
    let mut host = guest().workers(2).build().unwrap();

    let first = forward(host.worker(0), ops("metrics"));
    let second = forward(host.worker(1), ops("metrics").header("x-hist", "7"));

    assert_eq!(text(&first, "x-counter"), "1");
    assert_eq!(text(&second, "x-counter"), "2");
    assert_eq!(text(&second, "x-gauge"), "6");
    assert_eq!(text(&first, "x-counter-decrement"), "BadArgument");
    assert_eq!(text(&first, "x-histogram-get"), "2");
    assert_eq!(host.metric("test_guest.requests"), Some(2));
    assert_eq!(host.metric("test_guest.gauge"), Some(6));
    assert_eq!(host.histogram("test_guest.latency"), Some(Histogram { count: 2, sum: 49, values: vec![42, 7] }));
    assert_eq!(host.metric("no.such.metric"), None);
}
