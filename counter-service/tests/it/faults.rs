//! What the service answers when things fail under load: Redis paused (SIGSTOP), killed and
//! restarted, its script cache flushed; a write that timed out after it was sent; more
//! requests than allowed in flight. Latency bounds are the store deadline plus a margin
//! generous enough for a loaded 2-core machine.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use sluice_counter::config::Config;
use sluice_counter::store::CounterStore;

use crate::api::{redis_config, start};
use crate::load::{Record, assert_counters_match_the_reference, body, client, replay};
use crate::support::{HEAVY, Http, RedisServer};

const DEADLINE_MS: u64 = 100;
const MARGIN_MS: u64 = 250;
const POOL: u16 = 4;

fn faulty_config(redis: &RedisServer) -> Config {
    Config { redis_timeout_ms: DEADLINE_MS, redis_pool_size: POOL, ..redis_config(redis.url()) }
}

fn spawn_clients(http: &Http, keys: &[String], n: u64, until: Instant) -> Vec<tokio::task::JoinHandle<Vec<Record>>> {
    (0..n).map(|c| tokio::spawn(client(http.clone(), keys.to_vec(), 31 + c, until))).collect()
}

async fn join(tasks: Vec<tokio::task::JoinHandle<Vec<Record>>>) -> Vec<Record> {
    let mut records = Vec::new();
    for task in tasks {
        records.extend(task.await.expect("client task"));
    }
    records
}

fn slowest(records: &[Record]) -> Duration {
    records.iter().map(|r| r.latency).max().unwrap_or_default()
}

fn assert_only_decisions_or_store_unavailable(records: &[Record]) {
    let odd: Vec<_> =
        records.iter().filter(|r| r.status != 200 && r.code.as_deref() != Some("store_unavailable")).take(5).collect();
    assert!(odd.is_empty(), "answers other than a decision or store_unavailable: {odd:?}");
}

fn redis_stats(app: &sluice_counter::App) -> (u64, u64) {
    match app.store() {
        CounterStore::Redis(r) => (r.stats.open.load(Ordering::Relaxed), r.stats.connects.load(Ordering::Relaxed)),
        CounterStore::Memory(_) => unreachable!(),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_redis_gets_every_request_answered_within_the_deadline_without_extra_connections() {
    let _heavy = HEAVY.write().await;
    let redis = RedisServer::start();
    let (running, http) = start(faulty_config(&redis)).await;
    let keys = vec!["pause-a".to_owned(), "pause-b".to_owned()];
    let until = Instant::now() + Duration::from_secs(6);
    let tasks = spawn_clients(&http, &keys, 32, until);

    tokio::time::sleep(Duration::from_secs(1)).await;
    redis.signal("STOP");
    let paused = Instant::now();
    tokio::time::sleep(Duration::from_secs(3)).await;
    redis.signal("CONT");
    let resumed = Instant::now();
    let records = join(tasks).await;

    let during: Vec<&Record> = records.iter().filter(|r| r.started > paused && r.started < resumed).collect();
    let first_good_after = records.iter().filter(|r| r.started >= resumed && r.status == 200).map(|r| r.started).min();
    let (open, connects) = redis_stats(&running.app);
    let at_redis = redis.connected_clients() - 1; // minus the connection asking
    eprintln!(
        "pause: {} requests during, slowest {:?} overall, first good answer {:?} after resume, \
         {open} pool connections ({connects} opened), {at_redis} at redis",
        during.len(),
        slowest(&records),
        first_good_after.map(|t| t - resumed)
    );
    assert_only_decisions_or_store_unavailable(&records);
    assert!(during.iter().filter(|r| r.status == 503).count() > 10, "the pause must be felt");
    assert!(
        slowest(&records) <= Duration::from_millis(DEADLINE_MS + MARGIN_MS),
        "every answer within the deadline + margin: slowest {:?}",
        slowest(&records)
    );
    let recovery = first_good_after.expect("decisions after resume") - resumed;
    assert!(recovery <= Duration::from_secs(1), "normal answers within a second of resume: {recovery:?}");
    assert!(open <= u64::from(POOL) && connects <= u64::from(POOL), "pool: {open} open, {connects} opened");
    assert!(at_redis <= u64::from(POOL), "redis sees {at_redis} connections, pool size {POOL}");
    running.stop().await.expect("clean stop");
    redis.assert_every_key_has_a_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_redis_gives_fast_errors_until_it_is_back_and_then_decisions_again() {
    let _heavy = HEAVY.write().await;
    let mut redis = RedisServer::start();
    let (running, http) = start(faulty_config(&redis)).await;
    let keys = vec!["kill-a".to_owned()];
    let until = Instant::now() + Duration::from_secs(5);
    let tasks = spawn_clients(&http, &keys, 16, until);

    tokio::time::sleep(Duration::from_secs(1)).await;
    let killed = Instant::now();
    redis.kill();
    tokio::time::sleep(Duration::from_secs(1)).await;
    redis.restart();
    let restarted = Instant::now();
    let records = join(tasks).await;

    let before: Vec<_> = records.iter().filter(|r| r.started + r.latency < killed).collect();
    let down = records.iter().filter(|r| r.started > killed && r.started < restarted).count();
    let first_good_after =
        records.iter().filter(|r| r.started >= restarted && r.status == 200).map(|r| r.started).min();
    eprintln!(
        "kill: {down} requests while down, slowest {:?}, first good answer {:?} after restart",
        slowest(&records),
        first_good_after.map(|t| t - restarted)
    );
    let undecided: Vec<_> = before.iter().filter(|r| r.status != 200).take(3).collect();
    assert!(undecided.is_empty(), "before the kill, every request is decided: {undecided:?}");
    assert_only_decisions_or_store_unavailable(&records);
    assert!(slowest(&records) <= Duration::from_millis(DEADLINE_MS + MARGIN_MS), "slowest {:?}", slowest(&records));
    let recovery = first_good_after.expect("decisions after the restart") - restarted;
    assert!(recovery <= Duration::from_secs(1), "decisions again within a second: {recovery:?}");
    let (open, _) = redis_stats(&running.app);
    assert!(open <= u64::from(POOL));
    assert!(redis.connected_clients() - 1 <= u64::from(POOL));
    running.stop().await.expect("clean stop");
    redis.assert_every_key_has_a_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flushes_during_load_cause_no_errors_and_no_double_counting() {
    let _heavy = HEAVY.write().await;
    let redis = RedisServer::start();
    let config = Config { redis_timeout_ms: 2000, ..redis_config(redis.url()) };
    let (running, http) = start(config).await;
    let keys = vec!["flush-a".to_owned(), "flush-b".to_owned()];
    let until = Instant::now() + Duration::from_secs(3);
    let tasks = spawn_clients(&http, &keys, 32, until);

    let mut flushes = 0;
    while Instant::now() < until {
        let _: String = redis.cmd(&["SCRIPT", "FLUSH"]);
        flushes += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let records = join(tasks).await;

    let errors: Vec<_> = records.iter().filter(|r| r.status != 200).take(5).collect();
    assert!(errors.is_empty(), "no client-visible errors: {errors:?}");
    let replayed = replay(records.iter().filter(|r| r.admitted).map(|r| (r.key, r.cost, r.at_ns)));
    assert_eq!(replayed.over_admitted, 0);
    assert_counters_match_the_reference(&http, &keys, &replayed).await;
    let reloads = match running.app.store() {
        CounterStore::Redis(r) => r.stats.script_reloads.load(Ordering::Relaxed),
        CounterStore::Memory(_) => unreachable!(),
    };
    eprintln!("{flushes} flushes, {reloads} reloads, {} requests", records.len());
    assert!(reloads >= 5, "the flushes were noticed: {reloads} reloads");
    running.stop().await.expect("clean stop");
    redis.assert_every_key_has_a_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_check_that_timed_out_after_it_was_sent_is_applied_at_most_once() {
    let _heavy = HEAVY.write().await;
    let redis = RedisServer::start();
    // One connection, so that the check sent during the pause goes out on the connection
    // the first check opened (rather than waiting for a new one).
    let (running, http) = start(Config { redis_pool_size: 1, ..faulty_config(&redis) }).await;
    // One token a day: nothing refills while the test runs.
    let check = |cost: u64| {
        serde_json::json!({"entries": [{"key": "uncertain", "cost": cost,
            "limit": {"algorithm": "token_bucket", "amount": 1, "per_ms": 86_400_000, "burst": 10}}]})
    };
    let remaining = |answer: &serde_json::Value| answer["entries"][0]["remaining"].as_u64();
    let (_, first) = http.post("/v1/check", &check(1)).await;

    redis.signal("STOP");
    let (status, error) = http.post("/v1/check", &check(1)).await;
    redis.signal("CONT");
    let deadline = Instant::now() + Duration::from_secs(5);
    let after = loop {
        let (_, answer) = http.post("/v1/check", &check(0)).await;
        if remaining(&answer) != remaining(&first) || Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let (_, settled) = http.post("/v1/check", &check(0)).await;

    assert_eq!(remaining(&first), Some(9));
    assert_eq!((status, error["error"]["code"].as_str()), (503, Some("store_unavailable")), "{error}");
    assert_eq!(remaining(&after), Some(8), "the uncertain check ran once, when Redis resumed");
    assert_eq!(remaining(&settled), Some(8), "and was never replayed");
    running.stop().await.expect("clean stop");
    redis.assert_every_key_has_a_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_beyond_the_in_flight_bound_are_shed_at_once() {
    let _heavy = HEAVY.write().await;
    let redis = RedisServer::start();
    let config = Config { max_in_flight: 2, redis_timeout_ms: 500, ..redis_config(redis.url()) };
    let (running, http) = start(config).await;
    http.post("/v1/check", &body("shed", 1)).await;

    redis.signal("STOP");
    let started = Instant::now();
    let answers = futures_join(&http, 6).await;
    redis.signal("CONT");

    let shed: Vec<_> = answers.iter().filter(|(_, code, _)| code.as_deref() == Some("overloaded")).collect();
    let waited: Vec<_> = answers.iter().filter(|(_, code, _)| code.as_deref() == Some("store_unavailable")).collect();
    assert_eq!(waited.len(), 2, "{answers:?}");
    assert_eq!(shed.len(), 4, "{answers:?}");
    assert!(shed.iter().all(|(status, _, took)| *status == 503 && *took < Duration::from_millis(250)), "{answers:?}");
    assert!(started.elapsed() < Duration::from_millis(500 + MARGIN_MS + 250));
    running.stop().await.expect("clean stop");
    redis.assert_every_key_has_a_ttl();
}

async fn futures_join(http: &Http, n: usize) -> Vec<(u16, Option<String>, Duration)> {
    let tasks: Vec<_> = (0..n)
        .map(|i| {
            let http = http.clone();
            tokio::spawn(async move {
                // Let the first two take the permits before the rest arrive.
                if i >= 2 {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                let started = Instant::now();
                let (status, answer) = http.post("/v1/check", &body("shed", 1)).await;
                (status, answer["error"]["code"].as_str().map(str::to_owned), started.elapsed())
            })
        })
        .collect();
    let mut out = Vec::new();
    for task in tasks {
        out.push(task.await.expect("task"));
    }
    out
}
