//! The lease record's changes, one by one, on an in-memory store.

use super::*;
use shared_store::{MemoryStore, Placement, Store};

const RULES: Rules =
    Rules { low_water: 2, refill_window: Nanos(100), probe_every: Nanos(2000), life: Nanos(2000), cold_below: 0 };
const T: Nanos = Nanos(1_000_000);

fn place() -> Placement {
    Placement { key: "l/0".into(), owner: 7, overflow: None }
}

fn at(n: u64) -> Nanos {
    T.saturating_add(Nanos(n))
}

fn spend(leases: &Leases<'_, MemoryStore>, cost: u64, now: Nanos) -> Spend {
    leases.spend(&place(), cost, now, RULES).unwrap().result.unwrap()
}

fn retry(leases: &Leases<'_, MemoryStore>, cost: u64, now: Nanos, since: Nanos, waiter: u64) -> Spend {
    leases.retry(&place(), cost, now, since, waiter, true, RULES).unwrap().result.unwrap()
}

fn grant(leases: &Leases<'_, MemoryStore>, n: u64, sent: Nanos, life: u64, now: Nanos) -> u64 {
    leases
        .grant(&place(), n, None, sent, Nanos(life), (Nanos::ZERO, Nanos::ZERO), None, now)
        .unwrap()
        .result
        .unwrap()
        .expired
}

fn record(store: &MemoryStore) -> Record {
    Record::decode(&store.get("l/0").unwrap().unwrap().value).unwrap()
}

#[test]
fn the_first_request_elects_a_refill_and_waits_and_others_wait_without_electing() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };

    assert_eq!(spend(&leases, 1, T), Spend::Wait { elected: true });
    assert_eq!(spend(&leases, 1, T), Spend::Wait { elected: false });
    // The election expires with its window: a dead refiller blocks nobody for long.
    assert_eq!(spend(&leases, 1, at(100)), Spend::Wait { elected: true });
}

#[test]
fn a_grant_is_spent_until_it_runs_low_then_one_refill_is_elected() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    let _ = spend(&leases, 1, T);
    grant(&leases, 4, T, 1000, T);

    let spends: Vec<Spend> = (0..5).map(|_| spend(&leases, 1, T)).collect();

    assert_eq!(
        spends,
        [
            Spend::Spent { refill: false, under: None, until: at(1000) },
            Spend::Spent { refill: false, under: None, until: at(1000) },
            Spend::Spent { refill: true, under: None, until: at(1000) },
            Spend::Spent { refill: false, under: None, until: at(1000) },
            Spend::Wait { elected: false },
        ]
    );
}

#[test]
fn tokens_expire_at_the_anchor_plus_the_lease_and_are_counted_as_forfeited() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    grant(&leases, 5, T, 1000, T);

    let later = at(1000);
    let retried = retry(&leases, 1, later, later, 1);
    let forfeited = grant(&leases, 3, later, 1000, later);

    assert_eq!(retried, Spend::Wait { elected: true });
    assert_eq!(forfeited, 5);
    assert_eq!(retry(&leases, 3, later, later, 1), Spend::Spent { refill: false, under: None, until: at(2000) });
}

#[test]
fn a_new_grant_never_extends_the_life_of_tokens_already_held() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    grant(&leases, 5, T, 1000, T);
    // A second grant arrives while three of the first are left: they keep their expiry.
    for _ in 0..2 {
        let _ = spend(&leases, 1, at(10));
    }
    grant(&leases, 4, at(500), 1000, at(510));

    let before_first_expiry = record(&store).live_tokens(at(999));
    let after_first_expiry = record(&store).live_tokens(at(1000));

    assert_eq!(before_first_expiry, 7);
    assert_eq!(after_first_expiry, 4, "the first grant's 3 expired with it");
    // The pool that expires first is spent first.
    let _ = spend(&leases, 3, at(600));
    assert_eq!(record(&store).first.tokens, 0);
    assert_eq!(record(&store).live_tokens(at(1000)), 4);
}

#[test]
fn three_live_grants_merge_under_the_earliest_expiry() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    grant(&leases, 2, T, 1000, T);
    grant(&leases, 2, at(100), 1000, at(100));
    grant(&leases, 2, at(200), 1000, at(200));

    let r = record(&store);

    assert_eq!((r.first.tokens, r.first.expires_at), (4, at(1000)));
    assert_eq!((r.second.tokens, r.second.expires_at), (2, at(1200)));
}

#[test]
fn a_grant_a_waiter_elected_is_held_for_it_and_spent_by_no_one_else() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    assert_eq!(spend(&leases, 3, T), Spend::Wait { elected: true });
    leases.grant(&place(), 4, Some((42, 3)), T, Nanos(1000), (Nanos::ZERO, Nanos::ZERO), None, at(5)).unwrap();

    let newcomer = spend(&leases, 3, at(6));
    let waiter = retry(&leases, 3, at(7), T, 42);

    assert_eq!(newcomer, Spend::Wait { elected: true }, "only the unheld token was there");
    assert_eq!(waiter, Spend::Spent { refill: false, under: None, until: at(1000) }, "the held tokens' expiry");
    assert_eq!(record(&store).live_tokens(at(7)), 1);
}

#[test]
fn an_empty_global_budget_rejects_until_the_service_said_without_asking_again() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    let _ = spend(&leases, 1, T);
    leases.grant(&place(), 0, None, T, Nanos(1000), (Nanos(500), Nanos::ZERO), None, T).unwrap();

    assert_eq!(spend(&leases, 1, T), Spend::Empty { until: at(500), under: None });
    assert_eq!(spend(&leases, 1, at(500)), Spend::Wait { elected: true });
}

#[test]
fn a_waiter_whose_grant_was_spent_by_others_elects_again_rather_than_waiting_for_nothing() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    let rules = Rules { low_water: 0, ..RULES };
    let _ = leases.spend(&place(), 1, T, rules).unwrap();
    let _ = leases.spend(&place(), 2, T, rules).unwrap();
    grant(&leases, 2, T, 1000, at(10));
    // A request that arrived meanwhile takes the two tokens (no low-water refill).
    let _ = leases.spend(&place(), 2, at(11), rules).unwrap();

    let retried = leases.retry(&place(), 2, at(12), T, 9, true, rules).unwrap().result.unwrap();

    assert_eq!(retried, Spend::Wait { elected: true });
}

#[test]
fn a_failed_refill_sends_its_waiters_to_the_failure_rule() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    let _ = spend(&leases, 1, T);

    leases.refill_failed(&place(), 1, at(10)).unwrap();

    assert_eq!(retry(&leases, 1, at(20), T, 1), Spend::Failed { reason: 1 });
    assert_eq!(spend(&leases, 1, at(20)), Spend::Wait { elected: true });
}

#[test]
fn debt_is_bounded() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };

    let forgiven: Vec<u64> =
        (0..4).map(|_| leases.owe(&place(), 2, 5, (0, None), T).unwrap().result.unwrap().0).collect();

    assert_eq!(forgiven, [0, 0, 1, 2]);
    assert_eq!(record(&store).debt, 5);
}

#[test]
fn a_charge_claims_the_debt_once_and_a_timed_out_one_is_sent_again_under_the_same_id() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    leases.owe(&place(), 3, 10, (0, None), T).unwrap();

    let first = leases.claim_charge(&place(), 11, Nanos(100), T).unwrap().0;
    let while_in_flight = leases.claim_charge(&place(), 12, Nanos(100), at(50)).unwrap().0;
    leases.owe(&place(), 2, 10, (0, None), at(60)).unwrap();
    let after_timeout = leases.claim_charge(&place(), 13, Nanos(100), at(100)).unwrap().0;
    let settled = leases.settle_charge(&place(), 11, at(120)).unwrap();

    assert_eq!(first, Some(Charge { units: 3, id: 11 }));
    assert_eq!(while_in_flight, None, "the debt a charge carries is reserved");
    assert_eq!(after_timeout, Some(Charge { units: 3, id: 11 }), "same units, same id");
    assert_eq!(settled, Settled { settled: true, left: 2 }, "what was owed meanwhile is still owed");
    assert_eq!(leases.claim_charge(&place(), 14, Nanos(100), at(130)).unwrap().0, Some(Charge { units: 2, id: 14 }));
}

#[test]
fn debt_keeps_its_slot_for_its_life_then_the_slot_changes_hands_and_the_debt_is_forgiven() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    leases.owe(&place(), 3, 10, (0, None), T).unwrap();
    let other = Placement { key: "l/0".into(), owner: 9, overflow: None };

    let before = leases.spend(&other, 1, at(DEBT_LIFE.0 - 1), RULES).unwrap();
    let after = leases.spend(&other, 1, at(DEBT_LIFE.0), RULES).unwrap();

    assert_eq!(before.result, Some(Spend::Taken));
    assert_eq!(after, Updated { result: Some(Spend::Wait { elected: true }), forgiven: 3 });
}

#[test]
fn debt_no_charge_carries_is_paid_from_the_next_grant_before_any_of_it_is_spent() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    leases.owe(&place(), 7, 10, (0, None), T).unwrap();
    // A charge carries 7; 2 more are owed while it is in flight.
    let _ = leases.claim_charge(&place(), 1, Nanos(100), T).unwrap();
    leases.owe(&place(), 2, 10, (0, None), T).unwrap();

    let granted = leases.grant(&place(), 5, None, T, Nanos(1000), (Nanos::ZERO, Nanos::ZERO), None, T).unwrap();

    assert_eq!(granted.result.map(|g| g.repaid), Some(2), "only what no charge carries");
    assert_eq!((record(&store).debt, record(&store).live_tokens(T)), (7, 3));
    let settled = leases.settle_charge(&place(), 1, T).unwrap();
    assert_eq!(settled, Settled { settled: true, left: 0 }, "nothing is left to charge");
}

#[test]
fn a_grant_smaller_than_the_debt_pays_what_it_can_and_leaves_nothing_to_spend() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    leases.owe(&place(), 7, 10, (0, None), T).unwrap();

    let granted =
        leases.grant(&place(), 5, Some((42, 1)), T, Nanos(1000), (Nanos::ZERO, Nanos::ZERO), None, T).unwrap();

    assert_eq!(granted.result.map(|g| g.repaid), Some(5));
    assert_eq!(record(&store).debt, 2);
    assert_eq!(retry(&leases, 1, T, T, 42), Spend::Wait { elected: true }, "nothing was held for the waiter");
}

#[test]
fn debt_that_cannot_be_charged_within_its_life_is_forgiven_by_the_next_claim() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    leases.owe(&place(), 3, 10, (0, None), T).unwrap();

    let claimed = leases.claim_charge(&place(), 1, Nanos(100), at(DEBT_LIFE.0)).unwrap();

    assert_eq!(claimed, (None, 3));
    assert_eq!(record(&store).debt, 0);
}

#[test]
fn a_charge_first_claimed_a_debt_life_ago_is_forgiven_rather_than_sent_again_with_an_id_the_service_may_forget() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    leases.owe(&place(), 3, 10, (0, None), T).unwrap();
    let first = leases.claim_charge(&place(), 1, Nanos(100), T).unwrap();
    assert_eq!(first, (Some(Charge { units: 3, id: 1 }), 0));
    // Its answer never comes; new debt keeps the record's debt young.
    leases.owe(&place(), 2, 10, (0, None), at(DEBT_LIFE.0 - 10)).unwrap();
    let again = leases.claim_charge(&place(), 2, Nanos(100), at(DEBT_LIFE.0 - 5)).unwrap();
    assert_eq!(again, (Some(Charge { units: 3, id: 1 }), 0), "sent again as it was, within its life");

    let later = leases.claim_charge(&place(), 3, Nanos(100), at(DEBT_LIFE.0 + 100)).unwrap();

    assert_eq!(later, (Some(Charge { units: 2, id: 3 }), 3), "the old charge forgiven, the rest charged afresh");
    assert_eq!(record(&store).debt, 2);
}

#[test]
fn a_record_of_the_previous_version_is_still_read() {
    let mut record = Record { debt: 7, charging: 7, charge_id: 9, charge_until: Nanos(500), ..Record::default() };
    let fields = record.fields();
    let previous: [u8; shared_store::words::width(22)] =
        shared_store::words::encode(2, &<[u64; 22]>::try_from(&fields[..22]).unwrap());

    record.charge_since = Nanos(500);
    assert_eq!(Record::decode(&previous), Some(record));
    assert_eq!(Record::decode(&record.encode()), Some(record));
}

#[test]
fn a_slot_held_by_another_keys_active_lease_is_never_shared() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    grant(&leases, 5, T, 1000, T);
    let other = Placement { key: "l/0".into(), owner: 9, overflow: None };

    assert_eq!(leases.spend(&other, 1, T, RULES).unwrap().result, Some(Spend::Taken));
    // Once the lease is idle (expired, nothing owed), the slot changes hands.
    assert_eq!(leases.spend(&other, 1, at(1000), RULES).unwrap().result, Some(Spend::Wait { elected: true }));
}

#[test]
fn a_given_back_spend_is_exact_while_the_lease_lives() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    grant(&leases, 2, T, 1000, T);
    let Spend::Spent { until, .. } = spend(&leases, 2, T) else { panic!("the grant covers it") };

    let kept = leases.give_back(&place(), 2, until, T).unwrap();

    // Spendable again; the refill the first spend elected is still in flight.
    assert_eq!(kept, 0);
    assert_eq!(spend(&leases, 2, T), Spend::Spent { refill: false, under: None, until: at(1000) });
}

#[test]
fn a_spend_given_back_after_its_grant_expired_never_lives_on_in_a_later_grant() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    grant(&leases, 1, T, 1000, T);
    let Spend::Spent { until, .. } = spend(&leases, 1, T) else { panic!("the grant covers it") };
    // A later grant lives longer than the one the token came from.
    grant(&leases, 1, at(500), 1000, at(500));

    // Given back while its own grant lives: to the pool that expires first (its own).
    let kept_alive = leases.give_back(&place(), 1, until, at(900)).unwrap();
    let _ = spend(&leases, 1, at(900));
    // Given back once its grant has expired: not into the later grant's pool.
    let kept_dead = leases.give_back(&place(), 1, until, at(1000)).unwrap();

    assert_eq!(until, at(1000), "spent from the grant that expires at 1000");
    assert_eq!(kept_alive, 0, "given back while its grant lives");
    assert_eq!(kept_dead, 1, "expired with its grant, not given back");
    assert_eq!(record(&store).live_tokens(at(1000)), 1, "only the later grant's own token");
}

#[test]
fn a_spend_given_back_while_a_later_grant_lives_shortens_no_one_elses_tokens() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    grant(&leases, 2, T, 1000, T);
    let Spend::Spent { until, .. } = spend(&leases, 1, T) else { panic!("the grant covers it") };
    grant(&leases, 3, at(500), 1000, at(500));

    let kept = leases.give_back(&place(), 1, until, at(600)).unwrap();

    assert_eq!(kept, 0);
    assert_eq!(record(&store).live_tokens(at(999)), 5, "both grants whole");
    assert_eq!(record(&store).live_tokens(at(1000)), 3, "the later grant's three outlive the first");
}

#[test]
fn an_unused_estimate_never_outlives_the_grant_it_was_spent_from() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    grant(&leases, 3, T, 1000, T);
    let Spend::Spent { until, .. } = spend(&leases, 3, T) else { panic!("the grant covers it") };
    grant(&leases, 1, at(500), 1000, at(500));

    let kept = leases.unspend(&place(), 2, until, at(1200)).unwrap().result.unwrap();

    assert_eq!(kept, 2, "its grant expired at 1000: the two units stay spent");
    assert_eq!(record(&store).live_tokens(at(1200)), 1);
}

#[test]
fn a_cost_above_its_estimate_is_taken_from_the_lease_and_owed_beyond_it_up_to_the_bound() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    grant(&leases, 5, T, 1000, T);

    let within = leases.overspend(&place(), 3, 4, Some((9, None)), T).unwrap().result.unwrap();
    let beyond = leases.overspend(&place(), 8, 4, Some((9, None)), T).unwrap().result.unwrap();

    assert_eq!(within, (0, false), "three of the five live tokens");
    assert_eq!(beyond, (2, true), "two tokens left, four owed, two forgiven");
    assert_eq!((record(&store).live_tokens(T), record(&store).debt, record(&store).counter), (0, 4, 9));
}

#[test]
fn an_unused_estimate_goes_back_to_a_live_lease_else_off_uncharged_debt_else_stays_spent() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    grant(&leases, 2, T, 1000, T);
    let Spend::Spent { until, .. } = spend(&leases, 2, T) else { panic!("the grant covers it") };

    let to_pool = leases.unspend(&place(), 2, until, at(10)).unwrap().result.unwrap();
    leases.owe(&place(), 3, 10, (0, None), at(2000)).unwrap();
    let _ = leases.claim_charge(&place(), 1, Nanos(100), at(2000)).unwrap();
    leases.owe(&place(), 2, 10, (0, None), at(2001)).unwrap();
    let off_debt = leases.unspend(&place(), 5, until, at(2002)).unwrap().result.unwrap();

    assert_eq!(to_pool, 0);
    assert_eq!(record(&store).live_tokens(at(10)), 2);
    assert_eq!(off_debt, 3, "two of the debt were not in the charge; the three in flight stay");
    assert_eq!((record(&store).debt, record(&store).charging), (3, 3));
}

#[test]
fn a_record_survives_its_encoding() {
    let r = Record {
        owner: 1,
        first: Pool { tokens: 2, expires_at: Nanos(3) },
        second: Pool { tokens: 4, expires_at: Nanos(5) },
        held: Pool { tokens: 6, expires_at: Nanos(7) },
        held_for: 8,
        refill_until: Nanos(9),
        empty_until: Nanos(10),
        failed_at: Nanos(11),
        failed_reason: 12,
        debt: 13,
        owed_at: Nanos(14),
        charging: 15,
        charge_id: 16,
        charge_until: Nanos(17),
        charge_since: Nanos(22),
        granted_at: Nanos(23),
        counter: (18 << 64) | 19,
        tag: Some((20 << 64) | 21),
        override_id: 24,
        override_kind: 2,
        asked_at: Nanos(25),
        demand: super::demand::Demand { since: Nanos(26), current: 27, previous: 28 },
    };

    assert_eq!(Record::decode(&r.encode()), Some(r));
    assert_eq!(Record::decode(&r.encode()[1..]), None);
    assert_eq!(r.under().map(|u| (u.id.0, u.kind)), Some((24, sluice_protocol::OverrideKind::Clamp)));
}

#[test]
fn a_version_3_record_left_by_an_earlier_build_reads_as_one_granted_under_no_override() {
    let current = Record { owner: 7, debt: 3, override_id: 9, override_kind: 1, ..Record::default() };
    let fields = current.fields();
    let old: [u8; shared_store::words::width(24)] =
        shared_store::words::encode(3, &<[u64; 24]>::try_from(&fields[..24]).unwrap());

    let read = Record::decode(&old).expect("a version-3 record is read");

    assert_eq!((read.owner, read.debt, read.under()), (7, 3, None));
}

#[test]
fn a_version_4_record_left_by_an_earlier_build_reads_as_one_whose_last_election_is_not_known() {
    let current = Record { owner: 7, debt: 3, override_id: 9, override_kind: 1, asked_at: at(5), ..Record::default() };
    let fields = current.fields();
    let old: [u8; shared_store::words::width(26)] =
        shared_store::words::encode(4, &<[u64; 26]>::try_from(&fields[..26]).unwrap());

    let read = Record::decode(&old).expect("a version-4 record is read");

    assert_eq!(read, Record { asked_at: Nanos::ZERO, ..current });
}

#[test]
fn while_the_budget_is_empty_one_request_asks_again_each_lease_duration_and_its_waiter_waits_for_the_answer() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    let _ = spend(&leases, 1, T);
    leases.grant(&place(), 0, None, T, Nanos(1000), (Nanos(60_000), Nanos::ZERO), None, at(10)).unwrap();

    assert_eq!(spend(&leases, 1, at(1999)), Spend::Empty { until: at(60_010), under: None });
    let probe = Spend::Probe { until: at(60_010), under: None };
    assert_eq!(spend(&leases, 1, at(2000)), probe, "a lease duration after the last ask");
    assert_eq!(spend(&leases, 1, at(2001)), Spend::Empty { until: at(60_010), under: None }, "one at a time");
    let retried = leases.retry(&place(), 1, at(2050), at(2000), 9, true, RULES).unwrap().result.unwrap();
    assert_eq!(retried, Spend::Wait { elected: false }, "the probe's waiter waits for its answer");
    let late = leases.retry(&place(), 1, at(2100), at(2000), 9, true, RULES).unwrap().result.unwrap();
    assert_eq!(late, Spend::Empty { until: at(60_010), under: None }, "its answer never came: the wait stands");
    assert_eq!(spend(&leases, 1, at(3999)), Spend::Empty { until: at(60_010), under: None });
    assert_eq!(spend(&leases, 1, at(4000)), probe);
}

#[test]
fn a_key_below_the_cold_bound_is_checked_from_its_first_request_unless_it_asked_for_a_refill_within_the_last_life() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    let adaptive = Rules { cold_below: 4, ..RULES };
    let spend = |rules: Rules, now: Nanos| leases.spend(&place(), 1, now, rules).unwrap().result.unwrap();

    let first_sight = spend(adaptive, T);
    let leased_anyway = spend(RULES, at(10));
    let within_its_life = spend(adaptive, at(150));
    let a_life_later = spend(adaptive, at(3000));
    let never_checked = spend(RULES, at(3100));

    assert_eq!(first_sight, Spend::Cold, "one unit, the first: checked, no refill elected");
    assert_eq!(leased_anyway, Spend::Wait { elected: true }, "a bound of 0: leased");
    assert_eq!(within_its_life, Spend::Wait { elected: true }, "it asked for a refill within the last life");
    assert_eq!(a_life_later, Spend::Cold, "three units over the last life, no refill asked in it");
    assert_eq!(never_checked, Spend::Wait { elected: true }, "a bound of 0 leases every key");
}

#[test]
fn a_first_request_that_costs_the_cold_bound_gets_a_lease() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    let adaptive = Rules { cold_below: 4, ..RULES };

    let costly = leases.spend(&place(), 4, T, adaptive).unwrap().result.unwrap();

    assert_eq!(costly, Spend::Wait { elected: true });
}

/// Grants `n` tokens to a fresh record at `T`, living 2000 ns.
fn granted_fresh(leases: &Leases<'_, MemoryStore>, n: u64) {
    let _ = grant(leases, n, T, 2000, T);
}

fn take_surplus(leases: &Leases<'_, MemoryStore>, expires_at: Nanos, now: Nanos) -> u64 {
    leases.take_surplus(&place(), expires_at, RULES.life, now).unwrap().result.unwrap()
}

#[test]
fn a_surplus_is_what_the_keys_demand_will_not_spend_before_its_grant_expires() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    granted_fresh(&leases, 10);
    // Eight units over the grant's first 1500 ns: 8 / 1500 × 2000 = 10.7 per life, so
    // 11 × 500 / 2000 = 2.75, kept as 3, over the quarter of its life that is left.
    for n in 0..8 {
        assert!(matches!(spend(&leases, 1, at(n * 100)), Spend::Spent { .. }));
    }

    assert_eq!(take_surplus(&leases, at(2000), at(1500)), 0, "two left, three expected");
    assert_eq!(record(&store).live_tokens(at(1500)), 2);
}

#[test]
fn a_quiet_keys_grant_gives_up_all_but_what_its_demand_still_needs() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    granted_fresh(&leases, 10);
    assert!(matches!(spend(&leases, 1, at(0)), Spend::Spent { .. }));

    // One unit over the last life: ⌈1 × 500 / 2000⌉ = 1 kept of the nine left.
    assert_eq!(take_surplus(&leases, at(2000), at(1500)), 8);
    assert_eq!(record(&store).live_tokens(at(1500)), 1);
    assert!(matches!(spend(&leases, 1, at(1600)), Spend::Spent { .. }));
    assert_eq!(spend(&leases, 1, at(1700)), Spend::Wait { elected: true }, "what was taken out is spent by no one");
}

#[test]
fn a_surplus_counts_the_tokens_of_earlier_grants_as_spent_first_and_leaves_later_grants_alone() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    let _ = grant(&leases, 4, T, 1000, T); // expires at(1000)
    let _ = grant(&leases, 6, at(100), 2000, at(100)); // expires at(2100)
    for n in 0..3 {
        assert!(matches!(spend(&leases, 1, at(200 + n)), Spend::Spent { .. }));
    }

    // Three units over the last life (too few to be projected at their rate). Reviewing
    // the earlier grant at 750: ⌈3 × 250 / 2000⌉ = 1 kept, and one is left of it.
    assert_eq!(take_surplus(&leases, at(1000), at(750)), 0, "one left of the first, and one expected");
    assert_eq!(record(&store).live_tokens(at(750)), 7, "the later grant untouched");
    // Reviewing the later one at 1600, the earlier expired: ⌈3 × 500 / 2000⌉ = 1 kept.
    assert_eq!(take_surplus(&leases, at(2100), at(1600)), 5);
    assert_eq!(record(&store).live_tokens(at(1600)), 1);
}

#[test]
fn a_grant_under_an_operators_override_or_past_its_expiry_gives_up_nothing() {
    let store = MemoryStore::new();
    let leases = Leases { store: &store, anchor: "a" };
    let bypass = sluice_protocol::AppliedOverride {
        id: sluice_protocol::OverrideId(9),
        kind: sluice_protocol::OverrideKind::Bypass,
    };
    let _ = leases.grant(&place(), 10, None, T, Nanos(2000), (Nanos::ZERO, Nanos::ZERO), Some(bypass), T).unwrap();

    assert_eq!(take_surplus(&leases, at(2000), at(1500)), 0, "a bypass spent nothing at the service");
    assert_eq!(take_surplus(&leases, at(2000), at(2000)), 0, "expired");
    assert_eq!(record(&store).live_tokens(at(1500)), 10);
}

/// A store that runs `between` once, just before the first write it is asked for: the
/// write then loses its compare-and-swap to whatever `between` wrote.
struct Between<'a> {
    inner: &'a MemoryStore,
    between: std::cell::RefCell<Option<Box<dyn FnOnce() + 'a>>>,
}

impl Store for Between<'_> {
    fn get(&self, key: &str) -> Result<Option<shared_store::Entry>, shared_store::StoreError> {
        self.inner.get(key)
    }

    fn set(
        &self,
        key: &str,
        value: &[u8],
        cas: Option<shared_store::Cas>,
    ) -> Result<shared_store::Swap, shared_store::StoreError> {
        if let Some(between) = self.between.borrow_mut().take() {
            between();
        }
        self.inner.set(key, value, cas)
    }
}

#[test]
fn a_surplus_taken_out_while_a_spend_was_being_written_is_never_spent_twice() {
    let store = MemoryStore::new();
    granted_fresh(&Leases { store: &store, anchor: "a" }, 5);
    let taken = std::cell::Cell::new(0);
    let racing = Between {
        inner: &store,
        between: std::cell::RefCell::new(Some(Box::new(|| {
            // Nothing is known of the key's demand: every token is surplus.
            taken.set(take_surplus(&Leases { store: &store, anchor: "a" }, at(2000), at(1500)));
        }))),
    };

    // The spend read five tokens, then lost its write to the surplus taken out.
    let spent = Leases { store: &racing, anchor: "a" }.spend(&place(), 3, at(1500), RULES).unwrap().result.unwrap();

    assert_eq!(taken.get(), 5);
    assert_eq!(spent, Spend::Wait { elected: true }, "read again: nothing left to spend");
    assert_eq!(record(&store).live_tokens(at(1500)), 0);
}
