//! Overrides obeyed: what a clamp and a bypass do to checks, leases and charges, which
//! callers they reach, what the answers say, and when they stop.

use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shared_store::ManualClock;

use crate::overrides::{
    HASH_KEY, OVERRIDES, PROXY, admin, clamp, clamp_fields, list, metric, policy_limit, redis_config, start,
    start_on_clock, teach,
};
use crate::support::{HEAVY, Http, RedisServer, t_us};
use sluice_counter::Running;

fn proxy(running: &Running) -> Http {
    Http::new(running.addr).header("authorization", &format!("Bearer {PROXY}"))
}

/// The key a filter sends for `values` of `per-tenant` (version 0): their keyed hash.
fn key_of(value: &str) -> String {
    let mut hasher = shared_store::HashKey::global(HASH_KEY.as_bytes()).fingerprinter("per-tenant", 0);
    hasher.part(value.as_bytes());
    format!("{:032x}", hasher.finish())
}

fn entry(key: &str) -> Value {
    json!({"key": key, "policy": "per-tenant", "limit": policy_limit()})
}

/// Sends `n` checks of one unit for `key`: how many were admitted, and the last answer.
async fn checks(running: &Running, key: &str, n: usize) -> (usize, Value) {
    let http = proxy(running);
    let mut admitted = 0;
    let mut last = Value::Null;
    for _ in 0..n {
        let (status, body) = http.post("/v1/check", &json!({"entries": [entry(key)]})).await;
        assert_eq!(status, 200, "{body}");
        admitted += usize::from(body["admitted"] == true);
        last = body;
    }
    (admitted, last)
}

#[tokio::test]
async fn a_clamp_lowers_a_policys_numbers_for_every_caller_on_the_next_check_and_names_itself_in_the_answer() {
    let clock = ManualClock::at(t_us(1_000_000));
    let running = start_on_clock(&clock);
    teach(&running, &["per-tenant"]).await;
    let (status, set) = admin(&running).post(OVERRIDES, &clamp("per-tenant")).await;
    assert_eq!(status, 201, "{set}");

    let (a, answer) = checks(&running, &key_of("tenant-a"), 10).await;
    let (b, _) = checks(&running, &key_of("tenant-b"), 10).await;

    assert_eq!((a, b), (5, 5), "the clamp's burst of 5, not the policy's 10, for every caller");
    assert_eq!(answer["overrides"], json!([{"entry": 0, "id": set["id"], "kind": "clamp"}]));
    assert_eq!(answer["entries"][0]["limit"], 5, "the answer shows the numbers it was decided under");
    assert_eq!(metric(&admin(&running), "sluice_counter_overridden_entries_total{kind=\"clamp\"}").await, 20.0);

    let id = set["id"].as_str().expect("an id");
    let (removed, _) = admin(&running).send("DELETE", &format!("{OVERRIDES}/{id}"), "").await;
    assert_eq!(removed, 204);
    let (at_once, _) = checks(&running, &key_of("tenant-a"), 10).await;
    clock.advance(shared_store::Nanos::from_millis(500));
    let (refilled, answer) = checks(&running, &key_of("tenant-a"), 10).await;

    assert_eq!(at_once, 5, "the end of a clamp hands out no fresh budget: the policy's counter spent 5 of its 10");
    assert_eq!(refilled, 5, "and it refills at the policy's 10 a second (the clamp's 1 a second never touched it)");
    assert!(answer.get("overrides").is_none(), "{answer}");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_keyed_bypass_admits_only_its_callers_without_spending_and_forgives_their_charges() {
    let clock = ManualClock::at(t_us(1_000_000));
    let running = start_on_clock(&clock);
    teach(&running, &["per-tenant"]).await;
    let mut body = serde_json::Map::new();
    body.insert("kind".to_owned(), json!("bypass"));
    body.insert("policy".to_owned(), json!("per-tenant"));
    body.insert("key".to_owned(), json!(["tenant-a"]));
    body.insert("ttl_ms".to_owned(), json!(60_000));
    body.insert("reason".to_owned(), json!("partner locked out by a misconfigured limit"));
    body.insert("operator".to_owned(), json!("bob"));
    let (status, set) = admin(&running).post(OVERRIDES, &Value::Object(body)).await;
    assert_eq!(status, 201, "{set}");
    let (a, b) = (key_of("tenant-a"), key_of("tenant-b"));
    let http = proxy(&running);

    let (a_admitted, a_answer) = checks(&running, &a, 30).await;
    let (b_admitted, b_answer) = checks(&running, &b, 30).await;
    let (_, both) = http.post("/v1/check", &json!({"tag": b, "entries": [entry(&a), entry(&b)]})).await;
    let lease = json!({"key": a, "policy": "per-tenant", "limit": policy_limit(), "tokens": 10, "ttl_ms": 1000});
    let (_, leased) = http.post("/v1/lease", &lease).await;
    let charge = json!({"key": a, "policy": "per-tenant", "limit": policy_limit(), "cost": 7, "max_debt": 10});
    let (_, charged) = http.post("/v1/charge", &charge).await;

    assert_eq!((a_admitted, b_admitted), (30, 10), "only the bypassed caller passes the limit");
    let bypass = json!({"entry": 0, "id": set["id"], "kind": "bypass"});
    assert_eq!(a_answer["overrides"], json!([bypass]));
    assert_eq!(a_answer["entries"][0]["remaining"], 10, "nothing spent");
    assert!(b_answer.get("overrides").is_none(), "{b_answer}");
    assert_eq!(both["admitted"], false, "the other caller's entry still decides the check: {both}");
    assert_eq!(
        (&both["entries"][0]["verdict"], &both["entries"][1]["verdict"]),
        (&json!("allowed"), &json!("rejected"))
    );
    assert_eq!(both["overrides"], json!([bypass]));
    assert_eq!((&leased["granted"], &leased["override"]["kind"]), (&json!(10), &json!("bypass")), "{leased}");
    assert_eq!((&charged["charged"], &charged["forgiven"]), (&json!(0), &json!(7)), "{charged}");
    assert_eq!(charged["override"]["id"], set["id"]);

    let id = set["id"].as_str().expect("an id");
    admin(&running).send("DELETE", &format!("{OVERRIDES}/{id}"), "").await;
    let (after, _) = checks(&running, &a, 30).await;

    assert_eq!(after, 10, "the bypassed caller's own budget is whole: the bypass spent none of it");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_clamp_expires_by_itself_and_traffic_returns_to_the_policys_numbers() {
    let clock = ManualClock::at(t_us(1_000_000));
    let running = start_on_clock(&clock);
    teach(&running, &["per-tenant"]).await;
    let mut short = clamp_fields("per-tenant");
    short.insert("ttl_ms".to_owned(), json!(1_000));
    let (status, _) = admin(&running).post(OVERRIDES, &Value::Object(short)).await;
    assert_eq!(status, 201);

    let (clamped, _) = checks(&running, &key_of("tenant-a"), 10).await;
    clock.advance(shared_store::Nanos::from_millis(1_000));
    let (after, answer) = checks(&running, &key_of("tenant-c"), 12).await;

    assert_eq!((clamped, after), (5, 10));
    assert!(answer.get("overrides").is_none(), "{answer}");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_lease_under_a_clamp_is_granted_at_most_the_clamps_burst() {
    let clock = ManualClock::at(t_us(1_000_000));
    let running = start_on_clock(&clock);
    teach(&running, &["per-tenant"]).await;
    let (_, set) = admin(&running).post(OVERRIDES, &clamp("per-tenant")).await;
    let lease = json!({
        "key": key_of("tenant-a"), "policy": "per-tenant", "limit": policy_limit(), "tokens": 10, "ttl_ms": 1000,
    });

    let (status, leased) = proxy(&running).post("/v1/lease", &lease).await;

    assert_eq!(status, 200, "{leased}");
    assert_eq!(leased["granted"], 5, "{leased}");
    assert_eq!(leased["override"], json!({"id": set["id"], "kind": "clamp"}));
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_override_for_a_policy_no_proxy_named_or_a_shaping_clamp_on_a_counting_policy_is_refused_and_nothing_is_stored()
 {
    let running = start(crate::overrides::admin_config(sluice_counter::config::Config::defaults())).await;
    teach(&running, &["per-tenant"]).await;
    let http = admin(&running);
    let mut shaping = clamp_fields("per-tenant");
    shaping.insert(
        "limit".to_owned(),
        json!({"algorithm": "leaky_bucket", "amount": 1, "per_ms": 1000, "max_queue": 2, "max_wait_ms": 500}),
    );

    let (unknown, typo) = http.post(OVERRIDES, &clamp("per-tenent")).await;
    let (shaper, refused) = http.post(OVERRIDES, &Value::Object(shaping)).await;

    assert_eq!((unknown, typo["error"]["code"].as_str()), (400, Some("unknown_policy")), "{typo}");
    assert!(typo["error"]["message"].as_str().is_some_and(|m| m.starts_with("policy: ")), "{typo}");
    assert_eq!((shaper, refused["error"]["code"].as_str()), (400, Some("invalid_clamp")), "{refused}");
    assert!(refused["error"]["message"].as_str().is_some_and(|m| m.starts_with("limit: ")), "{refused}");
    assert!(list(&http).await.is_empty(), "nothing was stored");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_clamp_of_another_algorithm_or_higher_numbers_is_a_second_limit_and_never_lets_more_through() {
    let clock = ManualClock::at(t_us(1_000_000));
    let running = start_on_clock(&clock);
    teach(&running, &["per-tenant"]).await;
    let mut window = clamp_fields("per-tenant");
    window.insert("limit".to_owned(), json!({"algorithm": "fixed_window", "limit": 3, "window_ms": 60_000}));
    let (status, set) = admin(&running).post(OVERRIDES, &Value::Object(window)).await;
    assert_eq!(status, 201, "{set}");

    let (a, answer) = checks(&running, &key_of("tenant-a"), 10).await;
    clock.advance(shared_store::Nanos::from_millis(1_000));
    let (later, _) = checks(&running, &key_of("tenant-a"), 10).await;
    let id = set["id"].as_str().expect("an id");
    admin(&running).send("DELETE", &format!("{OVERRIDES}/{id}"), "").await;
    let mut higher = clamp_fields("per-tenant");
    higher.insert("limit".to_owned(), json!({"algorithm": "token_bucket", "amount": 100, "per_ms": 1000, "burst": 50}));
    let (status, _) = admin(&running).post(OVERRIDES, &Value::Object(higher)).await;
    assert_eq!(status, 201);
    let (b, _) = checks(&running, &key_of("tenant-b"), 20).await;

    assert_eq!(a, 3, "3 a minute: the clamp's window, beside the policy's burst of 10");
    assert_eq!(answer["entries"][0]["verdict"], "rejected", "{answer}");
    assert_eq!(later, 0, "the clamp's window is spent for the minute, though the policy refilled");
    assert_eq!(b, 10, "a clamp above the policy's numbers leaves the policy's own limit in force");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_clamp_set_through_one_instance_on_redis_is_obeyed_by_another_within_its_sweep_interval() {
    let _shared = HEAVY.read().await;
    let redis = RedisServer::start();
    let one = start(redis_config(&redis)).await;
    let two = start(redis_config(&redis)).await;
    teach(&one, &["per-tenant"]).await;
    let key = key_of("tenant-a");
    let (status, set) = admin(&one).post(OVERRIDES, &clamp("per-tenant")).await;
    assert_eq!(status, 201, "{set}");
    let started = Instant::now();

    let mut seen = None;
    while started.elapsed() < Duration::from_secs(5) {
        let (status, answer) = proxy(&two).post("/v1/check", &json!({"entries": [entry(&key)]})).await;
        assert_eq!(status, 200);
        if answer.get("overrides").is_some() {
            seen = Some((started.elapsed(), answer));
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }

    let (took, answer) = seen.expect("the other instance obeys the clamp");
    assert_eq!(answer["overrides"][0]["id"], set["id"]);
    // The sweep interval here is 20 ms; a second is a generous margin for a busy machine.
    assert!(took < Duration::from_secs(1), "obeyed after {took:?}");
    one.stop().await.expect("clean stop");
    two.stop().await.expect("clean stop");
}
