//! Shaping: delayed requests are paused and released by the root context's tick; the
//! queue is bounded in depth and wait; streams that end while paused are cleaned up.

use super::*;
use sluice::host::Counter;
use wasm_host::{Outcome, StreamId};

const SHAPED: &str = r#"{"policies":[{"name":"shaper","key":[{"constant":"x"}],"algorithm":"leaky_bucket",
  "rate":"2/second","queue":3,"max_wait":"1s"}],"shaping":{"tick_ms":10}}"#;

fn forwarded(host: &mut Host, stream: StreamId) -> bool {
    matches!(host.worker(0).outcome(stream).unwrap(), Outcome::Forwarded(_))
}

fn paused(host: &mut Host, stream: StreamId) -> bool {
    host.worker(0).outcome(stream).unwrap().is_paused()
}

#[test]
fn delayed_requests_are_released_at_the_shaping_rate_and_never_early() {
    let mut host = host(SHAPED);
    let streams: Vec<StreamId> = (0..3).map(|_| host.worker(0).request(Request::get("/"))).collect();

    let at_start = (forwarded(&mut host, streams[0]), paused(&mut host, streams[1]), paused(&mut host, streams[2]));
    host.advance(millis(499));
    let before_turn = paused(&mut host, streams[1]);
    host.advance(millis(11));
    let after_turn = (forwarded(&mut host, streams[1]), paused(&mut host, streams[2]));
    host.advance(millis(500));
    let third = forwarded(&mut host, streams[2]);

    assert_eq!(at_start, (true, true, true));
    assert!(before_turn);
    assert_eq!(after_turn, (true, true));
    assert!(third);
    assert_eq!(metric(&host, "shaper", Counter::Queued), 0);
    assert_eq!(metric(&host, "shaper", Counter::Allowed), 3);
    assert_accounting(&host, "shaper");
}

#[test]
fn a_full_queue_rejects_with_the_time_until_there_is_room() {
    let mut host = host(SHAPED);
    let _streams: Vec<StreamId> = (0..3).map(|_| host.worker(0).request(Request::get("/"))).collect();

    let rejected = send(&mut host, Request::get("/"));

    assert_eq!(rejected.status(), Some(429));
    assert_eq!(rejected.header_str("retry-after"), Some("1"));
    assert_eq!(metric(&host, "shaper", Counter::Queued), 2);
    assert_eq!(metric(&host, "shaper", Counter::Rejected), 1);
    assert_accounting(&host, "shaper");
}

#[test]
fn no_request_waits_longer_than_max_wait() {
    let mut host = host(
        r#"{"policies":[{"name":"shaper","key":[{"constant":"x"}],"algorithm":"leaky_bucket",
        "rate":"10/second","queue":100,"max_wait":"300ms"}]}"#,
    );

    let streams: Vec<StreamId> = (0..10).map(|_| host.worker(0).request(Request::get("/"))).collect();
    let waiting = streams.iter().filter(|s| paused(&mut host, **s)).count();
    let answered: Vec<u16> =
        streams.iter().filter_map(|s| host.worker(0).outcome(*s).unwrap().response().map(|r| r.status)).collect();
    host.advance(millis(300));
    let still_waiting = streams.iter().filter(|s| paused(&mut host, **s)).count();

    // Delays of 0, 100, 200, 300 ms fit; the other six would wait longer.
    assert_eq!(waiting, 3);
    assert_eq!(answered, vec![429; 6]);
    assert_eq!(still_waiting, 0);
}

#[test]
fn a_stream_that_ends_while_paused_is_cleaned_up_and_counted() {
    let mut host = host(SHAPED);
    let streams: Vec<StreamId> = (0..3).map(|_| host.worker(0).request(Request::get("/"))).collect();

    host.worker(0).finish(streams[1]).unwrap();
    host.advance(secs(2));

    assert!(forwarded(&mut host, streams[2]));
    assert_eq!(metric(&host, "shaper", Counter::Abandoned), 1);
    assert_eq!(metric(&host, "shaper", Counter::Queued), 0);
    assert_eq!(metric(&host, "shaper", Counter::Allowed), 3);
    assert_accounting(&host, "shaper");
    assert!(host.traps().is_empty());
}

#[test]
fn a_worker_holds_no_more_paused_requests_than_configured() {
    let mut host = host(
        r#"{"policies":[{"name":"shaper","key":[{"constant":"x"}],"algorithm":"leaky_bucket",
        "rate":"1/second","queue":100,"max_wait":"5m"}],"shaping":{"max_paused":4}}"#,
    );

    let streams: Vec<StreamId> = (0..10).map(|_| host.worker(0).request(Request::get("/"))).collect();

    let waiting = streams.iter().filter(|s| paused(&mut host, **s)).count();
    assert_eq!(waiting, 4);
    assert_eq!(metric(&host, "shaper", Counter::Rejected), 5);
    assert_accounting(&host, "shaper");
}

#[test]
fn the_shaped_endpoint_example_paces_exports_and_leaves_other_paths_alone() {
    let mut host = host(include_str!("../../../examples/shaped-endpoint.json"));

    let exports: Vec<StreamId> = (0..5).map(|_| host.worker(0).request(Request::get("/export/all"))).collect();
    let other = status(&mut host, Request::get("/items"));
    let held = exports.iter().filter(|s| paused(&mut host, **s)).count();
    host.advance(millis(800));

    assert_eq!(other, 200);
    assert_eq!(held, 4);
    assert!(exports.iter().all(|s| forwarded(&mut host, *s)));
}
