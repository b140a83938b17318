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

use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::encoding::{EncodeLabelValue, EncodeMetric, MetricEncoder, NoLabelSet, prometheus_text};
use prometheus_client::metrics::counter::{ConstCounter, Counter};
use prometheus_client::metrics::family::Family;
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
/// What a store call was for: the `op` label of its latency.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreOp {
    /// A check (`/v1/check`, one check of `/v1/checks`, an RLS descriptor).
    Check,
    /// A lease.
    Lease,
    /// A charge.
    Charge,
    /// A credit.
    Credit,
    /// Overrides and readiness: the operators' calls.
    Admin,
}

impl StoreOp {
    const ALL: [Self; 5] = [Self::Check, Self::Lease, Self::Charge, Self::Credit, Self::Admin];

    const fn name(self) -> &'static str {
        match self {
            Self::Check => "check",
            Self::Lease => "lease",
            Self::Charge => "charge",
            Self::Credit => "credit",
            Self::Admin => "admin",
        }
    }
}
/// Most distinct `policy` values of the per-policy decisions: a proxy names its
/// policies, so past this many new names are counted under [`OVERFLOW_POLICY`] and no
/// caller can grow the metrics without bound.
pub const MAX_POLICY_SERIES: usize = 1024;
/// The `policy` label of what comes past [`MAX_POLICY_SERIES`].
pub const OVERFLOW_POLICY: &str = "_overflow";
/// The `policy` label of an entry whose request named no policy.
pub const UNNAMED_POLICY: &str = "_unnamed";
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
    store_latency: [Latency; StoreOp::ALL.len()],
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
    overrides_soonest_expiry: Gauge,
    overridden: [Counter; OverrideKind::ALL.len()],
    policy_decisions: Family<Vec<(&'static str, String)>, Counter>,
    policy_names: Bounded,
    rls: rls::RlsMetrics,
}

/// Label values that callers name (policies, RLS rules), at most `max` of them: past
/// that, a new one is `overflow`, so that no caller grows the metrics without bound.
#[derive(Debug)]
struct Bounded {
    seen: Mutex<HashSet<String>>,
    max: usize,
    overflow: &'static str,
}

impl Bounded {
    fn new(max: usize, overflow: &'static str) -> Self {
        Self { seen: Mutex::new(HashSet::new()), max, overflow }
    }

    /// The label value for `name`: itself while there is room (or it has one already).
    fn value(&self, name: &str) -> String {
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if seen.contains(name) {
            name.to_owned()
        } else if seen.len() < self.max {
            seen.insert(name.to_owned());
            name.to_owned()
        } else {
            self.overflow.to_owned()
        }
    }
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
        let latency = StoreLatency { store, series: StoreOp::ALL.map(|op| (op.name(), Latency::default())) };
        let store_latency = latency.series.each_ref().map(|(_, l)| l.clone());
        registry.register("store_latency_seconds", "Latency of store calls, by what they were for", latency);
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
        let overrides_soonest_expiry = gauge(
            &mut registry,
            "overrides_soonest_expiry_timestamp_seconds",
            "Unix time the soonest-expiring live override expires, as this instance last applied them (0: none)",
        );
        let policy_decisions = Family::<Vec<(&'static str, String)>, Counter>::default();
        registry.register(
            "policy_decisions",
            "Entries of checks decided, by the policy the proxy named and the check's outcome (all or nothing)",
            policy_decisions.clone(),
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
            overrides_soonest_expiry,
            overridden,
            policy_decisions,
            policy_names: Bounded::new(MAX_POLICY_SERIES, OVERFLOW_POLICY),
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

    /// Sets when the soonest live override expires (`None`: no override is live), in
    /// whole seconds rounded down, so an alert on "expires within N minutes" is never late.
    pub fn overrides_soonest_expiry(&self, expires_at_ms: Option<u64>) {
        let seconds = expires_at_ms.map_or(0, |ms| ms / 1000);
        self.overrides_soonest_expiry.set(i64::try_from(seconds).unwrap_or(i64::MAX));
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

    /// Counts one entry of a check under the policy its request named (`None`: it named
    /// none), with the check's outcome: every entry of a check is admitted or none is.
    pub fn policy_decision(&self, policy: Option<&str>, admitted: bool) {
        let policy = policy.map_or_else(|| UNNAMED_POLICY.to_owned(), |name| self.policy_names.value(name));
        let outcome = if admitted { "admitted" } else { "rejected" };
        self.policy_decisions.get_or_create(&vec![("policy", policy), ("outcome", outcome.to_owned())]).inc();
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
    pub fn store_latency(&self, op: StoreOp, took: Duration) {
        if let Some(latency) = self.store_latency.get(op as usize) {
            latency.observe(took);
        }
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

/// The store latency family: a [`Latency`] per [`StoreOp`], labelled with the store's
/// name and the op (`{store="redis",op="check"}`), every series there from the start.
#[derive(Debug)]
struct StoreLatency {
    store: &'static str,
    series: [(&'static str, Latency); StoreOp::ALL.len()],
}

impl TypedMetric for StoreLatency {
    const TYPE: MetricType = MetricType::Histogram;
}

impl EncodeMetric for StoreLatency {
    fn encode(&self, mut encoder: MetricEncoder) -> Result<(), std::fmt::Error> {
        for (op, latency) in &self.series {
            let labels = [("store", self.store), ("op", *op)];
            latency.encode(encoder.encode_family(&labels)?)?;
        }
        Ok(())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryConfig, MemoryCounters};

    fn rendered(metrics: &Metrics) -> String {
        metrics.render(&CounterStore::Memory(MemoryCounters::new(MemoryConfig::default())))
    }

    #[test]
    fn per_policy_decisions_keep_at_most_their_bound_of_names_then_count_the_rest_as_overflow() {
        let metrics = Metrics::new("memory");
        for i in 0..MAX_POLICY_SERIES {
            metrics.policy_decision(Some(&format!("p{i}")), true);
        }
        metrics.policy_decision(Some("one-too-many"), false);
        metrics.policy_decision(Some("another"), false);
        metrics.policy_decision(Some("p0"), false);
        metrics.policy_decision(None, true);
        let text = rendered(&metrics);

        let line = |l: &str| text.lines().any(|x| x == l);
        assert!(line(r#"sluice_counter_policy_decisions_total{policy="_overflow",outcome="rejected"} 2"#), "{text}");
        assert!(line(r#"sluice_counter_policy_decisions_total{policy="p0",outcome="rejected"} 1"#));
        assert!(line(r#"sluice_counter_policy_decisions_total{policy="_unnamed",outcome="admitted"} 1"#));
        assert!(!text.contains("one-too-many"));
        let series = text.lines().filter(|l| l.starts_with("sluice_counter_policy_decisions_total{")).count();
        assert_eq!(series, MAX_POLICY_SERIES + 3, "every name, p0 rejected, overflow and unnamed");
    }
}
