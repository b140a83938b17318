//! Lease policies their leases cannot serve (the slot holds another key's lease, the
//! wait was outrun by other requests) while the service is healthy: decided by a check
//! of their cost at the service (issue 39), never by the failure rule; the failure rule
//! stays for a check the service cannot answer.
use super::check::{answer, entry, header, response_headers};
use super::lease::*;
use crate::config::Config;
use crate::engine::*;
use crate::host::{CalloutAnswer, Counter};
use crate::testing::{FakeCallouts, FakeRequest, RecordedMetrics};
use shared_store::{HashKey, Limiter, Nanos};
use shared_store::{ManualClock, MemoryStore};

/// One lease policy that fails closed, with one lease slot.
const ONE_SLOT_CLOSED: &str = r#"{
  "counter_service": {"cluster": "counter", "hash_key_env": "HASH", "timeout": "50ms",
                      "circuit_breaker": {"failures": 1000}},
  "policies": [{"name": "t", "key": [{"header": "x-tenant"}], "rate": "100/second", "burst": 100, "slots": 1,
                "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 10, "low_water": 3, "max_waiting": 4}}}],
  "response": {"fallback_header": "x-sluice-fallback"}
}"#;

fn world_closed() -> World {
    World {
        engine: Engine::new(
            Config::from_json(ONE_SLOT_CLOSED.as_bytes()).unwrap(),
            "sluice/t/r/",
            HashKey::new([1; 16]),
            env,
        )
        .unwrap(),
        limiter: Limiter::new(MemoryStore::new(), ManualClock::at(Nanos::from_secs(1000))),
        callouts: FakeCallouts::default(),
        metrics: RecordedMetrics::default(),
    }
}

fn tenant(id: &str) -> FakeRequest {
    FakeRequest::get("/").with_header("x-tenant", id)
}

impl World {
    fn complete(&mut self, pending: Box<Pending>, answer: &CalloutAnswer) -> Decided {
        match self.engine.complete(pending, answer, &self.limiter, &mut self.callouts, true, &mut self.metrics) {
            Begun::Decided(decided) => decided,
            Begun::Waiting(pending) => panic!("expected a decision, got a wait: {pending:?}"),
        }
    }
}

fn decided_status(decided: &Decided) -> u16 {
    match &decided.outcome {
        Outcome::Reject(response) => response.status,
        Outcome::Continue { .. } | Outcome::Delay { .. } => 200,
    }
}

/// Tenant "acme" holds the only lease slot with a live lease; tenant "b" then finds it
/// taken: returns b's wait.
fn slot_taken(w: &mut World) -> Box<Pending> {
    let first = waiting(w.begin());
    let _ = w.tick(|_| granted(10));
    assert_eq!(status(&w.retry(first)), Some(200));
    waiting(w.engine.begin(&tenant("b"), &w.limiter, &mut w.callouts, true, &mut w.metrics))
}

/// A waiter whose refill was granted to no one, and spent by ten other requests before
/// it tried again: its wait was outrun. Returns what its retry began.
fn contended(w: &mut World) -> Begun {
    let pending = waiting(w.begin());
    for call in w.engine.take_outgoing(&w.limiter, true) {
        if let Some(sent) = w.engine.dispatch_outgoing(call, &mut w.callouts, &w.limiter, &mut w.metrics) {
            w.engine.outgoing_answered(sent, &granted(10), &w.limiter, &mut w.metrics, |_| false);
        }
    }
    for _ in 0..10 {
        assert_eq!(status(&w.begin()), Some(200));
    }
    w.limiter.clock().advance(Nanos::from_millis(150));
    w.retry(pending)
}

fn no_degraded_decision(w: &World) {
    for reason in crate::host::Reason::ALL {
        assert_eq!(w.metrics.get(0, reason.counter()), 0, "{reason:?}");
    }
    assert_eq!(w.metrics.get(0, Counter::FailureDenied), 0);
    assert_eq!(w.metrics.get(0, Counter::FailureAllowed), 0);
}

#[test]
fn a_request_whose_slot_holds_another_keys_lease_is_checked_at_the_service_and_admitted_on_its_answer() {
    let mut w = world_closed();
    let pending = slot_taken(&mut w);

    assert!(!pending.waits_for_lease(), "it waits for a check, not a refill");
    let body = w.last_body("/v1/check");
    assert_eq!(body["entries"][0]["cost"], 1);
    assert_eq!(body["entries"][0]["policy"], "t");
    let decided = w.complete(pending, &answer(true, &[entry("allowed", 5, 0)]));

    assert_eq!(decided_status(&decided), 200);
    assert_eq!(header(response_headers(&decided), "x-sluice-fallback"), None);
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedSlotTaken), 1);
    no_degraded_decision(&w);
}

#[test]
fn a_request_whose_slot_is_taken_is_rejected_with_the_services_429_and_retry_after() {
    let mut w = world_closed();
    let pending = slot_taken(&mut w);

    let decided = w.complete(pending, &answer(false, &[entry("rejected", 0, 3_000_000_000)]));

    assert_eq!(decided_status(&decided), 429);
    assert_eq!(header(response_headers(&decided), "retry-after"), Some("3"));
    assert_eq!(header(response_headers(&decided), "x-sluice-fallback"), None);
    assert_eq!(w.metrics.get(0, Counter::OverLimit), 1);
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedSlotTaken), 1);
    no_degraded_decision(&w);
}

#[test]
fn a_request_whose_wait_was_outrun_by_others_is_checked_at_the_service() {
    let mut w = world_closed();
    let pending = waiting(contended(&mut w));

    assert!(!pending.waits_for_lease(), "it waits for a check, not a refill");
    assert_eq!(w.last_body("/v1/check")["entries"][0]["cost"], 1);
    let decided = w.complete(pending, &answer(true, &[entry("allowed", 5, 0)]));

    assert_eq!(decided_status(&decided), 200);
    assert_eq!(header(response_headers(&decided), "x-sluice-fallback"), None);
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedContended), 1);
    no_degraded_decision(&w);
}

#[test]
fn a_check_for_a_taken_slot_that_times_out_takes_the_failure_rule_and_is_counted_degraded() {
    let mut w = world_closed();
    let pending = slot_taken(&mut w);

    let decided = w.complete(pending, &CalloutAnswer::TimedOut);

    assert_eq!(decided_status(&decided), 503);
    let fallback = header(response_headers(&decided), "x-sluice-fallback").unwrap();
    assert!(fallback.starts_with("fail_closed; reason=timeout;"), "{fallback}");
    assert_eq!(w.metrics.get(0, Counter::DegradedTimeout), 1);
    assert_eq!(w.metrics.get(0, Counter::FailureDenied), 1);
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedSlotTaken), 1);
    assert_eq!(w.metrics.get(0, Counter::DegradedLeaseSlotTaken), 0);
}

#[test]
fn a_check_for_a_taken_slot_that_cannot_be_held_is_timed_out_and_takes_the_failure_rule() {
    // The worker cannot hold the request: its check is decided as one not answered.
    let mut w = world_closed();
    let pending = slot_taken(&mut w);

    let decided = w.engine.overflow(pending, &w.limiter, true, &mut w.metrics);

    assert_eq!(decided_status(&decided), 503);
    assert_eq!(w.metrics.get(0, Counter::DegradedTimeout), 1);
    assert_eq!(w.metrics.get(0, Counter::FailureDenied), 1);
}
