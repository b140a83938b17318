//! Concurrency policies: slots shared by the workers of a proxy, given back when a
//! stream ends or another policy rejects, and freed within the stale bound when a
//! worker dies holding them.

use super::*;
use shared_store::{RENEW_EVERY, STALE_AFTER};
use std::sync::Arc;

type SharedWorker = Worker<Arc<MemoryStore>, ManualClock, RecordedMetrics>;

/// Two workers of one proxy: one store, one clock, two holders.
fn workers(json: &str) -> (SharedWorker, SharedWorker, ManualClock) {
    let store = Arc::new(MemoryStore::new());
    let clock = ManualClock::at(Nanos::from_secs(100));
    let make = |holder: u64| {
        let engine =
            Engine::new(Config::from_json(json.as_bytes()).unwrap(), "sluice/w/", HashKey::new([3; 16]), |_| None)
                .unwrap();
        let limiter = Limiter::new(store.clone(), clock.clone()).with_holder(holder);
        Worker::new(engine, limiter, RecordedMetrics::default(), None)
    };
    (make(1), make(2), clock)
}

const TWO_IN_FLIGHT: &str = r#"{"policies": [{"name": "in-flight", "key": [{"constant": "all"}],
    "algorithm": "concurrency", "limit": 2}],
    "response": {"headers_on_rejected": ["retry_after", "ratelimit"]}}"#;

fn admits(w: &SharedWorker, id: u32, request: &FakeRequest) -> bool {
    w.on_request_headers(id, request, &mut FakePort::default()) == Flow::Continue
}

#[test]
fn requests_in_flight_across_workers_never_exceed_the_limit_and_a_rejection_has_no_retry_after() {
    let (a, b, _) = workers(TWO_IN_FLIGHT);
    let request = FakeRequest::get("/");

    let first = admits(&a, 1, &request);
    let second = admits(&b, 1, &request);
    let mut port = FakePort::default();
    let third = a.on_request_headers(2, &request, &mut port);

    assert!(first && second);
    assert_eq!(third, Flow::Pause);
    assert_eq!(port.actions, ["reply 429"]);
    assert_eq!(port.retry_after, [None], "no honest time to give");
    let m = a.metrics().unwrap();
    assert_eq!((m.get(0, Counter::Offered), m.get(0, Counter::Allowed), m.get(0, Counter::Rejected)), (2, 1, 1));
    assert_eq!(m.get(0, Counter::OverLimit), 1);
}

#[test]
fn a_stream_that_ends_gives_its_slot_back_to_any_worker() {
    let (a, b, _) = workers(TWO_IN_FLIGHT);
    let request = FakeRequest::get("/");
    assert!(admits(&a, 1, &request) && admits(&a, 2, &request));
    assert!(!admits(&b, 1, &request));

    a.on_stream_end(2);

    assert!(admits(&b, 2, &request));
    assert!(!admits(&b, 3, &request));
}

#[test]
fn a_worker_that_dies_holding_slots_frees_them_within_the_stale_bound_while_a_live_one_keeps_its_own() {
    let (dead, live, clock) = workers(TWO_IN_FLIGHT);
    let request = FakeRequest::get("/");
    assert!(admits(&dead, 1, &request));
    assert!(admits(&live, 1, &request));
    drop(dead); // its VM is gone: no stream end, no renewal

    let mut waited = Nanos::ZERO;
    let mut id = 2;
    while !admits(&live, id, &request) {
        assert!(waited <= STALE_AFTER, "still held after {waited:?}");
        clock.advance(RENEW_EVERY);
        waited = waited.saturating_add(RENEW_EVERY);
        live.on_tick(&mut FakePort::default());
        id += 1;
    }

    assert_eq!(waited, STALE_AFTER, "freed exactly at the bound, not before");
    assert!(!admits(&live, id + 1, &request), "the live worker's two slots still count");
}

#[test]
fn a_request_another_policy_rejects_gives_its_slot_back() {
    let json = r#"{"policies": [
        {"name": "in-flight", "key": [{"constant": "all"}], "algorithm": "concurrency", "limit": 1},
        {"name": "per-user", "key": [{"header": "x-user"}], "rate": "1/minute", "burst": 1}]}"#;
    let (a, _, _) = workers(json);
    assert!(admits(&a, 1, &user("a")));
    a.on_stream_end(1);

    let spent = admits(&a, 2, &user("a"));
    let other = admits(&a, 3, &user("b"));

    assert!(!spent, "user a's bucket is empty");
    assert!(other, "the slot user a's rejected request took was given back");
}

#[test]
fn a_shaped_request_holds_its_slot_while_it_waits_and_gives_it_back_when_its_stream_ends() {
    let json = r#"{"policies": [
        {"name": "in-flight", "key": [{"constant": "all"}], "algorithm": "concurrency", "limit": 1},
        {"name": "shaped", "key": [{"constant": "x"}], "algorithm": "leaky_bucket", "rate": "1/second",
         "queue": 3, "max_wait": "5s"}]}"#;
    let (a, _, _) = workers(json);
    let request = FakeRequest::get("/");
    assert!(admits(&a, 1, &request));
    a.on_stream_end(1);
    assert_eq!(a.on_request_headers(2, &request, &mut FakePort::default()), Flow::Pause, "shaped");

    let mut held = FakePort::default();
    let _ = a.on_request_headers(3, &request, &mut held);
    a.on_stream_end(2);
    let mut freed = FakePort::default();
    let after = a.on_request_headers(4, &request, &mut freed);

    assert_eq!(held.actions, ["reply 429"], "the shaped request holds the only slot");
    assert_eq!(after, Flow::Pause);
    assert!(freed.actions.is_empty(), "admitted by the slot, then shaped: {:?}", freed.actions);
}

#[test]
fn a_request_rejected_after_its_slot_was_taken_gives_it_back() {
    let json = r#"{"policies": [
        {"name": "in-flight", "key": [{"constant": "all"}], "algorithm": "concurrency", "limit": 2},
        {"name": "shaped", "key": [{"constant": "x"}], "match": {"path_prefix": "/slow"},
         "algorithm": "leaky_bucket", "rate": "1/second", "queue": 3, "max_wait": "5s"}],
        "shaping": {"max_paused": 1}}"#;
    let (a, _, _) = workers(json);
    let slow = FakeRequest::get("/slow");
    assert!(admits(&a, 1, &slow));
    assert_eq!(a.on_request_headers(2, &slow, &mut FakePort::default()), Flow::Pause, "shaped, holding a slot");
    a.on_stream_end(1);

    let mut port = FakePort::default();
    let _ = a.on_request_headers(3, &slow, &mut port);
    let fast = admits(&a, 4, &FakeRequest::get("/"));

    assert_eq!(port.actions, ["reply 429"], "no room to hold a third shaped request");
    assert!(fast, "the rejected request's slot was given back");
}
