//! The fleet-wide checks: what the service granted and admitted against what the proxies
//! spent, and against each counter's budget.

use super::{Oracle, Violation};
use crate::fleet::scenario::{Algorithm, PolicyDef};
use crate::fleet::service::Decision;
use sluice_testkit::bucket::ReferenceBucket;
use std::collections::{BTreeMap, BTreeSet};

/// The replay of one counter's budget in the service's time.
pub(super) struct Budget {
    /// Token bucket: the reference; windows: units per window index.
    pub(super) bucket: Option<ReferenceBucket>,
    pub(super) windows: BTreeMap<u64, u64>,
    pub(super) last: u64,
}

impl Oracle {
    /// Per global policy, from the proxies' own metrics (whatever their fallback header
    /// says): requests it let through other than by its failure rule
    /// (`allowed - failure_allowed - emergency.allowed`, over every proxy) never exceed
    /// the units the service granted it (lease) or admitted for it (check). A request
    /// admitted without paying, and without being counted as a fallback, shows here.
    pub(super) fn conservation(&self, decisions: &[Decision], proxies: &[&wasm_host::Host]) -> Result<(), Violation> {
        let mut paid: BTreeMap<&str, u64> = BTreeMap::new();
        for decision in decisions {
            let (key, units) = match decision {
                Decision::Grant { key, granted, .. } => (key, *granted),
                Decision::Check { key, cost, .. } => (key, *cost),
                _ => continue,
            };
            if let Some((name, _)) = self.counters.get(key) {
                *paid.entry(name.as_str()).or_insert(0) += units;
            }
        }
        let names: BTreeSet<&str> = self
            .forms
            .iter()
            .filter(|(_, f)| f.iter().any(PolicyDef::is_global))
            .map(|((n, _), _)| n.as_str())
            .collect();
        for name in names {
            let metric =
                |host: &wasm_host::Host, counter: &str| host.metric(&format!("sluice.{name}.{counter}")).unwrap_or(0);
            let through: u64 = proxies
                .iter()
                .map(|h| {
                    metric(h, "allowed").saturating_sub(metric(h, "failure_allowed") + metric(h, "emergency.allowed"))
                })
                .sum();
            let units = paid.get(name).copied().unwrap_or(0);
            if through > units {
                return Err(Violation::new(
                    "conservation",
                    format!(
                        "policy {name}: the proxies let {through} requests through it other than by its failure rule, \
                         but the service granted or admitted only {units} units for it: requests were admitted \
                         without paying and without being counted as fallbacks"
                    ),
                ));
            }
        }
        Ok(())
    }

    pub(super) fn spent_within_grants(&self, decisions: &[Decision]) -> Result<(), Violation> {
        for (counter, spends) in &self.lease_spends {
            // Grants as (granted at, expiring at, tokens left).
            let mut grants: Vec<(u64, u64, u64)> = decisions
                .iter()
                .filter_map(|d| match d {
                    Decision::Grant { key, granted, at, life, .. } if key == counter => {
                        Some((*at, at.saturating_add(*life), *granted))
                    }
                    _ => None,
                })
                .collect();
            // Each spend happened at some moment between its request's arrival and its
            // admission: match it to the grant that was live then and expires first,
            // spends in the order their windows close.
            let mut ordered = spends.clone();
            ordered.sort_unstable_by_key(|(from, until, _)| (*until, *from));
            for (from, until, units) in ordered {
                let mut need = units;
                while need > 0 {
                    let usable = grants
                        .iter_mut()
                        .filter(|(granted, expires, left)| *left > 0 && *granted <= until && *expires >= from)
                        .min_by_key(|(_, expires, _)| *expires);
                    let Some(grant) = usable else {
                        let (name, version) = self.counters.get(counter).cloned().unwrap_or_default();
                        let grants: Vec<String> = decisions
                            .iter()
                            .filter_map(|d| match d {
                                Decision::Grant { key, granted, at, life, .. } if key == counter => Some(format!(
                                    "{granted} at {:.3} ms for {:.0} ms",
                                    at.saturating_sub(self.start) as f64 / 1e6,
                                    *life as f64 / 1e6
                                )),
                                _ => None,
                            })
                            .collect();
                        let notes = self.spend_notes.get(counter).cloned().unwrap_or_default();
                        return Err(Violation::new(
                            "spent within grants",
                            format!(
                                "policy {name} v{version}, counter {counter}: {units} unit(s) admitted through its \
                                 lease by a request of {:.3}..{:.3} ms, with no grant live then to pay for them \
                                 (spent {} in all, granted {}); grants {grants:?}; spends {notes:#?}",
                                from.saturating_sub(self.start) as f64 / 1e6,
                                until.saturating_sub(self.start) as f64 / 1e6,
                                spends.iter().map(|s| s.2).sum::<u64>(),
                                decisions
                                    .iter()
                                    .map(|d| match d {
                                        Decision::Grant { key, granted, .. } if key == counter => *granted,
                                        _ => 0,
                                    })
                                    .sum::<u64>()
                            ),
                        ));
                    };
                    let take = grant.2.min(need);
                    grant.2 -= take;
                    need -= take;
                }
            }
        }
        Ok(())
    }

    pub(super) fn checked_within_admissions(&self, decisions: &[Decision]) -> Result<(), Violation> {
        for (counter, admits) in &self.check_admits {
            let mut events: Vec<(u64, u8, u64)> = decisions
                .iter()
                .filter_map(|d| match d {
                    Decision::Check { key, cost, at, .. } if key == counter => Some((*at, 0, *cost)),
                    _ => None,
                })
                .collect();
            events.extend(admits.iter().map(|(at, units)| (*at, 1, *units)));
            events.sort_unstable();
            let mut available: u64 = 0;
            for (at, kind, units) in events {
                if kind == 0 {
                    available += units;
                } else if available >= units {
                    available -= units;
                } else {
                    let (name, version) = self.counters.get(counter).cloned().unwrap_or_default();
                    return Err(Violation::new(
                        "checked within admissions",
                        format!(
                            "policy {name} v{version}, counter {counter}: admitted through a check at {:.3} ms \
                             that the service never admitted",
                            at.saturating_sub(self.start) as f64 / 1e6
                        ),
                    ));
                }
            }
        }
        Ok(())
    }

    /// Replays the service's new decisions through each counter's budget.
    pub(super) fn budget(&mut self, decisions: &[Decision]) -> Result<(), Violation> {
        let all = decisions;
        let fresh = decisions.get(self.budget_seen..).unwrap_or_default().to_vec();
        self.budget_seen = decisions.len();
        for decision in fresh {
            let (key, units, at) = match decision {
                Decision::Restart { .. } => {
                    self.budgets.clear();
                    continue;
                }
                Decision::Grant { key, granted, service_at, .. } => (key, granted, service_at),
                Decision::Check { key, cost, service_at, .. } => (key, cost, service_at),
                // A charge only spends more: a replay without it holds at least as much.
                Decision::Charge { .. } => continue,
                Decision::Credit { key, credited, spent_at, service_at, duplicate: false } if credited > 0 => {
                    self.credit(&key, credited, spent_at, service_at);
                    continue;
                }
                Decision::Credit { .. } => continue,
            };
            let Some((name, version)) = self.counters.get(&key).cloned() else { continue };
            let Some(forms) = self.forms.get(&(name.clone(), version)) else { continue };
            let loosest = loosest(forms);
            let budget = self.budgets.entry(key.clone()).or_insert_with(|| Budget {
                bucket: match loosest {
                    Algorithm::TokenBucket { rate, burst } => Some(ReferenceBucket::new(rate, 1_000_000_000, burst)),
                    _ => None,
                },
                windows: BTreeMap::new(),
                last: 0,
            });
            let at = at.max(budget.last);
            budget.last = at;
            let over = match loosest {
                Algorithm::TokenBucket { .. } => budget.bucket.as_mut().is_some_and(|b| !b.admit(at, units)),
                Algorithm::FixedWindow { limit, window_ms } | Algorithm::SlidingWindow { limit, window_ms } => {
                    let count = budget.windows.entry(at / (window_ms * 1_000_000)).or_insert(0);
                    *count += units;
                    *count > limit
                }
            };
            if over {
                let history: Vec<String> = all
                    .iter()
                    .filter_map(|d| match d {
                        Decision::Grant { key: k, granted, service_at, spec, .. } if *k == key => Some(format!(
                            "grant {granted} at {:.3} ms: {spec}",
                            (service_at % 1_000_000_000_000) as f64 / 1e6
                        )),
                        Decision::Check { key: k, cost, service_at, .. } if *k == key => {
                            Some(format!("check {cost} at {:.3} ms", (service_at % 1_000_000_000_000) as f64 / 1e6))
                        }
                        Decision::Restart { .. } => Some("restart".to_owned()),
                        _ => None,
                    })
                    .collect();
                return Err(Violation::new(
                    "budget",
                    format!(
                        "policy {name} v{version}, counter {key}: the service granted or admitted {units} at {:.3} ms \
                         beyond the policy's numbers ({loosest:?}, the loosest in force): a fresh budget appeared; \
                         history {history:#?}",
                        (at % 1_000_000_000_000) as f64 / 1e6
                    ),
                ));
            }
        }
        Ok(())
    }
}

impl Oracle {
    /// Gives a credit back in the replay of `key`'s budget, as the service did: to the
    /// bucket (never above full), or to the window the units were spent in.
    fn credit(&mut self, key: &str, units: u64, spent_at: u64, at: u64) {
        let Some((name, version)) = self.counters.get(key).cloned() else { return };
        let Some(forms) = self.forms.get(&(name, version)) else { return };
        let loosest = loosest(forms);
        let Some(budget) = self.budgets.get_mut(key) else { return };
        let at = at.max(budget.last);
        budget.last = at;
        match loosest {
            Algorithm::TokenBucket { .. } => {
                if let Some(bucket) = budget.bucket.as_mut() {
                    bucket.credit(at, units);
                }
            }
            Algorithm::FixedWindow { window_ms, .. } | Algorithm::SlidingWindow { window_ms, .. } => {
                if let Some(count) = budget.windows.get_mut(&(spent_at / (window_ms * 1_000_000))) {
                    *count = count.saturating_sub(units);
                }
            }
        }
    }
}

/// The loosest numbers among a policy's forms (same algorithm and window throughout).
fn loosest(forms: &[PolicyDef]) -> Algorithm {
    let mut out = forms.first().map(|p| p.algorithm).unwrap_or(Algorithm::TokenBucket { rate: 1, burst: 1 });
    for form in forms {
        out = match (out, form.algorithm) {
            (Algorithm::TokenBucket { rate, burst }, Algorithm::TokenBucket { rate: r, burst: b }) => {
                Algorithm::TokenBucket { rate: rate.max(r), burst: burst.max(b) }
            }
            (Algorithm::FixedWindow { limit, window_ms }, Algorithm::FixedWindow { limit: l, .. }) => {
                Algorithm::FixedWindow { limit: limit.max(l), window_ms }
            }
            (Algorithm::SlidingWindow { limit, window_ms }, Algorithm::SlidingWindow { limit: l, .. }) => {
                Algorithm::SlidingWindow { limit: limit.max(l), window_ms }
            }
            (out, _) => out,
        };
    }
    out
}
