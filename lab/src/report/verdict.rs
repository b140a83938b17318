//! The verdict: one paragraph, in plain words, of what would happen.

use super::Summary;
use sluice::host::Reason;

fn percent(permille: u64) -> String {
    format!("{}.{}%", permille / 10, permille % 10)
}

fn plural(n: u64, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// The verdict of a run.
pub fn verdict(summary: &Summary) -> String {
    let mut out = verdict_of_numbers(summary);
    if summary.events > 0 {
        out.push_str(&format!(
            " {} did not go as the timeline said (a proxy refused a reload): see the timeline.",
            plural(summary.events, "event", "events")
        ));
    }
    out
}

fn verdict_of_numbers(summary: &Summary) -> String {
    let mut out = format!(
        "Over {} s of virtual time, {} ({} workers each) received {}. ",
        summary.duration_ms / 1000,
        plural(summary.proxies as u64, "proxy", "proxies"),
        summary.workers,
        plural(summary.requests, "request", "requests"),
    );
    let served = |legitimate: bool| {
        summary
            .classes
            .iter()
            .filter(|c| c.legitimate == legitimate)
            .map(|c| format!("{} {}", c.name, percent(c.served_permille())))
            .collect::<Vec<_>>()
    };
    let good = served(true);
    let bad = served(false);
    if !good.is_empty() {
        out.push_str(&format!("Legitimate callers got their calls through: {}. ", good.join(", ")));
    }
    if !bad.is_empty() {
        out.push_str(&format!("Abusive callers got through: {}. ", bad.join(", ")));
    }
    for p in &summary.policies {
        out.push_str(&format!(
            "Policy {} ({}) admitted {} and refused {} of {}",
            p.name, p.mode, p.allowed, p.rejected, p.offered
        ));
        match (p.overshoot, p.promised_slack) {
            (Some(0), _) => out.push_str(", never above its budget"),
            (Some(over), Some(slack)) => {
                out.push_str(&format!(", {} above its budget", plural(over, "admission", "admissions")));
                if p.by_fallback > 0 {
                    out.push_str(&format!(
                        " (fallbacks let {} through on no budget: outside every bound)",
                        plural(p.by_fallback, "request", "requests")
                    ));
                }
                if p.beyond_promise == 0 {
                    out.push_str(&format!(
                        "; the rest stayed within the documented bound ({} per caller)",
                        plural(slack, "token", "tokens")
                    ));
                } else {
                    out.push_str(&format!(
                        "; {} beyond the documented bound ({} per caller) that no fallback made",
                        p.beyond_promise,
                        plural(slack, "token", "tokens")
                    ));
                }
            }
            (Some(over), None) => out.push_str(&format!(
                ", {} above one fleet-wide budget (a local policy: each proxy keeps its own)",
                plural(over, "admission", "admissions")
            )),
            (None, _) => {}
        }
        let fallback = p.emergency_allowed + p.emergency_rejected + p.failure_allowed + p.failure_denied;
        if fallback > 0 || p.degraded > 0 {
            let mut reasons: Vec<(&str, u64)> = Reason::ALL
                .iter()
                .filter_map(|r| Some((r.name(), *p.counters.get(r.metric_name())?)))
                .filter(|(_, v)| *v > 0)
                .collect();
            reasons.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(b.0)));
            let reasons: Vec<String> = reasons.iter().map(|(k, v)| format!("{k} {v}")).collect();
            out.push_str(&format!(
                "; in {} s of intervals the counter service's answer was not had ({} requests: {}), and fallbacks admitted {} (fail open {}, emergency cap {}) and refused {}",
                p.fallback_ms / 1000,
                p.degraded,
                if reasons.is_empty() { "none".to_owned() } else { reasons.join(", ") },
                p.failure_allowed + p.emergency_allowed,
                p.failure_allowed,
                p.emergency_allowed,
                p.failure_denied + p.emergency_rejected,
            ));
        }
        if p.lease_checked > 0 {
            out.push_str(&format!(
                "; {} its lease could not serve were decided by the service per request (a check: the service answered)",
                plural(p.lease_checked, "request", "requests")
            ));
        }
        out.push_str(". ");
    }
    let waits: Vec<String> = summary
        .classes
        .iter()
        .filter(|c| c.max_wait_us >= 100_000)
        .map(|c| format!("{} up to {} ms (mean {} ms)", c.name, c.max_wait_us / 1000, c.mean_wait_us / 1000))
        .collect();
    if !waits.is_empty() {
        out.push_str(&format!("Requests were held before being let through: {}. ", waits.join(", ")));
    }
    let held =
        summary.policies.iter().all(|p| p.accounting_holds) && summary.classes.iter().all(|c| c.accounting_holds);
    out.push_str(if held {
        "The accounting line (offered = allowed + rejected + queued) held in every interval."
    } else {
        "The accounting line did NOT hold in every interval: see the tables."
    });
    out
}
