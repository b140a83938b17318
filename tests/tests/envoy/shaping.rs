//! Shaping in Envoy: requests held and released by the tick at the right times (never
//! early), `max_paused` per worker, and a client that leaves while held is counted as
//! abandoned, its stream cleaned up.

use super::*;
use sluice::host::Counter;
use sluice_tests::http::Connection;
use std::time::{Duration, Instant};

const SHAPED: &str = r#"{"policies":[{"name":"shaper","key":[{"constant":"x"}],"algorithm":"leaky_bucket",
  "rate":"2/second","queue":3,"max_wait":"2s"}],"shaping":{"tick_ms":10}}"#;

/// Sends `n` requests in order, 20 ms apart or more, each on its own connection; returns
/// each one's status and when its answer came, counted from when the first was sent.
fn burst(envoy: &Envoy, n: usize) -> Vec<(u16, Duration)> {
    let mut connections: Vec<Connection> = (0..n).map(|_| envoy.connect()).collect();
    let first = Instant::now();
    for c in &mut connections {
        c.write(&Request::get("/").encode()).unwrap();
        // In order: the shaper's turns follow arrival.
        std::thread::sleep(Duration::from_millis(20));
    }
    connections.iter_mut().map(|c| (c.read().unwrap().status, first.elapsed())).collect()
}

#[test]
fn held_requests_leave_at_the_shaping_rate_and_never_early() {
    let envoy = Envoy::with_sluice(SHAPED, 1);

    let results = burst(&envoy, 5);

    let statuses: Vec<u16> = results.iter().map(|(s, _)| *s).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429], "a queue of 3: one leaving now and two waiting");
    // Turns are 500 ms apart from the first decision, which came after the first request
    // was sent: turn i is never before 500 ms × i from then, however late the sends were.
    for (i, (_, answered)) in results.iter().enumerate().take(3) {
        let turn = Duration::from_millis(500 * i as u64);
        assert!(*answered + Duration::from_millis(5) >= turn, "request {i} left after {answered:?}, before {turn:?}");
        assert!(
            *answered <= turn + Duration::from_millis(400),
            "request {i} left at {answered:?} for a turn at {turn:?}"
        );
    }
    assert_eq!(envoy.metric("shaper", Counter::Queued), 0);
    assert_eq!(envoy.metric("shaper", Counter::Allowed), 3);
    assert_eq!(envoy.metric("shaper", Counter::Offered), 5);
}

#[test]
fn a_worker_holds_at_most_max_paused_requests() {
    let config = SHAPED.replace(r#""tick_ms":10"#, r#""tick_ms":10,"max_paused":1"#);
    let envoy = Envoy::with_sluice(&config, 1);

    let statuses: Vec<u16> = burst(&envoy, 3).into_iter().map(|(s, _)| s).collect();

    // The checked budget refills slowly (100 an hour): the token the rejected request
    // spent is still missing when its credit arrives, however late. At 100 a second it
    // came back within 10 ms, and a credit delayed by a loaded machine found the bucket
    // full and credited nothing.
    assert_eq!(statuses, [200, 200, 429], "one held, the next rejected");
}

#[test]
fn a_client_that_leaves_while_held_is_counted_as_abandoned_and_its_stream_is_freed() {
    let envoy = Envoy::with_sluice(SHAPED, 1);
    assert_eq!(send(&envoy, &Request::get("/")).status, 200);
    let mut held = envoy.connect();
    held.write(&Request::get("/").encode()).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(envoy.metric("shaper", Counter::Queued), 1);

    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while envoy.metric("shaper", Counter::Abandoned) == 0 {
        assert!(Instant::now() < deadline, "the abandoned request was never counted");
        std::thread::sleep(Duration::from_millis(20));
    }

    assert_eq!(envoy.metric("shaper", Counter::Queued), 0);
    let stats = envoy.stats();
    assert_eq!(stats.get("http.ingress_http.downstream_rq_active"), Some(&0), "no stream left behind");
    // Its place in the queue stays spent: the next request waits its turn.
    let (status, _) = burst(&envoy, 1)[0];
    assert_eq!(status, 200);
}

#[test]
fn a_request_rejected_for_want_of_room_to_hold_it_has_its_check_spend_credited_back() {
    const TOKEN: &str = "shaping-token-42";
    let service = sluice_tests::counter::Counter::start(sluice_tests::counter::with_token(
        sluice_tests::counter::memory(),
        TOKEN,
    ));
    let config = r#"{"counter_service": {"cluster": "sluice-counter", "hash_key_env": "H", "token_env": "T",
        "timeout": "1s"},
      "policies": [
        {"name": "checked", "key": [{"constant": "x"}], "rate": "100/hour", "burst": 100,
         "global": {"strategy": "check"}},
        {"name": "shaper", "key": [{"constant": "x"}], "algorithm": "leaky_bucket", "rate": "2/second",
         "queue": 3, "max_wait": "2s"}],
      "shaping": {"tick_ms": 10, "max_paused": 1}}"#;
    let filter = sluice(config).env("H", "shaping-hash-key-0123456789abcdef").env("T", TOKEN);
    let envoy = Envoy::builder()
        .workers(1)
        .cluster(sluice_tests::envoy::cluster("sluice-counter", service.addr(), true))
        .sluice(filter)
        .log_level("warning")
        .start()
        .unwrap_or_else(|e| panic!("{e}"));

    let statuses: Vec<u16> = burst(&envoy, 3).into_iter().map(|(s, _)| s).collect();

    assert_eq!(statuses, [200, 200, 429], "one held, the next rejected");
    sluice_testkit::wait::until(Duration::from_secs(10), "the rejected request's check spend to be credited", || {
        service.metric("sluice_counter_credited_tokens_total") == 1
    });
    assert_eq!(envoy.metric("checked", Counter::Unrefunded), 0);
}
