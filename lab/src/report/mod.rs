//! The report of a run: the numbers the seed asks operators to watch ([`Summary`]), a
//! verdict in plain words, the same data as CSV, and one self-contained HTML page with
//! inline SVG plots ([`html`]). Nothing in it depends on the wall clock or the machine:
//! the same run gives the same bytes.

pub mod csv;
pub mod html;
mod svg;
mod verdict;

pub use verdict::verdict;

use crate::overshoot::{PolicyOvershoot, Promise};
use crate::record::{ClassRow, EMERGENCY, LEASE_CHECKED, degraded};
use crate::run::Outcome;
use serde::Serialize;
use sluice::host::{Counter, PluginCounter};
use std::path::Path;

/// A policy's totals over the run.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PolicySummary {
    /// Its name.
    pub name: String,
    /// `local`, `global check` or `global lease`, and `shadow`.
    pub mode: String,
    /// Requests it applied to.
    pub offered: u64,
    /// Of those, forwarded.
    pub allowed: u64,
    /// Of those, refused (whichever policy refused).
    pub rejected: u64,
    /// Held by shaping at the end.
    pub queued: u64,
    /// Whether `offered = allowed + rejected + queued` held at every interval's end.
    pub accounting_holds: bool,
    /// Its own decision said no.
    pub over_limit: u64,
    /// The counter service could not decide (every reason).
    pub degraded: u64,
    /// Lease mode: requests the lease could not serve, decided by the service per
    /// request (a check) instead: the service answered, nothing degraded.
    pub lease_checked: u64,
    /// Decided by the emergency cap: admitted, refused.
    pub emergency_allowed: u64,
    /// Refused by the emergency cap.
    pub emergency_rejected: u64,
    /// Decided by `on_failure`: admitted (fail open), refused (fail closed).
    pub failure_allowed: u64,
    /// Refused by `on_failure`.
    pub failure_denied: u64,
    /// How long fallbacks were deciding: intervals with any, times the interval (ms).
    pub fallback_ms: u64,
    /// Admitted above the budget, fleet-wide (token buckets; `None`: not replayed).
    pub overshoot: Option<u64>,
    /// The promised slack per caller (`None`: local, or not replayed).
    pub promised_slack: Option<u64>,
    /// Admitted beyond the promise (fallback admissions excepted).
    pub beyond_promise: u64,
    /// Admitted by a fallback (fail open, the emergency cap), as the filter's fallback
    /// header named them.
    pub by_fallback: u64,
    /// Lease tokens granted, and expired unspent (stranded).
    pub lease_granted: u64,
    /// Stranded lease tokens.
    pub lease_expired: u64,
    /// Lease tokens a proxy would not spend, returned to the service before they expired.
    pub lease_returned: u64,
    /// Every counter the filter keeps for the policy, at the end, fleet-wide (each
    /// `degraded.<reason>` among them).
    pub counters: std::collections::BTreeMap<String, u64>,
}

/// A caller class's totals.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ClassSummary {
    /// Its name.
    pub name: String,
    /// Legitimate traffic or abuse.
    pub legitimate: bool,
    /// Every interval's counts added up (`pending` and the longest wait: at the end).
    #[serde(flatten)]
    pub totals: ClassRow,
    /// Whether `offered = allowed + rejected + failed + pending` held at every
    /// interval's end.
    pub accounting_holds: bool,
    /// Mean time a forwarded request was held before it was let through, µs.
    pub mean_wait_us: u64,
    /// The longest, µs.
    pub max_wait_us: u64,
}

impl ClassSummary {
    /// Share of its finished calls that got through, in per mille.
    pub fn served_permille(&self) -> u64 {
        let t = &self.totals;
        (t.calls_served * 1000).checked_div(t.calls_served + t.calls_refused).unwrap_or(1000)
    }
}

/// The run's numbers.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// The scenario's name.
    pub scenario: String,
    /// The configuration's name.
    pub config: String,
    /// Virtual time, ms.
    pub duration_ms: u64,
    /// Proxies × workers.
    pub proxies: usize,
    /// Workers per proxy.
    pub workers: usize,
    /// Requests sent.
    pub requests: u64,
    /// Callouts to the counter service.
    pub callouts: u64,
    /// Callouts per 1 000 requests.
    pub callouts_per_1000: u64,
    /// Per policy.
    pub policies: Vec<PolicySummary>,
    /// Per caller class.
    pub classes: Vec<ClassSummary>,
    /// Things that did not go as the timeline said (a reload a proxy refused).
    pub events: u64,
}

impl Summary {
    /// The numbers of `outcome`.
    pub fn of(outcome: &Outcome) -> Self {
        let series = &outcome.series;
        let last = series.last();
        let interval_ms = series.interval / 1_000_000;
        let policies = outcome
            .policies
            .iter()
            .map(|policy| {
                let name = &policy.name;
                let get = |c: Counter| last.policy(name, c);
                let accounting_holds = series.rows.iter().all(|row| {
                    let c = &row.counters;
                    c.policy(name, Counter::Offered)
                        == c.policy_sum(name, &[Counter::Allowed, Counter::Rejected, Counter::Queued])
                });
                let fallback_rows = (0..series.rows.len())
                    .filter(|i| {
                        let before = series.counters_before(*i);
                        let now = &series.rows[*i].counters;
                        let fallback = |c: &crate::record::Counters| {
                            c.policy_sum(name, &degraded())
                                + c.policy_sum(name, &EMERGENCY)
                                + c.policy_sum(name, &[Counter::FailureAllowed, Counter::FailureDenied])
                        };
                        fallback(now) > fallback(&before)
                    })
                    .count() as u64;
                let overshoot = outcome.overshoot.iter().find(|o| o.policy == *name);
                let by_fallback = overshoot.map_or(0, |o| o.by_fallback);
                let (overshoot_total, promised_slack, beyond) = match overshoot {
                    Some(PolicyOvershoot { total, promise: Promise::Global { slack }, beyond_promise, .. }) => {
                        (Some(*total), Some(*slack), *beyond_promise)
                    }
                    Some(PolicyOvershoot { total, promise: Promise::PerProxy, .. }) => (Some(*total), None, 0),
                    _ => (None, None, 0),
                };
                let mode = match &policy.global {
                    None => "local".to_owned(),
                    Some(g) => match g.strategy {
                        sluice::config::Strategy::Check => "global check".to_owned(),
                        sluice::config::Strategy::Lease(_) => "global lease".to_owned(),
                    },
                };
                PolicySummary {
                    name: name.clone(),
                    mode: if policy.shadow { format!("{mode}, shadow") } else { mode },
                    offered: get(Counter::Offered),
                    allowed: get(Counter::Allowed),
                    rejected: get(Counter::Rejected),
                    queued: get(Counter::Queued),
                    accounting_holds,
                    over_limit: get(Counter::OverLimit),
                    degraded: last.policy_sum(name, &degraded()),
                    lease_checked: last.policy_sum(name, &LEASE_CHECKED),
                    emergency_allowed: get(Counter::EmergencyAllowed),
                    emergency_rejected: get(Counter::EmergencyRejected),
                    failure_allowed: get(Counter::FailureAllowed),
                    failure_denied: get(Counter::FailureDenied),
                    fallback_ms: fallback_rows * interval_ms,
                    overshoot: overshoot_total,
                    promised_slack,
                    beyond_promise: beyond,
                    by_fallback,
                    lease_granted: get(Counter::LeaseGranted),
                    lease_expired: get(Counter::LeaseExpired),
                    lease_returned: get(Counter::LeaseReturned),
                    counters: last
                        .policies
                        .get(name)
                        .map(|counters| counters.iter().map(|(c, v)| (c.name().to_owned(), *v)).collect())
                        .unwrap_or_default(),
                }
            })
            .collect();
        let classes = outcome
            .scenario
            .callers
            .iter()
            .enumerate()
            .map(|(c, caller)| {
                let mut totals = ClassRow::default();
                let mut accounting_holds = true;
                for row in &series.rows {
                    let Some(r) = row.classes.get(c) else { continue };
                    totals.then(r);
                    accounting_holds &=
                        totals.offered == totals.allowed + totals.rejected + totals.failed + totals.pending;
                }
                ClassSummary {
                    name: caller.name.clone(),
                    legitimate: caller.legitimate,
                    accounting_holds,
                    mean_wait_us: (totals.waited_ns / 1000).checked_div(totals.allowed).unwrap_or(0),
                    max_wait_us: totals.waited_max_ns / 1000,
                    totals,
                }
            })
            .collect();
        let callouts = last.plugin(PluginCounter::Callouts);
        Self {
            scenario: outcome.scenario.name.clone(),
            config: outcome.config.name.clone(),
            duration_ms: outcome.scenario.duration.nanos() / 1_000_000,
            proxies: outcome.scenario.proxies(),
            workers: outcome.scenario.fleet.workers,
            requests: outcome.requests,
            callouts,
            callouts_per_1000: (callouts * 1000).checked_div(outcome.requests).unwrap_or(0),
            policies,
            classes,
            events: series.rows.iter().map(|r| r.events.len() as u64).sum(),
        }
    }
}

/// Writes `index.html`, `summary.json` and the CSV files of `outcome` into `dir`
/// (created if missing). Everything is rendered first, then written: a failure to render
/// writes nothing.
///
/// # Errors
/// When a file cannot be written.
pub fn write(outcome: &Outcome, dir: &Path) -> std::io::Result<()> {
    let files = render(outcome);
    write_files(dir, &files)
}

/// Every file of the report, rendered: (name, bytes).
pub fn render(outcome: &Outcome) -> Vec<(String, Vec<u8>)> {
    let summary = Summary::of(outcome);
    let json = serde_json::to_vec_pretty(&summary).unwrap_or_default();
    vec![
        ("index.html".to_owned(), html::page(outcome, &summary).into_bytes()),
        ("summary.json".to_owned(), json),
        ("policies.csv".to_owned(), csv::policies(outcome).into_bytes()),
        ("callers.csv".to_owned(), csv::callers(outcome).into_bytes()),
        ("fleet.csv".to_owned(), csv::fleet(outcome).into_bytes()),
        ("remaining.csv".to_owned(), csv::remaining(outcome).into_bytes()),
    ]
}

/// Writes rendered files into `dir`.
///
/// # Errors
/// When a file cannot be written.
pub fn write_files(dir: &Path, files: &[(String, Vec<u8>)]) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    for (name, bytes) in files {
        let path = dir.join(name);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, bytes)?;
    }
    Ok(())
}
