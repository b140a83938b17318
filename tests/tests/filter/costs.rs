//! Costs the response reports, through the compiled module: an estimate spent at
//! admission and settled to what the response's header, JSON body or event stream says.

use super::*;
use sluice::host::Counter;

fn tokens(cost: &str) -> Host {
    host(&format!(
        r#"{{"policies": [{{"name": "tokens", "key": [{{"header": "x-user"}}], "rate": "60/minute",
        "burst": 100, "cost": {cost}}}]}}"#
    ))
}

fn ask() -> Request {
    Request::get("/v1/chat/completions").header("x-user", "a")
}

/// Sends a request for user `a`, answered by `response` if it goes upstream; its status.
fn exchange(host: &mut Host, response: Response) -> u16 {
    host.worker(0).exchange(ask(), response).unwrap().status().unwrap()
}

fn json(body: &str) -> Response {
    Response::ok().header("content-type", "application/json").body(body.to_owned())
}

/// How many requests of estimate 10 pass before the first rejection.
fn estimates_left(host: &mut Host) -> usize {
    (0..20).take_while(|_| exchange(host, Response::ok()) == 200).count()
}

#[test]
fn a_usage_header_charges_what_the_estimate_did_not_cover() {
    let mut host = tokens(r#"{"response_header": "x-usage", "estimate": 10, "max": 1000}"#);

    assert_eq!(exchange(&mut host, Response::ok().header("x-usage", "60")), 200);

    // 100 - 60 = 40: four more estimates of 10.
    assert_eq!(estimates_left(&mut host), 4);
    assert_eq!(metric(&host, "tokens", Counter::CostCharged), 50);
    assert_eq!(metric(&host, "tokens", Counter::CostUnknown), 4, "the four answers without the header");
    assert_accounting(&host, "tokens");
}

#[test]
fn a_json_body_below_the_estimate_gives_the_rest_back() {
    let mut host = tokens(r#"{"response_json": "usage.total_tokens", "estimate": 30, "max": 1000}"#);

    let status = exchange(&mut host, json(r#"{"id": "x", "usage": {"prompt_tokens": 1, "total_tokens": 4}}"#));

    assert_eq!(status, 200);
    assert_eq!(metric(&host, "tokens", Counter::CostCredited), 26);
    // 96 left: three more estimates of 30 (whose responses say nothing and keep 30 each).
    assert_eq!(estimates_left(&mut host), 3);
    assert_eq!(metric(&host, "tokens", Counter::CostUnknown), 3);
}

#[test]
fn a_json_body_that_ends_with_trailers_is_settled_to_its_usage_not_taken_for_one_cut_short() {
    let mut host = tokens(r#"{"response_json": "usage.total_tokens", "estimate": 30, "max": 1000}"#);
    // As an HTTP/2 upstream (a gRPC gateway, say) ends its answer: DATA, then HEADERS.
    let response = json(r#"{"usage": {"total_tokens": 4}}"#).trailer("x-request-cost", "4");

    let exchange = host.worker(0).exchange(ask(), response).unwrap();

    assert_eq!(exchange.status(), Some(200));
    assert_eq!(metric(&host, "tokens", Counter::CostUnknown), 0, "the trailers end the body: it was read whole");
    assert_eq!(metric(&host, "tokens", Counter::CostCredited), 26);
    assert_accounting(&host, "tokens");
}

#[test]
fn the_usage_in_the_last_event_of_a_stream_is_charged() {
    let mut host = tokens(r#"{"response_json": "usage.total_tokens", "estimate": 10, "max": 1000}"#);
    let stream = concat!(
        "data: {\"choices\": [{\"delta\": {\"content\": \"Hel\"}}], \"usage\": null}\n\n",
        "data: {\"choices\": [{\"delta\": {\"content\": \"lo\"}}], \"usage\": null}\n\n",
        "data: {\"choices\": [], \"usage\": {\"total_tokens\": 70}}\n\n",
        "data: [DONE]\n\n",
    );
    let response = Response::ok().header("content-type", "text/event-stream").body(stream);

    let exchange = host.worker(0).exchange(ask(), response).unwrap();

    assert_eq!(exchange.response.as_ref().map(|r| r.body_text()).as_deref(), Some(stream), "passed unchanged");
    assert_eq!(metric(&host, "tokens", Counter::CostCharged), 60);
    assert_eq!(estimates_left(&mut host), 3);
}

#[test]
fn a_cost_beyond_what_was_left_is_owed_and_retry_after_says_when_it_is_paid() {
    let mut host = tokens(r#"{"response_header": "x-usage", "estimate": 10, "max": 1000}"#);

    // 5 000 is clamped to max 1 000: 990 above the estimate, 900 more than the bucket had.
    assert_eq!(exchange(&mut host, Response::ok().header("x-usage", "5000")), 200);
    let rejected = host.worker(0).exchange(ask(), Response::ok()).unwrap();

    assert_eq!(rejected.status(), Some(429));
    // 900 owed plus the next estimate of 10, at one unit per second.
    assert_eq!(rejected.header_str("retry-after"), Some("910"));
    host.advance(secs(909));
    assert_eq!(exchange(&mut host, Response::ok()), 429, "one second short");
    host.advance(secs(1));
    assert_eq!(exchange(&mut host, Response::ok()), 200);
    assert_eq!(metric(&host, "tokens", Counter::CostCharged), 990);
}

#[test]
fn a_response_without_usage_keeps_the_configured_on_unknown_cost_and_counts_it() {
    let mut host = tokens(r#"{"response_json": "usage.total_tokens", "estimate": 10, "max": 1000, "on_unknown": 50}"#);

    assert_eq!(exchange(&mut host, json("not json")), 200);

    assert_eq!(metric(&host, "tokens", Counter::CostUnknown), 1);
    assert_eq!(metric(&host, "tokens", Counter::CostCharged), 40);
    // 100 - 50 = 50: but every further request also costs 50 when its answer says nothing.
    assert_eq!(estimates_left(&mut host), 1);
}

#[test]
fn a_rejection_names_the_policys_unit_and_says_when_the_debt_is_paid() {
    let mut host = host(
        r#"{"policies": [{"name": "tokens", "key": [{"header": "x-user"}], "rate": "60/minute", "burst": 100,
        "unit": "tokens", "cost": {"response_header": "x-usage", "estimate": 10, "max": 1000}}]}"#,
    );

    assert_eq!(exchange(&mut host, Response::ok().header("x-usage", "150")), 200);
    let rejected = host.worker(0).exchange(ask(), Response::ok()).unwrap();

    assert_eq!(rejected.status(), Some(429));
    assert_eq!(rejected.header_str("ratelimit-policy"), Some("\"tokens\";q=100;w=100;qu=\"tokens\""));
    // 50 tokens owed plus the next estimate of 10, at one token per second.
    assert_eq!(rejected.header_str("retry-after"), Some("60"));
}

/// A request for user `a` through a host whose counter service refuses every call: the
/// emergency cap decides. Its status, once decided (the refill it waits for is refused
/// within a few milliseconds), answered by `response` if forwarded.
fn through_the_cap(host: &mut Host, response: Response) -> u16 {
    let stream = host.worker(0).request(ask());
    for _ in 0..50 {
        if !host.worker(0).outcome(stream).unwrap().is_paused() {
            break;
        }
        host.advance(millis(1));
    }
    let status = match host.worker(0).outcome(stream).unwrap() {
        wasm_host::Outcome::Forwarded(_) => {
            host.worker(0).respond(stream, response).unwrap();
            200
        }
        wasm_host::Outcome::Responded(r) => r.status,
        other => panic!("expected a decision, got {other:?}"),
    };
    host.worker(0).finish(stream).unwrap();
    status
}

#[test]
fn while_the_service_is_down_the_emergency_cap_is_charged_what_the_response_reports() {
    let config = r#"{"counter_service": {"cluster": "sluice-counter", "hash_key": "cap-hash-key-0123456789abcdef",
        "timeout": "100ms"},
      "policies": [{"name": "tokens", "key": [{"header": "x-user"}], "rate": "6000/minute", "burst": 1000,
        "cost": {"response_header": "x-usage", "estimate": 10, "max": 1000},
        "global": {"strategy": "lease", "lease": {"size": 100}},
        "on_failure": {"action": "deny", "emergency": {"rate": "1/minute", "burst": 100}}}],
      "response": {"fallback_header": "x-sluice-fallback"}}"#;
    let mut host =
        builder(config).scripted_cluster("sluice-counter", |_| wasm_host::Answer::refused()).build().unwrap();

    assert_eq!(through_the_cap(&mut host, Response::ok().header("x-usage", "60")), 200);
    // The cap held 100 and was charged 60: four more estimates of 10, not nine.
    let more = (0..12).take_while(|_| through_the_cap(&mut host, Response::ok()) == 200).count();

    assert_eq!(more, 4);
    assert_eq!(metric(&host, "tokens", Counter::EmergencyAllowed), 5);
    assert_eq!(metric(&host, "tokens", Counter::CostCharged), 50, "the policy's own settlement, counted once");
    assert_eq!(metric(&host, "tokens", Counter::CostUnknown), 4, "once per answer, not once per ledger");
}
