//! Lease-mode requests that wait or meet several lease policies: every policy of a
//! request is decided, no waiter is dropped, and a healthy service never produces a
//! degraded decision.

use super::*;
use sluice::host::{Counter as Metric, Reason};

/// A route policy (one slot, failing open) and a tenant policy, both leased.
fn route_and_tenant(tenant_burst: u64) -> String {
    format!(
        r#"{{"counter_service": {{"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY",
                                "token_env": "SLUICE_COUNTER_TOKEN", "timeout": "{HEALTHY_TIMEOUT}"}},
            "policies": [
              {{"name": "route", "key": [{{"header": "x-route"}}], "rate": "1000/second", "burst": 1000, "slots": 1,
                "global": {{"strategy": "lease", "lease": {{"size": 10, "duration": "10s"}}}}, "on_failure": {{"action": "allow"}}}},
              {{"name": "tenant", "key": [{{"header": "x-tenant"}}], "rate": "1/hour", "burst": {tenant_burst},
                "global": {{"strategy": "lease", "lease": {{"size": 1, "low_water": 0}}}}, "on_failure": {{"action": "allow"}}}}],
            "response": {{"fallback_header": "x-sluice-fallback"}}}}"#
    )
}

fn routed(route: &str, tenant: &str) -> Request {
    Request::get("/").header("x-route", route).header("x-tenant", tenant)
}

#[test]
fn a_second_lease_policy_is_still_decided_when_the_first_finds_its_slot_taken() {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let envoy = Envoy::builder()
        .workers(1)
        .cluster(cluster("sluice-counter", service.addr(), true))
        .sluice(filter(&route_and_tenant(3), sluice_artifacts::SLUICE_WASM))
        .log_level("warning")
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    // Route "a" takes the route policy's only slot; tenant "t" spends its 3.
    let spent: Vec<u16> = (0..4).map(|_| send(&envoy, &routed("a", "t")).status).collect();
    assert_eq!(spent, [200, 200, 200, 429]);

    // Route "b" finds the slot taken (set aside for a check at the service); the
    // tenant's spent budget rejects the request first, so no check is needed.
    let other_route = send(&envoy, &routed("b", "t"));

    assert_eq!(
        other_route.status,
        429,
        "admitted past the tenant's budget ({:?}): the tenant policy was skipped",
        other_route.header("x-sluice-fallback")
    );
    assert_eq!(other_route.header("x-sluice-fallback"), None, "nothing degraded");
    assert_eq!(envoy.metric("route", Metric::LeaseCheckedSlotTaken), 0, "rejected before any check");
    assert_eq!(envoy.metric("route", Metric::DegradedLeaseSlotTaken), 0, "never degraded");
    assert_eq!(envoy.metric("tenant", Metric::OverLimit), 2);
}

#[test]
fn a_caller_whose_lease_slot_another_holds_is_decided_by_the_service_with_its_429_and_retry_after() {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let config = r#"{"counter_service": {"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY",
                                         "token_env": "SLUICE_COUNTER_TOKEN", "timeout": "2s"},
        "policies": [{"name": "user", "key": [{"header": "x-user"}], "rate": "1/minute", "burst": 3, "slots": 1,
                      "global": {"strategy": "lease", "lease": {"size": 3, "duration": "60s", "cold_below": 0}},
                      "on_failure": {"action": "deny"}}],
        "response": {"fallback_header": "x-sluice-fallback"}}"#;
    let envoy = Envoy::builder()
        .workers(1)
        .cluster(cluster("sluice-counter", service.addr(), true))
        .sluice(filter(config, sluice_artifacts::SLUICE_WASM))
        .log_level("warning")
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let user = |name: &str| Request::get("/").header("x-user", name);
    // "a" leases the table's only slot for a minute (`cold_below` 0: a key is leased from
    // its first request): its first request is leased what it costs, its second a grant
    // sized to its demand (two), of which one token is left.
    assert_eq!(send(&envoy, &user("a")).status, 200);
    assert_eq!(send(&envoy, &user("a")).status, 200);

    // "b" finds it held: each request is decided by the service, exactly.
    let b: Vec<_> = (0..4).map(|_| send(&envoy, &user("b"))).collect();

    let statuses: Vec<u16> = b.iter().map(|r| r.status).collect();
    assert_eq!(statuses, [200, 200, 200, 429], "b's own budget of 3, decided at the service");
    assert!(b.iter().all(|r| r.header("x-sluice-fallback").is_none()), "nothing degraded");
    let wait: u64 = b[3].header("retry-after").and_then(|v| v.parse().ok()).expect("the service's Retry-After");
    assert!((55..=60).contains(&wait), "three spent of a budget that refills one a minute: {wait} s");
    assert_eq!(envoy.metric("user", Metric::LeaseCheckedSlotTaken), 4);
    assert_eq!(envoy.metric("user", Metric::DegradedLeaseSlotTaken), 0);
    assert_eq!(envoy.metric("user", Metric::FailureDenied), 0);
}

/// Two lease policies whose workers' queues differ in length.
fn two_queues(timeout: &str) -> String {
    format!(
        r#"{{"counter_service": {{"cluster": "sluice-counter", "hash_key_env": "SLUICE_HASH_KEY", "timeout": "{timeout}",
                                "token_env": "SLUICE_COUNTER_TOKEN"}},
            "policies": [
              {{"name": "a", "key": [{{"header": "x-a"}}], "on_missing_key": "skip", "rate": "100/second", "burst": 100,
                "global": {{"strategy": "lease", "lease": {{"size": 10, "max_waiting": 4}}}}, "on_failure": {{"action": "deny"}}}},
              {{"name": "b", "key": [{{"header": "x-b"}}], "on_missing_key": "skip", "rate": "100/second", "burst": 100,
                "global": {{"strategy": "lease", "lease": {{"size": 10, "max_waiting": 64}}}}, "on_failure": {{"action": "deny"}}}}],
            "response": {{"fallback_header": "x-sluice-fallback"}}}}"#
    )
}

#[test]
fn a_request_retried_on_a_tick_behind_a_longer_queue_is_never_dropped() {
    // The service is paused: it reads the refills and never answers; the callout deadline
    // (1 s) lets many ticks retry the waiting requests before the refills fail.
    let paused = sluice_testkit::peers::Peer::silent();
    let envoy = Envoy::builder()
        .workers(1)
        .cluster(cluster("sluice-counter", paused.addr(), false))
        .sluice(filter(&two_queues("1s"), sluice_artifacts::SLUICE_WASM))
        .log_level("warning")
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let answered = |request: Request| {
        let mut connection = Connection::connect(envoy.addr()).unwrap();
        connection.set_read_timeout(Duration::from_secs(8)).unwrap();
        connection.send(&request).map(|r| r.status)
    };

    let statuses = std::thread::scope(|scope| {
        let first = scope.spawn(|| answered(Request::get("/").header("x-a", "1")));
        std::thread::sleep(Duration::from_millis(100));
        let others: Vec<_> = (0..10).map(|_| scope.spawn(|| answered(Request::get("/").header("x-b", "1")))).collect();
        let mut statuses = vec![first.join().unwrap()];
        statuses.extend(others.into_iter().map(|t| t.join().unwrap()));
        statuses
    });

    assert!(
        statuses.iter().all(Result::is_ok),
        "a request was never answered (a decision made on a tick was dropped): {statuses:?}"
    );
    assert_eq!(statuses[0].as_ref().ok(), Some(&503), "it took its failure rule when its refill failed");
    assert_eq!(envoy.metric("a", Metric::DegradedTimeout), 1);
}

/// The user's reproduction: 2 proxies × 2 workers, 12 clients, a 40/s budget leased 8 at
/// a time, a 50 ms deadline, an emergency cap.
fn busy_lease() -> String {
    config(
        "40/second",
        40,
        r#"{"size": 8, "duration": "2s", "low_water": 2}"#,
        r#"{"action": "deny", "emergency": {"rate": "100/second", "burst": 100}}"#,
        "50ms",
        "1s",
    )
}

#[test]
fn a_healthy_service_under_load_never_produces_a_degraded_decision() {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    let config = busy_lease();
    let envoys: Vec<Envoy> = (0..2).map(|_| envoy(&config, service.addr(), sluice_artifacts::SLUICE_WASM)).collect();
    let addrs: Vec<SocketAddr> = envoys.iter().map(Envoy::addr).collect();
    let start = Instant::now();
    let seen = Mutex::new((std::collections::BTreeMap::<u16, u64>::new(), Vec::<String>::new()));

    std::thread::scope(|scope| {
        for client in 0..12 {
            let (seen, addr) = (&seen, addrs[client % 2]);
            scope.spawn(move || {
                let mut connection = Connection::connect(addr).unwrap();
                while start.elapsed() < Duration::from_secs(3) {
                    let response = connection.send(&Request::get("/").header("x-tenant", "acme")).unwrap();
                    let mut seen = seen.lock().unwrap();
                    *seen.0.entry(response.status).or_default() += 1;
                    if let Some(fallback) = response.header("x-sluice-fallback") {
                        seen.1.push(fallback.to_owned());
                    }
                }
            });
        }
    });

    let (statuses, fallbacks) = seen.into_inner().unwrap();
    let degraded: u64 = envoys
        .iter()
        .map(|e| {
            [
                Reason::Timeout,
                Reason::Refused,
                Reason::Reset,
                Reason::BadStatus,
                Reason::BadBody,
                Reason::LeaseQueueFull,
            ]
            .iter()
            .map(|r| e.metric("tenant", r.counter()))
            .sum::<u64>()
        })
        .sum();
    eprintln!("healthy service under load: statuses {statuses:?}, {} fallbacks, {degraded} degraded", fallbacks.len());
    assert_eq!(
        fallbacks.len(),
        0,
        "a healthy service produced degraded decisions: {:?}",
        &fallbacks[..fallbacks.len().min(5)]
    );
    assert_eq!(degraded, 0);
    assert!(statuses.keys().all(|s| *s == 200 || *s == 429), "{statuses:?}");
    assert!(statuses.get(&429).copied().unwrap_or(0) > 0, "the budget ran out: the service's 429 decided the rest");
}

#[test]
fn a_request_that_finds_its_lease_empty_waits_a_round_trip_not_a_tick() {
    let service = Counter::start(counter::with_token(counter::memory(), TOKEN));
    // Every other request finds the lease empty and waits for the refill it elects.
    let config = config(
        "100000/second",
        100_000,
        r#"{"size": 2, "duration": "10s", "low_water": 0}"#,
        DENY,
        HEALTHY_TIMEOUT,
        "1s",
    );
    let envoy = Envoy::builder()
        .workers(1)
        .cluster(cluster("sluice-counter", service.addr(), true))
        .sluice(filter(&config, sluice_artifacts::SLUICE_WASM))
        .log_level("warning")
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let mut connection = Connection::connect(envoy.addr()).unwrap();
    let mut times = Vec::new();
    for _ in 0..200 {
        let sent = Instant::now();
        let response = connection.send(&Request::get("/").header("x-tenant", "acme")).unwrap();
        assert_eq!(response.status, 200);
        times.push(sent.elapsed());
    }

    // Requests alternate: one waits for a refill, the next spends what it brought.
    let median = |mut v: Vec<Duration>| {
        v.sort();
        v[v.len() / 2]
    };
    let waited = median(times.iter().skip(2).step_by(2).copied().collect());
    let spent = median(times.iter().skip(3).step_by(2).copied().collect());
    let refills = envoy.metric("tenant", Metric::LeaseRefills);
    eprintln!(
        "a request that waited for its refill: {waited:?} (median); one that spent: {spent:?}; {refills} refills"
    );
    assert!(refills >= 90, "{refills} refills for 200 requests: the test did not make requests wait");
    // The promise: the round trip to the service, not the root's tick (10 ms) nor two.
    assert!(
        waited.saturating_sub(spent) < Duration::from_millis(5),
        "waiting for a refill cost {:?} more than spending (a tick is 10 ms)",
        waited.saturating_sub(spent)
    );
}
