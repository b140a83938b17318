//! Envoy's own `envoy.filters.http.ratelimit` filter (no wasm module) against
//! sluice-counter's RLS front door, configured by envoyproxy/ratelimit's YAML: limits
//! held across Envoys and workers, Envoy's headers from the statuses, the failure mode
//! when the service is gone, a configuration changed under a running service, and a
//! token budget charged when the stream is done.
//!
//! The service's counters read a frozen clock: no window ends during a test, so every
//! count below is exact whatever the machine's speed.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shared_store::{ManualClock, Nanos};
use sluice_counter::config::Config;
use sluice_tests::counter::Counter;
use sluice_tests::envoy::{Envoy, cluster};
use sluice_tests::http::Request;
use sluice_tests::upstream::Upstream;

/// Unix second 1 750 000 000: 3 200 s before its hour ends.
const FROZEN_AT_S: u64 = 1_750_000_000;

const RULES: &str = "domain: shop
descriptors:
  - key: user
    rate_limit: {unit: hour, requests_per_unit: 5, name: per-user}
  - key: budget
    rate_limit: {unit: hour, requests_per_unit: 10, name: tokens}
";

struct Rls {
    counter: Counter,
    dir: tempfile::TempDir,
}

fn rls_service(rules: &str) -> Rls {
    let dir = tempfile::tempdir().expect("a directory");
    std::fs::write(dir.path().join("shop.yaml"), rules).expect("write the rules");
    let config = Config {
        rls_config: Some(dir.path().to_owned()),
        rls_listen: "127.0.0.1:0".parse().expect("addr"),
        rls_reload_ms: 20,
        ..Config::defaults()
    };
    let counter = Counter::start_on_clock(config, Arc::new(ManualClock::at(Nanos::from_secs(FROZEN_AT_S))));
    Rls { counter, dir }
}

/// Envoy's native filter calling the service at `rls` (gRPC over HTTP/2).
fn native_filter(deny: bool) -> Value {
    json!({
        "name": "envoy.filters.http.ratelimit",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.ratelimit.v3.RateLimit",
            "domain": "shop",
            "failure_mode_deny": deny,
            // Generous: a slow machine must not turn a decision into the failure mode.
            "timeout": "2s",
            "enable_x_ratelimit_headers": "DRAFT_VERSION_03",
            "enable_retry_after_header": true,
            "rate_limit_service": {
                "grpc_service": { "envoy_grpc": { "cluster_name": "rls" } },
                "transport_api_version": "V3",
            },
        },
    })
}

fn per_user() -> Value {
    json!([{ "actions": [{ "request_headers": { "header_name": "x-user", "descriptor_key": "user" } }] }])
}

fn envoy(rls: std::net::SocketAddr, upstream: &Upstream, deny: bool, rate_limits: Value) -> Envoy {
    Envoy::builder()
        .workers(2)
        .cluster(cluster("rls", rls, true))
        .cluster(cluster("backend", upstream.addr(), false))
        .route_to("backend")
        .rate_limits(rate_limits)
        .filter(native_filter(deny))
        .start()
        .unwrap_or_else(|e| panic!("{e}"))
}

fn as_user(user: &str) -> Request {
    Request::get("/").header("x-user", user)
}

#[test]
fn a_limit_holds_across_two_envoys_with_two_workers_each() {
    let service = rls_service(RULES);
    let upstream = Upstream::start(&[]);
    let addr = service.counter.rls_addr().expect("rls served");
    let envoys = [envoy(addr, &upstream, true, per_user()), envoy(addr, &upstream, true, per_user())];

    let mut statuses = Vec::new();
    for i in 0..20 {
        statuses.push(envoys[i % 2].send(&as_user("alice")).status);
    }
    let bob = envoys[1].send(&as_user("bob")).status;

    let admitted = statuses.iter().filter(|s| **s == 200).count();
    assert_eq!(admitted, 5, "the oracle: one window of 5 per user ({statuses:?})");
    assert!(statuses.iter().all(|s| *s == 200 || *s == 429), "{statuses:?}");
    assert_eq!(statuses[..5], [200; 5], "the first five, in order");
    assert_eq!(bob, 200, "another user has their own counter");
    assert_eq!(upstream.served(), 6);
}

#[test]
fn envoy_writes_x_ratelimit_and_retry_after_from_the_statuses() {
    let service = rls_service(RULES);
    let upstream = Upstream::start(&[]);
    let envoy = envoy(service.counter.rls_addr().expect("rls"), &upstream, true, per_user());

    let first = envoy.send(&as_user("carol"));
    for _ in 0..4 {
        envoy.send(&as_user("carol"));
    }
    let rejected = envoy.send(&as_user("carol"));

    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-ratelimit-limit"), Some("5, 5;w=3600;name=\"per-user\""));
    assert_eq!(first.header("x-ratelimit-remaining"), Some("4"));
    assert_eq!(first.header("x-ratelimit-reset"), Some("3200"));
    assert_eq!(rejected.status, 429);
    assert_eq!(rejected.header("x-ratelimit-remaining"), Some("0"));
    assert_eq!(rejected.header("retry-after"), Some("3200"), "until the hour ends, exactly");
}

#[test]
fn with_the_service_gone_failure_mode_deny_refuses_and_its_absence_lets_through_without_waiting() {
    let mut service = rls_service(RULES);
    let upstream = Upstream::start(&[]);
    let addr = service.counter.rls_addr().expect("rls");
    let deny = envoy(addr, &upstream, true, per_user());
    let allow = envoy(addr, &upstream, false, per_user());
    assert_eq!(deny.send(&as_user("dan")).status, 200);
    service.counter.kill();

    let start = Instant::now();
    let denied = deny.send(&as_user("dan"));
    let allowed = allow.send(&as_user("dan"));
    let took = start.elapsed();

    assert_eq!(denied.status, 500, "failure_mode_deny answers status_on_error (500 by default)");
    assert_eq!(allowed.status, 200, "without it, the request goes through");
    assert!(
        took < Duration::from_secs(2 * 2 + 2),
        "no request waits past Envoy's timeout (2 s) plus a margin: {took:?}"
    );
}

#[test]
fn a_changed_rule_applies_without_restarting_the_service() {
    let service = rls_service(RULES);
    let upstream = Upstream::start(&[]);
    let envoy = envoy(service.counter.rls_addr().expect("rls"), &upstream, true, per_user());
    assert_eq!(envoy.send(&as_user("erin")).status, 200);

    std::fs::write(service.dir.path().join("shop.yaml"), RULES.replace("requests_per_unit: 5", "requests_per_unit: 1"))
        .expect("write");
    let mut lowered = false;
    for attempt in 0..200 {
        let user = format!("fresh-{attempt}");
        envoy.send(&as_user(&user));
        if envoy.send(&as_user(&user)).status == 429 {
            lowered = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }

    assert!(lowered, "a second request of a new user is refused under the new limit of 1");
    assert_eq!(envoy.send(&as_user("erin")).status, 429, "erin's earlier hit was kept: 1 of 1");
}

#[test]
fn a_token_budget_charged_when_the_stream_is_done_runs_out_and_holds() {
    let service = rls_service(RULES);
    let upstream = Upstream::start(&[("x-tokens", "7")]);
    let budget = json!([{ "generic_key": { "descriptor_key": "budget", "descriptor_value": "tenant-1" } }]);
    let rate_limits = json!([
        { "actions": budget, "hits_addend": { "number": 0 } },
        { "actions": budget, "apply_on_stream_done": true, "hits_addend": { "format": "%RESP(x-tokens)%" } },
    ]);
    // Envoy honours `hits_addend` on the filter's own `rate_limits` (the route's are
    // sent without it).
    let mut filter = native_filter(true);
    filter["typed_config"]["rate_limits"] = rate_limits;
    let envoy = Envoy::builder()
        .workers(2)
        .cluster(cluster("rls", service.counter.rls_addr().expect("rls"), true))
        .cluster(cluster("backend", upstream.addr(), false))
        .route_to("backend")
        .filter(filter)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    let hits = || service.counter.metric("sluice_counter_rls_total_hits_total{rule=\"shop.budget\"}");
    let charged = |total: u64| {
        // The charge is Envoy's fire-and-forget call after the response: wait for it, so
        // the next request is decided after it (the interleaving is forced, not hoped for).
        let deadline = Instant::now() + Duration::from_secs(10);
        while hits() < total && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        hits()
    };

    let first = envoy.send(&Request::get("/")).status;
    let after_first = charged(7);
    let second = envoy.send(&Request::get("/")).status;
    let after_second = charged(14);
    let third = envoy.send(&Request::get("/")).status;

    assert_eq!((first, after_first), (200, 7), "asked with 0 hits, then charged 7");
    assert_eq!((second, after_second), (200, 14), "3 were left; the 7 charged do not fit and are counted all the same");
    assert_eq!(third, 429, "the budget is spent: held");
}

/// `bootstrap` with its listener and admin on ports the OS picks and each cluster named
/// in `endpoints` pointed at its loopback address.
fn on_loopback(mut bootstrap: Value, endpoints: &[(&str, std::net::SocketAddr)]) -> Value {
    let loopback_any = json!({ "address": "127.0.0.1", "port_value": 0 });
    bootstrap["static_resources"]["listeners"][0]["address"]["socket_address"] = loopback_any.clone();
    bootstrap["admin"]["address"]["socket_address"] = loopback_any;
    for cluster in bootstrap["static_resources"]["clusters"].as_array_mut().expect("clusters") {
        let name = cluster["name"].as_str().unwrap_or_default().to_owned();
        if let Some((_, addr)) = endpoints.iter().find(|(n, _)| *n == name) {
            cluster["type"] = json!("STATIC");
            cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"] =
                json!({ "address": addr.ip().to_string(), "port_value": addr.port() });
        }
    }
    bootstrap
}

#[test]
fn the_shipped_bootstrap_and_example_limit_logins_per_address_and_never_limit_health_checks() {
    let config = Config {
        rls_config: Some(sluice_tests::envoy::repo().join("examples/ratelimit")),
        rls_listen: "127.0.0.1:0".parse().expect("addr"),
        rls_response_headers: "retry-after".to_owned(),
        token: Some(sluice_counter::config::Secret::from("change-me".to_owned())),
        ..Config::defaults()
    };
    let service = Counter::start_on_clock(config, Arc::new(ManualClock::at(Nanos::from_secs(FROZEN_AT_S))));
    let upstream = Upstream::start(&[]);
    let bootstrap = on_loopback(
        sluice_tests::deploy::envoy_config_json("envoy-rls.yaml"),
        &[("backend", upstream.addr()), ("sluice-counter-rls", service.rls_addr().expect("rls"))],
    );
    let envoy = Envoy::builder().workers(2).bootstrap(bootstrap).start().unwrap_or_else(|e| panic!("{e}"));

    let logins: Vec<u16> = (0..6).map(|_| envoy.send(&Request::post("/login/form", "user=a")).status).collect();
    let refused = envoy.send(&Request::post("/login/form", "user=a"));
    let health: Vec<u16> =
        (0..8).map(|_| envoy.send(&Request::get("/healthz").header("x-user", "health-checker")).status).collect();
    let free_plan = envoy.send(&Request::get("/").header("x-tenant", "acme").header("x-plan", "free"));

    assert_eq!(logins, [200, 200, 200, 200, 200, 429], "5 logins a minute per client address");
    assert_eq!(refused.header("retry-after"), Some("20"), "the exact wait, from the service: the minute ends in 20 s");
    assert!(health.iter().all(|s| *s == 200), "unlimited: {health:?}");
    assert_eq!(free_plan.status, 200);
    let limits = free_plan.header("x-ratelimit-limit").unwrap_or_default();
    assert!(limits.contains(r#"1000;w=3600;name="free-tenant""#), "the nested descriptor met its rule: {limits}");
}

#[test]
fn with_the_store_stalled_envoys_timeout_decides_and_no_request_waits_past_it() {
    let redis = sluice_testkit::redis::RedisServer::start();
    let dir = tempfile::tempdir().expect("a directory");
    std::fs::write(dir.path().join("shop.yaml"), RULES).expect("write the rules");
    // The store's deadline (5 s) is far past Envoy's (200 ms): Envoy gives up first.
    let config = Config {
        store: sluice_counter::config::StoreKind::Redis,
        redis_url: vec![redis.url()],
        redis_timeout_ms: 5000,
        rls_config: Some(dir.path().to_owned()),
        rls_listen: "127.0.0.1:0".parse().expect("addr"),
        ..Config::defaults()
    };
    let service = Counter::start(config);
    let upstream = Upstream::start(&[]);
    let mut filter = native_filter(true);
    filter["typed_config"]["timeout"] = json!("0.2s");
    let envoy = Envoy::builder()
        .workers(2)
        .cluster(cluster("rls", service.rls_addr().expect("rls"), true))
        .cluster(cluster("backend", upstream.addr(), false))
        .route_to("backend")
        .rate_limits(per_user())
        .filter(filter)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(envoy.send(&as_user("gus")).status, 200, "decided while Redis answers");

    redis.signal("STOP");
    let start = Instant::now();
    let stalled = envoy.send(&as_user("gus"));
    let took = start.elapsed();
    redis.signal("CONT");

    // Redis was paused: no answer could come before the store's 5 s deadline, so a 500
    // well before it is Envoy's own timeout deciding (when Envoy's timer fires is its
    // business: no lower bound is asserted).
    assert_eq!(stalled.status, 500, "failure_mode_deny");
    assert!(took < Duration::from_secs(4), "Envoy did not wait for the store's 5 s deadline: {took:?}");
}

/// envoyproxy/ratelimit's quota-based choice of service: each quota's `metadata` names
/// its service, and the service answers with the metadata of the quotas that passed.
const QUOTAS: &str = "domain: shop
descriptors:
  - key: service
    value: service_1
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 1}
    metadata: {service_with_quota: {name: service_1}}
  - key: service
    value: service_2
    quota_mode: true
    rate_limit: {unit: hour, requests_per_unit: 2}
    metadata: {service_with_quota: {name: service_2}}
";

#[test]
fn the_metadata_of_the_first_quota_with_room_reaches_envoys_dynamic_metadata() {
    let dir = tempfile::tempdir().expect("a directory");
    std::fs::write(dir.path().join("shop.yaml"), QUOTAS).expect("write the rules");
    let config = Config {
        rls_config: Some(dir.path().to_owned()),
        rls_listen: "127.0.0.1:0".parse().expect("addr"),
        rls_response_dynamic_metadata: true,
        ..Config::defaults()
    };
    let service = Counter::start_on_clock(config, Arc::new(ManualClock::at(Nanos::from_secs(FROZEN_AT_S))));
    let upstream = Upstream::start(&[]);
    let quota = |service: &str| json!({ "actions": [{ "generic_key": { "descriptor_key": "service", "descriptor_value": service } }] });
    // What the filter stored, read back by Envoy's own formatter into a response header.
    let picked = json!({
        "name": "envoy.filters.http.header_mutation",
        "typed_config": {
            "@type": "type.googleapis.com/envoy.extensions.filters.http.header_mutation.v3.HeaderMutation",
            "mutations": { "response_mutations": [{ "append": {
                "header": {
                    "key": "x-service-with-quota",
                    "value": "%DYNAMIC_METADATA(envoy.filters.http.ratelimit:metadata:service_with_quota:name)%",
                },
                "append_action": "OVERWRITE_IF_EXISTS_OR_ADD",
            } }] },
        },
    });
    let envoy = Envoy::builder()
        .workers(2)
        .cluster(cluster("rls", service.rls_addr().expect("rls"), true))
        .cluster(cluster("backend", upstream.addr(), false))
        .route_to("backend")
        .rate_limits(json!([quota("service_1"), quota("service_2")]))
        .filter(native_filter(true))
        .filter(picked)
        .start()
        .unwrap_or_else(|e| panic!("{e}"));

    let answers: Vec<(u16, Option<String>)> = (0..3)
        .map(|_| {
            let response = envoy.send(&Request::get("/"));
            (response.status, response.header("x-service-with-quota").map(str::to_owned))
        })
        .collect();

    let service = |name: &str| (200, Some(name.to_owned()));
    assert_eq!(
        answers[..2],
        [service("service_1"), service("service_2")],
        "the first quota with room names the service: each request spends on both quotas, so service_1 (1) is \
         spent by the first and service_2 (2) by the second"
    );
    assert_eq!(answers[2].0, 429, "quota mode: over when every quota is");
}
