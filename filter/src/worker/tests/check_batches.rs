//! Group commit of checks: while a worker has `max_checks_in_flight` check calls out, a
//! request's check waits and goes with the others that waited, in one
//! `POST /v1/checks`, as soon as a call comes back; each request still gets its own
//! decision, within its own deadline.

use super::*;
use crate::host::{PluginCounter, Reason};

fn config(in_flight: u32, per_call: u32) -> String {
    format!(
        r#"{{"counter_service": {{"cluster": "counter", "hash_key_env": "K", "timeout": "40ms",
            "max_checks_in_flight": {in_flight}, "max_checks_per_call": {per_call},
            "circuit_breaker": {{"failures": 2}}}},
        "policies": [{{"name": "global", "key": [{{"header": "x-user"}}], "rate": "5/second", "burst": 5,
            "global": {{"strategy": "check"}}, "on_failure": {{"action": "deny", "status": 503}}}}]}}"#
    )
}

const ALLOWED: &str = r#"{"admitted":true,"at_ns":1,"entries":[{"verdict":"allowed","limit":5,"remaining":4,
    "reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}]}"#;
const REJECTED: &str = r#"{"admitted":false,"at_ns":1,"entries":[{"verdict":"rejected","limit":5,"remaining":0,
    "reset_after_ns":1,"retry_after_ns":1000000000,"delay_ns":0}]}"#;
const REFUSED: &str = r#"{"status":503,"error":{"code":"store_unavailable","message":"checks[2]. no store"}}"#;

fn ok(body: &str) -> CalloutAnswer {
    CalloutAnswer::Response { status: 200, body: body.as_bytes().to_vec() }
}

fn batch(results: &[&str]) -> CalloutAnswer {
    ok(&format!(r#"{{"results":[{}]}}"#, results.join(",")))
}

fn plugin(w: &TestWorker, counter: PluginCounter) -> i64 {
    w.metrics().unwrap().plugin(counter)
}

/// Streams 1..=n ask, for users u1..un; what their own callbacks sent.
fn ask(w: &TestWorker, n: u32) -> FakePort {
    let mut port = FakePort::default();
    for id in 1..=n {
        assert_eq!(w.on_request_headers(id, &user(&format!("u{id}")), &mut port), Flow::Pause);
    }
    port
}

/// How many checks a batch's body carries.
fn checks_in(body: &str) -> usize {
    let body: serde_json::Value = serde_json::from_str(body).unwrap();
    body["checks"].as_array().map_or(0, Vec::len)
}

#[test]
fn a_lone_check_goes_out_at_once_and_alone() {
    let w = worker(&config(2, 64));

    let port = ask(&w, 2);

    assert_eq!(port.sent, ["/v1/check", "/v1/check"], "two calls may be out: neither waits");
    assert_eq!(plugin(&w, PluginCounter::CheckBatches), 0);
}

#[test]
fn checks_beyond_the_calls_in_flight_wait_and_leave_together_when_a_call_returns() {
    let w = worker(&config(1, 64));
    let port = ask(&w, 4);
    assert_eq!(port.sent, ["/v1/check"], "one call is out: the next three wait to be sent");
    assert_eq!(w.held(), (0, 4, 0));

    let mut own = FakePort::default();
    w.on_check_answer(1, &ok(ALLOWED), &mut own);
    assert_eq!(own.actions, ["resume", "wake 7"], "the answer wakes the root to send what waits");
    assert!(own.sent.is_empty(), "a stream never sends a batch: its answer would die with it");

    let mut root = FakePort::default();
    w.on_wake(&mut root);
    assert_eq!(root.sent, ["/v1/checks"]);
    assert_eq!(checks_in(&root.bodies[0]), 3);
    assert_eq!((plugin(&w, PluginCounter::Callouts), plugin(&w, PluginCounter::CheckBatches)), (2, 1));
    assert_eq!(plugin(&w, PluginCounter::CheckCallsPastLate), 0, "the call came back: nothing went past it");
    assert_eq!(plugin(&w, PluginCounter::ChecksBatched), 3);
    assert_eq!(plugin(&w, PluginCounter::Waiting), 3);
}

#[test]
fn each_request_of_a_batch_gets_its_own_result_and_a_check_refused_alone_takes_its_failure_rule() {
    let w = worker(&config(1, 64));
    let token = three_in_a_batch(&w);

    let mut answered = FakePort::default();
    w.on_root_answer(token, &batch(&[ALLOWED, REJECTED, REFUSED]), &mut answered);

    assert_eq!(answered.actions, ["enter 2", "resume", "enter 3", "reply 429", "enter 4", "reply 503"]);
    assert_eq!(w.held(), (0, 0, 0));
    assert_eq!((counted(&w, Counter::Allowed), counted(&w, Counter::OverLimit)), (2, 1));
    assert_eq!(counted(&w, Reason::BadStatus.counter()), 1);
    assert_eq!(plugin(&w, PluginCounter::CircuitOpened), 0, "a check refused alone says nothing of the service");
    assert_eq!(plugin(&w, PluginCounter::Waiting), 0);
}

#[test]
fn a_batch_whose_member_ended_still_answers_the_others_by_their_own_place() {
    let w = worker(&config(1, 64));
    let token = three_in_a_batch(&w);

    w.on_stream_end(2);
    let mut answered = FakePort::default();
    w.on_root_answer(token, &batch(&[ALLOWED, ALLOWED, REJECTED]), &mut answered);

    assert_eq!(answered.actions, ["enter 3", "resume", "enter 4", "reply 429"]);
    assert_eq!(counted(&w, Counter::Abandoned), 1);
}

#[test]
fn a_batch_whose_call_fails_is_one_failure_for_the_breaker_and_the_failure_rule_for_each_request() {
    let w = worker(&config(1, 64));
    let token = three_in_a_batch(&w);

    let mut answered = FakePort::default();
    w.on_root_answer(token, &CalloutAnswer::Failed, &mut answered);

    assert_eq!(answered.actions, ["enter 2", "reply 503", "enter 3", "reply 503", "enter 4", "reply 503"]);
    assert_eq!(counted(&w, Reason::Reset.counter()), 3);
    assert_eq!(plugin(&w, PluginCounter::CircuitOpened), 0, "one failed call of the two the breaker allows");

    // The second failed call opens it.
    let mut port = ask_one(&w, 5);
    assert_eq!(port.sent, ["/v1/check"]);
    w.on_check_answer(5, &CalloutAnswer::Failed, &mut port);
    assert_eq!(plugin(&w, PluginCounter::CircuitOpened), 1);
}

/// Streams 1 to 4 ask with one call allowed out: 1 goes alone and is admitted, then 2, 3
/// and 4 go in one batch. The batch's callout token.
fn three_in_a_batch(w: &TestWorker) -> u32 {
    let _ = ask(w, 4);
    w.on_check_answer(1, &ok(ALLOWED), &mut FakePort::default());
    let mut root = FakePort::default();
    w.on_wake(&mut root);
    assert_eq!(root.sent, ["/v1/checks"]);
    root.next_token
}

fn ask_one(w: &TestWorker, id: u32) -> FakePort {
    let mut port = FakePort::default();
    assert_eq!(w.on_request_headers(id, &user(&format!("u{id}")), &mut port), Flow::Pause);
    port
}

#[test]
fn members_of_a_batch_timed_out_by_the_tick_count_once_against_the_service() {
    let w = worker(&config(1, 64));
    let _ = three_in_a_batch(&w);

    w.limiter.clock().advance(Nanos::from_millis(41));
    let mut root = FakePort::default();
    w.on_tick(&mut root);

    assert_eq!(root.actions, ["enter 2", "reply 503", "enter 3", "reply 503", "enter 4", "reply 503"]);
    assert_eq!(counted(&w, Reason::Timeout.counter()), 3);
    assert_eq!(plugin(&w, PluginCounter::CircuitOpened), 0, "one late call, not three");
}

#[test]
fn a_request_whose_deadline_passes_while_it_waits_to_be_sent_takes_its_failure_rule_and_is_counted() {
    let w = worker(&config(1, 64));
    let _ = ask_one(&w, 1);
    w.limiter.clock().advance(Nanos::from_millis(5));
    let _ = ask_one(&w, 2);
    w.limiter.clock().advance(Nanos::from_millis(5));

    let mut root = FakePort::default();
    w.on_tick(&mut root);
    assert_eq!(root.sent, ["/v1/check"], "the call out is late (a quarter of the timeout): the waiting check goes");

    w.limiter.clock().advance(Nanos::from_millis(31));
    let mut root = FakePort::default();
    w.on_tick(&mut root);
    assert_eq!(root.actions, ["enter 1", "reply 503"], "the call that was out first timed out first");

    w.limiter.clock().advance(Nanos::from_millis(5));
    let mut root = FakePort::default();
    w.on_tick(&mut root);
    assert_eq!(root.actions, ["enter 2", "reply 503"], "its own deadline, set when it first asked");
    assert_eq!(plugin(&w, PluginCounter::ChecksUnsent), 0, "it was sent before its deadline");

    // Now one that never leaves: the call out does not come back before its deadline.
    let w = worker(&config(1, 64));
    let _ = ask(&w, 2);
    w.limiter.clock().advance(Nanos::from_millis(41));
    let mut root = FakePort::default();
    w.on_tick(&mut root);
    assert_eq!(root.actions, ["enter 1", "reply 503", "enter 2", "reply 503"]);
    assert_eq!(plugin(&w, PluginCounter::ChecksUnsent), 1);
    assert_eq!(plugin(&w, PluginCounter::CircuitOpened), 0, "one late call; the unsent check is not the service's");
    assert_eq!(plugin(&w, PluginCounter::Waiting), 0);
}

#[test]
fn a_request_that_arrives_between_an_answer_and_the_roots_wake_joins_the_checks_that_waited() {
    let w = worker(&config(1, 64));
    let _ = ask(&w, 3);
    let mut own = FakePort::default();
    w.on_check_answer(1, &ok(ALLOWED), &mut own);
    assert_eq!(own.actions, ["resume", "wake 7"]);

    // The root has not run yet: the call's room is there, and two checks wait for it.
    let newcomer = ask_one(&w, 4);
    assert!(newcomer.sent.is_empty(), "it does not take the room alone: {:?}", newcomer.sent);

    let mut root = FakePort::default();
    w.on_wake(&mut root);
    assert_eq!(root.sent, ["/v1/checks"]);
    assert_eq!(checks_in(&root.bodies[0]), 3, "the two that waited and the newcomer, together");
}

#[test]
fn a_late_call_holds_no_check_back_the_next_tick_sends_the_waiting_ones_on_a_call_of_their_own() {
    let w = worker(&config(1, 64));
    let port = ask(&w, 3);
    assert_eq!(port.sent, ["/v1/check"], "one call out: two wait");

    w.limiter.clock().advance(Nanos::from_millis(9));
    let mut root = FakePort::default();
    w.on_tick(&mut root);
    assert!(root.sent.is_empty(), "9 ms of a 40 ms timeout: the call out is not late, the checks wait for it");

    w.limiter.clock().advance(Nanos::from_millis(1));
    let mut root = FakePort::default();
    w.on_tick(&mut root);
    assert_eq!(root.sent, ["/v1/checks"], "a quarter of the timeout: the call out is late");
    assert_eq!(checks_in(&root.bodies[0]), 2);
    assert_eq!(plugin(&w, PluginCounter::CheckCallsPastLate), 1);

    let mut answered = FakePort::default();
    w.on_root_answer(root.next_token, &batch(&[ALLOWED, REJECTED]), &mut answered);
    assert_eq!(answered.actions, ["enter 2", "resume", "enter 3", "reply 429"]);
    let mut late = FakePort::default();
    w.on_check_answer(1, &ok(ALLOWED), &mut late);
    assert_eq!(late.actions, ["resume"], "the late call still decides its own request");
    assert_eq!(w.held(), (0, 0, 0));
    assert_eq!(counted(&w, Reason::Timeout.counter()), 0);
    assert_eq!(plugin(&w, PluginCounter::ChecksUnsent), 0);
}

#[test]
fn a_full_batch_leaves_at_once_without_waiting_for_a_call_to_come_back() {
    let w = worker(&config(1, 3));
    let _ = ask(&w, 3);
    let mut fourth = FakePort::default();
    assert_eq!(w.on_request_headers(4, &user("u4"), &mut fourth), Flow::Pause);
    assert_eq!(fourth.actions, ["wake 7"], "three wait: a full call's worth, sent from the root");

    let mut root = FakePort::default();
    w.on_wake(&mut root);

    assert_eq!(root.sent, ["/v1/checks"], "the first call is still out");
    assert_eq!(checks_in(&root.bodies[0]), 3);
    let mut fifth = FakePort::default();
    assert_eq!(w.on_request_headers(5, &user("u5"), &mut fifth), Flow::Pause);
    assert!(fifth.actions.is_empty() && fifth.sent.is_empty(), "one waits, for a call to come back");
    assert_eq!(w.held(), (0, 5, 0));
}

#[test]
fn with_no_bound_on_calls_in_flight_every_check_goes_alone_at_once() {
    let w = worker(&config(0, 64));

    let port = ask(&w, 20);

    assert_eq!(port.sent.len(), 20);
    assert!(port.sent.iter().all(|p| p == "/v1/check"));
}

#[test]
fn an_open_circuit_decides_the_waiting_checks_without_sending_them() {
    let w = worker(&config(1, 64));
    let _ = ask(&w, 3);
    // Two failed calls open the circuit: the one out, then the batch the root sent.
    w.on_check_answer(1, &CalloutAnswer::Failed, &mut FakePort::default());
    let mut root = FakePort::default();
    w.on_wake(&mut root);
    assert_eq!(root.sent, ["/v1/checks"]);
    let mut answered = FakePort::default();
    w.on_root_answer(root.next_token, &CalloutAnswer::Failed, &mut answered);
    assert_eq!(plugin(&w, PluginCounter::CircuitOpened), 1);

    let mut port = FakePort::default();
    assert_eq!(w.on_request_headers(9, &user("u9"), &mut port), Flow::Pause);
    assert!(port.sent.is_empty(), "the circuit is open: no call");
    assert_eq!(counted(&w, Reason::CircuitOpen.counter()), 1);
}

#[test]
fn a_worker_that_batches_checks_has_a_queue_to_wake_its_root_and_one_that_does_not_needs_none() {
    assert!(worker(&config(1, 64)).engine.sends_from_root(), "without a wake, waiting checks go on the tick");
    assert!(!worker(&config(0, 64)).engine.sends_from_root());
}
