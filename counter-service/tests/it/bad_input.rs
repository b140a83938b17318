//! Whether bad input is refused before it touches a counter: every class of bad input
//! gets its 4xx, alike over HTTP/1.1 and h2c, on the memory store and on Redis.

use serde_json::{Value, json};
use sluice_counter::config::Config;
use sluice_counter::store::CounterStore;

use crate::api::{redis_config, start};
use crate::support::{Http, PROTOCOLS, RedisServer};

pub fn probe_limit() -> Value {
    // One token a day: nothing refills while a test runs.
    json!({"algorithm": "token_bucket", "amount": 1, "per_ms": 86_400_000, "burst": 10})
}

fn probe_entry(cost: u64) -> Value {
    json!({"key": "probe", "limit": probe_limit(), "cost": cost})
}

async fn probe_remaining(http: &Http) -> u64 {
    let (status, body) = http.post("/v1/check", &json!({"entries": [probe_entry(0)]})).await;
    assert_eq!(status, 200, "{body}");
    body["entries"][0]["remaining"].as_u64().expect("remaining")
}

/// (what, path, body, status, code): every class of bad input, each carrying a valid
/// entry for the probe key, so that a partial application would show.
pub fn bad_inputs() -> Vec<(&'static str, &'static str, String, u16, &'static str)> {
    let probe = probe_entry(1);
    let with = |extra: Value| json!({"tag": "p", "entries": [probe.clone(), extra]}).to_string();
    let bucket = |limit: Value| json!({"key": "other", "limit": limit});
    let many: Vec<Value> = (0..10_000).map(|i| json!({"key": format!("k{i}"), "limit": probe_limit()})).collect();
    let seventeen: Vec<Value> = (0..17).map(|i| json!({"key": format!("k{i}"), "limit": probe_limit()})).collect();
    vec![
        ("malformed json", "/v1/check", r#"{"entries": [ {"key": "probe""#.to_owned(), 400, "malformed_json"),
        ("trailing garbage", "/v1/check", format!("{} x", json!({"entries": [probe]})), 400, "malformed_json"),
        ("not an object", "/v1/check", "[1,2,3]".to_owned(), 400, "invalid_value"),
        ("unknown top-level field", "/v1/check", json!({"entries": [probe], "dry_run": true}).to_string(), 400, "unknown_field"),
        ("unknown entry field", "/v1/check", with(json!({"key": "o", "limit": probe_limit(), "weight": 2})), 400, "unknown_field"),
        (
            "unknown limit field",
            "/v1/check",
            with(bucket(json!({"algorithm": "fixed_window", "limit": 5, "window_ms": 1000, "burst": 1}))),
            400,
            "unknown_field",
        ),
        ("missing field", "/v1/check", with(json!({"limit": probe_limit()})), 400, "missing_field"),
        (
            "unknown algorithm",
            "/v1/check",
            with(bucket(json!({"algorithm": "magic", "limit": 5}))),
            400,
            "unknown_algorithm",
        ),
        ("negative cost", "/v1/check", with(json!({"key": "o", "limit": probe_limit(), "cost": -1})), 400, "invalid_value"),
        (
            "string where a number belongs",
            "/v1/check",
            with(bucket(json!({"algorithm": "token_bucket", "amount": "10", "per_ms": 1000, "burst": 5}))),
            400,
            "invalid_value",
        ),
        (
            "fractional number",
            "/v1/check",
            with(bucket(json!({"algorithm": "token_bucket", "amount": 1.5, "per_ms": 1000, "burst": 5}))),
            400,
            "invalid_value",
        ),
        (
            "number beyond u64",
            "/v1/check",
            with(bucket(json!({"algorithm": "fixed_window", "limit": 5, "window_ms": 1e30}))),
            400,
            "invalid_value",
        ),
        (
            "zero window",
            "/v1/check",
            with(bucket(json!({"algorithm": "fixed_window", "limit": 5, "window_ms": 0}))),
            400,
            "invalid_limit",
        ),
        (
            "zero burst",
            "/v1/check",
            with(bucket(json!({"algorithm": "token_bucket", "amount": 1, "per_ms": 1000, "burst": 0}))),
            400,
            "invalid_limit",
        ),
        (
            "zero rate",
            "/v1/check",
            with(bucket(json!({"algorithm": "token_bucket", "amount": 0, "per_ms": 1000, "burst": 5}))),
            400,
            "invalid_limit",
        ),
        (
            "window longer than 31 days",
            "/v1/check",
            with(bucket(json!({"algorithm": "fixed_window", "limit": 5, "window_ms": 31_u64 * 86_400_000 + 1}))),
            400,
            "outside_envelope",
        ),
        (
            "bucket outside the numeric envelope",
            "/v1/check",
            with(bucket(json!({"algorithm": "token_bucket", "amount": 1, "per_ms": 86_400_000, "burst": 1000}))),
            400,
            "outside_envelope",
        ),
        (
            "sliding log longer than 256",
            "/v1/check",
            with(bucket(json!({"algorithm": "sliding_log", "limit": 257, "window_ms": 1000}))),
            400,
            "outside_envelope",
        ),
        ("cost above burst", "/v1/check", with(json!({"key": "o", "limit": probe_limit(), "cost": 11})), 400, "cost_exceeds_capacity"),
        ("no entries", "/v1/check", json!({"entries": []}).to_string(), 400, "no_entries"),
        ("17 entries", "/v1/check", json!({"tag": "p", "entries": seventeen}).to_string(), 400, "too_many_entries"),
        ("10 000 entries", "/v1/check", json!({"tag": "p", "entries": many}).to_string(), 413, "body_too_large"),
        (
            "several entries without a tag",
            "/v1/check",
            json!({"entries": [probe, {"key": "o", "limit": probe_limit()}]}).to_string(),
            400,
            "tag_required",
        ),
        ("duplicate entry", "/v1/check", with(probe.clone()), 400, "duplicate_entry"),
        ("tag with a brace", "/v1/check", json!({"tag": "a}b", "entries": [probe]}).to_string(), 400, "invalid_tag"),
        ("empty key", "/v1/check", with(json!({"key": "", "limit": probe_limit()})), 400, "invalid_key"),
        (
            "lease of a leaky bucket",
            "/v1/lease",
            json!({"key": "probe", "tokens": 1, "ttl_ms": 1000,
                   "limit": {"algorithm": "leaky_bucket", "amount": 1, "per_ms": 1000, "max_queue": 5, "max_wait_ms": 100}})
            .to_string(),
            400,
            "lease_unsupported",
        ),
        (
            "lease of zero tokens",
            "/v1/lease",
            json!({"key": "probe", "tokens": 0, "ttl_ms": 1000, "limit": probe_limit()}).to_string(),
            400,
            "invalid_tokens",
        ),
        (
            "lease of more than the burst",
            "/v1/lease",
            json!({"key": "probe", "tokens": 11, "ttl_ms": 1000, "limit": probe_limit()}).to_string(),
            400,
            "invalid_tokens",
        ),
        (
            "lease with a minimum above its tokens",
            "/v1/lease",
            json!({"key": "probe", "tokens": 2, "min_tokens": 3, "ttl_ms": 1000, "limit": probe_limit()}).to_string(),
            400,
            "invalid_tokens",
        ),
        (
            "lease with a minimum of zero",
            "/v1/lease",
            json!({"key": "probe", "tokens": 2, "min_tokens": 0, "ttl_ms": 1000, "limit": probe_limit()}).to_string(),
            400,
            "invalid_tokens",
        ),
        (
            "lease without a time bound",
            "/v1/lease",
            json!({"key": "probe", "tokens": 1, "ttl_ms": 0, "limit": probe_limit()}).to_string(),
            400,
            "invalid_ttl",
        ),
        (
            "charge of a leaky bucket",
            "/v1/charge",
            json!({"key": "probe", "cost": 1, "max_debt": 0,
                   "limit": {"algorithm": "leaky_bucket", "amount": 1, "per_ms": 1000, "max_queue": 5, "max_wait_ms": 100}})
            .to_string(),
            400,
            "not_chargeable",
        ),
        (
            "charge with a debt bound above the capacity",
            "/v1/charge",
            json!({"key": "probe", "cost": 1, "max_debt": 11, "limit": probe_limit()}).to_string(),
            400,
            "invalid_max_debt",
        ),
        (
            "charge above 2^40",
            "/v1/charge",
            json!({"key": "probe", "cost": (1_u64 << 40) + 1, "max_debt": 1, "limit": probe_limit()}).to_string(),
            400,
            "outside_envelope",
        ),
        (
            "charge without a debt bound",
            "/v1/charge",
            json!({"key": "probe", "cost": 1, "limit": probe_limit()}).to_string(),
            400,
            "missing_field",
        ),
        (
            "charge with an empty id",
            "/v1/charge",
            json!({"key": "probe", "cost": 1, "max_debt": 1, "charge_id": "", "limit": probe_limit()}).to_string(),
            400,
            "invalid_charge_id",
        ),
        (
            "charge with an id longer than 64 bytes",
            "/v1/charge",
            json!({"key": "probe", "cost": 1, "max_debt": 1, "charge_id": "x".repeat(65), "limit": probe_limit()})
                .to_string(),
            400,
            "invalid_charge_id",
        ),
        (
            "charge with an id holding a space",
            "/v1/charge",
            json!({"key": "probe", "cost": 1, "max_debt": 1, "charge_id": "a b", "limit": probe_limit()}).to_string(),
            400,
            "invalid_charge_id",
        ),
        (
            "charge with an id beyond ASCII",
            "/v1/charge",
            json!({"key": "probe", "cost": 1, "max_debt": 1, "charge_id": "é", "limit": probe_limit()}).to_string(),
            400,
            "invalid_charge_id",
        ),
        (
            "charge with its id remembered for no time",
            "/v1/charge",
            json!({"key": "probe", "cost": 1, "max_debt": 1, "charge_id": "a", "id_ttl_ms": 0, "limit": probe_limit()})
                .to_string(),
            400,
            "invalid_id_ttl",
        ),
        (
            "charge with its id remembered for less than a second",
            "/v1/charge",
            json!({"key": "probe", "cost": 1, "max_debt": 1, "charge_id": "a", "id_ttl_ms": 999, "limit": probe_limit()})
                .to_string(),
            400,
            "invalid_id_ttl",
        ),
        (
            "charge with its id remembered for more than ten minutes",
            "/v1/charge",
            json!({"key": "probe", "cost": 1, "max_debt": 1, "charge_id": "a", "id_ttl_ms": 600_001,
                   "limit": probe_limit()})
            .to_string(),
            400,
            "invalid_id_ttl",
        ),
        (
            "charge with an id ttl and no id",
            "/v1/charge",
            json!({"key": "probe", "cost": 1, "max_debt": 1, "id_ttl_ms": 90_000, "limit": probe_limit()}).to_string(),
            400,
            "invalid_id_ttl",
        ),
        (
            "charge with a lease's fields",
            "/v1/charge",
            json!({"key": "probe", "cost": 1, "max_debt": 1, "tokens": 1, "limit": probe_limit()}).to_string(),
            400,
            "unknown_field",
        ),
        (
            "credit of a leaky bucket",
            "/v1/credit",
            json!({"key": "probe", "units": 1, "spent_at_ns": 0,
                   "limit": {"algorithm": "leaky_bucket", "amount": 1, "per_ms": 1000, "max_queue": 5, "max_wait_ms": 100}})
            .to_string(),
            400,
            "not_creditable",
        ),
        (
            "credit of a sliding log",
            "/v1/credit",
            json!({"key": "probe", "units": 1, "spent_at_ns": 0,
                   "limit": {"algorithm": "sliding_log", "limit": 5, "window_ms": 1000}})
            .to_string(),
            400,
            "not_creditable",
        ),
        (
            "credit above 2^40",
            "/v1/credit",
            json!({"key": "probe", "units": (1_u64 << 40) + 1, "spent_at_ns": 0, "limit": probe_limit()}).to_string(),
            400,
            "outside_envelope",
        ),
        (
            "credit without when its units were spent",
            "/v1/credit",
            json!({"key": "probe", "units": 1, "limit": probe_limit()}).to_string(),
            400,
            "missing_field",
        ),
        (
            "credit with an id holding a space",
            "/v1/credit",
            json!({"key": "probe", "units": 1, "spent_at_ns": 0, "credit_id": "a b", "limit": probe_limit()})
                .to_string(),
            400,
            "invalid_credit_id",
        ),
        (
            "credit with an id longer than 64 bytes",
            "/v1/credit",
            json!({"key": "probe", "units": 1, "spent_at_ns": 0, "credit_id": "x".repeat(65), "limit": probe_limit()})
                .to_string(),
            400,
            "invalid_credit_id",
        ),
        (
            "credit with its id remembered for no time",
            "/v1/credit",
            json!({"key": "probe", "units": 1, "spent_at_ns": 0, "credit_id": "a", "id_ttl_ms": 0, "limit": probe_limit()})
                .to_string(),
            400,
            "invalid_id_ttl",
        ),
        (
            "credit with its id remembered for less than a second",
            "/v1/credit",
            json!({"key": "probe", "units": 1, "spent_at_ns": 0, "credit_id": "a", "id_ttl_ms": 999,
                   "limit": probe_limit()})
            .to_string(),
            400,
            "invalid_id_ttl",
        ),
        (
            "credit with its id remembered for more than ten minutes",
            "/v1/credit",
            json!({"key": "probe", "units": 1, "spent_at_ns": 0, "credit_id": "a", "id_ttl_ms": 600_001,
                   "limit": probe_limit()})
            .to_string(),
            400,
            "invalid_id_ttl",
        ),
        (
            "credit with an id ttl and no id",
            "/v1/credit",
            json!({"key": "probe", "units": 1, "spent_at_ns": 0, "id_ttl_ms": 1_000, "limit": probe_limit()})
                .to_string(),
            400,
            "invalid_id_ttl",
        ),
        (
            "credit with a charge's fields",
            "/v1/credit",
            json!({"key": "probe", "units": 1, "spent_at_ns": 0, "charge_id": "a", "limit": probe_limit()})
                .to_string(),
            400,
            "unknown_field",
        ),
        ("unknown route", "/v2/check", json!({"entries": [probe]}).to_string(), 404, "not_found"),
    ]
}

/// Sends every bad input over HTTP/1.1 and over h2c: both get the same answer, and
/// neither changes a counter.
async fn every_class_of_bad_input_gets_its_4xx(addr: std::net::SocketAddr, keys: impl Fn() -> usize) {
    let clients = PROTOCOLS.map(|protocol| Http::with(addr, protocol));
    let http = &clients[0];
    let (status, _) = http.post("/v1/check", &json!({"entries": [probe_entry(5)]})).await;
    assert_eq!(status, 200);
    let remaining = probe_remaining(http).await;
    let key_count = keys();

    for (what, path, body, status, code) in bad_inputs() {
        let mut answers = Vec::new();
        for client in &clients {
            let (got_status, got) = client.post_raw(path, body.clone()).await;

            assert_eq!(
                (got_status, got["error"]["code"].as_str()),
                (status, Some(code)),
                "{what} over {:?}: {got}",
                client.protocol()
            );
            let message = got["error"]["message"].as_str().unwrap_or_default();
            assert!(message.len() > 10, "{what}: the message says what is wrong: {got}");
            if code == "not_creditable" {
                assert!(message.starts_with("limit.algorithm: "), "{what}: the message names the field: {got}");
            }
            if code == "invalid_id_ttl" {
                assert!(message.starts_with("id_ttl_ms: "), "{what}: the message names the field: {got}");
            }
            assert_eq!(probe_remaining(http).await, remaining, "{what} changed a counter");
            assert_eq!(keys(), key_count, "{what} created a key");
            answers.push((got_status, got));
        }
        assert_eq!(answers[0], answers[1], "{what}: HTTP/1.1 and h2c answer alike");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_class_of_bad_input_gets_its_4xx_and_changes_no_counter_in_memory() {
    let _shared = crate::support::HEAVY.read().await;
    let (running, _) = start(Config::defaults()).await;
    let app = running.app.clone();
    let keys = move || match app.store() {
        CounterStore::Memory(m) => m.len(),
        CounterStore::Redis(_) => unreachable!(),
    };

    every_class_of_bad_input_gets_its_4xx(running.addr, keys).await;

    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_class_of_bad_input_gets_its_4xx_and_changes_no_counter_on_redis() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = RedisServer::start();
    let (running, _) = start(redis_config(redis.url())).await;

    every_class_of_bad_input_gets_its_4xx(running.addr, || redis.limiter_keys().len()).await;

    running.stop().await.expect("clean stop");
    redis.assert_every_key_has_a_ttl();
}
