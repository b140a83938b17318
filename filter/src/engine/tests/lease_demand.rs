//! Lease mode adapts to each key's demand on this proxy (issue 39): a key known to ask
//! for fewer than four units over a lease's life is checked per request at the service
//! (nothing leased, nothing stranded); a key that asks for more gets a lease sized to
//! what it is expected to spend.
use super::check::{answer, entry};
use super::lease::*;
use crate::engine::*;
use crate::host::Counter;
use shared_store::Nanos;

/// Tenant "acme" leased once, then asked for nothing for an hour.
fn went_quiet() -> World {
    let mut w = world();
    let first = waiting(w.begin());
    let _ = w.tick(|_| granted(10));
    assert_eq!(status(&w.retry(first)), Some(200));
    w.limiter.clock().advance(Nanos::from_secs(3600));
    w
}

#[test]
fn a_key_that_went_quiet_is_checked_at_the_service_rather_than_leased() {
    let mut w = went_quiet();
    let refills = w.metrics.get(0, Counter::LeaseRefills);

    let pending = waiting(w.begin());

    assert!(!pending.waits_for_lease(), "it waits for a check, not a refill");
    let body = w.last_body("/v1/check");
    assert_eq!((body["entries"][0]["cost"].as_u64(), body["entries"][0]["policy"].as_str()), (Some(1), Some("tenant")));
    let decided = w.engine.complete(
        pending,
        &answer(true, &[entry("allowed", 5, 0)]),
        &w.limiter,
        &mut w.callouts,
        true,
        &mut w.metrics,
    );
    assert_eq!(status(&decided), Some(200));
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedCold), 1);
    assert_eq!(w.tick(|_| granted(10)), 0, "no refill was elected");
    assert_eq!(w.metrics.get(0, Counter::LeaseRefills), refills);
    for reason in crate::host::Reason::ALL {
        assert_eq!(w.metrics.get(0, reason.counter()), 0, "{reason:?}");
    }
}

#[test]
fn a_cold_key_refused_by_the_service_gets_its_429_and_retry_after() {
    let mut w = went_quiet();

    let pending = waiting(w.begin());
    let decided = w.engine.complete(
        pending,
        &answer(false, &[entry("rejected", 0, 3_000_000_000)]),
        &w.limiter,
        &mut w.callouts,
        true,
        &mut w.metrics,
    );

    assert_eq!(status(&decided), Some(429));
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedCold), 1);
    assert_eq!(w.metrics.get(0, Counter::FailureDenied) + w.metrics.get(0, Counter::FailureAllowed), 0);
}

#[test]
fn a_key_that_heats_up_gets_a_lease_sized_to_its_demand() {
    let mut w = went_quiet();
    // Three requests within one lease life: one, two, three units known, all cold.
    for _ in 0..3 {
        let cold = waiting(w.begin());
        assert!(!cold.waits_for_lease(), "checked");
        let allowed = answer(true, &[entry("allowed", 5, 0)]);
        let _ = w.engine.complete(cold, &allowed, &w.limiter, &mut w.callouts, true, &mut w.metrics);
        w.limiter.clock().advance(Nanos::from_millis(100));
    }

    // The fourth: four units over the last life, no longer cold.
    let warm = waiting(w.begin());

    assert!(warm.waits_for_lease(), "it waits for a refill it elected");
    assert_eq!(w.tick(|_| granted(10)), 1);
    assert_eq!(
        w.last_body("/v1/lease")["tokens"],
        10,
        "at its rate: four units in 300 ms are 27 over a life of 2 s, capped at the size of 10"
    );
    assert_eq!(status(&w.retry(warm)), Some(200));
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedCold), 3);
}

#[test]
fn a_busy_key_asks_for_the_whole_size_and_spends_it_without_checks() {
    let mut w = world();
    let first = waiting(w.begin());
    let _ = w.tick(|_| granted(1));
    assert_eq!(status(&w.retry(first)), Some(200));

    // Thirty requests within one life: each refill asks for what the key is expected to
    // spend, capped at the policy's size of 10.
    let mut asked = Vec::new();
    for _ in 0..30 {
        match w.begin() {
            Begun::Waiting(pending) => {
                let _ = w.tick(|_| granted(10));
                asked.push(w.last_body("/v1/lease")["tokens"].as_u64().unwrap_or(0));
                assert_eq!(status(&w.retry(pending)), Some(200));
            }
            decided => assert_eq!(status(&decided), Some(200)),
        }
        let _ = w.tick(|_| granted(10));
        w.limiter.clock().advance(Nanos::from_millis(10));
    }

    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedCold), 0);
    assert!(asked.iter().all(|&n| n <= 10), "{asked:?}");
    assert!(w.last_body("/v1/lease")["tokens"] == 10, "the size, once the demand exceeds it");
}

#[test]
fn requests_that_wait_for_a_refill_in_flight_count_toward_the_demand_that_sizes_the_next() {
    let mut w = world();
    let first = waiting(w.begin());
    let _ = w.tick(|_| granted(1));
    assert_eq!(status(&w.retry(first)), Some(200));

    // Nine requests at once on an empty lease: the first elects a refill, eight wait for it.
    let waiters: Vec<_> = (0..9).map(|_| waiting(w.begin())).collect();
    let _ = w.tick(|_| granted(10));

    assert_eq!(
        w.last_body("/v1/lease")["tokens"],
        10,
        "ten units known at once: at their rate, capped at the size (not the two the electing requests saw)"
    );
    for pending in waiters {
        assert_ne!(status(&w.retry(pending)), Some(503));
    }
}
