//! Global policies in `check` mode, in Envoy, against a real `sluice-counter`: one budget
//! across several Envoy processes (memory store and Redis), every failure class ending in
//! the configured rule within the deadline, the emergency cap's bound, the circuit
//! breaker, the service killed and restarted, Redis paused, and all-or-nothing across
//! local and global policies.

use super::*;
use sluice::host::{Counter as Metric, PluginCounter, Reason};
use sluice_testkit::bucket::{ReferenceBucket, latency_slack};
use sluice_testkit::peers::{Peer, Step, refused};
use sluice_testkit::redis::RedisServer;
use sluice_tests::counter::{self, Counter};
use sluice_tests::envoy::{SluiceFilter, cluster};
use sluice_tests::http::Connection;
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const HASH_KEY: &str = "fleet-hash-key-0123456789abcdef";
const TOKEN: &str = "fleet-token-42";
const SECOND_NS: u64 = 1_000_000_000;

/// A global per-tenant bucket, failing as `on_failure` says.
fn tenant_config(rate: &str, burst: u64, on_failure: &str) -> String {
    format!(
        r#"{{"counter_service": {{"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY",
                                "token_env": "SLUICE_COUNTER_TOKEN", "timeout": "100ms",
                                "circuit_breaker": {{"failures": 3, "cooldown": "1s"}}}},
            "policies": [{{"name": "tenant", "key": [{{"header": "x-tenant"}}], "rate": "{rate}", "burst": {burst},
                           "global": {{"strategy": "check"}}, "on_failure": {on_failure}}}],
            "response": {{"fallback_header": "x-sluice-fallback", "headers_on_rejected": ["retry_after", "ratelimit"]}}}}"#
    )
}

fn filter(config: &str) -> SluiceFilter {
    sluice(config).env("SLUICE_HASH_KEY", HASH_KEY).env("SLUICE_COUNTER_TOKEN", TOKEN)
}

fn envoy(config: &str, service: SocketAddr, workers: usize) -> Envoy {
    Envoy::builder()
        .workers(workers)
        .cluster(cluster("sluice-counter", service, false))
        .sluice(filter(config))
        .log_level("warning")
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn tenant(name: &str) -> Request {
    Request::get("/").header("x-tenant", name)
}

fn stat(envoy: &Envoy, counter: PluginCounter) -> u64 {
    envoy.plugin_metric(counter).unwrap_or(0)
}

fn no_request_left_paused(envoy: &Envoy) {
    let deadline = Instant::now() + Duration::from_secs(5);
    while envoy.stats().get("http.ingress_http.downstream_rq_active").copied().unwrap_or(0) > 0 {
        assert!(Instant::now() < deadline, "a request stayed paused\n{}", envoy.log());
        std::thread::sleep(Duration::from_millis(20));
    }
}

// ---------------------------------------------------------------------------------
// One budget across proxies.

const RATE: u64 = 5;
const BURST: u64 = 30;
const TENANTS: u64 = 4;
const LOAD: Duration = Duration::from_secs(3);

/// Drives every Envoy from 6 connections each for `LOAD`; returns the receipt times of
/// admissions per tenant, the statuses and the longest round trip.
fn drive(envoys: &[Envoy]) -> (BTreeMap<u64, Vec<u64>>, BTreeMap<u16, u64>, u64) {
    let start = Instant::now();
    let seen = Mutex::new((BTreeMap::<u64, Vec<u64>>::new(), BTreeMap::<u16, u64>::new(), 0u64));
    std::thread::scope(|scope| {
        for (e, envoy) in envoys.iter().enumerate() {
            for c in 0..6u64 {
                let seen = &seen;
                scope.spawn(move || {
                    let mut connection = envoy.connect();
                    let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ ((e as u64) << 8 | c);
                    let mut local = Vec::new();
                    while start.elapsed() < LOAD {
                        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                        let key = (seed >> 33) % TENANTS;
                        let sent = start.elapsed();
                        let response = connection.send(&tenant(&format!("t{key}"))).expect("Envoy answers");
                        local.push((key, response.status, sent, start.elapsed()));
                    }
                    let mut seen = seen.lock().unwrap();
                    for (key, status, sent, received) in local {
                        *seen.1.entry(status).or_default() += 1;
                        seen.2 = seen.2.max(u64::try_from((received - sent).as_nanos()).unwrap_or(u64::MAX));
                        if status == 200 {
                            seen.0.entry(key).or_default().push(u64::try_from(received.as_nanos()).unwrap_or(0));
                        }
                    }
                });
            }
        }
    });
    seen.into_inner().unwrap()
}

/// Drives 2 Envoys × 2 workers at one global budget (the tenant config, with
/// `batching` added to its `counter_service`) and replays every admission through an
/// exact reference bucket. Returns the requests and the callouts they took.
fn assert_one_budget(service: &Counter, batching: &str) -> (u64, u64) {
    // A healthy service must decide every request: give callouts a deadline that a loaded
    // 2-core machine running several proxies meets with a wide margin (the failure tests keep
    // 100 ms, since they wait for it to pass).
    let config = tenant_config(&format!("{RATE}/second"), BURST, r#"{"action": "deny"}"#)
        .replace(r#""timeout": "100ms""#, &format!(r#""timeout": "2s"{batching}"#));
    let envoys: Vec<Envoy> = (0..2).map(|_| envoy(&config, service.addr(), 2)).collect();

    let (mut admits, statuses, max_latency) = drive(&envoys);

    let slack = latency_slack(RATE, SECOND_NS, max_latency);
    let over: u64 =
        admits.values_mut().map(|a| ReferenceBucket::new(RATE, SECOND_NS, BURST + slack).over_admitted(a)).sum();
    let admitted: usize = admits.values().map(Vec::len).sum();
    eprintln!("2 Envoys × 2 workers: {admitted} admitted, statuses {statuses:?}, longest round trip {max_latency} ns");
    assert_eq!(over, 0, "the proxies together admitted more than the global budget");
    assert_eq!(admits.len() as u64, TENANTS);
    assert!(admitted as u64 >= TENANTS * BURST, "every tenant spent at least its burst ({admitted})");
    assert_eq!(statuses.get(&503), None, "no callout failed: {statuses:?}");
    let total = |counter| envoys.iter().map(|e| stat(e, counter)).sum::<u64>();
    let (callouts, batches, batched) =
        (total(PluginCounter::Callouts), total(PluginCounter::CheckBatches), total(PluginCounter::ChecksBatched));
    let requests = statuses.values().sum::<u64>();
    eprintln!("{callouts} callouts for {requests} requests: {batches} batches carried {batched} checks");
    assert_eq!(callouts - batches + batched, requests, "each request's check went out once, alone or in a batch");
    assert_eq!(total(PluginCounter::ChecksUnsent), 0);
    (requests, callouts)
}

#[test]
fn several_envoys_share_one_global_budget_on_the_memory_store() {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let _ = assert_one_budget(&service, "");
}

#[test]
fn several_envoys_share_one_global_budget_on_redis() {
    let redis = RedisServer::start();
    let service = Counter::start(counter::with_token(counter::redis(&redis.url()), TOKEN));
    let _ = assert_one_budget(&service, "");
}

#[test]
fn checks_that_wait_for_a_call_in_flight_go_together_and_the_budget_stays_exact() {
    // One call out per worker: 6 connections on 2 workers put 2 at least on one of them,
    // so under closed-loop load its checks meet a call in flight and wait for it.
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));

    let (requests, callouts) = assert_one_budget(&service, r#", "max_checks_in_flight": 1"#);

    assert!(callouts < requests, "{callouts} callouts for {requests} requests: checks went together");
}

#[test]
fn unbatched_every_request_takes_its_own_callout() {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));

    let (requests, callouts) = assert_one_budget(&service, r#", "max_checks_in_flight": 0"#);

    assert_eq!(callouts, requests);
}

// ---------------------------------------------------------------------------------
// Failure classes.

/// Sends one request, returns (status, fallback header, time taken).
fn timed(envoy: &Envoy, request: &Request) -> (u16, Option<String>, Duration) {
    let start = Instant::now();
    let response = send(envoy, request);
    (response.status, response.header("x-sluice-fallback").map(str::to_owned), start.elapsed())
}

/// Asserts one request fails closed for `reason` within the deadline; returns how long
/// it took.
fn assert_fails_closed(envoy: &Envoy, reason: Reason) -> Duration {
    let (status, fallback, took) = timed(envoy, &tenant("acme"));
    assert_eq!(status, 503, "{reason:?}: the default rule fails closed with 503");
    let expected = format!("fail_closed; reason={}; policies=tenant", reason.name());
    assert_eq!(fallback.as_deref(), Some(expected.as_str()));
    assert!(took < Duration::from_millis(100 + 900), "{reason:?}: decided after {took:?} for a 100 ms deadline");
    assert_eq!(envoy.metric("tenant", reason.counter()), 1, "{reason:?} is counted");
    no_request_left_paused(envoy);
    took
}

const DENY: &str = r#"{"action": "deny"}"#;

#[test]
fn a_service_that_never_answers_fails_closed_at_the_deadline() {
    let silent = Peer::silent();
    let envoy = envoy(&tenant_config("100/second", 10, DENY), silent.addr(), 1);

    let took = assert_fails_closed(&envoy, Reason::Timeout);

    assert!(took >= Duration::from_millis(80), "decided after {took:?}, before the 100 ms deadline");
}

#[test]
fn a_service_slower_than_the_deadline_fails_closed_at_the_deadline() {
    let body = r#"{"admitted":true,"at_ns":1,"entries":[]}"#;
    let response = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    let slow = Peer::start(vec![Step::Wait(Duration::from_secs(2)), Step::Write(response.into_bytes())]);
    let envoy = envoy(&tenant_config("100/second", 10, DENY), slow.addr(), 1);

    let _ = assert_fails_closed(&envoy, Reason::Timeout);
}

#[test]
fn a_check_waiting_to_be_sent_behind_a_slow_call_takes_its_failure_rule_at_its_own_deadline() {
    let body = r#"{"admitted":true,"at_ns":1,"entries":[]}"#;
    let response = format!("HTTP/1.1 200 OK\r\ncontent-length: {}\r\n\r\n{body}", body.len());
    let slow = Peer::start(vec![Step::Wait(Duration::from_secs(5)), Step::Write(response.into_bytes())]);
    let config = tenant_config("100/second", 10, DENY)
        .replace(r#""timeout": "100ms""#, r#""timeout": "1s", "max_checks_in_flight": 1"#);
    let envoy = envoy(&config, slow.addr(), 1);

    let (first, second) = std::thread::scope(|scope| {
        let first = scope.spawn(|| timed(&envoy, &tenant("a")));
        // The first check is out (the one call this worker may have): the second waits
        // to be sent, its deadline running from now.
        let out = Instant::now() + Duration::from_secs(5);
        while stat(&envoy, PluginCounter::Callouts) == 0 {
            assert!(Instant::now() < out, "the first check was never sent");
            std::thread::sleep(Duration::from_millis(5));
        }
        std::thread::sleep(Duration::from_millis(500));
        let second = scope.spawn(|| timed(&envoy, &tenant("b")));
        (first.join().unwrap(), second.join().unwrap())
    });

    for (status, fallback, _) in [&first, &second] {
        assert_eq!(*status, 503);
        assert_eq!(fallback.as_deref(), Some("fail_closed; reason=timeout; policies=tenant"));
    }
    // Sent when the first call timed out, half its deadline gone already: it fails at its
    // own deadline (1 s after it asked), not a whole deadline after it was sent (1.5 s).
    let took = second.2;
    assert!(took >= Duration::from_millis(950), "decided after {took:?}, before its 1 s deadline");
    assert!(took < Duration::from_millis(1450), "decided after {took:?}: its deadline moved when it was sent");
    no_request_left_paused(&envoy);
}

#[test]
fn a_refused_connection_fails_closed_at_once() {
    let envoy = envoy(&tenant_config("100/second", 10, DENY), refused(), 1);

    let _ = assert_fails_closed(&envoy, Reason::Refused);
}

#[test]
fn a_server_error_fails_closed() {
    let failing = Peer::answering(500, "application/json", r#"{"error":{"code":"internal","message":"boom"}}"#);
    let envoy = envoy(&tenant_config("100/second", 10, DENY), failing.addr(), 1);

    let _ = assert_fails_closed(&envoy, Reason::BadStatus);
}

#[test]
fn a_malformed_answer_fails_closed() {
    let garbage = Peer::answering(200, "application/json", r#"{"admitted": "maybe"}"#);
    let envoy = envoy(&tenant_config("100/second", 10, DENY), garbage.addr(), 1);

    let _ = assert_fails_closed(&envoy, Reason::BadBody);
}

#[test]
fn an_unknown_cluster_fails_closed_without_a_callout() {
    let config =
        tenant_config("100/second", 10, DENY).replace(r#""cluster": "sluice-counter""#, r#""cluster": "nowhere""#);
    let envoy = envoy(&config, refused(), 1);

    let _ = assert_fails_closed(&envoy, Reason::DispatchFailed);
    assert_eq!(stat(&envoy, PluginCounter::Callouts), 0);
}

#[test]
fn a_wrong_or_missing_token_is_unauthorized_and_fails_closed() {
    let service = Counter::start(counter::with_token(counter::memory(), "the-right-token"));
    let wrong = envoy(&tenant_config("100/second", 10, DENY), service.addr(), 1);
    let _ = assert_fails_closed(&wrong, Reason::Unauthorized);

    let without = tenant_config("100/second", 10, DENY).replace(r#""token_env": "SLUICE_COUNTER_TOKEN","#, "");
    let missing = envoy(&without, service.addr(), 1);
    let _ = assert_fails_closed(&missing, Reason::Unauthorized);
}

#[test]
fn fail_open_forwards_and_says_so() {
    let envoy = envoy(&tenant_config("100/second", 10, r#"{"action": "allow"}"#), refused(), 1);

    let (status, fallback, _) = timed(&envoy, &tenant("acme"));

    assert_eq!(status, 200);
    assert_eq!(fallback.as_deref(), Some("fail_open; reason=refused; policies=tenant"));
    assert_eq!(envoy.metric("tenant", Metric::FailureAllowed), 1);
}

#[test]
fn during_an_outage_the_emergency_cap_admits_within_its_bound_per_caller() {
    let capped = r#"{"action": "deny", "emergency": {"rate": "1/minute", "burst": 3}}"#;
    let envoy = envoy(&tenant_config("100/second", 10, capped), refused(), 2);

    let acme: Vec<(u16, Option<String>, Duration)> = (0..6).map(|_| timed(&envoy, &tenant("acme"))).collect();
    let globex = timed(&envoy, &tenant("globex"));

    let statuses: Vec<u16> = acme.iter().map(|(s, _, _)| *s).collect();
    assert_eq!(statuses, [200, 200, 200, 429, 429, 429], "the cap's burst, then its rejections");
    assert!(acme.iter().all(|(_, f, _)| f.as_deref().is_some_and(|f| f.starts_with("emergency; reason="))));
    assert_eq!(globex.0, 200, "each caller has its own cap");
    assert_eq!(envoy.metric("tenant", Metric::EmergencyAllowed), 4);
    assert_eq!(envoy.metric("tenant", Metric::EmergencyRejected), 3);
    let rejected = send(&envoy, &tenant("acme"));
    assert_eq!(rejected.header("retry-after"), Some("60"));
    assert_eq!(rejected.header("ratelimit-policy"), Some(r#""tenant";q=3;w=180"#));
    no_request_left_paused(&envoy);
}

// ---------------------------------------------------------------------------------
// Circuit breaker, crash and restart, Redis paused.

#[test]
fn the_circuit_opens_after_repeated_failures_cuts_callouts_and_closes_after_recovery() {
    let mut service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let envoy = envoy(&tenant_config("100/second", 100, DENY), service.addr(), 2);
    assert_eq!(timed(&envoy, &tenant("acme")).0, 200);
    service.kill();

    let during: Vec<u16> = (0..10).map(|_| timed(&envoy, &tenant("acme")).0).collect();

    assert!(during.iter().all(|s| *s == 503), "{during:?}");
    assert_eq!(stat(&envoy, PluginCounter::Callouts), 1 + 3, "three failures open the circuit");
    assert_eq!(stat(&envoy, PluginCounter::CircuitOpened), 1);
    assert_eq!(envoy.metric("tenant", Metric::DegradedCircuitOpen), 7);

    service.restart();
    std::thread::sleep(Duration::from_millis(1100));
    let after: Vec<u16> = (0..5).map(|_| timed(&envoy, &tenant("acme")).0).collect();

    assert_eq!(after, [200; 5], "a probe closed the circuit and decisions resumed");
    assert_eq!(stat(&envoy, PluginCounter::Callouts), 4 + 5);
}

/// Requests from one client for `duration`: (time since start, status).
fn steady(envoy: &Envoy, duration: Duration, mut during: impl FnMut(Duration)) -> Vec<(Duration, u16)> {
    let start = Instant::now();
    let mut seen = Vec::new();
    let mut connection = envoy.connect();
    while start.elapsed() < duration {
        during(start.elapsed());
        let status = connection.send(&tenant("acme")).map_or(0, |r| r.status);
        seen.push((start.elapsed(), status));
        std::thread::sleep(Duration::from_millis(20));
    }
    seen
}

#[test]
fn a_killed_service_hands_over_to_the_failure_rule_at_once_and_decisions_resume_after_its_restart() {
    let mut service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let capped = r#"{"action": "deny", "emergency": {"rate": "1000/second", "burst": 1000}}"#;
    let envoy = envoy(&tenant_config("1000/second", 1000, capped), service.addr(), 2);
    let (mut killed, mut restarted) = (false, false);

    let seen = steady(&envoy, Duration::from_millis(4000), |at| {
        if at > Duration::from_millis(1000) && !killed {
            service.kill();
            killed = true;
        }
        if at > Duration::from_millis(2000) && !restarted {
            service.restart();
            restarted = true;
        }
    });

    assert!(seen.iter().all(|(_, s)| *s == 200), "the emergency cap admitted through the outage: {seen:?}");
    let fallbacks = envoy.metric("tenant", Metric::EmergencyAllowed);
    assert!(fallbacks > 5, "the cap decided during the outage ({fallbacks})");
    // After the restart and the breaker's cooldown, the service decides again.
    let normal_before = stat(&envoy, PluginCounter::Callouts);
    let _ = steady(&envoy, Duration::from_millis(300), |_| {});
    assert!(stat(&envoy, PluginCounter::Callouts) > normal_before, "callouts resumed after the restart");
    assert_eq!(envoy.metric("tenant", Metric::EmergencyAllowed), fallbacks, "no fallback once the service is back");
    no_request_left_paused(&envoy);
}

#[test]
fn redis_paused_hands_over_to_the_failure_rule_and_decisions_resume_after() {
    let redis = RedisServer::start();
    let service = Counter::start(counter::with_token(counter::redis(&redis.url()), TOKEN));
    let envoy = envoy(&tenant_config("1000/second", 1000, r#"{"action": "allow"}"#), service.addr(), 2);
    let mut paused = false;

    let seen = steady(&envoy, Duration::from_millis(3000), |at| {
        if at > Duration::from_millis(800) && !paused {
            redis.pause(1000);
            paused = true;
        }
    });

    assert!(seen.iter().all(|(_, s)| *s == 200), "fail open admitted through the pause: {seen:?}");
    let degraded = envoy.metric("tenant", Metric::DegradedBadStatus)
        + envoy.metric("tenant", Metric::DegradedTimeout)
        + envoy.metric("tenant", Metric::DegradedCircuitOpen);
    assert!(degraded > 0, "the pause was noticed");
    let slow =
        seen.iter().zip(seen.iter().skip(1)).filter(|((a, _), (b, _))| *b - *a > Duration::from_millis(600)).count();
    assert_eq!(slow, 0, "no request waited for Redis beyond the filter's deadline");
    let callouts = stat(&envoy, PluginCounter::Callouts);
    let _ = steady(&envoy, Duration::from_millis(1500), |_| {});
    assert!(stat(&envoy, PluginCounter::Callouts) > callouts, "decisions resumed after the pause");
}

// ---------------------------------------------------------------------------------
// All or nothing across local and global policies.

const LAYERED: &str = r#"{"counter_service": {"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY",
                                              "token_env": "SLUICE_COUNTER_TOKEN"},
  "policies": [
    {"name": "client", "key": [{"header": "x-client"}], "algorithm": "fixed_window", "limit": 2, "window": "1h"},
    {"name": "tenant", "key": [{"header": "x-tenant"}], "rate": "1/hour", "burst": 1, "global": {"strategy": "check"}}
  ]}"#;

fn layered(client: &str, tenant: &str) -> Request {
    Request::get("/").header("x-client", client).header("x-tenant", tenant)
}

#[test]
fn a_local_rejection_makes_no_callout_and_a_global_rejection_gives_the_local_spend_back() {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let envoy = envoy(LAYERED, service.addr(), 2);

    // Tenant t1 has one token: the first request spends it, the next two are rejected by
    // the service and give the client's local spend back.
    let t1: Vec<u16> = (0..3).map(|_| send(&envoy, &layered("c", "t1")).status).collect();
    // So client c still has one of its two: t2 admits, and then c is out locally.
    let t2 = send(&envoy, &layered("c", "t2")).status;
    let callouts = stat(&envoy, PluginCounter::Callouts);
    let local = send(&envoy, &layered("c", "t3")).status;

    assert_eq!(t1, [200, 429, 429]);
    assert_eq!(t2, 200, "the global rejections refunded the local window");
    assert_eq!(local, 429);
    assert_eq!(stat(&envoy, PluginCounter::Callouts), callouts, "a local rejection makes no callout");
    assert_eq!(envoy.metric("client", Metric::Unrefunded), 0);
    for policy in ["client", "tenant"] {
        let offered = envoy.metric(policy, Metric::Offered);
        assert_eq!(offered, envoy.metric(policy, Metric::Allowed) + envoy.metric(policy, Metric::Rejected), "{policy}");
    }
}

// ---------------------------------------------------------------------------------
// Numbers that change: a rolling update runs old and new numbers side by side on one
// counter, and never hands anyone a fresh budget.

fn changed_numbers(burst: u64, version: u64, strategy: &str) -> String {
    format!(
        r#"{{"counter_service": {{"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY",
                                "token_env": "SLUICE_COUNTER_TOKEN", "timeout": "2s"}},
            "policies": [{{"name": "tenant", "key": [{{"header": "x-tenant"}}], "rate": "1/hour", "burst": {burst},
                           "version": {version}, "global": {strategy}, "on_failure": {{"action": "deny"}}}}],
            "response": {{"fallback_header": "x-sluice-fallback"}}}}"#
    )
}

fn admitted(envoy: &Envoy, tenant: &str, n: usize) -> usize {
    (0..n).filter(|_| send(envoy, &Request::get("/").header("x-tenant", tenant)).status == 200).count()
}

fn assert_new_numbers_carry_the_counter_over(strategy: &str) {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let old = envoy(&changed_numbers(10, 0, strategy), service.addr(), 1);
    let new = envoy(&changed_numbers(20, 0, strategy), service.addr(), 1);
    let bumped = envoy(&changed_numbers(20, 1, strategy), service.addr(), 1);

    let on_old = admitted(&old, "acme", 15);
    let on_new = admitted(&new, "acme", 25);
    let after_bump = admitted(&bumped, "acme", 25);

    eprintln!("{strategy}: old numbers admitted {on_old}, new numbers {on_new}, a version bump {after_bump}");
    assert_eq!(on_old, 10);
    // The tenant spent its 10: a larger burst keeps what it had left (nothing), and does
    // not refill it.
    assert_eq!(on_new, 0, "the new numbers handed out a fresh budget");
    assert_eq!(after_bump, 20, "a version bump starts over, deliberately");
}

#[test]
fn a_proxy_with_new_numbers_carries_the_check_counter_over_instead_of_starting_a_fresh_one() {
    assert_new_numbers_carry_the_counter_over(r#"{"strategy": "check"}"#);
}

#[test]
fn a_proxy_with_new_numbers_carries_the_leased_counter_over_instead_of_starting_a_fresh_one() {
    assert_new_numbers_carry_the_counter_over(r#"{"strategy": "lease", "lease": {"size": 1, "low_water": 0}}"#);
}

#[test]
fn numbers_changed_by_xds_mid_traffic_never_add_a_budget() {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let envoy = Envoy::builder()
        .workers(2)
        .xds()
        .cluster(cluster("sluice-counter", service.addr(), false))
        .sluice(filter(&changed_numbers(10, 0, r#"{"strategy": "check"}"#)))
        .log_level("warning")
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let stop = std::sync::atomic::AtomicBool::new(false);
    let count = std::sync::atomic::AtomicU64::new(0);

    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| {
                let mut connection = Connection::connect(envoy.addr()).unwrap();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let response = connection.send(&Request::get("/").header("x-tenant", "acme")).unwrap();
                    if response.status == 200 {
                        count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
            });
        }
        std::thread::sleep(Duration::from_millis(300));
        envoy.push_filter(&filter(&changed_numbers(20, 0, r#"{"strategy": "check"}"#))).unwrap();
        std::thread::sleep(Duration::from_millis(700));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });

    let total = count.into_inner();
    eprintln!("burst 10, then 20 pushed mid-traffic: {total} admitted");
    assert!(total <= 20, "{total} admitted: the new numbers added a budget to the old one");
    assert_eq!(total, 10, "the tenant's 10, carried over: a raise does not refill");
}
