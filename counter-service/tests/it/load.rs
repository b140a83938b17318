//! How the concurrency and fault tests load the service and judge it: client loops that
//! record every answer, and the oracle that replays admissions against the exact
//! reference bucket (`sluice_testkit::bucket`, independent of the shared-store limiter
//! the service decides with, so that a bug there cannot pass here).

use std::collections::HashMap;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use shared_store::{Limit, Nanos, Rate};
use sluice_testkit::bucket::ReferenceBucket;
use sluice_testkit::rng::Rng;

use crate::support::Http;

/// The limit every load test uses: 50 per second, bursts of 10.
pub const AMOUNT: u64 = 50;
pub const PER_MS: u64 = 1000;
pub const BURST: u64 = 10;

pub fn limit() -> Limit {
    Limit::token_bucket(Rate::new(AMOUNT, Nanos::from_millis(PER_MS)).expect("rate"), BURST).expect("limit")
}

pub fn body(key: &str, cost: u64) -> Value {
    json!({"entries": [{"key": key, "cost": cost,
        "limit": {"algorithm": "token_bucket", "amount": AMOUNT, "per_ms": PER_MS, "burst": BURST}}]})
}

/// One answered request.
#[derive(Clone, Debug)]
pub struct Record {
    pub key: usize,
    pub cost: u64,
    pub started: Instant,
    pub latency: Duration,
    pub status: u16,
    pub code: Option<String>,
    /// Read through `Debug` in assertion messages.
    #[allow(dead_code)]
    pub message: Option<String>,
    pub admitted: bool,
    pub at_ns: u64,
}

/// A client that sends checks on random keys until `until`, recording every answer.
pub async fn client(http: Http, keys: Vec<String>, seed: u64, until: Instant) -> Vec<Record> {
    let mut records = Vec::new();
    let mut rng = Rng::new(seed);
    while Instant::now() < until {
        let x = rng.next_u64();
        let key = (x % keys.len() as u64) as usize;
        let cost = 1 + (x >> 8) % 3;
        let started = Instant::now();
        let (status, answer) = http.post("/v1/check", &body(&keys[key], cost)).await;
        records.push(Record {
            key,
            cost,
            started,
            latency: started.elapsed(),
            status,
            code: answer["error"]["code"].as_str().map(str::to_owned),
            message: answer["error"]["message"].as_str().map(str::to_owned),
            admitted: answer["admitted"] == true,
            at_ns: answer["at_ns"].as_u64().unwrap_or(0),
        });
    }
    records
}

/// Replays admissions in decision-time order through the exact reference bucket.
#[derive(Debug, Default)]
pub struct Replay {
    /// Admissions the reference would have rejected.
    pub over_admitted: u64,
    pub admitted: u64,
    /// Per key: the reference bucket and its latest time (ns).
    pub states: HashMap<usize, (ReferenceBucket, u64)>,
}

/// The reference for [`limit`]: a full bucket.
fn reference() -> ReferenceBucket {
    ReferenceBucket::new(AMOUNT, PER_MS * 1_000_000, BURST)
}

pub fn replay(admits: impl IntoIterator<Item = (usize, u64, u64)>) -> Replay {
    let mut admits: Vec<(usize, u64, u64)> = admits.into_iter().collect();
    admits.sort_by_key(|(key, _, at)| (*key, *at));
    let mut out = Replay::default();
    for (key, cost, at) in admits {
        let (bucket, last) = out.states.entry(key).or_insert_with(|| (reference(), 0));
        let now = at.max(*last);
        out.admitted += 1;
        if !bucket.admit(now, cost) {
            // Over-admitted: the spend happened anyway, so charge it without limit to
            // keep replaying faithfully.
            out.over_admitted += 1;
            bucket.charge(now, cost);
        }
        *last = now;
    }
    out
}

/// The reference's answer to a cost-0 query on `key` at `at`: (remaining, reset after).
pub fn reference_query(replay: &Replay, key: usize, at: u64) -> (u64, u64) {
    let (bucket, last) = replay.states.get(&key).cloned().unwrap_or_else(|| (reference(), 0));
    let now = at.max(last);
    (bucket.remaining(now), bucket.reset_after_ns(now))
}

/// Asks the service for each key's state (cost 0) and compares it with the reference:
/// equal only if every admitted request was counted exactly once and no rejected one
/// was counted at all.
pub async fn assert_counters_match_the_reference(http: &Http, keys: &[String], replay: &Replay) {
    for (i, key) in keys.iter().enumerate() {
        let (status, answer) = http.post("/v1/check", &body(key, 0)).await;
        assert_eq!(status, 200, "{answer}");
        let at = answer["at_ns"].as_u64().expect("at_ns");
        let got = (
            answer["entries"][0]["remaining"].as_u64().expect("remaining"),
            answer["entries"][0]["reset_after_ns"].as_u64().expect("reset"),
        );
        assert_eq!(got, reference_query(replay, i, at), "key {key}: service (remaining, reset_after_ns) vs reference");
    }
}
