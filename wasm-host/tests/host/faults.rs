//! Scripted faults of the host itself: host calls that fail, and callout timeouts that
//! never fire, for testing how a guest survives a host that misbehaves.

use std::time::Duration;

use wasm_host::Answer;

use crate::common::{forward, guest, ops, text};

#[test]
fn a_failing_host_call_answers_its_status_to_the_guest() {
    let mut host = guest().fail_host_call("proxy_get_header_map_size", 10).build().unwrap();
    let mut healthy = guest().build().unwrap();

    let failed = forward(host.worker(0), ops("header-size"));
    let normal = forward(healthy.worker(0), ops("header-size"));

    // The guest's other host calls (it read its operation from a header) still work.
    assert_eq!(text(&failed, "x-header-size"), "10:0");
    assert_eq!(text(&normal, "x-header-size").split(':').next(), Some("0"));
}

#[test]
fn with_timeouts_ignored_a_never_answered_callout_stays_pending_past_its_timeout() {
    let mut host = guest().scripted_cluster("upstream", |_| Answer::never()).ignore_callout_timeouts().build().unwrap();
    let stream = host.worker(0).request(ops("callout").header("x-cluster", "upstream").header("x-timeout-ms", "100"));

    host.advance(Duration::from_secs(60));

    assert!(host.worker(0).outcome(stream).unwrap().is_paused());
}
