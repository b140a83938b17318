//! Global policies in wasm-host: scripted answers and faults on a virtual clock, for the
//! exact moments (the filter's own deadline when the host's timeout never fires, each
//! failure class); a real `sluice-counter` for one budget across several hosts; and the
//! glue's handling of host calls that fail.

use super::*;
use sluice::host::{Counter as Metric, PluginCounter, Reason};
use sluice_testkit::bucket::{ReferenceBucket, latency_slack};
use sluice_tests::counter::{self, Counter};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::Instant;
use wasm_host::{Answer, HostBuilder, Outcome};

const HASH_KEY: &str = "fleet-hash-key-0123456789abcdef";
const TOKEN: &str = "fleet-token-42";

fn config(on_failure: &str) -> String {
    format!(
        r#"{{"counter_service": {{"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY",
                                "token_env": "SLUICE_COUNTER_TOKEN", "timeout": "100ms",
                                "circuit_breaker": {{"failures": 3, "cooldown": "1s"}}}},
            "policies": [{{"name": "tenant", "key": [{{"header": "x-tenant"}}], "rate": "5/second", "burst": 30,
                           "global": {{"strategy": "check"}}, "on_failure": {on_failure}}}],
            "response": {{"fallback_header": "x-sluice-fallback"}}}}"#
    )
}

fn global(config: &str) -> HostBuilder {
    builder(config).env("SLUICE_HASH_KEY", HASH_KEY).env("SLUICE_COUNTER_TOKEN", TOKEN)
}

fn scripted(config: &str, answer: impl Fn() -> Answer + Send + Sync + 'static) -> HostBuilder {
    global(config).scripted_cluster("sluice-counter", move |_| answer())
}

fn tenant() -> Request {
    Request::get("/").header("x-tenant", "acme")
}

fn fallback(host: &mut Host, stream: wasm_host::StreamId) -> (u16, String) {
    match host.worker(0).outcome(stream).unwrap() {
        Outcome::Responded(response) => {
            (response.status, response.headers.get_str("x-sluice-fallback").unwrap_or("").to_owned())
        }
        Outcome::Forwarded(_) => (200, String::new()),
        other => panic!("expected an answer, got {other:?}"),
    }
}

const DENY: &str = r#"{"action": "deny"}"#;

#[test]
fn the_filter_ends_a_wait_at_its_own_deadline_when_the_host_never_times_out() {
    let mut host = scripted(&config(DENY), Answer::never).ignore_callout_timeouts().build().unwrap();
    let stream = host.worker(0).request(tenant());

    host.advance(millis(99));
    let before = host.worker(0).outcome(stream).unwrap().is_paused();
    // The deadline (100 ms), then at most one tick (a quarter of the timeout).
    host.advance(millis(26));

    assert!(before, "decided before the deadline");
    assert_eq!(fallback(&mut host, stream), (503, "fail_closed; reason=timeout; policies=tenant".to_owned()));
    assert_eq!(metric(&host, "tenant", Metric::DegradedTimeout), 1);
    assert_eq!(plugin_metric(&host, PluginCounter::Waiting), Some(0));
}

#[test]
fn each_failure_class_ends_in_the_failure_rule_when_it_happens() {
    /// (reason, what the service does, when the filter decides in ms).
    type Class = (Reason, fn() -> Answer, u64);
    let classes: Vec<Class> = vec![
        (Reason::Refused, Answer::refused, 0),
        (Reason::Reset, Answer::closed, 0),
        (Reason::Reset, Answer::not_http, 0),
        (Reason::Reset, || Answer::status(200).then_reset(), 0),
        (Reason::BadStatus, || Answer::status(500), 0),
        (Reason::BadBody, || Answer::status(200).body("garbage"), 0),
        (Reason::Unauthorized, || Answer::status(401).body(r#"{"error":{"code":"unauthorized","message":"no"}}"#), 0),
        (Reason::Timeout, Answer::never, 100),
        (Reason::Timeout, || Answer::status(200).after(millis(500)), 100),
    ];
    for (reason, answer, at_ms) in classes {
        let mut host = scripted(&config(DENY), answer).build().unwrap();
        let stream = host.worker(0).request(tenant());

        if at_ms > 0 {
            host.advance(millis(at_ms - 1));
            assert!(host.worker(0).outcome(stream).unwrap().is_paused(), "{reason:?}: decided early");
        }
        host.advance(millis(1));

        assert_eq!(
            fallback(&mut host, stream),
            (503, format!("fail_closed; reason={}; policies=tenant", reason.name())),
            "{reason:?}"
        );
        assert_eq!(metric(&host, "tenant", reason.counter()), 1, "{reason:?}");
        assert_accounting(&host, "tenant");
    }
}

/// Admits every check of a call, alone (`/v1/check`) or in a batch (`/v1/checks`),
/// 10 ms after it is sent.
fn admit_after_10ms(call: &wasm_host::CalloutRequest) -> Answer {
    let allowed = r#"{"admitted":true,"at_ns":1,"entries":[{"verdict":"allowed","limit":30,"remaining":29,
        "reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}]}"#;
    let body = if call.headers.get_str(":path") == Some("/v1/checks") {
        let checks: serde_json::Value = serde_json::from_slice(&call.body).unwrap();
        let n = checks["checks"].as_array().map_or(0, Vec::len);
        format!(r#"{{"results":[{}]}}"#, vec![allowed; n].join(","))
    } else {
        allowed.to_owned()
    };
    Answer::status(200).header("content-type", "application/json").body(body).after(millis(10))
}

#[test]
fn a_check_waiting_for_a_call_in_flight_is_sent_as_soon_as_that_call_answers_not_on_the_next_tick() {
    let config = config(DENY).replace(r#""timeout": "100ms""#, r#""timeout": "100ms", "max_checks_in_flight": 1"#);
    let mut host = global(&config).scripted_cluster("sluice-counter", admit_after_10ms).build().unwrap();
    let first = host.worker(0).request(tenant());
    host.advance(millis(1));
    let second = host.worker(0).request(tenant());
    assert_eq!(plugin_metric(&host, PluginCounter::Callouts), Some(1), "the second check waits");

    // The first answer comes at 10 ms; it wakes the root, which sends the second check,
    // answered at 20 ms. The tick (a quarter of the timeout) first runs at 25 ms.
    host.advance(millis(20));

    assert!(matches!(host.worker(0).outcome(first), Ok(Outcome::Forwarded(_))));
    assert!(matches!(host.worker(0).outcome(second), Ok(Outcome::Forwarded(_))), "sent only by the tick");
    assert_eq!(plugin_metric(&host, PluginCounter::Callouts), Some(2));
}

#[test]
fn a_check_waiting_behind_a_late_call_leaves_on_a_call_of_its_own_at_the_next_tick() {
    // The default: one check call in flight. The first call answers only after 90 ms of a
    // 100 ms timeout; the next ones after 10 ms.
    let calls = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let seen = calls.clone();
    let mut host = global(&config(DENY))
        .scripted_cluster("sluice-counter", move |call| {
            let answer = admit_after_10ms(call);
            if seen.fetch_add(1, std::sync::atomic::Ordering::Relaxed) == 0 { answer.after(millis(90)) } else { answer }
        })
        .build()
        .unwrap();
    let slow = host.worker(0).request(tenant());
    host.advance(millis(1));
    let behind = host.worker(0).request(tenant());

    // A quarter of the timeout (25 ms) makes the first call late; the tick then (at 25 ms)
    // sends the waiting check, answered 10 ms later.
    host.advance(millis(23));
    let waited_before_late = host.worker(0).outcome(behind).unwrap().is_paused();
    let callouts_before_late = plugin_metric(&host, PluginCounter::Callouts);
    host.advance(millis(12));

    assert!(waited_before_late, "a call that is not late holds the check back");
    assert_eq!(callouts_before_late, Some(1));
    assert!(matches!(host.worker(0).outcome(behind), Ok(Outcome::Forwarded(_))), "sent past the late call");
    assert_eq!(plugin_metric(&host, PluginCounter::Callouts), Some(2));
    assert_eq!(plugin_metric(&host, PluginCounter::CheckCallsPastLate), Some(1));
    assert!(host.worker(0).outcome(slow).unwrap().is_paused(), "the late call is still out");
    host.advance(millis(60));
    assert!(matches!(host.worker(0).outcome(slow), Ok(Outcome::Forwarded(_))), "and decides its own request");
    assert_eq!(metric(&host, "tenant", Metric::DegradedTimeout), 0);
}

#[test]
fn three_failures_open_the_circuit_and_a_probe_after_the_cooldown_closes_it() {
    let refusing = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(true));
    let flag = refusing.clone();
    let ok = r#"{"admitted":true,"at_ns":1,"entries":[{"verdict":"allowed","limit":30,"remaining":29,
        "reset_after_ns":200000000,"retry_after_ns":0,"delay_ns":0}]}"#;
    let mut host = global(&config(DENY))
        .scripted_cluster("sluice-counter", move |_| {
            if flag.load(std::sync::atomic::Ordering::Relaxed) {
                Answer::refused()
            } else {
                Answer::status(200).body(ok)
            }
        })
        .build()
        .unwrap();

    let during: Vec<u16> = (0..6).map(|_| status(&mut host, tenant())).collect();
    assert_eq!(during, [503; 6]);
    assert_eq!(host.callouts().len(), 3, "no callout once the circuit is open");
    refusing.store(false, std::sync::atomic::Ordering::Relaxed);
    host.advance(millis(999));
    assert_eq!(status(&mut host, tenant()), 503, "still open before the cooldown ends");
    host.advance(millis(1));
    let after: Vec<u16> = (0..3).map(|_| status(&mut host, tenant())).collect();

    assert_eq!(after, [200; 3]);
    assert_eq!(host.callouts().len(), 3 + 3);
    assert_eq!(plugin_metric(&host, PluginCounter::CircuitOpened), Some(1));
}

#[test]
fn several_hosts_with_several_workers_share_one_global_budget() {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let mut hosts: Vec<Host> = (0..3)
        .map(|_| {
            global(&config(DENY))
                .cluster("sluice-counter", service.addr())
                .workers(2)
                .log_level(wasm_host::LogLevel::Warn)
                .build()
                .unwrap()
        })
        .collect();
    let start = Instant::now();
    let seen = Mutex::new((BTreeMap::<u8, Vec<u64>>::new(), 0u64, 0u64));

    std::thread::scope(|scope| {
        for host in &mut hosts {
            for worker in host.workers_mut() {
                let seen = &seen;
                scope.spawn(move || {
                    let mut local = Vec::new();
                    for i in 0..200u32 {
                        let tenant = (i % 3) as u8;
                        let sent = start.elapsed();
                        let request = Request::get("/").header("x-tenant", format!("t{tenant}"));
                        let status = worker.exchange(request, Response::ok()).unwrap().status().unwrap();
                        local.push((tenant, status, sent, start.elapsed()));
                    }
                    let mut seen = seen.lock().unwrap();
                    for (tenant, status, sent, received) in local {
                        seen.1 = seen.1.max(u64::try_from((received - sent).as_nanos()).unwrap_or(u64::MAX));
                        seen.2 += u64::from(status == 503);
                        if status == 200 {
                            seen.0.entry(tenant).or_default().push(u64::try_from(received.as_nanos()).unwrap());
                        }
                    }
                });
            }
        }
    });

    let (mut admits, max_latency, failures) = seen.into_inner().unwrap();
    let slack = latency_slack(5, 1_000_000_000, max_latency);
    let over: u64 =
        admits.values_mut().map(|a| ReferenceBucket::new(5, 1_000_000_000, 30 + slack).over_admitted(a)).sum();
    let admitted: usize = admits.values().map(Vec::len).sum();
    eprintln!("3 hosts × 2 workers: {admitted} admitted, {failures} failed, longest round trip {max_latency} ns");
    assert_eq!(over, 0);
    assert_eq!(failures, 0);
    assert!(admitted >= 3 * 30, "every tenant spent its burst ({admitted})");
}

#[test]
fn a_local_reply_the_host_refuses_resets_the_stream_and_is_counted() {
    let config = r#"{"policies":[{"name":"p","key":[{"header":"x-k"}],"rate":"1/hour","burst":1}]}"#;
    let mut host = builder(config).fail_host_call("proxy_send_local_response", 2).build().unwrap();
    assert_eq!(status(&mut host, Request::get("/").header("x-k", "a")), 200);

    let stream = host.worker(0).request(Request::get("/").header("x-k", "a"));

    assert!(matches!(host.worker(0).outcome(stream).unwrap(), Outcome::Reset), "reset, not left paused");
    assert_eq!(plugin_metric(&host, PluginCounter::ReplyFailures), Some(1));
    assert_eq!(metric(&host, "p", Metric::Rejected), 1);
    assert_accounting(&host, "p");
}

#[test]
fn a_header_the_host_fails_to_read_takes_on_failure_even_under_skip() {
    let config = r#"{"policies":[{"name":"p","key":[{"header":"x-k"}],"rate":"1/hour","burst":1,
        "on_missing_key":"skip"}]}"#;
    let mut host = builder(config).fail_host_call("proxy_get_header_map_value", 2).build().unwrap();

    let statuses: Vec<u16> = (0..3).map(|_| status(&mut host, Request::get("/").header("x-k", "a"))).collect();

    assert_eq!(statuses, [503; 3], "never admitted silently");
    assert_eq!(metric(&host, "p", Metric::ReadFailures), 3);
    assert_eq!(metric(&host, "p", Metric::FailureDenied), 3);
}

#[test]
fn a_shaped_request_the_host_will_not_resume_is_counted_and_not_left_waiting() {
    let config = r#"{"policies":[{"name":"s","key":[{"constant":"x"}],"algorithm":"leaky_bucket",
        "rate":"10/second","queue":5,"max_wait":"1s"}]}"#;
    let mut host = builder(config).fail_host_call("proxy_continue_stream", 2).build().unwrap();
    let _first = host.worker(0).request(Request::get("/"));
    let _held = host.worker(0).request(Request::get("/"));

    host.advance(millis(200));

    assert_eq!(plugin_metric(&host, PluginCounter::ResumeFailures), Some(1));
    assert_eq!(metric(&host, "s", Metric::Queued), 0);
    assert_accounting(&host, "s");
}

#[test]
fn answers_about_one_key_never_open_the_circuit_for_everyone() {
    let full = r#"{"error":{"code":"store_full","message":"the memory store holds its maximum of 1000 active keys"}}"#;
    let mut host = scripted(&config(DENY), move || Answer::status(503).body(full)).build().unwrap();
    // Three failures open this configuration's circuit; ten answers about one key each.
    let statuses: Vec<u16> = (0..10).map(|_| status(&mut host, tenant())).collect();

    assert_eq!(statuses, [503; 10], "each took its policy's failure rule");
    assert_eq!(host.callouts().len(), 10, "every request still asked the service");
    assert_eq!(metric(&host, "tenant", Metric::DegradedCircuitOpen), 0);
    assert_eq!(plugin_metric(&host, PluginCounter::CircuitOpened).unwrap_or(0), 0);
}
