//! What the HTTP API answers, served in-process on port 0: decisions, probes, metrics,
//! error codes and bounds (bad input has its own file, `bad_input.rs`).

use serde_json::{Value, json};
use sluice_counter::config::{Config, StoreKind};
use sluice_counter::store::CounterStore;
use sluice_counter::{Running, store::CounterStoreError};

use crate::bad_input::probe_limit;
use crate::support::{Http, PROTOCOLS, free_port};

pub async fn start(config: Config) -> (Running, Http) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let running = Running::start(listener, config).await.expect("the service starts");
    let http = Http::new(running.addr);
    (running, http)
}

pub fn redis_config(url: String) -> Config {
    Config { store: StoreKind::Redis, redis_url: vec![url], ..Config::defaults() }
}

#[tokio::test]
async fn a_check_answers_every_entry_with_limit_remaining_reset_and_retry() {
    let _shared = crate::support::HEAVY.read().await;
    for protocol in PROTOCOLS {
        a_check_answers_every_entry_with_limit_remaining_reset_and_retry_over(protocol).await;
    }
}

async fn a_check_answers_every_entry_with_limit_remaining_reset_and_retry_over(protocol: crate::support::Protocol) {
    let (running, _) = start(Config::defaults()).await;
    let http = Http::with(running.addr, protocol);
    let limit = json!({"algorithm": "fixed_window", "limit": 1, "window_ms": 60_000});
    let body = json!({"tag": "client-1", "entries": [
        {"key": "per-client", "policy_version": 1, "limit": limit, "cost": 1},
        {"key": "per-route", "limit": {"algorithm": "token_bucket", "amount": 10, "per_ms": 1000, "burst": 10}},
    ]});

    let (first_status, first) = http.post("/v1/check", &body).await;
    let (_, second) = http.post("/v1/check", &body).await;

    assert_eq!(first_status, 200);
    assert_eq!(first["admitted"], true);
    assert!(first["at_ns"].as_u64().expect("at_ns") > 1_700_000_000_000_000_000);
    assert_eq!(first["entries"][1]["remaining"], 9);
    assert_eq!(second["admitted"], false);
    let rejected = &second["entries"][0];
    assert_eq!(rejected["verdict"], "rejected");
    assert_eq!((rejected["limit"].as_u64(), rejected["remaining"].as_u64()), (Some(1), Some(0)));
    let retry = rejected["retry_after_ns"].as_u64().expect("retry");
    assert!(retry > 0 && retry <= 60_000_000_000, "{rejected}");
    assert_eq!(rejected["reset_after_ns"].as_u64(), Some(retry));
    assert_eq!(second["entries"][1]["verdict"], "allowed", "the bucket alone would admit");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_lease_grants_what_is_left_and_says_how_long_it_lasts() {
    let _shared = crate::support::HEAVY.read().await;
    for protocol in PROTOCOLS {
        a_lease_grants_what_is_left_and_says_how_long_it_lasts_over(protocol).await;
    }
}

async fn a_lease_grants_what_is_left_and_says_how_long_it_lasts_over(protocol: crate::support::Protocol) {
    let (running, _) = start(Config::defaults()).await;
    let http = Http::with(running.addr, protocol);
    let body = json!({"key": "route", "tokens": 8, "ttl_ms": 2000,
                      "limit": {"algorithm": "token_bucket", "amount": 1, "per_ms": 60_000, "burst": 10}});

    let (status, first) = http.post("/v1/lease", &body).await;
    let (_, second) = http.post("/v1/lease", &body).await;

    assert_eq!(status, 200);
    assert_eq!((first["granted"].as_u64(), first["expires_in_ms"].as_u64()), (Some(8), Some(2000)));
    assert_eq!(first["entry"]["remaining"], 2);
    assert_eq!(second["granted"], 2);
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_charge_answers_what_it_spent_what_it_forgave_and_the_limit_after_it() {
    let _shared = crate::support::HEAVY.read().await;
    for protocol in PROTOCOLS {
        a_charge_answers_what_it_spent_what_it_forgave_and_the_limit_after_it_over(protocol).await;
    }
}

async fn a_charge_answers_what_it_spent_what_it_forgave_and_the_limit_after_it_over(
    protocol: crate::support::Protocol,
) {
    let (running, _) = start(Config::defaults()).await;
    let http = Http::with(running.addr, protocol);
    let charge = |cost: u64| json!({"key": "route", "cost": cost, "max_debt": 3, "limit": probe_limit()});

    let (status, first) = http.post("/v1/charge", &charge(15)).await;
    let (_, second) = http.post("/v1/charge", &charge(1)).await;
    let (_, check) = http.post("/v1/check", &json!({"entries": [{"key": "route", "limit": probe_limit()}]})).await;
    let with_id = json!({"key": "other", "cost": 4, "max_debt": 0, "charge_id": "7f3a", "limit": probe_limit()});
    let (_, once) = http.post("/v1/charge", &with_id).await;
    let (_, twice) = http.post("/v1/charge", &with_id).await;
    let (_, metrics) = http.get("/metrics").await;

    assert_eq!(status, 200, "{first}");
    assert_eq!((first["charged"].as_u64(), first["forgiven"].as_u64()), (Some(13), Some(2)), "{first}");
    assert!(first["at_ns"].as_u64().expect("at_ns") > 1_700_000_000_000_000_000);
    let entry = &first["entry"];
    assert_eq!(
        (entry["verdict"].as_str(), entry["remaining"].as_u64(), entry["limit"].as_u64()),
        (Some("rejected"), Some(0), Some(10))
    );
    // 13 tokens of debt at one a day: one token is admitted again once 4 have refilled.
    let retry = entry["retry_after_ns"].as_u64().expect("retry");
    let four_days = 4 * 86_400_000_000_000_u64;
    assert!(retry <= four_days && retry > four_days - 60_000_000_000, "{entry}");
    assert!(entry["reset_after_ns"].as_u64().expect("reset") > 12 * 86_400_000_000_000, "{entry}");
    assert_eq!((second["charged"].as_u64(), second["forgiven"].as_u64()), (Some(0), Some(1)), "at the bound: {second}");
    assert_eq!((check["admitted"].as_bool(), check["entries"][0]["verdict"].as_str()), (Some(false), Some("rejected")));
    assert_eq!((once["charged"].as_u64(), once["duplicate"].as_bool()), (Some(4), Some(false)), "{once}");
    assert_eq!((twice["charged"].as_u64(), twice["duplicate"].as_bool()), (Some(4), Some(true)), "{twice}");
    assert_eq!(twice["entry"]["remaining"], 6, "{twice}");
    for line in [
        "sluice_counter_charges_total 3",
        "sluice_counter_charged_tokens_total 17",
        "sluice_counter_forgiven_tokens_total 3",
        "sluice_counter_duplicate_charges_total 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing {line:?} in\n{metrics}");
    }
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_credit_answers_what_it_gave_back_what_it_forgave_and_the_limit_after_it() {
    let _shared = crate::support::HEAVY.read().await;
    for protocol in PROTOCOLS {
        a_credit_answers_what_it_gave_back_what_it_forgave_and_the_limit_after_it_over(protocol).await;
    }
}

async fn a_credit_answers_what_it_gave_back_what_it_forgave_and_the_limit_after_it_over(
    protocol: crate::support::Protocol,
) {
    let (running, _) = start(Config::defaults()).await;
    let http = Http::with(running.addr, protocol);
    let (_, spent) =
        http.post("/v1/check", &json!({"entries": [{"key": "route", "limit": probe_limit(), "cost": 8}]})).await;
    let spent_at = spent["at_ns"].as_u64().expect("at_ns");
    let credit = |units: u64, id: &str| json!({"key": "route", "units": units, "spent_at_ns": spent_at, "credit_id": id, "limit": probe_limit()});

    let (status, first) = http.post("/v1/credit", &credit(5, "r-1")).await;
    let (_, again) = http.post("/v1/credit", &credit(5, "r-1")).await;
    let (_, to_full) = http.post("/v1/credit", &credit(9, "r-2")).await;
    let (_, full) = http.post("/v1/credit", &credit(4, "r-3")).await;
    let (_, metrics) = http.get("/metrics").await;

    assert_eq!(status, 200, "{first}");
    assert_eq!(
        (first["credited"].as_u64(), first["forgiven"].as_u64(), first["duplicate"].as_bool()),
        (Some(5), Some(0), Some(false)),
        "{first}"
    );
    assert!(first["at_ns"].as_u64().expect("at_ns") >= spent_at, "{first}");
    let entry = &first["entry"];
    assert_eq!(
        (entry["verdict"].as_str(), entry["remaining"].as_u64(), entry["limit"].as_u64()),
        (Some("allowed"), Some(7), Some(10)),
        "8 spent, 5 given back: {first}"
    );
    assert_eq!((again["credited"].as_u64(), again["duplicate"].as_bool()), (Some(5), Some(true)), "{again}");
    assert_eq!(again["entry"]["remaining"], 7, "given back once: {again}");
    assert_eq!(
        (to_full["credited"].as_u64(), to_full["forgiven"].as_u64(), to_full["entry"]["remaining"].as_u64()),
        (Some(3), Some(6), Some(10)),
        "the 3 missing given back, the rest forgiven: {to_full}"
    );
    assert_eq!((full["credited"].as_u64(), full["forgiven"].as_u64()), (Some(0), Some(4)), "full: {full}");
    for line in [
        "sluice_counter_credits_total 3",
        "sluice_counter_credited_tokens_total 8",
        "sluice_counter_credit_forgiven_tokens_total 10",
        "sluice_counter_duplicate_credits_total 1",
        "sluice_counter_charges_total 0",
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing {line:?} in\n{metrics}");
    }
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_charge_or_a_credit_may_ask_for_its_id_to_be_remembered_from_a_second_to_ten_minutes() {
    let _shared = crate::support::HEAVY.read().await;
    let (running, http) = start(Config::defaults()).await;
    let charge = |id: &str, ttl: u64| json!({"key": "route", "cost": 1, "max_debt": 0, "charge_id": id, "id_ttl_ms": ttl, "limit": probe_limit()});
    let credit = json!({"key": "route", "units": 1, "spent_at_ns": 0, "credit_id": "r", "id_ttl_ms": 90_000,
                        "limit": probe_limit()});

    let (shortest, _) = http.post("/v1/charge", &charge("a", 1_000)).await;
    let (filters, _) = http.post("/v1/charge", &charge("b", 90_000)).await;
    let (longest, _) = http.post("/v1/charge", &charge("c", 600_000)).await;
    let (_, again) = http.post("/v1/charge", &charge("b", 90_000)).await;
    let (credited, _) = http.post("/v1/credit", &credit).await;
    let (_, metrics) = http.get("/metrics").await;

    assert_eq!((shortest, filters, longest, credited), (200, 200, 200, 200));
    assert_eq!((again["charged"].as_u64(), again["duplicate"].as_bool()), (Some(1), Some(true)), "{again}");
    let ids = "sluice_counter_memory_charge_ids 4";
    assert!(metrics.lines().any(|l| l == ids), "missing {ids:?} in\n{metrics}");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn health_readiness_and_metrics_are_served() {
    let _shared = crate::support::HEAVY.read().await;
    let (running, http) = start(Config::defaults()).await;
    let body = json!({"entries": [{"key": "k", "policy": "per-route",
                                   "limit": {"algorithm": "fixed_window", "limit": 1, "window_ms": 60_000}}]});
    http.post("/v1/check", &body).await;
    http.post("/v1/check", &body).await;
    http.post_raw("/v1/check", "{").await;

    let (health, _) = http.get("/healthz").await;
    let (ready, ready_body) = http.get("/readyz").await;
    let (metrics_status, metrics) = http.get("/metrics").await;

    assert_eq!((health, ready), (200, 200), "{ready_body}");
    assert_eq!(metrics_status, 200);
    for line in [
        "sluice_counter_decisions_total{outcome=\"admitted\"} 1",
        "sluice_counter_decisions_total{outcome=\"rejected\"} 1",
        "sluice_counter_policy_decisions_total{policy=\"per-route\",outcome=\"admitted\"} 1",
        "sluice_counter_policy_decisions_total{policy=\"per-route\",outcome=\"rejected\"} 1",
        "sluice_counter_store_latency_seconds_count{store=\"memory\",op=\"check\"} 2",
        "sluice_counter_store_latency_seconds_count{store=\"memory\",op=\"admin\"} 1", // /readyz
        "sluice_counter_store_latency_seconds_count{store=\"memory\",op=\"lease\"} 0",
        "sluice_counter_store_errors_total{kind=\"timeout\"} 0",
        "sluice_counter_in_flight_requests 0", // /metrics and /healthz bypass the in-flight bound
        "sluice_counter_refused_connections_total 0",
        "sluice_counter_responses_total{status=\"400\"} 1",
        "sluice_counter_memory_keys 1",
    ] {
        assert!(metrics.lines().any(|l| l == line), "missing {line:?} in\n{metrics}");
    }
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_unreachable_redis_makes_readyz_and_checks_answer_store_unavailable() {
    let _shared = crate::support::HEAVY.read().await;
    let port = free_port();
    let config = Config { redis_timeout_ms: 200, ..redis_config(format!("redis://127.0.0.1:{port}")) };
    let (running, http) = start(config).await;
    let body =
        json!({"entries": [{"key": "k", "limit": {"algorithm": "fixed_window", "limit": 1, "window_ms": 1000}}]});

    let started = std::time::Instant::now();
    let (ready, ready_body) = http.get("/readyz").await;
    let (status, error) = http.post("/v1/check", &body).await;
    let took = started.elapsed();

    assert_eq!(ready, 503, "{ready_body}");
    assert!(ready_body.contains("store_unavailable"), "{ready_body}");
    assert_eq!((status, error["error"]["code"].as_str()), (503, Some("store_unavailable")), "{error}");
    assert!(took < std::time::Duration::from_millis(2 * 200 + 500), "answered within the deadlines: {took:?}");
    let (_, metrics) = http.get("/metrics").await;
    assert!(metrics.contains("sluice_counter_store_errors_total{kind=\"connection\"} 2"), "{metrics}");
    running.stop().await.expect("clean stop");
}

#[test]
fn store_errors_have_stable_codes() {
    assert_eq!(CounterStoreError::Full { max_keys: 1 }.code().name(), "store_full");
    assert_eq!(CounterStoreError::Timeout { store: "redis", after_ms: 1 }.code().name(), "store_unavailable");
}

#[tokio::test]
async fn connections_beyond_the_bound_are_closed_at_once_and_counted() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _shared = crate::support::HEAVY.read().await;
    let (running, http) = start(Config { max_connections: 2, ..Config::defaults() }).await;
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut stream = tokio::net::TcpStream::connect(running.addr).await.expect("connect");
        stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await.expect("write");
        let mut answer = [0u8; 12];
        stream.read_exact(&mut answer).await.expect("an answer on a held connection");
        assert_eq!(&answer, b"HTTP/1.1 200");
        held.push(stream);
    }

    let mut third = tokio::net::TcpStream::connect(running.addr).await.expect("the kernel accepts");
    let _ = third.write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").await;
    let mut buffer = Vec::new();
    let read = tokio::time::timeout(std::time::Duration::from_secs(5), third.read_to_end(&mut buffer)).await;
    drop(held);
    let mut metrics = String::new();
    for _ in 0..100 {
        // The held connections close asynchronously; poll until one is free again.
        let attempt = tokio::time::timeout(std::time::Duration::from_millis(500), http.get("/metrics")).await;
        if let Ok((200, body)) = attempt {
            metrics = body;
            break;
        }
    }

    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the third connection is closed without an answer: {read:?} {buffer:?}"
    );
    assert!(metrics.contains("sluice_counter_refused_connections_total 1"), "{metrics}");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn ten_thousand_entries_within_a_larger_body_limit_are_refused_as_too_many() {
    let _shared = crate::support::HEAVY.read().await;
    let (running, http) = start(Config { max_body_bytes: 4 << 20, ..Config::defaults() }).await;
    let entries: Vec<Value> = (0..10_000).map(|i| json!({"key": format!("k{i}"), "limit": probe_limit()})).collect();

    let (status, error) = http.post("/v1/check", &json!({"tag": "t", "entries": entries})).await;

    assert_eq!((status, error["error"]["code"].as_str()), (400, Some("too_many_entries")), "{error}");
    assert!(error["error"]["message"].as_str().unwrap_or_default().contains("10000 entries, at most 16"), "{error}");
    let CounterStore::Memory(memory) = running.app.store() else { unreachable!() };
    assert!(memory.is_empty());
    running.stop().await.expect("clean stop");
}
