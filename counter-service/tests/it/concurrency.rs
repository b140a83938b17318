//! Whether concurrent instances over-admit: three `sluice-counter` processes × 64 clients
//! on a handful of keys against one Redis. Every admission is replayed, at the time the
//! script decided it (Redis `TIME`, returned as `at_ns`), through the exact reference
//! bucket: zero may be over-admitted, and each key's final state must equal the
//! reference's, which it does only if rejected requests spent nothing. A deliberately naive
//! limiter (GET, decide, SET, outside a script) is run through the same oracle to show it
//! can fail.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use redis::AsyncCommands;
use shared_store::{Nanos, State};
use sluice_testkit::rng::Rng;

use crate::load::{Replay, client, limit, replay};
use crate::support::{HEAVY, Http, RedisServer, free_port, wait_until};

const CLIENTS_PER_PROCESS: usize = 64;
const RUN: Duration = Duration::from_secs(3);

struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn keys(prefix: &str) -> Vec<String> {
    (0..4).map(|i| format!("{prefix}-{i}")).collect()
}

fn start_process(store: &str, urls: &str) -> (Process, std::net::SocketAddr) {
    let addr: std::net::SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    let child = Command::new(env!("CARGO_BIN_EXE_sluice-counter"))
        .args(["--listen", &addr.to_string(), "--store", store, "--redis-url", urls])
        .args(["--redis-pool-size", "4", "--redis-timeout-ms", "2000", "--log", "warn"])
        .stderr(Stdio::null())
        .spawn()
        .expect("sluice-counter starts");
    let process = Process(child);
    wait_until(Duration::from_secs(20), "the service to be ready", || std::net::TcpStream::connect(addr).is_ok());
    (process, addr)
}

/// Runs `clients` clients per service for `run`, replays the admissions, and checks
/// the final counters against the reference.
async fn assert_no_over_admission(addrs: &[std::net::SocketAddr], clients: usize, keys: &[String], run: Duration) {
    let until = Instant::now() + run;
    let mut tasks = Vec::new();
    for (p, addr) in addrs.iter().enumerate() {
        let http = Http::new(*addr);
        for c in 0..clients {
            tasks.push(tokio::spawn(client(http.clone(), keys.to_vec(), (p * 1000 + c) as u64 + 7, until)));
        }
    }
    let mut records = Vec::new();
    for task in tasks {
        records.extend(task.await.expect("client task"));
    }

    let failures: Vec<_> = records.iter().filter(|r| r.status != 200).take(5).collect();
    assert!(failures.is_empty(), "every request is answered: {failures:?}");
    let admits = records.iter().filter(|r| r.admitted).map(|r| (r.key, r.cost, r.at_ns));
    let replayed = replay(admits);
    let rejected = records.len() as u64 - replayed.admitted;
    eprintln!("{} requests, {} admitted, {} rejected", records.len(), replayed.admitted, rejected);
    assert_eq!(replayed.over_admitted, 0, "admissions the exact bucket would have rejected");
    assert!(rejected > replayed.admitted, "the load must exceed the limit for the test to mean anything");
    crate::load::assert_counters_match_the_reference(&Http::new(addrs[0]), keys, &replayed).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_service_processes_under_192_concurrent_clients_never_over_admit() {
    let _heavy = HEAVY.write().await;
    let redis = RedisServer::start();
    let services: Vec<_> = (0..3).map(|_| start_process("redis", &redis.url())).collect();
    let addrs: Vec<_> = services.iter().map(|(_, addr)| *addr).collect();

    assert_no_over_admission(&addrs, CLIENTS_PER_PROCESS, &keys("hot"), RUN).await;

    redis.assert_every_key_has_a_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_service_processes_on_a_redis_cluster_never_over_admit() {
    let _heavy = HEAVY.write().await;
    let cluster = crate::support::shared_cluster();
    let urls = cluster.urls().join(",");
    let services: Vec<_> = (0..3).map(|_| start_process("redis-cluster", &urls)).collect();
    let addrs: Vec<_> = services.iter().map(|(_, addr)| *addr).collect();

    assert_no_over_admission(&addrs, 32, &keys("cluster-hot"), Duration::from_secs(2)).await;

    cluster.assert_every_key_has_a_ttl();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixty_four_clients_on_the_memory_store_never_over_admit() {
    let _heavy = HEAVY.write().await;
    let (running, _) = crate::api::start(sluice_counter::Config::defaults()).await;

    assert_no_over_admission(&[running.addr], CLIENTS_PER_PROCESS, &keys("memory-hot"), Duration::from_secs(2)).await;

    running.stop().await.expect("clean stop");
}

/// The race the script prevents: TIME, GET, decide in the service, SET. Three
/// "instances" with their own connections, 64 tasks each.
async fn naive_client(
    mut conn: redis::aio::MultiplexedConnection,
    keys: Vec<String>,
    seed: u64,
    until: Instant,
) -> Vec<(usize, u64, u64)> {
    let limit = limit();
    let mut admits = Vec::new();
    let mut rng = Rng::new(seed);
    while Instant::now() < until {
        let x = rng.next_u64();
        let key = (x % keys.len() as u64) as usize;
        let cost = 1 + (x >> 8) % 3;
        let (sec, usec): (u64, u64) = redis::cmd("TIME").query_async(&mut conn).await.expect("TIME");
        let now = Nanos(sec * 1_000_000_000 + usec * 1000);
        let stored: Option<String> = conn.get(&keys[key]).await.expect("GET");
        let state = stored.and_then(|s| s.parse::<u128>().ok()).map(|tat| State::Gcra { tat });
        let (decision, next) = limit.decide(state.as_ref(), now, cost);
        if let Some(State::Gcra { tat }) = next {
            let _: () = conn.pset_ex(&keys[key], tat.to_string(), 60_000).await.expect("SET");
        }
        if decision.is_admitted() {
            admits.push((key, cost, now.as_u64()));
        }
    }
    admits
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oracle_catches_a_naive_get_then_set_limiter_over_admitting() {
    let _heavy = HEAVY.write().await;
    let redis = RedisServer::start();
    let keys = keys("naive");
    let until = Instant::now() + Duration::from_secs(2);

    let mut tasks = Vec::new();
    for instance in 0..3u64 {
        let client = redis::Client::open(redis.url()).expect("url");
        let conn = client.get_multiplexed_async_connection().await.expect("connect");
        for c in 0..CLIENTS_PER_PROCESS as u64 {
            tasks.push(tokio::spawn(naive_client(conn.clone(), keys.clone(), instance * 1000 + c + 7, until)));
        }
    }
    let mut admits = Vec::new();
    for task in tasks {
        admits.extend(task.await.expect("naive task"));
    }
    let replayed: Replay = replay(admits);

    eprintln!("naive limiter: {} admitted, {} over-admitted", replayed.admitted, replayed.over_admitted);
    assert!(replayed.over_admitted > 0, "the replay must see the naive limiter's lost updates");
}
