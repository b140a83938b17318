//! Guest-defined metrics, process-wide as Envoy's stats are.
//!
//! `proxy_define_metric` on any worker's VM returns an id local to that VM, but the
//! metric behind it is looked up by type and name in one registry: two workers that
//! define `requests_total` increment the same counter, as two Envoy workers do. Envoy
//! exports a guest metric `x` as `wasmcustom.x`; this host keeps the guest's own name.
//!
//! Semantics (Envoy's `Context::{increment,record,get}Metric`):
//! * counter: `increment` with a delta ≤ 0 is `BAD_ARGUMENT` (a counter never goes
//!   down, and Envoy also refuses 0); `record` *adds* the value.
//! * gauge: `increment` adds or subtracts; `record` sets.
//! * histogram: `record` adds a sample; `increment` and `get` are `BAD_ARGUMENT`.
//!
//! The host's own counters live in the same registry under the reserved `wasm_host.`
//! prefix (for example `wasm_host.traps`).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

/// The three proxy-wasm metric types (`proxy_metric_type_t`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum MetricKind {
    /// Only goes up.
    Counter,
    /// Goes up and down, or is set.
    Gauge,
    /// A distribution of recorded values.
    Histogram,
}

impl MetricKind {
    pub(crate) fn from_abi(raw: u32) -> Option<Self> {
        Some(match raw {
            0 => Self::Counter,
            1 => Self::Gauge,
            2 => Self::Histogram,
            _ => return None,
        })
    }

    pub(crate) fn to_abi(self) -> u32 {
        match self {
            Self::Counter => 0,
            Self::Gauge => 1,
            Self::Histogram => 2,
        }
    }
}

/// How many samples a histogram keeps for [`Histogram::values`]; `count` and `sum` keep
/// counting past it. Bounds memory when `serve` runs for long.
const MAX_HISTOGRAM_SAMPLES: usize = 100_000;

/// What a histogram recorded.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Histogram {
    /// Number of samples recorded.
    pub count: u64,
    /// Sum of all samples (wrapping).
    pub sum: u64,
    /// The first samples, in the order they were recorded (at most 100 000).
    pub values: Vec<u64>,
}

/// A metric as read by a test.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MetricValue {
    /// A counter's value.
    Counter(u64),
    /// A gauge's value.
    Gauge(u64),
    /// A histogram's samples.
    Histogram(Histogram),
}

#[derive(Debug)]
pub(crate) struct Metric {
    pub(crate) kind: MetricKind,
    value: AtomicU64,
    histogram: Mutex<Histogram>,
}

/// Why an update was refused; maps to a proxy-wasm status.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MetricError {
    BadArgument,
}

impl Metric {
    fn new(kind: MetricKind) -> Self {
        Self { kind, value: AtomicU64::new(0), histogram: Mutex::new(Histogram::default()) }
    }

    pub(crate) fn increment(&self, delta: i64) -> Result<(), MetricError> {
        match self.kind {
            MetricKind::Counter if delta > 0 => {
                self.value.fetch_add(delta.unsigned_abs(), Ordering::Relaxed);
                Ok(())
            }
            MetricKind::Gauge if delta >= 0 => {
                self.value.fetch_add(delta.unsigned_abs(), Ordering::Relaxed);
                Ok(())
            }
            MetricKind::Gauge => {
                // Envoy's gauge is a u64; going below zero wraps, which a test sees as a
                // huge value rather than a silently clamped one.
                self.value.fetch_sub(delta.unsigned_abs(), Ordering::Relaxed);
                Ok(())
            }
            MetricKind::Counter | MetricKind::Histogram => Err(MetricError::BadArgument),
        }
    }

    pub(crate) fn record(&self, value: u64) {
        match self.kind {
            MetricKind::Counter => {
                self.value.fetch_add(value, Ordering::Relaxed);
            }
            MetricKind::Gauge => self.value.store(value, Ordering::Relaxed),
            MetricKind::Histogram => {
                let mut histogram = self.histogram.lock().unwrap_or_else(PoisonError::into_inner);
                histogram.count = histogram.count.wrapping_add(1);
                histogram.sum = histogram.sum.wrapping_add(value);
                if histogram.values.len() < MAX_HISTOGRAM_SAMPLES {
                    histogram.values.push(value);
                }
            }
        }
    }

    pub(crate) fn get(&self) -> Result<u64, MetricError> {
        match self.kind {
            MetricKind::Counter | MetricKind::Gauge => Ok(self.value.load(Ordering::Relaxed)),
            MetricKind::Histogram => Err(MetricError::BadArgument),
        }
    }

    fn snapshot(&self) -> MetricValue {
        let value = self.value.load(Ordering::Relaxed);
        match self.kind {
            MetricKind::Counter => MetricValue::Counter(value),
            MetricKind::Gauge => MetricValue::Gauge(value),
            MetricKind::Histogram => {
                MetricValue::Histogram(self.histogram.lock().unwrap_or_else(PoisonError::into_inner).clone())
            }
        }
    }
}

/// All metrics of one host, shared by its workers.
#[derive(Debug, Default)]
pub(crate) struct Metrics {
    by_name: Mutex<HashMap<MetricKey, Arc<Metric>>>,
}

/// A metric's identity: its type and the guest's name for it.
type MetricKey = (MetricKind, Vec<u8>);

impl Metrics {
    /// The metric with this type and name, created on first use.
    pub(crate) fn define(&self, kind: MetricKind, name: &[u8]) -> Arc<Metric> {
        let mut map = self.by_name.lock().unwrap_or_else(PoisonError::into_inner);
        Arc::clone(map.entry((kind, name.to_vec())).or_insert_with(|| Arc::new(Metric::new(kind))))
    }

    /// Adds 1 to one of the host's own counters.
    pub(crate) fn count(&self, name: &str) {
        let _ = self.define(MetricKind::Counter, name.as_bytes()).increment(1);
    }

    pub(crate) fn find(&self, name: &str) -> Option<MetricValue> {
        let map = self.by_name.lock().unwrap_or_else(PoisonError::into_inner);
        [MetricKind::Counter, MetricKind::Gauge, MetricKind::Histogram]
            .into_iter()
            .find_map(|kind| map.get(&(kind, name.as_bytes().to_vec())))
            .map(|metric| metric.snapshot())
    }

    pub(crate) fn all(&self) -> Vec<(String, MetricValue)> {
        let map = self.by_name.lock().unwrap_or_else(PoisonError::into_inner);
        let mut all: Vec<_> = map
            .iter()
            .map(|((_, name), metric)| (String::from_utf8_lossy(name).into_owned(), metric.snapshot()))
            .collect();
        all.sort_by(|a, b| a.0.cmp(&b.0));
        all
    }
}

/// A VM's table of metric ids. Ids carry the type in their two low bits, as Envoy's do,
/// so an id of one type is never mistaken for another.
#[derive(Debug, Default)]
pub(crate) struct MetricIds {
    next: u32,
    by_id: HashMap<u32, Arc<Metric>>,
}

impl MetricIds {
    pub(crate) fn insert(&mut self, metric: Arc<Metric>) -> u32 {
        self.next = self.next.wrapping_add(1);
        let id = (self.next << 2) | metric.kind.to_abi();
        self.by_id.insert(id, metric);
        id
    }

    pub(crate) fn get(&self, id: u32) -> Option<&Arc<Metric>> {
        self.by_id.get(&id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_refuses_to_go_down_or_stand_still() {
        let metric = Metric::new(MetricKind::Counter);

        assert_eq!(metric.increment(-1), Err(MetricError::BadArgument));
        assert_eq!(metric.increment(0), Err(MetricError::BadArgument));
        assert_eq!(metric.increment(3), Ok(()));
        assert_eq!(metric.get(), Ok(3));
    }

    #[test]
    fn recording_a_counter_adds_and_recording_a_gauge_sets() {
        let metrics = Metrics::default();
        let counter = metrics.define(MetricKind::Counter, b"c");
        let gauge = metrics.define(MetricKind::Gauge, b"g");

        counter.record(5);
        counter.record(5);
        gauge.record(5);
        gauge.record(7);

        assert_eq!(metrics.find("c"), Some(MetricValue::Counter(10)));
        assert_eq!(metrics.find("g"), Some(MetricValue::Gauge(7)));
    }

    #[test]
    fn the_same_name_defined_twice_is_one_metric() {
        let metrics = Metrics::default();

        metrics.define(MetricKind::Counter, b"x").record(1);
        metrics.define(MetricKind::Counter, b"x").record(1);

        assert_eq!(metrics.find("x"), Some(MetricValue::Counter(2)));
    }

    #[test]
    fn ids_carry_their_type() {
        let metrics = Metrics::default();
        let mut ids = MetricIds::default();

        let counter = ids.insert(metrics.define(MetricKind::Counter, b"a"));
        let histogram = ids.insert(metrics.define(MetricKind::Histogram, b"b"));

        assert_eq!(counter & 3, 0);
        assert_eq!(histogram & 3, 2);
        assert_ne!(counter, histogram);
    }
}
