//! Lease mode in wasm-host, on a virtual clock with a scripted service: one refill in
//! flight per proxy, sent by the root context and landing for every worker's waiting
//! requests; an elected refill that never returns releases its waiters through the
//! failure rule and lets another election happen; waits bounded per worker.

use super::*;
use std::sync::{Arc, Mutex};
use wasm_host::{Answer, HostBuilder, Outcome, StreamId};

const CONFIG: &str = r#"{
  "counter_service": {"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY", "timeout": "50ms"},
  "policies": [{"name": "tenant", "key": [{"header": "x-tenant"}], "rate": "100/second", "burst": 100,
                "global": {"strategy": "lease", "lease": {"size": 10, "duration": "2s", "low_water": 3, "max_waiting": 2}},
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
    assert_eq!(metric(&host, "tenant", "lease.granted"), 10);
    // Eight left: spent locally, with no callout, until the low-water mark elects again.
    let statuses: Vec<u16> = (0..6).map(|_| status(&mut host, tenant())).collect();
    assert_eq!(statuses, [200; 6]);
    assert_eq!(paths.lock().unwrap().len(), 1);
    host.advance(millis(10));
    assert_eq!(paths.lock().unwrap().len(), 2, "below 3 left, one refill was elected");
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
    assert_eq!(paths.lock().unwrap().len(), 1);
    let _third = host.worker(0).request(tenant());
    host.advance(millis(10));
    assert_eq!(paths.lock().unwrap().len(), 2, "the dead election expired: a new refill went out");
}

#[test]
fn a_worker_holds_at_most_max_waiting_requests_for_a_refill() {
    let (builder, _) = leasing(Answer::never);
    let mut host = builder.build().unwrap();
    let held: Vec<StreamId> = (0..2).map(|_| host.worker(0).request(tenant())).collect();

    let third = send(&mut host, tenant());

    assert!(held.iter().all(|s| host.worker(0).outcome(*s).unwrap().is_paused()));
    assert_eq!(third.header_str("x-sluice-fallback"), Some("emergency; reason=lease_queue_full; policies=tenant"));
    assert_eq!(metric(&host, "tenant", "degraded.lease_queue_full"), 1);
}
