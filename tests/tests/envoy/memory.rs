//! Bounded state in Envoy: 100 000 distinct callers leave the shared data within the
//! policy's slot budget (counted by the filter as it creates keys) and Envoy's allocated
//! memory flat beyond that budget.

use super::*;
use sluice::host::{Counter, PluginCounter};
use std::time::Instant;

const SLOTS: u64 = 1024;
const CALLERS: u64 = 100_000;
/// What Envoy's heap may grow between 20 000 and 100 000 callers: a leak of 32 bytes
/// per caller would take 2.5 MB.
const GROWTH_BOUND: u64 = 1024 * 1024;

#[test]
fn a_hundred_thousand_distinct_callers_stay_within_the_slot_budget_and_memory_stays_flat() {
    let config = format!(
        r#"{{"policies":[{{"name":"caller","key":[{{"header":"x-api-key"}}],"rate":"1/hour","burst":5,"slots":{SLOTS}}}],
          "response":{{"headers_on_rejected":[]}}}}"#
    );
    let envoy = Envoy::with_sluice(&config, 2);
    let connections = 8u64;
    let mut allocated_at_20k = 0;
    let started = Instant::now();

    for round in 0..10u64 {
        std::thread::scope(|scope| {
            for c in 0..connections {
                let envoy = &envoy;
                scope.spawn(move || {
                    let mut connection = envoy.connect();
                    let per = CALLERS / 10 / connections;
                    for i in 0..per {
                        let caller = round * CALLERS / 10 + c * per + i;
                        let response =
                            connection.send(&Request::get("/").header("x-api-key", format!("caller-{caller}")));
                        // A full table sends new callers to the shared overflow bucket.
                        assert!(matches!(response.unwrap().status, 200 | 429));
                    }
                });
            }
        });
        if round == 1 {
            allocated_at_20k = envoy.allocated_bytes();
        }
    }
    let allocated = envoy.allocated_bytes();
    let created = envoy.plugin_metric(PluginCounter::KeysCreated).unwrap_or(0);
    eprintln!(
        "{CALLERS} callers in {:?}: {created} shared-data keys created, allocated {allocated_at_20k} -> {allocated} bytes",
        started.elapsed()
    );

    // Slots, the overflow bucket and the missing-key bucket.
    assert!(created <= SLOTS + 2, "{created} keys for {SLOTS} slots");
    assert!(created >= SLOTS / 2, "the table was used ({created} keys)");
    assert!(allocated.saturating_sub(allocated_at_20k) <= GROWTH_BOUND, "{allocated_at_20k} -> {allocated}");
    assert!(envoy.metric("caller", Counter::Overflowed) > 0);
}
