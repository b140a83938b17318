//! One behaviour suite over every algorithm of the one list ([`Algorithm::ALL`], each
//! through [`Algorithm::example`]): the contracts every limit keeps whatever its
//! algorithm, which the other layers rely on without asking which algorithm they hold.
//! A new algorithm is in this suite the moment it is in the list, and fails it until its
//! limit keeps them (as `on_every_store!` holds every store to one suite).

use shared_store::{Algorithm, Limit, Nanos, Record, State, Verdict};

/// Long after any example's state has anything left to say: every window has passed,
/// every bucket refilled, every concurrency holder gone stale.
const LATER: Nanos = Nanos::from_secs(3_600);

/// A holder other than the one the suite decides for ([`Limit::decide`]'s).
const ANOTHER_HOLDER: u64 = 42;

fn every_limit() -> impl Iterator<Item = (Algorithm, Limit)> {
    Algorithm::ALL.into_iter().map(|algorithm| (algorithm, algorithm.example()))
}

/// Spends `cost` units one at a time at `now` from `state`, as long as each is admitted:
/// the units admitted and the state they left.
fn spend_all(limit: &Limit, mut state: Option<State>, now: Nanos, most: u64) -> (u64, Option<State>) {
    for admitted in 0..most {
        let (decision, next) = limit.decide(state.as_ref(), now, 1);
        if !decision.is_admitted() {
            return (admitted, state);
        }
        state = next.or(state);
    }
    (most, state)
}

#[test]
fn a_fresh_limit_admits_exactly_its_capacity_at_one_instant_and_then_refuses() {
    let now = Nanos::from_secs(10);
    for (algorithm, limit) in every_limit() {
        let (admitted, state) = spend_all(&limit, None, now, limit.capacity() + 5);

        assert_eq!(admitted, limit.capacity(), "{algorithm}");
        let (next, written) = limit.decide(state.as_ref(), now, 1);
        assert!(!next.is_admitted() && written.is_none(), "{algorithm}: {next:?}");
    }
}

#[test]
fn a_cost_above_capacity_is_never_admitted_and_says_so() {
    for (algorithm, limit) in every_limit() {
        let (decision, written) = limit.decide(None, Nanos::from_secs(10), limit.capacity() + 1);

        assert_eq!(decision.verdict, Verdict::Exceeds, "{algorithm}");
        assert_eq!(written, None, "{algorithm}: nothing is spent");
    }
}

#[test]
fn nothing_spent_reads_as_full_and_every_state_written_is_one_the_limit_accepts() {
    let now = Nanos::from_secs(10);
    for (algorithm, limit) in every_limit() {
        assert_eq!(limit.status(None, now).remaining, limit.capacity(), "{algorithm}");
        assert!(limit.accepts(&limit.fresh()), "{algorithm}");
        let (_, written) = limit.decide(None, now, 1);
        let written = written.unwrap_or_else(|| panic!("{algorithm}: an admission writes its state"));
        assert!(limit.accepts(&written), "{algorithm}");
        assert_eq!(limit.status(Some(&written), now).remaining, limit.capacity() - 1, "{algorithm}");
    }
}

#[test]
fn a_refund_of_the_last_admission_gives_back_what_it_spent() {
    let now = Nanos::from_secs(10);
    for (algorithm, limit) in every_limit() {
        let (_, before) = limit.decide(None, now, 1);
        let before = before.expect("an admission writes its state");
        let (_, after) = limit.decide(Some(&before), now, 1);
        let after = after.expect("an admission writes its state");

        let refunded = limit.refund(&after, &after, now, 1).unwrap_or_else(|| panic!("{algorithm}: exact"));
        assert_eq!(
            limit.status(Some(&refunded), now).remaining,
            limit.status(Some(&before), now).remaining,
            "{algorithm}"
        );
    }
}

#[test]
fn a_spent_state_left_alone_long_enough_is_idle_and_reads_as_full_to_others() {
    let now = Nanos::from_secs(10);
    for (algorithm, limit) in every_limit() {
        let (_, spent) = spend_all(&limit, None, now, limit.capacity());
        let spent = spent.expect("spent");
        assert!(!limit.is_idle(&spent, now), "{algorithm}: it holds what was spent");

        let later = now.saturating_add(LATER);
        assert!(limit.is_idle(&spent, later), "{algorithm}");
        // (A concurrency holder's own slots stay its own until it gives them back: to
        // another holder, slots unrenewed that long are free.)
        let (read, _) = limit.decide_for(Some(&spent), later, 0, ANOTHER_HOLDER);
        assert_eq!(read.remaining, limit.capacity(), "{algorithm}");
    }
}

#[test]
fn every_state_survives_the_codec_with_its_numbers() {
    let now = Nanos::from_secs(10);
    for (algorithm, limit) in every_limit() {
        let (_, spent) = spend_all(&limit, None, now, limit.capacity());
        let record = Record { owner: 7, limit, state: spent.expect("spent") };

        let decoded = Record::decode(&record.encode()).unwrap_or_else(|e| panic!("{algorithm}: {e}"));
        assert_eq!(decoded, record, "{algorithm}");
    }
}

#[test]
fn carrying_a_state_onto_the_same_numbers_changes_and_forgives_nothing() {
    let now = Nanos::from_secs(10);
    for (algorithm, limit) in every_limit() {
        let (_, spent) = spend_all(&limit, None, now, limit.capacity());
        let spent = spent.expect("spent");

        let carried = limit.carry(&limit, spent.clone(), now);
        assert_eq!(carried.forgiven, 0, "{algorithm}");
        assert_eq!(limit.status(Some(&carried.state), now), limit.status(Some(&spent), now), "{algorithm}");
    }
}

#[test]
fn what_an_algorithm_declares_it_can_do_is_what_its_limit_does_after_a_spend() {
    let now = Nanos::from_secs(10);
    for (algorithm, limit) in every_limit() {
        let (_, state) = limit.decide(None, now, 1);
        let state = state.expect("an admission writes its state");

        let (charged_state, charged) = limit.charge(Some(&state), now, 1, 0);
        assert_eq!(charged == 1, algorithm.chargeable(), "{algorithm}: charged {charged}");
        if algorithm.chargeable() {
            assert_eq!(limit.status(Some(&charged_state), now).remaining, limit.capacity() - 2, "{algorithm}");
        }
        let credited = limit.credit(&state, now, now, 1);
        assert_eq!(credited.is_some_and(|(_, units)| units == 1), algorithm.creditable(), "{algorithm}");
    }
}
