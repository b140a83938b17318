//! What the RLS front door counts: envoyproxy/ratelimit's per-rule counters
//! (`total_hits`, `over_limit`, `near_limit`, `within_limit`, `shadow_mode`, in hits),
//! labelled by the rule's path (`domain.key_value.key`), never by a request's values
//! unless the rule asks (`detailed_metric`, `value_to_metric`); requests by gRPC outcome,
//! their latency, unknown domains and configuration loads.
//!
//! The rule label takes at most [`MAX_RULE_SERIES`] values: past them, new ones are
//! counted under `_overflow`, so that no client can grow the metrics without bound
//! (envoyproxy/ratelimit#275, #1132).

use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

use super::{Bounded, Latency, fixed};

/// Most distinct `rule` label values.
pub const MAX_RULE_SERIES: usize = 2048;
/// The `rule` label of what comes past [`MAX_RULE_SERIES`].
pub const OVERFLOW: &str = "_overflow";

type Rules = Family<Vec<(&'static str, String)>, Counter>;

/// The RLS metrics.
#[derive(Debug)]
pub struct RlsMetrics {
    total_hits: Rules,
    over_limit: Rules,
    near_limit: Rules,
    within_limit: Rules,
    shadow_mode: Rules,
    rules: Bounded,
    requests: [Counter; 4],
    latency: Latency,
    domain_not_found: Counter,
    loads: [Counter; 2],
}

const OUTCOMES: [&str; 4] = ["ok", "invalid_argument", "unavailable", "unauthenticated"];

impl RlsMetrics {
    /// Registers the RLS metrics in `registry` (under `rls_`).
    pub(super) fn new(registry: &mut Registry) -> Self {
        let mut family = |name: &str, help: &str| {
            let family = Rules::default();
            registry.register(name, help, family.clone());
            family
        };
        let total_hits = family("rls_total_hits", "Hits counted by RLS rules (hits_addend units), by rule");
        let over_limit = family("rls_over_limit", "Hits over their rule's limit, by rule");
        let near_limit = family("rls_near_limit", "Hits within their limit and past 80 % of it, by rule");
        let within_limit = family("rls_within_limit", "Hits within their rule's limit, by rule");
        let shadow_mode =
            family("rls_shadow_mode", "Hits over the limit of a rule in shadow mode (answered OK), by rule");
        let (outcomes, requests) = fixed("outcome", OUTCOMES);
        registry.register("rls_requests", "ShouldRateLimit requests, by gRPC outcome", outcomes);
        let (latency, [latency_handle]) = fixed("api", ["rls"]);
        registry.register("rls_latency_seconds", "Latency of ShouldRateLimit requests, store calls included", latency);
        let domain_not_found = Counter::default();
        registry.register("rls_domain_not_found", "Requests for a domain no file configures", domain_not_found.clone());
        let (loads, loads_handles) = fixed("outcome", ["success", "error"]);
        registry.register("rls_config_loads", "Loads of the RLS configuration directory, by outcome", loads);
        Self {
            total_hits,
            over_limit,
            near_limit,
            within_limit,
            shadow_mode,
            rules: Bounded::new(MAX_RULE_SERIES, OVERFLOW),
            requests,
            latency: latency_handle,
            domain_not_found,
            loads: loads_handles,
        }
    }

    fn label(&self, rule: &str) -> Vec<(&'static str, String)> {
        vec![("rule", self.rules.value(rule))]
    }

    /// Counts `hits` of `rule`: over its limit or within it (and near it), and in
    /// shadow mode when it was over and answered OK.
    pub fn hits(&self, rule: &str, hits: u64, over: bool, shadow: bool, near: bool) {
        let label = self.label(rule);
        self.total_hits.get_or_create(&label).inc_by(hits);
        if over {
            self.over_limit.get_or_create(&label).inc_by(hits);
            if shadow {
                self.shadow_mode.get_or_create(&label).inc_by(hits);
            }
        } else {
            self.within_limit.get_or_create(&label).inc_by(hits);
            if near {
                self.near_limit.get_or_create(&label).inc_by(hits);
            }
        }
    }

    /// Counts a request, by its error's kind (`None`: answered), and its latency.
    pub fn request(&self, error: Option<&str>, took: Duration) {
        let i = OUTCOMES.iter().position(|o| Some(*o) == error).unwrap_or(0);
        if let Some(counter) = self.requests.get(i) {
            counter.inc();
        }
        self.latency.observe(took);
    }

    /// Counts a request for an unknown domain.
    pub fn domain_not_found(&self) {
        self.domain_not_found.inc();
    }

    /// Counts a configuration load.
    pub fn config_load(&self, ok: bool) {
        if let Some(counter) = self.loads.get(usize::from(!ok)) {
            counter.inc();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rendered(metrics: &RlsMetrics) -> String {
        let mut registry = Registry::default();
        registry.register("hits", "", metrics.total_hits.clone());
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &registry).expect("encodes");
        out
    }

    #[test]
    fn past_the_bound_new_rules_are_counted_under_overflow_and_known_ones_keep_their_label() {
        let metrics = RlsMetrics::new(&mut Registry::default());
        for i in 0..MAX_RULE_SERIES {
            metrics.hits(&format!("d.rule_{i}"), 1, false, false, false);
        }

        metrics.hits("d.one_too_many", 3, false, false, false);
        metrics.hits("d.another", 4, false, false, false);
        metrics.hits("d.rule_7", 5, false, false, false);

        let text = rendered(&metrics);
        assert!(text.contains(&format!("hits_total{{rule=\"{OVERFLOW}\"}} 7")), "{}", &text[..200]);
        assert!(text.contains("hits_total{rule=\"d.rule_7\"} 6"));
        assert!(!text.contains("one_too_many"));
    }
}
