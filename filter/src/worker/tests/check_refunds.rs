//! A request a check admitted and a later stage rejected: what the service spent for it
//! is credited back (`POST /v1/credit`), so a request spends all or nothing across its
//! check and lease policies; a policy whose spend cannot be credited keeps it, counted.

use super::*;
use crate::testing::service_error;
use sluice_protocol::ErrorCode;

fn config(check_algorithm: &str) -> String {
    format!(
        r#"{{"counter_service": {{"cluster": "counter", "hash_key_env": "K", "timeout": "40ms"}},
        "policies": [
          {{"name": "checked", "key": [{{"header": "x-user"}}], {check_algorithm}, "global": {{"strategy": "check"}}}},
          {{"name": "leased", "key": [{{"header": "x-user"}}], "rate": "5/second", "burst": 5,
            "global": {{"strategy": "lease", "lease": {{"cold_below": 0, "size": 5}}}}}}]}}"#
    )
}

const BUCKET: &str = r#""rate": "100/second", "burst": 100"#;
const LOG: &str = r#""algorithm": "sliding_log", "limit": 100, "window": "1s""#;
const SPENT_AT_NS: u64 = 1_750_000_000_987_654_321;

fn ok(body: String) -> CalloutAnswer {
    CalloutAnswer::Response { status: 200, body: body.into_bytes() }
}

/// Stream 1: its check admits, then its lease finds the global budget empty. Returns
/// what the worker sent after the refill's answer, as (path, body), and the last
/// call's token.
fn checked_then_rejected_by_the_lease(w: &TestWorker) -> (Vec<(String, serde_json::Value)>, u32) {
    let mut port = FakePort::default();
    assert_eq!(w.on_request_headers(1, &user("a"), &mut port), Flow::Pause);
    let entry =
        r#"{"verdict":"allowed","limit":100,"remaining":99,"reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}"#;
    w.on_check_answer(1, &ok(format!(r#"{{"admitted":true,"at_ns":{SPENT_AT_NS},"entries":[{entry}]}}"#)), &mut port);
    let mut root = FakePort::default();
    w.on_tick(&mut root);
    assert_eq!(root.sent, ["/v1/lease"], "the lease is empty: a refill");
    let nothing = r#"{"granted":0,"expires_in_ms":0,"at_ns":1,"entry":{"verdict":"rejected","limit":5,"remaining":0,
        "reset_after_ns":1,"retry_after_ns":2000000000,"delay_ns":0}}"#;
    let mut answered = FakePort::default();
    w.on_root_answer(root.next_token, &ok(nothing.to_owned()), &mut answered);
    assert!(answered.actions.iter().any(|a| a.starts_with("reply 429")), "{:?}", answered.actions);
    let sent = answered
        .sent
        .iter()
        .zip(&answered.bodies)
        .map(|(p, b)| (p.clone(), serde_json::from_str(b).unwrap()))
        .collect();
    (sent, answered.next_token)
}

#[test]
fn a_check_spend_is_credited_back_when_a_lease_policy_rejects_the_request() {
    let w = worker(&config(BUCKET));

    let (sent, _) = checked_then_rejected_by_the_lease(&w);

    assert_eq!(sent.len(), 1, "{sent:?}");
    let (path, body) = &sent[0];
    assert_eq!(path, "/v1/credit");
    assert_eq!((body["units"].as_u64(), body["spent_at_ns"].as_u64()), (Some(1), Some(SPENT_AT_NS)));
    assert_eq!(body["limit"]["algorithm"], "token_bucket");
    assert_eq!(w.metrics().unwrap().get(0, Counter::Unrefunded), 0);
}

#[test]
fn a_check_spend_that_cannot_be_credited_stays_spent_and_is_counted() {
    let w = worker(&config(LOG));

    let (sent, _) = checked_then_rejected_by_the_lease(&w);

    assert!(sent.is_empty(), "a sliding log cannot be credited: {sent:?}");
    assert_eq!(w.metrics().unwrap().get(0, Counter::Unrefunded), 1);
}

#[test]
fn a_refund_the_service_refuses_is_counted_as_unrefunded() {
    let w = worker(&config(BUCKET));
    let (_, credit) = checked_then_rejected_by_the_lease(&w);

    let refused = service_error(ErrorCode::InvalidLimit, "limit: no");
    w.on_root_answer(credit, &CalloutAnswer::Response { status: 400, body: refused }, &mut FakePort::default());

    assert_eq!(w.metrics().unwrap().get(0, Counter::Unrefunded), 1);
}

#[test]
fn a_check_spend_is_credited_back_when_no_room_is_left_to_hold_a_shaped_request() {
    let config = r#"{"counter_service": {"cluster": "counter", "hash_key_env": "K", "timeout": "40ms"},
        "policies": [
          {"name": "checked", "key": [{"header": "x-user"}], "rate": "100/second", "burst": 100,
            "global": {"strategy": "check"}},
          {"name": "shaped", "key": [{"constant": "x"}], "algorithm": "leaky_bucket", "rate": "1/second",
            "queue": 3, "max_wait": "5s"}],
        "shaping": {"max_paused": 1}}"#;
    let w = worker(config);
    let entry =
        r#"{"verdict":"allowed","limit":100,"remaining":99,"reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}"#;
    let admitted = ok(format!(r#"{{"admitted":true,"at_ns":{SPENT_AT_NS},"entries":[{entry}]}}"#));
    let mut actions = Vec::new();
    for id in 1..=3 {
        let mut port = FakePort::default();
        assert_eq!(w.on_request_headers(id, &user("a"), &mut port), Flow::Pause);
        w.on_check_answer(id, &admitted, &mut port);
        actions.push(port.actions);
    }
    assert!(actions[2].iter().any(|a| a.starts_with("reply 429")), "the third finds no room: {actions:?}");

    let mut root = FakePort::default();
    w.on_tick(&mut root);

    assert_eq!(root.sent, ["/v1/credit"], "the check spend of the request never forwarded");
    let body: serde_json::Value = serde_json::from_str(&root.bodies[0]).unwrap();
    assert_eq!((body["units"].as_u64(), body["spent_at_ns"].as_u64()), (Some(1), Some(SPENT_AT_NS)));
}

#[test]
fn a_check_spend_is_credited_back_when_the_client_leaves_while_its_lease_waits_for_a_refill() {
    let w = worker(&config(BUCKET));
    let mut port = FakePort::default();
    assert_eq!(w.on_request_headers(1, &user("a"), &mut port), Flow::Pause);
    let entry =
        r#"{"verdict":"allowed","limit":100,"remaining":99,"reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}"#;
    w.on_check_answer(1, &ok(format!(r#"{{"admitted":true,"at_ns":{SPENT_AT_NS},"entries":[{entry}]}}"#)), &mut port);
    assert_eq!(w.held(), (0, 0, 1), "the check admitted it; its lease waits for a refill");

    w.on_stream_end(1);
    let mut root = FakePort::default();
    w.on_tick(&mut root);

    let credits: Vec<serde_json::Value> = root
        .sent
        .iter()
        .zip(&root.bodies)
        .filter(|(path, _)| *path == "/v1/credit")
        .map(|(_, body)| serde_json::from_str(body).unwrap())
        .collect();
    assert_eq!(credits.len(), 1, "never forwarded: what its check spent is credited back ({:?})", root.sent);
    assert_eq!((credits[0]["units"].as_u64(), credits[0]["spent_at_ns"].as_u64()), (Some(1), Some(SPENT_AT_NS)));
    let m = w.metrics().unwrap();
    assert_eq!((m.get(0, Counter::Rejected), m.get(0, Counter::Abandoned), m.get(0, Counter::Unrefunded)), (1, 1, 0));
}
