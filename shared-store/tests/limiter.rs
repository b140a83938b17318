//! The limiter over Envoy-semantics shared data: key creation races, contention
//! exhaustion, damaged state, all-or-nothing across limits, and bounded slot tables.
//!
//! Like `scenarios.rs`, this file also runs on `wasm32-unknown-unknown` under Node.

#[cfg(target_arch = "wasm32")]
use wasm_bindgen_test::wasm_bindgen_test as test;

use shared_store::{
    Cas, Entry, HashKey, Limit, LimitError, Limiter, ManualClock, MemoryStore, Nanos, Placement, Rate, Record, Request,
    SlotTable, State, Store, StoreError, Swap, Verdict, descriptor,
};
use std::cell::RefCell;
use std::num::NonZeroU32;

const S: u64 = 1_000_000_000;

fn per_second(n: u64, burst: u64) -> Limit {
    Limit::token_bucket(Rate::new(n, Nanos::from_secs(1)).unwrap(), burst).unwrap()
}

fn clock() -> ManualClock {
    ManualClock::at(Nanos(1000 * S))
}

/// A store that runs `hook` once, just before the first write to `key` that carries a
/// CAS token: the moment another worker could slip in.
struct Interleave<'a, S> {
    store: &'a S,
    key: &'static str,
    hook: RefCell<Option<Box<dyn FnOnce() + 'a>>>,
}

impl<S: Store> Store for Interleave<'_, S> {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.store.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<Cas>) -> Result<Swap, StoreError> {
        if key == self.key
            && cas.is_some()
            && let Some(hook) = self.hook.borrow_mut().take()
        {
            hook();
        }
        self.store.set(key, value, cas)
    }
}

#[test]
fn two_workers_creating_the_same_key_lose_no_update() {
    let shared = MemoryStore::new();
    let clock = clock();
    let limit = per_second(1, 2);
    let key = Placement::dedicated("k");
    // Worker B creates the key and spends while worker A is between its read
    // ("missing") and its create.
    let worker_b = Limiter::new(&shared, clock.clone());
    let racing = Interleave {
        store: &shared,
        key: "k",
        hook: RefCell::new(Some(Box::new(|| assert!(worker_b.check_one(&key, &limit, 1).unwrap().admitted)))),
    };
    let worker_a = Limiter::new(racing, clock.clone());

    let a = worker_a.check_one(&key, &limit, 1).unwrap();

    assert!(a.admitted);
    assert_eq!(a.conflicts, 1, "A's create must have lost to B's and been retried");
    let third = Limiter::new(&shared, clock).check_one(&key, &limit, 1).unwrap();
    assert!(!third.admitted, "both spends are recorded: burst 2 is used up");
}

/// A store whose every conditional write loses, as under endless contention.
struct AlwaysConflicts(MemoryStore);

impl Store for AlwaysConflicts {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.0.get(key)
    }
    fn set(&self, key: &str, value: &[u8], cas: Option<Cas>) -> Result<Swap, StoreError> {
        if cas.is_some() { Ok(Swap::Conflict) } else { self.0.set(key, value, cas) }
    }
}

#[test]
fn contention_beyond_the_attempt_bound_is_an_explicit_error_never_an_admission() {
    let limiter = Limiter::new(AlwaysConflicts(MemoryStore::new()), clock()).with_max_attempts(5);

    let outcome = limiter.check_one(&Placement::dedicated("k"), &per_second(10, 10), 1);

    assert_eq!(outcome, Err(LimitError::Contended { attempts: 5 }));
    assert_eq!(limiter.store().0.get("k").unwrap(), None, "nothing was written");
}

struct Broken;

impl Store for Broken {
    fn get(&self, _: &str) -> Result<Option<Entry>, StoreError> {
        Err(StoreError { operation: "get", status: Some(10) })
    }
    fn set(&self, _: &str, _: &[u8], _: Option<Cas>) -> Result<Swap, StoreError> {
        Err(StoreError { operation: "set", status: Some(10) })
    }
}

#[test]
fn a_failing_store_is_reported_with_its_status() {
    let outcome = Limiter::new(Broken, clock()).check_one(&Placement::dedicated("k"), &per_second(1, 1), 1);
    assert_eq!(outcome, Err(LimitError::Store(StoreError { operation: "get", status: Some(10) })));
}

#[test]
fn undecodable_state_is_replaced_by_an_exhausted_bucket_never_a_full_one() {
    let store = MemoryStore::new();
    let clock = clock();
    let limit = per_second(1, 5);
    let _ = store.set("k", b"written by another plugin", None).unwrap();
    let limiter = Limiter::new(&store, clock.clone());

    let first = limiter.check_one(&Placement::dedicated("k"), &limit, 1).unwrap();

    assert_eq!(first.repaired, 1);
    assert_eq!(first.decisions[0].verdict, Verdict::Rejected { retry_after: Nanos::from_secs(1) });
    assert!(Record::decode(&store.get("k").unwrap().unwrap().value).is_ok(), "the key holds valid state again");
    clock.advance(Nanos::from_secs(1));
    assert!(limiter.check_one(&Placement::dedicated("k"), &limit, 1).unwrap().admitted);
}

#[test]
fn a_request_rejected_by_one_limit_spends_nothing_from_the_others() {
    let store = MemoryStore::new();
    let limiter = Limiter::new(&store, clock());
    let (tenant, user) = (Placement::dedicated("tenant"), Placement::dedicated("user"));
    let (roomy, tight) = (per_second(100, 100), per_second(1, 1));
    let both = |cost| [Request { place: &tenant, limit: &roomy, cost }, Request { place: &user, limit: &tight, cost }];
    assert!(limiter.check(&both(1)).unwrap().admitted);
    let tenant_before = store.get("tenant").unwrap();

    let rejected = limiter.check(&both(1)).unwrap();

    assert!(!rejected.admitted);
    assert!(rejected.decisions[0].is_admitted(), "the tenant limit alone would admit");
    assert_eq!(rejected.decisions[0].remaining, 99, "and reports what it still holds, unspent");
    assert_eq!(store.get("tenant").unwrap(), tenant_before, "the tenant bucket is untouched");
}

#[test]
fn a_write_that_loses_a_race_refunds_the_limits_already_written_and_retries() {
    let store = MemoryStore::new();
    let clock = clock();
    let (tenant, user) = (Placement::dedicated("tenant"), Placement::dedicated("user"));
    let (tenant_limit, user_limit) = (per_second(1, 10), per_second(1, 2));
    // Create both keys, so that later writes carry CAS tokens.
    let seed = Limiter::new(&store, clock.clone());
    assert!(seed.check(&[Request { place: &tenant, limit: &tenant_limit, cost: 0 }]).unwrap().admitted);
    let _ = seed.check_one(&user, &user_limit, 1).unwrap();
    // Another worker spends the user's last token between our read and our write.
    let other = Limiter::new(&store, clock.clone());
    let racing = Interleave {
        store: &store,
        key: "user",
        hook: RefCell::new(Some(Box::new(|| assert!(other.check_one(&user, &user_limit, 1).unwrap().admitted)))),
    };
    let limiter = Limiter::new(racing, clock.clone());

    let outcome = limiter
        .check(&[
            Request { place: &tenant, limit: &tenant_limit, cost: 3 },
            Request { place: &user, limit: &user_limit, cost: 1 },
        ])
        .unwrap();

    assert!(!outcome.admitted, "on retry the user limit is spent");
    assert_eq!(outcome.conflicts, 1);
    assert_eq!(outcome.unrefunded, 0);
    let tenant_left = seed.check(&[Request { place: &tenant, limit: &tenant_limit, cost: 0 }]).unwrap();
    assert_eq!(tenant_left.decisions[0].remaining, 10, "the tenant's 3 tokens were given back");
}

#[test]
fn a_reconfigured_smaller_burst_clamps_the_existing_bucket() {
    let store = MemoryStore::new();
    let limiter = Limiter::new(&store, clock());
    let key = Placement::dedicated("k");
    assert!(limiter.check_one(&key, &per_second(1, 100), 10).unwrap().admitted);

    let after = limiter.check_one(&key, &per_second(1, 5), 1).unwrap();

    assert!(after.admitted);
    assert_eq!(after.decisions[0].remaining, 4, "90 tokens clamp to the new burst of 5, minus 1");
}

fn table() -> SlotTable {
    SlotTable::new("p/", NonZeroU32::new(8).unwrap())
}

fn place(table: &SlotTable, who: &str) -> Placement {
    table.place(HashKey::new([3; 16]).fingerprint(&descriptor("p", 1, [who.as_bytes()])))
}

#[test]
fn flooding_a_slot_table_never_resets_a_tracked_client() {
    let store = MemoryStore::new();
    let clock = clock();
    let limiter = Limiter::new(&store, clock.clone());
    let table = table();
    let limit = per_second(1, 3);
    let victim = place(&table, "victim");
    for _ in 0..3 {
        assert!(limiter.check_one(&victim, &limit, 1).unwrap().admitted);
    }

    let mut overflowed = 0;
    for i in 0..10_000 {
        overflowed += limiter.check_one(&place(&table, &format!("attacker-{i}")), &limit, 1).unwrap().overflowed;
    }

    assert!(!limiter.check_one(&victim, &limit, 1).unwrap().admitted, "the victim's bucket was not reset");
    assert!(store.len() as u64 <= table.max_keys() + 1, "{} keys for a table of {}", store.len(), table.max_keys());
    assert!(overflowed > 0, "the flood spilled into the overflow bucket");
}

#[test]
fn the_overflow_bucket_limits_spilled_clients_together() {
    let store = MemoryStore::new();
    let limiter = Limiter::new(&store, clock());
    let table = table();
    let limit = per_second(1, 2);
    let admitted: usize = (0..1000)
        .map(|i| limiter.check_one(&place(&table, &format!("c{i}")), &limit, 2).unwrap())
        .filter(|a| a.admitted && a.overflowed > 0)
        .count();
    assert_eq!(admitted, 1, "one burst of 2 from the overflow bucket, at one instant");
}

#[test]
fn an_idle_slot_is_taken_over_and_a_spilled_client_starts_from_the_overflow_state() {
    let store = MemoryStore::new();
    let clock = clock();
    let limiter = Limiter::new(&store, clock.clone());
    let table = SlotTable::new("p/", NonZeroU32::new(1).unwrap());
    let limit = per_second(1, 2);
    let (first, second) = (place(&table, "first"), place(&table, "second"));
    assert!(limiter.check_one(&first, &limit, 1).unwrap().admitted);
    // The slot is busy: the second client spends from the overflow bucket.
    let spilled = limiter.check_one(&second, &limit, 2).unwrap();
    assert!(spilled.admitted && spilled.overflowed == 1);

    // One second later the first client's bucket is full (idle): the slot may change hands,
    // but the second client's spend in the overflow bucket follows it.
    clock.advance(Nanos::from_secs(1));
    let moved = limiter.check_one(&second, &limit, 1).unwrap();

    assert!(moved.admitted && moved.overflowed == 0);
    assert_eq!(moved.decisions[0].remaining, 0, "1 refilled token, spent: not a fresh bucket of 2");
    let record = Record::decode(&store.get(&second.key).unwrap().unwrap().value).unwrap();
    assert_eq!(record.owner, second.owner);
    assert!(matches!(record.state, State::Gcra { .. }));
}

#[test]
fn a_refunded_reservation_leaves_the_bucket_as_if_the_request_never_came() {
    let store = MemoryStore::new();
    let limiter = Limiter::new(&store, clock());
    let (limit, key) = (per_second(1, 3), Placement::dedicated("k"));
    let _ = limiter.check_one(&key, &limit, 1).unwrap();
    let before = store.get("k").unwrap().unwrap().value;

    let (admission, reservation) = limiter.reserve(&[Request { place: &key, limit: &limit, cost: 2 }]).unwrap();
    let unrefunded = limiter.refund(reservation);

    assert!(admission.admitted);
    assert_eq!(unrefunded, 0);
    let after = Record::decode(&store.get("k").unwrap().unwrap().value).unwrap();
    assert_eq!(after.state, Record::decode(&before).unwrap().state);
}

#[test]
fn a_committed_reservation_keeps_its_spend() {
    let limiter = Limiter::new(MemoryStore::new(), clock());
    let (limit, key) = (per_second(1, 2), Placement::dedicated("k"));

    let (_, reservation) = limiter.reserve(&[Request { place: &key, limit: &limit, cost: 2 }]).unwrap();
    limiter.commit(reservation);

    assert!(!limiter.check_one(&key, &limit, 1).unwrap().admitted);
}

#[test]
fn a_rejected_reservation_spends_nothing_and_is_empty() {
    let limiter = Limiter::new(MemoryStore::new(), clock());
    let (limit, key) = (per_second(1, 2), Placement::dedicated("k"));
    let _ = limiter.check_one(&key, &limit, 2).unwrap();

    let (admission, reservation) = limiter.reserve(&[Request { place: &key, limit: &limit, cost: 1 }]).unwrap();

    assert!(!admission.admitted);
    assert!(reservation.is_empty());
}

#[test]
fn a_bucket_gives_back_nothing_once_another_worker_wrote_it() {
    let store = MemoryStore::new();
    let clock = clock();
    let (limit, key) = (per_second(1, 4), Placement::dedicated("k"));
    let ours = Limiter::new(&store, clock.clone());
    let theirs = Limiter::new(&store, clock.clone());

    let (_, reservation) = ours.reserve(&[Request { place: &key, limit: &limit, cost: 2 }]).unwrap();
    assert!(theirs.check_one(&key, &limit, 2).unwrap().admitted);
    let unrefunded = ours.refund(reservation);

    // Stricter, never looser: the bucket cannot tell what is safe to give back.
    assert_eq!(unrefunded, 1);
    assert!(!theirs.check_one(&key, &limit, 1).unwrap().admitted);
}

#[test]
fn a_window_refund_is_exact_through_other_workers_writes() {
    let store = MemoryStore::new();
    let clock = clock();
    let limit = Limit::fixed_window(4, Nanos::from_secs(60)).unwrap();
    let key = Placement::dedicated("k");
    let ours = Limiter::new(&store, clock.clone());
    let theirs = Limiter::new(&store, clock.clone());

    let (_, reservation) = ours.reserve(&[Request { place: &key, limit: &limit, cost: 2 }]).unwrap();
    assert!(theirs.check_one(&key, &limit, 1).unwrap().admitted);
    assert_eq!(ours.refund(reservation), 0);

    // Their 1 stays spent; our 2 came back.
    assert!(theirs.check_one(&key, &limit, 3).unwrap().admitted);
    assert!(!theirs.check_one(&key, &limit, 1).unwrap().admitted);
}

#[test]
fn a_refund_on_a_slot_that_changed_hands_gives_nothing_to_the_new_holder() {
    let store = MemoryStore::new();
    let clock = clock();
    let limit = per_second(1, 2);
    let table = SlotTable::new("t/", NonZeroU32::new(1).unwrap());
    let (alice, bob) = (table.place(1 << 64 | 7), table.place(2 << 64 | 7));
    let limiter = Limiter::new(&store, clock.clone());

    let (_, reservation) = limiter.reserve(&[Request { place: &alice, limit: &limit, cost: 2 }]).unwrap();
    clock.advance(Nanos::from_secs(10));
    assert!(limiter.check_one(&bob, &limit, 2).unwrap().admitted);
    assert_eq!(limiter.refund(reservation), 0);

    assert!(!limiter.check_one(&bob, &limit, 1).unwrap().admitted, "bob's bucket must not gain alice's refund");
}
