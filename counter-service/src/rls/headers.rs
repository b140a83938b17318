//! The headers an answer may ask Envoy to add to the response
//! (`response_headers_to_add`), each set opt-in (`--rls-response-headers`):
//!
//! * `ietf`: `RateLimit-Policy` and `RateLimit` (draft-ietf-httpapi-ratelimit-headers) of
//!   the descriptor closest to its limit, with the window of any `unit_multiplier`
//!   (Envoy's own `X-RateLimit-*` headers know only whole units);
//! * `retry-after`: on `OVER_LIMIT`, `Retry-After` with the exact wait rounded up to whole
//!   seconds (Envoy 1.40 keeps a `Retry-After` the service gave);
//! * `ratelimit`: envoyproxy/ratelimit's `RateLimit-Limit`, `RateLimit-Remaining` and
//!   `RateLimit-Reset` (its `LIMIT_RESPONSE_HEADERS_ENABLED`);
//! * always, when an operator's override decided a descriptor: `x-sluice-override` with
//!   the override's id.

use std::str::FromStr;

use super::decide::{Code, RlsAnswer, Status};

/// Which header sets to add.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ResponseHeaders {
    /// `RateLimit-Policy` and `RateLimit`.
    pub ietf: bool,
    /// `Retry-After` when over the limit.
    pub retry_after: bool,
    /// envoyproxy/ratelimit's trio.
    pub ratelimit: bool,
}

impl FromStr for ResponseHeaders {
    type Err = String;

    /// A comma-separated list of `ietf`, `retry-after`, `ratelimit`, or `none`.
    fn from_str(text: &str) -> Result<Self, String> {
        let mut wanted = Self::default();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            match name {
                "ietf" => wanted.ietf = true,
                "retry-after" => wanted.retry_after = true,
                "ratelimit" => wanted.ratelimit = true,
                "none" => {}
                other => {
                    return Err(format!("unknown header set '{other}' (ietf, retry-after, ratelimit or none)"));
                }
            }
        }
        Ok(wanted)
    }
}

/// The status closest to its limit: the fewest left among those with a limit (the
/// first over-limit one wins a tie, as envoyproxy/ratelimit picks).
fn closest(answer: &RlsAnswer) -> Option<&Status> {
    answer
        .statuses
        .iter()
        .filter(|s| s.current_limit.is_some())
        .min_by_key(|s| (s.limit_remaining, u8::from(s.code != Code::OverLimit)))
}

/// The headers `wanted` asks for, for `answer`.
pub fn headers(answer: &RlsAnswer, wanted: ResponseHeaders) -> Vec<(&'static str, String)> {
    let mut out = Vec::new();
    if let Some(status) = closest(answer)
        && let Some(limit) = &status.current_limit
    {
        let window = limit.unit.seconds() * u64::from(limit.unit_multiplier);
        let reset = status.duration_until_reset.map_or(0, |d| d.as_secs());
        let name = if limit.name.is_empty() { &limit.policy } else { &limit.name };
        if wanted.ietf {
            out.push(("RateLimit-Policy", format!("\"{name}\";q={};w={window}", limit.requests_per_unit)));
            out.push(("RateLimit", format!("\"{name}\";r={};t={reset}", status.limit_remaining)));
        }
        if wanted.ratelimit {
            out.push((
                "RateLimit-Limit",
                format!("{}, {};w={window}", limit.requests_per_unit, limit.requests_per_unit),
            ));
            out.push(("RateLimit-Remaining", status.limit_remaining.to_string()));
            out.push(("RateLimit-Reset", reset.to_string()));
        }
    }
    if wanted.retry_after && answer.overall == Code::OverLimit {
        let wait = answer
            .statuses
            .iter()
            .filter(|s| s.code == Code::OverLimit)
            .filter_map(|s| match s.retry_after {
                Some(exact) => Some(exact.as_u64().div_ceil(1_000_000_000)),
                None => s.duration_until_reset.map(|d| d.as_secs()),
            })
            .max();
        if let Some(wait) = wait {
            out.push(("Retry-After", wait.max(1).to_string()));
        }
    }
    let overrides: Vec<String> =
        answer.statuses.iter().filter_map(|s| s.overridden.map(|o| o.id.to_string())).collect();
    if !overrides.is_empty() {
        out.push(("x-sluice-override", overrides.join(", ")));
    }
    out
}
