//! The Redis store: every decision is one Lua script (`decide.lua`) on one Redis node.
//!
//! * **Atomic.** The script reads every counter of a check, decides with Redis' own
//!   clock (`TIME`), and writes only if all admit. Leases and charges are one key each,
//!   decided and written in the same script. All keys of one check share a hash
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

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, ErrorKind, RedisError, ServerErrorKind, Value};
use shared_store::{Decision, Nanos, Verdict};
use sluice_protocol::CHARGE_ID_TTL_MS;

use super::{ChargeOutcome, CheckOutcome, CounterStoreError, LeaseOutcome};
use crate::api::{ChargePlan, CheckPlan, LeasePlan, PlannedEntry};

/// The decision script.
pub const SCRIPT: &str = include_str!("decide.lua");

/// After a failed connection attempt, a slot waits this long before trying again, so
/// that a Redis that is down is not hammered with connection attempts.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);

/// A Redis URL as configured, whose `Display` and `Debug` forms hide its credentials:
/// `redis://user:***@host:port/db`, `redis://***@host:port/db` when there is only a
/// password, and `***` for the value of a `pass` or `password` query parameter
/// (`redis+unix:///run/redis.sock?pass=...`). Every log line, metric, error message and
/// `Debug` print names a node by this form; only the connection itself reads
/// [`RedisUrl::expose`].
#[derive(Clone, PartialEq, Eq)]
pub struct RedisUrl(String);

impl RedisUrl {
    /// The URL as given (it is parsed, and refused with a redacted message, when the
    /// store is built).
    pub fn new(url: impl Into<String>) -> Self {
        Self(url.into())
    }

    /// The URL with its credentials, to connect with. Never log it.
    pub fn expose(&self) -> &str {
        &self.0
    }

    /// The URL with every credential replaced by `***`.
    pub fn redacted(&self) -> String {
        let url = self.0.as_str();
        let (scheme, rest) = match url.find("://") {
            Some(i) => url.split_at(i + 3),
            None => ("", url),
        };
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, path) = rest.split_at(authority_end);
        let authority = match authority.rfind('@') {
            Some(at) => {
                let (userinfo, host) = authority.split_at(at);
                match userinfo.split_once(':') {
                    Some((user, _)) if !user.is_empty() => format!("{user}:***{host}"),
                    // Only a password, or a lone word some clients read as one.
                    _ => format!("***{host}"),
                }
            }
            None => authority.to_owned(),
        };
        let (path, fragment) = match path.find('#') {
            Some(i) => path.split_at(i),
            None => (path, ""),
        };
        let path = match path.split_once('?') {
            Some((before, query)) => {
                let params: Vec<String> = query
                    .split('&')
                    .map(|param| match param.split_once('=') {
                        Some((name, _)) if name.to_ascii_lowercase().contains("pass") => format!("{name}=***"),
                        _ => param.to_owned(),
                    })
                    .collect();
                format!("{before}?{}", params.join("&"))
            }
            None => path.to_owned(),
        };
        format!("{scheme}{authority}{path}{fragment}")
    }
}

impl std::fmt::Display for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.redacted())
    }
}

impl std::fmt::Debug for RedisUrl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RedisUrl({:?})", self.redacted())
    }
}

impl From<&str> for RedisUrl {
    fn from(url: &str) -> Self {
        Self::new(url)
    }
}

impl From<String> for RedisUrl {
    fn from(url: String) -> Self {
        Self::new(url)
    }
}

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

#[derive(Clone)]
enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    async fn query(&mut self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Self::Single(c) => cmd.query_async(c).await,
            Self::Cluster(c) => cmd.query_async(c).await,
        }
    }
}

enum Client {
    Single(redis::Client),
    Cluster(Box<redis::cluster::ClusterClient>),
}

#[derive(Default)]
struct Slot {
    /// The connection and its generation (so that only the caller that saw a connection
    /// fail can drop it, never a newer one).
    conn: Mutex<Option<(u64, Conn)>>,
    generation: AtomicU64,
    /// Held by the one caller connecting this slot (a tokio mutex: released if that
    /// caller is cancelled).
    connect: tokio::sync::Mutex<()>,
    /// Milliseconds since the store started before which no reconnect is attempted.
    retry_at_ms: AtomicU64,
}

impl Slot {
    fn current(&self) -> Option<(u64, Conn)> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
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

fn unreachable(reason: impl Into<String>) -> CounterStoreError {
    CounterStoreError::Unreachable { store: "redis", reason: reason.into() }
}

fn classify(e: &RedisError) -> CounterStoreError {
    if e.is_timeout() {
        CounterStoreError::Unreachable { store: "redis", reason: format!("timed out: {e}") }
    } else if e.is_io_error() || e.is_connection_dropped() || e.is_connection_refusal() {
        unreachable(e.to_string())
    } else {
        CounterStoreError::Server(e.to_string())
    }
}

fn connection_is_dead(e: &RedisError) -> bool {
    e.is_connection_dropped() || e.is_connection_refusal() || (e.is_io_error() && !e.is_timeout())
}

impl RedisCounters {
    /// A store for `config`. Connections are opened lazily, so a Redis that is down at
    /// start makes `/readyz` fail instead of the service.
    ///
    /// # Errors
    /// When a URL does not parse.
    pub fn new(config: RedisConfig) -> Result<Self, CounterStoreError> {
        let bad = |url: &RedisUrl, e: RedisError| CounterStoreError::Server(format!("bad redis url {url}: {e}"));
        for url in &config.urls {
            redis::Client::open(url.expose()).map_err(|e| bad(url, e))?;
        }
        let client = match config.topology {
            Topology::Standalone => {
                let url = config.urls.first().ok_or_else(|| CounterStoreError::Server("no redis url given".into()))?;
                Client::Single(redis::Client::open(url.expose()).map_err(|e| bad(url, e))?)
            }
            Topology::Cluster => Client::Cluster(Box::new(
                redis::cluster::ClusterClient::builder(config.urls.iter().map(RedisUrl::expose))
                    // Zero retries: a retried script may run twice.
                    .retries(0)
                    .connection_timeout(config.connect_timeout)
                    .response_timeout(config.timeout)
                    .build()
                    .map_err(|e| CounterStoreError::Server(format!("bad redis cluster seed nodes: {e}")))?,
            )),
        };
        let slots = (0..config.pool_size.max(1)).map(|_| Slot::default()).collect();
        Ok(Self {
            sha: redis::Script::new(SCRIPT).get_hash().to_owned(),
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

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    async fn open(&self) -> Result<Conn, RedisError> {
        match &self.client {
            Client::Single(c) => {
                let cfg = redis::AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(self.config.connect_timeout))
                    .set_response_timeout(None);
                c.get_multiplexed_async_connection_with_config(&cfg).await.map(Conn::Single)
            }
            Client::Cluster(c) => c.get_async_connection().await.map(Conn::Cluster),
        }
    }

    /// A connection from slot `index`, connecting it if needed.
    ///
    /// One caller per slot connects; the others wait for it (within their own call
    /// deadline) and share the result. An attempt, even one cancelled by its caller's
    /// deadline, blocks further attempts on that slot for [`RECONNECT_BACKOFF`], so a
    /// slow or stopped Redis sees at most one connection attempt per slot per backoff.
    async fn connection(&self, index: usize) -> Result<(u64, Conn), CounterStoreError> {
        let slot = self.slots.get(index).ok_or_else(|| unreachable("no connection slot"))?;
        if let Some(current) = slot.current() {
            return Ok(current);
        }
        let _single = slot.connect.lock().await;
        if let Some(current) = slot.current() {
            return Ok(current);
        }
        let now = self.elapsed_ms();
        if now < slot.retry_at_ms.load(Ordering::Acquire) {
            return Err(unreachable("the last connection attempt failed; retrying shortly"));
        }
        slot.retry_at_ms.store(now + RECONNECT_BACKOFF.as_millis() as u64, Ordering::Release);
        match tokio::time::timeout(self.config.connect_timeout, self.open()).await {
            Ok(Ok(conn)) => {
                let generation = slot.generation.fetch_add(1, Ordering::AcqRel) + 1;
                *slot.conn.lock().unwrap_or_else(PoisonError::into_inner) = Some((generation, conn.clone()));
                slot.retry_at_ms.store(0, Ordering::Release);
                self.stats.connects.fetch_add(1, Ordering::Relaxed);
                self.stats.open.fetch_add(1, Ordering::Relaxed);
                Ok((generation, conn))
            }
            Ok(Err(e)) => Err(unreachable(format!("cannot connect: {e}"))),
            Err(_) => Err(unreachable(format!("cannot connect within {} ms", self.config.connect_timeout.as_millis()))),
        }
    }

    /// Drops slot `index`'s connection if it is still generation `generation`.
    fn discard(&self, index: usize, generation: u64) {
        if let Some(slot) = self.slots.get(index) {
            let mut conn = slot.conn.lock().unwrap_or_else(PoisonError::into_inner);
            if matches!(conn.as_ref(), Some((g, _)) if *g == generation) {
                *conn = None;
                self.stats.open.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }

    /// Runs `f` on a pooled connection within the call deadline.
    async fn call<T>(
        &self,
        cmd_for: impl AsyncFnOnce(&mut Conn) -> Result<T, RedisError>,
    ) -> Result<T, CounterStoreError> {
        let index = self.next.fetch_add(1, Ordering::Relaxed) % self.slots.len();
        let work = async {
            let (generation, mut conn) = self.connection(index).await?;
            match cmd_for(&mut conn).await {
                Ok(v) => Ok(v),
                Err(e) => {
                    if matches!(conn, Conn::Single(_)) && connection_is_dead(&e) {
                        self.discard(index, generation);
                    }
                    Err(classify(&e))
                }
            }
        };
        match tokio::time::timeout(self.config.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(CounterStoreError::Timeout {
                store: "redis",
                after_ms: u64::try_from(self.config.timeout.as_millis()).unwrap_or(u64::MAX),
            }),
        }
    }

    /// `EVALSHA`, and `EVAL` only when Redis answers `NOSCRIPT` (the script did not run).
    async fn run_script(&self, keys: &[&str], args: &[String]) -> Result<Vec<i64>, CounterStoreError> {
        let value = self
            .call(async |conn: &mut Conn| {
                let mut evalsha = redis::cmd("EVALSHA");
                evalsha.arg(&self.sha).arg(keys.len()).arg(keys).arg(args);
                match conn.query(&evalsha).await {
                    Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
                        self.stats.script_reloads.fetch_add(1, Ordering::Relaxed);
                        let mut eval = redis::cmd("EVAL");
                        eval.arg(SCRIPT).arg(keys.len()).arg(keys).arg(args);
                        conn.query(&eval).await
                    }
                    other => other,
                }
            })
            .await?;
        redis::from_redis_value::<Vec<i64>>(value)
            .map_err(|e| CounterStoreError::Protocol(format!("script reply: {e}")))
    }

    /// The script's arguments; each entry travels with its number: the cost of a check's
    /// entry or a charge, the `min_tokens` of a lease.
    fn script_args(op: &str, tokens: u64, entries: &[(&PlannedEntry, u64)], at: Option<Nanos>) -> Vec<String> {
        let mut args = Vec::with_capacity(3 + 6 * entries.len());
        args.push(at.map_or_else(String::new, |t| (t.as_u64() / 1000).to_string()));
        args.push(op.to_owned());
        args.push(tokens.to_string());
        for (e, number) in entries {
            let s = &e.limit.script;
            args.push(s.code.to_owned());
            args.extend(s.args.iter().map(u64::to_string));
            args.push(number.to_string());
        }
        args
    }

    async fn decide(
        &self,
        op: &str,
        tokens: u64,
        entries: &[(&PlannedEntry, u64)],
        at: Option<Nanos>,
    ) -> Result<Reply, CounterStoreError> {
        let keys: Vec<&str> = entries.iter().map(|(e, _)| e.storage_key.as_str()).collect();
        let reply = self.run_script(&keys, &Self::script_args(op, tokens, entries, at)).await?;
        parse_reply(&reply, entries.len())
    }

    /// Decides `plan` atomically with Redis' clock (`at` overrides it: tests only; it must
    /// be a whole number of microseconds).
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn check(&self, plan: &CheckPlan, at: Option<Nanos>) -> Result<CheckOutcome, CounterStoreError> {
        let entries: Vec<(&PlannedEntry, u64)> = plan.entries.iter().map(|e| (e, e.cost)).collect();
        let Reply { at, admitted, decisions, .. } = self.decide("check", 0, &entries, at).await?;
        Ok(CheckOutcome { admitted, at, decisions })
    }

    /// Grants up to `plan.tokens` (nothing when fewer than `plan.min_tokens` are left),
    /// deducted in the same script.
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn lease(&self, plan: &LeasePlan, at: Option<Nanos>) -> Result<LeaseOutcome, CounterStoreError> {
        let Reply { at, granted, refill_after, decisions, .. } =
            self.decide("lease", plan.tokens, &[(&plan.entry, plan.min_tokens)], at).await?;
        let decision = decisions
            .into_iter()
            .next()
            .ok_or_else(|| CounterStoreError::Protocol("lease reply without a decision".into()))?;
        Ok(LeaseOutcome::new(plan, (granted, refill_after), at, decision))
    }

    /// Charges up to `plan.entry.cost`, bounded by `plan.max_debt`, in one script; a
    /// charge with an id is remembered (with its answer) in the same script, under its
    /// charge key with a TTL of `CHARGE_ID_TTL_MS`, and not applied again while it is.
    ///
    /// # Errors
    /// See [`CounterStoreError`].
    pub async fn charge(&self, plan: &ChargePlan, at: Option<Nanos>) -> Result<ChargeOutcome, CounterStoreError> {
        let mut keys = vec![plan.entry.storage_key.as_str()];
        keys.extend(plan.charge_key.as_deref());
        let mut args = Self::script_args("charge", plan.max_debt, &[(&plan.entry, plan.entry.cost)], at);
        args.push(CHARGE_ID_TTL_MS.to_string());
        let reply = parse_reply(&self.run_script(&keys, &args).await?, 1)?;
        let decision = reply
            .decisions
            .into_iter()
            .next()
            .ok_or_else(|| CounterStoreError::Protocol("charge reply without a decision".into()))?;
        Ok(ChargeOutcome {
            charged: reply.granted,
            forgiven: reply.forgiven,
            duplicate: reply.duplicate,
            at: reply.at,
            decision,
        })
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

/// A wait in the script's reply: nanoseconds, -1 for never.
fn wait(ns: i64) -> Nanos {
    Nanos(u64::try_from(ns).unwrap_or(u64::MAX))
}

fn verdict(code: i64, wait_ns: i64) -> Result<Verdict, CounterStoreError> {
    let wait = wait(wait_ns);
    match code {
        0 => Ok(Verdict::Allowed),
        1 => Ok(Verdict::Delayed(wait)),
        2 => Ok(Verdict::Rejected { retry_after: wait }),
        3 => Ok(Verdict::Exceeds),
        other => Err(CounterStoreError::Protocol(format!("unknown verdict {other}"))),
    }
}

fn non_negative(v: i64, what: &str) -> Result<u64, CounterStoreError> {
    u64::try_from(v).map_err(|_| CounterStoreError::Protocol(format!("negative {what}: {v}")))
}

/// What the script answered.
#[derive(Debug, PartialEq, Eq)]
struct Reply {
    /// Redis' time (or the override).
    at: Nanos,
    /// A check: every entry admitted.
    admitted: bool,
    /// A lease: tokens granted; a charge: units charged (the first time, for a duplicate).
    granted: u64,
    /// A charge: its id was applied before.
    duplicate: bool,
    /// A charge: units forgiven (the first time, for a duplicate).
    forgiven: u64,
    /// A lease: the wait until `min_tokens` could be granted again, when the grant left
    /// fewer ([`Nanos::MAX`] for never); zero otherwise.
    refill_after: Nanos,
    /// One per entry.
    decisions: Vec<Decision>,
}

/// Parses `{sec, usec, admitted, granted, duplicate, forgiven, refill_after, (verdict,
/// limit, remaining, reset, wait)*}`.
fn parse_reply(reply: &[i64], entries: usize) -> Result<Reply, CounterStoreError> {
    let (head, rest) = reply
        .split_first_chunk::<7>()
        .ok_or_else(|| CounterStoreError::Protocol(format!("script reply has {} values", reply.len())))?;
    if rest.len() != 5 * entries {
        return Err(CounterStoreError::Protocol(format!(
            "script reply has {} values for {entries} entries",
            reply.len()
        )));
    }
    let [sec, usec, admitted, granted, duplicate, forgiven, refill_after] = *head;
    let at = Nanos::from_secs(non_negative(sec, "time")?)
        .saturating_add(Nanos(non_negative(usec, "time")?.saturating_mul(1000)));
    let mut decisions = Vec::with_capacity(entries);
    for chunk in rest.chunks_exact(5) {
        if let [code, limit, remaining, reset, wait] = *chunk {
            decisions.push(Decision {
                verdict: verdict(code, wait)?,
                limit: non_negative(limit, "limit")?,
                remaining: non_negative(remaining, "remaining")?,
                reset_after: Nanos(non_negative(reset, "reset")?),
            });
        }
    }
    Ok(Reply {
        at,
        admitted: admitted == 1,
        granted: non_negative(granted, "grant")?,
        duplicate: duplicate == 1,
        forgiven: non_negative(forgiven, "forgiven")?,
        refill_after: wait(refill_after),
        decisions,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_redis_url_is_shown_without_its_credentials() {
        for (given, shown) in [
            ("redis://:hunter2@127.0.0.1:1/0", "redis://***@127.0.0.1:1/0"),
            ("redis://sluice:hunter2@10.0.0.5:6379/2", "redis://sluice:***@10.0.0.5:6379/2"),
            ("rediss://hunter2@cache.internal", "rediss://***@cache.internal"),
            ("redis+unix:///run/redis.sock?db=1&pass=hunter2", "redis+unix:///run/redis.sock?db=1&pass=***"),
            ("redis://u:p@ss:hunter2@h:1?Password=hunter2#x", "redis://u:***@h:1?Password=***#x"),
            ("redis://127.0.0.1:6379", "redis://127.0.0.1:6379"),
        ] {
            let url = RedisUrl::new(given);

            assert_eq!(url.to_string(), shown, "{given}");
            assert!(!format!("{url:?}").contains("hunter2"), "{url:?}");
            assert_eq!(url.expose(), given);
        }
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

    #[test]
    fn a_reply_of_the_wrong_shape_is_a_protocol_error() {
        assert!(matches!(parse_reply(&[1, 2, 3], 1), Err(CounterStoreError::Protocol(_))));
        assert!(matches!(parse_reply(&[1, 2, 1, 0, 0, 0, 0, 0, 5, 4, 0], 1), Err(CounterStoreError::Protocol(_))));
        assert!(matches!(parse_reply(&[1, 2, 1, 0, 0, 0, 0, 5, 4, 0, 0], 1), Err(CounterStoreError::Protocol(_))));
        assert!(matches!(parse_reply(&[1, 2, 1, 0, 0, 0, 0, 9, 5, 4, 0, 0], 1), Err(CounterStoreError::Protocol(_))));
        assert!(matches!(parse_reply(&[-1, 2, 1, 0, 0, 0, 0, 0, 5, 4, 0, 0], 1), Err(CounterStoreError::Protocol(_))));
        assert!(matches!(parse_reply(&[1, 2, 1, 0, 0, -3, 0, 0, 5, 4, 0, 0], 1), Err(CounterStoreError::Protocol(_))));
    }

    #[test]
    fn a_reply_is_read_into_decisions_and_the_redis_time() {
        let reply = parse_reply(&[7, 5, 0, 3, 1, 2, 0, 2, 5, 0, 900, -1], 1).unwrap();

        assert_eq!((reply.at, reply.admitted, reply.granted), (Nanos(7_000_005_000), false, 3));
        assert_eq!((reply.duplicate, reply.forgiven, reply.refill_after), (true, 2, Nanos::ZERO));
        assert_eq!(reply.decisions[0].verdict, Verdict::Rejected { retry_after: Nanos::MAX });
        assert_eq!((reply.decisions[0].limit, reply.decisions[0].reset_after), (5, Nanos(900)));
    }

    #[test]
    fn a_lease_reply_carries_the_wait_until_its_minimum_is_back_with_minus_one_for_never() {
        let soon = parse_reply(&[7, 5, 1, 2, 0, 0, 1_500_000_000, 0, 5, 0, 4_500_000_000, 0], 1).unwrap();
        let never = parse_reply(&[7, 5, 1, 2, 0, 0, -1, 0, 5, 0, 4_500_000_000, 0], 1).unwrap();

        assert_eq!((soon.granted, soon.refill_after), (2, Nanos(1_500_000_000)));
        assert_eq!(never.refill_after, Nanos::MAX);
    }
}
