//! The caller contract in headers: `Retry-After`, the IETF `RateLimit-Policy` and
//! `RateLimit` fields, the legacy `X-RateLimit-*`, `Cache-Control: private`, and the
//! header that names a fallback. Which decision speaks for a request: on a rejection,
//! the rejecting policy with the longest wait; on an admission, the policy with the
//! least remaining.

use crate::config::HeaderSets;
use shared_store::{Decision, Nanos, push_decimal};

/// Among `(policy, decision)` pairs, the rejecting one with the longest wait (a cost
/// that can never pass counts as the longest).
pub(crate) fn strictest_rejection(decisions: &[(usize, Decision)]) -> Option<(usize, Decision)> {
    decisions
        .iter()
        .filter(|(_, d)| !d.is_admitted())
        .max_by_key(|(_, d)| d.retry_after().unwrap_or(Nanos::MAX))
        .copied()
}

/// Among `(policy, decision)` pairs, the one with the least remaining (then the longest
/// reset).
pub(crate) fn strictest_admission(decisions: &[(usize, Decision)]) -> Option<(usize, Decision)> {
    decisions
        .iter()
        .min_by(|(_, a), (_, b)| a.remaining.cmp(&b.remaining).then(b.reset_after.cmp(&a.reset_after)))
        .copied()
}

fn decimal(n: u64) -> String {
    let mut out = String::with_capacity(20);
    push_decimal(&mut out, n);
    out
}

/// Whole seconds, rounded up, at least 1 for any non-zero span.
fn secs_ceil(n: Nanos) -> u64 {
    n.as_secs_ceil()
}

/// Appends the rate-limit headers in `sets` for one policy's decision (`policy`: its
/// name and, when its numbers do not count requests, their unit). Returns whether any
/// was added.
pub fn rate_limit_headers(
    headers: &mut Vec<(String, String)>,
    sets: HeaderSets,
    (name, unit): (&str, Option<&str>),
    limit: &shared_store::Limit,
    decision: &Decision,
) -> bool {
    let before = headers.len();
    // `t`: on a rejection, when this request could pass (so Retry-After is never earlier
    // than `t`); otherwise when the quota is whole again.
    let t = secs_ceil(decision.retry_after().unwrap_or(decision.reset_after));
    if sets.retry_after
        && let Some(wait) = decision.retry_after()
    {
        headers.push(("retry-after".to_owned(), decimal(secs_ceil(wait).max(1))));
    }
    if sets.ratelimit {
        let window = secs_ceil(limit.period()).max(1);
        // `"<name>";q=<limit>;w=<window>` and `"<name>";r=<remaining>;t=<t>`, built by
        // hand: `format!` is the slowest part of these headers in wasm.
        let field = |first: &str, a: u64, second: &str, b: u64| {
            let mut value = String::with_capacity(name.len() + 48);
            value.push('"');
            value.push_str(name);
            value.push_str(first);
            push_decimal(&mut value, a);
            value.push_str(second);
            push_decimal(&mut value, b);
            value
        };
        let mut policy = field("\";q=", decision.limit, ";w=", window);
        if let Some(unit) = unit {
            policy.push_str(";qu=\"");
            policy.push_str(unit);
            policy.push('"');
        }
        headers.push(("ratelimit-policy".to_owned(), policy));
        headers.push(("ratelimit".to_owned(), field("\";r=", decision.remaining, ";t=", t)));
    }
    if sets.legacy {
        headers.push(("x-ratelimit-limit".to_owned(), decimal(decision.limit)));
        headers.push(("x-ratelimit-remaining".to_owned(), decimal(decision.remaining)));
        headers.push(("x-ratelimit-reset".to_owned(), decimal(t)));
    }
    headers.len() > before
}

/// Merges `cache-control: private` into an upstream response's `Cache-Control` value,
/// for responses that carry per-client rate-limit headers: a shared cache must not
/// serve one caller's remaining quota to another. `None` when the value already keeps
/// the response out of shared caches.
pub fn private_cache_control(existing: Option<&[u8]>) -> Option<String> {
    let Some(existing) = existing else { return Some("private".to_owned()) };
    let text = String::from_utf8_lossy(existing);
    let directives: Vec<&str> = text.split(',').map(str::trim).filter(|d| !d.is_empty()).collect();
    let name = |d: &str| d.split('=').next().unwrap_or(d).trim().to_ascii_lowercase();
    if directives.iter().any(|d| matches!(name(d).as_str(), "private" | "no-store")) {
        return None;
    }
    let mut out = vec!["private".to_owned()];
    out.extend(
        directives.iter().filter(|d| !matches!(name(d).as_str(), "public" | "s-maxage")).map(|d| (*d).to_owned()),
    );
    Some(out.join(", "))
}
