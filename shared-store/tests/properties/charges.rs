//! Property tests of charging: a charge never spends more than its cost nor leaves a
//! limit more than `max_debt` below empty, a limit below empty admits again exactly when
//! its status says, and a charge that fits in what is left is a check of the same cost.

use super::{bucket_params, every_algorithm};
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;
use shared_store::{Limit, Nanos, Rate, Record, State, Verdict};

/// A limit to charge: token bucket, fixed window, sliding window or sliding log (the
/// leaky bucket charges nothing and has its own test).
fn chargeable_limit() -> impl Strategy<Value = Limit> {
    prop_oneof![
        bucket_params().prop_map(|(amount, per, burst)| Limit::token_bucket(
            Rate::new(amount, Nanos(per)).unwrap(),
            burst
        )
        .unwrap()),
        (1u64..50, 1_000u64..5_000_000_000).prop_map(|(n, w)| Limit::fixed_window(n, Nanos(w)).unwrap()),
        (1u64..50, 1_000u64..5_000_000_000).prop_map(|(n, w)| Limit::sliding_window(n, Nanos(w)).unwrap()),
        (prop_oneof![1u64..40, Just(256u64)], 1_000u64..5_000_000_000).prop_map(|(n, w)| Limit::sliding_log(
            n,
            Nanos(w)
        )
        .unwrap()),
    ]
}

/// How far below empty `state` is at `now`, scaled so that one unit is `unit`:
/// `(below_empty_scaled, unit)`. Zero when not below empty.
fn debt(limit: &Limit, state: &State, now: Nanos) -> (u128, u128) {
    match (*limit, state) {
        (Limit::TokenBucket { rate, burst, .. }, State::Gcra { tat }) => {
            let per = u128::from(rate.per().0);
            let now = u128::from(now.0) * u128::from(rate.amount());
            (tat.saturating_sub(now).saturating_sub(u128::from(burst) * per), per)
        }
        (Limit::FixedWindow { limit, window, .. }, State::Window { index, count, .. }) => {
            let counted = if *index >= now.0 / window.0 { *count } else { 0 };
            (u128::from(counted.saturating_sub(limit)), 1)
        }
        (Limit::SlidingWindow { limit, window, .. }, State::Window { index, count, previous }) => {
            let w = u128::from(window.0);
            let (current, offset) = (now.0 / window.0, u128::from(now.0 % window.0));
            let used = if *index > current {
                u128::from(*previous) * w + u128::from(*count) * w
            } else if *index == current {
                u128::from(*previous) * (w - offset) + u128::from(*count) * w
            } else if *index + 1 == current {
                u128::from(*count) * (w - offset)
            } else {
                0
            };
            (used.saturating_sub(u128::from(limit) * w), w)
        }
        (Limit::SlidingLog { limit, window, .. }, State::Log { entries }) => {
            let used: u64 = entries.iter().filter(|e| e.at + window.0 > now.0).map(|e| e.cost).sum();
            (u128::from(used.saturating_sub(limit)), 1)
        }
        _ => unreachable!("chargeable limits only"),
    }
}

/// Charges and checks interleaved: (time step, is a charge, cost, max debt as a share of
/// the capacity in percent).
fn operations() -> impl Strategy<Value = Vec<(i64, bool, u64, u64)>> {
    prop::collection::vec(
        (prop_oneof![8 => 0..1_000_000_000i64, 1 => -100_000_000i64..0], any::<bool>(), 0u64..80, 0u64..=100),
        1..80,
    )
}

proptest! {
    #[test]
    fn a_charge_never_spends_more_than_its_cost_nor_leaves_the_limit_more_than_max_debt_below_empty(
        limit in chargeable_limit(), operations in operations(),
    ) {
        let mut state: Option<State> = None;
        let mut now = 1u64 << 40;
        for (step, is_charge, cost, debt_percent) in operations {
            now = now.saturating_add_signed(step);
            if !is_charge {
                let cost = cost.min(limit.capacity());
                if let (_, Some(next)) = limit.decide(state.as_ref(), Nanos(now), cost) {
                    state = Some(next);
                }
                continue;
            }
            let max_debt = limit.capacity() * debt_percent / 100;
            let before = state.clone();
            let (after, charged) = limit.charge(state.as_ref(), Nanos(now), cost, max_debt);

            prop_assert!(charged <= cost);
            if charged == 0 {
                prop_assert_eq!(after, before.unwrap_or_else(|| limit.fresh()));
                continue;
            }
            let (below, unit) = debt(&limit, &after, Nanos(now));
            prop_assert!(below <= u128::from(max_debt) * unit, "{below} scaled below empty, bound {max_debt} × {unit}");
            if charged < cost {
                // Maximal: not one more unit fits.
                prop_assert_eq!(limit.charge(Some(&after), Nanos(now), 1, max_debt).1, 0);
            }
            if let State::Log { entries } = &after {
                prop_assert!(entries.len() as u64 <= shared_store::MAX_LOG_ENTRIES);
            }
            let record = Record { owner: 7, limit, state: after.clone() };
            prop_assert_eq!(Record::decode(&record.encode()), Ok(record));
            state = Some(after);
        }
    }

    #[test]
    fn a_limit_below_empty_admits_nothing_until_its_status_says_and_then_exactly_on_time(
        limit in chargeable_limit(), spent in 0u64..60, cost in 1u64..200, debt_percent in 1u64..=100,
        probe in 0u64..1_000_000,
    ) {
        let start = Nanos(1 << 40);
        let (_, state) = limit.decide(None, start, spent.min(limit.capacity()));
        let max_debt = (limit.capacity() * debt_percent / 100).max(1);
        let (after, _) = limit.charge(state.as_ref(), start, cost, max_debt);
        prop_assume!(debt(&limit, &after, start).0 > 0);

        let status = limit.status(Some(&after), start);

        prop_assert_eq!(status.remaining, 0);
        let Verdict::Rejected { retry_after } = status.verdict else {
            return Err(TestCaseError::fail(format!("a limit in debt must reject: {status:?}")));
        };
        prop_assert!(retry_after > Nanos::ZERO);
        let before = Nanos(start.0 + retry_after.0 * probe / 1_000_000);
        prop_assert!(!limit.decide(Some(&after), before, 1).0.is_admitted(), "admitted at {before:?}");
        prop_assert!(!limit.decide(Some(&after), Nanos(start.0 + retry_after.0 - 1), 1).0.is_admitted());
        prop_assert!(limit.decide(Some(&after), Nanos(start.0 + retry_after.0), 1).0.is_admitted());
    }

    #[test]
    fn a_charge_that_fits_in_what_is_left_is_a_check_of_the_same_cost(
        limit in chargeable_limit(), spent in 0u64..60, cost in 1u64..60, elapsed in 0u64..2_000_000_000,
        max_debt in 0u64..60,
    ) {
        let start = Nanos(1 << 40);
        let (_, state) = limit.decide(None, start, spent.min(limit.capacity()));
        let now = Nanos(start.0 + elapsed);
        prop_assume!(limit.decide(state.as_ref(), now, 0).0.remaining >= cost);
        // A full log cannot take another entry, whatever is left.
        prop_assume!(!matches!(&state, Some(State::Log { entries }) if entries.len() as u64 >= shared_store::MAX_LOG_ENTRIES));

        let (charged_state, charged) = limit.charge(state.as_ref(), now, cost, max_debt);
        let (decision, checked_state) = limit.decide(state.as_ref(), now, cost);

        prop_assert!(decision.is_admitted());
        prop_assert_eq!(charged, cost);
        prop_assert_eq!(Some(charged_state), checked_state);
    }

    #[test]
    fn no_charge_in_the_u64_range_panics_or_overflows(
        amount in any::<u64>(), per in any::<u64>(), burst in any::<u64>(), window in any::<u64>(),
        steps in prop::collection::vec((any::<u64>(), any::<u64>(), any::<u64>()), 1..40),
    ) {
        let limits = every_algorithm(amount, per, burst, window);
        for limit in limits {
            let mut state = None;
            for (now, cost, max_debt) in &steps {
                let (next, charged) = limit.charge(state.as_ref(), Nanos(*now), *cost, *max_debt);
                prop_assert!(charged <= *cost);
                let status = limit.status(Some(&next), Nanos(*now));
                prop_assert!(status.remaining <= limit.capacity());
                let (_, decided) = limit.decide(Some(&next), Nanos(*now), *cost);
                state = Some(decided.unwrap_or(next));
            }
        }
    }
}
