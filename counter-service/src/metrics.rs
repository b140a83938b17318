//! What the service counts, and how `GET /metrics` shows it: prometheus-client metrics
//! in one registry, encoded in the Prometheus text format (version 0.0.4).
//!
//! Every label set is fixed (outcomes, error kinds, status codes, the store's name) and
//! every series is created at start, so the number of series never depends on traffic
//! or on client identities, a series that never moved is shown at 0, and a family's
//! series come in the same order in every render (a `Fixed` family). Recording is one
//! relaxed atomic increment per counter through the series' handle, taken at start: a
//! request never looks a label set up or takes a lock. The store latency histogram is
//! `Latency`, whose buckets are atomics too (prometheus-client's own histogram locks a
//! mutex per observation).
//!
//! What the store holds (keys, charge and credit ids, Redis connections) is read when `/metrics`
//! is rendered, not counted as it changes.

pub mod rls;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelValue, EncodeMetric, MetricEncoder, NoLabelSet, prometheus_text};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::gauge::{ConstGauge, Gauge};
use prometheus_client::metrics::{MetricType, TypedMetric};
use prometheus_client::registry::Registry;

use crate::overrides::OverrideKind;
use crate::store::{CounterStore, CounterStoreError};

/// The prefix of every metric's name.
const PREFIX: &str = "sluice_counter";
/// Upper bounds (seconds) of the store latency histogram.
const LATENCY_BUCKETS: [f64; 13] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
const ERROR_KINDS: [&str; 5] = ["timeout", "connection", "full", "server", "protocol"];
/// The statuses counted by value; any other is counted as `0`, the last.
const STATUSES: [u16; 14] = [200, 400, 401, 404, 405, 408, 413, 500, 503, 429, 201, 204, 409, 0];

/// All metrics of one service instance.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    admitted: Counter,
    rejected: Counter,
    leases_granted: Counter,
    leases_empty: Counter,
    tokens_leased: Counter,
    charges: Counter,
    tokens_charged: Counter,
    tokens_forgiven: Counter,
    duplicate_charges: Counter,
    credits: Counter,
    tokens_credited: Counter,
    credit_tokens_forgiven: Counter,
    duplicate_credits: Counter,
    carry_forgiven: Counter,
    policies_known: Gauge,
    policies_forgotten: Counter,
    policies_unlearned: Counter,
    store_errors: [Counter; ERROR_KINDS.len()],
    store_latency: Latency,
    in_flight: Gauge,
    reading: Gauge,
    shed: Counter,
    unauthorized: Counter,
    refused_connections: Counter,
    open_connections: Gauge,
    responses: [Counter; STATUSES.len()],
    overrides_set: [Counter; OverrideKind::ALL.len()],
    overrides_removed: Counter,
    overrides_expired: Counter,
    overrides_active: Gauge,
    overridden: [Counter; OverrideKind::ALL.len()],
    rls: rls::RlsMetrics,
}

/// A family whose label values are fixed: its series exist from the start and are
/// encoded in the order given (prometheus-client's `Family` keeps them in a hash map, so
/// its order changes from one instance to the next). Recorded through the handles
/// [`fixed`] returns, never looked up.
#[derive(Debug)]
struct Fixed<L, M, const N: usize> {
    key: &'static str,
    series: [(L, M); N],
}

/// A [`Fixed`] family, to register, and its series' handles, to record with.
fn fixed<L: Copy, M: Clone + Default, const N: usize>(key: &'static str, values: [L; N]) -> (Fixed<L, M, N>, [M; N]) {
    let series = values.map(|value| (value, M::default()));
    let handles = series.each_ref().map(|(_, metric)| metric.clone());
    (Fixed { key, series }, handles)
}

impl<L: EncodeLabelValue + Copy, M: EncodeMetric + TypedMetric, const N: usize> TypedMetric for Fixed<L, M, N> {
    const TYPE: MetricType = M::TYPE;
}

impl<L: EncodeLabelValue + Copy, M: EncodeMetric + TypedMetric, const N: usize> EncodeMetric for Fixed<L, M, N> {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (value, metric) in &self.series {
            let label = [(self.key, *value)];
            metric.encode(encoder.encode_family(&label)?)?;
        }
        Ok(())
    }

    fn metric_type(&self) -> MetricType {
        M::TYPE
    }
}

impl Metrics {
    /// The metrics of a service whose store is called `store` (its latency's label).
    pub fn new(store: &'static str) -> Self {
        let mut registry = Registry::with_prefix(PREFIX);
        let counter = |registry: &mut Registry, name: &str, help: &str| {
            let counter = Counter::default();
            registry.register(name, help, counter.clone());
            counter
        };
        let gauge = |registry: &mut Registry, name: &str, help: &str| {
            let gauge = Gauge::default();
            registry.register(name, help, gauge.clone());
            gauge
        };

        let (decisions, [admitted, rejected]) = fixed("outcome", ["admitted", "rejected"]);
        registry.register("decisions", "Checks decided, by outcome", decisions);
        let (leases, [leases_granted, leases_empty]) = fixed("outcome", ["granted", "empty"]);
        registry.register("leases", "Leases answered, by outcome", leases);
        let tokens_leased = counter(&mut registry, "leased_tokens", "Tokens granted through leases");
        let charges = counter(&mut registry, "charges", "Charges answered (admissions reported afterwards)");
        let tokens_charged = counter(&mut registry, "charged_tokens", "Units spent by charges");
        let tokens_forgiven =
            counter(&mut registry, "forgiven_tokens", "Units of charges dropped because they exceeded max_debt");
        let duplicate_charges = counter(
            &mut registry,
            "duplicate_charges",
            "Charges whose id had been applied already: answered again, not applied",
        );
        let credits = counter(&mut registry, "credits", "Credits answered (units an estimate spent and left unused)");
        let tokens_credited = counter(&mut registry, "credited_tokens", "Units given back by credits");
        let credit_tokens_forgiven = counter(
            &mut registry,
            "credit_forgiven_tokens",
            "Units of credits with nothing to give them back to (a full bucket, a window gone)",
        );
        let duplicate_credits = counter(
            &mut registry,
            "duplicate_credits",
            "Credits whose id had been applied already: answered again, not applied",
        );
        let carry_forgiven = counter(
            &mut registry,
            "carry_forgiven_tokens",
            "Units of debt a counter carried over to other numbers (a policy changed without a version bump) \
             could not keep: more than the new capacity below empty",
        );
        let policies_known =
            gauge(&mut registry, "policies_known", "Policy names this instance remembers (to validate overrides)");
        let policies_forgotten = counter(
            &mut registry,
            "policies_forgotten",
            "Policy names forgotten after no request named them for a while, to make room for new ones",
        );
        let policies_unlearned = counter(
            &mut registry,
            "policies_unlearned",
            "Requests naming a new policy that was not learned: the table of names was full of recent ones",
        );
        let (latency, [store_latency]) = fixed("store", [store]);
        registry.register("store_latency_seconds", "Latency of store calls", latency);
        let (errors, store_errors) = fixed("kind", ERROR_KINDS);
        registry.register("store_errors", "Store calls that failed, by kind", errors);
        let in_flight = gauge(&mut registry, "in_flight_requests", "Requests being served");
        let reading =
            gauge(&mut registry, "reading_requests", "Requests whose headers are in and whose body is still arriving");
        let shed = counter(&mut registry, "shed_requests", "Requests refused because too many were in flight");
        let unauthorized =
            counter(&mut registry, "unauthorized", "Requests refused for lack of the right bearer token");
        let open_connections = gauge(&mut registry, "open_connections", "Client connections open");
        let refused_connections =
            counter(&mut registry, "refused_connections", "Connections closed because too many were open");
        let (statuses, responses) = fixed("status", STATUSES);
        registry.register("responses", "Responses by HTTP status (0 = other)", statuses);
        let (set, overrides_set) = fixed("kind", OverrideKind::ALL.map(OverrideKind::name));
        registry.register("overrides_set", "Operator overrides set, by kind", set);
        let overrides_removed = counter(&mut registry, "overrides_removed", "Operator overrides removed before expiry");
        let overrides_expired =
            counter(&mut registry, "overrides_expired", "Operator overrides that expired (found by a sweep)");
        let (family, overridden) = fixed("kind", OverrideKind::ALL.map(OverrideKind::name));
        registry.register(
            "overridden_entries",
            "Entries of checks, leases, charges and credits decided under an operator override, by kind",
            family,
        );
        let overrides_active = gauge(
            &mut registry,
            "overrides_active",
            "Operator overrides live, as this instance last saw (set, removal, list or sweep)",
        );
        let rls = rls::RlsMetrics::new(&mut registry);

        Self {
            registry,
            admitted,
            rejected,
            leases_granted,
            leases_empty,
            tokens_leased,
            charges,
            tokens_charged,
            tokens_forgiven,
            duplicate_charges,
            credits,
            tokens_credited,
            credit_tokens_forgiven,
            duplicate_credits,
            carry_forgiven,
            policies_known,
            policies_forgotten,
            policies_unlearned,
            store_errors,
            store_latency,
            in_flight,
            reading,
            shed,
            unauthorized,
            refused_connections,
            open_connections,
            responses,
            overrides_set,
            overrides_removed,
            overrides_expired,
            overrides_active,
            overridden,
            rls,
        }
    }

    /// The RLS front door's metrics.
    pub const fn rls(&self) -> &rls::RlsMetrics {
        &self.rls
    }

    /// Counts an entry decided under an override of `kind`.
    pub fn overridden(&self, kind: OverrideKind) {
        if let Some(i) = OverrideKind::ALL.iter().position(|k| *k == kind)
            && let Some(counter) = self.overridden.get(i)
        {
            counter.inc();
        }
    }

    /// Counts an override set, with the live overrides after it.
    pub fn override_set(&self, kind: OverrideKind, active: usize) {
        if let Some(i) = OverrideKind::ALL.iter().position(|k| *k == kind)
            && let Some(counter) = self.overrides_set.get(i)
        {
            counter.inc();
        }
        self.overrides_active(active);
    }

    /// Counts an override removed.
    pub fn override_removed(&self) {
        self.overrides_removed.inc();
        if self.overrides_active.get() > 0 {
            self.overrides_active.dec();
        }
    }

    /// Counts `expired` overrides found expired, with the live ones left.
    pub fn overrides_expired(&self, expired: usize, active: usize) {
        self.overrides_expired.inc_by(expired as u64);
        self.overrides_active(active);
    }

    /// Sets the gauge of live overrides.
    pub fn overrides_active(&self, active: usize) {
        self.overrides_active.set(i64::try_from(active).unwrap_or(i64::MAX));
    }

    /// Counts one check's outcome.
    pub fn decision(&self, admitted: bool) {
        let counter = if admitted { &self.admitted } else { &self.rejected };
        counter.inc();
    }

    /// Counts one lease.
    pub fn lease(&self, granted: u64) {
        let counter = if granted > 0 { &self.leases_granted } else { &self.leases_empty };
        counter.inc();
        self.tokens_leased.inc_by(granted);
    }

    /// Counts one charge: the units spent and the units forgiven.
    pub fn charge(&self, charged: u64, forgiven: u64) {
        self.charges.inc();
        self.tokens_charged.inc_by(charged);
        self.tokens_forgiven.inc_by(forgiven);
    }

    /// Counts a charge whose id had been applied already (answered, not applied again).
    pub fn duplicate_charge(&self) {
        self.duplicate_charges.inc();
    }

    /// Counts one credit: the units given back and the units forgiven.
    pub fn credit(&self, credited: u64, forgiven: u64) {
        self.credits.inc();
        self.tokens_credited.inc_by(credited);
        self.credit_tokens_forgiven.inc_by(forgiven);
    }

    /// Counts a credit whose id had been applied already (answered, not applied again).
    pub fn duplicate_credit(&self) {
        self.duplicate_credits.inc();
    }

    /// Counts units of debt a carry-over to other numbers could not keep.
    pub fn carried_forgiven(&self, units: u64) {
        if units > 0 {
            self.carry_forgiven.inc_by(units);
        }
    }

    /// Records what the table of policy names did: how many it holds now, how many it
    /// forgot, how many new names it could not learn.
    pub fn policies(&self, known: usize, forgotten: usize, unlearned: usize) {
        self.policies_known.set(i64::try_from(known).unwrap_or(i64::MAX));
        self.policies_forgotten.inc_by(forgotten as u64);
        self.policies_unlearned.inc_by(unlearned as u64);
    }

    /// Records one store call's latency.
    pub fn store_latency(&self, took: Duration) {
        self.store_latency.observe(took);
    }

    /// Counts one store error by kind.
    pub fn store_error(&self, error: &CounterStoreError) {
        if let Some(i) = ERROR_KINDS.iter().position(|k| *k == error.kind())
            && let Some(counter) = self.store_errors.get(i)
        {
            counter.inc();
        }
    }

    /// Counts one response by status.
    pub fn response(&self, status: u16) {
        let i = STATUSES.iter().position(|s| *s == status).unwrap_or(STATUSES.len() - 1);
        if let Some(counter) = self.responses.get(i) {
            counter.inc();
        }
    }

    /// Counts a request refused because too many were in flight.
    pub fn shed(&self) {
        self.shed.inc();
    }

    /// Counts a request refused for lack of the right bearer token.
    pub fn unauthorized(&self) {
        self.unauthorized.inc();
    }

    /// Counts a connection closed at once because too many were open.
    pub fn refused_connection(&self) {
        self.refused_connections.inc();
    }

    /// Counts a connection opened (+1) or closed (-1).
    pub fn connection(&self, delta: i64) {
        self.open_connections.inc_by(delta);
    }

    /// Marks a request as started; the guard marks it finished when dropped.
    pub fn start(&self) -> InFlight<'_> {
        self.in_flight.inc();
        InFlight(self)
    }

    /// Marks a request whose body is being read; the guard marks it read when dropped.
    pub fn reading(&self) -> Reading<'_> {
        self.reading.inc();
        Reading(self)
    }

    /// Renders everything in the Prometheus text format, with what `store` holds now.
    pub fn render(&self, store: &CounterStore) -> String {
        let mut out = String::with_capacity(4096);
        let mut held = Registry::with_prefix(PREFIX);
        match store {
            CounterStore::Memory(m) => {
                held.register("memory_keys", "Keys held by the memory store", ConstGauge::new(m.len()));
                held.register(
                    "memory_charge_ids",
                    "Charge and credit ids the memory store remembers",
                    ConstGauge::new(m.charge_ids()),
                );
            }
            CounterStore::Redis(r) => {
                let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
                held.register("redis_connections", "Connections held by the pool", ConstGauge::new(get(&r.stats.open)));
                held.register(
                    "redis_connects",
                    "Connections opened since start",
                    ConstCounter::new(get(&r.stats.connects)),
                );
                held.register(
                    "redis_script_reloads",
                    "NOSCRIPT answers that fell back to EVAL",
                    ConstCounter::new(get(&r.stats.script_reloads)),
                );
            }
        }
        // Writing into a String cannot fail.
        let _ = prometheus_text::encode(&mut out, &self.registry);
        let _ = prometheus_text::encode(&mut out, &held);
        out
    }
}

/// A latency histogram with [`LATENCY_BUCKETS`], recorded with atomic increments: one
/// bucket (the first whose bound the observation is within; none above the last),
/// the count and the sum. The encoder accumulates the buckets and adds `+Inf` (the
/// count).
#[derive(Clone, Debug, Default)]
struct Latency(Arc<LatencyCounts>);

#[derive(Debug, Default)]
struct LatencyCounts {
    buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

impl Latency {
    /// Records one observation.
    fn observe(&self, took: Duration) {
        let counts = &*self.0;
        let secs = took.as_secs_f64();
        if let Some(bucket) =
            LATENCY_BUCKETS.iter().zip(&counts.buckets).find(|(bound, _)| secs <= **bound).map(|(_, b)| b)
        {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        counts.count.fetch_add(1, Ordering::Relaxed);
        counts.sum_ns.fetch_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }
}

impl TypedMetric for Latency {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for Latency {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        let counts = &*self.0;
        let mut buckets = [(0.0, 0); LATENCY_BUCKETS.len()];
        for ((bucket, bound), n) in buckets.iter_mut().zip(LATENCY_BUCKETS).zip(&counts.buckets) {
            *bucket = (bound, n.load(Ordering::Relaxed));
        }
        let count = counts.count.load(Ordering::Relaxed);
        let sum = counts.sum_ns.load(Ordering::Relaxed) as f64 / 1e9;
        encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
    }

    fn metric_type(&self) -> MetricType {
        Self::TYPE
    }
}

/// Decrements the in-flight gauge when dropped.
#[derive(Debug)]
pub struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.dec();
    }
}

/// Decrements the gauge of requests being read when dropped.
#[derive(Debug)]
pub struct Reading<'a>(&'a Metrics);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.reading.dec();
    }
}
