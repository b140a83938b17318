//! How tests reach a store directly: stores built for tests, test times, and the plans
//! and calls of checks, leases, charges and credits.

use shared_store::Nanos;
use sluice_counter::api::{ChargePlan, CheckPlan, LeasePlan};
use sluice_counter::store::{
    ChargeOutcome, CheckOutcome, CounterStore, LeaseOutcome, MemoryConfig, MemoryCounters, RedisCounters, Topology,
};
use sluice_protocol::{ChargeRequest, CheckRequest, CreditRequest, EntryRequest, LeaseRequest, LimitSpec};

use super::{RedisCluster, RedisServer, redis_config};

pub fn memory_store() -> CounterStore {
    CounterStore::Memory(MemoryCounters::new(MemoryConfig { shards: 8, max_keys: 10_000, ..MemoryConfig::default() }))
}

pub fn redis_store(server: &RedisServer) -> CounterStore {
    CounterStore::Redis(Box::new(
        RedisCounters::new(redis_config(vec![server.url()], Topology::Standalone)).expect("store"),
    ))
}

/// A store on `server` that decides with `script` (a mutant of the real one).
pub fn redis_store_running(server: &RedisServer, script: std::borrow::Cow<'static, str>) -> CounterStore {
    CounterStore::Redis(Box::new(
        RedisCounters::with_script(redis_config(vec![server.url()], Topology::Standalone), script).expect("store"),
    ))
}

pub fn cluster_store(cluster: &RedisCluster) -> CounterStore {
    CounterStore::Redis(Box::new(RedisCounters::new(redis_config(cluster.urls(), Topology::Cluster)).expect("store")))
}

/// A test time: a whole number of microseconds near today's Unix time.
pub fn t_us(us: u64) -> Nanos {
    Nanos((1_750_000_000_000_000 + us) * 1000)
}

pub fn entry(key: &str, limit: LimitSpec, cost: u64) -> EntryRequest {
    EntryRequest { policy: None, key: key.to_owned(), policy_version: 0, limit, cost }
}

pub fn plan(tag: &str, entries: Vec<EntryRequest>) -> CheckPlan {
    CheckPlan::new(&CheckRequest { tag: Some(tag.to_owned()), entries }, 64).expect("a valid check")
}

pub async fn check(store: &CounterStore, tag: &str, entries: Vec<EntryRequest>, at: Nanos) -> CheckOutcome {
    store.check(&plan(tag, entries), Some(at)).await.expect("the store answers")
}

/// A lease of `tokens` (at least `min_tokens`) for one second.
pub fn lease_request(tag: &str, key: &str, limit: LimitSpec, (tokens, min_tokens): (u64, u64)) -> LeaseRequest {
    LeaseRequest {
        tag: Some(tag.to_owned()),
        policy: None,
        key: key.to_owned(),
        policy_version: 0,
        limit,
        tokens,
        min_tokens,
        ttl_ms: 1000,
    }
}

pub fn lease_plan(tag: &str, key: &str, limit: LimitSpec, tokens: u64) -> LeasePlan {
    lease_plan_at_least(tag, key, limit, (tokens, 1))
}

pub fn lease_plan_at_least(tag: &str, key: &str, limit: LimitSpec, tokens: (u64, u64)) -> LeasePlan {
    LeasePlan::new(&lease_request(tag, key, limit, tokens)).expect("a valid lease")
}

pub async fn lease(
    store: &CounterStore,
    tag: &str,
    key: &str,
    limit: LimitSpec,
    tokens: u64,
    at: Nanos,
) -> LeaseOutcome {
    store.lease(&lease_plan(tag, key, limit, tokens), Some(at)).await.expect("the store answers")
}

/// A charge of `cost`, at most `max_debt` below empty, with an optional charge id.
pub fn charge_request(
    tag: &str,
    key: &str,
    limit: LimitSpec,
    (cost, max_debt): (u64, u64),
    charge_id: Option<&str>,
) -> ChargeRequest {
    ChargeRequest {
        tag: Some(tag.to_owned()),
        policy: None,
        key: key.to_owned(),
        policy_version: 0,
        limit,
        cost,
        max_debt,
        charge_id: charge_id.map(str::to_owned),
        id_ttl_ms: None,
    }
}

pub fn charge_plan(tag: &str, key: &str, limit: LimitSpec, cost: u64, max_debt: u64) -> ChargePlan {
    ChargePlan::new(&charge_request(tag, key, limit, (cost, max_debt), None)).expect("a valid charge")
}

pub async fn charge(
    store: &CounterStore,
    tag: &str,
    key: &str,
    limit: LimitSpec,
    (cost, max_debt): (u64, u64),
    at: Nanos,
) -> ChargeOutcome {
    store.charge(&charge_plan(tag, key, limit, cost, max_debt), Some(at)).await.expect("the store answers")
}

/// A credit of `units` spent at `spent_at`, with an optional credit id.
pub fn credit_request(
    tag: &str,
    key: &str,
    limit: LimitSpec,
    (units, spent_at): (u64, Nanos),
    credit_id: Option<&str>,
) -> CreditRequest {
    CreditRequest {
        tag: Some(tag.to_owned()),
        policy: None,
        key: key.to_owned(),
        policy_version: 0,
        limit,
        units,
        spent_at_ns: spent_at.as_u64(),
        credit_id: credit_id.map(str::to_owned),
        id_ttl_ms: None,
    }
}
