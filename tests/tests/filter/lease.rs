//! Lease mode in wasm-host, on a virtual clock with a scripted service: one refill in
//! flight per proxy, sent by the root context and landing for every worker's waiting
//! requests; an elected refill that never returns releases its waiters through the
//! failure rule and lets another election happen; waits bounded per worker.

use super::*;
use sluice::host::Counter;
use std::sync::{Arc, Mutex};
use wasm_host::{Answer, HostBuilder, Outcome, StreamId};

const CONFIG: &str = r#"{
  "counter_service": {"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY", "timeout": "50ms"},
  "policies": [{"name": "tenant", "key": [{"header": "x-tenant"}], "rate": "100/second", "burst": 100,
                "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 10, "duration": "2s", "low_water": 3, "max_waiting": 2}},
                "on_failure": {"action": "deny", "emergency": {"rate": "1/hour", "burst": 5}}}],
  "response": {"fallback_header": "x-sluice-fallback"}
}"#;

const GRANT: &str = r#"{"granted":10,"expires_in_ms":2000,"at_ns":1,"entry":{"verdict":"allowed","limit":100,
  "remaining":90,"reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}}"#;

fn leasing(answer: impl Fn() -> Answer + Send + Sync + 'static) -> (HostBuilder, Arc<Mutex<Vec<String>>>) {
    let paths = Arc::new(Mutex::new(Vec::new()));
    let seen = paths.clone();
    let builder = builder(CONFIG)
        .env("SLUICE_HASH_KEY", "fleet-hash-key-0123456789abcdef")
        .workers(2)
        .scripted_cluster("sluice-counter", move |call| {
            seen.lock()
                .unwrap()
                .push(String::from_utf8_lossy(call.headers.get(":path").unwrap_or_default()).into_owned());
            answer()
        });
    (builder, paths)
}

fn tenant() -> Request {
    Request::get("/").header("x-tenant", "acme")
}

fn forwarded(host: &mut Host, worker: usize, stream: StreamId) -> bool {
    matches!(host.worker(worker).outcome(stream).unwrap(), Outcome::Forwarded(_))
}

/// The fallback header the client sees (answering a forwarded request with 200 first).
fn fallback(host: &mut Host, worker: usize, stream: StreamId) -> Option<String> {
    if matches!(host.worker(worker).outcome(stream).unwrap(), Outcome::Forwarded(_)) {
        host.worker(worker).respond(stream, Response::ok()).unwrap();
    }
    match host.worker(worker).outcome(stream).unwrap() {
        Outcome::Responded(response) => response.headers.get_str("x-sluice-fallback").map(str::to_owned),
        other => panic!("expected an answer, got {other:?}"),
    }
}

#[test]
fn one_refill_is_in_flight_per_proxy_and_every_workers_waiting_requests_spend_it() {
    let (builder, paths) = leasing(|| Answer::status(200).body(GRANT).after(millis(30)));
    let mut host = builder.build().unwrap();
    let first = host.worker(0).request(tenant());
    let second = host.worker(1).request(tenant());

    host.advance(millis(10));
    let sent = paths.lock().unwrap().clone();
    host.advance(millis(50));

    assert_eq!(sent, ["/v1/lease"], "one refill, sent by the root of the worker that elected it");
    assert!(forwarded(&mut host, 0, first) && forwarded(&mut host, 1, second), "both waiters spent the grant");
    assert_eq!(metric(&host, "tenant", Counter::LeaseGranted), 10);
    // Eight left: spent locally, with no callout, until the low-water mark elects again,
    // and the refill goes out at once.
    let statuses: Vec<u16> = (0..5).map(|_| status(&mut host, tenant())).collect();
    assert_eq!(statuses, [200; 5]);
    assert_eq!(paths.lock().unwrap().len(), 1);
    assert_eq!(status(&mut host, tenant()), 200);
    assert_eq!(paths.lock().unwrap().len(), 2, "below 3 left, one refill was elected and sent");
}

#[test]
fn a_refill_that_never_returns_releases_its_waiters_through_the_failure_rule_and_another_is_elected() {
    let (builder, paths) = leasing(Answer::never);
    let mut host = builder.ignore_callout_timeouts().build().unwrap();
    let first = host.worker(0).request(tenant());
    let second = host.worker(1).request(tenant());

    // The election holds the callout's deadline (50 ms) and a margin (100 ms).
    host.advance(millis(140));
    let still =
        host.worker(0).outcome(first).unwrap().is_paused() && host.worker(1).outcome(second).unwrap().is_paused();
    host.advance(millis(20));

    assert!(still, "released before the election's deadline");
    assert_eq!(fallback(&mut host, 0, first).as_deref(), Some("emergency; reason=timeout; policies=tenant"));
    assert_eq!(fallback(&mut host, 1, second).as_deref(), Some("emergency; reason=timeout; policies=tenant"));
    let refills = || paths.lock().unwrap().iter().filter(|p| *p == "/v1/lease").count();
    assert_eq!(refills(), 1);
    let _third = host.worker(0).request(tenant());
    assert_eq!(refills(), 2, "the dead election expired: a new refill went out at once");
}

#[test]
fn a_worker_holds_at_most_max_waiting_requests_for_a_refill() {
    let (builder, _) = leasing(Answer::never);
    let mut host = builder.build().unwrap();
    let held: Vec<StreamId> = (0..2).map(|_| host.worker(0).request(tenant())).collect();

    let third = send(&mut host, tenant());

    assert!(held.iter().all(|s| host.worker(0).outcome(*s).unwrap().is_paused()));
    assert_eq!(third.header_str("x-sluice-fallback"), Some("emergency; reason=lease_queue_full; policies=tenant"));
    assert_eq!(metric(&host, "tenant", Counter::DegradedLeaseQueueFull), 1);
}

/// A lease answer of `granted` tokens (0: the budget is spent, for `retry_ms`).
fn lease_answer(granted: u64, retry_ms: u64) -> Answer {
    let verdict = if granted == 0 { "rejected" } else { "allowed" };
    Answer::status(200).body(format!(
        r#"{{"granted":{granted},"expires_in_ms":2000,"at_ns":1,"entry":{{"verdict":"{verdict}","limit":100,
            "remaining":0,"reset_after_ns":1,"retry_after_ns":{},"delay_ns":0}}}}"#,
        retry_ms * 1_000_000
    ))
}

/// The JSON body of a callout.
fn body(call: &wasm_host::CalloutRequest) -> serde_json::Value {
    serde_json::from_slice(&call.body).unwrap_or_default()
}

const ROUTE_AND_TENANT: &str = r#"{
  "counter_service": {"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY", "timeout": "50ms"},
  "policies": [
    {"name": "route", "key": [{"header": "x-route"}], "rate": "100/second", "burst": 100, "slots": 1,
     "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 10, "low_water": 3}}, "on_failure": {"action": "allow"}},
    {"name": "tenant", "key": [{"header": "x-tenant"}], "rate": "50/second", "burst": 50,
     "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 10, "low_water": 3}}, "on_failure": {"action": "allow"}}],
  "response": {"fallback_header": "x-sluice-fallback"}
}"#;

#[test]
fn a_second_lease_policy_is_decided_when_the_first_finds_its_slot_taken() {
    // The route budget grants; the tenant's is spent.
    let mut host = builder(ROUTE_AND_TENANT)
        .env("SLUICE_HASH_KEY", "fleet-hash-key-0123456789abcdef")
        .scripted_cluster("sluice-counter", |call| {
            let spent = body(call)["limit"]["burst"] == 50;
            lease_answer(if spent { 0 } else { 10 }, 1500).after(millis(1))
        })
        .build()
        .unwrap();
    let first = host.worker(0).request(Request::get("/").header("x-route", "a").header("x-tenant", "t"));
    host.advance(millis(30));
    assert_eq!(host.worker(0).outcome(first).unwrap().response().map(|r| r.status), Some(429));

    // Route "a" holds the route policy's only slot; route "b" is set aside for a check
    // at the service, and must still meet the tenant's spent budget, which rejects it
    // before any check.
    let second = send(&mut host, Request::get("/").header("x-route", "b").header("x-tenant", "t"));

    assert_eq!(
        second.status(),
        Some(429),
        "admitted past the tenant's budget: {:?}",
        second.header_str("x-sluice-fallback")
    );
    assert_eq!(metric(&host, "route", Counter::DegradedLeaseSlotTaken), 0, "never degraded");
    assert_eq!(metric(&host, "route", Counter::LeaseCheckedSlotTaken), 0, "rejected before any check");
    assert_eq!(metric(&host, "tenant", Counter::OverLimit), 2);
    assert_accounting(&host, "route");
    assert_accounting(&host, "tenant");
}

const TWO_QUEUES: &str = r#"{
  "counter_service": {"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY", "timeout": "50ms"},
  "policies": [
    {"name": "a", "key": [{"header": "x-a"}], "on_missing_key": "skip", "rate": "100/second", "burst": 100,
     "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 10, "max_waiting": 4}}, "on_failure": {"action": "deny"}},
    {"name": "b", "key": [{"header": "x-b"}], "on_missing_key": "skip", "rate": "100/second", "burst": 100,
     "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 10, "max_waiting": 64}}, "on_failure": {"action": "deny"}}],
  "response": {"fallback_header": "x-sluice-fallback"}
}"#;

#[test]
fn a_waiting_request_keeps_its_place_when_a_tick_retries_it_behind_a_longer_queue() {
    // The service is paused: refills never answer, the host never times them out.
    let mut host = builder(TWO_QUEUES)
        .env("SLUICE_HASH_KEY", "fleet-hash-key-0123456789abcdef")
        .scripted_cluster("sluice-counter", |_| Answer::never())
        .ignore_callout_timeouts()
        .build()
        .unwrap();
    let first = host.worker(0).request(Request::get("/").header("x-a", "1"));
    let others: Vec<StreamId> = (0..10).map(|_| host.worker(0).request(Request::get("/").header("x-b", "1"))).collect();

    // Ticks retry the first behind ten of the longer queue; then the waits run out.
    host.advance(millis(20));
    let still_waiting = host.worker(0).outcome(first).unwrap().is_paused();
    host.advance(secs(1));

    assert!(still_waiting, "it waits for its refill, as the others do");
    for stream in std::iter::once(first).chain(others) {
        let outcome = host.worker(0).outcome(stream).unwrap();
        assert!(!outcome.is_paused(), "a decision made on a tick was dropped: the stream stays paused");
    }
    assert_eq!(metric(&host, "a", Counter::DegradedTimeout), 1, "it took its failure rule at its deadline");
    assert_accounting(&host, "a");
    assert_accounting(&host, "b");
}

const QUICK_REFILLS: &str = r#"{
  "counter_service": {"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY", "timeout": "50ms"},
  "policies": [{"name": "tenant", "key": [{"header": "x-tenant"}], "rate": "1000/second", "burst": 1000,
                "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 2, "low_water": 0}}, "on_failure": {"action": "deny"}}],
  "response": {"fallback_header": "x-sluice-fallback"}
}"#;

#[test]
fn a_request_that_waits_for_its_refill_waits_one_round_trip_on_its_worker_and_one_tick_more_on_others() {
    let rtt = millis(1);
    let mut host = builder(QUICK_REFILLS)
        .env("SLUICE_HASH_KEY", "fleet-hash-key-0123456789abcdef")
        .workers(2)
        .scripted_cluster("sluice-counter", move |_| lease_answer(2, 0).after(rtt))
        .build()
        .unwrap();
    // Let the ticks settle into a phase, then start between two of them.
    host.advance(millis(13));

    let mut waits = Vec::new();
    for _ in 0..5 {
        // Each pair spends a whole grant: every first request finds the lease empty.
        let elector = host.worker(0).request(tenant());
        let other = host.worker(1).request(tenant());
        host.advance(rtt);
        let elector_done = !host.worker(0).outcome(elector).unwrap().is_paused();
        let mut other_after = rtt;
        while host.worker(1).outcome(other).unwrap().is_paused() && other_after < millis(100) {
            host.advance(millis(1));
            other_after += millis(1);
        }
        waits.push((elector_done, other_after));
        host.worker(0).respond(elector, Response::ok()).unwrap();
        host.worker(1).respond(other, Response::ok()).unwrap();
        host.advance(millis(7));
    }

    assert!(waits.iter().all(|(done, _)| *done), "the electing worker's request waited longer than the round trip");
    assert!(
        waits.iter().all(|(_, after)| *after <= rtt + millis(10)),
        "another worker's request waited longer than the round trip and one tick: {waits:?}"
    );
    assert_eq!(metric(&host, "tenant", Counter::DegradedTimeout), 0);
}

const ONE_LEASE_SLOT: &str = r#"{
  "counter_service": {"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY", "timeout": "50ms",
                      "circuit_breaker": {"failures": 100}},
  "policies": [{"name": "tenant", "key": [{"header": "x-tenant"}], "rate": "100/second", "burst": 100, "slots": 1,
                "global": {"strategy": "lease", "lease": {"cold_below": 0, "size": 10, "low_water": 3}}, "on_failure": {"action": "allow"}}],
  "response": {"fallback_header": "x-sluice-fallback"}
}"#;

#[test]
fn a_one_off_callers_outage_debt_is_charged_once_the_service_is_back_and_its_slot_serves_others() {
    let down = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let paths = Arc::new(Mutex::new(Vec::new()));
    let (down_, paths_) = (down.clone(), paths.clone());
    let charged = r#"{"charged":1,"forgiven":0,"at_ns":1,"entry":{"verdict":"allowed","limit":100,"remaining":90,
        "reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}}"#;
    let mut host = builder(ONE_LEASE_SLOT)
        .env("SLUICE_HASH_KEY", "fleet-hash-key-0123456789abcdef")
        .scripted_cluster("sluice-counter", move |call| {
            let path = String::from_utf8_lossy(call.headers.get(":path").unwrap_or_default()).into_owned();
            paths_.lock().unwrap().push(path.clone());
            if down_.load(std::sync::atomic::Ordering::SeqCst) {
                Answer::refused()
            } else if path == "/v1/charge" {
                Answer::status(200).body(charged).after(millis(1))
            } else {
                lease_answer(10, 0).after(millis(1))
            }
        })
        .build()
        .unwrap();
    // During the outage a one-off caller is admitted by the failure rule: it owes.
    let one_off = host.worker(0).request(Request::get("/").header("x-tenant", "one-off"));
    host.advance(millis(200));
    assert!(forwarded(&mut host, 0, one_off), "the failure rule (allow) admitted it");

    // The service is back; the one-off caller never returns. (A charge refused during
    // the outage is sent again once its window, the deadline and 100 ms, has passed.)
    down.store(false, std::sync::atomic::Ordering::SeqCst);
    host.advance(millis(200));
    let regular = host.worker(0).request(tenant());
    host.advance(millis(10));

    assert!(paths.lock().unwrap().iter().any(|p| p == "/v1/charge"), "the debt was charged on its own");
    assert_eq!(metric(&host, "tenant", Counter::LeaseReconciled), 1);
    assert!(forwarded(&mut host, 0, regular), "the slot serves the next caller: no lease_slot_taken");
    assert_eq!(metric(&host, "tenant", Counter::DegradedLeaseSlotTaken), 0);
}

#[test]
fn a_lease_policy_cannot_change_its_slots_without_a_version_bump() {
    let mut host = builder(ONE_LEASE_SLOT).env("SLUICE_HASH_KEY", "fleet-hash-key-0123456789abcdef").build().unwrap();

    let changed = host.reconfigure(ONE_LEASE_SLOT.replace(r#""slots": 1"#, r#""slots": 4"#));
    let bumped = host.reconfigure(ONE_LEASE_SLOT.replace(r#""slots": 1"#, r#""slots": 4, "version": 1"#));

    let error = changed.expect_err("its records would move to other slots").to_string();
    assert!(error.contains("policies[0].slots"), "{error}");
    assert!(bumped.is_ok());
}

/// The body of an admission of a check (`/v1/check`, or of each of a batch's on
/// `/v1/checks`), or of [`GRANT`] for a refill.
fn admit_or_grant_body(call: &wasm_host::CalloutRequest) -> String {
    let allowed = r#"{"admitted":true,"at_ns":1,"entries":[{"verdict":"allowed","limit":100,"remaining":99,
        "reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}]}"#;
    match call.headers.get_str(":path") {
        Some("/v1/lease") => GRANT.to_owned(),
        Some("/v1/checks") => {
            let checks: serde_json::Value = serde_json::from_slice(&call.body).unwrap();
            let n = checks["checks"].as_array().map_or(0, Vec::len);
            format!(r#"{{"results":[{}]}}"#, vec![allowed; n].join(","))
        }
        _ => allowed.to_owned(),
    }
}

/// [`admit_or_grant_body`], 10 ms after the call is sent.
fn admit_or_grant(call: &wasm_host::CalloutRequest) -> Answer {
    Answer::status(200).header("content-type", "application/json").body(admit_or_grant_body(call)).after(millis(10))
}

#[test]
fn keys_seen_for_the_first_time_are_checked_together_and_a_key_is_leased_from_its_fourth_unit() {
    // The shipped default (`cold_below` 4), one check call in flight per worker.
    let config = CONFIG
        .replace(r#""cold_below": 0, "#, "")
        .replace(r#""timeout": "50ms""#, r#""timeout": "50ms", "max_checks_in_flight": 1"#);
    let paths = Arc::new(Mutex::new(Vec::new()));
    let seen = paths.clone();
    let mut host = builder(&config)
        .env("SLUICE_HASH_KEY", "fleet-hash-key-0123456789abcdef")
        .scripted_cluster("sluice-counter", move |call| {
            seen.lock().unwrap().push(call.headers.get_str(":path").unwrap_or_default().to_owned());
            admit_or_grant(call)
        })
        .build()
        .unwrap();
    let caller = |name: &str| Request::get("/").header("x-tenant", name);

    // Three new callers at once: the first check goes out alone, the other two wait for
    // it and go out together.
    let new: Vec<StreamId> = ["a", "b", "c"].iter().map(|name| host.worker(0).request(caller(name))).collect();
    host.advance(millis(30));
    let new_callers = paths.lock().unwrap().clone();
    // One caller that keeps coming: three checks, then a lease.
    let acme: Vec<bool> = (0..4)
        .map(|_| {
            let stream = host.worker(0).request(caller("acme"));
            host.advance(millis(20));
            forwarded(&mut host, 0, stream)
        })
        .collect();
    let all = paths.lock().unwrap().clone();

    assert!(new.iter().all(|&stream| forwarded(&mut host, 0, stream)), "each admitted by the service");
    assert_eq!(new_callers, ["/v1/check", "/v1/checks"], "checked, two of them in one call; nothing leased");
    assert_eq!(acme, [true; 4], "each admitted, the fourth from its lease");
    assert_eq!(&all[2..], ["/v1/check", "/v1/check", "/v1/check", "/v1/lease"]);
    assert_eq!(metric(&host, "tenant", Counter::LeaseCheckedCold), 6);
    assert_eq!(metric(&host, "tenant", Counter::LeaseGranted), 10);
    assert_accounting(&host, "tenant");
}

/// A grant of 10 for 2 s that left the budget short (3 left), so the grant is reviewed.
const SHORT_GRANT: &str = r#"{"granted":10,"expires_in_ms":2000,"at_ns":1,"entry":{"verdict":"allowed","limit":100,
  "remaining":3,"reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}}"#;

#[test]
fn a_lease_whose_key_went_quiet_returns_what_its_demand_will_not_spend_before_it_expires() {
    // The shipped default (`cold_below` 4): the key's fourth request elects the refill.
    let config = CONFIG.replace(r#""cold_below": 0, "#, "");
    let calls = Arc::new(Mutex::new(Vec::new()));
    let seen = calls.clone();
    let mut host = builder(&config)
        .env("SLUICE_HASH_KEY", "fleet-hash-key-0123456789abcdef")
        .scripted_cluster("sluice-counter", move |call| {
            let path = call.headers.get_str(":path").unwrap_or_default().to_owned();
            let body: serde_json::Value = serde_json::from_slice(&call.body).unwrap_or_default();
            seen.lock().unwrap().push((path.clone(), body.clone()));
            let answer = match path.as_str() {
                "/v1/lease" => SHORT_GRANT.to_owned(),
                "/v1/credit" => format!(
                    r#"{{"credited":{},"forgiven":0,"at_ns":1,"entry":{{"verdict":"allowed","limit":100,
                        "remaining":50,"reset_after_ns":1,"retry_after_ns":0,"delay_ns":0}}}}"#,
                    body["units"]
                ),
                _ => admit_or_grant_body(call),
            };
            Answer::status(200).header("content-type", "application/json").body(answer).after(millis(2))
        })
        .build()
        .unwrap();
    // Four requests within 40 ms: three checked, the fourth leased 10 and spends one.
    for _ in 0..4 {
        let stream = host.worker(0).request(tenant());
        host.advance(millis(10));
        assert!(forwarded(&mut host, 0, stream));
    }
    let leased = calls.lock().unwrap().len();

    // Quiet until less than a quarter of the grant's life is left, and past it.
    host.advance(millis(1600));
    let after_quiet: Vec<(String, serde_json::Value)> = calls.lock().unwrap()[leased..].to_vec();
    let next = host.worker(0).request(tenant());
    let at_once = forwarded(&mut host, 0, next);
    host.advance(millis(10));

    assert_eq!(leased, 4, "three checks and a refill");
    let paths: Vec<&str> = after_quiet.iter().map(|(path, _)| path.as_str()).collect();
    assert_eq!(paths, ["/v1/credit"], "one return");
    let returned = after_quiet[0].1["units"].as_u64().unwrap_or(0);
    assert!((1..=9).contains(&returned), "at most the nine left, less what its demand may still spend: {returned}");
    assert!(after_quiet[0].1["credit_id"].as_str().is_some_and(|id| !id.is_empty()), "sent with an id");
    assert_eq!(metric(&host, "tenant", Counter::LeaseReturned), returned);
    assert!(at_once, "the next request spends what was kept, without waiting");
    let calls = calls.lock().unwrap().clone();
    let last: Vec<&str> = calls[leased + 1..].iter().map(|(path, _)| path.as_str()).collect();
    assert_eq!(last, ["/v1/lease"], "then, below the low-water mark, it elects a refill (returned {returned})");
    assert_accounting(&host, "tenant");
}
