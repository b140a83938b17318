//! Prometheus metrics, kept in atomics and rendered as text on `GET /metrics`.
//!
//! Every label set is fixed (outcomes, error kinds, status codes), so the number of
//! series never depends on traffic or on client identities.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::Duration;

use crate::store::{CounterStore, CounterStoreError};

/// Upper bounds (seconds) of the store latency histogram.
const LATENCY_BUCKETS: [f64; 13] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0];
const ERROR_KINDS: [&str; 5] = ["timeout", "connection", "full", "server", "protocol"];
const STATUSES: [u16; 11] = [200, 400, 401, 404, 405, 408, 413, 500, 503, 429, 0];

/// All counters of one service instance.
#[derive(Debug, Default)]
pub struct Metrics {
    admitted: AtomicU64,
    rejected: AtomicU64,
    leases_granted: AtomicU64,
    leases_empty: AtomicU64,
    tokens_leased: AtomicU64,
    charges: AtomicU64,
    tokens_charged: AtomicU64,
    tokens_forgiven: AtomicU64,
    duplicate_charges: AtomicU64,
    store_errors: [AtomicU64; ERROR_KINDS.len()],
    latency_buckets: [AtomicU64; LATENCY_BUCKETS.len()],
    latency_count: AtomicU64,
    latency_sum_ns: AtomicU64,
    in_flight: AtomicI64,
    reading: AtomicI64,
    shed: AtomicU64,
    unauthorized: AtomicU64,
    refused_connections: AtomicU64,
    open_connections: AtomicI64,
    responses: [AtomicU64; STATUSES.len()],
}

impl Metrics {
    /// Counts one check's outcome.
    pub fn decision(&self, admitted: bool) {
        let counter = if admitted { &self.admitted } else { &self.rejected };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts one lease.
    pub fn lease(&self, granted: u64) {
        let counter = if granted > 0 { &self.leases_granted } else { &self.leases_empty };
        counter.fetch_add(1, Ordering::Relaxed);
        self.tokens_leased.fetch_add(granted, Ordering::Relaxed);
    }

    /// Counts one charge: the units spent and the units forgiven.
    pub fn charge(&self, charged: u64, forgiven: u64) {
        self.charges.fetch_add(1, Ordering::Relaxed);
        self.tokens_charged.fetch_add(charged, Ordering::Relaxed);
        self.tokens_forgiven.fetch_add(forgiven, Ordering::Relaxed);
    }

    /// Counts a charge whose id had been applied already (answered, not applied again).
    pub fn duplicate_charge(&self) {
        self.duplicate_charges.fetch_add(1, Ordering::Relaxed);
    }

    /// Records one store call's latency.
    pub fn store_latency(&self, took: Duration) {
        let secs = took.as_secs_f64();
        // One bucket per observation; `render` accumulates them.
        if let Some(bucket) =
            LATENCY_BUCKETS.iter().zip(&self.latency_buckets).find(|(bound, _)| secs <= **bound).map(|(_, b)| b)
        {
            bucket.fetch_add(1, Ordering::Relaxed);
        }
        self.latency_count.fetch_add(1, Ordering::Relaxed);
        self.latency_sum_ns.fetch_add(u64::try_from(took.as_nanos()).unwrap_or(u64::MAX), Ordering::Relaxed);
    }

    /// Counts one store error by kind.
    pub fn store_error(&self, error: &CounterStoreError) {
        if let Some(i) = ERROR_KINDS.iter().position(|k| *k == error.kind())
            && let Some(counter) = self.store_errors.get(i)
        {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts one response by status.
    pub fn response(&self, status: u16) {
        let i = STATUSES.iter().position(|s| *s == status).unwrap_or(STATUSES.len() - 1);
        if let Some(counter) = self.responses.get(i) {
            counter.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Counts a request refused because too many were in flight.
    pub fn shed(&self) {
        self.shed.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a request refused for lack of the right bearer token.
    pub fn unauthorized(&self) {
        self.unauthorized.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection closed at once because too many were open.
    pub fn refused_connection(&self) {
        self.refused_connections.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a connection opened (+1) or closed (-1).
    pub fn connection(&self, delta: i64) {
        self.open_connections.fetch_add(delta, Ordering::Relaxed);
    }

    /// Marks a request as started; the guard marks it finished when dropped.
    pub fn start(&self) -> InFlight<'_> {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        InFlight(self)
    }

    /// Marks a request whose body is being read; the guard marks it read when dropped.
    pub fn reading(&self) -> Reading<'_> {
        self.reading.fetch_add(1, Ordering::Relaxed);
        Reading(self)
    }

    /// Renders everything in Prometheus text format.
    pub fn render(&self, store: &CounterStore) -> String {
        let mut out = String::with_capacity(4096);
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let _ = writeln!(out, "# HELP sluice_counter_decisions_total Checks decided, by outcome.");
        let _ = writeln!(out, "# TYPE sluice_counter_decisions_total counter");
        let _ = writeln!(out, "sluice_counter_decisions_total{{outcome=\"admitted\"}} {}", get(&self.admitted));
        let _ = writeln!(out, "sluice_counter_decisions_total{{outcome=\"rejected\"}} {}", get(&self.rejected));
        let _ = writeln!(out, "# HELP sluice_counter_leases_total Leases answered, by outcome.");
        let _ = writeln!(out, "# TYPE sluice_counter_leases_total counter");
        let _ = writeln!(out, "sluice_counter_leases_total{{outcome=\"granted\"}} {}", get(&self.leases_granted));
        let _ = writeln!(out, "sluice_counter_leases_total{{outcome=\"empty\"}} {}", get(&self.leases_empty));
        let _ = writeln!(out, "# HELP sluice_counter_leased_tokens_total Tokens granted through leases.");
        let _ = writeln!(out, "# TYPE sluice_counter_leased_tokens_total counter");
        let _ = writeln!(out, "sluice_counter_leased_tokens_total {}", get(&self.tokens_leased));
        let _ = writeln!(out, "# HELP sluice_counter_charges_total Charges answered (admissions reported afterwards).");
        let _ = writeln!(out, "# TYPE sluice_counter_charges_total counter");
        let _ = writeln!(out, "sluice_counter_charges_total {}", get(&self.charges));
        let _ = writeln!(out, "# HELP sluice_counter_charged_tokens_total Units spent by charges.");
        let _ = writeln!(out, "# TYPE sluice_counter_charged_tokens_total counter");
        let _ = writeln!(out, "sluice_counter_charged_tokens_total {}", get(&self.tokens_charged));
        let _ = writeln!(
            out,
            "# HELP sluice_counter_forgiven_tokens_total Units of charges dropped because they exceeded max_debt."
        );
        let _ = writeln!(out, "# TYPE sluice_counter_forgiven_tokens_total counter");
        let _ = writeln!(out, "sluice_counter_forgiven_tokens_total {}", get(&self.tokens_forgiven));
        let _ = writeln!(
            out,
            "# HELP sluice_counter_duplicate_charges_total Charges whose id had been applied already: answered again, not applied."
        );
        let _ = writeln!(out, "# TYPE sluice_counter_duplicate_charges_total counter");
        let _ = writeln!(out, "sluice_counter_duplicate_charges_total {}", get(&self.duplicate_charges));
        let _ = writeln!(out, "# HELP sluice_counter_store_latency_seconds Latency of store calls.");
        let _ = writeln!(out, "# TYPE sluice_counter_store_latency_seconds histogram");
        let mut cumulative = 0;
        for (bound, bucket) in LATENCY_BUCKETS.iter().zip(&self.latency_buckets) {
            cumulative += get(bucket);
            let _ = writeln!(
                out,
                "sluice_counter_store_latency_seconds_bucket{{store=\"{}\",le=\"{bound}\"}} {cumulative}",
                store.name()
            );
        }
        let count = get(&self.latency_count);
        let _ = writeln!(
            out,
            "sluice_counter_store_latency_seconds_bucket{{store=\"{}\",le=\"+Inf\"}} {count}",
            store.name()
        );
        let sum = get(&self.latency_sum_ns) as f64 / 1e9;
        let _ = writeln!(out, "sluice_counter_store_latency_seconds_sum{{store=\"{}\"}} {sum}", store.name());
        let _ = writeln!(out, "sluice_counter_store_latency_seconds_count{{store=\"{}\"}} {count}", store.name());
        let _ = writeln!(out, "# HELP sluice_counter_store_errors_total Store calls that failed, by kind.");
        let _ = writeln!(out, "# TYPE sluice_counter_store_errors_total counter");
        for (kind, counter) in ERROR_KINDS.iter().zip(&self.store_errors) {
            let _ = writeln!(out, "sluice_counter_store_errors_total{{kind=\"{kind}\"}} {}", get(counter));
        }
        let _ = writeln!(out, "# HELP sluice_counter_in_flight_requests Requests being served.");
        let _ = writeln!(out, "# TYPE sluice_counter_in_flight_requests gauge");
        let _ = writeln!(out, "sluice_counter_in_flight_requests {}", self.in_flight.load(Ordering::Relaxed));
        let _ = writeln!(
            out,
            "# HELP sluice_counter_reading_requests Requests whose headers are in and whose body is still arriving."
        );
        let _ = writeln!(out, "# TYPE sluice_counter_reading_requests gauge");
        let _ = writeln!(out, "sluice_counter_reading_requests {}", self.reading.load(Ordering::Relaxed));
        let _ = writeln!(
            out,
            "# HELP sluice_counter_shed_requests_total Requests refused because too many were in flight."
        );
        let _ = writeln!(out, "# TYPE sluice_counter_shed_requests_total counter");
        let _ = writeln!(out, "sluice_counter_shed_requests_total {}", get(&self.shed));
        let _ = writeln!(
            out,
            "# HELP sluice_counter_unauthorized_total Requests refused for lack of the right bearer token."
        );
        let _ = writeln!(out, "# TYPE sluice_counter_unauthorized_total counter");
        let _ = writeln!(out, "sluice_counter_unauthorized_total {}", get(&self.unauthorized));
        let _ = writeln!(out, "# HELP sluice_counter_open_connections Client connections open.");
        let _ = writeln!(out, "# TYPE sluice_counter_open_connections gauge");
        let _ = writeln!(out, "sluice_counter_open_connections {}", self.open_connections.load(Ordering::Relaxed));
        let _ = writeln!(
            out,
            "# HELP sluice_counter_refused_connections_total Connections closed because too many were open."
        );
        let _ = writeln!(out, "# TYPE sluice_counter_refused_connections_total counter");
        let _ = writeln!(out, "sluice_counter_refused_connections_total {}", get(&self.refused_connections));
        let _ = writeln!(out, "# HELP sluice_counter_responses_total Responses by HTTP status (0 = other).");
        let _ = writeln!(out, "# TYPE sluice_counter_responses_total counter");
        for (status, counter) in STATUSES.iter().zip(&self.responses) {
            let _ = writeln!(out, "sluice_counter_responses_total{{status=\"{status}\"}} {}", get(counter));
        }
        match store {
            CounterStore::Memory(m) => {
                let _ = writeln!(out, "# HELP sluice_counter_memory_keys Keys held by the memory store.");
                let _ = writeln!(out, "# TYPE sluice_counter_memory_keys gauge");
                let _ = writeln!(out, "sluice_counter_memory_keys {}", m.len());
                let _ = writeln!(out, "# HELP sluice_counter_memory_charge_ids Charge ids the memory store remembers.");
                let _ = writeln!(out, "# TYPE sluice_counter_memory_charge_ids gauge");
                let _ = writeln!(out, "sluice_counter_memory_charge_ids {}", m.charge_ids());
            }
            CounterStore::Redis(r) => {
                let _ = writeln!(out, "# HELP sluice_counter_redis_connections Connections held by the pool.");
                let _ = writeln!(out, "# TYPE sluice_counter_redis_connections gauge");
                let _ = writeln!(out, "sluice_counter_redis_connections {}", get(&r.stats.open));
                let _ = writeln!(out, "# HELP sluice_counter_redis_connects_total Connections opened since start.");
                let _ = writeln!(out, "# TYPE sluice_counter_redis_connects_total counter");
                let _ = writeln!(out, "sluice_counter_redis_connects_total {}", get(&r.stats.connects));
                let _ = writeln!(
                    out,
                    "# HELP sluice_counter_redis_script_reloads_total NOSCRIPT answers that fell back to EVAL."
                );
                let _ = writeln!(out, "# TYPE sluice_counter_redis_script_reloads_total counter");
                let _ = writeln!(out, "sluice_counter_redis_script_reloads_total {}", get(&r.stats.script_reloads));
            }
        }
        out
    }
}

/// Decrements the in-flight gauge when dropped.
#[derive(Debug)]
pub struct InFlight<'a>(&'a Metrics);

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        self.0.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// Decrements the gauge of requests being read when dropped.
#[derive(Debug)]
pub struct Reading<'a>(&'a Metrics);

impl Drop for Reading<'_> {
    fn drop(&mut self) {
        self.0.reading.fetch_sub(1, Ordering::Relaxed);
    }
}
