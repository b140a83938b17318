//! The HTML report: one self-contained page (inline SVG, inline CSS, no script, nothing
//! fetched), the verdict on top, then the numbers the seed asks operators to watch, a
//! chart per policy and per caller class, and a footer saying what ran.

use super::svg::{Band, Line, chart};
use super::{Summary, verdict};
use crate::record::{EMERGENCY, LEASE_CHECKED, degraded};
use crate::run::Outcome;
use sluice::config::Policy;
use sluice::host::{Counter, PluginCounter};
use std::fmt::Write as _;

const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:1600px;margin:24px auto;padding:0 16px;color:#222}\
h1{font-size:22px}h2{font-size:18px;margin-top:28px}h3{font-size:15px}\
table{border-collapse:collapse;margin:8px 0;font-size:13px}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}\
th:first-child,td:first-child{text-align:left}.verdict{background:#f5f7fa;border-left:4px solid #2f6fdf;padding:10px 14px}\
.bad{color:#b00020;font-weight:bold}.pair{display:flex;gap:24px;flex-wrap:wrap}.pair>div{flex:1;min-width:760px}\
footer{margin-top:32px;font-size:12px;color:#666}";

fn escape(text: &str) -> String {
    text.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;").replace('"', "&quot;")
}

/// Shaded spans of the intervals a fault was in force.
fn bands(outcome: &Outcome) -> Vec<(usize, usize, String)> {
    let mut out: Vec<(usize, usize, String)> = Vec::new();
    for (i, row) in outcome.series.rows.iter().enumerate() {
        for fault in &row.faults {
            match out.iter_mut().find(|(_, to, label)| *to == i && label == fault) {
                Some(band) => band.1 = i + 1,
                None => out.push((i, i + 1, fault.clone())),
            }
        }
    }
    out
}

/// Per interval, what `counters` of `policy` (summed) moved by.
fn deltas(outcome: &Outcome, policy: &str, counters: &[Counter]) -> Vec<f64> {
    let series = &outcome.series;
    (0..series.rows.len())
        .map(|i| {
            let before = series.counters_before(i);
            let now = &series.rows[i].counters;
            now.policy_sum(policy, counters).saturating_sub(before.policy_sum(policy, counters)) as f64
        })
        .collect()
}

/// The body of one run's report (without the page around it).
fn body(outcome: &Outcome, summary: &Summary) -> String {
    let ends: Vec<f64> = outcome.series.rows.iter().map(|r| r.end as f64 / 1e9).collect();
    let band_list = bands(outcome);
    let bands: Vec<Band<'_>> = band_list.iter().map(|(from, to, label)| Band { from: *from, to: *to, label }).collect();
    let mut out = format!(r#"<p class="verdict">{}</p>"#, escape(&verdict(summary)));
    out.push_str(&numbers(summary));
    out.push_str(&classes(summary));
    for policy in &outcome.policies {
        out.push_str(&policy_charts(outcome, policy, &ends, &bands));
    }
    out.push_str(&shares(outcome, &ends, &bands));
    if summary.callouts > 0 {
        out.push_str(&callouts(outcome, &ends, &bands));
    }
    out.push_str(&timeline(outcome));
    out
}

/// The numbers to watch, one row per policy, and the callouts.
fn numbers(summary: &Summary) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        "<h2>Numbers to watch</h2><table><tr><th>policy</th><th>mode</th><th>offered</th><th>allowed</th><th>rejected</th><th>queued at end</th><th>accounting line</th><th>over limit</th><th>service could not decide</th><th>fallback duration</th><th>fail open / emergency admitted</th><th>fail closed / emergency refused</th><th>overshoot (fleet-wide)</th><th>promised bound per caller</th><th>beyond the bound (not by a fallback)</th><th>admitted by a fallback</th><th>lease tokens granted / stranded / returned</th></tr>"
    );
    for p in &summary.policies {
        let holds =
            if p.accounting_holds { "holds".to_owned() } else { r#"<span class="bad">broken</span>"#.to_owned() };
        let overshoot = p.overshoot.map_or("n/a (not a token bucket)".to_owned(), |o| o.to_string());
        let bound = match (&p.promised_slack, p.mode.starts_with("local")) {
            (Some(slack), _) => format!("{slack} tokens"),
            (None, true) => "none (each proxy its own budget)".to_owned(),
            (None, false) => "n/a".to_owned(),
        };
        let beyond = if p.beyond_promise > 0 {
            format!(r#"<span class="bad">{}</span>"#, p.beyond_promise)
        } else {
            "0".to_owned()
        };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{holds}</td><td>{}</td><td>{}</td><td>{} s</td><td>{} / {}</td><td>{} / {}</td><td>{overshoot}</td><td>{bound}</td><td>{beyond}</td><td>{}</td><td>{} / {} / {}</td></tr>",
            escape(&p.name),
            escape(&p.mode),
            p.offered,
            p.allowed,
            p.rejected,
            p.queued,
            p.over_limit,
            p.degraded,
            p.fallback_ms / 1000,
            p.failure_allowed,
            p.emergency_allowed,
            p.failure_denied,
            p.emergency_rejected,
            p.by_fallback,
            p.lease_granted,
            p.lease_expired,
            p.lease_returned,
        );
    }
    out.push_str("</table>");
    let _ = write!(
        out,
        "<p>Callouts to the counter service: {} ({} per 1 000 requests).</p>",
        summary.callouts, summary.callouts_per_1000
    );
    out
}
/// What each caller class saw.
fn classes(summary: &Summary) -> String {
    let mut out = String::new();
    out.push_str("<h2>Caller classes</h2><table><tr><th>class</th><th>legitimate</th><th>offered</th><th>of which retries</th><th>allowed</th><th>rejected (429)</th><th>failed (other status, reset)</th><th>pending at end</th><th>calls served</th><th>calls refused for good</th><th>got through</th><th>held before let through: mean / max</th><th>accounting line</th></tr>");
    for c in &summary.classes {
        let holds = if c.accounting_holds { "holds" } else { r#"<span class="bad">broken</span>"# };
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}.{}%</td><td>{} / {} ms</td><td>{holds}</td></tr>",
            escape(&c.name),
            if c.legitimate { "yes" } else { "no" },
            c.totals.offered,
            c.totals.retries,
            c.totals.allowed,
            c.totals.rejected,
            c.totals.failed,
            c.totals.pending,
            c.totals.calls_served,
            c.totals.calls_refused,
            c.served_permille() / 10,
            c.served_permille() % 10,
            c.mean_wait_us / 1000,
            c.max_wait_us / 1000,
        );
    }
    out.push_str("</table>");
    out
}
/// One policy's charts: requests, fallbacks and overshoot, its busiest callers' allowance, leases.
fn policy_charts(outcome: &Outcome, policy: &Policy, ends: &[f64], bands: &[Band<'_>]) -> String {
    let mut out = String::new();
    let name = &policy.name;
    let _ = write!(out, "<h3>Policy {}</h3>", escape(name));
    let queued: Vec<f64> =
        outcome.series.rows.iter().map(|r| r.counters.policy(name, Counter::Queued) as f64).collect();
    let lines = [
        Line { name: "offered", color: "#555", values: deltas(outcome, name, &[Counter::Offered]) },
        Line { name: "allowed", color: "#2a9d46", values: deltas(outcome, name, &[Counter::Allowed]) },
        Line { name: "rejected", color: "#d62828", values: deltas(outcome, name, &[Counter::Rejected]) },
        Line { name: "queued (at the end)", color: "#7b2cbf", values: queued },
    ];
    out.push_str(&chart(&format!("{name}: requests per interval"), "requests", ends, &lines, bands));
    let overshoot =
        outcome.overshoot.iter().find(|o| o.policy == *name).map(|o| o.per_row.iter().map(|v| *v as f64).collect());
    let mut lines = vec![
        Line { name: "service could not decide", color: "#e76f51", values: deltas(outcome, name, &degraded()) },
        Line { name: "emergency cap", color: "#f4a261", values: deltas(outcome, name, &EMERGENCY) },
        Line { name: "fail open", color: "#e9c46a", values: deltas(outcome, name, &[Counter::FailureAllowed]) },
        Line { name: "fail closed", color: "#264653", values: deltas(outcome, name, &[Counter::FailureDenied]) },
    ];
    if let Some(values) = overshoot {
        lines.push(Line { name: "overshoot", color: "#d00000", values });
    }
    if policy.global.is_some() || lines.iter().any(|l| l.values.iter().any(|v| *v > 0.0)) {
        out.push_str(&chart(&format!("{name}: fallbacks and overshoot"), "requests", ends, &lines, bands));
    }
    if let Some(o) = outcome.overshoot.iter().find(|o| o.policy == *name).filter(|o| !o.top.is_empty()) {
        let colors = ["#2f6fdf", "#d62828", "#2a9d46"];
        let lines: Vec<Line<'_>> = o
            .top
            .iter()
            .zip(colors.iter().cycle())
            .map(|((label, values), color)| Line {
                name: label,
                color,
                values: values.iter().map(|v| *v as f64).collect(),
            })
            .collect();
        out.push_str(&chart(
            &format!("{name}: the budget's remaining allowance for its busiest callers (replayed)"),
            "tokens left",
            ends,
            &lines,
            bands,
        ));
    }
    if matches!(policy.global.as_ref().map(|g| g.strategy), Some(sluice::config::Strategy::Lease(_))) {
        let lines = [
            Line {
                name: "lease tokens granted",
                color: "#2a9d46",
                values: deltas(outcome, name, &[Counter::LeaseGranted]),
            },
            Line {
                name: "stranded (expired unspent)",
                color: "#d62828",
                values: deltas(outcome, name, &[Counter::LeaseExpired]),
            },
            Line {
                name: "requests decided by the service per request (lease.checked)",
                color: "#2f6fdf",
                values: deltas(outcome, name, &LEASE_CHECKED),
            },
        ];
        out.push_str(&chart(
            &format!("{name}: leases, and the requests they could not serve"),
            "tokens, requests",
            ends,
            &lines,
            bands,
        ));
    }
    out
}
/// The share of each caller class's requests let through, per interval.
fn shares(outcome: &Outcome, ends: &[f64], bands: &[Band<'_>]) -> String {
    let mut out = String::new();
    out.push_str("<h3>Caller classes: share of requests let through, per interval</h3>");
    let palette = ["#2a9d46", "#d62828", "#2f6fdf", "#7b2cbf", "#e76f51", "#264653", "#f4a261", "#555"];
    let lines: Vec<Line<'_>> = outcome
        .scenario
        .callers
        .iter()
        .enumerate()
        .map(|(c, caller)| Line {
            name: &caller.name,
            color: palette[c % palette.len()],
            values: outcome
                .series
                .rows
                .iter()
                .map(|r| {
                    r.classes.get(c).map_or(0.0, |r| {
                        let done = r.allowed + r.rejected + r.failed;
                        if done == 0 { 100.0 } else { 100.0 * r.allowed as f64 / done as f64 }
                    })
                })
                .collect(),
        })
        .collect();
    out.push_str(&chart("share let through", "% allowed", ends, &lines, bands));
    out
}
/// Callouts to the counter service per 1 000 requests, per interval.
fn callouts(outcome: &Outcome, ends: &[f64], bands: &[Band<'_>]) -> String {
    let mut out = String::new();
    let series = &outcome.series;
    let per_1000: Vec<f64> = (0..series.rows.len())
        .map(|i| {
            let before = series.counters_before(i);
            let get = |c: &crate::record::Counters| c.plugin(PluginCounter::Callouts);
            let callouts = get(&series.rows[i].counters).saturating_sub(get(&before)) as f64;
            let requests: u64 = series.rows[i].classes.iter().map(|c| c.offered).sum();
            if requests == 0 { 0.0 } else { 1000.0 * callouts / requests as f64 }
        })
        .collect();
    out.push_str("<h3>Callouts to the counter service per 1 000 requests</h3>");
    let lines = [Line { name: "callouts per 1 000 requests", color: "#264653", values: per_1000 }];
    out.push_str(&chart("callouts per 1000 requests", "callouts", ends, &lines, bands));
    out
}
/// The faults of the timeline, and what happened that it did not say would.
fn timeline(outcome: &Outcome) -> String {
    let mut out = String::new();
    if !outcome.scenario.faults.is_empty() {
        out.push_str("<h3>Timeline</h3><ul>");
        for fault in &outcome.scenario.faults {
            let _ = write!(out, "<li>{} s: {}</li>", fault.at().nanos() / 1_000_000_000, escape(&fault.describe()));
        }
        for row in &outcome.series.rows {
            for event in &row.events {
                let _ = write!(out, r#"<li class="bad">by {} s: {}</li>"#, super::csv::seconds(row.end), escape(event));
            }
        }
        out.push_str("</ul>");
    }
    out
}
fn footer(outcomes: &[&Outcome]) -> String {
    let mut out = String::from("<footer>");
    let _ = write!(
        out,
        "Made by sluice-lab {}. The filter is the compiled sluice.wasm, unchanged ",
        env!("CARGO_PKG_VERSION")
    );
    for outcome in outcomes {
        if outcome.config.run_bytes != outcome.config.bytes {
            let _ = write!(
                out,
                "(its configuration {} was given <code>response.fallback_header: {}</code> so that fallback admissions can be told apart; nothing else changed) ",
                escape(&outcome.config.name),
                crate::run::LAB_FALLBACK_HEADER
            );
        }
    }
    for outcome in outcomes {
        let _ = write!(out, "({} bytes, FNV-1a {:016x}) ", outcome.module.0, outcome.module.1);
    }
    let _ = write!(
        out,
        "running in wasm-host; the counter service's decisions are the real service's code (sluice-counter, this workspace's, built into sluice-lab: its decision routes and memory store, without a socket). Only time and the network are simulated: seed {}.</footer>",
        outcomes.first().map_or(0, |o| o.scenario.seed)
    );
    out
}

fn page_around(title: &str, description: &str, inner: &str, footer: &str) -> String {
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{}</title><style>{STYLE}</style></head><body><h1>{}</h1><p>{}</p>{inner}{footer}</body></html>\n",
        escape(title),
        escape(title),
        escape(description)
    )
}

/// The report of one run.
pub fn page(outcome: &Outcome, summary: &Summary) -> String {
    let title = format!("{} — {}", outcome.scenario.name, outcome.config.name);
    page_around(&title, &outcome.scenario.description, &body(outcome, summary), &footer(&[outcome]))
}

/// The same scenario under two configurations, side by side.
pub fn compare(a: &Outcome, b: &Outcome) -> String {
    let title = format!("{}: {} vs {}", a.scenario.name, a.config.name, b.config.name);
    let inner = format!(
        "<div class=\"pair\"><div><h2>{}</h2>{}</div><div><h2>{}</h2>{}</div></div>",
        escape(&a.config.name),
        body(a, &Summary::of(a)),
        escape(&b.config.name),
        body(b, &Summary::of(b))
    );
    page_around(&title, &a.scenario.description, &inner, &footer(&[a, b]))
}
