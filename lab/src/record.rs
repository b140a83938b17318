//! What happened, per interval: the filter's own counters (summed over the fleet, read
//! from each proxy's metrics at every interval's end, cumulative), and what each caller
//! class saw (counted by the lab at the client, per interval).

use sluice::host::{Counter, PluginCounter, Reason};
use sluice::series::{self, Named};
use std::collections::BTreeMap;
use wasm_host::MetricValue;

/// The filter's counters at one instant, fleet-wide: per policy, and per plugin, read
/// through the filter's own [`Counter`] and [`PluginCounter`] (a metric name the filter
/// does not declare is not a counter of its own, and is not kept).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// `<policy>` → counter → value.
    pub policies: BTreeMap<String, BTreeMap<Counter, u64>>,
    /// Per-plugin counters.
    pub plugin: BTreeMap<PluginCounter, u64>,
}

/// The counters of every reason the counter service could not decide (`degraded.*`).
pub fn degraded() -> Vec<Counter> {
    Reason::ALL.iter().map(|r| r.counter()).collect()
}

/// The emergency cap's decisions.
pub const EMERGENCY: [Counter; 2] = [Counter::EmergencyAllowed, Counter::EmergencyRejected];

/// A lease policy's requests its lease could not serve, or whose key is cold, decided by
/// the service per request (a check), not by a fallback: never degraded.
pub const LEASE_CHECKED: [Counter; 3] =
    [Counter::LeaseCheckedSlotTaken, Counter::LeaseCheckedContended, Counter::LeaseCheckedCold];

impl Counters {
    /// Adds one proxy's metrics under `prefix` (read by [`series::read`]); others are
    /// skipped.
    pub fn add(&mut self, metrics: &[(String, MetricValue)], prefix: &str) {
        for (name, value) in metrics {
            let value = match value {
                MetricValue::Counter(v) | MetricValue::Gauge(v) => *v,
                MetricValue::Histogram(_) => continue,
            };
            match series::read(name, prefix) {
                Some(Named::Policy(policy, counter)) => {
                    *self.policies.entry(policy).or_default().entry(counter).or_default() += value;
                }
                Some(Named::Plugin(counter)) => *self.plugin.entry(counter).or_default() += value,
                None => {}
            }
        }
    }

    /// One policy's counter (0 when never counted).
    pub fn policy(&self, policy: &str, counter: Counter) -> u64 {
        self.policies.get(policy).and_then(|c| c.get(&counter)).copied().unwrap_or(0)
    }

    /// The sum of some of a policy's counters (every reason's, say: [`degraded`]).
    pub fn policy_sum(&self, policy: &str, counters: &[Counter]) -> u64 {
        counters.iter().map(|c| self.policy(policy, *c)).sum()
    }

    /// One plugin counter (0 when never counted).
    pub fn plugin(&self, counter: PluginCounter) -> u64 {
        self.plugin.get(&counter).copied().unwrap_or(0)
    }
}

/// What one caller class saw in one interval, at the client.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ClassRow {
    /// Requests sent (retries included: the limiter cannot tell them apart).
    pub offered: u64,
    /// Of those, retries.
    pub retries: u64,
    /// Forwarded to the upstream (now or after a delay).
    pub allowed: u64,
    /// Answered 429.
    pub rejected: u64,
    /// Answered another local status (a fail-closed 503) or reset.
    pub failed: u64,
    /// Still waiting at the interval's end (held by shaping or for the counter service),
    /// cumulative: the accounting line's last term.
    pub pending: u64,
    /// Calls (first attempts and their retries) that ended forwarded in this interval.
    pub calls_served: u64,
    /// Calls that ended refused for good (no retry left) in this interval.
    pub calls_refused: u64,
    /// Time the forwarded requests spent held before the filter let them through
    /// (shaping, waits for the counter service), summed, ns.
    pub waited_ns: u64,
    /// The longest of those waits, ns.
    pub waited_max_ns: u64,
}

impl ClassRow {
    /// Adds the next interval's counts: sums, the pending requests at its end, and the
    /// longest wait so far.
    pub fn then(&mut self, next: &Self) {
        self.offered += next.offered;
        self.retries += next.retries;
        self.allowed += next.allowed;
        self.rejected += next.rejected;
        self.failed += next.failed;
        self.pending = next.pending;
        self.calls_served += next.calls_served;
        self.calls_refused += next.calls_refused;
        self.waited_ns += next.waited_ns;
        self.waited_max_ns = self.waited_max_ns.max(next.waited_max_ns);
    }
}

/// One interval of the whole run.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Row {
    /// Its end, in ns from the start.
    pub end: u64,
    /// The filter's counters at its end (cumulative).
    pub counters: Counters,
    /// Per class, what it saw during the interval.
    pub classes: Vec<ClassRow>,
    /// Fault descriptions in force during the interval.
    pub faults: Vec<String>,
    /// What happened during the interval that the timeline did not say would (a reload
    /// a proxy refused).
    pub events: Vec<String>,
}

/// Every interval.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Series {
    /// The interval, ns.
    pub interval: u64,
    /// The rows in time order.
    pub rows: Vec<Row>,
}

impl Series {
    /// The counters at the end of row `i` (the zero counters before the first).
    pub fn counters_before(&self, i: usize) -> Counters {
        i.checked_sub(1).and_then(|j| self.rows.get(j)).map(|r| r.counters.clone()).unwrap_or_default()
    }

    /// The last row's counters.
    pub fn last(&self) -> Counters {
        self.rows.last().map(|r| r.counters.clone()).unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_metric_is_filed_under_the_policy_its_name_labels() {
        let mut counters = Counters::default();
        let metrics = vec![
            (series::policy_metric("sluice", "api", Counter::Offered), MetricValue::Counter(3)),
            (series::policy_metric("sluice", "api.v2", Counter::Offered), MetricValue::Counter(5)),
            (series::policy_metric("sluice", "api.v2", Counter::DegradedTimeout), MetricValue::Counter(1)),
            (series::plugin_metric("sluice", PluginCounter::Callouts), MetricValue::Counter(7)),
            (series::policy_metric("other", "api", Counter::Offered), MetricValue::Counter(100)),
        ];
        counters.add(&metrics, "sluice");
        counters.add(&metrics, "sluice");
        assert_eq!(counters.policy("api", Counter::Offered), 6);
        assert_eq!(counters.policy("api.v2", Counter::Offered), 10);
        assert_eq!(counters.policy_sum("api.v2", &degraded()), 2);
        assert_eq!(counters.plugin(PluginCounter::Callouts), 14);
    }
}
