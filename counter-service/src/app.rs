//! What every request is served with: [`App`] (the store, the metrics, the caller check,
//! the bounds), and how the configured store is built.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use tokio::sync::Semaphore;

use crate::api::ApiError;
use crate::auth::Auth;
use crate::call::Call;
use crate::config::{AdminAccess, Config, StoreKind};
use crate::enforce::{Enforced, OverrideSet};
use crate::metrics::Metrics;
use crate::metrics::StoreOp;
use crate::overrides::Override;
use crate::policies::KnownPolicies;
use crate::store::{CounterStore, CounterStoreError, MemoryCounters, RedisCounters};
use sluice_protocol::ErrorCode;

/// The overrides an instance applies: the set, the ticket of the read that found it, and
/// the store's overrides version then.
#[derive(Debug, Default)]
struct Snapshot {
    ticket: u64,
    version: Option<u64>,
    snapshot: Arc<OverrideSet>,
}

/// Everything a request handler needs.
#[derive(Debug)]
pub struct App {
    store: CounterStore,
    metrics: Metrics,
    auth: Auth,
    /// Who may call the admin API; `None`: it is not served.
    admin: Option<Auth>,
    /// The filters' global hash key, for keyed overrides.
    hash_key: Option<shared_store::HashKey>,
    /// The live overrides, as this instance last read them ([`crate::enforce`]).
    overrides: std::sync::RwLock<Snapshot>,
    /// Tickets handed to reads of the overrides, in the order they began.
    override_reads: AtomicU64,
    /// The policies requests have named, for validating overrides.
    known: KnownPolicies,
    /// Whether this instance has seen an override (its sweeper then looks for expired
    /// ones on Redis).
    pub(crate) overrides_seen: std::sync::atomic::AtomicBool,
    max_entries: usize,
    max_body: usize,
    request_timeout: Duration,
    in_flight: Arc<Semaphore>,
    connections: Arc<Semaphore>,
    /// Seconds since start at which a store error was last logged (one line per second
    /// at most, so an outage does not flood the logs).
    last_error_log: AtomicU64,
    started: Instant,
}

impl App {
    /// An app serving `store` with `config`'s bounds, to the callers `auth` admits
    /// ([`Config::auth`] reads them from the configuration).
    pub fn new(store: CounterStore, config: &Config, auth: Auth) -> Self {
        Self {
            metrics: Metrics::new(store.name()),
            store,
            auth,
            admin: None,
            hash_key: None,
            overrides_seen: std::sync::atomic::AtomicBool::new(false),
            overrides: std::sync::RwLock::default(),
            override_reads: AtomicU64::new(0),
            known: KnownPolicies::default(),
            max_entries: usize::from(config.max_entries),
            max_body: usize::try_from(config.max_body_bytes).unwrap_or(usize::MAX),
            request_timeout: Duration::from_millis(config.request_timeout_ms),
            in_flight: Arc::new(Semaphore::new(usize::try_from(config.max_in_flight).unwrap_or(1024))),
            connections: Arc::new(Semaphore::new(usize::try_from(config.max_connections).unwrap_or(4096))),
            last_error_log: AtomicU64::new(u64::MAX),
            started: Instant::now(),
        }
    }

    /// The same app, serving the admin API with `access` ([`Config::admin`] reads it):
    /// without an admin token, the admin API answers `404 admin_disabled`.
    #[must_use]
    pub fn with_admin(mut self, access: AdminAccess) -> Self {
        self.admin = access.token.map(Auth::Bearer);
        self.hash_key = access.hash_key;
        self
    }

    /// The filters' global hash key, when configured.
    pub(crate) fn hash_key(&self) -> Option<&shared_store::HashKey> {
        self.hash_key.as_ref()
    }

    /// Whether the admin API is served, for the startup log line.
    pub const fn admin_enabled(&self) -> bool {
        self.admin.is_some()
    }

    /// The store.
    pub fn store(&self) -> &CounterStore {
        &self.store
    }

    /// The metrics.
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// The policies requests have named, with their limits.
    pub fn known_policies(&self) -> &KnownPolicies {
        &self.known
    }

    /// Learns the policies `call` names, and applies the live overrides to it.
    pub fn enforce(&self, call: &Call) -> Enforced {
        let now_ms = self.store.now_ms();
        let learned = self.known.learn(call.entries(), now_ms);
        self.metrics.policies(learned.known, learned.forgotten, learned.unlearned);
        let set = self
            .overrides
            .read()
            .map_or_else(|poisoned| poisoned.into_inner().snapshot.clone(), |o| o.snapshot.clone());
        if set.is_empty() {
            return Enforced::default();
        }
        let enforced = Enforced::new(call, &set, now_ms);
        for (_, applied) in enforced.all_applied() {
            self.metrics.overridden(applied.kind);
        }
        enforced
    }

    /// A ticket for a read of the overrides about to start: reads are applied in the
    /// order they started ([`App::apply_overrides`]).
    pub(crate) fn overrides_ticket(&self) -> u64 {
        self.override_reads.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// Replaces the overrides this instance applies with `live`, read with `ticket` (from
    /// [`App::overrides_ticket`], taken before the read began) at the store's overrides
    /// `version` (`None`: the store keeps none), unless a read that began later was
    /// applied already: a slow read that began before an override was set or removed can
    /// never undo what a later read applied. Returns whether it was applied.
    pub(crate) fn apply_overrides(&self, ticket: u64, version: Option<u64>, live: Vec<Override>) -> bool {
        let mut current = self.overrides.write().unwrap_or_else(std::sync::PoisonError::into_inner);
        if ticket < current.ticket {
            return false;
        }
        self.metrics().overrides_soonest_expiry(live.iter().map(|o| o.expires_at_ms).min());
        *current = Snapshot { ticket, version, snapshot: Arc::new(OverrideSet::new(live)) };
        true
    }

    /// The store's overrides version the applied snapshot was read at.
    pub(crate) fn applied_overrides_version(&self) -> Option<u64> {
        self.overrides.read().unwrap_or_else(std::sync::PoisonError::into_inner).version
    }

    /// How callers are authenticated, for the startup log line: `bearer` or `none`.
    pub const fn auth_name(&self) -> &'static str {
        if self.auth.is_required() { "bearer" } else { "none" }
    }

    pub(crate) fn max_entries(&self) -> usize {
        self.max_entries
    }

    pub(crate) fn max_body(&self) -> usize {
        self.max_body
    }

    /// How long a request's body may take to arrive after its headers.
    pub(crate) fn request_timeout(&self) -> Duration {
        self.request_timeout
    }

    /// One of the `--max-connections` slots, or `None` when every one is taken.
    pub(crate) fn connection_permit(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        self.connections.clone().try_acquire_owned().ok()
    }

    /// Whether a request with these `authorization` header values may proceed; a
    /// refusal is logged (at `debug`) and counted.
    pub(crate) fn authenticate<'a>(&self, values: impl Iterator<Item = &'a [u8]>) -> Result<(), ApiError> {
        self.auth.check_values(values).map_err(|refusal| {
            tracing::debug!(%refusal, "caller refused");
            self.metrics.unauthorized();
            ApiError { status: 401, code: ErrorCode::Unauthorized, message: refusal.to_string() }
        })
    }

    /// Whether a request to the admin API with these `authorization` header values may
    /// proceed: only with the admin token (never the proxies' one, which must differ).
    /// A refusal is logged (at `debug`) and counted; without an admin token configured,
    /// the admin API is `404 admin_disabled`.
    pub(crate) fn authenticate_admin<'a>(&self, values: impl Iterator<Item = &'a [u8]>) -> Result<(), ApiError> {
        let Some(admin) = &self.admin else {
            return Err(ApiError {
                status: 404,
                code: ErrorCode::AdminDisabled,
                message: "the admin API is not enabled: start the service with --admin-token-env".to_owned(),
            });
        };
        admin.check_values(values).map_err(|refusal| {
            tracing::debug!(%refusal, "admin caller refused");
            self.metrics.unauthorized();
            ApiError {
                status: 401,
                code: ErrorCode::AdminUnauthorized,
                message: format!(
                    "{refusal} (the admin API takes the admin token, --admin-token-env, never the proxies' token)"
                ),
            }
        })
    }

    /// One of the `--max-in-flight` permits, or `503 overloaded` (counted) at once.
    pub(crate) fn in_flight_permit(&self) -> Result<tokio::sync::OwnedSemaphorePermit, ApiError> {
        self.in_flight.clone().try_acquire_owned().map_err(|_| {
            self.metrics.shed();
            ApiError {
                status: 503,
                code: ErrorCode::Overloaded,
                message: "too many requests in flight; retry later or add instances".to_owned(),
            }
        })
    }

    fn log_store_error(&self, error: &CounterStoreError) {
        let now = self.started.elapsed().as_secs();
        let last = self.last_error_log.swap(now, Ordering::Relaxed);
        if last != now {
            tracing::warn!(store = self.store.name(), kind = error.kind(), %error, "store call failed");
        }
    }

    /// Awaits an operator's store call (overrides, readiness) and accounts for it as
    /// [`App::stored`] does.
    pub(crate) async fn timed<T>(
        &self,
        call: impl Future<Output = Result<T, CounterStoreError>>,
    ) -> Result<T, ApiError> {
        let start = Instant::now();
        let result = call.await;
        self.stored(StoreOp::Admin, start.elapsed(), result)
    }

    /// Records a store call's latency (by what it was for), and its error (metric,
    /// rate-limited log line): a store that could not decide is a 503.
    pub(crate) fn stored<T>(
        &self,
        op: StoreOp,
        took: Duration,
        result: Result<T, CounterStoreError>,
    ) -> Result<T, ApiError> {
        self.metrics.store_latency(op, took);
        result.map_err(|error| {
            self.metrics.store_error(&error);
            self.log_store_error(&error);
            ApiError { status: 503, code: error.code(), message: error.to_string() }
        })
    }
}

/// Builds the configured store and runs its startup checks (Redis: reachability and
/// the eviction policy; both only warn, so the service starts while Redis is down and
/// `/readyz` tells when it is usable).
///
/// # Errors
/// When the Redis URLs do not parse.
pub async fn build_store(config: &Config) -> anyhow::Result<CounterStore> {
    match config.store {
        StoreKind::Memory => Ok(CounterStore::Memory(MemoryCounters::new(config.memory()))),
        StoreKind::Redis | StoreKind::RedisCluster => {
            let redis = RedisCounters::new(config.redis()).map_err(|e| anyhow::anyhow!("redis store: {e}"))?;
            for check in redis.eviction_checks().await {
                match &check.policy {
                    Ok(policy) if check.evicts() => tracing::warn!(
                        node = %check.node,
                        policy = %policy,
                        "redis may evict limiter keys under memory pressure, which silently resets limits; \
                         set maxmemory-policy noeviction on a Redis dedicated to sluice"
                    ),
                    Ok(policy) => tracing::info!(node = %check.node, policy = %policy, "redis eviction policy"),
                    Err(reason) => {
                        tracing::warn!(node = %check.node, %reason, "cannot read redis maxmemory-policy")
                    }
                }
            }
            if let Err(e) = redis.ping().await {
                tracing::warn!(error = %e, "redis is not reachable yet; /readyz fails until it is");
            }
            Ok(CounterStore::Redis(Box::new(redis)))
        }
    }
}
