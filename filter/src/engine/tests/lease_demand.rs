//! Lease mode adapts to each key's demand on this proxy (issue 39): a key that asks for
//! fewer than four units over a lease's life (the default `cold_below`), a key seen for
//! the first time included, is checked per request at the service (nothing leased,
//! nothing stranded); a key that asks for more gets a lease sized to what it is expected
//! to spend.
use super::check::{answer, entry};
use super::lease::*;
use crate::engine::*;
use crate::host::Counter;
use shared_store::Nanos;

/// The lease policy of `lease.rs` with the default `cold_below`.
fn adaptive() -> World {
    world_of(&LEASED.replace(r#""cold_below": 0, "#, ""))
}

impl World {
    /// Sends a request of tenant "acme" that is checked as cold and admitted.
    fn checked_and_admitted(&mut self) {
        let cold = waiting(self.begin());
        assert!(!cold.waits_for_lease(), "checked");
        assert_eq!(self.last_body("/v1/check")["entries"][0]["policy"], "tenant");
        let allowed = answer(true, &[entry("allowed", 5, 0)]);
        let decided = self.engine.complete(cold, &allowed, &self.limiter, &mut self.callouts, true, &mut self.metrics);
        assert_eq!(status(&decided), Some(200));
    }
}

/// Tenant "acme" warmed up (three requests checked, the fourth leased), then asked for
/// nothing for an hour.
fn went_quiet() -> World {
    let w = warmed_up();
    w.limiter.clock().advance(Nanos::from_secs(3600));
    w
}

/// Tenant "acme" asked for four units within 300 ms: the first three were checked, the
/// fourth elected a refill, was granted 10 and spent one.
fn warmed_up() -> World {
    let mut w = adaptive();
    for _ in 0..3 {
        w.checked_and_admitted();
        w.limiter.clock().advance(Nanos::from_millis(100));
    }
    let warm = waiting(w.begin());
    assert!(warm.waits_for_lease(), "it waits for a refill it elected");
    let _ = w.tick(|_| granted(10));
    assert_eq!(status(&w.retry(warm)), Some(200));
    w
}

#[test]
fn a_key_seen_for_the_first_time_is_checked_at_the_service_and_elects_no_refill() {
    let mut w = adaptive();

    let pending = waiting(w.begin());

    assert!(!pending.waits_for_lease(), "it waits for a check, not a refill");
    let body = w.last_body("/v1/check");
    assert_eq!((body["entries"][0]["cost"].as_u64(), body["entries"][0]["policy"].as_str()), (Some(1), Some("tenant")));
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedCold), 1);
    assert_eq!(w.tick(|_| granted(10)), 0, "no refill was elected");
    assert_eq!(w.metrics.get(0, Counter::LeaseRefills), 0);
}

#[test]
fn a_key_whose_first_request_costs_the_bound_is_leased_at_once() {
    let mut w = world_of(&LEASED.replace(r#""cold_below": 0, "#, r#""cold_below": 1, "#));

    let pending = waiting(w.begin());

    assert!(pending.waits_for_lease(), "one unit is not below a bound of one");
    assert_eq!(w.tick(|_| granted(10)), 1);
    assert_eq!(status(&w.retry(pending)), Some(200));
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedCold), 0);
}

#[test]
fn a_key_that_went_quiet_is_checked_at_the_service_rather_than_leased() {
    let mut w = went_quiet();
    let refills = w.metrics.get(0, Counter::LeaseRefills);
    let checked = w.metrics.get(0, Counter::LeaseCheckedCold);

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
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedCold), checked + 1);
    assert_eq!(w.tick(|_| granted(10)), 0, "no refill was elected");
    assert_eq!(w.metrics.get(0, Counter::LeaseRefills), refills);
    for reason in crate::host::Reason::ALL {
        assert_eq!(w.metrics.get(0, reason.counter()), 0, "{reason:?}");
    }
}

#[test]
fn a_cold_key_refused_by_the_service_gets_its_429_and_retry_after() {
    let mut w = went_quiet();
    let checked = w.metrics.get(0, Counter::LeaseCheckedCold);

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
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedCold), checked + 1);
    assert_eq!(w.metrics.get(0, Counter::FailureDenied) + w.metrics.get(0, Counter::FailureAllowed), 0);
}

#[test]
fn a_key_that_heats_up_gets_a_lease_sized_to_its_demand() {
    let mut w = went_quiet();
    let checked = w.metrics.get(0, Counter::LeaseCheckedCold);
    // Three requests within one lease life: one, two, three units known, all cold.
    for _ in 0..3 {
        w.checked_and_admitted();
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
    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedCold), checked + 3);
}

#[test]
fn a_busy_key_asks_for_the_whole_size_and_spends_it_without_checks() {
    let mut w = warmed_up();
    let checked = w.metrics.get(0, Counter::LeaseCheckedCold);

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

    assert_eq!(w.metrics.get(0, Counter::LeaseCheckedCold), checked);
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

#[test]
fn a_cold_keys_admission_by_the_emergency_cap_when_its_check_failed_is_forgiven_not_owed() {
    let mut w = adaptive();
    let pending = waiting(w.begin());
    assert!(!pending.waits_for_lease(), "a new key: checked");

    let decided = w.engine.complete(
        pending,
        &crate::host::CalloutAnswer::Failed,
        &w.limiter,
        &mut w.callouts,
        true,
        &mut w.metrics,
    );
    w.engine.sweep_debts(&w.limiter);
    let sent = w.tick(|_| super::lease::charged(1));

    assert_eq!(status(&decided), Some(200), "the emergency cap admits");
    assert_eq!(w.metrics.get(0, Counter::EmergencyAllowed), 1);
    // As for a check-mode policy: a check that failed may have been counted at the
    // service, so charging what the cap admitted could count it twice.
    assert_eq!(sent, 0, "nothing is owed");
    assert_eq!(w.metrics.get(0, Counter::LeaseForgiven), 1, "what the cap admitted is counted as forgiven");
    assert_eq!(w.metrics.get(0, Counter::LeaseReconciled), 0);
}
