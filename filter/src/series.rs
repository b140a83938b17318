//! How the proxy's metrics are named: each [`Counter`] and [`PluginCounter`] as a
//! Prometheus series (a family and its labels), and the metric name that carries it
//! through the host.
//!
//! A proxy-wasm metric is a flat name. Envoy turns parts of a name into labels only
//! through tag extractors (`stats_config.stats_tags`), so the labels are written into the
//! name in the convention Istio's own telemetry uses, `key=.=value;.;`, and the family
//! comes last:
//!
//! ```text
//! policy=.=api;.;outcome=.=allowed;.;sluice_requests_total
//! ```
//!
//! With the extractors `(policy=\.=(.*?);\.;)`, `(outcome=\.=(.*?);\.;)`, … (shipped in
//! `envoy-config/envoy.yaml`; under Istio, `extraStatTags` generates exactly these), Envoy's
//! `/stats/prometheus` shows `sluice_requests_total{policy="api",outcome="allowed"}`: one
//! family per measure whatever the configuration, so a query can sum over policies and a
//! dashboard is written once. Without the extractors the name still works, as one series
//! per name. Why this convention rather than dotted names (`sluice.policy.api.allowed`):
//! a policy name may contain dots, and a dotted name needs a regex per position; a
//! `key=.=value;.;` pair is found wherever it stands, by one regex per key, and Istio
//! users already have the extractors' mechanism (`extraStatTags`).
//!
//! Label values come from the configuration (policy names) or from these tables, never
//! from request data: the number of series is fixed by the configuration.

use crate::host::{Counter, PluginCounter, Wait};

/// The label keys a series may carry, in the order they are written.
pub const LABELS: [&str; 4] = ["policy", "outcome", "reason", "kind"];

/// One Prometheus series of the proxy's: its family (without the stat prefix) and the
/// one label beside `policy` that sets it apart from its family's other series.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Series {
    /// The family after `<stat_prefix>_`: `requests_total`, `queued`.
    pub family: &'static str,
    /// The label that splits the family, as (key, value): `("outcome", "allowed")`.
    pub label: Option<(&'static str, &'static str)>,
}

const fn plain(family: &'static str) -> Series {
    Series { family, label: None }
}

const fn outcome(family: &'static str, value: &'static str) -> Series {
    Series { family, label: Some(("outcome", value)) }
}

const fn reason(family: &'static str, value: &'static str) -> Series {
    Series { family, label: Some(("reason", value)) }
}

const fn kind(family: &'static str, value: &'static str) -> Series {
    Series { family, label: Some(("kind", value)) }
}

impl Counter {
    /// Its series. Counters end in `_total`, gauges do not; units other than requests
    /// are in the name (`_tokens_total`, `_units_total`).
    pub const fn series(self) -> Series {
        match self {
            Self::Offered => plain("offered_total"),
            Self::Allowed => outcome("requests_total", "allowed"),
            Self::Rejected => outcome("requests_total", "rejected"),
            Self::Queued => plain("queued"),
            Self::OverLimit => plain("over_limit_total"),
            Self::ShadowRejected => plain("shadow_rejected_total"),
            Self::MissingKey => plain("missing_key_total"),
            Self::ReadFailures => plain("read_failures_total"),
            Self::CasConflicts => plain("cas_conflicts_total"),
            Self::CasExhausted => plain("cas_exhausted_total"),
            Self::StoreErrors => plain("store_errors_total"),
            Self::Repaired => plain("repaired_total"),
            Self::Overflowed => plain("overflowed_total"),
            Self::Unrefunded => plain("unrefunded_total"),
            Self::FailureAllowed => outcome("failure_decisions_total", "allowed"),
            Self::FailureDenied => outcome("failure_decisions_total", "rejected"),
            Self::Abandoned => plain("abandoned_total"),
            Self::DegradedTimeout => reason("degraded_total", "timeout"),
            Self::DegradedRefused => reason("degraded_total", "refused"),
            Self::DegradedReset => reason("degraded_total", "reset"),
            Self::DegradedBadStatus => reason("degraded_total", "bad_status"),
            Self::DegradedBadBody => reason("degraded_total", "bad_body"),
            Self::DegradedUnauthorized => reason("degraded_total", "unauthorized"),
            Self::DegradedCircuitOpen => reason("degraded_total", "circuit_open"),
            Self::DegradedDispatchFailed => reason("degraded_total", "dispatch_failed"),
            Self::DegradedLeaseQueueFull => reason("degraded_total", "lease_queue_full"),
            Self::DegradedLeaseSlotTaken => reason("degraded_total", "lease_slot_taken"),
            Self::DegradedLeaseContended => reason("degraded_total", "lease_contended"),
            Self::DegradedLeaseCold => reason("degraded_total", "lease_cold"),
            Self::FallbackActive => plain("fallback_active"),
            Self::FallbackMilliseconds => plain("fallback_milliseconds_total"),
            Self::OverrideBypassed => kind("overridden_total", "bypass"),
            Self::OverrideClamped => kind("overridden_total", "clamp"),
            Self::EmergencyAllowed => outcome("emergency_decisions_total", "allowed"),
            Self::EmergencyRejected => outcome("emergency_decisions_total", "rejected"),
            Self::LeaseRefills => plain("lease_refills_total"),
            Self::LeaseGranted => plain("lease_granted_tokens_total"),
            Self::LeaseExpired => plain("lease_expired_tokens_total"),
            Self::LeaseReturned => plain("lease_returned_tokens_total"),
            Self::LeaseReconciled => plain("lease_reconciled_units_total"),
            Self::LeaseRepaid => plain("lease_repaid_units_total"),
            Self::LeaseForgiven => plain("lease_forgiven_units_total"),
            Self::LeaseCheckedSlotTaken => reason("lease_checked_total", "slot_taken"),
            Self::LeaseCheckedContended => reason("lease_checked_total", "contended"),
            Self::LeaseCheckedCold => reason("lease_checked_total", "cold"),
            Self::CostEstimated => plain("cost_estimated_units_total"),
            Self::CostUnknown => plain("cost_unknown_total"),
            Self::CostCharged => plain("cost_charged_units_total"),
            Self::CostCredited => plain("cost_credited_units_total"),
            Self::CostForgiven => plain("cost_forgiven_units_total"),
            Self::CostOverBudget => plain("cost_over_budget_total"),
            Self::ConcurrencyRenewFailures => plain("concurrency_renew_failures_total"),
        }
    }
}

impl PluginCounter {
    /// Its series (a plugin counter has no `policy` label).
    pub const fn series(self) -> Series {
        match self {
            Self::Callouts => plain("counter_service_callouts_total"),
            Self::Waiting => plain("counter_service_waiting"),
            Self::CircuitOpened => plain("counter_service_circuit_opened_total"),
            Self::CheckBatches => plain("counter_service_check_batches_total"),
            Self::ChecksBatched => plain("counter_service_checks_batched_total"),
            Self::ChecksUnsent => plain("counter_service_checks_unsent_total"),
            Self::CheckCallsPastLate => plain("counter_service_check_calls_past_late_total"),
            Self::KeysCreated => plain("keys_created_total"),
            Self::ReplyFailures => plain("reply_failures_total"),
            Self::ResumeFailures => plain("resume_failures_total"),
        }
    }
}

impl Wait {
    /// Its series: a histogram of the plugin's, in milliseconds.
    pub const fn series(self) -> Series {
        reason("wait_milliseconds", self.name())
    }
}

/// The name of a wait histogram.
pub fn wait_metric(stat_prefix: &str, wait: Wait) -> String {
    metric_name(stat_prefix, None, wait.series())
}

/// One `key=.=value;.;` pair.
fn tag(name: &mut String, key: &str, value: &str) {
    name.push_str(key);
    name.push_str("=.=");
    name.push_str(value);
    name.push_str(";.;");
}

/// The metric name of `series` of `policy` (none for a plugin counter) under
/// `stat_prefix`: its labels, then `<stat_prefix>_<family>`.
pub fn metric_name(stat_prefix: &str, policy: Option<&str>, series: Series) -> String {
    let mut name = String::with_capacity(64);
    if let Some(policy) = policy {
        tag(&mut name, "policy", policy);
    }
    if let Some((key, value)) = series.label {
        tag(&mut name, key, value);
    }
    name.push_str(stat_prefix);
    name.push('_');
    name.push_str(series.family);
    name
}

/// The name of a policy counter.
pub fn policy_metric(stat_prefix: &str, policy: &str, counter: Counter) -> String {
    metric_name(stat_prefix, Some(policy), counter.series())
}

/// The name of a plugin counter.
pub fn plugin_metric(stat_prefix: &str, counter: PluginCounter) -> String {
    metric_name(stat_prefix, None, counter.series())
}

/// What a metric name of [`metric_name`]'s says: a policy counter, or a plugin one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Named {
    /// A counter of the policy named.
    Policy(String, Counter),
    /// A plugin counter.
    Plugin(PluginCounter),
}

/// Reads a metric name back (how the lab and the tests file a host's metrics): `None`
/// for a name this plugin under `stat_prefix` does not define.
pub fn read(name: &str, stat_prefix: &str) -> Option<Named> {
    let mut rest = name;
    let mut policy = None;
    let mut label = None;
    while let Some((key, after)) = rest.split_once("=.=") {
        let (value, after) = after.split_once(";.;")?;
        match key {
            "policy" if policy.is_none() => policy = Some(value),
            _ if label.is_none() && LABELS.contains(&key) => label = Some((key, value)),
            _ => return None,
        }
        rest = after;
    }
    let family = rest.strip_prefix(stat_prefix)?.strip_prefix('_')?;
    let same = |series: Series| series.family == family && series.label == label;
    match policy {
        Some(policy) => Counter::ALL.iter().find(|c| same(c.series())).map(|c| Named::Policy(policy.to_owned(), *c)),
        None => PluginCounter::ALL.iter().find(|c| same(c.series())).map(|c| Named::Plugin(*c)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_counter_has_its_own_series_and_reads_back_as_itself() {
        for &counter in Counter::ALL {
            let name = policy_metric("sluice", "api.v2", counter);
            assert_eq!(read(&name, "sluice"), Some(Named::Policy("api.v2".to_owned(), counter)), "{name}");
        }
        for &counter in PluginCounter::ALL {
            let name = plugin_metric("sluice", counter);
            assert_eq!(read(&name, "sluice"), Some(Named::Plugin(counter)), "{name}");
        }
    }

    #[test]
    fn a_counter_ends_in_total_and_a_gauge_does_not() {
        for &counter in Counter::ALL {
            assert_eq!(counter.series().family.ends_with("_total"), !counter.is_gauge(), "{counter:?}");
        }
        for &counter in PluginCounter::ALL {
            assert_eq!(counter.series().family.ends_with("_total"), !counter.is_gauge(), "{counter:?}");
        }
    }

    #[test]
    fn a_degraded_counter_is_labelled_by_its_reason() {
        for reason in crate::host::Reason::ALL {
            assert_eq!(
                reason.counter().series(),
                Series { family: "degraded_total", label: Some(("reason", reason.name())) }
            );
        }
    }

    #[test]
    fn the_labels_are_written_before_the_family_in_istios_convention() {
        assert_eq!(
            policy_metric("sluice", "api", Counter::Allowed),
            "policy=.=api;.;outcome=.=allowed;.;sluice_requests_total"
        );
        assert_eq!(plugin_metric("edge", PluginCounter::Callouts), "edge_counter_service_callouts_total");
    }

    #[test]
    fn a_name_of_another_prefix_or_an_unknown_label_is_not_ours() {
        assert_eq!(read("policy=.=api;.;other_offered_total", "sluice"), None);
        assert_eq!(read("policy=.=api;.;colour=.=red;.;sluice_offered_total", "sluice"), None);
        assert_eq!(read("policy=.=api;.;sluice_requests_total", "sluice"), None, "the outcome is missing");
        assert_eq!(read("cluster.backend.upstream_rq", "sluice"), None);
    }
}
