//! How the Redis store reaches Redis: a bounded pool of lazily opened connections (or a
//! cluster client), one connection attempt per slot at a time, and a deadline per call.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, RedisError, Value};

use super::{RedisConfig, RedisCounters, RedisUrl, Topology};
use crate::store::CounterStoreError;

/// After a failed connection attempt, a slot waits this long before trying again, so
/// that a Redis that is down is not hammered with connection attempts.
const RECONNECT_BACKOFF: Duration = Duration::from_millis(100);

/// A connection: to one server, or to a cluster (which routes each command to the
/// node owning its keys).
#[derive(Clone)]
pub(super) enum Conn {
    Single(MultiplexedConnection),
    Cluster(ClusterConnection),
}

impl Conn {
    pub(super) async fn query(&mut self, cmd: &Cmd) -> Result<Value, RedisError> {
        match self {
            Self::Single(c) => cmd.query_async(c).await,
            Self::Cluster(c) => cmd.query_async(c).await,
        }
    }
}

/// What opens connections.
pub(super) enum Client {
    Single(redis::Client),
    Cluster(Box<redis::cluster::ClusterClient>),
}

/// One of the pool's connections, opened on first use and replaced when it dies.
#[derive(Default)]
pub(super) struct Slot {
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
    /// `size` slots (at least one), none connected yet.
    pub(super) fn pool(size: usize) -> Box<[Self]> {
        (0..size.max(1)).map(|_| Self::default()).collect()
    }

    fn current(&self) -> Option<(u64, Conn)> {
        self.conn.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }
}

impl Client {
    /// The client for `config`'s nodes (every URL parsed first, and refused with its
    /// password hidden).
    pub(super) fn new(config: &RedisConfig) -> Result<Self, CounterStoreError> {
        let bad = |url: &RedisUrl, e: RedisError| CounterStoreError::Server(format!("bad redis url {url}: {e}"));
        for url in &config.urls {
            redis::Client::open(url.expose()).map_err(|e| bad(url, e))?;
        }
        Ok(match config.topology {
            Topology::Standalone => {
                let url = config.urls.first().ok_or_else(|| CounterStoreError::Server("no redis url given".into()))?;
                Self::Single(redis::Client::open(url.expose()).map_err(|e| bad(url, e))?)
            }
            Topology::Cluster => Self::Cluster(Box::new(
                redis::cluster::ClusterClient::builder(config.urls.iter().map(RedisUrl::expose))
                    // Zero retries: a retried script may run twice.
                    .retries(0)
                    .connection_timeout(config.connect_timeout)
                    .response_timeout(config.timeout)
                    .build()
                    .map_err(|e| CounterStoreError::Server(format!("bad redis cluster seed nodes: {e}")))?,
            )),
        })
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
    pub(super) async fn call<T>(
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
}
