//! Accuracy across real Envoy workers: 4 workers, 16 keep-alive connections on threads,
//! fresh keys every phase (so every phase races to spend full buckets), every admission
//! replayed through the reference bucket (see `sluice_testkit::bucket` for why replaying
//! at receipt times is sound), and Envoy's stats holding the accounting identity. Whether
//! workers race here depends on the machine's timing, so this oracle is shown to catch a
//! filter that writes shared data without CAS where the race is forced: the fleet
//! simulation interleaves the workers of that mutant inside their callbacks and its local
//! bound catches the lost updates, every run (`tests/tests/fleet.rs`,
//! `the_local_bound_catches_a_filter_whose_shared_data_writes_ignore_cas`).

use super::*;
use sluice::host::Counter;
use sluice_testkit::bucket::{ReferenceBucket, latency_slack};
use sluice_tests::envoy::SluiceFilter;
use sluice_tests::envoy::policy_stat;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

const WORKERS: usize = 4;
const CONNECTIONS: usize = 16;
const KEYS_PER_PHASE: u64 = 2;
const PHASES: u64 = 12;
const PHASE: Duration = Duration::from_millis(250);
/// 5 per second with a burst of 40: the burst is where racing workers would lose
/// updates, and a slow refill keeps the oracle's latency allowance near one token.
const RATE: u64 = 5;
const BURST: u64 = 40;
const SECOND_NS: u64 = 1_000_000_000;

fn config() -> String {
    format!(
        r#"{{"policies":[{{"name":"key","key":[{{"header":"x-api-key"}}],"rate":"{RATE}/second","burst":{BURST}}}],
          "response":{{"headers_on_rejected":[]}}}}"#
    )
}

/// What one run saw.
struct Run {
    /// Receipt times (ns since the start) of admissions, per key.
    admits: BTreeMap<String, Vec<u64>>,
    statuses: BTreeMap<u16, u64>,
    max_latency_ns: u64,
    sent: u64,
}

fn drive(envoy: &Envoy) -> Run {
    let start = Instant::now();
    let shared = Mutex::new(Run { admits: BTreeMap::new(), statuses: BTreeMap::new(), max_latency_ns: 0, sent: 0 });
    std::thread::scope(|scope| {
        for connection in 0..CONNECTIONS {
            let shared = &shared;
            scope.spawn(move || {
                let mut client = envoy.connect();
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (connection as u64 + 1);
                let mut local = Vec::new();
                for phase in 0..PHASES {
                    let end = PHASE * (phase as u32 + 1);
                    while start.elapsed() < end {
                        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                        let key = format!("p{phase}-k{}", (seed >> 33) % KEYS_PER_PHASE);
                        let sent = start.elapsed();
                        let response =
                            client.send(&Request::get("/").header("x-api-key", &key)).expect("Envoy answers");
                        let received = start.elapsed();
                        local.push((key, response.status, sent, received));
                    }
                }
                let mut run = shared.lock().unwrap();
                for (key, status, sent, received) in local {
                    *run.statuses.entry(status).or_default() += 1;
                    run.sent += 1;
                    let latency = u64::try_from((received - sent).as_nanos()).unwrap_or(u64::MAX);
                    run.max_latency_ns = run.max_latency_ns.max(latency);
                    if status == 200 {
                        let at = u64::try_from(received.as_nanos()).unwrap_or(u64::MAX);
                        run.admits.entry(key).or_default().push(at);
                    }
                }
            });
        }
    });
    shared.into_inner().unwrap()
}

/// Over-admission of a run: every key's admissions replayed through a full reference
/// bucket, with the allowance for the longest round trip.
fn over_admission(run: &mut Run) -> u64 {
    let slack = latency_slack(RATE, SECOND_NS, run.max_latency_ns);
    run.admits
        .values_mut()
        .map(|admits| ReferenceBucket::new(RATE, SECOND_NS, BURST + slack).over_admitted(admits))
        .sum()
}

fn envoy(filter: SluiceFilter) -> Envoy {
    Envoy::builder().workers(WORKERS).sluice(filter).log_level("warning").start().unwrap_or_else(|e| panic!("{e}"))
}

#[test]
fn four_envoy_workers_never_admit_more_than_the_reference_bucket() {
    let envoy = envoy(sluice(&config()));

    let mut run = drive(&envoy);

    let over = over_admission(&mut run);
    let admitted: usize = run.admits.values().map(Vec::len).sum();
    eprintln!(
        "{} requests over {WORKERS} workers: {admitted} admitted, statuses {:?}, longest round trip {} µs, over-admitted {over}",
        run.sent,
        run.statuses,
        run.max_latency_ns / 1000
    );
    assert_eq!(over, 0, "admissions beyond the reference bucket; statuses {:?}", run.statuses);
    // Every key got at least its burst (CAS exhaustion aside, which is a counted 503).
    let failures = run.statuses.get(&503).copied().unwrap_or(0);
    let keys = (PHASES * KEYS_PER_PHASE) as usize;
    assert_eq!(run.admits.len(), keys, "every key was admitted");
    assert!(admitted as u64 + failures >= keys as u64 * BURST, "{admitted} admitted for {keys} full buckets");
    assert_eq!(envoy.metric("key", Counter::CasExhausted), failures);
    // Envoy's stats: offered = allowed + rejected + queued, and every request offered.
    let stats = envoy.stats();
    let stat = |counter: Counter| policy_stat(&stats, "key", counter);
    assert_eq!(stat(Counter::Offered), run.sent);
    assert_eq!(stat(Counter::Offered), stat(Counter::Allowed) + stat(Counter::Rejected) + stat(Counter::Queued));
    assert_eq!(stat(Counter::Allowed), admitted as u64);
}
