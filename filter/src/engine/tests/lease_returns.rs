//! Leased tokens a proxy will not spend are given back to the service before they
//! expire (issue 39, `lease_return.rs`): taken out of the lease by CAS, then credited
//! with an id, counted as `lease.returned`, or as `lease.expired` when they cannot be.
use super::lease::*;
use crate::engine::*;
use crate::host::{CalloutAnswer, Counter};
use shared_store::Nanos;

fn credited(units: u64) -> CalloutAnswer {
    let body = format!(
        r#"{{"credited":{units},"forgiven":0,"at_ns":1,"entry":{{"verdict":"allowed","limit":100,"remaining":50,
            "reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}}}}"#
    );
    CalloutAnswer::Response { status: 200, body: body.into_bytes() }
}

/// A grant of `n` for 2 s that left the budget with `remaining`.
fn granted_leaving(n: u64, remaining: u64) -> CalloutAnswer {
    let body = format!(
        r#"{{"granted":{n},"expires_in_ms":2000,"at_ns":1,"entry":{{"verdict":"allowed","limit":100,
            "remaining":{remaining},"reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}}}}"#
    );
    CalloutAnswer::Response { status: 200, body: body.into_bytes() }
}

/// Tenant "acme" leased 10 for 2 s, leaving the budget short (3 left): one held for, and
/// spent by, its first request; then it went quiet: nine left, one unit of demand known.
fn leased_then_quiet() -> World {
    let mut w = world();
    let first = waiting(w.begin());
    let _ = w.tick(|_| granted_leaving(10, 3));
    assert_eq!(status(&w.retry(first)), Some(200));
    w
}

impl World {
    /// The root's tick: due reviews, then what it sends, answered by `answer`.
    fn review_then_tick(&mut self, answer: impl Fn(&Outgoing) -> CalloutAnswer) -> usize {
        self.engine.review_leases(&self.limiter, &mut self.metrics);
        self.tick(answer)
    }
}

#[test]
fn a_lease_whose_key_went_quiet_is_returned_with_an_id_once_a_quarter_of_its_life_is_left() {
    let mut w = leased_then_quiet();
    w.limiter.clock().advance(Nanos::from_millis(1499));
    assert_eq!(w.review_then_tick(|_| credited(8)), 0, "not due: more than a quarter of its life is left");

    w.limiter.clock().advance(Nanos::from_millis(1));
    assert_eq!(w.review_then_tick(|_| credited(8)), 1);

    let body = w.last_body("/v1/credit");
    // One unit over the last life: ⌈1 × 0.5 s / 2 s⌉ = 1 kept of the nine.
    assert_eq!(body["units"], 8);
    assert_eq!(body["spent_at_ns"], 1, "in the window the grant was decided in");
    assert_eq!(body["policy"], "tenant");
    assert!(body["credit_id"].as_str().is_some_and(|id| !id.is_empty()), "{body}");
    assert_eq!(w.metrics.get(0, Counter::LeaseReturned), 8);
    assert_eq!(w.metrics.get(0, Counter::LeaseExpired), 0);
    // What is kept is spent; what was returned is not.
    assert_eq!(status(&w.begin()), Some(200));
    assert!(waiting(w.begin()).waits_for_lease(), "the lease is empty: a refill is elected");
    assert_eq!(w.review_then_tick(|_| credited(8)), 1, "the refill, and no second return");
}

#[test]
fn a_grant_that_left_its_budget_plentiful_is_never_reviewed() {
    let mut w = world();
    let first = waiting(w.begin());
    // 50 left after a grant of 10: another proxy asking as much is granted it anyway.
    let _ = w.tick(|_| granted_leaving(10, 50));
    assert_eq!(status(&w.retry(first)), Some(200));

    w.limiter.clock().advance(Nanos::from_millis(1500));

    assert_eq!(w.review_then_tick(|_| credited(8)), 0, "no return: the counter refills meanwhile");
    assert_eq!(w.metrics.get(0, Counter::LeaseReturned), 0);
}

#[test]
fn a_return_the_service_did_not_answer_is_sent_again_with_the_same_id_and_applied_once() {
    let mut w = leased_then_quiet();
    w.limiter.clock().advance(Nanos::from_millis(1500));

    assert_eq!(w.review_then_tick(|_| CalloutAnswer::TimedOut), 1);
    let first = w.last_body("/v1/credit");
    assert_eq!(w.metrics.get(0, Counter::LeaseReturned), 0);
    assert_eq!(w.review_then_tick(|_| credited(8)), 1, "sent again on the next tick");

    let again = w.last_body("/v1/credit");
    assert_eq!(
        (again["credit_id"].clone(), again["units"].clone()),
        (first["credit_id"].clone(), first["units"].clone())
    );
    assert_eq!(w.metrics.get(0, Counter::LeaseReturned), 8);
    assert_eq!(w.review_then_tick(|_| credited(8)), 0, "nothing left to send");
}

#[test]
fn a_return_that_cannot_be_applied_within_its_life_counts_as_expired_as_the_tokens_would_have() {
    let mut w = leased_then_quiet();
    w.limiter.clock().advance(Nanos::from_millis(1500));
    assert_eq!(w.review_then_tick(|_| CalloutAnswer::TimedOut), 1);

    w.limiter.clock().advance(Nanos::from_secs(61));
    let _ = w.review_then_tick(|_| CalloutAnswer::TimedOut);

    assert_eq!(w.metrics.get(0, Counter::LeaseReturned), 0);
    assert_eq!(w.metrics.get(0, Counter::LeaseExpired), 8, "granted 10 = spent 1 + kept 1 (expired later) + 8");
}

#[test]
fn with_the_circuit_open_a_quiet_keys_tokens_stay_in_its_lease_to_bridge_the_outage() {
    let mut w = leased_then_quiet();
    w.limiter.clock().advance(Nanos::from_millis(1500));
    let now = w.limiter.clock().now();
    let breaker = &w.engine.0.service.as_ref().unwrap().breaker;
    for _ in 0..5 {
        let _ = breaker.record(w.limiter.store(), now, Some(false), now);
    }

    assert_eq!(w.review_then_tick(|_| credited(8)), 0, "nothing returned");

    for _ in 0..9 {
        assert_eq!(status(&w.begin()), Some(200), "the nine left are spent through the outage");
    }
    assert_eq!(w.metrics.get(0, Counter::LeaseReturned), 0);
}
