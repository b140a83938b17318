//! Costs the response reports, on a global policy in check mode: the service spent the
//! estimate, and the root context settles it there once the response has said (a
//! charge of the excess, a credit of what was unused), with an id, until it is applied
//! or forgiven.

use super::*;
use crate::testing::FakeResponse;
use crate::testing::service_error;
use sluice_protocol::ErrorCode;

const CHECKED_TOKENS: &str = r#"{"counter_service": {"cluster": "counter", "hash_key_env": "K", "timeout": "40ms",
    "circuit_breaker": {"failures": 1000}},
    "policies": [{"name": "tokens", "key": [{"header": "x-user"}], "algorithm": "fixed_window", "limit": 1000,
    "window": "1m", "global": {"strategy": "check"},
    "cost": {"response_header": "x-usage", "estimate": 10, "max": 500}}]}"#;

/// When the service spent the estimates (its own clock).
const SPENT_AT_NS: u64 = 1_750_000_000_123_456_789;

fn ok(body: String) -> CalloutAnswer {
    CalloutAnswer::Response { status: 200, body: body.into_bytes() }
}

const ENTRY: &str =
    r#"{"verdict":"allowed","limit":1000,"remaining":900,"reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}"#;

/// Admits stream `id` through its check, and has its response report `usage`.
fn served(w: &TestWorker, id: u32, usage: u64) {
    let mut port = FakePort::default();
    assert_eq!(w.on_request_headers(id, &user("a"), &mut port), Flow::Pause);
    assert_eq!(port.sent, ["/v1/check"]);
    let body = format!(r#"{{"admitted":true,"at_ns":{SPENT_AT_NS},"entries":[{ENTRY}]}}"#);
    w.on_check_answer(id, &ok(body), &mut port);
    assert!(port.actions.contains(&"resume".to_owned()), "{:?}", port.actions);
    let _ = w.on_response_headers(id, &FakeResponse::default().with_header("x-usage", usage.to_string()), false);
}

/// The root's tick: what it sent, as (path, body).
fn tick(w: &TestWorker) -> (Vec<(String, serde_json::Value)>, FakePort) {
    let mut port = FakePort::default();
    w.on_tick(&mut port);
    let sent = port.sent.iter().zip(&port.bodies).map(|(p, b)| (p.clone(), serde_json::from_str(b).unwrap())).collect();
    (sent, port)
}

fn charged(units: u64) -> CalloutAnswer {
    ok(format!(r#"{{"charged":{units},"forgiven":0,"at_ns":1,"entry":{ENTRY}}}"#))
}

fn credited(units: u64) -> CalloutAnswer {
    ok(format!(r#"{{"credited":{units},"forgiven":0,"at_ns":1,"entry":{ENTRY}}}"#))
}

#[test]
fn a_cost_above_the_estimate_is_charged_at_the_service_with_an_id_and_counted_when_it_answers() {
    let w = worker(CHECKED_TOKENS);
    served(&w, 1, 60);
    assert_eq!(counted(&w, Counter::CostCharged), 0, "counted when the service has charged it");

    let mut woken = FakePort::default();
    w.after_response(&mut woken);
    assert_eq!(woken.actions, ["wake 7"], "the root is woken to send it at once");
    let (sent, mut port) = tick(&w);

    assert_eq!(sent.len(), 1, "{sent:?}");
    let (path, body) = &sent[0];
    assert_eq!(path, "/v1/charge");
    assert_eq!(body["cost"], 50);
    assert_eq!(body["max_debt"], 1000, "the debt bound (64 × max), within the capacity");
    assert_eq!(body["limit"]["algorithm"], "fixed_window");
    assert!(body["charge_id"].as_str().is_some_and(|id| !id.is_empty()));
    w.on_root_answer(port.next_token, &charged(50), &mut port);
    assert_eq!(counted(&w, Counter::CostCharged), 50);
    assert_eq!(counted(&w, Counter::CostForgiven), 0);
    assert!(tick(&w).0.is_empty(), "settled once");
}

#[test]
fn a_cost_below_the_estimate_is_credited_in_the_window_the_check_spent_it_in() {
    let w = worker(CHECKED_TOKENS);
    served(&w, 1, 4);
    served(&w, 2, 10);

    let (sent, mut port) = tick(&w);

    assert_eq!(sent.len(), 1, "an exact estimate has nothing to settle: {sent:?}");
    let (path, body) = &sent[0];
    assert_eq!(path, "/v1/credit");
    assert_eq!((body["units"].as_u64(), body["spent_at_ns"].as_u64()), (Some(6), Some(SPENT_AT_NS)));
    assert!(body["credit_id"].as_str().is_some());
    w.on_root_answer(port.next_token, &credited(6), &mut port);
    assert_eq!(counted(&w, Counter::CostCredited), 6);
}

#[test]
fn costs_that_end_while_a_callers_settlement_is_in_flight_go_out_summed_in_one_call_once_it_is_applied() {
    let w = worker(CHECKED_TOKENS);
    served(&w, 1, 60);
    let (first, mut port) = tick(&w);
    assert_eq!(first.len(), 1);
    let first_token = port.next_token;

    served(&w, 2, 30);
    served(&w, 3, 110);
    served(&w, 4, 4);
    // One port throughout: its tokens tell the calls apart.
    w.on_tick(&mut port);

    // Only the credit, which moves the counter the other way, goes on its own.
    assert_eq!(port.sent, ["/v1/charge", "/v1/credit"]);
    let before = port.sent.len();
    w.on_root_answer(first_token, &charged(50), &mut port);
    assert_eq!(port.sent[before..], ["/v1/charge"], "the answer sends what waited, at once");
    let body: serde_json::Value = serde_json::from_str(port.bodies.last().unwrap()).unwrap();
    assert_eq!(body["cost"], 20 + 100, "summed");
    assert_ne!(body["charge_id"], first[0].1["charge_id"], "a fresh id");
    assert_eq!(body["id_ttl_ms"], 90_000, "the service forgets it once it can no longer come again");
    w.on_root_answer(port.next_token, &charged(120), &mut port);
    assert_eq!(counted(&w, Counter::CostCharged), 170);
    assert!(tick(&w).0.is_empty(), "settled");
}

#[test]
fn a_settlement_whose_answer_never_came_is_sent_again_with_the_same_id_and_counted_once() {
    let w = worker(CHECKED_TOKENS);
    served(&w, 1, 60);
    let (first, _) = tick(&w);
    // No answer: the tick past its deadline gives up on it, and a later tick sends it again.
    w.limiter.clock().advance(Nanos::from_secs(1));
    let (during, _) = tick(&w);
    let (again, mut port) = tick(&w);

    assert!(during.is_empty(), "{during:?}");
    assert_eq!(again.len(), 1, "{again:?}");
    assert_eq!(again[0].1["charge_id"], first[0].1["charge_id"], "the service applies it once");
    assert_eq!(again[0].1["cost"], 50);
    w.on_root_answer(port.next_token, &charged(50), &mut port);
    assert_eq!(counted(&w, Counter::CostCharged), 50);
}

#[test]
fn a_settlement_the_service_refuses_is_forgiven_and_counted() {
    let w = worker(CHECKED_TOKENS);
    served(&w, 1, 60);
    let (_, mut port) = tick(&w);

    let refused = service_error(ErrorCode::InvalidLimit, "limit: no");
    w.on_root_answer(port.next_token, &CalloutAnswer::Response { status: 400, body: refused }, &mut port);

    assert_eq!(counted(&w, Counter::CostForgiven), 50);
    assert_eq!(counted(&w, Counter::CostCharged), 0);
    assert!(tick(&w).0.is_empty(), "never sent again");
}

#[test]
fn a_settlement_not_applied_within_its_life_is_forgiven_and_counted() {
    let w = worker(CHECKED_TOKENS);
    served(&w, 1, 4);
    let mut sends = 0;
    // The service answers 503 for a minute: each tick sends the credit again.
    for _ in 0..70 {
        let (sent, mut port) = tick(&w);
        sends += sent.len();
        if !sent.is_empty() {
            let unavailable = service_error(ErrorCode::StoreUnavailable, "down");
            w.on_root_answer(port.next_token, &CalloutAnswer::Response { status: 503, body: unavailable }, &mut port);
        }
        w.limiter.clock().advance(Nanos::from_secs(1));
    }

    assert!((55..=61).contains(&sends), "sent again every tick until its life ended: {sends}");
    assert_eq!(counted(&w, Counter::CostForgiven), 6);
    assert_eq!(counted(&w, Counter::CostCredited), 0);
    assert!(tick(&w).0.is_empty());
}

#[test]
fn a_retiring_root_forgives_and_counts_what_it_would_still_have_sent() {
    let w = worker(CHECKED_TOKENS);
    served(&w, 1, 60);
    let (_, _) = tick(&w);
    // One in flight (50 over), one in the outbox (6 under).
    served(&w, 2, 4);

    w.retire();

    assert_eq!(counted(&w, Counter::CostForgiven), 56);
    assert!(tick(&w).0.is_empty(), "nothing is left to send");
}

#[test]
fn a_request_the_service_decided_under_a_bypass_settles_nothing_there_whatever_its_response_costs() {
    let w = worker(CHECKED_TOKENS);
    let mut port = FakePort::default();
    assert_eq!(w.on_request_headers(1, &user("a"), &mut port), Flow::Pause);
    let body = format!(
        r#"{{"admitted":true,"at_ns":{SPENT_AT_NS},"entries":[{ENTRY}],
            "overrides":[{{"entry":0,"id":"ovr-00000000000000b1","kind":"bypass"}}]}}"#
    );
    w.on_check_answer(1, &ok(body), &mut port);
    assert!(port.actions.contains(&"resume".to_owned()), "{:?}", port.actions);
    let _ = w.on_response_headers(1, &FakeResponse::default().with_header("x-usage", "60"), false);
    w.on_stream_end(1);

    let (sent, _) = tick(&w);

    assert!(sent.is_empty(), "the bypass spent nothing, so there is nothing to charge or credit: {sent:?}");
    assert_eq!(counted(&w, Counter::OverrideBypassed), 1);
    assert_eq!(counted(&w, Counter::CostCharged), 0);
}
