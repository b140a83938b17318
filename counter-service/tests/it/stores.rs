//! What each store does that the other does not: idle expiry and the key bound of the
//! memory store; TTLs, hash tags, script reloads and the eviction-policy check of the Redis
//! store.

use serde_json::json;
use shared_store::Verdict;
use sluice_counter::api::{ChargePlan, CreditPlan};
use sluice_counter::config::Config;
use sluice_counter::store::{CounterStore, CounterStoreError, MemoryConfig, MemoryCounters, Topology};
use sluice_protocol::{CHARGE_ID_TTL_MS, ChargeRequest, CreditRequest, LimitSpec, MIN_ID_TTL_MS};

use crate::api::{redis_config, start};
use crate::support::*;

fn bucket() -> LimitSpec {
    LimitSpec::TokenBucket { amount: 2, per_ms: 1000, burst: 4 }
}

/// A charge of one unit of `key` with the id `id`, remembered for `id_ttl_ms`.
fn charge_for(key: &str, id: &str, id_ttl_ms: u64) -> ChargePlan {
    let request = ChargeRequest { id_ttl_ms: Some(id_ttl_ms), ..charge_request("t", key, bucket(), (1, 0), Some(id)) };
    ChargePlan::new(&request).expect("a valid charge")
}

/// A credit of one unit of `key` spent at 0, with the id `id`, remembered for `id_ttl_ms`.
fn credit_for(key: &str, id: &str, id_ttl_ms: u64) -> CreditPlan {
    let request =
        CreditRequest { id_ttl_ms: Some(id_ttl_ms), ..credit_request("t", key, bucket(), (1, t_us(0)), Some(id)) };
    CreditPlan::new(&request).expect("a valid credit")
}

#[tokio::test]
async fn an_idle_key_is_dropped_and_dropping_it_changes_no_answer() {
    let _shared = crate::support::HEAVY.read().await;
    let memory = MemoryCounters::new(MemoryConfig { shards: 4, max_keys: 100, ..MemoryConfig::default() });
    let store = CounterStore::Memory(memory);
    let CounterStore::Memory(memory) = &store else { unreachable!() };
    check(&store, "t", vec![entry("k", bucket(), 1)], t_us(0)).await;

    let swept_while_active = memory.sweep(Some(t_us(499_999)));
    let len_while_active = memory.len();
    let swept_when_idle = memory.sweep(Some(t_us(500_000)));
    let after = check(&store, "t", vec![entry("k", bucket(), 1)], t_us(500_000)).await;

    assert_eq!((swept_while_active, len_while_active), (0, 1));
    assert_eq!(swept_when_idle, 1);
    assert_eq!(after.decisions[0].remaining, 3, "a dropped idle key answers as the full bucket it was");
}

#[tokio::test]
async fn a_full_memory_store_refuses_new_keys_but_never_resets_an_active_one() {
    let _shared = crate::support::HEAVY.read().await;
    let store =
        CounterStore::Memory(MemoryCounters::new(MemoryConfig { shards: 1, max_keys: 2, ..MemoryConfig::default() }));
    check(&store, "t", vec![entry("a", bucket(), 4)], t_us(0)).await;
    check(&store, "t", vec![entry("b", bucket(), 4)], t_us(0)).await;

    let refused = store.check(&plan("t", vec![entry("c", bucket(), 1)]), Some(t_us(1))).await;
    let partial = store.check(&plan("t", vec![entry("a", bucket(), 0), entry("d", bucket(), 1)]), Some(t_us(1))).await;
    let a_still_exhausted = check(&store, "t", vec![entry("a", bucket(), 1)], t_us(2)).await;
    let c_once_a_and_b_are_idle = check(&store, "t", vec![entry("c", bucket(), 1)], t_us(2_000_000)).await;

    assert_eq!(refused, Err(CounterStoreError::Full { max_keys: 2 }));
    assert_eq!(partial, Err(CounterStoreError::Full { max_keys: 2 }));
    assert!(matches!(a_still_exhausted.decisions[0].verdict, Verdict::Rejected { .. }));
    assert!(c_once_a_and_b_are_idle.admitted, "a full shard drops its idle keys before refusing");
}

#[tokio::test]
async fn a_memory_store_full_of_charge_ids_refuses_charges_with_a_new_id_rather_than_forget_one() {
    let _shared = crate::support::HEAVY.read().await;
    let store = CounterStore::Memory(MemoryCounters::new(MemoryConfig { shards: 1, max_keys: 100, max_charge_ids: 2 }));
    let charge = |key: &str, id: Option<&str>| {
        ChargePlan::new(&charge_request("t", key, bucket(), (1, 0), id)).expect("a valid charge")
    };
    let ttl_us = CHARGE_ID_TTL_MS * 1000;
    store.charge(&charge("a", Some("1")), Some(t_us(0))).await.expect("remembered");
    store.charge(&charge("b", Some("2")), Some(t_us(0))).await.expect("remembered");

    let third = store.charge(&charge("c", Some("3")), Some(t_us(1))).await;
    let first_again = store.charge(&charge("a", Some("1")), Some(t_us(1))).await.expect("answered");
    let without_id = store.charge(&charge("c", None), Some(t_us(1))).await.expect("applied");
    let once_the_first_two_expired = store.charge(&charge("c", Some("3")), Some(t_us(ttl_us))).await;

    assert_eq!(third, Err(CounterStoreError::ChargeIdsFull { max_ids: 2 }));
    assert_eq!(third.unwrap_err().code().name(), "store_full");
    assert!(first_again.duplicate, "a remembered id is still answered as a duplicate");
    assert_eq!((without_id.charged, without_id.duplicate), (1, false), "a charge without an id needs no room");
    assert_eq!(once_the_first_two_expired.map(|o| (o.charged, o.duplicate)), Ok((1, false)));
}

#[tokio::test]
async fn one_counter_may_have_as_many_charge_ids_remembered_as_the_whole_memory_store_has_room_for() {
    let _shared = crate::support::HEAVY.read().await;
    // 6 400 ids over 64 shards: 100 a shard, which one hot counter's ids used to share.
    let memory = MemoryCounters::new(MemoryConfig { shards: 64, max_keys: 100, max_charge_ids: 6_400 });
    let charge = |id: &str| ChargePlan::new(&charge_request("t", "hot", bucket(), (1, 0), Some(id))).expect("valid");
    let ids: Vec<String> = (0..3_000).map(|i| format!("settlement-{i}")).collect();

    let first_sends: Vec<_> = ids.iter().map(|id| memory.charge(&charge(id), Some(t_us(0)))).collect();
    let remembered = memory.charge_ids();
    let sent_again: Vec<_> = ids.iter().map(|id| memory.charge(&charge(id), Some(t_us(1)))).collect();

    let refused: Vec<_> = first_sends.iter().filter(|o| o.is_err()).collect();
    assert!(refused.is_empty(), "{} of 3000 refused, the first {:?}", refused.len(), refused.first());
    assert_eq!(remembered, 3_000);
    assert!(sent_again.iter().all(|o| o.as_ref().is_ok_and(|o| o.duplicate)), "every id is remembered");
    assert_eq!(memory.len(), 1, "one counter");
}

#[tokio::test]
async fn the_memory_stores_ids_are_bounded_as_a_whole_and_a_full_table_takes_new_ids_once_old_ones_expire() {
    let _shared = crate::support::HEAVY.read().await;
    // 400 ids over 4 id shards; 1 000 new ids of one counter fill every shard to its 100.
    let memory = MemoryCounters::new(MemoryConfig { shards: 4, max_keys: 100, max_charge_ids: 400 });
    let ids: Vec<String> = (0..1_000).map(|i| format!("a{i}")).collect();

    let answers: Vec<_> =
        ids.iter().map(|id| memory.charge(&charge_for("hot", id, MIN_ID_TTL_MS), Some(t_us(0)))).collect();
    let remembered = memory.charge_ids();
    let accepted = ids.iter().zip(&answers).find(|(_, a)| a.is_ok()).map(|(id, _)| id).expect("some accepted");
    let accepted_again = memory.charge(&charge_for("hot", accepted, MIN_ID_TTL_MS), Some(t_us(999_999)));
    let new_while_they_live = memory.charge(&charge_for("hot", "b", MIN_ID_TTL_MS), Some(t_us(999_999)));
    let new_once_they_expired = memory.charge(&charge_for("hot", "b", MIN_ID_TTL_MS), Some(t_us(1_000_000)));

    assert_eq!(answers.iter().filter(|a| a.is_ok()).count(), 400, "every id shard took its share");
    assert!(answers.iter().all(|a| matches!(a, Ok(_) | Err(CounterStoreError::ChargeIdsFull { max_ids: 400 }))));
    assert_eq!(remembered, 400);
    assert_eq!(accepted_again.map(|o| o.duplicate), Ok(true), "a remembered id is still answered");
    assert_eq!(new_while_they_live, Err(CounterStoreError::ChargeIdsFull { max_ids: 400 }));
    assert_eq!(
        new_once_they_expired.map(|o| o.duplicate),
        Ok(false),
        "a full id shard drops its expired ids before refusing"
    );
}

#[tokio::test]
async fn an_id_is_remembered_in_memory_for_the_ttl_its_charge_or_credit_asks_for_and_no_longer() {
    let _shared = crate::support::HEAVY.read().await;
    let memory = MemoryCounters::new(MemoryConfig { shards: 2, max_keys: 100, ..MemoryConfig::default() });
    let (charge, credit) = (charge_for("k", "x", 90_000), credit_for("k", "x", MIN_ID_TTL_MS));
    memory.charge(&charge, Some(t_us(0))).expect("applied");
    memory.credit(&credit, Some(t_us(0))).expect("applied");

    let credit_just_before = memory.credit(&credit, Some(t_us(999_999))).expect("answered");
    let credit_at_its_ttl = memory.credit(&credit, Some(t_us(1_000_000))).expect("answered");
    let charge_just_before = memory.charge(&charge, Some(t_us(89_999_999))).expect("answered");
    let remembered_before_the_sweep = memory.charge_ids();
    memory.sweep(Some(t_us(90_000_000)));
    let remembered_after_the_sweep = memory.charge_ids();
    let charge_at_its_ttl = memory.charge(&charge, Some(t_us(90_000_000))).expect("answered");

    assert!(credit_just_before.duplicate);
    assert!(!credit_at_its_ttl.duplicate, "a second on, the credit id is new again");
    assert!(charge_just_before.duplicate);
    assert_eq!((remembered_before_the_sweep, remembered_after_the_sweep), (2, 0));
    assert_eq!((charge_at_its_ttl.charged, charge_at_its_ttl.duplicate), (1, false), "90 s on, the charge id is new");
}

#[tokio::test]
async fn an_id_is_remembered_on_redis_for_the_ttl_its_charge_or_credit_asks_for_and_no_longer() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = RedisServer::start();
    let store = redis_store(&redis);
    let (charge, credit) = (charge_for("k", "x", 90_000), credit_for("k", "x", MIN_ID_TTL_MS));
    let credit_key = "sluice:{t}:credit:1:x:v0:k";
    store.charge(&charge, None).await.expect("applied");
    store.credit(&credit, None).await.expect("applied");

    let ttls: std::collections::HashMap<String, i64> = redis.limiter_keys().into_iter().collect();
    wait_until(std::time::Duration::from_secs(10), "the credit id to expire", || {
        redis.cmd::<i64>(&["EXISTS", credit_key]) == 0
    });
    let charge_again = store.charge(&charge, None).await.expect("answered");
    let credit_again = store.credit(&credit, None).await.expect("answered");

    let charge_ttl = ttls.get("sluice:{t}:charge:1:x:v0:k").copied().expect("the charge id");
    let credit_ttl = ttls.get(credit_key).copied().expect("the credit id, read within its second");
    assert!(charge_ttl > 0 && charge_ttl <= 90_000, "PTTL {charge_ttl}");
    assert!(credit_ttl > 0 && credit_ttl <= 1_000, "PTTL {credit_ttl}");
    assert!(charge_again.duplicate, "the charge id lives for 90 s");
    assert!(!credit_again.duplicate, "the credit id lived for a second");
    redis.assert_every_key_has_a_ttl();
}

#[tokio::test]
async fn credit_ids_count_against_the_memory_stores_bound_on_ids_with_charge_ids() {
    let _shared = crate::support::HEAVY.read().await;
    let store = CounterStore::Memory(MemoryCounters::new(MemoryConfig { shards: 1, max_keys: 100, max_charge_ids: 2 }));
    let charge = ChargePlan::new(&charge_request("t", "a", bucket(), (3, 0), Some("1"))).expect("a valid charge");
    let credit = |id: Option<&str>| {
        CreditPlan::new(&credit_request("t", "a", bucket(), (1, t_us(0)), id)).expect("a valid credit")
    };
    let ttl_us = CHARGE_ID_TTL_MS * 1000;
    store.charge(&charge, Some(t_us(0))).await.expect("remembered");
    store.credit(&credit(Some("1")), Some(t_us(0))).await.expect("remembered beside the charge id");

    let third = store.credit(&credit(Some("3")), Some(t_us(1))).await;
    let first_again = store.credit(&credit(Some("1")), Some(t_us(1))).await.expect("answered");
    let without_id = store.credit(&credit(None), Some(t_us(1))).await.expect("applied");
    let once_both_expired = store.credit(&credit(Some("3")), Some(t_us(ttl_us))).await;

    assert_eq!(third, Err(CounterStoreError::ChargeIdsFull { max_ids: 2 }));
    assert_eq!((first_again.credited, first_again.duplicate), (1, true));
    assert_eq!((without_id.credited, without_id.duplicate), (1, false), "a credit without an id needs no room");
    // By then the bucket has long been full again: nothing to give back, but the id is new.
    assert_eq!(once_both_expired.map(|o| (o.credited, o.duplicate)), Ok((0, false)));
}

#[tokio::test]
async fn a_credit_id_is_remembered_on_redis_under_a_key_of_its_own_beside_its_counter() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = RedisServer::start();
    let store = redis_store(&redis);
    let charge = ChargePlan::new(&charge_request("t", "k", bucket(), (3, 0), Some("x"))).expect("a valid charge");
    let credit = |key: &str| {
        CreditPlan::new(&credit_request("t", key, bucket(), (2, t_us(0)), Some("x"))).expect("a valid credit")
    };
    store.charge(&charge, None).await.expect("charged");
    let before: String = redis.cmd(&["GET", "sluice:{t}:v0:k"]);

    let credited = store.credit(&credit("k"), None).await.expect("credited");
    let after: String = redis.cmd(&["GET", "sluice:{t}:v0:k"]);
    let never_seen = store.credit(&credit("never"), None).await.expect("answered");
    let remembered: String = redis.cmd(&["GET", "sluice:{t}:credit:1:x:v0:k"]);
    let keys = redis.limiter_keys();

    assert_eq!((credited.credited, credited.duplicate), (2, false));
    assert_ne!(before, after, "the counter was written");
    assert_eq!(remembered, "2 0", "credited and forgiven");
    assert_eq!((never_seen.credited, never_seen.forgiven), (0, 2));
    let names: Vec<&str> = keys.iter().map(|(k, _)| k.as_str()).collect();
    for key in [
        "sluice:{t}:v0:k",
        "sluice:{t}:charge:1:x:v0:k",
        "sluice:{t}:credit:1:x:v0:k",
        "sluice:{t}:credit:1:x:v0:never",
    ] {
        assert!(names.contains(&key), "{key} in {names:?}");
    }
    assert_eq!(keys.len(), 4, "a credit with nothing to give back writes no counter: {names:?}");
    for (key, ttl) in keys.iter().filter(|(k, _)| k.contains(":credit:")) {
        assert!(*ttl > 0 && *ttl <= CHARGE_ID_TTL_MS as i64, "{key}: PTTL {ttl}");
    }
    redis.assert_every_key_has_a_ttl();
}

#[tokio::test]
async fn a_charge_id_is_forgotten_once_its_ttl_has_passed_and_swept_with_it() {
    let _shared = crate::support::HEAVY.read().await;
    let memory = MemoryCounters::new(MemoryConfig { shards: 2, max_keys: 100, ..MemoryConfig::default() });
    let plan = ChargePlan::new(&charge_request("t", "k", bucket(), (1, 0), Some("x"))).expect("a valid charge");
    let ttl_us = CHARGE_ID_TTL_MS * 1000;
    memory.charge(&plan, Some(t_us(0))).expect("applied");

    let just_before = memory.charge(&plan, Some(t_us(ttl_us - 1))).expect("answered");
    let remembered_before_the_sweep = memory.charge_ids();
    memory.sweep(Some(t_us(ttl_us)));
    let remembered_after_the_sweep = memory.charge_ids();
    let at_the_ttl = memory.charge(&plan, Some(t_us(ttl_us))).expect("applied");

    assert!(just_before.duplicate);
    assert_eq!((remembered_before_the_sweep, remembered_after_the_sweep), (1, 0));
    assert_eq!((at_the_ttl.charged, at_the_ttl.duplicate), (1, false), "ten minutes on, the id is new again");
}

#[tokio::test]
async fn a_full_memory_store_answers_503_store_full_over_http() {
    let _shared = crate::support::HEAVY.read().await;
    let config = Config { memory_max_keys: 1, memory_shards: 1, ..Config::defaults() };
    let (running, http) = start(config).await;
    let body = |key: &str| json!({"entries": [{"key": key, "limit": {"algorithm": "fixed_window", "limit": 5, "window_ms": 60_000}}]});

    let (first, _) = http.post("/v1/check", &body("a")).await;
    let (second, error) = http.post("/v1/check", &body("b")).await;
    let (again, _) = http.post("/v1/check", &body("a")).await;

    assert_eq!((first, second, again), (200, 503, 200));
    assert_eq!(error["error"]["code"], "store_full", "{error}");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn a_memory_store_given_room_for_two_charge_ids_refuses_a_third_live_one_over_http() {
    let _shared = crate::support::HEAVY.read().await;
    let config = Config { memory_max_charge_ids: 2, memory_shards: 1, ..Config::defaults() };
    let (running, http) = start(config).await;
    let charge = |id: &str| {
        json!({"key": "k", "limit": {"algorithm": "fixed_window", "limit": 5, "window_ms": 60_000},
               "cost": 1, "max_debt": 5, "charge_id": id})
    };

    let mut statuses = Vec::new();
    for id in ["a", "b", "c", "a"] {
        statuses.push(http.post("/v1/charge", &charge(id)).await.0);
    }
    let (_, error) = http.post("/v1/charge", &charge("c")).await;

    assert_eq!(statuses, [200, 200, 503, 200], "the third id finds no room; a known one is answered again");
    assert_eq!(error["error"]["code"], "store_full", "{error}");
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn every_key_redis_writes_expires_shortly_after_its_state_goes_idle() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = RedisServer::start();
    let (running, http) = start(redis_config(redis.url())).await;
    let body = json!({"tag": "t", "entries": [
        {"key": "bucket", "limit": {"algorithm": "token_bucket", "amount": 2, "per_ms": 1000, "burst": 4}},
        {"key": "window", "limit": {"algorithm": "fixed_window", "limit": 5, "window_ms": 2000}},
        {"key": "sliding", "limit": {"algorithm": "sliding_window", "limit": 5, "window_ms": 2000}},
        {"key": "log", "limit": {"algorithm": "sliding_log", "limit": 5, "window_ms": 2000}},
        {"key": "leaky", "limit": {"algorithm": "leaky_bucket", "amount": 2, "per_ms": 1000, "max_queue": 4, "max_wait_ms": 1000}},
    ]});

    let (status, answer) = http.post("/v1/check", &body).await;
    let keys = redis.limiter_keys();

    assert_eq!(status, 200, "{answer}");
    assert_eq!(keys.len(), 5);
    for (key, ttl) in keys {
        // Idle after at most 500 ms (buckets), 2 s (window), 4 s (sliding: the next
        // window), 2 s (log); plus one second of grace.
        let most = if key.ends_with(":sliding") {
            5000
        } else if key.ends_with(":bucket") || key.ends_with(":leaky") {
            1500
        } else {
            3000
        };
        assert!(ttl > 0 && ttl <= most, "{key}: PTTL {ttl} ms, expected at most {most}");
    }
    running.stop().await.expect("clean stop");
}

#[tokio::test]
async fn all_counters_of_one_check_hash_to_one_cluster_slot() {
    let _shared = crate::support::HEAVY.read().await;
    let cluster = shared_cluster();
    let check_plan = plan(
        "client-7",
        vec![
            entry("per-user", bucket(), 1),
            entry("per-route", LimitSpec::FixedWindow { limit: 9, window_ms: 1000 }, 1),
            entry("per-tenant", LimitSpec::SlidingLog { limit: 9, window_ms: 1000 }, 1),
        ],
    );

    let slots: Vec<i64> =
        check_plan.entries.iter().map(|e| cluster.nodes[0].cmd(&["CLUSTER", "KEYSLOT", &e.storage_key])).collect();
    let outcome = cluster_store(cluster).check(&check_plan, None).await;

    assert!(slots.windows(2).all(|w| w[0] == w[1]), "{slots:?}");
    assert!(outcome.expect("no CROSSSLOT").admitted);
    cluster.assert_every_key_has_a_ttl();
}

#[tokio::test]
async fn a_redis_counter_is_stored_under_its_key_alone_with_the_limit_it_was_decided_under() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = RedisServer::start();
    let store = redis_store(&redis);
    let first = plan("t", vec![entry("k", bucket(), 1)]);
    let raised = plan("t", vec![entry("k", LimitSpec::TokenBucket { amount: 2, per_ms: 1000, burst: 8 }, 1)]);

    store.check(&first, Some(t_us(0))).await.expect("decided");
    let before: String = redis.cmd(&["GET", "sluice:{t}:v0:k"]);
    store.check(&raised, Some(t_us(0))).await.expect("decided");
    let after: String = redis.cmd(&["GET", "sluice:{t}:v0:k"]);

    assert_eq!(first.entries[0].storage_key, "sluice:{t}:v0:k");
    assert_eq!(redis.limiter_keys().len(), 1, "one counter, whatever its numbers");
    assert!(before.starts_with(&format!("{} ", first.entries[0].limit.signature)), "{before}");
    assert!(after.starts_with(&format!("{} ", raised.entries[0].limit.signature)), "{after}");
    redis.assert_every_key_has_a_ttl();
}

#[tokio::test]
async fn after_script_flush_the_script_is_sent_again_and_counts_once() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = RedisServer::start();
    let store = redis_store(&redis);
    check(&store, "t", vec![entry("k", bucket(), 1)], t_us(0)).await;

    let _: String = redis.cmd(&["SCRIPT", "FLUSH"]);
    let after_flush = check(&store, "t", vec![entry("k", bucket(), 1)], t_us(0)).await;
    let query = check(&store, "t", vec![entry("k", bucket(), 0)], t_us(0)).await;

    let CounterStore::Redis(r) = &store else { unreachable!() };
    assert!(after_flush.admitted);
    assert_eq!(query.decisions[0].remaining, 2, "two checks spent two tokens, not three");
    assert_eq!(r.stats.script_reloads.load(std::sync::atomic::Ordering::Relaxed), 2, "first use and after the flush");
    redis.assert_every_key_has_a_ttl();
}

#[tokio::test]
async fn a_redis_that_may_evict_keys_is_reported_at_startup() {
    let _shared = crate::support::HEAVY.read().await;
    let evicting = RedisServer::start_with(&["--maxmemory-policy", "allkeys-lru"]);
    let safe = RedisServer::start_with(&["--maxmemory-policy", "noeviction"]);
    let store = |server: &RedisServer| {
        sluice_counter::store::RedisCounters::new(redis_config_for(server.url())).expect("store")
    };

    let evicting_checks = store(&evicting).eviction_checks().await;
    let safe_checks = store(&safe).eviction_checks().await;

    assert_eq!(evicting_checks[0].policy.as_deref(), Ok("allkeys-lru"));
    assert!(evicting_checks[0].evicts());
    assert!(!safe_checks[0].evicts());
}

fn redis_config_for(url: String) -> sluice_counter::store::RedisConfig {
    crate::support::redis_config(vec![url], Topology::Standalone)
}

#[tokio::test]
async fn a_redis_out_of_memory_answers_store_unavailable_and_counts_a_server_error() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = RedisServer::start_with(&[
        "--maxmemory",
        "2mb",
        "--maxmemory-policy",
        "noeviction",
        "--enable-debug-command",
        "yes",
    ]);
    let _: String = redis.cmd(&["DEBUG", "POPULATE", "40000", "filler", "100"]);
    let (running, http) = start(redis_config(redis.url())).await;
    let body =
        json!({"entries": [{"key": "k", "limit": {"algorithm": "fixed_window", "limit": 5, "window_ms": 60_000}}]});

    let (status, error) = http.post("/v1/check", &body).await;
    let (_, metrics) = http.get("/metrics").await;

    assert_eq!((status, error["error"]["code"].as_str()), (503, Some("store_unavailable")), "{error}");
    assert!(error["error"]["message"].as_str().unwrap_or_default().contains("OOM"), "{error}");
    assert!(metrics.contains("sluice_counter_store_errors_total{kind=\"server\"} 1"), "{metrics}");
    assert!(redis.limiter_keys().is_empty(), "nothing was written");
    running.stop().await.expect("clean stop");
}
