//! Real threads racing on Envoy-semantics shared data, with every admission replayed
//! through an exact reference bucket: over-admission must be zero. A variant of the
//! store that ignores CAS tokens shows that the test catches lost updates.

use shared_store::{
    Cas, Clock, Entry, Limit, Limiter, MemoryStore, Nanos, Placement, Rate, Request, Store, StoreError, Swap,
};
use sluice_testkit::bucket::ReferenceBucket;
use sluice_testkit::rng::Rng;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;

/// Each decision reads a clock that every thread pushes forward, so time flows with
/// the load and the threads' clock reads interleave like Envoy workers'.
#[derive(Clone, Default)]
struct Ticking(Arc<AtomicU64>);

impl Ticking {
    const STEP: u64 = 100;
}

impl Clock for Ticking {
    fn now(&self) -> Nanos {
        Nanos(self.0.fetch_add(Self::STEP, Ordering::SeqCst) + (1 << 40))
    }
}

/// Envoy shared data with the CAS check switched off: every write is unconditional.
struct IgnoresCas(MemoryStore);

impl Store for IgnoresCas {
    fn get(&self, key: &str) -> Result<Option<Entry>, StoreError> {
        self.0.get(key)
    }
    fn set(&self, key: &str, value: &[u8], _: Option<Cas>) -> Result<Swap, StoreError> {
        self.0.set(key, value, None)
    }
}

struct Run {
    admits: Vec<Vec<(u64, u64)>>,
    contended: u64,
}

/// `threads` threads make `decisions` decisions each on `keys` keys, all against
/// `amount` per `per` ns with burst `burst`. Returns every admission per key.
fn race<S: Store + Send + Sync + 'static>(
    store: S,
    threads: usize,
    decisions: usize,
    keys: usize,
    limit: (u64, u64, u64),
) -> Run {
    let (amount, per, burst) = limit;
    let limit = Limit::token_bucket(Rate::new(amount, Nanos(per)).unwrap(), burst).unwrap();
    let store = Arc::new(store);
    let clock = Ticking::default();
    let places: Arc<Vec<Placement>> = Arc::new((0..keys).map(|k| Placement::dedicated(format!("key/{k}"))).collect());
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (store, clock, places) = (Arc::clone(&store), clock.clone(), Arc::clone(&places));
            thread::spawn(move || {
                let limiter = Limiter::new(store, clock);
                let mut rng = Rng::new(0x9e37_79b9_7f4a_7c15 ^ (t as u64 + 1));
                let mut admits = Vec::new();
                let mut contended = 0;
                for _ in 0..decisions {
                    let key = rng.below(keys as u64) as usize;
                    let cost = 1 + rng.below(2);
                    match limiter.check_one(&places[key], &limit, cost) {
                        Ok(a) if a.admitted => admits.push((key, a.at.0, cost)),
                        Ok(_) => {}
                        Err(_) => contended += 1,
                    }
                }
                (admits, contended)
            })
        })
        .collect();
    let mut run = Run { admits: vec![Vec::new(); keys], contended: 0 };
    for handle in handles {
        let (admits, contended) = handle.join().unwrap();
        run.contended += contended;
        for (key, at, cost) in admits {
            run.admits[key].push((at, cost));
        }
    }
    run
}

/// A per-key rate near the offered load, so buckets run empty and every lost update
/// would show up as an extra admission.
fn limit_for(keys: usize) -> (u64, u64, u64) {
    // Offered: one decision per STEP ns in total, 1.5 units on average.
    (1, Ticking::STEP * keys as u64, 4)
}

fn assert_no_over_admission(threads: usize, keys: usize) {
    let (amount, per, burst) = limit_for(keys);
    let mut run = race(MemoryStore::new(), threads, 100_000, keys, (amount, per, burst));
    let admitted: usize = run.admits.iter().map(Vec::len).sum();
    let over: u64 =
        run.admits.iter_mut().map(|admits| ReferenceBucket::new(amount, per, burst).over_admitted(admits)).sum();
    assert_eq!(over, 0, "{threads} threads, {keys} keys: {over} over-admissions among {admitted}");
    assert!(admitted > 1000, "the test must admit enough to mean something ({admitted})");
    eprintln!("{threads} threads × 100000 on {keys} keys: {admitted} admitted, {} contended, 0 over", run.contended);
}

#[test]
fn two_threads_never_over_admit_on_1_16_or_1024_keys() {
    for keys in [1, 16, 1024] {
        assert_no_over_admission(2, keys);
    }
}

#[test]
fn four_threads_never_over_admit_on_1_16_or_1024_keys() {
    for keys in [1, 16, 1024] {
        assert_no_over_admission(4, keys);
    }
}

#[test]
fn eight_threads_never_over_admit_on_1_16_or_1024_keys() {
    for keys in [1, 16, 1024] {
        assert_no_over_admission(8, keys);
    }
}

#[test]
fn sixteen_threads_never_over_admit_on_1_16_or_1024_keys() {
    for keys in [1, 16, 1024] {
        assert_no_over_admission(16, keys);
    }
}

#[test]
fn the_oracle_catches_a_limiter_that_writes_without_cas() {
    // Same race, but the store drops the CAS check. Lost updates must show up.
    let (amount, per, burst) = limit_for(1);
    let mut over = 0;
    for _ in 0..5 {
        let mut run = race(IgnoresCas(MemoryStore::new()), 8, 100_000, 1, (amount, per, burst));
        over += ReferenceBucket::new(amount, per, burst).over_admitted(&mut run.admits[0]);
        if over > 0 {
            break;
        }
    }
    assert!(over > 0, "writing without CAS must over-admit under contention");
}

#[test]
fn layered_limits_stay_exact_for_every_layer_under_contention() {
    // Each request spends from its own key and from one shared tenant bucket: all or
    // nothing, with refunds when a later write loses a race.
    let store = Arc::new(MemoryStore::new());
    let clock = Ticking::default();
    let (user_limit, tenant_limit) = ((1, 800, 4), (1, 300, 8));
    let to_limit = |(a, p, b): (u64, u64, u64)| Limit::token_bucket(Rate::new(a, Nanos(p)).unwrap(), b).unwrap();
    let (user, tenant) = (to_limit(user_limit), to_limit(tenant_limit));
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let (store, clock) = (Arc::clone(&store), clock.clone());
            thread::spawn(move || {
                let limiter = Limiter::new(store, clock);
                let tenant_key = Placement::dedicated("tenant");
                let users: Vec<Placement> = (0..4).map(|u| Placement::dedicated(format!("user/{u}"))).collect();
                let mut rng = Rng::new(t + 11);
                let mut admits = Vec::new();
                for _ in 0..50_000 {
                    let u = rng.below(4) as usize;
                    let requests = [
                        Request { place: &users[u], limit: &user, cost: 1 },
                        Request { place: &tenant_key, limit: &tenant, cost: 1 },
                    ];
                    if let Ok(a) = limiter.check(&requests)
                        && a.admitted
                    {
                        admits.push((u, a.at.0));
                    }
                }
                admits
            })
        })
        .collect();
    let admits: Vec<(usize, u64)> = handles.into_iter().flat_map(|h| h.join().unwrap()).collect();

    let mut tenant_admits: Vec<(u64, u64)> = admits.iter().map(|(_, at)| (*at, 1)).collect();
    let (a, p, b) = tenant_limit;
    assert_eq!(ReferenceBucket::new(a, p, b).over_admitted(&mut tenant_admits), 0, "tenant layer");
    for u in 0..4 {
        let mut user_admits: Vec<(u64, u64)> = admits.iter().filter(|(w, _)| *w == u).map(|(_, at)| (*at, 1)).collect();
        let (a, p, b) = user_limit;
        assert_eq!(ReferenceBucket::new(a, p, b).over_admitted(&mut user_admits), 0, "user {u} layer");
    }
    assert!(admits.len() > 1000);
}

/// How a reservation is given back in [`reserve_and_refund_half`].
#[derive(Clone, Copy)]
enum GiveBack {
    /// `Limiter::refund`.
    Refund,
    /// A plausible mistake: restore the bytes the key held before the spend, blindly.
    RestoreSnapshot,
}

/// One token per 1000 ns: with about 150 ns of clock per decision and half the
/// reservations given back, kept demand is about three times the supply, so the bucket
/// runs empty and every erased spend shows up as an extra admission.
const REFUNDED_LIMIT: (u64, u64, u64) = (1, 1000, 4);

/// `threads` threads reserve on one key and give back about half of the reservations;
/// returns the admissions that were kept.
fn reserve_and_refund_half(give_back: GiveBack, threads: usize, decisions: usize) -> Vec<(u64, u64)> {
    let (amount, per, burst) = REFUNDED_LIMIT;
    let limit = Limit::token_bucket(Rate::new(amount, Nanos(per)).unwrap(), burst).unwrap();
    let store = Arc::new(MemoryStore::new());
    let clock = Ticking::default();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let (store, clock, limit) = (Arc::clone(&store), clock.clone(), limit);
            thread::spawn(move || {
                let limiter = Limiter::new(Arc::clone(&store), clock);
                let place = Placement::dedicated("key");
                let mut rng = Rng::new(t as u64 + 101);
                let mut kept = Vec::new();
                for _ in 0..decisions {
                    let before = store.get("key").unwrap();
                    let Ok((admission, reservation)) =
                        limiter.reserve(&[Request { place: &place, limit: &limit, cost: 1 }])
                    else {
                        continue;
                    };
                    if !admission.admitted {
                        continue;
                    }
                    if rng.below(2) == 0 {
                        limiter.commit(reservation);
                        kept.push((admission.at.0, 1));
                        continue;
                    }
                    match give_back {
                        // Under contention most bucket refunds are refused (see `Limit::refund`).
                        GiveBack::Refund => {
                            let _ = limiter.refund(reservation);
                        }
                        GiveBack::RestoreSnapshot => {
                            limiter.commit(reservation);
                            if let Some(entry) = before {
                                let _ = store.set("key", &entry.value, None).unwrap();
                            }
                        }
                    }
                }
                kept
            })
        })
        .collect();
    handles.into_iter().flat_map(|h| h.join().unwrap()).collect()
}

#[test]
fn kept_reservations_stay_within_the_limit_when_others_are_refunded_under_contention() {
    let (amount, per, burst) = REFUNDED_LIMIT;
    let mut kept = reserve_and_refund_half(GiveBack::Refund, 8, 50_000);

    let over = ReferenceBucket::new(amount, per, burst).over_admitted(&mut kept);

    assert_eq!(over, 0, "{over} over-admissions among {} kept", kept.len());
    assert!(kept.len() > 1000, "the test must keep enough to mean something ({})", kept.len());
}

#[test]
fn the_oracle_catches_a_refund_that_restores_a_snapshot() {
    let (amount, per, burst) = REFUNDED_LIMIT;
    let mut over = 0;
    for _ in 0..5 {
        let mut kept = reserve_and_refund_half(GiveBack::RestoreSnapshot, 8, 50_000);
        over += ReferenceBucket::new(amount, per, burst).over_admitted(&mut kept);
        if over > 0 {
            break;
        }
    }
    assert!(over > 0, "restoring a snapshot erases other workers' spends and must over-admit");
}
