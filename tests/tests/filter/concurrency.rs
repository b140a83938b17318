//! Four workers on real threads over one shared-data store: zero over-admission against
//! the exact reference token bucket (`sluice_testkit::bucket`) replayed over every admit.

use super::*;
use sluice::host::Counter;
use std::collections::BTreeMap;
use std::sync::{Barrier, Mutex};

use sluice_testkit::bucket::ReferenceBucket;

const WORKERS: usize = 4;
const KEYS: u64 = 8;
const PHASES: u64 = 40;
const REQUESTS_PER_PHASE: u64 = 40;
/// 10 per second: one token every 100 ms.
const INTERVAL_NS: u64 = 100_000_000;
const BURST: u64 = 5;
/// Not a multiple of the interval, so refills land between phases.
const PHASE_NS: u64 = 130_000_000;

#[test]
fn four_workers_on_threads_never_admit_more_than_the_reference_bucket() {
    let config = format!(
        r#"{{"policies":[{{"name":"key","key":[{{"header":"x-api-key"}}],"rate":"10/second","burst":{BURST}}}],
          "response":{{"headers_on_rejected":[]}}}}"#
    );
    let mut host = builder(&config).workers(WORKERS).log_level(wasm_host::LogLevel::Warn).build().unwrap();
    let clock = host.clock().unwrap().clone();
    let barrier = Barrier::new(WORKERS + 1);
    // (phase, key) for every admitted request; statuses seen.
    let admits: Mutex<Vec<(u64, u64)>> = Mutex::new(Vec::new());
    let statuses: Mutex<BTreeMap<u16, u64>> = Mutex::new(BTreeMap::new());

    std::thread::scope(|scope| {
        for worker in host.workers_mut() {
            let (barrier, admits, statuses) = (&barrier, &admits, &statuses);
            scope.spawn(move || {
                let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ (worker.index() as u64 + 1);
                for phase in 0..PHASES {
                    barrier.wait();
                    for _ in 0..REQUESTS_PER_PHASE {
                        seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
                        let key = (seed >> 33) % KEYS;
                        let request = Request::get("/").header("x-api-key", format!("client-{key}"));
                        let status = worker.exchange(request, Response::ok()).unwrap().status().unwrap();
                        if status == 200 {
                            admits.lock().unwrap().push((phase, key));
                        }
                        *statuses.lock().unwrap().entry(status).or_default() += 1;
                    }
                    barrier.wait();
                }
            });
        }
        for _ in 0..PHASES {
            barrier.wait();
            barrier.wait();
            clock.advance(Duration::from_nanos(PHASE_NS));
        }
    });

    let mut references: BTreeMap<u64, ReferenceBucket> =
        (0..KEYS).map(|k| (k, ReferenceBucket::new(1, INTERVAL_NS, BURST))).collect();
    let mut admits = admits.into_inner().unwrap();
    admits.sort();
    let mut over_admitted = 0;
    let mut per_key = BTreeMap::<u64, u64>::new();
    for (phase, key) in &admits {
        let now = 1_000_000_000 + phase * PHASE_NS;
        if !references.get_mut(key).unwrap().admit(now, 1) {
            over_admitted += 1;
        }
        *per_key.entry(*key).or_default() += 1;
    }
    let statuses = statuses.into_inner().unwrap();
    assert_eq!(over_admitted, 0, "admits beyond the reference bucket; statuses {statuses:?}");
    // Demand (about 20 per key per phase) always exceeds supply, so every key gets its
    // burst plus what 40 phases of 130 ms refill: nothing lost either, barring CAS
    // exhaustion (503), which must be counted.
    let failures = statuses.get(&503).copied().unwrap_or(0);
    let expected = BURST + (PHASES - 1) * PHASE_NS / INTERVAL_NS;
    for key in 0..KEYS {
        let got = per_key.get(&key).copied().unwrap_or(0);
        assert!(got <= expected && got + failures >= expected, "key {key}: {got} admitted, {expected} possible");
    }
    assert_eq!(metric(&host, "key", Counter::CasExhausted), failures);
    assert_eq!(statuses.values().sum::<u64>(), WORKERS as u64 * PHASES * REQUESTS_PER_PHASE);
    assert!(host.traps().is_empty());
    assert_accounting(&host, "key");
}
