//! Numbers that change never hand out allowance, on every store (memory, Redis, a Redis
//! Cluster): a rolling update over a counter in debt, and an operator's clamp set over a
//! counter in debt, with another window length, or ended while its caller idles. Each
//! scenario is one a user met (see the issue "Numbers that change never hand out
//! allowance"), replayed on the store with exact times: the call is enforced as the
//! service enforces it ([`Enforced`]) and decided by the store at the time the test
//! gives.

use shared_store::Nanos;
use sluice_counter::api::{ChargePlan, CheckPlan, CreditPlan, LeasePlan};
use sluice_counter::call::{Call, Outcome};
use sluice_counter::enforce::{Enforced, OverrideSet};
use sluice_counter::overrides::Override;
use sluice_counter::store::CounterStore;
use sluice_protocol::{
    Algorithm, ChargeRequest, CheckRequest, CreditRequest, EntryRequest, LeaseRequest, LimitSpec, OverrideKind,
};
use sluice_testkit::rng::Rng;

use crate::support::t_us;

const S: u64 = 1_000_000; // microseconds
const MS: u64 = 1_000;

fn entry(limit: LimitSpec, cost: u64) -> EntryRequest {
    EntryRequest { policy: Some("budget".to_owned()), key: "caller".to_owned(), policy_version: 0, limit, cost }
}

fn check_call(tag: &str, limit: LimitSpec, cost: u64) -> Call {
    let request = CheckRequest { tag: Some(tag.to_owned()), entries: vec![entry(limit, cost)] };
    Call::Check(CheckPlan::new(&request, 8).expect("a valid check"))
}

fn charge_call(tag: &str, limit: LimitSpec, cost: u64, max_debt: u64) -> Call {
    let request = ChargeRequest {
        tag: Some(tag.to_owned()),
        policy: Some("budget".to_owned()),
        key: "caller".to_owned(),
        policy_version: 0,
        limit,
        cost,
        max_debt,
        charge_id: None,
        id_ttl_ms: None,
    };
    Call::Charge(ChargePlan::new(&request).expect("a valid charge"))
}

/// A clamp of the policy `budget` to `limit`, from `from_us` (test time) for `ttl_us`.
fn clamp(limit: LimitSpec, from_us: u64, ttl_us: u64) -> OverrideSet {
    let ms = |us: u64| t_us(us).as_u64() / 1_000_000;
    OverrideSet::new(vec![Override {
        id: "ovr-00000000000000c1".to_owned(),
        kind: OverrideKind::Clamp,
        policy: "budget".to_owned(),
        limit: Some(limit),
        key: None,
        created_at_ms: ms(from_us),
        expires_at_ms: ms(from_us + ttl_us),
        reason: "incident".to_owned(),
        operator: "test".to_owned(),
    }])
}

/// `call` decided under `overrides` by `store` at test time `at_us`, as the service
/// decides it.
async fn decide(store: &CounterStore, overrides: &OverrideSet, call: &Call, at_us: u64) -> Outcome {
    try_decide(store, overrides, call, at_us).await.expect("the store answers")
}

/// [`decide`], with the store's error when it could not.
async fn try_decide(
    store: &CounterStore,
    overrides: &OverrideSet,
    call: &Call,
    at_us: u64,
) -> Result<Outcome, sluice_counter::store::CounterStoreError> {
    let at = t_us(at_us);
    let enforced = Enforced::new(call, overrides, at.as_u64() / 1_000_000);
    let decided = match enforced.store_call(call) {
        None => None,
        Some(Call::Check(plan)) => Some(Outcome::Check(store.check(plan, Some(at)).await?)),
        Some(Call::Lease(plan)) => Some(Outcome::Lease(store.lease(plan, Some(at)).await?)),
        Some(Call::Charge(plan)) => Some(Outcome::Charge(store.charge(plan, Some(at)).await?)),
        Some(Call::Credit(plan)) => Some(Outcome::Credit(store.credit(plan, Some(at)).await?)),
    };
    Ok(enforced.complete(call, decided, at).expect("an outcome of the call's kind"))
}

/// Where a scenario's counters live: a store, and a hash tag of the scenario's own (the
/// Redis Cluster is shared by the tests).
type On<'a> = (&'a CounterStore, &'a str);

async fn admitted((store, tag): On<'_>, overrides: &OverrideSet, limit: LimitSpec, cost: u64, at_us: u64) -> bool {
    match decide(store, overrides, &check_call(tag, limit, cost), at_us).await {
        Outcome::Check(outcome) => outcome.admitted,
        other => panic!("a check answered {other:?}"),
    }
}

async fn charged((store, tag): On<'_>, limit: LimitSpec, cost: u64, max_debt: u64, at_us: u64) -> u64 {
    match decide(store, &OverrideSet::default(), &charge_call(tag, limit, cost, max_debt), at_us).await {
        Outcome::Charge(outcome) => outcome.charged,
        other => panic!("a charge answered {other:?}"),
    }
}

fn bucket(per_second: u64, burst: u64) -> LimitSpec {
    LimitSpec::TokenBucket { amount: per_second, per_ms: 1000, burst }
}

/// A token budget whose burst is raised from 10 000 to 12 000 on half the proxies (no
/// version bump), and a caller alternating between them; each admitted request (an
/// estimate of 100) is charged 4 900 more when its response reports 5 000. What the
/// fleet lets through in 6 s stays within the larger numbers' bound plus the debt bound.
async fn a_rolling_update_over_a_counter_in_debt_admits_no_more_than_the_larger_numbers_allow(store: On<'_>) {
    let (old, new) = (bucket(1000, 10_000), bucket(1000, 12_000));
    let none = OverrideSet::default();
    let mut units = 0;
    let mut at = 0;
    let mut turn = 0u64;
    while at <= 6 * S {
        let limit = if turn.is_multiple_of(2) { old } else { new };
        turn += 1;
        if admitted(store, &none, limit, 100, at).await {
            units += 100 + charged(store, limit, 4_900, 10_000, at + MS).await;
        }
        at += 10 * MS;
    }

    // burst + rate × T + max_debt, with the larger numbers: 12 000 + 6 000 + 10 000.
    assert!(units <= 28_000, "{units} units admitted in 6 s against a bound of 28 000");
    assert!(units >= 16_000, "the budget itself is spent: {units}");
}

/// A caller 6 000 below empty on a bucket of 1 000 a second (its next request of 1 000
/// due 7 s later); an operator clamps the policy to a burst of 2 000 at the same rate.
/// The clamp's own counter is fresh, but the policy's still owes: nothing before 7 s.
async fn a_clamp_set_over_a_counter_in_debt_lets_no_one_through_before_the_debt_is_repaid(store: On<'_>) {
    let policy = bucket(1000, 10_000);
    let none = OverrideSet::default();
    assert!(admitted(store, &none, policy, 10_000, 0).await);
    assert_eq!(charged(store, policy, 6_000, 10_000, 0).await, 6_000);
    let clamped = clamp(bucket(1000, 2_000), 500 * MS, 60 * S);

    let after_a_second = admitted(store, &clamped, policy, 1_000, S).await;
    let just_before = admitted(store, &clamped, policy, 1_000, 7 * S - 1).await;
    let on_time = admitted(store, &clamped, policy, 1_000, 7 * S).await;

    assert!(!after_a_second && !just_before, "the debt is still owed under the clamp");
    assert!(on_time, "and repaid at exactly 7 s");
}

/// A fixed window of 100 per 10 s, spent whole in the first second of an aligned window;
/// a clamp of 2 per 1 s for 3 s (another window length). The window that counted 100
/// admits nothing more, during the clamp or after it.
async fn a_clamp_with_a_shorter_window_never_admits_beyond_the_policys_window(store: On<'_>) {
    let policy = LimitSpec::FixedWindow { limit: 100, window_ms: 10_000 };
    let none = OverrideSet::default();
    // t_us(0) is the start of an aligned 10 s window (1 750 000 000 s is a multiple of 10).
    let mut in_window = 0;
    for i in 0..100 {
        in_window += u64::from(admitted(store, &none, policy, 1, i * 5 * MS).await);
    }
    let clamped = clamp(LimitSpec::FixedWindow { limit: 2, window_ms: 1000 }, S, 3 * S);

    for at in (S..10 * S).step_by(100 * MS as usize) {
        let overrides = if at < 4 * S { &clamped } else { &none };
        in_window += u64::from(admitted(store, overrides, policy, 1, at).await);
    }
    let next_window = admitted(store, &none, policy, 1, 10 * S).await;

    assert_eq!(in_window, 100, "one window whose limit is 100");
    assert!(next_window);
}

/// A bucket of burst 1 000 at 100 a second, spent whole; a clamp of burst 10 for 3 s,
/// during which the caller idles (and, on the memory store, a sweep runs). When the
/// clamp ends, the caller has what the policy's refill gave it: 360 at 3.6 s, not 600.
async fn a_clamp_that_ends_while_its_caller_idles_hands_out_no_fresh_burst(store: On<'_>) {
    let policy = bucket(100, 1_000);
    let none = OverrideSet::default();
    assert!(admitted(store, &none, policy, 1_000, 0).await);
    let clamped = clamp(bucket(100, 10), 0, 3 * S);
    assert!(admitted(store, &clamped, policy, 1, 10 * MS).await, "the clamp's burst, within the refill");
    if let (CounterStore::Memory(memory), _) = store {
        memory.sweep(Some(t_us(2 * S)));
        memory.sweep(Some(t_us(3 * S + 500 * MS)));
    }

    let too_much = admitted(store, &none, policy, 600, 3_600 * MS).await;
    let what_refilled = admitted(store, &none, policy, 359, 3_600 * MS).await;

    assert!(!too_much, "a fresh burst after the clamp");
    assert!(what_refilled, "3.6 s at 100 a second, less the one unit spent under the clamp");
}

macro_rules! on_every_store {
    ($($scenario:ident),* $(,)?) => {$(
        mod $scenario {
            #[tokio::test]
            async fn on_the_memory_store() {
                let _shared = crate::support::HEAVY.read().await;
                super::$scenario((&crate::support::memory_store(), "c")).await;
            }

            #[tokio::test]
            async fn on_redis() {
                let _shared = crate::support::HEAVY.read().await;
                let redis = crate::support::RedisServer::start();
                super::$scenario((&crate::support::redis_store(&redis), "c")).await;
                redis.assert_every_key_has_a_ttl();
            }

            #[tokio::test]
            async fn on_a_redis_cluster() {
                let _shared = crate::support::HEAVY.read().await;
                let cluster = crate::support::shared_cluster();
                super::$scenario((&crate::support::cluster_store(cluster), stringify!($scenario))).await;
                cluster.assert_every_key_has_a_ttl();
            }
        }
    )*};
}

on_every_store!(
    a_rolling_update_over_a_counter_in_debt_admits_no_more_than_the_larger_numbers_allow,
    a_clamp_set_over_a_counter_in_debt_lets_no_one_through_before_the_debt_is_repaid,
    a_clamp_with_a_shorter_window_never_admits_beyond_the_policys_window,
    a_clamp_that_ends_while_its_caller_idles_hands_out_no_fresh_burst,
);

/// A limit of `algorithm` with small random numbers, inside the envelope; `None` for an
/// algorithm the counter service does not decide. Drawn from the one list of algorithms,
/// so a new one fails here until it has numbers.
fn any_limit(rng: &mut Rng, algorithm: Algorithm) -> Option<LimitSpec> {
    let (amount, capacity) = (rng.between(1, 20), rng.between(1, 30));
    let per_ms = rng.pick(&[10, 100, 250, 1000, 60_000]);
    Some(match algorithm {
        Algorithm::TokenBucket => LimitSpec::TokenBucket { amount, per_ms, burst: capacity },
        Algorithm::LeakyBucket => {
            LimitSpec::LeakyBucket { amount, per_ms, max_queue: capacity, max_wait_ms: rng.below(2 * per_ms + 1) }
        }
        Algorithm::FixedWindow => LimitSpec::FixedWindow { limit: capacity, window_ms: per_ms },
        Algorithm::SlidingWindow => LimitSpec::SlidingWindow { limit: capacity, window_ms: per_ms },
        Algorithm::SlidingLog => LimitSpec::SlidingLog { limit: capacity, window_ms: per_ms },
        Algorithm::Concurrency => return None,
    })
}

fn global_limit(rng: &mut Rng) -> LimitSpec {
    let global: Vec<Algorithm> = Algorithm::ALL.into_iter().filter(|a| a.global()).collect();
    loop {
        let algorithm = rng.pick(&global);
        if let Some(spec) = any_limit(rng, algorithm) {
            return spec;
        }
    }
}

fn lease_call(tag: &str, limit: LimitSpec, (tokens, min_tokens): (u64, u64)) -> Call {
    let request = LeaseRequest {
        tag: Some(tag.to_owned()),
        policy: Some("budget".to_owned()),
        key: "caller".to_owned(),
        policy_version: 0,
        limit,
        tokens,
        min_tokens,
        ttl_ms: 1000,
    };
    Call::Lease(LeasePlan::new(&request).expect("a valid lease"))
}

fn credit_call(tag: &str, limit: LimitSpec, units: u64, spent_at: Nanos, id: Option<String>) -> Call {
    let request = CreditRequest {
        tag: Some(tag.to_owned()),
        policy: Some("budget".to_owned()),
        key: "caller".to_owned(),
        policy_version: 0,
        limit,
        units,
        spent_at_ns: spent_at.as_u64(),
        credit_id: id,
        id_ttl_ms: None,
    };
    Call::Credit(CreditPlan::new(&request).expect("a valid credit"))
}

/// How many calls of each kind a comparison made, and how many under a clamp.
type Compared = (u64, std::collections::BTreeMap<&'static str, u64>);

/// Runs `cases` random sequences of calls on `redis` and on `memory` at the same times and
/// returns the first answer on which they differ: random policies and clamps of every
/// global algorithm, random times and costs, the clamp set and lifted mid-sequence.
async fn compare(redis: &CounterStore, memory: &CounterStore, seed: u64, cases: u64) -> Result<Compared, String> {
    let mut rng = Rng::new(seed);
    let mut clamped_calls = 0;
    let mut kinds = std::collections::BTreeMap::<&str, u64>::new();
    for case in 0..cases {
        let tag = format!("cl{case}");
        let policy = global_limit(&mut rng);
        let shapes = |spec: &LimitSpec| spec.kind() == Algorithm::LeakyBucket;
        let clamp_limit = loop {
            let spec = global_limit(&mut rng);
            if !shapes(&spec) || shapes(&policy) {
                break spec;
            }
        };
        let mut now_us = rng.below(1_000_000 * S);
        let set = clamp(clamp_limit, now_us, 3_600 * S);
        let none = OverrideSet::default();
        let mut clamped = rng.chance(70);
        let mut times = vec![now_us];
        let algorithm = policy.kind();
        let capacity = sluice_counter::spec::StoreLimit::new(policy).expect("valid").capacity();
        for step in 0..30 {
            if rng.chance(10) {
                clamped = !clamped;
            }
            now_us += match rng.below(4) {
                0 => 0,
                1 => rng.below(50 * MS),
                2 => rng.below(2 * S),
                _ => rng.below(200 * MS),
            };
            let overrides = if clamped { &set } else { &none };
            let (kind, call) = match rng.below(10) {
                0..=1 if algorithm.leasable() => {
                    let tokens = rng.between(1, capacity);
                    ("lease", lease_call(&tag, policy, (tokens, rng.between(1, tokens))))
                }
                2..=3 if algorithm.chargeable() => {
                    ("charge", charge_call(&tag, policy, rng.below(3 * capacity + 1), rng.below(capacity + 1)))
                }
                4..=5 if algorithm.creditable() => {
                    let spent = times[rng.below(times.len() as u64) as usize];
                    let id = rng.chance(30).then(|| format!("r{}", rng.below(4)));
                    ("credit", credit_call(&tag, policy, rng.below(capacity + 1), t_us(spent), id))
                }
                _ => ("check", check_call(&tag, policy, rng.below(capacity) + 1)),
            };
            let on_memory = try_decide(memory, overrides, &call, now_us).await;
            let on_redis = try_decide(redis, overrides, &call, now_us).await;
            if on_redis != on_memory {
                return Err(format!(
                    "seed {seed:#x} case {case} step {step}: {kind} of {policy:?} under {:?}: redis {on_redis:?}, \
                     memory {on_memory:?}",
                    clamped.then_some(clamp_limit)
                ));
            }
            clamped_calls += u64::from(clamped);
            *kinds.entry(kind).or_default() += 1;
            times.push(now_us);
        }
    }
    Ok((clamped_calls, kinds))
}

/// Redis runs every call a clamp makes two counters of (a check's extra entry, a lease
/// granted from both, a charge and a credit of both, with and without ids) exactly as the
/// memory store runs it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_decides_every_clamped_call_exactly_as_the_memory_store_does() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = crate::support::RedisServer::start();
    let seed = std::env::var("SLUICE_CLAMP_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0xC1A3_5EED_u64);

    let compared = compare(&crate::support::redis_store(&redis), &crate::support::memory_store(), seed, 150).await;

    let (clamped_calls, kinds) = compared.unwrap_or_else(|difference| panic!("{difference}"));
    assert!(clamped_calls > 2_000, "{clamped_calls} clamped calls");
    assert!(kinds.values().all(|n| *n > 100) && kinds.len() == 4, "every kind of call, often: {kinds:?}");
    redis.assert_every_key_has_a_ttl();
}

/// The comparison catches a script whose dispatch runs one algorithm's rules for another:
/// each mutant swaps two algorithms' arms of the script's `run`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_comparison_catches_a_script_that_runs_one_algorithm_for_another() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = crate::support::RedisServer::start();
    let script = sluice_counter::store::redis::SCRIPT;
    let arm = |code: &str| format!("if code == '{code}' then return ");
    for (a, b) in [("fw", "sw"), ("tb", "lb"), ("sw", "sl")] {
        let mutant = script.replacen(&arm(a), "@@", 1).replacen(&arm(b), &arm(a), 1).replacen("@@", &arm(b), 1);
        assert_ne!(mutant, script, "the mutant swaps {a} and {b}");
        let store = crate::support::redis_store_running(&redis, mutant.into());

        let compared = compare(&store, &crate::support::memory_store(), 0xC1A3_5EED, 150).await;

        assert!(compared.is_err(), "a script that runs {a} for {b} and {b} for {a} went unnoticed");
        redis.cmd::<()>(&["FLUSHALL"]);
    }
}

/// A clamp's counter lives no longer than its override: on Redis its TTL ends with the
/// override; on the memory store the sweep drops it then, whatever it holds.
#[tokio::test]
async fn a_clamps_counter_is_forgotten_when_its_override_ends() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = crate::support::RedisServer::start();
    let redis_store = crate::support::redis_store(&redis);
    let memory = crate::support::memory_store();
    // A clamp of one unit an hour (its counter stays in use for an hour), for 5 s.
    let set = clamp(LimitSpec::TokenBucket { amount: 1, per_ms: 3_600_000, burst: 1 }, 0, 5 * S);
    let policy = LimitSpec::TokenBucket { amount: 1, per_ms: 3_600_000, burst: 10 };

    let on_redis = decide(&redis_store, &set, &check_call("f", policy, 1), 0).await;
    let on_memory = decide(&memory, &set, &check_call("f", policy, 1), 0).await;
    let ttl: i64 = redis.cmd(&["PTTL", "sluice:{f}:clamp:ovr-00000000000000c1:v0:caller"]);
    let CounterStore::Memory(counters) = &memory else { panic!("the memory store") };
    let held = counters.len();
    counters.sweep(Some(t_us(5 * S - 1)));
    let before_its_end = counters.len();
    counters.sweep(Some(t_us(5 * S)));

    assert_eq!(on_redis, on_memory);
    assert!(ttl > 0 && ttl <= 5_000, "the clamp's counter ends with its override: PTTL {ttl} ms");
    assert_eq!((held, before_its_end, counters.len()), (2, 2, 1), "the policy's counter stays");
}
