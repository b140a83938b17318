//! What a worker sets up from its engine once per configuration: how often its root
//! context ticks, and which metrics it defines (each counter where its declared
//! [`Scope`] says it can move).

use crate::config::Policy;
use crate::engine::Engine;
use crate::host::{Counter, PluginCounter, Scope, Wait};
use crate::series;
use shared_store::{Algorithm, Limit, RENEW_EVERY};

/// The longest tick while requests wait for the counter service: a wait outlives its
/// deadline by at most this (or a quarter of the timeout, if shorter).
pub const MAX_DEADLINE_TICK_MS: u32 = 50;
/// The tick with lease policies: refills go out, and waiting requests are retried, at
/// most this late.
pub const LEASE_TICK_MS: u32 = 10;

/// The tick period the configuration needs, in milliseconds: the shaping tick when a
/// policy shapes, at most a quarter of the callout deadline with global policies, at
/// most [`LEASE_TICK_MS`] with lease policies, at most `RENEW_EVERY` (1 s) with concurrency
/// policies (to renew their slots), at most `metrics_flush` when metrics are
/// kept in the VM; `None` when nothing needs a tick.
pub fn tick_period(engine: &Engine) -> Option<u32> {
    let shaping = engine.policies().any(|p| may_delay(&p.limit));
    let mut tick_ms = shaping.then_some(engine.shaping().tick_ms);
    if let Some(timeout) = engine.callout_timeout().filter(|_| engine.has_global()) {
        let quarter = u32::try_from(timeout.0 / 4_000_000).unwrap_or(MAX_DEADLINE_TICK_MS);
        let deadline_tick = quarter.clamp(1, MAX_DEADLINE_TICK_MS);
        tick_ms = Some(tick_ms.map_or(deadline_tick, |t| t.min(deadline_tick)));
    }
    if engine.has_lease() {
        tick_ms = Some(tick_ms.map_or(LEASE_TICK_MS, |t| t.min(LEASE_TICK_MS)));
    }
    if engine.has_concurrency() {
        let renew = u32::try_from(RENEW_EVERY.as_u64() / 1_000_000).unwrap_or(u32::MAX);
        tick_ms = Some(tick_ms.map_or(renew, |t| t.min(renew)));
    }
    if let Some(flush) = engine.metrics_flush_ms() {
        tick_ms = Some(tick_ms.map_or(flush, |t| t.min(flush)));
    }
    tick_ms
}

/// Whether `limit` may hold a request back (shaping), for the root context to release
/// on its tick.
const fn may_delay(limit: &Limit) -> bool {
    match *limit {
        Limit::LeakyBucket { max_wait, .. } => max_wait.0 > 0,
        Limit::TokenBucket { .. }
        | Limit::FixedWindow { .. }
        | Limit::SlidingWindow { .. }
        | Limit::SlidingLog { .. }
        | Limit::Concurrency { .. } => false,
    }
}

/// A metric to define: its full name and whether it is a gauge.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetricName {
    /// Its labels and family, as [`crate::series::metric_name`] writes them.
    pub name: String,
    /// Whether it goes down as well as up.
    pub gauge: bool,
}

/// Whether `policy` defines the counters of `scope`.
fn defines(policy: &Policy, scope: Scope) -> bool {
    match scope {
        Scope::Every => true,
        Scope::Global => policy.is_global(),
        Scope::Concurrency => Algorithm::of(&policy.limit) == Algorithm::Concurrency,
        Scope::ResponseCost => policy.cost.settled().is_some(),
    }
}

/// The wait histograms a configuration defines, in [`Wait::ALL`] order: the queue's
/// when a policy may delay a request, the service's and the refill's when a policy is
/// global (`None` for a wait nothing it runs can have).
pub fn wait_names(engine: &Engine) -> Vec<Option<MetricName>> {
    let prefix = engine.stat_prefix();
    Wait::ALL
        .iter()
        .map(|w| {
            let waits = match w {
                Wait::Queue => engine.policies().any(|p| may_delay(&p.limit)),
                Wait::Service | Wait::Refill => engine.policies().any(Policy::is_global),
            };
            waits.then(|| MetricName { name: series::wait_metric(prefix, *w), gauge: false })
        })
        .collect()
}

/// The metrics a configuration defines: per policy in [`Counter::ALL`] order, and per
/// plugin in [`PluginCounter::ALL`] order; `None` where a counter cannot move, as its
/// [`Scope`] says (a global counter of a local policy, a response-cost counter of a
/// policy whose cost is known at admission, a service counter without global policies).
pub fn metric_names(engine: &Engine) -> (Vec<Vec<Option<MetricName>>>, Vec<Option<MetricName>>) {
    let prefix = engine.stat_prefix();
    let policies = engine
        .policies()
        .map(|p| {
            Counter::ALL
                .iter()
                .map(|c| {
                    defines(p, c.scope())
                        .then(|| MetricName { name: series::policy_metric(prefix, &p.name, *c), gauge: c.is_gauge() })
                })
                .collect()
        })
        .collect();
    let plugin = PluginCounter::ALL
        .iter()
        .map(|c| {
            engine
                .policies()
                .any(|p| defines(p, c.scope()))
                .then(|| MetricName { name: series::plugin_metric(prefix, *c), gauge: c.is_gauge() })
        })
        .collect();
    (policies, plugin)
}
