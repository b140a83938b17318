//! Whether the Lua script decides exactly as `shared-store` does (a differential test): the
//! script on a real Redis against `shared-store`'s `Limit::decide`, over many random limits
//! inside the numeric envelope, random times (including exact retry-after instants, one
//! microsecond before them, long idle gaps and backward steps) and random costs, checks,
//! leases (with minimums) and charges (which push counters below empty, so checks and
//! leases also run on states in debt; with charge ids, sent again), credits (of units
//! spent at an earlier step's time, the current or a past window's, or at no time the
//! counter holds; with credit ids, sent again, some with the text of a charge id), ids
//! remembered for the default time or one they ask for (`id_ttl_ms`, whose TTL on the id's
//! key is checked), and policies whose numbers or algorithm change mid-sequence on one key
//! (carried over by `Limit::adopt` in both). A lease's answer includes its `refill_after`: when the grant leaves fewer than
//! its minimum, the wait until the minimum could be granted again.

use shared_store::{Decision, Limit, Nanos, State};
use sluice_counter::spec::StoreLimit;
use sluice_protocol::{Algorithm, CHARGE_ID_TTL_MS, ChargeRequest, CreditRequest, LimitSpec, MAX_PERIOD_MS};

use sluice_counter::api::{ChargePlan, CreditPlan, charge_key, credit_key};
use sluice_counter::store::lease_life;
use sluice_testkit::rng::Rng;

use crate::support::{
    RedisServer, charge_request, credit_request, entry, lease_plan_at_least, plan, redis_store, t_us,
};

/// The `ttl_ms` of `support::lease_request`.
const LEASE_TTL_MS: u64 = 1000;

/// The algorithms the service decides, in the one list's order.
const GLOBAL: [Algorithm; 5] = {
    let mut out = [Algorithm::TokenBucket; 5];
    let mut i = 0;
    let mut n = 0;
    while i < Algorithm::ALL.len() {
        if Algorithm::ALL[i].global() {
            out[n] = Algorithm::ALL[i];
            n += 1;
        }
        i += 1;
    }
    assert!(n == out.len(), "every global algorithm is drawn");
    out
};

fn random_spec(rng: &mut Rng) -> LimitSpec {
    let periods = [1, 3, 7, 10, 100, 250, 1000, 1500, 60_000, 3_600_000, 86_400_000, MAX_PERIOD_MS];
    loop {
        let small = rng.chance(70);
        let amount = if small { 1 + rng.below(20) } else { 1 + rng.below(2_000_000) };
        let capacity = if small { 1 + rng.below(30) } else { 1 + rng.below(5_000_000) };
        let per_ms = rng.pick(&periods);
        // Every algorithm the service decides, from the one list: a new one fails to
        // compile here until the script is tested on it.
        let spec = match rng.pick(&GLOBAL) {
            Algorithm::TokenBucket => LimitSpec::TokenBucket { amount, per_ms, burst: capacity },
            Algorithm::LeakyBucket => {
                LimitSpec::LeakyBucket { amount, per_ms, max_queue: capacity, max_wait_ms: rng.below(2 * per_ms + 1) }
            }
            Algorithm::FixedWindow => LimitSpec::FixedWindow { limit: capacity, window_ms: per_ms },
            Algorithm::SlidingWindow => LimitSpec::SlidingWindow { limit: capacity, window_ms: per_ms },
            Algorithm::SlidingLog => LimitSpec::SlidingLog { limit: 1 + capacity % 40, window_ms: per_ms },
            Algorithm::Concurrency => unreachable!("the service never decides a concurrency limit"),
        };
        if StoreLimit::new(spec).is_ok() {
            return spec;
        }
    }
}

/// The time step (us) to the next request.
fn step_us(rng: &mut Rng, policy: &StoreLimit, last: &Decision) -> i64 {
    let period_us = policy.limit.period().as_u64() / 1000;
    let retry_us = |d: &Decision| d.retry_after().filter(|r| *r < Nanos::MAX).map(|r| r.as_u64().div_ceil(1000));
    match rng.below(10) {
        0 => 0,
        1 | 2 => retry_us(last).map_or(1, |r| r as i64),
        3 => retry_us(last).map_or(1, |r| r as i64 - 1),
        4 => rng.below(20) as i64,
        5 => -(rng.below(period_us / 4 + 2) as i64),
        6 => (period_us * (1 + rng.below(5))) as i64,
        _ => rng.below(period_us / 3 + 2) as i64,
    }
}

/// A limit like `spec` with other numbers: the same algorithm, and often the same
/// period or window (so that both of `Limit::adopt`'s window rules are reached).
fn changed_spec(rng: &mut Rng, spec: LimitSpec) -> LimitSpec {
    let same_algorithm = |other: &LimitSpec| std::mem::discriminant(other) == std::mem::discriminant(&spec);
    loop {
        let other = random_spec(rng);
        if !same_algorithm(&other) {
            continue;
        }
        let other = match (other, spec, rng.chance(40)) {
            (LimitSpec::FixedWindow { limit, .. }, LimitSpec::FixedWindow { window_ms, .. }, true) => {
                LimitSpec::FixedWindow { limit, window_ms }
            }
            (LimitSpec::SlidingWindow { limit, .. }, LimitSpec::SlidingWindow { window_ms, .. }, true) => {
                LimitSpec::SlidingWindow { limit, window_ms }
            }
            (LimitSpec::TokenBucket { burst, .. }, LimitSpec::TokenBucket { amount, per_ms, .. }, true) => {
                LimitSpec::TokenBucket { amount, per_ms, burst }
            }
            (other, ..) => other,
        };
        if StoreLimit::new(other).is_ok() {
            return other;
        }
    }
}

/// What the reference keeps per key, as the memory store does: shared-store's state, the
/// limit it was written under, the latest decision time, and the charge and credit ids
/// applied with their answers (charged or credited, forgiven), each kind apart.
#[derive(Default)]
struct Reference {
    state: Option<State>,
    limit: Option<Limit>,
    last: Nanos,
    charge_ids: std::collections::HashMap<String, (u64, u64)>,
    credit_ids: std::collections::HashMap<String, (u64, u64)>,
    /// Units of debt the last call's carry-over could not keep.
    carry_forgiven: u64,
}

impl Reference {
    /// The state under `limit` at `at`: carried over when it was written under another.
    /// The state under `limit` at `at`, carried over from the limit it was decided under
    /// when that differs, and kept (whatever the decision that follows, as both stores do).
    fn state_under(&mut self, limit: &Limit, at: Nanos) -> Option<State> {
        self.carry_forgiven = 0;
        if let (Some(state), Some(old)) = (&self.state, &self.limit)
            && old != limit
        {
            let carried = limit.carry(old, state.clone(), at);
            self.carry_forgiven = carried.forgiven;
            self.write(limit, carried.state, at);
        }
        self.state.clone()
    }

    fn write(&mut self, limit: &Limit, state: State, at: Nanos) {
        self.state = Some(state);
        self.limit = Some(*limit);
        self.last = at;
    }

    fn check(&mut self, limit: &Limit, now: Nanos, cost: u64) -> Decision {
        let at = now.max(self.last);
        let (decision, next) = limit.decide(self.state_under(limit, at).as_ref(), at, cost);
        if let Some(next) = next {
            self.write(limit, next, at);
        }
        decision
    }

    /// Grants `min(tokens, left)` when that reaches `min_tokens`, else answers the
    /// rejection of `min_tokens` units; a window that ends within a millisecond of `now`
    /// grants nothing, and the rejection waits until it ends. A grant that leaves fewer
    /// than `min_tokens` also answers the wait until that many are back (the retry_after
    /// of `min_tokens` on the state written), else zero. Returns (granted, decision,
    /// refill_after).
    fn lease(&mut self, limit: &Limit, now: Nanos, tokens: u64, min_tokens: u64) -> (u64, Decision, Nanos) {
        let at = now.max(self.last);
        let state = self.state_under(limit, at);
        let (query, _) = limit.decide(state.as_ref(), at, 0);
        if let Err(retry_after) = lease_life(limit, now, LEASE_TTL_MS) {
            return (0, Decision { verdict: shared_store::Verdict::Rejected { retry_after }, ..query }, Nanos::ZERO);
        }
        let granted = Some(tokens.min(query.remaining)).filter(|g| *g >= min_tokens).unwrap_or(0);
        let (decision, next) = limit.decide(state.as_ref(), at, granted.max(min_tokens));
        match next {
            Some(next) if granted > 0 && decision.is_admitted() => {
                let refill_after = if decision.remaining < min_tokens {
                    limit.decide(Some(&next), at, min_tokens).0.retry_after().unwrap_or(Nanos::ZERO)
                } else {
                    Nanos::ZERO
                };
                self.write(limit, next, at);
                (granted, decision, refill_after)
            }
            _ => (0, decision, Nanos::ZERO),
        }
    }

    /// What the memory store does: `Limit::charge` at the key's latest time, the status
    /// after it, and a write only when something was charged; a charge id seen before
    /// answers its first (charged, forgiven) again, with the status now, and charges
    /// nothing. Returns (charged, forgiven, duplicate, status).
    fn charge(
        &mut self,
        limit: &Limit,
        now: Nanos,
        (cost, max_debt): (u64, u64),
        id: Option<&str>,
    ) -> (u64, u64, bool, Decision) {
        let at = now.max(self.last);
        let state = self.state_under(limit, at);
        if let Some(&(charged, forgiven)) = id.and_then(|id| self.charge_ids.get(id)) {
            return (charged, forgiven, true, limit.status(state.as_ref(), at));
        }
        let (next, charged) = limit.charge(state.as_ref(), at, cost, max_debt);
        let status = limit.status(Some(&next), at);
        if charged > 0 {
            self.write(limit, next, at);
        }
        if let Some(id) = id {
            self.charge_ids.insert(id.to_owned(), (charged, cost - charged));
        }
        (charged, cost - charged, false, status)
    }
}

impl Reference {
    /// What the memory store does: `Limit::credit` at the key's latest time on the state
    /// under `limit`; the units it gave back are credited (the state then written),
    /// nothing is written when it gave back none; the status after it. A credit id seen before
    /// answers its first (credited, forgiven) again, with the status now. Returns
    /// (credited, forgiven, duplicate, status).
    fn credit(
        &mut self,
        limit: &Limit,
        now: Nanos,
        (units, spent_at): (u64, Nanos),
        id: Option<&str>,
    ) -> (u64, u64, bool, Decision) {
        let at = now.max(self.last);
        let state = self.state_under(limit, at);
        if let Some(&(credited, forgiven)) = id.and_then(|id| self.credit_ids.get(id)) {
            return (credited, forgiven, true, limit.status(state.as_ref(), at));
        }
        let back = state.as_ref().and_then(|s| limit.credit(s, spent_at, at, units)).filter(|(_, took)| *took > 0);
        let status = limit.status(back.as_ref().map(|(next, _)| next).or(state.as_ref()), at);
        let credited = back.as_ref().map_or(0, |(_, took)| *took);
        if let Some((next, _)) = back {
            self.write(limit, next, at);
        }
        if let Some(id) = id {
            self.credit_ids.insert(id.to_owned(), (credited, units - credited));
        }
        (credited, units - credited, false, status)
    }
}

/// How long an id asks to be remembered: the default, the longest, or anything from a
/// minute up. Never shorter: Redis expires an id in real time, which the test's time
/// override does not move, so an id must outlive its case (what a short ttl forgets is
/// checked in `stores.rs`).
fn random_id_ttl(rng: &mut Rng) -> Option<u64> {
    match rng.below(4) {
        0 => None,
        1 => Some(CHARGE_ID_TTL_MS),
        _ => Some(60_000 + rng.below(CHARGE_ID_TTL_MS - 60_000 + 1)),
    }
}

/// The TTL of a newly remembered id's key: more than 0, at most the time it asked for.
fn assert_id_ttl(redis: &RedisServer, id_key: &str, id_ttl_ms: Option<u64>, context: &str) {
    let ttl: i64 = redis.cmd(&["PTTL", id_key]);
    let asked = id_ttl_ms.unwrap_or(CHARGE_ID_TTL_MS);
    assert!(ttl > 0 && ttl as u64 <= asked, "{id_key}: PTTL {ttl}, asked for {asked}: {context}");
}

/// When a credit's units were spent: an earlier step's time (often the last), give or
/// take less than a microsecond or a window; now; or a time no counter holds.
fn spent_at(rng: &mut Rng, times: &[u64], now_us: i64, period_us: u64) -> Nanos {
    let recent = times.len().saturating_sub(1 + rng.below(4) as usize);
    let earlier_us = times.get(recent).copied().unwrap_or(now_us as u64);
    match rng.below(10) {
        0 => Nanos(t_us(earlier_us).as_u64() + rng.below(1000)),
        1 => t_us(earlier_us.saturating_sub(period_us)),
        2 => t_us(now_us as u64),
        3 if rng.chance(50) => Nanos(u64::MAX),
        3 => Nanos(0),
        _ => t_us(earlier_us),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_script_decides_exactly_like_shared_store_on_random_limits_times_and_costs() {
    let _shared = crate::support::HEAVY.read().await;
    let redis = RedisServer::start();
    let store = redis_store(&redis);
    let seed = std::env::var("SLUICE_DIFF_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or(0x5EED_1234_ABCD_0001_u64);
    let cases: u64 = std::env::var("SLUICE_DIFF_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(500);
    let mut rng = Rng::new(seed);
    let mut compared = 0u64;
    let mut rejections = 0u64;
    let mut charges = 0u64;
    let mut forgiven = 0u64;
    let mut duplicates = 0u64;
    let mut changes = 0u64;
    let mut refills = 0u64;
    let mut leases = 0u64;
    let mut credits = 0u64;
    let mut credited = 0u64;
    let mut credit_duplicates = 0u64;
    let mut carry_forgiven = 0u64;
    let mut partial_credits = 0u64;

    for case in 0..cases {
        let mut spec = random_spec(&mut rng);
        let mut policy = StoreLimit::new(spec).expect("valid");
        let tag = format!("diff{case}");
        let mut reference = Reference::default();
        let mut now_us: i64 = rng.below(86_400_000_000_000) as i64;
        let mut last =
            Decision { verdict: shared_store::Verdict::Allowed, limit: 0, remaining: 0, reset_after: Nanos::ZERO };
        let mut times: Vec<u64> = Vec::new();
        for step in 0..40 {
            // The key's policy changes mid-sequence, without a version bump: other
            // numbers of its algorithm, or another algorithm.
            if step > 0 && rng.chance(12) {
                spec = if rng.chance(70) { changed_spec(&mut rng, spec) } else { random_spec(&mut rng) };
                policy = StoreLimit::new(spec).expect("valid");
                changes += 1;
            }
            now_us = (now_us + step_us(&mut rng, &policy, &last)).max(0);
            let now = t_us(now_us as u64);
            let context = || format!("seed {seed:#x} case {case} step {step}: {spec:?} at {now_us} us");
            if policy.creditable() && rng.chance(20) {
                // Up to twice the capacity, sometimes the most a credit may give back.
                let units =
                    if rng.chance(5) { sluice_protocol::MAX_AMOUNT } else { rng.below(2 * policy.capacity() + 1) };
                let period_us = policy.limit.period().as_u64() / 1000;
                let spent = spent_at(&mut rng, &times, now_us, period_us);
                // Half the credits carry an id: a third of those one already applied, some
                // the text of a charge id (another namespace: not a duplicate).
                let ids_so_far = reference.credit_ids.len() as u64;
                let id = match rng.below(6) {
                    0 if ids_so_far > 0 => Some(format!("c{}", rng.below(ids_so_far))),
                    1 => Some(format!("c{ids_so_far}")),
                    2 => Some(format!("c{}", reference.charge_ids.len())),
                    _ => None,
                };
                let id_ttl_ms = id.as_ref().and_then(|_| random_id_ttl(&mut rng));
                let expected = reference.credit(&policy.limit, now, (units, spent), id.as_deref());
                let request =
                    CreditRequest { id_ttl_ms, ..credit_request(&tag, "k", spec, (units, spent), id.as_deref()) };
                let got = store
                    .credit(&CreditPlan::new(&request).expect("a valid credit"), Some(now))
                    .await
                    .expect("redis answers");
                assert_eq!(
                    (got.credited, got.forgiven, got.duplicate, got.decision),
                    expected,
                    "credit of {units} spent at {spent}, id {id:?}: {}",
                    context()
                );
                assert_eq!(got.carry_forgiven, reference.carry_forgiven, "{}", context());
                if let (Some(id), false) = (&id, expected.2) {
                    assert_id_ttl(&redis, &credit_key(&tag, 0, "k", id), id_ttl_ms, &context());
                }
                credits += 1;
                credited += u64::from(expected.0 > 0 && !expected.2);
                partial_credits += u64::from(expected.0 > 0 && expected.0 < units && !expected.2);
                credit_duplicates += u64::from(expected.2);
                last = expected.3;
            } else if policy.leasable() && rng.chance(15) {
                // From nothing to three times the capacity, and debt bounds from none to the most allowed.
                let cost = rng.below(3 * policy.capacity() + 1);
                let max_debt = if rng.chance(20) { policy.capacity() } else { rng.below(policy.capacity() + 1) };
                // Half the charges carry an id, a third of those one already applied.
                let ids_so_far = reference.charge_ids.len() as u64;
                let id = match rng.below(6) {
                    0 if ids_so_far > 0 => Some(format!("c{}", rng.below(ids_so_far))),
                    1 | 2 => Some(format!("c{ids_so_far}")),
                    _ => None,
                };
                let id_ttl_ms = id.as_ref().and_then(|_| random_id_ttl(&mut rng));
                let (charged, forgave, duplicate, expected) =
                    reference.charge(&policy.limit, now, (cost, max_debt), id.as_deref());
                let request =
                    ChargeRequest { id_ttl_ms, ..charge_request(&tag, "k", spec, (cost, max_debt), id.as_deref()) };
                let plan = ChargePlan::new(&request).expect("a valid charge");
                let got = store.charge(&plan, Some(now)).await.expect("redis answers");
                assert_eq!(
                    (got.charged, got.forgiven, got.duplicate, got.decision),
                    (charged, forgave, duplicate, expected),
                    "charge of {cost}, debt {max_debt}, id {id:?}: {}",
                    context()
                );
                assert_eq!(got.carry_forgiven, reference.carry_forgiven, "{}", context());
                if let (Some(id), false) = (&id, duplicate) {
                    assert_id_ttl(&redis, &charge_key(&tag, 0, "k", id), id_ttl_ms, &context());
                }
                charges += 1;
                forgiven += u64::from(charged < cost && !duplicate);
                duplicates += u64::from(duplicate);
                last = expected;
            } else if policy.leasable() && rng.chance(15) {
                let tokens = 1 + rng.below(policy.capacity());
                let min_tokens = if rng.chance(50) { 1 } else { 1 + rng.below(tokens) };
                let (granted, expected, refill_after) = reference.lease(&policy.limit, now, tokens, min_tokens);
                let got = store
                    .lease(&lease_plan_at_least(&tag, "k", spec, (tokens, min_tokens)), Some(now))
                    .await
                    .expect("redis answers");
                assert_eq!(
                    (got.granted, got.decision, got.refill_after),
                    (granted, expected, refill_after),
                    "lease of {tokens}, at least {min_tokens}: {}",
                    context()
                );
                assert_eq!(got.carry_forgiven, reference.carry_forgiven, "{}", context());
                leases += 1;
                refills += u64::from(refill_after > Nanos::ZERO);
                assert_eq!(got.expires_in_ms, lease_life(&policy.limit, now, LEASE_TTL_MS).unwrap_or(0));
                last = expected;
            } else {
                let spread = 1 + rng.below(8);
                let cost = if rng.chance(10) { 0 } else { 1 + rng.below(policy.capacity().min(spread)) };
                let expected = reference.check(&policy.limit, now, cost);
                let got =
                    store.check(&plan(&tag, vec![entry("k", spec, cost)]), Some(now)).await.expect("redis answers");
                assert_eq!(got.decisions, vec![expected], "cost {cost}: {}", context());
                assert_eq!(got.admitted, expected.is_admitted(), "{}", context());
                assert_eq!(got.at, now, "{}", context());
                assert_eq!(got.carry_forgiven, reference.carry_forgiven, "{}", context());
                if !expected.is_admitted() {
                    rejections += 1;
                }
                last = expected;
            }
            carry_forgiven += reference.carry_forgiven;
            times.push(now_us as u64);
            compared += 1;
        }
    }

    assert!(rejections > compared / 20, "the random walk must reach rejections often: {rejections} of {compared}");
    assert!(forgiven > charges / 10, "charges must reach their debt bound often: {forgiven} of {charges}");
    assert!(changes > cases * 2, "policies must change mid-sequence often: {changes} in {cases} cases");
    assert!(duplicates > charges / 20, "charges must be sent again with their id often: {duplicates} of {charges}");
    assert!(refills > leases / 10, "leases must leave less than their minimum often: {refills} of {leases}");
    assert!(credited > credits / 5, "credits must give back often: {credited} of {credits}");
    assert!(credits - credited - credit_duplicates > credits / 10, "and find nothing to give back often");
    assert!(credit_duplicates > credits / 20, "credits must be sent again with their id often");
    assert!(carry_forgiven > 0, "a carry-over must sometimes find more debt than the new numbers hold");
    let partial = partial_credits;
    assert!(partial > credits / 50, "credits must sometimes give back fewer units than asked: {partial} of {credits}");
    redis.assert_every_key_has_a_ttl();
}
