//! Operator overrides through the admin API: set, list, remove, expiry, the bound, the
//! admin token, bad input, Redis persistence, the key's hash, and the CLI.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::{Value, json};
use shared_store::ManualClock;
use sluice_counter::config::{Config, Secret, StoreKind};
use sluice_counter::overrides::MAX_OVERRIDES;
use sluice_counter::store::{CounterStore, MemoryConfig, MemoryCounters};
use sluice_counter::{App, Running};

use crate::support::{HEAVY, Http, RedisServer, t_us};

pub(crate) const ADMIN: &str = "adm-7c1e9b2f4d6a8e03";
pub(crate) const PROXY: &str = "prx-1f2e3d4c5b6a7988";
pub(crate) const HASH_KEY: &str = "hk-0123456789abcdef-shared-by-the-filters";
pub(crate) const OVERRIDES: &str = "/admin/v1/overrides";

/// The environment the service reads its admin token and hash key from.
fn env(name: &str) -> Option<String> {
    match name {
        "TEST_ADMIN_TOKEN" => Some(ADMIN.to_owned()),
        "TEST_HASH_KEY" => Some(HASH_KEY.to_owned()),
        _ => None,
    }
}

/// `base` with a proxies' token, an admin token and the filters' hash key.
pub(crate) fn admin_config(base: Config) -> Config {
    Config {
        token: Some(Secret::from(PROXY.to_owned())),
        admin_token_env: Some("TEST_ADMIN_TOKEN".to_owned()),
        hash_key_env: Some("TEST_HASH_KEY".to_owned()),
        sweep_interval_ms: 20,
        ..base
    }
}

pub(crate) fn redis_config(redis: &RedisServer) -> Config {
    admin_config(Config { store: StoreKind::Redis, redis_url: vec![redis.url()], ..Config::defaults() })
}

pub(crate) async fn start(config: Config) -> Running {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    Running::start_with_env(listener, config, env).await.expect("the service starts")
}

/// A memory-store service whose time is `clock`.
pub(crate) fn start_on_clock(clock: &ManualClock) -> Running {
    let config = admin_config(Config::defaults());
    let store = CounterStore::Memory(MemoryCounters::with_clock(
        MemoryConfig { shards: 4, max_keys: 1000, ..MemoryConfig::default() },
        Arc::new(clock.clone()),
    ));
    let auth = config.auth().expect("auth");
    let admin = config.admin(&auth, env).expect("admin access");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let listener = tokio::net::TcpListener::from_std(listener).expect("a tokio listener");
    Running::serve_app(listener, &config, App::new(store, &config, auth).with_admin(admin)).expect("serves")
}

pub(crate) fn admin(running: &Running) -> Http {
    Http::new(running.addr).header("authorization", &format!("Bearer {ADMIN}"))
}

pub(crate) fn clamp(policy: &str) -> Value {
    json!({
        "kind": "clamp",
        "policy": policy,
        "limit": {"algorithm": "token_bucket", "amount": 1, "per_ms": 1000, "burst": 5},
        "ttl_ms": 600_000,
        "reason": "downstream degraded (INC-42)",
        "operator": "alice",
    })
}

/// The limit proxies send for the tests' policies: 10 a second, bursts of 10 (every
/// clamp here lowers it).
pub(crate) fn policy_limit() -> Value {
    json!({"algorithm": "token_bucket", "amount": 10, "per_ms": 1000, "burst": 10})
}

/// Makes `running` know `policies` the way a fleet does: a proxy's check names each (a
/// service refuses overrides for policies no proxy has named).
pub(crate) async fn teach(running: &Running, policies: &[&str]) {
    teach_with(running, policies, policy_limit()).await;
}

pub(crate) async fn teach_with(running: &Running, policies: &[&str], limit: Value) {
    let proxy = Http::new(running.addr).header("authorization", &format!("Bearer {PROXY}"));
    for policy in policies {
        let check =
            json!({"entries": [{"key": format!("teach-{policy}"), "policy": policy, "limit": limit, "cost": 0}]});
        let (status, body) = proxy.post("/v1/check", &check).await;
        assert_eq!(status, 200, "{body}");
    }
}

pub(crate) async fn list(http: &Http) -> Vec<Value> {
    let (status, body) = http.get(OVERRIDES).await;
    assert_eq!(status, 200, "{body}");
    let body: Value = serde_json::from_str(&body).expect("JSON");
    body["overrides"].as_array().expect("a list").clone()
}

/// The value of the metric line `series` (name and labels), or panics.
pub(crate) async fn metric(http: &Http, series: &str) -> f64 {
    let (_, text) = http.get("/metrics").await;
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("no {series} in\n{text}"))
}

/// Log lines written while a guard is held, as JSON (the service's `--log-format json`).
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("the log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    /// Captures this thread's events (a current-thread runtime's tasks included).
    fn start() -> (Self, tracing::subscriber::DefaultGuard) {
        let captured = Self::default();
        let writer = captured.clone();
        let subscriber = tracing_subscriber::fmt().json().with_writer(move || writer.clone()).finish();
        (captured, tracing::subscriber::set_default(subscriber))
    }

    /// The audit lines' fields, in order.
    fn audit(&self) -> Vec<Value> {
        let text = String::from_utf8(self.0.lock().expect("the log buffer").clone()).expect("UTF-8");
        text.lines()
            .filter_map(|l| serde_json::from_str::<Value>(l).ok())
            .filter(|l| l["target"] == "sluice_counter::audit")
            .map(|l| l["fields"].clone())
            .collect()
    }

    fn raw(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().expect("the log buffer")).into_owned()
    }
}

async fn set_list_and_remove_round_trip(running: &Running) {
    teach(running, &["per-tenant", "per-route"]).await;
    let http = admin(running);
    let soonest = "sluice_counter_overrides_soonest_expiry_timestamp_seconds";
    assert_eq!(metric(&http, soonest).await, 0.0, "no override, no expiry");
    let (created, set) = http.post(OVERRIDES, &clamp("per-tenant")).await;
    let (bypassed, bypass) = http
        .post(
            OVERRIDES,
            &json!({"kind": "bypass", "policy": "per-route", "ttl_ms": 60_000, "reason": "partner locked out", "operator": "bob"}),
        )
        .await;

    assert_eq!((created, bypassed), (201, 201), "{set} {bypass}");
    let id = set["id"].as_str().expect("an id").to_owned();
    assert!(id.starts_with("ovr-") && id.len() == 20, "{id}");
    assert_eq!(set["kind"], "clamp");
    assert_eq!(set["limit"], clamp("x")["limit"]);
    assert_eq!(set["expires_at_ms"].as_u64().unwrap() - set["created_at_ms"].as_u64().unwrap(), 600_000);
    assert_eq!((&set["reason"], &set["operator"]), (&json!("downstream degraded (INC-42)"), &json!("alice")));
    assert!(set.get("key").is_none() && bypass.get("limit").is_none(), "{set} {bypass}");
    let listed = list(&http).await;
    assert_eq!(listed, vec![bypass.clone(), set.clone()], "by expiry");
    assert_eq!(metric(&http, "sluice_counter_overrides_set_total{kind=\"clamp\"}").await, 1.0);
    assert_eq!(metric(&http, "sluice_counter_overrides_active").await, 2.0);
    let expiry = |o: &serde_json::Value| (o["expires_at_ms"].as_u64().unwrap() / 1000) as f64;
    assert_eq!(metric(&http, soonest).await, expiry(&bypass), "the bypass (60 s) expires before the clamp (600 s)");

    let path = format!("{OVERRIDES}/{id}");
    let (refused, bad) = http.send("DELETE", &path, r#"{"operator": "", "reason": "over"}"#).await;
    assert_eq!(refused, 400, "{bad:?}");
    assert!(String::from_utf8_lossy(&bad).contains("operator:"), "{bad:?}");
    assert_eq!(list(&http).await.len(), 2, "a bad removal removes nothing");
    let (removed, body) = http.send("DELETE", &path, r#"{"operator": "carol", "reason": "recovered"}"#).await;
    let (again, gone) = http.send("DELETE", &path, "").await;

    assert_eq!((removed, body.len()), (204, 0));
    assert_eq!(again, 404, "{gone:?}");
    assert!(String::from_utf8_lossy(&gone).contains("override_not_found"));
    assert_eq!(list(&http).await, vec![bypass]);
    assert_eq!(metric(&http, "sluice_counter_overrides_removed_total").await, 1.0);
    assert_eq!(metric(&http, "sluice_counter_overrides_active").await, 1.0);
}

#[tokio::test]
async fn an_override_is_set_listed_and_removed_on_the_memory_store_and_each_change_is_audited() {
    let (captured, _logs) = Captured::start();
    let running = start(admin_config(Config::defaults())).await;

    set_list_and_remove_round_trip(&running).await;

    let audit = captured.audit();
    let events: Vec<&str> = audit.iter().map(|l| l["event"].as_str().unwrap_or_default()).collect();
    assert_eq!(events, ["override_set", "override_set", "override_removed"], "{}", captured.raw());
    let set = &audit[0];
    assert_eq!(
        (&set["kind"], &set["policy"], &set["keyed"], &set["key_hash"], &set["operator"]),
        (&json!("clamp"), &json!("per-tenant"), &json!(false), &json!("none"), &json!("alice"))
    );
    assert_eq!(set["reason"], "downstream degraded (INC-42)");
    assert!(set["expires_at_ms"].as_u64().is_some() && set["id"].as_str().is_some_and(|id| id.starts_with("ovr-")));
    assert_eq!(audit[2]["id"], audit[0]["id"], "the removal names the override removed");
    assert_eq!((&audit[2]["removed_by"], &audit[2]["removal_reason"]), (&json!("carol"), &json!("recovered")));
    assert_eq!(audit[2]["operator"], "alice", "and who set it");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_override_is_set_listed_and_removed_on_redis_and_every_key_it_writes_has_a_ttl() {
    let _shared = HEAVY.read().await;
    let redis = RedisServer::start();
    let running = start(redis_config(&redis)).await;

    set_list_and_remove_round_trip(&running).await;

    let keys = redis.limiter_keys();
    assert_eq!(keys.len(), 3, "one override key, the index and the version: {keys:?}");
    assert!(keys.iter().any(|(k, _)| k == "sluice:{overrides}:index"), "{keys:?}");
    assert!(keys.iter().any(|(k, _)| k == "sluice:{overrides}:version"), "{keys:?}");
    redis.assert_every_key_has_a_ttl();
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_override_is_set_listed_and_removed_on_a_redis_cluster() {
    let _shared = HEAVY.read().await;
    let cluster = crate::support::shared_cluster();
    let config = Config { store: StoreKind::RedisCluster, redis_url: cluster.urls(), ..Config::defaults() };
    let running = start(admin_config(config)).await;
    let http = admin(&running);
    // The cluster is shared by the whole test binary: start from no overrides.
    for left in list(&http).await {
        let id = left["id"].as_str().expect("an id").to_owned();
        http.send("DELETE", &format!("{OVERRIDES}/{id}"), "").await;
    }
    teach(&running, &["per-tenant"]).await;

    let (status, set) = http.post(OVERRIDES, &clamp("per-tenant")).await;
    let listed = list(&http).await;
    let id = set["id"].as_str().expect("an id").to_owned();
    let (removed, _) = http.send("DELETE", &format!("{OVERRIDES}/{id}"), "").await;

    assert_eq!((status, removed), (201, 204), "{set}");
    assert_eq!(listed, vec![set]);
    assert!(list(&http).await.is_empty());
    cluster.assert_every_key_has_a_ttl();
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn overrides_on_redis_survive_a_restart_of_the_service() {
    let _shared = HEAVY.read().await;
    let redis = RedisServer::start();
    let first = start(redis_config(&redis)).await;
    teach(&first, &["per-tenant"]).await;
    let (_, set) = admin(&first).post(OVERRIDES, &clamp("per-tenant")).await;
    first.kill().await.expect("killed");

    let second = start(redis_config(&redis)).await;

    assert_eq!(list(&admin(&second)).await, vec![set]);
    second.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_override_expires_by_itself_and_its_expiry_is_counted_and_audited_once() {
    let (captured, _logs) = Captured::start();
    let clock = ManualClock::at(t_us(0));
    let running = start_on_clock(&clock);
    teach(&running, &["per-tenant", "per-route"]).await;
    let http = admin(&running);
    let mut body = clamp_fields("per-tenant");
    body.insert("ttl_ms".to_owned(), json!(1_000));
    let (_, short) = http.post(OVERRIDES, &Value::Object(body)).await;
    let (_, long) = http.post(OVERRIDES, &clamp("per-route")).await;

    clock.advance(shared_store::Nanos::from_millis(999));
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(list(&http).await.len(), 2, "live until its last millisecond");
    clock.advance(shared_store::Nanos::from_millis(1));
    let mut expired = 0.0;
    for _ in 0..200 {
        expired = metric(&http, "sluice_counter_overrides_expired_total").await;
        if expired > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(100)).await;

    assert_eq!(expired, 1.0);
    assert_eq!(metric(&http, "sluice_counter_overrides_expired_total").await, 1.0, "counted once");
    assert_eq!(metric(&http, "sluice_counter_overrides_active").await, 1.0);
    assert_eq!(list(&http).await, vec![long]);
    let audit = captured.audit();
    let expiries: Vec<&Value> = audit.iter().filter(|l| l["event"] == "override_expired").collect();
    assert_eq!(expiries.len(), 1, "{}", captured.raw());
    assert_eq!((&expiries[0]["id"], &expiries[0]["expires_at_ms"]), (&short["id"], &short["expires_at_ms"]));
    running.stop().await.expect("clean stop");
}

pub(crate) fn clamp_fields(policy: &str) -> serde_json::Map<String, Value> {
    clamp(policy).as_object().expect("an object").clone()
}

#[tokio::test]
async fn an_override_on_redis_expires_by_itself_and_one_of_two_instances_counts_it() {
    let _shared = HEAVY.read().await;
    let redis = RedisServer::start();
    let one = start(redis_config(&redis)).await;
    let two = start(redis_config(&redis)).await;
    teach(&one, &["per-tenant"]).await;
    let mut short = clamp_fields("per-tenant");
    short.insert("ttl_ms".to_owned(), json!(1_000));
    let (status, _) = admin(&one).post(OVERRIDES, &Value::Object(short)).await;
    assert_eq!(status, 201);
    assert_eq!(list(&admin(&two)).await.len(), 1, "the other instance sees it (and now sweeps too)");

    let expired = async |running: &Running| metric(&admin(running), "sluice_counter_overrides_expired_total").await;
    let mut counted = 0.0;
    for _ in 0..100 {
        counted = expired(&one).await + expired(&two).await;
        if counted > 0.0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(counted, 1.0, "expired within 5 s");
    tokio::time::sleep(Duration::from_millis(200)).await;

    assert_eq!(expired(&one).await + expired(&two).await, 1.0, "claimed by one sweep only");
    assert!(list(&admin(&one)).await.is_empty());
    redis.assert_every_key_has_a_ttl();
    one.stop().await.expect("clean stop");
    two.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_proxies_token_is_refused_on_the_admin_api_and_the_admin_token_on_the_decision_routes() {
    let running = start(admin_config(Config::defaults())).await;
    let proxy = Http::new(running.addr).header("authorization", &format!("Bearer {PROXY}"));
    let anonymous = Http::new(running.addr);
    let check =
        json!({"entries": [{"key": "k", "limit": {"algorithm": "fixed_window", "limit": 5, "window_ms": 1000}}]});

    let (set_status, set) = proxy.post(OVERRIDES, &clamp("per-tenant")).await;
    let (list_status, _) = proxy.get(OVERRIDES).await;
    let (anonymous_status, _) = anonymous.get(OVERRIDES).await;
    let (admin_check, refused) = admin(&running).post("/v1/check", &check).await;
    let (proxy_check, _) = proxy.post("/v1/check", &check).await;

    assert_eq!((set_status, list_status, anonymous_status), (401, 401, 401));
    assert_eq!(set["error"]["code"], "admin_unauthorized", "{set}");
    assert!(set["error"]["message"].as_str().unwrap_or_default().contains("admin token"), "{set}");
    assert!(!set.to_string().contains(PROXY) && !set.to_string().contains(ADMIN));
    assert_eq!((admin_check, refused["error"]["code"].as_str()), (401, Some("unauthorized")));
    assert_eq!(proxy_check, 200);
    assert!(list(&admin(&running)).await.is_empty(), "nothing was stored");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn without_an_admin_token_the_admin_api_says_it_is_not_enabled() {
    let running = start(Config::defaults()).await;

    let (status, body) = Http::new(running.addr).post(OVERRIDES, &clamp("per-tenant")).await;

    assert_eq!((status, body["error"]["code"].as_str()), (404, Some("admin_disabled")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap_or_default().contains("--admin-token-env"));
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn an_admin_token_equal_to_the_proxies_token_or_a_missing_variable_refuses_to_start() {
    let same = Config { admin_token_env: Some("SAME".to_owned()), ..admin_config(Config::defaults()) };
    let missing = Config { hash_key_env: Some("NOT_SET".to_owned()), ..admin_config(Config::defaults()) };
    let short = Config { hash_key_env: Some("SHORT".to_owned()), ..admin_config(Config::defaults()) };
    let lookup = |name: &str| match name {
        "SAME" => Some(PROXY.to_owned()),
        "SHORT" => Some("too-short".to_owned()),
        other => env(other),
    };

    let errors: Vec<String> = [same, missing, short]
        .iter()
        .map(|c| c.admin(&c.auth().expect("auth"), lookup).expect_err("refused"))
        .collect();

    assert!(errors[0].starts_with("--admin-token-env SAME: ") && errors[0].contains("differ"), "{}", errors[0]);
    assert!(errors[1].starts_with("--hash-key-env NOT_SET: ") && errors[1].contains("not set"), "{}", errors[1]);
    assert!(errors[2].starts_with("--hash-key-env SHORT: ") && !errors[2].contains("too-short"), "{}", errors[2]);
    assert!(errors.iter().all(|e| !e.contains(PROXY)), "{errors:?}");
}

#[tokio::test]
async fn every_bad_override_is_a_400_naming_its_field_and_stores_nothing() {
    let running = start(admin_config(Config::defaults())).await;
    let no_hash_key = start(Config { hash_key_env: None, ..admin_config(Config::defaults()) }).await;
    teach(&running, &["per-tenant"]).await;
    teach(&no_hash_key, &["per-tenant"]).await;
    let http = admin(&running);
    let (_, kept) = http.post(OVERRIDES, &clamp("per-tenant")).await;
    let with = |field: &str, value: Value| {
        let mut body = clamp_fields("per-tenant");
        body.insert(field.to_owned(), value);
        Value::Object(body)
    };
    let without = |field: &str| {
        let mut body = clamp_fields("per-tenant");
        body.remove(field);
        Value::Object(body)
    };
    let cases = [
        ("policy", with("policy", json!("per tenant"))),
        ("policy", with("policy", json!(""))),
        ("policy", with("policy", json!("p".repeat(129)))),
        ("kind", with("kind", json!("pause"))),
        ("limit", without("limit")),
        ("limit.window_ms", with("limit", json!({"algorithm": "fixed_window", "limit": 5, "window_ms": 0}))),
        ("limit", with("kind", json!("bypass"))),
        ("key", with("key", json!([]))),
        ("key[0]", with("key", json!(["v".repeat(1025)]))),
        ("policy_version", with("policy_version", json!(2))),
        ("ttl_ms", with("ttl_ms", json!(999))),
        ("ttl_ms", with("ttl_ms", json!(86_400_001))),
        ("ttl_ms", without("ttl_ms")),
        ("reason", with("reason", json!(""))),
        ("reason", with("reason", json!("r".repeat(513)))),
        ("reason", with("reason", json!("line\nbreak"))),
        ("operator", without("operator")),
        ("operator", with("operator", json!(" "))),
        ("operator", with("operator", json!("o".repeat(129)))),
        ("permanent", with("permanent", json!(true))),
    ];

    for (field, body) in &cases {
        let (status, answer) = http.post(OVERRIDES, body).await;

        assert_eq!(status, 400, "{field}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap_or_default();
        assert!(message.starts_with(&format!("{field}:")) || message.contains(&format!("`{field}`")), "{answer}");
        assert!(answer["error"]["code"].as_str().is_some_and(|c| !c.is_empty()), "{answer}");
    }
    let keyed = with("key", json!(["tenant-a"]));
    let (status, answer) = admin(&no_hash_key).post(OVERRIDES, &keyed).await;

    assert_eq!((status, answer["error"]["code"].as_str()), (400, Some("no_hash_key")), "{answer}");
    assert!(answer["error"]["message"].as_str().unwrap_or_default().starts_with("key:"), "{answer}");
    assert_eq!(list(&http).await, vec![kept], "nothing else was stored");
    assert!(list(&admin(&no_hash_key)).await.is_empty());
    assert_eq!(metric(&http, "sluice_counter_overrides_set_total{kind=\"clamp\"}").await, 1.0);
    running.stop().await.expect("clean stop");
    no_hash_key.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_keyed_override_holds_the_hash_the_filters_compute_and_never_the_raw_value() {
    let (captured, _logs) = Captured::start();
    let running = start(admin_config(Config::defaults())).await;
    teach(&running, &["per-tenant"]).await;
    let mut body = clamp_fields("per-tenant");
    body.insert("key".to_owned(), json!(["tenant-a-raw", "eu-west"]));
    body.insert("policy_version".to_owned(), json!(7));

    let (status, set) = admin(&running).post(OVERRIDES, &Value::Object(body)).await;

    let mut expected = shared_store::HashKey::global(HASH_KEY.as_bytes()).fingerprinter("per-tenant", 7);
    expected.part(b"tenant-a-raw");
    expected.part(b"eu-west");
    assert_eq!(status, 201, "{set}");
    assert_eq!(set["key"], json!({"policy_version": 7, "hash": format!("{:032x}", expected.finish())}));
    let listed = list(&admin(&running)).await;
    let logs = captured.raw();
    for shown in [set.to_string(), serde_json::to_string(&listed).expect("JSON"), logs.clone()] {
        assert!(!shown.contains("tenant-a-raw") && !shown.contains("eu-west"), "{shown}");
    }
    assert_eq!(captured.audit()[0]["key_hash"], set["key"]["hash"]);
    assert_eq!(captured.audit()[0]["keyed"], true);
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn live_overrides_are_bounded_and_one_more_is_a_409() {
    let running = start(admin_config(Config::defaults())).await;
    let http = admin(&running);
    let names: Vec<String> = (0..MAX_OVERRIDES).map(|i| format!("p{i}")).chain(["one-more".to_owned()]).collect();
    teach(&running, &names.iter().map(String::as_str).collect::<Vec<_>>()).await;
    for i in 0..MAX_OVERRIDES {
        let (status, body) = http.post(OVERRIDES, &clamp(&format!("p{i}"))).await;
        assert_eq!(status, 201, "{i}: {body}");
    }

    let (status, body) = http.post(OVERRIDES, &clamp("one-more")).await;

    assert_eq!((status, body["error"]["code"].as_str()), (409, Some("too_many_overrides")), "{body}");
    assert_eq!(list(&http).await.len(), MAX_OVERRIDES);
    assert_eq!(metric(&http, "sluice_counter_overrides_active").await, MAX_OVERRIDES as f64);
    running.stop().await.expect("clean stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_sets_lists_and_removes_overrides_on_a_running_service() {
    let running = start(admin_config(Config::defaults())).await;
    teach_with(&running, &["per-tenant", "p"], json!({"algorithm": "fixed_window", "limit": 5, "window_ms": 1000}))
        .await;
    let url = format!("http://{}", running.addr);
    let cli = move |args: Vec<String>| {
        let url = url.clone();
        tokio::task::spawn_blocking(move || {
            let out = std::process::Command::new(env!("CARGO_BIN_EXE_sluice-counter"))
                .arg("override")
                .args(&args)
                .args(["--url", &url, "--admin-token-env", "CLI_ADMIN_TOKEN"])
                .env("CLI_ADMIN_TOKEN", ADMIN)
                .output()
                .expect("the binary runs");
            let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
            (out.status.code(), stdout, String::from_utf8_lossy(&out.stderr).into_owned())
        })
    };
    let args = |list: &[&str]| list.iter().map(|s| (*s).to_owned()).collect::<Vec<_>>();

    let (code, set, _) = cli(args(&[
        "set",
        "--kind",
        "clamp",
        "--policy",
        "per-tenant",
        "--limit",
        r#"{"algorithm":"fixed_window","limit":2,"window_ms":1000}"#,
        "--ttl-ms",
        "60000",
        "--reason",
        "INC-42",
        "--operator",
        "carol",
    ]))
    .await
    .expect("set");
    let set: Value = serde_json::from_str(&set).expect("the stored override");
    let id = set["id"].as_str().expect("an id").to_owned();
    let (_, listed, _) = cli(args(&["list"])).await.expect("list");
    let (rm_code, removed, _) = cli(args(&["rm", &id, "--operator", "carol"])).await.expect("rm");
    let (again_code, _, again) = cli(args(&["rm", &id, "--operator", "carol"])).await.expect("rm again");
    let (bad_code, _, bad) =
        cli(args(&["set", "--kind", "bypass", "--policy", "p", "--ttl-ms", "5", "--reason", "r", "--operator", "o"]))
            .await
            .expect("a bad set");

    assert_eq!(code, Some(0));
    assert_eq!((&set["operator"], &set["limit"]["limit"]), (&json!("carol"), &json!(2)));
    let listed: Value = serde_json::from_str(&listed).expect("the list");
    assert_eq!(listed["overrides"], json!([set]));
    assert_eq!((rm_code, serde_json::from_str::<Value>(&removed).expect("JSON")), (Some(0), json!({"removed": id})));
    assert_eq!(again_code, Some(1));
    assert!(again.contains("404 override_not_found"), "{again}");
    assert_eq!(bad_code, Some(1));
    assert!(bad.contains("400 invalid_ttl: ttl_ms: 5"), "{bad}");
    assert!(list(&admin(&running)).await.is_empty());
    running.stop().await.expect("clean stop");
}

/// The calls `redis` has served of each of `commands` (its `INFO commandstats`), read
/// from one snapshot: counts read one after the other could straddle a script that
/// calls both.
fn calls_of_each<const N: usize>(redis: &RedisServer, commands: [&str; N]) -> [u64; N] {
    let info: String = redis.cmd(&["INFO", "commandstats"]);
    commands.map(|command| {
        info.lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or(0)
    })
}

/// The calls `redis` has served of `command`.
fn calls_of(redis: &RedisServer, command: &str) -> u64 {
    let [calls] = calls_of_each(redis, [command]);
    calls
}

/// Waits (at most 10 s) until the instances have swept `sweeps` more times between them:
/// each sweep reads the overrides' version once.
async fn sweeps(redis: &RedisServer, sweeps: u64) {
    let from = calls_of(redis, "get");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while calls_of(redis, "get") < from + sweeps {
        assert!(std::time::Instant::now() < deadline, "the sweeps stopped");
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
}

/// The overrides listed so far: ZRANGEBYSCORE calls less those of expiry sweeps (once an
/// instance has seen an override, each sweep also claims expired ones in a script that
/// calls ZRANGEBYSCORE and ZCOUNT once each), and less the set script's ZCOUNT.
fn lists(redis: &RedisServer, sets: u64) -> u64 {
    let [listed, counted] = calls_of_each(redis, ["zrangebyscore", "zcount"]);
    listed - (counted - sets)
}

#[tokio::test]
async fn on_redis_a_sweep_reads_one_version_key_and_lists_the_overrides_only_when_it_changed() {
    let _shared = HEAVY.read().await;
    let redis = RedisServer::start();
    let one = start(redis_config(&redis)).await;
    let two = start(redis_config(&redis)).await;
    teach(&one, &["per-tenant"]).await;

    // Each instance lists the overrides once when it starts; then, without overrides,
    // its sweeps only read the version.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while lists(&redis, 0) < 2 && std::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    let at_start = lists(&redis, 0);
    sweeps(&redis, 20).await;
    let idle = lists(&redis, 0) - at_start;
    let (status, _) = admin(&one).post(OVERRIDES, &clamp("per-tenant")).await;
    assert_eq!(status, 201);
    sweeps(&redis, 20).await;
    let after_a_set = lists(&redis, 1) - at_start;

    assert_eq!(at_start, 2, "one list per instance as it starts");
    assert_eq!(idle, 0, "twenty sweeps while nothing changed list nothing");
    // The set's own read on `one`, and one read on `two` when it finds the new version.
    assert_eq!(after_a_set, 2, "one list per instance after a change, not one per sweep");
    one.stop().await.expect("clean stop");
    two.stop().await.expect("clean stop");
}

#[tokio::test]
async fn the_redis_script_refuses_an_algorithm_code_it_does_not_know_and_writes_nothing() {
    let _shared = HEAVY.read().await;
    let redis = RedisServer::start();
    let script = sluice_counter::store::redis::SCRIPT;
    let key = "sluice:{t}:v0:k";

    let mut cmd = redis::cmd("EVAL");
    cmd.arg(script).arg(1).arg(key).arg("").arg("check").arg(0).arg(1);
    cmd.arg("zz").arg(1).arg(1).arg(1).arg(0).arg(1).arg(0);
    let answer: redis::RedisResult<redis::Value> = cmd.query(&mut redis.conn());

    let error = answer.expect_err("an unknown code is an error").to_string();
    assert!(error.contains("unknown algorithm code zz"), "{error}");
    assert!(redis.limiter_keys().is_empty(), "nothing written");
}
