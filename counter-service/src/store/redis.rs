//! How the Redis store decides: every decision is one Lua script (`decide.lua`) on one
//! Redis node.
//!
//! * **Atomic.** The script reads every counter of a check, decides with Redis' own
//!   clock (`TIME`), and writes only if all admit. Leases, charges and credits are one
//!   key each, decided and written in the same script. All keys of one check share a hash
//!   tag, so on Redis Cluster they live in one slot and the script runs on its owner.
//! * **Exact.** The script reproduces `shared-store`'s integer algorithms in Lua doubles
//!   within the numeric envelope of `sluice-protocol`.
//! * **Every key has a TTL**, set by the same `SET .. PX` that writes it, long enough
//!   for the state to become idle (when dropping it changes no answer), plus a second.
//! * **Scripts by hash.** `EVALSHA` first; only a `NOSCRIPT` answer (which means the
//!   script did not run) falls back to `EVAL` with the body, which also caches it. No
//!   other failure is retried: a timeout after the command was sent may or may not have
//!   been applied, so it becomes a `store_unavailable` answer and is never replayed.
//!   (The cluster client is built with zero retries for the same reason.)
//! * **Bounded.** `pool_size` multiplexed connections (per node on a cluster), opened
//!   lazily and replaced only when Redis drops them; a slot being (re)connected makes
//!   other callers fail fast instead of opening more connections; every call has a
//!   deadline. A paused Redis therefore costs at most `pool_size` connections and the
//!   requests in flight, each answered when its deadline expires.

mod overrides;
mod pool;
mod script;
mod url;

use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::{Duration, Instant};

use shared_store::{Decision, Nanos};

use super::{ChargeOutcome, CheckOutcome, CounterStoreError, CreditOutcome, LeaseOutcome};
use crate::api::{ChargePlan, CheckPlan, CreditPlan, LeasePlan, PlannedEntry};
pub use overrides::{INDEX_KEY, override_key};
use pool::{Client, Conn, Slot};
pub use script::SCRIPT;
use script::{Reply, parse_reply};
pub use url::RedisUrl;

/// Standalone Redis or Redis Cluster.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topology {
    /// One Redis server (or a primary behind a stable address).
    Standalone,
    /// Redis Cluster; the URLs are seed nodes.
    Cluster,
}

/// Redis store settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://host:port` URLs (one for standalone; seed nodes for a cluster).
    pub urls: Vec<RedisUrl>,
    /// Standalone or cluster.
    pub topology: Topology,
    /// Multiplexed connections (per node on a cluster).
    pub pool_size: usize,
    /// Deadline of one call to Redis, including waiting for a connection.
    pub timeout: Duration,
    /// Deadline of one connection attempt.
    pub connect_timeout: Duration,
}

/// Counters the metrics endpoint reports.
#[derive(Debug, Default)]
pub struct RedisStats {
    /// Connections opened since start.
    pub connects: AtomicU64,
    /// Connections currently held by the pool.
    pub open: AtomicU64,
    /// `NOSCRIPT` answers that fell back to `EVAL`.
    pub script_reloads: AtomicU64,
}

/// What the startup check found about one node's eviction policy.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EvictionCheck {
    /// The node's URL (shown without its credentials).
    pub node: RedisUrl,
    /// `maxmemory-policy`, or why it could not be read.
    pub policy: Result<String, String>,
}

impl EvictionCheck {
    /// Whether the node may evict limiter keys (any policy but `noeviction`: every
    /// limiter key has a TTL, so `volatile-*` policies evict them too).
    pub fn evicts(&self) -> bool {
        matches!(&self.policy, Ok(p) if p != "noeviction")
    }
}

/// Counters in Redis, decided by one Lua script per check.
pub struct RedisCounters {
    config: RedisConfig,
    client: Client,
    slots: Box<[Slot]>,
    next: AtomicUsize,
    /// The decision script ([`SCRIPT`], or a test's mutant of it) and its SHA1.
    script: std::borrow::Cow<'static, str>,
    sha: String,
    started: Instant,
    /// Pool and script counters.
    pub stats: RedisStats,
}

impl std::fmt::Debug for RedisCounters {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisCounters").field("config", &self.config).field("sha", &self.sha).finish_non_exhaustive()
    }
}

impl RedisCounters {
    /// A store for `config`. Connections are opened lazily, so a Redis that is down at
    /// start makes `/readyz` fail instead of the service.
    ///
    /// # Errors
    /// When a URL does not parse.
    pub fn new(config: RedisConfig) -> Result<Self, CounterStoreError> {
        Self::with_script(config, SCRIPT.into())
    }

    /// A store for `config` that decides with `script` instead of [`SCRIPT`]: for tests
    /// that show a differential test catches a script that decides wrongly.
    ///
    /// # Errors
    /// When a URL does not parse.
    pub fn with_script(config: RedisConfig, script: std::borrow::Cow<'static, str>) -> Result<Self, CounterStoreError> {
        let client = Client::new(&config)?;
        let slots = Slot::pool(config.pool_size);
        Ok(Self {
            sha: redis::Script::new(&script).get_hash().to_owned(),
            script,
            config,
            client,
            slots,
            next: AtomicUsize::new(0),
            started: Instant::now(),
            stats: RedisStats::default(),
        })
    }

    /// The settings.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// Decides `plan` atomically with Redis' clock (`at` overrides it: tests only; it must
    /// be a whole number of microseconds).
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn check(&self, plan: &CheckPlan, at: Option<Nanos>) -> Result<CheckOutcome, CounterStoreError> {
        let entries: Vec<(&PlannedEntry, u64)> = plan.entries.iter().map(|e| (e, e.cost)).collect();
        let Reply { at, admitted, decisions, carry_forgiven, .. } = self.decide("check", 0, &entries, at).await?;
        Ok(CheckOutcome { admitted, at, decisions, carry_forgiven })
    }

    /// Grants up to `plan.tokens` (nothing when fewer than `plan.min_tokens` are left on
    /// the entry's counter or its clamp's), deducted in the same script.
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn lease(&self, plan: &LeasePlan, at: Option<Nanos>) -> Result<LeaseOutcome, CounterStoreError> {
        let entries: Vec<(&PlannedEntry, u64)> = plan.counters().map(|e| (e, plan.min_tokens)).collect();
        let Reply { at, granted, refill_after, decisions, carry_forgiven, .. } =
            self.decide("lease", plan.tokens, &entries, at).await?;
        let decision = together("lease", decisions)?;
        Ok(LeaseOutcome::new(plan, (granted, refill_after, carry_forgiven), at, decision))
    }

    /// Charges up to `plan.entry.cost` (and its clamp's counter, when it has one), each
    /// bounded by `plan.max_debt` and its own capacity, in one script; a charge with an id
    /// is remembered (with its answer) in the same script, under its charge key with a
    /// TTL of `plan.id_ttl_ms`, and not applied again while it is.
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn charge(&self, plan: &ChargePlan, at: Option<Nanos>) -> Result<ChargeOutcome, CounterStoreError> {
        let counters: Vec<&PlannedEntry> = plan.counters().collect();
        let (reply, decision) = self
            .remembered("charge", plan.max_debt, &counters, (plan.charge_key.as_deref(), plan.id_ttl_ms), at)
            .await?;
        let (charged, forgiven, duplicate) = (reply.granted, reply.forgiven, reply.duplicate);
        Ok(ChargeOutcome { charged, forgiven, duplicate, at: reply.at, decision, carry_forgiven: reply.carry_forgiven })
    }

    /// Gives back `plan.entry.cost` units spent at `plan.spent_at` (to the entry's counter
    /// and its clamp's, when it has one), in one script (see
    /// [`super::MemoryCounters::credit`] for what is credited); a credit with an id is
    /// remembered (with its answer) in the same script, under its credit key with a TTL
    /// of `plan.id_ttl_ms`, and not applied again while it is.
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn credit(&self, plan: &CreditPlan, at: Option<Nanos>) -> Result<CreditOutcome, CounterStoreError> {
        let spent_us = spent_at_us(plan.spent_at);
        let counters: Vec<&PlannedEntry> = plan.counters().collect();
        let (reply, decision) =
            self.remembered("credit", spent_us, &counters, (plan.credit_key.as_deref(), plan.id_ttl_ms), at).await?;
        let (credited, forgiven, duplicate) = (reply.granted, reply.forgiven, reply.duplicate);
        Ok(CreditOutcome {
            credited,
            forgiven,
            duplicate,
            at: reply.at,
            decision,
            carry_forgiven: reply.carry_forgiven,
        })
    }

    /// Runs `op` (a charge or a credit: one counter and its clamp's, `param` its script
    /// argument) with its id's key, remembered for `id_ttl_ms` (unused without an id); the
    /// reply and the counters' decisions together.
    async fn remembered(
        &self,
        op: &'static str,
        param: u64,
        counters: &[&PlannedEntry],
        (id_key, id_ttl_ms): (Option<&str>, u64),
        at: Option<Nanos>,
    ) -> Result<(Reply, Decision), CounterStoreError> {
        let mut keys: Vec<&str> = counters.iter().map(|e| e.storage_key.as_str()).collect();
        keys.extend(id_key);
        let entries: Vec<(&PlannedEntry, u64)> = counters.iter().map(|e| (*e, e.cost)).collect();
        let mut args = Self::script_args(op, param, &entries, at);
        args.push(id_ttl_ms.to_string());
        let mut reply = parse_reply(&self.run_script(&keys, &args).await?, counters.len())?;
        let decision = together(op, std::mem::take(&mut reply.decisions))?;
        Ok((reply, decision))
    }

    /// `PING` within the deadline.
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn ping(&self) -> Result<(), CounterStoreError> {
        self.call(async |conn: &mut Conn| conn.query(&redis::cmd("PING")).await).await.map(|_| ())
    }

    /// Reads `maxmemory-policy` on every configured node: a policy that evicts keys
    /// silently resets limits when Redis runs out of memory.
    pub async fn eviction_checks(&self) -> Vec<EvictionCheck> {
        let mut checks = Vec::new();
        for url in &self.config.urls {
            let policy = async {
                let client = redis::Client::open(url.expose()).map_err(|e| e.to_string())?;
                let mut conn = client.get_multiplexed_async_connection().await.map_err(|e| e.to_string())?;
                let reply: Vec<String> = redis::cmd("CONFIG")
                    .arg("GET")
                    .arg("maxmemory-policy")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| e.to_string())?;
                reply.get(1).cloned().ok_or_else(|| "CONFIG GET returned no value".to_owned())
            };
            let policy = tokio::time::timeout(self.config.connect_timeout + self.config.timeout, policy)
                .await
                .unwrap_or_else(|_| Err("timed out".to_owned()));
            checks.push(EvictionCheck { node: url.clone(), policy });
        }
        checks
    }
}

/// The decisions of one counter and its clamp's together ([`Decision::and`]).
fn together(op: &str, decisions: Vec<Decision>) -> Result<Decision, CounterStoreError> {
    decisions
        .into_iter()
        .reduce(Decision::and)
        .ok_or_else(|| CounterStoreError::Protocol(format!("{op} reply without a decision")))
}

/// The latest time the script takes exactly: 2^53 - 1 microseconds (the year 2255).
const LAST_EXACT_US: u64 = (1 << 53) - 1;

/// When a credit's units were spent, as the script reads it: whole microseconds (floored),
/// at most [`LAST_EXACT_US`]. The cap changes no answer: a spend that late counts in no
/// window a counter holds (Redis' clock stays below it until 2255), and a bucket's credit
/// does not read it.
fn spent_at_us(spent_at: Nanos) -> u64 {
    (spent_at.as_u64() / 1000).min(LAST_EXACT_US)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_credit_tells_the_script_when_its_units_were_spent_in_whole_microseconds_it_reads_exactly() {
        assert_eq!(spent_at_us(Nanos(1_750_000_000_123_456_789)), 1_750_000_000_123_456);
        assert_eq!(spent_at_us(Nanos(u64::MAX)), LAST_EXACT_US);
    }

    #[test]
    fn a_bad_redis_url_is_refused_without_its_password() {
        let config = RedisConfig {
            urls: vec![RedisUrl::new("redis://:hunter2@127.0.0.1:notaport/0")],
            topology: Topology::Standalone,
            pool_size: 1,
            timeout: Duration::from_millis(1),
            connect_timeout: Duration::from_millis(1),
        };

        let err = RedisCounters::new(config.clone()).unwrap_err().to_string();

        assert!(err.contains("bad redis url redis://***@127.0.0.1:notaport/0"), "{err}");
        assert!(!err.contains("hunter2") && !format!("{config:?}").contains("hunter2"), "{err}");
    }
}
