//! Whether `App::handle_now`, the synchronous entry for deterministic simulations, matches
//! the HTTP routes: the same answers, bytes for bytes, and the same metrics.

use std::sync::Arc;

use serde_json::json;
use shared_store::{ManualClock, Nanos};
use sluice_counter::config::{Config, Secret, StoreKind};
use sluice_counter::store::{CounterStore, MemoryConfig, MemoryCounters};
use sluice_counter::{App, Running};

use crate::bad_input::bad_inputs;
use crate::support::{Http, t_us};

const TOKEN: &str = "sim-t0ken";

fn memory_on(clock: &ManualClock) -> CounterStore {
    CounterStore::Memory(MemoryCounters::with_clock(
        MemoryConfig { shards: 4, ..MemoryConfig::default() },
        Arc::new(clock.clone()),
    ))
}

/// (method, path, authorization, body): valid decisions of every kind, repeated so that
/// they reach rejections and duplicates, then every class of bad input.
fn requests() -> Vec<(&'static str, String, Option<String>, String)> {
    let bucket = json!({"algorithm": "token_bucket", "amount": 1, "per_ms": 1000, "burst": 3});
    let window = json!({"algorithm": "fixed_window", "limit": 2, "window_ms": 1000});
    let check = json!({"tag": "t", "entries": [{"key": "a", "limit": bucket}, {"key": "b", "limit": window}]});
    let lease = json!({"key": "l", "tokens": 2, "min_tokens": 2, "ttl_ms": 500, "limit": bucket});
    let charge = json!({"key": "a", "cost": 2, "max_debt": 1, "charge_id": "c-1", "limit": bucket, "tag": "t"});
    let spent_at = t_us(0).as_u64();
    let credit =
        json!({"key": "a", "units": 1, "spent_at_ns": spent_at, "credit_id": "c-1", "limit": bucket, "tag": "t"});
    let right = Some(format!("Bearer {TOKEN}"));
    let mut requests = Vec::new();
    for body in [&check, &check, &check, &lease, &lease, &charge, &charge, &credit, &credit] {
        requests.push(("POST", "/v1/".to_owned() + route_of(body), right.clone(), body.to_string()));
    }
    requests.push(("GET", "/v1/check".to_owned(), right.clone(), String::new()));
    requests.push(("POST", "/v1/check".to_owned(), None, check.to_string()));
    requests.push(("POST", "/v1/check".to_owned(), Some("Bearer another".to_owned()), check.to_string()));
    requests.push(("POST", "/v1/check".to_owned(), Some(format!("Basic {TOKEN}")), check.to_string()));
    for (_, path, body, _, _) in bad_inputs() {
        requests.push(("POST", path.to_owned(), right.clone(), body));
    }
    requests
}

fn route_of(body: &serde_json::Value) -> &'static str {
    if body.get("entries").is_some() {
        "check"
    } else if body.get("tokens").is_some() {
        "lease"
    } else if body.get("units").is_some() {
        "credit"
    } else {
        "charge"
    }
}

/// The lines of `/metrics` both paths must agree on (not latency or connections).
fn decision_metrics(rendered: &str) -> Vec<String> {
    let kept =
        ["decisions", "leases", "leased", "charges", "charged", "forgiven", "credit", "duplicate", "unauthorized"];
    rendered
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| kept.iter().any(|k| l.starts_with(&format!("sluice_counter_{k}"))) || l.contains("responses_total"))
        .map(str::to_owned)
        .collect()
}

async fn the_same_answers_as_http(config: Config) {
    let clock = ManualClock::at(t_us(0));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let running = Running::start_with_store(listener, config.clone(), memory_on(&clock)).expect("starts");
    let simulated = App::new(memory_on(&clock), &config, config.auth().expect("a valid token"));
    let http = Http::new(running.addr);

    for (step, (method, path, authorization, body)) in requests().into_iter().enumerate() {
        clock.set(t_us(step as u64 * 150_000));
        let client = match &authorization {
            Some(value) => http.clone().header("authorization", value),
            None => http.clone(),
        };
        let (status, answer) = client.send(method, &path, body.clone()).await;
        let (now_status, now_answer) =
            simulated.handle_now(method, &path, authorization.as_deref().map(str::as_bytes), body.as_bytes());

        assert_eq!(
            (now_status, String::from_utf8_lossy(&now_answer)),
            (status, String::from_utf8_lossy(&answer)),
            "step {step}: {method} {path} {body:.200}"
        );
    }
    let over_http = decision_metrics(&running.app.metrics().render(running.app.store()));
    let simulated_metrics = decision_metrics(&simulated.metrics().render(simulated.store()));

    assert_eq!(simulated_metrics, over_http);
    assert!(over_http.iter().any(|l| l == "sluice_counter_duplicate_charges_total 1"), "{over_http:#?}");
    assert!(over_http.iter().any(|l| l == "sluice_counter_duplicate_credits_total 1"), "{over_http:#?}");
    assert!(over_http.iter().any(|l| l == "sluice_counter_credited_tokens_total 1"), "{over_http:#?}");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn handle_now_answers_every_request_as_the_http_routes_do_bytes_for_bytes() {
    let _shared = crate::support::HEAVY.read().await;
    the_same_answers_as_http(Config::defaults()).await;
}

#[tokio::test]
async fn handle_now_authenticates_callers_as_the_http_routes_do() {
    let _shared = crate::support::HEAVY.read().await;
    the_same_answers_as_http(Config { token: Some(Secret::from(TOKEN.to_owned())), ..Config::defaults() }).await;
}

#[test]
fn handle_now_on_redis_answers_store_unavailable_and_says_it_needs_the_async_path() {
    let config =
        Config { store: StoreKind::Redis, redis_url: vec!["redis://127.0.0.1:1".to_owned()], ..Config::defaults() };
    let redis = sluice_counter::store::RedisCounters::new(config.redis()).expect("a store (it connects lazily)");
    let app = App::new(CounterStore::Redis(Box::new(redis)), &config, config.auth().expect("open"));
    let body =
        json!({"entries": [{"key": "k", "limit": {"algorithm": "fixed_window", "limit": 1, "window_ms": 1000}}]});

    let (status, answer) = app.handle_now("POST", "/v1/check", None, body.to_string().as_bytes());

    let answer: serde_json::Value = serde_json::from_slice(&answer).expect("json");
    assert_eq!((status, answer["error"]["code"].as_str()), (503, Some("store_unavailable")));
    assert!(answer["error"]["message"].as_str().is_some_and(|m| m.contains("async")), "{answer}");
}

#[test]
fn handle_now_serves_no_probe_and_says_so() {
    let clock = ManualClock::at(Nanos::from_secs(1_750_000_000));
    let config = Config::defaults();
    let app = App::new(memory_on(&clock), &config, config.auth().expect("open"));

    for path in ["/healthz", "/readyz", "/metrics"] {
        let (status, answer) = app.handle_now("GET", path, None, b"");

        let answer = String::from_utf8_lossy(&answer);
        assert_eq!(status, 404, "{path}");
        assert!(answer.contains("served over HTTP only"), "{answer}");
    }
}
