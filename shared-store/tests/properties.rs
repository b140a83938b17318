//! Property tests: the algorithms against exact oracles, over generated arrival
//! sequences and over the full range of their parameters. This file holds what a
//! decision guarantees (with adoption, refunds and reservations); what a charge
//! guarantees is in `properties/charges.rs`.

#[path = "properties/charges.rs"]
mod charges;
#[path = "properties/settle.rs"]
mod settle;

use proptest::prelude::*;
use shared_store::{
    Decision, Limit, Limiter, LogEntry, ManualClock, MemoryStore, Nanos, Placement, Rate, Record, Request, Reservation,
    State, Verdict, descriptor,
};
use sluice_testkit::bucket::ReferenceBucket;

/// Applies `arrivals` (time steps that may go backwards, costs) to one key. Returns the
/// admissions, each at the latest time an admission had seen so far (the oracles'
/// time, since no algorithm refills when the clock steps back), with its cost.
fn drive(limit: &Limit, start: u64, arrivals: &[(i64, u64)]) -> Vec<(u64, u64, Decision)> {
    let mut state: Option<State> = None;
    let (mut now, mut latest) = (start, 0);
    let mut admitted = Vec::new();
    for (step, cost) in arrivals {
        now = now.saturating_add_signed(*step);
        let (decision, next) = limit.decide(state.as_ref(), Nanos(now), *cost);
        if decision.is_admitted() {
            // A clock that stepped back is held to the latest time the state has seen.
            latest = latest.max(now);
            admitted.push((latest, *cost, decision));
        }
        if next.is_some() {
            state = next;
        }
    }
    admitted
}

fn bucket_params() -> impl Strategy<Value = (u64, u64, u64)> {
    (1u64..1_000, 1_000u64..10_000_000_000, 1u64..64)
}

fn arrivals(max_step: i64, max_cost: u64) -> impl Strategy<Value = Vec<(i64, u64)>> {
    prop::collection::vec((prop_oneof![8 => 0..max_step, 1 => -max_step..0, 1 => Just(0i64)], 1..=max_cost), 1..300)
}

/// Any limit, with numbers small enough for short histories to reach every state.
fn any_limit() -> impl Strategy<Value = Limit> {
    let rate = (1u64..20, 1_000u64..2_000_000_000).prop_map(|(amount, per)| Rate::new(amount, Nanos(per)).unwrap());
    let window = (1_000u64..2_000_000_000).prop_map(Nanos);
    prop_oneof![
        (rate.clone(), 1u64..40).prop_map(|(rate, burst)| Limit::token_bucket(rate, burst).unwrap()),
        (rate, 1u64..40, 0u64..2_000_000_000).prop_map(|(rate, queue, wait)| Limit::leaky_bucket(
            rate,
            queue,
            Nanos(wait)
        )
        .unwrap()),
        (1u64..40, window.clone()).prop_map(|(limit, window)| Limit::fixed_window(limit, window).unwrap()),
        (1u64..40, window.clone()).prop_map(|(limit, window)| Limit::sliding_window(limit, window).unwrap()),
        (1u64..40, window).prop_map(|(limit, window)| Limit::sliding_log(limit, window).unwrap()),
    ]
}

/// Applies `arrivals` (forward time steps, costs) to one key under `limit`, from
/// 2^40 ns. Returns the state and the admissions, (time, cost).
fn spend(limit: &Limit, arrivals: &[(u64, u64)]) -> (Option<State>, Vec<(u64, u64)>) {
    let (mut state, mut now, mut admitted) = (None, 1u64 << 40, Vec::new());
    for (step, cost) in arrivals {
        now += step;
        let (decision, next) = limit.decide(state.as_ref(), Nanos(now), *cost);
        if decision.is_admitted() {
            admitted.push((now, *cost));
        }
        state = next.or(state);
    }
    (state, admitted)
}

proptest! {
    #[test]
    fn a_token_bucket_never_admits_more_than_burst_plus_rate_times_elapsed(
        (amount, per, burst) in bucket_params(),
        arrivals in arrivals(2_000_000_000, 8),
    ) {
        let limit = Limit::token_bucket(Rate::new(amount, Nanos(per)).unwrap(), burst).unwrap();
        let mut admits: Vec<(u64, u64)> =
            drive(&limit, 1 << 40, &arrivals).into_iter().map(|(at, cost, _)| (at, cost)).collect();
        prop_assert_eq!(ReferenceBucket::new(amount, per, burst).over_admitted(&mut admits), 0);
    }

    #[test]
    fn a_leaky_bucket_admits_no_more_than_its_queue_plus_its_rate(
        (amount, per, queue) in bucket_params(),
        max_wait in 0u64..20_000_000_000,
        arrivals in arrivals(2_000_000_000, 8),
    ) {
        let rate = Rate::new(amount, Nanos(per)).unwrap();
        let limit = Limit::leaky_bucket(rate, queue, Nanos(max_wait)).unwrap();
        let admitted = drive(&limit, 1 << 40, &arrivals);
        for (_, _, decision) in &admitted {
            prop_assert!(decision.delay() <= Nanos(max_wait));
        }
        let mut admits: Vec<(u64, u64)> = admitted.into_iter().map(|(at, cost, _)| (at, cost)).collect();
        prop_assert_eq!(ReferenceBucket::new(amount, per, queue).over_admitted(&mut admits), 0);
    }

    #[test]
    fn a_fixed_window_admits_at_most_its_limit_per_window(
        limit_n in 1u64..50, window in 1_000u64..5_000_000_000,
        arrivals in arrivals(1_000_000_000, 4),
    ) {
        let limit = Limit::fixed_window(limit_n, Nanos(window)).unwrap();
        let mut per_window = std::collections::HashMap::<u64, u64>::new();
        for (at, cost, _) in drive(&limit, 1 << 40, &arrivals) {
            *per_window.entry(at / window).or_default() += cost;
        }
        prop_assert!(per_window.values().all(|sum| *sum <= limit_n));
    }

    #[test]
    fn a_sliding_window_admits_at_most_its_limit_per_aligned_window(
        limit_n in 1u64..50, window in 1_000u64..5_000_000_000,
        arrivals in arrivals(1_000_000_000, 4),
    ) {
        let limit = Limit::sliding_window(limit_n, Nanos(window)).unwrap();
        let mut per_window = std::collections::HashMap::<u64, u64>::new();
        for (at, cost, _) in drive(&limit, 1 << 40, &arrivals) {
            *per_window.entry(at / window).or_default() += cost;
        }
        prop_assert!(per_window.values().all(|sum| *sum <= limit_n));
    }

    #[test]
    fn a_sliding_log_admits_at_most_its_limit_in_any_trailing_window(
        limit_n in 1u64..40, window in 1_000u64..5_000_000_000,
        arrivals in arrivals(1_000_000_000, 4),
    ) {
        let limit = Limit::sliding_log(limit_n, Nanos(window)).unwrap();
        let admitted = drive(&limit, 1 << 40, &arrivals);
        for (i, (at, _, _)) in admitted.iter().enumerate() {
            let in_window: u64 = admitted[..=i]
                .iter()
                .filter(|(earlier, _, _)| earlier + window > *at)
                .map(|(_, cost, _)| cost)
                .sum();
            prop_assert!(in_window <= limit_n, "{in_window} in the window ending at {at}");
        }
    }

    #[test]
    fn every_retry_after_is_exact_for_every_algorithm(
        which in 0usize..5, n in 1u64..20, window in 1_000u64..3_000_000_000,
        arrivals in arrivals(500_000_000, 5),
    ) {
        let rate = Rate::new(n, Nanos(window)).unwrap();
        let limit = [
            Limit::token_bucket(rate, n).unwrap(),
            Limit::fixed_window(n, Nanos(window)).unwrap(),
            Limit::sliding_window(n, Nanos(window)).unwrap(),
            Limit::sliding_log(n, Nanos(window)).unwrap(),
            Limit::leaky_bucket(rate, n, Nanos(window)).unwrap(),
        ][which];
        let mut state: Option<State> = None;
        let mut now = 1u64 << 40;
        for (step, cost) in arrivals {
            now = now.saturating_add_signed(step.abs());
            let (decision, next) = limit.decide(state.as_ref(), Nanos(now), cost);
            if let Verdict::Rejected { retry_after } = decision.verdict {
                let at = now + retry_after.0;
                prop_assert!(limit.decide(state.as_ref(), Nanos(at), cost).0.is_admitted(), "{limit:?} late");
                prop_assert!(!limit.decide(state.as_ref(), Nanos(at - 1), cost).0.is_admitted(), "{limit:?} early");
            }
            if next.is_some() {
                state = next;
            }
        }
    }

    #[test]
    fn no_parameter_time_or_cost_in_the_u64_range_panics_or_overflows(
        amount in any::<u64>(), per in any::<u64>(), burst in any::<u64>(), window in any::<u64>(),
        steps in prop::collection::vec((any::<u64>(), any::<u64>()), 1..40),
    ) {
        let limits = every_algorithm(amount, per, burst, window);
        for limit in limits {
            let mut state = None;
            for (now, cost) in &steps {
                let (decision, next) = limit.decide(state.as_ref(), Nanos(*now), *cost);
                prop_assert!(decision.remaining <= limit.capacity());
                prop_assert!(!decision.is_admitted() || *cost <= limit.capacity());
                let _ = limit.is_idle(state.as_ref().unwrap_or(&limit.fresh()), Nanos(*now));
                if let Some(next) = next {
                    let record = Record { owner: *now, limit, state: next.clone() };
                    prop_assert_eq!(Record::decode(&record.encode()), Ok(record));
                    state = Some(next);
                }
            }
        }
    }

    #[test]
    fn descriptors_are_injective(
        a in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..6), 0..4),
        b in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..6), 0..4),
        policy_a in "[a-c/]{0,3}", policy_b in "[a-c/]{0,3}",
    ) {
        let encode = |p: &str, v: &[Vec<u8>]| descriptor(p, 1, v.iter().map(Vec::as_slice));
        prop_assert_eq!(encode(&policy_a, &a) == encode(&policy_b, &b), policy_a == policy_b && a == b);
    }

    #[test]
    fn adopting_a_smaller_burst_never_leaves_more_than_either_allows(
        (amount, per, burst) in bucket_params(), new_burst in 1u64..64, new_amount in 1u64..1_000,
        spent in 0u64..64, elapsed in 0u64..10_000_000_000,
    ) {
        let old = Limit::token_bucket(Rate::new(amount, Nanos(per)).unwrap(), burst).unwrap();
        let new = Limit::token_bucket(Rate::new(new_amount, Nanos(per)).unwrap(), new_burst).unwrap();
        let start = Nanos(1 << 40);
        let (_, state) = old.decide(None, start, spent.min(burst));
        let state = state.unwrap_or_else(|| old.fresh());
        let now = Nanos(start.0 + elapsed);
        let before = old.decide(Some(&state), now, 0).0.remaining;
        let adopted = new.adopt(&old, state, now);
        let after = new.decide(Some(&adopted), now, 0).0.remaining;
        prop_assert!(after <= new_burst.min(before) , "{after} > min({new_burst}, {before})");
        // Nothing spent is forgotten beyond rounding down to whole tokens.
        prop_assert!(after + 1 >= new_burst.min(before));
    }

    #[test]
    fn carrying_a_bucket_in_debt_keeps_what_it_owes_or_counts_it_as_forgiven(
        (amount, per, burst) in bucket_params(), new_burst in 1u64..64, new_amount in 1u64..1_000,
        debt in 0u64..64, elapsed in 0u64..10_000_000_000,
    ) {
        let old = Limit::token_bucket(Rate::new(amount, Nanos(per)).unwrap(), burst).unwrap();
        let new = Limit::token_bucket(Rate::new(new_amount, Nanos(per)).unwrap(), new_burst).unwrap();
        let start = Nanos(1 << 40);
        let (state, _) = old.charge(None, start, burst + debt.min(burst), burst);
        let now = Nanos(start.0 + elapsed);
        let owed = old.owed(&state, now);

        let carried = new.carry(&old, state, now);

        prop_assert_eq!(new.owed(&carried.state, now) + carried.forgiven, owed);
        prop_assert!(new.owed(&carried.state, now) <= new_burst);
        if owed > 0 {
            prop_assert_eq!(new.decide(Some(&carried.state), now, 0).0.remaining, 0);
        }
    }

    #[test]
    fn adopting_keeps_what_was_counted_and_never_leaves_more_than_the_old_state_or_a_fresh_one(
        old in any_limit(), new in any_limit(),
        arrivals in prop::collection::vec((0u64..400_000_000, 1u64..6), 0..60),
        gap in 0u64..3_000_000_000,
    ) {
        let (state, admitted) = spend(&old, &arrivals);
        let now = Nanos(admitted.last().map_or(1 << 40, |(at, _)| *at) + gap);
        let before = old.decide(state.as_ref(), now, 0).0.remaining;
        let fresh = new.decide(None, now, 0).0.remaining;
        let adopted = new.adopt(&old, state.clone().unwrap_or_else(|| old.fresh()), now);
        let after = new.decide(Some(&adopted), now, 0).0.remaining;
        let counted_since = |since: u64| -> u64 {
            admitted.iter().filter(|(at, _)| *at >= since).map(|(_, cost)| cost).sum()
        };

        prop_assert!(after <= fresh, "{after} left, more than a fresh {new:?} ({fresh})");
        match (old, new) {
            _ if old == new => prop_assert_eq!(Some(adopted), state.or_else(|| Some(old.fresh()))),
            (Limit::TokenBucket { .. }, Limit::TokenBucket { .. })
            | (Limit::LeakyBucket { .. }, Limit::LeakyBucket { .. }) => {
                // The whole units the old state had left, capped at the new capacity.
                prop_assert_eq!(after, before.min(new.capacity()));
            }
            (Limit::FixedWindow { window, .. }, Limit::FixedWindow { .. }) => {
                // Exactly the old window's count is kept.
                let counted = counted_since(now.0 / window.0 * window.0);
                prop_assert_eq!(after, new.capacity().saturating_sub(counted));
            }
            (Limit::SlidingWindow { window, .. }, Limit::SlidingWindow { .. }) => {
                let counted = counted_since(now.0 / window.0 * window.0);
                prop_assert!(after <= new.capacity().saturating_sub(counted), "{after} left, {counted} counted");
            }
            (Limit::SlidingLog { window: old_window, .. }, Limit::SlidingLog { window: new_window, .. }) => {
                let counted = counted_since((now.0 + 1).saturating_sub(old_window.0.min(new_window.0)));
                prop_assert!(after <= new.capacity().saturating_sub(counted), "{after} left, {counted} counted");
            }
            _ => prop_assert_eq!(after, 0, "another algorithm's state is adopted as exhausted"),
        }
    }

    #[test]
    fn a_refund_is_never_more_generous_than_the_request_never_happening(
        (amount, per, burst) in bucket_params(),
        others in prop::collection::vec((0u64..2_000_000_000, 1u64..4), 0..20),
        ours_at in 0u64..2_000_000_000, ours_cost in 1u64..4, refund_delay in 0u64..2_000_000_000,
    ) {
        let limit = Limit::token_bucket(Rate::new(amount, Nanos(per)).unwrap(), burst).unwrap();
        let base = 1u64 << 40;
        // The world with our spend: ours first, then the others, each at its own time.
        let (decision, ours) = limit.decide(None, Nanos(base + ours_at), ours_cost);
        prop_assume!(decision.is_admitted());
        let ours = ours.unwrap();
        let mut with = ours.clone();
        let mut admitted_others = Vec::new();
        let mut t = base + ours_at;
        for (step, cost) in &others {
            t += step / 20;
            if let (d, Some(next)) = limit.decide(Some(&with), Nanos(t), *cost) {
                prop_assert!(d.is_admitted());
                with = next;
                admitted_others.push((t, *cost));
            }
        }
        let refunded = limit.refund(&with, &ours, Nanos(t + refund_delay), ours_cost).unwrap_or(with);
        // The world without our spend, replaying the writes that happened.
        let mut without: Option<State> = None;
        for (at, cost) in &admitted_others {
            let (_, next) = limit.decide(without.as_ref(), Nanos(*at), *cost);
            without = next.or(without);
        }
        let (State::Gcra { tat: refunded }, without) = (refunded, without.unwrap_or_else(|| limit.fresh())) else {
            unreachable!()
        };
        let State::Gcra { tat: without } = without else { unreachable!() };
        prop_assert!(refunded >= without, "refund left {refunded}, the world without the request {without}");
    }

    /// Reservations held while other requests spend and other reservations are kept or
    /// given back, in any order (what requests waiting for the counter service do): the
    /// admissions that are kept never exceed the reference bucket.
    #[test]
    fn kept_reservations_never_exceed_the_reference_whatever_the_order_of_refunds(
        // Small bursts, so the bucket runs empty and every token given back too early shows.
        (amount, per, burst) in (1u64..100, 1_000u64..1_000_000_000, 1u64..6),
        steps in prop::collection::vec((0u64..3, 0u64..1000, 0u64..1000, prop::bool::ANY), 1..200),
    ) {
        let limit = Limit::token_bucket(Rate::new(amount, Nanos(per)).unwrap(), burst).unwrap();
        let clock = ManualClock::at(Nanos(1 << 40));
        let limiter = Limiter::new(MemoryStore::new(), clock.clone());
        let place = Placement::dedicated("k");
        let mut held: Vec<(Reservation, u64)> = Vec::new();
        let mut kept = Vec::new();
        for (action, step, pick, keep) in steps {
            // Up to 0.7 of a token's interval per step: demand outruns supply.
            clock.advance(Nanos(per / amount * step * 7 / 10_000));
            if action < 2 || held.is_empty() {
                let (admission, reservation) =
                    limiter.reserve(&[Request { place: &place, limit: &limit, cost: 1 }]).unwrap();
                if admission.admitted {
                    held.push((reservation, admission.at.0));
                }
            } else {
                let (reservation, at) = held.swap_remove(pick as usize % held.len());
                if keep {
                    limiter.commit(reservation);
                    kept.push((at, 1));
                } else {
                    let _ = limiter.refund(reservation);
                }
            }
        }
        for (reservation, at) in held {
            limiter.commit(reservation);
            kept.push((at, 1));
        }
        let over = ReferenceBucket::new(amount, per, burst).over_admitted(&mut kept);
        prop_assert_eq!(over, 0);
    }
}

#[test]
fn a_steady_load_at_twice_the_rate_is_admitted_at_the_rate_within_one_percent() {
    // A burst of at least 2: with a burst of 1, arrivals that fall a fraction of a
    // nanosecond before each token lose the partial token to the cap, in any exact bucket.
    for (amount, per, burst) in
        [(10, 1_000_000_000, 10), (3, 1_000_000_000, 2), (1000, 60_000_000_000, 50), (7, 1_000_000, 2)]
    {
        let limit = Limit::token_bucket(Rate::new(amount, Nanos(per)).unwrap(), burst).unwrap();
        let interval = per / (2 * amount);
        let requests = 200_000u64;
        let arrivals: Vec<(i64, u64)> = (0..requests).map(|_| (interval as i64, 1)).collect();
        let admitted = drive(&limit, 1 << 40, &arrivals).len() as f64;
        let elapsed = (requests * interval) as f64;
        let expected = burst as f64 + amount as f64 * elapsed / per as f64;
        let error = (admitted - expected).abs() / expected;
        assert!(error < 0.01, "{amount}/{per}ns burst {burst}: admitted {admitted}, expected {expected}");
    }
}

#[test]
fn a_log_entry_is_removed_exactly_once_by_a_refund() {
    let limit = Limit::sliding_log(3, Nanos(100)).unwrap();
    let entry = LogEntry { at: 10, cost: 1 };
    let current = State::Log { entries: vec![entry, entry, LogEntry { at: 20, cost: 1 }] };
    let written = State::Log { entries: vec![entry] };
    assert_eq!(
        limit.refund(&current, &written, Nanos(30), 1).unwrap(),
        State::Log { entries: vec![entry, LogEntry { at: 20, cost: 1 }] }
    );
}

/// One limit of each algorithm from arbitrary numbers, each clamped into its valid range.
fn every_algorithm(amount: u64, per: u64, burst: u64, window: u64) -> [Limit; 5] {
    let rate = Rate::new(amount.max(1), Nanos(per.max(1))).unwrap();
    [
        Limit::token_bucket(rate, burst.max(1)).unwrap(),
        Limit::fixed_window(burst.max(1), Nanos(window.max(1))).unwrap(),
        Limit::sliding_window(burst.max(1), Nanos(window.max(1))).unwrap(),
        Limit::sliding_log(burst.clamp(1, 256), Nanos(window.max(1))).unwrap(),
        Limit::leaky_bucket(rate, burst.max(1), Nanos(window)).unwrap(),
    ]
}
