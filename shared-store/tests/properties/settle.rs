//! Property tests of settlement: requests admitted on an estimate and settled to their
//! actual cost when they end ([`Limiter::settle`]) never admit, over any interval `T`,
//! more actual cost than `burst + rate × T` plus the unused estimates of the requests in
//! flight when the interval starts and the excess costs of those in flight when it ends
//! (the bound the filter states for costs known after the response), whatever the
//! estimates, the actual costs and how requests overlap.

use proptest::prelude::*;
use shared_store::{Limit, Limiter, ManualClock, MemoryStore, Nanos, Placement, Rate, Request};

/// One request: arrives `gap` after the previous one, runs `duration`, estimated at
/// `estimate`, really costs `actual`.
#[derive(Debug, Clone, Copy)]
struct Call {
    gap: u64,
    duration: u64,
    estimate: u64,
    actual: u64,
}

fn calls(burst: u64) -> impl Strategy<Value = Vec<Call>> {
    prop::collection::vec(
        (0u64..400_000_000, 0u64..3_000_000_000, 1..=burst, 0..=2 * burst)
            .prop_map(|(gap, duration, estimate, actual)| Call { gap, duration, estimate, actual }),
        1..60,
    )
}

/// What happened to an admitted call, in event order.
#[derive(Debug, Clone, Copy)]
struct Admitted {
    at: u64,
    admitted_seq: usize,
    settled_seq: usize,
    estimate: u64,
    actual: u64,
}

/// Runs `calls` through a limiter on one key: admissions with their estimate, and
/// settlements at their end, in time order (a settlement before an admission at the
/// same instant). Returns the admitted calls.
fn run(limit: &Limit, calls: &[Call], max_debt: u64) -> Result<Vec<Admitted>, TestCaseError> {
    let clock = ManualClock::at(Nanos(1 << 40));
    let limiter = Limiter::new(MemoryStore::new(), clock.clone());
    let place = Placement::dedicated("key");
    // (time, 0 = settle / 1 = admit, call index)
    let mut events = Vec::new();
    let mut at = 1u64 << 40;
    for (i, call) in calls.iter().enumerate() {
        at += call.gap;
        events.push((at, 1u8, i));
        events.push((at + call.duration, 0u8, i));
    }
    events.sort_unstable();
    let mut admitted: Vec<Option<Admitted>> = vec![None; calls.len()];
    for (seq, (time, kind, i)) in events.into_iter().enumerate() {
        clock.set(Nanos(time));
        let call = calls[i];
        if kind == 1 {
            let admission = limiter.check(&[Request { place: &place, limit, cost: call.estimate }]).unwrap();
            if admission.admitted {
                admitted[i] = Some(Admitted {
                    at: time,
                    admitted_seq: seq,
                    settled_seq: usize::MAX,
                    estimate: call.estimate,
                    actual: call.actual,
                });
            }
        } else if let Some(entry) = admitted[i].as_mut() {
            let settled = limiter
                .settle(&place, limit, Nanos(entry.at), call.estimate, call.actual, max_debt)
                .map_err(|e| TestCaseError::fail(format!("settle failed: {e}")))?;
            if call.actual > call.estimate {
                prop_assert_eq!(settled.forgiven, 0, "the debt bound is large enough to charge every excess");
            }
            entry.settled_seq = seq;
        }
    }
    Ok(admitted.into_iter().flatten().collect())
}

/// The largest excess of actual cost admitted over any interval beyond the bound.
fn worst_excess(admitted: &[Admitted], amount: u64, per: u64, burst: u64) -> Option<String> {
    for (i, first) in admitted.iter().enumerate() {
        // Unused estimates of calls in flight when the interval starts.
        let unused: u64 = admitted
            .iter()
            .filter(|c| c.admitted_seq < first.admitted_seq && c.settled_seq > first.admitted_seq)
            .map(|c| c.estimate.saturating_sub(c.actual))
            .sum();
        let mut actual = 0u64;
        for last in &admitted[i..] {
            actual += last.actual;
            // Excess costs of calls admitted in the interval and still in flight at its end.
            let excess: u64 = admitted
                .iter()
                .filter(|c| c.admitted_seq >= first.admitted_seq && c.admitted_seq <= last.admitted_seq)
                .filter(|c| c.settled_seq > last.admitted_seq)
                .map(|c| c.actual.saturating_sub(c.estimate))
                .sum();
            // actual ≤ burst + unused + excess + amount × T / per, scaled by per.
            let allowed = u128::from(burst + unused + excess) * u128::from(per)
                + u128::from(amount) * u128::from(last.at - first.at);
            if u128::from(actual) * u128::from(per) > allowed {
                return Some(format!(
                    "{actual} actual units admitted in [{}, {}] (T = {} ns), beyond burst {burst} + unused {unused} \
                     + excess {excess} + refill",
                    first.at,
                    last.at,
                    last.at - first.at
                ));
            }
        }
    }
    None
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn a_token_bucket_settled_to_actual_costs_admits_within_its_stated_bound(
        (amount, per, burst) in (1u64..20, 100_000_000u64..2_000_000_000, 1u64..30),
        calls in (1u64..30).prop_flat_map(calls),
    ) {
        let limit = Limit::token_bucket(Rate::new(amount, Nanos(per)).unwrap(), burst).unwrap();
        let admitted = run(&limit, &calls, u64::MAX / 4)?;
        prop_assert_eq!(worst_excess(&admitted, amount, per, burst), None);
    }

    #[test]
    fn a_fixed_window_settled_to_actual_costs_admits_its_limit_plus_the_excess_still_in_flight(
        (limit_units, window) in (1u64..30, 100_000_000u64..2_000_000_000),
        calls in (1u64..30).prop_flat_map(calls),
    ) {
        let limit = Limit::fixed_window(limit_units, Nanos(window)).unwrap();
        let admitted = run(&limit, &calls, u64::MAX / 4)?;
        // Within one window, the actual cost admitted is at most the limit plus the
        // excess of the window's calls still in flight at its last admission: every
        // admission fitted its estimate, and a settlement before it counted exactly.
        for first in &admitted {
            let index = first.at / window;
            let in_window: Vec<&Admitted> = admitted.iter().filter(|c| c.at / window == index).collect();
            let last = in_window.iter().map(|c| c.admitted_seq).max().unwrap_or(0);
            let actual: u64 = in_window.iter().map(|c| c.actual).sum();
            let excess: u64 =
                in_window.iter().filter(|c| c.settled_seq > last).map(|c| c.actual.saturating_sub(c.estimate)).sum();
            prop_assert!(
                actual <= limit_units + excess,
                "{} actual units admitted in window {}, limit {} + in-flight excess {}", actual, index, limit_units, excess
            );
        }
    }
}
