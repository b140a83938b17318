//! Costs the response reports: an estimate spent at admission, settled when the response
//! headers or body say what the request really cost.

use super::*;
use crate::engine::MAX_OWING_REQUESTS;
use crate::testing::FakeResponse;
use crate::usage::{MAX_HELD_PER_WORKER, MAX_JSON_BODY};

fn policy(cost: &str, burst: u64) -> String {
    format!(
        r#"{{"policies": [{{"name": "tokens", "key": [{{"header": "x-user"}}], "rate": "60/minute",
        "burst": {burst}, "cost": {cost}}}]}}"#
    )
}

const BY_HEADER: &str = r#"{"response_header": "x-usage", "estimate": 10, "max": 1000}"#;
const BY_JSON: &str = r#"{"response_json": "usage.total_tokens", "estimate": 10, "max": 1000, "on_unknown": 50}"#;

fn usage(units: u64) -> FakeResponse {
    FakeResponse::default().with_header("x-usage", units.to_string())
}

fn admits(w: &TestWorker, id: u32) -> bool {
    let mut port = FakePort::default();
    w.on_request_headers(id, &user("a"), &mut port) == Flow::Continue
}

#[test]
fn a_response_header_above_the_estimate_charges_the_difference() {
    let w = worker(&policy(BY_HEADER, 100));
    assert!(admits(&w, 1));
    assert!(!w.on_response_headers(1, &usage(60), false), "the header says it all; no body to read");
    // 100 - 60 = 40 left: four more estimates of 10, whose responses never say.
    for id in 2..=5 {
        assert!(admits(&w, id), "request {id}");
        w.on_stream_end(id);
    }
    assert!(!admits(&w, 6));
    assert_eq!(counted(&w, Counter::CostCharged), 50);
    assert_eq!(counted(&w, Counter::CostUnknown), 4, "each unsettled stream is counted");
    assert_eq!(counted(&w, Counter::CostCredited), 0);
}

#[test]
fn a_response_header_below_the_estimate_gives_the_difference_back() {
    let w = worker(&policy(BY_HEADER, 100));
    assert!(admits(&w, 1));
    let _ = w.on_response_headers(1, &usage(2), false);
    // 98 left: nine more estimates of 10, then 8 is not enough.
    for id in 2..=10 {
        assert!(admits(&w, id), "request {id}");
    }
    assert!(!admits(&w, 11));
    assert_eq!(counted(&w, Counter::CostCredited), 8);
}

#[test]
fn a_cost_above_what_was_left_is_owed_and_the_caller_waits_exactly_until_it_is_paid() {
    let w = worker(&policy(BY_HEADER, 100));
    for id in 1..=10 {
        assert!(admits(&w, id));
    }
    // The bucket is empty; the first response says 5 000, clamped to max 1 000.
    let _ = w.on_response_headers(1, &usage(5000), false);
    assert_eq!(counted(&w, Counter::CostCharged), 990);
    let mut port = FakePort::default();
    assert_eq!(w.on_request_headers(11, &user("a"), &mut port), Flow::Pause);
    assert_eq!(port.actions, ["reply 429"]);
    // 990 owed plus the next estimate of 10, at one unit per second.
    assert_eq!(port.retry_after, [Some("1000".to_owned())]);
    assert!(!w.on_response_headers(11, &usage(10), false), "a rejected request owes nothing");
    w.limiter.clock().advance(Nanos::from_secs(999));
    assert!(!admits(&w, 12), "one second short");
    w.limiter.clock().advance(Nanos::from_secs(1));
    assert!(admits(&w, 13));
}

#[test]
fn beyond_the_debt_bound_what_a_response_reports_is_forgiven_and_counted() {
    let cost = r#"{"response_header": "x-usage", "estimate": 1, "max": 1000}"#;
    let w = worker(&policy(cost, 100));
    for id in 1..=100 {
        assert!(admits(&w, id));
    }
    for id in 1..=100 {
        let _ = w.on_response_headers(id, &usage(1000), false);
    }
    let bound = 1000 * MAX_OWING_REQUESTS;
    assert_eq!(counted(&w, Counter::CostCharged), i64::try_from(bound).unwrap());
    assert_eq!(counted(&w, Counter::CostForgiven), 100 * 999 - i64::try_from(bound).unwrap());
}

#[test]
fn a_json_body_is_read_as_it_passes_and_settled_when_it_ends() {
    let w = worker(&policy(BY_JSON, 100));
    let json = FakeResponse::default().with_header("content-type", "application/json");
    assert!(admits(&w, 1));
    assert!(w.on_response_headers(1, &json, true), "the body is to be read");
    assert!(w.reads_response_body(1));
    w.on_response_body(1, Some(br#"{"usage": {"prompt_tokens": 5, "#), false);
    assert_eq!(counted(&w, Counter::CostCharged), 0, "nothing is settled before the body ends");
    w.on_response_body(1, Some(br#""total_tokens": 30}}"#), true);
    assert_eq!(counted(&w, Counter::CostCharged), 20);
    assert!(!w.reads_response_body(1));
}

#[test]
fn a_json_usage_beyond_the_largest_count_is_charged_up_to_max_like_a_header_not_left_at_the_estimate() {
    let w = worker(&policy(BY_JSON, 100));
    let json = FakeResponse::default().with_header("content-type", "application/json");
    assert!(admits(&w, 1));
    assert!(w.on_response_headers(1, &json, true));
    w.on_response_body(1, Some(br#"{"usage": {"total_tokens": 99999999999999999999999}}"#), true);
    assert_eq!(counted(&w, Counter::CostUnknown), 0);
    assert_eq!(counted(&w, Counter::CostCharged), 990, "max 1 000 less the estimate of 10");
}

#[test]
fn an_event_stream_is_settled_by_the_usage_of_its_last_event() {
    let w = worker(&policy(BY_JSON, 100));
    let events = FakeResponse::default().with_header("content-type", "text/event-stream");
    assert!(admits(&w, 1));
    assert!(w.on_response_headers(1, &events, true));
    w.on_response_body(1, Some(b"data: {\"choices\":[{\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n"), false);
    w.on_response_body(1, Some(b"data: {\"choices\":[],\"usage\":{\"total_"), false);
    w.on_response_body(1, Some(b"tokens\":4}}\n\ndata: [DONE]\n\n"), false);
    w.on_response_body(1, Some(b""), true);
    assert_eq!(counted(&w, Counter::CostCredited), 6);
    assert_eq!(counted(&w, Counter::CostUnknown), 0);
}

#[test]
fn a_body_that_ends_with_trailers_is_settled_to_what_it_reported_when_they_arrive() {
    let w = worker(&policy(BY_JSON, 100));
    let json = FakeResponse::default().with_header("content-type", "application/json");
    let events = FakeResponse::default().with_header("content-type", "text/event-stream");
    assert!(admits(&w, 1));
    assert!(w.on_response_headers(1, &json, true));
    w.on_response_body(1, Some(br#"{"usage": {"total_tokens": 30}}"#), false);
    w.on_response_trailers(1);
    assert!(admits(&w, 2));
    assert!(w.on_response_headers(2, &events, true));
    w.on_response_body(2, Some(b"data: {\"usage\": {\"total_tokens\": 4}}"), false);
    w.on_response_trailers(2);
    w.on_stream_end(1);
    w.on_stream_end(2);
    assert_eq!(counted(&w, Counter::CostUnknown), 0);
    assert_eq!((counted(&w, Counter::CostCharged), counted(&w, Counter::CostCredited)), (20, 6));
}

#[test]
fn a_json_body_beyond_what_the_worker_can_hold_across_its_streams_has_no_cost_and_is_counted() {
    let w = worker(&policy(BY_JSON, 1000));
    let json = FakeResponse::default().with_header("content-type", "application/json");
    let document = br#"{"usage": {"total_tokens": 30}}"#;
    // Bodies just under the bound of one stream (leading white space is valid JSON),
    // on as many streams as the worker's bound holds.
    let part = vec![b' '; MAX_JSON_BODY - 64];
    let fit = MAX_HELD_PER_WORKER / part.len();
    let mut next = 0;
    let mut open = || {
        next += 1;
        assert!(admits(&w, next));
        assert!(w.on_response_headers(next, &json, true));
        w.on_response_body(next, Some(&part), false);
        next
    };
    let held: Vec<u32> = (0..fit).map(|_| open()).collect();

    let beyond = open();
    w.on_response_body(beyond, Some(document), true);

    assert_eq!(counted(&w, Counter::CostUnknown), 1, "no room was left for its body");
    assert_eq!(counted(&w, Counter::CostOverBudget), 1);
    assert_eq!(counted(&w, Counter::CostCharged), 40, "on_unknown (50) less the estimate");
    // The bodies held are read whole; once one has ended, a new one has room again.
    w.on_response_body(held[0], Some(document), true);
    assert_eq!(counted(&w, Counter::CostCharged), 40 + 20);
    let again = open();
    w.on_response_body(again, Some(document), true);
    assert_eq!(counted(&w, Counter::CostCharged), 40 + 20 + 20);
    assert_eq!((counted(&w, Counter::CostUnknown), counted(&w, Counter::CostOverBudget)), (1, 1));
    // A stream that ends cut short gives its room back too.
    for id in held.into_iter().skip(1) {
        w.on_stream_end(id);
    }
    assert_eq!(w.body_bytes_held(), 0);
}

#[test]
fn a_body_cut_short_or_lost_or_absent_settles_to_on_unknown_and_is_counted() {
    let w = worker(&policy(BY_JSON, 1000));
    let json = FakeResponse::default().with_header("content-type", "application/json");
    // The client leaves mid-body.
    assert!(admits(&w, 1));
    assert!(w.on_response_headers(1, &json, true));
    w.on_response_body(1, Some(br#"{"usage": {"total_tokens": 30}"#), false);
    w.on_stream_end(1);
    // The host will not give a chunk.
    assert!(admits(&w, 2));
    assert!(w.on_response_headers(2, &json, true));
    w.on_response_body(2, None, false);
    assert!(!w.reads_response_body(2), "settled at once");
    // A response without a body.
    assert!(admits(&w, 3));
    assert!(!w.on_response_headers(3, &json, false));
    // The upstream never answered.
    assert!(admits(&w, 4));
    w.on_stream_end(4);
    assert_eq!(counted(&w, Counter::CostUnknown), 4);
    assert_eq!(counted(&w, Counter::CostCharged), 4 * 40, "each settled to on_unknown (50) from 10");
}

#[test]
fn a_failed_header_read_reports_nothing_and_the_estimate_stands() {
    let w = worker(&policy(BY_HEADER, 100));
    assert!(admits(&w, 1));
    let _ = w.on_response_headers(1, &usage(60).failing("x-usage"), false);
    assert_eq!(counted(&w, Counter::CostUnknown), 1);
    assert_eq!(counted(&w, Counter::CostCharged), 0);
}

#[test]
fn a_cost_known_at_admission_reads_no_response_and_defines_no_cost_counters() {
    let w = worker(ONE);
    assert!(admits(&w, 1));
    let json = FakeResponse::default().with_header("content-type", "application/json");
    assert!(!w.on_response_headers(1, &json, true));
    assert!(!w.reads_response_body(1));
    let (policies, _) = metric_names(&w.engine);
    assert!(!policies[0].iter().flatten().any(|m| m.name.contains("_cost_")));
    let (policies, _) = metric_names(&worker(&policy(BY_JSON, 100)).engine);
    for counter in [Counter::CostUnknown, Counter::CostCharged, Counter::CostCredited, Counter::CostForgiven] {
        assert!(policies[0].iter().flatten().any(|m| m.name.ends_with(counter.series().family)), "{counter:?}");
    }
}
