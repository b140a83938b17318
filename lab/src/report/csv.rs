//! The report's data as CSV: one row per interval (and per policy or class), counts for
//! that interval (gauges and pending requests at its end).

use crate::record::{LEASE_CHECKED, degraded};
use crate::run::Outcome;
use sluice::host::{Counter, PluginCounter};
use std::fmt::Write as _;

/// Seconds with millisecond precision, as the CSV and the plots write time.
pub fn seconds(ns: u64) -> String {
    format!("{}.{:03}", ns / 1_000_000_000, (ns / 1_000_000) % 1000)
}

/// A CSV field: quoted when it holds a comma, a quote or a line break.
fn field(text: &str) -> String {
    if text.contains([',', '"', '\n']) { format!("\"{}\"", text.replace('"', "\"\"")) } else { text.to_owned() }
}

/// Per interval and policy.
pub fn policies(outcome: &Outcome) -> String {
    let mut out = String::from(
        "t_end_s,policy,offered,allowed,rejected,queued,accounting_holds,over_limit,degraded,emergency_allowed,emergency_rejected,failure_allowed,failure_denied,overshoot,lease_granted,lease_expired,lease_checked,lease_returned\n",
    );
    let series = &outcome.series;
    for (i, row) in series.rows.iter().enumerate() {
        let before = series.counters_before(i);
        for policy in &outcome.policies {
            let name = &policy.name;
            let now = &row.counters;
            let delta = |c: Counter| now.policy(name, c).saturating_sub(before.policy(name, c));
            let summed = |c: &[Counter]| now.policy_sum(name, c).saturating_sub(before.policy_sum(name, c));
            let holds = now.policy(name, Counter::Offered)
                == now.policy_sum(name, &[Counter::Allowed, Counter::Rejected, Counter::Queued]);
            let overshoot = outcome
                .overshoot
                .iter()
                .find(|o| o.policy == *name)
                .and_then(|o| o.per_row.get(i))
                .map_or(String::new(), u64::to_string);
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}",
                seconds(row.end),
                field(name),
                delta(Counter::Offered),
                delta(Counter::Allowed),
                delta(Counter::Rejected),
                now.policy(name, Counter::Queued),
                holds,
                delta(Counter::OverLimit),
                summed(&degraded()),
                delta(Counter::EmergencyAllowed),
                delta(Counter::EmergencyRejected),
                delta(Counter::FailureAllowed),
                delta(Counter::FailureDenied),
                overshoot,
                delta(Counter::LeaseGranted),
                delta(Counter::LeaseExpired),
                summed(&LEASE_CHECKED),
                delta(Counter::LeaseReturned),
            );
        }
    }
    out
}

/// Per interval and caller class.
pub fn callers(outcome: &Outcome) -> String {
    let mut out = String::from(
        "t_end_s,class,legitimate,offered,retries,allowed,rejected,failed,pending,calls_served,calls_refused\n",
    );
    for row in &outcome.series.rows {
        for (caller, r) in outcome.scenario.callers.iter().zip(&row.classes) {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{}",
                seconds(row.end),
                field(&caller.name),
                caller.legitimate,
                r.offered,
                r.retries,
                r.allowed,
                r.rejected,
                r.failed,
                r.pending,
                r.calls_served,
                r.calls_refused
            );
        }
    }
    out
}

/// Per interval, the fleet: requests, callouts, faults in force.
pub fn fleet(outcome: &Outcome) -> String {
    let mut out = String::from("t_end_s,requests,callouts,circuit_opened,faults,events\n");
    let series = &outcome.series;
    for (i, row) in series.rows.iter().enumerate() {
        let before = series.counters_before(i);
        let delta = |c: PluginCounter| row.counters.plugin(c).saturating_sub(before.plugin(c));
        let requests: u64 = row.classes.iter().map(|c| c.offered).sum();
        let _ = writeln!(
            out,
            "{},{},{},{},{},{}",
            seconds(row.end),
            requests,
            delta(PluginCounter::Callouts),
            delta(PluginCounter::CircuitOpened),
            field(&row.faults.join("; ")),
            field(&row.events.join("; "))
        );
    }
    out
}

/// Per interval, the budget's remaining allowance for each policy's busiest callers (the
/// reference bucket's, replayed).
pub fn remaining(outcome: &Outcome) -> String {
    let mut out = String::from("t_end_s,policy,caller,remaining\n");
    for (i, row) in outcome.series.rows.iter().enumerate() {
        for o in &outcome.overshoot {
            for (caller, values) in &o.top {
                if let Some(v) = values.get(i) {
                    let _ = writeln!(out, "{},{},{},{v}", seconds(row.end), field(&o.policy), field(caller));
                }
            }
        }
    }
    out
}
