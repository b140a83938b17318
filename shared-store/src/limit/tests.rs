//! Tests of what the algorithms share (a charge that fits is a check, state of another
//! algorithm, status), and the clock readings and bucket every algorithm's tests use.

use super::*;

pub(super) const S: u64 = 1_000_000_000;
pub(super) const MS: u64 = 1_000_000;
pub(super) const T0: Nanos = Nanos(1 << 40);

pub(super) fn at(offset: u64) -> Nanos {
    Nanos(T0.0 + offset)
}

pub(super) fn bucket() -> Limit {
    // One token every 100 ms, bursts of 5.
    Limit::token_bucket(Rate::new(10, Nanos(S)).unwrap(), 5).unwrap()
}

#[test]
fn a_charge_within_what_is_left_stores_what_a_check_of_that_cost_would() {
    let limits = [
        bucket(),
        Limit::fixed_window(5, Nanos(S)).unwrap(),
        Limit::sliding_window(5, Nanos(S)).unwrap(),
        Limit::sliding_log(5, Nanos(S)).unwrap(),
    ];
    for limit in limits {
        let (_, spent) = limit.decide(None, T0, 2);

        let (charged_state, charged) = limit.charge(spent.as_ref(), at(MS), 3, 0);
        let (_, checked_state) = limit.decide(spent.as_ref(), at(MS), 3);

        assert_eq!(charged, 3, "{limit:?}");
        assert_eq!(Some(charged_state), checked_state, "{limit:?}");
    }
}

#[test]
fn state_of_another_algorithm_is_charged_as_the_exhausted_limit() {
    let window = State::Window { index: 0, count: 0, previous: 0 };

    let (state, charged) = bucket().charge(Some(&window), T0, 10, 2);

    assert_eq!(charged, 2, "only the debt: the unreadable state counts as empty");
    assert_eq!(bucket().status(Some(&state), T0).reset_after, Nanos(700 * MS));
}

#[test]
fn adopting_another_algorithms_state_starts_exhausted() {
    let window = Limit::sliding_window(5, Nanos(S)).unwrap();
    let (_, spent) = bucket().decide(None, T0, 1);

    let adopted = window.adopt(&bucket(), spent.unwrap(), T0);

    assert_eq!(adopted, window.exhausted(T0));
}

#[test]
fn a_debt_carried_to_another_algorithm_is_still_owed() {
    let window = Limit::fixed_window(5, Nanos(S)).unwrap();
    let (in_debt, _) = bucket().charge(None, T0, 8, 3);

    let carried = window.carry(&bucket(), in_debt.clone(), T0);

    assert_eq!(bucket().owed(&in_debt, T0), 3);
    assert_eq!((window.owed(&carried.state, T0), carried.forgiven), (3, 0));
    assert_eq!(window.status(Some(&carried.state), T0).remaining, 0);
}

#[test]
fn the_status_of_a_limit_with_something_left_is_the_query() {
    let (_, state) = bucket().decide(None, T0, 2);

    let status = bucket().status(state.as_ref(), T0);

    assert_eq!(status, bucket().decide(state.as_ref(), T0, 0).0);
    assert_eq!((status.verdict, status.remaining), (Verdict::Allowed, 3));
}
