//! Lease-mode policies together and under stress: several lease policies on one
//! request, CAS exhaustion, debt charged and forgiven, held grants, slot changes, the
//! sweep, the open circuit.
use super::lease::*;
use crate::config::Config;
use crate::engine::request::resolve;
use crate::engine::resolved::Place;
use crate::engine::*;
use crate::host::{CalloutAnswer, Counter, PluginCounter};
use crate::testing::{FakeCallouts, FakeRequest, RecordedMetrics};
use shared_store::{Clock, HashKey, Limiter, Nanos, Store};
use shared_store::{ManualClock, MemoryStore};

/// A world on `config` (a lease configuration of the tests' own).
fn world_with(config: &str) -> World {
    World {
        engine: Engine::new(Config::from_json(config.as_bytes()).unwrap(), "sluice/t/r/", HashKey::new([1; 16]), env)
            .unwrap(),
        limiter: Limiter::new(MemoryStore::new(), ManualClock::at(Nanos::from_secs(1000))),
        callouts: FakeCallouts::default(),
        metrics: RecordedMetrics::default(),
    }
}

/// Two lease policies on one request: `route` (one slot, fails open) and `tenant`.
const TWO_LEASES: &str = r#"{
  "counter_service": {"cluster": "counter", "hash_key_env": "HASH", "timeout": "50ms"},
  "policies": [
    {"name": "route", "key": [{"header": "x-route"}], "rate": "100/second", "burst": 100, "slots": 1,
     "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 10, "low_water": 3}}, "on_failure": {"action": "allow"}},
    {"name": "tenant", "key": [{"header": "x-tenant"}], "rate": "100/second", "burst": 100,
     "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 10, "low_water": 3}}, "on_failure": {"action": "allow"}}
  ],
  "response": {"fallback_header": "x-sluice-fallback"}
}"#;

fn routed(route: &str, tenant: &str) -> FakeRequest {
    FakeRequest::get("/").with_header("x-route", route).with_header("x-tenant", tenant)
}

impl World {
    fn begin_with(&mut self, request: &FakeRequest) -> Begun {
        self.engine.begin(request, &self.limiter, &mut self.callouts, true, &mut self.metrics)
    }
}

#[test]
fn a_lease_policy_after_one_that_takes_its_failure_rule_is_still_decided() {
    let mut w = world_with(TWO_LEASES);
    // Route "a" holds the route policy's only slot with a live lease; tenant "t" has
    // spent its budget (the service granted it nothing).
    let first = waiting(w.begin_with(&routed("a", "t")));
    let _ = w.tick(|call| match call {
        Outgoing::Refill(target, _) if target.policy == 0 => granted(10),
        _ => nothing_granted(1500),
    });
    let _ = w.retry(first);

    // Route "b" finds the slot taken (set aside for a check at the service), and must
    // still meet the tenant's empty budget.
    let decided = w.begin_with(&routed("b", "t"));

    assert_eq!(status(&decided), Some(429), "the tenant's empty budget rejects, whatever the route policy did");
    assert_eq!(w.metrics.get(0, Counter::DegradedLeaseSlotTaken), 0, "not degraded: never decided");
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedSlotTaken), 0, "no check: the request was rejected first");
    assert_eq!(w.metrics.get(1, Counter::OverLimit), 2);
}

#[test]
fn a_lease_policy_after_one_that_takes_its_failure_rule_still_spends_its_own_lease() {
    let mut w = world_with(TWO_LEASES);
    let first = waiting(w.begin_with(&routed("a", "t")));
    let _ = w.tick(|_| granted(10));
    let _ = w.retry(first);
    let before = w.engine.0.leases(w.limiter.store()).peek(
        &match &resolve_lease(&w, &routed("b", "t"), 1) {
            Place::Global { lease: Some(slot), .. } => slot.clone(),
            _ => unreachable!(),
        },
        w.limiter.clock().now(),
    );

    // The route's slot is taken: the route policy is checked at the service.
    let pending = waiting(w.begin_with(&routed("b", "t")));
    let allowed = super::check::answer(true, &[super::check::entry("allowed", 5, 0)]);
    let decided = w.engine.complete(pending, &allowed, &w.limiter, &mut w.callouts, true, &mut w.metrics);

    let Begun::Decided(Decided { outcome: Outcome::Continue { headers, .. }, .. }) = decided else {
        panic!("admitted by the service's check of the route and the tenant's lease")
    };
    assert!(!headers.iter().any(|(n, _)| n == "x-sluice-fallback"), "{headers:?}");
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedSlotTaken), 1);
    let tokens = |r: Option<lease_record::Record>| r.map(|r| r.live_tokens(Nanos::from_secs(1000)));
    let after = w.engine.0.leases(w.limiter.store()).peek(
        &match &resolve_lease(&w, &routed("b", "t"), 1) {
            Place::Global { lease: Some(slot), .. } => slot.clone(),
            _ => unreachable!(),
        },
        w.limiter.clock().now(),
    );
    assert_eq!(tokens(before.unwrap()).map(|t| t - 1), tokens(after.unwrap()), "the tenant's lease paid for it");
}

/// Where policy `index` of `request` is.
fn resolve_lease(w: &World, request: &FakeRequest, index: usize) -> Place {
    let secrets =
        resolve::Secrets { local: &w.engine.0.secret, global: w.engine.0.service.as_ref().map(|s| &s.secret) };
    let resolution = resolve::resolve(&w.engine.0.policies, request, &secrets, &mut RecordedMetrics::default());
    resolution.leased.into_iter().find(|r| r.policy == index).map(|r| r.at).unwrap()
}

/// A store whose lease-record writes always lose their race.
struct ContendedLeases(MemoryStore);

impl Store for ContendedLeases {
    fn get(&self, key: &str) -> Result<Option<shared_store::Entry>, shared_store::StoreError> {
        self.0.get(key)
    }

    fn set(
        &self,
        key: &str,
        value: &[u8],
        cas: Option<shared_store::Cas>,
    ) -> Result<shared_store::Swap, shared_store::StoreError> {
        if key.contains("/l/") && self.0.get(key)?.is_some() {
            return Ok(shared_store::Swap::Conflict);
        }
        self.0.set(key, value, cas)
    }
}

#[test]
fn a_lease_record_that_keeps_losing_its_cas_race_is_counted_as_cas_exhausted_and_takes_the_failure_rule() {
    let engine =
        Engine::new(Config::from_json(LEASED.as_bytes()).unwrap(), "sluice/t/r/", HashKey::new([1; 16]), env).unwrap();
    let store = ContendedLeases(MemoryStore::new());
    // The record exists, so every write is a conditional one that conflicts.
    let limiter = Limiter::new(store, ManualClock::at(Nanos::from_secs(1000)));
    let mut metrics = RecordedMetrics::default();
    let _ = engine.begin(&acme(), &limiter, &mut FakeCallouts::default(), true, &mut metrics);
    // The first election has expired: the next request must write the record to elect.
    limiter.clock().advance(Nanos::from_millis(150));

    let decided = engine.begin(&acme(), &limiter, &mut FakeCallouts::default(), true, &mut metrics);

    assert_eq!(status(&decided), Some(200), "the emergency cap admits");
    assert_eq!(metrics.get(0, Counter::CasExhausted), 1);
    // The spend's attempts, then the debt's (which could not be recorded: forgiven).
    assert_eq!(metrics.get(0, Counter::CasConflicts), 2 * i64::from(lease_record::MAX_ATTEMPTS));
    assert_eq!(metrics.get(0, Counter::LeaseForgiven), 1);
    assert_eq!(metrics.get(0, Counter::StoreErrors), 0);
    assert_eq!(metrics.get(0, Counter::DegradedDispatchFailed), 0);
}

/// One lease slot, so that two callers collide.
const ONE_SLOT: &str = r#"{
  "counter_service": {"cluster": "counter", "hash_key_env": "HASH", "timeout": "50ms"},
  "policies": [{"name": "tenant", "key": [{"header": "x-tenant"}], "rate": "100/second", "burst": 100, "slots": 1,
                "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 10, "low_water": 3, "max_debt": 50}},
                "on_failure": {"action": "allow"}}],
  "response": {"fallback_header": "x-sluice-fallback"}
}"#;

fn tenant(id: &str) -> FakeRequest {
    FakeRequest::get("/").with_header("x-tenant", id)
}

#[test]
fn a_one_off_callers_outage_debt_is_charged_on_its_own_and_frees_its_slot() {
    let mut w = world_with(ONE_SLOT);
    // The service is down: a one-off caller is admitted by the failure rule and owes.
    let pending = waiting(w.begin_with(&tenant("one-off")));
    let _ = w.tick(|_| CalloutAnswer::Failed);
    assert_eq!(status(&w.retry(pending)), Some(200));

    // The service is back; the one-off caller never returns. The charge goes out anyway.
    let _ = w.tick(|call| match call {
        Outgoing::Charge(_) => charged(1),
        _ => granted(10),
    });
    let regular = w.begin_with(&tenant("regular"));

    assert_eq!(w.metrics.get(0, Counter::LeaseReconciled), 1);
    assert!(matches!(regular, Begun::Waiting(_)), "the regular caller got the slot and waits for its refill");
    assert_eq!(w.metrics.get(0, Counter::DegradedLeaseSlotTaken), 0);
}

#[test]
fn debt_the_service_never_takes_ages_out_of_its_slot_and_is_counted_as_forgiven() {
    let mut w = world_with(ONE_SLOT);
    let pending = waiting(w.begin_with(&tenant("one-off")));
    let _ = w.tick(|_| CalloutAnswer::Failed);
    let _ = w.retry(pending);
    // Its slot is taken: checked at the service, which does not answer either.
    let check = waiting(w.begin_with(&tenant("regular")));
    let taken = w.engine.complete(check, &CalloutAnswer::TimedOut, &w.limiter, &mut w.callouts, true, &mut w.metrics);

    w.limiter.clock().advance(lease_record::DEBT_LIFE);
    let later = w.begin_with(&tenant("regular"));

    assert_eq!(status(&taken), Some(200), "taken at first, and its check unanswered: the failure rule admits it");
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedSlotTaken), 1);
    assert_eq!(w.metrics.get(0, Counter::DegradedTimeout), 1);
    assert!(matches!(later, Begun::Waiting(_)), "after the debt's life the slot changed hands");
    // The one-off caller's aged debt, and the regular caller's first admission (its slot
    // was taken, so nothing could be owed for it).
    assert_eq!(w.metrics.get(0, Counter::LeaseForgiven), 2);
}

#[test]
fn a_charge_whose_answer_never_came_is_sent_again_with_the_same_id_and_the_same_units() {
    let mut w = world_with(ONE_SLOT);
    let pending = waiting(w.begin_with(&tenant("acme")));
    let _ = w.tick(|_| CalloutAnswer::Failed);
    let _ = w.retry(pending);

    let _ = w.tick(|call| match call {
        Outgoing::Charge(_) => CalloutAnswer::TimedOut,
        _ => granted(10),
    });
    let first = w.last_body("/v1/charge");
    // Another admission under the failure rule while the charge is unanswered.
    let _ = w.tick(|_| CalloutAnswer::Failed);
    w.limiter.clock().advance(Nanos::from_millis(150));
    let _ = w.tick(|call| match call {
        Outgoing::Charge(_) => charged(1),
        _ => granted(10),
    });
    let second = w.last_body("/v1/charge");

    assert_eq!(first["cost"], 1);
    assert_eq!(second["cost"], 1, "the same units: what it carried is reserved");
    assert_eq!(first["charge_id"], second["charge_id"], "the same id: the service applies it once");
    assert_eq!(w.metrics.get(0, Counter::LeaseReconciled), 1);
}

#[test]
fn a_grant_a_waiter_elected_is_spent_by_it_even_when_other_requests_arrive_first() {
    let mut w = world();
    let pending = waiting(w.begin());
    // The grant covers exactly one request: the waiter's.
    let _ = w.tick(|_| granted(1));

    let newcomer = w.begin();
    let waiter = w.retry(pending);

    assert!(matches!(newcomer, Begun::Waiting(_)), "the newcomer waits for a refill of its own");
    assert_eq!(status(&waiter), Some(200));
}

#[test]
fn a_refill_asks_for_at_least_what_the_waiting_request_costs() {
    let config = LEASED.replace(r#""burst": 100,"#, r#""burst": 100, "cost": {"header": "x-cost", "max": 10},"#);
    let mut w = world_with(&config);
    let request = acme().with_header("x-cost", "7");

    let _ = waiting(w.begin_with(&request));
    let _ = w.tick(|_| nothing_granted(300));

    assert_eq!(w.last_body("/v1/lease")["min_tokens"], 7);
    assert_eq!(w.last_body("/v1/lease")["tokens"], 10, "its demand at its rate (7 at once), capped at the size");
}

#[test]
fn a_lease_policy_cannot_change_its_slots_without_a_new_version() {
    let store = MemoryStore::new();
    let engine = |config: &str| {
        Engine::new(Config::from_json(config.as_bytes()).unwrap(), "sluice/t/r/", HashKey::new([1; 16]), env).unwrap()
    };
    engine(ONE_SLOT).claim_tables(&store).unwrap();

    let changed = engine(&ONE_SLOT.replace(r#""slots": 1"#, r#""slots": 2"#)).claim_tables(&store);
    let bumped = engine(&ONE_SLOT.replace(r#""slots": 1"#, r#""slots": 2, "version": 1"#)).claim_tables(&store);

    let error = changed.unwrap_err().to_string();
    assert!(error.starts_with("policies[0].slots: policy \"tenant\" version 0 already has 1 slots"), "{error}");
    assert!(bumped.is_ok());
}

#[test]
fn debt_owed_under_an_earlier_configuration_is_found_by_the_sweep_and_charged() {
    let mut w = world_with(ONE_SLOT);
    let pending = waiting(w.begin_with(&tenant("one-off")));
    let _ = w.tick(|_| CalloutAnswer::Failed);
    let _ = w.retry(pending);
    // The proxy is reconfigured before the charge goes out: a new engine, which never
    // saw the debt, on the same shared data.
    let before = std::mem::replace(
        &mut w.engine,
        Engine::new(Config::from_json(ONE_SLOT.as_bytes()).unwrap(), "sluice/t/r/", HashKey::new([1; 16]), env)
            .unwrap(),
    );
    drop(before);

    w.engine.sweep_debts(&w.limiter);
    let sent = w.tick(|_| charged(1));

    assert_eq!(sent, 1, "the sweep found the debt");
    assert_eq!(w.last_body("/v1/charge")["cost"], 1);
    assert_eq!(w.metrics.get(0, Counter::LeaseReconciled), 1);
}

#[test]
fn with_the_circuit_open_a_request_that_finds_its_lease_empty_takes_the_failure_rule_at_once() {
    let mut w = world_with(ONE_SLOT);
    // Refills (and the charges of what the failure rule admitted) fail: the circuit opens.
    for _ in 0..5 {
        if w.metrics.plugin(PluginCounter::CircuitOpened) > 0 {
            break;
        }
        let pending = waiting(w.begin_with(&tenant("acme")));
        let _ = w.tick(|call| match call {
            Outgoing::Refill(..) => CalloutAnswer::Failed,
            _ => CalloutAnswer::TimedOut,
        });
        let _ = w.retry(pending);
    }
    assert_eq!(w.metrics.plugin(PluginCounter::CircuitOpened), 1);

    let decided = w.begin_with(&tenant("acme"));

    assert!(matches!(decided, Begun::Decided(_)), "no wait for a refill that cannot be sent");
    assert_eq!(w.metrics.get(0, Counter::DegradedCircuitOpen), 1);
    assert_eq!(w.engine.take_outgoing(&w.limiter, false), Vec::new(), "no refill elected");
}

#[test]
fn a_grant_that_empties_the_budget_serves_its_waiter_and_rejects_the_next_with_the_services_wait() {
    let mut w = world();
    let pending = waiting(w.begin());
    let last_token = r#"{"granted":1,"expires_in_ms":2000,"at_ns":1,"refill_after_ns":300000000,"entry":{"verdict":"allowed",
        "limit":100,"remaining":0,"reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}}"#;
    let _ = w.tick(|_| CalloutAnswer::Response { status: 200, body: last_token.as_bytes().to_vec() });

    let waiter = w.retry(pending);
    let next = w.begin();

    assert_eq!(status(&waiter), Some(200));
    let Begun::Decided(Decided { outcome: Outcome::Reject(response), .. }) = next else {
        panic!("the next request must not wait for a refill the service said cannot be granted yet")
    };
    assert_eq!(response.status, 429);
    assert!(response.headers.iter().any(|(n, v)| n == "retry-after" && v == "1"), "{:?}", response.headers);
    assert_eq!(w.tick(|_| granted(10)), 0, "no refill until the service's wait has passed");
}

/// One lease policy whose counters live under a partition (the caller's tenant), one slot,
/// failing open, with a cost the response reports.
const PARTITIONED: &str = r#"{
  "counter_service": {"cluster": "counter", "hash_key_env": "HASH", "timeout": "50ms",
                      "partition": [{"header": "x-tenant"}]},
  "policies": [{"name": "tenant", "key": [{"header": "x-tenant"}], "rate": "100/second", "burst": 100, "slots": 1,
                "cost": {"response_header": "x-usage", "estimate": 1, "max": 50},
                "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 30, "low_water": 3, "max_debt": 100}},
                "on_failure": {"action": "allow"}}]
}"#;

/// A request whose `x-tenant` header reads once and then fails as a host error would:
/// its key is read, its partition is not.
struct PartitionUnread {
    request: FakeRequest,
    reads: std::cell::Cell<u32>,
}

impl crate::host::RequestFacts for PartitionUnread {
    fn header(&self, name: &str) -> Result<Option<Vec<u8>>, crate::host::HostFailure> {
        if name == "x-tenant" {
            self.reads.set(self.reads.get() + 1);
            if self.reads.get() > 1 {
                return Err(crate::host::HostFailure { status: 2 });
            }
        }
        self.request.header(name)
    }

    fn property(&self, path: &[&str]) -> Result<Option<Vec<u8>>, crate::host::HostFailure> {
        self.request.property(path)
    }
}

#[test]
fn what_the_failure_rule_admits_when_the_partition_cannot_be_read_is_owed_to_no_counter_and_counted_as_forgiven() {
    let mut w = world_with(PARTITIONED);
    let request = PartitionUnread { request: tenant("acme"), reads: std::cell::Cell::new(0) };

    let decided = w.engine.begin(&request, &w.limiter, &mut w.callouts, true, &mut w.metrics);
    let Begun::Decided(Decided { outcome: Outcome::Continue { .. }, owed, .. }) = decided else {
        panic!("the failure rule (allow) admits: {decided:?}")
    };
    // Its response costs 20 (1 spent on the estimate): 19 more.
    for owed in &owed {
        w.engine.settle_cost(owed, Some(20), &w.limiter, &mut w.metrics);
    }
    // The service answers again; the sweep reads every slot.
    w.engine.sweep_debts(&w.limiter);
    let _ = w.tick(|_| charged(20));

    assert_eq!(w.metrics.get(0, Counter::ReadFailures), 1);
    assert_eq!(w.metrics.get(0, Counter::FailureAllowed), 1);
    let charges: Vec<&str> = w
        .callouts
        .sent
        .iter()
        .filter(|c| c.headers.iter().any(|(n, v)| n == ":path" && v == "/v1/charge"))
        .map(|c| c.body.as_str())
        .collect();
    assert_eq!(charges, Vec::<&str>::new(), "its counter's tag is unknown: no charge to a phantom counter");
    assert_eq!(w.metrics.get(0, Counter::LeaseReconciled), 0);
    assert_eq!(w.metrics.get(0, Counter::LeaseForgiven), 1, "the estimate the failure rule admitted");
    assert_eq!(w.metrics.get(0, Counter::CostForgiven), 19, "the response's cost above it");
    assert_eq!(w.metrics.get(0, Counter::CostCharged), 0);
}

/// The live tokens of policy `index`'s lease for `request`.
fn lease_tokens(w: &World, request: &FakeRequest, index: usize) -> u64 {
    let Place::Global { lease: Some(slot), .. } = resolve_lease(w, request, index) else { unreachable!() };
    let now = w.limiter.clock().now();
    w.engine.0.leases(w.limiter.store()).peek(&slot, now).unwrap().map_or(0, |r| r.live_tokens(now))
}

#[test]
fn a_stream_that_ends_while_one_lease_waits_gives_back_what_its_other_lease_spent_as_a_rejection_would() {
    let mut w = world_with(TWO_LEASES);
    let first = waiting(w.begin_with(&routed("a", "t")));
    let _ = w.tick(|_| granted(10));
    assert_eq!(status(&w.retry(first)), Some(200));
    let before = lease_tokens(&w, &routed("a", "u"), 0);

    // Route "a" has tokens; tenant "u" has none yet: the request spends the route's lease,
    // then waits for the tenant's refill, and its client leaves.
    let pending = waiting(w.begin_with(&routed("a", "u")));
    assert_eq!(lease_tokens(&w, &routed("a", "u"), 0), before - 1, "the route's lease paid for it");
    w.engine.forget(pending, &w.limiter, &mut w.metrics);

    assert_eq!(lease_tokens(&w, &routed("a", "u"), 0), before, "never forwarded: its spend is given back");
    assert_eq!(w.metrics.get(0, Counter::Abandoned), 1);
    assert_eq!(w.metrics.get(0, Counter::Rejected), 1);
}

/// A lease policy whose cost the response reports, estimated from `x-cost`; fails open.
const COSTED: &str = r#"{
  "counter_service": {"cluster": "counter", "hash_key_env": "HASH", "timeout": "50ms"},
  "policies": [{"name": "tenant", "key": [{"header": "x-tenant"}], "rate": "100/second", "burst": 100,
                "cost": {"response_header": "x-usage", "estimate": {"header": "x-cost", "max": 20}, "max": 50},
                "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 30, "low_water": 3, "max_debt": 100}},
                "on_failure": {"action": "allow"}}]
}"#;

#[test]
fn what_the_failure_rule_admits_and_the_response_leaves_unused_lowers_the_debt_and_never_becomes_lease_tokens() {
    let mut w = world_with(COSTED);
    let small = tenant("acme").with_header("x-cost", "1");
    let first = waiting(w.begin_with(&small));
    let _ = w.tick(|_| granted(10));
    assert_eq!(status(&w.retry(first)), Some(200));
    let live = lease_tokens(&w, &small, 0);
    // 20 is more than the lease holds: the request waits for a refill, which fails, and
    // the failure rule (allow) admits it, owing its estimate to the record.
    let big = tenant("acme").with_header("x-cost", "20");
    let pending = waiting(w.begin_with(&big));
    let _ = w.tick(|_| CalloutAnswer::Failed);
    let Begun::Decided(Decided { outcome: Outcome::Continue { .. }, owed, .. }) = w.retry(pending) else {
        panic!("the failure rule admits")
    };

    // Its response reports 2: 18 of the estimate were not used.
    for owed in &owed {
        w.engine.settle_cost(owed, Some(2), &w.limiter, &mut w.metrics);
    }

    let now = w.limiter.clock().now();
    let Place::Global { lease: Some(slot), .. } = resolve_lease(&w, &big, 0) else { unreachable!() };
    let record = w.engine.0.leases(w.limiter.store()).peek(&slot, now).unwrap().expect("a record");
    assert_eq!(live, 9);
    assert_eq!(record.live_tokens(now), live, "the service granted none of those 18: they are no tokens");
    assert_eq!(record.debt, 2, "the admission owes what its response used");
    assert_eq!(w.metrics.get(0, Counter::CostCredited), 18);
}
