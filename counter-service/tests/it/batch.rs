//! `POST /v1/checks`: independent checks decided in one call, each as `POST /v1/check`
//! decides it, in order, a bad one refused alone; on the memory store, Redis and a Redis
//! Cluster, over HTTP and through `handle_now`.

use serde_json::{Value, json};
use sluice_counter::app::App;
use sluice_counter::config::{Config, StoreKind};

use crate::api::start;
use crate::support::{Http, RedisServer, shared_cluster};

fn window(limit: u64) -> Value {
    json!({"algorithm": "fixed_window", "limit": limit, "window_ms": 600_000})
}

fn check(tag: &str, entries: &[(&str, u64, u64)]) -> Value {
    let entries: Vec<Value> =
        entries.iter().map(|(key, limit, cost)| json!({"key": key, "limit": window(*limit), "cost": cost})).collect();
    json!({"tag": tag, "entries": entries})
}

/// One batch of three checks after a counter (`full`) was spent: an admission, a check
/// refused whole because one of its entries is spent (its other entry not spent), and
/// a check no limit could admit (refused alone, as `/v1/check` would refuse it).
async fn a_batch_decides_each_check_as_a_single_check_would(http: &Http, tag: &str) {
    let (status, _) = http.post("/v1/check", &check(tag, &[("full", 1, 1)])).await;
    assert_eq!(status, 200);
    let batch = json!({"checks": [
        check(tag, &[("a", 2, 1)]),
        check(tag, &[("b", 5, 1), ("full", 1, 1)]),
        check(tag, &[("a", 2, 3)]),
    ]});

    let (status, answer) = http.post("/v1/checks", &batch).await;

    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().expect("results");
    assert_eq!(results.len(), 3, "{answer}");
    assert_eq!(
        (results[0]["admitted"].as_bool(), results[0]["entries"][0]["remaining"].as_u64()),
        (Some(true), Some(1))
    );
    assert_eq!(results[1]["admitted"], false, "{answer}");
    assert_eq!(results[1]["entries"][1]["verdict"], "rejected", "{answer}");
    assert_eq!(results[2]["status"], 400, "{answer}");
    assert_eq!(results[2]["error"]["code"], "cost_exceeds_capacity", "{answer}");
    assert!(results[2]["error"]["message"].as_str().is_some_and(|m| m.starts_with("checks[2].")), "{answer}");
    // The refused check spent nothing on its other entry; the admitted one spent once.
    let (_, b) = http.post("/v1/check", &check(tag, &[("b", 5, 5)])).await;
    let (_, a) = http.post("/v1/check", &check(tag, &[("a", 2, 1)])).await;
    assert_eq!(b["admitted"], true, "b untouched by the refused check: {b}");
    assert_eq!((a["admitted"].as_bool(), a["entries"][0]["remaining"].as_u64()), (Some(true), Some(0)), "{a}");
}

#[tokio::test]
async fn a_batch_decides_each_check_as_a_single_check_would_on_the_memory_store() {
    let _shared = crate::support::HEAVY.read().await;
    let (running, http) = start(Config::defaults()).await;
    a_batch_decides_each_check_as_a_single_check_would(&http, "t").await;
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_batch_decides_each_check_as_a_single_check_would_on_redis() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = RedisServer::start();
    let (running, http) = start(crate::api::redis_config(redis.url())).await;
    a_batch_decides_each_check_as_a_single_check_would(&http, "t").await;
    running.stop().await.expect("clean stop");
    redis.assert_every_key_has_a_ttl();
}

#[tokio::test]
async fn a_batch_decides_each_check_as_a_single_check_would_on_a_redis_cluster() {
    let _shared = crate::support::HEAVY.read().await;
    let cluster = shared_cluster();
    let config = Config { store: StoreKind::RedisCluster, redis_url: cluster.urls(), ..Config::defaults() };
    let (running, http) = start(config).await;
    // Checks of one call on several tags: several nodes.
    for tag in ["batch-a", "batch-b", "batch-c"] {
        a_batch_decides_each_check_as_a_single_check_would(&http, tag).await;
    }
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_batch_of_many_checks_on_one_counter_admits_exactly_its_limit() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = RedisServer::start();
    let (running, http) = start(crate::api::redis_config(redis.url())).await;
    let checks: Vec<Value> = (0..64).map(|_| check("t", &[("shared", 10, 1)])).collect();

    let (status, answer) = http.post("/v1/checks", &json!({ "checks": checks })).await;

    assert_eq!(status, 200);
    let admitted = answer["results"].as_array().expect("results").iter().filter(|r| r["admitted"] == true).count();
    assert_eq!(admitted, 10, "64 concurrent checks of one unit on a limit of 10: {answer}");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_empty_batch_or_one_beyond_its_bound_is_refused_whole_naming_the_bound_and_decides_nothing() {
    let _shared = crate::support::HEAVY.read().await;
    let (running, http) = start(Config::defaults()).await;
    let checks: Vec<Value> = (0..65).map(|_| check("t", &[("k", 100, 1)])).collect();

    let (too_many, beyond) = http.post("/v1/checks", &json!({ "checks": checks })).await;
    let (none, empty) = http.post("/v1/checks", &json!({ "checks": [] })).await;
    let (unknown, stray) = http.post("/v1/checks", &json!({ "checks": [], "extra": 1 })).await;

    assert_eq!((too_many, beyond["error"]["code"].as_str()), (400, Some("too_many_checks")), "{beyond}");
    assert_eq!(beyond["error"]["message"], "checks: 65 checks, at most 64 per call");
    assert_eq!((none, empty["error"]["code"].as_str()), (400, Some("no_checks")), "{empty}");
    assert_eq!((unknown, stray["error"]["code"].as_str()), (400, Some("unknown_field")), "{stray}");
    let (_, k) = http.post("/v1/check", &check("t", &[("k", 100, 100)])).await;
    assert_eq!(k["admitted"], true, "nothing was spent: {k}");
    running.stop().await.expect("clean stop");
}

#[test]
fn handle_now_answers_a_batch_as_the_http_route_does() {
    let config = Config::defaults();
    let app = App::new(crate::support::memory_store(), &config, config.auth().expect("open"));
    let batch = json!({"checks": [check("t", &[("a", 1, 1)]), check("t", &[("a", 1, 1)]), json!({"entries": []})]});

    let (status, answer) = app.handle_now("POST", "/v1/checks", None, batch.to_string().as_bytes());

    let answer: Value = serde_json::from_slice(&answer).expect("json");
    assert_eq!(status, 200, "{answer}");
    let results = answer["results"].as_array().expect("results");
    assert_eq!((results[0]["admitted"].as_bool(), results[1]["admitted"].as_bool()), (Some(true), Some(false)));
    assert_eq!((results[2]["status"].as_u64(), results[2]["error"]["code"].as_str()), (Some(400), Some("no_entries")));
}
