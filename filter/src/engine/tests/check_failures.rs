//! Check-mode policies when the service misbehaves: the circuit breaker and its probe,
//! per-key answers, refused callouts, ended streams, failed reads, shaping, missing
//! secrets.
use super::check::*;
use crate::config::Config;
use crate::engine::*;
use crate::host::{CalloutAnswer, Counter, PluginCounter};
use crate::testing::{FakeCallouts, FakeRequest, RecordedMetrics, service_error};
use shared_store::Nanos;
use sluice_protocol::ErrorCode;

#[test]
fn after_repeated_failures_the_circuit_opens_and_no_callout_is_made_until_a_probe_closes_it() {
    let engine = engine(LAYERED);
    let (limiter, mut callouts, mut metrics) = (limiter(), FakeCallouts::default(), RecordedMetrics::default());
    let client =
        |i: u32| FakeRequest::get("/").with_header("x-client", format!("c{i}")).with_header("x-tenant", "acme");
    for i in 0..3 {
        let pending = waiting(begin(&engine, &client(i), &limiter, &mut callouts, &mut metrics));
        let _ =
            decided(engine.complete(pending, &CalloutAnswer::TimedOut, &limiter, &mut callouts, true, &mut metrics));
    }
    assert_eq!(metrics.plugin(PluginCounter::CircuitOpened), 1);

    let open = decided(begin(&engine, &client(10), &limiter, &mut callouts, &mut metrics));
    assert_eq!(callouts.sent.len(), 3, "no callout while the circuit is open");
    assert_eq!(
        header(response_headers(&open), "x-sluice-fallback"),
        Some("emergency; reason=circuit_open; policies=tenant")
    );
    assert_eq!(metrics.get(1, Counter::DegradedCircuitOpen), 1);

    limiter.clock().advance(Nanos::from_secs(1));
    let probe = waiting(begin(&engine, &client(11), &limiter, &mut callouts, &mut metrics));
    let during_probe = begin(&engine, &client(12), &limiter, &mut callouts, &mut metrics);
    assert!(matches!(during_probe, Begun::Decided(_)), "one probe at a time");
    let _ = decided(engine.complete(
        probe,
        &answer(true, &[entry("allowed", 5, 0)]),
        &limiter,
        &mut callouts,
        true,
        &mut metrics,
    ));

    let closed = begin(&engine, &client(13), &limiter, &mut callouts, &mut metrics);
    assert!(matches!(closed, Begun::Waiting(_)), "the probe's success closed the circuit");
    assert_eq!(callouts.sent.len(), 5);
}

#[test]
fn a_probe_whose_stream_ends_before_its_answer_lets_the_next_request_probe_at_once() {
    // The host cancels a stream's callout when the stream ends, so the probe's answer
    // never comes: the circuit must not stay half-open for the probe's whole window.
    let engine = engine(LAYERED);
    let (limiter, mut callouts, mut metrics) = (limiter(), FakeCallouts::default(), RecordedMetrics::default());
    let client =
        |i: u32| FakeRequest::get("/").with_header("x-client", format!("c{i}")).with_header("x-tenant", "acme");
    for i in 0..3 {
        let pending = waiting(begin(&engine, &client(i), &limiter, &mut callouts, &mut metrics));
        let _ =
            decided(engine.complete(pending, &CalloutAnswer::TimedOut, &limiter, &mut callouts, true, &mut metrics));
    }
    limiter.clock().advance(Nanos::from_secs(1));
    let probe = waiting(begin(&engine, &client(10), &limiter, &mut callouts, &mut metrics));
    let _ = decided(begin(&engine, &client(11), &limiter, &mut callouts, &mut metrics));

    engine.forget(probe, &limiter, &mut metrics);
    let next = begin(&engine, &client(12), &limiter, &mut callouts, &mut metrics);

    assert!(matches!(next, Begun::Waiting(_)), "the next request is the new probe");
    assert_eq!(callouts.sent.len(), 5);
}

#[test]
fn a_request_that_was_not_the_probe_leaves_the_probe_alone_when_its_stream_ends() {
    let engine = engine(&layered_each_alone());
    let (limiter, mut callouts, mut metrics) = (limiter(), FakeCallouts::default(), RecordedMetrics::default());
    let client =
        |i: u32| FakeRequest::get("/").with_header("x-client", format!("c{i}")).with_header("x-tenant", "acme");
    let before = waiting(begin(&engine, &client(0), &limiter, &mut callouts, &mut metrics));
    for i in 1..4 {
        let pending = waiting(begin(&engine, &client(i), &limiter, &mut callouts, &mut metrics));
        let _ =
            decided(engine.complete(pending, &CalloutAnswer::TimedOut, &limiter, &mut callouts, true, &mut metrics));
    }
    limiter.clock().advance(Nanos::from_secs(1));
    let _probe = waiting(begin(&engine, &client(10), &limiter, &mut callouts, &mut metrics));

    engine.forget(before, &limiter, &mut metrics);
    let next = begin(&engine, &client(12), &limiter, &mut callouts, &mut metrics);

    assert!(matches!(next, Begun::Decided(_)), "one probe at a time");
}

#[test]
fn answers_about_one_key_decide_their_request_by_its_rule_and_never_open_the_circuit() {
    let engine = engine(LAYERED);
    let (limiter, mut callouts, mut metrics) = (limiter(), FakeCallouts::default(), RecordedMetrics::default());
    let client =
        |i: u32| FakeRequest::get("/").with_header("x-client", format!("c{i}")).with_header("x-tenant", "acme");
    let full = (ErrorCode::StoreFull, "the memory store holds its maximum of 10 active keys");
    let too_many = (ErrorCode::TooManyEntries, "entries: 2 entries, at most 1 per check");
    for i in 0..6 {
        let (code, message) = if i % 2 == 0 { full } else { too_many };
        let pending = waiting(begin(&engine, &client(i), &limiter, &mut callouts, &mut metrics));
        let answer = CalloutAnswer::Response { status: code.status(), body: service_error(code, message) };
        let _ = decided(engine.complete(pending, &answer, &limiter, &mut callouts, true, &mut metrics));
    }

    let next = begin(&engine, &client(10), &limiter, &mut callouts, &mut metrics);

    assert_eq!(metrics.get(1, Counter::DegradedBadStatus), 6, "each took its policy's failure rule");
    assert_eq!(metrics.plugin(PluginCounter::CircuitOpened), 0);
    assert!(matches!(next, Begun::Waiting(_)), "the service is still asked");
}

#[test]
fn a_success_sent_before_the_circuit_opened_does_not_close_it() {
    let engine = engine(&layered_each_alone());
    let (limiter, mut callouts, mut metrics) = (limiter(), FakeCallouts::default(), RecordedMetrics::default());
    let client =
        |i: u32| FakeRequest::get("/").with_header("x-client", format!("c{i}")).with_header("x-tenant", "acme");
    let slow = waiting(begin(&engine, &client(0), &limiter, &mut callouts, &mut metrics));
    limiter.clock().advance(Nanos::from_millis(1));
    for i in 1..4 {
        let pending = waiting(begin(&engine, &client(i), &limiter, &mut callouts, &mut metrics));
        let _ =
            decided(engine.complete(pending, &CalloutAnswer::TimedOut, &limiter, &mut callouts, true, &mut metrics));
    }
    assert_eq!(metrics.plugin(PluginCounter::CircuitOpened), 1);

    // The call sent before the failures succeeds late.
    let _ = decided(engine.complete(
        slow,
        &answer(true, &[entry("allowed", 5, 0)]),
        &limiter,
        &mut callouts,
        true,
        &mut metrics,
    ));
    let next = decided(begin(&engine, &client(10), &limiter, &mut callouts, &mut metrics));

    assert_eq!(
        header(response_headers(&next), "x-sluice-fallback"),
        Some("emergency; reason=circuit_open; policies=tenant")
    );
}

#[test]
fn a_callout_the_proxy_refuses_to_send_is_decided_by_the_failure_rule_at_once() {
    let engine = engine(LAYERED);
    let (limiter, mut metrics) = (limiter(), RecordedMetrics::default());
    let mut callouts = FakeCallouts { refuse: Some(2), ..FakeCallouts::default() };

    let decided = decided(begin(&engine, &request(), &limiter, &mut callouts, &mut metrics));

    assert_eq!(status(&decided), 200);
    assert_eq!(
        header(response_headers(&decided), "x-sluice-fallback"),
        Some("emergency; reason=dispatch_failed; policies=tenant")
    );
    assert_eq!(metrics.get(1, Counter::DegradedDispatchFailed), 1);
}

#[test]
fn a_stream_that_ends_while_waiting_gives_its_local_spend_back() {
    let engine = engine(LAYERED);
    let (limiter, mut callouts, mut metrics) = (limiter(), FakeCallouts::default(), RecordedMetrics::default());
    for _ in 0..3 {
        let pending = waiting(begin(&engine, &request(), &limiter, &mut callouts, &mut metrics));
        engine.forget(pending, &limiter, &mut metrics);
    }

    let pending = waiting(begin(&engine, &request(), &limiter, &mut callouts, &mut metrics));

    assert!(pending.deadline() > Nanos::ZERO, "the window still had room: nothing stayed spent");
    assert_eq!(metrics.get(0, Counter::Abandoned), 3);
    assert_eq!(metrics.plugin(PluginCounter::Waiting), 1);
}

#[test]
fn a_header_the_host_fails_to_read_takes_on_failure_even_where_a_missing_one_is_skipped() {
    let engine = engine(
        r#"{"policies": [{"name": "k", "key": [{"header": "x-api-key"}], "rate": "1/minute", "burst": 1,
                          "on_missing_key": "skip"}]}"#,
    );
    let (limiter, mut callouts, mut metrics) = (limiter(), FakeCallouts::default(), RecordedMetrics::default());
    let failing = FakeRequest::get("/").failing("x-api-key");

    let decided = decided(begin(&engine, &failing, &limiter, &mut callouts, &mut metrics));

    assert_eq!(status(&decided), 503);
    assert_eq!(metrics.get(0, Counter::ReadFailures), 1);
    assert_eq!(metrics.get(0, Counter::FailureDenied), 1);
    assert_eq!(metrics.get(0, Counter::MissingKey), 0);
}

#[test]
fn a_property_the_host_fails_to_read_with_on_failure_allow_is_counted_and_forwarded() {
    let engine = engine(
        r#"{"policies": [{"name": "ip", "key": ["client_address"], "rate": "1/minute", "burst": 1,
                          "on_failure": {"action": "allow"}}]}"#,
    );
    let (limiter, mut callouts, mut metrics) = (limiter(), FakeCallouts::default(), RecordedMetrics::default());
    let failing = FakeRequest::get("/").failing("source.address");

    let decided = decided(begin(&engine, &failing, &limiter, &mut callouts, &mut metrics));

    assert_eq!(status(&decided), 200);
    assert_eq!(metrics.get(0, Counter::ReadFailures), 1);
    assert_eq!(metrics.get(0, Counter::FailureAllowed), 1);
}

#[test]
fn a_delay_from_a_global_leaky_bucket_holds_the_request() {
    let engine = engine(
        r#"{"counter_service": {"cluster": "counter", "hash_key_env": "HASH"},
            "policies": [{"name": "s", "key": [{"constant": "all"}], "algorithm": "leaky_bucket", "rate": "2/second",
                          "queue": 4, "max_wait": "2s", "global": {"strategy": "check"}}]}"#,
    );
    let (limiter, mut callouts, mut metrics) = (limiter(), FakeCallouts::default(), RecordedMetrics::default());
    let pending = waiting(begin(&engine, &request(), &limiter, &mut callouts, &mut metrics));
    let delayed = r#"{"admitted":true,"at_ns":1,"entries":[{"verdict":"delayed","limit":4,"remaining":2,
        "reset_after_ns":1000000000,"retry_after_ns":0,"delay_ns":500000000}]}"#;

    let decided = decided(engine.complete(
        pending,
        &CalloutAnswer::Response { status: 200, body: delayed.as_bytes().to_vec() },
        &limiter,
        &mut callouts,
        true,
        &mut metrics,
    ));

    let Outcome::Delay { due, .. } = decided.outcome else { panic!("expected a delay, got {:?}", decided.outcome) };
    assert_eq!(due, Nanos::from_secs(1000).saturating_add(Nanos::from_millis(500)));
}

#[test]
fn a_missing_environment_secret_refuses_the_configuration_without_showing_any_secret() {
    let config = Config::from_json(
        br#"{"counter_service": {"cluster": "c", "hash_key_env": "NOPE"},
             "policies": [{"name": "t", "key": [{"header": "x"}], "rate": "1/second", "global": {"strategy": "check"}}]}"#,
    )
    .unwrap();

    let error = Engine::new(config, "p/", SECRET, env).unwrap_err();

    assert_eq!(
        error.to_string(),
        "counter_service.hash_key_env: the VM has no environment variable \"NOPE\" (set it in vm_config.environment_variables)"
    );
    let engine = engine(LAYERED);
    let debug = format!("{engine:?}");
    assert!(!debug.contains("s3cret") && !debug.contains(HASH_KEY), "{debug}");
}
