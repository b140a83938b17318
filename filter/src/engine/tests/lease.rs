//! Lease-mode policies through the engine: spending without callouts, refills elected
//! at the low-water mark or by a waiter, empty budgets, failed refills, expiring waits.
use crate::config::Config;
use crate::engine::*;
use crate::host::{CalloutAnswer, Counter, PluginCounter};
use crate::testing::{FakeCallouts, FakeRequest, RecordedMetrics};
use shared_store::{HashKey, Limiter, Nanos};
use shared_store::{ManualClock, MemoryStore};

pub(super) fn env(name: &str) -> Option<String> {
    (name == "HASH").then(|| "0123456789abcdef-operator-key".to_owned())
}

/// A lease policy that leases every key from its first request (`cold_below` 0): these
/// tests are about leases; `lease_demand.rs` is about which keys get one.
pub(super) const LEASED: &str = r#"{
  "counter_service": {"cluster": "counter", "hash_key_env": "HASH", "timeout": "50ms"},
  "policies": [{"name": "tenant", "key": [{"header": "x-tenant"}], "rate": "100/second", "burst": 100,
                "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 10, "duration": "2s", "low_water": 3, "max_waiting": 4}},
                "on_failure": {"action": "deny", "emergency": {"rate": "1/hour", "burst": 2}}}]
}"#;

pub(super) struct World {
    pub(super) engine: Engine,
    pub(super) limiter: Limiter<MemoryStore, ManualClock>,
    pub(super) callouts: FakeCallouts,
    pub(super) metrics: RecordedMetrics,
}

pub(super) fn world() -> World {
    world_of(LEASED)
}

pub(super) fn world_of(config: &str) -> World {
    World {
        engine: Engine::new(Config::from_json(config.as_bytes()).unwrap(), "sluice/t/r/", HashKey::new([1; 16]), env)
            .unwrap(),
        limiter: Limiter::new(MemoryStore::new(), ManualClock::at(Nanos::from_secs(1000))),
        callouts: FakeCallouts::default(),
        metrics: RecordedMetrics::default(),
    }
}

pub(super) fn acme() -> FakeRequest {
    FakeRequest::get("/").with_header("x-tenant", "acme")
}

pub(super) fn granted(n: u64) -> CalloutAnswer {
    let body = format!(
        r#"{{"granted":{n},"expires_in_ms":2000,"at_ns":1,"entry":{{"verdict":"allowed","limit":100,"remaining":50,
            "reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}}}}"#
    );
    CalloutAnswer::Response { status: 200, body: body.into_bytes() }
}

pub(super) fn nothing_granted(retry_ms: u64) -> CalloutAnswer {
    let body = format!(
        r#"{{"granted":0,"expires_in_ms":2000,"at_ns":1,"entry":{{"verdict":"rejected","limit":100,"remaining":0,
            "reset_after_ns":1,"retry_after_ns":{},"delay_ns":0}}}}"#,
        retry_ms * 1_000_000
    );
    CalloutAnswer::Response { status: 200, body: body.into_bytes() }
}

impl World {
    pub(super) fn begin(&mut self) -> Begun {
        self.engine.begin(&acme(), &self.limiter, &mut self.callouts, true, &mut self.metrics)
    }

    /// What the root sends on its tick (refills, and the charges this worker owes),
    /// answered by `answer`. Every waiter is still waiting.
    pub(super) fn tick(&mut self, answer: impl Fn(&Outgoing) -> CalloutAnswer) -> usize {
        let calls = self.engine.take_outgoing(&self.limiter, true);
        let n = calls.len();
        for call in calls {
            let reply = answer(&call);
            if let Some(sent) =
                self.engine.dispatch_outgoing(call, &mut self.callouts, &self.limiter, &mut self.metrics)
            {
                self.engine.outgoing_answered(sent, &reply, &self.limiter, &mut self.metrics, |_| true);
            }
        }
        n
    }

    /// The body of the last call sent to `path`.
    pub(super) fn last_body(&self, path: &str) -> serde_json::Value {
        let call = self
            .callouts
            .sent
            .iter()
            .rev()
            .find(|c| c.headers.iter().any(|(n, v)| n == ":path" && v == path))
            .unwrap_or_else(|| panic!("nothing was sent to {path}"));
        serde_json::from_str(&call.body).unwrap()
    }

    pub(super) fn retry(&mut self, pending: Box<Pending>) -> Begun {
        self.engine.retry(pending, &self.limiter, &mut self.callouts, true, &mut self.metrics)
    }
}

pub(super) fn status(begun: &Begun) -> Option<u16> {
    match begun {
        Begun::Decided(Decided { outcome: Outcome::Reject(r), .. }) => Some(r.status),
        Begun::Decided(_) => Some(200),
        Begun::Waiting(_) => None,
    }
}

pub(super) fn waiting(begun: Begun) -> Box<Pending> {
    match begun {
        Begun::Waiting(pending) => pending,
        Begun::Decided(d) => panic!("expected a wait, got {d:?}"),
    }
}

#[test]
fn the_first_request_waits_for_the_refill_it_elected_and_the_root_sends_it() {
    let mut w = world();

    let pending = waiting(w.begin());
    assert!(pending.waits_for_lease());
    assert!(w.callouts.sent.is_empty(), "the request itself sends nothing");
    assert_eq!(w.tick(|_| granted(10)), 1);
    let body: serde_json::Value = serde_json::from_str(&w.callouts.sent[0].body).unwrap();
    let after = w.retry(pending);

    assert_eq!(
        w.callouts.sent[0].headers.iter().find(|(n, _)| n == ":path").map(|(_, v)| v.as_str()),
        Some("/v1/lease")
    );
    assert_eq!(body["tokens"], 1, "all the key's demand known yet: this request's cost");
    assert_eq!(body["ttl_ms"], 2000);
    assert_eq!(status(&after), Some(200));
    assert_eq!(w.metrics.get(0, Counter::LeaseGranted), 10);
}

#[test]
fn a_lease_is_spent_without_callouts_and_one_refill_is_elected_at_the_low_water_mark() {
    let mut w = world();
    let first = waiting(w.begin());
    let _ = w.retry(first);
    let _ = w.tick(|_| granted(10));

    // 10 tokens: the first waiter took none yet (its retry ran before the grant).
    let statuses: Vec<Option<u16>> = (0..8).map(|_| status(&w.begin())).collect();
    let elected = w.engine.take_outgoing(&w.limiter, false);

    assert_eq!(statuses, [Some(200); 8]);
    assert_eq!(elected.len(), 1, "one refill, elected when fewer than 3 were left");
    assert_eq!(w.callouts.sent.len(), 1, "only the first refill was sent");
}

#[test]
fn an_empty_global_budget_rejects_with_the_services_wait_and_asks_no_more_until_then() {
    let mut w = world();
    let pending = waiting(w.begin());
    let _ = w.tick(|_| nothing_granted(1500));

    let rejected = w.retry(pending);
    let again = w.begin();

    let Begun::Decided(Decided { outcome: Outcome::Reject(response), .. }) = rejected else { panic!() };
    assert_eq!(response.status, 429);
    assert!(response.headers.iter().any(|(n, v)| n == "retry-after" && v == "2"), "{:?}", response.headers);
    assert_eq!(status(&again), Some(429));
    assert_eq!(w.tick(|_| granted(10)), 0, "no refill while the service said the budget is empty");
}

/// A grant of `n` tokens under an operator's override of `kind`.
pub(super) fn granted_under(n: u64, kind: &str) -> CalloutAnswer {
    let CalloutAnswer::Response { body, .. } = granted(n) else { unreachable!() };
    let body = String::from_utf8(body).unwrap();
    let body = body.trim_end().strip_suffix('}').unwrap().to_owned()
        + &format!(r#","override":{{"id":"ovr-00000000000000c1","kind":"{kind}"}}}}"#);
    CalloutAnswer::Response { status: 200, body: body.into_bytes() }
}

/// How long the lease of [`LEASED`] lives.
const DURATION: Nanos = Nanos::from_secs(2);

#[test]
fn a_lease_the_service_left_empty_for_long_asks_again_once_a_lease_duration_has_passed_so_a_bypass_is_obeyed_in_time() {
    let mut w = world();
    let pending = waiting(w.begin());
    // The caller's budget is empty for an hour: its requests are rejected without asking.
    let _ = w.tick(|_| nothing_granted(3_600_000));
    assert_eq!(status(&w.retry(pending)), Some(429));
    w.limiter.clock().advance(DURATION.saturating_sub(Nanos(1)));
    assert_eq!(status(&w.begin()), Some(429));
    assert_eq!(w.tick(|_| granted(10)), 0, "nothing is asked within a lease's duration");

    // An operator lets the caller through. Once a lease's duration has passed since the
    // last refill, one request asks again (and waits for the answer); the others are
    // still rejected at once with the service's wait.
    w.limiter.clock().advance(Nanos(1));
    let probe = waiting(w.begin());
    assert_eq!(status(&w.begin()), Some(429), "one probe at a time");
    assert_eq!(w.tick(|_| granted_under(10, "bypass")), 1);

    assert_eq!(status(&w.retry(probe)), Some(200), "the bypass is obeyed by the request that asked");
    assert_eq!(status(&w.begin()), Some(200));
    assert_eq!(w.metrics.get(0, Counter::OverrideBypassed), 2);
    assert_eq!(w.metrics.get(0, Counter::LeaseRefills), 2);
}

#[test]
fn a_probe_of_an_empty_lease_waits_for_its_answer_and_one_that_finds_it_still_empty_rejects_with_the_new_wait() {
    let mut w = world();
    let pending = waiting(w.begin());
    let _ = w.tick(|_| nothing_granted(3_600_000));
    let _ = w.retry(pending);
    w.limiter.clock().advance(DURATION);

    let probe = waiting(w.begin());
    let sent = w.engine.take_outgoing(&w.limiter, false);
    let probe = waiting(w.retry(probe));
    for call in sent {
        if let Some(out) = w.engine.dispatch_outgoing(call, &mut w.callouts, &w.limiter, &mut w.metrics) {
            w.engine.outgoing_answered(out, &nothing_granted(5_000), &w.limiter, &mut w.metrics, |_| true);
        }
    }
    let rejected = w.retry(probe);

    let Begun::Decided(Decided { outcome: Outcome::Reject(response), .. }) = rejected else {
        panic!("the budget is still empty: {rejected:?}")
    };
    assert!(response.headers.iter().any(|(n, v)| n == "retry-after" && v == "5"), "{:?}", response.headers);
    assert_eq!(status(&w.begin()), Some(429));
    assert_eq!(w.tick(|_| granted(10)), 0, "the next probe waits another lease duration");
    assert_eq!(w.metrics.plugin(PluginCounter::Waiting), 0);
}

#[test]
fn with_the_circuit_open_a_locked_out_caller_keeps_the_services_wait_rather_than_taking_the_failure_rule() {
    let mut w = world();
    let pending = waiting(w.begin());
    let _ = w.tick(|_| nothing_granted(3_600_000));
    let _ = w.retry(pending);
    w.limiter.clock().advance(DURATION);
    let now = w.limiter.clock().now();
    let breaker = &w.engine.0.service.as_ref().unwrap().breaker;
    for _ in 0..5 {
        let _ = breaker.record(w.limiter.store(), now, Some(false), now);
    }

    let decided = w.begin();

    assert_eq!(status(&decided), Some(429), "no probe can leave: the budget the service said is empty stands");
    assert_eq!(w.metrics.get(0, Counter::EmergencyAllowed), 0);
    assert_eq!(w.metrics.get(0, Counter::DegradedCircuitOpen), 0);
    assert_eq!(w.engine.take_outgoing(&w.limiter, false), Vec::new(), "no refill elected");
}

#[test]
fn a_failed_refill_sends_waiters_to_the_emergency_cap_and_what_it_admits_is_paid_back_after_recovery() {
    let mut w = world();
    let pending = waiting(w.begin());
    let _ = w.tick(|_| CalloutAnswer::Failed);

    let first = w.retry(pending);
    let second = w.begin();

    assert_eq!(status(&first), Some(200), "the emergency cap admits");
    assert_eq!(w.metrics.get(0, Counter::DegradedReset), 1);
    assert_eq!(w.metrics.get(0, Counter::EmergencyAllowed), 1);
    // The next request elects a new refill; the service is back.
    let pending = match second {
        Begun::Waiting(p) => p,
        Begun::Decided(_) => panic!("a new election: the request waits for it"),
    };
    let _ = w.tick(|call| match call {
        Outgoing::Charge(_) => charged(1),
        _ => granted(10),
    });
    assert_eq!(status(&w.retry(pending)), Some(200));
    // The refill was answered before the charge went: the one admission made without
    // the service is paid from the grant, and nothing is left to charge.
    assert_eq!(w.metrics.get(0, Counter::LeaseRepaid), 1);
    assert_eq!(w.metrics.get(0, Counter::LeaseReconciled), 0);
    assert!(!w.callouts.sent.iter().any(|c| c.headers.iter().any(|(n, v)| n == ":path" && v == "/v1/charge")));
}

pub(super) fn charged(n: u64) -> CalloutAnswer {
    let body = format!(
        r#"{{"charged":{n},"forgiven":0,"at_ns":1,"entry":{{"verdict":"allowed","limit":100,"remaining":49,
            "reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}}}}"#
    );
    CalloutAnswer::Response { status: 200, body: body.into_bytes() }
}

#[test]
fn a_wait_that_outlives_its_window_takes_the_failure_rule() {
    let mut w = world();
    let pending = waiting(w.begin());
    let _ = w.engine.take_outgoing(&w.limiter, false); // the refill never leaves (its worker died)

    w.limiter.clock().advance(Nanos::from_millis(149));
    let pending = waiting(w.retry(pending));
    w.limiter.clock().advance(Nanos::from_millis(1));
    let decided = w.retry(pending);

    assert_eq!(status(&decided), Some(200), "the emergency cap admits");
    assert_eq!(w.metrics.get(0, Counter::DegradedTimeout), 1);
    // The dead election has expired: the next request elects again.
    let _ = w.begin();
    assert_eq!(w.engine.take_outgoing(&w.limiter, false).len(), 1);
}

#[test]
fn a_wait_outrun_by_other_requests_while_refills_were_granted_is_checked_at_the_service_not_timed_out() {
    let mut w = world();
    let pending = waiting(w.begin());
    // The refill is granted to no waiter here (as another worker's would be), and other
    // requests spend all of it before the waiter tries again.
    for call in w.engine.take_outgoing(&w.limiter, true) {
        if let Some(sent) = w.engine.dispatch_outgoing(call, &mut w.callouts, &w.limiter, &mut w.metrics) {
            w.engine.outgoing_answered(sent, &granted(10), &w.limiter, &mut w.metrics, |_| false);
        }
    }
    for _ in 0..10 {
        assert_eq!(status(&w.begin()), Some(200));
    }
    w.limiter.clock().advance(Nanos::from_millis(150));

    let decided = w.retry(pending);

    assert!(!waiting(decided).waits_for_lease(), "it waits for its check at the service");
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedContended), 1);
    assert_eq!(w.metrics.get(0, Counter::DegradedLeaseContended), 0);
    assert_eq!(w.metrics.get(0, Counter::DegradedTimeout), 0, "the service answered");
}

#[test]
fn a_request_that_cannot_be_held_takes_the_failure_rule() {
    let mut w = world();
    let pending = waiting(w.begin());

    let decided = Begun::Decided(w.engine.overflow(pending, &w.limiter, true, &mut w.metrics));

    assert_eq!(status(&decided), Some(200));
    assert_eq!(w.metrics.get(0, Counter::DegradedLeaseQueueFull), 1);
    let next = waiting(w.begin());
    assert_eq!(w.engine.max_waiting(&next), 4);
}

#[test]
fn a_stream_that_ends_while_waiting_gives_nothing_and_loses_nothing() {
    let mut w = world();
    let pending = waiting(w.begin());

    w.engine.forget(pending, &w.limiter, &mut w.metrics);

    assert_eq!(w.metrics.plugin(PluginCounter::Waiting), 0);
    assert_eq!(w.metrics.get(0, Counter::Abandoned), 1);
}
