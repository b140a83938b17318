//! Check-mode requests the counter service decided under an operator's override: named
//! in the override header (allowed or rejected), counted per policy.
use super::check::{
    answer, begin, decided, engine, entry, header, limiter, request, response_headers, status, waiting,
};
use super::lease::granted_under;
use crate::host::{CalloutAnswer, Counter};
use crate::testing::{FakeCallouts, RecordedMetrics};

const CLAMPED: &str = r#"{
  "counter_service": {"cluster": "counter", "hash_key_env": "HASH", "timeout": "50ms"},
  "policies": [
    {"name": "tenant", "key": [{"header": "x-tenant"}], "rate": "100/minute", "burst": 10,
     "global": {"strategy": "check"}}
  ],
  "response": {"override_header": "x-sluice-override"}
}"#;

fn under(admitted: bool, verdict: &str, kind: &str) -> CalloutAnswer {
    let CalloutAnswer::Response { body, .. } = answer(admitted, &[entry(verdict, 0, 1_000_000_000)]) else {
        unreachable!()
    };
    let body = String::from_utf8(body).unwrap();
    let body = body.trim_end_matches('}').to_owned()
        + &format!(r#","overrides":[{{"entry":0,"id":"ovr-1f2e3d4c5b6a7988","kind":"{kind}"}}]}}"#);
    CalloutAnswer::Response { status: 200, body: body.into_bytes() }
}

#[test]
fn a_request_decided_under_a_clamp_names_it_in_the_override_header_whether_admitted_or_rejected() {
    let engine = engine(CLAMPED);
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();
    let mut callouts = FakeCallouts::default();

    let first = waiting(begin(&engine, &request(), &limiter, &mut callouts, &mut metrics));
    let admitted =
        decided(engine.complete(first, &under(true, "allowed", "clamp"), &limiter, &mut callouts, true, &mut metrics));
    let second = waiting(begin(&engine, &request(), &limiter, &mut callouts, &mut metrics));
    let rejected = decided(engine.complete(
        second,
        &under(false, "rejected", "clamp"),
        &limiter,
        &mut callouts,
        true,
        &mut metrics,
    ));

    let named = Some("clamp; id=ovr-1f2e3d4c5b6a7988; policy=tenant");
    assert_eq!((status(&admitted), header(response_headers(&admitted), "x-sluice-override")), (200, named));
    assert_eq!((status(&rejected), header(response_headers(&rejected), "x-sluice-override")), (429, named));
    assert_eq!(metrics.get(0, Counter::OverrideClamped), 2);
    assert_eq!(metrics.get(0, Counter::OverrideBypassed), 0);
}

#[test]
fn a_request_no_override_decided_has_no_override_header() {
    let engine = engine(CLAMPED);
    let limiter = limiter();
    let mut metrics = RecordedMetrics::default();

    let pending = waiting(begin(&engine, &request(), &limiter, &mut FakeCallouts::default(), &mut metrics));
    let done = decided(engine.complete(
        pending,
        &answer(true, &[entry("allowed", 9, 0)]),
        &limiter,
        &mut FakeCallouts::default(),
        true,
        &mut metrics,
    ));

    assert_eq!(header(response_headers(&done), "x-sluice-override"), None);
    assert_eq!(metrics.get(0, Counter::OverrideClamped), 0);
}

#[test]
fn requests_spending_a_lease_granted_under_a_clamp_are_counted_under_it_until_a_grant_without_it() {
    let mut w = super::lease::world();
    let first = super::lease::waiting(w.begin());
    let _ = w.tick(|_| granted_under(10, "clamp"));
    let admitted = w.retry(first);
    let _ = w.begin();

    assert_eq!(super::lease::status(&admitted), Some(200));
    assert_eq!(w.metrics.get(0, Counter::OverrideClamped), 2, "the waiter and the next request");

    // The next refill (elected at the low-water mark) comes back without the clamp.
    while w.engine.take_outgoing(&w.limiter, true).is_empty() {
        let _ = w.begin();
    }
    let spent_before = w.metrics.get(0, Counter::OverrideClamped);
    w.limiter.clock().advance(shared_store::Nanos::from_secs(3));
    let again = super::lease::waiting(w.begin());
    let _ = w.tick(|_| super::lease::granted(10));
    let after = w.retry(again);

    assert_eq!(super::lease::status(&after), Some(200));
    assert_eq!(w.metrics.get(0, Counter::OverrideClamped), spent_before, "a grant without it ends it");
}
